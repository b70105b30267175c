//! The benchmark harness (being written).

fn main() {
    eprintln!("compute-bench: not yet built");
    std::process::exit(2);
}
