//! libFuzzer target: the HTTP edge's JSON-RPC codec
//! (`broker/src/edge/http/jsonrpc.rs`, compiled here as the very file the
//! edge runs, with `request_state.rs`, the only other file it reads from).
//!
//! Input: a POST body, as a client sends it. Its first byte also picks a
//! method and a protocol version for the answer side, where the whole input
//! is handed to the answer writer as if it were a response frame.
//!
//! Properties (each an `assert!`):
//! - every error the codec writes, for any body, is one JSON value;
//! - every request it accepts becomes a frame that verifies as a Request
//!   (or, for an empty routing name, is refused as an invalid request);
//! - whatever bytes stand in for a response frame, the answer written is
//!   one JSON value (an unreadable frame becomes an internal error);
//! - any text as a router's set of questions (`mcp-broker/input-requests`)
//!   is refused with a message or read into 1 to 8 questions, whose
//!   `InputRequiredResult` is one JSON value.
#![no_main]

use bytes::Bytes;
use mcp_schema::client::{RequestEncoder, RequestHeader};
use mcp_schema::verify::VerifiedRequest;
use mcp_schema::{FrameError, RequestKind};

#[path = "../../broker/src/edge/http/jsonrpc.rs"]
#[allow(dead_code)]
mod jsonrpc;
// jsonrpc.rs reads the kinds of question and their bounds from here.
#[path = "../../broker/src/edge/http/request_state.rs"]
#[allow(dead_code, unused_imports)]
mod request_state;

use jsonrpc::{Body, Id, Message, Method};

const METHODS: [Method; 13] = [
    Method::Initialize,
    Method::Ping,
    Method::ListTools,
    Method::CallTool,
    Method::ListResources,
    Method::ListResourceTemplates,
    Method::ReadResource,
    Method::Subscribe,
    Method::Unsubscribe,
    Method::ListPrompts,
    Method::GetPrompt,
    Method::Complete,
    Method::SetLevel,
];

const VERSIONS: [&str; 4] = ["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"];

/// One JSON value by the grammar (a syntax check: a client's id such as
/// `1e999` is valid JSON and echoed verbatim, though no f64 holds it).
fn is_json(out: &[u8]) -> bool {
    serde_json::from_slice::<serde::de::IgnoredAny>(out).is_ok()
}

fn request(
    enc: &mut RequestEncoder,
    id: &Id<'_>,
    method: &str,
    params: Option<&serde_json::value::RawValue>,
) {
    let Some(m) = Method::from_name(method) else {
        return;
    };
    let h = RequestHeader {
        message_id: [1; 16],
        correlation_id: None,
        session_id: Some("0-0123456789abcdef0123456789abcdef"),
        timeout_ms: 0,
        unix_nanos: 0,
    };
    match jsonrpc::request_frame(enc, &h, m, params, &[]) {
        Ok((frame, _)) => match VerifiedRequest::verify(Bytes::copy_from_slice(frame)) {
            Ok(req) => {
                let kind = req.view().kind();
                assert!(RequestKind::ALL.contains(&kind));
            }
            Err(FrameError::InvalidRequest(_)) => {}
            Err(e) => panic!("the codec built a frame that does not verify: {e} ({method})"),
        },
        Err(e) => {
            let mut out = Vec::new();
            jsonrpc::write_error(&mut out, Some(id), e.code, &e.message, e.data.as_deref());
            assert!(is_json(&out), "{}", String::from_utf8_lossy(&out));
        }
    }
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let mut enc = RequestEncoder::new();
    match jsonrpc::parse(data) {
        Err(e) => {
            let mut out = Vec::new();
            jsonrpc::write_error(
                &mut out,
                e.id.as_ref(),
                e.code,
                &e.message,
                e.data.as_deref(),
            );
            assert!(is_json(&out), "{}", String::from_utf8_lossy(&out));
        }
        Ok(Body::One(Message::Request { id, method, params })) => {
            request(&mut enc, &id, &method, params)
        }
        Ok(Body::Batch(items)) => {
            for item in items.into_iter().flatten() {
                if let Message::Request { id, method, params } = item {
                    request(&mut enc, &id, &method, params);
                }
            }
        }
        Ok(_) => {}
    }
    // The answer side, with the input standing in for a response frame.
    if let Some(&b) = data.first() {
        let raw = serde_json::value::RawValue::from_string("7".into()).unwrap();
        let id = Id(&raw);
        let method = METHODS[b as usize % METHODS.len()];
        let version = VERSIONS[(b as usize / METHODS.len()) % VERSIONS.len()];
        let mut out = Vec::new();
        jsonrpc::write_response(&mut out, &id, method, data, version);
        assert!(is_json(&out), "{}", String::from_utf8_lossy(&out));
        // The input as a router's set of questions.
        if let Ok(text) = std::str::from_utf8(data)
            && let Ok(set) = jsonrpc::parse_input_requests(text)
        {
            assert!((1..=request_state::MAX_INPUT_REQUESTS).contains(&set.len()));
            out.clear();
            jsonrpc::write_input_required_set(&mut out, &id, &set, "token");
            assert!(is_json(&out), "{}", String::from_utf8_lossy(&out));
        }
    }
});
