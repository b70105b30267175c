//! The sandbox.v1 relay served by the node daemon, with real workers attaching over TCP: the
//! Rust `sandbox-agent` and a Python grpcio worker.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use computed::api::sandbox::v1 as pb;
use pb::sandbox_exec_client::SandboxExecClient;
use tonic::transport::Channel;
use tonic::Code;

struct Agent(Child);

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn agent(d: &Daemon, sandbox: &str, extra: &[&str]) -> Agent {
    let child = Command::new(common::agent_binary())
        .args([
            "--relay",
            &d.addr,
            "--sandbox-id",
            sandbox,
            "--heartbeat",
            "0.3",
            "--grace",
            "1",
        ])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    Agent(child)
}

async fn harness(d: &Daemon) -> SandboxExecClient<Channel> {
    let ch = Channel::from_shared(format!("http://{}", d.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    SandboxExecClient::new(ch)
}

fn req(sandbox: &str, req_id: u64, command: &str, streaming: bool) -> pb::ExecRequest {
    pb::ExecRequest {
        sandbox_id: sandbox.into(),
        exec: Some(pb::Exec {
            req_id,
            command: command.into(),
            stdin: vec![],
            timeout_s: 30,
            streaming,
        }),
    }
}

#[derive(Debug, Default)]
struct Run {
    chunks: Vec<(i32, Vec<u8>)>,
    end: Option<i32>,
    error: Option<String>,
}

impl Run {
    fn stdout(&self) -> String {
        self.chunks
            .iter()
            .filter(|(s, _)| *s != pb::Stream::Stderr as i32)
            .map(|(_, d)| String::from_utf8_lossy(d).into_owned())
            .collect()
    }
    fn stderr(&self) -> String {
        self.chunks
            .iter()
            .filter(|(s, _)| *s == pb::Stream::Stderr as i32)
            .map(|(_, d)| String::from_utf8_lossy(d).into_owned())
            .collect()
    }
}

async fn collect(mut s: tonic::Streaming<pb::ExecEvent>) -> Run {
    let mut r = Run::default();
    while let Some(ev) = s.message().await.unwrap() {
        match ev.event.unwrap() {
            pb::exec_event::Event::Chunk(c) => r.chunks.push((c.stream, c.data)),
            pb::exec_event::Event::End(e) => r.end = Some(e.exit_code),
            pb::exec_event::Event::Error(e) => r.error = Some(e.message),
        }
    }
    r
}

/// Runs an exec, retrying UNAVAILABLE while the worker is still attaching.
async fn run(c: &mut SandboxExecClient<Channel>, r: pb::ExecRequest) -> Run {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match c.exec(r.clone()).await {
            Ok(s) => return collect(s.into_inner()).await,
            Err(s) if s.code() == Code::Unavailable && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Err(s) => panic!("exec: {s:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn relay_semantics_with_the_rust_agent() {
    if !prerequisites() {
        return;
    }
    let d = start("relay", "worker_heartbeat_timeout_ms = 1500");
    let mut h = harness(&d).await;
    let sb = format!("ext-{}", uuid::Uuid::new_v4().simple());

    // No worker: UNAVAILABLE.
    assert_eq!(
        h.exec(req(&sb, 1, "true", true)).await.unwrap_err().code(),
        Code::Unavailable
    );
    // Bad requests.
    assert_eq!(
        h.exec(req(&sb, 1, "", true)).await.unwrap_err().code(),
        Code::InvalidArgument
    );

    let _a = agent(&d, &sb, &["--capacity", "2"]);
    // Streaming: chunks in order, stderr separate, exit code.
    let r = run(
        &mut h,
        req(
            &sb,
            1,
            "echo a; sleep 0.3; echo b >&2; echo c; exit 3",
            true,
        ),
    )
    .await;
    assert_eq!(r.stdout(), "a\nc\n");
    assert_eq!(r.stderr(), "b\n");
    assert_eq!(r.end, Some(3));
    assert!(r.chunks.len() >= 3, "streamed as produced: {:?}", r.chunks);
    // Non-streaming: stdout comes back collected; stderr replayed, not in stdout.
    let r = run(
        &mut h,
        req(&sb, 2, "echo one; echo err >&2; echo two", false),
    )
    .await;
    assert_eq!(r.stdout(), "one\ntwo\n");
    assert_eq!(r.stderr(), "err\n");
    assert_eq!(r.end, Some(0));
    // Signal deaths are negative.
    let r = run(&mut h, req(&sb, 3, "kill -9 $$", true)).await;
    assert_eq!(r.end, Some(-9));
    // stdin.
    let mut with_stdin = req(&sb, 4, "cat; echo", false);
    with_stdin.exec.as_mut().unwrap().stdin = b"from stdin".to_vec();
    assert_eq!(run(&mut h, with_stdin).await.stdout(), "from stdin\n");
    // Timeout kills the process group.
    let mut slow = req(&sb, 5, "sleep 30", true);
    slow.exec.as_mut().unwrap().timeout_s = 1;
    let t = Instant::now();
    let r = run(&mut h, slow).await;
    assert!(
        r.end.unwrap() < 0 && t.elapsed() < Duration::from_secs(5),
        "{r:?}"
    );

    // Duplicate req_id while live: not run twice.
    let long = h
        .exec(req(&sb, 10, "echo started; sleep 30", true))
        .await
        .unwrap()
        .into_inner();
    let dup = h.exec(req(&sb, 10, "echo again", true)).await.unwrap_err();
    assert_eq!(dup.code(), Code::AlreadyExists);
    // Capacity 2: a second concurrent exec fits, a third does not.
    let second = h
        .exec(req(&sb, 11, "sleep 30", true))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        h.exec(req(&sb, 12, "true", true)).await.unwrap_err().code(),
        Code::ResourceExhausted
    );
    // Abort mid-stream ends the exec (SIGTERM → negative exit); an unknown req_id is a no-op.
    let mut long = long;
    let first = long.message().await.unwrap().unwrap();
    assert!(matches!(first.event, Some(pb::exec_event::Event::Chunk(_))));
    h.abort(pb::AbortRequest {
        sandbox_id: sb.clone(),
        req_id: 10,
    })
    .await
    .unwrap();
    h.abort(pb::AbortRequest {
        sandbox_id: sb.clone(),
        req_id: 999,
    })
    .await
    .unwrap();
    h.abort(pb::AbortRequest {
        sandbox_id: "nobody".into(),
        req_id: 1,
    })
    .await
    .unwrap();
    let t = Instant::now();
    let rest = collect(long).await;
    assert_eq!(rest.end, Some(-15), "{rest:?}");
    assert!(t.elapsed() < Duration::from_secs(3));
    // A harness that goes away aborts its exec on the worker.
    drop(second);
    let marker = std::env::temp_dir().join(format!("relay-term-{sb}"));
    let cmd = format!(
        "trap 'echo term > {}; exit 0' TERM; echo started; while :; do sleep 0.1; done",
        marker.display()
    );
    let mut s = run_stream(&mut h, req(&sb, 13, &cmd, true)).await;
    s.message().await.unwrap();
    drop(s);
    let t = Instant::now();
    while !marker.exists() {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "the worker never got the abort"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = std::fs::remove_file(&marker);
}

async fn run_stream(
    c: &mut SandboxExecClient<Channel>,
    r: pb::ExecRequest,
) -> tonic::Streaming<pb::ExecEvent> {
    c.exec(r).await.unwrap().into_inner()
}

#[tokio::test(flavor = "multi_thread")]
async fn heartbeat_loss_disconnect_and_replacement() {
    if !prerequisites() {
        return;
    }
    let d = start("relayhb", "worker_heartbeat_timeout_ms = 1500");
    let mut h = harness(&d).await;
    let sb = format!("ext-{}", uuid::Uuid::new_v4().simple());

    // A worker that stops heartbeating (SIGSTOP: the connection stays) is dropped, and its
    // in-flight exec ends with an ExecError.
    let a = agent(&d, &sb, &[]);
    assert_eq!(
        run(&mut h, req(&sb, 1, "echo hi", true)).await.stdout(),
        "hi\n"
    );
    let s = h
        .exec(req(&sb, 2, "sleep 30", true))
        .await
        .unwrap()
        .into_inner();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(a.0.id() as i32),
        nix::sys::signal::SIGSTOP,
    )
    .unwrap();
    let t = Instant::now();
    let r = collect(s).await;
    assert!(
        r.error.as_deref().unwrap_or("").contains("heartbeat"),
        "{r:?}"
    );
    assert!(t.elapsed() < Duration::from_secs(5));
    assert_eq!(
        h.exec(req(&sb, 3, "true", true)).await.unwrap_err().code(),
        Code::Unavailable
    );
    drop(a);

    // A worker killed outright: in-flight execs end with an ExecError at once.
    let b = agent(&d, &sb, &[]);
    assert_eq!(
        run(&mut h, req(&sb, 4, "echo b", true)).await.stdout(),
        "b\n"
    );
    let s = h
        .exec(req(&sb, 5, "sleep 30", true))
        .await
        .unwrap()
        .into_inner();
    drop(b);
    let r = collect(s).await;
    assert!(
        r.error.as_deref().unwrap_or("").contains("disconnected"),
        "{r:?}"
    );

    // A second Hello for the same sandbox replaces the first cleanly.
    let first = agent(&d, &sb, &[]);
    assert_eq!(
        run(&mut h, req(&sb, 6, "echo first", true)).await.stdout(),
        "first\n"
    );
    let s = h
        .exec(req(&sb, 7, "sleep 30", true))
        .await
        .unwrap()
        .into_inner();
    let _second = agent(&d, &sb, &["--label", "gen=2"]);
    let r = collect(s).await;
    assert!(
        r.error.as_deref().unwrap_or("").contains("replaced"),
        "{r:?}"
    );
    drop(first);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        run(&mut h, req(&sb, 8, "echo second", true)).await.stdout(),
        "second\n"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_python_worker_attaches_and_serves() {
    if !prerequisites() {
        return;
    }
    let ok = Command::new("python3")
        .args(["-c", "import grpc, grpc_tools"])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !ok {
        assert!(
            std::env::var_os("CI").is_none(),
            "python grpcio missing (scripts/install-deps installs it)"
        );
        eprintln!("SKIPPED: no python grpcio");
        return;
    }
    let d = start("relaypy", "");
    let dir = tempfile::tempdir().unwrap();
    let proto_dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("proto");
    let st = Command::new("python3")
        .args(["-m", "grpc_tools.protoc", "-I"])
        .arg(&proto_dir)
        .arg(format!("--python_out={}", dir.path().display()))
        .arg(format!("--grpc_python_out={}", dir.path().display()))
        .arg(proto_dir.join("sandbox/v1/sandbox.proto"))
        .status()
        .unwrap();
    assert!(st.success());
    let worker =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/workers/python_worker.py");
    let sb = format!("py-{}", uuid::Uuid::new_v4().simple());
    let child = Command::new("python3")
        .arg(&worker)
        .args([&d.addr, &sb])
        .env("PYTHONPATH", dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let _w = Agent(child);
    let mut h = harness(&d).await;
    let r = run(
        &mut h,
        req(&sb, 1, "echo from python; echo warn >&2; exit 4", true),
    )
    .await;
    assert_eq!(r.stdout(), "from python\n");
    assert_eq!(r.stderr(), "warn\n");
    assert_eq!(r.end, Some(4));
    let r = run(&mut h, req(&sb, 2, "printf 'a\\nb\\n'", false)).await;
    assert_eq!(r.stdout(), "a\nb\n");
    assert_eq!(r.end, Some(0));
}
