//! Command-line plumbing of `computed` and `computectl`: one file per verb.

pub mod cp;
pub mod describe;
pub mod destroy;
pub mod doctor;
pub mod exec;
pub mod gc;
pub mod image;
pub mod local_image;
pub mod ls;
pub mod platform;
pub mod relay;
pub mod shell;
pub mod suspend;
pub mod top;
pub mod trash;

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use tonic::transport::{Channel, Endpoint};

use crate::api::admin::v1::node_admin_client::NodeAdminClient;
use crate::api::common::v1::UsageMetrics;
use crate::api::compute::v1::compute_service_client::ComputeServiceClient;

/// Sets up `tracing` to stderr; `RUST_LOG` filters (default `info`).
pub fn init_tracing(json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let b = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    if json {
        b.json().init();
    } else {
        b.init();
    }
}

/// Output format of listing commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// A human table.
    Table,
    /// A wider table.
    Wide,
    /// JSON, for scripts.
    Json,
}

/// Where computectl connects.
#[derive(Debug, Clone, clap::Args)]
pub struct Target {
    /// The node's unix socket.
    #[arg(
        long,
        global = true,
        env = "COMPUTE_SOCKET",
        default_value = "/run/compute/compute.sock"
    )]
    pub socket: PathBuf,
    /// A TCP address instead (`host:port`; the router works for ComputeService verbs).
    #[arg(long, global = true, env = "COMPUTE_ADDR")]
    pub addr: Option<String>,
    /// With `--addr`: speak TLS and trust this PEM CA for the server's certificate.
    #[arg(long, global = true, env = "COMPUTE_TLS_CA")]
    pub tls_ca: Option<PathBuf>,
    /// With `--addr` and TLS: present this PEM client certificate (mutual TLS).
    #[arg(long, global = true, env = "COMPUTE_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The PEM private key of `--tls-cert`.
    #[arg(long, global = true, env = "COMPUTE_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// A platform API key (`authorization: Bearer`), for the platform verbs on a router or
    /// a node over TCP; not needed as root on the node's unix socket.
    #[arg(long, global = true, env = "COMPUTE_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Output format.
    #[arg(short = 'o', long, global = true, value_enum, default_value = "table")]
    pub output: Output,
}

impl Target {
    /// A channel to the node (or router).
    pub async fn channel(&self) -> anyhow::Result<Channel> {
        if let Some(addr) = &self.addr {
            let tls = self.tls_ca.is_some() || self.tls_cert.is_some();
            let url = if addr.contains("://") {
                addr.clone()
            } else if tls {
                format!("https://{addr}")
            } else {
                format!("http://{addr}")
            };
            let mut ep = Endpoint::from_shared(url)?.connect_timeout(Duration::from_secs(5));
            if tls || addr.starts_with("https://") {
                ep = ep.tls_config(self.client_tls()?)?;
            }
            return ep
                .connect()
                .await
                .map_err(|e| anyhow::anyhow!("cannot reach {addr}: {e}"));
        }
        crate::client::unix_channel(&self.socket).await.map_err(|e| {
            anyhow::anyhow!(
                "cannot reach the node at {}: {e} (is `computed node` running? try `computectl doctor`)",
                self.socket.display()
            )
        })
    }

    fn client_tls(&self) -> anyhow::Result<tonic::transport::ClientTlsConfig> {
        use tonic::transport::{Certificate, ClientTlsConfig, Identity};
        let read = |p: &PathBuf| {
            std::fs::read(p).map_err(|e| anyhow::anyhow!("cannot read {}: {e}", p.display()))
        };
        let mut tls = ClientTlsConfig::new();
        if let Some(ca) = &self.tls_ca {
            tls = tls.ca_certificate(Certificate::from_pem(read(ca)?));
        }
        if let (Some(cert), Some(key)) = (&self.tls_cert, &self.tls_key) {
            tls = tls.identity(Identity::from_pem(read(cert)?, read(key)?));
        }
        Ok(tls)
    }

    /// A ComputeService client.
    pub async fn compute(&self) -> anyhow::Result<ComputeServiceClient<Channel>> {
        Ok(ComputeServiceClient::new(self.channel().await?)
            .max_decoding_message_size(32 << 20)
            .max_encoding_message_size(32 << 20))
    }

    /// A NodeAdmin client.
    pub async fn admin(&self) -> anyhow::Result<NodeAdminClient<Channel>> {
        Ok(NodeAdminClient::new(self.channel().await?).max_decoding_message_size(32 << 20))
    }
}

/// A gRPC error as one clear line.
pub fn status_error(what: &str, s: tonic::Status) -> anyhow::Error {
    anyhow::anyhow!("{what}: {} ({:?})", s.message(), s.code())
}

/// The message of a gRPC call's answer, its error made one clear line ([`status_error`]).
pub trait Answer<T> {
    /// The answer's message, or an error saying that `what` failed and why.
    fn answer(self, what: &str) -> anyhow::Result<T>;
}

impl<T> Answer<T> for Result<tonic::Response<T>, tonic::Status> {
    fn answer(self, what: &str) -> anyhow::Result<T> {
        self.map(tonic::Response::into_inner)
            .map_err(|s| status_error(what, s))
    }
}

/// Prints `v` as pretty JSON.
pub fn print_json(v: &impl serde::Serialize) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

/// Prints `items` in `t`'s output format: with `-o json` a JSON array of `json` of each,
/// otherwise a [`table`] under `header` with a row of `row` for each.
pub fn print_list<T>(
    t: &Target,
    items: &[T],
    json: impl Fn(&T) -> serde_json::Value,
    header: &[&str],
    row: impl Fn(&T) -> Vec<String>,
) -> anyhow::Result<()> {
    if t.output == Output::Json {
        let v: Vec<_> = items.iter().map(json).collect();
        return print_json(&v);
    }
    let rows: Vec<Vec<String>> = items.iter().map(row).collect();
    table(header, &rows);
    Ok(())
}

/// Copies a file read in chunks into `out`: `read(offset)` answers the chunk at `offset` and
/// whether it is the last, and reading stops after the last or an empty chunk. Returns the
/// bytes copied.
pub async fn read_chunks<F, R, D>(out: &mut impl std::io::Write, mut read: F) -> anyhow::Result<i64>
where
    F: FnMut(i64) -> R,
    R: std::future::Future<Output = anyhow::Result<(D, bool)>>,
    D: AsRef<[u8]>,
{
    let mut offset = 0i64;
    loop {
        let (data, eof) = read(offset).await?;
        let data = data.as_ref();
        out.write_all(data)?;
        offset += data.len() as i64;
        if eof || data.is_empty() {
            return Ok(offset);
        }
    }
}

/// Prints rows as a left-aligned table with a header.
pub fn table(header: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            widths[i] = widths[i].max(c.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let mut s = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                s.push_str(c);
            } else {
                s.push_str(&format!("{:<w$}   ", c, w = widths[i]));
            }
        }
        println!("{}", s.trim_end());
    };
    line(header.iter().map(|h| h.to_string()).collect());
    for r in rows {
        line(r.clone());
    }
}

/// "3m12s" style age of a timestamp.
pub fn age(ts: Option<&prost_types::Timestamp>) -> String {
    let Some(ts) = ts else {
        return "-".into();
    };
    let t =
        SystemTime::UNIX_EPOCH + Duration::new(ts.seconds.max(0) as u64, ts.nanos.max(0) as u32);
    human_duration(SystemTime::now().duration_since(t).unwrap_or_default())
}

/// "3m12s", "2h5m", "4d3h".
pub fn human_duration(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{}s", s / 60, s % 60),
        3600..=86399 => format!("{}h{}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d{}h", s / 86400, (s % 86400) / 3600),
    }
}

/// "1.5Gi" style bytes.
pub fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["", "Ki", "Mi", "Gi", "Ti"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b}")
    } else {
        format!("{v:.1}{}", UNITS[u])
    }
}

/// The JSON form of usage.
pub fn usage_json(u: Option<&UsageMetrics>) -> serde_json::Value {
    let u = u.cloned().unwrap_or_default();
    serde_json::json!({
        "cpu_ms": u.cpu_ms,
        "memory_peak_bytes": u.memory_peak_bytes,
        "memory_avg_bytes": u.memory_avg_bytes,
        "disk_read_bytes": u.disk_read_bytes,
        "disk_write_bytes": u.disk_write_bytes,
        "network_egress_bytes": u.network_egress_bytes,
        "network_ingress_bytes": u.network_ingress_bytes,
    })
}

/// RFC 3339 of a timestamp.
pub fn rfc3339(ts: Option<&prost_types::Timestamp>) -> String {
    ts.and_then(|t| chrono::DateTime::from_timestamp(t.seconds, t.nanos.max(0) as u32))
        .map(|d| d.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn humans() {
        assert_eq!(human_duration(Duration::from_secs(59)), "59s");
        assert_eq!(human_duration(Duration::from_secs(192)), "3m12s");
        assert_eq!(human_duration(Duration::from_secs(7500)), "2h5m");
        assert_eq!(human_bytes(512), "512");
        assert_eq!(human_bytes(3 << 29), "1.5Gi");
    }
}
