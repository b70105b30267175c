//! containerd + runsc: launching, exec'ing into and tearing down gVisor sandboxes.

pub mod containerd;
pub mod image;
pub mod spec;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use prost::Message;
use prost_types::Any;

use crate::config::{Config, RuntimeKind};
pub use containerd::{Containerd, TaskState};

/// Errors of the runtime layer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// containerd failed.
    #[error(transparent)]
    Containerd(#[from] containerd::Error),
    /// An image problem.
    #[error(transparent)]
    Image(#[from] image::Error),
    /// Host-side setup failed (FIFOs, directories, the wrapper).
    #[error("{what} {path}: {source}")]
    Io {
        /// What we were doing.
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

type Result<T> = std::result::Result<T, Error>;

/// Options of the runc v2 shim (`containerd.runc.v1.Options`), the fields we set.
#[derive(Clone, PartialEq, Message)]
struct RuncOptions {
    #[prost(string, tag = "6")]
    binary_name: String,
    #[prost(string, tag = "7")]
    root: String,
}

/// Options of gVisor's shim (`runtimeoptions.v1.Options`).
#[derive(Clone, PartialEq, Message)]
struct RunscShimOptions {
    #[prost(string, tag = "1")]
    type_url: String,
    #[prost(string, tag = "2")]
    config_path: String,
}

/// The resolved runtime: which containerd runtime, with which options.
#[derive(Debug, Clone)]
pub struct RuntimeChoice {
    /// `runsc-shim` or `runc-wrapper`.
    pub kind: RuntimeKind,
    /// The containerd runtime name.
    pub name: String,
    /// The options Any sent with every container.
    pub options: Any,
    /// What containerd's shim runs: the runsc wrapper (runc-wrapper) or the shim's config
    /// file (runsc-shim). `computectl doctor` checks it.
    pub binary: PathBuf,
}

fn on_path(bin: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(bin))
            .find(|p| p.is_file())
    })
}

fn io_err(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> Error {
    let path = path.to_path_buf();
    move |source| Error::Io { what, path, source }
}

/// Picks the runtime and writes what it needs on disk (the runsc wrapper or the shim's TOML).
pub fn choose_runtime(cfg: &Config) -> Result<RuntimeChoice> {
    let kind = match cfg.runtime {
        RuntimeKind::Auto => {
            if on_path("containerd-shim-runsc-v1").is_some() {
                RuntimeKind::RunscShim
            } else {
                RuntimeKind::RuncWrapper
            }
        }
        k => k,
    };
    let bin_dir = cfg.state_dir.join("bin");
    std::fs::create_dir_all(&bin_dir).map_err(io_err("create", &bin_dir))?;
    let mut flags: Vec<String> = vec!["--network=none".into()];
    // Writes to the image's root filesystem stay in the sandbox's memory (counted against its
    // memory limit), not in the snapshot on the host's disk, where nothing would cap them.
    // The workspace bind mount is not overlaid: it stays shared with the host.
    if !cfg.runsc_flags.iter().any(|f| f.starts_with("--overlay")) {
        flags.push("--overlay2=root:memory".into());
    }
    if !cfg.runsc_platform.is_empty() {
        flags.push(format!("--platform={}", cfg.runsc_platform));
    }
    flags.extend(cfg.runsc_flags.iter().cloned());
    match kind {
        RuntimeKind::RunscShim => {
            let toml_path = bin_dir.join("runsc.toml");
            let mut toml = String::from("# Written by computed.\nbinary_name = ");
            toml.push_str(&format!(
                "{:?}\n[runsc_config]\n",
                cfg.runsc_path.display().to_string()
            ));
            for f in &flags {
                let f = f.trim_start_matches("--");
                let (k, v) = f.split_once('=').unwrap_or((f, "true"));
                toml.push_str(&format!("  {k} = {v:?}\n"));
            }
            write_if_changed(&toml_path, toml.as_bytes(), 0o644)?;
            let opts = RunscShimOptions {
                type_url: "io.containerd.runsc.v1.options".into(),
                config_path: toml_path.display().to_string(),
            };
            Ok(RuntimeChoice {
                kind,
                name: "io.containerd.runsc.v1".into(),
                binary: toml_path.clone(),
                options: Any {
                    type_url: "runtimeoptions.v1.Options".into(),
                    value: opts.encode_to_vec(),
                },
            })
        }
        _ => {
            let wrapper = bin_dir.join("runsc-compute");
            let script = spec::wrapper_script(&cfg.runsc_path, &flags);
            write_if_changed(&wrapper, script.as_bytes(), 0o755)?;
            let opts = RuncOptions {
                binary_name: wrapper.display().to_string(),
                root: cfg.run_dir.join("runsc").display().to_string(),
            };
            Ok(RuntimeChoice {
                kind: RuntimeKind::RuncWrapper,
                name: "io.containerd.runc.v2".into(),
                binary: wrapper.clone(),
                options: Any {
                    type_url: "containerd.runc.v1.Options".into(),
                    value: opts.encode_to_vec(),
                },
            })
        }
    }
}

fn write_if_changed(path: &Path, data: &[u8], mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    if std::fs::read(path).ok().as_deref() == Some(data) {
        return Ok(());
    }
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, data).map_err(io_err("write", &tmp))?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode))
        .map_err(io_err("chmod", &tmp))?;
    std::fs::rename(&tmp, path).map_err(io_err("rename", path))?;
    Ok(())
}

/// The per-exec stdio FIFOs. Read ends are opened non-blocking; a write end of each is held
/// until the process has started, so a reader never sees end-of-file before the shim opened
/// its own write end.
pub struct ExecIo {
    dir: PathBuf,
    /// Path of the stdout FIFO.
    pub stdout_path: PathBuf,
    /// Path of the stderr FIFO.
    pub stderr_path: PathBuf,
    /// Read end of stdout.
    pub stdout: Option<tokio::net::unix::pipe::Receiver>,
    /// Read end of stderr.
    pub stderr: Option<tokio::net::unix::pipe::Receiver>,
    holders: Vec<tokio::net::unix::pipe::Sender>,
}

impl ExecIo {
    /// Makes the FIFOs under `dir` (created, and removed again on drop).
    pub fn create(dir: PathBuf) -> Result<Self> {
        use nix::sys::stat::Mode;
        std::fs::create_dir_all(&dir).map_err(io_err("create", &dir))?;
        let stdout_path = dir.join("stdout");
        let stderr_path = dir.join("stderr");
        let mut io = ExecIo {
            dir,
            stdout_path,
            stderr_path,
            stdout: None,
            stderr: None,
            holders: vec![],
        };
        for p in [&io.stdout_path, &io.stderr_path] {
            nix::unistd::mkfifo(p.as_path(), Mode::from_bits_truncate(0o600)).map_err(|e| {
                Error::Io {
                    what: "mkfifo",
                    path: p.clone(),
                    source: e.into(),
                }
            })?;
        }
        let open_rx = |p: &Path| {
            tokio::net::unix::pipe::OpenOptions::new()
                .open_receiver(p)
                .map_err(io_err("open fifo", p))
        };
        let open_tx = |p: &Path| {
            tokio::net::unix::pipe::OpenOptions::new()
                .open_sender(p)
                .map_err(io_err("open fifo", p))
        };
        io.stdout = Some(open_rx(&io.stdout_path)?);
        io.stderr = Some(open_rx(&io.stderr_path)?);
        io.holders.push(open_tx(&io.stdout_path)?);
        io.holders.push(open_tx(&io.stderr_path)?);
        Ok(io)
    }

    /// Drops our write ends: call once the process has started.
    pub fn release_writers(&mut self) {
        self.holders.clear();
    }
}

impl Drop for ExecIo {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Everything a sandbox's container needs, as the node resolved it.
pub struct SandboxLaunch<'a> {
    /// The sandbox id (also the container id).
    pub id: &'a str,
    /// The container labels (the sandbox's record).
    pub labels: HashMap<String, String>,
    /// The OCI spec JSON.
    pub spec: Vec<u8>,
    /// The image name.
    pub image: &'a str,
}

/// The runtime: a containerd client plus the chosen runsc runtime.
#[derive(Clone)]
pub struct Runtime {
    /// The containerd client.
    pub ctr: Containerd,
    /// The chosen runtime.
    pub choice: RuntimeChoice,
}

impl Runtime {
    /// Records a sandbox's container in containerd (no snapshot, no task yet).
    pub async fn create_container(&self, l: SandboxLaunch<'_>) -> Result<()> {
        self.ctr
            .create_container(
                l.id,
                l.image,
                l.labels,
                &self.choice.name,
                Some(self.choice.options.clone()),
                l.spec,
            )
            .await?;
        Ok(())
    }

    /// Prepares the sandbox's rootfs snapshot on top of the image (`chain_id`), then creates and
    /// starts its task with the given stdio FIFOs (stdin, stdout, stderr; empty = none).
    pub async fn start_task(&self, id: &str, chain_id: &str, stdio: [&str; 3]) -> Result<()> {
        // A retry after a crash finds the snapshot already prepared: reuse its mounts.
        let mounts = match self.ctr.prepare_snapshot(id, chain_id, None).await {
            Ok(m) => m,
            Err(e) if e.is_already_exists() => self.ctr.snapshot_mounts(id).await?,
            Err(e) => return Err(e.into()),
        };
        // A task left from an interrupted start is removed first. A Tasks.Create that a daemon
        // crash cut short may still be under way in containerd: its bundle directory exists
        // before its task does, and a second Create fails with "file exists" (or, when the
        // first one's cleanup removes the directory under the second, the shim's fork/exec
        // fails with "no such file or directory"). Wait for the first one to end, then retry.
        let mut attempts = 0;
        loop {
            match self.ctr.task_state(id, "").await? {
                TaskState::Missing => {}
                TaskState::Stopped(_) => self.ctr.delete_task(id, Duration::from_secs(10)).await?,
                _ => {
                    // Delete refuses a process that is still running: wait for the kill.
                    let _ = self.ctr.kill(id, "", 9, true).await;
                    let _ =
                        tokio::time::timeout(Duration::from_secs(10), self.ctr.wait(id, "")).await;
                    self.ctr.delete_task(id, Duration::from_secs(10)).await?;
                }
            }
            match self.ctr.create_task(id, mounts.clone(), stdio).await {
                Ok(_) => break,
                Err(e)
                    if attempts < 40
                        && (e.to_string().contains("file exists")
                            || e.to_string().contains("no such file or directory")) =>
                {
                    attempts += 1;
                    tracing::debug!(sandbox_id = %id, error = %e, "task bundle still there; retrying");
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                Err(e) => return Err(e.into()),
            }
        }
        if let Err(e) = self.ctr.start(id, "").await {
            let _ = self.ctr.kill(id, "", 9, true).await;
            let _ = self.ctr.delete_task(id, Duration::from_secs(10)).await;
            return Err(e.into());
        }
        Ok(())
    }

    /// Stops and deletes the task, then the container and its snapshot. Every step tolerates
    /// what is already gone.
    pub async fn teardown(&self, id: &str) -> Result<()> {
        match self.ctr.task_state(id, "").await? {
            TaskState::Missing => {}
            TaskState::Stopped(_) => {
                self.ctr.delete_task(id, Duration::from_secs(10)).await?;
            }
            _ => {
                if let Err(e) = self.ctr.kill(id, "", 9, true).await {
                    // An already-exited runsc task answers Unknown: it is dead, delete it.
                    tracing::debug!(sandbox_id = %id, error = %e, "kill failed; deleting");
                }
                let _ = tokio::time::timeout(Duration::from_secs(10), self.ctr.wait(id, "")).await;
                self.ctr.delete_task(id, Duration::from_secs(10)).await?;
            }
        }
        self.ctr.delete_container(id).await?;
        self.ctr.remove_snapshot(id).await?;
        Ok(())
    }
}
