//! `computectl trash ls|cat`: soft-deleted workspaces, readable until GC deletes them.

use std::io::Write;

use clap::Subcommand;

use super::{status_error, table, usage_json, Output, Target};
use crate::api::admin::v1 as pb;

/// Trash commands.
#[derive(Debug, Subcommand)]
pub enum TrashCmd {
    /// List soft-deleted workspaces.
    Ls,
    /// Print a file from a soft-deleted workspace.
    Cat {
        /// Sandbox id.
        id: String,
        /// Path inside the workspace.
        path: String,
    },
}

/// Runs a trash command.
pub async fn run(t: &Target, cmd: TrashCmd) -> anyhow::Result<()> {
    let mut admin = t.admin().await?;
    match cmd {
        TrashCmd::Ls => {
            let entries = admin
                .list_trash(pb::ListTrashRequest {})
                .await
                .map_err(|s| status_error("list trash", s))?
                .into_inner()
                .entries;
            if t.output == Output::Json {
                let v: Vec<_> = entries
                    .iter()
                    .map(|e| serde_json::json!({"sandbox_id": e.sandbox_id, "tenant_id": e.tenant_id, "session_id": e.session_id, "destroyed_at": e.destroyed_at, "delete_after": e.delete_after, "usage": usage_json(e.usage.as_ref())}))
                    .collect();
                println!("{}", serde_json::to_string_pretty(&v)?);
                return Ok(());
            }
            let rows: Vec<Vec<String>> = entries
                .iter()
                .map(|e| {
                    vec![
                        e.sandbox_id.clone(),
                        e.tenant_id.clone(),
                        e.session_id.clone(),
                        e.destroyed_at.clone(),
                        e.delete_after.clone(),
                    ]
                })
                .collect();
            table(
                &["SANDBOX", "TENANT", "SESSION", "DESTROYED", "DELETE AFTER"],
                &rows,
            );
        }
        TrashCmd::Cat { id, path } => {
            let mut offset = 0i64;
            let mut out = std::io::stdout().lock();
            loop {
                let r = admin
                    .read_trash(pb::ReadTrashRequest {
                        sandbox_id: id.clone(),
                        path: path.clone(),
                        offset,
                        max_bytes: 0,
                    })
                    .await
                    .map_err(|s| status_error(&format!("read {id}:{path}"), s))?
                    .into_inner();
                out.write_all(&r.data)?;
                offset += r.data.len() as i64;
                if r.eof || r.data.is_empty() {
                    break;
                }
            }
        }
    }
    Ok(())
}
