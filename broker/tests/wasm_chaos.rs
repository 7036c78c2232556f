//! Reliability of the pool against the `chaos` router: every misbehaviour
//! ends in its documented error, the faulted instance is replaced and the
//! next call on the same pool succeeds; a guest never stalls its shard; the
//! wait queue is bounded.

#[path = "fixtures/support.rs"]
mod support;

use std::cell::Cell;
use std::future::Future;
use std::pin::pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use mcp_broker::wasm::types::{Response, ToolError};
use mcp_broker::wasm::{CallError, RouterPool};
use support::{bundled, first_text, load, load_bundled, on_shard};

/// A chaos pool of one instance, so "the next call" runs where the fault was.
fn chaos_pool() -> RouterPool {
    let mut spec = bundled("chaos");
    spec.instances_per_shard = 1;
    spec.queue_depth = 4;
    // Small, so that `alloc` reaches the limit in a few steps.
    spec.max_memory_bytes = 16 << 20;
    // The router's own deadline, so that a call cut at it is the router's
    // fault (a shorter one is the client's).
    spec.call_deadline = Duration::from_millis(300);
    RouterPool::new(load(&spec))
}

/// Yields to the executor once, behind every task already queued. The wake
/// comes from another thread after this poll returned: monoio re-runs a task
/// that wakes itself during its poll at once, which would starve the others.
async fn yield_now() {
    let mut yielded = false;
    std::future::poll_fn(|cx| {
        if yielded {
            Poll::Ready(())
        } else {
            yielded = true;
            let waker = cx.waker().clone();
            std::thread::spawn(move || waker.wake());
            Poll::Pending
        }
    })
    .await;
}

/// Yields until `cond` holds; bounded, panics when it never does.
async fn yield_until(what: &str, cond: impl Fn() -> bool) {
    for _ in 0..1_000 {
        if cond() {
            return;
        }
        yield_now().await;
    }
    panic!("never happened: {what}");
}

/// Asserts the fault, that the instance was replaced, and that the next call
/// on the same pool succeeds.
fn assert_fault_then_recovery(
    pool: &RouterPool,
    tool: &str,
    args: &str,
    check: fn(&CallError) -> bool,
) {
    let before = pool.stats();
    on_shard(async {
        let e = pool
            .call_tool_within(tool, args, Duration::from_millis(300))
            .await
            .unwrap_err();
        assert!(check(&e), "`{tool}` ended in {e:?}");
        assert!(e.is_fault() && !e.is_retryable(), "{e:?}");
        let after = pool.stats();
        assert_eq!(
            after.replaced,
            before.replaced + 1,
            "`{tool}`: instance replaced"
        );
        assert_eq!(after.faults, before.faults + 1);
        let next = pool
            .call_tool("elicit", "{}")
            .await
            .expect("next call succeeds");
        assert!(matches!(next, Response::Elicit(_)));
    });
    let s = pool.stats();
    assert_eq!(
        (s.idle, s.busy, s.queued),
        (1, 0, 0),
        "pool back to rest after `{tool}`"
    );
}

#[test]
fn trap_ends_in_trap_and_the_pool_recovers() {
    assert_fault_then_recovery(&chaos_pool(), "trap", "{}", |e| {
        matches!(e, CallError::Trap(_))
    });
}

#[test]
fn panic_is_a_trap_and_the_pool_recovers() {
    assert_fault_then_recovery(&chaos_pool(), "panic", "{}", |e| {
        matches!(e, CallError::Trap(_))
    });
}

#[test]
fn endless_loop_ends_at_the_deadline_and_the_pool_recovers() {
    assert_fault_then_recovery(
        &chaos_pool(),
        "loop",
        "{}",
        |e| matches!(e, CallError::DeadlineExceeded(d) if *d == Duration::from_millis(300)),
    );
}

#[test]
fn unbounded_allocation_ends_in_out_of_memory_and_the_pool_recovers() {
    assert_fault_then_recovery(&chaos_pool(), "alloc", "{}", |e| {
        matches!(e, CallError::OutOfMemory)
    });
}

#[test]
fn deep_recursion_ends_in_stack_overflow_and_the_pool_recovers() {
    assert_fault_then_recovery(&chaos_pool(), "recurse", "{}", |e| {
        matches!(e, CallError::StackOverflow)
    });
}

#[test]
fn spin_past_the_deadline_ends_in_deadline_exceeded() {
    assert_fault_then_recovery(&chaos_pool(), "spin", r#"{"ms":60000}"#, |e| {
        matches!(e, CallError::DeadlineExceeded(_))
    });
}

#[test]
fn wasi_sleep_past_the_deadline_is_cut_by_the_host_timer() {
    // The guest is blocked in a WASI poll, not running: only the host-side
    // timer can end it.
    let started = Instant::now();
    assert_fault_then_recovery(&chaos_pool(), "sleep", r#"{"ms":60000}"#, |e| {
        matches!(e, CallError::DeadlineExceeded(_))
    });
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "cut long before the sleep ends"
    );
}

/// A call cut at a deadline shorter than the router's own (the client's)
/// replaces its instance but is no fault of the router's: a client with
/// short deadlines could otherwise fire McpRouterFaulting. The router's
/// own deadline is its fault.
#[test]
fn a_clients_deadline_is_no_fault_of_the_router() {
    let pool = chaos_pool();
    let e = on_shard(pool.call_tool_within("spin", r#"{"ms":60000}"#, Duration::from_millis(50)))
        .unwrap_err();
    assert!(matches!(e, CallError::DeadlineExceeded(_)), "{e:?}");
    let s = pool.stats();
    assert_eq!((s.faults, s.replaced), (0, 1));
    let e = on_shard(pool.call_tool("spin", r#"{"ms":60000}"#)).unwrap_err();
    assert!(matches!(e, CallError::DeadlineExceeded(_)), "{e:?}");
    let s = pool.stats();
    assert_eq!((s.faults, s.replaced), (1, 2));
}

#[test]
fn malformed_structured_content_is_refused_without_replacing_the_instance() {
    let pool = chaos_pool();
    on_shard(async {
        let e = pool.call_tool("malformed", "{}").await.unwrap_err();
        assert!(
            matches!(
                e,
                CallError::MalformedOutput {
                    field: "structured-content",
                    ..
                }
            ),
            "{e:?}"
        );
        assert!(pool.call_tool("elicit", "{}").await.is_ok());
    });
    let s = pool.stats();
    assert_eq!(
        (s.faults, s.replaced),
        (1, 0),
        "a malformed answer is the router's fault (mcp_router_faults_total, \
         which McpRouterFaulting reads), though its instance stays"
    );
}

#[test]
fn tool_error_is_a_normal_outcome() {
    let pool = chaos_pool();
    let e = on_shard(pool.call_tool("fail", "{}")).unwrap_err();
    assert!(
        matches!(e, CallError::Tool(ToolError::ExecutionError(_))),
        "{e:?}"
    );
    assert!(!e.is_fault() && !e.is_retryable());
    assert_eq!(pool.stats().replaced, 0);
}

#[test]
fn elicit_returns_an_elicitation_request() {
    let pool = chaos_pool();
    match on_shard(pool.call_tool("elicit", "{}")).unwrap() {
        Response::Elicit(e) => {
            let schema: serde_json::Value = serde_json::from_str(&e.schema).unwrap();
            assert_eq!(schema["type"], "object");
            assert!(!e.message.is_empty());
        }
        Response::Completed(r) => panic!("expected elicitation, got {r:?}"),
    }
}

#[test]
fn short_sleep_and_spin_complete() {
    let pool = chaos_pool();
    on_shard(async {
        let t = Instant::now();
        let r = pool.call_tool("sleep", r#"{"ms":30}"#).await.unwrap();
        assert!(first_text(&r).starts_with("slept"));
        assert!(t.elapsed() >= Duration::from_millis(30));
        let t = Instant::now();
        let r = pool.call_tool("spin", r#"{"ms":30}"#).await.unwrap();
        assert!(first_text(&r).starts_with("spun"));
        assert!(t.elapsed() >= Duration::from_millis(30));
    });
    assert_eq!(pool.stats().replaced, 0);
}

#[test]
fn spinning_guest_does_not_stall_other_calls_on_the_same_thread() {
    let chaos = chaos_pool();
    let echo = RouterPool::new(load_bundled("echo", 1, 0));
    on_shard(async move {
        let done = Rc::new(Cell::new(false));
        let spinner = {
            let (chaos, done) = (chaos.clone(), done.clone());
            monoio::spawn(async move {
                let r = chaos
                    .call_tool_within("loop", "{}", Duration::from_secs(2))
                    .await;
                done.set(true);
                r
            })
        };
        yield_until("the loop call is running", || chaos.stats().calls == 1).await;
        let started = Instant::now();
        for i in 0..50 {
            let args = format!(r#"{{"i":{i}}}"#);
            let r = echo.call_tool("echo", &args).await.unwrap();
            assert_eq!(first_text(&r), args);
        }
        assert!(
            !done.get(),
            "50 echo calls finished while the guest was still spinning"
        );
        assert!(started.elapsed() < Duration::from_secs(2));
        let e = spinner.await.unwrap_err();
        assert!(matches!(e, CallError::DeadlineExceeded(_)), "{e:?}");
    });
}

#[test]
fn wasi_sleep_does_not_block_the_shard_thread() {
    let chaos = chaos_pool();
    let echo = RouterPool::new(load_bundled("echo", 1, 0));
    on_shard(async move {
        let done = Rc::new(Cell::new(false));
        let started = Instant::now();
        let sleeper = {
            let (chaos, done) = (chaos.clone(), done.clone());
            monoio::spawn(async move {
                let r = chaos.call_tool("sleep", r#"{"ms":200}"#).await;
                done.set(true);
                r
            })
        };
        yield_until("the sleep call is running", || chaos.stats().calls == 1).await;
        for i in 0..50 {
            let args = format!(r#"{{"i":{i}}}"#);
            assert_eq!(
                first_text(&echo.call_tool("echo", &args).await.unwrap()),
                args
            );
        }
        assert!(!done.get(), "echo calls completed while the guest slept");
        let r = sleeper
            .await
            .expect("the sleep completes, woken from the WASI runtime");
        assert!(first_text(&r).starts_with("slept"));
        assert!(started.elapsed() >= Duration::from_millis(200));
    });
}

#[test]
fn full_queue_refuses_with_overloaded_instead_of_growing() {
    let mut spec = bundled("chaos");
    spec.instances_per_shard = 1;
    spec.queue_depth = 1;
    let pool = RouterPool::new(load(&spec));
    on_shard(async move {
        let busy = {
            let pool = pool.clone();
            monoio::spawn(async move { pool.call_tool("sleep", r#"{"ms":100}"#).await })
        };
        yield_until("the instance is busy", || pool.stats().busy == 1).await;
        let queued = {
            let pool = pool.clone();
            monoio::spawn(async move { pool.call_tool("elicit", "{}").await })
        };
        yield_until("one caller waits", || pool.stats().queued == 1).await;
        let e = pool.call_tool("elicit", "{}").await.unwrap_err();
        assert!(matches!(e, CallError::Overloaded), "{e:?}");
        assert!(e.is_retryable());
        let s = pool.stats();
        assert_eq!((s.busy, s.queued, s.overloaded), (1, 1, 1));
        assert!(busy.await.is_ok());
        assert!(
            matches!(queued.await, Ok(Response::Elicit(_))),
            "the queued caller is served"
        );
        let s = pool.stats();
        assert_eq!((s.idle, s.busy, s.queued), (1, 0, 0));
    });
}

#[test]
fn cancelled_call_discards_its_instance() {
    let pool = chaos_pool();
    // Instantiate first: on a loaded machine instantiation itself can cross
    // an epoch tick and yield, and a call dropped before it started rightly
    // keeps its fresh instance. Warmed, the first poll is inside the guest.
    on_shard(pool.warm()).expect("warm");
    {
        let mut call = pin!(pool.call_tool("sleep", r#"{"ms":60000}"#));
        let mut cx = Context::from_waker(Waker::noop());
        assert!(
            call.as_mut().poll(&mut cx).is_pending(),
            "the guest is sleeping"
        );
        assert_eq!(pool.stats().busy, 1);
    }
    let s = pool.stats();
    assert_eq!(
        (s.busy, s.idle, s.replaced),
        (0, 1, 1),
        "dropped mid-call: instance discarded"
    );
    assert!(on_shard(pool.call_tool("elicit", "{}")).is_ok());
}

#[test]
fn waiting_callers_are_served_in_arrival_order() {
    let mut spec = bundled("chaos");
    spec.instances_per_shard = 1;
    spec.queue_depth = 3;
    let pool = RouterPool::new(load(&spec));
    on_shard(async move {
        pool.warm().await.expect("warm");
        let order = Rc::new(std::cell::RefCell::new(Vec::new()));
        let busy = {
            let pool = pool.clone();
            monoio::spawn(async move { pool.call_tool("sleep", r#"{"ms":50}"#).await })
        };
        yield_until("the instance is busy", || pool.stats().busy == 1).await;
        let mut waiters = Vec::new();
        for id in 1..=3 {
            let (caller, order) = (pool.clone(), order.clone());
            waiters.push(monoio::spawn(async move {
                let r = caller.call_tool("elicit", "{}").await;
                order.borrow_mut().push(id);
                r
            }));
            yield_until("the caller queues", || pool.stats().queued == id).await;
        }
        assert!(busy.await.is_ok());
        for w in waiters {
            assert!(w.await.is_ok());
        }
        assert_eq!(*order.borrow(), [1, 2, 3]);
        let s = pool.stats();
        assert_eq!((s.idle, s.busy, s.queued, s.overloaded), (1, 0, 0, 0));
    });
}

#[test]
fn warmed_pool_keeps_every_instance_and_serves_at_once() {
    let mut spec = bundled("chaos");
    spec.instances_per_shard = 3;
    let pool = RouterPool::new(load(&spec));
    on_shard(async {
        pool.warm().await.expect("warm");
        pool.warm().await.expect("warming twice is harmless");
        let s = pool.stats();
        assert_eq!((s.instances, s.idle, s.busy, s.calls), (3, 3, 0, 0));
        assert!(pool.call_tool("elicit", "{}").await.is_ok());
    });
}

// `never_waits` routers: the same component called synchronously, on the
// shard's own stack. Every fault still ends in its documented error and
// the pool recovers; what could wait is refused.

/// [`chaos_pool`], configured `never_waits`.
fn never_waits_pool() -> RouterPool {
    let mut spec = bundled("chaos");
    spec.instances_per_shard = 1;
    spec.queue_depth = 4;
    // Smaller still than `chaos_pool`'s: `alloc` must reach the limit well
    // within the 10 ms such a call may run, on a busy test machine too.
    spec.max_memory_bytes = 4 << 20;
    spec.never_waits = true;
    RouterPool::new(load(&spec))
}

#[test]
fn never_waits_faults_end_as_they_do_on_a_fiber() {
    let pool = never_waits_pool();
    assert_fault_then_recovery(&pool, "trap", "{}", |e| matches!(e, CallError::Trap(_)));
    assert_fault_then_recovery(&pool, "alloc", "{}", |e| {
        matches!(e, CallError::OutOfMemory)
    });
    // On the caller's stack, not a fiber's: the wasm stack bound still holds.
    assert_fault_then_recovery(&pool, "recurse", "{}", |e| {
        matches!(e, CallError::StackOverflow)
    });
}

#[test]
fn never_waits_loop_traps_at_the_short_run_limit() {
    // The call asks for 300 ms; a call that holds its shard gets at most
    // NEVER_WAITS_MAX_RUN. The clock starts once the pool is loaded: on a
    // busy machine compiling the component alone took longer than 300 ms.
    let pool = never_waits_pool();
    let started = Instant::now();
    assert_fault_then_recovery(
        &pool,
        "loop",
        "{}",
        |e| matches!(e, CallError::DeadlineExceeded(d) if *d == mcp_broker::wasm::NEVER_WAITS_MAX_RUN),
    );
    assert!(
        started.elapsed() < Duration::from_millis(300),
        "ended before the call's own deadline: {:?}",
        started.elapsed()
    );
}

#[test]
fn never_waits_sleep_traps_naming_the_setting() {
    let pool = never_waits_pool();
    assert_fault_then_recovery(
        &pool,
        "sleep",
        r#"{"ms":1}"#,
        |e| matches!(e, CallError::Trap(m) if m.contains("never_waits")),
    );
    // Reading the clock is not waiting, nor is writing to stdio (WASI's
    // synchronous streams).
    on_shard(async {
        let r = pool.call_tool("spin", r#"{"ms":2}"#).await.unwrap();
        assert!(first_text(&r).starts_with("spun"), "{r:?}");
        pool.call_tool("print", r#"{"text":"to stdio"}"#)
            .await
            .unwrap();
        let r = pool.call_tool("fail", "{}").await.unwrap_err();
        assert!(matches!(r, CallError::Tool(_)), "{r:?}");
    });
}

#[test]
fn never_waits_answers_as_the_fiber_path_does() {
    let mut spec = bundled("echo");
    let fiber = RouterPool::new(load(&spec));
    spec.never_waits = true;
    let sync = RouterPool::new(load(&spec));
    let args = r#"{"text":"héllo","n":[1,2,3]}"#;
    on_shard(async {
        let a = fiber.call_tool("echo", args).await.unwrap();
        let b = sync.call_tool("echo", args).await.unwrap();
        assert_eq!(format!("{a:?}"), format!("{b:?}"));
    });
}

#[test]
fn never_waits_refuses_a_directory_grant() {
    let mut spec = bundled("chaos");
    spec.never_waits = true;
    spec.grants.read_only_dirs = vec![mcp_broker::wasm::DirGrant {
        host: std::env::temp_dir(),
        guest: "/data".into(),
    }];
    let e = support::host().load(&spec).unwrap_err().to_string();
    assert!(e.contains("never_waits") && e.contains("file reads"), "{e}");
}

#[test]
fn never_waits_writes_granted_stdio_synchronously() {
    let mut spec = bundled("chaos");
    spec.never_waits = true;
    spec.grants.stdio_to_stderr = true;
    let pool = RouterPool::new(load(&spec));
    on_shard(async {
        let r = pool
            .call_tool("print", r#"{"text":"never_waits stdio test line"}"#)
            .await
            .unwrap();
        assert!(matches!(r, Response::Completed(_)), "{r:?}");
    });
    assert_eq!(pool.stats().replaced, 0);
}
