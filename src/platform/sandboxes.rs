//! SandboxService's sandboxes: Create, Get, List, Delete, Watch and TailLogs.
//!
//! On a node they are the node's own sandboxes ([`crate::node::platform`]); on the router they
//! are forwarded to the nodes ([`Cluster`]), the caller's `authorization` passed on unchanged
//! so that each node checks it again against the records it shares with the router.
//!
//! Who may call: every call passes [`Platform::gate`] in the namespace it acts in. An
//! id-addressed call is authenticated first, then its sandbox is looked up and the caller is
//! checked in the sandbox's namespace; a namespace the caller cannot see answers exactly as an
//! unknown id does (`sandbox X not found`), so ids do not leak across namespaces.
//!
//! States: a node sandbox STARTING is PENDING, READY is RUNNING, FAILED is FAILED and
//! DESTROYED is TERMINATED. A workload that exits leaves its sandbox RUNNING (it still takes
//! execs) with `state_reason` saying how the workload ended.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use super::access::Principal;
use super::auth;
use super::records::{self, Environment, Outcome};
use super::service::{credentials, Error, Platform, Stream_};
use crate::api::convert::timestamp;
use crate::api::platform::v1 as pb;
use crate::node::platform::{self as np, ExtraMount, PlatformSpec, Workload, NO_LIFETIME_LIMIT};
use crate::node::runlog::{Entry, Kind, Marker};
use crate::node::{self, Node, Sandbox, Status as NodeStatus};

/// Default and largest page of ListSandboxes.
const PAGE_DEFAULT: u32 = 100;
const PAGE_MAX: u32 = 1000;
/// The binary metadata a router hands a node the environment of a create in (JSON), with the
/// peer secret.
const ENVIRONMENT_HEADER: &str = "x-compute-environment-bin";
/// Default `limit` of TailSandboxLogs.
const TAIL_LIMIT: u32 = 2000;

/// The router's view of the nodes, for forwarding the platform's sandbox calls.
#[tonic::async_trait]
pub trait Cluster: Send + Sync {
    /// A channel to the node that owns `sandbox_id` (NOT_FOUND when none does).
    async fn owner(&self, sandbox_id: &str) -> Result<tonic::transport::Channel, Status>;
    /// Channels to every ready node.
    fn nodes(&self) -> Vec<tonic::transport::Channel>;
    /// Every ready node, by name.
    fn named_nodes(&self) -> Vec<(String, tonic::transport::Channel)>;
    /// The nodes (name, channel) that may take a new sandbox keyed by `key`, best first.
    fn place(&self, namespace: &str, key: &str) -> Vec<(String, tonic::transport::Channel)>;
    /// Notes that `node` owns `sandbox_id` (it just made it).
    fn remember(&self, sandbox_id: &str, node: &str);
}

/// Where the platform's sandboxes live.
#[derive(Clone)]
pub enum Backend {
    /// This node's.
    Node(Node),
    /// The nodes behind this router.
    Cluster(Arc<dyn Cluster>),
}

/// FAILED_PRECONDITION for a compute.v1 sandbox: the platform shows it read-only.
pub(super) fn read_only(sb: &Sandbox) -> std::result::Result<(), Error> {
    if sb.platform.is_none() {
        return Err(node::Error::FailedPrecondition {
            id: sb.id.clone(),
            state: "a compute.v1 sandbox (read-only here: compute.v1 suspends it when idle)".into(),
        }
        .into());
    }
    Ok(())
}

/// The gRPC state of a node sandbox.
pub fn state_of(s: NodeStatus) -> pb::SandboxState {
    match s {
        NodeStatus::Starting => pb::SandboxState::Pending,
        NodeStatus::Ready => pb::SandboxState::Running,
        NodeStatus::Suspending => pb::SandboxState::Suspending,
        NodeStatus::Suspended => pb::SandboxState::Suspended,
        NodeStatus::Resuming => pb::SandboxState::Resuming,
        NodeStatus::Failed => pb::SandboxState::Failed,
        NodeStatus::Destroyed => pb::SandboxState::Terminated,
    }
}

/// The namespace a node sandbox shows in: its spec's, or a compute.v1 sandbox's tenant.
pub(super) fn namespace_of(sb: &Sandbox) -> &str {
    sb.platform
        .as_ref()
        .map(|p| p.namespace.as_str())
        .unwrap_or(&sb.tenant_id)
}

/// The API's view of node sandbox `sb`.
pub fn sandbox_pb(node: &Node, sb: &Sandbox) -> pb::Sandbox {
    let st = sb.state();
    let live = node.egress(&sb.id);
    let deleting = node.is_deleting(&sb.id);
    let workload = node.workload(&sb.id).borrow().clone();
    let state = state_of(st.status);
    let reason = match (st.status, &workload) {
        (NodeStatus::Destroyed, _) if deleting => "deleted".to_string(),
        (NodeStatus::Ready, Workload::Exited(c)) => format!("workload exited with code {c}"),
        (NodeStatus::Ready, Workload::OomKilled) => "workload killed: out of memory".into(),
        (NodeStatus::Ready, Workload::Lost) => {
            "workload no longer followed (the node restarted)".into()
        }
        _ => st.reason.clone(),
    };
    let spec = sb.platform.clone().unwrap_or_default();
    let max_lifetime = Some(sb.limits.max_runtime).filter(|d| *d < NO_LIFETIME_LIMIT);
    pb::Sandbox {
        sandbox_id: sb.id.clone(),
        namespace: namespace_of(sb).to_string(),
        environment: spec.environment.clone(),
        state: state as i32,
        state_reason: reason,
        origin: if sb.platform.is_some() {
            pb::SandboxOrigin::Platform
        } else {
            pb::SandboxOrigin::ComputeV1
        } as i32,
        argv: spec.argv.clone(),
        exec_only: spec.exec_only,
        env: spec.env.clone().into_iter().collect(),
        working_dir: spec.working_dir.clone(),
        resources: Some(pb::Resources {
            cpu_millis: sb.limits.cpu_millis,
            memory_bytes: sb.limits.memory_bytes,
            disk_bytes: sb.workspace.size.bytes(),
        }),
        workspaces: std::iter::once((
            &sb.workspace.mount_path,
            spec.read_only,
            &sb.workspace.size,
            &spec.workspace_id,
        ))
        .chain(
            sb.extra_mounts()
                .iter()
                .map(|m| (&m.mount_path, m.read_only, &m.size, &m.workspace_id)),
        )
        .map(|(path, read_only, size, ws)| pb::WorkspaceMount {
            workspace_id: ws.clone(),
            mount_path: path.clone(),
            mode: if read_only {
                pb::MountMode::ReadOnly
            } else {
                pb::MountMode::ReadWrite
            } as i32,
            size: size.to_string(),
        })
        .collect(),
        // What is enforced now: none without a network (a node without `[egress]` gives
        // none, whatever the environment asks: the sandbox reaches nothing).
        egress_base: live.as_ref().map(|e| super::service::egress_pb(&e.base)),
        egress_grants: live
            .as_ref()
            .map(|e| e.grants.iter().map(grant_pb).collect())
            .unwrap_or_default(),
        exposures: node
            .exposures(&sb.id)
            .iter()
            .map(|e| exposure_pb(e, node.preview_url(&sb.id, e.port)))
            .collect(),
        // GetSandbox fills it (a reading of the meter).
        usage: None,
        idle_suspend_sec: spec.idle_suspend_sec,
        max_lifetime_sec: spec.max_lifetime_sec,
        run: 1,
        node: node.config().node_name.clone(),
        labels: spec.labels.clone().into_iter().collect(),
        created_at: Some(timestamp(sb.created_at)),
        updated_at: Some(timestamp(
            node.changed_at(&sb.id)
                .map_or(st.since, |w| w.max(st.since))
                .max(sb.created_at),
        )),
        // The idle clock (exec, file calls and keep-alives keep it fresh).
        idle_suspend_at: (state == pb::SandboxState::Running)
            .then(|| node.idle_suspend_at(sb).map(timestamp))
            .flatten(),
        expires_at: max_lifetime.map(|d| timestamp(sb.created_at + d)),
    }
}

fn entry_pb(e: &Entry) -> pb::LogEntry {
    let (stream, marker) = match e.kind {
        Kind::Stdout => (pb::LogStream::Stdout, pb::LogMarker::Unspecified),
        Kind::Stderr => (pb::LogStream::Stderr, pb::LogMarker::Unspecified),
        Kind::Marker(m) => (
            pb::LogStream::Marker,
            match m {
                Marker::Created => pb::LogMarker::Created,
                Marker::Started => pb::LogMarker::Started,
                Marker::Exited => pb::LogMarker::Exited,
                Marker::OomKilled => pb::LogMarker::OomKilled,
                Marker::Suspended => pb::LogMarker::Suspended,
                Marker::Resumed => pb::LogMarker::Resumed,
                Marker::Failed => pb::LogMarker::Failed,
                Marker::Terminated => pb::LogMarker::Terminated,
                Marker::Deleted => pb::LogMarker::Deleted,
            },
        ),
    };
    pb::LogEntry {
        offset: e.offset,
        run: e.run,
        time: Some(timestamp(e.time)),
        stream: stream as i32,
        data: e.data.clone(),
        marker: marker as i32,
        exit_code: e.exit_code,
    }
}

/// What a CreateSandbox asks for, checked; everything but what needs the environment.
fn check_create(r: &pb::CreateSandboxRequest) -> Result<(), Error> {
    let invalid = |m: String| Err(Error::Invalid(records::Invalid(m)));
    if r.environment.is_empty() {
        return invalid("environment is required".into());
    }
    records::check_env(&r.env.clone().into_iter().collect())?;
    if !r.working_dir.is_empty() {
        records::check_clean_abs("working_dir", &r.working_dir)?;
    }
    if r.argv.iter().any(|a| a.contains('\0')) {
        return invalid("argv contains NUL".into());
    }
    if !r.workspace_id.is_empty() && !r.workspaces.is_empty() {
        return invalid("set workspace_id or workspaces, not both".into());
    }
    records::check_mounts(&super::service::mounts_of(&r.workspaces))?;
    if r.idempotency_key.len() > 256 {
        return invalid("idempotency_key is longer than 256 bytes".into());
    }
    Ok(())
}

/// Splits an environment reference: `name` or `namespace/name`.
fn environment_ref<'a>(namespace: &'a str, r: &'a str) -> (&'a str, &'a str) {
    r.split_once('/').unwrap_or((namespace, r))
}

impl Platform {
    pub(super) fn backend(&self) -> Result<&Backend, Status> {
        self.sandboxes.as_ref().ok_or_else(|| {
            Status::unimplemented("this server runs no sandboxes (no node behind it)")
        })
    }

    /// Authenticates an id-addressed call, finds its sandbox on this node and checks the
    /// caller in the sandbox's namespace (a hidden one answers NOT_FOUND like a missing id).
    pub(super) async fn find(
        &self,
        node: &Node,
        req: &Request<impl Sized>,
        method: &str,
        id: &str,
    ) -> Result<(Principal, Arc<Sandbox>), Status> {
        self.authenticated(req, method, id).await?;
        let not_found = || Status::not_found(format!("sandbox {id} not found"));
        let sb = match node.get(id) {
            Ok(sb) if !node.is_deleting(&sb.id) => sb,
            Ok(_) | Err(node::Error::NotFound(_)) => return Err(not_found()),
            Err(e) => return Err(e.into()),
        };
        match self.gate(req, method, namespace_of(&sb)).await {
            Ok(p) => Ok((p, sb)),
            Err(s) if s.code() == tonic::Code::NotFound => Err(not_found()),
            Err(s) => Err(s),
        }
    }

    /// CreateSandbox on this node.
    pub(super) async fn create_sandbox_here(
        &self,
        req: Request<pb::CreateSandboxRequest>,
        method: &str,
    ) -> Result<Response<pb::Sandbox>, Status> {
        let ns = req.get_ref().namespace.clone();
        let p = self.gate(&req, method, &ns).await?;
        let node = match self.backend()? {
            Backend::Node(n) => n.clone(),
            Backend::Cluster(c) => {
                let c = c.clone();
                let r = self.forward_create(c.as_ref(), &req, &p).await;
                let resource = r.as_ref().map(|s| s.sandbox_id.clone()).unwrap_or_default();
                return self
                    .write_status(&p, method, &ns, &resource, r)
                    .await
                    .map(Response::new);
            }
        };
        // A router that checked the call hands over the environment from its records.
        let handed = req
            .metadata()
            .contains_key(auth::PEER_HEADER)
            .then(|| req.metadata().get_bin(ENVIRONMENT_HEADER))
            .flatten()
            .and_then(|v| v.to_bytes().ok())
            .and_then(|b| serde_json::from_slice::<Environment>(&b).ok());
        let r = self.create_on(&node, &ns, req.get_ref(), handed).await;
        let resource = r.as_ref().map(|s| s.id.clone()).unwrap_or_default();
        self.write(&p, method, &ns, &resource, r)
            .await
            .map(|sb| Response::new(sandbox_pb(&node, &sb)))
    }

    async fn create_on(
        &self,
        node: &Node,
        ns: &str,
        r: &pb::CreateSandboxRequest,
        handed: Option<Environment>,
    ) -> Result<Arc<Sandbox>, Error> {
        let env = match handed {
            Some(e) if e.namespace == ns && e.name == environment_ref(ns, &r.environment).1 => {
                check_create(r)?;
                e
            }
            _ => self.environment_for(ns, r).await?,
        };
        let env_name = env.name.as_str();
        let mut mounts = if r.workspaces.is_empty() {
            env.workspaces.clone()
        } else {
            super::service::mounts_of(&r.workspaces)
        };
        if !r.workspace_id.is_empty() {
            // One durable workspace, read-write, at the environment's first mount path.
            let at = mounts
                .first()
                .map(|m| m.mount_path.clone())
                .unwrap_or_else(|| "/workspace".into());
            mounts = vec![records::Mount {
                workspace_id: r.workspace_id.clone(),
                mount_path: at,
                read_only: false,
                size: String::new(),
            }];
        }
        records::check_mounts(&mounts)?;
        // A durable workspace must be this namespace's (another's answers as a missing one)
        // and takes its own size.
        for m in mounts.iter_mut().filter(|m| !m.workspace_id.is_empty()) {
            match node.get_workspace(&m.workspace_id) {
                Ok(w) if w.record.namespace == ns => m.size = w.record.size.as_str().to_string(),
                _ => return Err(Error::NotFound(format!("workspace {}", m.workspace_id))),
            }
        }
        let res = match &r.resources {
            Some(x) => records::Resources {
                cpu_millis: x.cpu_millis,
                memory_bytes: x.memory_bytes,
                disk_bytes: x.disk_bytes,
            },
            None => env.resources.clone(),
        };
        let mut argv = if !r.argv.is_empty() {
            r.argv.clone()
        } else {
            env.default_argv.clone()
        };
        let mut working_dir = if !r.working_dir.is_empty() {
            r.working_dir.clone()
        } else {
            env.working_dir.clone()
        };
        if r.exec_only {
            argv.clear();
        } else if argv.is_empty() || working_dir.is_empty() {
            let (image_argv, image_dir) = node.image_argv(&env.image).await?;
            if argv.is_empty() {
                argv = image_argv;
            }
            if working_dir.is_empty() {
                working_dir = image_dir;
            }
        }
        if !r.exec_only && argv.is_empty() {
            return Err(Error::FailedPrecondition(format!(
                "no workload: the request, environment {env_name} and image {} give no command \
                 (set argv, or exec_only)",
                env.image
            )));
        }
        let mut wl_env: BTreeMap<String, String> = env.env.clone();
        wl_env.extend(r.env.clone());
        let mount = mounts.first();
        // A mount's size: its own, else the request's (or environment's) disk_bytes, else the
        // node's default workspace size.
        let size_of = |m: Option<&records::Mount>| match m.map(|m| m.size.as_str()) {
            Some(s) if !s.is_empty() => s.to_string(),
            _ if res.disk_bytes > 0 => res.disk_bytes.to_string(),
            _ => String::new(),
        };
        let size = size_of(mount);
        let mut extra = Vec::new();
        for m in mounts.iter().skip(1) {
            // Zero (no size anywhere) is the node's default: the node resolves and bounds it.
            // (check_mounts parsed every size given.)
            let size = size_of(Some(m))
                .parse()
                .unwrap_or_else(|_| crate::size::ByteSize::zero());
            extra.push(ExtraMount {
                mount_path: m.mount_path.clone(),
                size,
                read_only: m.read_only,
                workspace_id: m.workspace_id.clone(),
            });
        }
        let spec = PlatformSpec {
            namespace: ns.to_string(),
            environment: env_name.to_string(),
            argv,
            exec_only: r.exec_only,
            env: wl_env,
            working_dir,
            labels: r.labels.clone().into_iter().collect(),
            max_lifetime_sec: env.max_lifetime_sec,
            idle_suspend_sec: env.idle_suspend_sec,
            // The request's base policy, else the environment's (none: deny-all).
            egress: super::service::egress_of(&r.egress)?
                .map(|e| e.check().map(|_| e))
                .transpose()?
                .or_else(|| env.egress.clone())
                .and_then(|e| serde_json::to_value(e).ok()),
            // The node gives it one when it has networks.
            network: None,
            idempotency_key: r.idempotency_key.clone(),
            read_only: mount.is_some_and(|m| m.read_only),
            mounts: extra,
            workspace_id: mount.map(|m| m.workspace_id.clone()).unwrap_or_default(),
        };
        let session_id = if r.idempotency_key.is_empty() {
            format!("platform/{}", uuid::Uuid::new_v4())
        } else {
            format!("platform/key/{}", r.idempotency_key)
        };
        let req = node::CreateRequest {
            tenant_id: ns.to_string(),
            session_id,
            image: env.image.clone(),
            storage_class: String::new(),
            size,
            mount_path: mount.map(|m| m.mount_path.clone()).unwrap_or_default(),
            cpu_millis: res.cpu_millis,
            memory_bytes: res.memory_bytes,
            max_runtime: Some(match env.max_lifetime_sec {
                0 => NO_LIFETIME_LIMIT,
                s => Duration::from_secs(u64::from(s)),
            }),
            platform: Some(Arc::new(spec)),
        };
        Ok(node.create_platform(req).await?)
    }

    /// The environment a create names, after the checks that need none: NOT_FOUND when it
    /// is missing, PERMISSION_DENIED when it is another namespace's.
    async fn environment_for(
        &self,
        ns: &str,
        r: &pb::CreateSandboxRequest,
    ) -> Result<Environment, Error> {
        check_create(r)?;
        let (env_ns, env_name) = environment_ref(ns, &r.environment);
        if env_ns != ns {
            return Err(Error::PermissionDenied(format!(
                "environment {env_ns}/{env_name} is in another namespace than the sandbox ({ns})"
            )));
        }
        self.records
            .get::<Environment>(&format!("{ns}/{env_name}"))
            .await?
            .ok_or_else(|| Error::NotFound(format!("environment {ns}/{env_name}")))
    }

    /// GetSandbox.
    pub(super) async fn get_sandbox_here(
        &self,
        req: Request<pb::GetSandboxRequest>,
        method: &str,
    ) -> Result<Response<pb::Sandbox>, Status> {
        let id = req.get_ref().sandbox_id.clone();
        match self.backend()? {
            Backend::Node(node) => {
                let (_, sb) = self.find(node, &req, method, &id).await?;
                let mut out = sandbox_pb(node, &sb);
                // Get reads the meter now; List and Watch leave usage unset (a page of
                // sandboxes would read every one's cgroup).
                out.usage = Some(node.usage(&sb).await.into());
                Ok(Response::new(out))
            }
            Backend::Cluster(c) => {
                let (p, mut cl) = self.owner_client(c.as_ref(), &req, method, &id).await?;
                let q = self.to_node(req.get_ref().clone(), req.metadata(), &p);
                cl.get_sandbox(q).await
            }
        }
    }

    /// DeleteSandbox.
    pub(super) async fn delete_sandbox_here(
        &self,
        req: Request<pb::DeleteSandboxRequest>,
        method: &str,
    ) -> Result<Response<pb::DeleteSandboxResponse>, Status> {
        let id = req.get_ref().sandbox_id.clone();
        match self.backend()? {
            Backend::Node(node) => {
                let (p, sb) = self.find(node, &req, method, &id).await?;
                let ns = namespace_of(&sb).to_string();
                let r = node
                    .delete_platform(&sb.id)
                    .await
                    .map_err(Error::from)
                    .map(|u| pb::DeleteSandboxResponse {
                        total_usage: Some(u.into()),
                    });
                self.write(&p, method, &ns, &id, r).await.map(Response::new)
            }
            Backend::Cluster(c) => {
                let (p, mut cl) = self.owner_client(c.as_ref(), &req, method, &id).await?;
                let q = self.to_node(req.get_ref().clone(), req.metadata(), &p);
                let r = cl.delete_sandbox(q).await.map(|r| r.into_inner());
                self.write_status(&p, method, "", &id, r)
                    .await
                    .map(Response::new)
            }
        }
    }

    /// SuspendSandbox: checkpoints a RUNNING platform sandbox with its memory (a SUSPENDED
    /// one is returned as it is); a compute.v1 sandbox is read-only here.
    pub(super) async fn suspend_sandbox_here(
        &self,
        req: Request<pb::SuspendSandboxRequest>,
        method: &str,
    ) -> Result<Response<pb::Sandbox>, Status> {
        let id = req.get_ref().sandbox_id.clone();
        match self.backend()? {
            Backend::Node(node) => {
                let (p, sb) = self.find(node, &req, method, &id).await?;
                let ns = namespace_of(&sb).to_string();
                let r = match read_only(&sb) {
                    Err(e) => Err(e),
                    Ok(()) => node
                        .suspend(&sb.id, node::suspend::Cause::Request)
                        .await
                        .map(|sb| sandbox_pb(node, &sb))
                        .map_err(Error::from),
                };
                self.write(&p, method, &ns, &id, r).await.map(Response::new)
            }
            Backend::Cluster(c) => {
                let (p, mut cl) = self.owner_client(c.as_ref(), &req, method, &id).await?;
                let q = self.to_node(req.get_ref().clone(), req.metadata(), &p);
                let r = cl.suspend_sandbox(q).await.map(|r| r.into_inner());
                self.write_status(&p, method, "", &id, r)
                    .await
                    .map(Response::new)
            }
        }
    }

    /// ResumeSandbox: restores a SUSPENDED platform sandbox with its memory (or starts it
    /// afresh from its record when the checkpoint cannot be restored), or revives a FAILED
    /// one; returns it RUNNING. A RUNNING one is returned as it is.
    pub(super) async fn resume_sandbox_here(
        &self,
        req: Request<pb::ResumeSandboxRequest>,
        method: &str,
    ) -> Result<Response<pb::Sandbox>, Status> {
        let id = req.get_ref().sandbox_id.clone();
        match self.backend()? {
            Backend::Node(node) => {
                let (p, sb) = self.find(node, &req, method, &id).await?;
                let ns = namespace_of(&sb).to_string();
                let r = match read_only(&sb) {
                    Err(e) => Err(e),
                    Ok(()) => node
                        .resume(&sb.id)
                        .await
                        .map(|(sb, _)| sandbox_pb(node, &sb))
                        .map_err(Error::from),
                };
                self.write(&p, method, &ns, &id, r).await.map(Response::new)
            }
            Backend::Cluster(c) => {
                let (p, mut cl) = self.owner_client(c.as_ref(), &req, method, &id).await?;
                let q = self.to_node(req.get_ref().clone(), req.metadata(), &p);
                let r = cl.resume_sandbox(q).await.map(|r| r.into_inner());
                self.write_status(&p, method, "", &id, r)
                    .await
                    .map(Response::new)
            }
        }
    }

    /// KeepSandboxAlive: restarts the idle clock of a RUNNING sandbox (a read-level call).
    pub(super) async fn keep_alive_here(
        &self,
        req: Request<pb::KeepSandboxAliveRequest>,
        method: &str,
    ) -> Result<Response<pb::KeepSandboxAliveResponse>, Status> {
        let id = req.get_ref().sandbox_id.clone();
        match self.backend()? {
            Backend::Node(node) => {
                let (_, sb) = self.find(node, &req, method, &id).await?;
                let (_, at) = node.keep_alive(&sb.id).map_err(Error::from)?;
                let in_sec = at.map_or(0, |at| {
                    at.duration_since(SystemTime::now())
                        .unwrap_or_default()
                        .as_secs()
                        .min(u64::from(u32::MAX)) as u32
                });
                Ok(Response::new(pb::KeepSandboxAliveResponse {
                    idle_suspend_at: at.map(timestamp),
                    idle_suspend_in_sec: in_sec,
                }))
            }
            Backend::Cluster(c) => {
                let (p, mut cl) = self.owner_client(c.as_ref(), &req, method, &id).await?;
                let q = self.to_node(req.get_ref().clone(), req.metadata(), &p);
                cl.keep_sandbox_alive(q).await
            }
        }
    }

    /// ListSandboxes.
    pub(super) async fn list_sandboxes_here(
        &self,
        req: Request<pb::ListSandboxesRequest>,
        method: &str,
    ) -> Result<Response<pb::ListSandboxesResponse>, Status> {
        let r = req.get_ref().clone();
        let p = self.gate(&req, method, &r.namespace).await?;
        let size = match r.page_size {
            0 => PAGE_DEFAULT,
            n => n.min(PAGE_MAX),
        } as usize;
        let after = np::parse_page_token(&r.page_token).map_err(Status::from)?;
        let want = pb::SandboxState::try_from(r.state).unwrap_or(pb::SandboxState::Unspecified);
        match self.backend()? {
            Backend::Node(node) => {
                let all: Vec<Arc<Sandbox>> = node
                    .platform_sandboxes()
                    .into_iter()
                    .filter(|s| {
                        let ns = namespace_of(s);
                        (r.namespace.is_empty() || ns == r.namespace) && p.sees(ns)
                    })
                    .filter(|s| {
                        want == pb::SandboxState::Unspecified || state_of(s.status()) == want
                    })
                    .collect();
                let page = np::page_of(all, after.as_ref(), size);
                Ok(Response::new(pb::ListSandboxesResponse {
                    sandboxes: page.sandboxes.iter().map(|s| sandbox_pb(node, s)).collect(),
                    next_page_token: page.next,
                }))
            }
            Backend::Cluster(c) => {
                // Every node's first page after the token, merged, cut to one page.
                let mut all: Vec<pb::Sandbox> = Vec::new();
                let mut calls = Vec::new();
                for ch in c.nodes() {
                    let mut cl = pb::sandbox_service_client::SandboxServiceClient::new(ch);
                    let msg = pb::ListSandboxesRequest {
                        page_size: size as u32,
                        ..r.clone()
                    };
                    let q = self.to_node(msg, req.metadata(), &p);
                    calls.push(async move { cl.list_sandboxes(q).await });
                }
                for res in futures::future::join_all(calls).await {
                    match res {
                        Ok(resp) => all.extend(resp.into_inner().sandboxes),
                        Err(s) if s.code() == tonic::Code::Unavailable => {
                            return Err(Status::unavailable(format!(
                                "a node did not answer the listing: {}",
                                s.message()
                            )))
                        }
                        Err(s) => return Err(s),
                    }
                }
                let key = |s: &pb::Sandbox| {
                    let t = s.created_at.unwrap_or_default();
                    let ns = (t.seconds.max(0) as u128) * 1_000_000_000 + t.nanos.max(0) as u128;
                    (ns, s.sandbox_id.clone())
                };
                all.sort_by_key(|s| std::cmp::Reverse(key(s)));
                let mut next = String::new();
                if all.len() > size {
                    all.truncate(size);
                    next = all
                        .last()
                        .map(|s| np::page_token(&key(s)))
                        .unwrap_or_default();
                }
                Ok(Response::new(pb::ListSandboxesResponse {
                    sandboxes: all,
                    next_page_token: next,
                }))
            }
        }
    }

    /// WatchSandbox: the sandbox now, then on every change of its state or reason, until it
    /// is TERMINATED. Pushed from the node's own state changes.
    pub(super) async fn watch_sandbox_here(
        &self,
        req: Request<pb::WatchSandboxRequest>,
        method: &str,
    ) -> Result<Response<Stream_<pb::SandboxEvent>>, Status> {
        let id = req.get_ref().sandbox_id.clone();
        let node = match self.backend()? {
            Backend::Node(node) => node.clone(),
            Backend::Cluster(c) => {
                let (p, mut cl) = self.owner_client(c.as_ref(), &req, method, &id).await?;
                let q = self.to_node(req.get_ref().clone(), req.metadata(), &p);
                let up = cl.watch_sandbox(q).await?.into_inner();
                let s: Stream_<pb::SandboxEvent> = Box::pin(up);
                return Ok(Response::new(s));
            }
        };
        let (_, sb) = self.find(&node, &req, method, &id).await?;
        let (tx, rx) = mpsc::channel(16);
        tokio::spawn(async move {
            let mut st = sb.subscribe();
            let mut wl = node.workload(&sb.id);
            let mut last: Option<(i32, String)> = None;
            loop {
                let s = sandbox_pb(&node, &sb);
                let now = (s.state, s.state_reason.clone());
                if last.as_ref() != Some(&now) {
                    let end = s.state == pb::SandboxState::Terminated as i32;
                    let ev = pb::SandboxEvent {
                        sandbox: Some(s),
                        observed_at: Some(timestamp(SystemTime::now())),
                    };
                    if tx.send(Ok(ev)).await.is_err() || end {
                        return;
                    }
                    last = Some(now);
                }
                tokio::select! {
                    r = st.changed() => if r.is_err() { return },
                    r = wl.changed() => if r.is_err() {
                        // The workload's record went with a delete: the state says the rest.
                        wl = node.workload(&sb.id);
                    },
                    _ = tx.closed() => return,
                }
            }
        });
        let s: Stream_<pb::SandboxEvent> = Box::pin(ReceiverStream::new(rx));
        Ok(Response::new(s))
    }

    /// TailSandboxLogs: the retained run log after `from_offset`, then (with follow) what is
    /// written next, pushed as it is written; ends after the deleted marker.
    pub(super) async fn tail_logs_here(
        &self,
        req: Request<pb::TailSandboxLogsRequest>,
        method: &str,
    ) -> Result<Response<Stream_<pb::LogEntry>>, Status> {
        let r = req.get_ref().clone();
        if r.sandbox_id.is_empty() {
            return Err(Status::invalid_argument("sandbox_id is required"));
        }
        let node = match self.backend()? {
            Backend::Node(node) => node.clone(),
            Backend::Cluster(c) => {
                let (p, mut cl) = self
                    .owner_client(c.as_ref(), &req, method, &r.sandbox_id)
                    .await?;
                let q = self.to_node(r.clone(), req.metadata(), &p);
                let up = cl.tail_sandbox_logs(q).await?.into_inner();
                let s: Stream_<pb::LogEntry> = Box::pin(up);
                return Ok(Response::new(s));
            }
        };
        let (_, sb) = self.find(&node, &req, method, &r.sandbox_id).await?;
        if sb.platform.is_none() {
            return Err(Status::failed_precondition(format!(
                "sandbox {} is a compute.v1 sandbox: it has no run log",
                sb.id
            )));
        }
        let log = node.run_log(&sb.id).await.map_err(Status::from)?;
        let limit = match r.limit {
            0 => TAIL_LIMIT,
            n => n,
        } as usize;
        let (tx, rx) = mpsc::channel(64);
        tokio::spawn(async move {
            let mut tip = log.subscribe();
            let mut after = r.from_offset;
            loop {
                tip.borrow_and_update();
                let l = log.clone();
                let got = node::blocking(move || l.read(after, r.run, limit)).await;
                let entries = match got {
                    Ok(Ok(v)) => v,
                    Ok(Err(e)) => {
                        let _ = tx
                            .send(Err(Status::internal(format!("run log read: {e}"))))
                            .await;
                        return;
                    }
                    Err(_) => return,
                };
                let full = entries.len() >= limit;
                let mut ended = false;
                for e in &entries {
                    after = e.offset;
                    ended |= e.kind.is_final();
                    if tx.send(Ok(entry_pb(e))).await.is_err() {
                        return;
                    }
                }
                if ended || !r.follow {
                    return;
                }
                if full || log.tip() > after && r.run == 0 {
                    continue;
                }
                if log.ended() && log.tip() <= after {
                    return;
                }
                tokio::select! {
                    c = tip.changed() => if c.is_err() { return },
                    _ = tx.closed() => return,
                }
            }
        });
        let s: Stream_<pb::LogEntry> = Box::pin(ReceiverStream::new(rx));
        Ok(Response::new(s))
    }

    /// `msg` as it goes to a node for a call of `p` that came with `meta`: the caller's
    /// `authorization`, and the principal the router found with the secret it shares with
    /// its nodes.
    pub(super) fn to_node<T>(
        &self,
        msg: T,
        meta: &tonic::metadata::MetadataMap,
        p: &Principal,
    ) -> Request<T> {
        let mut out = Request::new(msg);
        if let Some(a) = meta.get("authorization") {
            out.metadata_mut().insert("authorization", a.clone());
        }
        if let Some(secret) = &self.peer {
            let json = serde_json::to_string(p).unwrap_or_default();
            if let (Ok(s), Ok(j)) = (secret.parse(), json.parse()) {
                out.metadata_mut().insert(auth::PEER_HEADER, s);
                out.metadata_mut().insert(auth::PRINCIPAL_HEADER, j);
            }
        }
        out
    }

    /// Authenticates an id-addressed call (its namespace is its resource's, checked once the
    /// resource is found); a refusal is audited against `resource`.
    pub(super) async fn authenticated<T>(
        &self,
        req: &Request<T>,
        method: &str,
        resource: &str,
    ) -> Result<Principal, Status> {
        match self.auth.principal(credentials(req)).await {
            Ok(p) => Ok(p),
            Err(e) => {
                let s = Status::from(Error::Auth(e));
                self.audit("anonymous", method, "", resource, Outcome::Denied, Some(&s))
                    .await;
                Err(s)
            }
        }
    }

    /// For an id-addressed call the router forwards: the caller (authenticated here; the
    /// owning node checks it in the sandbox's namespace) and a client of the node owning `id`.
    pub(super) async fn owner_client<T>(
        &self,
        c: &dyn Cluster,
        req: &Request<T>,
        method: &str,
        id: &str,
    ) -> Result<
        (
            Principal,
            pb::sandbox_service_client::SandboxServiceClient<tonic::transport::Channel>,
        ),
        Status,
    > {
        let p = self.authenticated(req, method, id).await?;
        let ch = c.owner(id).await?;
        Ok((p, pb::sandbox_service_client::SandboxServiceClient::new(ch)))
    }

    /// Audits a forwarded write's outcome.
    pub(super) async fn write_status<T>(
        &self,
        p: &Principal,
        method: &str,
        namespace: &str,
        resource: &str,
        r: Result<T, Status>,
    ) -> Result<T, Status> {
        let outcome = match &r {
            Ok(_) => Outcome::Ok,
            Err(s) if s.code() == tonic::Code::PermissionDenied => Outcome::Denied,
            Err(_) => Outcome::Failed,
        };
        self.audit(
            p.name(),
            method,
            namespace,
            resource,
            outcome,
            r.as_ref().err(),
        )
        .await;
        r
    }
}

impl Platform {
    /// Creates on the first node of the placement that takes it.
    async fn forward_create(
        &self,
        c: &dyn Cluster,
        req: &Request<pb::CreateSandboxRequest>,
        p: &Principal,
    ) -> Result<pb::Sandbox, Status> {
        let r = req.get_ref();
        let env = self
            .environment_for(&r.namespace, r)
            .await
            .map_err(Status::from)?;
        let env_json = serde_json::to_vec(&env).unwrap_or_default();
        let key = if r.idempotency_key.is_empty() {
            uuid::Uuid::new_v4().to_string()
        } else {
            r.idempotency_key.clone()
        };
        let mut last = Status::unavailable("no node is ready");
        // A sandbox mounting durable workspaces goes to the node that holds them.
        let durable: Vec<String> = std::iter::once(r.workspace_id.clone())
            .chain(r.workspaces.iter().map(|m| m.workspace_id.clone()))
            .filter(|w| !w.is_empty())
            .collect();
        let candidates = match durable.first() {
            Some(ws) => vec![self.workspace_holder(c, req.metadata(), p, ws).await?.0],
            None => c.place(&r.namespace, &key),
        };
        for (node, ch) in candidates {
            let mut cl = pb::sandbox_service_client::SandboxServiceClient::new(ch);
            let mut q = self.to_node(r.clone(), req.metadata(), p);
            if self.peer.is_some() {
                q.metadata_mut().insert_bin(
                    ENVIRONMENT_HEADER,
                    tonic::metadata::MetadataValue::from_bytes(&env_json),
                );
            }
            match cl.create_sandbox(q).await {
                Ok(r) => {
                    let sb = r.into_inner();
                    c.remember(&sb.sandbox_id, &node);
                    return Ok(sb);
                }
                Err(s) if another_node_may(&s) => last = s,
                Err(s) => return Err(s),
            }
        }
        Err(last)
    }
}

/// Whether a node's refusal of a create lets the next node try (it is full or unreachable).
pub(super) fn another_node_may(s: &Status) -> bool {
    matches!(
        s.code(),
        tonic::Code::ResourceExhausted | tonic::Code::Unavailable
    )
}

/// An exposure on the wire (no token: only ExposeSandboxPort's answer carries one).
pub fn exposure_pb(e: &node::preview::Exposure, url: String) -> pb::PortExposure {
    let auth = match e.access {
        node::preview::Access::SignedUrl => pb::ExposureAuth::SignedUrl,
        node::preview::Access::ForwardAuth => pb::ExposureAuth::ForwardAuth,
        node::preview::Access::Public => pb::ExposureAuth::Public,
    };
    pb::PortExposure {
        port: e.port.into(),
        url,
        auth: auth as i32,
        access_token: String::new(),
        expires_at: None,
        created_at: Some(timestamp(
            SystemTime::UNIX_EPOCH + Duration::from_millis(e.created_at_ms),
        )),
    }
}

/// A grant as the API shows it.
pub fn grant_pb(g: &node::Grant) -> pb::EgressGrant {
    let at = |ms: u64| SystemTime::UNIX_EPOCH + Duration::from_millis(ms);
    pb::EgressGrant {
        grant_id: g.id.clone(),
        policy: Some(super::service::egress_pb(&g.policy)),
        created_at: Some(timestamp(at(g.created_at_ms))),
        expires_at: (g.expires_at_ms != 0).then(|| timestamp(at(g.expires_at_ms))),
        reason: g.reason.clone(),
        granted_by: g.granted_by.clone(),
    }
}

impl Platform {
    /// GrantEgress: one more grant on a networked sandbox, in force at once; audited with its
    /// id, TTL and reason.
    pub(super) async fn grant_egress_here(
        &self,
        req: Request<pb::GrantEgressRequest>,
        method: &str,
    ) -> Result<Response<pb::GrantEgressResponse>, Status> {
        let id = req.get_ref().sandbox_id.clone();
        match self.backend()? {
            Backend::Node(node) => {
                let (p, sb) = self.find(node, &req, method, &id).await?;
                let ns = namespace_of(&sb).to_string();
                let r = req.get_ref();
                let granted = async {
                    read_only(&sb)?;
                    let policy = super::service::egress_of(&r.policy)?.ok_or_else(|| {
                        Error::from(node::Error::InvalidArgument("policy is required".into()))
                    })?;
                    node.grant_egress(
                        &sb.id,
                        policy,
                        r.ttl_sec,
                        r.reason.clone(),
                        p.name().to_string(),
                    )
                    .await
                    .map_err(Error::from)
                }
                .await;
                let ttl = r.ttl_sec;
                let out = self
                    .write_noted(&p, method, &ns, &id, granted, |g| {
                        format!(
                            "grant {} ttl_sec {ttl}: {}",
                            g.id,
                            g.reason.chars().take(500).collect::<String>()
                        )
                    })
                    .await?;
                Ok(Response::new(pb::GrantEgressResponse {
                    grant_id: out.id.clone(),
                    grant: Some(grant_pb(&out)),
                }))
            }
            Backend::Cluster(c) => {
                let (p, mut cl) = self.owner_client(c.as_ref(), &req, method, &id).await?;
                let q = self.to_node(req.get_ref().clone(), req.metadata(), &p);
                let r = cl.grant_egress(q).await.map(|r| r.into_inner());
                self.write_status(&p, method, "", &id, r)
                    .await
                    .map(Response::new)
            }
        }
    }

    /// RevokeEgress: removes one grant and cuts its connections; audited with the bytes the
    /// sandbox moved while it was active.
    pub(super) async fn revoke_egress_here(
        &self,
        req: Request<pb::RevokeEgressRequest>,
        method: &str,
    ) -> Result<Response<pb::RevokeEgressResponse>, Status> {
        let id = req.get_ref().sandbox_id.clone();
        match self.backend()? {
            Backend::Node(node) => {
                let (p, sb) = self.find(node, &req, method, &id).await?;
                let ns = namespace_of(&sb).to_string();
                let gid = req.get_ref().grant_id.clone();
                let ended = async {
                    read_only(&sb)?;
                    if gid.is_empty() {
                        return Err(
                            node::Error::InvalidArgument("grant_id is required".into()).into()
                        );
                    }
                    node.revoke_egress(&sb.id, &gid).await.map_err(Error::from)
                }
                .await;
                self.write_noted(&p, method, &ns, &id, ended, |e| ended_detail(e, "revoked"))
                    .await?;
                Ok(Response::new(pb::RevokeEgressResponse {}))
            }
            Backend::Cluster(c) => {
                let (p, mut cl) = self.owner_client(c.as_ref(), &req, method, &id).await?;
                let q = self.to_node(req.get_ref().clone(), req.metadata(), &p);
                let r = cl.revoke_egress(q).await.map(|r| r.into_inner());
                self.write_status(&p, method, "", &id, r)
                    .await
                    .map(Response::new)
            }
        }
    }

    /// ExposeSandboxPort: a port of a networked sandbox on its preview URL (docs/preview.md);
    /// audited with the port, access and TTL (never the token).
    pub(super) async fn expose_port_here(
        &self,
        req: Request<pb::ExposeSandboxPortRequest>,
        method: &str,
    ) -> Result<Response<pb::PortExposure>, Status> {
        let id = req.get_ref().sandbox_id.clone();
        match self.backend()? {
            Backend::Node(node) => {
                let (p, sb) = self.find(node, &req, method, &id).await?;
                let ns = namespace_of(&sb).to_string();
                let r = req.get_ref();
                let access = match pb::ExposureAuth::try_from(r.auth) {
                    Ok(pb::ExposureAuth::Unspecified | pb::ExposureAuth::SignedUrl) => {
                        Ok(node::preview::Access::SignedUrl)
                    }
                    Ok(pb::ExposureAuth::ForwardAuth) => Ok(node::preview::Access::ForwardAuth),
                    Ok(pb::ExposureAuth::Public) => Ok(node::preview::Access::Public),
                    Err(_) => Err(node::Error::InvalidArgument(format!(
                        "auth {} is not an ExposureAuth",
                        r.auth
                    ))),
                };
                let (port, ttl) = (r.port, r.ttl_sec);
                let exposed = async {
                    read_only(&sb)?;
                    node.expose_port(&sb.id, port, access?, ttl)
                        .await
                        .map_err(Error::from)
                }
                .await;
                let out = self
                    .write_noted(&p, method, &ns, &id, exposed, |e| {
                        format!("port {port} {:?} ttl_sec {ttl}", e.exposure.access)
                    })
                    .await?;
                let mut pe = exposure_pb(&out.exposure, out.url.clone());
                if let Some((token, expires)) = out.token {
                    pe.access_token = token;
                    pe.expires_at = Some(timestamp(
                        SystemTime::UNIX_EPOCH + Duration::from_secs(expires),
                    ));
                }
                Ok(Response::new(pe))
            }
            Backend::Cluster(c) => {
                let (p, mut cl) = self.owner_client(c.as_ref(), &req, method, &id).await?;
                let q = self.to_node(req.get_ref().clone(), req.metadata(), &p);
                let r = cl.expose_sandbox_port(q).await.map(|r| r.into_inner());
                self.write_status(&p, method, "", &id, r)
                    .await
                    .map(Response::new)
            }
        }
    }

    /// UnexposeSandboxPort: the port's exposure dropped (a port not exposed is a no-op).
    pub(super) async fn unexpose_port_here(
        &self,
        req: Request<pb::UnexposeSandboxPortRequest>,
        method: &str,
    ) -> Result<Response<pb::UnexposeSandboxPortResponse>, Status> {
        let id = req.get_ref().sandbox_id.clone();
        match self.backend()? {
            Backend::Node(node) => {
                let (p, sb) = self.find(node, &req, method, &id).await?;
                let ns = namespace_of(&sb).to_string();
                let port = req.get_ref().port;
                let done = async {
                    read_only(&sb)?;
                    node.unexpose_port(&sb.id, port).await.map_err(Error::from)
                }
                .await;
                self.write_noted(&p, method, &ns, &id, done, |_| format!("port {port}"))
                    .await?;
                Ok(Response::new(pb::UnexposeSandboxPortResponse {}))
            }
            Backend::Cluster(c) => {
                let (p, mut cl) = self.owner_client(c.as_ref(), &req, method, &id).await?;
                let q = self.to_node(req.get_ref().clone(), req.metadata(), &p);
                let r = cl.unexpose_sandbox_port(q).await.map(|r| r.into_inner());
                self.write_status(&p, method, "", &id, r)
                    .await
                    .map(Response::new)
            }
        }
    }

    /// Audits the end of every grant that expires on this node (with the bytes it saw), for
    /// as long as the node runs.
    pub fn audit_grant_expiries(&self, node: &Node) {
        let Some(mut rx) = node.take_ended_grants() else {
            return;
        };
        let me = self.clone();
        node.tasks().spawn(async move {
            while let Some((ns, id, ended)) = rx.recv().await {
                me.note(
                    "node",
                    "/platform.v1.SandboxService/GrantEgress",
                    &ns,
                    &id,
                    ended_detail(&ended, "expired"),
                )
                .await;
            }
        });
    }
}

/// The audit detail of a grant's end.
fn ended_detail(e: &node::Ended, how: &str) -> String {
    format!(
        "grant {} {how}: {} bytes egress, {} bytes ingress while active",
        e.grant.id, e.egress_bytes, e.ingress_bytes
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn environment_refs_split_on_a_slash() {
        assert_eq!(environment_ref("team-a", "py"), ("team-a", "py"));
        assert_eq!(environment_ref("team-a", "team-b/py"), ("team-b", "py"));
    }

    #[test]
    fn create_requests_are_checked_before_anything_is_looked_up() {
        let ok = pb::CreateSandboxRequest {
            namespace: "team-a".into(),
            environment: "py".into(),
            ..Default::default()
        };
        assert!(check_create(&ok).is_ok());
        let bad = |f: &dyn Fn(&mut pb::CreateSandboxRequest)| {
            let mut r = ok.clone();
            f(&mut r);
            matches!(check_create(&r), Err(Error::Invalid(_)))
        };
        assert!(bad(&|r| r.environment.clear()));
        assert!(bad(&|r| {
            r.env.insert("SANDBOX_TOKEN".into(), "x".into());
        }));
        assert!(bad(&|r| r.working_dir = "relative".into()));
        assert!(bad(&|r| r.working_dir = "/a/../b".into()));
        assert!(bad(&|r| {
            r.workspace_id = "w".into();
            r.workspaces.push(pb::WorkspaceMount {
                mount_path: "/w".into(),
                ..Default::default()
            });
        }));
        assert!(bad(&|r| {
            for i in 0..9 {
                r.workspaces.push(pb::WorkspaceMount {
                    mount_path: format!("/w{i}"),
                    ..Default::default()
                });
            }
        }));
        assert!(bad(&|r| r.argv = vec!["a\0b".into()]));
    }

    #[test]
    fn every_node_status_has_a_platform_state() {
        let states: Vec<_> = NodeStatus::ALL.iter().map(|s| state_of(*s)).collect();
        assert_eq!(
            states,
            [
                pb::SandboxState::Pending,
                pb::SandboxState::Running,
                pb::SandboxState::Suspending,
                pb::SandboxState::Suspended,
                pb::SandboxState::Resuming,
                pb::SandboxState::Failed,
                pb::SandboxState::Terminated
            ]
        );
    }
}
