//! The agent backend: the exec runs on the sandbox's own in-sandbox agent (its init), over the
//! relay's in-sandbox registry, with no `runsc exec`. Signals are the sandbox.v1 Abort: the
//! first is SIGTERM to the process group (the agent escalates to SIGKILL after its grace), a
//! second is SIGKILL at once.

use nix::sys::signal::Signal;
use tokio::task::JoinHandle;
use tracing::debug;

use super::lifecycle::{lost, Backend, Exit, Output};
use super::{ExecEvent, ExecInput, ExecRequest, InputRx, TtySize};
use crate::api::sandbox::v1 as pb;
use crate::node::{Node, Result, Sandbox};
use crate::relay::{Events, Interactive, Relay, Stdin};

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

/// One exec on the sandbox's agent.
pub struct AgentExec {
    relay: Relay,
    sandbox_id: String,
    req_id: u64,
    command: String,
    /// The agent's own timeout, a backstop behind the lifecycle's.
    backstop_secs: u32,
    aborts: u32,
    pump: Option<JoinHandle<Result<Exit>>>,
    /// An interactive exec's terminal and streamed stdin.
    tty: Option<TtySize>,
    input: Option<InputRx>,
    feed: Option<JoinHandle<()>>,
}

/// A random request id for the agent protocol.
pub(crate) fn rand_id() -> u64 {
    let u = uuid::Uuid::new_v4();
    u64::from_le_bytes(u.as_bytes()[..8].try_into().unwrap_or([0; 8]))
}

impl AgentExec {
    /// The backend for `req` in `sb`, when its agent (bound to the sandbox's FIFOs, never an
    /// external worker) is attached and the request can be expressed as its command; an
    /// interactive one (a tty, or `streamed_stdin`) also needs an agent that takes them.
    pub fn new(node: &Node, sb: &Sandbox, req: &ExecRequest, streamed_stdin: bool) -> Option<Self> {
        let agent = node.relay().agent(&sb.id)?;
        if (req.tty.is_some() || streamed_stdin) && !agent.interactive() {
            return None;
        }
        let command = shell_command(req, &req.cwd(sb))?;
        let cap = node.config().exec_timeout_cap_secs;
        let uncapped = req.workload.is_some() || req.uncapped;
        let timeout = req
            .timeout
            .map(|t| t.as_secs())
            .filter(|t| *t > 0)
            // No timeout of its own: the agent's backstop is the lifecycle's.
            .unwrap_or(if req.uncapped {
                super::UNCAPPED_TIMEOUT.as_secs()
            } else {
                cap
            });
        // A workload lives as long as its sandbox may: no exec cap on the agent's backstop.
        let cap = if uncapped { u64::MAX } else { cap };
        Some(Self {
            relay: node.relay().clone(),
            sandbox_id: sb.id.clone(),
            req_id: req.workload.unwrap_or_else(rand_id),
            command,
            backstop_secs: u32::try_from(timeout.min(cap).saturating_add(30)).unwrap_or(u32::MAX),
            aborts: 0,
            pump: None,
            tty: req.tty,
            input: None,
            feed: None,
        })
    }

    /// Streams the process's stdin (and terminal resizes) from `input`.
    pub fn with_input(mut self, input: Option<InputRx>) -> Self {
        self.input = input;
        self
    }

    async fn abort(&mut self) {
        self.aborts += 1;
        self.relay
            .abort_on_agent(&self.sandbox_id, self.req_id)
            .await;
    }
}

/// Hands an interactive exec's input to the agent as its credit allows. The end of `input`
/// without a close is the end of stdin too.
async fn feed(mut input: InputRx, stdin: Stdin) {
    let mut open = true;
    while let Some(i) = input.recv().await {
        let r = match i {
            ExecInput::Stdin(data) if open => stdin.write(&data).await,
            // After the close stdin bytes have nowhere to go; a terminal still resizes.
            ExecInput::Stdin(_) | ExecInput::Close if !open => Ok(()),
            ExecInput::Stdin(_) => Ok(()),
            ExecInput::Close => {
                open = false;
                stdin.close()
            }
            ExecInput::Resize(size) => stdin.resize(size.rows, size.cols),
        };
        if r.is_err() {
            return;
        }
    }
    if open {
        let _ = stdin.close();
    }
}

/// Forwards the agent's output to the client until the exec's end. The client going away is
/// not an end: the relay's events are still drained (the lifecycle notices the hang-up).
async fn pump(sandbox_id: String, mut events: Events, out: Output) -> Result<Exit> {
    use std::time::SystemTime;
    while let Some((pb::ExecEvent { event }, hold)) = events.recv().await {
        match event {
            Some(pb::exec_event::Event::Chunk(c)) => {
                let at = SystemTime::now();
                // The hold goes with the chunk: the agent gets its credit back once the
                // chunk has left for the client.
                let ev = if c.stream == pb::Stream::Stderr as i32 {
                    ExecEvent::Stderr(c.data, at, hold)
                } else {
                    ExecEvent::Stdout(c.data, at, hold)
                };
                let _ = out.send(ev).await;
            }
            Some(pb::exec_event::Event::End(e)) => {
                return Ok(if e.exit_code < 0 {
                    Exit::Signal(-e.exit_code)
                } else {
                    Exit::Code(e.exit_code)
                })
            }
            Some(pb::exec_event::Event::Error(e)) => {
                return Err(lost(&sandbox_id, format!("the agent: {}", e.message)))
            }
            None => {}
        }
    }
    Err(lost(&sandbox_id, "the agent went away"))
}

impl Backend for AgentExec {
    fn name(&self) -> &'static str {
        "agent"
    }

    async fn start(&mut self, out: Output) -> Result<()> {
        let req = pb::ExecRequest {
            sandbox_id: self.sandbox_id.clone(),
            exec: Some(pb::Exec {
                req_id: self.req_id,
                command: std::mem::take(&mut self.command),
                stdin: vec![],
                timeout_s: self.backstop_secs,
                streaming: true,
            }),
        };
        let events = if self.tty.is_some() || self.input.is_some() {
            let size = self.tty.unwrap_or_default();
            let how = Interactive {
                tty: self.tty.is_some(),
                rows: size.rows,
                cols: size.cols,
                stdin: self.input.is_some(),
            };
            let (events, stdin) = self.relay.exec_interactive(req, how).await?;
            if let Some(input) = self.input.take() {
                self.feed = Some(tokio::spawn(feed(input, stdin)));
            }
            events
        } else {
            self.relay.exec_on_agent(req).await?
        };
        debug!(req_id = self.req_id, "exec via agent");
        self.pump = Some(tokio::spawn(pump(self.sandbox_id.clone(), events, out)));
        Ok(())
    }

    async fn signal(&mut self, signal: Signal) -> Result<()> {
        // SIGKILL needs the second Abort: send as many as it takes.
        let wanted = if signal == Signal::SIGKILL { 2 } else { 1 };
        while self.aborts < wanted {
            self.abort().await;
        }
        Ok(())
    }

    async fn wait(&mut self) -> Result<Exit> {
        let Some(pump) = self.pump.as_mut() else {
            return Err(lost(&self.sandbox_id, "the exec was never started"));
        };
        let r = pump.await;
        self.pump = None;
        r.unwrap_or_else(|e| Err(lost(&self.sandbox_id, format!("output pump: {e}"))))
    }

    async fn cleanup(&mut self) {
        // The pump ends with the exec's End; one that is left (the exec was lost) goes.
        if let Some(p) = self.pump.take() {
            p.abort();
        }
        if let Some(f) = self.feed.take() {
            f.abort();
        }
    }
}

impl Drop for AgentExec {
    fn drop(&mut self) {
        // Ended early (an error before the end): the pump goes too, which makes the relay
        // abort the exec on the agent.
        if let Some(p) = self.pump.take() {
            p.abort();
        }
        if let Some(f) = self.feed.take() {
            f.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

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
                .collect::<HashMap<_, _>>(),
            working_dir: String::new(),
            timeout: None,
            workload: None,
            tty: None,
            uncapped: false,
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
