//! The edge's connections: who a call comes from, and a bound on how long a
//! connection may take to start speaking HTTP/2.
//!
//! Every accepted TCP connection gets a process-unique id (never reused) and
//! is wrapped in [`EdgeIo`], which tonic hands back to each call as a
//! [`ConnInfo`] request extension. [`Identity`] is what a session is bound
//! to: the connection, and with `[auth]` also the token's subject.
//!
//! # Invariants
//! - A connection that has not sent the 24-byte HTTP/2 client preface within
//!   `grpc.handshake_timeout` fails its next read or write, so hyper drops
//!   it. Without this a bare TCP connection that never speaks holds tonic's
//!   graceful shutdown forever (hyper waits for a handshake to finish before
//!   it can close the connection).
//! - [`ConnInfo::is_open`] turns false when the connection is dropped, so
//!   sessions bound to it can be reclaimed at once.
//!
//! - With `[tls]`, each accepted connection's TLS handshake runs in a task
//!   of its own, bounded by `tls.handshake_timeout`; [`Incoming`] yields the
//!   connection once the handshake is done, so a slow handshake never holds
//!   up accepting others. The preface deadline then starts.
//! - At most `grpc.max_connections` connections are open at once, TLS
//!   handshakes in progress included (a handshake task holds its slot until
//!   it ends or hands the connection on); a connection accepted beyond that
//!   is closed at once. Without the count, slow handshakes were bounded
//!   only in time, and a flood of them in number by nothing.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use mcp_proto::v1::LogLevel;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tonic::codegen::tokio_stream::Stream;
use tonic::transport::server::{Connected, TcpIncoming};

/// The HTTP/2 client connection preface (RFC 9113 §3.4) is this long.
const PREFACE_LEN: usize = 24;

/// Who is calling: what a session is bound to. A session presented by any
/// other identity is unknown to that caller.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Identity {
    /// The HTTP/2 connection the call arrived on (ids are never reused),
    /// when the broker runs without `[auth]`.
    Connection(u64),
    /// With `[auth]`: the connection and the subject (`sub`) of the token
    /// the call carried. A session is unknown to another subject even on
    /// the same connection.
    Subject { conn: u64, subject: String },
}

/// What the edge knows about one connection; shared by its calls.
#[derive(Debug)]
struct ConnState {
    id: u64,
    remote: Option<SocketAddr>,
    open: AtomicBool,
    /// The log level a session-less SetLoggingLevel set on this connection
    /// (0 = none): the default for its sessions and its Subscribe streams.
    level: AtomicI32,
}

/// A connection's identity and state, as a request extension.
#[derive(Clone, Debug)]
pub struct ConnInfo(Arc<ConnState>);

impl ConnInfo {
    fn new(remote: Option<SocketAddr>) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        Self(Arc::new(ConnState {
            id: NEXT.fetch_add(1, Ordering::Relaxed),
            remote,
            open: AtomicBool::new(true),
            level: AtomicI32::new(0),
        }))
    }

    /// A connection for unit tests and for calls that arrive without one
    /// (never from the network: every accepted connection has its own).
    pub fn detached() -> Self {
        Self::new(None)
    }

    pub fn identity(&self) -> Identity {
        Identity::Connection(self.0.id)
    }

    /// The identity of a call on this connection authenticated as
    /// `subject`.
    pub fn authenticated(&self, subject: &str) -> Identity {
        Identity::Subject {
            conn: self.0.id,
            subject: subject.to_owned(),
        }
    }

    pub fn remote(&self) -> Option<SocketAddr> {
        self.0.remote
    }

    pub fn is_open(&self) -> bool {
        self.0.open.load(Ordering::Acquire)
    }

    pub(super) fn close(&self) {
        self.0.open.store(false, Ordering::Release);
    }

    /// The level a session-less SetLoggingLevel set on this connection.
    pub fn level(&self) -> Option<LogLevel> {
        match self.0.level.load(Ordering::Relaxed) {
            0 => None,
            l => LogLevel::try_from(l).ok(),
        }
    }

    pub fn set_level(&self, level: LogLevel) {
        self.0.level.store(level as i32, Ordering::Relaxed);
    }
}

/// What an [`EdgeIo`] reads and writes: TCP, or TLS over it.
enum Transport {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

impl Transport {
    fn pin(&mut self) -> Pin<&mut (dyn AsyncReadWrite + '_)> {
        match self {
            Transport::Plain(s) => Pin::new(s),
            Transport::Tls(s) => Pin::new(&mut **s),
        }
    }
}

/// Both directions of a transport, as one trait object.
trait AsyncReadWrite: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> AsyncReadWrite for T {}

/// One of the edge's `grpc.max_connections`, held from the accept until
/// the connection (or its failed TLS handshake) is dropped.
struct Slot(Arc<AtomicUsize>);

impl Slot {
    /// A slot, unless `max` are taken.
    fn take(open: &Arc<AtomicUsize>, max: usize) -> Option<Slot> {
        open.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < max).then_some(n + 1)
        })
        .ok()
        .map(|_| Slot(open.clone()))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// An accepted connection with its identity and handshake deadline.
pub struct EdgeIo {
    io: Transport,
    info: ConnInfo,
    /// Bytes of the client preface still to come, with the deadline for
    /// them; `None` once the preface is in.
    handshake: Option<(usize, Pin<Box<tokio::time::Sleep>>)>,
    /// Its place under `grpc.max_connections` (`None` in unit tests).
    _slot: Option<Slot>,
}

impl EdgeIo {
    #[cfg(test)]
    fn new(io: TcpStream, handshake_timeout: Duration) -> Self {
        let remote = io.peer_addr().ok();
        Self::over(Transport::Plain(io), remote, handshake_timeout, None)
    }

    fn over(
        io: Transport,
        remote: Option<SocketAddr>,
        handshake_timeout: Duration,
        slot: Option<Slot>,
    ) -> Self {
        let info = ConnInfo::new(remote);
        Self {
            io,
            info,
            handshake: Some((PREFACE_LEN, Box::pin(tokio::time::sleep(handshake_timeout)))),
            _slot: slot,
        }
    }

    /// Fails once the handshake deadline has passed without the preface.
    fn check_deadline(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        let Some((_, sleep)) = &mut self.handshake else {
            return Ok(());
        };
        if sleep.as_mut().poll(cx).is_pending() {
            return Ok(());
        }
        let peer = self.info.remote();
        tracing::debug!(
            ?peer,
            "gRPC connection closed: no HTTP/2 preface in time (grpc.handshake_timeout)"
        );
        Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "no HTTP/2 client preface within grpc.handshake_timeout",
        ))
    }
}

impl Drop for EdgeIo {
    fn drop(&mut self) {
        self.info.close();
    }
}

impl Connected for EdgeIo {
    type ConnectInfo = ConnInfo;

    fn connect_info(&self) -> ConnInfo {
        self.info.clone()
    }
}

impl AsyncRead for EdgeIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let before = buf.filled().len();
        match this.io.pin().poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if let Some((left, _)) = &mut this.handshake {
                    *left = left.saturating_sub(buf.filled().len() - before);
                    if *left == 0 {
                        this.handshake = None;
                    }
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            // Polling the deadline registers this task with its timer, so a
            // silent peer is woken up and failed when it passes.
            Poll::Pending => {
                this.check_deadline(cx)?;
                Poll::Pending
            }
        }
    }
}

impl AsyncWrite for EdgeIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.check_deadline(cx)?;
        self.io.pin().poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.io.pin().poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.io.pin().poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.check_deadline(cx)?;
        self.io.pin().poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        match &self.io {
            Transport::Plain(s) => s.is_write_vectored(),
            Transport::Tls(s) => s.is_write_vectored(),
        }
    }
}

/// The listener's connections, each wrapped in an [`EdgeIo`]. A reload may
/// hand over a new listener (`rebinds`): it takes new connections from then
/// on, and the old one lingers for [`crate::shared::LISTENER_LINGER`] (its
/// backlog, clients that raced the change) before it closes.
pub struct Incoming {
    inner: TcpIncoming,
    handshake_timeout: Duration,
    rebinds: Option<futures_channel::mpsc::UnboundedReceiver<std::net::TcpListener>>,
    old: Option<(TcpIncoming, Pin<Box<tokio::time::Sleep>>)>,
    /// `[tls]`: the handshakes' settings, and the connections whose
    /// handshake tasks finished.
    tls: Option<Tls>,
    /// Connections open, handshakes included, and their bound
    /// (`grpc.max_connections`).
    open: Arc<AtomicUsize>,
    max_connections: usize,
}

struct Tls {
    server: Arc<crate::tls::ServerTls>,
    done_tx: tokio::sync::mpsc::UnboundedSender<EdgeIo>,
    done_rx: tokio::sync::mpsc::UnboundedReceiver<EdgeIo>,
}

impl Incoming {
    pub fn new(
        inner: TcpIncoming,
        handshake_timeout: Duration,
        rebinds: Option<futures_channel::mpsc::UnboundedReceiver<std::net::TcpListener>>,
        tls: Option<Arc<crate::tls::ServerTls>>,
        max_connections: usize,
    ) -> Self {
        Self {
            inner,
            handshake_timeout,
            rebinds,
            old: None,
            open: Arc::default(),
            max_connections,
            tls: tls.map(|server| {
                let (done_tx, done_rx) = tokio::sync::mpsc::unbounded_channel();
                Tls {
                    server,
                    done_tx,
                    done_rx,
                }
            }),
        }
    }

    /// The next TCP connection with its slot; one accepted beyond
    /// `grpc.max_connections` is closed here (dropped) and the next one
    /// taken.
    fn poll_admit(&mut self, cx: &mut Context<'_>) -> Poll<Option<io::Result<(TcpStream, Slot)>>> {
        loop {
            let tcp = match ready!(self.poll_accept(cx)) {
                Some(Ok(tcp)) => tcp,
                Some(Err(e)) => return Poll::Ready(Some(Err(e))),
                None => return Poll::Ready(None),
            };
            match Slot::take(&self.open, self.max_connections) {
                Some(slot) => return Poll::Ready(Some(Ok((tcp, slot)))),
                None => {
                    let max = self.max_connections;
                    tracing::warn!(peer = ?tcp.peer_addr().ok(), max, "gRPC connection refused: grpc.max_connections reached");
                }
            }
        }
    }

    /// Polls the listener (and a lingering old one) for a TCP connection.
    fn poll_accept(&mut self, cx: &mut Context<'_>) -> Poll<Option<io::Result<TcpStream>>> {
        if let Some((old, until)) = self.old.as_mut() {
            if until.as_mut().poll(cx).is_ready() {
                self.old = None;
            } else if let Poll::Ready(Some(r)) = Pin::new(old).poll_next(cx) {
                return Poll::Ready(Some(r));
            }
        }
        Pin::new(&mut self.inner).poll_next(cx)
    }

    /// Runs `tcp`'s TLS handshake in a task of its own; the connection
    /// comes back through `done_rx`.
    fn spawn_handshake(&self, tls: &Tls, tcp: TcpStream, slot: Slot) {
        use crate::tls::Edge;
        let server = tls.server.clone();
        let done = tls.done_tx.clone();
        let preface_timeout = self.handshake_timeout;
        tokio::spawn(async move {
            let remote = tcp.peer_addr().ok();
            let timeout = server.handshake_timeout();
            let acceptor = tokio_rustls::TlsAcceptor::from(server.config(Edge::Grpc));
            match tokio::time::timeout(timeout, acceptor.accept(tcp)).await {
                Ok(Ok(s)) => {
                    let io = EdgeIo::over(
                        Transport::Tls(Box::new(s)),
                        remote,
                        preface_timeout,
                        Some(slot),
                    );
                    // Refused only once the edge stopped accepting.
                    let _ = done.send(io);
                }
                Ok(Err(e)) => {
                    server.handshake_failed(Edge::Grpc);
                    tracing::debug!(?remote, error = %e, "gRPC edge: TLS handshake failed");
                }
                Err(_) => {
                    server.handshake_failed(Edge::Grpc);
                    tracing::debug!(
                        ?remote,
                        ?timeout,
                        "gRPC edge: TLS handshake not finished within tls.handshake_timeout"
                    );
                }
            }
        });
    }

    /// Takes a listener a reload handed over, if any (on the edge's runtime,
    /// where tokio can register it).
    fn take_rebind(&mut self, cx: &mut Context<'_>) {
        let Some(rx) = self.rebinds.as_mut() else {
            return;
        };
        while let Poll::Ready(next) = Pin::new(&mut *rx).poll_next(cx) {
            let Some(l) = next else {
                self.rebinds = None;
                return;
            };
            let new = l
                .set_nonblocking(true)
                .and_then(|()| tokio::net::TcpListener::from_std(l));
            match new {
                Ok(new) => {
                    tracing::info!(addr = ?new.local_addr().ok(), "gRPC edge listening on a new address after a reload");
                    let new = TcpIncoming::from(new).with_nodelay(Some(true));
                    let prev = std::mem::replace(&mut self.inner, new);
                    let until = Box::pin(tokio::time::sleep(crate::shared::LISTENER_LINGER));
                    self.old = Some((prev, until));
                }
                Err(e) => {
                    tracing::error!(error = %e, "cannot take a reload's new gRPC listener; keeping the old one")
                }
            }
        }
    }
}

impl Stream for Incoming {
    type Item = io::Result<EdgeIo>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let timeout = self.handshake_timeout;
        self.take_rebind(cx);
        let Some(tls) = self.tls.take() else {
            let next = ready!(self.poll_admit(cx));
            return Poll::Ready(next.map(|r| {
                r.map(|(io, slot)| {
                    let remote = io.peer_addr().ok();
                    EdgeIo::over(Transport::Plain(io), remote, timeout, Some(slot))
                })
            }));
        };
        // Start the handshake of every connection waiting, then hand out
        // one whose handshake is done.
        let mut ended = false;
        let mut failed = None;
        loop {
            match self.poll_admit(cx) {
                Poll::Ready(Some(Ok((tcp, slot)))) => self.spawn_handshake(&tls, tcp, slot),
                Poll::Ready(Some(Err(e))) => {
                    failed = Some(e);
                    break;
                }
                Poll::Ready(None) => {
                    ended = true;
                    break;
                }
                Poll::Pending => break,
            }
        }
        let mut tls = tls;
        let ready = tls.done_rx.poll_recv(cx);
        self.tls = Some(tls);
        if let Some(e) = failed {
            return Poll::Ready(Some(Err(e)));
        }
        match ready {
            Poll::Ready(Some(io)) => Poll::Ready(Some(Ok(io))),
            _ if ended => Poll::Ready(None),
            _ => Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_have_distinct_identities_and_a_level_of_their_own() {
        let a = ConnInfo::detached();
        let b = ConnInfo::detached();
        assert_ne!(a.identity(), b.identity());
        assert_eq!(a.identity(), a.clone().identity());
        assert_eq!(a.level(), None);
        a.set_level(LogLevel::Error);
        assert_eq!(a.level(), Some(LogLevel::Error));
        assert_eq!(b.level(), None);
        assert!(a.is_open());
        a.close();
        assert!(!a.clone().is_open());
    }

    #[tokio::test]
    async fn a_connection_without_the_http2_preface_fails_at_the_handshake_deadline() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let mut client = TcpStream::connect(addr).await.unwrap();
        let (s, _) = l.accept().await.unwrap();
        let mut io = EdgeIo::new(s, Duration::from_millis(100));
        // Part of a preface is not a handshake.
        client.write_all(b"PRI * HTTP/2.0\r\n").await.unwrap();
        let mut buf = [0u8; 64];
        let n = io.read(&mut buf).await.unwrap();
        assert_eq!(n, 16);
        let t = std::time::Instant::now();
        let e = io.read(&mut buf).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert!(t.elapsed() < Duration::from_secs(5));

        // The whole preface in time clears the deadline for good.
        let mut client = TcpStream::connect(addr).await.unwrap();
        let (s, _) = l.accept().await.unwrap();
        let mut io = EdgeIo::new(s, Duration::from_millis(100));
        client
            .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            .await
            .unwrap();
        let mut got = 0;
        while got < PREFACE_LEN {
            got += io.read(&mut buf).await.unwrap();
        }
        assert!(io.handshake.is_none());
        let read = tokio::time::timeout(Duration::from_millis(300), io.read(&mut buf)).await;
        assert!(
            read.is_err(),
            "still waiting for data, not failed: {read:?}"
        );
    }
}
