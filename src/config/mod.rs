//! Node daemon configuration: a TOML file (every key optional), overridden by the environment
//! variables the spec names, validated before any port is bound.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

mod env;

pub use env::{env_vars, EnvVar, CONFIG_FILE_ENV, ENV};

use crate::size::ByteSize;
use crate::volume::Backend;

/// Errors of configuration loading.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The file could not be read.
    #[error("config {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The file is not valid TOML for this struct.
    #[error("config {path}: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The error.
        source: toml::de::Error,
    },
    /// A value is out of range.
    #[error("config: {0}")]
    Invalid(String),
}

/// Which containerd runtime launches sandboxes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RuntimeKind {
    /// `io.containerd.runsc.v1` if `containerd-shim-runsc-v1` is on PATH, else runc-wrapper.
    Auto,
    /// gVisor's own shim, `io.containerd.runsc.v1`.
    RunscShim,
    /// `io.containerd.runc.v2` with `binary_name` pointing at a runsc wrapper.
    RuncWrapper,
}

/// The node daemon's configuration.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// TCP listen address of ComputeService (`COMPUTE_LISTEN`).
    pub listen: String,
    /// Unix socket path of ComputeService (`COMPUTE_SOCKET`); empty disables it.
    pub socket: PathBuf,
    /// Prometheus metrics HTTP address (`COMPUTE_METRICS_LISTEN`); empty disables.
    pub metrics_listen: String,
    /// containerd's gRPC socket (`CONTAINERD_ADDRESS`).
    pub containerd_socket: PathBuf,
    /// containerd namespace for every object we make.
    pub namespace: String,
    /// State directory: workspaces, FIFOs, the runsc wrapper (`COMPUTE_STATE_DIR`).
    pub state_dir: PathBuf,
    /// Runtime directory for FIFOs and runsc state (`COMPUTE_RUN_DIR`).
    pub run_dir: PathBuf,
    /// Runtime selection.
    pub runtime: RuntimeKind,
    /// The runsc binary.
    pub runsc_path: PathBuf,
    /// runsc `--platform` (`ptrace`, the default; `systrap`; `kvm`); empty keeps runsc's own
    /// default (ptrace in 20221219, systrap from 2023). One the binary does not offer stops the
    /// node.
    pub runsc_platform: String,
    /// Extra runsc flags (global flags, e.g. `--debug`).
    pub runsc_flags: Vec<String>,
    /// How `runsc checkpoint` compresses a suspended sandbox's memory (`--compression`, where
    /// the runsc has it: 20240729 does, 20221219 not): `none` (the default) suspends and
    /// resumes about a third faster here and takes the touched memory's size on disk;
    /// `flate-best-speed` (runsc's own default, also what empty means) is ~5× smaller for an
    /// idle Python session and far smaller for sparse memory.
    pub checkpoint_compression: String,
    /// Default image when a request names none (`SANDBOX_IMAGE`).
    pub sandbox_image: String,
    /// Default storage class (`PVC_STORAGE_CLASS`).
    pub storage_class: String,
    /// Default workspace size (`PVC_WORKSPACE_SIZE`).
    pub workspace_size: ByteSize,
    /// Largest workspace a request may ask for.
    pub max_workspace_size: ByteSize,
    /// Storage classes: name → backend. An unknown class is INVALID_ARGUMENT.
    pub storage_classes: std::collections::BTreeMap<String, Backend>,
    /// How often the daemon collects expired soft-deleted workspaces, in seconds (0 = never;
    /// `computed gc` does one pass).
    pub gc_interval_secs: u64,
    /// Where durable workspaces and their snapshots live (empty: `<state_dir>/store`). Put it
    /// on a file system with reflinks (XFS with `reflink=1`, btrfs) and a snapshot costs disk
    /// in proportion to what changed since; elsewhere a snapshot is a sparse copy.
    pub workspace_store_dir: PathBuf,
    /// Default CPU limit in millicores.
    pub default_cpu_millis: u32,
    /// Default memory limit in bytes.
    pub default_memory_bytes: u64,
    /// Default max_runtime in seconds.
    pub default_max_runtime_secs: u64,
    /// Upper bound on max_runtime a request may ask for, in seconds.
    pub max_max_runtime_secs: u64,
    /// Memory the host cgroup allows above memory_bytes, for the sentry and gofer (bytes).
    pub memory_headroom_bytes: u64,
    /// pids limit of the sandbox cgroup.
    pub pids_limit: i64,
    /// How long ExecCommand waits for a STARTING sandbox, in seconds.
    pub ready_wait_secs: u64,
    /// Exec timeout cap and default, in seconds.
    pub exec_timeout_cap_secs: u64,
    /// Grace between SIGTERM and SIGKILL on cancellation, in seconds.
    pub cancel_grace_secs: u64,
    /// How often running execs sample the sandbox cgroup, in milliseconds.
    pub sample_interval_ms: u64,
    /// How often an idle sandbox is sampled for its lifetime memory average, in milliseconds.
    pub meter_interval_ms: u64,
    /// How often a sandbox's meter state is written to its container labels, in seconds.
    pub usage_persist_secs: u64,
    /// How long a destroyed sandbox's workspace is kept, in seconds.
    pub workspace_grace_secs: u64,
    /// compute.v1 sandboxes idle this long (no exec, no file call) are suspended with their
    /// memory and resumed transparently by their next call, in seconds (0: never;
    /// `COMPUTE_IDLE_SUSPEND_SECS`). Platform sandboxes use their own `idle_suspend_sec`.
    pub idle_suspend_secs: u64,
    /// How often the idle-suspend loop looks at the sandboxes, in milliseconds.
    pub idle_check_ms: u64,
    /// Most bytes of a platform sandbox's run log kept on the node's disk (its oldest
    /// output goes first); `64Mi` by default.
    pub run_log_retention: ByteSize,
    /// A file holding the secret this node shares with the routers in front of it: a platform
    /// call that comes with it carries the principal the router checked (see the router's
    /// `--platform-peer-secret`). Empty: every platform call needs a key in this node's store.
    pub platform_peer_secret: PathBuf,
    /// The cgroup filesystem root.
    pub cgroup_root: PathBuf,
    /// Parent cgroup of every sandbox.
    pub cgroup_parent: String,
    /// A static busybox copied into `<state_dir>/helpers` and mounted read-only at `/.compute`
    /// in every sandbox, where it runs as the sandbox's init; empty to use the image's `/bin/sh`.
    pub init_helper: PathBuf,
    /// Pull an image from its registry when a sandbox names one that is not local.
    pub pull_missing: bool,
    /// Registries reached over plain HTTP (`host:port`), e.g. a local mirror.
    pub insecure_registries: Vec<String>,
    /// Also serve the admin service (computectl's backend) on the TCP listener. It is always
    /// on the unix socket.
    pub admin_tcp: bool,
    /// Group that owns the unix socket (mode 0660); empty keeps root's group.
    pub socket_group: String,
    /// PEM certificate chain of the TCP listener; with `tls_key`, the TCP listener speaks TLS
    /// (rustls). Empty: plain HTTP/2. The unix socket never uses TLS.
    pub tls_cert: PathBuf,
    /// PEM private key of `tls_cert`.
    pub tls_key: PathBuf,
    /// PEM CA bundle: when set (with `tls_cert` and `tls_key`), the TCP listener requires every
    /// client, gRPC health included, to present a certificate signed by it (mutual TLS).
    pub tls_client_ca: PathBuf,
    /// Run the in-sandbox agent as every sandbox's init and send execs through it (fast path,
    /// on by default; `COMPUTE_AGENT`); execs fall back to containerd exec while it is not
    /// attached, and every exec does when this is off or the binary is missing.
    pub agent: bool,
    /// The sandbox-agent binary, statically linked (`scripts/build-agent`) so that it runs in
    /// images of any libc; empty: `sandbox-agent` next to this executable
    /// (`COMPUTE_AGENT_BINARY`).
    pub agent_binary: PathBuf,
    /// Most concurrent execs the agent runs per sandbox.
    pub agent_capacity: u32,
    /// Most concurrent ExecCommand streams per sandbox (0 = unlimited); one more is
    /// RESOURCE_EXHAUSTED, as the relay's capacity_max (no queueing). Each containerd exec is a
    /// `runsc exec` process on the host: without a bound, one client could start thousands.
    pub max_execs_per_sandbox: u32,
    /// A relay worker silent this long (no frame, no heartbeat) is dropped, in milliseconds.
    pub worker_heartbeat_timeout_ms: u64,
    /// How long a relay Exec waits for a worker to attach, in milliseconds (0: UNAVAILABLE
    /// at once).
    pub worker_wait_ms: u64,
    /// Most output of one exec the daemon holds for a client that is behind (a quantity): the
    /// process is paused past it (its agent stops reading its pipes, or the containerd exec's
    /// FIFOs are not read) until the client takes more.
    pub exec_output_window: ByteSize,
    /// Most output of one exec from an external relay worker held for a harness that is not
    /// reading (a quantity): sandbox.v1 cannot pause a worker, so past it the exec ends with
    /// ExecError and the worker gets an Abort.
    pub worker_exec_buffer: ByteSize,
    /// This node's name, reported to the router (`COMPUTE_NODE_NAME`; default: the host name).
    pub node_name: String,
    /// Take no new sandboxes (`COMPUTE_DRAINING=1`); existing ones keep working.
    pub draining: bool,
    /// Most sandboxes (STARTING or READY) this node takes.
    pub max_sandboxes: u32,
    /// Free space the state directory's filesystem keeps (a quantity; `0` = none). Below it,
    /// CreateSandbox and WriteFile are RESOURCE_EXHAUSTED: sparse ext4-loop volumes must not
    /// find the host disk full under them.
    pub min_free_disk: ByteSize,
    /// Most ext4-loop volumes (each holds a loop device) attached at once; 0 = no cap. At the
    /// cap, CreateSandbox with an ext4-loop class is RESOURCE_EXHAUSTED.
    pub max_loop_volumes: u32,
    /// How many millicores the node promises per core.
    pub cpu_overcommit: f64,
    /// Log as JSON lines.
    pub log_json: bool,
    /// The warm pool: pre-booted sandboxes per image (`[[pool]]` tables; `COMPUTE_POOL`).
    /// Empty (the default) turns the pool off.
    pub pool: Vec<PoolEntry>,
    /// Sandbox networks (`[egress]`): absent, platform sandboxes have no network and
    /// GrantEgress is UNIMPLEMENTED; compute.v1 sandboxes never have one.
    pub egress: Option<EgressConfig>,
    /// Preview URLs (`[preview]`, docs/preview.md): absent, ExposeSandboxPort is
    /// UNIMPLEMENTED. Needs `[egress]` (the proxy reaches apps at their sandbox's address).
    pub preview: Option<PreviewConfig>,
    /// The file this configuration was read from (none: defaults and environment). Not a key.
    #[serde(skip)]
    pub loaded_from: Option<PathBuf>,
}

/// One warm-pool entry: keep `size` sandboxes of `image` booted, with this workspace, ready to
/// be claimed by a CreateSandbox whose request fits (same image, same workspace).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolEntry {
    /// The image (as a request names it; aliases of the same image also fit).
    pub image: String,
    /// How many booted, unclaimed sandboxes to keep.
    pub size: u32,
    /// Storage class of the members' workspaces; empty = `storage_class`.
    #[serde(default)]
    pub storage_class: String,
    /// Workspace size of the members; none = `workspace_size`.
    #[serde(default)]
    pub workspace_size: Option<ByteSize>,
    /// Mount path of the members' workspaces; empty = `/workspace`.
    #[serde(default)]
    pub mount_path: String,
}

/// How the node gives platform sandboxes networks (`[egress]`): each its own namespace and a
/// /30 of `pool`, deny-all but for its environment's base policy and its live grants.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EgressConfig {
    /// The IPv4 block the sandboxes' /30s come from (one per sandbox: how many it holds is how
    /// many networked sandboxes the node can have).
    #[serde(default = "default_egress_pool")]
    pub pool: String,
    /// The interface sandbox traffic may leave by (masqueraded to its address); empty = any
    /// interface that is not a sandbox's. Tests point it at a fake internet.
    #[serde(default)]
    pub uplink: String,
    /// More blocks no grant opens: the cluster's pod and service ranges, metadata servers
    /// (link-local, loopback, multicast, the pool and the node itself are always closed).
    #[serde(default)]
    pub never: Vec<String>,
    /// The nft table (family inet) the node owns.
    #[serde(default = "default_egress_table")]
    pub table: String,
    /// Prefix of the sandboxes' host-side interfaces and namespaces (at most 9 characters).
    #[serde(default = "default_egress_prefix")]
    pub iface_prefix: String,
    /// The resolver the node asks for names a sandbox may resolve (`ADDR:PORT`); empty = the
    /// first `nameserver` of the node's `/etc/resolv.conf`, port 53.
    #[serde(default)]
    pub dns_upstream: String,
    /// The port of the node's DNS answering for sandboxes (every sandbox packet to port 53 is
    /// redirected to it; nobody else reaches it).
    #[serde(default = "default_dns_port")]
    pub dns_port: u16,
    /// The port of the node's Host/SNI-checking proxy (sandbox connections to ports 80 and 443
    /// of names' addresses are redirected to it; nobody else reaches it).
    #[serde(default = "default_proxy_port")]
    pub proxy_port: u16,
    /// The shortest time an address a name resolved to stays open, whatever its TTL (an
    /// application connects a moment after it resolves).
    #[serde(default = "default_dns_min_ttl")]
    pub dns_min_ttl_secs: u32,
    /// Suspend sandboxes with a network too (the default). Their namespace, veth, address,
    /// elements and grants stay while suspended, and the restore takes the same interface
    /// again; their open connections are cut at the checkpoint (`--net-disconnect-ok`).
    /// Never with `runsc_network = "host"` (runsc cannot checkpoint host sockets); false keeps
    /// every sandbox with a network resident (checked: `computectl doctor`).
    #[serde(default = "default_true")]
    pub suspend_with_network: bool,
    /// runsc's platform for sandboxes with a network ("" = the node's `runsc_platform`).
    /// systrap moved TCP 1.4-1.9x faster than ptrace here, and starts processes 2x slower.
    #[serde(default)]
    pub runsc_platform: String,
    /// Whose network stack a sandbox with a network runs on: "sandbox" (gVisor's netstack
    /// inside the sentry, the default) or "host" (runsc `--network=host`: the host kernel's
    /// TCP/IP, still inside the sandbox's own namespace, veth and the node's table, which go
    /// on enforcing and metering; faster, at the cost of exposing the kernel's socket code to
    /// the sandbox through the sentry).
    #[serde(default = "default_runsc_network")]
    pub runsc_network: String,
    /// How long a sandbox's base policy (the platform's "egress bootstrap") stays in force
    /// when it has no max lifetime; with one, the base policy lasts the sandbox's life. After
    /// it only grants open anything. 0 = the base policy lasts as long as the sandbox.
    #[serde(default = "default_bootstrap_secs")]
    pub bootstrap_secs: u64,
}

/// Preview URLs (`[preview]`): a sandbox port published as
/// `{scheme}://{port}-{sandbox_id}.{domain}[:public_port]/`, served by the node's proxy.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PreviewConfig {
    /// The domain preview host names end with (a wildcard DNS record and certificate point
    /// `*.{domain}` at the routers' ingress). Required.
    pub domain: String,
    /// Where the node's preview proxy listens (plain HTTP/1.1 and HTTP/2; TLS ends at the
    /// ingress in front).
    #[serde(default = "default_preview_listen")]
    pub listen: String,
    /// The scheme of the URLs ExposeSandboxPort returns (`https` behind a TLS ingress).
    #[serde(default = "default_preview_scheme")]
    pub scheme: String,
    /// A port to put in the returned URLs (0: none, the scheme's own).
    #[serde(default)]
    pub public_port: u16,
    /// A file with the secret (at least 32 bytes) signed URLs are signed with; the node and
    /// its routers share it. Required.
    pub signing_key_file: PathBuf,
    /// A signed URL's life when ExposeSandboxPort gives no ttl_sec.
    #[serde(default = "default_preview_ttl")]
    pub default_ttl_secs: u32,
    /// The longest life a signed URL may ask for (more is INVALID_ARGUMENT).
    #[serde(default = "default_preview_max_ttl")]
    pub max_ttl_secs: u32,
    /// A client's request headers must arrive within this.
    #[serde(default = "default_preview_header_timeout")]
    pub header_timeout_secs: u32,
    /// The app must send its response headers within this.
    #[serde(default = "default_preview_response_timeout")]
    pub response_timeout_secs: u32,
    /// The largest request body the proxy passes on (413 beyond).
    #[serde(default = "default_preview_max_body")]
    pub max_request_body: ByteSize,
    /// The most client connections at once.
    #[serde(default = "default_preview_max_connections")]
    pub max_connections: u32,
    /// The endpoint FORWARD_AUTH previews ask, per request (`http://host:port/path`, a
    /// cluster-internal service; TLS ends at it only through a sidecar). Without it,
    /// FORWARD_AUTH is UNIMPLEMENTED on this node.
    #[serde(default)]
    pub forward_auth_url: String,
    /// How long the auth endpoint may take; longer, or a failure, denies (fail closed).
    #[serde(default = "default_forward_auth_timeout_ms")]
    pub forward_auth_timeout_ms: u32,
    /// How long an allow is remembered per (exposure, credentials).
    #[serde(default = "default_forward_auth_allow_cache")]
    pub forward_auth_allow_cache_secs: u32,
    /// How long a deny is remembered per (exposure, credentials).
    #[serde(default = "default_forward_auth_deny_cache")]
    pub forward_auth_deny_cache_secs: u32,
    /// The most remembered answers (the oldest go first beyond it).
    #[serde(default = "default_forward_auth_cache_entries")]
    pub forward_auth_cache_entries: u32,
}

impl PreviewConfig {
    /// What is wrong with it (`egress`: whether the node has `[egress]`).
    fn check(&self, egress: bool) -> Result<(), String> {
        if !egress {
            return Err(
                "preview URLs need [egress] (apps are reached at their sandbox's address)".into(),
            );
        }
        let d = self.domain.trim_end_matches('.');
        let label_ok = crate::platform::records::dns_label;
        if d.split('.').count() < 2 || !d.split('.').all(label_ok) || d.len() > 200 {
            return Err(format!(
                "domain {:?} is not a domain name of two labels or more",
                self.domain
            ));
        }
        if self.listen.parse::<std::net::SocketAddr>().is_err() {
            return Err(format!("listen {:?} is not an address:port", self.listen));
        }
        if !["http", "https"].contains(&self.scheme.as_str()) {
            return Err(format!("scheme {:?} is not http or https", self.scheme));
        }
        if self.signing_key_file.as_os_str().is_empty() {
            return Err("signing_key_file is required".into());
        }
        if self.default_ttl_secs == 0 || self.default_ttl_secs > self.max_ttl_secs {
            return Err(format!(
                "default_ttl_secs {} must be 1..=max_ttl_secs ({})",
                self.default_ttl_secs, self.max_ttl_secs
            ));
        }
        if self.header_timeout_secs == 0 || self.response_timeout_secs == 0 {
            return Err("header_timeout_secs and response_timeout_secs must be above 0".into());
        }
        if self.max_connections == 0 {
            return Err("max_connections must be above 0".into());
        }
        if !self.forward_auth_url.is_empty() {
            crate::preview::forward_auth::endpoint(&self.forward_auth_url)
                .map_err(|e| format!("forward_auth_url: {e}"))?;
            if self.forward_auth_timeout_ms == 0 || self.forward_auth_timeout_ms > 60_000 {
                return Err("forward_auth_timeout_ms must be 1..=60000".into());
            }
        }
        Ok(())
    }
}

fn default_preview_listen() -> String {
    "0.0.0.0:8088".into()
}
fn default_preview_scheme() -> String {
    "https".into()
}
fn default_preview_ttl() -> u32 {
    3600
}
fn default_preview_max_ttl() -> u32 {
    86400
}
fn default_preview_header_timeout() -> u32 {
    10
}
fn default_preview_response_timeout() -> u32 {
    60
}
fn default_preview_max_body() -> ByteSize {
    ByteSize::parse("64Mi").expect("a size")
}
fn default_preview_max_connections() -> u32 {
    4096
}
fn default_forward_auth_timeout_ms() -> u32 {
    2000
}
fn default_forward_auth_allow_cache() -> u32 {
    30
}
fn default_forward_auth_deny_cache() -> u32 {
    5
}
fn default_forward_auth_cache_entries() -> u32 {
    10_000
}

fn default_true() -> bool {
    true
}

fn default_runsc_network() -> String {
    "sandbox".into()
}

fn default_bootstrap_secs() -> u64 {
    24 * 3600
}

fn default_dns_port() -> u16 {
    10053
}
fn default_proxy_port() -> u16 {
    10080
}
fn default_dns_min_ttl() -> u32 {
    30
}

fn default_egress_pool() -> String {
    "10.200.0.0/16".into()
}
fn default_egress_table() -> String {
    "compute".into()
}
fn default_egress_prefix() -> String {
    "cs-".into()
}

impl Default for EgressConfig {
    fn default() -> Self {
        Self {
            pool: default_egress_pool(),
            uplink: String::new(),
            never: Vec::new(),
            table: default_egress_table(),
            iface_prefix: default_egress_prefix(),
            dns_upstream: String::new(),
            dns_port: default_dns_port(),
            proxy_port: default_proxy_port(),
            dns_min_ttl_secs: default_dns_min_ttl(),
            suspend_with_network: true,
            runsc_platform: String::new(),
            runsc_network: default_runsc_network(),
            bootstrap_secs: default_bootstrap_secs(),
        }
    }
}

/// The smallest workspace a sandbox may have.
pub const MIN_WORKSPACE: u64 = 8 << 20;

fn size(s: &str) -> ByteSize {
    ByteSize::parse(s).unwrap_or_else(|_| ByteSize::zero())
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: "0.0.0.0:50051".into(),
            socket: "/run/compute/compute.sock".into(),
            metrics_listen: "0.0.0.0:9090".into(),
            containerd_socket: "/run/containerd/containerd.sock".into(),
            namespace: "compute".into(),
            state_dir: "/var/lib/compute".into(),
            run_dir: "/run/compute".into(),
            runtime: RuntimeKind::Auto,
            runsc_path: "/usr/bin/runsc".into(),
            // Chosen by measurement (README, "gVisor releases and platforms"): on these
            // machines ptrace starts processes 2× faster than systrap, which every exec does.
            runsc_platform: "ptrace".into(),
            runsc_flags: vec![],
            // Chosen by measurement (README, "Suspend and resume"): resume latency over disk.
            checkpoint_compression: "none".into(),
            sandbox_image: "compute.local/sandbox-python:latest".into(),
            storage_class: "standard".into(),
            workspace_size: size("5Gi"),
            max_workspace_size: size("100Gi"),
            storage_classes: [
                ("standard".to_string(), Backend::Ext4Loop),
                ("local".to_string(), Backend::Dir),
            ]
            .into_iter()
            .collect(),
            gc_interval_secs: 300,
            workspace_store_dir: PathBuf::new(),
            default_cpu_millis: 1000,
            default_memory_bytes: 1 << 30,
            default_max_runtime_secs: 15 * 60,
            max_max_runtime_secs: 24 * 3600,
            memory_headroom_bytes: 384 << 20,
            pids_limit: 1024,
            ready_wait_secs: 60,
            exec_timeout_cap_secs: 600,
            cancel_grace_secs: 10,
            sample_interval_ms: 20,
            meter_interval_ms: 5000,
            usage_persist_secs: 30,
            workspace_grace_secs: 24 * 3600,
            idle_suspend_secs: 0,
            idle_check_ms: 1000,
            run_log_retention: ByteSize::parse("64Mi").expect("a size"),
            platform_peer_secret: PathBuf::new(),
            cgroup_root: "/sys/fs/cgroup".into(),
            cgroup_parent: "compute".into(),
            init_helper: "/bin/busybox".into(),
            pull_missing: true,
            insecure_registries: vec![],
            agent: true,
            agent_binary: PathBuf::new(),
            agent_capacity: 64,
            max_execs_per_sandbox: 64,
            worker_heartbeat_timeout_ms: 10_000,
            worker_wait_ms: 0,
            exec_output_window: size("1Mi"),
            worker_exec_buffer: size("8Mi"),
            admin_tcp: false,
            socket_group: String::new(),
            tls_cert: PathBuf::new(),
            tls_key: PathBuf::new(),
            tls_client_ca: PathBuf::new(),
            node_name: String::new(),
            draining: false,
            max_sandboxes: 200,
            min_free_disk: size("512Mi"),
            max_loop_volumes: 0,
            cpu_overcommit: 4.0,
            log_json: false,
            pool: vec![],
            egress: None,
            preview: None,
            loaded_from: None,
        }
    }
}

impl Config {
    /// Loads the file at `path` (if any), applies environment overrides and validates.
    pub fn load(path: Option<&Path>) -> Result<Self, Error> {
        let mut cfg = match path {
            Some(p) => {
                let text = std::fs::read_to_string(p).map_err(|source| Error::Read {
                    path: p.into(),
                    source,
                })?;
                toml::from_str(&text).map_err(|source| Error::Parse {
                    path: p.into(),
                    source,
                })?
            }
            None => Config::default(),
        };
        cfg.loaded_from = path.map(Path::to_path_buf);
        cfg.apply_env(|k| std::env::var(k).ok())?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// The pool entries with every empty field replaced by the node's default.
    pub fn pool_entries(&self) -> Vec<PoolEntry> {
        self.pool
            .iter()
            .map(|e| PoolEntry {
                image: e.image.clone(),
                size: e.size,
                storage_class: if e.storage_class.is_empty() {
                    self.storage_class.clone()
                } else {
                    e.storage_class.clone()
                },
                workspace_size: Some(
                    e.workspace_size
                        .clone()
                        .unwrap_or_else(|| self.workspace_size.clone()),
                ),
                mount_path: if e.mount_path.is_empty() {
                    "/workspace".into()
                } else {
                    e.mount_path.clone()
                },
            })
            .collect()
    }

    /// Checks ranges and formats.
    pub fn validate(&self) -> Result<(), Error> {
        let bad = |m: String| Err(Error::Invalid(m));
        if let Some(p) = &self.preview {
            if let Err(m) = p.check(self.egress.is_some()) {
                return bad(format!("[preview]: {m}"));
            }
        }
        if let Some(e) = &self.egress {
            if let Err(err) =
                crate::egress::Layout::new(&e.table, &e.iface_prefix, &e.pool, &e.uplink, &e.never)
            {
                return bad(format!("[egress]: {err}"));
            }
            if !["", "ptrace", "systrap", "kvm"].contains(&e.runsc_platform.as_str()) {
                return bad(format!(
                    "[egress]: runsc_platform {:?} is not ptrace, systrap or kvm (or empty)",
                    e.runsc_platform
                ));
            }
            if !["sandbox", "host"].contains(&e.runsc_network.as_str()) {
                return bad(format!(
                    "[egress]: runsc_network {:?} is not sandbox or host",
                    e.runsc_network
                ));
            }
            if e.dns_port == 0 || e.proxy_port == 0 || e.dns_port == e.proxy_port {
                return bad(format!(
                    "[egress]: dns_port {} and proxy_port {} must be two ports",
                    e.dns_port, e.proxy_port
                ));
            }
            if !e.dns_upstream.is_empty() && e.dns_upstream.parse::<std::net::SocketAddr>().is_err()
            {
                return bad(format!(
                    "[egress]: dns_upstream {:?} is not an address:port",
                    e.dns_upstream
                ));
            }
        }
        if self.listen.parse::<std::net::SocketAddr>().is_err() && !self.listen.is_empty() {
            return bad(format!("listen {:?} is not an address:port", self.listen));
        }
        if self.namespace.is_empty() {
            return bad("namespace is empty".into());
        }
        if self.workspace_size.bytes() < MIN_WORKSPACE {
            return bad(format!(
                "workspace_size {} is under the minimum of 8Mi",
                self.workspace_size
            ));
        }
        if self.max_workspace_size.bytes() < self.workspace_size.bytes() {
            return bad(format!(
                "max_workspace_size {} is under workspace_size {}",
                self.max_workspace_size, self.workspace_size
            ));
        }
        if !self.storage_classes.contains_key(&self.storage_class) {
            return bad(format!(
                "default storage_class {:?} is not among storage_classes",
                self.storage_class
            ));
        }
        if self.default_cpu_millis == 0 || self.default_memory_bytes < (16 << 20) {
            return bad("default limits are too small".into());
        }
        if self.exec_timeout_cap_secs == 0 || self.sample_interval_ms == 0 {
            return bad("exec_timeout_cap_secs and sample_interval_ms must be > 0".into());
        }
        if !["", "ptrace", "systrap", "kvm"].contains(&self.runsc_platform.as_str()) {
            return bad(format!(
                "runsc_platform {:?} is not ptrace, systrap or kvm (or empty: runsc's default)",
                self.runsc_platform
            ));
        }
        if !["", "none", "flate-best-speed"].contains(&self.checkpoint_compression.as_str()) {
            return bad(format!(
                "checkpoint_compression {:?} is not none or flate-best-speed (or empty: runsc's \
                 default)",
                self.checkpoint_compression
            ));
        }
        if !self.state_dir.is_absolute() || !self.run_dir.is_absolute() {
            return bad("state_dir and run_dir must be absolute".into());
        }
        let entries = self.pool_entries();
        let mut total = 0u64;
        for (i, e) in entries.iter().enumerate() {
            if e.image.is_empty() || e.size == 0 {
                return bad(format!(
                    "pool entry {} needs an image and a size > 0 (COMPUTE_POOL is IMAGE=N,...)",
                    i + 1
                ));
            }
            if !self.storage_classes.contains_key(&e.storage_class) {
                return bad(format!(
                    "pool entry {:?}: storage_class {:?} is not among storage_classes",
                    e.image, e.storage_class
                ));
            }
            if e.workspace_size
                .as_ref()
                .is_none_or(|s| s.bytes() < MIN_WORKSPACE)
            {
                return bad(format!(
                    "pool entry {:?}: workspace_size is under the minimum of 8Mi",
                    e.image
                ));
            }
            if crate::workspace::validate_mount_path(&e.mount_path).is_err() {
                return bad(format!(
                    "pool entry {:?}: mount_path {:?} is not a clean absolute path",
                    e.image, e.mount_path
                ));
            }
            if entries[..i].iter().any(|o| {
                o.image == e.image
                    && o.storage_class == e.storage_class
                    && o.workspace_size == e.workspace_size
                    && o.mount_path == e.mount_path
            }) {
                return bad(format!("pool entry {:?} is listed twice", e.image));
            }
            total += u64::from(e.size);
        }
        if total > u64::from(self.max_sandboxes) {
            return bad(format!(
                "the pool ({total} sandboxes) is larger than max_sandboxes ({})",
                self.max_sandboxes
            ));
        }
        let set = |p: &PathBuf| !p.as_os_str().is_empty();
        if set(&self.tls_cert) != set(&self.tls_key) {
            return bad("tls_cert and tls_key go together".into());
        }
        if set(&self.tls_client_ca) && !set(&self.tls_cert) {
            return bad("tls_client_ca needs tls_cert and tls_key".into());
        }
        if set(&self.tls_cert) && self.listen.is_empty() {
            return bad("tls_cert is set but there is no TCP listener".into());
        }
        Ok(())
    }

    /// Where durable workspaces and snapshots live.
    pub fn store_dir(&self) -> PathBuf {
        if self.workspace_store_dir.as_os_str().is_empty() {
            self.state_dir.join("store")
        } else {
            self.workspace_store_dir.clone()
        }
    }

    /// The ready wait as a Duration.
    pub fn ready_wait(&self) -> Duration {
        Duration::from_secs(self.ready_wait_secs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_overrides_the_file() {
        let mut c = Config::default();
        c.apply_env(|k| match k {
            "SANDBOX_IMAGE" => Some("img:1".into()),
            "PVC_WORKSPACE_SIZE" => Some("1Gi".into()),
            "COMPUTE_LISTEN" => Some("127.0.0.1:6000".into()),
            "COMPUTE_SOCKET" => Some(String::new()),
            "COMPUTE_STATE_DIR" => Some(String::new()),
            _ => None,
        })
        .unwrap();
        assert_eq!(c.sandbox_image, "img:1");
        assert_eq!(c.workspace_size.bytes(), 1 << 30);
        assert_eq!(
            c.socket,
            PathBuf::new(),
            "an empty COMPUTE_SOCKET turns it off"
        );
        assert_eq!(
            c.state_dir,
            Config::default().state_dir,
            "an empty one is ignored"
        );
        assert_eq!(c.listen, "127.0.0.1:6000");
        c.validate().unwrap();
        let e = Config::default()
            .apply_env(|k| (k == "PVC_WORKSPACE_SIZE").then(|| "lots".into()))
            .unwrap_err();
        assert!(e.to_string().contains("PVC_WORKSPACE_SIZE"), "{e}");
    }

    #[test]
    fn the_env_list_is_the_one_apply_env_reads() {
        // Every variable apply_env asks for is in env_vars(), and nothing else is.
        let asked = std::sync::Mutex::new(Vec::new());
        Config::default()
            .apply_env(|k| {
                asked.lock().unwrap().push(k.to_string());
                None
            })
            .unwrap();
        let mut listed: Vec<String> = env_vars().map(String::from).collect();
        assert_eq!(listed.remove(0), CONFIG_FILE_ENV);
        assert_eq!(*asked.lock().unwrap(), listed);
    }

    #[test]
    fn unknown_keys_are_refused() {
        let r: Result<Config, _> = toml::from_str("no_such_key = 1");
        assert!(r.is_err());
        let c: Config = toml::from_str("pids_limit = 77").unwrap();
        assert_eq!(c.pids_limit, 77);
    }

    #[test]
    fn pool_from_file_and_env() {
        let c: Config = toml::from_str(
            "[[pool]]\nimage = \"a:1\"\nsize = 2\n[[pool]]\nimage = \"b\"\nsize = 1\nmount_path = \"/w\"\n",
        )
        .unwrap();
        c.validate().unwrap();
        let e = c.pool_entries();
        assert_eq!(e.len(), 2);
        assert_eq!((e[0].image.as_str(), e[0].size), ("a:1", 2));
        assert_eq!(e[0].mount_path, "/workspace");
        assert_eq!(e[0].storage_class, "standard");
        assert_eq!(e[0].workspace_size.as_ref().unwrap().as_str(), "5Gi");
        assert_eq!(e[1].mount_path, "/w");
        assert!(
            Config::default().pool.is_empty(),
            "the pool is off by default"
        );

        let mut c = Config::default();
        c.apply_env(|k| (k == "COMPUTE_POOL").then(|| "reg/x:1=3, y=1".into()))
            .unwrap();
        c.validate().unwrap();
        let e = c.pool_entries();
        assert_eq!((e[0].image.as_str(), e[0].size), ("reg/x:1", 3));
        assert_eq!((e[1].image.as_str(), e[1].size), ("y", 1));
        c.apply_env(|k| (k == "COMPUTE_POOL").then(String::new))
            .unwrap();
        assert!(c.pool.is_empty());

        for bad in ["x", "x=0", "=2", "x=1,x=1"] {
            let mut c = Config::default();
            let r = c
                .apply_env(|k| (k == "COMPUTE_POOL").then(|| bad.into()))
                .and_then(|_| c.validate());
            assert!(r.is_err(), "{bad}");
        }
        let mut c = Config {
            max_sandboxes: 2,
            ..Default::default()
        };
        c.apply_env(|k| (k == "COMPUTE_POOL").then(|| "x=3".into()))
            .unwrap();
        assert!(c.validate().is_err(), "a pool over max_sandboxes");
        let r: Result<Config, _> = toml::from_str("[[pool]]\nimage = \"a\"\nsize = 1\nnope = 1\n");
        assert!(r.is_err());
    }

    #[test]
    fn bad_values_fail_validation() {
        let c = Config {
            listen: "nope".into(),
            ..Default::default()
        };
        assert!(c.validate().is_err());
        assert!(toml::from_str::<Config>("workspace_size = \"lots\"").is_err());
        assert!(toml::from_str::<Config>("min_free_disk = \"-1\"").is_err());
        let c: Config = toml::from_str("min_free_disk = \"0\"").unwrap();
        assert_eq!(c.min_free_disk.bytes(), 0);
        let c: Config = toml::from_str("workspace_size = \"4Mi\"").unwrap();
        assert!(c.validate().is_err(), "under 8Mi");
    }

    #[test]
    fn tls_settings_must_be_complete() {
        let ok: Config = toml::from_str(
            "tls_cert = \"/c.pem\"\ntls_key = \"/k.pem\"\ntls_client_ca = \"/ca.pem\"",
        )
        .unwrap();
        ok.validate().unwrap();
        for bad in [
            "tls_cert = \"/c.pem\"",
            "tls_key = \"/k.pem\"",
            "tls_client_ca = \"/ca.pem\"",
            "tls_cert = \"/c.pem\"\ntls_key = \"/k.pem\"\nlisten = \"\"",
        ] {
            let c: Config = toml::from_str(bad).unwrap();
            assert!(c.validate().is_err(), "{bad}");
        }
    }
}
