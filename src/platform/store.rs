//! Where the platform's records live: one [`Store`] trait, records as JSON documents by kind
//! and key, and an audit log, so that the API code never knows which backend holds them.
//!
//! * [`Embedded`]: a single node's store, one `redb` file under the state directory. redb is
//!   pure Rust (no C library to install), ACID and crash-safe by default (copy-on-write
//!   B-trees, a commit is durable when it returns), has had a stable file format since 1.0 and
//!   is actively maintained; sled's format is unstable and SQLite would bring a C library and
//!   SQL for what is a handful of key-value tables.
//! * A Kubernetes backend (custom resources through `kube`) comes next, so that stateless
//!   router replicas share the records; [`Store::watch`] is how a change made through one
//!   replica reaches the others.
//!
//! Keys: a namespace by its name, an API key by its key id, a binding as
//! `<namespace>/<key id>`, an environment as `<namespace>/<name>`.

use std::path::Path;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::broadcast;

use super::records::{ApiKey, AuditEvent, Binding, Environment, Namespace};

/// The kinds of record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// By name.
    Namespace,
    /// By key id.
    ApiKey,
    /// `<namespace>/<key id>`.
    Binding,
    /// `<namespace>/<name>`.
    Environment,
}

impl Kind {
    /// Every kind.
    pub const ALL: [Kind; 4] = [
        Kind::Namespace,
        Kind::ApiKey,
        Kind::Binding,
        Kind::Environment,
    ];

    fn table(self) -> redb::TableDefinition<'static, &'static str, &'static [u8]> {
        redb::TableDefinition::new(match self {
            Kind::Namespace => "namespaces",
            Kind::ApiKey => "api_keys",
            Kind::Binding => "bindings",
            Kind::Environment => "environments",
        })
    }
}

const AUDIT: redb::TableDefinition<'static, u64, &'static [u8]> =
    redb::TableDefinition::new("audit");

/// A store failure.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The key is taken.
    #[error("{kind:?} {key} already exists")]
    AlreadyExists {
        /// Its kind.
        kind: Kind,
        /// Its key.
        key: String,
    },
    /// The backend failed (I/O, a transaction).
    #[error("platform store: {0}")]
    Backend(String),
    /// A stored document does not decode: never read as a default.
    #[error("platform store: a {kind:?} record {key} does not decode: {why}")]
    Corrupt {
        /// Its kind.
        kind: Kind,
        /// Its key.
        key: String,
        /// The decoder's message.
        why: String,
    },
    /// A stored audit event does not decode.
    #[error("platform store: audit event {seq} does not decode: {why}")]
    CorruptAudit {
        /// Its sequence number.
        seq: u64,
        /// The decoder's message.
        why: String,
    },
}

/// Which audit events [`Store::audit_tail`] answers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuditQuery {
    /// Only this platform namespace's events; empty: every event.
    pub namespace: String,
    /// Only events at or after this time (RFC 3339, as [`AuditEvent::time`] is written).
    pub since: Option<String>,
    /// At most this many: the newest.
    pub limit: usize,
}

impl AuditQuery {
    /// Whether `e` is one of the events asked for (the limit aside).
    pub fn matches(&self, e: &AuditEvent) -> bool {
        (self.namespace.is_empty() || e.namespace == self.namespace)
            && self
                .since
                .as_ref()
                .is_none_or(|s| e.time.as_str() >= s.as_str())
    }
}

/// The store's result.
pub type Result<T> = std::result::Result<T, Error>;

/// A change to a record, for watchers (other router replicas, caches).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// The record's kind.
    pub kind: Kind,
    /// The record's key.
    pub key: String,
    /// false: the record was deleted.
    pub present: bool,
}

/// The records and the audit log.
#[async_trait::async_trait]
pub trait Store: Send + Sync + 'static {
    /// Stores a new record; AlreadyExists if the key is taken.
    async fn create(&self, kind: Kind, key: &str, doc: Vec<u8>) -> Result<()>;
    /// Stores a record, replacing any.
    async fn put(&self, kind: Kind, key: &str, doc: Vec<u8>) -> Result<()>;
    /// The record of `key`, if any.
    async fn get(&self, kind: Kind, key: &str) -> Result<Option<Vec<u8>>>;
    /// Removes a record; false if there was none.
    async fn delete(&self, kind: Kind, key: &str) -> Result<bool>;
    /// Records whose key starts with `prefix`, in key order.
    async fn list(&self, kind: Kind, prefix: &str) -> Result<Vec<(String, Vec<u8>)>>;
    /// Appends an audit event; returns its sequence number.
    async fn audit(&self, event: AuditEvent) -> Result<u64>;
    /// Audit events after `after_seq`, oldest first, at most `limit`.
    async fn audit_since(&self, after_seq: u64, limit: usize) -> Result<Vec<AuditEvent>>;
    /// The newest `q.limit` audit events that `q` matches, oldest first, found without
    /// reading events the query rules out where the backend can (the embedded store reads
    /// backwards from the newest; the Kubernetes one lists by a namespace label).
    async fn audit_tail(&self, q: &AuditQuery) -> Result<Vec<AuditEvent>>;
    /// Changes made from now on (through this store or, for shared backends, elsewhere).
    fn watch(&self) -> broadcast::Receiver<Change>;
}

/// A record type and its kind.
pub trait Record: Serialize + DeserializeOwned {
    /// The record's kind.
    const KIND: Kind;
    /// Its key in the store (see the module doc).
    fn key(&self) -> String;
}

impl Record for Namespace {
    const KIND: Kind = Kind::Namespace;
    fn key(&self) -> String {
        self.name.clone()
    }
}
impl Record for ApiKey {
    const KIND: Kind = Kind::ApiKey;
    fn key(&self) -> String {
        self.key_id.clone()
    }
}
impl Record for Binding {
    const KIND: Kind = Kind::Binding;
    fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.key_id)
    }
}
impl Record for Environment {
    const KIND: Kind = Kind::Environment;
    fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// Typed access over any [`Store`].
#[derive(Clone)]
pub struct Records {
    store: Arc<dyn Store>,
}

fn encode<R: Record>(r: &R) -> Vec<u8> {
    serde_json::to_vec(r).expect("records serialise")
}

fn decode<R: Record>(key: &str, doc: &[u8]) -> Result<R> {
    serde_json::from_slice(doc).map_err(|e| Error::Corrupt {
        kind: R::KIND,
        key: key.to_string(),
        why: e.to_string(),
    })
}

impl Records {
    /// Typed access to `store`.
    pub fn new(store: Arc<dyn Store>) -> Self {
        Self { store }
    }

    /// The backend.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// Stores a new record; AlreadyExists if its key is taken.
    pub async fn create<R: Record>(&self, r: &R) -> Result<()> {
        self.store.create(R::KIND, &r.key(), encode(r)).await
    }

    /// Stores a record, replacing any of the same key.
    pub async fn put<R: Record>(&self, r: &R) -> Result<()> {
        self.store.put(R::KIND, &r.key(), encode(r)).await
    }

    /// The record of `key`.
    pub async fn get<R: Record>(&self, key: &str) -> Result<Option<R>> {
        match self.store.get(R::KIND, key).await? {
            Some(doc) => decode(key, &doc).map(Some),
            None => Ok(None),
        }
    }

    /// Removes the record of `key`; false if there was none.
    pub async fn delete<R: Record>(&self, key: &str) -> Result<bool> {
        self.store.delete(R::KIND, key).await
    }

    /// The records whose key starts with `prefix`, in key order.
    pub async fn list<R: Record>(&self, prefix: &str) -> Result<Vec<R>> {
        self.store
            .list(R::KIND, prefix)
            .await?
            .iter()
            .map(|(k, doc)| decode(k, doc))
            .collect()
    }

    /// The bindings of one key (a scan: bindings are keyed by namespace first).
    pub async fn bindings_of(&self, key_id: &str) -> Result<Vec<Binding>> {
        Ok(self
            .list::<Binding>("")
            .await?
            .into_iter()
            .filter(|b| b.key_id == key_id)
            .collect())
    }
}

fn audit_of(seq: u64, doc: &[u8]) -> Result<AuditEvent> {
    serde_json::from_slice(doc).map_err(|e| Error::CorruptAudit {
        seq,
        why: e.to_string(),
    })
}

/// A single node's store: one redb file.
pub struct Embedded {
    db: Arc<redb::Database>,
    changes: broadcast::Sender<Change>,
}

fn backend(e: impl std::fmt::Display) -> Error {
    Error::Backend(e.to_string())
}

impl Embedded {
    /// Opens (or creates) the store at `path` (its directory must exist); the file is 0600.
    /// Blocks.
    pub fn open(path: &Path) -> Result<Self> {
        let db = redb::Database::create(path).map_err(backend)?;
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
                .map_err(backend)?;
        }
        // Every table exists from the start: a read never meets a missing one.
        let tx = db.begin_write().map_err(backend)?;
        for k in Kind::ALL {
            tx.open_table(k.table()).map_err(backend)?;
        }
        tx.open_table(AUDIT).map_err(backend)?;
        tx.commit().map_err(backend)?;
        let (changes, _) = broadcast::channel(256);
        Ok(Self {
            db: Arc::new(db),
            changes,
        })
    }

    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&redb::Database) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let db = self.db.clone();
        tokio::task::spawn_blocking(move || f(&db))
            .await
            .map_err(backend)?
    }

    fn changed(&self, kind: Kind, key: &str, present: bool) {
        let _ = self.changes.send(Change {
            kind,
            key: key.to_string(),
            present,
        });
    }

    async fn write(&self, kind: Kind, key: &str, doc: Vec<u8>, create_only: bool) -> Result<()> {
        use redb::ReadableTable;
        let k = key.to_string();
        self.blocking(move |db| {
            let tx = db.begin_write().map_err(backend)?;
            {
                let mut t = tx.open_table(kind.table()).map_err(backend)?;
                if create_only && t.get(k.as_str()).map_err(backend)?.is_some() {
                    return Err(Error::AlreadyExists { kind, key: k });
                }
                t.insert(k.as_str(), doc.as_slice()).map_err(backend)?;
            }
            tx.commit().map_err(backend)
        })
        .await?;
        self.changed(kind, key, true);
        Ok(())
    }
}

#[async_trait::async_trait]
impl Store for Embedded {
    async fn create(&self, kind: Kind, key: &str, doc: Vec<u8>) -> Result<()> {
        self.write(kind, key, doc, true).await
    }

    async fn put(&self, kind: Kind, key: &str, doc: Vec<u8>) -> Result<()> {
        self.write(kind, key, doc, false).await
    }

    async fn get(&self, kind: Kind, key: &str) -> Result<Option<Vec<u8>>> {
        use redb::ReadableDatabase;
        let k = key.to_string();
        self.blocking(move |db| {
            let tx = db.begin_read().map_err(backend)?;
            let t = tx.open_table(kind.table()).map_err(backend)?;
            let v = t.get(k.as_str()).map_err(backend)?;
            Ok(v.map(|g| g.value().to_vec()))
        })
        .await
    }

    async fn delete(&self, kind: Kind, key: &str) -> Result<bool> {
        let k = key.to_string();
        let removed = self
            .blocking(move |db| {
                let tx = db.begin_write().map_err(backend)?;
                let removed = {
                    let mut t = tx.open_table(kind.table()).map_err(backend)?;
                    let r = t.remove(k.as_str()).map_err(backend)?;
                    r.is_some()
                };
                tx.commit().map_err(backend)?;
                Ok(removed)
            })
            .await?;
        if removed {
            self.changed(kind, key, false);
        }
        Ok(removed)
    }

    async fn list(&self, kind: Kind, prefix: &str) -> Result<Vec<(String, Vec<u8>)>> {
        use redb::ReadableDatabase;
        let p = prefix.to_string();
        self.blocking(move |db| {
            let tx = db.begin_read().map_err(backend)?;
            let t = tx.open_table(kind.table()).map_err(backend)?;
            let mut out = Vec::new();
            for item in t.range(p.as_str()..).map_err(backend)? {
                let (k, v) = item.map_err(backend)?;
                if !k.value().starts_with(p.as_str()) {
                    break;
                }
                out.push((k.value().to_string(), v.value().to_vec()));
            }
            Ok(out)
        })
        .await
    }

    async fn audit(&self, mut event: AuditEvent) -> Result<u64> {
        use redb::ReadableTable;
        self.blocking(move |db| {
            let tx = db.begin_write().map_err(backend)?;
            let seq = {
                let mut t = tx.open_table(AUDIT).map_err(backend)?;
                let last = t.last().map_err(backend)?.map(|(k, _)| k.value());
                let seq = last.unwrap_or(0) + 1;
                event.seq = seq;
                let doc = serde_json::to_vec(&event).map_err(backend)?;
                t.insert(seq, doc.as_slice()).map_err(backend)?;
                seq
            };
            tx.commit().map_err(backend)?;
            Ok(seq)
        })
        .await
    }

    async fn audit_since(&self, after_seq: u64, limit: usize) -> Result<Vec<AuditEvent>> {
        use redb::ReadableDatabase;
        self.blocking(move |db| {
            let tx = db.begin_read().map_err(backend)?;
            let t = tx.open_table(AUDIT).map_err(backend)?;
            let mut out = Vec::new();
            for item in t.range(after_seq.saturating_add(1)..).map_err(backend)? {
                if out.len() >= limit {
                    break;
                }
                let (k, v) = item.map_err(backend)?;
                out.push(audit_of(k.value(), v.value())?);
            }
            Ok(out)
        })
        .await
    }

    async fn audit_tail(&self, q: &AuditQuery) -> Result<Vec<AuditEvent>> {
        use redb::ReadableDatabase;
        let q = q.clone();
        self.blocking(move |db| {
            let tx = db.begin_read().map_err(backend)?;
            let t = tx.open_table(AUDIT).map_err(backend)?;
            let mut out = Vec::new();
            for item in t.range(0..).map_err(backend)?.rev() {
                if out.len() >= q.limit {
                    break;
                }
                let (k, v) = item.map_err(backend)?;
                let ev = audit_of(k.value(), v.value())?;
                if q.matches(&ev) {
                    out.push(ev);
                }
            }
            out.reverse();
            Ok(out)
        })
        .await
    }

    fn watch(&self) -> broadcast::Receiver<Change> {
        self.changes.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::super::access::Role;
    use super::super::records::Outcome;
    use super::*;

    fn ns(name: &str) -> Namespace {
        Namespace {
            name: name.into(),
            labels: Default::default(),
            created_at: "2026-12-02T00:00:00Z".into(),
        }
    }

    fn binding(ns: &str, key: &str, role: Role) -> Binding {
        Binding {
            namespace: ns.into(),
            key_id: key.into(),
            role,
            created_at: "2026-12-02T00:00:00Z".into(),
        }
    }

    #[tokio::test]
    async fn records_round_trip_survive_a_reopen_and_list_by_prefix() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("platform.redb");
        {
            let r = Records::new(Arc::new(Embedded::open(&path).unwrap()));
            r.create(&ns("team-a")).await.unwrap();
            r.create(&ns("team-b")).await.unwrap();
            match r.create(&ns("team-a")).await {
                Err(Error::AlreadyExists { kind, key }) => {
                    assert_eq!((kind, key.as_str()), (Kind::Namespace, "team-a"))
                }
                other => panic!("{other:?}"),
            }
            r.put(&binding("team-a", "k1", Role::Viewer)).await.unwrap();
            r.put(&binding("team-a", "k1", Role::Admin)).await.unwrap();
            r.put(&binding("team-a", "k2", Role::Operator))
                .await
                .unwrap();
            r.put(&binding("team-ab", "k1", Role::Viewer))
                .await
                .unwrap();
            r.put(&binding("team-b", "k1", Role::Operator))
                .await
                .unwrap();
        }
        let meta = std::fs::metadata(&path).unwrap();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        // Reopened: everything is still there.
        let r = Records::new(Arc::new(Embedded::open(&path).unwrap()));
        let names: Vec<String> = r
            .list::<Namespace>("")
            .await
            .unwrap()
            .into_iter()
            .map(|n| n.name)
            .collect();
        assert_eq!(names, ["team-a", "team-b"]);
        let a: Vec<(String, Role)> = r
            .list::<Binding>("team-a/")
            .await
            .unwrap()
            .into_iter()
            .map(|b| (b.key_id, b.role))
            .collect();
        assert_eq!(
            a,
            [("k1".into(), Role::Admin), ("k2".into(), Role::Operator)],
            "put replaces; team-ab/ is not under team-a/"
        );
        let of_k1: Vec<String> = r
            .bindings_of("k1")
            .await
            .unwrap()
            .into_iter()
            .map(|b| b.namespace)
            .collect();
        assert_eq!(of_k1, ["team-a", "team-ab", "team-b"]);
        assert!(r.delete::<Binding>("team-a/k2").await.unwrap());
        assert!(!r.delete::<Binding>("team-a/k2").await.unwrap());
        assert_eq!(r.get::<Binding>("team-a/k2").await.unwrap(), None);
        assert_eq!(
            r.get::<Namespace>("team-b").await.unwrap(),
            Some(ns("team-b"))
        );
    }

    #[tokio::test]
    async fn watchers_see_creates_and_deletes_and_audit_is_ordered() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Embedded::open(&dir.path().join("p.redb")).unwrap());
        let r = Records::new(store.clone());
        let mut w = store.watch();
        r.create(&ns("team-a")).await.unwrap();
        r.delete::<Namespace>("team-a").await.unwrap();
        assert_eq!(
            w.recv().await.unwrap(),
            Change {
                kind: Kind::Namespace,
                key: "team-a".into(),
                present: true
            }
        );
        assert!(!w.recv().await.unwrap().present);
        for i in 0..5 {
            let seq = store
                .audit(AuditEvent {
                    seq: 0,
                    time: format!("2026-12-02T00:00:0{i}Z"),
                    principal: "k1".into(),
                    method: "/platform.v1.AccessService/CreateNamespace".into(),
                    namespace: if i % 2 == 0 { "team-a" } else { "team-b" }.into(),
                    resource: String::new(),
                    outcome: Outcome::Ok,
                    code: String::new(),
                    detail: String::new(),
                })
                .await
                .unwrap();
            assert_eq!(seq, i + 1);
        }
        let evs = store.audit_since(2, 2).await.unwrap();
        assert_eq!(evs.iter().map(|e| e.seq).collect::<Vec<_>>(), [3, 4]);
        assert_eq!(store.audit_since(5, 10).await.unwrap(), []);
        // The newest matching events, oldest first: team-a holds 1, 3 and 5.
        let tail = async |namespace: &str, since: Option<&str>, limit| {
            let q = AuditQuery {
                namespace: namespace.into(),
                since: since.map(String::from),
                limit,
            };
            let evs = store.audit_tail(&q).await.unwrap();
            evs.iter().map(|e| e.seq).collect::<Vec<_>>()
        };
        assert_eq!(tail("team-a", None, 2).await, [3, 5]);
        assert_eq!(tail("team-a", None, 10).await, [1, 3, 5]);
        assert_eq!(tail("team-b", None, 10).await, [2, 4]);
        assert_eq!(tail("", Some("2026-12-02T00:00:03Z"), 10).await, [4, 5]);
        assert_eq!(tail("team-a", Some("2026-12-02T00:00:03Z"), 10).await, [5]);
        assert_eq!(tail("team-c", None, 10).await, Vec::<u64>::new());
    }

    #[tokio::test]
    async fn a_corrupt_record_is_an_error_not_a_default() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Embedded::open(&dir.path().join("p.redb")).unwrap());
        store
            .put(Kind::Namespace, "x", b"{not json".to_vec())
            .await
            .unwrap();
        let r = Records::new(store);
        assert!(matches!(
            r.get::<Namespace>("x").await,
            Err(Error::Corrupt { .. })
        ));
    }
}
