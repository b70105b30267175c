//! The containerd exec backend (`agent = false`) with a streamed stdin and a terminal, against
//! the real containerd + runsc. The RPC that carries stdin and a terminal to a daemon is not
//! here: these drive a node in the test's own process (`Node::exec_with_input`), over the
//! configuration, image and namespace of a harness daemon that is stopped first (and that
//! cleans the namespace up when dropped).

#[macro_use]
mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use computed::config::Config;
use computed::node::exec::{Completed, ExecEvent, ExecInput, ExecRequest, TtySize};
use computed::node::{CreateRequest, Node};
use computed::runtime::{self, Containerd, ImagePolicy, Runtime};
use tokio::sync::mpsc;

/// A node in this process with one READY sandbox (its id), and the stopped daemon whose
/// namespace it uses.
async fn local_node(name: &str) -> (common::Daemon, Node, String) {
    let _ = tracing_subscriber::fmt()
        .with_env_filter("info,computed=debug")
        .with_test_writer()
        .try_init();
    let mut d = common::start(name, "agent = false\ncancel_grace_secs = 2");
    d.kill9();
    let text = std::fs::read_to_string(&d.config).unwrap();
    // The file alone, as the daemon read it (the harness clears the environment's overrides).
    let cfg: Config = toml::from_str(&text).unwrap();
    cfg.validate().unwrap();
    let ctr = Containerd::connect(&cfg.containerd_socket, &cfg.namespace)
        .await
        .unwrap();
    let choice = runtime::choose_runtime(&cfg).unwrap();
    let rt = Runtime::new(ctr, choice, ImagePolicy::default());
    let node = Node::new(cfg, Arc::new(rt));
    node.recover().await.unwrap();
    assert!(
        node.has_helpers(),
        "the launcher (init helper) is what these test"
    );
    let sb = node
        .create(CreateRequest {
            tenant_id: "t".into(),
            session_id: name.into(),
            ..Default::default()
        })
        .await
        .unwrap();
    node.wait_ready(&sb).await.unwrap();
    (d, node, sb.id.clone())
}

fn req(command: &str, args: &[&str], tty: Option<TtySize>) -> ExecRequest {
    ExecRequest {
        command: command.into(),
        args: args.iter().map(|a| a.to_string()).collect(),
        env: HashMap::new(),
        working_dir: String::new(),
        timeout: Some(Duration::from_secs(120)),
        workload: None,
        tty,
        uncapped: false,
    }
}

fn sh(script: &str, tty: Option<TtySize>) -> ExecRequest {
    req("sh", &["-c", script], tty)
}

/// What an exec wrote and how it ended, as its events told.
#[derive(Debug, Default)]
struct Run {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    end: Option<Completed>,
}

impl Run {
    /// Takes one event; false at the end.
    fn take(&mut self, ev: ExecEvent) -> bool {
        match ev {
            ExecEvent::Stdout(d, _, _) => self.stdout.extend(d),
            ExecEvent::Stderr(d, _, _) => self.stderr.extend(d),
            ExecEvent::Completed(c, _) => {
                self.end = Some(c);
                return false;
            }
            ExecEvent::Failed(e) => panic!("exec failed: {e}"),
        }
        true
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    /// Reads events until stdout holds `needle`.
    async fn until(&mut self, rx: &mut mpsc::Receiver<ExecEvent>, needle: &str) {
        let wait = async {
            while !self.text().contains(needle) {
                let ev = rx.recv().await.expect("the stream ended");
                assert!(self.take(ev), "ended before {needle:?}: {self:?}");
            }
        };
        if tokio::time::timeout(Duration::from_secs(30), wait)
            .await
            .is_err()
        {
            panic!("no {needle:?} on stdout: {self:?}");
        }
    }

    /// Reads events to the end.
    async fn finish(mut self, rx: &mut mpsc::Receiver<ExecEvent>) -> (Self, Completed) {
        let wait = async {
            while let Some(ev) = rx.recv().await {
                if !self.take(ev) {
                    break;
                }
            }
        };
        if tokio::time::timeout(Duration::from_secs(60), wait)
            .await
            .is_err()
        {
            panic!("the exec did not end: {self:?}");
        }
        let end = self.end.clone().expect("a completed event");
        (self, end)
    }
}

/// An exec fed from the returned sender.
async fn interactive(
    node: &Node,
    id: &str,
    r: ExecRequest,
    depth: usize,
) -> (mpsc::Sender<ExecInput>, mpsc::Receiver<ExecEvent>) {
    let (tx, input) = mpsc::channel(depth);
    let rx = node.exec_with_input(id, r, Some(input)).await.unwrap();
    (tx, rx)
}

/// Runs `script` (no stdin) to its end; its stdout.
async fn run(node: &Node, id: &str, script: &str) -> (String, i32) {
    let mut rx = node.exec(id, sh(script, None)).await.unwrap();
    let (r, end) = Run::default().finish(&mut rx).await;
    (r.text(), end.exit_code)
}

/// Whether a process whose command line matches `pattern` (a grep regex) runs in the sandbox.
/// Write the pattern so that it does not match itself (`slee[p] 1`): the shell that runs the
/// grep has it on its command line.
async fn running(node: &Node, id: &str, pattern: &str) -> bool {
    let bb = "/.compute/busybox";
    let script = format!("{bb} ps -o args | {bb} grep -q -- '{pattern}'");
    run(node, id, &script).await.1 == 0
}

/// Waits for `running(pattern)` to become `want`.
async fn until_running(node: &Node, id: &str, pattern: &str, want: bool) {
    let t0 = Instant::now();
    while running(node, id, pattern).await != want {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "{pattern:?} still {}",
            if want { "not running" } else { "running" }
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn stdin(s: &str) -> ExecInput {
    ExecInput::Stdin(s.as_bytes().to_vec())
}

#[tokio::test(flavor = "multi_thread")]
async fn stdin_streams_into_a_containerd_exec() {
    need!();
    let (_d, node, id) = local_node("ctd-stdin").await;

    // Each chunk reaches the process as it is sent; the close is end-of-file, and output
    // after it still arrives; stdin after the close goes nowhere.
    let (tx, mut rx) = interactive(&node, &id, sh("cat; echo after-eof", None), 4).await;
    let mut r = Run::default();
    tx.send(stdin("hello\n")).await.unwrap();
    r.until(&mut rx, "hello\n").await;
    tx.send(stdin("world\n")).await.unwrap();
    r.until(&mut rx, "world\n").await;
    tx.send(ExecInput::Close).await.unwrap();
    let _ = tx.send(stdin("dropped\n")).await;
    let (r, end) = r.finish(&mut rx).await;
    assert_eq!(r.text(), "hello\nworld\nafter-eof\n");
    assert_eq!(end.exit_code, 0);
    assert!(
        r.stderr.is_empty(),
        "the launcher's line is taken off: {r:?}"
    );

    // The input's end without a close is the end of stdin too.
    let (tx, mut rx) = interactive(&node, &id, req("wc", &["-c"], None), 4).await;
    tx.send(stdin("12345")).await.unwrap();
    drop(tx);
    let (r, end) = Run::default().finish(&mut rx).await;
    assert_eq!((r.text().trim(), end.exit_code), ("5", 0));

    // A close at once, before the shim may have opened its end of the FIFO.
    let (tx, mut rx) = interactive(&node, &id, req("cat", &[], None), 4).await;
    tx.send(ExecInput::Close).await.unwrap();
    let (r, end) = Run::default().finish(&mut rx).await;
    assert_eq!((r.text(), end.exit_code), (String::new(), 0));

    // Flow control end to end: a process that does not read holds its sender up (the input
    // and the pipes between hold a few hundred KiB, not the 8 MiB sent).
    const TOTAL: usize = 8 << 20;
    let (tx, mut rx) = interactive(&node, &id, sh("sleep 4; wc -c", None), 1).await;
    let t0 = Instant::now();
    let sender = tokio::spawn(async move {
        for _ in 0..TOTAL / (64 << 10) {
            tx.send(ExecInput::Stdin(vec![b'x'; 64 << 10]))
                .await
                .unwrap();
        }
        t0.elapsed()
    });
    let (r, end) = Run::default().finish(&mut rx).await;
    let sent_after = sender.await.unwrap();
    assert_eq!(
        (r.text().trim(), end.exit_code),
        (TOTAL.to_string().as_str(), 0)
    );
    assert!(
        sent_after > Duration::from_secs(3),
        "the input was taken in {sent_after:?}, before the process read any"
    );

    // Signals still reach the process: a cancel (the output's receiver gone) ends a shell
    // that waits on its stdin.
    let (tx, rx) = interactive(&node, &id, sh("read x; echo $x", None), 4).await;
    until_running(&node, &id, "rea[d] x", true).await;
    drop(rx);
    until_running(&node, &id, "rea[d] x", false).await;
    drop(tx);
    node.shutdown(Duration::from_secs(10)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_containerd_exec_runs_on_a_terminal() {
    need!();
    let (_d, node, id) = local_node("ctd-tty").await;
    let size = |rows, cols| Some(TtySize { rows, cols });

    // The size asked for (and the defaults for 0), all output on stdout, the launcher's
    // line (which comes on the terminal) taken off.
    for (tty, want) in [(size(30, 100), "30 100\r\n"), (size(0, 0), "24 80\r\n")] {
        let mut rx = node.exec(&id, req("stty", &["size"], tty)).await.unwrap();
        let (r, end) = Run::default().finish(&mut rx).await;
        assert_eq!((r.text().as_str(), end.exit_code), (want, 0), "{r:?}");
        assert!(r.stderr.is_empty());
    }
    let mut rx = node
        .exec(
            &id,
            sh(
                "test -t 0 && test -t 1 && test -t 2 && echo err >&2",
                size(0, 0),
            ),
        )
        .await
        .unwrap();
    let (r, _) = Run::default().finish(&mut rx).await;
    assert_eq!(
        (r.text().as_str(), r.stderr.as_slice()),
        ("err\r\n", &b""[..])
    );

    // A resize reaches the terminal, and its foreground process group gets SIGWINCH. (One
    // may come at the start too: runsc forwards the one the terminal's first sizing raises.)
    let script = "trap 'w=$(stty size)' WINCH; stty size; \
                  while [ \"$w\" != '50 120' ]; do sleep 0.1; done; echo \"$w\"";
    let (tx, mut rx) = interactive(&node, &id, sh(script, size(30, 100)), 4).await;
    let mut r = Run::default();
    r.until(&mut rx, "30 100\r\n").await;
    let resize = ExecInput::Resize(TtySize {
        rows: 50,
        cols: 120,
    });
    tx.send(resize).await.unwrap();
    let (r, end) = r.finish(&mut rx).await;
    assert_eq!(r.text(), "30 100\r\n50 120\r\n");
    assert_eq!(end.exit_code, 0);

    // Typed input is echoed and read by lines; the close is ^D (twice for a partial line),
    // after which output still arrives and resizes still apply.
    let script = "cat; while [ \"$(stty size)\" != '40 90' ]; do sleep 0.1; done; echo resized";
    let (tx, mut rx) = interactive(&node, &id, sh(script, size(0, 0)), 4).await;
    let mut r = Run::default();
    tx.send(stdin("abc\n")).await.unwrap();
    r.until(&mut rx, "abc\r\nabc\r\n").await;
    tx.send(stdin("xyz")).await.unwrap();
    tx.send(ExecInput::Close).await.unwrap();
    tx.send(ExecInput::Resize(TtySize { rows: 40, cols: 90 }))
        .await
        .unwrap();
    let (r, end) = r.finish(&mut rx).await;
    assert_eq!(r.text(), "abc\r\nabc\r\nxyzxyzresized\r\n");
    assert_eq!(end.exit_code, 0);
    drop(tx);

    // ^C typed is SIGINT to the foreground process group.
    let script = "trap 'echo int; exit 3' INT; echo ready; while :; do sleep 0.1; done";
    let (tx, mut rx) = interactive(&node, &id, sh(script, size(0, 0)), 4).await;
    let mut r = Run::default();
    r.until(&mut rx, "ready\r\n").await;
    tx.send(stdin("\x03")).await.unwrap();
    let (r, end) = r.finish(&mut rx).await;
    assert_eq!(
        (r.text().as_str(), end.exit_code),
        ("ready\r\n^Cint\r\n", 3)
    );
    drop(tx);

    node.shutdown(Duration::from_secs(10)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_shell_on_a_terminal_is_cancelled_with_its_foreground_job() {
    need!();
    let (_d, node, id) = local_node("ctd-tty-cancel").await;
    let tty = Some(TtySize::default());

    // An interactive shell (it ignores SIGTERM) running a foreground job in a process group
    // of its own: the cancel's SIGTERM ends the job, the SIGKILL after the grace the shell.
    let (tx, rx) = interactive(&node, &id, req("sh", &[], tty), 4).await;
    tx.send(stdin("sleep 101\n")).await.unwrap();
    until_running(&node, &id, "^slee[p] 101", true).await;
    drop(rx);
    until_running(&node, &id, "^slee[p] 101", false).await;
    let t0 = Instant::now();
    until_running(&node, &id, "^s[h]$", false).await;
    assert!(
        t0.elapsed() < Duration::from_secs(10),
        "the shell outlived the grace"
    );

    // The same at the timeout (SIGKILL to all at once), and the exec reports it.
    let mut r = req("sh", &[], tty);
    r.timeout = Some(Duration::from_secs(4));
    let (tx2, mut rx) = interactive(&node, &id, r, 4).await;
    tx2.send(stdin("sleep 102\n")).await.unwrap();
    until_running(&node, &id, "^slee[p] 102", true).await;
    let (_, end) = Run::default().finish(&mut rx).await;
    assert!(end.timed_out, "{end:?}");
    assert!(!running(&node, &id, "^slee[p] 102").await);
    assert!(!running(&node, &id, "^s[h]$").await);
    drop((tx, tx2));
    node.shutdown(Duration::from_secs(10)).await;
}
