//! `computectl exec ID -- CMD ARGS…`: run a command in a sandbox, streaming its output; exits
//! with the command's code; Ctrl-C cancels it (SIGTERM, then SIGKILL after the grace period).
//! With `-i` (stdin) or `-t` (a terminal) it runs over the platform API's interactive exec
//! instead ([`super::shell`]).

use std::io::Write;

use super::{status_error, Answer, Target};
use crate::api::compute::v1 as pb;

/// Options of `exec`.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  computectl exec 3f2a… -- python3 -c 'print(42)'\n  computectl exec 3f2a… --env A=1 --workdir /tmp -- sh -c 'echo $A; pwd'\n  computectl exec -i 3f2a… -- sha256sum < data.bin\n  computectl exec -it 3f2a… -- python3\n\nWith -i or -t the command runs over the platform API's interactive exec\n(platform.v1 ExecInSandbox): -i copies stdin to it (EOF closes its stdin), -t gives it a\nterminal of this one's size (following resizes) and TERM. With -i -t on a terminal, this\nterminal is in raw mode until the command ends: Ctrl-C goes to the command. Exit codes:\nthe command's; 128+N when killed by signal N; 124 on timeout; 137 when over the memory\nlimit; 255 when the sandbox went away; 130 on Ctrl-C (without raw mode)."
)]
pub struct ExecArgs {
    /// Sandbox id.
    pub id: String,
    /// Keep stdin open and send it to the command (platform API's interactive exec).
    #[arg(long = "stdin", short = 'i')]
    pub stdin: bool,
    /// Give the command a terminal (platform API's interactive exec).
    #[arg(long, short = 't')]
    pub tty: bool,
    /// Environment variable for the command (`KEY=VALUE`); repeatable.
    #[arg(long = "env", short = 'e')]
    pub env: Vec<String>,
    /// Working directory (default: the workspace).
    #[arg(long, short = 'w')]
    pub workdir: Option<String>,
    /// Timeout in seconds (capped at 600 by the node).
    #[arg(long)]
    pub timeout: Option<u64>,
    /// The command and its arguments.
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
}

/// `KEY=VALUE` pairs of `--env` as a map.
pub fn parse_env(pairs: &[String]) -> anyhow::Result<std::collections::HashMap<String, String>> {
    let mut env = std::collections::HashMap::new();
    for kv in pairs {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| anyhow::anyhow!("--env {kv:?}: expected KEY=VALUE"))?;
        env.insert(k.to_string(), v.to_string());
    }
    Ok(env)
}

/// Runs `exec`; returns the exit code to exit with.
pub async fn run(t: &Target, a: ExecArgs) -> anyhow::Result<i32> {
    let env = parse_env(&a.env)?;
    if a.stdin || a.tty {
        return super::shell::interactive(
            t,
            super::shell::Interactive {
                id: a.id,
                argv: a.command,
                env,
                working_dir: a.workdir.unwrap_or_default(),
                stdin: a.stdin,
                tty: a.tty,
                timeout_sec: a
                    .timeout
                    .map_or(0, |s| u32::try_from(s).unwrap_or(u32::MAX)),
            },
        )
        .await;
    }
    let req = pb::ExecCommandRequest {
        sandbox_id: a.id.clone(),
        command: a.command[0].clone(),
        args: a.command[1..].to_vec(),
        env,
        working_dir: a.workdir.unwrap_or_default(),
        timeout: a.timeout.map(|s| prost_types::Duration {
            seconds: s as i64,
            nanos: 0,
        }),
    };
    // One listener for the whole exec, registered before the command can start: a Ctrl-C
    // that comes before the first message (or while one is written out) is not lost, also
    // when computectl was started with SIGINT ignored (a background job of a script).
    let mut ctrl_c = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    let mut stream = t
        .compute()
        .await?
        .exec_command(req)
        .await
        .answer(&format!("exec in {}", a.id))?;
    let mut out = std::io::stdout();
    let mut err = std::io::stderr();
    loop {
        let msg = tokio::select! {
            m = stream.message() => m,
            _ = ctrl_c.recv() => {
                // Dropping the stream cancels the exec on the node.
                drop(stream);
                eprintln!("computectl: cancelled");
                return Ok(130);
            }
        };
        match msg.map_err(|s| status_error("exec stream", s))? {
            None => anyhow::bail!("the stream ended without a completion"),
            Some(ev) => match ev.event {
                Some(pb::exec_event::Event::Stdout(s)) => {
                    out.write_all(&s.data)?;
                    out.flush()?;
                }
                Some(pb::exec_event::Event::Stderr(s)) => {
                    err.write_all(&s.data)?;
                    err.flush()?;
                }
                Some(pb::exec_event::Event::Completed(c)) => {
                    if c.timed_out {
                        eprintln!("computectl: timed out");
                    }
                    if c.oom_killed {
                        eprintln!("computectl: killed: over the sandbox's memory limit");
                    }
                    return Ok(c.exit_code);
                }
                None => {}
            },
        }
    }
}
