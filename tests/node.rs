//! End-to-end tests of the node daemon against real containerd and real runsc.

#[macro_use]
mod common;

use std::time::{Duration, Instant};

use common::*;
use computed::api::compute::v1 as pb;
use tonic::Code;

#[tokio::test(flavor = "multi_thread")]
async fn sandbox_runs_under_gvisor_not_the_host_kernel() {
    need!();
    let (_d, mut c, id) = start_sandbox("gvisor", "").await;
    let inside = sh(&mut c, &id, "cat /proc/version; dmesg").await;
    let host = std::fs::read_to_string("/proc/version").unwrap();
    assert_ne!(inside.lines().next().unwrap().trim(), host.trim());
    assert!(
        inside.contains("gVisor"),
        "dmesg inside should be gVisor's: {inside}"
    );
    // The host sees runsc processes for this sandbox.
    assert!(!processes_mentioning(&id).is_empty());
    destroy(&mut c, &id).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn lifecycle_exec_files_and_no_leftovers() {
    need!();
    let (d, mut c) = start_client("lifecycle", "").await;
    let created = create(&mut c, create_req("tenant-a", "session-1")).await;
    assert_eq!(created.status, SandboxStatus::Starting as i32);
    assert!(created.created_at.is_some());
    let id = created.sandbox_id.clone();
    uuid::Uuid::parse_str(&id).expect("sandbox_id is a UUID");

    // ExecCommand right after Create waits for READY by itself.
    let mut req = exec_req(
        &id,
        "python3",
        &[
            "-c",
            "import socket, os; print(socket.gethostname()); print(os.getcwd()); print(42 * 2)",
        ],
    );
    req.env.insert("FOO".into(), "bar".into());
    let o = exec(&mut c, req).await.unwrap();
    assert_eq!(
        o.code(),
        0,
        "stderr: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let out = o.out();
    assert_eq!(out, format!("sandbox-{}\n/workspace\n84\n", &id[..8]));
    let done = o.completed.unwrap();
    assert!(!done.cancelled);
    let usage = done.usage.unwrap();
    assert!(usage.cpu_ms > 0, "cpu_ms is metered: {usage:?}");
    assert!(
        usage.memory_peak_bytes > 1 << 20,
        "memory peak is metered: {usage:?}"
    );
    assert!(done.wall_time.is_some());

    // env, working_dir, stderr and exit codes.
    let mut req = exec_req(&id, "sh", &["-c", "echo $FOO; pwd; echo oops >&2; exit 7"]);
    req.env.insert("FOO".into(), "bar".into());
    req.working_dir = "/tmp".into();
    let o = exec(&mut c, req).await.unwrap();
    assert_eq!(o.out(), "bar\n/tmp\n");
    assert_eq!(String::from_utf8_lossy(&o.stderr), "oops\n");
    assert_eq!(o.code(), 7);

    // Host-side files are seen inside and the reverse.
    write_file(&mut c, &id, "result.txt", b"hello world\n").await;
    assert_eq!(
        sh(&mut c, &id, "cat /workspace/result.txt").await,
        "hello world\n"
    );
    sh(&mut c, &id, "echo from-inside > /workspace/inside.txt").await;
    let r = read_file(&mut c, &id, "inside.txt").await;
    assert_eq!(r.data, &b"from-inside\n"[..]);
    assert!(r.eof);
    let l = list_files(&mut c, list_req(&id, ".")).await;
    let names: Vec<_> = l.entries.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(names, vec!["inside.txt", "result.txt"]);

    // Describe.
    let desc = describe(&mut c, &id).await;
    assert_eq!(desc.status, SandboxStatus::Ready as i32);
    assert_eq!(desc.tenant_id, "tenant-a");
    assert_eq!(desc.session_id, "session-1");
    let cum = desc.current_usage.unwrap();
    assert!(cum.cpu_ms >= usage.cpu_ms, "cumulative >= one exec");
    assert!(desc.current_uptime.unwrap().seconds >= 0);

    // Destroy removes everything it made.
    assert!(
        !cgroups_of(&id).is_empty(),
        "sandbox cgroup exists while it runs"
    );
    let t = destroy(&mut c, &id).await;
    assert_eq!(t.sandbox_id, id);
    let total = t.total_usage.unwrap();
    assert!(total.cpu_ms >= cum.cpu_ms);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        processes_mentioning(&id).is_empty(),
        "processes left: {:?}",
        processes_mentioning(&id)
    );
    assert!(
        mounts_mentioning(&id).is_empty(),
        "mounts left: {:?}",
        mounts_mentioning(&id)
    );
    assert!(
        cgroups_of(&id).is_empty(),
        "cgroups left: {:?}",
        cgroups_of(&id)
    );
    assert!(!d.ctr(&["containers", "ls", "-q"]).contains(&id));
    assert!(!d.ctr(&["tasks", "ls"]).contains(&id));
    assert!(!d.ctr(&["snapshots", "ls"]).contains(&id));
    assert!(
        !d.dir.path().join("run/io").join(&id).exists(),
        "FIFO dir left"
    );
    // The workspace is soft-deleted: its volume is detached (unmounted, loop device released)
    // and kept, with a tombstone.
    let ws = d.state_dir().join("workspaces").join(&id);
    assert!(ws.join("volume.ext4").exists());
    assert!(!computed::volume::is_mounted(&ws.join("data")));
    let tomb: serde_json::Value =
        serde_json::from_slice(&std::fs::read(ws.join("tombstone.json")).unwrap()).unwrap();
    assert_eq!(tomb["tenant_id"], "tenant-a");
    assert!(tomb["delete_after"].as_str().unwrap() > tomb["destroyed_at"].as_str().unwrap());

    // After destroy: DESTROYED, exec and files FAILED_PRECONDITION, destroy again is idempotent.
    let desc = describe(&mut c, &id).await;
    assert_eq!(desc.status, SandboxStatus::Destroyed as i32);
    assert_code(
        exec(&mut c, exec_req(&id, "true", &[])).await,
        Code::FailedPrecondition,
        "exec after destroy",
    );
    assert_code(
        try_read_file(&mut c, &id, "result.txt").await,
        Code::FailedPrecondition,
        "read after destroy",
    );
    let again = destroy(&mut c, &id).await;
    assert_eq!(again.total_usage.unwrap(), total);
}

#[tokio::test(flavor = "multi_thread")]
async fn every_error_row_of_the_spec() {
    need!();
    let (_d, mut c) = start_client("errors", "").await;
    let unknown = uuid::Uuid::new_v4().to_string();

    use Code::{FailedPrecondition, InvalidArgument, NotFound, PermissionDenied};

    // CreateSandbox
    let creates = [
        ("no tenant", create_req("", "s")),
        ("no session", create_req("t", "")),
        (
            "relative mount path",
            with_workspace(create_req("t", "bad-mount"), "", "", "relative/path"),
        ),
        (
            "unparsable size",
            with_workspace(create_req("t", "bad-size"), "", "lots", ""),
        ),
    ];
    for (what, req) in creates {
        assert_code(c.create_sandbox(req).await, InvalidArgument, what);
    }

    // DescribeSandbox / DestroySandbox
    for (bad, code) in [
        ("", InvalidArgument),
        ("not-a-uuid", InvalidArgument),
        ("123", InvalidArgument),
        (unknown.as_str(), NotFound),
    ] {
        let what = format!("describe {bad:?}");
        assert_code(try_describe(&mut c, bad).await, code, &what);
        let what = format!("destroy {bad:?}");
        assert_code(try_destroy(&mut c, bad).await, code, &what);
    }

    // ExecCommand
    for (id, command, code) in [
        ("nope", "true", InvalidArgument),
        (&unknown, "true", NotFound),
    ] {
        let what = format!("exec {command:?} in {id:?}");
        assert_code(exec(&mut c, exec_req(id, command, &[])).await, code, &what);
    }
    let id = ready_sandbox(&mut c, create_req("t", "errors")).await;
    assert_code(
        exec(&mut c, exec_req(&id, "", &[])).await,
        InvalidArgument,
        "exec with no command",
    );
    // A command that does not exist completes with a non-zero code rather than hanging.
    let o = exec(&mut c, exec_req(&id, "/no/such/binary", &[]))
        .await
        .unwrap();
    assert_ne!(o.code(), 0);

    // A sandbox whose image does not exist goes FAILED, with the reason; exec is then
    // FAILED_PRECONDITION.
    let mut bad_image = create_req("t", "bad-image");
    bad_image.image = "compute.local/no-such-image:1".into();
    let failed = create(&mut c, bad_image).await;
    assert_eq!(failed.status, SandboxStatus::Starting as i32);
    wait_failed(
        &mut c,
        &failed.sandbox_id,
        Duration::from_secs(20),
        "no-such-image",
    )
    .await;
    assert_code(
        exec(&mut c, exec_req(&failed.sandbox_id, "true", &[])).await,
        FailedPrecondition,
        "exec in a FAILED sandbox",
    );
    // Destroying a FAILED sandbox works.
    destroy(&mut c, &failed.sandbox_id).await;

    // Workspace I/O
    assert_code(
        try_read_file(&mut c, "x", "a").await,
        InvalidArgument,
        "read with a malformed id",
    );
    sh(
        &mut c,
        &id,
        "ln -s / /workspace/root-link; ln -s /etc/passwd /workspace/passwd-link",
    )
    .await;
    for (path, code) in [
        ("../etc/passwd", InvalidArgument),
        ("a/../../x", InvalidArgument),
        ("missing.txt", NotFound),
        ("root-link/etc/passwd", PermissionDenied),
        ("passwd-link", PermissionDenied),
    ] {
        let what = format!("read {path:?}");
        assert_code(try_read_file(&mut c, &id, path).await, code, &what);
    }
    assert_code(
        try_write_file(&mut c, &id, "root-link/tmp/owned", b"x").await,
        PermissionDenied,
        "write through a link to /",
    );
    assert!(!std::path::Path::new("/tmp/owned").exists());
    assert_code(
        try_write_file(&mut c, &id, "big", vec![0; (16 << 20) + 1]).await,
        InvalidArgument,
        "write over 16 MiB",
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn exec_waits_for_ready_and_gives_up_with_deadline_exceeded() {
    need!();
    // ready_wait_secs = 0: an exec on a STARTING sandbox gives up at once.
    let (_d, mut c) = start_client("deadline", "ready_wait_secs = 0").await;
    let id = create(&mut c, create_req("t", "deadline")).await.sandbox_id;
    assert_code(
        exec(&mut c, exec_req(&id, "true", &[])).await,
        Code::DeadlineExceeded,
        "exec on a STARTING sandbox",
    );
    wait_status(&mut c, &id, SandboxStatus::Ready, Duration::from_secs(30)).await;
    assert_eq!(
        exec(&mut c, exec_req(&id, "true", &[]))
            .await
            .unwrap()
            .code(),
        0
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn output_streams_as_it_is_produced() {
    need!();
    let (_d, mut c, id) = start_sandbox("stream", "").await;
    let mut stream = sh_stream(&mut c, &id, "echo first; sleep 2; echo second").await;
    let t0 = Instant::now();
    let mut first_at = None;
    let mut completed_at = None;
    let mut seen = String::new();
    while let Some(ev) = stream.message().await.unwrap() {
        match ev.event.unwrap() {
            pb::exec_event::Event::Stdout(s) => {
                seen.push_str(&String::from_utf8_lossy(&s.data));
                if first_at.is_none() {
                    first_at = Some(t0.elapsed());
                }
            }
            pb::exec_event::Event::Completed(_) => completed_at = Some(t0.elapsed()),
            pb::exec_event::Event::Stderr(_) => {}
        }
    }
    assert_eq!(seen, "first\nsecond\n");
    let (first, done) = (first_at.unwrap(), completed_at.unwrap());
    assert!(
        done - first >= Duration::from_millis(1500),
        "first chunk at {first:?}, completed at {done:?}: output was not streamed"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn timeout_kills_the_exec() {
    need!();
    let (_d, mut c, id) = start_sandbox("timeout", "").await;
    let t0 = Instant::now();
    let o = exec(&mut c, timed(&id, "sleep", &["30"], 1)).await.unwrap();
    let done = o.completed.unwrap();
    assert!(done.timed_out);
    assert_eq!(done.exit_code, 137);
    assert!(
        t0.elapsed() < Duration::from_secs(10),
        "took {:?}",
        t0.elapsed()
    );
    // The process inside the sandbox is gone (not just the host-side waiter), and the sandbox
    // is still usable.
    let ps = sh(&mut c, &id, "ps -e -o args").await;
    assert!(
        !ps.contains("sleep 30"),
        "timed-out process still runs: {ps}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn cancellation_sends_sigterm_then_sigkill() {
    need!();
    cancellation(false).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn cancellation_through_the_agent_sends_sigterm_then_sigkill() {
    need!();
    cancellation(true).await;
}

/// Through containerd exec (`agent = false`) or the in-sandbox agent.
async fn cancellation(agent: bool) {
    let (d, mut c) = start_client(
        if agent { "cancel-agent" } else { "cancel" },
        &format!("cancel_grace_secs = 2\nagent = {agent}"),
    )
    .await;
    let id = ready_sandbox(&mut c, create_req("t", "cancel")).await;

    // A process that handles SIGTERM: it gets the signal when the client cancels.
    let script = "trap 'echo term > /workspace/got-term; exit 0' TERM; echo started; \
                  while :; do sleep 0.1; done";
    let mut stream = sh_stream(&mut c, &id, script).await;
    let first = stream.message().await.unwrap().unwrap();
    assert!(matches!(
        first.event,
        Some(pb::exec_event::Event::Stdout(_))
    ));
    drop(stream);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if let Ok(r) = try_read_file(&mut c, &id, "got-term").await {
            assert_eq!(r.data, &b"term\n"[..]);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "SIGTERM never reached the process"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // A process that ignores SIGTERM is killed after the grace period.
    let script =
        "trap '' TERM; echo started; while :; do date +%s%N > /workspace/beat; sleep 0.1; done";
    let mut stream = sh_stream(&mut c, &id, script).await;
    stream.message().await.unwrap().unwrap();
    drop(stream);
    tokio::time::sleep(Duration::from_secs(4)).await;
    let beat =
        || std::fs::read(d.state_dir().join("workspaces").join(&id).join("data/beat")).unwrap();
    let b1 = beat();
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(b1, beat(), "the process still runs after SIGTERM + grace");
    let log = d.log_text();
    assert!(
        log.contains("exec cancelled by client"),
        "cancel recorded in the log"
    );
    if agent {
        // The agent escalates to SIGKILL itself after the grace period (asserted above).
        assert!(log.contains("SIGTERM (agent)"), "{log}");
    } else {
        assert!(log.contains("SIGKILL"), "SIGKILL after the grace period");
    }
    assert!(log.contains("cancelled=true") && log.contains("exit_code=-1"));
}

#[tokio::test(flavor = "multi_thread")]
async fn memory_limit_kills_the_exec_not_the_sandbox() {
    need!();
    let (_d, mut c) = start_client("memory", "").await;
    let req = with_limits(create_req("t", "memory"), 0, 256 << 20);
    let id = ready_sandbox(&mut c, req).await;
    sh(&mut c, &id, "echo keep > /workspace/keep.txt").await;
    let hog = "b = bytearray(400 * 1024 * 1024)\n\
               for i in range(0, len(b), 4096): b[i] = 1\n\
               import time; time.sleep(30)";
    let t0 = Instant::now();
    let o = exec(&mut c, exec_req(&id, "python3", &["-c", hog]))
        .await
        .unwrap();
    let done = o.completed.unwrap();
    assert_eq!(done.exit_code, 137);
    assert!(done.oom_killed, "the exec is marked as OOM-killed");
    assert!(t0.elapsed() < Duration::from_secs(20));
    // Per-exec memory is what the exec added above the sandbox's level at its start: the kill
    // came once the sandbox as a whole (sentry included) went over 256 MiB.
    assert!(done.usage.unwrap().memory_peak_bytes > 192 << 20);
    // The sandbox survives with its workspace, and the next exec works.
    let desc = describe(&mut c, &id).await;
    assert_eq!(desc.status, SandboxStatus::Ready as i32);
    assert_eq!(sh(&mut c, &id, "cat /workspace/keep.txt").await, "keep\n");
    let o = exec(
        &mut c,
        exec_req(
            &id,
            "python3",
            &["-c", "b = bytearray(64 << 20); print('fine')"],
        ),
    )
    .await
    .unwrap();
    assert_eq!(o.out(), "fine\n");
}

#[tokio::test(flavor = "multi_thread")]
async fn cpu_limit_throttles_a_busy_loop() {
    need!();
    let (_d, mut c) = start_client("cpu", "").await;
    let id = ready_sandbox(&mut c, with_limits(create_req("t", "cpu"), 250, 0)).await;
    let busy = "import time\nt = time.time()\nwhile time.time() - t < 4: pass";
    let o = exec(&mut c, exec_req(&id, "python3", &["-c", busy]))
        .await
        .unwrap();
    let done = o.completed.unwrap();
    let wall = done.wall_time.unwrap();
    let wall_ms = wall.seconds as f64 * 1000.0 + wall.nanos as f64 / 1e6;
    let cpu_ms = done.usage.unwrap().cpu_ms as f64;
    let share = cpu_ms / wall_ms;
    assert!(
        (0.15..=0.40).contains(&share),
        "cpu_millis=250 should hold the loop near a quarter core, got {share:.2} ({cpu_ms} ms over {wall_ms} ms)"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn one_sandbox_per_session() {
    need!();
    let (d, mut c) = start_client("session", "").await;
    let a = create(&mut c, create_req("t1", "s")).await;
    let b = create(&mut c, create_req("t1", "s")).await;
    assert_eq!(
        a.sandbox_id, b.sandbox_id,
        "same live session, same sandbox"
    );
    let other = create(&mut c, create_req("t2", "s")).await;
    assert_ne!(
        a.sandbox_id, other.sandbox_id,
        "another tenant never gets this sandbox"
    );
    // In parallel too.
    let mut handles = Vec::new();
    for _ in 0..8 {
        let mut c = d.client().await;
        handles.push(tokio::spawn(async move {
            create(&mut c, create_req("t3", "parallel"))
                .await
                .sandbox_id
        }));
    }
    let mut ids = Vec::new();
    for h in handles {
        ids.push(h.await.unwrap());
    }
    ids.dedup();
    assert_eq!(ids.len(), 1, "parallel creates for one session: {ids:?}");
    // After destroy, the session gets a new sandbox.
    destroy(&mut c, &a.sandbox_id).await;
    let n = create(&mut c, create_req("t1", "s")).await;
    assert_ne!(n.sandbox_id, a.sandbox_id);
}

#[tokio::test(flavor = "multi_thread")]
async fn ten_sandboxes_in_parallel() {
    need!();
    let d = start("parallel", "");
    let mut handles = Vec::new();
    for i in 0..10 {
        let mut c = d.client().await;
        handles.push(tokio::spawn(async move {
            let id = create(&mut c, create_req("t", &format!("p{i}")))
                .await
                .sandbox_id;
            for j in 0..3 {
                let out = sh(&mut c, &id, &format!("echo {i}-{j}")).await;
                assert_eq!(out, format!("{i}-{j}\n"));
            }
            destroy(&mut c, &id).await;
            id
        }));
    }
    let mut ids = Vec::new();
    for h in handles {
        ids.push(h.await.unwrap());
    }
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 10);
    tokio::time::sleep(Duration::from_millis(300)).await;
    for id in &ids {
        assert!(
            processes_mentioning(id).is_empty(),
            "leftover processes for {id}"
        );
        assert!(cgroups_of(id).is_empty(), "leftover cgroups for {id}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn restart_keeps_every_sandbox() {
    need!();
    let (mut d, mut c) = start_client("restart", "").await;
    let a = ready_sandbox(&mut c, create_req("tenant-r", "session-a")).await;
    let req_b = with_limits(create_req("tenant-r", "session-b"), 500, 512 << 20);
    let b = ready_sandbox(&mut c, req_b).await;
    sh(&mut c, &a, "echo persisted > /workspace/p.txt").await;
    sh(
        &mut c,
        &b,
        "i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done",
    )
    .await;
    let before = describe(&mut c, &b).await;

    d.kill9();
    d.spawn();
    let mut c = d.client().await;
    for id in [&a, &b] {
        let desc = describe(&mut c, id).await;
        assert_eq!(
            desc.status,
            SandboxStatus::Ready as i32,
            "{id} after restart"
        );
        assert_eq!(desc.tenant_id, "tenant-r");
    }
    let after = describe(&mut c, &b).await;
    assert_eq!(after.session_id, "session-b");
    assert_eq!(after.created_at, before.created_at);
    assert!(
        after.current_usage.unwrap().cpu_ms >= before.current_usage.unwrap().cpu_ms,
        "usage is monotonic across a restart"
    );
    assert_eq!(sh(&mut c, &a, "cat /workspace/p.txt").await, "persisted\n");
    // The session still maps to its sandbox.
    let again = create(&mut c, create_req("tenant-r", "session-a")).await;
    assert_eq!(again.sandbox_id, a);
    // Limits came back from the labels: b still runs at half a core.
    assert_eq!(
        std::fs::read_to_string(format!("/sys/fs/cgroup/cpu/compute/{b}/cpu.cfs_quota_us"))
            .or_else(|_| std::fs::read_to_string(format!("/sys/fs/cgroup/compute/{b}/cpu.max")))
            .unwrap()
            .split_whitespace()
            .next()
            .unwrap(),
        "50000"
    );
    // A destroyed sandbox is remembered across a restart too.
    destroy(&mut c, &a).await;
    d.kill9();
    d.spawn();
    let mut c = d.client().await;
    let desc = describe(&mut c, &a).await;
    assert_eq!(desc.status, SandboxStatus::Destroyed as i32);
}

#[tokio::test(flavor = "multi_thread")]
async fn max_runtime_fails_the_sandbox_and_a_dead_sandbox_is_failed() {
    need!();
    let (_d, mut c) = start_client("maxrt", "").await;
    let mut req = create_req("t", "maxrt");
    req.limits = Some(pb::ResourceLimits {
        max_runtime: secs(3),
        ..Default::default()
    });
    let id = ready_sandbox(&mut c, req).await;
    wait_failed(&mut c, &id, Duration::from_secs(15), "max_runtime").await;
    assert_code(
        exec(&mut c, exec_req(&id, "true", &[])).await,
        Code::FailedPrecondition,
        "exec past max_runtime",
    );
    // The sandbox was stopped when its time ran out, not only marked (its shim stays until
    // Destroy deletes the task).
    let runsc = || -> Vec<String> {
        processes_mentioning(&id)
            .into_iter()
            .filter(|p| p.contains("runsc"))
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(15);
    while !runsc().is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        runsc().is_empty(),
        "runsc processes of a sandbox past max_runtime: {:?}",
        runsc()
    );
    destroy(&mut c, &id).await;
    assert!(cgroups_of(&id).is_empty() && mounts_mentioning(&id).is_empty());

    // Killing the sandbox's runsc processes from the host: FAILED with a reason.
    let id = ready_sandbox(&mut c, create_req("t", "killed")).await;
    let pids: Vec<i32> =
        std::fs::read_to_string(format!("/sys/fs/cgroup/pids/compute/{id}/cgroup.procs"))
            .or_else(|_| {
                std::fs::read_to_string(format!("/sys/fs/cgroup/compute/{id}/cgroup.procs"))
            })
            .unwrap()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect();
    assert!(!pids.is_empty());
    for p in pids {
        sigkill(p);
    }
    wait_failed(&mut c, &id, Duration::from_secs(15), "exited").await;
    destroy(&mut c, &id).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(processes_mentioning(&id).is_empty());
}
