//! Inputs of the WASM host: the process-wide [`HostConfig`] and one
//! [`RouterSpec`] per router (built by the broker's config module).
//!
//! # Invariants
//! - Defaults grant nothing: no preopens, no environment, no arguments, no
//!   network (neither sockets nor `wasi:http`), stdio discarded.
//! - A router's memory limit never exceeds the host's pooled memory slot.

use std::path::PathBuf;
use std::time::Duration;

/// Default instances per router per shard: enough to overlap a few slow
/// calls without reserving much memory (each instance is a CoW memory slot).
pub const DEFAULT_INSTANCES_PER_SHARD: u32 = 4;
/// Default callers allowed to wait for an instance; beyond this a caller is
/// refused at once, so a stuck router cannot grow an unbounded backlog.
/// Sized for bursts: a call that is preempted at an epoch tick holds its
/// instance until the shard gets back to it, and a pipelining client can put
/// hundreds of requests behind that in a millisecond. Each waiter holds only
/// its frame (a `Bytes`), so 1024 bounds the backlog at about 1024 frames.
pub const DEFAULT_QUEUE_DEPTH: u32 = 1024;
/// Default per-call deadline: MCP tools are interactive; a call still running
/// after this is a stuck router, not a slow one.
pub const DEFAULT_CALL_DEADLINE: Duration = Duration::from_secs(5);
/// Default linear-memory cap per instance: ample for JSON routers, small
/// enough that a runaway allocation is refused quickly.
pub const DEFAULT_MAX_MEMORY_BYTES: usize = 64 << 20;
/// The largest linear memory a router may be given (`max_memory_bytes`):
/// the pooled slot's size, the same for every instance of every router.
pub const MAX_MEMORY_BYTES_LIMIT: usize = 256 << 20;
/// Default sessions per shard that hold their own instance of a
/// session-affine router: each costs a pooled slot per shard (reserved at
/// start-up) and the resident memory its state touches; beyond it the least
/// recently used idle session is dropped.
pub const DEFAULT_MAX_SESSIONS_PER_SHARD: u32 = 64;
/// Default idle time after which a session's instance (and its state) is
/// dropped: long enough for an interactive session's pauses, short enough
/// that abandoned sessions do not pin instances for long.
pub const DEFAULT_SESSION_IDLE_TIMEOUT: Duration = Duration::from_secs(600);
/// Default cap on the host memory one router answer may take: the
/// default frame limit (`frames.max_frame_bytes`), since the answer has to
/// fit in one response frame anyway.
pub const DEFAULT_MAX_RESULT_BYTES: usize = 4 << 20;
/// Default table-element cap per instance (function tables of Rust guests
/// hold a few hundred entries).
pub const DEFAULT_MAX_TABLE_ELEMENTS: usize = 20_000;

/// The variable that gives the bundled `upstream` router its upstream's
/// URL ([`Grants::vars`]): a router granted it is an upstream router.
pub const UPSTREAM_URL_VAR: &str = "MCP_UPSTREAM_URL";
/// The longest a call of a [`RouterSpec::never_waits`] router may run its
/// guest code (counted in epoch ticks, so time the shard's thread spends
/// preempted does not count): it holds its shard's thread the whole time,
/// so past this it fails as deadline exceeded, before its `call_deadline`.
pub const NEVER_WAITS_MAX_RUN: Duration = Duration::from_millis(10);

/// WASI capabilities granted to one router. [`Default`] grants nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Grants {
    /// Send the guest's stdout and stderr to the broker's stderr (the log
    /// stream; the broker's stdout carries the ready line). Otherwise both
    /// are discarded.
    pub stdio_to_stderr: bool,
    /// Environment variables passed through by name, with the value the
    /// broker's process has at load time (unset names are skipped). Secrets
    /// stay in the operator's environment, not in the config file.
    pub env: Vec<String>,
    /// Host directories opened read-only for the guest.
    pub read_only_dirs: Vec<DirGrant>,
    /// Environment variables with values the broker supplies (e.g. the
    /// `upstream` router's `MCP_UPSTREAM_URL`), set after [`Self::env`].
    pub vars: Vec<(String, String)>,
    /// Outgoing HTTP to one origin (`wasi:http`, linked only with this
    /// grant; see `outbound.rs`).
    pub http: Option<super::HttpGrant>,
}

/// One read-only directory preopened for a guest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirGrant {
    /// Directory on the host.
    pub host: PathBuf,
    /// Path under which the guest sees it (e.g. `/data`).
    pub guest: String,
}

/// How a session-affine router keeps one instance per session on a shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionLimits {
    /// Sessions per shard holding their own instance (at least 1). At the
    /// cap, a new session evicts the least recently used session with no
    /// call in flight, or is refused as overloaded when every session has
    /// one.
    pub max_per_shard: u32,
    /// A session with no call for this long loses its instance and state.
    pub idle_timeout: Duration,
}

impl Default for SessionLimits {
    fn default() -> Self {
        Self {
            max_per_shard: DEFAULT_MAX_SESSIONS_PER_SHARD,
            idle_timeout: DEFAULT_SESSION_IDLE_TIMEOUT,
        }
    }
}

/// One router to load: what the broker's config says about it.
#[derive(Debug, Clone, PartialEq)]
pub struct RouterSpec {
    /// Name used in routes, metrics and errors.
    pub name: String,
    /// The component file (`.wasm`).
    pub wasm: PathBuf,
    /// Instances per shard; each serves one call at a time. More overlap slow
    /// calls; each costs one pooled memory slot per shard. At least 1.
    pub instances_per_shard: u32,
    /// Callers allowed to wait per shard when every instance is busy (0: no
    /// waiting, refuse at once). Deeper queues absorb bursts but add latency.
    pub queue_depth: u32,
    /// Default per-call deadline (a call may pass its own).
    pub call_deadline: Duration,
    /// Linear memory cap per instance, in bytes.
    pub max_memory_bytes: usize,
    /// Table elements cap per instance.
    pub max_table_elements: usize,
    /// Host memory one answer (`call-tool`, `read-resource`, `get-prompt`,
    /// `complete`) may take, strings and lists as read out of the guest; a
    /// larger answer fails the call as a router fault before it is copied. Linear memory bounds what a guest holds,
    /// not this: one string referenced a million times is copied a million
    /// times.
    pub max_result_bytes: usize,
    /// Check that every `json` field of an answer is JSON (costs a parse of
    /// structured content per call; keeps a broken router from sending
    /// broken JSON to clients).
    pub validate_json: bool,
    /// WASI capabilities.
    pub grants: Grants,
    /// `Some`: session-affine; calls with a session id run on that
    /// session's own instance (see `RouterPool::caller`). `None`: every call
    /// runs on the shared instances.
    pub sessions: Option<SessionLimits>,
    /// The router never waits (no sleeps, no outgoing requests, no file
    /// reads): its calls run synchronously on the shard's own stack instead
    /// of on a fiber, which saves the fiber's switches and the async
    /// machinery on every call. A call cannot yield to other tasks, so its
    /// guest code may run [`NEVER_WAITS_MAX_RUN`] at most; a component
    /// that could wait (an HTTP or directory grant) is refused at load, and
    /// one that tries to sleep traps.
    pub never_waits: bool,
}

impl RouterSpec {
    /// A spec with the documented defaults and nothing granted.
    pub fn new(name: impl Into<String>, wasm: impl Into<PathBuf>) -> Self {
        Self {
            name: name.into(),
            wasm: wasm.into(),
            instances_per_shard: DEFAULT_INSTANCES_PER_SHARD,
            queue_depth: DEFAULT_QUEUE_DEPTH,
            call_deadline: DEFAULT_CALL_DEADLINE,
            max_memory_bytes: DEFAULT_MAX_MEMORY_BYTES,
            max_table_elements: DEFAULT_MAX_TABLE_ELEMENTS,
            max_result_bytes: DEFAULT_MAX_RESULT_BYTES,
            validate_json: true,
            grants: Grants::default(),
            sessions: None,
            never_waits: false,
        }
    }

    /// The spec of a bundled router (`echo`, `kv`, `library`, `chaos`) in
    /// [`super::default_routers_dir`].
    pub fn bundled(name: &str) -> Self {
        Self::new(
            name,
            super::default_routers_dir().join(format!("{name}.wasm")),
        )
    }
}

/// Process-wide host settings (one engine per process).
#[derive(Debug, Clone)]
pub struct HostConfig {
    /// Component instances the pooling allocator reserves, across all shards
    /// and routers (plus one transient instance per router load). Each is
    /// virtual address space, not resident memory.
    pub max_instances: u32,
    /// Largest linear memory any router may be given, in bytes (the pooled
    /// slot size; [`RouterSpec::max_memory_bytes`] must not exceed it).
    pub max_memory_bytes: usize,
    /// Wasm stack bound: deeper recursion traps as a stack overflow.
    pub max_wasm_stack: usize,
    /// Epoch tick: how often a running guest yields to its shard's loop and
    /// has its deadline checked. Shorter is fairer and costs more wakeups.
    pub epoch_tick: Duration,
    /// Capture wasm backtraces in trap messages: useful to debug a router,
    /// but costs microseconds on every trap.
    pub trap_backtraces: bool,
}

impl Default for HostConfig {
    fn default() -> Self {
        Self {
            max_instances: 1000,
            max_memory_bytes: MAX_MEMORY_BYTES_LIMIT,
            max_wasm_stack: 512 << 10,
            epoch_tick: Duration::from_millis(1),
            trap_backtraces: false,
        }
    }
}
