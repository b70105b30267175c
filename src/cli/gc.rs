//! `computectl gc [--dry-run]`: collect expired soft-deleted workspaces now.

use super::{human_bytes, print_json, table, Answer, Output, Target};
use crate::api::admin::v1 as pb;

/// Runs `gc`.
pub async fn run(t: &Target, dry_run: bool) -> anyhow::Result<()> {
    let freed = t
        .admin()
        .await?
        .gc(pb::GcRequest { dry_run })
        .await
        .answer("gc")?
        .freed;
    if t.output == Output::Json {
        let v: Vec<_> = freed
            .iter()
            .map(|f| serde_json::json!({"sandbox_id": f.sandbox_id, "tenant_id": f.tenant_id, "delete_after": f.delete_after, "bytes": f.bytes}))
            .collect();
        return print_json(&serde_json::json!({"dry_run": dry_run, "freed": v}));
    }
    let rows: Vec<Vec<String>> = freed
        .iter()
        .map(|f| {
            vec![
                f.sandbox_id.clone(),
                f.tenant_id.clone(),
                f.delete_after.clone(),
                human_bytes(f.bytes),
            ]
        })
        .collect();
    table(&["SANDBOX", "TENANT", "DELETE AFTER", "SIZE"], &rows);
    let total: u64 = freed.iter().map(|f| f.bytes).sum();
    println!(
        "{} {} workspace(s), {}",
        if dry_run { "would free" } else { "freed" },
        freed.len(),
        human_bytes(total)
    );
    Ok(())
}
