//! The options of `computed install` (its flags) and the report of what an install did.

use std::path::PathBuf;

use super::{Error, DEFAULT_RESTART_CMD};

/// Options of `computed install`. Host paths (`--bin-dir`, `--containerd-config`,
/// `--runsc-config`) are absolute paths as the host sees them; `--runsc-src` and `--shim-src`
/// are paths inside the installer's own image.
#[derive(Debug, Clone, clap::Args)]
pub struct InstallOpts {
    /// The host's root filesystem as mounted into the pod (hostPath `/`).
    #[arg(long, default_value = "/host")]
    pub host_root: PathBuf,
    /// The runsc binary to install (inside the image).
    #[arg(long, default_value = "/usr/local/bin/runsc")]
    pub runsc_src: PathBuf,
    /// gVisor's containerd shim to install (inside the image); skipped when absent.
    #[arg(long, default_value = "/usr/local/bin/containerd-shim-runsc-v1")]
    pub shim_src: PathBuf,
    /// Host directory the binaries go to; must be on containerd's PATH for the shim.
    #[arg(long, default_value = "/usr/local/bin")]
    pub bin_dir: PathBuf,
    /// containerd's config file on the host (created when missing).
    #[arg(long, default_value = "/etc/containerd/config.toml")]
    pub containerd_config: PathBuf,
    /// The shim's config file on the host (the handler's `ConfigPath`).
    #[arg(long, default_value = "/etc/containerd/runsc.toml")]
    pub runsc_config: PathBuf,
    /// Run through `sh -c` when containerd's config changed; empty never restarts.
    #[arg(long, default_value = DEFAULT_RESTART_CMD, allow_hyphen_values = true)]
    pub restart_cmd: String,
    /// How long the restart command may take, in seconds.
    #[arg(long, default_value_t = 120)]
    pub restart_timeout_secs: u64,
    /// runsc `--platform` for the handler's pods (e.g. `systrap`, `kvm`); unset keeps runsc's.
    #[arg(long)]
    pub runsc_platform: Option<String>,
    /// Print what would change and change nothing.
    #[arg(long)]
    pub dry_run: bool,
}

impl Default for InstallOpts {
    fn default() -> Self {
        Self {
            host_root: "/host".into(),
            runsc_src: "/usr/local/bin/runsc".into(),
            shim_src: "/usr/local/bin/containerd-shim-runsc-v1".into(),
            bin_dir: "/usr/local/bin".into(),
            containerd_config: "/etc/containerd/config.toml".into(),
            runsc_config: "/etc/containerd/runsc.toml".into(),
            restart_cmd: DEFAULT_RESTART_CMD.into(),
            restart_timeout_secs: 120,
            runsc_platform: None,
            dry_run: false,
        }
    }
}

/// What an install did (with `--dry-run`: would do).
#[derive(Debug, Default, Clone)]
pub struct Report {
    /// One line per action, in order (`runsc: copied /usr/local/bin/runsc (sha256 …)`).
    pub lines: Vec<String>,
    /// Files written (binaries, configs, backup).
    pub files_changed: usize,
    /// containerd's config changed.
    pub containerd_config_changed: bool,
    /// containerd was restarted.
    pub restarted: bool,
    /// Print each line as it is added (so the log shows what was done before a failure).
    echo: bool,
    /// A dry run: nothing is written.
    dry: bool,
}

impl Report {
    /// An empty report of an install with `--dry-run` (`dry`) or not, echoing its lines to
    /// stdout when `echo`.
    pub(super) fn new(echo: bool, dry: bool) -> Self {
        Self {
            echo,
            dry,
            ..Self::default()
        }
    }

    /// Adds (and with `echo`, prints) one line.
    pub(super) fn line(&mut self, s: impl Into<String>) {
        let s = s.into();
        if self.echo {
            println!("{s}");
        }
        self.lines.push(s);
    }

    /// Whether this is a dry run.
    pub(super) fn dry(&self) -> bool {
        self.dry
    }

    /// `dry` in a dry run, else `done`: the verb of a line.
    pub(super) fn verb(&self, dry: &'static str, done: &'static str) -> &'static str {
        if self.dry {
            dry
        } else {
            done
        }
    }

    /// Counts one changed file, changing it with `write` unless this is a dry run.
    pub(super) fn change(
        &mut self,
        write: impl FnOnce() -> Result<(), Error>,
    ) -> Result<(), Error> {
        if !self.dry {
            write()?;
        }
        self.files_changed += 1;
        Ok(())
    }
}
