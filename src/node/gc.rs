//! Garbage collection of soft-deleted workspaces: a workspace whose tombstone's `delete_after`
//! has passed is deleted (volume unmounted, image and directory removed). Nothing else is
//! touched, and since the tombstones live on disk, a pass after a restart sees the same state.

use std::path::Path;
use std::time::SystemTime;

use tracing::{info, warn};

use super::{Node, Tombstone};
use crate::{volume, workspace};

/// One workspace GC freed (or, on a dry run, would free).
#[derive(Debug, Clone, serde::Serialize)]
pub struct Freed {
    /// Sandbox id.
    pub id: String,
    /// Tenant.
    pub tenant_id: String,
    /// When it became deletable.
    pub delete_after: String,
    /// Disk bytes it occupied (allocated blocks).
    pub bytes: u64,
}

/// Every soft-deleted workspace under `state_dir`.
pub fn tombstones(state_dir: &Path) -> Vec<Tombstone> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(state_dir.join("workspaces")) else {
        return out;
    };
    for e in rd.flatten() {
        let p = e.path().join("tombstone.json");
        if let Ok(raw) = workspace::read_small(&p, 1 << 20) {
            if let Ok(t) = serde_json::from_slice::<Tombstone>(&raw) {
                out.push(t);
            }
        }
    }
    out.sort_by(|a, b| a.destroyed_at.cmp(&b.destroyed_at));
    out
}

fn disk_usage(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            if let Ok(m) = e.path().symlink_metadata() {
                total += m.blocks() * 512;
                if m.is_dir() {
                    stack.push(e.path());
                }
            }
        }
    }
    total
}

/// One GC pass over `state_dir` at time `now`. With `dry_run`, reports without deleting.
/// Blocking.
pub fn pass(state_dir: &Path, now: SystemTime, dry_run: bool) -> Vec<Freed> {
    let now = chrono::DateTime::<chrono::Utc>::from(now);
    let mut freed = Vec::new();
    for t in tombstones(state_dir) {
        let Ok(after) = chrono::DateTime::parse_from_rfc3339(&t.delete_after) else {
            warn!(sandbox_id = %t.id, "tombstone with a bad delete_after; keeping it");
            continue;
        };
        if after > now {
            continue;
        }
        let paths = workspace::Paths::new(state_dir, &t.id);
        // A mounted volume's blocks are counted through its image file.
        let bytes = disk_usage(&paths.base);
        let f = Freed {
            id: t.id.clone(),
            tenant_id: t.tenant_id.clone(),
            delete_after: t.delete_after.clone(),
            bytes,
        };
        if !dry_run {
            if let Err(e) = volume::delete(&paths) {
                warn!(sandbox_id = %t.id, error = %e, "could not delete expired workspace");
                continue;
            }
            info!(sandbox_id = %t.id, tenant_id = %t.tenant_id, bytes, "GC freed workspace");
        }
        freed.push(f);
    }
    freed
}

/// The checkpoints under `dir` whose sandbox is not in `owned`, removed unless `dry_run`.
/// Blocking.
fn stray_checkpoints(
    dir: &Path,
    owned: &std::collections::HashSet<String>,
    dry_run: bool,
) -> Vec<Freed> {
    let mut freed = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return freed;
    };
    for e in rd.flatten() {
        let id = e.file_name().to_string_lossy().into_owned();
        if owned.contains(&id) {
            continue;
        }
        let bytes = disk_usage(&e.path());
        if !dry_run {
            if let Err(err) = std::fs::remove_dir_all(e.path()) {
                warn!(sandbox_id = %id, error = %err, "could not remove a stray checkpoint");
                continue;
            }
            info!(sandbox_id = %id, bytes, "GC removed a checkpoint no sandbox owns");
        }
        freed.push(Freed {
            id,
            tenant_id: "(checkpoint)".into(),
            delete_after: String::new(),
            bytes,
        });
    }
    freed
}

impl Node {
    /// One GC pass; forgets the freed sandboxes (Describe then answers NOT_FOUND). It also
    /// removes checkpoints no suspended sandbox owns (a destroy or delete cut short, a record
    /// removed behind the daemon's back), reported with tenant `(checkpoint)`.
    pub async fn gc(&self, dry_run: bool) -> super::Result<Vec<Freed>> {
        let dir = self.inner.cfg.state_dir.clone();
        let mut freed = super::blocking(move || pass(&dir, SystemTime::now(), dry_run)).await?;
        let owned: std::collections::HashSet<String> = self
            .list()
            .into_iter()
            .filter(|sb| sb.status() != super::Status::Destroyed)
            .map(|sb| sb.id.clone())
            .collect();
        let dir = self.inner.cfg.state_dir.join("checkpoints");
        let stray = super::blocking(move || stray_checkpoints(&dir, &owned, dry_run)).await?;
        freed.extend(stray);
        if !dry_run {
            let mut t = self.table();
            for f in freed.iter().filter(|f| f.tenant_id != "(checkpoint)") {
                t.by_id.remove(&f.id);
            }
        }
        Ok(freed)
    }

    /// Runs GC every `gc_interval_secs` (none when 0), until shutdown.
    pub(super) fn spawn_gc_loop(&self) {
        let every = self.inner.cfg.gc_interval_secs;
        if every == 0 {
            return;
        }
        let node = self.clone();
        self.inner.tasks.spawn(async move {
            let mut tick = tokio::time::interval(std::time::Duration::from_secs(every));
            loop {
                tick.tick().await;
                match node.gc(false).await {
                    Ok(f) if !f.is_empty() => info!(freed = f.len(), "GC pass"),
                    Ok(_) => {}
                    Err(e) => warn!(error = %e, "GC pass failed"),
                }
            }
        });
    }
}
