//! The channel behind an SSE response body, counting what its client has
//! not read yet.
//!
//! A stream that stays open (a session's GET stream, a 2026-07-28 listen
//! stream) is fed by other requests' writes, at their rate, whatever its
//! client reads: for a client that opened many and read none, the queues
//! grew at the writers' rate, bounded only by `http.write_timeout`'s cut of
//! its connection. Such a stream's sends are
//! [`SseTx::send_bounded`]: past [`MAX_UNREAD_BYTES`] unread the stream
//! ends (its client reconnects: with `Last-Event-ID` a GET stream resumes
//! from the session's replay log, a listen stream is opened again), as the
//! frame edge bounds a connection's output and gRPC a Subscribe stream's
//! queue. A request's own stream (its answer, its progress) is bounded by
//! its call and uses [`SseTx::send`].

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_channel::mpsc;
use futures_core::Stream;

/// Unread bytes past which a stream that stays open is ended: about a
/// thousand notifications, as many as the frame edge's default output
/// bound per connection (`frames.max_output_bytes_per_connection`).
pub const MAX_UNREAD_BYTES: usize = 1 << 20;

#[derive(Default)]
struct Shared {
    /// Unique for the process's life ([`SseTx::id`]).
    id: u64,
    unread: AtomicUsize,
    /// Ended for its unread bytes: its body ends without the rest.
    cut: AtomicBool,
}

/// The sending half (cloned by each party that feeds the stream).
#[derive(Clone)]
pub struct SseTx {
    tx: mpsc::UnboundedSender<Bytes>,
    shared: Arc<Shared>,
    /// Counts the stream if it is cut (`mcp_http_streams_cut_total`).
    cuts: Option<Arc<AtomicU64>>,
}

/// The receiving half: the response body's source.
pub struct SseRx {
    rx: mpsc::UnboundedReceiver<Bytes>,
    shared: Arc<Shared>,
}

/// A new stream's two halves.
pub fn channel() -> (SseTx, SseRx) {
    // Not the allocation's address: a channel freed and another made at
    // the same address would take the old one's id.
    static NEXT_ID: AtomicU64 = AtomicU64::new(1);
    let (tx, rx) = mpsc::unbounded();
    let shared = Arc::new(Shared {
        id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        ..Shared::default()
    });
    (
        SseTx {
            tx,
            shared: shared.clone(),
            cuts: None,
        },
        SseRx { rx, shared },
    )
}

impl SseTx {
    /// Counts in `cuts` the stream's end for its unread bytes.
    pub fn counting_cuts(mut self, cuts: Arc<AtomicU64>) -> Self {
        self.cuts = Some(cuts);
        self
    }

    /// Queues `b`; `false` when the client is gone.
    pub fn send(&self, b: Bytes) -> bool {
        let n = b.len();
        // Counted before it can be read (and taken off by the body).
        self.shared.unread.fetch_add(n, Ordering::Relaxed);
        if self.tx.unbounded_send(b).is_err() {
            self.shared.unread.fetch_sub(n, Ordering::Relaxed);
            return false;
        }
        true
    }

    /// Queues `b` unless that leaves more than [`MAX_UNREAD_BYTES`]
    /// unread, in which case the stream ends; `false` then, or when the
    /// client is gone.
    pub fn send_bounded(&self, b: Bytes) -> bool {
        let n = b.len();
        if self.shared.unread.load(Ordering::Relaxed) + n > MAX_UNREAD_BYTES {
            let first = !self.shared.cut.swap(true, Ordering::Relaxed);
            if let Some(c) = self.cuts.as_ref().filter(|_| first) {
                c.fetch_add(1, Ordering::Relaxed);
            }
            // Every sender's next send fails; the body ends when hyper
            // polls it (the unread events are dropped with it).
            self.tx.close_channel();
            return false;
        }
        self.send(b)
    }

    /// Which stream this is (the same for every clone): a keep-alive task
    /// tells its own attachment from a later one that resumed the stream.
    pub fn id(&self) -> u64 {
        self.shared.id
    }

    /// Whether the stream was ended for its unread bytes.
    #[cfg(test)]
    pub fn was_cut(&self) -> bool {
        self.shared.cut.load(Ordering::Relaxed)
    }
}

impl SseRx {
    /// The next event if one is queued, without waiting (for tests).
    #[cfg(test)]
    pub fn try_recv(&mut self) -> Result<Bytes, mpsc::TryRecvError> {
        if self.shared.cut.load(Ordering::Relaxed) {
            return Err(mpsc::TryRecvError::Closed);
        }
        let b = self.rx.try_recv()?;
        self.shared.unread.fetch_sub(b.len(), Ordering::Relaxed);
        Ok(b)
    }
}

impl Stream for SseRx {
    type Item = Bytes;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Bytes>> {
        if self.shared.cut.load(Ordering::Relaxed) {
            return Poll::Ready(None);
        }
        let next = Pin::new(&mut self.rx).poll_next(cx);
        if let Poll::Ready(Some(b)) = &next {
            self.shared.unread.fetch_sub(b.len(), Ordering::Relaxed);
        }
        next
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(rx: &mut SseRx) -> (Vec<Bytes>, bool) {
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        let mut got = Vec::new();
        loop {
            match Pin::new(&mut *rx).poll_next(&mut cx) {
                Poll::Ready(Some(b)) => got.push(b),
                Poll::Ready(None) => return (got, true),
                Poll::Pending => return (got, false),
            }
        }
    }

    #[test]
    fn a_stream_is_ended_past_its_unread_bound_and_read_bytes_free_room() {
        let (tx, mut rx) = channel();
        let kib = Bytes::from(vec![b'x'; 1024]);
        for _ in 0..MAX_UNREAD_BYTES / 1024 {
            assert!(tx.send_bounded(kib.clone()));
        }
        // Read: room again.
        let (got, ended) = drain(&mut rx);
        assert_eq!((got.len(), ended), (MAX_UNREAD_BYTES / 1024, false));
        for _ in 0..MAX_UNREAD_BYTES / 1024 {
            assert!(tx.send_bounded(kib.clone()));
        }
        // One more than the bound: refused, the stream ends, the rest is
        // dropped, and every sender's next send fails.
        assert!(!tx.send_bounded(Bytes::from_static(b"y")));
        assert!(tx.was_cut());
        let other = tx.clone();
        assert!(!other.send(Bytes::from_static(b"z")));
        let (got, ended) = drain(&mut rx);
        assert!(got.is_empty() && ended);
    }

    #[test]
    fn every_channel_has_its_own_id_even_at_a_freed_address() {
        let mut seen = std::collections::HashSet::new();
        for _ in 0..100 {
            // Each dropped at once: the allocator may hand its address on.
            let (tx, _rx) = channel();
            assert!(seen.insert(tx.id()));
            assert_eq!(tx.clone().id(), tx.id());
        }
    }

    #[test]
    fn unbounded_sends_are_counted_but_never_refused() {
        let (tx, mut rx) = channel();
        let big = Bytes::from(vec![b'x'; MAX_UNREAD_BYTES * 2]);
        assert!(tx.send(big));
        assert!(!tx.was_cut());
        // A bounded send behind it waits for the read.
        assert!(!tx.send_bounded(Bytes::from_static(b"y")));
        let (got, ended) = drain(&mut rx);
        assert!(got.is_empty() && ended, "cut: {}", got.len());
        drop(rx);
        assert!(!tx.send(Bytes::from_static(b"z")), "the client is gone");
    }
}
