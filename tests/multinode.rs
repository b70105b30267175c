//! The cluster on one machine: three node daemons (each with its own containerd namespace,
//! state and ports) behind two router replicas with a static node list.

#[macro_use]
mod common;

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use common::relay::{harness, req, run, worker};
use common::router::RouterProc;
use common::*;
use computed::api::compute::v1 as pb;
use pb::compute_service_client::ComputeServiceClient;
use tonic::Code;

/// Which node daemon owns a sandbox, by asking each directly.
async fn owner(nodes: &[Daemon], id: &str) -> Option<usize> {
    for (i, d) in nodes.iter().enumerate() {
        let Ok(ch) = try_channel(&d.addr).await else {
            continue; // a killed node
        };
        if try_describe(&mut ComputeServiceClient::new(ch), id)
            .await
            .is_ok()
        {
            return Some(i);
        }
    }
    None
}

#[tokio::test(flavor = "multi_thread")]
async fn three_nodes_two_routers() {
    need!();
    let mut nodes: Vec<Daemon> = ["a", "b", "c"]
        .iter()
        .map(|n| {
            start(
                &format!("mn-{n}"),
                &format!("node_name = \"node-{n}\"\ncancel_grace_secs = 1"),
            )
        })
        .collect();
    // A fourth node, marked draining: it takes no new sandboxes.
    let drain = start("mn-d", "node_name = \"node-d\"\ndraining = true");
    let mut addrs: Vec<String> = nodes.iter().map(|d| d.addr.clone()).collect();
    addrs.push(drain.addr.clone());
    let list = addrs.join(",");
    let dir = tempfile::tempdir().unwrap();
    let mut r1 = RouterProc::start(&list, dir.path(), "1");
    let r2 = RouterProc::start(&list, dir.path(), "2");
    r1.wait_nodes().await;
    r2.wait_nodes().await;
    let mut c1 = r1.client().await;
    let mut c2 = r2.client().await;

    // Creates spread across the nodes.
    let mut ids = Vec::new();
    for i in 0..12 {
        let c = if i % 2 == 0 { &mut c1 } else { &mut c2 };
        ids.push(
            create(c, create_req("t", &format!("spread-{i}")))
                .await
                .sandbox_id,
        );
    }
    let mut per_node: HashMap<usize, usize> = HashMap::new();
    for id in &ids {
        *per_node
            .entry(owner(&nodes, id).await.expect("every sandbox is on a node"))
            .or_default() += 1;
    }
    assert!(per_node.len() >= 2, "creates did not spread: {per_node:?}");
    let mut dc = drain.client().await;
    for id in &ids {
        assert!(
            try_describe(&mut dc, id).await.is_err(),
            "a sandbox was placed on the draining node"
        );
    }
    // The draining node refuses a direct create too.
    assert_code(
        dc.create_sandbox(create_req("t", "direct")).await,
        Code::Unavailable,
        "create on the draining node",
    );

    // Every RPC through either replica.
    let id = ids[0].clone();
    let o = exec(&mut c2, exec_req(&id, "python3", &["-c", "print(6 * 7)"]))
        .await
        .unwrap();
    assert_eq!(o.out(), "42\n");
    write_file(&mut c1, &id, "r.txt", b"via router").await;
    assert_eq!(
        read_file(&mut c2, &id, "r.txt").await.data,
        &b"via router"[..]
    );
    assert_eq!(
        list_files(&mut c2, list_req(&id, ".")).await.entries.len(),
        1
    );
    let d = describe(&mut c1, &id).await;
    assert_eq!(d.status, SandboxStatus::Ready as i32);
    // Errors pass through with their codes.
    let unknown = uuid::Uuid::new_v4().to_string();
    assert_code(
        try_describe(&mut c1, &unknown).await,
        Code::NotFound,
        "describe an unknown id",
    );
    assert_code(
        try_describe(&mut c1, "x").await,
        Code::InvalidArgument,
        "describe a malformed id",
    );
    assert_code(
        c2.create_sandbox(create_req("", "s")).await,
        Code::InvalidArgument,
        "create without a tenant",
    );
    // Streaming and cancellation pass through: the node sees the client go away.
    let mut s = sh_stream(&mut c1, &id, "echo started; sleep 30").await;
    assert!(s.message().await.unwrap().is_some());
    drop(s);
    let owner_idx = owner(&nodes, &id).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !nodes[owner_idx]
        .log_text()
        .contains("exec cancelled by client")
    {
        assert!(
            Instant::now() < deadline,
            "cancellation did not reach the node"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // A router restart loses nothing: the new process finds owners by asking the nodes.
    r1.kill();
    r1.spawn();
    r1.wait_nodes().await;
    let mut c1 = r1.client().await;
    for id in &ids {
        assert_eq!(&describe(&mut c1, id).await.sandbox_id, id);
    }
    let o = exec(&mut c1, exec_req(&ids[1], "echo", &["after restart"]))
        .await
        .unwrap();
    assert_eq!(o.out(), "after restart\n");

    // One sandbox per session across replicas, under a parallel create storm.
    let mut handles = Vec::new();
    for i in 0..16 {
        let addr = if i % 2 == 0 {
            r1.addr.clone()
        } else {
            r2.addr.clone()
        };
        handles.push(tokio::spawn(async move {
            let mut c = ComputeServiceClient::new(channel(&addr).await);
            create(&mut c, create_req("t", "storm")).await.sandbox_id
        }));
    }
    let mut storm = HashSet::new();
    for h in handles {
        storm.insert(h.await.unwrap());
    }
    assert_eq!(
        storm.len(),
        1,
        "one session got several sandboxes: {storm:?}"
    );

    // The sandbox.v1 relay through the routers: a worker attaches through one replica, a
    // harness runs a command through the other.
    let ext = format!("ext-{}", uuid::Uuid::new_v4().simple());
    // Its credential: issued on one node, installed on the others (whichever node the
    // routers pick for this id checks it).
    let token = common::relay_token(&nodes[0], &ext, None);
    for d in nodes[1..].iter().chain([&drain]) {
        common::relay_token(d, &ext, Some(&token));
    }
    let w = worker(&r1.addr, &ext, &token, &["--heartbeat", "0.5"]);
    let mut h = harness(&r2.addr).await;
    let out = run(&mut h, req(&ext, 1, "echo through-the-router", true)).await;
    assert_eq!(out.output(), "through-the-router\n");
    drop(w);

    // A node that is gone: its sandboxes fail fast with UNAVAILABLE, the others keep working,
    // and new sandboxes go elsewhere.
    let victim = owner(&nodes, &ids[0]).await.unwrap();
    nodes[victim].kill9();
    let mut on_victim = None;
    let mut elsewhere = None;
    for id in &ids {
        match owner(&nodes, id).await {
            Some(i) if i != victim => elsewhere = Some(id.clone()),
            None => on_victim = Some(id.clone()),
            _ => {}
        }
    }
    let on_victim = on_victim.expect("a sandbox on the killed node");
    let elsewhere = elsewhere.expect("a sandbox on another node");
    tokio::time::sleep(Duration::from_secs(5)).await; // routers notice the node is gone
    for c in [&mut c1, &mut c2] {
        let t = Instant::now();
        assert_code(
            try_describe(c, &on_victim).await,
            Code::Unavailable,
            "describe on the killed node",
        );
        assert!(
            t.elapsed() < Duration::from_secs(3),
            "took {:?}",
            t.elapsed()
        );
        let o = exec(c, exec_req(&elsewhere, "echo", &["fine"]))
            .await
            .unwrap();
        assert_eq!(o.out(), "fine\n");
    }
    for i in 0..6 {
        let id = create(&mut c2, create_req("t", &format!("after-kill-{i}")))
            .await
            .sandbox_id;
        let at = owner(&nodes, &id).await;
        assert!(
            at.is_some() && at != Some(victim),
            "placed on the dead node"
        );
    }
    // Bring the node back (its sandboxes were never lost: it recovers them from containerd).
    nodes[victim].spawn();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(status_of(&mut c1, &on_victim).await, SandboxStatus::Ready);
}
