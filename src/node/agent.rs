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
use std::time::{Duration, Instant, SystemTime};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tracing::{debug, info, warn};

use super::exec::{Completed, ExecEvent, ExecRequest};
use super::{blocking, Error, Node, Sandbox, Status};
use crate::api::sandbox::v1 as pb;
use crate::relay::frame;

type Result<T> = std::result::Result<T, Error>;

/// The command the agent runs for an ExecCommand: the quoted form it runs without a shell
/// (`sandbox_agent::command`). None when an env name cannot be exported by a shell.
pub fn shell_command(req: &ExecRequest, cwd: &str) -> Option<String> {
    let mut env: Vec<(String, String)> = req
        .env
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    env.sort();
    let mut argv = Vec::with_capacity(1 + req.args.len());
    argv.push(req.command.clone());
    argv.extend(req.args.iter().cloned());
    sandbox_agent::command::render(&env, cwd, &argv)
}

impl Node {
    /// Whether sandboxes run the agent as init.
    pub fn agent_enabled(&self) -> bool {
        self.config().agent
            && self
                .inner
                .helpers_dir
                .as_ref()
                .is_some_and(|d| d.join("sandbox-agent").is_file())
    }

    /// Where the static agent binary that every sandbox mounts lives on the host.
    pub fn agent_path(&self) -> PathBuf {
        self.inner
            .helpers_dir
            .as_ref()
            .map(|d| d.join("sandbox-agent"))
            .unwrap_or_default()
    }

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
        let dir = self.agent_dir(id);
        let holder_exe =
            std::env::current_exe().map_err(|e| Error::Internal(format!("current exe: {e}")))?;
        blocking(move || -> std::io::Result<(String, String)> {
            use std::os::unix::process::CommandExt;
            std::fs::create_dir_all(&dir)?;
            for name in ["in", "out", "err"] {
                let p = dir.join(name);
                if !p.exists() {
                    nix::unistd::mkfifo(&p, nix::sys::stat::Mode::from_bits_truncate(0o600))
                        .map_err(std::io::Error::from)?;
                }
            }
            let input = dir.join("in");
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
            Ok((
                input.display().to_string(),
                dir.join("out").display().to_string(),
            ))
        })
        .await?
        .map_err(|e| Error::Internal(format!("agent FIFOs: {e}")))
    }

    /// The agent's stderr FIFO (drained into `agent.log` by the holder).
    pub(super) fn agent_stderr(&self, id: &str) -> String {
        self.agent_dir(id).join("err").display().to_string()
    }

    /// Connects the sandbox's agent FIFOs to the relay. With `reattach` (after a daemon
    /// restart) the worker is registered at once; otherwise on the agent's Hello.
    pub fn spawn_agent_link(&self, sb: Arc<Sandbox>, reattach: bool) {
        let node = self.clone();
        tokio::spawn(async move {
            if let Err(e) = node.agent_link(&sb, reattach).await {
                warn!(sandbox_id = %sb.id, error = %e, "agent link ended");
            }
        });
    }

    async fn agent_link(&self, sb: &Arc<Sandbox>, reattach: bool) -> std::io::Result<()> {
        use tokio::net::unix::pipe::OpenOptions;
        let dir = self.agent_dir(&sb.id);
        let mut from_agent = OpenOptions::new()
            .read_write(true)
            .open_receiver(dir.join("out"))?;
        let mut to_agent = OpenOptions::new()
            .read_write(true)
            .open_sender(dir.join("in"))?;
        let relay = self.relay().clone();
        let hello = |sb: &Sandbox| pb::Hello {
            sandbox_id: sb.id.clone(),
            capacity_max: self.config().agent_capacity,
            // Vouched for by the channel, not by anything the agent says.
            trust: crate::relay::AGENT_TRUST.into(),
            image: sb.image.clone(),
            ..Default::default()
        };
        let mut worker = None;
        let mut attach = Some(|h: pb::Hello| {
            let (w, mut rx) = relay.attach_in_sandbox(h);
            // Frames for the agent: encode and write; a write error ends the link.
            tokio::spawn(async move {
                while let Some(Ok(f)) = rx.recv().await {
                    if to_agent.write_all(&frame::encode(&f)).await.is_err() {
                        return;
                    }
                }
            });
            w
        });
        if reattach {
            if let Some(a) = attach.take() {
                info!(sandbox_id = %sb.id, "agent re-attached after restart");
                worker = Some(a(hello(sb)));
            }
        }
        let mut states = sb.state.subscribe();
        let mut reader = frame::Reader::default();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            tokio::select! {
                r = from_agent.read(&mut buf) => {
                    let n = r?;
                    reader.push(&buf[..n]);
                    while let Some(f) = reader.next_message::<pb::WorkerFrame>() {
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
                                    worker = Some(a(h));
                                    info!(sandbox_id = %sb.id, "agent attached");
                                }
                            }
                            (Some(w), _) => relay.on_frame(w, f),
                            (None, false) => {}
                        }
                    }
                }
                c = states.changed() => {
                    let gone = c.is_err()
                        || matches!(states.borrow().status, Status::Destroyed | Status::Failed);
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
            if let Ok(pid) = std::fs::read_to_string(dir.join("holder.pid")) {
                if let Ok(pid) = pid.trim().parse::<i32>() {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid),
                        nix::sys::signal::SIGKILL,
                    );
                }
            }
            let _ = std::fs::remove_dir_all(&dir);
        })
        .await;
    }

    /// Runs an exec through the sandbox's agent, if it is attached and the request can be
    /// expressed as a shell command. Same semantics as the containerd path: streamed output,
    /// cancellation (SIGTERM, SIGKILL after the grace), timeout and memory kills (SIGKILL),
    /// and the same metering.
    pub(super) async fn exec_via_agent(
        &self,
        sb: &Arc<Sandbox>,
        req: &ExecRequest,
        tx: &tokio::sync::mpsc::Sender<ExecEvent>,
    ) -> Option<Result<Completed>> {
        // Only the sandbox's own agent (bound to its FIFOs): never an external worker.
        self.relay().agent(&sb.id)?;
        let cwd = if req.working_dir.is_empty() {
            sb.workspace.mount_path.clone()
        } else {
            req.working_dir.clone()
        };
        let command = shell_command(req, &cwd)?;
        Some(self.agent_exec(sb, req, command, tx).await)
    }

    async fn agent_exec(
        &self,
        sb: &Arc<Sandbox>,
        req: &ExecRequest,
        command: String,
        tx: &tokio::sync::mpsc::Sender<ExecEvent>,
    ) -> Result<Completed> {
        let cfg = self.config();
        let cap = Duration::from_secs(cfg.exec_timeout_cap_secs);
        let timeout = req.timeout.filter(|t| !t.is_zero()).unwrap_or(cap).min(cap);
        let req_id: u64 = rand_id();
        let meter = sb.meter.clone();
        let meter_id = blocking(move || meter.begin_exec()).await?;
        let started = Instant::now();
        let mut events = match self
            .relay()
            .exec_on_agent(pb::ExecRequest {
                sandbox_id: sb.id.clone(),
                exec: Some(pb::Exec {
                    req_id,
                    command,
                    stdin: vec![],
                    // The agent's own timeout is a backstop; the daemon kills at `timeout`.
                    timeout_s: (timeout.as_secs() + 30) as u32,
                    streaming: true,
                }),
            })
            .await
        {
            Ok(e) => e,
            Err(s) => {
                let m = sb.meter.clone();
                let _ = blocking(move || m.end_exec(meter_id)).await;
                return Err(Error::Internal(format!("agent exec: {}", s.message())));
            }
        };
        debug!(sandbox_id = %sb.id, req_id, "exec via agent");
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline);
        // The first memory sample after one period: a short exec pays for none.
        let period = Duration::from_millis(cfg.sample_interval_ms.max(1));
        let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let limit = sb.limits.memory_bytes;
        let (mut cancelled, mut timed_out, mut oom) = (false, false, false);
        let mut kill_sent = false;
        let exit = loop {
            tokio::select! {
                ev = events.recv() => {
                    match ev {
                        Some(Ok(pb::ExecEvent { event: Some(e) })) => match e {
                            pb::exec_event::Event::Chunk(c) => {
                                let at = SystemTime::now();
                                let out = if c.stream == pb::Stream::Stderr as i32 {
                                    ExecEvent::Stderr(c.data, at)
                                } else {
                                    ExecEvent::Stdout(c.data, at)
                                };
                                // A client that went away is noticed below.
                                let _ = tx.send(out).await;
                            }
                            pb::exec_event::Event::End(e) => break Some(e.exit_code),
                            pb::exec_event::Event::Error(e) => {
                                warn!(sandbox_id = %sb.id, error = %e.message, "agent exec failed");
                                break None;
                            }
                        },
                        Some(Ok(pb::ExecEvent { event: None })) => {}
                        None | Some(Err(_)) => break None,
                    }
                }
                _ = tx.closed(), if !cancelled => {
                    info!(sandbox_id = %sb.id, req_id, "exec cancelled by client: SIGTERM (agent)");
                    cancelled = true;
                    self.relay().abort_on_agent(&sb.id, req_id).await;
                }
                _ = &mut deadline, if !kill_sent => {
                    info!(sandbox_id = %sb.id, req_id, "exec timed out: SIGKILL (agent)");
                    timed_out = true;
                    kill_sent = true;
                    self.relay().abort_on_agent(&sb.id, req_id).await;
                    self.relay().abort_on_agent(&sb.id, req_id).await;
                }
                _ = ticker.tick(), if !kill_sent => {
                    let m = sb.meter.clone();
                    if let Ok(Some(ws)) = blocking(move || m.tick()).await {
                        if ws > limit {
                            warn!(sandbox_id = %sb.id, req_id, limit, "exec over memory_bytes: SIGKILL (agent)");
                            oom = true;
                            kill_sent = true;
                            self.relay().abort_on_agent(&sb.id, req_id).await;
                            self.relay().abort_on_agent(&sb.id, req_id).await;
                        }
                    }
                }
            }
        };
        let wall_time = started.elapsed();
        if oom {
            // As on the containerd path: gVisor returns the killed processes' memory to the
            // host shortly after; wait for that so the next exec does not start over the
            // limit (and get killed at its first sample).
            let settle = Instant::now();
            while settle.elapsed() < Duration::from_secs(5) {
                let cg = self.cgroup(&sb.id);
                match blocking(move || cg.working_set()).await {
                    Ok(Ok(ws)) if ws > limit => tokio::time::sleep(Duration::from_millis(50)).await,
                    _ => break,
                }
            }
        }
        let m = sb.meter.clone();
        let usage = blocking(move || m.end_exec(meter_id)).await?;
        let exit_code = if cancelled {
            -1
        } else if timed_out || oom {
            137
        } else {
            match exit {
                Some(c) if c < 0 => 128 - c,
                Some(c) => c,
                None => return Err(Error::Internal("the agent lost the exec".into())),
            }
        };
        info!(sandbox_id = %sb.id, req_id, exit_code, cancelled, timed_out, oom_killed = oom,
              wall_ms = wall_time.as_millis() as u64, cpu_ms = usage.cpu_ms, "exec completed (agent)");
        Ok(Completed {
            exit_code,
            wall_time,
            cancelled,
            timed_out,
            oom_killed: oom,
            usage,
        })
    }
}

fn rand_id() -> u64 {
    let u = uuid::Uuid::new_v4();
    u64::from_le_bytes(u.as_bytes()[..8].try_into().unwrap_or([0; 8]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_are_quoted() {
        let req = ExecRequest {
            command: "python3".into(),
            args: vec![
                "-c".into(),
                "print('it''s')".into(),
                "$HOME; rm -rf /".into(),
            ],
            env: [("A_B".to_string(), "x'y".to_string())]
                .into_iter()
                .collect(),
            working_dir: String::new(),
            timeout: None,
        };
        let s = shell_command(&req, "/work space").unwrap();
        assert!(s.contains("export A_B='x'\\''y';"));
        assert!(s.contains("cd '/work space' && exec 'python3' '-c'"));
        assert!(s.ends_with("'$HOME; rm -rf /'"));
        // The agent runs it without a shell.
        let d = sandbox_agent::command::parse(&s).unwrap();
        assert_eq!(d.argv[3], "$HOME; rm -rf /");
        assert_eq!(d.env, vec![("A_B".to_string(), "x'y".to_string())]);
        let bad = ExecRequest {
            env: [("A-B".to_string(), "1".to_string())].into_iter().collect(),
            ..req
        };
        assert!(shell_command(&bad, "/").is_none());
    }
}
