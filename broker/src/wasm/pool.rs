//! A shard's pool of instances of one router.
//!
//! Each instance serves one call at a time. A caller takes an idle instance
//! or, when all are busy, waits in a bounded FIFO queue; when the queue is
//! full it gets [`CallError::Overloaded`] at once. A released instance is
//! handed straight to the oldest waiter, so a newcomer never overtakes it.
//!
//! A session-affine router ([`RouterSpec::sessions`]) also keeps one
//! dedicated instance per session id: the WIT passes no session to the
//! guest, so giving each session its own instance is the only way to keep
//! one session's state from another's. A session's calls run on its instance
//! one at a time, in the order they asked for it (its own bounded FIFO
//! queue, `queue_depth` deep). Its instance is made on its first call,
//! dropped after `idle_timeout` without a call, and, when the shard holds
//! `max_per_shard` sessions of the router, dropped to make room for a new
//! session if it is the least recently used one with no call in flight; a
//! new session finding every session busy is refused with
//! [`CallError::SessionsFull`]. Calls without a session id use the shared
//! instances.
//!
//! # Invariants
//! - Single-threaded: the pool is `!Send` and lives on one shard thread; its
//!   state is in `Cell`/`RefCell`, borrowed only between awaits, never held
//!   across one. No locks.
//! - Runtime-agnostic: only `std` futures and wakers; any executor drives it.
//! - An idle instance exists only while no caller waits.
//! - An instance that faulted, or whose call was cancelled mid-flight, is
//!   never reused: its store is dropped and a fresh one is instantiated from
//!   the shared `InstancePre`; for a session, the fresh instance is the
//!   session's (its state is lost).
//! - A session with a call in flight or queued is never evicted or expired:
//!   an instance is dropped only while nothing holds or waits for it.
//! - Session instances per shard never exceed `max_per_shard`, so the host's
//!   pooled slots (reserved in `server::start`) never run out.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use super::bindings::types::{
    CompletionRequest, CompletionResponse, GetPromptResult, McpResource, MetaEntry,
    ReadResourceResult, Response,
};
use super::error::CallError;
use super::host::{Instance, LiveSink, Router, RouterMeta, drive, settle};
#[cfg(doc)]
use super::spec::RouterSpec;
use super::spec::SessionLimits;

/// Counters of one pool, for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Shared instances in the pool (`instances_per_shard`).
    pub instances: u32,
    /// Shared instances free for the next call.
    pub idle: u32,
    /// Shared instances serving (or handed to) a call.
    pub busy: u32,
    /// A session-affine router's session slots (`max_sessions_per_shard`),
    /// each an instance made on a session's first call; 0 for others.
    pub session_slots: u32,
    /// Session slots whose session has a call in flight: at the cap, with
    /// every one busy, a new session is refused.
    pub sessions_busy: u32,
    /// Callers waiting for an instance.
    pub queued: u32,
    /// Calls that ran in an instance.
    pub calls: u64,
    /// Calls that ended in a fault of the router: of its instance (which is
    /// replaced), or malformed output (which leaves it).
    pub faults: u64,
    /// Instances discarded (fault or cancelled call) and replaced.
    pub replaced: u64,
    /// Calls refused because the queue was full (or, for a session-affine
    /// router, every session of the shard had a call in flight).
    pub overloaded: u64,
    /// Sessions holding their own instance (session-affine routers).
    pub sessions: u32,
    /// Idle sessions whose instance was dropped to make room for a new
    /// session (the cap `max_sessions_per_shard` was reached).
    pub sessions_evicted: u64,
    /// Epoch ticks that found a call's guest code running: each one a
    /// yield of the shard (or, `never_waits`, a tick of its run limit).
    pub compute_ticks: u64,
}

impl PoolStats {
    /// Adds `o` into `self`, gauges and counters alike.
    pub fn add(&mut self, o: &PoolStats) {
        self.instances += o.instances;
        self.idle += o.idle;
        self.busy += o.busy;
        self.session_slots += o.session_slots;
        self.sessions_busy += o.sessions_busy;
        self.queued += o.queued;
        self.calls += o.calls;
        self.faults += o.faults;
        self.replaced += o.replaced;
        self.overloaded += o.overloaded;
        self.sessions += o.sessions;
        self.sessions_evicted += o.sessions_evicted;
        self.compute_ticks += o.compute_ticks;
    }

    /// The counters alone (what a dropped pool leaves behind).
    pub fn counters(&self) -> PoolStats {
        PoolStats {
            calls: self.calls,
            faults: self.faults,
            replaced: self.replaced,
            overloaded: self.overloaded,
            sessions_evicted: self.sessions_evicted,
            compute_ticks: self.compute_ticks,
            ..PoolStats::default()
        }
    }
}

/// One slot of the pool: an instance, or `None` until (re)instantiated.
/// Boxed (once per instantiation) so that handing a slot around moves a
/// pointer, not the bindings' table of export indices.
struct Slot(Option<Box<Instance>>);

#[derive(Default)]
struct Waiter {
    handed: RefCell<Option<Slot>>,
    waker: RefCell<Option<Waker>>,
}

impl Waiter {
    /// Gives `slot` to this waiter and wakes it.
    fn hand(&self, slot: Slot) {
        *self.handed.borrow_mut() = Some(slot);
        let waker = self.waker.borrow_mut().take();
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

/// One session's own instance and the calls waiting for it.
struct Session {
    /// The instance (or an empty slot before the first call) while no call
    /// holds it; `None` while `leased`.
    slot: RefCell<Option<Slot>>,
    /// A call holds the instance, or it was handed to a waiter that has not
    /// taken it yet. While set, newcomers queue behind `waiters`.
    leased: Cell<bool>,
    /// This session's calls waiting for its instance, oldest first.
    waiters: RefCell<VecDeque<Rc<Waiter>>>,
    /// When a call last took or gave back the instance.
    last_used: Cell<Instant>,
}

impl Session {
    fn new(now: Instant) -> Self {
        Self {
            slot: RefCell::new(Some(Slot(None))),
            leased: Cell::new(false),
            waiters: RefCell::new(VecDeque::new()),
            last_used: Cell::new(now),
        }
    }

    /// Gives the instance back: to this session's oldest waiter if any (the
    /// session stays leased), else to the session.
    fn release(&self, slot: Slot) {
        self.last_used.set(Instant::now());
        let waiter = self.waiters.borrow_mut().pop_front();
        match waiter {
            Some(w) => w.hand(slot),
            None => {
                *self.slot.borrow_mut() = Some(slot);
                self.leased.set(false);
            }
        }
    }

    /// Neither holds nor waits for its instance: it may be dropped.
    fn is_idle(&self) -> bool {
        !self.leased.get()
    }
}

/// The sessions of a session-affine router on this shard.
struct Sessions {
    limits: SessionLimits,
    /// Session id → its instance. Bounded by `limits.max_per_shard`.
    map: RefCell<HashMap<Box<str>, Rc<Session>>>,
    evicted: Cell<u64>,
}

impl Sessions {
    /// The session `id`, opened if new; `None` when the shard holds its
    /// maximum of sessions and every one has a call in flight.
    fn get_or_open(&self, id: &str) -> Option<Rc<Session>> {
        if let Some(s) = self.map.borrow().get(id) {
            return Some(s.clone());
        }
        let now = Instant::now();
        let mut map = self.map.borrow_mut();
        if map.len() >= self.limits.max_per_shard as usize {
            self.expire(&mut map, now);
        }
        if map.len() >= self.limits.max_per_shard as usize {
            // Least recently used among those not in use; off the hot path
            // (only a new session on a full shard pays for the scan).
            let lru = map
                .iter()
                .filter(|(_, s)| s.is_idle())
                .min_by_key(|(_, s)| s.last_used.get())
                .map(|(k, _)| k.clone())?;
            map.remove(&lru);
            self.evicted.set(self.evicted.get() + 1);
        }
        let session = Rc::new(Session::new(now));
        map.insert(id.into(), session.clone());
        Some(session)
    }

    /// Drops the sessions idle for `idle_timeout` or longer.
    fn expire(&self, map: &mut HashMap<Box<str>, Rc<Session>>, now: Instant) -> usize {
        let before = map.len();
        let timeout = self.limits.idle_timeout;
        map.retain(|_, s| {
            !(s.is_idle() && now.saturating_duration_since(s.last_used.get()) >= timeout)
        });
        before - map.len()
    }
}

/// Where a leased instance goes back to.
#[derive(Clone)]
enum Home {
    /// The shared instances.
    Pool,
    /// A session's own instance.
    Session(Rc<Session>),
}

struct Inner {
    router: Arc<Router>,
    size: u32,
    queue_depth: usize,
    idle: RefCell<Vec<Slot>>,
    waiters: RefCell<VecDeque<Rc<Waiter>>>,
    busy: Cell<u32>,
    calls: Cell<u64>,
    faults: Cell<u64>,
    /// Faults are logged as well as counted (a rising metric alone names
    /// no router and no reason), within this budget: a router that traps
    /// on every call must not flood the log.
    fault_log: crate::shard::LogBudget,
    replaced: Cell<u64>,
    overloaded: Cell<u64>,
    compute_ticks: Cell<u64>,
    /// `Some` for a session-affine router.
    sessions: Option<Sessions>,
}

impl Inner {
    /// Gives a slot back to where it was leased from.
    fn release_to(&self, home: &Home, slot: Slot) {
        match home {
            Home::Pool => self.release(slot),
            Home::Session(s) => s.release(slot),
        }
    }

    /// Gives a shared slot back: to the oldest waiter if any, else to the
    /// idle list.
    fn release(&self, slot: Slot) {
        let waiter = self.waiters.borrow_mut().pop_front();
        match waiter {
            Some(w) => w.hand(slot),
            None => {
                self.busy.set(self.busy.get() - 1);
                self.idle.borrow_mut().push(slot);
            }
        }
    }

    fn count(cell: &Cell<u64>) {
        cell.set(cell.get() + 1);
    }

    /// Counts a fault of the router and logs it, within the log budget.
    fn fault(&self, e: &CallError, replaced: bool) {
        Self::count(&self.faults);
        if let Some(suppressed) = self.fault_log.take(Instant::now()) {
            // Escaped: a trap's or a refusal's text may quote the guest.
            tracing::warn!(
                router = %self.router.spec.name,
                error = %crate::escaped::Escaped(&e.to_string()),
                replaced,
                suppressed,
                "router fault"
            );
        }
    }
}

/// A shard's pool of instances of one router (cheap to clone: shared handle).
#[derive(Clone)]
pub struct RouterPool {
    inner: Rc<Inner>,
}

impl std::fmt::Debug for RouterPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RouterPool")
            .field("router", &self.inner.router.spec.name)
            .field("stats", &self.stats())
            .finish()
    }
}

impl RouterPool {
    /// A pool sized by the router's spec (`instances_per_shard`,
    /// `queue_depth`, `sessions`). Instances are made on first use; see
    /// [`Self::warm`].
    pub fn new(router: Arc<Router>) -> Self {
        let size = router.spec.instances_per_shard.max(1);
        let queue_depth = router.spec.queue_depth as usize;
        let sessions = router.spec.sessions.map(|limits| Sessions {
            limits,
            map: RefCell::new(HashMap::with_capacity(limits.max_per_shard as usize)),
            evicted: Cell::new(0),
        });
        Self {
            inner: Rc::new(Inner {
                router,
                size,
                queue_depth,
                idle: RefCell::new((0..size).map(|_| Slot(None)).collect()),
                waiters: RefCell::new(VecDeque::with_capacity(queue_depth)),
                busy: Cell::new(0),
                calls: Cell::new(0),
                faults: Cell::new(0),
                fault_log: Default::default(),
                replaced: Cell::new(0),
                overloaded: Cell::new(0),
                compute_ticks: Cell::new(0),
                sessions,
            }),
        }
    }

    /// Instantiates every idle slot that has no instance yet, so that the
    /// first calls do not pay for instantiation. (Session instances are
    /// made by each session's first call.)
    pub async fn warm(&self) -> Result<(), CallError> {
        // One slot at a time, held by a lease: cancelling `warm` returns the
        // slot to the pool. Bounded: each round fills one of `size` slots.
        for _ in 0..self.inner.size {
            let slot = {
                let mut idle = self.inner.idle.borrow_mut();
                let empty = idle.iter().position(|s| s.0.is_none());
                empty.map(|i| idle.swap_remove(i))
            };
            let Some(slot) = slot else { break };
            self.inner.busy.set(self.inner.busy.get() + 1);
            Lease::new(self.inner.clone(), Home::Pool, slot)
                .fill()
                .await?;
        }
        Ok(())
    }

    /// Whether anything but this handle holds the pool: a call running or
    /// waiting in it, or another handle (a retired pool is dropped once
    /// this is false).
    pub fn in_use(&self) -> bool {
        Rc::strong_count(&self.inner) > 1
    }

    /// The router this pool runs.
    pub fn router(&self) -> &Arc<Router> {
        &self.inner.router
    }

    /// Metadata read at load.
    pub fn meta(&self) -> &Arc<RouterMeta> {
        self.inner.router.meta()
    }

    /// Current counters.
    pub fn stats(&self) -> PoolStats {
        let i = &self.inner;
        let mut queued = i.waiters.borrow().len();
        let (mut session_slots, mut sessions_busy) = (0, 0);
        let (mut sessions, mut sessions_evicted) = (0, 0);
        if let Some(s) = &i.sessions {
            let map = s.map.borrow();
            sessions = map.len() as u32;
            sessions_evicted = s.evicted.get();
            queued += map
                .values()
                .map(|s| s.waiters.borrow().len())
                .sum::<usize>();
            // Kept apart from the shared instances: summed with them, the
            // session slots (64 by default) hid a saturated shared pool,
            // as the shared pool alone had hidden saturated sessions.
            session_slots = s.limits.max_per_shard;
            sessions_busy = map.values().filter(|s| !s.is_idle()).count() as u32;
        }
        PoolStats {
            instances: i.size,
            idle: i.idle.borrow().len() as u32,
            busy: i.busy.get(),
            session_slots,
            sessions_busy,
            queued: queued as u32,
            calls: i.calls.get(),
            faults: i.faults.get(),
            replaced: i.replaced.get(),
            overloaded: i.overloaded.get(),
            sessions,
            sessions_evicted,
            compute_ticks: i.compute_ticks.get(),
        }
    }

    /// The idle time after which a session's instance is dropped; `None`
    /// unless the router is session-affine.
    pub fn session_idle_timeout(&self) -> Option<Duration> {
        self.inner.sessions.as_ref().map(|s| s.limits.idle_timeout)
    }

    /// Drops the instances of sessions that had no call for the router's
    /// `idle_timeout` as of `now`; returns how many. Sessions with a call in
    /// flight or queued are kept.
    pub fn expire_sessions(&self, now: Instant) -> usize {
        match &self.inner.sessions {
            Some(s) => s.expire(&mut s.map.borrow_mut(), now),
            None => 0,
        }
    }

    /// The calls of `session`: on a session-affine router, a session id
    /// selects that session's own instance; without one (or on any other
    /// router) calls run on the shared instances.
    pub fn caller<'a>(&'a self, session: Option<&'a str>) -> Caller<'a> {
        Caller {
            pool: self,
            session: session.filter(|_| self.inner.sessions.is_some()),
        }
    }

    /// Whether its calls may report progress and logs while they run.
    pub fn reports_live(&self) -> bool {
        self.inner.router.reports_live()
    }

    /// `call-tool` with the router's default deadline, on a shared instance.
    /// The router's `tool-error` comes back as [`CallError::Tool`] (not a
    /// fault).
    pub async fn call_tool(&self, tool: &str, arguments: &str) -> Result<Response, CallError> {
        self.caller(None)
            .call_tool_within(tool, arguments, self.inner.router.spec.call_deadline)
            .await
    }

    /// `call-tool` with its own deadline, on a shared instance.
    pub async fn call_tool_within(
        &self,
        tool: &str,
        arguments: &str,
        deadline: Duration,
    ) -> Result<Response, CallError> {
        self.caller(None)
            .call_tool_within(tool, arguments, deadline)
            .await
    }

    /// `read-resource`, on a shared instance.
    pub async fn read_resource(&self, uri: &str) -> Result<ReadResourceResult, CallError> {
        self.caller(None).read_resource(uri).await
    }

    /// `get-prompt`, on a shared instance. Messages may hold `{{arg}}`
    /// placeholders for the broker to fill (the WIT passes no arguments).
    pub async fn get_prompt(&self, name: &str) -> Result<GetPromptResult, CallError> {
        self.caller(None).get_prompt(name).await
    }

    /// `complete`, on a shared instance.
    pub async fn complete(
        &self,
        request: &CompletionRequest,
    ) -> Result<CompletionResponse, CallError> {
        self.caller(None).complete(request).await
    }

    /// `list-resources` of one shared instance, now. A stateful router's
    /// list is per instance (see the `kv` router); [`RouterMeta::resources`]
    /// is the list of a fresh instance.
    pub async fn list_resources(&self) -> Result<Vec<McpResource>, CallError> {
        self.caller(None).list_resources().await
    }

    fn deadline(&self) -> Duration {
        self.inner.router.spec.call_deadline
    }

    fn max_result_bytes(&self) -> usize {
        self.inner.router.spec.max_result_bytes
    }

    /// Takes an instance (or waits for one), runs `f` on it under the
    /// deadline, and gives it back; a faulted instance is replaced.
    async fn run<T>(
        &self,
        session: Option<&str>,
        deadline: Duration,
        live: Option<LiveSink>,
        f: impl AsyncFnOnce(&mut Instance) -> wasmtime::Result<T>,
    ) -> Result<T, CallError> {
        let mut lease = self.acquire(session).await?;
        let at = Instant::now() + deadline;
        let inner = self.inner.clone();
        let inst = lease.ready().await?;
        inst.begin(at);
        let listening = live.is_some();
        if listening {
            inst.set_live(live);
        }
        Inner::count(&inner.calls);
        let r = drive(&inner.router.shared.tokio, at, f(&mut *inst)).await;
        let ticks = &inner.compute_ticks;
        ticks.set(ticks.get() + u64::from(inst.ticks()));
        let r = settle(deadline, &inst.store, r);
        if listening {
            inst.set_live(None);
        }
        if r.is_ok() {
            inst.settled();
        }
        // A deadline shorter than the router's own is the client's: cut
        // there, the call is no fault of the router's (a client could
        // otherwise fire McpRouterFaulting with short deadlines), though
        // its instance, stopped mid-call, is replaced all the same.
        // (A never-waits router's run limit is its own, whatever the
        // deadline: its error names the limit, not the deadline.)
        let clients = deadline < inner.router.spec.call_deadline;
        let fault = !(clients && matches!(r, Err(CallError::DeadlineExceeded(d)) if d == deadline));
        lease.finish(r, fault).await
    }

    /// Asks for an instance. Synchronous up to the returned future, so that
    /// callers queue in the order they called this (the FIFO guarantee).
    fn acquire(&self, session: Option<&str>) -> Acquire {
        let inner = &self.inner;
        if let (Some(sessions), Some(id)) = (&inner.sessions, session) {
            let Some(session) = sessions.get_or_open(id) else {
                Inner::count(&inner.overloaded);
                return Acquire::Refused(CallError::SessionsFull);
            };
            if !session.leased.get() {
                session.leased.set(true);
                session.last_used.set(Instant::now());
                let slot = session.slot.borrow_mut().take().unwrap_or(Slot(None));
                let lease = Lease::new(inner.clone(), Home::Session(session), slot);
                return Acquire::Ready(Some(lease));
            }
            let mut waiters = session.waiters.borrow_mut();
            if waiters.len() >= inner.queue_depth {
                Inner::count(&inner.overloaded);
                return Acquire::Refused(CallError::Overloaded);
            }
            let waiter = Rc::new(Waiter::default());
            waiters.push_back(waiter.clone());
            drop(waiters);
            return Acquire::Waiting(WaitFor {
                pool: inner.clone(),
                home: Home::Session(session),
                waiter,
            });
        }
        let slot = inner.idle.borrow_mut().pop();
        if let Some(slot) = slot {
            inner.busy.set(inner.busy.get() + 1);
            return Acquire::Ready(Some(Lease::new(inner.clone(), Home::Pool, slot)));
        }
        let mut waiters = inner.waiters.borrow_mut();
        if waiters.len() >= inner.queue_depth {
            Inner::count(&inner.overloaded);
            return Acquire::Refused(CallError::Overloaded);
        }
        let waiter = Rc::new(Waiter::default());
        waiters.push_back(waiter.clone());
        Acquire::Waiting(WaitFor {
            pool: inner.clone(),
            home: Home::Pool,
            waiter,
        })
    }
}

/// The calls of one session (or of none) on a pool: see
/// [`RouterPool::caller`].
#[derive(Clone, Copy)]
pub struct Caller<'a> {
    pool: &'a RouterPool,
    /// `Some` only for a session-affine router.
    session: Option<&'a str>,
}

impl<'a> Caller<'a> {
    /// Whose instance its calls run on: `None` for a router whose
    /// instances every caller shares, else `Some` of the session key
    /// (`Some(None)`: the shared instances of calls without a session).
    pub fn instance(&self) -> Option<Option<&'a str>> {
        self.pool.inner.sessions.is_some().then_some(self.session)
    }

    /// `call-tool` with its own deadline. The router's `tool-error` comes
    /// back as [`CallError::Tool`] (not a fault).
    pub async fn call_tool_within(
        self,
        tool: &str,
        arguments: &str,
        deadline: Duration,
    ) -> Result<Response, CallError> {
        self.call_tool_live(tool, arguments, deadline, None).await
    }

    /// [`Self::call_tool_within`], with the progress and logs the router
    /// reports while the call runs sent to `live` (routers that import
    /// `mcp-broker:host/call`; see [`RouterPool::reports_live`]).
    pub async fn call_tool_live(
        self,
        tool: &str,
        arguments: &str,
        deadline: Duration,
        live: Option<LiveSink>,
    ) -> Result<Response, CallError> {
        let max = self.pool.max_result_bytes();
        let response = self
            .pool
            .run(self.session, deadline, live, async |i| {
                i.call_tool(tool, arguments, max).await
            })
            .await?
            .map_err(CallError::Tool)?;
        if self.pool.inner.router.spec.validate_json
            && let Err(e) = check_response(&response)
        {
            // Malformed output is a fault of the router (docs/metrics.md),
            // though its instance stays: nothing in it is broken.
            self.pool.inner.fault(&e, false);
            return Err(e);
        }
        Ok(response)
    }

    /// `read-resource`.
    pub async fn read_resource(self, uri: &str) -> Result<ReadResourceResult, CallError> {
        let max = self.pool.max_result_bytes();
        self.pool
            .run(self.session, self.pool.deadline(), None, async |i| {
                i.read_resource(uri, max).await
            })
            .await?
            .map_err(CallError::Resource)
    }

    /// `get-prompt`. Messages may hold `{{arg}}` placeholders for the broker
    /// to fill (the WIT passes no arguments).
    pub async fn get_prompt(self, name: &str) -> Result<GetPromptResult, CallError> {
        let max = self.pool.max_result_bytes();
        self.pool
            .run(self.session, self.pool.deadline(), None, async |i| {
                i.get_prompt(name, max).await
            })
            .await?
            .map_err(CallError::Prompt)
    }

    /// `complete`.
    pub async fn complete(
        self,
        request: &CompletionRequest,
    ) -> Result<CompletionResponse, CallError> {
        let max = self.pool.max_result_bytes();
        self.pool
            .run(self.session, self.pool.deadline(), None, async |i| {
                i.complete(request, max).await
            })
            .await?
            .map_err(CallError::Completion)
    }

    /// `list-resources` of the instance, now.
    pub async fn list_resources(self) -> Result<Vec<McpResource>, CallError> {
        self.pool
            .run(self.session, self.pool.deadline(), None, async |i| {
                i.bindings
                    .wasix_mcp_router()
                    .call_list_resources(&mut i.store)
                    .await
            })
            .await
    }
}

/// The three ways to get an instance.
enum Acquire {
    Ready(Option<Lease>),
    Refused(CallError),
    Waiting(WaitFor),
}

impl Future for Acquire {
    type Output = Result<Lease, CallError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.get_mut() {
            Acquire::Ready(lease) => match lease.take() {
                Some(lease) => Poll::Ready(Ok(lease)),
                None => Poll::Ready(Err(CallError::Overloaded)),
            },
            Acquire::Refused(e) => Poll::Ready(Err(std::mem::replace(e, CallError::Overloaded))),
            Acquire::Waiting(w) => Pin::new(w).poll(cx),
        }
    }
}

/// A caller queued for an instance (shared, or its session's).
struct WaitFor {
    pool: Rc<Inner>,
    home: Home,
    waiter: Rc<Waiter>,
}

impl Future for WaitFor {
    type Output = Result<Lease, CallError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let handed = self.waiter.handed.borrow_mut().take();
        match handed {
            Some(slot) => Poll::Ready(Ok(Lease::new(self.pool.clone(), self.home.clone(), slot))),
            None => {
                *self.waiter.waker.borrow_mut() = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

impl Drop for WaitFor {
    fn drop(&mut self) {
        // Cancelled while queued: leave the queue, or pass on a slot that was
        // handed over but never taken.
        let queue = match &self.home {
            Home::Pool => &self.pool.waiters,
            Home::Session(s) => &s.waiters,
        };
        queue.borrow_mut().retain(|w| !Rc::ptr_eq(w, &self.waiter));
        let handed = self.waiter.handed.borrow_mut().take();
        if let Some(slot) = handed {
            self.pool.release_to(&self.home, slot);
        }
    }
}

/// An instance taken from the pool for one call; returned on drop.
struct Lease {
    pool: Rc<Inner>,
    home: Home,
    slot: Option<Slot>,
    /// Set while a guest call is in flight: dropping the lease then means the
    /// call was cancelled halfway and the instance's state is unknown.
    armed: bool,
}

impl Lease {
    fn new(pool: Rc<Inner>, home: Home, slot: Slot) -> Self {
        Self {
            pool,
            home,
            slot: Some(slot),
            armed: false,
        }
    }
    /// The instance, instantiated first if the slot is empty.
    async fn fill(&mut self) -> Result<&mut Instance, CallError> {
        let Some(slot) = self.slot.as_mut() else {
            return Err(CallError::Fault("lease without a slot".into()));
        };
        if slot.0.is_none() {
            // Boxed: rare, and its future would otherwise widen every call's.
            slot.0 = Some(Box::new(Box::pin(self.pool.router.instantiate()).await?));
        }
        slot.0
            .as_deref_mut()
            .ok_or_else(|| CallError::Fault("lease without an instance".into()))
    }

    /// The instance, instantiated first if needed, armed for a call.
    async fn ready(&mut self) -> Result<&mut Instance, CallError> {
        self.fill().await?;
        self.armed = true;
        match self.slot.as_mut().and_then(|s| s.0.as_deref_mut()) {
            Some(inst) => Ok(inst),
            None => Err(CallError::Fault("lease without an instance".into())),
        }
    }

    /// Ends the call: on an error the instance is discarded and replaced,
    /// and counted as the router's fault if `fault`.
    async fn finish<T>(&mut self, r: Result<T, CallError>, fault: bool) -> Result<T, CallError> {
        self.armed = false;
        let e = match r {
            Ok(v) => return Ok(v),
            Err(e) => e,
        };
        if let Some(slot) = self.slot.as_mut() {
            if fault {
                self.pool.fault(&e, true);
            }
            Inner::count(&self.pool.replaced);
            slot.0 = None;
            // Replace now, so the next caller finds a ready instance; if this
            // fails the slot stays empty and the next caller retries.
            match Box::pin(self.pool.router.instantiate()).await {
                Ok(inst) => slot.0 = Some(Box::new(inst)),
                Err(e) => {
                    if let Some(suppressed) = self.pool.fault_log.take(Instant::now()) {
                        tracing::warn!(
                            router = %self.pool.router.spec.name,
                            error = %crate::escaped::Escaped(&e.to_string()),
                            suppressed,
                            "a faulted instance could not be replaced; the next call tries again"
                        );
                    }
                }
            }
        }
        Err(e)
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(mut slot) = self.slot.take() {
            if self.armed {
                Inner::count(&self.pool.replaced);
                slot.0 = None;
            }
            self.pool.release_to(&self.home, slot);
        }
    }
}

/// Checks every `json` field of a tool answer.
fn check_response(response: &Response) -> Result<(), CallError> {
    match response {
        Response::Completed(r) => {
            if let Some(s) = &r.structured_content {
                check_json("structured-content", s)?;
            }
            check_meta(r.meta.as_deref())
        }
        Response::Elicit(e) => {
            check_json("elicit.schema", &e.schema)?;
            check_meta(e.meta.as_deref())
        }
    }
}

fn check_meta(meta: Option<&[MetaEntry]>) -> Result<(), CallError> {
    meta.unwrap_or_default()
        .iter()
        .try_for_each(|m| check_json("meta", &m.value))
}

fn check_json(field: &'static str, text: &str) -> Result<(), CallError> {
    if super::json_check::is_json(text) {
        return Ok(());
    }
    // Refused: serde_json says what is wrong and where, and it has the last
    // word should the two checks ever disagree (`json_check`'s invariants).
    serde_json::from_str::<serde::de::IgnoredAny>(text)
        .map(drop)
        .map_err(|e| CallError::MalformedOutput {
            field,
            error: e.to_string(),
        })
}

#[cfg(test)]
mod tests {
    use std::sync::OnceLock;

    use super::*;
    use crate::wasm::{HostConfig, RouterSpec, WasmHost};

    const DEADLINE: Duration = Duration::from_secs(5);
    const PRINT: &str = r#"{"text":"x"}"#;

    fn host() -> &'static WasmHost {
        static HOST: OnceLock<WasmHost> = OnceLock::new();
        HOST.get_or_init(|| {
            let config = HostConfig {
                max_instances: 64,
                ..HostConfig::default()
            };
            WasmHost::new(&config).expect("wasm host starts")
        })
    }

    /// A bundled router, `instances` shared instances, session-affine with
    /// at most `sessions` sessions idle-expiring after a minute.
    fn pool(name: &str, instances: u32, queue: u32, sessions: u32) -> RouterPool {
        let mut spec = RouterSpec::bundled(name);
        assert!(
            spec.wasm.is_file(),
            "{} is missing: run scripts/build-routers",
            spec.wasm.display()
        );
        spec.instances_per_shard = instances;
        spec.queue_depth = queue;
        spec.sessions = Some(SessionLimits {
            max_per_shard: sessions,
            idle_timeout: Duration::from_secs(60),
        });
        RouterPool::new(host().load(&spec).expect("router loads"))
    }

    fn on_shard<F: Future>(f: F) -> F::Output {
        monoio::RuntimeBuilder::<monoio::FusionDriver>::new()
            .enable_timer()
            .build()
            .expect("monoio runtime")
            .block_on(f)
    }

    /// Polls `f` once in the current task; `true` while it is pending.
    async fn pending<F: Future>(f: Pin<&mut F>) -> bool {
        let mut f = Some(f);
        std::future::poll_fn(|cx| Poll::Ready(f.take().is_some_and(|f| f.poll(cx).is_pending())))
            .await
    }

    fn text(r: &Response) -> &str {
        use super::super::bindings::types::ContentBlock;
        match r {
            Response::Completed(t) => match t.content.first() {
                Some(ContentBlock::Text(t)) => &t.text,
                other => panic!("expected a text block, got {other:?}"),
            },
            Response::Elicit(e) => panic!("unexpected elicitation {e:?}"),
        }
    }

    async fn kv(pool: &RouterPool, session: Option<&str>, tool: &str, args: &str) -> String {
        match pool
            .caller(session)
            .call_tool_within(tool, args, DEADLINE)
            .await
        {
            Ok(r) => text(&r).to_string(),
            Err(CallError::Tool(e)) => format!("tool error: {e:?}"),
            Err(e) => panic!("{tool} {args}: {e}"),
        }
    }

    #[test]
    fn a_sessions_calls_run_one_at_a_time_in_arrival_order_without_holding_up_others() {
        let pool = pool("chaos", 4, 64, 8);
        let done = Rc::new(RefCell::new(Vec::new()));
        on_shard(async {
            let mut tasks = Vec::new();
            // Session `a`: a slow call, then quick ones that must wait for it
            // on a's own instance (4 shared instances would run them at once).
            for i in 0..9 {
                let (pool, done) = (pool.clone(), done.clone());
                tasks.push(monoio::spawn(async move {
                    let (tool, args) = if i == 0 {
                        ("sleep", r#"{"ms":200}"#)
                    } else {
                        ("print", PRINT)
                    };
                    let r = pool
                        .caller(Some("a"))
                        .call_tool_within(tool, args, DEADLINE);
                    r.await.expect("session a's call");
                    done.borrow_mut().push(format!("a{i}"));
                }));
            }
            let (p, d) = (pool.clone(), done.clone());
            tasks.push(monoio::spawn(async move {
                let r = p
                    .caller(Some("b"))
                    .call_tool_within("print", PRINT, DEADLINE);
                r.await.expect("session b's call");
                d.borrow_mut().push("b".to_string());
            }));
            for t in tasks {
                t.await;
            }
        });
        let want: Vec<String> = std::iter::once("b".to_string())
            .chain((0..9).map(|i| format!("a{i}")))
            .collect();
        assert_eq!(*done.borrow(), want);
        let s = pool.stats();
        assert_eq!((s.sessions, s.queued, s.calls), (2, 0, 10));
    }

    #[test]
    fn a_cancelled_waiter_leaves_the_sessions_queue_in_order() {
        let pool = pool("chaos", 1, 8, 4);
        on_shard(async {
            let a = pool.caller(Some("a"));
            let mut slow = std::pin::pin!(a.call_tool_within("sleep", r#"{"ms":100}"#, DEADLINE));
            assert!(pending(slow.as_mut()).await);
            let mut x = Box::pin(a.call_tool_within("print", PRINT, DEADLINE));
            let mut y = std::pin::pin!(a.call_tool_within("print", PRINT, DEADLINE));
            assert!(pending(x.as_mut()).await);
            assert!(pending(y.as_mut()).await);
            assert_eq!(pool.stats().queued, 2);
            drop(x);
            assert_eq!(pool.stats().queued, 1);
            slow.await.expect("slow call");
            y.await.expect("the waiter behind the cancelled one");
        });
        assert_eq!(pool.stats().queued, 0);
    }

    #[test]
    fn sessions_keep_their_own_state_apart_from_each_other_and_the_shared_instances() {
        let pool = pool("kv", 4, 16, 8);
        on_shard(async {
            for s in ["a", "b", "c"] {
                let put = format!(r#"{{"key":"{s}","value":"{s}"}}"#);
                assert_eq!(kv(&pool, Some(s), "put", &put).await, format!("stored {s}"));
            }
            for s in ["a", "b", "c"] {
                assert_eq!(kv(&pool, Some(s), "list", "{}").await, s);
                let get = format!(r#"{{"key":"{s}"}}"#);
                assert_eq!(kv(&pool, Some(s), "get", &get).await, format!("\"{s}\""));
            }
            assert_eq!(kv(&pool, None, "list", "{}").await, "");
        });
        assert_eq!(pool.stats().sessions, 3);
    }

    #[test]
    fn at_the_cap_a_new_session_evicts_the_least_recently_used_idle_one() {
        let pool = pool("kv", 1, 16, 2);
        on_shard(async {
            kv(&pool, Some("a"), "put", r#"{"key":"k","value":1}"#).await;
            kv(&pool, Some("b"), "put", r#"{"key":"k","value":2}"#).await;
            assert_eq!(kv(&pool, Some("a"), "get", r#"{"key":"k"}"#).await, "1");
            // b is now the least recently used: c takes its instance.
            kv(&pool, Some("c"), "put", r#"{"key":"k","value":3}"#).await;
            let s = pool.stats();
            assert_eq!((s.sessions, s.sessions_evicted), (2, 1));
            assert_eq!(kv(&pool, Some("a"), "get", r#"{"key":"k"}"#).await, "1");
            assert_eq!(kv(&pool, Some("c"), "get", r#"{"key":"k"}"#).await, "3");
            // b comes back to a fresh instance: its state was dropped.
            let b = kv(&pool, Some("b"), "get", r#"{"key":"k"}"#).await;
            assert!(b.contains("NotFound"), "{b}");
        });
        assert_eq!(pool.stats().sessions_evicted, 2);
    }

    #[test]
    fn at_the_cap_with_every_session_busy_a_new_session_is_refused_as_overloaded() {
        let pool = pool("chaos", 1, 1, 1);
        on_shard(async {
            let a = pool.caller(Some("a"));
            let mut slow = std::pin::pin!(a.call_tool_within("sleep", r#"{"ms":100}"#, DEADLINE));
            assert!(pending(slow.as_mut()).await);
            let e = pool
                .caller(Some("b"))
                .call_tool_within("print", PRINT, DEADLINE)
                .await
                .unwrap_err();
            assert!(matches!(e, CallError::SessionsFull), "{e:?}");
            assert!(e.is_retryable());
            // The one session slot is busy (so new sessions are refused),
            // the shared instance idle: `mcp_router_instances` shows each.
            let s = pool.stats();
            assert_eq!((s.instances, s.idle, s.busy), (1, 1, 0));
            assert_eq!((s.session_slots, s.sessions_busy), (1, 1));
            // a's own queue holds `queue_depth` (1) waiter; the next is refused.
            let mut queued = std::pin::pin!(a.call_tool_within("print", PRINT, DEADLINE));
            assert!(pending(queued.as_mut()).await);
            let e = a
                .call_tool_within("print", PRINT, DEADLINE)
                .await
                .unwrap_err();
            assert!(matches!(e, CallError::Overloaded), "{e:?}");
            slow.await.expect("slow call");
            queued.await.expect("queued call");
            // Nothing in flight now: b evicts a.
            pool.caller(Some("b"))
                .call_tool_within("print", PRINT, DEADLINE)
                .await
                .expect("b after a went idle");
        });
        let s = pool.stats();
        assert_eq!((s.sessions, s.sessions_evicted, s.overloaded), (1, 1, 2));
        assert_eq!((s.instances, s.idle, s.busy), (1, 1, 0));
        assert_eq!((s.session_slots, s.sessions_busy), (1, 0));
    }

    #[test]
    fn idle_sessions_expire_and_come_back_empty() {
        let pool = pool("kv", 1, 16, 4);
        on_shard(async {
            kv(&pool, Some("a"), "put", r#"{"key":"k","value":1}"#).await;
            assert_eq!(pool.expire_sessions(Instant::now()), 0);
            let later = Instant::now() + Duration::from_secs(61);
            assert_eq!(pool.expire_sessions(later), 1);
            assert_eq!(pool.stats().sessions, 0);
            let a = kv(&pool, Some("a"), "get", r#"{"key":"k"}"#).await;
            assert!(a.contains("NotFound"), "{a}");
        });
    }

    #[test]
    fn a_session_whose_instance_faulted_is_served_by_a_fresh_one() {
        let pool = pool("chaos", 1, 16, 4);
        on_shard(async {
            let a = pool.caller(Some("a"));
            let e = a
                .call_tool_within("trap", "{}", DEADLINE)
                .await
                .unwrap_err();
            assert!(matches!(e, CallError::Trap(_)), "{e:?}");
            a.call_tool_within("print", PRINT, DEADLINE)
                .await
                .expect("served after the fault");
        });
        let s = pool.stats();
        assert_eq!((s.sessions, s.faults, s.replaced), (1, 1, 1));
    }
}
