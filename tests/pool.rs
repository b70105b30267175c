//! The warm pool against real containerd + runsc: filling, claiming (limits, labels, a fresh
//! workspace, usage from zero), refilling, cold fallbacks, concurrent claims, recovery after a
//! daemon restart, capacity, and the operator's view.

#[macro_use]
mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::*;
use computed::api::compute::v1 as pb;
use computed::api::node::v1 as node_pb;
use tonic::Code;

/// `computectl ls -o json` of the daemon.
fn ls_json(d: &Daemon) -> Vec<serde_json::Value> {
    let o = d.computectl(&["ls", "-o", "json"]);
    assert_success(&o, "computectl ls");
    serde_json::from_slice::<serde_json::Value>(&o.stdout)
        .unwrap()
        .as_array()
        .unwrap()
        .clone()
}

/// Ids of the READY pool members, as computectl shows them.
fn pool_ids(d: &Daemon) -> BTreeSet<String> {
    ls_json(d)
        .iter()
        .filter(|s| s["pool"] == true && s["status"] == "READY")
        .map(|s| s["sandbox_id"].as_str().unwrap().to_string())
        .collect()
}

/// Waits until the pool has exactly `n` READY members; returns their ids.
fn wait_pool(d: &Daemon, n: usize) -> BTreeSet<String> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let ids = pool_ids(d);
        if ids.len() == n {
            return ids;
        }
        assert!(
            Instant::now() < deadline,
            "the pool never had {n} READY members (has {ids:?}); ls: {:?}",
            ls_json(d)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Waits until the pool is back to `n` READY members with no boot in flight, so that the
/// harness's cleanup does not race a task the refill loop is creating.
fn settle(d: &Daemon, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let all = ls_json(d);
        let ready = all
            .iter()
            .filter(|s| s["pool"] == true && s["status"] == "READY")
            .count();
        if ready == n && !all.iter().any(|s| s["status"] == "STARTING") {
            return;
        }
        assert!(Instant::now() < deadline, "the pool never settled: {all:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// containerd's labels of a container.
fn labels(d: &Daemon, id: &str) -> serde_json::Value {
    let info: serde_json::Value =
        serde_json::from_str(&d.ctr(&["containers", "info", id])).unwrap();
    info["Labels"].clone()
}

/// A cgroup file of a sandbox (v1 controller path or the v2 unified one).
fn cgroup_file(id: &str, v1: (&str, &str), v2: &str) -> String {
    std::fs::read_to_string(format!("/sys/fs/cgroup/{}/compute/{id}/{}", v1.0, v1.1))
        .or_else(|_| std::fs::read_to_string(format!("/sys/fs/cgroup/compute/{id}/{v2}")))
        .unwrap_or_else(|e| panic!("cgroup file {v2} of {id}: {e}"))
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

fn cpu_ns(id: &str) -> u64 {
    std::fs::read_to_string(format!("/sys/fs/cgroup/cpuacct/compute/{id}/cpuacct.usage"))
        .map(|s| s.trim().parse().unwrap())
        .or_else(|_| {
            std::fs::read_to_string(format!("/sys/fs/cgroup/compute/{id}/cpu.stat")).map(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("usage_usec "))
                    .unwrap()
                    .trim()
                    .parse::<u64>()
                    .unwrap()
                    * 1000
            })
        })
        .unwrap()
}

/// Creates a sandbox the pool serves: READY at once, one of `members`. Its id.
async fn claim(
    c: &mut Client,
    req: pb::CreateSandboxRequest,
    members: &BTreeSet<String>,
) -> String {
    let resp = create(c, req).await;
    assert_eq!(resp.status, SandboxStatus::Ready as i32);
    let id = resp.sandbox_id;
    assert!(members.contains(&id), "{id} is not one of {members:?}");
    id
}

/// Creates a sandbox the pool does not serve: none of `members`, booted cold; waits until it
/// is READY. What CreateSandbox answered.
async fn cold_create(
    c: &mut Client,
    req: pb::CreateSandboxRequest,
    members: &BTreeSet<String>,
) -> pb::CreateSandboxResponse {
    let cold = create(c, req).await;
    let id = &cold.sandbox_id;
    assert!(!members.contains(id), "{id} is a pool member");
    wait_status(c, id, SandboxStatus::Ready, Duration::from_secs(60)).await;
    cold
}

async fn node_info(d: &Daemon) -> node_pb::GetInfoResponse {
    node_pb::node_info_client::NodeInfoClient::new(channel(&d.addr).await)
        .get_info(node_pb::GetInfoRequest {})
        .await
        .unwrap()
        .into_inner()
}

const POOL: &str = "[[pool]]\nimage = \"compute.local/sandbox-python:latest\"\nsize = 2\n";

#[tokio::test(flavor = "multi_thread")]
async fn claim_gives_a_fresh_sandbox_with_its_own_limits_and_the_pool_refills() {
    need!();
    let (d, mut c) = start_client("pool-claim", POOL).await;
    let members = wait_pool(&d, 2);

    // The operator sees the members, marked as pool members; tenants do not.
    let o = d.computectl(&["ls"]);
    let table = String::from_utf8_lossy(&o.stdout).into_owned();
    for id in &members {
        let row = table.lines().find(|l| l.contains(id.as_str())).unwrap();
        assert!(row.contains("READY (pool)"), "{table}");
    }
    let member = members.iter().next().unwrap().clone();
    assert_code(
        try_describe(&mut c, &member).await,
        Code::NotFound,
        "a pool member belongs to nobody",
    );
    assert_eq!(labels(&d, &member)["compute.paper-board.io/pool"], "true");
    // A member is READY a moment before its agent attaches, and only then warm (what
    // NodeInfo counts): give the second one that moment.
    let deadline = Instant::now() + Duration::from_secs(10);
    let info = loop {
        let info = node_info(&d).await;
        if info.pool_sandboxes == 2 || Instant::now() > deadline {
            break info;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(info.pool_sandboxes, 2);
    assert_eq!(info.live_sandboxes, 2, "pool members count toward capacity");

    // A create that fits: READY at once, one of the members.
    let cpu_before: BTreeSet<(String, u64)> =
        members.iter().map(|m| (m.clone(), cpu_ns(m))).collect();
    let req = with_limits(create_req("tenant-p", "session-1"), 500, 256 << 20);
    let id = claim(&mut c, req, &members).await;
    let boot_cpu = cpu_before.iter().find(|(m, _)| *m == id).unwrap().1;
    assert!(boot_cpu > 0, "the member used CPU booting");

    // Usage starts at zero: nothing the member did before the claim is the tenant's.
    let desc = describe(&mut c, &id).await;
    let u = desc.current_usage.unwrap();
    let cpu_since = cpu_ns(&id) - boot_cpu;
    assert!(
        u.cpu_ms * 1_000_000 <= cpu_since + 1_000_000,
        "usage {} ms counts CPU from before the claim (only {cpu_since} ns since)",
        u.cpu_ms
    );
    assert_eq!(u.disk_write_bytes, 0);
    assert_eq!(desc.tenant_id, "tenant-p");
    assert_eq!(desc.session_id, "session-1");
    assert_eq!(desc.status, SandboxStatus::Ready as i32);
    assert!(desc.current_uptime.unwrap().seconds < 5);

    // The record in containerd is the tenant's now.
    let l = labels(&d, &id);
    assert_eq!(l["compute.paper-board.io/tenant-id"], "tenant-p");
    assert_eq!(l["compute.paper-board.io/session-id"], "session-1");
    assert_eq!(l["compute.paper-board.io/pool"], "false");
    assert_eq!(l["compute.paper-board.io/cpu-millis"], "500");
    assert_eq!(
        l["compute.paper-board.io/memory-bytes"],
        (256u64 << 20).to_string()
    );

    // The request's limits are in the running cgroup (memory with the default headroom).
    assert_eq!(
        cgroup_file(&id, ("cpu", "cpu.cfs_quota_us"), "cpu.max"),
        "50000"
    );
    assert_eq!(
        cgroup_file(&id, ("memory", "memory.limit_in_bytes"), "memory.max"),
        ((256u64 << 20) + (384 << 20)).to_string()
    );

    // It works, with an empty workspace, like a cold one. (Processes first, before any exec of
    // ours could leave a zombie behind with an init that does not reap.)
    let procs_warm = sh(&mut c, &id, "ls /proc | grep -c '^[0-9]'").await;
    assert_eq!(sh(&mut c, &id, "echo hi").await, "hi\n");
    assert_eq!(sh(&mut c, &id, "ls -A /workspace").await, "");
    let files = list_files(
        &mut c,
        pb::ListFilesRequest {
            recursive: true,
            max_entries: 100,
            ..list_req(&id, "/")
        },
    )
    .await;
    assert!(files.entries.is_empty(), "{:?}", files.entries);

    // The pool refills with a new member.
    let deadline = Instant::now() + Duration::from_secs(120);
    let refilled = loop {
        let ids = pool_ids(&d);
        if ids.len() == 2 && !ids.contains(&id) {
            break ids;
        }
        assert!(
            Instant::now() < deadline,
            "the pool did not refill: {ids:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(refilled.iter().any(|m| !members.contains(m)));

    // Same session again: the same sandbox, not another member.
    let again = create(&mut c, create_req("tenant-p", "session-1")).await;
    assert_eq!(again.sandbox_id, id);

    // A request that does not fit (another mount path) is created cold.
    let cold_req = with_workspace(create_req("tenant-p", "session-cold"), "", "", "/work");
    let cold = cold_create(&mut c, cold_req, &refilled).await;
    assert_eq!(cold.status, SandboxStatus::Starting as i32);
    let cold = cold.sandbox_id;
    assert_ne!(cold, id);
    let procs_cold = sh(&mut c, &cold, "ls /proc | grep -c '^[0-9]'").await;
    assert_eq!(
        procs_warm, procs_cold,
        "a claimed sandbox runs what a cold one runs"
    );

    // An alias of the pool's image fits: same image digest.
    let o = d.computectl(&["image", "alias", IMAGE, "compute.local/alias:1"]);
    assert_success(&o, "computectl image alias");
    let mut alias_req = create_req("tenant-q", "session-2");
    alias_req.image = "compute.local/alias:1".into();
    let aliased = create(&mut c, alias_req).await;
    assert!(refilled.contains(&aliased.sandbox_id));
    assert_eq!(
        describe(&mut c, &aliased.sandbox_id).await.image,
        "compute.local/alias:1"
    );

    // Hits and misses are counted; the pool size is exported.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let m = d.scrape();
        let hits = m.contains("compute_pool_claims_total{outcome=\"hit\"} 2");
        let misses = m.contains("compute_pool_claims_total{outcome=\"miss\"} 1");
        if hits && misses && m.contains("compute_pool_sandboxes{image=") {
            break;
        }
        assert!(Instant::now() < deadline, "pool metrics missing:\n{m}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // A claimed sandbox is destroyed like any other.
    let gone = destroy(&mut c, &id).await;
    assert_eq!(gone.sandbox_id, id);
    assert_eq!(status_of(&mut c, &id).await, SandboxStatus::Destroyed);
    settle(&d, 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn restart_recovers_members_and_claims_are_distinct_within_capacity() {
    need!();
    let mut d = start(
        "pool-restart",
        &format!("max_sandboxes = 4\n[[pool]]\nimage = {IMAGE:?}\nsize = 3\n"),
    );
    let members = wait_pool(&d, 3);

    // After a crash the members are found again as members (no new boots).
    d.kill9();
    d.spawn();
    assert_eq!(wait_pool(&d, 3), members);
    assert_eq!(
        labels(&d, members.iter().next().unwrap())["compute.paper-board.io/pool"],
        "true"
    );

    // Concurrent creates get distinct members.
    let mut tasks = Vec::new();
    for i in 0..3 {
        let mut c = d.client().await;
        tasks.push(tokio::spawn(async move {
            create(&mut c, create_req("tenant-c", &format!("s{i}"))).await
        }));
    }
    let mut claimed = BTreeSet::new();
    for t in tasks {
        let r = t.await.unwrap();
        assert_eq!(r.status, SandboxStatus::Ready as i32);
        assert!(members.contains(&r.sandbox_id));
        claimed.insert(r.sandbox_id);
    }
    assert_eq!(claimed, members, "three creates, three distinct members");
    let mut c = d.client().await;
    for id in &claimed {
        assert_eq!(describe(&mut c, id).await.tenant_id, "tenant-c");
        assert_eq!(sh(&mut c, id, "echo ok").await, "ok\n");
    }

    // Capacity: with three tenant sandboxes of four, the pool refills only one member.
    let refill = wait_pool(&d, 1);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(pool_ids(&d), refill, "the pool stays within max_sandboxes");
    let info = node_info(&d).await;
    assert_eq!((info.live_sandboxes, info.pool_sandboxes), (4, 1));

    // A claimed sandbox survives a restart as the tenant's.
    let first = claimed.iter().next().unwrap().clone();
    d.kill9();
    d.spawn();
    let mut c = d.client().await;
    let desc = describe(&mut c, &first).await;
    assert_eq!(
        (desc.tenant_id.as_str(), desc.status),
        ("tenant-c", SandboxStatus::Ready as i32)
    );
    assert_eq!(wait_pool(&d, 1), refill);

    // At the maximum, a create that does not fit takes the member's slot (cold)...
    let req = with_workspace(create_req("tenant-c", "s-cold"), "", "", "/w");
    cold_create(&mut c, req, &refill).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while !ls_json(&d).iter().all(|s| s["pool"] == false) {
        assert!(Instant::now() < deadline, "the member was not retired");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // ...and with four tenant sandboxes the node is full.
    assert_code(
        c.create_sandbox(create_req("tenant-c", "s-full")).await,
        Code::ResourceExhausted,
        "create on a full node",
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(pool_ids(&d).is_empty(), "no member boots on a full node");
}

#[tokio::test(flavor = "multi_thread")]
async fn with_the_agent_a_claimed_sandbox_execs_through_it_under_its_own_memory_limit() {
    need!();
    let (d, mut c) = start_client("pool-agent", &format!("agent = true\n{POOL}")).await;
    let members = wait_pool(&d, 2);
    // Both members' agents attach while they wait.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !members.iter().all(|m| {
        d.log_text()
            .contains(&format!("agent attached sandbox_id={m}"))
    }) {
        assert!(Instant::now() < deadline, "agents never attached");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let req = with_limits(create_req("t", "agent"), 1000, 256 << 20);
    let id = claim(&mut c, req, &members).await;
    let o = exec(&mut c, exec_req(&id, "cat", &["/proc/1/cmdline"]))
        .await
        .unwrap();
    assert!(o.out().contains("sandbox-agent"), "{}", o.out());
    assert!(d
        .log_text()
        .lines()
        .any(|l| l.contains("exec completed (agent)") && l.contains(&id)));
    // The member booted with the default 1 GiB; the claim's 256 MiB is what execs get.
    let hog = "b = bytearray(400 * 1024 * 1024)\n\
               for i in range(0, len(b), 4096): b[i] = 1\n\
               import time; time.sleep(30)";
    let done = exec(&mut c, exec_req(&id, "python3", &["-c", hog]))
        .await
        .unwrap()
        .completed
        .unwrap();
    assert_eq!(done.exit_code, 137);
    assert!(done.oom_killed);
    assert_eq!(status_of(&mut c, &id).await, SandboxStatus::Ready);
    settle(&d, 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_draining_node_boots_no_members() {
    need!();
    let d = start("pool-drain", &format!("draining = true\n{POOL}"));
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(ls_json(&d).is_empty(), "{:?}", ls_json(&d));
    assert!(!d.log_text().contains("booting pool member"));
    let info = node_info(&d).await;
    assert!(info.draining);
    assert_eq!(info.pool_sandboxes, 0);
}
