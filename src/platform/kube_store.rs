//! The cluster's store: every record is a `PlatformRecord` (`compute.dev/v1`, the CRD in
//! `daemonset/base/05-platform-crd.yaml`) in the platform's Kubernetes namespace, so that
//! stateless router replicas share them and a change made through one reaches the others
//! through a watch. A dedicated resource type keeps the routers' RBAC to these objects alone
//! (no Secrets, no ConfigMaps).
//!
//! An object holds one record: `metadata.name` is `<kind>-<first 40 hex of SHA-256(key)>`
//! (keys hold '/' and need not be DNS names), the label `compute.dev/record-kind` its kind,
//! `spec.key` the key and `spec.doc` the record's JSON. Audit events are objects of kind
//! `audit` named by their sequence number (microseconds since the epoch, made unique by
//! create's AlreadyExists).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use futures::StreamExt;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::core::{ApiResource, DynamicObject};
use kube::runtime::watcher;
use serde_json::json;
use sha2::{Digest, Sha256};
use tokio::sync::broadcast;

use super::records::AuditEvent;
use super::store::{AuditQuery, Change, Error, Kind, Result, Store};

/// The CRD's group.
pub const GROUP: &str = "compute.dev";
/// Its version.
pub const VERSION: &str = "v1";
/// Its kind.
pub const KIND: &str = "PlatformRecord";
/// Its plural.
pub const PLURAL: &str = "platformrecords";
/// The label naming a record's kind.
pub const KIND_LABEL: &str = "compute.dev/record-kind";

const AUDIT: &str = "audit";
/// The label of an audit event's object naming its platform namespace.
const AUDIT_NAMESPACE_LABEL: &str = "compute.dev/audit-namespace";

/// The `PlatformRecord` resource.
pub fn resource() -> ApiResource {
    ApiResource {
        group: GROUP.into(),
        version: VERSION.into(),
        api_version: format!("{GROUP}/{VERSION}"),
        kind: KIND.into(),
        plural: PLURAL.into(),
    }
}

fn word(kind: Kind) -> &'static str {
    match kind {
        Kind::Namespace => "namespace",
        Kind::ApiKey => "apikey",
        Kind::Binding => "binding",
        Kind::Environment => "environment",
    }
}

fn kind_of(word: &str) -> Option<Kind> {
    Kind::ALL.into_iter().find(|k| self::word(*k) == word)
}

/// The object name of a record.
pub fn object_name(kind: Kind, key: &str) -> String {
    let h = hex::encode(Sha256::digest(key.as_bytes()));
    format!("{}-{}", word(kind), &h[..40])
}

fn backend(e: impl std::fmt::Display) -> Error {
    Error::Backend(e.to_string())
}

fn status_code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(s) => Some(s.code),
        _ => None,
    }
}

/// The store in a cluster.
pub struct Kube {
    api: Api<DynamicObject>,
    changes: broadcast::Sender<Change>,
    last_seq: AtomicU64,
    watch: tokio::task::JoinHandle<()>,
}

impl Drop for Kube {
    fn drop(&mut self) {
        self.watch.abort();
    }
}

impl Kube {
    /// The store in `namespace` (the platform's Kubernetes namespace) through `client`;
    /// starts the watch that feeds [`Store::watch`] (needs a tokio runtime).
    pub fn new(client: kube::Client, namespace: &str) -> Self {
        let api: Api<DynamicObject> = Api::namespaced_with(client, namespace, &resource());
        let (changes, _) = broadcast::channel(256);
        let tx = changes.clone();
        let w = api.clone();
        let watch = tokio::spawn(async move {
            let cfg = watcher::Config::default().labels(KIND_LABEL);
            let mut events = watcher(w, cfg).boxed();
            while let Some(ev) = events.next().await {
                let (obj, present) = match ev {
                    Ok(watcher::Event::Apply(o)) | Ok(watcher::Event::InitApply(o)) => (o, true),
                    Ok(watcher::Event::Delete(o)) => (o, false),
                    Ok(_) => continue,
                    // The watcher retries by itself; a gap may have hidden changes.
                    Err(e) => {
                        tracing::warn!(error = %e, "platform store watch interrupted");
                        continue;
                    }
                };
                let labels = obj.metadata.labels.as_ref();
                let Some(kind) = labels
                    .and_then(|l| l.get(KIND_LABEL))
                    .and_then(|w| kind_of(w))
                else {
                    continue;
                };
                let key = obj.data["spec"]["key"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                let _ = tx.send(Change { kind, key, present });
            }
        });
        Self {
            api,
            changes,
            last_seq: AtomicU64::new(0),
            watch,
        }
    }

    fn object(name: &str, kind_word: &str, key: &str, doc: &[u8]) -> Result<DynamicObject> {
        let doc = std::str::from_utf8(doc).map_err(backend)?;
        let mut o = DynamicObject::new(name, &resource()).data(json!({
            "spec": {"kind": kind_word, "key": key, "doc": doc}
        }));
        o.metadata.labels = Some(
            [
                (KIND_LABEL.to_string(), kind_word.to_string()),
                (
                    "app.kubernetes.io/managed-by".to_string(),
                    "computed".to_string(),
                ),
            ]
            .into(),
        );
        Ok(o)
    }

    fn doc_of(o: &DynamicObject) -> Option<(String, Vec<u8>)> {
        let spec = &o.data["spec"];
        Some((
            spec["key"].as_str()?.to_string(),
            spec["doc"].as_str()?.as_bytes().to_vec(),
        ))
    }

    async fn list_kind(&self, kind_word: &str) -> Result<Vec<DynamicObject>> {
        let lp = ListParams::default().labels(&format!("{KIND_LABEL}={kind_word}"));
        Ok(self.api.list(&lp).await.map_err(backend)?.items)
    }
}

#[async_trait::async_trait]
impl Store for Kube {
    async fn create(&self, kind: Kind, key: &str, doc: Vec<u8>) -> Result<()> {
        let o = Self::object(&object_name(kind, key), word(kind), key, &doc)?;
        match self.api.create(&PostParams::default(), &o).await {
            Ok(_) => Ok(()),
            Err(e) if status_code(&e) == Some(409) => Err(Error::AlreadyExists {
                kind,
                key: key.to_string(),
            }),
            Err(e) => Err(backend(e)),
        }
    }

    async fn put(&self, kind: Kind, key: &str, doc: Vec<u8>) -> Result<()> {
        let name = object_name(kind, key);
        // Read, then replace at that resourceVersion (or create); a conflict is retried.
        for _ in 0..8 {
            let mut o = Self::object(&name, word(kind), key, &doc)?;
            let r = match self.api.get_opt(&name).await.map_err(backend)? {
                Some(cur) => {
                    o.metadata.resource_version = cur.metadata.resource_version;
                    self.api.replace(&name, &PostParams::default(), &o).await
                }
                None => self.api.create(&PostParams::default(), &o).await,
            };
            match r {
                Ok(_) => return Ok(()),
                Err(e) if status_code(&e) == Some(409) => continue,
                Err(e) => return Err(backend(e)),
            }
        }
        Err(Error::Backend(format!(
            "{kind:?} {key}: kept conflicting with other writers"
        )))
    }

    async fn get(&self, kind: Kind, key: &str) -> Result<Option<Vec<u8>>> {
        let o = self
            .api
            .get_opt(&object_name(kind, key))
            .await
            .map_err(backend)?;
        Ok(o.as_ref().and_then(Self::doc_of).map(|(_, d)| d))
    }

    async fn delete(&self, kind: Kind, key: &str) -> Result<bool> {
        match self
            .api
            .delete(&object_name(kind, key), &DeleteParams::default())
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if status_code(&e) == Some(404) => Ok(false),
            Err(e) => Err(backend(e)),
        }
    }

    async fn list(&self, kind: Kind, prefix: &str) -> Result<Vec<(String, Vec<u8>)>> {
        let mut out: Vec<(String, Vec<u8>)> = self
            .list_kind(word(kind))
            .await?
            .iter()
            .filter_map(Self::doc_of)
            .filter(|(k, _)| k.starts_with(prefix))
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }

    async fn audit(&self, mut event: AuditEvent) -> Result<u64> {
        let now = chrono::Utc::now().timestamp_micros().max(0) as u64;
        let mut seq = now.max(self.last_seq.load(Ordering::SeqCst) + 1);
        for _ in 0..8 {
            event.seq = seq;
            let doc = serde_json::to_vec(&event).map_err(backend)?;
            let mut o = Self::object(&format!("{AUDIT}-{seq:020}"), AUDIT, &seq.to_string(), &doc)?;
            // Labelled with its namespace when that is a valid one (a denied call may name
            // anything; a query only ever asks for a valid one).
            let valid = super::records::check_name("namespace", &event.namespace).is_ok();
            if let (true, Some(l)) = (valid, o.metadata.labels.as_mut()) {
                l.insert(AUDIT_NAMESPACE_LABEL.into(), event.namespace.clone());
            }
            match self.api.create(&PostParams::default(), &o).await {
                Ok(_) => {
                    self.last_seq.fetch_max(seq, Ordering::SeqCst);
                    return Ok(seq);
                }
                Err(e) if status_code(&e) == Some(409) => seq += 1,
                Err(e) => return Err(backend(e)),
            }
        }
        Err(Error::Backend("audit: no free sequence number".into()))
    }

    async fn audit_tail(&self, q: &AuditQuery) -> Result<Vec<AuditEvent>> {
        let mut selector = format!("{KIND_LABEL}={AUDIT}");
        if !q.namespace.is_empty() {
            selector.push_str(&format!(",{AUDIT_NAMESPACE_LABEL}={}", q.namespace));
        }
        let lp = ListParams::default().labels(&selector);
        let mut evs: Vec<AuditEvent> = self
            .api
            .list(&lp)
            .await
            .map_err(backend)?
            .items
            .iter()
            .filter_map(Self::doc_of)
            .filter_map(|(_, d)| serde_json::from_slice::<AuditEvent>(&d).ok())
            .filter(|e| q.matches(e))
            .collect();
        evs.sort_by_key(|e| e.seq);
        let skip = evs.len().saturating_sub(q.limit);
        evs.drain(..skip);
        Ok(evs)
    }

    async fn audit_since(&self, after_seq: u64, limit: usize) -> Result<Vec<AuditEvent>> {
        let mut evs: Vec<AuditEvent> = self
            .list_kind(AUDIT)
            .await?
            .iter()
            .filter_map(Self::doc_of)
            .filter_map(|(_, d)| serde_json::from_slice::<AuditEvent>(&d).ok())
            .filter(|e| e.seq > after_seq)
            .collect();
        evs.sort_by_key(|e| e.seq);
        evs.truncate(limit);
        Ok(evs)
    }

    fn watch(&self) -> broadcast::Receiver<Change> {
        self.changes.subscribe()
    }
}

/// The store as a shared trait object.
pub fn shared(client: kube::Client, namespace: &str) -> Arc<dyn Store> {
    Arc::new(Kube::new(client, namespace))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn object_names_are_dns_labels_and_kinds_round_trip() {
        for kind in Kind::ALL {
            assert_eq!(kind_of(word(kind)), Some(kind));
            let n = object_name(kind, "team-a/Some Key/with slashes");
            assert!(n.len() <= 63, "{n}");
            assert!(
                super::super::records::check_name("object", &n).is_ok(),
                "{n}"
            );
            assert_ne!(n, object_name(kind, "team-a/other"));
        }
        assert_eq!(kind_of(AUDIT), None);
        let o = Kube::object("binding-x", "binding", "team-a/k1", br#"{"a":1}"#).unwrap();
        assert_eq!(
            Kube::doc_of(&o),
            Some(("team-a/k1".to_string(), br#"{"a":1}"#.to_vec()))
        );
        assert_eq!(
            o.metadata
                .labels
                .unwrap()
                .get(KIND_LABEL)
                .map(String::as_str),
            Some("binding")
        );
    }
}
