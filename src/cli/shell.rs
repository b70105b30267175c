//! Interactive exec over the platform API's bidirectional `ExecInSandbox` stream: `exec -i`,
//! `exec -t` and `computectl shell ID` (= `exec -i -t ID -- /bin/sh`).
//!
//! The first message is the spec; with `-i` local stdin follows in chunks of up to 64 KiB
//! and `stdin_close` at its end; with `-t` every SIGWINCH sends the terminal's new size. The
//! outbound messages go through a bounded channel, so a slow command holds back the reading
//! of stdin. With `-i -t` on a terminal, the terminal is in raw mode until the exec ends
//! (Ctrl-C reaches the command as byte 0x03), restored on every way out.

use std::collections::HashMap;
use std::io::{Read, Write};

use nix::sys::signal::Signal;
use rustix::termios::{self, OptionalActions, Termios};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::{status_error, Answer, Target};
use crate::api::platform::v1 as pb;
use pb::exec_client_message::Msg as Out;
use pb::exec_server_message::Msg as In;

/// The most bytes of stdin one message carries.
const STDIN_CHUNK: usize = 64 << 10;

/// Outbound messages waiting to be sent, at most.
const OUTBOUND: usize = 16;

/// Options of `shell`.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "An interactive shell in a sandbox: `computectl exec -i -t ID -- SHELL` (see\n`computectl exec --help`); exits with the shell's code.\n\nExamples:\n  computectl shell 3f2a…\n  computectl shell 3f2a… --shell /bin/bash\n  computectl shell 3f2a… --shell python3"
)]
pub struct ShellArgs {
    /// Sandbox id.
    pub id: String,
    /// The program to run (looked up in the sandbox's PATH when not a path).
    #[arg(long, default_value = "/bin/sh")]
    pub shell: String,
}

/// Runs `shell`; returns the exit code to exit with.
pub async fn run(t: &Target, a: ShellArgs) -> anyhow::Result<i32> {
    interactive(
        t,
        Interactive {
            id: a.id,
            argv: vec![a.shell],
            env: HashMap::new(),
            working_dir: String::new(),
            stdin: true,
            tty: true,
            timeout_sec: 0,
        },
    )
    .await
}

/// What an interactive exec runs, and how.
#[derive(Debug, Clone)]
pub struct Interactive {
    /// Sandbox id.
    pub id: String,
    /// The command and its arguments (never shell-joined).
    pub argv: Vec<String>,
    /// Its environment, besides the sandbox's (with `tty`, TERM is added from ours if unset).
    pub env: HashMap<String, String>,
    /// Its working directory (empty: the sandbox's).
    pub working_dir: String,
    /// Copy local stdin to it.
    pub stdin: bool,
    /// Give it a terminal.
    pub tty: bool,
    /// Its deadline in seconds (0: none of its own).
    pub timeout_sec: u32,
}

/// How a session ended.
enum End {
    /// The command's exit.
    Exit(pb::ExecExit),
    /// A signal to computectl (SIGINT, SIGTERM, SIGHUP) cancelled it.
    Cancelled(i32),
}

/// Runs an interactive exec; returns the exit code to exit with.
pub async fn interactive(t: &Target, x: Interactive) -> anyhow::Result<i32> {
    if x.argv.is_empty() {
        anyhow::bail!("no command to run");
    }
    let mut env = x.env;
    if x.tty {
        if let Ok(term) = std::env::var("TERM") {
            env.entry("TERM".to_string()).or_insert(term);
        }
    }
    let spec = pb::ExecSpec {
        sandbox_id: x.id.clone(),
        argv: x.argv,
        env,
        working_dir: x.working_dir,
        tty: x.tty,
        tty_size: x.tty.then(tty_size),
        wait: pb::ExecWait::Output as i32,
        timeout_sec: x.timeout_sec,
    };
    // Raw mode only when this terminal's keys go to the command: with -t alone nothing reads
    // them, and Ctrl-C must still cancel.
    let raw = if x.stdin && x.tty && termios::isatty(std::io::stdin()) {
        Some(RawMode::enter()?)
    } else {
        None
    };
    let res = session(t, spec, x.stdin, x.tty).await;
    // The terminal is itself again before anything more is printed (main prints errors).
    drop(raw);
    match res? {
        End::Cancelled(sig) => {
            eprintln!("computectl: cancelled");
            // 130 for Ctrl-C, as `exec` answers.
            Ok(128 + sig)
        }
        End::Exit(e) => {
            let (code, note) = exit_code(&e);
            if let Some(n) = note {
                eprintln!("computectl: {n}");
            }
            Ok(code)
        }
    }
}

/// The exit code for an exec's end, and a note to print about it.
fn exit_code(e: &pb::ExecExit) -> (i32, Option<&'static str>) {
    match pb::Termination::try_from(e.termination) {
        Ok(pb::Termination::Exited) => (e.code, None),
        Ok(pb::Termination::Signaled) => (128 + e.signal, None),
        Ok(pb::Termination::Timeout) => (124, Some("timed out")),
        Ok(pb::Termination::OomKilled) => (137, Some("killed: over the sandbox's memory limit")),
        Ok(pb::Termination::Lost) => (
            255,
            Some("lost: the sandbox went away (suspended, deleted or crashed)"),
        ),
        Ok(pb::Termination::Unspecified) | Err(_) => (e.code, None),
    }
}

/// The exec itself, from the spec to the command's exit (or a cancelling signal).
async fn session(t: &Target, spec: pb::ExecSpec, stdin: bool, tty: bool) -> anyhow::Result<End> {
    // Registered before the command can start, as in `exec`: no Ctrl-C is lost.
    let mut int = signal(SignalKind::interrupt())?;
    let mut term = signal(SignalKind::terminate())?;
    let mut hup = signal(SignalKind::hangup())?;
    let id = spec.sandbox_id.clone();
    let (tx, rx) = mpsc::channel::<pb::ExecClientMessage>(OUTBOUND);
    tx.send(msg(Out::Spec(spec)))
        .await
        .map_err(|_| anyhow::anyhow!("exec in {id}: the request stream closed"))?;
    // The resize task sends on its own, so that a full channel never stalls the output.
    let resizes = if tty {
        let mut winch = signal(SignalKind::window_change())?;
        let tx = tx.clone();
        Some(tokio::spawn(async move {
            while winch.recv().await.is_some() {
                if tx.send(msg(Out::Resize(tty_size()))).await.is_err() {
                    return;
                }
            }
        }))
    } else {
        None
    };
    let _resizes = AbortOnDrop(resizes);
    let mut stream = t
        .sandboxes()
        .await?
        .exec_in_sandbox(ReceiverStream::new(rx))
        .await
        .answer(&format!("exec in {id}"))?;
    if stdin {
        pump_stdin(tx.clone());
    }
    // `tx` lives until the exit: the request stream stays open (without -i, nothing more
    // is sent on it).
    let mut out = std::io::stdout();
    let mut err = std::io::stderr();
    loop {
        let m = tokio::select! {
            m = stream.message() => m,
            _ = int.recv() => return Ok(End::Cancelled(Signal::SIGINT as i32)),
            _ = term.recv() => return Ok(End::Cancelled(Signal::SIGTERM as i32)),
            _ = hup.recv() => return Ok(End::Cancelled(Signal::SIGHUP as i32)),
        };
        // (Returning drops the stream, which cancels the exec on the node.)
        match m.map_err(|s| status_error("exec stream", s))? {
            None => anyhow::bail!("the stream ended without the command's exit"),
            Some(m) => match m.msg {
                Some(In::Stdout(b)) => {
                    out.write_all(&b)?;
                    out.flush()?;
                }
                Some(In::Stderr(b)) => {
                    err.write_all(&b)?;
                    err.flush()?;
                }
                Some(In::Exit(e)) => return Ok(End::Exit(e)),
                None => {}
            },
        }
    }
}

fn msg(m: Out) -> pb::ExecClientMessage {
    pb::ExecClientMessage { msg: Some(m) }
}

/// Copies local stdin to `tx` on a thread of its own (a blocking read of a terminal does not
/// end when the exec does; the thread ends with the process), then `stdin_close` at EOF.
fn pump_stdin(tx: mpsc::Sender<pb::ExecClientMessage>) {
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin().lock();
        let mut buf = vec![0u8; STDIN_CHUNK];
        loop {
            match stdin.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    if tx
                        .blocking_send(msg(Out::Stdin(buf[..n].to_vec())))
                        .is_err()
                    {
                        return;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    eprintln!("computectl: reading stdin: {e}");
                    break;
                }
            }
        }
        let _ = tx.blocking_send(msg(Out::StdinClose(true)));
    });
}

/// The size of the terminal on stdin or stdout; 24x80 when neither is one.
fn tty_size() -> pb::TtySize {
    let sizes = [
        termios::tcgetwinsize(std::io::stdin()),
        termios::tcgetwinsize(std::io::stdout()),
    ];
    sizes
        .into_iter()
        .flatten()
        .find(|w| w.ws_row > 0 && w.ws_col > 0)
        .map_or(pb::TtySize { rows: 24, cols: 80 }, |w| pb::TtySize {
            rows: w.ws_row.into(),
            cols: w.ws_col.into(),
        })
}

/// The terminal on stdin in raw mode; its settings restored when dropped.
struct RawMode {
    saved: Termios,
}

impl RawMode {
    fn enter() -> anyhow::Result<Self> {
        let saved = termios::tcgetattr(std::io::stdin())
            .map_err(|e| anyhow::anyhow!("reading the terminal's settings: {e}"))?;
        let mut raw = saved.clone();
        raw.make_raw();
        termios::tcsetattr(std::io::stdin(), OptionalActions::Now, &raw)
            .map_err(|e| anyhow::anyhow!("putting the terminal in raw mode: {e}"))?;
        Ok(Self { saved })
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        // (Fails only when the terminal is gone.)
        let _ = termios::tcsetattr(std::io::stdin(), OptionalActions::Now, &self.saved);
    }
}

/// Aborts a task when dropped.
struct AbortOnDrop(Option<tokio::task::JoinHandle<()>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        if let Some(h) = &self.0 {
            h.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn end(t: pb::Termination, code: i32, signal: i32) -> (i32, Option<&'static str>) {
        exit_code(&pb::ExecExit {
            code,
            termination: t as i32,
            signal,
            usage: None,
        })
    }

    #[test]
    fn exit_codes() {
        assert_eq!(end(pb::Termination::Exited, 3, 0), (3, None));
        assert_eq!(end(pb::Termination::Signaled, -1, 9).0, 137);
        assert_eq!(end(pb::Termination::Signaled, -1, 15).0, 143);
        assert_eq!(
            end(pb::Termination::Timeout, -1, 0),
            (124, Some("timed out"))
        );
        assert_eq!(end(pb::Termination::OomKilled, -1, 9).0, 137);
        assert!(end(pb::Termination::OomKilled, -1, 9).1.is_some());
        assert_eq!(end(pb::Termination::Lost, 0, 0).0, 255);
        assert!(end(pb::Termination::Lost, 0, 0).1.is_some());
        assert_eq!(end(pb::Termination::Unspecified, 5, 0), (5, None));
    }

    #[test]
    fn size_without_a_terminal_is_24x80_or_the_terminal() {
        let s = tty_size();
        assert!(s.rows > 0 && s.cols > 0);
    }
}
