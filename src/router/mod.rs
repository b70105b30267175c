//! The cluster router: a thin, stateless front that forwards every ComputeService call to the
//! node daemon that owns the sandbox.
//!
//! * **Discovery**: the set of node daemons comes from a static list or from the Kubernetes API
//!   (the ready pods of the node DaemonSet), and changes live.
//! * **Health**: every node is asked for its `node.v1.NodeInfo` every `poll_interval`; a node
//!   that does not answer within a second is not ready.
//! * **Placement**: CreateSandbox goes to the ready, non-draining node with room that wins a
//!   rendezvous hash of (tenant_id, session_id). Every replica computes the same winner from the
//!   same node set, and the node answers a repeated Create for a live session with the same
//!   sandbox, so one sandbox per session holds across replicas.
//! * **Routing**: every other call goes to the node that answered the create (cached); on a
//!   miss (another replica placed it, or this one restarted) all nodes are asked in parallel and
//!   the answer is cached. A node that is gone makes its sandboxes' calls fail fast with
//!   UNAVAILABLE.
//! * **TLS**: with `--node-tls-ca` every node is dialed with TLS (`https`), with a client
//!   certificate too for mutual TLS, and never in plaintext ([`tls`]); the relay services use
//!   the same channels. The router's own listener can serve TLS as the node's does.

pub mod discovery;
pub mod service;
pub mod tls;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use tokio::sync::watch;
use tonic::transport::{Channel, Endpoint};
use tonic::Code;
use tracing::{debug, info, warn};

use crate::api::compute::v1 as pb;
use crate::api::compute::v1::compute_service_client::ComputeServiceClient;
use crate::api::node::v1::node_info_client::NodeInfoClient;
use crate::api::node::v1::{GetInfoRequest, GetInfoResponse};

/// Errors of the router, as its callers see them.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A request field is malformed.
    #[error("{0}")]
    InvalidArgument(String),
    /// No node knows the sandbox.
    #[error("sandbox {0} not found")]
    NotFound(String),
    /// The node owning the sandbox (or every node) cannot be reached.
    #[error("{0}")]
    Unavailable(String),
    /// The node answered with an error: passed through as it is.
    #[error("{0}")]
    Node(tonic::Status),
}

impl From<Error> for tonic::Status {
    fn from(e: Error) -> Self {
        match e {
            Error::InvalidArgument(m) => tonic::Status::invalid_argument(m),
            Error::NotFound(id) => tonic::Status::not_found(format!("sandbox {id} not found")),
            Error::Unavailable(m) => {
                warn!(error = %m, "unavailable");
                tonic::Status::unavailable(m)
            }
            Error::Node(s) => s,
        }
    }
}

type Result<T> = std::result::Result<T, Error>;

/// A node daemon as discovery reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeEndpoint {
    /// Its name (node name, or the URL for static lists).
    pub name: String,
    /// Its gRPC URL, e.g. `http://10.0.0.5:50051` (`https://` when nodes are dialed with TLS).
    pub url: String,
    /// The Kubernetes node is cordoned (unschedulable): no new sandboxes go there.
    pub cordoned: bool,
}

/// The node set: name → endpoint.
pub type NodeSet = BTreeMap<String, NodeEndpoint>;

#[derive(Debug, Clone)]
struct Health {
    info: Option<GetInfoResponse>,
    ok_at: Option<Instant>,
    /// A failure was logged since the last good poll (a node that never answers, e.g. one
    /// refusing our TLS handshake, is logged once, not every poll).
    failure_logged: bool,
}

/// Router settings.
#[derive(Debug, Clone)]
pub struct Settings {
    /// How often every node is polled.
    pub poll_interval: Duration,
    /// A node whose last good poll is older than this is not ready.
    pub stale_after: Duration,
    /// Connect timeout to a node.
    pub connect_timeout: Duration,
    /// Most sandbox → node entries cached.
    pub cache_size: usize,
    /// Dial nodes with TLS (and only with TLS): every node URL must then be `https://`.
    pub node_tls: Option<tls::NodeTls>,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            poll_interval: Duration::from_secs(1),
            stale_after: Duration::from_secs(4),
            connect_timeout: Duration::from_secs(1),
            cache_size: 100_000,
            node_tls: None,
        }
    }
}

struct Inner {
    settings: Settings,
    nodes: watch::Receiver<NodeSet>,
    channels: Mutex<HashMap<String, Channel>>,
    health: Mutex<HashMap<String, Health>>,
    owners: Mutex<HashMap<String, String>>,
}

/// The router. Cheap to clone.
#[derive(Clone)]
pub struct Router {
    inner: Arc<Inner>,
}

/// Rendezvous (highest random weight) score of a key on a node.
pub fn score(key: &str, node: &str) -> u64 {
    let h = Sha256::new()
        .chain_update(key.as_bytes())
        .chain_update([0])
        .chain_update(node.as_bytes())
        .finalize();
    u64::from_be_bytes(h[..8].try_into().unwrap_or([0; 8]))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Router {
    /// A router over the node set published by `nodes`.
    pub fn new(nodes: watch::Receiver<NodeSet>, settings: Settings) -> Self {
        Self {
            inner: Arc::new(Inner {
                settings,
                nodes,
                channels: Mutex::new(HashMap::new()),
                health: Mutex::new(HashMap::new()),
                owners: Mutex::new(HashMap::new()),
            }),
        }
    }

    fn node_set(&self) -> NodeSet {
        self.inner.nodes.borrow().clone()
    }

    fn channel(&self, n: &NodeEndpoint) -> Result<Channel> {
        let mut ch = lock(&self.inner.channels);
        if let Some(c) = ch.get(&n.url) {
            return Ok(c.clone());
        }
        let timeout = self.inner.settings.connect_timeout;
        let ep = Endpoint::from_shared(n.url.clone())
            .map_err(|e| Error::Unavailable(format!("bad node URL {}: {e}", n.url)))?
            .connect_timeout(timeout)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(10))
            .keep_alive_timeout(Duration::from_secs(5));
        // tonic dials an `http://` URL in plaintext even with TLS configured: the scheme is
        // checked here so that a node URL can never downgrade a TLS router.
        let https = n.url.starts_with("https://");
        let ep = match &self.inner.settings.node_tls {
            Some(tls) if https => ep.tls_config(tls.client_config(timeout)).map_err(|e| {
                Error::Unavailable(format!(
                    "node {}: TLS: {}",
                    n.url,
                    crate::server::error_chain(&e)
                ))
            })?,
            Some(_) => {
                return Err(Error::Unavailable(format!(
                    "node {}: refusing plaintext, the router dials nodes with TLS",
                    n.url
                )))
            }
            None if https => {
                return Err(Error::Unavailable(format!(
                    "node {}: TLS URL, but the router has no --node-tls-ca",
                    n.url
                )))
            }
            None => ep,
        };
        let c = ep.connect_lazy();
        ch.insert(n.url.clone(), c.clone());
        Ok(c)
    }

    /// A ComputeService client to a node.
    pub fn client(&self, n: &NodeEndpoint) -> Result<ComputeServiceClient<Channel>> {
        Ok(ComputeServiceClient::new(self.channel(n)?)
            .max_decoding_message_size(crate::server::MAX_MESSAGE)
            .max_encoding_message_size(crate::server::MAX_MESSAGE))
    }

    /// Whether a node answered its last poll recently.
    pub fn is_ready(&self, name: &str) -> bool {
        lock(&self.inner.health)
            .get(name)
            .and_then(|h| h.ok_at)
            .is_some_and(|t| t.elapsed() < self.inner.settings.stale_after)
    }

    /// Ready nodes with their last report.
    pub fn ready_nodes(&self) -> Vec<(NodeEndpoint, GetInfoResponse)> {
        let set = self.node_set();
        let health = lock(&self.inner.health);
        set.values()
            .filter_map(|n| {
                let h = health.get(&n.name)?;
                let fresh = h.ok_at?.elapsed() < self.inner.settings.stale_after;
                Some((n.clone(), h.info.clone()?)).filter(|_| fresh)
            })
            .collect()
    }

    async fn poll_one(&self, n: NodeEndpoint) {
        let timeout = self.inner.settings.connect_timeout;
        let answer = match self.channel(&n) {
            Ok(ch) => {
                let mut client = NodeInfoClient::new(ch);
                let fut = client.get_info(GetInfoRequest {});
                match tokio::time::timeout(timeout, fut).await {
                    Ok(Ok(r)) => Ok(r.into_inner()),
                    // The transport's cause (refused, TLS handshake, certificate) is in the
                    // status's sources.
                    Ok(Err(s)) => Err(match std::error::Error::source(&s) {
                        Some(cause) => crate::server::error_chain(cause),
                        None => s.message().to_string(),
                    }),
                    Err(_) => Err(format!("no answer within {timeout:?}")),
                }
            }
            Err(e) => Err(e.to_string()),
        };
        let mut health = lock(&self.inner.health);
        let h = health.entry(n.name.clone()).or_insert(Health {
            info: None,
            ok_at: None,
            failure_logged: false,
        });
        match answer {
            Ok(info) => {
                if h.ok_at.is_none() {
                    info!(node = %n.name, url = %n.url, "node ready");
                }
                h.info = Some(info);
                h.ok_at = Some(Instant::now());
                h.failure_logged = false;
            }
            Err(error) => {
                h.ok_at = None;
                if !h.failure_logged {
                    warn!(node = %n.name, url = %n.url, %error, "node not answering");
                    h.failure_logged = true;
                }
            }
        }
    }

    /// Polls every node once.
    pub async fn poll(&self) {
        let set = self.node_set();
        {
            // Forget nodes that left the set.
            let mut health = lock(&self.inner.health);
            health.retain(|name, _| set.contains_key(name));
            let urls: Vec<String> = set.values().map(|n| n.url.clone()).collect();
            lock(&self.inner.channels).retain(|u, _| urls.contains(u));
        }
        futures::future::join_all(set.values().cloned().map(|n| self.poll_one(n))).await;
    }

    /// Polls every node every `poll_interval`, and at once when the node set changes.
    pub fn spawn_health_loop(&self) -> tokio::task::JoinHandle<()> {
        let r = self.clone();
        tokio::spawn(async move {
            let mut changes = r.inner.nodes.clone();
            loop {
                r.poll().await;
                tokio::select! {
                    _ = tokio::time::sleep(r.inner.settings.poll_interval) => {}
                    c = changes.changed() => {
                        if c.is_err() {
                            return;
                        }
                    }
                }
            }
        })
    }

    fn remember(&self, sandbox_id: &str, node: &str) {
        let mut owners = lock(&self.inner.owners);
        if owners.len() >= self.inner.settings.cache_size {
            owners.clear();
        }
        owners.insert(sandbox_id.to_string(), node.to_string());
    }

    /// The candidates for a new sandbox, best first: ready, not draining, with room, ordered by
    /// rendezvous score of the session key.
    pub fn placement(&self, tenant: &str, session: &str, memory: u64) -> Vec<NodeEndpoint> {
        let key = format!("{tenant}\0{session}");
        let mut c: Vec<(u64, NodeEndpoint)> = self
            .ready_nodes()
            .into_iter()
            .filter(|(n, i)| {
                !i.draining
                    && !n.cordoned
                    && (i.max_sandboxes == 0
                        // A node gives a pool member up for a tenant's sandbox.
                        || i.live_sandboxes.saturating_sub(i.pool_sandboxes) < i.max_sandboxes)
                    && i.free_memory_bytes >= memory
            })
            .map(|(n, _)| (score(&key, &n.name), n))
            .collect();
        c.sort_by_key(|(score, _)| std::cmp::Reverse(*score));
        c.into_iter().map(|(_, n)| n).collect()
    }

    /// Forwards a CreateSandbox to the placed node (the next candidate if that one is down).
    pub async fn create(&self, req: pb::CreateSandboxRequest) -> Result<pb::CreateSandboxResponse> {
        if req.tenant_id.is_empty() || req.session_id.is_empty() {
            return Err(Error::InvalidArgument(
                "tenant_id and session_id are required".into(),
            ));
        }
        let memory = req
            .limits
            .as_ref()
            .map(|l| l.memory_bytes)
            .filter(|m| *m > 0)
            .unwrap_or(1 << 30);
        let candidates = self.placement(&req.tenant_id, &req.session_id, memory);
        if candidates.is_empty() {
            return Err(Error::Unavailable(
                "no ready node with room for a new sandbox".into(),
            ));
        }
        let mut last = None;
        for n in candidates.iter().take(3) {
            match self.client(n)?.create_sandbox(req.clone()).await {
                Ok(r) => {
                    let r = r.into_inner();
                    self.remember(&r.sandbox_id, &n.name);
                    debug!(node = %n.name, sandbox_id = %r.sandbox_id, "placed");
                    return Ok(r);
                }
                Err(s) if s.code() == Code::Unavailable => {
                    lock(&self.inner.health).remove(&n.name);
                    last = Some(s);
                }
                Err(s) => return Err(Error::Node(s)),
            }
        }
        Err(Error::Unavailable(format!(
            "no node accepted the sandbox: {}",
            last.map(|s| s.message().to_string()).unwrap_or_default()
        )))
    }

    /// The node owning `sandbox_id`: from the cache, else by asking every ready node.
    pub async fn owner(&self, sandbox_id: &str) -> Result<NodeEndpoint> {
        if uuid::Uuid::parse_str(sandbox_id).is_err() {
            return Err(Error::InvalidArgument(format!(
                "sandbox_id {sandbox_id:?} is not a valid UUID"
            )));
        }
        let set = self.node_set();
        let cached = lock(&self.inner.owners).get(sandbox_id).cloned();
        if let Some(name) = cached {
            return match set.get(&name) {
                Some(n) if self.is_ready(&n.name) => Ok(n.clone()),
                _ => Err(Error::Unavailable(format!(
                    "node {name} owning sandbox {sandbox_id} is unavailable"
                ))),
            };
        }
        let asks = set.values().cloned().map(|n| async move {
            if !self.is_ready(&n.name) {
                return (n, None);
            }
            let r = match self.client(&n) {
                Ok(mut c) => {
                    let fut = c.describe_sandbox(pb::DescribeSandboxRequest {
                        sandbox_id: sandbox_id.to_string(),
                    });
                    tokio::time::timeout(Duration::from_secs(2), fut).await.ok()
                }
                Err(_) => None,
            };
            (n, r)
        });
        let mut unreachable = 0;
        for (n, r) in futures::future::join_all(asks).await {
            match r {
                Some(Ok(_)) => {
                    self.remember(sandbox_id, &n.name);
                    return Ok(n);
                }
                Some(Err(s)) if s.code() == Code::NotFound => {}
                _ => unreachable += 1,
            }
        }
        if unreachable > 0 {
            Err(Error::Unavailable(format!(
                "sandbox {sandbox_id} not found on the reachable nodes; {unreachable} node(s) unreachable"
            )))
        } else {
            Err(Error::NotFound(sandbox_id.to_string()))
        }
    }

    /// The node that hosts relay traffic for `sandbox_id`: the node owning that sandbox when it
    /// is one of ours, else the ready node that wins a rendezvous hash of the id (where an
    /// external worker with that id attaches through any router replica).
    pub async fn relay_node(&self, sandbox_id: &str) -> Result<NodeEndpoint> {
        if uuid::Uuid::parse_str(sandbox_id).is_ok() {
            match self.owner(sandbox_id).await {
                Ok(n) => return Ok(n),
                Err(Error::NotFound(_)) => {}
                Err(e) => return Err(e),
            }
        }
        self.ready_nodes()
            .into_iter()
            .map(|(n, _)| n)
            .max_by_key(|n| score(sandbox_id, &n.name))
            .ok_or_else(|| Error::Unavailable("no ready node".into()))
    }

    /// A channel to a node (for the relay services).
    pub fn node_channel(&self, n: &NodeEndpoint) -> Result<Channel> {
        self.channel(n)
    }

    /// Marks a node down after a failed call, so the next calls fail fast.
    pub fn node_failed(&self, n: &NodeEndpoint, status: &tonic::Status) {
        if status.code() == Code::Unavailable {
            if let Some(h) = lock(&self.inner.health).get_mut(&n.name) {
                h.ok_at = None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(name: &str, draining: bool, live: u32, free: u64) -> GetInfoResponse {
        GetInfoResponse {
            node_name: name.into(),
            live_sandboxes: live,
            max_sandboxes: 10,
            free_memory_bytes: free,
            draining,
            ..Default::default()
        }
    }

    #[test]
    fn placement_skips_draining_cordoned_full_and_stale_nodes_not_pooled_ones() {
        let mut set = NodeSet::new();
        for (name, cordoned) in [
            ("ok1", false),
            ("ok2", false),
            ("drain", false),
            ("cordon", true),
            ("full", false),
            ("pooled", false),
            ("small", false),
            ("stale", false),
        ] {
            set.insert(
                name.into(),
                NodeEndpoint {
                    name: name.into(),
                    url: format!("http://{name}:1"),
                    cordoned,
                },
            );
        }
        let (_tx, rx) = watch::channel(set);
        let r = Router::new(rx, Settings::default());
        {
            let mut h = lock(&r.inner.health);
            let fresh = |i| Health {
                info: Some(i),
                ok_at: Some(Instant::now()),
                failure_logged: false,
            };
            h.insert("ok1".into(), fresh(info("ok1", false, 0, 8 << 30)));
            h.insert("ok2".into(), fresh(info("ok2", false, 3, 8 << 30)));
            h.insert("drain".into(), fresh(info("drain", true, 0, 8 << 30)));
            h.insert("cordon".into(), fresh(info("cordon", false, 0, 8 << 30)));
            h.insert("full".into(), fresh(info("full", false, 10, 8 << 30)));
            // At its maximum, but two of its ten are warm-pool members it gives up.
            h.insert(
                "pooled".into(),
                fresh(GetInfoResponse {
                    pool_sandboxes: 2,
                    ..info("pooled", false, 10, 8 << 30)
                }),
            );
            h.insert("small".into(), fresh(info("small", false, 0, 100 << 20)));
            h.insert(
                "stale".into(),
                Health {
                    info: Some(info("stale", false, 0, 8 << 30)),
                    ok_at: None,
                    failure_logged: false,
                },
            );
        }
        for i in 0..50 {
            let p = r.placement("t", &format!("s{i}"), 1 << 30);
            let names: Vec<_> = p.iter().map(|n| n.name.as_str()).collect();
            assert!(
                names.len() == 3
                    && names.contains(&"ok1")
                    && names.contains(&"ok2")
                    && names.contains(&"pooled"),
                "{names:?}"
            );
            // The same session always gets the same first choice.
            assert_eq!(r.placement("t", &format!("s{i}"), 1 << 30)[0], p[0]);
        }
    }

    #[tokio::test]
    async fn a_tls_router_never_dials_a_node_in_plaintext() {
        let d = tempfile::tempdir().unwrap();
        tls::write_test_pki(d.path());
        let node_tls = tls::NodeTls::load(
            Some(&d.path().join("ca.pem")),
            Some(&d.path().join("cert.pem")),
            Some(&d.path().join("key.pem")),
            None,
        )
        .unwrap();
        let node = |url: &str| NodeEndpoint {
            name: "n".into(),
            url: url.into(),
            cordoned: false,
        };
        let router = |node_tls| {
            let (_tx, rx) = watch::channel(NodeSet::new());
            Router::new(
                rx,
                Settings {
                    node_tls,
                    ..Settings::default()
                },
            )
        };
        let with_tls = router(node_tls);
        assert!(with_tls.channel(&node("https://127.0.0.1:1")).is_ok());
        match with_tls.channel(&node("http://127.0.0.1:1")) {
            Err(Error::Unavailable(m)) => assert!(m.contains("refusing plaintext"), "{m}"),
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("a TLS router made a plaintext channel"),
        }
        let plain = router(None);
        assert!(plain.channel(&node("http://127.0.0.1:1")).is_ok());
        assert!(plain.channel(&node("https://127.0.0.1:1")).is_err());
    }

    #[test]
    fn rendezvous_is_stable_and_spreads() {
        let nodes = ["a", "b", "c"];
        let mut counts = HashMap::new();
        for i in 0..3000 {
            let key = format!("t\0s{i}");
            let best = nodes.iter().max_by_key(|n| score(&key, n)).unwrap();
            *counts.entry(*best).or_insert(0) += 1;
            // Removing a node that did not win does not move the key.
            let other: Vec<_> = nodes.iter().filter(|n| *n != best).collect();
            let without = nodes
                .iter()
                .filter(|n| *n != other[0])
                .max_by_key(|n| score(&key, n))
                .unwrap();
            assert_eq!(without, best);
        }
        for n in nodes {
            assert!(counts[n] > 800, "{counts:?}");
        }
    }
}
