//! The record of a sandbox: its container labels while it lives (the daemon holds no database;
//! containerd's labels are the record) and the tombstone a destroyed one leaves beside its
//! soft-deleted workspace.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use super::sandbox::{Definition, Limits, Status, WorkspaceSpec};
use crate::metering::meter::Persisted;
use crate::metering::Usage;
use crate::size::ByteSize;

const LABEL_PREFIX: &str = "compute.paper-board.io/";

/// The full name of one of our labels.
pub fn label(key: &str) -> String {
    format!("{LABEL_PREFIX}{key}")
}

fn rfc3339(t: SystemTime, precision: chrono::SecondsFormat) -> String {
    chrono::DateTime::<chrono::Utc>::from(t).to_rfc3339_opts(precision, true)
}

fn parse_time(s: &str) -> Option<SystemTime> {
    chrono::DateTime::parse_from_rfc3339(s)
        .ok()
        .map(|d| SystemTime::from(d.with_timezone(&chrono::Utc)))
}

/// Label values are kept under containerd's 4 KiB limit per label: a long value is split.
pub(super) const LABEL_CHUNK: usize = 3000;

/// The labels that record `value` under `name`: chunks `name-0`, `name-1`, ... and their count
/// in `name-chunks`.
pub fn chunk_labels(name: &str, value: &str) -> HashMap<String, String> {
    let mut out = HashMap::new();
    let mut rest = value;
    let mut i = 0;
    while !rest.is_empty() {
        let mut cut = rest.len().min(LABEL_CHUNK);
        while !rest.is_char_boundary(cut) {
            cut -= 1;
        }
        out.insert(label(&format!("{name}-{i}")), rest[..cut].to_string());
        rest = &rest[cut..];
        i += 1;
    }
    out.insert(label(&format!("{name}-chunks")), i.to_string());
    out
}

/// The value [`chunk_labels`] recorded under `name`, if whole.
pub fn unchunk_labels(name: &str, labels: &HashMap<String, String>) -> Option<String> {
    let n: usize = labels
        .get(&label(&format!("{name}-chunks")))?
        .parse()
        .ok()?;
    let mut v = String::new();
    for i in 0..n {
        v.push_str(labels.get(&label(&format!("{name}-{i}")))?);
    }
    Some(v)
}

/// The labels that record `def`.
pub fn labels(def: &Definition) -> HashMap<String, String> {
    HashMap::from([
        (label("sandbox"), "1".into()),
        (label("tenant-id"), def.tenant_id.clone()),
        (label("session-id"), def.session_id.clone()),
        (
            label("created-at"),
            rfc3339(def.created_at, chrono::SecondsFormat::Nanos),
        ),
        (label("image"), def.image.clone()),
        (label("cpu-millis"), def.limits.cpu_millis.to_string()),
        (label("memory-bytes"), def.limits.memory_bytes.to_string()),
        (
            label("max-runtime-ms"),
            def.limits.max_runtime.as_millis().to_string(),
        ),
        (label("storage-class"), def.workspace.storage_class.clone()),
        (label("workspace-size"), def.workspace.size.to_string()),
        (label("mount-path"), def.workspace.mount_path.clone()),
        (label("pool"), def.pool.to_string()),
        (label("image-digest"), def.image_digest.clone()),
    ])
    .into_iter()
    .chain(
        def.platform
            .as_deref()
            .map(super::platform::spec_labels)
            .unwrap_or_default(),
    )
    .collect()
}

/// The labels that record a failure.
pub fn failure_labels(reason: &str) -> HashMap<String, String> {
    HashMap::from([
        (label("status"), "failed".to_string()),
        (label("reason"), reason.chars().take(1000).collect()),
    ])
}

/// What a suspension recorded: when, and what its checkpoint holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Suspension {
    /// When the sandbox was suspended.
    pub at: SystemTime,
    /// The checkpoint's size on disk (0 when it kept no memory).
    pub checkpoint_bytes: u64,
    /// Whether its memory was checkpointed (false: the next resume is a cold start).
    pub memory: bool,
}

/// The labels of a sandbox moving through suspend and resume: `status` = `suspending`,
/// `resuming` or `ready` (which recovery settles by the task's state, as a fresh record).
pub fn status_labels(status: Status) -> HashMap<String, String> {
    let word = match status {
        Status::Suspending => "suspending",
        Status::Resuming => "resuming",
        Status::Suspended => "suspended",
        _ => "ready",
    };
    HashMap::from([(label("status"), word.to_string())])
}

/// The labels of a SUSPENDED sandbox.
pub fn suspended_labels(s: &Suspension) -> HashMap<String, String> {
    let mut l = status_labels(Status::Suspended);
    l.insert(
        label("suspended-at"),
        rfc3339(s.at, chrono::SecondsFormat::Millis),
    );
    l.insert(label("checkpoint-bytes"), s.checkpoint_bytes.to_string());
    l.insert(label("checkpoint-memory"), s.memory.to_string());
    l
}

/// The label that records a meter's state.
pub fn usage_labels(p: &Persisted) -> HashMap<String, String> {
    HashMap::from([(label("usage"), serde_json::to_string(p).unwrap_or_default())])
}

/// What a record says: the sandbox, its status as recorded (FAILED with its reason, else
/// STARTING until recovery asks the runtime) and its meter's state.
#[derive(Debug, Clone)]
pub struct Recorded {
    /// The sandbox.
    pub def: Definition,
    /// STARTING, FAILED, or a step of suspend and resume.
    pub status: Status,
    /// The last suspension, while suspended (or on the way in or out).
    pub suspension: Option<Suspension>,
    /// The recorded failure.
    pub reason: String,
    /// The meter's state.
    pub usage: Persisted,
}

/// Reads a record from its labels; None when they are not one of ours (or are damaged).
pub fn from_labels(id: &str, l: &HashMap<String, String>) -> Option<Recorded> {
    let get = |k: &str| l.get(&label(k)).cloned();
    get("sandbox")?;
    let limits = Limits {
        cpu_millis: get("cpu-millis")?.parse().ok()?,
        memory_bytes: get("memory-bytes")?.parse().ok()?,
        max_runtime: Duration::from_millis(get("max-runtime-ms")?.parse().ok()?),
    };
    let (status, reason) = match get("status").as_deref() {
        Some("failed") => (Status::Failed, get("reason").unwrap_or_default()),
        Some("suspending") => (Status::Suspending, String::new()),
        Some("suspended") => (Status::Suspended, String::new()),
        Some("resuming") => (Status::Resuming, String::new()),
        _ => (Status::Starting, String::new()),
    };
    let suspension = get("suspended-at")
        .and_then(|t| parse_time(&t))
        .map(|at| Suspension {
            at,
            checkpoint_bytes: get("checkpoint-bytes")
                .and_then(|b| b.parse().ok())
                .unwrap_or(0),
            memory: get("checkpoint-memory").as_deref() != Some("false"),
        });
    // containerd drops labels with empty values: a pool member has no tenant or session.
    let pool = get("pool").as_deref() == Some("true");
    let owner = |k: &str| {
        if pool {
            Some(get(k).unwrap_or_default())
        } else {
            get(k)
        }
    };
    Some(Recorded {
        def: Definition {
            id: id.to_string(),
            tenant_id: owner("tenant-id")?,
            session_id: owner("session-id")?,
            image: get("image")?,
            created_at: parse_time(&get("created-at")?)?,
            limits,
            workspace: WorkspaceSpec {
                storage_class: get("storage-class")?,
                size: ByteSize::parse(&get("workspace-size")?).ok()?,
                mount_path: get("mount-path")?,
            },
            pool,
            image_digest: get("image-digest").unwrap_or_default(),
            platform: super::platform::spec_of_labels(l).map(std::sync::Arc::new),
        },
        status,
        reason,
        suspension,
        usage: get("usage")
            .and_then(|u| serde_json::from_str(&u).ok())
            .unwrap_or_default(),
    })
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
    /// A platform sandbox's definition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform: Option<super::platform::PlatformSpec>,
}

impl Tombstone {
    /// The tombstone of `def`, destroyed at `now` with `usage`, its workspace kept for `grace`.
    pub fn new(
        def: &Definition,
        now: SystemTime,
        grace: Duration,
        usage: Usage,
        reason: String,
    ) -> Self {
        let ms = chrono::SecondsFormat::Millis;
        Self {
            id: def.id.clone(),
            tenant_id: def.tenant_id.clone(),
            session_id: def.session_id.clone(),
            image: def.image.clone(),
            created_at: rfc3339(def.created_at, ms),
            destroyed_at: rfc3339(now, ms),
            delete_after: rfc3339(now + grace, ms),
            limits: def.limits,
            workspace: def.workspace.clone(),
            usage,
            reason,
            platform: def.platform.as_deref().cloned(),
        }
    }

    /// The sandbox it was.
    pub fn definition(&self) -> Definition {
        Definition {
            id: self.id.clone(),
            tenant_id: self.tenant_id.clone(),
            session_id: self.session_id.clone(),
            image: self.image.clone(),
            created_at: parse_time(&self.created_at).unwrap_or(SystemTime::UNIX_EPOCH),
            limits: self.limits,
            workspace: self.workspace.clone(),
            pool: false,
            image_digest: String::new(),
            platform: self.platform.clone().map(std::sync::Arc::new),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn def() -> Definition {
        Definition {
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
                size: ByteSize::parse("1Gi").unwrap(),
                mount_path: "/w".into(),
            },
            pool: true,
            image_digest: "sha256:abc".into(),
            platform: None,
        }
    }

    #[test]
    fn labels_round_trip() {
        let d = def();
        let mut l = labels(&d);
        let persisted = Persisted {
            peak: 7,
            ..Default::default()
        };
        l.extend(usage_labels(&persisted));
        let back = from_labels(&d.id, &l).unwrap();
        assert_eq!(back.usage, persisted);
        assert_eq!(back.def, d);
        assert_eq!(back.def.workspace.size.as_str(), "1Gi");
        assert_eq!(back.status, Status::Starting);
        // As containerd stores it: no empty labels.
        let mut member = l.clone();
        member.insert(label("tenant-id"), String::new());
        member.retain(|_, v| !v.is_empty());
        let back = from_labels(&d.id, &member).unwrap();
        assert!(back.def.pool && back.def.tenant_id.is_empty());
        l.extend(failure_labels("boom"));
        let back = from_labels(&d.id, &l).unwrap();
        assert_eq!(
            (back.status, back.reason.as_str()),
            (Status::Failed, "boom")
        );
        // Records written before the pool existed are ordinary sandboxes.
        l.remove(&label("pool"));
        l.remove(&label("image-digest"));
        let back = from_labels(&d.id, &l).unwrap();
        assert!(!back.def.pool);
        assert!(back.def.image_digest.is_empty());
        // Not ours, or damaged: no record.
        assert!(from_labels("x", &HashMap::new()).is_none());
        l.insert(label("workspace-size"), "lots".into());
        assert!(from_labels(&d.id, &l).is_none());
    }

    #[test]
    fn tombstones_keep_the_definition() {
        let mut d = def();
        d.pool = false;
        d.image_digest.clear();
        let t = Tombstone::new(
            &d,
            SystemTime::now(),
            Duration::from_secs(60),
            Usage::default(),
            "r".into(),
        );
        let json = serde_json::to_string(&t).unwrap();
        assert!(json.contains("\"size\":\"1Gi\""), "{json}");
        let back: Tombstone = serde_json::from_str(&json).unwrap();
        let mut want = d.clone();
        // Millisecond precision in tombstones.
        let ms = |t: SystemTime| {
            t.duration_since(SystemTime::UNIX_EPOCH)
                .unwrap()
                .as_millis()
        };
        assert_eq!(ms(back.definition().created_at), ms(d.created_at));
        want.created_at = back.definition().created_at;
        assert_eq!(back.definition(), want);
    }
}
