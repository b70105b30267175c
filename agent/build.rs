//! Generates the sandbox.v1 client types (the worker side of the relay).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    tonic_prost_build::configure()
        .build_server(false)
        .compile_protos(&["../proto/sandbox/v1/sandbox.proto"], &["../proto"])?;
    println!("cargo:rerun-if-changed=../proto/sandbox");
    Ok(())
}
