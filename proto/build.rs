//! Generates the `turbomcp.mcp.v1` types, client and server from
//! `mcp.proto`, and writes its file descriptor set (served by reflection).
//!
//! `protoc` is the binary shipped inside `protoc-bin-vendored`, passed to
//! prost-build directly (not through `PROTOC` in the environment), so the
//! build needs nothing installed and cannot pick up a different protoc.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    let mut config = prost_build::Config::new();
    config.protoc_executable(protoc);
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // The client is for tests and the load generator; none of them
        // needs a transport-bound `connect`, and keeping it off keeps this
        // crate free of a tonic transport dependency.
        .build_transport(false)
        .file_descriptor_set_path(out.join("mcp_descriptor.bin"))
        .compile_with_config(config, &["mcp.proto"], &["."])?;
    println!("cargo:rerun-if-changed=mcp.proto");
    Ok(())
}
