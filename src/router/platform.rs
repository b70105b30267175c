//! The platform API's sandboxes through the router: the nodes as a
//! [`crate::platform::sandboxes::Cluster`] (owner lookup, the ready nodes for a fanned-out
//! List, placement for a Create).

use tonic::transport::Channel;
use tonic::Status;

use super::Router;
use crate::platform::sandboxes::Cluster;

/// Memory a platform sandbox is placed for when its request names none.
const PLACE_MEMORY: u64 = 1 << 30;

#[tonic::async_trait]
impl Cluster for Router {
    async fn owner(&self, sandbox_id: &str) -> Result<Channel, Status> {
        let n = match Router::owner(self, sandbox_id).await {
            Ok(n) => n,
            // The platform's words for an id no node has.
            Err(super::Error::NotFound(_)) => {
                return Err(Status::not_found(format!("sandbox {sandbox_id} not found")))
            }
            Err(e) => return Err(e.into()),
        };
        Ok(self.node_channel(&n)?)
    }

    fn nodes(&self) -> Vec<Channel> {
        self.named_nodes().into_iter().map(|(_, c)| c).collect()
    }

    fn named_nodes(&self) -> Vec<(String, Channel)> {
        self.ready_nodes()
            .into_iter()
            .filter_map(|(n, _)| Some((n.name.clone(), self.node_channel(&n).ok()?)))
            .collect()
    }

    fn place(&self, namespace: &str, key: &str) -> Vec<(String, Channel)> {
        self.placement(namespace, &format!("platform/{key}"), PLACE_MEMORY)
            .into_iter()
            .filter_map(|n| Some((n.name.clone(), self.node_channel(&n).ok()?)))
            .collect()
    }

    fn remember(&self, sandbox_id: &str, node: &str) {
        Router::remember(self, sandbox_id, node);
    }
}
