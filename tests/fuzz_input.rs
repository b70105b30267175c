//! Property tests of request validation and of the workspace path resolver with hostile input:
//! nothing panics, and no path leaves the workspace root.
//!
//! CI runs a few thousand cases per property (`FUZZ_CASES`, default 2000). The long run:
//! `FUZZ_CASES=1000000 cargo test --release --test fuzz_input -- --test-threads=2`.
//!
//! Invalid UTF-8 cannot reach these functions: every path and id arrives as a protobuf
//! `string`, which fails to decode first (INVALID_ARGUMENT; tests/workspace.rs and
//! tests/bad_input.rs send raw bytes to check it).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use computed::node::parse_id;
use computed::workspace::validate_mount_path;
use computed::workspace::{clean_path, Error as WsError, Workspace};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

fn cases() -> u32 {
    std::env::var("FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000)
}

/// Prints how many inputs a property tried and how long it took (the long run's figures).
struct Report(&'static str, std::time::Instant);

impl Drop for Report {
    fn drop(&mut self) {
        eprintln!(
            "{}: {} cases in {:.1} s",
            self.0,
            cases(),
            self.1.elapsed().as_secs_f64()
        );
    }
}

fn report(name: &'static str) -> Report {
    Report(name, std::time::Instant::now())
}

fn runner() -> TestRunner {
    TestRunner::new(Config {
        cases: cases(),
        // Failures are reported with their input; no regression files in the tree.
        failure_persistence: None,
        ..Config::default()
    })
}

/// Path components a hostile client would try, mixed with arbitrary strings. (`secret` and
/// `nested`, the names outside, are left out so that a listing showing them means an escape.)
fn component() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::sample::select(vec![
            "..", ".", "", "sub", "deep", "file", "up", "out", "abs", "abs-ws", "abs-mount",
            "loop", "self", "proc", "dotdot-link", "fifo", "sub2", "new", "workspace",
            "...", " ", "\\", "%2e%2e",
        ])
        .prop_map(String::from),
        1 => "[a-z./\\\\ ]{0,6}",
        1 => any::<String>(),
        1 => Just("x".repeat(300)),
        1 => Just("\0".to_string()),
    ]
}

fn hostile_path() -> impl Strategy<Value = String> {
    (
        prop::sample::select(vec![
            "",
            "/",
            "/workspace/",
            "/workspace",
            "./",
            "../",
            "//",
        ]),
        prop::collection::vec(component(), 0..8),
    )
        .prop_map(|(prefix, comps)| format!("{prefix}{}", comps.join("/")))
}

#[test]
fn clean_path_never_panics_and_never_climbs() {
    let _r = report("clean_path_never_panics_and_never_climbs");
    runner()
        .run(
            &(
                hostile_path(),
                prop::sample::select(vec!["/workspace", "/", "/a/b", ""]),
            ),
            |(path, mount)| {
                if let Ok(comps) = clean_path(&path, mount) {
                    for c in &comps {
                        prop_assert!(
                            !c.is_empty() && c != "." && c != "..",
                            "{path:?} → {comps:?}"
                        );
                        prop_assert!(
                            !c.contains('/') && !c.contains('\0'),
                            "{path:?} → {comps:?}"
                        );
                    }
                }
                Ok(())
            },
        )
        .unwrap();
}

#[test]
fn mount_paths_accepted_are_absolute_clean_and_not_reserved() {
    let _r = report("mount_paths_accepted_are_absolute_clean_and_not_reserved");
    runner()
        .run(&hostile_path(), |p| {
            if validate_mount_path(&p).is_ok() {
                prop_assert!(p.starts_with('/') && p != "/" && !p.ends_with('/'), "{p:?}");
                prop_assert!(!p.contains('\0') && !p.contains("//"), "{p:?}");
                prop_assert!(p
                    .split('/')
                    .skip(1)
                    .all(|c| c != "." && c != ".." && !c.is_empty()));
                for r in ["/proc", "/dev", "/sys", "/.compute"] {
                    prop_assert!(p != r && !p.starts_with(&format!("{r}/")), "{p:?}");
                }
            }
            Ok(())
        })
        .unwrap();
}

#[test]
fn sandbox_ids_accepted_are_canonical_uuids() {
    let _r = report("sandbox_ids_accepted_are_canonical_uuids");
    let id = prop_oneof![
        any::<String>(),
        "[0-9a-fA-F-]{30,40}",
        any::<[u8; 16]>().prop_map(|b| uuid::Uuid::from_bytes(b).to_string()),
        any::<[u8; 16]>().prop_map(|b| uuid::Uuid::from_bytes(b).simple().to_string()),
        any::<[u8; 16]>().prop_map(|b| format!("{{{}}}", uuid::Uuid::from_bytes(b))),
        any::<[u8; 16]>().prop_map(|b| format!("{}/../x", uuid::Uuid::from_bytes(b))),
    ];
    runner()
        .run(&id, |s| {
            if let Ok(canon) = parse_id(&s) {
                prop_assert_eq!(canon.len(), 36);
                prop_assert!(canon
                    .chars()
                    .all(|c| c == '-' || c.is_ascii_digit() || ('a'..='f').contains(&c)));
            }
            Ok(())
        })
        .unwrap();
}

#[test]
fn sizes_and_durations_never_panic() {
    let _r = report("sizes_and_durations_never_panic");
    runner()
        .run(
            &(
                prop_oneof!["[0-9]{0,25}[KMGTkiB]{0,3}", any::<String>()],
                any::<i64>(),
                any::<i32>(),
            ),
            |(size, secs, nanos)| {
                if let Some(v) = computed::size::parse_size(&size) {
                    prop_assert!(v > 0);
                }
                let d = prost_types::Duration {
                    seconds: secs,
                    nanos,
                };
                if let Ok(std) = computed::api::convert::from_duration(&d) {
                    let want = secs as i128 * 1_000_000_000 + nanos as i128;
                    prop_assert_eq!(std.as_nanos() as i128, want);
                }
                Ok(())
            },
        )
        .unwrap();
}

/// A workspace full of traps next to a directory it must never reach.
struct Trap {
    _dir: tempfile::TempDir,
    ws: PathBuf,
    outside: PathBuf,
}

fn trap() -> Trap {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    let outside = dir.path().join("outside");
    std::fs::create_dir_all(ws.join("sub/deep")).unwrap();
    std::fs::create_dir_all(outside.join("nested")).unwrap();
    std::fs::write(outside.join("secret"), "SECRET").unwrap();
    std::fs::write(outside.join("nested/secret"), "SECRET").unwrap();
    std::fs::write(ws.join("file"), "inside").unwrap();
    std::fs::write(ws.join("sub/file"), "inside").unwrap();
    let link = |target: &str, at: &str| std::os::unix::fs::symlink(target, ws.join(at)).unwrap();
    link("../outside", "out");
    link(outside.to_str().unwrap(), "abs");
    link("/workspace/sub", "abs-ws");
    link("/workspace", "abs-mount");
    link("/workspace/../outside", "abs-climb");
    link("loop", "loop");
    link("..", "up");
    link("../../outside/secret", "sub/dotdot-link");
    link("/proc/self/root", "proc");
    link("/proc/self/cwd", "self");
    link("sub/deep/../../..", "sub2");
    nix::unistd::mkfifo(
        &ws.join("fifo"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
    Trap {
        _dir: dir,
        ws,
        outside,
    }
}

/// Every file under `dir` with its content (symlinks as their targets).
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            let ft = e.file_type().unwrap();
            if ft.is_dir() {
                out.insert(p.clone(), b"<dir>".to_vec());
                todo.push(p);
            } else if ft.is_symlink() {
                out.insert(
                    p.clone(),
                    std::fs::read_link(&p)
                        .unwrap()
                        .into_os_string()
                        .into_encoded_bytes(),
                );
            } else if ft.is_file() {
                out.insert(p.clone(), std::fs::read(&p).unwrap());
            } else {
                // The FIFO trap: reading it would block.
                out.insert(p.clone(), b"<special>".to_vec());
            }
        }
    }
    out
}

#[test]
fn workspace_resolution_never_leaves_the_root() {
    let _r = report("workspace_resolution_never_leaves_the_root");
    let t = trap();
    let before = snapshot(&t.outside);
    let ws = Workspace::open(&t.ws, "/workspace").unwrap();
    let op = prop_oneof![Just(0u8), Just(1u8), Just(2u8), Just(3u8)];
    runner()
        .run(&(hostile_path(), op), |(path, op)| {
            if std::env::var_os("FUZZ_TRACE").is_some() {
                eprintln!("op {op} {path:?}");
            }
            match op {
                0 => {
                    if let Ok(r) = ws.read(&path, 0, 0) {
                        prop_assert_ne!(&r.data[..], b"SECRET", "read {:?} got outside data", path);
                    }
                }
                1 => {
                    let _ = ws.write(&path, b"PWNED", false, 0o644);
                }
                2 => {
                    let _ = ws.write(&path, b"PWNED", true, 0o644);
                }
                _ => {
                    if let Ok((entries, _)) = ws.list(&path, true, 0) {
                        for e in entries {
                            prop_assert!(
                                !e.path.contains("secret") && !e.path.contains("nested"),
                                "list {:?} shows {:?}",
                                path,
                                e.path
                            );
                        }
                    }
                }
            }
            // An escape is PERMISSION_DENIED (Escape), never a success outside.
            if path
                .split('/')
                .any(|c| c == "out" || c == "abs" || c == "abs-climb")
            {
                if let Err(e) = ws.read(&path, 0, 0) {
                    prop_assert!(!matches!(e, WsError::Io { .. }), "{path:?}: {e}");
                }
            }
            Ok(())
        })
        .unwrap();
    assert_eq!(
        before,
        snapshot(&t.outside),
        "something outside the workspace changed"
    );
    // The traps are still there (nothing was replaced through a link), and writes did land
    // inside.
    assert!(std::fs::symlink_metadata(t.ws.join("out"))
        .unwrap()
        .file_type()
        .is_symlink());
    assert!(snapshot(&t.ws).values().any(|v| v.starts_with(b"PWNED")));
}
