//! The per-exec stdio FIFOs of a containerd exec.

use std::path::{Path, PathBuf};

use super::{io_err, Error, Result};

/// The per-exec stdio FIFOs. Read ends are opened non-blocking; a write end of each output is
/// held until the process has started, so a reader never sees end-of-file before the shim
/// opened its own write end. The stdin FIFO is only made here: its write end is opened once
/// the shim reads it ([`ExecIo::open_stdin`]).
pub struct ExecIo {
    dir: PathBuf,
    /// Path of the stdin FIFO, when the process has a streamed stdin.
    pub stdin_path: Option<PathBuf>,
    /// Path of the stdout FIFO.
    pub stdout_path: PathBuf,
    /// Path of the stderr FIFO; none on a terminal (its output all comes on stdout).
    pub stderr_path: Option<PathBuf>,
    /// Read end of stdout.
    pub stdout: Option<tokio::net::unix::pipe::Receiver>,
    /// Read end of stderr.
    pub stderr: Option<tokio::net::unix::pipe::Receiver>,
    holders: Vec<tokio::net::unix::pipe::Sender>,
}

impl ExecIo {
    /// Makes the FIFOs under `dir` (created, and removed again on drop): stdout, stderr unless
    /// the process runs on a `terminal`, and stdin when it has one. Blocking.
    pub fn create(dir: PathBuf, stdin: bool, terminal: bool) -> Result<Self> {
        use nix::sys::stat::Mode;
        std::fs::create_dir_all(&dir).map_err(io_err("create", &dir))?;
        let mut io = ExecIo {
            stdin_path: stdin.then(|| dir.join("stdin")),
            stdout_path: dir.join("stdout"),
            stderr_path: (!terminal).then(|| dir.join("stderr")),
            dir,
            stdout: None,
            stderr: None,
            holders: vec![],
        };
        let fifos = [
            Some(&io.stdout_path),
            io.stderr_path.as_ref(),
            io.stdin_path.as_ref(),
        ];
        for p in fifos.into_iter().flatten() {
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
        io.holders.push(open_tx(&io.stdout_path)?);
        if let Some(p) = &io.stderr_path {
            io.stderr = Some(open_rx(p)?);
            io.holders.push(open_tx(p)?);
        }
        Ok(io)
    }

    /// Drops our write ends: call once the process has started.
    pub fn release_writers(&mut self) {
        self.holders.clear();
    }

    /// Opens the write end of a stdin FIFO without blocking; None while nothing reads it yet.
    /// The shim opens its read end asynchronously during the exec's start: waiting for it
    /// (rather than holding a read end of our own) means that once this answers, what is
    /// written reaches the process, and closing it cannot come before the shim's open (which
    /// would then wait for a writer forever). Blocking.
    pub fn open_stdin(path: &Path) -> Result<Option<tokio::net::unix::pipe::Sender>> {
        match tokio::net::unix::pipe::OpenOptions::new().open_sender(path) {
            Ok(tx) => Ok(Some(tx)),
            // ENXIO: a FIFO with no reader cannot be opened for writing without blocking.
            Err(e) if e.raw_os_error() == Some(nix::libc::ENXIO) => Ok(None),
            Err(e) => Err(io_err("open fifo", path)(e)),
        }
    }
}

impl Drop for ExecIo {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
