//! The platform API served: AccessService (namespaces, keys, role bindings, WhoAmI, audit)
//! and EnvironmentService whole; SandboxService ([`super::sandboxes`]) and WorkspaceService
//! ([`super::workspaces`]).
//!
//! Every call goes through [`Platform::gate`] first: credentials → principal → the access
//! table's rule for the method, in the namespace the request names. Every denied call and
//! every write (whatever its outcome) is appended to the audit log: principal (a key id,
//! never a token), method, namespace, resource, outcome, code.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use tonic::{Request, Response, Status, Streaming};
use tracing::warn;

use super::access::{Principal, Role};
use super::auth::{self, Authenticator, Credentials};
use super::keys;
use super::records::{self, ApiKey, AuditEvent, Binding, Environment, Namespace, Outcome};
use super::store::{self, Records, Store};
use crate::api::convert::{rfc3339_millis as rfc3339, timestamp_of_rfc3339 as ts};
use crate::api::platform::v1 as pb;

/// A platform call's failure; mapped to a status in one place ([`From<Error> for Status`]).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Refused by the gate.
    #[error(transparent)]
    Auth(#[from] auth::Error),
    /// Bad input.
    #[error(transparent)]
    Invalid(#[from] records::Invalid),
    /// The store.
    #[error(transparent)]
    Store(#[from] store::Error),
    /// A missing resource (or one the caller may not see).
    #[error("{0} not found")]
    NotFound(String),
    /// Not allowed for this principal by the call's own rule.
    #[error("{0}")]
    PermissionDenied(String),
    /// The resource is not in a state for this.
    #[error("{0}")]
    FailedPrecondition(String),
    /// The capability comes later.
    #[error("{0}")]
    Unimplemented(String),
    /// The node's sandboxes.
    #[error(transparent)]
    Node(#[from] crate::node::Error),
}

impl From<Error> for Status {
    fn from(e: Error) -> Status {
        let e = match e {
            Error::Node(n) => return Status::from(n),
            e => e,
        };
        match &e {
            Error::Auth(auth::Error::Unauthenticated(m)) => Status::unauthenticated(*m),
            Error::Auth(auth::Error::PermissionDenied(m)) => Status::permission_denied(m),
            Error::Auth(a @ auth::Error::Hidden(_)) => Status::not_found(a.to_string()),
            Error::Auth(a @ auth::Error::NoRule(_)) => Status::permission_denied(a.to_string()),
            Error::Auth(auth::Error::Store(s)) | Error::Store(s) => store_status(s),
            Error::Invalid(i) => Status::invalid_argument(i.to_string()),
            Error::NotFound(_) => Status::not_found(e.to_string()),
            Error::PermissionDenied(m) => Status::permission_denied(m),
            Error::FailedPrecondition(m) => Status::failed_precondition(m),
            Error::Unimplemented(m) => Status::unimplemented(m),
            // Mapped above, by the node's own table.
            Error::Node(n) => Status::internal(n.to_string()),
        }
    }
}

fn store_status(s: &store::Error) -> Status {
    match s {
        store::Error::AlreadyExists { .. } => Status::already_exists(s.to_string()),
        other => {
            warn!(error = %other, "platform store failed");
            Status::unavailable("the platform store is unavailable")
        }
    }
}

type Result<T> = std::result::Result<T, Error>;

/// The platform's services over one store.
#[derive(Clone)]
pub struct Platform {
    pub(super) records: Records,
    pub(super) auth: Authenticator,
    pub(super) sandboxes: Option<super::sandboxes::Backend>,
    /// The secret this router presents to its nodes with the principal it checked.
    pub(super) peer: Option<Arc<str>>,
}

/// What a call presents: its `authorization` metadata, and whether it came over a unix socket
/// of ours from uid 0 or from the uid this process runs as (the node runs as root; the router
/// pod as 65532, so `kubectl exec` into it is how a cluster's first key is made).
pub(super) fn credentials<T>(req: &Request<T>) -> Credentials<'_> {
    Credentials {
        authorization: req
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok()),
        local_root: req
            .extensions()
            .get::<tonic::transport::server::UdsConnectInfo>()
            .and_then(|i| i.peer_cred)
            .is_some_and(|c| is_local_admin(c.uid())),
        peer: req
            .metadata()
            .get(auth::PEER_HEADER)
            .and_then(|v| v.to_str().ok()),
        delegated: req
            .metadata()
            .get(auth::PRINCIPAL_HEADER)
            .and_then(|v| v.to_str().ok()),
    }
}

/// Whether a peer on one of our unix sockets with `uid` is the platform admin: root, or the
/// uid this server runs as; anyone else the socket's group lets in still needs a key.
fn is_local_admin(uid: u32) -> bool {
    uid == 0 || uid == nix::unistd::geteuid().as_raw()
}

/// The four platform services of one [`Platform`], ready to add to a server.
pub struct Servers {
    /// SandboxService.
    pub sandbox: pb::sandbox_service_server::SandboxServiceServer<Platform>,
    /// AccessService.
    pub access: pb::access_service_server::AccessServiceServer<Platform>,
    /// EnvironmentService.
    pub environment: pb::environment_service_server::EnvironmentServiceServer<Platform>,
    /// WorkspaceService.
    pub workspace: pb::workspace_service_server::WorkspaceServiceServer<Platform>,
}

/// The method path of a call (tonic does not hand it to the handler).
macro_rules! method {
    ($svc:literal, $name:literal) => {
        concat!("/platform.v1.", $svc, "/", $name)
    };
}

impl Platform {
    /// The services over `store` (spawns the authenticator's cache task).
    pub fn new(store: Arc<dyn Store>) -> Self {
        let records = Records::new(store);
        let auth = Authenticator::new(records.clone());
        Self {
            records,
            auth,
            sandboxes: None,
            peer: None,
        }
    }

    /// The same services with their sandboxes on `backend` (this node's, or the router's
    /// nodes).
    pub fn with_sandboxes(mut self, backend: super::sandboxes::Backend) -> Self {
        if let super::sandboxes::Backend::Node(node) = &backend {
            self.audit_grant_expiries(node);
        }
        self.sandboxes = Some(backend);
        self
    }

    /// Shares `secret` with the other side of a router-node link: a node takes the principals
    /// a router checked when they come with it, and a router sends it with them.
    pub fn with_peer_secret(mut self, secret: &str) -> Self {
        self.auth = self.auth.with_peer_secret(secret);
        self.peer = Some(Arc::from(secret));
        self
    }

    /// The records.
    pub fn records(&self) -> &Records {
        &self.records
    }

    /// The services over the embedded store at `path` (its directory is created), opened off
    /// the async runtime.
    pub async fn embedded(path: std::path::PathBuf) -> std::result::Result<Self, store::Error> {
        let store = tokio::task::spawn_blocking(move || {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)
                    .map_err(|e| store::Error::Backend(format!("{}: {e}", dir.display())))?;
            }
            store::Embedded::open(&path)
        })
        .await
        .map_err(|e| store::Error::Backend(e.to_string()))??;
        Ok(Self::new(Arc::new(store)))
    }

    /// Its four services.
    pub fn servers(&self) -> Servers {
        Servers {
            sandbox: pb::sandbox_service_server::SandboxServiceServer::new(self.clone()),
            access: pb::access_service_server::AccessServiceServer::new(self.clone()),
            environment: pb::environment_service_server::EnvironmentServiceServer::new(
                self.clone(),
            ),
            workspace: pb::workspace_service_server::WorkspaceServiceServer::new(self.clone()),
        }
    }

    /// Checks the call; a refusal is audited and returned as its status.
    pub(super) async fn gate<T>(
        &self,
        req: &Request<T>,
        method: &str,
        namespace: &str,
    ) -> std::result::Result<Principal, Status> {
        let creds = credentials(req);
        match self.auth.check(creds, method, namespace).await {
            Ok(p) => Ok(p),
            Err(e) => {
                let principal = match (&e, creds.authorization.and_then(keys::bearer)) {
                    (auth::Error::Unauthenticated(_), _) | (_, None) => "anonymous",
                    (_, Some(t)) => keys::key_id_of(t).unwrap_or("anonymous"),
                };
                let s = Status::from(Error::Auth(e));
                self.audit(principal, method, namespace, "", Outcome::Denied, Some(&s))
                    .await;
                Err(s)
            }
        }
    }

    /// Appends an audit event; `status` is the refusal or failure the caller got, if any.
    pub(super) async fn audit(
        &self,
        principal: &str,
        method: &str,
        namespace: &str,
        resource: &str,
        outcome: Outcome,
        status: Option<&Status>,
    ) {
        let (code, detail) = match status {
            Some(s) => (format!("{:?}", s.code()), s.message().to_string()),
            None => (String::new(), String::new()),
        };
        let ev = AuditEvent {
            seq: 0,
            time: records::now(),
            principal: principal.to_string(),
            method: method.to_string(),
            namespace: namespace.to_string(),
            resource: resource.to_string(),
            outcome,
            code,
            detail,
        };
        if let Err(e) = self.records.store().audit(ev).await {
            warn!(error = %e, method, "could not write the audit log");
        }
    }

    /// An audit event of something that happened (OK) with what it was.
    pub(super) async fn note(
        &self,
        principal: &str,
        method: &str,
        namespace: &str,
        resource: &str,
        detail: String,
    ) {
        let ev = AuditEvent {
            seq: 0,
            time: records::now(),
            principal: principal.to_string(),
            method: method.to_string(),
            namespace: namespace.to_string(),
            resource: resource.to_string(),
            outcome: Outcome::Ok,
            code: String::new(),
            detail,
        };
        if let Err(e) = self.records.store().audit(ev).await {
            warn!(error = %e, method, "could not write the audit log");
        }
    }

    /// [`Platform::write`], with what an OK write did in its audit event's detail.
    pub(super) async fn write_noted<T>(
        &self,
        p: &Principal,
        method: &str,
        namespace: &str,
        resource: &str,
        r: Result<T>,
        detail: impl FnOnce(&T) -> String,
    ) -> std::result::Result<T, Status> {
        match r {
            Ok(v) => {
                self.note(p.name(), method, namespace, resource, detail(&v))
                    .await;
                Ok(v)
            }
            Err(e) => self.write(p, method, namespace, resource, Err(e)).await,
        }
    }

    /// Audits a write's outcome and returns it.
    pub(super) async fn write<T>(
        &self,
        p: &Principal,
        method: &str,
        namespace: &str,
        resource: &str,
        r: Result<T>,
    ) -> std::result::Result<T, Status> {
        match r {
            Ok(v) => {
                self.audit(p.name(), method, namespace, resource, Outcome::Ok, None)
                    .await;
                Ok(v)
            }
            Err(e) => {
                let outcome = match e {
                    Error::PermissionDenied(_) | Error::Auth(_) => Outcome::Denied,
                    _ => Outcome::Failed,
                };
                let s = Status::from(e);
                self.audit(p.name(), method, namespace, resource, outcome, Some(&s))
                    .await;
                Err(s)
            }
        }
    }

    async fn namespace_exists(&self, name: &str) -> Result<()> {
        match self.records.get::<Namespace>(name).await? {
            Some(_) => Ok(()),
            None => Err(Error::NotFound(format!("namespace {name}"))),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Conversions between the stored records and the API's messages.

fn namespace_pb(n: &Namespace) -> pb::Namespace {
    pb::Namespace {
        name: n.name.clone(),
        labels: n.labels.clone().into_iter().collect(),
        created_at: ts(&n.created_at),
    }
}

fn key_pb(k: &ApiKey) -> pb::ApiKey {
    pb::ApiKey {
        key_id: k.key_id.clone(),
        name: k.name.clone(),
        platform_admin: k.platform_admin,
        created_at: ts(&k.created_at),
        expires_at: k.expires_at.as_deref().and_then(ts),
        revoked_at: k.revoked_at.as_deref().and_then(ts),
        created_by: k.created_by.clone(),
    }
}

fn binding_pb(b: &Binding) -> pb::RoleBinding {
    pb::RoleBinding {
        namespace: b.namespace.clone(),
        key_id: b.key_id.clone(),
        role: b.role.to_proto(),
        created_at: ts(&b.created_at),
    }
}

fn audit_pb(e: &AuditEvent) -> pb::AuditEvent {
    pb::AuditEvent {
        time: ts(&e.time),
        principal: e.principal.clone(),
        method: e.method.clone(),
        namespace: e.namespace.clone(),
        resource: e.resource.clone(),
        outcome: match e.outcome {
            Outcome::Ok => pb::AuditOutcome::Ok,
            Outcome::Denied => pb::AuditOutcome::Denied,
            Outcome::Failed => pb::AuditOutcome::Failed,
        } as i32,
        code: e.code.clone(),
        detail: e.detail.clone(),
    }
}

fn map(m: &std::collections::HashMap<String, String>) -> BTreeMap<String, String> {
    m.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

fn resources_of(r: Option<pb::Resources>) -> records::Resources {
    let r = r.unwrap_or_default();
    records::Resources {
        cpu_millis: r.cpu_millis,
        memory_bytes: r.memory_bytes,
        disk_bytes: r.disk_bytes,
    }
}

pub(super) fn mounts_of(m: &[pb::WorkspaceMount]) -> Vec<records::Mount> {
    m.iter()
        .map(|m| records::Mount {
            workspace_id: m.workspace_id.clone(),
            mount_path: m.mount_path.clone(),
            read_only: m.mode == pb::MountMode::ReadOnly as i32,
            size: m.size.clone(),
        })
        .collect()
}

pub(super) fn egress_of(e: &Option<pb::EgressPolicy>) -> Result<Option<records::EgressPolicy>> {
    let Some(e) = e else { return Ok(None) };
    let mut rules = Vec::new();
    for r in &e.rules {
        let destination = match &r.destination {
            Some(pb::egress_rule::Destination::Host(h)) => h.clone(),
            Some(pb::egress_rule::Destination::Cidr(c)) => c.clone(),
            None => {
                return Err(records::Invalid("an egress rule needs a host or a cidr".into()).into())
            }
        };
        let ports = r
            .ports
            .iter()
            .map(|p| u16::try_from(*p).map_err(|_| records::Invalid(format!("port {p}"))))
            .collect::<std::result::Result<Vec<u16>, _>>()?;
        let protocol = match pb::EgressProtocol::try_from(r.protocol) {
            Ok(pb::EgressProtocol::Tcp) => "tcp",
            Ok(pb::EgressProtocol::Udp) => "udp",
            Ok(pb::EgressProtocol::Unspecified) => "",
            Err(_) => return Err(records::Invalid(format!("protocol {}", r.protocol)).into()),
        };
        rules.push(records::EgressRule {
            destination,
            ports,
            protocol: protocol.into(),
        });
    }
    Ok(Some(records::EgressPolicy { rules }))
}

pub(super) fn egress_pb(e: &records::EgressPolicy) -> pb::EgressPolicy {
    pb::EgressPolicy {
        rules: e
            .rules
            .iter()
            .map(|r| pb::EgressRule {
                destination: Some(if r.destination.contains('/') {
                    pb::egress_rule::Destination::Cidr(r.destination.clone())
                } else {
                    pb::egress_rule::Destination::Host(r.destination.clone())
                }),
                ports: r.ports.iter().map(|p| u32::from(*p)).collect(),
                protocol: match r.protocol.as_str() {
                    "tcp" => pb::EgressProtocol::Tcp,
                    "udp" => pb::EgressProtocol::Udp,
                    _ => pb::EgressProtocol::Unspecified,
                } as i32,
            })
            .collect(),
    }
}

fn environment_of(e: &pb::Environment) -> Result<Environment> {
    Ok(Environment {
        namespace: e.namespace.clone(),
        name: e.name.clone(),
        image: e.image.clone(),
        default_argv: e.default_argv.clone(),
        env: map(&e.env),
        working_dir: e.working_dir.clone(),
        resources: resources_of(e.resources),
        workspaces: mounts_of(&e.workspaces),
        egress: egress_of(&e.egress)?,
        idle_suspend_sec: e.idle_suspend_sec,
        max_lifetime_sec: e.max_lifetime_sec,
        labels: map(&e.labels),
        created_at: String::new(),
        updated_at: String::new(),
    })
}

fn environment_pb(e: &Environment) -> pb::Environment {
    pb::Environment {
        namespace: e.namespace.clone(),
        name: e.name.clone(),
        image: e.image.clone(),
        default_argv: e.default_argv.clone(),
        env: e.env.clone().into_iter().collect(),
        working_dir: e.working_dir.clone(),
        resources: Some(pb::Resources {
            cpu_millis: e.resources.cpu_millis,
            memory_bytes: e.resources.memory_bytes,
            disk_bytes: e.resources.disk_bytes,
        }),
        workspaces: e
            .workspaces
            .iter()
            .map(|m| pb::WorkspaceMount {
                workspace_id: m.workspace_id.clone(),
                mount_path: m.mount_path.clone(),
                mode: if m.read_only {
                    pb::MountMode::ReadOnly
                } else {
                    pb::MountMode::ReadWrite
                } as i32,
                size: m.size.clone(),
            })
            .collect(),
        egress: e.egress.as_ref().map(egress_pb),
        idle_suspend_sec: e.idle_suspend_sec,
        max_lifetime_sec: e.max_lifetime_sec,
        created_at: ts(&e.created_at),
        updated_at: ts(&e.updated_at),
        labels: e.labels.clone().into_iter().collect(),
    }
}

// ---------------------------------------------------------------------------------------------
// AccessService.

const KEY_NAME_MAX: usize = 128;

#[tonic::async_trait]
impl pb::access_service_server::AccessService for Platform {
    async fn create_namespace(
        &self,
        req: Request<pb::CreateNamespaceRequest>,
    ) -> std::result::Result<Response<pb::Namespace>, Status> {
        const M: &str = method!("AccessService", "CreateNamespace");
        let name = req.get_ref().name.clone();
        let p = self.gate(&req, M, &name).await?;
        let r = async {
            records::check_name("namespace", &name)?;
            let ns = Namespace {
                name: name.clone(),
                labels: map(&req.get_ref().labels),
                created_at: records::now(),
            };
            self.records.create(&ns).await?;
            Ok(namespace_pb(&ns))
        }
        .await;
        self.write(&p, M, &name, &name, r).await.map(Response::new)
    }

    async fn get_namespace(
        &self,
        req: Request<pb::GetNamespaceRequest>,
    ) -> std::result::Result<Response<pb::Namespace>, Status> {
        const M: &str = method!("AccessService", "GetNamespace");
        let name = &req.get_ref().name;
        self.gate(&req, M, name).await?;
        match self
            .records
            .get::<Namespace>(name)
            .await
            .map_err(Error::from)?
        {
            Some(n) => Ok(Response::new(namespace_pb(&n))),
            None => Err(Error::NotFound(format!("namespace {name}")).into()),
        }
    }

    async fn list_namespaces(
        &self,
        req: Request<pb::ListNamespacesRequest>,
    ) -> std::result::Result<Response<pb::ListNamespacesResponse>, Status> {
        const M: &str = method!("AccessService", "ListNamespaces");
        let p = self.gate(&req, M, "").await?;
        let all = self
            .records
            .list::<Namespace>("")
            .await
            .map_err(Error::from)?;
        Ok(Response::new(pb::ListNamespacesResponse {
            namespaces: all
                .iter()
                .filter(|n| p.sees(&n.name))
                .map(namespace_pb)
                .collect(),
        }))
    }

    async fn delete_namespace(
        &self,
        req: Request<pb::DeleteNamespaceRequest>,
    ) -> std::result::Result<Response<pb::DeleteNamespaceResponse>, Status> {
        const M: &str = method!("AccessService", "DeleteNamespace");
        let name = req.get_ref().name.clone();
        let p = self.gate(&req, M, &name).await?;
        let r = async {
            self.namespace_exists(&name).await?;
            let prefix = format!("{name}/");
            if !self.records.list::<Environment>(&prefix).await?.is_empty() {
                return Err(Error::FailedPrecondition(format!(
                    "namespace {name} still has environments"
                )));
            }
            for b in self.records.list::<Binding>(&prefix).await? {
                self.records
                    .delete::<Binding>(&format!("{prefix}{}", b.key_id))
                    .await?;
            }
            self.records.delete::<Namespace>(&name).await?;
            Ok(pb::DeleteNamespaceResponse {})
        }
        .await;
        self.write(&p, M, &name, &name, r).await.map(Response::new)
    }

    async fn create_api_key(
        &self,
        req: Request<pb::CreateApiKeyRequest>,
    ) -> std::result::Result<Response<pb::CreateApiKeyResponse>, Status> {
        const M: &str = method!("AccessService", "CreateApiKey");
        let r = req.get_ref().clone();
        let p = self.gate(&req, M, &r.namespace).await?;
        let result = async {
            let role = match (r.namespace.is_empty(), Role::from_proto(r.role)) {
                (true, None) if r.role == 0 => None,
                (false, Some(role)) => Some(role),
                (true, _) => return Err(records::Invalid("a role needs a namespace".into()).into()),
                (false, None) => {
                    return Err(records::Invalid(
                        "a key bound to a namespace needs a role (viewer, operator, admin)".into(),
                    )
                    .into())
                }
            };
            // Platform admins mint any key; a namespace ADMIN only keys bound to it.
            if !p.is_platform_admin() {
                if r.platform_admin || role.is_none() {
                    return Err(Error::PermissionDenied(
                        "only a platform admin may create a platform admin key or an unbound key"
                            .into(),
                    ));
                }
                match p.role_in(&r.namespace) {
                    Some(Role::Admin) => {}
                    Some(_) => {
                        return Err(Error::PermissionDenied(
                            "creating keys in a namespace needs its admin role".into(),
                        ))
                    }
                    None => return Err(Error::NotFound(format!("namespace {}", r.namespace))),
                }
            }
            if r.name.trim().is_empty() || r.name.len() > KEY_NAME_MAX {
                return Err(records::Invalid(format!(
                    "a key needs a name of 1-{KEY_NAME_MAX} bytes (who holds it)"
                ))
                .into());
            }
            let expires_at = match &r.expires_at {
                Some(t) => {
                    let s = rfc3339(t).ok_or(records::Invalid("expires_at is invalid".into()))?;
                    if chrono::DateTime::parse_from_rfc3339(&s)
                        .map(|d| d <= chrono::Utc::now())
                        .unwrap_or(true)
                    {
                        return Err(records::Invalid("expires_at is in the past".into()).into());
                    }
                    Some(s)
                }
                None => None,
            };
            if role.is_some() {
                self.namespace_exists(&r.namespace).await?;
            }
            let (key_id, token) = keys::mint()
                .map_err(|e| Error::FailedPrecondition(format!("no randomness: {e}")))?;
            let key = ApiKey {
                key_id: key_id.clone(),
                name: r.name.clone(),
                sha256: keys::digest(&token),
                platform_admin: r.platform_admin,
                created_at: records::now(),
                expires_at,
                revoked_at: None,
                created_by: p.name().to_string(),
            };
            self.records.create(&key).await?;
            if let Some(role) = role {
                self.records
                    .put(&Binding {
                        namespace: r.namespace.clone(),
                        key_id: key_id.clone(),
                        role,
                        created_at: records::now(),
                    })
                    .await?;
            }
            Ok((
                key_id,
                pb::CreateApiKeyResponse {
                    key: Some(key_pb(&key)),
                    secret: token,
                },
            ))
        }
        .await;
        let resource = result
            .as_ref()
            .map(|(id, _)| id.clone())
            .unwrap_or_default();
        self.write(&p, M, &r.namespace, &resource, result.map(|(_, resp)| resp))
            .await
            .map(Response::new)
    }

    async fn list_api_keys(
        &self,
        req: Request<pb::ListApiKeysRequest>,
    ) -> std::result::Result<Response<pb::ListApiKeysResponse>, Status> {
        const M: &str = method!("AccessService", "ListApiKeys");
        let ns = req.get_ref().namespace.clone();
        let p = self.gate(&req, M, &ns).await?;
        let r: Result<Vec<ApiKey>> = async {
            if ns.is_empty() {
                if !p.is_platform_admin() {
                    return Err(Error::PermissionDenied(
                        "listing every key needs a platform admin; name a namespace".into(),
                    ));
                }
                return Ok(self.records.list::<ApiKey>("").await?);
            }
            match p.role_in(&ns) {
                Some(Role::Admin) => {}
                Some(_) => {
                    return Err(Error::PermissionDenied(
                        "listing a namespace's keys needs its admin role".into(),
                    ))
                }
                None => return Err(Error::NotFound(format!("namespace {ns}"))),
            }
            let mut out = Vec::new();
            for b in self.records.list::<Binding>(&format!("{ns}/")).await? {
                if let Some(k) = self.records.get::<ApiKey>(&b.key_id).await? {
                    out.push(k);
                }
            }
            Ok(out)
        }
        .await;
        Ok(Response::new(pb::ListApiKeysResponse {
            keys: r.map_err(Status::from)?.iter().map(key_pb).collect(),
        }))
    }

    async fn revoke_api_key(
        &self,
        req: Request<pb::RevokeApiKeyRequest>,
    ) -> std::result::Result<Response<pb::ApiKey>, Status> {
        const M: &str = method!("AccessService", "RevokeApiKey");
        let id = req.get_ref().key_id.clone();
        let p = self.gate(&req, M, "").await?;
        let r = async {
            let missing = || Error::NotFound(format!("key {id}"));
            let mut key = self.records.get::<ApiKey>(&id).await?.ok_or_else(missing)?;
            if !p.is_platform_admin() {
                let bound = self.records.bindings_of(&id).await?;
                // Hidden unless the caller sees one of the key's namespaces.
                if !bound.iter().any(|b| p.sees(&b.namespace)) {
                    return Err(missing());
                }
                let admin_of_all = !bound.is_empty()
                    && bound
                        .iter()
                        .all(|b| p.role_in(&b.namespace) == Some(Role::Admin));
                if key.platform_admin || !admin_of_all {
                    return Err(Error::PermissionDenied(
                        "revoking this key needs the admin role in every namespace it is bound to"
                            .into(),
                    ));
                }
            }
            if key.revoked_at.is_none() {
                key.revoked_at = Some(records::now());
                self.records.put(&key).await?;
            }
            Ok(key_pb(&key))
        }
        .await;
        self.write(&p, M, "", &id, r).await.map(Response::new)
    }

    async fn set_role_binding(
        &self,
        req: Request<pb::SetRoleBindingRequest>,
    ) -> std::result::Result<Response<pb::RoleBinding>, Status> {
        const M: &str = method!("AccessService", "SetRoleBinding");
        let r = req.get_ref().clone();
        let p = self.gate(&req, M, &r.namespace).await?;
        let result = async {
            let role = Role::from_proto(r.role).ok_or(records::Invalid(
                "role must be viewer, operator or admin".into(),
            ))?;
            self.namespace_exists(&r.namespace).await?;
            if self.records.get::<ApiKey>(&r.key_id).await?.is_none() {
                return Err(Error::NotFound(format!("key {}", r.key_id)));
            }
            let b = Binding {
                namespace: r.namespace.clone(),
                key_id: r.key_id.clone(),
                role,
                created_at: records::now(),
            };
            self.records.put(&b).await?;
            Ok(binding_pb(&b))
        }
        .await;
        self.write(&p, M, &r.namespace, &r.key_id, result)
            .await
            .map(Response::new)
    }

    async fn delete_role_binding(
        &self,
        req: Request<pb::DeleteRoleBindingRequest>,
    ) -> std::result::Result<Response<pb::DeleteRoleBindingResponse>, Status> {
        const M: &str = method!("AccessService", "DeleteRoleBinding");
        let r = req.get_ref().clone();
        let p = self.gate(&req, M, &r.namespace).await?;
        let result = async {
            let key = format!("{}/{}", r.namespace, r.key_id);
            if !self.records.delete::<Binding>(&key).await? {
                return Err(Error::NotFound(format!("role binding {key}")));
            }
            Ok(pb::DeleteRoleBindingResponse {})
        }
        .await;
        self.write(&p, M, &r.namespace, &r.key_id, result)
            .await
            .map(Response::new)
    }

    async fn list_role_bindings(
        &self,
        req: Request<pb::ListRoleBindingsRequest>,
    ) -> std::result::Result<Response<pb::ListRoleBindingsResponse>, Status> {
        const M: &str = method!("AccessService", "ListRoleBindings");
        let ns = req.get_ref().namespace.clone();
        let p = self.gate(&req, M, &ns).await?;
        if ns.is_empty() && !p.is_platform_admin() {
            return Err(Error::PermissionDenied("name a namespace".into()).into());
        }
        let prefix = if ns.is_empty() {
            String::new()
        } else {
            format!("{ns}/")
        };
        let all = self
            .records
            .list::<Binding>(&prefix)
            .await
            .map_err(Error::from)?;
        Ok(Response::new(pb::ListRoleBindingsResponse {
            bindings: all.iter().map(binding_pb).collect(),
        }))
    }

    async fn who_am_i(
        &self,
        req: Request<pb::WhoAmIRequest>,
    ) -> std::result::Result<Response<pb::WhoAmIResponse>, Status> {
        const M: &str = method!("AccessService", "WhoAmI");
        let p = self.gate(&req, M, "").await?;
        let bindings = match &p {
            Principal::LocalRoot => Vec::new(),
            Principal::Key { key_id, roles, .. } => roles
                .iter()
                .map(|(ns, role)| pb::RoleBinding {
                    namespace: ns.clone(),
                    key_id: key_id.clone(),
                    role: role.to_proto(),
                    created_at: None,
                })
                .collect(),
        };
        Ok(Response::new(pb::WhoAmIResponse {
            principal: p.name().to_string(),
            platform_admin: p.is_platform_admin(),
            bindings,
        }))
    }

    async fn list_audit_events(
        &self,
        req: Request<pb::ListAuditEventsRequest>,
    ) -> std::result::Result<Response<pb::ListAuditEventsResponse>, Status> {
        const M: &str = method!("AccessService", "ListAuditEvents");
        let r = req.get_ref().clone();
        let p = self.gate(&req, M, &r.namespace).await?;
        if r.namespace.is_empty() && !p.is_platform_admin() {
            return Err(Error::PermissionDenied("name a namespace".into()).into());
        }
        let limit = match r.limit {
            0 => 100,
            n => n.min(1000) as usize,
        };
        let q = store::AuditQuery {
            namespace: r.namespace.clone(),
            since: r.since.as_ref().and_then(rfc3339),
            limit,
        };
        let hits = self
            .records
            .store()
            .audit_tail(&q)
            .await
            .map_err(Error::from)?;
        Ok(Response::new(pb::ListAuditEventsResponse {
            events: hits.iter().map(audit_pb).collect(),
        }))
    }
}

// ---------------------------------------------------------------------------------------------
// EnvironmentService.

#[tonic::async_trait]
impl pb::environment_service_server::EnvironmentService for Platform {
    async fn create_environment(
        &self,
        req: Request<pb::CreateEnvironmentRequest>,
    ) -> std::result::Result<Response<pb::Environment>, Status> {
        const M: &str = method!("EnvironmentService", "CreateEnvironment");
        let e = req.get_ref().environment.clone().unwrap_or_default();
        let p = self.gate(&req, M, &e.namespace).await?;
        let r = async {
            let mut env = environment_of(&e)?;
            env.check()?;
            self.namespace_exists(&env.namespace).await?;
            env.created_at = records::now();
            env.updated_at = env.created_at.clone();
            self.records.create(&env).await?;
            Ok(environment_pb(&env))
        }
        .await;
        self.write(&p, M, &e.namespace, &e.name, r)
            .await
            .map(Response::new)
    }

    async fn get_environment(
        &self,
        req: Request<pb::GetEnvironmentRequest>,
    ) -> std::result::Result<Response<pb::Environment>, Status> {
        const M: &str = method!("EnvironmentService", "GetEnvironment");
        let r = req.get_ref().clone();
        self.gate(&req, M, &r.namespace).await?;
        let key = format!("{}/{}", r.namespace, r.name);
        match self
            .records
            .get::<Environment>(&key)
            .await
            .map_err(Error::from)?
        {
            Some(e) => Ok(Response::new(environment_pb(&e))),
            None => Err(Error::NotFound(format!("environment {key}")).into()),
        }
    }

    async fn list_environments(
        &self,
        req: Request<pb::ListEnvironmentsRequest>,
    ) -> std::result::Result<Response<pb::ListEnvironmentsResponse>, Status> {
        const M: &str = method!("EnvironmentService", "ListEnvironments");
        let ns = req.get_ref().namespace.clone();
        self.gate(&req, M, &ns).await?;
        if ns.is_empty() {
            return Err(Error::Invalid(records::Invalid("namespace is required".into())).into());
        }
        let all = self
            .records
            .list::<Environment>(&format!("{ns}/"))
            .await
            .map_err(Error::from)?;
        Ok(Response::new(pb::ListEnvironmentsResponse {
            environments: all.iter().map(environment_pb).collect(),
        }))
    }

    async fn delete_environment(
        &self,
        req: Request<pb::DeleteEnvironmentRequest>,
    ) -> std::result::Result<Response<pb::DeleteEnvironmentResponse>, Status> {
        const M: &str = method!("EnvironmentService", "DeleteEnvironment");
        let r = req.get_ref().clone();
        let p = self.gate(&req, M, &r.namespace).await?;
        let result = async {
            let key = format!("{}/{}", r.namespace, r.name);
            if !self.records.delete::<Environment>(&key).await? {
                return Err(Error::NotFound(format!("environment {key}")));
            }
            Ok(pb::DeleteEnvironmentResponse {})
        }
        .await;
        self.write(&p, M, &r.namespace, &r.name, result)
            .await
            .map(Response::new)
    }
}

// ---------------------------------------------------------------------------------------------
// SandboxService and WorkspaceService.

pub(super) type Stream_<T> = Pin<Box<dyn Stream<Item = std::result::Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl pb::sandbox_service_server::SandboxService for Platform {
    async fn create_sandbox(
        &self,
        req: Request<pb::CreateSandboxRequest>,
    ) -> std::result::Result<Response<pb::Sandbox>, Status> {
        self.create_sandbox_here(req, method!("SandboxService", "CreateSandbox"))
            .await
    }
    async fn delete_sandbox(
        &self,
        req: Request<pb::DeleteSandboxRequest>,
    ) -> std::result::Result<Response<pb::DeleteSandboxResponse>, Status> {
        self.delete_sandbox_here(req, method!("SandboxService", "DeleteSandbox"))
            .await
    }
    async fn get_sandbox(
        &self,
        req: Request<pb::GetSandboxRequest>,
    ) -> std::result::Result<Response<pb::Sandbox>, Status> {
        self.get_sandbox_here(req, method!("SandboxService", "GetSandbox"))
            .await
    }
    async fn list_sandboxes(
        &self,
        req: Request<pb::ListSandboxesRequest>,
    ) -> std::result::Result<Response<pb::ListSandboxesResponse>, Status> {
        self.list_sandboxes_here(req, method!("SandboxService", "ListSandboxes"))
            .await
    }
    type WatchSandboxStream = Stream_<pb::SandboxEvent>;
    async fn watch_sandbox(
        &self,
        req: Request<pb::WatchSandboxRequest>,
    ) -> std::result::Result<Response<Self::WatchSandboxStream>, Status> {
        self.watch_sandbox_here(req, method!("SandboxService", "WatchSandbox"))
            .await
    }
    type ExecInSandboxStream = Stream_<pb::ExecServerMessage>;
    async fn exec_in_sandbox(
        &self,
        req: Request<Streaming<pb::ExecClientMessage>>,
    ) -> std::result::Result<Response<Self::ExecInSandboxStream>, Status> {
        self.exec_here(req, method!("SandboxService", "ExecInSandbox"))
            .await
    }
    async fn suspend_sandbox(
        &self,
        req: Request<pb::SuspendSandboxRequest>,
    ) -> std::result::Result<Response<pb::Sandbox>, Status> {
        self.suspend_sandbox_here(req, method!("SandboxService", "SuspendSandbox"))
            .await
    }
    async fn resume_sandbox(
        &self,
        req: Request<pb::ResumeSandboxRequest>,
    ) -> std::result::Result<Response<pb::Sandbox>, Status> {
        self.resume_sandbox_here(req, method!("SandboxService", "ResumeSandbox"))
            .await
    }
    async fn keep_sandbox_alive(
        &self,
        req: Request<pb::KeepSandboxAliveRequest>,
    ) -> std::result::Result<Response<pb::KeepSandboxAliveResponse>, Status> {
        self.keep_alive_here(req, method!("SandboxService", "KeepSandboxAlive"))
            .await
    }
    type TailSandboxLogsStream = Stream_<pb::LogEntry>;
    async fn tail_sandbox_logs(
        &self,
        req: Request<pb::TailSandboxLogsRequest>,
    ) -> std::result::Result<Response<Self::TailSandboxLogsStream>, Status> {
        self.tail_logs_here(req, method!("SandboxService", "TailSandboxLogs"))
            .await
    }
    async fn grant_egress(
        &self,
        req: Request<pb::GrantEgressRequest>,
    ) -> std::result::Result<Response<pb::GrantEgressResponse>, Status> {
        self.grant_egress_here(req, method!("SandboxService", "GrantEgress"))
            .await
    }
    async fn revoke_egress(
        &self,
        req: Request<pb::RevokeEgressRequest>,
    ) -> std::result::Result<Response<pb::RevokeEgressResponse>, Status> {
        self.revoke_egress_here(req, method!("SandboxService", "RevokeEgress"))
            .await
    }
    async fn expose_sandbox_port(
        &self,
        req: Request<pb::ExposeSandboxPortRequest>,
    ) -> std::result::Result<Response<pb::PortExposure>, Status> {
        self.expose_port_here(req, method!("SandboxService", "ExposeSandboxPort"))
            .await
    }
    async fn unexpose_sandbox_port(
        &self,
        req: Request<pb::UnexposeSandboxPortRequest>,
    ) -> std::result::Result<Response<pb::UnexposeSandboxPortResponse>, Status> {
        self.unexpose_port_here(req, method!("SandboxService", "UnexposeSandboxPort"))
            .await
    }
    async fn sync_sandbox_workspace(
        &self,
        req: Request<pb::SyncSandboxWorkspaceRequest>,
    ) -> std::result::Result<Response<pb::SyncSandboxWorkspaceResponse>, Status> {
        self.sync_workspace_here(req, method!("SandboxService", "SyncSandboxWorkspace"))
            .await
    }
}

#[tonic::async_trait]
impl pb::workspace_service_server::WorkspaceService for Platform {
    async fn create_workspace(
        &self,
        req: Request<pb::CreateWorkspaceRequest>,
    ) -> std::result::Result<Response<pb::Workspace>, Status> {
        self.create_workspace_here(req, method!("WorkspaceService", "CreateWorkspace"))
            .await
    }
    async fn get_workspace(
        &self,
        req: Request<pb::GetWorkspaceRequest>,
    ) -> std::result::Result<Response<pb::Workspace>, Status> {
        self.get_workspace_here(req, method!("WorkspaceService", "GetWorkspace"))
            .await
    }
    async fn list_workspaces(
        &self,
        req: Request<pb::ListWorkspacesRequest>,
    ) -> std::result::Result<Response<pb::ListWorkspacesResponse>, Status> {
        self.list_workspaces_here(req, method!("WorkspaceService", "ListWorkspaces"))
            .await
    }
    async fn delete_workspace(
        &self,
        req: Request<pb::DeleteWorkspaceRequest>,
    ) -> std::result::Result<Response<pb::DeleteWorkspaceResponse>, Status> {
        self.delete_workspace_here(req, method!("WorkspaceService", "DeleteWorkspace"))
            .await
    }
    async fn snapshot_workspace(
        &self,
        req: Request<pb::SnapshotWorkspaceRequest>,
    ) -> std::result::Result<Response<pb::WorkspaceSnapshot>, Status> {
        self.snapshot_workspace_here(req, method!("WorkspaceService", "SnapshotWorkspace"))
            .await
    }
    async fn list_workspace_snapshots(
        &self,
        req: Request<pb::ListWorkspaceSnapshotsRequest>,
    ) -> std::result::Result<Response<pb::ListWorkspaceSnapshotsResponse>, Status> {
        self.list_snapshots_here(req, method!("WorkspaceService", "ListWorkspaceSnapshots"))
            .await
    }
    async fn delete_workspace_snapshot(
        &self,
        req: Request<pb::DeleteWorkspaceSnapshotRequest>,
    ) -> std::result::Result<Response<pb::DeleteWorkspaceSnapshotResponse>, Status> {
        self.delete_snapshot_here(req, method!("WorkspaceService", "DeleteWorkspaceSnapshot"))
            .await
    }
}

/// Names of the services, for health.
pub const SERVICES: [&str; 4] = {
    use tonic::server::NamedService;
    [
        <pb::sandbox_service_server::SandboxServiceServer<Platform> as NamedService>::NAME,
        <pb::access_service_server::AccessServiceServer<Platform> as NamedService>::NAME,
        <pb::environment_service_server::EnvironmentServiceServer<Platform> as NamedService>::NAME,
        <pb::workspace_service_server::WorkspaceServiceServer<Platform> as NamedService>::NAME,
    ]
};

/// The descriptor set reflection serves for the platform API.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("platform_descriptor");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_root_and_the_servers_own_uid_are_local_admins() {
        let me = nix::unistd::geteuid().as_raw();
        assert!(is_local_admin(0));
        assert!(is_local_admin(me));
        for uid in [1, 1000, 65532, 65534] {
            if uid != me {
                assert!(!is_local_admin(uid), "uid {uid}");
            }
        }
    }

    #[test]
    fn timestamps_round_trip() {
        let t = ts("2026-12-02T03:04:05.678Z").unwrap();
        assert_eq!(rfc3339(&t).unwrap(), "2026-12-02T03:04:05.678Z");
    }
}
