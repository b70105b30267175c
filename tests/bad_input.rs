//! Bad input over the wire: oversized messages, huge args and env, invalid UTF-8 in string
//! fields, and a client that opens many exec streams and vanishes.
//!
//! The vanishing client opens `HOSTILE_EXEC_STREAMS` streams (default 200 in CI; the long run
//! uses 1000) against `max_execs_per_sandbox = HOSTILE_EXEC_CAP` (CI 16; long run 64, the
//! default): `HOSTILE_EXEC_STREAMS=1000 HOSTILE_EXEC_CAP=64 cargo test --test bad_input`.

#[macro_use]
mod common;

use std::time::{Duration, Instant};

use common::*;
use computed::api::compute::v1 as pb;
use tonic::transport::Channel;
use tonic::Code;

/// ExecCommandRequest with byte fields where the real one has strings.
#[derive(Clone, PartialEq, prost::Message)]
struct RawExecRequest {
    #[prost(string, tag = "1")]
    sandbox_id: String,
    #[prost(bytes = "vec", tag = "2")]
    command: Vec<u8>,
    #[prost(bytes = "vec", repeated, tag = "3")]
    args: Vec<Vec<u8>>,
    #[prost(map = "string, bytes", tag = "4")]
    env: std::collections::HashMap<String, Vec<u8>>,
}

/// CreateSandboxRequest's first two fields as bytes.
#[derive(Clone, PartialEq, prost::Message)]
struct RawCreateRequest {
    #[prost(bytes = "vec", tag = "1")]
    tenant_id: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    session_id: Vec<u8>,
}

async fn grpc(addr: &str) -> tonic::client::Grpc<Channel> {
    let mut g = tonic::client::Grpc::new(channel(addr).await);
    g.ready().await.unwrap();
    g
}

async fn raw_exec(addr: &str, req: RawExecRequest) -> tonic::Status {
    let mut g = grpc(addr).await;
    let codec = tonic_prost::ProstCodec::<RawExecRequest, pb::ExecEvent>::default();
    let r = g
        .server_streaming(
            tonic::Request::new(req),
            http::uri::PathAndQuery::from_static("/compute.v1.ComputeService/ExecCommand"),
            codec,
        )
        .await;
    match r {
        Err(s) => s,
        Ok(mut stream) => match stream.get_mut().message().await {
            Err(s) => s,
            Ok(m) => panic!("invalid UTF-8 was accepted: {m:?}"),
        },
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn oversized_and_malformed_messages() {
    need!();
    let (d, mut c, id) = start_sandbox("badinput", "").await;

    // Over the server's 17 MiB message cap: RESOURCE_EXHAUSTED, as gRPC specifies.
    assert_code(
        try_write_file(&mut c, &id, "big", vec![7; 18 << 20]).await,
        Code::ResourceExhausted,
        "an 18 MiB message",
    );
    // Under the message cap but over the per-call data cap: INVALID_ARGUMENT (the spec's cap).
    assert_code(
        try_write_file(&mut c, &id, "big", vec![7; (16 << 20) + 1]).await,
        Code::InvalidArgument,
        "16 MiB + 1 of data",
    );

    // Invalid UTF-8 in string fields: INVALID_ARGUMENT.
    for req in [
        RawExecRequest {
            sandbox_id: id.clone(),
            command: b"ec\xffho".to_vec(),
            ..Default::default()
        },
        RawExecRequest {
            sandbox_id: id.clone(),
            command: b"echo".to_vec(),
            args: vec![b"ok".to_vec(), b"\xc3\x28".to_vec()],
            ..Default::default()
        },
        RawExecRequest {
            sandbox_id: id.clone(),
            command: b"echo".to_vec(),
            env: [("A".to_string(), b"\xed\xa0\x80".to_vec())].into(),
            ..Default::default()
        },
    ] {
        let s = raw_exec(&d.addr, req).await;
        assert_eq!(s.code(), Code::InvalidArgument, "{s:?}");
    }
    let mut g = grpc(&d.addr).await;
    let s = g
        .unary(
            tonic::Request::new(RawCreateRequest {
                tenant_id: b"t\xff".to_vec(),
                session_id: b"s".to_vec(),
            }),
            http::uri::PathAndQuery::from_static("/compute.v1.ComputeService/CreateSandbox"),
            tonic_prost::ProstCodec::<RawCreateRequest, pb::CreateSandboxResponse>::default(),
        )
        .await
        .expect_err("invalid UTF-8 tenant is refused");
    assert_eq!(s.code(), Code::InvalidArgument, "{s:?}");

    // NUL inside strings: INVALID_ARGUMENT before anything runs.
    let s = exec(&mut c, exec_req(&id, "echo", &["a\0b"]))
        .await
        .unwrap_err();
    assert_eq!(s.code(), Code::InvalidArgument);

    // Huge args and env (valid messages): over 1 MiB in total is INVALID_ARGUMENT; under it,
    // the exec runs (or fails as the kernel's execve would, reported on the stream).
    let big_args: Vec<String> = (0..64)
        .map(|i| format!("{i}:{}", "a".repeat(64 << 10)))
        .collect();
    let mut many_args = exec_req(&id, "sh", &["-c", "echo $#", "argv0"]);
    many_args.args.extend(big_args);
    let mut big_env = exec_req(&id, "sh", &["-c", "echo ${#BIG}"]);
    big_env.env.insert("BIG".into(), "b".repeat(8 << 20));
    let mut many_env = exec_req(&id, "sh", &["-c", "env | wc -l"]);
    for i in 0..20_000 {
        many_env.env.insert(format!("V{i}"), "v".repeat(100));
    }
    for (what, req) in [
        ("4 MiB of args", many_args),
        ("8 MiB of env", big_env),
        ("20000 env vars", many_env),
    ] {
        assert_code(exec(&mut c, req).await, Code::InvalidArgument, what);
    }
    let mut req = exec_req(&id, "sh", &["-c", "echo $# ${#A}", "argv0"]);
    req.args
        .extend((0..8).map(|i| format!("{i}:{}", "a".repeat(64 << 10))));
    req.env.insert("A".into(), "x".repeat(100_000));
    let o = exec(&mut c, req).await.unwrap();
    assert_eq!((o.code(), o.out()), (0, "8 100000\n".to_string()), "{o:?}");
    // Nothing above hurt the sandbox or the daemon.
    assert_eq!(sh(&mut c, &id, "echo fine").await, "fine\n");
    assert_eq!(status_of(&mut c, &id).await, SandboxStatus::Ready);
}

/// The daemon's resident memory in KiB.
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// Exec FIFOs left under the daemon's run dir for a sandbox.
fn fifos(d: &Daemon, id: &str) -> Vec<String> {
    let dir = d.dir.path().join("run/io").join(id);
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

fn runsc_execs(id: &str) -> usize {
    processes_mentioning(id)
        .iter()
        .filter(|c| c.contains(" exec "))
        .count()
}

#[tokio::test(flavor = "multi_thread")]
async fn many_exec_streams_from_a_vanishing_client_leak_nothing() {
    need!();
    let n: usize = std::env::var("HOSTILE_EXEC_STREAMS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    // CI uses a small per-sandbox cap (cleaning up cancelled execs costs two `runsc exec`
    // each); the long run uses the default of 64.
    let cap: usize = std::env::var("HOSTILE_EXEC_CAP")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(16);
    let (d, mut c, id) = start_sandbox(
        "vanish",
        &format!("cancel_grace_secs = 1\nmax_execs_per_sandbox = {cap}"),
    )
    .await;
    // Warm up, then take the baseline.
    for _ in 0..3 {
        sh(&mut c, &id, "true").await;
    }
    let base = rss_kib(d.pid());

    // A separate connection: its client opens n streams, then vanishes.
    let t0 = Instant::now();
    let client = pb::compute_service_client::ComputeServiceClient::new(channel(&d.addr).await);
    let calls = (0..n).map(|_| {
        let mut cl = client.clone();
        let req = exec_req(&id, "sh", &["-c", "touch /workspace/run.$$; exec sleep 30"]);
        async move {
            match cl.exec_command(req).await {
                Ok(s) => Ok(s.into_inner()),
                Err(s) => Err(s.code()),
            }
        }
    });
    let results = futures::future::join_all(calls).await;
    let mut streams = Vec::new();
    let mut refused = 0;
    for r in results {
        match r {
            Ok(s) => streams.push(s),
            Err(Code::ResourceExhausted) => refused += 1,
            Err(other) => panic!("stream refused with {other:?}"),
        }
    }
    eprintln!(
        "{n} streams: {} opened, {refused} RESOURCE_EXHAUSTED, in {:?}",
        streams.len(),
        t0.elapsed()
    );
    assert!(
        streams.len() <= cap,
        "at most {cap} concurrent execs per sandbox"
    );
    assert_eq!(streams.len() + refused, n);
    assert_eq!(streams.len(), n.min(cap));
    // One more exec is refused while the slots are full.
    assert_code(
        exec(&mut c, exec_req(&id, "true", &[])).await,
        Code::ResourceExhausted,
        "one exec over the cap",
    );
    // Wait until the admitted execs run (each leaves a marker in the workspace), then vanish.
    let data = d.state_dir().join("workspaces").join(&id).join("data");
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let running = std::fs::read_dir(&data)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("run."))
            .count();
        if running >= n.min(cap) {
            break;
        }
        assert!(Instant::now() < deadline, "only {running} execs started");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let peak = rss_kib(d.pid());
    drop(streams);
    drop(client);
    let t1 = Instant::now();

    // Everything goes: processes inside, runsc exec processes on the host, FIFOs, memory.
    let deadline = Instant::now() + Duration::from_secs(240);
    loop {
        // While slots are still held, the count itself may be refused: try again.
        let inside = match exec(
            &mut c,
            exec_req(
                &id,
                "sh",
                &["-c", "ps -e -o args | grep -c '[s]leep 30' || true"],
            ),
        )
        .await
        {
            Ok(o) => o.out().trim().parse().unwrap_or(usize::MAX),
            Err(s) if s.code() == Code::ResourceExhausted => usize::MAX,
            Err(s) => panic!("{s:?}"),
        };
        let host = runsc_execs(&id);
        let left = fifos(&d, &id);
        let rss = rss_kib(d.pid());
        if inside == 0 && host == 0 && left.is_empty() && rss < base + 32 * 1024 {
            eprintln!(
                "cleaned up in {:?}: daemon RSS {base} KiB before, {peak} KiB at the peak, {rss} KiB after",
                t1.elapsed()
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "leaks: {inside} sleeps inside, {host} runsc execs, FIFO dirs {left:?}, RSS {rss} KiB (baseline {base})"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    // And the sandbox takes execs again, up to the cap.
    assert_eq!(sh(&mut c, &id, "echo again").await, "again\n");
    let log = d.log_text();
    assert!(log.contains("exec cancelled by client"));
}
