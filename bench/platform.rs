//! The platform API's sandboxes on ours (issue 17): create from an environment until RUNNING
//! (also from one with 4 ephemeral mounts) against compute.v1's create until READY, in turns
//! on one daemon; and how fast a change
//! reaches a watcher and new output a follower, on the node and through a `computed router`
//! in front of it.

use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Context, Result};
use computed::api::platform::v1 as ppb;
use tonic::transport::Channel;

use crate::ours::Ours;
use crate::target::{Target, IMAGE};

type Sbx = ppb::sandbox_service_client::SandboxServiceClient<Channel>;

/// What the platform scenario measured, ms.
#[derive(Debug, Default)]
pub struct Measured {
    /// compute.v1 CreateSandbox → READY (DescribeSandbox polled every 5 ms).
    pub v1_ready_ms: Vec<f64>,
    /// platform CreateSandbox → RUNNING, seen on a WatchSandbox opened after the create.
    pub platform_running_ms: Vec<f64>,
    /// The same, from an environment with 4 ephemeral mounts (4 volumes, 4 loop devices).
    pub mounts_running_ms: Vec<f64>,
    /// A state change (the sandbox's updated_at) → the watcher's event, on the node.
    pub watch_ms: Vec<f64>,
    /// A line the workload stamped with its clock → the follower's entry, on the node.
    pub follow_ms: Vec<f64>,
    /// The same two through a router.
    pub router_watch_ms: Vec<f64>,
    /// See `router_watch_ms`.
    pub router_follow_ms: Vec<f64>,
}

const NS: &str = "bench";

fn since(t: &Option<prost_types::Timestamp>) -> Option<f64> {
    let t = t.as_ref()?;
    let at = SystemTime::UNIX_EPOCH + Duration::new(t.seconds as u64, t.nanos as u32);
    Some(SystemTime::now().duration_since(at).ok()?.as_secs_f64() * 1000.0)
}

/// Environment `env` and its namespace, as root on `root` (both may exist already: a
/// bench run reuses a daemon's records).
pub(crate) async fn environment(root: &Channel, env: ppb::Environment) {
    let _ = ppb::access_service_client::AccessServiceClient::new(root.clone())
        .create_namespace(ppb::CreateNamespaceRequest {
            name: env.namespace.clone(),
            ..Default::default()
        })
        .await;
    let _ = ppb::environment_service_client::EnvironmentServiceClient::new(root.clone())
        .create_environment(ppb::CreateEnvironmentRequest {
            environment: Some(env),
        })
        .await;
}

/// Namespace `bench` and its environments `py` (a workload of `sleep 0.3`) and `py-mounts`, as
/// root on `root`.
async fn setup(root: Channel) -> Result<Sbx> {
    // `py`, and `py-mounts`: the same with 4 ephemeral 1Gi mounts.
    for (name, mounts) in [
        ("py", &[][..]),
        (
            "py-mounts",
            &["/workspace", "/data", "/cache", "/models"][..],
        ),
    ] {
        environment(
            &root,
            ppb::Environment {
                namespace: NS.into(),
                name: name.into(),
                image: IMAGE.into(),
                default_argv: vec!["sleep".into(), "0.3".into()],
                workspaces: mounts
                    .iter()
                    .map(|p| ppb::WorkspaceMount {
                        mount_path: p.to_string(),
                        size: "1Gi".into(),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            },
        )
        .await;
    }
    Ok(Sbx::new(root))
}

/// One platform sandbox: create, watch until its workload exited, delete. Returns the time to
/// RUNNING and the watch latency of each change the watch saw happen.
async fn watched_round(s: &mut Sbx, environment: &str) -> Result<(Duration, Vec<f64>)> {
    let t0 = Instant::now();
    let sb = s
        .create_sandbox(ppb::CreateSandboxRequest {
            namespace: NS.into(),
            environment: environment.into(),
            ..Default::default()
        })
        .await
        .context("platform CreateSandbox")?
        .into_inner();
    let mut w = s
        .watch_sandbox(ppb::WatchSandboxRequest {
            sandbox_id: sb.sandbox_id.clone(),
        })
        .await?
        .into_inner();
    let (mut running, mut events, mut lat) = (None, 0, Vec::new());
    while let Some(ev) = tokio::time::timeout(Duration::from_secs(60), w.message())
        .await
        .context("no event within 60 s")??
    {
        events += 1;
        let x = ev.sandbox.unwrap_or_default();
        // The first event is the state at the watch's start; later ones are changes.
        if events > 1 {
            lat.extend(since(&x.updated_at));
        }
        if x.state == ppb::SandboxState::Running as i32 && running.is_none() {
            running = Some(t0.elapsed());
        }
        if x.state_reason.contains("exited") {
            break;
        }
        if x.state == ppb::SandboxState::Failed as i32 {
            bail!("platform sandbox failed: {}", x.state_reason);
        }
    }
    let Some(r) = running else {
        bail!("the watch ended before RUNNING")
    };
    s.delete_sandbox(ppb::DeleteSandboxRequest {
        sandbox_id: sb.sandbox_id,
    })
    .await?;
    Ok((r, lat))
}

/// A follower of 200 lines 20 ms apart, each stamped with the workload's wall clock (ns).
async fn followed(s: &mut Sbx) -> Result<Vec<f64>> {
    let script = "import time\nfor i in range(200):\n    print(time.time_ns(), flush=True)\n    time.sleep(0.02)\n";
    let sb = s
        .create_sandbox(ppb::CreateSandboxRequest {
            namespace: NS.into(),
            environment: "py".into(),
            argv: vec!["python3".into(), "-c".into(), script.into()],
            ..Default::default()
        })
        .await?
        .into_inner();
    let mut f = s
        .tail_sandbox_logs(ppb::TailSandboxLogsRequest {
            sandbox_id: sb.sandbox_id.clone(),
            follow: true,
            ..Default::default()
        })
        .await?
        .into_inner();
    let (mut partial, mut out) = (String::new(), Vec::new());
    while let Some(e) = tokio::time::timeout(Duration::from_secs(60), f.message())
        .await
        .context("no log entry within 60 s")??
    {
        if e.marker == ppb::LogMarker::Exited as i32 {
            break;
        }
        if e.stream != ppb::LogStream::Stdout as i32 {
            continue;
        }
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)?
            .as_nanos() as f64;
        partial.push_str(&String::from_utf8_lossy(&e.data));
        while let Some(nl) = partial.find('\n') {
            let line: String = partial.drain(..=nl).collect();
            if let Ok(ns) = line.trim().parse::<f64>() {
                out.push((now - ns) / 1e6);
            }
        }
    }
    s.delete_sandbox(ppb::DeleteSandboxRequest {
        sandbox_id: sb.sandbox_id,
    })
    .await?;
    // The first lines wait for the follower to attach: not what a follower sees later.
    if out.len() > 10 {
        out.drain(..5);
    }
    Ok(out)
}

/// `rounds` triples in turns (after one warm-up triple), a follower; then a router in front of the
/// node and `rounds` watched sandboxes and a follower through it.
pub async fn run(o: &Ours, rounds: usize) -> Result<Measured> {
    let mut s = setup(computed::client::unix_channel(&o.socket()).await?).await?;
    let mut m = Measured::default();
    for i in 0..=rounds {
        // compute.v1, platform, platform with mounts: each first in turn.
        for k in 0..3 {
            match (i + k) % 3 {
                0 => {
                    let (id, d) = o.create_ready().await.context("compute.v1 create")?;
                    if i > 0 {
                        m.v1_ready_ms.push(d.as_secs_f64() * 1000.0);
                    }
                    o.destroy(&id).await?;
                }
                1 => {
                    let (r, lat) = watched_round(&mut s, "py").await?;
                    if i > 0 {
                        m.platform_running_ms.push(r.as_secs_f64() * 1000.0);
                        m.watch_ms.extend(lat);
                    }
                }
                _ => {
                    let (r, _) = watched_round(&mut s, "py-mounts").await?;
                    if i > 0 {
                        m.mounts_running_ms.push(r.as_secs_f64() * 1000.0);
                    }
                }
            }
        }
    }
    m.follow_ms = followed(&mut s).await?;

    // Through a router: its own records (embedded), the node behind it sharing its secret.
    let (addr, computed, dir) = o.parts();
    let rdir = dir.join("router");
    std::fs::create_dir_all(&rdir)?;
    let listen = format!("127.0.0.1:{}", crate::host::free_port()?);
    let sock = rdir.join("router.sock");
    let log = std::fs::File::create(rdir.join("router.log"))?;
    let mut child = tokio::process::Command::new(computed)
        .args(["router", "--listen", &listen, "--metrics-listen", ""])
        .arg("--nodes")
        .arg(format!("http://{addr}"))
        .arg("--socket")
        .arg(&sock)
        .arg("--platform-store")
        .arg(rdir.join("platform.redb"))
        .arg("--platform-peer-secret")
        .arg(dir.join("peer-secret"))
        .env_remove("KUBERNETES_SERVICE_HOST")
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .context("start computed router")?;
    let routed = async {
        let t0 = Instant::now();
        while !sock.exists() {
            if t0.elapsed() > Duration::from_secs(30) {
                bail!("the router did not serve in 30 s");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // Wait for its first health poll of the node.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let mut r = setup(computed::client::unix_channel(&sock).await?).await?;
        let mut watch = Vec::new();
        for _ in 0..rounds {
            watch.extend(watched_round(&mut r, "py").await?.1);
        }
        Ok((watch, followed(&mut r).await?))
    }
    .await;
    let _ = child.kill().await;
    let (w, f) = routed?;
    m.router_watch_ms = w;
    m.router_follow_ms = f;
    Ok(m)
}
