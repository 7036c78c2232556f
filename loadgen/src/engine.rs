//! The run: worker threads, each an async runtime (monoio for frames, tokio
//! for gRPC: see `rt.rs`) owning its connections,
//! the shared start line, the stop rules, and the per-second intervals sent
//! to the main thread.
//!
//! Phases of one run, as every worker sees them:
//!
//! ```text
//! connect all ─▶ barrier (start line) ─▶ warmup ─▶ measured ─▶ send end ─▶ drain ─▶ report
//!                                         (not recorded)          (no new requests; wait for
//!                                                                  outstanding, up to --drain)
//! ```
//!
//! # Invariants
//! - Connection and measurement state never leaves its worker thread (`Rc`,
//!   `RefCell`, `Cell`); threads share only the abort flag, the first failure
//!   message and the interval channel, none of them on the per-request path.
//! - A request is measured iff its intended send time lies at or after the
//!   end of the warmup; everything about it (latency, outcome) is then
//!   recorded, whenever the response comes.
//! - Each request ends exactly once: success, an error response, a kind
//!   mismatch, a timeout, or its connection failing.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Barrier, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use hdrhistogram::Histogram;
use mcp_schema::fb::protocol::ResponsePayload;

use crate::notify::{Either, Notify, Signal, race};
use crate::rt::Runtime;
use crate::schedule::Schedule;
use crate::stats::{self, Counts, ErrorKind, ThreadStats};
use crate::target::Target;
use crate::workload::{Generator, Workload};

/// How often workers report an interval (progress line, `--hlog`).
pub const INTERVAL: Duration = Duration::from_secs(1);

/// How often a worker checks for abort, timeouts and the end of its drain:
/// bounds how late a stop is noticed without waking threads needlessly.
const TICK: Duration = Duration::from_millis(20);

/// A connection that does not complete its handshake in this time counts as
/// refused: a load test against an unreachable host should fail fast.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long past the end of the send phase requests due before it may
/// still be written ([`Pacer::step`]): a writer woken a little late.
/// Without the bound, a pipelined HTTP run at 3x a server's capacity went
/// on sending its whole backlog after the end (a `--duration 5s` run took
/// 15 s), since each answer made room in the window for another.
const CATCH_UP: Duration = Duration::from_millis(100);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// `--concurrency N`: N requests in flight, each sent when one ends;
    /// latency from the actual send.
    Closed,
    /// `--rate R`: requests sent on a schedule whatever the responses do;
    /// latency from the intended send time.
    Open,
    /// `--rate R --concurrency N`: the schedule, with at most N in flight;
    /// a request held back by the window is still measured from its
    /// intended time (wrk2's model).
    RateLimited,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Closed => "closed",
            Mode::Open => "open",
            Mode::RateLimited => "rate_limited_closed",
        }
    }
}

/// Everything a run needs, validated.
#[derive(Debug)]
pub struct RunConfig {
    pub target: Target,
    pub workload: Arc<Workload>,
    pub threads: usize,
    pub cpus: Option<Vec<usize>>,
    pub connections: usize,
    /// Total in flight (closed / rate-limited), split over connections.
    pub concurrency: Option<u64>,
    /// Requests per second over all connections.
    pub rate: Option<f64>,
    pub ramp: Duration,
    /// Length of the measured phase (after the warmup). `None` with
    /// `requests` set: until that many are sent.
    pub duration: Option<Duration>,
    /// Total requests to send (warmup included), split over connections.
    pub requests: Option<u64>,
    pub warmup: Duration,
    pub timeout: Duration,
    pub drain: Duration,
    /// How long before a scheduled send the writer stops trusting the
    /// millisecond timer and yields until the exact time.
    pub spin: Duration,
    pub max_frame: u32,
    pub seed: u64,
    /// `--bearer-file`'s token (trimmed): HTTP `Authorization` on every
    /// request, gRPC `authorization` metadata on every call, the frame
    /// connections' `InitializeRequest`.
    pub bearer: Option<String>,
    /// TLS targets: the run's one client configuration.
    pub tls: Option<Arc<crate::tls::TlsClient>>,
    /// http://: the MCP revision spoken (`--mcp-version`).
    pub mcp_version: String,
}

impl RunConfig {
    pub fn mode(&self) -> Mode {
        match (self.rate, self.concurrency) {
            (Some(_), Some(_)) => Mode::RateLimited,
            (Some(_), None) => Mode::Open,
            (None, _) => Mode::Closed,
        }
    }

    /// The per-connection plan of connection `i`.
    fn plan(&self, i: usize) -> ConnPlan {
        let c = self.connections as u64;
        let share = |total: u64| total / c + u64::from((i as u64) < total % c);
        ConnPlan {
            window: self.concurrency.map_or(u64::MAX, share),
            rate: self.rate.map(|r| r / self.connections as f64),
            phase: i as f64 / self.connections as f64,
            quota: self.requests.map_or(u64::MAX, share),
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub struct ConnPlan {
    /// Most requests in flight at once (`u64::MAX`: no limit).
    pub window: u64,
    /// Requests per second of this connection (`None`: closed loop).
    pub rate: Option<f64>,
    pub phase: f64,
    /// Most requests this connection sends.
    pub quota: u64,
}

/// What threads share: the stop flag and the first failure.
#[derive(Debug, Default)]
pub struct Shared {
    abort: AtomicBool,
    interrupted: AtomicBool,
    failure: Mutex<Option<String>>,
    start: OnceLock<(Instant, SystemTime)>,
}

impl Shared {
    /// Records `msg` if it is the first failure, and stops every thread.
    pub fn fail(&self, msg: String) {
        if let Ok(mut f) = self.failure.lock() {
            f.get_or_insert(msg);
        }
        self.abort.store(true, Ordering::Release);
    }

    /// Ctrl-C: records why the run ends early without stopping it at once
    /// (the send phase ends; outstanding responses still drain).
    pub fn interrupt(&self) {
        if let Ok(mut f) = self.failure.lock() {
            f.get_or_insert_with(|| {
                "interrupted (Ctrl-C): sending stopped early, results cover the run until then"
                    .into()
            });
        }
        self.interrupted.store(true, Ordering::Release);
    }

    pub fn interrupted(&self) -> bool {
        self.interrupted.load(Ordering::Acquire)
    }

    pub fn aborted(&self) -> bool {
        self.abort.load(Ordering::Acquire)
    }

    pub fn start_time(&self) -> Option<SystemTime> {
        self.start.get().map(|s| s.1)
    }

    pub fn failure(&self) -> Option<String> {
        self.failure.lock().ok().and_then(|f| f.clone())
    }
}

/// Sent to the main thread once per interval and when a worker ends.
#[derive(Debug)]
pub enum Msg {
    Interval(Box<IntervalReport>),
    /// The worker ended: it sends no more intervals.
    Done {
        thread: usize,
    },
}

#[derive(Debug)]
pub struct IntervalReport {
    pub thread: usize,
    pub index: u64,
    /// Measured responses of the interval.
    pub latency: Histogram<u64>,
    pub counts: Counts,
    /// Successful responses during the warmup (not measured).
    pub warmup_ok: u64,
}

/// Hashes the per-connection sequence numbers used as map keys: they are
/// already distinct, so a multiply spreads them with no hashing cost.
#[derive(Default)]
pub struct SeqHasher(u64);

impl Hasher for SeqHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 << 8 | *b as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

/// A request waiting for its final response.
#[derive(Clone, Copy, Debug)]
pub struct Pending {
    /// Intended send time (open loop) or actual send time (closed loop).
    pub start: Instant,
    pub measured: bool,
    pub expect: ResponsePayload,
}

/// Timed-out requests a connection remembers, so that their answers are
/// told from answers nobody asked for. Per connection: a bound on memory
/// when a server stops answering altogether.
pub const LATE_MEMORY: usize = 4096;
/// How long a timed-out request is remembered: an answer later than this
/// after its timeout counts as an unknown correlation.
pub const LATE_MEMORY_AGE: Duration = Duration::from_secs(60);

/// Requests of one connection that ended as timeouts, for a bounded count
/// and time: an answer that arrives after its request's `--timeout` is
/// counted as late, not a second time as an unknown correlation.
#[derive(Default)]
pub struct TimedOut {
    /// Sequence number → whether the request was measured.
    ids: HashMap<u64, bool, BuildHasherDefault<SeqHasher>>,
    /// Insertion order with the time of the timeout, to forget the oldest.
    order: VecDeque<(u64, Instant)>,
}

impl TimedOut {
    pub fn insert(&mut self, seq: u64, measured: bool, now: Instant) {
        if self.order.len() >= LATE_MEMORY
            && let Some((old, _)) = self.order.pop_front()
        {
            self.ids.remove(&old);
        }
        self.order.push_back((seq, now));
        self.ids.insert(seq, measured);
    }

    /// Forgets requests that timed out before `before`.
    pub fn forget_before(&mut self, before: Instant) {
        while let Some(&(seq, at)) = self.order.front() {
            if at >= before {
                break;
            }
            self.order.pop_front();
            self.ids.remove(&seq);
        }
    }

    /// Whether `seq` timed out (and was measured), forgetting it: its
    /// final answer is counted once.
    pub fn take(&mut self, seq: u64) -> Option<bool> {
        // Its `order` entry stays until it ages out or is pushed out;
        // removing an absent id then is harmless, and sequence numbers
        // are never reused.
        self.ids.remove(&seq)
    }

    pub fn contains(&self, seq: u64) -> bool {
        self.ids.contains_key(&seq)
    }
}

/// The state of one connection, shared by its writer and reader tasks.
pub struct ConnCtx {
    pub index: usize,
    pub plan: ConnPlan,
    pub outstanding: RefCell<HashMap<u64, Pending, BuildHasherDefault<SeqHasher>>>,
    /// Requests that ended as timeouts, whose answers may still come.
    pub timed_out: RefCell<TimedOut>,
    /// The writer will send nothing more.
    pub sending_done: Cell<bool>,
    /// Wakes the writer: a slot in its window freed up, or it must stop.
    pub writer_wake: Notify,
    /// Tells the reader to stop reading now.
    pub reader_stop: Signal,
    pub finished: Cell<bool>,
    /// Its outstanding requests were ended for good (the connection failed,
    /// or the run stopped): answers its reader still finds, already read
    /// from the socket or racing the stop, belong to requests counted, and
    /// are neither answers nor strays.
    pub given_up: Cell<bool>,
    /// When an end last freed a slot of a full window. A request due
    /// before then waited for the server's answers, not for the generator:
    /// [`ThreadCtx::on_sent`] counts its lag from here.
    pub reopened: Cell<Option<Instant>>,
}

impl ConnCtx {
    /// Requests ended at `at`; `was_full`: the window was full before they
    /// did. Every place that takes requests out of `outstanding` calls it.
    pub fn ended(&self, was_full: bool, at: Instant) {
        if was_full {
            self.reopened.set(Some(at));
        }
    }

    /// Whether the window is full (before an end, for [`Self::ended`]).
    pub fn window_full(&self) -> bool {
        self.outstanding.borrow().len() as u64 >= self.plan.window
    }
}

/// The state of one worker thread.
pub struct ThreadCtx {
    pub cfg: Arc<RunConfig>,
    pub shared: Arc<Shared>,
    pub start: Instant,
    pub measure_start: Instant,
    /// When sending ends: the end of `--duration`, or earlier on Ctrl-C.
    send_end: Cell<Option<Instant>>,
    /// Everything stops now (abort, or the drain ran out).
    pub stop: Cell<bool>,
    /// Open loop: what the connections' senders wait on for their
    /// scheduled times (`alarm.rs`).
    pub clock: Rc<crate::alarm::AlarmClock>,
    totals: RefCell<ThreadStats>,
    interval: RefCell<(Histogram<u64>, Counts, u64)>,
}

impl ThreadCtx {
    pub fn measured(&self, t: Instant) -> bool {
        t >= self.measure_start
    }

    /// When the send phase ends (`None`: only the request quota ends it).
    pub fn send_end(&self) -> Option<Instant> {
        self.send_end.get()
    }

    /// Whether no request may be sent any more at `now`.
    pub fn send_over(&self, now: Instant) -> bool {
        self.send_end.get().is_some_and(|e| now >= e)
    }

    /// A request was written. `intended` is its scheduled time; `ready`,
    /// from when the window let it go (its intended time unless the window
    /// was full then): the lag from `ready` on is the generator's own.
    pub fn on_sent(&self, intended: Instant, ready: Instant, now: Instant, scheduled: bool) {
        if self.measured(intended) {
            let mut i = self.interval.borrow_mut();
            i.1.sent += 1;
            i.1.intended += 1;
            if scheduled {
                let lag = |from: Instant| now.saturating_duration_since(from).as_micros() as u64;
                let mut t = self.totals.borrow_mut();
                stats::record(&mut t.send_lag, lag(intended));
                stats::record(&mut t.own_lag, lag(ready.max(intended)));
            }
        }
        let mut t = self.totals.borrow_mut();
        t.last_send = t.last_send.max(now.saturating_duration_since(self.start));
        t.sent_all += 1;
    }

    /// Requests the schedule asked for but that were never sent.
    pub fn on_unsent(&self, n: u64) {
        self.interval.borrow_mut().1.intended += n;
    }

    /// A request ended.
    pub fn on_end(&self, p: &Pending, now: Instant, outcome: Result<(), (ErrorKind, Option<i32>)>) {
        {
            let mut t = self.totals.borrow_mut();
            if outcome.is_ok() || matches!(outcome, Err((k, _)) if k.is_answer()) {
                t.last_response = t
                    .last_response
                    .max(now.saturating_duration_since(self.start));
            }
        }
        let mut i = self.interval.borrow_mut();
        if !p.measured {
            i.2 += u64::from(outcome.is_ok());
            return;
        }
        match outcome {
            Ok(()) => {
                let us = now.saturating_duration_since(p.start).as_micros() as u64;
                stats::record(&mut i.0, us);
                i.1.ok += 1;
            }
            Err((kind, code)) => {
                i.1.error(kind);
                if let Some(code) = code {
                    let codes = match kind {
                        ErrorKind::GrpcStatus => &mut i.1.grpc_codes,
                        ErrorKind::HttpStatus => &mut i.1.http_statuses,
                        _ => &mut i.1.error_codes,
                    };
                    *codes.entry(code).or_default() += 1;
                }
            }
        }
    }

    /// The final answer of a request that had already timed out: counted
    /// as late (its timeout is its outcome), not as an error.
    pub fn on_late(&self, measured: bool) {
        if measured {
            self.interval.borrow_mut().1.late += 1;
        }
    }

    /// A final answer for no outstanding request of `cc`: late when its
    /// request timed out, else a stray frame (unknown correlation).
    pub fn on_unmatched(&self, cc: &ConnCtx, seq: u64, now: Instant) {
        if cc.given_up.get() {
            return;
        }
        match cc.timed_out.borrow_mut().take(seq) {
            Some(measured) => self.on_late(measured),
            None => self.on_stray(ErrorKind::UnknownCorrelation, now),
        }
    }

    /// A frame that belongs to no request.
    pub fn on_stray(&self, kind: ErrorKind, now: Instant) {
        if self.measured(now) {
            self.interval.borrow_mut().1.error(kind);
        }
    }

    pub fn on_progress(&self) {
        self.interval.borrow_mut().1.progress_frames += 1;
    }

    /// The connection failed: its outstanding requests end as lost and the
    /// whole run stops (its results would no longer mean what they say).
    pub fn conn_failed(&self, conn: &ConnCtx, msg: String) {
        let now = Instant::now();
        conn.given_up.set(true);
        let lost: Vec<Pending> = conn
            .outstanding
            .borrow_mut()
            .drain()
            .map(|(_, p)| p)
            .collect();
        let msg = if lost.is_empty() {
            msg
        } else {
            format!("{msg} ({} requests outstanding)", lost.len())
        };
        for p in &lost {
            self.on_end(p, now, Err((ErrorKind::ConnectionLost, None)));
        }
        self.shared.fail(msg);
    }

    /// Takes the interval so far, folding it into the totals.
    fn take_interval(&self, thread: usize, index: u64) -> IntervalReport {
        let mut i = self.interval.borrow_mut();
        let latency = std::mem::replace(&mut i.0, stats::new_histogram());
        let counts = std::mem::take(&mut i.1);
        let warmup_ok = std::mem::take(&mut i.2);
        let mut t = self.totals.borrow_mut();
        let _ = t.latency.add(&latency);
        t.counts.merge(&counts);
        IntervalReport {
            thread,
            index,
            latency,
            counts,
            warmup_ok,
        }
    }
}

/// A target protocol: how to open a connection and drive it. The engine
/// owns threads, the schedule, the stop rules and the measurement; a driver
/// owns the wire.
pub trait Driver: Clone + 'static {
    /// The runtime each worker thread runs this driver's connections on.
    type Rt: Runtime;
    type Conn: 'static;
    /// Opens one connection (before the start line).
    async fn connect(&self, addr: SocketAddr) -> std::io::Result<Self::Conn>;
    /// Sends and receives on `conn` by its plan until it is done, the run
    /// stops or the connection fails (reported with
    /// [`ThreadCtx::conn_failed`]). Sets `cc.finished` when it returns.
    async fn drive(&self, conn: Self::Conn, ctx: Rc<ThreadCtx>, cc: Rc<ConnCtx>);
}

/// What the run produced, whatever happened.
#[derive(Debug)]
pub struct Outcome {
    pub stats: ThreadStats,
    pub failure: Option<String>,
    pub started: Option<SystemTime>,
    /// Whether the io_uring driver was used (else epoll).
    pub io_uring: bool,
}

/// Runs the whole load on `cfg.threads` worker threads.
pub fn run<D: Driver + Send>(
    cfg: Arc<RunConfig>,
    driver: D,
    tx: Sender<Msg>,
    shared: Arc<Shared>,
) -> Outcome {
    let barrier = Arc::new(Barrier::new(cfg.threads));
    let mut handles = Vec::new();
    for t in 0..cfg.threads {
        let (cfg, driver, wtx, wshared, barrier) = (
            Arc::clone(&cfg),
            driver.clone(),
            tx.clone(),
            Arc::clone(&shared),
            Arc::clone(&barrier),
        );
        let spawned = std::thread::Builder::new()
            .name(format!("loadgen-{t}"))
            .spawn(move || {
                let stats = worker(t, &cfg, driver, &wtx, &wshared, &barrier);
                let _ = wtx.send(Msg::Done { thread: t });
                stats
            });
        match spawned {
            Ok(h) => handles.push(h),
            Err(e) => {
                // The barrier would never fill: nothing can run.
                shared.fail(format!("cannot start worker thread: {e}"));
                return Outcome {
                    stats: ThreadStats::default(),
                    failure: shared.failure(),
                    started: None,
                    io_uring: false,
                };
            }
        }
    }
    drop(tx);
    let stop = Arc::new(AtomicBool::new(false));
    let meter = matches!(cfg.mode(), Mode::Open | Mode::RateLimited)
        .then(|| {
            let (stop, shared) = (Arc::clone(&stop), Arc::clone(&shared));
            let (warmup, duration) = (cfg.warmup, cfg.duration);
            std::thread::Builder::new()
                .name("loadgen-stalls".into())
                .spawn(move || measure_stalls(&stop, &shared, warmup, duration))
                .ok()
        })
        .flatten();
    let mut total = ThreadStats::default();
    for h in handles {
        match h.join() {
            Ok(s) => total.merge(&s),
            Err(_) => shared.fail("a worker thread panicked".into()),
        }
    }
    stop.store(true, Ordering::Release);
    if let Some(Ok(stalls)) = meter.map(std::thread::JoinHandle::join) {
        total.stalls = stalls;
    }
    Outcome {
        stats: total,
        failure: shared.failure(),
        started: shared.start.get().map(|s| s.1),
        io_uring: D::Rt::io_uring(),
    }
}

/// The process's stalls over the measured send phase (after `warmup`, for
/// `duration` when the run has one, and until `stop`), in µs: how
/// late a 1 ms sleep woke, each time (jHiccup's method), when the process
/// hardly ran meanwhile. A stall of the whole generator (descheduled,
/// SIGSTOP, starved of CPU) holds its answers unread and its sends back,
/// and the open-loop verdict must not then blame the server (`report.rs`);
/// the workers cannot see it in their own turns, since they are stalled
/// too, and a worker waiting for I/O counts no turn at all. A sleep that
/// woke late while the process's CPU time went on (a worker spinning for
/// its send times on this thread's core) was this thread's wait, not the
/// generator's: 0. About a thousand short wakeups a second.
fn measure_stalls(
    stop: &AtomicBool,
    shared: &Shared,
    warmup: Duration,
    duration: Option<Duration>,
) -> Histogram<u64> {
    const NAP: Duration = Duration::from_millis(1);
    let mut stalls = stats::new_histogram();
    while !stop.load(Ordering::Acquire) {
        let cpu_before = cpu_clock(libc::CLOCK_PROCESS_CPUTIME_ID);
        let before = Instant::now();
        std::thread::sleep(NAP);
        // Stalls while answers drain after the sends move no send.
        let measured = shared.start.get().is_some_and(|&(start, _)| {
            let from = start + warmup;
            before >= from && duration.is_none_or(|d| before < from + d)
        });
        if measured {
            let late = before.elapsed().saturating_sub(NAP);
            let ran = match (cpu_before, cpu_clock(libc::CLOCK_PROCESS_CPUTIME_ID)) {
                (Some(a), Some(b)) => b.saturating_sub(a),
                _ => Duration::ZERO,
            };
            let stalled = if ran * 2 >= late {
                Duration::ZERO
            } else {
                late
            };
            stats::record(&mut stalls, stalled.as_micros() as u64);
        }
    }
    stalls
}

/// The calling thread's CPU time so far (user + system).
pub fn thread_cpu() -> Option<Duration> {
    cpu_clock(libc::CLOCK_THREAD_CPUTIME_ID)
}

/// CPU clock `id` (this thread's, or the whole process's: every thread).
fn cpu_clock(id: libc::clockid_t) -> Option<Duration> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given, nothing else.
    if unsafe { libc::clock_gettime(id, &mut ts) } != 0 {
        return None;
    }
    Some(Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32))
}

/// How long this thread has waited, runnable, for a CPU: the second field
/// of `/proc/thread-self/schedstat` (ns). `None` where the kernel does not
/// keep it (no `CONFIG_SCHED_INFO`).
fn thread_run_delay() -> Option<Duration> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let ns = s.split_ascii_whitespace().nth(1)?.parse().ok()?;
    Some(Duration::from_nanos(ns))
}

/// Where a worker's measured phase began: wall time, its thread's CPU time
/// and wait for a CPU, and its alarm clock's idle spin so far.
#[derive(Clone, Copy)]
struct CpuMark {
    at: Instant,
    cpu: Duration,
    run_delay: Option<Duration>,
    idle_spin: Duration,
}

impl CpuMark {
    fn now(clock: &crate::alarm::AlarmClock) -> Option<Self> {
        Some(CpuMark {
            at: Instant::now(),
            cpu: thread_cpu()?,
            run_delay: thread_run_delay(),
            idle_spin: clock.idle_spin(),
        })
    }

    /// This thread's CPU use from the mark to now.
    fn since(&self, clock: &crate::alarm::AlarmClock) -> Option<stats::CpuUse> {
        let end = CpuMark::now(clock)?;
        let wall = end.at.saturating_duration_since(self.at);
        if wall.is_zero() {
            return None;
        }
        let cpu = end.cpu.saturating_sub(self.cpu);
        let cores = cpu.as_secs_f64() / wall.as_secs_f64();
        let idle_wall = end.idle_spin.saturating_sub(self.idle_spin).min(wall);
        // Idle spin is wall time, and a round descheduled midway burnt CPU
        // only while it ran: scale it by the share of its runnable time the
        // thread got (its CPU over CPU plus its wait for one), as if the
        // waits fell evenly. Not by its share of the wall time: a thread
        // that sleeps most of the phase (low rates) runs its spins whole.
        let delay = match (self.run_delay, end.run_delay) {
            (Some(a), Some(b)) => b.saturating_sub(a),
            _ => Duration::ZERO,
        };
        let ran = if cpu.is_zero() {
            0.0
        } else {
            cpu.as_secs_f64() / (cpu + delay).as_secs_f64()
        };
        let idle_cpu = (idle_wall.as_secs_f64() * ran).min(cpu.as_secs_f64());
        Some(stats::CpuUse {
            threads: 1,
            cpu,
            cores,
            idle_spin_cores: idle_cpu / wall.as_secs_f64(),
        })
    }
}

/// One worker thread: pins itself, builds its runtime, runs its share.
fn worker<D: Driver>(
    t: usize,
    cfg: &Arc<RunConfig>,
    driver: D,
    tx: &Sender<Msg>,
    shared: &Arc<Shared>,
    barrier: &Barrier,
) -> ThreadStats {
    if let Some(cpus) = &cfg.cpus {
        let cpu = cpus[t % cpus.len()];
        if let Err(e) = monoio::utils::bind_to_cpu_set([cpu]) {
            shared.fail(format!("cannot pin worker {t} to CPU {cpu}: {e}"));
        }
    }
    let mut rt = match D::Rt::build() {
        Ok(rt) => rt,
        Err(e) => {
            shared.fail(format!("cannot build the I/O runtime: {e}"));
            barrier.wait();
            return ThreadStats::default();
        }
    };
    rt.block_on(worker_main(t, cfg, driver, tx, shared, barrier))
}

async fn worker_main<D: Driver>(
    t: usize,
    cfg: &Arc<RunConfig>,
    driver: D,
    tx: &Sender<Msg>,
    shared: &Arc<Shared>,
    barrier: &Barrier,
) -> ThreadStats {
    // Connect everything first, so the start line is not smeared by
    // handshakes.
    let mut conns = Vec::new();
    for i in (t..cfg.connections).step_by(cfg.threads) {
        if shared.aborted() {
            break;
        }
        let deadline = D::Rt::sleep_until(Instant::now() + CONNECT_TIMEOUT);
        match race(driver.connect(cfg.target.addr), deadline).await {
            Either::Left(Ok(c)) => conns.push((i, c)),
            Either::Left(Err(e)) => shared.fail(format!("cannot connect to {}: {e}", cfg.target)),
            Either::Right(()) => shared.fail(format!(
                "cannot connect to {}: no answer within {CONNECT_TIMEOUT:?}",
                cfg.target
            )),
        }
    }
    // Every worker reaches the barrier, failed or not, or the others would
    // wait forever. Blocking here is fine: no task runs on this runtime yet.
    barrier.wait();
    if shared.aborted() {
        return ThreadStats::default();
    }
    let (start, _) = *shared
        .start
        .get_or_init(|| (Instant::now(), SystemTime::now()));
    let measure_start = start + cfg.warmup;
    let ctx = Rc::new(ThreadCtx {
        cfg: Arc::clone(cfg),
        shared: Arc::clone(shared),
        start,
        measure_start,
        send_end: Cell::new(cfg.duration.map(|d| measure_start + d)),
        stop: Cell::new(false),
        clock: crate::alarm::AlarmClock::new(cfg.spin),
        totals: RefCell::new(ThreadStats::default()),
        interval: RefCell::new((stats::new_histogram(), Counts::default(), 0)),
    });
    let mut ccs = Vec::new();
    let mut tasks = Vec::new();
    for (i, c) in conns {
        let cc = Rc::new(ConnCtx {
            index: i,
            plan: cfg.plan(i),
            outstanding: RefCell::new(HashMap::default()),
            timed_out: RefCell::default(),
            sending_done: Cell::new(false),
            writer_wake: Notify::default(),
            reader_stop: Signal::default(),
            finished: Cell::new(false),
            given_up: Cell::new(false),
            reopened: Cell::new(None),
        });
        ccs.push(Rc::clone(&cc));
        let (d, ctx2) = (driver.clone(), Rc::clone(&ctx));
        tasks.push(D::Rt::spawn(
            ctx.clock.counted(async move { d.drive(c, ctx2, cc).await }),
        ));
    }

    let mut index = 0u64;
    let mut next_report = start + INTERVAL;
    let mut drain_until: Option<Instant> = None;
    let mut sigints_seen = 0;
    // The worker's own CPU over the measured phase: marked at its start
    // and end, to within a tick.
    let mut cpu_mark = (Instant::now() >= measure_start)
        .then(|| CpuMark::now(&ctx.clock))
        .flatten();
    // The turns of the measured phase only: those of the warmup go.
    let _ = ctx.clock.take_turns();
    let mut turns = None;
    let mut cpu_use = None;
    let mut cpu_done = false;
    // Never notified: the housekeeping wakes on time only.
    let on_time = Notify::default();
    loop {
        // On the alarm clock, not the runtime's timer: monoio fires its
        // timers only when it parks, and it does not park while the clock's
        // ticker spins for the sends' times, which above a few thousand
        // requests a second is all the time. On the runtime's timer this
        // loop stood still until sending ended: no progress lines, no
        // timeout sweeps, and often no mark of the measured phase's start,
        // so no CPU figures in the report. A coarse wait: the clock never
        // spins for it (a spin before every tick would burn 2.2 ms of every
        // 20 at rates too low to spin otherwise).
        //
        // Every TICK from now, not aligned to the next interval boundary
        // (an interval is cut at the first tick past it, up to TICK late):
        // aligned, a wake-up fell exactly on the end of the send phase,
        // together with every writer's, and the run's last answers were
        // read ~5 ms late (at 100,000 req/s against echo-baseline the run
        // window read 3.005–3.008 s for a 3 s phase, and 3.0001–3.0003 s
        // unaligned; the cause inside that turn was not found).
        ctx.clock
            .wait_until_coarse::<D::Rt>(Instant::now() + TICK, &on_time)
            .await;
        let now = Instant::now();
        let sigints = crate::interrupt::count();
        if sigints > sigints_seen {
            if sigints_seen == 0 {
                // First Ctrl-C: end the send phase now, drain as usual.
                shared.interrupt();
                ctx.send_end
                    .set(Some(ctx.send_end().map_or(now, |e| e.min(now))));
            }
            if sigints >= 2 {
                shared.fail("interrupted twice (Ctrl-C): stopped without draining".into());
            }
            sigints_seen = sigints;
        } else if shared.interrupted() && ctx.send_end().is_none_or(|e| e > now) {
            // Another worker saw the Ctrl-C first.
            ctx.send_end.set(Some(now));
        }
        let all_sent = ccs.iter().all(|c| c.sending_done.get());
        if ctx.send_over(now) && !all_sent {
            // Writers blocked on a full window must notice the end.
            for c in &ccs {
                c.writer_wake.notify();
            }
        }
        if all_sent && drain_until.is_none() {
            drain_until = Some(now + cfg.drain);
        }
        if !cpu_done {
            let over = ctx.send_over(now) || all_sent || ctx.stop.get() || shared.aborted();
            if cpu_mark.is_none() && now >= measure_start && !over {
                cpu_mark = CpuMark::now(&ctx.clock);
                let _ = ctx.clock.take_turns();
            } else if over {
                cpu_use = cpu_mark.and_then(|m| m.since(&ctx.clock));
                turns = Some(ctx.clock.take_turns());
                cpu_done = true;
            }
        }
        let stop_kind = if shared.aborted() {
            Some(ErrorKind::ConnectionLost)
        } else if drain_until.is_some_and(|d| now >= d) {
            Some(ErrorKind::Timeout)
        } else {
            None
        };
        if let Some(kind) = stop_kind
            && !ctx.stop.get()
        {
            ctx.stop.set(true);
            for c in &ccs {
                c.given_up.set(true);
                let left: Vec<Pending> =
                    c.outstanding.borrow_mut().drain().map(|(_, p)| p).collect();
                for p in &left {
                    ctx.on_end(p, now, Err((kind, None)));
                }
                c.writer_wake.notify();
                c.reader_stop.raise();
            }
        }
        sweep_timeouts(&ctx, &ccs, now);
        if now >= next_report {
            let _ = tx.send(Msg::Interval(Box::new(ctx.take_interval(t, index))));
            index += 1;
            next_report += INTERVAL;
        }
        if ccs.iter().all(|c| c.finished.get()) {
            break;
        }
    }
    if !cpu_done {
        cpu_use = cpu_mark.and_then(|m| m.since(&ctx.clock));
        turns = Some(ctx.clock.take_turns());
    }
    for task in tasks {
        task.await;
    }
    // The last, partial interval: only worth a report if something happened.
    let last = ctx.take_interval(t, index);
    let c = &last.counts;
    if c.sent + c.ok + c.total_errors() + last.warmup_ok > 0 {
        let _ = tx.send(Msg::Interval(Box::new(last)));
    }
    let mut totals = ctx.totals.borrow().clone();
    totals.cpu = cpu_use;
    if let Some(t) = turns {
        totals.turns = t;
    }
    totals
}

/// Ends requests older than `--timeout`, freeing their window slots.
fn sweep_timeouts(ctx: &ThreadCtx, ccs: &[Rc<ConnCtx>], now: Instant) {
    let Some(oldest_ok) = now.checked_sub(ctx.cfg.timeout) else {
        return;
    };
    for c in ccs {
        let mut expired = Vec::new();
        let was_full = c.window_full();
        c.outstanding.borrow_mut().retain(|seq, p| {
            let keep = p.start >= oldest_ok;
            if !keep {
                expired.push((*seq, *p));
            }
            keep
        });
        {
            let mut t = c.timed_out.borrow_mut();
            if let Some(before) = now.checked_sub(LATE_MEMORY_AGE) {
                t.forget_before(before);
            }
            for (seq, p) in &expired {
                t.insert(*seq, p.measured, now);
            }
        }
        if !expired.is_empty() {
            c.ended(was_full, now);
            for (_, p) in &expired {
                ctx.on_end(p, now, Err((ErrorKind::Timeout, None)));
            }
            c.writer_wake.notify();
            // Nothing left to wait for: a reader blocked in `read` would
            // otherwise sit there until the drain deadline.
            if c.sending_done.get() && c.outstanding.borrow().is_empty() {
                c.reader_stop.raise();
            }
        }
    }
}

/// Most requests a driver sends in one batch (one write on the frame edge,
/// one turn of started calls on gRPC): bounds the batch and lets the
/// connection's reader run between large bursts.
pub const MAX_BATCH: u64 = 512;

/// What a connection's sender does next (see [`Pacer::step`]).
pub enum Step {
    /// The run is over for this connection.
    Stop,
    /// Sleep until this instant (the next scheduled send, or the send
    /// phase's end), then step again.
    WaitUntil(Instant),
    /// The window is full: wait for a response, then step again.
    WindowFull,
    /// Send up to this many requests now.
    Send(u64),
}

/// One connection's place in its send plan: the closed-loop window and
/// quota, and the open-loop schedule. The frame and gRPC drivers share it,
/// so both pace, time and account requests the same way and differ only in
/// how a request reaches the wire.
pub struct Pacer {
    schedule: Option<Schedule>,
    /// Sequence number of the next request.
    seq: u64,
    /// Schedule index of the next request (open loop).
    k: u64,
}

impl Pacer {
    pub fn new(ctx: &ThreadCtx, cc: &ConnCtx) -> Self {
        let schedule = cc
            .plan
            .rate
            .map(|r| Schedule::new(ctx.start, r, ctx.cfg.ramp, cc.plan.phase));
        Pacer {
            schedule,
            seq: 0,
            k: 0,
        }
    }

    /// The connection's workload generator, seeded per connection so that
    /// connections draw different sequences from the run's one seed.
    pub fn generator(ctx: &ThreadCtx, cc: &ConnCtx) -> Generator {
        let seed = ctx.cfg.seed ^ (cc.index as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        Generator::new(Arc::clone(&ctx.cfg.workload), seed)
    }

    /// Sequence number of the next request.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// What to do at `now`.
    pub fn step(&self, ctx: &ThreadCtx, cc: &ConnCtx, now: Instant) -> Step {
        if ctx.stop.get() || self.seq >= cc.plan.quota {
            return Step::Stop;
        }
        // Past the end of the send phase, requests the schedule put before
        // it still go out (late, and measured from their intended times):
        // a writer woken a little after the end must not leave them unsent,
        // or every run would end "could not keep up" by a few requests.
        // Not after Ctrl-C (nothing more is sent), not into a full window
        // (those are held back by it, and say so), and not beyond
        // `CATCH_UP` past the end: a generator further behind could not
        // keep up, and sending its whole backlog would stretch the run by
        // as long as the server takes to answer it.
        let catching_up = ctx.send_over(now);
        if catching_up
            && (ctx.shared.interrupted()
                || ctx.send_end().is_some_and(|e| now >= e + CATCH_UP)
                || self
                    .schedule
                    .as_ref()
                    .is_none_or(|s| ctx.send_over(s.at(self.k))))
        {
            return Step::Stop;
        }
        if let Some(s) = &self.schedule {
            let due = s.at(self.k);
            if due > now {
                return Step::WaitUntil(ctx.send_end().map_or(due, |e| e.min(due)));
            }
        }
        let room = cc
            .plan
            .window
            .saturating_sub(cc.outstanding.borrow().len() as u64)
            .min(cc.plan.quota - self.seq)
            .min(MAX_BATCH);
        match room {
            0 if catching_up => Step::Stop,
            0 => Step::WindowFull,
            _ => Step::Send(room),
        }
    }

    /// The intended send time of the next request of a batch begun at
    /// `now`: `now` in closed loop, its scheduled time in open loop, or
    /// `None` when no more are due yet (the batch ends).
    pub fn intended(&mut self, ctx: &ThreadCtx, now: Instant) -> Option<Instant> {
        let Some(s) = &self.schedule else {
            return Some(now);
        };
        let t = s.at(self.k);
        if t > now || ctx.send_over(t) {
            return None;
        }
        self.k += 1;
        Some(t)
    }

    /// Records request [`Self::seq`] as sent, awaiting `expect`; returns its
    /// sequence number and moves to the next.
    pub fn sent(
        &mut self,
        ctx: &ThreadCtx,
        cc: &ConnCtx,
        intended: Instant,
        now: Instant,
        expect: ResponsePayload,
    ) -> u64 {
        let seq = self.seq;
        cc.outstanding.borrow_mut().insert(
            seq,
            Pending {
                start: intended,
                measured: ctx.measured(intended),
                expect,
            },
        );
        let ready = cc.reopened.get().map_or(intended, |r| r.max(intended));
        ctx.on_sent(intended, ready, now, self.schedule.is_some());
        self.seq += 1;
        seq
    }

    /// At the end of sending: requests the schedule called for in the
    /// measured phase but that were never sent (the generator or the window
    /// was behind) still count as offered.
    pub fn finish(&self, ctx: &ThreadCtx, cc: &ConnCtx) {
        if let (Some(s), Some(end)) = (
            &self.schedule,
            // A run stopped early (failure) offered nothing after it stopped.
            ctx.send_end().map(|e| e.min(Instant::now())),
        ) {
            let due = s.count_before(end).min(cc.plan.quota);
            let first_measured = s.count_before(ctx.measure_start);
            ctx.on_unsent(due.saturating_sub(self.k.max(first_measured)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timed_out_requests_are_remembered_once_and_bounded() {
        let t0 = Instant::now();
        let mut t = TimedOut::default();
        t.insert(1, true, t0);
        t.insert(2, false, t0 + Duration::from_secs(2));
        assert_eq!(t.take(1), Some(true));
        assert_eq!(t.take(1), None, "a second answer is unknown");
        t.forget_before(t0 + Duration::from_secs(1));
        assert!(t.contains(2));
        t.forget_before(t0 + Duration::from_secs(3));
        assert!(!t.contains(2), "forgotten with age");
        for seq in 10..10 + LATE_MEMORY as u64 + 5 {
            t.insert(seq, true, t0);
        }
        assert!(t.order.len() <= LATE_MEMORY && t.ids.len() <= LATE_MEMORY);
        assert!(!t.contains(10), "the oldest pushed out");
        assert!(t.contains(10 + LATE_MEMORY as u64 + 4));
    }
}
