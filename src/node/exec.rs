//! ExecCommand through containerd: Tasks.Exec into the sandbox with per-exec FIFOs, output
//! streamed as it is produced, usage metered from the sandbox cgroup over the exec window, and
//! memory_bytes enforced by killing the exec (not the sandbox) when the sandbox goes over it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use tokio::io::AsyncReadExt;
use tokio::sync::{mpsc, oneshot};
use tracing::{info, instrument, warn};

use super::{blocking, Error, Node, Sandbox};
use crate::metering::Usage;
use crate::runtime::{spec, ExecIo, TaskState};

type Result<T> = std::result::Result<T, Error>;

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
}

/// One event of an exec's output stream.
#[derive(Debug, Clone)]
pub enum ExecEvent {
    /// A chunk of stdout.
    Stdout(Vec<u8>, SystemTime),
    /// A chunk of stderr.
    Stderr(Vec<u8>, SystemTime),
    /// The end.
    Completed(Completed, SystemTime),
    /// The exec could not run because containerd is unavailable: the stream ends with this
    /// status (UNAVAILABLE) instead of a completed event, so callers can tell it from a
    /// command's own failure and retry.
    Failed(tonic::Status),
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
    /// Usage of the exec window.
    pub usage: Usage,
}

enum Ending {
    Exited(u32),
    Cancelled,
    TimedOut,
    Oom,
}

/// The first line the launcher writes to stderr: `\x1ecompute-pid:<pid>\n`.
const PID_MARK: &[u8] = b"\x1ecompute-pid:";

/// The launcher every exec runs through when the init helper is mounted: it reports the
/// process's pid inside the sandbox (so signals can reach it; a signal to the host-side
/// `runsc exec` waiter does not) and then becomes the command.
const LAUNCH: &str = "printf '\\036compute-pid:%s\\n' \"$$\" >&2; exec \"$0\" \"$@\"";

async fn pump(
    mut rx: tokio::net::unix::pipe::Receiver,
    tx: mpsc::Sender<ExecEvent>,
    stderr: bool,
    mut pid_tx: Option<oneshot::Sender<u32>>,
) {
    let mut buf = vec![0u8; 32 * 1024];
    let mut head: Vec<u8> = Vec::new();
    loop {
        let n = match rx.read(&mut buf).await {
            Ok(0) | Err(_) => 0,
            Ok(n) => n,
        };
        let mut data = buf[..n].to_vec();
        if let Some(ptx) = pid_tx.take() {
            // Strip the launcher's pid line from the front of stderr.
            head.extend_from_slice(&data);
            let newline = head.iter().position(|b| *b == b'\n');
            let undecided = newline.is_none()
                && head.len() < 64
                && PID_MARK.starts_with(&head[..head.len().min(PID_MARK.len())])
                && n > 0;
            if undecided {
                pid_tx = Some(ptx);
                continue;
            }
            data = std::mem::take(&mut head);
            if let Some(nl) = newline {
                if data.starts_with(PID_MARK) {
                    let pid = std::str::from_utf8(&data[PID_MARK.len()..nl])
                        .ok()
                        .and_then(|s| s.trim().parse().ok());
                    if let Some(pid) = pid {
                        let _ = ptx.send(pid);
                    }
                    data.drain(..=nl);
                }
            }
        }
        if data.is_empty() {
            if n == 0 {
                return;
            }
            continue;
        }
        let ev = if stderr {
            ExecEvent::Stderr(data, SystemTime::now())
        } else {
            ExecEvent::Stdout(data, SystemTime::now())
        };
        if tx.send(ev).await.is_err() {
            // The client went away; keep draining so the process never blocks on a
            // full pipe while it is being stopped.
            while let Ok(n) = rx.read(&mut buf).await {
                if n == 0 {
                    return;
                }
            }
            return;
        }
        if n == 0 {
            return;
        }
    }
}

/// Most bytes of command, args and env one exec may carry (Linux's execve takes ~2 MiB with
/// an 8 MiB stack; containerd's Tasks.Exec takes 4 MiB of JSON): over it is INVALID_ARGUMENT
/// rather than a failure deep in the runtime.
pub const MAX_ARGV_ENV_BYTES: usize = 1 << 20;

impl Node {
    /// Sends `sig` to an exec's process (and its process group) inside the sandbox, by running
    /// `kill` in the sandbox; without a known pid, signals the host-side exec process instead.
    async fn signal_exec(&self, sb: &Sandbox, exec_id: &str, pid: Option<u32>, sig: u32) {
        let ctr = &self.runtime().ctr;
        let Some(pid) = pid else {
            let _ = ctr.kill(&sb.id, exec_id, sig, false).await;
            return;
        };
        let kill_id = format!("kill-{}", uuid::Uuid::new_v4().simple());
        let script = format!("kill -{sig} -{pid} 2>/dev/null; kill -{sig} {pid}");
        let args: Vec<String> = vec!["/.compute/busybox".into(), "sh".into(), "-c".into(), script];
        let process = spec::exec_process(&args, &[spec::DEFAULT_PATH.to_string()], "/");
        let res = async {
            ctr.exec(&sb.id, &kill_id, process, "", "").await?;
            ctr.start(&sb.id, &kill_id).await?;
            ctr.wait(&sb.id, &kill_id).await
        };
        if let Err(e) = tokio::time::timeout(Duration::from_secs(10), res).await {
            warn!(exec_id, error = %e, "signal exec timed out");
        }
        let _ = ctr.delete_process(&sb.id, &kill_id).await;
    }

    /// Checks an exec request and returns the sandbox once it is READY.
    pub async fn exec_prepare(&self, id: &str, req: &ExecRequest) -> Result<Arc<Sandbox>> {
        let sb = self.get(id)?;
        if req.command.is_empty() {
            return Err(Error::InvalidArgument("command is required".into()));
        }
        if req.command.contains('\0')
            || req.args.iter().any(|a| a.contains('\0'))
            || req
                .env
                .iter()
                .any(|(k, v)| k.is_empty() || k.contains(['=', '\0']) || v.contains('\0'))
        {
            return Err(Error::InvalidArgument(
                "command, args and env must not contain NUL, and env names no '='".into(),
            ));
        }
        let size = req.command.len()
            + req.args.iter().map(|a| a.len() + 1).sum::<usize>()
            + req
                .env
                .iter()
                .map(|(k, v)| k.len() + v.len() + 2)
                .sum::<usize>();
        if size > MAX_ARGV_ENV_BYTES {
            return Err(Error::InvalidArgument(format!(
                "command, args and env take {size} bytes, over the limit of {MAX_ARGV_ENV_BYTES}"
            )));
        }
        if !req.working_dir.is_empty() && !req.working_dir.starts_with('/') {
            return Err(Error::InvalidArgument(
                "working_dir must be absolute".into(),
            ));
        }
        self.wait_ready(&sb).await?;
        Ok(sb)
    }

    /// Runs an exec in a READY sandbox, sending its events to `tx`. The exec is cancelled when
    /// `tx`'s receiver is dropped (the client went away).
    #[instrument(skip_all, fields(sandbox_id = %sb.id))]
    pub async fn exec(&self, sb: Arc<Sandbox>, req: ExecRequest, tx: mpsc::Sender<ExecEvent>) {
        let done = match self.exec_inner(&sb, req, &tx).await {
            Ok(c) => c,
            Err(e) if e.is_unavailable() => {
                warn!(error = %e, "exec failed: containerd unavailable");
                crate::metrics::METRICS.exec("failed", Duration::ZERO);
                let _ = tx.send(ExecEvent::Failed(e.into())).await;
                return;
            }
            Err(e) => {
                warn!(error = %e, "exec failed");
                // The stream is already open: report the failure as a completed event with a
                // distinct exit code (127, as a shell does for a command it cannot run).
                let _ = tx
                    .send(ExecEvent::Stderr(
                        format!("compute: exec failed: {e}\n").into_bytes(),
                        SystemTime::now(),
                    ))
                    .await;
                Completed {
                    exit_code: 127,
                    ..Default::default()
                }
            }
        };
        let outcome = if done.cancelled {
            "cancelled"
        } else if done.timed_out {
            "timed_out"
        } else if done.oom_killed {
            "oom_killed"
        } else if done.exit_code == 127 && done.wall_time.is_zero() {
            "failed"
        } else {
            "exited"
        };
        crate::metrics::METRICS.exec(outcome, done.wall_time);
        let _ = tx.send(ExecEvent::Completed(done, SystemTime::now())).await;
    }

    async fn exec_inner(
        &self,
        sb: &Arc<Sandbox>,
        req: ExecRequest,
        tx: &mpsc::Sender<ExecEvent>,
    ) -> Result<Completed> {
        if let Some(r) = self.exec_via_agent(sb, &req, tx).await {
            return r;
        }
        let cfg = self.config();
        let ctr = &self.runtime().ctr;
        let exec_id = format!("exec-{}", uuid::Uuid::new_v4().simple());
        let io_dir = cfg.run_dir.join("io").join(&sb.id).join(&exec_id);
        let mut io = blocking(move || ExecIo::create(io_dir)).await??;

        let mut env: Vec<String> = vec![spec::DEFAULT_PATH.to_string(), "HOME=/root".into()];
        let mut keys: Vec<_> = req.env.keys().collect();
        keys.sort();
        for k in keys {
            env.retain(|e| !e.starts_with(&format!("{k}=")));
            env.push(format!("{k}={}", req.env[k]));
        }
        let cwd = if req.working_dir.is_empty() {
            sb.workspace.mount_path.clone()
        } else {
            req.working_dir.clone()
        };
        let launcher = self.has_helpers();
        let mut args = if launcher {
            vec![
                "/.compute/busybox".into(),
                "sh".into(),
                "-c".into(),
                LAUNCH.into(),
            ]
        } else {
            vec![]
        };
        args.push(req.command.clone());
        args.extend(req.args.iter().cloned());
        let process = spec::exec_process(&args, &env, &cwd);
        let timeout = req
            .timeout
            .filter(|t| !t.is_zero())
            .unwrap_or(Duration::from_secs(cfg.exec_timeout_cap_secs))
            .min(Duration::from_secs(cfg.exec_timeout_cap_secs));

        let cg = self.cgroup(&sb.id);
        let meter = sb.meter.clone();
        let meter_id = blocking(move || meter.begin_exec()).await?;
        // Whatever happens next, the exec is taken off the meter's books.
        struct EndOnDrop(Option<(std::sync::Arc<crate::metering::meter::Meter>, u64)>);
        impl Drop for EndOnDrop {
            fn drop(&mut self) {
                if let Some((m, id)) = self.0.take() {
                    tokio::task::spawn_blocking(move || m.end_exec(id));
                }
            }
        }
        let mut metered = EndOnDrop(Some((sb.meter.clone(), meter_id)));

        ctr.exec(
            &sb.id,
            &exec_id,
            process,
            &io.stdout_path.display().to_string(),
            &io.stderr_path.display().to_string(),
        )
        .await?;
        let started = Instant::now();
        if let Err(e) = ctr.start(&sb.id, &exec_id).await {
            let _ = ctr.delete_process(&sb.id, &exec_id).await;
            return Err(e.into());
        }
        io.release_writers();
        info!(exec_id = %exec_id, command = %req.command, "exec started");

        let (Some(out), Some(err)) = (io.stdout.take(), io.stderr.take()) else {
            return Err(Error::Internal("exec stdio missing".into()));
        };
        let (pid_tx, mut pid_rx) = oneshot::channel();
        let p_out = tokio::spawn(pump(out, tx.clone(), false, None));
        let p_err = tokio::spawn(pump(err, tx.clone(), true, launcher.then_some(pid_tx)));

        let ctr2 = ctr.clone();
        let (id2, ex2) = (sb.id.clone(), exec_id.clone());
        let mut wait = tokio::spawn(async move { ctr2.wait(&id2, &ex2).await });
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline);
        let mut ticker = tokio::time::interval(Duration::from_millis(cfg.sample_interval_ms));
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let limit = sb.limits.memory_bytes;

        let ending = loop {
            tokio::select! {
                r = &mut wait => {
                    break match r {
                        Ok(Ok(code)) => Ending::Exited(code),
                        Ok(Err(e)) => {
                            // containerd restarted under us: the process may still run.
                            let state = ctr.task_state(&sb.id, &exec_id).await.ok();
                            match state {
                                Some(TaskState::Stopped(code)) => Ending::Exited(code),
                                _ => return Err(e.into()),
                            }
                        }
                        Err(e) => return Err(Error::Internal(format!("wait task: {e}"))),
                    };
                }
                _ = tx.closed() => break Ending::Cancelled,
                _ = &mut deadline => break Ending::TimedOut,
                _ = ticker.tick() => {
                    let m = sb.meter.clone();
                    if let Ok(Some(ws)) = blocking(move || m.tick()).await {
                        if ws > limit {
                            break Ending::Oom;
                        }
                    }
                }
            }
        };

        let grace = Duration::from_secs(cfg.cancel_grace_secs);
        let inner_pid = match ending {
            Ending::Exited(_) => None,
            // The launcher reports the pid first thing; give it a moment if it is late.
            _ => tokio::time::timeout(Duration::from_secs(2), &mut pid_rx)
                .await
                .ok()
                .and_then(|r| r.ok()),
        };
        let signal = |sig: u32| self.signal_exec(sb, &exec_id, inner_pid, sig);
        let (exit_code, cancelled, timed_out, oom_killed) = match ending {
            Ending::Exited(code) => (code as i32, false, false, false),
            Ending::Cancelled => {
                info!(exec_id = %exec_id, "exec cancelled by client: SIGTERM");
                signal(15).await;
                if tokio::time::timeout(grace, &mut wait).await.is_err() {
                    info!(exec_id = %exec_id, "exec still running after grace: SIGKILL");
                    signal(9).await;
                    let _ = tokio::time::timeout(Duration::from_secs(10), &mut wait).await;
                }
                (-1, true, false, false)
            }
            Ending::TimedOut => {
                info!(exec_id = %exec_id, "exec timed out: SIGKILL");
                signal(9).await;
                let code = match tokio::time::timeout(Duration::from_secs(10), &mut wait).await {
                    Ok(Ok(Ok(c))) => c as i32,
                    _ => 137,
                };
                (code, false, true, false)
            }
            Ending::Oom => {
                warn!(exec_id = %exec_id, limit, "exec over memory_bytes: SIGKILL");
                signal(9).await;
                let _ = tokio::time::timeout(Duration::from_secs(10), &mut wait).await;
                // gVisor returns the killed process's memory to the host shortly after; wait
                // for that so the next exec does not start over the limit.
                let settle = Instant::now();
                while settle.elapsed() < Duration::from_secs(5) {
                    let c = cg.clone();
                    match blocking(move || c.working_set()).await {
                        Ok(Ok(ws)) if ws > limit => {
                            tokio::time::sleep(Duration::from_millis(50)).await
                        }
                        _ => break,
                    }
                }
                (137, false, false, true)
            }
        };
        let wall_time = started.elapsed();
        // Output produced before the exit is still in the FIFOs: drain it, but do not wait
        // forever for a background child that keeps the pipe open.
        let drain = Duration::from_millis(500);
        let _ = tokio::time::timeout(drain, p_out).await;
        let _ = tokio::time::timeout(drain, p_err).await;
        let _ = ctr.delete_process(&sb.id, &exec_id).await;

        let (m, id) = metered.0.take().expect("exec is metered");
        let usage = blocking(move || m.end_exec(id)).await?;
        let cpu_ms = usage.cpu_ms;
        drop(io);
        info!(exec_id = %exec_id, exit_code, cancelled, timed_out, oom_killed,
              wall_ms = wall_time.as_millis() as u64, cpu_ms, "exec completed");
        Ok(Completed {
            exit_code,
            wall_time,
            cancelled,
            timed_out,
            oom_killed,
            usage,
        })
    }
}

impl Node {
    /// Cancels the execs a daemon crash left behind (their exec directories under
    /// `<run_dir>/io/<sandbox>`): their callers are gone, so they end as if the callers had hung
    /// up. Their FIFOs get a reader first, because a shim whose exec start was cut short blocks
    /// opening them (up to 30 s, with the task answering Unknown meanwhile); then each exec is
    /// killed, waited for and deleted in the background, and its FIFOs removed.
    pub(super) async fn reap_orphaned_execs(&self, sb: &Sandbox) {
        let dir = self.config().run_dir.join("io").join(&sb.id);
        let found = blocking(move || {
            std::fs::read_dir(&dir)
                .map(|rd| {
                    rd.flatten()
                        .filter(|e| e.file_name().to_string_lossy().starts_with("exec-"))
                        .map(|e| (e.file_name().to_string_lossy().into_owned(), e.path()))
                        .collect::<Vec<_>>()
                })
                .unwrap_or_default()
        })
        .await
        .unwrap_or_default();
        if found.is_empty() {
            return;
        }
        let mut orphans = Vec::new();
        for (exec_id, dir) in found {
            let readers: Vec<_> = ["stdout", "stderr"]
                .iter()
                .filter_map(|f| {
                    tokio::net::unix::pipe::OpenOptions::new()
                        .open_receiver(dir.join(f))
                        .ok()
                })
                .collect();
            orphans.push((exec_id, dir, readers));
        }
        let ctr = self.runtime().ctr.clone();
        let id = sb.id.clone();
        tokio::spawn(async move {
            for (exec_id, dir, readers) in orphans {
                if ctr.kill(&id, &exec_id, 9, false).await.is_ok() {
                    let _ = tokio::time::timeout(Duration::from_secs(10), ctr.wait(&id, &exec_id))
                        .await;
                }
                let _ = ctr.delete_process(&id, &exec_id).await;
                drop(readers);
                let _ = blocking(move || std::fs::remove_dir_all(dir)).await;
                info!(sandbox_id = %id, exec_id = %exec_id, "exec orphaned by a restart cancelled");
            }
        });
    }
}
