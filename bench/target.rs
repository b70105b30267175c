//! What a scenario needs from a side: ours (the daemon, over gRPC) or the raw baseline.

use std::time::Duration;

use anyhow::Result;

/// The image both sides run.
pub const IMAGE: &str = "compute.local/sandbox-python:latest";

/// The outcome of one exec.
#[derive(Debug, Default)]
pub struct ExecOutcome {
    /// From the caller's start instant to the first stdout byte.
    pub first_stdout: Option<Duration>,
    /// From the caller's start instant to the end (stream closed / process reaped).
    pub total: Duration,
    /// Everything written to stdout.
    pub stdout: Vec<u8>,
    /// Everything written to stderr.
    pub stderr: Vec<u8>,
    /// The exit code.
    pub exit_code: i32,
}

impl ExecOutcome {
    /// Fails unless the exec exited 0 (and printed `want` on stdout, when given).
    pub fn check(self, want: Option<&[u8]>) -> Result<ExecOutcome> {
        if self.exit_code != 0 {
            anyhow::bail!(
                "exit code {} (stderr {:?})",
                self.exit_code,
                String::from_utf8_lossy(&self.stderr)
            );
        }
        if let Some(w) = want {
            if self.stdout != w {
                anyhow::bail!(
                    "stdout {:?}, want {:?}",
                    String::from_utf8_lossy(&self.stdout),
                    String::from_utf8_lossy(w)
                );
            }
        }
        Ok(self)
    }
}

/// The operations every scenario is built from. Implementations track the sandboxes they made
/// so that `cleanup` can remove whatever is left.
#[allow(async_fn_in_trait)]
pub trait Target {
    /// "ours" or "baseline".
    fn name(&self) -> &'static str;

    /// Creates a sandbox and runs `echo hi` in it as soon as possible; returns its id and the
    /// time from the start of the create to the first stdout byte. The exec has ended when
    /// this returns.
    async fn create_first_output(&self) -> Result<(String, Duration)>;

    /// Creates a sandbox and returns once it is ready (task running), with the latency.
    async fn create_ready(&self) -> Result<(String, Duration)>;

    /// Runs `argv` in a ready sandbox to completion.
    async fn exec(&self, id: &str, argv: &[&str]) -> Result<ExecOutcome>;

    /// Writes `data` into the sandbox's workspace and reads it back: (write, read) times.
    async fn write_read(&self, id: &str, data: &[u8]) -> Result<(Duration, Duration)>;

    /// Destroys a sandbox; returns the latency.
    async fn destroy(&self, id: &str) -> Result<Duration>;

    /// The containerd namespace of this side.
    fn namespace(&self) -> &str;

    /// The daemon's pid, if this side has one.
    fn daemon_pid(&self) -> Option<u32>;

    /// Removes everything this side made (best effort).
    async fn cleanup(&self);
}

/// Either side, so that interleaved scenarios can hold both in one slice.
pub enum Sut<'a> {
    /// Through the daemon.
    Ours(&'a crate::ours::Ours),
    /// Raw containerd + runsc.
    Base(&'a crate::base::Base),
}

macro_rules! delegate {
    ($self:ident, $t:ident => $e:expr) => {
        match $self {
            Sut::Ours($t) => $e,
            Sut::Base($t) => $e,
        }
    };
}

impl Target for Sut<'_> {
    fn name(&self) -> &'static str {
        delegate!(self, t => t.name())
    }

    async fn create_first_output(&self) -> Result<(String, Duration)> {
        delegate!(self, t => t.create_first_output().await)
    }

    async fn create_ready(&self) -> Result<(String, Duration)> {
        delegate!(self, t => t.create_ready().await)
    }

    async fn exec(&self, id: &str, argv: &[&str]) -> Result<ExecOutcome> {
        delegate!(self, t => t.exec(id, argv).await)
    }

    async fn write_read(&self, id: &str, data: &[u8]) -> Result<(Duration, Duration)> {
        delegate!(self, t => t.write_read(id, data).await)
    }

    async fn destroy(&self, id: &str) -> Result<Duration> {
        delegate!(self, t => t.destroy(id).await)
    }

    fn namespace(&self) -> &str {
        delegate!(self, t => t.namespace())
    }

    fn daemon_pid(&self) -> Option<u32> {
        delegate!(self, t => t.daemon_pid())
    }

    async fn cleanup(&self) {
        delegate!(self, t => t.cleanup().await)
    }
}
