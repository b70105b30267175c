//! The node's error type. It says what went wrong in the node's terms; the one mapping to gRPC
//! status codes is the API layer's (`api::status`).

use crate::{metering, relay, runtime, workspace};

/// Errors of node operations.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A request field is missing or malformed.
    #[error("{0}")]
    InvalidArgument(String),
    /// No sandbox with that id.
    #[error("sandbox {0} not found")]
    NotFound(String),
    /// No such other resource ("workspace X", "snapshot X").
    #[error("{0} not found")]
    Missing(String),
    /// A resource other than a sandbox is not in a state for the call (a durable workspace
    /// another sandbox has).
    #[error("{0}")]
    Precondition(String),
    /// No such egress grant on the sandbox (or no longer: it expired).
    #[error("sandbox {id} has no egress grant {grant}")]
    NoSuchGrant {
        /// The sandbox.
        id: String,
        /// The grant asked for.
        grant: String,
    },
    /// The node does not serve this (not configured here, or not built yet).
    #[error("{0}")]
    Unimplemented(String),
    /// The sandbox is in a state that does not allow the call.
    #[error("sandbox {id} is {state}")]
    FailedPrecondition {
        /// The sandbox.
        id: String,
        /// Its state, in words.
        state: String,
    },
    /// Waiting for the sandbox to become READY timed out.
    #[error("sandbox {0} is not ready yet")]
    NotReady(String),
    /// A limit was hit.
    #[error("{0}")]
    ResourceExhausted(String),
    /// The node cannot take the call now (containerd unreachable, draining).
    #[error("{0}")]
    Unavailable(String),
    /// An exec's process could not be followed to its end: the backend running it (the
    /// in-sandbox agent, containerd) lost it.
    #[error("sandbox {id}: the exec was lost: {why}")]
    ExecLost {
        /// The sandbox.
        id: String,
        /// What happened.
        why: String,
    },
    /// A workspace operation failed.
    #[error(transparent)]
    Workspace(#[from] workspace::Error),
    /// The runtime failed.
    #[error(transparent)]
    Runtime(#[from] runtime::Error),
    /// A metering read failed.
    #[error(transparent)]
    Metering(#[from] metering::Error),
    /// The relay's worker admission, credential store or exec.
    #[error(transparent)]
    Relay(#[from] relay::Error),
    /// Anything else.
    #[error("{0}")]
    Internal(String),
}

impl Error {
    /// Whether the node could not reach what it needs (the caller may retry).
    pub fn is_unavailable(&self) -> bool {
        match self {
            Error::Unavailable(_) => true,
            Error::Runtime(r) => r.is_unavailable(),
            _ => false,
        }
    }
}
