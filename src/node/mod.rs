//! The node: the sandboxes on this machine and their lifecycle, in the node's own terms (the
//! gRPC services over it are the API layer's, `api::services`).
//!
//! The daemon holds no database. Each sandbox is a containerd container whose labels are its
//! record ([`record`]); a destroyed sandbox leaves a tombstone beside its soft-deleted
//! workspace. [`Node::recover`] rebuilds the table from those after a restart.
//!
//! Where things are:
//! * [`sandbox`]: one sandbox, its status and state; [`record`]: its labels and tombstone.
//! * [`create`]: a request resolved against the node's defaults, then admitted.
//! * `lifecycle`: provisioning, the deadline and exit watch, failure, destruction.
//! * `recover`: the table rebuilt after a restart. `meter_loop`: usage between execs.
//! * [`exec`]: ExecCommand, one lifecycle over two backends (the agent, containerd exec).
//! * `agent`: the in-sandbox agent's FIFOs and its link to the relay.
//! * `pool`: the warm pool. `capacity`: disk and loop-device admission. [`gc`]: workspace GC.
//!
//! Every background task is spawned through the node's [`Tasks`]: [`Node::shutdown`] cancels
//! and drains them.

mod agent;
mod capacity;
mod capture;
pub mod create;
pub mod durable;
mod error;
pub mod exec;
mod files;
pub mod gc;
mod helpers;
pub mod info;
mod lifecycle;
mod meter_loop;
mod network;
pub mod platform;
mod pool;
pub mod preview;
pub mod record;
mod recover;
pub mod runlog;
pub mod sandbox;
pub mod suspend;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::config::Config;
use crate::metering::meter::{Meter, Persisted};
use crate::metering::{CgroupVersion, SandboxCgroup};
use crate::runtime::SandboxRuntime;
use crate::tasks::Tasks;
use crate::{volume, workspace};

pub use create::CreateRequest;
pub use error::Error;
pub use helpers::elf_interpreter;
pub use network::{Egress, Ended, Grant, MAX_GRANT_TTL_SECS};
pub use record::Tombstone;
pub use sandbox::{Definition, Limits, Resolved, Sandbox, State, Status, WorkspaceSpec};

type Result<T> = std::result::Result<T, Error>;

#[derive(Default)]
struct Table {
    by_id: HashMap<String, Arc<Sandbox>>,
    by_session: HashMap<(String, String), String>,
}

impl Table {
    /// The sandbox of a tenant's session, unless it has ended (a suspended one is still the
    /// session's).
    fn live_session(&self, key: &(String, String)) -> Option<Arc<Sandbox>> {
        self.by_session
            .get(key)
            .and_then(|id| self.by_id.get(id))
            .filter(|sb| !sb.status().has_ended())
            .cloned()
    }

    /// Forgets `id` as the sandbox of its session, if it still is.
    fn end_session(&mut self, sb: &Sandbox) {
        let key = (sb.tenant_id.clone(), sb.session_id.clone());
        if self.by_session.get(&key) == Some(&sb.id) {
            self.by_session.remove(&key);
        }
    }
}

struct Inner {
    cfg: Config,
    rt: Arc<dyn SandboxRuntime>,
    relay: crate::relay::Relay,
    cgroup_version: CgroupVersion,
    table: Mutex<Table>,
    helpers_dir: Option<PathBuf>,
    /// Wakes the warm pool's refill loop (after a claim).
    pool_wake: tokio::sync::Notify,
    /// Every background task of the node.
    tasks: Tasks,
    /// Running execs per sandbox (`max_execs_per_sandbox`).
    exec_slots: Mutex<HashMap<String, Arc<tokio::sync::Semaphore>>>,
    /// Sandboxes just started with the agent as init whose Hello has not come yet: by when it
    /// is due (an exec in that window waits for it rather than paying for a containerd exec).
    agent_due: Mutex<HashMap<String, std::time::Instant>>,
    /// The agent link of each sandbox: cancelled to end it.
    agent_links: Mutex<HashMap<String, LinkStop>>,
    /// Pool members being warmed up (not warm yet).
    warming: Mutex<std::collections::HashSet<String>>,
    /// The platform API's sandboxes: run logs, workloads, deletions.
    platform: platform::State,
    /// Sandbox networks (`[egress]`); None: sandboxes have none.
    net: Option<network::Net>,
    /// Preview URLs (`[preview]`); None: ExposeSandboxPort is UNIMPLEMENTED.
    preview: Option<preview::Preview>,
    /// Durable workspaces: who has which.
    durable: durable::State,
}

/// What ends one agent link.
type LinkStop = Arc<tokio_util::sync::CancellationToken>;

/// The node: sandboxes on this machine. Cheap to clone.
#[derive(Clone)]
pub struct Node {
    inner: Arc<Inner>,
}

/// How long blocking work (cgroupfs, procfs, workspace I/O, mounts) may take.
const BLOCKING_TIMEOUT: Duration = Duration::from_secs(60);

/// Runs a blocking closure off the async runtime, bounded by a timeout.
pub async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T> {
    match tokio::time::timeout(BLOCKING_TIMEOUT, tokio::task::spawn_blocking(f)).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(Error::Internal(format!("blocking task failed: {e}"))),
        Err(_) => Err(Error::Internal("blocking task timed out".into())),
    }
}

/// An output window from its configured size (at least 4 KiB: a window of nothing would stop
/// every exec).
fn window_bytes(size: &crate::size::ByteSize) -> usize {
    usize::try_from(size.bytes())
        .unwrap_or(usize::MAX)
        .max(4096)
}

/// Parses a sandbox id: it must be a UUID.
pub fn parse_id(id: &str) -> Result<String> {
    uuid::Uuid::parse_str(id)
        .map(|u| u.hyphenated().to_string())
        .map_err(|_| Error::InvalidArgument(format!("sandbox_id {id:?} is not a valid UUID")))
}

impl Node {
    /// Builds the node over a runtime. Call [`Node::recover`] before serving and
    /// [`Node::start_background`] after.
    pub fn new(cfg: Config, rt: Arc<dyn SandboxRuntime>) -> Self {
        let cgroup_version = CgroupVersion::detect(&cfg.cgroup_root);
        let helpers_dir = helpers::install(&cfg);
        let credentials = crate::relay::auth::Credentials::new(
            crate::relay::auth::Credentials::path_in(&cfg.state_dir),
        );
        let tasks = Tasks::new();
        // The configuration was validated: a layout that does not build means no networks.
        let net = network::Net::new(&cfg).unwrap_or_else(|e| {
            tracing::error!(error = %e, "sandbox networks off");
            None
        });
        // `computed node` checks the key before it builds the node.
        let preview = preview::Preview::new(&cfg).unwrap_or_else(|e| {
            tracing::error!(error = %e, "preview URLs off");
            None
        });
        Self {
            inner: Arc::new_cyclic(|me: &std::sync::Weak<Inner>| {
                // A network worker may never take the id of a sandbox this node knows (live,
                // destroyed or in the warm pool): that sandbox's worker is its own agent.
                let me = me.clone();
                let hosted = move |id: &str| {
                    let Some(inner) = me.upgrade() else {
                        return false;
                    };
                    let id = parse_id(id).unwrap_or_else(|_| id.to_string());
                    Node { inner }.table().by_id.contains_key(&id)
                };
                Inner {
                    relay: crate::relay::Relay::new(
                        crate::relay::Settings {
                            heartbeat_timeout: Duration::from_millis(
                                cfg.worker_heartbeat_timeout_ms,
                            ),
                            worker_wait: Duration::from_millis(cfg.worker_wait_ms),
                            exec_window: window_bytes(&cfg.exec_output_window),
                            worker_exec_buffer: window_bytes(&cfg.worker_exec_buffer),
                        },
                        credentials,
                        Box::new(hosted),
                        tasks.clone(),
                    ),
                    cfg,
                    rt,
                    cgroup_version,
                    table: Mutex::new(Table::default()),
                    helpers_dir,
                    pool_wake: tokio::sync::Notify::new(),
                    tasks,
                    exec_slots: Mutex::default(),
                    agent_due: Mutex::default(),
                    agent_links: Mutex::default(),
                    warming: Mutex::default(),
                    platform: platform::State::default(),
                    durable: durable::State::default(),
                    net,
                    preview,
                }
            }),
        }
    }

    /// Starts the node's loops: usage metering, workspace GC and the warm pool.
    pub fn start_background(&self) {
        self.spawn_meter_loop();
        self.spawn_gc_loop();
        self.spawn_idle_loop();
        // Pool members outlive the daemon: the next one's recovery finds them again.
        self.spawn_pool_loop();
    }

    /// Cancels every background task (provisioning, loops, watchers; execs end as cancelled)
    /// and waits up to `timeout` for them; returns whether all ended. Sandboxes keep running.
    pub async fn shutdown(&self, timeout: Duration) -> bool {
        self.inner.tasks.shutdown(timeout).await
    }

    /// UNAVAILABLE once shutdown has begun: nothing new starts (a client retries elsewhere
    /// or after the restart).
    fn not_shutting_down(&self) -> Result<()> {
        if self.inner.tasks.is_shutting_down() {
            return Err(Error::Unavailable("node is shutting down".into()));
        }
        Ok(())
    }

    /// The node's background tasks.
    pub fn tasks(&self) -> &Tasks {
        &self.inner.tasks
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
    pub fn runtime(&self) -> &dyn SandboxRuntime {
        self.inner.rt.as_ref()
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

    /// Every sandbox the node knows, destroyed ones and warm-pool members included, oldest
    /// first.
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

    /// The meter of sandbox `def`: its cgroup, and the disk of its workspace and extra mounts.
    fn meter_for(&self, def: &Definition, persisted: Persisted) -> Arc<Meter> {
        let dirs = self
            .mounts_of(def)
            .into_iter()
            .map(|m| m.paths.data)
            .collect();
        Arc::new(
            Meter::new(self.cgroup(&def.id), dirs, persisted).with_network(self.network_iface(def)),
        )
    }

    /// A sandbox of `def` in `state`, with its meter and a cancellation token of its own.
    fn sandbox(&self, def: Definition, state: State, usage: Persisted) -> Sandbox {
        let meter = self.meter_for(&def, usage);
        Sandbox::new(def, state, meter, self.inner.tasks.child_token())
    }

    /// The workspace handle of a sandbox (for file RPCs). Works while STARTING and READY (and
    /// FAILED, for post-mortems); DESTROYED is FAILED_PRECONDITION.
    pub async fn workspace(&self, id: &str) -> Result<(Arc<Sandbox>, workspace::Workspace)> {
        let sb = self.get(id)?;
        self.wake(&sb).await?;
        sb.touch();
        if !sb.status().has_workspace() {
            return Err(Error::FailedPrecondition {
                id: sb.id.clone(),
                state: sb.status().word().into(),
            });
        }
        let paths = self.mounts_of(sb.definition()).swap_remove(0).paths;
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

    /// Waits until the sandbox is READY, or fails with the right error. A suspended
    /// compute.v1 sandbox is resumed first; a suspended platform sandbox is
    /// FAILED_PRECONDITION (its caller resumes it).
    pub async fn wait_ready(&self, sb: &Sandbox) -> Result<()> {
        self.wake(sb).await?;
        let mut rx = sb.subscribe();
        let wait = async {
            loop {
                let st = rx.borrow_and_update().clone();
                if st.status.can_exec() {
                    return Ok(());
                }
                if st.status.has_ended() || (sb.platform.is_some() && st.status.is_suspended()) {
                    return Err(Error::FailedPrecondition {
                        id: sb.id.clone(),
                        state: st.describe(),
                    });
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
