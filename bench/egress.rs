//! Sandbox networks (issue 20), group `egress`. A second node daemon runs in a network
//! namespace the bench makes ("host"), with `[egress]` on an uplink to a fake internet in
//! another ("world", `tests/workers/egress_world.py` on 198.18.0.1); a third namespace
//! ("plain") is joined to the world by a veth of its own, with no sandbox and no daemon: the
//! baseline of the transfer. No packet leaves these namespaces.
//!
//! * `egress_create_to_running`: platform CreateSandbox (exec only) until GetSandbox, polled
//!   every 5 ms, says RUNNING, on the node with networks (namespace, veth, table elements,
//!   `--network=sandbox`) against the same on the bench's node without them, in turns; target
//!   ratio <= 1.15;
//! * `egress_tcp_throughput`: a bulk TCP upload with 1 MiB writes (python3 in the sandbox,
//!   what iperf measures) to the world's sink, against the same from the plain namespace;
//!   target ratio >= 0.5; `egress_tcp_download` the other way (1 MiB reads);
//! * `egress_http_upload`, `egress_http_download`: the same blob by `curl` over HTTP (its own
//!   figures, `speed_upload` and `speed_download`; its 64 KiB writes and 16 KiB reads make it
//!   a measure of the sandbox's system call cost as much as of its network);
//! * `egress_grant_to_effect`: a prober in the sandbox connects every millisecond to a port no
//!   rule opens and prints the time it first gets through; from just before GrantEgress is
//!   sent until then;
//! * `egress_revoke_to_cut`: a conversation in the sandbox echoes a byte every millisecond
//!   through a granted port and prints the time it breaks; from just before RevokeEgress is
//!   sent until then. The baseline of both: `nft -f` of one element into a scratch table of
//!   the plain namespace, the kernel's own cost of a rule change.
//! * `preview_request`, `preview_throughput` (issue 21): the same node serves `[preview]`; a
//!   `python3 -m http.server` in a sandbox is reached through its preview proxy and straight
//!   at the sandbox's address, from the node's namespace: a small GET's latency in turns
//!   (target p50 overhead <= 1 ms), and a download's speed (target ratio >= 0.7).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Context, Result};
use computed::api::platform::v1 as ppb;
use tokio_stream::StreamExt;
use tonic::transport::Channel;

use crate::ours::Ours;
use crate::stats::{Better, Dist, Scenario, Side};
use crate::target::{Target, IMAGE};

type Sbx = ppb::sandbox_service_client::SandboxServiceClient<Channel>;

const WORLD: &str = "198.18.0.1";
const PLAIN_WORLD: &str = "198.18.1.1";
const NS: &str = "bench-net";

/// The bench's namespaces and the world's server; removed on drop.
struct Net {
    host: String,
    world: String,
    plain: String,
    server: Option<Child>,
}

impl Drop for Net {
    fn drop(&mut self) {
        if let Some(mut s) = self.server.take() {
            let _ = s.kill();
            let _ = s.wait();
        }
        for n in [&self.host, &self.world, &self.plain] {
            let _ = Command::new("ip").args(["netns", "del", n]).status();
        }
    }
}

fn run(cmd: &str) -> Result<String> {
    let args: Vec<&str> = cmd.split_whitespace().collect();
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .with_context(|| format!("run {cmd}"))?;
    if !out.status.success() {
        bail!("{cmd}: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

impl Net {
    fn new(blob: usize) -> Result<Net> {
        let p = std::process::id();
        let mut net = Net {
            host: format!("bnh{p}"),
            world: format!("bnw{p}"),
            plain: format!("bnp{p}"),
            server: None,
        };
        let (h, w, x) = (net.host.clone(), net.world.clone(), net.plain.clone());
        for n in [&h, &w, &x] {
            run(&format!("ip netns add {n}"))?;
            run(&format!("ip -n {n} link set lo up"))?;
        }
        for cmd in [
            format!("ip link add up0 netns {h} type veth peer name eth0 netns {w}"),
            format!("ip link add eth0 netns {x} type veth peer name eth1 netns {w}"),
            format!("ip -n {h} addr add 198.18.0.254/24 dev up0"),
            format!("ip -n {w} addr add {WORLD}/24 dev eth0"),
            format!("ip -n {w} addr add {PLAIN_WORLD}/24 dev eth1"),
            format!("ip -n {x} addr add 198.18.1.2/24 dev eth0"),
            format!("ip -n {h} link set up0 up"),
            format!("ip -n {w} link set eth0 up"),
            format!("ip -n {w} link set eth1 up"),
            format!("ip -n {x} link set eth0 up"),
            format!("ip -n {h} route add default via {WORLD}"),
        ] {
            run(&cmd)?;
        }
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/workers/egress_world.py");
        let mut child = Command::new("ip")
            .args(["netns", "exec", &w, "python3"])
            .arg(&script)
            .args(["--addr", WORLD, "--addr", PLAIN_WORLD])
            .args(["--blob-bytes", &blob.to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("start the world's servers")?;
        let mut line = String::new();
        use std::io::BufRead;
        std::io::BufReader::new(child.stdout.take().context("stdout")?).read_line(&mut line)?;
        net.server = Some(child);
        if line.trim() != "ready" {
            bail!("the world's servers did not start");
        }
        Ok(net)
    }
}

/// Environment `web` in namespace `bench-net` on the daemon behind `root`: base policy port
/// 8000 of the world.
async fn setup(root: Channel) -> Result<Sbx> {
    crate::platform::environment(
        &root,
        ppb::Environment {
            namespace: NS.into(),
            name: "web".into(),
            image: IMAGE.into(),
            egress: Some(ppb::EgressPolicy {
                rules: [8000, 9100, 9101]
                    .map(|p| rule(&format!("{WORLD}/32"), p))
                    .to_vec(),
            }),
            ..Default::default()
        },
    )
    .await;
    Ok(Sbx::new(root))
}

fn rule(cidr: &str, port: u32) -> ppb::EgressRule {
    ppb::EgressRule {
        destination: Some(ppb::egress_rule::Destination::Cidr(cidr.into())),
        ports: vec![port],
        protocol: ppb::EgressProtocol::Tcp as i32,
    }
}

/// CreateSandbox (exec only) until RUNNING: (id, ms).
async fn create_running(s: &mut Sbx) -> Result<(String, f64)> {
    let t0 = Instant::now();
    let id = s
        .create_sandbox(ppb::CreateSandboxRequest {
            namespace: NS.into(),
            environment: "web".into(),
            exec_only: true,
            ..Default::default()
        })
        .await?
        .into_inner()
        .sandbox_id;
    loop {
        let sb = s
            .get_sandbox(ppb::GetSandboxRequest {
                sandbox_id: id.clone(),
            })
            .await?
            .into_inner();
        if sb.state == ppb::SandboxState::Running as i32 {
            return Ok((id, t0.elapsed().as_secs_f64() * 1000.0));
        }
        if sb.state == ppb::SandboxState::Failed as i32 || t0.elapsed() > Duration::from_secs(60) {
            bail!("{id} never RUNNING: {}", sb.state_reason);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn delete(s: &mut Sbx, id: &str) {
    let _ = s
        .delete_sandbox(ppb::DeleteSandboxRequest {
            sandbox_id: id.into(),
        })
        .await;
}

/// Starts `argv` in `id`; its output, as it comes.
async fn start(
    s: &mut Sbx,
    id: &str,
    argv: &[&str],
) -> Result<tonic::Streaming<ppb::ExecServerMessage>> {
    let spec = ppb::ExecClientMessage {
        msg: Some(ppb::exec_client_message::Msg::Spec(ppb::ExecSpec {
            sandbox_id: id.into(),
            argv: argv.iter().map(|a| a.to_string()).collect(),
            ..Default::default()
        })),
    };
    Ok(s.exec_in_sandbox(tokio_stream::iter([spec]))
        .await?
        .into_inner())
}

/// The exec's whole output (stdout and stderr) until its exit.
async fn output(mut out: tonic::Streaming<ppb::ExecServerMessage>) -> Result<String> {
    let mut text = String::new();
    while let Some(m) = tokio::time::timeout(Duration::from_secs(120), out.next())
        .await
        .context("an exec took over 120 s")?
    {
        match m?.msg {
            Some(ppb::exec_server_message::Msg::Stdout(d))
            | Some(ppb::exec_server_message::Msg::Stderr(d)) => {
                text.push_str(&String::from_utf8_lossy(&d))
            }
            _ => {}
        }
    }
    Ok(text)
}

/// The next line of an exec's output.
async fn line(out: &mut tonic::Streaming<ppb::ExecServerMessage>) -> Result<String> {
    let mut text = String::new();
    while !text.contains('\n') {
        match tokio::time::timeout(Duration::from_secs(30), out.next())
            .await
            .context("no output in 30 s")?
        {
            Some(m) => match m?.msg {
                Some(ppb::exec_server_message::Msg::Stdout(d)) => {
                    text.push_str(&String::from_utf8_lossy(&d))
                }
                Some(ppb::exec_server_message::Msg::Stderr(d)) => {
                    bail!("{}", String::from_utf8_lossy(&d))
                }
                _ => bail!("the exec ended: {text}"),
            },
            None => bail!("the exec ended: {text}"),
        }
    }
    Ok(text.trim().to_string())
}

fn epoch() -> f64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// `curl`'s own download speed of the world's blob, MB/s.
fn curl_speed(text: &str) -> Result<f64> {
    let bps: f64 = text
        .trim()
        .parse()
        .with_context(|| format!("curl said {text:?}"))?;
    Ok(bps / 1e6)
}

/// A bulk TCP transfer with 1 MiB buffers (what iperf measures), run by the sandbox's and the
/// host's python3: `BULK HOST up|down BYTES` sends BYTES to the world's sink (port 9100, which
/// answers the count once the sender's end came) or reads them from its source (port 9101);
/// prints MB/s, from connected to the last byte (acknowledged by the sink's count, for up).
const BULK: &str = r#"
import socket, sys, time
h, way, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
s = socket.create_connection((h, 9100 if way == 'up' else 9101))
buf = bytearray(1 << 20)
t = time.monotonic()
got = 0
if way == 'up':
    view = memoryview(buf)
    while got < n:
        got += s.send(view[:min(n - got, len(buf))])
    s.shutdown(socket.SHUT_WR)
    got = int(s.makefile().readline())
else:
    while True:
        k = s.recv_into(buf)
        if not k:
            break
        got += k
dt = time.monotonic() - t
if got != n:
    sys.exit('moved %d of %d bytes' % (got, n))
print(n / dt / 1e6)
"#;

/// A transfer's own figure, MB/s.
fn mbps(text: &str) -> Result<f64> {
    text.trim()
        .parse()
        .with_context(|| format!("the transfer said {text:?}"))
}

/// `nft -f` of one element into a scratch table of namespace `ns`, ms.
fn raw_nft(ns: &str) -> Result<f64> {
    use std::io::Write;
    let t0 = Instant::now();
    let mut c = Command::new("ip")
        .args(["netns", "exec", ns, "nft", "-f", "-"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    c.stdin.take().context("stdin")?.write_all(
        b"add element inet bench grants { \"cs-1\" . 198.18.0.0/24 . tcp . 9000 }\n\
          delete element inet bench grants { \"cs-1\" . 198.18.0.0/24 . tcp . 9000 }\n",
    )?;
    let out = c.wait_with_output()?;
    if !out.status.success() {
        bail!("nft: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(t0.elapsed().as_secs_f64() * 1000.0)
}

/// What the group measured, per side.
#[derive(Default)]
struct Measured {
    create_net: Vec<f64>,
    create_plain: Vec<f64>,
    up_sandbox: Vec<f64>,
    up_plain: Vec<f64>,
    down_sandbox: Vec<f64>,
    down_plain: Vec<f64>,
    bulk_up_sandbox: Vec<f64>,
    bulk_up_plain: Vec<f64>,
    bulk_down_sandbox: Vec<f64>,
    bulk_down_plain: Vec<f64>,
    grant_ms: Vec<f64>,
    revoke_ms: Vec<f64>,
    nft_ms: Vec<f64>,
    preview_ms: Vec<f64>,
    direct_ms: Vec<f64>,
    preview_mbps: Vec<f64>,
    direct_mbps: Vec<f64>,
    /// Why the preview rows failed, if they did.
    preview_error: Option<String>,
}

/// The preview client (python3 in the node's namespace): `n` GETs of `/index.html`, each on
/// a new connection, alternating between the node's preview proxy (argv 1-3: address, port,
/// Host) and the sandbox's own address (argv 4-5); one line per request, `p MS` or `d MS`.
const PREVIEW_CLIENT: &str = r#"
import http.client, sys, time
px, pp, host, dx, dp, n = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5]), int(sys.argv[6])
def get(addr, port, h):
    t = time.perf_counter()
    c = http.client.HTTPConnection(addr, port, timeout=10)
    c.request('GET', '/index.html', headers={'Host': h})
    r = c.getresponse(); body = r.read(); c.close()
    if r.status != 200 or body != b'hello\n':
        sys.exit(f'{addr}:{port}: {r.status} {body[:80]!r}')
    return (time.perf_counter() - t) * 1000
for i in range(n):
    for side in (('p', 'd') if i % 2 == 0 else ('d', 'p')):
        ms = get(px, pp, host) if side == 'p' else get(dx, dp, f'{dx}:{dp}')
        print(side, ms)
"#;

/// Where the bench node's preview proxy listens, in its namespace.
const PREVIEW_PORT: u16 = 18088;

/// Preview URLs (issue 21): a `python3 -m http.server` in sandbox `id` reached through the
/// node's preview proxy (a PUBLIC exposure) and straight at the sandbox's address, from the
/// node's namespace: request latency in turns, and a download of `blob` bytes each way.
async fn measure_preview(
    with: &mut Sbx,
    id: &str,
    net: &Net,
    quick: bool,
    blob: usize,
    m: &mut Measured,
) -> Result<()> {
    let mut app = start(
        with,
        id,
        &[
            "sh",
            "-c",
            &format!(
                "rm -f /tmp/up && mkdir -p /tmp/site && cd /tmp/site && echo hello > index.html && \
                 head -c {blob} /dev/zero > big && python3 -m http.server 8000 >/dev/null 2>&1 & \
                 until curl -s -o /dev/null http://127.0.0.1:8000/; do sleep 0.1; done; \
                 echo serving; ip -4 -o addr show eth0; wait"
            ),
        ],
    )
    .await?;
    if line(&mut app).await? != "serving" {
        bail!("the preview app did not start");
    }
    let addr = line(&mut app)
        .await?
        .split_whitespace()
        .skip_while(|w| *w != "inet")
        .nth(1)
        .and_then(|a| a.split('/').next())
        .map(str::to_string)
        .context("the sandbox's address")?;
    with.expose_sandbox_port(ppb::ExposeSandboxPortRequest {
        sandbox_id: id.into(),
        port: 8000,
        auth: ppb::ExposureAuth::Public as i32,
        ..Default::default()
    })
    .await?;
    let host = format!("8000-{id}.preview.bench");
    let n = if quick { 100 } else { 500 };
    let out = Command::new("ip")
        .args(["netns", "exec", &net.host, "python3", "-c", PREVIEW_CLIENT])
        .args(["127.0.0.1", &PREVIEW_PORT.to_string(), &host, &addr, "8000"])
        .arg(n.to_string())
        .output()?;
    if !out.status.success() {
        bail!("preview client: {}", String::from_utf8_lossy(&out.stderr));
    }
    // The first few of each side warm up.
    for (i, l) in String::from_utf8_lossy(&out.stdout).lines().enumerate() {
        let Some((side, ms)) = l.split_once(' ') else {
            continue;
        };
        if i < 10 {
            continue;
        }
        let ms: f64 = ms.parse()?;
        match side {
            "p" => m.preview_ms.push(ms),
            _ => m.direct_ms.push(ms),
        }
    }
    let down = |url: &str, host: &str| {
        format!(
            "ip netns exec {} curl -s -o /dev/null -w %{{speed_download}} -H Host:{host} {url}",
            net.host
        )
    };
    let transfers = if quick { 3 } else { 5 };
    for i in 0..=transfers {
        let p = curl_speed(&run(&down(
            &format!("http://127.0.0.1:{PREVIEW_PORT}/big"),
            &host,
        ))?)?;
        let d = curl_speed(&run(&down(
            &format!("http://{addr}:8000/big"),
            &format!("{addr}:8000"),
        ))?)?;
        if i > 0 {
            m.preview_mbps.push(p);
            m.direct_mbps.push(d);
        }
    }
    drop(app);
    Ok(())
}

async fn measure(quick: bool, plain: &Ours, net: &Net, egress: &Ours) -> Result<Measured> {
    let rounds = if quick { 5 } else { 15 };
    let mut m = Measured::default();
    let mut with = setup(computed::client::unix_channel(&egress.socket()).await?).await?;
    let mut without = setup(computed::client::unix_channel(&plain.socket()).await?).await?;
    // Creates, in turns (after one unrecorded round each).
    for i in 0..=rounds {
        for net_first in [i % 2 == 0, i % 2 == 1] {
            let (s, out) = if net_first {
                (&mut with, &mut m.create_net)
            } else {
                (&mut without, &mut m.create_plain)
            };
            let (id, ms) = create_running(s).await?;
            if i > 0 {
                out.push(ms);
            }
            delete(s, &id).await;
        }
    }
    // Throughput: curl in a sandbox against curl in the plain namespace, each way (the
    // upload from a file in memory: the sandbox's /tmp, the plain side's /dev/shm).
    let (id, _) = create_running(&mut with).await?;
    let blob = if quick { 64 << 20 } else { 256 << 20 };
    output(
        start(
            &mut with,
            &id,
            &["sh", "-c", &format!("head -c {blob} /dev/zero > /tmp/up")],
        )
        .await?,
    )
    .await?;
    let shm = format!("/dev/shm/bench-egress-{}", std::process::id());
    std::fs::write(&shm, vec![0u8; blob])?;
    let down =
        |host: &str| format!("curl -s -o /dev/null -w %{{speed_download}} http://{host}:8000/blob");
    let up = |host: &str, file: &str| {
        format!("curl -s -o /dev/null -w %{{speed_upload}} --data-binary @{file} http://{host}:8000/upload")
    };
    let transfers = if quick { 3 } else { 5 };
    for i in 0..=transfers {
        let t = output(start(&mut with, &id, &["sh", "-c", &up(WORLD, "/tmp/up")]).await?).await?;
        let s_up = curl_speed(&t)?;
        let t = run(&format!(
            "ip netns exec {} {}",
            net.plain,
            up(PLAIN_WORLD, &shm)
        ))?;
        let p_up = curl_speed(&t)?;
        let t = output(start(&mut with, &id, &["sh", "-c", &down(WORLD)]).await?).await?;
        let s_down = curl_speed(&t)?;
        let t = run(&format!(
            "ip netns exec {} {}",
            net.plain,
            down(PLAIN_WORLD)
        ))?;
        let p_down = curl_speed(&t)?;
        let n = blob.to_string();
        let bulk = |way| ["python3", "-c", BULK, WORLD, way, &n];
        let plain = |way: &str| -> Result<f64> {
            let out = Command::new("ip")
                .args([
                    "netns",
                    "exec",
                    &net.plain,
                    "python3",
                    "-c",
                    BULK,
                    PLAIN_WORLD,
                    way,
                    &n,
                ])
                .output()?;
            if !out.status.success() {
                bail!("bulk {way}: {}", String::from_utf8_lossy(&out.stderr));
            }
            mbps(&String::from_utf8_lossy(&out.stdout))
        };
        let b_up = mbps(&output(start(&mut with, &id, &bulk("up")).await?).await?)?;
        let pb_up = plain("up")?;
        let b_down = mbps(&output(start(&mut with, &id, &bulk("down")).await?).await?)?;
        let pb_down = plain("down")?;
        // The first transfer of each warms up.
        if i > 0 {
            m.up_sandbox.push(s_up);
            m.up_plain.push(p_up);
            m.down_sandbox.push(s_down);
            m.down_plain.push(p_down);
            m.bulk_up_sandbox.push(b_up);
            m.bulk_up_plain.push(pb_up);
            m.bulk_down_sandbox.push(b_down);
            m.bulk_down_plain.push(pb_down);
        }
    }
    let _ = std::fs::remove_file(&shm);
    // The preview rows fail alone: the rest of the group stands.
    if let Err(e) = measure_preview(&mut with, &id, net, quick, blob, &mut m).await {
        m.preview_error = Some(format!("{e:#}"));
    }
    // Grant → effect, revoke → cut; the kernel's own rule change as the baseline.
    run(&format!(
        "ip netns exec {} nft add table inet bench",
        net.plain
    ))?;
    run(&format!(
        "ip netns exec {} nft add set inet bench grants {{ type ifname . ipv4_addr . inet_proto . inet_service ; flags interval ; }}",
        net.plain
    ))?;
    let prober = r#"
import socket, sys, time
print('up', flush=True)
while True:
    s = socket.socket()
    s.settimeout(0.2)
    try:
        s.connect((sys.argv[1], 9000))
        print(time.time(), flush=True)
        break
    except OSError:
        s.close()
        time.sleep(0.001)
"#;
    let talker = r#"
import socket, sys, time
s = socket.create_connection((sys.argv[1], 9000), timeout=2)
print('up', flush=True)
try:
    while True:
        s.sendall(b'x')
        if s.recv(1) != b'x':
            break
        time.sleep(0.001)
except OSError:
    pass
print(time.time(), flush=True)
"#;
    let grants = if quick { 10 } else { 30 };
    for _ in 0..grants {
        let mut p = start(&mut with, &id, &["python3", "-c", prober, WORLD]).await?;
        if line(&mut p).await? != "up" {
            bail!("the prober did not start");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        let t0 = epoch();
        let g = with
            .grant_egress(ppb::GrantEgressRequest {
                sandbox_id: id.clone(),
                policy: Some(ppb::EgressPolicy {
                    rules: vec![rule(&format!("{WORLD}/32"), 9000)],
                }),
                ttl_sec: 0,
                reason: "bench".into(),
            })
            .await?
            .into_inner()
            .grant_id;
        let at: f64 = line(&mut p).await?.parse()?;
        m.grant_ms.push((at - t0) * 1000.0);
        let _ = output(p).await;
        let mut t = start(&mut with, &id, &["python3", "-c", talker, WORLD]).await?;
        if line(&mut t).await? != "up" {
            bail!("the conversation did not start");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        let t0 = epoch();
        with.revoke_egress(ppb::RevokeEgressRequest {
            sandbox_id: id.clone(),
            grant_id: g,
        })
        .await?;
        let at: f64 = line(&mut t).await?.parse()?;
        m.revoke_ms.push((at - t0) * 1000.0);
        m.nft_ms.push(raw_nft(&net.plain)?);
    }
    delete(&mut with, &id).await;
    Ok(m)
}

fn scenario(
    name: &'static str,
    unit: &'static str,
    better: Better,
    ours: &Result<Vec<f64>>,
    base: &Result<Vec<f64>>,
    notes: &str,
) -> Scenario {
    let side = |r: &Result<Vec<f64>>| match r {
        Ok(v) => Side::measured(Dist::of(v, better)).with("n", v.len()),
        Err(e) => Side::failed(e),
    };
    Scenario {
        name,
        unit,
        better,
        ours: side(ours),
        baseline: side(base),
        notes: vec![notes.into()],
    }
}

/// The group's scenarios. `plain` is the bench's daemon (no networks); the group starts one
/// with networks of its own in `dir` and tears it down with its namespaces.
pub async fn group(
    quick: bool,
    plain: &Ours,
    egress: Ours,
    dir: PathBuf,
    platform: &str,
    network: &str,
) -> Vec<Scenario> {
    let r: Result<Measured> = async {
        let net = Net::new(if quick { 64 << 20 } else { 256 << 20 })?;
        let key = std::env::temp_dir().join(format!("bench-preview-{}.key", std::process::id()));
        std::fs::write(&key, "bench preview signing key, 32 bytes or more")?;
        let egress = egress.in_netns(
            &net.host,
            &format!("bench-egress-{}", std::process::id()),
            &format!(
                "[egress]\nuplink = \"up0\"\niface_prefix = \"bn-\"\nrunsc_platform = {platform:?}\n\
                 runsc_network = {network:?}\n\
                 [preview]\ndomain = \"preview.bench\"\nlisten = \"127.0.0.1:{PREVIEW_PORT}\"\n\
                 scheme = \"http\"\nsigning_key_file = {key:?}\n"
            ),
        )?;
        eprintln!(
            "compute-bench: egress: a node with networks in {}",
            net.host
        );
        let r = async {
            egress.start().await?;
            measure(quick, plain, &net, &egress).await
        }
        .await;
        egress.cleanup().await;
        drop(net);
        let _ = std::fs::remove_file(&key);
        r
    }
    .await;
    let _ = std::fs::remove_dir_all(&dir);
    let split = |f: fn(&Measured) -> &Vec<f64>| -> Result<Vec<f64>> {
        match &r {
            Ok(m) => Ok(f(m).clone()),
            Err(e) => Err(anyhow::anyhow!("{e:#}")),
        }
    };
    let preview = |f: fn(&Measured) -> &Vec<f64>| -> Result<Vec<f64>> {
        match &r {
            Ok(Measured {
                preview_error: Some(e),
                ..
            }) => Err(anyhow::anyhow!("{e}")),
            Ok(m) => Ok(f(m).clone()),
            Err(e) => Err(anyhow::anyhow!("{e:#}")),
        }
    };
    vec![
        scenario(
            "egress_create_to_running",
            "ms",
            Better::Lower,
            &split(|m| &m.create_net),
            &split(|m| &m.create_plain),
            "ours: platform CreateSandbox (exec only) until RUNNING on a node with [egress] \
             (netns, veth, table, --network=sandbox); baseline: the same on the bench's node \
             without networks; in turns; target ratio <= 1.15",
        ),
        scenario(
            "egress_tcp_throughput",
            "MB/s",
            Better::Higher,
            &split(|m| &m.bulk_up_sandbox),
            &split(|m| &m.bulk_up_plain),
            "a bulk TCP upload with 1 MiB writes (python3, what iperf measures) to the world's \
             sink: ours from a sandbox through its veth, the node's table and the uplink; \
             baseline: from a plain network namespace joined to the world by a veth; target \
             ratio >= 0.5",
        ),
        scenario(
            "egress_tcp_download",
            "MB/s",
            Better::Higher,
            &split(|m| &m.bulk_down_sandbox),
            &split(|m| &m.bulk_down_plain),
            "the other way of egress_tcp_throughput: 1 MiB reads from the world's source",
        ),
        scenario(
            "egress_http_upload",
            "MB/s",
            Better::Higher,
            &split(|m| &m.up_sandbox),
            &split(|m| &m.up_plain),
            "curl's speed_upload of a blob (in memory) to the world over HTTP (curl's 64 KiB \
             writes), sandbox vs plain namespace",
        ),
        scenario(
            "egress_http_download",
            "MB/s",
            Better::Higher,
            &split(|m| &m.down_sandbox),
            &split(|m| &m.down_plain),
            "curl's speed_download of the world's blob (curl's 16 KiB reads), sandbox vs plain \
             namespace",
        ),
        scenario(
            "egress_grant_to_effect",
            "ms",
            Better::Lower,
            &split(|m| &m.grant_ms),
            &split(|m| &m.nft_ms),
            "ours: from GrantEgress sent until a prober in the sandbox (a connect every ms) gets \
             through; baseline: `nft -f` of one element into a scratch table (the kernel's own \
             rule change)",
        ),
        scenario(
            "egress_revoke_to_cut",
            "ms",
            Better::Lower,
            &split(|m| &m.revoke_ms),
            &split(|m| &m.nft_ms),
            "ours: from RevokeEgress sent until a conversation in the sandbox (an echo every ms \
             through the granted port) breaks; baseline: as egress_grant_to_effect",
        ),
        scenario(
            "preview_request",
            "ms",
            Better::Lower,
            &preview(|m| &m.preview_ms),
            &preview(|m| &m.direct_ms),
            "a GET of a small page from python3 -m http.server in a sandbox, each on a new \
             connection from the node's namespace (python3 http.client), in turns: ours through \
             the node's preview proxy (a PUBLIC exposure: Host routing, the exposure looked up, \
             a new connection to the app); baseline: straight to the sandbox's address; target \
             p50 overhead <= 1 ms",
        ),
        scenario(
            "preview_throughput",
            "MB/s",
            Better::Higher,
            &preview(|m| &m.preview_mbps),
            &preview(|m| &m.direct_mbps),
            "curl's speed_download of a blob from python3 -m http.server in a sandbox: ours \
             through the node's preview proxy, baseline straight to the sandbox's address; \
             target ratio >= 0.7",
        ),
    ]
}
