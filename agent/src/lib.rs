//! The in-sandbox agent's library: the sandbox.v1 worker types, the framing used over stdio,
//! and the parser of the commands the node daemon sends (see `command`).

pub mod command;
pub mod frame;

/// `sandbox.v1`, worker side.
pub mod pb {
    #![allow(missing_docs, clippy::all)]
    tonic::include_proto!("sandbox.v1");
}
