//! Idle polling (`[broker] idle_poll`): a shard that has just been given
//! work keeps its CPU for a short window instead of sleeping in the kernel
//! at once.
//!
//! Why: a shard's thread that runs out of work waits in `io_uring_enter`,
//! and its CPU goes idle. On a virtual machine an idle vCPU halts; the next
//! request then wakes it with an interrupt the hypervisor delivers, and the
//! halt, the wake-up and the caches cooled meanwhile cost several µs of
//! every request that comes alone (`bench/NOTES.md`, "idle polling"). At
//! open-loop rates, where a wake-up brings one or two frames, that cost is
//! most of a request's CPU. With a window, a shard that served something
//! less than `idle_poll` ago does not wait: it goes round its loop, each
//! turn one non-blocking `io_uring_enter` that collects completions, so the
//! next request finds it running. Once nothing has arrived for a whole
//! window it sleeps as before, so an idle broker costs nothing.
//!
//! How: [`run`] is one task per shard. While it polls it yields after every
//! turn, so the runtime never finds its queue empty and never blocks; the
//! reads of every edge call [`note_activity`], which restarts the window
//! (and wakes the poller when it sleeps). Each turn yields through the
//! shard's [`YieldQueue`], as a busy frame reader does: monoio puts a task
//! that wakes itself while it runs back at the *front* of its queue, so a
//! poller that did so would run again at once, ahead of the very tasks its
//! turn is for, until its window ran out (measured: every answer held back
//! by the window); the queue wakes it behind everything runnable instead.
//! Every turn also calls `sched_yield`: a polling shard is a runnable
//! thread, and whatever else became runnable on its CPU (a kernel worker,
//! another of the broker's threads) would otherwise wait for the end of
//! its time slice (measured: p99 of several ms). Two things happen only
//! when monoio parks — its timers advance and wake-ups sent from other
//! threads are taken in — so the poller lets the runtime park once every
//! [`PARK_EVERY`] even under constant load: timers and hand-offs from
//! other shards are late by at most that much.
//!
//! The ring must not use `DEFER_TASKRUN` with a window: there, completions
//! are posted only by an `io_uring_enter` that waits for events, which a
//! polling turn does not make. `shard::Ring::for_config` sets the ring up with
//! `COOP_TASKRUN` instead, whose completions any `io_uring_enter` posts
//! on its way out, without interrupting the thread.
//!
//! The cost: up to one window of CPU after each burst of work, all of it
//! at the lowest priority of the shard's own loop (every ready task runs
//! first) and yielded to any other thread that wants the CPU. The shard's
//! `mcp_shard_idle_poll_seconds_total` counts the windows' time. `idle_poll = "0s"`, the default, turns it off: the poller is not
//! started and [`note_activity`] is one thread-local read.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

pub use crate::local::YieldQueue;

/// Longest stretch of polling without one real park of the runtime: what
/// timers (monoio advances them only when it parks; its wheel ticks in
/// milliseconds anyway) and wake-ups from other threads wait for at most.
pub const PARK_EVERY: Duration = Duration::from_micros(200);

/// The current thread's poller, if it runs one.
struct State {
    /// Bumped by every [`note_activity`].
    activity: Cell<u64>,
    /// Whether a poller runs on this thread ([`note_activity`] does
    /// nothing on threads without one).
    enabled: Cell<bool>,
    /// The poller's waker while it sleeps.
    sleeping: Cell<Option<Waker>>,
    /// Turns polled so far (for the tests).
    turns: Cell<u64>,
}

thread_local! {
    static STATE: State = const {
        State {
            activity: Cell::new(0),
            enabled: Cell::new(false),
            sleeping: Cell::new(None),
            turns: Cell::new(0),
        }
    };
}

/// Work just arrived on this thread (a read brought bytes): the poller's
/// window starts again, and a sleeping poller wakes.
#[inline]
pub fn note_activity() {
    // `try_with`: never a panic for a read that completes while the thread
    // is tearing down its locals.
    let _ = STATE.try_with(|s| {
        if s.enabled.get() {
            s.activity.set(s.activity.get().wrapping_add(1));
            if let Some(w) = s.sleeping.take() {
                w.wake();
            }
        }
    });
}

/// Forgets this thread's poller: to be called once its runtime has stopped
/// and before the runtime is dropped, so that the sleeping poller's waker,
/// the last reference to its task, is released while the runtime that made
/// it still exists rather than among the thread's exiting locals.
pub fn stop() {
    let _ = STATE.try_with(|s| {
        s.enabled.set(false);
        drop(s.sleeping.take());
    });
}

fn activity() -> u64 {
    STATE.with(|s| s.activity.get())
}

/// Turns this thread's poller has polled since it started.
pub fn turns() -> u64 {
    STATE.with(|s| s.turns.get())
}

/// Pending until the next [`note_activity`] on this thread.
struct Sleep {
    seen: u64,
}

impl Future for Sleep {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        STATE.with(|s| {
            if s.activity.get() != self.seen {
                Poll::Ready(())
            } else {
                s.sleeping.set(Some(cx.waker().clone()));
                Poll::Pending
            }
        })
    }
}

/// The poller: runs until its thread's runtime ends. `window` must be
/// non-zero. Its turns yield through `yields`, whose pump must run on the
/// same thread. `spent` is told the length of every polling stretch (from
/// the wake-up that started it to the sleep that ended it).
pub async fn run(yields: &YieldQueue, window: Duration, spent: impl Fn(Duration)) {
    STATE.with(|s| s.enabled.set(true));
    let mut seen = activity();
    loop {
        // Asleep (the runtime may park for good) until work arrives.
        Sleep { seen }.await;
        seen = activity();
        let mut active_at = Instant::now();
        let mut parked_at = active_at;
        loop {
            // One trip through the runtime's loop behind every task that
            // is runnable now (they run, then a non-blocking submit
            // collects completions).
            yields.yield_now().await;
            // The CPU is the shard's only while nothing else wants it: a
            // kernel worker or another of the process's threads (the epoch
            // ticker) that became runnable on it runs now, not at the end
            // of the shard's time slice (measured without it: p99 of
            // several ms at rates the shard held before). Like any syscall
            // it also runs the ring's pending completions on its way out.
            std::thread::yield_now();
            STATE.with(|s| s.turns.set(s.turns.get() + 1));
            let now = Instant::now();
            let a = activity();
            if a != seen {
                seen = a;
                active_at = now;
            } else if now.duration_since(active_at) >= window {
                spent(now.duration_since(parked_at));
                break;
            }
            if now.duration_since(parked_at) >= PARK_EVERY {
                // Let the runtime park once: with nothing else ready it
                // advances its timers and takes in other threads' wake-ups;
                // the next read wakes the poller again.
                spent(now.duration_since(parked_at));
                Sleep { seen }.await;
                seen = activity();
                active_at = Instant::now();
                parked_at = active_at;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::rc::Rc;

    /// Runs `f` on a runtime of its own thread, failing (not hanging) if it
    /// has not finished within 20 s: a poller that starved the timers would
    /// otherwise never let it end.
    fn on_runtime<F: Future<Output = ()> + 'static>(f: impl FnOnce() -> F + Send + 'static) {
        let (done, finished) = std::sync::mpsc::channel();
        let worker = std::thread::spawn(move || {
            let mut rt = monoio::RuntimeBuilder::<monoio::FusionDriver>::new()
                .enable_timer()
                .build()
                .expect("runtime");
            rt.block_on(f());
            stop();
            drop(rt);
            let _ = done.send(());
        });
        match finished.recv_timeout(Duration::from_secs(20)) {
            Ok(()) => worker.join().expect("test thread"),
            Err(_) if worker.is_finished() => {
                std::panic::resume_unwind(worker.join().expect_err("ended without result"))
            }
            Err(_) => panic!("the runtime did not finish in 20 s: timers starved"),
        }
    }

    /// A yield queue with its pump running on this thread.
    fn pumped() -> Rc<YieldQueue> {
        let yields = Rc::new(YieldQueue::default());
        let pump = yields.clone();
        monoio::spawn(async move { pump.run().await });
        yields
    }

    #[test]
    fn note_activity_without_a_poller_is_a_no_op() {
        std::thread::spawn(|| {
            note_activity();
            assert_eq!(activity(), 0);
        })
        .join()
        .expect("thread");
    }

    /// While the poller polls, other runnable tasks still run at once: two
    /// tasks handing a token back and forth (each hand-off queues the other
    /// at the back, as a completion's wake-up does) make 5,000 round trips
    /// with the poller taking about one turn per trip. A poller that woke
    /// itself instead of yielding through the queue would run first every
    /// time and hold each hand-off back until its turns ran out (200 µs of
    /// turns each; 1.01 s in all, measured).
    ///
    /// Counted in turns, not timed: every turn also gives the CPU away
    /// (`sched_yield`), so on a loaded machine the same 5,000 trips took
    /// 2 s with the poller behaving.
    #[test]
    fn other_tasks_run_ahead_of_the_pollers_turns() {
        const TRIPS: u64 = 5_000;
        on_runtime(|| async {
            let yields = pumped();
            monoio::spawn(async move { run(&yields, Duration::from_millis(50), |_| {}).await });
            let (a, b) = (
                Rc::new(crate::local::Notify::default()),
                Rc::new(crate::local::Notify::default()),
            );
            {
                let (a, b) = (a.clone(), b.clone());
                monoio::spawn(async move {
                    loop {
                        b.wait().await;
                        a.notify();
                    }
                });
            }
            note_activity();
            let t0 = turns();
            for _ in 0..TRIPS {
                note_activity();
                b.notify();
                a.wait().await;
            }
            // Measured: 4,966 turns behaving, 838,827 when the poller woke
            // itself (its turns ran until `PARK_EVERY` before each trip).
            let polled = turns() - t0;
            assert!(polled > 0, "the poller never polled");
            assert!(
                polled <= 3 * TRIPS,
                "the poller took {polled} turns in {TRIPS} hand-offs: it runs ahead of them"
            );
        });
    }

    /// The poller sleeps while nothing happens, polls while activity keeps
    /// coming without starving the timers, and sleeps again one window
    /// after the last of it.
    #[test]
    fn polls_while_active_sleeps_when_idle_and_timers_still_fire() {
        on_runtime(|| async {
            let window = Duration::from_millis(2);
            let spent = Rc::new(Cell::new(Duration::ZERO));
            {
                let spent = spent.clone();
                let yields = pumped();
                monoio::spawn(async move {
                    run(&yields, window, move |d| spent.set(spent.get() + d)).await
                });
            }
            let ticks = Rc::new(Cell::new(0u64));
            {
                let ticks = ticks.clone();
                monoio::spawn(async move {
                    loop {
                        ticks.set(ticks.get() + 1);
                        monoio::time::sleep(Duration::from_millis(1)).await;
                    }
                });
            }
            // Each phase runs until what it waits for has happened (capped
            // at 2 s), not for a fixed time: on a loaded machine (CI runs
            // the tests in parallel on two CPUs) this thread may be off the
            // CPU for milliseconds, which must not read as starvation.
            let cap = Duration::from_secs(2);
            // Idle: no turns at all, and the timer still fires.
            monoio::time::sleep(Duration::from_millis(5)).await;
            let (t0, k0) = (turns(), ticks.get());
            let start = Instant::now();
            while ticks.get() - k0 < 5 && start.elapsed() < cap {
                monoio::time::sleep(Duration::from_millis(1)).await;
            }
            assert_eq!(turns(), t0, "the poller polled with no activity");
            assert!(ticks.get() - k0 >= 5, "timers stalled while idle");
            // Activity every millisecond, more often than the window: the
            // poller polls all along, and the 1 ms timers still fire (it
            // lets the runtime park every PARK_EVERY).
            let (t1, k1) = (turns(), ticks.get());
            let start = Instant::now();
            while (turns() - t1 < 100 || ticks.get() - k1 < 10) && start.elapsed() < cap {
                note_activity();
                monoio::time::sleep(Duration::from_millis(1)).await;
            }
            assert!(
                turns() - t1 >= 100,
                "only {} turns while active for {:?}",
                turns() - t1,
                start.elapsed()
            );
            assert!(
                ticks.get() - k1 >= 10,
                "timers starved while polling: {} ticks in {:?}",
                ticks.get() - k1,
                start.elapsed()
            );
            // Quiet again: within a window or two the poller stops (it has
            // stopped once 20 ms pass without a turn), and the time it
            // spent polling was reported: some, never more than the time
            // since the activity began.
            loop {
                let t2 = turns();
                monoio::time::sleep(Duration::from_millis(20)).await;
                if turns() == t2 {
                    break;
                }
                assert!(
                    start.elapsed() < 2 * cap,
                    "the poller kept polling once idle"
                );
            }
            let polled = spent.get();
            assert!(
                polled > Duration::ZERO && polled <= start.elapsed(),
                "reported {polled:?} of polling in {:?}",
                start.elapsed()
            );
        });
    }
}
