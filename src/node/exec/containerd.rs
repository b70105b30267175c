//! The containerd backend: Tasks.Exec into the sandbox (a `runsc exec` on the host) with
//! per-exec FIFOs, output streamed as it is produced.
//!
//! Signals must reach the process inside gVisor, not the host-side `runsc exec` waiter: with
//! the init helper mounted, every exec runs through a launcher that reports the process's pid
//! inside the sandbox on the first line of stderr ([`PidStrip`] takes it off the output), and
//! a signal is a short `kill` exec'd into the sandbox.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use nix::sys::signal::Signal;
use tokio::sync::oneshot;
use tokio::task::{JoinHandle, JoinSet};
use tracing::info;

use super::lifecycle::{lost, Backend, Exit, Output};
use super::{ExecEvent, ExecRequest, InputRx};
use crate::flow::Window;
use crate::node::{blocking, Error, Node, Result, Sandbox};
use crate::runtime::{spec, ExecIo, ExecLaunch, SandboxRuntime, TaskState};
use sandbox_agent::flow;

/// The first line the launcher writes to stderr: `\x1ecompute-pid:<pid>\n`.
const PID_MARK: &[u8] = b"\x1ecompute-pid:";

/// The launcher every exec runs through when the init helper is mounted: it reports the
/// process's pid inside the sandbox (so signals can reach it; a signal to the host-side
/// `runsc exec` waiter does not) and then becomes the command.
const LAUNCH: &str = "printf '\\036compute-pid:%s\\n' \"$$\" >&2; exec \"$0\" \"$@\"";

/// How long output is drained after the exit: a background child that keeps the pipe open is
/// not waited for.
const DRAIN: Duration = Duration::from_millis(500);

/// Takes the launcher's pid line off the front of stderr. Bytes go in as they are read; what
/// comes out is the stderr the command wrote, and the pid once the line is complete. Anything
/// that is not the mark is passed through untouched.
#[derive(Debug, Default)]
pub struct PidStrip {
    head: Vec<u8>,
    decided: bool,
}

impl PidStrip {
    /// Feeds one read (`eof`: the stream ended); returns the bytes to pass on and the pid if
    /// this read completed the line.
    pub fn push(&mut self, data: &[u8], eof: bool) -> (Vec<u8>, Option<u32>) {
        if self.decided {
            return (data.to_vec(), None);
        }
        self.head.extend_from_slice(data);
        let newline = self.head.iter().position(|b| *b == b'\n');
        let could_be_mark = PID_MARK.starts_with(&self.head[..self.head.len().min(PID_MARK.len())]);
        if newline.is_none() && self.head.len() < 64 && could_be_mark && !eof {
            return (Vec::new(), None);
        }
        self.decided = true;
        let mut out = std::mem::take(&mut self.head);
        let mut pid = None;
        if let Some(nl) = newline {
            if out.starts_with(PID_MARK) {
                pid = std::str::from_utf8(&out[PID_MARK.len()..nl])
                    .ok()
                    .and_then(|s| s.trim().parse().ok());
                out.drain(..=nl);
            }
        }
        (out, pid)
    }
}

/// Forwards one FIFO to the client in chunks (`sandbox_agent::flow`); for stderr with the
/// launcher, strips the pid line and hands the pid over. The FIFO is read only while the
/// exec's output window has room, so a client that is behind blocks the process on its write.
async fn pump(
    mut rx: tokio::net::unix::pipe::Receiver,
    out: Output,
    window: Arc<Window>,
    stderr: bool,
    mut pid: Option<oneshot::Sender<u32>>,
) {
    let mut buf = vec![0u8; flow::CHUNK_MAX];
    let mut strip = pid.as_ref().map(|_| PidStrip::default());
    let mut client_gone = false;
    loop {
        window.room().await;
        let n = flow::read_chunk(&mut rx, &mut buf, flow::LINGER).await;
        let (data, found) = match strip.as_mut() {
            Some(s) => s.push(&buf[..n], n == 0),
            None => (buf[..n].to_vec(), None),
        };
        if let (Some(p), Some(tx)) = (found, pid.take()) {
            let _ = tx.send(p);
        }
        // The client went away: keep draining so the process never blocks on a full pipe
        // while it is being stopped (a dropped event gives its bytes back at once).
        if !data.is_empty() && !client_gone {
            let at = SystemTime::now();
            let hold = window.hold(data.len());
            let ev = if stderr {
                ExecEvent::Stderr(data, at, hold)
            } else {
                ExecEvent::Stdout(data, at, hold)
            };
            client_gone = out.send(ev).await.is_err();
        }
        if n == 0 {
            return;
        }
    }
}

/// One exec through containerd.
pub struct ContainerdExec {
    rt: Arc<dyn SandboxRuntime>,
    sandbox_id: String,
    exec_id: String,
    io_dir: PathBuf,
    process: Vec<u8>,
    launcher: bool,
    io: Option<ExecIo>,
    pumps: JoinSet<()>,
    wait: Option<JoinHandle<crate::runtime::Result<u32>>>,
    pid_rx: Option<oneshot::Receiver<u32>>,
    pid: Option<u32>,
    window: Arc<Window>,
}

impl ContainerdExec {
    /// The backend for `req` in `sb`.
    pub fn new(node: &Node, sb: &Sandbox, req: &ExecRequest, input: Option<InputRx>) -> Self {
        let _ = input;
        let exec_id = format!("exec-{}", uuid::Uuid::new_v4().simple());
        let mut env: Vec<String> = vec![spec::DEFAULT_PATH.to_string(), "HOME=/root".into()];
        let mut keys: Vec<_> = req.env.keys().collect();
        keys.sort();
        for k in keys {
            env.retain(|e| !e.starts_with(&format!("{k}=")));
            env.push(format!("{k}={}", req.env[k]));
        }
        let launcher = node.has_helpers();
        let mut args: Vec<String> = if launcher {
            ["/.compute/busybox", "sh", "-c", LAUNCH]
                .map(String::from)
                .into()
        } else {
            vec![]
        };
        args.push(req.command.clone());
        args.extend(req.args.iter().cloned());
        Self {
            rt: node.inner.rt.clone(),
            sandbox_id: sb.id.clone(),
            io_dir: node.config().run_dir.join("io").join(&sb.id).join(&exec_id),
            exec_id,
            process: spec::exec_process(&args, &env, &req.cwd(sb)),
            launcher,
            io: None,
            pumps: JoinSet::new(),
            wait: None,
            pid_rx: None,
            pid: None,
            window: Window::new(node.relay().settings().exec_window),
        }
    }

    /// The process's pid inside the sandbox, as the launcher reported it (it is the first
    /// thing it writes; a late one gets a moment).
    async fn inner_pid(&mut self) -> Option<u32> {
        if self.pid.is_none() {
            if let Some(rx) = self.pid_rx.as_mut() {
                self.pid = tokio::time::timeout(Duration::from_secs(2), rx)
                    .await
                    .ok()
                    .and_then(|r| r.ok());
                self.pid_rx = None;
            }
        }
        self.pid
    }
}

impl Backend for ContainerdExec {
    fn name(&self) -> &'static str {
        "containerd"
    }

    async fn start(&mut self, out: Output) -> Result<()> {
        let dir = self.io_dir.clone();
        let mut io = blocking(move || ExecIo::create(dir)).await??;
        let process = std::mem::take(&mut self.process);
        let launch = ExecLaunch {
            exec_id: &self.exec_id,
            process,
            stdout: &io.stdout_path,
            stderr: &io.stderr_path,
        };
        self.rt.exec_start(&self.sandbox_id, launch).await?;
        io.release_writers();
        info!(exec_id = %self.exec_id, "exec started");
        let (Some(o), Some(e)) = (io.stdout.take(), io.stderr.take()) else {
            return Err(Error::Internal("exec stdio missing".into()));
        };
        let (pid_tx, pid_rx) = oneshot::channel();
        self.pumps
            .spawn(pump(o, out.clone(), self.window.clone(), false, None));
        self.pumps.spawn(pump(
            e,
            out,
            self.window.clone(),
            true,
            self.launcher.then_some(pid_tx),
        ));
        self.pid_rx = self.launcher.then_some(pid_rx);
        let (rt, id, ex) = (
            self.rt.clone(),
            self.sandbox_id.clone(),
            self.exec_id.clone(),
        );
        self.wait = Some(tokio::spawn(async move { rt.exec_wait(&id, &ex).await }));
        self.io = Some(io);
        Ok(())
    }

    async fn signal(&mut self, signal: Signal) -> Result<()> {
        let Some(pid) = self.inner_pid().await else {
            // No launcher: the host-side exec process is all we can reach.
            return Ok(self
                .rt
                .exec_kill(&self.sandbox_id, &self.exec_id, signal)
                .await?);
        };
        let kill_id = format!("kill-{}", uuid::Uuid::new_v4().simple());
        let n = signal as i32;
        let script = format!("kill -{n} -{pid} 2>/dev/null; kill -{n} {pid}");
        let args: Vec<String> = ["/.compute/busybox", "sh", "-c"]
            .map(String::from)
            .into_iter()
            .chain([script])
            .collect();
        let process = spec::exec_process(&args, &[spec::DEFAULT_PATH.to_string()], "/");
        let (rt, id) = (&self.rt, &self.sandbox_id);
        let null = std::path::Path::new("");
        let launch = ExecLaunch {
            exec_id: &kill_id,
            process,
            stdout: null,
            stderr: null,
        };
        let run = async {
            rt.exec_start(id, launch).await?;
            rt.exec_wait(id, &kill_id).await
        };
        let r = tokio::time::timeout(Duration::from_secs(10), run).await;
        let _ = rt.exec_delete(id, &kill_id).await;
        match r {
            Ok(r) => r.map(|_| ()).map_err(Error::from),
            Err(_) => Err(Error::Internal(format!("signal exec {kill_id} timed out"))),
        }
    }

    async fn wait(&mut self) -> Result<Exit> {
        let Some(w) = self.wait.as_mut() else {
            return Err(lost(&self.sandbox_id, "the exec was never started"));
        };
        let r = w.await;
        self.wait = None;
        match r {
            Ok(Ok(code)) => Ok(Exit::Code(code as i32)),
            Ok(Err(e)) => {
                // containerd restarted under us: the process may have ended meanwhile.
                match self.rt.exec_state(&self.sandbox_id, &self.exec_id).await {
                    Ok(TaskState::Stopped(code)) => Ok(Exit::Code(code as i32)),
                    _ => Err(e.into()),
                }
            }
            Err(e) => Err(Error::Internal(format!("wait task: {e}"))),
        }
    }

    async fn cleanup(&mut self) {
        // Output produced before the exit is still in the FIFOs: drain it, but do not wait
        // forever for a background child that keeps the pipe open.
        let _ = tokio::time::timeout(DRAIN, async {
            while self.pumps.join_next().await.is_some() {}
        })
        .await;
        self.pumps.abort_all();
        let _ = self.rt.exec_delete(&self.sandbox_id, &self.exec_id).await;
        self.io = None;
    }
}

impl Drop for ContainerdExec {
    fn drop(&mut self) {
        if let Some(w) = self.wait.take() {
            w.abort();
        }
    }
}

/// The exec directories under a sandbox's `<run_dir>/io/<id>` (an earlier daemon's execs).
/// Blocking.
pub fn orphans_in(dir: &std::path::Path) -> Vec<(String, PathBuf)> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with("exec-"))
                .map(|e| (e.file_name().to_string_lossy().into_owned(), e.path()))
                .collect()
        })
        .unwrap_or_default()
}

/// Cancels the execs a daemon crash left behind: their callers are gone, so they end as if
/// the callers had hung up. Their FIFOs get a reader first, because a shim whose exec start
/// was cut short blocks opening them (up to 30 s, with the task answering Unknown meanwhile);
/// then each exec is killed, waited for and deleted in the background, and its FIFOs removed.
pub(crate) fn reap_orphans(node: &Node, sandbox_id: &str, found: Vec<(String, PathBuf)>) {
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
    let rt = node.inner.rt.clone();
    let id = sandbox_id.to_string();
    node.inner.tasks.spawn(async move {
        for (exec_id, dir, readers) in orphans {
            if rt.exec_kill(&id, &exec_id, Signal::SIGKILL).await.is_ok() {
                let _ = tokio::time::timeout(Duration::from_secs(10), rt.exec_wait(&id, &exec_id))
                    .await;
            }
            let _ = rt.exec_delete(&id, &exec_id).await;
            drop(readers);
            let _ = blocking(move || std::fs::remove_dir_all(dir)).await;
            info!(sandbox_id = %id, exec_id = %exec_id, "exec orphaned by a restart cancelled");
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `reads` one at a time (the last one then end-of-file) and collects what passes.
    fn strip(reads: &[&[u8]]) -> (Vec<u8>, Option<u32>) {
        let mut s = PidStrip::default();
        let mut out = Vec::new();
        let mut pid = None;
        for r in reads {
            let (d, p) = s.push(r, false);
            out.extend(d);
            pid = pid.or(p);
        }
        let (d, p) = s.push(b"", true);
        out.extend(d);
        (out, pid.or(p))
    }

    #[test]
    fn the_launchers_pid_line_is_taken_off_stderr() {
        type Case = (&'static [&'static [u8]], &'static [u8], Option<u32>);
        let cases: Vec<Case> = vec![
            // The line alone, then the command's stderr.
            (&[b"\x1ecompute-pid:42\n", b"oops\n"], b"oops\n", Some(42)),
            // In one read with what follows.
            (&[b"\x1ecompute-pid:7\nerr"], b"err", Some(7)),
            // Split anywhere, even inside the mark.
            (&[b"\x1ecomp", b"ute-pid:1", b"23\n", b"x"], b"x", Some(123)),
            // A stderr that does not start with the mark passes untouched.
            (&[b"plain error\n"], b"plain error\n", None),
            (&[b"\x1e", b"not the mark\n"], b"\x1enot the mark\n", None),
            // The mark without a newline before the end: passed through, no pid.
            (&[b"\x1ecompute-pid:9"], b"\x1ecompute-pid:9", None),
            // A garbled pid: the line goes, no pid.
            (&[b"\x1ecompute-pid:abc\nrest"], b"rest", None),
            // Nothing at all.
            (&[], b"", None),
            // The mark appearing later is the command's own output.
            (
                &[b"a\n\x1ecompute-pid:5\n"],
                b"a\n\x1ecompute-pid:5\n",
                None,
            ),
        ];
        for (reads, want, pid) in cases {
            let (got, p) = strip(reads);
            assert_eq!((got.as_slice(), p), (want, pid), "{reads:?}");
        }
        // Over 64 bytes with no newline: not a pid line.
        let long = [PID_MARK, &[b'1'; 70][..]].concat();
        assert_eq!(strip(&[&long]), (long.clone(), None));
    }
}
