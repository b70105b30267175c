//! One sandbox: what it was made with ([`Definition`]), its lifecycle state ([`Status`],
//! [`State`]) and what the node holds for it while it lives.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::metering::meter::Meter;
use crate::metering::Usage;
use crate::size::ByteSize;

/// Lifecycle state of a sandbox: STARTING → READY → (FAILED) → DESTROYED.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Status {
    /// Recorded, being provisioned.
    Starting,
    /// Running; execs proceed.
    Ready,
    /// Being checkpointed with its memory (issue 19).
    Suspending,
    /// Checkpointed to the node's disk: no processes, memory or cgroup; its record,
    /// workspace and session stay.
    Suspended,
    /// Being restored from its checkpoint (or cold-started from its record).
    Resuming,
    /// Start failed, the sandbox died, or max_runtime passed.
    Failed,
    /// Destroyed; the workspace is in its soft-delete grace window.
    Destroyed,
}

impl Status {
    /// Every status, in lifecycle order.
    pub const ALL: [Status; 7] = [
        Status::Starting,
        Status::Ready,
        Status::Suspending,
        Status::Suspended,
        Status::Resuming,
        Status::Failed,
        Status::Destroyed,
    ];

    /// The status in words, as the API spells it.
    pub fn word(self) -> &'static str {
        match self {
            Status::Starting => "STARTING",
            Status::Ready => "READY",
            Status::Suspending => "SUSPENDING",
            Status::Suspended => "SUSPENDED",
            Status::Resuming => "RESUMING",
            Status::Failed => "FAILED",
            Status::Destroyed => "DESTROYED",
        }
    }

    /// Parses the status word the API prints (any case).
    pub fn parse(word: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|s| s.word().eq_ignore_ascii_case(word))
    }

    /// STARTING, READY, SUSPENDING or RESUMING: it holds resources and counts toward the
    /// node's maximum (a SUSPENDED one holds only disk).
    pub fn is_live(self) -> bool {
        matches!(
            self,
            Status::Starting | Status::Ready | Status::Suspending | Status::Resuming
        )
    }

    /// FAILED or DESTROYED: it runs nothing any more, and only a platform Resume (of a
    /// FAILED one) brings it back.
    pub fn has_ended(self) -> bool {
        matches!(self, Status::Failed | Status::Destroyed)
    }

    /// SUSPENDING or SUSPENDED: its memory is (being) kept on disk.
    pub fn is_suspended(self) -> bool {
        matches!(self, Status::Suspending | Status::Suspended)
    }

    /// READY: execs run.
    pub fn can_exec(self) -> bool {
        self == Status::Ready
    }

    /// Whether the workspace's file calls work (post-mortems of FAILED ones included).
    pub fn has_workspace(self) -> bool {
        self != Status::Destroyed
    }

    /// Whether a sandbox in this status may move to `next`: DESTROYED is final, and FAILED
    /// only becomes RESUMING (a platform Resume revives it), never READY or STARTING.
    pub fn may_become(self, next: Status) -> bool {
        match self {
            Status::Destroyed => false,
            Status::Failed => matches!(next, Status::Failed | Status::Destroyed | Status::Resuming),
            _ => true,
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
    pub size: ByteSize,
    /// Mount path inside the sandbox.
    pub mount_path: String,
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
    /// When this state began (this daemon's clock; a recovered sandbox: its recovery).
    pub since: SystemTime,
}

impl State {
    /// A state with `status` and `reason`, no final usage.
    pub fn new(status: Status, reason: impl Into<String>) -> Self {
        Self {
            status,
            reason: reason.into(),
            final_usage: None,
            since: SystemTime::now(),
        }
    }

    /// The state of a destroyed sandbox with its lifetime usage.
    pub fn destroyed(reason: impl Into<String>, usage: Usage) -> Self {
        Self {
            final_usage: Some(usage),
            ..Self::new(Status::Destroyed, reason)
        }
    }

    /// The status, with the reason when there is one (`FAILED (start failed: ...)`).
    pub fn describe(&self) -> String {
        if self.reason.is_empty() {
            self.status.word().to_string()
        } else {
            format!("{} ({})", self.status.word(), self.reason)
        }
    }
}

/// What a sandbox is made of: everything its record keeps.
#[derive(Debug, Clone, PartialEq)]
pub struct Definition {
    /// Sandbox id (a UUID; also the containerd container id).
    pub id: String,
    /// Tenant (empty for a warm-pool member).
    pub tenant_id: String,
    /// Session (empty for a warm-pool member).
    pub session_id: String,
    /// Image name.
    pub image: String,
    /// Creation time.
    pub created_at: SystemTime,
    /// Limits.
    pub limits: Limits,
    /// Workspace.
    pub workspace: WorkspaceSpec,
    /// An unclaimed warm-pool member (it belongs to nobody).
    pub pool: bool,
    /// Digest of the image's target when the sandbox was booted (how a claim recognises the
    /// same image under another name, and a re-imported one as different).
    pub image_digest: String,
    /// What the platform API made it with (None: a compute.v1 sandbox or a pool member).
    pub platform: Option<Arc<super::platform::PlatformSpec>>,
}

/// What a request resolves to: the sandbox it asks for, with every default applied and every
/// bound checked.
#[derive(Debug, Clone, PartialEq)]
pub struct Resolved {
    /// Tenant.
    pub tenant_id: String,
    /// Session.
    pub session_id: String,
    /// Image.
    pub image: String,
    /// Limits.
    pub limits: Limits,
    /// Workspace.
    pub workspace: WorkspaceSpec,
    /// The platform API's part, if it asks.
    pub platform: Option<Arc<super::platform::PlatformSpec>>,
}

impl Definition {
    /// The extra workspace mounts (beyond the first) a platform sandbox has; none otherwise.
    pub fn extra_mounts(&self) -> &[super::platform::ExtraMount] {
        self.platform
            .as_deref()
            .map_or(&[], |p| p.mounts.as_slice())
    }
}

impl Resolved {
    /// The session key: one live sandbox per (tenant, session).
    pub fn session_key(&self) -> (String, String) {
        (self.tenant_id.clone(), self.session_id.clone())
    }

    /// The definition of a new sandbox `id` made of this, created now.
    pub fn definition(&self, id: String, image_digest: String) -> Definition {
        Definition {
            id,
            tenant_id: self.tenant_id.clone(),
            session_id: self.session_id.clone(),
            image: self.image.clone(),
            created_at: SystemTime::now(),
            limits: self.limits,
            workspace: self.workspace.clone(),
            pool: false,
            image_digest,
            platform: self.platform.clone(),
        }
    }
}

/// One sandbox as the node holds it: its [`Definition`] (reached through `Deref`: `sb.id`,
/// `sb.limits`, ...) and its live state.
pub struct Sandbox {
    def: Definition,
    /// Shared with the record that replaces this one when a pool member is claimed, so that
    /// watchers of the member see the claimed sandbox's state.
    pub(super) state: Arc<watch::Sender<State>>,
    /// Serialises provisioning, claiming and teardown (shared like `state`). Never held across
    /// an image pull.
    pub(super) ops: Arc<tokio::sync::Mutex<()>>,
    /// Cancelled when the sandbox is destroyed (or the node shuts down): ends its
    /// provisioning, wherever it is (a pull, a slow shim).
    pub(super) cancel: CancellationToken,
    /// The sandbox's meter.
    pub meter: Arc<Meter>,
    /// When it was last used (an exec started, its stdin or output moved): the clock an idle
    /// suspend reads. Milliseconds since the epoch.
    active: Arc<std::sync::atomic::AtomicU64>,
    /// Its last suspension, while it is suspended (what `computectl ls` shows).
    suspension: Arc<std::sync::Mutex<Option<super::record::Suspension>>>,
}

fn epoch_ms(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Sandbox {
    /// The one constructor: a sandbox of `def` in `state`, metered by `meter`, its work
    /// cancelled by `cancel`.
    pub fn new(
        def: Definition,
        state: State,
        meter: Arc<Meter>,
        cancel: CancellationToken,
    ) -> Self {
        Self {
            def,
            state: Arc::new(watch::channel(state).0),
            ops: Arc::default(),
            cancel,
            meter,
            active: Arc::new(epoch_ms(SystemTime::now()).into()),
            suspension: Arc::default(),
        }
    }

    /// This sandbox under another definition (a claimed pool member): the same state, lock,
    /// cancellation and meter.
    pub fn redefined(&self, def: Definition) -> Self {
        Self {
            def,
            state: self.state.clone(),
            ops: self.ops.clone(),
            cancel: self.cancel.clone(),
            meter: self.meter.clone(),
            active: self.active.clone(),
            suspension: self.suspension.clone(),
        }
    }

    /// Marks the sandbox as used now (its idle clock starts again).
    pub fn touch(&self) {
        self.active.fetch_max(
            epoch_ms(SystemTime::now()),
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    /// When the sandbox was last used: its creation, or the last [`Sandbox::touch`].
    pub fn last_active(&self) -> SystemTime {
        let ms = self.active.load(std::sync::atomic::Ordering::Relaxed);
        SystemTime::UNIX_EPOCH + Duration::from_millis(ms)
    }

    /// Its last suspension while it is suspended (or resuming), None otherwise.
    pub fn suspension(&self) -> Option<super::record::Suspension> {
        *self.suspension.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn set_suspension(&self, s: Option<super::record::Suspension>) {
        *self.suspension.lock().unwrap_or_else(|p| p.into_inner()) = s;
    }

    /// What the sandbox is made of.
    pub fn definition(&self) -> &Definition {
        &self.def
    }

    /// The current state.
    pub fn state(&self) -> State {
        self.state.borrow().clone()
    }

    /// The current status.
    pub fn status(&self) -> Status {
        self.state.borrow().status
    }

    /// Whether `other` is this sandbox (the same state channel: a claimed member is).
    pub fn same(&self, other: &Sandbox) -> bool {
        Arc::ptr_eq(&self.state, &other.state)
    }

    /// Moves to `status` with `reason` where the lifecycle allows it ([`Status::may_become`]).
    pub(super) fn set_status(&self, status: Status, reason: &str) {
        self.state.send_modify(|s| {
            if s.status.may_become(status) && status != Status::Destroyed {
                s.status = status;
                s.reason = reason.to_string();
                s.since = SystemTime::now();
            }
        });
    }

    /// Marks the sandbox DESTROYED with its lifetime usage (final).
    pub(super) fn set_destroyed(&self, usage: Usage) {
        self.state.send_modify(|s| {
            s.status = Status::Destroyed;
            s.final_usage = Some(usage);
            s.since = SystemTime::now();
        });
    }

    /// A receiver of the sandbox's state changes.
    pub fn subscribe(&self) -> watch::Receiver<State> {
        self.state.subscribe()
    }

    pub(super) fn metric_labels(&self) -> crate::metrics::SandboxLabels {
        crate::metrics::SandboxLabels {
            sandbox_id: self.id.clone(),
            tenant_id: self.tenant_id.clone(),
        }
    }
}

impl std::ops::Deref for Sandbox {
    type Target = Definition;
    fn deref(&self) -> &Definition {
        &self.def
    }
}

impl std::fmt::Debug for Sandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sandbox")
            .field("id", &self.id)
            .field("tenant_id", &self.tenant_id)
            .field("session_id", &self.session_id)
            .field("pool", &self.pool)
            .field("state", &self.state())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses() {
        use Status::*;
        // (status, word, live, ended, exec, workspace)
        let table = [
            (Starting, "STARTING", true, false, false, true),
            (Ready, "READY", true, false, true, true),
            (Suspending, "SUSPENDING", true, false, false, true),
            (Suspended, "SUSPENDED", false, false, false, true),
            (Resuming, "RESUMING", true, false, false, true),
            (Failed, "FAILED", false, true, false, true),
            (Destroyed, "DESTROYED", false, true, false, false),
        ];
        for (s, word, live, ended, exec, ws) in table {
            assert_eq!(s.word(), word);
            assert_eq!(Status::parse(&word.to_lowercase()), Some(s));
            assert_eq!(
                (s.is_live(), s.has_ended(), s.can_exec(), s.has_workspace()),
                (live, ended, exec, ws),
                "{s:?}"
            );
        }
        assert_eq!(Status::parse("RUNNING"), None);
        // (from, to, allowed)
        for (from, to, ok) in [
            (Starting, Ready, true),
            (Ready, Failed, true),
            (Failed, Ready, false),
            (Failed, Starting, false),
            (Destroyed, Ready, false),
            (Destroyed, Failed, false),
            (Failed, Destroyed, true),
            (Failed, Resuming, true),
            (Suspended, Resuming, true),
            (Resuming, Ready, true),
            (Destroyed, Resuming, false),
        ] {
            assert_eq!(from.may_become(to), ok, "{from:?} -> {to:?}");
        }
    }
}
