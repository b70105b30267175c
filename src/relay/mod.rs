//! The sandbox.v1 relay: workers attach (`SandboxWorker.Attach`), harnesses run commands on
//! them (`SandboxExec.Exec`/`Abort`), and the relay bridges the two by sandbox_id.
//!
//! Semantics (see `relay-sandbox-v1.proto.md`):
//! * A worker sends `Hello` first, then heartbeats; any frame counts as liveness. A worker that
//!   is silent for `heartbeat_timeout` is dropped and its in-flight execs end with `ExecError`.
//! * A second `Hello` for the same sandbox_id replaces the first cleanly: the old stream is
//!   closed and its in-flight execs end with `ExecError` ("worker replaced").
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
pub mod service;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, Notify};
use tonic::Status;
use tracing::{info, warn};

use crate::api::sandbox::v1 as pb;
use pb::server_frame::Msg as ServerMsg;
use pb::worker_frame::Msg as WorkerMsg;

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

/// Per-exec events, unbounded so that every event is queued in order without waiting on the
/// harness (which would stall the worker's other execs).
type EventTx = mpsc::UnboundedSender<Result<pb::ExecEvent, Status>>;

struct Inflight {
    tx: EventTx,
    streaming: bool,
    stdout: Vec<u8>,
}

/// One attached worker.
pub struct Worker {
    id: u64,
    /// Its Hello.
    pub hello: pb::Hello,
    tx: mpsc::Sender<Result<pb::ServerFrame, Status>>,
    inflight: Mutex<HashMap<u64, Inflight>>,
    last_seen: Mutex<Instant>,
    /// Dropped when silent for `heartbeat_timeout`. Not the in-sandbox agents: the sandbox's
    /// own state tells whether they live, and 50 sandboxes' heartbeats would cost CPU.
    watched: bool,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn error_event(req_id: u64, message: &str) -> pb::ExecEvent {
    pb::ExecEvent {
        event: Some(pb::exec_event::Event::Error(pb::ExecError {
            req_id,
            message: message.to_string(),
        })),
    }
}

impl Worker {
    /// Ends every in-flight exec with an ExecError.
    fn fail_all(&self, why: &str) {
        let all: Vec<(u64, Inflight)> = lock(&self.inflight).drain().collect();
        for (req_id, f) in all {
            let _ = f.tx.send(Ok(error_event(req_id, why)));
        }
    }

    /// Number of execs in flight.
    pub fn inflight(&self) -> usize {
        lock(&self.inflight).len()
    }
}

struct Inner {
    settings: Settings,
    workers: Mutex<HashMap<String, Arc<Worker>>>,
    attached: Notify,
    next_id: std::sync::atomic::AtomicU64,
}

/// The relay. Cheap to clone.
#[derive(Clone)]
pub struct Relay {
    inner: Arc<Inner>,
}

impl Relay {
    /// A relay with `settings`; spawns its heartbeat watchdog.
    pub fn new(settings: Settings) -> Self {
        let r = Self {
            inner: Arc::new(Inner {
                settings,
                workers: Mutex::new(HashMap::new()),
                attached: Notify::new(),
                next_id: Default::default(),
            }),
        };
        let weak = Arc::downgrade(&r.inner);
        tokio::spawn(async move {
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

    /// The worker attached for a sandbox.
    pub fn worker(&self, sandbox_id: &str) -> Option<Arc<Worker>> {
        lock(&self.inner.workers).get(sandbox_id).cloned()
    }

    /// Every attached worker.
    pub fn workers(&self) -> Vec<Arc<Worker>> {
        lock(&self.inner.workers).values().cloned().collect()
    }

    /// Registers a worker after its Hello; replaces (and closes) an earlier one for the same
    /// sandbox. Returns the worker and the stream of frames to send it.
    pub fn attach(
        &self,
        hello: pb::Hello,
    ) -> (Arc<Worker>, mpsc::Receiver<Result<pb::ServerFrame, Status>>) {
        self.attach_with(hello, true)
    }

    /// `attach` for a sandbox's own agent, whose link ends with the sandbox: no heartbeat
    /// deadline.
    pub fn attach_in_sandbox(
        &self,
        hello: pb::Hello,
    ) -> (Arc<Worker>, mpsc::Receiver<Result<pb::ServerFrame, Status>>) {
        self.attach_with(hello, false)
    }

    fn attach_with(
        &self,
        hello: pb::Hello,
        watched: bool,
    ) -> (Arc<Worker>, mpsc::Receiver<Result<pb::ServerFrame, Status>>) {
        let (tx, rx) = mpsc::channel(256);
        let w = Arc::new(Worker {
            id: self
                .inner
                .next_id
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            hello,
            tx,
            inflight: Mutex::new(HashMap::new()),
            last_seen: Mutex::new(Instant::now()),
            watched,
        });
        let old = lock(&self.inner.workers).insert(w.hello.sandbox_id.clone(), w.clone());
        if let Some(old) = old {
            info!(sandbox_id = %w.hello.sandbox_id, "worker replaced by a new Hello");
            old.fail_all("worker replaced");
            let _ = old
                .tx
                .try_send(Err(Status::aborted("replaced by a new worker")));
        }
        info!(sandbox_id = %w.hello.sandbox_id, capacity = w.hello.capacity_max, "worker attached");
        self.inner.attached.notify_waiters();
        (w, rx)
    }

    /// Removes a worker (if it is still the registered one) and fails its in-flight execs.
    pub fn detach(&self, w: &Arc<Worker>, why: &str) {
        {
            let mut ws = lock(&self.inner.workers);
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
                    let _ = f.tx.send(Ok(pb::ExecEvent {
                        event: Some(pb::exec_event::Event::Chunk(c)),
                    }));
                } else {
                    f.stdout.extend_from_slice(&c.data);
                }
            }
            WorkerMsg::End(e) => {
                let Some(f) = lock(&w.inflight).remove(&e.req_id) else {
                    return;
                };
                if !f.streaming && !f.stdout.is_empty() {
                    let _ = f.tx.send(Ok(pb::ExecEvent {
                        event: Some(pb::exec_event::Event::Chunk(pb::Chunk {
                            req_id: e.req_id,
                            data: f.stdout,
                            stream: pb::Stream::Stdout as i32,
                        })),
                    }));
                }
                let _ = f.tx.send(Ok(pb::ExecEvent {
                    event: Some(pb::exec_event::Event::End(e)),
                }));
            }
            WorkerMsg::Error(e) => {
                if let Some(f) = lock(&w.inflight).remove(&e.req_id) {
                    let _ = f.tx.send(Ok(pb::ExecEvent {
                        event: Some(pb::exec_event::Event::Error(e)),
                    }));
                }
            }
        }
    }

    async fn wait_worker(&self, sandbox_id: &str) -> Result<Arc<Worker>, Status> {
        let deadline = Instant::now() + self.inner.settings.worker_wait;
        loop {
            let notified = self.inner.attached.notified();
            if let Some(w) = self.worker(sandbox_id) {
                return Ok(w);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Status::unavailable(format!(
                    "no worker attached for sandbox {sandbox_id}"
                )));
            }
            let _ = tokio::time::timeout(left, notified).await;
        }
    }

    /// Starts an exec on the sandbox's worker; events arrive on the returned receiver.
    pub async fn exec(
        &self,
        req: pb::ExecRequest,
    ) -> Result<mpsc::UnboundedReceiver<Result<pb::ExecEvent, Status>>, Status> {
        let exec = req
            .exec
            .ok_or_else(|| Status::invalid_argument("exec is required"))?;
        if req.sandbox_id.is_empty() {
            return Err(Status::invalid_argument("sandbox_id is required"));
        }
        if exec.command.is_empty() {
            return Err(Status::invalid_argument("command is required"));
        }
        let w = self.wait_worker(&req.sandbox_id).await?;
        let (tx, rx) = mpsc::unbounded_channel();
        {
            let mut inflight = lock(&w.inflight);
            if inflight.contains_key(&exec.req_id) {
                return Err(Status::already_exists(format!(
                    "req_id {} is already running on this worker",
                    exec.req_id
                )));
            }
            let cap = w.hello.capacity_max as usize;
            if cap > 0 && inflight.len() >= cap {
                return Err(Status::resource_exhausted(format!(
                    "worker is at its capacity of {cap} concurrent execs"
                )));
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
            return Err(Status::unavailable("worker went away"));
        }
        // The harness going away aborts the exec on the worker.
        let relay = self.clone();
        let w2 = w.clone();
        tokio::spawn(async move {
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
        if let Some(w) = self.worker(sandbox_id) {
            let known = lock(&w.inflight).contains_key(&req_id);
            if known {
                self.send_abort(&w, req_id).await;
            }
        }
    }
}
