//! The one mapping from the node's errors to gRPC status codes (the spec's error table). The
//! full error goes to the log where it is turned into a Status; an INTERNAL or UNAVAILABLE
//! caller gets a short message without host details.

use tonic::{Code, Status};

use crate::node::Error;
use crate::workspace;

/// The gRPC code of a node error.
pub fn code(e: &Error) -> Code {
    match e {
        Error::InvalidArgument(_) => Code::InvalidArgument,
        Error::NotFound(_) | Error::NoSuchGrant { .. } | Error::Missing(_) => Code::NotFound,
        Error::Unimplemented(_) => Code::Unimplemented,
        Error::FailedPrecondition { .. } | Error::Precondition(_) => Code::FailedPrecondition,
        Error::NotReady(_) => Code::DeadlineExceeded,
        Error::ResourceExhausted(_) => Code::ResourceExhausted,
        Error::Unavailable(_) => Code::Unavailable,
        Error::Workspace(w) => workspace_code(w),
        Error::Runtime(r) if r.is_unavailable() => Code::Unavailable,
        Error::Runtime(r) if r.is_image_not_found() => Code::NotFound,
        Error::Relay(r) => r.code(),
        Error::ExecLost { .. } | Error::Runtime(_) | Error::Metering(_) | Error::Internal(_) => {
            Code::Internal
        }
    }
}

fn workspace_code(e: &workspace::Error) -> Code {
    use workspace::Error as W;
    match e {
        W::InvalidPath { .. } | W::InvalidMountPath { .. } | W::TooLarge(_) | W::Loop(_) => {
            Code::InvalidArgument
        }
        W::Escape(_) => Code::PermissionDenied,
        W::NotFound(_) => Code::NotFound,
        W::WrongType { .. } => Code::FailedPrecondition,
        W::NoSpace(_) => Code::ResourceExhausted,
        W::Io { .. } => Code::Internal,
    }
}

impl From<Error> for Status {
    fn from(e: Error) -> Self {
        let e = match e {
            // The relay's errors have their own mapping (it serves gRPC itself).
            Error::Relay(r) => return r.into(),
            e => e,
        };
        let code = code(&e);
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
    use crate::{relay, runtime};

    #[test]
    fn codes_map_as_the_spec_says() {
        let containerd = |status: Status| {
            Error::Runtime(runtime::Error::Containerd(
                runtime::containerd::Error::Call {
                    op: "Tasks.Exec",
                    what: "x".into(),
                    status,
                },
            ))
        };
        let cases: Vec<(Error, Code)> = vec![
            (Error::InvalidArgument("x".into()), Code::InvalidArgument),
            (Error::NotFound("x".into()), Code::NotFound),
            (Error::Missing("workspace x".into()), Code::NotFound),
            (Error::Precondition("x".into()), Code::FailedPrecondition),
            (
                Error::NoSuchGrant {
                    id: "x".into(),
                    grant: "g".into(),
                },
                Code::NotFound,
            ),
            (Error::Unimplemented("x".into()), Code::Unimplemented),
            (
                Error::FailedPrecondition {
                    id: "x".into(),
                    state: "FAILED".into(),
                },
                Code::FailedPrecondition,
            ),
            (Error::NotReady("x".into()), Code::DeadlineExceeded),
            (
                Error::ResourceExhausted("x".into()),
                Code::ResourceExhausted,
            ),
            (Error::Unavailable("draining".into()), Code::Unavailable),
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
                workspace::Error::InvalidMountPath {
                    path: "w".into(),
                    why: "must be absolute",
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
            (
                containerd(Status::unavailable("connection refused")),
                Code::Unavailable,
            ),
            (containerd(Status::unknown("shim died")), Code::Internal),
            (
                Error::Runtime(runtime::Error::Image(runtime::image::Error::NotFound(
                    "img".into(),
                ))),
                Code::NotFound,
            ),
            (
                Error::Relay(relay::Error::Unavailable("no worker".into())),
                Code::Unavailable,
            ),
            (
                Error::Relay(relay::Error::ResourceExhausted(4)),
                Code::ResourceExhausted,
            ),
            (
                Error::ExecLost {
                    id: "x".into(),
                    why: "agent went away".into(),
                },
                Code::Internal,
            ),
            (Error::Internal("x".into()), Code::Internal),
        ];
        for (e, want) in cases {
            let relay = matches!(e, Error::Relay(_));
            assert_eq!(
                e.is_unavailable(),
                want == Code::Unavailable && !relay,
                "{e}"
            );
            let s: Status = e.into();
            assert_eq!(s.code(), want);
            if want == Code::Internal {
                assert!(
                    !s.message().contains("shim died"),
                    "no runtime detail: {}",
                    s.message()
                );
            }
        }
    }
}
