//! Test harness: starts a real `computed node` against the real containerd + runsc, each in its
//! own containerd namespace, state directory and ports, and gives a gRPC client to it.
//!
//! Prerequisites (root, containerd's socket, runsc, the default image tarball) are checked
//! first: under CI (`CI` set) a missing one fails the test; elsewhere the test is skipped with
//! a printed reason.

#![allow(dead_code)]

/// Returns from the test when its prerequisites are missing (see [`prerequisites`]): a test
/// file declares `#[macro_use] mod common;` and starts each test with `need!();`.
#[allow(unused_macros)]
macro_rules! need {
    () => {
        if !$crate::common::prerequisites() {
            return;
        }
    };
}

pub mod pki;
pub mod relay;
pub mod router;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use computed::api::compute::v1 as pb;
use pb::compute_service_client::ComputeServiceClient;
use tonic::transport::Channel;
use tonic::{Code, Status};

pub use pb::SandboxStatus;

/// A ComputeService client.
pub type Client = ComputeServiceClient<Channel>;

/// containerd's socket for tests.
pub fn containerd_socket() -> PathBuf {
    std::env::var_os("CONTAINERD_ADDRESS")
        .map(PathBuf::from)
        .unwrap_or_else(|| "/run/compute/containerd.sock".into())
}

/// The default image tarball built by `scripts/build-image`.
pub fn image_tar() -> PathBuf {
    std::env::var_os("COMPUTE_TEST_IMAGE_TAR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("target/images/sandbox-python.tar")
        })
}

/// The statically linked in-sandbox agent built by `scripts/build-agent`.
pub fn agent_binary() -> PathBuf {
    std::env::var_os("COMPUTE_AGENT_BINARY")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let target = std::env::var_os("CARGO_TARGET_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"));
            target.join("x86_64-unknown-linux-gnu/release/sandbox-agent")
        })
}

/// `computed` with none of the environment overrides: the config file a test writes is the
/// whole configuration (scripts/test exports CONTAINERD_ADDRESS, for one).
pub fn computed_command() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_computed"));
    // The library's one list of the variables that override a config file.
    for k in computed::config::env_vars() {
        c.env_remove(k);
    }
    c
}

/// The image name the harness imports.
pub const IMAGE: &str = "compute.local/sandbox-python:latest";

/// Checks the prerequisites; returns false (after printing why) when the test should skip.
pub fn prerequisites() -> bool {
    let mut missing = Vec::new();
    if !nix::unistd::Uid::effective().is_root() {
        missing.push("root".to_string());
    }
    if !containerd_socket().exists() {
        missing.push(format!(
            "containerd socket {} (run scripts/containerd-up)",
            containerd_socket().display()
        ));
    }
    if which("runsc").is_none() {
        missing.push("runsc on PATH".into());
    }
    if !image_tar().exists() {
        missing.push(format!(
            "image tarball {} (run scripts/build-image)",
            image_tar().display()
        ));
    }
    if !agent_binary().exists() {
        missing.push(format!(
            "static sandbox-agent {} (run scripts/build-agent)",
            agent_binary().display()
        ));
    }
    nothing_missing(&missing)
}

/// True when `missing` is empty; otherwise fails the test under CI (`CI` set) and elsewhere
/// prints why it is skipped and returns false.
pub fn nothing_missing(missing: &[String]) -> bool {
    if missing.is_empty() {
        return true;
    }
    skip(&format!("missing prerequisites: {}", missing.join(", ")))
}

/// A test that cannot run: under CI a failure, elsewhere `SKIPPED: why` and false.
pub fn skip(why: &str) -> bool {
    if std::env::var_os("CI").is_some() {
        panic!("{why}");
    }
    eprintln!("SKIPPED: {why}");
    false
}

/// Finds a program on PATH.
pub fn which(bin: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join(bin))
            .find(|p| p.is_file())
    })
}

/// A TCP port on loopback that was free a moment ago, for a daemon to bind.
///
/// It comes from below the kernel's ephemeral range (32768 and up by default), never from
/// `bind(:0)`: a port the kernel hands out is also the source port of the next outgoing
/// connection (containerd's, a sandbox's), which took one between this check and the daemon's
/// bind in CI ("Address already in use"). Each call moves on from a per-process start, so two
/// calls in one test binary never return the same port.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const LOW: u32 = 20_000;
    const SPAN: u32 = 12_000;
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    let seed = std::process::id().wrapping_mul(7919)
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
    let _ = NEXT.compare_exchange(u32::MAX, seed % SPAN, Ordering::SeqCst, Ordering::SeqCst);
    for _ in 0..SPAN {
        let port = (LOW + NEXT.fetch_add(1, Ordering::SeqCst) % SPAN) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port in {LOW}..{}", LOW + SPAN)
}

/// `127.0.0.1:PORT` with a [`free_port`].
pub fn free_addr() -> String {
    format!("127.0.0.1:{}", free_port())
}

/// Waits until something listens on `addr`, for at most `within`; `exited` is asked between
/// tries and stops the wait with a panic when it returns a reason (a process that died).
pub fn wait_listening(
    addr: &str,
    within: Duration,
    what: &str,
    mut exited: impl FnMut() -> Option<String>,
) {
    let deadline = Instant::now() + within;
    while std::net::TcpStream::connect(addr).is_err() {
        if let Some(why) = exited() {
            panic!("{why}");
        }
        assert!(Instant::now() < deadline, "{what} did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A log file opened for appending (created if need be).
pub fn append_log(path: &Path) -> std::fs::File {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap()
}

/// Kills and reaps the process, if there is one.
pub fn kill_child(child: &mut Option<Child>) {
    if let Some(mut c) = child.take() {
        let _ = c.kill();
        let _ = c.wait();
    }
}

/// A child process killed (and reaped) when dropped.
pub struct Killed(pub Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A plaintext channel to `addr` (`host:port`).
pub async fn try_channel(addr: &str) -> Result<Channel, tonic::transport::Error> {
    Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
}

/// A plaintext channel to `addr` (`host:port`), which must answer.
pub async fn channel(addr: &str) -> Channel {
    try_channel(addr).await.unwrap()
}

/// A plaintext channel over the unix socket at `path`.
pub async fn unix_channel(path: &Path) -> Channel {
    computed::client::unix_channel(path)
        .await
        .unwrap_or_else(|e| panic!("connect to {}: {e}", path.display()))
}

/// Asserts that `o` exited 0, naming `what` and its stderr otherwise; returns stdout as text.
pub fn assert_success(o: &std::process::Output, what: &str) -> String {
    assert!(
        o.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A running node daemon.
pub struct Daemon {
    child: Option<Child>,
    /// Scratch directory (state, run dir, config, log).
    pub dir: tempfile::TempDir,
    /// TCP address.
    pub addr: String,
    /// Unix socket.
    pub socket: PathBuf,
    /// containerd namespace.
    pub namespace: String,
    /// Config file.
    pub config: PathBuf,
    /// Prometheus metrics address.
    pub metrics: String,
    /// Log file.
    pub log: PathBuf,
    /// containerd's socket this daemon talks to.
    pub containerd: PathBuf,
    /// The state directory.
    state: PathBuf,
    /// The network namespace (a name under /run/netns) it runs in, if not the test's own.
    netns: Option<String>,
}

/// Where a daemon keeps its state and which containerd it uses (defaults: the shared
/// containerd, a state directory inside the daemon's scratch directory).
#[derive(Debug, Default, Clone)]
pub struct Options {
    /// containerd's socket.
    pub containerd: Option<PathBuf>,
    /// The state directory.
    pub state_dir: Option<PathBuf>,
    /// A network namespace (its name under /run/netns) to run the daemon in: it then serves
    /// the test over its unix socket only (its TCP listener is in that namespace).
    pub netns: Option<String>,
}

/// Extra config lines for a daemon.
pub fn start(name: &str, extra_config: &str) -> Daemon {
    start_with(name, extra_config, Options::default())
}

/// Like [`start`], with another containerd or state directory.
pub fn start_with(name: &str, extra_config: &str, opts: Options) -> Daemon {
    let dir = tempfile::Builder::new()
        .prefix(&format!("computed-{name}-"))
        .tempdir()
        .unwrap();
    let namespace = format!("test-{name}-{}", std::process::id());
    let addr = free_addr();
    let metrics = free_addr();
    let socket = dir.path().join("compute.sock");
    let config = dir.path().join("config.toml");
    let containerd = opts.containerd.unwrap_or_else(containerd_socket);
    let state = opts.state_dir.unwrap_or_else(|| dir.path().join("state"));
    let toml = format!(
        "listen = {addr:?}\nmetrics_listen = {metrics:?}\nsocket = {socket:?}\ncontainerd_socket = {ctr:?}\nnamespace = {namespace:?}\n\
         state_dir = {state:?}\nrun_dir = {run:?}\nsandbox_image = {IMAGE:?}\n{agent}{extra_config}\n",
        ctr = containerd,
        agent = if extra_config.contains("agent_binary") {
            String::new()
        } else {
            format!("agent_binary = {:?}\n", agent_binary())
        },
        state = state,
        run = dir.path().join("run"),
    );
    std::fs::write(&config, toml).unwrap();
    // Import the default image into this daemon's namespace.
    let out = computed_command()
        .args(["--config"])
        .arg(&config)
        .args(["image", "import"])
        .arg(image_tar())
        .args(["--name", IMAGE])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "image import failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let log = dir.path().join("computed.log");
    let mut d = Daemon {
        child: None,
        dir,
        addr,
        socket,
        namespace,
        config,
        metrics,
        log,
        containerd,
        state,
        netns: opts.netns,
    };
    d.spawn();
    d
}

/// [`start`]s a daemon and connects a client to it.
pub async fn start_client(name: &str, extra_config: &str) -> (Daemon, Client) {
    let d = start(name, extra_config);
    let c = d.client().await;
    (d, c)
}

/// [`start_client`], and a READY sandbox of tenant `t`, session `name`, on the daemon.
pub async fn start_sandbox(name: &str, extra_config: &str) -> (Daemon, Client, String) {
    let (d, mut c) = start_client(name, extra_config).await;
    let id = ready_sandbox(&mut c, create_req("t", name)).await;
    (d, c, id)
}

impl Daemon {
    /// Starts (or restarts) the daemon process and waits until it serves.
    pub fn spawn(&mut self) {
        let logf = append_log(&self.log);
        let mut cmd = match &self.netns {
            // nsenter changes only the network namespace: the daemon's mounts (workspace
            // volumes) stay where containerd and runsc see them.
            Some(ns) => {
                let mut c = Command::new("nsenter");
                c.arg(format!("--net=/run/netns/{ns}"))
                    .arg(env!("CARGO_BIN_EXE_computed"));
                for k in computed::config::env_vars() {
                    c.env_remove(k);
                }
                c
            }
            None => computed_command(),
        };
        let child = cmd
            .arg("--config")
            .arg(&self.config)
            .arg("node")
            .env("RUST_LOG", "info,computed=debug")
            .stdout(Stdio::null())
            .stderr(logf)
            .spawn()
            .unwrap();
        self.child = Some(child);
        // Generous: how fast the daemon starts is not what these tests assert, and a loaded
        // 2-core CI machine once took over 30 s to bring one up (recovery asks containerd
        // about every sandbox). A daemon that exits is reported at once.
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(120) {
            let tcp = self.netns.is_some() || std::net::TcpStream::connect(&self.addr).is_ok();
            if tcp && std::os::unix::net::UnixStream::connect(&self.socket).is_ok() {
                if t0.elapsed() > Duration::from_secs(10) {
                    eprintln!("the daemon took {:?} to serve", t0.elapsed());
                }
                return;
            }
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!("daemon exited ({status}); log:\n{}", self.log_text());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("daemon did not start in 120 s; log:\n{}", self.log_text());
    }

    /// The daemon's pid.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("daemon running").id()
    }

    /// Kills the daemon with SIGKILL (sandboxes keep running).
    pub fn kill9(&mut self) {
        kill_child(&mut self.child);
    }

    /// The daemon's log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// A client over TCP.
    pub async fn client(&self) -> Client {
        ComputeServiceClient::new(channel(&self.addr).await)
            .max_decoding_message_size(32 << 20)
            .max_encoding_message_size(32 << 20)
    }

    /// A channel over the unix socket (always plaintext, whatever the TCP listener speaks).
    pub async fn local_channel(&self) -> Channel {
        unix_channel(&self.socket).await
    }

    /// `computectl --socket SOCKET`, to add arguments to.
    pub fn computectl_command(&self) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_computectl"));
        c.arg("--socket").arg(&self.socket);
        c
    }

    /// Runs `computectl --socket SOCKET ARGS` to the end.
    pub fn computectl(&self, args: &[&str]) -> std::process::Output {
        self.computectl_command().args(args).output().unwrap()
    }

    /// GET /metrics, as text.
    pub fn scrape(&self) -> String {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(&self.metrics).unwrap();
        write!(
            s,
            "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        assert!(out.starts_with("HTTP/1.1 200"), "{out}");
        out
    }

    /// The state directory.
    pub fn state_dir(&self) -> PathBuf {
        self.state.clone()
    }

    /// The run directory (exec FIFOs live under `io/`).
    pub fn run_dir(&self) -> PathBuf {
        self.dir.path().join("run")
    }

    /// The ctr CLI in this daemon's namespace.
    pub fn ctr(&self, args: &[&str]) -> String {
        let out = Command::new("ctr")
            .arg("--address")
            .arg(&self.containerd)
            .args(["--namespace", &self.namespace])
            .args(args)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill9();
        // Remove whatever the test left in containerd, then the namespace's images so that
        // containerd's GC frees the unpacked snapshots. A Tasks.Create the daemon had under
        // way when it was killed still completes in containerd: rounds until nothing is left.
        for _ in 0..10 {
            let tasks = self.ctr(&["tasks", "ls", "-q"]);
            for line in tasks.lines() {
                let _ = self.ctr(&["tasks", "kill", "-s", "SIGKILL", line]);
                std::thread::sleep(Duration::from_millis(200));
                let _ = self.ctr(&["tasks", "rm", "-f", line]);
            }
            let containers = self.ctr(&["containers", "ls", "-q"]);
            for line in containers.lines() {
                let _ = self.ctr(&["containers", "rm", line]);
            }
            if tasks.trim().is_empty() && containers.trim().is_empty() {
                break;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        // Workspace volumes the test left mounted.
        if let Ok(rd) = std::fs::read_dir(self.state_dir().join("workspaces")) {
            for e in rd.flatten() {
                let data = e.path().join("data");
                if computed::volume::is_mounted(&data) {
                    let _ = Command::new("umount").arg(&data).status();
                }
            }
        }
        // What containerd no longer knows of goes too, in one pass over the process table: a
        // shim and sandbox of a Tasks.Create still under way when its container was removed
        // above (they name this namespace), and the agents' FIFO holders, which a killed daemon
        // cannot stop (each would retry its FIFO every 50 ms for a minute).
        let agents = format!("{}/", self.run_dir().join("agents").display());
        let needles = [
            format!("{} ", self.namespace),
            format!("/{} ", self.namespace),
            format!("/{}/", self.namespace),
            agents,
        ];
        for (pid, cmd) in command_lines() {
            if needles.iter().any(|n| cmd.contains(n.as_str())) {
                sigkill(pid);
            }
        }
        for line in self.ctr(&["images", "ls", "-q"]).lines() {
            let _ = self.ctr(&["images", "rm", "--sync", line]);
        }
        // The namespace goes once containerd's GC has freed its content and snapshots.
        for _ in 0..20 {
            let ok = Command::new("ctr")
                .arg("--address")
                .arg(&self.containerd)
                .args(["namespaces", "rm", &self.namespace])
                .output()
                .map(|o| o.status.success())
                .unwrap_or(false);
            if ok {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        if std::thread::panicking() {
            eprintln!("---- daemon log ----\n{}", self.log_text());
        }
    }
}

/// A CreateSandboxRequest with the given tenant/session and otherwise defaults.
pub fn create_req(tenant: &str, session: &str) -> pb::CreateSandboxRequest {
    pb::CreateSandboxRequest {
        tenant_id: tenant.into(),
        session_id: session.into(),
        ..Default::default()
    }
}

/// An ExecCommandRequest.
pub fn exec_req(id: &str, cmd: &str, args: &[&str]) -> pb::ExecCommandRequest {
    pb::ExecCommandRequest {
        sandbox_id: id.into(),
        command: cmd.into(),
        args: args.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

/// `req` with these limits (0: the default).
pub fn with_limits(
    mut req: pb::CreateSandboxRequest,
    cpu_millis: u32,
    memory_bytes: u64,
) -> pb::CreateSandboxRequest {
    req.limits = Some(pb::ResourceLimits {
        cpu_millis,
        memory_bytes,
        ..Default::default()
    });
    req
}

/// `req` with this workspace (empty: the default).
pub fn with_workspace(
    mut req: pb::CreateSandboxRequest,
    storage_class: &str,
    size: &str,
    mount_path: &str,
) -> pb::CreateSandboxRequest {
    // The rest at its defaults, should WorkspaceSpec grow fields.
    #[allow(clippy::needless_update)]
    let spec = pb::WorkspaceSpec {
        storage_class: storage_class.into(),
        size: size.into(),
        mount_path: mount_path.into(),
        ..Default::default()
    };
    req.workspace = Some(spec);
    req
}

/// A protobuf Duration of whole seconds.
pub fn secs(seconds: i64) -> Option<prost_types::Duration> {
    Some(prost_types::Duration { seconds, nanos: 0 })
}

/// An ExecCommandRequest with a timeout of `timeout` seconds.
pub fn timed(id: &str, cmd: &str, args: &[&str], timeout: i64) -> pb::ExecCommandRequest {
    let mut r = exec_req(id, cmd, args);
    r.timeout = secs(timeout);
    r
}

/// CreateSandbox.
pub async fn create(c: &mut Client, req: pb::CreateSandboxRequest) -> pb::CreateSandboxResponse {
    c.create_sandbox(req).await.unwrap().into_inner()
}

/// DescribeSandbox, as it answered.
pub async fn try_describe(c: &mut Client, id: &str) -> Result<pb::DescribeSandboxResponse, Status> {
    c.describe_sandbox(pb::DescribeSandboxRequest {
        sandbox_id: id.into(),
    })
    .await
    .map(tonic::Response::into_inner)
}

/// DescribeSandbox, which must succeed.
pub async fn describe(c: &mut Client, id: &str) -> pb::DescribeSandboxResponse {
    try_describe(c, id).await.unwrap()
}

/// DestroySandbox, as it answered.
pub async fn try_destroy(c: &mut Client, id: &str) -> Result<pb::DestroySandboxResponse, Status> {
    c.destroy_sandbox(pb::DestroySandboxRequest {
        sandbox_id: id.into(),
    })
    .await
    .map(tonic::Response::into_inner)
}

/// DestroySandbox, which must succeed.
pub async fn destroy(c: &mut Client, id: &str) -> pb::DestroySandboxResponse {
    try_destroy(c, id).await.unwrap()
}

/// A WriteFileRequest (replace, default mode).
pub fn write_req(id: &str, path: &str, data: impl Into<Vec<u8>>) -> pb::WriteFileRequest {
    pb::WriteFileRequest {
        sandbox_id: id.into(),
        path: path.into(),
        data: data.into().into(),
        ..Default::default()
    }
}

/// WriteFile, as it answered.
pub async fn try_write_file(
    c: &mut Client,
    id: &str,
    path: &str,
    data: impl Into<Vec<u8>>,
) -> Result<pb::WriteFileResponse, Status> {
    c.write_file(write_req(id, path, data))
        .await
        .map(tonic::Response::into_inner)
}

/// WriteFile, which must succeed.
pub async fn write_file(
    c: &mut Client,
    id: &str,
    path: &str,
    data: impl Into<Vec<u8>>,
) -> pb::WriteFileResponse {
    try_write_file(c, id, path, data).await.unwrap()
}

/// A ReadFileRequest of the whole file.
pub fn read_req(id: &str, path: &str) -> pb::ReadFileRequest {
    pb::ReadFileRequest {
        sandbox_id: id.into(),
        path: path.into(),
        ..Default::default()
    }
}

/// ReadFile of the whole file, as it answered.
pub async fn try_read_file(
    c: &mut Client,
    id: &str,
    path: &str,
) -> Result<pb::ReadFileResponse, Status> {
    c.read_file(read_req(id, path))
        .await
        .map(tonic::Response::into_inner)
}

/// ReadFile of the whole file, which must succeed.
pub async fn read_file(c: &mut Client, id: &str, path: &str) -> pb::ReadFileResponse {
    try_read_file(c, id, path).await.unwrap()
}

/// A ListFilesRequest, not recursive, with the default limit.
pub fn list_req(id: &str, path: &str) -> pb::ListFilesRequest {
    pb::ListFilesRequest {
        sandbox_id: id.into(),
        path: path.into(),
        ..Default::default()
    }
}

/// ListFiles, which must succeed.
pub async fn list_files(c: &mut Client, req: pb::ListFilesRequest) -> pb::ListFilesResponse {
    c.list_files(req).await.unwrap().into_inner()
}

/// Asserts that `r` failed with `want`; `what` names the call in the message. Returns the
/// status.
pub fn assert_code<T: std::fmt::Debug>(r: Result<T, Status>, want: Code, what: &str) -> Status {
    match r {
        Ok(v) => panic!("{what}: expected {want:?}, got {v:?}"),
        Err(s) => {
            assert_eq!(s.code(), want, "{what}: {s:?}");
            s
        }
    }
}

/// The collected result of an exec.
#[derive(Debug, Default)]
pub struct ExecOut {
    /// All stdout.
    pub stdout: Vec<u8>,
    /// All stderr.
    pub stderr: Vec<u8>,
    /// The completed event.
    pub completed: Option<pb::ExecCompleted>,
    /// Number of events.
    pub events: usize,
}

impl ExecOut {
    /// stdout as text.
    pub fn out(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
    /// The exit code (panics if the stream did not complete).
    pub fn code(&self) -> i32 {
        self.completed
            .as_ref()
            .expect("no completed event")
            .exit_code
    }
}

/// Waits (20 s at most) until a sandbox's in-sandbox agent has attached to daemon `d`.
pub async fn wait_agent(d: &Daemon) {
    let t = Instant::now();
    while !d.log_text().contains("agent attached") && !d.log_text().contains("agent re-attached") {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "agent never attached:\n{}",
            d.log_text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Runs an exec to completion.
pub async fn exec(c: &mut Client, req: pb::ExecCommandRequest) -> Result<ExecOut, tonic::Status> {
    let mut stream = c.exec_command(req).await?.into_inner();
    let mut out = ExecOut::default();
    while let Some(ev) = stream.message().await? {
        out.events += 1;
        assert!(ev.emitted_at.is_some(), "every event carries emitted_at");
        assert!(out.completed.is_none(), "completed must be the last event");
        match ev.event {
            Some(pb::exec_event::Event::Stdout(s)) => out.stdout.extend(s.data),
            Some(pb::exec_event::Event::Stderr(s)) => out.stderr.extend(s.data),
            Some(pb::exec_event::Event::Completed(c)) => out.completed = Some(c),
            None => panic!("event without payload"),
        }
    }
    Ok(out)
}

/// Starts `sh -c script` in a sandbox: its event stream, as it comes.
pub async fn sh_stream(c: &mut Client, id: &str, script: &str) -> tonic::Streaming<pb::ExecEvent> {
    c.exec_command(exec_req(id, "sh", &["-c", script]))
        .await
        .unwrap()
        .into_inner()
}

/// The sandbox's status, as DescribeSandbox reports it.
pub async fn status_of(c: &mut Client, id: &str) -> SandboxStatus {
    SandboxStatus::try_from(describe(c, id).await.status).unwrap()
}

/// Runs a shell command in a sandbox and returns its output, asserting exit 0.
pub async fn sh(c: &mut Client, id: &str, script: &str) -> String {
    let o = exec(c, exec_req(id, "sh", &["-c", script])).await.unwrap();
    assert_eq!(
        o.code(),
        0,
        "script {script:?} failed: stdout {} stderr {}",
        o.out(),
        String::from_utf8_lossy(&o.stderr)
    );
    o.out()
}

/// Creates a sandbox and waits until it is READY.
pub async fn ready_sandbox(c: &mut Client, req: pb::CreateSandboxRequest) -> String {
    let id = c.create_sandbox(req).await.unwrap().into_inner().sandbox_id;
    wait_status(c, &id, SandboxStatus::Ready, Duration::from_secs(60)).await;
    id
}

/// Polls DescribeSandbox until the status is `want`.
pub async fn wait_status(
    c: &mut Client,
    id: &str,
    want: SandboxStatus,
    within: Duration,
) -> pb::DescribeSandboxResponse {
    let deadline = Instant::now() + within;
    loop {
        let d = describe(c, id).await;
        if d.status == want as i32 {
            return d;
        }
        assert!(
            Instant::now() < deadline,
            "sandbox {id} never became {want:?}; last {:?} ({})",
            SandboxStatus::try_from(d.status),
            d.failure_reason
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits (at most `within`) until the sandbox is FAILED, and asserts that the reason mentions
/// `why`.
pub async fn wait_failed(
    c: &mut Client,
    id: &str,
    within: Duration,
    why: &str,
) -> pb::DescribeSandboxResponse {
    let desc = wait_status(c, id, SandboxStatus::Failed, within).await;
    assert!(
        desc.failure_reason.contains(why),
        "failure reason of {id}: {:?}",
        desc.failure_reason
    );
    desc
}

/// Every host process: its pid and its command line (arguments joined by spaces, with a
/// trailing space).
pub fn command_lines() -> Vec<(i32, String)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if let Ok(cmd) = std::fs::read(e.path().join("cmdline")) {
            out.push((pid, String::from_utf8_lossy(&cmd).replace('\0', " ")));
        }
    }
    out
}

/// SIGKILL to `pid`, whatever became of it.
pub fn sigkill(pid: i32) {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::SIGKILL);
}

/// Host processes whose command line mentions `needle`.
pub fn processes_mentioning(needle: &str) -> Vec<String> {
    command_lines()
        .into_iter()
        .filter(|(_, cmd)| cmd.contains(needle))
        .map(|(_, cmd)| cmd)
        .collect()
}

/// Mount points that mention `needle`.
pub fn mounts_mentioning(needle: &str) -> Vec<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter(|l| l.contains(needle))
        .map(String::from)
        .collect()
}

/// Loop devices (`losetup -a` lines) that mention `needle`, e.g. a state dir their files are in.
pub fn loops_mentioning(needle: &str) -> Vec<String> {
    let out = Command::new("losetup").arg("-a").output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains(needle))
        .map(String::from)
        .collect()
}

/// cgroup directories named for `id`, anywhere under /sys/fs/cgroup (two levels deep).
pub fn cgroups_of(id: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let root = Path::new("/sys/fs/cgroup");
    let mut dirs = vec![root.to_path_buf()];
    for depth in 0..3 {
        let mut next = Vec::new();
        for d in dirs {
            if let Ok(rd) = std::fs::read_dir(&d) {
                for e in rd.flatten() {
                    if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                        if e.file_name().to_string_lossy() == id {
                            out.push(e.path());
                        } else if depth < 2 {
                            next.push(e.path());
                        }
                    }
                }
            }
        }
        dirs = next;
    }
    out
}

/// Issues (`token` None) or installs (`Some`) a relay worker credential for `id` on `d` with
/// `computectl relay token`; returns the token. Behind a router, install the same token on
/// every node: whichever node the router picks for `id` checks it.
pub fn relay_token(d: &Daemon, id: &str, token: Option<&str>) -> String {
    use std::io::Write;
    let mut c = Command::new(env!("CARGO_BIN_EXE_computectl"))
        .arg("--socket")
        .arg(&d.socket)
        .args(["relay", "token", id])
        .args(token.map(|_| "--stdin"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("computectl relay token");
    let mut input = c.stdin.take().expect("stdin");
    input
        .write_all(token.unwrap_or("").as_bytes())
        .expect("write the token");
    drop(input);
    let o = c.wait_with_output().expect("computectl relay token");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout)
        .expect("utf-8 token")
        .trim()
        .to_string()
}

/// A RUNNING platform sandbox with no workload of its own (exec only), made as root on the
/// node's socket (`root`, the platform admin there) in a new namespace `ns`, environment `py`
/// of the default image.
pub async fn exec_only_sandbox(root: &Channel, ns: &str) -> String {
    use computed::api::platform::v1 as ppb;
    ppb::access_service_client::AccessServiceClient::new(root.clone())
        .create_namespace(ppb::CreateNamespaceRequest {
            name: ns.into(),
            ..Default::default()
        })
        .await
        .unwrap();
    ppb::environment_service_client::EnvironmentServiceClient::new(root.clone())
        .create_environment(ppb::CreateEnvironmentRequest {
            environment: Some(ppb::Environment {
                namespace: ns.into(),
                name: "py".into(),
                image: IMAGE.into(),
                ..Default::default()
            }),
        })
        .await
        .unwrap();
    let mut s = ppb::sandbox_service_client::SandboxServiceClient::new(root.clone());
    let id = s
        .create_sandbox(ppb::CreateSandboxRequest {
            namespace: ns.into(),
            environment: "py".into(),
            exec_only: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .sandbox_id;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let sb = s
            .get_sandbox(ppb::GetSandboxRequest {
                sandbox_id: id.clone(),
            })
            .await
            .unwrap()
            .into_inner();
        if sb.state == ppb::SandboxState::Running as i32 {
            return id;
        }
        assert!(Instant::now() < deadline, "{id} never RUNNING: {sb:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The installer's options from an init container's `args` (`install …`), parsed with
/// `computed install`'s own flags (tests/manifests.rs, tests/kube_real.rs).
pub fn install_opts_of(args: &[String]) -> computed::install::InstallOpts {
    #[derive(clap::Parser)]
    struct Cli {
        #[command(subcommand)]
        cmd: Sub,
    }
    #[derive(clap::Subcommand)]
    enum Sub {
        Install(computed::install::InstallOpts),
    }
    assert_eq!(
        args.first().map(String::as_str),
        Some("install"),
        "the init container must run `computed install`: {args:?}"
    );
    let argv = std::iter::once("computed".to_string()).chain(args.iter().cloned());
    match <Cli as clap::Parser>::try_parse_from(argv).unwrap_or_else(|e| panic!("init args: {e}")) {
        Cli {
            cmd: Sub::Install(opts),
        } => opts,
    }
}
