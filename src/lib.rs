//! The gVisor compute service: a node daemon that runs untrusted code in gVisor sandboxes
//! through containerd, meters it, and keeps its workspaces.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod api;
pub mod cli;
pub mod client;
pub mod config;
pub mod egress;
pub mod flow;
pub mod install;
pub mod metering;
pub mod metrics;
pub mod node;
pub mod platform;
pub mod preview;
pub mod relay;
pub mod router;
pub mod runtime;
pub mod server;
pub mod size;
pub mod tasks;
pub mod volume;
pub mod workspace;
