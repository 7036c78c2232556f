//! The label space (fixed at start-up) and one shard's series in it.
//!
//! Every label set is bounded and known before the first request, so each
//! series is a slot in a flat array indexed by label numbers: recording is
//! index arithmetic and a relaxed store, never a map insertion.
//!
//! # Invariants
//! - `router` takes the configured router names plus `broker` (answered by
//!   the broker itself: initialize, ping, listings, unknown names).
//! - `tool` takes the tool names the route table served at start-up, plus
//!   `other` (a name unknown at start-up) and `none` (not a tool call).
//! - Nothing here grows after start-up.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::AtomicU64;

use mcp_schema::{ErrorCode, RequestKind};

use super::hist::AtomicHistogram;
use crate::route::RouteTable;

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
    /// An error code the broker does not define (or an unreadable frame).
    OtherError,
}

impl Outcome {
    pub const COUNT: usize = 14;
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
            Outcome::OtherError => "other_error",
        }
    }

    pub fn from_code(code: i32) -> Outcome {
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

/// The label space: fixed at start-up, shared by every shard and the
/// admin thread.
#[derive(Debug)]
pub struct Layout {
    /// Configured routers, then `broker`.
    pub routers: Vec<Box<str>>,
    /// Tools known at start-up (exposed name, router), then `other`, `none`.
    pub tools: Vec<(Box<str>, usize)>,
    tool_index: HashMap<Box<str>, u16, BuildHasherDefault<Fnv>>,
    /// Whether the shards record requests and latencies (the switch the
    /// cost benchmark flips; see `docs/metrics.md`).
    pub recording: bool,
}

/// The environment variable that turns request recording off
/// (`MCP_BROKER_METRICS=off`): for the metrics-cost benchmark only.
pub const RECORDING_ENV: &str = "MCP_BROKER_METRICS";

impl Layout {
    pub fn new(table: &RouteTable) -> Self {
        let mut routers: Vec<Box<str>> = table
            .router_names()
            .iter()
            .map(|r| r.as_str().into())
            .collect();
        routers.push("broker".into());
        let mut tools: Vec<(Box<str>, usize)> = table
            .tool_list
            .iter()
            .map(|t| (t.exposed.clone(), t.router as usize))
            .collect();
        let tool_index = tools
            .iter()
            .enumerate()
            .map(|(i, (name, _))| (name.clone(), i as u16))
            .collect();
        let broker = routers.len() - 1;
        tools.push(("other".into(), broker));
        tools.push(("none".into(), broker));
        let recording = std::env::var(RECORDING_ENV).map_or(true, |v| v != "off");
        Self {
            routers,
            tools,
            tool_index,
            recording,
        }
    }

    /// The `broker` router label.
    pub fn broker(&self) -> usize {
        self.routers.len() - 1
    }
    pub fn other_tool(&self) -> usize {
        self.tools.len() - 2
    }
    pub fn no_tool(&self) -> usize {
        self.tools.len() - 1
    }
    /// A tool's label number and router, if it was known at start-up.
    pub fn tool(&self, name: &str) -> Option<(usize, usize)> {
        self.tool_index.get(name).map(|&i| {
            let i = i as usize;
            (i, self.tools[i].1)
        })
    }

    pub fn request_slot(&self, edge: Edge, router: usize, kind: usize, outcome: Outcome) -> usize {
        ((edge as usize * self.routers.len() + router) * KINDS + kind) * Outcome::COUNT
            + outcome as usize
    }
    pub fn request_slots(&self) -> usize {
        Edge::ALL.len() * self.routers.len() * KINDS * Outcome::COUNT
    }
    pub fn latency_slot(&self, router: usize, tool: usize) -> usize {
        router * self.tools.len() + tool
    }
}

/// One shard's request series: written by that shard only.
#[derive(Debug)]
pub struct ShardSeries {
    /// `mcp_requests_total`, by `request_slot`.
    pub requests: Box<[AtomicU64]>,
    /// `mcp_request_duration_seconds`, by `latency_slot(router, tool)`.
    pub duration: Box<[AtomicHistogram]>,
    /// `mcp_wasm_call_duration_seconds`, by router (no `broker`).
    pub wasm: Box<[AtomicHistogram]>,
    /// `mcp_queue_wait_seconds`, by router (with `broker`).
    pub queue: Box<[AtomicHistogram]>,
    /// `mcp_frames_rejected_total`, by [`Reject`].
    pub rejected: [AtomicU64; Reject::COUNT],
}

impl ShardSeries {
    pub fn new(layout: &Layout) -> Self {
        let routers = layout.routers.len();
        Self {
            requests: (0..layout.request_slots())
                .map(|_| AtomicU64::new(0))
                .collect(),
            duration: (0..routers * layout.tools.len())
                .map(|_| AtomicHistogram::default())
                .collect(),
            wasm: (0..routers - 1)
                .map(|_| AtomicHistogram::default())
                .collect(),
            queue: (0..routers).map(|_| AtomicHistogram::default()).collect(),
            rejected: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
