//! ToolCall arguments to the router's JSON object, without parsing JSON.
//!
//! Each `KeyValue.value` is already JSON text, so the object is their
//! concatenation under escaped keys: `{"k1":v1,"k2":v2}`. An absent or empty
//! value becomes `null`, so the object stays well-formed around it.
//!
//! A value pasted in unchecked could close itself and add keys (the value
//! `1,"admin":true` makes `{"a":1,"admin":true}`), so the broker writes the
//! object with [`write_arguments_json_checked`], which refuses any value
//! that is not exactly one JSON value ([`is_one_json_value`]: a single pass,
//! no allocation, no recursion). What the value means is still the router's
//! business; only its shape is checked here.
//!
//! # Invariants
//! - [`write_arguments_json_checked`] writes `out` only if every value is
//!   one JSON value, so `out` is then one JSON object with exactly the
//!   request's keys.
//! - Checking allocates nothing and uses constant stack: nesting is tracked
//!   in a fixed bit stack, bounded by [`MAX_JSON_DEPTH`].

use flatbuffers::{ForwardsUOffset, Vector};

use crate::fb::KeyValue;

/// Deepest nesting of arrays and objects [`is_one_json_value`] accepts: what
/// `serde_json` (the bundled routers' parser) accepts inside the arguments
/// object, whose own braces are one more level.
pub const MAX_JSON_DEPTH: usize = 126;

/// A ToolCall argument whose value is not exactly one JSON value, or is one
/// nested deeper than [`MAX_JSON_DEPTH`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InvalidArgument<'a> {
    /// The offending argument's key.
    pub key: &'a str,
    /// Refused for its nesting: the scan stopped at an array or object
    /// opened deeper than [`MAX_JSON_DEPTH`], before any other fault.
    pub too_deep: bool,
}

impl std::fmt::Display for InvalidArgument<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let key = self.key;
        if self.too_deep {
            write!(
                f,
                "argument `{key}` nests arrays and objects deeper than {MAX_JSON_DEPTH}"
            )
        } else {
            write!(f, "argument `{key}` is not exactly one JSON value")
        }
    }
}

impl std::error::Error for InvalidArgument<'_> {}

/// Writes the arguments as one JSON object into `out` (cleared first),
/// refusing the first value that is not exactly one JSON value
/// ([`is_one_json_value`]); on a refusal `out` holds a partial object and
/// must not be used. With `out` already grown to the needed capacity, this
/// allocates nothing.
pub fn write_arguments_json_checked<'a>(
    args: Option<Vector<'a, ForwardsUOffset<KeyValue<'a>>>>,
    out: &mut Vec<u8>,
) -> Result<(), InvalidArgument<'a>> {
    write_object(args, out, is_one_json_value)
}

/// Writes the arguments as one JSON object into `out` (cleared first),
/// pasting each value as it is: the object is well-formed only if every
/// value is one JSON value. For trusted input (tests, benchmarks, the load
/// generator's echo servers); the broker uses
/// [`write_arguments_json_checked`]. With `out` already grown to the needed
/// capacity, this allocates nothing.
pub fn write_arguments_json(
    args: Option<Vector<'_, ForwardsUOffset<KeyValue<'_>>>>,
    out: &mut Vec<u8>,
) {
    // Nothing is refused without a check.
    let _ = write_object(args, out, |_| true);
}

/// The one concatenation both writers share; `accept` decides each value.
fn write_object<'a>(
    args: Option<Vector<'a, ForwardsUOffset<KeyValue<'a>>>>,
    out: &mut Vec<u8>,
    accept: impl Fn(&[u8]) -> bool,
) -> Result<(), InvalidArgument<'a>> {
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
                Some(v) if !v.trim_ascii().is_empty() => {
                    if !accept(v.as_bytes()) {
                        return Err(InvalidArgument {
                            key: kv.key(),
                            too_deep: refused_for_depth(v.as_bytes()),
                        });
                    }
                    out.extend_from_slice(v.as_bytes());
                }
                _ => out.extend_from_slice(b"null"),
            }
        }
    }
    out.push(b'}');
    Ok(())
}

/// Whether `text` is exactly one JSON value (RFC 8259 `JSON-text`:
/// whitespace, one value, whitespace), nested at most [`MAX_JSON_DEPTH`]
/// deep. Strings are checked for their escapes and control characters, not
/// for paired surrogates in `\u` escapes (as `serde_json` when it skips a
/// value). One pass, no allocation, no recursion.
pub fn is_one_json_value(text: &[u8]) -> bool {
    Scanner::new(text).one_value()
}

/// Whether [`is_one_json_value`] refuses `text` for its nesting: the scan
/// found no fault before an array or object opened deeper than
/// [`MAX_JSON_DEPTH`]. Scans again, so that the check itself keeps one
/// result; only a refusal's message asks.
fn refused_for_depth(text: &[u8]) -> bool {
    let mut scan = Scanner::new(text);
    !scan.one_value() && scan.too_deep
}

/// The containers open at each depth: bit `d` set = an object at depth `d`.
struct Nesting {
    bits: [u64; MAX_JSON_DEPTH.div_ceil(64)],
    depth: usize,
}

impl Nesting {
    fn push(&mut self, object: bool) -> bool {
        if self.depth == MAX_JSON_DEPTH {
            return false;
        }
        let (word, bit) = (self.depth / 64, self.depth % 64);
        self.bits[word] = (self.bits[word] & !(1 << bit)) | (u64::from(object) << bit);
        self.depth += 1;
        true
    }

    /// Whether the innermost open container is an object.
    fn in_object(&self) -> bool {
        let d = self.depth - 1;
        (self.bits[d / 64] >> (d % 64)) & 1 == 1
    }
}

struct Scanner<'a> {
    s: &'a [u8],
    i: usize,
    /// Set where the scan stops at an array or object one level too deep.
    too_deep: bool,
}

impl<'a> Scanner<'a> {
    fn new(s: &'a [u8]) -> Self {
        Scanner {
            s,
            i: 0,
            too_deep: false,
        }
    }

    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    fn ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.i += 1;
        }
    }

    fn eat(&mut self, b: u8) -> bool {
        let ok = self.peek() == Some(b);
        self.i += usize::from(ok);
        ok
    }

    fn literal(&mut self, word: &[u8]) -> bool {
        let ok = self.s[self.i..].starts_with(word);
        self.i += if ok { word.len() } else { 0 };
        ok
    }

    fn digits(&mut self) -> bool {
        let start = self.i;
        while let Some(b'0'..=b'9') = self.peek() {
            self.i += 1;
        }
        self.i > start
    }

    /// `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`
    fn number(&mut self) -> bool {
        self.eat(b'-');
        match self.peek() {
            Some(b'0') => self.i += 1,
            Some(b'1'..=b'9') => {
                self.digits();
            }
            _ => return false,
        }
        if self.eat(b'.') && !self.digits() {
            return false;
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.i += 1;
            if !self.eat(b'+') {
                self.eat(b'-');
            }
            return self.digits();
        }
        true
    }

    /// A string literal, the opening quote at `i`.
    fn string(&mut self) -> bool {
        if !self.eat(b'"') {
            return false;
        }
        loop {
            // The common bytes in one tight loop; stop at what needs a look.
            while let Some(&b) = self.s.get(self.i) {
                if b == b'"' || b == b'\\' || b < 0x20 {
                    break;
                }
                self.i += 1;
            }
            match self.peek() {
                Some(b'"') => {
                    self.i += 1;
                    return true;
                }
                Some(b'\\') => {
                    self.i += 1;
                    match self.peek() {
                        Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => self.i += 1,
                        Some(b'u') => {
                            let hex = self.s.get(self.i + 1..self.i + 5);
                            if !hex.is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit)) {
                                return false;
                            }
                            self.i += 5;
                        }
                        _ => return false,
                    }
                }
                // A raw control character, or the end without a closing quote.
                _ => return false,
            }
        }
    }

    /// An object key and its colon, after which a value follows.
    fn key(&mut self) -> bool {
        self.ws();
        if !self.string() {
            return false;
        }
        self.ws();
        self.eat(b':')
    }

    fn one_value(&mut self) -> bool {
        let mut open = Nesting {
            bits: [0; MAX_JSON_DEPTH.div_ceil(64)],
            depth: 0,
        };
        // Each turn reads one value, then closes what it completes; every
        // turn consumes at least one byte, so the loop ends.
        loop {
            self.ws();
            let scalar = match self.peek() {
                Some(c @ (b'{' | b'[')) => {
                    self.i += 1;
                    let object = c == b'{';
                    if !open.push(object) {
                        self.too_deep = true;
                        return false;
                    }
                    self.ws();
                    if self.eat(if object { b'}' } else { b']' }) {
                        open.depth -= 1;
                        true
                    } else if object {
                        if !self.key() {
                            return false;
                        }
                        continue;
                    } else {
                        continue;
                    }
                }
                Some(b'"') => self.string(),
                Some(b't') => self.literal(b"true"),
                Some(b'f') => self.literal(b"false"),
                Some(b'n') => self.literal(b"null"),
                Some(b'-' | b'0'..=b'9') => self.number(),
                _ => false,
            };
            if !scalar {
                return false;
            }
            // After a complete value: a separator for the next one, or the
            // close of its container (which completes that one too).
            loop {
                self.ws();
                if open.depth == 0 {
                    return self.i == self.s.len();
                }
                let object = open.in_object();
                match self.peek() {
                    Some(b',') => {
                        self.i += 1;
                        if object && !self.key() {
                            return false;
                        }
                        break;
                    }
                    Some(b'}') if object => {
                        self.i += 1;
                        open.depth -= 1;
                    }
                    Some(b']') if !object => {
                        self.i += 1;
                        open.depth -= 1;
                    }
                    _ => return false,
                }
            }
        }
    }
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

    /// serde_json skipping one value (no depth limit, lone surrogates
    /// allowed): the reference the validator must agree with.
    fn serde_accepts(text: &[u8]) -> bool {
        serde_json::from_slice::<serde::de::IgnoredAny>(text).is_ok()
    }

    /// JSON text built from a small alphabet that hits every branch.
    fn jsonish() -> impl Strategy<Value = String> {
        prop::string::string_regex(r#"[ \t\n\[\]{}",:0-9.eE+\-truefalsn\\u/bx\x01é]{0,32}"#)
            .unwrap()
    }

    /// Valid JSON values, nested, serialised compactly or pretty.
    fn json_value() -> impl Strategy<Value = serde_json::Value> {
        use serde_json::Value;
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(Value::from),
            any::<String>().prop_map(Value::String),
        ];
        leaf.prop_recursive(6, 48, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::btree_map(any::<String>(), inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2048))]

        /// On arbitrary JSON-ish text the validator accepts exactly what
        /// serde_json accepts as one value.
        #[test]
        fn validator_agrees_with_serde_json_on_jsonish_text(text in jsonish()) {
            prop_assert_eq!(is_one_json_value(text.as_bytes()), serde_accepts(text.as_bytes()), "{:?}", text);
        }

        /// Valid values pass, however they are spaced; cut short, doubled or
        /// given an extra key, they agree with serde_json again.
        #[test]
        fn validator_agrees_with_serde_json_on_real_values(
            v in json_value(),
            pretty in any::<bool>(),
            cut in any::<prop::sample::Index>(),
            suffix in prop_oneof![Just(""), Just(" "), Just(","), Just(",\"admin\":true"), Just("]"), Just("}"), Just(" 1")],
        ) {
            let text = if pretty {
                serde_json::to_string_pretty(&v).unwrap()
            } else {
                serde_json::to_string(&v).unwrap()
            };
            prop_assert!(is_one_json_value(text.as_bytes()), "{}", text);
            let spaced = format!(" \n{text}\t ");
            prop_assert!(is_one_json_value(spaced.as_bytes()));
            let cut = &text.as_bytes()[..cut.index(text.len() + 1)];
            prop_assert_eq!(is_one_json_value(cut), serde_accepts(cut));
            let extended = format!("{text}{suffix}");
            prop_assert_eq!(is_one_json_value(extended.as_bytes()), serde_accepts(extended.as_bytes()), "{}", extended);
        }
    }

    #[test]
    fn a_value_that_adds_keys_or_is_not_one_value_is_refused() {
        for bad in [
            &br#"1,"admin":true"#[..],
            br#""x","admin":true"#,
            b"1 2",
            b"{}{}",
            b"[1,]",
            b"{\"a\":1,}",
            b"{\"a\"}",
            b"{1:2}",
            b"01",
            b"1.",
            b"-",
            b".5",
            b"1e",
            b"tru",
            b"nul",
            b"\"unterminated",
            b"\"\\x\"",
            b"\"\\u12g4\"",
            b"\"tab\there\"",
            b"]",
            b"[}",
            b"{]",
            b"",
            b"   ",
        ] {
            assert!(
                !is_one_json_value(bad),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
            assert!(!serde_accepts(bad), "{:?}", String::from_utf8_lossy(bad));
        }
        for good in [
            &b"0"[..],
            b"-0.5e+10",
            b" true ",
            b"null",
            b"\"\\ud800 lone surrogate escapes are grammatical\"",
            br#"{"a":[1,{"b":null}],"c":"}"}"#,
            b"[ ]",
            b"{ }",
        ] {
            assert!(
                is_one_json_value(good),
                "{:?}",
                String::from_utf8_lossy(good)
            );
        }
    }

    #[test]
    fn nesting_is_bounded_where_the_routers_parser_stops() {
        let nested = |d: usize| format!("{}{}", "[".repeat(d), "]".repeat(d));
        assert!(is_one_json_value(nested(MAX_JSON_DEPTH).as_bytes()));
        assert!(!is_one_json_value(nested(MAX_JSON_DEPTH + 1).as_bytes()));
        // A refusal says which it was: too deep, or not one value.
        assert!(refused_for_depth(nested(MAX_JSON_DEPTH + 1).as_bytes()));
        assert!(!refused_for_depth(nested(MAX_JSON_DEPTH).as_bytes()));
        assert!(!refused_for_depth(b"[[1,]]"));
        assert!(!refused_for_depth(b"[1,\"admin\":true"));
        // Inside the arguments object, the deepest accepted value is the
        // deepest that serde_json parses into a `Value`.
        let object = |d: usize| format!("{{\"a\":{}}}", nested(d));
        assert!(serde_json::from_str::<serde_json::Value>(&object(MAX_JSON_DEPTH)).is_ok());
        assert!(serde_json::from_str::<serde_json::Value>(&object(MAX_JSON_DEPTH + 1)).is_err());
        // A megabyte of brackets is refused in constant stack.
        assert!(!is_one_json_value(nested(1 << 20).as_bytes()));
        let mixed = "[{\"k\":".repeat(60) + "1" + &"}]".repeat(60);
        assert!(is_one_json_value(mixed.as_bytes()));
    }

    #[test]
    fn control_characters_use_unicode_escapes() {
        let mut out = Vec::new();
        write_json_string("a\u{1}\"b", &mut out);
        assert_eq!(out, br#""a\u0001\"b""#);
    }
}
