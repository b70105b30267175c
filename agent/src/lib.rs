//! The in-sandbox agent's library: the sandbox.v1 worker types, the framing used over stdio,
//! the pacing of exec output (see `flow`), the parser of the commands the node daemon sends (see `command`), and the lean process
//! start they run with (see `spawn`).

pub mod command;
pub mod flow;
pub mod frame;
pub mod spawn;

/// `sandbox.v1`, worker side.
pub mod pb {
    #![allow(missing_docs, clippy::all)]
    tonic::include_proto!("sandbox.v1");
}
