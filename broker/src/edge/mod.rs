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

/// Most resource URIs one subscriber may name, on every edge (an HTTP
/// session or `subscriptions/listen`, a gRPC Subscribe stream, a frame
/// connection): each is kept and compared on every resource update.
pub const MAX_RESOURCE_SUBSCRIPTIONS: usize = 64;

/// Longest resource URI a subscriber may name, on every edge: each is kept
/// for as long as the subscription.
pub const MAX_SUBSCRIBED_URI_BYTES: usize = 2048;
pub(crate) mod rt;
