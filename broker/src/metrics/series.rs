//! The label space (its capacity fixed at start-up) and one shard's series
//! in it.
//!
//! Every label set is bounded and allocated before the first request, so
//! each series is a slot in a flat array indexed by label numbers:
//! recording is index arithmetic and a relaxed store, never a map
//! insertion.
//!
//! # Invariants
//! - `router` takes the names of every router the process has served
//!   (configured at start-up or added by a reload) plus `broker` (answered
//!   by the broker itself: initialize, ping, listings, unknown names).
//! - `tool` takes the tool names route tables have served, plus, per
//!   router, `other` (a tool past the label capacity, or unknown) and
//!   `none` (not a tool call).
//! - Labels are registered off the shards (start-up, reload, upstream
//!   refresh) before any shard can record under them; the arrays never
//!   grow.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::AtomicU64;

use mcp_schema::{ErrorCode, RequestKind};

use super::hist::AtomicHistogram;

/// Where a request came in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Edge {
    Frames = 0,
    Grpc = 1,
    Http = 2,
}

impl Edge {
    pub const ALL: [Edge; 3] = [Edge::Frames, Edge::Grpc, Edge::Http];
    pub const fn as_str(self) -> &'static str {
        match self {
            Edge::Frames => "frames",
            Edge::Grpc => "grpc",
            Edge::Http => "http",
        }
    }
}

/// How a request ended, as its final response says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Ok = 0,
    ParseError,
    InvalidRequest,
    NotFound,
    InvalidParams,
    Internal,
    Overloaded,
    DeadlineExceeded,
    RouterFault,
    Unauthorized,
    ShuttingDown,
    ExecutionError,
    UpstreamUnavailable,
    /// The client cancelled the request, and was answered so (MCP's
    /// -32800, `edge::http::REQUEST_CANCELLED`).
    Cancelled,
    /// An error code the broker does not define (or an unreadable frame).
    OtherError,
}

impl Outcome {
    pub const COUNT: usize = 15;
    pub const ALL: [Outcome; Outcome::COUNT] = [
        Outcome::Ok,
        Outcome::ParseError,
        Outcome::InvalidRequest,
        Outcome::NotFound,
        Outcome::InvalidParams,
        Outcome::Internal,
        Outcome::Overloaded,
        Outcome::DeadlineExceeded,
        Outcome::RouterFault,
        Outcome::Unauthorized,
        Outcome::ShuttingDown,
        Outcome::ExecutionError,
        Outcome::UpstreamUnavailable,
        Outcome::Cancelled,
        Outcome::OtherError,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::ParseError => "parse_error",
            Outcome::InvalidRequest => "invalid_request",
            Outcome::NotFound => "not_found",
            Outcome::InvalidParams => "invalid_params",
            Outcome::Internal => "internal",
            Outcome::Overloaded => "overloaded",
            Outcome::DeadlineExceeded => "deadline_exceeded",
            Outcome::RouterFault => "router_fault",
            Outcome::Unauthorized => "unauthorized",
            Outcome::ShuttingDown => "shutting_down",
            Outcome::ExecutionError => "execution_error",
            Outcome::UpstreamUnavailable => "upstream_unavailable",
            Outcome::Cancelled => "cancelled",
            Outcome::OtherError => "other_error",
        }
    }

    pub fn from_code(code: i32) -> Outcome {
        if code == -32800 {
            return Outcome::Cancelled;
        }
        match ErrorCode::from_code(code) {
            Some(ErrorCode::ParseError) => Outcome::ParseError,
            Some(ErrorCode::InvalidRequest) => Outcome::InvalidRequest,
            Some(ErrorCode::NotFound) => Outcome::NotFound,
            Some(ErrorCode::InvalidParams) => Outcome::InvalidParams,
            Some(ErrorCode::Internal) => Outcome::Internal,
            Some(ErrorCode::Overloaded) => Outcome::Overloaded,
            Some(ErrorCode::DeadlineExceeded) => Outcome::DeadlineExceeded,
            Some(ErrorCode::RouterFault) => Outcome::RouterFault,
            Some(ErrorCode::Unauthorized) => Outcome::Unauthorized,
            Some(ErrorCode::ShuttingDown) => Outcome::ShuttingDown,
            Some(ErrorCode::ExecutionError) => Outcome::ExecutionError,
            Some(ErrorCode::UpstreamUnavailable) => Outcome::UpstreamUnavailable,
            _ => Outcome::OtherError,
        }
    }
}

/// Why a frame was rejected before it became a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reject {
    /// Length prefix over `frames.max_frame_bytes`: the connection closes.
    TooLarge = 0,
    /// Failed FlatBuffers verification as a `Request`.
    Invalid,
    /// A payload type this broker does not know.
    UnsupportedPayload,
    /// Well-formed but unusable (e.g. an empty tool name).
    InvalidRequest,
}

impl Reject {
    pub const COUNT: usize = 4;
    pub const ALL: [Reject; Reject::COUNT] = [
        Reject::TooLarge,
        Reject::Invalid,
        Reject::UnsupportedPayload,
        Reject::InvalidRequest,
    ];
    pub const fn as_str(self) -> &'static str {
        match self {
            Reject::TooLarge => "too_large",
            Reject::Invalid => "invalid",
            Reject::UnsupportedPayload => "unsupported_payload",
            Reject::InvalidRequest => "invalid_request",
        }
    }
    pub fn of(e: &mcp_schema::FrameError) -> Reject {
        match e {
            mcp_schema::FrameError::TooLarge { .. } => Reject::TooLarge,
            mcp_schema::FrameError::Invalid(_) => Reject::Invalid,
            mcp_schema::FrameError::UnsupportedPayload(_) => Reject::UnsupportedPayload,
            _ => Reject::InvalidRequest,
        }
    }
}

/// The statuses `mcp_http_responses_total` has a series for: every one the
/// HTTP edge answers with. Any other (none today) counts as `other`.
pub const HTTP_STATUSES: [u16; 14] = [
    200, 202, 204, 400, 401, 403, 404, 405, 406, 408, 413, 415, 500, 503,
];

/// The slot of `status` in a counter array of `HTTP_STATUSES.len() + 1`
/// (the last one: `other`).
pub fn http_status_slot(status: u16) -> usize {
    HTTP_STATUSES
        .iter()
        .position(|&s| s == status)
        .unwrap_or(HTTP_STATUSES.len())
}

const KINDS: usize = RequestKind::ALL.len();

pub fn kind_index(k: RequestKind) -> usize {
    // `ALL` is in declaration order, so the discriminant is the index.
    k as usize
}

/// FNV-1a: tool names are short, and SipHash's DoS resistance buys nothing
/// for a map that never grows after start-up.
#[derive(Default)]
pub struct Fnv(u64);

impl Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        let mut h = if self.0 == 0 {
            0xcbf2_9ce4_8422_2325
        } else {
            self.0
        };
        for b in bytes {
            h ^= *b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        self.0 = h;
    }
}

/// The label space: shared by every shard and the admin thread. Its
/// capacity is fixed at start-up (so every series is a preallocated slot);
/// its names only grow, as configuration reloads bring routers and tools
/// it has not seen, and a name keeps its slot for the life of the process,
/// so that a router's counters carry on across reloads that keep or
/// replace it.
#[derive(Debug)]
pub struct Layout {
    /// Router slots (slot [`BROKER`] is `broker`).
    pub router_capacity: usize,
    /// Latency label slots (a tool of a router, or a router's `other` /
    /// `none`).
    pub label_capacity: usize,
    names: std::sync::Mutex<Names>,
    /// Whether the shards record requests and latencies (the switch the
    /// cost benchmark flips; see `docs/metrics.md`).
    pub recording: bool,
}

/// The names registered so far.
#[derive(Debug, Default, Clone)]
pub struct Names {
    /// By router slot.
    pub routers: Vec<Box<str>>,
    /// By label: (router slot, tool name or `other` / `none`).
    pub labels: Vec<(usize, Box<str>)>,
    /// By router slot: its `other` and `none` labels.
    pub router_labels: Vec<(u32, u32)>,
    label_index: HashMap<(usize, Box<str>), u32, BuildHasherDefault<Fnv>>,
}

/// A count of registered names ([`Layout::registered`]).
#[derive(Debug, Clone, Copy)]
pub struct Registered {
    routers: usize,
    labels: usize,
}

/// The router slot of requests the broker answers itself.
pub const BROKER: usize = 0;
/// `broker`'s `other` (an unknown tool) and `none` (not a tool call) labels.
pub const BROKER_OTHER: u32 = 0;
pub const BROKER_NONE: u32 = 1;

/// Router names a process may see beyond those it started with, over all
/// its reloads (a reload that would exceed it is refused).
pub const RELOAD_ROUTER_HEADROOM: usize = 64;
/// Tool labels beyond those known at start-up; past them a new tool is
/// counted under its router's `other`.
pub const RELOAD_LABEL_HEADROOM: usize = 2048;

/// The environment variable that turns request recording off
/// (`MCP_BROKER_METRICS=off`): for the metrics-cost benchmark only.
pub const RECORDING_ENV: &str = "MCP_BROKER_METRICS";

impl Layout {
    /// Room for `routers` configured routers and `tools` tools, plus the
    /// reload headroom.
    pub fn new(routers: usize, tools: usize) -> Self {
        let router_capacity = 1 + routers + RELOAD_ROUTER_HEADROOM;
        let label_capacity = tools + 2 * router_capacity + RELOAD_LABEL_HEADROOM;
        let recording =
            std::env::var(RECORDING_ENV).map_or(true, |v| !v.trim().eq_ignore_ascii_case("off"));
        let layout = Self {
            router_capacity,
            label_capacity,
            names: std::sync::Mutex::default(),
            recording,
        };
        let broker = layout.router_slot("broker");
        debug_assert_eq!(broker, Some(BROKER));
        layout
    }

    fn names(&self) -> std::sync::MutexGuard<'_, Names> {
        self.names.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How many router slots are registered (`broker` included).
    pub fn routers_registered(&self) -> usize {
        self.names().routers.len()
    }

    /// The registered names (for rendering).
    pub fn snapshot(&self) -> Names {
        self.names().clone()
    }

    /// The slot of router `name`, registered on first sight; `None` when
    /// the capacity is spent.
    pub fn router_slot(&self, name: &str) -> Option<usize> {
        let mut n = self.names();
        if let Some(i) = n.routers.iter().position(|r| &**r == name) {
            return Some(i);
        }
        if n.routers.len() >= self.router_capacity {
            return None;
        }
        let slot = n.routers.len();
        n.routers.push(name.into());
        let other = Self::add_label(&mut n, slot, "other");
        let none = Self::add_label(&mut n, slot, "none");
        n.router_labels.push((other, none));
        Some(slot)
    }

    fn add_label(n: &mut Names, slot: usize, tool: &str) -> u32 {
        let label = n.labels.len() as u32;
        n.labels.push((slot, tool.into()));
        n.label_index.insert((slot, tool.into()), label);
        label
    }

    /// How many router and label names are registered now: taken before a
    /// reload registers its own, so that a refused one can take them back
    /// ([`Self::forget_since`]).
    pub fn registered(&self) -> Registered {
        let n = self.names();
        Registered {
            routers: n.routers.len(),
            labels: n.labels.len(),
        }
    }

    /// Forgets the names registered since `mark`: those of a reload that
    /// was refused before any of its routers ran, whose series are all
    /// zero. Kept, they spent the capacity: 70 refused reloads once made a
    /// valid one adding a new name fail with "already served 66 router
    /// names". Only the control thread registers names, so no other
    /// registration lies between.
    pub fn forget_since(&self, mark: Registered) {
        let mut n = self.names();
        n.routers.truncate(mark.routers);
        n.router_labels.truncate(mark.routers);
        let gone: Vec<_> = n.labels.drain(mark.labels..).collect();
        for key in gone {
            n.label_index.remove(&key);
        }
    }

    /// The `other` and `none` labels of router slot `slot`.
    pub fn router_labels(&self, slot: usize) -> (u32, u32) {
        self.names()
            .router_labels
            .get(slot)
            .copied()
            .unwrap_or((BROKER_OTHER, BROKER_NONE))
    }

    /// The label of tool `tool` of router slot `slot`, registered on first
    /// sight; its router's `other` once the capacity is spent.
    pub fn tool_label(&self, slot: usize, tool: &str) -> u32 {
        let mut n = self.names();
        if let Some(&l) = n.label_index.get(&(slot, tool.into())) {
            return l;
        }
        // Room stays for the `other` and `none` of every router slot not
        // yet registered, so a router a reload brings always gets them.
        let reserved = 2 * (self.router_capacity - n.routers.len());
        if n.labels.len() + reserved >= self.label_capacity {
            return n.router_labels.get(slot).map_or(BROKER_OTHER, |l| l.0);
        }
        Self::add_label(&mut n, slot, tool)
    }

    pub fn request_slot(&self, edge: Edge, router: usize, kind: usize, outcome: Outcome) -> usize {
        ((edge as usize * self.router_capacity + router) * KINDS + kind) * Outcome::COUNT
            + outcome as usize
    }
    pub fn request_slots(&self) -> usize {
        Edge::ALL.len() * self.router_capacity * KINDS * Outcome::COUNT
    }
}

/// One shard's request series: written by that shard only.
#[derive(Debug)]
pub struct ShardSeries {
    /// `mcp_requests_total`, by `request_slot`.
    pub requests: Box<[AtomicU64]>,
    /// `mcp_request_duration_seconds`, by label.
    pub duration: Box<[AtomicHistogram]>,
    /// `mcp_wasm_call_duration_seconds`, by router slot (`broker`'s unused).
    pub wasm: Box<[AtomicHistogram]>,
    /// `mcp_queue_wait_seconds`, by router (with `broker`).
    pub queue: Box<[AtomicHistogram]>,
    /// `mcp_frames_rejected_total`, by [`Reject`].
    pub rejected: [AtomicU64; Reject::COUNT],
}

impl ShardSeries {
    pub fn new(layout: &Layout) -> Self {
        let routers = layout.router_capacity;
        Self {
            requests: (0..layout.request_slots())
                .map(|_| AtomicU64::new(0))
                .collect(),
            duration: (0..layout.label_capacity)
                .map(|_| AtomicHistogram::default())
                .collect(),
            wasm: (0..routers).map(|_| AtomicHistogram::default()).collect(),
            queue: (0..routers).map(|_| AtomicHistogram::default()).collect(),
            rejected: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_keep_their_slots_and_the_capacity_holds() {
        let layout = Layout::new(2, 3);
        assert_eq!(layout.router_slot("broker"), Some(BROKER));
        let echo = layout.router_slot("echo").unwrap();
        let kv = layout.router_slot("kv").unwrap();
        assert_ne!(echo, kv);
        // A name seen before keeps its slot (a replaced router counts on).
        assert_eq!(layout.router_slot("echo"), Some(echo));
        let t = layout.tool_label(echo, "echo");
        assert_eq!(layout.tool_label(echo, "echo"), t);
        assert_ne!(layout.tool_label(kv, "echo"), t, "labels are per router");
        let (other, none) = layout.router_labels(kv);
        assert_ne!(other, none);
        let names = layout.snapshot();
        assert_eq!(&*names.routers[kv], "kv");
        assert_eq!(names.labels[t as usize], (echo, "echo".into()));
        // Routers past the capacity are refused, not wrapped.
        let mut added = 0;
        while layout.router_slot(&format!("r{added}")).is_some() {
            added += 1;
        }
        assert_eq!(layout.routers_registered(), layout.router_capacity);
        assert_eq!(added, layout.router_capacity - 3);
        // Tools past the label capacity fall to their router's `other`.
        let mut last = 0;
        for i in 0..layout.label_capacity + 1 {
            last = layout.tool_label(echo, &format!("t{i}"));
        }
        assert_eq!(last, layout.router_labels(echo).0);
        assert!(layout.snapshot().labels.len() <= layout.label_capacity);
        // Tools filling the labels first still leave room for every router.
        let fresh = Layout::new(1, 0);
        let r = fresh.router_slot("r").unwrap();
        for i in 0..fresh.label_capacity + 1 {
            fresh.tool_label(r, &format!("t{i}"));
        }
        while fresh
            .router_slot(&format!("late{}", fresh.routers_registered()))
            .is_some()
        {}
        assert!(fresh.snapshot().labels.len() <= fresh.label_capacity);
    }

    #[test]
    fn request_kind_discriminants_are_their_index_in_all() {
        for (i, k) in RequestKind::ALL.into_iter().enumerate() {
            assert_eq!(kind_index(k), i);
        }
    }

    #[test]
    fn every_error_code_has_its_own_outcome() {
        for c in ErrorCode::ALL {
            let o = Outcome::from_code(c.code());
            assert_ne!(o, Outcome::OtherError, "{c:?}");
            assert_ne!(o, Outcome::Ok);
        }
        for (i, o) in Outcome::ALL.into_iter().enumerate() {
            assert_eq!(o as usize, i);
        }
        assert_eq!(Outcome::from_code(7), Outcome::OtherError);
    }
}
