//! Shards: one thread, one monoio runtime, one `SO_REUSEPORT` listener per
//! edge (frames: `crate::edge::frames`; HTTP: `crate::edge::http`; gRPC:
//! `crate::edge::grpc`) and one set of router pools each.
//!
//! # Invariants
//! - A connection lives on the shard that accepted it, for its whole life.
//! - Shard state (`Rc`, `RefCell`, pools, encoders) never leaves its thread;
//!   other threads reach a shard only through its inbox.
//! - A shard exits only after its connections have written the answers to
//!   what they read (or one second after the drain deadline).

use std::cell::{Cell, RefCell};
use std::future::{Future, poll_fn};
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use mcp_schema::ResponseEncoder;
use mcp_schema::verify::VerifiedRequest;
use monoio::net::TcpListener;

use crate::dispatch::ShardCtx;
use crate::local::{Latch, YieldQueue};
use crate::metrics;
use crate::shared::{EdgeDeadline, ShardMsg, ShardStats, Shared};
use crate::wasm::RouterPool;

/// Everything a shard thread needs to start.
pub struct ShardStart {
    pub index: usize,
    pub shared: Arc<Shared>,
    pub listener: std::net::TcpListener,
    /// This shard's listener of the MCP HTTP edge (same address on every
    /// shard, `SO_REUSEPORT`).
    pub http_listener: std::net::TcpListener,
    /// This shard's listener of the gRPC edge (`SO_REUSEPORT` too), and the
    /// edge's state shared by the shards.
    pub grpc_listener: std::net::TcpListener,
    pub grpc: Arc<crate::edge::grpc::GrpcEdge>,
    pub cpu: Option<usize>,
}

thread_local! {
    /// The shard this thread runs, while it runs: for the gRPC edge, whose
    /// service state is shared by the shards (tonic needs it `Send + Sync`)
    /// and so cannot hold a shard's `Rc`.
    static HERE: RefCell<Option<Rc<Shard>>> = const { RefCell::new(None) };
}

/// Shard `index`, when the calling thread runs it.
fn here(index: usize) -> Option<Rc<Shard>> {
    HERE.with(|h| {
        h.borrow()
            .as_ref()
            .filter(|s| s.ctx.index == index)
            .cloned()
    })
}

/// The request and its live-notification sink, given back by
/// [`handle_here`] off shard `index`'s thread.
pub(crate) type NotHere = (VerifiedRequest, Option<crate::shared::LiveSender>);

/// Handles `req` on shard `index` in the caller's task, when the calling
/// thread runs that shard (else gives the request back, to be handed off):
/// what a hand-off job does ([`ShardMsg::Job`]) without the inbox, the
/// spawned task and the oneshot. Exactly one answer, as there: the drain
/// deadline answers a call still running. A caller that stops waiting drops
/// the future, which stops the guest as a dropped job does; a panic unwinds
/// to the caller (the gRPC edge answers it with INTERNAL). The future holds
/// the shard's `Rc`s, so it is [`ShardBound`]: `Send` for tonic, checked to
/// stay on the thread.
///
/// [`ShardBound`]: crate::edge::rt::ShardBound
pub(crate) fn handle_here(
    index: usize,
    req: VerifiedRequest,
    live: Option<crate::shared::LiveSender>,
    edge_deadline: Option<EdgeDeadline>,
) -> Result<crate::edge::rt::ShardBound<impl Future<Output = Vec<u8>>>, NotHere> {
    match here(index) {
        Some(shard) => Ok(crate::edge::rt::ShardBound::new(handle_on(
            shard,
            req,
            live,
            edge_deadline,
        ))),
        None => Err((req, live)),
    }
}

async fn handle_on(
    shard: Rc<Shard>,
    req: VerifiedRequest,
    live: Option<crate::shared::LiveSender>,
    edge_deadline: Option<EdgeDeadline>,
) -> Vec<u8> {
    /// In flight until answered, dropped or unwound.
    struct InFlight<'a>(&'a ShardStats);
    impl Drop for InFlight<'_> {
        fn drop(&mut self) {
            ShardStats::sub(&self.0.in_flight, 1);
        }
    }
    /// Records the call if the edge drops it having answered
    /// DEADLINE_EXCEEDED itself ([`record_edge_deadline`]). A panic that
    /// unwinds through it is the handler's failure, which the edge's panic
    /// guard answers with INTERNAL (`edge/grpc/guard.rs`), not a deadline.
    struct Unanswered<'a> {
        shard: &'a Shard,
        req: &'a VerifiedRequest,
        who: metrics::record::Attribution,
        arrived: Instant,
        edge_deadline: Option<EdgeDeadline>,
        answered: bool,
    }
    impl Drop for Unanswered<'_> {
        fn drop(&mut self) {
            if !self.answered
                && !std::thread::panicking()
                && self.edge_deadline.as_ref().is_some_and(EdgeDeadline::fired)
            {
                let (ctx, at) = (&self.shard.ctx, self.arrived);
                record_edge_deadline(ctx, self.req, self.who, at, at);
            }
        }
    }
    let arrived = Instant::now();
    let who = metrics::record::attribute(&shard.ctx, &req);
    let stats = shard.stats();
    ShardStats::add(&stats.in_flight, 1);
    let _in_flight = InFlight(stats);
    let mut unanswered = Unanswered {
        shard: &shard,
        req: &req,
        who,
        arrived,
        edge_deadline,
        answered: false,
    };
    let live = live.map(SentLive);
    let (mut args, mut out) = (Vec::new(), Vec::new());
    run_or_expire(
        &shard,
        &req,
        &mut args,
        &mut out,
        live.as_ref().map(|l| l as &dyn crate::dispatch::LiveOut),
    )
    .await;
    unanswered.answered = true;
    let _ended = metrics::record::request(
        &shard.ctx,
        metrics::Edge::Grpc,
        &req,
        who,
        arrived,
        arrived,
        arrived,
        &out,
    );
    out
}

/// A gRPC call the edge dropped after answering DEADLINE_EXCEEDED itself
/// ([`EdgeDeadline`]; a router that waits, on a clock or the network, is
/// still waiting when the edge's timer fires): recorded with that outcome,
/// without which the client's answer would be missing from
/// `mcp_requests_total`.
fn record_edge_deadline(
    ctx: &ShardCtx,
    req: &VerifiedRequest,
    who: metrics::record::Attribution,
    arrived: Instant,
    started: Instant,
) {
    let to = req.view().reply_to();
    let frame = ctx
        .enc
        .borrow_mut()
        .error(
            &to,
            mcp_schema::ErrorCode::DeadlineExceeded,
            "the client's deadline passed",
            None,
        )
        .to_vec();
    let edge = metrics::Edge::Grpc;
    let _ended = metrics::record::request(ctx, edge, req, who, arrived, arrived, started, &frame);
}

/// The shard the calling thread runs (`None` off the shards).
pub fn current() -> Option<usize> {
    HERE.with(|h| h.borrow().as_ref().map(|s| s.ctx.index))
}

/// Runs shard `s` on the current thread until it has drained.
pub fn run(s: ShardStart, ready: std::sync::mpsc::Sender<Result<usize, String>>) {
    if let Some(cpu) = s.cpu
        && !core_affinity::set_for_current(core_affinity::CoreId { id: cpu })
    {
        tracing::warn!(shard = s.index, cpu, "could not pin shard to its CPU");
    }
    let ring = Ring::for_config(&s.shared.config.broker);
    let mut rt = match build_runtime(ring).or_else(|e| {
        if ring == Ring::Classic {
            return Err(e);
        }
        // Kernels before 6.1 refuse DEFER_TASKRUN, before 5.19 COOP_TASKRUN,
        // with EINVAL.
        tracing::debug!(shard = s.index, error = %e, ?ring, "io_uring refused the ring's setup flags; using the classic ring");
        build_runtime(Ring::Classic)
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
    crate::idle_poll::stop();
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

/// How a shard's io_uring posts its completions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ring {
    /// `SINGLE_ISSUER | DEFER_TASKRUN`: completions run only when the shard
    /// enters the kernel to wait for them, never interrupting it.
    Defer,
    /// `SINGLE_ISSUER | COOP_TASKRUN | TASKRUN_FLAG`: completions run at the
    /// shard's next `io_uring_enter` of any kind, also without an
    /// interrupt. What idle polling needs: its turns enter without waiting.
    Coop,
    /// Neither (older kernels, or `io_uring_defer_taskrun = false`).
    Classic,
}

impl Ring {
    pub fn for_config(b: &crate::config::BrokerSection) -> Self {
        if !b.idle_poll.is_zero() {
            Ring::Coop
        } else if b.io_uring_defer_taskrun {
            Ring::Defer
        } else {
            Ring::Classic
        }
    }

    /// The ring's builder; the ring is created on the thread that will use
    /// it, as SINGLE_ISSUER requires.
    pub fn builder(self) -> io_uring::Builder {
        let mut urb = io_uring::IoUring::builder();
        match self {
            Ring::Defer => {
                urb.setup_single_issuer().setup_defer_taskrun();
            }
            Ring::Coop => {
                urb.setup_single_issuer()
                    .setup_coop_taskrun()
                    .setup_taskrun_flag();
            }
            Ring::Classic => {}
        }
        urb
    }
}

/// A shard's monoio runtime: io_uring where the kernel has it (epoll
/// otherwise), with the ring set up as `ring` says.
fn build_runtime(ring: Ring) -> std::io::Result<Runtime> {
    monoio::RuntimeBuilder::<monoio::FusionDriver>::new()
        .uring_builder(ring.builder())
        .enable_timer()
        .build()
}

/// Shard-wide state of the running loop.
pub(crate) struct Shard {
    pub(crate) ctx: Rc<ShardCtx>,
    /// Shared with the HTTP edge, which drains on the same signal.
    pub(crate) draining: Rc<Latch>,
    pub(crate) drain_expired: Rc<Latch>,
    /// Open frame connections.
    pub(crate) connections: Cell<usize>,
    /// Frame connections that sent an `InitializeRequest`: told when the
    /// route table changes (`ListChangedNotification`).
    pub(crate) list_listeners: RefCell<Vec<std::rc::Weak<dyn crate::dispatch::LiveOut>>>,
    /// Frame connections' resource subscriptions: told when the resource
    /// changes (`ResourceUpdatedNotification`).
    pub(crate) resource_subs: RefCell<Vec<ResourceSub>>,
    pub(crate) yields: YieldQueue,
    /// Bounds the lines a flood of bad frame connections writes.
    pub(crate) conn_log: LogBudget,
    /// What a yielding guest waits on to let the ring in ([`guest_yield`]):
    /// `None` if the socket could not be made.
    ring_poke: Option<monoio::net::unix::UnixDatagram>,
    /// Where a reload's new listeners go: the accept loops.
    rebind_frames: Rebind,
    rebind_http: Rebind,
    rebind_grpc: Rebind,
}

/// A shard's allowance of per-connection log lines: [`LogBudget::BURST`]
/// at once, then [`LogBudget::PER_SECOND`]. Each bad frame connection
/// logged a line (about 170 bytes), so one client opening them in a loop
/// wrote its log at line rate; past the allowance lines are counted, and
/// the next line allowed says how many were not written.
#[derive(Debug)]
pub(crate) struct LogBudget {
    tokens: Cell<f64>,
    at: Cell<Instant>,
    suppressed: Cell<u64>,
}

impl Default for LogBudget {
    fn default() -> Self {
        Self {
            tokens: Cell::new(Self::BURST),
            at: Cell::new(Instant::now()),
            suppressed: Cell::new(0),
        }
    }
}

impl LogBudget {
    const BURST: f64 = 20.0;
    const PER_SECOND: f64 = 10.0;

    /// `Some(n)` when a line may be written now, `n` being the lines not
    /// written since the last one; `None` when this one is not.
    pub(crate) fn take(&self, now: Instant) -> Option<u64> {
        let gained = now.saturating_duration_since(self.at.get()).as_secs_f64() * Self::PER_SECOND;
        self.at.set(now);
        let tokens = (self.tokens.get() + gained).min(Self::BURST);
        if tokens < 1.0 {
            self.tokens.set(tokens);
            self.suppressed.set(self.suppressed.get() + 1);
            return None;
        }
        self.tokens.set(tokens - 1.0);
        Some(self.suppressed.replace(0))
    }
}

/// The sending half of an accept loop's listener hand-off.
type Rebind = futures_channel::mpsc::UnboundedSender<std::net::TcpListener>;
/// What an accept loop takes new listeners from.
pub(crate) type Rebinds = futures_channel::mpsc::UnboundedReceiver<std::net::TcpListener>;

impl Shard {
    pub(crate) fn stats(&self) -> &ShardStats {
        &self.ctx.shared.stats[self.ctx.index]
    }
}

async fn shard_main(s: ShardStart, ready: std::sync::mpsc::Sender<Result<usize, String>>) {
    let index = s.index;
    let mut pools = crate::routing::ShardPools::default();
    // Instantiate every pool now, so the first requests do not pay for it
    // and a broken router fails start-up rather than a request.
    for r in &s.shared.routing.load().routers {
        let pool = RouterPool::new(r.router.clone());
        if let Err(e) = pool.warm().await {
            let _ = ready.send(Err(format!("shard {index}: router `{}`: {e}", r.name)));
            return;
        }
        pools.insert(r.uid, r.slot, pool);
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
    let grpc_listener = match TcpListener::from_std(s.grpc_listener) {
        Ok(l) => l,
        Err(e) => {
            let _ = ready.send(Err(format!("shard {index}: gRPC listener: {e}")));
            return;
        }
    };
    // Without it a computing guest would hold its shard's connections
    // until its call ended: a start-up error (out of descriptors), not a
    // broker that starts degraded.
    let ring_poke = match monoio::net::unix::UnixDatagram::unbound() {
        Ok(s) => s,
        Err(e) => {
            let _ = ready.send(Err(format!(
                "shard {index}: the socket for guests' yields: {e}"
            )));
            return;
        }
    };
    let (rebind_frames, frames_rebinds) = futures_channel::mpsc::unbounded();
    let (rebind_http, http_rebinds) = futures_channel::mpsc::unbounded();
    let (rebind_grpc, grpc_rebinds) = futures_channel::mpsc::unbounded();
    let shard = Rc::new(Shard {
        ctx: Rc::new(ShardCtx {
            index,
            shared: s.shared.clone(),
            pools: RefCell::new(pools),
            enc: RefCell::new(ResponseEncoder::new(index as u64)),
        }),
        draining: Rc::default(),
        drain_expired: Rc::default(),
        connections: Cell::new(0),
        list_listeners: RefCell::default(),
        resource_subs: RefCell::default(),
        yields: YieldQueue::default(),
        conn_log: LogBudget::default(),
        ring_poke: Some(ring_poke),
        rebind_frames,
        rebind_http,
        rebind_grpc,
    });
    HERE.with(|h| *h.borrow_mut() = Some(shard.clone()));
    crate::wasm::set_thread_yield(Some(guest_yield));
    monoio::spawn(inbox_loop(shard.clone()));
    {
        let shard = shard.clone();
        monoio::spawn(async move { shard.yields.run().await });
    }
    monoio::spawn(housekeeping(shard.ctx.clone()));
    let idle_poll = s.shared.config.broker.idle_poll;
    if !idle_poll.is_zero() {
        let shard = shard.clone();
        monoio::spawn(async move {
            let stats = shard.stats();
            crate::idle_poll::run(&shard.yields, idle_poll, |d| {
                ShardStats::add(&stats.idle_poll_ns, d.as_nanos() as u64);
            })
            .await
        });
    }
    let http = crate::edge::http::HttpEdge::new(
        shard.ctx.clone(),
        shard.draining.clone(),
        shard.drain_expired.clone(),
    );
    let http_accepting = monoio::spawn(crate::edge::http::accept_loop(
        http.clone(),
        http_listener,
        http_rebinds,
    ));
    monoio::spawn(crate::edge::http::expire_sessions(http.clone()));
    let grpc = crate::edge::grpc::ShardGrpc::new(
        index,
        &s.shared,
        s.grpc.clone(),
        shard.draining.clone(),
        shard.drain_expired.clone(),
    );
    let grpc_accepting = monoio::spawn(crate::edge::grpc::accept_loop(
        grpc.clone(),
        grpc_listener,
        grpc_rebinds,
    ));
    if index == 0 {
        // gRPC sessions are the edge's, not a shard's: one shard sweeps.
        monoio::spawn(crate::edge::grpc::sweep_sessions(
            s.grpc.clone(),
            s.shared.config.grpc.session_idle_timeout,
            shard.draining.clone(),
        ));
    }
    shard
        .stats()
        .ready
        .store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = ready.send(Ok(index));
    drop(ready);

    crate::edge::frames::accept_loop(&shard, listener, frames_rebinds).await;
    // The other edges' loops stop listening too before anything else: an
    // idle shard's drain below ends at once, and a spawned task not run
    // before the runtime ends would leave its listener taking connections
    // until the process exits.
    http_accepting.await;
    grpc_accepting.await;
    // Draining: every connection stops reading, waits for the answers to
    // what it read, and flushes them; gRPC connections are asked to go
    // away and their calls finish. The shard ends when all of that is done,
    // or at the drain deadline plus a short grace for the shutting-down
    // answers it sends then to reach the wire.
    poll_until(&shard.drain_expired, || {
        shard.connections.get() == 0
            && http.connections() == 0
            && grpc.connections() == 0
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
            (shard.connections.get() == 0 && http.connections() == 0 && grpc.connections() == 0)
                || Instant::now() >= grace
        })
        .await;
    }
    crate::wasm::set_thread_yield(None);
    HERE.with(|h| h.borrow_mut().take());
    tracing::debug!(shard = index, "shard drained");
}

/// How a guest's task on this shard yields at an epoch tick: it waits for a
/// completion of the shard's own ring, then lets the shard's other tasks
/// run ([`GUEST_YIELD_ROUNDS`] rounds), then submits what they wrote.
///
/// Why a completion: the ring is `DEFER_TASKRUN` by default, which posts
/// the completions of the shard's sockets only when the shard waits in the
/// kernel for one, and monoio waits only when no task is runnable and no
/// task was woken from another thread. A guest's task woken from another
/// thread ([`crate::wasm::set_thread_yield`]'s default) was often woken
/// before monoio looked, which left the sockets unread until its call
/// ended. Waiting on the ring instead makes monoio
/// enter with `GETEVENTS`: a poll for `POLLOUT` on a socket that is never
/// written to is ready at once, so the wait costs no time, and every
/// completion that arrived meanwhile is posted with it. Then the yield
/// queue puts the guest behind the tasks those completions woke, and
/// behind the tasks those woke in turn.
fn guest_yield() -> crate::wasm::GuestYield {
    let shard = HERE.with(|h| h.borrow().clone());
    Box::pin(crate::edge::rt::ShardBound::new(async move {
        if let Some(shard) = shard {
            yield_through_ring(shard.ring_poke.as_ref(), &shard.yields).await;
        }
    }))
}

/// Lets this shard's sockets and other tasks in, as a computing guest does
/// at an epoch tick ([`guest_yield`]): for a task with a long run of work
/// that never waits, such as a big JSON-RPC batch. A plain
/// [`YieldQueue::yield_now`] runs the tasks already woken, but not the
/// sockets' completions, which the ring posts only when the shard waits.
pub(crate) async fn yield_to_sockets() {
    let shard = HERE.with(|h| h.borrow().clone());
    if let Some(shard) = shard {
        yield_through_ring(shard.ring_poke.as_ref(), &shard.yields).await;
    }
}

/// [`guest_yield`]'s steps, given the shard's socket and yield queue.
async fn yield_through_ring(poke: Option<&monoio::net::unix::UnixDatagram>, yields: &YieldQueue) {
    let Some(poke) = poke else {
        return yields.yield_now().await;
    };
    // An error means the same as readiness here: the ring was entered.
    let _ = poke.writable(true).await;
    // The completions wake tasks that wake others before an answer is
    // written: a gRPC request goes from its connection's task to its
    // stream's and back. Each round runs what the one before woke.
    for _ in 0..GUEST_YIELD_ROUNDS {
        yields.yield_now().await;
    }
    // Once more, so that what those tasks wrote reaches the kernel now and
    // not at the guest's next tick.
    let _ = poke.writable(true).await;
}

/// Rounds of the shard's other tasks a yielding guest lets run: enough for
/// the chains of tasks between a read and its answer's write. One round
/// carried a hand-off through one task more (`shard::tests`) and left the
/// gRPC edge's answers a tick late (echo p99 2.1 ms behind a computing
/// guest at a 1 ms tick, against 1.07 ms over HTTP); three carry seven, and
/// gRPC's p99 there is 1.09 ms.
const GUEST_YIELD_ROUNDS: usize = 3;

/// Accepts on `listener`, and on each listener a reload hands over: the
/// newest takes new connections, the one it replaces lingers for
/// [`crate::shared::LISTENER_LINGER`] (its backlog, clients that raced the
/// change) and closes. Ends when the shard drains; `on_accept` serves each
/// connection.
///
/// A failed accept (EMFILE when the process is out of descriptors, ENFILE,
/// ENOBUFS) is counted in `failed`, logged within a budget, and followed by
/// a 10 ms pause: the connection stays in the kernel's backlog, so an
/// accept retried at once fails again, and a loop of them wrote 100 lines a
/// second per shard and edge while told nothing on `/metrics`.
pub(crate) async fn accept_loop(
    listener: TcpListener,
    mut rebinds: Rebinds,
    draining: &Latch,
    on_accept: impl Fn((monoio::net::TcpStream, std::net::SocketAddr)),
    (failed, shard): (&std::sync::atomic::AtomicU64, usize),
    what: &'static str,
) {
    use futures_core::Stream;
    let mut listener = listener;
    let log = LogBudget::default();
    let mut old: Option<(TcpListener, Instant)> = None;
    loop {
        /// What woke the loop.
        enum Next {
            Accepted(std::io::Result<(monoio::net::TcpStream, std::net::SocketAddr)>),
            FromOld(std::io::Result<(monoio::net::TcpStream, std::net::SocketAddr)>),
            Rebind(std::net::TcpListener),
            OldDone,
            Drain,
        }
        let linger = async {
            match &old {
                Some((l, until)) => monoio::select! {
                    r = l.accept() => Next::FromOld(r),
                    _ = monoio::time::sleep_until((*until).into()) => Next::OldDone,
                },
                None => std::future::pending().await,
            }
        };
        let rebind = poll_fn(|cx| match Pin::new(&mut rebinds).poll_next(cx) {
            Poll::Ready(Some(l)) => Poll::Ready(l),
            // No more hand-offs: keep serving this listener.
            Poll::Ready(None) | Poll::Pending => Poll::Pending,
        });
        let next = monoio::select! {
            r = listener.accept() => Next::Accepted(r),
            l = rebind => Next::Rebind(l),
            n = linger => n,
            _ = draining.wait() => Next::Drain,
        };
        match next {
            Next::Accepted(Ok(accepted)) | Next::FromOld(Ok(accepted)) => on_accept(accepted),
            Next::Accepted(Err(e)) | Next::FromOld(Err(e)) => {
                failed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if let Some(suppressed) = log.take(Instant::now()) {
                    let hint = match e.raw_os_error() {
                        Some(libc::EMFILE) => {
                            "; the process is out of file descriptors: raise its limit (ulimit -Hn, LimitNOFILE=) or lower the edges' max_connections"
                        }
                        Some(libc::ENFILE) => {
                            "; the system is out of file descriptors (fs.file-max)"
                        }
                        _ => "",
                    };
                    tracing::warn!(shard, edge = what, error = %e, suppressed, "accept failed{hint}; retrying in 10 ms");
                }
                monoio::time::sleep(Duration::from_millis(10)).await;
            }
            Next::Rebind(l) => match TcpListener::from_std(l) {
                Ok(new) => {
                    match new.local_addr() {
                        Ok(addr) => {
                            tracing::info!(what, %addr, "listening on a new address after a reload")
                        }
                        Err(_) => tracing::info!(what, "listening on a new address after a reload"),
                    }
                    let prev = std::mem::replace(&mut listener, new);
                    old = Some((prev, Instant::now() + crate::shared::LISTENER_LINGER));
                }
                Err(e) => {
                    tracing::error!(what, error = %e, "cannot take a reload's new listener; keeping the old one")
                }
            },
            Next::OldDone => {
                if let Some((l, _)) = old.take() {
                    stop_listening(&l, what);
                }
            }
            Next::Drain => {
                stop_listening(&listener, what);
                if let Some((l, _)) = &old {
                    stop_listening(l, what);
                }
                return;
            }
        }
    }
}

/// Takes `listener` out of listening now, for the drain: `shutdown(2)` on a
/// listening socket closes it and fails the accept waiting on it. Dropping
/// the listener is not enough: the ring's accept, whose cancel monoio
/// queues but only submits at the ring's next entry, holds the socket open
/// until it completes. Meanwhile the kernel kept completing handshakes
/// into its backlog, which nobody read: new clients hung until the drain
/// deadline or the exit, instead of being refused and trying elsewhere.
fn stop_listening(listener: &TcpListener, what: &'static str) {
    use std::os::fd::{AsRawFd, BorrowedFd};
    // SAFETY: the fd is `listener`'s own, open for as long as the borrow.
    let fd = unsafe { BorrowedFd::borrow_raw(listener.as_raw_fd()) };
    if let Err(e) = socket2::SockRef::from(&fd).shutdown(std::net::Shutdown::Read) {
        tracing::debug!(what, error = %e, "cannot shut the listener down; it closes when dropped");
    }
}

/// After the drain deadline, how long a shard waits for the answers of the
/// calls it cut short (shutting-down errors) to be written before it exits.
const DRAIN_FLUSH_GRACE: Duration = Duration::from_secs(1);

/// Waits until `done()` holds, re-checking every 5 ms, or until `latch` is
/// set. Used only at shutdown.
pub(crate) async fn poll_until(latch: &Latch, done: impl Fn() -> bool) {
    while !done() && !latch.is_set() {
        monoio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Drops the instances of sessions idle past their router's
/// `session_idle_timeout`, checking a few times per timeout (so an
/// abandoned session holds its instance at most a quarter of the timeout
/// too long), and the retired pools whose last call ended, at least once a
/// second. The routers (and so the timeouts) change with reloads: each
/// round reads them again.
async fn housekeeping(ctx: Rc<ShardCtx>) {
    loop {
        let every = ctx
            .pools
            .borrow()
            .iter()
            .filter_map(|p| p.session_idle_timeout())
            .min()
            .map_or(Duration::from_secs(1), |t| {
                (t / 4).clamp(Duration::from_millis(10), Duration::from_secs(1))
            });
        monoio::time::sleep(every).await;
        let now = Instant::now();
        let mut pools = ctx.pools.borrow_mut();
        for pool in pools.iter() {
            pool.expire_sessions(now);
        }
        pools.sweep();
    }
}

/// Makes and warms a reload's new pools, then installs them (all or none)
/// and answers the `routing` thread.
async fn add_pools(ctx: Rc<ShardCtx>, add: crate::shared::AddPools) {
    let mut made = Vec::with_capacity(add.pools.len());
    for (uid, slot, router) in add.pools {
        let pool = RouterPool::new(router);
        if let Err(e) = pool.warm().await {
            let _ = add.reply.send(Err(format!(
                "shard {}: router `{}`: {e}",
                ctx.index,
                pool.router().spec().name
            )));
            return;
        }
        made.push((uid, slot, pool));
    }
    let mut pools = ctx.pools.borrow_mut();
    for (uid, slot, pool) in made {
        pools.insert(uid, slot, pool);
    }
    drop(pools);
    let _ = add.reply.send(Ok(()));
}

/// Empties the shard's inbox: hand-offs from other shards and the gRPC edge
/// (its calls, this shard's own included), and drain control.
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
                        live,
                        edge_deadline,
                    } = job;
                    let live = live.map(SentLive);
                    let started = Instant::now();
                    // Recorded by the shard it came from when forwarded.
                    let who = if forwarded {
                        metrics::record::Attribution::BROKER
                    } else {
                        metrics::record::attribute(&shard.ctx, &req)
                    };
                    let stats = shard.stats();
                    // A frame connection's request counts in flight on its
                    // connection's shard, which counted it before the hand-off.
                    if !forwarded {
                        ShardStats::add(&stats.in_flight, 1);
                    }
                    let mut args = Vec::new();
                    let mut out = Vec::new();
                    // A panic in the handler fails this request, not the
                    // shard. A caller that gave up (gRPC call cancelled,
                    // frame connection gone) drops the handling, which drops
                    // a lease mid-call and so discards the instance and stops
                    // its guest, instead of running it to its deadline for an
                    // answer nobody reads. The caller is asked first: a job
                    // that waited in the inbox past its caller (a busy owner
                    // shard, the gRPC edge's deadline) is not run at all, and
                    // once the edge has answered DEADLINE_EXCEEDED, an answer
                    // ready in the same turn is not the one the client got.
                    let ran = {
                        let mut run = Box::pin(Some(run_or_expire(
                            &shard,
                            &req,
                            &mut args,
                            &mut out,
                            live.as_ref().map(|l| l as &dyn crate::dispatch::LiveOut),
                        )));
                        let ran = monoio::select! {
                            biased;
                            _ = reply.cancellation() => None,
                            r = poll_fn(|cx| {
                                let fut = run.as_mut().as_pin_mut().expect("polled until ready");
                                match std::panic::catch_unwind(AssertUnwindSafe(|| fut.poll(cx))) {
                                    Ok(p) => p.map(|()| Ok(())),
                                    Err(payload) => Poll::Ready(Err(Panicked::from(payload))),
                                }
                            }) => Some(r),
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
                    // What the client got: the edge's DEADLINE_EXCEEDED if
                    // its timer claimed the call first, even if the call
                    // finished meanwhile; else this answer, which the edge
                    // then waits for.
                    let edge_answered = match &edge_deadline {
                        Some(d) if answered => !d.claim_answer(),
                        Some(d) => d.fired(),
                        None => false,
                    };
                    if !forwarded {
                        if edge_answered {
                            record_edge_deadline(&shard.ctx, &req, who, arrived, started);
                        } else if answered {
                            let _ended = metrics::record::request(
                                &shard.ctx,
                                metrics::Edge::Grpc,
                                &req,
                                who,
                                arrived,
                                arrived,
                                started,
                                &out,
                            );
                        }
                    }
                    if !forwarded {
                        ShardStats::sub(&stats.in_flight, 1);
                    }
                    if answered {
                        let _ = reply.send(out);
                    }
                });
            }
            ShardMsg::Snapshot(req) => metrics::record::answer_snapshot(&shard.ctx, req),
            ShardMsg::ListChanged(kinds) => tell_list_changed(&shard, kinds),
            ShardMsg::ResourceUpdated(uri, scope) => tell_resource_updated(&shard, &uri, &scope),
            ShardMsg::AddPools(add) => {
                monoio::spawn(add_pools(shard.ctx.clone(), add));
            }
            ShardMsg::Listen { frames, http, grpc } => {
                for (l, to) in [
                    (frames, &shard.rebind_frames),
                    (http, &shard.rebind_http),
                    (grpc, &shard.rebind_grpc),
                ] {
                    if let Some(l) = l {
                        let _ = to.unbounded_send(l);
                    }
                }
            }
            ShardMsg::DropPools(uids) => {
                let mut pools = shard.ctx.pools.borrow_mut();
                for uid in uids {
                    pools.retire(uid);
                }
            }
            ShardMsg::Drain => shard.draining.set(),
            ShardMsg::DrainExpired => {
                shard.draining.set();
                shard.drain_expired.set();
            }
        }
    }
}

/// Sends a `ListChangedNotification` frame to every frame connection of
/// this shard that initialized, forgetting those that closed.
fn tell_list_changed(shard: &Shard, kinds: crate::shared::ListKinds) {
    use mcp_schema::fb::protocol as p;
    let frame = {
        let mut enc = shard.ctx.enc.borrow_mut();
        let fbb = enc.begin();
        let n = p::ListChangedNotification::create(
            fbb,
            &p::ListChangedNotificationArgs {
                tools: kinds.tools,
                resources: kinds.resources,
                prompts: kinds.prompts,
            },
        );
        unsolicited(
            &mut enc,
            p::ResponsePayload::ListChangedNotification,
            n.as_union_value(),
        )
    };
    shard
        .list_listeners
        .borrow_mut()
        .retain(|l| match l.upgrade() {
            Some(conn) => {
                if conn.hears_unasked() {
                    conn.frame(&frame);
                }
                true
            }
            None => false,
        });
}

/// Finishes a notification the broker sends unasked (a list change, a
/// resource update): its correlation id is empty, which no request's is.
fn unsolicited(
    enc: &mut mcp_schema::ResponseEncoder,
    kind: mcp_schema::fb::protocol::ResponsePayload,
    payload: flatbuffers::WIPOffset<flatbuffers::UnionWIPOffset>,
) -> Vec<u8> {
    let to = mcp_schema::encode::ReplyTo {
        correlation: mcp_schema::encode::Correlation::Text(""),
        session_id: None,
    };
    enc.finish(&to, kind, payload, true).to_vec()
}

/// A frame connection's subscription.
pub(crate) struct ResourceSub {
    pub uri: Box<str>,
    /// The session key of the subscribe request
    /// (`VerifiedRequest::session_key`): whose updates it sees.
    pub session: Option<Box<str>>,
    pub conn: std::rc::Weak<dyn crate::dispatch::LiveOut>,
}

/// Sends a `ResourceUpdatedNotification` frame (with an empty correlation
/// id, as list changes have) to every frame connection of this shard
/// subscribed to `uri` that `scope` reaches, once each, forgetting the
/// subscriptions of closed ones.
fn tell_resource_updated(shard: &Shard, uri: &str, scope: &crate::shared::UpdateScope) {
    use mcp_schema::fb::protocol as p;
    let mut frame = None;
    let mut closed = Vec::new();
    // A connection subscribed in several sessions is told once: the
    // notification names no session, and a router whose instances are
    // shared reaches all of them (three identical frames a write, the
    // verification audit).
    let mut told: Vec<*const ()> = Vec::new();
    shard.resource_subs.borrow_mut().retain(|sub| {
        let ResourceSub {
            uri: u,
            session,
            conn: l,
        } = sub;
        if &**u != uri || !scope.reaches(session.as_deref()) {
            return true;
        }
        let Some(conn) = l.upgrade() else {
            closed.push(u.clone());
            return false;
        };
        let at = std::rc::Rc::as_ptr(&conn) as *const ();
        if !conn.hears_unasked() || told.contains(&at) {
            return true;
        }
        told.push(at);
        let f = frame.get_or_insert_with(|| {
            let mut enc = shard.ctx.enc.borrow_mut();
            let fbb = enc.begin();
            let uri = fbb.create_string(uri);
            let n = p::ResourceUpdatedNotification::create(
                fbb,
                &p::ResourceUpdatedNotificationArgs { uri: Some(uri) },
            );
            unsolicited(
                &mut enc,
                p::ResponsePayload::ResourceUpdatedNotification,
                n.as_union_value(),
            )
        });
        conn.frame(f);
        true
    });
    // A connection forgets its own when it closes (`frames.rs`); these are
    // only a safety net.
    for u in closed {
        shard
            .ctx
            .shared
            .frame_subscriptions
            .remove(&u, shard.ctx.index);
    }
}

/// A handed-over request's live channel (`Job::live`) as the dispatcher
/// takes it.
struct SentLive(crate::shared::LiveSender);

impl crate::dispatch::LiveOut for SentLive {
    fn frame(&self, frame: &[u8]) {
        (self.0)(frame);
    }
}

/// Handles a request unless the drain deadline passes first, in which case
/// it is answered with a shutting-down error (exactly one answer either way).
async fn run_or_expire(
    shard: &Rc<Shard>,
    req: &VerifiedRequest,
    args: &mut Vec<u8>,
    out: &mut Vec<u8>,
    live: Option<&dyn crate::dispatch::LiveOut>,
) {
    let start = out.len();
    let finished = monoio::select! {
        _ = crate::dispatch::handle_live(&shard.ctx, req, args, out, live) => true,
        _ = shard.drain_expired.wait() => false,
    };
    if !finished {
        out.truncate(start);
        drain_deadline_answer(&shard.ctx, req, out);
    }
}

/// Appends to `out` the answer of a call still running at the drain
/// deadline (-32004), which every edge gives.
pub(crate) fn drain_deadline_answer(ctx: &ShardCtx, req: &VerifiedRequest, out: &mut Vec<u8>) {
    let to = req.view().reply_to();
    out.extend_from_slice(ctx.enc.borrow_mut().error(
        &to,
        mcp_schema::ErrorCode::ShuttingDown,
        "drain deadline passed before the call finished",
        None,
    ));
}

/// A caught panic of a request's handler, with its message.
pub(crate) struct Panicked(pub String);

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

/// Drops a request's future, which may itself panic (its state is whatever
/// the handler left); such a future is leaked rather than kill the shard.
pub(crate) fn drop_future<F>(fut: &mut Pin<Box<Option<F>>>) {
    let old = std::mem::replace(fut, Box::pin(None));
    if std::panic::catch_unwind(AssertUnwindSafe(move || drop(old))).is_err() {
        tracing::error!("a request's future panicked while being dropped");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_connection_log_allows_a_burst_then_ten_a_second_and_counts_the_rest() {
        let b = LogBudget::default();
        let t0 = Instant::now();
        for _ in 0..20 {
            assert_eq!(b.take(t0), Some(0));
        }
        for _ in 0..5 {
            assert_eq!(b.take(t0), None);
        }
        // A tenth of a second later, one more line, which tells of the five.
        let t1 = t0 + Duration::from_millis(100);
        assert_eq!(b.take(t1), Some(5));
        assert_eq!(b.take(t1), None);
        // Quiet for long: the burst again, not more.
        let t2 = t1 + Duration::from_secs(60);
        assert_eq!(b.take(t2), Some(1));
        for _ in 0..19 {
            assert_eq!(b.take(t2), Some(0));
        }
        assert_eq!(b.take(t2), None);
    }
    use std::io::Write;

    /// Yields of a computing task until a read pending on the shard's ring
    /// (data sent after the read was armed) is answered; `Some(None)` if it
    /// is not within 50, `None` where the kernel has no `DEFER_TASKRUN`.
    /// The reader hands the answer through `hops` more tasks, each woken by
    /// the one before (a gRPC request: connection, stream, connection).
    fn yields_until_read(
        yield_once: impl AsyncFn(&YieldQueue) + 'static,
        hops: usize,
    ) -> Option<Option<usize>> {
        let mut rt = build_runtime(Ring::Defer)
            .inspect_err(|e| eprintln!("skipped: no DEFER_TASKRUN ring here ({e})"))
            .ok()?;
        Some(rt.block_on(async move {
            let yields = Rc::new(YieldQueue::default());
            monoio::spawn({
                let yields = yields.clone();
                async move { yields.run().await }
            });
            let (ours, mut theirs) = std::os::unix::net::UnixStream::pair().unwrap();
            let ours = monoio::net::UnixStream::from_std(ours).unwrap();
            let read = Rc::new(Cell::new(false));
            let mut next = Rc::new(crate::local::Notify::default());
            let first = next.clone();
            for _ in 0..hops {
                let (this, after) = (next, Rc::new(crate::local::Notify::default()));
                next = after.clone();
                monoio::spawn(async move {
                    this.wait().await;
                    after.notify();
                });
            }
            monoio::spawn({
                let read = read.clone();
                async move {
                    next.wait().await;
                    read.set(true);
                }
            });
            monoio::spawn(async move {
                use monoio::io::AsyncReadRent;
                let mut ours = ours;
                let (r, _) = ours.read(vec![0u8; 8]).await;
                assert_eq!(r.unwrap(), 1);
                first.notify();
            });
            // The reader's receive goes to the kernel, finds nothing, waits.
            yields.yield_now().await;
            let _ = monoio::net::unix::UnixDatagram::unbound()
                .unwrap()
                .writable(true)
                .await;
            assert!(!read.get());
            // The guest: computes, and yields between slices.
            theirs.write_all(b"x").unwrap();
            for n in 1..=50 {
                std::thread::sleep(Duration::from_micros(200));
                yield_once(&yields).await;
                if read.get() {
                    return Some(n);
                }
            }
            None
        }))
    }

    #[test]
    fn a_yield_through_the_ring_lets_a_pending_read_in() {
        // The read's answer goes through two more tasks, as a gRPC request
        // does (connection, stream, connection): with one round of the
        // shard's tasks it came a yield late.
        let poke = std::cell::OnceCell::new();
        let Some(n) = yields_until_read(
            async move |yields: &YieldQueue| {
                let poke = poke.get_or_init(|| monoio::net::unix::UnixDatagram::unbound().unwrap());
                yield_through_ring(Some(poke), yields).await
            },
            2,
        ) else {
            return;
        };
        assert_eq!(n, Some(1), "the read came in after {n:?} yields");
    }

    #[test]
    fn a_stream_of_wakes_from_another_thread_does_not_starve_a_pending_read() {
        // A task woken from another thread makes monoio skip its wait in the
        // kernel when the wake is there before it looks. A task woken that
        // way over and over (a wake 1 µs after each re-arm, as from a busy
        // inbox or upstream) still leaves the shard waiting often enough:
        // 11–30 µs here, where a guest's old yield starved reads for its
        // whole call (bench/NOTES.md, "a computing guest held its shard's
        // sockets").
        let Ok(mut rt) = build_runtime(Ring::Defer) else {
            return;
        };
        let waited = rt.block_on(async {
            let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            let (tx, rx) = std::sync::mpsc::channel::<std::task::Waker>();
            let waking = std::thread::spawn({
                let stop = stop.clone();
                move || {
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        if let Ok(w) = rx.recv_timeout(Duration::from_millis(10)) {
                            // A spin: a sleep this short would take ~50 µs.
                            let t = Instant::now();
                            while t.elapsed() < Duration::from_micros(1) {}
                            w.wake();
                        }
                    }
                }
            });
            monoio::spawn(async move {
                loop {
                    let mut armed = false;
                    std::future::poll_fn(|cx| {
                        if std::mem::replace(&mut armed, true) {
                            return Poll::Ready(());
                        }
                        let _ = tx.send(cx.waker().clone());
                        Poll::Pending
                    })
                    .await;
                }
            });
            let (ours, mut theirs) = std::os::unix::net::UnixStream::pair().unwrap();
            let mut ours = monoio::net::UnixStream::from_std(ours).unwrap();
            let read = monoio::spawn(async move {
                use monoio::io::AsyncReadRent;
                let (r, _) = ours.read(vec![0u8; 8]).await;
                r.map(|_| Instant::now())
            });
            // The read goes to the kernel and waits there.
            monoio::time::sleep(Duration::from_millis(2)).await;
            let sent = Instant::now();
            theirs.write_all(b"x").unwrap();
            let got = monoio::time::timeout(Duration::from_secs(2), read).await;
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            waking.join().unwrap();
            got.map(|r| r.unwrap() - sent)
        });
        let waited = waited.expect("the read was never answered in 2 s");
        assert!(
            // The margin absorbs a loaded CI machine.
            waited < Duration::from_millis(200),
            "the read waited {waited:?}"
        );
    }

    #[test]
    fn a_yield_woken_from_another_thread_does_not() {
        // What guests did before `guest_yield`, at its worst: the wake
        // arrives before the shard looks for one, so monoio submits
        // without waiting and the DEFER_TASKRUN ring posts nothing.
        let Some(n) = yields_until_read(
            async |_: &YieldQueue| {
                let mut woken = false;
                std::future::poll_fn(|cx| {
                    if std::mem::replace(&mut woken, true) {
                        return Poll::Ready(());
                    }
                    let waker = cx.waker().clone();
                    std::thread::spawn(move || waker.wake()).join().unwrap();
                    Poll::Pending
                })
                .await
            },
            0,
        ) else {
            return;
        };
        assert_eq!(n, None, "the read came in after {n:?} yields");
    }

    #[test]
    fn a_yield_to_the_shards_tasks_alone_does_not_either() {
        // The other tasks run, but monoio only submits while one is
        // runnable: the ring is never waited on.
        let Some(n) = yields_until_read(async |yields: &YieldQueue| yields.yield_now().await, 0)
        else {
            return;
        };
        assert_eq!(n, None, "the read came in after {n:?} yields");
    }
}
