//! `mcp-broker`: the thread-per-core MCP broker.
//!
//! See `ARCHITECTURE.md` at the repository root for the bird's-eye view and
//! the request path. Module map: [`shard`] (threads, runtimes, drain),
//! [`edge`] (frames, gRPC and MCP HTTP: the three ways in),
//! [`dispatch`] (one request → its responses), [`route`] (the immutable route
//! table), [`adapt`] (WIT results → wire frames), [`wasm`] (the only module
//! that knows wasmtime), [`config`], [`metrics`], [`process`] (the CPU mask
//! and descriptor limit it inherited), [`server`] (start-up and shutdown),
//! [`routing`] (the route table with the routers that serve it, swapped
//! whole), [`control`] (the thread that swaps it: reloads and upstream
//! refreshes), [`upstream`] (upstream routers' status).

pub mod adapt;
pub mod auth;
pub mod coarse;
pub mod config;
pub mod control;
pub mod dispatch;
pub mod edge;
pub mod escaped;
mod fault;
mod header_declarations;
pub mod idle_poll;
mod local;
pub mod metrics;
pub mod process;
pub mod route;
pub mod routing;
pub mod server;
pub mod shard;
pub mod shared;
pub mod tls;
pub mod upstream;
pub mod wasm;
