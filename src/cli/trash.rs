//! `trash ls|cat`: soft-deleted workspaces, readable until GC deletes them.

use std::io::Write;
use std::path::Path;

use clap::Subcommand;

use crate::node::gc;
use crate::{volume, workspace};

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

/// Runs a trash command against the node's state directory.
pub fn run(cmd: TrashCmd, state_dir: &Path) -> anyhow::Result<()> {
    match cmd {
        TrashCmd::Ls => {
            println!(
                "{:<36}  {:<20}  {:<20}  {:<24}  {:<24}",
                "SANDBOX", "TENANT", "SESSION", "DESTROYED", "DELETE AFTER"
            );
            for t in gc::tombstones(state_dir) {
                println!(
                    "{:<36}  {:<20}  {:<20}  {:<24}  {:<24}",
                    t.id, t.tenant_id, t.session_id, t.destroyed_at, t.delete_after
                );
            }
        }
        TrashCmd::Cat { id, path } => {
            let id = uuid::Uuid::parse_str(&id)
                .map_err(|_| anyhow::anyhow!("{id:?} is not a sandbox id"))?
                .to_string();
            let paths = workspace::Paths::new(state_dir, &id);
            let tomb = gc::tombstones(state_dir)
                .into_iter()
                .find(|t| t.id == id)
                .ok_or_else(|| anyhow::anyhow!("no soft-deleted workspace {id}"))?;
            let mounted_here = volume::has_image(&paths) && !volume::is_mounted(&paths.data);
            if mounted_here {
                volume::attach_with(&paths, true)?;
            }
            let result = (|| -> anyhow::Result<()> {
                let ws = workspace::Workspace::open(&paths.data, &tomb.workspace.mount_path)?;
                let mut offset = 0i64;
                let mut out = std::io::stdout().lock();
                loop {
                    let r = ws.read(&path, offset, 0)?;
                    out.write_all(&r.data)?;
                    offset += r.data.len() as i64;
                    if r.eof || r.data.is_empty() {
                        break;
                    }
                }
                Ok(())
            })();
            if mounted_here {
                volume::detach(&paths)?;
            }
            result?;
        }
    }
    Ok(())
}
