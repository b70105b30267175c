//! The sandbox.v1 relay served by the node daemon, with real workers attaching over TCP: the
//! Rust `sandbox-agent` and a Python grpcio worker (an independent client, generated from the
//! proto with grpcio-tools), with the credentials `computectl relay token` issues; impostors
//! refused; the in-sandbox agent never displaced; messages over 4 MiB, also through a router.

#[macro_use]
mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::relay::{collect, harness, req, run, worker};
use common::router::RouterProc;
use common::*;
use computed::api::sandbox::v1 as pb;
use pb::sandbox_exec_client::SandboxExecClient;
use tonic::transport::Channel;
use tonic::Code;

/// `computectl` against a daemon's unix socket.
fn computectl(d: &Daemon, args: &[&str]) -> std::process::Output {
    d.computectl_command()
        .args(args)
        .env_remove("COMPUTE_ADDR")
        .output()
        .unwrap()
}

/// Issues the credential of `sandbox` (`computectl relay token`): the token alone on stdout.
fn issue_token(d: &Daemon, sandbox: &str) -> String {
    let o = computectl(d, &["relay", "token", sandbox]);
    let t = assert_success(&o, "relay token").trim().to_string();
    assert!(t.starts_with("cwt_") && t.len() == 68, "{t:?}");
    t
}

/// A Rust worker for `sandbox`, attached with `token`.
fn agent(d: &Daemon, sandbox: &str, token: &str, extra: &[&str]) -> Killed {
    let mut args = vec!["--heartbeat", "0.3", "--grace", "1"];
    args.extend(extra);
    worker(&d.addr, sandbox, token, &args)
}

#[tokio::test(flavor = "multi_thread")]
async fn relay_semantics_with_the_rust_agent() {
    need!();
    let d = start("relay", "worker_heartbeat_timeout_ms = 1500");
    let mut h = harness(&d.addr).await;
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

    let token = issue_token(&d, &sb);
    let _a = agent(&d, &sb, &token, &["--capacity", "2"]);
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
    r.assert_is("a\nc\n", "b\n", 3);
    assert!(r.chunks.len() >= 3, "streamed as produced: {:?}", r.chunks);
    // Non-streaming: stdout comes back collected; stderr replayed, not in stdout.
    let r = run(
        &mut h,
        req(&sb, 2, "echo one; echo err >&2; echo two", false),
    )
    .await;
    r.assert_is("one\ntwo\n", "err\n", 0);
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
    need!();
    let d = start("relayhb", "worker_heartbeat_timeout_ms = 1500");
    let mut h = harness(&d.addr).await;
    let sb = format!("ext-{}", uuid::Uuid::new_v4().simple());

    // A worker that stops heartbeating (SIGSTOP: the connection stays) is dropped, and its
    // in-flight exec ends with an ExecError.
    let token = issue_token(&d, &sb);
    let a = agent(&d, &sb, &token, &[]);
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
    let b = agent(&d, &sb, &token, &[]);
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
    let first = agent(&d, &sb, &token, &[]);
    assert_eq!(
        run(&mut h, req(&sb, 6, "echo first", true)).await.stdout(),
        "first\n"
    );
    let s = h
        .exec(req(&sb, 7, "sleep 30", true))
        .await
        .unwrap()
        .into_inner();
    let _second = agent(&d, &sb, &token, &["--label", "gen=2"]);
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

/// Python stubs for sandbox.v1, generated with grpcio-tools into a temporary directory; None
/// (after printing why) when grpcio is missing outside CI.
fn python_stubs() -> Option<tempfile::TempDir> {
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
        return None;
    }
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
    Some(dir)
}

/// How a Python worker behaves.
#[derive(Default, Clone, Copy)]
struct Py<'a> {
    token: Option<&'a str>,
    /// An impostor: answers every Exec with this, running nothing.
    fake_output: Option<&'a str>,
    trust: Option<&'a str>,
}

/// Starts the Python worker for `sandbox` against `addr`.
fn python_worker(stubs: &tempfile::TempDir, addr: &str, sandbox: &str, py: Py) -> Killed {
    let worker =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/workers/python_worker.py");
    let mut c = Command::new("python3");
    c.arg(&worker)
        .args([addr, sandbox])
        .env("PYTHONPATH", stubs.path())
        .env_remove("RELAY_TOKEN")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    if let Some(t) = py.token {
        c.env("RELAY_TOKEN", t);
    }
    if let Some(f) = py.fake_output {
        c.env("WORKER_FAKE_OUTPUT", f);
    }
    if let Some(t) = py.trust {
        c.env("WORKER_TRUST", t);
    }
    Killed(c.spawn().unwrap())
}

/// Waits for a Python worker to be refused and returns the status code it saw.
fn refused_with(mut w: Killed) -> String {
    use std::io::Read;
    let t = Instant::now();
    loop {
        if let Some(st) = w.0.try_wait().unwrap() {
            let mut out = String::new();
            w.0.stdout.take().unwrap().read_to_string(&mut out).unwrap();
            assert_eq!(st.code(), Some(3), "the worker was not refused: {out}");
            return out
                .lines()
                .find_map(|l| l.strip_prefix("ATTACH_ERROR "))
                .unwrap_or_default()
                .to_string();
        }
        assert!(
            t.elapsed() < Duration::from_secs(15),
            "the relay accepted the worker (it is still attached)"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_python_worker_attaches_and_serves() {
    need!();
    let Some(stubs) = python_stubs() else { return };
    let d = start("relaypy", "");
    let sb = format!("py-{}", uuid::Uuid::new_v4().simple());
    let token = issue_token(&d, &sb);
    let _w = python_worker(
        &stubs,
        &d.addr,
        &sb,
        Py {
            token: Some(&token),
            ..Default::default()
        },
    );
    let mut h = harness(&d.addr).await;
    let r = run(
        &mut h,
        req(&sb, 1, "echo from python; echo warn >&2; exit 4", true),
    )
    .await;
    r.assert_is("from python\n", "warn\n", 4);
    let r = run(&mut h, req(&sb, 2, "printf 'a\\nb\\n'", false)).await;
    assert_eq!(r.stdout(), "a\nb\n");
    assert_eq!(r.end, Some(0));
}

/// Runs `script` through ComputeService.ExecCommand; returns stdout (asserting exit 0).
async fn exec_command(d: &Daemon, id: &str, script: &str) -> String {
    let mut c = d.client().await;
    sh(&mut c, id, script).await
}

/// Waits until the daemon's log holds `needle` at least `n` times.
async fn wait_log(d: &Daemon, needle: &str, n: usize) {
    let t = Instant::now();
    while d.log_text().matches(needle).count() < n {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "never logged {needle:?} x{n}:\n{}",
            d.log_text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn workers_json(d: &Daemon) -> Vec<serde_json::Value> {
    let o = computectl(d, &["relay", "workers", "-o", "json"]);
    assert_success(&o, "relay workers");
    serde_json::from_slice(&o.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn impostors_never_displace_a_sandboxs_agent() {
    need!();
    let Some(stubs) = python_stubs() else { return };
    let (mut d, mut c) = start_client("relayimp", "agent = true").await;
    let id = ready_sandbox(&mut c, create_req("t", "impostor")).await;
    wait_log(&d, "agent attached", 1).await;
    let real = "real-42\n";
    let script = "echo real-$((6*7))";
    assert_eq!(exec_command(&d, &id, script).await, real);
    let impostor = |token: Option<&'static str>| Py {
        token,
        fake_output: Some("IMPOSTOR\n"),
        trust: Some("trusted"),
    };

    // No credential: UNAUTHENTICATED, and the sandbox's execs still reach its agent.
    let w = python_worker(&stubs, &d.addr, &id, impostor(None));
    assert_eq!(refused_with(w), "UNAUTHENTICATED");
    assert_eq!(exec_command(&d, &id, script).await, real);

    // A made-up token: UNAUTHENTICATED.
    let bogus: &'static str = Box::leak(format!("cwt_{}", "0".repeat(64)).into_boxed_str());
    let w = python_worker(&stubs, &d.addr, &id, impostor(Some(bogus)));
    assert_eq!(refused_with(w), "UNAUTHENTICATED");

    // A valid credential for another id: PERMISSION_DENIED.
    let other = format!("ext-{}", uuid::Uuid::new_v4().simple());
    let other_token: &'static str = Box::leak(issue_token(&d, &other).into_boxed_str());
    let w = python_worker(&stubs, &d.addr, &id, impostor(Some(other_token)));
    assert_eq!(refused_with(w), "PERMISSION_DENIED");
    assert_eq!(exec_command(&d, &id, script).await, real);

    // The operator cannot issue a credential for a compute sandbox.
    let o = computectl(&d, &["relay", "token", &id]);
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("in-sandbox agent"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );

    // Even a credential for the sandbox's id planted in the store (here: renamed on disk,
    // then a restart, which also re-attaches the agent) is PERMISSION_DENIED.
    let planted = format!("ext-{}", uuid::Uuid::new_v4().simple());
    let planted_token: &'static str = Box::leak(issue_token(&d, &planted).into_boxed_str());
    let store = d.state_dir().join("relay/worker-tokens.json");
    let text = std::fs::read_to_string(&store).unwrap();
    std::fs::write(&store, text.replace(&planted, &id)).unwrap();
    d.kill9();
    d.spawn();
    wait_log(&d, "agent re-attached", 1).await;
    let w = python_worker(&stubs, &d.addr, &id, impostor(Some(planted_token)));
    assert_eq!(refused_with(w), "PERMISSION_DENIED");
    assert_eq!(exec_command(&d, &id, script).await, real);

    // SandboxExec for the sandbox reaches its agent too; the listing shows one worker for it,
    // the agent, with the trust the node gave it.
    let mut h = harness(&d.addr).await;
    assert_eq!(run(&mut h, req(&id, 1, script, false)).await.stdout(), real);
    let ws: Vec<_> = workers_json(&d)
        .into_iter()
        .filter(|w| w["sandbox_id"] == id.as_str())
        .collect();
    assert_eq!(ws.len(), 1, "{ws:?}");
    assert_eq!(ws[0]["origin"], "agent");
    assert_eq!(ws[0]["trust"], "trusted");
    // No secret in the log.
    for t in [other_token, planted_token] {
        assert!(!d.log_text().contains(t), "a token in the daemon's log");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_external_worker_needs_its_credential_which_survives_a_restart() {
    need!();
    let Some(stubs) = python_stubs() else { return };
    let mut d = start("relayext", "worker_heartbeat_timeout_ms = 1500");
    let sb = format!("ext-{}", uuid::Uuid::new_v4().simple());
    let token = issue_token(&d, &sb);
    let legit = Py {
        token: Some(&token),
        ..Default::default()
    };
    let _w = python_worker(&stubs, &d.addr, &sb, legit);
    let mut h = harness(&d.addr).await;
    assert_eq!(
        run(&mut h, req(&sb, 1, "echo legit", true)).await.stdout(),
        "legit\n"
    );
    // Its Hello.trust is recorded.
    let ws = workers_json(&d);
    let me = ws.iter().find(|w| w["sandbox_id"] == sb.as_str()).unwrap();
    assert_eq!(me["origin"], "network");
    assert_eq!(me["trust"], "untrusted");

    // Impostors for the same id: no credential, or another id's. Neither replaces it.
    let fake = |token| Py {
        token,
        fake_output: Some("IMPOSTOR\n"),
        trust: None,
    };
    let w = python_worker(&stubs, &d.addr, &sb, fake(None));
    assert_eq!(refused_with(w), "UNAUTHENTICATED");
    let other = format!("ext-{}", uuid::Uuid::new_v4().simple());
    let other_token = issue_token(&d, &other);
    let w = python_worker(&stubs, &d.addr, &sb, fake(Some(&other_token)));
    assert_eq!(refused_with(w), "PERMISSION_DENIED");
    assert_eq!(
        run(&mut h, req(&sb, 2, "echo still-legit", true))
            .await
            .stdout(),
        "still-legit\n"
    );

    // A restart keeps the credential valid (the old worker's stream ends with the daemon).
    drop(_w);
    d.kill9();
    d.spawn();
    let _w = python_worker(&stubs, &d.addr, &sb, legit);
    let mut h = harness(&d.addr).await;
    assert_eq!(
        run(&mut h, req(&sb, 3, "echo after-restart", true))
            .await
            .stdout(),
        "after-restart\n"
    );
    let w = python_worker(&stubs, &d.addr, &sb, fake(Some(&other_token)));
    assert_eq!(refused_with(w), "PERMISSION_DENIED");

    // The listing names ids, never secrets.
    let o = computectl(&d, &["relay", "tokens"]);
    let listing = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        listing.contains(&sb) && listing.contains(&other),
        "{listing}"
    );
    assert!(!listing.contains(&token) && !listing.contains(&other_token));
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(d.state_dir().join("relay/worker-tokens.json"))
            .unwrap()
            .permissions(),
    );
    assert_eq!(mode & 0o777, 0o600);

    // Revoke: the live worker is disconnected and the token no longer attaches.
    let o = computectl(&d, &["relay", "revoke", &sb]);
    assert_success(&o, "relay revoke");
    assert!(String::from_utf8_lossy(&o.stderr).contains("disconnected"));
    assert_eq!(
        h.exec(req(&sb, 4, "true", true)).await.unwrap_err().code(),
        Code::Unavailable
    );
    let w = python_worker(&stubs, &d.addr, &sb, legit);
    assert_eq!(refused_with(w), "UNAUTHENTICATED");
    for t in [&token, &other_token] {
        assert!(
            !d.log_text().contains(t.as_str()),
            "a token in the daemon's log"
        );
    }
}

async fn big_harness(addr: &str) -> SandboxExecClient<Channel> {
    SandboxExecClient::new(channel(addr).await)
        .max_decoding_message_size(32 << 20)
        .max_encoding_message_size(32 << 20)
}

#[tokio::test(flavor = "multi_thread")]
async fn big_messages_and_credentials_pass_through_the_router() {
    need!();
    let Some(stubs) = python_stubs() else { return };
    let d = start("relaybig", "");
    let dir = tempfile::tempdir().unwrap();
    let router = RouterProc::start_env(&d.addr, dir.path(), "relay", &[], &[("RUST_LOG", "debug")]);
    let sb = format!("ext-{}", uuid::Uuid::new_v4().simple());
    let token = issue_token(&d, &sb);

    // Through the router: without a credential the node refuses; with it (the metadata
    // forwarded) the worker attaches.
    let t = Instant::now();
    loop {
        let w = python_worker(&stubs, &router.addr, &sb, Py::default());
        let code = refused_with(w);
        if code == "UNAUTHENTICATED" {
            break;
        }
        // The router may not have seen the node ready yet.
        assert!(
            code == "UNAVAILABLE" && t.elapsed() < Duration::from_secs(10),
            "{code}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let _w = python_worker(
        &stubs,
        &router.addr,
        &sb,
        Py {
            token: Some(&token),
            ..Default::default()
        },
    );

    // 5 MiB of stdin to the worker and 5 MiB of collected stdout back (one message each way,
    // over tonic's 4 MiB default), through the router and straight at the node.
    let big: Vec<u8> = (0..5u32 << 20).map(|i| b'a' + (i % 26) as u8).collect();
    for (i, addr) in [&router.addr, &d.addr].into_iter().enumerate() {
        let mut h = big_harness(addr).await;
        let mut r = req(&sb, 10 + i as u64, "cat", false);
        r.exec.as_mut().unwrap().stdin = big.clone();
        let out = run(&mut h, r).await;
        assert_eq!(out.end, Some(0), "via {addr}: {:?}", out.error);
        let stdout: Vec<u8> = out.chunks.into_iter().flat_map(|(_, d)| d).collect();
        assert!(stdout == big, "via {addr}: {} bytes back", stdout.len());
    }
    let router_log = std::fs::read_to_string(&router.log).unwrap();
    assert!(
        !router_log.contains(&token),
        "the token in the router's log"
    );
    assert!(
        !d.log_text().contains(&token),
        "the token in the node's log"
    );
}
