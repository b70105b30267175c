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
    /// How containerd runs runsc for the `runsc` handler: `runsc-shim` (gVisor's
    /// `containerd-shim-runsc-v1`, `io.containerd.runsc.v1`), `runc-shim` (containerd's runc v2
    /// shim with `--runc-binary` as its runtime binary) or `auto`: the runsc shim when the
    /// image ships it, else the runc shim.
    #[arg(long, value_enum, default_value_t = RuntimeMode::Auto)]
    pub runtime: RuntimeMode,
    /// With the runc shim: the binary it runs in runc's place (the handler's `BinaryName`, a
    /// host path). Default: runsc in `--bin-dir`.
    #[arg(long)]
    pub runc_binary: Option<PathBuf>,
    /// How containerd is restarted when its config changed: `command` runs `--restart-cmd`
    /// (for a containerd that a service manager runs); `reexec` restarts the one containerd
    /// process serving `--containerd-config` in place (for a containerd started by a script,
    /// with no service manager; it refuses one that systemd runs).
    #[arg(long, value_enum, default_value_t = RestartMode::Command)]
    pub restart_mode: RestartMode,
    /// Run through `sh -c` when containerd's config changed (`--restart-mode command`); empty
    /// never restarts.
    #[arg(long, default_value = DEFAULT_RESTART_CMD, allow_hyphen_values = true)]
    pub restart_cmd: String,
    /// With `--restart-mode reexec`: a file holding containerd's pid (host path), rewritten
    /// with the new pid when it held the old one.
    #[arg(long)]
    pub containerd_pid_file: Option<PathBuf>,
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
            runtime: RuntimeMode::Auto,
            runc_binary: None,
            restart_mode: RestartMode::Command,
            restart_cmd: DEFAULT_RESTART_CMD.into(),
            containerd_pid_file: None,
            restart_timeout_secs: 120,
            runsc_platform: None,
            dry_run: false,
        }
    }
}

/// How containerd runs runsc for the `runsc` handler (`--runtime`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RuntimeMode {
    /// The runsc shim when the image ships it, else the runc shim.
    Auto,
    /// gVisor's `containerd-shim-runsc-v1` (`io.containerd.runsc.v1`), configured by
    /// `--runsc-config`: what gVisor supports for pods.
    RunscShim,
    /// containerd's runc v2 shim running `--runc-binary` as its runtime: for nodes without
    /// gVisor's shim (Debian ships none). runsc alone under the runc shim runs single-container
    /// tasks; a pod's app containers need a wrapper (see `daemonset/overlays/k1`).
    RuncShim,
}

/// How containerd is restarted after its config changed (`--restart-mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RestartMode {
    /// `--restart-cmd` through `sh -c` (default: `systemctl restart containerd` on the host).
    Command,
    /// The containerd process serving `--containerd-config` is stopped and started again with
    /// the same command line, environment, namespaces, cgroups and output files.
    Reexec,
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
