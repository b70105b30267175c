//! Owner lookup: the node that owns a sandbox, from a bounded cache filled by creates and
//! lookups, else by asking every ready node in parallel; and the node that hosts a sandbox's
//! relay traffic.

use std::time::Duration;

use tonic::Code;

use super::{lock, score, Error, NodeEndpoint, Result, Router};
use crate::api::compute::v1 as pb;

impl Router {
    /// Caches the owner of a sandbox (the whole cache is dropped when it is full).
    pub(super) fn remember(&self, sandbox_id: &str, node: &str) {
        let mut owners = lock(&self.inner.owners);
        if owners.len() >= self.inner.settings.cache_size {
            owners.clear();
        }
        owners.insert(sandbox_id.to_string(), node.to_string());
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
}
