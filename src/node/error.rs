//! The node's error type and its single mapping to `tonic::Status`.

use tonic::{Code, Status};

use crate::{metering, relay, runtime, workspace};

/// Errors of node operations, as callers of ComputeService see them.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A request field is missing or malformed.
    #[error("{0}")]
    InvalidArgument(String),
    /// No sandbox with that id.
    #[error("sandbox {0} not found")]
    NotFound(String),
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
    /// containerd cannot be reached.
    #[error("containerd unavailable: {0}")]
    Unavailable(String),
    /// A workspace operation failed.
    #[error(transparent)]
    Workspace(#[from] workspace::Error),
    /// The runtime failed.
    #[error(transparent)]
    Runtime(#[from] runtime::Error),
    /// A metering read failed.
    #[error(transparent)]
    Metering(#[from] metering::Error),
    /// The relay's worker admission or credential store (admin calls).
    #[error(transparent)]
    Relay(#[from] relay::Error),
    /// Anything else.
    #[error("{0}")]
    Internal(String),
}

impl From<runtime::containerd::Error> for Error {
    fn from(e: runtime::containerd::Error) -> Self {
        Error::Runtime(e.into())
    }
}

impl From<runtime::image::Error> for Error {
    fn from(e: runtime::image::Error) -> Self {
        Error::Runtime(e.into())
    }
}

impl Error {
    /// Whether containerd could not be reached (the caller may retry).
    pub fn is_unavailable(&self) -> bool {
        match self {
            Error::Unavailable(_) => true,
            Error::Runtime(runtime::Error::Containerd(c))
            | Error::Runtime(runtime::Error::Image(runtime::image::Error::Containerd(c))) => {
                containerd_code(c) == Code::Unavailable
            }
            _ => false,
        }
    }
}

fn containerd_code(e: &runtime::containerd::Error) -> Code {
    match e.code() {
        Code::Unavailable => Code::Unavailable,
        _ => Code::Internal,
    }
}

impl From<Error> for Status {
    fn from(e: Error) -> Self {
        let code = match &e {
            Error::InvalidArgument(_) => Code::InvalidArgument,
            Error::NotFound(_) => Code::NotFound,
            Error::FailedPrecondition { .. } => Code::FailedPrecondition,
            Error::NotReady(_) => Code::DeadlineExceeded,
            Error::ResourceExhausted(_) => Code::ResourceExhausted,
            Error::Unavailable(_) => Code::Unavailable,
            Error::Workspace(w) => match w {
                workspace::Error::InvalidPath { .. }
                | workspace::Error::TooLarge(_)
                | workspace::Error::Loop(_) => Code::InvalidArgument,
                workspace::Error::Escape(_) => Code::PermissionDenied,
                workspace::Error::NotFound(_) => Code::NotFound,
                workspace::Error::WrongType { .. } => Code::FailedPrecondition,
                workspace::Error::NoSpace(_) => Code::ResourceExhausted,
                workspace::Error::Io { .. } => Code::Internal,
            },
            Error::Runtime(runtime::Error::Containerd(c)) => containerd_code(c),
            Error::Runtime(runtime::Error::Image(runtime::image::Error::NotFound(_))) => {
                Code::NotFound
            }
            Error::Runtime(runtime::Error::Image(runtime::image::Error::Containerd(c))) => {
                containerd_code(c)
            }
            Error::Relay(r) => r.code(),
            Error::Runtime(_) | Error::Metering(_) | Error::Internal(_) => Code::Internal,
        };
        if code == Code::Internal || code == Code::Unavailable {
            tracing::error!(error = %e, "request failed");
            // The full chain stays in the log; the caller gets a short message.
            let short = match &e {
                Error::Runtime(_) => "runtime failure (see node log)".to_string(),
                other => other.to_string(),
            };
            return Status::new(code, short);
        }
        Status::new(code, e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_map_as_the_spec_says() {
        let cases: Vec<(Error, Code)> = vec![
            (Error::InvalidArgument("x".into()), Code::InvalidArgument),
            (Error::NotFound("x".into()), Code::NotFound),
            (
                Error::FailedPrecondition {
                    id: "x".into(),
                    state: "FAILED".into(),
                },
                Code::FailedPrecondition,
            ),
            (Error::NotReady("x".into()), Code::DeadlineExceeded),
            (
                workspace::Error::Escape("x".into()).into(),
                Code::PermissionDenied,
            ),
            (
                workspace::Error::InvalidPath {
                    path: "..".into(),
                    why: "escapes",
                }
                .into(),
                Code::InvalidArgument,
            ),
            (
                workspace::Error::NotFound("x".into()).into(),
                Code::NotFound,
            ),
            (workspace::Error::TooLarge(1).into(), Code::InvalidArgument),
            (
                workspace::Error::NoSpace("x".into()).into(),
                Code::ResourceExhausted,
            ),
            (Error::Internal("x".into()), Code::Internal),
        ];
        for (e, code) in cases {
            assert_eq!(e.is_unavailable(), code == Code::Unavailable);
            let s: Status = e.into();
            assert_eq!(s.code(), code);
        }
        let down = Error::Runtime(runtime::Error::Containerd(
            runtime::containerd::Error::Call {
                op: "Tasks.Exec",
                what: "x".into(),
                status: Status::unavailable("connection refused"),
            },
        ));
        assert!(down.is_unavailable());
        assert!(Error::Unavailable("draining".into()).is_unavailable());
    }
}
