//! computectl against a real node daemon: every command, its table and JSON output, and its
//! exit codes; `top` under tmux; `exec` exit codes and Ctrl-C.

#[macro_use]
mod common;

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::*;
use computed::api::compute::v1 as pb;

fn ctl(d: &Daemon, args: &[&str]) -> Output {
    d.computectl_command()
        .args(args)
        .env("CONTAINERD_ADDRESS", containerd_socket())
        .env("COMPUTE_CONFIG", &d.config)
        .output()
        .unwrap()
}

/// computectl with `args` alone: no socket of a daemon, no environment of the test's.
fn bare(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_computectl"))
        .args(args)
        .output()
        .unwrap()
}

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn err(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn json(o: &Output) -> serde_json::Value {
    assert!(o.status.success(), "{}", err(o));
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", text(o)))
}

#[tokio::test(flavor = "multi_thread")]
async fn every_command_against_a_real_node() {
    need!();
    let (d, mut c) = start_client("ctl", "cancel_grace_secs = 1\nworkspace_grace_secs = 1").await;
    let a = ready_sandbox(&mut c, create_req("acme", "s1")).await;
    let b = ready_sandbox(&mut c, create_req("globex", "s2")).await;

    // ls: table, filters, wide, JSON.
    let o = ctl(&d, &["ls"]);
    assert!(o.status.success(), "{}", err(&o));
    let t = text(&o);
    let header = t.lines().next().unwrap();
    for col in [
        "ID", "TENANT", "SESSION", "STATUS", "AGE", "CPU", "MEM", "DISK",
    ] {
        assert!(header.contains(col), "{header}");
    }
    assert!(t.contains(&a) && t.contains(&b) && t.contains("READY"));
    let o = ctl(&d, &["ls", "--tenant", "acme"]);
    assert!(text(&o).contains(&a) && !text(&o).contains(&b));
    let o = ctl(&d, &["ls", "-o", "wide"]);
    assert!(text(&o).lines().next().unwrap().contains("IMAGE"));
    let v = json(&ctl(&d, &["ls", "-o", "json", "--status", "ready"]));
    let arr = v.as_array().unwrap();
    assert_eq!(arr.len(), 2);
    assert!(arr
        .iter()
        .any(|s| s["sandbox_id"] == a.as_str() && s["tenant_id"] == "acme"));
    assert!(arr[0]["usage"]["cpu_ms"].as_u64().unwrap() > 0);
    assert_eq!(arr[0]["limits"]["cpu_millis"], 1000);

    // describe.
    let o = ctl(&d, &["describe", &a]);
    assert!(o.status.success());
    assert!(
        text(&o).contains("Tenant:")
            && text(&o).contains("acme")
            && text(&o).contains("Memory limit:")
    );
    assert_eq!(
        json(&ctl(&d, &["describe", &a, "-o", "json"]))["session_id"],
        "s1"
    );
    let o = ctl(&d, &["describe", &uuid::Uuid::new_v4().to_string()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(err(&o).contains("not found"), "{}", err(&o));

    // exec: output and exit codes.
    let o = ctl(
        &d,
        &[
            "exec",
            &a,
            "--",
            "sh",
            "-c",
            "echo out; echo err >&2; exit 3",
        ],
    );
    assert_eq!(o.status.code(), Some(3));
    assert_eq!(text(&o), "out\n");
    assert_eq!(err(&o), "err\n");
    let o = ctl(
        &d,
        &[
            "exec",
            &a,
            "-e",
            "X=1",
            "-w",
            "/tmp",
            "--",
            "sh",
            "-c",
            "echo $X; pwd",
        ],
    );
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(text(&o), "1\n/tmp\n");
    let o = ctl(&d, &["exec", &a, "--", "/no/such/cmd"]);
    assert_eq!(o.status.code(), Some(127));

    // exec: Ctrl-C (SIGINT) cancels the command in the sandbox.
    let child = d
        .computectl_command()
        .args([
            "exec",
            &a,
            "--",
            "sh",
            "-c",
            "echo started; while :; do date +%s%N > /workspace/beat; sleep 0.1; done",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let beat = d.state_dir().join("workspaces").join(&a).join("data/beat");
    let t0 = Instant::now();
    while !beat.exists() {
        assert!(t0.elapsed() < Duration::from_secs(10), "exec never started");
        std::thread::sleep(Duration::from_millis(50));
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::SIGINT,
    )
    .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cancelled"));
    std::thread::sleep(Duration::from_secs(3));
    let b1 = std::fs::read(&beat).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        b1,
        std::fs::read(&beat).unwrap(),
        "the command still runs after Ctrl-C"
    );

    // cp both ways.
    let dir = tempfile::tempdir().unwrap();
    let local = dir.path().join("in.bin");
    let data: Vec<u8> = (0..(20 << 20)).map(|i| (i % 251) as u8).collect();
    std::fs::write(&local, &data).unwrap();
    let o = ctl(
        &d,
        &["cp", local.to_str().unwrap(), &format!("{a}:up/in.bin")],
    );
    assert!(o.status.success(), "{}", err(&o));
    let back = dir.path().join("back.bin");
    let o = ctl(
        &d,
        &["cp", &format!("{a}:up/in.bin"), back.to_str().unwrap()],
    );
    assert!(o.status.success(), "{}", err(&o));
    assert_eq!(std::fs::read(&back).unwrap(), data);
    let o = ctl(&d, &["cp", "x", "y"]);
    assert_eq!(o.status.code(), Some(1));

    // image ls / alias / import (with a progress stream).
    let v = json(&ctl(&d, &["image", "ls", "-o", "json"]));
    assert!(v.as_array().unwrap().iter().any(|i| i["name"] == IMAGE));
    let o = ctl(&d, &["image", "alias", IMAGE, "compute.local/alias:1"]);
    assert!(o.status.success(), "{}", err(&o));
    assert!(text(&ctl(&d, &["image", "ls"])).contains("compute.local/alias:1"));
    let o = ctl(
        &d,
        &[
            "image",
            "import",
            image_tar().to_str().unwrap(),
            "--name",
            "compute.local/again:2",
        ],
    );
    assert!(o.status.success(), "{}", err(&o));
    assert!(text(&o).contains("imported compute.local/again:2"));
    let o = ctl(&d, &["image", "import", "/no/such.tar"]);
    assert_eq!(o.status.code(), Some(1));
    let o = ctl(&d, &["image", "alias", "compute.local/none:0", "x:1"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(err(&o).contains("NotFound"), "{}", err(&o));

    // destroy (one good, one unknown: exit 1, the good one is still destroyed), trash, gc.
    let o = ctl(&d, &["destroy", &b, &uuid::Uuid::new_v4().to_string()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o).contains(&format!("destroyed {b}")));
    let desc = c
        .describe_sandbox(pb::DescribeSandboxRequest {
            sandbox_id: b.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(desc.status, SandboxStatus::Destroyed as i32);
    let v = json(&ctl(&d, &["trash", "ls", "-o", "json"]));
    assert!(v
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["sandbox_id"] == b.as_str()));
    std::thread::sleep(Duration::from_millis(1500));
    let v = json(&ctl(&d, &["gc", "--dry-run", "-o", "json"]));
    assert_eq!(v["dry_run"], true);
    assert!(v["freed"]
        .as_array()
        .unwrap()
        .iter()
        .any(|f| f["sandbox_id"] == b.as_str()));
    assert!(
        d.state_dir().join("workspaces").join(&b).exists(),
        "dry run deletes nothing"
    );
    let o = ctl(&d, &["gc"]);
    assert!(o.status.success());
    assert!(text(&o).contains("freed 1 workspace(s)"), "{}", text(&o));
    assert!(!d.state_dir().join("workspaces").join(&b).exists());

    // doctor: the checks, and a failure when the daemon is not there.
    let o = ctl(&d, &["doctor"]);
    assert!(o.status.success(), "{}\n{}", text(&o), err(&o));
    for check in [
        "config",
        "containerd",
        "runsc",
        "cgroups",
        "kvm",
        "volumes",
        "disk",
        "daemon",
        "suspend",
    ] {
        assert!(text(&o).contains(check), "{}", text(&o));
    }
    assert!(
        text(&o).contains("memory kept: runsc checkpoint/restore"),
        "{}",
        text(&o)
    );
    let v = json(&ctl(&d, &["doctor", "-o", "json"]));
    assert!(v.as_array().unwrap().iter().all(|c| c["status"] != "FAIL"));
    let o = Command::new(env!("CARGO_BIN_EXE_computectl"))
        .args(["--socket", "/nonexistent.sock", "doctor"])
        .env("CONTAINERD_ADDRESS", containerd_socket())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o).contains("FAIL") && text(&o).contains("start `computed node`"));

    // The admin service is not on TCP unless configured: computectl over --addr can still use
    // ComputeService, but not the admin verbs.
    let o = bare(&["--addr", &d.addr, "ls"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(err(&o).contains("Unimplemented"), "{}", err(&o));
    let o = bare(&["--addr", &d.addr, "exec", &a, "--", "echo", "tcp"]);
    assert_eq!(text(&o), "tcp\n");
    // Unreachable node: a clear error and exit 1; usage errors exit 2.
    let o = bare(&["--socket", "/nonexistent.sock", "ls"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(err(&o).contains("cannot reach the node"), "{}", err(&o));
    let o = bare(&["ls", "--bogus"]);
    assert_eq!(o.status.code(), Some(2));
    // Completion and help.
    let o = bare(&["completion", "bash"]);
    assert!(o.status.success() && text(&o).contains("computectl"));
    let o = bare(&["exec", "--help"]);
    assert!(text(&o).contains("Examples:"));
}

fn tmux(args: &[&str]) -> String {
    let o = Command::new("tmux").args(args).output().unwrap();
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn top_refreshes_in_a_terminal() {
    need!();
    if which("tmux").is_none() {
        skip("tmux missing (scripts/install-deps installs it)");
        return;
    }
    let (d, mut c) = start_client("top", "").await;
    let busy = ready_sandbox(&mut c, create_req("t", "busy")).await;
    let idle = ready_sandbox(&mut c, create_req("t", "idle")).await;
    let mut c2 = d.client().await;
    let bid = busy.clone();
    let burner = tokio::spawn(async move {
        let _ = exec(
            &mut c2,
            exec_req(
                &bid,
                "python3",
                &[
                    "-c",
                    "import time\nt=time.time()\nwhile time.time()-t<12: pass",
                ],
            ),
        )
        .await;
    });
    let session = format!("computectl-top-{}", std::process::id());
    let cmd = format!(
        "{} --socket {} top --interval 1",
        env!("CARGO_BIN_EXE_computectl"),
        d.socket.display()
    );
    tmux(&[
        "new-session",
        "-d",
        "-s",
        &session,
        "-x",
        "200",
        "-y",
        "20",
        &cmd,
    ]);
    std::thread::sleep(Duration::from_millis(3500));
    let first = tmux(&["capture-pane", "-p", "-t", &session]);
    std::thread::sleep(Duration::from_millis(2000));
    let second = tmux(&["capture-pane", "-p", "-t", &session]);
    tmux(&["send-keys", "-t", &session, "C-c"]);
    std::thread::sleep(Duration::from_millis(300));
    tmux(&["kill-session", "-t", &session]);
    burner.abort();
    assert!(first.contains("computectl top"), "{first}");
    assert_ne!(first, second, "the screen did not refresh");
    // The busy sandbox is listed first.
    let rows: Vec<&str> = second
        .lines()
        .filter(|l| l.contains(&busy) || l.contains(&idle))
        .collect();
    assert_eq!(rows.len(), 2, "{second}");
    assert!(rows[0].contains(&busy), "busiest first:\n{second}");
    let _ = Path::new("/");
}
