//! `computectl trash ls|cat`: soft-deleted workspaces, readable until GC deletes them.

use clap::Subcommand;

use super::{print_list, read_chunks, usage_json, Answer, Target};
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
                .answer("list trash")?
                .entries;
            print_list(
                t,
                &entries,
                |e| serde_json::json!({"sandbox_id": e.sandbox_id, "tenant_id": e.tenant_id, "session_id": e.session_id, "destroyed_at": e.destroyed_at, "delete_after": e.delete_after, "usage": usage_json(e.usage.as_ref())}),
                &["SANDBOX", "TENANT", "SESSION", "DESTROYED", "DELETE AFTER"],
                |e| {
                    vec![
                        e.sandbox_id.clone(),
                        e.tenant_id.clone(),
                        e.session_id.clone(),
                        e.destroyed_at.clone(),
                        e.delete_after.clone(),
                    ]
                },
            )?;
        }
        TrashCmd::Cat { id, path } => {
            let mut out = std::io::stdout().lock();
            read_chunks(&mut out, |offset| {
                let mut admin = admin.clone();
                let req = pb::ReadTrashRequest {
                    sandbox_id: id.clone(),
                    path: path.clone(),
                    offset,
                    max_bytes: 0,
                };
                let what = format!("read {id}:{path}");
                async move {
                    let r = admin.read_trash(req).await.answer(&what)?;
                    Ok((r.data, r.eof))
                }
            })
            .await?;
        }
    }
    Ok(())
}
