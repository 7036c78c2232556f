//! The WASM host's JSON check (`broker/src/wasm/json_check.rs`, compiled in
//! as it is) against serde_json, the parser it stands in for: on every
//! UTF-8 input the two accept and refuse the same text.
#![no_main]

#[allow(dead_code)]
#[path = "../../broker/src/wasm/json_check.rs"]
mod json_check;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let serde = serde_json::from_str::<serde::de::IgnoredAny>(text).is_ok();
        assert_eq!(json_check::is_json(text), serde, "{text:?}");
    }
});
