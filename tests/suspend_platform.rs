//! platform.v1 SuspendSandbox, ResumeSandbox and KeepSandboxAlive against a real node daemon
//! (real containerd, real runsc), issue 19:
//!
//! * who may call them (OPERATOR for suspend and resume, VIEWER for keep-alive; another
//!   namespace looks missing; no key is UNAUTHENTICATED), and what is refused (exec and
//!   keep-alive of a SUSPENDED sandbox are FAILED_PRECONDITION);
//! * a Python REPL holding 100 MiB and an open file, in an interactive exec that stays open
//!   across the suspend: after the resume it answers with both, and the run log has the
//!   SUSPENDED and RESUMED markers;
//! * idle suspend from the environment's idle_suspend_sec, held off by keep-alives;
//! * Resume revives a FAILED sandbox from its record (a cold start, marked as such).

#[macro_use]
mod common;

use std::time::{Duration, Instant, SystemTime};

use common::*;
use computed::api::platform::v1 as pb;
use computed::platform::access::Role;
use pb::access_service_client::AccessServiceClient;
use pb::environment_service_client::EnvironmentServiceClient;
use pb::exec_client_message::Msg as In;
use pb::exec_server_message::Msg as Out;
use pb::sandbox_service_client::SandboxServiceClient;
use tokio::sync::mpsc;
use tonic::transport::Channel;
use tonic::{Code, Request, Streaming};

fn with<T>(m: T, token: Option<&str>) -> Request<T> {
    let mut r = Request::new(m);
    if let Some(t) = token {
        r.metadata_mut()
            .insert("authorization", format!("Bearer {t}").parse().unwrap());
    }
    r
}

fn svc(ch: &Channel) -> SandboxServiceClient<Channel> {
    SandboxServiceClient::new(ch.clone())
}

/// Namespaces `team-a` and `team-b`; environments in team-a: `py` (idle_suspend_sec 600) and
/// `idle` (idle_suspend_sec 3); keys: (operator of team-a, viewer of team-a, operator of
/// team-b).
async fn setup(root: &Channel) -> (String, String, String) {
    let mut a = AccessServiceClient::new(root.clone());
    for ns in ["team-a", "team-b"] {
        a.create_namespace(pb::CreateNamespaceRequest {
            name: ns.into(),
            ..Default::default()
        })
        .await
        .unwrap();
    }
    let mut e = EnvironmentServiceClient::new(root.clone());
    for (name, idle) in [("py", 600), ("idle", 3)] {
        e.create_environment(pb::CreateEnvironmentRequest {
            environment: Some(pb::Environment {
                namespace: "team-a".into(),
                name: name.into(),
                image: IMAGE.into(),
                idle_suspend_sec: idle,
                ..Default::default()
            }),
        })
        .await
        .unwrap();
    }
    let key = |name: &'static str, ns: &'static str, role: Role| {
        let mut a = a.clone();
        async move {
            a.create_api_key(pb::CreateApiKeyRequest {
                name: name.into(),
                namespace: ns.into(),
                role: role.to_proto(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .secret
        }
    };
    let op = key("op", "team-a", Role::Operator).await;
    let viewer = key("viewer", "team-a", Role::Viewer).await;
    let op_b = key("op-b", "team-b", Role::Operator).await;
    (op, viewer, op_b)
}

async fn get(ch: &Channel, token: &str, id: &str) -> pb::Sandbox {
    svc(ch)
        .get_sandbox(with(
            pb::GetSandboxRequest {
                sandbox_id: id.into(),
            },
            Some(token),
        ))
        .await
        .unwrap()
        .into_inner()
}

async fn wait_state(ch: &Channel, token: &str, id: &str, state: pb::SandboxState, within: u64) {
    let t0 = Instant::now();
    loop {
        let sb = get(ch, token, id).await;
        if sb.state == state as i32 {
            return;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(within),
            "{id} never {state:?}: {sb:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// An exec-only sandbox of `env` in team-a, made by `token`, RUNNING.
async fn sandbox(ch: &Channel, token: &str, env: &str) -> String {
    let id = svc(ch)
        .create_sandbox(with(
            pb::CreateSandboxRequest {
                namespace: "team-a".into(),
                environment: env.into(),
                exec_only: true,
                ..Default::default()
            },
            Some(token),
        ))
        .await
        .unwrap()
        .into_inner()
        .sandbox_id;
    wait_state(ch, token, &id, pb::SandboxState::Running, 90).await;
    id
}

async fn suspend(
    ch: &Channel,
    token: Option<&str>,
    id: &str,
) -> Result<pb::Sandbox, tonic::Status> {
    svc(ch)
        .suspend_sandbox(with(
            pb::SuspendSandboxRequest {
                sandbox_id: id.into(),
            },
            token,
        ))
        .await
        .map(|r| r.into_inner())
}

async fn resume(ch: &Channel, token: Option<&str>, id: &str) -> Result<pb::Sandbox, tonic::Status> {
    svc(ch)
        .resume_sandbox(with(
            pb::ResumeSandboxRequest {
                sandbox_id: id.into(),
            },
            token,
        ))
        .await
        .map(|r| r.into_inner())
}

async fn keep_alive(
    ch: &Channel,
    token: Option<&str>,
    id: &str,
) -> Result<pb::KeepSandboxAliveResponse, tonic::Status> {
    svc(ch)
        .keep_sandbox_alive(with(
            pb::KeepSandboxAliveRequest {
                sandbox_id: id.into(),
            },
            token,
        ))
        .await
        .map(|r| r.into_inner())
}

/// The run log's markers with their data, oldest first.
async fn markers(ch: &Channel, token: &str, id: &str) -> Vec<(pb::LogMarker, String)> {
    let mut rx = svc(ch)
        .tail_sandbox_logs(with(
            pb::TailSandboxLogsRequest {
                sandbox_id: id.into(),
                ..Default::default()
            },
            Some(token),
        ))
        .await
        .unwrap()
        .into_inner();
    let mut out = Vec::new();
    while let Some(e) = rx.message().await.unwrap() {
        if e.marker != pb::LogMarker::Unspecified as i32 {
            out.push((
                pb::LogMarker::try_from(e.marker).unwrap(),
                String::from_utf8_lossy(&e.data).into_owned(),
            ));
        }
    }
    out
}

/// An interactive exec: its stdin and its output so far.
struct Session {
    tx: mpsc::Sender<pb::ExecClientMessage>,
    rx: Streaming<pb::ExecServerMessage>,
    stdout: String,
}

impl Session {
    async fn open(
        ch: &Channel,
        token: &str,
        id: &str,
        argv: &[&str],
    ) -> Result<Self, tonic::Status> {
        let (tx, rx) = mpsc::channel(8);
        tx.send(pb::ExecClientMessage {
            msg: Some(In::Spec(pb::ExecSpec {
                sandbox_id: id.into(),
                argv: argv.iter().map(|s| s.to_string()).collect(),
                ..Default::default()
            })),
        })
        .await
        .unwrap();
        let mut out = svc(ch)
            .exec_in_sandbox(with(
                tokio_stream::wrappers::ReceiverStream::new(rx),
                Some(token),
            ))
            .await?
            .into_inner();
        // A refusal after the call is accepted comes as the stream's first message.
        let first = out.message().await?;
        let mut s = Self {
            tx,
            rx: out,
            stdout: String::new(),
        };
        if let Some(Out::Stdout(d)) = first.and_then(|m| m.msg) {
            s.stdout.push_str(&String::from_utf8_lossy(&d));
        }
        Ok(s)
    }

    async fn send(&self, line: &str) {
        self.tx
            .send(pb::ExecClientMessage {
                msg: Some(In::Stdin(line.as_bytes().to_vec())),
            })
            .await
            .unwrap();
    }

    async fn until(&mut self, want: &str, within: Duration) {
        let t0 = Instant::now();
        while !self.stdout.contains(want) {
            let left = within.saturating_sub(t0.elapsed());
            let m = tokio::time::timeout(left, self.rx.message())
                .await
                .unwrap_or_else(|_| panic!("no {want:?} in {within:?}: {:?}", self.stdout))
                .unwrap();
            match m.and_then(|m| m.msg) {
                Some(Out::Stdout(d)) => self.stdout.push_str(&String::from_utf8_lossy(&d)),
                Some(Out::Stderr(_)) => {}
                other => panic!("{other:?} before {want:?}: {:?}", self.stdout),
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn who_may_suspend_and_a_repl_keeps_its_memory_and_open_file_across_it() {
    need!();
    let d = start("suspend-platform", "pull_missing = false");
    let root = d.local_channel().await;
    let tcp = channel(&d.addr).await;
    let (op, viewer, op_b) = setup(&root).await;
    let id = sandbox(&tcp, &op, "py").await;

    // Who: keep-alive is read-level, suspend and resume are writes.
    let k = keep_alive(&tcp, Some(&viewer), &id).await.unwrap();
    let at = k.idle_suspend_at.unwrap().seconds;
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    assert!((now + 598..=now + 601).contains(&at), "{at} vs {now}");
    assert!((598..=600).contains(&k.idle_suspend_in_sec), "{k:?}");
    for (who, token, want) in [
        ("viewer", Some(viewer.as_str()), Code::PermissionDenied),
        (
            "another namespace's operator",
            Some(op_b.as_str()),
            Code::NotFound,
        ),
        ("no key", None, Code::Unauthenticated),
    ] {
        assert_eq!(
            suspend(&tcp, token, &id).await.unwrap_err().code(),
            want,
            "suspend by {who}"
        );
        assert_eq!(
            resume(&tcp, token, &id).await.unwrap_err().code(),
            want,
            "resume by {who}"
        );
    }
    assert_eq!(
        keep_alive(&tcp, Some(&op_b), &id).await.unwrap_err().code(),
        Code::NotFound
    );
    assert_eq!(
        get(&tcp, &op, &id).await.state,
        pb::SandboxState::Running as i32
    );

    // A REPL holding 100 MiB and an open file.
    let mut repl = Session::open(&tcp, &op, &id, &["python3", "-i", "-q", "-u"])
        .await
        .unwrap();
    repl.send("x = bytearray(100 << 20)\n").await;
    repl.send("for j in range(0, len(x), 4096): x[j] = 7\n\n")
        .await;
    repl.send("f = open('/workspace/held.txt', 'w+'); f.write('kept'); f.flush()\n")
        .await;
    repl.send("print('before', sum(x[::4096]), f.tell())\n")
        .await;
    repl.until("before 179200 4", Duration::from_secs(60)).await;

    let sb = suspend(&tcp, Some(&op), &id).await.unwrap();
    assert_eq!(sb.state, pb::SandboxState::Suspended as i32, "{sb:?}");
    assert!(sb.idle_suspend_at.is_none());
    // Suspending again is no change; what needs it running is refused.
    let again = suspend(&tcp, Some(&op), &id).await.unwrap();
    assert_eq!(again.state, pb::SandboxState::Suspended as i32);
    assert_eq!(
        keep_alive(&tcp, Some(&viewer), &id)
            .await
            .unwrap_err()
            .code(),
        Code::FailedPrecondition
    );
    let refused = Session::open(&tcp, &op, &id, &["true"]).await;
    assert_eq!(
        refused.err().map(|s| s.code()),
        Some(Code::FailedPrecondition)
    );
    let found = svc(&tcp)
        .list_sandboxes(with(
            pb::ListSandboxesRequest {
                namespace: "team-a".into(),
                state: pb::SandboxState::Suspended as i32,
                ..Default::default()
            },
            Some(&viewer),
        ))
        .await
        .unwrap()
        .into_inner();
    assert!(found.sandboxes.iter().any(|s| s.sandbox_id == id));

    // Resumed: the same REPL answers with its memory and its open file.
    let t0 = Instant::now();
    let sb = resume(&tcp, Some(&op), &id).await.unwrap();
    let resume_ms = t0.elapsed().as_millis();
    assert_eq!(sb.state, pb::SandboxState::Running as i32, "{sb:?}");
    repl.send("print('after', sum(x[::4096]), f.tell(), open('/workspace/held.txt').read())\n")
        .await;
    repl.until("after 179200 4 kept", Duration::from_secs(30))
        .await;
    eprintln!("resume of a 100 MiB REPL: {resume_ms} ms");
    // New execs run again; keep-alive works again.
    let mut s = Session::open(&tcp, &op, &id, &["echo", "again"])
        .await
        .unwrap();
    s.until("again", Duration::from_secs(30)).await;
    assert!(keep_alive(&tcp, Some(&viewer), &id).await.is_ok());

    let m = markers(&tcp, &viewer, &id).await;
    let sus = m
        .iter()
        .find(|(k, _)| *k == pb::LogMarker::Suspended)
        .unwrap_or_else(|| panic!("no SUSPENDED marker: {m:?}"));
    assert!(sus.1.contains("memory kept"), "{sus:?}");
    let res = m
        .iter()
        .find(|(k, _)| *k == pb::LogMarker::Resumed)
        .unwrap_or_else(|| panic!("no RESUMED marker: {m:?}"));
    assert!(res.1.contains("memory kept"), "{res:?}");
    // The writes are audited.
    let audit = AccessServiceClient::new(root.clone())
        .list_audit_events(pb::ListAuditEventsRequest {
            namespace: "team-a".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let text = format!("{audit:?}");
    assert!(
        text.contains("SuspendSandbox") && text.contains("ResumeSandbox"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_idle_sandbox_is_suspended_unless_kept_alive_and_resume_revives_a_failed_one() {
    need!();
    let d = start("suspend-idle", "pull_missing = false\nidle_check_ms = 200");
    let root = d.local_channel().await;
    let tcp = channel(&d.addr).await;
    let (op, viewer, _) = setup(&root).await;
    let id = sandbox(&tcp, &op, "idle").await;

    // Kept alive by a viewer for longer than its idle time: still running.
    for _ in 0..6 {
        let k = keep_alive(&tcp, Some(&viewer), &id).await.unwrap();
        assert!((2..=3).contains(&k.idle_suspend_in_sec), "{k:?}");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert_eq!(
        get(&tcp, &op, &id).await.state,
        pb::SandboxState::Running as i32
    );
    // Left alone: suspended by itself.
    wait_state(&tcp, &op, &id, pb::SandboxState::Suspended, 15).await;
    let m = markers(&tcp, &viewer, &id).await;
    assert!(
        m.iter()
            .any(|(k, d)| *k == pb::LogMarker::Suspended && d.contains("idle")),
        "{m:?}"
    );
    resume(&tcp, Some(&op), &id).await.unwrap();

    // Crashed: every sandbox process killed on the host makes it FAILED; Resume starts it
    // again from its record.
    let pids: Vec<i32> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|p| {
            let cmd = std::fs::read(p.path().join("cmdline")).ok()?;
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            (cmd.contains("runsc-sandbox") && cmd.contains(&id))
                .then(|| p.file_name().to_string_lossy().parse().ok())
                .flatten()
        })
        .collect();
    assert!(!pids.is_empty(), "no sandbox process of {id}");
    for p in pids {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(p),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    wait_state(&tcp, &op, &id, pb::SandboxState::Failed, 30).await;
    let sb = resume(&tcp, Some(&op), &id).await.unwrap();
    assert_eq!(sb.state, pb::SandboxState::Running as i32, "{sb:?}");
    let mut s = Session::open(&tcp, &op, &id, &["echo", "revived"])
        .await
        .unwrap();
    s.until("revived", Duration::from_secs(30)).await;
    let m = markers(&tcp, &viewer, &id).await;
    assert!(
        m.iter()
            .any(|(k, d)| *k == pb::LogMarker::Resumed && d.contains("memory lost")),
        "{m:?}"
    );
}
