//! Round trips and bad inputs through split → verify → view → encode.

use bytes::{Bytes, BytesMut};
use mcp_schema::client::{Listing, RequestEncoder, RequestHeader, ResponseView};
use mcp_schema::content_vec::{self, ContentRef};
use mcp_schema::encode::Correlation;
use mcp_schema::fb::protocol::{CompletionRefKind, ProtocolVersion, ResponsePayload};
use mcp_schema::verify::{
    VerifiedRequest, header_of_invalid, response_payload_type, verify_response,
};
use mcp_schema::{
    ErrorCode, FrameError, FrameSplitter, RequestKind, ResponseEncoder, RouteKey,
    write_arguments_json,
};
use proptest::prelude::*;

const ID: [u8; 16] = [0x11; 16];

fn header<'a>(correlation: Option<&'a str>, session: Option<&'a str>) -> RequestHeader<'a> {
    RequestHeader {
        message_id: ID,
        correlation_id: correlation,
        session_id: session,
        timeout_ms: 0,
        unix_nanos: 1_700_000_000_000_000_000,
    }
}

fn split_one(frame: &[u8]) -> Bytes {
    let mut buf = BytesMut::from(frame);
    let f = FrameSplitter::default()
        .next_frame(&mut buf)
        .unwrap()
        .unwrap();
    assert!(buf.is_empty());
    f
}

fn verify(frame: &[u8]) -> Result<VerifiedRequest, FrameError> {
    VerifiedRequest::verify(split_one(frame))
}

#[test]
fn tool_call_round_trip_reads_header_key_and_arguments() {
    let mut enc = RequestEncoder::new();
    let frame = enc
        .tool_call(
            &header(Some("c-1"), Some("s-9")),
            [7; 16],
            "echo",
            &[("text", "\"hello\""), ("n", "42")],
        )
        .to_vec();
    let req = verify(&frame).unwrap();
    let v = req.view();
    assert_eq!(v.kind(), RequestKind::CallTool);
    assert_eq!(v.route_key(), RouteKey::Tool("echo"));
    assert_eq!(v.message_id(), &ID);
    assert_eq!(v.correlation_id(), Some("c-1"));
    assert_eq!(v.session_id(), Some("s-9"));
    let tc = v.tool_call().unwrap();
    assert_eq!(tc.id().0, [7; 16]);
    let mut json = Vec::new();
    write_arguments_json(Some(tc.arguments()), &mut json);
    let parsed: serde_json::Value = serde_json::from_slice(&json).unwrap();
    assert_eq!(parsed, serde_json::json!({"text": "hello", "n": 42}));
}

#[test]
fn every_request_kind_classifies_with_its_route_key() {
    let mut enc = RequestEncoder::new();
    let h = header(None, None);
    let cases: Vec<(Vec<u8>, RequestKind, RouteKey<'static>)> = vec![
        (
            enc.read_resource(&h, "kv://a").to_vec(),
            RequestKind::ReadResource,
            RouteKey::Resource("kv://a"),
        ),
        (
            enc.get_prompt(&h, "greet", &[("name", "\"x\"")]).to_vec(),
            RequestKind::GetPrompt,
            RouteKey::Prompt("greet"),
        ),
        (
            enc.initialize(&h, ProtocolVersion::V2025_06_18, "t", "1")
                .to_vec(),
            RequestKind::Initialize,
            RouteKey::Broker,
        ),
        (enc.ping(&h).to_vec(), RequestKind::Ping, RouteKey::Broker),
        (
            enc.list(&h, Listing::Tools, None).to_vec(),
            RequestKind::ListTools,
            RouteKey::Broker,
        ),
        (
            enc.list(&h, Listing::Resources, Some("c")).to_vec(),
            RequestKind::ListResources,
            RouteKey::Broker,
        ),
        (
            enc.list(&h, Listing::ResourceTemplates, None).to_vec(),
            RequestKind::ListResourceTemplates,
            RouteKey::Broker,
        ),
        (
            enc.list(&h, Listing::Prompts, None).to_vec(),
            RequestKind::ListPrompts,
            RouteKey::Broker,
        ),
        (
            enc.complete(
                &h,
                CompletionRefKind::Prompt,
                "greet",
                "name",
                "al",
                &[("lang", "\"en\"")],
            )
            .to_vec(),
            RequestKind::Complete,
            RouteKey::Completion {
                kind: CompletionRefKind::Prompt,
                name: "greet",
            },
        ),
        (
            enc.set_log_level(&h, mcp_schema::fb::protocol::LogLevel::Info)
                .to_vec(),
            RequestKind::SetLogLevel,
            RouteKey::Broker,
        ),
        (
            enc.subscribe(&h, "kv://a", true).to_vec(),
            RequestKind::Subscribe,
            RouteKey::Resource("kv://a"),
        ),
        (
            enc.subscribe(&h, "kv://a", false).to_vec(),
            RequestKind::Unsubscribe,
            RouteKey::Resource("kv://a"),
        ),
    ];
    for (frame, kind, key) in cases {
        let req = verify(&frame).unwrap();
        assert_eq!(req.view().kind(), kind);
        assert_eq!(req.view().route_key(), key);
    }
}

#[test]
fn response_correlates_by_correlation_id_else_message_id() {
    let mut enc = RequestEncoder::new();
    let mut out = ResponseEncoder::new(0);

    let with = verify(enc.ping(&header(Some("abc"), Some("sess")))).unwrap();
    let resp = out.pong(&with.view().reply_to()).to_vec();
    let r = ResponseView::parse(&resp).unwrap();
    assert_eq!(r.correlation_id(), "abc");
    assert_eq!(r.response.header().session_id(), Some("sess"));
    assert_eq!(r.payload_type(), ResponsePayload::PingResponse);

    let without = verify(enc.ping(&header(Some(""), None))).unwrap();
    assert_eq!(
        without.view().reply_to().correlation,
        Correlation::MessageId(ID)
    );
    let resp = out.pong(&without.view().reply_to()).to_vec();
    let r = ResponseView::parse(&resp).unwrap();
    assert_eq!(r.correlation_id(), "11111111-1111-1111-1111-111111111111");
    assert_eq!(r.response.header().session_id(), None);
}

/// The answer to a call (id `[3; 16]`) of `echo`: one text block.
fn text_result(text: &str, structured: Option<&str>) -> Vec<u8> {
    let mut enc = RequestEncoder::new();
    let req = verify(enc.tool_call(&header(Some("c"), None), [3; 16], "echo", &[])).unwrap();
    let v = req.view();
    let mut out = ResponseEncoder::new(1);
    out.tool_text(
        &v.reply_to(),
        v.tool_call().unwrap().id(),
        text,
        structured,
        false,
    )
    .to_vec()
}

#[test]
fn tool_text_result_carries_call_id_content_and_structured_output() {
    let frame = text_result("hi", Some("{\"a\":1}"));
    let r = ResponseView::parse(&frame).unwrap();
    let tr = r.response.payload_as_tool_result().unwrap();
    assert_eq!(tr.tool_call_id().0, [3; 16]);
    assert!(tr.success() && !tr.is_error() && r.response.success());
    assert_eq!(tr.structured_content(), Some("{\"a\":1}"));
    let content = content_vec::content(&tr).unwrap();
    assert_eq!(content.len(), 1);
    match content.get(0) {
        ContentRef::Text(t) => assert_eq!(t.text(), "hi"),
        other => panic!("expected text, got {other:?}"),
    }
}

#[test]
fn error_response_carries_code_message_and_data() {
    let mut out = ResponseEncoder::new(2);
    let to = mcp_schema::encode::ReplyTo {
        correlation: Correlation::Text("x"),
        session_id: None,
    };
    let frame = out
        .error(
            &to,
            ErrorCode::Overloaded,
            "queue full",
            Some("{\"retry_ms\":5}"),
        )
        .to_vec();
    let r = ResponseView::parse(&frame).unwrap();
    assert_eq!(r.error(), Some((-32000, "queue full")));
    assert!(!r.response.success());
    assert_eq!(
        r.response
            .payload_as_error_response()
            .unwrap()
            .error()
            .data(),
        Some("{\"retry_ms\":5}")
    );
}

#[test]
fn the_shallow_payload_type_agrees_with_the_full_view_and_checks_only_the_root() {
    let frame = text_result("SPOIL-ME", None);
    assert_eq!(
        response_payload_type(&frame).unwrap(),
        ResponsePayload::ToolResult
    );
    let to = mcp_schema::encode::ReplyTo {
        correlation: Correlation::Text("c"),
        session_id: None,
    };
    let err = ResponseEncoder::new(1)
        .error(&to, ErrorCode::Overloaded, "full", None)
        .to_vec();
    assert_eq!(
        response_payload_type(&err).unwrap(),
        ResponsePayload::ErrorResponse
    );
    // A payload spoilt below the root: the full verification refuses it,
    // the shallow look (which reads only the root's payload type) does not,
    // which is why the edges verify a frame fully before reading more.
    let mut spoilt = frame.clone();
    let at = spoilt
        .windows(8)
        .position(|w| w == b"SPOIL-ME")
        .expect("the text is in the frame");
    spoilt[at] = 0xff;
    assert!(verify_response(&spoilt).is_err());
    assert_eq!(
        response_payload_type(&spoilt).unwrap(),
        ResponsePayload::ToolResult
    );
    // Not a table at the root: refused.
    assert!(response_payload_type(b"\x08\0\0\0garbage!").is_err());
    assert!(response_payload_type(&frame[..6]).is_err());
    assert!(response_payload_type(&[]).is_err());
}

// ---------------------------------------------------------------- bad input

fn valid_tool_call() -> Vec<u8> {
    RequestEncoder::new()
        .tool_call(
            &header(Some("corr-7"), None),
            [1; 16],
            "XXtool",
            &[("k", "1")],
        )
        .to_vec()
}

#[test]
fn truncated_frames_wait_for_more_bytes_and_never_misparse() {
    let frame = valid_tool_call();
    let s = FrameSplitter::default();
    for cut in 0..frame.len() {
        let mut buf = BytesMut::from(&frame[..cut]);
        assert!(s.next_frame(&mut buf).unwrap().is_none(), "cut {cut}");
    }
    // A body cut short but re-prefixed with its shorter length is complete as
    // a frame, and must fail verification, never panic.
    for cut in 4..frame.len() {
        let mut f = frame[..cut].to_vec();
        f[..4].copy_from_slice(&((cut - 4) as u32).to_le_bytes());
        let _ = verify(&f);
    }
}

#[test]
fn u32_max_length_prefix_is_fatal_before_allocation() {
    let mut buf = BytesMut::from(&[0xff, 0xff, 0xff, 0xff, 1, 2][..]);
    let err = FrameSplitter::default().next_frame(&mut buf).unwrap_err();
    assert!(err.is_fatal());
    assert_eq!(err.code(), ErrorCode::InvalidRequest);
}

/// The seed schema has no file identifier, so a frame of the wrong root type
/// cannot always be told apart: a Response is rejected when its layout
/// conflicts with the Request it is read as (a ToolResult read as a
/// ToolCall), and otherwise reads as some well-formed Request, which the
/// broker answers like any other. Either way: no panic, one answer.
#[test]
fn response_frame_sent_as_request_is_rejected_or_read_as_a_valid_request() {
    let mut out = ResponseEncoder::new(0);
    let to = mcp_schema::encode::ReplyTo {
        correlation: Correlation::Text("r"),
        session_id: None,
    };
    let tool_result = out
        .tool_text(&to, &mcp_schema::fb::UUID::new(&[2; 16]), "t", None, false)
        .to_vec();
    let err = verify(&tool_result).unwrap_err();
    assert_eq!(err.code(), ErrorCode::ParseError, "{err}");

    // ErrorResponse{error: Error} has the shape of
    // InitializeRequest{client_capabilities: ClientCapabilities}.
    let error = out.error(&to, ErrorCode::Internal, "x", None).to_vec();
    let req = verify(&error).expect("layout-compatible");
    assert_eq!(req.view().kind(), RequestKind::Initialize);
    assert_eq!(req.view().correlation_id(), Some("r"));
}

#[test]
fn out_of_bounds_root_offset_is_a_parse_error() {
    let mut f = valid_tool_call();
    f[4..8].copy_from_slice(&0x7fff_fff0u32.to_le_bytes());
    let err = verify(&f).unwrap_err();
    assert_eq!(err.code(), ErrorCode::ParseError);
    assert!(header_of_invalid(&f).is_none());
}

#[test]
fn invalid_utf8_in_a_string_is_a_parse_error_but_header_is_recovered() {
    let mut f = valid_tool_call();
    let at = f.windows(6).position(|w| w == b"XXtool").unwrap();
    f[at] = 0xff;
    f[at + 1] = 0xfe;
    let err = verify(&f).unwrap_err();
    assert_eq!(err.code(), ErrorCode::ParseError, "{err}");
    let h = header_of_invalid(&f).expect("the header itself is intact");
    assert_eq!(h.correlation_id(), Some("corr-7"));
}

#[test]
fn missing_required_header_is_a_parse_error() {
    use flatbuffers::FlatBufferBuilder;
    use mcp_schema::fb::protocol::{
        PingRequest, PingRequestArgs, Request, RequestArgs, RequestPayload,
    };
    let mut fbb = FlatBufferBuilder::new();
    let p = PingRequest::create(&mut fbb, &PingRequestArgs {});
    // Build the table by hand: `Request::create` would not let us omit the
    // required header.
    let start = fbb.start_table();
    fbb.push_slot_always(Request::VT_PAYLOAD, p.as_union_value());
    fbb.push_slot::<RequestPayload>(
        Request::VT_PAYLOAD_TYPE,
        RequestPayload::PingRequest,
        RequestPayload::NONE,
    );
    let root = fbb.end_table(start);
    fbb.finish_size_prefixed(flatbuffers::WIPOffset::<Request>::new(root.value()), None);
    let _ = RequestArgs::default();
    let err = verify(fbb.finished_data()).unwrap_err();
    assert_eq!(err.code(), ErrorCode::ParseError);
    assert!(err.to_string().contains("header"), "{err}");
}

#[test]
fn empty_tool_name_is_an_invalid_request() {
    let f = RequestEncoder::new()
        .tool_call(&header(None, None), [1; 16], "", &[])
        .to_vec();
    let err = verify(&f).unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidRequest);
}

#[test]
fn unknown_payload_type_from_a_newer_client_is_not_found() {
    let mut f = RequestEncoder::new().ping(&header(None, None)).to_vec();
    // Rewrite the payload_type byte (slot 1 of the root) to an unknown tag.
    let root = 4 + u32::from_le_bytes(f[4..8].try_into().unwrap()) as usize;
    let vt =
        (root as i64 - i32::from_le_bytes(f[root..root + 4].try_into().unwrap()) as i64) as usize;
    let field = u16::from_le_bytes(f[vt + 6..vt + 8].try_into().unwrap()) as usize;
    assert_eq!(f[root + field], 5, "PingRequest tag");
    f[root + field] = 200;
    let err = verify(&f).unwrap_err();
    assert!(matches!(err, FrameError::UnsupportedPayload(200)), "{err}");
    assert_eq!(err.code(), ErrorCode::NotFound);
}

#[test]
fn shared_subobject_amplification_is_rejected() {
    use flatbuffers::{FlatBufferBuilder, WIPOffset};
    use mcp_schema::fb::protocol::{
        MessageHeader, MessageHeaderArgs, Request, RequestArgs, RequestPayload, ToolCall,
        ToolCallArgs,
    };
    use mcp_schema::fb::{KeyValue, KeyValueArgs, UUID};
    // One KeyValue with a 4 KiB value, referenced 1,000 times: a 12 KiB frame
    // that expands to 4 MiB if every reference is followed.
    let mut fbb = FlatBufferBuilder::new();
    let big = fbb.create_string(&"x".repeat(4096));
    let key = fbb.create_string("k");
    let kv = KeyValue::create(
        &mut fbb,
        &KeyValueArgs {
            key: Some(key),
            value: Some(big),
        },
    );
    let refs: Vec<WIPOffset<KeyValue>> = vec![kv; 1000];
    let args = fbb.create_vector(&refs);
    let name = fbb.create_string("echo");
    let id = UUID::new(&[1; 16]);
    let tc = ToolCall::create(
        &mut fbb,
        &ToolCallArgs {
            id: Some(&id),
            tool_name: Some(name),
            arguments: Some(args),
            timestamp: None,
        },
    );
    let h = MessageHeader::create(
        &mut fbb,
        &MessageHeaderArgs {
            message_id: Some(&id),
            timestamp: Some(&mcp_schema::fb::Timestamp::new(0)),
            ..Default::default()
        },
    );
    let r = Request::create(
        &mut fbb,
        &RequestArgs {
            header: Some(h),
            payload_type: RequestPayload::ToolCall,
            payload: Some(tc.as_union_value()),
        },
    );
    fbb.finish_size_prefixed(r, None);
    let err = verify(fbb.finished_data()).unwrap_err();
    assert_eq!(err.code(), ErrorCode::ParseError);
    assert!(err.to_string().to_lowercase().contains("apparent"), "{err}");
}

proptest! {
    /// Arbitrary names, ids and argument lists survive encode → split →
    /// verify → view, and the arguments object parses to what was sent.
    #[test]
    fn arbitrary_tool_calls_round_trip(
        name in "[^\u{0}]{1,40}",
        corr in proptest::option::of("[a-z0-9-]{0,40}"),
        session in proptest::option::of("[a-zA-Z0-9]{1,20}"),
        args in prop::collection::btree_map(any::<String>(), any::<i64>(), 0..8),
        id in any::<[u8; 16]>(),
    ) {
        let values: Vec<(String, String)> = args.iter().map(|(k, v)| (k.clone(), v.to_string())).collect();
        let pairs: Vec<(&str, &str)> = values.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let h = RequestHeader { message_id: id, correlation_id: corr.as_deref(), session_id: session.as_deref(), timeout_ms: 0, unix_nanos: 0 };
        let frame = RequestEncoder::new().tool_call(&h, id, &name, &pairs).to_vec();
        let req = verify(&frame).unwrap();
        let v = req.view();
        prop_assert_eq!(v.route_key(), RouteKey::Tool(&name));
        prop_assert_eq!(v.correlation_id(), corr.as_deref().filter(|c| !c.is_empty()));
        let mut json = Vec::new();
        write_arguments_json(Some(v.tool_call().unwrap().arguments()), &mut json);
        let parsed: std::collections::BTreeMap<String, i64> = serde_json::from_slice(&json).unwrap();
        prop_assert_eq!(parsed, args);

        let mut out = ResponseEncoder::new(0);
        let resp = out.tool_text(&v.reply_to(), v.tool_call().unwrap().id(), &name, None, false).to_vec();
        let r = ResponseView::parse(&resp).unwrap();
        let mut text = [0u8; 36];
        let expect = match corr.as_deref().filter(|c| !c.is_empty()) {
            Some(c) => c.to_string(),
            None => mcp_schema::uuid::hyphenated(&id, &mut text).to_string(),
        };
        prop_assert_eq!(r.correlation_id(), expect.as_str());
    }

    /// No byte string makes verification panic.
    #[test]
    fn arbitrary_bytes_never_panic(body in prop::collection::vec(any::<u8>(), 0..512)) {
        let mut f = (body.len() as u32).to_le_bytes().to_vec();
        f.extend_from_slice(&body);
        if let Err(e) = verify(&f) {
            let _ = header_of_invalid(&f);
            let _ = e.code();
        }
        // The shallow look never panics either, and never disagrees with
        // the full verification when that passes.
        let shallow = response_payload_type(&f);
        if let Ok(r) = verify_response(&f) {
            prop_assert_eq!(shallow.ok(), Some(r.payload_type()));
        }
    }
}

/// The edges' own frames skip the verifier (`from_encoder`,
/// `built_response`): they read the same as verified ones, the routing
/// checks still refuse an empty name, and a debug build (every test run)
/// still verifies them, so a frame spoilt after encoding is caught.
#[test]
fn frames_from_the_encoders_read_as_verified_ones() {
    let mut enc = RequestEncoder::new();
    let frame = enc
        .tool_call(&header(Some("c-2"), None), [5; 16], "echo", &[("n", "1")])
        .to_vec();
    // SAFETY: exactly what `tool_call` returned.
    let own = unsafe { VerifiedRequest::from_encoder(Bytes::from(frame.clone())) }.unwrap();
    let checked = verify(&frame).unwrap();
    assert_eq!(own.view().kind(), checked.view().kind());
    assert_eq!(own.view().route_key(), RouteKey::Tool("echo"));
    assert_eq!(own.view().correlation_id(), Some("c-2"));

    let empty = enc
        .tool_call(&header(None, None), [1; 16], "", &[])
        .to_vec();
    // SAFETY: exactly what `tool_call` returned.
    let refused = unsafe { VerifiedRequest::from_encoder(Bytes::from(empty)) };
    assert!(matches!(refused, Err(FrameError::InvalidRequest(_))));

    let answer = text_result("hi", None);
    // SAFETY: exactly what `tool_text` returned.
    let r = unsafe { mcp_schema::verify::built_response(&answer) };
    assert_eq!(r.payload_type(), ResponsePayload::ToolResult);
    let tr = r.payload_as_tool_result().unwrap();
    assert_eq!(tr.tool_call_id().0, [3; 16]);
    // SAFETY: `tr` is of a Response read by `built_response` from an
    // encoder's output.
    let blocks = unsafe { content_vec::content_unchecked(&tr) };
    assert_eq!(blocks.len(), content_vec::content(&tr).unwrap().len());
    match blocks.get(0) {
        ContentRef::Text(t) => assert_eq!(t.text(), "hi"),
        other => panic!("expected text, got {other:?}"),
    }
}

#[test]
#[cfg(debug_assertions)]
#[should_panic(expected = "fails verification")]
fn a_spoilt_frame_passed_as_the_encoders_own_panics_in_debug_builds() {
    let mut frame = valid_tool_call();
    // The root offset now points past the end.
    frame[4] = 0xff;
    frame[5] = 0xff;
    // Deliberately breaks the contract: the debug check must catch it.
    let _ = unsafe { VerifiedRequest::from_encoder(Bytes::from(frame)) };
}
