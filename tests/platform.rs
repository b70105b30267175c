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

/// Sandbox- or workspace-id-addressed RPCs: they only authenticate until their resources
/// exist (issues 17-22), then answer UNIMPLEMENTED.
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
                    assert_eq!(got, Code::Unimplemented, "{at}");
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
                                assert_eq!(got, Code::Unimplemented, "{at}");
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
    let nodes = [start("platform-ra", ""), start("platform-rb", "")];
    let list = format!("{},{}", nodes[0].addr, nodes[1].addr);
    let dir = tempfile::tempdir().unwrap();
    let mut r = RouterProc::start(&list, dir.path(), "platform");
    r.wait_nodes().await;
    let root = unix_channel(&r.socket()).await;
    let t = table(root, channel(&r.addr).await).await;

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
