//! The API layer: the generated wire types, the conversions between them and the domain
//! types ([`convert`]), the one mapping of domain errors to gRPC status codes ([`status`]),
//! and the node's gRPC services ([`services`]).

pub mod convert;
pub mod services;
pub mod status;

/// A generated proto package `$pkg.v1` as module `$pkg::v1`.
macro_rules! package {
    ($(#[doc = $doc:literal] $pkg:ident = $name:literal;)*) => {
        $(
            #[doc = $doc]
            #[allow(missing_docs, clippy::large_enum_variant)]
            pub mod $pkg {
                /// Version 1.
                pub mod v1 {
                    tonic::include_proto!($name);
                }
            }
        )*
    };
}

package! {
    /// `common.v1`: shared message types.
    common = "common.v1";
    /// `compute.v1`: the ComputeService.
    compute = "compute.v1";
    /// `admin.v1`: the operator's view of a node.
    admin = "admin.v1";
    /// `sandbox.v1`: the relay between harnesses and workers.
    sandbox = "sandbox.v1";
    /// `node.v1`: what a node tells the router.
    node = "node.v1";
    /// `platform.v1`: the sandbox platform API (served by the node, in part).
    platform = "platform.v1";
}

/// The encoded file descriptor set of every proto this crate serves, for server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("compute_descriptor");
