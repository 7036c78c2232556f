//! Replays fuzz inputs through the exact harness of the `frames` fuzz target
//! (`fuzz/harness.rs`), on the stable toolchain, so that every property the
//! fuzzer checks is also checked by `cargo test`.
//!
//! Every crash input the fuzzer finds is committed under
//! `tests/fixtures/fuzz-regressions/` (named for what it broke) and replayed
//! here; the other tests run the harness over valid and hostile traffic, so
//! the harness's own assertions are exercised even while that directory
//! holds no input.

#[path = "../../fuzz/harness.rs"]
mod harness;

use std::path::Path;

use mcp_schema::client::{Listing, RequestEncoder, RequestHeader};
use mcp_schema::fb::protocol::{CompletionRefKind, LogLevel, ProtocolVersion};

/// A fuzz input: control byte, read sizes, stream (layout in harness.rs).
fn input(max_nibble: u8, cuts: &[u8], stream: &[u8]) -> Vec<u8> {
    let mut v = vec![(max_nibble << 4) | cuts.len() as u8];
    v.extend_from_slice(cuts);
    v.extend_from_slice(stream);
    v
}

/// One frame of every request kind, with and without correlation ids.
fn every_request_kind() -> Vec<Vec<u8>> {
    let corr = RequestHeader {
        message_id: *b"0123456789abcdef",
        correlation_id: Some("corr-1"),
        session_id: Some("sess-1"),
        timeout_ms: 250,
        unix_nanos: 1,
    };
    let bare = RequestHeader {
        message_id: [7; 16],
        ..Default::default()
    };
    let mut e = RequestEncoder::new();
    vec![
        e.tool_call(&corr, [1; 16], "echo", &[("t", "\"hi\""), ("k\"\n", "")])
            .to_vec(),
        e.tool_call(&bare, [2; 16], "kv.get", &[]).to_vec(),
        e.read_resource(&corr, "file:///a").to_vec(),
        e.get_prompt(&bare, "greet", &[("name", "\"Ada\"")])
            .to_vec(),
        e.initialize(&corr, ProtocolVersion::V2025_06_18, "t", "1")
            .to_vec(),
        e.ping(&bare).to_vec(),
        e.list(&corr, Listing::Tools, Some("c")).to_vec(),
        e.list(&bare, Listing::ResourceTemplates, None).to_vec(),
        e.complete(
            &corr,
            CompletionRefKind::Resource,
            "file:///{x}",
            "x",
            "",
            &[],
        )
        .to_vec(),
        e.set_log_level(&bare, LogLevel::Error).to_vec(),
        e.subscribe(&corr, "file:///a", true).to_vec(),
        e.subscribe(&corr, "file:///a", false).to_vec(),
    ]
}

#[test]
fn committed_fuzz_crash_inputs_replay_without_panicking() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/fuzz-regressions");
    // The directory always exists (its README says what goes in it), so a
    // wrong path fails here instead of replaying nothing.
    let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "md") {
            continue;
        }
        let data = std::fs::read(&path).unwrap();
        // A panic names the input; the harness asserts the rest.
        eprintln!("replaying {}", path.display());
        harness::run(&data);
    }
}

#[test]
fn every_request_kind_passes_the_harness_whole_and_in_chunks() {
    let frames = every_request_kind();
    for f in &frames {
        harness::run(&input(0, &[], f));
    }
    let stream = frames.concat();
    for cuts in [&[][..], &[0], &[3, 17, 255], &[1, 0, 6, 254, 9]] {
        harness::run(&input(0, cuts, &stream));
    }
    // Truncated stream: the last frame never completes.
    harness::run(&input(0, &[5], &stream[..stream.len() - 3]));
}

#[test]
fn oversized_and_garbage_streams_pass_the_harness() {
    let frames = every_request_kind();
    let stream = frames.concat();
    // 64-byte maximum (16 << 2): the first frame is already too large.
    harness::run(&input(2, &[7], &stream));
    let mut bad = frames[0].clone();
    bad.extend_from_slice(&u32::MAX.to_le_bytes());
    harness::run(&input(0, &[2], &bad));
    // A valid prefix around a body that is not a Request.
    let mut garbage = 12u32.to_le_bytes().to_vec();
    garbage.extend_from_slice(&[0xff; 12]);
    harness::run(&input(0, &[], &garbage));
    harness::run(&[]);
    harness::run(&[0x0f]);
}
