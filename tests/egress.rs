//! Sandbox networks end to end (issue 20): real node daemons, real containerd and runsc, real
//! sandboxes with networks, and a fake internet, all inside network namespaces this test makes.
//!
//! Each test makes a "host" namespace (the node daemon runs in it through `nsenter --net`, so
//! its nft table, forwarding, conntrack and the sandboxes' veths are there) and a "world"
//! namespace joined to it by a veth (`up0`, the node's configured uplink) where
//! `tests/workers/egress_world.py` serves HTTP, TCP echo, TLS and DNS on addresses of
//! 198.18.0.0/15, a "metadata server" at 169.254.169.254 and a "cluster range" 198.18.5.0/24
//! that the node's configuration puts on its never-reachable list. No packet leaves them.

#[macro_use]
mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use common::*;
use computed::api::platform::v1 as pb;
use pb::exec_client_message::Msg as In;
use pb::exec_server_message::Msg as Out;
use pb::sandbox_service_client::SandboxServiceClient;
use tokio::sync::mpsc;
use tonic::transport::Channel;
use tonic::{Code, Streaming};

/// Runs `cmd` (split at spaces); fails the test when it fails.
fn run(cmd: &str) -> String {
    let args: Vec<&str> = cmd.split_whitespace().collect();
    let out = Command::new(args[0]).args(&args[1..]).output().unwrap();
    assert!(
        out.status.success(),
        "{cmd}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The addresses the world serves on (its eth0 holds them all).
/// The tests of this file run one at a time: a node runs one daemon, and each test's daemon
/// and fake internet are heavy enough on 2 cores that timing-bound checks (TTLs of 2 s, cuts
/// within 3 s) got flaky beside one another.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const WORLD: &str = "198.18.0.1";
const NAMED: &str = "198.18.0.10";
const DNS: &str = "198.18.0.53";
const NEVER_HOST: &str = "198.18.5.1";
const METADATA: &str = "169.254.169.254";
/// The node's own address on the uplink.
const NODE: &str = "198.18.0.254";

/// The namespaces of one test and the world's servers; removed on drop.
struct World {
    host: String,
    world: String,
    /// The node's interface (and sandbox namespace) prefix: /run/netns is the machine's, so
    /// every test's node has its own.
    prefix: String,
    servers: Vec<Child>,
}

impl Drop for World {
    fn drop(&mut self) {
        for s in &mut self.servers {
            let _ = s.kill();
            let _ = s.wait();
        }
        for n in [&self.host, &self.world] {
            let _ = Command::new("ip").args(["netns", "del", n]).status();
        }
        // Sandbox namespaces a failed test's node left behind (the node deletes its own).
        if let Ok(rd) = std::fs::read_dir("/run/netns") {
            for e in rd.flatten() {
                let n = e.file_name().to_string_lossy().into_owned();
                if n.starts_with(&self.prefix) {
                    let _ = Command::new("ip").args(["netns", "del", &n]).status();
                }
            }
        }
    }
}

impl World {
    /// Namespaces `eh<tag><pid>` and `ew<tag><pid>`, the uplink, the world's servers (`names`:
    /// NAME=ADDR answered by its DNS server with `ttl`).
    fn new(tag: &str, names: &[&str], ttl: u32) -> World {
        assert!(
            nix::unistd::geteuid().is_root(),
            "sandbox networks need root (network namespaces, nft)"
        );
        for tool in ["ip", "nft", "conntrack", "nsenter", "openssl"] {
            assert!(
                which(tool).is_some(),
                "{tool} is missing: scripts/install-deps"
            );
        }
        let p = std::process::id();
        let mut w = World {
            host: format!("eh{tag}{p}"),
            world: format!("ew{tag}{p}"),
            prefix: format!("e{tag}{}-", p % 10_000),
            servers: Vec::new(),
        };
        let (h, x) = (w.host.clone(), w.world.clone());
        for n in [&h, &x] {
            run(&format!("ip netns add {n}"));
            run(&format!("ip -n {n} link set lo up"));
        }
        run(&format!(
            "ip link add up0 netns {h} type veth peer name eth0 netns {x}"
        ));
        run(&format!("ip -n {h} addr add {NODE}/24 dev up0"));
        run(&format!("ip -n {h} link set up0 up"));
        run(&format!("ip -n {h} route add default via {WORLD}"));
        for a in [WORLD, NAMED, DNS, NEVER_HOST] {
            run(&format!("ip -n {x} addr add {a}/16 dev eth0"));
        }
        run(&format!("ip -n {x} addr add {METADATA}/16 dev eth0"));
        run(&format!("ip -n {x} link set eth0 up"));
        // Replies to the node's masqueraded address go back over the uplink.
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &x, "python3"])
            .arg(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/workers/egress_world.py"
            ))
            .args(["--dns-addr", DNS, "--ttl", &ttl.to_string()]);
        for a in [WORLD, NAMED, NEVER_HOST, METADATA] {
            cmd.args(["--addr", a]);
        }
        for n in names {
            cmd.args(["--name", n]);
        }
        w.serve(cmd);
        // The node itself: something listening on its uplink address, which no sandbox may
        // reach whatever it is granted.
        let mut node = Command::new("ip");
        node.args(["netns", "exec", &h, "python3", "-c"]).arg(
            "import socketserver as s\nclass E(s.BaseRequestHandler):\n    def handle(self):\n        self.request.sendall(self.request.recv(1))\n\
             s.TCPServer.allow_reuse_address = True\nsrv = s.ThreadingTCPServer(('0.0.0.0', 7000), E)\nprint('ready', flush=True)\nsrv.serve_forever()\n"
        );
        w.serve(node);
        w
    }

    /// Starts a server and waits for its "ready".
    fn serve(&mut self, mut cmd: Command) {
        use std::io::BufRead;
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "ready", "a world server did not start");
        // Keep reading (the DNS server prints its queries) so that it never blocks.
        std::thread::spawn(move || for _ in out.lines() {});
        self.servers.push(child);
    }

    /// A node daemon in the host namespace with `[egress]` on the uplink (the table and the
    /// interface prefix its own, the cluster range on its never list), `extra` added to it.
    /// `COMPUTE_TEST_EGRESS_NETWORK` (sandbox or host) sets `runsc_network` where a test
    /// does not: the whole file on the other stack, by hand.
    fn node(&self, name: &str, extra: &str) -> Daemon {
        let prefix = &self.prefix;
        let mut extra = extra.to_string();
        if let Ok(stack) = std::env::var("COMPUTE_TEST_EGRESS_NETWORK") {
            if !extra.contains("runsc_network") {
                // First: `extra` may open a table of its own.
                extra = format!("runsc_network = {stack:?}\n{extra}");
            }
        }
        start_with(
            name,
            &format!(
                "[egress]\nuplink = \"up0\"\niface_prefix = {prefix:?}\nnever = [\"198.18.5.0/24\"]\n{extra}"
            ),
            Options {
                netns: Some(self.host.clone()),
                ..Default::default()
            },
        )
    }

    /// IP-layer bytes the world's interface received and sent so far.
    fn world_bytes(&self) -> (u64, u64) {
        let dev = run(&format!("ip netns exec {} cat /proc/net/dev", self.world));
        let line = dev
            .lines()
            .find(|l| l.trim_start().starts_with("eth0:"))
            .expect("the world's eth0");
        let v: Vec<u64> = line
            .split_once(':')
            .unwrap()
            .1
            .split_whitespace()
            .map(|w| w.parse().unwrap())
            .collect();
        (v[0] - 14 * v[1], v[8] - 14 * v[9])
    }

    /// Lines of `cmd` run in the host namespace.
    fn in_host(&self, cmd: &str) -> String {
        run(&format!("ip netns exec {} {cmd}", self.host))
    }

    /// The output of shell `script` run in the host namespace (whatever its exit status).
    fn in_host_sh(&self, script: &str) -> String {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.host, "sh", "-c", script])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

fn msg(m: In) -> pb::ExecClientMessage {
    pb::ExecClientMessage { msg: Some(m) }
}

/// An exec of `sh -c script` in sandbox `id`, its stdin closed: its output as it comes.
async fn open(ch: &Channel, id: &str, script: &str) -> Streaming<pb::ExecServerMessage> {
    open_argv(ch, id, &["sh", "-c", script]).await
}

/// An exec of `argv` in sandbox `id`, its stdin closed: its output as it comes.
async fn open_argv(ch: &Channel, id: &str, argv: &[&str]) -> Streaming<pb::ExecServerMessage> {
    let (tx, rx) = mpsc::channel(2);
    tx.send(msg(In::Spec(pb::ExecSpec {
        sandbox_id: id.into(),
        argv: argv.iter().map(|a| a.to_string()).collect(),
        ..Default::default()
    })))
    .await
    .unwrap();
    drop(tx);
    SandboxServiceClient::new(ch.clone())
        .exec_in_sandbox(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner()
}

/// Reads `s` until its exit: (stdout and stderr, the exit).
async fn finish(s: &mut Streaming<pb::ExecServerMessage>, out: &mut String) -> pb::ExecExit {
    loop {
        let m = tokio::time::timeout(Duration::from_secs(60), s.message())
            .await
            .expect("an exit within 60 s")
            .unwrap()
            .and_then(|m| m.msg);
        match m {
            Some(Out::Stdout(d)) | Some(Out::Stderr(d)) => {
                out.push_str(&String::from_utf8_lossy(&d))
            }
            Some(Out::Exit(e)) => return e,
            None => panic!("no exit; output {out:?}"),
        }
    }
}

/// Runs `sh -c script` in `id`: its output and the exec's usage; fails unless it exits 0.
async fn sh_in(
    ch: &Channel,
    id: &str,
    script: &str,
) -> (String, computed::api::common::v1::UsageMetrics) {
    let mut s = open(ch, id, script).await;
    let mut out = String::new();
    let e = finish(&mut s, &mut out).await;
    assert_eq!(
        (e.code, e.termination),
        (0, pb::Termination::Exited as i32),
        "{script}: {out}"
    );
    (out, e.usage.expect("an exit carries its usage"))
}

/// Runs Python `code` in `id` (no shell between): its output; fails unless it exits 0.
async fn py(ch: &Channel, id: &str, code: &str) -> String {
    let mut s = open_argv(ch, id, &["python3", "-c", code]).await;
    let mut out = String::new();
    let e = finish(&mut s, &mut out).await;
    assert_eq!(e.code, 0, "{code}\n{out}");
    out.trim().to_string()
}

/// What a TCP connection from the sandbox to `addr:port` meets within a second: "open" (an
/// echo came back), "refused" (a reset: the table said no at once), "timeout" (dropped), or
/// the error's name.
async fn probe(ch: &Channel, id: &str, addr: &str, port: u16) -> String {
    let code = format!(
        "import socket\ns = socket.socket()\ns.settimeout(1)\ntry:\n    s.connect(('{addr}', {port}))\n    s.sendall(b'x')\n    print('open' if s.recv(1) == b'x' else 'closed')\n\
         except ConnectionRefusedError:\n    print('refused')\nexcept socket.timeout:\n    print('timeout')\nexcept OSError as e:\n    print(type(e).__name__)\n"
    );
    let (out, _) = sh_in(ch, id, &format!("python3 -c \"{code}\"")).await;
    out.trim().to_string()
}

fn rule(cidr: &str, ports: &[u32]) -> pb::EgressRule {
    pb::EgressRule {
        destination: Some(pb::egress_rule::Destination::Cidr(cidr.into())),
        ports: ports.to_vec(),
        protocol: pb::EgressProtocol::Tcp as i32,
    }
}

fn host_rule(name: &str, ports: &[u32]) -> pb::EgressRule {
    pb::EgressRule {
        destination: Some(pb::egress_rule::Destination::Host(name.into())),
        ports: ports.to_vec(),
        protocol: pb::EgressProtocol::Unspecified as i32,
    }
}

fn policy(rules: Vec<pb::EgressRule>) -> Option<pb::EgressPolicy> {
    Some(pb::EgressPolicy { rules })
}

/// Namespace `ns` with environment `env` whose base egress is `egress`.
async fn environment(ch: &Channel, ns: &str, env: &str, egress: Option<pb::EgressPolicy>) {
    environment_living(ch, ns, env, egress, 0).await;
}

/// Namespace `ns` with environment `env` whose base egress is `egress`, with a max lifetime
/// (0: none).
async fn environment_living(
    ch: &Channel,
    ns: &str,
    env: &str,
    egress: Option<pb::EgressPolicy>,
    max_lifetime_sec: u32,
) {
    let _ = pb::access_service_client::AccessServiceClient::new(ch.clone())
        .create_namespace(pb::CreateNamespaceRequest {
            name: ns.into(),
            ..Default::default()
        })
        .await;
    pb::environment_service_client::EnvironmentServiceClient::new(ch.clone())
        .create_environment(pb::CreateEnvironmentRequest {
            environment: Some(pb::Environment {
                namespace: ns.into(),
                name: env.into(),
                image: IMAGE.into(),
                egress,
                max_lifetime_sec,
                ..Default::default()
            }),
        })
        .await
        .unwrap();
}

/// An exec-only sandbox of `ns/env` (with `egress` as the request's base policy when given),
/// RUNNING.
async fn sandbox(ch: &Channel, ns: &str, env: &str, egress: Option<pb::EgressPolicy>) -> String {
    let mut s = SandboxServiceClient::new(ch.clone());
    let id = s
        .create_sandbox(pb::CreateSandboxRequest {
            namespace: ns.into(),
            environment: env.into(),
            exec_only: true,
            egress,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .sandbox_id;
    let t0 = Instant::now();
    while get(ch, &id).await.state != pb::SandboxState::Running as i32 {
        assert!(t0.elapsed() < Duration::from_secs(60), "{id} never RUNNING");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    id
}

async fn get(ch: &Channel, id: &str) -> pb::Sandbox {
    SandboxServiceClient::new(ch.clone())
        .get_sandbox(pb::GetSandboxRequest {
            sandbox_id: id.into(),
        })
        .await
        .unwrap()
        .into_inner()
}

async fn grant(
    ch: &Channel,
    id: &str,
    p: Option<pb::EgressPolicy>,
    ttl_sec: u32,
) -> Result<String, tonic::Status> {
    SandboxServiceClient::new(ch.clone())
        .grant_egress(pb::GrantEgressRequest {
            sandbox_id: id.into(),
            policy: p,
            ttl_sec,
            reason: format!("test grant, ttl {ttl_sec}"),
        })
        .await
        .map(|r| r.into_inner().grant_id)
}

async fn revoke(ch: &Channel, id: &str, grant_id: &str) -> Result<(), tonic::Status> {
    SandboxServiceClient::new(ch.clone())
        .revoke_egress(pb::RevokeEgressRequest {
            sandbox_id: id.into(),
            grant_id: grant_id.into(),
        })
        .await
        .map(|_| ())
}

/// The sandbox's address inside its network (from `ip addr` in it).
async fn address(ch: &Channel, id: &str) -> String {
    let (out, _) = sh_in(ch, id, "ip -4 addr show eth0").await;
    out.split_whitespace()
        .skip_while(|w| *w != "inet")
        .nth(1)
        .and_then(|a| a.split('/').next())
        .expect("an IPv4 address on eth0")
        .to_string()
}

/// `got` within 1 % of `want`, or within `slack` bytes (the few packets of the other direction
/// of a transfer, where one ARP frame that the world's interface also counts is over 1 %).
fn within_one_percent(what: &str, got: u64, want: u64, slack: u64) {
    let diff = got.abs_diff(want);
    assert!(
        diff as f64 <= want as f64 * 0.01 || diff <= slack,
        "{what}: metered {got} bytes, the world's interface saw {want} ({:.3} %)",
        diff as f64 * 100.0 / want.max(1) as f64
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn cidr_policies_live_grants_the_never_list_and_exact_bytes() {
    cidr_policies_on("sandbox").await;
}

/// The same with `[egress] runsc_network = "host"`: the host kernel's stack inside the
/// sandbox's namespace is held by the same table and metered alike.
#[tokio::test(flavor = "multi_thread")]
async fn on_the_host_stack_too_cidr_policies_live_grants_the_never_list_and_exact_bytes() {
    cidr_policies_on("host").await;
}

async fn cidr_policies_on(stack: &str) {
    need!();
    let _serial = SERIAL.lock().await;
    let w = World::new(if stack == "host" { "o" } else { "a" }, &[], 300);
    let d = w.node(
        &format!("egress-cidr-{stack}"),
        &format!("runsc_network = {stack:?}\n"),
    );
    let ch = d.local_channel().await;
    environment(&ch, "team", "closed", None).await;
    environment(
        &ch,
        "team",
        "web",
        policy(vec![rule(&format!("{WORLD}/32"), &[8000])]),
    )
    .await;
    let closed = sandbox(&ch, "team", "closed", None).await;
    let web = sandbox(&ch, "team", "web", None).await;

    // Deny-all without a policy; the base policy opens exactly its port.
    assert_eq!(probe(&ch, &closed, WORLD, 9000).await, "refused");
    let (out, _) = sh_in(
        &ch,
        &closed,
        &format!("python3 -c \"import urllib.request as u; u.urlopen('http://{WORLD}:8000/', timeout=2)\" 2>&1 | tail -1"),
    )
    .await;
    assert!(out.contains("Connection refused"), "{out}");
    assert_eq!(probe(&ch, &web, WORLD, 9000).await, "refused");
    let sb = get(&ch, &web).await;
    assert_eq!(
        sb.egress_base,
        policy(vec![rule(&format!("{WORLD}/32"), &[8000])])
    );
    assert!(
        get(&ch, &closed).await.egress_base.is_some(),
        "deny-all is a base policy too"
    );

    // Bytes: a 10 MiB download and a 10 MiB upload, metered per exec at the sandbox's veth,
    // against what the world's own interface counted at the IP layer.
    let before = w.world_bytes();
    let (out, down) = sh_in(
        &ch,
        &web,
        &format!("python3 -c \"import urllib.request as u; print(len(u.urlopen('http://{WORLD}:8000/blob', timeout=10).read()))\""),
    )
    .await;
    assert_eq!(out.trim(), (10 << 20).to_string());
    let after = w.world_bytes();
    eprintln!(
        "10 MiB download: metered in {} / out {}, world out {} / in {}",
        down.network_ingress_bytes,
        down.network_egress_bytes,
        after.1 - before.1,
        after.0 - before.0
    );
    within_one_percent(
        "download, ingress",
        down.network_ingress_bytes,
        after.1 - before.1,
        0,
    );
    within_one_percent(
        "download, egress",
        down.network_egress_bytes,
        after.0 - before.0,
        256,
    );
    let before = w.world_bytes();
    let (out, up) = sh_in(
        &ch,
        &web,
        &format!("python3 -c \"import urllib.request as u; print(u.urlopen(u.Request('http://{WORLD}:8000/upload', data=bytes(10 << 20)), timeout=10).read().decode())\""),
    )
    .await;
    assert_eq!(out.trim(), (10 << 20).to_string());
    let after = w.world_bytes();
    within_one_percent(
        "upload, egress",
        up.network_egress_bytes,
        after.0 - before.0,
        0,
    );
    within_one_percent(
        "upload, ingress",
        up.network_ingress_bytes,
        after.1 - before.1,
        256,
    );
    let total = get(&ch, &web).await.usage.unwrap();
    assert!(total.network_ingress_bytes >= down.network_ingress_bytes + up.network_ingress_bytes);
    assert!(total.network_egress_bytes >= down.network_egress_bytes + up.network_egress_bytes);

    // A grant is live at once, and only for what it names.
    let t0 = Instant::now();
    let g = grant(&ch, &web, policy(vec![rule("198.18.0.0/24", &[9000])]), 0)
        .await
        .unwrap();
    assert_eq!(probe(&ch, &web, WORLD, 9000).await, "open");
    eprintln!("grant → first connection through: {:?}", t0.elapsed());
    assert_eq!(probe(&ch, &web, WORLD, 9001).await, "refused");
    assert_eq!(
        probe(&ch, &closed, WORLD, 9000).await,
        "refused",
        "another sandbox's grant"
    );
    let sb = get(&ch, &web).await;
    assert_eq!(sb.egress_grants.len(), 1);
    assert_eq!(sb.egress_grants[0].grant_id, g);
    assert_eq!(sb.egress_grants[0].reason, "test grant, ttl 0");

    // Revoking cuts an open connection: an echo conversation going on through it breaks.
    let mut talk = open(
        &ch,
        &web,
        &format!("python3 -c \"\nimport socket, time\ns = socket.create_connection(('{WORLD}', 9000), timeout=5)\nprint('talking', flush=True)\n\
         try:\n    while True:\n        s.sendall(b'x')\n        if s.recv(1) != b'x':\n            break\n        time.sleep(0.05)\n    print('cut: closed')\n\
         except OSError as e:\n    print('cut:', type(e).__name__)\n\""),
    )
    .await;
    let mut out = String::new();
    while !out.contains("talking") {
        match s_next(&mut talk).await {
            Some(t) => out += &t,
            None => panic!("the conversation never started: {out}"),
        }
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let t0 = Instant::now();
    revoke(&ch, &web, &g).await.unwrap();
    let e = finish(&mut talk, &mut out).await;
    assert_eq!(e.code, 0, "{out}");
    assert!(out.contains("cut:"), "{out}");
    eprintln!(
        "revoke → the conversation cut: {:?} ({out:?})",
        t0.elapsed()
    );
    assert!(
        t0.elapsed() < Duration::from_secs(3),
        "the cut took {:?}",
        t0.elapsed()
    );
    assert_eq!(probe(&ch, &web, WORLD, 9000).await, "refused");
    assert!(get(&ch, &web).await.egress_grants.is_empty());
    assert_eq!(
        revoke(&ch, &web, &g).await.unwrap_err().code(),
        Code::NotFound
    );

    // A grant with a TTL ends by itself (and leaves the list); its end is audited with bytes.
    let g2 = grant(
        &ch,
        &web,
        policy(vec![rule(&format!("{WORLD}/32"), &[9002])]),
        2,
    )
    .await
    .unwrap();
    assert_eq!(probe(&ch, &web, WORLD, 9002).await, "open");
    let sb = get(&ch, &web).await;
    assert!(sb.egress_grants[0].expires_at.is_some());
    tokio::time::sleep(Duration::from_millis(2600)).await;
    assert_eq!(probe(&ch, &web, WORLD, 9002).await, "refused");
    assert!(
        get(&ch, &web).await.egress_grants.is_empty(),
        "an expired grant is omitted"
    );
    let audit = pb::access_service_client::AccessServiceClient::new(ch.clone())
        .list_audit_events(pb::ListAuditEventsRequest {
            namespace: "team".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .events;
    let ended: Vec<&pb::AuditEvent> = audit
        .iter()
        .filter(|e| e.detail.contains(&g2) && e.detail.contains("expired"))
        .collect();
    assert_eq!(ended.len(), 1, "{audit:#?}");
    assert!(
        ended[0].detail.contains("bytes egress"),
        "{}",
        ended[0].detail
    );
    assert!(
        audit
            .iter()
            .any(|e| e.method.ends_with("/GrantEgress") && e.detail.contains("test grant, ttl 2")),
        "the reason is in the audit log"
    );

    // The never-reachable list holds against 0.0.0.0/0; so do the node and other sandboxes.
    let other = address(&ch, &closed).await;
    let mut srv = open(&ch, &closed, "python3 -c \"\nimport socketserver as s\nclass E(s.BaseRequestHandler):\n    def handle(self):\n        self.request.sendall(self.request.recv(1))\nsrv = s.TCPServer(('0.0.0.0', 9000), E)\nprint('up', flush=True)\nsrv.serve_forever()\n\"").await;
    assert_eq!(s_next(&mut srv).await.as_deref().map(str::trim), Some("up"));
    let all = grant(
        &ch,
        &web,
        policy(vec![pb::EgressRule {
            destination: Some(pb::egress_rule::Destination::Cidr("0.0.0.0/0".into())),
            ports: vec![],
            protocol: pb::EgressProtocol::Unspecified as i32,
        }]),
        0,
    )
    .await
    .unwrap();
    assert_eq!(
        probe(&ch, &web, WORLD, 9001).await,
        "open",
        "the grant works"
    );
    for (addr, port, what) in [
        (METADATA, 9000, "the metadata address"),
        (NEVER_HOST, 9000, "a configured never-reachable range"),
        (NODE, 7000, "the node's own address"),
        (other.as_str(), 9000, "another sandbox"),
    ] {
        let got = probe(&ch, &web, addr, port).await;
        assert!(
            got == "timeout" || got == "refused",
            "{what} ({addr}:{port}): {got}"
        );
    }
    let gateway = address(&ch, &web)
        .await
        .rsplit_once('.')
        .map(|(a, b)| format!("{a}.{}", b.parse::<u8>().unwrap() - 1))
        .unwrap();
    let got = probe(&ch, &web, &gateway, 7000).await;
    assert!(
        got == "timeout" || got == "refused",
        "the node's side of the veth: {got}"
    );
    revoke(&ch, &web, &all).await.unwrap();

    // What GrantEgress and RevokeEgress refuse.
    assert_eq!(
        grant(&ch, &web, None, 0).await.unwrap_err().code(),
        Code::InvalidArgument
    );
    assert_eq!(
        grant(
            &ch,
            &web,
            policy(vec![rule(&format!("{WORLD}/32"), &[9000])]),
            86_401
        )
        .await
        .unwrap_err()
        .code(),
        Code::InvalidArgument
    );
    assert_eq!(
        revoke(&ch, &web, "").await.unwrap_err().code(),
        Code::InvalidArgument
    );
    assert_eq!(
        grant(
            &ch,
            "00000000-0000-4000-8000-000000000000",
            policy(vec![rule(&format!("{WORLD}/32"), &[9000])]),
            0
        )
        .await
        .unwrap_err()
        .code(),
        Code::NotFound
    );

    // runsc cannot checkpoint the host's sockets: on that stack a sandbox with a network is
    // not suspended (and runs on); on netstack it is, see the restarts test.
    if stack == "host" {
        suspend_is_refused(&ch, &web).await;
    }

    // Deleting a sandbox takes its network along: namespace, veth, table elements, conntrack.
    let web_addr = address(&ch, &web).await;
    let iface = w.prefix.clone();
    let before: Vec<String> = w
        .in_host("ip -o link")
        .lines()
        .filter(|l| l.contains(&iface))
        .map(String::from)
        .collect();
    assert_eq!(before.len(), 2, "{before:?}");
    for id in [&web, &closed] {
        SandboxServiceClient::new(ch.clone())
            .delete_sandbox(pb::DeleteSandboxRequest {
                sandbox_id: id.to_string(),
            })
            .await
            .unwrap();
    }
    let links = w.in_host("ip -o link");
    assert!(!links.contains(&iface), "{links}");
    let netns = run("ip netns list");
    assert!(!netns.contains(&iface), "{netns}");
    for set in ["sources", "grants4"] {
        let elements = w.in_host(&format!("nft list set inet compute {set}"));
        assert!(!elements.contains(&iface), "{elements}");
    }
    let ct = w.in_host(&format!("conntrack -L -s {web_addr}"));
    assert!(ct.trim().is_empty(), "{ct}");
}

/// The next piece of output of `s` (None at its end).
async fn s_next(s: &mut Streaming<pb::ExecServerMessage>) -> Option<String> {
    let m = tokio::time::timeout(Duration::from_secs(30), s.message())
        .await
        .expect("output within 30 s")
        .unwrap()?;
    match m.msg {
        Some(Out::Stdout(d)) | Some(Out::Stderr(d)) => {
            Some(String::from_utf8_lossy(&d).into_owned())
        }
        _ => None,
    }
}

/// Python that prints what resolving `name` gives: its addresses, or the error's name.
fn resolve(name: &str) -> String {
    format!(
        "import socket\ntry:\n    print(' '.join(sorted({{a[4][0] for a in socket.getaddrinfo('{name}', 80, socket.AF_INET)}})))\n\
         except socket.gaierror as e:\n    print('gaierror', e.errno)\n"
    )
}

/// Python that speaks TLS to `addr`:443 asking for `sni`: the server's line, or the error.
fn tls(addr: &str, sni: &str) -> String {
    format!(
        "import socket, ssl\nc = ssl.create_default_context()\nc.check_hostname = False\nc.verify_mode = ssl.CERT_NONE\n\
         try:\n    s = c.wrap_socket(socket.create_connection(('{addr}', 443), timeout=3), server_hostname='{sni}')\n    print(s.recv(100).decode().strip())\n\
         except (OSError, ssl.SSLError) as e:\n    print('refused', type(e).__name__)\n"
    )
}

/// Python that GETs `url` (its Host from the URL, or `host`): status and body, or the error.
fn http_get(url: &str, host: &str) -> String {
    format!(
        "import urllib.request as u, urllib.error as e\nr = u.Request('{url}')\n{set}\
         try:\n    x = u.urlopen(r, timeout=3)\n    print(x.status, x.read()[:200].decode().strip())\n\
         except e.HTTPError as h:\n    print(h.code, h.read().decode().strip())\nexcept OSError as o:\n    print('error', o)\n",
        set = if host.is_empty() {
            String::new()
        } else {
            format!("r.add_header('Host', '{host}')\n")
        }
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn dns_names_resolve_only_when_allowed_and_host_and_sni_are_checked() {
    need!();
    let _serial = SERIAL.lock().await;
    // a.test and b.test share an address, as names behind one CDN do; meta.test points at
    // the metadata address; web.test and echo.test at the world's main host. TTL 1 s (the
    // node keeps an address open at least dns_min_ttl_secs = 2).
    let w = World::new(
        "d",
        &[
            &format!("a.test={NAMED}"),
            &format!("b.test={NAMED}"),
            &format!("meta.test={METADATA}"),
            &format!("web.test={WORLD}"),
            &format!("echo.test={WORLD}"),
        ],
        1,
    );
    let d = w.node(
        "egress-dns",
        &format!("dns_upstream = \"{DNS}:53\"\ndns_min_ttl_secs = 2\n"),
    );
    let ch = d.local_channel().await;
    environment(
        &ch,
        "team",
        "names",
        policy(vec![host_rule("a.test", &[80, 443])]),
    )
    .await;
    let id = sandbox(&ch, "team", "names", None).await;

    // Only allowed names resolve; the answer opens their addresses on the rule's ports.
    assert_eq!(py(&ch, &id, &resolve("a.test")).await, NAMED);
    assert!(py(&ch, &id, &resolve("b.test"))
        .await
        .starts_with("gaierror"));
    assert!(py(&ch, &id, &resolve("web.test"))
        .await
        .starts_with("gaierror"));
    assert_eq!(
        py(&ch, &id, &http_get("http://a.test/", "")).await,
        "200 world a.test"
    );
    assert_eq!(py(&ch, &id, &tls("a.test", "a.test")).await, "tls a.test");
    // Every packet to port 53 is the node's, wherever it was sent.
    let q = format!(
        "import socket, struct\nq = struct.pack('>HHHHHH', 9, 0x100, 1, 0, 0, 0) + b'\\x01a\\x04test\\x00' + struct.pack('>HH', 1, 1)\n\
         u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\nu.settimeout(2)\nu.sendto(q, ('{WORLD}', 53))\nr = u.recv(512)\nprint(socket.inet_ntoa(r[-4:]))\n"
    );
    assert_eq!(py(&ch, &id, &q).await, NAMED);

    // The same address under another name: its Host or SNI is refused. Each program resolves
    // a.test right before it connects: the address is open only for the answer's TTL (2 s
    // here), which a loaded machine can spend between two programs, or on imports and loading
    // CA certificates (CI runs got "connection refused" for the 403).
    let fresh = |script: String| {
        format!(
            "import socket, ssl, urllib.request, urllib.error\n_connect = socket.create_connection\n\
             def _fresh(*a, **k):\n    socket.getaddrinfo('a.test', 80, socket.AF_INET)\n    return _connect(*a, **k)\n\
             socket.create_connection = _fresh\n{script}"
        )
    };
    let out = py(&ch, &id, &fresh(tls(NAMED, "b.test"))).await;
    assert!(out.starts_with("refused"), "{out}");
    let out = py(
        &ch,
        &id,
        &fresh(http_get(&format!("http://{NAMED}/"), "b.test")),
    )
    .await;
    assert!(out.starts_with("403"), "{out}");
    assert!(out.contains("b.test"), "the refusal says why: {out}");
    // No name at all (a bare address in the TLS hello), and a port the rule does not name.
    let out = py(&ch, &id, &fresh(tls(NAMED, NAMED))).await;
    assert!(out.starts_with("refused"), "{out}");
    assert_eq!(probe(&ch, &id, NAMED, 9000).await, "refused");
    // The proxy is not a door of its own: straight to its port is dropped.
    let gw = address(&ch, &id)
        .await
        .rsplit_once('.')
        .map(|(a, b)| format!("{a}.{}", b.parse::<u8>().unwrap() - 1))
        .unwrap();
    let got = probe(&ch, &id, &gw, 10080).await;
    assert!(
        got == "timeout" || got == "refused",
        "the proxy's own port: {got}"
    );

    // A resolved address closes again after its TTL (here the node's minimum, 2 s) unless
    // resolved again.
    assert_eq!(py(&ch, &id, &resolve("a.test")).await, NAMED);
    tokio::time::sleep(Duration::from_millis(3200)).await;
    let out = py(&ch, &id, &tls(NAMED, "a.test")).await;
    assert!(out.starts_with("refused"), "an expired address: {out}");
    assert_eq!(
        py(&ch, &id, &tls("a.test", "a.test")).await,
        "tls a.test",
        "resolved again"
    );

    // Bytes through the proxy are metered like any.
    let before = w.world_bytes();
    let (out, u) = sh_in(&ch, &id, "python3 -c \"import urllib.request as u; print(len(u.urlopen('http://a.test/blob', timeout=10).read()))\"").await;
    assert_eq!(out.trim(), (10 << 20).to_string());
    let after = w.world_bytes();
    // The proxy ends the sandbox's connection and opens its own to the world: two TCP
    // connections, segmented apart (the sandbox's veth moves large offloaded segments, the
    // world's interface may see one header per MSS), so the headers differ by up to ~4 % and
    // only the payload is the same. Metered: at least the payload, at most what the world saw.
    let (payload, world) = (10u64 << 20, after.1 - before.1);
    let got = u.network_ingress_bytes;
    assert!(
        got >= payload && got <= world + world / 100 && world - got.min(world) <= payload / 25,
        "download through the proxy: metered {got} bytes, payload {payload}, the world's \
         interface saw {world}"
    );

    // A name grant: resolving opens it on its ports; a name whose address is never
    // reachable resolves to nothing.
    let g = grant(&ch, &id, policy(vec![host_rule("echo.test", &[9000])]), 0)
        .await
        .unwrap();
    assert_eq!(py(&ch, &id, &resolve("echo.test")).await, WORLD);
    assert_eq!(probe(&ch, &id, WORLD, 9000).await, "open");
    assert_eq!(probe(&ch, &id, WORLD, 9001).await, "refused");
    let m = grant(&ch, &id, policy(vec![host_rule("meta.test", &[])]), 0)
        .await
        .unwrap();
    let out = py(&ch, &id, &resolve("meta.test")).await;
    assert!(out.is_empty() || out.starts_with("gaierror"), "{out}");
    revoke(&ch, &id, &m).await.unwrap();
    revoke(&ch, &id, &g).await.unwrap();
    assert_eq!(probe(&ch, &id, WORLD, 9000).await, "refused");
    assert!(py(&ch, &id, &resolve("echo.test"))
        .await
        .starts_with("gaierror"));

    // Revoking a name grant cuts the proxy's connections it carried. One connection (no
    // reconnecting: a new one after the cut would meet the table and wait out its timeout).
    let g = grant(&ch, &id, policy(vec![host_rule("web.test", &[80])]), 0)
        .await
        .unwrap();
    let mut talk = open_argv(&ch, &id, &["python3", "-c", "\nimport http.client, time\nc = http.client.HTTPConnection('web.test', 80, timeout=5)\nn = 0\n\
        try:\n    c.connect()\n    c.auto_open = 0\n    while True:\n        c.request('GET', '/')\n        r = c.getresponse()\n        r.read()\n        n += 1\n        if n == 3:\n            print('talking', flush=True)\n        time.sleep(0.05)\n\
        except Exception as e:\n    print('cut:', type(e).__name__, flush=True)\n"]).await;
    let mut out = String::new();
    while !out.contains("talking") {
        match s_next(&mut talk).await {
            Some(t) => out += &t,
            None => panic!("the conversation never started: {out}"),
        }
    }
    let t0 = Instant::now();
    revoke(&ch, &id, &g).await.unwrap();
    let e = finish(&mut talk, &mut out).await;
    assert_eq!(e.code, 0, "{out}");
    assert!(out.contains("cut:"), "{out}");
    assert!(
        t0.elapsed() < Duration::from_secs(3),
        "the cut took {:?}",
        t0.elapsed()
    );

    // A bad name is refused up front.
    let bad = grant(&ch, &id, policy(vec![host_rule("not a name", &[])]), 0).await;
    assert_eq!(bad.unwrap_err().code(), Code::InvalidArgument);
}

async fn suspend(ch: &Channel, id: &str) -> Result<pb::Sandbox, tonic::Status> {
    SandboxServiceClient::new(ch.clone())
        .suspend_sandbox(pb::SuspendSandboxRequest {
            sandbox_id: id.into(),
        })
        .await
        .map(|r| r.into_inner())
}

async fn resume(ch: &Channel, id: &str) -> Result<pb::Sandbox, tonic::Status> {
    SandboxServiceClient::new(ch.clone())
        .resume_sandbox(pb::ResumeSandboxRequest {
            sandbox_id: id.into(),
        })
        .await
        .map(|r| r.into_inner())
}

/// SuspendSandbox of `id` on the host's network stack (`runsc_network = "host"`), which runsc
/// cannot checkpoint: the node refuses and the sandbox runs on.
async fn suspend_is_refused(ch: &Channel, id: &str) {
    let e = suspend(ch, id).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("network"), "{e:?}");
    assert_eq!(get(ch, id).await.state, pb::SandboxState::Running as i32);
}

/// SuspendSandbox of `id` (SUSPENDED, its memory kept), then ResumeSandbox (RUNNING).
async fn suspend_and_resume(ch: &Channel, id: &str) {
    let sb = suspend(ch, id).await.unwrap();
    assert_eq!(sb.state, pb::SandboxState::Suspended as i32, "{sb:?}");
    let sb = resume(ch, id).await.unwrap();
    assert_eq!(sb.state, pb::SandboxState::Running as i32, "{sb:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn grants_and_counters_survive_restarts_and_suspends_and_nothing_is_left_behind() {
    need!();
    let _serial = SERIAL.lock().await;
    let w = World::new("r", &[], 300);
    let mut d = w.node("egress-restart", "");
    let ch = d.local_channel().await;
    environment(
        &ch,
        "team",
        "web",
        policy(vec![rule(&format!("{WORLD}/32"), &[8000])]),
    )
    .await;
    let id = sandbox(&ch, "team", "web", None).await;
    let g1 = grant(&ch, &id, policy(vec![rule("198.18.0.0/24", &[9000])]), 0)
        .await
        .unwrap();
    let g2 = grant(
        &ch,
        &id,
        policy(vec![rule(&format!("{WORLD}/32"), &[9001])]),
        600,
    )
    .await
    .unwrap();
    let (out, _) = sh_in(&ch, &id, &format!("python3 -c \"import urllib.request as u; print(len(u.urlopen('http://{WORLD}:8000/blob', timeout=10).read()))\"")).await;
    assert_eq!(out.trim(), (10 << 20).to_string());
    let before = get(&ch, &id).await;
    let used = before.usage.unwrap();
    assert!(used.network_ingress_bytes >= 10 << 20, "{used:?}");

    // kill -9 of the daemon: the grants, the table and the counters come back from the record.
    d.kill9();
    d.spawn();
    let ch = d.local_channel().await;
    let after = get(&ch, &id).await;
    let ids = |s: &pb::Sandbox| {
        let mut v: Vec<String> = s.egress_grants.iter().map(|g| g.grant_id.clone()).collect();
        v.sort();
        v
    };
    assert_eq!(ids(&after), ids(&before));
    assert_eq!(after.egress_grants, before.egress_grants);
    let now = after.usage.unwrap();
    assert!(
        now.network_ingress_bytes >= used.network_ingress_bytes,
        "{now:?} after {used:?}"
    );
    assert!(now.network_egress_bytes >= used.network_egress_bytes);
    assert_eq!(probe(&ch, &id, WORLD, 9000).await, "open");
    assert_eq!(probe(&ch, &id, WORLD, 9001).await, "open");
    assert_eq!(probe(&ch, &id, WORLD, 9002).await, "refused");

    // Suspended and resumed with its memory: the same interface and address again (runsc took
    // the address off the sandbox's side at boot; the node puts it back before the restore),
    // the same grants and policy in force, the counters going on. On the host's stack a
    // sandbox with a network is not suspended.
    let addr = address(&ch, &id).await;
    if std::env::var("COMPUTE_TEST_EGRESS_NETWORK").as_deref() == Ok("host") {
        suspend_is_refused(&ch, &id).await;
    } else {
        let (pid, _) = sh_in(&ch, &id, "setsid sleep 1000 >/dev/null 2>&1 & echo $!").await;
        suspend_and_resume(&ch, &id).await;
        let (alive, _) = sh_in(&ch, &id, &format!("kill -0 {} && echo alive", pid.trim())).await;
        assert_eq!(alive.trim(), "alive", "its memory was kept");
        // A checkpoint that cannot be restored: the failed restore took the address off the
        // interface again, and the cold start after it still has its network.
        suspend(&ch, &id).await.unwrap();
        let img = d
            .state_dir()
            .join("checkpoints")
            .join(&id)
            .join("checkpoint.img");
        assert!(img.exists(), "no {}", img.display());
        std::fs::write(&img, vec![0xa5u8; 1 << 20]).unwrap();
        let sb = resume(&ch, &id).await.unwrap();
        assert_eq!(sb.state, pb::SandboxState::Running as i32, "{sb:?}");
        let (alive, _) = sh_in(
            &ch,
            &id,
            &format!(
                "[ \"$(cat /proc/{}/comm 2>/dev/null)\" = sleep ] && echo alive || echo gone",
                pid.trim()
            ),
        )
        .await;
        assert_eq!(alive.trim(), "gone", "a cold start");
    }
    // The agent's capabilities outlived the kill -9: every exec, before and after it, went
    // through the agent (a process left by a containerd exec holds host descriptors that a
    // restore cannot give back).
    assert!(
        !d.log_text().contains("exec completed (containerd)"),
        "an exec went through containerd after the restart"
    );
    assert_eq!(address(&ch, &id).await, addr);
    assert_eq!(probe(&ch, &id, WORLD, 9000).await, "open");
    assert_eq!(probe(&ch, &id, WORLD, 9002).await, "refused");
    let resumed = get(&ch, &id).await;
    assert_eq!(ids(&resumed), ids(&before));
    let u = resumed.usage.unwrap();
    assert!(
        u.network_ingress_bytes >= now.network_ingress_bytes,
        "{u:?} after {now:?}"
    );
    revoke(&ch, &id, &g1).await.unwrap();
    assert_eq!(probe(&ch, &id, WORLD, 9000).await, "refused");
    assert_eq!(ids(&get(&ch, &id).await), vec![g2.clone()]);

    // A sandbox that vanished while the daemon was down (its container removed behind its
    // back) leaves nothing: the next start removes its namespace and veth.
    let gone = sandbox(&ch, "team", "web", None).await;
    let links = |w: &World| -> Vec<String> {
        w.in_host("ip -o link")
            .lines()
            .filter(|l| l.contains(&w.prefix))
            .map(String::from)
            .collect()
    };
    assert_eq!(links(&w).len(), 2);
    d.kill9();
    d.ctr(&["tasks", "kill", "-s", "SIGKILL", &gone]);
    std::thread::sleep(Duration::from_millis(500));
    d.ctr(&["tasks", "delete", "-f", &gone]);
    d.ctr(&["containers", "delete", &gone]);
    d.spawn();
    let ch = d.local_channel().await;
    assert_eq!(links(&w).len(), 1, "{:?}", links(&w));
    assert_eq!(
        probe(&ch, &id, WORLD, 9001).await,
        "open",
        "the survivor keeps its grant"
    );

    // kill -9, restart, delete: everything of the sandbox goes.
    d.kill9();
    d.spawn();
    let ch = d.local_channel().await;
    let addr = address(&ch, &id).await;
    SandboxServiceClient::new(ch.clone())
        .delete_sandbox(pb::DeleteSandboxRequest {
            sandbox_id: id.clone(),
        })
        .await
        .unwrap();
    assert!(links(&w).is_empty(), "{:?}", links(&w));
    assert!(!run("ip netns list").contains(&w.prefix));
    for set in ["sources", "grants4", "named4"] {
        let elements = w.in_host(&format!("nft list set inet compute {set}"));
        assert!(!elements.contains(&w.prefix), "{elements}");
    }
    let ct = w.in_host(&format!("conntrack -L -s {addr}"));
    assert!(ct.trim().is_empty(), "{ct}");
}

/// The base policy is the platform's "egress bootstrap": it lasts the sandbox's max lifetime,
/// or `[egress] bootstrap_secs` (24 h by default) without one; after it only grants open
/// anything, an open connection it carried is cut, and Get shows no base policy.
#[tokio::test(flavor = "multi_thread")]
async fn the_base_policy_ends_with_its_bootstrap_and_grants_go_on() {
    need!();
    let _serial = SERIAL.lock().await;
    let w = World::new("b", &[], 300);
    let d = w.node("egress-boot", "bootstrap_secs = 8");
    let ch = d.local_channel().await;
    let base = policy(vec![rule(&format!("{WORLD}/32"), &[9000])]);
    environment(&ch, "team", "short", base.clone()).await;
    environment_living(&ch, "team", "living", base.clone(), 3600).await;
    let short = sandbox(&ch, "team", "short", None).await;
    let created = Instant::now();
    let living = sandbox(&ch, "team", "living", None).await;
    assert_eq!(probe(&ch, &short, WORLD, 9000).await, "open");
    assert_eq!(get(&ch, &short).await.egress_base, base);
    // A grant that outlives the bootstrap.
    grant(
        &ch,
        &short,
        policy(vec![rule(&format!("{WORLD}/32"), &[9001])]),
        0,
    )
    .await
    .unwrap();
    // A conversation open across the bootstrap's end.
    let mut talk = open(
        &ch,
        &short,
        &format!("python3 -c \"\nimport socket, time\ns = socket.create_connection(('{WORLD}', 9000), timeout=5)\nprint('talking', flush=True)\n\
         try:\n    while True:\n        s.sendall(b'x')\n        if s.recv(1) != b'x':\n            break\n        time.sleep(0.05)\n    print('cut: closed')\n\
         except OSError as e:\n    print('cut:', type(e).__name__)\n\""),
    )
    .await;
    let mut out = String::new();
    while !out.contains("talking") {
        match s_next(&mut talk).await {
            Some(t) => out += &t,
            None => panic!("the conversation never started: {out}"),
        }
    }
    let e = tokio::time::timeout(Duration::from_secs(30), finish(&mut talk, &mut out))
        .await
        .expect("the bootstrap's end cuts its conversation");
    let at = created.elapsed();
    eprintln!("bootstrap of 8 s: the conversation cut {at:?} after the create ({out:?})");
    assert_eq!(e.code, 0, "{out}");
    assert!(out.contains("cut:"), "{out}");
    assert!(at >= Duration::from_secs(7), "cut too early: {at:?}");
    assert_eq!(probe(&ch, &short, WORLD, 9000).await, "refused");
    assert_eq!(probe(&ch, &short, WORLD, 9001).await, "open");
    assert_eq!(
        get(&ch, &short).await.egress_base,
        Some(pb::EgressPolicy::default())
    );
    // With a max lifetime the base policy lasts it.
    assert_eq!(probe(&ch, &living, WORLD, 9000).await, "open");
    assert_eq!(get(&ch, &living).await.egress_base, base);
}

/// `curl` in the host namespace against a preview URL (its host name resolved to the node's
/// proxy): "CODE BODY".
/// The forward-auth endpoint of the preview test (Python, in the node's namespace, on port
/// argv[1]): 204 for `user=alice` or `Bearer good`, else 302 to a login; one line per question.
const AUTH_ENDPOINT: &str = r#"
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        c, a = self.headers.get('Cookie') or '', self.headers.get('Authorization') or ''
        print(self.headers.get('X-Forwarded-Uri'), c, a, flush=True)
        if self.path != '/check' or self.headers.get('X-Preview-Port') != '8000':
            self.send_response(400); self.send_header('Content-Length', '0'); self.end_headers()
        elif c == 'user=alice' or a == 'Bearer good':
            self.send_response(204); self.end_headers()
        else:
            self.send_response(302); self.send_header('Location', 'https://login.test/')
            self.send_header('Content-Length', '8'); self.end_headers(); self.wfile.write(b'sign in\n')
    def log_message(self, *a): pass
http.server.HTTPServer(('127.0.0.1', int(sys.argv[1])), H).serve_forever()
"#;

fn preview_curl(w: &World, url: &str, extra: &str) -> String {
    let host = url
        .split("://")
        .nth(1)
        .and_then(|r| r.split('/').next())
        .unwrap()
        .to_string();
    let (name, port) = host.rsplit_once(':').unwrap();
    w.in_host_sh(&format!(
        "curl -s -m 10 -w '\n%{{http_code}}' --resolve {name}:{port}:127.0.0.1 {extra} '{url}'"
    ))
    .trim()
    .rsplit_once('\n')
    .map(|(body, code)| format!("{code} {}", body.trim()))
    .unwrap_or_default()
}

async fn expose(
    ch: &Channel,
    id: &str,
    port: u32,
    auth: pb::ExposureAuth,
    ttl_sec: u32,
) -> Result<pb::PortExposure, tonic::Status> {
    SandboxServiceClient::new(ch.clone())
        .expose_sandbox_port(pb::ExposeSandboxPortRequest {
            sandbox_id: id.into(),
            port,
            auth: auth as i32,
            ttl_sec,
        })
        .await
        .map(|r| r.into_inner())
}

/// Preview URLs (issue 21) through the node's proxy: a real `http.server` in a sandbox reached
/// by curl with a signed URL (its cookie after the redirect), refused with no, a wrong, another
/// port's or an expired token; public access; unexpose; the rejections; preview bytes metered.
#[tokio::test(flavor = "multi_thread")]
async fn preview_urls_reach_a_sandbox_app_by_curl_and_a_browser_through_node_and_router() {
    need!();
    let _serial = SERIAL.lock().await;
    let w = World::new("p", &[], 300);
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("preview.key");
    std::fs::write(&key, "k".repeat(40)).unwrap();
    // A forward-auth endpoint in the node's namespace: `user=alice` or `Bearer good` pass,
    // anything else is sent to a login; each question is a line of its log.
    let auth_log = dir.path().join("auth.log");
    let mut auth = Killed(
        Command::new("ip")
            .args([
                "netns",
                "exec",
                &w.host,
                "python3",
                "-c",
                AUTH_ENDPOINT,
                "18089",
            ])
            .stdout(std::fs::File::create(&auth_log).unwrap())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let d = w.node(
        "egress-preview",
        &format!(
            "[preview]\ndomain = \"preview.test\"\nlisten = \"0.0.0.0:18088\"\nscheme = \"http\"\n\
             public_port = 18088\nsigning_key_file = {key:?}\n\
             forward_auth_url = \"http://127.0.0.1:18089/check\"\n"
        ),
    );
    let ch = d.local_channel().await;
    environment(&ch, "team", "closed", None).await;
    let id = sandbox(&ch, "team", "closed", None).await;
    // The app (tests/preview/app.py): a page, 1 MiB, a page whose script talks WebSocket and
    // the WebSocket echo, served while this exec lives.
    let mut app = open(
        &ch,
        &id,
        &format!(
            "mkdir -p /tmp/site && cd /tmp/site && echo hello from the sandbox > index.html && \
             head -c 1048576 /dev/zero > big && cat > app.py <<'EOF_APP'\n{}\nEOF_APP\n\
             cat > app.html <<'EOF_APP'\n{}\nEOF_APP\n\
             python3 app.py /tmp/site 8000 >/dev/null 2>&1 & \
             until curl -s -o /dev/null http://127.0.0.1:8000/; do sleep 0.2; done; echo serving; wait",
            include_str!("preview/app.py"),
            include_str!("preview/app.html")
        ),
    )
    .await;
    assert_eq!(
        s_next(&mut app).await.as_deref().map(str::trim),
        Some("serving")
    );

    let signed = expose(&ch, &id, 8000, pb::ExposureAuth::Unspecified, 0)
        .await
        .unwrap();
    let base = format!("http://8000-{id}.preview.test:18088/");
    assert_eq!(
        signed.url,
        format!("{base}?preview_token={}", signed.access_token)
    );
    assert_eq!(signed.auth, pb::ExposureAuth::SignedUrl as i32);
    let expires = signed.expires_at.as_ref().unwrap().seconds;
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    assert!(
        (expires - now - 3600).abs() <= 5,
        "default ttl: {expires} vs {now}"
    );

    // The signed URL: a redirect that sets the cookie, then the app (curl follows with it).
    let jar = dir.path().join("jar");
    let first = preview_curl(&w, &signed.url, "");
    assert!(first.starts_with("303 "), "{first}");
    let page = preview_curl(
        &w,
        &signed.url,
        &format!("-L -c {} -b {}", jar.display(), jar.display()),
    );
    assert_eq!(page, "200 hello from the sandbox");
    // The cookie alone, again.
    assert_eq!(
        preview_curl(&w, &base, &format!("-b {}", jar.display())),
        "200 hello from the sandbox"
    );
    // No token, a wrong one, another port's: refused.
    assert!(preview_curl(&w, &base, "").starts_with("403 "));
    assert!(preview_curl(&w, &format!("{base}?preview_token=v1.1.2.3"), "").starts_with("403 "));
    let other = expose(&ch, &id, 8001, pb::ExposureAuth::SignedUrl, 0)
        .await
        .unwrap();
    let stolen = format!("{base}?preview_token={}", other.access_token);
    assert!(
        preview_curl(&w, &stolen, "").starts_with("403 "),
        "another port's token"
    );
    // An expired one.
    let short = expose(&ch, &id, 8000, pb::ExposureAuth::SignedUrl, 1)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(2100)).await;
    assert!(
        preview_curl(&w, &short.url, "").starts_with("403 "),
        "expired"
    );
    // The other sandbox port answers nothing: a valid token gets 502.
    assert!(preview_curl(&w, &other.url, "-L -c /dev/null").starts_with("502 "));

    // Public: no token; and the bytes it moves are the sandbox's.
    let public = expose(&ch, &id, 8000, pb::ExposureAuth::Public, 0)
        .await
        .unwrap();
    assert_eq!(public.url, base);
    assert!(public.access_token.is_empty() && public.expires_at.is_none());
    assert_eq!(preview_curl(&w, &base, ""), "200 hello from the sandbox");
    let usage = |sb: pb::Sandbox| {
        let u = sb.usage.expect("GetSandbox carries usage");
        (u.network_egress_bytes, u.network_ingress_bytes)
    };
    let before = usage(get(&ch, &id).await);
    let got = w.in_host(&format!(
        "curl -s -m 20 -o /dev/null -w %{{size_download}} --resolve 8000-{id}.preview.test:18088:127.0.0.1 {base}big"
    ));
    assert_eq!(got.trim(), "1048576");
    let after = usage(get(&ch, &id).await);
    assert!(
        after.0 - before.0 >= 1 << 20 && after.0 - before.0 < (1 << 20) + (256 << 10),
        "preview bytes out of the sandbox: {before:?} -> {after:?}"
    );
    let sb = get(&ch, &id).await;
    let ports: Vec<(u32, i32, String)> = sb
        .exposures
        .iter()
        .map(|e| (e.port, e.auth, e.url.clone()))
        .collect();
    assert_eq!(
        ports,
        [
            (8000, pb::ExposureAuth::Public as i32, base.clone()),
            (
                8001,
                pb::ExposureAuth::SignedUrl as i32,
                format!("http://8001-{id}.preview.test:18088/")
            ),
        ]
    );
    assert!(sb.exposures.iter().all(|e| e.access_token.is_empty()));

    // Unexposed: the public URL is gone; twice is a no-op.
    for _ in 0..2 {
        SandboxServiceClient::new(ch.clone())
            .unexpose_sandbox_port(pb::UnexposeSandboxPortRequest {
                sandbox_id: id.clone(),
                port: 8000,
            })
            .await
            .unwrap();
    }
    assert!(preview_curl(&w, &base, "").starts_with("404 "));

    // Forward auth: the endpoint decides, per credentials, remembered for a while.
    let fwd = expose(&ch, &id, 8000, pb::ExposureAuth::ForwardAuth, 0)
        .await
        .unwrap();
    assert_eq!(fwd.url, base);
    assert!(fwd.access_token.is_empty() && fwd.expires_at.is_none());
    let asked = |who: &str| {
        std::fs::read_to_string(&auth_log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains(who))
            .count()
    };
    let denied = w.in_host_sh(&format!(
        "curl -s -m 10 -o /dev/null -w '%{{http_code}} %{{redirect_url}}' \
         --resolve 8000-{id}.preview.test:18088:127.0.0.1 {base}"
    ));
    assert_eq!(denied.trim(), "302 https://login.test/", "to the login");
    for _ in 0..3 {
        assert_eq!(
            preview_curl(&w, &base, "-b user=alice"),
            "200 hello from the sandbox"
        );
    }
    assert_eq!(asked("user=alice"), 1, "an allow is remembered");
    assert_eq!(
        preview_curl(&w, &base, "-H 'Authorization: Bearer good'"),
        "200 hello from the sandbox"
    );
    assert!(preview_curl(&w, &base, "-H 'Authorization: Bearer bad'").starts_with("302 "));
    // The endpoint gone: what it allowed stays allowed for its cache time, anything new is
    // denied (fail closed).
    auth.0.kill().unwrap();
    auth.0.wait().unwrap();
    assert_eq!(
        preview_curl(&w, &base, "-b user=alice"),
        "200 hello from the sandbox"
    );
    let out = preview_curl(&w, &base, "-b 'user=alice; again=1'");
    assert!(out.starts_with("503 "), "fail closed: {out}");

    // A browser, through a router: headless Chromium opens a signed URL at the router's
    // preview listener, which goes to the node's, which goes to the app; the page's script
    // opens a WebSocket to its own origin (the cookie the signed URL set opens it) and
    // reports what the echo said.
    let ws = expose(&ch, &id, 8000, pb::ExposureAuth::SignedUrl, 0)
        .await
        .unwrap();
    let router_log = dir.path().join("router.log");
    let router_dir = dir.path().join("router");
    std::fs::create_dir_all(&router_dir).unwrap();
    let router = Killed(
        Command::new("ip")
            .args(["netns", "exec", &w.host, env!("CARGO_BIN_EXE_computed")])
            .args(["router", "--listen", "127.0.0.1:18090", "--nodes", &d.addr])
            .args(["--metrics-listen", ""])
            .arg("--platform-store")
            .arg(router_dir.join("platform.redb"))
            .arg("--socket")
            .arg(router_dir.join("router.sock"))
            .args([
                "--preview-listen",
                "127.0.0.1:18091",
                "--preview-domain",
                "preview.test",
                "--node-preview-port",
                "18088",
            ])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&router_log).unwrap())
            .spawn()
            .unwrap(),
    );
    let via_router = format!("http://8000-{id}.preview.test:18091/");
    let jar = dir.path().join("router-jar");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = preview_curl(
            &w,
            &format!("{via_router}?preview_token={}", ws.access_token),
            &format!("-L -c {} -b {}", jar.display(), jar.display()),
        );
        if out == "200 hello from the sandbox" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "through the router: {out}; its log:\n{}",
            std::fs::read_to_string(&router_log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(
        preview_curl(&w, &via_router, "").starts_with("403 "),
        "the node checks access behind the router too"
    );
    let other_host = "http://8000-0b5f6c1e-7d1a-4c6e-9a53-2f8f7b1d2c3a.preview.test:18091/";
    assert!(preview_curl(&w, other_host, "").starts_with("404 "));
    let shot = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/preview-chromium.png");
    let _ = std::fs::remove_file(&shot);
    let browser = w.in_host_sh(&format!(
        "timeout 90 chromium --headless=new --no-sandbox --disable-gpu --no-first-run \
         --user-data-dir={} --host-resolver-rules='MAP *.preview.test 127.0.0.1' \
         --window-size=900,300 --virtual-time-budget=8000 --screenshot={} \
         '{via_router}app.html?preview_token={}' 2>&1 | tail -n 3",
        dir.path().join("chromium").display(),
        shot.display(),
        ws.access_token
    ));
    let mut seen = String::new();
    for _ in 0..50 {
        seen = sh_in(&ch, &id, "cat /tmp/site/result 2>/dev/null || true")
            .await
            .0;
        if !seen.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        seen, "echo: hello over a WebSocket",
        "what the browser's page saw; chromium said: {browser}"
    );
    assert!(
        std::fs::metadata(&shot).is_ok_and(|m| m.len() > 1000),
        "a screenshot at {}: {browser}",
        shot.display()
    );
    drop(router);

    // A host name that is no preview.
    let nothing = w.in_host(
        "curl -s -m 5 -o /dev/null -w %{http_code} -H Host:example.com http://127.0.0.1:18088/",
    );
    assert_eq!(nothing.trim(), "404");

    // The rejections.
    for (port, auth, ttl, code) in [
        (80, pb::ExposureAuth::Public, 0, Code::InvalidArgument),
        (53, pb::ExposureAuth::Public, 0, Code::InvalidArgument),
        (443, pb::ExposureAuth::Public, 0, Code::InvalidArgument),
        (0, pb::ExposureAuth::Public, 0, Code::InvalidArgument),
        (65536, pb::ExposureAuth::Public, 0, Code::InvalidArgument),
        (
            8000,
            pb::ExposureAuth::SignedUrl,
            86401,
            Code::InvalidArgument,
        ),
    ] {
        let e = expose(&ch, &id, port, auth, ttl).await.unwrap_err();
        assert_eq!(e.code(), code, "port {port} {auth:?} ttl {ttl}: {e:?}");
    }
    let e = expose(
        &ch,
        "0b5f6c1e-7d1a-4c6e-9a53-2f8f7b1d2c3a",
        8000,
        pb::ExposureAuth::Public,
        0,
    )
    .await
    .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);

    // The exposures are the sandbox's record: a restarted node still has them.
    drop(app);
    let mut d = d;
    d.kill9();
    d.spawn();
    let ch = d.local_channel().await;
    let sb = get(&ch, &id).await;
    let ports: Vec<(u32, i32)> = sb.exposures.iter().map(|e| (e.port, e.auth)).collect();
    assert_eq!(
        ports,
        [
            (8000, pb::ExposureAuth::SignedUrl as i32),
            (8001, pb::ExposureAuth::SignedUrl as i32)
        ]
    );

    // Suspended: the URL answers a clear page (and when to try again) instead of an error.
    let mut app = open(
        &ch,
        &id,
        "cd /tmp/site && python3 app.py /tmp/site 8000 >/dev/null 2>&1 & \
         until curl -s -o /dev/null http://127.0.0.1:8000/; do sleep 0.2; done; echo serving; wait",
    )
    .await;
    assert_eq!(
        s_next(&mut app).await.as_deref().map(str::trim),
        Some("serving")
    );
    let cookie = format!("-b {}", jar.display());
    assert_eq!(
        preview_curl(&w, &base, &cookie),
        "200 hello from the sandbox"
    );
    suspend(&ch, &id).await.unwrap();
    let page = w.in_host(&format!(
        "curl -s -m 10 -i -b {} --resolve 8000-{id}.preview.test:18088:127.0.0.1 {base}",
        jar.display()
    ));
    assert!(page.starts_with("HTTP/1.1 503"), "{page}");
    assert!(
        page.to_ascii_lowercase().contains("retry-after: 5"),
        "{page}"
    );
    assert!(page.contains("suspended"), "{page}");
    // Resumed: the same app (its memory kept: the server process, its listening socket and
    // the exec serving it) answers through the same URL and cookie again.
    let resumed = resume(&ch, &id).await.unwrap();
    assert_eq!(resumed.state, pb::SandboxState::Running as i32);
    assert_eq!(
        preview_curl(&w, &base, &cookie),
        "200 hello from the sandbox"
    );
    assert_eq!(
        preview_curl(
            &w,
            &signed.url,
            &format!("-L -b {} -c {}", jar.display(), jar.display())
        ),
        "200 hello from the sandbox"
    );
    drop(app);
    SandboxServiceClient::new(ch.clone())
        .delete_sandbox(pb::DeleteSandboxRequest {
            sandbox_id: id.clone(),
        })
        .await
        .unwrap();
}
