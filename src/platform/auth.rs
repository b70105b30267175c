//! From a call's credentials to a [`Principal`], and from the principal and the RPC to a yes
//! or a precise no. Runs before anything else a platform call does.
//!
//! * Root on the node's unix socket (peer credentials, checked by the listener) is
//!   `local-root`, a platform admin, with or without a key.
//! * Otherwise `authorization: Bearer cpk_…`: no header, a malformed token, an unknown key id,
//!   a wrong secret, a revoked or an expired key are all UNAUTHENTICATED, with a reason that
//!   never repeats the token.
//! * The key's role bindings come from the store; principals are cached per key id and the
//!   cache is dropped on any change to keys or bindings ([`Store::watch`]), so a revocation
//!   or a new binding takes effect at once, also when made through another router replica.
//! * A router in front of nodes has checked the caller already: it hands the node the
//!   principal it found (`x-compute-principal`, JSON) with the secret router and nodes share
//!   (`x-compute-peer`, the `platform_peer_secret` file of both). A node that has the secret
//!   takes that principal as it is; a wrong or unexpected peer secret is UNAUTHENTICATED.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use super::access::{self, Denied, Need, Principal};
use super::keys;
use super::records::ApiKey;
use super::store::{self, Kind, Records};

/// Why a call is refused (or could not be checked).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No usable credential: UNAUTHENTICATED.
    #[error("{0}")]
    Unauthenticated(&'static str),
    /// A role too low, or not a platform admin: PERMISSION_DENIED.
    #[error("{0}")]
    PermissionDenied(String),
    /// The namespace is not the caller's to see: NOT_FOUND, as for a missing resource.
    #[error("{0} not found")]
    Hidden(String),
    /// The RPC has no access rule: refused (PERMISSION_DENIED), never open by accident.
    #[error("{0} has no access rule")]
    NoRule(String),
    /// The store failed: UNAVAILABLE.
    #[error(transparent)]
    Store(#[from] store::Error),
}

/// What a call presents.
#[derive(Debug, Clone, Copy, Default)]
pub struct Credentials<'a> {
    /// The `authorization` metadata value, if any.
    pub authorization: Option<&'a str>,
    /// The call came over the node's (or router's) unix socket from uid 0 or the server's own
    /// uid.
    pub local_root: bool,
    /// The `x-compute-peer` value, if any: a router's shared secret.
    pub peer: Option<&'a str>,
    /// The `x-compute-principal` value a router sends with it.
    pub delegated: Option<&'a str>,
}

/// The metadata a router hands a node its checked principal in.
pub const PEER_HEADER: &str = "x-compute-peer";
/// See [`PEER_HEADER`].
pub const PRINCIPAL_HEADER: &str = "x-compute-principal";

/// Resolves principals and checks calls.
#[derive(Clone)]
pub struct Authenticator {
    records: Records,
    cache: Arc<Mutex<Cache>>,
    /// The digest of the secret a router presents with a principal it checked.
    peer: Option<Arc<String>>,
}

/// Principals by key id, and a generation bumped whenever they are dropped: an entry read
/// from the store before a change is not put in after it.
#[derive(Default)]
struct Cache {
    generation: u64,
    by_key: HashMap<String, Cached>,
}

#[derive(Clone)]
struct Cached {
    key: ApiKey,
    roles: BTreeMap<String, access::Role>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Authenticator {
    /// An authenticator over `records`; spawns the task that drops the cache on changes (so
    /// it needs a tokio runtime).
    pub fn new(records: Records) -> Self {
        let cache: Arc<Mutex<Cache>> = Arc::default();
        let mut changes = records.store().watch();
        let weak = Arc::downgrade(&cache);
        tokio::spawn(async move {
            loop {
                let drop_all = match changes.recv().await {
                    Ok(c) => matches!(c.kind, Kind::ApiKey | Kind::Binding),
                    // Missed changes: nothing cached can be trusted.
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => true,
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                };
                let Some(cache) = weak.upgrade() else { return };
                if drop_all {
                    let mut c = lock(&cache);
                    c.by_key.clear();
                    c.generation += 1;
                }
            }
        });
        Self {
            records,
            cache,
            peer: None,
        }
    }

    /// Also takes principals handed over by a router presenting `secret`.
    pub fn with_peer_secret(mut self, secret: &str) -> Self {
        self.peer = Some(Arc::new(keys::digest(secret)));
        self
    }

    /// Who presents `creds`.
    pub async fn principal(&self, creds: Credentials<'_>) -> Result<Principal, Error> {
        if creds.local_root {
            return Ok(Principal::LocalRoot);
        }
        if let Some(secret) = creds.peer {
            return match &self.peer {
                Some(d) if keys::matches(secret, d) => creds
                    .delegated
                    .and_then(|j| serde_json::from_str(j).ok())
                    .ok_or(Error::Unauthenticated("a router's call names no principal")),
                _ => Err(Error::Unauthenticated("invalid peer credential")),
            };
        }
        let header = creds.authorization.ok_or(Error::Unauthenticated(
            "no credential (authorization: Bearer <key>)",
        ))?;
        let token = keys::bearer(header).ok_or(Error::Unauthenticated(
            "authorization is not 'Bearer <key>'",
        ))?;
        let key_id = keys::key_id_of(token).ok_or(Error::Unauthenticated("invalid key"))?;
        let (cached, generation) = {
            let c = lock(&self.cache);
            (c.by_key.get(key_id).cloned(), c.generation)
        };
        let entry = match cached {
            Some(c) => c,
            None => {
                let key = self
                    .records
                    .get::<ApiKey>(key_id)
                    .await?
                    .ok_or(Error::Unauthenticated("invalid key"))?;
                let roles = self
                    .records
                    .bindings_of(key_id)
                    .await?
                    .into_iter()
                    .map(|b| (b.namespace, b.role))
                    .collect();
                let c = Cached { key, roles };
                let mut cache = lock(&self.cache);
                if cache.generation == generation {
                    cache.by_key.insert(key_id.to_string(), c.clone());
                }
                c
            }
        };
        // The same answer for an unknown id and a wrong secret.
        if !keys::matches(token, &entry.key.sha256) {
            return Err(Error::Unauthenticated("invalid key"));
        }
        match entry.key.unusable(&super::records::now()) {
            Some("revoked") => return Err(Error::Unauthenticated("key revoked")),
            Some(_) => return Err(Error::Unauthenticated("key expired")),
            None => {}
        }
        Ok(Principal::Key {
            key_id: entry.key.key_id,
            platform_admin: entry.key.platform_admin,
            roles: entry.roles,
        })
    }

    /// Authenticates `creds` and checks that the principal may call `method` in `namespace`.
    pub async fn check(
        &self,
        creds: Credentials<'_>,
        method: &str,
        namespace: &str,
    ) -> Result<Principal, Error> {
        let need: Need = access::need_of(method).ok_or_else(|| Error::NoRule(method.into()))?;
        let p = self.principal(creds).await?;
        match access::authorize(&p, need, namespace) {
            Ok(()) => Ok(p),
            Err(Denied::Hidden) => Err(Error::Hidden(format!("namespace {namespace}"))),
            Err(d) => Err(Error::PermissionDenied(d.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::access::Role;
    use super::super::records::{now, Binding};
    use super::super::store::Embedded;
    use super::*;

    async fn setup() -> (tempfile::TempDir, Records, Authenticator) {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Embedded::open(&dir.path().join("p.redb")).unwrap());
        let records = Records::new(store);
        let auth = Authenticator::new(records.clone());
        (dir, records, auth)
    }

    async fn new_key(r: &Records, admin: bool, expires_at: Option<String>) -> (String, String) {
        let (id, token) = keys::mint().unwrap();
        r.create(&ApiKey {
            key_id: id.clone(),
            name: "t".into(),
            sha256: keys::digest(&token),
            platform_admin: admin,
            created_at: now(),
            expires_at,
            revoked_at: None,
            created_by: access::LOCAL_ROOT.into(),
        })
        .await
        .unwrap();
        (id, token)
    }

    async fn bind(r: &Records, ns: &str, id: &str, role: Role) {
        r.put(&Binding {
            namespace: ns.into(),
            key_id: id.into(),
            role,
            created_at: now(),
        })
        .await
        .unwrap();
    }

    fn with(header: &str) -> Credentials<'_> {
        Credentials {
            authorization: Some(header),
            ..Default::default()
        }
    }

    const GET: &str = "/platform.v1.SandboxService/GetSandbox";
    const CREATE: &str = "/platform.v1.SandboxService/CreateSandbox";

    #[tokio::test]
    async fn every_kind_of_bad_credential_is_unauthenticated_and_never_echoed() {
        let (_d, r, auth) = setup().await;
        let (_, token) = new_key(&r, false, None).await;
        let (_, other) = keys::mint().unwrap();
        let wrong_secret = format!("{}{}", &token[..token.len() - 4], "0000");
        let cases: Vec<(Credentials, &str)> = vec![
            (Credentials::default(), "no credential"),
            (with(&token), "not 'Bearer"),
            (with("Bearer nonsense"), "invalid key"),
            (with("Basic dXNlcjpwYXNz"), "not 'Bearer"),
        ];
        for (c, why) in cases {
            match auth.principal(c).await {
                Err(Error::Unauthenticated(m)) => assert!(m.contains(why), "{m} / {why}"),
                other => panic!("{why}: {other:?}"),
            }
        }
        for t in [other, wrong_secret] {
            let h = format!("Bearer {t}");
            match auth.principal(with(&h)).await {
                Err(e @ Error::Unauthenticated("invalid key")) => {
                    assert!(!e.to_string().contains(&t[4..]), "the token is not echoed")
                }
                other => panic!("{other:?}"),
            }
        }
        // Root on the socket needs no key.
        let root = Credentials {
            local_root: true,
            ..Default::default()
        };
        assert_eq!(auth.principal(root).await.unwrap(), Principal::LocalRoot);
    }

    #[tokio::test]
    async fn roles_are_checked_and_changes_take_effect_at_once() {
        let (_d, r, auth) = setup().await;
        let (id, token) = new_key(&r, false, None).await;
        let h = format!("Bearer {token}");
        // No binding: the namespace looks missing.
        assert!(matches!(
            auth.check(with(&h), GET, "team-a").await,
            Err(Error::Hidden(_))
        ));
        bind(&r, "team-a", &id, Role::Viewer).await;
        // The cache was dropped by the change: the viewer may read, not write.
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        assert!(auth.check(with(&h), GET, "team-a").await.is_ok());
        match auth.check(with(&h), CREATE, "team-a").await {
            Err(Error::PermissionDenied(m)) => assert!(m.contains("operator"), "{m}"),
            other => panic!("{other:?}"),
        }
        bind(&r, "team-a", &id, Role::Operator).await;
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        assert!(auth.check(with(&h), CREATE, "team-a").await.is_ok());
        assert!(matches!(
            auth.check(with(&h), CREATE, "team-b").await,
            Err(Error::Hidden(_))
        ));
        // Revoked: refused on the next call.
        let mut k: ApiKey = r.get(&id).await.unwrap().unwrap();
        k.revoked_at = Some(now());
        r.put(&k).await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        assert!(matches!(
            auth.check(with(&h), GET, "team-a").await,
            Err(Error::Unauthenticated("key revoked"))
        ));
        // An unknown RPC is refused whoever calls.
        let root = Credentials {
            local_root: true,
            ..Default::default()
        };
        assert!(matches!(
            auth.check(root, "/platform.v1.SandboxService/Nope", "")
                .await,
            Err(Error::NoRule(_))
        ));
    }

    #[tokio::test]
    async fn expired_keys_are_refused_and_platform_admins_see_everything() {
        let (_d, r, auth) = setup().await;
        let (_, old) = new_key(&r, true, Some("2020-01-01T00:00:00Z".into())).await;
        assert!(matches!(
            auth.principal(with(&format!("Bearer {old}"))).await,
            Err(Error::Unauthenticated("key expired"))
        ));
        let (_, admin) = new_key(&r, true, Some("2999-01-01T00:00:00Z".into())).await;
        let h = format!("Bearer {admin}");
        for m in [GET, CREATE, "/platform.v1.AccessService/CreateNamespace"] {
            assert!(
                auth.check(with(&h), m, "any-namespace").await.is_ok(),
                "{m}"
            );
        }
    }

    #[tokio::test]
    async fn a_routers_principal_is_taken_only_with_the_shared_secret() {
        let (_d, _r, auth) = setup().await;
        let auth = auth.with_peer_secret("s3cret-of-the-cluster");
        let p = Principal::Key {
            key_id: "0123456789abcdef".into(),
            platform_admin: false,
            roles: [("team-a".to_string(), Role::Viewer)].into(),
        };
        let json = serde_json::to_string(&p).unwrap();
        let creds = |peer: &'static str, j: Option<&str>| Credentials {
            peer: Some(peer),
            delegated: j.map(|j| &*j.to_string().leak()),
            ..Default::default()
        };
        assert_eq!(
            auth.principal(creds("s3cret-of-the-cluster", Some(&json)))
                .await
                .unwrap(),
            p
        );
        for bad in [
            creds("wrong", Some(&json)),
            creds("s3cret-of-the-cluster", None),
        ] {
            assert!(matches!(
                auth.principal(bad).await,
                Err(Error::Unauthenticated(_))
            ));
        }
        // A node without the secret takes no router's word.
        let (_d2, _r2, plain) = setup().await;
        assert!(matches!(
            plain
                .principal(creds("s3cret-of-the-cluster", Some(&json)))
                .await,
            Err(Error::Unauthenticated(_))
        ));
    }
}
