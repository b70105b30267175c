//! The node: the table of sandboxes on this machine, their lifecycle, and the ComputeService
//! that serves them.
//!
//! The daemon holds no database. Each sandbox is a containerd container whose labels are its
//! record (tenant, session, creation time, image, limits, workspace, failure); a destroyed
//! sandbox leaves a tombstone beside its soft-deleted workspace. [`Node::recover`] rebuilds the
//! table from those after a restart.

pub mod admin;
pub mod agent;
mod capacity;
mod error;
pub mod exec;
pub mod gc;
pub mod info;
mod pool;
pub mod service;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tokio::sync::watch;
use tracing::{info, instrument, warn};

use crate::config::{parse_size, Config};
use crate::metering::meter::{Meter, Persisted};
use crate::metering::{CgroupVersion, HostLimits, SandboxCgroup, Usage, CPU_PERIOD_US};
use crate::runtime::{image, spec, Runtime, SandboxLaunch, TaskState};
use crate::{volume, workspace};
pub use error::Error;

type Result<T> = std::result::Result<T, Error>;

const LABEL_PREFIX: &str = "compute.paper-board.io/";

fn label(key: &str) -> String {
    format!("{LABEL_PREFIX}{key}")
}

/// Lifecycle state of a sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Status {
    /// Recorded, being provisioned.
    Starting,
    /// Running; execs proceed.
    Ready,
    /// Start failed, the sandbox died, or max_runtime passed.
    Failed,
    /// Destroyed; the workspace is in its soft-delete grace window.
    Destroyed,
}

impl Status {
    /// The status in words, as the API spells it.
    pub fn word(self) -> &'static str {
        match self {
            Status::Starting => "STARTING",
            Status::Ready => "READY",
            Status::Failed => "FAILED",
            Status::Destroyed => "DESTROYED",
        }
    }
}

/// Resource limits of a sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Limits {
    /// CPU in millicores.
    pub cpu_millis: u32,
    /// Memory in bytes (enforced per exec; the host cgroup gets headroom above it).
    pub memory_bytes: u64,
    /// Wall-time limit of the sandbox.
    pub max_runtime: Duration,
}

/// Workspace parameters of a sandbox.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct WorkspaceSpec {
    /// Storage class.
    pub storage_class: String,
    /// Size as given (e.g. `5Gi`).
    pub size: String,
    /// Mount path inside the sandbox.
    pub mount_path: String,
}

/// A validated CreateSandbox request. Empty/zero fields take the node's defaults.
#[derive(Debug, Clone, Default)]
pub struct CreateRequest {
    /// Tenant.
    pub tenant_id: String,
    /// Session.
    pub session_id: String,
    /// Image; empty = default.
    pub image: String,
    /// Storage class; empty = default.
    pub storage_class: String,
    /// Size; empty = default.
    pub size: String,
    /// Mount path; empty = /workspace.
    pub mount_path: String,
    /// CPU millicores; 0 = default.
    pub cpu_millis: u32,
    /// Memory bytes; 0 = default.
    pub memory_bytes: u64,
    /// Max runtime; None = default.
    pub max_runtime: Option<Duration>,
}

/// The mutable state of a sandbox, published through a watch channel.
#[derive(Debug, Clone)]
pub struct State {
    /// Status.
    pub status: Status,
    /// Why it failed (empty otherwise).
    pub reason: String,
    /// Lifetime usage, once destroyed.
    pub final_usage: Option<Usage>,
}

impl State {
    /// The state channel of a sandbox that is starting.
    fn starting() -> Arc<watch::Sender<State>> {
        Arc::new(
            watch::channel(State {
                status: Status::Starting,
                reason: String::new(),
                final_usage: None,
            })
            .0,
        )
    }
}

/// One sandbox.
pub struct Sandbox {
    /// Sandbox id (a UUID; also the containerd container id).
    pub id: String,
    /// Tenant.
    pub tenant_id: String,
    /// Session.
    pub session_id: String,
    /// Image name.
    pub image: String,
    /// Creation time.
    pub created_at: SystemTime,
    /// Limits.
    pub limits: Limits,
    /// Workspace.
    pub workspace: WorkspaceSpec,
    /// An unclaimed warm-pool member (it belongs to nobody; tenant and session are empty).
    pub pool: bool,
    /// Digest of the image's target when the sandbox was booted (how a claim recognises the
    /// same image under another name, and a re-imported one as different).
    pub image_digest: String,
    /// Shared with the record that replaces this one when a pool member is claimed, so that
    /// watchers of the member see the claimed sandbox's state.
    state: Arc<watch::Sender<State>>,
    /// Serialises provisioning, claiming and teardown (shared like `state`).
    ops: Arc<tokio::sync::Mutex<()>>,
    /// The sandbox's meter.
    pub meter: Arc<Meter>,
}

impl Sandbox {
    /// The current state.
    pub fn state(&self) -> State {
        self.state.borrow().clone()
    }

    fn set_status(&self, status: Status, reason: &str) {
        self.state.send_modify(|s| {
            // DESTROYED is final, and FAILED is never turned back into READY.
            if s.status == Status::Destroyed
                || (s.status == Status::Failed && status == Status::Ready)
            {
                return;
            }
            s.status = status;
            s.reason = reason.to_string();
        });
    }

    fn metric_labels(&self) -> crate::metrics::SandboxLabels {
        crate::metrics::SandboxLabels {
            sandbox_id: self.id.clone(),
            tenant_id: self.tenant_id.clone(),
        }
    }

    fn labels(&self) -> HashMap<String, String> {
        let created = chrono::DateTime::<chrono::Utc>::from(self.created_at);
        HashMap::from([
            (label("sandbox"), "1".into()),
            (label("tenant-id"), self.tenant_id.clone()),
            (label("session-id"), self.session_id.clone()),
            (
                label("created-at"),
                created.to_rfc3339_opts(chrono::SecondsFormat::Nanos, true),
            ),
            (label("image"), self.image.clone()),
            (label("cpu-millis"), self.limits.cpu_millis.to_string()),
            (label("memory-bytes"), self.limits.memory_bytes.to_string()),
            (
                label("max-runtime-ms"),
                self.limits.max_runtime.as_millis().to_string(),
            ),
            (label("storage-class"), self.workspace.storage_class.clone()),
            (label("workspace-size"), self.workspace.size.clone()),
            (label("mount-path"), self.workspace.mount_path.clone()),
            (label("pool"), self.pool.to_string()),
            (label("image-digest"), self.image_digest.clone()),
        ])
    }

    fn from_labels(
        id: &str,
        l: &HashMap<String, String>,
        meter: impl FnOnce(Persisted) -> Arc<Meter>,
    ) -> Option<Self> {
        let get = |k: &str| l.get(&label(k)).cloned();
        get("sandbox")?;
        let created_at: SystemTime = chrono::DateTime::parse_from_rfc3339(&get("created-at")?)
            .ok()?
            .with_timezone(&chrono::Utc)
            .into();
        let limits = Limits {
            cpu_millis: get("cpu-millis")?.parse().ok()?,
            memory_bytes: get("memory-bytes")?.parse().ok()?,
            max_runtime: Duration::from_millis(get("max-runtime-ms")?.parse().ok()?),
        };
        let (status, reason) = match get("status").as_deref() {
            Some("failed") => (Status::Failed, get("reason").unwrap_or_default()),
            _ => (Status::Starting, String::new()),
        };
        // containerd drops labels with empty values: a pool member has no tenant or session.
        let pool = get("pool").as_deref() == Some("true");
        let owner = |k: &str| {
            if pool {
                Some(get(k).unwrap_or_default())
            } else {
                get(k)
            }
        };
        Some(Sandbox {
            id: id.to_string(),
            tenant_id: owner("tenant-id")?,
            session_id: owner("session-id")?,
            image: get("image")?,
            created_at,
            limits,
            workspace: WorkspaceSpec {
                storage_class: get("storage-class")?,
                size: get("workspace-size")?,
                mount_path: get("mount-path")?,
            },
            pool,
            image_digest: get("image-digest").unwrap_or_default(),
            state: Arc::new(
                watch::channel(State {
                    status,
                    reason,
                    final_usage: None,
                })
                .0,
            ),
            ops: Arc::default(),
            meter: meter(
                get("usage")
                    .and_then(|u| serde_json::from_str(&u).ok())
                    .unwrap_or_default(),
            ),
        })
    }
}

/// What DestroySandbox leaves beside the soft-deleted workspace.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Tombstone {
    /// Sandbox id.
    pub id: String,
    /// Tenant.
    pub tenant_id: String,
    /// Session.
    pub session_id: String,
    /// Image.
    pub image: String,
    /// Creation time, RFC 3339.
    pub created_at: String,
    /// Destruction time, RFC 3339.
    pub destroyed_at: String,
    /// When GC may delete the workspace, RFC 3339.
    pub delete_after: String,
    /// Limits.
    pub limits: Limits,
    /// Workspace.
    pub workspace: WorkspaceSpec,
    /// Lifetime usage.
    pub usage: Usage,
    /// Failure reason, if it had failed before destruction.
    pub reason: String,
}

#[derive(Default)]
struct Table {
    by_id: HashMap<String, Arc<Sandbox>>,
    by_session: HashMap<(String, String), String>,
}

struct Inner {
    cfg: Config,
    rt: Runtime,
    relay: crate::relay::Relay,
    cgroup_version: CgroupVersion,
    table: Mutex<Table>,
    helpers_dir: Option<PathBuf>,
    /// Wakes the warm pool's refill loop (after a claim).
    pool_wake: tokio::sync::Notify,
}

/// The node: sandboxes on this machine.
#[derive(Clone)]
pub struct Node {
    inner: Arc<Inner>,
}

/// Runs a blocking closure off the async runtime, bounded by a timeout.
pub async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T> {
    match tokio::time::timeout(Duration::from_secs(60), tokio::task::spawn_blocking(f)).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(Error::Internal(format!("blocking task failed: {e}"))),
        Err(_) => Err(Error::Internal("blocking task timed out".into())),
    }
}

/// Copies the init helper into `<state_dir>/helpers` (when configured and present) and returns
/// that directory.
fn install_helpers(cfg: &Config) -> Option<PathBuf> {
    if cfg.init_helper.as_os_str().is_empty() || !cfg.init_helper.is_file() {
        return None;
    }
    let dir = cfg.state_dir.join("helpers");
    let dst = dir.join("busybox");
    let same = std::fs::read(&dst).ok() == std::fs::read(&cfg.init_helper).ok();
    if !same {
        let tmp = dir.join("busybox.tmp");
        let res = std::fs::create_dir_all(&dir)
            .and_then(|_| std::fs::copy(&cfg.init_helper, &tmp))
            .and_then(|_| std::fs::rename(&tmp, &dst));
        if let Err(e) = res {
            warn!(error = %e, "could not install the init helper; using the image's /bin/sh");
            return None;
        }
    }
    if cfg.agent {
        let src = if cfg.agent_binary.as_os_str().is_empty() {
            std::env::current_exe()
                .ok()
                .and_then(|e| e.parent().map(|d| d.join("sandbox-agent")))
                .unwrap_or_default()
        } else {
            cfg.agent_binary.clone()
        };
        let dst = dir.join("sandbox-agent");
        match std::fs::read(&src) {
            Err(e) => {
                warn!(error = %e, src = %src.display(), "no sandbox-agent; execs use containerd exec")
            }
            Ok(bin) if elf_interpreter(&bin) => warn!(
                src = %src.display(),
                "sandbox-agent is dynamically linked: it runs only in images with a compatible glibc \
                 (build it with scripts/build-agent)"
            ),
            Ok(_) => {}
        }
        if std::fs::read(&dst).ok() != std::fs::read(&src).ok() {
            let tmp = dir.join("sandbox-agent.tmp");
            if let Err(e) = std::fs::copy(&src, &tmp).and_then(|_| std::fs::rename(&tmp, &dst)) {
                warn!(error = %e, src = %src.display(), "could not install sandbox-agent; execs use containerd");
            }
        }
    }
    Some(dir)
}

/// Whether an ELF64 executable names a program interpreter (is dynamically linked).
pub fn elf_interpreter(bin: &[u8]) -> bool {
    const PT_INTERP: u32 = 3;
    let u16_at = |o: usize| bin.get(o..o + 2).map(|b| u16::from_le_bytes([b[0], b[1]]));
    let u32_at = |o: usize| {
        bin.get(o..o + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    let u64_at = |o: usize| {
        bin.get(o..o + 8)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_le_bytes)
    };
    if !bin.starts_with(b"\x7fELF\x02\x01") {
        return false;
    }
    let (Some(phoff), Some(size), Some(num)) = (u64_at(0x20), u16_at(0x36), u16_at(0x38)) else {
        return false;
    };
    (0..usize::from(num)).any(|i| u32_at(phoff as usize + i * usize::from(size)) == Some(PT_INTERP))
}

/// Validates a mount path: absolute and clean.
pub fn validate_mount_path(p: &str) -> Result<()> {
    let bad = |why: &str| Err(Error::InvalidArgument(format!("mount_path {p:?} {why}")));
    if !p.starts_with('/') {
        return bad("must be absolute");
    }
    if p == "/" {
        return bad("must not be /");
    }
    if p.contains('\0') || p.ends_with('/') || p.contains("//") {
        return bad("must be clean");
    }
    if p.split('/').any(|c| c == "." || c == "..") {
        return bad("must be clean");
    }
    for reserved in ["/proc", "/dev", "/sys", "/.compute"] {
        if p == reserved || p.starts_with(&format!("{reserved}/")) {
            return bad("is reserved");
        }
    }
    Ok(())
}

/// Parses a sandbox id: it must be a UUID.
pub fn parse_id(id: &str) -> Result<String> {
    uuid::Uuid::parse_str(id)
        .map(|u| u.hyphenated().to_string())
        .map_err(|_| Error::InvalidArgument(format!("sandbox_id {id:?} is not a valid UUID")))
}

impl Node {
    /// Builds the node over a runtime. Call [`Node::recover`] before serving.
    pub fn new(cfg: Config, rt: Runtime) -> Self {
        let cgroup_version = CgroupVersion::detect(&cfg.cgroup_root);
        let helpers_dir = install_helpers(&cfg);
        let credentials = crate::relay::auth::Credentials::new(
            crate::relay::auth::Credentials::path_in(&cfg.state_dir),
        );
        Self {
            inner: Arc::new_cyclic(|me: &std::sync::Weak<Inner>| {
                // A network worker may never take the id of a sandbox this node knows (live,
                // destroyed or in the warm pool): that sandbox's worker is its own agent.
                let me = me.clone();
                let hosted = move |id: &str| {
                    let Some(inner) = me.upgrade() else {
                        return false;
                    };
                    let id = uuid::Uuid::parse_str(id)
                        .map(|u| u.hyphenated().to_string())
                        .unwrap_or_else(|_| id.to_string());
                    Node { inner }.table().by_id.contains_key(&id)
                };
                Inner {
                    relay: crate::relay::Relay::new(
                        crate::relay::Settings {
                            heartbeat_timeout: Duration::from_millis(
                                cfg.worker_heartbeat_timeout_ms,
                            ),
                            worker_wait: Duration::from_millis(cfg.worker_wait_ms),
                        },
                        credentials,
                        Box::new(hosted),
                    ),
                    cfg,
                    rt,
                    cgroup_version,
                    table: Mutex::new(Table::default()),
                    helpers_dir,
                    pool_wake: tokio::sync::Notify::new(),
                }
            }),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.inner.cfg
    }

    /// The sandbox.v1 relay.
    pub fn relay(&self) -> &crate::relay::Relay {
        &self.inner.relay
    }

    /// The runtime.
    pub fn runtime(&self) -> &Runtime {
        &self.inner.rt
    }

    /// Whether the init helper (a static busybox at `/.compute/busybox`) is mounted in sandboxes.
    pub fn has_helpers(&self) -> bool {
        self.inner.helpers_dir.is_some()
    }

    /// The cgroup version of the host.
    pub fn cgroup_version(&self) -> CgroupVersion {
        self.inner.cgroup_version
    }

    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        // A panic while holding the lock cannot leave the table half-updated (every update is
        // a single insert/remove), so a poisoned lock is still usable.
        self.inner.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Looks a sandbox up by id. Unclaimed warm-pool members belong to nobody: NOT_FOUND.
    pub fn get(&self, id: &str) -> Result<Arc<Sandbox>> {
        let id = parse_id(id)?;
        self.table()
            .by_id
            .get(&id)
            .filter(|sb| !sb.pool)
            .cloned()
            .ok_or(Error::NotFound(id))
    }

    /// Every sandbox the node knows, destroyed ones and warm-pool members included.
    pub fn list(&self) -> Vec<Arc<Sandbox>> {
        let mut v: Vec<_> = self.table().by_id.values().cloned().collect();
        v.sort_by_key(|s| s.created_at);
        v
    }

    /// The cgroup of a sandbox.
    pub fn cgroup(&self, id: &str) -> SandboxCgroup {
        SandboxCgroup::new(
            &self.inner.cfg.cgroup_root,
            self.inner.cgroup_version,
            &self.cgroups_path(id),
        )
    }

    fn cgroups_path(&self, id: &str) -> String {
        format!("/{}/{}", self.inner.cfg.cgroup_parent.trim_matches('/'), id)
    }

    fn paths(&self, id: &str) -> workspace::Paths {
        workspace::Paths::new(&self.inner.cfg.state_dir, id)
    }

    /// The workspace handle of a sandbox (for file RPCs). Works while STARTING and READY (and
    /// FAILED, for post-mortems); DESTROYED is FAILED_PRECONDITION.
    pub async fn workspace(&self, id: &str) -> Result<(Arc<Sandbox>, workspace::Workspace)> {
        let sb = self.get(id)?;
        if sb.state().status == Status::Destroyed {
            return Err(Error::FailedPrecondition {
                id: sb.id.clone(),
                state: "DESTROYED".into(),
            });
        }
        let paths = self.paths(&sb.id);
        let mount = sb.workspace.mount_path.clone();
        let ws = blocking(move || {
            if volume::has_image(&paths) {
                volume::attach(&paths)
                    .map_err(|e| Error::Internal(format!("attach workspace volume: {e}")))?;
            }
            workspace::Workspace::open(&paths.data, &mount).map_err(Error::from)
        })
        .await??;
        Ok((sb, ws))
    }

    /// CreateSandbox: records the sandbox and provisions it in the background. A live (STARTING
    /// or READY) sandbox of the same tenant and session is returned instead of a new one.
    #[instrument(skip_all, fields(tenant_id = %req.tenant_id, session_id = %req.session_id))]
    pub async fn create(&self, req: CreateRequest) -> Result<Arc<Sandbox>> {
        let cfg = &self.inner.cfg;
        if req.tenant_id.is_empty() || req.session_id.is_empty() {
            return Err(Error::InvalidArgument(
                "tenant_id and session_id are required".into(),
            ));
        }
        let mount_path = if req.mount_path.is_empty() {
            "/workspace".to_string()
        } else {
            req.mount_path.clone()
        };
        validate_mount_path(&mount_path)?;
        let size = if req.size.is_empty() {
            cfg.workspace_size.clone()
        } else {
            req.size.clone()
        };
        if parse_size(&size).is_none() {
            return Err(Error::InvalidArgument(format!(
                "workspace size {size:?} is not a quantity like 5Gi"
            )));
        }
        let size_bytes = parse_size(&size).unwrap_or(0);
        let max = parse_size(&cfg.max_workspace_size).unwrap_or(u64::MAX);
        if size_bytes > max {
            return Err(Error::InvalidArgument(format!(
                "workspace size {size:?} is over the node's maximum {}",
                cfg.max_workspace_size
            )));
        }
        if size_bytes < (8 << 20) {
            return Err(Error::InvalidArgument(format!(
                "workspace size {size:?} is under the minimum of 8Mi"
            )));
        }
        let storage_class = if req.storage_class.is_empty() {
            cfg.storage_class.clone()
        } else {
            req.storage_class.clone()
        };
        if !cfg.storage_classes.contains_key(&storage_class) {
            return Err(Error::InvalidArgument(format!(
                "unknown storage_class {storage_class:?} (this node has: {})",
                cfg.storage_classes
                    .keys()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        let max_runtime = req
            .max_runtime
            .unwrap_or(Duration::from_secs(cfg.default_max_runtime_secs));
        if max_runtime.is_zero() || max_runtime > Duration::from_secs(cfg.max_max_runtime_secs) {
            return Err(Error::InvalidArgument(format!(
                "max_runtime must be between 1s and {}s",
                cfg.max_max_runtime_secs
            )));
        }
        let limits = Limits {
            cpu_millis: if req.cpu_millis == 0 {
                cfg.default_cpu_millis
            } else {
                req.cpu_millis
            },
            memory_bytes: if req.memory_bytes == 0 {
                cfg.default_memory_bytes
            } else {
                req.memory_bytes
            },
            max_runtime,
        };
        if limits.memory_bytes < (32 << 20) {
            return Err(Error::InvalidArgument(
                "memory_bytes must be at least 32 MiB".into(),
            ));
        }
        if limits.cpu_millis < 10 {
            return Err(Error::InvalidArgument(
                "cpu_millis must be at least 10".into(),
            ));
        }
        let image = if req.image.is_empty() {
            cfg.sandbox_image.clone()
        } else {
            req.image.clone()
        };
        let workspace = WorkspaceSpec {
            storage_class,
            size,
            mount_path,
        };

        let session_key = (req.tenant_id.clone(), req.session_id.clone());
        let live_session = |t: &Table| {
            t.by_session
                .get(&session_key)
                .and_then(|id| t.by_id.get(id))
                .filter(|sb| matches!(sb.state().status, Status::Starting | Status::Ready))
                .cloned()
        };
        {
            let t = self.table();
            if let Some(existing) = live_session(&t) {
                return Ok(existing);
            }
            if cfg.draining {
                return Err(Error::Unavailable(
                    "node is draining: it takes no new sandboxes".into(),
                ));
            }
        }
        // Warm path: a pool member that fits, READY at once.
        match self.claim(&req, &image, limits, &workspace).await? {
            pool::Claim::Claimed(sb) | pool::Claim::Existing(sb) => return Ok(sb),
            pool::Claim::Miss => {}
        }
        let mut evicted = None;
        let sb = {
            let mut t = self.table();
            if let Some(existing) = live_session(&t) {
                return Ok(existing);
            }
            if cfg.draining {
                return Err(Error::Unavailable(
                    "node is draining: it takes no new sandboxes".into(),
                ));
            }
            // Pool members count toward the maximum, but a tenant's sandbox comes first: at
            // the maximum, one member (the youngest) makes room.
            let live: Vec<&Arc<Sandbox>> = t
                .by_id
                .values()
                .filter(|s| matches!(s.state().status, Status::Starting | Status::Ready))
                .collect();
            if live.len() >= cfg.max_sandboxes as usize {
                let Some(member) = live
                    .iter()
                    .filter(|s| s.pool)
                    .max_by_key(|s| s.created_at)
                    .map(|s| (*s).clone())
                else {
                    return Err(Error::ResourceExhausted(format!(
                        "node is at its maximum of {} sandboxes",
                        cfg.max_sandboxes
                    )));
                };
                t.by_id.remove(&member.id);
                evicted = Some(member);
            }
            let id = uuid::Uuid::new_v4().to_string();
            let sb = Arc::new(Sandbox {
                id: id.clone(),
                tenant_id: req.tenant_id.clone(),
                session_id: req.session_id.clone(),
                image,
                created_at: SystemTime::now(),
                limits,
                workspace,
                pool: false,
                image_digest: String::new(),
                state: State::starting(),
                ops: Arc::default(),
                meter: self.meter_for(&id, Persisted::default()),
            });
            t.by_session.insert(session_key.clone(), sb.id.clone());
            t.by_id.insert(sb.id.clone(), sb.clone());
            sb
        };
        if let Some(member) = evicted {
            info!(sandbox_id = %member.id, "pool member makes room for a cold create");
            let node = self.clone();
            tokio::spawn(async move { node.retire(member).await });
        }
        // The record goes to containerd before we answer, so a restart right after still knows
        // the sandbox. Holding `ops` keeps a racing Destroy out until provisioning is done.
        let guard = sb.ops.lock().await;
        if let Err(e) = self.record(&sb).await {
            let paths = self.paths(&sb.id);
            let _ = blocking(move || volume::delete(&paths)).await;
            let mut t = self.table();
            t.by_id.remove(&sb.id);
            if t.by_session.get(&session_key) == Some(&sb.id) {
                t.by_session.remove(&session_key);
            }
            return Err(e);
        }
        drop(guard);
        // Usage starts now: not what mkfs and mount wrote to the volume.
        let meter = sb.meter.clone();
        let _ = blocking(move || meter.rebase_disk()).await;
        info!(sandbox_id = %sb.id, image = %sb.image, "sandbox created");
        self.spawn_provision(sb.clone());
        self.spawn_deadline(sb.clone());
        Ok(sb)
    }

    fn backend(&self, sb: &Sandbox) -> volume::Backend {
        self.inner
            .cfg
            .storage_classes
            .get(&sb.workspace.storage_class)
            .copied()
            .unwrap_or(volume::Backend::Dir)
    }

    async fn record(&self, sb: &Sandbox) -> Result<()> {
        let paths = self.paths(&sb.id);
        let backend = self.backend(sb);
        let size = parse_size(&sb.workspace.size).unwrap_or(0);
        self.check_free_disk().await?;
        self.check_loop_devices(backend).await?;
        let p2 = paths.clone();
        blocking(move || volume::create(&p2, backend, size))
            .await?
            .map_err(|e| capacity::volume_error(&sb.id, e))?;
        // The spec written now is a placeholder; provisioning writes the real one (with the
        // image's environment) through Containers.Update once the image is resolved, before
        // the task is created from it.
        let spec_json = self.spec_for(sb, &[]);
        self.inner
            .rt
            .create_container(SandboxLaunch {
                id: &sb.id,
                labels: sb.labels(),
                spec: spec_json,
                image: &sb.image,
            })
            .await?;
        Ok(())
    }

    fn spec_for(&self, sb: &Sandbox, image_env: &[String]) -> Vec<u8> {
        let cfg = &self.inner.cfg;
        let paths = self.paths(&sb.id);
        let init_args: Vec<String> = if self.agent_enabled() {
            vec![
                "/.compute/sandbox-agent".into(),
                "--init".into(),
                "--stdio".into(),
                "--sandbox-id".into(),
                sb.id.clone(),
                "--capacity".into(),
                cfg.agent_capacity.to_string(),
                "--grace".into(),
                cfg.cancel_grace_secs.to_string(),
                // Liveness is the sandbox's own state (no heartbeat deadline): a rare beat.
                "--heartbeat".into(),
                "60".into(),
            ]
        } else if self.inner.helpers_dir.is_some() {
            vec![
                "/.compute/busybox".into(),
                "sh".into(),
                "-c".into(),
                "trap 'exit 0' TERM INT; while :; do /.compute/busybox sleep 3600 & wait $!; done"
                    .into(),
            ]
        } else {
            vec![
                "/bin/sh".into(),
                "-c".into(),
                "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done".into(),
            ]
        };
        let short = &sb.id[..8];
        let host = self.host_limits(&sb.limits);
        spec::sandbox_spec(&spec::SandboxSpec {
            hostname: format!("sandbox-{short}"),
            init_args,
            env: image_env.to_vec(),
            workspace_dir: &paths.data,
            mount_path: &sb.workspace.mount_path,
            helpers_dir: self.inner.helpers_dir.as_deref(),
            cgroups_path: self.cgroups_path(&sb.id),
            cpu_quota: host.cpu_quota,
            memory_limit: host.memory_limit,
            pids_limit: host.pids_limit,
        })
    }

    /// The host cgroup limits of a sandbox with `limits`: the CFS quota of its millicores, and
    /// its memory plus headroom for the sentry and gofer (memory_bytes itself is enforced per
    /// exec).
    fn host_limits(&self, limits: &Limits) -> HostLimits {
        let cfg = &self.inner.cfg;
        HostLimits {
            cpu_quota: i64::from(limits.cpu_millis) * (CPU_PERIOD_US as i64 / 1000),
            memory_limit: (limits.memory_bytes
                + cfg.memory_headroom_bytes.max(limits.memory_bytes / 4))
                as i64,
            pids_limit: cfg.pids_limit,
        }
    }

    fn spawn_provision(&self, sb: Arc<Sandbox>) {
        let node = self.clone();
        tokio::spawn(async move {
            let _guard = sb.ops.lock().await;
            if sb.state().status != Status::Starting {
                return;
            }
            match node.provision(&sb).await {
                Ok(()) => {
                    sb.set_status(Status::Ready, "");
                    info!(sandbox_id = %sb.id, "sandbox ready");
                    node.spawn_exit_watch(sb.clone());
                    if node.agent_enabled() {
                        node.spawn_agent_link(sb.clone(), false);
                    }
                }
                Err(e) => {
                    warn!(sandbox_id = %sb.id, error = %e, "sandbox failed to start");
                    node.fail(&sb, &format!("start failed: {e}")).await;
                    node.agent_gone(&sb.id).await;
                }
            }
        });
    }

    async fn provision(&self, sb: &Sandbox) -> Result<()> {
        let rt = &self.inner.rt;
        let cfg = &self.inner.cfg;
        let resolved = match image::resolve(&rt.ctr, &sb.image).await {
            Err(image::Error::NotFound(_)) if cfg.pull_missing => {
                info!(sandbox_id = %sb.id, image = %sb.image, "image not local: pulling");
                image::pull(&rt.ctr, &sb.image, &cfg.insecure_registries).await?;
                image::resolve(&rt.ctr, &sb.image).await?
            }
            other => other?,
        };
        // Put the image's environment into the container's spec, in place: deleting and
        // re-creating the container would lose the record to a crash in between.
        let spec_json = self.spec_for(sb, &resolved.env);
        let current = rt.ctr.get_container(&sb.id).await?;
        let spec_now = current.spec.map(|a| a.value).unwrap_or_default();
        if spec_now != spec_json {
            rt.ctr.set_spec(&sb.id, spec_json).await?;
        }
        let (stdin, stdout, stderr) = if self.agent_enabled() {
            let (i, o) = self.prepare_agent_io(&sb.id).await?;
            (i, o, self.agent_stderr(&sb.id))
        } else {
            (String::new(), String::new(), String::new())
        };
        rt.start_task(&sb.id, &resolved.chain_id, [&stdin, &stdout, &stderr])
            .await?;
        Ok(())
    }

    /// Marks a sandbox FAILED (in memory and in its container labels) and stops its task.
    async fn fail(&self, sb: &Sandbox, reason: &str) {
        sb.set_status(Status::Failed, reason);
        let labels = HashMap::from([
            (label("status"), "failed".to_string()),
            (label("reason"), reason.chars().take(1000).collect()),
        ]);
        if let Err(e) = self.inner.rt.ctr.set_labels(&sb.id, labels).await {
            warn!(sandbox_id = %sb.id, error = %e, "could not record failure");
        }
        if let Ok(state) = self.inner.rt.ctr.task_state(&sb.id, "").await {
            if !matches!(state, TaskState::Missing | TaskState::Stopped(_)) {
                let _ = self.inner.rt.ctr.kill(&sb.id, "", 9, true).await;
            }
        }
    }

    fn spawn_deadline(&self, sb: Arc<Sandbox>) {
        let node = self.clone();
        tokio::spawn(async move {
            let deadline = sb.created_at + sb.limits.max_runtime;
            let left = deadline
                .duration_since(SystemTime::now())
                .unwrap_or(Duration::ZERO);
            let mut rx = sb.state.subscribe();
            let sleep = tokio::time::sleep(left);
            tokio::pin!(sleep);
            loop {
                tokio::select! {
                    _ = &mut sleep => break,
                    r = rx.changed() => {
                        if r.is_err() || matches!(rx.borrow().status, Status::Destroyed | Status::Failed) {
                            return;
                        }
                    }
                }
            }
            let _g = sb.ops.lock().await;
            if matches!(sb.state().status, Status::Starting | Status::Ready) {
                warn!(sandbox_id = %sb.id, "max_runtime exceeded");
                node.fail(&sb, "max_runtime exceeded").await;
            }
        });
    }

    /// Watches the sandbox's init task: when it exits on its own, the sandbox is FAILED.
    fn spawn_exit_watch(&self, sb: Arc<Sandbox>) {
        let node = self.clone();
        tokio::spawn(async move {
            let ctr = node.inner.rt.ctr.clone();
            loop {
                if matches!(sb.state().status, Status::Destroyed | Status::Failed) {
                    return;
                }
                match ctr.wait(&sb.id, "").await {
                    Ok(code) => {
                        let _g = sb.ops.lock().await;
                        if sb.state().status == Status::Ready {
                            warn!(sandbox_id = %sb.id, code, "sandbox exited");
                            node.fail(&sb, &format!("sandbox exited with status {code}"))
                                .await;
                        }
                        return;
                    }
                    Err(e) if e.is_not_found() => return,
                    Err(_) => {
                        // containerd restarting: try again shortly.
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                }
            }
        });
    }

    /// Cumulative usage since creation (lifetime usage once destroyed).
    pub async fn usage(&self, sb: &Sandbox) -> Usage {
        if let Some(u) = sb.state().final_usage {
            return u;
        }
        let meter = sb.meter.clone();
        blocking(move || meter.lifetime()).await.unwrap_or_default()
    }

    fn meter_for(&self, id: &str, persisted: Persisted) -> Arc<Meter> {
        Arc::new(Meter::new(self.cgroup(id), self.paths(id).data, persisted))
    }

    /// One loop for the whole node: every `meter_interval_ms` it ticks the meter of every live
    /// sandbox in a single blocking task (for lifetime memory averages and peaks between
    /// execs), and every `usage_persist_secs` writes changed meter states to the container
    /// labels, so usage survives a daemon restart.
    pub fn spawn_meter_loop(&self) -> tokio::task::JoinHandle<()> {
        let node = self.clone();
        tokio::spawn(async move {
            let cfg = &node.inner.cfg;
            let mut tick =
                tokio::time::interval(Duration::from_millis(cfg.meter_interval_ms.max(100)));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let persist_every = Duration::from_secs(cfg.usage_persist_secs.max(1));
            let mut last_persist = std::time::Instant::now();
            let mut persisted: HashMap<String, Persisted> = HashMap::new();
            loop {
                tick.tick().await;
                let live: Vec<Arc<Sandbox>> = node
                    .list()
                    .into_iter()
                    .filter(|sb| sb.state().status != Status::Destroyed)
                    .collect();
                let meters: Vec<Arc<Meter>> = live.iter().map(|sb| sb.meter.clone()).collect();
                let usages =
                    blocking(move || meters.iter().map(|m| m.lifetime()).collect::<Vec<_>>())
                        .await
                        .unwrap_or_default();
                let metrics = &crate::metrics::METRICS;
                for (sb, u) in live.iter().zip(usages.iter()) {
                    // A sandbox destroyed meanwhile has had its series removed: keep it so.
                    // Pool members belong to nobody: no tenant series (yet).
                    if sb.state().status != Status::Destroyed && !sb.pool {
                        metrics.sandbox_usage(&sb.metric_labels(), u);
                    }
                }
                let mut by_status: HashMap<&'static str, i64> = [
                    ("STARTING", 0),
                    ("READY", 0),
                    ("FAILED", 0),
                    ("DESTROYED", 0),
                ]
                .into();
                for sb in node.list().iter().filter(|sb| !sb.pool) {
                    *by_status.entry(sb.state().status.word()).or_default() += 1;
                }
                for (status, n) in by_status {
                    metrics
                        .sandboxes
                        .get_or_create(&crate::metrics::StatusLabels {
                            status: status.into(),
                        })
                        .set(n);
                }
                if last_persist.elapsed() < persist_every {
                    continue;
                }
                last_persist = std::time::Instant::now();
                persisted.retain(|id, _| live.iter().any(|sb| &sb.id == id));
                // A pool member's usage is reset when it is claimed: nothing to keep.
                for sb in live.iter().filter(|sb| !sb.pool) {
                    let meter = sb.meter.clone();
                    let Ok(p) = blocking(move || meter.persisted()).await else {
                        continue;
                    };
                    if persisted.get(&sb.id) != Some(&p) {
                        node.persist_usage(sb, &p).await;
                        persisted.insert(sb.id.clone(), p);
                    }
                }
            }
        })
    }

    async fn persist_usage(&self, sb: &Sandbox, p: &Persisted) {
        let Ok(json) = serde_json::to_string(p) else {
            return;
        };
        let labels = HashMap::from([(label("usage"), json)]);
        if let Err(e) = self.inner.rt.ctr.set_labels(&sb.id, labels).await {
            tracing::debug!(sandbox_id = %sb.id, error = %e, "could not persist usage");
        }
    }

    /// DestroySandbox: stops the sandbox, removes everything it made in containerd and on the
    /// host, and soft-deletes its workspace. Idempotent: destroying again returns the same usage.
    #[instrument(skip_all, fields(sandbox_id = %id))]
    pub async fn destroy(&self, id: &str) -> Result<(Arc<Sandbox>, Usage)> {
        let sb = self.get(id)?;
        let held = sb.clone();
        let _g = held.ops.lock().await;
        if let Some(u) = sb.state().final_usage {
            return Ok((sb, u));
        }
        // Flush the workspace so that every byte written is counted, then take the final
        // reading while the cgroup still exists.
        let data = self.paths(&sb.id).data;
        let _ = blocking(move || crate::metering::disk::flush(&data)).await;
        let usage = self.usage(&sb).await;
        self.inner.rt.teardown(&sb.id).await?;
        self.agent_gone(&sb.id).await;
        let cg = self.cgroup(&sb.id);
        let exec_dir = self.inner.cfg.run_dir.join("io").join(&sb.id);
        let now = SystemTime::now();
        let grace = Duration::from_secs(self.inner.cfg.workspace_grace_secs);
        let rfc = |t: SystemTime| {
            chrono::DateTime::<chrono::Utc>::from(t)
                .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
        };
        let tomb = Tombstone {
            id: sb.id.clone(),
            tenant_id: sb.tenant_id.clone(),
            session_id: sb.session_id.clone(),
            image: sb.image.clone(),
            created_at: rfc(sb.created_at),
            destroyed_at: rfc(now),
            delete_after: rfc(now + grace),
            limits: sb.limits,
            workspace: sb.workspace.clone(),
            usage,
            reason: sb.state().reason,
        };
        let paths = self.paths(&sb.id);
        blocking(move || -> std::io::Result<()> {
            // runsc removes its cgroups; remove what it may leave (empty dirs only).
            for d in cg.dirs() {
                let _ = std::fs::remove_dir(d);
            }
            let _ = std::fs::remove_dir_all(&exec_dir);
            // Soft delete: the volume is detached (unmounted, loop device released) and kept.
            volume::detach(&paths).map_err(std::io::Error::other)?;
            std::fs::create_dir_all(&paths.base)?;
            let tmp = paths.tombstone.with_extension("tmp");
            std::fs::write(&tmp, serde_json::to_vec_pretty(&tomb).unwrap_or_default())?;
            std::fs::rename(&tmp, &paths.tombstone)
        })
        .await?
        .map_err(|e| Error::Internal(format!("write tombstone: {e}")))?;
        sb.state.send_modify(|s| {
            s.status = Status::Destroyed;
            s.final_usage = Some(usage);
        });
        {
            let mut t = self.table();
            let key = (sb.tenant_id.clone(), sb.session_id.clone());
            if t.by_session.get(&key) == Some(&sb.id) {
                t.by_session.remove(&key);
            }
        }
        crate::metrics::METRICS.forget_sandbox(&sb.metric_labels());
        info!(sandbox_id = %sb.id, cpu_ms = usage.cpu_ms, "sandbox destroyed");
        Ok((sb, usage))
    }

    /// Rebuilds the table from containerd labels and tombstones, resumes provisioning of
    /// sandboxes caught mid-start, and re-arms deadlines and exit watches.
    pub async fn recover(&self) -> Result<usize> {
        // External workers' credentials survive restarts; a store that cannot be read stops
        // the node rather than silently forgetting (or half-reading) them.
        let relay = self.relay().clone();
        let creds = blocking(move || relay.credentials().load()).await??;
        info!(credentials = creds, "worker credentials loaded");
        let rt = &self.inner.rt;
        let containers = rt.ctr.list_containers().await?;
        let mut n = 0;
        for c in containers {
            let Some(sb) = Sandbox::from_labels(&c.id, &c.labels, |p| self.meter_for(&c.id, p))
            else {
                continue;
            };
            let sb = Arc::new(sb);
            // Volumes of live sandboxes are mounted again after a reboot.
            let paths = self.paths(&sb.id);
            match blocking(move || {
                if volume::has_image(&paths) && !volume::is_mounted(&paths.data) {
                    volume::attach(&paths).map(|_| true)
                } else {
                    Ok(false)
                }
            })
            .await?
            {
                // A fresh loop device counts from zero again.
                Ok(true) => sb.meter.rebase_disk(),
                Ok(false) => {}
                Err(e) => {
                    warn!(sandbox_id = %sb.id, error = %e, "could not attach workspace volume")
                }
            }
            self.reap_orphaned_execs(&sb).await;
            if sb.state().status == Status::Starting {
                // Unknown: the shim did not answer within containerd's state timeout (2 s),
                // e.g. busy with execs a crash cut short. Ask again; a task that still answers
                // Unknown exists and is running something: it is not provisioned again.
                let mut state = rt.ctr.task_state(&sb.id, "").await?;
                for _ in 0..5 {
                    if state != TaskState::Unknown {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    state = rt.ctr.task_state(&sb.id, "").await?;
                }
                info!(sandbox_id = %sb.id, ?state, "recovering sandbox");
                match state {
                    TaskState::Running | TaskState::Paused | TaskState::Unknown => {
                        sb.set_status(Status::Ready, "")
                    }
                    TaskState::Stopped(code) => {
                        self.fail(&sb, &format!("sandbox exited with status {code}"))
                            .await
                    }
                    // Caught mid-provisioning: finish it.
                    _ => {}
                }
            }
            {
                let mut t = self.table();
                if !sb.pool {
                    t.by_session
                        .insert((sb.tenant_id.clone(), sb.session_id.clone()), sb.id.clone());
                }
                t.by_id.insert(sb.id.clone(), sb.clone());
            }
            match sb.state().status {
                Status::Starting => self.spawn_provision(sb.clone()),
                Status::Ready => {
                    self.spawn_exit_watch(sb.clone());
                    if self.agent_io_exists(&sb.id) {
                        self.spawn_agent_link(sb.clone(), true);
                    }
                }
                _ => {}
            }
            // Pool members have no deadline until claimed.
            if !sb.pool {
                self.spawn_deadline(sb);
            }
            n += 1;
        }
        // Tombstones of destroyed sandboxes, for Describe and idempotent Destroy until GC.
        let dir = self.inner.cfg.state_dir.clone();
        let tombs = blocking(move || gc::tombstones(&dir)).await?;
        let mut t = self.table();
        for tomb in tombs {
            if t.by_id.contains_key(&tomb.id) {
                continue;
            }
            let created_at = chrono::DateTime::parse_from_rfc3339(&tomb.created_at)
                .map(|d| SystemTime::from(d.with_timezone(&chrono::Utc)))
                .unwrap_or(SystemTime::UNIX_EPOCH);
            let sb = Sandbox {
                id: tomb.id.clone(),
                tenant_id: tomb.tenant_id,
                session_id: tomb.session_id,
                image: tomb.image,
                created_at,
                limits: tomb.limits,
                workspace: tomb.workspace,
                pool: false,
                image_digest: String::new(),
                state: Arc::new(
                    watch::channel(State {
                        status: Status::Destroyed,
                        reason: tomb.reason,
                        final_usage: Some(tomb.usage),
                    })
                    .0,
                ),
                ops: Arc::default(),
                meter: self.meter_for(&tomb.id, Persisted::default()),
            };
            t.by_id.insert(tomb.id, Arc::new(sb));
        }
        Ok(n)
    }

    /// Waits until the sandbox is READY, or fails with the right error.
    pub async fn wait_ready(&self, sb: &Sandbox) -> Result<()> {
        let mut rx = sb.state.subscribe();
        let wait = async {
            loop {
                let st = rx.borrow_and_update().clone();
                match st.status {
                    Status::Ready => return Ok(()),
                    Status::Failed | Status::Destroyed => {
                        return Err(Error::FailedPrecondition {
                            id: sb.id.clone(),
                            state: if st.reason.is_empty() {
                                st.status.word().to_string()
                            } else {
                                format!("{} ({})", st.status.word(), st.reason)
                            },
                        })
                    }
                    Status::Starting => {}
                }
                if rx.changed().await.is_err() {
                    return Err(Error::Internal("sandbox state dropped".into()));
                }
            }
        };
        match tokio::time::timeout(self.inner.cfg.ready_wait(), wait).await {
            Ok(r) => r,
            Err(_) => Err(Error::NotReady(sb.id.clone())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn dynamic_executables_are_told_apart() {
        // This test binary is dynamically linked; the static agent is checked by scripts/build-agent
        // and tests/agent.rs.
        let me = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        assert!(elf_interpreter(&me));
        assert!(!elf_interpreter(b"#!/bin/sh\n"));
        let mut fake = me[..64].to_vec();
        fake[0x38] = 0; // no program headers
        fake[0x39] = 0;
        assert!(!elf_interpreter(&fake));
    }

    #[test]
    fn mount_paths() {
        for ok in ["/workspace", "/home/user/work", "/w"] {
            validate_mount_path(ok).unwrap();
        }
        for bad in [
            "workspace",
            "/",
            "/a/../b",
            "/a/./b",
            "/a//b",
            "/a/",
            "/proc/x",
            "/dev",
            "",
        ] {
            assert!(validate_mount_path(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn ids_must_be_uuids() {
        assert!(parse_id("f47ac10b-58cc-4372-a567-0e02b2c3d479").is_ok());
        assert!(parse_id("not-a-uuid").is_err());
        assert!(parse_id("").is_err());
    }

    fn meter(p: Persisted) -> Arc<Meter> {
        let cg = SandboxCgroup::new(Path::new("/nonexistent"), CgroupVersion::V1, "x");
        Arc::new(Meter::new(cg, "/nonexistent".into(), p))
    }

    #[test]
    fn labels_round_trip() {
        let sb = Sandbox {
            id: "f47ac10b-58cc-4372-a567-0e02b2c3d479".into(),
            tenant_id: "t".into(),
            session_id: "s".into(),
            image: "img".into(),
            created_at: SystemTime::now(),
            limits: Limits {
                cpu_millis: 250,
                memory_bytes: 1 << 28,
                max_runtime: Duration::from_secs(60),
            },
            workspace: WorkspaceSpec {
                storage_class: "standard".into(),
                size: "1Gi".into(),
                mount_path: "/w".into(),
            },
            pool: true,
            image_digest: "sha256:abc".into(),
            state: State::starting(),
            ops: Arc::default(),
            meter: meter(Persisted::default()),
        };
        let mut l = sb.labels();
        let persisted = Persisted {
            peak: 7,
            ..Default::default()
        };
        l.insert(label("usage"), serde_json::to_string(&persisted).unwrap());
        let mut got = None;
        let back = Sandbox::from_labels(&sb.id, &l, |p| {
            got = Some(p);
            meter(p)
        })
        .unwrap();
        assert_eq!(got, Some(persisted));
        assert_eq!(back.limits, sb.limits);
        assert_eq!(back.workspace, sb.workspace);
        assert_eq!(back.created_at, sb.created_at);
        assert_eq!(back.state().status, Status::Starting);
        assert!(back.pool);
        assert_eq!(back.image_digest, "sha256:abc");
        // As containerd stores it: no empty labels.
        let mut member = l.clone();
        member.insert(label("tenant-id"), String::new());
        member.retain(|_, v| !v.is_empty());
        let back = Sandbox::from_labels(&sb.id, &member, meter).unwrap();
        assert!(back.pool && back.tenant_id.is_empty());
        l.insert(label("status"), "failed".into());
        l.insert(label("reason"), "boom".into());
        let back = Sandbox::from_labels(&sb.id, &l, meter).unwrap();
        assert_eq!(back.state().status, Status::Failed);
        assert_eq!(back.state().reason, "boom");
        // Records written before the pool existed are ordinary sandboxes.
        l.remove(&label("pool"));
        l.remove(&label("image-digest"));
        let back = Sandbox::from_labels(&sb.id, &l, meter).unwrap();
        assert!(!back.pool);
        assert!(back.image_digest.is_empty());
        assert!(Sandbox::from_labels("x", &HashMap::new(), meter).is_none());
    }
}
