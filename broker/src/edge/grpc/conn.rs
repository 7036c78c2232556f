//! The edge's connections on a shard: accept, TLS, the HTTP/2 preface
//! deadline, hyper's HTTP/2 server with tonic's services, age and drain; and
//! who a call comes from.
//!
//! Every accepted TCP connection gets a process-unique id (never reused),
//! handed to each of its calls as a [`ConnInfo`] request extension.
//! [`Identity`] is what a session is bound to: the connection, and with
//! `[auth]` also the token's subject.
//!
//! # Invariants
//! - A connection lives on the shard that accepted it; its streams are
//!   tasks on that shard (`crate::edge::rt::ShardExec`), and so are the
//!   calls they make, which reach a router without leaving the thread
//!   unless their session belongs to another shard.
//! - A connection that has not sent the 24-byte HTTP/2 client preface within
//!   `grpc.handshake_timeout` (counted after the TLS handshake) is closed.
//!   Without this a bare TCP connection that never speaks holds the drain
//!   forever (hyper waits for a handshake to finish before it can close the
//!   connection).
//! - [`ConnInfo::is_open`] turns false when the connection is dropped, so
//!   sessions bound to it can be reclaimed at once.
//! - Each connection's TLS handshake runs in the connection's own task,
//!   bounded by `tls.handshake_timeout`, so a slow handshake never holds up
//!   accepting others.
//! - At most `grpc.max_connections` connections are open at once across
//!   the shards, TLS handshakes in progress included; a connection accepted
//!   beyond that is closed at once. Without the count, slow handshakes were
//!   bounded only in time, and a flood of them in number by nothing.
//! - A unary answer that HTTP/2 flow control lets none of out for
//!   `grpc.write_timeout` (the peer never reads, or holds its receive window
//!   at 0 while still answering PINGs) closes its connection within twice
//!   that, freeing every answer held for it ([`Unsent`]). Keepalive alone
//!   let a non-reading peer pin `max_concurrent_streams_per_connection`
//!   answers for 80 s, and a window-0 peer that answers PINGs for ever.
//! - A call's request message arrives whole within `grpc.body_timeout` of
//!   its headers, or the call fails and what it sent is freed
//!   ([`TimedBody`]): keepalive alone let a stream that stopped mid-message
//!   hold its part (up to 4 MiB) until `max_connection_age`.
//! - At `grpc.max_connection_age` a connection is asked to go away (GOAWAY)
//!   and closed `grpc.max_connection_age_grace` later; at the drain it is
//!   asked to go away, and closed when its calls are answered or the drain
//!   deadline has passed.

use std::cell::Cell;
use std::net::SocketAddr;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::body::Incoming;
use hyper::rt::Timer;
use mcp_proto::v1::LogLevel;
use monoio::net::{TcpListener, TcpStream};
use tonic::codegen::Service;

use crate::config::GrpcSection;
use crate::edge::rt;
use crate::local::Latch;

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
    open: AtomicBool,
    /// The log level a session-less SetLoggingLevel set on this connection
    /// (0 = none): the default for its sessions and its Subscribe streams.
    level: AtomicI32,
}

/// A connection's identity and state, as a request extension.
#[derive(Clone, Debug)]
pub struct ConnInfo(Arc<ConnState>);

impl ConnInfo {
    fn new() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        Self(Arc::new(ConnState {
            id: NEXT.fetch_add(1, Ordering::Relaxed),
            open: AtomicBool::new(true),
            level: AtomicI32::new(0),
        }))
    }

    /// A connection for unit tests and for calls that arrive without one
    /// (never from the network: every accepted connection has its own).
    pub fn detached() -> Self {
        Self::new()
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

/// One of the edge's `grpc.max_connections`, held from the accept until
/// the connection (or its failed TLS handshake) is dropped.
pub(super) struct Slot(Arc<AtomicUsize>);

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

/// The unary answers of one connection that hyper has not yet handed to
/// HTTP/2 whole, counted by the watchdog epoch in which they became ready
/// (two epochs in turn; [`stalled_answers`]). hyper polls an answer's body
/// only once the stream has send capacity, and HTTP/2 gives a stream
/// capacity only within the peer's flow-control window: an answer still
/// counted a whole epoch later is one the peer lets none of out.
#[derive(Default)]
struct Unsent {
    epoch: AtomicUsize,
    count: [AtomicUsize; 2],
}

/// The path prefix of `McpService`'s methods (`/{package}.{service}/`).
const MCP_PATH: &str = "/turbomcp.mcp.v1.McpService/";

/// Whether [`Unsent`] counts the answers of `McpService`'s `method`: its
/// unary ones. A Subscribe stream's body stays open for its session's
/// life, and the health and reflection services are not the broker's calls.
fn is_unary(method: &str) -> bool {
    method != "Subscribe"
}

/// A unary answer's body, counted in [`Unsent`] until hyper has polled it
/// to its end (all of it with HTTP/2) or dropped it (stream reset,
/// connection gone). Atomics, not `Cell`s: tonic's body type is `Send`.
struct Tracked {
    inner: tonic::body::Body,
    unsent: Option<(Arc<Unsent>, usize)>,
}

impl Tracked {
    fn wrap(inner: tonic::body::Body, unsent: &Arc<Unsent>) -> tonic::body::Body {
        let slot = unsent.epoch.load(Ordering::Relaxed) & 1;
        unsent.count[slot].fetch_add(1, Ordering::Relaxed);
        tonic::body::Body::new(Self {
            inner,
            unsent: Some((unsent.clone(), slot)),
        })
    }

    fn taken(&mut self) {
        if let Some((unsent, slot)) = self.unsent.take() {
            unsent.count[slot].fetch_sub(1, Ordering::Relaxed);
        }
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.taken();
    }
}

impl hyper::body::Body for Tracked {
    type Data = bytes::Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<bytes::Bytes>, tonic::Status>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None | Some(Err(_)))) || self.inner.is_end_stream() {
            self.taken();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

/// Resolves once an answer of this connection has waited whole between
/// `timeout` and twice it: at each tick, the slot of the epoch before the
/// current one must be empty, and becomes the next epoch's.
async fn stalled_answers(unsent: &Unsent, timeout: Duration) {
    loop {
        monoio::time::sleep(timeout).await;
        let current = unsent.epoch.load(Ordering::Relaxed) & 1;
        if unsent.count[current ^ 1].load(Ordering::Relaxed) > 0 {
            return;
        }
        unsent.epoch.fetch_add(1, Ordering::Relaxed);
    }
}

/// Which service a request goes to.
enum Callee {
    Mcp(mcp_proto::v1::mcp_service_server::McpServiceServer<super::Edge>),
    Routes(tonic::service::Routes),
}

/// Calls `service` once it is ready (tonic's services always are; asking
/// keeps tower's contract).
async fn ready_call<S, B>(mut service: S, req: hyper::Request<B>) -> Result<S::Response, S::Error>
where
    S: Service<hyper::Request<B>>,
{
    std::future::poll_fn(|cx| service.poll_ready(cx)).await?;
    service.call(req).await
}

/// A call's request body that must end by a deadline (`grpc.body_timeout`):
/// every MCP and health RPC takes one request message, and a stream that sent part of
/// a 4 MiB one and then idled, answering PINGs, held what it had sent (and
/// tonic's buffer for the rest) until `max_connection_age`. Past the
/// deadline the body fails, which fails the call and frees both.
pub struct TimedBody {
    inner: Incoming,
    deadline: std::time::Instant,
    limit: Duration,
    /// Armed at the first wait for the peer.
    sleep: Option<Pin<Box<dyn hyper::rt::Sleep>>>,
    ended: bool,
}

impl TimedBody {
    /// `limit` `None`: no deadline (a bidirectional stream, whose client
    /// sends as long as the call lasts).
    fn new(inner: Incoming, limit: Option<Duration>) -> Self {
        Self {
            inner,
            deadline: crate::coarse::now() + limit.unwrap_or_default(),
            limit: limit.unwrap_or_default(),
            sleep: None,
            ended: limit.is_none(),
        }
    }
}

impl hyper::body::Body for TimedBody {
    type Data = bytes::Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<bytes::Bytes>, Self::Error>>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        if this.ended {
            return polled.map_err(Into::into);
        }
        match polled {
            Poll::Ready(r) => {
                if r.is_none() || this.inner.is_end_stream() {
                    this.ended = true;
                    this.sleep = None;
                }
                Poll::Ready(r.map(|f| f.map_err(Into::into)))
            }
            Poll::Pending => {
                let deadline = this.deadline;
                let sleep = this
                    .sleep
                    .get_or_insert_with(|| rt::ShardTimer.sleep_until(deadline));
                match sleep.as_mut().poll(cx) {
                    Poll::Ready(()) => {
                        this.ended = true;
                        // A Status in the error: tonic answers the call with
                        // it (INVALID_ARGUMENT, -32600, as HTTP's 408 has),
                        // not an UNKNOWN that says nothing.
                        let st = super::status::edge(
                            mcp_schema::ErrorCode::InvalidRequest,
                            format!(
                                "the request message did not arrive whole within grpc.body_timeout ({:?})",
                                this.limit
                            ),
                        );
                        Poll::Ready(Some(Err(Box::new(st))))
                    }
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

/// Marks the connection closed (for its sessions) however it ends.
struct Closed(ConnInfo);

impl Drop for Closed {
    fn drop(&mut self) {
        self.0.close();
    }
}

/// One shard's gRPC edge: its connections, served by hyper's HTTP/2 server
/// with the edge's tonic services.
pub struct ShardGrpc {
    index: usize,
    shared: Arc<crate::shared::Shared>,
    cfg: GrpcSection,
    edge: Arc<super::GrpcEdge>,
    routes: tonic::service::Routes,
    mcp: mcp_proto::v1::mcp_service_server::McpServiceServer<super::Edge>,
    tls: Option<Arc<crate::tls::ServerTls>>,
    draining: Rc<Latch>,
    drain_expired: Rc<Latch>,
    connections: Cell<usize>,
    /// Bounds the lines refused connections write: a client opening them
    /// in a loop wrote the log at line rate.
    refused_log: crate::shard::LogBudget,
    builder: hyper::server::conn::http2::Builder<rt::ShardExec>,
}

/// The largest header list (a call's metadata) a connection takes, as
/// advertised in SETTINGS_MAX_HEADER_LIST_SIZE; past it, HTTP 431.
const MAX_HEADER_LIST_BYTES: u32 = 16 << 10;

impl ShardGrpc {
    pub fn new(
        index: usize,
        shared: &Arc<crate::shared::Shared>,
        edge: Arc<super::GrpcEdge>,
        draining: Rc<Latch>,
        drain_expired: Rc<Latch>,
    ) -> Rc<Self> {
        let cfg = shared.config.grpc.clone();
        let mut builder = hyper::server::conn::http2::Builder::new(rt::ShardExec);
        builder
            .timer(rt::ShardTimer)
            .keep_alive_interval(cfg.keepalive_interval)
            .keep_alive_timeout(cfg.keepalive_timeout)
            .max_concurrent_streams(cfg.max_concurrent_streams_per_connection)
            // hyper's default, stated: proto/README.md documents it, and a
            // change in hyper must not move it silently.
            .max_header_list_size(MAX_HEADER_LIST_BYTES);
        Rc::new(Self {
            index,
            shared: shared.clone(),
            routes: edge.routes(),
            mcp: edge.mcp(),
            edge,
            tls: shared.tls.clone(),
            cfg,
            draining,
            drain_expired,
            connections: Cell::new(0),
            refused_log: Default::default(),
            builder,
        })
    }

    /// Connections open on this shard's edge (TLS handshakes included).
    pub fn connections(&self) -> usize {
        self.connections.get()
    }
}

/// Accepts connections until the drain begins.
pub async fn accept_loop(
    edge: Rc<ShardGrpc>,
    listener: TcpListener,
    rebinds: crate::shard::Rebinds,
) {
    let max = edge.cfg.max_connections;
    let stats = &edge.shared.stats[edge.index];
    let on_accept = |(stream, peer): (TcpStream, SocketAddr)| match Slot::take(&edge.edge.open, max)
    {
        Some(slot) => {
            let _ = stream.set_nodelay(true);
            monoio::spawn(connection(edge.clone(), stream, peer, slot));
        }
        None => {
            crate::shared::ShardStats::add(&stats.grpc_connections_refused, 1);
            if let Some(suppressed) = edge.refused_log.take(std::time::Instant::now()) {
                tracing::warn!(shard = edge.index, %peer, max, suppressed, "gRPC connection refused: grpc.max_connections reached");
            }
        }
    };
    let failed = (&stats.accept_errors, edge.index);
    crate::shard::accept_loop(listener, rebinds, &edge.draining, on_accept, failed, "grpc").await;
}

struct ConnGuard(Rc<ShardGrpc>);

impl Drop for ConnGuard {
    fn drop(&mut self) {
        self.0.connections.set(self.0.connections.get() - 1);
        crate::shared::ShardStats::sub(&self.0.shared.stats[self.0.index].grpc_connections_open, 1);
    }
}

/// One accepted connection, from its TLS handshake (with `[tls]`) to its
/// close.
async fn connection(edge: Rc<ShardGrpc>, stream: TcpStream, peer: SocketAddr, _slot: Slot) {
    edge.connections.set(edge.connections.get() + 1);
    crate::shared::ShardStats::add(&edge.shared.stats[edge.index].grpc_connections_open, 1);
    let _guard = ConnGuard(edge.clone());
    let Some(tls) = edge.tls.clone() else {
        let io = rt::uring_io(stream);
        let received = io.recv_count();
        return serve(&edge, io, received, peer).await;
    };
    let edge_tls = crate::tls::Edge::Grpc;
    if let Some((rd, wr)) = tls
        .accept_on_shard(edge_tls, stream, peer, &edge.draining)
        .await
    {
        let io = rt::tls_io(rd, wr);
        let received = io.recv_count();
        serve(&edge, io, received, peer).await;
    }
}

/// Resolves when `timeout` has passed and fewer than the preface's bytes
/// have come; never otherwise.
async fn no_preface(received: &Cell<u64>, timeout: std::time::Duration) {
    monoio::time::sleep(timeout).await;
    if received.get() >= PREFACE_LEN as u64 {
        std::future::pending::<()>().await;
    }
}

/// Serves HTTP/2 on one connection until it ends, its age or the drain
/// closes it. `received`: the bytes `io` has handed to HTTP/2 so far.
async fn serve<I>(edge: &Rc<ShardGrpc>, io: I, received: Rc<Cell<u64>>, peer: SocketAddr)
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + 'static,
{
    let info = ConnInfo::new();
    let _closed = Closed(info.clone());
    let routes = edge.routes.clone();
    let mcp = edge.mcp.clone();
    let tokio = edge.edge.tokio();
    let unsent = Arc::new(Unsent::default());
    let answers = unsent.clone();
    let body_timeout = edge.cfg.body_timeout;
    let service = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
        req.extensions_mut().insert(info.clone());
        // Reflection is the one bidirectional service: its client sends for
        // as long as the stream lasts, and tonic reads that stream from a
        // task on the edge's tokio runtime, off the shard, where the shard's
        // timer must not be touched (`ShardBound` panics there: the test
        // `reflections_stream_outlives_the_body_timeout` saw it). Every
        // other call sends one message, read on the shard.
        let limit = (!req.uri().path().starts_with("/grpc.reflection.")).then_some(body_timeout);
        let req = req.map(|b| TimedBody::new(b, limit));
        let method = req.uri().path().strip_prefix(MCP_PATH);
        let track = method.is_some_and(is_unary).then(|| answers.clone());
        // The MCP service's calls go to it straight: tonic's router (axum)
        // would match the path and allocate its parameters on every call,
        // to reach the same service. Health and reflection go through it.
        let callee = match method {
            Some(_) => Callee::Mcp(mcp.clone()),
            None => Callee::Routes(routes.clone()),
        };
        let call = async move {
            let answer = match callee {
                Callee::Mcp(s) => ready_call(s, req).await?,
                Callee::Routes(s) => ready_call(s, req).await?,
            };
            Ok(match track {
                Some(unsent) => answer.map(|body| Tracked::wrap(body, &unsent)),
                None => answer,
            })
        };
        super::guard::Guarded::new(call, tokio.clone())
    });
    let conn = edge.builder.serve_connection(io, service);
    let mut conn = std::pin::pin!(conn);
    /// Why a connection is closed or asked to go away.
    enum End {
        Done(Result<(), hyper::Error>),
        Silent,
        Stalled,
        Age,
        Drain,
    }
    let end = monoio::select! {
        r = conn.as_mut() => End::Done(r),
        _ = no_preface(&received, edge.cfg.handshake_timeout) => End::Silent,
        _ = stalled_answers(&unsent, edge.cfg.write_timeout) => End::Stalled,
        _ = monoio::time::sleep(edge.cfg.max_connection_age) => End::Age,
        _ = edge.draining.wait() => End::Drain,
    };
    let result = match end {
        End::Done(r) => r,
        End::Silent => {
            tracing::debug!(%peer, "gRPC connection closed: no HTTP/2 preface within grpc.handshake_timeout");
            return;
        }
        End::Stalled => {
            let write_timeout = edge.cfg.write_timeout;
            tracing::warn!(%peer, ?write_timeout, "gRPC connection closed: the peer's flow control let none of an answer out within grpc.write_timeout");
            let stats = &edge.shared.stats[edge.index];
            crate::shared::ShardStats::add(&stats.grpc_write_timeouts, 1);
            return;
        }
        // Nothing can be in flight on a connection that has not spoken
        // HTTP/2 yet, and hyper would wait for its handshake to go away.
        End::Drain if received.get() < PREFACE_LEN as u64 => return,
        End::Age => {
            conn.as_mut().graceful_shutdown();
            let grace = edge.cfg.max_connection_age_grace;
            monoio::select! {
                r = conn.as_mut() => r,
                _ = monoio::time::sleep(grace) => {
                    tracing::debug!(%peer, ?grace, "gRPC connection closed: calls still open past grpc.max_connection_age_grace");
                    return;
                }
                _ = edge.drain_expired.wait() => return,
            }
        }
        End::Drain => {
            // GOAWAY: the calls in flight are answered (the shards answer
            // them by the drain deadline), then the connection closes.
            conn.as_mut().graceful_shutdown();
            monoio::select! {
                r = conn.as_mut() => r,
                _ = async {
                    edge.drain_expired.wait().await;
                    monoio::time::sleep(super::SHUTDOWN_GRACE).await;
                } => {
                    tracing::debug!(%peer, "gRPC connection closed at the drain deadline");
                    return;
                }
            }
        }
    };
    if let Err(e) = result {
        tracing::debug!(%peer, error = %e, "gRPC connection ended with an error");
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
}
