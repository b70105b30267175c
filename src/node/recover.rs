//! Recovery after a restart: the table rebuilt from the runtime's records and the tombstones,
//! provisioning resumed where a crash cut it, deadlines, exit watches and agent links re-armed.

use std::sync::Arc;
use std::time::Duration;

use tracing::{info, warn};

use super::{blocking, gc, record, Node, Result, Sandbox, State, Status};
use crate::metering::meter::Persisted;
use crate::runtime::TaskState;
use crate::volume;

/// What a STARTING record becomes, given its task's state after a restart.
pub(super) fn after_restart(task: TaskState) -> Option<Status> {
    match task {
        // Unknown: the shim did not answer within containerd's state timeout (2 s), e.g. busy
        // with execs a crash cut short. A task that still answers Unknown after a few tries
        // exists and is running something: it is not provisioned again.
        TaskState::Running | TaskState::Paused | TaskState::Unknown => Some(Status::Ready),
        TaskState::Stopped(_) => Some(Status::Failed),
        // Caught mid-provisioning: finish it.
        TaskState::Missing | TaskState::Created => None,
    }
}

impl Node {
    /// Rebuilds the table from the runtime's records and the tombstones, resumes provisioning
    /// of sandboxes caught mid-start, and re-arms deadlines and exit watches. Returns how many
    /// live records it found.
    pub async fn recover(&self) -> Result<usize> {
        // External workers' credentials survive restarts; a store that cannot be read stops
        // the node rather than silently forgetting (or half-reading) them.
        let relay = self.relay().clone();
        let creds = blocking(move || relay.credentials().load()).await??;
        info!(credentials = creds, "worker credentials loaded");
        let records = self.inner.rt.records().await?;
        let mut n = 0;
        for r in records {
            let Some(rec) = record::from_labels(&r.id, &r.labels) else {
                continue;
            };
            let sb = Arc::new(self.sandbox(rec.def, State::new(rec.status, rec.reason), rec.usage));
            if matches!(
                rec.status,
                Status::Suspending | Status::Suspended | Status::Resuming
            ) {
                sb.set_suspension(rec.suspension);
            }
            self.reattach_volume(&sb).await?;
            if sb.status() != Status::Suspended {
                self.reap_orphaned_execs(&sb).await;
            }
            match sb.status() {
                Status::Starting => self.settle_after_restart(&sb).await?,
                Status::Suspending | Status::Resuming => {
                    self.settle_suspension(&sb).await?;
                    if sb.status() == Status::Suspended {
                        self.release_durable(sb.definition()).await;
                    }
                }
                _ => {}
            }
            {
                let mut t = self.table();
                if !sb.pool {
                    t.by_session
                        .insert((sb.tenant_id.clone(), sb.session_id.clone()), sb.id.clone());
                }
                t.by_id.insert(sb.id.clone(), sb.clone());
            }
            // Before the agent's link is up: a workload it still runs is taken up from its
            // first frame.
            if sb.platform.is_some() {
                self.recover_network(&sb, &r.labels);
                self.spawn_bootstrap_end(sb.clone());
                self.recover_platform(sb.clone()).await;
            }
            match sb.status() {
                Status::Starting => self.spawn_provision(sb.clone()),
                Status::Ready => {
                    self.spawn_exit_watch(sb.clone());
                    if self.agent_io_exists(&sb.id) {
                        self.spawn_agent_link(sb.clone(), true);
                    }
                }
                _ => {}
            }
            // Pool members have no deadline until claimed.
            if !sb.pool {
                self.spawn_deadline(sb);
            }
            n += 1;
        }
        // The table from the records, before any sandbox's traffic is let through again.
        self.rebuild_network().await?;
        self.spawn_capture().await?;
        self.recover_tombstones().await?;
        self.gc_run_logs().await;
        Ok(n)
    }

    /// Volumes of live sandboxes are mounted again after a reboot.
    async fn reattach_volume(&self, sb: &Sandbox) -> Result<()> {
        let paths = self.paths(&sb.id);
        // Its durable workspaces are its again (and mounted, after a reboot), unless it is
        // suspended (it claims them on resume).
        let durable: Vec<_> = if sb.status() == Status::Suspended {
            vec![]
        } else {
            self.reclaim_durable(sb.definition());
            self.mounts_of(sb.definition())
                .into_iter()
                .filter(|m| m.durable.is_some())
                .map(|m| m.paths)
                .collect()
        };
        let attached = blocking(move || -> std::result::Result<bool, volume::Error> {
            let mut any = false;
            for p in &durable {
                if volume::has_image(p) && !volume::is_mounted(&p.data) {
                    volume::attach(p)?;
                    any = true;
                }
            }
            Ok(volume::attach_all(&paths)? || any)
        })
        .await?;
        match attached {
            // A fresh loop device counts from zero again.
            Ok(true) => sb.meter.rebase_disk(),
            Ok(false) => {}
            Err(e) => warn!(sandbox_id = %sb.id, error = %e, "could not attach workspace volume"),
        }
        Ok(())
    }

    /// A STARTING record after a restart: READY, FAILED or still STARTING (to be provisioned),
    /// by what its task says (asked again while it answers Unknown).
    async fn settle_after_restart(&self, sb: &Sandbox) -> Result<()> {
        let rt = &self.inner.rt;
        let mut state = rt.state(&sb.id).await?;
        for _ in 0..5 {
            if state != TaskState::Unknown {
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
            state = rt.state(&sb.id).await?;
        }
        info!(sandbox_id = %sb.id, ?state, "recovering sandbox");
        match (after_restart(state), state) {
            (Some(Status::Ready), _) => sb.set_status(Status::Ready, ""),
            (Some(Status::Failed), TaskState::Stopped(code)) => {
                self.fail(sb, &format!("sandbox exited with status {code}"))
                    .await
            }
            _ => {}
        }
        Ok(())
    }

    /// Tombstones of destroyed sandboxes, for Describe and idempotent Destroy until GC.
    async fn recover_tombstones(&self) -> Result<()> {
        let dir = self.inner.cfg.state_dir.clone();
        let tombs = blocking(move || gc::tombstones(&dir)).await?;
        for tomb in tombs {
            if self.table().by_id.contains_key(&tomb.id) {
                continue;
            }
            let state = State::destroyed(tomb.reason.clone(), tomb.usage);
            let sb = self.sandbox(tomb.definition(), state, Persisted::default());
            self.table().by_id.insert(tomb.id, Arc::new(sb));
        }
        Ok(())
    }
}
