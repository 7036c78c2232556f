//! The per-thread async runtime a driver needs: monoio (io_uring or epoll)
//! for the frame driver, a current-thread tokio runtime for the tonic
//! client of the gRPC driver.
//!
//! The engine's worker loop (start line, ticks, timeouts, the open-loop
//! schedule) is written once against this trait, so both targets share the
//! same scheduling and stop rules exactly.
//!
//! # Invariants
//! - A runtime is built, used and dropped on one worker thread; tasks it
//!   spawns are `!Send` and never leave that thread.

use std::future::Future;
use std::pin::Pin;
use std::time::Instant;

/// A boxed task handle that completes when the task does.
pub type Join = Pin<Box<dyn Future<Output = ()>>>;

pub trait Runtime: Sized + 'static {
    /// Builds this thread's runtime.
    fn build() -> std::io::Result<Self>;
    /// Runs `f` to completion on this thread.
    fn block_on<F: Future>(&mut self, f: F) -> F::Output;
    /// Spawns a task on the current thread's runtime (inside `block_on`).
    fn spawn<F: Future<Output = ()> + 'static>(f: F) -> Join;
    /// Completes at `t` (at the runtime timer's resolution).
    fn sleep_until(t: Instant) -> impl Future<Output = ()>;
    /// Whether I/O goes through io_uring (else epoll), for the report.
    fn io_uring() -> bool;
}

/// monoio with io_uring when available, else epoll ("fusion" driver).
///
/// The ring is set up with `COOP_TASKRUN` (Linux 5.19+; refused with
/// EINVAL before, then the classic ring): a completion for this thread does
/// not interrupt it with an IPI to run the completion's task work; the work
/// runs at its next syscall, which comes soon since the worker submits or
/// waits on every loop of its runtime (the open-loop spin included). Without
/// it, every answer a server sends to a generator that is busy costs the
/// *server's* CPU an inter-processor interrupt over loopback, a cost no
/// server pays for a client on another machine; with it the generator also
/// loses fewer cycles to interruptions at high rates.
pub struct Monoio(
    monoio::FusionRuntime<
        monoio::time::TimeDriver<monoio::IoUringDriver>,
        monoio::time::TimeDriver<monoio::LegacyDriver>,
    >,
);

impl Runtime for Monoio {
    fn build() -> std::io::Result<Self> {
        let build = |coop: bool| {
            let mut urb = io_uring::IoUring::builder();
            if coop {
                urb.setup_coop_taskrun();
            }
            monoio::RuntimeBuilder::<monoio::FusionDriver>::new()
                .uring_builder(urb)
                .enable_timer()
                .build()
                .map(Monoio)
        };
        build(true).or_else(|_| build(false))
    }

    fn block_on<F: Future>(&mut self, f: F) -> F::Output {
        self.0.block_on(f)
    }

    fn spawn<F: Future<Output = ()> + 'static>(f: F) -> Join {
        Box::pin(monoio::spawn(f))
    }

    fn sleep_until(t: Instant) -> impl Future<Output = ()> {
        monoio::time::sleep_until(monoio::time::Instant::from_std(t))
    }

    fn io_uring() -> bool {
        monoio::utils::detect_uring()
    }
}

/// A current-thread tokio runtime with a `LocalSet`, so connection tasks
/// can hold `Rc` state like the monoio ones. tonic's own background tasks
/// (one per HTTP/2 connection) run on the same thread.
pub struct Tokio {
    rt: tokio::runtime::Runtime,
    local: tokio::task::LocalSet,
}

impl Runtime for Tokio {
    fn build() -> std::io::Result<Self> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()?;
        Ok(Tokio {
            rt,
            local: tokio::task::LocalSet::new(),
        })
    }

    fn block_on<F: Future>(&mut self, f: F) -> F::Output {
        self.local.block_on(&self.rt, f)
    }

    fn spawn<F: Future<Output = ()> + 'static>(f: F) -> Join {
        let h = tokio::task::spawn_local(f);
        Box::pin(async move {
            // A panicking task is the only error (nothing aborts these):
            // let the worker carry on, as with monoio.
            let _ = h.await;
        })
    }

    fn sleep_until(t: Instant) -> impl Future<Output = ()> {
        tokio::time::sleep_until(tokio::time::Instant::from_std(t))
    }

    fn io_uring() -> bool {
        false
    }
}
