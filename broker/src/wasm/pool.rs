//! A shard's pool of instances of one router.
//!
//! Each instance serves one call at a time. A caller takes an idle instance
//! or, when all are busy, waits in a bounded FIFO queue; when the queue is
//! full it gets [`CallError::Overloaded`] at once. A released instance is
//! handed straight to the oldest waiter, so a newcomer never overtakes it.
//!
//! # Invariants
//! - Single-threaded: the pool is `!Send` and lives on one shard thread; its
//!   state is in `Cell`/`RefCell`, borrowed only between awaits, never held
//!   across one. No locks.
//! - Runtime-agnostic: only `std` futures and wakers; any executor drives it.
//! - An idle instance exists only while no caller waits.
//! - An instance that faulted, or whose call was cancelled mid-flight, is
//!   never reused: its store is dropped and a fresh one is instantiated from
//!   the shared `InstancePre`.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
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
use super::host::{Instance, Router, RouterMeta, drive, settle};

/// Counters of one pool, for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Instances in the pool (`instances_per_shard`).
    pub instances: u32,
    /// Instances free for the next call.
    pub idle: u32,
    /// Instances serving (or handed to) a call.
    pub busy: u32,
    /// Callers waiting for an instance.
    pub queued: u32,
    /// Calls that ran in an instance.
    pub calls: u64,
    /// Calls that ended in a fault of the instance.
    pub faults: u64,
    /// Instances discarded (fault or cancelled call) and replaced.
    pub replaced: u64,
    /// Calls refused because the queue was full.
    pub overloaded: u64,
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

struct Inner {
    router: Arc<Router>,
    size: u32,
    queue_depth: usize,
    idle: RefCell<Vec<Slot>>,
    waiters: RefCell<VecDeque<Rc<Waiter>>>,
    busy: Cell<u32>,
    calls: Cell<u64>,
    faults: Cell<u64>,
    replaced: Cell<u64>,
    overloaded: Cell<u64>,
}

impl Inner {
    /// Gives a slot back: to the oldest waiter if any, else to the idle list.
    fn release(&self, slot: Slot) {
        let waiter = self.waiters.borrow_mut().pop_front();
        match waiter {
            Some(w) => {
                *w.handed.borrow_mut() = Some(slot);
                let waker = w.waker.borrow_mut().take();
                if let Some(waker) = waker {
                    waker.wake();
                }
            }
            None => {
                self.busy.set(self.busy.get() - 1);
                self.idle.borrow_mut().push(slot);
            }
        }
    }

    fn count(cell: &Cell<u64>) {
        cell.set(cell.get() + 1);
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
    /// `queue_depth`). Instances are made on first use; see [`Self::warm`].
    pub fn new(router: Arc<Router>) -> Self {
        let size = router.spec.instances_per_shard.max(1);
        let queue_depth = router.spec.queue_depth as usize;
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
                replaced: Cell::new(0),
                overloaded: Cell::new(0),
            }),
        }
    }

    /// Instantiates every idle slot that has no instance yet, so that the
    /// first calls do not pay for instantiation.
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
            Lease::new(self.inner.clone(), slot).fill().await?;
        }
        Ok(())
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
        PoolStats {
            instances: i.size,
            idle: i.idle.borrow().len() as u32,
            busy: i.busy.get(),
            queued: i.waiters.borrow().len() as u32,
            calls: i.calls.get(),
            faults: i.faults.get(),
            replaced: i.replaced.get(),
            overloaded: i.overloaded.get(),
        }
    }

    /// `call-tool` with the router's default deadline. The router's
    /// `tool-error` comes back as [`CallError::Tool`] (not a fault).
    pub async fn call_tool(&self, tool: &str, arguments: &str) -> Result<Response, CallError> {
        self.call_tool_within(tool, arguments, self.inner.router.spec.call_deadline)
            .await
    }

    /// `call-tool` with its own deadline.
    pub async fn call_tool_within(
        &self,
        tool: &str,
        arguments: &str,
        deadline: Duration,
    ) -> Result<Response, CallError> {
        let max = self.max_result_bytes();
        let response = self
            .run(deadline, async |i| i.call_tool(tool, arguments, max).await)
            .await?
            .map_err(CallError::Tool)?;
        if self.inner.router.spec.validate_json {
            check_response(&response)?;
        }
        Ok(response)
    }

    /// `read-resource`.
    pub async fn read_resource(&self, uri: &str) -> Result<ReadResourceResult, CallError> {
        let max = self.max_result_bytes();
        self.run(self.deadline(), async |i| i.read_resource(uri, max).await)
            .await?
            .map_err(CallError::Resource)
    }

    /// `get-prompt`. Messages may hold `{{arg}}` placeholders for the broker
    /// to fill (the WIT passes no arguments).
    pub async fn get_prompt(&self, name: &str) -> Result<GetPromptResult, CallError> {
        let max = self.max_result_bytes();
        self.run(self.deadline(), async |i| i.get_prompt(name, max).await)
            .await?
            .map_err(CallError::Prompt)
    }

    /// `complete`.
    pub async fn complete(
        &self,
        request: &CompletionRequest,
    ) -> Result<CompletionResponse, CallError> {
        let max = self.max_result_bytes();
        self.run(self.deadline(), async |i| i.complete(request, max).await)
            .await?
            .map_err(CallError::Completion)
    }

    /// `list-resources` of one instance, now. A stateful router's list is
    /// per instance (see the `kv` router); [`RouterMeta::resources`] is the
    /// list of a fresh instance.
    pub async fn list_resources(&self) -> Result<Vec<McpResource>, CallError> {
        self.run(self.deadline(), async |i| {
            i.bindings
                .wasix_mcp_router()
                .call_list_resources(&mut i.store)
                .await
        })
        .await
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
        deadline: Duration,
        f: impl AsyncFnOnce(&mut Instance) -> wasmtime::Result<T>,
    ) -> Result<T, CallError> {
        let mut lease = self.acquire().await?;
        let at = Instant::now() + deadline;
        let inner = self.inner.clone();
        let inst = lease.ready().await?;
        inst.begin(at);
        Inner::count(&inner.calls);
        let r = drive(&inner.router.shared.tokio, at, f(&mut *inst)).await;
        let r = settle(deadline, &inst.store, r);
        lease.finish(r).await
    }

    fn acquire(&self) -> Acquire {
        let inner = &self.inner;
        let slot = inner.idle.borrow_mut().pop();
        if let Some(slot) = slot {
            inner.busy.set(inner.busy.get() + 1);
            return Acquire::Ready(Some(Lease::new(inner.clone(), slot)));
        }
        let mut waiters = inner.waiters.borrow_mut();
        if waiters.len() >= inner.queue_depth {
            Inner::count(&inner.overloaded);
            return Acquire::Refused;
        }
        let waiter = Rc::new(Waiter::default());
        waiters.push_back(waiter.clone());
        Acquire::Waiting(WaitFor {
            pool: inner.clone(),
            waiter,
        })
    }
}

/// The three ways to get an instance.
enum Acquire {
    Ready(Option<Lease>),
    Refused,
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
            Acquire::Refused => Poll::Ready(Err(CallError::Overloaded)),
            Acquire::Waiting(w) => Pin::new(w).poll(cx),
        }
    }
}

/// A caller queued for an instance.
struct WaitFor {
    pool: Rc<Inner>,
    waiter: Rc<Waiter>,
}

impl Future for WaitFor {
    type Output = Result<Lease, CallError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let handed = self.waiter.handed.borrow_mut().take();
        match handed {
            Some(slot) => Poll::Ready(Ok(Lease::new(self.pool.clone(), slot))),
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
        self.pool
            .waiters
            .borrow_mut()
            .retain(|w| !Rc::ptr_eq(w, &self.waiter));
        let handed = self.waiter.handed.borrow_mut().take();
        if let Some(slot) = handed {
            self.pool.release(slot);
        }
    }
}

/// An instance taken from the pool for one call; returned on drop.
struct Lease {
    pool: Rc<Inner>,
    slot: Option<Slot>,
    /// Set while a guest call is in flight: dropping the lease then means the
    /// call was cancelled halfway and the instance's state is unknown.
    armed: bool,
}

impl Lease {
    fn new(pool: Rc<Inner>, slot: Slot) -> Self {
        Self {
            pool,
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
            slot.0 = Some(Box::new(self.pool.router.instantiate().await?));
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

    /// Ends the call: on a fault the instance is discarded and replaced.
    async fn finish<T>(&mut self, r: Result<T, CallError>) -> Result<T, CallError> {
        self.armed = false;
        let e = match r {
            Ok(v) => return Ok(v),
            Err(e) => e,
        };
        if let Some(slot) = self.slot.as_mut() {
            Inner::count(&self.pool.faults);
            Inner::count(&self.pool.replaced);
            slot.0 = None;
            // Replace now, so the next caller finds a ready instance; if this
            // fails the slot stays empty and the next caller retries.
            if let Ok(inst) = self.pool.router.instantiate().await {
                slot.0 = Some(Box::new(inst));
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
            self.pool.release(slot);
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
    serde_json::from_str::<serde::de::IgnoredAny>(text)
        .map(drop)
        .map_err(|e| CallError::MalformedOutput {
            field,
            error: e.to_string(),
        })
}
