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

#[cfg(test)]
mod tests {
    use super::*;

    fn poll_once<F: Future>(f: F) -> Poll<F::Output> {
        let mut f = std::pin::pin!(f);
        f.as_mut()
            .poll(&mut Context::from_waker(std::task::Waker::noop()))
    }

    #[test]
    fn a_panicking_call_answers_internal_and_a_call_runs_in_the_tokio_context() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let panics = Guarded::new(
            async {
                if std::hint::black_box(true) {
                    panic!("a bug in a service");
                }
                Ok(hyper::Response::new(tonic::body::Body::empty()))
            },
            rt.handle().clone(),
        );
        let Poll::Ready(Ok(r)) = poll_once(panics) else {
            panic!("a panic must end the call at once")
        };
        assert_eq!(
            r.headers().get("grpc-status").map(|v| v.as_bytes()),
            Some(&b"13"[..]),
            "INTERNAL"
        );

        // tokio::spawn needs the context (tonic's reflection service uses it).
        let spawns = Guarded::new(
            async {
                drop(tokio::spawn(async {}));
                Ok(hyper::Response::new(tonic::body::Body::empty()))
            },
            rt.handle().clone(),
        );
        let Poll::Ready(Ok(r)) = poll_once(spawns) else {
            panic!("ready")
        };
        assert!(r.headers().get("grpc-status").is_none(), "not an error");
    }
}
