//! `computectl suspend ID…` / `computectl resume ID…`: suspend sandboxes with their memory, or
//! resume them (issue 19).

use super::{human_bytes, status_error, Output, Target};
use crate::api::admin::v1 as pb;

/// Runs `suspend` (or `resume` with `resume`); fails (after trying every id) if any failed.
pub async fn run(t: &Target, ids: &[String], resume: bool) -> anyhow::Result<()> {
    let mut c = t.admin().await?;
    let verb = if resume { "resume" } else { "suspend" };
    let mut failed = 0;
    let mut out = Vec::new();
    for id in ids {
        let r = if resume {
            c.resume_sandbox(pb::ResumeSandboxRequest {
                sandbox_id: id.clone(),
            })
            .await
        } else {
            c.suspend_sandbox(pb::SuspendSandboxRequest {
                sandbox_id: id.clone(),
            })
            .await
        };
        match r {
            Ok(r) => {
                let r = r.into_inner();
                let s = r.sandbox.unwrap_or_default();
                if t.output == Output::Json {
                    let mut j = super::ls::summary_json(&s);
                    j["memory_lost"] = r.memory_lost.clone().into();
                    out.push(j);
                } else if resume && !r.memory_lost.is_empty() {
                    println!(
                        "{} {} (memory lost: {})",
                        s.sandbox_id, s.status, r.memory_lost
                    );
                } else if resume {
                    println!("{} {} (memory kept)", s.sandbox_id, s.status);
                } else {
                    println!(
                        "{} {} (checkpoint {})",
                        s.sandbox_id,
                        s.status,
                        human_bytes(s.checkpoint_bytes)
                    );
                }
            }
            Err(s) => {
                failed += 1;
                eprintln!("computectl: {}", status_error(&format!("{verb} {id}"), s));
            }
        }
    }
    if t.output == Output::Json {
        println!("{}", serde_json::to_string_pretty(&out)?);
    }
    if failed > 0 {
        anyhow::bail!("{failed} of {} {verb}(s) failed", ids.len());
    }
    Ok(())
}
