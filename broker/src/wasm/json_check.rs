//! Whether a router's `json` field is JSON, without building anything.
//!
//! Every tool answer's structured content, elicitation schema and `_meta`
//! value passes here (`pool.rs`, `check_response`): the edges embed them
//! in their answers as they are, so text that is not JSON must be caught
//! before a client sees it. `serde_json::from_str::<IgnoredAny>` did this
//! at 1,521 instructions for the echo's 256-byte structured content, 17%
//! of a whole WASM call, most of it the deserializer's machinery rather
//! than the bytes; this takes 933 (`bench/results/wasm-host.md`).
//!
//! # Invariants
//! - [`is_json`] accepts exactly what `serde_json::from_str::<IgnoredAny>`
//!   accepts (checked by a differential property test below): RFC 8259
//!   values with whitespace around them, no nesting limit, `\u` escapes of
//!   any four hex digits (a lone surrogate included, as serde_json does
//!   when it only skips a string).
//! - It never allocates for nesting up to 64 levels, and never recurses.
//! - Callers keep serde_json for the refusal: its message says what and
//!   where, and should this ever refuse text serde_json accepts, serde_json
//!   has the last word.

/// Bytes serde_json skips between tokens.
#[inline]
fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while let Some(b' ' | b'\n' | b'\t' | b'\r') = b.get(i) {
        i += 1;
    }
    i
}

const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
const HIGHS: u64 = u64::from_ne_bytes([0x80; 8]);

/// The high bit of each byte of `w` that is `"`, `\` or a control
/// character (below 0x20), little-endian. The lowest set bit is exact:
/// the subtractions' borrows can only mark bytes above a true match.
#[inline]
fn specials(w: u64) -> u64 {
    let below_space = w.wrapping_sub(ONES * 0x20) & !w;
    let x = w ^ (ONES * u64::from(b'"'));
    let quote = x.wrapping_sub(ONES) & !x;
    let y = w ^ (ONES * u64::from(b'\\'));
    let backslash = y.wrapping_sub(ONES) & !y;
    (below_space | quote | backslash) & HIGHS
}

/// From `i`, the first byte of a string's body that needs a look (`"`,
/// `\`, a control character), or a position fewer than 8 bytes from the
/// end: eight bytes at a time.
#[inline]
fn scan_swar(b: &[u8], mut i: usize) -> usize {
    while let Some(chunk) = b.get(i..i + 8) {
        let mut w = [0; 8];
        w.copy_from_slice(chunk);
        let m = specials(u64::from_le_bytes(w));
        if m != 0 {
            return i + (m.trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    i
}

/// [`scan_swar`], sixteen bytes at a time with SSE2 (in every x86_64 CPU):
/// a third of the instructions per byte.
#[inline]
fn scan(b: &[u8], mut i: usize) -> usize {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{
            _mm_cmpeq_epi8, _mm_loadu_si128, _mm_max_epu8, _mm_movemask_epi8, _mm_or_si128,
            _mm_set1_epi8,
        };
        while let Some(chunk) = b.get(i..i + 16) {
            // SAFETY: SSE2 is part of the x86_64 baseline, so these
            // intrinsics exist on every CPU this code runs on; the
            // unaligned load reads exactly the 16 bytes of `chunk`.
            let m = unsafe {
                let v = _mm_loadu_si128(chunk.as_ptr().cast());
                let quote = _mm_cmpeq_epi8(v, _mm_set1_epi8(b'"' as i8));
                let backslash = _mm_cmpeq_epi8(v, _mm_set1_epi8(b'\\' as i8));
                // Unsigned v <= 0x1f exactly when max(v, 0x1f) is 0x1f.
                let limit = _mm_set1_epi8(0x1f);
                let control = _mm_cmpeq_epi8(_mm_max_epu8(v, limit), limit);
                _mm_movemask_epi8(_mm_or_si128(_mm_or_si128(quote, backslash), control))
            };
            if m != 0 {
                return i + m.trailing_zeros() as usize;
            }
            i += 16;
        }
    }
    scan_swar(b, i)
}

/// The end of a string whose opening quote ends before `i`.
fn string(b: &[u8], mut i: usize) -> Option<usize> {
    loop {
        i = scan(b, i);
        match *b.get(i)? {
            b'"' => return Some(i + 1),
            b'\\' => {
                i = match *b.get(i + 1)? {
                    b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => i + 2,
                    b'u' => {
                        let hex = b.get(i + 2..i + 6)?;
                        if !hex.iter().all(u8::is_ascii_hexdigit) {
                            return None;
                        }
                        i + 6
                    }
                    _ => return None,
                }
            }
            0..=0x1f => return None,
            _ => i += 1,
        }
    }
}

#[inline]
fn digits(b: &[u8], mut i: usize) -> usize {
    while let Some(b'0'..=b'9') = b.get(i) {
        i += 1;
    }
    i
}

/// The end of a number starting at `i`: `-? (0 | [1-9][0-9]*) (. [0-9]+)?
/// ([eE] [+-]? [0-9]+)?`.
fn number(b: &[u8], mut i: usize) -> Option<usize> {
    if b.get(i) == Some(&b'-') {
        i += 1;
    }
    i = match *b.get(i)? {
        // One leading zero, and no digit after it.
        b'0' if matches!(b.get(i + 1), Some(b'0'..=b'9')) => return None,
        b'0' => i + 1,
        b'1'..=b'9' => digits(b, i + 1),
        _ => return None,
    };
    if b.get(i) == Some(&b'.') {
        let end = digits(b, i + 1);
        if end == i + 1 {
            return None;
        }
        i = end;
    }
    if let Some(b'e' | b'E') = b.get(i) {
        i += 1;
        if let Some(b'+' | b'-') = b.get(i) {
            i += 1;
        }
        let end = digits(b, i);
        if end == i {
            return None;
        }
        i = end;
    }
    Some(i)
}

/// Past an object key and its colon; `i` is at the key's opening quote.
#[inline]
fn key(b: &[u8], i: usize) -> Option<usize> {
    if b.get(i) != Some(&b'"') {
        return None;
    }
    let i = skip_ws(b, string(b, i + 1)?);
    (b.get(i) == Some(&b':')).then_some(i + 1)
}

/// The open containers, innermost last: one bit each, set for an object.
/// The first 64 levels need no allocation.
struct Open {
    depth: usize,
    low: u64,
    deeper: Vec<u64>,
}

impl Open {
    fn push(&mut self, object: bool) {
        let d = self.depth;
        if d < 64 {
            self.low = (self.low & !(1 << d)) | (u64::from(object) << d);
        } else {
            let (word, bit) = ((d - 64) / 64, (d - 64) % 64);
            if word == self.deeper.len() {
                self.deeper.push(0);
            }
            let w = &mut self.deeper[word];
            *w = (*w & !(1 << bit)) | (u64::from(object) << bit);
        }
        self.depth += 1;
    }

    /// Whether the innermost open container is an object; `None` at the
    /// top level.
    fn top(&self) -> Option<bool> {
        let d = self.depth.checked_sub(1)?;
        Some(if d < 64 {
            self.low >> d & 1 == 1
        } else {
            self.deeper[(d - 64) / 64] >> ((d - 64) % 64) & 1 == 1
        })
    }
}

/// Whether `text` is one JSON value, whitespace around it allowed.
pub fn is_json(text: &str) -> bool {
    check(text.as_bytes()).is_some()
}

fn check(b: &[u8]) -> Option<()> {
    let mut open = Open {
        depth: 0,
        low: 0,
        deeper: Vec::new(),
    };
    let mut i = 0;
    loop {
        // A value starts at `i` (after whitespace).
        i = skip_ws(b, i);
        i = match *b.get(i)? {
            b'"' => string(b, i + 1)?,
            b'-' | b'0'..=b'9' => number(b, i)?,
            b't' if b.get(i..i + 4) == Some(b"true") => i + 4,
            b'f' if b.get(i..i + 5) == Some(b"false") => i + 5,
            b'n' if b.get(i..i + 4) == Some(b"null") => i + 4,
            c @ (b'[' | b'{') => {
                let object = c == b'{';
                let j = skip_ws(b, i + 1);
                if b.get(j) == Some(if object { &b'}' } else { &b']' }) {
                    j + 1
                } else {
                    open.push(object);
                    i = if object { key(b, j)? } else { j };
                    continue;
                }
            }
            _ => return None,
        };
        // A value ended before `i`: close what it completes, or go on to
        // the next element.
        loop {
            i = skip_ws(b, i);
            let Some(object) = open.top() else {
                return (i == b.len()).then_some(());
            };
            match *b.get(i)? {
                b',' => {
                    i = if object {
                        key(b, skip_ws(b, i + 1))?
                    } else {
                        i + 1
                    };
                    break;
                }
                b'}' if object => {}
                b']' if !object => {}
                _ => return None,
            }
            open.depth -= 1;
            i += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn serde_accepts(s: &str) -> bool {
        serde_json::from_str::<serde::de::IgnoredAny>(s).is_ok()
    }

    #[test]
    fn accepts_and_refuses_what_serde_json_does() {
        let cases = [
            // Accepted.
            "0",
            "-0",
            "1",
            "-12.5e+3",
            "1E5",
            "0.0",
            "1e-0",
            "\"\"",
            "\"a\\u00e9\\ud800\\/\"",
            "true",
            "false",
            "null",
            " \t\r\n[ ] ",
            "{}",
            "[[],{}]",
            r#"{"a":[1,{"b":null}]}"#,
            r#"{ "a" : 1 , "b" : "x" }"#,
            "\"é ü 雪 \u{7f}\"",
            "[1,2,3]",
            // Refused.
            "",
            " ",
            "01",
            "-",
            "-01",
            "1.",
            ".5",
            "1e",
            "1e+",
            "+1",
            "0x1",
            "1 2",
            "[1,]",
            "[,1]",
            "{,}",
            r#"{"a":1,}"#,
            r#"{"a"}"#,
            r#"{"a":}"#,
            r#"{1:2}"#,
            "[",
            "]",
            "{",
            "}",
            "[}",
            "{]",
            "\"",
            "\"\\\"",
            "\"\\x\"",
            "\"\\u12\"",
            "\"\\u12g4\"",
            "\"\u{1}\"",
            "\"\n\"",
            "tru",
            "truee",
            "nul",
            "nulll",
            "[true false]",
            "[1true]",
            "'a'",
            "NaN",
            "Infinity",
            "[1]x",
            "{\"a\":1}}",
            "[[]",
            "[]]",
        ];
        for c in cases {
            assert_eq!(is_json(c), serde_accepts(c), "{c:?}");
        }
    }

    #[test]
    fn nesting_has_no_limit_and_closes_in_order() {
        for depth in [1, 63, 64, 65, 127, 128, 129, 1000] {
            let arrays = "[".repeat(depth) + &"]".repeat(depth);
            assert!(is_json(&arrays), "{depth}");
            let objects = r#"{"k":"#.repeat(depth) + "0" + &"}".repeat(depth);
            assert!(is_json(&objects), "{depth}");
            // Mixed, and closed by the wrong bracket at the deepest level.
            let mixed: String = (0..depth)
                .map(|d| if d % 3 == 0 { r#"{"k":"# } else { "[" })
                .collect();
            let close: String = (0..depth)
                .rev()
                .map(|d| if d % 3 == 0 { "}" } else { "]" })
                .collect();
            let ok = format!("{mixed}1{close}");
            assert_eq!(is_json(&ok), serde_accepts(&ok), "{depth}");
            assert!(is_json(&ok), "{depth}");
            let mut bad = ok.clone().into_bytes();
            let at = bad.iter().position(|&c| c == b'1').unwrap() + 1;
            bad[at] = if bad[at] == b'}' { b']' } else { b'}' };
            let bad = String::from_utf8(bad).unwrap();
            assert!(!is_json(&bad) && !serde_accepts(&bad), "{depth}");
        }
    }

    /// Strings that cross the eight-byte chunks with a special byte at
    /// every offset.
    #[test]
    fn every_offset_of_a_special_byte_in_a_string() {
        for len in 0..40 {
            for at in 0..len {
                for special in ["\\n", "\\u0041", "\u{1f}", "\\q", "é"] {
                    let mut s = "x".repeat(len);
                    s.replace_range(at..at + 1, special);
                    let doc = format!("[\"{s}\"]");
                    assert_eq!(is_json(&doc), serde_accepts(&doc), "{doc:?}");
                }
            }
            let unterminated = format!("\"{}", "y".repeat(len));
            assert!(!is_json(&unterminated));
        }
    }

    /// Both scanners stop at the first byte that needs a look, at every
    /// offset of a 40-byte body, or where fewer than a chunk is left.
    #[test]
    fn both_scanners_stop_at_the_first_special_byte() {
        for at in 0..40 {
            for special in [b'"', b'\\', 0x00, 0x1f] {
                let mut body = vec![b'a'; 40];
                // Bytes that look close to special but are not.
                body[(at + 5) % 40] = 0x20;
                body[(at + 7) % 40] = 0x80;
                body[(at + 9) % 40] = b'"' ^ 0x80;
                body[at] = special;
                for from in 0..=at {
                    let scanned = [scan(&body, from), scan_swar(&body, from)];
                    for (n, stop) in scanned.into_iter().enumerate() {
                        let left = body.len() - stop;
                        let ok = stop == at || (stop < at && left < [16, 8][n]);
                        assert!(
                            ok,
                            "scanner {n}: special at {at}, from {from}, stopped at {stop}"
                        );
                    }
                }
            }
        }
    }

    fn value() -> impl Strategy<Value = serde_json::Value> {
        let leaf = prop_oneof![
            Just(serde_json::Value::Null),
            any::<bool>().prop_map(serde_json::Value::from),
            any::<i64>().prop_map(serde_json::Value::from),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(serde_json::Value::from),
            any::<String>().prop_map(serde_json::Value::from),
        ];
        leaf.prop_recursive(6, 64, 8, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..8).prop_map(serde_json::Value::from),
                prop::collection::btree_map(any::<String>(), inner, 0..8)
                    .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        // Fewer under Miri (scripts/miri), which interprets the SSE2 scan.
        #![proptest_config(ProptestConfig::with_cases(if cfg!(miri) { 16 } else { 2000 }))]

        /// Any document serde_json writes, compact or pretty, is JSON.
        #[test]
        fn whatever_serde_json_writes_is_accepted(v in value()) {
            prop_assert!(is_json(&v.to_string()));
            prop_assert!(is_json(&serde_json::to_string_pretty(&v).unwrap()));
        }

        /// Short strings over JSON's own alphabet, most of them not JSON:
        /// the two checks agree on every one.
        #[test]
        fn agrees_with_serde_json_on_near_json(
            s in r#"[ \t\n\r{}\[\]",:0-9eE.+\-tfrulnas\\/u\x01é]{0,24}"#
        ) {
            prop_assert_eq!(is_json(&s), serde_accepts(&s), "{:?}", s);
        }

        /// A valid document with one byte changed.
        #[test]
        fn agrees_with_serde_json_on_damaged_documents(
            v in value(),
            at in any::<prop::sample::Index>(),
            with in prop::sample::select(vec![
                "", " ", ",", ":", "\"", "\\", "{", "}", "[", "]", "0", "-", ".", "e", "x",
                "\u{1}", "é",
            ]),
        ) {
            let doc = v.to_string();
            let mut at = at.index(doc.len() + 1);
            while !doc.is_char_boundary(at) {
                at -= 1;
            }
            let end = doc[at..].chars().next().map_or(at, |c| at + c.len_utf8());
            let damaged = format!("{}{with}{}", &doc[..at], &doc[end..]);
            prop_assert_eq!(is_json(&damaged), serde_accepts(&damaged), "{:?}", damaged);
        }
    }
}
