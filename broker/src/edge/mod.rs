//! The edges: how requests reach the one dispatch path.
//!
//! - frames: size-prefixed FlatBuffers on TCP, served by each shard's own
//!   connection loop (`crate::shard`);
//! - [`grpc`]: the gRPC edge (tonic), which turns each RPC into a frame;
//! - [`http`]: the MCP Streamable HTTP edge, served on the shard threads.
//!
//! Every edge turns its input into the same `VerifiedRequest` and runs it
//! through `crate::dispatch::handle`.

pub mod frames;
pub mod grpc;
pub mod http;
