//! The MCP Streamable HTTP edge (spec revisions 2024-11-05 to 2025-11-25
//! with sessions, and 2026-07-28 stateless: [`modern`]), served on the
//! shard threads.
//!
//! Every shard has its own `SO_REUSEPORT` listener on `[http] listen`; a
//! connection is served by hyper's HTTP/1.1 server on the shard that
//! accepted it (`crate::edge::rt`: hyper's I/O and timer on monoio), and each JSON-RPC
//! request becomes a Request frame ([`jsonrpc`]), verified like network
//! input and run through [`crate::dispatch::handle`] right there: no hop to
//! another runtime. Its response frames become one JSON answer, or an SSE
//! stream when there is more than the answer to send (progress, log
//! notifications, an elicitation round trip). docs/http.md has the rules.
//!
//! # Invariants
//! - Each JSON-RPC request gets exactly one final answer: its JSON body, the
//!   last event of its SSE stream, or its member of a batch's array.
//! - A request body is never read past `max_body_bytes` (413), nor waited
//!   for past `body_timeout` (408); a head past `max_header_bytes` or
//!   `max_headers` gets 431 and one slower than `header_timeout` is cut off
//!   (hyper).
//! - Sessions are unguessable, bounded and expire ([`session`]).
//! - On drain: no new connections; each connection finishes the request
//!   it is serving and closes; open SSE streams end.

pub mod jsonrpc;
pub mod modern;
pub mod request_state;
pub mod session;
pub mod sse;

use std::borrow::Cow;
use std::cell::{Cell, RefCell};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::{Bytes, BytesMut};
use futures_channel::mpsc;
use futures_core::Stream;
use http_body_util::BodyExt;
use hyper::body::{Frame, Incoming};
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::{Method as HttpMethod, Request, Response, StatusCode};
use mcp_schema::ErrorCode;
use mcp_schema::client::{RequestEncoder, RequestHeader};
use mcp_schema::uuid::IdGenerator;
use mcp_schema::verify::VerifiedRequest;
use monoio::net::{TcpListener, TcpStream};
use serde_json::value::RawValue;

use self::jsonrpc::{Body as RpcBody, FrameKind, Id, Message, Method, RpcError};
use self::request_state::Asked;
use self::session::{CallInFlight, Cancel, Session, StreamId};
use crate::auth::Principal;
use crate::config::HttpSection;
use crate::dispatch::{LiveOut, ShardCtx};
use crate::edge::rt;
use crate::local::Latch;
use crate::metrics;

/// The handshake-era protocol versions the edge speaks (with sessions),
/// oldest first; 2026-07-28 is [`modern`]'s.
pub const VERSIONS: [&str; 4] = ["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"];

/// Whether `m` runs in a router (and so may take long enough to cancel).
fn routed(m: Method) -> bool {
    matches!(
        m,
        Method::CallTool | Method::ReadResource | Method::GetPrompt | Method::Complete
    )
}

/// Whether a session of `version` gets SSE priming events (an id and empty
/// data first), which 2025-11-25 introduced; older clients may not expect
/// an event without a message.
fn primes_streams(version: &str) -> bool {
    version >= "2025-11-25"
}

/// The version the edge answers with when the client asks for one it does
/// not know.
pub const LATEST: &str = "2025-11-25";

/// Most elicitation round trips one tool call may make.
const MAX_ELICITATIONS: usize = 8;

/// The JSON-RPC code of a request the client cancelled
/// (`notifications/cancelled`): the code LSP uses; MCP says the server
/// should not answer, but an HTTP request must still end.
pub const REQUEST_CANCELLED: i32 = -32800;

/// The version negotiated for a client that asked for `asked`.
pub fn negotiate(asked: Option<&str>) -> &'static str {
    asked
        .and_then(|a| VERSIONS.iter().find(|v| **v == a))
        .copied()
        .unwrap_or(LATEST)
}

/// One shard's HTTP edge.
pub struct HttpEdge {
    ctx: Rc<ShardCtx>,
    cfg: HttpSection,
    draining: Rc<Latch>,
    /// The drain deadline passed: calls still running are answered with a
    /// shutting-down error, as on the other edges.
    drain_expired: Rc<Latch>,
    connections: Cell<usize>,
    /// Bounds the lines refused connections write: a client opening them
    /// in a loop wrote the log at line rate.
    refused_log: crate::shard::LogBudget,
    builder: hyper::server::conn::http1::Builder,
    enc: RefCell<RequestEncoder>,
    ids: RefCell<IdGenerator>,
}

impl HttpEdge {
    /// This shard's counters.
    fn stats(&self) -> &crate::shared::ShardStats {
        &self.ctx.shared.stats[self.ctx.index]
    }

    pub(crate) fn new(
        ctx: Rc<ShardCtx>,
        draining: Rc<Latch>,
        drain_expired: Rc<Latch>,
    ) -> Rc<Self> {
        let cfg = ctx.shared.config.http.clone();
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            .timer(rt::ShardTimer)
            .header_read_timeout(cfg.header_timeout)
            .max_buf_size(cfg.max_header_bytes.max(8192))
            .max_header_size(cfg.max_header_bytes)
            .keep_alive(true);
        // hyper parses at most 100 headers on the stack; another limit moves
        // them to the heap for every request, so set it only when asked.
        if cfg.max_headers != 100 {
            builder.max_headers(cfg.max_headers);
        }
        let seed = 0x4854_5450_0000_0000 ^ ctx.index as u64;
        Rc::new(Self {
            ctx,
            cfg,
            draining,
            drain_expired,
            connections: Cell::new(0),
            refused_log: Default::default(),
            builder,
            enc: RefCell::new(RequestEncoder::new()),
            ids: RefCell::new(IdGenerator::new(seed)),
        })
    }

    /// Open connections on this shard's edge.
    pub fn connections(&self) -> usize {
        self.connections.get()
    }

    fn sessions(&self) -> &session::Sessions {
        &self.ctx.shared.http_sessions
    }
}

/// Accepts connections until the drain begins.
pub async fn accept_loop(
    edge: Rc<HttpEdge>,
    listener: TcpListener,
    rebinds: crate::shard::Rebinds,
) {
    let max = edge.cfg.max_connections_per_shard;
    let stats = edge.stats();
    let on_accept = |(stream, peer): (monoio::net::TcpStream, std::net::SocketAddr)| {
        if edge.connections.get() >= max {
            crate::shared::ShardStats::add(&stats.http_connections_refused, 1);
            if let Some(suppressed) = edge.refused_log.take(std::time::Instant::now()) {
                tracing::warn!(shard = edge.ctx.index, %peer, max, suppressed, "HTTP connection refused: http.max_connections_per_shard reached");
            }
            return;
        }
        let _ = stream.set_nodelay(true);
        monoio::spawn(connection(edge.clone(), stream, peer));
    };
    let failed = (&stats.accept_errors, edge.ctx.index);
    crate::shard::accept_loop(listener, rebinds, &edge.draining, on_accept, failed, "http").await;
}

/// Ends every session this shard owns that has idled out, a few times per
/// timeout.
pub async fn expire_sessions(edge: Rc<HttpEdge>) {
    let every = (edge.cfg.session_idle_timeout / 4)
        .clamp(Duration::from_millis(10), Duration::from_secs(30));
    loop {
        monoio::select! {
            _ = monoio::time::sleep(every) => {}
            // Calls in flight finish during the drain; open GET streams end
            // by themselves (`keep_alive`); the sessions go with the process.
            _ = edge.draining.wait() => return,
        }
        let n = edge.sessions().sweep(edge.ctx.index);
        if n > 0 {
            tracing::debug!(
                shard = edge.ctx.index,
                ended = n,
                "idle HTTP sessions ended"
            );
        }
    }
}

struct ConnGuard(Rc<HttpEdge>);

impl Drop for ConnGuard {
    fn drop(&mut self) {
        self.0.connections.set(self.0.connections.get() - 1);
        crate::shared::ShardStats::sub(&self.0.stats().http_connections_open, 1);
    }
}

/// One accepted connection, from its TLS handshake (with `[tls]`) to its
/// close. It counts against `max_connections_per_shard` from the accept on.
async fn connection(edge: Rc<HttpEdge>, stream: TcpStream, peer: SocketAddr) {
    edge.connections.set(edge.connections.get() + 1);
    crate::shared::ShardStats::add(&edge.stats().http_connections_open, 1);
    let _guard = ConnGuard(edge.clone());
    let Some(tls) = edge.ctx.shared.tls.clone() else {
        let io = rt::uring_io(stream);
        let send_clock = io.send_clock();
        return serve_connection(&edge, io, send_clock, peer).await;
    };
    let edge_tls = crate::tls::Edge::Http;
    if let Some((rd, wr)) = tls
        .accept_on_shard(edge_tls, stream, peer, &edge.draining)
        .await
    {
        let io = rt::tls_io(rd, wr);
        let send_clock = io.send_clock();
        serve_connection(&edge, io, send_clock, peer).await;
    }
}

/// Serves HTTP/1.1 on one connection until it ends, the drain closes it,
/// or the peer stops reading.
async fn serve_connection<I>(
    edge: &Rc<HttpEdge>,
    io: I,
    send_clock: Rc<Cell<Option<Instant>>>,
    peer: SocketAddr,
) where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + 'static,
{
    let svc_edge = edge.clone();
    let service = hyper::service::service_fn(move |req| {
        let edge = svc_edge.clone();
        async move { Ok::<_, Infallible>(edge.serve(req).await) }
    });
    // Not pinned in place: an HTTP/2 client's connection is taken apart
    // for its io once hyper has refused it (below).
    let mut conn = edge.builder.serve_connection(io, service);
    let write_timeout = edge.cfg.write_timeout;
    let done = monoio::select! {
        r = &mut conn => Some(Some(r)),
        _ = edge.draining.wait() => Some(None),
        _ = stalled(&send_clock, write_timeout) => None,
    };
    let result = match done {
        Some(Some(r)) => r,
        Some(None) => {
            // Finish the request in progress (if any), then close.
            Pin::new(&mut conn).graceful_shutdown();
            monoio::select! {
                r = &mut conn => r,
                _ = stalled(&send_clock, write_timeout) => {
                    tracing::debug!(%peer, "HTTP connection closed at the drain: the peer reads nothing");
                    return;
                }
            }
        }
        None => {
            // Dropping the connection drops its answers and its SSE
            // streams; their events stay in the session's replay logs.
            tracing::warn!(%peer, ?write_timeout, "HTTP connection closed: the peer read nothing within http.write_timeout");
            let stats = edge.stats();
            crate::shared::ShardStats::add(&stats.http_write_timeouts, 1);
            return;
        }
    };
    if let Err(e) = result {
        tracing::debug!(%peer, error = %e, "HTTP connection ended with an error");
        if e.is_parse_version_h2() {
            let parts = conn.into_parts();
            refuse_http2(parts.io, parts.read_buf).await;
        }
    }
}

/// What this HTTP/1.1-only edge tells a client that opened with the
/// HTTP/2 connection preface (prior knowledge, h2c), where hyper only
/// closed, which clients report as a reset connection: the server's
/// preface (an empty SETTINGS frame, RFC 9113 §3.4), then, once the
/// client's first request (HEADERS) has come, RST_STREAM on it and GOAWAY
/// naming it as the last, with the reason. GOAWAY alone (last stream 0)
/// told the client its request was never processed, and gRPC clients held
/// such a call for a retry until its deadline. `seen`: what hyper had
/// read, the preface first.
async fn refuse_http2<I>(mut io: I, seen: Bytes)
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin,
{
    let _ = monoio::time::timeout(Duration::from_secs(1), async {
        // The server's preface first: a client may send its request only
        // after it (or never).
        if write_all(&mut io, &[0, 0, 0, 0x4, 0, 0, 0, 0, 0])
            .await
            .is_err()
        {
            return;
        }
        let mut read = seen.to_vec();
        let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 4096];
        let mut stream = first_http2_stream(&read);
        while stream.is_none() && read.len() < 64 << 10 {
            let waited =
                monoio::time::timeout(Duration::from_millis(200), read_some(&mut io, &mut buf))
                    .await;
            match waited {
                Ok(Some(bytes)) => read.extend_from_slice(&bytes),
                // The client closed, or went silent: refuse no stream.
                Ok(None) | Err(_) => break,
            }
            stream = first_http2_stream(&read);
        }
        let mut out = Vec::with_capacity(128);
        http2_refusal(&mut out, stream.unwrap_or(0));
        if write_all(&mut io, &out).await.is_err()
            || std::future::poll_fn(|cx| Pin::new(&mut io).poll_shutdown(cx))
                .await
                .is_err()
        {
            return;
        }
        // Read what the client sends until it closes: closing on unread
        // data would reset the connection and could destroy the refusal
        // before the client reads it.
        let mut more = 0;
        while more < 64 << 10 {
            match read_some(&mut io, &mut buf).await {
                Some(bytes) => more += bytes.len(),
                None => return,
            }
        }
    })
    .await;
}

/// For a stream, RST_STREAM on it; then GOAWAY (last stream `stream`,
/// the reason as its debug data), both PROTOCOL_ERROR: the request is one
/// this endpoint cannot take. Not HTTP_1_1_REQUIRED, which RFC 9113 makes
/// optional: grpcio (1.85) aborts the whole process when that code
/// reaches a live stream (reset, or covered by a GOAWAY).
fn http2_refusal(out: &mut Vec<u8>, stream: u32) {
    const REASON: &[u8] = b"this endpoint serves HTTP/1.1 only (MCP Streamable HTTP)";
    const PROTOCOL_ERROR: [u8; 4] = 0x1_u32.to_be_bytes();
    if stream != 0 {
        out.extend_from_slice(&[0, 0, 4, 0x3, 0]);
        out.extend_from_slice(&stream.to_be_bytes());
        out.extend_from_slice(&PROTOCOL_ERROR);
    }
    let len = (8 + REASON.len()) as u32;
    out.extend_from_slice(&len.to_be_bytes()[1..]);
    out.extend_from_slice(&[0x7, 0, 0, 0, 0, 0]);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(&PROTOCOL_ERROR);
    out.extend_from_slice(REASON);
}

/// The stream of the first HEADERS frame in `read` (the client's frames,
/// after its preface if hyper handed that back), once its head has come.
fn first_http2_stream(read: &[u8]) -> Option<u32> {
    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    let mut at = if read.starts_with(PREFACE) {
        PREFACE.len()
    } else {
        0
    };
    while let Some(head) = read.get(at..at + 9) {
        let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
        let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        if head[3] == 0x1 && stream != 0 {
            return Some(stream);
        }
        at += 9 + len;
    }
    None
}

async fn write_all<I: hyper::rt::Write + Unpin>(io: &mut I, bytes: &[u8]) -> std::io::Result<()> {
    let mut sent = 0;
    while sent < bytes.len() {
        match std::future::poll_fn(|cx| Pin::new(&mut *io).poll_write(cx, &bytes[sent..])).await? {
            0 => return Err(std::io::ErrorKind::WriteZero.into()),
            n => sent += n,
        }
    }
    std::future::poll_fn(|cx| Pin::new(&mut *io).poll_flush(cx)).await
}

/// What one read brings; `None` at the end or on an error.
async fn read_some<I: hyper::rt::Read + Unpin>(
    io: &mut I,
    buf: &mut [std::mem::MaybeUninit<u8>],
) -> Option<Vec<u8>> {
    let mut rb = hyper::rt::ReadBuf::uninit(buf);
    std::future::poll_fn(|cx| Pin::new(&mut *io).poll_read(cx, rb.unfilled()))
        .await
        .ok()?;
    let filled = rb.filled();
    (!filled.is_empty()).then(|| filled.to_vec())
}

/// Resolves once a send has been outstanding for `limit`: the peer takes
/// nothing (hyper has no write deadline of its own). Checked a few times
/// per limit, so a stalled peer is cut off at most a quarter late.
async fn stalled(send_started: &Cell<Option<Instant>>, limit: Duration) {
    let every = (limit / 4).clamp(Duration::from_millis(10), Duration::from_secs(5));
    loop {
        monoio::time::sleep(every).await;
        if send_started.get().is_some_and(|t| t.elapsed() >= limit) {
            return;
        }
    }
}

/// The kinds of SSE stream the edge serves, each counted in
/// `mcp_http_streams_open` while its response body lives (a stream that
/// outlived its client would show there, as a leaked connection shows in
/// `mcp_http_connections_open`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamKind {
    /// A 2025-era session's GET stream (standalone, or resumed with
    /// `Last-Event-ID`).
    SessionGet,
    /// A 2025-era POST answered on a stream (progress, logs, questions).
    SessionPost,
    /// A 2026-07-28 `subscriptions/listen` stream.
    Listen,
    /// A 2026-07-28 call's own stream (progress or logs asked for).
    Call,
}

impl StreamKind {
    pub const ALL: [StreamKind; 4] = [
        StreamKind::SessionGet,
        StreamKind::SessionPost,
        StreamKind::Listen,
        StreamKind::Call,
    ];

    /// The `kind` label.
    pub fn as_str(self) -> &'static str {
        match self {
            StreamKind::SessionGet => "session_get",
            StreamKind::SessionPost => "session_post",
            StreamKind::Listen => "listen",
            StreamKind::Call => "call",
        }
    }
}

/// One count in `mcp_http_streams_open` until the stream's body is dropped
/// (sent to its end, or its connection gone). Made and dropped on the
/// shard's thread, the gauge's only writer.
pub struct OpenStream {
    edge: Rc<HttpEdge>,
    kind: StreamKind,
}

impl OpenStream {
    fn count(edge: &Rc<HttpEdge>, kind: StreamKind) -> Self {
        crate::shared::ShardStats::add(&edge.stats().http_streams_open[kind as usize], 1);
        OpenStream {
            edge: edge.clone(),
            kind,
        }
    }
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        crate::shared::ShardStats::sub(&self.edge.stats().http_streams_open[self.kind as usize], 1);
    }
}

/// A response body: nothing, one buffer, or an SSE stream.
pub enum Body {
    Empty,
    Full(Option<Bytes>),
    Sse(sse::SseRx, OpenStream),
    /// A 2026-07-28 call's own stream: it has no resumption, so when the
    /// stream goes (its client closed it, or the connection) the call is
    /// abandoned, and the guard cancels it.
    Call(
        mpsc::UnboundedReceiver<Bytes>,
        modern::CancelOnClose,
        OpenStream,
    ),
}

impl hyper::body::Body for Body {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.get_mut() {
            Body::Empty => Poll::Ready(None),
            Body::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            Body::Sse(rx, _) => Pin::new(rx)
                .poll_next(cx)
                .map(|b| b.map(|b| Ok(Frame::data(b)))),
            Body::Call(rx, ..) => Pin::new(rx)
                .poll_next(cx)
                .map(|b| b.map(|b| Ok(Frame::data(b)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Body::Empty => true,
            Body::Full(b) => b.is_none(),
            Body::Sse(..) | Body::Call(..) => false,
        }
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        match self {
            Body::Empty => hyper::body::SizeHint::with_exact(0),
            Body::Full(Some(b)) => hyper::body::SizeHint::with_exact(b.len() as u64),
            Body::Full(None) => hyper::body::SizeHint::with_exact(0),
            Body::Sse(..) | Body::Call(..) => hyper::body::SizeHint::default(),
        }
    }
}

const JSON: HeaderValue = HeaderValue::from_static("application/json");
const SSE: HeaderValue = HeaderValue::from_static("text/event-stream");
const SESSION_HEADER: HeaderName = HeaderName::from_static("mcp-session-id");
/// nginx's switch for a proxied answer's buffering (both eras' streams).
const ACCEL_BUFFERING: HeaderName = HeaderName::from_static("x-accel-buffering");

fn json_response(status: StatusCode, body: Vec<u8>) -> Response<Body> {
    let mut r = Response::new(Body::Full(Some(Bytes::from(body))));
    *r.status_mut() = status;
    r.headers_mut().insert(header::CONTENT_TYPE, JSON);
    r
}

/// 400 with the JSON-RPC error of a body that did not parse (both eras).
pub(super) fn unparsable(e: &jsonrpc::RpcError<'_>) -> Response<Body> {
    let mut out = Vec::new();
    jsonrpc::write_error(
        &mut out,
        e.id.as_ref(),
        e.code,
        &e.message,
        e.data.as_deref(),
    );
    json_response(StatusCode::BAD_REQUEST, out)
}

/// An HTTP-level refusal: `status` with a JSON-RPC error body (id null),
/// as the SDKs send it, so a client shows the reason.
fn refuse(status: StatusCode, code: i32, message: &str) -> Response<Body> {
    refuse_request(status, None, code, message)
}

/// [`refuse`] for a request whose id is known: JSON-RPC 2.0 allows a
/// `null` id only when it could not be read.
fn refuse_request(
    status: StatusCode,
    id: Option<&Id<'_>>,
    code: i32,
    message: &str,
) -> Response<Body> {
    let mut out = Vec::with_capacity(96 + message.len());
    jsonrpc::write_error(&mut out, id, code, message, None);
    json_response(status, out)
}

fn empty(status: StatusCode) -> Response<Body> {
    let mut r = Response::new(Body::Empty);
    *r.status_mut() = status;
    r
}

fn sse_response(rx: sse::SseRx, open: OpenStream, session: Option<&str>) -> Response<Body> {
    let mut r = Response::new(Body::Sse(rx, open));
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, SSE);
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    // nginx buffers a proxied answer by default, which held a stream's
    // events (a GET stream's, all of them) until it ended.
    h.insert(ACCEL_BUFFERING, HeaderValue::from_static("no"));
    if let Some(s) = session.and_then(|s| HeaderValue::from_str(s).ok()) {
        h.insert(SESSION_HEADER, s);
    }
    r
}

/// A `tools/list` answer without the tools `shown` refuses: with `[auth]`
/// a caller sees only the tools its scopes let it call. (A page may then
/// hold fewer tools than others; its cursor still leads on.)
fn hide_tools(r: Response<Body>, shown: impl Fn(&str) -> bool) -> Response<Body> {
    let (parts, body) = r.into_parts();
    let Body::Full(Some(bytes)) = body else {
        return Response::from_parts(parts, body);
    };
    let Ok(mut v) = serde_json::from_slice::<serde_json::Value>(&bytes) else {
        return Response::from_parts(parts, Body::Full(Some(bytes)));
    };
    // One answer, or a batch's answers (only listings have `result.tools`).
    let answers = match &mut v {
        serde_json::Value::Array(a) => a.iter_mut().collect(),
        one => vec![one],
    };
    for a in answers {
        if let Some(tools) = a
            .pointer_mut("/result/tools")
            .and_then(serde_json::Value::as_array_mut)
        {
            tools.retain(|t| t.get("name").and_then(|n| n.as_str()).is_some_and(&shown));
        }
    }
    let body = serde_json::to_vec(&v).map_or(bytes, Bytes::from);
    Response::from_parts(parts, Body::Full(Some(body)))
}

/// 401 (no valid token) or 403 (too few scopes) with the RFC 6750 /
/// RFC 9728 challenge; the body is a JSON-RPC error without an id (the
/// request was not read).
fn auth_refusal(
    auth: &crate::auth::Auth,
    f: crate::auth::Failure,
    needed: &[String],
) -> Response<Body> {
    let status = if f == crate::auth::Failure::InsufficientScope {
        StatusCode::FORBIDDEN
    } else {
        StatusCode::UNAUTHORIZED
    };
    let mut r = refuse(status, ErrorCode::Unauthorized.code(), &f.describe(needed));
    if let Ok(v) = HeaderValue::from_str(&auth.challenge(f, needed)) {
        r.headers_mut().insert(header::WWW_AUTHENTICATE, v);
    }
    r
}

/// One count in `mcp_in_flight_requests` until dropped: a client that goes
/// away drops the future holding it mid-call, and the gauge must come down
/// with it (it leaked one a dropped connection).
struct InFlight<'a>(&'a crate::shared::ShardStats);

impl<'a> InFlight<'a> {
    fn count(stats: &'a crate::shared::ShardStats) -> Self {
        crate::shared::ShardStats::add(&stats.in_flight, 1);
        InFlight(stats)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        crate::shared::ShardStats::sub(&self.0.in_flight, 1);
    }
}

/// The most of a refused request's body the edge reads and drops to keep
/// its connection (see [`HttpEdge::refuse_unread`]): a client sending more
/// than this after a refusal is cut off instead.
const DISCARD_LIMIT: u64 = 64 << 20;

/// What makes an HTTP/1.1 request's `Host` unacceptable, if anything:
/// RFC 9112 §3.2 requires exactly one, and a valid one (empty when the
/// target has no authority), and a server MUST answer 400 otherwise.
/// HTTP/1.0 needs none.
fn host_problem(req: &Request<Incoming>) -> Option<&'static str> {
    if req.version() != hyper::Version::HTTP_11 {
        return None;
    }
    let mut hosts = req.headers().get_all(header::HOST).iter();
    match (hosts.next(), hosts.next()) {
        (None, _) => Some("no Host header (HTTP/1.1 requires one)"),
        (Some(_), Some(_)) => Some("more than one Host header"),
        (Some(v), None) => {
            let v = v.as_bytes();
            let valid = v.is_empty()
                || (!v.contains(&b'@') && hyper::http::uri::Authority::try_from(v).is_ok());
            (!valid).then_some("the Host header is no host[:port]")
        }
    }
}

/// `Content-Length` as a number (hyper has refused a malformed one).
fn content_length(h: &HeaderMap) -> Option<u64> {
    header_str(h, header::CONTENT_LENGTH).and_then(|v| v.parse::<u64>().ok())
}

/// A header's value as text. Pass a `HeaderName` where the name is fixed:
/// a `&str` name is parsed again on every lookup.
fn header_str(h: &HeaderMap, name: impl header::AsHeaderName) -> Option<&str> {
    h.get(name).and_then(|v| v.to_str().ok())
}

/// Whether `Accept` admits `mime` (`type/subtype`, `type/*` or `*/*`).
fn accepts(h: &HeaderMap, mime: &str) -> bool {
    let [ok] = accepted(h, [mime]);
    ok
}

/// Which of `mimes` `Accept` admits, as [`accepts`], in one pass over its
/// media ranges (a POST needs two answers from the same header).
fn accepted<const N: usize>(h: &HeaderMap, mimes: [&str; N]) -> [bool; N] {
    // RFC 9110 §12.5.1: each type takes the weight of the most specific
    // range that matches it (exact, then `type/*`, then `*/*`), and a
    // weight of 0 means "not acceptable" (`text/event-stream;q=0`).
    let mut best = [(0u8, true); N];
    let ranges = h
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','));
    for r in ranges {
        let (range, params) = r.split_once(';').unwrap_or((r, ""));
        let range = range.trim();
        let any_subtype = range.strip_suffix("/*");
        for (b, mime) in best.iter_mut().zip(mimes) {
            let ty = mime.split_once('/').map_or(mime, |(ty, _)| ty);
            let specific = if range.eq_ignore_ascii_case(mime) {
                3
            } else if any_subtype.is_some_and(|t| t.eq_ignore_ascii_case(ty)) {
                2
            } else if range == "*/*" {
                1
            } else {
                0
            };
            if specific > b.0 {
                *b = (specific, !zero_weight(params));
            }
        }
    }
    best.map(|(specific, wanted)| specific > 0 && wanted)
}

/// Whether media-range parameters carry `q=0` (`0`, `0.0`, `0.000`).
fn zero_weight(params: &str) -> bool {
    params.split(';').any(|p| {
        p.trim().split_once('=').is_some_and(|(k, v)| {
            k.trim().eq_ignore_ascii_case("q") && v.trim().parse::<f32>().is_ok_and(|q| q == 0.0)
        })
    })
}

fn is_json_content(h: &HeaderMap) -> bool {
    header_str(h, header::CONTENT_TYPE).is_some_and(|v| {
        v.split(';')
            .next()
            .is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json"))
    })
}

/// Origins that are always accepted: the loopback host names (the broker's
/// default address is loopback; DNS rebinding reaches it under another
/// name, which is what the check refuses).
fn is_loopback_origin(origin: &str) -> bool {
    // An origin is exactly `scheme://host[:port]`: anything else (userinfo
    // as in `http://localhost:80@evil.example`, a path) is no loopback one.
    let Some(rest) = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"))
    else {
        return false;
    };
    let port_ok = |tail: &str| {
        tail.is_empty()
            || tail.strip_prefix(':').is_some_and(|p| {
                !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) && p.parse::<u16>().is_ok()
            })
    };
    if let Some(v6) = rest.strip_prefix('[') {
        return v6
            .split_once(']')
            .is_some_and(|(h, tail)| h == "::1" && port_ok(tail));
    }
    let (host, tail) = rest.split_at(rest.find(':').unwrap_or(rest.len()));
    (host.eq_ignore_ascii_case("localhost") || host == "127.0.0.1") && port_ok(tail)
}

/// Why a request body could not be read.
enum BodyError {
    TooLarge,
    Broken(hyper::Error),
}

/// Reads a body of at most `max` bytes, refusing it as soon as it passes.
/// A body of one data frame (a POST that arrived with its head, the common
/// case) is hyper's own view of its read buffer, kept without a copy; only
/// a body in several frames is gathered.
async fn read_body(body: &mut Incoming, max: usize) -> Result<Bytes, BodyError> {
    let mut first: Option<Bytes> = None;
    let mut gathered: Option<BytesMut> = None;
    let mut len = 0usize;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(BodyError::Broken)?;
        if let Ok(data) = frame.into_data() {
            len += data.len();
            if len > max {
                return Err(BodyError::TooLarge);
            }
            match (&first, &mut gathered) {
                (None, _) => first = Some(data),
                (Some(_), Some(buf)) => buf.extend_from_slice(&data),
                (Some(f), None) => {
                    let mut buf = BytesMut::with_capacity(len);
                    buf.extend_from_slice(f);
                    buf.extend_from_slice(&data);
                    gathered = Some(buf);
                }
            }
        }
    }
    Ok(match (gathered, first) {
        (Some(buf), _) => buf.freeze(),
        (None, Some(f)) => f,
        (None, None) => Bytes::new(),
    })
}

/// What [`HttpEdge::call`] produced for one request.
struct Called {
    /// Only [`HttpEdge::run`] makes a `Called`: these are the frames that
    /// dispatch (or `run` itself) wrote with a shard's `ResponseEncoder`,
    /// never changed after, which is what [`Called::answer`] relies on.
    frames: Vec<u8>,
    arrived: Instant,
    /// The request's record, written when its last handle goes (`None`:
    /// the frame was no request, an empty name the JSON allowed).
    record: Option<Record>,
}

/// One request's record in the request metrics (`metrics::record`),
/// written when its last handle goes: by then the answer the client got is
/// known. The edge answers some requests otherwise than the frames their
/// run wrote (an `initialize` whose session cannot be made, a call the
/// client cancelled, a question the client cannot take), and a session-era
/// call that asks the client runs its tool once a round: the rounds share
/// the first round's record, so that the request counts once, with the
/// answer that ended it.
#[derive(Clone)]
struct Record(Rc<Recorded>);

struct Recorded {
    ctx: Rc<ShardCtx>,
    req: VerifiedRequest,
    /// Its router and tool, read as it started.
    who: metrics::record::Attribution,
    arrived: Instant,
    started: Instant,
    outcome: Cell<metrics::Outcome>,
}

impl Record {
    /// The client was answered with the error `code`, whatever the run's
    /// frames said. The 2026-07-28 transport refusals are the client's
    /// request (`invalid_request`), not an error of the broker's.
    fn answered(&self, code: i32) {
        let outcome = match code {
            modern::HEADER_MISMATCH | modern::MISSING_CAPABILITY | modern::UNSUPPORTED_VERSION => {
                metrics::Outcome::InvalidRequest
            }
            code => metrics::Outcome::from_code(code),
        };
        self.0.outcome.set(outcome);
    }
}

impl Drop for Recorded {
    fn drop(&mut self) {
        // Nothing queues it: the wait is zero (`queued` = `started`).
        let (edge, started) = (metrics::Edge::Http, self.started);
        let outcome = self.outcome.get();
        metrics::record::request_as(
            &self.ctx,
            edge,
            &self.req,
            self.who,
            self.arrived,
            started,
            started,
            outcome,
        );
    }
}

impl Called {
    /// The client was answered with the error `code` ([`Record::answered`]).
    fn answered(&self, code: i32) {
        if let Some(r) = &self.record {
            r.answered(code);
        }
    }

    /// The call's last frame, which ends it (its answer), and that frame
    /// read without the verifier: the edge's own answer, built by the
    /// encoder (`verify::built_response`; debug builds still verify it).
    /// The verifier was ≈ 3% of the edge's CPU per request.
    fn answer(&self) -> Option<(&[u8], mcp_schema::fb::protocol::Response<'_>)> {
        let last = frames(&self.frames).last()?;
        // SAFETY: one whole frame of `frames`, split at its size prefix, as
        // a shard's ResponseEncoder wrote it (see the field).
        Some((last, unsafe { mcp_schema::verify::built_response(last) }))
    }
}

/// The size-prefixed frames in `buf`, in order.
fn frames(buf: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut at = 0;
    std::iter::from_fn(move || {
        let len = buf.get(at..at + 4)?;
        let n = u32::from_le_bytes([len[0], len[1], len[2], len[3]]) as usize;
        let f = buf.get(at..at + 4 + n)?;
        at += 4 + n;
        Some(f)
    })
}

/// Response headers a browser page may read (CORS): the session id it
/// must send back, the challenge that says where to get a token, when to
/// retry a 503 or 429, and what a 405 allows.
const CORS_EXPOSED: &str = "Mcp-Session-Id, WWW-Authenticate, Retry-After, Allow";

/// The request headers every preflight allows: all that MCP's clients send
/// in either era. A browser keeps one preflight answer per origin and URL
/// (Chromium), so an answer listing only what that request asked made a
/// page that alternates (a session's POST, its resuming GET, a 2026-07-28
/// call) preflight nearly every request.
const CORS_ALLOWED_HEADERS: &str = "Accept, Authorization, Content-Type, Last-Event-ID, \
     Mcp-Method, Mcp-Name, Mcp-Protocol-Version, Mcp-Session-Id";

/// The answer to a CORS preflight from an accepted origin: the methods the
/// endpoint serves and the request headers a page may send: MCP's own
/// ([`CORS_ALLOWED_HEADERS`]) and whatever else the page asked to send
/// (2026-07-28's `Mcp-Param-*`, whose names only the tool's schema knows,
/// or a proxy's). The real request is judged as any other.
fn preflight(h: &HeaderMap) -> Response<Body> {
    let mut r = empty(StatusCode::NO_CONTENT);
    let out = r.headers_mut();
    out.insert(
        header::ACCESS_CONTROL_ALLOW_METHODS,
        HeaderValue::from_static("GET, POST, DELETE"),
    );
    // What was asked, as header names only (RFC 9110 tokens), at most
    // 64 of them: the answer is no echo of whatever the request held.
    let asked: Vec<&str> = h
        .get(header::ACCESS_CONTROL_REQUEST_HEADERS)
        .and_then(|asked| asked.to_str().ok())
        .into_iter()
        .flat_map(|asked| asked.split(','))
        .map(str::trim)
        .filter(|name| HeaderName::from_bytes(name.as_bytes()).is_ok())
        .take(64)
        .collect();
    let allowed = if asked.is_empty() {
        HeaderValue::from_static(CORS_ALLOWED_HEADERS)
    } else {
        HeaderValue::from_str(&format!("{CORS_ALLOWED_HEADERS}, {}", asked.join(", ")))
            .unwrap_or(HeaderValue::from_static(CORS_ALLOWED_HEADERS))
    };
    out.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, allowed);
    // Ten minutes: a browser asks again after a reload has had time to
    // change `allowed_origins` (the request itself is checked anyway).
    out.insert(
        header::ACCESS_CONTROL_MAX_AGE,
        HeaderValue::from_static("600"),
    );
    out.append(
        header::VARY,
        HeaderValue::from_static("Access-Control-Request-Headers"),
    );
    r
}

impl HttpEdge {
    /// Whether one `Origin` value may reach the edge: a loopback origin or
    /// one of `http.allowed_origins`.
    fn origin_allowed(&self, origin: &HeaderValue) -> bool {
        origin
            .to_str()
            .is_ok_and(|o| is_loopback_origin(o) || self.cfg.allowed_origins.iter().any(|a| a == o))
    }

    /// The origin a browser page may read the answer from (CORS): the
    /// request's one `Origin`, when it is accepted. None without one, with
    /// several, or with a refused one, whose request gets 403 anyway.
    fn cors_origin(&self, h: &HeaderMap) -> Option<HeaderValue> {
        let mut all = h.get_all(header::ORIGIN).iter();
        let origin = all.next()?;
        (all.next().is_none() && self.origin_allowed(origin)).then(|| origin.clone())
    }

    /// One HTTP request's response, counted by status
    /// (`mcp_http_responses_total`).
    async fn serve(self: Rc<Self>, req: Request<Incoming>) -> Response<Body> {
        let stats = self.stats();
        let cors = self.cors_origin(req.headers());
        let mut r = match &cors {
            Some(_)
                if *req.method() == HttpMethod::OPTIONS
                    && req
                        .headers()
                        .contains_key(header::ACCESS_CONTROL_REQUEST_METHOD)
                    && matches!(
                        req.uri().path(),
                        "/mcp"
                            | "/.well-known/oauth-protected-resource"
                            | "/.well-known/oauth-protected-resource/mcp"
                    ) =>
            {
                preflight(req.headers())
            }
            _ => self.clone().respond(req).await,
        };
        let h = r.headers_mut();
        if let Some(origin) = cors {
            h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
            h.insert(
                header::ACCESS_CONTROL_EXPOSE_HEADERS,
                HeaderValue::from_static(CORS_EXPOSED),
            );
        }
        // On every answer, not only a page's: a shared cache that kept one
        // made without `Origin` (no CORS headers) would serve it to a page,
        // which could not read it (Fetch, "CORS protocol and HTTP caches").
        h.append(header::VARY, HeaderValue::from_static("Origin"));
        let slot = metrics::http_status_slot(r.status().as_u16());
        crate::shared::ShardStats::add(&stats.http_responses[slot], 1);
        r
    }

    async fn respond(self: Rc<Self>, req: Request<Incoming>) -> Response<Body> {
        if let Some(problem) = host_problem(&req) {
            return refuse(
                StatusCode::BAD_REQUEST,
                ErrorCode::InvalidRequest.code(),
                &format!("bad request: {problem}"),
            );
        }
        if let Some(auth) = &self.ctx.shared.auth
            && matches!(
                req.uri().path(),
                "/.well-known/oauth-protected-resource"
                    | "/.well-known/oauth-protected-resource/mcp"
            )
        {
            // RFC 9728 metadata: public, so that a client can learn where
            // to get a token.
            if *req.method() != HttpMethod::GET {
                let mut r = refuse(
                    StatusCode::METHOD_NOT_ALLOWED,
                    ErrorCode::InvalidRequest.code(),
                    "method not allowed: the metadata is read with GET",
                );
                r.headers_mut()
                    .insert(header::ALLOW, HeaderValue::from_static("GET"));
                return r;
            }
            let routing = self.ctx.shared.routing.load();
            return json_response(
                StatusCode::OK,
                auth.metadata_with(&routing.routers).into_bytes(),
            );
        }
        if req.uri().path() != "/mcp" {
            return refuse(
                StatusCode::NOT_FOUND,
                ErrorCode::InvalidRequest.code(),
                "not found: the MCP endpoint is /mcp",
            );
        }
        // Every Origin value is judged: a request carries one, and with two
        // a loopback one first would vouch for any other behind it.
        let mut origins = req.headers().get_all(header::ORIGIN).iter().peekable();
        if origins.peek().is_some() {
            let ok = origins.all(|origin| self.origin_allowed(origin));
            if !ok {
                return refuse(
                    StatusCode::FORBIDDEN,
                    ErrorCode::InvalidRequest.code(),
                    "forbidden: this Origin is not allowed (http.allowed_origins)",
                );
            }
        }
        // The era, from the version header alone: a modern (2026-07-28, or
        // unknown) version is served statelessly below; none or a
        // handshake-era one keeps the session rules.
        let modern = modern::is_modern(req.headers());
        // The session era reads the first of each; a proxy routing on the
        // session (deploy/haproxy.cfg) reads the last, and sent a request
        // to a broker whose session it was not. The modern era refuses
        // repeated headers itself (-32020).
        if !modern {
            for name in [SESSION_HEADER, modern::VERSION] {
                let mut values = req.headers().get_all(&name).iter();
                if let Some(first) = values.next()
                    && values.any(|v| v != first)
                {
                    return refuse(
                        StatusCode::BAD_REQUEST,
                        ErrorCode::InvalidRequest.code(),
                        &format!("bad request: {name} is repeated with different values"),
                    );
                }
            }
        }
        if self.ctx.shared.is_draining() {
            let mut r = refuse(
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorCode::ShuttingDown.code(),
                "the broker is shutting down",
            );
            r.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
            return r;
        }
        // `[auth]`: every request to /mcp carries a valid bearer token.
        let who = match &self.ctx.shared.auth {
            None => None,
            Some(auth) => match auth.authenticate_all(
                req.headers()
                    .get_all(header::AUTHORIZATION)
                    .iter()
                    .map(|v| v.as_bytes()),
            ) {
                Ok(p) => Some(p),
                Err(f) => return auth_refusal(auth, f, auth.base_scopes()),
            },
        };
        let who = who.as_deref();
        if modern {
            return match *req.method() {
                HttpMethod::POST => self.post_modern(req, who).await,
                // A version this edge does not serve: 400 whatever the
                // method, as both revisions require. Else no sessions, no
                // GET stream (`subscriptions/listen` replaces it), nothing
                // to DELETE.
                _ => {
                    if let Some(r) = modern::unserved_version_header(req.headers()) {
                        return modern::refusal_response(None, r);
                    }
                    let mut r = refuse(
                        StatusCode::METHOD_NOT_ALLOWED,
                        ErrorCode::InvalidRequest.code(),
                        "method not allowed: protocol 2026-07-28 is served by POST only (no sessions)",
                    );
                    r.headers_mut()
                        .insert(header::ALLOW, HeaderValue::from_static("POST"));
                    r
                }
            };
        }
        const ALLOWED: HeaderValue = HeaderValue::from_static("GET, POST, DELETE, OPTIONS");
        match *req.method() {
            HttpMethod::POST => self.post(req, who).await,
            HttpMethod::GET => self.get(req, who),
            HttpMethod::DELETE => self.delete(req, who),
            // RFC 9110 §9.3.7: what the endpoint takes (a CORS preflight
            // from an accepted origin was answered before this).
            HttpMethod::OPTIONS => {
                let mut r = empty(StatusCode::NO_CONTENT);
                r.headers_mut().insert(header::ALLOW, ALLOWED);
                r
            }
            _ => {
                let mut r = refuse(
                    StatusCode::METHOD_NOT_ALLOWED,
                    ErrorCode::InvalidRequest.code(),
                    "method not allowed: /mcp takes POST, GET, DELETE and OPTIONS",
                );
                r.headers_mut().insert(header::ALLOW, ALLOWED);
                r
            }
        }
    }

    /// The session a request names: with `[auth]`, only to the subject
    /// whose token created it (anyone else is told it is unknown, as if it
    /// did not exist).
    fn session_of(
        &self,
        id: Option<&str>,
        who: Option<&Principal>,
    ) -> Result<Arc<Session>, NoSession> {
        let id = id.ok_or(NoSession::Missing)?;
        let s = self.sessions().get(id).ok_or(NoSession::Unknown)?;
        if let Some(p) = who
            && s.subject.get() != Some(&p.subject)
        {
            return Err(NoSession::Unknown);
        }
        Ok(s)
    }

    /// With `[auth]`: the refusal of a `tools/call` whose tool needs scopes
    /// `who` lacks (`[[auth.rules]]`).
    fn tool_refusal(
        &self,
        who: Option<&Principal>,
        method: &str,
        params: Option<&RawValue>,
    ) -> Option<Response<Body>> {
        let (auth, who) = (self.ctx.shared.auth.as_ref()?, who?);
        if method != "tools/call" || !auth.has_tool_rules() {
            return None;
        }
        #[derive(serde::Deserialize)]
        struct Named<'a> {
            #[serde(borrow)]
            name: Cow<'a, str>,
        }
        let named: Named<'_> = serde_json::from_str(params?.get()).ok()?;
        let missing = auth.check_tool(who, &named.name).err()?;
        Some(auth_refusal(
            auth,
            crate::auth::Failure::InsufficientScope,
            &missing,
        ))
    }

    /// A POST's head checks (406, 415, 413) and its body, read within the
    /// limits; the refusal to send otherwise. Both eras start here.
    async fn read_post(
        &self,
        req: Request<Incoming>,
    ) -> Result<(HeaderMap, Bytes), Response<Body>> {
        let h = req.headers();
        let max = self.cfg.max_body_bytes;
        let too_large = || {
            refuse(
                StatusCode::PAYLOAD_TOO_LARGE,
                ErrorCode::InvalidRequest.code(),
                &format!("payload too large: the body limit is {max} bytes (http.max_body_bytes)"),
            )
        };
        let [json, sse] = accepted(h, ["application/json", "text/event-stream"]);
        // A 2026-07-28 `subscriptions/listen` is always answered on a
        // stream, so a client that accepts only that is served: ax sent
        // `Accept: text/event-stream` alone there, and retried its 406
        // every second, silently, without end. (Its headers must still
        // match its body, checked later.)
        let listen_only = sse
            && h.get(modern::METHOD_HEADER)
                .is_some_and(|m| m.as_bytes() == b"subscriptions/listen")
            && modern::is_modern(h);
        let early = if !(json && sse || listen_only) {
            Some(refuse(
                StatusCode::NOT_ACCEPTABLE,
                ErrorCode::InvalidRequest.code(),
                "not acceptable: the client must accept both application/json and text/event-stream",
            ))
        } else if !is_json_content(h) {
            Some(refuse(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                ErrorCode::InvalidRequest.code(),
                "unsupported media type: the body must be application/json",
            ))
        } else if let Some(coding) = h
            .get_all(header::CONTENT_ENCODING)
            .iter()
            .flat_map(|v| v.to_str().unwrap_or("?").split(','))
            .map(str::trim)
            .find(|c| !c.eq_ignore_ascii_case("identity"))
        {
            // RFC 9110 §15.5.16: 415, naming the codings taken.
            let mut r = refuse(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                ErrorCode::InvalidRequest.code(),
                &format!(
                    "unsupported media type: Content-Encoding {coding} is not taken; send the body uncompressed"
                ),
            );
            r.headers_mut().insert(
                header::ACCEPT_ENCODING,
                HeaderValue::from_static("identity"),
            );
            Some(r)
        } else if content_length(h).is_some_and(|n| n > max as u64) {
            Some(too_large())
        } else {
            None
        };
        if let Some(r) = early {
            return Err(self.refuse_unread(req, r).await);
        }
        let (parts, mut body) = req.into_parts();
        // A body that is already here is read without arming the timer (a
        // clock read, and a timer-wheel entry made and removed, on every
        // request); one still on its way is read within `body_timeout`.
        let read = {
            let mut read = std::pin::pin!(read_body(&mut body, max));
            let first = std::future::poll_fn(|cx| Poll::Ready(read.as_mut().poll(cx))).await;
            match first {
                Poll::Ready(r) => Ok(r),
                Poll::Pending => monoio::time::timeout(self.cfg.body_timeout, read).await,
            }
        };
        let body = match read {
            Ok(Ok(b)) => b,
            Ok(Err(BodyError::TooLarge)) => {
                let announced = content_length(&parts.headers);
                return Err(self.drop_rest(&mut body, announced, too_large()).await);
            }
            Ok(Err(BodyError::Broken(e))) => {
                return Err(refuse(
                    StatusCode::BAD_REQUEST,
                    ErrorCode::InvalidRequest.code(),
                    &format!("bad request: the body could not be read: {e}"),
                ));
            }
            Err(_) => {
                let mut r = refuse(
                    StatusCode::REQUEST_TIMEOUT,
                    ErrorCode::InvalidRequest.code(),
                    "request timeout: the body did not arrive within http.body_timeout",
                );
                r.headers_mut()
                    .insert(header::CONNECTION, HeaderValue::from_static("close"));
                return Err(r);
            }
        };
        Ok((parts.headers, body))
    }

    /// A refusal sent before the request's body was read. hyper closes a
    /// connection whose request body is left unread, and a close with
    /// data still arriving makes the kernel send a reset, which can
    /// destroy the answer before the client reads it: pooled clients then
    /// failed their next request, and proxies answered 502 instead. So the
    /// body is read and dropped first, within bounds, and the connection
    /// stays usable. A client waiting for `100 Continue` is sent none, and
    /// so no body; the answer then says `Connection: close`.
    async fn refuse_unread(&self, req: Request<Incoming>, mut r: Response<Body>) -> Response<Body> {
        let expects = req
            .headers()
            .get(header::EXPECT)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
        let announced = content_length(req.headers());
        let mut body = req.into_body();
        if expects && !hyper::body::Body::is_end_stream(&body) {
            r.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
            return r;
        }
        self.drop_rest(&mut body, announced, r).await
    }

    /// Reads and drops the rest of a refused request's body, at most
    /// [`DISCARD_LIMIT`] bytes within `http.body_timeout`, so that `r`
    /// arrives and the connection can go on; past either bound, `r` says
    /// `Connection: close` and hyper closes after it.
    async fn drop_rest(
        &self,
        body: &mut Incoming,
        announced: Option<u64>,
        mut r: Response<Body>,
    ) -> Response<Body> {
        let drained = announced.is_none_or(|n| n <= DISCARD_LIMIT)
            && monoio::time::timeout(self.cfg.body_timeout, async {
                let mut seen = 0u64;
                while let Some(frame) = body.frame().await {
                    let Ok(frame) = frame else { return false };
                    if let Some(data) = frame.data_ref() {
                        seen += data.len() as u64;
                        if seen > DISCARD_LIMIT {
                            return false;
                        }
                    }
                }
                true
            })
            .await
            .unwrap_or(false);
        if !drained {
            r.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        r
    }

    async fn post(
        self: Rc<Self>,
        req: Request<Incoming>,
        who: Option<&Principal>,
    ) -> Response<Body> {
        let arrived = Instant::now();
        let (headers, body) = match self.read_post(req).await {
            Ok(r) => r,
            Err(refusal) => return refusal,
        };
        let session_header = header_str(&headers, SESSION_HEADER).map(str::to_owned);
        let parsed = match jsonrpc::parse(&body) {
            Ok(p) => p,
            Err(e) => return unparsable(&e),
        };
        // Tools whose rules need scopes the token lacks: refused before
        // anything runs.
        match &parsed {
            RpcBody::One(Message::Request { method, params, .. }) => {
                if let Some(r) = self.tool_refusal(who, method, *params) {
                    return r;
                }
            }
            RpcBody::Batch(items) => {
                for item in items {
                    if let Ok(Message::Request { method, params, .. }) = item
                        && let Some(r) = self.tool_refusal(who, method, *params)
                    {
                        return r;
                    }
                }
            }
            _ => {}
        }
        // Requests that need no session first.
        if let RpcBody::One(Message::Request { id, method, params }) = &parsed {
            match method.as_ref() {
                "initialize" => return self.initialize(id, *params, arrived, who).await,
                // server/discover exists only in 2026-07-28: without the
                // version header it is a modern request missing a required
                // header, and the modern rules answer it (-32602 or -32020).
                "server/discover" => {
                    return self
                        .modern_request(&headers, id, method, *params, arrived, who)
                        .await;
                }
                _ => {}
            }
        }
        let session = match self.session_of(session_header.as_deref(), who) {
            Ok(s) => s,
            Err(e) => return e.response(),
        };
        let _busy = session.busy();
        match parsed {
            RpcBody::One(Message::Request { id, method, params }) => {
                let r = self.request(&session, &id, &method, params, arrived).await;
                match (&*method, who, &self.ctx.shared.auth) {
                    ("tools/list", Some(p), Some(auth)) => {
                        hide_tools(r, |t| auth.allows_tool(p, t))
                    }
                    _ => r,
                }
            }
            RpcBody::One(Message::Notification { method, params }) => {
                self.notification(&session, &method, params);
                empty(StatusCode::ACCEPTED)
            }
            RpcBody::One(Message::Response { id, .. }) => {
                self.client_answer(&session, &id, &body);
                empty(StatusCode::ACCEPTED)
            }
            RpcBody::Batch(items) => {
                let lists = items.iter().any(
                    |i| matches!(i, Ok(Message::Request { method, .. }) if method == "tools/list"),
                );
                let r = self.batch(&session, items, &body, arrived).await;
                match (lists, who, &self.ctx.shared.auth) {
                    (true, Some(p), Some(auth)) => hide_tools(r, |t| auth.allows_tool(p, t)),
                    _ => r,
                }
            }
        }
    }

    async fn initialize(
        self: Rc<Self>,
        id: &Id<'_>,
        params: Option<&RawValue>,
        arrived: Instant,
        who: Option<&Principal>,
    ) -> Response<Body> {
        // Build and run the frame first: bad params are refused before a
        // session exists.
        let mut out = Vec::new();
        let (info_version, (elicitation, sampling, roots), called) = {
            let h = self.header(None);
            let built = {
                let mut enc = self.enc.borrow_mut();
                jsonrpc::request_frame(&mut enc, &h, Method::Initialize, params, &[])
                    .map(|(f, info)| (Bytes::copy_from_slice(f), info))
            };
            match built {
                Err(e) => {
                    jsonrpc::write_error(&mut out, Some(id), e.code, &e.message, e.data.as_deref());
                    return json_response(StatusCode::OK, out);
                }
                Ok((frame, info)) => {
                    let version = negotiate(info.protocol_version.as_deref());
                    let caps = (
                        info.client_elicitation,
                        info.client_sampling,
                        info.client_roots,
                    );
                    (
                        version,
                        caps,
                        self.run(frame, arrived, None, None, None, None).await,
                    )
                }
            }
        };
        let Some(fin) = frames(&called.frames).last() else {
            jsonrpc::write_error(
                &mut out,
                Some(id),
                ErrorCode::Internal.code(),
                "no answer",
                None,
            );
            return json_response(StatusCode::OK, out);
        };
        if mcp_schema::client::ResponseView::parse(fin).is_ok_and(|v| v.error().is_some()) {
            jsonrpc::write_response(&mut out, id, Method::Initialize, fin, info_version);
            return json_response(StatusCode::OK, out);
        }
        let session =
            match self
                .sessions()
                .create(self.ctx.index, info_version, elicitation, sampling, roots)
            {
                Ok(s) => s,
                Err(e @ session::SessionError::Full(_)) => {
                    called.answered(ErrorCode::Overloaded.code());
                    let mut r = refuse_request(
                        StatusCode::SERVICE_UNAVAILABLE,
                        Some(id),
                        ErrorCode::Overloaded.code(),
                        &e.to_string(),
                    );
                    r.headers_mut()
                        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
                    return r;
                }
                Err(e) => {
                    called.answered(ErrorCode::Internal.code());
                    return refuse_request(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        Some(id),
                        ErrorCode::Internal.code(),
                        &e.to_string(),
                    );
                }
            };
        if let Some(p) = who {
            let _ = session.subject.set(p.subject.clone());
        }
        jsonrpc::write_response(&mut out, id, Method::Initialize, fin, info_version);
        let mut r = json_response(StatusCode::OK, out);
        if let Ok(v) = HeaderValue::from_str(&session.id) {
            r.headers_mut().insert(SESSION_HEADER, v);
        }
        r
    }

    fn header<'a>(&self, session: Option<&'a str>) -> RequestHeader<'a> {
        // One clock read for both.
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        RequestHeader {
            message_id: self.ids.borrow_mut().next(now.as_millis() as u64).0,
            correlation_id: None,
            session_id: session,
            timeout_ms: 0,
            unix_nanos: now.as_nanos() as i64,
        }
    }

    /// Runs `frame` through dispatch on this shard, racing `cancel`. Every
    /// path yields exactly one final frame.
    ///
    /// `frame` is always a copy of what `self.enc` (a `RequestEncoder`)
    /// returned for the request this edge parsed: every caller (here and
    /// in `modern.rs`) builds it so, and nothing else reaches this.
    /// `first`: the record of the request's first round, when this run is
    /// a later round of it (the tool called again with the client's
    /// answer); it then takes this run's outcome, and no record of its own
    /// is made. `scope`: the token's subject, which the frame's session id
    /// is kept within (a 2026-07-28 call's, [`modern::SUBJECT_SESSION`]).
    async fn run(
        &self,
        frame: Bytes,
        arrived: Instant,
        cancel: Option<&Cancel>,
        live: Option<&dyn LiveOut>,
        first: Option<&Record>,
        scope: Option<&str>,
    ) -> Called {
        let started = Instant::now();
        let mut out = Vec::new();
        // SAFETY: an unmodified copy of a RequestEncoder's output (above).
        let req = match unsafe { VerifiedRequest::from_encoder(frame) } {
            Ok(r) => match scope {
                Some(s) => r.with_session_scope(std::sync::Arc::from(s)),
                None => r,
            },
            Err(e) => {
                // An empty name the JSON allowed, answered as the frame edge
                // answers one. Not a request: it is in no request metric.
                let to = mcp_schema::encode::ReplyTo {
                    correlation: mcp_schema::encode::Correlation::Text(""),
                    session_id: None,
                };
                out.extend_from_slice(self.ctx.enc.borrow_mut().error(
                    &to,
                    e.code(),
                    &e.to_string(),
                    None,
                ));
                return Called {
                    frames: out,
                    arrived,
                    record: None,
                };
            }
        };
        let stats = self.stats();
        let in_flight = InFlight::count(stats);
        let mut args = Vec::new();
        let who = metrics::record::attribute(&self.ctx, &req);
        let cut = {
            let handle = crate::dispatch::handle_live(&self.ctx, &req, &mut args, &mut out, live);
            let expired = self.drain_expired.wait();
            match cancel {
                None => monoio::select! {
                    _ = handle => None,
                    _ = expired => Some(Cut::DrainExpired),
                },
                Some(c) => monoio::select! {
                    _ = handle => None,
                    _ = c.cancelled() => Some(Cut::Cancelled),
                    _ = expired => Some(Cut::DrainExpired),
                },
            }
        };
        drop(in_flight);
        if let Some(cut) = cut {
            // Dropping the handler stopped the guest call; the request still
            // gets its one final answer (at the drain deadline, before the
            // shard closes its connections: it once got none).
            out.clear();
            match cut {
                // Its callers answer the client -32800 (or no one, when the
                // stream it would go on is gone); the frame only ends it.
                Cut::Cancelled => {
                    let to = req.view().reply_to();
                    let message = "request cancelled by the client";
                    let code = ErrorCode::InvalidRequest;
                    out.extend_from_slice(
                        self.ctx.enc.borrow_mut().error(&to, code, message, None),
                    );
                }
                Cut::DrainExpired => crate::shard::drain_deadline_answer(&self.ctx, &req, &mut out),
            }
        }
        let outcome = match cut {
            Some(Cut::Cancelled) => metrics::Outcome::Cancelled,
            _ if stats.layout.recording => metrics::peek::outcome(&out),
            _ => metrics::Outcome::Ok,
        };
        let record = match first {
            Some(first) => {
                first.0.outcome.set(outcome);
                first.clone()
            }
            None => Record(Rc::new(Recorded {
                ctx: self.ctx.clone(),
                req,
                who,
                arrived,
                started,
                outcome: Cell::new(outcome),
            })),
        };
        Called {
            frames: out,
            arrived,
            record: Some(record),
        }
    }

    /// One request of a session: its answer as JSON, or as an SSE stream
    /// when there is more to send than the answer.
    async fn request(
        self: &Rc<Self>,
        session: &Arc<Session>,
        id: &Id<'_>,
        method: &str,
        params: Option<&RawValue>,
        arrived: Instant,
    ) -> Response<Body> {
        if let Some(token) = self.streams_live(session, method, params) {
            return self.request_live(session, id, method, params, arrived, token);
        }
        match self
            .answer(session, id, method, params, arrived, With::default())
            .await
        {
            Answer::Json(out) => json_response(StatusCode::OK, out),
            Answer::Stream(cont) => {
                let (tx, rx) = sse::channel();
                let stream = session.open_stream(tx, false);
                if primes_streams(session.version) {
                    session.emit(stream, None);
                }
                let edge = self.clone();
                let session = session.clone();
                monoio::spawn(async move {
                    edge.stream(session, stream, cont).await;
                });
                sse_response(rx, OpenStream::count(self, StreamKind::SessionPost), None)
            }
        }
    }

    /// For a `tools/call` whose router reports progress and logs while it
    /// runs (`mcp-broker:host/call`), and whose client wants them (a
    /// progress token, or a session log level): `Some(progress token)`.
    /// Such a call is answered on an SSE stream opened at once, so that its
    /// notifications reach the client as they happen.
    fn streams_live(
        &self,
        session: &Session,
        method: &str,
        params: Option<&RawValue>,
    ) -> Option<Option<String>> {
        #[derive(serde::Deserialize)]
        struct Call<'a> {
            #[serde(borrow)]
            name: Cow<'a, str>,
            #[serde(rename = "_meta", default, borrow)]
            meta: Option<CallMeta<'a>>,
        }
        #[derive(serde::Deserialize)]
        struct CallMeta<'a> {
            #[serde(rename = "progressToken", default, borrow)]
            progress_token: Option<&'a RawValue>,
        }
        if method != "tools/call" {
            return None;
        }
        let params = params?.get();
        // Most calls want neither: no second parse of their params then.
        if session.level().is_none() && !params.contains("progressToken") {
            return None;
        }
        let call: Call<'_> = serde_json::from_str(params).ok()?;
        let token = call
            .meta
            .and_then(|m| m.progress_token)
            .map(|t| t.get().to_owned());
        if token.is_none() && session.level().is_none() {
            return None;
        }
        let routing = self.ctx.shared.routing.load();
        let target = routing.table.tool(&call.name)?.router as usize;
        routing.routers[target]
            .router
            .reports_live()
            .then_some(token)
    }

    /// Answers a call on an SSE stream opened before it runs: its progress
    /// and logs are sent as the router reports them, then the rest of the
    /// answer as [`Self::stream`] sends it.
    fn request_live(
        self: &Rc<Self>,
        session: &Arc<Session>,
        id: &Id<'_>,
        method: &str,
        params: Option<&RawValue>,
        arrived: Instant,
        progress_token: Option<String>,
    ) -> Response<Body> {
        let (tx, rx) = sse::channel();
        let stream = session.open_stream(tx, false);
        if primes_streams(session.version) {
            session.emit(stream, None);
        }
        let edge = self.clone();
        let session = session.clone();
        let id = id.0.to_owned();
        let method = method.to_owned();
        let params = params.map(ToOwned::to_owned);
        monoio::spawn(async move {
            let _busy = session.busy();
            let live = HttpLive {
                session: session.clone(),
                stream,
                progress_token: progress_token.and_then(|t| RawValue::from_string(t).ok()),
            };
            let answer = edge
                .answer(
                    &session,
                    &Id(&id),
                    &method,
                    params.as_deref(),
                    arrived,
                    With {
                        extra: &[],
                        live: Some(&live),
                        first: None,
                        call: None,
                    },
                )
                .await;
            match answer {
                Answer::Json(out) => {
                    session.emit(stream, Some(&out));
                    session.close_stream(stream);
                }
                Answer::Stream(cont) => edge.stream(session, stream, cont).await,
            }
        });
        sse_response(rx, OpenStream::count(self, StreamKind::SessionPost), None)
    }

    /// Runs one request; `Answer::Json` when its whole answer is one JSON
    /// message, else what the SSE stream must carry.
    async fn answer(
        self: &Rc<Self>,
        session: &Arc<Session>,
        id: &Id<'_>,
        method: &str,
        params: Option<&RawValue>,
        arrived: Instant,
        with: With<'_>,
    ) -> Answer {
        let With {
            extra,
            live,
            first,
            call,
        } = with;
        let mut out = Vec::with_capacity(256);
        let Some(m) = Method::from_name(method) else {
            jsonrpc::write_error(
                &mut out,
                Some(id),
                ErrorCode::NotFound.code(),
                &format!("method not found: {method}"),
                None,
            );
            return Answer::Json(out);
        };
        if m == Method::Initialize {
            jsonrpc::write_error(
                &mut out,
                Some(id),
                ErrorCode::InvalidRequest.code(),
                "this session is already initialized; start a new one without Mcp-Session-Id",
                None,
            );
            return Answer::Json(out);
        }
        let built = {
            let h = self.header(Some(&session.id));
            let mut enc = self.enc.borrow_mut();
            jsonrpc::request_frame(&mut enc, &h, m, params, extra)
                .map(|(f, info)| (Bytes::copy_from_slice(f), info))
        };
        let (frame, info) = match built {
            Ok(b) => b,
            Err(e) => {
                // A later round whose repeated call cannot be built ends
                // its request with this answer.
                if let Some(first) = first {
                    first.answered(e.code);
                }
                jsonrpc::write_error(&mut out, Some(id), e.code, &e.message, e.data.as_deref());
                return Answer::Json(out);
            }
        };
        // Only what runs in a router can be worth cancelling; the broker's
        // own answers (ping, listings, log level) are done before any
        // notification could arrive, and need no registration (a lock and
        // an id copy) on their path.
        // A later round runs under its request's registration, which the
        // stream holds from the first round to the final answer, so that
        // a cancel between rounds is heard too.
        let id_text = id.0.get();
        let own = if routed(m) && call.is_none() {
            let Some(c) = session.start_call(id_text) else {
                jsonrpc::write_error(
                    &mut out,
                    Some(id),
                    ErrorCode::InvalidRequest.code(),
                    "a request with this id is already in flight in this session",
                    None,
                );
                return Answer::Json(out);
            };
            Some(c)
        } else {
            None
        };
        let cancel = call.or(own.as_ref()).map(CallInFlight::cancel);
        let called = self.run(frame, arrived, cancel, live, first, None).await;
        if cancel.is_some_and(Cancel::is_cancelled) {
            // Also when the call had finished: the client is told -32800,
            // and counted so.
            called.answered(REQUEST_CANCELLED);
            jsonrpc::write_error(
                &mut out,
                Some(id),
                REQUEST_CANCELLED,
                cancelled_message(session),
                None,
            );
            return Answer::Json(out);
        }
        let progress_token = info.progress_token;
        if let Some(level) = info.log_level {
            // Validated by the codec; the frame's answer is empty.
            session.set_level(level);
        }
        // A (un)subscription the broker accepted (the URI routes) decides
        // which resource updates reach the session's GET stream.
        if matches!(m, Method::Subscribe | Method::Unsubscribe)
            && let Some(uri) = info.uri.as_deref()
            && frames(&called.frames).last().is_some_and(|f| {
                mcp_schema::client::ResponseView::parse(f).is_ok_and(|v| v.error().is_none())
            })
            && let Err(why) = self
                .sessions()
                .set_subscription(session, uri, m == Method::Subscribe)
        {
            called.answered(ErrorCode::InvalidParams.code());
            jsonrpc::write_error(
                &mut out,
                Some(id),
                ErrorCode::InvalidParams.code(),
                &why,
                None,
            );
            return Answer::Json(out);
        }
        let mut more = false;
        let mut last = None;
        for f in frames(&called.frames) {
            match jsonrpc::frame_kind(f) {
                FrameKind::Progress => more |= progress_token.is_some(),
                FrameKind::Log => more |= session.level().is_some(),
                FrameKind::Elicitation => more = true,
                // Resource updates belong on the standalone GET stream, not
                // to one request.
                FrameKind::ResourceUpdated => {}
                FrameKind::Final => {
                    more |= jsonrpc::result_asks(f);
                    last = Some(f);
                }
            }
        }
        // A failed call is also told on the log stream of a session that
        // asked for logs, as an MCP server would. (Checked only then: each
        // look into a frame verifies it again.)
        if !more && session.level().is_some_and(|l| level_allows(l, "warning")) {
            more = last.is_some_and(|f| {
                mcp_schema::client::ResponseView::parse(f).is_ok_and(|v| v.error().is_some())
            });
        }
        if !more {
            if let Some((_, resp)) = called.answer() {
                // SAFETY: read by `built_response` from the call's own frames.
                unsafe { jsonrpc::write_response_of(&mut out, id, &info, resp, session.version) };
            }
            return Answer::Json(out);
        }
        Answer::Stream(Continuation {
            id: id_text.to_owned(),
            method: m,
            params: params.map(|p| p.get().to_owned()),
            progress_token: progress_token.map(|t| t.get().to_owned()),
            name: info.tool_name.map(Cow::into_owned),
            uri: info.uri.map(Cow::into_owned),
            frames: called.frames,
            arrived: called.arrived,
            record: called.record,
            call: own,
        })
    }

    /// Sends a streamed answer's events: progress and log notifications,
    /// elicitation round trips, then the final answer; then ends the stream.
    async fn stream(self: Rc<Self>, session: Arc<Session>, stream: StreamId, mut c: Continuation) {
        let _busy = session.busy();
        let id_raw = RawValue::from_string(c.id.clone()).ok();
        let Some(id_raw) = id_raw else {
            session.close_stream(stream);
            return;
        };
        let id = Id(&id_raw);
        let mut buf = Vec::with_capacity(256);
        let mut rounds = 0;
        loop {
            let mut elicit: Option<Vec<u8>> = None;
            let mut fin: Option<Vec<u8>> = None;
            for f in frames(&c.frames) {
                buf.clear();
                match jsonrpc::frame_kind(f) {
                    FrameKind::Progress => {
                        if let Some(t) = c.progress_token.as_deref()
                            && let Ok(t) = RawValue::from_string(t.to_owned())
                        {
                            jsonrpc::write_progress(&mut buf, &t, f);
                            session.emit(stream, Some(&buf));
                        }
                    }
                    FrameKind::Log => {
                        let wanted = session.level().is_some_and(|l| {
                            jsonrpc::log_level_of(f).is_some_and(|at| level_allows(l, at))
                        });
                        if wanted {
                            jsonrpc::write_log(&mut buf, f);
                            session.emit(stream, Some(&buf));
                        }
                    }
                    FrameKind::ResourceUpdated => {}
                    FrameKind::Elicitation => elicit = Some(f.to_vec()),
                    FrameKind::Final => fin = Some(f.to_vec()),
                }
            }
            // What the tool asks, if anything: an elicitation, else a set
            // of questions, sampling or roots asked by its result. The
            // answer is the argument it is called again with.
            let asked_by = elicit.as_deref().or(fin.as_deref());
            let answered = match (&elicit, fin.as_deref()) {
                (Some(f), _) => Some((jsonrpc::ELICITATION_ARG, Ask::Elicit(f).into())),
                (None, Some(f)) => jsonrpc::input_requests(f)
                    .map(|set| (jsonrpc::INPUTS_ARG, Asking::Set(set)))
                    .or_else(|| {
                        let s = jsonrpc::sampling_request(f).map(Ask::Sample);
                        let ask = s.or_else(|| jsonrpc::roots_request(f).map(Ask::Roots))?;
                        let arg = match ask {
                            Ask::Sample(_) => jsonrpc::SAMPLING_ARG,
                            _ => jsonrpc::ROOTS_ARG,
                        };
                        Some((arg, ask.into()))
                    }),
                (None, None) => None,
            };
            if let Some((arg, asking)) = answered {
                rounds += 1;
                // The router's state goes back with the answer; the stream
                // holds it meanwhile (request_state.rs).
                let state = asked_by
                    .and_then(jsonrpc::router_state)
                    .map(|s| s.into_owned());
                // While it waits for the client's answer the request is
                // still in flight for the client: its notifications/cancelled
                // ends it here (-32800), rather than go unheard and let the
                // tool run again when a late answer comes.
                let cancel = c.call.as_ref().map(CallInFlight::cancel);
                let asked = async {
                    match asking {
                        Asking::One(ask) => self.ask_client(&session, stream, ask, rounds).await,
                        Asking::Set(set) => {
                            let tool = c.name.as_deref().unwrap_or_default();
                            self.ask_set(&session, stream, tool, set, rounds).await
                        }
                    }
                };
                let answer = match cancel {
                    None => asked.await,
                    Some(cancel) => monoio::select! {
                        a = asked => a,
                        _ = cancel.cancelled() => Err((
                            REQUEST_CANCELLED,
                            cancelled_message(&session).to_owned(),
                        )),
                    },
                };
                match answer {
                    Ok(answer) => {
                        let params = c
                            .params
                            .as_deref()
                            .and_then(|p| RawValue::from_string(p.to_owned()).ok());
                        let next = self
                            .answer(
                                &session,
                                &id,
                                c.method.name(),
                                params.as_deref(),
                                c.arrived,
                                With {
                                    extra: &match &state {
                                        Some(s) => {
                                            vec![(arg, answer.as_str()), (jsonrpc::STATE_ARG, s)]
                                        }
                                        None => vec![(arg, answer.as_str())],
                                    },
                                    live: None,
                                    first: c.record.as_ref(),
                                    call: c.call.as_ref(),
                                },
                            )
                            .await;
                        match next {
                            Answer::Json(b) => {
                                session.emit(stream, Some(&b));
                                break;
                            }
                            Answer::Stream(next) => {
                                c = Continuation {
                                    progress_token: c.progress_token.take(),
                                    call: c.call.take(),
                                    ..next
                                };
                                continue;
                            }
                        }
                    }
                    Err((code, msg)) => {
                        if let Some(r) = &c.record {
                            r.answered(code);
                        }
                        // As a failure the router's answer carries: the
                        // failure log first (when asked for), then the
                        // error with its kind.
                        if let Some(level) = session.level()
                            && level_allows(level, "warning")
                        {
                            buf.clear();
                            write_failure_log(&mut buf, c.method, code, &msg);
                            session.emit(stream, Some(&buf));
                        }
                        buf.clear();
                        let mut data = Vec::new();
                        let data = jsonrpc::broker_error_data(code, &mut data);
                        jsonrpc::write_error(&mut buf, Some(&id), code, &msg, data);
                        session.emit(stream, Some(&buf));
                        break;
                    }
                }
            }
            if let Some(f) = fin {
                if let Some(level) = session.level()
                    && level_allows(level, "warning")
                    && let Ok(v) = mcp_schema::client::ResponseView::parse(&f)
                    && let Some((code, message)) = v.error()
                {
                    buf.clear();
                    write_failure_log(&mut buf, c.method, code, message);
                    session.emit(stream, Some(&buf));
                }
                buf.clear();
                jsonrpc::write_response_for(&mut buf, &id, &c.info(), &f, session.version);
                session.emit(stream, Some(&buf));
            }
            break;
        }
        session.close_stream(stream);
    }

    /// One round trip to the client on `stream`: `elicitation/create` for
    /// an elicit answer, `sampling/createMessage` or `roots/list` for a
    /// result that asks for sampling or roots; then the client's answer, as
    /// the JSON of the argument the tool is called again with.
    async fn ask_client(
        &self,
        session: &Arc<Session>,
        stream: StreamId,
        ask: Ask<'_>,
        round: usize,
    ) -> Result<String, (i32, String)> {
        capable(session, ask)?;
        if round > MAX_ELICITATIONS {
            return Err((
                ErrorCode::RouterFault.code(),
                format!("the tool asked the client more than {MAX_ELICITATIONS} times in one call"),
            ));
        }
        let Some((ask_id, rx)) = session.ask() else {
            return Err((
                ErrorCode::Overloaded.code(),
                format!(
                    "{} questions to this client already wait for its answers; answer them, \
                     or let them time out (http.client_answer_timeout)",
                    session::MAX_PENDING_ASKS
                ),
            ));
        };
        let mut buf = Vec::with_capacity(256);
        match ask {
            Ask::Elicit(frame) => {
                jsonrpc::write_elicitation_create(&mut buf, &ask_id, frame);
            }
            Ask::ElicitWith(params) => {
                jsonrpc::write_client_request(&mut buf, &ask_id, "elicitation/create", params);
            }
            Ask::Sample(params) => {
                jsonrpc::write_client_request(&mut buf, &ask_id, "sampling/createMessage", params);
            }
            Ask::Roots(params) => {
                jsonrpc::write_client_request(&mut buf, &ask_id, "roots/list", params);
            }
        }
        session.emit(stream, Some(&buf));
        // The request is still being handled: counted while it waits, as
        // docs/metrics.md says (the gauge read 0 with 3,000 waiting).
        let _in_flight = InFlight::count(self.stats());
        // The drain's deadline ends the wait as it ends a running call: the
        // request still gets its final answer before the shard closes.
        let answer = monoio::select! {
            a = monoio::time::timeout(self.cfg.client_answer_timeout, rx) => Some(a),
            _ = self.drain_expired.wait() => None,
        };
        session.forget_ask(&ask_id);
        let message = match answer {
            Some(Ok(Ok(m))) => m,
            Some(Ok(Err(_))) => {
                // Only a DELETE drops a question (an idle sweep never
                // ends a session with a request in it), and it cancels
                // the call too: answered as that cancel, whichever of the
                // two this wait saw first.
                return Err((REQUEST_CANCELLED, cancelled_message(session).into()));
            }
            Some(Err(_)) => {
                return Err((
                    ErrorCode::DeadlineExceeded.code(),
                    "the client did not answer within http.client_answer_timeout".into(),
                ));
            }
            None => {
                return Err((
                    ErrorCode::ShuttingDown.code(),
                    "drain deadline passed while waiting for the client's answer".into(),
                ));
            }
        };
        match jsonrpc::parse(&message) {
            Ok(RpcBody::One(Message::Response {
                result: Some(result),
                ..
            })) => match ask {
                Ask::Elicit(_) | Ask::ElicitWith(_) => {
                    jsonrpc::elicitation_answer(result).map_err(|e| (e.code, e.message))
                }
                // The client's CreateMessageResult, as it sent it.
                Ask::Sample(_) if result.get().trim_start().starts_with('{') => {
                    Ok(result.get().to_owned())
                }
                Ask::Sample(_) => Err((
                    ErrorCode::InvalidRequest.code(),
                    "the client's sampling result is not a JSON object".into(),
                )),
                // The client's ListRootsResult, as it sent it.
                Ask::Roots(_) if result.get().trim_start().starts_with('{') => {
                    Ok(result.get().to_owned())
                }
                Ask::Roots(_) => Err((
                    ErrorCode::InvalidRequest.code(),
                    "the client's roots/list result is not a JSON object".into(),
                )),
            },
            Ok(RpcBody::One(Message::Response { error: Some(e), .. })) => Err((
                ErrorCode::InvalidRequest.code(),
                format!("the client refused: {}", e.get()),
            )),
            _ => Err((
                ErrorCode::InvalidRequest.code(),
                "the client's answer is not a JSON-RPC response".into(),
            )),
        }
    }

    /// A set of questions a result asked ([`jsonrpc::input_requests`]),
    /// each sent on `stream` in turn once the client is known to declare
    /// every capability they need; then the answers as the `_inputs`
    /// object, by key. The first failure ends the call.
    async fn ask_set(
        &self,
        session: &Arc<Session>,
        stream: StreamId,
        tool: &str,
        set: Result<Vec<jsonrpc::InputRequest<'_>>, String>,
        round: usize,
    ) -> Result<String, (i32, String)> {
        let set = set.map_err(|m| {
            (
                ErrorCode::Internal.code(),
                format!("the tool `{tool}` asked what cannot be asked: {m}"),
            )
        })?;
        fn ask<'q>(q: &'q jsonrpc::InputRequest<'_>) -> Ask<'q> {
            match q.asked {
                Asked::Elicitation => Ask::ElicitWith(q.params),
                Asked::Sampling => Ask::Sample(q.params),
                Asked::Roots => Ask::Roots(q.params),
            }
        }
        for q in &set {
            capable(session, ask(q))?;
        }
        let mut inputs = modern::Inputs::default();
        for q in &set {
            let answer = self.ask_client(session, stream, ask(q), round).await?;
            inputs.add(&q.key, &answer);
        }
        Ok(inputs.end())
    }

    /// Other notifications (initialized, roots/list_changed, progress of
    /// client-side work) carry nothing the broker acts on: a session serves
    /// requests from its initialize on.
    fn notification(&self, session: &Session, method: &str, params: Option<&RawValue>) {
        if method == "notifications/cancelled"
            && let Some(id) = jsonrpc::cancelled_request_id(params)
        {
            session.cancel_call(id.get());
        }
    }

    /// A client's JSON-RPC response: the answer to a request the broker sent.
    fn client_answer(&self, session: &Session, id: &Id<'_>, message: &Bytes) {
        let key = id.0.get();
        // Our ids are JSON strings: match on their text without quotes.
        let key = key.trim_matches('"');
        if !session.answer(key, message.clone()) {
            // No session id: without [auth] it is the session's only key.
            tracing::debug!(id = key, "a response to no outstanding request");
        }
    }

    async fn batch(
        self: &Rc<Self>,
        session: &Arc<Session>,
        items: Vec<Result<Message<'_>, RpcError<'_>>>,
        body: &Bytes,
        arrived: Instant,
    ) -> Response<Body> {
        if session.version != "2025-03-26" {
            return refuse(
                StatusCode::BAD_REQUEST,
                ErrorCode::InvalidRequest.code(),
                &format!(
                    "JSON-RPC batches are accepted only in protocol version 2025-03-26 (this session negotiated {})",
                    session.version
                ),
            );
        }
        let mut out = Vec::with_capacity(256);
        let mut any = false;
        out.push(b'[');
        for (i, item) in items.into_iter().enumerate() {
            // As a frame connection does: a 4 MiB batch of 40,000 calls ran
            // without a break for seconds, and every other client of the
            // shard waited as long.
            if i > 0 && i % crate::edge::frames::FRAMES_PER_TURN == 0 {
                crate::shard::yield_to_sockets().await;
            }
            let mut one = None;
            match item {
                Err(e) => {
                    let mut b = Vec::new();
                    jsonrpc::write_error(
                        &mut b,
                        e.id.as_ref(),
                        e.code,
                        &e.message,
                        e.data.as_deref(),
                    );
                    one = Some(b);
                }
                Ok(Message::Request { id, method, params }) => {
                    // Batched requests are answered as JSON: progress and
                    // elicitation need a stream of their own.
                    match self
                        .answer(session, &id, &method, params, arrived, With::default())
                        .await
                    {
                        Answer::Json(b) => one = Some(b),
                        Answer::Stream(c) => {
                            let mut b = Vec::new();
                            // A question to the client (elicitation, or a
                            // first result asking for sampling, roots or a
                            // set of inputs) needs the request's own
                            // stream, which a batched answer does not
                            // have: never its first result as the final
                            // one, nor the broker's directives in `_meta`.
                            let asks = frames(&c.frames).any(|f| match jsonrpc::frame_kind(f) {
                                FrameKind::Elicitation => true,
                                FrameKind::Final => jsonrpc::result_asks(f),
                                _ => false,
                            });
                            if asks {
                                jsonrpc::write_tool_error(
                                    &mut b,
                                    &id,
                                    "the tool asks the client for more input (elicitation, \
                                     sampling or roots), which needs a stream of its own: \
                                     a request in a JSON-RPC batch is answered as JSON only; \
                                     send this call outside a batch",
                                );
                            } else if let Some(f) = frames(&c.frames).last() {
                                jsonrpc::write_response_for(
                                    &mut b,
                                    &id,
                                    &c.info(),
                                    f,
                                    session.version,
                                );
                            }
                            one = Some(b);
                        }
                    }
                }
                Ok(Message::Notification { method, params }) => {
                    self.notification(session, &method, params)
                }
                Ok(Message::Response { id, .. }) => self.client_answer(session, &id, body),
            }
            if let Some(b) = one {
                if any {
                    out.push(b',');
                }
                out.extend_from_slice(&b);
                any = true;
            }
        }
        out.push(b']');
        if any {
            json_response(StatusCode::OK, out)
        } else {
            empty(StatusCode::ACCEPTED)
        }
    }

    /// GET: the session's standalone SSE stream (server notifications), or
    /// the resumption of a stream after `Last-Event-ID`.
    fn get(self: Rc<Self>, req: Request<Incoming>, who: Option<&Principal>) -> Response<Body> {
        let h = req.headers();
        if !accepts(h, "text/event-stream") {
            return refuse(
                StatusCode::NOT_ACCEPTABLE,
                ErrorCode::InvalidRequest.code(),
                "not acceptable: GET /mcp opens an SSE stream; accept text/event-stream",
            );
        }
        let session = match self.session_of(header_str(h, SESSION_HEADER), who) {
            Ok(s) => s,
            // A GET that opens the conversation is the HTTP+SSE transport
            // of 2024-11-05 (its clients fail here first): say so.
            Err(NoSession::Missing) => {
                return refuse(
                    StatusCode::BAD_REQUEST,
                    ErrorCode::InvalidRequest.code(),
                    "bad request: the Mcp-Session-Id header is required (send initialize first); \
                     a GET without one is the HTTP+SSE transport of 2024-11-05, which this \
                     endpoint does not serve: use Streamable HTTP (any protocol revision)",
                );
            }
            Err(e) => return e.response(),
        };
        let (tx, rx) = sse::channel();
        let tx = tx.counting_cuts(self.ctx.shared.http_get_streams_cut.clone());
        let attached = tx.id();
        let stream = match header_str(h, "last-event-id") {
            Some(last) => match session.resume(last, tx) {
                Some(s) => s,
                None => {
                    return refuse(
                        StatusCode::NOT_FOUND,
                        ErrorCode::InvalidRequest.code(),
                        "cannot resume: the stream of this Last-Event-ID is unknown or its events are no longer kept",
                    );
                }
            },
            None => {
                let s = session.open_stream(tx, true);
                if primes_streams(session.version) {
                    session.emit(s, None);
                }
                s
            }
        };
        let until = who.and_then(Principal::stream_deadline);
        monoio::spawn(keep_alive(
            self.clone(),
            session.clone(),
            stream,
            attached,
            until,
        ));
        let open = OpenStream::count(&self, StreamKind::SessionGet);
        sse_response(rx, open, Some(&session.id))
    }

    fn delete(&self, req: Request<Incoming>, who: Option<&Principal>) -> Response<Body> {
        let h = req.headers();
        let Some(id) = header_str(h, SESSION_HEADER) else {
            return refuse(
                StatusCode::BAD_REQUEST,
                ErrorCode::InvalidRequest.code(),
                "bad request: DELETE needs the Mcp-Session-Id header of the session to end",
            );
        };
        // Another subject cannot end a session it does not own.
        if who.is_some() && self.session_of(Some(id), who).is_err() {
            return refuse(
                StatusCode::NOT_FOUND,
                ErrorCode::InvalidRequest.code(),
                "session not found (ended or expired)",
            );
        }
        if self.sessions().remove(id) {
            empty(StatusCode::OK)
        } else {
            refuse(
                StatusCode::NOT_FOUND,
                ErrorCode::InvalidRequest.code(),
                "session not found (ended or expired)",
            )
        }
    }
}

/// Keeps an open SSE stream (attached to its client as `attached`) alive
/// with comments. The session ending or the drain ends the stream. Its
/// client going (or being cut for what it left unread), or the token that
/// opened it expiring (`until`, with `[auth]`), ends only the client's
/// body: the stream keeps its events, and a client with `Last-Event-ID`
/// resumes it. (Ended instead, a GET stream dropped every event until a
/// new GET, and a resumption got nothing more.) The token is checked once
/// per request, and this request does not end by itself: it told its
/// client of the session's updates long after the token stopped opening
/// anything else. A task whose client another resumed leaves the stream
/// to that client's task.
async fn keep_alive(
    edge: Rc<HttpEdge>,
    session: Arc<Session>,
    stream: StreamId,
    attached: u64,
    until: Option<Instant>,
) {
    let _busy = session.busy();
    loop {
        monoio::select! {
            _ = monoio::time::sleep(next_wake(edge.cfg.sse_keepalive, until)) => {}
            _ = edge.draining.wait() => {
                session.close_stream(stream);
                return;
            }
        }
        if session.is_ended() {
            session.close_stream(stream);
            return;
        }
        if until.is_some_and(|t| Instant::now() >= t) {
            session.detach_stream(stream, attached);
            return;
        }
        if !session.comment(stream, attached) {
            return;
        }
    }
}

/// How long a stream's keep-alive task sleeps: a keep-alive period, or less
/// when the stream's token expires (`until`) sooner.
pub(super) fn next_wake(keepalive: Duration, until: Option<Instant>) -> Duration {
    until.map_or(keepalive, |t| {
        keepalive.min(t.saturating_duration_since(Instant::now()))
    })
}

/// Why a request has no session.
enum NoSession {
    /// No `Mcp-Session-Id`: 400.
    Missing,
    /// An id that is not (or no longer) a live session: 404, and the
    /// client starts a new one.
    Unknown,
}

impl NoSession {
    fn response(self) -> Response<Body> {
        match self {
            NoSession::Missing => refuse(
                StatusCode::BAD_REQUEST,
                ErrorCode::InvalidRequest.code(),
                "bad request: the Mcp-Session-Id header is required (send initialize first)",
            ),
            NoSession::Unknown => refuse(
                StatusCode::NOT_FOUND,
                ErrorCode::InvalidRequest.code(),
                "session not found (ended or expired): send initialize to start a new one",
            ),
        }
    }
}

/// Why a call's handler was dropped before it answered.
#[derive(Clone, Copy)]
enum Cut {
    Cancelled,
    DrainExpired,
}

/// What the broker asks the client for in the middle of a tool call.
#[derive(Clone, Copy)]
enum Ask<'a> {
    /// An ElicitationRequest frame.
    Elicit(&'a [u8]),
    /// `elicitation/create` params, as a router wrote them in a set.
    ElicitWith(&'a str),
    /// `sampling/createMessage` params.
    Sample(&'a str),
    /// `roots/list` params.
    Roots(&'a str),
}

/// One question, or a set asked together (to be checked first: `Err`
/// says why it cannot be asked).
enum Asking<'a> {
    One(Ask<'a>),
    Set(Result<Vec<jsonrpc::InputRequest<'a>>, String>),
}

impl<'a> From<Ask<'a>> for Asking<'a> {
    fn from(a: Ask<'a>) -> Self {
        Asking::One(a)
    }
}

/// Whether a session's client declared what `ask` needs, and the error
/// when it did not.
fn capable(session: &Session, ask: Ask<'_>) -> Result<(), (i32, String)> {
    let (declared, what) = match ask {
        Ask::Elicit(_) | Ask::ElicitWith(_) => (
            session.client_elicitation,
            "asks the user for input (elicitation)",
        ),
        Ask::Sample(_) => (
            session.client_sampling,
            "asks the client's model for a completion (sampling)",
        ),
        Ask::Roots(_) => (
            session.client_roots,
            "asks for the client's roots (roots/list)",
        ),
    };
    if declared {
        Ok(())
    } else {
        Err((
            ErrorCode::InvalidRequest.code(),
            format!("the tool {what}, but this client did not declare that capability"),
        ))
    }
}

/// A request's answer: one JSON message, or a stream to continue.
enum Answer {
    Json(Vec<u8>),
    Stream(Continuation),
}

/// What a streamed answer still has to send.
struct Continuation {
    id: String,
    method: Method,
    params: Option<String>,
    progress_token: Option<String>,
    /// The tool name or resource URI the request named (for the wording
    /// and `data` of a not-found error).
    name: Option<String>,
    uri: Option<String>,
    frames: Vec<u8>,
    arrived: Instant,
    /// The request's record: the stream's rounds share it, and it is
    /// written when the stream has sent the final answer.
    record: Option<Record>,
    /// Its id in flight in the session (a routed call's), until the final
    /// answer: a cancel is heard between rounds too.
    call: Option<CallInFlight>,
}

impl Continuation {
    fn info(&self) -> jsonrpc::RequestInfo<'_> {
        let mut info = jsonrpc::RequestInfo::new(self.method);
        info.tool_name = self.name.as_deref().map(Cow::Borrowed);
        info.uri = self.uri.as_deref().map(Cow::Borrowed);
        info
    }
}

/// Whether a session logging at `level` receives messages of `severity`.
/// What a request runs with besides its message.
#[derive(Default, Clone, Copy)]
struct With<'a> {
    /// More arguments of a call repeated after a round trip to the client
    /// (elicitation or sampling): the answer, and the router's state when
    /// it attached one; name and JSON value each.
    extra: &'a [(&'a str, &'a str)],
    /// Where its notifications go while it runs.
    live: Option<&'a dyn LiveOut>,
    /// The record of the request's first round, for a later round
    /// ([`HttpEdge::run`]).
    first: Option<&'a Record>,
    /// A later round's registration in flight, held by its stream.
    call: Option<&'a CallInFlight>,
}

/// A running call's progress and log frames, sent on its SSE stream as
/// notifications as they arrive (`dispatch::LiveOut`).
struct HttpLive {
    session: Arc<Session>,
    stream: StreamId,
    progress_token: Option<Box<RawValue>>,
}

impl LiveOut for HttpLive {
    fn frame(&self, frame: &[u8]) {
        let mut buf = Vec::with_capacity(128);
        match jsonrpc::frame_kind(frame) {
            FrameKind::Progress => {
                let Some(token) = &self.progress_token else {
                    return;
                };
                jsonrpc::write_progress(&mut buf, token, frame);
            }
            FrameKind::Log => {
                let wanted = self.session.level().is_some_and(|l| {
                    jsonrpc::log_level_of(frame).is_some_and(|at| level_allows(l, at))
                });
                if !wanted {
                    return;
                }
                jsonrpc::write_log(&mut buf, frame);
            }
            _ => return,
        }
        self.session.emit(self.stream, Some(&buf));
    }
}

fn level_allows(level: &str, severity: &str) -> bool {
    let rank = |l: &str| jsonrpc::level_rank(l).unwrap_or(0);
    rank(severity) >= rank(level)
}

/// The message of a -32800 answer: the client cancelled the request, or
/// ended its session (DELETE), which cancels every request in it.
fn cancelled_message(session: &Session) -> &'static str {
    if session.is_ended() {
        "request cancelled: the client ended its session"
    } else {
        "request cancelled by the client"
    }
}

/// `notifications/message` telling a session's log that a request failed.
fn write_failure_log(out: &mut Vec<u8>, method: Method, code: i32, message: &str) {
    let level = if code == ErrorCode::RouterFault.code() || code == ErrorCode::Internal.code() {
        "error"
    } else {
        "warning"
    };
    out.extend_from_slice(
        b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{\"level\":\"",
    );
    out.extend_from_slice(level.as_bytes());
    out.extend_from_slice(b"\",\"logger\":\"mcp-broker\",\"data\":{\"method\":");
    mcp_schema::args::write_json_string(method.name(), out);
    // The broker's own code and kind (as the frame edge and the metrics
    // name the failure), not the JSON-RPC answer's: MCP's mapping may give
    // that one another code (an unknown tool is -32602 there), or make it
    // a tool result.
    out.extend_from_slice(b",\"code\":");
    out.extend_from_slice(code.to_string().as_bytes());
    if let Some(kind) = ErrorCode::from_code(code) {
        out.extend_from_slice(b",\"kind\":");
        mcp_schema::args::write_json_string(kind.as_str(), out);
    }
    out.extend_from_slice(b",\"message\":");
    mcp_schema::args::write_json_string(message, out);
    out.extend_from_slice(b"}}}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_lists_are_read_with_wildcards_and_parameters() {
        let mut h = HeaderMap::new();
        h.insert(
            header::ACCEPT,
            HeaderValue::from_static("application/json;q=0.9, text/event-stream"),
        );
        assert!(accepts(&h, "application/json") && accepts(&h, "text/event-stream"));
        h.insert(header::ACCEPT, HeaderValue::from_static("application/json"));
        assert!(!accepts(&h, "text/event-stream"));
        h.insert(header::ACCEPT, HeaderValue::from_static("*/*"));
        assert!(accepts(&h, "text/event-stream"));
        h.insert(header::ACCEPT, HeaderValue::from_static("text/*"));
        assert!(accepts(&h, "text/event-stream") && !accepts(&h, "application/json"));
        assert!(!accepts(&HeaderMap::new(), "application/json"));
        // The one-pass form answers each type as `accepts` does, over
        // every Accept line.
        let both = ["application/json", "text/event-stream"];
        assert_eq!(accepted(&h, both), [false, true]);
        h.insert(
            header::ACCEPT,
            HeaderValue::from_static("TEXT/Event-Stream"),
        );
        h.append(
            header::ACCEPT,
            HeaderValue::from_static("application/*; q=1"),
        );
        assert_eq!(accepted(&h, both), [true, true]);
        assert_eq!(accepted(&HeaderMap::new(), both), [false, false]);
        // A weight of 0 refuses a type; the most specific range decides.
        for (accept, want) in [
            ("application/json, text/event-stream;q=0", [true, false]),
            (
                "application/json, text/event-stream; Q=0.000",
                [true, false],
            ),
            ("*/*, text/event-stream;q=0", [true, false]),
            ("text/*;q=0, text/event-stream", [false, true]),
            ("*/*;q=0", [false, false]),
            ("application/json;q=0.001, text/event-stream", [true, true]),
        ] {
            h.insert(header::ACCEPT, HeaderValue::from_static(accept));
            assert_eq!(accepted(&h, both), want, "{accept}");
        }
    }

    #[test]
    fn only_loopback_origins_pass_without_configuration() {
        for ok in [
            "http://localhost",
            "http://localhost:6274",
            "https://127.0.0.1:7403",
            "http://[::1]:80",
            "http://[::1]",
        ] {
            assert!(is_loopback_origin(ok), "{ok}");
        }
        for bad in [
            "null",
            "http://evil.example",
            "http://localhost.evil.example",
            "http://127.0.0.1.evil.example",
            "http://[::1].evil",
            "localhost",
            "http://localhost:80@evil.example",
            "http://localhost:@evil.example",
            "http://127.0.0.1:7403/path",
            "http://[::1]:80@evil.example",
            "ftp://localhost",
            "http://localhost:99999",
            "http://localhost:",
        ] {
            assert!(!is_loopback_origin(bad), "{bad}");
        }
    }

    #[test]
    fn negotiation_keeps_a_known_version_and_else_offers_the_latest() {
        assert_eq!(negotiate(Some("2025-03-26")), "2025-03-26");
        assert_eq!(negotiate(Some("2026-07-28")), LATEST);
        assert_eq!(negotiate(None), LATEST);
    }

    #[test]
    fn frames_are_split_at_their_size_prefixes() {
        let buf = [2u8, 0, 0, 0, 9, 9, 1, 0, 0, 0, 7, 3, 0];
        let got: Vec<_> = frames(&buf).collect();
        assert_eq!(got, [&[2u8, 0, 0, 0, 9, 9][..], &[1, 0, 0, 0, 7]]);
    }
}
