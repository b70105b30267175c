//! The sandbox.v1 relay: workers attach (`SandboxWorker.Attach`), harnesses run commands on
//! them (`SandboxExec.Exec`/`Abort`), and the relay bridges the two by sandbox_id.
//!
//! Semantics (see `relay-sandbox-v1.proto.md`):
//! * A worker sends `Hello` first, then heartbeats; any frame counts as liveness. A worker that
//!   is silent for `heartbeat_timeout` is dropped and its in-flight execs end with `ExecError`.
//! * Two kinds of worker, kept apart ([`Origin`]). A sandbox's own in-sandbox agent is
//!   registered only by the node, from the sandbox's private stdio FIFOs
//!   ([`Relay::attach_in_sandbox`]); whatever its Hello says, its sandbox_id is the sandbox's.
//!   An external worker attaches over the network and must present the credential the
//!   operator issued for its sandbox_id ([`auth`]); it can never register under the id of a
//!   sandbox this node hosts, so it can neither displace nor impersonate an agent, and
//!   ComputeService's execs go to agents only.
//! * A second `Hello` for the same sandbox_id (with a valid credential) replaces the first
//!   cleanly: the old stream is closed and its in-flight execs end with `ExecError` ("worker
//!   replaced").
//! * `req_id` is the correlation and dedup key: an Exec whose req_id is in flight on that
//!   worker is refused with ALREADY_EXISTS and never run twice.
//! * `capacity_max` (0 = unlimited) bounds concurrent execs per worker: one more is
//!   RESOURCE_EXHAUSTED (no queueing; the harness owns retries).
//! * `streaming=true` forwards every chunk as it arrives. `streaming=false` collects stdout
//!   (chunks with `Stream` STDOUT or UNSPECIFIED) and returns it as one chunk just before `End`;
//!   STDERR chunks are replayed as they come and never added to the returned stdout.
//! * Exec for a sandbox with no worker waits up to `worker_wait` for one to attach, then is
//!   UNAVAILABLE. Abort of an unknown req_id is a no-op. A harness that goes away aborts its
//!   exec on the worker.

pub use sandbox_agent::frame;
pub mod auth;
mod error;
pub mod service;
mod worker;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::{mpsc, Notify};
use tonic::Status;
use tracing::{info, warn};

use crate::api::sandbox::v1 as pb;
use crate::tasks::Tasks;
pub use error::Error;
use pb::server_frame::Msg as ServerMsg;
use pb::worker_frame::Msg as WorkerMsg;
use worker::{lock, Inflight};
pub use worker::{Origin, Worker, AGENT_TRUST};

/// The events of one exec, in order, ending with End or ExecError.
pub type Events = mpsc::UnboundedReceiver<pb::ExecEvent>;

/// Relay settings.
#[derive(Debug, Clone)]
pub struct Settings {
    /// A worker silent this long is dropped.
    pub heartbeat_timeout: Duration,
    /// How long an Exec waits for a worker to attach.
    pub worker_wait: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            heartbeat_timeout: Duration::from_secs(10),
            worker_wait: Duration::from_secs(0),
        }
    }
}

/// The frames the relay sends one worker.
pub type FrameRx = mpsc::Receiver<Result<pb::ServerFrame, Status>>;

/// Whether a sandbox_id names a sandbox this node hosts (its worker can only be its agent).
pub type Hosted = Box<dyn Fn(&str) -> bool + Send + Sync>;

struct Inner {
    settings: Settings,
    /// In-sandbox agents, by sandbox_id.
    agents: Mutex<HashMap<String, Arc<Worker>>>,
    /// External workers, by sandbox_id.
    workers: Mutex<HashMap<String, Arc<Worker>>>,
    credentials: auth::Credentials,
    hosted: Hosted,
    attached: Notify,
    next_id: std::sync::atomic::AtomicU64,
    tasks: Tasks,
}

/// The relay. Cheap to clone.
#[derive(Clone)]
pub struct Relay {
    inner: Arc<Inner>,
}

impl Relay {
    /// A relay with `settings`, admitting external workers with `credentials` and never under
    /// an id `hosted` claims; spawns its heartbeat watchdog (and every later task) through
    /// `tasks`.
    pub fn new(
        settings: Settings,
        credentials: auth::Credentials,
        hosted: Hosted,
        tasks: Tasks,
    ) -> Self {
        let r = Self {
            inner: Arc::new(Inner {
                settings,
                agents: Mutex::new(HashMap::new()),
                workers: Mutex::new(HashMap::new()),
                credentials,
                hosted,
                attached: Notify::new(),
                next_id: Default::default(),
                tasks: tasks.clone(),
            }),
        };
        let weak = Arc::downgrade(&r.inner);
        tasks.spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(500)).await;
                let Some(inner) = weak.upgrade() else { return };
                let relay = Relay { inner };
                relay.reap_silent();
            }
        });
        r
    }

    fn reap_silent(&self) {
        let timeout = self.inner.settings.heartbeat_timeout;
        let dead: Vec<Arc<Worker>> = lock(&self.inner.workers)
            .values()
            .filter(|w| w.watched && lock(&w.last_seen).elapsed() > timeout)
            .cloned()
            .collect();
        for w in dead {
            warn!(sandbox_id = %w.hello.sandbox_id, "worker missed its heartbeats: dropped");
            self.detach(&w, "worker missed its heartbeats");
        }
    }

    fn registry(&self, origin: Origin) -> &Mutex<HashMap<String, Arc<Worker>>> {
        match origin {
            Origin::Agent => &self.inner.agents,
            Origin::Network => &self.inner.workers,
        }
    }

    /// The tasks the relay's work is spawned through.
    pub fn tasks(&self) -> &Tasks {
        &self.inner.tasks
    }

    /// The credential store of external workers.
    pub fn credentials(&self) -> &auth::Credentials {
        &self.inner.credentials
    }

    /// Whether `sandbox_id` names a sandbox this node hosts (no network worker may take it).
    pub fn is_hosted(&self, sandbox_id: &str) -> bool {
        (self.inner.hosted)(sandbox_id)
    }

    /// The in-sandbox agent attached for a sandbox.
    pub fn agent(&self, sandbox_id: &str) -> Option<Arc<Worker>> {
        lock(&self.inner.agents).get(sandbox_id).cloned()
    }

    /// The worker that serves `SandboxExec` for a sandbox: its agent, else an external worker.
    pub fn worker(&self, sandbox_id: &str) -> Option<Arc<Worker>> {
        self.agent(sandbox_id)
            .or_else(|| lock(&self.inner.workers).get(sandbox_id).cloned())
    }

    /// Every attached worker, agents first.
    pub fn workers(&self) -> Vec<Arc<Worker>> {
        let mut v: Vec<Arc<Worker>> = lock(&self.inner.agents).values().cloned().collect();
        v.extend(lock(&self.inner.workers).values().cloned());
        v
    }

    /// Admits an external worker: `token` must be the credential of the Hello's sandbox_id,
    /// and that id must not be a sandbox this node hosts. Then registers it like
    /// [`Relay::attach_in_sandbox`] does an agent, replacing an earlier external worker.
    pub fn attach_network(
        &self,
        hello: pb::Hello,
        token: Option<&str>,
    ) -> Result<(Arc<Worker>, FrameRx), Error> {
        if hello.sandbox_id.is_empty() {
            return Err(Error::InvalidArgument("Hello needs a sandbox_id".into()));
        }
        if let Err(e) = self.inner.credentials.verify(&hello.sandbox_id, token) {
            warn!(sandbox_id = %hello.sandbox_id, error = %e, "worker refused");
            return Err(e);
        }
        if (self.inner.hosted)(&hello.sandbox_id) {
            let e = Error::PermissionDenied {
                sandbox_id: hello.sandbox_id.clone(),
                why: "a compute sandbox's only worker is its in-sandbox agent",
            };
            warn!(sandbox_id = %hello.sandbox_id, error = %e, "worker refused");
            return Err(e);
        }
        let mut hello = hello;
        if hello.trust.is_empty() {
            hello.trust = "untrusted".into();
        }
        Ok(self.attach_with(hello, Origin::Network))
    }

    /// Registers a sandbox's own agent, which the node reached over the sandbox's private
    /// FIFOs; `hello` is the node's (its sandbox_id is the sandbox's). Replaces an earlier
    /// agent of the same sandbox (a re-attach). No heartbeat deadline: the link ends with the
    /// sandbox.
    pub fn attach_in_sandbox(&self, hello: pb::Hello) -> (Arc<Worker>, FrameRx) {
        self.attach_with(hello, Origin::Agent)
    }

    fn attach_with(&self, hello: pb::Hello, origin: Origin) -> (Arc<Worker>, FrameRx) {
        let (tx, rx) = mpsc::channel(256);
        let w = Arc::new(Worker {
            id: self
                .inner
                .next_id
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            hello,
            origin,
            attached_at: SystemTime::now(),
            tx,
            inflight: Mutex::new(HashMap::new()),
            last_seen: Mutex::new(Instant::now()),
            watched: origin == Origin::Network,
        });
        let old = lock(self.registry(origin)).insert(w.hello.sandbox_id.clone(), w.clone());
        if let Some(old) = old {
            info!(sandbox_id = %w.hello.sandbox_id, origin = origin.word(), "worker replaced by a new Hello");
            old.fail_all("worker replaced");
            let _ = old
                .tx
                .try_send(Err(Status::aborted("replaced by a new worker")));
        }
        info!(sandbox_id = %w.hello.sandbox_id, origin = origin.word(), trust = %w.hello.trust,
              capacity = w.hello.capacity_max, "worker attached");
        self.inner.attached.notify_waiters();
        (w, rx)
    }

    /// Removes a worker (if it is still the registered one) and fails its in-flight execs.
    pub fn detach(&self, w: &Arc<Worker>, why: &str) {
        {
            let mut ws = lock(self.registry(w.origin));
            if ws
                .get(&w.hello.sandbox_id)
                .is_some_and(|cur| cur.id == w.id)
            {
                ws.remove(&w.hello.sandbox_id);
            }
        }
        w.fail_all(why);
        let _ = w.tx.try_send(Err(Status::unavailable(why.to_string())));
    }

    /// Disconnects the external worker of a sandbox_id (its credential was revoked); returns
    /// whether there was one.
    pub fn disconnect_network(&self, sandbox_id: &str, why: &str) -> bool {
        let w = lock(&self.inner.workers).get(sandbox_id).cloned();
        match w {
            Some(w) => {
                info!(sandbox_id, why, "external worker disconnected");
                self.detach(&w, why);
                true
            }
            None => false,
        }
    }

    /// Handles one frame from a worker.
    pub fn on_frame(&self, w: &Arc<Worker>, f: pb::WorkerFrame) {
        *lock(&w.last_seen) = Instant::now();
        let Some(msg) = f.msg else { return };
        match msg {
            WorkerMsg::Hello(_) | WorkerMsg::Heartbeat(_) => {}
            WorkerMsg::Chunk(c) => {
                let mut inflight = lock(&w.inflight);
                let Some(f) = inflight.get_mut(&c.req_id) else {
                    return;
                };
                let is_stderr = c.stream == pb::Stream::Stderr as i32;
                if f.streaming || is_stderr {
                    let _ = f.tx.send(pb::ExecEvent {
                        event: Some(pb::exec_event::Event::Chunk(c)),
                    });
                } else {
                    f.stdout.extend_from_slice(&c.data);
                }
            }
            WorkerMsg::End(e) => {
                let Some(f) = lock(&w.inflight).remove(&e.req_id) else {
                    return;
                };
                if !f.streaming && !f.stdout.is_empty() {
                    let _ = f.tx.send(pb::ExecEvent {
                        event: Some(pb::exec_event::Event::Chunk(pb::Chunk {
                            req_id: e.req_id,
                            data: f.stdout,
                            stream: pb::Stream::Stdout as i32,
                        })),
                    });
                }
                let _ = f.tx.send(pb::ExecEvent {
                    event: Some(pb::exec_event::Event::End(e)),
                });
            }
            WorkerMsg::Error(e) => {
                if let Some(f) = lock(&w.inflight).remove(&e.req_id) {
                    let _ = f.tx.send(pb::ExecEvent {
                        event: Some(pb::exec_event::Event::Error(e)),
                    });
                }
            }
        }
    }

    fn find(&self, sandbox_id: &str, agent_only: bool) -> Option<Arc<Worker>> {
        if agent_only {
            self.agent(sandbox_id)
        } else {
            self.worker(sandbox_id)
        }
    }

    /// The agent of a sandbox, waiting for its attach until `until` (None: not by then).
    pub async fn wait_agent(&self, sandbox_id: &str, until: Instant) -> Option<Arc<Worker>> {
        self.wait_until(sandbox_id, true, until).await
    }

    async fn wait_worker(&self, sandbox_id: &str, agent_only: bool) -> Result<Arc<Worker>, Error> {
        let until = Instant::now() + self.inner.settings.worker_wait;
        self.wait_until(sandbox_id, agent_only, until)
            .await
            .ok_or_else(|| {
                Error::Unavailable(format!("no worker attached for sandbox {sandbox_id}"))
            })
    }

    /// The worker (`agent_only`: the agent) of a sandbox, waiting for an attach until `until`.
    async fn wait_until(
        &self,
        sandbox_id: &str,
        agent_only: bool,
        until: Instant,
    ) -> Option<Arc<Worker>> {
        loop {
            let notified = self.inner.attached.notified();
            if let Some(w) = self.find(sandbox_id, agent_only) {
                return Some(w);
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            let _ = tokio::time::timeout(left, notified).await;
        }
    }

    /// Starts an exec on the sandbox's worker (`SandboxExec`: its agent, else an external
    /// worker); events arrive on the returned receiver.
    pub async fn exec(&self, req: pb::ExecRequest) -> Result<Events, Error> {
        self.exec_with(req, false).await
    }

    /// Starts an exec on the sandbox's in-sandbox agent only (ComputeService's execs: an
    /// external worker, whatever its trust, never gets them).
    pub async fn exec_on_agent(&self, req: pb::ExecRequest) -> Result<Events, Error> {
        self.exec_with(req, true).await
    }

    async fn exec_with(&self, req: pb::ExecRequest, agent_only: bool) -> Result<Events, Error> {
        let invalid = |m: &str| Error::InvalidArgument(m.into());
        let exec = req.exec.ok_or_else(|| invalid("exec is required"))?;
        if req.sandbox_id.is_empty() {
            return Err(invalid("sandbox_id is required"));
        }
        if exec.command.is_empty() {
            return Err(invalid("command is required"));
        }
        let w = self.wait_worker(&req.sandbox_id, agent_only).await?;
        let (tx, rx) = mpsc::unbounded_channel();
        {
            let mut inflight = lock(&w.inflight);
            if inflight.contains_key(&exec.req_id) {
                return Err(Error::AlreadyExists(exec.req_id));
            }
            let cap = w.hello.capacity_max as usize;
            if cap > 0 && inflight.len() >= cap {
                return Err(Error::ResourceExhausted(cap));
            }
            inflight.insert(
                exec.req_id,
                Inflight {
                    tx: tx.clone(),
                    streaming: exec.streaming,
                    stdout: Vec::new(),
                },
            );
        }
        let req_id = exec.req_id;
        if w.tx
            .send(Ok(pb::ServerFrame {
                msg: Some(ServerMsg::Exec(exec)),
            }))
            .await
            .is_err()
        {
            lock(&w.inflight).remove(&req_id);
            return Err(Error::Unavailable("worker went away".into()));
        }
        // The harness going away aborts the exec on the worker.
        let relay = self.clone();
        let w2 = w.clone();
        self.inner.tasks.spawn(async move {
            tx.closed().await;
            if lock(&w2.inflight).remove(&req_id).is_some() {
                relay.send_abort(&w2, req_id).await;
            }
        });
        Ok(rx)
    }

    async fn send_abort(&self, w: &Worker, req_id: u64) {
        let _ =
            w.tx.send(Ok(pb::ServerFrame {
                msg: Some(ServerMsg::Abort(pb::Abort { req_id })),
            }))
            .await;
    }

    /// Aborts an in-flight exec; an unknown req_id (or sandbox) is a no-op.
    pub async fn abort(&self, sandbox_id: &str, req_id: u64) {
        self.abort_with(sandbox_id, req_id, false).await
    }

    /// Aborts an in-flight exec of the sandbox's agent.
    pub async fn abort_on_agent(&self, sandbox_id: &str, req_id: u64) {
        self.abort_with(sandbox_id, req_id, true).await
    }

    async fn abort_with(&self, sandbox_id: &str, req_id: u64, agent_only: bool) {
        if let Some(w) = self.find(sandbox_id, agent_only) {
            let known = lock(&w.inflight).contains_key(&req_id);
            if known {
                self.send_abort(&w, req_id).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello(id: &str, trust: &str) -> pb::Hello {
        pb::Hello {
            sandbox_id: id.into(),
            trust: trust.into(),
            ..Default::default()
        }
    }

    fn relay(dir: &std::path::Path) -> Relay {
        let creds = auth::Credentials::new(auth::Credentials::path_in(dir));
        Relay::new(
            Settings::default(),
            creds,
            Box::new(|id: &str| id == "compute-1"),
            Tasks::new(),
        )
    }

    #[tokio::test]
    async fn network_workers_never_reach_an_agents_registry() {
        let dir = tempfile::tempdir().unwrap();
        let r = relay(dir.path());
        let (ext, _) = r.credentials().issue("ext-1", None).unwrap();
        let ext = ext.unwrap();
        // A planted credential for the compute sandbox's id.
        let (planted, _) = r.credentials().issue("compute-1", None).unwrap();
        let planted = planted.unwrap();
        let (agent, _agent_rx) = r.attach_in_sandbox(hello("compute-1", AGENT_TRUST));

        // Table: (Hello's id, token) → outcome.
        let cases: Vec<(&str, Option<&str>, tonic::Code)> = vec![
            ("compute-1", None, tonic::Code::Unauthenticated),
            ("compute-1", Some("cwt_bogus"), tonic::Code::Unauthenticated),
            ("compute-1", Some(&ext), tonic::Code::PermissionDenied),
            ("compute-1", Some(&planted), tonic::Code::PermissionDenied),
            ("ext-2", Some(&ext), tonic::Code::PermissionDenied),
            ("", Some(&ext), tonic::Code::InvalidArgument),
        ];
        for (id, tok, want) in &cases {
            let got = r
                .attach_network(hello(id, "trusted"), *tok)
                .err()
                .map(|e| e.code());
            assert_eq!(got, Some(*want), "{id} {tok:?}");
        }
        // The agent is still the one registered, and the only one ExecCommand may use.
        assert_eq!(r.agent("compute-1").unwrap().id, agent.id);
        assert_eq!(r.workers().len(), 1);

        // A legitimate external worker: recorded with its trust (empty = untrusted), never an
        // agent.
        let (w, _rx) = r.attach_network(hello("ext-1", ""), Some(&ext)).unwrap();
        assert_eq!(w.origin, Origin::Network);
        assert_eq!(w.hello.trust, "untrusted");
        assert!(r.agent("ext-1").is_none());
        assert_eq!(r.worker("ext-1").unwrap().id, w.id);
        let err = r
            .exec_on_agent(pb::ExecRequest {
                sandbox_id: "ext-1".into(),
                exec: Some(pb::Exec {
                    req_id: 1,
                    command: "true".into(),
                    ..Default::default()
                }),
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::Unavailable);
        // Revoke disconnects it.
        assert!(r.disconnect_network("ext-1", "revoked"));
        assert!(r.worker("ext-1").is_none());
    }
}
