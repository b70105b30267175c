//! Compiles the service protos with tonic-prost-build and writes the descriptor set that server
//! reflection serves.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    tonic_prost_build::configure()
        .file_descriptor_set_path(out.join("compute_descriptor.bin"))
        // File contents as `Bytes`: decoded as a slice of the receive buffer (no 16 MiB copy),
        // and a read's Vec becomes the response without one.
        .bytes(".compute.v1.WriteFileRequest.data")
        .bytes(".compute.v1.ReadFileResponse.data")
        .compile_protos(
            &[
                "proto/compute/v1/compute.proto",
                "proto/common/v1/usage.proto",
                "proto/node/v1/node.proto",
                "proto/admin/v1/admin.proto",
                "proto/sandbox/v1/sandbox.proto",
            ],
            &["proto"],
        )?;
    // The platform API (issue 16), in a descriptor set of its own: the node's reflection
    // serves it, the router's not yet.
    tonic_prost_build::configure()
        .file_descriptor_set_path(out.join("platform_descriptor.bin"))
        .extern_path(".common.v1", "crate::api::common::v1")
        .compile_protos(&["proto/platform/v1/platform.proto"], &["proto"])?;
    println!("cargo:rerun-if-changed=proto");
    Ok(())
}
