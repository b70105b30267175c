//! `node.v1.NodeInfo`: what the node tells the router about its capacity.

use std::time::SystemTime;

use tonic::{Request, Response, Status};

use crate::api::node::v1 as pb;
use crate::api::node::v1::node_info_server::NodeInfo;
use crate::node::Node;

/// The NodeInfo service over a [`Node`].
#[derive(Clone)]
pub struct InfoApi {
    node: Node,
    started: SystemTime,
}

impl InfoApi {
    /// Serves `node`.
    pub fn new(node: Node) -> Self {
        Self {
            node,
            started: SystemTime::now(),
        }
    }
}

/// The node's capacity report on the wire; `started` is when this daemon started.
pub fn report(node: &Node, started: SystemTime) -> pb::GetInfoResponse {
    let c = node.capacity();
    pb::GetInfoResponse {
        node_name: c.node_name,
        live_sandboxes: c.live_sandboxes,
        known_sandboxes: c.known_sandboxes,
        pool_sandboxes: c.pool_sandboxes,
        free_memory_bytes: c.free_memory_bytes,
        free_cpu_millis: c.free_cpu_millis,
        draining: c.draining,
        max_sandboxes: c.max_sandboxes,
        runtime: c.runtime,
        started_at: started
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or(0),
    }
}

#[tonic::async_trait]
impl NodeInfo for InfoApi {
    async fn get_info(
        &self,
        _req: Request<pb::GetInfoRequest>,
    ) -> Result<Response<pb::GetInfoResponse>, Status> {
        Ok(Response::new(report(&self.node, self.started)))
    }
}
