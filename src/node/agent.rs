//! The in-sandbox agent: `sandbox-agent` runs as each sandbox's init (PID 1, mounted read-only
//! from the host at `/.compute`) and speaks the sandbox.v1 worker protocol over the stdio FIFOs
//! containerd gives the init process, so execs need no `runsc exec` (the ~60 ms of a containerd
//! exec) and no network.
//!
//! * `<run_dir>/agents/<id>/in` (daemon → agent) and `out` (agent → daemon) are made before
//!   the task; the daemon opens both read-write, so neither side ever sees end-of-file.
//! * A small holder process (`computed fifo-hold in out`, its own process group) keeps a writer
//!   on `in` and a reader on `out` for the sandbox's life: the shim can open both when the task
//!   is created, and when the daemon restarts the shim's copies neither end nor fail. It exits
//!   by itself a minute after the last reader of `in` closes it (it waits that long for the
//!   shim of a Create retried after a crash).
//! * After a restart the daemon re-opens the FIFOs and re-registers the worker; frames cut in
//!   half by the restart are skipped by the framing's resync (`relay::frame`).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tracing::{info, warn};

use super::{blocking, Error, Node, Result, Sandbox};
use crate::api::sandbox::v1 as pb;
use crate::relay::{frame, ToAgent};

/// How long after a sandbox's start its agent's Hello may take before execs stop waiting for
/// it (and go through containerd).
const AGENT_HELLO_WAIT: Duration = Duration::from_secs(3);

/// The size of the pipe from the agent (kernel memory, taken as it fills).
const AGENT_PIPE_BYTES: i32 = 1 << 20;

/// The file beside an agent's FIFOs that keeps the capabilities of its Hello, one per line.
const CAPABILITIES_FILE: &str = "capabilities";

impl Node {
    fn agent_dir(&self, id: &str) -> PathBuf {
        self.config().run_dir.join("agents").join(id)
    }

    /// Whether the agent's FIFOs of a sandbox exist (it was started with the agent).
    pub fn agent_io_exists(&self, id: &str) -> bool {
        self.agent_dir(id).join("out").exists()
    }

    /// Makes the agent's FIFOs and starts their holder; returns (stdin, stdout) paths for the
    /// task.
    pub(super) async fn prepare_agent_io(&self, id: &str) -> Result<(String, String)> {
        self.agent_io(id, true).await
    }

    /// The agent's FIFOs for a task restored from a checkpoint: the same ones (the agent
    /// inside reopens them by path), with their holder started again if it has gone (it leaves
    /// a minute after the daemon let go of them, e.g. over a long restart), so the restored
    /// agent never reads end-of-file.
    pub(super) async fn restore_agent_io(&self, id: &str) -> Result<(String, String)> {
        let fresh = !self.agent_io_exists(id);
        self.agent_io(id, fresh).await
    }

    async fn agent_io(&self, id: &str, fresh: bool) -> Result<(String, String)> {
        let dir = self.agent_dir(id);
        let holder_exe =
            std::env::current_exe().map_err(|e| Error::Internal(format!("current exe: {e}")))?;
        blocking(move || -> std::io::Result<(String, String)> {
            use std::os::unix::process::CommandExt;
            if fresh {
                fresh_fifos(&dir)?;
            }
            let input = dir.join("in");
            if fresh || !holder_alive(&dir) {
                let holder = std::process::Command::new(holder_exe)
                    .arg("fifo-hold")
                    .arg(&input)
                    .arg(dir.join("out"))
                    .stdin(std::process::Stdio::null())
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null())
                    .process_group(0)
                    .spawn()?;
                std::fs::write(dir.join("holder.pid"), holder.id().to_string())?;
            }
            Ok((
                input.display().to_string(),
                dir.join("out").display().to_string(),
            ))
        })
        .await?
        .map_err(|e| Error::Internal(format!("agent FIFOs: {e}")))
    }

    /// Stops the FIFOs' holder of a suspended sandbox: with no shim there is nothing for it to
    /// keep open (the resume starts it again before the restore), so a suspended sandbox
    /// leaves no process on the host.
    pub(super) async fn stop_holder(&self, id: &str) {
        let dir = self.agent_dir(id);
        let _ = blocking(move || kill_holder(&dir)).await;
    }

    /// The agent's stderr FIFO (drained into `agent.log` by the holder).
    pub(super) fn agent_stderr(&self, id: &str) -> String {
        self.agent_dir(id).join("err").display().to_string()
    }

    /// Connects the sandbox's agent FIFOs to the relay. With `reattach` (after a daemon
    /// restart) the worker is registered at once; otherwise on the agent's Hello.
    pub(super) fn spawn_agent_link(&self, sb: Arc<Sandbox>, reattach: bool) {
        let node = self.clone();
        let stop = Arc::new(tokio_util::sync::CancellationToken::new());
        if let Some(old) = self.links().insert(sb.id.clone(), stop.clone()) {
            old.cancel();
        }
        self.inner.tasks.spawn(async move {
            if let Err(e) = node.agent_link(&sb, reattach, &stop).await {
                warn!(sandbox_id = %sb.id, error = %e, "agent link ended");
            }
            node.due_map().remove(&sb.id);
            let mut links = node.links();
            if links.get(&sb.id).is_some_and(|t| Arc::ptr_eq(t, &stop)) {
                links.remove(&sb.id);
            }
        });
    }

    /// Whether the sandbox's agent link is up (its FIFOs are read).
    pub(super) fn has_agent_link(&self, id: &str) -> bool {
        self.links().contains_key(id)
    }

    /// Ends the sandbox's agent link (its worker detached: execs through it end) before its
    /// agent is replaced by a new one (a cold start of a suspended sandbox).
    pub(super) fn stop_agent_link(&self, id: &str) {
        if let Some(t) = self.links().remove(id) {
            t.cancel();
        }
        if let Some(w) = self.relay().agent(id) {
            self.relay().detach(&w, "sandbox restarted");
        }
    }

    fn links(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, super::LinkStop>> {
        self.inner
            .agent_links
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Marks the agent of a sandbox about to be READY as due (before READY is published, so
    /// that the first exec sees it).
    pub(super) fn expect_agent(&self, id: &str) {
        self.due_map()
            .insert(id.to_string(), Instant::now() + AGENT_HELLO_WAIT);
    }

    fn due_map(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, Instant>> {
        self.inner
            .agent_due
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Waits for the agent of a sandbox that has just started, while its Hello is due (a
    /// cold create's first exec comes right after READY, ~20-40 ms before the agent's Hello:
    /// waiting beats a containerd exec by as much again). Returns at once when the agent is
    /// attached, or when none is expected.
    pub(super) async fn await_agent(&self, id: &str) {
        if self.relay().agent(id).is_some() {
            return;
        }
        let due = self.due_map().get(id).copied();
        if let Some(until) = due {
            if self.relay().wait_agent(id, until).await.is_none() {
                warn!(sandbox_id = %id, "the agent's Hello did not come in time: containerd exec");
            }
        }
    }

    async fn agent_link(
        &self,
        sb: &Arc<Sandbox>,
        reattach: bool,
        stop: &tokio_util::sync::CancellationToken,
    ) -> std::io::Result<()> {
        use tokio::net::unix::pipe::OpenOptions;
        let dir = self.agent_dir(&sb.id);
        let mut from_agent = OpenOptions::new()
            .read_write(true)
            .open_receiver(dir.join("out"))?;
        let mut to_agent = OpenOptions::new()
            .read_write(true)
            .open_sender(dir.join("in"))?;
        // Room for a few whole output chunks in the pipe from the agent (64 KiB by default:
        // one 64 KiB chunk and its header would take two wakeups of each side).
        {
            use nix::fcntl::{fcntl, FcntlArg};
            use std::os::fd::AsRawFd;
            let _ = fcntl(
                from_agent.as_raw_fd(),
                FcntlArg::F_SETPIPE_SZ(AGENT_PIPE_BYTES),
            );
            // And toward it: interactive stdin comes in frames of up to 256 KiB.
            let _ = fcntl(
                to_agent.as_raw_fd(),
                FcntlArg::F_SETPIPE_SZ(AGENT_PIPE_BYTES),
            );
        }
        let relay = self.relay().clone();
        let tasks = self.inner.tasks.clone();
        let hello = |sb: &Sandbox| pb::Hello {
            sandbox_id: sb.id.clone(),
            capacity_max: self.config().agent_capacity,
            // Vouched for by the channel, not by anything the agent says.
            trust: crate::relay::AGENT_TRUST.into(),
            image: sb.image.clone(),
            ..Default::default()
        };
        let mut worker = None;
        // Flow control first: this daemon paces every exec of the link (`crate::flow`).
        let window = relay.settings().exec_window as u64;
        to_agent
            .write_all(&frame::encode_flow(&frame::Flow {
                window,
                ..Default::default()
            }))
            .await?;
        let mut attach = Some(|h: pb::Hello| {
            let (w, mut rx, mut credit) = relay.attach_in_sandbox(h);
            // Frames and credit for the agent: encode and write; a write error ends the link.
            tasks.spawn(async move {
                loop {
                    let bytes = tokio::select! {
                        biased;
                        f = rx.recv() => match f {
                            Some(Ok(f)) => frame::encode(&f),
                            _ => return,
                        },
                        c = credit.recv() => match c {
                            Some(ToAgent::Flow(c)) => frame::encode_flow(&c),
                            Some(ToAgent::Control(c)) => frame::encode_control(&c),
                            None => return,
                        },
                    };
                    if to_agent.write_all(&bytes).await.is_err() {
                        return;
                    }
                }
            });
            w
        });
        // The agent says Hello once, when it starts: what it said is kept beside its FIFOs, so
        // that a daemon restarted meanwhile knows its capabilities again (interactive execs:
        // without them every exec with stdin would go through containerd).
        let said = dir.join(CAPABILITIES_FILE);
        if reattach {
            if let Some(a) = attach.take() {
                let mut h = hello(sb);
                h.capabilities = tokio::fs::read_to_string(&said)
                    .await
                    .unwrap_or_default()
                    .lines()
                    .filter(|l| !l.is_empty())
                    .map(String::from)
                    .collect();
                info!(sandbox_id = %sb.id, capabilities = ?h.capabilities,
                      "agent re-attached after restart");
                worker = Some(a(h));
            }
        }
        let mut states = sb.subscribe();
        let mut reader = frame::Reader::default();
        let mut buf = vec![0u8; 256 << 10];
        loop {
            tokio::select! {
                r = from_agent.read(&mut buf) => {
                    let n = r?;
                    reader.push(&buf[..n]);
                    while let Some(f) = reader.next_frame::<pb::WorkerFrame>() {
                        let f = match f {
                            frame::Frame::Message(m) => m,
                            // Stdin credit of an interactive exec.
                            frame::Frame::Flow(c) => {
                                if let Some(w) = &worker {
                                    relay.on_stdin_credit(w, c);
                                }
                                continue;
                            }
                            frame::Frame::Control(_) => continue,
                        };
                        let is_hello = matches!(f.msg, Some(pb::worker_frame::Msg::Hello(_)));
                        match (&worker, is_hello) {
                            (None, true) => {
                                if let Some(a) = attach.take() {
                                    let mut h = hello(sb);
                                    if let Some(pb::worker_frame::Msg::Hello(agent_hello)) = f.msg {
                                        h.capabilities = agent_hello.capabilities;
                                        h.arch = agent_hello.arch;
                                        h.labels = agent_hello.labels;
                                    }
                                    let lines: String =
                                        h.capabilities.iter().map(|c| format!("{c}\n")).collect();
                                    if let Err(e) = tokio::fs::write(&said, lines).await {
                                        warn!(sandbox_id = %sb.id, error = %e,
                                              "could not keep the agent's capabilities");
                                    }
                                    worker = Some(a(h));
                                    self.due_map().remove(&sb.id);
                                    info!(sandbox_id = %sb.id, "agent attached");
                                }
                            }
                            (Some(w), _) => relay.on_frame(w, f),
                            (None, false) => {}
                        }
                    }
                }
                _ = stop.cancelled() => {
                    if let Some(w) = &worker {
                        relay.detach(w, "sandbox restarted");
                    }
                    return Ok(());
                }
                c = states.changed() => {
                    let gone = c.is_err() || states.borrow().status.has_ended();
                    if gone {
                        if let Some(w) = &worker {
                            relay.detach(w, "sandbox stopped");
                        }
                        return Ok(());
                    }
                }
            }
        }
    }

    /// After teardown: the worker, the holder and the FIFOs go.
    pub(super) async fn agent_gone(&self, id: &str) {
        if let Some(w) = self.relay().agent(id) {
            self.relay().detach(&w, "sandbox destroyed");
        }
        let dir = self.agent_dir(id);
        let _ = blocking(move || {
            kill_holder(&dir);
            let _ = std::fs::remove_dir_all(&dir);
        })
        .await;
    }
}

/// Makes new `in`, `out` and `err` FIFOs in `dir`. Provisioning cut short by a crash left
/// FIFOs (and a holder) behind, and possibly a shim of the cut Tasks.Create that still has them
/// open: it would read frames meant for the new task's agent. New FIFOs (new inodes) leave it
/// nothing. Blocking.
fn fresh_fifos(dir: &std::path::Path) -> std::io::Result<()> {
    kill_holder(dir);
    std::fs::create_dir_all(dir)?;
    for name in ["in", "out", "err"] {
        let path = dir.join(name);
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        nix::unistd::mkfifo(&path, nix::sys::stat::Mode::from_bits_truncate(0o600))?;
    }
    Ok(())
}

/// Whether the FIFO holder recorded in `dir` still runs. Blocking.
fn holder_alive(dir: &std::path::Path) -> bool {
    let Some(pid) = std::fs::read_to_string(dir.join("holder.pid"))
        .ok()
        .and_then(|p| p.trim().parse::<i32>().ok())
    else {
        return false;
    };
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let cmdline = String::from_utf8_lossy(&cmdline);
    cmdline.contains("fifo-hold") && cmdline.contains(&*dir.join("in").to_string_lossy())
}

/// Kills the FIFO holder recorded in `dir`, if that pid is still a holder of these FIFOs (a
/// pid recorded before a restart may have been reused by another process since). Blocking.
fn kill_holder(dir: &std::path::Path) {
    let Some(pid) = std::fs::read_to_string(dir.join("holder.pid"))
        .ok()
        .and_then(|p| p.trim().parse::<i32>().ok())
    else {
        return;
    };
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let cmdline = String::from_utf8_lossy(&cmdline);
    let input = dir.join("in");
    if cmdline.contains("fifo-hold") && cmdline.contains(&*input.to_string_lossy()) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::SIGKILL);
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};

    use super::*;

    fn open_rw(path: &std::path::Path) -> std::fs::File {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(nix::libc::O_NONBLOCK)
            .open(path)
            .unwrap()
    }

    #[test]
    fn a_reader_of_the_old_fifos_gets_nothing_meant_for_the_new_agent() {
        let dir = tempfile::tempdir().unwrap();
        let dir = dir.path().join("agent");
        fresh_fifos(&dir).unwrap();
        let old_inode = std::fs::metadata(dir.join("in")).unwrap().ino();
        let mut stale = open_rw(&dir.join("in"));

        fresh_fifos(&dir).unwrap();
        assert_ne!(std::fs::metadata(dir.join("in")).unwrap().ino(), old_inode);
        for name in ["in", "out", "err"] {
            let kind = std::fs::metadata(dir.join(name)).unwrap().file_type();
            assert!(std::os::unix::fs::FileTypeExt::is_fifo(&kind), "{name}");
        }
        let mut new = open_rw(&dir.join("in"));
        new.write_all(b"frame").unwrap();
        let mut buf = [0u8; 16];
        let stale_read = stale.read(&mut buf);
        assert_eq!(
            stale_read.map_err(|e| e.kind()),
            Err(std::io::ErrorKind::WouldBlock)
        );
        assert_eq!(new.read(&mut buf).unwrap(), 5);
    }

    #[test]
    fn only_the_holder_of_these_fifos_is_killed() {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("in");
        // `; exit 0`: the shell stays (a last simple command would be exec'd, and the
        // cmdline with it).
        let spawn = |args: &[&str]| {
            let child = std::process::Command::new("sh").args(args).spawn().unwrap();
            // Until it has exec'd, the child's cmdline is this test binary's.
            let cmdline = format!("/proc/{}/cmdline", child.id());
            while !String::from_utf8_lossy(&std::fs::read(&cmdline).unwrap()).contains("fifo-hold")
            {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            child
        };
        // A process that reused the recorded pid: left alone.
        let mut other = spawn(&["-c", "sleep 30; exit 0", "fifo-hold", "/elsewhere/in"]);
        std::fs::write(dir.path().join("holder.pid"), other.id().to_string()).unwrap();
        kill_holder(dir.path());
        assert!(
            other.try_wait().unwrap().is_none(),
            "another process was killed"
        );
        other.kill().unwrap();
        other.wait().unwrap();
        // The holder of this directory's FIFOs: killed.
        let mut holder = spawn(&[
            "-c",
            "sleep 30; exit 0",
            "fifo-hold",
            &input.to_string_lossy(),
        ]);
        std::fs::write(dir.path().join("holder.pid"), holder.id().to_string()).unwrap();
        kill_holder(dir.path());
        let status = holder.wait().unwrap();
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(9)
        );
    }
}
