//! A sandbox's life after admission: recorded (workspace volume + container record),
//! provisioned in the background (image, spec, task), watched (max_runtime deadline, the init
//! task's exit), failed, destroyed.
//!
//! Lock order: a sandbox's `ops` lock serialises recording, provisioning, claiming and
//! teardown; it is never held across an image pull, and the table lock is never held across
//! an await. Destroy cancels the sandbox's token first, so provisioning stuck in a pull ends
//! at once.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use nix::sys::signal::Signal;
use tracing::{info, instrument, warn};

use super::{blocking, capacity, record, Error, Node, Result, Sandbox, Status};
use crate::metering::{HostLimits, Usage, CPU_PERIOD_US};
use crate::runtime::{spec, SandboxLaunch, TaskState};
use crate::{volume, workspace};

/// The host name of sandbox `id` (its spec's, and its `/etc/hosts` line when it has a network).
pub(super) fn hostname(id: &str) -> String {
    format!("sandbox-{}", &id[..8])
}

impl Node {
    fn backend(&self, sb: &Sandbox) -> volume::Backend {
        self.inner
            .cfg
            .storage_classes
            .get(&sb.workspace.storage_class)
            .copied()
            .unwrap_or(volume::Backend::Dir)
    }

    /// Makes the sandbox's workspace volume and its record in the runtime (with a placeholder
    /// spec; provisioning writes the real one once the image is resolved).
    /// Returns how long the volume and the record took.
    pub(super) async fn record(&self, sb: &Sandbox) -> Result<[Duration; 2]> {
        let paths = self.paths(&sb.id);
        let backend = self.backend(sb);
        let size = sb.workspace.size.bytes();
        let t0 = Instant::now();
        self.check_free_disk().await?;
        let extra: Vec<(workspace::Paths, u64)> = sb
            .extra_mounts()
            .iter()
            .enumerate()
            .filter(|(_, m)| m.workspace_id.is_empty())
            .map(|(i, m)| (paths.extra(i + 1), m.size.bytes()))
            .collect();
        // Its own workspace, unless the first mount is a durable workspace.
        let own = sb
            .platform
            .as_ref()
            .is_none_or(|p| p.workspace_id.is_empty());
        let durable = Self::durable_of(sb.definition()).len();
        self.check_loop_devices(backend, usize::from(own) + extra.len() + durable)
            .await?;
        // Every durable workspace it mounts is its, or none is (FAILED_PRECONDITION).
        self.attach_durable(sb.definition()).await?;
        let p2 = paths.clone();
        let made = blocking(move || {
            if own {
                volume::create(&p2, backend, size)?;
            } else {
                p2.create().map_err(|source| volume::Error::Io {
                    what: "create",
                    path: p2.base.clone(),
                    source,
                })?;
            }
            // Each extra mount is a volume of its own (its own cap), inside the workspace's
            // directory: deleting or detaching the workspace takes them along.
            for (p, size) in &extra {
                volume::create(p, backend, *size)?;
            }
            Ok(())
        })
        .await
        .and_then(|r| r.map_err(|e| capacity::volume_error(&sb.id, e)));
        if let Err(e) = made {
            self.release_durable(sb.definition()).await;
            return Err(e);
        }
        let volume = t0.elapsed();
        self.inner
            .rt
            .record(SandboxLaunch {
                id: &sb.id,
                labels: record::labels(sb.definition()),
                spec: self.spec_for(sb, &[]),
                image: &sb.image,
            })
            .await?;
        Ok([volume, t0.elapsed() - volume])
    }

    fn spec_for(&self, sb: &Sandbox, image_env: &[String]) -> Vec<u8> {
        let cfg = &self.inner.cfg;
        let init_args: Vec<String> = if self.agent_enabled() {
            vec![
                "/.compute/sandbox-agent".into(),
                "--init".into(),
                "--stdio".into(),
                "--sandbox-id".into(),
                sb.id.clone(),
                "--capacity".into(),
                cfg.agent_capacity.to_string(),
                "--grace".into(),
                cfg.cancel_grace_secs.to_string(),
                // Liveness is the sandbox's own state (no heartbeat deadline): a rare beat.
                "--heartbeat".into(),
                "60".into(),
            ]
        } else {
            let (sh, sleep) = match self.inner.helpers_dir {
                Some(_) => (
                    vec!["/.compute/busybox".to_string(), "sh".into()],
                    "/.compute/busybox sleep",
                ),
                None => (vec!["/bin/sh".to_string()], "sleep"),
            };
            let script =
                format!("trap 'exit 0' TERM INT; while :; do {sleep} 3600 & wait $!; done");
            sh.into_iter().chain(["-c".into(), script]).collect()
        };
        let host = self.host_limits(&sb.limits);
        let (netns, net_files) = self.network_of(sb).unzip();
        let mounts = self.mounts_of(sb.definition());
        spec::sandbox_spec(&spec::SandboxSpec {
            hostname: hostname(&sb.id),
            init_args,
            env: image_env.to_vec(),
            workspace_dir: &mounts[0].paths.data,
            mount_path: &sb.workspace.mount_path,
            read_only: mounts[0].read_only,
            extra_mounts: mounts[1..]
                .iter()
                .map(|m| spec::BindMount {
                    source: m.paths.data.clone(),
                    destination: m.mount_path.clone(),
                    read_only: m.read_only,
                })
                .collect(),
            helpers_dir: self.inner.helpers_dir.as_deref(),
            cgroups_path: self.cgroups_path(&sb.id),
            cpu_quota: host.cpu_quota,
            memory_limit: host.memory_limit,
            pids_limit: host.pids_limit,
            netns,
            net_files,
        })
    }

    /// The host cgroup limits of a sandbox with `limits`: the CFS quota of its millicores, and
    /// its memory plus headroom for the sentry and gofer (memory_bytes itself is enforced per
    /// exec).
    pub(super) fn host_limits(&self, limits: &super::Limits) -> HostLimits {
        let cfg = &self.inner.cfg;
        HostLimits {
            cpu_quota: i64::from(limits.cpu_millis) * (CPU_PERIOD_US as i64 / 1000),
            memory_limit: (limits.memory_bytes
                + cfg.memory_headroom_bytes.max(limits.memory_bytes / 4))
                as i64,
            pids_limit: cfg.pids_limit,
        }
    }

    /// Provisions a STARTING sandbox in the background: READY (with its exit watch and agent
    /// link) or FAILED with the reason. Ends at once when the sandbox is destroyed meanwhile.
    pub(super) fn spawn_provision(&self, sb: Arc<Sandbox>) {
        let node = self.clone();
        self.inner.tasks.spawn_until(sb.cancel.clone(), async move {
            // The image first, without the lock: a pull may take minutes.
            let t0 = Instant::now();
            let image = node.inner.rt.resolve_image(&sb.image).await;
            let image_ms = t0.elapsed().as_secs_f64() * 1e3;
            let _guard = sb.ops.lock().await;
            if sb.status() != Status::Starting {
                return;
            }
            let started = match image {
                Ok(image) => node.provision(&sb, &image).await,
                Err(e) => Err(e.into()),
            };
            match started {
                Ok([spec, io, start]) => {
                    if node.agent_enabled() {
                        node.expect_agent(&sb.id);
                    }
                    sb.set_status(Status::Ready, "");
                    let ms = |d: Duration| d.as_secs_f64() * 1e3;
                    info!(sandbox_id = %sb.id, image_ms, spec_ms = ms(spec), io_ms = ms(io),
                          start_ms = ms(start), "sandbox ready");
                    node.spawn_exit_watch(sb.clone());
                    if node.agent_enabled() {
                        node.spawn_agent_link(sb.clone(), false);
                    }
                    node.spawn_bootstrap_end(sb.clone());
                }
                Err(e) => {
                    warn!(sandbox_id = %sb.id, error = %e, "sandbox failed to start");
                    node.fail(&sb, &format!("start failed: {e}")).await;
                    node.agent_gone(&sb.id).await;
                }
            }
        });
    }

    /// Returns how long the spec, the agent's I/O and the start took.
    async fn provision(
        &self,
        sb: &Sandbox,
        image: &crate::runtime::ResolvedImage,
    ) -> Result<[Duration; 3]> {
        let rt = &self.inner.rt;
        let t0 = Instant::now();
        // The sandbox's network (if it has one) is made while the spec and the agent's I/O
        // are: the spec only names its paths, and only the start needs it.
        let mut spec = Duration::ZERO;
        let (net, io) = tokio::join!(self.network_up(sb), async {
            // Put the image's environment into the container's spec, in place: deleting and
            // re-creating the container would lose the record to a crash in between.
            rt.set_spec(&sb.id, self.spec_for(sb, &image.env)).await?;
            spec = t0.elapsed();
            if self.agent_enabled() {
                let (i, o) = self.prepare_agent_io(&sb.id).await?;
                Ok::<_, Error>((i, o, self.agent_stderr(&sb.id)))
            } else {
                Ok((String::new(), String::new(), String::new()))
            }
        });
        net?;
        let (stdin, stdout, stderr) = io?;
        let io = t0.elapsed() - spec;
        rt.start(&sb.id, &image.chain_id, [&stdin, &stdout, &stderr])
            .await?;
        Ok([spec, io, t0.elapsed() - spec - io])
    }

    /// Marks a sandbox FAILED (in memory and in its record) and stops its task.
    pub(super) async fn fail(&self, sb: &Sandbox, reason: &str) {
        sb.set_status(Status::Failed, reason);
        let rt = &self.inner.rt;
        if let Err(e) = rt.set_labels(&sb.id, record::failure_labels(reason)).await {
            warn!(sandbox_id = %sb.id, error = %e, "could not record failure");
        }
        if let Ok(state) = rt.state(&sb.id).await {
            if !matches!(state, TaskState::Missing | TaskState::Stopped(_)) {
                let _ = rt.kill(&sb.id, Signal::SIGKILL).await;
            }
        }
    }

    /// FAILED at `created_at + max_runtime` unless it ended before.
    pub(super) fn spawn_deadline(&self, sb: Arc<Sandbox>) {
        let node = self.clone();
        self.inner.tasks.spawn(async move {
            let deadline = sb.created_at + sb.limits.max_runtime;
            let left = deadline
                .duration_since(SystemTime::now())
                .unwrap_or(Duration::ZERO);
            let mut rx = sb.subscribe();
            let sleep = tokio::time::sleep(left);
            tokio::pin!(sleep);
            loop {
                tokio::select! {
                    _ = &mut sleep => break,
                    r = rx.changed() => {
                        if r.is_err() || rx.borrow().status.has_ended() {
                            return;
                        }
                    }
                }
            }
            let g = sb.ops.lock().await;
            if sb.status().is_live() {
                if sb.platform.is_some() {
                    // A platform sandbox's max lifetime ends it: TERMINATED, not FAILED.
                    warn!(sandbox_id = %sb.id, "max lifetime ran out");
                    sb.set_status(sb.status(), "max lifetime ran out");
                    // Its teardown is under way: an exit seen now is not a failure.
                    sb.cancel.cancel();
                    drop(g);
                    // A teardown that fails (containerd busy, runsc slow) is tried again.
                    for wait in [1, 2, 4, 8, 16, 30, 60] {
                        match node.destroy(&sb.id).await {
                            Ok(_) | Err(Error::NotFound(_)) => return,
                            Err(e) => {
                                warn!(sandbox_id = %sb.id, error = %e, retry_in_s = wait,
                                      "could not end the sandbox at its max lifetime")
                            }
                        }
                        tokio::time::sleep(Duration::from_secs(wait)).await;
                    }
                    return;
                }
                warn!(sandbox_id = %sb.id, "max_runtime exceeded");
                node.fail(&sb, "max_runtime exceeded").await;
            }
        });
    }

    /// Watches the sandbox's init task: when it exits on its own, the sandbox is FAILED.
    pub(super) fn spawn_exit_watch(&self, sb: Arc<Sandbox>) {
        let node = self.clone();
        self.inner.tasks.spawn(async move {
            loop {
                if sb.status().has_ended() {
                    return;
                }
                match node.inner.rt.wait_exit(&sb.id).await {
                    Ok(code) => {
                        let _g = sb.ops.lock().await;
                        // A cancelled sandbox is being destroyed: its exit is the teardown's.
                        if sb.status() == Status::Ready && !sb.cancel.is_cancelled() {
                            warn!(sandbox_id = %sb.id, code, "sandbox exited");
                            node.fail(&sb, &format!("sandbox exited with status {code}"))
                                .await;
                        }
                        return;
                    }
                    Err(e) if e.is_not_found() => return,
                    // containerd restarting: try again shortly.
                    Err(_) => tokio::time::sleep(Duration::from_secs(1)).await,
                }
            }
        });
    }

    /// Cumulative usage since creation (lifetime usage once destroyed).
    pub async fn usage(&self, sb: &Sandbox) -> Usage {
        if let Some(u) = sb.state().final_usage {
            return u;
        }
        let meter = sb.meter.clone();
        blocking(move || meter.lifetime()).await.unwrap_or_default()
    }

    /// DestroySandbox: stops the sandbox (cancelling its provisioning), removes everything it
    /// made in containerd and on the host, and soft-deletes its workspace. Idempotent:
    /// destroying again returns the same usage.
    #[instrument(skip_all, fields(sandbox_id = %id))]
    pub async fn destroy(&self, id: &str) -> Result<(Arc<Sandbox>, Usage)> {
        let sb = self.get(id)?;
        // Still provisioning: no command has run in it, so nothing was written to flush.
        let never_ready = sb.status() == Status::Starting;
        sb.cancel.cancel();
        let _g = sb.ops.lock().await;
        if let Some(u) = sb.state().final_usage {
            return Ok((sb.clone(), u));
        }
        // Flush the workspace so that every byte written is counted (a syncfs: on a busy
        // file system it can take a while), then take the final reading while the cgroup still
        // exists.
        if !never_ready {
            let meter = sb.meter.clone();
            let _ = blocking(move || meter.flush_disk()).await;
        }
        let usage = self.usage(&sb).await;
        self.inner.rt.teardown(&sb.id).await?;
        self.network_down(&sb).await;
        self.agent_gone(&sb.id).await;
        let tomb = record::Tombstone::new(
            sb.definition(),
            SystemTime::now(),
            Duration::from_secs(self.inner.cfg.workspace_grace_secs),
            usage,
            sb.state().reason,
        );
        let paths = self.paths(&sb.id);
        let leftovers = self.leftovers(&sb.id);
        blocking(move || -> std::io::Result<()> {
            leftovers.remove();
            // Soft delete: the volume is detached (unmounted, loop device released) and kept.
            volume::detach(&paths).map_err(std::io::Error::other)?;
            std::fs::create_dir_all(&paths.base)?;
            let tmp = paths.tombstone.with_extension("tmp");
            std::fs::write(&tmp, serde_json::to_vec_pretty(&tomb).unwrap_or_default())?;
            std::fs::rename(&tmp, &paths.tombstone)
        })
        .await?
        .map_err(|e| Error::Internal(format!("write tombstone: {e}")))?;
        // Its durable workspaces are free for the next sandbox.
        self.release_durable(sb.definition()).await;
        sb.set_destroyed(usage);
        self.table().end_session(&sb);
        crate::metrics::METRICS.forget_sandbox(&sb.metric_labels());
        info!(sandbox_id = %sb.id, cpu_ms = usage.cpu_ms, "sandbox destroyed");
        Ok((sb.clone(), usage))
    }

    /// What a torn-down sandbox may leave on the host besides its workspace.
    pub(super) fn leftovers(&self, id: &str) -> Leftovers {
        Leftovers {
            cgroup: self.cgroup(id),
            exec_dir: self.inner.cfg.run_dir.join("io").join(id),
            checkpoint: self.checkpoint_dir(id),
        }
    }
}

/// The cgroup directories runsc may leave, the exec FIFO directory and the checkpoint of a
/// sandbox.
pub(super) struct Leftovers {
    cgroup: crate::metering::SandboxCgroup,
    exec_dir: std::path::PathBuf,
    checkpoint: std::path::PathBuf,
}

impl Leftovers {
    /// Removes them (empty cgroup directories only). Blocking.
    pub(super) fn remove(&self) {
        self.remove_cgroup();
        let _ = std::fs::remove_dir_all(&self.exec_dir);
        let _ = std::fs::remove_dir_all(&self.checkpoint);
    }

    /// Removes the sandbox's cgroup directories, if empty. Blocking.
    pub(super) fn remove_cgroup(&self) {
        for d in self.cgroup.dirs() {
            let _ = std::fs::remove_dir(d);
        }
    }
}
