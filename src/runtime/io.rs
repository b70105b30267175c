//! The per-exec stdio FIFOs of a containerd exec.

use std::path::{Path, PathBuf};

use super::{io_err, Error, Result};

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
