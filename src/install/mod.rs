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

pub mod containerd;
pub mod host;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use host::{Attrs, HostRoot};

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
}

impl Report {
    fn line(&mut self, s: impl Into<String>) {
        let s = s.into();
        if self.echo {
            println!("{s}");
        }
        self.lines.push(s);
    }
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
    let host = HostRoot::new(&opts.host_root)?;
    let dry = opts.dry_run;
    let mut report = Report {
        echo,
        ..Report::default()
    };
    if dry {
        report.line(format!(
            "dry run: nothing under {} is changed",
            host.path().display()
        ));
    }

    // Plan first, with every path resolved and containerd's config parsed and edited in
    // memory, so a bad path or an unsupported config stops the install before it changes
    // anything on the node.
    let mut binaries = vec![plan_binary(&host, "runsc", &opts.runsc_src, &opts.bin_dir)?];
    if opts.shim_src.is_file() {
        binaries.push(plan_binary(
            &host,
            "containerd-shim-runsc-v1",
            &opts.shim_src,
            &opts.bin_dir,
        )?);
    }
    let runsc_dest = opts.bin_dir.join("runsc");
    let runsc_toml = containerd::runsc_toml(utf8(&runsc_dest)?, opts.runsc_platform.as_deref());
    let runsc_toml_path = host.resolve(&opts.runsc_config)?;
    let runsc_toml_same =
        host::read_if_exists(&runsc_toml_path)?.as_deref() == Some(runsc_toml.as_bytes());
    let cfg_path = host.resolve(&opts.containerd_config)?;
    let old = match host::read_if_exists(&cfg_path)? {
        Some(b) => Some(String::from_utf8(b).map_err(|_| Error::NotUtf8 {
            path: opts.containerd_config.clone(),
        })?),
        None => None,
    };
    let edit = containerd::add_runsc_runtime(
        &opts.containerd_config,
        old.as_deref(),
        utf8(&opts.runsc_config)?,
    )?;
    let changed = old.as_deref() != Some(edit.text.as_str());
    let backup_host = with_suffix(&opts.containerd_config, BACKUP_SUFFIX);
    let backup_path = host.resolve(&backup_host)?;
    let pending_path = host.resolve(&with_suffix(&opts.containerd_config, PENDING_SUFFIX))?;
    let pending = pending_path.exists();
    let restart = !opts.restart_cmd.trim().is_empty();

    // 1. Binaries, before any config names them.
    for b in &binaries {
        b.apply(dry, &mut report)?;
    }
    if !opts.shim_src.is_file() {
        report.line(format!(
            "containerd-shim-runsc-v1: skipped ({} is not in this image)",
            opts.shim_src.display()
        ));
    }

    // 2. The shim's config.
    if runsc_toml_same {
        report.line(format!(
            "runsc config: unchanged {}",
            opts.runsc_config.display()
        ));
    } else {
        if !dry {
            host::write_bytes(&runsc_toml_path, runsc_toml.as_bytes(), Attrs::mode(0o644))?;
        }
        report.files_changed += 1;
        report.line(format!(
            "runsc config: {} {}",
            if dry { "would write" } else { "written" },
            opts.runsc_config.display()
        ));
    }

    // 3. containerd's config.
    for w in &edit.warnings {
        report.line(format!("warning: {w}"));
    }
    if changed {
        report.containerd_config_changed = true;
        if !dry && restart {
            // Owed from here on: a crash between the write and the restart must not lose it.
            host::write_bytes(
                &pending_path,
                b"containerd's config changed; computed install restarts containerd\n",
                Attrs::mode(0o644),
            )?;
        }
        let mut what = match &old {
            None => format!("created {}", opts.containerd_config.display()),
            Some(_) => format!("changed {}", opts.containerd_config.display()),
        };
        if let Some(old) = &old {
            if backup_path.exists() {
                what.push_str(&format!(
                    " (the first original stays in {})",
                    backup_host.display()
                ));
            } else {
                if !dry {
                    host::write_bytes(
                        &backup_path,
                        old.as_bytes(),
                        Attrs::of_existing(&cfg_path, 0o644),
                    )?;
                }
                report.files_changed += 1;
                what.push_str(&format!(" (original saved as {})", backup_host.display()));
            }
        }
        if !dry {
            host::write_bytes(
                &cfg_path,
                edit.text.as_bytes(),
                Attrs::of_existing(&cfg_path, 0o644),
            )?;
        }
        report.files_changed += 1;
        report.line(format!(
            "containerd config: {}{what}",
            if dry { "would be " } else { "" }
        ));
    } else {
        report.line(format!(
            "containerd config: unchanged {} (runsc handler present)",
            opts.containerd_config.display()
        ));
    }

    // 4. Restart only when the config changed (or a failed restart is still owed).
    if !changed && !pending {
        report.line("containerd: not restarted (config unchanged)");
    } else if !restart {
        report.line(
            "containerd: NOT restarted (--restart-cmd is empty): restart it to load the runsc \
             handler",
        );
    } else if dry {
        report.line(format!(
            "containerd: would restart (`{}`)",
            opts.restart_cmd
        ));
    } else {
        report.line(format!(
            "containerd: restarting (`{}`){}",
            opts.restart_cmd,
            if changed {
                ""
            } else {
                ", owed by an earlier run whose restart failed"
            }
        ));
        run_restart(&opts.restart_cmd, opts.restart_timeout_secs)?;
        std::fs::remove_file(&pending_path).map_err(host::io("remove", &pending_path))?;
        report.restarted = true;
        report.line("containerd: restarted");
    }
    Ok(report)
}

/// One binary to put on the host: where from, where to, and whether its bytes differ.
struct BinaryPlan {
    name: &'static str,
    src: PathBuf,
    /// Host path, for the report.
    dest: PathBuf,
    /// Resolved under the host root.
    real: PathBuf,
    sha256: [u8; 32],
    same_bytes: bool,
}

/// Resolves the destination of `src` in the host's `bin_dir` and compares the bytes.
fn plan_binary(
    host: &HostRoot,
    name: &'static str,
    src: &Path,
    bin_dir: &Path,
) -> Result<BinaryPlan, Error> {
    let dest = bin_dir.join(name);
    let real = host.resolve(&dest)?;
    let sha256 =
        host::sha256_file(src)?.ok_or_else(|| Error::MissingBinary { path: src.into() })?;
    let same_bytes = host::sha256_file(&real)? == Some(sha256);
    Ok(BinaryPlan {
        name,
        src: src.into(),
        dest,
        real,
        sha256,
        same_bytes,
    })
}

impl BinaryPlan {
    /// Copies the binary when its bytes differ (as 0755), or fixes its mode.
    fn apply(&self, dry: bool, report: &mut Report) -> Result<(), Error> {
        let (name, dest) = (self.name, self.dest.display());
        if self.same_bytes {
            if host::mode_of(&self.real) == Some(0o755) {
                report.line(format!("{name}: unchanged {dest}"));
            } else {
                if !dry {
                    use std::os::unix::fs::PermissionsExt;
                    std::fs::set_permissions(&self.real, std::fs::Permissions::from_mode(0o755))
                        .map_err(host::io("chmod", &self.real))?;
                }
                report.files_changed += 1;
                report.line(format!(
                    "{name}: {} 0755 {dest}",
                    if dry { "would chmod" } else { "chmod" }
                ));
            }
            return Ok(());
        }
        if !dry {
            host::replace_file(&self.real, Attrs::mode(0o755), |f| {
                let mut s = std::fs::File::open(&self.src)?;
                std::io::copy(&mut s, f).map(|_| ())
            })?;
        }
        report.files_changed += 1;
        report.line(format!(
            "{name}: {} {dest} (sha256 {})",
            if dry { "would copy to" } else { "copied to" },
            &hex::encode(self.sha256)[..12]
        ));
        Ok(())
    }
}

/// Runs the restart command through `sh -c`, its output going to ours, within `secs`.
fn run_restart(cmd: &str, secs: u64) -> Result<(), Error> {
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .stdin(Stdio::null())
        .spawn()
        .map_err(|source| Error::RestartSpawn {
            cmd: cmd.into(),
            source,
        })?;
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let done = child.try_wait().map_err(|source| Error::RestartSpawn {
            cmd: cmd.into(),
            source,
        })?;
        match done {
            Some(st) if st.success() => return Ok(()),
            Some(st) => {
                return Err(Error::RestartFailed {
                    cmd: cmd.into(),
                    status: st.to_string(),
                })
            }
            None if Instant::now() >= deadline => {
                // Best effort: report the timeout whether or not the kill lands.
                let _ = child.kill();
                let _ = child.wait();
                return Err(Error::RestartTimeout {
                    cmd: cmd.into(),
                    secs,
                });
            }
            None => std::thread::sleep(Duration::from_millis(50)),
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    struct Scratch {
        dir: tempfile::TempDir,
        opts: InstallOpts,
        marker: PathBuf,
    }

    /// A host root with a fake runsc in the "image" and a restart command that counts.
    fn scratch(config: Option<&str>) -> Scratch {
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("image");
        std::fs::create_dir_all(&image).unwrap();
        std::fs::write(image.join("runsc"), b"#!/bin/sh\necho fake runsc\n").unwrap();
        let root = dir.path().join("host");
        std::fs::create_dir_all(root.join("etc/containerd")).unwrap();
        if let Some(c) = config {
            std::fs::write(root.join("etc/containerd/config.toml"), c).unwrap();
        }
        let marker = dir.path().join("restarts");
        let opts = InstallOpts {
            host_root: root,
            runsc_src: image.join("runsc"),
            shim_src: image.join("containerd-shim-runsc-v1"),
            restart_cmd: format!("echo restart >> {}", marker.display()),
            ..InstallOpts::default()
        };
        Scratch { dir, opts, marker }
    }

    fn restarts(s: &Scratch) -> usize {
        std::fs::read_to_string(&s.marker)
            .map(|t| t.lines().count())
            .unwrap_or(0)
    }

    fn host_file(s: &Scratch, p: &str) -> Option<String> {
        std::fs::read_to_string(s.opts.host_root.join(p)).ok()
    }

    const V2: &str = "# node config\nversion = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]\n  runtime_type = \"io.containerd.runc.v2\"  # the default\n";
    const V3: &str = "version = 3\n[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]\n  runtime_type = 'io.containerd.runc.v2'\n";

    #[test]
    fn first_run_installs_second_run_does_nothing() {
        for (name, cfg) in [("v2", Some(V2)), ("v3", Some(V3)), ("missing", None)] {
            let s = scratch(cfg);
            let r = install(&s.opts).unwrap();
            assert!(r.containerd_config_changed && r.restarted, "{name}: {r:?}");
            assert_eq!(restarts(&s), 1, "{name}");
            assert_eq!(
                host_file(&s, "usr/local/bin/runsc").as_deref(),
                Some("#!/bin/sh\necho fake runsc\n")
            );
            assert_eq!(
                host::mode_of(&s.opts.host_root.join("usr/local/bin/runsc")),
                Some(0o755)
            );
            let text = host_file(&s, "etc/containerd/config.toml").unwrap();
            assert!(text.contains("io.containerd.runsc.v1"), "{name}: {text}");
            assert!(text.contains("ConfigPath = "), "{name}: {text}");
            // The backup holds the original; a created file has none.
            assert_eq!(
                host_file(&s, "etc/containerd/config.toml.bak-computed").as_deref(),
                cfg
            );
            assert!(host_file(&s, "etc/containerd/runsc.toml")
                .unwrap()
                .contains("binary_name = \"/usr/local/bin/runsc\""));
            assert!(r
                .lines
                .iter()
                .any(|l| l.starts_with("containerd-shim-runsc-v1: skipped")));
            if let Some(c) = cfg {
                assert!(text.starts_with(c), "{name}: comments/format lost:\n{text}");
            }

            let r2 = install(&s.opts).unwrap();
            assert_eq!(r2.files_changed, 0, "{name}: {:?}", r2.lines);
            assert!(!r2.containerd_config_changed && !r2.restarted);
            assert_eq!(restarts(&s), 1, "{name}");
            assert_eq!(host_file(&s, "etc/containerd/config.toml").unwrap(), text);
            assert!(!s
                .opts
                .host_root
                .join("etc/containerd/config.toml.computed-restart-pending")
                .exists());
        }
    }

    #[test]
    fn v1_config_is_a_clear_error_and_nothing_restarts() {
        let s = scratch(Some("[plugins.cri]\n  sandbox_image = \"pause\"\n"));
        let e = install(&s.opts).unwrap_err();
        assert!(matches!(e, Error::UnsupportedVersion { .. }), "{e}");
        assert_eq!(restarts(&s), 0);
        assert_eq!(
            host_file(&s, "etc/containerd/config.toml").as_deref(),
            Some("[plugins.cri]\n  sandbox_image = \"pause\"\n")
        );
    }

    #[test]
    fn a_failed_restart_is_retried_by_the_next_run() {
        let mut s = scratch(Some(V2));
        s.opts.restart_cmd = "exit 3".into();
        let e = install(&s.opts).unwrap_err();
        assert!(matches!(e, Error::RestartFailed { .. }), "{e}");
        assert!(s
            .opts
            .host_root
            .join("etc/containerd/config.toml.computed-restart-pending")
            .exists());
        s.opts.restart_cmd = format!("echo restart >> {}", s.marker.display());
        let r = install(&s.opts).unwrap();
        assert!(r.restarted && !r.containerd_config_changed, "{:?}", r.lines);
        assert_eq!(restarts(&s), 1);
        let r = install(&s.opts).unwrap();
        assert!(!r.restarted);
        assert_eq!(restarts(&s), 1);
    }

    #[test]
    fn restart_timeout_kills_the_command() {
        let mut s = scratch(Some(V2));
        s.opts.restart_cmd = "sleep 30".into();
        s.opts.restart_timeout_secs = 1;
        let t = Instant::now();
        let e = install(&s.opts).unwrap_err();
        assert!(matches!(e, Error::RestartTimeout { .. }), "{e}");
        assert!(t.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn empty_restart_cmd_never_restarts() {
        let mut s = scratch(Some(V2));
        s.opts.restart_cmd = " ".into();
        let r = install(&s.opts).unwrap();
        assert!(r.containerd_config_changed && !r.restarted);
        assert!(r.lines.iter().any(|l| l.contains("NOT restarted")));
        assert!(!s
            .opts
            .host_root
            .join("etc/containerd/config.toml.computed-restart-pending")
            .exists());
    }

    #[test]
    fn dry_run_changes_nothing() {
        let s = scratch(Some(V2));
        let before = tree(s.dir.path());
        let mut o = s.opts.clone();
        o.dry_run = true;
        let r = install(&o).unwrap();
        assert!(r.containerd_config_changed && !r.restarted);
        assert!(r.files_changed >= 4, "{:?}", r.lines);
        assert!(r
            .lines
            .iter()
            .any(|l| l.starts_with("containerd: would restart")));
        assert_eq!(tree(s.dir.path()), before);
        assert_eq!(restarts(&s), 0);
    }

    #[test]
    fn shim_is_copied_when_shipped_and_binaries_only_when_changed() {
        let s = scratch(Some(V2));
        std::fs::write(&s.opts.shim_src, b"fake shim").unwrap();
        install(&s.opts).unwrap();
        assert_eq!(
            host_file(&s, "usr/local/bin/containerd-shim-runsc-v1").as_deref(),
            Some("fake shim")
        );
        std::fs::write(&s.opts.runsc_src, b"new runsc").unwrap();
        let r = install(&s.opts).unwrap();
        assert_eq!(r.files_changed, 1, "{:?}", r.lines);
        assert!(!r.restarted);
        assert!(r.lines[0].starts_with("runsc: copied to /usr/local/bin/runsc"));
        assert!(r.lines[1].starts_with("containerd-shim-runsc-v1: unchanged"));
        assert_eq!(restarts(&s), 1);
    }

    #[test]
    fn paths_may_not_escape_the_host_root() {
        let mut s = scratch(Some(V2));
        s.opts.bin_dir = "/usr/../../bin".into();
        assert!(matches!(install(&s.opts), Err(Error::Escape { .. })));
        let mut s = scratch(Some(V2));
        s.opts.runsc_config = "etc/runsc.toml".into();
        assert!(matches!(install(&s.opts), Err(Error::NotAbsolute { .. })));
        // A link to an absolute path lands inside the host root, never outside it.
        let s = scratch(None);
        let outside = s.dir.path().join("outside");
        std::fs::create_dir_all(s.opts.host_root.join("usr/local")).unwrap();
        std::os::unix::fs::symlink(&outside, s.opts.host_root.join("usr/local/bin")).unwrap();
        install(&s.opts).unwrap();
        assert!(!outside.exists());
        let rerooted = s.opts.host_root.join(outside.strip_prefix("/").unwrap());
        assert!(rerooted.join("runsc").is_file());
    }

    /// Every path under `dir` with its bytes (files) or link target.
    fn tree(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
        let mut out = Vec::new();
        let mut todo = vec![dir.to_path_buf()];
        while let Some(d) = todo.pop() {
            for e in std::fs::read_dir(&d).unwrap() {
                let p = e.unwrap().path();
                let m = std::fs::symlink_metadata(&p).unwrap();
                if m.is_dir() {
                    todo.push(p.clone());
                    out.push((p, vec![]));
                } else if m.is_symlink() {
                    let t = std::fs::read_link(&p).unwrap();
                    out.push((p, t.as_os_str().as_encoded_bytes().to_vec()));
                } else {
                    let b = std::fs::read(&p).unwrap();
                    out.push((p, b));
                }
            }
        }
        out.sort();
        out
    }
}
