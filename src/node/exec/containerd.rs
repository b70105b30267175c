//! The containerd backend: Tasks.Exec into the sandbox (a `runsc exec` on the host) with
//! per-exec FIFOs, output streamed as it is produced.
//!
//! Signals must reach the process inside gVisor, not the host-side `runsc exec` waiter: with
//! the init helper mounted, every exec runs through a launcher that reports the process's pid
//! inside the sandbox on the first line of stderr (of the terminal, with a tty: it comes on
//! stdout then), [`PidStrip`] takes it off the output, and a signal is a short `kill` exec'd
//! into the sandbox.
//!
//! An interactive exec's stdin is a FIFO too, fed in order from its input ([`InputRx`]), each
//! write awaited: the bounded input and the FIFO's buffer are all that is held, so a process
//! that does not read stops its client. The shim holds a write end of its own, so the end of
//! stdin is Tasks.CloseIO once our write end is closed. With a tty the process runs on a
//! pseudo-terminal the shim copies to stdout (there is no stderr); the launcher's pid line
//! comes on it (`\r\n`-ended, the terminal's output processing), the end of stdin is the
//! terminal's end-of-file character typed (closing a console's stdin makes the shim shut the
//! console down, output and all), and a resize is Tasks.ResizePty.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use nix::sys::signal::Signal;
use tokio::io::AsyncWriteExt;
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};
use tracing::{debug, info, warn, Instrument};

use super::lifecycle::{lost, Backend, Exit, Output};
use super::{ExecEvent, ExecInput, ExecRequest, InputRx, TtySize};
use crate::flow::Window;
use crate::node::{blocking, Error, Node, Result, Sandbox};
use crate::runtime::{spec, ConsoleSize, ExecIo, ExecLaunch, SandboxRuntime, TaskState};
use sandbox_agent::flow;

/// The first line the launcher writes to stderr: `\x1ecompute-pid:<pid>\n` (on a terminal,
/// `\r\n`-ended).
const PID_MARK: &[u8] = b"\x1ecompute-pid:";

/// The launcher every exec runs through when the init helper is mounted: it reports the
/// process's pid inside the sandbox (so signals can reach it; a signal to the host-side
/// `runsc exec` waiter does not) and then becomes the command.
const LAUNCH: &str = "printf '\\036compute-pid:%s\\n' \"$$\" >&2; exec \"$0\" \"$@\"";

/// What the launcher does first on a terminal (rows, columns): runsc does not apply the OCI
/// `consoleSize` (the pseudo-terminal it makes starts at 0x0), so the size is set from inside
/// before the command can read it.
fn launch_on_terminal(size: ConsoleSize) -> String {
    let ConsoleSize { height, width } = size;
    format!("/.compute/busybox stty rows {height} cols {width} 2>/dev/null; {LAUNCH}")
}

/// The script that sends signal `n` to an exec whose process (the session leader) is `pid`
/// inside the sandbox: its process group, then the process. On a terminal, first every
/// process group of its session: a shell there runs each job in a group of its own (the
/// foreground one included), and gVisor neither makes the terminal the session's
/// controlling one nor hangs it up when the shell dies, so nothing else would reach a job.
fn kill_script(n: i32, pid: u32, terminal: bool) -> String {
    let groups = if terminal {
        // /proc/<pid>/stat: after the `(comm) `, state, ppid, pgrp, session.
        format!(
            "for f in /proc/[0-9]*/stat; do read -r l < \"$f\" || continue; \
             set -- ${{l##*\") \"}}; [ \"$4\" = {pid} ] && kill -{n} -\"$3\"; done 2>/dev/null; "
        )
    } else {
        String::new()
    };
    format!("{groups}kill -{n} -{pid} 2>/dev/null; kill -{n} {pid}")
}

/// How long output is drained after the exit: a background child that keeps the pipe open is
/// not waited for.
const DRAIN: Duration = Duration::from_millis(500);

/// How long the launcher's pid line is waited for (it is the first thing it writes).
const PID_WAIT: Duration = Duration::from_secs(2);

/// How long the shim may take to open its read end of the stdin FIFO after the start.
const STDIN_OPEN_WAIT: Duration = Duration::from_secs(5);

/// A terminal's end-of-file character (VEOF, ^D).
const EOF_CHAR: u8 = 0x04;

/// Takes the launcher's pid line off the front of stderr (or of a terminal's output). Bytes
/// go in as they are read; what comes out is the output the command wrote, and the pid once
/// the line is complete. Anything that is not the mark is passed through untouched.
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
                // `trim` also takes the `\r` a terminal puts before the newline.
                pid = std::str::from_utf8(&out[PID_MARK.len()..nl])
                    .ok()
                    .and_then(|s| s.trim().parse().ok());
                out.drain(..=nl);
            }
        }
        (out, pid)
    }

    /// Whether the front of the stream has been told apart: the line taken off (or found not
    /// to be there), everything from now on passed through.
    pub fn decided(&self) -> bool {
        self.decided
    }
}

/// What the launcher's pid line said, as the output pump found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PidLine {
    /// Not yet told.
    Pending,
    /// The process's pid inside the sandbox.
    Pid(u32),
    /// The output did not start with the line (or ended first).
    Absent,
}

/// Forwards one FIFO to the client in chunks (`sandbox_agent::flow`); for the stream the
/// launcher writes its line to, strips the pid line and hands the pid over. The FIFO is read
/// only while the exec's output window has room, so a client that is behind blocks the
/// process on its write.
async fn pump(
    mut rx: tokio::net::unix::pipe::Receiver,
    out: Output,
    window: Arc<Window>,
    stderr: bool,
    mut pid: Option<watch::Sender<PidLine>>,
) {
    let mut buf = vec![0u8; flow::CHUNK_MAX];
    let mut strip = pid.as_ref().map(|_| PidStrip::default());
    let mut client_gone = false;
    loop {
        window.room().await;
        let n = flow::read_chunk(&mut rx, &mut buf, flow::LINGER).await;
        let (data, told) = match strip.as_mut() {
            Some(s) => {
                let (data, found) = s.push(&buf[..n], n == 0);
                (data, s.decided().then_some(found))
            }
            None => (buf[..n].to_vec(), None),
        };
        if let Some(found) = told {
            strip = None;
            if let Some(tx) = pid.take() {
                tx.send_replace(found.map_or(PidLine::Absent, PidLine::Pid));
            }
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

/// Where an interactive exec's input goes: its stdin FIFO, and its terminal's size.
struct Feed {
    rt: Arc<dyn SandboxRuntime>,
    sandbox_id: String,
    exec_id: String,
    stdin: PathBuf,
    tty: bool,
    /// With a tty and the launcher: the pid line, which stdin must not overtake (the terminal
    /// echoes what is typed, and an echo ahead of the line would hide it).
    pid_line: Option<watch::Receiver<PidLine>>,
}

impl Feed {
    /// Feeds `input` to the process in order until it ends (its Close, or the channel's end),
    /// then ends stdin; a tty's resizes go on after the end of stdin.
    async fn run(mut self, mut input: InputRx) {
        let mut writer = self.open().await;
        if let Some(mut line) = self.pid_line.take() {
            let told = line.wait_for(|p| *p != PidLine::Pending);
            let _ = tokio::time::timeout(PID_WAIT, told).await;
        }
        let mut open = true;
        // Whether the terminal's current line is empty (see `end`).
        let mut line_start = true;
        while let Some(i) = input.recv().await {
            match i {
                ExecInput::Stdin(data) if open => {
                    let Some(w) = writer.as_mut() else { continue };
                    if let Err(e) = w.write_all(&data).await {
                        // The process's stdin is gone (it exited or closed it): what follows
                        // has nowhere to go.
                        debug!(exec_id = %self.exec_id, error = %e, "stdin no longer read");
                        writer = None;
                    } else if let Some(last) = data.last() {
                        line_start = matches!(*last, b'\n' | b'\r' | EOF_CHAR);
                    }
                }
                // After the close stdin bytes have nowhere to go; a terminal still resizes.
                ExecInput::Stdin(_) => {}
                ExecInput::Close => {
                    if open {
                        open = false;
                        self.end(&mut writer, line_start).await;
                    }
                }
                ExecInput::Resize(size) => {
                    if self.tty {
                        self.resize(size).await;
                    }
                }
            }
        }
        if open {
            self.end(&mut writer, line_start).await;
        }
        if self.tty && writer.is_some() {
            // Closing a console's stdin makes the shim shut the console down, output and all:
            // the write end is held until the exec is cleaned up (which aborts this task).
            std::future::pending::<()>().await;
        }
    }

    /// The stdin FIFO's write end, once the shim reads it; None if it never does (the input
    /// is then dropped, and the end of stdin still sent).
    async fn open(&self) -> Option<tokio::net::unix::pipe::Sender> {
        let deadline = Instant::now() + STDIN_OPEN_WAIT;
        loop {
            let path = self.stdin.clone();
            let r = blocking(move || ExecIo::open_stdin(&path))
                .await
                .and_then(|r| r.map_err(Error::from));
            match r {
                Ok(Some(w)) => return Some(w),
                Ok(None) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                Ok(None) => {
                    warn!(exec_id = %self.exec_id, "the shim never read the stdin FIFO: input dropped");
                    return None;
                }
                Err(e) => {
                    warn!(exec_id = %self.exec_id, error = %e, "stdin FIFO: input dropped");
                    return None;
                }
            }
        }
    }

    /// Ends stdin. Without a tty: our write end closes, then the shim's (Tasks.CloseIO); what
    /// the FIFO still holds is read first. With one: ^D is typed, which ends a read at the
    /// terminal; only an empty read is end-of-file, so a partial line pending takes two.
    async fn end(&self, writer: &mut Option<tokio::net::unix::pipe::Sender>, line_start: bool) {
        if self.tty {
            let eof: &[u8] = if line_start {
                &[EOF_CHAR]
            } else {
                &[EOF_CHAR, EOF_CHAR]
            };
            if let Some(w) = writer.as_mut() {
                if w.write_all(eof).await.is_err() {
                    *writer = None;
                }
            }
            return;
        }
        *writer = None;
        match self
            .rt
            .exec_close_stdin(&self.sandbox_id, &self.exec_id)
            .await
        {
            Ok(()) => {}
            // An exec already deleted has no stdin left to close.
            Err(e) if e.is_not_found() => {
                debug!(exec_id = %self.exec_id, error = %e, "exec gone before its stdin closed");
            }
            Err(e) => {
                warn!(exec_id = %self.exec_id, error = %e, "could not close the exec's stdin");
            }
        }
    }

    async fn resize(&self, size: TtySize) {
        let (height, width) = size.or_default();
        let size = ConsoleSize { height, width };
        if let Err(e) = self
            .rt
            .exec_resize(&self.sandbox_id, &self.exec_id, size)
            .await
        {
            debug!(exec_id = %self.exec_id, error = %e, "could not resize the exec's terminal");
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
    /// The terminal's size, when the process runs on one.
    console: Option<ConsoleSize>,
    input: Option<InputRx>,
    io: Option<ExecIo>,
    pumps: JoinSet<()>,
    feed: Option<JoinHandle<()>>,
    wait: Option<JoinHandle<crate::runtime::Result<u32>>>,
    pid_rx: Option<watch::Receiver<PidLine>>,
    pid: Option<u32>,
    window: Arc<Window>,
}

impl ContainerdExec {
    /// The backend for `req` in `sb`; with `input`, the process's stdin (and its terminal's
    /// size) streamed from it, else an empty stdin.
    pub fn new(node: &Node, sb: &Sandbox, req: &ExecRequest, input: Option<InputRx>) -> Self {
        let exec_id = format!("exec-{}", uuid::Uuid::new_v4().simple());
        let mut env: Vec<String> = vec![spec::DEFAULT_PATH.to_string(), "HOME=/root".into()];
        let mut keys: Vec<_> = req.env.keys().collect();
        keys.sort();
        for k in keys {
            env.retain(|e| !e.starts_with(&format!("{k}=")));
            env.push(format!("{k}={}", req.env[k]));
        }
        let console = req.tty.map(|t| {
            let (height, width) = t.or_default();
            ConsoleSize { height, width }
        });
        let launcher = node.has_helpers();
        let mut args: Vec<String> = if launcher {
            let script = console.map_or_else(|| LAUNCH.to_string(), launch_on_terminal);
            ["/.compute/busybox", "sh", "-c"]
                .map(String::from)
                .into_iter()
                .chain([script])
                .collect()
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
            process: spec::exec_process(&args, &env, &req.cwd(sb), console),
            launcher,
            console,
            input,
            io: None,
            pumps: JoinSet::new(),
            feed: None,
            wait: None,
            pid_rx: None,
            pid: None,
            window: Window::new(node.relay().settings().exec_window),
        }
    }

    /// The process's pid inside the sandbox, as the launcher reported it (it is the first
    /// thing it writes; a late one gets a moment).
    async fn inner_pid(&mut self) -> Option<u32> {
        if let Some(mut rx) = self.pid_rx.take() {
            let told = rx.wait_for(|p| *p != PidLine::Pending);
            if let Ok(Ok(line)) = tokio::time::timeout(PID_WAIT, told).await {
                if let PidLine::Pid(p) = *line {
                    self.pid = Some(p);
                }
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
        let (stdin, tty) = (self.input.is_some(), self.console.is_some());
        let mut io = blocking(move || ExecIo::create(dir, stdin, tty)).await??;
        let process = std::mem::take(&mut self.process);
        let none = Path::new("");
        let launch = ExecLaunch {
            exec_id: &self.exec_id,
            process,
            stdin: io.stdin_path.as_deref().unwrap_or(none),
            stdout: &io.stdout_path,
            stderr: io.stderr_path.as_deref().unwrap_or(none),
            terminal: tty,
        };
        self.rt.exec_start(&self.sandbox_id, launch).await?;
        io.release_writers();
        info!(exec_id = %self.exec_id, tty, stdin, "exec started");
        if let Some(size) = self.console {
            // runsc's pseudo-terminal starts at 0x0 (see `launch_on_terminal`): without the
            // launcher, this is the soonest the size can be set.
            if let Err(e) = self
                .rt
                .exec_resize(&self.sandbox_id, &self.exec_id, size)
                .await
            {
                debug!(exec_id = %self.exec_id, error = %e, "could not size the exec's terminal");
            }
        }
        let Some(o) = io.stdout.take() else {
            return Err(Error::Internal("exec stdout missing".into()));
        };
        let (pid_tx, pid_rx) = watch::channel(PidLine::Pending);
        let pid_tx = self.launcher.then_some(pid_tx);
        let window = &self.window;
        match io.stderr.take() {
            Some(e) => {
                self.pumps
                    .spawn(pump(o, out.clone(), window.clone(), false, None));
                self.pumps.spawn(pump(e, out, window.clone(), true, pid_tx));
            }
            // A terminal: one stream, the launcher's line on it.
            None => {
                self.pumps
                    .spawn(pump(o, out, window.clone(), false, pid_tx));
            }
        }
        if let (Some(input), Some(path)) = (self.input.take(), io.stdin_path.clone()) {
            let feed = Feed {
                rt: self.rt.clone(),
                sandbox_id: self.sandbox_id.clone(),
                exec_id: self.exec_id.clone(),
                stdin: path,
                tty,
                pid_line: (tty && self.launcher).then(|| pid_rx.clone()),
            };
            let span = tracing::Span::current();
            self.feed = Some(tokio::spawn(feed.run(input).instrument(span)));
        }
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
        let script = kill_script(n, pid, self.console.is_some());
        let args: Vec<String> = ["/.compute/busybox", "sh", "-c"]
            .map(String::from)
            .into_iter()
            .chain([script])
            .collect();
        let process = spec::exec_process(&args, &[spec::DEFAULT_PATH.to_string()], "/", None);
        let (rt, id) = (&self.rt, &self.sandbox_id);
        let null = Path::new("");
        let launch = ExecLaunch {
            exec_id: &kill_id,
            process,
            stdin: null,
            stdout: null,
            stderr: null,
            terminal: false,
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
        // Only after the drain: a tty's stdin is held open so as not to shut its console down.
        if let Some(f) = self.feed.take() {
            f.abort();
        }
        let _ = self.rt.exec_delete(&self.sandbox_id, &self.exec_id).await;
        self.io = None;
    }
}

impl Drop for ContainerdExec {
    fn drop(&mut self) {
        if let Some(w) = self.wait.take() {
            w.abort();
        }
        if let Some(f) = self.feed.take() {
            f.abort();
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
            // On a terminal the line ends `\r\n` (output processing turns `\n` into it).
            (&[b"\x1ecompute-pid:42\r\n", b"$ "], b"$ ", Some(42)),
            (&[b"\x1ecompute-pid:8\r", b"\nhi\r\n"], b"hi\r\n", Some(8)),
            (&[b"\x1ecompute-pid:8\r"], b"\x1ecompute-pid:8\r", None),
            // A terminal's echo of early input ahead of the line: not the mark.
            (
                &[b"ls\r\n\x1ecompute-pid:3\r\n"],
                b"ls\r\n\x1ecompute-pid:3\r\n",
                None,
            ),
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

    #[test]
    fn the_launcher_and_kill_scripts_parse() {
        let size = ConsoleSize {
            height: 40,
            width: 132,
        };
        let on_terminal = launch_on_terminal(size);
        assert!(on_terminal.starts_with("/.compute/busybox stty rows 40 cols 132 "));
        assert!(on_terminal.ends_with(LAUNCH));
        // Without a terminal a signal is what it always was.
        assert_eq!(
            kill_script(9, 7, false),
            "kill -9 -7 2>/dev/null; kill -9 7"
        );
        let sweep = kill_script(15, 42, true);
        assert!(sweep.ends_with("kill -15 -42 2>/dev/null; kill -15 42"));
        for script in [LAUNCH.to_string(), on_terminal, sweep] {
            let parsed = std::process::Command::new("sh")
                .args(["-n", "-c", &script])
                .status()
                .unwrap();
            assert!(parsed.success(), "{script}");
        }
    }

    #[test]
    fn the_strip_is_decided_once_the_front_is_told() {
        // What stdin to a terminal waits for: the line complete, or known not to be there.
        let mut s = PidStrip::default();
        assert_eq!(s.push(b"\x1ecompute-pid:4", false), (vec![], None));
        assert!(!s.decided());
        assert_eq!(s.push(b"2\r\n", false), (vec![], Some(42)));
        assert!(s.decided());
        let mut s = PidStrip::default();
        assert_eq!(s.push(b"$ ", false), (b"$ ".to_vec(), None));
        assert!(s.decided());
        let mut s = PidStrip::default();
        assert_eq!(s.push(b"", true), (vec![], None));
        assert!(s.decided());
    }
}
