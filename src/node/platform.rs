//! The platform API's sandboxes on the node: a platform sandbox is a node sandbox whose
//! definition carries a [`PlatformSpec`] (namespace, environment, workload, env, labels), kept
//! in its container labels like the rest of its record. On top of the node's lifecycle it has
//!
//! * a workload, started by the in-sandbox agent once the sandbox is READY and supervised to
//!   its exit (an exec with no slot and no cap but the sandbox's lifetime), whose output and
//!   exit go to the sandbox's run log ([`super::runlog`]);
//! * lifecycle markers in the run log (created, started, exited with its code, oom killed,
//!   failed, terminated, deleted);
//! * a hard delete: no flush, the workspace deleted at once rather than soft-deleted, the
//!   record gone (Get answers NOT_FOUND), the run log removed after its last follower had time
//!   to read the final marker;
//! * its max lifetime ending it as TERMINATED (a destroy) rather than FAILED.
//!
//! A compute.v1 sandbox has no spec: the platform shows it read-only.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tracing::{info, instrument, warn};

use super::exec::{ExecEvent, ExecRequest};
use super::runlog::{Kind, Marker, RunLog};
use super::{blocking, record, Error, Node, Result, Sandbox, Status};
use crate::flow::Hold;
use crate::metering::Usage;
use crate::volume;

/// The max lifetime of a platform sandbox whose environment sets none (0 = no limit).
pub const NO_LIFETIME_LIMIT: Duration = Duration::from_secs(u32::MAX as u64);

/// The file beside a run log holding the agent's request id of the workload.
const WORKLOAD_FILE: &str = "workload";

/// How long a deleted sandbox's run log stays on disk for followers to read its last entry.
const DELETED_LOG_KEEP: Duration = Duration::from_secs(30);

/// What the platform API made a sandbox with, beyond the node's own definition.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct PlatformSpec {
    /// Namespace.
    pub namespace: String,
    /// The environment it was made from.
    pub environment: String,
    /// The workload, resolved (request argv, else the environment's default_argv, else the
    /// image's ENTRYPOINT/CMD); empty with exec_only.
    pub argv: Vec<String>,
    /// Runs no workload.
    pub exec_only: bool,
    /// The workload's environment (the environment's, then the request's over it).
    pub env: BTreeMap<String, String>,
    /// The workload's working directory (empty: the workspace's mount path).
    pub working_dir: String,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// 0 = no limit.
    pub max_lifetime_sec: u32,
    /// 0 = never idle-suspended (suspend comes with issue 19; kept and shown).
    pub idle_suspend_sec: u32,
    /// The environment's base egress policy, as the platform stores it (JSON; issue 20).
    #[serde(default)]
    pub egress: Option<serde_json::Value>,
    /// Its network's slot in the node's pool (None: no network; the node had no `[egress]`
    /// when it was made).
    #[serde(default)]
    pub network: Option<u32>,
    /// The idempotency key it was created with, if any.
    #[serde(default)]
    pub idempotency_key: String,
    /// Whether the first workspace mount (the node sandbox's own workspace) is read-only
    /// inside the sandbox.
    #[serde(default)]
    pub read_only: bool,
    /// The second and later ephemeral workspace mounts (at most 7), each a volume of its own
    /// ([`crate::workspace::Paths::extra`], numbered from 1), made and deleted with the sandbox.
    #[serde(default)]
    pub mounts: Vec<ExtraMount>,
    /// The durable workspace the first mount is (empty: an ephemeral one, the node sandbox's
    /// own workspace).
    #[serde(default)]
    pub workspace_id: String,
}

impl PlatformSpec {
    /// Whether its workspace is the plain one a pool member has: one read-write mount (so a
    /// pool member can take the sandbox over).
    pub fn plain_workspace(&self) -> bool {
        self.mounts.is_empty() && !self.read_only && self.workspace_id.is_empty()
    }
}

/// One of a platform sandbox's extra ephemeral workspace mounts.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ExtraMount {
    /// Where the sandbox sees it (absolute, clean, not overlapping another mount).
    pub mount_path: String,
    /// Its size cap (bytes), as the first mount's is.
    pub size: crate::size::ByteSize,
    /// Read-only inside the sandbox.
    #[serde(default)]
    pub read_only: bool,
    /// The durable workspace it is (empty: an ephemeral volume made for the sandbox).
    #[serde(default)]
    pub workspace_id: String,
}

/// The labels that record `spec` (its JSON in chunks `platform-0`, `platform-1`, ...).
pub fn spec_labels(spec: &PlatformSpec) -> HashMap<String, String> {
    record::chunk_labels("platform", &serde_json::to_string(spec).unwrap_or_default())
}

/// The spec recorded in `labels`, if any (and whole).
pub fn spec_of_labels(labels: &HashMap<String, String>) -> Option<PlatformSpec> {
    serde_json::from_str(&record::unchunk_labels("platform", labels)?).ok()
}

/// What the workload of a sandbox is doing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Workload {
    /// Not started (yet), or none (exec_only).
    None,
    /// Running.
    Running,
    /// Exited with this code.
    Exited(i32),
    /// Killed for going over the sandbox's memory.
    OomKilled,
    /// Its agent lost it (a daemon restart cut the stream; the process may go on).
    Lost,
}

/// The node's platform state: run logs, workloads, deletions under way.
#[derive(Default)]
pub(super) struct State {
    logs: Mutex<HashMap<String, Arc<RunLog>>>,
    workloads: Mutex<HashMap<String, tokio::sync::watch::Sender<Workload>>>,
    deleting: Mutex<HashSet<String>>,
    /// When each sandbox's workload last changed.
    changed: Mutex<HashMap<String, SystemTime>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One page of a listing, newest first.
#[derive(Debug, Default)]
pub struct Page {
    /// The sandboxes.
    pub sandboxes: Vec<Arc<Sandbox>>,
    /// The token of the next page; empty at the end.
    pub next: String,
}

/// The position of a sandbox in the listing order (newest first, then by id): what a page
/// token carries, so that a page goes on after the last one seen whatever came or went.
pub fn page_key(sb: &Sandbox) -> (u128, String) {
    let ns = sb
        .created_at
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    (ns, sb.id.clone())
}

/// The page token after `key`.
pub fn page_token(key: &(u128, String)) -> String {
    format!("{:x}.{}", key.0, key.1)
}

/// Parses a page token (INVALID_ARGUMENT when it is not one).
pub fn parse_page_token(t: &str) -> Result<Option<(u128, String)>> {
    if t.is_empty() {
        return Ok(None);
    }
    let bad = || Error::InvalidArgument(format!("page_token {t:?} is not one this API gave"));
    let (ns, id) = t.split_once('.').ok_or_else(bad)?;
    let ns = u128::from_str_radix(ns, 16).map_err(|_| bad())?;
    uuid::Uuid::parse_str(id).map_err(|_| bad())?;
    Ok(Some((ns, id.to_string())))
}

/// Sorts newest first and cuts one page after `after`, `size` long.
pub fn page_of(mut all: Vec<Arc<Sandbox>>, after: Option<&(u128, String)>, size: usize) -> Page {
    all.sort_by_key(|s| std::cmp::Reverse(page_key(s)));
    let mut v: Vec<Arc<Sandbox>> = all
        .into_iter()
        .filter(|s| after.is_none_or(|a| page_key(s) < *a))
        .take(size + 1)
        .collect();
    let next = if v.len() > size {
        v.truncate(size);
        v.last()
            .map(|s| page_token(&page_key(s)))
            .unwrap_or_default()
    } else {
        String::new()
    };
    Page { sandboxes: v, next }
}

/// Appends one chunk of workload output; its hold goes once it is on disk (the agent's window
/// opens again then).
async fn append_output(sb: &Sandbox, log: &Arc<RunLog>, kind: Kind, data: Vec<u8>, hold: Hold) {
    let l = log.clone();
    let r = blocking(move || {
        let r = l.append(1, kind, &data, 0);
        drop(hold);
        r
    })
    .await;
    if !matches!(r, Ok(Ok(_))) {
        warn!(sandbox_id = %sb.id, "could not write workload output to the run log");
    }
}

impl Node {
    fn runlog_dir(&self, id: &str) -> std::path::PathBuf {
        self.config().state_dir.join("runlogs").join(id)
    }

    /// The run log of platform sandbox `id`, opened on first use.
    pub async fn run_log(&self, id: &str) -> Result<Arc<RunLog>> {
        if let Some(l) = lock(&self.inner.platform.logs).get(id) {
            return Ok(l.clone());
        }
        let dir = self.runlog_dir(id);
        let retention = self.config().run_log_retention.bytes();
        let log = blocking(move || RunLog::open(&dir, retention))
            .await?
            .map_err(|e| Error::Internal(format!("run log of {id}: {e}")))?;
        let log = Arc::new(log);
        Ok(lock(&self.inner.platform.logs)
            .entry(id.to_string())
            .or_insert(log)
            .clone())
    }

    /// Appends a marker (or output) to a sandbox's run log; a failure is logged, not returned
    /// (the sandbox's life goes on without it).
    pub(super) async fn mark(&self, sb: &Sandbox, kind: Kind, data: String, code: i32) {
        let log = match self.run_log(&sb.id).await {
            Ok(l) => l,
            Err(e) => {
                warn!(sandbox_id = %sb.id, error = %e, "run log unavailable");
                return;
            }
        };
        let r = blocking(move || log.append(1, kind, data.as_bytes(), code)).await;
        if !matches!(r, Ok(Ok(_))) {
            warn!(sandbox_id = %sb.id, ?kind, "could not write to the run log");
        }
    }

    /// What the workload of `id` is doing, and a receiver of its changes.
    pub fn workload(&self, id: &str) -> tokio::sync::watch::Receiver<Workload> {
        lock(&self.inner.platform.workloads)
            .entry(id.to_string())
            .or_insert_with(|| tokio::sync::watch::channel(Workload::None).0)
            .subscribe()
    }

    /// When the workload of `id` last changed (None: not since this daemon started); the
    /// sandbox's own state carries its time.
    pub fn changed_at(&self, id: &str) -> Option<SystemTime> {
        lock(&self.inner.platform.changed).get(id).copied()
    }

    fn touch(&self, id: &str) {
        lock(&self.inner.platform.changed).insert(id.to_string(), SystemTime::now());
    }

    fn set_workload(&self, id: &str, w: Workload) {
        self.touch(id);
        lock(&self.inner.platform.workloads)
            .entry(id.to_string())
            .or_insert_with(|| tokio::sync::watch::channel(Workload::None).0)
            .send_replace(w);
    }

    /// Whether `sb` is being deleted through the platform API (or was).
    pub fn is_deleting(&self, id: &str) -> bool {
        lock(&self.inner.platform.deleting).contains(id)
    }

    /// The image's ENTRYPOINT and CMD, and its working directory.
    pub async fn image_argv(&self, image: &str) -> Result<(Vec<String>, String)> {
        let image = if image.is_empty() {
            self.config().sandbox_image.clone()
        } else {
            image.to_string()
        };
        let r = self.inner.rt.resolve_image(&image).await?;
        Ok((r.argv, r.working_dir))
    }

    /// CreateSandbox of the platform API: a node sandbox with `req.platform` set, its created
    /// marker written, its workload and lifecycle watch started.
    #[instrument(skip_all, fields(namespace = req.platform.as_ref().map(|p| p.namespace.as_str()).unwrap_or("")))]
    pub async fn create_platform(&self, mut req: super::CreateRequest) -> Result<Arc<Sandbox>> {
        let Some(mut spec) = req.platform.clone() else {
            return Err(Error::InvalidArgument("not a platform request".into()));
        };
        // On a node with networks, every platform sandbox gets one (deny-all but for its base
        // policy), so that grants can open it later.
        let slot = if self.egress_configured() {
            if let Some(base) = spec
                .egress
                .clone()
                .and_then(|v| serde_json::from_value(v).ok())
            {
                super::network::check_policy(&base)?;
            }
            let slot = self.allocate_network()?;
            Arc::make_mut(&mut spec).network = slot;
            req.platform = Some(spec.clone());
            slot
        } else {
            None
        };
        let sb = match self.create(req).await {
            Ok(sb) => sb,
            Err(e) => {
                if let Some(s) = slot {
                    self.release_network(s);
                }
                return Err(e);
            }
        };
        // A retry with the same idempotency key got the first sandbox (and its network).
        if let Some(s) = slot {
            if sb.platform.as_ref().and_then(|p| p.network) != Some(s) {
                self.release_network(s);
            }
        }
        // A retry with the same idempotency key gets the first sandbox: started already.
        if self.run_log(&sb.id).await?.tip() > 0 {
            return Ok(sb);
        }
        self.mark(&sb, Kind::Marker(Marker::Created), String::new(), 0)
            .await;
        info!(sandbox_id = %sb.id, environment = %spec.environment, exec_only = spec.exec_only,
              "platform sandbox created");
        self.spawn_platform_watch(sb.clone(), true);
        Ok(sb)
    }

    /// Re-arms what a recovered platform sandbox needs (its lifecycle watch; a workload the
    /// restart cut off is marked lost: its process may go on, its output is no longer read).
    pub(super) async fn recover_platform(&self, sb: Arc<Sandbox>) {
        let Ok(log) = self.run_log(&sb.id).await else {
            return;
        };
        let l2 = log.clone();
        let tail = blocking(move || {
            let tip = l2.tip();
            l2.read(tip.saturating_sub(64), 0, 64)
        })
        .await;
        let entries = match tail {
            Ok(Ok(v)) => v,
            _ => Vec::new(),
        };
        let started = entries
            .iter()
            .any(|e| e.kind == Kind::Marker(Marker::Started));
        let exited = entries.iter().rev().find_map(|e| match e.kind {
            Kind::Marker(Marker::Exited) => Some(Workload::Exited(e.exit_code)),
            Kind::Marker(Marker::OomKilled) => Some(Workload::OomKilled),
            _ => None,
        });
        let workload = match exited {
            Some(w) => w,
            None if started && !sb.platform.as_ref().is_some_and(|p| p.exec_only) => {
                if !sb.status().has_ended() && self.adopt_workload(sb.clone()).await {
                    Workload::Running
                } else {
                    Workload::Lost
                }
            }
            None => Workload::None,
        };
        self.set_workload(&sb.id, workload);
        let fresh = sb.status().is_live() && !started;
        self.spawn_platform_watch(sb, fresh);
    }

    /// Follows a platform sandbox's life: starts its workload once READY (`start`), writes the
    /// failed and terminated markers, and ends it at its max lifetime.
    fn spawn_platform_watch(&self, sb: Arc<Sandbox>, start: bool) {
        let node = self.clone();
        self.inner.tasks.spawn(async move {
            let mut rx = sb.subscribe();
            let mut started = !start;
            loop {
                let st = rx.borrow_and_update().clone();
                match st.status {
                    Status::Ready if !started => {
                        started = true;
                        let n = node.clone();
                        let s = sb.clone();
                        node.inner
                            .tasks
                            .spawn(async move { n.run_workload(s).await });
                    }
                    Status::Failed => {
                        node.mark(&sb, Kind::Marker(Marker::Failed), st.reason.clone(), 0)
                            .await;
                        // Destroyed follows, or a Resume revives it.
                        if rx.wait_for(|s| s.status != Status::Failed).await.is_err() {
                            return;
                        }
                        continue;
                    }
                    Status::Destroyed => {
                        if !node.is_deleting(&sb.id) {
                            node.mark(&sb, Kind::Marker(Marker::Terminated), st.reason.clone(), 0)
                                .await;
                        }
                        return;
                    }
                    _ => {}
                }
                if rx.changed().await.is_err() {
                    return;
                }
            }
        });
    }

    /// Runs the workload (or, with exec_only, only marks the sandbox started) and writes its
    /// output and its end to the run log. The agent's request id of the workload is kept
    /// beside the log, so that a daemon after a restart takes its output up again.
    pub(super) async fn run_workload(&self, sb: Arc<Sandbox>) {
        let Some(spec) = sb.platform.clone() else {
            return;
        };
        if spec.exec_only || spec.argv.is_empty() {
            self.mark(&sb, Kind::Marker(Marker::Started), String::new(), 0)
                .await;
            return;
        }
        // The sandbox's max lifetime ends it (TERMINATED); the exec's own timeout only
        // backs that up.
        let left = (sb.created_at + sb.limits.max_runtime)
            .duration_since(SystemTime::now())
            .unwrap_or(Duration::from_secs(1))
            .saturating_add(Duration::from_secs(30));
        let req_id = super::exec::agent::rand_id();
        let req = ExecRequest {
            command: spec.argv[0].clone(),
            args: spec.argv[1..].to_vec(),
            env: spec.env.clone().into_iter().collect(),
            working_dir: spec.working_dir.clone(),
            timeout: Some(left),
            workload: Some(req_id),
            tty: None,
            uncapped: false,
        };
        let log = match self.run_log(&sb.id).await {
            Ok(l) => l,
            Err(e) => {
                warn!(sandbox_id = %sb.id, error = %e, "no run log: workload not started");
                return;
            }
        };
        let id_file = self.runlog_dir(&sb.id).join(WORKLOAD_FILE);
        let _ = blocking(move || std::fs::write(id_file, req_id.to_string())).await;
        let mut rx = match self.exec(&sb.id, req).await {
            Ok(rx) => rx,
            Err(e) => {
                warn!(sandbox_id = %sb.id, error = %e, "workload did not start");
                self.mark(
                    &sb,
                    Kind::Marker(Marker::Failed),
                    format!("workload: {e}"),
                    0,
                )
                .await;
                return;
            }
        };
        self.set_workload(&sb.id, Workload::Running);
        self.mark(&sb, Kind::Marker(Marker::Started), spec.argv.join(" "), 0)
            .await;
        info!(sandbox_id = %sb.id, req_id, "workload started");
        let mut end = Workload::Lost;
        while let Some(ev) = rx.recv().await {
            let (kind, data, hold) = match ev {
                ExecEvent::Stdout(d, _, h) => (Kind::Stdout, d, h),
                ExecEvent::Stderr(d, _, h) => (Kind::Stderr, d, h),
                ExecEvent::Completed(c, _) => {
                    end = if c.oom_killed {
                        Workload::OomKilled
                    } else {
                        Workload::Exited(c.exit_code)
                    };
                    break;
                }
                ExecEvent::Failed(e) => {
                    warn!(sandbox_id = %sb.id, error = %e, "workload lost");
                    break;
                }
            };
            append_output(&sb, &log, kind, data, hold).await;
        }
        self.workload_ended(&sb, end).await;
    }

    /// Marks how a workload ended (its exit in the run log) and publishes it.
    async fn workload_ended(&self, sb: &Sandbox, end: Workload) {
        match end {
            Workload::Exited(code) => {
                self.mark(sb, Kind::Marker(Marker::Exited), String::new(), code)
                    .await
            }
            Workload::OomKilled => {
                self.mark(sb, Kind::Marker(Marker::OomKilled), String::new(), 137)
                    .await
            }
            _ => {}
        }
        info!(sandbox_id = %sb.id, workload = ?end, "workload ended");
        self.set_workload(&sb.id, end);
    }

    /// Takes up, after a restart, the output of a workload the agent still runs (started by
    /// the daemon before): it goes on to the run log, and its end is marked as ever.
    async fn adopt_workload(&self, sb: Arc<Sandbox>) -> bool {
        let id_file = self.runlog_dir(&sb.id).join(WORKLOAD_FILE);
        let req_id = blocking(move || std::fs::read_to_string(id_file))
            .await
            .ok()
            .and_then(|r| r.ok())
            .and_then(|s| s.trim().parse::<u64>().ok());
        let Some(req_id) = req_id else {
            return false;
        };
        let Ok(log) = self.run_log(&sb.id).await else {
            return false;
        };
        // Registered before the agent's link is read, so nothing it sends is dropped.
        let mut events = self.relay().adopt_on_agent(&sb.id, req_id);
        info!(sandbox_id = %sb.id, req_id, "workload taken up after a restart");
        let node = self.clone();
        self.inner.tasks.spawn(async move {
            use crate::api::sandbox::v1::{exec_event::Event, Stream};
            let mut end = Workload::Lost;
            while let Some((ev, hold)) = events.recv().await {
                match ev.event {
                    Some(Event::Chunk(c)) => {
                        let kind = if c.stream == Stream::Stderr as i32 {
                            Kind::Stderr
                        } else {
                            Kind::Stdout
                        };
                        append_output(&sb, &log, kind, c.data, hold).await;
                    }
                    Some(Event::End(e)) => {
                        // A negative code is the signal that ended it: 128 + n, as a shell says.
                        end = Workload::Exited(if e.exit_code < 0 {
                            128 - e.exit_code
                        } else {
                            e.exit_code
                        });
                        break;
                    }
                    Some(Event::Error(e)) => {
                        warn!(sandbox_id = %sb.id, error = %e.message, "workload lost");
                        break;
                    }
                    None => {}
                }
            }
            node.workload_ended(&sb, end).await;
        });
        true
    }

    /// DeleteSandbox of the platform API: hard-kills the sandbox (no flush), deletes its
    /// workspace at once, removes its record and tombstone, revokes its agent's credentials,
    /// and ends its run log with the deleted marker. A compute.v1 sandbox is refused.
    #[instrument(skip_all, fields(sandbox_id = %id))]
    pub async fn delete_platform(&self, id: &str) -> Result<Usage> {
        let sb = self.get(id)?;
        if sb.platform.is_none() {
            return Err(Error::FailedPrecondition {
                id: sb.id.clone(),
                state: "a compute.v1 sandbox (read-only here: destroy it through compute.v1)"
                    .into(),
            });
        }
        lock(&self.inner.platform.deleting).insert(sb.id.clone());
        // Its teardown is under way before the kill, so that the exit watch does not take the
        // kill's exit for a failure (a FAILED the watchers would see before TERMINATED).
        sb.cancel.cancel();
        // No flush: a hard kill first, then the node's teardown.
        let _ = self
            .inner
            .rt
            .kill(&sb.id, nix::sys::signal::Signal::SIGKILL)
            .await;
        let (_, usage) = self.destroy(&sb.id).await?;
        let paths = self.paths(&sb.id);
        blocking(move || volume::delete(&paths))
            .await?
            .map_err(|e| Error::Internal(format!("delete workspace: {e}")))?;
        self.mark(&sb, Kind::Marker(Marker::Deleted), String::new(), 0)
            .await;
        {
            let mut t = self.table();
            if t.by_id.get(&sb.id).is_some_and(|s| s.same(&sb)) {
                t.by_id.remove(&sb.id);
            }
        }
        lock(&self.inner.platform.workloads).remove(&sb.id);
        lock(&self.inner.platform.changed).remove(&sb.id);
        let node = self.clone();
        let id = sb.id.clone();
        self.inner.tasks.spawn(async move {
            tokio::time::sleep(DELETED_LOG_KEEP).await;
            let log = lock(&node.inner.platform.logs).remove(&id);
            let dir = node.runlog_dir(&id);
            let _ = blocking(move || {
                drop(log);
                std::fs::remove_dir_all(dir)
            })
            .await;
            lock(&node.inner.platform.deleting).remove(&id);
        });
        info!(sandbox_id = %sb.id, "platform sandbox deleted");
        Ok(usage)
    }

    /// Every sandbox the platform shows (platform ones and compute.v1 ones; not pool members,
    /// not deleted ones).
    pub fn platform_sandboxes(&self) -> Vec<Arc<Sandbox>> {
        let deleting = lock(&self.inner.platform.deleting).clone();
        self.table()
            .by_id
            .values()
            .filter(|s| !s.pool && !deleting.contains(&s.id))
            .cloned()
            .collect()
    }

    /// Removes run logs no sandbox of this node owns (left by a crash mid-delete).
    pub(super) async fn gc_run_logs(&self) {
        let root = self.config().state_dir.join("runlogs");
        let known: HashSet<String> = self.table().by_id.keys().cloned().collect();
        let _ = blocking(move || {
            let Ok(dir) = std::fs::read_dir(&root) else {
                return;
            };
            for d in dir.flatten() {
                let name = d.file_name().to_string_lossy().to_string();
                if !known.contains(&name) {
                    let _ = std::fs::remove_dir_all(d.path());
                }
            }
        })
        .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spec_survives_its_labels_whatever_its_size() {
        let mut spec = PlatformSpec {
            namespace: "team-a".into(),
            environment: "py".into(),
            argv: vec!["python3".into(), "-c".into(), "print('é')".into()],
            ..Default::default()
        };
        for i in 0..400 {
            spec.env.insert(format!("VAR_{i}"), "é".repeat(20));
        }
        let l = spec_labels(&spec);
        assert!(l.len() > 3, "{}", l.len());
        assert!(l.values().all(|v| v.len() <= record::LABEL_CHUNK));
        assert_eq!(spec_of_labels(&l), Some(spec));
        let mut torn = l.clone();
        torn.remove(&record::label("platform-1"));
        assert_eq!(spec_of_labels(&torn), None);
        assert_eq!(spec_of_labels(&HashMap::new()), None);
    }

    #[test]
    fn page_tokens_round_trip_and_bad_ones_are_invalid() {
        let key = (
            1_700_000_000_123_456_789u128,
            uuid::Uuid::new_v4().to_string(),
        );
        assert_eq!(parse_page_token(&page_token(&key)).unwrap(), Some(key));
        assert_eq!(parse_page_token("").unwrap(), None);
        for bad in [
            "x",
            "zz.f47ac10b-58cc-4372-a567-0e02b2c3d479",
            "10.not-a-uuid",
        ] {
            assert!(matches!(
                parse_page_token(bad),
                Err(Error::InvalidArgument(_))
            ));
        }
    }
}
