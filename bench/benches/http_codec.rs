//! The HTTP edge's JSON-RPC codec (`broker/src/edge/http/jsonrpc.rs`) for
//! one `tools/call` of the `echo` tool, the hot path of every HTTP call:
//!
//! - `parse`: the POST body → a borrowed JSON-RPC message;
//! - `parse_request_frame`: plus its Request frame, with a warmed encoder;
//! - `write_response`: the echo's ToolResult frame → the JSON-RPC answer,
//!   into a warmed `Vec`;
//! - `round_trip`: body in, frame verified as the shard would, answer out;
//! - `route/*` (protocol 2026-07-28, issue 17): picking a `tools/call`'s
//!   route (tool → router in a 64-tool route table) from its `Mcp-Method`
//!   and `Mcp-Name` headers (`route/headers`, plain; `route/headers_base64`,
//!   the `=?base64?…?=` form) against from its parsed body (`route/body`:
//!   the JSON-RPC envelope, then `params.name`, then the same lookup).
//!
//! Before criterion runs, heap allocations per call are counted after a
//! warm-up and printed, and bounded: writing the answer makes none; parsing
//! one (serde_json's stack of enclosing brackets, made afresh by each
//! deserializer that skips a nested value: here the params); the request
//! frame adds the params' own parse and the arguments' two lists (members,
//! and the encoder's key/value pairs).
//!
//! cargo bench -p mcp-bench --bench http_codec [-- route]

use std::hint::black_box;

use bytes::Bytes;
use criterion::{Criterion, criterion_group, criterion_main};
use hyper::header::{HeaderMap, HeaderValue};
use mcp_bench::alloc_counter::{AllocStats, CountingAlloc, count};
use mcp_broker::edge::http::jsonrpc::{
    self, Body, Id, Message, Method, request_frame, write_response,
};
use mcp_broker::edge::http::modern::route_from_headers;
use mcp_broker::route::{RouteTable, RouterEntry};
use mcp_schema::ResponseEncoder;
use mcp_schema::client::{RequestEncoder, RequestHeader};
use mcp_schema::encode::{Correlation, ReplyTo};
use mcp_schema::fb::UUID;
use mcp_schema::verify::VerifiedRequest;

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

const ALLOC_ITERS: u64 = 100_000;
const WARMUP_ITERS: u64 = 10_000;

/// What an MCP client sends to call `echo`: the Python SDK's shape.
const BODY: &[u8] = br#"{"method":"tools/call","params":{"name":"echo","arguments":{"text":"hello from the benchmark","count":3},"_meta":{"progressToken":7}},"jsonrpc":"2.0","id":42}"#;

const HEADER: RequestHeader<'static> = RequestHeader {
    message_id: [7; 16],
    correlation_id: None,
    session_id: Some("0b5c7f3e-6f0a-4d2e-9a51-6c1d2e3f4a5b"),
    timeout_ms: 0,
    unix_nanos: 1_700_000_000_000_000_000,
};

/// The echo router's answer: one text block with the arguments object.
fn echo_result_frame() -> Vec<u8> {
    let mut enc = ResponseEncoder::new(0);
    let to = ReplyTo {
        correlation: Correlation::MessageId([7; 16]),
        session_id: HEADER.session_id,
    };
    enc.tool_text(
        &to,
        &UUID::new(&[7; 16]),
        r#"{"text":"hello from the benchmark","count":3}"#,
        None,
        false,
    )
    .to_vec()
}

fn parse(body: &[u8]) -> usize {
    match jsonrpc::parse(body) {
        Ok(Body::One(Message::Request { id, method, params })) => {
            id.get().len() + method.len() + params.map_or(0, |p| p.get().len())
        }
        other => panic!("expected one request, got {other:?}"),
    }
}

fn parse_request_frame(body: &[u8], enc: &mut RequestEncoder) -> usize {
    let Ok(Body::One(Message::Request { method, params, .. })) = jsonrpc::parse(body) else {
        panic!("expected one request");
    };
    let method = Method::from_name(&method).expect("a routed method");
    let (frame, info) = request_frame(enc, &HEADER, method, params, &[]).expect("valid params");
    frame.len() + info.progress_token.map_or(0, |t| t.get().len())
}

fn round_trip(body: &[u8], enc: &mut RequestEncoder, answer: &[u8], out: &mut Vec<u8>) -> usize {
    let Ok(Body::One(Message::Request { id, method, params })) = jsonrpc::parse(body) else {
        panic!("expected one request");
    };
    let method = Method::from_name(&method).expect("a routed method");
    let (frame, _) = request_frame(enc, &HEADER, method, params, &[]).expect("valid params");
    // The shard verifies what it is handed (this copy stands in for the
    // `Bytes` the edge submits).
    let req = VerifiedRequest::verify(Bytes::copy_from_slice(frame)).expect("verifies");
    black_box(req.view().route_key());
    out.clear();
    write_response(out, &id, method, answer, "2025-06-18");
    out.len()
}

/// A 2026-07-28 `tools/call` as the Python SDK 2.x sends it: `_meta` with
/// the version, capabilities and client info, then the call.
const MODERN_BODY: &[u8] = br#"{"jsonrpc":"2.0","id":42,"method":"tools/call","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{"elicitation":{}},"io.modelcontextprotocol/clientInfo":{"name":"mcp","version":"2.0.0"}},"name":"tool_41","arguments":{"text":"hello from the benchmark","count":3}}}"#;

/// Four routers of 16 tools each (`tool_0` … `tool_63`), as the edge's
/// table holds them.
fn route_table() -> RouteTable {
    use mcp_broker::wasm::types::Tool;
    let entries: Vec<RouterEntry> = (0..4)
        .map(|r| RouterEntry {
            name: format!("r{r}"),
            prefix: None,
            meta: std::sync::Arc::new(mcp_broker::wasm::RouterMeta {
                name: format!("r{r}"),
                tools: (0..16)
                    .map(|t| Tool {
                        name: format!("tool_{}", r * 16 + t),
                        title: None,
                        description: "a tool".into(),
                        input_schema: r#"{"type":"object"}"#.into(),
                        output_schema: None,
                        annotations: None,
                        meta: None,
                    })
                    .collect(),
                ..Default::default()
            }),
        })
        .collect();
    RouteTable::build(&entries, "__").expect("no collisions")
}

/// The standard headers of [`MODERN_BODY`] (`name` as `Mcp-Name`).
fn modern_headers(name: &'static str) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(
        "accept",
        HeaderValue::from_static("application/json, text/event-stream"),
    );
    h.insert("content-type", HeaderValue::from_static("application/json"));
    h.insert(
        "mcp-protocol-version",
        HeaderValue::from_static("2026-07-28"),
    );
    h.insert("mcp-method", HeaderValue::from_static("tools/call"));
    h.insert("mcp-name", HeaderValue::from_static(name));
    h
}

/// The route from the headers: the edge's own function.
fn route_by_headers(h: &HeaderMap, table: &RouteTable) -> usize {
    route_from_headers(h, table).expect("routed").listed
}

/// The route from the body: its envelope parsed, then `params.name`.
fn route_by_body(body: &[u8], table: &RouteTable) -> usize {
    #[derive(serde::Deserialize)]
    struct Name<'a> {
        #[serde(borrow)]
        name: std::borrow::Cow<'a, str>,
    }
    let Ok(Body::One(Message::Request { params, .. })) = jsonrpc::parse(body) else {
        panic!("expected one request");
    };
    let params = params.expect("params");
    let n: Name<'_> = serde_json::from_str(params.get()).expect("a name");
    table.tool(&n.name).expect("routed").listed
}

fn allocs_per_iter(name: &str, mut f: impl FnMut() -> usize) -> AllocStats {
    for _ in 0..WARMUP_ITERS {
        black_box(f());
    }
    let ((), stats) = count(|| {
        for _ in 0..ALLOC_ITERS {
            black_box(f());
        }
    });
    println!(
        "allocations {name:<20} {:.4} per call ({} allocs, {} reallocs, {} bytes over {ALLOC_ITERS} calls)",
        stats.allocating_calls() as f64 / ALLOC_ITERS as f64,
        stats.allocs,
        stats.reallocs,
        stats.bytes,
    );
    stats
}

fn report_allocations(answer: &[u8]) {
    println!(
        "body: {} bytes (tools/call `echo`); answer frame: {} bytes",
        BODY.len(),
        answer.len()
    );
    let p = allocs_per_iter("parse", || parse(BODY));
    let mut enc = RequestEncoder::new();
    let rf = allocs_per_iter("parse_request_frame", || {
        parse_request_frame(BODY, &mut enc)
    });
    let mut out = Vec::with_capacity(1024);
    let id_body = br#"{"jsonrpc":"2.0","id":42,"method":"ping"}"#;
    let Ok(Body::One(Message::Request { id, .. })) = jsonrpc::parse(id_body) else {
        panic!("expected one request");
    };
    let id = Id(id.0);
    let wr = allocs_per_iter("write_response", || {
        out.clear();
        write_response(&mut out, &id, Method::CallTool, answer, "2025-06-18");
        out.len()
    });
    println!("answer: {}", String::from_utf8_lossy(&out));
    assert_eq!(wr.allocating_calls(), 0, "write_response allocated: {wr:?}");
    assert!(
        p.allocating_calls() <= ALLOC_ITERS,
        "parse allocated more than once per call: {p:?}"
    );
    assert!(
        rf.allocating_calls() <= 4 * ALLOC_ITERS,
        "the request frame allocated more than four times per call: {rf:?}"
    );
}

fn bench(c: &mut Criterion) {
    let answer = echo_result_frame();
    report_allocations(&answer);

    let table = route_table();
    let plain = modern_headers("tool_41");
    // "tool_41", base64: what a client sends for a name it must encode.
    let encoded = modern_headers("=?base64?dG9vbF80MQ==?=");
    let listed = route_by_body(MODERN_BODY, &table);
    assert_eq!(route_by_headers(&plain, &table), listed);
    assert_eq!(route_by_headers(&encoded, &table), listed);
    allocs_per_iter("route/headers", || route_by_headers(&plain, &table));
    allocs_per_iter("route/headers_base64", || {
        route_by_headers(&encoded, &table)
    });
    allocs_per_iter("route/body", || route_by_body(MODERN_BODY, &table));
    let mut g = c.benchmark_group("route");
    g.bench_function("headers", |b| {
        b.iter(|| route_by_headers(black_box(&plain), &table))
    });
    g.bench_function("headers_base64", |b| {
        b.iter(|| route_by_headers(black_box(&encoded), &table))
    });
    g.bench_function("body", |b| {
        b.iter(|| route_by_body(black_box(MODERN_BODY), &table))
    });
    g.finish();

    c.bench_function("parse", |b| b.iter(|| parse(black_box(BODY))));
    let mut enc = RequestEncoder::new();
    c.bench_function("parse_request_frame", |b| {
        b.iter(|| parse_request_frame(black_box(BODY), &mut enc))
    });
    let id_body = br#"{"jsonrpc":"2.0","id":42,"method":"ping"}"#;
    let Ok(Body::One(Message::Request { id, .. })) = jsonrpc::parse(id_body) else {
        panic!("expected one request");
    };
    let mut out = Vec::with_capacity(1024);
    c.bench_function("write_response", |b| {
        b.iter(|| {
            out.clear();
            write_response(
                &mut out,
                &id,
                Method::CallTool,
                black_box(&answer),
                "2025-06-18",
            );
            out.len()
        })
    });
    c.bench_function("round_trip", |b| {
        b.iter(|| round_trip(black_box(BODY), &mut enc, &answer, &mut out))
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
