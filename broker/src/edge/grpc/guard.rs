//! A call's future as the edge polls it on a shard.
//!
//! - Inside a tokio runtime's context: tonic's reflection service answers
//!   its stream from a task it starts with `tokio::spawn`, which needs one.
//!   The edge keeps a one-thread runtime for that ([`super::GrpcEdge`]);
//!   nothing on the call path itself runs there.
//! - With panics caught: a shard's runtime does not catch a task's panic,
//!   so a panic in a service would unwind through the shard and take it
//!   down. Here it answers that one call with INTERNAL instead, as tonic's
//!   own server would by losing only the task.

use std::convert::Infallible;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::task::{Context, Poll};

/// What tonic's router answers.
type Answer = Result<hyper::Response<tonic::body::Body>, Infallible>;

/// A call's future, polled in the edge's tokio context with panics caught.
pub struct Guarded<F> {
    inner: F,
    tokio: tokio::runtime::Handle,
}

impl<F> Guarded<F> {
    pub fn new(inner: F, tokio: tokio::runtime::Handle) -> Self {
        Self { inner, tokio }
    }
}

impl<F: Future<Output = Answer>> Future for Guarded<F> {
    type Output = Answer;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Answer> {
        // SAFETY: `inner` is structurally pinned: it is never moved out of
        // `self`, and `Guarded` has no `Drop` of its own; `tokio` is never
        // pinned.
        let this = unsafe { self.get_unchecked_mut() };
        let _context = this.tokio.enter();
        // SAFETY: see above.
        let inner = unsafe { Pin::new_unchecked(&mut this.inner) };
        match std::panic::catch_unwind(AssertUnwindSafe(|| inner.poll(cx))) {
            Ok(p) => p,
            Err(payload) => {
                let why = crate::shard::Panicked::from(payload).0;
                tracing::error!(panic = %why, "a gRPC call's service panicked; answered with INTERNAL");
                // hyper polls a finished future no more, so the poisoned
                // inner future is only dropped.
                Poll::Ready(Ok(tonic::Status::internal(
                    "internal error: the broker failed while handling this call",
                )
                .into_http()))
            }
        }
    }
}
