//! Who may call what: the roles of a namespace, the principals the API sees, and the one table
//! that names the role every platform RPC needs (the **Access** line of its heading in
//! `sandbox-platform-api.md`). The check runs before anything else a call does.
//!
//! * Roles are per namespace and ordered: VIEWER < OPERATOR < ADMIN. A platform admin holds
//!   every role in every namespace.
//! * Root (or the server's own uid) on the node's or router's unix socket is the platform admin
//!   `local-root` (bootstrap: the first namespace and key are made with `computectl` there);
//!   everything else carries a key.
//! * A key that holds no role in a namespace cannot tell its resources from missing ones: the
//!   caller maps [`Denied::Hidden`] to NOT_FOUND, exactly like an unknown id.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A role in one namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Reads: Get, List, Watch, Tail, KeepAlive.
    Viewer,
    /// Writes sandboxes: create, exec, suspend, egress, ports.
    Operator,
    /// Manages the namespace: environments, role bindings, keys bound to it.
    Admin,
}

impl Role {
    /// The API's enum value (`platform.v1.Role`).
    pub fn from_proto(v: i32) -> Option<Role> {
        match v {
            1 => Some(Role::Viewer),
            2 => Some(Role::Operator),
            3 => Some(Role::Admin),
            _ => None,
        }
    }

    /// The API's enum value.
    pub fn to_proto(self) -> i32 {
        match self {
            Role::Viewer => 1,
            Role::Operator => 2,
            Role::Admin => 3,
        }
    }

    /// `viewer`, `operator`, `admin`.
    pub fn word(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Operator => "operator",
            Role::Admin => "admin",
        }
    }

    /// The role a word names (case-insensitive), for the CLI.
    pub fn parse(s: &str) -> Option<Role> {
        match s.to_ascii_lowercase().as_str() {
            "viewer" => Some(Role::Viewer),
            "operator" => Some(Role::Operator),
            "admin" => Some(Role::Admin),
            _ => None,
        }
    }
}

/// Who is calling (serialised only to hand a router's checked principal to a node).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Principal {
    /// Root on the node's unix socket: platform admin.
    LocalRoot,
    /// A valid (present, unrevoked, unexpired) API key.
    Key {
        /// The key's public id.
        key_id: String,
        /// Platform admin over every namespace.
        platform_admin: bool,
        /// namespace → role.
        roles: BTreeMap<String, Role>,
    },
}

/// The name the audit log and WhoAmI give a principal (never a secret).
pub const LOCAL_ROOT: &str = "local-root";

impl Principal {
    /// A key id, or `local-root`.
    pub fn name(&self) -> &str {
        match self {
            Principal::LocalRoot => LOCAL_ROOT,
            Principal::Key { key_id, .. } => key_id,
        }
    }

    /// Platform admin over every namespace.
    pub fn is_platform_admin(&self) -> bool {
        match self {
            Principal::LocalRoot => true,
            Principal::Key { platform_admin, .. } => *platform_admin,
        }
    }

    /// The principal's role in `namespace` (a platform admin: ADMIN everywhere).
    pub fn role_in(&self, namespace: &str) -> Option<Role> {
        match self {
            _ if self.is_platform_admin() => Some(Role::Admin),
            Principal::Key { roles, .. } => roles.get(namespace).copied(),
            Principal::LocalRoot => Some(Role::Admin),
        }
    }

    /// Whether the principal may see anything of `namespace` at all.
    pub fn sees(&self, namespace: &str) -> bool {
        self.role_in(namespace).is_some()
    }
}

/// What an RPC needs of its caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// At least this role in the namespace the call acts in.
    Role(Role),
    /// Platform admin.
    PlatformAdmin,
    /// Any valid key (WhoAmI; List calls that filter by what the caller sees).
    AnyKey,
}

/// Why a call is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Denied {
    /// The principal holds a role in the namespace, but a lower one: PERMISSION_DENIED.
    Role {
        /// What the call needs.
        need: Role,
        /// What the principal holds there.
        has: Role,
    },
    /// The principal holds no role there: indistinguishable from a missing resource.
    Hidden,
    /// Only a platform admin may: PERMISSION_DENIED.
    PlatformAdmin,
    /// A namespaced call that names no namespace (acting across all of them): only a platform
    /// admin may; PERMISSION_DENIED.
    NoNamespace,
}

impl std::fmt::Display for Denied {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Denied::Role { need, has } => write!(
                f,
                "this call needs the {} role in the namespace; the key has {}",
                need.word(),
                has.word()
            ),
            Denied::Hidden => write!(f, "not found"),
            Denied::PlatformAdmin => write!(f, "this call needs a platform admin"),
            Denied::NoNamespace => write!(
                f,
                "name a namespace: across every namespace this call needs a platform admin"
            ),
        }
    }
}

/// Checks `need` for `principal` acting in `namespace` (empty: no namespace, e.g. a platform
/// admin listing everything).
pub fn authorize(principal: &Principal, need: Need, namespace: &str) -> Result<(), Denied> {
    match need {
        Need::AnyKey => Ok(()),
        Need::PlatformAdmin if principal.is_platform_admin() => Ok(()),
        Need::PlatformAdmin => Err(Denied::PlatformAdmin),
        Need::Role(_) if principal.is_platform_admin() => Ok(()),
        Need::Role(_) if namespace.is_empty() => Err(Denied::NoNamespace),
        Need::Role(need) => match principal.role_in(namespace) {
            None => Err(Denied::Hidden),
            Some(has) if has >= need => Ok(()),
            Some(has) => Err(Denied::Role { need, has }),
        },
    }
}

/// Every platform RPC and what it needs: the `**Access:**` lines of the spec, and the
/// administrative services' own rules. A method missing here is refused (see [`need_of`]).
pub const METHODS: &[(&str, Need)] = &[
    // Sandboxes.
    (
        "/platform.v1.SandboxService/CreateSandbox",
        Need::Role(Role::Operator),
    ),
    (
        "/platform.v1.SandboxService/DeleteSandbox",
        Need::Role(Role::Operator),
    ),
    (
        "/platform.v1.SandboxService/GetSandbox",
        Need::Role(Role::Viewer),
    ),
    (
        "/platform.v1.SandboxService/ListSandboxes",
        Need::Role(Role::Viewer),
    ),
    (
        "/platform.v1.SandboxService/WatchSandbox",
        Need::Role(Role::Viewer),
    ),
    (
        "/platform.v1.SandboxService/ExecInSandbox",
        Need::Role(Role::Operator),
    ),
    (
        "/platform.v1.SandboxService/SuspendSandbox",
        Need::Role(Role::Operator),
    ),
    (
        "/platform.v1.SandboxService/ResumeSandbox",
        Need::Role(Role::Operator),
    ),
    (
        "/platform.v1.SandboxService/KeepSandboxAlive",
        Need::Role(Role::Viewer),
    ),
    (
        "/platform.v1.SandboxService/TailSandboxLogs",
        Need::Role(Role::Viewer),
    ),
    (
        "/platform.v1.SandboxService/GrantEgress",
        Need::Role(Role::Operator),
    ),
    (
        "/platform.v1.SandboxService/RevokeEgress",
        Need::Role(Role::Operator),
    ),
    (
        "/platform.v1.SandboxService/ExposeSandboxPort",
        Need::Role(Role::Operator),
    ),
    (
        "/platform.v1.SandboxService/UnexposeSandboxPort",
        Need::Role(Role::Operator),
    ),
    (
        "/platform.v1.SandboxService/SyncSandboxWorkspace",
        Need::Role(Role::Operator),
    ),
    // Namespaces, keys, roles, audit.
    (
        "/platform.v1.AccessService/CreateNamespace",
        Need::PlatformAdmin,
    ),
    (
        "/platform.v1.AccessService/GetNamespace",
        Need::Role(Role::Viewer),
    ),
    ("/platform.v1.AccessService/ListNamespaces", Need::AnyKey),
    (
        "/platform.v1.AccessService/DeleteNamespace",
        Need::PlatformAdmin,
    ),
    // A namespace ADMIN may mint keys bound to its namespace only; checked by the call.
    ("/platform.v1.AccessService/CreateApiKey", Need::AnyKey),
    ("/platform.v1.AccessService/ListApiKeys", Need::AnyKey),
    ("/platform.v1.AccessService/RevokeApiKey", Need::AnyKey),
    (
        "/platform.v1.AccessService/SetRoleBinding",
        Need::Role(Role::Admin),
    ),
    (
        "/platform.v1.AccessService/DeleteRoleBinding",
        Need::Role(Role::Admin),
    ),
    (
        "/platform.v1.AccessService/ListRoleBindings",
        Need::Role(Role::Admin),
    ),
    ("/platform.v1.AccessService/WhoAmI", Need::AnyKey),
    (
        "/platform.v1.AccessService/ListAuditEvents",
        Need::Role(Role::Admin),
    ),
    // Environments.
    (
        "/platform.v1.EnvironmentService/CreateEnvironment",
        Need::Role(Role::Admin),
    ),
    (
        "/platform.v1.EnvironmentService/GetEnvironment",
        Need::Role(Role::Viewer),
    ),
    (
        "/platform.v1.EnvironmentService/ListEnvironments",
        Need::Role(Role::Viewer),
    ),
    (
        "/platform.v1.EnvironmentService/DeleteEnvironment",
        Need::Role(Role::Admin),
    ),
    // Durable workspaces.
    (
        "/platform.v1.WorkspaceService/CreateWorkspace",
        Need::Role(Role::Operator),
    ),
    (
        "/platform.v1.WorkspaceService/GetWorkspace",
        Need::Role(Role::Viewer),
    ),
    (
        "/platform.v1.WorkspaceService/ListWorkspaces",
        Need::Role(Role::Viewer),
    ),
    (
        "/platform.v1.WorkspaceService/DeleteWorkspace",
        Need::Role(Role::Operator),
    ),
    (
        "/platform.v1.WorkspaceService/SnapshotWorkspace",
        Need::Role(Role::Operator),
    ),
    (
        "/platform.v1.WorkspaceService/ListWorkspaceSnapshots",
        Need::Role(Role::Viewer),
    ),
    (
        "/platform.v1.WorkspaceService/DeleteWorkspaceSnapshot",
        Need::Role(Role::Operator),
    ),
];

/// What `method` (the gRPC path) needs; None for a method this table does not know, which the
/// caller refuses (a new RPC without an access rule is never open by accident).
pub fn need_of(method: &str) -> Option<Need> {
    METHODS.iter().find(|(m, _)| *m == method).map(|(_, n)| *n)
}

/// Whether `method` changes something (written to the audit log even when it succeeds).
pub fn is_write(method: &str) -> bool {
    let name = method.rsplit('/').next().unwrap_or("");
    !["Get", "List", "Watch", "Tail", "WhoAmI", "KeepSandboxAlive"]
        .iter()
        .any(|p| name.starts_with(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(admin: bool, roles: &[(&str, Role)]) -> Principal {
        Principal::Key {
            key_id: "k1".into(),
            platform_admin: admin,
            roles: roles.iter().map(|(n, r)| (n.to_string(), *r)).collect(),
        }
    }

    #[test]
    fn roles_are_ordered_and_round_trip() {
        assert!(Role::Viewer < Role::Operator && Role::Operator < Role::Admin);
        for r in [Role::Viewer, Role::Operator, Role::Admin] {
            assert_eq!(Role::from_proto(r.to_proto()), Some(r));
            assert_eq!(Role::parse(r.word()), Some(r));
        }
        assert_eq!(Role::from_proto(0), None);
        assert_eq!(Role::parse("root"), None);
    }

    #[test]
    fn every_role_against_every_need_in_own_and_other_namespaces() {
        let needs = [Role::Viewer, Role::Operator, Role::Admin];
        for has in needs {
            let p = key(false, &[("team-a", has)]);
            for need in needs {
                let own = authorize(&p, Need::Role(need), "team-a");
                if has >= need {
                    assert_eq!(own, Ok(()), "{has:?} for {need:?}");
                } else {
                    assert_eq!(own, Err(Denied::Role { need, has }), "{has:?} for {need:?}");
                }
                // Another namespace looks empty, whatever the role asked.
                assert_eq!(
                    authorize(&p, Need::Role(need), "team-b"),
                    Err(Denied::Hidden)
                );
            }
            assert_eq!(
                authorize(&p, Need::PlatformAdmin, "team-a"),
                Err(Denied::PlatformAdmin)
            );
            assert_eq!(authorize(&p, Need::AnyKey, ""), Ok(()));
            // Naming no namespace is acting across all of them.
            assert_eq!(
                authorize(&p, Need::Role(Role::Viewer), ""),
                Err(Denied::NoNamespace)
            );
        }
        // Platform admins (a key or root on the socket) may do everything everywhere.
        for p in [key(true, &[]), Principal::LocalRoot] {
            for need in needs {
                assert_eq!(authorize(&p, Need::Role(need), "anything"), Ok(()));
                assert_eq!(authorize(&p, Need::Role(need), ""), Ok(()));
            }
            assert_eq!(authorize(&p, Need::PlatformAdmin, ""), Ok(()));
            assert!(p.sees("team-z"));
        }
        // A key with no bindings sees nothing.
        let none = key(false, &[]);
        assert!(!none.sees("team-a"));
        assert_eq!(
            authorize(&none, Need::Role(Role::Viewer), "team-a"),
            Err(Denied::Hidden)
        );
    }

    #[test]
    fn the_table_names_every_rpc_of_the_proto_once() {
        let proto = include_str!("../../proto/platform/v1/platform.proto");
        let mut service = "";
        let mut rpcs = Vec::new();
        for line in proto.lines().map(str::trim) {
            if let Some(rest) = line.strip_prefix("service ") {
                service = rest.trim_end_matches(" {").trim();
            } else if let Some(rest) = line.strip_prefix("rpc ") {
                let name = rest.split('(').next().unwrap().trim();
                rpcs.push(format!("/platform.v1.{service}/{name}"));
            }
        }
        assert!(rpcs.len() >= 35, "{rpcs:?}");
        for m in &rpcs {
            assert!(need_of(m).is_some(), "{m} has no access rule");
        }
        assert_eq!(METHODS.len(), rpcs.len(), "rules for RPCs the proto lacks");
        // The spec's Access lines, spot-checked: KeepAlive is deliberately read-level.
        assert_eq!(
            need_of("/platform.v1.SandboxService/KeepSandboxAlive"),
            Some(Need::Role(Role::Viewer))
        );
        assert_eq!(need_of("/platform.v1.SandboxService/Nope"), None);
    }

    #[test]
    fn writes_are_told_from_reads() {
        assert!(is_write("/platform.v1.SandboxService/CreateSandbox"));
        assert!(is_write("/platform.v1.SandboxService/ExecInSandbox"));
        assert!(is_write("/platform.v1.AccessService/RevokeApiKey"));
        assert!(!is_write("/platform.v1.SandboxService/GetSandbox"));
        assert!(!is_write("/platform.v1.SandboxService/KeepSandboxAlive"));
        assert!(!is_write("/platform.v1.SandboxService/TailSandboxLogs"));
        assert!(!is_write("/platform.v1.AccessService/WhoAmI"));
    }
}
