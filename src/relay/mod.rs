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
//! * Output is bounded per exec (`crate::flow`). An agent is paced by credit and never goes
//!   over its window; an external worker cannot be paused by sandbox.v1, so once more than
//!   `worker_exec_buffer` bytes of one exec wait for a harness that is not reading, the exec
//!   ends with `ExecError` and the worker gets an `Abort`. `streaming=false` collects at most
//!   [`MAX_COLLECTED`] bytes of stdout, the same way.
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
use crate::flow::{Hold, Window};
use crate::tasks::Tasks;
pub use error::Error;
use pb::server_frame::Msg as ServerMsg;
use pb::worker_frame::Msg as WorkerMsg;
use worker::{error_event, lock, EventTx, Inflight};
pub use worker::{Origin, Worker, AGENT_TRUST};

/// Most stdout a `streaming=false` exec collects for its End (the largest message).
pub const MAX_COLLECTED: usize = 16 << 20;

/// The events of one exec, in order, ending with End or ExecError; each holds its bytes in
/// the exec's output window until dropped.
#[derive(Debug)]
pub struct Events {
    rx: mpsc::UnboundedReceiver<(pb::ExecEvent, Hold)>,
}

impl Events {
    /// The next event and its hold: drop the hold once the event's bytes have left.
    pub async fn recv(&mut self) -> Option<(pb::ExecEvent, Hold)> {
        self.rx.recv().await
    }
}

/// The agent-private frames the relay sends an in-sandbox agent (`frame`): output credit,
/// and the controls of interactive execs.
#[derive(Debug, Clone, PartialEq)]
pub enum ToAgent {
    /// Output credit.
    Flow(frame::Flow),
    /// Start, stdin, resize or abort of an interactive exec.
    Control(frame::Control),
}

/// The agent-private frames for an in-sandbox agent, in the order they are to be written.
pub type ControlRx = mpsc::UnboundedReceiver<ToAgent>;

/// Most stdin bytes of one interactive exec sent ahead of the agent's credit: what the agent
/// holds for a process that does not read. Throughput is at most a window per credit round
/// trip (~2 ms through gVisor's ptrace platform): 4 MiB keeps that well above what the agent
/// can write into a pipe.
pub const STDIN_WINDOW: usize = 4 << 20;

/// Most stdin bytes in one control frame (fewer frames: fewer reads in the agent, each a
/// system call under gVisor).
const STDIN_CHUNK: usize = 256 << 10;

/// How an interactive exec runs (see `frame::Start`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Interactive {
    /// On a new pseudo-terminal.
    pub tty: bool,
    /// Its rows (0: 24).
    pub rows: u32,
    /// Its columns (0: 80).
    pub cols: u32,
    /// Stdin is streamed ([`Stdin`]).
    pub stdin: bool,
}

/// The stdin, terminal and abort of one interactive exec on an agent. Stdin waits for the
/// agent's credit: at most [`STDIN_WINDOW`] bytes are ahead of what the process took.
#[derive(Debug, Clone)]
pub struct Stdin {
    control: mpsc::UnboundedSender<ToAgent>,
    req_id: u64,
    credit: Arc<tokio::sync::Semaphore>,
}

impl Stdin {
    fn control(&self, c: frame::Control) -> Result<(), Error> {
        self.control
            .send(ToAgent::Control(frame::Control {
                req_id: self.req_id,
                ..c
            }))
            .map_err(|_| Error::Unavailable("the agent went away".into()))
    }

    /// Sends stdin bytes, as the agent's credit allows (waits for it). Fails once the exec
    /// has ended.
    pub async fn write(&self, mut data: &[u8]) -> Result<(), Error> {
        while !data.is_empty() {
            let n = data.len().min(STDIN_CHUNK);
            self.credit
                .acquire_many(n as u32)
                .await
                .map_err(|_| Error::Unavailable("the exec has ended".into()))?
                .forget();
            self.control(frame::Control {
                data: data[..n].to_vec(),
                ..Default::default()
            })?;
            data = &data[n..];
        }
        Ok(())
    }

    /// Ends stdin (after what was written).
    pub fn close(&self) -> Result<(), Error> {
        self.control(frame::Control {
            eof: true,
            ..Default::default()
        })
    }

    /// Resizes the exec's terminal.
    pub fn resize(&self, rows: u32, cols: u32) -> Result<(), Error> {
        self.control(frame::Control {
            resize: Some(frame::TtySize { rows, cols }),
            ..Default::default()
        })
    }
}

/// Relay settings.
#[derive(Debug, Clone)]
pub struct Settings {
    /// A worker silent this long is dropped.
    pub heartbeat_timeout: Duration,
    /// How long an Exec waits for a worker to attach.
    pub worker_wait: Duration,
    /// Per-exec output window of an in-sandbox agent (it is paced by credit).
    pub exec_window: usize,
    /// Most output of one exec held for a harness that is not reading, from an external worker
    /// (which cannot be paced): past it the exec ends.
    pub worker_exec_buffer: usize,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            heartbeat_timeout: Duration::from_secs(10),
            worker_wait: Duration::from_secs(0),
            exec_window: crate::flow::DEFAULT_WINDOW,
            worker_exec_buffer: 8 << 20,
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
    /// Execs of an agent's earlier link (before a daemon restart) whose output is taken up
    /// again when the agent attaches: sandbox_id → (req_id, where the events go).
    adopted: Mutex<HashMap<String, Vec<(u64, EventTx)>>>,
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
                adopted: Mutex::new(HashMap::new()),
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

    /// The relay's settings.
    pub fn settings(&self) -> &Settings {
        &self.inner.settings
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
        let (w, rx, _) = self.attach_with(hello, Origin::Network);
        Ok((w, rx))
    }

    /// Registers a sandbox's own agent, which the node reached over the sandbox's private
    /// FIFOs; `hello` is the node's (its sandbox_id is the sandbox's). Replaces an earlier
    /// agent of the same sandbox (a re-attach). No heartbeat deadline: the link ends with the
    /// sandbox. The link carries the frames and the flow control (credit) for the agent.
    pub fn attach_in_sandbox(&self, hello: pb::Hello) -> (Arc<Worker>, FrameRx, ControlRx) {
        self.attach_with(hello, Origin::Agent)
    }

    fn attach_with(&self, hello: pb::Hello, origin: Origin) -> (Arc<Worker>, FrameRx, ControlRx) {
        let (tx, rx) = mpsc::channel(256);
        let (credit_tx, credit_rx) = mpsc::unbounded_channel();
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
            control: (origin == Origin::Agent).then_some(credit_tx),
        });
        let old = lock(self.registry(origin)).insert(w.hello.sandbox_id.clone(), w.clone());
        if origin == Origin::Agent {
            // After the insert: an adoption racing this either sees the agent or is drained.
            let adopted = lock(&self.inner.adopted).remove(&w.hello.sandbox_id);
            for (req_id, tx) in adopted.unwrap_or_default() {
                self.adopt_into(&w, req_id, tx);
            }
        }
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
        (w, rx, credit_rx)
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
                let req_id = c.req_id;
                let mut inflight = lock(&w.inflight);
                let Some(f) = inflight.get_mut(&req_id) else {
                    return;
                };
                let is_stderr = c.stream == pb::Stream::Stderr as i32;
                let over = if f.streaming || is_stderr {
                    let hold = f.window.hold(c.data.len());
                    let over = f.window.is_over();
                    if !over {
                        let _ = f.tx.send((
                            pb::ExecEvent {
                                event: Some(pb::exec_event::Event::Chunk(c)),
                            },
                            hold,
                        ));
                    }
                    over.then(|| overflow_message(w.origin, f.window.limit()))
                } else {
                    // Collected, not held: the agent gets its credit back at once.
                    drop(f.window.hold(c.data.len()));
                    f.stdout.extend_from_slice(&c.data);
                    (f.stdout.len() > MAX_COLLECTED).then(|| {
                        format!(
                            "stdout over {MAX_COLLECTED} bytes, the most streaming=false \
                             collects: stream it (streaming=true)"
                        )
                    })
                };
                if let Some(why) = over {
                    // End the exec here and stop it on the worker.
                    let mut interactive = false;
                    if let Some(f) = inflight.remove(&req_id) {
                        interactive = f.stdin.is_some();
                        let _ = f.tx.send((error_event(req_id, &why), Hold::none()));
                    }
                    drop(inflight);
                    warn!(sandbox_id = %w.hello.sandbox_id, req_id, why = %why, "exec ended");
                    let (relay, w) = (self.clone(), w.clone());
                    self.inner.tasks.spawn(async move {
                        relay.send_abort(&w, req_id, interactive).await;
                    });
                }
            }
            WorkerMsg::End(e) => {
                let Some(mut f) = lock(&w.inflight).remove(&e.req_id) else {
                    return;
                };
                if !f.streaming && !f.stdout.is_empty() {
                    let _ = f.tx.send((
                        pb::ExecEvent {
                            event: Some(pb::exec_event::Event::Chunk(pb::Chunk {
                                req_id: e.req_id,
                                data: std::mem::take(&mut f.stdout),
                                stream: pb::Stream::Stdout as i32,
                            })),
                        },
                        Hold::none(),
                    ));
                }
                let _ = f.tx.send((
                    pb::ExecEvent {
                        event: Some(pb::exec_event::Event::End(e)),
                    },
                    Hold::none(),
                ));
            }
            WorkerMsg::Error(e) => {
                if let Some(f) = lock(&w.inflight).remove(&e.req_id) {
                    let _ = f.tx.send((
                        pb::ExecEvent {
                            event: Some(pb::exec_event::Event::Error(e)),
                        },
                        Hold::none(),
                    ));
                }
            }
        }
    }

    /// Stdin credit from an in-sandbox agent: it has handed `f.credit` more bytes of exec
    /// `f.req_id`'s stdin to the process.
    pub fn on_stdin_credit(&self, w: &Arc<Worker>, f: frame::Flow) {
        let inflight = lock(&w.inflight);
        if let Some(s) = inflight.get(&f.req_id).and_then(|x| x.stdin.as_ref()) {
            // Never past the window (a confused agent cannot grow what is sent ahead).
            let room = STDIN_WINDOW.saturating_sub(s.available_permits());
            s.add_permits((f.credit as usize).min(room));
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
        self.start(req, agent_only, None).await.map(|(e, _)| e)
    }

    /// Starts an interactive exec (a tty, streamed stdin) on the sandbox's in-sandbox agent,
    /// which must say it takes them (UNAVAILABLE otherwise): its start, stdin, resizes and
    /// abort travel in order on the agent's control channel.
    pub async fn exec_interactive(
        &self,
        req: pb::ExecRequest,
        how: Interactive,
    ) -> Result<(Events, Stdin), Error> {
        let (events, stdin) = self.start(req, true, Some(how)).await?;
        let stdin = stdin.ok_or_else(|| Error::Unavailable("no stdin for the exec".into()))?;
        Ok((events, stdin))
    }

    async fn start(
        &self,
        req: pb::ExecRequest,
        agent_only: bool,
        interactive: Option<Interactive>,
    ) -> Result<(Events, Option<Stdin>), Error> {
        let invalid = |m: &str| Error::InvalidArgument(m.into());
        let exec = req.exec.ok_or_else(|| invalid("exec is required"))?;
        if req.sandbox_id.is_empty() {
            return Err(invalid("sandbox_id is required"));
        }
        if exec.command.is_empty() {
            return Err(invalid("command is required"));
        }
        let w = self.wait_worker(&req.sandbox_id, agent_only).await?;
        let stdin = match (interactive, &w.control) {
            (None, _) => None,
            (Some(_), Some(control)) if w.interactive() => Some(Stdin {
                control: control.clone(),
                req_id: exec.req_id,
                credit: Arc::new(tokio::sync::Semaphore::new(STDIN_WINDOW)),
            }),
            (Some(_), _) => {
                return Err(Error::Unavailable(format!(
                    "the agent of sandbox {} takes no interactive execs",
                    req.sandbox_id
                )))
            }
        };
        let (tx, rx) = mpsc::unbounded_channel();
        let window = match &w.control {
            Some(credit) => {
                Window::with_credit(self.inner.settings.exec_window, exec.req_id, credit.clone())
            }
            None => Window::new(self.inner.settings.worker_exec_buffer),
        };
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
                    streaming: exec.streaming || interactive.is_some(),
                    stdout: Vec::new(),
                    window,
                    stdin: stdin.as_ref().map(|s| s.credit.clone()),
                },
            );
        }
        let req_id = exec.req_id;
        let sent = match (&stdin, interactive) {
            (Some(s), Some(how)) => s
                .control(frame::Control {
                    start: Some(frame::Start {
                        // The same sandbox.v1 message, as the agent crate's type.
                        exec: prost::Message::decode(
                            prost::Message::encode_to_vec(&exec).as_slice(),
                        )
                        .ok(),
                        tty: how.tty,
                        rows: how.rows,
                        cols: how.cols,
                        stdin: how.stdin,
                        stdin_window: STDIN_WINDOW as u64,
                    }),
                    ..Default::default()
                })
                .is_ok(),
            _ => {
                w.tx.send(Ok(pb::ServerFrame {
                    msg: Some(ServerMsg::Exec(exec)),
                }))
                .await
                .is_ok()
            }
        };
        if !sent {
            lock(&w.inflight).remove(&req_id);
            return Err(Error::Unavailable("worker went away".into()));
        }
        // The harness going away aborts the exec on the worker.
        let relay = self.clone();
        let w2 = w.clone();
        self.inner.tasks.spawn(async move {
            tx.closed().await;
            let gone = lock(&w2.inflight).remove(&req_id);
            if let Some(f) = gone {
                relay.send_abort(&w2, req_id, f.stdin.is_some()).await;
            }
        });
        Ok((Events { rx }, stdin))
    }

    /// Takes up the output of exec `req_id` that the agent of `sandbox_id` started for an
    /// earlier daemon (it runs on across a restart): its chunks and its end come as the events
    /// of a new exec, from the agent's link now or, if it has not attached yet, once it does.
    /// What the agent wrote while no daemon read it is in its pipe; a chunk half-read by the
    /// daemon that died is lost.
    pub fn adopt_on_agent(&self, sandbox_id: &str, req_id: u64) -> Events {
        let (tx, rx) = mpsc::unbounded_channel();
        // Under the adoption lock: an agent attaching now either finds it pending or is seen.
        let mut pending = lock(&self.inner.adopted);
        match self.agent(sandbox_id) {
            Some(w) => {
                drop(pending);
                self.adopt_into(&w, req_id, tx);
            }
            None => pending
                .entry(sandbox_id.to_string())
                .or_default()
                .push((req_id, tx)),
        }
        Events { rx }
    }

    fn adopt_into(&self, w: &Arc<Worker>, req_id: u64, tx: EventTx) {
        let window = match &w.control {
            Some(credit) => {
                Window::with_credit(self.inner.settings.exec_window, req_id, credit.clone())
            }
            None => Window::new(self.inner.settings.worker_exec_buffer),
        };
        lock(&w.inflight).insert(
            req_id,
            Inflight {
                tx,
                streaming: true,
                stdout: Vec::new(),
                window,
                stdin: None,
            },
        );
        info!(sandbox_id = %w.hello.sandbox_id, req_id, "exec of an earlier link taken up");
    }

    /// Aborts exec `req_id` on `w`: an interactive one on the agent's control channel (after
    /// its start and stdin), any other as a sandbox.v1 Abort.
    async fn send_abort(&self, w: &Worker, req_id: u64, interactive: bool) {
        if let (true, Some(control)) = (interactive, &w.control) {
            let _ = control.send(ToAgent::Control(frame::Control {
                req_id,
                abort: true,
                ..Default::default()
            }));
            return;
        }
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
            let known = lock(&w.inflight).get(&req_id).map(|f| f.stdin.is_some());
            if let Some(interactive) = known {
                self.send_abort(&w, req_id, interactive).await;
            }
        }
    }
}

/// Why an exec whose output went over its window was ended.
fn overflow_message(origin: Origin, limit: usize) -> String {
    match origin {
        Origin::Network => format!(
            "over {limit} bytes of output wait for a harness that is not reading them \
             (an external worker cannot be paused): exec ended"
        ),
        Origin::Agent => format!(
            "the sandbox's agent sent more than the exec's {limit}-byte window (an agent \
             from before flow control): exec ended"
        ),
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

    fn chunk(req_id: u64, n: usize) -> pb::WorkerFrame {
        pb::WorkerFrame {
            msg: Some(WorkerMsg::Chunk(pb::Chunk {
                req_id,
                data: vec![b'x'; n],
                stream: pb::Stream::Stdout as i32,
            })),
        }
    }

    async fn next_frame(rx: &mut FrameRx) -> ServerMsg {
        tokio::time::timeout(Duration::from_secs(2), rx.recv())
            .await
            .expect("a frame for the worker")
            .unwrap()
            .unwrap()
            .msg
            .unwrap()
    }

    #[tokio::test]
    async fn an_external_workers_exec_ends_once_its_buffer_is_over() {
        let dir = tempfile::tempdir().unwrap();
        let creds = auth::Credentials::new(auth::Credentials::path_in(dir.path()));
        let settings = Settings {
            worker_exec_buffer: 1000,
            ..Settings::default()
        };
        let r = Relay::new(settings, creds, Box::new(|_: &str| false), Tasks::new());
        let (tok, _) = r.credentials().issue("ext-1", None).unwrap();
        let (w, mut rx) = r
            .attach_network(hello("ext-1", ""), tok.as_deref())
            .unwrap();
        let exec = |req_id, streaming| pb::ExecRequest {
            sandbox_id: "ext-1".into(),
            exec: Some(pb::Exec {
                req_id,
                command: "yes".into(),
                streaming,
                ..Default::default()
            }),
        };
        let mut events = r.exec(exec(1, true)).await.unwrap();
        assert!(matches!(next_frame(&mut rx).await, ServerMsg::Exec(_)));
        // Read as they come: no limit on the total.
        for _ in 0..10 {
            r.on_frame(&w, chunk(1, 600));
            let (ev, hold) = events.recv().await.unwrap();
            assert!(matches!(ev.event, Some(pb::exec_event::Event::Chunk(_))));
            assert_eq!(hold.bytes(), 600);
        }
        // Not read: the second chunk puts 1200 bytes over the 1000 of the buffer.
        r.on_frame(&w, chunk(1, 600));
        r.on_frame(&w, chunk(1, 600));
        r.on_frame(&w, chunk(1, 600)); // after the end: dropped
        assert!(matches!(
            next_frame(&mut rx).await,
            ServerMsg::Abort(pb::Abort { req_id: 1 })
        ));
        let (first, _) = events.recv().await.unwrap();
        assert!(matches!(first.event, Some(pb::exec_event::Event::Chunk(_))));
        let (last, hold) = events.recv().await.unwrap();
        match last.event {
            Some(pb::exec_event::Event::Error(e)) => {
                assert!(e.message.contains("not reading"), "{}", e.message)
            }
            e => panic!("{e:?}"),
        }
        assert_eq!(hold.bytes(), 0);
        assert!(events.rx.try_recv().is_err(), "nothing after the error");
        assert_eq!(w.inflight(), 0);

        // streaming=false collects at most MAX_COLLECTED.
        let mut events = r.exec(exec(2, false)).await.unwrap();
        assert!(matches!(next_frame(&mut rx).await, ServerMsg::Exec(_)));
        for _ in 0..16 {
            r.on_frame(&w, chunk(2, 1 << 20));
        }
        assert_eq!(w.inflight(), 1, "16 MiB is collected");
        r.on_frame(&w, chunk(2, 1));
        assert!(matches!(
            next_frame(&mut rx).await,
            ServerMsg::Abort(pb::Abort { req_id: 2 })
        ));
        match events.recv().await.unwrap().0.event {
            Some(pb::exec_event::Event::Error(e)) => {
                assert!(e.message.contains("streaming=true"), "{}", e.message)
            }
            e => panic!("{e:?}"),
        }
    }

    #[tokio::test]
    async fn an_agents_exec_is_credited_as_its_events_are_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let r = relay(dir.path());
        let (w, mut rx, mut credit) = r.attach_in_sandbox(hello("compute-1", AGENT_TRUST));
        let mut events = r
            .exec_on_agent(pb::ExecRequest {
                sandbox_id: "compute-1".into(),
                exec: Some(pb::Exec {
                    req_id: 5,
                    command: "yes".into(),
                    streaming: true,
                    ..Default::default()
                }),
            })
            .await
            .unwrap();
        assert!(matches!(next_frame(&mut rx).await, ServerMsg::Exec(_)));
        let window = r.settings().exec_window;
        // A whole window in flight, none of it taken yet: no credit.
        for _ in 0..window / 65536 {
            r.on_frame(&w, chunk(5, 65536));
        }
        assert!(credit.try_recv().is_err());
        let mut taken = 0u64;
        while taken < window as u64 {
            let (_, hold) = events.recv().await.unwrap();
            taken += hold.bytes() as u64;
            drop(hold);
        }
        let credited: u64 = std::iter::from_fn(|| credit.try_recv().ok())
            .map(|f| match f {
                ToAgent::Flow(f) => f,
                other => panic!("{other:?}"),
            })
            .inspect(|f| assert_eq!(f.req_id, 5))
            .map(|f| f.credit)
            .sum();
        assert_eq!(credited, window as u64, "all of it credited back");
        assert_eq!(w.inflight(), 1, "an agent within its window is never cut");
    }

    #[tokio::test]
    async fn an_interactive_exec_goes_in_order_on_the_control_channel_within_its_stdin_credit() {
        let dir = tempfile::tempdir().unwrap();
        let r = relay(dir.path());
        let exec = |req_id| pb::ExecRequest {
            sandbox_id: "compute-1".into(),
            exec: Some(pb::Exec {
                req_id,
                command: "cat".into(),
                ..Default::default()
            }),
        };
        let how = Interactive {
            tty: true,
            rows: 30,
            cols: 100,
            stdin: true,
        };
        // An agent that does not say it takes them: refused, nothing sent.
        let (_old, _rx_old, mut ctl_old) = r.attach_in_sandbox(hello("compute-1", AGENT_TRUST));
        let err = r.exec_interactive(exec(1), how).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::Unavailable);
        assert!(ctl_old.try_recv().is_err());

        let mut h = hello("compute-1", AGENT_TRUST);
        h.capabilities = vec![frame::INTERACTIVE_CAPABILITY.into()];
        let (w, mut rx, mut ctl) = r.attach_in_sandbox(h);
        let (events, stdin) = r.exec_interactive(exec(2), how).await.unwrap();
        let control = |t: ToAgent| match t {
            ToAgent::Control(c) => c,
            other => panic!("{other:?}"),
        };
        let start = control(ctl.try_recv().unwrap());
        let s = start.start.unwrap();
        assert_eq!((start.req_id, s.tty, s.rows, s.cols), (2, true, 30, 100));
        assert_eq!(s.stdin_window, STDIN_WINDOW as u64);
        assert!(rx.try_recv().is_err(), "no sandbox.v1 Exec frame");
        // A whole window goes at once; one byte more waits for credit.
        stdin.write(&vec![7u8; STDIN_WINDOW]).await.unwrap();
        let sent: usize = std::iter::from_fn(|| ctl.try_recv().ok())
            .map(|t| control(t).data.len())
            .sum();
        assert_eq!(sent, STDIN_WINDOW);
        let more = {
            let stdin = stdin.clone();
            tokio::spawn(async move { stdin.write(b"x").await })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!more.is_finished(), "no credit: the writer waits");
        r.on_stdin_credit(
            &w,
            frame::Flow {
                req_id: 2,
                credit: 1,
                window: 0,
            },
        );
        more.await.unwrap().unwrap();
        assert_eq!(control(ctl.try_recv().unwrap()).data, b"x");
        stdin.resize(40, 120).unwrap();
        stdin.close().unwrap();
        let c = control(ctl.try_recv().unwrap());
        assert_eq!(
            c.resize,
            Some(frame::TtySize {
                rows: 40,
                cols: 120
            })
        );
        assert!(control(ctl.try_recv().unwrap()).eof);
        // The caller going away aborts it on the same channel, after everything else.
        drop(events);
        let abort = tokio::time::timeout(Duration::from_secs(2), ctl.recv())
            .await
            .unwrap()
            .unwrap();
        assert!(control(abort).abort);
        assert_eq!(w.inflight(), 0);
        // Its writer is let go once it has ended.
        let err = stdin.write(&vec![0u8; STDIN_WINDOW + 1]).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::Unavailable);
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
        let (agent, _agent_rx, _credit_rx) = r.attach_in_sandbox(hello("compute-1", AGENT_TRUST));

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
