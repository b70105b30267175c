//! Durable workspace snapshots (issue 22): a 1 GiB workspace, filled, attached to a running
//! sandbox; 10 MiB of it rewritten, then SnapshotWorkspace (the file system frozen for the
//! copy) — its time and the disk it took; against the raw copy of the same image file by
//! `cp` (reflink when the file system has them, else sparse), with nothing frozen and no API.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use computed::api::platform::v1 as ppb;

use crate::ours::Ours;
use crate::target::{Target, IMAGE};

/// What the snapshot scenario measured.
#[derive(Debug, Default)]
pub struct Measured {
    /// SnapshotWorkspace after each 10 MiB change, ms (the call, as the client sees it).
    pub snapshot_ms: Vec<f64>,
    /// Disk each took (free space of the store's file system before and after), bytes.
    pub snapshot_disk: Vec<f64>,
    /// Disk each round took: from before the 10 MiB change to after the snapshot (a reflinked
    /// snapshot's cost shows here: the changed blocks the earlier snapshot still shares are
    /// copied on write), bytes.
    pub round_disk: Vec<f64>,
    /// The raw copy of the image file, ms.
    pub copy_ms: Vec<f64>,
    /// Disk the raw copy took, bytes.
    pub copy_disk: Vec<f64>,
    /// How ours took them (`copy`, `reflink`).
    pub method: String,
    /// MiB written into the workspace before the rounds.
    pub filled_mib: u64,
}

fn free(dir: &Path) -> u64 {
    nix::sys::statvfs::statvfs(dir)
        .map(|s| s.blocks_available() * s.fragment_size())
        .unwrap_or(0)
}

/// Runs `rounds` rounds on `o` with the workspace filled with `fill_mib` MiB.
pub async fn run(o: &Ours, rounds: usize, fill_mib: u64) -> Result<Measured> {
    let root = computed::client::unix_channel(&o.socket()).await?;
    crate::platform::environment(
        &root,
        ppb::Environment {
            namespace: "bench".into(),
            name: "py".into(),
            image: IMAGE.into(),
            ..Default::default()
        },
    )
    .await;
    let mut w = ppb::workspace_service_client::WorkspaceServiceClient::new(root.clone());
    let mut s = ppb::sandbox_service_client::SandboxServiceClient::new(root.clone());
    let ws = w
        .create_workspace(ppb::CreateWorkspaceRequest {
            namespace: "bench".into(),
            size: "1Gi".into(),
            ..Default::default()
        })
        .await
        .context("CreateWorkspace")?
        .into_inner();
    let sb = s
        .create_sandbox(ppb::CreateSandboxRequest {
            namespace: "bench".into(),
            environment: "py".into(),
            exec_only: true,
            workspace_id: ws.workspace_id.clone(),
            ..Default::default()
        })
        .await
        .context("CreateSandbox with the workspace")?
        .into_inner();
    let id = sb.sandbox_id.clone();
    let r = rounds_on(o, &mut w, &id, &ws.workspace_id, rounds, fill_mib).await;
    let _ = s
        .delete_sandbox(ppb::DeleteSandboxRequest { sandbox_id: id })
        .await;
    if let Ok(snaps) = w
        .list_workspace_snapshots(ppb::ListWorkspaceSnapshotsRequest {
            namespace: "bench".into(),
            workspace_id: ws.workspace_id.clone(),
        })
        .await
    {
        for sn in snaps.into_inner().snapshots {
            let _ = w
                .delete_workspace_snapshot(ppb::DeleteWorkspaceSnapshotRequest {
                    snapshot_id: sn.snapshot_id,
                })
                .await;
        }
    }
    let _ = w
        .delete_workspace(ppb::DeleteWorkspaceRequest {
            workspace_id: ws.workspace_id,
        })
        .await;
    r
}

async fn rounds_on(
    o: &Ours,
    w: &mut ppb::workspace_service_client::WorkspaceServiceClient<tonic::transport::Channel>,
    id: &str,
    ws: &str,
    rounds: usize,
    fill_mib: u64,
) -> Result<Measured> {
    let t0 = Instant::now();
    loop {
        match o.exec(id, &["true"]).await {
            Ok(x) if x.exit_code == 0 => break,
            _ if t0.elapsed() > Duration::from_secs(60) => bail!("the sandbox never ran"),
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    // Filled in 16 MiB files (so that a change rewrites whole files).
    let fill = format!(
        "for i in $(seq 1 {}); do head -c 16777216 /dev/urandom > /workspace/f$i || exit 1; done",
        fill_mib / 16
    );
    o.exec(id, &["sh", "-c", &fill]).await?.check(None)?;
    let store: PathBuf = o.store().to_path_buf();
    let image = store.join("workspaces").join(ws).join("volume.ext4");
    let mut m = Measured {
        filled_mib: fill_mib,
        ..Default::default()
    };
    let snapshot = |w: &mut ppb::workspace_service_client::WorkspaceServiceClient<_>| {
        let mut w = w.clone();
        let ws = ws.to_string();
        async move {
            w.snapshot_workspace(ppb::SnapshotWorkspaceRequest {
                workspace_id: ws,
                ..Default::default()
            })
            .await
            .map(|r| r.into_inner())
        }
    };
    // The first snapshot holds the whole fill; each round then changes 10 MiB.
    snapshot(w).await.context("first snapshot")?;
    for r in 0..rounds {
        let change = format!(
            "head -c 10485760 /dev/urandom > /workspace/f{} && sync",
            r % (fill_mib as usize / 16).max(1) + 1
        );
        let round = free(&store);
        o.exec(id, &["sh", "-c", &change]).await?.check(None)?;
        // Each timed copy starts with nothing left to write back (the other's 900 MB would
        // slow it), and the two go first in turns.
        for first in [r % 2 == 0, r % 2 == 1] {
            tokio::task::spawn_blocking(nix::unistd::sync).await?;
            let before = free(&store);
            let t = Instant::now();
            if first {
                let sn = snapshot(w).await.context("SnapshotWorkspace")?;
                m.snapshot_ms.push(t.elapsed().as_secs_f64() * 1000.0);
                let after = free(&store);
                m.snapshot_disk.push(before.saturating_sub(after) as f64);
                m.round_disk.push(round.saturating_sub(after) as f64);
                m.method = sn.method;
                continue;
            }
            // The baseline: the same image copied by cp, nothing frozen.
            let copy = store.join(format!("bench-copy-{r}"));
            let st = tokio::process::Command::new("cp")
                .args(["--reflink=auto", "--sparse=always"])
                .arg(&image)
                .arg(&copy)
                .status()
                .await?;
            if !st.success() {
                bail!("cp {} failed", image.display());
            }
            m.copy_ms.push(t.elapsed().as_secs_f64() * 1000.0);
            m.copy_disk.push(before.saturating_sub(free(&store)) as f64);
            let _ = std::fs::remove_file(&copy);
        }
    }
    Ok(m)
}
