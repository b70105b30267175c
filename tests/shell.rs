//! computectl's interactive exec (platform.v1 ExecInSandbox) against a real node daemon:
//! `shell` under tmux (a Python REPL in a terminal: its output, Ctrl-C reaching it, the
//! terminal's size and a resize, its exit code, the local terminal restored afterwards), and
//! `exec -i` without a terminal (megabytes of stdin through `sha256sum` and `cat`, EOF, exit
//! codes).

#[macro_use]
mod common;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::*;
use sha2::Digest;

fn tmux(args: &[&str]) -> String {
    let o = Command::new("tmux").args(args).output().unwrap();
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The pane's screen and its history.
fn pane(session: &str) -> String {
    tmux(&["capture-pane", "-p", "-J", "-S", "-", "-t", session])
}

/// The pane's (columns, lines).
fn pane_size(session: &str) -> (u32, u32) {
    let s = tmux(&[
        "display-message",
        "-p",
        "-t",
        session,
        "#{pane_width} #{pane_height}",
    ]);
    let mut it = s.split_whitespace().map(|n| n.parse().unwrap());
    (it.next().unwrap(), it.next().unwrap())
}

/// Waits until a line of the pane satisfies `want`; returns that line.
fn wait_line(session: &str, what: &str, want: impl Fn(&str) -> bool) -> String {
    let t0 = Instant::now();
    loop {
        let p = pane(session);
        if let Some(l) = p.lines().map(str::trim).find(|l| want(l)) {
            return l.to_string();
        }
        if t0.elapsed() > Duration::from_secs(30) {
            tmux(&["kill-session", "-t", session]);
            panic!("never saw {what} in the pane:\n{p}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Types `line` and Enter.
fn type_line(session: &str, line: &str) {
    tmux(&["send-keys", "-t", session, "-l", line]);
    tmux(&["send-keys", "-t", session, "Enter"]);
}

/// The file `path` once it holds a whole line (written by the pane's shell at the end).
fn wait_file(path: &Path, session: &str) -> String {
    let t0 = Instant::now();
    loop {
        if let Ok(s) = std::fs::read_to_string(path) {
            if s.ends_with('\n') {
                return s;
            }
        }
        if t0.elapsed() > Duration::from_secs(30) {
            let p = pane(session);
            tmux(&["kill-session", "-t", session]);
            panic!("{} never written; pane:\n{p}", path.display());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn shell_in_a_terminal() {
    need!();
    if which("tmux").is_none() {
        skip("tmux missing (scripts/install-deps installs it)");
        return;
    }
    let d = start("shell-tty", "");
    let id = exec_only_sandbox(&d.local_channel().await, "shell").await;
    let dir = tempfile::tempdir().unwrap();
    let status = dir.path().join("status");
    let stty = dir.path().join("stty");
    let session = format!("computectl-shell-{}", std::process::id());
    // The pane's shell records computectl's exit status, then the terminal's settings.
    let cmd = format!(
        "{} --socket {} shell {id} --shell python3; echo EXIT=$? > {}; stty -a > {}.tmp; mv {}.tmp {}; sleep 30",
        env!("CARGO_BIN_EXE_computectl"),
        d.socket.display(),
        status.display(),
        stty.display(),
        stty.display(),
        stty.display(),
    );
    tmux(&[
        "new-session",
        "-d",
        "-s",
        &session,
        "-x",
        "120",
        "-y",
        "40",
        &cmd,
    ]);
    wait_line(&session, "the REPL's prompt", |l| l.starts_with(">>>"));

    // State between lines, and the command's output in the pane.
    type_line(&session, "x = 41");
    type_line(&session, "print(x + 1)");
    wait_line(&session, "42", |l| l == "42");

    // Ctrl-C reaches the command (raw mode: byte 0x03 to its terminal), not computectl.
    type_line(&session, "while True: pass");
    tmux(&["send-keys", "-t", &session, "Enter"]);
    std::thread::sleep(Duration::from_millis(500));
    tmux(&["send-keys", "-t", &session, "C-c"]);
    wait_line(&session, "KeyboardInterrupt", |l| {
        l.starts_with("KeyboardInterrupt")
    });
    type_line(&session, "print('still', 'here')");
    wait_line(&session, "the REPL after Ctrl-C", |l| l == "still here");

    // The command's terminal has the pane's size, and follows a resize.
    let (cols, lines) = pane_size(&session);
    type_line(
        &session,
        "import os; print('SIZE0', end=' ', flush=True); os.system('stty size')",
    );
    let got = wait_line(&session, "the first size", |l| l.starts_with("SIZE0 "));
    // `stty size` in the sandbox's terminal: rows, then columns.
    assert_eq!(got, format!("SIZE0 {lines} {cols}"));
    tmux(&["resize-window", "-t", &session, "-x", "100", "-y", "30"]);
    let (cols2, lines2) = pane_size(&session);
    assert_ne!((cols, lines), (cols2, lines2), "tmux did not resize");
    let want = format!("{lines2} {cols2}");
    let mut last = String::new();
    for i in 1..=20 {
        // (The resize message and the typed line race: ask again until the new size shows.)
        std::thread::sleep(Duration::from_millis(250));
        let tag = format!("SIZE{i}");
        type_line(
            &session,
            &format!("print('{tag}', end=' ', flush=True); os.system('stty size')"),
        );
        last = wait_line(&session, &tag, |l| l.starts_with(&format!("{tag} ")));
        if last == format!("{tag} {want}") {
            break;
        }
    }
    assert!(last.ends_with(&want), "never resized to {want}: {last}");

    // The command's exit code is computectl's, and the terminal is itself again.
    type_line(&session, "raise SystemExit(3)");
    let st = wait_file(&status, &session);
    let settings = wait_file(&stty, &session);
    tmux(&["kill-session", "-t", &session]);
    assert_eq!(st.trim(), "EXIT=3");
    let words: Vec<&str> = settings.split_whitespace().collect();
    for flag in ["icanon", "echo", "isig", "opost"] {
        assert!(
            words.contains(&flag),
            "{flag} not restored after the shell:\n{settings}"
        );
    }
}

/// `computectl --socket SOCKET ARGS` with `input` on its stdin (written while its output is
/// read).
fn ctl_with_input(d: &Daemon, args: &[&str], input: Vec<u8>) -> Output {
    let mut child = d
        .computectl_command()
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    out
}

/// `n` bytes that do not compress (xorshift).
fn noise(n: usize) -> Vec<u8> {
    let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ u64::from(std::process::id());
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn stdin_without_a_terminal() {
    need!();
    let d = start("shell-pipe", "");
    let id = exec_only_sandbox(&d.local_channel().await, "shell").await;
    let data = noise(6 << 20);
    let digest = hex::encode(sha2::Sha256::digest(&data));

    // Megabytes through sha256sum: every byte arrives, and EOF ends its input.
    let o = ctl_with_input(&d, &["exec", "-i", &id, "--", "sha256sum"], data.clone());
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{stderr}");
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        out.split_whitespace().next(),
        Some(digest.as_str()),
        "{out}"
    );

    // And back: cat returns the very bytes, without a terminal's translations.
    let o = ctl_with_input(&d, &["exec", "-i", &id, "--", "cat"], data.clone());
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        o.stdout == data,
        "cat: {} bytes back of {}",
        o.stdout.len(),
        data.len()
    );

    // Empty stdin is EOF at once; stdout and stderr stay apart; the exit code is the command's.
    let o = ctl_with_input(
        &d,
        &[
            "exec",
            "-i",
            &id,
            "-e",
            "X=1",
            "--",
            "sh",
            "-c",
            "wc -c; echo err$X >&2; exit 7",
        ],
        Vec::new(),
    );
    assert_eq!(o.status.code(), Some(7));
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "0");
    assert_eq!(String::from_utf8_lossy(&o.stderr), "err1\n");

    // A command killed by a signal: 128 + its number.
    let o = ctl_with_input(
        &d,
        &["exec", "-i", &id, "--", "sh", "-c", "kill -TERM $$"],
        Vec::new(),
    );
    assert_eq!(
        o.status.code(),
        Some(143),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );

    // --timeout: 124 and a note.
    let o = ctl_with_input(
        &d,
        &["exec", "-i", &id, "--timeout", "1", "--", "sleep", "30"],
        Vec::new(),
    );
    assert_eq!(o.status.code(), Some(124));
    assert!(String::from_utf8_lossy(&o.stderr).contains("timed out"));
}
