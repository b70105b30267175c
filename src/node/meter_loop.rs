//! Usage between execs: one loop for the whole node samples every live sandbox's meter (for
//! lifetime memory averages and peaks), publishes the metrics, and persists meter states into
//! the records so that usage survives a daemon restart.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use super::{blocking, record, Node, Sandbox, Status};
use crate::metering::meter::{Meter, Persisted};

impl Node {
    /// One loop for the whole node: every `meter_interval_ms` it ticks the meter of every live
    /// sandbox in a single blocking task (for lifetime memory averages and peaks between
    /// execs), and every `usage_persist_secs` writes changed meter states to the container
    /// labels, so usage survives a daemon restart.
    pub(super) fn spawn_meter_loop(&self) {
        let node = self.clone();
        self.inner.tasks.spawn(async move {
            let cfg = &node.inner.cfg;
            let mut tick =
                tokio::time::interval(Duration::from_millis(cfg.meter_interval_ms.max(100)));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let persist_every = Duration::from_secs(cfg.usage_persist_secs.max(1));
            let mut last_persist = std::time::Instant::now();
            let mut persisted: HashMap<String, Persisted> = HashMap::new();
            loop {
                tick.tick().await;
                let live: Vec<Arc<Sandbox>> = node
                    .list()
                    .into_iter()
                    .filter(|sb| sb.status() != Status::Destroyed)
                    .collect();
                let meters: Vec<Arc<Meter>> = live.iter().map(|sb| sb.meter.clone()).collect();
                let usages =
                    blocking(move || meters.iter().map(|m| m.lifetime()).collect::<Vec<_>>())
                        .await
                        .unwrap_or_default();
                let metrics = &crate::metrics::METRICS;
                for (sb, u) in live.iter().zip(usages.iter()) {
                    // A sandbox destroyed meanwhile has had its series removed: keep it so.
                    // Pool members belong to nobody: no tenant series (yet).
                    if sb.status() != Status::Destroyed && !sb.pool {
                        metrics.sandbox_usage(&sb.metric_labels(), u);
                    }
                }
                let mut by_status: HashMap<&'static str, i64> =
                    Status::ALL.iter().map(|s| (s.word(), 0)).collect();
                for sb in node.list().iter().filter(|sb| !sb.pool) {
                    *by_status.entry(sb.status().word()).or_default() += 1;
                }
                for (status, n) in by_status {
                    metrics
                        .sandboxes
                        .get_or_create(&crate::metrics::StatusLabels {
                            status: status.into(),
                        })
                        .set(n);
                }
                if last_persist.elapsed() < persist_every {
                    continue;
                }
                last_persist = std::time::Instant::now();
                persisted.retain(|id, _| live.iter().any(|sb| &sb.id == id));
                // A pool member's usage is reset when it is claimed: nothing to keep.
                for sb in live.iter().filter(|sb| !sb.pool) {
                    let meter = sb.meter.clone();
                    let Ok(p) = blocking(move || meter.persisted()).await else {
                        continue;
                    };
                    if persisted.get(&sb.id) != Some(&p) {
                        node.persist_usage(sb, &p).await;
                        persisted.insert(sb.id.clone(), p);
                    }
                }
            }
        });
    }

    pub(super) async fn persist_usage(&self, sb: &Sandbox, p: &Persisted) {
        if let Err(e) = self
            .inner
            .rt
            .set_labels(&sb.id, record::usage_labels(p))
            .await
        {
            tracing::debug!(sandbox_id = %sb.id, error = %e, "could not persist usage");
        }
    }
}
