//! `computectl describe ID`: one sandbox in detail.

use super::{human_bytes, print_json, Answer, Output, Target};
use crate::api::admin::v1 as pb;

/// Runs `describe`.
pub async fn run(t: &Target, id: &str) -> anyhow::Result<()> {
    let all = t
        .admin()
        .await?
        .list_sandboxes(pb::ListSandboxesRequest::default())
        .await
        .answer("describe")?
        .sandboxes;
    let s = all
        .into_iter()
        .find(|s| s.sandbox_id == id)
        .ok_or_else(|| anyhow::anyhow!("sandbox {id} not found on this node"))?;
    if t.output == Output::Json {
        return print_json(&super::ls::summary_json(&s));
    }
    let u = s.usage.unwrap_or_default();
    let kv = [
        ("ID", s.sandbox_id.clone()),
        ("Tenant", s.tenant_id.clone()),
        ("Session", s.session_id.clone()),
        ("Status", s.status.clone()),
        ("Reason", s.failure_reason.clone()),
        ("Image", s.image.clone()),
        ("Created", super::rfc3339(s.created_at.as_ref())),
        ("Age", super::age(s.created_at.as_ref())),
        ("CPU limit", format!("{}m", s.cpu_millis)),
        ("Memory limit", human_bytes(s.memory_bytes)),
        ("Max runtime", format!("{}s", s.max_runtime_secs)),
        (
            "Workspace",
            format!(
                "{} {} at {}",
                s.storage_class, s.workspace_size, s.mount_path
            ),
        ),
        ("CPU used", format!("{} ms", u.cpu_ms)),
        ("Memory peak", human_bytes(u.memory_peak_bytes)),
        ("Memory avg", human_bytes(u.memory_avg_bytes)),
        ("Disk read", human_bytes(u.disk_read_bytes)),
        ("Disk written", human_bytes(u.disk_write_bytes)),
        (
            "Network out/in",
            format!(
                "{}/{}",
                human_bytes(u.network_egress_bytes),
                human_bytes(u.network_ingress_bytes)
            ),
        ),
    ];
    for (k, v) in kv {
        if !v.is_empty() {
            println!("{:<15} {v}", format!("{k}:"));
        }
    }
    Ok(())
}
