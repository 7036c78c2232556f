//! Writes the seed corpus for the `frames` target into `fuzz/corpus/frames/`
//! (gitignored): one valid frame of every request kind, a few Responses for
//! the client-side path, multi-frame streams with chunked reads, and inputs
//! that hit the size limit. Starting from valid frames lets the fuzzer reach
//! the view and encoder instead of spending its time failing verification.
//!
//! cargo +nightly run --manifest-path fuzz/Cargo.toml --bin seed_corpus

use std::path::PathBuf;

use mcp_schema::client::{Listing, RequestEncoder, RequestHeader};
use mcp_schema::content_vec::{ToolResultParts, create_tool_result};
use mcp_schema::encode::ReplyTo;
use mcp_schema::fb::UUID;
use mcp_schema::fb::protocol::{
    CompletionRefKind, Content, ImageContent, ImageContentArgs, LogLevel, ProtocolVersion,
    ResourceContent, ResourceContentArgs, ResponsePayload, TextContent, TextContentArgs,
};
use mcp_schema::{Correlation, ErrorCode, ResponseEncoder};

/// One fuzz input: `ctrl`, the read sizes, the stream (see harness.rs).
fn input(max_nibble: u8, cuts: &[u8], stream: &[u8]) -> Vec<u8> {
    assert!(max_nibble < 16 && cuts.len() < 16);
    let mut v = vec![(max_nibble << 4) | cuts.len() as u8];
    v.extend_from_slice(cuts);
    v.extend_from_slice(stream);
    v
}

fn main() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("corpus/frames");
    std::fs::create_dir_all(&dir).unwrap();

    let with_corr = RequestHeader {
        message_id: *b"0123456789abcdef",
        correlation_id: Some("corr-1"),
        session_id: Some("sess-1"),
        timeout_ms: 250,
        unix_nanos: 1_700_000_000_000_000_000,
    };
    let bare = RequestHeader {
        message_id: [7; 16],
        ..Default::default()
    };

    let mut e = RequestEncoder::new();
    let mut frames: Vec<Vec<u8>> = vec![
        e.tool_call(
            &with_corr,
            [1; 16],
            "echo",
            &[
                ("text", "\"hello\""),
                ("n", "42"),
                ("obj", "{\"a\":[1,2]}"),
                ("k\"ey", ""),
            ],
        )
        .to_vec(),
        e.tool_call(&bare, [2; 16], "kv.get", &[]).to_vec(),
        e.read_resource(&with_corr, "file:///etc/motd").to_vec(),
        e.get_prompt(&bare, "greet", &[("name", "\"Ada\"")])
            .to_vec(),
        e.initialize(&with_corr, ProtocolVersion::V2025_06_18, "fuzz", "1.0")
            .to_vec(),
        e.ping(&bare).to_vec(),
        e.list(&with_corr, Listing::Tools, Some("cursor")).to_vec(),
        e.list(&bare, Listing::Resources, None).to_vec(),
        e.list(&bare, Listing::ResourceTemplates, None).to_vec(),
        e.list(&bare, Listing::Prompts, None).to_vec(),
        e.complete(&with_corr, CompletionRefKind::Prompt, "greet", "name", "A", &[])
            .to_vec(),
        e.set_log_level(&bare, LogLevel::Warning).to_vec(),
        e.subscribe(&with_corr, "file:///tmp/x", true).to_vec(),
        e.subscribe(&with_corr, "file:///tmp/x", false).to_vec(),
    ];

    // Responses, for the client-side path.
    let mut r = ResponseEncoder::new(0);
    let to = ReplyTo {
        correlation: Correlation::Text("corr-1"),
        session_id: Some("sess-1"),
    };
    frames.push(
        r.tool_text(&to, &UUID::new(&[1; 16]), "hi", Some("{}"), false)
            .to_vec(),
    );
    let to_id = ReplyTo {
        correlation: Correlation::MessageId([7; 16]),
        session_id: None,
    };
    frames.push(
        r.error(&to_id, ErrorCode::NotFound, "no such tool", None)
            .to_vec(),
    );
    let fbb = r.begin();
    let t = fbb.create_string("text");
    let text = TextContent::create(
        fbb,
        &TextContentArgs {
            text: Some(t),
            annotations: None,
        },
    );
    let (d, m) = (fbb.create_string("AAAA"), fbb.create_string("image/png"));
    let image = ImageContent::create(
        fbb,
        &ImageContentArgs {
            data: Some(d),
            mime_type: Some(m),
            annotations: None,
        },
    );
    let u = fbb.create_string("file:///a");
    let res = ResourceContent::create(
        fbb,
        &ResourceContentArgs {
            uri: Some(u),
            ..Default::default()
        },
    );
    let content = [
        (Content::TextContent, text.as_union_value()),
        (Content::ImageContent, image.as_union_value()),
        (Content::ResourceContent, res.as_union_value()),
    ];
    let tr = create_tool_result(
        fbb,
        &ToolResultParts {
            tool_call_id: UUID::new(&[3; 16]),
            success: true,
            content: &content,
            ..Default::default()
        },
    );
    frames.push(
        r.finish(&to, ResponsePayload::ToolResult, tr.as_union_value(), true)
            .to_vec(),
    );

    let mut n = 0;
    let mut write = |bytes: Vec<u8>| {
        std::fs::write(dir.join(format!("seed-{n:03}")), bytes).unwrap();
        n += 1;
    };
    for f in &frames {
        write(input(0, &[], f));
    }
    let stream: Vec<u8> = frames.concat();
    write(input(0, &[], &stream));
    write(input(0, &[0, 3, 17, 255, 1], &stream));
    // Truncated: the last frame is cut short.
    write(input(0, &[6], &stream[..stream.len() - 5]));
    // A 256-byte maximum (16 << 4): the big frames are fatal.
    write(input(4, &[31], &stream));
    // u32::MAX prefix after a valid frame.
    let mut bad = frames[0].clone();
    bad.extend_from_slice(&u32::MAX.to_le_bytes());
    write(input(0, &[2], &bad));
    println!("wrote {n} inputs to {}", dir.display());
    args_seeds();
    grpc_convert_seeds();
}

/// Writes `inputs` as `fuzz/corpus/<target>/seed-NNN`.
fn write_all(target: &str, inputs: &[Vec<u8>]) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("corpus")
        .join(target);
    std::fs::create_dir_all(&dir).unwrap();
    for (i, bytes) in inputs.iter().enumerate() {
        std::fs::write(dir.join(format!("seed-{i:03}")), bytes).unwrap();
    }
    println!("wrote {} inputs to {}", inputs.len(), dir.display());
}

/// `args`: (key, value) fields separated by 0xFF: every JSON kind, nested
/// values, whitespace, empty values, and the injections the check refuses.
fn args_seeds() {
    let pairs: &[&[(&str, &str)]] = &[
        &[("text", "\"hello\""), ("count", "3")],
        &[("a", " -0.5e+10 "), ("b", "true"), ("c", "null"), ("d", "")],
        &[("o", r#"{"k":[1,{"x":"\u00e9\n"}],"e":{}}"#), ("l", "[ ]")],
        &[("a", r#"1,"admin":true"#)],
        &[("a", r#""x"}, {"y":1"#), ("b", "1 2")],
        &[("deep", "[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]")],
        &[("bad escape", r#""\x""#), ("raw tab", "\"a\tb\"")],
    ];
    let inputs: Vec<Vec<u8>> = pairs
        .iter()
        .map(|kvs| {
            let mut v = Vec::new();
            for (i, (k, val)) in kvs.iter().enumerate() {
                if i > 0 {
                    v.push(0xff);
                }
                v.extend_from_slice(k.as_bytes());
                v.push(0xff);
                v.extend_from_slice(val.as_bytes());
            }
            v
        })
        .collect();
    write_all("args", &inputs);
}

/// `grpc_convert`: one valid message of each RPC the target knows, with and
/// without a session (layout in fuzz_targets/grpc_convert.rs).
fn grpc_convert_seeds() {
    use mcp_proto::v1 as pb;
    use prost::Message;
    let msgs: Vec<(u8, Vec<u8>)> = vec![
        (
            0,
            pb::CallToolRequest {
                name: "echo".into(),
                arguments: Some(br#"{"text":"hi","n":[1,2.5,{"x":null}]}"#.to_vec()),
            }
            .encode_to_vec(),
        ),
        (
            1,
            pb::GetPromptRequest {
                name: "summarize_book".into(),
                arguments: Some(br#"{"a":"{{b}}","b":"x"}"#.to_vec()),
            }
            .encode_to_vec(),
        ),
        (
            2,
            pb::CompleteRequest {
                r#ref: Some(pb::CompletionReference {
                    reference: Some(pb::completion_reference::Reference::Prompt(
                        pb::PromptReference { name: "p".into() },
                    )),
                }),
                argument: Some(pb::CompletionArgument {
                    name: "a".into(),
                    value: "v".into(),
                }),
            }
            .encode_to_vec(),
        ),
        (
            3,
            pb::InitializeRequest {
                protocol_version: "2025-06-18".into(),
                capabilities: None,
                client_info: None,
            }
            .encode_to_vec(),
        ),
        (
            4,
            pb::ReadResourceRequest {
                uri: "kv://a".into(),
            }
            .encode_to_vec(),
        ),
        (
            5,
            pb::SubscribeRequest {
                topics: vec!["kv://a".into(), "progress".into()],
            }
            .encode_to_vec(),
        ),
        (6, pb::SetLoggingLevelRequest { level: 2 }.encode_to_vec()),
        (
            7,
            pb::ListToolsRequest {
                cursor: Some("o100".into()),
            }
            .encode_to_vec(),
        ),
    ];
    let mut inputs = Vec::new();
    for (rpc, msg) in msgs {
        for session in [None, Some("0190a7b2-7c10-7000-8000-000000000001")] {
            let mut v = vec![rpc];
            match session {
                Some(s) => {
                    v.push(((s.len() as u8) << 1) | 1);
                    v.extend_from_slice(s.as_bytes());
                }
                None => v.push(0),
            }
            v.extend_from_slice(&250u32.to_le_bytes());
            v.extend_from_slice(&msg);
            inputs.push(v);
        }
    }
    write_all("grpc_convert", &inputs);
}
