//! Precise send times for the open loop: one spinning waiter per worker
//! thread.
//!
//! The runtimes' timers have millisecond ticks and fire up to ~2 ms late,
//! so a scheduled send cannot trust them alone: it sleeps on the timer until
//! shortly before its time, then yields until the time has come. Done by
//! every connection for itself, that spin starved the timer: monoio
//! advances its timer wheel only when the runtime parks, and it never parks
//! while some task is runnable. With several connections per thread their
//! spins overlapped, the connections sleeping meanwhile woke only when no
//! one spun, and every request was measured milliseconds late (8
//! connections at 1,000 req/s: p50 7 ms against a server that answers in
//! 0.2 ms).
//!
//! Worse, a yield by self-wake is no yield on monoio: a task that wakes
//! itself while being polled goes back to the *front* of the run queue, so
//! a spinning task starved every other task of its thread, the readers of
//! the answers included.
//!
//! Here the connections wait on an [`AlarmClock`] instead. One ticker task
//! per thread holds the deadlines in a heap: it sleeps on the runtime timer
//! while the earliest deadline is further away than `spin` plus the timer's
//! slack (so the runtime parks and its timers run), and yields through the
//! last stretch, waking each waiter at its time. Only one task ever spins,
//! and it yields fairly: it parks its waker with a pump task and wakes that
//! task, which is queued behind every task already runnable and wakes the
//! ticker only when it runs (the broker's shards do the same,
//! `broker/src/local.rs`).
//!
//! The spin costs a core whatever the load, so the generator's CPU time says
//! little about its cost per request. The ticker therefore tells idle spin
//! from work: a round of its yield in which no connection task was polled
//! (the thread's work counter, bumped by every poll of a task wrapped in
//! [`AlarmClock::counted`], did not move) is idle, and its wall time is
//! added to [`AlarmClock::idle_spin`]. A round in which anything happened
//! counts as work whole, so the figure errs on the side of a busier
//! generator. Wall time, not the thread's CPU clock: that clock is a system
//! call taking the run queue's lock, and read once a round it cost 10–15%
//! of the generator's CPU at 40k req/s (perf, on the 2-core VM). The engine
//! scales the idle wall time by the share of its runnable time the thread
//! spent on a CPU (its wait for one, from `/proc/thread-self/schedstat`),
//! for rounds spent descheduled.
//!
//! The same readings give each round's length, kept in a histogram
//! ([`AlarmClock::take_turns`]): a round is one turn of every task that was
//! runnable, so an answer that reached the generator while a round ran
//! waited up to about that long to be read. Each round counts once per µs
//! it lasted, so the histogram's percentiles are those of the round that a
//! random moment (an answer's arrival) falls in, not of rounds counted
//! alike, most of which are a few idle µs. Send lag shows a generator late
//! to *send*; long turns show one late to *read*, which the latency it
//! reports then includes.
//!
//! Work that must happen on time while the ticker spins but needs no
//! precision (the engine's housekeeping) waits coarsely
//! ([`AlarmClock::wait_until_coarse`]): on a second heap that the ticker
//! serves in a turn of its spin or on the runtime timer, never spinning
//! for it.
//!
//! # Invariants
//! - A waiter is woken no earlier than its deadline; the ticker wakes it at
//!   the first turn after it (microseconds, unless the thread is busy).
//! - A dropped waiter leaves a stale heap entry with no waker: the ticker
//!   discards it when it comes due.

use std::cell::{Cell, RefCell};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use crate::notify::{Notify, race};
use crate::rt::Runtime;
use crate::stats;

/// The runtime timers fire up to this much after the time asked (measured:
/// up to 1.7 ms on monoio's and tokio's millisecond wheels).
pub const TIMER_SLACK: Duration = Duration::from_millis(2);

#[derive(Default)]
struct State {
    deadlines: BinaryHeap<Reverse<(Instant, u64)>>,
    /// Deadlines that need no precision ([`AlarmClock::wait_until_coarse`]):
    /// served on the runtime timer or by a turn of the spin, never spun for.
    coarse: BinaryHeap<Reverse<(Instant, u64)>>,
    wakers: HashMap<u64, Waker>,
    next_id: u64,
}

/// A worker thread's alarm clock (see the module doc).
pub struct AlarmClock {
    /// How long before a deadline the ticker stops trusting the timer.
    early: Duration,
    state: RefCell<State>,
    /// A new deadline may be the earliest: the ticker looks again.
    kick: Notify,
    ticker_started: Cell<bool>,
    /// The ticker's waker while it yields, and the pump that wakes it.
    parked: Cell<Option<Waker>>,
    pump: Notify,
    /// Polls of the connections' tasks on this thread so far (see the
    /// module doc).
    work: Cell<u64>,
    /// Wall time of yield rounds with no work in them.
    idle: Cell<Duration>,
    /// Length of every yield round since the last [`Self::take_turns`], µs.
    turns: RefCell<Histogram<u64>>,
}

impl AlarmClock {
    /// A clock that spins for the last `spin` (plus [`TIMER_SLACK`]) before
    /// each deadline; `spin` zero: the timer alone.
    pub fn new(spin: Duration) -> Rc<Self> {
        Rc::new(AlarmClock {
            early: if spin.is_zero() {
                Duration::ZERO
            } else {
                spin + TIMER_SLACK
            },
            state: RefCell::default(),
            kick: Notify::default(),
            ticker_started: Cell::new(false),
            parked: Cell::new(None),
            pump: Notify::default(),
            work: Cell::new(0),
            idle: Cell::new(Duration::ZERO),
            turns: RefCell::new(stats::new_histogram()),
        })
    }

    /// `f`, each of whose polls counts as work: a yield round in which it
    /// ran is not idle spin.
    pub fn counted<F: Future>(self: &Rc<Self>, f: F) -> Counted<F> {
        Counted {
            clock: Rc::clone(self),
            f,
        }
    }

    /// Wall time the ticker spent spinning with nothing else to do, so far.
    pub fn idle_spin(&self) -> Duration {
        self.idle.get()
    }

    /// The lengths of the yield rounds since the last call (µs; see the
    /// module doc), and a fresh start. Empty when the ticker never spun
    /// (closed loop, `--spin 0`, or rates low enough for the timer alone).
    pub fn take_turns(&self) -> Histogram<u64> {
        self.turns.replace(stats::new_histogram())
    }

    /// Completes at `until` or at `wake`'s next notify, whichever is first.
    /// Must be called inside the thread's runtime (it starts the ticker on
    /// first use).
    pub async fn wait_until<R: Runtime>(self: &Rc<Self>, until: Instant, wake: &Notify) {
        self.wait::<R>(until, wake, false).await;
    }

    /// Completes at `until` (to within the runtime timer's slack) or at
    /// `wake`'s next notify. For work that must happen on time while the
    /// ticker spins (monoio fires its own timers only when it parks, and it
    /// does not park while the ticker spins) but needs no precision: the
    /// ticker never spins for it, it wakes it on the runtime timer or in a
    /// turn of a spin made for the precise waiters.
    pub async fn wait_until_coarse<R: Runtime>(self: &Rc<Self>, until: Instant, wake: &Notify) {
        self.wait::<R>(until, wake, true).await;
    }

    async fn wait<R: Runtime>(self: &Rc<Self>, until: Instant, wake: &Notify, coarse: bool) {
        if until <= Instant::now() {
            return;
        }
        if self.early.is_zero() {
            let _ = race(R::sleep_until(until), wake.notified()).await;
            return;
        }
        if !self.ticker_started.replace(true) {
            // Detached: they live as long as the thread's runtime.
            drop(R::spawn(Rc::clone(self).tick::<R>()));
            drop(R::spawn(Rc::clone(self).pump()));
        }
        let alarm = Alarm {
            clock: self,
            until,
            id: None,
            coarse,
        };
        let _ = race(alarm, wake.notified()).await;
    }

    /// The ticker: wakes the waiters whose time has come, sleeping on the
    /// runtime timer when the next deadline is far and yielding when near.
    async fn tick<R: Runtime>(self: Rc<Self>) {
        // When the last yield round began, and the work counter then. One
        // reading per round ends the last and begins the next, so that
        // back-to-back idle rounds are counted whole.
        let mut round: Option<(Instant, u64)> = None;
        loop {
            let now = Instant::now();
            if let Some((began, work)) = round.take() {
                let turn = now - began;
                stats::record_weighted(&mut self.turns.borrow_mut(), turn.as_micros() as u64);
                if work == self.work.get() {
                    self.idle.set(self.idle.get() + turn);
                }
            }
            let (next, next_coarse) = {
                let mut st = self.state.borrow_mut();
                let st = &mut *st;
                for heap in [&mut st.deadlines, &mut st.coarse] {
                    while let Some(&Reverse((t, id))) = heap.peek() {
                        if t > now {
                            break;
                        }
                        heap.pop();
                        if let Some(w) = st.wakers.remove(&id) {
                            w.wake();
                        }
                    }
                }
                (
                    st.deadlines.peek().map(|Reverse((t, _))| *t),
                    st.coarse.peek().map(|Reverse((t, _))| *t),
                )
            };
            // When to look again without spinning: shortly before the next
            // precise deadline, or at the next coarse one.
            let wake_at = next
                .map(|t| t - self.early)
                .into_iter()
                .chain(next_coarse)
                .min();
            match next {
                Some(t) if t <= now + self.early => {
                    // The last stretch: give the other tasks (and the I/O
                    // driver) a turn, then look again.
                    round = Some((now, self.work.get()));
                    self.fair_yield().await;
                }
                _ => match wake_at {
                    None => self.kick.notified().await,
                    Some(at) => {
                        let _ = race(R::sleep_until(at), self.kick.notified()).await;
                    }
                },
            }
        }
    }

    /// Lets every task runnable now run first (see the module doc).
    async fn fair_yield(&self) {
        let mut parked = false;
        std::future::poll_fn(|cx| {
            if parked {
                return Poll::Ready(());
            }
            parked = true;
            self.parked.set(Some(cx.waker().clone()));
            self.pump.notify();
            Poll::Pending
        })
        .await
    }

    /// Wakes the yielding ticker from behind the tasks queued before it.
    async fn pump(self: Rc<Self>) {
        loop {
            self.pump.notified().await;
            if let Some(w) = self.parked.take() {
                w.wake();
            }
        }
    }
}

/// A task whose polls count as work (see [`AlarmClock::counted`]).
pub struct Counted<F> {
    clock: Rc<AlarmClock>,
    f: F,
}

impl<F: Future> Future for Counted<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let work = &self.clock.work;
        work.set(work.get().wrapping_add(1));
        // SAFETY: `f` is structurally pinned: no method moves it out of a
        // pinned `Counted`, `Counted` has no `Drop`, and it is `Unpin` only
        // through the auto impl, i.e. only when `F` is.
        unsafe { self.map_unchecked_mut(|c| &mut c.f) }.poll(cx)
    }
}

/// One waiter's place on the clock.
struct Alarm<'a> {
    clock: &'a AlarmClock,
    until: Instant,
    id: Option<u64>,
    /// On the coarse heap ([`AlarmClock::wait_until_coarse`]).
    coarse: bool,
}

impl Future for Alarm<'_> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if Instant::now() >= self.until {
            if let Some(id) = self.id.take() {
                self.clock.state.borrow_mut().wakers.remove(&id);
            }
            return Poll::Ready(());
        }
        let mut st = self.clock.state.borrow_mut();
        match self.id {
            Some(id) => {
                st.wakers.insert(id, cx.waker().clone());
            }
            None => {
                let id = st.next_id;
                st.next_id += 1;
                let heap = if self.coarse {
                    &mut st.coarse
                } else {
                    &mut st.deadlines
                };
                heap.push(Reverse((self.until, id)));
                st.wakers.insert(id, cx.waker().clone());
                drop(st);
                self.id = Some(id);
                self.clock.kick.notify();
            }
        }
        Poll::Pending
    }
}

impl Drop for Alarm<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.id {
            self.clock.state.borrow_mut().wakers.remove(&id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rt::Monoio;

    /// Many waiters with deadlines 1 ms apart, as 8 connections at 1,000
    /// req/s make: each wakes at its time, not when some other waiter's
    /// spin happens to end.
    #[test]
    fn overlapping_waiters_each_wake_at_their_own_time() {
        let mut rt = Monoio::build().expect("runtime");
        let lateness = rt.block_on(async {
            let clock = AlarmClock::new(Duration::from_micros(200));
            let start = Instant::now() + Duration::from_millis(5);
            let late = Rc::new(RefCell::new(Vec::new()));
            // The thread's run-queue time at each wake (any waiter's).
            let readings = Rc::new(RefCell::new(vec![(Instant::now(), runqueue_wait())]));
            let mut tasks = Vec::new();
            for conn in 0..8u32 {
                let (clock, late, readings) = (clock.clone(), late.clone(), readings.clone());
                tasks.push(Monoio::spawn(async move {
                    let never = Notify::default();
                    for k in 0..10u32 {
                        let t = start + Duration::from_millis((k * 8 + conn) as u64);
                        clock.wait_until::<Monoio>(t, &never).await;
                        let woke = Instant::now();
                        // Lateness the clock is answerable for: less the
                        // time this thread waited for a CPU since the last
                        // wake before this deadline. On a machine busy with
                        // other work the scheduler held it back 4-5 ms at a
                        // time, and every waiter due meanwhile woke that
                        // late; the starved version was late with the
                        // thread running, which no run-queue time excuses.
                        let waited = runqueue_wait();
                        let mut r = readings.borrow_mut();
                        let before = r
                            .iter()
                            .rev()
                            .find(|(at, _)| *at <= t)
                            .map_or(waited, |x| x.1);
                        r.push((woke, waited));
                        let held = waited.saturating_sub(before);
                        late.borrow_mut().push((woke - t).saturating_sub(held));
                    }
                }));
            }
            for t in tasks {
                t.await;
            }
            late.take()
        });
        assert_eq!(lateness.len(), 80);
        let mut sorted = lateness.clone();
        sorted.sort();
        let median = sorted[40];
        // The starved version put the median near 3.5 ms (waiter i woke i
        // ms late, every round).
        assert!(
            median < Duration::from_micros(500),
            "median lateness {median:?}: {sorted:?}"
        );
    }

    /// How long this thread has been runnable but not running, from the
    /// second field of `/proc/thread-self/schedstat` (zero where the kernel
    /// does not keep it, which only makes the test stricter).
    fn runqueue_wait() -> Duration {
        std::fs::read_to_string("/proc/thread-self/schedstat")
            .ok()
            .and_then(|s| s.split_whitespace().nth(1)?.parse().ok())
            .map_or(Duration::ZERO, Duration::from_nanos)
    }

    /// A task that holds the thread for 2 ms at a time makes the rounds of
    /// the ticker's spin that long: what an answer arriving meanwhile waits.
    #[test]
    fn a_task_that_holds_the_thread_shows_as_long_turns() {
        let mut rt = Monoio::build().expect("runtime");
        let turns = rt.block_on(async {
            // A spin longer than the gaps between deadlines: the ticker
            // yields all along and never sleeps on the runtime timer, which
            // monoio would not fire while the hog keeps a task runnable.
            let clock = AlarmClock::new(Duration::from_millis(20));
            let busy = Rc::new(Cell::new(true));
            // The hog yields through a second task, as the ticker does: a
            // monoio task that wakes itself runs again at once.
            let (ping, pong) = (Rc::new(Notify::default()), Rc::new(Notify::default()));
            let (pi, po) = (ping.clone(), pong.clone());
            drop(Monoio::spawn(async move {
                loop {
                    pi.notified().await;
                    po.notify();
                }
            }));
            let b = busy.clone();
            let hog = Monoio::spawn(async move {
                while b.get() {
                    let t = Instant::now();
                    while t.elapsed() < Duration::from_millis(2) {
                        std::hint::spin_loop();
                    }
                    ping.notify();
                    pong.notified().await;
                }
            });
            let never = Notify::default();
            let start = Instant::now() + Duration::from_millis(5);
            for k in 0..10u64 {
                let t = start + Duration::from_millis(5 * k);
                clock.wait_until::<Monoio>(t, &never).await;
            }
            busy.set(false);
            hog.await;
            clock.take_turns()
        });
        assert!(
            !turns.is_empty(),
            "the ticker spun, so it measured its rounds"
        );
        // Every round with the hog in it lasted its 2 ms.
        let p50 = turns.value_at_quantile(0.5);
        assert!((1_900..20_000).contains(&p50), "median turn {p50} µs");
        assert!(
            AlarmClock::new(Duration::from_micros(200))
                .take_turns()
                .is_empty(),
            "a clock that never spun has no turns"
        );
    }

    /// A coarse deadline is met while the ticker spins for precise ones
    /// (monoio's own timer would wait for the spin to end), and alone it
    /// never makes the ticker spin.
    #[test]
    fn coarse_waits_are_served_during_a_spin_and_never_spun_for() {
        let mut rt = Monoio::build().expect("runtime");
        let (coarse_done, spin_done, lone_turns) = rt.block_on(async {
            let clock = AlarmClock::new(Duration::from_micros(200));
            let t0 = Instant::now();
            let done = Rc::new(Cell::new(None));
            let (c, d) = (clock.clone(), done.clone());
            let coarse = Monoio::spawn(async move {
                let never = Notify::default();
                c.wait_until_coarse::<Monoio>(t0 + Duration::from_millis(5), &never)
                    .await;
                d.set(Some(t0.elapsed()));
            });
            // Precise deadlines 50 µs apart for 60 ms: the ticker spins all
            // along.
            let never = Notify::default();
            for k in 1..=1_200u64 {
                clock
                    .wait_until::<Monoio>(t0 + Duration::from_micros(50 * k), &never)
                    .await;
            }
            let spin_done = t0.elapsed();
            coarse.await;
            // A coarse wait alone: no spin, so no turns.
            let lone = AlarmClock::new(Duration::from_micros(200));
            lone.wait_until_coarse::<Monoio>(Instant::now() + Duration::from_millis(5), &never)
                .await;
            (done.get(), spin_done, lone.take_turns())
        });
        let coarse_done = coarse_done.expect("the coarse wait ended");
        assert!(
            coarse_done >= Duration::from_millis(5) && coarse_done < spin_done,
            "a 5 ms coarse wait ended after {coarse_done:?}, the spin after {spin_done:?}"
        );
        assert!(
            lone_turns.is_empty(),
            "a lone coarse wait made the clock spin"
        );
    }

    #[test]
    fn a_notify_ends_the_wait_early() {
        let mut rt = Monoio::build().expect("runtime");
        let waited = rt.block_on(async {
            let clock = AlarmClock::new(Duration::from_micros(200));
            let wake = Rc::new(Notify::default());
            let w = wake.clone();
            let _t = Monoio::spawn(async move {
                Monoio::sleep_until(Instant::now() + Duration::from_millis(20)).await;
                w.notify();
            });
            let t0 = Instant::now();
            clock
                .wait_until::<Monoio>(t0 + Duration::from_secs(10), &wake)
                .await;
            t0.elapsed()
        });
        assert!(waited < Duration::from_secs(5), "{waited:?}");
    }
}
