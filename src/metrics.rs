//! Prometheus metrics, served as text on a separate HTTP port (`metrics_listen`).
//!
//! One process-wide registry: per-sandbox usage counters (labels `sandbox_id`, `tenant_id`),
//! sandboxes by status, RPC counts and latency by method and code, exec counts and durations,
//! and containerd call errors by operation.
//!
//! The same listener answers Kubernetes' HTTP probes: `/livez` (the process serves) and
//! `/readyz` (its gRPC health is SERVING), so the manifests need no gRPC probes (Kubernetes
//! 1.24+, and plaintext only: they cannot reach a TLS listener).

use std::sync::LazyLock;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::metering::Usage;

/// Labels of per-sandbox series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SandboxLabels {
    /// Sandbox id.
    pub sandbox_id: String,
    /// Tenant.
    pub tenant_id: String,
}

/// Labels of RPC series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RpcLabels {
    /// The RPC method.
    pub method: String,
    /// The gRPC code name.
    pub code: String,
}

/// Labels of series by method only.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MethodLabels {
    /// The RPC method.
    pub method: String,
}

/// Labels of the status gauge.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StatusLabels {
    /// The sandbox status.
    pub status: String,
}

/// Labels of exec series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ExecLabels {
    /// `exited`, `cancelled`, `timed_out`, `oom_killed` or `failed`.
    pub outcome: String,
}

/// Labels of containerd errors.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpLabels {
    /// The containerd operation, e.g. `Tasks.Start`.
    pub op: String,
}

fn latency() -> Histogram {
    Histogram::new(exponential_buckets(0.0005, 2.0, 18))
}

/// Every metric of the process.
pub struct Metrics {
    registry: Registry,
    /// Per-sandbox cumulative usage, one counter family per field.
    pub cpu_ms: Family<SandboxLabels, Counter>,
    /// Memory peak (gauge: it can be reset by nothing, but is not a count).
    pub memory_peak: Family<SandboxLabels, Gauge>,
    /// Disk bytes read.
    pub disk_read: Family<SandboxLabels, Counter>,
    /// Disk bytes written.
    pub disk_write: Family<SandboxLabels, Counter>,
    /// Network bytes out.
    pub net_egress: Family<SandboxLabels, Counter>,
    /// Network bytes in.
    pub net_ingress: Family<SandboxLabels, Counter>,
    /// Sandboxes by status.
    pub sandboxes: Family<StatusLabels, Gauge>,
    /// RPCs by method and code.
    pub rpcs: Family<RpcLabels, Counter>,
    /// RPC latency by method.
    pub rpc_seconds: Family<MethodLabels, Histogram, fn() -> Histogram>,
    /// Execs by outcome.
    pub execs: Family<ExecLabels, Counter>,
    /// Exec wall time.
    pub exec_seconds: Histogram,
    /// containerd call errors by operation.
    pub containerd_errors: Family<OpLabels, Counter>,
    /// READY unclaimed warm-pool members by image.
    pub pool_sandboxes: Family<ImageLabels, Gauge>,
    /// CreateSandbox calls that got a pool member (`hit`) or were created cold (`miss`)
    /// while the node keeps a pool.
    pub pool_claims: Family<OutcomeLabels, Counter>,
    /// 1 while the process's gRPC health is SERVING (what `/readyz` answers), else 0.
    pub serving: Gauge,
}

/// Labels of per-image series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ImageLabels {
    /// The image name.
    pub image: String,
}

/// Labels of pool claims.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    /// `hit` or `miss`.
    pub outcome: String,
}

/// The process-wide metrics.
pub static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);

impl Metrics {
    fn new() -> Self {
        let mut m = Metrics {
            registry: Registry::with_prefix("compute"),
            cpu_ms: Family::default(),
            memory_peak: Family::default(),
            disk_read: Family::default(),
            disk_write: Family::default(),
            net_egress: Family::default(),
            net_ingress: Family::default(),
            sandboxes: Family::default(),
            rpcs: Family::default(),
            rpc_seconds: Family::new_with_constructor(latency as fn() -> Histogram),
            execs: Family::default(),
            exec_seconds: Histogram::new(exponential_buckets(0.005, 2.0, 18)),
            containerd_errors: Family::default(),
            pool_sandboxes: Family::default(),
            pool_claims: Family::default(),
            serving: Gauge::default(),
        };
        // Registered in this order, which is the exposition's.
        let mut r = Registry::with_prefix("compute");
        macro_rules! register {
            ($($field:ident: $name:literal, $help:literal;)*) => {
                $(r.register($name, $help, m.$field.clone());)*
            };
        }
        register! {
            cpu_ms: "sandbox_cpu_milliseconds", "CPU time of a sandbox";
            memory_peak: "sandbox_memory_peak_bytes", "Peak memory of a sandbox";
            disk_read: "sandbox_disk_read_bytes", "Workspace bytes read by a sandbox";
            disk_write: "sandbox_disk_write_bytes", "Workspace bytes written by a sandbox";
            net_egress: "sandbox_network_egress_bytes", "Bytes a sandbox sent";
            net_ingress: "sandbox_network_ingress_bytes", "Bytes a sandbox received";
            sandboxes: "sandboxes", "Sandboxes by status";
            rpcs: "rpc_requests", "ComputeService RPCs by method and code";
            rpc_seconds: "rpc_duration_seconds", "ComputeService RPC latency";
            execs: "execs", "Execs by outcome";
            exec_seconds: "exec_duration_seconds", "Exec wall time";
            containerd_errors: "containerd_errors", "containerd call errors by operation";
            pool_sandboxes: "pool_sandboxes", "Warm (READY, agent attached) unclaimed pool sandboxes by image";
            pool_claims: "pool_claims", "Creates served from the warm pool (hit) or cold (miss)";
            serving: "serving", "1 while the gRPC health is SERVING (node: containerd answers; \
                router: a node is ready)";
        }
        m.registry = r;
        m
    }

    /// Records the process's gRPC health, as `/readyz` and `compute_serving` report it. Set by
    /// whoever sets the gRPC health status (the node's containerd check, the router's ready
    /// nodes).
    pub fn set_serving(&self, serving: bool) {
        self.serving.set(i64::from(serving));
    }

    /// Whether the last [`Metrics::set_serving`] said SERVING (false before the first).
    pub fn is_serving(&self) -> bool {
        self.serving.get() == 1
    }

    /// Records one RPC.
    pub fn rpc(&self, method: &str, code: tonic::Code, took: Duration) {
        self.rpcs
            .get_or_create(&RpcLabels {
                method: method.into(),
                code: format!("{code:?}"),
            })
            .inc();
        self.rpc_seconds
            .get_or_create(&MethodLabels {
                method: method.into(),
            })
            .observe(took.as_secs_f64());
    }

    /// Records a create on a node with a pool: served by a member or not.
    pub fn pool_claim(&self, hit: bool) {
        self.pool_claims
            .get_or_create(&OutcomeLabels {
                outcome: if hit { "hit" } else { "miss" }.into(),
            })
            .inc();
    }

    /// Sets the number of warm members of an image's pool.
    pub fn pool_size(&self, image: &str, n: i64) {
        self.pool_sandboxes
            .get_or_create(&ImageLabels {
                image: image.into(),
            })
            .set(n);
    }

    /// Records one finished exec.
    pub fn exec(&self, outcome: &str, took: Duration) {
        self.execs
            .get_or_create(&ExecLabels {
                outcome: outcome.into(),
            })
            .inc();
        self.exec_seconds.observe(took.as_secs_f64());
    }

    /// Records a failed containerd call.
    pub fn containerd_error(&self, op: &str) {
        self.containerd_errors
            .get_or_create(&OpLabels { op: op.into() })
            .inc();
    }

    /// Brings a sandbox's usage counters up to `u` (counters only move forward).
    pub fn sandbox_usage(&self, l: &SandboxLabels, u: &Usage) {
        let up = |c: &Counter, v: u64| {
            let now = c.get();
            if v > now {
                c.inc_by(v - now);
            }
        };
        up(&self.cpu_ms.get_or_create(l), u.cpu_ms);
        up(&self.disk_read.get_or_create(l), u.disk_read_bytes);
        up(&self.disk_write.get_or_create(l), u.disk_write_bytes);
        up(&self.net_egress.get_or_create(l), u.network_egress_bytes);
        up(&self.net_ingress.get_or_create(l), u.network_ingress_bytes);
        self.memory_peak
            .get_or_create(l)
            .set(u.memory_peak_bytes as i64);
    }

    /// Drops a sandbox's series (after destroy).
    pub fn forget_sandbox(&self, l: &SandboxLabels) {
        self.cpu_ms.remove(l);
        self.memory_peak.remove(l);
        self.disk_read.remove(l);
        self.disk_write.remove(l);
        self.net_egress.remove(l);
        self.net_ingress.remove(l);
    }

    /// The text exposition of every metric.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// Runs an RPC handler body, recording its count, code and latency.
pub async fn observe<T>(
    method: &'static str,
    body: impl std::future::Future<Output = Result<T, tonic::Status>>,
) -> Result<T, tonic::Status> {
    let t = std::time::Instant::now();
    let r = body.await;
    let code = r.as_ref().map_or_else(|s| s.code(), |_| tonic::Code::Ok);
    METRICS.rpc(method, code, t.elapsed());
    r
}

/// The status and body of a GET on the metrics listener: `/metrics` (Prometheus text),
/// `/livez` (200 while the process answers: liveness), `/readyz` (200 while the gRPC health is
/// SERVING, else 503: readiness and start-up), anything else 404.
pub fn respond(path: &str) -> (u16, String) {
    match path {
        "/metrics" => (200, METRICS.render()),
        "/livez" => (200, "ok\n".to_string()),
        "/readyz" if METRICS.is_serving() => (200, "ok\n".to_string()),
        "/readyz" => (503, "not serving\n".to_string()),
        _ => (404, "not found\n".to_string()),
    }
}

/// Serves `GET /metrics`, `/livez` and `/readyz` (see [`respond`]) on `addr` until the task is
/// aborted.
pub async fn serve(addr: String) -> std::io::Result<()> {
    use hyper::service::service_fn;
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    tracing::info!(addr = %addr, "serving Prometheus metrics and /livez, /readyz");
    loop {
        let (stream, _) = listener.accept().await?;
        tokio::spawn(async move {
            let svc = service_fn(|req: hyper::Request<hyper::body::Incoming>| async move {
                let (status, body) = respond(req.uri().path());
                hyper::Response::builder()
                    .status(status)
                    .header("content-type", "text/plain; version=0.0.4; charset=utf-8")
                    .body(http_body_util::Full::new(bytes::Bytes::from(body)))
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                .await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_paths_follow_the_serving_flag() {
        METRICS.set_serving(false);
        assert_eq!(respond("/livez").0, 200);
        assert_eq!(respond("/readyz").0, 503);
        METRICS.set_serving(true);
        assert_eq!(respond("/readyz").0, 200);
        let (code, text) = respond("/metrics");
        assert_eq!(code, 200);
        assert!(text.contains("compute_serving 1"), "{text}");
        assert_eq!(respond("/healthz").0, 404);
    }
}
