//! TLS between the router and the node daemons, and on the router's own listener: two nodes
//! that require client certificates behind routers with and without one, a TLS router in front
//! of a plaintext node, and the router's TLS flags that do not go together. Certificates are
//! made at test time with rcgen.

#[macro_use]
mod common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use common::pki::{write, Ca};
use common::relay::{harness_on, req, run, worker};
use common::router::{router_args, router_command, RouterProc};
use common::*;
use computed::api::compute::v1 as pb;
use computed::api::node::v1::node_info_client::NodeInfoClient;
use computed::api::node::v1::GetInfoRequest;
use pb::compute_service_client::ComputeServiceClient;
use rcgen::ExtendedKeyUsagePurpose::{ClientAuth, ServerAuth};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::Code;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

/// The name every node certificate carries besides 127.0.0.1 (for `--node-tls-server-name`).
const NODE_NAME: &str = "computed-node.test";

/// A CA and the PEM files the tests hand to nodes and routers.
struct Pki {
    dir: tempfile::TempDir,
    ca_pem: String,
    /// The CA's certificate.
    ca: String,
    /// The nodes' certificate and key (SANs 127.0.0.1 and [`NODE_NAME`]).
    node_cert: String,
    node_key: String,
    /// The router's client certificate and key.
    router_cert: String,
    router_key: String,
    /// The router listener's certificate and key (SANs localhost and 127.0.0.1).
    listener_cert: String,
    listener_key: String,
    /// A caller of the router: client certificate and key, PEM.
    operator: (String, String),
    /// Another CA's certificate.
    other_ca: String,
}

impl Pki {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let ca = Ca::new("compute test CA");
        let other = Ca::new("someone else's CA");
        let (nc, nk) = ca.leaf(&[NODE_NAME, "127.0.0.1"], ServerAuth);
        let (rc, rk) = ca.leaf(&["computed-router"], ClientAuth);
        let (lc, lk) = ca.leaf(&["localhost", "127.0.0.1"], ServerAuth);
        Pki {
            ca: write(d, "ca.pem", &ca.pem()),
            ca_pem: ca.pem(),
            node_cert: write(d, "node.pem", &nc),
            node_key: write(d, "node.key", &nk),
            router_cert: write(d, "router.pem", &rc),
            router_key: write(d, "router.key", &rk),
            listener_cert: write(d, "listener.pem", &lc),
            listener_key: write(d, "listener.key", &lk),
            operator: ca.leaf(&["operator"], ClientAuth),
            other_ca: write(d, "other-ca.pem", &other.pem()),
            dir,
        }
    }

    /// Node config lines: TLS on the TCP listener, client certificates from the CA required.
    fn node_config(&self, name: &str) -> String {
        format!(
            "node_name = {name:?}\ntls_cert = {:?}\ntls_key = {:?}\ntls_client_ca = {:?}\n",
            self.node_cert, self.node_key, self.ca
        )
    }

    /// Router flags for mutual TLS to the nodes.
    fn node_mtls(&self) -> Vec<&str> {
        vec![
            "--node-tls-ca",
            &self.ca,
            "--node-tls-cert",
            &self.router_cert,
            "--node-tls-key",
            &self.router_key,
        ]
    }
}

/// A channel to `addr` over TLS trusting `ca_pem`, presenting `client` if given.
async fn tls_channel(
    addr: &str,
    ca_pem: &str,
    client: Option<&(String, String)>,
) -> Result<Channel, String> {
    let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca_pem));
    if let Some((cert, key)) = client {
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    Endpoint::from_shared(format!("https://{addr}"))
        .unwrap()
        .tls_config(tls)
        .map_err(|e| e.to_string())?
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(30))
        .connect()
        .await
        .map_err(|e| format!("connect: {e:?}"))
}

async fn plain_channel(addr: &str) -> Channel {
    Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .timeout(Duration::from_secs(30))
        .connect()
        .await
        .unwrap()
}

/// gRPC health of the server behind `ch`: 1 = SERVING, 2 = NOT_SERVING.
async fn health(ch: Channel) -> Result<i32, tonic::Status> {
    Ok(HealthClient::new(ch)
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await?
        .into_inner()
        .status)
}

/// Polls the router's health until it is `want`.
async fn wait_health(ch: &Channel, want: i32, r: &RouterProc) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if health(ch.clone()).await.ok() == Some(want) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "router health never became {want}; log:\n{}",
            r.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Live sandboxes on a node, asked over its (plaintext) unix socket.
async fn live(d: &Daemon) -> u32 {
    NodeInfoClient::new(d.local_channel().await)
        .get_info(GetInfoRequest {})
        .await
        .unwrap()
        .into_inner()
        .live_sandboxes
}

/// A router that cannot talk to the nodes: NOT_SERVING, CreateSandbox and calls for a live
/// sandbox UNAVAILABLE, and the cause in its log.
async fn assert_cut_off(r: &RouterProc, live_id: &str, why: &str) {
    let ch = plain_channel(&r.addr).await;
    wait_health(&ch, 2, r).await;
    let mut c = ComputeServiceClient::new(ch);
    let e = c
        .create_sandbox(create_req("t", &format!("cut-off-{why}")))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{why}: create: {e:?}");
    assert_code(
        try_describe(&mut c, live_id).await,
        Code::Unavailable,
        &format!("{why}: describe"),
    );
    let e = exec(&mut c, exec_req(live_id, "echo", &["no"]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{why}: exec: {e:?}");
    let log = r.log_text();
    assert!(log.contains("node not answering"), "{why}: log:\n{log}");
    eprintln!(
        "{why}: {}",
        log.lines()
            .find(|l| l.contains("node not answering"))
            .unwrap_or("")
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn two_mtls_nodes_behind_routers() {
    need!();
    let pki = Pki::new();
    let nodes = [
        start("rtls-a", &pki.node_config("node-a")),
        start("rtls-b", &pki.node_config("node-b")),
    ];
    let list = nodes
        .iter()
        .map(|d| d.addr.clone())
        .collect::<Vec<_>>()
        .join(",");
    let logs = tempfile::tempdir().unwrap();

    // The whole path encrypted: callers → router over mutual TLS, router → nodes over mutual
    // TLS, each node verified against 127.0.0.1 (the host it is dialed at, an IP SAN).
    let mut flags = pki.node_mtls();
    flags.extend([
        "--tls-cert",
        &pki.listener_cert,
        "--tls-key",
        &pki.listener_key,
        "--tls-client-ca",
        &pki.ca,
    ]);
    let r = RouterProc::start_with(&list, logs.path(), "mtls", &flags);
    let ch = tls_channel(&r.addr, &pki.ca_pem, Some(&pki.operator))
        .await
        .unwrap();
    wait_health(&ch, 1, &r).await;
    // The router's listener wants a client certificate, and TLS.
    let refused = async {
        let ch = tls_channel(&r.addr, &pki.ca_pem, None).await?;
        health(ch).await.map_err(|e| e.to_string())
    };
    assert!(refused.await.is_err(), "a caller without a certificate");
    let plain = Channel::from_shared(format!("http://{}", r.addr))
        .unwrap()
        .timeout(Duration::from_secs(10))
        .connect()
        .await;
    if let Ok(p) = plain {
        assert!(
            health(p).await.is_err(),
            "plaintext to the router's TLS port"
        );
    }

    // The quickstart through it.
    let mut c = ComputeServiceClient::new(ch.clone());
    let id = ready_sandbox(&mut c, create_req("t", "quickstart")).await;
    let o = exec(
        &mut c,
        exec_req(
            &id,
            "python3",
            &["-c", "print('hello from gVisor over mTLS')"],
        ),
    )
    .await
    .unwrap();
    assert_eq!(
        (o.code(), o.out().as_str()),
        (0, "hello from gVisor over mTLS\n")
    );
    write_file(&mut c, &id, "hello.txt", b"through two TLS hops").await;
    let got = read_file(&mut c, &id, "hello.txt").await;
    assert_eq!(got.data, &b"through two TLS hops"[..]);
    assert_eq!(live(&nodes[0]).await + live(&nodes[1]).await, 1);
    destroy(&mut c, &id).await;
    assert_eq!(status_of(&mut c, &id).await, SandboxStatus::Destroyed);

    // The sandbox.v1 relay rides the same TLS channels: a worker attaches through a second
    // router (plaintext listener: the agent dials plaintext; nodes verified against
    // NODE_NAME), a harness runs a command through the first.
    let by_name = {
        let mut f = pki.node_mtls();
        f.extend(["--node-tls-server-name", NODE_NAME]);
        RouterProc::start_with(&list, logs.path(), "by-name", &f)
    };
    wait_health(&plain_channel(&by_name.addr).await, 1, &by_name).await;
    let ext = format!("ext-{}", uuid::Uuid::new_v4().simple());
    // Its credential, on both nodes (the router picks one for the id).
    let token = relay_token(&nodes[0], &ext, None);
    relay_token(&nodes[1], &ext, Some(&token));
    let w = worker(&by_name.addr, &ext, &token, &["--heartbeat", "0.5"]);
    let mut h = harness_on(ch.clone());
    let out = run(&mut h, req(&ext, 1, "echo relayed-over-mtls", true)).await;
    drop(w);
    assert_eq!(out.output(), "relayed-over-mtls\n");

    // A sandbox that stays, then routers that cannot reach the nodes: each gets nothing and
    // places nothing.
    let kept = ready_sandbox(&mut c, create_req("t", "kept")).await;
    let before = [live(&nodes[0]).await, live(&nodes[1]).await];
    let mut other_ca = vec!["--node-tls-ca", &pki.other_ca];
    other_ca.extend(&pki.node_mtls()[2..]);
    let mut wrong_name = pki.node_mtls();
    wrong_name.extend(["--node-tls-server-name", "other.test"]);
    let cut_off = [
        // The CA but no client certificate: the nodes refuse the handshake.
        ("no-client-cert", vec!["--node-tls-ca", &pki.ca]),
        // No TLS at all: the nodes speak only TLS.
        ("plaintext", vec![]),
        // The nodes' certificates do not chain to the router's CA.
        ("other-ca", other_ca),
        // The nodes' certificates are not valid for the name the router checks.
        ("wrong-name", wrong_name),
    ]
    .map(|(why, f)| (why, RouterProc::start_with(&list, logs.path(), why, &f)));
    for (why, r) in &cut_off {
        assert_cut_off(r, &kept, why).await;
    }
    assert_eq!(
        [live(&nodes[0]).await, live(&nodes[1]).await],
        before,
        "a cut-off router placed a sandbox"
    );
    // The good routers still work.
    let o = exec(&mut c, exec_req(&kept, "echo", &["still here"]))
        .await
        .unwrap();
    assert_eq!(o.out(), "still here\n");
    let d = describe(&mut by_name.client().await, &kept).await;
    assert_eq!(d.status, SandboxStatus::Ready as i32);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tls_router_does_not_downgrade_to_a_plaintext_node() {
    need!();
    let pki = Pki::new();
    let node = start("rtls-plain", "node_name = \"plain\"");
    let logs = tempfile::tempdir().unwrap();

    // The node list names no scheme: under TLS the node is dialed with https, its plaintext
    // listener fails the handshake, and the router places nothing there.
    let r = RouterProc::start_with(&node.addr, logs.path(), "tls", &pki.node_mtls());
    let ch = plain_channel(&r.addr).await;
    wait_health(&ch, 2, &r).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let e = ComputeServiceClient::new(ch)
        .create_sandbox(create_req("t", "downgrade"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
    assert_eq!(live(&node).await, 0, "placed over plaintext");
    assert!(r.log_text().contains("url=https://"), "{}", r.log_text());

    // Spelling the scheme out does not downgrade it either: a config error, before binding.
    let listen = free_addr();
    let url = format!("http://{}", node.addr);
    let mut args = router_args(&listen, &url);
    args.extend(pki.node_mtls().into_iter().map(String::from));
    let o = router_command().args(&args).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(64), "{err}");
    assert!(err.contains("does not downgrade"), "{err}");

    // The same node through a plaintext router works: the node was fine.
    let plain = RouterProc::start(&node.addr, logs.path(), "plain");
    plain.wait_nodes().await;
    let mut c = plain.client().await;
    let id = ready_sandbox(&mut c, create_req("t", "plain")).await;
    assert_eq!(live(&node).await, 1);
    destroy(&mut c, &id).await;
}

/// Bad TLS settings stop the router with one line and exit 64, before it binds a port. No
/// node is needed (nor root).
#[test]
fn bad_router_tls_settings_exit_64_before_binding() {
    let pki = Pki::new();
    let d = pki.dir.path();
    let garbage = write(d, "garbage.pem", "not a certificate\n");
    let (_, stray_key) = Ca::new("x").leaf(&["x"], ClientAuth);
    let stray_key = write(d, "stray.key", &stray_key);
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec![
                "--node-tls-ca",
                &pki.ca,
                "--node-tls-cert",
                &pki.router_cert,
            ],
            "--node-tls-cert needs --node-tls-key",
        ),
        (
            vec![
                "--node-tls-cert",
                &pki.router_cert,
                "--node-tls-key",
                &pki.router_key,
            ],
            "need --node-tls-ca",
        ),
        (
            vec!["--node-tls-ca", &pki.ca, "--node-tls-key", &pki.router_key],
            "--node-tls-key needs --node-tls-cert",
        ),
        (
            vec!["--node-tls-ca", "/nonexistent/ca.pem"],
            "/nonexistent/ca.pem",
        ),
        (vec!["--node-tls-ca", &garbage], "--node-tls-ca"),
        (
            vec![
                "--node-tls-ca",
                &pki.ca,
                "--node-tls-cert",
                &pki.router_cert,
                "--node-tls-key",
                &stray_key,
            ],
            "--node-tls-cert/--node-tls-key",
        ),
        (
            vec!["--node-tls-server-name", NODE_NAME],
            "needs --node-tls-ca",
        ),
        (
            vec!["--tls-cert", &pki.listener_cert],
            "--tls-cert needs --tls-key",
        ),
        (
            vec!["--tls-key", &pki.listener_key],
            "--tls-key needs --tls-cert",
        ),
        (vec!["--tls-client-ca", &pki.ca], "--tls-client-ca needs"),
        (
            vec![
                "--tls-cert",
                &pki.listener_cert,
                "--tls-key",
                &pki.listener_key,
                "--tls-client-ca",
                &garbage,
            ],
            "--tls-client-ca",
        ),
    ];
    for (flags, want) in cases {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let listen = listener.local_addr().unwrap().to_string();
        // Free the port: a router that got as far as binding would take it.
        drop(listener);
        let mut child = router_command()
            .args(router_args(&listen, "127.0.0.1:1"))
            .args(&flags)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            assert!(
                std::net::TcpStream::connect(&listen).is_err(),
                "{flags:?}: the router bound its port"
            );
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("{flags:?}: the router did not exit");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut err = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
        assert_eq!(status.code(), Some(64), "{flags:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{flags:?}: one line: {err}");
        assert!(
            err.starts_with("computed: ") && err.contains(want),
            "{flags:?}: want {want:?} in {err}"
        );
    }
    // Environment variables are the same settings (what a Kubernetes overlay sets).
    let o = router_command()
        .args([
            "router",
            "--listen",
            "127.0.0.1:1",
            "--nodes",
            "127.0.0.1:1",
        ])
        .env("COMPUTE_ROUTER_NODE_TLS_CERT", &pki.router_cert)
        .env("COMPUTE_ROUTER_NODE_TLS_KEY", &pki.router_key)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&o.stderr).contains("need --node-tls-ca"));
}
