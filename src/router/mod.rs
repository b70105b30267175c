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
//! * **Previews**: with `--preview-listen`, preview URLs are proxied to the owning node's
//!   preview listener by their host name ([`preview`]).

pub mod discovery;
pub mod preview;
pub mod service;
pub mod tls;

mod dial;
mod health;
mod owners;
mod placement;
mod platform;
mod relay;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tonic::transport::Channel;
use tracing::warn;

use health::Health;
pub use placement::score;

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

/// The router's state, shared by its clones.
struct Inner {
    settings: Settings,
    /// The node set, as discovery publishes it.
    nodes: watch::Receiver<NodeSet>,
    /// A lazily connected channel per node URL ([`dial`]).
    channels: Mutex<HashMap<String, Channel>>,
    /// The last poll of each node ([`health`]).
    health: Mutex<HashMap<String, Health>>,
    /// Sandbox id → the name of the node that owns it ([`owners`]).
    owners: Mutex<HashMap<String, String>>,
    /// Every background task of the router (health loop, stream forwarders).
    tasks: crate::tasks::Tasks,
}

/// The router. Cheap to clone.
#[derive(Clone)]
pub struct Router {
    inner: Arc<Inner>,
}

/// Locks `m`, also after a panic while it was held (the maps stay usable).
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
                tasks: crate::tasks::Tasks::new(),
            }),
        }
    }

    /// The router's background tasks ([`crate::tasks::Tasks::shutdown`] stops them).
    pub fn tasks(&self) -> &crate::tasks::Tasks {
        &self.inner.tasks
    }

    /// The node set now.
    fn node_set(&self) -> NodeSet {
        self.inner.nodes.borrow().clone()
    }
}
