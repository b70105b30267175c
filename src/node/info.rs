//! `node.v1.NodeInfo`: what the node tells the router about its capacity.

use std::time::SystemTime;

use tonic::{Request, Response, Status};

use super::{Node, Status as SbStatus};
use crate::api::node::v1 as pb;
use crate::api::node::v1::node_info_server::NodeInfo;

/// The NodeInfo service over a [`Node`].
#[derive(Clone)]
pub struct InfoService {
    node: Node,
    started: SystemTime,
}

impl InfoService {
    /// Serves `node`.
    pub fn new(node: Node) -> Self {
        Self {
            node,
            started: SystemTime::now(),
        }
    }
}

/// `MemAvailable` from /proc/meminfo, in bytes.
fn mem_available() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("MemAvailable:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<u64>().ok())
        })
        .map(|kb| kb * 1024)
        .unwrap_or(0)
}

impl Node {
    /// The node's capacity report.
    pub fn info(&self, started: SystemTime) -> pb::GetInfoResponse {
        let cfg = self.config();
        // Pool members count as live: they hold memory, CPU promises and a slot.
        let all = self.list();
        let live: Vec<_> = all
            .iter()
            .filter(|s| matches!(s.state().status, SbStatus::Starting | SbStatus::Ready))
            .collect();
        let promised_mem: u64 = live.iter().map(|s| s.limits.memory_bytes).sum();
        let promised_cpu: u64 = live.iter().map(|s| u64::from(s.limits.cpu_millis)).sum();
        let cores = std::thread::available_parallelism()
            .map(|n| n.get() as u64)
            .unwrap_or(1);
        let cpu_total = (cores as f64 * 1000.0 * cfg.cpu_overcommit) as u64;
        let node_name = if cfg.node_name.is_empty() {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|h| h.trim().to_string())
                .unwrap_or_default()
        } else {
            cfg.node_name.clone()
        };
        pb::GetInfoResponse {
            node_name,
            live_sandboxes: live.len() as u32,
            known_sandboxes: all.len() as u32,
            // Members waiting to be claimed (booting ones are not waiting yet).
            pool_sandboxes: live
                .iter()
                .filter(|s| s.pool && s.state().status == SbStatus::Ready)
                .count() as u32,
            free_memory_bytes: mem_available().saturating_sub(promised_mem),
            free_cpu_millis: cpu_total.saturating_sub(promised_cpu),
            draining: cfg.draining,
            max_sandboxes: cfg.max_sandboxes,
            runtime: self.runtime().choice.name.clone(),
            started_at: started
                .duration_since(SystemTime::UNIX_EPOCH)
                .map(|d| d.as_secs() as i64)
                .unwrap_or(0),
        }
    }
}

#[tonic::async_trait]
impl NodeInfo for InfoService {
    async fn get_info(
        &self,
        _req: Request<pb::GetInfoRequest>,
    ) -> Result<Response<pb::GetInfoResponse>, Status> {
        Ok(Response::new(self.node.info(self.started)))
    }
}
