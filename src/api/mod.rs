//! The API layer: the generated wire types, the conversions between them and the domain
//! types ([`convert`]), the one mapping of domain errors to gRPC status codes ([`status`]),
//! and the node's gRPC services ([`services`]).

pub mod convert;
pub mod services;
pub mod status;

/// `common.v1`: shared message types.
#[allow(missing_docs, clippy::large_enum_variant)]
pub mod common {
    /// Version 1.
    pub mod v1 {
        tonic::include_proto!("common.v1");
    }
}

/// `compute.v1`: the ComputeService.
#[allow(missing_docs, clippy::large_enum_variant)]
pub mod compute {
    /// Version 1.
    pub mod v1 {
        tonic::include_proto!("compute.v1");
    }
}

/// `admin.v1`: the operator's view of a node.
#[allow(missing_docs, clippy::large_enum_variant)]
pub mod admin {
    /// Version 1.
    pub mod v1 {
        tonic::include_proto!("admin.v1");
    }
}

/// `sandbox.v1`: the relay between harnesses and workers.
#[allow(missing_docs, clippy::large_enum_variant)]
pub mod sandbox {
    /// Version 1.
    pub mod v1 {
        tonic::include_proto!("sandbox.v1");
    }
}

/// `node.v1`: what a node tells the router.
#[allow(missing_docs, clippy::large_enum_variant)]
pub mod node {
    /// Version 1.
    pub mod v1 {
        tonic::include_proto!("node.v1");
    }
}

/// The encoded file descriptor set of every proto this crate serves, for server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("compute_descriptor");
