//! The node's lifecycle against the fake runtime: create, each failing step and what it leaves,
//! destroy, recovery from every task state, the deadline and exit watch, and the warm pool's
//! claim. Fast (no containerd, no runsc); the same paths run for real in `tests/`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use super::*;
use crate::config::PoolEntry;
use crate::metering::fake::FakeTree;
use crate::runtime::fake::{FakeRuntime, Op};
use crate::runtime::TaskState;
use crate::size::ByteSize;

struct Harness {
    dir: tempfile::TempDir,
    tree: FakeTree,
    rt: Arc<FakeRuntime>,
    node: Node,
    cfg: Config,
}

fn config(dir: &std::path::Path, tree: &FakeTree) -> Config {
    Config {
        listen: String::new(),
        socket: PathBuf::new(),
        metrics_listen: String::new(),
        state_dir: dir.join("state"),
        run_dir: dir.join("run"),
        cgroup_root: tree.root().to_path_buf(),
        init_helper: PathBuf::new(),
        agent: false,
        storage_class: "local".into(),
        min_free_disk: ByteSize::zero(),
        gc_interval_secs: 0,
        sandbox_image: "img".into(),
        ready_wait_secs: 5,
        ..Default::default()
    }
}

impl Harness {
    fn new(tune: impl FnOnce(&mut Config)) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let tree = FakeTree::new(crate::metering::CgroupVersion::V1);
        let mut cfg = config(dir.path(), &tree);
        tune(&mut cfg);
        let rt = Arc::new(FakeRuntime::with_image("img"));
        let node = Node::new(cfg.clone(), rt.clone());
        Self {
            dir,
            tree,
            rt,
            node,
            cfg,
        }
    }

    /// A new daemon over the same runtime and state (a restart).
    async fn restart(&mut self) -> usize {
        self.node.shutdown(Duration::from_secs(5)).await;
        self.node = Node::new(self.cfg.clone(), self.rt.clone());
        self.node.recover().await.unwrap()
    }

    async fn create(&self, session: &str) -> Result<Arc<Sandbox>> {
        self.node
            .create(CreateRequest {
                tenant_id: "t".into(),
                session_id: session.into(),
                ..Default::default()
            })
            .await
    }

    fn workspace_dir(&self, id: &str) -> PathBuf {
        self.dir.path().join("state/workspaces").join(id)
    }
}

/// Waits until `sb` is `want` (panics with its state after 5 s).
async fn becomes(sb: &Sandbox, want: Status) -> State {
    let mut rx = sb.subscribe();
    let r = tokio::time::timeout(Duration::from_secs(5), rx.wait_for(|s| s.status == want)).await;
    match r {
        Ok(Ok(s)) => s.clone(),
        _ => panic!("{} never became {want:?}: {:?}", sb.id, sb.state()),
    }
}

#[tokio::test]
async fn create_provisions_and_destroy_leaves_a_tombstone() {
    let h = Harness::new(|_| {});
    let sb = h.create("s").await.unwrap();
    assert_eq!(sb.status(), Status::Starting);
    let rec = h.rt.record_of(&sb.id).expect("recorded before the answer");
    assert_eq!(rec.labels[&record::label("tenant-id")], "t");
    assert_eq!(rec.image, "img");
    becomes(&sb, Status::Ready).await;
    assert_eq!(h.rt.task(&sb.id), TaskState::Running);
    let spec = String::from_utf8(h.rt.record_of(&sb.id).unwrap().spec).unwrap();
    assert!(
        spec.contains("FROM_IMAGE=1"),
        "the image's env is in the spec: {spec}"
    );
    // The same session gets the same sandbox while it lives.
    assert_eq!(h.create("s").await.unwrap().id, sb.id);

    let (_, usage) = h.node.destroy(&sb.id).await.unwrap();
    assert_eq!(sb.status(), Status::Destroyed);
    assert!(h.rt.record_of(&sb.id).is_none(), "torn down");
    assert!(h.workspace_dir(&sb.id).join("tombstone.json").is_file());
    assert_eq!(h.node.destroy(&sb.id).await.unwrap().1, usage, "idempotent");
    let again = h.create("s").await.unwrap();
    assert_ne!(again.id, sb.id, "a destroyed sandbox frees its session");
}

#[tokio::test]
async fn each_failing_step_of_a_create_leaves_nothing_or_a_failed_sandbox() {
    // (failing verb, whether Create itself fails)
    for (op, create_fails) in [
        (Op::Record, true),
        (Op::Resolve, false),
        (Op::SetSpec, false),
        (Op::Start, false),
    ] {
        let h = Harness::new(|_| {});
        h.rt.fail(op, false);
        let r = h.create("s").await;
        if create_fails {
            assert!(r.is_err(), "{op:?}");
            assert_eq!(h.rt.record_count(), 0, "{op:?}: no record");
            assert!(h.node.list().is_empty(), "{op:?}: not in the table");
            let ws = std::fs::read_dir(h.dir.path().join("state/workspaces"))
                .map(|d| d.count())
                .unwrap_or(0);
            assert_eq!(ws, 0, "{op:?}: no workspace left");
        } else {
            let sb = r.unwrap();
            let st = becomes(&sb, Status::Failed).await;
            assert!(
                st.reason.starts_with("start failed"),
                "{op:?}: {}",
                st.reason
            );
            let labels = h.rt.record_of(&sb.id).unwrap().labels;
            assert_eq!(labels[&record::label("status")], "failed", "{op:?}");
            assert_ne!(h.rt.task(&sb.id), TaskState::Running, "{op:?}");
        }
        // Healed, the session gets a working sandbox.
        h.rt.heal();
        let sb = h.create("s").await.unwrap();
        becomes(&sb, Status::Ready).await;
    }
}

#[tokio::test]
async fn a_failed_teardown_keeps_the_sandbox_for_a_retry() {
    let h = Harness::new(|_| {});
    let sb = h.create("s").await.unwrap();
    becomes(&sb, Status::Ready).await;
    h.rt.fail(Op::Teardown, true);
    let e = h.node.destroy(&sb.id).await.unwrap_err();
    assert!(e.is_unavailable(), "{e}");
    assert_eq!(sb.status(), Status::Ready);
    assert!(h.rt.record_of(&sb.id).is_some());
    h.rt.heal();
    h.node.destroy(&sb.id).await.unwrap();
    assert_eq!(sb.status(), Status::Destroyed);
}

#[tokio::test]
async fn destroy_cancels_provisioning_stuck_in_a_pull() {
    let h = Harness::new(|_| {});
    h.rt.hang(Op::Resolve);
    let sb = h.create("s").await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(sb.status(), Status::Starting);
    let t0 = Instant::now();
    h.node.destroy(&sb.id).await.unwrap();
    assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
    assert_eq!(sb.status(), Status::Destroyed);
    assert!(h.rt.record_of(&sb.id).is_none());
    assert!(
        !h.rt.calls().iter().any(|c| c.starts_with("Start")),
        "never started"
    );
}

#[tokio::test]
async fn the_deadline_and_the_exit_watch_fail_a_sandbox() {
    let h = Harness::new(|_| {});
    let sb = h
        .node
        .create(CreateRequest {
            tenant_id: "t".into(),
            session_id: "short".into(),
            max_runtime: Some(Duration::from_millis(300)),
            ..Default::default()
        })
        .await
        .unwrap();
    let st = becomes(&sb, Status::Failed).await;
    assert_eq!(st.reason, "max_runtime exceeded");
    assert!(matches!(h.rt.task(&sb.id), TaskState::Stopped(_)), "killed");

    let sb = h.create("exits").await.unwrap();
    becomes(&sb, Status::Ready).await;
    h.rt.set_task(&sb.id, TaskState::Stopped(3));
    let st = becomes(&sb, Status::Failed).await;
    assert_eq!(st.reason, "sandbox exited with status 3");
}

#[tokio::test]
async fn recovery_from_every_state_a_restart_can_find() {
    let mut h = Harness::new(|_| {});
    let def = |n: u128| Definition {
        id: uuid::Uuid::from_u128(n).hyphenated().to_string(),
        tenant_id: "t".into(),
        session_id: format!("s{n}"),
        image: "img".into(),
        created_at: SystemTime::now(),
        limits: Limits {
            cpu_millis: 100,
            memory_bytes: 64 << 20,
            max_runtime: Duration::from_secs(600),
        },
        workspace: WorkspaceSpec {
            storage_class: "local".into(),
            size: ByteSize::parse("64Mi").unwrap(),
            mount_path: "/workspace".into(),
        },
        pool: false,
        image_digest: String::new(),
        platform: None,
    };
    // (record says failed, task state) → status after recovery, whether it is (re)started
    let cases = [
        (false, TaskState::Running, Status::Ready, false),
        (false, TaskState::Paused, Status::Ready, false),
        (false, TaskState::Unknown, Status::Ready, false),
        (false, TaskState::Stopped(3), Status::Failed, false),
        (false, TaskState::Missing, Status::Ready, true),
        (false, TaskState::Created, Status::Ready, true),
        (true, TaskState::Running, Status::Failed, false),
    ];
    for (i, (failed, task, _, _)) in cases.iter().enumerate() {
        let d = def(i as u128 + 1);
        let mut labels = record::labels(&d);
        if *failed {
            labels.extend(record::failure_labels("earlier"));
        }
        h.rt.plant(&d.id, labels, *task);
    }
    // A record that is not ours is left alone.
    h.rt.plant("other", Default::default(), TaskState::Running);
    assert_eq!(h.restart().await, cases.len());
    for (i, (failed, task, want, started)) in cases.iter().enumerate() {
        let sb = h.node.get(&def(i as u128 + 1).id).unwrap();
        let st = becomes(&sb, *want).await;
        if *failed {
            assert_eq!(st.reason, "earlier");
        }
        if let TaskState::Stopped(c) = task {
            assert_eq!(st.reason, format!("sandbox exited with status {c}"));
        }
        let start = format!("Start {}", sb.id);
        assert_eq!(h.rt.calls().contains(&start), *started, "{task:?}");
    }
    // A destroyed one comes back from its tombstone, with its usage.
    let sb = h.node.get(&def(1).id).unwrap();
    let (_, usage) = h.node.destroy(&sb.id).await.unwrap();
    h.restart().await;
    let back = h.node.get(&sb.id).unwrap();
    assert_eq!(back.status(), Status::Destroyed);
    assert_eq!(h.node.destroy(&sb.id).await.unwrap().1, usage);
    assert_eq!(back.session_id, "s1");
}

#[tokio::test]
async fn a_pool_member_is_claimed_and_a_failed_claim_falls_back_to_a_cold_create() {
    let h = Harness::new(|c| {
        c.pool = vec![PoolEntry {
            image: "img".into(),
            size: 1,
            storage_class: String::new(),
            workspace_size: None,
            mount_path: String::new(),
        }];
    });
    h.node.start_background();
    let member = async {
        loop {
            if let Some(m) = h
                .node
                .pool_members()
                .into_iter()
                .find(|m| m.status() == Status::Ready)
            {
                return m;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    let m = tokio::time::timeout(Duration::from_secs(5), member)
        .await
        .unwrap();
    assert!(h.node.get(&m.id).is_err(), "a member belongs to nobody");
    // The claim writes the request's limits into the member's cgroup.
    h.tree.add(&format!("/compute/{}", m.id));
    let sb = h.create("warm").await.unwrap();
    assert_eq!(sb.id, m.id, "claimed");
    assert_eq!(sb.status(), Status::Ready, "READY at once");
    let labels = h.rt.record_of(&sb.id).unwrap().labels;
    assert_eq!(labels[&record::label("tenant-id")], "t");
    assert_eq!(labels[&record::label("pool")], "false");

    // The refill boots another; its claim fails (no cgroup to take the limits): the member is
    // retired and the create goes cold.
    let m2 = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            if let Some(m) = h
                .node
                .pool_members()
                .into_iter()
                .find(|m| m.status() == Status::Ready && m.id != sb.id)
            {
                return m;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .unwrap();
    let cold = h.create("cold").await.unwrap();
    assert_ne!(cold.id, m2.id);
    becomes(&cold, Status::Ready).await;
    assert!(h.rt.record_of(&m2.id).is_none(), "the member was retired");
    assert!(
        h.node.shutdown(Duration::from_secs(5)).await,
        "every task ends"
    );
}

#[tokio::test]
async fn shutdown_drains_every_task_and_starts_nothing_new() {
    let h = Harness::new(|_| {});
    let sb = h.create("s").await.unwrap();
    becomes(&sb, Status::Ready).await;
    // Provisioning of another one hangs in its pull: shutdown cuts it.
    h.rt.hang(Op::Resolve);
    let stuck = h.create("stuck").await.unwrap();
    assert!(
        h.node.tasks().len() >= 3,
        "deadlines, an exit watch, a provisioning"
    );
    assert!(
        h.node.shutdown(Duration::from_secs(5)).await,
        "every task ended"
    );
    assert!(h.node.tasks().is_empty());
    let e = h.create("new").await.unwrap_err();
    assert!(e.is_unavailable(), "{e}");
    // Shutdown is not destroy: the sandboxes are left as they are, for the next daemon.
    assert_eq!(h.rt.task(&sb.id), TaskState::Running);
    assert_eq!(stuck.status(), Status::Starting);
    assert!(h.rt.record_of(&stuck.id).is_some());
}

#[tokio::test]
async fn suspend_and_resume_keep_the_record_and_fall_back_to_a_cold_start() {
    let h = Harness::new(|_| {});
    let sb = h.create("s").await.unwrap();
    becomes(&sb, Status::Ready).await;
    let label = |id: &str, k: &str| {
        h.rt.record_of(id)
            .and_then(|r| r.labels.get(&record::label(k)).cloned())
    };

    // A checkpoint that fails while the sandbox runs leaves it READY.
    h.rt.fail(Op::Checkpoint, false);
    assert!(h
        .node
        .suspend(&sb.id, suspend::Cause::Request)
        .await
        .is_err());
    assert_eq!(sb.status(), Status::Ready);
    h.rt.heal();

    let s = h
        .node
        .suspend(&sb.id, suspend::Cause::Request)
        .await
        .unwrap();
    assert_eq!(s.status(), Status::Suspended);
    assert_eq!(label(&sb.id, "status").as_deref(), Some("suspended"));
    assert!(sb
        .suspension()
        .is_some_and(|s| s.memory && s.checkpoint_bytes > 0));
    assert_eq!(h.rt.task(&sb.id), TaskState::Missing);
    // Suspending again is no change; a suspended sandbox is still its session's.
    h.node
        .suspend(&sb.id, suspend::Cause::Request)
        .await
        .unwrap();
    assert_eq!(h.create("s").await.unwrap().id, sb.id);

    let (_, how) = h.node.resume(&sb.id).await.unwrap();
    assert_eq!(how, suspend::Resumed::Restored);
    assert_eq!(sb.status(), Status::Ready);
    assert!(sb.suspension().is_none());
    assert!(h.rt.calls().contains(&format!("Restore {}", sb.id)));

    // A checkpoint gone bad: a cold start of the same record.
    h.node
        .suspend(&sb.id, suspend::Cause::Request)
        .await
        .unwrap();
    std::fs::remove_file(h.node.checkpoint_dir(&sb.id).join("checkpoint.img")).unwrap();
    let (_, how) = h.node.resume(&sb.id).await.unwrap();
    assert!(
        matches!(how, suspend::Resumed::Cold(ref why) if why.contains("could not be restored")),
        "{how:?}"
    );
    assert_eq!(h.rt.task(&sb.id), TaskState::Running);
    // Another runsc wrote it: cold too, saying so.
    h.node
        .suspend(&sb.id, suspend::Cause::Request)
        .await
        .unwrap();
    std::fs::write(
        h.node.checkpoint_dir(&sb.id).join("complete"),
        "runsc version 0.0~1",
    )
    .unwrap();
    let (_, how) = h.node.resume(&sb.id).await.unwrap();
    assert!(
        matches!(how, suspend::Resumed::Cold(ref why) if why.contains("0.0~1")),
        "{how:?}"
    );
    // A compute.v1 exec wakes a suspended sandbox: wait_ready resumes it.
    h.node
        .suspend(&sb.id, suspend::Cause::Request)
        .await
        .unwrap();
    h.node.wait_ready(&sb).await.unwrap();
    assert_eq!(sb.status(), Status::Ready);
    // Destroy removes the checkpoint of a suspended one.
    h.node
        .suspend(&sb.id, suspend::Cause::Request)
        .await
        .unwrap();
    assert!(h.node.checkpoint_dir(&sb.id).exists());
    h.node.destroy(&sb.id).await.unwrap();
    assert!(!h.node.checkpoint_dir(&sb.id).exists());
}

#[tokio::test]
async fn recovery_settles_a_suspend_or_resume_cut_short() {
    let mut h = Harness::new(|_| {});
    let def = |n: u128| Definition {
        id: uuid::Uuid::from_u128(n).hyphenated().to_string(),
        tenant_id: "t".into(),
        session_id: format!("s{n}"),
        image: "img".into(),
        created_at: SystemTime::now(),
        limits: Limits {
            cpu_millis: 100,
            memory_bytes: 64 << 20,
            max_runtime: Duration::from_secs(600),
        },
        workspace: WorkspaceSpec {
            storage_class: "local".into(),
            size: ByteSize::parse("64Mi").unwrap(),
            mount_path: "/workspace".into(),
        },
        pool: false,
        image_digest: String::new(),
        platform: None,
    };
    // (recorded step, task state) → status after recovery
    let cases = [
        (Status::Suspending, TaskState::Running, Status::Ready),
        (Status::Suspending, TaskState::Missing, Status::Suspended),
        (Status::Suspended, TaskState::Missing, Status::Suspended),
        (Status::Resuming, TaskState::Running, Status::Ready),
        // Cut short before its task: finished after the restart (a cold start here: no
        // checkpoint on disk).
        (Status::Resuming, TaskState::Missing, Status::Ready),
    ];
    for (i, (step, task, _)) in cases.iter().enumerate() {
        let d = def(i as u128 + 1);
        let mut labels = record::labels(&d);
        labels.extend(record::status_labels(*step));
        h.rt.plant(&d.id, labels, *task);
    }
    assert_eq!(h.restart().await, cases.len());
    for (i, (step, task, want)) in cases.iter().enumerate() {
        let sb = h.node.get(&def(i as u128 + 1).id).unwrap();
        becomes(&sb, *want).await;
        let label =
            h.rt.record_of(&sb.id)
                .and_then(|r| r.labels.get(&record::label("status")).cloned());
        let want_label = if *want == Status::Suspended {
            "suspended"
        } else {
            "ready"
        };
        // The resumed one writes its label just after READY.
        let t0 = Instant::now();
        let mut label = label;
        while label.as_deref() != Some(want_label) && t0.elapsed() < Duration::from_secs(5) {
            tokio::time::sleep(Duration::from_millis(20)).await;
            label =
                h.rt.record_of(&sb.id)
                    .and_then(|r| r.labels.get(&record::label("status")).cloned());
        }
        assert_eq!(label.as_deref(), Some(want_label), "{step:?} {task:?}");
    }
}
