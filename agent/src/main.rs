//! `sandbox-agent`: a sandbox.v1 worker. It attaches to a relay (`--relay ADDR`, TCP
//! `host:port` or `unix:/path`) or speaks the worker protocol over its own stdin/stdout
//! (`--stdio`, framed, see `computed::relay::frame`), says Hello, heartbeats, and runs the
//! commands it is sent: each through `/bin/sh -c` (or the node's static busybox when the image
//! has no shell) in its own process group, or without a shell when the command is the node
//! daemon's quoted form (see `sandbox_agent::command`), with stdin, separate stdout and stderr, a timeout,
//! and Abort (SIGTERM to the whole group, SIGKILL after the grace period, or at once on a
//! second Abort). With `--init` it is the sandbox's PID 1: it runs the worker as its child and
//! reaps every orphan.

use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::Parser;
use pb::sandbox_worker_client::SandboxWorkerClient;
use pb::server_frame::Msg as ServerMsg;
use pb::worker_frame::Msg as WorkerMsg;
use sandbox_agent::flow::{self, Gate};
use sandbox_agent::spawn::{self, SpawnError};
use sandbox_agent::{command, frame, pb};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tonic::transport::{Channel, Endpoint};

#[derive(Parser, Debug)]
#[command(name = "sandbox-agent", version, about = "A sandbox.v1 worker")]
struct Args {
    /// The relay to attach to: `host:port`, `http://host:port` or `unix:/path`.
    #[arg(long, required_unless_present = "stdio")]
    relay: Option<String>,
    /// Speak the worker protocol over stdin/stdout instead.
    #[arg(long)]
    stdio: bool,
    /// Run as PID 1: start the worker as a child and reap orphans.
    #[arg(long)]
    init: bool,
    /// With `--relay`: the credential the operator issued for this sandbox id
    /// (`computectl relay token ID`), sent as `authorization: Bearer <token>`. Prefer the
    /// environment: arguments are visible to every user in /proc.
    #[arg(long, env = "RELAY_TOKEN", hide_env_values = true)]
    token: Option<String>,
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

/// What reaches the agent: sandbox.v1 frames, and (from the node daemon) flow control.
type Inbound = frame::Frame<pb::ServerFrame>;

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

/// Forwards one pipe of an exec as chunks, never more than its gate's credit ahead of what the
/// daemon's client has taken: with no credit, the pipe is not read and the process blocks on
/// its write.
async fn pump(
    mut r: impl tokio::io::AsyncRead + Unpin,
    req_id: u64,
    stream: pb::Stream,
    out: Out,
    gate: Arc<Gate>,
    linger: Option<Duration>,
) {
    let mut buf = vec![0u8; flow::CHUNK_MAX];
    loop {
        let allowed = gate.reserve(flow::CHUNK_MAX).await;
        let n = match linger {
            Some(l) => flow::read_chunk(&mut r, &mut buf[..allowed], l).await,
            // One read: no second one to find the pipe empty (a system call under gVisor).
            None => r.read(&mut buf[..allowed]).await.unwrap_or(0),
        };
        gate.refund(allowed - n);
        if n == 0 {
            return;
        }
        let _ = out
            .send(frame(WorkerMsg::Chunk(pb::Chunk {
                req_id,
                data: buf[..n].to_vec(),
                stream: stream as i32,
            })))
            .await;
    }
}

/// How an exec is started: the daemon's quoted form directly, anything else with a shell.
fn command_for(e: &pb::Exec) -> spawn::Spec {
    let mut spec = match command::parse(&e.command) {
        Some(d) => spawn::Spec {
            argv: d.argv.into_iter().map(Into::into).collect(),
            env: d
                .env
                .into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
            cwd: d.cwd.map(Into::into),
            stdin: false,
            tty: None,
        },
        None => shell(&e.command),
    };
    spec.stdin = !e.stdin.is_empty();
    spec
}

fn shell(script: &str) -> spawn::Spec {
    if std::path::Path::new("/bin/sh").exists() {
        spawn::Spec::new(["/bin/sh", "-c", script])
    } else {
        spawn::Spec::new(["/.compute/busybox", "sh", "-c", script])
    }
}

async fn fail(out: &Out, req_id: u64, stderr: String, code: i32) {
    let _ = out
        .send(frame(WorkerMsg::Chunk(pb::Chunk {
            req_id,
            data: stderr.into_bytes(),
            stream: pb::Stream::Stderr as i32,
        })))
        .await;
    let _ = out
        .send(frame(WorkerMsg::End(pb::End {
            req_id,
            exit_code: code,
        })))
        .await;
}

/// The execs in flight: their process groups, the gates of their output, and the stdin and
/// terminals of the interactive ones.
#[derive(Default)]
struct Execs {
    pgids: HashMap<u64, i32>,
    gates: HashMap<u64, Arc<Gate>>,
    /// Stdin of the interactive execs, in the order it came. Unbounded, but the daemon sends
    /// no more than `Start::stdin_window` bytes ahead of the credit given back.
    inputs: HashMap<u64, mpsc::UnboundedSender<Input>>,
    ptys: HashMap<u64, Arc<spawn::Pty>>,
}

type Running = Arc<Mutex<Execs>>;

/// Stdin credit back to the node daemon.
type Credit = mpsc::UnboundedSender<frame::Flow>;

/// The stdin of an interactive exec.
enum Input {
    Data(Vec<u8>),
    Eof,
}

fn execs(r: &Running) -> std::sync::MutexGuard<'_, Execs> {
    r.lock().unwrap_or_else(|p| p.into_inner())
}

/// Why an exec did not start: what a shell would say and return, or a failure of the agent.
enum Refused {
    Shell(String, i32),
    Spawn(String),
}

/// Starts the process of `e` as `spec` says.
fn launch(e: &pb::Exec, spec: &spawn::Spec) -> Result<spawn::Child, Refused> {
    match spawn::spawn(spec) {
        Ok(c) => Ok(c),
        Err(SpawnError::Cwd(_)) => {
            let dir = spec.cwd.as_deref().unwrap_or_default().to_string_lossy();
            Err(Refused::Shell(format!("sh: cd: can't cd to {dir}\n"), 2))
        }
        // What a shell would say and return for a program it cannot run.
        Err(SpawnError::Exec(err)) if err.kind() == std::io::ErrorKind::NotFound => {
            let name = spec.argv[0].to_string_lossy();
            Err(Refused::Shell(
                format!("sh: exec: {name}: not found\n"),
                127,
            ))
        }
        Err(SpawnError::Exec(err)) if err.raw_os_error() == Some(nix::libc::ENOEXEC) => {
            // A script without `#!`: a shell runs it as a shell script.
            let mut sh = shell(&e.command);
            sh.stdin = spec.stdin;
            sh.tty = spec.tty;
            spawn::spawn(&sh).map_err(|(SpawnError::Exec(err) | SpawnError::Cwd(err))| {
                Refused::Shell(format!("sh: {err}\n"), 126)
            })
        }
        Err(SpawnError::Exec(err)) if err.kind() == std::io::ErrorKind::PermissionDenied => {
            Err(Refused::Shell(format!("sh: exec: {err}\n"), 126))
        }
        Err(SpawnError::Exec(err)) => Err(Refused::Spawn(format!("spawn: {err}"))),
    }
}

async fn refuse(out: Out, req_id: u64, r: Refused) {
    match r {
        Refused::Shell(stderr, code) => fail(&out, req_id, stderr, code).await,
        Refused::Spawn(message) => {
            let _ = out
                .send(frame(WorkerMsg::Error(pb::ExecError { req_id, message })))
                .await;
        }
    }
}

/// Runs one exec. Its output is always streamed: for `streaming=false` the relay collects
/// stdout (as sandbox.v1 has it), so nothing is held in here either.
async fn run_exec(e: pb::Exec, out: Out, running: Running, gate: Arc<Gate>, grace: Duration) {
    let spec = command_for(&e);
    match launch(&e, &spec) {
        Ok(child) => {
            execs(&running).pgids.insert(e.req_id, child.id());
            supervise(e, child, None, out, running, gate, grace).await;
        }
        Err(r) => {
            execs(&running).gates.remove(&e.req_id);
            refuse(out, e.req_id, r).await;
        }
    }
}

/// Starts an interactive exec (a terminal, streamed stdin) at once, so that its stdin,
/// resizes and abort, which follow on the same channel, find it.
fn start_interactive(
    req_id: u64,
    start: frame::Start,
    out: &Out,
    credit: &Credit,
    running: &Running,
    window: u64,
    grace: Duration,
) {
    let Some(mut e) = start.exec else {
        return;
    };
    e.req_id = req_id;
    let mut spec = command_for(&e);
    if start.tty {
        let size = |v: u32, d: u16| {
            if v == 0 {
                d
            } else {
                v.min(u16::MAX.into()) as u16
            }
        };
        spec.tty = Some((size(start.rows, 24), size(start.cols, 80)));
    } else {
        spec.stdin |= start.stdin;
    }
    match launch(&e, &spec) {
        Err(r) => {
            tokio::spawn(refuse(out.clone(), req_id, r));
        }
        Ok(child) => {
            let gate = Arc::new(Gate::new(window));
            let (tx, rx) = mpsc::unbounded_channel();
            {
                let mut x = execs(running);
                x.pgids.insert(req_id, child.id());
                x.gates.insert(req_id, gate.clone());
                x.inputs.insert(req_id, tx);
                if let Some(p) = &child.pty {
                    x.ptys.insert(req_id, p.clone());
                }
            }
            let input = Some((rx, credit.clone(), start.stdin_window));
            tokio::spawn(supervise(
                e,
                child,
                input,
                out.clone(),
                running.clone(),
                gate,
                grace,
            ));
        }
    }
}

/// Writes an exec's stdin: the exec's own bytes, then (interactive) what comes, crediting the
/// daemon as the process takes it. A process that has closed its stdin still has what comes
/// credited (and dropped), so the client is never stuck on it. The end of stdin closes the
/// pipe, or types the terminal's end-of-file character.
async fn feed(
    w: Box<dyn tokio::io::AsyncWrite + Unpin + Send>,
    first: Vec<u8>,
    input: Option<(mpsc::UnboundedReceiver<Input>, Credit, u64)>,
    req_id: u64,
    pty: Option<Arc<spawn::Pty>>,
) {
    let mut w = Some(w);
    if let Some(x) = w.as_mut().filter(|_| !first.is_empty()) {
        if x.write_all(&first).await.is_err() {
            w = None;
        }
    }
    let Some((mut rx, credit, window)) = input else {
        return;
    };
    // Credit goes back in batches of a quarter window: the daemon never has less than three
    // quarters to send, and a byte typed into a terminal costs no frame back (a write, under
    // gVisor a system call, on the echo's way).
    let batch = (window / 4).max(1);
    let mut owed = 0u64;
    while let Some(i) = rx.recv().await {
        match i {
            Input::Data(d) => {
                if let Some(x) = w.as_mut() {
                    if x.write_all(&d).await.is_err() {
                        w = None;
                    }
                }
                owed += d.len() as u64;
                if owed >= batch {
                    let _ = credit.send(frame::Flow {
                        req_id,
                        credit: std::mem::take(&mut owed),
                        window: 0,
                    });
                }
            }
            Input::Eof => match (&pty, w.as_mut()) {
                (Some(p), Some(x)) => {
                    let _ = x.write_all(&[p.eof_char()]).await;
                }
                _ => w = None,
            },
        }
    }
}

/// Stops an exec: its process group, and with a terminal every group on it (a shell's jobs,
/// each in a group of its own).
async fn stop_exec(pgid: i32, pty: Option<&spawn::Pty>, grace: Duration) {
    let mut groups = pty.map(|p| p.groups()).unwrap_or_default();
    if !groups.contains(&pgid) {
        groups.push(pgid);
    }
    let stops: Vec<_> = groups
        .into_iter()
        .map(|g| tokio::spawn(stop_group(g, grace)))
        .collect();
    for s in stops {
        let _ = s.await;
    }
}

/// Follows a started exec to its end: stdin in, output out, the timeout, the exit.
async fn supervise(
    mut e: pb::Exec,
    mut child: spawn::Child,
    input: Option<(mpsc::UnboundedReceiver<Input>, Credit, u64)>,
    out: Out,
    running: Running,
    gate: Arc<Gate>,
    grace: Duration,
) {
    let req_id = e.req_id;
    let pgid = child.id();
    let pty = child.pty.clone();
    let writer: Option<Box<dyn tokio::io::AsyncWrite + Unpin + Send>> = match &pty {
        Some(p) => Some(Box::new(p.writer())),
        None => child.stdin.take().map(|w| Box::new(w) as _),
    };
    let first = std::mem::take(&mut e.stdin);
    let feeder = writer.map(|w| tokio::spawn(feed(w, first, input, req_id, pty.clone())));
    let mut pumps = Vec::new();
    if let Some(p) = &pty {
        // A terminal is read as it is written: an echo is not held back to fill a chunk.
        let r = p.reader();
        pumps.push(tokio::spawn(pump(
            r,
            req_id,
            pb::Stream::Stdout,
            out.clone(),
            gate.clone(),
            None,
        )));
    }
    for (r, stream) in [
        (child.stdout.take(), pb::Stream::Stdout),
        (child.stderr.take(), pb::Stream::Stderr),
    ] {
        if let Some(r) = r {
            let (o, g) = (out.clone(), gate.clone());
            pumps.push(tokio::spawn(pump(
                r,
                req_id,
                stream,
                o,
                g,
                Some(flow::LINGER),
            )));
        }
    }
    let timeout = if e.timeout_s == 0 {
        Duration::from_secs(600)
    } else {
        Duration::from_secs(u64::from(e.timeout_s))
    };
    let status = match tokio::time::timeout(timeout, child.wait()).await {
        Ok(s) => s.ok(),
        Err(_) => {
            stop_exec(pgid, pty.as_deref(), grace).await;
            child.wait().await.ok()
        }
    };
    for p in pumps {
        let _ = tokio::time::timeout(Duration::from_millis(500), p).await;
    }
    if let Some(f) = feeder {
        f.abort();
    }
    {
        let mut x = execs(&running);
        x.pgids.remove(&req_id);
        x.gates.remove(&req_id);
        x.inputs.remove(&req_id);
        x.ptys.remove(&req_id);
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

/// Stdout as non-blocking pipe I/O on the runtime when it is a pipe (the init's FIFO); else
/// tokio's stdout, which hands every write to a blocking thread.
fn stdio_writer() -> Box<dyn tokio::io::AsyncWrite + Unpin + Send> {
    use std::os::fd::AsFd;
    std::io::stdout()
        .as_fd()
        .try_clone_to_owned()
        .ok()
        .and_then(|fd| tokio::net::unix::pipe::Sender::from_owned_fd(fd).ok())
        .map_or_else(
            || Box::new(tokio::io::stdout()) as Box<dyn tokio::io::AsyncWrite + Unpin + Send>,
            |p| Box::new(p),
        )
}

/// Stdin, the same way.
fn stdio_reader() -> Box<dyn tokio::io::AsyncRead + Unpin + Send> {
    use std::os::fd::AsFd;
    std::io::stdin()
        .as_fd()
        .try_clone_to_owned()
        .ok()
        .and_then(|fd| tokio::net::unix::pipe::Receiver::from_owned_fd(fd).ok())
        .map_or_else(
            || Box::new(tokio::io::stdin()) as Box<dyn tokio::io::AsyncRead + Unpin + Send>,
            |p| Box::new(p),
        )
}

/// Frames over stdin/stdout: a reader that resynchronises on garbage, and a writer.
fn stdio_transport(
    mut out: mpsc::Receiver<pb::WorkerFrame>,
    mut credit: mpsc::UnboundedReceiver<frame::Flow>,
    inbound: mpsc::Sender<Inbound>,
) {
    tokio::spawn(async move {
        let mut stdout = stdio_writer();
        loop {
            let bytes = tokio::select! {
                f = out.recv() => match f {
                    Some(f) => frame::encode(&f),
                    None => return,
                },
                Some(c) = credit.recv() => frame::encode_flow(&c),
            };
            if stdout.write_all(&bytes).await.is_err() || stdout.flush().await.is_err() {
                return;
            }
        }
    });
    tokio::spawn(async move {
        let mut stdin = stdio_reader();
        let mut r = frame::Reader::default();
        // Interactive stdin comes in frames of up to 256 KiB: read them in few calls.
        let mut buf = vec![0u8; 1 << 20];
        loop {
            match stdin.read(&mut buf).await {
                // The node daemon may be restarting: the FIFO comes back; keep waiting.
                Ok(0) => tokio::time::sleep(Duration::from_millis(100)).await,
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                Ok(n) => {
                    r.push(&buf[..n]);
                    while let Some(f) = r.next_frame::<pb::ServerFrame>() {
                        if inbound.send(f).await.is_err() {
                            return;
                        }
                    }
                }
            }
        }
    });
}

/// PID 1: runs the worker (this binary without `--init`) as a child with the same stdio, reaps
/// every process that ends up parented to us, and exits with the worker's status.
fn init() -> ExitCode {
    use nix::sys::wait::{waitpid, WaitStatus};
    drop_needless_statx_shim();
    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--init").collect();
    let exe = std::env::current_exe().unwrap_or_else(|_| "/.compute/sandbox-agent".into());
    let child = match std::process::Command::new(exe).args(args).spawn() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("sandbox-agent: start worker: {e}");
            return ExitCode::FAILURE;
        }
    };
    let worker = nix::unistd::Pid::from_raw(child.id() as i32);
    loop {
        match waitpid(None, None) {
            Ok(WaitStatus::Exited(pid, code)) if pid == worker => {
                return ExitCode::from(code as u8)
            }
            Ok(WaitStatus::Signaled(pid, _, _)) if pid == worker => return ExitCode::FAILURE,
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => {}
            Err(_) => return ExitCode::FAILURE,
        }
    }
}

/// The default image preloads a statx shim for gVisor before mid-2023, which rejects
/// `statx(2)` with `AT_NO_AUTOMOUNT` (see `scripts/build-image`). Where the flag is accepted the
/// shim only costs time: loading it is ~13 system calls and a few page faults in every process
/// (~1.5–2 ms of each start under ptrace), so it is taken out of this sandbox's
/// `/etc/ld.so.preload`. A read-only root file system keeps it (harmless).
fn drop_needless_statx_shim() {
    const PRELOAD: &str = "/etc/ld.so.preload";
    const SHIM: &str = "/libcompute-statx-compat.so";
    let Ok(text) = std::fs::read_to_string(PRELOAD) else {
        return;
    };
    if !text.lines().any(|l| l.trim().ends_with(SHIM)) {
        return;
    }
    // SAFETY: statx(2) into a zeroed buffer of the right type.
    let accepted = unsafe {
        let mut buf: nix::libc::statx = std::mem::zeroed();
        nix::libc::syscall(
            nix::libc::SYS_statx,
            nix::libc::AT_FDCWD,
            c"/".as_ptr(),
            nix::libc::AT_NO_AUTOMOUNT,
            nix::libc::STATX_BASIC_STATS,
            &mut buf as *mut nix::libc::statx,
        ) == 0
    };
    if !accepted {
        return;
    }
    let kept: String = text
        .lines()
        .filter(|l| !l.trim().ends_with(SHIM))
        .map(|l| format!("{l}\n"))
        .collect();
    let _ = if kept.trim().is_empty() {
        std::fs::remove_file(PRELOAD)
    } else {
        std::fs::write(PRELOAD, kept)
    };
}

/// Aborts an exec: SIGTERM to its group (and its terminal's foreground job), SIGKILL after the
/// grace; a second abort of the same exec kills at once.
fn abort(
    running: &Running,
    aborted: &mut std::collections::HashSet<u64>,
    req_id: u64,
    grace: Duration,
) {
    let (pg, pty) = {
        let x = execs(running);
        (x.pgids.get(&req_id).copied(), x.ptys.get(&req_id).cloned())
    };
    if let Some(pg) = pg {
        let again = !aborted.insert(req_id);
        let grace = if again { Duration::ZERO } else { grace };
        tokio::spawn(async move { stop_exec(pg, pty.as_deref(), grace).await });
    }
}

async fn serve(args: Args) -> anyhow::Result<()> {
    let (tx, rx) = mpsc::channel::<pb::WorkerFrame>(256);
    let labels = args
        .labels
        .iter()
        .filter_map(|l| {
            l.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
        })
        .collect();
    let mut capabilities = args.capabilities.clone();
    if args.stdio {
        // The node daemon's link: interactive execs (control frames, stdin credit).
        capabilities.push(frame::INTERACTIVE_CAPABILITY.into());
    }
    tx.send(frame(WorkerMsg::Hello(pb::Hello {
        sandbox_id: args.sandbox_id.clone(),
        labels,
        capabilities,
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
    let grace = Duration::from_secs_f64(args.grace.max(0.0));
    let (in_tx, mut inbound) = mpsc::channel::<Inbound>(256);
    let (credit, credit_rx) = mpsc::unbounded_channel();
    if args.stdio {
        stdio_transport(rx, credit_rx, in_tx);
    } else {
        let relay = args.relay.clone().unwrap_or_default();
        // Messages as large as the relay accepts (17 MiB: stdin and output of up to 16 MiB).
        let mut client = SandboxWorkerClient::new(channel(&relay).await?)
            .max_decoding_message_size(17 << 20)
            .max_encoding_message_size(17 << 20);
        let mut req = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx));
        if let Some(t) = args.token.as_deref().filter(|t| !t.is_empty()) {
            let v = format!("Bearer {t}")
                .parse()
                .map_err(|_| anyhow::anyhow!("the token is not a valid header value"))?;
            req.metadata_mut().insert("authorization", v);
        }
        let mut frames = client.attach(req).await?.into_inner();
        tokio::spawn(async move {
            while let Ok(Some(f)) = frames.message().await {
                if in_tx.send(frame::Frame::Message(f)).await.is_err() {
                    return;
                }
            }
        });
    }
    let running: Running = Arc::default();
    let mut aborted = std::collections::HashSet::new();
    // The per-exec window the daemon announced (0: no flow control on this link).
    let mut window = 0u64;
    while let Some(f) = inbound.recv().await {
        match f {
            frame::Frame::Message(pb::ServerFrame {
                msg: Some(ServerMsg::Exec(e)),
            }) => {
                let gate = Arc::new(Gate::new(window));
                execs(&running).gates.insert(e.req_id, gate.clone());
                tokio::spawn(run_exec(e, tx.clone(), running.clone(), gate, grace));
            }
            frame::Frame::Message(pb::ServerFrame {
                msg: Some(ServerMsg::Abort(a)),
            }) => {
                abort(&running, &mut aborted, a.req_id, grace);
            }
            frame::Frame::Control(c) => {
                let req_id = c.req_id;
                if let Some(s) = c.start {
                    start_interactive(req_id, s, &tx, &credit, &running, window, grace);
                }
                let input = execs(&running).inputs.get(&req_id).cloned();
                if let Some(i) = input {
                    if !c.data.is_empty() {
                        let _ = i.send(Input::Data(c.data));
                    }
                    if c.eof {
                        let _ = i.send(Input::Eof);
                    }
                }
                if let Some(size) = c.resize {
                    let pty = execs(&running).ptys.get(&req_id).cloned();
                    if let Some(p) = pty {
                        let clamp = |v: u32| v.clamp(1, u16::MAX.into()) as u16;
                        let _ = p.resize(clamp(size.rows), clamp(size.cols));
                    }
                }
                if c.abort {
                    abort(&running, &mut aborted, req_id, grace);
                }
            }
            frame::Frame::Message(_) => {}
            frame::Frame::Flow(fl) if fl.window > 0 => {
                // A new link (the daemon restarted): the execs of the old one have no reader
                // left to credit them; they run on unpaced, as before flow control.
                for g in execs(&running).gates.values() {
                    g.open();
                }
                window = fl.window;
            }
            frame::Frame::Flow(fl) => {
                let gate = execs(&running).gates.get(&fl.req_id).cloned();
                if let Some(g) = gate {
                    g.grant(fl.credit);
                }
            }
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    // Commands run as a login shell would have them: HOME set even if the image sets none.
    if std::env::var_os("HOME").is_none() {
        std::env::set_var("HOME", "/root");
    }
    let args = Args::parse();
    if args.init {
        return init();
    }
    // One thread: inside gVisor every cross-thread wakeup is a costly futex round trip, and the
    // agent only moves bytes and starts processes.
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
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
