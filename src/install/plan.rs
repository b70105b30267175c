//! The install's plan: every host path resolved, every file compared and containerd's config
//! parsed and edited in memory, before anything on the node is changed.

use std::path::{Path, PathBuf};

use super::containerd::{self, Edit, Handler};
use super::host::{self, HostRoot};
use super::runsc::BinaryPlan;
use super::{Error, InstallOpts, RestartMode, RuntimeMode, BACKUP_SUFFIX, PENDING_SUFFIX};

/// What an install will do, worked out so that a bad path or an unsupported config stops the
/// install before it changes anything.
pub(super) struct Plan {
    /// `--runtime` with `auto` decided: how containerd runs runsc.
    pub runtime: RuntimeMode,
    /// The runc shim's runtime binary (`--runc-binary`, else runsc in `--bin-dir`).
    pub runc_binary: PathBuf,
    /// The binaries to put in `--bin-dir`: runsc, and the shim when the image ships it and
    /// the handler uses it.
    pub binaries: Vec<BinaryPlan>,
    /// The shim's config file (with the runsc shim only).
    pub shim_config: Option<ShimConfigPlan>,
    /// containerd's config file.
    pub containerd: ContainerdPlan,
    /// containerd is restarted when its config changed (`--restart-mode reexec`, or a
    /// `--restart-cmd` that is not blank).
    pub restart: bool,
}

/// The shim's config (`--runsc-config`) as it should be.
pub(super) struct ShimConfigPlan {
    /// Its text.
    pub text: String,
    /// Resolved under the host root.
    pub real: PathBuf,
    /// The file already holds `text`.
    pub same: bool,
}

/// containerd's config (`--containerd-config`) with the runsc handler added, and the files
/// kept beside it.
pub(super) struct ContainerdPlan {
    /// Resolved under the host root.
    pub real: PathBuf,
    /// Its text now (`None`: it does not exist).
    pub old: Option<String>,
    /// The edited text.
    pub edit: Edit,
    /// The edit changes the file.
    pub changed: bool,
    /// Host path of the backup of the original, for the report.
    pub backup_host: PathBuf,
    /// The backup, resolved under the host root.
    pub backup_real: PathBuf,
    /// The marker of an owed restart, resolved under the host root.
    pub pending_real: PathBuf,
    /// The marker is there: an earlier run's restart failed.
    pub pending: bool,
}

impl Plan {
    /// Plans the install of `opts` on `host`, reading but writing nothing.
    pub fn new(opts: &InstallOpts, host: &HostRoot) -> Result<Self, Error> {
        let shipped_shim = opts.shim_src.is_file();
        let runtime = match opts.runtime {
            RuntimeMode::Auto if shipped_shim => RuntimeMode::RunscShim,
            RuntimeMode::Auto => RuntimeMode::RuncShim,
            m => m,
        };
        let mut binaries = vec![BinaryPlan::new(
            host,
            "runsc",
            &opts.runsc_src,
            &opts.bin_dir,
        )?];
        if shipped_shim && runtime == RuntimeMode::RunscShim {
            binaries.push(BinaryPlan::new(
                host,
                "containerd-shim-runsc-v1",
                &opts.shim_src,
                &opts.bin_dir,
            )?);
        }
        let runsc_dest = opts.bin_dir.join("runsc");
        let shim_config = match runtime {
            RuntimeMode::RunscShim => {
                let text =
                    containerd::runsc_toml(utf8(&runsc_dest)?, opts.runsc_platform.as_deref());
                let real = host.resolve(&opts.runsc_config)?;
                let same = host::read_if_exists(&real)?.as_deref() == Some(text.as_bytes());
                Some(ShimConfigPlan { text, real, same })
            }
            _ => None,
        };
        let runc_binary = match &opts.runc_binary {
            Some(b) => {
                host::check_host_path(b)?;
                b.clone()
            }
            None => runsc_dest,
        };
        let handler = match runtime {
            RuntimeMode::RunscShim => Handler::RunscShim {
                config_path: utf8(&opts.runsc_config)?,
            },
            _ => Handler::RuncShim {
                binary: utf8(&runc_binary)?,
            },
        };
        let containerd = ContainerdPlan::new(opts, host, handler)?;
        Ok(Self {
            runtime,
            runc_binary,
            binaries,
            shim_config,
            containerd,
            restart: opts.restart_mode == RestartMode::Reexec
                || !opts.restart_cmd.trim().is_empty(),
        })
    }
}

impl ContainerdPlan {
    fn new(opts: &InstallOpts, host: &HostRoot, handler: Handler<'_>) -> Result<Self, Error> {
        let real = host.resolve(&opts.containerd_config)?;
        let old = match host::read_if_exists(&real)? {
            Some(b) => Some(String::from_utf8(b).map_err(|_| Error::NotUtf8 {
                path: opts.containerd_config.clone(),
            })?),
            None => None,
        };
        let edit = containerd::add_runsc_runtime(&opts.containerd_config, old.as_deref(), handler)?;
        let changed = old.as_deref() != Some(edit.text.as_str());
        let backup_host = with_suffix(&opts.containerd_config, BACKUP_SUFFIX);
        let backup_real = host.resolve(&backup_host)?;
        let pending_real = host.resolve(&with_suffix(&opts.containerd_config, PENDING_SUFFIX))?;
        let pending = pending_real.exists();
        Ok(Self {
            real,
            old,
            edit,
            changed,
            backup_host,
            backup_real,
            pending_real,
            pending,
        })
    }
}

fn utf8(p: &Path) -> Result<&str, Error> {
    p.to_str().ok_or_else(|| Error::NotUtf8 { path: p.into() })
}

/// `p` with `suffix` appended to its file name.
fn with_suffix(p: &Path, suffix: &str) -> PathBuf {
    let mut s = p.as_os_str().to_os_string();
    s.push(suffix);
    PathBuf::from(s)
}
