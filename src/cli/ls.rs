//! `computectl ls`: the node's sandboxes.

use super::{age, human_bytes, print_list, rfc3339, usage_json, Answer, Output, Target};
use crate::api::admin::v1 as pb;

/// Options of `ls`.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  computectl ls\n  computectl ls --status READY --tenant acme -o wide\n  computectl ls -o json | jq '.[].sandbox_id'"
)]
pub struct LsArgs {
    /// Only sandboxes in this status (STARTING, READY, SUSPENDING, SUSPENDED, RESUMING,
    /// FAILED, DESTROYED); repeatable.
    #[arg(long)]
    pub status: Vec<String>,
    /// Only this tenant's sandboxes.
    #[arg(long)]
    pub tenant: Option<String>,
}

/// The JSON form of a sandbox summary.
pub fn summary_json(s: &pb::SandboxSummary) -> serde_json::Value {
    serde_json::json!({
        "sandbox_id": s.sandbox_id,
        "tenant_id": s.tenant_id,
        "session_id": s.session_id,
        "status": s.status,
        "failure_reason": s.failure_reason,
        "image": s.image,
        "created_at": rfc3339(s.created_at.as_ref()),
        "limits": {"cpu_millis": s.cpu_millis, "memory_bytes": s.memory_bytes, "max_runtime_secs": s.max_runtime_secs},
        "workspace": {"storage_class": s.storage_class, "size": s.workspace_size, "mount_path": s.mount_path},
        "usage": usage_json(s.usage.as_ref()),
        "pool": s.pool,
        "checkpoint_bytes": s.checkpoint_bytes,
        "checkpoint_memory": s.checkpoint_memory,
        "suspended_at": s.suspended_at.as_ref().map(|t| rfc3339(Some(t))),
        "idle_suspend_at": s.idle_suspend_at.as_ref().map(|t| rfc3339(Some(t))),
    })
}

/// Runs `ls`.
pub async fn run(t: &Target, a: LsArgs) -> anyhow::Result<()> {
    let list = t
        .admin()
        .await?
        .list_sandboxes(pb::ListSandboxesRequest {
            status: a.status.iter().map(|s| s.to_uppercase()).collect(),
            tenant_id: a.tenant.unwrap_or_default(),
        })
        .await
        .answer("list sandboxes")?
        .sandboxes;
    let wide = t.output == Output::Wide;
    let mut header = vec![
        "ID",
        "TENANT",
        "SESSION",
        "STATUS",
        "AGE",
        "CPU",
        "MEM",
        "DISK",
        "CHECKPOINT",
    ];
    if wide {
        header.extend(["IMAGE", "CPU-LIMIT", "MEM-LIMIT", "WORKSPACE", "REASON"]);
    }
    print_list(t, &list, summary_json, &header, |s| {
        let u = s.usage.unwrap_or_default();
        let mut r = vec![
            s.sandbox_id.clone(),
            s.tenant_id.clone(),
            s.session_id.clone(),
            if s.pool {
                format!("{} (pool)", s.status)
            } else {
                s.status.clone()
            },
            age(s.created_at.as_ref()),
            format!("{}ms", u.cpu_ms),
            human_bytes(u.memory_peak_bytes),
            human_bytes(u.disk_read_bytes + u.disk_write_bytes),
            match (s.suspended_at.is_some(), s.checkpoint_memory) {
                (false, _) => String::new(),
                (true, true) => human_bytes(s.checkpoint_bytes),
                (true, false) => "memory lost".into(),
            },
        ];
        if wide {
            r.extend([
                s.image.clone(),
                format!("{}m", s.cpu_millis),
                human_bytes(s.memory_bytes),
                format!("{}/{}", s.storage_class, s.workspace_size),
                s.failure_reason.clone(),
            ]);
        }
        r
    })
}
