//! Workspaces end to end (real containerd + runsc): hostile paths, a swap race, size caps,
//! large files, storage classes, soft delete and GC.

#[macro_use]
mod common;

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::*;
use computed::api::compute::v1 as pb;
use sha2::{Digest, Sha256};
use tonic::Code;

fn data_dir(d: &Daemon, id: &str) -> PathBuf {
    d.state_dir().join("workspaces").join(id).join("data")
}

#[derive(Clone, Copy, Debug)]
enum Op {
    Read,
    Write,
    Append,
    List,
}

async fn run_op(c: &mut Client, id: &str, op: Op, path: &str) -> Result<Vec<u8>, tonic::Status> {
    match op {
        Op::Read => try_read_file(c, id, path).await.map(|r| r.data.into()),
        Op::Write | Op::Append => c
            .write_file(pb::WriteFileRequest {
                append: matches!(op, Op::Append),
                ..write_req(id, path, b"pwned")
            })
            .await
            .map(|_| vec![]),
        Op::List => c
            .list_files(pb::ListFilesRequest {
                recursive: true,
                ..list_req(id, path)
            })
            .await
            .map(|r| {
                r.into_inner()
                    .entries
                    .into_iter()
                    .map(|e| e.path)
                    .collect::<Vec<_>>()
                    .join("\n")
                    .into_bytes()
            }),
    }
}

/// Every file (path, content) under `dir`, not following symlinks.
fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let ft = e.file_type().unwrap();
            if ft.is_dir() {
                stack.push(e.path());
            } else if ft.is_file() {
                out.push((e.path(), std::fs::read(e.path()).unwrap()));
            } else {
                out.push((e.path(), vec![]));
            }
        }
    }
    out.sort();
    out
}

/// ReadFileRequest with `path` as raw bytes, to send what a `string` cannot hold.
#[derive(Clone, PartialEq, prost::Message)]
struct RawReadFileRequest {
    #[prost(string, tag = "1")]
    sandbox_id: String,
    #[prost(bytes = "vec", tag = "2")]
    path: Vec<u8>,
}

async fn raw_read(addr: &str, id: &str, path: &[u8]) -> tonic::Status {
    let mut grpc = tonic::client::Grpc::new(channel(addr).await);
    grpc.ready().await.unwrap();
    let codec = tonic_prost::ProstCodec::<RawReadFileRequest, pb::ReadFileResponse>::default();
    let req = tonic::Request::new(RawReadFileRequest {
        sandbox_id: id.into(),
        path: path.to_vec(),
    });
    grpc.unary(
        req,
        http::uri::PathAndQuery::from_static("/compute.v1.ComputeService/ReadFile"),
        codec,
    )
    .await
    .expect_err("invalid UTF-8 must be refused")
}

#[tokio::test(flavor = "multi_thread")]
async fn hostile_paths_fail_with_the_right_code_and_touch_nothing_outside() {
    need!();
    let (d, mut c, id) = start_sandbox("hostile", "").await;
    let sibling = ready_sandbox(&mut c, create_req("t", "sibling")).await;
    let ws = data_dir(&d, &id);
    let sib = data_dir(&d, &sibling);
    std::fs::write(sib.join("secret"), b"sibling-secret").unwrap();

    // Fixtures, made on the host exactly as a hostile sandbox would leave them.
    std::fs::write(ws.join("data.txt"), b"inside").unwrap();
    std::fs::create_dir_all(ws.join("nested/deep")).unwrap();
    let links: &[(&str, &str)] = &[
        ("link-root", "/"),
        ("link-proc", "/proc/self/root"),
        ("link-proc-rel", "../../../../proc/self/root"),
        ("link-dev", "/dev/zero"),
        ("link-etc", "/etc"),
        ("link-tmp", "/tmp"),
        ("link-dotdot", ".."),
        ("link-sibling-rel", "../../SIB/data"),
        ("chain1", "chain2"),
        ("chain2", "chain3"),
        ("chain3", "/"),
        ("chain-in1", "chain-in2"),
        ("chain-in2", "data.txt"),
        ("loop-a", "loop-b"),
        ("loop-b", "loop-a"),
        ("self-loop", "self-loop"),
        ("link-abs-inside", "/workspace/data.txt"),
        ("link-abs-prefix", "/workspacex/data.txt"),
        ("link-abs-dotdot", "/workspace/../etc/passwd"),
        ("link-file-as-dir", "data.txt"),
        ("nested/deep/link-up", "../../.."),
        ("nested/deep/link-up-ok", "../../data.txt"),
        ("link-win", "C:\\Windows\\system32"),
    ];
    for (name, target) in links {
        let target = target.replace("SIB", &sibling);
        symlink(&target, ws.join(name)).unwrap();
    }
    symlink(&sib, ws.join("link-sibling")).unwrap();
    nix::unistd::mkfifo(
        &ws.join("fifo"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
    nix::sys::stat::mknod(
        &ws.join("chardev"),
        nix::sys::stat::SFlag::S_IFCHR,
        nix::sys::stat::Mode::from_bits_truncate(0o644),
        nix::sys::stat::makedev(1, 3),
    )
    .unwrap();
    let _sock = std::os::unix::net::UnixListener::bind(ws.join("socket")).unwrap();

    // Canaries outside the workspace.
    let outside = d.dir.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("canary"), b"canary").unwrap();
    let before_outside = snapshot(&outside);
    let before_sibling = snapshot(&sib);
    let before_state: Vec<_> = std::fs::read_dir(d.state_dir().join("workspaces"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();

    let long_name = "x".repeat(300);
    let deep = vec!["a"; 1000].join("/");
    use Code::{FailedPrecondition, InvalidArgument, NotFound, PermissionDenied};
    use Op::*;
    let cases: Vec<(Op, &str, Option<Code>)> = vec![
        // `..` in every position.
        (Read, "../x", Some(InvalidArgument)),
        (Read, "..", Some(InvalidArgument)),
        (Read, "a/../../x", Some(InvalidArgument)),
        (Read, "./../x", Some(InvalidArgument)),
        (Read, "a/b/../../../x", Some(InvalidArgument)),
        (Read, "/../x", Some(InvalidArgument)),
        (Read, "/workspace/../x", Some(InvalidArgument)),
        (Read, "nested/../../data.txt", Some(InvalidArgument)),
        (Write, "../escape", Some(InvalidArgument)),
        (Write, "newdir/../../escape", Some(InvalidArgument)),
        (Append, "../../escape", Some(InvalidArgument)),
        (List, "..", Some(InvalidArgument)),
        (List, "nested/../..", Some(InvalidArgument)),
        // Encoded or doubled separators are taken literally, never decoded.
        (Read, "..%2fx", Some(NotFound)),
        (Read, "%2e%2e/x", Some(NotFound)),
        (Read, "..\\x", Some(NotFound)),
        (Read, "nested//deep/..//..//data.txt", None),
        // Absolute paths are relative to the workspace.
        (Read, "/etc/passwd", Some(NotFound)),
        (Read, "/workspace/data.txt", None),
        (Read, "/data.txt", None),
        // Symlinks out of the workspace.
        (Read, "link-root/etc/passwd", Some(PermissionDenied)),
        (Read, "link-root", Some(PermissionDenied)),
        (Write, "link-root/tmp/pwned", Some(PermissionDenied)),
        (Append, "link-root/tmp/pwned", Some(PermissionDenied)),
        (List, "link-root", Some(PermissionDenied)),
        (Read, "link-proc/etc/passwd", Some(PermissionDenied)),
        (Read, "link-proc-rel/etc/passwd", Some(PermissionDenied)),
        (Read, "link-dev", Some(PermissionDenied)),
        (Read, "link-etc/passwd", Some(PermissionDenied)),
        (Write, "link-tmp/pwned", Some(PermissionDenied)),
        (Read, "link-dotdot/outside/canary", Some(PermissionDenied)),
        (List, "link-dotdot", Some(PermissionDenied)),
        (Read, "link-sibling/secret", Some(PermissionDenied)),
        (Write, "link-sibling/secret", Some(PermissionDenied)),
        (Read, "link-sibling-rel/secret", Some(PermissionDenied)),
        (Read, "link-abs-prefix", Some(PermissionDenied)),
        (Read, "link-abs-dotdot", Some(PermissionDenied)),
        (Read, "nested/deep/link-up/data.txt", Some(PermissionDenied)),
        (Write, "nested/deep/link-up/pwned", Some(PermissionDenied)),
        // Chains and loops.
        (Read, "chain1/etc/passwd", Some(PermissionDenied)),
        (Write, "chain1/tmp/pwned", Some(PermissionDenied)),
        (Read, "chain-in1", None),
        (Read, "loop-a", Some(InvalidArgument)),
        (Read, "self-loop", Some(InvalidArgument)),
        (Write, "loop-a/x", Some(InvalidArgument)),
        // Links that stay inside are followed.
        (Read, "link-abs-inside", None),
        (Read, "nested/deep/link-up-ok", None),
        (Read, "link-file-as-dir/x", Some(FailedPrecondition)),
        (Read, "link-win", Some(NotFound)),
        // Special files: refused, and a FIFO never blocks.
        (Read, "fifo", Some(FailedPrecondition)),
        (Write, "fifo", Some(FailedPrecondition)),
        (Append, "fifo", Some(FailedPrecondition)),
        (Read, "chardev", Some(FailedPrecondition)),
        (Append, "chardev", Some(FailedPrecondition)),
        (Read, "socket", Some(FailedPrecondition)),
        (List, "fifo", Some(FailedPrecondition)),
        // Directories and the root.
        (Read, "nested", Some(FailedPrecondition)),
        (Write, "nested", Some(FailedPrecondition)),
        (Write, "", Some(FailedPrecondition)),
        (Write, "/workspace", Some(FailedPrecondition)),
        // Malformed names.
        (Read, "a\0b", Some(InvalidArgument)),
        (Write, "x\0/../../etc", Some(InvalidArgument)),
        (Read, &long_name, Some(InvalidArgument)),
        (Read, &deep, Some(NotFound)),
    ];
    assert!(cases.len() >= 50, "{} cases", cases.len());
    for (op, path, want) in &cases {
        let got = tokio::time::timeout(Duration::from_secs(10), run_op(&mut c, &id, *op, path))
            .await
            .unwrap_or_else(|_| panic!("{op:?} {path:?} hung"));
        match (want, got) {
            (None, Ok(data)) => {
                if matches!(op, Read) {
                    assert_eq!(data, b"inside", "{op:?} {path:?}");
                }
            }
            (None, Err(s)) => panic!("{op:?} {path:?}: expected success, got {s:?}"),
            (Some(code), Ok(_)) => panic!("{op:?} {path:?}: expected {code:?}, got success"),
            (Some(code), Err(s)) => assert_eq!(s.code(), *code, "{op:?} {path:?}: {}", s.message()),
        }
    }
    // Nothing outside changed: the canaries, the sibling, the host's /tmp, the state dir.
    assert_eq!(snapshot(&outside), before_outside);
    assert_eq!(snapshot(&sib), before_sibling);
    assert!(!Path::new("/tmp/pwned").exists());
    let after_state: Vec<_> = std::fs::read_dir(d.state_dir().join("workspaces"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(before_state, after_state);
    // Invalid UTF-8 in a path is the caller's error.
    for bad in [&b"\xff\xfe"[..], b"ok/\xc0\xaf../etc", b"\xed\xa0\x80"] {
        assert_eq!(
            raw_read(&d.addr, &id, bad).await.code(),
            Code::InvalidArgument
        );
    }
    // A recursive listing never descends through a link.
    let l = run_op(&mut c, &id, List, ".").await.unwrap();
    let l = String::from_utf8(l).unwrap();
    assert!(l.lines().any(|p| p == "link-root"));
    assert!(!l
        .lines()
        .any(|p| p.starts_with("link-root/") || p.starts_with("link-etc/")));
    // Hard links to files outside cannot be made from inside either (nor from the host: no
    // RPC makes links).
    let o = exec(
        &mut c,
        exec_req(&id, "ln", &["/etc/passwd", "/workspace/hardlink"]),
    )
    .await
    .unwrap();
    assert_ne!(
        o.code(),
        0,
        "hard link across the workspace boundary must fail"
    );
    // setuid bits are never set from the host side.
    c.write_file(pb::WriteFileRequest {
        mode: 0o4755,
        ..write_req(&id, "suid", b"x")
    })
    .await
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(ws.join("suid"))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777,
        0o755
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sandbox_swapping_dirs_and_symlinks_never_gets_the_host_touched() {
    need!();
    let (d, mut c, id) = start_sandbox("race", "").await;
    let marker = format!("race-{}", uuid::Uuid::new_v4().simple());
    // Inside: `d` flips between a real directory holding `f` and a symlink to `/`.
    let swap = "cd /workspace; i=0; while [ $i -lt 100000 ]; do \
                rm -rf d; mkdir d; echo inside > d/f; rm -rf d; ln -s / d; i=$((i+1)); done";
    let mut sc = d.client().await;
    let sid = id.clone();
    let swapper = tokio::spawn(async move {
        let _ = exec(&mut sc, timed(&sid, "sh", &["-c", swap], 60)).await;
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let host_etc_hostname = std::fs::read("/etc/hostname").unwrap_or_default();
    let (mut ok_reads, mut ok_writes, mut denied) = (0, 0, 0);
    for i in 0..2000 {
        match run_op(&mut c, &id, Op::Read, "d/f").await {
            Ok(data) => {
                // `echo inside > d/f` may be caught between create and write: empty is fine.
                assert!(
                    b"inside\n".starts_with(&data),
                    "read something that is not the workspace's: {data:?}"
                );
                ok_reads += 1;
            }
            Err(s) => {
                assert!(
                    matches!(
                        s.code(),
                        Code::PermissionDenied | Code::NotFound | Code::FailedPrecondition
                    ),
                    "{s:?}"
                );
                denied += 1;
            }
        }
        match run_op(&mut c, &id, Op::Read, "d/etc/hostname").await {
            Ok(data) => assert_ne!(data, host_etc_hostname, "read the host's /etc/hostname"),
            Err(s) => assert!(
                matches!(
                    s.code(),
                    Code::PermissionDenied | Code::NotFound | Code::FailedPrecondition
                ),
                "{s:?}"
            ),
        }
        let path = format!("d/{marker}-{i}");
        if try_write_file(&mut c, &id, &path, b"w").await.is_ok() {
            ok_writes += 1;
        }
    }
    swapper.abort();
    // Nothing landed outside the workspace: not in the host's /, nor anywhere near the state.
    for dir in [Path::new("/"), Path::new("/tmp"), d.dir.path()] {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            assert!(
                !e.file_name().to_string_lossy().contains(&marker),
                "escaped to {dir:?}"
            );
        }
    }
    eprintln!(
        "race: {ok_reads} reads and {ok_writes} writes went through inside, {denied} refused"
    );
    assert!(ok_reads + denied == 2000);
}

#[tokio::test(flavor = "multi_thread")]
async fn size_cap_holds_inside_and_from_writefile() {
    need!();
    let (d, mut c) = start_client("size", "").await;
    let id = ready_sandbox(
        &mut c,
        with_workspace(create_req("t", "size"), "", "64Mi", ""),
    )
    .await;
    let o = exec(
        &mut c,
        exec_req(
            &id,
            "dd",
            &["if=/dev/zero", "of=/workspace/fill", "bs=1M", "count=200"],
        ),
    )
    .await
    .unwrap();
    assert_ne!(o.code(), 0, "dd past the cap must fail");
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(err.contains("No space left"), "{err}");
    let size: u64 = sh(&mut c, &id, "wc -c < /workspace/fill")
        .await
        .trim()
        .parse()
        .unwrap();
    assert!(size <= 64 << 20 && size > 40 << 20, "filled {size} bytes");
    // WriteFile on the full volume: RESOURCE_EXHAUSTED.
    assert_code(
        try_write_file(&mut c, &id, "more", vec![1; 8 << 20]).await,
        Code::ResourceExhausted,
        "WriteFile on the full volume",
    );
    // The node's own disk did not fill: the volume image holds at most about the cap on the
    // host (its allocated blocks; the partition's free space moves with every other test).
    let image = d
        .state_dir()
        .join("workspaces")
        .join(&id)
        .join("volume.ext4");
    let used = std::os::unix::fs::MetadataExt::blocks(&std::fs::metadata(&image).unwrap()) * 512;
    assert!(used < 80 << 20, "host disk used {used}");
    // Freeing space inside makes WriteFile work again.
    sh(&mut c, &id, "rm /workspace/fill").await;
    write_file(&mut c, &id, "more", vec![1; 8 << 20]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn large_files_in_16mib_chunks_round_trip() {
    need!();
    let (_d, mut c) = start_client("large", "").await;
    let id = create(&mut c, create_req("t", "large")).await.sandbox_id;
    // File RPCs work while the sandbox is still STARTING.
    let mut want = Sha256::new();
    for i in 0..4u8 {
        let chunk: Vec<u8> = (0..(16usize << 20))
            .map(|j| (j as u8) ^ i.wrapping_mul(37))
            .collect();
        want.update(&chunk);
        let w = c
            .write_file(pb::WriteFileRequest {
                append: i > 0,
                mode: 0o600,
                ..write_req(&id, "big/file.bin", chunk)
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(w.bytes_written, 16 << 20);
    }
    let want = hex::encode(want.finalize());
    let mut got = Sha256::new();
    let mut offset = 0i64;
    loop {
        let r = c
            .read_file(pb::ReadFileRequest {
                offset,
                ..read_req(&id, "big/file.bin")
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.total_size, 64 << 20);
        assert!(r.data.len() <= 16 << 20);
        got.update(&r.data);
        offset += r.data.len() as i64;
        if r.eof {
            break;
        }
    }
    assert_eq!(offset, 64 << 20);
    assert_eq!(hex::encode(got.finalize()), want);
    // The sandbox sees the same bytes.
    let inside = sh(&mut c, &id, "sha256sum /workspace/big/file.bin").await;
    assert!(inside.starts_with(&want), "{inside} vs {want}");
    // max_bytes and offset.
    let r = c
        .read_file(pb::ReadFileRequest {
            offset: (64 << 20) - 10,
            max_bytes: 100,
            ..read_req(&id, "big/file.bin")
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.data.len(), 10);
    assert!(r.eof);
    // ListFiles: every FileEntry field, max_entries and truncated.
    for i in 0..30 {
        write_file(&mut c, &id, &format!("many/f{i:02}"), vec![b'x'; i]).await;
    }
    let l = list_files(
        &mut c,
        pb::ListFilesRequest {
            max_entries: 10,
            ..list_req(&id, "many")
        },
    )
    .await;
    assert!(l.truncated);
    assert_eq!(l.entries.len(), 10);
    let e = &l.entries[3];
    assert_eq!(e.path, "f03");
    assert_eq!(e.size, 3);
    assert!(!e.is_dir);
    assert_eq!(e.mode, 0o644);
    assert!(e.modified_at.as_ref().unwrap().seconds > 1_700_000_000);
    let l = list_files(
        &mut c,
        pb::ListFilesRequest {
            recursive: true,
            ..list_req(&id, "/workspace")
        },
    )
    .await;
    assert!(!l.truncated);
    assert!(l
        .entries
        .iter()
        .any(|e| e.path == "big" && e.is_dir && e.size == 0));
    assert!(l
        .entries
        .iter()
        .any(|e| e.path == "big/file.bin" && e.mode == 0o600));
    assert!(l.entries.iter().any(|e| e.path == "many/f29"));
}

#[tokio::test(flavor = "multi_thread")]
async fn storage_classes_mount_paths_and_sparse_volumes() {
    need!();
    let (d, mut c) = start_client("classes", "").await;
    let bad = with_workspace(create_req("t", "bad-class"), "gold", "", "");
    assert_code(
        c.create_sandbox(bad).await,
        Code::InvalidArgument,
        "storage class gold",
    );
    for mp in ["relative", "/a/../b", "/a//b", "/", "/proc"] {
        let bad = with_workspace(create_req("t", "bad-mount"), "", "", mp);
        assert_code(c.create_sandbox(bad).await, Code::InvalidArgument, mp);
    }
    // `local`: a plain directory.
    let req = with_workspace(create_req("t", "local"), "local", "", "/home/user/work");
    let local = ready_sandbox(&mut c, req).await;
    assert!(!d
        .state_dir()
        .join("workspaces")
        .join(&local)
        .join("volume.ext4")
        .exists());
    assert_eq!(
        sh(&mut c, &local, "pwd; echo hi > f; cat /home/user/work/f").await,
        "/home/user/work\nhi\n"
    );
    assert_eq!(
        read_file(&mut c, &local, "/home/user/work/f").await.data,
        &b"hi\n"[..]
    );
    // `standard` (the default): sparse 5 GiB ext4 volumes.
    let mut ids = Vec::new();
    for i in 0..5 {
        ids.push(ready_sandbox(&mut c, create_req("t", &format!("sparse{i}"))).await);
    }
    use std::os::unix::fs::MetadataExt;
    for id in &ids {
        let img = d
            .state_dir()
            .join("workspaces")
            .join(id)
            .join("volume.ext4");
        let m = std::fs::metadata(&img).unwrap();
        assert_eq!(m.len(), 5 << 30, "apparent size is the requested size");
        assert!(
            m.blocks() * 512 < 32 << 20,
            "{} bytes allocated for an empty volume",
            m.blocks() * 512
        );
        let df = sh(&mut c, id, "df -k /workspace | tail -1").await;
        let total_kb: u64 = df.split_whitespace().nth(1).unwrap().parse().unwrap();
        assert!(total_kb > 4_500_000 && total_kb <= 5 << 20, "{df}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn soft_delete_then_gc_after_the_grace_period() {
    need!();
    let (mut d, mut c) = start_client("gc", "workspace_grace_secs = 4\ngc_interval_secs = 0").await;
    let id = ready_sandbox(&mut c, create_req("t", "gc")).await;
    let keep = ready_sandbox(&mut c, create_req("t", "gc-live")).await;
    sh(&mut c, &id, "echo precious > /workspace/notes.txt").await;
    destroy(&mut c, &id).await;
    let base = d.state_dir().join("workspaces").join(&id);
    let config = d.config.clone();
    let computectl = |d: &Daemon, args: &[&str]| {
        let out = d.computectl(args);
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let computed_gc = || {
        let out = Command::new(env!("CARGO_BIN_EXE_computed"))
            .arg("--config")
            .arg(&config)
            .arg("gc")
            .output()
            .unwrap();
        assert!(out.status.success());
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    // Operators see it in the trash and can read it.
    let (ok, out, _) = computectl(&d, &["trash", "ls"]);
    assert!(ok && out.contains(&id));
    let (ok, out, err) = computectl(&d, &["trash", "cat", &id, "notes.txt"]);
    assert!(ok, "{err}");
    assert_eq!(out, "precious\n");
    let (ok, _, _) = computectl(&d, &["trash", "cat", &id, "../../etc/passwd"]);
    assert!(!ok);
    // Not expired: GC deletes nothing, also across a daemon restart.
    assert!(computed_gc().contains("0 workspace(s)"));
    d.kill9();
    d.spawn();
    let mut c = d.client().await;
    assert!(base.join("volume.ext4").exists());
    assert!(base.join("tombstone.json").exists());
    tokio::time::sleep(Duration::from_secs(4)).await;
    let out = computed_gc();
    assert!(out.contains(&format!("freed {id}")), "{out}");
    assert!(!base.exists(), "expired workspace deleted");
    // A live sandbox's workspace is never collected.
    assert!(d
        .state_dir()
        .join("workspaces")
        .join(&keep)
        .join("volume.ext4")
        .exists());
    assert_eq!(sh(&mut c, &keep, "echo alive").await, "alive\n");
    drop(c);
    // The daemon's own loop: destroy, then watch it free the workspace and forget the sandbox.
    let mut d2 = start("gcloop", "workspace_grace_secs = 1\ngc_interval_secs = 1");
    let mut c2 = d2.client().await;
    let id2 = ready_sandbox(&mut c2, create_req("t", "gcloop")).await;
    destroy(&mut c2, &id2).await;
    let base2 = d2.state_dir().join("workspaces").join(&id2);
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while base2.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "GC loop never freed the workspace"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The log line follows the deletion.
    while !d2.log_text().contains("GC freed workspace") {
        assert!(
            std::time::Instant::now() < deadline,
            "GC freed the workspace without logging it"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_code(
        try_describe(&mut c2, &id2).await,
        Code::NotFound,
        "describe a sandbox the GC forgot",
    );
    d2.kill9();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_reader_never_sees_a_torn_write() {
    need!();
    let (d, mut c, id) = start_sandbox("atomic", "").await;
    write_file(&mut c, &id, "f", vec![b'A'; 4 << 20]).await;
    let mut wc = d.client().await;
    let writer = tokio::spawn({
        let id = id.clone();
        async move {
            for i in 0..60u32 {
                let b = if i % 2 == 0 { b'B' } else { b'A' };
                write_file(&mut wc, &id, "f", vec![b; 4 << 20]).await;
            }
        }
    });
    let mut reads = 0;
    let mut seen = std::collections::HashSet::new();
    while !writer.is_finished() {
        let r = read_file(&mut c, &id, "f").await;
        assert_eq!(r.data.len(), 4 << 20, "a read saw a partial file");
        let first = r.data[0];
        assert!(r.data.iter().all(|b| *b == first), "a read saw a torn mix");
        seen.insert(first);
        reads += 1;
    }
    writer.await.unwrap();
    assert!(reads > 5, "only {reads} reads overlapped the writes");
    assert_eq!(seen.len(), 2, "both versions were observed");
}

/// The loop devices backed by files under `dir`.
fn loops_under(dir: &Path) -> Vec<String> {
    loops_mentioning(&format!("{}/", dir.display()))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_destroyed_volume_lets_go_of_its_loop_device_while_other_sandboxes_live() {
    need!();
    let (d, mut c) = start_client("loop-release", "").await;
    // `gone`'s volume is mounted on the host when `live` starts: `live`'s runtime processes get
    // mount namespaces that are copies of the host's, with that mount in them.
    let gone = ready_sandbox(&mut c, create_req("t", "loop-gone")).await;
    let live = ready_sandbox(&mut c, create_req("t", "loop-live")).await;
    assert_eq!(sh(&mut c, &live, "echo up").await, "up\n");
    let dir = d.state_dir().join("workspaces").join(&gone);
    assert_eq!(loops_under(&dir).len(), 1, "{:?}", loops_under(&dir));
    destroy(&mut c, &gone).await;
    // Detached on the host, and nowhere else either: the loop device is released while `live`
    // still runs (a copy of the mount in its namespaces would hold it until `live` ended).
    let t0 = std::time::Instant::now();
    while !loops_under(&dir).is_empty() && t0.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(loops_under(&dir), Vec::<String>::new());
    assert_eq!(sh(&mut c, &live, "echo still").await, "still\n");
}
