//! Suspend and resume that keep memory (issue 19).
//!
//! * **Suspend** flushes the workspace, takes the meter's last reading, checkpoints the
//!   sandbox with its memory through containerd (runc's shim runs `runsc checkpoint` into
//!   `<state_dir>/checkpoints/<id>`; the task ends) and deletes the task: no processes, no
//!   memory, no cgroup are left. The record, its rootfs snapshot, the workspace volume, the
//!   session and the agent's FIFOs stay. Execs in flight are frozen with the sandbox and go
//!   on after the resume.
//! * **Resume** creates the task again with runc's `criu_image_path` option, so the shim's
//!   start is a `runsc restore`: the same processes, memory and open files. The agent inside
//!   reopens its FIFOs by path and carries on where it was (the daemon's side of its link
//!   never closed). A checkpoint that is missing, incomplete, made by another runsc, or that
//!   fails to restore falls back to a cold start of the same record, marked as such (memory
//!   lost). A platform Resume also revives a FAILED sandbox that way.
//! * **Idle suspend**: a READY sandbox with no exec running and no use (exec, stdin, output,
//!   file call, keep-alive) for its idle time is suspended: a platform sandbox's
//!   `idle_suspend_sec`, or the node's `idle_suspend_secs` for compute.v1 sandboxes, which
//!   resume transparently on their next exec or file call.
//! * Every step is in the record's labels (`status` = suspending, suspended, resuming), so a
//!   restarted daemon settles each by what the task and the checkpoint say.
//! * Metering: nothing is counted while suspended; the CPU banked at suspend carries over to
//!   the new cgroup's counter; the time away is time holding no memory.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use tracing::{info, instrument, warn};

use super::record::{self, Suspension};
use super::runlog::{Kind, Marker};
use super::{blocking, Error, Node, Result, Sandbox, Status};
use crate::runtime::TaskState;

/// The file a complete checkpoint has beside its image: the runsc version that wrote it.
const COMPLETE: &str = "complete";

/// The oldest runsc release verified to give a restored sandbox's init its new stdio.
const RESTORES_STDIO: u32 = 20240729;

/// Why a sandbox is suspended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// SuspendSandbox, or an operator.
    Request,
    /// It was idle for its idle time.
    Idle,
}

/// How a resume brought the sandbox back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resumed {
    /// It was already running.
    AlreadyRunning,
    /// Restored from its checkpoint: memory, processes and open files kept.
    Restored,
    /// Started afresh from its record; the reason its memory was lost.
    Cold(String),
}

/// What [`Node::resume`] returns.
pub type ResumeFuture<'a> = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<(Arc<Sandbox>, Resumed)>> + Send + 'a>,
>;

/// The bytes under `dir` (a checkpoint's size on disk). Blocking.
fn dir_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .filter_map(|e| e.ok())
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => dir_bytes(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

/// Why the checkpoint in `dir` cannot be restored by `runsc_version`, or None when it can.
/// Blocking.
pub fn unusable(dir: &Path, runsc_version: &str) -> Option<String> {
    match std::fs::read_to_string(dir.join(COMPLETE)) {
        Err(_) => Some("no complete checkpoint".into()),
        Ok(v) if v.trim() != runsc_version.trim() => Some(format!(
            "the checkpoint was made by {:?}, this node runs {:?}",
            v.trim(),
            runsc_version.trim()
        )),
        Ok(_) => None,
    }
}

impl Node {
    /// Where a sandbox's checkpoint goes.
    pub fn checkpoint_dir(&self, id: &str) -> PathBuf {
        self.inner.cfg.state_dir.join("checkpoints").join(id)
    }

    /// Why this node cannot suspend with memory, or None when it can (the runc v2 shim
    /// driving runsc; `computectl doctor` says which).
    pub fn suspend_unsupported(&self) -> Option<String> {
        let dir = Path::new("/");
        let choice = self.inner.rt.choice();
        if choice.checkpoint_options(dir).is_none() || choice.restore_options(dir).is_none() {
            return Some(format!(
                "the {} runtime cannot checkpoint through containerd 1.6 without its content \
                 store (use runtime = \"runc-wrapper\")",
                choice.name
            ));
        }
        // runsc 20221219 restores the sandbox, but not its init's stdio: the in-sandbox agent
        // would come back cut off from the daemon. 20240729 reconnects it (verified here).
        if let Some(date) = choice.runsc.date {
            if date < RESTORES_STDIO && self.agent_enabled() {
                return Some(format!(
                    "runsc {date} does not reconnect the sandbox's stdio on restore, so the \
                     in-sandbox agent would be lost: needs runsc {RESTORES_STDIO} or later"
                ));
            }
        }
        None
    }

    /// Why sandboxes with a network cannot be suspended here (None: they can, or the node
    /// gives none).
    pub fn suspend_networked_unsupported(&self) -> Option<String> {
        let e = self.inner.cfg.egress.as_ref()?;
        if e.runsc_network == "host" {
            return Some(
                "runsc cannot checkpoint a sandbox on the host's network stack \
                 ([egress] runsc_network = \"host\"), so a sandbox with a network is not \
                 suspended"
                    .into(),
            );
        }
        (!e.suspend_with_network).then(|| {
            "[egress] suspend_with_network = false: a sandbox with a network is not suspended"
                .into()
        })
    }

    /// Why `sb` cannot be suspended here, or None.
    fn unsuspendable(&self, sb: &Sandbox) -> Option<String> {
        self.suspend_unsupported().or_else(|| {
            sb.platform
                .as_ref()
                .and_then(|p| p.network)
                .and_then(|_| self.suspend_networked_unsupported())
        })
    }

    /// How long `sb` may stay idle before it is suspended (None: never).
    pub fn idle_suspend_after(&self, sb: &Sandbox) -> Option<Duration> {
        if sb.pool || self.unsuspendable(sb).is_some() {
            return None;
        }
        let secs = match &sb.platform {
            Some(p) => u64::from(p.idle_suspend_sec),
            None => self.inner.cfg.idle_suspend_secs,
        };
        (secs > 0).then(|| Duration::from_secs(secs))
    }

    /// When `sb` would next be idle-suspended (None when it never is).
    pub fn idle_suspend_at(&self, sb: &Sandbox) -> Option<SystemTime> {
        self.idle_suspend_after(sb).map(|d| sb.last_active() + d)
    }

    /// KeepAlive: restarts the idle clock of a READY sandbox; returns when it would next be
    /// idle-suspended (None when it never is). FAILED_PRECONDITION when it is not READY.
    pub fn keep_alive(&self, id: &str) -> Result<(Arc<Sandbox>, Option<SystemTime>)> {
        let sb = self.get(id)?;
        if sb.status() != Status::Ready {
            return Err(Error::FailedPrecondition {
                id: sb.id.clone(),
                state: sb.status().word().into(),
            });
        }
        sb.touch();
        let at = self.idle_suspend_at(&sb);
        Ok((sb, at))
    }

    /// Execs running in `id` now (those that hold a slot; a platform workload does not).
    fn execs_running(&self, id: &str) -> usize {
        let cap = self.config().max_execs_per_sandbox as usize;
        self.inner
            .exec_slots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .map_or(0, |s| cap.saturating_sub(s.available_permits()))
    }

    /// Suspends a READY sandbox with its memory (a SUSPENDED one is left as it is). Returns
    /// once it is SUSPENDED. FAILED_PRECONDITION in any other state, or when this node
    /// cannot suspend; a checkpoint that fails leaves the sandbox READY.
    #[instrument(skip_all, fields(sandbox_id = %id))]
    pub async fn suspend(&self, id: &str, cause: Cause) -> Result<Arc<Sandbox>> {
        let sb = self.get(id)?;
        if let Some(why) = self.unsuspendable(&sb) {
            return Err(Error::FailedPrecondition {
                id: sb.id.clone(),
                state: format!("not suspendable here: {why}"),
            });
        }
        let ops = sb.ops.clone();
        let _g = ops.lock().await;
        match sb.status() {
            Status::Ready => {}
            Status::Suspended => return Ok(sb),
            s => {
                return Err(Error::FailedPrecondition {
                    id: sb.id.clone(),
                    state: s.word().into(),
                })
            }
        }
        if cause == Cause::Idle {
            // Used since the idle loop looked: not idle any more.
            let idle = self
                .idle_suspend_at(&sb)
                .is_some_and(|at| at <= SystemTime::now());
            if !idle || self.execs_running(&sb.id) > 0 {
                return Ok(sb);
            }
        }
        self.not_shutting_down()?;
        let t0 = Instant::now();
        let rt = &self.inner.rt;
        sb.set_status(Status::Suspending, "");
        if let Err(e) = rt
            .set_labels(&sb.id, record::status_labels(Status::Suspending))
            .await
        {
            sb.set_status(Status::Ready, "");
            return Err(e.into());
        }
        // Every byte written so far reaches the workspace's device (and is counted), and the
        // meter takes its last reading of this cgroup.
        let meter = sb.meter.clone();
        let banked = blocking(move || {
            meter.flush_disk();
            meter.suspend()
        })
        .await?;
        self.persist_usage(&sb, &banked).await;
        let dir = self.checkpoint_dir(&sb.id);
        let d = dir.clone();
        blocking(move || {
            let _ = std::fs::remove_dir_all(&d);
            std::fs::create_dir_all(&d)
        })
        .await?
        .map_err(|e| Error::Internal(format!("checkpoint directory: {e}")))?;
        let memory = match rt.checkpoint(&sb.id, &dir).await {
            Ok(()) => true,
            Err(e) => {
                let state = rt.state(&sb.id).await.unwrap_or(TaskState::Unknown);
                if matches!(
                    state,
                    TaskState::Running | TaskState::Paused | TaskState::Unknown
                ) {
                    // Still running: it stays READY, as if nothing happened.
                    warn!(sandbox_id = %sb.id, error = %e, "checkpoint failed; still running");
                    let meter = sb.meter.clone();
                    let _ = blocking(move || meter.resumed(Duration::ZERO)).await;
                    let _ = rt
                        .set_labels(&sb.id, record::status_labels(Status::Ready))
                        .await;
                    let d = dir.clone();
                    let _ = blocking(move || std::fs::remove_dir_all(d)).await;
                    sb.set_status(Status::Ready, "");
                    return Err(Error::Internal(format!("could not suspend: {e}")));
                }
                // The sandbox ended on the way: suspended without its memory.
                warn!(sandbox_id = %sb.id, error = %e, "checkpoint failed; memory lost");
                false
            }
        };
        let version = rt.choice().runsc.version.clone();
        let d = dir.clone();
        let leftovers = self.leftovers(&sb.id);
        let bytes = blocking(move || {
            // The cgroup directories runsc may leave (empty now).
            leftovers.remove_cgroup();
            if memory {
                let _ = std::fs::write(d.join(COMPLETE), version);
            }
            dir_bytes(&d)
        })
        .await?;
        if self.agent_enabled() {
            self.stop_holder(&sb.id).await;
        }
        let s = Suspension {
            at: SystemTime::now(),
            checkpoint_bytes: bytes,
            memory,
        };
        if let Err(e) = rt.set_labels(&sb.id, record::suspended_labels(&s)).await {
            warn!(sandbox_id = %sb.id, error = %e, "could not record the suspension");
        }
        sb.set_suspension(Some(s));
        sb.set_status(Status::Suspended, "");
        // Its durable workspaces are free while it is suspended; resume claims them again.
        self.release_durable(sb.definition()).await;
        let why = match cause {
            Cause::Request => "suspended",
            Cause::Idle => "suspended after being idle",
        };
        if sb.platform.is_some() {
            let data = if memory {
                format!("{why}: memory kept ({bytes} bytes)")
            } else {
                format!("{why}: memory lost (the sandbox ended during its checkpoint)")
            };
            self.mark(&sb, Kind::Marker(Marker::Suspended), data, 0)
                .await;
        }
        info!(sandbox_id = %sb.id, ?cause, checkpoint_bytes = bytes, memory,
              ms = t0.elapsed().as_secs_f64() * 1e3, "sandbox suspended");
        Ok(sb)
    }

    /// Resumes a SUSPENDED sandbox (restored with its memory, else cold-started from its
    /// record) or revives a FAILED platform sandbox (cold); returns once it is READY.
    /// RESOURCE_EXHAUSTED when the node is full; FAILED_PRECONDITION in any other state.
    pub fn resume<'a>(&'a self, id: &'a str) -> ResumeFuture<'a> {
        // Boxed: a cold resume starts a platform workload, whose exec may come back here.
        Box::pin(self.resume_now(id))
    }

    #[instrument(skip_all, fields(sandbox_id = %id))]
    async fn resume_now(&self, id: &str) -> Result<(Arc<Sandbox>, Resumed)> {
        let sb = self.get(id)?;
        let guard = sb.ops.clone().lock_owned().await;
        let from = sb.status();
        match from {
            Status::Ready => return Ok((sb, Resumed::AlreadyRunning)),
            Status::Suspended | Status::Resuming => {}
            Status::Failed if sb.platform.is_some() && !self.is_deleting(&sb.id) => {}
            s => {
                return Err(Error::FailedPrecondition {
                    id: sb.id.clone(),
                    state: s.word().into(),
                })
            }
        }
        self.not_shutting_down()?;
        self.draining()?;
        {
            let t = self.table();
            let live = t.by_id.values().filter(|s| s.status().is_live()).count();
            if live >= self.config().max_sandboxes as usize {
                return Err(Error::ResourceExhausted(format!(
                    "node is at its maximum of {} running sandboxes",
                    self.config().max_sandboxes
                )));
            }
        }
        // Its durable workspaces again, unless another sandbox took one meanwhile
        // (FAILED_PRECONDITION; it stays as it was).
        if from != Status::Resuming {
            self.attach_durable(sb.definition()).await?;
        }
        let t0 = Instant::now();
        let rt = &self.inner.rt;
        sb.set_status(Status::Resuming, "");
        // The record first (a restart then finishes the resume), with the image looked up
        // meanwhile.
        let (_, image) = tokio::join!(
            rt.set_labels(&sb.id, record::status_labels(Status::Resuming)),
            rt.resolve_image(&sb.image)
        );
        let labelled = t0.elapsed();
        let outcome = match async { self.restart_task(&sb, from, &image?.chain_id).await }.await {
            Ok(o) => o,
            Err(e) => {
                warn!(sandbox_id = %sb.id, error = %e, "resume failed");
                self.fail(&sb, &format!("resume failed: {e}")).await;
                return Err(e);
            }
        };
        let restarted = t0.elapsed();
        let away = sb
            .suspension()
            .and_then(|s| SystemTime::now().duration_since(s.at).ok())
            .unwrap_or_default();
        let meter = sb.meter.clone();
        let _ = blocking(move || meter.resumed(away)).await;
        sb.set_suspension(None);
        sb.touch();
        if self.agent_enabled() && matches!(outcome, Resumed::Cold(_)) {
            self.expect_agent(&sb.id);
        }
        sb.set_status(Status::Ready, "");
        self.spawn_exit_watch(sb.clone());
        if from == Status::Failed {
            self.spawn_deadline(sb.clone());
        }
        if self.agent_enabled() {
            match outcome {
                Resumed::Cold(_) => self.spawn_agent_link(sb.clone(), false),
                _ if !self.has_agent_link(&sb.id) => self.spawn_agent_link(sb.clone(), true),
                _ => {}
            }
        }
        info!(sandbox_id = %sb.id, outcome = ?outcome,
              label_ms = labelled.as_secs_f64() * 1e3,
              restart_ms = (restarted - labelled).as_secs_f64() * 1e3,
              ms = t0.elapsed().as_secs_f64() * 1e3, "sandbox resumed");
        let how = outcome.clone();
        // What the caller need not wait for: the record, the checkpoint's removal, the run
        // log (still under the sandbox's lock, so a suspend waits for it).
        let node = self.clone();
        let sb2 = sb.clone();
        self.inner.tasks.spawn(async move {
            let _g = guard;
            let rt = &node.inner.rt;
            if let Err(e) = rt
                .set_labels(&sb2.id, record::status_labels(Status::Ready))
                .await
            {
                warn!(sandbox_id = %sb2.id, error = %e, "could not record the resume");
            }
            let dir = node.checkpoint_dir(&sb2.id);
            let _ = blocking(move || std::fs::remove_dir_all(dir)).await;
            if sb2.platform.is_some() {
                let data = match &outcome {
                    Resumed::Cold(why) => format!("resumed: memory lost ({why}): started afresh"),
                    _ => "resumed: memory kept".to_string(),
                };
                node.mark(&sb2, Kind::Marker(Marker::Resumed), data, 0)
                    .await;
                if matches!(outcome, Resumed::Cold(_)) {
                    // The same record, the same workload: it starts again.
                    let (n, s) = (node.clone(), sb2.clone());
                    node.inner
                        .tasks
                        .spawn(async move { n.run_workload(s).await });
                }
            }
        });
        Ok((sb, how))
    }

    /// Creates the sandbox's task again: restored from its checkpoint when there is a usable
    /// one, else started afresh on the same record (the agent's FIFOs and link made anew).
    async fn restart_task(
        &self,
        sb: &Arc<Sandbox>,
        from: Status,
        chain_id: &str,
    ) -> Result<Resumed> {
        let rt = &self.inner.rt;
        let agent = self.agent_enabled();
        let dir = self.checkpoint_dir(&sb.id);
        let version = rt.choice().runsc.version.clone();
        let d = dir.clone();
        // The sandbox's network (if any) as runsc needs it to take its interface again.
        self.network_again(sb).await?;
        let mut lost = if from == Status::Failed {
            Some("it had failed".to_string())
        } else {
            blocking(move || unusable(&d, &version)).await?
        };
        if lost.is_none() {
            let (stdin, stdout, stderr) = if agent {
                let (i, o) = self.restore_agent_io(&sb.id).await?;
                (i, o, self.agent_stderr(&sb.id))
            } else {
                Default::default()
            };
            match rt
                .restore(&sb.id, chain_id, [&stdin, &stdout, &stderr], &dir)
                .await
            {
                Ok(()) => return Ok(Resumed::Restored),
                Err(e) => {
                    warn!(sandbox_id = %sb.id, error = %e, "restore failed: cold start");
                    lost = Some(format!("the checkpoint could not be restored: {e}"));
                    // The failed restore may have taken the network's address already.
                    self.network_again(sb).await?;
                }
            }
        }
        // A cold start: a new agent (if any) on new FIFOs, its old link ended first.
        let (stdin, stdout, stderr) = if agent {
            self.stop_agent_link(&sb.id);
            let (i, o) = self.prepare_agent_io(&sb.id).await?;
            (i, o, self.agent_stderr(&sb.id))
        } else {
            Default::default()
        };
        rt.start(&sb.id, chain_id, [&stdin, &stdout, &stderr])
            .await?;
        Ok(Resumed::Cold(lost.unwrap_or_default()))
    }

    /// compute.v1's transparent resume: a suspended compute.v1 sandbox is resumed before the
    /// exec or file call that needs it (the caller sees only the latency).
    pub(super) async fn wake(&self, sb: &Sandbox) -> Result<()> {
        if sb.platform.is_none() && matches!(sb.status(), Status::Suspending | Status::Suspended) {
            self.resume(&sb.id).await?;
        }
        Ok(())
    }

    /// A restarted daemon settles a sandbox caught between steps, by its task and its
    /// checkpoint: SUSPENDING with a running task stays READY (the checkpoint did not
    /// happen), without one it is SUSPENDED (with its memory if the checkpoint completed);
    /// RESUMING with a running task is READY, without one SUSPENDED, and resumed again.
    pub(super) async fn settle_suspension(&self, sb: &Arc<Sandbox>) -> Result<()> {
        let rt = &self.inner.rt;
        let status = sb.status();
        if !matches!(status, Status::Suspending | Status::Resuming) {
            return Ok(());
        }
        let running = |state| {
            matches!(
                state,
                TaskState::Running | TaskState::Paused | TaskState::Unknown
            )
        };
        let dir = self.checkpoint_dir(&sb.id);
        let mut state = rt.state(&sb.id).await?;
        if status == Status::Suspending && running(state) {
            state = self.wait_checkpoint_in_flight(sb, &dir, state).await?;
        }
        info!(sandbox_id = %sb.id, ?status, ?state, "settling a suspend or resume");
        if running(state) {
            if status == Status::Resuming {
                let away = sb
                    .suspension()
                    .and_then(|s| SystemTime::now().duration_since(s.at).ok())
                    .unwrap_or_default();
                let meter = sb.meter.clone();
                let _ = blocking(move || meter.resumed(away)).await;
            }
            // Running: no checkpoint of it is kept (a resume cut short restored it; a
            // suspend cut short left a partial one, or a past suspension's labels).
            sb.set_suspension(None);
            let d = dir.clone();
            let _ = blocking(move || std::fs::remove_dir_all(d)).await;
            let _ = rt
                .set_labels(&sb.id, record::status_labels(Status::Ready))
                .await;
            sb.set_status(Status::Ready, "");
            return Ok(());
        }
        // The task a checkpoint (or a restore) cut short ended: deleted, so that no shim
        // stays behind while suspended.
        if state != TaskState::Missing {
            if let Err(e) = rt.delete_task(&sb.id).await {
                warn!(sandbox_id = %sb.id, error = %e, "could not delete the ended task");
            }
        }
        if self.agent_enabled() {
            self.stop_holder(&sb.id).await;
        }
        let version = rt.choice().runsc.version.clone();
        let d = dir.clone();
        let leftovers = self.leftovers(&sb.id);
        let (memory, bytes) = blocking(move || {
            leftovers.remove_cgroup();
            (unusable(&d, &version).is_none(), dir_bytes(&d))
        })
        .await?;
        // A suspend cut short never recorded its suspension: the labels may still hold a
        // past one's.
        let recorded = (status == Status::Resuming)
            .then(|| sb.suspension())
            .flatten();
        let s = recorded.unwrap_or(Suspension {
            at: SystemTime::now(),
            checkpoint_bytes: bytes,
            memory,
        });
        let _ = rt.set_labels(&sb.id, record::suspended_labels(&s)).await;
        sb.set_suspension(Some(s));
        sb.set_status(Status::Suspended, "");
        if status == Status::Resuming {
            let node = self.clone();
            let sb = sb.clone();
            self.inner.tasks.spawn(async move {
                if let Err(e) = node.resume(&sb.id).await {
                    warn!(sandbox_id = %sb.id, error = %e, "resume after a restart failed");
                }
            });
        }
        Ok(())
    }

    /// A SUSPENDING sandbox whose task still runs after a restart: the killed daemon may have
    /// left a checkpoint under way in the shim, which ends the task once written. While its
    /// checkpoint directory has data and grows, waits (bounded) for the task to end; returns
    /// the task's state then.
    async fn wait_checkpoint_in_flight(
        &self,
        sb: &Sandbox,
        dir: &Path,
        mut state: TaskState,
    ) -> Result<TaskState> {
        const STALL: Duration = Duration::from_secs(5);
        const BOUND: Duration = Duration::from_secs(120);
        let t0 = Instant::now();
        let (mut last, mut grew) = (0, Instant::now());
        loop {
            let d = dir.to_path_buf();
            let bytes = blocking(move || dir_bytes(&d)).await?;
            if bytes == 0 && last == 0 && t0.elapsed() >= Duration::from_millis(500) {
                // No checkpoint was started (or it wrote nothing in half a second).
                return Ok(state);
            }
            if bytes != last {
                (last, grew) = (bytes, Instant::now());
            }
            if grew.elapsed() > STALL || t0.elapsed() > BOUND {
                warn!(sandbox_id = %sb.id, bytes, "a checkpoint cut short never ended the task");
                return Ok(state);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            state = self.inner.rt.state(&sb.id).await?;
            if !matches!(
                state,
                TaskState::Running | TaskState::Paused | TaskState::Unknown
            ) {
                info!(sandbox_id = %sb.id, bytes, ms = t0.elapsed().as_millis() as u64,
                      "a checkpoint cut short by the restart ended the task");
                return Ok(state);
            }
        }
    }

    /// The idle-suspend loop: every `idle_check_ms` it suspends, one at a time, the READY
    /// sandboxes idle past their idle time with no exec running.
    pub(super) fn spawn_idle_loop(&self) {
        if self.suspend_unsupported().is_some() {
            return;
        }
        let node = self.clone();
        self.inner.tasks.spawn(async move {
            let every = Duration::from_millis(node.config().idle_check_ms.max(50));
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let now = SystemTime::now();
                let due: Vec<Arc<Sandbox>> = node
                    .list()
                    .into_iter()
                    .filter(|sb| sb.status() == Status::Ready)
                    .filter(|sb| node.idle_suspend_at(sb).is_some_and(|at| at <= now))
                    .filter(|sb| node.execs_running(&sb.id) == 0)
                    .collect();
                for sb in due {
                    if let Err(e) = node.suspend(&sb.id, Cause::Idle).await {
                        warn!(sandbox_id = %sb.id, error = %e, "idle suspend failed");
                        // Not again right away.
                        sb.touch();
                    }
                }
            }
        });
    }
}
