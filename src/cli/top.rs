//! `computectl top`: live CPU and memory per sandbox, refreshing, busiest first.

use std::collections::HashMap;
use std::io::Write;
use std::time::{Duration, Instant};

use super::{human_bytes, Answer, Target};
use crate::api::admin::v1 as pb;

/// Options of `top`.
#[derive(Debug, clap::Args)]
pub struct TopArgs {
    /// Seconds between refreshes.
    #[arg(long, short = 'n', default_value_t = 2.0)]
    pub interval: f64,
    /// Stop after this many screens (0 = until Ctrl-C).
    #[arg(long, default_value_t = 0)]
    pub iterations: u64,
}

/// Runs `top`.
pub async fn run(t: &Target, a: TopArgs) -> anyhow::Result<()> {
    let mut admin = t.admin().await?;
    let mut last: HashMap<String, (u64, Instant)> = HashMap::new();
    let mut n = 0;
    let tty = std::io::IsTerminal::is_terminal(&std::io::stdout());
    loop {
        let list = admin
            .list_sandboxes(pb::ListSandboxesRequest {
                status: vec!["STARTING".into(), "READY".into(), "FAILED".into()],
                tenant_id: String::new(),
            })
            .await
            .answer("list sandboxes")?
            .sandboxes;
        let now = Instant::now();
        let mut rows: Vec<(f64, String)> = list
            .iter()
            .map(|s| {
                let u = s.usage.unwrap_or_default();
                let rate = match last.get(&s.sandbox_id) {
                    Some((cpu, at)) => {
                        let dt = now.duration_since(*at).as_secs_f64().max(0.001);
                        (u.cpu_ms.saturating_sub(*cpu)) as f64 / dt / 10.0
                    }
                    None => 0.0,
                };
                last.insert(s.sandbox_id.clone(), (u.cpu_ms, now));
                let line = format!(
                    "{:<36}  {:<14}  {:<9}  {:>6.1}%  {:>9}  {:>9}  {:>10}",
                    s.sandbox_id,
                    s.tenant_id.chars().take(14).collect::<String>(),
                    s.status,
                    rate,
                    human_bytes(u.memory_avg_bytes),
                    human_bytes(u.memory_peak_bytes),
                    format!("{}ms", u.cpu_ms),
                );
                (rate, line)
            })
            .collect();
        rows.sort_by(|a, b| b.0.total_cmp(&a.0));
        let mut out = std::io::stdout().lock();
        if tty {
            write!(out, "\x1b[2J\x1b[H")?;
        }
        writeln!(
            out,
            "computectl top - {} - {} sandboxes (refresh {}s, Ctrl-C quits)",
            chrono::Utc::now().format("%H:%M:%S"),
            rows.len(),
            a.interval
        )?;
        writeln!(
            out,
            "{:<36}  {:<14}  {:<9}  {:>7}  {:>9}  {:>9}  {:>10}",
            "SANDBOX", "TENANT", "STATUS", "CPU", "MEM", "PEAK", "CPU TIME"
        )?;
        for (_, l) in &rows {
            writeln!(out, "{l}")?;
        }
        out.flush()?;
        drop(out);
        n += 1;
        if a.iterations > 0 && n >= a.iterations {
            return Ok(());
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs_f64(a.interval.max(0.1))) => {}
            _ = tokio::signal::ctrl_c() => return Ok(()),
        }
    }
}
