//! The fuzzed path: arbitrary bytes through split → verify → view → encode,
//! and the client side (verify a Response, read its vector of unions).
//!
//! Shared by the libFuzzer target (`fuzz_targets/frames.rs`) and the replay
//! of committed crash inputs (`schema/tests/fuzz_regressions.rs`), so a
//! regression test runs exactly what the fuzzer ran.
//!
//! Input layout (so that the fuzzer controls read boundaries and limits):
//!
//! ```text
//! byte 0        ctrl: low nibble N = number of chunk-size bytes that follow;
//!               high nibble M = max frame length (0: the 4 MiB default,
//!               else 16 << M bytes, 32 B ..= 512 KiB)
//! bytes 1..=N   read sizes, each byte b meaning b + 1 bytes, cycled;
//!               none: the whole stream arrives in one read
//! the rest      the byte stream a connection receives
//! ```
//!
//! Every check here is an `assert!`: the fuzzer reports a panic as a crash.

use std::hint::black_box;
use std::io::Write;

use bytes::{Bytes, BytesMut};
use mcp_schema::content_vec;
use mcp_schema::encode::ReplyTo;
use mcp_schema::fb::protocol::ResponsePayload;
use mcp_schema::split::PREFIX_LEN;
use mcp_schema::uuid::{HYPHENATED_LEN, hyphenated};
use mcp_schema::verify::{VerifiedRequest, header_of_invalid, verify_response};
use mcp_schema::view::reply_to_header;
use mcp_schema::{
    Correlation, DEFAULT_MAX_FRAME_LEN, ErrorCode, FrameError, FrameSplitter, ResponseEncoder,
    write_arguments_json,
};

/// Runs one fuzz input.
pub fn run(data: &[u8]) {
    let Some((&ctrl, rest)) = data.split_first() else {
        return;
    };
    let (cuts, stream) = rest.split_at(usize::from(ctrl & 0x0f).min(rest.len()));
    let max = match ctrl >> 4 {
        0 => DEFAULT_MAX_FRAME_LEN,
        m => 16u32 << m,
    };
    let mut h = Harness {
        enc: ResponseEncoder::new(0),
        json: Vec::new(),
    };

    // A client reading whatever a (possibly hostile) server sends.
    read_response(stream);
    // The whole stream as one frame, whether or not its prefix agrees with
    // its length: verification must not rely on the splitter.
    h.frame(Bytes::copy_from_slice(stream));

    let splitter = FrameSplitter::new(max);
    let chunked = split(&splitter, stream, cuts);
    // Read boundaries must not change what comes out.
    let whole = split(&splitter, stream, &[]);
    assert_eq!(chunked.frames, whole.frames, "frames depend on read sizes");
    assert_eq!(chunked.error, whole.error, "errors depend on read sizes");

    for frame in chunked.frames {
        let len = u32::from_le_bytes(frame[..PREFIX_LEN].try_into().unwrap());
        assert_eq!(len as usize, frame.len() - PREFIX_LEN);
        assert!(len <= max);
        h.frame(frame);
    }
    if let Some(code) = chunked.error {
        // The connection is closed after this; the client gets the code.
        assert_eq!(code, ErrorCode::InvalidRequest);
        let out = h
            .enc
            .error(&ReplyTo::UNKNOWN, code, "frame too large", None);
        check_response(out, &ReplyTo::UNKNOWN);
    }
}

struct Split {
    frames: Vec<Bytes>,
    /// The fatal error that ended the stream, if any.
    error: Option<ErrorCode>,
}

/// Feeds `stream` to a receive buffer in reads sized by `cuts`, taking every
/// complete frame after each read, as a connection does.
fn split(splitter: &FrameSplitter, stream: &[u8], cuts: &[u8]) -> Split {
    let mut buf = BytesMut::new();
    let mut out = Split {
        frames: Vec::new(),
        error: None,
    };
    let mut pos = 0;
    let mut sizes = cuts.iter().map(|&b| usize::from(b) + 1).cycle();
    while pos < stream.len() {
        let n = sizes.next().unwrap_or(stream.len()).min(stream.len() - pos);
        buf.extend_from_slice(&stream[pos..pos + n]);
        pos += n;
        loop {
            let missing = splitter.missing(&buf);
            match splitter.next_frame(&mut buf) {
                Ok(Some(frame)) => {
                    assert_eq!(missing.ok(), Some(0));
                    out.frames.push(frame);
                }
                Ok(None) => {
                    assert!(missing.is_ok_and(|m| m > 0));
                    break;
                }
                Err(e) => {
                    assert!(missing.is_err());
                    assert!(matches!(e, FrameError::TooLarge { .. }) && e.is_fatal());
                    out.error = Some(e.code());
                    return out;
                }
            }
        }
    }
    out
}

struct Harness {
    enc: ResponseEncoder,
    json: Vec<u8>,
}

impl Harness {
    /// One frame as a shard handles it: verify, read, answer.
    fn frame(&mut self, frame: Bytes) {
        // Must be callable on anything, valid or not.
        let header = header_of_invalid(&frame).map(|h| reply_to_header(&h));
        match VerifiedRequest::verify(frame.clone()) {
            Ok(req) => {
                let view = req.view();
                let to = view.reply_to();
                // A verified request's header is always readable.
                assert_eq!(header, Some(to));
                black_box((view.kind().as_str(), view.route_key()));
                black_box((view.message_id(), view.correlation_id(), view.session_id()));
                black_box((view.timeout_ms(), view.header().timestamp()));
                // Debug walks every field of the request, payload included.
                write!(std::io::sink(), "{:?}", view.request()).unwrap();

                let arguments = match view.tool_call() {
                    Some(tc) => Some(tc.arguments()),
                    None => view
                        .request()
                        .payload_as_prompt_request()
                        .and_then(|p| p.arguments()),
                };
                write_arguments_json(arguments, &mut self.json);
                let json = std::str::from_utf8(&self.json).expect("arguments JSON is UTF-8");
                assert!(json.starts_with('{') && json.ends_with('}'));

                if let Some(tc) = view.tool_call() {
                    let out = self.enc.tool_text(&to, tc.id(), json, Some(json), false);
                    let resp = check_response(out, &to);
                    let tr = resp.payload_as_tool_result().expect("a ToolResult");
                    assert_eq!(tr.tool_call_id(), tc.id());
                    assert_eq!(tr.structured_content(), Some(json));
                    let content = content_vec::content(&tr).expect("own content verifies");
                    assert_eq!(content.len(), 1);
                    match content.get(0) {
                        content_vec::ContentRef::Text(t) => assert_eq!(t.text(), json),
                        other => panic!("expected text content, got {other:?}"),
                    }
                }
                let out = self.enc.error(&to, ErrorCode::NotFound, json, Some(json));
                check_response(out, &to);
            }
            Err(e) => {
                assert!(!e.is_fatal(), "only the splitter reports fatal errors");
                let code = e.code();
                assert!(matches!(
                    code,
                    ErrorCode::ParseError | ErrorCode::InvalidRequest | ErrorCode::NotFound
                ));
                let to = header.unwrap_or(ReplyTo::UNKNOWN);
                let out = self.enc.error(&to, code, &e.to_string(), None);
                check_response(out, &to);
            }
        }
    }
}

/// Verifies a Response we encoded and checks it is addressed to `to`.
fn check_response<'a>(out: &'a [u8], to: &ReplyTo<'_>) -> mcp_schema::fb::protocol::Response<'a> {
    let resp = verify_response(out).expect("an encoded Response verifies");
    let mut text = [0u8; HYPHENATED_LEN];
    let want = match to.correlation {
        Correlation::Text(s) => s,
        Correlation::MessageId(id) => hyphenated(&id, &mut text),
    };
    assert_eq!(resp.header().correlation_id(), Some(want));
    assert_eq!(resp.header().session_id(), to.session_id);
    if resp.payload_type() == ResponsePayload::ErrorResponse {
        assert!(!resp.success());
    }
    resp
}

/// The client side: verify arbitrary bytes as a Response and read it all,
/// the hand-written vector of unions included.
fn read_response(frame: &[u8]) {
    let Ok(resp) = verify_response(frame) else {
        return;
    };
    write!(std::io::sink(), "{resp:?}").unwrap();
    if let Some(tr) = resp.payload_as_tool_result() {
        // verify_response already checked the content vector.
        let content = content_vec::content(&tr).expect("verified content reads");
        for block in content.iter() {
            write!(std::io::sink(), "{block:?}").unwrap();
        }
    }
}
