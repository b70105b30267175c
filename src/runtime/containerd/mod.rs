//! A thin typed client over containerd's gRPC services, scoped to one namespace.
//!
//! Every request carries the `containerd-namespace` header, and import calls also carry
//! `containerd-lease` so that content and snapshots written during an import are not collected
//! before the image references them.

mod containers;
mod content;
mod tasks;

use std::path::Path;

use containerd_client::services::v1::version_client::VersionClient;
use tonic::transport::Channel;
use tonic::{Code, Request};

/// The snapshotter every sandbox and image layer uses.
pub const SNAPSHOTTER: &str = "overlayfs";

/// Errors of the containerd client.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A containerd call failed.
    #[error("containerd {op} {what}: {status}")]
    Call {
        /// The operation, e.g. `Tasks.Start`.
        op: &'static str,
        /// What the call was about (container id, digest, …).
        what: String,
        /// The status containerd returned.
        status: tonic::Status,
    },
    /// A call did not answer in time.
    #[error("containerd {op} {what}: timed out")]
    Timeout {
        /// The operation.
        op: &'static str,
        /// What it was about.
        what: String,
    },
}

/// What a containerd failure means to its callers: the one place that reads containerd's codes
/// (and, where containerd answers Unknown, its messages).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The object does not exist.
    NotFound,
    /// The object exists already.
    AlreadyExists,
    /// containerd cannot be reached (restarting, socket gone).
    Unavailable,
    /// Tasks.Create found the task's bundle directory still in use by an earlier, interrupted
    /// Create (containerd answers Unknown with "file exists", or, when that one's cleanup
    /// removes the directory under the second, "no such file or directory").
    BundleBusy,
    /// The call did not answer in time.
    Timeout,
    /// Anything else.
    Other,
}

impl Error {
    /// What the failure means (see [`ErrorKind`]).
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Timeout { .. } => ErrorKind::Timeout,
            Error::Call { op, status, .. } => match status.code() {
                Code::NotFound => ErrorKind::NotFound,
                Code::AlreadyExists => ErrorKind::AlreadyExists,
                Code::Unavailable => ErrorKind::Unavailable,
                _ if *op == "Tasks.Create"
                    && (status.message().contains("file exists")
                        || status.message().contains("no such file or directory")) =>
                {
                    ErrorKind::BundleBusy
                }
                _ => ErrorKind::Other,
            },
        }
    }

    /// The gRPC code containerd answered with (Unavailable for a transport failure).
    pub fn code(&self) -> Code {
        match self {
            Error::Call { status, .. } => status.code(),
            Error::Timeout { .. } => Code::DeadlineExceeded,
        }
    }

    /// Whether containerd said the object does not exist.
    pub fn is_not_found(&self) -> bool {
        self.kind() == ErrorKind::NotFound
    }
}

pub(super) type Result<T> = std::result::Result<T, Error>;

pub(super) fn call_err(
    op: &'static str,
    what: impl Into<String>,
) -> impl FnOnce(tonic::Status) -> Error {
    let what = what.into();
    move |status| {
        crate::metrics::METRICS.containerd_error(op);
        Error::Call { op, what, status }
    }
}

/// The answer to a delete: done, or gone already (not an error); anything else is `op`'s
/// failure on `what`.
pub(super) fn deleted<T>(
    r: std::result::Result<T, tonic::Status>,
    op: &'static str,
    what: impl Into<String>,
) -> Result<()> {
    match r {
        Ok(_) => Ok(()),
        Err(s) if s.code() == Code::NotFound => Ok(()),
        Err(s) => Err(call_err(op, what)(s)),
    }
}

/// The state of a task (the sandbox's init process) as containerd reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskState {
    /// There is no task for the container.
    Missing,
    /// Created, not started.
    Created,
    /// Running.
    Running,
    /// Exited with the given status.
    Stopped(u32),
    /// Paused or pausing.
    Paused,
    /// containerd does not know.
    Unknown,
}

/// A containerd client bound to one namespace.
#[derive(Clone)]
pub struct Containerd {
    pub(super) channel: Channel,
    namespace: String,
}

impl Containerd {
    /// A client of containerd's gRPC socket. The connection is lazy and reconnects: calls made
    /// while containerd is down or restarting fail with Unavailable, later calls reconnect.
    pub async fn connect(path: &Path, namespace: &str) -> Result<Self> {
        Ok(Self {
            channel: crate::client::lazy_unix_channel(path),
            namespace: namespace.to_string(),
        })
    }

    /// The namespace this client works in.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    pub(super) fn req<T>(&self, msg: T) -> Request<T> {
        let mut req = Request::new(msg);
        if let Ok(v) = self.namespace.parse() {
            req.metadata_mut().insert("containerd-namespace", v);
        }
        req
    }

    pub(super) fn req_leased<T>(&self, msg: T, lease: &str) -> Request<T> {
        let mut req = self.req(msg);
        if let Ok(v) = lease.parse() {
            req.metadata_mut().insert("containerd-lease", v);
        }
        req
    }

    /// containerd's version string; used as the health probe.
    pub async fn version(&self) -> Result<String> {
        let resp = VersionClient::new(self.channel.clone())
            .version(Request::new(()))
            .await
            .map_err(call_err("Version", ""))?;
        Ok(resp.into_inner().version)
    }
}
