//! Single-threaded wake-ups between the tasks of one connection.
//!
//! Each worker thread runs its own monoio runtime and connection state never
//! leaves it, so these are `Cell`s, not atomics or locks.
//!
//! # Invariants
//! - At most one task waits on a given [`Notify`] or [`Signal`] at a time
//!   (the connection's writer, or its reader): one waker slot is enough.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

/// An edge-triggered wake-up: `notify` before `notified` is remembered once,
/// so a wake-up between "check the condition" and "wait" is never lost.
#[derive(Default)]
pub struct Notify {
    pending: Cell<bool>,
    waker: Cell<Option<Waker>>,
}

impl Notify {
    pub fn notify(&self) {
        self.pending.set(true);
        if let Some(w) = self.waker.take() {
            w.wake();
        }
    }

    /// Completes at the next `notify` (or at once if one is pending), and
    /// consumes it.
    pub fn notified(&self) -> Notified<'_> {
        Notified { n: self }
    }
}

pub struct Notified<'a> {
    n: &'a Notify,
}

impl Future for Notified<'_> {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.n.pending.replace(false) {
            return Poll::Ready(());
        }
        self.n.waker.set(Some(cx.waker().clone()));
        Poll::Pending
    }
}

/// A one-shot, sticky signal: once raised it stays raised, and every wait
/// after that completes at once.
#[derive(Default)]
pub struct Signal {
    raised: Cell<bool>,
    waker: Cell<Option<Waker>>,
}

impl Signal {
    pub fn raise(&self) {
        self.raised.set(true);
        if let Some(w) = self.waker.take() {
            w.wake();
        }
    }

    pub fn is_raised(&self) -> bool {
        self.raised.get()
    }

    pub fn wait(&self) -> Wait<'_> {
        Wait { s: self }
    }
}

pub struct Wait<'a> {
    s: &'a Signal,
}

impl Future for Wait<'_> {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.s.raised.get() {
            return Poll::Ready(());
        }
        self.s.waker.set(Some(cx.waker().clone()));
        Poll::Pending
    }
}

/// Wakes the task and returns `Pending` once. On tokio that gives the other
/// tasks a turn; on monoio it does not (a task that wakes itself while being
/// polled is queued at the front and runs again at once): monoio code
/// yields through `alarm.rs`'s pump instead.
pub fn yield_now() -> YieldNow {
    YieldNow { yielded: false }
}

pub struct YieldNow {
    yielded: bool,
}

impl Future for YieldNow {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.yielded {
            return Poll::Ready(());
        }
        self.yielded = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

/// Which of two raced futures finished first.
pub enum Either<A, B> {
    Left(A),
    Right(B),
}

/// Polls `a` then `b` until one completes; the other is dropped. A
/// runtime-independent `select!` for the engine, which runs on monoio or
/// tokio.
pub async fn race<A: Future, B: Future>(a: A, b: B) -> Either<A::Output, B::Output> {
    let (mut a, mut b) = (std::pin::pin!(a), std::pin::pin!(b));
    std::future::poll_fn(|cx| {
        if let Poll::Ready(x) = a.as_mut().poll(cx) {
            return Poll::Ready(Either::Left(x));
        }
        if let Poll::Ready(y) = b.as_mut().poll(cx) {
            return Poll::Ready(Either::Right(y));
        }
        Poll::Pending
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn poll_once<F: Future>(f: Pin<&mut F>) -> Poll<F::Output> {
        let w = Waker::noop();
        f.poll(&mut Context::from_waker(w))
    }

    #[test]
    fn notify_before_wait_is_not_lost_and_is_consumed() {
        let n = Notify::default();
        n.notify();
        assert!(poll_once(std::pin::pin!(n.notified())).is_ready());
        assert!(poll_once(std::pin::pin!(n.notified())).is_pending());
    }

    #[test]
    fn race_returns_the_first_ready() {
        let r = poll_once(std::pin::pin!(race(std::future::pending::<()>(), async {
            7
        })));
        assert!(matches!(r, Poll::Ready(Either::Right(7))));
        let r = poll_once(std::pin::pin!(race(async { 1 }, async { 2 })));
        assert!(matches!(r, Poll::Ready(Either::Left(1))));
    }

    #[test]
    fn signal_stays_raised() {
        let s = Signal::default();
        assert!(poll_once(std::pin::pin!(s.wait())).is_pending());
        s.raise();
        assert!(poll_once(std::pin::pin!(s.wait())).is_ready());
        assert!(poll_once(std::pin::pin!(s.wait())).is_ready());
    }
}
