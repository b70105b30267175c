//! One attached worker and the execs in flight on it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime};

use tokio::sync::mpsc;
use tonic::Status;

use crate::api::sandbox::v1 as pb;
use crate::flow::{Hold, Window};
use crate::relay::ToAgent;

/// How a worker reached the relay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// A sandbox's own agent, over the sandbox's stdio FIFOs (only the node registers it).
    Agent,
    /// An external worker over `SandboxWorker.Attach`, admitted with a credential.
    Network,
}

impl Origin {
    /// The word listings show.
    pub fn word(self) -> &'static str {
        match self {
            Origin::Agent => "agent",
            Origin::Network => "network",
        }
    }
}

/// The trust the node records for an in-sandbox agent: vouched for by the channel (the
/// sandbox's private FIFOs), never taken from the agent's Hello.
pub const AGENT_TRUST: &str = "trusted";

/// Per-exec events, never waiting on the harness (which would stall the worker's other
/// execs): what they hold is bounded by the exec's output window instead (`crate::flow`).
pub(super) type EventTx = mpsc::UnboundedSender<(pb::ExecEvent, Hold)>;

pub(super) struct Inflight {
    pub(super) tx: EventTx,
    pub(super) streaming: bool,
    /// `streaming=false`: stdout collected for the End.
    pub(super) stdout: Vec<u8>,
    /// The exec's output window.
    pub(super) window: Arc<Window>,
    /// An interactive exec's stdin credit (its controls, abort included, go on the agent's
    /// control channel, in order with its start).
    pub(super) stdin: Option<Arc<tokio::sync::Semaphore>>,
}

impl Drop for Inflight {
    fn drop(&mut self) {
        // Ended: a stdin writer waiting for credit that will never come is let go.
        if let Some(s) = &self.stdin {
            s.close();
        }
    }
}

/// One attached worker.
pub struct Worker {
    pub(super) id: u64,
    /// Its Hello (for an in-sandbox agent: as the node rewrote it).
    pub hello: pb::Hello,
    /// How it attached.
    pub origin: Origin,
    /// When it attached.
    pub attached_at: SystemTime,
    pub(super) tx: mpsc::Sender<Result<pb::ServerFrame, Status>>,
    pub(super) inflight: Mutex<HashMap<u64, Inflight>>,
    pub(super) last_seen: Mutex<Instant>,
    /// Flow control and interactive exec controls for an in-sandbox agent (None: an
    /// external worker, which sandbox.v1 cannot pace).
    pub(super) control: Option<mpsc::UnboundedSender<ToAgent>>,
    /// Dropped when silent for `heartbeat_timeout`. Not the in-sandbox agents: the sandbox's
    /// own state tells whether they live, and 50 sandboxes' heartbeats would cost CPU.
    pub(super) watched: bool,
}

pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

pub(super) fn error_event(req_id: u64, message: &str) -> pb::ExecEvent {
    pb::ExecEvent {
        event: Some(pb::exec_event::Event::Error(pb::ExecError {
            req_id,
            message: message.to_string(),
        })),
    }
}

impl Worker {
    /// Ends every in-flight exec with an ExecError.
    pub(super) fn fail_all(&self, why: &str) {
        let all: Vec<(u64, Inflight)> = lock(&self.inflight).drain().collect();
        for (req_id, f) in all {
            let _ = f.tx.send((error_event(req_id, why), Hold::none()));
        }
    }

    /// Whether it takes interactive execs (an in-sandbox agent that says so in its Hello).
    pub fn interactive(&self) -> bool {
        self.control.is_some()
            && self
                .hello
                .capabilities
                .iter()
                .any(|c| c == super::frame::INTERACTIVE_CAPABILITY)
    }

    /// Number of execs in flight.
    pub fn inflight(&self) -> usize {
        lock(&self.inflight).len()
    }
}
