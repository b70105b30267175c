//! WorkspaceService (durable workspaces and their snapshots) and SandboxService's
//! SyncSandboxWorkspace, on a node ([`crate::node::durable`]).
//!
//! Who may call: a namespace-addressed call (Create, List, ListSnapshots) passes the gate in
//! the namespace it names; an id-addressed one is authenticated, its workspace or snapshot
//! looked up, and the caller checked in that resource's namespace, where a namespace the
//! caller cannot see answers exactly as an unknown id (`workspace X not found`).
//!
//! Durable workspaces live on the node that made them. Through the router: a Create goes to
//! the placed node (a restore to the node holding the snapshot), an id-addressed call to the
//! node that holds the workspace or snapshot (found by asking the ready nodes in turn, with the
//! caller's credentials: each node checks the caller again), a List is every node's, merged;
//! a CreateSandbox mounting a durable workspace is placed on the node holding it.

use std::future::Future;

use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use super::access::Principal;
use super::records::Namespace;
use super::sandboxes::{Backend, Cluster};
use super::service::{Error, Platform};
use crate::api::convert::timestamp;
use crate::api::platform::v1 as pb;
use crate::node::durable::{Snapshot, WorkspaceInfo};
use crate::node::{self, Node};

fn workspace_pb(w: WorkspaceInfo) -> pb::Workspace {
    pb::Workspace {
        workspace_id: w.record.id,
        namespace: w.record.namespace,
        size: w.record.size.as_str().to_string(),
        attached_to: w.attached_to.unwrap_or_default(),
        created_at: Some(timestamp(w.record.created_at)),
        labels: w.record.labels.into_iter().collect(),
        storage_class: w.record.storage_class,
        disk_bytes: w.disk_bytes,
        restored_from: w.record.restored_from,
    }
}

fn snapshot_pb(s: Snapshot) -> pb::WorkspaceSnapshot {
    pb::WorkspaceSnapshot {
        snapshot_id: s.id,
        workspace_id: s.workspace_id,
        namespace: s.namespace,
        created_at: Some(timestamp(s.created_at)),
        size: s.size.as_str().to_string(),
        disk_bytes: s.disk_bytes,
        method: s.method,
        consistency: s.consistency,
        labels: s.labels.into_iter().collect(),
        took_ms: s.took_ms,
    }
}

type Client = pb::workspace_service_client::WorkspaceServiceClient<Channel>;

/// The first answer of `call` on the ready nodes (in turn) that is not NOT_FOUND, with the node
/// that gave it; NOT_FOUND (`what` not found) when every node says so, UNAVAILABLE when a node
/// that did not answer may hold it.
async fn on_holder<T, F, Fut>(
    c: &dyn Cluster,
    what: &str,
    call: F,
) -> Result<(T, (String, Channel)), Status>
where
    F: Fn(Client) -> Fut,
    Fut: Future<Output = Result<T, Status>>,
{
    let mut unavailable = None;
    for (name, ch) in c.named_nodes() {
        match call(Client::new(ch.clone())).await {
            Ok(v) => return Ok((v, (name, ch))),
            Err(s) if s.code() == tonic::Code::NotFound => {}
            Err(s) if s.code() == tonic::Code::Unavailable => unavailable = Some(s),
            Err(s) => return Err(s),
        }
    }
    Err(unavailable.unwrap_or_else(|| Status::not_found(format!("{what} not found"))))
}

impl Platform {
    /// The node holding workspace `id` (as the caller sees it) and its record there.
    pub(super) async fn workspace_holder(
        &self,
        c: &dyn Cluster,
        meta: &tonic::metadata::MetadataMap,
        p: &Principal,
        id: &str,
    ) -> Result<((String, Channel), pb::Workspace), Status> {
        let (w, at) = on_holder(c, &format!("workspace {id}"), |mut cl| {
            let q = self.to_node(
                pb::GetWorkspaceRequest {
                    workspace_id: id.to_string(),
                },
                meta,
                p,
            );
            async move { cl.get_workspace(q).await.map(|r| r.into_inner()) }
        })
        .await?;
        Ok((at, w))
    }

    /// The node (a router has none).
    fn workspace_node(&self) -> Result<Node, Status> {
        match self.backend()? {
            Backend::Node(n) => Ok(n.clone()),
            Backend::Cluster(_) => Err(Status::internal("not a node")),
        }
    }

    /// Gate for a namespace-addressed call; the namespace must exist.
    async fn gate_existing<T>(
        &self,
        req: &Request<T>,
        method: &str,
        ns: &str,
    ) -> Result<Principal, Status> {
        let p = self.gate(req, method, ns).await?;
        // A router's call (its secret checked by the gate) was checked against its records.
        if req.metadata().contains_key(super::auth::PEER_HEADER) {
            return Ok(p);
        }
        match self.records.get::<Namespace>(ns).await {
            Ok(Some(_)) => Ok(p),
            Ok(None) => Err(Status::not_found(format!("namespace {ns} not found"))),
            Err(e) => Err(Error::Store(e).into()),
        }
    }

    /// Authenticates an id-addressed workspace call, finds the workspace and checks the caller
    /// in its namespace (a hidden one answers like a missing id).
    async fn find_workspace<T>(
        &self,
        req: &Request<T>,
        method: &str,
        id: &str,
    ) -> Result<(Principal, Node, WorkspaceInfo), Status> {
        self.authenticated(req, method, id).await?;
        let node = self.workspace_node()?;
        let not_found = || Status::not_found(format!("workspace {id} not found"));
        let w = match node.get_workspace(id) {
            Ok(w) => w,
            Err(node::Error::Missing(_)) => return Err(not_found()),
            Err(e) => return Err(e.into()),
        };
        match self.gate(req, method, &w.record.namespace).await {
            Ok(p) => Ok((p, node, w)),
            Err(s) if s.code() == tonic::Code::NotFound => Err(not_found()),
            Err(s) => Err(s),
        }
    }

    pub(super) async fn create_workspace_here(
        &self,
        req: Request<pb::CreateWorkspaceRequest>,
        method: &str,
    ) -> Result<Response<pb::Workspace>, Status> {
        let r = req.get_ref();
        let p = self.gate_existing(&req, method, &r.namespace).await?;
        let node = match self.backend()? {
            Backend::Node(n) => n.clone(),
            Backend::Cluster(c) => {
                let made = self.forward_create_workspace(c.as_ref(), &req, &p).await;
                return self
                    .write_status(&p, method, &r.namespace, "", made)
                    .await
                    .map(Response::new);
            }
        };
        let done = async {
            super::records::check_labels(&r.labels.clone().into_iter().collect())?;
            if !r.snapshot_id.is_empty() {
                // Restoring another namespace's snapshot is as if it did not exist.
                node.snapshot(&r.namespace, &r.snapshot_id).await?;
            }
            let w = node
                .create_workspace(
                    &r.namespace,
                    &r.size,
                    &r.storage_class,
                    r.labels.clone().into_iter().collect(),
                    &r.snapshot_id,
                )
                .await?;
            Ok::<_, Error>(w)
        }
        .await;
        let w = self
            .write_noted(&p, method, &r.namespace, "", done, |w| {
                format!("workspace {}", w.record.id)
            })
            .await?;
        Ok(Response::new(workspace_pb(w)))
    }

    /// A CreateWorkspace through the router: a restore on the node holding the snapshot, a new
    /// one on the first placed node that takes it.
    async fn forward_create_workspace(
        &self,
        c: &dyn Cluster,
        req: &Request<pb::CreateWorkspaceRequest>,
        p: &Principal,
    ) -> Result<pb::Workspace, Status> {
        let r = req.get_ref();
        let targets = if r.snapshot_id.is_empty() {
            c.place(&r.namespace, &uuid::Uuid::new_v4().to_string())
        } else {
            let want = r.snapshot_id.clone();
            let (_, at) = on_holder(c, &format!("snapshot {want}"), |mut cl| {
                let q = self.to_node(
                    pb::ListWorkspaceSnapshotsRequest {
                        namespace: r.namespace.clone(),
                        workspace_id: String::new(),
                    },
                    req.metadata(),
                    p,
                );
                let want = want.clone();
                async move {
                    let l = cl.list_workspace_snapshots(q).await?.into_inner();
                    match l.snapshots.iter().any(|s| s.snapshot_id == want) {
                        true => Ok(()),
                        false => Err(Status::not_found("")),
                    }
                }
            })
            .await?;
            vec![at]
        };
        let mut last = Status::unavailable("no node is ready");
        for (_, ch) in targets {
            let q = self.to_node(r.clone(), req.metadata(), p);
            match Client::new(ch).create_workspace(q).await {
                Ok(w) => return Ok(w.into_inner()),
                Err(s) if super::sandboxes::another_node_may(&s) => last = s,
                Err(s) => return Err(s),
            }
        }
        Err(last)
    }

    pub(super) async fn get_workspace_here(
        &self,
        req: Request<pb::GetWorkspaceRequest>,
        method: &str,
    ) -> Result<Response<pb::Workspace>, Status> {
        let id = req.get_ref().workspace_id.clone();
        if let Backend::Cluster(c) = self.backend()? {
            let p = self.authenticated(&req, method, &id).await?;
            let (_, w) = self
                .workspace_holder(c.as_ref(), req.metadata(), &p, &id)
                .await?;
            return Ok(Response::new(w));
        }
        let (_, _, w) = self.find_workspace(&req, method, &id).await?;
        Ok(Response::new(workspace_pb(w)))
    }

    pub(super) async fn list_workspaces_here(
        &self,
        req: Request<pb::ListWorkspacesRequest>,
        method: &str,
    ) -> Result<Response<pb::ListWorkspacesResponse>, Status> {
        let ns = req.get_ref().namespace.clone();
        let p = self.gate_existing(&req, method, &ns).await?;
        if let Backend::Cluster(c) = self.backend()? {
            let calls = c.nodes().into_iter().map(|ch| {
                let q = self.to_node(req.get_ref().clone(), req.metadata(), &p);
                async move { Client::new(ch).list_workspaces(q).await }
            });
            let mut all = vec![];
            for r in futures::future::join_all(calls).await {
                all.extend(r?.into_inner().workspaces);
            }
            all.sort_by_key(|w| {
                let t = w.created_at.unwrap_or_default();
                (t.seconds, t.nanos, w.workspace_id.clone())
            });
            return Ok(Response::new(pb::ListWorkspacesResponse {
                workspaces: all,
            }));
        }
        let node = self.workspace_node()?;
        let all = node.list_workspaces(&ns).await.map_err(Status::from)?;
        Ok(Response::new(pb::ListWorkspacesResponse {
            workspaces: all.into_iter().map(workspace_pb).collect(),
        }))
    }

    pub(super) async fn delete_workspace_here(
        &self,
        req: Request<pb::DeleteWorkspaceRequest>,
        method: &str,
    ) -> Result<Response<pb::DeleteWorkspaceResponse>, Status> {
        let id = req.get_ref().workspace_id.clone();
        if let Backend::Cluster(c) = self.backend()? {
            let p = self.authenticated(&req, method, &id).await?;
            let r = async {
                let ((_, ch), w) = self
                    .workspace_holder(c.as_ref(), req.metadata(), &p, &id)
                    .await?;
                let q = self.to_node(req.get_ref().clone(), req.metadata(), &p);
                Client::new(ch).delete_workspace(q).await?;
                Ok(w.namespace)
            }
            .await;
            let ns = r.as_ref().ok().cloned().unwrap_or_default();
            self.write_status(&p, method, &ns, &id, r).await?;
            return Ok(Response::new(pb::DeleteWorkspaceResponse {}));
        }
        let (p, node, w) = self.find_workspace(&req, method, &id).await?;
        let done = node.delete_workspace(&id).await.map_err(Error::from);
        self.write(&p, method, &w.record.namespace, &id, done)
            .await?;
        Ok(Response::new(pb::DeleteWorkspaceResponse {}))
    }

    pub(super) async fn snapshot_workspace_here(
        &self,
        req: Request<pb::SnapshotWorkspaceRequest>,
        method: &str,
    ) -> Result<Response<pb::WorkspaceSnapshot>, Status> {
        let r = req.get_ref();
        if let Backend::Cluster(c) = self.backend()? {
            let p = self.authenticated(&req, method, &r.workspace_id).await?;
            let res = async {
                let ((_, ch), w) = self
                    .workspace_holder(c.as_ref(), req.metadata(), &p, &r.workspace_id)
                    .await?;
                let q = self.to_node(r.clone(), req.metadata(), &p);
                Ok((
                    Client::new(ch).snapshot_workspace(q).await?.into_inner(),
                    w.namespace,
                ))
            }
            .await;
            let ns = res.as_ref().map(|(_, n)| n.clone()).unwrap_or_default();
            let (s, _) = self
                .write_status(&p, method, &ns, &r.workspace_id, res)
                .await?;
            return Ok(Response::new(s));
        }
        let (p, node, w) = self.find_workspace(&req, method, &r.workspace_id).await?;
        let done = async {
            super::records::check_labels(&r.labels.clone().into_iter().collect())?;
            Ok::<_, Error>(
                node.snapshot_workspace(&r.workspace_id, r.labels.clone().into_iter().collect())
                    .await?,
            )
        }
        .await;
        let s = self
            .write_noted(
                &p,
                method,
                &w.record.namespace,
                &r.workspace_id,
                done,
                |s| {
                    format!(
                        "snapshot {} ({}, {} bytes, {} ms)",
                        s.id, s.method, s.disk_bytes, s.took_ms
                    )
                },
            )
            .await?;
        Ok(Response::new(snapshot_pb(s)))
    }

    pub(super) async fn list_snapshots_here(
        &self,
        req: Request<pb::ListWorkspaceSnapshotsRequest>,
        method: &str,
    ) -> Result<Response<pb::ListWorkspaceSnapshotsResponse>, Status> {
        let r = req.get_ref();
        let p = self.gate_existing(&req, method, &r.namespace).await?;
        if let Backend::Cluster(c) = self.backend()? {
            let calls = c.nodes().into_iter().map(|ch| {
                let q = self.to_node(r.clone(), req.metadata(), &p);
                async move { Client::new(ch).list_workspace_snapshots(q).await }
            });
            let mut all = vec![];
            for res in futures::future::join_all(calls).await {
                all.extend(res?.into_inner().snapshots);
            }
            all.sort_by_key(|s| {
                let t = s.created_at.unwrap_or_default();
                (t.seconds, t.nanos, s.snapshot_id.clone())
            });
            return Ok(Response::new(pb::ListWorkspaceSnapshotsResponse {
                snapshots: all,
            }));
        }
        let node = self.workspace_node()?;
        let all = node
            .list_snapshots(&r.namespace, &r.workspace_id)
            .await
            .map_err(Status::from)?;
        Ok(Response::new(pb::ListWorkspaceSnapshotsResponse {
            snapshots: all.into_iter().map(snapshot_pb).collect(),
        }))
    }

    pub(super) async fn delete_snapshot_here(
        &self,
        req: Request<pb::DeleteWorkspaceSnapshotRequest>,
        method: &str,
    ) -> Result<Response<pb::DeleteWorkspaceSnapshotResponse>, Status> {
        let id = req.get_ref().snapshot_id.clone();
        let p = self.authenticated(&req, method, &id).await?;
        if let Backend::Cluster(c) = self.backend()? {
            let r = on_holder(c.as_ref(), &format!("snapshot {id}"), |mut cl| {
                let q = self.to_node(req.get_ref().clone(), req.metadata(), &p);
                async move { cl.delete_workspace_snapshot(q).await }
            })
            .await
            .map(|(r, _)| r.into_inner());
            return self
                .write_status(&p, method, "", &id, r)
                .await
                .map(Response::new);
        }
        let node = self.workspace_node()?;
        let not_found = || Status::not_found(format!("snapshot {id} not found"));
        let s = match node.snapshot("", &id).await {
            Ok(s) => s,
            Err(node::Error::Missing(_)) => return Err(not_found()),
            Err(e) => return Err(e.into()),
        };
        let p = match self.gate(&req, method, &s.namespace).await {
            Ok(p) => p,
            Err(st) if st.code() == tonic::Code::NotFound => return Err(not_found()),
            Err(st) => return Err(st),
        };
        let done = node.delete_snapshot(&id).await.map_err(Error::from);
        self.write(&p, method, &s.namespace, &id, done).await?;
        Ok(Response::new(pb::DeleteWorkspaceSnapshotResponse {}))
    }

    pub(super) async fn sync_workspace_here(
        &self,
        req: Request<pb::SyncSandboxWorkspaceRequest>,
        method: &str,
    ) -> Result<Response<pb::SyncSandboxWorkspaceResponse>, Status> {
        let id = req.get_ref().sandbox_id.clone();
        let node = match self.backend()? {
            Backend::Node(n) => n.clone(),
            Backend::Cluster(c) => {
                let (p, mut cl) = self.owner_client(c.as_ref(), &req, method, &id).await?;
                let q = self.to_node(req.get_ref().clone(), req.metadata(), &p);
                let r = cl.sync_sandbox_workspace(q).await.map(|r| r.into_inner());
                return self
                    .write_status(&p, method, "", &id, r)
                    .await
                    .map(Response::new);
            }
        };
        let (p, sb) = self.find(&node, &req, method, &id).await?;
        let ns = super::sandboxes::namespace_of(&sb).to_string();
        let ws = req.get_ref().workspace_id.clone();
        let done = async {
            super::sandboxes::read_only(&sb)?;
            Ok::<_, Error>(node.sync_workspace(&sb, &ws).await?)
        }
        .await;
        let s = self
            .write_noted(&p, method, &ns, &id, done, |s| {
                format!("{} files, {} bytes flushed", s.files, s.bytes)
            })
            .await?;
        Ok(Response::new(pb::SyncSandboxWorkspaceResponse {
            files_flushed: s.files,
            bytes_flushed: s.bytes,
            // One writer per workspace, and the mount is the store: nothing to reconcile.
            conflict_paths: vec![],
        }))
    }
}
