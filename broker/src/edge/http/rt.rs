//! hyper on a shard's monoio runtime: its I/O and its timer.
//!
//! I/O: monoio's poll-style `TcpStreamPoll` (readiness through the ring,
//! reads and writes straight into hyper's buffers) implements tokio's I/O
//! traits, which `hyper_util`'s `TokioIo` adapts to hyper's. Timer: monoio's
//! own timer wheel, so hyper's header deadline costs no thread.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

/// hyper's timer, backed by the shard's monoio timer.
#[derive(Clone, Copy, Debug)]
pub struct ShardTimer;

impl hyper::rt::Timer for ShardTimer {
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn hyper::rt::Sleep>> {
        Box::pin(ShardSleep::new(monoio::time::sleep(duration)))
    }

    fn sleep_until(&self, deadline: Instant) -> Pin<Box<dyn hyper::rt::Sleep>> {
        Box::pin(ShardSleep::new(monoio::time::sleep_until(deadline.into())))
    }
}

/// A monoio sleep that hyper may hold as `Send + Sync`.
///
/// hyper's `Sleep` demands both because its timer may serve multi-threaded
/// executors. Here the HTTP/1 connection future that owns the sleep is
/// spawned on the shard's single-threaded runtime (`monoio::spawn`, no
/// `Send` bound) and never leaves the thread; every poll and the drop check
/// that, so a misuse would panic instead of touching the timer wheel from
/// another thread.
struct ShardSleep {
    inner: Pin<Box<monoio::time::Sleep>>,
    thread: ThreadId,
}

impl ShardSleep {
    fn new(inner: monoio::time::Sleep) -> Self {
        Self {
            inner: Box::pin(inner),
            thread: std::thread::current().id(),
        }
    }

    fn check_thread(&self) {
        assert_eq!(
            self.thread,
            std::thread::current().id(),
            "a shard's timer was used from another thread"
        );
    }
}

// SAFETY: the inner sleep is only polled and dropped on the thread that
// created it (checked in `poll` and `drop`); hyper never moves an HTTP/1
// connection's timers to another thread when the connection itself is not
// moved, and a shard's connection futures are `!Send` tasks.
unsafe impl Send for ShardSleep {}
// SAFETY: `&ShardSleep` exposes nothing but `check_thread`; all access to
// the inner sleep goes through `Pin<&mut Self>` (see `Send` above).
unsafe impl Sync for ShardSleep {}

impl Future for ShardSleep {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.check_thread();
        self.inner.as_mut().poll(cx)
    }
}

impl hyper::rt::Sleep for ShardSleep {}

impl Drop for ShardSleep {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            self.check_thread();
        }
    }
}
