//! hyper on a shard's monoio runtime: its I/O and its timer.
//!
//! I/O: [`UringIo`] drives hyper's reads and writes as monoio completion
//! ops with owned buffers (one `recv` per read, one `send` per flush), so a
//! request costs no readiness round trip and no speculative `recv` that
//! ends in `EAGAIN`. Timer: monoio's own timer wheel, so hyper's header
//! deadline and HTTP/2 keepalive cost no thread. Executor: HTTP/2 streams
//! are tasks on the shard (`monoio::spawn`), never on another thread.

use std::cell::Cell;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use monoio::BufResult;
use monoio::io::{
    AsyncReadRent, AsyncWriteRent, AsyncWriteRentExt, OwnedReadHalf, OwnedWriteHalf, Splitable,
};
use monoio::net::TcpStream;

/// hyper's timer, backed by the shard's monoio timer.
#[derive(Clone, Copy, Debug)]
pub struct ShardTimer;

/// The timer's sleep: one allocation (it was two), the timer pinned inside
/// it. hyper's HTTP/1 header deadline makes one for every request on a
/// kept-alive connection, and drops it once the head is read. `reset` is
/// left to hyper's default (a new sleep): tried in place, a monoio 0.2.4
/// timer that had been polled and was then moved earlier never fired.
type ShardSleep = ShardBound<monoio::time::Sleep>;

impl hyper::rt::Timer for ShardTimer {
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn hyper::rt::Sleep>> {
        Box::pin(ShardSleep::new(monoio::time::sleep(duration)))
    }

    fn sleep_until(&self, deadline: Instant) -> Pin<Box<dyn hyper::rt::Sleep>> {
        Box::pin(ShardSleep::new(monoio::time::sleep_until(deadline.into())))
    }

    /// hyper reads this to arm its HTTP/2 keep-alive ping (and its
    /// timeout) and the HTTP/1 header-read timeout, all of seconds, and
    /// the keep-alive part on every read of a connection: five clock reads
    /// a gRPC call. The coarse clock serves them ([`crate::coarse`]).
    /// hyper's adaptive window would measure round trips with it too; no
    /// edge enables it (a coarse round trip would be 0 or a tick).
    fn now(&self) -> Instant {
        crate::coarse::now()
    }
}

/// A future that stays on the thread that made it, and so may be held
/// where `Send + Sync` is demanded of it.
///
/// hyper's `Sleep` demands both because its timer may serve multi-threaded
/// executors, and tonic's services must return `Send` futures. Here every
/// future that owns one (an HTTP/1 connection, an HTTP/2 connection and its
/// streams, a gRPC call, its deadline) is a task on the shard's
/// single-threaded runtime ([`ShardExec`], `monoio::spawn`, no `Send`
/// bound) and never leaves the thread. Every poll and the drop check that,
/// so a misuse panics instead of touching the shard's state (its timer
/// wheel, an `Rc`) from another thread; a wrapper dropped on another thread
/// leaks its future rather than drop it there.
pub struct ShardBound<F> {
    inner: std::mem::ManuallyDrop<F>,
    thread: ThreadId,
}

thread_local! {
    /// This thread's id, read once: `std::thread::current()` clones an
    /// `Arc` on every call, and [`ShardBound`] asks on every poll.
    static THREAD: ThreadId = std::thread::current().id();
}

impl<F> ShardBound<F> {
    pub fn new(inner: F) -> Self {
        Self {
            inner: std::mem::ManuallyDrop::new(inner),
            thread: THREAD.with(|t| *t),
        }
    }

    /// `None` during a thread's teardown, when its id is already gone.
    fn on_its_thread(&self) -> Option<bool> {
        THREAD.try_with(|t| *t == self.thread).ok()
    }
}

// SAFETY: the inner future is only polled and dropped on the thread that
// created it (checked in `poll` and `drop`; never dropped elsewhere); a
// shard's connection futures are `!Send` tasks, and HTTP/2 streams run on
// [`ShardExec`], which keeps them on the shard.
unsafe impl<F> Send for ShardBound<F> {}
// SAFETY: `&ShardBound` exposes nothing of the inner future; all access to
// it goes through `Pin<&mut Self>` or `drop` (see `Send` above).
unsafe impl<F> Sync for ShardBound<F> {}

impl<F: Future> Future for ShardBound<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        assert!(
            self.on_its_thread() == Some(true),
            "a shard's future was polled on another thread"
        );
        // SAFETY: `inner` is structurally pinned: it is never moved out
        // (only dropped in place, in `drop`) and `Self` is not `Unpin`
        // unless `F` is.
        unsafe { self.map_unchecked_mut(|s| &mut *s.inner) }.poll(cx)
    }
}

impl hyper::rt::Sleep for ShardSleep {}

impl<F> Drop for ShardBound<F> {
    fn drop(&mut self) {
        match self.on_its_thread() {
            // SAFETY: dropped once, here, and never used again.
            Some(true) => unsafe { std::mem::ManuallyDrop::drop(&mut self.inner) },
            Some(false) if !std::thread::panicking() => {
                panic!("a shard's future was dropped on another thread (leaked instead)")
            }
            // Another thread while unwinding, or a thread that is ending (a
            // panic in a thread-local's destructor would abort): leaked.
            _ => {}
        }
    }
}

/// hyper's executor for HTTP/2 streams: a task on the current shard.
#[derive(Clone, Copy, Debug)]
pub struct ShardExec;

impl<F> hyper::rt::Executor<F> for ShardExec
where
    F: Future + 'static,
{
    fn execute(&self, fut: F) {
        monoio::spawn(fut);
    }
}

/// Bytes one `recv` may bring in: hyper's first read buffer is 8 KiB, and a
/// larger request body arrives in several reads either way.
const READ_CAPACITY: usize = 16 * 1024;
/// Buffered response bytes past which `poll_write` sends them without
/// waiting for hyper's flush (and holds hyper back while a send is out).
const WRITE_HIGH_WATER: usize = 64 * 1024;

/// A connection's receiving side as hyper's I/O reads it: what is ready is
/// copied straight into hyper's buffer; a socket op brings more.
pub trait RecvSide: Sized {
    /// Bytes ready without a socket read, as `BufRead::fill_buf`:
    /// `Some(Ok(bytes))`, empty at the stream's end; `Some(Err)` when the
    /// stream failed; `None` until [`RecvSide::fill`] brings more.
    fn ready(&mut self) -> Option<io::Result<&[u8]>>;
    /// Takes `n` bytes of what [`RecvSide::ready`] gave.
    fn consume(&mut self, n: usize);
    /// One socket read.
    fn fill(&mut self) -> impl Future<Output = io::Result<()>>;
}

/// A connection's sending side as hyper's I/O writes it: hyper's bytes
/// are appended to the buffer the next send takes (sealed into TLS
/// records on the way, [`crate::tls::uring::Sealer`]).
pub trait SendSide {
    /// Appends `bytes` to `out`.
    fn stage(&mut self, out: &mut Vec<u8>, bytes: &[u8]) -> io::Result<()>;
    /// Makes `out` ready for the socket.
    fn seal(&mut self, out: &mut Vec<u8>) -> io::Result<()>;
    /// Appends what ends the stream before the socket is shut down.
    fn close(&mut self, out: &mut Vec<u8>) -> io::Result<()>;
}

/// The receiving side of a plaintext TCP stream: one `recv` into an owned
/// buffer.
pub struct TcpRecv {
    half: OwnedReadHalf<TcpStream>,
    /// Received bytes; `pos..` not yet handed out.
    buf: Vec<u8>,
    pos: usize,
    eof: bool,
}

impl RecvSide for TcpRecv {
    fn ready(&mut self) -> Option<io::Result<&[u8]>> {
        if self.pos < self.buf.len() {
            Some(Ok(&self.buf[self.pos..]))
        } else {
            self.eof.then_some(Ok(&[]))
        }
    }

    fn consume(&mut self, n: usize) {
        self.pos += n;
    }

    async fn fill(&mut self) -> io::Result<()> {
        let mut buf = std::mem::take(&mut self.buf);
        buf.clear();
        self.pos = 0;
        let (r, buf) = self.half.read(buf).await;
        self.buf = buf;
        crate::idle_poll::note_activity();
        // 0 bytes: the peer closed.
        self.eof = r? == 0;
        Ok(())
    }
}

impl RecvSide for crate::tls::uring::TlsReadHalf {
    fn ready(&mut self) -> Option<io::Result<&[u8]>> {
        crate::tls::uring::TlsReadHalf::ready(self)
    }

    fn consume(&mut self, n: usize) {
        crate::tls::uring::TlsReadHalf::consume(self, n)
    }

    fn fill(&mut self) -> impl Future<Output = io::Result<()>> {
        self.fill_more()
    }
}

/// Plaintext: hyper's bytes go out as they are.
pub struct Plain;

impl SendSide for Plain {
    fn stage(&mut self, out: &mut Vec<u8>, bytes: &[u8]) -> io::Result<()> {
        out.extend_from_slice(bytes);
        Ok(())
    }

    fn seal(&mut self, _: &mut Vec<u8>) -> io::Result<()> {
        Ok(())
    }

    fn close(&mut self, _: &mut Vec<u8>) -> io::Result<()> {
        Ok(())
    }
}

impl SendSide for crate::tls::uring::Sealer {
    fn stage(&mut self, out: &mut Vec<u8>, bytes: &[u8]) -> io::Result<()> {
        crate::tls::uring::Sealer::stage(self, out, bytes)
    }

    fn seal(&mut self, out: &mut Vec<u8>) -> io::Result<()> {
        crate::tls::uring::Sealer::seal(self, out)
    }

    fn close(&mut self, out: &mut Vec<u8>) -> io::Result<()> {
        crate::tls::uring::Sealer::close(self, out)
    }
}

type TcpWrite = OwnedWriteHalf<TcpStream>;
type FillOp<RS> = (io::Result<()>, RS);
type SendOp = (BufResult<usize, Vec<u8>>, TcpWrite);

/// One socket read into the receiving side; the side comes back with the
/// result.
async fn fill<RS: RecvSide>(mut side: RS) -> FillOp<RS> {
    let r = side.fill().await;
    (r, side)
}

/// Sends all of an owned buffer (a short send is continued, not reported).
async fn send(mut half: TcpWrite, buf: Vec<u8>) -> SendOp {
    let r = half.write_all(buf).await;
    (r, half)
}

/// A TCP stream (or a TLS stream over one, [`crate::tls::uring`]) as
/// hyper's I/O, over owned-buffer completion ops.
///
/// Reads: what the receiving side holds ([`RecvSide`]: received bytes, or
/// a TLS record opened in place) is copied straight into hyper's buffer;
/// when it holds nothing, one socket read brings more. Writes: hyper's
/// bytes are copied into the buffer the next send takes ([`SendSide`],
/// which seals them into TLS records on the way). So either way a byte is
/// copied once in user space, TLS or not.
///
/// Each direction owns its side while idle and lends it to its op while
/// one is out; the op future lives in a slot boxed once per connection
/// and overwritten in place, and the send buffers take turns, so past a
/// connection's first requests a request allocates nothing here. Dropping
/// the connection drops an op still in the kernel: monoio then keeps that
/// op's buffer alive until its completion arrives (and asks the kernel to
/// cancel it), so no buffer is freed under the kernel.
///
/// Writes are buffered: `poll_write` stages hyper's bytes and reports them
/// written; the send goes out on `poll_flush` (hyper flushes after every
/// message) or past [`WRITE_HIGH_WATER`]. A send that fails surfaces on the
/// next write, flush or shutdown, which is as soon as hyper can learn of it
/// from any buffered writer.
pub struct UringIo<RS, SS, R, W> {
    rd: Option<RS>,
    rd_op: Pin<Box<Option<R>>>,
    make_fill: fn(RS) -> R,
    /// Bytes handed to hyper so far, shared with the connection's watchdog
    /// (the gRPC edge's HTTP/2 preface deadline).
    received: Rc<Cell<u64>>,

    wr: Option<TcpWrite>,
    staging: SS,
    /// Bytes for the socket that no send carries yet.
    wr_pending: Vec<u8>,
    /// The buffer of the last finished send, cleared, for the next one.
    wr_spare: Option<Vec<u8>>,
    wr_op: Pin<Box<Option<W>>>,
    make_send: fn(TcpWrite, Vec<u8>) -> W,
    /// A failed send, for the next write, flush or shutdown to report.
    wr_error: Option<io::Error>,
    /// The stream's end (TLS close_notify) is staged.
    closing: bool,
    /// When the send in flight began (`None`: none is): the connection's
    /// watchdog cuts off a peer that takes nothing for `http.write_timeout`.
    send_started: Rc<Cell<Option<Instant>>>,
}

/// hyper's I/O over a plaintext TCP stream.
pub type TcpIo<R, W> = UringIo<TcpRecv, Plain, R, W>;

/// hyper's I/O over `stream`.
pub fn uring_io(
    stream: TcpStream,
) -> TcpIo<impl Future<Output = FillOp<TcpRecv>>, impl Future<Output = SendOp>> {
    let (rd, wr) = stream.into_split();
    let recv = TcpRecv {
        half: rd,
        buf: Vec::with_capacity(READ_CAPACITY),
        pos: 0,
        eof: false,
    };
    sides_io(recv, Plain, wr)
}

/// hyper's I/O over a TLS stream's halves: records are opened into
/// hyper's buffer and sealed from hyper's bytes, with no buffer between.
pub fn tls_io(
    rd: crate::tls::uring::TlsReadHalf,
    wr: crate::tls::uring::TlsWriteHalf,
) -> UringIo<
    crate::tls::uring::TlsReadHalf,
    crate::tls::uring::Sealer,
    impl Future<Output = FillOp<crate::tls::uring::TlsReadHalf>>,
    impl Future<Output = SendOp>,
> {
    let (sealer, wr) = wr.into_parts();
    sides_io(rd, sealer, wr)
}

fn sides_io<RS: RecvSide, SS: SendSide>(
    rd: RS,
    staging: SS,
    wr: TcpWrite,
) -> UringIo<RS, SS, impl Future<Output = FillOp<RS>>, impl Future<Output = SendOp>> {
    UringIo {
        rd: Some(rd),
        rd_op: Box::pin(None),
        make_fill: fill,
        received: Rc::default(),
        wr: Some(wr),
        staging,
        wr_pending: Vec::new(),
        wr_spare: None,
        wr_op: Box::pin(None),
        make_send: send,
        wr_error: None,
        closing: false,
        send_started: Rc::default(),
    }
}

impl<RS, SS: SendSide, R, W> UringIo<RS, SS, R, W>
where
    W: Future<Output = SendOp>,
{
    /// Polls the send in flight, if any; `Ready` once none is.
    fn poll_send(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let Some(op) = self.wr_op.as_mut().as_pin_mut() else {
            return Poll::Ready(());
        };
        let ((res, mut buf), half) = std::task::ready!(op.poll(cx));
        self.wr_op.set(None);
        self.send_started.set(None);
        self.wr = Some(half);
        if let Err(e) = res {
            self.wr_error.get_or_insert(e);
        }
        // A buffer one large response grew is not kept for the small ones.
        if buf.capacity() <= 2 * WRITE_HIGH_WATER {
            buf.clear();
            self.wr_spare = Some(buf);
        }
        Poll::Ready(())
    }

    /// Hands the staged bytes to a send (none may be in flight).
    fn start_send(&mut self) -> io::Result<()> {
        self.staging.seal(&mut self.wr_pending)?;
        let half = self.wr.take().expect("no send in flight");
        let next = self.wr_spare.take().unwrap_or_default();
        let buf = std::mem::replace(&mut self.wr_pending, next);
        self.wr_op.set(Some((self.make_send)(half, buf)));
        // The watchdog's write timeout is seconds: the coarse clock will do.
        self.send_started.set(Some(crate::coarse::now()));
        Ok(())
    }

    /// Bytes handed to hyper so far, shared with the connection's watchdog.
    pub fn recv_count(&self) -> Rc<Cell<u64>> {
        self.received.clone()
    }

    /// When the send in flight began, shared with the connection's watchdog.
    pub fn send_clock(&self) -> Rc<Cell<Option<Instant>>> {
        self.send_started.clone()
    }

    fn take_error(&mut self) -> io::Result<()> {
        self.wr_error.take().map_or(Ok(()), Err)
    }

    /// Sends everything staged; `Ready` once the kernel took all of it.
    fn poll_flush_all(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        loop {
            std::task::ready!(self.poll_send(cx));
            self.take_error()?;
            if self.wr_pending.is_empty() {
                return Poll::Ready(Ok(()));
            }
            self.start_send()?;
        }
    }

    /// Stages `bufs` for the next send, or `Pending` while the buffer is
    /// past its high water mark and a send is out.
    fn poll_buffer(
        &mut self,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let _ = self.poll_send(cx);
        self.take_error()?;
        if self.wr_pending.len() >= WRITE_HIGH_WATER {
            // One send at a time: the kernel owns that buffer until it ends.
            std::task::ready!(self.poll_send(cx));
            self.take_error()?;
            self.start_send()?;
            // Its first poll submits it.
            let _ = self.poll_send(cx);
            self.take_error()?;
        }
        let mut n = 0;
        for b in bufs {
            self.staging.stage(&mut self.wr_pending, b)?;
            n += b.len();
        }
        Poll::Ready(Ok(n))
    }
}

impl<RS: RecvSide + Unpin, SS: SendSide + Unpin, R, W> hyper::rt::Read for UringIo<RS, SS, R, W>
where
    R: Future<Output = FillOp<RS>>,
    W: Future<Output = SendOp>,
{
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        mut out: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if this.rd_op.is_none() {
                let side = this.rd.as_mut().expect("no read in flight");
                match side.ready() {
                    // Nothing put is hyper's EOF.
                    Some(Ok(src)) => {
                        let n = out.remaining().min(src.len());
                        out.put_slice(&src[..n]);
                        side.consume(n);
                        this.received.set(this.received.get() + n as u64);
                        return Poll::Ready(Ok(()));
                    }
                    Some(Err(e)) => return Poll::Ready(Err(e)),
                    None => {
                        let side = this.rd.take().expect("no read in flight");
                        this.rd_op.set(Some((this.make_fill)(side)));
                    }
                }
            }
            let op = this.rd_op.as_mut().as_pin_mut().expect("a read in flight");
            let (res, side) = std::task::ready!(op.poll(cx));
            this.rd_op.set(None);
            this.rd = Some(side);
            res?;
        }
    }
}

impl<RS: Unpin, SS: SendSide + Unpin, R, W> hyper::rt::Write for UringIo<RS, SS, R, W>
where
    W: Future<Output = SendOp>,
{
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().poll_buffer(cx, &[io::IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().poll_buffer(cx, bufs)
    }

    /// `true`: hyper then hands head and body as separate slices (no copy
    /// into its own buffer first), and they still go out in one send.
    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().poll_flush_all(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.closing {
            this.closing = true;
            // TLS: close_notify, sent with whatever is staged. One that
            // cannot be sealed (the record count exhausted) is left out:
            // HTTP messages carry their own lengths, so its absence
            // truncates nothing.
            let _ = this.staging.close(&mut this.wr_pending);
        }
        std::task::ready!(this.poll_flush_all(cx))?;
        let half = this.wr.as_mut().expect("no send in flight after a flush");
        // monoio shuts a TCP stream down with a plain syscall: the future
        // is ready at its first poll.
        let shutdown = std::pin::pin!(half.shutdown());
        shutdown.poll(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::rt::{Read, Write};
    use std::io::{Read as _, Write as _};
    use std::mem::MaybeUninit;

    fn on_runtime<F: Future>(f: F) -> F::Output {
        monoio::RuntimeBuilder::<monoio::FusionDriver>::new()
            .enable_timer()
            .build()
            .expect("monoio runtime")
            .block_on(f)
    }

    /// Counts its drops; holds an `Rc` as a shard's futures do.
    struct Counted(Rc<()>, std::sync::Arc<std::sync::atomic::AtomicUsize>);
    impl Drop for Counted {
        fn drop(&mut self) {
            self.1.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    #[test]
    fn a_shard_bound_future_runs_and_drops_on_its_thread_only() {
        use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
        let drops = std::sync::Arc::new(AtomicUsize::new(0));
        // On its thread: polled to the end, dropped in place.
        let c = Counted(Rc::new(()), drops.clone());
        let f = ShardBound::new(async move { Rc::strong_count(&c.0) });
        assert_eq!(on_runtime(f), 1);
        assert_eq!(drops.load(SeqCst), 1);
        // Moved to another thread and polled there: a panic, not a poll.
        let c = Counted(Rc::new(()), drops.clone());
        let mut f = Box::pin(ShardBound::new(async move {
            let _c = &c;
        }));
        let polled = std::thread::spawn(move || {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let waker = std::task::Waker::noop();
                let _ = f.as_mut().poll(&mut Context::from_waker(waker));
            }));
            (r.is_err(), f)
        })
        .join()
        .expect("the thread itself returns");
        assert!(polled.0, "a poll on another thread panics");
        // Dropped on yet another thread: leaked, its `Rc` never touched
        // there, and the drop says so.
        let f = polled.1;
        let dropped = std::thread::spawn(move || drop(f)).join();
        assert!(dropped.is_err(), "a drop on another thread panics");
        assert_eq!(
            drops.load(SeqCst),
            1,
            "the inner future was not dropped there"
        );
    }

    /// Our end on the runtime, the peer's a blocking std socket.
    async fn pair() -> (
        TcpIo<impl Future<Output = FillOp<TcpRecv>>, impl Future<Output = SendOp>>,
        std::net::TcpStream,
    ) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let ours = TcpStream::connect(listener.local_addr().expect("addr"))
            .await
            .expect("connect");
        let (peer, _) = listener.accept().expect("accept");
        (uring_io(ours), peer)
    }

    /// One hyper read with room for `room` bytes.
    async fn read<R, W>(io: &mut TcpIo<R, W>, room: usize) -> io::Result<Vec<u8>>
    where
        R: Future<Output = FillOp<TcpRecv>>,
        W: Future<Output = SendOp>,
    {
        let mut storage = vec![MaybeUninit::<u8>::uninit(); room];
        let mut rb = hyper::rt::ReadBuf::uninit(&mut storage);
        std::future::poll_fn(|cx| Pin::new(&mut *io).poll_read(cx, rb.unfilled())).await?;
        Ok(rb.filled().to_vec())
    }

    async fn write_vectored<R, W>(io: &mut TcpIo<R, W>, bufs: &[&[u8]]) -> io::Result<usize>
    where
        R: Future<Output = FillOp<TcpRecv>>,
        W: Future<Output = SendOp>,
    {
        let slices: Vec<io::IoSlice<'_>> = bufs.iter().map(|b| io::IoSlice::new(b)).collect();
        std::future::poll_fn(|cx| Pin::new(&mut *io).poll_write_vectored(cx, &slices)).await
    }

    async fn flush<R, W>(io: &mut TcpIo<R, W>) -> io::Result<()>
    where
        R: Future<Output = FillOp<TcpRecv>>,
        W: Future<Output = SendOp>,
    {
        std::future::poll_fn(|cx| Pin::new(&mut *io).poll_flush(cx)).await
    }

    #[test]
    fn bytes_a_short_read_cannot_take_come_with_the_next_reads_in_order() {
        on_runtime(async {
            let (mut io, mut peer) = pair().await;
            peer.write_all(b"hello world!").expect("peer write");
            // One recv takes all twelve bytes; hyper's room is five.
            assert_eq!(read(&mut io, 5).await.expect("read"), b"hello");
            assert_eq!(read(&mut io, 5).await.expect("read"), b" worl");
            assert_eq!(read(&mut io, 64).await.expect("read"), b"d!");
            peer.write_all(b"more").expect("peer write");
            assert_eq!(read(&mut io, 64).await.expect("read"), b"more");
        });
    }

    #[test]
    fn a_closed_peer_reads_as_nothing_filled() {
        on_runtime(async {
            let (mut io, mut peer) = pair().await;
            peer.write_all(b"last").expect("peer write");
            drop(peer);
            assert_eq!(read(&mut io, 64).await.expect("read"), b"last");
            assert_eq!(read(&mut io, 64).await.expect("read"), b"");
        });
    }

    #[test]
    fn vectored_writes_are_held_until_the_flush_and_then_arrive_whole() {
        on_runtime(async {
            let (mut io, mut peer) = pair().await;
            let head = b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\n";
            let n = write_vectored(&mut io, &[head, b"body"])
                .await
                .expect("write");
            assert_eq!(n, head.len() + 4);
            peer.set_nonblocking(true).expect("nonblocking");
            let mut got = [0u8; 64];
            let early = peer
                .read(&mut got)
                .expect_err("nothing sent before the flush");
            assert_eq!(early.kind(), io::ErrorKind::WouldBlock);
            flush(&mut io).await.expect("flush");
            peer.set_nonblocking(false).expect("blocking");
            let mut got = vec![0u8; head.len() + 4];
            peer.read_exact(&mut got).expect("peer read");
            assert_eq!(&got[..head.len()], head);
            assert_eq!(&got[head.len()..], b"body");
        });
    }

    #[test]
    fn writes_past_the_high_water_mark_all_arrive_in_order() {
        on_runtime(async {
            let (mut io, peer) = pair().await;
            let reader = std::thread::spawn(move || {
                let mut peer = peer;
                let mut all = Vec::new();
                peer.read_to_end(&mut all).expect("peer read");
                all
            });
            let total = 4 * WRITE_HIGH_WATER + 123;
            let data: Vec<u8> = (0..total).map(|i| (i % 251) as u8).collect();
            for chunk in data.chunks(7 * 1024) {
                let n = write_vectored(&mut io, &[chunk]).await.expect("write");
                assert_eq!(n, chunk.len());
            }
            flush(&mut io).await.expect("flush");
            std::future::poll_fn(|cx| Pin::new(&mut io).poll_shutdown(cx))
                .await
                .expect("shutdown");
            let got = reader.join().expect("reader thread");
            assert_eq!(got.len(), data.len());
            assert!(got == data, "bytes arrived out of order");
        });
    }

    #[test]
    fn a_send_to_a_reset_peer_fails_on_a_later_flush() {
        on_runtime(async {
            let (mut io, peer) = pair().await;
            // Linger 0: the close sends a reset, not a FIN.
            socket2::SockRef::from(&peer)
                .set_linger(Some(Duration::ZERO))
                .expect("linger");
            drop(peer);
            let mut failed = None;
            for _ in 0..100 {
                // Buffered: the write itself is accepted.
                assert_eq!(write_vectored(&mut io, &[b"data"]).await.expect("write"), 4);
                if let Err(e) = flush(&mut io).await {
                    failed = Some(e);
                    break;
                }
            }
            let e = failed.expect("a send to a reset peer fails");
            assert!(
                matches!(
                    e.kind(),
                    io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe
                ),
                "{e}"
            );
        });
    }

    #[test]
    fn dropping_the_io_with_a_recv_in_flight_leaves_the_runtime_serving() {
        on_runtime(async {
            let (mut io, mut peer) = pair().await;
            let mut storage = [MaybeUninit::<u8>::uninit(); 64];
            let mut rb = hyper::rt::ReadBuf::uninit(&mut storage);
            let first = std::future::poll_fn(|cx| {
                Poll::Ready(Pin::new(&mut io).poll_read(cx, rb.unfilled()).is_pending())
            })
            .await;
            assert!(first, "no data yet: the recv stays in flight");
            drop(io);
            // The kernel may still complete the dropped recv into its
            // buffer, which monoio keeps until then.
            let _ = peer.write_all(&[7u8; 32 * 1024]);
            let (mut io, mut peer) = pair().await;
            peer.write_all(b"next").expect("peer write");
            assert_eq!(read(&mut io, 64).await.expect("read"), b"next");
        });
    }
}
