//! SandboxService.ExecInSandbox: an argv (never shell-joined) run in a RUNNING sandbox over a
//! bidirectional stream, on the node's one exec lifecycle ([`Node::exec_with_input`]): the
//! in-sandbox agent when it is attached, else a containerd exec; cancel, grace, timeout,
//! memory_bytes and metering apply as to any exec.
//!
//! The first client message is the [`pb::ExecSpec`]; then stdin chunks, `stdin_close` and
//! terminal resizes, in order. The end of the client's stream (a half-close) ends stdin too,
//! as `stdin_close` does; the exec goes on, and its output and exit still arrive. The server
//! streams stdout and stderr (with a tty, everything is stdout), then one [`pb::ExecExit`].
//! The client going away cancels the exec (SIGTERM to its process group, SIGKILL after the
//! node's grace).
//!
//! Flow control end to end: the client's stdin is read only as the process takes it (a
//! bounded queue here, the agent's credit window behind it), and output is read from the
//! process only as the client takes it (the exec's output window), so a slow side slows the
//! other down instead of growing a buffer.
//!
//! Who may call: OPERATOR or above in the sandbox's namespace (a write, audited). The call is
//! authenticated before the spec is read; a sandbox in a namespace the caller cannot see
//! answers NOT_FOUND as an unknown id does.

use std::time::Duration;

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;
use tonic::{Request, Response, Status, Streaming};

use super::sandboxes::{namespace_of, Backend};
use super::service::{Error, Platform, Stream_};
use crate::api::platform::v1 as pb;
use crate::node::exec::{Completed, ExecEvent, ExecInput, ExecRequest, TtySize};
use crate::node::{self, Node, Status as NodeStatus};

/// How many client messages wait for the process to take them (each at most a gRPC message).
const INPUT_QUEUE: usize = 4;
/// How many output messages wait for the client.
const OUTPUT_QUEUE: usize = 16;

type Exit = pb::ExecExit;

/// Checks a spec before anything is looked up (INVALID_ARGUMENT).
pub fn check_spec(s: &pb::ExecSpec) -> Result<(), Status> {
    if s.sandbox_id.is_empty() {
        return Err(Status::invalid_argument("spec.sandbox_id is required"));
    }
    if s.argv.is_empty() || s.argv[0].is_empty() {
        return Err(Status::invalid_argument(
            "spec.argv must not be empty (it is run as given, never through a shell)",
        ));
    }
    if s.tty && s.wait == pb::ExecWait::Process as i32 {
        return Err(Status::invalid_argument(
            "wait=EXEC_WAIT_PROCESS cannot be combined with tty: a terminal's output is \
             drained with the process",
        ));
    }
    if pb::ExecWait::try_from(s.wait).is_err() {
        return Err(Status::invalid_argument(format!("unknown wait {}", s.wait)));
    }
    Ok(())
}

/// The node's exec request for a spec.
fn request(s: &pb::ExecSpec) -> ExecRequest {
    let size = s.tty_size.unwrap_or_default();
    ExecRequest {
        command: s.argv[0].clone(),
        args: s.argv[1..].to_vec(),
        env: s.env.clone().into_iter().collect(),
        working_dir: s.working_dir.clone(),
        timeout: (s.timeout_sec > 0).then(|| Duration::from_secs(s.timeout_sec.into())),
        workload: None,
        tty: s.tty.then_some(TtySize {
            rows: size.rows,
            cols: size.cols,
        }),
        uncapped: true,
    }
}

/// How an exec ended, as ExecExit has it: a timeout is -1, an OOM kill 137, a signal 128+N
/// (with the signal), a cancellation by the node (shutting down) is LOST.
pub fn exit_of(c: &Completed) -> Exit {
    use pb::Termination as T;
    let (code, termination, signal) = if c.timed_out {
        (-1, T::Timeout, 0)
    } else if c.oom_killed {
        (137, T::OomKilled, 0)
    } else if c.cancelled {
        (-1, T::Lost, 0)
    } else if let Some(n) = c.signal {
        (128 + n, T::Signaled, n)
    } else {
        (c.exit_code, T::Exited, 0)
    };
    Exit {
        code,
        termination: termination as i32,
        signal,
        usage: Some(c.usage.into()),
    }
}

fn out(msg: pb::exec_server_message::Msg) -> Result<pb::ExecServerMessage, Status> {
    Ok(pb::ExecServerMessage { msg: Some(msg) })
}

/// Reads the client's messages after the spec into the exec's input. Another spec is
/// INVALID_ARGUMENT (sent to the client, which ends the call and so the exec).
async fn pump_input(
    mut inbound: Streaming<pb::ExecClientMessage>,
    input: mpsc::Sender<ExecInput>,
    sb: std::sync::Arc<node::Sandbox>,
    // Weak: the call's stream ends with the output, not with the input.
    errors: mpsc::WeakSender<Result<pb::ExecServerMessage, Status>>,
) {
    use pb::exec_client_message::Msg;
    loop {
        let m = tokio::select! {
            m = inbound.next() => m,
            // The exec ended: nobody takes its input any more.
            _ = input.closed() => return,
        };
        let msg = match m {
            Some(Ok(m)) => m.msg,
            // The end of the client's stream, or its failure: stdin ends.
            Some(Err(_)) | None => return,
        };
        sb.touch();
        let i = match msg {
            Some(Msg::Stdin(b)) if b.is_empty() => continue,
            Some(Msg::Stdin(b)) => ExecInput::Stdin(b),
            Some(Msg::StdinClose(true)) => ExecInput::Close,
            Some(Msg::StdinClose(false)) | None => continue,
            Some(Msg::Resize(s)) => ExecInput::Resize(TtySize {
                rows: s.rows,
                cols: s.cols,
            }),
            Some(Msg::Spec(_)) => {
                if let Some(e) = errors.upgrade() {
                    let bad = Status::invalid_argument("only the first message may be the spec");
                    let _ = e.send(Err(bad)).await;
                }
                return;
            }
        };
        if input.send(i).await.is_err() {
            return;
        }
    }
}

/// Forwards an exec's events to the client. A chunk's hold (its bytes in the exec's output
/// window) is let go once the chunk is queued for the client.
async fn pump_output(
    mut events: mpsc::Receiver<ExecEvent>,
    tx: mpsc::Sender<Result<pb::ExecServerMessage, Status>>,
    sb: std::sync::Arc<node::Sandbox>,
) {
    use pb::exec_server_message::Msg;
    loop {
        let ev = tokio::select! {
            ev = events.recv() => match ev {
                Some(ev) => ev,
                None => return,
            },
            // The client went away: dropping the events cancels the exec.
            _ = tx.closed() => return,
        };
        let m = match ev {
            ExecEvent::Stdout(d, _, hold) => {
                sb.touch();
                let r = tx.send(out(Msg::Stdout(d))).await;
                drop(hold);
                r
            }
            ExecEvent::Stderr(d, _, hold) => {
                sb.touch();
                let r = tx.send(out(Msg::Stderr(d))).await;
                drop(hold);
                r
            }
            ExecEvent::Completed(c, _) => {
                sb.touch();
                let _ = tx.send(out(Msg::Exit(exit_of(&c)))).await;
                return;
            }
            ExecEvent::Failed(node::Error::ExecLost { .. }) => {
                let lost = Exit {
                    code: -1,
                    termination: pb::Termination::Lost as i32,
                    signal: 0,
                    usage: None,
                };
                let _ = tx.send(out(Msg::Exit(lost))).await;
                return;
            }
            ExecEvent::Failed(e) => {
                let _ = tx.send(Err(Status::from(Error::from(e)))).await;
                return;
            }
        };
        if m.is_err() {
            // The client went away: dropping the events cancels the exec.
            return;
        }
    }
}

impl Platform {
    /// ExecInSandbox.
    pub(super) async fn exec_here(
        &self,
        req: Request<Streaming<pb::ExecClientMessage>>,
        method: &str,
    ) -> Result<Response<Stream_<pb::ExecServerMessage>>, Status> {
        let (meta, ext, mut inbound) = req.into_parts();
        let head = Request::from_parts(meta, ext, ());
        // Nobody's spec is read before they are known.
        self.authenticated(&head, method, "").await?;
        let spec = match inbound.next().await {
            Some(Ok(pb::ExecClientMessage {
                msg: Some(pb::exec_client_message::Msg::Spec(s)),
            })) => s,
            Some(Err(s)) => return Err(s),
            Some(Ok(_)) | None => {
                return Err(Status::invalid_argument(
                    "the first message must be the spec",
                ))
            }
        };
        check_spec(&spec)?;
        let id = spec.sandbox_id.clone();
        let node = match self.backend()? {
            Backend::Node(node) => node.clone(),
            Backend::Cluster(c) => {
                let (p, mut cl) = self.owner_client(c.as_ref(), &head, method, &id).await?;
                let first = pb::ExecClientMessage {
                    msg: Some(pb::exec_client_message::Msg::Spec(spec)),
                };
                // The client's messages as they come; its failure ends what goes on.
                let rest = inbound.map_while(|m| m.ok());
                let up = tokio_stream::once(first).chain(rest);
                let q = self.to_node(up, head.metadata(), &p);
                let r = cl.exec_in_sandbox(q).await.map(|r| r.into_inner());
                let r = self.write_status(&p, method, "", &id, r).await?;
                let s: Stream_<pb::ExecServerMessage> = Box::pin(r);
                return Ok(Response::new(s));
            }
        };
        let (p, sb) = self.find(&node, &head, method, &id).await?;
        let ns = namespace_of(&sb).to_string();
        let (in_tx, in_rx) = mpsc::channel(INPUT_QUEUE);
        let started = start(&node, &sb, &spec, in_rx).await;
        let events = self.write(&p, method, &ns, &id, started).await?;
        let (tx, rx) = mpsc::channel(OUTPUT_QUEUE);
        tokio::spawn(pump_input(inbound, in_tx, sb.clone(), tx.downgrade()));
        tokio::spawn(pump_output(events, tx, sb));
        let s: Stream_<pb::ExecServerMessage> = Box::pin(ReceiverStream::new(rx));
        Ok(Response::new(s))
    }
}

/// Starts the exec of `spec` in `sb`, which must be RUNNING (FAILED_PRECONDITION).
async fn start(
    node: &Node,
    sb: &node::Sandbox,
    spec: &pb::ExecSpec,
    input: mpsc::Receiver<ExecInput>,
) -> Result<mpsc::Receiver<ExecEvent>, Error> {
    if sb.status() != NodeStatus::Ready {
        return Err(Error::FailedPrecondition(format!(
            "sandbox {} is not running",
            sb.id
        )));
    }
    Ok(node
        .exec_with_input(&sb.id, request(spec), Some(input))
        .await?)
}
