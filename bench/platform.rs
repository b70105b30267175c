//! The platform API's sandboxes on ours (issue 17): create from an environment until RUNNING
//! against compute.v1's create until READY, in turns on one daemon; and how fast a change
//! reaches a watcher and new output a follower.

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
    /// A state change (the sandbox's updated_at) → the watcher's event.
    pub watch_ms: Vec<f64>,
    /// A line the workload stamped with its clock → the follower's entry.
    pub follow_ms: Vec<f64>,
}

fn since(t: &Option<prost_types::Timestamp>) -> Option<f64> {
    let t = t.as_ref()?;
    let at = SystemTime::UNIX_EPOCH + Duration::new(t.seconds as u64, t.nanos as u32);
    Some(SystemTime::now().duration_since(at).ok()?.as_secs_f64() * 1000.0)
}

/// `rounds` pairs in turns (after one warm-up pair), then one follower of 200 stamped lines.
pub async fn run(o: &Ours, rounds: usize) -> Result<Measured> {
    let root = computed::client::unix_channel(&o.socket()).await?;
    let ns = "bench";
    let _ = ppb::access_service_client::AccessServiceClient::new(root.clone())
        .create_namespace(ppb::CreateNamespaceRequest {
            name: ns.into(),
            ..Default::default()
        })
        .await;
    let _ = ppb::environment_service_client::EnvironmentServiceClient::new(root.clone())
        .create_environment(ppb::CreateEnvironmentRequest {
            environment: Some(ppb::Environment {
                namespace: ns.into(),
                name: "py".into(),
                image: IMAGE.into(),
                default_argv: vec!["sleep".into(), "0.3".into()],
                ..Default::default()
            }),
        })
        .await;
    let mut s = Sbx::new(root);
    let mut m = Measured::default();
    for i in 0..=rounds {
        let first_v1 = i % 2 == 0;
        for v1 in [first_v1, !first_v1] {
            if v1 {
                let (id, d) = o.create_ready().await.context("compute.v1 create")?;
                if i > 0 {
                    m.v1_ready_ms.push(d.as_secs_f64() * 1000.0);
                }
                o.destroy(&id).await?;
                continue;
            }
            let t0 = Instant::now();
            let sb = s
                .create_sandbox(ppb::CreateSandboxRequest {
                    namespace: ns.into(),
                    environment: "py".into(),
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
            let (mut running, mut events) = (None, 0);
            while let Some(ev) = tokio::time::timeout(Duration::from_secs(60), w.message())
                .await
                .context("no event within 60 s")??
            {
                events += 1;
                let x = ev.sandbox.unwrap_or_default();
                if x.state == ppb::SandboxState::Running as i32 && running.is_none() {
                    running = Some(t0.elapsed());
                    // A change only when the watch saw the state before it (PENDING).
                    if let (Some(l), true) = (since(&x.updated_at), i > 0 && events > 1) {
                        m.watch_ms.push(l);
                    }
                }
                if x.state_reason.contains("exited") {
                    if let (Some(l), true) = (since(&x.updated_at), i > 0) {
                        m.watch_ms.push(l);
                    }
                    break;
                }
                if x.state == ppb::SandboxState::Failed as i32 {
                    bail!("platform sandbox failed: {}", x.state_reason);
                }
            }
            let Some(r) = running else {
                bail!("the watch ended before RUNNING")
            };
            if i > 0 {
                m.platform_running_ms.push(r.as_secs_f64() * 1000.0);
            }
            s.delete_sandbox(ppb::DeleteSandboxRequest {
                sandbox_id: sb.sandbox_id,
            })
            .await?;
        }
    }
    // Follow: 200 lines 20 ms apart, each with the workload's wall clock (ns).
    let script = "import time\nfor i in range(200):\n    print(time.time_ns(), flush=True)\n    time.sleep(0.02)\n";
    let sb = s
        .create_sandbox(ppb::CreateSandboxRequest {
            namespace: ns.into(),
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
    let mut partial = String::new();
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
                m.follow_ms.push((now - ns) / 1e6);
            }
        }
    }
    s.delete_sandbox(ppb::DeleteSandboxRequest {
        sandbox_id: sb.sandbox_id,
    })
    .await?;
    // The first lines wait for the follower to attach: not what a follower sees later.
    if m.follow_ms.len() > 10 {
        m.follow_ms.drain(..5);
    }
    Ok(m)
}
