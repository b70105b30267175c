//! ExecCommand through the in-sandbox agent (agent = true): the same semantics as the
//! containerd path, faster; and the agent re-attached after a daemon restart.

mod common;

use std::time::{Duration, Instant};

use common::*;
use computed::api::compute::v1 as pb;

macro_rules! need {
    () => {
        if !prerequisites() {
            return;
        }
    };
}

async fn wait_agent(d: &Daemon) {
    let t = Instant::now();
    while !d.log_text().contains("agent attached") && !d.log_text().contains("agent re-attached") {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "agent never attached:\n{}",
            d.log_text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn execs_go_through_the_agent_with_every_semantic() {
    need!();
    let mut d = start("agent", "agent = true\ncancel_grace_secs = 1");
    let mut c = d.client().await;
    let mut req = create_req("t", "agent");
    req.limits = Some(pb::ResourceLimits {
        memory_bytes: 256 << 20,
        ..Default::default()
    });
    let id = ready_sandbox(&mut c, req).await;
    wait_agent(&d).await;
    // PID 1 is the agent.
    let o = exec(&mut c, exec_req(&id, "cat", &["/proc/1/cmdline"]))
        .await
        .unwrap();
    assert!(o.out().contains("sandbox-agent"), "{}", o.out());
    assert!(d.log_text().contains("exec completed (agent)"));

    // Output, env, working dir, exit codes, stderr.
    let mut r = exec_req(&id, "sh", &["-c", "echo $FOO; pwd; echo e >&2; exit 5"]);
    r.env.insert("FOO".into(), "it's".into());
    r.working_dir = "/tmp".into();
    let o = exec(&mut c, r).await.unwrap();
    assert_eq!(o.out(), "it's\n/tmp\n");
    assert_eq!(String::from_utf8_lossy(&o.stderr), "e\n");
    assert_eq!(o.code(), 5);
    let o = exec(
        &mut c,
        exec_req(
            &id,
            "python3",
            &["-c", "import socket; print(socket.gethostname())"],
        ),
    )
    .await
    .unwrap();
    assert_eq!(o.out(), format!("sandbox-{}\n", &id[..8]));
    assert!(o.completed.as_ref().unwrap().usage.unwrap().cpu_ms > 0);
    let o = exec(&mut c, exec_req(&id, "/no/such/thing", &[]))
        .await
        .unwrap();
    assert_eq!(o.code(), 127);
    // A signal death is 128 + N.
    let o = exec(&mut c, exec_req(&id, "sh", &["-c", "kill -9 $$"]))
        .await
        .unwrap();
    assert_eq!(o.code(), 137);

    // Streaming: the first chunk long before the end.
    let mut s = c
        .exec_command(exec_req(
            &id,
            "sh",
            &["-c", "echo first; sleep 2; echo second"],
        ))
        .await
        .unwrap()
        .into_inner();
    let t0 = Instant::now();
    let mut first_at = None;
    while let Some(ev) = s.message().await.unwrap() {
        if let Some(pb::exec_event::Event::Stdout(_)) = ev.event {
            first_at.get_or_insert(t0.elapsed());
        }
    }
    assert!(t0.elapsed() - first_at.unwrap() >= Duration::from_millis(1500));

    // Timeout.
    let mut r = exec_req(&id, "sleep", &["30"]);
    r.timeout = Some(prost_types::Duration {
        seconds: 1,
        nanos: 0,
    });
    let t = Instant::now();
    let o = exec(&mut c, r).await.unwrap();
    let done = o.completed.unwrap();
    assert!(done.timed_out && done.exit_code == 137 && t.elapsed() < Duration::from_secs(5));

    // Memory: killed, sandbox stays.
    let hog = "b = bytearray(400 * 1024 * 1024)\nfor i in range(0, len(b), 4096): b[i] = 1\nimport time; time.sleep(30)";
    let o = exec(&mut c, exec_req(&id, "python3", &["-c", hog]))
        .await
        .unwrap();
    let done = o.completed.unwrap();
    assert!(done.oom_killed && done.exit_code == 137, "{done:?}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(sh(&mut c, &id, "echo alive").await, "alive\n");

    // Cancellation: SIGTERM reaches the process.
    let mut s = c
        .exec_command(exec_req(&id, "sh", &["-c", "trap 'echo t > /workspace/term; exit 0' TERM; echo go; while :; do sleep 0.1; done"]))
        .await
        .unwrap()
        .into_inner();
    s.message().await.unwrap();
    drop(s);
    let t = Instant::now();
    let term = d.state_dir().join("workspaces").join(&id).join("data/term");
    while !term.exists() {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "SIGTERM never arrived"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Restart: the daemon re-attaches to the running agent; execs keep working through it.
    d.kill9();
    d.spawn();
    wait_agent(&d).await;
    let mut c = d.client().await;
    for i in 0..3 {
        assert_eq!(
            sh(&mut c, &id, &format!("echo after-{i}")).await,
            format!("after-{i}\n")
        );
    }
    assert!(d.log_text().matches("exec completed (agent)").count() >= 12);

    // The round trip, measured (the bench judges; this prints).
    let mut agent_ms = Vec::new();
    for _ in 0..10 {
        let t = Instant::now();
        exec(&mut c, exec_req(&id, "true", &[])).await.unwrap();
        agent_ms.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    agent_ms.sort_by(f64::total_cmp);
    eprintln!(
        "exec round trip of `true` through the agent: median {:.1} ms",
        agent_ms[5]
    );
    c.destroy_sandbox(pb::DestroySandboxRequest {
        sandbox_id: id.clone(),
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        processes_mentioning(&id).is_empty(),
        "{:?}",
        processes_mentioning(&id)
    );
}
