//! The shard side: the recording hooks `shard` and `dispatch` call, and the
//! answer to the admin thread's snapshot request.
//!
//! Two kinds of storage, because they are read differently:
//! - Prometheus counters and bucket histograms are single-writer atomics in
//!   [`ShardStats`](crate::shared::ShardStats), readable by the admin
//!   thread at any moment.
//! - The HdrHistograms behind the exact-percentile summary are plain
//!   memory (an HdrHistogram cannot be read while another thread writes
//!   it), kept in this shard thread's thread-local and handed over whole:
//!   the admin thread sends a cleared spare set through the shard's inbox,
//!   the shard swaps it with its live set (two pointer moves) and sends the
//!   filled one back. Nothing is copied or allocated on the shard.
//!
//! # Invariants
//! - Called on the shard thread only; no locks, no allocation but the first
//!   recorded request of each router slot (which sizes the thread-local
//!   HdrHistograms).
//! - Each request is recorded exactly once: by the worker of the frame
//!   connection it arrived on (even when it ran on another shard for session
//!   affinity), or by the inbox task for a gRPC call.

use std::cell::RefCell;
use std::time::Instant;

use hdrhistogram::Histogram;
use mcp_schema::verify::VerifiedRequest;
use mcp_schema::{RequestKind, RouteKey};

use super::hist::bump;
use super::peek;
use super::series::{BROKER, BROKER_NONE, BROKER_OTHER, Edge, Outcome, kind_index};
use crate::dispatch::ShardCtx;
use crate::wasm::PoolStats;

/// Range of the HdrHistograms: 1 µs (values below are recorded in the
/// first bucket) to 60 s, three significant digits (0.1%).
pub const HDR_LOW_NS: u64 = 1_000;
pub const HDR_HIGH_NS: u64 = 60_000_000_000;
pub const HDR_DIGITS: u8 = 3;

pub fn new_hdr() -> Histogram<u64> {
    Histogram::new_with_bounds(HDR_LOW_NS, HDR_HIGH_NS, HDR_DIGITS)
        .expect("constant HdrHistogram bounds are valid")
}

thread_local! {
    /// This shard's end-to-end latency per router label, since the admin
    /// thread last took them. Empty until the first request.
    static HDR: RefCell<Vec<Histogram<u64>>> = const { RefCell::new(Vec::new()) };
}

/// The admin thread's request for a shard's snapshot.
pub struct SnapshotRequest {
    /// Cleared histograms to swap in (one per router label), or empty when
    /// the admin thread has none to spare yet.
    pub spare: Vec<Histogram<u64>>,
    pub reply: crossbeam_channel::Sender<ShardSnapshot>,
}

/// A shard's answer: the HdrHistograms filled since the last snapshot and
/// its pools' state.
pub struct ShardSnapshot {
    pub shard: usize,
    pub hdr: Vec<Histogram<u64>>,
    /// By router metrics slot.
    pub pools: Vec<PoolStats>,
    /// Retired pools still finishing calls.
    pub draining: usize,
}

fn elapsed_ns(from: Instant, to: Instant) -> u64 {
    to.saturating_duration_since(from).as_nanos() as u64
}

/// The series a request counts in: its router's metrics slot and its
/// `tool` label. Read by [`attribute`] when the request starts, from the
/// route table that routes it, and carried to [`request`]: read when the
/// answer is recorded instead, a call that a reload's removed router
/// finished counted under `broker`, since the table then no longer had it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attribution {
    router: usize,
    tool: u32,
}

impl Attribution {
    /// Answered by the broker itself (and what metrics that are off get:
    /// never read).
    pub const BROKER: Self = Self {
        router: BROKER,
        tool: BROKER_NONE,
    };
}

/// The [`Attribution`] of `req` in the routing in effect now.
pub fn attribute(ctx: &ShardCtx, req: &VerifiedRequest) -> Attribution {
    if !ctx.shared.stats[ctx.index].layout.recording {
        return Attribution::BROKER;
    }
    let view = req.view();
    let kind = view.kind();
    let routing = ctx.shared.routing.load();
    let table = &routing.table;
    // The router's slot and its `other`/`none` labels, by route table id.
    let of = |id: Option<u16>| {
        id.and_then(|i| routing.routers.get(i as usize))
            .map_or((BROKER, BROKER_OTHER, BROKER_NONE), |r| {
                (r.slot, r.labels.0, r.labels.1)
            })
    };
    let (router, tool) = match view.route_key() {
        RouteKey::Tool(name) => {
            let (slot, other, _) = of(table.tool(name).map(|t| t.router));
            let label = routing.tool_labels.get(name).copied().unwrap_or(other);
            (slot, label)
        }
        RouteKey::Resource(uri) if kind == RequestKind::ReadResource => {
            let (slot, _, none) = of(table.resource(uri));
            (slot, none)
        }
        RouteKey::Prompt(name) => {
            let (slot, _, none) = of(table.prompt(name).map(|t| t.router));
            (slot, none)
        }
        RouteKey::Completion { kind: ck, name } => {
            let r = if ck == mcp_schema::fb::protocol::CompletionRefKind::Resource {
                table.resource(name)
            } else {
                table.prompt(name).map(|t| t.router)
            };
            let (slot, _, none) = of(r);
            (slot, none)
        }
        _ => (BROKER, BROKER_NONE),
    };
    Attribution { router, tool }
}

/// Records one finished request: its count by edge, router, kind and
/// outcome (`who`: router and tool, from [`attribute`] when it started);
/// its end-to-end latency (`arrived` → now) and queue wait
/// (`queued` → `started`). `queued` is when it joined the shard's queue:
/// `arrived` where the edge queues requests as they arrive (frames, gRPC);
/// `started` where it runs them in the connection's own task as soon as
/// they are read (HTTP, whose `arrived` is the head's arrival, so that
/// `arrived → started` would be the client's upload). `frames` are its
/// response frames (the last is the final one). Returns the end time it
/// read (or `started` when metrics are off and no clock was read), so that
/// a caller serving a batch reads the clock once per request.
#[allow(clippy::too_many_arguments)]
pub fn request(
    ctx: &ShardCtx,
    edge: Edge,
    req: &VerifiedRequest,
    who: Attribution,
    arrived: Instant,
    queued: Instant,
    started: Instant,
    frames: &[u8],
) -> Instant {
    if !ctx.shared.stats[ctx.index].layout.recording {
        return started;
    }
    let outcome = peek::outcome(frames);
    request_as(ctx, edge, req, who, arrived, queued, started, outcome)
}

/// [`request`] with the outcome given: for an edge that answered the client
/// otherwise than the frames it ran (the HTTP edge's rewrites).
#[allow(clippy::too_many_arguments)]
pub fn request_as(
    ctx: &ShardCtx,
    edge: Edge,
    req: &VerifiedRequest,
    who: Attribution,
    arrived: Instant,
    queued: Instant,
    started: Instant,
    outcome: Outcome,
) -> Instant {
    let stats = &ctx.shared.stats[ctx.index];
    let layout = &*stats.layout;
    if !layout.recording {
        return started;
    }
    let now = Instant::now();
    let kind = req.view().kind();
    let Attribution { router, tool } = who;
    let s = &stats.series;
    bump(
        &s.requests[layout.request_slot(edge, router, kind_index(kind), outcome)],
        1,
    );
    let total = elapsed_ns(arrived, now);
    s.duration[tool as usize].record(total);
    s.queue[router].record(elapsed_ns(queued, started));
    HDR.with_borrow_mut(|h| {
        // Sized on the first request of each router slot (a reload may
        // add slots), never again.
        if h.len() <= router {
            h.resize_with(router + 1, new_hdr);
        }
        h[router].saturating_record(total.max(1));
    });
    now
}

/// Records one WASM call of the router in metrics slot `router` that began
/// at `started` (including any wait for a free instance of the pool).
pub fn wasm_call(ctx: &ShardCtx, router: usize, started: Instant) {
    let stats = &ctx.shared.stats[ctx.index];
    if !stats.layout.recording {
        return;
    }
    if let Some(h) = stats.series.wasm.get(router) {
        h.record(elapsed_ns(started, Instant::now()));
    }
}

/// Answers the admin thread: swap the live HdrHistograms for its spares and
/// send them with the pools' state.
pub fn answer_snapshot(ctx: &ShardCtx, req: SnapshotRequest) {
    let hdr = HDR.with_borrow_mut(|h| std::mem::replace(h, req.spare));
    let _ = req.reply.send(ShardSnapshot {
        shard: ctx.index,
        hdr,
        pools: ctx.pools.borrow().stats(),
        draining: ctx.pools.borrow().draining(),
    });
}
