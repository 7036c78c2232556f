//! The soak on the gRPC edge (`--edge grpc`): its checker (a tonic client,
//! the reference stack's shape) and the raw HTTP/2 bytes its abusers send.
//!
//! The abusers write HTTP/2 by hand, since no client library lets a peer
//! misbehave: never read, advertise a receive window of 0, or send frames
//! that are not HTTP/2. Request headers are HPACK literals without
//! indexing (RFC 7541, 6.2.2), which every decoder must accept; gRPC
//! messages are length-prefixed protobuf `CallToolRequest`s (`name = 1`,
//! `arguments = 2`), written byte by byte here so that they can be cut and
//! bit-flipped.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::{Duration, Instant};

use mcp_proto::v1::mcp_service_client::McpServiceClient;
use mcp_proto::v1::{CallToolRequest, content};

use super::{Answer, CheckerResult, Rng, Unframeable};

/// The client connection preface (RFC 9113, 3.4).
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const CALL_TOOL: &str = "/turbomcp.mcp.v1.McpService/CallTool";
/// SETTINGS_MAX_FRAME_SIZE's initial value: the largest frame a peer may
/// send before the other raises it.
pub(crate) const MAX_FRAME: usize = 16_384;

const DATA: u8 = 0;
const HEADERS: u8 = 1;
const SETTINGS: u8 = 4;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;

/// Names of the five kinds of garbage, in the order of [`garbage`]'s
/// `kind`; the last one closes the connection (FRAME_SIZE_ERROR).
pub(crate) const GARBAGE_KINDS: [&str; 5] = [
    "random_bytes",
    "truncated_call",
    "bit_flipped_call",
    "bad_hpack",
    "oversized_frame",
];

fn frame(out: &mut Vec<u8>, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
    let len = payload.len() as u32;
    out.extend_from_slice(&len.to_be_bytes()[1..]);
    out.extend_from_slice(&[kind, flags]);
    out.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
    out.extend_from_slice(payload);
}

/// An HPACK string literal without Huffman coding (7-bit length prefix).
fn hpack_str(out: &mut Vec<u8>, s: &str) {
    let mut n = s.len();
    if n < 127 {
        out.push(n as u8);
    } else {
        out.push(127);
        n -= 127;
        while n >= 128 {
            out.push((n % 128) as u8 | 0x80);
            n /= 128;
        }
        out.push(n as u8);
    }
    out.extend_from_slice(s.as_bytes());
}

/// A protobuf varint.
fn varint(out: &mut Vec<u8>, mut n: u64) {
    while n >= 0x80 {
        out.push(n as u8 | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

/// The connection preface and a SETTINGS frame: `window` as the initial
/// stream window (0: the broker may send no DATA at all), no server push.
pub(crate) fn greeting(window: Option<u32>) -> Vec<u8> {
    let mut settings = vec![0, 2, 0, 0, 0, 0]; // SETTINGS_ENABLE_PUSH = 0
    if let Some(w) = window {
        settings.extend_from_slice(&[0, 4]); // SETTINGS_INITIAL_WINDOW_SIZE
        settings.extend_from_slice(&w.to_be_bytes());
    }
    let mut out = PREFACE.to_vec();
    frame(&mut out, SETTINGS, 0, 0, &settings);
    out
}

/// The gRPC message of an `echo` call with `text`.
fn message(text: &str) -> Vec<u8> {
    let args = serde_json::json!({ "text": text }).to_string();
    let mut pb = vec![0x0a, 4];
    pb.extend_from_slice(b"echo");
    pb.push(0x12);
    varint(&mut pb, args.len() as u64);
    pb.extend_from_slice(args.as_bytes());
    let mut msg = vec![0];
    msg.extend_from_slice(&(pb.len() as u32).to_be_bytes());
    msg.extend_from_slice(&pb);
    msg
}

/// A `CallTool` of `echo` on `stream`: HEADERS, then the message in DATA
/// frames of at most the initial frame size, the last ending the stream.
pub(crate) fn call(stream: u32, text: &str) -> Vec<u8> {
    let mut block = Vec::new();
    for (name, value) in [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", CALL_TOOL),
        (":authority", "127.0.0.1"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ] {
        block.push(0x00); // literal without indexing, new name
        hpack_str(&mut block, name);
        hpack_str(&mut block, value);
    }
    let mut out = Vec::new();
    frame(&mut out, HEADERS, END_HEADERS, stream, &block);
    let msg = message(text);
    let mut chunks = msg.chunks(MAX_FRAME).peekable();
    while let Some(c) = chunks.next() {
        let last = chunks.peek().is_none();
        frame(&mut out, DATA, if last { END_STREAM } else { 0 }, stream, c);
    }
    out
}

/// `n` calls of `echo` with `text` on streams 1, 3, 5, ...: what a
/// never-reading connection sends after its [`greeting`]. Stream ids only
/// grow, so the list is not repeated.
pub(crate) fn calls(n: u32, text: &str) -> Vec<Vec<u8>> {
    (0..n).map(|i| call(2 * i + 1, text)).collect()
}

/// Appends one piece of garbage of `kind` (see [`GARBAGE_KINDS`]) to `out`,
/// the `seq`-th on its connection (which gives it a fresh stream id).
/// Calls are built afresh on their own stream, not from a template;
/// `max_frame` is the frame size the last kind passes.
pub(crate) fn garbage(
    rng: &mut Rng,
    kind: usize,
    _template: &[u8],
    max_frame: u32,
    seq: u64,
    out: &mut Vec<u8>,
) {
    let stream = (2 * (seq % (1 << 29)) + 1) as u32;
    match kind {
        0 => {
            let len = 16 + rng.below(1009) as usize;
            rng.fill(out, len);
        }
        1 | 2 => {
            let start = out.len();
            out.extend_from_slice(&call(stream, "garbage template"));
            let len = out.len() - start;
            if kind == 1 {
                out.truncate(start + 9 + rng.below(len as u64 - 9) as usize);
            } else {
                // After the HEADERS frame's 9-byte header: in the header
                // block, the DATA frame or the message.
                rng.flip_bits(&mut out[start + 9..]);
            }
        }
        3 => {
            let mut block = Vec::new();
            let len = 8 + rng.below(120) as usize;
            rng.fill(&mut block, len);
            frame(out, HEADERS, END_HEADERS | END_STREAM, stream, &block);
        }
        _ => {
            // A DATA frame past SETTINGS_MAX_FRAME_SIZE: FRAME_SIZE_ERROR.
            let mut payload = Vec::new();
            let len = max_frame as usize + 1 + rng.below(1024) as usize;
            rng.fill(&mut payload, len);
            frame(out, DATA, 0, stream, &payload);
        }
    }
}

/// The frames at the front of `buf`, by type (GOAWAY and RST_STREAM with
/// their error codes), leaving a partial one. Without an HPACK decoder the
/// answers' statuses are not read: this counts what the broker sent back.
pub(crate) fn answers(buf: &mut Vec<u8>, out: &mut Vec<Answer>) -> Result<(), Unframeable> {
    let mut at = 0;
    let res = loop {
        let b = &buf[at..];
        if b.len() < 9 {
            break Ok(());
        }
        let len = u32::from_be_bytes([0, b[0], b[1], b[2]]) as usize;
        if len > 1 << 24 {
            break Err(Unframeable);
        }
        if b.len() < 9 + len {
            break Ok(());
        }
        let payload = &b[9..9 + len];
        let code = |at: usize| {
            payload
                .get(at..at + 4)
                .map_or(u32::MAX, |c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]))
        };
        let outcome = match b[3] {
            0 => "data".to_owned(),
            1 => "headers".to_owned(),
            3 => format!("rst_stream_{}", error_name(code(0))),
            4 => "settings".to_owned(),
            6 => "ping".to_owned(),
            7 => format!("goaway_{}", error_name(code(4))),
            8 => "window_update".to_owned(),
            t => format!("frame_type_{t}"),
        };
        out.push(Answer::Final {
            corr: None,
            outcome,
        });
        at += 9 + len;
    };
    match res {
        Ok(()) => drop(buf.drain(..at)),
        Err(_) => buf.clear(),
    }
    res
}

/// An HTTP/2 error code's name (RFC 9113, 7).
fn error_name(code: u32) -> String {
    match code {
        0 => "no_error".into(),
        1 => "protocol_error".into(),
        2 => "internal_error".into(),
        3 => "flow_control_error".into(),
        6 => "frame_size_error".into(),
        7 => "refused_stream".into(),
        8 => "cancel".into(),
        9 => "compression_error".into(),
        11 => "enhance_your_calm".into(),
        c => format!("code_{c}"),
    }
}

/// One checker connection on the gRPC edge: a tonic channel sending
/// `echo` calls whose text is the call's id (`c<idx>.<seq>`) at `rate`
/// until `send_until`. An answer must echo its own call's id. Calls not
/// answered by `drain_until` are lost (late if answered by `grace_until`).
/// HTTP/2 streams cannot answer twice, so a duplicate here is an answer
/// that echoes another call's id.
pub(crate) fn run_checker(
    idx: usize,
    addr: SocketAddr,
    rate: f64,
    (send_until, drain_until, grace_until): (Instant, Instant, Instant),
    abort: Arc<AtomicBool>,
) -> CheckerResult {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(_) => {
            return CheckerResult {
                connect_failures: 1,
                ..CheckerResult::default()
            };
        }
    };
    rt.block_on(async move {
        let mut r = CheckerResult::default();
        let channel = loop {
            let ep = match tonic::transport::Endpoint::from_shared(format!("http://{addr}")) {
                Ok(ep) => ep.tcp_nodelay(true).connect_timeout(Duration::from_secs(2)),
                Err(_) => return r,
            };
            match ep.connect().await {
                Ok(ch) => break ch,
                Err(_) if Instant::now() < send_until && !abort.load(Relaxed) => {
                    r.connect_failures += 1;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(_) => {
                    r.connect_failures += 1;
                    return r;
                }
            }
        };
        let period = Duration::from_secs_f64(1.0 / rate.max(0.1));
        let mut tasks = tokio::task::JoinSet::new();
        let mut next = tokio::time::Instant::now();
        let mut seq = 0u64;
        while Instant::now() < send_until && !abort.load(Relaxed) {
            tokio::time::sleep_until(next).await;
            next += period;
            seq += 1;
            let corr = format!("c{idx}.{seq}");
            let mut client = McpServiceClient::new(channel.clone());
            let sent_at = Instant::now();
            r.sent += 1;
            tasks.spawn(async move {
                let req = CallToolRequest {
                    name: "echo".into(),
                    arguments: Some(serde_json::json!({ "text": corr }).to_string().into_bytes()),
                };
                let grace = tokio::time::Instant::from_std(grace_until);
                let res = tokio::time::timeout_at(grace, client.call_tool(req)).await;
                (corr, sent_at, Instant::now(), res)
            });
        }
        let mut outcomes: BTreeMap<String, u64> = BTreeMap::new();
        while let Some(done) = tasks.join_next().await {
            let Ok((corr, sent_at, at, res)) = done else {
                r.invalid += 1;
                continue;
            };
            let outcome =
                match res {
                    Err(_) => {
                        r.lost += 1;
                        continue;
                    }
                    Ok(Ok(answer)) => {
                        let texts =
                            answer.into_inner().content.into_iter().filter_map(|c| {
                                match c.content {
                                    Some(content::Content::Text(t)) => Some(t.text),
                                    _ => None,
                                }
                            });
                        // `echo` answers with its arguments, `{"text":"<id>"}`.
                        let (mut own, mut other) = (false, false);
                        for t in texts {
                            let echoed = serde_json::from_str::<serde_json::Value>(&t)
                                .ok()
                                .and_then(|v| v["text"].as_str().map(str::to_owned));
                            match echoed {
                                Some(id) if id == corr => own = true,
                                Some(_) => other = true,
                                None => {}
                            }
                        }
                        if other && !own {
                            r.duplicates += 1;
                            continue;
                        }
                        if own { "ToolResult" } else { "no_echo" }.to_owned()
                    }
                    Ok(Err(status)) => {
                        if status.code() == tonic::Code::Unavailable {
                            r.conn_closed_reset += 1;
                        }
                        format!("grpc_{:?}", status.code())
                    }
                };
            r.answered += 1;
            if at >= drain_until {
                r.late += 1;
            }
            r.latencies_us.push((at - sent_at).as_micros() as u64);
            *outcomes.entry(outcome).or_default() += 1;
        }
        r.lost += r.late;
        r.outcomes = outcomes;
        r.latencies_us.sort_unstable();
        r
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_is_headers_then_data_frames_within_the_frame_size() {
        let big = "x".repeat(40_000);
        let bytes = call(7, &big);
        let mut at = 0;
        let mut kinds = Vec::new();
        while at < bytes.len() {
            let len = u32::from_be_bytes([0, bytes[at], bytes[at + 1], bytes[at + 2]]) as usize;
            assert!(len <= MAX_FRAME);
            let stream =
                u32::from_be_bytes([bytes[at + 5], bytes[at + 6], bytes[at + 7], bytes[at + 8]]);
            assert_eq!(stream, 7);
            kinds.push((bytes[at + 3], bytes[at + 4]));
            at += 9 + len;
        }
        assert_eq!(at, bytes.len());
        assert_eq!(kinds[0], (HEADERS, END_HEADERS));
        assert_eq!(kinds.last(), Some(&(DATA, END_STREAM)));
        assert!(kinds[1..kinds.len() - 1].iter().all(|k| *k == (DATA, 0)));
        // The message: uncompressed, its length, then the protobuf.
        let msg = message(&big);
        assert_eq!(msg[0], 0);
        assert_eq!(
            u32::from_be_bytes([msg[1], msg[2], msg[3], msg[4]]) as usize,
            msg.len() - 5
        );
    }

    #[test]
    fn the_broker_frames_are_counted_by_type_and_error() {
        let mut buf = Vec::new();
        frame(&mut buf, SETTINGS, 0, 0, &[0, 3, 0, 0, 1, 0]);
        frame(&mut buf, 7, 0, 0, &[0, 0, 0, 1, 0, 0, 0, 6]);
        frame(&mut buf, 3, 0, 5, &[0, 0, 0, 7]);
        frame(&mut buf, HEADERS, END_HEADERS, 1, &[0x88]);
        buf.extend_from_slice(&[0, 0, 9, DATA]); // a partial frame
        let mut out = Vec::new();
        assert!(answers(&mut buf, &mut out).is_ok());
        let kinds: Vec<String> = out
            .into_iter()
            .map(|a| match a {
                Answer::Final { outcome, .. } => outcome,
                _ => "other".into(),
            })
            .collect();
        assert_eq!(
            kinds,
            [
                "settings",
                "goaway_frame_size_error",
                "rst_stream_refused_stream",
                "headers"
            ]
        );
        assert_eq!(buf.len(), 4);
    }
}
