//! The gRPC services of one node over [`crate::node::Node`]: ComputeService (the tenants'
//! API), NodeAdmin (the operators', computectl's backend) and NodeInfo (the router's). Each
//! handler turns the request into a domain call and the domain's error into a Status
//! (`api::status`), nothing more.

pub mod admin;
pub mod compute;
pub mod info;

pub use admin::AdminService;
pub use compute::ComputeApi;
pub use info::InfoApi;
