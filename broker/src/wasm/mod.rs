//! The WASM router host: runs MCP routers packaged as WebAssembly components
//! (`wasix:mcp/router@25.6.18`) in per-shard pools of pooled wasmtime
//! instances. The only module of the broker that knows wasmtime.
//!
//! Lifecycle: [`WasmHost::new`] once per process (engine, epoch ticker, WASI
//! I/O runtime) → [`WasmHost::load`] once per router (compile, check imports
//! and exports, read [`RouterMeta`]) → [`RouterPool::new`] once per shard per
//! router → `call_tool` / `read_resource` / `get_prompt` / `complete` on the
//! shard (through [`RouterPool::caller`] for a session's own instance). See `docs/why-wasm-pooling.md` for the reasons.
//!
//! # Invariants
//! - One engine per process; a component is compiled once, its
//!   `InstancePre` shared by every shard.
//! - A pool belongs to one shard thread (`!Send`) and takes no locks.
//! - A guest never blocks a shard: running guest code yields at every epoch
//!   tick, and WASI waits (timers, files) run on the host's tokio runtime and
//!   wake the shard's task across threads (monoio needs its `sync` feature).
//! - Every call has a deadline; a trap, deadline, out-of-memory or stack
//!   overflow discards the instance and a fresh one replaces it.
//! - A call's answer is measured while it is read out of the guest and
//!   refused past `max_result_bytes` before it is copied (`metered`).
//! - A router gets no WASI capability its [`Grants`] do not name.

mod bindings;
mod error;
mod guest_output;
mod host;
mod json_check;
mod metered;
mod outbound;
mod pool;
mod spec;
mod ticker;

use std::path::PathBuf;

pub use bindings::ROUTER_INTERFACE;
pub use bindings::types;
pub use error::{CallError, HostError, LoadError};
pub use host::{
    GuestYield, LiveEvent, LiveSink, MAX_LIVE_EVENTS_PER_CALL, MetaReader, Router, RouterMeta,
    UNAVAILABLE_META_KEY, WasmHost, set_thread_yield,
};
pub use outbound::{HttpGrant, OutboundCounters};
pub use pool::{Caller, PoolStats, RouterPool};
pub use spec::{
    DEFAULT_CALL_DEADLINE, DEFAULT_INSTANCES_PER_SHARD, DEFAULT_MAX_MEMORY_BYTES,
    DEFAULT_MAX_RESULT_BYTES, DEFAULT_MAX_SESSIONS_PER_SHARD, DEFAULT_MAX_TABLE_ELEMENTS,
    DEFAULT_QUEUE_DEPTH, DEFAULT_SESSION_IDLE_TIMEOUT, DirGrant, Grants, HostConfig,
    MAX_MEMORY_BYTES_LIMIT, NEVER_WAITS_MAX_RUN, RouterSpec, SessionLimits, UPSTREAM_URL_VAR,
};

/// Environment variable naming the directory of the bundled routers.
pub const ROUTERS_DIR_ENV: &str = "MCP_BROKER_ROUTERS_DIR";

/// Names of the bundled routers, as built by `scripts/build-routers`.
pub const BUNDLED_ROUTERS: [&str; 5] = ["echo", "kv", "library", "chaos", "upstream"];

/// The bundled component that fronts a remote MCP server: what a router
/// configured with `upstream = URL` runs (`routers/upstream`).
pub const UPSTREAM_ROUTER: &str = "upstream";

/// Where the bundled routers' `.wasm` files are found: `$MCP_BROKER_ROUTERS_DIR`
/// if set; else `routers/` beside the running executable if it exists (an
/// installed layout); else the build output of `scripts/build-routers` in
/// this source tree.
pub fn default_routers_dir() -> PathBuf {
    // Set but empty is unset, as for the config's `routers_dir = ""`: it
    // read the working directory.
    if let Some(dir) = std::env::var_os(ROUTERS_DIR_ENV).filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    if let Some(dir) = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|p| p.join("routers")))
        .filter(|dir| dir.is_dir())
    {
        return dir;
    }
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../routers/target/wasm32-wasip2/release"
    ))
}
