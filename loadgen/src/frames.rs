//! The `frames://` driver: size-prefixed FlatBuffers frames over TCP
//! (`frames+tls://`: over TLS, through the halves of `tls::Conn`).
//!
//! Each connection has one writer task and one reader task. The writer
//! encodes every request that may go now (window room, schedule due) into
//! one buffer and writes it with a single `write_all`: under load that is
//! one syscall (one io_uring submission) for many requests. The reader reads
//! into one growing buffer and handles every complete frame in place.
//!
//! # Invariants
//! - A request is registered as outstanding before its bytes are written,
//!   so its response can never arrive first.
//! - Correlation ids are `l<connection>.<sequence>`: unique per run, and a
//!   response carrying another connection's id is an unknown correlation.
//!   The final answer of a request that already timed out is late, not
//!   unknown (`engine::TimedOut`).
//! - A read is only cancelled when the connection will never be read again
//!   (cancelling loses whatever the kernel already put in the buffer).
//! - Reads go into the buffer's spare capacity (`slice_mut(len..)`): a
//!   partial frame at the front is kept until the rest arrives.
//! - With `--bearer-file`, a connection's first frame is an
//!   `InitializeRequest` carrying the token, and its answer is awaited in
//!   `connect` (connection setup, before the start line, like the TLS
//!   handshake): no measured request is sent on a connection the server has
//!   not accepted, and a refusal fails the run before it starts. Bytes read
//!   past that answer are kept for the reader.

use std::io;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use bytes::{Buf, BytesMut};
use mcp_schema::FrameSplitter;
use mcp_schema::client::{RequestEncoder, RequestHeader, ResponseView};
use mcp_schema::fb::protocol::{ProtocolVersion, ResponsePayload};
use monoio::buf::IoBufMut;

use crate::engine::{ConnCtx, Driver, Pacer, Step, ThreadCtx};
use crate::stats::ErrorKind;
use crate::tls::{Conn, Connector, ReadHalf, WriteHalf};

/// Read buffer growth step.
const READ_CHUNK: usize = 64 * 1024;

/// Correlation id of the `InitializeRequest` a connection sends first with
/// `--bearer-file`: not of the `l<conn>.<seq>` form, so never a measured
/// request's.
const INIT_ID: &str = "init";

#[derive(Clone, Debug)]
pub struct FramesDriver {
    /// TCP, and TLS for `frames+tls://` (the handshake is part of
    /// `connect`).
    pub connector: Connector,
    /// `--bearer-file`: sent in each connection's `InitializeRequest`
    /// during `connect`.
    pub bearer: Option<Arc<str>>,
    /// Largest response frame accepted (`--max-frame`).
    pub max_frame: u32,
}

/// A connected frame connection: its halves, and what was read past the
/// answer to its initialize (empty without `--bearer-file`).
pub struct FramesConn {
    conn: Conn,
    buf: BytesMut,
}

impl Driver for FramesDriver {
    type Rt = crate::rt::Monoio;
    type Conn = FramesConn;

    async fn connect(&self, addr: SocketAddr) -> io::Result<FramesConn> {
        let mut conn = self.connector.connect(addr).await?;
        let mut buf = BytesMut::with_capacity(READ_CHUNK);
        if let Some(token) = &self.bearer {
            initialize(&mut conn, token, self.max_frame, &mut buf).await?;
        }
        Ok(FramesConn { conn, buf })
    }

    async fn drive(&self, conn: FramesConn, ctx: Rc<ThreadCtx>, cc: Rc<ConnCtx>) {
        let FramesConn {
            conn: Conn { r, mut w },
            buf,
        } = conn;
        let reader = {
            let (ctx, cc) = (Rc::clone(&ctx), Rc::clone(&cc));
            let clock = Rc::clone(&ctx.clock);
            monoio::spawn(clock.counted(async move {
                let mut r = r;
                if let Err(msg) = read_loop(&ctx, &cc, &mut r, buf).await {
                    ctx.conn_failed(&cc, msg);
                }
            }))
        };
        let result = write_loop(&ctx, &cc, &mut w).await;
        cc.sending_done.set(true);
        match result {
            Err(e) => ctx.conn_failed(
                &cc,
                format!("connection to {} failed while sending: {e}", ctx.cfg.target),
            ),
            Ok(()) if cc.outstanding.borrow().is_empty() => cc.reader_stop.raise(),
            Ok(()) => {}
        }
        reader.await;
        // Closing the write side tells the server we are done.
        let _ = w.shutdown().await;
        cc.finished.set(true);
    }
}

/// The text of correlation ids of one connection: a fixed prefix and a
/// decimal sequence number, formatted without allocating.
struct CorrIds {
    buf: [u8; 48],
    prefix_len: usize,
}

impl CorrIds {
    fn new(conn: usize) -> Self {
        let mut buf = [0u8; 48];
        let prefix = format!("l{conn}.");
        buf[..prefix.len()].copy_from_slice(prefix.as_bytes());
        Self {
            buf,
            prefix_len: prefix.len(),
        }
    }

    fn format(&mut self, seq: u64) -> &str {
        let mut digits = [0u8; 20];
        let mut n = seq;
        let mut i = digits.len();
        loop {
            i -= 1;
            digits[i] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        let d = &digits[i..];
        let end = self.prefix_len + d.len();
        self.buf[self.prefix_len..end].copy_from_slice(d);
        // ASCII only: the prefix is `l<digits>.` and the rest digits.
        std::str::from_utf8(&self.buf[..end]).unwrap_or_default()
    }

    fn parse(&self, s: &str) -> Option<u64> {
        let rest = s.as_bytes().strip_prefix(&self.buf[..self.prefix_len])?;
        if rest.is_empty() || rest.len() > 20 || !rest.iter().all(u8::is_ascii_digit) {
            return None;
        }
        std::str::from_utf8(rest).ok()?.parse().ok()
    }
}

/// Sends the connection's `InitializeRequest` with `token` and waits for
/// its answer: an `InitializeResponse` lets the run go on; an
/// `ErrorResponse` (a refused token) is an error naming its code and text.
/// Frames before the answer that are not it (notifications) are skipped;
/// bytes after it stay in `buf` for the reader.
async fn initialize(
    conn: &mut Conn,
    token: &str,
    max_frame: u32,
    buf: &mut BytesMut,
) -> io::Result<()> {
    let bad = |what: String| io::Error::new(io::ErrorKind::InvalidData, what);
    let frame = {
        let mut enc = RequestEncoder::new();
        let h = RequestHeader {
            message_id: init_message_id(),
            correlation_id: Some(INIT_ID),
            session_id: None,
            timeout_ms: 0,
            unix_nanos: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as i64),
        };
        enc.initialize_with_token(
            &h,
            ProtocolVersion::V2025_06_18,
            "mcp-loadgen",
            env!("CARGO_PKG_VERSION"),
            Some(token),
        )
        .to_vec()
    };
    let (res, _) = conn.w.write_all(frame).await;
    res?;
    let splitter = FrameSplitter::new(max_frame);
    loop {
        while let Some(len) = splitter
            .peek_len(buf)
            .map_err(|e| bad(format!("bad answer to initialize: {e}{}", not_frames(buf))))?
        {
            let total = mcp_schema::split::PREFIX_LEN + len as usize;
            if buf.len() < total {
                break;
            }
            let frame = buf.split_to(total);
            let v = ResponseView::parse(&frame)
                .map_err(|e| bad(format!("invalid frame in answer to initialize: {e}")))?;
            if !v.is_final() || v.correlation_id() != INIT_ID {
                continue;
            }
            if let Some((code, text)) = v.error() {
                let name = mcp_schema::ErrorCode::from_code(code)
                    .map_or_else(|| format!("code_{code}"), |c| c.as_str().to_owned());
                return Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!(
                        "the server refused the connection's initialize with the \
                         --bearer-file token: error {code} ({name}): {text}"
                    ),
                ));
            }
            if v.payload_type() != ResponsePayload::InitializeResponse {
                return Err(bad(format!(
                    "the answer to initialize is a {:?}, not an InitializeResponse",
                    v.payload_type()
                )));
            }
            return Ok(());
        }
        let missing = splitter
            .missing(buf)
            .map_err(|e| bad(format!("bad answer to initialize: {e}")))?;
        if buf.capacity() - buf.len() < missing.max(READ_CHUNK / 4) {
            buf.reserve(missing.max(READ_CHUNK));
        }
        let len = buf.len();
        let (res, b) = conn.r.read(std::mem::take(buf).slice_mut(len..)).await;
        *buf = b.into_inner();
        if res? == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the server closed the connection before answering initialize",
            ));
        }
    }
}

/// A message id for a connection's initialize, unique within the run: the
/// connection field all ones (no real connection's), then a counter.
fn init_message_id() -> [u8; 16] {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let mut b = message_id(0, NEXT.fetch_add(1, Ordering::Relaxed));
    b[0..6].fill(0xff);
    b
}

/// A message id unique within the run: connection and sequence, with the
/// RFC 9562 version 8 ("custom") and variant bits set.
fn message_id(conn: usize, seq: u64) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[0..6].copy_from_slice(&(conn as u64).to_be_bytes()[2..]);
    b[6] = 0x80;
    b[8..16].copy_from_slice(&seq.to_be_bytes());
    b[8] = 0x80 | (b[8] & 0x3f);
    b
}

async fn write_loop(ctx: &ThreadCtx, cc: &ConnCtx, w: &mut WriteHalf) -> io::Result<()> {
    let mut generator = Pacer::generator(ctx, cc);
    let mut pacer = Pacer::new(ctx, cc);
    let mut ids = CorrIds::new(cc.index);
    let mut buf: Vec<u8> = Vec::with_capacity(64 * 1024);
    loop {
        let now = Instant::now();
        let room = match pacer.step(ctx, cc, now) {
            Step::Stop => break,
            Step::WaitUntil(t) => {
                ctx.clock
                    .wait_until::<crate::rt::Monoio>(t, &cc.writer_wake)
                    .await;
                continue;
            }
            Step::WindowFull => {
                cc.writer_wake.notified().await;
                continue;
            }
            Step::Send(room) => room,
        };
        let unix_nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as i64);
        for _ in 0..room {
            let Some(intended) = pacer.intended(ctx, now) else {
                break;
            };
            let seq = pacer.seq();
            let h = RequestHeader {
                message_id: message_id(cc.index, seq),
                correlation_id: Some(ids.format(seq)),
                session_id: None,
                timeout_ms: 0,
                unix_nanos,
            };
            let expect = generator.encode(&h, &mut buf);
            pacer.sent(ctx, cc, intended, now, expect);
        }
        let (res, b) = w.write_all(buf).await;
        buf = b;
        buf.clear();
        res?;
    }
    pacer.finish(ctx, cc);
    Ok(())
}

/// A hint for a stream that cannot be frames because it is another edge's
/// protocol (the wrong port or scheme), or "" when it does not look like one:
/// a length prefix read from `HTTP/1.1 …` or from an HTTP/2 SETTINGS frame
/// names a frame of tens of megabytes, which alone says nothing useful.
fn not_frames(buf: &[u8]) -> &'static str {
    if buf.starts_with(b"HTTP/") {
        "; the server answered in HTTP/1 (an http:// or metrics port?): check the target's \
         scheme and port"
    } else if buf.len() >= 9 && buf[3] == 0x04 && buf[4] & !0x01 == 0 && buf[5..9] == [0; 4] {
        // A SETTINGS frame on stream 0: what an HTTP/2 server sends first.
        "; the server answered in HTTP/2 (a grpc:// port?): check the target's scheme and port"
    } else {
        ""
    }
}

/// Reads and handles responses; `buf` holds what was read before (during
/// `connect`).
async fn read_loop(
    ctx: &ThreadCtx,
    cc: &ConnCtx,
    r: &mut ReadHalf,
    mut buf: BytesMut,
) -> Result<(), String> {
    let splitter = FrameSplitter::new(ctx.cfg.max_frame);
    let ids = CorrIds::new(cc.index);
    // Complete frames read during `connect` (past the initialize answer).
    handle_frames(ctx, cc, &ids, &splitter, &mut buf, Instant::now())?;
    loop {
        if cc.reader_stop.is_raised()
            || (cc.sending_done.get() && cc.outstanding.borrow().is_empty())
        {
            return Ok(());
        }
        let missing = splitter.missing(&buf).map_err(|e| {
            format!(
                "bad response stream from {}: {e}{}",
                ctx.cfg.target,
                not_frames(&buf)
            )
        })?;
        if buf.capacity() - buf.len() < missing.max(READ_CHUNK / 4) {
            buf.reserve(missing.max(READ_CHUNK));
        }
        // monoio reads into the start of an `IoBufMut`, not after its
        // initialised bytes: read into the spare capacity explicitly, or a
        // partial frame kept from the last read would be overwritten.
        let len = buf.len();
        let (res, b) = monoio::select! {
            x = r.read(buf.slice_mut(len..)) => x,
            _ = cc.reader_stop.wait() => return Ok(()),
        };
        buf = b.into_inner();
        match res {
            Ok(0) => {
                return Err(format!(
                    "connection to {} closed by the server",
                    ctx.cfg.target
                ));
            }
            Ok(_) => {}
            Err(e) => return Err(format!("connection to {} failed: {e}", ctx.cfg.target)),
        }
        handle_frames(ctx, cc, &ids, &splitter, &mut buf, Instant::now())?;
    }
}

/// Handles every complete frame at the front of `buf`, leaving a partial
/// one.
fn handle_frames(
    ctx: &ThreadCtx,
    cc: &ConnCtx,
    ids: &CorrIds,
    splitter: &FrameSplitter,
    buf: &mut BytesMut,
    now: Instant,
) -> Result<(), String> {
    while let Some(len) = splitter.peek_len(buf).map_err(|e| {
        format!(
            "bad response stream from {}: {e}{}",
            ctx.cfg.target,
            not_frames(buf)
        )
    })? {
        let total = mcp_schema::split::PREFIX_LEN + len as usize;
        if buf.len() < total {
            break;
        }
        handle_frame(ctx, cc, ids, &buf[..total], now);
        buf.advance(total);
    }
    Ok(())
}

/// Whether `v` is the broker's news to the connection rather than part of
/// an answer: a listing change, told to every connection that initialized
/// (as one that sends `--bearer-file`'s token does), or a resource update.
/// They carry no correlation id, and counting them as `unknown_correlation`
/// once reported a run with every request answered as failing.
fn is_announcement(v: &ResponseView<'_>) -> bool {
    matches!(
        v.payload_type(),
        ResponsePayload::ListChangedNotification | ResponsePayload::ResourceUpdatedNotification
    )
}

fn handle_frame(ctx: &ThreadCtx, cc: &ConnCtx, ids: &CorrIds, frame: &[u8], now: Instant) {
    // The writer failed first (the server reset the connection), and its
    // requests were counted lost: the answers read after are no strays.
    if cc.given_up.get() {
        return;
    }
    let v = match ResponseView::parse(frame) {
        Ok(v) => v,
        Err(_) => return ctx.on_stray(ErrorKind::InvalidFrame, now),
    };
    if is_announcement(&v) {
        return;
    }
    let Some(seq) = ids.parse(v.correlation_id()) else {
        return ctx.on_stray(ErrorKind::UnknownCorrelation, now);
    };
    if !v.is_final() {
        if cc.outstanding.borrow().contains_key(&seq) {
            ctx.on_progress();
        } else if !cc.timed_out.borrow().contains(seq) {
            // Progress of a timed-out request is neither: dropped.
            ctx.on_stray(ErrorKind::UnknownCorrelation, now);
        }
        return;
    }
    let (p, was_full) = {
        let mut o = cc.outstanding.borrow_mut();
        let was_full = o.len() as u64 >= cc.plan.window;
        match o.remove(&seq) {
            Some(p) => (p, was_full),
            None => return ctx.on_unmatched(cc, seq, now),
        }
    };
    let outcome = if let Some((code, _)) = v.error() {
        Err((ErrorKind::ErrorResponse, Some(code)))
    } else if v.payload_type() != p.expect {
        Err((ErrorKind::KindMismatch, None))
    } else if v.is_tool_error() {
        Err((ErrorKind::ToolError, None))
    } else {
        Ok(())
    };
    cc.ended(was_full, now);
    ctx.on_end(&p, now, outcome);
    if was_full {
        cc.writer_wake.notify();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn another_edges_protocol_is_named() {
        assert!(not_frames(b"HTTP/1.1 400 Bad Request\r\n").contains("HTTP/1"));
        // The SETTINGS frame hyper's HTTP/2 server opens with.
        let settings = [0, 0, 0x18, 0x04, 0, 0, 0, 0, 0, 0, 1];
        assert!(not_frames(&settings).contains("HTTP/2"));
        assert_eq!(not_frames(&[0xff, 0xff, 0xff, 0x7f, 1, 2, 3, 4, 5]), "");
        assert_eq!(not_frames(b""), "");
    }

    #[test]
    fn the_brokers_announcements_are_no_stray_answers() {
        use mcp_schema::encode::{Correlation, ReplyTo};
        use mcp_schema::fb::protocol as p;
        let mut enc = mcp_schema::ResponseEncoder::new(1);
        let to = ReplyTo {
            correlation: Correlation::Text(""),
            session_id: None,
        };
        let fbb = enc.begin();
        let n = p::ListChangedNotification::create(
            fbb,
            &p::ListChangedNotificationArgs {
                tools: true,
                resources: false,
                prompts: false,
            },
        );
        let kind = p::ResponsePayload::ListChangedNotification;
        let frame = enc.finish(&to, kind, n.as_union_value(), true).to_vec();
        assert!(is_announcement(&ResponseView::parse(&frame).unwrap()));
        let pong = enc.pong(&to).to_vec();
        assert!(!is_announcement(&ResponseView::parse(&pong).unwrap()));
    }

    #[test]
    fn correlation_ids_round_trip_and_reject_other_connections() {
        let mut a = CorrIds::new(3);
        assert_eq!(a.format(0), "l3.0");
        assert_eq!(a.format(1234567890123), "l3.1234567890123");
        assert_eq!(a.parse("l3.1234567890123"), Some(1234567890123));
        assert_eq!(a.format(u64::MAX), format!("l3.{}", u64::MAX));
        assert_eq!(a.parse("l31.5"), None, "connection 31 is not 3");
        assert_eq!(a.parse("l3."), None);
        assert_eq!(a.parse("l3.+5"), None);
        assert_eq!(a.parse("l3.5x"), None);
        assert_eq!(a.parse(""), None);
    }

    #[test]
    fn message_ids_are_distinct_and_v8_shaped() {
        let a = message_id(1, 7);
        let b = message_id(2, 7);
        let c = message_id(1, 8);
        assert!(a != b && a != c && b != c);
        assert_eq!(a[6] >> 4, 8);
        assert_eq!(a[8] >> 6, 0b10);
    }
}
