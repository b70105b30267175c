//! The sandbox.v1 relay for tests: a worker process (the Rust `sandbox-agent` in relay mode)
//! and the harness's side (SandboxExec requests, their events collected).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use computed::api::sandbox::v1 as pb;
use pb::sandbox_exec_client::SandboxExecClient;
use tonic::transport::Channel;
use tonic::Code;

use super::Killed;

/// A Rust worker (`sandbox-agent --relay ADDR --sandbox-id SANDBOX ARGS`) attached with
/// `token`; killed when dropped.
pub fn worker(relay: &str, sandbox: &str, token: &str, args: &[&str]) -> Killed {
    let child = Command::new(super::agent_binary())
        .env("RELAY_TOKEN", token)
        .args(["--relay", relay, "--sandbox-id", sandbox])
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    Killed(child)
}

/// A SandboxExec client over `ch`.
pub fn harness_on(ch: Channel) -> SandboxExecClient<Channel> {
    SandboxExecClient::new(ch)
}

/// A SandboxExec client to `addr`, plaintext.
pub async fn harness(addr: &str) -> SandboxExecClient<Channel> {
    harness_on(super::channel(addr).await)
}

/// An ExecRequest of `command` with a 30 s timeout.
pub fn req(sandbox: &str, req_id: u64, command: &str, streaming: bool) -> pb::ExecRequest {
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

/// What an exec sent back.
#[derive(Debug, Default)]
pub struct Run {
    /// (stream, data) of every chunk, in order.
    pub chunks: Vec<(i32, Vec<u8>)>,
    /// The exit code of the End event.
    pub end: Option<i32>,
    /// The message of an ExecError event.
    pub error: Option<String>,
}

impl Run {
    /// Every chunk not on stderr, as text.
    pub fn stdout(&self) -> String {
        self.text(|s| s != pb::Stream::Stderr as i32)
    }

    /// The stderr chunks, as text.
    pub fn stderr(&self) -> String {
        self.text(|s| s == pb::Stream::Stderr as i32)
    }

    /// Asserts what came back: stdout, stderr and the exit code.
    pub fn assert_is(&self, stdout: &str, stderr: &str, end: i32) {
        assert_eq!(self.stdout(), stdout, "stdout of {self:?}");
        assert_eq!(self.stderr(), stderr, "stderr of {self:?}");
        assert_eq!(self.end, Some(end), "exit code of {self:?}");
    }

    /// Every chunk, whatever its stream, as text.
    pub fn output(&self) -> String {
        self.text(|_| true)
    }

    fn text(&self, keep: impl Fn(i32) -> bool) -> String {
        self.chunks
            .iter()
            .filter(|(s, _)| keep(*s))
            .map(|(_, d)| String::from_utf8_lossy(d).into_owned())
            .collect()
    }
}

/// Collects a stream to its end.
pub async fn collect(mut s: tonic::Streaming<pb::ExecEvent>) -> Run {
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

/// Runs an exec, retrying UNAVAILABLE for 10 s while the worker is still attaching (or a router
/// has not found it yet).
pub async fn run(c: &mut SandboxExecClient<Channel>, r: pb::ExecRequest) -> Run {
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
