//! Interactive exec on ours (issue 18), platform.v1 ExecInSandbox as root on the socket:
//!
//! * echo round trip: one byte on stdin to `cat` on a terminal in raw mode and the same byte
//!   back on stdout, one at a time; baseline: the same byte through a host `cat` over pipes
//!   (what no sandbox, no daemon and no terminal cost);
//! * stdin throughput: bytes into `cat > /dev/null` in the sandbox until its exit; baseline:
//!   the same bytes into a host `cat > /dev/null` through a pipe, in turns.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use computed::api::platform::v1 as ppb;
use ppb::exec_client_message::Msg as In;
use ppb::exec_server_message::Msg as Out;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tonic::transport::Channel;

use crate::ours::Ours;
use crate::target::IMAGE;

/// What the interactive scenarios measured.
#[derive(Debug, Default)]
pub struct Measured {
    /// Ours: byte → echo, ms.
    pub echo_ms: Vec<f64>,
    /// Baseline: byte → echo through a host `cat`, ms.
    pub host_echo_ms: Vec<f64>,
    /// Ours: stdin MB/s.
    pub stdin_mbps: Vec<f64>,
    /// Baseline: host pipe MB/s.
    pub host_stdin_mbps: Vec<f64>,
    /// For reference: a pipe inside the sandbox (`head -c N /dev/zero | cat > /dev/null`),
    /// MB/s: what gVisor itself moves between two processes.
    pub sandbox_pipe_mbps: Vec<f64>,
}

const NS: &str = "bench-exec";

fn msg(m: In) -> ppb::ExecClientMessage {
    ppb::ExecClientMessage { msg: Some(m) }
}

/// An exec-only RUNNING sandbox in namespace `bench-exec`.
async fn sandbox(root: &Channel) -> Result<String> {
    crate::platform::environment(
        root,
        ppb::Environment {
            namespace: NS.into(),
            name: "py".into(),
            image: IMAGE.into(),
            ..Default::default()
        },
    )
    .await;
    let mut s = ppb::sandbox_service_client::SandboxServiceClient::new(root.clone());
    let id = s
        .create_sandbox(ppb::CreateSandboxRequest {
            namespace: NS.into(),
            environment: "py".into(),
            exec_only: true,
            ..Default::default()
        })
        .await?
        .into_inner()
        .sandbox_id;
    let t0 = Instant::now();
    loop {
        let sb = s
            .get_sandbox(ppb::GetSandboxRequest {
                sandbox_id: id.clone(),
            })
            .await?
            .into_inner();
        if sb.state == ppb::SandboxState::Running as i32 {
            return Ok(id);
        }
        if t0.elapsed() > Duration::from_secs(60) {
            bail!("sandbox {id} not RUNNING in 60 s: {sb:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Opens an exec; returns its input and output.
async fn open(
    ch: &Channel,
    spec: ppb::ExecSpec,
) -> Result<(
    mpsc::Sender<ppb::ExecClientMessage>,
    tonic::Streaming<ppb::ExecServerMessage>,
)> {
    let (tx, rx) = mpsc::channel(8);
    tx.send(msg(In::Spec(spec))).await?;
    let out = ppb::sandbox_service_client::SandboxServiceClient::new(ch.clone())
        .exec_in_sandbox(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await?
        .into_inner();
    Ok((tx, out))
}

/// Reads stdout until it holds `want` (after what was read already).
async fn until(
    out: &mut tonic::Streaming<ppb::ExecServerMessage>,
    seen: &mut Vec<u8>,
    want: &[u8],
) -> Result<()> {
    while !seen.windows(want.len()).any(|w| w == want) {
        match tokio::time::timeout(Duration::from_secs(10), out.message()).await {
            Ok(Ok(Some(ppb::ExecServerMessage {
                msg: Some(Out::Stdout(d)),
            }))) => seen.extend(d),
            Ok(Ok(Some(m))) => bail!("{m:?} while waiting for {want:?}"),
            Ok(Ok(None)) => bail!("the exec ended while waiting for {want:?}"),
            Ok(Err(s)) => bail!("{s}"),
            Err(_) => bail!("no {want:?} in 10 s"),
        }
    }
    Ok(())
}

/// Reads to the exit, which must be 0.
async fn exited_ok(out: &mut tonic::Streaming<ppb::ExecServerMessage>, what: &str) -> Result<()> {
    loop {
        match out.message().await? {
            Some(ppb::ExecServerMessage {
                msg: Some(Out::Exit(e)),
            }) if e.code == 0 => return Ok(()),
            Some(ppb::ExecServerMessage {
                msg: Some(Out::Exit(e)),
            }) => bail!("{what}: {e:?}"),
            Some(_) => {}
            None => bail!("{what}: no exit"),
        }
    }
}

/// `n` echo round trips through `cat` on a raw terminal in the sandbox.
async fn echo(ch: &Channel, id: &str, n: usize) -> Result<Vec<f64>> {
    let spec = ppb::ExecSpec {
        sandbox_id: id.into(),
        argv: ["sh", "-c", "stty raw -echo; echo ready; exec cat"]
            .map(String::from)
            .into(),
        tty: true,
        ..Default::default()
    };
    let (tx, mut out) = open(ch, spec).await?;
    let mut seen = Vec::new();
    until(&mut out, &mut seen, b"ready").await?;
    seen.clear();
    let mut ms = Vec::with_capacity(n);
    for i in 0..n {
        // Bytes that nothing on the way translates (raw mode: no ^C, no CR/NL mapping).
        let b = b'a' + (i % 26) as u8;
        let t0 = Instant::now();
        tx.send(msg(In::Stdin(vec![b]))).await?;
        until(&mut out, &mut seen, &[b]).await?;
        ms.push(t0.elapsed().as_secs_f64() * 1000.0);
        seen.clear();
    }
    Ok(ms)
}

/// The same round trips through a host `cat` over pipes.
async fn host_echo(n: usize) -> Result<Vec<f64>> {
    let mut c = tokio::process::Command::new("cat")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("host cat")?;
    let mut w = c.stdin.take().context("stdin")?;
    let mut r = c.stdout.take().context("stdout")?;
    let mut ms = Vec::with_capacity(n);
    let mut b = [0u8; 1];
    for i in 0..n {
        let t0 = Instant::now();
        w.write_all(&[b'a' + (i % 26) as u8]).await?;
        r.read_exact(&mut b).await?;
        ms.push(t0.elapsed().as_secs_f64() * 1000.0);
    }
    Ok(ms)
}

const CHUNK: usize = 1 << 20;

/// `bytes` of stdin into `cat > /dev/null` in the sandbox: MB/s until its exit.
async fn stdin_throughput(ch: &Channel, id: &str, bytes: usize) -> Result<f64> {
    let spec = ppb::ExecSpec {
        sandbox_id: id.into(),
        argv: ["sh", "-c", "cat > /dev/null; echo done"]
            .map(String::from)
            .into(),
        ..Default::default()
    };
    let t0 = Instant::now();
    let (tx, mut out) = open(ch, spec).await?;
    let feed = tokio::spawn(async move {
        let chunk = vec![0x5au8; CHUNK];
        for _ in 0..bytes / CHUNK {
            tx.send(msg(In::Stdin(chunk.clone()))).await?;
        }
        tx.send(msg(In::StdinClose(true))).await?;
        anyhow::Ok(())
    });
    let mut seen = Vec::new();
    until(&mut out, &mut seen, b"done").await?;
    feed.await??;
    exited_ok(&mut out, "cat").await?;
    Ok(bytes as f64 / 1e6 / t0.elapsed().as_secs_f64())
}

/// `bytes` through a pipe between two processes inside the sandbox: MB/s until the exit.
async fn sandbox_pipe(ch: &Channel, id: &str, bytes: usize) -> Result<f64> {
    let spec = ppb::ExecSpec {
        sandbox_id: id.into(),
        argv: vec![
            "sh".into(),
            "-c".into(),
            format!("head -c {bytes} /dev/zero | cat > /dev/null"),
        ],
        ..Default::default()
    };
    let t0 = Instant::now();
    let (tx, mut out) = open(ch, spec).await?;
    drop(tx);
    exited_ok(&mut out, "pipe").await?;
    Ok(bytes as f64 / 1e6 / t0.elapsed().as_secs_f64())
}

/// The same bytes into a host `cat > /dev/null` through a pipe.
async fn host_stdin_throughput(bytes: usize) -> Result<f64> {
    let t0 = Instant::now();
    let mut c = tokio::process::Command::new("cat")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .context("host cat")?;
    let mut w = c.stdin.take().context("stdin")?;
    let chunk = vec![0x5au8; CHUNK];
    for _ in 0..bytes / CHUNK {
        w.write_all(&chunk).await?;
    }
    drop(w);
    if !c.wait().await?.success() {
        bail!("host cat failed");
    }
    Ok(bytes as f64 / 1e6 / t0.elapsed().as_secs_f64())
}

/// `echoes` round trips on each side (in turns of 50) and `rounds` stdin transfers of `bytes`
/// on each side, in turns.
pub async fn run(o: &Ours, echoes: usize, bytes: usize, rounds: usize) -> Result<Measured> {
    let ch = computed::client::unix_channel(&o.socket()).await?;
    let id = sandbox(&ch).await?;
    let mut m = Measured::default();
    // A warm-up of each.
    echo(&ch, &id, 10).await?;
    host_echo(10).await?;
    let turn = 50;
    for _ in 0..echoes.div_ceil(turn) {
        m.echo_ms.extend(echo(&ch, &id, turn).await?);
        m.host_echo_ms.extend(host_echo(turn).await?);
    }
    for i in 0..rounds {
        if i % 2 == 0 {
            m.stdin_mbps.push(stdin_throughput(&ch, &id, bytes).await?);
            m.host_stdin_mbps.push(host_stdin_throughput(bytes).await?);
        } else {
            m.host_stdin_mbps.push(host_stdin_throughput(bytes).await?);
            m.stdin_mbps.push(stdin_throughput(&ch, &id, bytes).await?);
        }
        m.sandbox_pipe_mbps
            .push(sandbox_pipe(&ch, &id, bytes).await?);
    }
    let _ = ppb::sandbox_service_client::SandboxServiceClient::new(ch)
        .delete_sandbox(ppb::DeleteSandboxRequest { sandbox_id: id })
        .await;
    Ok(m)
}
