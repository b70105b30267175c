//! The relay's error type and its gRPC status.

use std::path::PathBuf;

use tonic::Status;
use tracing::error;

/// Errors of the relay: admission of workers, its credential store, and execs.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No credential, or one the node does not know.
    #[error("{0}")]
    Unauthenticated(&'static str),
    /// A valid credential that does not allow this sandbox_id, or an id no network worker
    /// may take.
    #[error("sandbox_id {sandbox_id}: {why}")]
    PermissionDenied {
        /// The sandbox_id the worker asked for.
        sandbox_id: String,
        /// Why not.
        why: &'static str,
    },
    /// Revoke of a sandbox_id without a credential.
    #[error("no worker credential for sandbox_id {0}")]
    NoCredential(String),
    /// A malformed request.
    #[error("{0}")]
    InvalidArgument(String),
    /// No worker is attached for the sandbox (or it went away).
    #[error("{0}")]
    Unavailable(String),
    /// The req_id is already running on that worker.
    #[error("req_id {0} is already running on this worker")]
    AlreadyExists(u64),
    /// The worker is at its capacity.
    #[error("worker is at its capacity of {0} concurrent execs")]
    ResourceExhausted(usize),
    /// The credential file could not be read or written.
    #[error("credential store {}: {source}", path.display())]
    Store {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The kernel's random source failed.
    #[error("random source: {0}")]
    Random(String),
}

impl Error {
    /// The gRPC code callers see.
    pub fn code(&self) -> tonic::Code {
        use tonic::Code;
        match self {
            Error::Unauthenticated(_) => Code::Unauthenticated,
            Error::PermissionDenied { .. } => Code::PermissionDenied,
            Error::NoCredential(_) => Code::NotFound,
            Error::InvalidArgument(_) => Code::InvalidArgument,
            Error::Unavailable(_) => Code::Unavailable,
            Error::AlreadyExists(_) => Code::AlreadyExists,
            Error::ResourceExhausted(_) => Code::ResourceExhausted,
            Error::Store { .. } | Error::Random(_) => Code::Internal,
        }
    }
}

impl From<Error> for Status {
    fn from(e: Error) -> Self {
        let code = e.code();
        if code == tonic::Code::Internal {
            // The full chain stays in the log; the caller gets a short message.
            error!(error = %e, "relay credential store failed");
            return Status::new(code, "worker credential store failed");
        }
        Status::new(code, e.to_string())
    }
}
