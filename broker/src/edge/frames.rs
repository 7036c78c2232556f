//! The frame edge: size-prefixed FlatBuffers frames on TCP, served on each
//! shard's own listener by the shard's tasks (`crate::shard` runs them).
//!
//! # Invariants
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
use std::rc::{Rc, Weak};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use atomic_waker::AtomicWaker;
use bytes::BytesMut;
use mcp_schema::FrameSplitter;
use mcp_schema::encode::ReplyTo;
use mcp_schema::verify::{VerifiedRequest, header_of_invalid};
use mcp_schema::view::reply_to_header;
use monoio::buf::{IoBuf, IoBufMut};
use monoio::io::{CancelableAsyncReadRent, Splitable};
use monoio::net::{TcpListener, TcpStream};

use crate::dispatch::{LiveOut, ShardCtx, handle_live};
use crate::local::{Latch, Notify};
use crate::metrics;
use crate::shard::{Panicked, Shard, drop_future, poll_until};
use crate::shared::ShardStats;

/// Accepts frame connections until the drain begins.
pub(crate) async fn accept_loop(
    shard: &Rc<Shard>,
    listener: TcpListener,
    rebinds: crate::shard::Rebinds,
) {
    let max = shard.ctx.shared.config.frames.max_connections_per_shard;
    let on_accept = |(stream, peer): (monoio::net::TcpStream, std::net::SocketAddr)| {
        let stats = shard.stats();
        if shard.connections.get() >= max {
            ShardStats::add(&stats.connections_refused, 1);
            if let Some(suppressed) = shard.conn_log.take(Instant::now()) {
                tracing::warn!(shard = shard.ctx.index, %peer, max, suppressed, "connection refused: max_connections_per_shard reached");
            }
            drop(stream);
            return;
        }
        ShardStats::add(&stats.connections_accepted, 1);
        let _ = stream.set_nodelay(true);
        monoio::spawn(connection(shard.clone(), stream, peer));
    };
    let failed = (&shard.stats().accept_errors, shard.ctx.index);
    crate::shard::accept_loop(
        listener,
        rebinds,
        &shard.draining,
        on_accept,
        failed,
        "frames",
    )
    .await;
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
async fn serve(ctx: Rc<ShardCtx>, mut job: Job, conn: Weak<dyn LiveOut>) -> Job {
    let live = Live(conn);
    handle_live(&ctx, &job.req, &mut job.args, &mut job.out, Some(&live)).await;
    job
}

/// A running call's progress and logs, queued for the connection's writer
/// as they come (a router that reports them: `dispatch::LiveOut`).
struct Live(Weak<dyn LiveOut>);

impl LiveOut for Live {
    fn frame(&self, frame: &[u8]) {
        if let Some(conn) = self.0.upgrade() {
            conn.frame(frame);
        }
    }

    fn shows_tool(&self, auth: &crate::auth::Auth, name: &str) -> bool {
        self.0.upgrade().is_some_and(|c| c.shows_tool(auth, name))
    }
}

impl<F> LiveOut for Conn<F> {
    fn frame(&self, frame: &[u8]) {
        self.push_out(frame);
    }

    fn hears_unasked(&self) -> bool {
        self.principal
            .borrow()
            .as_ref()
            .is_none_or(|p| !p.expired())
    }

    fn shows_tool(&self, auth: &crate::auth::Auth, name: &str) -> bool {
        self.principal
            .borrow()
            .as_ref()
            .is_some_and(|p| auth.allows_tool(p, name))
    }
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
    /// When the request in the slot arrived and began: the drain
    /// deadline's answer ([`expire`]) is recorded with them.
    times: (Instant, Instant),
    /// Its router and tool for the metrics, read as it started.
    who: metrics::record::Attribution,
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
            times: (Instant::now(), Instant::now()),
            who: metrics::record::Attribution::BROKER,
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

/// One connection's shared state.
struct Conn<F> {
    /// Builds a request's future (always [`serve`]; a pointer because its
    /// type cannot be named).
    serve: fn(Rc<ShardCtx>, Job, Weak<dyn LiveOut>) -> F,
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
    /// Set with `broken`: the workers drop the calls still running, whose
    /// answers nobody can read (their guests stop, their instances are
    /// replaced), instead of running them to their deadline.
    gone: Latch,
    /// Registered in the shard's `list_listeners` (it initialized).
    listening: Cell<bool>,
    /// With `[auth]`: whom the token of its `InitializeRequest` speaks for
    /// (nothing but initialize and ping is answered before).
    principal: RefCell<Option<std::sync::Arc<crate::auth::Principal>>>,
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
        self.gone.set();
        self.close();
    }
}

/// One accepted connection, from its TLS handshake (with `[tls]`) to its
/// close. It counts against `max_connections_per_shard` from the accept on.
async fn connection(shard: Rc<Shard>, stream: TcpStream, peer: SocketAddr) {
    let stats = shard.stats();
    shard.connections.set(shard.connections.get() + 1);
    ShardStats::add(&stats.connections_open, 1);
    let fd = std::os::fd::AsRawFd::as_raw_fd(&stream);
    match shard.ctx.shared.tls.clone() {
        None => {
            let (rd, wr) = stream.into_split();
            serve_connection(&shard, rd, wr, peer, Some(fd)).await;
        }
        Some(tls) => {
            let draining = &shard.draining;
            let edge = crate::tls::Edge::Frames;
            if let Some((rd, wr)) = tls.accept_on_shard(edge, stream, peer, draining).await {
                // No byte budget at the drain: the TLS reader holds records
                // it took from the socket, which FIONREAD does not count.
                serve_connection(&shard, rd, wr, peer, None).await;
            }
        }
    }
    shard.connections.set(shard.connections.get() - 1);
    ShardStats::sub(&stats.connections_open, 1);
}

/// Serves one connection's frames over its (plaintext or TLS) halves.
async fn serve_connection(
    shard: &Rc<Shard>,
    rd: impl CancelableAsyncReadRent,
    wr: impl monoio::io::AsyncWriteRent + 'static,
    peer: SocketAddr,
    fd: Option<std::os::fd::RawFd>,
) {
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
        listening: Cell::new(false),
        principal: RefCell::new(None),
        capacity: Notify::default(),
        closed: Latch::default(),
        broken: Cell::new(false),
        gone: Latch::default(),
    });
    let writer = monoio::spawn(write_loop(shard.clone(), conn.clone(), wr));
    if let Err(reason) = read_loop(shard, &conn, rd, fd).await
        && let Some(suppressed) = shard.conn_log.take(Instant::now())
    {
        tracing::info!(shard = shard.ctx.index, %peer, suppressed, "closing connection: {reason}");
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
    if !shard.resource_subs.borrow().is_empty() {
        forget_subscriptions(shard, &conn);
    }
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

/// While draining, how long after the drain began a connection that is
/// never quiet is still read: long enough for a burst a client wrote
/// before the drain (still in its own socket buffer, which the kernel's
/// count here does not see) to arrive and be answered, and no longer.
/// Under steady load a client was never quiet for [`DRAIN_QUIET`]: its
/// connection was read, tens of thousands of new requests refused, until
/// the drain deadline. What the kernel held for it when the drain began
/// ([`unread_bytes`]) is read in any case.
const DRAIN_READ_MAX: Duration = Duration::from_secs(1);

/// Bytes received on socket `fd` and not read yet (`FIONREAD`); `None`
/// when the kernel will not say. (Over TLS the budget is not used: the
/// TLS reader holds records it already took from the socket.)
fn unread_bytes(fd: std::os::fd::RawFd) -> Option<u64> {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int through the pointer, which is valid
    // for the call; a closed or foreign fd only makes the call fail.
    let rc = unsafe { libc::ioctl(fd, libc::FIONREAD, &mut n) };
    (rc == 0).then(|| u64::try_from(n).unwrap_or(0))
}

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
    fd: Option<std::os::fd::RawFd>,
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
    // The read's deadline (idle or partial frame) is kept by one timer for
    // the whole connection, re-armed lazily: only when a deadline is earlier
    // than the one it is armed for, or after it fired. A timer made per read
    // cost a clock read and a timer-wheel insertion and removal per read,
    // which at one or two frames per read is paid per request. A timer
    // armed for an earlier deadline than the wait's own fires early; the
    // wait then re-arms it and goes on.
    let mut timer = std::pin::pin!(monoio::time::sleep_until(
        (last_read + cfg.idle_timeout).into(),
    ));
    // When the idle clock started: when the broker last heard from the peer
    // or last stopped serving, or when it ran out while answers were due.
    let mut idle_from = last_read;
    // Bytes read so far, and (draining) how many the peer had sent when
    // this connection saw the drain: it is read up to there at most.
    let mut bytes_read: u64 = 0;
    let mut read_until: Option<u64> = None;
    let mut drain_seen: Option<Instant> = None;
    let mut drain_frame_extended = false;
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
        // has been quiet for DRAIN_QUIET, or for DRAIN_READ_MAX once what
        // the kernel held at the drain is read; then stop, answer, flush,
        // close.
        let draining = shard.draining.is_set();
        if shard.drain_expired.is_set() {
            return Ok(());
        }
        if draining {
            let seen = *drain_seen.get_or_insert_with(Instant::now);
            let until = read_until.get_or_insert_with(|| {
                // Without the kernel's count (TLS), the quiet rule and the
                // time bound alone.
                let unread = fd.and_then(unread_bytes).unwrap_or(0);
                bytes_read.saturating_add(unread)
            });
            if bytes_read >= *until && Instant::now() >= seen + DRAIN_READ_MAX {
                // All the peer sent before the drain has been read, but
                // perhaps not all of a frame it had begun: that one is read
                // to its end (its length prefix first) and answered, once.
                if buf.is_empty() || drain_frame_extended {
                    return Ok(());
                }
                let held = buf.len() as u64;
                *until = match buf.get(..4) {
                    Some(p) => {
                        drain_frame_extended = true;
                        let len = u32::from_le_bytes([p[0], p[1], p[2], p[3]]);
                        bytes_read - held + 4 + u64::from(len)
                    }
                    None => bytes_read + (4 - held),
                };
            }
        }
        // `cursor` is the end of the last frame's handling or of a wait: a
        // time already read, not a new clock read per read.
        idle_from = idle_from.max(cursor);
        let mut deadline = match partial_since {
            Some(t) => t + cfg.partial_frame_timeout,
            None => idle_from + cfg.idle_timeout,
        };
        if draining {
            // Quiet this long: all it sent before the drain is read. (A
            // peer that keeps sending is stopped by DRAIN_READ_MAX above.)
            deadline = deadline.min(Instant::now() + DRAIN_QUIET);
        }
        // Checked here as well as by the timer: monoio advances its timers
        // only when the shard parks, which a saturated shard rarely does, so
        // a peer trickling bytes is caught at its next byte past the
        // deadline rather than whenever the timer gets to fire.
        if partial_since.is_some() && Instant::now() >= deadline {
            return Err(format!(
                "partial frame not completed within {:?}",
                cfg.partial_frame_timeout
            ));
        }
        if timer.is_elapsed() || deadline < timer.deadline().into_std() {
            timer.as_mut().reset(deadline.into());
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
        let ended = loop {
            let fired = monoio::select! {
                r = &mut read => break Some(r),
                _ = timer.as_mut() => true,
                _ = conn.closed.wait() => false,
                _ = shard.draining.wait(), if !draining => false,
            };
            // Armed for an earlier deadline than this wait's: not yet.
            if fired && Instant::now() < deadline {
                timer.as_mut().reset(deadline.into());
                continue;
            }
            break None;
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
                crate::idle_poll::note_activity();
                bytes_read += n as u64;
                ShardStats::add(&stats.bytes_in, n as u64);
                // One clock read for the whole batch: every frame of it
                // arrived with this read. Each answered frame's end time is
                // the next one's start.
                last_read = Instant::now();
                continue;
            }
            // Cancelled, with the buffer (and any partial frame) intact.
            Err(e) if e.raw_os_error() == Some(libc::ECANCELED) => {}
            Err(e) => {
                // Reset (or worse): nobody will read an answer. (A FIN is
                // `Ok(0)` above: a half-closed peer may still read, so its
                // calls run on.)
                conn.break_off();
                return Err(format!("read error: {e}"));
            }
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
            // Not idle: answers are still due. The clock starts again.
            idle_from = Instant::now();
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
    if let Some(auth) = &shard.ctx.shared.auth
        && let Err(why) = admit(auth, conn, &req)
    {
        ShardStats::add(&stats.error_responses, 1);
        let to = req.view().reply_to();
        let mut enc = shard.ctx.enc.borrow_mut();
        conn.push_out(enc.error(&to, mcp_schema::ErrorCode::Unauthorized, &why, None));
        return started;
    }
    // With `[auth]` a frame client's session ids are its subject's own: the
    // id it chose names a router session within that subject, never
    // another subject's, nor a session the HTTP or gRPC edge minted (the
    // edges that bind theirs to the subject themselves). Without `[auth]`
    // there is no subject, and an id is shared across edges as it is.
    let req = match conn.principal.borrow().as_ref() {
        Some(p) if req.view().session_id().is_some() => {
            req.with_session_scope(std::sync::Arc::from(p.subject.as_str()))
        }
        _ => req,
    };
    if !conn.listening.get() && req.view().kind() == mcp_schema::RequestKind::Initialize {
        // An MCP client: it handles notifications, so it is told when the
        // listings change.
        conn.listening.set(true);
        let me: Weak<dyn LiveOut> = Rc::downgrade(conn) as Weak<Conn<F>>;
        push_pruned(&mut shard.list_listeners.borrow_mut(), me);
    }
    conn.pending.set(conn.pending.get() + 1);
    ShardStats::add(&stats.in_flight, 1);
    let mut slot = conn.free.borrow_mut().pop().unwrap_or_else(Slot::new);
    // Kept (a reference count, not a copy) to answer the request should the
    // drain deadline cancel its future while it waits, or its handler panic.
    slot.req = Some(req.clone());
    slot.times = (arrived, started);
    slot.who = metrics::record::attribute(&shard.ctx, &req);
    let job = Job {
        req,
        arrived,
        started,
        args: std::mem::take(&mut slot.args),
        out: std::mem::take(&mut slot.out),
    };
    let live: Weak<dyn LiveOut> = Rc::downgrade(conn) as Weak<Conn<F>>;
    slot.fut
        .set(Some((conn.serve)(shard.ctx.clone(), job, live)));
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

/// With `[auth]`: whether `req` may be served on `conn`, else the refusal's
/// message. The token rides in the connection's `InitializeRequest`
/// (`auth_token`); before a valid one only initialize and ping are
/// answered; the token's expiry ends what the connection may do; a tool
/// with `[[auth.rules]]` needs their scopes.
fn admit<F>(auth: &crate::auth::Auth, conn: &Conn<F>, req: &VerifiedRequest) -> Result<(), String> {
    use crate::auth::Failure;
    use mcp_schema::RequestKind;
    let view = req.view();
    match view.kind() {
        RequestKind::Ping => Ok(()),
        RequestKind::Initialize => {
            let token = view
                .request()
                .payload_as_initialize_request()
                .and_then(|i| i.auth_token());
            let header = token.map(|t| format!("Bearer {t}"));
            match auth.authenticate(header.as_deref().map(str::as_bytes)) {
                Ok(p) => {
                    *conn.principal.borrow_mut() = Some(p);
                    Ok(())
                }
                Err(f) => {
                    *conn.principal.borrow_mut() = None;
                    // The frame edge has no Authorization header to name.
                    Err(match f {
                        Failure::Missing => "authentication required: send the bearer token \
                                             in this InitializeRequest's auth_token"
                            .to_owned(),
                        f => f.describe(auth.base_scopes()),
                    })
                }
            }
        }
        kind => {
            let principal = conn.principal.borrow();
            let Some(p) = principal.as_ref() else {
                auth.count(Failure::Missing);
                return Err(
                    "authentication required: send the bearer token in this connection's InitializeRequest (auth_token) first"
                        .into(),
                );
            };
            if p.expired() {
                auth.count(Failure::Expired);
                return Err(Failure::Expired.describe(&[]));
            }
            if kind == RequestKind::CallTool
                && let mcp_schema::RouteKey::Tool(name) = view.route_key()
            {
                auth.check_tool(p, name)
                    .map_err(|missing| Failure::InsufficientScope.describe(&missing))?;
            }
            Ok(())
        }
    }
}

/// Answers a served request: records it, queues its frames for the writer,
/// frees its slot. Returns the end time read for the metrics.
fn finish<F: 'static>(
    shard: &Rc<Shard>,
    conn: &Rc<Conn<F>>,
    mut slot: Slot<F>,
    mut job: Job,
) -> Instant {
    if matches!(
        job.req.view().kind(),
        mcp_schema::RequestKind::Subscribe | mcp_schema::RequestKind::Unsubscribe
    ) {
        track_subscription(shard, conn, &mut job);
    }
    let ended = metrics::record::request(
        &shard.ctx,
        metrics::Edge::Frames,
        &job.req,
        slot.who,
        job.arrived,
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

use crate::edge::{
    MAX_RESOURCE_SUBSCRIPTIONS as MAX_SUBSCRIPTIONS_PER_CONNECTION, MAX_SUBSCRIBED_URI_BYTES,
};

/// Records an answered `SubscribeRequest` in the shard's list, so that the
/// resource's updates reach this connection, or drops the subscription an
/// `UnsubscribeRequest` names (whatever its answer: a router removed by a
/// reload answers not-found). Past [`MAX_SUBSCRIPTIONS_PER_CONNECTION`], or
/// for a URI over [`MAX_SUBSCRIBED_URI_BYTES`], the answer becomes -32602.
/// (They were answered, and their updates went nowhere.)
fn track_subscription<F: 'static>(shard: &Rc<Shard>, conn: &Rc<Conn<F>>, job: &mut Job) {
    use mcp_schema::RequestKind;
    let view = job.req.view();
    let mcp_schema::RouteKey::Resource(uri) = view.route_key() else {
        return;
    };
    let me = Rc::downgrade(conn) as Weak<Conn<F>>;
    let mine = |w: &Weak<dyn LiveOut>| std::ptr::addr_eq(w.as_ptr(), me.as_ptr());
    // The session key its requests reach a session-affine router's
    // instance by: the updates of that instance's state are its own.
    let session = job.req.session_key(view.session_id());
    let counts = &shard.ctx.shared.frame_subscriptions;
    let mut subs = shard.resource_subs.borrow_mut();
    let at = subs.iter().position(|s| {
        &*s.uri == uri && mine(&s.conn) && s.session.as_deref() == session.as_deref()
    });
    if view.kind() == RequestKind::Unsubscribe {
        if let Some(i) = at {
            subs.swap_remove(i);
            counts.remove(uri, shard.ctx.index);
        }
        return;
    }
    let answered =
        mcp_schema::client::ResponseView::parse(&job.out).is_ok_and(|r| r.error().is_none());
    if !answered || at.is_some() {
        return;
    }
    let refused = if uri.len() > MAX_SUBSCRIBED_URI_BYTES {
        Some(format!(
            "a resource URI of at most {MAX_SUBSCRIBED_URI_BYTES} bytes may be subscribed to"
        ))
    } else if subs.iter().filter(|s| mine(&s.conn)).count() >= MAX_SUBSCRIPTIONS_PER_CONNECTION {
        Some(format!(
            "at most {MAX_SUBSCRIPTIONS_PER_CONNECTION} resource subscriptions per connection"
        ))
    } else {
        None
    };
    if let Some(why) = refused {
        let to = view.reply_to();
        job.out.clear();
        job.out.extend_from_slice(shard.ctx.enc.borrow_mut().error(
            &to,
            mcp_schema::ErrorCode::InvalidParams,
            &why,
            None,
        ));
        return;
    }
    subs.push(crate::shard::ResourceSub {
        uri: uri.into(),
        session: session.map(Into::into),
        conn: me as Weak<dyn LiveOut>,
    });
    counts.add(uri, shard.ctx.index, shard.ctx.shared.shards());
}

/// Drops a closing connection's resource subscriptions (a client that
/// subscribed and left, again and again, grew the shard's list, which was
/// pruned only by the next update of each URI).
fn forget_subscriptions<F: 'static>(shard: &Shard, conn: &Rc<Conn<F>>) {
    let me = Rc::as_ptr(conn);
    let counts = &shard.ctx.shared.frame_subscriptions;
    shard.resource_subs.borrow_mut().retain(|s| {
        let mine = std::ptr::addr_eq(s.conn.as_ptr(), me);
        if mine {
            counts.remove(&s.uri, shard.ctx.index);
        }
        !mine
    });
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

/// Adds `me` to a shard's list-change listeners. Closed connections leave
/// their entry until a list change prunes it, and each entry holds its
/// connection's allocation: the dead are pruned before the list grows, so
/// that it stays within twice the most listeners open at once (it grew by
/// one entry, ~0.6 KiB, per connection ever made).
fn push_pruned<T: ?Sized>(listeners: &mut Vec<Weak<T>>, me: Weak<T>) {
    if listeners.len() == listeners.capacity() {
        listeners.retain(|l| l.strong_count() > 0);
    }
    listeners.push(me);
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
async fn worker<F: Future<Output = Job> + 'static>(shard: Rc<Shard>, conn: Rc<Conn<F>>) {
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
        // A call in a session runs to its end even for a peer that is gone:
        // dropping it mid-call would replace the session's instance, and
        // the session's state with it, which the client may come back for.
        let in_session = slot
            .req
            .as_ref()
            .is_some_and(|r| r.view().session_id().is_some());
        let done = monoio::select! {
            job = poll_fn(|cx| {
                // Register before polling: a wake-up that came while the slot
                // changed hands is covered by this poll.
                slot.wake.0.register(cx.waker());
                slot.poll()
            }) => Some(job),
            _ = shard.drain_expired.wait() => None,
            _ = conn.gone.wait(), if !in_session => {
                abandon(&shard, &conn, slot);
                continue;
            }
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

/// Drops a waiting request whose peer is gone (reset, or cut off for
/// reading nothing): its future is dropped, which stops its guest, and
/// nothing is answered, since nobody would read it. (Not a call in a
/// session: see [`worker`].)
fn abandon<F>(shard: &Rc<Shard>, conn: &Rc<Conn<F>>, mut slot: Slot<F>) {
    drop_future(&mut slot.fut);
    slot.req = None;
    conn.pending.set(conn.pending.get() - 1);
    ShardStats::sub(&shard.stats().in_flight, 1);
    conn.capacity.notify();
}

/// Answers a waiting request the drain deadline overtook, with a
/// shutting-down error, and drops its future (cancelling the call).
fn expire<F>(shard: &Rc<Shard>, conn: &Rc<Conn<F>>, mut slot: Slot<F>) {
    drop_future(&mut slot.fut);
    if let Some(req) = slot.req.take() {
        let mut answer = Vec::new();
        crate::shard::drain_deadline_answer(&shard.ctx, &req, &mut answer);
        // Counted as the HTTP and gRPC edges' drain answers are.
        let (arrived, started) = slot.times;
        let edge = metrics::Edge::Frames;
        let who = slot.who;
        metrics::record::request(
            &shard.ctx, edge, &req, who, arrived, arrived, started, &answer,
        );
        conn.push_out(&answer);
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
    // One timer for every write of the connection, re-armed only after it
    // fired (as the reader's): a timer per write cost a timer-wheel
    // insertion and removal per batch of answers.
    let mut timer = std::pin::pin!(monoio::time::sleep_until((Instant::now() + timeout).into()));
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
            let deadline = Instant::now() + timeout;
            if timer.is_elapsed() {
                timer.as_mut().reset(deadline.into());
            }
            let mut write = std::pin::pin!(wr.write(spare.slice(written..)));
            let done = loop {
                monoio::select! {
                    r = &mut write => break Some(r),
                    _ = timer.as_mut() => {}
                }
                // Armed for an earlier write's deadline: not yet.
                if Instant::now() < deadline {
                    timer.as_mut().reset(deadline.into());
                    continue;
                }
                break None;
            };
            let (res, b) = match done {
                Some(r) => r,
                None => {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closed_listeners_are_pruned_before_the_list_grows() {
        let mut listeners: Vec<Weak<u32>> = Vec::new();
        let open: Vec<Rc<u32>> = (0..3).map(Rc::new).collect();
        for o in &open {
            push_pruned(&mut listeners, Rc::downgrade(o));
        }
        // 10,000 connections that come and go beside the three open ones.
        for i in 0..10_000 {
            let gone = Rc::new(i);
            push_pruned(&mut listeners, Rc::downgrade(&gone));
        }
        assert!(listeners.capacity() <= 16, "{}", listeners.capacity());
        let live = listeners.iter().filter(|l| l.strong_count() > 0).count();
        assert_eq!(live, 3);
    }
}
