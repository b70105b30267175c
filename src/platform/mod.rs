//! The sandbox platform API (`../shared/spec/sandbox-platform-api.md`,
//! `proto/platform/v1/platform.proto`): long-lived sandboxes in namespaces, reached with API
//! keys that hold roles. Served by the node and the router ([`service`]: access and
//! environments whole, sandboxes and their run logs in [`sandboxes`], the rest behind the gate
//! answering UNIMPLEMENTED until its issue): who may call what ([`access`])
//! and how a call's credentials are checked ([`auth`]), the keys ([`keys`]), what is kept and
//! how a caller's input is validated ([`records`]), and where the records live ([`store`]: one node's
//! embedded database, or Kubernetes objects for a cluster, [`kube_store`]).

pub mod access;
pub mod auth;
pub mod exec;
pub mod keys;
pub mod kube_store;
pub mod records;
pub mod sandboxes;
pub mod service;
pub mod store;
pub mod workspaces;
