//! Single-threaded wake-up primitives for one shard's tasks.
//!
//! A shard is one thread, so these use `Cell`s, not atomics or locks; they
//! are `!Send` by construction (`Rc`, `Cell`) and cannot leak across shards.

use std::cell::{Cell, RefCell};
use std::future::poll_fn;
use std::task::{Poll, Waker};

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

/// A level-triggered flag that wakes every task waiting for it once set.
#[derive(Default)]
pub struct Latch {
    set: Cell<bool>,
    waiters: RefCell<Vec<Waker>>,
}

impl Latch {
    pub fn set(&self) {
        self.set.set(true);
        for w in self.waiters.borrow_mut().drain(..) {
            w.wake();
        }
    }

    pub fn is_set(&self) -> bool {
        self.set.get()
    }

    pub async fn wait(&self) {
        poll_fn(|cx| {
            if self.set.get() {
                Poll::Ready(())
            } else {
                let mut w = self.waiters.borrow_mut();
                if !w.iter().any(|x| x.will_wake(cx.waker())) {
                    w.push(cx.waker().clone());
                }
                Poll::Pending
            }
        })
        .await
    }
}
