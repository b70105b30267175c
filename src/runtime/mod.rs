//! containerd + runsc: launching, exec'ing into and tearing down gVisor sandboxes.
//!
//! [`SandboxRuntime`] is the boundary the node works through: the verbs it needs (record a
//! sandbox, start it, ask its state, wait for it, kill it, label it, exec into it, resolve or
//! pull its image), in the node's terms. [`Runtime`] is the real one over containerd's gRPC
//! API (its client stays private); the unit tests of `node` use a fake behind the same trait.

mod choice;
pub mod containerd;
#[cfg(test)]
pub mod fake;
pub mod image;
mod io;
pub mod runsc;
pub mod spec;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::signal::Signal;

pub use choice::{choose_runtime, platform_for, RuntimeChoice};
pub use containerd::{Containerd, ErrorKind, TaskState};
pub use image::{ImageInfo, ResolvedImage};
pub use io::ExecIo;
pub use runsc::RunscInfo;

/// Errors of the runtime layer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// containerd failed.
    #[error(transparent)]
    Containerd(#[from] containerd::Error),
    /// An image problem.
    #[error(transparent)]
    Image(#[from] image::Error),
    /// The runsc binary cannot do what the configuration asks (a platform it does not offer).
    #[error("{0}")]
    Unsupported(String),
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

impl Error {
    /// The containerd failure underneath, if it is one.
    fn containerd(&self) -> Option<&containerd::Error> {
        match self {
            Error::Containerd(c) | Error::Image(image::Error::Containerd(c)) => Some(c),
            _ => None,
        }
    }

    /// Whether containerd could not be reached (the caller may retry).
    pub fn is_unavailable(&self) -> bool {
        self.containerd()
            .is_some_and(|c| c.kind() == ErrorKind::Unavailable)
    }

    /// Whether the object (container, task, process) does not exist.
    pub fn is_not_found(&self) -> bool {
        self.containerd()
            .is_some_and(|c| c.kind() == ErrorKind::NotFound)
    }

    /// Whether the image named is not known (and was not pulled).
    pub fn is_image_not_found(&self) -> bool {
        matches!(self, Error::Image(image::Error::NotFound(_)))
    }
}

/// Results of the runtime layer.
pub type Result<T> = std::result::Result<T, Error>;

fn io_err(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> Error {
    let path = path.to_path_buf();
    move |source| Error::Io { what, path, source }
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

/// One exec process to add to a sandbox.
pub struct ExecLaunch<'a> {
    /// Its id within the sandbox.
    pub exec_id: &'a str,
    /// The OCI `Process` JSON (its `terminal` must agree with `terminal`).
    pub process: Vec<u8>,
    /// The stdin FIFO (an empty path: none, the process reads end-of-file).
    pub stdin: &'a Path,
    /// The stdout FIFO (an empty path: none).
    pub stdout: &'a Path,
    /// The stderr FIFO (an empty path: none; it must be none with a terminal).
    pub stderr: &'a Path,
    /// The process runs on a pseudo-terminal whose output all comes on `stdout`.
    pub terminal: bool,
}

/// A terminal's size in characters (OCI's `consoleSize`, containerd's ResizePty).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConsoleSize {
    /// Rows.
    pub height: u16,
    /// Columns.
    pub width: u16,
}

/// One sandbox record the runtime holds: its id and labels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The sandbox id (the container id).
    pub id: String,
    /// Its labels.
    pub labels: HashMap<String, String>,
}

/// Where images come from when a sandbox names one that is not local.
#[derive(Debug, Clone, Default)]
pub struct ImagePolicy {
    /// Pull a missing image from its registry.
    pub pull_missing: bool,
    /// Registries reached over plain HTTP (`host:port`).
    pub insecure_registries: Vec<String>,
}

pub use image::Progress;

/// The verbs the node drives sandboxes with. Every id is a sandbox id; `exec_id` names one
/// exec process inside it. Implementations tolerate what is already gone where the verb says
/// so (teardown, deletes).
#[async_trait::async_trait]
pub trait SandboxRuntime: Send + Sync + 'static {
    /// Which runtime launches sandboxes (for NodeInfo and `computectl doctor`).
    fn choice(&self) -> &RuntimeChoice;

    /// The runtime's version; answering at all is the health probe.
    async fn version(&self) -> Result<String>;

    /// Records a sandbox (its container, with labels and a spec; no task yet).
    async fn record(&self, launch: SandboxLaunch<'_>) -> Result<()>;

    /// Every sandbox record (recovery reads the node's state from them).
    async fn records(&self) -> Result<Vec<Record>>;

    /// Sets the given labels on a record (others stay).
    async fn set_labels(&self, id: &str, labels: HashMap<String, String>) -> Result<()>;

    /// Replaces a record's OCI spec in place when it differs (no window without a record).
    async fn set_spec(&self, id: &str, spec: Vec<u8>) -> Result<()>;

    /// Resolves an image name, pulling it first when it is not local and the policy allows.
    async fn resolve_image(&self, name: &str) -> Result<ResolvedImage>;

    /// The digest an image name points at now, without pulling (empty when unknown).
    async fn image_digest(&self, name: &str) -> String;

    /// Prepares the sandbox's rootfs on `chain_id` and creates and starts its init task with
    /// the given stdio FIFOs (stdin, stdout, stderr; empty = none). A task left by an
    /// interrupted start is replaced.
    async fn start(&self, id: &str, chain_id: &str, stdio: [&str; 3]) -> Result<()>;

    /// Checkpoints the sandbox with its memory into `dir` (its task ends) and deletes the
    /// task; the record and its rootfs stay. `Unsupported` when this runtime cannot.
    async fn checkpoint(&self, id: &str, dir: &Path) -> Result<()>;

    /// Creates and starts the sandbox's task again from the checkpoint in `dir`, with the
    /// given stdio FIFOs, on the rootfs the record kept.
    async fn restore(&self, id: &str, chain_id: &str, stdio: [&str; 3], dir: &Path) -> Result<()>;

    /// The state of the sandbox's init task.
    async fn state(&self, id: &str) -> Result<TaskState>;

    /// Deletes the sandbox's init task (killed first if it still runs); the record and its
    /// rootfs stay. A missing task is not an error.
    async fn delete_task(&self, id: &str) -> Result<()>;

    /// Waits for the init task to exit and returns its status.
    async fn wait_exit(&self, id: &str) -> Result<u32>;

    /// Signals every process of the sandbox.
    async fn kill(&self, id: &str, signal: Signal) -> Result<()>;

    /// Stops the task and deletes it, the record and the rootfs; tolerates what is gone.
    async fn teardown(&self, id: &str) -> Result<()>;

    /// Adds an exec process to sandbox `id` and starts it. A process whose start fails is
    /// deleted again.
    async fn exec_start(&self, id: &str, exec: ExecLaunch<'_>) -> Result<()>;

    /// Waits for an exec process to exit and returns its status.
    async fn exec_wait(&self, id: &str, exec_id: &str) -> Result<u32>;

    /// The state of an exec process.
    async fn exec_state(&self, id: &str, exec_id: &str) -> Result<TaskState>;

    /// Signals an exec process (the host-side `runsc exec`, not the process inside).
    async fn exec_kill(&self, id: &str, exec_id: &str, signal: Signal) -> Result<()>;

    /// Resizes the terminal of an exec process started with one.
    async fn exec_resize(&self, id: &str, exec_id: &str, size: ConsoleSize) -> Result<()>;

    /// Ends the stdin of an exec process started with one: the shim holds a write end of
    /// the stdin FIFO of its own, so the process reads end-of-file only once this is called
    /// and every other writer has closed.
    async fn exec_close_stdin(&self, id: &str, exec_id: &str) -> Result<()>;

    /// Deletes an exited exec process; a missing one is not an error.
    async fn exec_delete(&self, id: &str, exec_id: &str) -> Result<()>;

    /// The images of the node (for operators).
    async fn list_images(&self) -> Result<Vec<ImageInfo>>;

    /// Imports an OCI or docker-save tarball; returns the names it now has.
    async fn import_image(
        &self,
        path: &Path,
        name: Option<&str>,
        progress: Progress<'_>,
    ) -> Result<Vec<String>>;

    /// Pulls a reference from its registry.
    async fn pull_image(&self, reference: &str, progress: Progress<'_>) -> Result<()>;

    /// Gives an existing image another name.
    async fn alias_image(&self, existing: &str, alias: &str) -> Result<()>;
}

/// The runtime: a containerd client plus the chosen runsc runtime and the image policy.
#[derive(Clone)]
pub struct Runtime {
    ctr: Containerd,
    choice: RuntimeChoice,
    images: ImagePolicy,
}

fn signal_number(s: Signal) -> u32 {
    s as i32 as u32
}

/// How long a delete waits for a task whose start failed (it may never answer).
const DELETE_TIMEOUT: Duration = Duration::from_secs(10);

impl Runtime {
    /// A runtime over `ctr` launching with `choice`, fetching images by `images`.
    pub fn new(ctr: Containerd, choice: RuntimeChoice, images: ImagePolicy) -> Self {
        Self {
            ctr,
            choice,
            images,
        }
    }

    /// Prepares (or reuses) the rootfs and creates and starts the init task with `options`
    /// (None: the container's own; a restore's carry the checkpoint).
    async fn create_and_start(
        &self,
        id: &str,
        chain_id: &str,
        stdio: [&str; 3],
        options: Option<prost_types::Any>,
    ) -> Result<()> {
        // A retry after a crash finds the snapshot already prepared: reuse its mounts.
        let mounts = match self.ctr.prepare_snapshot(id, chain_id, None).await {
            Ok(m) => m,
            Err(e) if e.kind() == ErrorKind::AlreadyExists => self.ctr.snapshot_mounts(id).await?,
            Err(e) => return Err(e.into()),
        };
        // A task left from an interrupted start is removed first. A Tasks.Create that a daemon
        // crash cut short may still be under way in containerd: its bundle directory exists
        // before its task does, and a second Create finds it busy. Wait for the first one to
        // end, then retry.
        let mut attempts = 0;
        loop {
            self.remove_task(id).await?;
            match self
                .ctr
                .create_task_with(id, mounts.clone(), stdio, options.clone())
                .await
            {
                Ok(_) => break,
                Err(e) if attempts < 40 && e.kind() == ErrorKind::BundleBusy => {
                    attempts += 1;
                    tracing::debug!(sandbox_id = %id, error = %e, "task bundle still there; retrying");
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                Err(e) => return Err(e.into()),
            }
        }
        if let Err(e) = self.ctr.start(id, "").await {
            let _ = self.ctr.kill(id, "", 9, true).await;
            let _ = self.ctr.delete_task(id, DELETE_TIMEOUT).await;
            return Err(e.into());
        }
        Ok(())
    }

    /// Kills a task that is not stopped, waits for it (bounded) and deletes it.
    async fn remove_task(&self, id: &str) -> Result<()> {
        match self.ctr.task_state(id, "").await? {
            TaskState::Missing => {}
            TaskState::Stopped(_) => self.ctr.delete_task(id, DELETE_TIMEOUT).await?,
            _ => {
                // An already-exited runsc task answers Unknown to a kill: it is dead, delete
                // it. Delete refuses a process that is still running: wait for the kill.
                if let Err(e) = self.ctr.kill(id, "", 9, true).await {
                    tracing::debug!(sandbox_id = %id, error = %e, "kill failed; deleting");
                }
                let _ = tokio::time::timeout(DELETE_TIMEOUT, self.ctr.wait(id, "")).await;
                self.ctr.delete_task(id, DELETE_TIMEOUT).await?;
            }
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl SandboxRuntime for Runtime {
    fn choice(&self) -> &RuntimeChoice {
        &self.choice
    }

    async fn version(&self) -> Result<String> {
        Ok(self.ctr.version().await?)
    }

    async fn record(&self, l: SandboxLaunch<'_>) -> Result<()> {
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

    async fn records(&self) -> Result<Vec<Record>> {
        Ok(self
            .ctr
            .list_containers()
            .await?
            .into_iter()
            .map(|c| Record {
                id: c.id,
                labels: c.labels,
            })
            .collect())
    }

    async fn set_labels(&self, id: &str, labels: HashMap<String, String>) -> Result<()> {
        Ok(self.ctr.set_labels(id, labels).await?)
    }

    async fn set_spec(&self, id: &str, spec: Vec<u8>) -> Result<()> {
        let current = self.ctr.get_container(id).await?;
        if current.spec.map(|a| a.value).unwrap_or_default() != spec {
            self.ctr.set_spec(id, spec).await?;
        }
        Ok(())
    }

    async fn resolve_image(&self, name: &str) -> Result<ResolvedImage> {
        match image::resolve(&self.ctr, name).await {
            Err(image::Error::NotFound(_)) if self.images.pull_missing => {
                tracing::info!(image = %name, "image not local: pulling");
                image::pull(&self.ctr, name, &self.images.insecure_registries).await?;
                Ok(image::resolve(&self.ctr, name).await?)
            }
            other => Ok(other?),
        }
    }

    async fn image_digest(&self, name: &str) -> String {
        match self.ctr.get_image(name).await {
            Ok(i) => i.target.map(|t| t.digest).unwrap_or_default(),
            Err(_) => String::new(),
        }
    }

    async fn start(&self, id: &str, chain_id: &str, stdio: [&str; 3]) -> Result<()> {
        self.create_and_start(id, chain_id, stdio, None).await
    }

    async fn checkpoint(&self, id: &str, dir: &Path) -> Result<()> {
        let Some(options) = self.choice.checkpoint_options(dir) else {
            return Err(Error::Unsupported(format!(
                "the {} runtime cannot checkpoint through containerd",
                self.choice.name
            )));
        };
        self.ctr.checkpoint_task(id, options).await?;
        // The checkpoint ends the sandbox: wait for its exit (bounded), then delete the task.
        let _ = tokio::time::timeout(DELETE_TIMEOUT, self.ctr.wait(id, "")).await;
        self.remove_task(id).await
    }

    async fn restore(&self, id: &str, chain_id: &str, stdio: [&str; 3], dir: &Path) -> Result<()> {
        let Some(options) = self.choice.restore_options(dir) else {
            return Err(Error::Unsupported(format!(
                "the {} runtime cannot restore through containerd",
                self.choice.name
            )));
        };
        self.create_and_start(id, chain_id, stdio, Some(options))
            .await
    }

    async fn state(&self, id: &str) -> Result<TaskState> {
        Ok(self.ctr.task_state(id, "").await?)
    }

    async fn delete_task(&self, id: &str) -> Result<()> {
        self.remove_task(id).await
    }

    async fn wait_exit(&self, id: &str) -> Result<u32> {
        Ok(self.ctr.wait(id, "").await?)
    }

    async fn kill(&self, id: &str, signal: Signal) -> Result<()> {
        Ok(self.ctr.kill(id, "", signal_number(signal), true).await?)
    }

    async fn teardown(&self, id: &str) -> Result<()> {
        self.remove_task(id).await?;
        self.ctr.delete_container(id).await?;
        self.ctr.remove_snapshot(id).await?;
        Ok(())
    }

    async fn exec_start(&self, id: &str, e: ExecLaunch<'_>) -> Result<()> {
        let stdio = [e.stdin, e.stdout, e.stderr].map(|p| p.display().to_string());
        let stdio = [&*stdio[0], &*stdio[1], &*stdio[2]];
        self.ctr
            .exec(id, e.exec_id, e.process, stdio, e.terminal)
            .await?;
        if let Err(err) = self.ctr.start(id, e.exec_id).await {
            let _ = self.ctr.delete_process(id, e.exec_id).await;
            return Err(err.into());
        }
        Ok(())
    }

    async fn exec_wait(&self, id: &str, exec_id: &str) -> Result<u32> {
        Ok(self.ctr.wait(id, exec_id).await?)
    }

    async fn exec_state(&self, id: &str, exec_id: &str) -> Result<TaskState> {
        Ok(self.ctr.task_state(id, exec_id).await?)
    }

    async fn exec_kill(&self, id: &str, exec_id: &str, signal: Signal) -> Result<()> {
        Ok(self
            .ctr
            .kill(id, exec_id, signal_number(signal), false)
            .await?)
    }

    async fn exec_resize(&self, id: &str, exec_id: &str, size: ConsoleSize) -> Result<()> {
        Ok(self
            .ctr
            .resize_pty(id, exec_id, size.width.into(), size.height.into())
            .await?)
    }

    async fn exec_close_stdin(&self, id: &str, exec_id: &str) -> Result<()> {
        Ok(self.ctr.close_stdin(id, exec_id).await?)
    }

    async fn exec_delete(&self, id: &str, exec_id: &str) -> Result<()> {
        Ok(self.ctr.delete_process(id, exec_id).await?)
    }

    async fn list_images(&self) -> Result<Vec<ImageInfo>> {
        Ok(image::list(&self.ctr).await?)
    }

    async fn import_image(
        &self,
        path: &Path,
        name: Option<&str>,
        progress: Progress<'_>,
    ) -> Result<Vec<String>> {
        Ok(image::import_tar_with(&self.ctr, path, name, progress).await?)
    }

    async fn pull_image(&self, reference: &str, progress: Progress<'_>) -> Result<()> {
        Ok(image::pull_with(
            &self.ctr,
            reference,
            &self.images.insecure_registries,
            progress,
        )
        .await?)
    }

    async fn alias_image(&self, existing: &str, alias: &str) -> Result<()> {
        Ok(image::alias(&self.ctr, existing, alias).await?)
    }
}
