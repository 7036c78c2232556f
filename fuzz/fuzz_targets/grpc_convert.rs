//! libFuzzer target: gRPC request messages → the edge's conversion to a
//! Request frame → `VerifiedRequest::verify`.
//!
//! The conversion is `broker/src/edge/grpc/request.rs`, compiled here as the very
//! file the edge runs (it depends on nothing else of the broker, so this
//! crate links no wasmtime).
//!
//! Input layout:
//!
//! ```text
//! byte 0      which RPC (mod 9)
//! byte 1      header: bit 0 = a session id follows, bits 1.. = its length
//! bytes       the session id (visible ASCII only, else the input is skipped)
//! 4 bytes     timeout_ms (little endian)
//! the rest    the RPC's proto message, decoded with prost
//! ```
//!
//! Properties (each an `assert!`): whatever the edge builds from a message
//! it accepts verifies as a Request of the right kind, with the same routing
//! name, session and timeout; every argument the edge forwards passes the
//! broker's argument check (`write_arguments_json_checked`) unless it nests
//! deeper than the documented bound; and only an empty routing name (which
//! the proto cannot forbid) is refused by verification, as an invalid
//! request.
#![no_main]

use bytes::Bytes;
use mcp_proto::v1 as pb;
use mcp_schema::args::{MAX_JSON_DEPTH, write_arguments_json_checked};
use mcp_schema::client::{Listing, RequestEncoder, RequestHeader};
use mcp_schema::verify::VerifiedRequest;
use mcp_schema::{FrameError, RequestKind, RouteKey};
use prost::Message;

#[path = "../../broker/src/edge/grpc/request.rs"]
#[allow(dead_code)]
mod request;

/// What the frame must say, per the message it came from.
struct Expect<'a> {
    kind: RequestKind,
    /// The routing name, for router-bound kinds.
    name: Option<&'a str>,
    /// The (key, value) arguments forwarded, for CallTool and GetPrompt.
    args: Option<Vec<(&'a str, &'a str)>>,
}

fn check(frame: &[u8], header: &RequestHeader<'_>, want: Expect<'_>) {
    let verified = VerifiedRequest::verify(Bytes::copy_from_slice(frame));
    let req = match verified {
        Ok(r) => r,
        Err(FrameError::InvalidRequest(_)) if want.name == Some("") => return,
        Err(e) => panic!("the edge built a frame that does not verify: {e}"),
    };
    let view = req.view();
    assert_eq!(view.kind(), want.kind);
    assert_eq!(
        view.session_id(),
        header.session_id.filter(|s| !s.is_empty())
    );
    assert_eq!(
        view.timeout_ms(),
        Some(header.timeout_ms).filter(|&t| t > 0)
    );
    if let Some(name) = want.name {
        let got = match view.route_key() {
            RouteKey::Tool(n) | RouteKey::Resource(n) | RouteKey::Prompt(n) => n,
            RouteKey::Completion { name, .. } => name,
            RouteKey::Broker => panic!("a router-bound kind routed to the broker"),
        };
        assert_eq!(got, name);
    }
    if let Some(args) = want.args {
        let kvs = match want.kind {
            RequestKind::CallTool => view.tool_call().map(|t| t.arguments()),
            _ => view
                .request()
                .payload_as_prompt_request()
                .and_then(|p| p.arguments()),
        };
        let got: Vec<(&str, &str)> = kvs
            .iter()
            .flatten()
            .map(|kv| (kv.key(), kv.value().unwrap_or("")))
            .collect();
        assert_eq!(got, args);
        let mut out = Vec::new();
        if let Err(e) = write_arguments_json_checked(kvs, &mut out) {
            let (_, v) = args.iter().find(|(k, _)| *k == e.key).expect("a named key");
            let opens = v.bytes().filter(|&b| b == b'[' || b == b'{').count();
            assert!(
                opens > MAX_JSON_DEPTH,
                "the edge forwarded an invalid value {v:?}"
            );
        }
    }
}

fn run(data: &[u8]) -> Option<()> {
    let (&rpc, rest) = data.split_first()?;
    let (&h, rest) = rest.split_first()?;
    let (session, rest) = if h & 1 == 1 {
        let n = usize::from(h >> 1).min(rest.len());
        let (s, rest) = rest.split_at(n);
        // tonic hands the edge only visible-ASCII metadata values.
        if !s.iter().all(|b| (0x20..0x7f).contains(b)) {
            return None;
        }
        let s = std::str::from_utf8(s).ok()?;
        (Some(request::session_id(s).ok()?), rest)
    } else {
        (None, rest)
    };
    let (t, msg) = rest.split_at_checked(4)?;
    let header = RequestHeader {
        message_id: [7; 16],
        correlation_id: None,
        session_id: session,
        timeout_ms: u32::from_le_bytes(t.try_into().ok()?),
        unix_nanos: 1,
    };
    let mut e = RequestEncoder::new();
    match rpc % 9 {
        0 => {
            let r = pb::CallToolRequest::decode(msg).ok()?;
            let members = request::arguments(r.arguments.as_deref()).ok()?;
            let frame = request::tool_call(&mut e, &header, [3; 16], &r.name, &members);
            let args = members.iter().map(|(k, v)| (k.as_str(), v.get())).collect();
            check(
                frame,
                &header,
                Expect {
                    kind: RequestKind::CallTool,
                    name: Some(&r.name),
                    args: Some(args),
                },
            );
        }
        1 => {
            let r = pb::GetPromptRequest::decode(msg).ok()?;
            let members = request::arguments(r.arguments.as_deref()).ok()?;
            let frame = request::get_prompt(&mut e, &header, &r.name, &members);
            let args = members.iter().map(|(k, v)| (k.as_str(), v.get())).collect();
            check(
                frame,
                &header,
                Expect {
                    kind: RequestKind::GetPrompt,
                    name: Some(&r.name),
                    args: Some(args),
                },
            );
        }
        2 => {
            let r = pb::CompleteRequest::decode(msg).ok()?;
            let (kind, name, arg) = request::completion_target(&r).ok()?;
            let frame = request::complete(&mut e, &header, kind, name, arg);
            check(
                frame,
                &header,
                Expect {
                    kind: RequestKind::Complete,
                    name: Some(name),
                    args: None,
                },
            );
        }
        3 => {
            let r = pb::InitializeRequest::decode(msg).ok()?;
            let frame = request::initialize(&mut e, &header, &r);
            check(
                frame,
                &header,
                Expect {
                    kind: RequestKind::Initialize,
                    name: None,
                    args: None,
                },
            );
        }
        4 => {
            let r = pb::ReadResourceRequest::decode(msg).ok()?;
            let frame = e.read_resource(&header, &r.uri);
            check(
                frame,
                &header,
                Expect {
                    kind: RequestKind::ReadResource,
                    name: Some(&r.uri),
                    args: None,
                },
            );
        }
        5 => {
            let r = pb::SubscribeRequest::decode(msg).ok()?;
            for uri in &r.topics {
                let frame = e.subscribe(&header, uri, true);
                check(
                    frame,
                    &header,
                    Expect {
                        kind: RequestKind::Subscribe,
                        name: Some(uri),
                        args: None,
                    },
                );
            }
        }
        6 => {
            let r = pb::SetLoggingLevelRequest::decode(msg).ok()?;
            let level = request::log_level(r.level).ok()?;
            let frame = e.set_log_level(&header, request::log_level_to_wire(level));
            check(
                frame,
                &header,
                Expect {
                    kind: RequestKind::SetLogLevel,
                    name: None,
                    args: None,
                },
            );
        }
        7 => {
            let r = pb::ListToolsRequest::decode(msg).ok()?;
            let frame = e.list(&header, Listing::Tools, r.cursor.as_deref());
            check(
                frame,
                &header,
                Expect {
                    kind: RequestKind::ListTools,
                    name: None,
                    args: None,
                },
            );
        }
        _ => {
            let r = pb::ListPromptsRequest::decode(msg).ok()?;
            let frame = e.list(&header, Listing::Prompts, r.cursor.as_deref());
            check(
                frame,
                &header,
                Expect {
                    kind: RequestKind::ListPrompts,
                    name: None,
                    args: None,
                },
            );
        }
    }
    Some(())
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = run(data);
});
