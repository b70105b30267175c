//! CreateSandbox in two steps: [`resolve`], a pure function from the request and the node's
//! configuration to what the sandbox will be (or the INVALID_ARGUMENT that says why not), then
//! admission against the node's table (one live sandbox per session, draining, the maximum,
//! the warm pool) and recording.

use std::sync::Arc;
use std::time::Duration;

use tracing::{info, instrument};

use super::pool::Claim;
use super::{
    blocking, Error, Limits, Node, Resolved, Result, Sandbox, State, Status, WorkspaceSpec,
};
use crate::config::{Config, MIN_WORKSPACE};
use crate::metering::meter::Persisted;
use crate::size::ByteSize;
use crate::{volume, workspace};

/// A CreateSandbox request as it arrives. Empty/zero fields take the node's defaults.
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
    /// Size (a quantity like `5Gi`); empty = default.
    pub size: String,
    /// Mount path; empty = /workspace.
    pub mount_path: String,
    /// CPU millicores; 0 = default.
    pub cpu_millis: u32,
    /// Memory bytes; 0 = default.
    pub memory_bytes: u64,
    /// Max runtime; None = default.
    pub max_runtime: Option<Duration>,
    /// The platform API's part (its max lifetime is the environment's, not bound by the
    /// node's max_runtime cap).
    pub platform: Option<Arc<super::platform::PlatformSpec>>,
}

fn or<T: Clone>(given: T, unset: bool, default: &T) -> T {
    if unset {
        default.clone()
    } else {
        given
    }
}

/// Resolves `req` against `cfg`: defaults for what it leaves out, INVALID_ARGUMENT for what
/// is out of bounds. Pure.
pub fn resolve(cfg: &Config, req: &CreateRequest) -> Result<Resolved> {
    let invalid = |m: String| Err(Error::InvalidArgument(m));
    if req.tenant_id.is_empty() || req.session_id.is_empty() {
        return invalid("tenant_id and session_id are required".into());
    }
    let mount_path = or(
        req.mount_path.clone(),
        req.mount_path.is_empty(),
        &"/workspace".into(),
    );
    workspace::validate_mount_path(&mount_path)?;
    let size = workspace_size(cfg, &req.size)?;
    // A platform sandbox's extra mounts: each a workspace by the same rules.
    let platform = match &req.platform {
        Some(p) if !p.mounts.is_empty() => {
            let mut p = (**p).clone();
            for m in &mut p.mounts {
                workspace::validate_mount_path(&m.mount_path)?;
                let given = if m.size.bytes() == 0 {
                    ""
                } else {
                    m.size.as_str()
                };
                m.size = workspace_size(cfg, given)?;
            }
            Some(Arc::new(p))
        }
        p => p.clone(),
    };
    let storage_class = or(
        req.storage_class.clone(),
        req.storage_class.is_empty(),
        &cfg.storage_class,
    );
    if !cfg.storage_classes.contains_key(&storage_class) {
        let known: Vec<&str> = cfg.storage_classes.keys().map(String::as_str).collect();
        return invalid(format!(
            "unknown storage_class {storage_class:?} (this node has: {})",
            known.join(", ")
        ));
    }
    let max_runtime = req
        .max_runtime
        .unwrap_or(Duration::from_secs(cfg.default_max_runtime_secs));
    let cap = if req.platform.is_some() {
        super::platform::NO_LIFETIME_LIMIT
    } else {
        Duration::from_secs(cfg.max_max_runtime_secs)
    };
    if max_runtime.is_zero() || max_runtime > cap {
        return invalid(format!(
            "max_runtime must be between 1s and {}s",
            cfg.max_max_runtime_secs
        ));
    }
    let limits = Limits {
        cpu_millis: or(req.cpu_millis, req.cpu_millis == 0, &cfg.default_cpu_millis),
        memory_bytes: or(
            req.memory_bytes,
            req.memory_bytes == 0,
            &cfg.default_memory_bytes,
        ),
        max_runtime,
    };
    if limits.memory_bytes < (32 << 20) {
        return invalid("memory_bytes must be at least 32 MiB".into());
    }
    if limits.cpu_millis < 10 {
        return invalid("cpu_millis must be at least 10".into());
    }
    Ok(Resolved {
        tenant_id: req.tenant_id.clone(),
        session_id: req.session_id.clone(),
        image: or(req.image.clone(), req.image.is_empty(), &cfg.sandbox_image),
        limits,
        workspace: WorkspaceSpec {
            storage_class,
            size,
            mount_path,
        },
        platform,
    })
}

/// A workspace size as given ("" = the node's default), within the node's bounds.
pub(super) fn workspace_size(cfg: &Config, text: &str) -> Result<ByteSize> {
    let invalid = |m: String| Err(Error::InvalidArgument(m));
    let size = if text.is_empty() {
        cfg.workspace_size.clone()
    } else {
        match ByteSize::parse(text) {
            Ok(s) if s.bytes() > 0 => s,
            _ => {
                return invalid(format!(
                    "workspace size {text:?} is not a quantity like 5Gi"
                ))
            }
        }
    };
    if size.bytes() > cfg.max_workspace_size.bytes() {
        return invalid(format!(
            "workspace size {:?} is over the node's maximum {}",
            size.as_str(),
            cfg.max_workspace_size
        ));
    }
    if size.bytes() < MIN_WORKSPACE {
        return invalid(format!(
            "workspace size {:?} is under the minimum of 8Mi",
            size.as_str()
        ));
    }
    Ok(size)
}

/// What admission came to under the table lock.
enum Admission {
    /// The session has a live sandbox: return it.
    Existing(Arc<Sandbox>),
    /// A new sandbox, in the table; a pool member it evicted to make room, if any.
    New(Arc<Sandbox>, Option<Arc<Sandbox>>),
}

impl Node {
    pub(super) fn draining(&self) -> Result<()> {
        if self.config().draining {
            return Err(Error::Unavailable(
                "node is draining: it takes no new sandboxes".into(),
            ));
        }
        self.not_shutting_down()
    }

    /// CreateSandbox: records the sandbox and provisions it in the background. A live (STARTING
    /// or READY) sandbox of the same tenant and session is returned instead of a new one.
    #[instrument(skip_all, fields(tenant_id = %req.tenant_id, session_id = %req.session_id))]
    pub async fn create(&self, req: CreateRequest) -> Result<Arc<Sandbox>> {
        let want = resolve(self.config(), &req)?;
        let key = want.session_key();
        if let Some(existing) = self.table().live_session(&key) {
            return Ok(existing);
        }
        self.draining()?;
        // Warm path: a pool member that fits, READY at once.
        match self.claim(&want).await? {
            Claim::Claimed(sb) | Claim::Existing(sb) => return Ok(sb),
            Claim::Miss => {}
        }
        let (sb, evicted) = match self.admit(&want)? {
            Admission::Existing(sb) => return Ok(sb),
            Admission::New(sb, evicted) => (sb, evicted),
        };
        if let Some(member) = evicted {
            info!(sandbox_id = %member.id, "pool member makes room for a cold create");
            let node = self.clone();
            self.inner
                .tasks
                .spawn(async move { node.retire(member).await });
        }
        // The record goes to containerd before we answer, so a restart right after still knows
        // the sandbox. Holding `ops` keeps a racing Destroy out until it is recorded.
        let guard = sb.ops.lock().await;
        let [volume, record] = match self.record(&sb).await {
            Ok(took) => took,
            Err(e) => {
                let paths = self.paths(&sb.id);
                let _ = blocking(move || volume::delete(&paths)).await;
                let mut t = self.table();
                t.by_id.remove(&sb.id);
                t.end_session(&sb);
                return Err(e);
            }
        };
        drop(guard);
        // Usage starts now: not what mkfs and mount wrote to the volume.
        let meter = sb.meter.clone();
        let _ = blocking(move || meter.rebase_disk()).await;
        info!(sandbox_id = %sb.id, image = %sb.image, volume_ms = volume.as_secs_f64() * 1e3,
              record_ms = record.as_secs_f64() * 1e3, "sandbox created");
        self.spawn_provision(sb.clone());
        self.spawn_deadline(sb.clone());
        Ok(sb)
    }

    /// Admission under the table lock: the session's live sandbox if a racing create made
    /// one, RESOURCE_EXHAUSTED at the node's maximum (pool members count, but a tenant's
    /// sandbox comes first: the youngest member makes room), else a new STARTING sandbox in
    /// the table.
    fn admit(&self, want: &Resolved) -> Result<Admission> {
        let cfg = self.config();
        let mut t = self.table();
        let key = want.session_key();
        if let Some(existing) = t.live_session(&key) {
            return Ok(Admission::Existing(existing));
        }
        self.draining()?;
        let live: Vec<&Arc<Sandbox>> = t.by_id.values().filter(|s| s.status().is_live()).collect();
        let mut evicted = None;
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
        let def = want.definition(uuid::Uuid::new_v4().to_string(), String::new());
        let sb =
            Arc::new(self.sandbox(def, State::new(Status::Starting, ""), Persisted::default()));
        t.by_session.insert(key, sb.id.clone());
        t.by_id.insert(sb.id.clone(), sb.clone());
        Ok(Admission::New(sb, evicted))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req() -> CreateRequest {
        CreateRequest {
            tenant_id: "t".into(),
            session_id: "s".into(),
            ..Default::default()
        }
    }

    #[test]
    fn defaults_fill_what_the_request_leaves_out() {
        let cfg = Config::default();
        let r = resolve(&cfg, &req()).unwrap();
        assert_eq!(r.image, cfg.sandbox_image);
        assert_eq!(r.workspace.mount_path, "/workspace");
        assert_eq!(r.workspace.size, cfg.workspace_size);
        assert_eq!(r.workspace.storage_class, cfg.storage_class);
        assert_eq!(r.limits.cpu_millis, cfg.default_cpu_millis);
        assert_eq!(r.limits.memory_bytes, cfg.default_memory_bytes);
        assert_eq!(
            r.limits.max_runtime,
            Duration::from_secs(cfg.default_max_runtime_secs)
        );
        let given = CreateRequest {
            image: "img".into(),
            storage_class: "local".into(),
            size: "64Mi".into(),
            mount_path: "/w".into(),
            cpu_millis: 250,
            memory_bytes: 64 << 20,
            max_runtime: Some(Duration::from_secs(5)),
            ..req()
        };
        let r = resolve(&cfg, &given).unwrap();
        assert_eq!(
            (
                r.image.as_str(),
                r.workspace.storage_class.as_str(),
                r.workspace.size.as_str()
            ),
            ("img", "local", "64Mi")
        );
        assert_eq!(
            (r.limits.cpu_millis, r.limits.memory_bytes),
            (250, 64 << 20)
        );
        assert_eq!(r.workspace.mount_path, "/w");
    }

    #[test]
    fn every_bound_is_invalid_argument() {
        let cfg = Config::default();
        let cases: Vec<(&str, CreateRequest)> = vec![
            (
                "tenant_id and session_id",
                CreateRequest {
                    tenant_id: String::new(),
                    ..req()
                },
            ),
            (
                "tenant_id and session_id",
                CreateRequest {
                    session_id: String::new(),
                    ..req()
                },
            ),
            (
                "must be absolute",
                CreateRequest {
                    mount_path: "w".into(),
                    ..req()
                },
            ),
            (
                "is reserved",
                CreateRequest {
                    mount_path: "/proc".into(),
                    ..req()
                },
            ),
            (
                "not a quantity",
                CreateRequest {
                    size: "5GB".into(),
                    ..req()
                },
            ),
            (
                "not a quantity",
                CreateRequest {
                    size: "0".into(),
                    ..req()
                },
            ),
            (
                "over the node's maximum",
                CreateRequest {
                    size: "1Ti".into(),
                    ..req()
                },
            ),
            (
                "under the minimum",
                CreateRequest {
                    size: "4Mi".into(),
                    ..req()
                },
            ),
            (
                "unknown storage_class",
                CreateRequest {
                    storage_class: "gold".into(),
                    ..req()
                },
            ),
            (
                "max_runtime",
                CreateRequest {
                    max_runtime: Some(Duration::ZERO),
                    ..req()
                },
            ),
            (
                "max_runtime",
                CreateRequest {
                    max_runtime: Some(Duration::from_secs(1 << 30)),
                    ..req()
                },
            ),
            (
                "memory_bytes",
                CreateRequest {
                    memory_bytes: 1 << 20,
                    ..req()
                },
            ),
            (
                "cpu_millis",
                CreateRequest {
                    cpu_millis: 5,
                    ..req()
                },
            ),
        ];
        for (want, r) in cases {
            let e = resolve(&cfg, &r).unwrap_err();
            let msg = e.to_string();
            let invalid = matches!(
                e,
                Error::InvalidArgument(_)
                    | Error::Workspace(workspace::Error::InvalidMountPath { .. })
            );
            assert!(invalid && msg.contains(want), "{r:?}: {msg}");
        }
    }
}
