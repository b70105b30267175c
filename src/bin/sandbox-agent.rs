//! `sandbox-agent`: a sandbox.v1 worker. It attaches to a relay (`--relay ADDR`, TCP
//! `host:port` or `unix:/path`), says Hello, heartbeats, and runs the commands the relay sends:
//! each through `/bin/sh -c` in its own process group, with stdin, separate stdout and stderr,
//! a timeout, and Abort (SIGTERM to the whole group, SIGKILL after the grace period).

use std::collections::HashMap;
use std::process::{ExitCode, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::Parser;
use computed::api::sandbox::v1 as pb;
use pb::sandbox_worker_client::SandboxWorkerClient;
use pb::server_frame::Msg as ServerMsg;
use pb::worker_frame::Msg as WorkerMsg;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tonic::transport::{Channel, Endpoint};

#[derive(Parser, Debug)]
#[command(name = "sandbox-agent", version, about = "A sandbox.v1 worker")]
struct Args {
    /// The relay to attach to: `host:port`, `http://host:port` or `unix:/path`.
    #[arg(long)]
    relay: String,
    /// The sandbox id this worker serves.
    #[arg(long, env = "SANDBOX_ID")]
    sandbox_id: String,
    /// Most concurrent execs (0 = unlimited).
    #[arg(long, default_value_t = 4)]
    capacity: u32,
    /// Labels (`key=value`), repeatable.
    #[arg(long = "label")]
    labels: Vec<String>,
    /// Capabilities, repeatable.
    #[arg(long = "capability")]
    capabilities: Vec<String>,
    /// Image tag or digest to report.
    #[arg(long, default_value = "")]
    image: String,
    /// Trust level to report.
    #[arg(long, default_value = "untrusted")]
    trust: String,
    /// Seconds between heartbeats.
    #[arg(long, default_value_t = 2.0)]
    heartbeat: f64,
    /// Seconds between SIGTERM and SIGKILL on abort or timeout.
    #[arg(long, default_value_t = 5.0)]
    grace: f64,
}

type Out = mpsc::Sender<pb::WorkerFrame>;

fn frame(msg: WorkerMsg) -> pb::WorkerFrame {
    pb::WorkerFrame { msg: Some(msg) }
}

async fn channel(relay: &str) -> anyhow::Result<Channel> {
    if let Some(path) = relay.strip_prefix("unix:") {
        let path = path.to_string();
        return Ok(Endpoint::try_from("http://[::]")?
            .connect_with_connector(tower::service_fn(move |_| {
                let p = path.clone();
                async move {
                    Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                        tokio::net::UnixStream::connect(p).await?,
                    ))
                }
            }))
            .await?);
    }
    let url = if relay.contains("://") {
        relay.to_string()
    } else {
        format!("http://{relay}")
    };
    Ok(Endpoint::from_shared(url)?.connect().await?)
}

/// Kills a process group: SIGTERM, then SIGKILL after `grace` unless it is gone.
async fn stop_group(pgid: i32, grace: Duration) {
    use nix::sys::signal::{killpg, Signal};
    use nix::unistd::Pid;
    let pg = Pid::from_raw(pgid);
    if killpg(pg, Signal::SIGTERM).is_err() {
        return;
    }
    let deadline = tokio::time::Instant::now() + grace;
    while tokio::time::Instant::now() < deadline {
        if killpg(pg, None).is_err() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = killpg(pg, Signal::SIGKILL);
}

async fn pump(
    mut r: impl tokio::io::AsyncRead + Unpin,
    req_id: u64,
    stream: pb::Stream,
    out: Out,
    collect: Option<Arc<Mutex<Vec<u8>>>>,
) {
    let mut buf = vec![0u8; 32 * 1024];
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => match &collect {
                Some(c) => c
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .extend_from_slice(&buf[..n]),
                None => {
                    let _ = out
                        .send(frame(WorkerMsg::Chunk(pb::Chunk {
                            req_id,
                            data: buf[..n].to_vec(),
                            stream: stream as i32,
                        })))
                        .await;
                }
            },
        }
    }
}

async fn run_exec(e: pb::Exec, out: Out, running: Arc<Mutex<HashMap<u64, i32>>>, grace: Duration) {
    let req_id = e.req_id;
    let mut cmd = tokio::process::Command::new("/bin/sh");
    cmd.arg("-c")
        .arg(&e.command)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(err) => {
            let _ = out
                .send(frame(WorkerMsg::Error(pb::ExecError {
                    req_id,
                    message: format!("spawn: {err}"),
                })))
                .await;
            return;
        }
    };
    let pgid = child.id().map(|p| p as i32).unwrap_or(0);
    running
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(req_id, pgid);
    if let Some(mut stdin) = child.stdin.take() {
        let data = e.stdin.clone();
        tokio::spawn(async move {
            let _ = stdin.write_all(&data).await;
        });
    }
    let collected = (!e.streaming).then(|| Arc::new(Mutex::new(Vec::new())));
    let p_out = child.stdout.take().map(|r| {
        tokio::spawn(pump(
            r,
            req_id,
            pb::Stream::Stdout,
            out.clone(),
            collected.clone(),
        ))
    });
    let p_err = child
        .stderr
        .take()
        .map(|r| tokio::spawn(pump(r, req_id, pb::Stream::Stderr, out.clone(), None)));
    let timeout = if e.timeout_s == 0 {
        Duration::from_secs(600)
    } else {
        Duration::from_secs(u64::from(e.timeout_s))
    };
    let status = match tokio::time::timeout(timeout, child.wait()).await {
        Ok(s) => s.ok(),
        Err(_) => {
            stop_group(pgid, grace).await;
            child.wait().await.ok()
        }
    };
    for p in [p_out, p_err].into_iter().flatten() {
        let _ = tokio::time::timeout(Duration::from_millis(500), p).await;
    }
    running
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&req_id);
    if let Some(c) = collected {
        let data = std::mem::take(&mut *c.lock().unwrap_or_else(|p| p.into_inner()));
        if !data.is_empty() {
            let _ = out
                .send(frame(WorkerMsg::Chunk(pb::Chunk {
                    req_id,
                    data,
                    stream: pb::Stream::Stdout as i32,
                })))
                .await;
        }
    }
    use std::os::unix::process::ExitStatusExt;
    let code = match status {
        Some(s) => s.code().unwrap_or_else(|| -s.signal().unwrap_or(1)),
        None => -1,
    };
    let _ = out
        .send(frame(WorkerMsg::End(pb::End {
            req_id,
            exit_code: code,
        })))
        .await;
}

async fn serve(args: Args) -> anyhow::Result<()> {
    let ch = channel(&args.relay).await?;
    let mut client = SandboxWorkerClient::new(ch);
    let (tx, rx) = mpsc::channel::<pb::WorkerFrame>(256);
    let labels = args
        .labels
        .iter()
        .filter_map(|l| {
            l.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
        })
        .collect();
    tx.send(frame(WorkerMsg::Hello(pb::Hello {
        sandbox_id: args.sandbox_id.clone(),
        labels,
        capabilities: args.capabilities.clone(),
        image: args.image.clone(),
        arch: match std::env::consts::ARCH {
            "x86_64" => "amd64".into(),
            "aarch64" => "arm64".into(),
            a => a.into(),
        },
        capacity_max: args.capacity,
        trust: args.trust.clone(),
    })))
    .await?;
    let hb = tx.clone();
    let every = Duration::from_secs_f64(args.heartbeat.max(0.05));
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(every).await;
            if hb
                .send(frame(WorkerMsg::Heartbeat(pb::Heartbeat {})))
                .await
                .is_err()
            {
                return;
            }
        }
    });
    let mut inbound = client
        .attach(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await?
        .into_inner();
    let running: Arc<Mutex<HashMap<u64, i32>>> = Arc::default();
    let grace = Duration::from_secs_f64(args.grace.max(0.0));
    while let Some(f) = inbound.message().await? {
        match f.msg {
            Some(ServerMsg::Exec(e)) => {
                tokio::spawn(run_exec(e, tx.clone(), running.clone(), grace));
            }
            Some(ServerMsg::Abort(a)) => {
                let pg = running
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get(&a.req_id)
                    .copied();
                if let Some(pg) = pg {
                    tokio::spawn(stop_group(pg, grace));
                }
            }
            None => {}
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let args = Args::parse();
    let rt = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("sandbox-agent: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(serve(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sandbox-agent: {e:#}");
            ExitCode::FAILURE
        }
    }
}
