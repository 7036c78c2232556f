//! The HTTP edge's `requestState` tokens (`broker/src/edge/http/request_state.rs`,
//! compiled in as it is), which clients send back at will.
//!
//! Input: the first byte picks the property, the rest is its material.
//! - Any text as a token, for any tool and caller, never opens (and never
//!   panics): only the broker's key makes tokens.
//! - A question, or a set of them, sealed from the input (tool, caller,
//!   kinds, key, state) opens to exactly itself for its own tool and
//!   caller, and fails for another caller and once any one byte of it is
//!   changed.
#![no_main]

use std::sync::LazyLock;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

#[allow(dead_code)]
#[path = "../../broker/src/edge/http/jsonrpc.rs"]
mod jsonrpc;
#[allow(dead_code, unused_imports)]
#[path = "../../broker/src/edge/http/request_state.rs"]
mod request_state;

use request_state::{Asked, MAX_INPUT_KEY_BYTES, MAX_INPUT_REQUESTS, Question, RequestStates};

static STATES: LazyLock<RequestStates> = LazyLock::new(|| {
    RequestStates::new(std::path::Path::new(""), Duration::from_secs(600)).expect("a random key")
});

/// The input's next `n`-prefixed piece, as text.
fn piece(data: &mut &[u8]) -> String {
    let Some((&n, rest)) = data.split_first() else {
        return String::new();
    };
    let n = usize::from(n).min(rest.len());
    let (p, rest) = rest.split_at(n);
    *data = rest;
    String::from_utf8_lossy(p).into_owned()
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Some((&mode, mut data)) = data.split_first() else {
        return;
    };
    if mode % 2 == 0 {
        let token = String::from_utf8_lossy(data);
        assert!(STATES.open(&token, "tool", "").is_err(), "{token:?} opened");
        assert!(STATES.open(&token, "", "alice").is_err(), "{token:?} opened");
        return;
    }
    let tool = piece(&mut data);
    let subject = piece(&mut data);
    let mut key = piece(&mut data);
    while key.len() > MAX_INPUT_KEY_BYTES {
        key.pop();
    }
    let state = piece(&mut data);
    let kind = |b: u8| match b % 3 {
        0 => Asked::Elicitation,
        1 => Asked::Sampling,
        _ => Asked::Roots,
    };
    // A set (mode bit 0x40) holds the key once per kind byte that follows
    // it, up to the most a set may hold; one question asks the mode's kind.
    let many = mode & 0x40 != 0;
    let asks: Vec<(Asked, &str)> = if many {
        let n = data.first().map_or(1, |&b| usize::from(b) % MAX_INPUT_REQUESTS + 1);
        (0..n)
            .map(|i| (kind(data.get(i).copied().unwrap_or(0)), key.as_str()))
            .collect()
    } else {
        vec![(kind(mode >> 1), key.as_str())]
    };
    let q = Question {
        asks,
        many,
        state: (mode & 0x80 != 0).then_some(state.as_str()),
    };
    let token = STATES.seal(&tool, &subject, &q);
    let opened = STATES.open(&token, &tool, &subject).expect("its own token opens");
    let asks: Vec<(Asked, &str)> = opened.asks.iter().map(|(a, k)| (*a, k.as_str())).collect();
    assert_eq!(asks, q.asks);
    assert_eq!(opened.many, q.many);
    assert_eq!(opened.state.as_deref(), q.state);
    let other = format!("{subject}x");
    assert!(STATES.open(&token, &tool, &other).is_err());
    let mut raw = URL_SAFE_NO_PAD.decode(&token).expect("its own encoding");
    let at = data.first().map_or(0, |&b| usize::from(b)) % raw.len();
    raw[at] ^= data.get(1).map_or(1, |&b| b | 1);
    assert!(
        STATES.open(&URL_SAFE_NO_PAD.encode(&raw), &tool, &subject).is_err(),
        "a token changed at byte {at} opened"
    );
});
