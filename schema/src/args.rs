//! ToolCall arguments to the router's JSON object, without parsing JSON.
//!
//! Each `KeyValue.value` is already JSON text, so the object is their
//! concatenation under escaped keys: `{"k1":v1,"k2":v2}`. The broker never
//! parses or validates the values; a router that receives invalid JSON
//! reports invalid parameters itself. An absent or empty value becomes
//! `null`, so the object stays well-formed around it.

use flatbuffers::{ForwardsUOffset, Vector};

use crate::fb::KeyValue;

/// Writes the arguments as one JSON object into `out` (cleared first).
/// With `out` already grown to the needed capacity, this allocates nothing.
pub fn write_arguments_json(
    args: Option<Vector<'_, ForwardsUOffset<KeyValue<'_>>>>,
    out: &mut Vec<u8>,
) {
    out.clear();
    out.push(b'{');
    if let Some(args) = args {
        for (i, kv) in args.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            write_json_string(kv.key(), out);
            out.push(b':');
            match kv.value() {
                Some(v) if !v.trim_ascii().is_empty() => out.extend_from_slice(v.as_bytes()),
                _ => out.extend_from_slice(b"null"),
            }
        }
    }
    out.push(b'}');
}

/// Appends `s` as a JSON string literal (RFC 8259 escaping).
pub fn write_json_string(s: &str, out: &mut Vec<u8>) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push(b'"');
    let bytes = s.as_bytes();
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let esc: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0x08 => b"\\b",
            0x0c => b"\\f",
            0..=0x1f => &[],
            _ => continue,
        };
        out.extend_from_slice(&bytes[start..i]);
        if esc.is_empty() {
            out.extend_from_slice(&[
                b'\\',
                b'u',
                b'0',
                b'0',
                HEX[(b >> 4) as usize],
                HEX[(b & 0xf) as usize],
            ]);
        } else {
            out.extend_from_slice(esc);
        }
        start = i + 1;
    }
    out.extend_from_slice(&bytes[start..]);
    out.push(b'"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Any key survives escaping: serde_json reads back exactly it.
        #[test]
        fn escaped_keys_parse_back(key in any::<String>()) {
            let mut out = Vec::new();
            write_json_string(&key, &mut out);
            let back: String = serde_json::from_slice(&out).unwrap();
            prop_assert_eq!(back, key);
        }
    }

    #[test]
    fn control_characters_use_unicode_escapes() {
        let mut out = Vec::new();
        write_json_string("a\u{1}\"b", &mut out);
        assert_eq!(out, br#""a\u0001\"b""#);
    }
}
