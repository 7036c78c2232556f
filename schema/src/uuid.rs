//! UUID text form and response message ids, without allocation.

use crate::fb::UUID;

const HEX: &[u8; 16] = b"0123456789abcdef";

/// Length of the hyphenated text form (`8-4-4-4-12`).
pub const HYPHENATED_LEN: usize = 36;

/// Writes `uuid` as a lowercase hyphenated string (RFC 9562 byte order: the
/// bytes in the order the text reads) into a stack buffer.
pub fn format_hyphenated(bytes: &[u8; 16], out: &mut [u8; HYPHENATED_LEN]) {
    let mut o = 0;
    for (i, b) in bytes.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            out[o] = b'-';
            o += 1;
        }
        out[o] = HEX[(b >> 4) as usize];
        out[o + 1] = HEX[(b & 0xf) as usize];
        o += 2;
    }
}

/// The hyphenated form as a `&str` borrowed from `out`.
pub fn hyphenated<'o>(bytes: &[u8; 16], out: &'o mut [u8; HYPHENATED_LEN]) -> &'o str {
    format_hyphenated(bytes, out);
    // Only ASCII hex digits and '-' were written.
    std::str::from_utf8(out).unwrap_or_default()
}

/// Parses the hyphenated form (either case). Used by clients and tests.
pub fn parse_hyphenated(s: &str) -> Option<[u8; 16]> {
    let s = s.as_bytes();
    if s.len() != HYPHENATED_LEN {
        return None;
    }
    let mut out = [0u8; 16];
    let mut n = 0;
    let mut i = 0;
    while i < s.len() {
        if matches!(i, 8 | 13 | 18 | 23) {
            if s[i] != b'-' {
                return None;
            }
            i += 1;
            continue;
        }
        let hi = (s[i] as char).to_digit(16)?;
        let lo = (s[i + 1] as char).to_digit(16)?;
        out[n] = (hi * 16 + lo) as u8;
        n += 1;
        i += 2;
    }
    Some(out)
}

/// Makes message ids for responses: UUIDv7-shaped (48-bit millisecond time,
/// version and variant bits), the rest a per-generator random prefix plus a
/// counter, so ids are unique across shards and restarts without a syscall or
/// a lock per id.
#[derive(Debug, Clone)]
pub struct IdGenerator {
    prefix: u32,
    counter: u64,
}

impl IdGenerator {
    /// A generator whose ids do not collide with another generator's (the
    /// prefix mixes `seed`, the process id and the start time).
    pub fn new(seed: u64) -> Self {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        let mut x = seed ^ t ^ ((std::process::id() as u64) << 32) ^ 0x9e37_79b9_7f4a_7c15;
        // splitmix64 finaliser: spreads the inputs over all bits.
        x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        x ^= x >> 31;
        Self {
            prefix: x as u32,
            counter: x >> 32,
        }
    }

    /// The next id, stamped with `unix_millis`.
    pub fn next(&mut self, unix_millis: u64) -> UUID {
        self.counter = self.counter.wrapping_add(1);
        let mut b = [0u8; 16];
        b[..6].copy_from_slice(&unix_millis.to_be_bytes()[2..]);
        let c = self.counter.to_be_bytes();
        b[6] = 0x70 | (c[2] & 0x0f);
        b[7] = c[3];
        b[8] = 0x80 | (self.prefix as u8 & 0x3f);
        b[9..12].copy_from_slice(&self.prefix.to_be_bytes()[1..]);
        b[12..16].copy_from_slice(&c[4..]);
        UUID::new(&b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hyphenated_matches_rfc_9562_text_order() {
        let b = [
            0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef, 0xfe, 0xdc, 0xba, 0x98, 0x76, 0x54,
            0x32, 0x10,
        ];
        let mut out = [0u8; HYPHENATED_LEN];
        assert_eq!(
            hyphenated(&b, &mut out),
            "01234567-89ab-cdef-fedc-ba9876543210"
        );
        assert_eq!(
            parse_hyphenated("01234567-89AB-cdef-fedc-ba9876543210"),
            Some(b)
        );
    }

    #[test]
    fn parse_rejects_malformed_text() {
        assert_eq!(parse_hyphenated(""), None);
        assert_eq!(
            parse_hyphenated("0123456789ab-cdef-fedc-ba9876543210-"),
            None
        );
        assert_eq!(
            parse_hyphenated("g1234567-89ab-cdef-fedc-ba9876543210"),
            None
        );
    }

    #[test]
    fn generated_ids_are_v7_shaped_and_distinct() {
        let mut g = IdGenerator::new(1);
        let a = g.next(1_700_000_000_000);
        let b = g.next(1_700_000_000_000);
        assert_ne!(a.0, b.0);
        assert_eq!(a.0[6] >> 4, 7);
        assert_eq!(a.0[8] >> 6, 0b10);
    }
}
