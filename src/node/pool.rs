//! The warm pool: sandboxes booted ahead of demand, per configured image and workspace, and
//! handed to a CreateSandbox whose request fits.
//!
//! A member is an ordinary sandbox (UUID id, container, task, cgroup, workspace volume) whose
//! record says `pool=true` and names no tenant or session. No tenant-facing call reaches it
//! ([`Node::get`] hides it). A claim swaps the member's table entry for the caller's record
//! under the table lock (so two creates never get the same member), writes the request's
//! limits into the running cgroup, starts usage over from zero, and finally rewrites the
//! container labels, which makes the claim durable: a daemon killed before that recovers the
//! sandbox as a pool member again, and the caller never saw its id. After a claim the refill
//! loop boots a replacement in the background, one member at a time.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tracing::{info, warn};

use super::{
    blocking, record, volume, Definition, Error, Limits, Node, Resolved, Result, Sandbox, State,
    Status, WorkspaceSpec,
};
use crate::config::PoolEntry;
use crate::metering::meter::Persisted;
use crate::metrics::METRICS;

/// How long the refill loop waits after a claim before booting a replacement.
const REFILL_DELAY: Duration = Duration::from_millis(250);

/// What a claim attempt came to.
pub(super) enum Claim {
    /// A member now belongs to the caller, READY.
    Claimed(Arc<Sandbox>),
    /// The session already has a live sandbox (a racing create made it): return that.
    Existing(Arc<Sandbox>),
    /// No member fits: create cold.
    Miss,
}

/// The workspace of an entry's members (an entry from [`crate::config::Config::pool_entries`],
/// whose every field is filled).
fn entry_workspace(e: &PoolEntry) -> WorkspaceSpec {
    WorkspaceSpec {
        storage_class: e.storage_class.clone(),
        size: e
            .workspace_size
            .clone()
            .unwrap_or_else(crate::size::ByteSize::zero),
        mount_path: e.mount_path.clone(),
    }
}

impl Node {
    /// Whether this node keeps a warm pool.
    pub fn pool_enabled(&self) -> bool {
        !self.inner.cfg.pool.is_empty()
    }

    /// Whether a pool member is warm: READY and, when sandboxes run the agent, its agent
    /// attached and its warm-up exec done (a member READY a moment ago is still starting its
    /// agent: the first exec would wait for it, and compete with it for the CPU).
    pub fn is_warm(&self, sb: &Sandbox) -> bool {
        sb.pool
            && sb.status() == Status::Ready
            && (!self.agent_enabled()
                || (self.relay().agent(&sb.id).is_some() && !self.warming().contains(&sb.id)))
    }

    fn warming(&self) -> std::sync::MutexGuard<'_, std::collections::HashSet<String>> {
        self.inner.warming.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Unclaimed pool members that are STARTING or READY.
    pub fn pool_members(&self) -> Vec<Arc<Sandbox>> {
        self.table()
            .by_id
            .values()
            .filter(|sb| sb.pool && sb.status().is_live())
            .cloned()
            .collect()
    }

    /// Tries to hand a READY pool member to a create request (already validated, defaults
    /// applied). The request fits when the image resolves to the member's image digest (so an
    /// alias fits, a re-imported image does not) and the workspace (storage class, size,
    /// mount path) is the member's; limits always fit, as they are applied to the running
    /// cgroup. Anything failing along the way retires the member and ends in `Miss`.
    pub(super) async fn claim(&self, want: &Resolved) -> Result<Claim> {
        // A member's OCI spec has one read-write workspace mount and no network: more mounts,
        // a read-only one or a network need a sandbox of their own.
        let plain = want
            .platform
            .as_deref()
            .is_none_or(|p| p.plain_workspace() && p.network.is_none());
        if !self.pool_enabled() || !plain {
            return Ok(Claim::Miss);
        }
        let t0 = std::time::Instant::now();
        let candidate = |sb: &Sandbox| {
            sb.pool && sb.workspace == want.workspace && sb.status() == Status::Ready
        };
        // No containerd call on a sure miss.
        if !self.table().by_id.values().any(|sb| candidate(sb)) {
            METRICS.pool_claim(false);
            return Ok(Claim::Miss);
        }
        let digest = self.inner.rt.image_digest(&want.image).await;
        let session_key = want.session_key();
        let (member, claimed) = {
            let mut t = self.table();
            if let Some(existing) = t.live_session(&session_key) {
                return Ok(Claim::Existing(existing));
            }
            let Some(member) = t
                .by_id
                .values()
                .filter(|sb| candidate(sb) && !digest.is_empty() && sb.image_digest == digest)
                // Warm members first (their agent is there), then the oldest.
                .min_by_key(|sb| (!self.is_warm(sb), sb.created_at))
                .cloned()
            else {
                METRICS.pool_claim(false);
                return Ok(Claim::Miss);
            };
            let def = want.definition(member.id.clone(), member.image_digest.clone());
            let claimed = Arc::new(member.redefined(def));
            t.by_id.insert(claimed.id.clone(), claimed.clone());
            t.by_session.insert(session_key.clone(), claimed.id.clone());
            (member, claimed)
        };
        match self.apply_claim(&claimed).await {
            Ok(()) => {
                METRICS.pool_claim(true);
                info!(
                    sandbox_id = %claimed.id,
                    image = %claimed.image,
                    claim_us = t0.elapsed().as_micros() as u64,
                    "pool member claimed"
                );
                self.spawn_deadline(claimed.clone());
                self.inner.pool_wake.notify_one();
                Ok(Claim::Claimed(claimed))
            }
            Err(e) => {
                warn!(sandbox_id = %claimed.id, error = %e, "claim failed; retiring the member");
                self.table().end_session(&claimed);
                self.retire(member).await;
                METRICS.pool_claim(false);
                Ok(Claim::Miss)
            }
        }
    }

    /// Gives a claimed member its tenant: the request's limits in the cgroup, usage from zero,
    /// and the new record in containerd (last: until then a restart sees a pool member).
    async fn apply_claim(&self, sb: &Sandbox) -> Result<()> {
        let _g = sb.ops.lock().await;
        if sb.status() != Status::Ready {
            return Err(Error::Internal(format!("member is {}", sb.status().word())));
        }
        let cg = self.cgroup(&sb.id);
        let host = self.host_limits(&sb.limits);
        let data = self.paths(&sb.id).data;
        let meter = sb.meter.clone();
        let persisted = blocking(move || -> Result<Persisted> {
            // Nothing can reach a member's workspace, but the claim never hands out a used one.
            let used = std::fs::read_dir(&data)
                .map_err(|e| Error::Internal(format!("read workspace: {e}")))?
                .next()
                .is_some();
            if used {
                return Err(Error::Internal("member workspace is not empty".into()));
            }
            cg.set_limits(&host)?;
            meter.reset();
            Ok(meter.persisted())
        })
        .await??;
        let mut labels = record::labels(sb.definition());
        labels.extend(record::usage_labels(&persisted));
        self.inner.rt.set_labels(&sb.id, labels).await?;
        Ok(())
    }

    /// Tears a pool member down and deletes everything it had (it never belonged to anyone:
    /// no tombstone, no soft delete), and drops it from the table.
    pub(super) async fn retire(&self, sb: Arc<Sandbox>) {
        let _g = sb.ops.lock().await;
        if let Err(e) = self.inner.rt.teardown(&sb.id).await {
            warn!(sandbox_id = %sb.id, error = %e, "pool member teardown failed");
        }
        self.agent_gone(&sb.id).await;
        let leftovers = self.leftovers(&sb.id);
        let paths = self.paths(&sb.id);
        let id = sb.id.clone();
        let _ = blocking(move || {
            leftovers.remove();
            if let Err(e) = volume::delete(&paths) {
                warn!(sandbox_id = %id, error = %e, "could not delete pool member workspace");
            }
        })
        .await;
        sb.set_destroyed(Default::default());
        let mut t = self.table();
        if t.by_id.get(&sb.id).is_some_and(|cur| cur.same(&sb)) {
            t.by_id.remove(&sb.id);
        }
        info!(sandbox_id = %sb.id, "pool member retired");
    }

    /// Boots one member of `entry` and waits until it is READY (or failed). `Ok(false)`: no
    /// room on the node (or draining), nothing booted.
    async fn boot_member(&self, entry: &PoolEntry) -> Result<bool> {
        let cfg = &self.inner.cfg;
        // Pulled first when missing (and allowed): the member's record names its digest.
        let digest = self.inner.rt.resolve_image(&entry.image).await?.digest;
        let sb = {
            let mut t = self.table();
            let live = t.by_id.values().filter(|s| s.status().is_live()).count();
            if cfg.draining || live >= cfg.max_sandboxes as usize {
                return Ok(false);
            }
            let def = Definition {
                id: uuid::Uuid::new_v4().to_string(),
                tenant_id: String::new(),
                session_id: String::new(),
                image: entry.image.clone(),
                created_at: SystemTime::now(),
                limits: Limits {
                    cpu_millis: cfg.default_cpu_millis,
                    memory_bytes: cfg.default_memory_bytes,
                    max_runtime: Duration::from_secs(cfg.default_max_runtime_secs),
                },
                workspace: entry_workspace(entry),
                pool: true,
                image_digest: digest,
                platform: None,
            };
            let sb =
                Arc::new(self.sandbox(def, State::new(Status::Starting, ""), Persisted::default()));
            t.by_id.insert(sb.id.clone(), sb.clone());
            sb
        };
        let guard = sb.ops.lock().await;
        if let Err(e) = self.record(&sb).await {
            drop(guard);
            self.retire(sb).await;
            return Err(e);
        }
        drop(guard);
        info!(sandbox_id = %sb.id, image = %sb.image, "booting pool member");
        self.spawn_provision(sb.clone());
        // A failed boot is retired by the next pass, after the loop's back-off.
        self.wait_ready(&sb).await?;
        if self.agent_enabled() {
            self.warming().insert(sb.id.clone());
            self.await_agent(&sb.id).await;
            if let Err(e) = self.warm_up(&sb).await {
                warn!(sandbox_id = %sb.id, error = %e, "pool member warm-up failed");
            }
            self.warming().remove(&sb.id);
        }
        Ok(true)
    }

    /// Runs `true` once through a new member's agent before anyone claims it: the first exec
    /// of a sandbox pays for gVisor loading the dynamic loader and libc through the gofer
    /// (~10-15 ms here), which a tenant's first exec then finds cached. Its usage is the
    /// member's (a claim starts the tenant's from zero).
    async fn warm_up(&self, sb: &Sandbox) -> Result<()> {
        use crate::api::sandbox::v1 as spb;
        let command =
            sandbox_agent::command::render(&[], &sb.workspace.mount_path, &["true".to_string()])
                .ok_or_else(|| Error::Internal("warm-up command".into()))?;
        let mut events = self
            .relay()
            .exec_on_agent(spb::ExecRequest {
                sandbox_id: sb.id.clone(),
                exec: Some(spb::Exec {
                    req_id: super::exec::agent::rand_id(),
                    command,
                    stdin: vec![],
                    timeout_s: 10,
                    streaming: false,
                }),
            })
            .await
            .map_err(|e| Error::Internal(format!("warm-up: {e}")))?;
        let ended = tokio::time::timeout(Duration::from_secs(10), async {
            while let Some((spb::ExecEvent { event }, _)) = events.recv().await {
                match event {
                    Some(spb::exec_event::Event::End(e)) => return Ok(e.exit_code),
                    Some(spb::exec_event::Event::Error(e)) => return Err(e.message),
                    _ => {}
                }
            }
            Err("the agent went away".to_string())
        })
        .await;
        match ended {
            Ok(Ok(0)) => Ok(()),
            Ok(Ok(code)) => Err(Error::Internal(format!("warm-up exited {code}"))),
            Ok(Err(m)) => Err(Error::Internal(format!("warm-up: {m}"))),
            Err(_) => Err(Error::Internal("warm-up timed out".into())),
        }
    }

    /// One pass of the refill loop: retires failed members and members no entry wants any
    /// more (the config changed), then boots members until every entry has its size.
    async fn refill(&self) -> Result<()> {
        let entries = self.inner.cfg.pool_entries();
        let members: Vec<Arc<Sandbox>> = self
            .table()
            .by_id
            .values()
            .filter(|sb| sb.pool && sb.status() != Status::Destroyed)
            .cloned()
            .collect();
        let mut kept = vec![0u32; entries.len()];
        let mut members = members;
        members.sort_by_key(|sb| sb.created_at);
        for sb in members {
            let slot = entries
                .iter()
                .position(|e| e.image == sb.image && entry_workspace(e) == sb.workspace);
            let keep = sb.status().is_live()
                && slot.is_some_and(|i| {
                    kept[i] += 1;
                    kept[i] <= entries[i].size
                });
            if !keep {
                self.retire(sb).await;
            }
        }
        for (i, e) in entries.iter().enumerate() {
            while kept[i] < e.size {
                if self.inner.cfg.draining || !self.boot_member(e).await? {
                    return Ok(());
                }
                kept[i] += 1;
            }
        }
        Ok(())
    }

    /// Starts the refill loop when the node keeps a pool or has members from an earlier
    /// configuration to retire. It runs a pass at start, after every claim and every few
    /// seconds (backing off while boots fail); a draining node boots no members.
    pub(super) fn spawn_pool_loop(&self) {
        if !self.pool_enabled() && !self.table().by_id.values().any(|sb| sb.pool) {
            return;
        }
        let node = self.clone();
        self.inner.tasks.spawn(async move {
            let mut failures = 0u32;
            let mut woken = false;
            loop {
                if woken {
                    // Woken by a claim: let the claimed sandbox's first execs run before a
                    // boot (runsc start is CPU-heavy) competes with them.
                    tokio::time::sleep(REFILL_DELAY).await;
                }
                let wait = match node.refill().await {
                    Ok(()) => {
                        failures = 0;
                        Duration::from_secs(2)
                    }
                    Err(e) => {
                        failures = (failures + 1).min(5);
                        warn!(error = %e, "pool refill failed");
                        Duration::from_secs(2u64 << failures)
                    }
                };
                let mut members: Vec<(String, i64)> = node
                    .inner
                    .cfg
                    .pool_entries()
                    .into_iter()
                    .map(|e| (e.image, 0))
                    .collect();
                for sb in node.pool_members() {
                    if !node.is_warm(&sb) {
                        continue;
                    }
                    match members.iter_mut().find(|(i, _)| *i == sb.image) {
                        Some((_, n)) => *n += 1,
                        None => members.push((sb.image.clone(), 1)),
                    }
                }
                for (image, n) in members {
                    METRICS.pool_size(&image, n);
                }
                woken = tokio::select! {
                    _ = node.inner.pool_wake.notified() => true,
                    _ = tokio::time::sleep(wait) => false,
                };
            }
        });
    }
}
