//! The frame codec on the routing path, for one 256-byte ToolCall frame:
//!
//! - `verify_view`: bounded verification + view (header, route key) of a
//!   frame already split off (target ≤ 300 ns);
//! - `split_verify_view`: the same, taking the frame off a receive buffer;
//! - `split_verify_view_args`: plus the arguments JSON into a warmed `Vec`;
//! - `encode_tool_text`: the ToolResult echoing the arguments, with a warmed
//!   `ResponseEncoder`;
//! - `round_trip`: all of it, frame in to response bytes out;
//! - `args_unchecked` / `args_checked`: the arguments object alone, pasted
//!   as sent or with each value checked to be one JSON value (what the
//!   broker runs since issue 18), from an already verified view.
//!
//! Before criterion runs, each step is repeated `ALLOC_ITERS` times after a
//! warm-up under a counting global allocator and its heap allocations per
//! frame are printed (target: 0). The receive buffer's one-off allocation
//! (`BytesMut`'s shared header, made the first time a frame is split off a
//! Vec-backed buffer) is measured and printed separately.
//!
//! cargo bench -p mcp-bench --bench codec

use std::hint::black_box;

use bytes::BytesMut;
use criterion::{Criterion, criterion_group, criterion_main};
use mcp_bench::alloc_counter::{AllocStats, CountingAlloc, count};
use mcp_schema::client::{RequestEncoder, RequestHeader};
use mcp_schema::verify::VerifiedRequest;
use mcp_schema::{
    FrameSplitter, ResponseEncoder, RouteKey, write_arguments_json, write_arguments_json_checked,
};

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

/// Size of the benchmarked frame, length prefix included.
const FRAME_LEN: usize = 256;
/// Frames per simulated socket read: the receive buffer is refilled with
/// this many frames at once, as one `read` of a busy connection would.
const FRAMES_PER_READ: usize = 64;
/// Iterations over which allocations are counted, after the warm-up.
const ALLOC_ITERS: u64 = 100_000;
const WARMUP_ITERS: u64 = 10_000;

/// A ToolCall to `echo` whose frame is exactly `FRAME_LEN` bytes, padding a
/// string argument to get there.
fn tool_call_frame() -> Vec<u8> {
    let mut enc = RequestEncoder::new();
    let header = RequestHeader {
        message_id: *b"\x01\x8f\x3a\x52\x7c\x10\x70\x00\x80\x00\x00\x00\x00\x00\x00\x01",
        correlation_id: Some("req-000001"),
        session_id: None,
        timeout_ms: 0,
        unix_nanos: 1_700_000_000_000_000_000,
    };
    let build = |enc: &mut RequestEncoder, pad: usize| {
        let text = format!("\"{}\"", "x".repeat(pad));
        enc.tool_call(
            &header,
            [7; 16],
            "echo",
            &[("text", text.as_str()), ("count", "3")],
        )
        .to_vec()
    };
    // FlatBuffers pads strings to 4 bytes, so the size moves in steps:
    // find the largest padding that does not exceed the target, then check.
    let pad = (0..FRAME_LEN)
        .take_while(|&p| build(&mut enc, p).len() <= FRAME_LEN)
        .last()
        .expect("an empty argument fits");
    let frame = build(&mut enc, pad);
    assert_eq!(
        frame.len(),
        FRAME_LEN,
        "no padding gives exactly {FRAME_LEN} bytes"
    );
    frame
}

/// A connection's receive buffer refilled from `wire` whenever it runs dry,
/// standing in for the socket read.
struct RecvBuf {
    buf: BytesMut,
    wire: Vec<u8>,
    splitter: FrameSplitter,
}

impl RecvBuf {
    fn new(frame: &[u8]) -> Self {
        let wire = frame.repeat(FRAMES_PER_READ);
        Self {
            buf: BytesMut::with_capacity(wire.len()),
            wire,
            splitter: FrameSplitter::default(),
        }
    }

    fn next(&mut self) -> bytes::Bytes {
        if self.buf.is_empty() {
            // Every frame split off earlier has been dropped, so `reserve`
            // inside this reclaims the same allocation.
            self.buf.extend_from_slice(&self.wire);
        }
        match self.splitter.next_frame(&mut self.buf) {
            Ok(Some(frame)) => frame,
            other => panic!("expected a whole frame, got {other:?}"),
        }
    }
}

/// What routing reads from a view; returned so nothing is optimised away.
fn route(req: &VerifiedRequest) -> usize {
    let view = req.view();
    let key = match view.route_key() {
        RouteKey::Tool(name) => name.len(),
        other => panic!("expected a tool route, got {other:?}"),
    };
    black_box(view.message_id());
    black_box(view.correlation_id());
    black_box(view.session_id());
    black_box(view.reply_to());
    key
}

fn split_verify_view(rx: &mut RecvBuf) -> usize {
    let req = VerifiedRequest::verify(rx.next()).expect("valid frame");
    route(&req)
}

fn split_verify_view_args(rx: &mut RecvBuf, json: &mut Vec<u8>) -> usize {
    let req = VerifiedRequest::verify(rx.next()).expect("valid frame");
    let n = route(&req);
    write_arguments_json(req.view().tool_call().map(|tc| tc.arguments()), json);
    n + json.len()
}

fn round_trip(rx: &mut RecvBuf, json: &mut Vec<u8>, enc: &mut ResponseEncoder) -> usize {
    let req = VerifiedRequest::verify(rx.next()).expect("valid frame");
    route(&req);
    let view = req.view();
    let tc = view.tool_call().expect("a tool call");
    write_arguments_json(Some(tc.arguments()), json);
    let text = std::str::from_utf8(json).expect("UTF-8");
    enc.tool_text(&view.reply_to(), tc.id(), text, None, false)
        .len()
}

/// Allocations per iteration of `f` over `ALLOC_ITERS`, after a warm-up.
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
        "allocations {name:<24} {:.4} per frame ({} allocs, {} reallocs, {} bytes over {ALLOC_ITERS} frames)",
        stats.allocating_calls() as f64 / ALLOC_ITERS as f64,
        stats.allocs,
        stats.reallocs,
        stats.bytes,
    );
    stats
}

/// Reports allocations, then asserts the routing path made none.
fn report_allocations(frame: &[u8]) {
    println!(
        "frame: {} bytes (ToolCall `echo`, 2 arguments)",
        frame.len()
    );

    // The receive buffer's one-off cost: a fresh Vec-backed `BytesMut`
    // allocates a shared header the first time a frame is split off it; the
    // rest of its frames, and all later refills, allocate nothing.
    let mut rx = RecvBuf::new(frame);
    let (_, first) = count(|| split_verify_view(&mut rx));
    let ((), rest) = count(|| {
        for _ in 1..FRAMES_PER_READ {
            black_box(split_verify_view(&mut rx));
        }
    });
    println!(
        "allocations fresh receive buffer: first frame {} allocs ({} bytes), next {} frames {} allocs",
        first.allocating_calls(),
        first.bytes,
        FRAMES_PER_READ - 1,
        rest.allocating_calls(),
    );

    let verified = RecvBuf::new(frame).next();
    let vv = allocs_per_iter("verify_view", || {
        route(&VerifiedRequest::verify(verified.clone()).expect("valid frame"))
    });
    let svv = allocs_per_iter("split_verify_view", || split_verify_view(&mut rx));
    let mut json = Vec::new();
    let svva = allocs_per_iter("split_verify_view_args", || {
        split_verify_view_args(&mut rx, &mut json)
    });
    let req = VerifiedRequest::verify(verified.clone()).expect("valid frame");
    let view = req.view();
    let tc = view.tool_call().expect("a tool call");
    write_arguments_json(Some(tc.arguments()), &mut json);
    let args = String::from_utf8(json.clone()).expect("UTF-8");
    let mut enc = ResponseEncoder::new(0);
    let response_len = enc
        .tool_text(&view.reply_to(), tc.id(), &args, None, false)
        .len();
    println!("response: {response_len} bytes (ToolResult, one text block echoing the arguments)");
    let enc_stats = allocs_per_iter("encode_tool_text", || {
        enc.tool_text(&view.reply_to(), tc.id(), &args, None, false)
            .len()
    });
    let rt = allocs_per_iter("round_trip", || round_trip(&mut rx, &mut json, &mut enc));
    let checked = allocs_per_iter("args_checked", || {
        write_arguments_json_checked(Some(tc.arguments()), &mut json).expect("valid arguments");
        json.len()
    });

    for (name, s) in [
        ("verify_view", vv),
        ("split_verify_view", svv),
        ("split_verify_view_args", svva),
        ("encode_tool_text", enc_stats),
        ("round_trip", rt),
        ("args_checked", checked),
    ] {
        assert_eq!(s.allocating_calls(), 0, "{name} allocated: {s:?}");
    }
}

fn bench(c: &mut Criterion) {
    let frame = tool_call_frame();
    report_allocations(&frame);

    let verified = RecvBuf::new(&frame).next();
    c.bench_function("verify_view", |b| {
        b.iter(|| route(&VerifiedRequest::verify(black_box(&verified).clone()).expect("valid")))
    });

    let mut rx = RecvBuf::new(&frame);
    c.bench_function("split_verify_view", |b| {
        b.iter(|| split_verify_view(&mut rx))
    });

    let mut json = Vec::with_capacity(1024);
    c.bench_function("split_verify_view_args", |b| {
        b.iter(|| split_verify_view_args(&mut rx, &mut json))
    });

    let req = VerifiedRequest::verify(verified.clone()).expect("valid frame");
    let view = req.view();
    let tc = view.tool_call().expect("a tool call");
    write_arguments_json(Some(tc.arguments()), &mut json);
    let args = String::from_utf8(json.clone()).expect("UTF-8");
    let to = view.reply_to();
    let mut enc = ResponseEncoder::new(0);
    c.bench_function("encode_tool_text", |b| {
        b.iter(|| {
            enc.tool_text(black_box(&to), tc.id(), black_box(&args), None, false)
                .len()
        })
    });

    c.bench_function("round_trip", |b| {
        b.iter(|| round_trip(&mut rx, &mut json, &mut enc))
    });

    c.bench_function("args_unchecked", |b| {
        b.iter(|| {
            write_arguments_json(Some(black_box(tc).arguments()), &mut json);
            json.len()
        })
    });
    c.bench_function("args_checked", |b| {
        b.iter(|| {
            write_arguments_json_checked(Some(black_box(tc).arguments()), &mut json)
                .expect("valid arguments");
            json.len()
        })
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
