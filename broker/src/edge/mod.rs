//! The edges: how requests reach the one dispatch path.
//!
//! - frames: size-prefixed FlatBuffers on TCP, served by each shard's own
//!   connection loop (`crate::shard`);
//! - [`grpc`]: the gRPC edge (tonic's service on hyper's HTTP/2 server),
//!   served on the shard threads, which turns each RPC into a frame;
//! - [`http`]: the MCP Streamable HTTP edge, served on the shard threads;
//! - [`rt`]: hyper's I/O, timer and executor on a shard (both hyper edges).
//!
//! Every edge turns its input into the same `VerifiedRequest` and runs it
//! through `crate::dispatch::handle`.

pub mod frames;
pub mod grpc;
pub mod http;
pub(crate) mod rt;
