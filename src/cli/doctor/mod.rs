//! `computectl doctor`: checks what the node needs and says what to fix.

mod daemon;
mod host;

use std::path::PathBuf;

use super::{print_list, Target};
use crate::api::admin::v1 as pb;

/// Options of `doctor`.
#[derive(Debug, clap::Args)]
pub struct DoctorArgs {
    /// containerd's socket, when the daemon does not answer (otherwise the daemon's own is
    /// checked). Default: the config's `containerd_socket`.
    #[arg(long, env = "CONTAINERD_ADDRESS")]
    pub containerd: Option<PathBuf>,
    /// The node daemon's config file, when the daemon does not answer.
    #[arg(long, env = "COMPUTE_CONFIG")]
    pub config: Option<PathBuf>,
}

#[derive(PartialEq, Eq, Clone, Copy)]
enum Level {
    Ok,
    Warn,
    Fail,
}

impl Level {
    /// How the output shows it.
    fn word(self) -> &'static str {
        match self {
            Level::Ok => "ok",
            Level::Warn => "warn",
            Level::Fail => "FAIL",
        }
    }
}

/// The outcome of one check.
struct Check {
    name: &'static str,
    level: Level,
    detail: String,
    fix: String,
}

fn check(
    name: &'static str,
    level: Level,
    detail: impl Into<String>,
    fix: impl Into<String>,
) -> Check {
    Check {
        name,
        level,
        detail: detail.into(),
        fix: fix.into(),
    }
}

/// Runs `doctor`; fails when a check fails. The daemon is asked first: every later check looks
/// at what the running daemon uses (its containerd socket and namespace, runtime, runsc, state
/// directory), not at this command's defaults. Without a daemon, the local config is checked.
pub async fn run(t: &Target, a: DoctorArgs) -> anyhow::Result<()> {
    let mut checks = Vec::new();
    // The daemon.
    let node: daemon::Node = match t.admin().await {
        Ok(mut admin) => admin
            .get_node(pb::GetNodeRequest {})
            .await
            .map(|r| r.into_inner())
            .map_err(|s| s.message().to_string()),
        Err(e) => Err(e.to_string()),
    };
    let used = daemon::daemon(&node, &a, &mut checks);
    checks.push(daemon::containerd(&node, &used).await);
    checks.push(host::runsc(&used, node.as_ref().ok()));
    if let Ok(n) = &node {
        host::runtime(n, &mut checks);
    }
    checks.push(host::cgroups(&used));
    checks.push(host::kvm(&used));
    checks.push(host::volumes());
    checks.push(host::disk(&used));
    if let Ok(n) = &node {
        checks.push(daemon::image(n));
        checks.push(daemon::agent(n));
        checks.push(daemon::suspend(n));
        checks.push(daemon::egress(n));
    }

    print_list(
        t,
        &checks,
        |c| serde_json::json!({"check": c.name, "status": c.level.word(), "detail": c.detail, "fix": c.fix}),
        &["CHECK", "STATUS", "DETAIL", "FIX"],
        |c| {
            vec![
                c.name.to_string(),
                c.level.word().to_string(),
                c.detail.clone(),
                c.fix.clone(),
            ]
        },
    )?;
    let failed = checks.iter().filter(|c| c.level == Level::Fail).count();
    if failed > 0 {
        anyhow::bail!("{failed} check(s) failed");
    }
    Ok(())
}
