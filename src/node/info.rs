//! What the node tells the router about its capacity.

/// The node's capacity report (NodeInfo.GetInfo).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capacity {
    /// The node's name (configured, else the host name).
    pub node_name: String,
    /// STARTING or READY sandboxes, warm-pool members included.
    pub live_sandboxes: u32,
    /// Every sandbox the node knows (destroyed ones until GC).
    pub known_sandboxes: u32,
    /// READY pool members waiting to be claimed.
    pub pool_sandboxes: u32,
    /// MemAvailable minus the memory promised to live sandboxes.
    pub free_memory_bytes: u64,
    /// CPU millicores (cores × 1000 × overcommit) minus those promised.
    pub free_cpu_millis: u64,
    /// Whether the node takes no new sandboxes.
    pub draining: bool,
    /// Most sandboxes the node takes.
    pub max_sandboxes: u32,
    /// The containerd runtime name.
    pub runtime: String,
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

impl super::Node {
    /// The node's capacity report.
    pub fn capacity(&self) -> Capacity {
        let cfg = self.config();
        // Pool members count as live: they hold memory, CPU promises and a slot.
        let all = self.list();
        let live: Vec<_> = all.iter().filter(|s| s.status().is_live()).collect();
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
        Capacity {
            node_name,
            live_sandboxes: live.len() as u32,
            known_sandboxes: all.len() as u32,
            // Members waiting to be claimed, warm (booting ones are not waiting yet).
            pool_sandboxes: live.iter().filter(|s| self.is_warm(s)).count() as u32,
            free_memory_bytes: mem_available().saturating_sub(promised_mem),
            free_cpu_millis: cpu_total.saturating_sub(promised_cpu),
            draining: cfg.draining,
            max_sandboxes: cfg.max_sandboxes,
            runtime: self.runtime().choice().name.clone(),
        }
    }
}
