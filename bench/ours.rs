//! "ours": a real `computed node` started for the run (its own config, port, socket, containerd
//! namespace and state directory), driven over gRPC exactly as an agent would.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use computed::api::compute::v1 as pb;
use pb::compute_service_client::ComputeServiceClient;
use tonic::transport::Channel;

use crate::base::sweep_namespace;
use crate::host;
use crate::target::{ExecOutcome, Target, IMAGE};

type Client = ComputeServiceClient<Channel>;

/// The daemon side.
pub struct Ours {
    computed: PathBuf,
    image_tar: PathBuf,
    containerd: PathBuf,
    dir: PathBuf,
    config: PathBuf,
    /// The config without a pool (the pool scenario appends one).
    base_toml: String,
    log: PathBuf,
    addr: String,
    namespace: String,
    storage_class: String,
    /// Where its durable workspaces live.
    store: PathBuf,
    child: Mutex<Option<tokio::process::Child>>,
    pid: AtomicU32,
    client: Mutex<Option<Client>>,
    live: Mutex<BTreeSet<String>>,
    /// The network namespace (a name under /run/netns) the daemon runs in; None: the bench's.
    netns: Option<String>,
}

impl Ours {
    /// Prepares the daemon's directory and config (nothing runs yet).
    pub fn new(
        computed: &Path,
        image_tar: &Path,
        containerd: &Path,
        runsc: &Path,
        platform: &str,
        dir: PathBuf,
        storage_class: &str,
    ) -> Result<Ours> {
        std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
        let namespace = format!("bench-ours-{}", std::process::id());
        let addr = format!("127.0.0.1:{}", host::free_port()?);
        let config = dir.join("config.toml");
        // The config file is the daemon's whole configuration (its environment is cleared of
        // every override): the agent binary scripts/bench built goes into it.
        let agent = std::env::var("COMPUTE_AGENT_BINARY").unwrap_or_default();
        let toml = format!(
            "listen = {addr:?}\nsocket = {socket:?}\nmetrics_listen = \"\"\n\
             containerd_socket = {containerd:?}\nnamespace = {namespace:?}\n\
             state_dir = {state:?}\nrun_dir = {run:?}\nruntime = \"auto\"\n\
             runsc_path = {runsc:?}\nsandbox_image = {IMAGE:?}\ngc_interval_secs = 0\n\
             agent_binary = {agent:?}\nrunsc_platform = {platform:?}\n\
             platform_peer_secret = {peer:?}\n",
            peer = dir.join("peer-secret"),
            socket = dir.join("compute.sock"),
            state = dir.join("state"),
            run = dir.join("run"),
        );
        std::fs::write(&config, &toml).with_context(|| format!("write {}", config.display()))?;
        // The secret a router in front shares with it (the platform scenario's router).
        std::fs::write(
            dir.join("peer-secret"),
            format!("{}\n", uuid::Uuid::new_v4().simple()),
        )?;
        let store = dir.join("state/store");
        Ok(Ours {
            computed: computed.to_path_buf(),
            image_tar: image_tar.to_path_buf(),
            containerd: containerd.to_path_buf(),
            log: dir.join("computed.log"),
            dir,
            config,
            base_toml: toml,
            addr,
            namespace,
            storage_class: storage_class.to_string(),
            store,
            child: Mutex::new(None),
            pid: AtomicU32::new(0),
            client: Mutex::new(None),
            live: Mutex::new(BTreeSet::new()),
            netns: None,
        })
    }

    /// The same daemon run in network namespace `netns` (through `nsenter --net`: its mounts
    /// stay the host's), in containerd namespace `namespace`, with `extra` added to its config
    /// (an `[egress]` table): the bench then talks to it over its unix socket only.
    pub fn in_netns(mut self, netns: &str, namespace: &str, extra: &str) -> Result<Ours> {
        let toml = self.base_toml.replace(
            &format!("namespace = {:?}", self.namespace),
            &format!("namespace = {namespace:?}"),
        ) + extra;
        std::fs::write(&self.config, &toml)
            .with_context(|| format!("write {}", self.config.display()))?;
        self.base_toml = toml;
        self.namespace = namespace.to_string();
        self.netns = Some(netns.to_string());
        Ok(self)
    }

    /// The same daemon with `checkpoint_compression = compression` (None: the node's default).
    pub fn with_checkpoint_compression(mut self, compression: Option<&str>) -> Result<Ours> {
        let Some(c) = compression else {
            return Ok(self);
        };
        self.add_config(&format!("checkpoint_compression = {c:?}"))?;
        Ok(self)
    }

    /// Adds one line to the config file (the daemon reads it when it starts).
    fn add_config(&mut self, line: &str) -> Result<()> {
        self.base_toml += &format!("{line}\n");
        std::fs::write(&self.config, &self.base_toml)
            .with_context(|| format!("write {}", self.config.display()))
    }

    /// The same daemon with its workspace store at `store` (None: keeps `<state_dir>/store`).
    pub fn with_store(mut self, store: Option<&Path>) -> Result<Ours> {
        let Some(store) = store else {
            return Ok(self);
        };
        self.add_config(&format!("workspace_store_dir = {store:?}"))?;
        self.store = store.to_path_buf();
        Ok(self)
    }

    /// Where its durable workspaces live.
    pub fn store(&self) -> &Path {
        &self.store
    }

    /// The added cost of the platform API's gate: `rounds` pairs, taken in turns on one TCP
    /// connection, of `platform.v1.AccessService/WhoAmI` with an API key (made as root on the
    /// daemon's unix socket: the gate parses the header, hashes the key, finds it and its roles)
    /// and of `grpc.health.v1.Health/Check` (an open call on the same server). Returns
    /// (authorised ms, open ms).
    pub async fn auth_overhead(&self, rounds: usize) -> Result<(Vec<f64>, Vec<f64>)> {
        use computed::api::platform::v1 as ppb;
        let root = computed::client::unix_channel(&self.dir.join("compute.sock")).await?;
        let made = ppb::access_service_client::AccessServiceClient::new(root)
            .create_api_key(ppb::CreateApiKeyRequest {
                name: "bench".into(),
                platform_admin: true,
                ..Default::default()
            })
            .await
            .context("CreateApiKey as root on the socket")?
            .into_inner();
        let header: tonic::metadata::MetadataValue<_> =
            format!("Bearer {}", made.secret).parse()?;
        let ch = Channel::from_shared(format!("http://{}", self.addr))?
            .tcp_nodelay(true)
            .connect()
            .await?;
        let mut access = ppb::access_service_client::AccessServiceClient::new(ch.clone());
        let mut health = tonic_health::pb::health_client::HealthClient::new(ch);
        let (mut authed, mut open) = (Vec::new(), Vec::new());
        // 50 warm-up pairs (connection, caches), then the measured ones.
        for i in 0..rounds + 50 {
            let mut req = tonic::Request::new(ppb::WhoAmIRequest {});
            req.metadata_mut().insert("authorization", header.clone());
            let t = Instant::now();
            let who = access.who_am_i(req).await?.into_inner();
            let a = t.elapsed();
            if !who.platform_admin {
                bail!("WhoAmI: the bench key is not a platform admin");
            }
            let t = Instant::now();
            health
                .check(tonic_health::pb::HealthCheckRequest::default())
                .await?;
            let o = t.elapsed();
            if i >= 50 {
                authed.push(a.as_secs_f64() * 1e3);
                open.push(o.as_secs_f64() * 1e3);
            }
        }
        Ok((authed, open))
    }

    /// ExecCommand stdout throughput: `rounds` pairs, in turns, in one ready sandbox, of
    /// `head -c BYTES /dev/zero` streamed to this client as fast as it reads, and of the same
    /// pipe inside the sandbox (`head -c BYTES /dev/zero | cat > /dev/null`); MB/s from the
    /// client's clock, start to end, for both. Returns (streamed MB/s, inside MB/s).
    pub async fn stdout_throughput(
        &self,
        bytes: u64,
        rounds: usize,
    ) -> Result<(Vec<f64>, Vec<f64>)> {
        let (id, _) = self.create_ready().await?;
        let mut c = self.client()?;
        let n = bytes.to_string();
        let inside = format!("head -c {n} /dev/zero | cat > /dev/null");
        let (mut streamed, mut piped) = (Vec::new(), Vec::new());
        let mb_s = |d: Duration| bytes as f64 / 1e6 / d.as_secs_f64();
        let r = async {
            for i in 0..rounds {
                for side in crate::scenarios::order(2, i) {
                    let t = Instant::now();
                    if side == 0 {
                        let o = self
                            .run_exec(&mut c, &id, &["head", "-c", &n, "/dev/zero"], t)
                            .await?;
                        if o.exit_code != 0 || o.stdout.len() as u64 != bytes {
                            bail!(
                                "head streamed {} bytes, exit {}",
                                o.stdout.len(),
                                o.exit_code
                            );
                        }
                        streamed.push(mb_s(t.elapsed()));
                    } else {
                        let o = self
                            .run_exec(&mut c, &id, &["sh", "-c", &inside], t)
                            .await?;
                        if o.exit_code != 0 {
                            bail!("the pipe inside exited {}", o.exit_code);
                        }
                        piped.push(mb_s(t.elapsed()));
                    }
                }
            }
            Ok(())
        }
        .await;
        let _ = self.destroy(&id).await;
        r.map(|()| (streamed, piped))
    }

    /// The daemon's memory with `n` stalled clients: in one ready sandbox, `n` execs of
    /// `head -c 1G /dev/zero`, each on its own connection, read for one event and then not at
    /// all. Returns (idle RSS, RSS after 5 s of stall), in bytes; the streams then go and
    /// every process must be gone within 10 s.
    pub async fn stalled_memory(&self, n: usize) -> Result<(u64, u64)> {
        let (id, _) = self.create_ready().await?;
        let pid = self.daemon_pid().context("no daemon pid")?;
        let rss = move || -> Result<u64> {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
            let kb = status
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
                .context("VmRSS")?;
            Ok(kb * 1024)
        };
        let r = async {
            // Warm the path first (the allocator's arenas, the agent).
            let mut c = self.client()?;
            self.run_exec(
                &mut c,
                &id,
                &["head", "-c", "20000000", "/dev/zero"],
                Instant::now(),
            )
            .await?;
            let idle = rss()?;
            let mut streams = Vec::new();
            for _ in 0..n {
                let ch = Channel::from_shared(format!("http://{}", self.addr))?
                    .connect()
                    .await?;
                let mut cl = Client::new(ch);
                let mut s = cl
                    .exec_command(pb::ExecCommandRequest {
                        sandbox_id: id.clone(),
                        command: "head".into(),
                        args: vec!["-c".into(), "1000000000".into(), "/dev/zero".into()],
                        ..Default::default()
                    })
                    .await
                    .context("ExecCommand")?
                    .into_inner();
                s.message().await?.context("no first event")?;
                streams.push((s, cl));
            }
            tokio::time::sleep(Duration::from_secs(5)).await;
            let stalled = rss()?;
            drop(streams);
            let count = "cat /proc/[0-9]*/comm 2>/dev/null | grep -cx head || true";
            let t = Instant::now();
            loop {
                let o = self
                    .run_exec(&mut c, &id, &["sh", "-c", count], Instant::now())
                    .await?;
                if String::from_utf8_lossy(&o.stdout).trim() == "0" {
                    break;
                }
                if t.elapsed() > Duration::from_secs(10) {
                    bail!("stalled execs left running 10 s after their clients went");
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Ok((idle, stalled))
        }
        .await;
        let _ = self.destroy(&id).await;
        r
    }

    /// The daemon's log file.
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// Imports the image into the daemon's namespace, starts the daemon and connects to it.
    pub async fn start(&self) -> Result<()> {
        let out = tokio::process::Command::new(&self.computed)
            .arg("--config")
            .arg(&self.config)
            .args(["image", "import"])
            .arg(&self.image_tar)
            .args(["--name", IMAGE])
            .env_remove(computed::config::CONFIG_FILE_ENV)
            .output()
            .await
            .with_context(|| format!("run {}", self.computed.display()))?;
        if !out.status.success() {
            bail!(
                "computed image import failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        self.launch().await
    }

    /// Starts the daemon with the current config file and connects to it.
    async fn launch(&self) -> Result<()> {
        let logf = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        let mut cmd = match &self.netns {
            Some(ns) => {
                let mut c = tokio::process::Command::new("nsenter");
                c.arg(format!("--net=/run/netns/{ns}")).arg(&self.computed);
                c
            }
            None => tokio::process::Command::new(&self.computed),
        };
        cmd.arg("--config")
            .arg(&self.config)
            .arg("node")
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(logf)
            .kill_on_drop(true);
        for k in computed::config::env_vars() {
            cmd.env_remove(k);
        }
        let child = cmd.spawn().context("start computed node")?;
        self.pid.store(child.id().unwrap_or(0), Ordering::Relaxed);
        *self.child.lock().unwrap() = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self
                .child
                .lock()
                .unwrap()
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                bail!("computed node exited ({status}): {}", self.log_tail());
            }
            let up = match self.netns {
                // Its TCP listener is in its namespace.
                Some(_) => tokio::net::UnixStream::connect(self.socket()).await.is_ok(),
                None => tokio::net::TcpStream::connect(&self.addr).await.is_ok(),
            };
            if up {
                break;
            }
            if Instant::now() > deadline {
                bail!("computed node did not listen in 30 s: {}", self.log_tail());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let ch = match self.netns {
            Some(_) => computed::client::unix_channel(&self.socket()).await?,
            None => {
                Channel::from_shared(format!("http://{}", self.addr))?
                    .tcp_nodelay(true)
                    .initial_stream_window_size(computed::server::WINDOW)
                    .initial_connection_window_size(2 * computed::server::WINDOW)
                    .max_frame_size(1 << 20)
                    .connect()
                    .await?
            }
        };
        let client = ComputeServiceClient::new(ch)
            .max_decoding_message_size(64 << 20)
            .max_encoding_message_size(64 << 20);
        *self.client.lock().unwrap() = Some(client);
        Ok(())
    }

    /// Restarts the daemon with a warm pool of `size` members of the bench image (and the
    /// in-sandbox agent, the exec path a pool is for), or without a pool (`None`: the config of
    /// every other scenario; members left over are retired by the daemon).
    pub async fn set_pool(&self, size: Option<u32>) -> Result<()> {
        let mut toml = self.base_toml.clone();
        if let Some(n) = size {
            toml.push_str(&format!(
                "agent = true\n[[pool]]\nimage = {IMAGE:?}\nsize = {n}\nstorage_class = {:?}\n",
                self.storage_class
            ));
        }
        self.stop_daemon().await;
        std::fs::write(&self.config, toml)
            .with_context(|| format!("write {}", self.config.display()))?;
        self.launch().await
    }

    /// Waits (unmeasured) until the daemon reports `size` READY pool members.
    pub async fn wait_pool(&self, size: u32) -> Result<()> {
        use computed::api::node::v1 as node_pb;
        let ch = Channel::from_shared(format!("http://{}", self.addr))?
            .connect()
            .await?;
        let mut info = node_pb::node_info_client::NodeInfoClient::new(ch);
        let t0 = Instant::now();
        loop {
            let i = info
                .get_info(node_pb::GetInfoRequest {})
                .await
                .context("GetInfo")?
                .into_inner();
            if i.pool_sandboxes >= size {
                return Ok(());
            }
            if t0.elapsed() > Duration::from_secs(120) {
                bail!(
                    "the pool has {} of {size} members after 120 s",
                    i.pool_sandboxes
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Like [`Target::create_first_output`], and fails unless the create was served by the
    /// pool (READY in the CreateSandbox response).
    pub async fn pool_first_output(&self) -> Result<(String, Duration)> {
        let mut c = self.client()?;
        let t0 = Instant::now();
        let resp = c
            .create_sandbox(self.create_req())
            .await
            .context("CreateSandbox")?
            .into_inner();
        let id = resp.sandbox_id;
        self.live.lock().unwrap().insert(id.clone());
        if resp.status != pb::SandboxStatus::Ready as i32 {
            bail!("sandbox {id} was created cold, not taken from the pool");
        }
        let out = self
            .run_exec(&mut c, &id, &["echo", "hi"], t0)
            .await?
            .check(Some(b"hi\n"))?;
        Ok((id, out.first_stdout.context("no stdout")?))
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// The daemon's TCP address, its `computed` binary and its scratch directory.
    pub fn parts(&self) -> (&str, &Path, &Path) {
        (&self.addr, &self.computed, &self.dir)
    }

    /// The daemon's unix socket (root on it is the platform admin).
    pub fn socket(&self) -> PathBuf {
        self.dir.join("compute.sock")
    }

    fn client(&self) -> Result<Client> {
        self.client
            .lock()
            .unwrap()
            .clone()
            .context("the daemon is not running")
    }

    fn create_req(&self) -> pb::CreateSandboxRequest {
        pb::CreateSandboxRequest {
            tenant_id: "bench".into(),
            session_id: uuid::Uuid::new_v4().to_string(),
            workspace: (!self.storage_class.is_empty()).then(|| pb::WorkspaceSpec {
                storage_class: self.storage_class.clone(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    async fn create(&self, c: &mut Client) -> Result<String> {
        let id = c
            .create_sandbox(self.create_req())
            .await
            .context("CreateSandbox")?
            .into_inner()
            .sandbox_id;
        self.live.lock().unwrap().insert(id.clone());
        Ok(id)
    }

    async fn run_exec(
        &self,
        c: &mut Client,
        id: &str,
        argv: &[&str],
        t0: Instant,
    ) -> Result<ExecOutcome> {
        let req = pb::ExecCommandRequest {
            sandbox_id: id.into(),
            command: argv[0].into(),
            args: argv[1..].iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        };
        let mut stream = c
            .exec_command(req)
            .await
            .context("ExecCommand")?
            .into_inner();
        let mut out = ExecOutcome::default();
        let mut completed = false;
        while let Some(ev) = stream.message().await.context("ExecCommand stream")? {
            match ev.event {
                Some(pb::exec_event::Event::Stdout(s)) => {
                    if out.first_stdout.is_none() && !s.data.is_empty() {
                        out.first_stdout = Some(t0.elapsed());
                    }
                    out.stdout.extend(s.data);
                }
                Some(pb::exec_event::Event::Stderr(s)) => out.stderr.extend(s.data),
                Some(pb::exec_event::Event::Completed(c)) => {
                    out.exit_code = c.exit_code;
                    completed = true;
                }
                None => {}
            }
        }
        out.total = t0.elapsed();
        if !completed {
            bail!("exec stream ended without a completed event");
        }
        Ok(out)
    }

    async fn stop_daemon(&self) {
        let child = self.child.lock().unwrap().take();
        *self.client.lock().unwrap() = None;
        let Some(mut child) = child else { return };
        if let Some(pid) = child.id() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        if tokio::time::timeout(Duration::from_secs(10), child.wait())
            .await
            .is_err()
        {
            let _ = child.kill().await;
        }
    }
}

impl Target for Ours {
    fn name(&self) -> &'static str {
        "ours"
    }

    async fn create_first_output(&self) -> Result<(String, Duration)> {
        let mut c = self.client()?;
        let t0 = Instant::now();
        let id = self.create(&mut c).await?;
        let out = self
            .run_exec(&mut c, &id, &["echo", "hi"], t0)
            .await?
            .check(Some(b"hi\n"))?;
        let first = out.first_stdout.context("no stdout")?;
        Ok((id, first))
    }

    async fn create_ready(&self) -> Result<(String, Duration)> {
        let mut c = self.client()?;
        let t0 = Instant::now();
        let id = self.create(&mut c).await?;
        loop {
            let d = c
                .describe_sandbox(pb::DescribeSandboxRequest {
                    sandbox_id: id.clone(),
                })
                .await
                .context("DescribeSandbox")?
                .into_inner();
            match pb::SandboxStatus::try_from(d.status) {
                Ok(pb::SandboxStatus::Ready) => return Ok((id, t0.elapsed())),
                Ok(pb::SandboxStatus::Starting) => {}
                other => bail!("sandbox {id} is {other:?}: {}", d.failure_reason),
            }
            if t0.elapsed() > Duration::from_secs(60) {
                bail!("sandbox {id} not READY after 60 s");
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    async fn exec(&self, id: &str, argv: &[&str]) -> Result<ExecOutcome> {
        let mut c = self.client()?;
        self.run_exec(&mut c, id, argv, Instant::now()).await
    }

    async fn write_read(&self, id: &str, data: &[u8]) -> Result<(Duration, Duration)> {
        let mut c = self.client()?;
        // The client's data is ready before the clock starts, as the baseline's source file is.
        let body = bytes::Bytes::copy_from_slice(data);
        let t0 = Instant::now();
        let w = c
            .write_file(pb::WriteFileRequest {
                sandbox_id: id.into(),
                path: "bench/data.bin".into(),
                data: body,
                ..Default::default()
            })
            .await
            .context("WriteFile")?
            .into_inner();
        let write = t0.elapsed();
        if w.bytes_written != data.len() as i64 {
            bail!(
                "WriteFile wrote {} of {} bytes",
                w.bytes_written,
                data.len()
            );
        }
        let t1 = Instant::now();
        let r = c
            .read_file(pb::ReadFileRequest {
                sandbox_id: id.into(),
                path: "bench/data.bin".into(),
                ..Default::default()
            })
            .await
            .context("ReadFile")?
            .into_inner();
        let read = t1.elapsed();
        if r.data.len() != data.len() || r.data != data {
            bail!(
                "ReadFile returned {} bytes, not the {} written",
                r.data.len(),
                data.len()
            );
        }
        Ok((write, read))
    }

    async fn destroy(&self, id: &str) -> Result<Duration> {
        let mut c = self.client()?;
        let t0 = Instant::now();
        c.destroy_sandbox(pb::DestroySandboxRequest {
            sandbox_id: id.into(),
        })
        .await
        .context("DestroySandbox")?;
        let d = t0.elapsed();
        self.live.lock().unwrap().remove(id);
        Ok(d)
    }

    fn namespace(&self) -> &str {
        &self.namespace
    }

    fn daemon_pid(&self) -> Option<u32> {
        Some(self.pid.load(Ordering::Relaxed)).filter(|p| *p != 0)
    }

    async fn cleanup(&self) {
        // Through the daemon first, so that it unmounts and releases what it made.
        let live: Vec<String> = self.live.lock().unwrap().iter().cloned().collect();
        if self.child.lock().unwrap().is_some() {
            for id in live {
                let _ = tokio::time::timeout(Duration::from_secs(30), self.destroy(&id)).await;
            }
        }
        self.stop_daemon().await;
        // Then whatever is left in its namespace and state directory.
        sweep_namespace(&self.containerd, &self.namespace).await;
        let ws = self.dir.join("state").join("workspaces");
        if let Ok(rd) = std::fs::read_dir(&ws) {
            for e in rd.flatten() {
                let paths = computed::workspace::Paths::new(&self.dir.join("state"), {
                    &e.file_name().to_string_lossy()
                });
                let _ = computed::volume::detach(&paths);
            }
        }
        host::drop_namespace(&self.containerd, &self.namespace).await;
    }
}
