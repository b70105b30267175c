//! Placement: a new sandbox goes to the ready, non-draining, uncordoned node with room that
//! wins a rendezvous hash of (tenant_id, session_id), so every replica picks the same node for
//! a session from the same node set; the next candidates are tried when that one is down.

use sha2::{Digest, Sha256};
use tonic::Code;
use tracing::debug;

use super::{lock, Error, NodeEndpoint, Result, Router};
use crate::api::compute::v1 as pb;

/// Rendezvous (highest random weight) score of a key on a node.
pub fn score(key: &str, node: &str) -> u64 {
    let h = Sha256::new()
        .chain_update(key.as_bytes())
        .chain_update([0])
        .chain_update(node.as_bytes())
        .finalize();
    u64::from_be_bytes(h[..8].try_into().unwrap_or([0; 8]))
}

impl Router {
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
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::time::Instant;

    use tokio::sync::watch;

    use super::super::health::Health;
    use super::super::{NodeSet, Settings};
    use super::*;
    use crate::api::node::v1::GetInfoResponse;

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
