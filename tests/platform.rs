//! The platform API (`platform.v1`) served by a real `computed node`: who may call what.
//!
//! * The table: every RPC of the proto × every credential (none, a malformed one, a revoked
//!   and an expired key, VIEWER / OPERATOR / ADMIN of `team-a`, a platform admin key) × its
//!   own namespace and another one. No usable key is UNAUTHENTICATED; a role too low is
//!   PERMISSION_DENIED; another namespace looks missing (NOT_FOUND); an allowed call gets
//!   past the gate (the capabilities of later issues then answer UNIMPLEMENTED).
//! * Root on the unix socket is the platform admin `local-root`, which bootstraps the first
//!   namespace and keys; the records survive `kill -9`.
//! * Keys never appear in the daemon's log, in errors or in the audit log, which holds every
//!   write and every denied call.
//! * The same table through a `computed router` in front of two nodes (bootstrapped as root on
//!   the router's own socket; its records in its embedded store survive a restart), with
//!   compute.v1 still forwarded to the nodes; replicas sharing records are `tests/kube_real.rs`.
//! * `computectl`'s platform verbs: namespaces, keys (the secret once, on stdout), bindings,
//!   environments, whoami and the audit log, as tables and `-o json`, as root on the socket and
//!   with `--api-key` / `COMPUTE_API_KEY` over TCP.

#[macro_use]
mod common;

use std::time::Duration;

use common::router::RouterProc;
use common::*;
use computed::api::platform::v1 as pb;
use computed::platform::access::{self, Need, Role};
use pb::access_service_client::AccessServiceClient;
use pb::environment_service_client::EnvironmentServiceClient;
use pb::sandbox_service_client::SandboxServiceClient;
use pb::workspace_service_client::WorkspaceServiceClient;
use tonic::transport::Channel;
use tonic::{Code, Request};

fn with<T>(m: T, token: Option<&str>) -> Request<T> {
    let mut r = Request::new(m);
    if let Some(t) = token {
        r.metadata_mut()
            .insert("authorization", format!("Bearer {t}").parse().unwrap());
    }
    r
}

fn code<T>(r: Result<tonic::Response<T>, tonic::Status>) -> Code {
    match r {
        Ok(_) => Code::Ok,
        Err(s) => s.code(),
    }
}

/// Calls `method` acting in namespace `ns` with `token` (None: no authorization header),
/// with a request that changes nothing the rest of the table relies on; returns the code.
async fn call(ch: &Channel, method: &str, token: Option<&str>, ns: &str) -> Code {
    let mut a = AccessServiceClient::new(ch.clone());
    let mut e = EnvironmentServiceClient::new(ch.clone());
    let mut s = SandboxServiceClient::new(ch.clone());
    let mut w = WorkspaceServiceClient::new(ch.clone());
    let name = method.rsplit('/').next().unwrap();
    let ns = ns.to_string();
    let t = token;
    let id = "00000000-0000-0000-0000-000000000000".to_string();
    let nokey = "0123456789abcdef".to_string();
    let uniq = format!("env-{}", uuid::Uuid::new_v4().simple());
    match name {
        "CreateSandbox" => code(
            s.create_sandbox(with(
                pb::CreateSandboxRequest {
                    namespace: ns,
                    environment: "py".into(),
                    // Past the gate, refused: the table makes no sandbox.
                    working_dir: "relative".into(),
                    ..Default::default()
                },
                t,
            ))
            .await,
        ),
        "DeleteSandbox" => code(
            s.delete_sandbox(with(pb::DeleteSandboxRequest { sandbox_id: id }, t))
                .await,
        ),
        "GetSandbox" => code(
            s.get_sandbox(with(pb::GetSandboxRequest { sandbox_id: id }, t))
                .await,
        ),
        "ListSandboxes" => code(
            s.list_sandboxes(with(
                pb::ListSandboxesRequest {
                    namespace: ns,
                    ..Default::default()
                },
                t,
            ))
            .await,
        ),
        "WatchSandbox" => code(
            s.watch_sandbox(with(pb::WatchSandboxRequest { sandbox_id: id }, t))
                .await,
        ),
        "ExecInSandbox" => {
            let first = pb::ExecClientMessage {
                msg: Some(pb::exec_client_message::Msg::Spec(pb::ExecSpec {
                    sandbox_id: id,
                    argv: vec!["true".into()],
                    ..Default::default()
                })),
            };
            code(
                s.exec_in_sandbox(with(tokio_stream::iter(vec![first]), t))
                    .await,
            )
        }
        "SuspendSandbox" => code(
            s.suspend_sandbox(with(pb::SuspendSandboxRequest { sandbox_id: id }, t))
                .await,
        ),
        "ResumeSandbox" => code(
            s.resume_sandbox(with(pb::ResumeSandboxRequest { sandbox_id: id }, t))
                .await,
        ),
        "KeepSandboxAlive" => code(
            s.keep_sandbox_alive(with(pb::KeepSandboxAliveRequest { sandbox_id: id }, t))
                .await,
        ),
        "TailSandboxLogs" => code(
            s.tail_sandbox_logs(with(
                pb::TailSandboxLogsRequest {
                    sandbox_id: id,
                    ..Default::default()
                },
                t,
            ))
            .await,
        ),
        "GrantEgress" => code(
            s.grant_egress(with(
                pb::GrantEgressRequest {
                    sandbox_id: id,
                    ..Default::default()
                },
                t,
            ))
            .await,
        ),
        "RevokeEgress" => code(
            s.revoke_egress(with(
                pb::RevokeEgressRequest {
                    sandbox_id: id,
                    grant_id: "g".into(),
                },
                t,
            ))
            .await,
        ),
        "ExposeSandboxPort" => code(
            s.expose_sandbox_port(with(
                pb::ExposeSandboxPortRequest {
                    sandbox_id: id,
                    port: 8080,
                    ..Default::default()
                },
                t,
            ))
            .await,
        ),
        "UnexposeSandboxPort" => code(
            s.unexpose_sandbox_port(with(
                pb::UnexposeSandboxPortRequest {
                    sandbox_id: id,
                    port: 8080,
                },
                t,
            ))
            .await,
        ),
        "SyncSandboxWorkspace" => code(
            s.sync_sandbox_workspace(with(
                pb::SyncSandboxWorkspaceRequest {
                    sandbox_id: id,
                    ..Default::default()
                },
                t,
            ))
            .await,
        ),
        "CreateNamespace" => code(
            a.create_namespace(with(
                pb::CreateNamespaceRequest {
                    name: ns,
                    ..Default::default()
                },
                t,
            ))
            .await,
        ),
        "GetNamespace" => code(
            a.get_namespace(with(pb::GetNamespaceRequest { name: ns }, t))
                .await,
        ),
        "ListNamespaces" => code(
            a.list_namespaces(with(pb::ListNamespacesRequest {}, t))
                .await,
        ),
        "DeleteNamespace" => code(
            a.delete_namespace(with(
                pb::DeleteNamespaceRequest {
                    name: format!("gone-{ns}"),
                },
                t,
            ))
            .await,
        ),
        "CreateApiKey" => code(
            a.create_api_key(with(
                pb::CreateApiKeyRequest {
                    name: "table".into(),
                    namespace: ns,
                    role: Role::Viewer.to_proto(),
                    ..Default::default()
                },
                t,
            ))
            .await,
        ),
        "ListApiKeys" => code(
            a.list_api_keys(with(pb::ListApiKeysRequest { namespace: ns }, t))
                .await,
        ),
        "RevokeApiKey" => code(
            a.revoke_api_key(with(pb::RevokeApiKeyRequest { key_id: nokey }, t))
                .await,
        ),
        "SetRoleBinding" => code(
            a.set_role_binding(with(
                pb::SetRoleBindingRequest {
                    namespace: ns,
                    key_id: nokey,
                    role: Role::Viewer.to_proto(),
                },
                t,
            ))
            .await,
        ),
        "DeleteRoleBinding" => code(
            a.delete_role_binding(with(
                pb::DeleteRoleBindingRequest {
                    namespace: ns,
                    key_id: nokey,
                },
                t,
            ))
            .await,
        ),
        "ListRoleBindings" => code(
            a.list_role_bindings(with(pb::ListRoleBindingsRequest { namespace: ns }, t))
                .await,
        ),
        "WhoAmI" => code(a.who_am_i(with(pb::WhoAmIRequest {}, t)).await),
        "ListAuditEvents" => code(
            a.list_audit_events(with(
                pb::ListAuditEventsRequest {
                    namespace: ns,
                    ..Default::default()
                },
                t,
            ))
            .await,
        ),
        "CreateEnvironment" => code(
            e.create_environment(with(
                pb::CreateEnvironmentRequest {
                    environment: Some(pb::Environment {
                        namespace: ns,
                        name: uniq,
                        image: "compute.local/sandbox-python:latest".into(),
                        ..Default::default()
                    }),
                },
                t,
            ))
            .await,
        ),
        "GetEnvironment" => code(
            e.get_environment(with(
                pb::GetEnvironmentRequest {
                    namespace: ns,
                    name: "py".into(),
                },
                t,
            ))
            .await,
        ),
        "ListEnvironments" => code(
            e.list_environments(with(pb::ListEnvironmentsRequest { namespace: ns }, t))
                .await,
        ),
        "DeleteEnvironment" => code(
            e.delete_environment(with(
                pb::DeleteEnvironmentRequest {
                    namespace: ns,
                    name: "nope".into(),
                },
                t,
            ))
            .await,
        ),
        "CreateWorkspace" => code(
            w.create_workspace(with(
                pb::CreateWorkspaceRequest {
                    namespace: ns,
                    // Past the gate, refused: the table makes no workspace.
                    size: "lots".into(),
                    ..Default::default()
                },
                t,
            ))
            .await,
        ),
        "GetWorkspace" => code(
            w.get_workspace(with(pb::GetWorkspaceRequest { workspace_id: id }, t))
                .await,
        ),
        "ListWorkspaces" => code(
            w.list_workspaces(with(pb::ListWorkspacesRequest { namespace: ns }, t))
                .await,
        ),
        "DeleteWorkspace" => code(
            w.delete_workspace(with(pb::DeleteWorkspaceRequest { workspace_id: id }, t))
                .await,
        ),
        "SnapshotWorkspace" => code(
            w.snapshot_workspace(with(
                pb::SnapshotWorkspaceRequest {
                    workspace_id: id,
                    ..Default::default()
                },
                t,
            ))
            .await,
        ),
        "ListWorkspaceSnapshots" => code(
            w.list_workspace_snapshots(with(
                pb::ListWorkspaceSnapshotsRequest {
                    namespace: ns,
                    ..Default::default()
                },
                t,
            ))
            .await,
        ),
        "DeleteWorkspaceSnapshot" => code(
            w.delete_workspace_snapshot(with(
                pb::DeleteWorkspaceSnapshotRequest { snapshot_id: id },
                t,
            ))
            .await,
        ),
        other => panic!("the table does not know {other}: add it"),
    }
}

/// Creates a key through `a` (root on the socket); returns (key id, token).
async fn key(
    a: &mut AccessServiceClient<Channel>,
    name: &str,
    ns: &str,
    role: Option<Role>,
    admin: bool,
    expires_in: Option<Duration>,
) -> (String, String) {
    let expires_at = expires_in.map(|d| {
        let t = std::time::SystemTime::now() + d;
        let s = t.duration_since(std::time::UNIX_EPOCH).unwrap();
        prost_types::Timestamp {
            seconds: s.as_secs() as i64,
            nanos: s.subsec_nanos() as i32,
        }
    });
    let r = a
        .create_api_key(pb::CreateApiKeyRequest {
            name: name.into(),
            platform_admin: admin,
            expires_at,
            namespace: ns.into(),
            role: role.map(Role::to_proto).unwrap_or(0),
        })
        .await
        .unwrap()
        .into_inner();
    (r.key.unwrap().key_id, r.secret)
}

/// Sandbox-, workspace- or snapshot-id-addressed RPCs: they authenticate, then look the
/// (unknown) id up: NOT_FOUND.
const ID_ADDRESSED: &[&str] = &[
    "DeleteSandbox",
    "GetSandbox",
    "WatchSandbox",
    "ExecInSandbox",
    "SuspendSandbox",
    "ResumeSandbox",
    "KeepSandboxAlive",
    "TailSandboxLogs",
    "GrantEgress",
    "RevokeEgress",
    "ExposeSandboxPort",
    "UnexposeSandboxPort",
    "SyncSandboxWorkspace",
    "GetWorkspace",
    "DeleteWorkspace",
    "SnapshotWorkspace",
    "DeleteWorkspaceSnapshot",
];

/// The whole table over `tcp`, bootstrapped over `root` (root on a unix socket of the
/// server): every RPC x 8 credentials x own/other namespace, the namespace admin's own rules and
/// the audit log. Returns every secret made, the audit log as text and the operator's key.
async fn table(root: Channel, tcp: Channel) -> Table {
    let mut a = AccessServiceClient::new(root.clone());
    // Root on the socket bootstraps: it is the platform admin.
    let me = a.who_am_i(pb::WhoAmIRequest {}).await.unwrap().into_inner();
    assert_eq!(
        (me.principal.as_str(), me.platform_admin),
        ("local-root", true)
    );
    for ns in ["team-a", "team-b"] {
        a.create_namespace(pb::CreateNamespaceRequest {
            name: ns.into(),
            ..Default::default()
        })
        .await
        .unwrap();
    }
    let mut e = EnvironmentServiceClient::new(root.clone());
    e.create_environment(pb::CreateEnvironmentRequest {
        environment: Some(pb::Environment {
            namespace: "team-a".into(),
            name: "py".into(),
            image: "compute.local/sandbox-python:latest".into(),
            ..Default::default()
        }),
    })
    .await
    .unwrap();
    let (_, viewer) = key(&mut a, "viewer", "team-a", Some(Role::Viewer), false, None).await;
    let (_, operator) = key(&mut a, "op", "team-a", Some(Role::Operator), false, None).await;
    let (_, ns_admin) = key(&mut a, "adm", "team-a", Some(Role::Admin), false, None).await;
    let (_, padmin) = key(&mut a, "platform", "", None, true, None).await;
    let (rid, revoked) = key(&mut a, "gone", "team-a", Some(Role::Admin), false, None).await;
    a.revoke_api_key(pb::RevokeApiKeyRequest { key_id: rid })
        .await
        .unwrap();
    let expiring = key(
        &mut a,
        "short",
        "team-a",
        Some(Role::Admin),
        false,
        Some(Duration::from_secs(2)),
    )
    .await
    .1;
    let secrets = [
        viewer.clone(),
        operator.clone(),
        ns_admin.clone(),
        padmin.clone(),
        revoked.clone(),
        expiring.clone(),
    ];
    // A past expiry is refused at creation; the short one is over before the table runs.
    let past = a
        .create_api_key(pb::CreateApiKeyRequest {
            name: "past".into(),
            expires_at: Some(prost_types::Timestamp {
                seconds: 1,
                nanos: 0,
            }),
            ..Default::default()
        })
        .await;
    assert_eq!(past.unwrap_err().code(), Code::InvalidArgument);
    tokio::time::sleep(Duration::from_millis(2500)).await;

    let keys: [(&str, Option<&str>, Option<Role>, bool); 8] = [
        ("no key", None, None, false),
        ("malformed", Some("cpk_nonsense"), None, false),
        ("revoked", Some(&revoked), None, false),
        ("expired", Some(&expiring), None, false),
        ("viewer", Some(&viewer), Some(Role::Viewer), false),
        ("operator", Some(&operator), Some(Role::Operator), false),
        ("namespace admin", Some(&ns_admin), Some(Role::Admin), false),
        ("platform admin", Some(&padmin), None, true),
    ];
    let mut cells = 0;
    for (method, need) in access::METHODS {
        let name = method.rsplit('/').next().unwrap();
        for (who, token, role, platform) in &keys {
            for ns in ["team-a", "team-b"] {
                let got = call(&tcp, method, *token, ns).await;
                cells += 1;
                let at = format!("{name} by {who} in {ns}: {got:?}");
                let valid = role.is_some() || *platform;
                if !valid {
                    assert_eq!(got, Code::Unauthenticated, "{at}");
                    continue;
                }
                assert_ne!(got, Code::Unauthenticated, "{at}");
                // What the gate says for this role here (a role only in team-a).
                let role_here = if *platform {
                    Some(Role::Admin)
                } else if ns == "team-a" {
                    *role
                } else {
                    None
                };
                if ID_ADDRESSED.contains(&name) {
                    assert_eq!(got, Code::NotFound, "{at}");
                    continue;
                }
                match need {
                    Need::PlatformAdmin if *platform => {
                        assert_ne!(got, Code::PermissionDenied, "{at}")
                    }
                    Need::PlatformAdmin => assert_eq!(got, Code::PermissionDenied, "{at}"),
                    Need::Role(r) => match role_here {
                        None => assert_eq!(got, Code::NotFound, "{at}"),
                        Some(h) if h < *r => assert_eq!(got, Code::PermissionDenied, "{at}"),
                        Some(_) => {
                            assert!(
                                !matches!(got, Code::PermissionDenied | Code::NotFound)
                                    || (got == Code::NotFound
                                        && matches!(
                                            name,
                                            "SetRoleBinding"
                                                | "DeleteRoleBinding"
                                                | "DeleteEnvironment"
                                                | "GetEnvironment"
                                        )),
                                "{at}"
                            );
                            if name.contains("Sandbox") || name.contains("Workspace") {
                                let want = match name {
                                    "CreateSandbox" | "CreateWorkspace" => Code::InvalidArgument,
                                    "ListSandboxes"
                                    | "ListWorkspaces"
                                    | "ListWorkspaceSnapshots" => Code::Ok,
                                    other => panic!("no expectation for {other}"),
                                };
                                assert_eq!(got, want, "{at}");
                            }
                        }
                    },
                    Need::AnyKey => {
                        // The call's own rule: listing keys, minting keys and revoking need
                        // the namespace's admin role (or a platform admin).
                        let admin_here = role_here == Some(Role::Admin);
                        let want = match name {
                            "WhoAmI" | "ListNamespaces" => Code::Ok,
                            "CreateApiKey" | "ListApiKeys" if admin_here => Code::Ok,
                            "CreateApiKey" | "ListApiKeys" if role_here.is_none() => Code::NotFound,
                            "CreateApiKey" | "ListApiKeys" => Code::PermissionDenied,
                            // The key revoked is unknown: NOT_FOUND for everyone.
                            "RevokeApiKey" => Code::NotFound,
                            other => panic!("no expectation for {other}"),
                        };
                        assert_eq!(got, want, "{at}");
                    }
                }
            }
        }
    }
    assert!(cells >= 35 * 8 * 2, "{cells} cells");

    // The namespace ADMIN's own rules: keys bound to its namespace only.
    let mut a_admin = AccessServiceClient::new(tcp.clone());
    let r = a_admin
        .create_api_key(with(
            pb::CreateApiKeyRequest {
                name: "made by admin".into(),
                platform_admin: true,
                ..Default::default()
            },
            Some(&ns_admin),
        ))
        .await;
    assert_eq!(r.unwrap_err().code(), Code::PermissionDenied);
    let made = a_admin
        .create_api_key(with(
            pb::CreateApiKeyRequest {
                name: "made by admin".into(),
                namespace: "team-a".into(),
                role: Role::Operator.to_proto(),
                ..Default::default()
            },
            Some(&ns_admin),
        ))
        .await
        .unwrap()
        .into_inner();
    let made_key = made.secret.clone();
    let who = a_admin
        .who_am_i(with(pb::WhoAmIRequest {}, Some(&made_key)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(who.bindings.len(), 1);
    assert_eq!(who.bindings[0].role, Role::Operator.to_proto());
    // The namespace admin may revoke it (every binding of the key is in its namespace).
    a_admin
        .revoke_api_key(with(
            pb::RevokeApiKeyRequest {
                key_id: made.key.unwrap().key_id,
            },
            Some(&ns_admin),
        ))
        .await
        .unwrap();
    assert_eq!(
        a_admin
            .who_am_i(with(pb::WhoAmIRequest {}, Some(&made_key)))
            .await
            .unwrap_err()
            .code(),
        Code::Unauthenticated
    );

    // The audit log: writes and denials, by key id, never a secret.
    let audit = a
        .list_audit_events(pb::ListAuditEventsRequest {
            limit: 1000,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let text = format!("{audit:?}");
    assert!(audit.events.len() >= 100, "{} events", audit.events.len());
    assert!(audit
        .events
        .iter()
        .any(|e| e.outcome == pb::AuditOutcome::Denied as i32 && e.code == "Unauthenticated"));
    assert!(audit
        .events
        .iter()
        .any(|e| e.outcome == pb::AuditOutcome::Ok as i32
            && e.method.ends_with("CreateEnvironment")
            && e.principal == "local-root"));
    let mut secrets = secrets.to_vec();
    secrets.push(made_key);
    Table {
        secrets,
        audit: text,
        operator,
    }
}

/// What [`table`] made.
struct Table {
    secrets: Vec<String>,
    audit: String,
    operator: String,
}

#[tokio::test(flavor = "multi_thread")]
async fn every_rpc_by_every_credential_in_own_and_other_namespaces() {
    need!();
    let (mut d, _c) = start_client("platform", "").await;
    let t = table(d.local_channel().await, channel(&d.addr).await).await;
    // Records survive kill -9: the operator key still works, with its role.
    d.kill9();
    d.spawn();
    let tcp = channel(&d.addr).await;
    let who = AccessServiceClient::new(tcp)
        .who_am_i(with(pb::WhoAmIRequest {}, Some(&t.operator)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(who.bindings[0].namespace, "team-a");
    let log = d.log_text();
    for s in &t.secrets {
        let secret_part = &s[s.len() - 64..];
        assert!(!log.contains(secret_part), "a key is in the daemon's log");
        assert!(!t.audit.contains(secret_part), "a key is in the audit log");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_router_in_front_of_two_nodes_serves_the_same_table() {
    need!();
    let dir = tempfile::tempdir().unwrap();
    let peer = peer_secret(dir.path());
    let node_cfg = format!("platform_peer_secret = {peer:?}");
    let nodes = [
        start("platform-ra", &node_cfg),
        start("platform-rb", &node_cfg),
    ];
    let list = format!("{},{}", nodes[0].addr, nodes[1].addr);
    let mut r = RouterProc::start_with(
        &list,
        dir.path(),
        "platform",
        &["--platform-peer-secret", peer.to_str().unwrap()],
    );
    r.wait_nodes().await;
    let root = unix_channel(&r.socket()).await;
    let t = table(root, channel(&r.addr).await).await;

    // Durable workspaces through the router: made on a placed node, found there by id; a
    // sandbox mounting one is placed on the node that holds it; snapshots too.
    let mut w = WorkspaceServiceClient::new(channel(&r.addr).await);
    let mut s = SandboxServiceClient::new(channel(&r.addr).await);
    let op = Some(t.operator.as_str());
    let ws = w
        .create_workspace(with(
            pb::CreateWorkspaceRequest {
                namespace: "team-a".into(),
                size: "32Mi".into(),
                ..Default::default()
            },
            op,
        ))
        .await
        .unwrap()
        .into_inner();
    let wid = ws.workspace_id.clone();
    let holder: Vec<usize> = (0..2)
        .filter(|i| {
            nodes[*i]
                .state_dir()
                .join("store/workspaces")
                .join(&wid)
                .exists()
        })
        .collect();
    assert_eq!(holder.len(), 1, "{holder:?}");
    for _ in 0..2 {
        let mut req = exec_only("team-a", "py");
        req.workspace_id = wid.clone();
        let sb = s.create_sandbox(with(req, op)).await.unwrap().into_inner();
        let on = nodes[holder[0]]
            .state_dir()
            .join("workspaces")
            .join(&sb.sandbox_id);
        assert!(on.exists(), "the sandbox is not on the workspace's node");
        let got = w
            .get_workspace(with(
                pb::GetWorkspaceRequest {
                    workspace_id: wid.clone(),
                },
                op,
            ))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(got.attached_to, sb.sandbox_id);
        s.delete_sandbox(with(
            pb::DeleteSandboxRequest {
                sandbox_id: sb.sandbox_id,
            },
            op,
        ))
        .await
        .unwrap();
    }
    let snap = w
        .snapshot_workspace(with(
            pb::SnapshotWorkspaceRequest {
                workspace_id: wid.clone(),
                ..Default::default()
            },
            op,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(snap.consistency, "detached");
    let restored = w
        .create_workspace(with(
            pb::CreateWorkspaceRequest {
                namespace: "team-a".into(),
                snapshot_id: snap.snapshot_id.clone(),
                ..Default::default()
            },
            op,
        ))
        .await
        .unwrap()
        .into_inner();
    assert!(nodes[holder[0]]
        .state_dir()
        .join("store/workspaces")
        .join(&restored.workspace_id)
        .exists());
    let listed = w
        .list_workspaces(with(
            pb::ListWorkspacesRequest {
                namespace: "team-a".into(),
            },
            op,
        ))
        .await
        .unwrap()
        .into_inner()
        .workspaces;
    assert_eq!(listed.len(), 2);
    w.delete_workspace_snapshot(with(
        pb::DeleteWorkspaceSnapshotRequest {
            snapshot_id: snap.snapshot_id,
        },
        op,
    ))
    .await
    .unwrap();
    for x in [wid, restored.workspace_id] {
        w.delete_workspace(with(pb::DeleteWorkspaceRequest { workspace_id: x }, op))
            .await
            .unwrap();
    }

    // Health and reflection name the platform's services on the router.
    let mut h = tonic_health::pb::health_client::HealthClient::new(channel(&r.addr).await);
    for svc in computed::platform::service::SERVICES {
        let st = h
            .check(tonic_health::pb::HealthCheckRequest {
                service: svc.into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(st.status, 1, "{svc} is not SERVING on the router");
    }
    // grpcurl works against it: reflection lists the platform, a key authenticates.
    if which("grpcurl").is_some() || skip("grpcurl is not on PATH (scripts/install-deps)") {
        let g = |args: &[&str]| {
            let o = std::process::Command::new("grpcurl")
                .arg("-plaintext")
                .args(args)
                .output()
                .unwrap();
            assert!(o.status.success(), "grpcurl {args:?}: {o:?}");
            String::from_utf8(o.stdout).unwrap()
        };
        let list = g(&[&r.addr, "list"]);
        for svc in computed::platform::service::SERVICES {
            assert!(list.contains(svc), "{list}");
        }
        let header = format!("authorization: Bearer {}", t.operator);
        let who = g(&["-H", &header, &r.addr, "platform.v1.AccessService/WhoAmI"]);
        assert!(
            who.contains("ROLE_OPERATOR") && who.contains("team-a"),
            "{who}"
        );
    }
    // compute.v1 still goes to the nodes, with no key.
    let mut c = r.client().await;
    let id = create(&mut c, create_req("t", "platform-router"))
        .await
        .sandbox_id;
    let o = exec(&mut c, exec_req(&id, "echo", &["via router"]))
        .await
        .unwrap();
    assert_eq!(o.out(), "via router\n");
    destroy(&mut c, &id).await;

    // The router's records outlive it: after a restart the operator key works, with its role.
    r.kill();
    r.spawn();
    let who = AccessServiceClient::new(channel(&r.addr).await)
        .who_am_i(with(pb::WhoAmIRequest {}, Some(&t.operator)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(who.bindings[0].namespace, "team-a");
    assert_eq!(who.bindings[0].role, Role::Operator.to_proto());
    // No secret in the router's log, the nodes' logs or the audit log.
    let logs = [r.log_text(), nodes[0].log_text(), nodes[1].log_text()];
    for s in &t.secrets {
        let secret_part = &s[s.len() - 64..];
        for l in &logs {
            assert!(!l.contains(secret_part), "a key is in a log");
        }
        assert!(!t.audit.contains(secret_part), "a key is in the audit log");
    }
}

/// Writes a router-node peer secret into `dir`; returns its path.
fn peer_secret(dir: &std::path::Path) -> std::path::PathBuf {
    let p = dir.join("peer-secret");
    std::fs::write(&p, format!("{}\n", uuid::Uuid::new_v4().simple())).unwrap();
    p
}

/// Runs computectl with `args`, returning stdout; fails with stderr unless it succeeds.
fn ctl_ok(cmd: &mut std::process::Command, what: &str) -> String {
    let o = cmd.output().unwrap();
    assert!(
        o.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn computectl_manages_namespaces_keys_bindings_environments_and_reads_the_audit() {
    need!();
    let (d, _c) = start_client("platform-ctl", "").await;
    let root = |args: &[&str]| {
        let mut c = d.computectl_command();
        c.args(args).env_remove("COMPUTE_API_KEY");
        ctl_ok(&mut c, &args.join(" "))
    };
    // Over TCP with a key (flag or environment).
    let remote = |key: &str, args: &[&str]| {
        let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_computectl"));
        c.args(["--addr", &d.addr])
            .args(args)
            .env("COMPUTE_API_KEY", key);
        c.output().unwrap()
    };
    assert!(root(&["whoami"]).starts_with("local-root (platform admin)"));
    let out = root(&["ns", "create", "team-a", "--label", "tier=gold"]);
    assert!(out.contains("team-a") && out.contains("tier=gold"), "{out}");
    // A key's secret alone on stdout, once; the listing never shows it.
    let admin = root(&["key", "create", "adm", "-n", "team-a", "--role", "admin"]);
    let admin = admin.trim().to_string();
    assert!(admin.starts_with("cpk_"), "{admin}");
    let viewer: serde_json::Value = serde_json::from_str(&root(&[
        "key",
        "create",
        "view",
        "-n",
        "team-a",
        "--role",
        "viewer",
        "--expires-in",
        "1d",
        "-o",
        "json",
    ]))
    .unwrap();
    let viewer_id = viewer["key_id"].as_str().unwrap().to_string();
    let viewer_secret = viewer["secret"].as_str().unwrap().to_string();
    assert!(viewer["expires_at"].is_string(), "{viewer}");
    let keys: serde_json::Value =
        serde_json::from_str(&root(&["key", "ls", "-o", "json"])).unwrap();
    let listed = keys.to_string();
    assert_eq!(keys.as_array().unwrap().len(), 2, "{listed}");
    assert!(!listed.contains(&admin[admin.len() - 64..]) && !listed.contains("secret"));

    // The namespace admin makes an environment over TCP; the viewer reads it but may not.
    let o = remote(
        &admin,
        &[
            "env",
            "create",
            "team-a",
            "py",
            "--image",
            IMAGE,
            "--memory",
            "512Mi",
            "-e",
            "MODE=test",
            "--workspace",
            "/work:1Gi",
            "--egress",
            "pypi.org:443",
            "--idle-suspend-sec",
            "600",
            "--",
            "python3",
            "-i",
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = remote(
        &viewer_secret,
        &["env", "get", "team-a", "py", "-o", "json"],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let env: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(env["resources"]["memory_bytes"], 512u64 << 20);
    assert_eq!(env["default_argv"], serde_json::json!(["python3", "-i"]));
    assert_eq!(env["env"]["MODE"], "test");
    assert_eq!(env["egress"][0]["host"], "pypi.org");
    assert_eq!(env["workspaces"][0]["size"], "1Gi");
    assert_eq!(env["idle_suspend_sec"], 600);
    let o = remote(
        &viewer_secret,
        &["env", "create", "team-a", "x", "--image", IMAGE],
    );
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("PermissionDenied"), "{err}");
    // A platform-injected variable is refused as InvalidArgument, named.
    let o = remote(
        &admin,
        &[
            "env",
            "create",
            "team-a",
            "bad",
            "--image",
            IMAGE,
            "-e",
            "SANDBOX_ID=x",
        ],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("InvalidArgument"),
        "{err}"
    );
    // No key over TCP: UNAUTHENTICATED, and the secret is never echoed in an error.
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_computectl"))
        .args(["--addr", &d.addr, "ns", "ls"])
        .env_remove("COMPUTE_API_KEY")
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&o.stderr).contains("Unauthenticated"));
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_computectl"))
        .args([
            "--addr",
            &d.addr,
            "--api-key",
            &format!("{viewer_secret}x"),
            "whoami",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("Unauthenticated"), "{err}");
    assert!(
        !err.contains(&viewer_secret[viewer_secret.len() - 64..]),
        "{err}"
    );

    // Bindings: the viewer is upgraded to operator, then unbound.
    let out = root(&["binding", "set", "team-a", &viewer_id, "operator"]);
    assert!(out.contains("operator"), "{out}");
    let o = remote(&viewer_secret, &["whoami", "-o", "json"]);
    let who: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(who["bindings"][0]["role"], "operator", "{who}");
    let out = root(&["binding", "ls", "team-a"]);
    assert_eq!(out.lines().count(), 3, "header + 2 bindings:\n{out}");
    root(&["binding", "delete", "team-a", &viewer_id]);
    let o = remote(&viewer_secret, &["env", "ls", "team-a"]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("NotFound"));
    // Revoked: refused at once.
    let out = root(&["key", "revoke", &viewer_id]);
    assert!(out.contains("revoked"), "{out}");
    let o = remote(&viewer_secret, &["whoami"]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("Unauthenticated"));

    // The audit log: JSON lines, the namespace admin reads its namespace's only.
    let lines = root(&["audit", "-o", "json", "--limit", "1000"]);
    let evs: Vec<serde_json::Value> = lines
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let has = |method: &str, outcome: &str| {
        evs.iter()
            .any(|e| e["method"].as_str().unwrap().ends_with(method) && e["outcome"] == outcome)
    };
    assert!(has("CreateNamespace", "ok") && has("CreateEnvironment", "ok"));
    assert!(has("CreateEnvironment", "denied") && has("RevokeApiKey", "ok"));
    assert!(
        evs.iter().any(|e| e["code"] == "InvalidArgument"),
        "{lines}"
    );
    let o = remote(&admin, &["audit", "-n", "team-a", "-o", "json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let mine = String::from_utf8(o.stdout).unwrap();
    assert!(mine.lines().count() >= 5, "{mine}");
    assert!(mine
        .lines()
        .all(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["namespace"] == "team-a"));
    let o = remote(&admin, &["audit"]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("PermissionDenied"));
    let table = root(&["audit", "--since", "1h"]);
    assert!(
        table.starts_with("TIME") && table.contains("CreateNamespace"),
        "{table}"
    );
    for text in [lines, mine, table, d.log_text()] {
        for s in [&admin, &viewer_secret] {
            assert!(
                !text.contains(&s[s.len() - 64..]),
                "a key is in the output or log"
            );
        }
    }
    // Deleting: the environment, then the namespace.
    root(&["env", "delete", "team-a", "py"]);
    root(&["ns", "delete", "team-a"]);
    assert_eq!(
        root(&["ns", "ls"]).lines().count(),
        1,
        "only the header is left"
    );
}

// ---------------------------------------------------------------------------------------------
// Platform sandboxes (issue 17): workloads, states, Get/List/Delete, Watch and TailLogs.

type Sbx = SandboxServiceClient<Channel>;

/// Makes namespaces `team-a` and `team-b` through `root` (root on the socket), environments in
/// them, and keys: (operator of team-a, viewer of team-a, operator of team-b).
async fn sandbox_setup(root: &Channel) -> (String, String, String) {
    let mut a = AccessServiceClient::new(root.clone());
    for ns in ["team-a", "team-b"] {
        a.create_namespace(pb::CreateNamespaceRequest {
            name: ns.into(),
            ..Default::default()
        })
        .await
        .unwrap();
    }
    let mut e = EnvironmentServiceClient::new(root.clone());
    let env = |ns: &str, name: &str, argv: &[&str], lifetime: u32| pb::CreateEnvironmentRequest {
        environment: Some(pb::Environment {
            namespace: ns.into(),
            name: name.into(),
            image: "compute.local/sandbox-python:latest".into(),
            default_argv: argv.iter().map(|s| s.to_string()).collect(),
            env: [("FROM_ENV".to_string(), "env".to_string())].into(),
            max_lifetime_sec: lifetime,
            labels: [("tier".to_string(), "test".to_string())].into(),
            ..Default::default()
        }),
    };
    for r in [
        env(
            "team-a",
            "py",
            &["python3", "-c", "print('default argv')"],
            0,
        ),
        env("team-a", "image-cmd", &[], 0),
        env("team-a", "short", &["sleep", "600"], 3),
        env("team-b", "other", &[], 0),
    ] {
        e.create_environment(r).await.unwrap();
    }
    let (_, op) = key(&mut a, "op", "team-a", Some(Role::Operator), false, None).await;
    let (_, viewer) = key(&mut a, "v", "team-a", Some(Role::Viewer), false, None).await;
    let (_, op_b) = key(&mut a, "op-b", "team-b", Some(Role::Operator), false, None).await;
    (op, viewer, op_b)
}

fn create_in(ns: &str, env: &str, argv: &[&str]) -> pb::CreateSandboxRequest {
    pb::CreateSandboxRequest {
        namespace: ns.into(),
        environment: env.into(),
        argv: argv.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

/// Every event of a watch, until it ends (at most `within`).
async fn watch_all(s: &mut Sbx, id: &str, token: &str, within: Duration) -> Vec<pb::Sandbox> {
    let mut st = s
        .watch_sandbox(with(
            pb::WatchSandboxRequest {
                sandbox_id: id.into(),
            },
            Some(token),
        ))
        .await
        .unwrap()
        .into_inner();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(within, async {
        while let Some(ev) = st.message().await.unwrap() {
            out.push(ev.sandbox.unwrap());
        }
    })
    .await;
    out
}

/// The run log after `from` (no follow).
async fn tail(s: &mut Sbx, id: &str, token: &str, from: u64) -> Vec<pb::LogEntry> {
    let mut st = s
        .tail_sandbox_logs(with(
            pb::TailSandboxLogsRequest {
                sandbox_id: id.into(),
                from_offset: from,
                ..Default::default()
            },
            Some(token),
        ))
        .await
        .unwrap()
        .into_inner();
    let mut out = Vec::new();
    while let Some(e) = st.message().await.unwrap() {
        out.push(e);
    }
    out
}

fn markers(log: &[pb::LogEntry]) -> Vec<pb::LogMarker> {
    log.iter()
        .filter(|e| e.stream == pb::LogStream::Marker as i32)
        .map(|e| pb::LogMarker::try_from(e.marker).unwrap())
        .collect()
}

fn text(log: &[pb::LogEntry], stream: pb::LogStream) -> String {
    log.iter()
        .filter(|e| e.stream == stream as i32)
        .map(|e| String::from_utf8_lossy(&e.data).to_string())
        .collect()
}

async fn wait_state(
    s: &mut Sbx,
    id: &str,
    token: &str,
    want: pb::SandboxState,
    reason: &str,
) -> pb::Sandbox {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let sb = s
            .get_sandbox(with(
                pb::GetSandboxRequest {
                    sandbox_id: id.into(),
                },
                Some(token),
            ))
            .await
            .unwrap()
            .into_inner();
        if sb.state == want as i32 && sb.state_reason.contains(reason) {
            return sb;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{id} never {want:?} {reason:?}: {sb:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn platform_sandboxes_run_their_workloads_and_tell_their_lives() {
    need!();
    let (d, mut v1) = start_client("platform-sbx", "").await;
    let root = d.local_channel().await;
    let (op, viewer, op_b) = sandbox_setup(&root).await;
    let mut s = SandboxServiceClient::new(channel(&d.addr).await);

    // Each rejection of the spec's Create heading, with its code.
    let mut mounts9 = create_in("team-a", "py", &[]);
    for i in 0..9 {
        mounts9.workspaces.push(pb::WorkspaceMount {
            mount_path: format!("/w{i}"),
            ..Default::default()
        });
    }
    let mut both = create_in("team-a", "py", &[]);
    both.workspace_id = "ws-1".into();
    both.workspaces.push(pb::WorkspaceMount {
        mount_path: "/data".into(),
        ..Default::default()
    });
    let mut reserved = create_in("team-a", "py", &[]);
    reserved.env.insert("SANDBOX_ID".into(), "x".into());
    let mut relative = create_in("team-a", "py", &[]);
    relative.working_dir = "work".into();
    let mut unclean = create_in("team-a", "py", &[]);
    unclean.working_dir = "/a/../etc".into();
    let mut durable = create_in("team-a", "py", &[]);
    durable.workspace_id = "ws-nope".into();
    let mounts_at = |paths: &[&str]| {
        let mut r = create_in("team-a", "py", &[]);
        for p in paths {
            r.workspaces.push(pb::WorkspaceMount {
                mount_path: p.to_string(),
                ..Default::default()
            });
        }
        r
    };
    let rejections: Vec<(&str, pb::CreateSandboxRequest, &str, Code)> = vec![
        (
            "env in another namespace",
            create_in("team-a", "team-b/other", &[]),
            &op,
            Code::PermissionDenied,
        ),
        ("reserved env name", reserved, &op, Code::InvalidArgument),
        (
            "workspace_id with workspaces",
            both,
            &op,
            Code::InvalidArgument,
        ),
        ("more than 8 mounts", mounts9, &op, Code::InvalidArgument),
        (
            "overlapping mounts",
            mounts_at(&["/data", "/workspace", "/data/inner"]),
            &op,
            Code::InvalidArgument,
        ),
        (
            "a mount over the sandbox's /proc",
            mounts_at(&["/workspace", "/proc"]),
            &op,
            Code::InvalidArgument,
        ),
        (
            "an unclean mount path",
            mounts_at(&["/workspace", "/data/"]),
            &op,
            Code::InvalidArgument,
        ),
        ("relative working_dir", relative, &op, Code::InvalidArgument),
        ("unclean working_dir", unclean, &op, Code::InvalidArgument),
        ("unknown durable workspace", durable, &op, Code::NotFound),
        (
            "unknown environment",
            create_in("team-a", "nope", &[]),
            &op,
            Code::NotFound,
        ),
        (
            "a viewer",
            create_in("team-a", "py", &[]),
            &viewer,
            Code::PermissionDenied,
        ),
        (
            "another namespace's key",
            create_in("team-a", "py", &[]),
            &op_b,
            Code::NotFound,
        ),
    ];
    for (what, req, token, want) in rejections {
        let got = code(s.create_sandbox(with(req, Some(token))).await);
        assert_eq!(got, want, "{what}");
    }

    // A workload from the request's argv: its output, its exit and every change, watched.
    let script = "import sys, os; print('out', os.environ['FROM_ENV'], os.environ['MINE']); \
                  print('err', file=sys.stderr); sys.exit(3)";
    let mut req = create_in("team-a", "py", &["python3", "-c", script]);
    req.env.insert("MINE".into(), "mine".into());
    req.labels.insert("owner".into(), "test".into());
    let sb = s
        .create_sandbox(with(req, Some(&op)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(sb.namespace, "team-a");
    assert_eq!(sb.origin, pb::SandboxOrigin::Platform as i32);
    assert_eq!(sb.argv[0], "python3");
    assert_eq!(sb.labels["owner"], "test");
    let id = sb.sandbox_id.clone();
    // This node has no [egress]: its sandboxes have no network, grants are not served.
    assert_eq!(sb.egress_base, None, "no network, no policy in force");
    let g = s
        .grant_egress(with(
            pb::GrantEgressRequest {
                sandbox_id: id.clone(),
                policy: Some(pb::EgressPolicy::default()),
                ..Default::default()
            },
            Some(&op),
        ))
        .await
        .unwrap_err();
    assert_eq!(g.code(), Code::Unimplemented, "{g:?}");
    // Nor preview URLs (no [preview]).
    let e = s
        .expose_sandbox_port(with(
            pb::ExposeSandboxPortRequest {
                sandbox_id: id.clone(),
                port: 8000,
                ..Default::default()
            },
            Some(&op),
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unimplemented, "{e:?}");
    let events = watch_all(&mut s, &id, &viewer, Duration::from_secs(20)).await;
    let states: Vec<(i32, String)> = events
        .iter()
        .map(|e| (e.state, e.state_reason.clone()))
        .collect();
    assert!(
        states.windows(2).all(|w| w[0] != w[1]),
        "a watch repeats itself: {states:?}"
    );
    let last = events.last().unwrap();
    assert_eq!(last.state, pb::SandboxState::Running as i32, "{states:?}");
    assert_eq!(
        last.state_reason, "workload exited with code 3",
        "{states:?}"
    );
    let log = tail(&mut s, &id, &viewer, 0).await;
    assert_eq!(
        markers(&log),
        [
            pb::LogMarker::Created,
            pb::LogMarker::Started,
            pb::LogMarker::Exited
        ],
        "{log:?}"
    );
    assert_eq!(text(&log, pb::LogStream::Stdout), "out env mine\n");
    assert_eq!(text(&log, pb::LogStream::Stderr), "err\n");
    assert_eq!(log.last().unwrap().exit_code, 3);
    let offsets: Vec<u64> = log.iter().map(|e| e.offset).collect();
    assert_eq!(offsets, (1..=log.len() as u64).collect::<Vec<_>>());
    // From an offset: only what follows it; limit caps one read.
    let after = tail(&mut s, &id, &viewer, 2).await;
    assert_eq!(after[0].offset, 3);
    let mut one = s
        .tail_sandbox_logs(with(
            pb::TailSandboxLogsRequest {
                sandbox_id: id.clone(),
                limit: 1,
                ..Default::default()
            },
            Some(&viewer),
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(one.message().await.unwrap().unwrap().offset, 1);
    assert!(one.message().await.unwrap().is_none());
    // computectl logs, as root on the socket: stdout and stderr as written, markers on stderr.
    let o = d.computectl(&["logs", &id]);
    assert!(o.status.success(), "{o:?}");
    assert_eq!(String::from_utf8_lossy(&o.stdout), "out env mine\n");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("err\n") && err.contains(" exited with code 3"),
        "{err}"
    );
    assert!(
        err.contains(" created") && err.contains(" started: python3 -c"),
        "{err}"
    );
    let o = d.computectl(&["-o", "json", "logs", &id, "--from", "2"]);
    let first: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&o.stdout).lines().next().unwrap()).unwrap();
    assert_eq!(first["offset"], 3);
    // A sandbox_id is required.
    let r = s
        .tail_sandbox_logs(with(pb::TailSandboxLogsRequest::default(), Some(&viewer)))
        .await;
    assert_eq!(code(r), Code::InvalidArgument);

    // The environment's default_argv, the image's CMD (/bin/sh, which exits at once without
    // stdin), and exec_only (no workload at all).
    let def = s
        .create_sandbox(with(create_in("team-a", "py", &[]), Some(&op)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(def.argv, ["python3", "-c", "print('default argv')"]);
    let img = s
        .create_sandbox(with(create_in("team-a", "image-cmd", &[]), Some(&op)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(img.argv, ["/bin/sh"]);
    assert_eq!(img.working_dir, "/workspace");
    let mut eo = create_in("team-a", "py", &[]);
    eo.exec_only = true;
    let eo = s
        .create_sandbox(with(eo, Some(&op)))
        .await
        .unwrap()
        .into_inner();
    assert!(eo.argv.is_empty() && eo.exec_only);
    wait_state(
        &mut s,
        &def.sandbox_id,
        &viewer,
        pb::SandboxState::Running,
        "code 0",
    )
    .await;
    assert_eq!(
        text(
            &tail(&mut s, &def.sandbox_id, &viewer, 0).await,
            pb::LogStream::Stdout
        ),
        "default argv\n"
    );
    wait_state(
        &mut s,
        &img.sandbox_id,
        &viewer,
        pb::SandboxState::Running,
        "code 0",
    )
    .await;
    let eo_sb = wait_state(
        &mut s,
        &eo.sandbox_id,
        &viewer,
        pb::SandboxState::Running,
        "",
    )
    .await;
    assert_eq!(eo_sb.state_reason, "");
    let eo_log = tail(&mut s, &eo.sandbox_id, &viewer, 0).await;
    assert_eq!(
        markers(&eo_log),
        [pb::LogMarker::Created, pb::LogMarker::Started]
    );

    // Retrying with the same idempotency key returns the first sandbox.
    let mut idem = create_in("team-a", "py", &[]);
    idem.idempotency_key = "retry-me".into();
    let first = s
        .create_sandbox(with(idem.clone(), Some(&op)))
        .await
        .unwrap()
        .into_inner();
    let again = s
        .create_sandbox(with(idem, Some(&op)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(first.sandbox_id, again.sandbox_id);

    // Get: unknown ids and ids of namespaces the key cannot see are the same NOT_FOUND.
    let unknown = uuid::Uuid::new_v4().to_string();
    for (sid, token) in [(&unknown, &op), (&id, &op_b)] {
        let e = s
            .get_sandbox(with(
                pb::GetSandboxRequest {
                    sandbox_id: sid.clone(),
                },
                Some(token),
            ))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::NotFound);
        assert_eq!(e.message(), format!("sandbox {sid} not found"));
    }
    for r in [
        code(
            s.delete_sandbox(with(
                pb::DeleteSandboxRequest {
                    sandbox_id: id.clone(),
                },
                Some(&op_b),
            ))
            .await,
        ),
        code(
            s.watch_sandbox(with(
                pb::WatchSandboxRequest {
                    sandbox_id: id.clone(),
                },
                Some(&op_b),
            ))
            .await,
        ),
        code(
            s.tail_sandbox_logs(with(
                pb::TailSandboxLogsRequest {
                    sandbox_id: id.clone(),
                    ..Default::default()
                },
                Some(&op_b),
            ))
            .await,
        ),
    ] {
        assert_eq!(r, Code::NotFound);
    }
    assert_eq!(
        code(
            s.delete_sandbox(with(
                pb::DeleteSandboxRequest {
                    sandbox_id: id.clone()
                },
                Some(&viewer)
            ))
            .await
        ),
        Code::PermissionDenied
    );

    // compute.v1 sandboxes show read-only, in namespace = tenant_id.
    let v1_id = create(&mut v1, create_req("team-a", "v1-session"))
        .await
        .sandbox_id;
    let lister = s.clone();
    let list = |ns: &str, state: pb::SandboxState, size: u32, token: Option<&str>| {
        let mut s = lister.clone();
        let req = with(
            pb::ListSandboxesRequest {
                namespace: ns.into(),
                state: state as i32,
                page_size: size,
                page_token: String::new(),
            },
            token,
        );
        async move { s.list_sandboxes(req).await }
    };
    let all = list("team-a", pb::SandboxState::Unspecified, 0, Some(&viewer))
        .await
        .unwrap()
        .into_inner();
    let ids: Vec<&str> = all
        .sandboxes
        .iter()
        .map(|s| s.sandbox_id.as_str())
        .collect();
    assert_eq!(ids.len(), 6, "{ids:?}");
    assert_eq!(ids[0], v1_id, "newest first");
    assert_eq!(ids[5], id);
    let created: Vec<_> = all
        .sandboxes
        .iter()
        .map(|s| {
            let t = s.created_at.unwrap();
            (t.seconds, t.nanos)
        })
        .collect();
    assert!(created.windows(2).all(|w| w[0] >= w[1]), "{created:?}");
    let v1_sb = &all.sandboxes[0];
    assert_eq!(v1_sb.origin, pb::SandboxOrigin::ComputeV1 as i32);
    assert_eq!(v1_sb.namespace, "team-a");
    let e = s
        .delete_sandbox(with(
            pb::DeleteSandboxRequest {
                sandbox_id: v1_id.clone(),
            },
            Some(&op),
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(all.next_page_token.is_empty());
    // The state filter; another namespace's key sees none of it; only a platform admin lists
    // every namespace.
    let running = list("team-a", pb::SandboxState::Running, 0, Some(&viewer))
        .await
        .unwrap()
        .into_inner();
    assert!(running
        .sandboxes
        .iter()
        .all(|s| s.state == pb::SandboxState::Running as i32));
    let pending = list("team-a", pb::SandboxState::Terminated, 0, Some(&viewer))
        .await
        .unwrap()
        .into_inner();
    assert!(pending.sandboxes.is_empty());
    assert_eq!(
        code(list("team-a", pb::SandboxState::Unspecified, 0, Some(&op_b)).await),
        Code::NotFound
    );
    assert_eq!(
        code(list("", pb::SandboxState::Unspecified, 0, Some(&op)).await),
        Code::PermissionDenied
    );
    let b = s
        .create_sandbox(with(
            create_in("team-b", "other", &["sleep", "600"]),
            Some(&op_b),
        ))
        .await
        .unwrap()
        .into_inner();
    let mut admin = SandboxServiceClient::new(root.clone());
    let every = admin
        .list_sandboxes(pb::ListSandboxesRequest::default())
        .await
        .unwrap()
        .into_inner();
    let spaces: std::collections::BTreeSet<_> = every
        .sandboxes
        .iter()
        .map(|s| s.namespace.clone())
        .collect();
    assert_eq!(spaces.into_iter().collect::<Vec<_>>(), ["team-a", "team-b"]);
    let bad = s
        .list_sandboxes(with(
            pb::ListSandboxesRequest {
                namespace: "team-a".into(),
                page_token: "garbage".into(),
                ..Default::default()
            },
            Some(&viewer),
        ))
        .await;
    assert_eq!(code(bad), Code::InvalidArgument);

    // Max lifetime: TERMINATED with its reason, the watch ends, the marker is in the log.
    let short = s
        .create_sandbox(with(create_in("team-a", "short", &[]), Some(&op)))
        .await
        .unwrap()
        .into_inner();
    assert!(short.expires_at.is_some());
    let ev = watch_all(&mut s, &short.sandbox_id, &viewer, Duration::from_secs(40)).await;
    let end = ev.last().unwrap();
    if end.state != pb::SandboxState::Terminated as i32 {
        let log = d.log_text();
        let tail: Vec<&str> = log
            .lines()
            .filter(|l| l.contains(&short.sandbox_id))
            .collect();
        eprintln!(
            "the daemon log of {}:\n{}",
            short.sandbox_id,
            tail.join("\n")
        );
    }
    assert_eq!(end.state, pb::SandboxState::Terminated as i32, "{ev:?}");
    assert_eq!(end.state_reason, "max lifetime ran out");
    let sl = tail(&mut s, &short.sandbox_id, &viewer, 0).await;
    assert_eq!(
        markers(&sl).last(),
        Some(&pb::LogMarker::Terminated),
        "{sl:?}"
    );

    // Delete: hard, at once; a watcher and a follower see the end; the record and the
    // workspace are gone; its agent's credential is revoked.
    let victim = b.sandbox_id.clone();
    let mut follower = s
        .tail_sandbox_logs(with(
            pb::TailSandboxLogsRequest {
                sandbox_id: victim.clone(),
                follow: true,
                ..Default::default()
            },
            Some(&op_b),
        ))
        .await
        .unwrap()
        .into_inner();
    wait_state(&mut s, &victim, &op_b, pb::SandboxState::Running, "").await;
    let mut s2 = s.clone();
    let op_b2 = op_b.clone();
    let v2 = victim.clone();
    let watcher =
        tokio::spawn(async move { watch_all(&mut s2, &v2, &op_b2, Duration::from_secs(30)).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let ws = d.state_dir().join("workspaces").join(&victim);
    assert!(ws.exists());
    // An operator's follower and watcher: both end with the delete.
    let spawn_ctl = |args: &[&str]| {
        d.computectl_command()
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let ctl_logs = spawn_ctl(&["logs", "-f", &victim]);
    let ctl_watch = spawn_ctl(&["watch", &victim]);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let t0 = std::time::Instant::now();
    s.delete_sandbox(with(
        pb::DeleteSandboxRequest {
            sandbox_id: victim.clone(),
        },
        Some(&op_b),
    ))
    .await
    .unwrap();
    let took = t0.elapsed();
    let ev = watcher.await.unwrap();
    let end = ev.last().unwrap();
    assert_eq!(
        (end.state, end.state_reason.as_str()),
        (pb::SandboxState::Terminated as i32, "deleted")
    );
    let mut fl = Vec::new();
    while let Some(e) = tokio::time::timeout(Duration::from_secs(10), follower.message())
        .await
        .unwrap()
        .unwrap()
    {
        fl.push(e);
    }
    assert_eq!(markers(&fl).last(), Some(&pb::LogMarker::Deleted), "{fl:?}");
    let (logs_out, watch_out) = tokio::task::spawn_blocking(move || {
        (
            ctl_logs.wait_with_output().unwrap(),
            ctl_watch.wait_with_output().unwrap(),
        )
    })
    .await
    .unwrap();
    assert!(logs_out.status.success() && watch_out.status.success());
    assert!(
        String::from_utf8_lossy(&logs_out.stderr).contains(" deleted"),
        "{logs_out:?}"
    );
    let watched = String::from_utf8_lossy(&watch_out.stdout).to_string();
    assert!(watched.contains("  RUNNING"), "{watched}");
    assert!(
        watched.trim_end().ends_with("TERMINATED  deleted"),
        "{watched}"
    );
    assert!(!ws.exists(), "the ephemeral workspace outlived its sandbox");
    let e = s
        .get_sandbox(with(
            pb::GetSandboxRequest {
                sandbox_id: victim.clone(),
            },
            Some(&op_b),
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    assert!(d
        .ctr(&["containers", "ls", "-q"])
        .lines()
        .all(|l| l.trim() != victim));
    eprintln!("delete took {took:?}");
    let audit = d.computectl(&["audit", "--namespace", "team-b", "-o", "json"]);
    let audit = String::from_utf8_lossy(&audit.stdout).to_string();
    assert!(
        audit.contains("DeleteSandbox") && audit.contains(&victim),
        "{audit}"
    );
}

/// The resident memory of process `pid`, bytes.
fn rss(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = s
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kb << 10
}

fn exec_only(ns: &str, env: &str) -> pb::CreateSandboxRequest {
    let mut r = create_in(ns, env, &[]);
    r.exec_only = true;
    r
}

/// The host's mount points under `dir` (this process's mountinfo).
fn mounts_under(dir: &std::path::Path) -> Vec<String> {
    mounts_mentioning(&format!("{}/", dir.display()))
        .iter()
        .filter_map(|l| l.split(' ').nth(4).map(str::to_string))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn ephemeral_mounts_are_volumes_of_their_own_with_their_caps_and_modes() {
    need!();
    let (d, _v1) = start_client("platform-mounts", "").await;
    let root = d.local_channel().await;
    let (op, viewer, _) = sandbox_setup(&root).await;
    let mut s = SandboxServiceClient::new(channel(&d.addr).await);

    // Three mounts: the first at the environment's default size, a 16 MiB one, and a
    // read-only one. The workload fills /data past its cap, writes 32 MiB to /workspace (which
    // /data's cap does not bound), and tries to write to /ref.
    let script = r#"
import errno, os
def fill(path, mib):
    done = 0
    try:
        with open(path, "wb") as f:
            for _ in range(mib):
                f.write(b"x" * (1 << 20))
                f.flush()
                os.fsync(f.fileno())
                done += 1
    except OSError as e:
        return done, errno.errorcode[e.errno]
    return done, "ok"
print("data", *fill("/data/big", 64))
print("workspace", *fill("/workspace/big", 32))
try:
    open("/ref/x", "w")
    print("ref writable")
except OSError as e:
    print("ref", errno.errorcode[e.errno])
print("ls", sorted(os.listdir("/workspace")), sorted(os.listdir("/data")))
"#;
    let mut req = create_in("team-a", "py", &["python3", "-c", script]);
    for (path, size, mode) in [
        ("/workspace", "", pb::MountMode::ReadWrite),
        ("/data", "16Mi", pb::MountMode::ReadWrite),
        ("/ref", "8Mi", pb::MountMode::ReadOnly),
    ] {
        req.workspaces.push(pb::WorkspaceMount {
            mount_path: path.into(),
            size: size.into(),
            mode: mode as i32,
            ..Default::default()
        });
    }
    let sb = s
        .create_sandbox(with(req, Some(&op)))
        .await
        .unwrap()
        .into_inner();
    let id = sb.sandbox_id.clone();
    let shown: Vec<(String, i32, String)> = sb
        .workspaces
        .iter()
        .map(|m| (m.mount_path.clone(), m.mode, m.size.clone()))
        .collect();
    assert_eq!(
        shown,
        [
            (
                "/workspace".into(),
                pb::MountMode::ReadWrite as i32,
                "5Gi".into()
            ),
            (
                "/data".into(),
                pb::MountMode::ReadWrite as i32,
                "16Mi".into()
            ),
            ("/ref".into(), pb::MountMode::ReadOnly as i32, "8Mi".into()),
        ]
    );
    // On the host: three volumes, each its own loop-mounted file system.
    let ws = d.state_dir().join("workspaces").join(&id);
    let mut held = mounts_under(&ws);
    held.sort();
    let want: Vec<String> = ["data", "mounts/1/data", "mounts/2/data"]
        .iter()
        .map(|p| ws.join(p).display().to_string())
        .collect();
    assert_eq!(held, want);
    let ended = wait_state(
        &mut s,
        &id,
        &viewer,
        pb::SandboxState::Running,
        "workload exited with code 0",
    )
    .await;
    assert_eq!(ended.workspaces.len(), 3);
    let log = tail(&mut s, &id, &viewer, 0).await;
    let out = text(&log, pb::LogStream::Stdout);
    let lines: Vec<&str> = out.lines().collect();
    let data: Vec<&str> = lines[0].split(' ').collect();
    assert_eq!((data[0], data[2]), ("data", "ENOSPC"), "{out}");
    let filled: u32 = data[1].parse().unwrap();
    assert!((8..16).contains(&filled), "{out}");
    assert_eq!(lines[1], "workspace 32 ok", "{out}");
    assert_eq!(lines[2], "ref EROFS", "{out}");
    assert_eq!(lines[3], "ls ['big'] ['big']", "{out}");

    // Delete takes every volume along: no mount left, nothing on disk.
    s.delete_sandbox(with(
        pb::DeleteSandboxRequest {
            sandbox_id: id.clone(),
        },
        Some(&op),
    ))
    .await
    .unwrap();
    assert_eq!(mounts_under(&ws), Vec::<String>::new());
    assert!(!ws.exists(), "the ephemeral mounts outlived their sandbox");
}

#[tokio::test(flavor = "multi_thread")]
async fn listing_pages_hold_under_churn_and_a_100mb_workload_keeps_to_its_retention() {
    need!();
    let d = start("platform-churn", "run_log_retention = \"8Mi\"");
    let root = d.local_channel().await;
    let (op, viewer, _) = sandbox_setup(&root).await;
    let s = SandboxServiceClient::new(channel(&d.addr).await);
    let make = |n: usize| {
        let s = s.clone();
        let op = op.clone();
        async move {
            let calls = (0..n).map(|_| {
                let mut s = s.clone();
                let op = op.clone();
                async move {
                    s.create_sandbox(with(exec_only("team-a", "py"), Some(&op)))
                        .await
                        .unwrap()
                        .into_inner()
                        .sandbox_id
                }
            });
            futures::future::join_all(calls).await
        }
    };
    // Sandboxes that live through the whole listing, and some that go while it runs.
    let mut churn = make(4).await;
    let stable = make(9).await;
    let mut s1 = s.clone();
    let (mut seen, mut token, mut pages) = (Vec::<String>::new(), String::new(), 0);
    loop {
        let page = s1
            .list_sandboxes(with(
                pb::ListSandboxesRequest {
                    namespace: "team-a".into(),
                    page_size: 3,
                    page_token: token.clone(),
                    ..Default::default()
                },
                Some(&viewer),
            ))
            .await
            .unwrap()
            .into_inner();
        pages += 1;
        assert!(page.sandboxes.len() <= 3);
        seen.extend(page.sandboxes.iter().map(|s| s.sandbox_id.clone()));
        // Churn between pages: one made, one deleted.
        make(1).await;
        if let Some(gone) = churn.pop() {
            s1.delete_sandbox(with(
                pb::DeleteSandboxRequest { sandbox_id: gone },
                Some(&op),
            ))
            .await
            .unwrap();
        }
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    let unique: std::collections::BTreeSet<_> = seen.iter().cloned().collect();
    assert_eq!(unique.len(), seen.len(), "a sandbox listed twice: {seen:?}");
    for id in &stable {
        assert!(
            unique.contains(id),
            "{id} lived through the listing and was missed"
        );
    }
    assert!(pages >= 4, "{pages} pages");
    // page_size is clamped (1000) and defaults (100): everything fits in one page here.
    for size in [0, 5000] {
        let all = s1
            .list_sandboxes(with(
                pb::ListSandboxesRequest {
                    namespace: "team-a".into(),
                    page_size: size,
                    ..Default::default()
                },
                Some(&viewer),
            ))
            .await
            .unwrap()
            .into_inner();
        assert!(all.next_page_token.is_empty());
        assert!(all.sandboxes.len() >= stable.len() + 4);
    }

    // A workload that prints 100 MB: the run log keeps to its retention (8 MiB here), the
    // newest output and the end are there, and the node's memory does not grow with it.
    let script = "import sys\nb = (b'x' * 65535) + b'\\n'\nfor _ in range(1600): sys.stdout.buffer.write(b)\n";
    let base = rss(d.pid());
    let big = s1
        .create_sandbox(with(
            create_in("team-a", "py", &["python3", "-c", script]),
            Some(&op),
        ))
        .await
        .unwrap()
        .into_inner()
        .sandbox_id;
    let mut peak = base;
    let deadline = std::time::Instant::now() + Duration::from_secs(180);
    loop {
        peak = peak.max(rss(d.pid()));
        let sb = s1
            .get_sandbox(with(
                pb::GetSandboxRequest {
                    sandbox_id: big.clone(),
                },
                Some(&viewer),
            ))
            .await
            .unwrap()
            .into_inner();
        if sb.state_reason.contains("exited") {
            assert_eq!(sb.state_reason, "workload exited with code 0");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the 100 MB workload never ended"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let dir = d.state_dir().join("runlogs").join(&big);
    let on_disk: u64 = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.metadata().unwrap().len())
        .sum();
    assert!(on_disk <= (8 << 20) + (256 << 10), "{on_disk} bytes kept");
    assert!(on_disk >= 4 << 20, "{on_disk} bytes kept");
    let mut log = Vec::new();
    let mut after = 0;
    loop {
        let page = tail(&mut s1, &big, &viewer, after).await;
        let Some(last) = page.last() else { break };
        after = last.offset;
        log.extend(page);
    }
    assert!(log[0].offset > 2, "the oldest output was not dropped");
    let offsets: Vec<u64> = log.iter().map(|e| e.offset).collect();
    assert!(
        offsets.windows(2).all(|w| w[1] == w[0] + 1),
        "a gap in what is kept"
    );
    assert_eq!(markers(&log), [pb::LogMarker::Exited]);
    let kept: usize = log.iter().map(|e| e.data.len()).sum();
    assert!(kept > 4 << 20 && kept <= 8 << 20, "{kept}");
    let grew = peak.saturating_sub(base);
    eprintln!("node RSS {base} -> peak {peak} (+{grew}) for 100 MB of output");
    assert!(
        grew < 48 << 20,
        "the node grew by {grew} bytes for 100 MB of output"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn watch_and_tail_through_the_router_resume_across_a_node_restart() {
    need!();
    let dir = tempfile::tempdir().unwrap();
    let peer = peer_secret(dir.path());
    let node_cfg = format!("platform_peer_secret = {peer:?}");
    let mut nodes = [
        start("platform-fa", &node_cfg),
        start("platform-fb", &node_cfg),
    ];
    let list = format!("{},{}", nodes[0].addr, nodes[1].addr);
    let r = RouterProc::start_with(
        &list,
        dir.path(),
        "platform-follow",
        &["--platform-peer-secret", peer.to_str().unwrap()],
    );
    r.wait_nodes().await;
    let (op, viewer, op_b) = sandbox_setup(&unix_channel(&r.socket()).await).await;
    let mut s = SandboxServiceClient::new(channel(&r.addr).await);

    // A workload printing a numbered line every 20 ms.
    let script =
        "import time\nfor i in range(300):\n    print(i, flush=True)\n    time.sleep(0.02)\n";
    let sb = s
        .create_sandbox(with(
            create_in("team-a", "py", &["python3", "-c", script]),
            Some(&op),
        ))
        .await
        .unwrap()
        .into_inner();
    let id = sb.sandbox_id.clone();
    let owner = nodes
        .iter()
        .position(|n| n.state_dir().join("workspaces").join(&id).exists())
        .expect("a node owns it");
    // Another namespace's key gets nothing through the router either.
    let e = s
        .get_sandbox(with(
            pb::GetSandboxRequest {
                sandbox_id: id.clone(),
            },
            Some(&op_b),
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    // compute.v1 sandboxes on both nodes, and the platform one: a listing through the router
    // merges every node's, newest first.
    let mut v1 = Vec::new();
    for n in &nodes {
        let mut c = n.client().await;
        v1.push(
            create(&mut c, create_req("team-a", "v1-router"))
                .await
                .sandbox_id,
        );
    }
    let all = s
        .list_sandboxes(with(
            pb::ListSandboxesRequest {
                namespace: "team-a".into(),
                ..Default::default()
            },
            Some(&viewer),
        ))
        .await
        .unwrap()
        .into_inner();
    let ids: Vec<&str> = all
        .sandboxes
        .iter()
        .map(|s| s.sandbox_id.as_str())
        .collect();
    assert_eq!(
        ids,
        [v1[1].as_str(), v1[0].as_str(), id.as_str()],
        "{ids:?}"
    );
    let page = s
        .list_sandboxes(with(
            pb::ListSandboxesRequest {
                namespace: "team-a".into(),
                page_size: 2,
                ..Default::default()
            },
            Some(&viewer),
        ))
        .await
        .unwrap()
        .into_inner();
    let rest = s
        .list_sandboxes(with(
            pb::ListSandboxesRequest {
                namespace: "team-a".into(),
                page_size: 2,
                page_token: page.next_page_token.clone(),
                ..Default::default()
            },
            Some(&viewer),
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(page.sandboxes.len() + rest.sandboxes.len(), 3);
    assert_eq!(rest.sandboxes[0].sandbox_id, id);
    assert!(rest.next_page_token.is_empty());

    // An interactive exec through the router: its stdin and output stream through to the
    // owning node, which checks the caller again.
    let t0 = std::time::Instant::now();
    while s
        .get_sandbox(with(
            pb::GetSandboxRequest {
                sandbox_id: id.clone(),
            },
            Some(&op),
        ))
        .await
        .unwrap()
        .into_inner()
        .state
        != pb::SandboxState::Running as i32
    {
        assert!(t0.elapsed() < Duration::from_secs(60), "{id} never RUNNING");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let exec = |token: &str| {
        use pb::exec_client_message::Msg;
        let msgs = vec![
            Msg::Spec(pb::ExecSpec {
                sandbox_id: id.clone(),
                argv: vec!["sh".into(), "-c".into(), "read x; echo \"got $x\"".into()],
                ..Default::default()
            }),
            Msg::Stdin(b"routed\n".to_vec()),
            Msg::StdinClose(true),
        ];
        let msgs: Vec<_> = msgs
            .into_iter()
            .map(|m| pb::ExecClientMessage { msg: Some(m) })
            .collect();
        let mut s = s.clone();
        let req = with(tokio_stream::iter(msgs), Some(token));
        async move {
            let mut rx = s.exec_in_sandbox(req).await?.into_inner();
            let mut out = Vec::new();
            while let Some(m) = rx.message().await? {
                match m.msg {
                    Some(pb::exec_server_message::Msg::Stdout(d)) => out.extend(d),
                    Some(pb::exec_server_message::Msg::Exit(e)) => return Ok((out, e.code)),
                    _ => {}
                }
            }
            Err(tonic::Status::internal("no exit"))
        }
    };
    let (out, code) = exec(&op).await.unwrap();
    assert_eq!(
        (String::from_utf8_lossy(&out).as_ref(), code),
        ("got routed\n", 0)
    );
    assert_eq!(
        exec(&viewer).await.unwrap_err().code(),
        Code::PermissionDenied
    );
    assert_eq!(exec(&op_b).await.unwrap_err().code(), Code::NotFound);

    // Suspend, resume and keep-alive through the router, to the owning node, which checks the
    // caller again; the workload goes on printing across it.
    let suspend = |token: &str| {
        let mut s = s.clone();
        let req = with(
            pb::SuspendSandboxRequest {
                sandbox_id: id.clone(),
            },
            Some(token),
        );
        async move { s.suspend_sandbox(req).await.map(|r| r.into_inner()) }
    };
    let resume = |token: &str| {
        let mut s = s.clone();
        let req = with(
            pb::ResumeSandboxRequest {
                sandbox_id: id.clone(),
            },
            Some(token),
        );
        async move { s.resume_sandbox(req).await.map(|r| r.into_inner()) }
    };
    let keep = |token: &str| {
        let mut s = s.clone();
        let req = with(
            pb::KeepSandboxAliveRequest {
                sandbox_id: id.clone(),
            },
            Some(token),
        );
        async move { s.keep_sandbox_alive(req).await.map(|r| r.into_inner()) }
    };
    assert!(keep(&viewer).await.is_ok());
    assert_eq!(keep(&op_b).await.unwrap_err().code(), Code::NotFound);
    assert_eq!(
        suspend(&viewer).await.unwrap_err().code(),
        Code::PermissionDenied
    );
    assert_eq!(suspend(&op_b).await.unwrap_err().code(), Code::NotFound);
    let sb = suspend(&op).await.unwrap();
    assert_eq!(sb.state, pb::SandboxState::Suspended as i32, "{sb:?}");
    assert_eq!(
        keep(&viewer).await.unwrap_err().code(),
        Code::FailedPrecondition
    );
    assert_eq!(
        resume(&viewer).await.unwrap_err().code(),
        Code::PermissionDenied
    );
    let sb = resume(&op).await.unwrap();
    assert_eq!(sb.state, pb::SandboxState::Running as i32, "{sb:?}");

    // Follow through the router until ~50 lines are in, then kill -9 the owning node and bring
    // it back; the follower reconnects from its last offset.
    let follow = |from: u64| {
        let mut s = s.clone();
        let req = with(
            pb::TailSandboxLogsRequest {
                sandbox_id: id.clone(),
                from_offset: from,
                follow: true,
                ..Default::default()
            },
            Some(&viewer),
        );
        async move { s.tail_sandbox_logs(req).await.map(|r| r.into_inner()) }
    };
    let mut got: Vec<pb::LogEntry> = Vec::new();
    let mut st = follow(0).await.unwrap();
    while text(&got, pb::LogStream::Stdout).lines().count() < 50 {
        got.push(st.message().await.unwrap().unwrap());
    }
    nodes[owner].kill9();
    // The stream ends (an error or its end) with the node gone.
    let _ = tokio::time::timeout(Duration::from_secs(10), async {
        while let Ok(Some(e)) = st.message().await {
            got.push(e);
        }
    })
    .await;
    nodes[owner].spawn();
    r.wait_nodes().await;
    let mut reconnects = 0;
    'outer: loop {
        let last = got.last().map(|e| e.offset).unwrap_or(0);
        let mut st = match follow(last).await {
            Ok(st) => st,
            Err(e) => {
                reconnects += 1;
                assert!(reconnects < 100, "never reconnected: {e:?}");
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        loop {
            match tokio::time::timeout(Duration::from_secs(60), st.message()).await {
                Ok(Ok(Some(e))) => {
                    let done = e.marker == pb::LogMarker::Exited as i32;
                    got.push(e);
                    if done {
                        break 'outer;
                    }
                }
                Ok(Ok(None)) | Ok(Err(_)) => continue 'outer,
                Err(_) => panic!("no exit within 60 s: {:?}", markers(&got)),
            }
        }
    }
    let offsets: Vec<u64> = got.iter().map(|e| e.offset).collect();
    assert_eq!(
        offsets,
        (1..=got.len() as u64).collect::<Vec<_>>(),
        "lost or repeated entries"
    );
    let want: String = (0..300).map(|i| format!("{i}\n")).collect();
    assert_eq!(
        text(&got, pb::LogStream::Stdout),
        want,
        "output lost across the restart"
    );
    // The suspend's markers are in order (wherever the workload was then).
    let life: Vec<_> = markers(&got)
        .into_iter()
        .filter(|m| !matches!(m, pb::LogMarker::Suspended | pb::LogMarker::Resumed))
        .collect();
    assert_eq!(
        life,
        [
            pb::LogMarker::Created,
            pb::LogMarker::Started,
            pb::LogMarker::Exited
        ]
    );
    let pause: Vec<_> = markers(&got)
        .into_iter()
        .filter(|m| matches!(m, pb::LogMarker::Suspended | pb::LogMarker::Resumed))
        .collect();
    assert!(
        pause.is_empty() || pause == [pb::LogMarker::Suspended, pb::LogMarker::Resumed],
        "{pause:?}"
    );
    assert_eq!(got.last().unwrap().exit_code, 0);

    // Watch through the router: the state now, then the delete's end.
    let mut w = s
        .watch_sandbox(with(
            pb::WatchSandboxRequest {
                sandbox_id: id.clone(),
            },
            Some(&viewer),
        ))
        .await
        .unwrap()
        .into_inner();
    let first = w.message().await.unwrap().unwrap().sandbox.unwrap();
    assert_eq!(first.state, pb::SandboxState::Running as i32);
    assert_eq!(first.state_reason, "workload exited with code 0");
    s.delete_sandbox(with(
        pb::DeleteSandboxRequest {
            sandbox_id: id.clone(),
        },
        Some(&op),
    ))
    .await
    .unwrap();
    let end = w.message().await.unwrap().unwrap().sandbox.unwrap();
    assert_eq!(end.state, pb::SandboxState::Terminated as i32);
    assert!(
        w.message().await.unwrap().is_none(),
        "the watch goes on after TERMINATED"
    );
}

/// A platform sandbox's create request (exec only) mounting `mounts` (workspace id, path, mode;
/// an empty id is an ephemeral mount).
fn mounting(ns: &str, mounts: &[(&str, &str, pb::MountMode)]) -> pb::CreateSandboxRequest {
    let mut r = exec_only(ns, "py");
    for (ws, path, mode) in mounts {
        r.workspaces.push(pb::WorkspaceMount {
            workspace_id: ws.to_string(),
            mount_path: path.to_string(),
            mode: *mode as i32,
            ..Default::default()
        });
    }
    r
}

/// Writes generations of a checksummed file set to /data until killed: generation g is
/// `gen-g/` (12 files of 64 KiB, each fsynced), then `manifest.json` (g and every file's
/// SHA-256) replaced atomically, then generation g-2 removed. Any instant of the file system
/// has a manifest whose files are all there with their checksums; a copy taken over time
/// does not (it can hold a manifest naming files it copied before they were written, or
/// copied after they were removed).
const WRITER: &str = r#"
import hashlib, json, os, shutil
g = 0
while True:
    g += 1
    d = f"/data/gen-{g}"
    os.makedirs(d)
    sums = {}
    for i in range(12):
        b = os.urandom(65536)
        with open(f"{d}/f{i}", "wb") as f:
            f.write(b)
            f.flush()
            os.fsync(f.fileno())
        sums[f"gen-{g}/f{i}"] = hashlib.sha256(b).hexdigest()
    with open("/data/manifest.tmp", "w") as f:
        json.dump({"gen": g, "sums": sums}, f)
        f.flush()
        os.fsync(f.fileno())
    os.rename("/data/manifest.tmp", "/data/manifest.json")
    shutil.rmtree(f"/data/gen-{g - 2}", ignore_errors=True)
"#;

/// Checks the file set at `dir`: prints `ok <gen> <files>` or what is wrong.
const CHECK: &str = r#"
import hashlib, json, sys
d = sys.argv[1]
m = json.load(open(f"{d}/manifest.json"))
bad = [p for p, s in m["sums"].items()
       if hashlib.sha256(open(f"{d}/{p}", "rb").read()).hexdigest() != s]
print("ok" if not bad else "bad", m["gen"], len(m["sums"]), bad)
"#;

#[tokio::test(flavor = "multi_thread")]
async fn durable_workspaces_attach_once_keep_data_snapshot_consistently_and_refuse_bad_mounts() {
    need!();
    let (mut d, mut c) = start_client("platform-durable", "").await;
    let root = d.local_channel().await;
    let (op, viewer, op_b) = sandbox_setup(&root).await;
    let mut s = SandboxServiceClient::new(channel(&d.addr).await);
    let mut w = WorkspaceServiceClient::new(channel(&d.addr).await);
    let rw = pb::MountMode::ReadWrite;
    let ro = pb::MountMode::ReadOnly;
    let err = |r: Result<tonic::Response<pb::Workspace>, tonic::Status>| r.unwrap_err().code();
    let create_ws = |size: &str, class: &str, snap: &str| pb::CreateWorkspaceRequest {
        namespace: "team-a".into(),
        size: size.into(),
        storage_class: class.into(),
        snapshot_id: snap.into(),
        labels: [("purpose".to_string(), "test".to_string())].into(),
    };

    // Bad workspaces.
    let unknown = uuid::Uuid::new_v4().to_string();
    for (req, want) in [
        (create_ws("lots", "", ""), Code::InvalidArgument),
        (create_ws("1Ti", "", ""), Code::InvalidArgument),
        (create_ws("", "nope", ""), Code::InvalidArgument),
        (create_ws("", "", &unknown), Code::NotFound),
    ] {
        let got = err(w.create_workspace(with(req.clone(), Some(&op))).await);
        assert_eq!(got, want, "{req:?}");
    }
    let ws = w
        .create_workspace(with(create_ws("64Mi", "", ""), Some(&op)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (
            ws.namespace.as_str(),
            ws.size.as_str(),
            ws.storage_class.as_str()
        ),
        ("team-a", "64Mi", "standard")
    );
    assert!(
        ws.attached_to.is_empty() && ws.disk_bytes < 16 << 20,
        "{ws:?}"
    );
    let id = ws.workspace_id.clone();
    // Another namespace's key cannot see it; a viewer can.
    let hidden = w
        .get_workspace(with(
            pb::GetWorkspaceRequest {
                workspace_id: id.clone(),
            },
            Some(&op_b),
        ))
        .await;
    assert_eq!(err(hidden), Code::NotFound);
    let listed = w
        .list_workspaces(with(
            pb::ListWorkspacesRequest {
                namespace: "team-a".into(),
            },
            Some(&viewer),
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.workspaces.len(), 1);

    // Bad mounts.
    let mut both = mounting("team-a", &[("", "/a", rw)]);
    both.workspace_id = id.clone();
    let nine: Vec<(String, pb::MountMode)> = (0..9).map(|i| (format!("/m{i}"), rw)).collect();
    let nine: Vec<(&str, &str, pb::MountMode)> =
        nine.iter().map(|(p, m)| ("", p.as_str(), *m)).collect();
    for (req, want, ns_key) in [
        (both, Code::InvalidArgument, &op),
        (mounting("team-a", &nine), Code::InvalidArgument, &op),
        (
            mounting("team-a", &[(&id, "/a", rw), ("", "/a/b", rw)]),
            Code::InvalidArgument,
            &op,
        ),
        (
            mounting("team-a", &[(&id, "/a", rw), (&id, "/b", ro)]),
            Code::InvalidArgument,
            &op,
        ),
        (
            mounting("team-a", &[("", "relative", rw)]),
            Code::InvalidArgument,
            &op,
        ),
        (
            mounting("team-a", &[(&unknown, "/a", rw)]),
            Code::NotFound,
            &op,
        ),
        // Another namespace's workspace is as if it did not exist.
        (
            {
                let mut r = exec_only("team-b", "other");
                r.workspace_id = id.clone();
                r
            },
            Code::NotFound,
            &op_b,
        ),
    ] {
        let got = s.create_sandbox(with(req.clone(), Some(ns_key))).await;
        assert_eq!(got.unwrap_err().code(), want, "{:?}", req.workspaces);
    }

    // Two sandboxes race to attach it: exactly one wins, the other is FAILED_PRECONDITION.
    let racer = || {
        let mut s = s.clone();
        let mut r = exec_only("team-a", "py");
        r.workspace_id = id.clone();
        let op = op.clone();
        async move { s.create_sandbox(with(r, Some(&op))).await }
    };
    let (a, b) = tokio::join!(racer(), racer());
    let (winner, lost) = match (a, b) {
        (Ok(x), Err(e)) | (Err(e), Ok(x)) => (x.into_inner(), e),
        other => panic!("not exactly one winner: {other:?}"),
    };
    assert_eq!(lost.code(), Code::FailedPrecondition, "{lost:?}");
    assert!(lost.message().contains(&winner.sandbox_id), "{lost:?}");
    assert_eq!(winner.workspaces[0].workspace_id, id);
    assert_eq!(winner.workspaces[0].mount_path, "/workspace");
    let first = winner.sandbox_id.clone();
    let got = w
        .get_workspace(with(
            pb::GetWorkspaceRequest {
                workspace_id: id.clone(),
            },
            Some(&viewer),
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.attached_to, first);
    let busy = w
        .delete_workspace(with(
            pb::DeleteWorkspaceRequest {
                workspace_id: id.clone(),
            },
            Some(&op),
        ))
        .await;
    assert_eq!(busy.unwrap_err().code(), Code::FailedPrecondition);

    // Data written through it, flushed: SyncWorkspace counts what changed since its last call.
    wait_state(&mut s, &first, &viewer, pb::SandboxState::Running, "").await;
    sh(
        &mut c,
        &first,
        "mkdir -p /workspace/keep && for i in 1 2 3; do head -c 100000 /dev/urandom > \
         /workspace/keep/f$i; done && sha256sum /workspace/keep/* > /workspace/sums",
    )
    .await;
    let sync = |sb: &str, ws: &str| {
        let mut s = s.clone();
        let (sb, ws, op) = (sb.to_string(), ws.to_string(), op.clone());
        async move {
            s.sync_sandbox_workspace(with(
                pb::SyncSandboxWorkspaceRequest {
                    sandbox_id: sb,
                    workspace_id: ws,
                },
                Some(&op),
            ))
            .await
        }
    };
    let flushed = sync(&first, "").await.unwrap().into_inner();
    assert_eq!(flushed.files_flushed, 4, "{flushed:?}");
    assert!(
        (300_000..310_000).contains(&flushed.bytes_flushed),
        "{flushed:?}"
    );
    assert!(flushed.conflict_paths.is_empty());
    let again = sync(&first, &id).await.unwrap().into_inner();
    assert_eq!((again.files_flushed, again.bytes_flushed), (0, 0));
    let other = sync(&first, &unknown).await.unwrap_err();
    assert_eq!(other.code(), Code::FailedPrecondition, "{other:?}");
    let sums = sh(&mut c, &first, "cat /workspace/sums").await;
    s.delete_sandbox(with(
        pb::DeleteSandboxRequest {
            sandbox_id: first.clone(),
        },
        Some(&op),
    ))
    .await
    .unwrap();
    let got = w
        .get_workspace(with(
            pb::GetWorkspaceRequest {
                workspace_id: id.clone(),
            },
            Some(&viewer),
        ))
        .await
        .unwrap()
        .into_inner();
    assert!(got.attached_to.is_empty(), "{got:?}");
    assert!(got.disk_bytes >= 300_000, "{got:?}");

    // A new sandbox mounting it at /data (beside an ephemeral /workspace) sees the data, and
    // runs the writer there; snapshots taken while it writes restore consistent file sets.
    let mut req = mounting("team-a", &[("", "/workspace", rw), (&id, "/data", rw)]);
    req.exec_only = false;
    req.argv = vec!["python3".into(), "-c".into(), WRITER.into()];
    let second = s
        .create_sandbox(with(req, Some(&op)))
        .await
        .unwrap()
        .into_inner()
        .sandbox_id;
    wait_state(&mut s, &second, &viewer, pb::SandboxState::Running, "").await;
    let seen = sh(
        &mut c,
        &second,
        "sed 's|/workspace/|/data/|' /data/sums | sha256sum -c",
    )
    .await;
    assert_eq!(seen.matches(": OK").count(), 3, "{seen}\n{sums}");
    let gen = |c: &mut Client| {
        let mut c = c.clone();
        let second = second.clone();
        async move {
            let m = sh(
                &mut c,
                &second,
                "cat /data/manifest.json 2>/dev/null || echo '{}'",
            )
            .await;
            serde_json::from_str::<serde_json::Value>(&m).unwrap()["gen"]
                .as_u64()
                .unwrap_or(0)
        }
    };
    let t0 = std::time::Instant::now();
    while gen(&mut c).await < 3 {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the writer does not write"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut restored = vec![];
    for _ in 0..2 {
        let snap = w
            .snapshot_workspace(with(
                pb::SnapshotWorkspaceRequest {
                    workspace_id: id.clone(),
                    ..Default::default()
                },
                Some(&op),
            ))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(snap.consistency, "freeze", "{snap:?}");
        assert!(
            ["reflink", "copy"].contains(&snap.method.as_str()),
            "{snap:?}"
        );
        assert!(
            snap.disk_bytes > 0 && snap.disk_bytes < 64 << 20,
            "{snap:?}"
        );
        let r = w
            .create_workspace(with(create_ws("", "", &snap.snapshot_id), Some(&op)))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            (r.size.as_str(), r.restored_from.as_str()),
            ("64Mi", snap.snapshot_id.as_str())
        );
        restored.push(r.workspace_id);
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // The writer went on through the snapshots.
    let before = gen(&mut c).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(gen(&mut c).await > before, "the writer stalled");
    // Each restored workspace, mounted read-only: a whole generation, every checksum right;
    // writes refused inside the sandbox and through WriteFile.
    let mut gens = vec![];
    for r in &restored {
        let checker = s
            .create_sandbox(with(mounting("team-a", &[(r, "/snap", ro)]), Some(&op)))
            .await
            .unwrap()
            .into_inner()
            .sandbox_id;
        wait_state(&mut s, &checker, &viewer, pb::SandboxState::Running, "").await;
        let out = exec(
            &mut c,
            exec_req(&checker, "python3", &["-c", CHECK, "/snap"]),
        )
        .await
        .unwrap()
        .out();
        assert!(out.starts_with("ok ") && out.contains(" 12 []"), "{out}");
        gens.push(out.split(' ').nth(1).unwrap().parse::<u64>().unwrap());
        let o = exec(
            &mut c,
            exec_req(&checker, "sh", &["-c", "echo x > /snap/new"]),
        )
        .await
        .unwrap();
        assert_ne!(o.code(), 0);
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("Read-only"),
            "{o:?}"
        );
        let wf = c
            .write_file(write_req(&checker, "/snap/new", "x"))
            .await
            .unwrap_err();
        assert_eq!(wf.code(), Code::FailedPrecondition, "{wf:?}");
        s.delete_sandbox(with(
            pb::DeleteSandboxRequest {
                sandbox_id: checker,
            },
            Some(&op),
        ))
        .await
        .unwrap();
    }
    assert!(gens[0] >= 3 && gens[1] > gens[0], "{gens:?}");

    // A suspended sandbox lets its workspace go; Resume claims it again, and is
    // FAILED_PRECONDITION while another live sandbox has it.
    let attached = |w: &mut WorkspaceServiceClient<Channel>, x: String| {
        let mut w = w.clone();
        let viewer = viewer.clone();
        async move {
            w.get_workspace(with(
                pb::GetWorkspaceRequest { workspace_id: x },
                Some(&viewer),
            ))
            .await
            .unwrap()
            .into_inner()
            .attached_to
        }
    };
    let on = |r: &str| {
        let mut req = exec_only("team-a", "py");
        req.workspace_id = r.to_string();
        req
    };
    let sleeper = s
        .create_sandbox(with(on(&restored[0]), Some(&op)))
        .await
        .unwrap()
        .into_inner()
        .sandbox_id;
    wait_state(&mut s, &sleeper, &viewer, pb::SandboxState::Running, "").await;
    s.suspend_sandbox(with(
        pb::SuspendSandboxRequest {
            sandbox_id: sleeper.clone(),
        },
        Some(&op),
    ))
    .await
    .unwrap();
    assert_eq!(attached(&mut w, restored[0].clone()).await, "");
    let taker = s
        .create_sandbox(with(on(&restored[0]), Some(&op)))
        .await
        .unwrap()
        .into_inner()
        .sandbox_id;
    let resume = |s: &mut SandboxServiceClient<Channel>| {
        let mut s = s.clone();
        let (id, op) = (sleeper.clone(), op.clone());
        async move {
            s.resume_sandbox(with(pb::ResumeSandboxRequest { sandbox_id: id }, Some(&op)))
                .await
        }
    };
    let refused = resume(&mut s).await.unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert!(refused.message().contains(&taker), "{refused:?}");
    s.delete_sandbox(with(
        pb::DeleteSandboxRequest { sandbox_id: taker },
        Some(&op),
    ))
    .await
    .unwrap();
    resume(&mut s).await.unwrap();
    assert_eq!(attached(&mut w, restored[0].clone()).await, sleeper);

    // Deleting a suspended sandbox leaves the workspace mounted for the one that took it.
    let doomed = s
        .create_sandbox(with(on(&restored[1]), Some(&op)))
        .await
        .unwrap()
        .into_inner()
        .sandbox_id;
    wait_state(&mut s, &doomed, &viewer, pb::SandboxState::Running, "").await;
    s.suspend_sandbox(with(
        pb::SuspendSandboxRequest {
            sandbox_id: doomed.clone(),
        },
        Some(&op),
    ))
    .await
    .unwrap();
    let holder = s
        .create_sandbox(with(on(&restored[1]), Some(&op)))
        .await
        .unwrap()
        .into_inner()
        .sandbox_id;
    wait_state(&mut s, &holder, &viewer, pb::SandboxState::Running, "").await;
    s.delete_sandbox(with(
        pb::DeleteSandboxRequest { sandbox_id: doomed },
        Some(&op),
    ))
    .await
    .unwrap();
    let vol = d.state_dir().join("store/workspaces").join(&restored[1]);
    assert_eq!(
        mounts_under(&vol).len(),
        1,
        "the holder's volume was unmounted"
    );
    let ls = sh(
        &mut c,
        &holder,
        "echo kept > /workspace/after && cat /workspace/after",
    )
    .await;
    assert_eq!(ls, "kept\n");
    assert_eq!(attached(&mut w, restored[1].clone()).await, holder);
    s.delete_sandbox(with(
        pb::DeleteSandboxRequest { sandbox_id: holder },
        Some(&op),
    ))
    .await
    .unwrap();

    // A restart (kill -9) keeps who has which: the claim is rebuilt from the records.
    d.kill9();
    d.spawn();
    let mut s = SandboxServiceClient::new(channel(&d.addr).await);
    let mut w = WorkspaceServiceClient::new(channel(&d.addr).await);
    assert_eq!(attached(&mut w, restored[0].clone()).await, sleeper);
    assert_eq!(attached(&mut w, id.clone()).await, second);
    let again = s
        .create_sandbox(with(on(&id), Some(&op)))
        .await
        .unwrap_err();
    assert_eq!(again.code(), Code::FailedPrecondition, "{again:?}");
    s.delete_sandbox(with(
        pb::DeleteSandboxRequest {
            sandbox_id: sleeper,
        },
        Some(&op),
    ))
    .await
    .unwrap();

    // Snapshots listed, deleted; a snapshot outlives its restores and vice versa.
    let snaps = w
        .list_workspace_snapshots(with(
            pb::ListWorkspaceSnapshotsRequest {
                namespace: "team-a".into(),
                workspace_id: id.clone(),
            },
            Some(&viewer),
        ))
        .await
        .unwrap()
        .into_inner()
        .snapshots;
    assert_eq!(snaps.len(), 2);
    for sn in &snaps {
        w.delete_workspace_snapshot(with(
            pb::DeleteWorkspaceSnapshotRequest {
                snapshot_id: sn.snapshot_id.clone(),
            },
            Some(&op),
        ))
        .await
        .unwrap();
    }
    s.delete_sandbox(with(
        pb::DeleteSandboxRequest { sandbox_id: second },
        Some(&op),
    ))
    .await
    .unwrap();
    for x in restored.iter().chain([&id]) {
        w.delete_workspace(with(
            pb::DeleteWorkspaceRequest {
                workspace_id: x.clone(),
            },
            Some(&op),
        ))
        .await
        .unwrap();
    }
    let left = w
        .list_workspaces(with(
            pb::ListWorkspacesRequest {
                namespace: "team-a".into(),
            },
            Some(&viewer),
        ))
        .await
        .unwrap()
        .into_inner();
    assert!(left.workspaces.is_empty(), "{left:?}");
    let store = d.state_dir().join("store");
    assert_eq!(mounts_under(&store), Vec::<String>::new());
    assert_eq!(
        std::fs::read_dir(store.join("workspaces")).unwrap().count(),
        0
    );
    assert_eq!(
        std::fs::read_dir(store.join("snapshots")).unwrap().count(),
        0
    );
}
