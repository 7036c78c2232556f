//! libFuzzer target: ToolCall arguments → the checked concatenation into the
//! router's JSON object (`mcp_schema::args`).
//!
//! Input: fields separated by the byte 0xFF (never part of UTF-8), taken in
//! pairs as (key, value); a field that is not UTF-8 ends the list. The
//! pairs go into a real ToolCall frame (encoded, verified, read back through
//! the view), as the broker receives them.
//!
//! Properties (each an `assert!`):
//! - `is_one_json_value` agrees with serde_json (skipping one value) on
//!   every value, up to the documented nesting bound;
//! - when every value passes, the checked writer succeeds and its output is
//!   one JSON object with exactly the input's keys, in order, each value's
//!   text as sent (`null` for an empty one);
//! - when a value fails, the writer refuses and names the first such key.
#![no_main]

use std::fmt;

use mcp_schema::args::{MAX_JSON_DEPTH, is_one_json_value, write_arguments_json_checked};
use mcp_schema::client::{RequestEncoder, RequestHeader};
use mcp_schema::verify::VerifiedRequest;
use serde::de::{Deserializer, IgnoredAny, MapAccess, Visitor};
use serde_json::value::RawValue;

/// The members of an object as (key, value text), in order, duplicates kept.
fn members(json: &[u8]) -> Option<Vec<(String, String)>> {
    struct M;
    impl<'de> Visitor<'de> for M {
        type Value = Vec<(String, String)>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("an object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Self::Value, A::Error> {
            let mut out = Vec::new();
            while let Some((k, v)) = m.next_entry::<String, &'de RawValue>()? {
                out.push((k, v.get().to_string()));
            }
            Ok(out)
        }
    }
    let mut de = serde_json::Deserializer::from_slice(json);
    let m = de.deserialize_map(M).ok()?;
    de.end().ok()?;
    Some(m)
}

fn serde_accepts(v: &[u8]) -> bool {
    serde_json::from_slice::<IgnoredAny>(v).is_ok()
}

/// Whether `v` opens more containers than the validator allows at once
/// (counted crudely: brackets inside strings count too, so this only ever
/// excuses more, never less).
fn maybe_too_deep(v: &[u8]) -> bool {
    v.iter().filter(|&&b| b == b'[' || b == b'{').count() > MAX_JSON_DEPTH
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let mut fields = Vec::new();
    for f in data.split(|&b| b == 0xff) {
        match std::str::from_utf8(f) {
            Ok(s) => fields.push(s),
            Err(_) => break,
        }
    }
    let pairs: Vec<(&str, &str)> = fields.chunks_exact(2).map(|c| (c[0], c[1])).collect();

    for (_, v) in &pairs {
        let ours = is_one_json_value(v.as_bytes());
        let theirs = serde_accepts(v.as_bytes());
        assert!(
            ours == theirs || (theirs && maybe_too_deep(v.as_bytes())),
            "validator {ours}, serde_json {theirs} on {v:?}"
        );
    }

    let header = RequestHeader {
        message_id: [1; 16],
        correlation_id: Some("fuzz"),
        session_id: None,
        timeout_ms: 0,
        unix_nanos: 0,
    };
    let mut enc = RequestEncoder::new();
    let frame = bytes::Bytes::copy_from_slice(enc.tool_call(&header, [2; 16], "t", &pairs));
    let req = VerifiedRequest::verify(frame).expect("the encoder's frame verifies");
    let view = req.view();
    let tc = view.tool_call().expect("a tool call");

    let mut out = Vec::new();
    let first_bad = pairs
        .iter()
        .find(|(_, v)| !v.trim_ascii().is_empty() && !is_one_json_value(v.as_bytes()));
    match (
        write_arguments_json_checked(Some(tc.arguments()), &mut out),
        first_bad,
    ) {
        (Ok(()), None) => {
            let got = members(&out).expect("an accepted object parses");
            assert_eq!(got.len(), pairs.len(), "{}", String::from_utf8_lossy(&out));
            for ((k, v), (gk, gv)) in pairs.iter().zip(&got) {
                assert_eq!(k, gk);
                let want = if v.trim_ascii().is_empty() {
                    "null"
                } else {
                    v.trim_ascii()
                };
                assert_eq!(want, gv.as_str());
            }
            // The whole object is one JSON value too, nested one deeper.
            assert!(serde_accepts(&out));
        }
        (Err(e), Some((k, _))) => assert_eq!(e.key, *k),
        (r, bad) => panic!("writer {r:?} but first invalid value {bad:?}"),
    }
});
