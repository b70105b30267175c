//! `admin.v1.NodeAdmin`: the operator's view of the node (computectl's backend). Served on the
//! unix socket; on TCP only when `admin_tcp` is set.

use std::pin::Pin;

use futures::Stream;
use tokio::sync::mpsc;
use tonic::Status;
use tracing::{info, instrument};

use crate::api::admin::v1 as pb;
use crate::api::admin::v1::node_admin_server::NodeAdmin;
use crate::api::convert;
use crate::node::{blocking, gc, parse_id, Error, Node};
use crate::{volume, workspace};

/// The admin service over a [`Node`].
#[derive(Clone)]
pub struct AdminService {
    node: Node,
    started: std::time::SystemTime,
}

impl AdminService {
    /// Serves `node`.
    pub fn new(node: Node) -> Self {
        Self {
            node,
            started: std::time::SystemTime::now(),
        }
    }
}

type ProgressStream = Pin<Box<dyn Stream<Item = Result<pb::ImageProgress, Status>> + Send>>;

fn progress_stream(rx: mpsc::Receiver<Result<pb::ImageProgress, Status>>) -> ProgressStream {
    Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))
}

fn reporter(
    tx: mpsc::Sender<Result<pb::ImageProgress, Status>>,
) -> impl Fn(&str, u64, u64) + Send + Sync {
    move |phase: &str, done: u64, total: u64| {
        // Progress is best effort: a slow reader misses intermediate updates.
        let _ = tx.try_send(Ok(pb::ImageProgress {
            phase: phase.to_string(),
            done,
            total,
            names: vec![],
        }));
    }
}

impl AdminService {
    async fn list_sandboxes(
        &self,
        req: pb::ListSandboxesRequest,
    ) -> Result<pb::ListSandboxesResponse, Error> {
        let mut out = Vec::new();
        for sb in self.node.list() {
            let st = sb.state();
            let word = st.status.word();
            if !req.status.is_empty() && !req.status.iter().any(|s| s.eq_ignore_ascii_case(word)) {
                continue;
            }
            if !req.tenant_id.is_empty() && req.tenant_id != sb.tenant_id {
                continue;
            }
            out.push(self.summary(&sb).await);
        }
        Ok(pb::ListSandboxesResponse { sandboxes: out })
    }

    async fn summary(&self, sb: &crate::node::Sandbox) -> pb::SandboxSummary {
        let st = sb.state();
        let usage = self.node.usage(sb).await;
        let suspension = sb.suspension();
        pb::SandboxSummary {
            sandbox_id: sb.id.clone(),
            tenant_id: sb.tenant_id.clone(),
            session_id: sb.session_id.clone(),
            status: st.status.word().to_string(),
            failure_reason: st.reason,
            image: sb.image.clone(),
            created_at: Some(convert::timestamp(sb.created_at)),
            cpu_millis: sb.limits.cpu_millis,
            memory_bytes: sb.limits.memory_bytes,
            max_runtime_secs: sb.limits.max_runtime.as_secs(),
            storage_class: sb.workspace.storage_class.clone(),
            workspace_size: sb.workspace.size.to_string(),
            mount_path: sb.workspace.mount_path.clone(),
            usage: Some(usage.into()),
            pool: sb.pool,
            checkpoint_bytes: suspension.map_or(0, |s| s.checkpoint_bytes),
            suspended_at: suspension.map(|s| convert::timestamp(s.at)),
            checkpoint_memory: suspension.is_some_and(|s| s.memory),
            idle_suspend_at: (st.status == crate::node::sandbox::Status::Ready)
                .then(|| self.node.idle_suspend_at(sb))
                .flatten()
                .map(convert::timestamp),
        }
    }

    async fn suspend_sandbox(
        &self,
        req: pb::SuspendSandboxRequest,
    ) -> Result<pb::SuspendResumeResponse, Error> {
        let id = parse_id(&req.sandbox_id)?;
        info!(sandbox_id = %id, "operator suspend");
        let sb = self
            .node
            .suspend(&id, crate::node::suspend::Cause::Request)
            .await?;
        Ok(pb::SuspendResumeResponse {
            sandbox: Some(self.summary(&sb).await),
            memory_lost: String::new(),
        })
    }

    async fn resume_sandbox(
        &self,
        req: pb::ResumeSandboxRequest,
    ) -> Result<pb::SuspendResumeResponse, Error> {
        let id = parse_id(&req.sandbox_id)?;
        info!(sandbox_id = %id, "operator resume");
        let (sb, how) = self.node.resume(&id).await?;
        Ok(pb::SuspendResumeResponse {
            sandbox: Some(self.summary(&sb).await),
            memory_lost: match how {
                crate::node::suspend::Resumed::Cold(why) => why,
                _ => String::new(),
            },
        })
    }

    async fn get_node(&self, _req: pb::GetNodeRequest) -> Result<pb::GetNodeResponse, Error> {
        let cfg = self.node.config();
        let rt = self.node.runtime();
        let containerd_version = rt.version().await.unwrap_or_default();
        let dir = cfg.state_dir.clone();
        let free = blocking(move || {
            nix::sys::statvfs::statvfs(&dir)
                .map(|s| s.blocks_available() * s.fragment_size())
                .unwrap_or(0)
        })
        .await?;
        // Without pulling: doctor asks whether the node has it.
        let sandbox_image_present = !rt.image_digest(&cfg.sandbox_image).await.is_empty();
        let agent_binary = if self.node.agent_enabled() {
            self.node.agent_path().display().to_string()
        } else {
            String::new()
        };
        Ok(pb::GetNodeResponse {
            containerd_address: cfg.containerd_socket.display().to_string(),
            namespace: cfg.namespace.clone(),
            runtime_name: rt.choice().name.clone(),
            runtime_binary: rt.choice().binary.display().to_string(),
            runsc_path: cfg.runsc_path.display().to_string(),
            runsc_platform: cfg.runsc_platform.clone(),
            run_dir: cfg.run_dir.display().to_string(),
            cgroup_root: cfg.cgroup_root.display().to_string(),
            sandbox_image: cfg.sandbox_image.clone(),
            sandbox_image_present,
            pull_missing: cfg.pull_missing,
            agent: cfg.agent,
            agent_binary,
            config_path: cfg
                .loaded_from
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
            info: Some(super::info::report(&self.node, self.started)),
            runsc_version: rt.choice().runsc.version.clone(),
            runsc_platform_in_use: rt.choice().platform.clone(),
            runsc_platforms: rt.choice().runsc.platforms.clone(),
            runsc_features: rt.choice().runsc.features.clone(),
            containerd_version,
            cgroup_version: format!("{:?}", self.node.cgroup_version()).to_lowercase(),
            state_dir: cfg.state_dir.display().to_string(),
            suspend_unsupported: self.node.suspend_unsupported().unwrap_or_default(),
            idle_suspend_secs: cfg.idle_suspend_secs,
            suspend_networked_unsupported: self
                .node
                .suspend_networked_unsupported()
                .unwrap_or_default(),
            egress: cfg
                .egress
                .as_ref()
                .map(|e| {
                    format!(
                        "pool {}, uplink {}, DNS capture :{} (upstream {}), proxy :{}",
                        e.pool,
                        if e.uplink.is_empty() {
                            "any"
                        } else {
                            &e.uplink
                        },
                        e.dns_port,
                        if e.dns_upstream.is_empty() {
                            "from /etc/resolv.conf"
                        } else {
                            &e.dns_upstream
                        },
                        e.proxy_port
                    )
                })
                .unwrap_or_default(),
            state_dir_free_bytes: free,
            runtime_kind: format!("{:?}", rt.choice().kind),
        })
    }

    async fn list_trash(&self, _req: pb::ListTrashRequest) -> Result<pb::ListTrashResponse, Error> {
        let dir = self.node.config().state_dir.clone();
        let tombs = blocking(move || gc::tombstones(&dir)).await?;
        Ok(pb::ListTrashResponse {
            entries: tombs
                .into_iter()
                .map(|t| pb::TrashEntry {
                    sandbox_id: t.id,
                    tenant_id: t.tenant_id,
                    session_id: t.session_id,
                    destroyed_at: t.destroyed_at,
                    delete_after: t.delete_after,
                    usage: Some(t.usage.into()),
                })
                .collect(),
        })
    }

    async fn read_trash(&self, req: pb::ReadTrashRequest) -> Result<pb::ReadTrashResponse, Error> {
        let id = parse_id(&req.sandbox_id)?;
        let dir = self.node.config().state_dir.clone();
        let r = blocking(move || -> Result<workspace::ReadResult, Error> {
            let tomb = gc::tombstones(&dir)
                .into_iter()
                .find(|t| t.id == id)
                .ok_or_else(|| Error::NotFound(id.clone()))?;
            let paths = workspace::Paths::new(&dir, &id);
            let mounted_here = volume::has_image(&paths) && !volume::is_mounted(&paths.data);
            if mounted_here {
                volume::attach_with(&paths, true)
                    .map_err(|e| Error::Internal(format!("attach trashed volume: {e}")))?;
            }
            let res = workspace::Workspace::open(&paths.data, &tomb.workspace.mount_path)
                .and_then(|ws| ws.read(&req.path, req.offset, req.max_bytes));
            if mounted_here {
                let _ = volume::detach(&paths);
            }
            Ok(res?)
        })
        .await??;
        Ok(pb::ReadTrashResponse {
            data: r.data,
            total_size: r.total_size as i64,
            eof: r.eof,
        })
    }

    async fn gc(&self, req: pb::GcRequest) -> Result<pb::GcResponse, Error> {
        let freed = self.node.gc(req.dry_run).await?;
        Ok(pb::GcResponse {
            freed: freed
                .into_iter()
                .map(|f| pb::Freed {
                    sandbox_id: f.id,
                    tenant_id: f.tenant_id,
                    delete_after: f.delete_after,
                    bytes: f.bytes,
                })
                .collect(),
        })
    }

    async fn list_images(
        &self,
        _req: pb::ListImagesRequest,
    ) -> Result<pb::ListImagesResponse, Error> {
        let images = self.node.runtime().list_images().await?;
        Ok(pb::ListImagesResponse {
            images: images
                .into_iter()
                .map(|i| pb::ImageInfo {
                    name: i.name,
                    digest: i.digest,
                    size: i.size,
                })
                .collect(),
        })
    }

    async fn import_image(&self, req: pb::ImportImageRequest) -> Result<ProgressStream, Error> {
        if req.path.is_empty() {
            return Err(Error::InvalidArgument("path is required".into()));
        }
        let (tx, rx) = mpsc::channel(64);
        let node = self.node.clone();
        self.node.tasks().spawn(async move {
            let report = reporter(tx.clone());
            let name = (!req.name.is_empty()).then_some(req.name.as_str());
            let path = std::path::Path::new(&req.path);
            let r = node.runtime().import_image(path, name, &report).await;
            let last = match r {
                Ok(names) => Ok(pb::ImageProgress {
                    phase: "done".into(),
                    done: 1,
                    total: 1,
                    names,
                }),
                Err(e) => Err(Status::from(Error::from(e))),
            };
            let _ = tx.send(last).await;
        });
        Ok(progress_stream(rx))
    }

    async fn pull_image(&self, req: pb::PullImageRequest) -> Result<ProgressStream, Error> {
        let reference = req.reference;
        if reference.is_empty() {
            return Err(Error::InvalidArgument("reference is required".into()));
        }
        let (tx, rx) = mpsc::channel(64);
        let node = self.node.clone();
        self.node.tasks().spawn(async move {
            let report = reporter(tx.clone());
            let r = node.runtime().pull_image(&reference, &report).await;
            let last = match r {
                Ok(()) => Ok(pb::ImageProgress {
                    phase: "done".into(),
                    done: 1,
                    total: 1,
                    names: vec![reference],
                }),
                Err(e) => Err(Status::from(Error::from(e))),
            };
            let _ = tx.send(last).await;
        });
        Ok(progress_stream(rx))
    }

    async fn alias_image(
        &self,
        req: pb::AliasImageRequest,
    ) -> Result<pb::AliasImageResponse, Error> {
        if req.existing.is_empty() || req.alias.is_empty() {
            return Err(Error::InvalidArgument(
                "existing and alias are required".into(),
            ));
        }
        self.node
            .runtime()
            .alias_image(&req.existing, &req.alias)
            .await
            .map_err(Error::from)?;
        Ok(pb::AliasImageResponse {})
    }

    #[instrument(skip_all, fields(sandbox_id = %req.sandbox_id))]
    async fn issue_worker_token(
        &self,
        req: pb::IssueWorkerTokenRequest,
    ) -> Result<pb::IssueWorkerTokenResponse, Error> {
        let relay = self.node.relay().clone();
        if relay.is_hosted(&req.sandbox_id) {
            return Err(Error::FailedPrecondition {
                id: req.sandbox_id,
                state: "a compute sandbox: its only worker is its in-sandbox agent".into(),
            });
        }
        let id = req.sandbox_id;
        let given = (!req.token.is_empty()).then_some(req.token);
        let (token, replaced) = blocking(move || relay.credentials().issue(&id, given.as_deref()))
            .await?
            .map_err(Error::from)?;
        info!(replaced, "worker credential issued");
        Ok(pb::IssueWorkerTokenResponse {
            token: token.unwrap_or_default(),
            replaced,
        })
    }

    async fn list_worker_tokens(
        &self,
        _req: pb::ListWorkerTokensRequest,
    ) -> Result<pb::ListWorkerTokensResponse, Error> {
        // Ids and dates only: neither tokens (never kept) nor their digests leave the node.
        let creds = self.node.relay().credentials();
        let tokens = creds
            .list()
            .into_iter()
            .map(|e| pb::WorkerToken {
                sandbox_id: e.sandbox_id,
                issued_at: e.issued_at,
            })
            .collect();
        Ok(pb::ListWorkerTokensResponse { tokens })
    }

    #[instrument(skip_all, fields(sandbox_id = %req.sandbox_id))]
    async fn revoke_worker_token(
        &self,
        req: pb::RevokeWorkerTokenRequest,
    ) -> Result<pb::RevokeWorkerTokenResponse, Error> {
        let id = req.sandbox_id;
        let relay = self.node.relay().clone();
        let id2 = id.clone();
        blocking(move || relay.credentials().revoke(&id2))
            .await?
            .map_err(Error::from)?;
        // A revoked credential ends the worker that attached with it.
        let disconnected = self
            .node
            .relay()
            .disconnect_network(&id, "worker credential revoked");
        info!(disconnected, "worker credential revoked");
        Ok(pb::RevokeWorkerTokenResponse { disconnected })
    }

    async fn list_workers(
        &self,
        _req: pb::ListWorkersRequest,
    ) -> Result<pb::ListWorkersResponse, Error> {
        let mut workers: Vec<pb::WorkerInfo> = self
            .node
            .relay()
            .workers()
            .into_iter()
            .map(|w| pb::WorkerInfo {
                sandbox_id: w.hello.sandbox_id.clone(),
                origin: w.origin.word().into(),
                trust: w.hello.trust.clone(),
                capacity_max: w.hello.capacity_max,
                inflight: w.inflight() as u32,
                labels: w.hello.labels.clone(),
                capabilities: w.hello.capabilities.clone(),
                image: w.hello.image.clone(),
                arch: w.hello.arch.clone(),
                attached_at: rfc3339(w.attached_at),
            })
            .collect();
        workers.sort_by(|a, b| (&a.origin, &a.sandbox_id).cmp(&(&b.origin, &b.sandbox_id)));
        Ok(pb::ListWorkersResponse { workers })
    }
}

super::rpcs! {
    plain impl NodeAdmin for AdminService {
        streams {
            ImportImageStream = ProgressStream;
            PullImageStream = ProgressStream;
        }
        list_sandboxes(pb::ListSandboxesRequest) -> pb::ListSandboxesResponse = list_sandboxes;
        get_node(pb::GetNodeRequest) -> pb::GetNodeResponse = get_node;
        suspend_sandbox(pb::SuspendSandboxRequest) -> pb::SuspendResumeResponse = suspend_sandbox;
        resume_sandbox(pb::ResumeSandboxRequest) -> pb::SuspendResumeResponse = resume_sandbox;
        list_trash(pb::ListTrashRequest) -> pb::ListTrashResponse = list_trash;
        read_trash(pb::ReadTrashRequest) -> pb::ReadTrashResponse = read_trash;
        gc(pb::GcRequest) -> pb::GcResponse = gc;
        list_images(pb::ListImagesRequest) -> pb::ListImagesResponse = list_images;
        import_image(pb::ImportImageRequest) -> ProgressStream = import_image;
        pull_image(pb::PullImageRequest) -> ProgressStream = pull_image;
        alias_image(pb::AliasImageRequest) -> pb::AliasImageResponse = alias_image;
        issue_worker_token(pb::IssueWorkerTokenRequest) -> pb::IssueWorkerTokenResponse = issue_worker_token;
        list_worker_tokens(pb::ListWorkerTokensRequest) -> pb::ListWorkerTokensResponse = list_worker_tokens;
        revoke_worker_token(pb::RevokeWorkerTokenRequest) -> pb::RevokeWorkerTokenResponse = revoke_worker_token;
        list_workers(pb::ListWorkersRequest) -> pb::ListWorkersResponse = list_workers;
    }
}

fn rfc3339(t: std::time::SystemTime) -> String {
    chrono::DateTime::<chrono::Utc>::from(t).to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}
