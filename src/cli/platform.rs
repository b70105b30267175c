//! `computectl namespace|key|binding|env|whoami|audit|logs|watch`: the platform API's
//! namespaces, API keys, role bindings, environments, audit log, and a sandbox's run log and
//! state changes, on the node (root on its unix socket is the
//! platform admin) or on a router (`--addr` with `--api-key` / `COMPUTE_API_KEY`).

use std::collections::HashMap;

use clap::Subcommand;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use super::{print_json, print_list, Answer, Output, Target};
use crate::api::platform::v1 as pb;

/// Adds `authorization: Bearer <key>` to every call when a key is given.
#[derive(Clone)]
pub struct Bearer(Option<MetadataValue<Ascii>>);

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &self.0 {
            req.metadata_mut().insert("authorization", v.clone());
        }
        Ok(req)
    }
}

type Authed = InterceptedService<Channel, Bearer>;

impl Target {
    async fn authed(&self) -> anyhow::Result<(Channel, Bearer)> {
        let bearer = match &self.api_key {
            Some(k) if !k.is_empty() => Some(
                format!("Bearer {}", k.trim())
                    .parse()
                    // (The key itself is never echoed.)
                    .map_err(|_| anyhow::anyhow!("the API key holds characters a header cannot"))?,
            ),
            _ => None,
        };
        Ok((self.channel().await?, Bearer(bearer)))
    }

    /// An AccessService client carrying the API key.
    pub async fn access(
        &self,
    ) -> anyhow::Result<pb::access_service_client::AccessServiceClient<Authed>> {
        let (c, b) = self.authed().await?;
        Ok(pb::access_service_client::AccessServiceClient::with_interceptor(c, b))
    }

    /// A SandboxService client carrying the API key.
    pub async fn sandboxes(
        &self,
    ) -> anyhow::Result<pb::sandbox_service_client::SandboxServiceClient<Authed>> {
        let (c, b) = self.authed().await?;
        Ok(pb::sandbox_service_client::SandboxServiceClient::with_interceptor(c, b))
    }

    /// An EnvironmentService client carrying the API key.
    pub async fn environments(
        &self,
    ) -> anyhow::Result<pb::environment_service_client::EnvironmentServiceClient<Authed>> {
        let (c, b) = self.authed().await?;
        Ok(pb::environment_service_client::EnvironmentServiceClient::with_interceptor(c, b))
    }
}

/// A role on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RoleArg {
    /// Reads.
    Viewer,
    /// Reads and runs.
    Operator,
    /// Everything in the namespace.
    Admin,
}

impl From<RoleArg> for pb::Role {
    fn from(r: RoleArg) -> Self {
        match r {
            RoleArg::Viewer => pb::Role::Viewer,
            RoleArg::Operator => pb::Role::Operator,
            RoleArg::Admin => pb::Role::Admin,
        }
    }
}

fn role_name(r: i32) -> &'static str {
    match pb::Role::try_from(r) {
        Ok(pb::Role::Viewer) => "viewer",
        Ok(pb::Role::Operator) => "operator",
        Ok(pb::Role::Admin) => "admin",
        _ => "-",
    }
}

fn outcome_name(o: i32) -> &'static str {
    match pb::AuditOutcome::try_from(o) {
        Ok(pb::AuditOutcome::Ok) => "ok",
        Ok(pb::AuditOutcome::Denied) => "denied",
        Ok(pb::AuditOutcome::Failed) => "failed",
        _ => "-",
    }
}

/// A timestamp as RFC 3339 (milliseconds, UTC); `None` for unset.
fn time(t: &Option<prost_types::Timestamp>) -> Option<String> {
    t.as_ref().and_then(crate::api::convert::rfc3339_millis)
}

fn time_cell(t: &Option<prost_types::Timestamp>) -> String {
    time(t).unwrap_or_else(|| "-".into())
}

/// `90s`, `45m`, `12h`, `30d`.
fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let (n, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = n
        .parse()
        .map_err(|_| format!("{s:?}: want a number and a unit, e.g. 30d"))?;
    let secs = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86400,
        _ => return Err(format!("{s:?}: the unit is s, m, h or d")),
    };
    n.checked_mul(secs)
        .filter(|&v| v > 0)
        .map(std::time::Duration::from_secs)
        .ok_or_else(|| format!("{s:?}: out of range"))
}

/// `KEY=VALUE`.
fn parse_pair(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("{s:?}: want KEY=VALUE"))
}

/// `--workspace PATH[:SIZE][:ro]`: an ephemeral workspace at PATH.
fn parse_mount(s: &str) -> Result<pb::WorkspaceMount, String> {
    let mut parts = s.split(':');
    let mount_path = parts.next().unwrap_or_default().to_string();
    let mut m = pb::WorkspaceMount {
        mount_path,
        mode: pb::MountMode::ReadWrite as i32,
        ..Default::default()
    };
    for p in parts {
        match p {
            "ro" => m.mode = pb::MountMode::ReadOnly as i32,
            "rw" => m.mode = pb::MountMode::ReadWrite as i32,
            size => m.size = size.to_string(),
        }
    }
    Ok(m)
}

/// `--egress HOST_OR_CIDR[:PORT,PORT]`.
fn parse_egress(s: &str) -> Result<pb::EgressRule, String> {
    let (dest, ports) = match s.rsplit_once(':') {
        Some((d, p)) if !p.is_empty() && p.split(',').all(|x| x.parse::<u32>().is_ok()) => {
            (d, p.split(',').map(|x| x.parse().unwrap_or(0)).collect())
        }
        _ => (s, Vec::new()),
    };
    let destination = if dest.contains('/') {
        pb::egress_rule::Destination::Cidr(dest.to_string())
    } else {
        pb::egress_rule::Destination::Host(dest.to_string())
    };
    Ok(pb::EgressRule {
        destination: Some(destination),
        ports,
        protocol: pb::EgressProtocol::Unspecified as i32,
    })
}

/// Namespace commands.
#[derive(Debug, Subcommand)]
pub enum NamespaceCmd {
    /// The namespaces the caller can see.
    Ls,
    /// Create a namespace (platform admin).
    Create {
        /// DNS label.
        name: String,
        /// `KEY=VALUE` labels.
        #[arg(long = "label", value_parser = parse_pair)]
        labels: Vec<(String, String)>,
    },
    /// Show one namespace.
    Get {
        /// The namespace.
        name: String,
    },
    /// Delete an empty namespace (platform admin).
    Delete {
        /// The namespace.
        name: String,
    },
}

/// API key commands.
#[derive(Debug, Subcommand)]
pub enum KeyCmd {
    /// Keys (never their secrets): every key, or those bound in --namespace.
    Ls {
        /// Only the keys bound in this namespace.
        #[arg(long, short = 'n')]
        namespace: Option<String>,
    },
    /// Make a key and print its secret, once (alone on stdout).
    Create {
        /// Who or what holds it.
        name: String,
        /// A platform admin key (over every namespace).
        #[arg(long)]
        platform_admin: bool,
        /// Bind it in this namespace at once (with --role).
        #[arg(long, short = 'n', requires = "role")]
        namespace: Option<String>,
        /// Its role in --namespace.
        #[arg(long, value_enum, requires = "namespace")]
        role: Option<RoleArg>,
        /// Expires after this long (`90m`, `12h`, `30d`); default never.
        #[arg(long, value_parser = parse_duration)]
        expires_in: Option<std::time::Duration>,
    },
    /// Revoke a key: it stops working on every node and router at once.
    Revoke {
        /// The key id.
        key_id: String,
    },
}

/// Role binding commands.
#[derive(Debug, Subcommand)]
pub enum BindingCmd {
    /// The bindings of a namespace (platform admin without one: every binding).
    Ls {
        /// The namespace.
        namespace: Option<String>,
    },
    /// Give a key a role in a namespace (replacing its role there).
    Set {
        /// The namespace.
        namespace: String,
        /// The key id.
        key_id: String,
        /// The role.
        #[arg(value_enum)]
        role: RoleArg,
    },
    /// Take a key's role in a namespace away.
    Delete {
        /// The namespace.
        namespace: String,
        /// The key id.
        key_id: String,
    },
}

/// Environment commands.
#[derive(Debug, Subcommand)]
pub enum EnvCmd {
    /// The environments of a namespace.
    Ls {
        /// The namespace.
        namespace: String,
    },
    /// Show one environment.
    Get {
        /// The namespace.
        namespace: String,
        /// The environment.
        name: String,
    },
    /// Create an environment: `env create NS NAME --image IMG [options] [-- DEFAULT_ARGV...]`.
    Create(Box<EnvCreate>),
    /// Delete an environment.
    Delete {
        /// The namespace.
        namespace: String,
        /// The environment.
        name: String,
    },
}

/// `env create`'s flags.
#[derive(Debug, clap::Args)]
pub struct EnvCreate {
    /// The namespace.
    namespace: String,
    /// DNS label, unique in the namespace.
    name: String,
    /// The sandbox image.
    #[arg(long)]
    image: String,
    /// `KEY=VALUE` environment of its sandboxes.
    #[arg(long = "env", short = 'e', value_parser = parse_pair)]
    env: Vec<(String, String)>,
    /// Working directory (absolute).
    #[arg(long, short = 'w', default_value = "")]
    workdir: String,
    /// CPU, millicores.
    #[arg(long, default_value_t = 0)]
    cpu_millis: u32,
    /// Memory (`512Mi`, `2Gi` or bytes).
    #[arg(long, value_parser = parse_bytes)]
    memory: Option<u64>,
    /// Disk (`10Gi` or bytes).
    #[arg(long, value_parser = parse_bytes)]
    disk: Option<u64>,
    /// An ephemeral workspace: `PATH[:SIZE][:ro]`, repeatable (at most 8).
    #[arg(long = "workspace", value_parser = parse_mount)]
    workspaces: Vec<pb::WorkspaceMount>,
    /// A base egress rule: `HOST_OR_CIDR[:PORT,PORT]`, repeatable (none: deny all).
    #[arg(long = "egress", value_parser = parse_egress)]
    egress: Vec<pb::EgressRule>,
    /// Suspend after this many idle seconds (0: never).
    #[arg(long, default_value_t = 0)]
    idle_suspend_sec: u32,
    /// Ends after this many seconds (0: no limit).
    #[arg(long, default_value_t = 0)]
    max_lifetime_sec: u32,
    /// `KEY=VALUE` labels.
    #[arg(long = "label", value_parser = parse_pair)]
    labels: Vec<(String, String)>,
    /// The default argv of its sandboxes.
    #[arg(last = true)]
    argv: Vec<String>,
}

fn parse_bytes(s: &str) -> Result<u64, String> {
    crate::size::parse_size(s).ok_or_else(|| format!("{s:?}: want bytes or a size like 512Mi"))
}

/// `audit`'s flags.
#[derive(Debug, clap::Args)]
pub struct AuditArgs {
    /// Only this namespace's events (what a namespace ADMIN may read).
    #[arg(long, short = 'n', default_value = "")]
    namespace: String,
    /// Only events after this time (RFC 3339) or this long ago (`1h`).
    #[arg(long)]
    since: Option<String>,
    /// At most this many (default 100, the server caps at 1000).
    #[arg(long, default_value_t = 100)]
    limit: u32,
}

fn namespace_json(n: &pb::Namespace) -> serde_json::Value {
    serde_json::json!({"name": n.name, "labels": n.labels, "created_at": time(&n.created_at)})
}

fn key_json(k: &pb::ApiKey) -> serde_json::Value {
    serde_json::json!({
        "key_id": k.key_id, "name": k.name, "platform_admin": k.platform_admin,
        "created_at": time(&k.created_at), "expires_at": time(&k.expires_at),
        "revoked_at": time(&k.revoked_at), "created_by": k.created_by,
    })
}

fn binding_json(b: &pb::RoleBinding) -> serde_json::Value {
    serde_json::json!({
        "namespace": b.namespace, "key_id": b.key_id, "role": role_name(b.role),
        "created_at": time(&b.created_at),
    })
}

fn environment_json(e: &pb::Environment) -> serde_json::Value {
    let r = e.resources.unwrap_or_default();
    let mounts: Vec<_> = e
        .workspaces
        .iter()
        .map(|m| {
            serde_json::json!({
                "workspace_id": m.workspace_id, "mount_path": m.mount_path,
                "read_only": m.mode == pb::MountMode::ReadOnly as i32, "size": m.size,
            })
        })
        .collect();
    let egress: Vec<_> = e
        .egress
        .iter()
        .flat_map(|p| p.rules.iter())
        .map(|r| {
            let (kind, dest) = match &r.destination {
                Some(pb::egress_rule::Destination::Host(h)) => ("host", h.clone()),
                Some(pb::egress_rule::Destination::Cidr(c)) => ("cidr", c.clone()),
                None => ("none", String::new()),
            };
            serde_json::json!({kind: dest, "ports": r.ports})
        })
        .collect();
    serde_json::json!({
        "namespace": e.namespace, "name": e.name, "image": e.image,
        "default_argv": e.default_argv, "env": e.env, "working_dir": e.working_dir,
        "resources": {"cpu_millis": r.cpu_millis, "memory_bytes": r.memory_bytes, "disk_bytes": r.disk_bytes},
        "workspaces": mounts, "egress": egress,
        "idle_suspend_sec": e.idle_suspend_sec, "max_lifetime_sec": e.max_lifetime_sec,
        "labels": e.labels, "created_at": time(&e.created_at), "updated_at": time(&e.updated_at),
    })
}

fn audit_json(e: &pb::AuditEvent) -> serde_json::Value {
    serde_json::json!({
        "time": time(&e.time), "principal": e.principal, "method": e.method,
        "namespace": e.namespace, "resource": e.resource, "outcome": outcome_name(e.outcome),
        "code": e.code, "detail": e.detail,
    })
}

/// Prints one item as JSON, or as a one-row table.
fn print_one<T>(
    t: &Target,
    item: &T,
    json: impl Fn(&T) -> serde_json::Value,
    header: &[&str],
    row: impl Fn(&T) -> Vec<String>,
) -> anyhow::Result<()> {
    if t.output == Output::Json {
        return print_json(&json(item));
    }
    super::table(header, &[row(item)]);
    Ok(())
}

fn key_row(k: &pb::ApiKey) -> Vec<String> {
    let state = if k.revoked_at.is_some() {
        "revoked"
    } else {
        "active"
    };
    vec![
        k.key_id.clone(),
        k.name.clone(),
        if k.platform_admin { "yes" } else { "no" }.into(),
        state.into(),
        time_cell(&k.expires_at),
        k.created_by.clone(),
    ]
}

const KEY_HEADER: [&str; 6] = [
    "KEY",
    "NAME",
    "PLATFORM-ADMIN",
    "STATE",
    "EXPIRES",
    "CREATED-BY",
];

fn env_row(e: &pb::Environment) -> Vec<String> {
    let r = e.resources.unwrap_or_default();
    vec![
        e.name.clone(),
        e.image.clone(),
        if r.cpu_millis == 0 {
            "-".into()
        } else {
            format!("{}m", r.cpu_millis)
        },
        if r.memory_bytes == 0 {
            "-".into()
        } else {
            format!("{}Mi", r.memory_bytes >> 20)
        },
        e.idle_suspend_sec.to_string(),
        e.max_lifetime_sec.to_string(),
    ]
}

const ENV_HEADER: [&str; 6] = [
    "NAME",
    "IMAGE",
    "CPU",
    "MEMORY",
    "IDLE-SUSPEND",
    "MAX-LIFETIME",
];

/// Runs a namespace command.
pub async fn namespace(t: &Target, cmd: NamespaceCmd) -> anyhow::Result<()> {
    let mut c = t.access().await?;
    let header = ["NAME", "LABELS", "CREATED"];
    let row = |n: &pb::Namespace| {
        let mut labels: Vec<_> = n.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        labels.sort();
        vec![n.name.clone(), labels.join(","), time_cell(&n.created_at)]
    };
    match cmd {
        NamespaceCmd::Ls => {
            let ns = c
                .list_namespaces(pb::ListNamespacesRequest {})
                .await
                .answer("list namespaces")?
                .namespaces;
            print_list(t, &ns, namespace_json, &header, row)
        }
        NamespaceCmd::Create { name, labels } => {
            let n = c
                .create_namespace(pb::CreateNamespaceRequest {
                    name: name.clone(),
                    labels: labels.into_iter().collect(),
                })
                .await
                .answer(&format!("create namespace {name}"))?;
            print_one(t, &n, namespace_json, &header, row)
        }
        NamespaceCmd::Get { name } => {
            let n = c
                .get_namespace(pb::GetNamespaceRequest { name: name.clone() })
                .await
                .answer(&format!("get namespace {name}"))?;
            print_one(t, &n, namespace_json, &header, row)
        }
        NamespaceCmd::Delete { name } => {
            c.delete_namespace(pb::DeleteNamespaceRequest { name: name.clone() })
                .await
                .answer(&format!("delete namespace {name}"))?;
            eprintln!("deleted namespace {name}");
            Ok(())
        }
    }
}

/// Runs a key command.
pub async fn key(t: &Target, cmd: KeyCmd) -> anyhow::Result<()> {
    let mut c = t.access().await?;
    match cmd {
        KeyCmd::Ls { namespace } => {
            let keys = c
                .list_api_keys(pb::ListApiKeysRequest {
                    namespace: namespace.unwrap_or_default(),
                })
                .await
                .answer("list keys")?
                .keys;
            print_list(t, &keys, key_json, &KEY_HEADER, key_row)
        }
        KeyCmd::Create {
            name,
            platform_admin,
            namespace,
            role,
            expires_in,
        } => {
            let expires_at = expires_in.map(|d| {
                let at = std::time::SystemTime::now() + d;
                prost_types::Timestamp::from(at)
            });
            let r = c
                .create_api_key(pb::CreateApiKeyRequest {
                    name: name.clone(),
                    platform_admin,
                    expires_at,
                    namespace: namespace.clone().unwrap_or_default(),
                    role: role.map(pb::Role::from).unwrap_or_default() as i32,
                })
                .await
                .answer(&format!("create key {name}"))?;
            let key = r.key.unwrap_or_default();
            if t.output == Output::Json {
                let mut v = key_json(&key);
                v["secret"] = r.secret.into();
                return print_json(&v);
            }
            // The secret alone on stdout (scripts capture it); the rest on stderr.
            println!("{}", r.secret);
            eprintln!(
                "key {} ({name}){}; only its hash is kept: the secret is not shown again",
                key.key_id,
                match (&namespace, role) {
                    (Some(ns), Some(r)) =>
                        format!(", {} in {ns}", role_name(pb::Role::from(r) as i32)),
                    _ if platform_admin => ", platform admin".into(),
                    _ => String::new(),
                }
            );
            Ok(())
        }
        KeyCmd::Revoke { key_id } => {
            let k = c
                .revoke_api_key(pb::RevokeApiKeyRequest {
                    key_id: key_id.clone(),
                })
                .await
                .answer(&format!("revoke key {key_id}"))?;
            print_one(t, &k, key_json, &KEY_HEADER, key_row)
        }
    }
}

/// Runs a binding command.
pub async fn binding(t: &Target, cmd: BindingCmd) -> anyhow::Result<()> {
    let mut c = t.access().await?;
    let header = ["NAMESPACE", "KEY", "ROLE", "CREATED"];
    let row = |b: &pb::RoleBinding| {
        vec![
            b.namespace.clone(),
            b.key_id.clone(),
            role_name(b.role).into(),
            time_cell(&b.created_at),
        ]
    };
    match cmd {
        BindingCmd::Ls { namespace } => {
            let bs = c
                .list_role_bindings(pb::ListRoleBindingsRequest {
                    namespace: namespace.unwrap_or_default(),
                })
                .await
                .answer("list bindings")?
                .bindings;
            print_list(t, &bs, binding_json, &header, row)
        }
        BindingCmd::Set {
            namespace,
            key_id,
            role,
        } => {
            let b = c
                .set_role_binding(pb::SetRoleBindingRequest {
                    namespace: namespace.clone(),
                    key_id: key_id.clone(),
                    role: pb::Role::from(role) as i32,
                })
                .await
                .answer(&format!("bind {key_id} in {namespace}"))?;
            print_one(t, &b, binding_json, &header, row)
        }
        BindingCmd::Delete { namespace, key_id } => {
            c.delete_role_binding(pb::DeleteRoleBindingRequest {
                namespace: namespace.clone(),
                key_id: key_id.clone(),
            })
            .await
            .answer(&format!("unbind {key_id} in {namespace}"))?;
            eprintln!("{key_id} holds no role in {namespace} now");
            Ok(())
        }
    }
}

/// Runs an environment command.
pub async fn env(t: &Target, cmd: EnvCmd) -> anyhow::Result<()> {
    let mut c = t.environments().await?;
    match cmd {
        EnvCmd::Ls { namespace } => {
            let es = c
                .list_environments(pb::ListEnvironmentsRequest {
                    namespace: namespace.clone(),
                })
                .await
                .answer(&format!("list environments of {namespace}"))?
                .environments;
            print_list(t, &es, environment_json, &ENV_HEADER, env_row)
        }
        EnvCmd::Get { namespace, name } => {
            let e = c
                .get_environment(pb::GetEnvironmentRequest {
                    namespace: namespace.clone(),
                    name: name.clone(),
                })
                .await
                .answer(&format!("get environment {namespace}/{name}"))?;
            print_one(t, &e, environment_json, &ENV_HEADER, env_row)
        }
        EnvCmd::Create(a) => {
            let a = *a;
            let what = format!("create environment {}/{}", a.namespace, a.name);
            let environment = pb::Environment {
                namespace: a.namespace,
                name: a.name,
                image: a.image,
                default_argv: a.argv,
                env: a.env.into_iter().collect::<HashMap<_, _>>(),
                working_dir: a.workdir,
                resources: Some(pb::Resources {
                    cpu_millis: a.cpu_millis,
                    memory_bytes: a.memory.unwrap_or(0),
                    disk_bytes: a.disk.unwrap_or(0),
                }),
                workspaces: a.workspaces,
                egress: (!a.egress.is_empty()).then_some(pb::EgressPolicy { rules: a.egress }),
                idle_suspend_sec: a.idle_suspend_sec,
                max_lifetime_sec: a.max_lifetime_sec,
                labels: a.labels.into_iter().collect(),
                ..Default::default()
            };
            let e = c
                .create_environment(pb::CreateEnvironmentRequest {
                    environment: Some(environment),
                })
                .await
                .answer(&what)?;
            print_one(t, &e, environment_json, &ENV_HEADER, env_row)
        }
        EnvCmd::Delete { namespace, name } => {
            c.delete_environment(pb::DeleteEnvironmentRequest {
                namespace: namespace.clone(),
                name: name.clone(),
            })
            .await
            .answer(&format!("delete environment {namespace}/{name}"))?;
            eprintln!("deleted environment {namespace}/{name}");
            Ok(())
        }
    }
}

/// `whoami`: the caller's principal and roles.
pub async fn whoami(t: &Target) -> anyhow::Result<()> {
    let r = t
        .access()
        .await?
        .who_am_i(pb::WhoAmIRequest {})
        .await
        .answer("whoami")?;
    if t.output == Output::Json {
        let bs: Vec<_> = r.bindings.iter().map(binding_json).collect();
        return print_json(&serde_json::json!({
            "principal": r.principal, "platform_admin": r.platform_admin, "bindings": bs,
        }));
    }
    println!(
        "{}{}",
        r.principal,
        if r.platform_admin {
            " (platform admin)"
        } else {
            ""
        }
    );
    for b in &r.bindings {
        println!("  {} in {}", role_name(b.role), b.namespace);
    }
    Ok(())
}

/// `audit`: the audit log, oldest first; `-o json` prints one JSON object per line.
pub async fn audit(t: &Target, a: AuditArgs) -> anyhow::Result<()> {
    let since = match a.since.as_deref() {
        None => None,
        Some(s) => Some(match crate::api::convert::timestamp_of_rfc3339(s) {
            Some(t) => t,
            None => {
                let d = parse_duration(s).map_err(|e| anyhow::anyhow!("--since {e}"))?;
                prost_types::Timestamp::from(std::time::SystemTime::now() - d)
            }
        }),
    };
    let evs = t
        .access()
        .await?
        .list_audit_events(pb::ListAuditEventsRequest {
            namespace: a.namespace,
            since,
            limit: a.limit,
        })
        .await
        .answer("read the audit log")?
        .events;
    if t.output == Output::Json {
        for e in &evs {
            println!("{}", audit_json(e));
        }
        return Ok(());
    }
    let rows: Vec<Vec<String>> = evs
        .iter()
        .map(|e| {
            vec![
                time_cell(&e.time),
                e.principal.clone(),
                e.method.rsplit('/').next().unwrap_or(&e.method).to_string(),
                if e.namespace.is_empty() {
                    "-".into()
                } else {
                    e.namespace.clone()
                },
                if e.resource.is_empty() {
                    "-".into()
                } else {
                    e.resource.clone()
                },
                match outcome_name(e.outcome) {
                    "ok" => "ok".to_string(),
                    o => format!("{o} {}", e.code),
                },
            ]
        })
        .collect();
    super::table(
        &[
            "TIME",
            "PRINCIPAL",
            "METHOD",
            "NAMESPACE",
            "RESOURCE",
            "OUTCOME",
        ],
        &rows,
    );
    Ok(())
}

/// `logs`'s flags.
#[derive(Debug, clap::Args)]
pub struct LogsArgs {
    /// Sandbox id.
    id: String,
    /// Stay open and print new output as it is written (until the sandbox is deleted).
    #[arg(long, short = 'f')]
    follow: bool,
    /// Only entries after this offset (0: the oldest kept).
    #[arg(long, default_value_t = 0)]
    from: u64,
    /// Only this run of the workload (0: every run).
    #[arg(long, default_value_t = 0)]
    run: u32,
    /// At most this many entries of history (0: the server's 2000).
    #[arg(long, default_value_t = 0)]
    limit: u32,
}

fn marker_name(m: i32) -> &'static str {
    match pb::LogMarker::try_from(m).unwrap_or(pb::LogMarker::Unspecified) {
        pb::LogMarker::Created => "created",
        pb::LogMarker::Started => "started",
        pb::LogMarker::Exited => "exited",
        pb::LogMarker::OomKilled => "oom killed",
        pb::LogMarker::Suspended => "suspended",
        pb::LogMarker::Resumed => "resumed",
        pb::LogMarker::Failed => "failed",
        pb::LogMarker::Terminated => "terminated",
        pb::LogMarker::Deleted => "deleted",
        pb::LogMarker::Unspecified => "marker",
    }
}

fn state_name(s: i32) -> &'static str {
    match pb::SandboxState::try_from(s).unwrap_or(pb::SandboxState::Unspecified) {
        pb::SandboxState::Pending => "PENDING",
        pb::SandboxState::Running => "RUNNING",
        pb::SandboxState::Suspending => "SUSPENDING",
        pb::SandboxState::Suspended => "SUSPENDED",
        pb::SandboxState::Resuming => "RESUMING",
        pb::SandboxState::Failed => "FAILED",
        pb::SandboxState::Terminated => "TERMINATED",
        pb::SandboxState::Unspecified => "UNSPECIFIED",
    }
}

/// `logs`: a platform sandbox's run log. The workload's stdout goes to stdout and its stderr
/// to stderr, as it wrote them; lifecycle markers are lines of their own on stderr
/// (`--- exited with code 3`). `-o json` prints one JSON object per entry, with its offset.
pub async fn logs(t: &Target, a: LogsArgs) -> anyhow::Result<()> {
    use std::io::Write;
    let mut st = t
        .sandboxes()
        .await?
        .tail_sandbox_logs(pb::TailSandboxLogsRequest {
            sandbox_id: a.id.clone(),
            from_offset: a.from,
            run: a.run,
            limit: a.limit,
            follow: a.follow,
        })
        .await
        .answer(&format!("read the run log of {}", a.id))?;
    let (mut out, mut err) = (std::io::stdout(), std::io::stderr());
    while let Some(e) = st
        .message()
        .await
        .map_err(|s| super::status_error("read the run log", s))?
    {
        if t.output == Output::Json {
            let v = serde_json::json!({
                "offset": e.offset, "run": e.run, "time": time(&e.time),
                "stream": match pb::LogStream::try_from(e.stream) {
                    Ok(pb::LogStream::Stdout) => "stdout",
                    Ok(pb::LogStream::Stderr) => "stderr",
                    _ => "marker",
                },
                "marker": (e.stream == pb::LogStream::Marker as i32).then(|| marker_name(e.marker)),
                "exit_code": (e.marker == pb::LogMarker::Exited as i32).then_some(e.exit_code),
                "data": String::from_utf8_lossy(&e.data),
            });
            writeln!(out, "{v}")?;
            out.flush()?;
            continue;
        }
        match pb::LogStream::try_from(e.stream) {
            Ok(pb::LogStream::Stdout) => {
                out.write_all(&e.data)?;
                out.flush()?;
            }
            Ok(pb::LogStream::Stderr) => err.write_all(&e.data)?,
            _ => {
                let what = match pb::LogMarker::try_from(e.marker) {
                    Ok(pb::LogMarker::Exited) => format!("exited with code {}", e.exit_code),
                    _ => marker_name(e.marker).to_string(),
                };
                let detail = String::from_utf8_lossy(&e.data);
                let sep = if detail.is_empty() { "" } else { ": " };
                writeln!(err, "--- {} {what}{sep}{detail}", time_cell(&e.time))?;
            }
        }
    }
    Ok(())
}

/// `watch`: a sandbox's state, then every change of it, until it is TERMINATED; one line per
/// change (`-o json`: one JSON object per line).
pub async fn watch(t: &Target, id: &str) -> anyhow::Result<()> {
    let mut st = t
        .sandboxes()
        .await?
        .watch_sandbox(pb::WatchSandboxRequest {
            sandbox_id: id.to_string(),
        })
        .await
        .answer(&format!("watch {id}"))?;
    while let Some(ev) = st
        .message()
        .await
        .map_err(|s| super::status_error("watch", s))?
    {
        let Some(sb) = ev.sandbox else { continue };
        if t.output == Output::Json {
            println!(
                "{}",
                serde_json::json!({
                    "observed_at": time(&ev.observed_at), "sandbox_id": sb.sandbox_id,
                    "namespace": sb.namespace, "state": state_name(sb.state),
                    "state_reason": sb.state_reason, "node": sb.node,
                })
            );
        } else {
            let reason = if sb.state_reason.is_empty() {
                String::new()
            } else {
                format!("  {}", sb.state_reason)
            };
            println!(
                "{}  {}{reason}",
                time_cell(&ev.observed_at),
                state_name(sb.state)
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("90s").unwrap().as_secs(), 90);
        assert_eq!(parse_duration("30d").unwrap().as_secs(), 30 * 86400);
        assert!(parse_duration("0h").is_err());
        assert!(parse_duration("12").is_err());
        assert!(parse_duration("h").is_err());
        assert!(parse_duration("99999999999999999999d").is_err());
    }

    #[test]
    fn mounts_and_egress() {
        let m = parse_mount("/work:5Gi:ro").unwrap();
        assert_eq!((m.mount_path.as_str(), m.size.as_str()), ("/work", "5Gi"));
        assert_eq!(m.mode, pb::MountMode::ReadOnly as i32);
        let r = parse_egress("pypi.org:443").unwrap();
        assert_eq!(
            r.destination,
            Some(pb::egress_rule::Destination::Host("pypi.org".into()))
        );
        assert_eq!(r.ports, vec![443]);
        let r = parse_egress("10.0.0.0/8").unwrap();
        assert_eq!(
            r.destination,
            Some(pb::egress_rule::Destination::Cidr("10.0.0.0/8".into()))
        );
        assert!(r.ports.is_empty());
        // An IPv6 CIDR's colons are not ports.
        let r = parse_egress("fd00::/8").unwrap();
        assert_eq!(
            r.destination,
            Some(pb::egress_rule::Destination::Cidr("fd00::/8".into()))
        );
    }

    #[test]
    fn bearer_is_sent_only_with_a_key() {
        use tonic::service::Interceptor;
        let mut b = Bearer(Some("Bearer k".parse().unwrap()));
        let r = b.call(tonic::Request::new(())).unwrap();
        assert_eq!(r.metadata().get("authorization").unwrap(), "Bearer k");
        let r = Bearer(None).call(tonic::Request::new(())).unwrap();
        assert!(r.metadata().get("authorization").is_none());
    }
}
