//! Single-threaded wake-up primitives for one shard's tasks.
//!
//! A shard is one thread, so these use `Cell`s, not atomics or locks; they
//! are `!Send` by construction (`Rc`, `Cell`) and cannot leak across shards.

use std::cell::{Cell, RefCell};
use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

/// Wakes one waiting task; a notification given while nobody waits is kept
/// for the next wait (like a binary semaphore).
#[derive(Default)]
pub struct Notify {
    set: Cell<bool>,
    waker: Cell<Option<Waker>>,
}

impl Notify {
    pub fn notify(&self) {
        self.set.set(true);
        if let Some(w) = self.waker.take() {
            w.wake();
        }
    }

    pub async fn wait(&self) {
        poll_fn(|cx| {
            if self.set.replace(false) {
                Poll::Ready(())
            } else {
                self.waker.set(Some(cx.waker().clone()));
                Poll::Pending
            }
        })
        .await
    }
}

/// Fair yielding for a shard's tasks.
///
/// monoio runs a task that wakes itself during its own poll again at once
/// (front of the queue), so a self-wake does not let other connections in.
/// A yielding task instead parks its waker here and wakes the shard's
/// `run` task; that task is scheduled behind everything already runnable,
/// and only when it runs are the yielders woken, behind the tasks that
/// became runnable meanwhile.
#[derive(Default)]
pub struct YieldQueue {
    parked: RefCell<Vec<Waker>>,
    pump: Notify,
}

impl YieldQueue {
    /// Lets every other runnable task of the shard run once, then resumes.
    pub async fn yield_now(&self) {
        let mut parked = false;
        poll_fn(|cx| {
            if parked {
                return Poll::Ready(());
            }
            parked = true;
            self.parked.borrow_mut().push(cx.waker().clone());
            self.pump.notify();
            Poll::Pending
        })
        .await
    }

    /// The shard's pump task: runs for the shard's life.
    pub async fn run(&self) {
        loop {
            self.pump.wait().await;
            let parked = std::mem::take(&mut *self.parked.borrow_mut());
            for w in parked {
                w.wake();
            }
        }
    }
}

/// A level-triggered flag that wakes every task waiting for it once set.
///
/// Every request races its handler against the shard's `drain_expired`
/// latch, so `wait` must cost O(1) and leave nothing behind: each waiting
/// future owns one slot, refreshed in place on re-poll and freed when the
/// future is dropped (the request finished first). An earlier version kept
/// every waker until `set` and deduplicated with `Waker::will_wake`, which
/// does not hold for monoio's task wakers: the list grew by one entry per
/// request and every wait scanned it (bench/NOTES.md, attempt 1).
#[derive(Default)]
pub struct Latch {
    set: Cell<bool>,
    waiters: RefCell<Slots>,
}

#[derive(Default)]
struct Slots {
    wakers: Vec<Option<Waker>>,
    free: Vec<usize>,
}

impl Latch {
    pub fn set(&self) {
        self.set.set(true);
        let wakers = std::mem::take(&mut *self.waiters.borrow_mut());
        for w in wakers.wakers.into_iter().flatten() {
            w.wake();
        }
    }

    pub fn is_set(&self) -> bool {
        self.set.get()
    }

    pub fn wait(&self) -> LatchWait<'_> {
        LatchWait {
            latch: self,
            slot: None,
        }
    }
}

/// The future of [`Latch::wait`].
pub struct LatchWait<'a> {
    latch: &'a Latch,
    slot: Option<usize>,
}

impl Future for LatchWait<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        if this.latch.set.get() {
            return Poll::Ready(());
        }
        let mut s = this.latch.waiters.borrow_mut();
        match this.slot {
            Some(i) => match &mut s.wakers[i] {
                Some(w) => w.clone_from(cx.waker()),
                slot @ None => *slot = Some(cx.waker().clone()),
            },
            None => {
                let waker = Some(cx.waker().clone());
                let i = match s.free.pop() {
                    Some(i) => {
                        s.wakers[i] = waker;
                        i
                    }
                    None => {
                        s.wakers.push(waker);
                        s.wakers.len() - 1
                    }
                };
                this.slot = Some(i);
            }
        }
        Poll::Pending
    }
}

impl Drop for LatchWait<'_> {
    fn drop(&mut self) {
        // Once set, `set` has taken every slot; nothing to give back.
        if let Some(i) = self.slot.take()
            && !self.latch.set.get()
        {
            let mut s = self.latch.waiters.borrow_mut();
            s.wakers[i] = None;
            s.free.push(i);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;

    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[test]
    fn latch_waits_free_their_slot_and_set_wakes_the_live_ones() {
        let latch = Latch::default();
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(count.clone());
        let mut cx = Context::from_waker(&waker);
        // A million finished waits (requests that beat the drain) leave one slot.
        for _ in 0..1_000_000 {
            let mut w = std::pin::pin!(latch.wait());
            assert!(w.as_mut().poll(&mut cx).is_pending());
            assert!(w.as_mut().poll(&mut cx).is_pending());
        }
        assert_eq!(latch.waiters.borrow().wakers.len(), 1);
        let mut live = Box::pin(latch.wait());
        assert!(live.as_mut().poll(&mut cx).is_pending());
        latch.set();
        assert_eq!(count.0.load(Ordering::Relaxed), 1);
        assert!(live.as_mut().poll(&mut cx).is_ready());
        drop(live);
        assert!(std::pin::pin!(latch.wait()).poll(&mut cx).is_ready());
    }
}
