//! `computectl destroy ID…`: destroy sandboxes (their workspaces go to the trash).

use super::{status_error, usage_json, Output, Target};
use crate::api::compute::v1 as pb;

/// Runs `destroy`; fails (after trying every id) if any destroy failed.
pub async fn run(t: &Target, ids: &[String]) -> anyhow::Result<()> {
    let mut c = t.compute().await?;
    let mut failed = 0;
    let mut out = Vec::new();
    for id in ids {
        match c
            .destroy_sandbox(pb::DestroySandboxRequest {
                sandbox_id: id.clone(),
            })
            .await
        {
            Ok(r) => {
                let r = r.into_inner();
                if t.output == Output::Json {
                    out.push(serde_json::json!({"sandbox_id": r.sandbox_id, "total_usage": usage_json(r.total_usage.as_ref())}));
                } else {
                    let u = r.total_usage.unwrap_or_default();
                    println!(
                        "destroyed {} (cpu {} ms, peak {} bytes)",
                        r.sandbox_id, u.cpu_ms, u.memory_peak_bytes
                    );
                }
            }
            Err(s) => {
                failed += 1;
                eprintln!("computectl: {}", status_error(&format!("destroy {id}"), s));
            }
        }
    }
    if t.output == Output::Json {
        println!("{}", serde_json::to_string_pretty(&out)?);
    }
    if failed > 0 {
        anyhow::bail!("{failed} of {} destroy(s) failed", ids.len());
    }
    Ok(())
}
