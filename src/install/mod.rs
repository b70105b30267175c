//! `computed install`: the node DaemonSet's init step. Puts gVisor on the node and registers it
//! with the node's containerd, changing only what differs:
//!
//! 1. copies `runsc` (and `containerd-shim-runsc-v1` when the image ships it) into the host's
//!    `--bin-dir`, when the bytes differ (SHA-256), atomically (temp file, fsync, 0755, rename);
//! 2. writes the shim's config (`--runsc-config`: the runsc binary, optionally `--platform`);
//! 3. adds the `runsc` runtime handler to containerd's config with `toml_edit`, keeping
//!    everything else, after saving the original as `<config>.bak-computed` (once: the first
//!    change's original is what a rollback restores);
//! 4. restarts containerd (`--restart-cmd`, through `sh -c`) only when its config changed.
//!
//! A second run changes nothing and restarts nothing. The host's `/` is mounted at
//! `--host-root`; every host path is resolved under it and may not leave it (see [`host`]).
//! A restart that fails leaves a marker (`<config>.computed-restart-pending`), so the next run
//! restarts even though the config is already right; otherwise an init container that failed
//! at its restart would, on its retry, see nothing to do and leave containerd on the old config.

mod configs;
pub mod containerd;
pub mod host;
mod options;
mod plan;
mod reexec;
mod restart;
mod runsc;

use std::path::PathBuf;

use host::HostRoot;
pub use options::{InstallOpts, Report, RestartMode, RuntimeMode};
use plan::Plan;
pub use reexec::{exec_in_host, ExecArgs};

/// The restart command used by the DaemonSet: containerd's unit, in the host's namespaces
/// (the pod has `hostPID: true`, so pid 1 is the host's init).
pub const DEFAULT_RESTART_CMD: &str = "nsenter -t 1 -m -u -i -n -p -- systemctl restart containerd";

/// Suffix of the backup of containerd's config taken before the installer's first change.
pub const BACKUP_SUFFIX: &str = ".bak-computed";

/// Suffix of the marker left while a containerd restart is owed.
pub const PENDING_SUFFIX: &str = ".computed-restart-pending";

/// Errors of the installer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `--host-root` is not a directory.
    #[error("host root {path} is not a directory")]
    HostRootNotDir {
        /// The host root.
        path: PathBuf,
    },
    /// A host path is relative.
    #[error("{path}: host paths must be absolute")]
    NotAbsolute {
        /// The path.
        path: PathBuf,
    },
    /// A host path (or a symlink on it) leads outside the host root.
    #[error("{path} escapes the host root")]
    Escape {
        /// The path as given.
        path: PathBuf,
    },
    /// A symlink loop, or a very long chain.
    #[error("{path}: too many levels of symlinks")]
    TooManyLinks {
        /// The path as given.
        path: PathBuf,
    },
    /// A binary the image must ship is missing.
    #[error("{path} is missing from the image")]
    MissingBinary {
        /// Its path inside the image.
        path: PathBuf,
    },
    /// A path or file that must be UTF-8 is not.
    #[error("{path} is not UTF-8")]
    NotUtf8 {
        /// The path.
        path: PathBuf,
    },
    /// containerd's config is not valid TOML.
    #[error("containerd config {path}: {source}")]
    Parse {
        /// The config file (host path).
        path: PathBuf,
        /// The parse error.
        source: toml_edit::TomlError,
    },
    /// containerd's config has a version this installer does not edit.
    #[error(
        "containerd config {path} is version {found}; only versions 2 and 3 are supported \
         (containerd 1.x: rewrite it as version 2; containerd 2.x: `containerd config migrate`)"
    )]
    UnsupportedVersion {
        /// The config file (host path).
        path: PathBuf,
        /// The version found.
        found: String,
    },
    /// A key on the way to the runtimes table holds something other than a table.
    #[error("containerd config {path}: `{key}` is not a table")]
    NotATable {
        /// The config file (host path).
        path: PathBuf,
        /// The dotted key.
        key: String,
    },
    /// A file operation failed.
    #[error("{what} {path}: {source}")]
    Io {
        /// What we were doing.
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The restart command could not be started.
    #[error("restart command `{cmd}`: {source}")]
    RestartSpawn {
        /// The command.
        cmd: String,
        /// The error.
        source: std::io::Error,
    },
    /// The restart command failed.
    #[error(
        "restart command `{cmd}` failed ({status}); containerd may still run its old config \
         (the next install retries the restart)"
    )]
    RestartFailed {
        /// The command.
        cmd: String,
        /// Its exit status.
        status: String,
    },
    /// `--restart-mode reexec` will not restart this containerd (nothing was stopped).
    #[error("containerd not restarted: {reason} (the next install retries the restart)")]
    ReexecRefused {
        /// Why.
        reason: String,
    },
    /// `--restart-mode reexec` stopped containerd but could not start it again, or the new
    /// one did not answer in time.
    #[error("containerd restart in place failed: {reason}")]
    ReexecFailed {
        /// What went wrong.
        reason: String,
    },
    /// The restart command did not finish in time (it was killed).
    #[error(
        "restart command `{cmd}` did not finish within {secs} s (the next install retries it)"
    )]
    RestartTimeout {
        /// The command.
        cmd: String,
        /// The timeout.
        secs: u64,
    },
}

/// Runs `computed install`, printing one line per action as it happens.
pub fn run(opts: &InstallOpts) -> anyhow::Result<()> {
    install_with(opts, true)?;
    Ok(())
}

/// Does the install (see the module docs) and reports each action. With `dry_run` nothing on
/// the host is written and no command runs.
pub fn install(opts: &InstallOpts) -> Result<Report, Error> {
    install_with(opts, false)
}

fn install_with(opts: &InstallOpts, echo: bool) -> Result<Report, Error> {
    for p in [&opts.bin_dir, &opts.containerd_config, &opts.runsc_config] {
        host::check_host_path(p)?;
    }
    if let Some(p) = &opts.containerd_pid_file {
        host::check_host_path(p)?;
    }
    let host = HostRoot::new(&opts.host_root)?;
    let mut report = Report::new(echo, opts.dry_run);
    if opts.dry_run {
        report.line(format!(
            "dry run: nothing under {} is changed",
            host.path().display()
        ));
    }

    // Plan first, with every path resolved and containerd's config parsed and edited in
    // memory, so a bad path or an unsupported config stops the install before it changes
    // anything on the node.
    let plan = Plan::new(opts, &host)?;
    report.line(match plan.runtime {
        RuntimeMode::RunscShim => "runsc handler: gVisor's shim (io.containerd.runsc.v1)".into(),
        _ => format!(
            "runsc handler: containerd's runc v2 shim running {}",
            plan.runc_binary.display()
        ),
    });

    // 1. Binaries, before any config names them.
    runsc::install_binaries(&plan.binaries, opts, &mut report)?;
    // 2. The shim's config.
    configs::write_shim_config(plan.shim_config.as_ref(), opts, &mut report)?;
    // 3. containerd's config.
    configs::write_containerd_config(&plan.containerd, plan.restart, opts, &mut report)?;
    // 4. Restart only when the config changed (or a failed restart is still owed).
    restart::restart_if_owed(&plan.containerd, plan.restart, opts, &host, &mut report)?;
    Ok(report)
}

#[cfg(test)]
mod tests;
