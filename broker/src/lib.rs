//! `mcp-broker`: the thread-per-core MCP broker.
//!
//! See `ARCHITECTURE.md` at the repository root for the bird's-eye view.

pub mod wasm;
