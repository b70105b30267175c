//! Node health: every node asked for its `node.v1.NodeInfo` every `poll_interval` (and at
//! once when the node set changes); a node that does not answer within the connect timeout,
//! or whose last good answer is older than `stale_after`, is not ready.

use std::time::Instant;

use tonic::Code;
use tracing::{info, warn};

use super::{lock, NodeEndpoint, Router};
use crate::api::node::v1::node_info_client::NodeInfoClient;
use crate::api::node::v1::{GetInfoRequest, GetInfoResponse};

/// The last poll of one node.
#[derive(Debug, Clone)]
pub(super) struct Health {
    /// Its last report.
    pub info: Option<GetInfoResponse>,
    /// When it last answered; `None` since a failed poll or call.
    pub ok_at: Option<Instant>,
    /// A failure was logged since the last good poll (a node that never answers, e.g. one
    /// refusing our TLS handshake, is logged once, not every poll).
    pub failure_logged: bool,
}

impl Router {
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
        self.inner.tasks.spawn(async move {
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

    /// Marks a node down after a failed call, so the next calls fail fast.
    pub fn node_failed(&self, n: &NodeEndpoint, status: &tonic::Status) {
        if status.code() == Code::Unavailable {
            if let Some(h) = lock(&self.inner.health).get_mut(&n.name) {
                h.ok_at = None;
            }
        }
    }
}
