//! The `http://` driver: MCP Streamable HTTP, against any MCP server
//! (`https://`: the same over TLS, through `tls::Conn`).
//!
//! A hand-written HTTP/1.1 client on the monoio runtime the frame target
//! uses (why not hyper: `docs/loadgen.md`, "HTTP target"). Per connection:
//!
//! ```text
//! connect ─▶ POST initialize ─▶ POST notifications/initialized ─▶ start line
//!   ─▶ POST request, read its answer ─▶ POST … ─▶ DELETE the session
//! ```
//!
//! By default one request at a time per connection (HTTP/1.1 without
//! pipelining), so a connection's window is 1 and `--connections` is the
//! concurrency; `--pipeline N` lets N requests be in flight per connection,
//! answered in order as HTTP/1.1 requires. Requests that may go out
//! together are one `write_all` (heads and bodies in one buffer); an answer
//! is parsed where it lands in the read buffer: `httparse` for the head,
//! a chunked decoder, an SSE line parser, and serde_json into borrowed
//! shapes that skip everything the check does not need.
//!
//! # Invariants
//! - A request is registered as outstanding before its bytes are written,
//!   and ends exactly once: by its answer (at the time the read that
//!   completed it returned), by a broken or closed response, by its
//!   timeout or by the run stopping.
//! - Responses are read strictly in request order, each to its end before
//!   the next, and a connection is dropped at the first answer it cannot
//!   be trusted to frame: a byte of one response is never taken for the
//!   head of another. The requests still in flight on a dropped connection
//!   end as `connection_closed`.
//! - A read is cancelled only when its connection is dropped right after
//!   (cancelling loses the buffer, and whatever the kernel put in it).
//! - Losing a TCP connection does not end the session: the generator
//!   reconnects and goes on with the same `Mcp-Session-Id`. Only a failed
//!   reconnect stops the run (the server is gone).

use std::borrow::Cow;
use std::cell::Cell;
use std::collections::VecDeque;
use std::future::Future;
use std::io::{self, Write as _};
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::{Buf, BytesMut};
use mcp_schema::client::Listing;
use mcp_schema::fb::protocol::ResponsePayload;
use monoio::buf::IoBufMut;
use serde::Deserialize;
use serde::de::IgnoredAny;

use crate::engine::{CONNECT_TIMEOUT, ConnCtx, Driver, Pacer, Step, ThreadCtx};
use crate::notify::{Either, race};
use crate::rt::{Monoio, Runtime};
use crate::stats::ErrorKind;
use crate::tls::{Conn, Connector};
use crate::workload::Next;

/// The protocol revision offered in `initialize`; the server's answer
/// decides the `MCP-Protocol-Version` of every later request.
pub const PROTOCOL_VERSION: &str = "2025-11-25";
/// The stateless revision (`--mcp-version 2026-07-28`): no `initialize`, no
/// session; every POST names its method (and tool, prompt or resource) in
/// headers and carries its version and capabilities in `params._meta`.
pub const MODERN_VERSION: &str = "2026-07-28";
/// What `--mcp-version` takes.
pub const SUPPORTED_VERSIONS: [&str; 2] = [PROTOCOL_VERSION, MODERN_VERSION];
/// `params._meta` of every 2026-07-28 request (no client capabilities: the
/// load is tool calls that need none).
const MODERN_META: &str = r#""_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}"#;

/// Read buffer growth step.
const READ_CHUNK: usize = 64 * 1024;
/// Largest response head accepted.
const MAX_HEAD: usize = 64 * 1024;
/// Most headers in a response head.
const MAX_HEADERS: usize = 64;
/// Longest chunk-size or trailer line.
const MAX_LINE: usize = 4096;
/// How long the closing `DELETE` of a session may take: the run's end must
/// not wait on a server that does not answer it.
const DELETE_TIMEOUT: Duration = Duration::from_secs(1);

#[derive(Clone, Debug)]
pub struct HttpDriver {
    /// `HOST:PORT`, the `Host` header.
    pub authority: String,
    /// The MCP endpoint, e.g. `/mcp`.
    pub path: String,
    /// Largest response body (or SSE event) accepted (`--max-frame`).
    pub max_body: usize,
    /// A response body still open this long after its answer is dropped
    /// with its connection (`--timeout`).
    pub timeout: Duration,
    /// Header lines sent on every request (`Authorization: Bearer …\r\n`
    /// from `--bearer-file`), else empty.
    pub extra_headers: String,
    /// `--mcp-version 2026-07-28`: stateless requests routed by header.
    pub modern: bool,
    /// TCP, and TLS for `https://` (the handshake is part of connecting).
    pub connector: Connector,
}

/// Why reading a response stopped before its end.
enum ReadErr {
    /// The server closed the connection (or reset it).
    Closed(String),
    /// Not HTTP, or not a body we can follow.
    Bad(String),
    /// The caller's stop future won: the request ended without its answer.
    Abandoned,
}

impl std::fmt::Display for ReadErr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadErr::Closed(e) => write!(f, "connection lost: {e}"),
            ReadErr::Bad(e) => f.write_str(e),
            ReadErr::Abandoned => f.write_str("abandoned"),
        }
    }
}

/// What a response body carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Wire {
    /// `application/json`: one JSON-RPC message.
    Json,
    /// `text/event-stream`: JSON-RPC messages as SSE events.
    Sse,
    /// Anything else (or no content type).
    Other,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Chunk {
    Size,
    Data(u64),
    DataEnd,
    Trailer,
}

/// How the body ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Framing {
    /// `Content-Length` (this many bytes still to come).
    Length(u64),
    Chunked(Chunk),
    /// Neither: the body ends when the server closes the connection.
    UntilClose,
}

#[derive(Debug)]
struct Head {
    status: u16,
    wire: Wire,
    framing: Framing,
    /// The server will close the connection after this response.
    close: bool,
    /// `Mcp-Session-Id`, when asked for.
    session: Option<String>,
}

/// One MCP session over one (replaceable) TCP connection.
pub struct HttpConn {
    addr: SocketAddr,
    connector: Connector,
    /// The connection (TLS or not), when open.
    stream: Option<Conn>,
    rbuf: BytesMut,
    /// When the last read returned: the arrival time of what it read.
    read_at: Instant,
    /// Decoded body bytes not yet parsed (a JSON body, or SSE lines).
    body: Vec<u8>,
    /// The data of the SSE event being read.
    data: Vec<u8>,
    has_data: bool,
    /// The request head up to `Content-Length: ` (session and protocol
    /// version included), built once after the handshake.
    head: Vec<u8>,
    wbuf: Vec<u8>,
    jbuf: Vec<u8>,
    session: Option<String>,
    version: String,
    /// The server answered 404 to a request of this session: it expired
    /// (or was evicted), and a new one must be initialised before the
    /// next request (the Streamable HTTP rules).
    expired: bool,
}

fn find(hay: &[u8], b: u8) -> Option<usize> {
    hay.iter().position(|&x| x == b)
}

fn trim_cr(line: &[u8]) -> &[u8] {
    line.strip_suffix(b"\r").unwrap_or(line)
}

impl Framing {
    /// Moves decoded body bytes from `buf` to `out`; true when the body is
    /// complete.
    fn decode(
        &mut self,
        buf: &mut BytesMut,
        out: &mut Vec<u8>,
        max: usize,
    ) -> Result<bool, String> {
        let too_big = || format!("response body larger than --max-frame ({max} bytes)");
        loop {
            match self {
                Framing::Length(0) => return Ok(true),
                Framing::Length(n) | Framing::Chunked(Chunk::Data(n)) => {
                    let k = (*n).min(buf.len() as u64) as usize;
                    if k == 0 {
                        return Ok(false);
                    }
                    if out.len() + k > max {
                        return Err(too_big());
                    }
                    out.extend_from_slice(&buf[..k]);
                    buf.advance(k);
                    *n -= k as u64;
                    if *n == 0
                        && let Framing::Chunked(c) = self
                    {
                        *c = Chunk::DataEnd;
                    }
                }
                Framing::UntilClose => {
                    if out.len() + buf.len() > max {
                        return Err(too_big());
                    }
                    out.extend_from_slice(buf);
                    buf.clear();
                    return Ok(false);
                }
                Framing::Chunked(Chunk::DataEnd) => {
                    if buf.len() < 2 {
                        return Ok(false);
                    }
                    if &buf[..2] != b"\r\n" {
                        return Err("bad chunked body: no CRLF after a chunk".into());
                    }
                    buf.advance(2);
                    *self = Framing::Chunked(Chunk::Size);
                }
                Framing::Chunked(c @ (Chunk::Size | Chunk::Trailer)) => {
                    let Some(nl) = find(&buf[..buf.len().min(MAX_LINE)], b'\n') else {
                        if buf.len() >= MAX_LINE {
                            return Err("bad chunked body: line too long".into());
                        }
                        return Ok(false);
                    };
                    let line = trim_cr(&buf[..nl]);
                    if *c == Chunk::Trailer {
                        let end = line.is_empty();
                        buf.advance(nl + 1);
                        if end {
                            *self = Framing::Length(0);
                        }
                        continue;
                    }
                    let hex = line.split(|&b| b == b';').next().unwrap_or_default();
                    let size = std::str::from_utf8(hex)
                        .ok()
                        .map(str::trim)
                        .filter(|h| !h.is_empty() && h.len() <= 15)
                        .and_then(|h| u64::from_str_radix(h, 16).ok())
                        .ok_or_else(|| {
                            format!(
                                "bad chunked body: chunk size `{}`",
                                String::from_utf8_lossy(&line[..line.len().min(40)])
                            )
                        })?;
                    buf.advance(nl + 1);
                    *c = if size == 0 {
                        Chunk::Trailer
                    } else {
                        Chunk::Data(size)
                    };
                }
            }
        }
    }
}

impl HttpConn {
    fn new(addr: SocketAddr, connector: Connector, stream: Conn) -> Self {
        Self {
            addr,
            connector,
            stream: Some(stream),
            rbuf: BytesMut::with_capacity(READ_CHUNK),
            read_at: Instant::now(),
            body: Vec::new(),
            data: Vec::new(),
            has_data: false,
            head: Vec::new(),
            wbuf: Vec::with_capacity(4096),
            jbuf: Vec::with_capacity(1024),
            session: None,
            version: PROTOCOL_VERSION.to_owned(),
            expired: false,
        }
    }

    /// Drops the TCP connection (the session lives on).
    fn drop_stream(&mut self) {
        self.stream = None;
        self.rbuf = BytesMut::new();
        self.body.clear();
        self.data.clear();
        self.has_data = false;
    }

    /// A fresh TCP connection for the same session, unless one is open.
    async fn ensure_stream(&mut self) -> io::Result<()> {
        if self.stream.is_some() {
            return Ok(());
        }
        let deadline = Monoio::sleep_until(Instant::now() + CONNECT_TIMEOUT);
        match race(self.connector.connect(self.addr), deadline).await {
            Either::Left(s) => {
                self.stream = Some(s?);
                self.rbuf = BytesMut::with_capacity(READ_CHUNK);
                Ok(())
            }
            Either::Right(()) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("no answer within {CONNECT_TIMEOUT:?}"),
            )),
        }
    }

    /// Writes `self.wbuf`.
    async fn send(&mut self) -> io::Result<()> {
        let Some(s) = self.stream.as_mut() else {
            return Err(io::ErrorKind::NotConnected.into());
        };
        let (res, b) = s.w.write_all(std::mem::take(&mut self.wbuf)).await;
        self.wbuf = b;
        self.wbuf.clear();
        res.map(drop)
    }

    /// One read into `rbuf`, unless `stop` completes first.
    async fn fill(&mut self, stop: impl Future<Output = ()>) -> Result<(), ReadErr> {
        let Some(s) = self.stream.as_mut() else {
            return Err(ReadErr::Closed("not connected".into()));
        };
        if self.rbuf.capacity() - self.rbuf.len() < READ_CHUNK / 4 {
            self.rbuf.reserve(READ_CHUNK);
        }
        // monoio reads into the start of an `IoBufMut`: read into the
        // spare capacity, so bytes already buffered are kept.
        let buf = std::mem::take(&mut self.rbuf);
        let len = buf.len();
        match race(s.r.read(buf.slice_mut(len..)), stop).await {
            Either::Left((res, b)) => {
                self.rbuf = b.into_inner();
                self.read_at = Instant::now();
                match res {
                    Ok(0) => Err(ReadErr::Closed("closed by the server".into())),
                    Ok(_) => Ok(()),
                    Err(e) => Err(ReadErr::Closed(e.to_string())),
                }
            }
            // The buffer went with the cancelled read; the caller drops
            // the connection.
            Either::Right(()) => Err(ReadErr::Abandoned),
        }
    }

    /// Parses a response head out of `rbuf`, if it is all there.
    fn parse_head(&mut self, want_session: bool) -> Result<Option<Head>, String> {
        loop {
            let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
            let mut r = httparse::Response::new(&mut headers);
            let n = match r.parse(&self.rbuf) {
                Ok(httparse::Status::Complete(n)) => n,
                Ok(httparse::Status::Partial) if self.rbuf.len() > MAX_HEAD => {
                    return Err(format!("response head longer than {MAX_HEAD} bytes"));
                }
                Ok(httparse::Status::Partial) => return Ok(None),
                Err(e) => {
                    let shown = &self.rbuf[..self.rbuf.len().min(40)];
                    return Err(format!(
                        "not an HTTP response ({e}): {:?}",
                        String::from_utf8_lossy(shown)
                    ));
                }
            };
            let status = r.code.unwrap_or(0);
            if (100..200).contains(&status) && status != 101 {
                // An interim response (100 Continue, 103): the real one
                // follows.
                self.rbuf.advance(n);
                continue;
            }
            let mut head = Head {
                status,
                wire: Wire::Other,
                framing: Framing::UntilClose,
                close: r.version == Some(0),
                session: None,
            };
            let mut length = None;
            let mut chunked = false;
            for h in r.headers.iter() {
                let v = h.value;
                if h.name.eq_ignore_ascii_case("content-type") {
                    let v = v.trim_ascii_start();
                    head.wire = if starts_with_ci(v, b"application/json") {
                        Wire::Json
                    } else if starts_with_ci(v, b"text/event-stream") {
                        Wire::Sse
                    } else {
                        Wire::Other
                    };
                } else if h.name.eq_ignore_ascii_case("content-length") {
                    let n = std::str::from_utf8(v)
                        .ok()
                        .and_then(|s| s.trim().parse::<u64>().ok())
                        .ok_or("bad Content-Length")?;
                    length = Some(n);
                } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
                    chunked = contains_token(v, b"chunked");
                } else if h.name.eq_ignore_ascii_case("connection") {
                    if contains_token(v, b"close") {
                        head.close = true;
                    } else if contains_token(v, b"keep-alive") {
                        head.close = false;
                    }
                } else if want_session && h.name.eq_ignore_ascii_case("mcp-session-id") {
                    // Sent back verbatim in a header: visible ASCII only.
                    if v.is_empty() || !v.iter().all(|b| (0x21..=0x7e).contains(b)) {
                        return Err("Mcp-Session-Id is not visible ASCII".into());
                    }
                    head.session = Some(String::from_utf8_lossy(v).into_owned());
                }
            }
            head.framing = if matches!(status, 204 | 304) {
                Framing::Length(0)
            } else if chunked {
                Framing::Chunked(Chunk::Size)
            } else if let Some(n) = length {
                Framing::Length(n)
            } else {
                head.close = true;
                Framing::UntilClose
            };
            self.rbuf.advance(n);
            return Ok(Some(head));
        }
    }

    async fn read_head<S: Future<Output = ()>>(
        &mut self,
        want_session: bool,
        stop: &mut impl FnMut() -> S,
    ) -> Result<Head, ReadErr> {
        loop {
            if let Some(h) = self.parse_head(want_session).map_err(ReadErr::Bad)? {
                return Ok(h);
            }
            self.fill(stop()).await?;
        }
    }

    /// Reads the body to its end. Each JSON-RPC message in it (the JSON
    /// body, or each SSE event's data) goes to `on_msg` with the time the
    /// read that completed it returned.
    async fn read_body<S: Future<Output = ()>>(
        &mut self,
        head: &mut Head,
        max: usize,
        stop: &mut impl FnMut() -> S,
        on_msg: &mut impl FnMut(&[u8], Instant),
    ) -> Result<(), ReadErr> {
        self.body.clear();
        self.data.clear();
        self.has_data = false;
        loop {
            let done = head
                .framing
                .decode(&mut self.rbuf, &mut self.body, max)
                .map_err(ReadErr::Bad)?;
            if head.wire == Wire::Sse {
                self.sse_events(max, on_msg).map_err(ReadErr::Bad)?;
            }
            if done {
                break;
            }
            match self.fill(stop()).await {
                Ok(()) => {}
                Err(ReadErr::Closed(_)) if head.framing == Framing::UntilClose => {
                    // The close is the end of this body.
                    head.close = true;
                    if head.wire == Wire::Sse {
                        self.sse_events(max, on_msg).map_err(ReadErr::Bad)?;
                    }
                    break;
                }
                Err(e) => return Err(e),
            }
        }
        if head.wire == Wire::Json && !self.body.is_empty() {
            on_msg(&self.body, self.read_at);
        }
        self.body.clear();
        Ok(())
    }

    /// Dispatches every complete SSE event in `body` and drops the lines
    /// it used.
    fn sse_events(
        &mut self,
        max: usize,
        on_msg: &mut impl FnMut(&[u8], Instant),
    ) -> Result<(), String> {
        let mut start = 0;
        while let Some(nl) = find(&self.body[start..], b'\n') {
            let line = trim_cr(&self.body[start..start + nl]);
            start += nl + 1;
            if line.is_empty() {
                if self.has_data {
                    // The data lines, joined by `\n` (the last one's
                    // newline removed). An empty one is not dispatched
                    // (the SSE rules): a 2025-11-25 priming event is just
                    // an id and an empty `data:`.
                    self.data.pop();
                    if !self.data.is_empty() {
                        on_msg(&self.data, self.read_at);
                    }
                }
                self.data.clear();
                self.has_data = false;
                continue;
            }
            if line[0] == b':' {
                continue; // a comment (keep-alive)
            }
            let (field, value) = match find(line, b':') {
                Some(c) => {
                    let v = &line[c + 1..];
                    (&line[..c], v.strip_prefix(b" ").unwrap_or(v))
                }
                None => (line, &b""[..]),
            };
            // `event`, `id` and `retry` do not matter to the check.
            if field == b"data" {
                if self.data.len() + value.len() + 1 > max {
                    return Err(format!("SSE event larger than --max-frame ({max} bytes)"));
                }
                self.data.extend_from_slice(value);
                self.data.push(b'\n');
                self.has_data = true;
            }
        }
        self.body.drain(..start);
        if self.body.len() > max {
            return Err(format!("SSE line longer than --max-frame ({max} bytes)"));
        }
        Ok(())
    }

    /// Appends a POST with `body` (JSON) to `wbuf`, headers from `head`
    /// (empty: the handshake's own headers).
    fn put_post(&mut self, d: &HttpDriver, body: &[u8], with_session: bool) {
        if with_session {
            self.wbuf.extend_from_slice(&self.head);
        } else {
            let _ = write!(
                self.wbuf,
                "POST {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: mcp-loadgen\r\n\
                 Accept: application/json, text/event-stream\r\n\
                 Content-Type: application/json\r\n{}Content-Length: ",
                d.path, d.authority, d.extra_headers
            );
        }
        let _ = write!(self.wbuf, "{}\r\n\r\n", body.len());
        self.wbuf.extend_from_slice(body);
    }

    /// Appends a 2026-07-28 POST of `body`: the shared head, then the
    /// request's own `Mcp-Method` and `Mcp-Name`.
    fn put_post_modern(&mut self, body: &[u8], next: &Next<'_>) {
        let (method, name) = method_and_name(next);
        self.put_post_method(body, method, name);
    }

    /// [`Self::put_post_modern`] for `method`, and the name it routes by.
    fn put_post_method(&mut self, body: &[u8], method: &str, name: Option<&str>) {
        self.wbuf.extend_from_slice(&self.head);
        let _ = write!(self.wbuf, "Mcp-Method: {method}\r\n");
        if let Some(n) = name {
            let _ = write!(self.wbuf, "Mcp-Name: {}\r\n", header_value(n));
        }
        let _ = write!(self.wbuf, "Content-Length: {}\r\n\r\n", body.len());
        self.wbuf.extend_from_slice(body);
    }

    fn session_headers(&self) -> String {
        let mut h = String::new();
        if let Some(s) = &self.session {
            h.push_str("Mcp-Session-Id: ");
            h.push_str(s);
            h.push_str("\r\n");
        }
        h.push_str("MCP-Protocol-Version: ");
        h.push_str(&self.version);
        h.push_str("\r\n");
        h
    }
}

fn starts_with_ci(v: &[u8], prefix: &[u8]) -> bool {
    v.len() >= prefix.len() && v[..prefix.len()].eq_ignore_ascii_case(prefix)
}

fn contains_token(v: &[u8], token: &[u8]) -> bool {
    v.split(|&b| b == b',')
        .any(|t| t.trim_ascii().eq_ignore_ascii_case(token))
}

/// A JSON-RPC message, as much of it as the check needs; the rest is
/// skipped without being built.
#[derive(Deserialize)]
struct Msg<'a> {
    #[serde(borrow)]
    jsonrpc: Option<Cow<'a, str>>,
    id: Option<Id>,
    method: Option<IgnoredAny>,
    result: Option<Shape>,
    #[serde(borrow)]
    error: Option<RpcError<'a>>,
}

#[derive(Deserialize)]
struct RpcError<'a> {
    code: i64,
    #[serde(borrow)]
    data: Option<ErrorData<'a>>,
}

/// The broker's `data` on its own errors: `kind` names the error
/// (`mcp_schema::ErrorCode::as_str`).
#[derive(Deserialize)]
struct ErrorData<'a> {
    #[serde(borrow)]
    kind: Option<Cow<'a, str>>,
}

/// MCP's "resource not found" shares -32002 with the broker's router
/// fault, which says `data.kind: "router_fault"`: without it, -32002 is
/// counted as the frame protocol's not-found code, so that the report
/// names it `not_found`, as it does over frames. 2026-07-28 forbids
/// -32002, so the broker sends its router fault there as -32603 with the
/// same `data.kind`, which names it.
fn code_meant(e: &RpcError<'_>) -> i32 {
    use mcp_schema::ErrorCode;
    let code = e.code.clamp(i32::MIN.into(), i32::MAX.into()) as i32;
    let kind = e.data.as_ref().and_then(|d| d.kind.as_deref());
    let fault = ErrorCode::RouterFault;
    match (code, kind) {
        (c, Some(k))
            if k == fault.as_str() && (c == fault.code() || c == ErrorCode::Internal.code()) =>
        {
            fault.code()
        }
        (c, _) if c == fault.code() => ErrorCode::NotFound.code(),
        (c, _) => c,
    }
}

/// The members of a result that tell its kind.
#[derive(Deserialize)]
struct Shape {
    #[serde(rename = "isError")]
    is_error: Option<bool>,
    content: Option<IgnoredAny>,
    contents: Option<IgnoredAny>,
    messages: Option<IgnoredAny>,
    tools: Option<IgnoredAny>,
    resources: Option<IgnoredAny>,
    #[serde(rename = "resourceTemplates")]
    resource_templates: Option<IgnoredAny>,
    prompts: Option<IgnoredAny>,
}

/// A JSON-RPC id: ours are non-negative integers.
enum Id {
    Num(u64),
    Other,
}

impl<'de> Deserialize<'de> for Id {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Id;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON-RPC id")
            }
            fn visit_u64<E>(self, n: u64) -> Result<Id, E> {
                Ok(Id::Num(n))
            }
            fn visit_i64<E>(self, n: i64) -> Result<Id, E> {
                Ok(u64::try_from(n).map_or(Id::Other, Id::Num))
            }
            fn visit_f64<E>(self, _: f64) -> Result<Id, E> {
                Ok(Id::Other)
            }
            fn visit_str<E>(self, _: &str) -> Result<Id, E> {
                Ok(Id::Other)
            }
        }
        d.deserialize_any(V)
    }
}

type Outcome = Result<(), (ErrorKind, Option<i32>)>;

/// What one JSON-RPC message of a response is, for request `id`.
enum Class {
    /// The final answer to the request, checked.
    Answer(Outcome),
    /// A notification or a server request (progress, logs, elicitation):
    /// counted, never answered.
    Notification,
    /// A response to some other id.
    OtherId,
    /// Not a JSON-RPC 2.0 message.
    Garbage,
}

fn classify(data: &[u8], id: u64, expect: ResponsePayload) -> Class {
    let Ok(m) = serde_json::from_slice::<Msg<'_>>(data) else {
        return Class::Garbage;
    };
    if m.jsonrpc.as_deref() != Some("2.0") {
        return Class::Garbage;
    }
    if m.method.is_some() {
        return Class::Notification;
    }
    match m.id {
        Some(Id::Num(n)) if n == id => {}
        // A JSON-RPC error with a null id: the server could not read the
        // request's id, so it answers the request it was sent.
        None if m.error.is_some() && m.result.is_none() => {}
        _ => return Class::OtherId,
    }
    Class::Answer(match (m.result, m.error) {
        (None, Some(e)) => Err((ErrorKind::ErrorResponse, Some(code_meant(&e)))),
        (Some(r), None) => check(&r, expect),
        _ => Err((ErrorKind::InvalidResponse, None)),
    })
}

/// Whether `r` is the result `expect` calls for.
fn check(r: &Shape, expect: ResponsePayload) -> Outcome {
    let right = match expect {
        ResponsePayload::ToolResult => r.content.is_some(),
        ResponsePayload::ResourceData => r.contents.is_some(),
        ResponsePayload::AppliedPrompt => r.messages.is_some(),
        ResponsePayload::ListToolsResult => r.tools.is_some(),
        ResponsePayload::ListResourcesResult => r.resources.is_some(),
        ResponsePayload::ListResourceTemplatesResult => r.resource_templates.is_some(),
        ResponsePayload::ListPromptsResult => r.prompts.is_some(),
        // `ping` answers an empty object.
        _ => true,
    };
    if !right {
        Err((ErrorKind::KindMismatch, None))
    } else if expect == ResponsePayload::ToolResult && r.is_error == Some(true) {
        Err((ErrorKind::ToolError, None))
    } else {
        Ok(())
    }
}

/// The JSON-RPC method of `next`, and what `Mcp-Name` carries for it.
fn method_and_name<'a>(next: &Next<'a>) -> (&'static str, Option<&'a str>) {
    match next {
        Next::Tool { name, .. } => ("tools/call", Some(name)),
        Next::Prompt { name, .. } => ("prompts/get", Some(name)),
        Next::Resource { uri } => ("resources/read", Some(uri)),
        Next::List(Listing::Tools) => ("tools/list", None),
        Next::List(Listing::Resources) => ("resources/list", None),
        Next::List(Listing::ResourceTemplates) => ("resources/templates/list", None),
        Next::List(Listing::Prompts) => ("prompts/list", None),
        Next::Ping => ("ping", None),
    }
}

/// A 2026-07-28 header value: as it is when it is visible ASCII (inner
/// spaces allowed), else the spec's `=?base64?…?=` sentinel.
fn header_value(v: &str) -> std::borrow::Cow<'_, str> {
    let plain = !v.is_empty()
        && !v.starts_with(' ')
        && !v.ends_with(' ')
        && !v.starts_with("=?base64?")
        && v.bytes().all(|b| (0x20..=0x7e).contains(&b));
    if plain {
        std::borrow::Cow::Borrowed(v)
    } else {
        use base64::Engine as _;
        std::borrow::Cow::Owned(format!(
            "=?base64?{}?=",
            base64::engine::general_purpose::STANDARD.encode(v)
        ))
    }
}

/// Writes the JSON-RPC request `id` for `next` into `out`; `modern`: with
/// the 2026-07-28 `params._meta`.
fn put_request_for(out: &mut Vec<u8>, id: u64, next: &Next<'_>, modern: bool) {
    if !modern {
        return put_request(out, id, next);
    }
    put_request(out, id, next);
    // Every form ends with `}` closing the message, after `"params":{…}`
    // (one more `}`) or right after the method name.
    if out.ends_with(b"}}") && !matches!(next, Next::List(_) | Next::Ping) {
        out.truncate(out.len() - 2);
        out.push(b',');
        out.extend_from_slice(MODERN_META.as_bytes());
        out.extend_from_slice(b"}}");
    } else {
        out.truncate(out.len() - 1);
        out.extend_from_slice(b",\"params\":{");
        out.extend_from_slice(MODERN_META.as_bytes());
        out.extend_from_slice(b"}}");
    }
}

/// Writes the JSON-RPC request `id` for `next` into `out`.
fn put_request(out: &mut Vec<u8>, id: u64, next: &Next<'_>) {
    let _ = write!(out, r#"{{"jsonrpc":"2.0","id":{id},"method":"#);
    // Strings always serialise.
    let string = |out: &mut Vec<u8>, s: &str| {
        let _ = serde_json::to_writer(&mut *out, s);
    };
    match next {
        Next::Tool { name, args } | Next::Prompt { name, args } => {
            out.extend_from_slice(if matches!(next, Next::Tool { .. }) {
                br#""tools/call","params":{"name":"#
            } else {
                br#""prompts/get","params":{"name":"#
            });
            string(out, name);
            out.extend_from_slice(br#","arguments":"#);
            out.extend_from_slice(args);
            out.extend_from_slice(b"}}");
        }
        Next::Resource { uri } => {
            out.extend_from_slice(br#""resources/read","params":{"uri":"#);
            string(out, uri);
            out.extend_from_slice(b"}}");
        }
        Next::List(l) => {
            out.extend_from_slice(match l {
                Listing::Tools => br#""tools/list"}"#.as_slice(),
                Listing::Resources => br#""resources/list"}"#,
                Listing::ResourceTemplates => br#""resources/templates/list"}"#,
                Listing::Prompts => br#""prompts/list"}"#,
            });
        }
        Next::Ping => out.extend_from_slice(br#""ping"}"#),
    }
}

/// Completes when request `seq` no longer waits for its answer (its
/// timeout, or the run stopping): its connection is then dropped, as an
/// HTTP/1.1 connection cannot carry another request before the answer.
async fn abandoned(cc: &ConnCtx, seq: u64) {
    loop {
        if cc.reader_stop.is_raised() || !cc.outstanding.borrow().contains_key(&seq) {
            return;
        }
        race(cc.writer_wake.notified(), cc.reader_stop.wait()).await;
    }
}

/// The stop condition while reading a request's response: before its
/// answer, the request ending; after it, the run stopping or the rest of
/// the body taking longer than `timeout`. Timed on the alarm clock: the
/// runtime's timer does not fire while the clock spins (`engine.rs`).
async fn request_stop(
    ctx: &ThreadCtx,
    cc: &ConnCtx,
    seq: u64,
    answered: Option<Instant>,
    timeout: Duration,
) {
    match answered {
        None => abandoned(cc, seq).await,
        Some(t) => {
            let never = crate::notify::Notify::default();
            let body_late = ctx.clock.wait_until_coarse::<Monoio>(t + timeout, &never);
            race(cc.reader_stop.wait(), body_late).await;
        }
    }
}

fn end(ctx: &ThreadCtx, cc: &ConnCtx, seq: u64, outcome: Outcome, at: Instant) {
    let was_full = cc.window_full();
    let p = cc.outstanding.borrow_mut().remove(&seq);
    match p {
        Some(p) => {
            cc.ended(was_full, at);
            ctx.on_end(&p, at, outcome);
        }
        None => ctx.on_unmatched(cc, seq, at),
    }
}

impl HttpDriver {
    /// `initialize` and `notifications/initialized` on a fresh connection.
    async fn handshake(&self, c: &mut HttpConn) -> Result<(), String> {
        c.head.clear();
        c.session = None;
        c.version = PROTOCOL_VERSION.to_owned();
        c.expired = false;
        if self.modern {
            // Every request stands alone. The head stops before the
            // per-request headers (`put_post_modern`).
            c.version = MODERN_VERSION.to_owned();
            let _ = write!(
                c.head,
                "POST {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: mcp-loadgen\r\n\
                 Accept: application/json, text/event-stream\r\n\
                 Content-Type: application/json\r\n{}MCP-Protocol-Version: {MODERN_VERSION}\r\n",
                self.path, self.authority, self.extra_headers
            );
            return self.discover(c).await;
        }
        let mut body = Vec::new();
        let _ = write!(
            body,
            r#"{{"jsonrpc":"2.0","id":0,"method":"initialize","params":{{"protocolVersion":"{PROTOCOL_VERSION}","capabilities":{{}},"clientInfo":{{"name":"mcp-loadgen","version":"{}"}}}}}}"#,
            env!("CARGO_PKG_VERSION")
        );
        c.put_post(self, &body, false);
        let (mut head, answer) = self.exchange(c, "initialize").await?;
        if !(200..300).contains(&head.status) {
            return Err(format!("initialize answered HTTP {}", head.status));
        }
        let answer = answer.ok_or_else(|| {
            format!(
                "initialize answered HTTP {} without a JSON-RPC response with id 0 ({:?} body)",
                head.status, head.wire
            )
        })?;
        if let Some(e) = answer.get("error") {
            return Err(format!("initialize failed: {e}"));
        }
        let version = answer
            .pointer("/result/protocolVersion")
            .and_then(serde_json::Value::as_str)
            .ok_or("the initialize result has no protocolVersion")?;
        if version.is_empty() || !version.bytes().all(|b| (0x21..=0x7e).contains(&b)) {
            return Err(format!("bad protocolVersion {version:?}"));
        }
        c.version = version.to_owned();
        c.session = head.session.take();
        if head.close {
            c.drop_stream();
        }
        let _ = write!(
            c.head,
            "POST {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: mcp-loadgen\r\n\
             Accept: application/json, text/event-stream\r\n\
             Content-Type: application/json\r\n{}{}Content-Length: ",
            self.path,
            self.authority,
            self.extra_headers,
            c.session_headers()
        );
        c.ensure_stream()
            .await
            .map_err(|e| format!("reconnecting: {e}"))?;
        c.put_post(
            self,
            br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
            true,
        );
        c.send()
            .await
            .map_err(|e| format!("sending notifications/initialized: {e}"))?;
        let mut never = std::future::pending::<()>;
        let mut head = c
            .read_head(false, &mut never)
            .await
            .map_err(|e| format!("reading the notifications/initialized answer: {e}"))?;
        c.read_body(&mut head, self.max_body, &mut never, &mut |_, _| {})
            .await
            .map_err(|e| format!("reading the notifications/initialized answer: {e}"))?;
        if !(200..300).contains(&head.status) {
            return Err(format!(
                "notifications/initialized answered HTTP {} (expected 202)",
                head.status
            ));
        }
        if head.close {
            c.drop_stream();
        }
        Ok(())
    }

    /// Sends what `c.wbuf` holds (a request with id 0 before the run) and
    /// reads its answer: the head, and the JSON-RPC response with id 0 if
    /// the body held one.
    async fn exchange(
        &self,
        c: &mut HttpConn,
        what: &str,
    ) -> Result<(Head, Option<serde_json::Value>), String> {
        c.send().await.map_err(|e| format!("sending {what}: {e}"))?;
        let mut never = std::future::pending::<()>;
        let mut head = c
            .read_head(!self.modern, &mut never)
            .await
            .map_err(|e| format!("reading the {what} answer: {e}"))?;
        let answer = std::cell::RefCell::new(None::<serde_json::Value>);
        let mut on_msg = |m: &[u8], _: Instant| {
            if let Ok(v) = serde_json::from_slice::<serde_json::Value>(m)
                && v.get("id") == Some(&serde_json::Value::from(0))
                && answer.borrow().is_none()
            {
                *answer.borrow_mut() = Some(v);
            }
        };
        // A stream left open after the answer is given a moment to end,
        // then dropped with its connection (a session lives on).
        let mut after_answer = || {
            let answered = answer.borrow().is_some();
            async move {
                if answered {
                    Monoio::sleep_until(Instant::now() + DELETE_TIMEOUT).await;
                } else {
                    std::future::pending::<()>().await;
                }
            }
        };
        match c
            .read_body(&mut head, self.max_body, &mut after_answer, &mut on_msg)
            .await
        {
            Ok(()) => {}
            Err(ReadErr::Abandoned) => c.drop_stream(),
            Err(e) => return Err(format!("reading the {what} answer: {e}")),
        }
        Ok((head, answer.into_inner()))
    }

    /// 2026-07-28's `server/discover`, once per connection before the run,
    /// as `initialize` is for a session: a wrong path or a port that is no
    /// MCP endpoint fails the run before it starts, where every request
    /// answered `http_404` in a run that exited 0. A server that does not
    /// implement the method (-32601) is still an MCP endpoint.
    async fn discover(&self, c: &mut HttpConn) -> Result<(), String> {
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":0,"method":"server/discover","params":{{{MODERN_META}}}}}"#
        );
        c.put_post_method(body.as_bytes(), "server/discover", None);
        let (head, answer) = self.exchange(c, "server/discover").await?;
        if head.close {
            c.drop_stream();
        }
        let code = answer
            .as_ref()
            .and_then(|a| a.pointer("/error/code"))
            .and_then(serde_json::Value::as_i64);
        match answer {
            None => Err(format!(
                "server/discover answered HTTP {} without a JSON-RPC response with id 0 \
                 ({:?} body): is {} the server's MCP endpoint?",
                head.status, head.wire, self.path
            )),
            Some(_) if code == Some(-32601) => Ok(()),
            Some(a) if !(200..300).contains(&head.status) || a.get("error").is_some() => Err(
                format!("server/discover answered HTTP {}: {a}", head.status),
            ),
            Some(_) => Ok(()),
        }
    }

    /// Reads the response to request `seq` (the oldest in flight) to its
    /// end, ending the request on the way. False when the connection was
    /// dropped (the requests behind this one have no answer coming).
    async fn read_one(
        &self,
        ctx: &ThreadCtx,
        cc: &ConnCtx,
        c: &mut HttpConn,
        seq: u64,
        expect: ResponsePayload,
    ) -> bool {
        let answered = Cell::new(None::<Instant>);
        let mut stop = || request_stop(ctx, cc, seq, answered.get(), self.timeout);
        let result = async {
            let mut head = c.read_head(false, &mut stop).await?;
            let ok_status = (200..300).contains(&head.status);
            if head.status == 404 && c.session.is_some() {
                c.expired = true;
            }
            if !ok_status {
                answered.set(Some(c.read_at));
                end(
                    ctx,
                    cc,
                    seq,
                    Err((ErrorKind::HttpStatus, Some(i32::from(head.status)))),
                    c.read_at,
                );
            }
            let json = head.wire == Wire::Json;
            let mut on_msg = |m: &[u8], at: Instant| {
                if !ok_status {
                    return;
                }
                match classify(m, seq, expect) {
                    Class::Answer(outcome) if answered.get().is_none() => {
                        answered.set(Some(at));
                        end(ctx, cc, seq, outcome, at);
                    }
                    Class::Answer(_) => ctx.on_stray(ErrorKind::UnknownCorrelation, at),
                    Class::Notification => {
                        if answered.get().is_none() {
                            ctx.on_progress();
                        }
                    }
                    // A JSON body is the answer: a wrong one ends the
                    // request.
                    Class::OtherId | Class::Garbage if json && answered.get().is_none() => {
                        answered.set(Some(at));
                        end(ctx, cc, seq, Err((ErrorKind::InvalidResponse, None)), at);
                    }
                    Class::OtherId => ctx.on_stray(ErrorKind::UnknownCorrelation, at),
                    Class::Garbage => ctx.on_stray(ErrorKind::InvalidFrame, at),
                }
            };
            c.read_body(&mut head, self.max_body, &mut stop, &mut on_msg)
                .await?;
            Ok::<Head, ReadErr>(head)
        }
        .await;
        let unanswered = answered.get().is_none();
        // The connection carries the next request only after this body's
        // end, which an SSE stream may send well after the answer: a full
        // window reopened by this answer reopens then (the wait is the
        // server's, not the generator's).
        if result.is_ok() && answered.get().is_some() && cc.reopened.get() == answered.get() {
            cc.reopened.set(Some(c.read_at));
        }
        match result {
            Ok(head) => {
                if unanswered {
                    // 2xx without the answer: 202, an empty or non-JSON
                    // body, or an SSE stream that ended without it.
                    end(
                        ctx,
                        cc,
                        seq,
                        Err((ErrorKind::InvalidResponse, None)),
                        c.read_at,
                    );
                }
                if head.close {
                    c.drop_stream();
                }
            }
            Err(e) => {
                if unanswered {
                    let kind = match e {
                        ReadErr::Closed(_) => Some(ErrorKind::ConnectionClosed),
                        ReadErr::Bad(_) => Some(ErrorKind::InvalidResponse),
                        // Already ended by its timeout or the stop.
                        ReadErr::Abandoned => None,
                    };
                    if let Some(kind) = kind {
                        end(ctx, cc, seq, Err((kind, None)), Instant::now());
                    }
                }
                c.drop_stream();
            }
        }
        c.stream.is_some()
    }

    /// The connection is gone with requests still in flight on it: none
    /// of them will be answered.
    fn lose(
        &self,
        ctx: &ThreadCtx,
        cc: &ConnCtx,
        c: &mut HttpConn,
        in_flight: &mut VecDeque<(u64, ResponsePayload)>,
    ) {
        let now = Instant::now();
        for (seq, _) in in_flight.drain(..) {
            if cc.outstanding.borrow().contains_key(&seq) {
                end(ctx, cc, seq, Err((ErrorKind::ConnectionClosed, None)), now);
            }
        }
        c.drop_stream();
    }

    /// A new session in place of an expired one, within the connect
    /// timeout.
    async fn renew(&self, c: &mut HttpConn) -> Result<(), String> {
        let work = async {
            c.ensure_stream().await.map_err(|e| e.to_string())?;
            self.handshake(c).await
        };
        match race(work, Monoio::sleep_until(Instant::now() + CONNECT_TIMEOUT)).await {
            Either::Left(Ok(())) => Ok(()),
            Either::Left(Err(e)) => Err(format!(
                "the session on {} expired (404) and a new one could not be set up: {e}",
                self.path
            )),
            Either::Right(()) => {
                c.drop_stream();
                Err(format!(
                    "the session on {} expired (404) and a new one was not set up within {CONNECT_TIMEOUT:?}",
                    self.path
                ))
            }
        }
    }

    /// Ends the session, within [`DELETE_TIMEOUT`]; its answer does not
    /// matter (405 is a server that does not let clients end sessions).
    async fn delete(&self, c: &mut HttpConn) {
        let Some(session) = c.session.clone() else {
            return;
        };
        let deadline = Instant::now() + DELETE_TIMEOUT;
        let work = async {
            c.ensure_stream().await.ok()?;
            let _ = write!(
                c.wbuf,
                "DELETE {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: mcp-loadgen\r\n\
                 Mcp-Session-Id: {session}\r\nMCP-Protocol-Version: {}\r\n\
                 {}Content-Length: 0\r\n\r\n",
                self.path, self.authority, c.version, self.extra_headers
            );
            c.send().await.ok()?;
            let mut stop = || Monoio::sleep_until(deadline);
            let mut head = c.read_head(false, &mut stop).await.ok()?;
            c.read_body(&mut head, self.max_body, &mut stop, &mut |_, _| {})
                .await
                .ok()
        };
        let _ = race(work, Monoio::sleep_until(deadline)).await;
        c.drop_stream();
    }
}

impl Driver for HttpDriver {
    type Rt = Monoio;
    type Conn = HttpConn;

    async fn connect(&self, addr: SocketAddr) -> io::Result<HttpConn> {
        let s = self.connector.connect(addr).await?;
        let mut c = HttpConn::new(addr, self.connector.clone(), s);
        self.handshake(&mut c)
            .await
            .map_err(|e| io::Error::other(format!("MCP session setup on {}: {e}", self.path)))?;
        Ok(c)
    }

    async fn drive(&self, mut c: HttpConn, ctx: Rc<ThreadCtx>, cc: Rc<ConnCtx>) {
        let mut generator = Pacer::generator(&ctx, &cc);
        let mut pacer = Pacer::new(&ctx, &cc);
        // Requests written and not yet read, oldest first: HTTP/1.1
        // answers in request order. At most the window (`--pipeline`).
        let mut in_flight: VecDeque<(u64, ResponsePayload)> = VecDeque::new();
        loop {
            let now = Instant::now();
            match pacer.step(&ctx, &cc, now) {
                // Nothing more goes out on an expired session: read what
                // is in flight, then start a new one.
                Step::Send(_) if c.expired && !in_flight.is_empty() => {}
                Step::Send(room) => {
                    let ready = if !in_flight.is_empty() {
                        Ok(())
                    } else if c.expired {
                        self.renew(&mut c).await
                    } else {
                        c.ensure_stream()
                            .await
                            .map_err(|e| format!("cannot reconnect to {}: {e}", ctx.cfg.target))
                    };
                    if let Err(e) = ready {
                        pacer.finish(&ctx, &cc);
                        cc.sending_done.set(true);
                        ctx.conn_failed(&cc, e);
                        cc.finished.set(true);
                        return;
                    }
                    for _ in 0..room {
                        let Some(intended) = pacer.intended(&ctx, now) else {
                            break;
                        };
                        let seq = pacer.seq();
                        let (next, expect) = generator.next_json();
                        c.jbuf.clear();
                        put_request_for(&mut c.jbuf, seq, &next, self.modern);
                        let body = std::mem::take(&mut c.jbuf);
                        if self.modern {
                            c.put_post_modern(&body, &next);
                        } else {
                            c.put_post(self, &body, true);
                        }
                        c.jbuf = body;
                        pacer.sent(&ctx, &cc, intended, now, expect);
                        in_flight.push_back((seq, expect));
                    }
                    if !c.wbuf.is_empty() && c.send().await.is_err() {
                        self.lose(&ctx, &cc, &mut c, &mut in_flight);
                        continue;
                    }
                }
                Step::Stop if in_flight.is_empty() => break,
                Step::WaitUntil(t) if in_flight.is_empty() => {
                    ctx.clock.wait_until::<Monoio>(t, &cc.writer_wake).await;
                    continue;
                }
                Step::WindowFull if in_flight.is_empty() => {
                    cc.writer_wake.notified().await;
                    continue;
                }
                // Answers are due first: a send the schedule calls for
                // meanwhile goes out after the oldest answer, measured
                // from its intended time.
                Step::Stop | Step::WaitUntil(_) | Step::WindowFull => {}
            }
            // The oldest answer, then every one already buffered, so that
            // the next sends go out as one write.
            while let Some((seq, expect)) = in_flight.pop_front() {
                if !self.read_one(&ctx, &cc, &mut c, seq, expect).await {
                    self.lose(&ctx, &cc, &mut c, &mut in_flight);
                    break;
                }
                if c.rbuf.is_empty() {
                    break;
                }
            }
        }
        pacer.finish(&ctx, &cc);
        cc.sending_done.set(true);
        if !ctx.shared.aborted() {
            self.delete(&mut c).await;
        }
        cc.finished.set(true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modern_requests_carry_meta_and_name_their_method_in_headers() {
        let meta = serde_json::json!({
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {},
        });
        for (next, method, name) in [
            (
                Next::Tool {
                    name: "echo",
                    args: br#"{"text":"hi"}"#,
                },
                "tools/call",
                Some("echo"),
            ),
            (
                Next::Resource { uri: "kv://a" },
                "resources/read",
                Some("kv://a"),
            ),
            (Next::List(Listing::Tools), "tools/list", None),
            (Next::Ping, "ping", None),
        ] {
            let mut out = Vec::new();
            put_request_for(&mut out, 7, &next, true);
            let v: serde_json::Value = serde_json::from_slice(&out)
                .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out)));
            assert_eq!(v["method"], method);
            assert_eq!(v["id"], 7);
            assert_eq!(v["params"]["_meta"], meta, "{v}");
            if let Next::Tool { .. } = next {
                assert_eq!(v["params"]["arguments"]["text"], "hi");
            }
            assert_eq!(method_and_name(&next), (method, name));
            // The session era's requests are unchanged.
            let mut old = Vec::new();
            put_request_for(&mut old, 7, &next, false);
            let v: serde_json::Value = serde_json::from_slice(&old).unwrap();
            assert!(v["params"].get("_meta").is_none(), "{v}");
        }
        assert_eq!(header_value("echo"), "echo");
        assert_eq!(header_value("a b"), "a b");
        assert_eq!(header_value("héllo"), "=?base64?aMOpbGxv?=");
        assert_eq!(header_value(" lead"), "=?base64?IGxlYWQ=?=");
    }

    fn decode_all(framing: Framing, pieces: &[&[u8]]) -> Result<(Vec<u8>, bool), String> {
        let mut f = framing;
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        let mut done = false;
        for p in pieces {
            buf.extend_from_slice(p);
            done = f.decode(&mut buf, &mut out, 1 << 20)?;
        }
        Ok((out, done))
    }

    #[test]
    fn chunked_bodies_decode_across_any_split() {
        let wire = b"5;ext=1\r\nhello\r\n7\r\n, world\r\n0\r\nX-T: 1\r\n\r\n";
        for cut in 0..wire.len() {
            let (a, b) = wire.split_at(cut);
            let (out, done) = decode_all(Framing::Chunked(Chunk::Size), &[a, b]).unwrap();
            assert_eq!(out, b"hello, world", "cut at {cut}");
            assert!(done, "cut at {cut}");
        }
        let (out, done) = decode_all(Framing::Chunked(Chunk::Size), &[b"5\r\nhel"]).unwrap();
        assert_eq!((out.as_slice(), done), (&b"hel"[..], false));
        for bad in [&b"zz\r\n"[..], b"5\r\nhelloXY", b"\r\n"] {
            assert!(decode_all(Framing::Chunked(Chunk::Size), &[bad]).is_err());
        }
    }

    #[test]
    fn length_bodies_stop_at_their_length_and_respect_the_limit() {
        let mut f = Framing::Length(3);
        let mut buf = BytesMut::from(&b"abcHTTP"[..]);
        let mut out = Vec::new();
        assert!(f.decode(&mut buf, &mut out, 10).unwrap());
        assert_eq!((&out[..], &buf[..]), (&b"abc"[..], &b"HTTP"[..]));
        let mut f = Framing::Length(30);
        let mut buf = BytesMut::from(&[b'x'; 30][..]);
        assert!(f.decode(&mut buf, &mut Vec::new(), 10).is_err());
    }

    #[test]
    fn answers_are_classified_by_id_result_and_kind() {
        let tool = ResponsePayload::ToolResult;
        let ok = br#"{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"x"}],"structuredContent":{"a":1}}}"#;
        assert!(matches!(classify(ok, 7, tool), Class::Answer(Ok(()))));
        assert!(matches!(classify(ok, 8, tool), Class::OtherId));
        let is_err = br#"{"jsonrpc":"2.0","id":7,"result":{"content":[],"isError":true}}"#;
        assert!(matches!(
            classify(is_err, 7, tool),
            Class::Answer(Err((ErrorKind::ToolError, None)))
        ));
        let err = br#"{"jsonrpc":"2.0","id":7,"error":{"code":-32602,"message":"bad"}}"#;
        assert!(matches!(
            classify(err, 7, tool),
            Class::Answer(Err((ErrorKind::ErrorResponse, Some(-32602))))
        ));
        // -32002: the broker's router fault says so in data.kind; without
        // it, MCP's resource not found.
        let fault = br#"{"jsonrpc":"2.0","id":7,"error":{"code":-32002,"message":"trap","data":{"kind":"router_fault","retryable":true}}}"#;
        assert!(matches!(
            classify(fault, 7, tool),
            Class::Answer(Err((ErrorKind::ErrorResponse, Some(-32002))))
        ));
        // 2026-07-28's router fault: -32603, named by data.kind.
        let fault = br#"{"jsonrpc":"2.0","id":7,"error":{"code":-32603,"message":"trap","data":{"kind":"router_fault","retryable":true}}}"#;
        assert!(matches!(
            classify(fault, 7, tool),
            Class::Answer(Err((ErrorKind::ErrorResponse, Some(-32002))))
        ));
        let internal = br#"{"jsonrpc":"2.0","id":7,"error":{"code":-32603,"message":"bug"}}"#;
        assert!(matches!(
            classify(internal, 7, tool),
            Class::Answer(Err((ErrorKind::ErrorResponse, Some(-32603))))
        ));
        let missing = br#"{"jsonrpc":"2.0","id":7,"error":{"code":-32002,"message":"Resource not found","data":{"uri":"kv://x"}}}"#;
        assert!(matches!(
            classify(missing, 7, tool),
            Class::Answer(Err((ErrorKind::ErrorResponse, Some(-32601))))
        ));
        let null_id = br#"{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"x"}}"#;
        assert!(matches!(
            classify(null_id, 7, tool),
            Class::Answer(Err((ErrorKind::ErrorResponse, Some(-32700))))
        ));
        let wrong_kind = br#"{"jsonrpc":"2.0","id":7,"result":{"tools":[]}}"#;
        assert!(matches!(
            classify(wrong_kind, 7, tool),
            Class::Answer(Err((ErrorKind::KindMismatch, None)))
        ));
        assert!(matches!(
            classify(wrong_kind, 7, ResponsePayload::ListToolsResult),
            Class::Answer(Ok(()))
        ));
        let neither = br#"{"jsonrpc":"2.0","id":7}"#;
        assert!(matches!(
            classify(neither, 7, tool),
            Class::Answer(Err((ErrorKind::InvalidResponse, None)))
        ));
        let note =
            br#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progress":1}}"#;
        assert!(matches!(classify(note, 7, tool), Class::Notification));
        for garbage in [
            &b"{"[..],
            b"[]",
            br#"{"jsonrpc":"1.0","id":7,"result":{}}"#,
            b"hello",
        ] {
            assert!(matches!(classify(garbage, 7, tool), Class::Garbage));
        }
        let string_id = br#"{"jsonrpc":"2.0","id":"7","result":{"content":[]}}"#;
        assert!(matches!(classify(string_id, 7, tool), Class::OtherId));
    }

    #[test]
    fn requests_are_json_rpc_with_escaped_names() {
        let mut out = Vec::new();
        put_request(
            &mut out,
            42,
            &Next::Tool {
                name: "ec\"ho",
                args: br#"{"text":"hi"}"#,
            },
        );
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"jsonrpc":"2.0","id":42,"method":"tools/call",
                "params":{"name":"ec\"ho","arguments":{"text":"hi"}}})
        );
        for (next, method) in [
            (Next::Ping, "ping"),
            (
                Next::List(Listing::ResourceTemplates),
                "resources/templates/list",
            ),
            (Next::Resource { uri: "kv://a" }, "resources/read"),
        ] {
            out.clear();
            put_request(&mut out, 1, &next);
            let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
            assert_eq!(v["method"], method);
        }
    }
}
