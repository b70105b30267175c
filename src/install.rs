//! `computed install`: the node DaemonSet's init step (placeholder; being written).

use std::path::PathBuf;

/// Options of `computed install`.
#[derive(Debug, Clone, clap::Args)]
pub struct InstallOpts {
    /// The host's root filesystem as mounted into the pod (hostPath `/`).
    #[arg(long, default_value = "/host")]
    pub host_root: PathBuf,
}

/// Runs the installer.
pub fn run(_opts: &InstallOpts) -> anyhow::Result<()> {
    anyhow::bail!("not yet built")
}
