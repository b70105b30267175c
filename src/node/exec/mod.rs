//! ExecCommand: a request checked and admitted ([`Node::exec`]), then one lifecycle
//! ([`lifecycle::run`]) over one of two backends: the sandbox's own agent when it is attached
//! ([`agent`]), else a containerd exec ([`containerd`]). Usage is metered over the exec window
//! on both, and memory_bytes is enforced by killing the exec (not the sandbox).

pub mod agent;
pub mod containerd;
pub mod lifecycle;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tracing::{info, instrument, warn, Instrument};

use super::{blocking, Error, Node, Result, Sandbox};
use crate::flow::Hold;
use crate::metering::meter::Meter;
use crate::metering::{SandboxCgroup, Usage};
use lifecycle::{Bounds, ExecMeter};

/// A validated exec request.
#[derive(Debug, Clone)]
pub struct ExecRequest {
    /// Executable (looked up in PATH inside the sandbox when not absolute).
    pub command: String,
    /// Arguments.
    pub args: Vec<String>,
    /// Extra environment.
    pub env: HashMap<String, String>,
    /// Working directory; empty = the workspace mount path.
    pub working_dir: String,
    /// Timeout; None = the cap.
    pub timeout: Option<Duration>,
    /// A platform sandbox's workload, with the request id its agent knows it by (so that a
    /// daemon after a restart can take its output up again): it takes no exec slot and its
    /// timeout (the sandbox's remaining lifetime) is not capped by `exec_timeout_cap_secs`.
    pub workload: Option<u64>,
    /// Run it on a pseudo-terminal of this size (stdin, stdout and stderr are the terminal;
    /// all output arrives as stdout).
    pub tty: Option<TtySize>,
    /// Its timeout is not capped by `exec_timeout_cap_secs`, and no timeout means none of its
    /// own (the platform's ExecInSandbox, bounded by the sandbox's life instead).
    pub uncapped: bool,
}

/// A terminal's size.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TtySize {
    /// Rows (0: 24).
    pub rows: u32,
    /// Columns (0: 80).
    pub cols: u32,
}

impl TtySize {
    /// The size with its defaults filled in.
    pub fn or_default(self) -> (u16, u16) {
        let clamp = |v: u32, d: u16| {
            if v == 0 {
                d
            } else {
                v.min(u16::MAX as u32) as u16
            }
        };
        (clamp(self.rows, 24), clamp(self.cols, 80))
    }
}

/// What an interactive exec's client sends after the start, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecInput {
    /// Bytes for the process's stdin.
    Stdin(Vec<u8>),
    /// Stdin ends (with a tty: the terminal's end-of-file character, ^D, is typed).
    Close,
    /// The terminal's new size (its foreground process group gets SIGWINCH).
    Resize(TtySize),
}

/// The input of an interactive exec: bounded, so a process that does not read its stdin
/// stops the client rather than growing a buffer.
pub type InputRx = mpsc::Receiver<ExecInput>;

impl ExecRequest {
    /// The working directory: the request's, or the workspace's mount path.
    pub fn cwd(&self, sb: &Sandbox) -> String {
        if self.working_dir.is_empty() {
            sb.workspace.mount_path.clone()
        } else {
            self.working_dir.clone()
        }
    }
}

/// One event of an exec's output stream. A chunk holds its bytes in the exec's output window
/// (`crate::flow`) until it is dropped, where it leaves for the client.
#[derive(Debug)]
pub enum ExecEvent {
    /// A chunk of stdout.
    Stdout(Vec<u8>, SystemTime, Hold),
    /// A chunk of stderr.
    Stderr(Vec<u8>, SystemTime, Hold),
    /// The end.
    Completed(Completed, SystemTime),
    /// The exec could not run or be followed to its end (containerd unavailable, the agent
    /// lost it): the stream ends with this error instead of a completed event, so callers
    /// can tell it from a command's own failure.
    Failed(Error),
}

/// How an exec ended.
#[derive(Debug, Clone, Default)]
pub struct Completed {
    /// Exit code; -1 when cancelled; 128+N when killed by signal N.
    pub exit_code: i32,
    /// Wall time from start to exit.
    pub wall_time: Duration,
    /// Cancelled by the client.
    pub cancelled: bool,
    /// Killed at its timeout.
    pub timed_out: bool,
    /// Killed for going over memory_bytes.
    pub oom_killed: bool,
    /// The signal that ended it, when its backend could tell (the agent can; a containerd
    /// exec reports 128+N as its status).
    pub signal: Option<i32>,
    /// Usage of the exec window.
    pub usage: Usage,
}

/// Most bytes of command, args and env one exec may carry (Linux's execve takes ~2 MiB with
/// an 8 MiB stack; containerd's Tasks.Exec takes 4 MiB of JSON): over it is INVALID_ARGUMENT
/// rather than a failure deep in the runtime.
pub const MAX_ARGV_ENV_BYTES: usize = 1 << 20;

/// The timeout of an uncapped exec that names none: longer than any sandbox lives in
/// practice (the sandbox's end ends the exec first).
pub const UNCAPPED_TIMEOUT: Duration = Duration::from_secs(30 * 24 * 3600);

/// How many events an exec's stream buffers before it waits for the client.
const STREAM_BUFFER: usize = 64;

/// The sandbox's meter and cgroup, as the lifecycle reads them.
struct SandboxMeter {
    meter: Arc<Meter>,
    cgroup: SandboxCgroup,
}

impl ExecMeter for SandboxMeter {
    fn begin(&self) -> (u64, Option<u64>) {
        self.meter.begin_exec()
    }
    fn sample(&self) -> Option<u64> {
        self.meter.tick()
    }
    fn working_set(&self) -> Option<u64> {
        self.cgroup.working_set().ok()
    }
    fn end(&self, window: u64) -> Usage {
        self.meter.end_exec(window)
    }
}

/// Checks what an exec request carries (INVALID_ARGUMENT for what no backend can run).
pub fn check(req: &ExecRequest) -> Result<()> {
    let invalid = |m: String| Err(Error::InvalidArgument(m));
    if req.command.is_empty() {
        return invalid("command is required".into());
    }
    if req.command.contains('\0')
        || req.args.iter().any(|a| a.contains('\0'))
        || req
            .env
            .iter()
            .any(|(k, v)| k.is_empty() || k.contains(['=', '\0']) || v.contains('\0'))
    {
        return invalid("command, args and env must not contain NUL, and env names no '='".into());
    }
    let size = req.command.len()
        + req.args.iter().map(|a| a.len() + 1).sum::<usize>()
        + req
            .env
            .iter()
            .map(|(k, v)| k.len() + v.len() + 2)
            .sum::<usize>();
    if size > MAX_ARGV_ENV_BYTES {
        return invalid(format!(
            "command, args and env take {size} bytes, over the limit of {MAX_ARGV_ENV_BYTES}"
        ));
    }
    if !req.working_dir.is_empty() && !req.working_dir.starts_with('/') {
        return invalid("working_dir must be absolute".into());
    }
    Ok(())
}

impl Node {
    /// ExecCommand: checks the request, waits for the sandbox to be READY, takes one of its
    /// `max_execs_per_sandbox` slots (RESOURCE_EXHAUSTED at the cap) and runs the exec in the
    /// background. Its events arrive on the returned receiver; dropping the receiver cancels
    /// the exec.
    #[instrument(skip_all, fields(sandbox_id = %id))]
    pub async fn exec(&self, id: &str, req: ExecRequest) -> Result<mpsc::Receiver<ExecEvent>> {
        self.exec_with_input(id, req, None).await
    }

    /// An exec as [`Node::exec`] runs it, with its stdin (and terminal resizes) streamed from
    /// `input` when given: the process reads them as they come, and a closed `input` is the
    /// end of stdin. Without `input` the process's stdin is empty.
    #[instrument(skip_all, fields(sandbox_id = %id))]
    pub async fn exec_with_input(
        &self,
        id: &str,
        req: ExecRequest,
        input: Option<InputRx>,
    ) -> Result<mpsc::Receiver<ExecEvent>> {
        let sb = self.get(id)?;
        check(&req)?;
        self.wait_ready(&sb).await?;
        sb.touch();
        self.not_shutting_down()?;
        let slot = if req.workload.is_some() {
            None
        } else {
            self.exec_slot(&sb.id)?
        };
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        let node = self.clone();
        let span = tracing::Span::current();
        self.inner.tasks.spawn_graceful(move |shutdown| {
            async move {
                node.run_exec(sb.clone(), req, input, tx, shutdown).await;
                drop(slot);
                // Its end is use too: the idle clock starts from here.
                sb.touch();
            }
            .instrument(span)
        });
        Ok(rx)
    }

    /// A slot for one more exec in sandbox `id`, held until the exec has ended and been
    /// cleaned up; RESOURCE_EXHAUSTED when the sandbox is at `max_execs_per_sandbox`.
    fn exec_slot(&self, id: &str) -> Result<Option<OwnedSemaphorePermit>> {
        let cap = self.config().max_execs_per_sandbox as usize;
        if cap == 0 {
            return Ok(None);
        }
        let sem = {
            let mut m = self
                .inner
                .exec_slots
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            // Forget idle sandboxes now and then (destroyed ones, mostly).
            if m.len() > 1024 {
                m.retain(|_, s| s.available_permits() < cap);
            }
            m.entry(id.to_string())
                .or_insert_with(|| Arc::new(Semaphore::new(cap)))
                .clone()
        };
        sem.try_acquire_owned().map(Some).map_err(|_| {
            Error::ResourceExhausted(format!(
                "sandbox {id} is at its limit of {cap} concurrent execs"
            ))
        })
    }

    /// The bounds of an exec in `sb`.
    fn bounds(&self, sb: &Sandbox, req: &ExecRequest) -> Bounds {
        let cfg = self.config();
        Bounds {
            timeout: match (req.workload.is_some() || req.uncapped, req.timeout) {
                (true, Some(t)) if !t.is_zero() => t,
                // No timeout of its own: a day at a time would do, the sandbox's end ends it.
                (true, _) if req.uncapped => UNCAPPED_TIMEOUT,
                _ => Bounds::clamp_timeout(
                    req.timeout,
                    Duration::from_secs(cfg.exec_timeout_cap_secs),
                ),
            },
            grace: Duration::from_secs(cfg.cancel_grace_secs),
            sample_interval: Duration::from_millis(cfg.sample_interval_ms),
            memory_limit: sb.limits.memory_bytes,
            kill_wait: Duration::from_secs(10),
            settle: Duration::from_secs(5),
        }
    }

    /// Runs one exec on the sandbox's agent when it is attached (and the request can be given
    /// to it), else through containerd; sends its end (or its failure) to `tx`.
    async fn run_exec(
        &self,
        sb: Arc<Sandbox>,
        req: ExecRequest,
        mut input: Option<InputRx>,
        tx: mpsc::Sender<ExecEvent>,
        shutdown: CancellationToken,
    ) {
        let meter: Arc<dyn ExecMeter> = Arc::new(SandboxMeter {
            meter: sb.meter.clone(),
            cgroup: self.cgroup(&sb.id),
        });
        let bounds = self.bounds(&sb, &req);
        self.await_agent(&sb.id).await;
        let (backend, r) = match agent::AgentExec::new(self, &sb, &req, input.is_some()) {
            Some(b) => (
                "agent",
                lifecycle::run(b.with_input(input.take()), meter, bounds, &tx, &shutdown).await,
            ),
            None => {
                let b = containerd::ContainerdExec::new(self, &sb, &req, input.take());
                let r = lifecycle::run(b, meter, bounds, &tx, &shutdown).await;
                ("containerd", r)
            }
        };
        let wall = r.as_ref().map(|c| c.wall_time).unwrap_or_default();
        crate::metrics::METRICS.exec(lifecycle::outcome(&r), wall);
        let last = match r {
            Ok(c) => {
                info!(
                    exit_code = c.exit_code,
                    cancelled = c.cancelled,
                    timed_out = c.timed_out,
                    oom_killed = c.oom_killed,
                    wall_ms = c.wall_time.as_millis() as u64,
                    cpu_ms = c.usage.cpu_ms,
                    "exec completed ({backend})"
                );
                ExecEvent::Completed(c, SystemTime::now())
            }
            Err(e) => {
                warn!(error = %e, "exec failed ({backend})");
                ExecEvent::Failed(e)
            }
        };
        let _ = tx.send(last).await;
    }

    /// Cancels the execs a daemon crash left behind (see [`containerd::reap_orphans`]).
    pub(super) async fn reap_orphaned_execs(&self, sb: &Sandbox) {
        let dir = self.config().run_dir.join("io").join(&sb.id);
        let found = blocking(move || containerd::orphans_in(&dir))
            .await
            .unwrap_or_default();
        if !found.is_empty() {
            containerd::reap_orphans(self, &sb.id, found);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(command: &str) -> ExecRequest {
        ExecRequest {
            command: command.into(),
            args: vec![],
            env: HashMap::new(),
            working_dir: String::new(),
            timeout: None,
            workload: None,
            tty: None,
            uncapped: false,
        }
    }

    #[test]
    fn what_no_backend_can_run_is_invalid() {
        let big = "x".repeat(MAX_ARGV_ENV_BYTES);
        let cases: Vec<(ExecRequest, bool)> = vec![
            (req("true"), true),
            (req(""), false),
            (req("a\0b"), false),
            (
                ExecRequest {
                    args: vec!["a\0".into()],
                    ..req("echo")
                },
                false,
            ),
            (
                ExecRequest {
                    env: [("A=B".into(), "1".into())].into(),
                    ..req("env")
                },
                false,
            ),
            (
                ExecRequest {
                    env: [(String::new(), "1".into())].into(),
                    ..req("env")
                },
                false,
            ),
            (
                ExecRequest {
                    env: [("A".into(), "\0".into())].into(),
                    ..req("env")
                },
                false,
            ),
            (
                ExecRequest {
                    args: vec![big.clone()],
                    ..req("echo")
                },
                false,
            ),
            (
                ExecRequest {
                    args: vec![big[..MAX_ARGV_ENV_BYTES - 20].into()],
                    ..req("echo")
                },
                true,
            ),
            (
                ExecRequest {
                    working_dir: "tmp".into(),
                    ..req("pwd")
                },
                false,
            ),
            (
                ExecRequest {
                    working_dir: "/tmp".into(),
                    ..req("pwd")
                },
                true,
            ),
        ];
        for (r, ok) in cases {
            let got = check(&r);
            assert_eq!(got.is_ok(), ok, "{:?}: {got:?}", &r.command);
            if let Err(e) = got {
                assert!(matches!(e, Error::InvalidArgument(_)));
            }
        }
    }
}
