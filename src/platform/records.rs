//! What the platform keeps beyond any one node: namespaces, API keys (their digests), role
//! bindings, environments and the audit log. These are the store's schema (JSON in the
//! embedded database, the `spec` of Kubernetes objects), apart from the API's messages so that
//! the API can grow without migrating stored records. Validation of what a caller sends lives
//! here too: one place says what a valid name, environment or egress rule is.

use std::collections::BTreeMap;
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use super::access::Role;

/// Most workspace mounts of an environment or a sandbox.
pub const MAX_MOUNTS: usize = 8;
/// Most egress rules of one policy.
pub const MAX_EGRESS_RULES: usize = 256;
/// Environment variable names the platform sets in every sandbox (its ids and credentials):
/// an environment or request that sets one is refused. Every name starting `SANDBOX_` is the
/// platform's.
pub const PLATFORM_ENV_PREFIX: &str = "SANDBOX_";

/// Now, as the records write times: RFC 3339 in UTC, milliseconds.
pub fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// A validation failure: INVALID_ARGUMENT with this text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Invalid(pub String);

fn invalid<T>(m: impl Into<String>) -> Result<T, Invalid> {
    Err(Invalid(m.into()))
}

/// A DNS label (RFC 1123): lowercase letters, digits and '-', 1–63 characters, starting with a
/// letter and not ending with '-'. Namespaces and environments are named so (they become
/// Kubernetes object names).
pub fn check_name(what: &str, name: &str) -> Result<(), Invalid> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name.as_bytes()[0].is_ascii_lowercase()
        && !name.ends_with('-')
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if ok {
        Ok(())
    } else {
        invalid(format!(
            "{what} {name:?} is not a DNS label (a-z, 0-9 and '-', 1-63 characters, starting \
             with a letter)"
        ))
    }
}

/// An absolute path with no `.`/`..` components, no doubled or trailing `/` and no NUL.
/// Labels of a workspace or snapshot: at most 64, keys 1..=63 bytes, values up to 256, no NUL.
pub fn check_labels(labels: &BTreeMap<String, String>) -> Result<(), Invalid> {
    if labels.len() > 64 {
        return invalid(format!("{} labels; at most 64", labels.len()));
    }
    for (k, v) in labels {
        if k.is_empty() || k.len() > 63 || v.len() > 256 || k.contains('\0') || v.contains('\0') {
            return invalid(format!(
                "label {k:?}: keys are 1 to 63 bytes, values up to 256, without NUL"
            ));
        }
    }
    Ok(())
}

/// `p` must be an absolute, clean path.
pub fn check_clean_abs(what: &str, p: &str) -> Result<(), Invalid> {
    let clean = p.starts_with('/')
        && !p.contains('\0')
        && (p == "/"
            || (!p.ends_with('/')
                && p[1..]
                    .split('/')
                    .all(|c| !c.is_empty() && c != "." && c != "..")));
    if clean {
        Ok(())
    } else {
        invalid(format!("{what} {p:?} must be an absolute, clean path"))
    }
}

/// Environment variables a caller sets: valid names, none of the platform's own.
pub fn check_env(env: &BTreeMap<String, String>) -> Result<(), Invalid> {
    for (k, v) in env {
        let valid = !k.is_empty()
            && !k.as_bytes()[0].is_ascii_digit()
            && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if !valid {
            return invalid(format!(
                "env name {k:?} is not a valid name ([A-Za-z_][A-Za-z0-9_]*)"
            ));
        }
        if k.starts_with(PLATFORM_ENV_PREFIX) {
            return invalid(format!(
                "env name {k:?} is the platform's own (names starting {PLATFORM_ENV_PREFIX} \
                 carry the sandbox's ids and credentials)"
            ));
        }
        if v.contains('\0') {
            return invalid(format!("env {k} contains NUL"));
        }
    }
    Ok(())
}

/// A namespace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Namespace {
    /// DNS label.
    pub name: String,
    #[serde(default)]
    /// Free-form labels.
    pub labels: BTreeMap<String, String>,
    /// RFC 3339.
    pub created_at: String,
}

/// An API key as stored: its digest, never its token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiKey {
    /// The public id: the token's prefix, listed, audited and bound to roles.
    pub key_id: String,
    /// Who or what holds it.
    pub name: String,
    /// Hex SHA-256 of the token.
    pub sha256: String,
    #[serde(default)]
    /// Platform admin over every namespace.
    pub platform_admin: bool,
    /// RFC 3339.
    pub created_at: String,
    #[serde(default)]
    /// RFC 3339; None: no expiry.
    pub expires_at: Option<String>,
    #[serde(default)]
    /// RFC 3339; set once, by RevokeApiKey.
    pub revoked_at: Option<String>,
    /// The principal that made it (a key id or `local-root`).
    pub created_by: String,
}

impl ApiKey {
    /// Why the key is no longer accepted at `now` (RFC 3339), if it is not.
    pub fn unusable(&self, now: &str) -> Option<&'static str> {
        if self.revoked_at.is_some() {
            return Some("revoked");
        }
        match &self.expires_at {
            Some(exp) if rfc3339_before(exp, now) => Some("expired"),
            _ => None,
        }
    }
}

/// Whether RFC 3339 time `a` is at or before `b` (unparseable: treated as the past).
fn rfc3339_before(a: &str, b: &str) -> bool {
    match (
        chrono::DateTime::parse_from_rfc3339(a),
        chrono::DateTime::parse_from_rfc3339(b),
    ) {
        (Ok(a), Ok(b)) => a <= b,
        _ => true,
    }
}

/// A key's role in a namespace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Binding {
    /// The namespace the role is held in.
    pub namespace: String,
    /// The key that holds it.
    pub key_id: String,
    /// The role.
    pub role: Role,
    /// RFC 3339.
    pub created_at: String,
}

/// Sandbox resources; 0 = the default.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resources {
    #[serde(default)]
    /// Millicores.
    pub cpu_millis: u32,
    #[serde(default)]
    /// Memory limit, bytes.
    pub memory_bytes: u64,
    #[serde(default)]
    /// Writable layer and ephemeral workspaces, bytes.
    pub disk_bytes: u64,
}

/// A workspace mount.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mount {
    /// Durable workspace id; empty = ephemeral.
    #[serde(default)]
    pub workspace_id: String,
    /// Absolute, clean path inside the sandbox.
    pub mount_path: String,
    #[serde(default)]
    /// Mounted read-only.
    pub read_only: bool,
    /// Size of an ephemeral one ("5Gi"); empty = the default.
    #[serde(default)]
    pub size: String,
}

/// One egress destination.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EgressRule {
    /// A DNS name ("api.example.com", "*.example.com") or a CIDR ("198.18.0.0/15").
    pub destination: String,
    /// Empty = every port.
    #[serde(default)]
    pub ports: Vec<u16>,
    /// "tcp", "udp" or empty (both).
    #[serde(default)]
    pub protocol: String,
}

/// What a sandbox may reach; no rules = deny all.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EgressPolicy {
    #[serde(default)]
    /// Each one destination; a connection is allowed when one rule matches.
    pub rules: Vec<EgressRule>,
}

impl EgressPolicy {
    /// Checks every rule.
    pub fn check(&self) -> Result<(), Invalid> {
        if self.rules.len() > MAX_EGRESS_RULES {
            return invalid(format!(
                "{} egress rules; at most {MAX_EGRESS_RULES}",
                self.rules.len()
            ));
        }
        for r in &self.rules {
            check_destination(&r.destination)?;
            if r.ports.contains(&0) {
                return invalid(format!("egress to {}: port 0", r.destination));
            }
            if !["", "tcp", "udp"].contains(&r.protocol.as_str()) {
                return invalid(format!(
                    "egress to {}: protocol {:?} is not tcp or udp",
                    r.destination, r.protocol
                ));
            }
        }
        Ok(())
    }
}

/// One label of a DNS name: 1-63 letters, digits and hyphens, no hyphen at either end.
pub fn dns_label(l: &str) -> bool {
    !l.is_empty()
        && l.len() <= 63
        && !l.starts_with('-')
        && !l.ends_with('-')
        && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

/// A CIDR, or a DNS name with an optional leading `*.`.
fn check_destination(d: &str) -> Result<(), Invalid> {
    if let Some((ip, bits)) = d.split_once('/') {
        let ip: IpAddr = ip
            .parse()
            .map_err(|_| Invalid(format!("egress destination {d:?}: not an address")))?;
        let max = if ip.is_ipv4() { 32 } else { 128 };
        return match bits.parse::<u8>() {
            Ok(b) if b <= max => Ok(()),
            _ => invalid(format!(
                "egress destination {d:?}: prefix length over {max}"
            )),
        };
    }
    if d.parse::<IpAddr>().is_ok() {
        return Ok(());
    }
    let name = d.strip_prefix("*.").unwrap_or(d);
    if name.len() <= 253 && name.contains('.') && name.split('.').all(dns_label) {
        Ok(())
    } else {
        invalid(format!(
            "egress destination {d:?} is neither a CIDR, an address nor a DNS name"
        ))
    }
}

/// A sandbox template in a namespace.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Environment {
    /// The namespace it belongs to.
    pub namespace: String,
    /// DNS label, unique in the namespace.
    pub name: String,
    /// Image reference.
    pub image: String,
    #[serde(default)]
    /// The workload when a request gives none (empty: the image's ENTRYPOINT/CMD).
    pub default_argv: Vec<String>,
    #[serde(default)]
    /// Set in every sandbox made from it (no `SANDBOX_` names).
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    /// Absolute and clean; empty: the image's.
    pub working_dir: String,
    #[serde(default)]
    /// Defaults for its sandboxes.
    pub resources: Resources,
    #[serde(default)]
    /// Mounted in every sandbox made from it; at most [`MAX_MOUNTS`].
    pub workspaces: Vec<Mount>,
    /// None: deny all.
    #[serde(default)]
    pub egress: Option<EgressPolicy>,
    #[serde(default)]
    /// Seconds without a call before a sandbox is suspended; 0: never.
    pub idle_suspend_sec: u32,
    #[serde(default)]
    /// Seconds a sandbox may live; 0: no limit.
    pub max_lifetime_sec: u32,
    #[serde(default)]
    /// Free-form labels.
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    /// RFC 3339, set by the store's caller.
    pub created_at: String,
    #[serde(default)]
    /// RFC 3339.
    pub updated_at: String,
}

impl Environment {
    /// Everything a stored environment must satisfy.
    pub fn check(&self) -> Result<(), Invalid> {
        check_name("namespace", &self.namespace)?;
        check_name("environment", &self.name)?;
        if self.image.trim().is_empty() {
            return invalid("image is required");
        }
        if self.image.contains(char::is_whitespace) {
            return invalid(format!("image {:?} contains whitespace", self.image));
        }
        if self.default_argv.iter().any(|a| a.contains('\0')) {
            return invalid("default_argv contains NUL");
        }
        check_env(&self.env)?;
        if !self.working_dir.is_empty() {
            check_clean_abs("working_dir", &self.working_dir)?;
        }
        check_mounts(&self.workspaces)?;
        if let Some(e) = &self.egress {
            e.check()?;
        }
        Ok(())
    }
}

/// At most [`MAX_MOUNTS`], each at a distinct absolute clean path.
pub fn check_mounts(mounts: &[Mount]) -> Result<(), Invalid> {
    if mounts.len() > MAX_MOUNTS {
        return invalid(format!(
            "{} workspace mounts; at most {MAX_MOUNTS}",
            mounts.len()
        ));
    }
    let mut seen = std::collections::BTreeSet::new();
    for m in mounts {
        check_clean_abs("mount_path", &m.mount_path)?;
        if m.mount_path == "/" {
            return invalid("a workspace cannot be mounted at /");
        }
        if !m.workspace_id.is_empty()
            && mounts
                .iter()
                .filter(|o| o.workspace_id == m.workspace_id)
                .count()
                > 1
        {
            return invalid(format!("workspace {} is mounted twice", m.workspace_id));
        }
        if !seen.insert(m.mount_path.as_str()) {
            return invalid(format!("two workspaces at {}", m.mount_path));
        }
        // One inside another would hide part of the outer one, or be hidden by it.
        if let Some(o) = mounts.iter().find(|o| {
            o.mount_path.len() > m.mount_path.len()
                && o.mount_path.starts_with(&m.mount_path)
                && o.mount_path.as_bytes()[m.mount_path.len()] == b'/'
        }) {
            return invalid(format!(
                "workspace mounts overlap: {} is inside {}",
                o.mount_path, m.mount_path
            ));
        }
        if !m.size.is_empty() && m.size.parse::<crate::size::ByteSize>().is_err() {
            return invalid(format!("workspace size {:?} is not a size", m.size));
        }
    }
    Ok(())
}

/// How an audited call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// Succeeded.
    Ok,
    /// Refused before it ran (no key, no role).
    Denied,
    /// Ran and failed.
    Failed,
}

/// One line of the audit log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditEvent {
    /// Assigned by the store, increasing.
    #[serde(default)]
    pub seq: u64,
    /// RFC 3339.
    pub time: String,
    /// A key id, `local-root` or `anonymous`.
    pub principal: String,
    /// The full gRPC method.
    pub method: String,
    #[serde(default)]
    /// The namespace it acted in (empty: none).
    pub namespace: String,
    #[serde(default)]
    /// What it acted on: a sandbox id, an environment or key id.
    pub resource: String,
    /// How it ended.
    pub outcome: Outcome,
    /// The gRPC code's name when not OK.
    #[serde(default)]
    pub code: String,
    #[serde(default)]
    /// Why, for DENIED and FAILED (never a secret).
    pub detail: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_dns_labels() {
        for ok in ["a", "team-a", "t0", &"a".repeat(63)] {
            assert_eq!(check_name("namespace", ok), Ok(()), "{ok}");
        }
        for bad in [
            "",
            "A",
            "0team",
            "team-",
            "te_am",
            "te.am",
            &"a".repeat(64),
            "tëam",
        ] {
            assert!(check_name("namespace", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn paths_must_be_absolute_and_clean() {
        for ok in ["/", "/workspace", "/home/user/src"] {
            assert_eq!(check_clean_abs("working_dir", ok), Ok(()), "{ok}");
        }
        for bad in [
            "",
            "workspace",
            "/a/",
            "//a",
            "/a//b",
            "/a/./b",
            "/a/../b",
            "/..",
            "/a\0",
        ] {
            assert!(check_clean_abs("working_dir", bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn mounts_may_not_repeat_or_nest() {
        let at = |paths: &[&str]| -> Vec<Mount> {
            paths
                .iter()
                .map(|p| Mount {
                    workspace_id: String::new(),
                    mount_path: p.to_string(),
                    read_only: false,
                    size: String::new(),
                })
                .collect()
        };
        for ok in [
            &["/w"][..],
            &["/data", "/database", "/w"],
            &["/a/b", "/a/c"],
        ] {
            assert_eq!(check_mounts(&at(ok)), Ok(()), "{ok:?}");
        }
        for bad in [
            &["/w", "/w"][..],
            &["/data", "/data/x"],
            &["/a/b/c", "/w", "/a/b"],
            &["/"],
        ] {
            assert!(check_mounts(&at(bad)).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn platform_env_names_and_bad_names_are_refused() {
        let env = |k: &str| BTreeMap::from([(k.to_string(), "v".to_string())]);
        assert_eq!(check_env(&env("PATH")), Ok(()));
        assert_eq!(check_env(&env("_X1")), Ok(()));
        for bad in ["SANDBOX_ID", "SANDBOX_AGENT_KEY", "1X", "A-B", "A=B", ""] {
            assert!(check_env(&env(bad)).is_err(), "{bad}");
        }
        let e = check_env(&env("SANDBOX_AGENT_KEY")).unwrap_err();
        assert!(e.0.contains("platform's own"), "{e}");
    }

    #[test]
    fn environments_are_validated_whole() {
        let good = Environment {
            namespace: "team-a".into(),
            name: "py".into(),
            image: "compute.local/sandbox-python:latest".into(),
            working_dir: "/workspace".into(),
            workspaces: vec![Mount {
                mount_path: "/workspace".into(),
                size: "1Gi".into(),
                ..Default::default()
            }],
            egress: Some(EgressPolicy {
                rules: vec![
                    EgressRule {
                        destination: "*.pypi.org".into(),
                        ports: vec![443],
                        protocol: "tcp".into(),
                    },
                    EgressRule {
                        destination: "198.18.0.0/15".into(),
                        ports: vec![],
                        protocol: String::new(),
                    },
                ],
            }),
            ..Default::default()
        };
        assert_eq!(good.check(), Ok(()));
        let bad = |f: &dyn Fn(&mut Environment), why: &str| {
            let mut e = good.clone();
            f(&mut e);
            let err = e.check().expect_err(why);
            assert!(err.0.contains(why), "{why}: {err}");
        };
        bad(&|e| e.image.clear(), "image is required");
        bad(&|e| e.name = "Py".into(), "not a DNS label");
        bad(&|e| e.working_dir = "work".into(), "absolute, clean");
        bad(
            &|e| {
                e.env.insert("SANDBOX_ID".into(), "x".into());
            },
            "platform's own",
        );
        bad(
            &|e| {
                e.workspaces = (0..9)
                    .map(|i| Mount {
                        mount_path: format!("/w{i}"),
                        ..Default::default()
                    })
                    .collect()
            },
            "at most 8",
        );
        bad(
            &|e| e.workspaces.push(e.workspaces[0].clone()),
            "two workspaces",
        );
        bad(&|e| e.workspaces[0].size = "lots".into(), "not a size");
        for (dest, why) in [
            ("198.18.0.0/33", "prefix length"),
            ("not a host", "neither"),
            ("localhost", "neither"),
            ("300.1.1.1/8", "not an address"),
        ] {
            bad(
                &|e| e.egress.as_mut().unwrap().rules[0].destination = dest.into(),
                why,
            );
        }
        bad(
            &|e| e.egress.as_mut().unwrap().rules[0].protocol = "icmp".into(),
            "not tcp or udp",
        );
        bad(
            &|e| e.egress.as_mut().unwrap().rules[0].ports = vec![0],
            "port 0",
        );
    }

    #[test]
    fn keys_expire_and_revoke() {
        let mut k = ApiKey {
            key_id: "0123456789abcdef".into(),
            name: "ci".into(),
            sha256: "00".into(),
            platform_admin: false,
            created_at: "2026-01-01T00:00:00Z".into(),
            expires_at: Some("2026-06-01T00:00:00Z".into()),
            revoked_at: None,
            created_by: "local-root".into(),
        };
        assert_eq!(k.unusable("2026-05-31T23:59:59Z"), None);
        assert_eq!(k.unusable("2026-06-01T00:00:00Z"), Some("expired"));
        k.expires_at = None;
        assert_eq!(k.unusable("2099-01-01T00:00:00Z"), None);
        k.revoked_at = Some("2026-02-01T00:00:00Z".into());
        assert_eq!(k.unusable("2026-01-02T00:00:00Z"), Some("revoked"));
    }
}
