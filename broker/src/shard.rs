//! Shards: one thread, one monoio runtime, one `SO_REUSEPORT` listener and
//! one set of router pools each.
//!
//! # Invariants
//! - A connection lives on the shard that accepted it, for its whole life.
//! - Shard state (`Rc`, `RefCell`, pools, encoders) never leaves its thread;
//!   other threads reach a shard only through its inbox.
//! - Per connection: one reader, one writer, and up to
//!   `max_in_flight_per_connection` workers that are spawned once and then
//!   reused, so steady-state request handling spawns (allocates) nothing.
//! - The reader polls each request's handler once itself; a worker takes
//!   over only a request that must wait. A request's future lives in a
//!   pinned slot recycled by its connection, so it can change hands
//!   without moving or allocating.
//! - Responses are appended to the connection's write buffer and flushed by
//!   the writer in batches: one `write` per batch, not one per frame.
//! - What one connection holds is bounded before every frame is served:
//!   requests in flight, unwritten answer bytes (errors included), and
//!   frames per turn of the shard. A peer that reads nothing is cut off at
//!   `write_timeout` and its answers freed.
//! - A read is never dropped while it owns the buffer: timeouts, the drain
//!   and a close cancel it and take the buffer back, partial frame intact.
//! - Every request read gets exactly one answer written before its
//!   connection closes (a panicking handler's is -32603), unless the peer
//!   is gone or the drain deadline passed.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::{Future, poll_fn};
use std::net::SocketAddr;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use atomic_waker::AtomicWaker;
use bytes::BytesMut;
use mcp_schema::encode::ReplyTo;
use mcp_schema::verify::{VerifiedRequest, header_of_invalid};
use mcp_schema::view::reply_to_header;
use mcp_schema::{FrameSplitter, ResponseEncoder};
use monoio::buf::{IoBuf, IoBufMut};
use monoio::io::{CancelableAsyncReadRent, Splitable};
use monoio::net::{TcpListener, TcpStream};

use crate::dispatch::{ShardCtx, handle};
use crate::local::{Latch, Notify, YieldQueue};
use crate::metrics;
use crate::shared::{ShardMsg, ShardStats, Shared};
use crate::wasm::{Router, RouterPool};

/// Everything a shard thread needs to start.
pub struct ShardStart {
    pub index: usize,
    pub shared: Arc<Shared>,
    pub routers: Vec<Arc<Router>>,
    pub listener: std::net::TcpListener,
    /// This shard's listener of the MCP HTTP edge (same address on every
    /// shard, `SO_REUSEPORT`).
    pub http_listener: std::net::TcpListener,
    pub cpu: Option<usize>,
}

/// Runs shard `s` on the current thread until it has drained.
pub fn run(s: ShardStart, ready: std::sync::mpsc::Sender<Result<usize, String>>) {
    if let Some(cpu) = s.cpu
        && !core_affinity::set_for_current(core_affinity::CoreId { id: cpu })
    {
        tracing::warn!(shard = s.index, cpu, "could not pin shard to its CPU");
    }
    let defer = s.shared.config.broker.io_uring_defer_taskrun;
    let mut rt = match build_runtime(defer).or_else(|e| {
        if !defer {
            return Err(e);
        }
        // Kernels before 6.1 refuse DEFER_TASKRUN with EINVAL.
        tracing::debug!(shard = s.index, error = %e, "io_uring refused DEFER_TASKRUN; using the classic ring");
        build_runtime(false)
    }) {
        Ok(rt) => rt,
        Err(e) => {
            let _ = ready.send(Err(format!("shard {}: cannot build runtime: {e}", s.index)));
            return;
        }
    };
    let _lifeline = Lifeline {
        shared: s.shared.clone(),
        index: s.index,
    };
    rt.block_on(shard_main(s, ready));
}

/// Dropped when the shard thread ends, by return or by unwinding: no more
/// work is handed to the shard (queued hand-offs are dropped, so their
/// senders answer "shard stopped" instead of waiting forever), `/readyz`
/// turns 503, and a shard that died tells `main`, which exits non-zero so
/// that a supervisor restarts the process.
struct Lifeline {
    shared: Arc<Shared>,
    index: usize,
}

impl Drop for Lifeline {
    fn drop(&mut self) {
        let stats = &self.shared.stats[self.index];
        let died = std::thread::panicking();
        // Dead before not ready, so `/readyz` never says "starting" for it.
        if died {
            stats.dead.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        stats
            .ready
            .store(false, std::sync::atomic::Ordering::Relaxed);
        self.shared.close_inbox(self.index);
        if died {
            tracing::error!(shard = self.index, "shard thread died");
            self.shared.report_death(self.index);
        }
    }
}

type Runtime = monoio::FusionRuntime<
    monoio::time::TimeDriver<monoio::IoUringDriver>,
    monoio::time::TimeDriver<monoio::LegacyDriver>,
>;

/// A shard's monoio runtime: io_uring where the kernel has it (epoll
/// otherwise). With `defer`, the ring runs completions only when the shard
/// enters the kernel for them, not as task work interrupting it at every
/// completion; the shard is the ring's single submitter by construction.
fn build_runtime(defer: bool) -> std::io::Result<Runtime> {
    let mut urb = io_uring::IoUring::builder();
    if defer {
        urb.setup_single_issuer().setup_defer_taskrun();
    }
    monoio::RuntimeBuilder::<monoio::FusionDriver>::new()
        .uring_builder(urb)
        .enable_timer()
        .build()
}

/// Shard-wide state of the running loop.
struct Shard {
    ctx: Rc<ShardCtx>,
    /// Shared with the HTTP edge, which drains on the same signal.
    draining: Rc<Latch>,
    drain_expired: Latch,
    connections: Cell<usize>,
    yields: YieldQueue,
}

impl Shard {
    fn stats(&self) -> &ShardStats {
        &self.ctx.shared.stats[self.ctx.index]
    }
}

async fn shard_main(s: ShardStart, ready: std::sync::mpsc::Sender<Result<usize, String>>) {
    let index = s.index;
    let pools: Vec<RouterPool> = s
        .routers
        .iter()
        .map(|r| RouterPool::new(r.clone()))
        .collect();
    // Instantiate every pool now, so the first requests do not pay for it
    // and a broken router fails start-up rather than a request.
    for pool in &pools {
        if let Err(e) = pool.warm().await {
            let _ = ready.send(Err(format!(
                "shard {index}: router `{}`: {e}",
                pool.router().spec().name
            )));
            return;
        }
    }
    let listener = match TcpListener::from_std(s.listener) {
        Ok(l) => l,
        Err(e) => {
            let _ = ready.send(Err(format!("shard {index}: listener: {e}")));
            return;
        }
    };
    let http_listener = match TcpListener::from_std(s.http_listener) {
        Ok(l) => l,
        Err(e) => {
            let _ = ready.send(Err(format!("shard {index}: HTTP listener: {e}")));
            return;
        }
    };
    let shard = Rc::new(Shard {
        ctx: Rc::new(ShardCtx {
            index,
            shared: s.shared.clone(),
            pools,
            enc: RefCell::new(ResponseEncoder::new(index as u64)),
        }),
        draining: Rc::default(),
        drain_expired: Latch::default(),
        connections: Cell::new(0),
        yields: YieldQueue::default(),
    });
    monoio::spawn(inbox_loop(shard.clone()));
    {
        let shard = shard.clone();
        monoio::spawn(async move { shard.yields.run().await });
    }
    monoio::spawn(expire_sessions(shard.ctx.clone()));
    let http = crate::edge::http::HttpEdge::new(shard.ctx.clone(), shard.draining.clone());
    monoio::spawn(crate::edge::http::accept_loop(http.clone(), http_listener));
    monoio::spawn(crate::edge::http::expire_sessions(http.clone()));
    shard
        .stats()
        .ready
        .store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = ready.send(Ok(index));
    drop(ready);

    accept_loop(&shard, &listener).await;
    drop(listener);
    // Draining: every connection stops reading, waits for the answers to
    // what it read, and flushes them; gRPC jobs finish. The shard ends when
    // all of that is done, or at the drain deadline plus a short grace for
    // the shutting-down answers it sends then to reach the wire.
    poll_until(&shard.drain_expired, || {
        shard.connections.get() == 0
            && http.connections() == 0
            && shard
                .stats()
                .in_flight
                .load(std::sync::atomic::Ordering::Relaxed)
                == 0
    })
    .await;
    if shard.drain_expired.is_set() {
        let grace = Instant::now() + DRAIN_FLUSH_GRACE;
        poll_until(&Latch::default(), || {
            (shard.connections.get() == 0 && http.connections() == 0) || Instant::now() >= grace
        })
        .await;
    }
    tracing::debug!(shard = index, "shard drained");
}

/// After the drain deadline, how long a shard waits for the answers of the
/// calls it cut short (shutting-down errors) to be written before it exits.
const DRAIN_FLUSH_GRACE: Duration = Duration::from_secs(1);

/// Waits until `done()` holds, re-checking every 5 ms, or until `latch` is
/// set. Used only at shutdown.
async fn poll_until(latch: &Latch, done: impl Fn() -> bool) {
    while !done() && !latch.is_set() {
        monoio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn accept_loop(shard: &Rc<Shard>, listener: &TcpListener) {
    let max = shard.ctx.shared.config.frames.max_connections_per_shard;
    loop {
        let accepted = monoio::select! {
            r = listener.accept() => Some(r),
            _ = shard.draining.wait() => None,
        };
        let Some(accepted) = accepted else { return };
        match accepted {
            Ok((stream, peer)) => {
                let stats = shard.stats();
                if shard.connections.get() >= max {
                    ShardStats::add(&stats.connections_refused, 1);
                    tracing::warn!(shard = shard.ctx.index, %peer, max, "connection refused: max_connections_per_shard reached");
                    drop(stream);
                    continue;
                }
                ShardStats::add(&stats.connections_accepted, 1);
                let _ = stream.set_nodelay(true);
                monoio::spawn(connection(shard.clone(), stream, peer));
            }
            Err(e) => {
                // EMFILE and friends: log and back off briefly rather than spin.
                tracing::warn!(shard = shard.ctx.index, error = %e, "accept failed");
                monoio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

/// Drops the instances of sessions idle past their router's
/// `session_idle_timeout`, checking a few times per timeout, so an abandoned
/// session holds its instance at most a quarter of the timeout too long.
/// Returns at once when no router is session-affine.
async fn expire_sessions(ctx: Rc<ShardCtx>) {
    let Some(shortest) = ctx
        .pools
        .iter()
        .filter_map(|p| p.session_idle_timeout())
        .min()
    else {
        return;
    };
    let every = (shortest / 4).clamp(Duration::from_millis(10), Duration::from_secs(30));
    loop {
        monoio::time::sleep(every).await;
        let now = Instant::now();
        for pool in &ctx.pools {
            pool.expire_sessions(now);
        }
    }
}

/// Empties the shard's inbox: hand-offs from other shards and the gRPC edge,
/// and drain control.
async fn inbox_loop(shard: Rc<Shard>) {
    let ctx = &shard.ctx;
    let inbox = &ctx.shared.inboxes[ctx.index];
    loop {
        let msg = poll_fn(|cx| {
            if let Ok(m) = inbox.rx.try_recv() {
                return Poll::Ready(m);
            }
            inbox.waker.register(cx.waker());
            // A message sent between the first check and the registration
            // would otherwise be missed.
            match inbox.rx.try_recv() {
                Ok(m) => Poll::Ready(m),
                Err(_) => Poll::Pending,
            }
        })
        .await;
        match msg {
            ShardMsg::Job(job) => {
                let shard = shard.clone();
                let arrived = Instant::now();
                // A hand-off is the cross-thread path (session affinity,
                // gRPC): one task per job, its allocation accepted there.
                monoio::spawn(async move {
                    let crate::shared::Job {
                        req,
                        mut reply,
                        forwarded,
                    } = job;
                    let started = Instant::now();
                    let stats = shard.stats();
                    ShardStats::add(&stats.in_flight, 1);
                    let mut args = Vec::new();
                    let mut out = Vec::new();
                    // A panic in the handler fails this request, not the
                    // shard. A caller that gave up (gRPC call cancelled,
                    // frame connection gone) drops the handling, which drops
                    // a lease mid-call and so discards the instance and stops
                    // its guest, instead of running it to its deadline for an
                    // answer nobody reads.
                    let ran = {
                        let mut run =
                            Box::pin(Some(run_or_expire(&shard, &req, &mut args, &mut out)));
                        let ran = monoio::select! {
                            r = poll_fn(|cx| {
                                let fut = run.as_mut().as_pin_mut().expect("polled until ready");
                                match std::panic::catch_unwind(AssertUnwindSafe(|| fut.poll(cx))) {
                                    Ok(p) => p.map(|()| Ok(())),
                                    Err(payload) => Poll::Ready(Err(Panicked::from(payload))),
                                }
                            }) => Some(r),
                            _ = reply.cancellation() => None,
                        };
                        drop_future(&mut run);
                        ran
                    };
                    let answered = ran.is_some();
                    if let Some(Err(panic)) = ran {
                        tracing::error!(shard = shard.ctx.index, panic = %panic.0, "request handler panicked; answered with an internal error");
                        out.clear();
                        let to = req.view().reply_to();
                        out.extend_from_slice(shard.ctx.enc.borrow_mut().error(
                            &to,
                            mcp_schema::ErrorCode::Internal,
                            "internal error: the broker failed while handling this request",
                            None,
                        ));
                    }
                    if answered && !forwarded {
                        let _ended = metrics::record::request(
                            &shard.ctx,
                            metrics::Edge::Grpc,
                            &req,
                            arrived,
                            started,
                            &out,
                        );
                    }
                    ShardStats::sub(&stats.in_flight, 1);
                    if answered {
                        let _ = reply.send(out);
                    }
                });
            }
            ShardMsg::Snapshot(req) => metrics::record::answer_snapshot(&shard.ctx, req),
            ShardMsg::Drain => shard.draining.set(),
            ShardMsg::DrainExpired => {
                shard.draining.set();
                shard.drain_expired.set();
            }
        }
    }
}

/// Handles a request unless the drain deadline passes first, in which case
/// it is answered with a shutting-down error (exactly one answer either way).
async fn run_or_expire(
    shard: &Rc<Shard>,
    req: &VerifiedRequest,
    args: &mut Vec<u8>,
    out: &mut Vec<u8>,
) {
    let start = out.len();
    let finished = monoio::select! {
        _ = handle(&shard.ctx, req, args, out) => true,
        _ = shard.drain_expired.wait() => false,
    };
    if !finished {
        out.truncate(start);
        let to = req.view().reply_to();
        let frame = shard
            .ctx
            .enc
            .borrow_mut()
            .error(
                &to,
                mcp_schema::ErrorCode::ShuttingDown,
                "drain deadline passed before the call finished",
                None,
            )
            .to_vec();
        out.extend_from_slice(&frame);
    }
}

/// One request while it is served: what the handler owns and gives back.
struct Job {
    req: VerifiedRequest,
    /// When the read that completed its frame returned.
    arrived: Instant,
    /// When its handling began (later than `arrived` when frames ahead of it
    /// in the same read were handled first).
    started: Instant,
    args: Vec<u8>,
    out: Vec<u8>,
}

/// Serves one request. Every call returns the same future type, which is
/// what lets a connection keep reusable pinned slots for it ([`Slot`]).
async fn serve(ctx: Rc<ShardCtx>, mut job: Job) -> Job {
    handle(&ctx, &job.req, &mut job.args, &mut job.out).await;
    job
}

/// Where a waiting request's wake-ups go: to whichever task polls the slot
/// now. The reader polls every request once; only if it must wait does a
/// worker take the slot over, and the wake-ups registered during the first
/// poll must reach that worker. Thread-safe because WASI timers and the
/// epoch yield wake a guest call from the host's tokio thread.
#[derive(Default)]
struct SlotWake(AtomicWaker);

impl Wake for SlotWake {
    fn wake(self: Arc<Self>) {
        self.0.wake();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.wake();
    }
}

/// A reusable home for one request's future: allocated once per request in
/// flight at the connection's peak, then recycled, so steady-state handling
/// allocates nothing.
struct Slot<F> {
    fut: Pin<Box<Option<F>>>,
    wake: Arc<SlotWake>,
    /// `Waker` over `wake`, made once.
    waker: Waker,
    /// The handler's buffers while no request is in the slot.
    args: Vec<u8>,
    out: Vec<u8>,
    /// A cheap clone (a reference count) of the request in the slot, taken
    /// before its first poll: the future owns the `Job`, and a request that
    /// waits must still be answerable if the drain deadline cancels it.
    req: Option<VerifiedRequest>,
}

impl<F: Future<Output = Job>> Slot<F> {
    fn new() -> Self {
        let wake = Arc::new(SlotWake::default());
        Slot {
            fut: Box::pin(None),
            waker: Waker::from(wake.clone()),
            wake,
            args: Vec::with_capacity(1024),
            out: Vec::with_capacity(1024),
            req: None,
        }
    }

    /// Polls the request's future with the slot's own waker. A panic in
    /// the handler is caught here: the future is dropped and the request is
    /// answered by the caller, so one bad request never takes the shard
    /// (and every connection on it) down.
    fn poll(&mut self) -> Poll<Result<Job, Panicked>> {
        let mut cx = Context::from_waker(&self.waker);
        let fut = self
            .fut
            .as_mut()
            .as_pin_mut()
            .expect("a polled slot holds a request");
        match std::panic::catch_unwind(AssertUnwindSafe(|| fut.poll(&mut cx))) {
            Ok(Poll::Ready(job)) => {
                self.fut.set(None);
                Poll::Ready(Ok(job))
            }
            Ok(Poll::Pending) => Poll::Pending,
            Err(payload) => {
                drop_future(&mut self.fut);
                Poll::Ready(Err(Panicked::from(payload)))
            }
        }
    }
}

/// Drops a request's future, which may itself panic (its state is whatever
/// the handler left); such a future is leaked rather than kill the shard.
fn drop_future<F>(fut: &mut Pin<Box<Option<F>>>) {
    let old = std::mem::replace(fut, Box::pin(None));
    if std::panic::catch_unwind(AssertUnwindSafe(move || drop(old))).is_err() {
        tracing::error!("a request's future panicked while being dropped");
    }
}

/// A caught panic of a request's handler, with its message.
pub struct Panicked(pub String);

impl From<Box<dyn std::any::Any + Send>> for Panicked {
    fn from(payload: Box<dyn std::any::Any + Send>) -> Self {
        let msg = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a non-string panic payload".into());
        Panicked(msg)
    }
}

/// One connection's shared state.
struct Conn<F> {
    /// Builds a request's future (always [`serve`]; a pointer because its
    /// type cannot be named).
    serve: fn(Rc<ShardCtx>, Job) -> F,
    /// Requests that had to wait, for a worker to finish.
    queue: RefCell<VecDeque<Slot<F>>>,
    /// Empty slots for the next requests.
    free: RefCell<Vec<Slot<F>>>,
    /// Workers parked for want of work.
    idle: RefCell<Vec<Waker>>,
    workers: Cell<usize>,
    /// Requests read and not yet answered.
    pending: Cell<usize>,
    /// Encoded responses waiting for the writer.
    out: RefCell<Vec<u8>>,
    /// Bytes the writer has taken from `out` and not yet written: with
    /// `out`, what this connection's answers hold in memory.
    writing: Cell<usize>,
    out_ready: Notify,
    capacity: Notify,
    /// No more requests: the writer flushes what is queued, then ends.
    closed: Latch,
    /// The peer is gone or stopped reading: queued answers are dropped.
    broken: Cell<bool>,
}

impl<F> Conn<F> {
    fn push_out(&self, bytes: &[u8]) {
        // Nobody will read it: keep no memory for it.
        if self.broken.get() {
            return;
        }
        self.out.borrow_mut().extend_from_slice(bytes);
        self.out_ready.notify();
    }

    /// Answer bytes held for this connection, queued or being written.
    fn output_bytes(&self) -> usize {
        self.out.borrow().len() + self.writing.get()
    }

    fn close(&self) {
        self.closed.set();
        self.out_ready.notify();
        self.capacity.notify();
        for w in self.idle.borrow_mut().drain(..) {
            w.wake();
        }
    }

    /// Closes without writing what is queued, and frees it.
    fn break_off(&self) {
        self.broken.set(true);
        *self.out.borrow_mut() = Vec::new();
        self.close();
    }
}

async fn connection(shard: Rc<Shard>, stream: TcpStream, peer: SocketAddr) {
    let stats = shard.stats();
    shard.connections.set(shard.connections.get() + 1);
    ShardStats::add(&stats.connections_open, 1);
    let conn = Rc::new(Conn {
        serve,
        queue: RefCell::new(VecDeque::new()),
        free: RefCell::new(Vec::new()),
        idle: RefCell::new(Vec::new()),
        workers: Cell::new(0),
        pending: Cell::new(0),
        out: RefCell::new(Vec::with_capacity(16 * 1024)),
        writing: Cell::new(0),
        out_ready: Notify::default(),
        capacity: Notify::default(),
        closed: Latch::default(),
        broken: Cell::new(false),
    });
    let (rd, wr) = stream.into_split();
    let writer = monoio::spawn(write_loop(shard.clone(), conn.clone(), wr));
    if let Err(reason) = read_loop(&shard, &conn, rd).await {
        tracing::info!(shard = shard.ctx.index, %peer, "closing connection: {reason}");
    }
    // Every request read gets its answer: wait for the last one (at the
    // drain deadline the workers answer what still runs with shutting-down
    // errors, so this ends), unless the peer is gone or stopped reading.
    poll_until(&Latch::default(), || {
        conn.pending.get() == 0 || conn.broken.get()
    })
    .await;
    // The writer flushes what is queued (each write bounded by
    // `write_timeout`), then shuts the socket down.
    conn.close();
    let _ = writer.await;
    shard.connections.set(shard.connections.get() - 1);
    ShardStats::sub(&stats.connections_open, 1);
}

const READ_CHUNK: usize = 16 * 1024;

/// Frames one connection may have served in one turn of the shard before it
/// lets the shard's other tasks run: one read can hold thousands of small
/// frames, and answering them all at once would stall every other
/// connection of the shard for as long (64 echo calls take about 100 µs).
pub const FRAMES_PER_TURN: usize = 64;

/// While draining, how long a connection may stay quiet before the broker
/// stops reading it: what a client sent before the drain is read and
/// answered, but the connection does not stay open for what it may send
/// later.
const DRAIN_QUIET: Duration = Duration::from_millis(100);

/// Whether the connection must wait before serving another frame: at its
/// in-flight limit, or holding more unwritten answer bytes than allowed.
fn over_bounds<F>(conn: &Conn<F>, cfg: &crate::config::FramesSection) -> bool {
    conn.pending.get() >= cfg.max_in_flight_per_connection
        || conn.output_bytes() > cfg.max_output_bytes_per_connection
}

/// Reads frames until the peer closes, the shard drains, or a limit closes
/// the connection. Returns the reason for closing.
async fn read_loop<F: Future<Output = Job> + 'static>(
    shard: &Rc<Shard>,
    conn: &Rc<Conn<F>>,
    mut rd: impl CancelableAsyncReadRent,
) -> Result<(), String> {
    let cfg = &shard.ctx.shared.config.frames;
    let splitter = FrameSplitter::new(cfg.max_frame_bytes);
    let stats = shard.stats();
    let mut buf = BytesMut::with_capacity(READ_CHUNK);
    // Since when the broker has waited on the peer for the rest of the frame
    // at the head of `buf` (see where it is set).
    let mut partial_since: Option<Instant> = None;
    let mut last_read = Instant::now();
    // One per connection; replaced only when it has cancelled a read.
    let mut canceller = monoio::io::Canceller::new();
    loop {
        // Serve what is buffered, within the connection's bounds and one
        // turn's budget at a time.
        let mut cursor = last_read;
        let mut turn = 0;
        let mut split_any = false;
        let mut waited = false;
        loop {
            if conn.closed.is_set() {
                return Ok(());
            }
            // Backpressure, checked before every frame (not once per read):
            // stop serving, and so stop reading, until answers drain.
            if over_bounds(conn, cfg) {
                conn.capacity.wait().await;
                waited = true;
                cursor = Instant::now();
                continue;
            }
            if turn == FRAMES_PER_TURN {
                shard.yields.yield_now().await;
                turn = 0;
                cursor = Instant::now();
                continue;
            }
            match splitter.next_frame(&mut buf) {
                Ok(Some(frame)) => {
                    turn += 1;
                    split_any = true;
                    cursor = accept_frame(shard, conn, frame, last_read, cursor);
                }
                Ok(None) => break,
                Err(e) => {
                    stats.reject(&e);
                    // The stream cannot be resynchronised; nothing of the
                    // announced size was allocated.
                    return Err(e.to_string());
                }
            }
        }
        // The clock runs only while the broker waits on the peer for the
        // rest of the frame at the head of the buffer: it restarts when that
        // frame is a new one, or when the broker stopped reading meanwhile
        // (its own backpressure, or a long turn under load).
        partial_since = if buf.is_empty() {
            None
        } else if waited || split_any || partial_since.is_none() {
            Some(Instant::now())
        } else {
            partial_since
        };
        // Draining: go on reading what the peer already sent (answered with
        // shutting-down errors, as dispatch does while draining), until it
        // has been quiet for DRAIN_QUIET; then stop, answer, flush, close.
        let draining = shard.draining.is_set();
        if shard.drain_expired.is_set() {
            return Ok(());
        }
        let mut wait = match partial_since {
            Some(t) => cfg.partial_frame_timeout.saturating_sub(t.elapsed()),
            None => cfg.idle_timeout,
        };
        if draining {
            wait = wait.min(DRAIN_QUIET);
        }
        // Checked here as well as by the timer: monoio advances its timers
        // only when the shard parks, which a saturated shard rarely does, so
        // a peer trickling bytes is caught at its next byte past the
        // deadline rather than whenever the timer gets to fire.
        if wait.is_zero() && partial_since.is_some() {
            return Err(format!(
                "partial frame not completed within {:?}",
                cfg.partial_frame_timeout
            ));
        }
        if buf.capacity() - buf.len() < 1024 {
            buf.reserve(READ_CHUNK);
        }
        // monoio reads into a buffer from its start; the slice makes the read
        // append after the bytes already held (a partial frame). The read
        // owns the buffer while it runs, so it is never dropped mid-flight
        // (that would lose the buffer and whatever it held): a timeout, the
        // drain or a close cancels it and waits for the buffer to come back.
        let held = buf.len();
        let read = rd.cancelable_read(buf.slice_mut(held..), canceller.handle());
        let mut read = std::pin::pin!(read);
        let ended = monoio::select! {
            r = &mut read => Some(r),
            _ = monoio::time::sleep(wait) => None,
            _ = conn.closed.wait() => None,
            _ = shard.draining.wait(), if !draining => None,
        };
        let (res, b) = match ended {
            Some(r) => r,
            None => {
                canceller = std::mem::take(&mut canceller).cancel();
                read.await
            }
        };
        buf = b.into_inner();
        match res {
            Ok(0) => return Ok(()),
            Ok(n) => {
                ShardStats::add(&stats.bytes_in, n as u64);
                // One clock read for the whole batch: every frame of it
                // arrived with this read. Each answered frame's end time is
                // the next one's start.
                last_read = Instant::now();
                continue;
            }
            // Cancelled, with the buffer (and any partial frame) intact.
            Err(e) if e.raw_os_error() == Some(libc::ECANCELED) => {}
            Err(e) => return Err(format!("read error: {e}")),
        }
        if conn.closed.is_set() {
            // Cut off by the writer (the peer reads nothing).
            return Ok(());
        }
        if shard.draining.is_set() && !draining {
            // The drain began while this read waited: read on in draining
            // mode.
            continue;
        }
        if draining {
            // Quiet for DRAIN_QUIET: all it sent before the drain is read.
            return Ok(());
        }
        if partial_since.is_some() {
            return Err(format!(
                "partial frame not completed within {:?}",
                cfg.partial_frame_timeout
            ));
        }
        if conn.pending.get() > 0 {
            // Not idle: answers are still due.
            continue;
        }
        return Err(format!("idle for {:?}", cfg.idle_timeout));
    }
}

/// Verifies one frame and serves it: answered here if its handler finishes
/// without waiting (the common case: native answers, and router calls that
/// find an idle instance and finish within an epoch tick), else handed with
/// its future to a worker. Invalid frames are answered at once with their
/// error. Returns the time the frame's handling ended (or `started` when
/// it did not end or nothing read the clock).
fn accept_frame<F: Future<Output = Job> + 'static>(
    shard: &Rc<Shard>,
    conn: &Rc<Conn<F>>,
    frame: bytes::Bytes,
    arrived: Instant,
    started: Instant,
) -> Instant {
    let stats = shard.stats();
    ShardStats::add(&stats.requests, 1);
    let req = match VerifiedRequest::verify(frame.clone()) {
        Ok(req) => req,
        Err(e) => {
            stats.reject(&e);
            ShardStats::add(&stats.error_responses, 1);
            let to = header_of_invalid(&frame)
                .map(|h| reply_to_header(&h))
                .unwrap_or(ReplyTo::UNKNOWN);
            tracing::debug!(shard = shard.ctx.index, error = %e, "rejected frame");
            let mut enc = shard.ctx.enc.borrow_mut();
            conn.push_out(enc.error(&to, e.code(), &e.to_string(), None));
            return started;
        }
    };
    conn.pending.set(conn.pending.get() + 1);
    ShardStats::add(&stats.in_flight, 1);
    let mut slot = conn.free.borrow_mut().pop().unwrap_or_else(Slot::new);
    // Kept (a reference count, not a copy) to answer the request should the
    // drain deadline cancel its future while it waits, or its handler panic.
    slot.req = Some(req.clone());
    let job = Job {
        req,
        arrived,
        started,
        args: std::mem::take(&mut slot.args),
        out: std::mem::take(&mut slot.out),
    };
    slot.fut.set(Some((conn.serve)(shard.ctx.clone(), job)));
    let ended = match slot.poll() {
        Poll::Ready(Ok(job)) => finish(shard, conn, slot, job),
        Poll::Ready(Err(panic)) => {
            fail_panicked(shard, conn, slot, &panic);
            started
        }
        Poll::Pending => {
            // Wake (or start) a worker to finish it.
            conn.queue.borrow_mut().push_back(slot);
            let idle = conn.idle.borrow_mut().pop();
            match idle {
                Some(w) => w.wake(),
                None => {
                    if conn.workers.get()
                        < shard.ctx.shared.config.frames.max_in_flight_per_connection
                    {
                        conn.workers.set(conn.workers.get() + 1);
                        monoio::spawn(worker(shard.clone(), conn.clone()));
                    }
                }
            }
            started
        }
    };
    // Outside the unwind guard on purpose: a test's way to kill this shard.
    crate::fault::kill_shard_if_asked();
    ended
}

/// Answers a served request: records it, queues its frames for the writer,
/// frees its slot. Returns the end time read for the metrics.
fn finish<F>(shard: &Rc<Shard>, conn: &Rc<Conn<F>>, mut slot: Slot<F>, job: Job) -> Instant {
    let ended = metrics::record::request(
        &shard.ctx,
        metrics::Edge::Frames,
        &job.req,
        job.arrived,
        job.started,
        &job.out,
    );
    conn.push_out(&job.out);
    let Job {
        req,
        mut args,
        mut out,
        ..
    } = job;
    drop(req);
    args.clear();
    out.clear();
    slot.args = args;
    slot.out = out;
    release(shard, conn, slot);
    ended
}

/// Gives a slot whose request has been answered back to the connection.
fn release<F>(shard: &Rc<Shard>, conn: &Rc<Conn<F>>, mut slot: Slot<F>) {
    slot.req = None;
    // A wake-up registered by a worker for the previous request must not
    // reach it through the next one.
    drop(slot.wake.0.take());
    conn.free.borrow_mut().push(slot);
    conn.pending.set(conn.pending.get() - 1);
    ShardStats::sub(&shard.stats().in_flight, 1);
    conn.capacity.notify();
}

/// Answers a request whose handler panicked with an internal error; the
/// shard and the connection go on serving.
fn fail_panicked<F>(shard: &Rc<Shard>, conn: &Rc<Conn<F>>, mut slot: Slot<F>, panic: &Panicked) {
    if let Some(req) = slot.req.as_ref() {
        let to = req.view().reply_to();
        tracing::error!(shard = shard.ctx.index, panic = %panic.0, "request handler panicked; answered with an internal error");
        ShardStats::add(&shard.stats().error_responses, 1);
        let mut enc = shard.ctx.enc.borrow_mut();
        conn.push_out(enc.error(
            &to,
            mcp_schema::ErrorCode::Internal,
            "internal error: the broker failed while handling this request",
            None,
        ));
    }
    // The handler's buffers went down with its future.
    slot.args = Vec::with_capacity(1024);
    slot.out = Vec::with_capacity(1024);
    release(shard, conn, slot);
}

/// Finishes requests that had to wait (a router call queued for an instance
/// or yielding at an epoch tick, a session-affinity hand-off), parking when
/// there are none, until the connection closes. Only waiting requests race
/// the drain deadline: the ones answered inline cannot outlive it.
async fn worker<F: Future<Output = Job>>(shard: Rc<Shard>, conn: Rc<Conn<F>>) {
    loop {
        let next = poll_fn(|cx| {
            if let Some(s) = conn.queue.borrow_mut().pop_front() {
                return Poll::Ready(Some(s));
            }
            if conn.closed.is_set() {
                return Poll::Ready(None);
            }
            conn.idle.borrow_mut().push(cx.waker().clone());
            Poll::Pending
        })
        .await;
        let Some(mut slot) = next else { break };
        let done = monoio::select! {
            job = poll_fn(|cx| {
                // Register before polling: a wake-up that came while the slot
                // changed hands is covered by this poll.
                slot.wake.0.register(cx.waker());
                slot.poll()
            }) => Some(job),
            _ = shard.drain_expired.wait() => None,
        };
        match done {
            Some(Ok(job)) => {
                finish(&shard, &conn, slot, job);
            }
            Some(Err(panic)) => fail_panicked(&shard, &conn, slot, &panic),
            None => expire(&shard, &conn, slot),
        }
    }
    conn.workers.set(conn.workers.get() - 1);
}

/// Answers a waiting request the drain deadline overtook, with a
/// shutting-down error, and drops its future (cancelling the call).
fn expire<F>(shard: &Rc<Shard>, conn: &Rc<Conn<F>>, mut slot: Slot<F>) {
    drop_future(&mut slot.fut);
    if let Some(req) = slot.req.take() {
        let to = req.view().reply_to();
        let mut enc = shard.ctx.enc.borrow_mut();
        conn.push_out(enc.error(
            &to,
            mcp_schema::ErrorCode::ShuttingDown,
            "drain deadline passed before the call finished",
            None,
        ));
    }
    // The slot is not reused: the connection is closing.
    conn.pending.set(conn.pending.get() - 1);
    ShardStats::sub(&shard.stats().in_flight, 1);
    conn.capacity.notify();
}

/// Writes whatever responses have accumulated, one write per batch. A peer
/// that accepts no byte for `write_timeout` while answers wait is cut off,
/// and what was queued for it is freed.
async fn write_loop<F>(
    shard: Rc<Shard>,
    conn: Rc<Conn<F>>,
    mut wr: impl monoio::io::AsyncWriteRent,
) {
    let stats = shard.stats();
    let timeout = shard.ctx.shared.config.frames.write_timeout;
    let mut spare: Vec<u8> = Vec::with_capacity(16 * 1024);
    'batches: loop {
        if conn.out.borrow().is_empty() {
            if conn.closed.is_set() {
                break;
            }
            conn.out_ready.wait().await;
            continue;
        }
        std::mem::swap(&mut *conn.out.borrow_mut(), &mut spare);
        let n = spare.len();
        conn.writing.set(n);
        let mut written = 0;
        while written < n {
            let (res, b) =
                match monoio::time::timeout(timeout, wr.write(spare.slice(written..))).await {
                    Ok(r) => r,
                    Err(_) => {
                        tracing::info!(
                            shard = shard.ctx.index,
                            ?timeout,
                            "closing connection: peer read nothing within the write timeout"
                        );
                        ShardStats::add(&stats.write_timeouts, 1);
                        conn.writing.set(0);
                        conn.break_off();
                        // The buffer went with the cancelled write.
                        break 'batches;
                    }
                };
            spare = b.into_inner();
            match res {
                Ok(0) | Err(_) => {
                    if let Err(e) = res {
                        tracing::debug!(shard = shard.ctx.index, error = %e, "write failed; closing");
                    }
                    conn.writing.set(0);
                    conn.break_off();
                    break 'batches;
                }
                Ok(k) => {
                    written += k;
                    conn.writing.set(n - written);
                    ShardStats::add(&stats.bytes_out, k as u64);
                }
            }
        }
        spare.clear();
        // Below the output bound again: the reader may go on.
        conn.capacity.notify();
    }
    let _ = wr.shutdown().await;
}
