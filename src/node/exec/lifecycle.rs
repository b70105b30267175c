//! The one exec lifecycle, over a [`Backend`] that can start a process, signal it, wait for it
//! and clean up after it:
//!
//! 1. the timeout is the request's, clamped to the node's cap; the exec window opens on the
//!    sandbox's meter;
//! 2. the backend starts the process and streams its output;
//! 3. until it exits: the client going away (or the node shutting down) cancels it (SIGTERM,
//!    SIGKILL after the grace), the deadline kills it (SIGKILL), and every sample interval the
//!    sandbox's memory is read: over memory_bytes kills it (SIGKILL), after which the node waits
//!    for gVisor to hand the memory back so the next exec does not start over the limit. An
//!    exec that starts while the sandbox is already over memory_bytes (memory no process holds,
//!    a tmpfs file, which no kill can free) is killed only when the sandbox grows
//!    [`OVER_LIMIT_ALLOWANCE`] past where it started: the sandbox can free that memory itself
//!    (`rm`) and go on, and nothing it starts can grow (the cgroup's hard limit, memory_bytes
//!    plus headroom, bounds the whole sandbox);
//! 4. the backend cleans up (drains output, deletes the process), the window closes, and the
//!    outcome says how it ended.
//!
//! Failures are the node's [`Error`], never an exit code: 127 is a shell's "command not found".

use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::{Completed, ExecEvent};
use crate::metering::Usage;
use crate::node::{blocking, Error, Result};

/// How a process ended, as its backend saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// Exited with this status (0–255; a status above 128 may already encode a signal).
    Code(i32),
    /// Killed by this signal number.
    Signal(i32),
}

impl Exit {
    /// The exit code callers see: the status, or 128 + the signal.
    pub fn code(self) -> i32 {
        match self {
            Exit::Code(c) => c,
            Exit::Signal(n) => 128 + n,
        }
    }
}

/// Where a backend sends the process's output.
pub type Output = mpsc::Sender<ExecEvent>;

/// One way of running an exec's process. `wait` must be cancel-safe: the lifecycle polls it
/// in a `select!` and again after signalling.
pub trait Backend: Send {
    /// The backend's name, for logs (`agent`, `containerd`).
    fn name(&self) -> &'static str;
    /// Starts the process; its stdout and stderr go to `out` as they come.
    fn start(&mut self, out: Output) -> impl std::future::Future<Output = Result<()>> + Send;
    /// Sends `signal` to the process (and what it started).
    fn signal(&mut self, signal: Signal) -> impl std::future::Future<Output = Result<()>> + Send;
    /// Waits for the process to exit.
    fn wait(&mut self) -> impl std::future::Future<Output = Result<Exit>> + Send;
    /// After the exit: drains what output is left (bounded) and releases the process.
    fn cleanup(&mut self) -> impl std::future::Future<Output = ()> + Send;
}

/// The sandbox's meter as the lifecycle uses it. Every method blocks (cgroupfs reads); the
/// lifecycle calls them off the async runtime.
pub trait ExecMeter: Send + Sync + 'static {
    /// Opens an exec window; returns its id and the sandbox's working set now (None when it
    /// cannot be read).
    fn begin(&self) -> (u64, Option<u64>);
    /// One sample for the sandbox's memory figures; returns its working set (None when it
    /// cannot be read).
    fn sample(&self) -> Option<u64>;
    /// The sandbox's working set now.
    fn working_set(&self) -> Option<u64>;
    /// Closes the window and returns its usage.
    fn end(&self, window: u64) -> Usage;
}

/// How far an exec that starts with the sandbox over memory_bytes may grow it before it is
/// killed: room for `rm` or `sync` (a few MiB under gVisor), not for a workload.
pub const OVER_LIMIT_ALLOWANCE: u64 = 16 << 20;

/// The bounds of one exec.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// When to kill it.
    pub timeout: Duration,
    /// SIGTERM → SIGKILL on cancellation.
    pub grace: Duration,
    /// How often memory is sampled.
    pub sample_interval: Duration,
    /// memory_bytes of the sandbox.
    pub memory_limit: u64,
    /// How long to wait for the process after SIGKILL.
    pub kill_wait: Duration,
    /// How long to wait for memory to come back under the limit after an OOM kill.
    pub settle: Duration,
}

impl Bounds {
    /// The working set above which an exec is killed, given the sandbox's working set when the
    /// exec started: memory_bytes, or where an over-limit sandbox started plus the allowance.
    pub fn kill_above(&self, start_ws: Option<u64>) -> u64 {
        match start_ws {
            Some(ws) if ws > self.memory_limit => ws.saturating_add(OVER_LIMIT_ALLOWANCE),
            _ => self.memory_limit,
        }
    }

    /// The request's timeout (None or zero: the cap) clamped to `cap`.
    pub fn clamp_timeout(requested: Option<Duration>, cap: Duration) -> Duration {
        requested.filter(|t| !t.is_zero()).unwrap_or(cap).min(cap)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    Exited(Exit),
    /// By the client (true) or the node's shutdown.
    Cancelled(bool),
    TimedOut,
    Oom,
}

/// Closes the meter window whatever happens, also when the exec's future is dropped.
struct Window {
    meter: Arc<dyn ExecMeter>,
    id: Option<u64>,
}

impl Window {
    async fn close(mut self) -> Result<Usage> {
        let (m, id) = (self.meter.clone(), self.id.take());
        match id {
            Some(id) => blocking(move || m.end(id)).await,
            None => Ok(Usage::default()),
        }
    }
}

impl Drop for Window {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            let m = self.meter.clone();
            tokio::task::spawn_blocking(move || m.end(id));
        }
    }
}

/// Runs one exec through `backend` to its end. Output and the outcome go to `out`'s
/// receiver's side only as output events (the caller sends the completion); the exec is
/// cancelled when `out`'s receiver is dropped or `shutdown` is cancelled.
pub async fn run<B: Backend>(
    mut backend: B,
    meter: Arc<dyn ExecMeter>,
    bounds: Bounds,
    out: &Output,
    shutdown: &CancellationToken,
) -> Result<Completed> {
    let m = meter.clone();
    let (id, start_ws) = blocking(move || m.begin()).await?;
    let window = Window {
        id: Some(id),
        meter: meter.clone(),
    };
    let kill_above = bounds.kill_above(start_ws);
    let started = Instant::now();
    backend.start(out.clone()).await?;
    let deadline = tokio::time::sleep(bounds.timeout);
    tokio::pin!(deadline);
    // The first memory sample after one period: a short exec pays for none.
    let period = bounds.sample_interval.max(Duration::from_millis(1));
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let ending = loop {
        tokio::select! {
            r = backend.wait() => break Ending::Exited(r?),
            _ = out.closed() => break Ending::Cancelled(true),
            _ = shutdown.cancelled() => break Ending::Cancelled(false),
            _ = &mut deadline => break Ending::TimedOut,
            _ = ticker.tick() => {
                let m = meter.clone();
                if blocking(move || m.sample()).await?.is_some_and(|ws| ws > kill_above) {
                    break Ending::Oom;
                }
            }
        }
    };
    let name = backend.name();
    let signalled = match ending {
        Ending::Exited(Exit::Signal(n)) => Some(n),
        _ => None,
    };
    let (exit_code, cancelled, timed_out, oom_killed) = match ending {
        Ending::Exited(exit) => (exit.code(), false, false, false),
        Ending::Cancelled(by_client) => {
            let by = if by_client { "client" } else { "shutdown" };
            info!("exec cancelled by {by}: SIGTERM ({name})");
            signal(&mut backend, Signal::SIGTERM).await;
            if tokio::time::timeout(bounds.grace, backend.wait())
                .await
                .is_err()
            {
                info!("exec still running after the grace: SIGKILL ({name})");
                kill(&mut backend, bounds.kill_wait).await;
            }
            (-1, true, false, false)
        }
        Ending::TimedOut => {
            info!("exec timed out: SIGKILL ({name})");
            kill(&mut backend, bounds.kill_wait).await;
            (137, false, true, false)
        }
        Ending::Oom => {
            warn!(
                limit = bounds.memory_limit,
                kill_above, "exec over memory_bytes: SIGKILL ({name})"
            );
            kill(&mut backend, bounds.kill_wait).await;
            settle(
                &meter,
                bounds,
                bounds.memory_limit.max(start_ws.unwrap_or(0)),
            )
            .await;
            (137, false, false, true)
        }
    };
    let wall_time = started.elapsed();
    backend.cleanup().await;
    let usage = window.close().await?;
    Ok(Completed {
        exit_code,
        wall_time,
        cancelled,
        timed_out,
        oom_killed,
        signal: signalled,
        usage,
    })
}

async fn signal<B: Backend>(backend: &mut B, s: Signal) {
    if let Err(e) = backend.signal(s).await {
        warn!(signal = %s, error = %e, "could not signal the exec");
    }
}

async fn kill<B: Backend>(backend: &mut B, within: Duration) {
    signal(backend, Signal::SIGKILL).await;
    if tokio::time::timeout(within, backend.wait()).await.is_err() {
        warn!("exec did not end after SIGKILL");
    }
}

/// gVisor returns a killed process's memory to the host shortly after: wait (bounded) for the
/// working set to come back to `target` (memory_bytes, or where an over-limit exec started).
async fn settle(meter: &Arc<dyn ExecMeter>, bounds: Bounds, target: u64) {
    let t0 = Instant::now();
    while t0.elapsed() < bounds.settle {
        let m = meter.clone();
        match blocking(move || m.working_set()).await {
            Ok(Some(ws)) if ws > target => tokio::time::sleep(Duration::from_millis(50)).await,
            _ => break,
        }
    }
}

/// What went wrong, as the `compute_execs_total` outcome label says it.
pub fn outcome(r: &Result<Completed>) -> &'static str {
    match r {
        Err(_) => "failed",
        Ok(c) if c.cancelled => "cancelled",
        Ok(c) if c.timed_out => "timed_out",
        Ok(c) if c.oom_killed => "oom_killed",
        Ok(_) => "exited",
    }
}

/// An exec lost by its backend.
pub fn lost(sandbox_id: &str, why: impl Into<String>) -> Error {
    Error::ExecLost {
        id: sandbox_id.to_string(),
        why: why.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Mutex;
    use std::time::SystemTime;

    /// A process that prints, then exits after `runs_for` unless signalled; SIGTERM is
    /// ignored when `ignores_term`.
    struct FakeProcess {
        runs_for: Duration,
        exit: Exit,
        ignores_term: bool,
        /// The backend is lost after this long (the agent dies).
        lost_after: Option<Duration>,
        fails_to_start: bool,
        started: Option<tokio::time::Instant>,
        killed: Option<Exit>,
        log: Arc<Mutex<Vec<String>>>,
    }

    impl FakeProcess {
        fn new(runs_for: Duration) -> Self {
            Self {
                runs_for,
                exit: Exit::Code(0),
                ignores_term: false,
                lost_after: None,
                fails_to_start: false,
                started: None,
                killed: None,
                log: Arc::default(),
            }
        }
    }

    impl Backend for FakeProcess {
        fn name(&self) -> &'static str {
            "fake"
        }
        async fn start(&mut self, out: Output) -> Result<()> {
            if self.fails_to_start {
                return Err(Error::Internal("no such runtime".into()));
            }
            self.started = Some(tokio::time::Instant::now());
            let _ = out
                .send(ExecEvent::Stdout(
                    b"hi\n".to_vec(),
                    SystemTime::now(),
                    crate::flow::Hold::none(),
                ))
                .await;
            Ok(())
        }
        async fn signal(&mut self, s: Signal) -> Result<()> {
            self.log.lock().unwrap().push(format!("{s}"));
            if s == Signal::SIGKILL || !self.ignores_term {
                self.killed = Some(Exit::Signal(s as i32));
            }
            Ok(())
        }
        async fn wait(&mut self) -> Result<Exit> {
            if let Some(k) = self.killed {
                return Ok(k);
            }
            let t0 = self.started.expect("started");
            if let Some(after) = self.lost_after {
                tokio::time::sleep_until(t0 + after).await;
                return Err(lost("sb", "agent went away"));
            }
            tokio::time::sleep_until(t0 + self.runs_for).await;
            Ok(self.exit)
        }
        async fn cleanup(&mut self) {
            self.log.lock().unwrap().push("cleanup".into());
        }
    }

    /// A meter whose working set is `start` when the exec begins and `ws` from then on, until
    /// it is read after a kill.
    #[derive(Default)]
    struct FakeMeter {
        start: AtomicU64,
        ws: AtomicU64,
        open: AtomicU64,
        samples: AtomicU64,
    }

    impl ExecMeter for FakeMeter {
        fn begin(&self) -> (u64, Option<u64>) {
            self.open.fetch_add(1, Ordering::SeqCst);
            (7, Some(self.start.load(Ordering::SeqCst)))
        }
        fn sample(&self) -> Option<u64> {
            self.samples.fetch_add(1, Ordering::SeqCst);
            Some(self.ws.load(Ordering::SeqCst))
        }
        fn working_set(&self) -> Option<u64> {
            // Memory comes back after the kill, to where the exec started.
            Some(
                self.ws
                    .swap(self.start.load(Ordering::SeqCst), Ordering::SeqCst),
            )
        }
        fn end(&self, id: u64) -> Usage {
            assert_eq!(id, 7);
            self.open.fetch_sub(1, Ordering::SeqCst);
            Usage {
                cpu_ms: 3,
                ..Default::default()
            }
        }
    }

    fn bounds() -> Bounds {
        Bounds {
            timeout: Duration::from_secs(60),
            grace: Duration::from_secs(10),
            sample_interval: Duration::from_millis(20),
            memory_limit: 100,
            kill_wait: Duration::from_secs(10),
            settle: Duration::from_secs(5),
        }
    }

    struct Run {
        result: Result<Completed>,
        events: Vec<ExecEvent>,
        signals: Vec<String>,
        meter: Arc<FakeMeter>,
        took: Duration,
    }

    /// Runs `p` with `b`; `cancel_after` drops the client (or, with `shutdown`, cancels the
    /// node) that long after the start.
    async fn go(
        p: FakeProcess,
        b: Bounds,
        ws: u64,
        cancel_after: Option<Duration>,
        shutdown: bool,
    ) -> Run {
        go_from(p, b, 0, ws, cancel_after, shutdown).await
    }

    /// [`go`] with the sandbox at `start` when the exec begins.
    async fn go_from(
        p: FakeProcess,
        b: Bounds,
        start: u64,
        ws: u64,
        cancel_after: Option<Duration>,
        shutdown: bool,
    ) -> Run {
        let meter = Arc::new(FakeMeter::default());
        meter.start.store(start, Ordering::SeqCst);
        meter.ws.store(ws, Ordering::SeqCst);
        let log = p.log.clone();
        let (tx, mut rx) = mpsc::channel(16);
        let token = CancellationToken::new();
        let t0 = tokio::time::Instant::now();
        let collect = tokio::spawn(async move {
            let mut events = Vec::new();
            loop {
                let next = match cancel_after {
                    Some(d) if !shutdown => tokio::time::timeout_at(t0 + d, rx.recv()).await,
                    _ => Ok(rx.recv().await),
                };
                match next {
                    Ok(Some(e)) => events.push(e),
                    Ok(None) => return events,
                    // The client hangs up.
                    Err(_) => return events,
                }
            }
        });
        if let (Some(d), true) = (cancel_after, shutdown) {
            let t = token.clone();
            tokio::spawn(async move {
                tokio::time::sleep(d).await;
                t.cancel();
            });
        }
        let result = run(p, meter.clone(), b, &tx, &token).await;
        drop(tx);
        let events = collect.await.unwrap();
        let signals = log.lock().unwrap().clone();
        Run {
            result,
            events,
            signals,
            meter,
            took: t0.elapsed(),
        }
    }

    /// Runs `p` with the default bounds, the client never hanging up.
    async fn alone(p: FakeProcess, ws: u64) -> Run {
        go(p, bounds(), ws, None, false).await
    }

    fn done(r: &Run) -> &Completed {
        r.result.as_ref().expect("completed")
    }

    #[tokio::test(start_paused = true)]
    async fn a_process_that_exits_reports_its_code_and_usage() {
        let mut p = FakeProcess::new(Duration::from_millis(5));
        p.exit = Exit::Code(7);
        let r = go(p, bounds(), 10, None, false).await;
        let c = done(&r);
        assert_eq!(
            (c.exit_code, c.cancelled, c.timed_out, c.oom_killed),
            (7, false, false, false)
        );
        assert_eq!(c.usage.cpu_ms, 3);
        assert!(matches!(&r.events[..], [ExecEvent::Stdout(d, _, _)] if d == b"hi\n"));
        assert_eq!(r.signals, ["cleanup"]);
        assert_eq!(
            r.meter.samples.load(Ordering::SeqCst),
            0,
            "a short exec pays for no sample"
        );
        assert_eq!(
            r.meter.open.load(Ordering::SeqCst),
            0,
            "the window is closed"
        );
        let mut p = FakeProcess::new(Duration::from_millis(5));
        p.exit = Exit::Signal(9);
        assert_eq!(done(&go(p, bounds(), 10, None, false).await).exit_code, 137);
    }

    #[tokio::test(start_paused = true)]
    async fn cancellation_is_sigterm_then_sigkill_after_the_grace() {
        // Stops on SIGTERM.
        let p = FakeProcess::new(Duration::from_secs(600));
        let r = go(p, bounds(), 10, Some(Duration::from_secs(1)), false).await;
        let c = done(&r);
        assert_eq!((c.exit_code, c.cancelled), (-1, true));
        assert_eq!(r.signals, ["SIGTERM", "cleanup"]);
        assert!(r.took < Duration::from_secs(2), "{:?}", r.took);
        // Ignores SIGTERM: SIGKILL after the grace.
        let mut p = FakeProcess::new(Duration::from_secs(600));
        p.ignores_term = true;
        let r = go(p, bounds(), 10, Some(Duration::from_secs(1)), false).await;
        assert_eq!(r.signals, ["SIGTERM", "SIGKILL", "cleanup"]);
        assert!(
            r.took >= Duration::from_secs(11),
            "the grace is waited out: {:?}",
            r.took
        );
        assert!(done(&r).cancelled);
        // The node shutting down cancels the same way.
        let p = FakeProcess::new(Duration::from_secs(600));
        let r = go(p, bounds(), 10, Some(Duration::from_secs(1)), true).await;
        assert!(done(&r).cancelled);
        assert_eq!(r.signals, ["SIGTERM", "cleanup"]);
    }

    #[tokio::test(start_paused = true)]
    async fn the_timeout_kills() {
        let b = Bounds {
            timeout: Duration::from_secs(2),
            ..bounds()
        };
        let r = go(
            FakeProcess::new(Duration::from_secs(600)),
            b,
            10,
            None,
            false,
        )
        .await;
        let c = done(&r);
        assert_eq!((c.exit_code, c.timed_out, c.cancelled), (137, true, false));
        assert_eq!(r.signals, ["SIGKILL", "cleanup"]);
        assert!(r.took >= Duration::from_secs(2) && r.took < Duration::from_secs(3));
    }

    #[tokio::test(start_paused = true)]
    async fn memory_over_the_limit_kills_the_exec_and_waits_for_it_to_come_back() {
        let r = alone(FakeProcess::new(Duration::from_secs(600)), 500).await;
        let c = done(&r);
        assert_eq!((c.exit_code, c.oom_killed), (137, true));
        assert_eq!(r.signals, ["SIGKILL", "cleanup"]);
        assert!(
            r.took < Duration::from_millis(100),
            "killed at the first sample: {:?}",
            r.took
        );
        assert_eq!(r.meter.ws.load(Ordering::SeqCst), 0, "settled");
        // Under the limit: sampled, never killed.
        let r = alone(FakeProcess::new(Duration::from_millis(200)), 50).await;
        assert!(!done(&r).oom_killed);
        assert!(r.meter.samples.load(Ordering::SeqCst) >= 9);
    }

    #[tokio::test(start_paused = true)]
    async fn an_exec_that_starts_over_the_limit_is_killed_only_when_it_grows() {
        // The sandbox holds 500 (limit 100) that no process holds, a tmpfs file: `rm` runs.
        let short = || FakeProcess::new(Duration::from_millis(200));
        let edge = 500 + OVER_LIMIT_ALLOWANCE;
        let r = go_from(short(), bounds(), 500, edge, None, false).await;
        let c = done(&r);
        assert!(!c.oom_killed && c.exit_code == 0, "{c:?}");
        assert!(
            r.meter.samples.load(Ordering::SeqCst) >= 9,
            "sampled all along"
        );
        // Growing past the allowance is killed, and the wait for memory to come back ends
        // at where the exec started, not after the whole settle time.
        let r = go_from(short(), bounds(), 500, edge + 1, None, false).await;
        let c = done(&r);
        assert_eq!((c.exit_code, c.oom_killed), (137, true));
        assert!(
            r.took < Duration::from_secs(1),
            "settled at the start: {:?}",
            r.took
        );
        // Under the limit at the start: memory_bytes is the line, as always.
        let b = bounds();
        assert_eq!(b.kill_above(Some(50)), 100);
        assert_eq!(b.kill_above(None), 100);
        assert_eq!(b.kill_above(Some(500)), edge);
    }

    #[tokio::test(start_paused = true)]
    async fn a_lost_backend_is_an_error_and_the_window_still_closes() {
        let mut p = FakeProcess::new(Duration::from_secs(600));
        p.lost_after = Some(Duration::from_millis(30));
        let r = go(p, bounds(), 10, None, false).await;
        assert!(
            matches!(r.result, Err(Error::ExecLost { .. })),
            "{:?}",
            r.result.err()
        );
        assert_eq!(outcome(&r.result), "failed");
        let mut p = FakeProcess::new(Duration::from_secs(1));
        p.fails_to_start = true;
        let r = go(p, bounds(), 10, None, false).await;
        assert!(matches!(r.result, Err(Error::Internal(_))));
        // The window is closed by its guard (off the runtime) when the run fails.
        for _ in 0..100 {
            if r.meter.open.load(Ordering::SeqCst) == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(r.meter.open.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn timeouts_are_clamped_to_the_cap() {
        let cap = Duration::from_secs(600);
        for (asked, want) in [(None, 600), (Some(0), 600), (Some(5), 5), (Some(6000), 600)] {
            let asked = asked.map(Duration::from_secs);
            assert_eq!(Bounds::clamp_timeout(asked, cap), Duration::from_secs(want));
        }
    }
}
