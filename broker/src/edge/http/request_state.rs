//! A router's own state carried through the client between the rounds of a
//! multi round-trip (`requestState`, protocol 2026-07-28), sealed by the
//! broker.
//!
//! A tool that asks the client something (`elicit`, or a result asking for
//! sampling) may attach a `meta` entry [`STATE_META_KEY`] holding any JSON
//! value; the re-called tool gets it back as the argument [`STATE_ARG`]. In
//! the session-based revisions the broker holds it between the rounds (the
//! request's stream is open); in 2026-07-28 nothing is held: it goes to the
//! client as the InputRequiredResult's `requestState`, and the retry brings
//! it back. The token also names the question's `inputRequests` key, which
//! a router may choose ([`INPUT_KEY_META_KEY`]): the retry's answer is read
//! under that key.
//!
//! What the client holds is sealed with AES-256-GCM: it can neither read
//! the router's state nor change it, and a token answers only the call it
//! was made for. The associated data binds it to the tool's name and the
//! caller's subject (with `[auth]`), and the sealed text carries an expiry
//! (`http.request_state_ttl`). A token that fails any of these is refused
//! (-32602), never passed on.
//!
//! The key: `http.request_state_key_file`, or, without one, 32 random bytes
//! drawn at start-up. Every shard seals with the same key, so a retry may
//! land on any of them; brokers behind one load balancer need the same key
//! file, since a retry may land on any of them too.
//!
//! # Invariants
//! - Nothing is stored: a token is checked by the key alone.
//! - Every token gets a fresh random nonce (96 bits). AES-GCM with random
//!   nonces is safe for up to 2^32 messages per key (NIST SP 800-38D);
//!   questions to people are far rarer, and a fleet that could ask four
//!   billion under one key file should rotate it (docs/http.md).

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::rand::{SecureRandom, SystemRandom};

pub use super::jsonrpc::{INPUT_KEY_META_KEY, STATE_ARG, STATE_META_KEY};

/// Longest `inputRequests` key a router may choose.
pub const MAX_INPUT_KEY_BYTES: usize = 64;

/// What a question asked for: how its answer is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Asked {
    Elicitation,
    Sampling,
    Roots,
}

/// What a `requestState` token carries: the questions asked, each by kind
/// and `inputRequests` key, and the router's state (JSON text), if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Question<S> {
    /// One question, or those of a set (`many`); never empty.
    pub asks: Vec<(Asked, S)>,
    /// Asked as a set (`mcp-broker/input-requests`): the answers go back
    /// together under `_inputs`, not each under its kind's own argument.
    pub many: bool,
    pub state: Option<S>,
}

impl<S> Question<S> {
    /// One question alone.
    pub fn one(asked: Asked, key: S, state: Option<S>) -> Self {
        Question {
            asks: vec![(asked, key)],
            many: false,
            state,
        }
    }
}

/// Most questions a set may hold (`mcp-broker/input-requests`).
pub const MAX_INPUT_REQUESTS: usize = 8;

/// Largest state a router may attach (its JSON text), in 2026-07-28 where
/// it travels through the client: about 5.5 KiB once sealed and encoded.
pub const MAX_STATE_BYTES: usize = 4096;

/// The first byte of every token: the format, for a later change of it.
/// Tokens sealed now: the issue time before the expiry, and the version
/// in the associated data. Version 1 (the expiry only) is still opened,
/// for the tokens a broker of the release before issued in a rolling
/// upgrade (they live a ttl).
const VERSION: u8 = 2;
const VERSION_1: u8 = 1;
const TAG_LEN: usize = 16;
const EXPIRY_LEN: usize = 8;
/// How far behind the sealing broker's clock an opening broker's may be:
/// a token issued more than `SKEW` ahead of the opener's clock is refused
/// as `clock_skew` (a broker whose clock lags would otherwise open it for
/// longer than its ttl: an hour behind, an hour longer). The expiry is
/// read as sealed: an opener whose clock runs ahead cuts the time left.
pub const SKEW: u64 = 30;
const KEY_LEN: usize = 32;

/// Seals and opens `requestState` tokens (one per process, shared by every
/// shard).
pub struct RequestStates {
    key: LessSafeKey,
    ttl: Duration,
    rng: SystemRandom,
    /// Tokens sealed, and refused by reason ([`Refused::ALL`]'s order), for
    /// `mcp_http_request_states_*_total`.
    issued: AtomicU64,
    refused: [AtomicU64; Refused::ALL.len()],
}

impl std::fmt::Debug for RequestStates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestStates")
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

/// Why a token was refused: the refusal's message names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Not a token of this broker's format at all.
    Malformed,
    /// Changed, made for another tool or caller, or sealed under another key.
    Integrity,
    /// Older than `http.request_state_ttl`.
    Expired,
    /// Issued, by the sealing broker's clock, more than [`SKEW`] ahead of
    /// this broker's: their clocks disagree.
    ClockSkew,
}

impl Refused {
    pub const ALL: [Refused; 4] = [
        Refused::Malformed,
        Refused::Integrity,
        Refused::Expired,
        Refused::ClockSkew,
    ];

    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Refused::Malformed => "malformed",
            Refused::Integrity => "integrity",
            Refused::Expired => "expired",
            Refused::ClockSkew => "clock_skew",
        }
    }
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Refused::Malformed => "`requestState` is not one this server issued",
            Refused::Integrity => {
                "`requestState` failed its integrity check: it was changed, it belongs to another tool or caller, or another server sealed it (brokers behind one load balancer need the same http.request_state_key_file)"
            }
            Refused::Expired => {
                "`requestState` has expired (http.request_state_ttl): call the tool again without it"
            }
            Refused::ClockSkew => {
                "`requestState` was issued by a server whose clock is more than 30 s ahead of this one's (brokers behind one load balancer need synchronised clocks): call the tool again without it"
            }
        })
    }
}

impl RequestStates {
    /// The key from `key_file` (32 bytes, or 64 hexadecimal digits with an
    /// optional trailing newline), or a random one when `key_file` is empty.
    pub fn new(key_file: &Path, ttl: Duration) -> Result<Self, String> {
        let rng = SystemRandom::new();
        let mut key = [0u8; KEY_LEN];
        if key_file.as_os_str().is_empty() {
            rng.fill(&mut key)
                .map_err(|_| "http.request_state_key_file: no random key could be drawn")?;
        } else {
            let bytes = std::fs::read(key_file).map_err(|e| {
                format!(
                    "http.request_state_key_file: cannot read {}: {e}",
                    key_file.display()
                )
            })?;
            key = parse_key(&bytes).ok_or_else(|| {
                format!(
                    "http.request_state_key_file: {} holds {} bytes; it must hold 32 bytes, or 64 hexadecimal digits (`openssl rand -hex 32`)",
                    key_file.display(),
                    bytes.len()
                )
            })?;
        }
        Ok(Self::with_key(&key, ttl, rng))
    }

    fn with_key(key: &[u8; KEY_LEN], ttl: Duration, rng: SystemRandom) -> Self {
        let unbound = UnboundKey::new(&AES_256_GCM, key).expect("a 32-byte AES-256 key");
        Self {
            key: LessSafeKey::new(unbound),
            ttl,
            rng,
            issued: AtomicU64::new(0),
            refused: Default::default(),
        }
    }

    /// Tokens sealed since start-up.
    pub fn issued(&self) -> u64 {
        self.issued.load(Ordering::Relaxed)
    }

    /// Tokens refused since start-up, by reason.
    pub fn refusals(&self) -> impl Iterator<Item = (Refused, u64)> + '_ {
        Refused::ALL
            .into_iter()
            .zip(&self.refused)
            .map(|(r, n)| (r, n.load(Ordering::Relaxed)))
    }

    /// The token for question `q`, answering only `tool` called by
    /// `subject` ("" without `[auth]`) within the ttl. The key must be at
    /// most [`MAX_INPUT_KEY_BYTES`] long (the caller's check).
    pub fn seal(&self, tool: &str, subject: &str, q: &Question<&str>) -> String {
        self.issued.fetch_add(1, Ordering::Relaxed);
        self.seal_at(tool, subject, q, now_secs())
    }

    fn seal_at(&self, tool: &str, subject: &str, q: &Question<&str>, now: u64) -> String {
        self.seal_as(VERSION, tool, subject, q, now)
    }

    fn seal_as(
        &self,
        version: u8,
        tool: &str,
        subject: &str,
        q: &Question<&str>,
        now: u64,
    ) -> String {
        debug_assert!(!q.asks.is_empty() && q.asks.len() <= MAX_INPUT_REQUESTS);
        debug_assert!(q.asks.iter().all(|(_, k)| k.len() <= MAX_INPUT_KEY_BYTES));
        debug_assert!(q.many || q.asks.len() == 1);
        let mut nonce = [0u8; NONCE_LEN];
        // SystemRandom fails only where the OS has no randomness at all,
        // which start-up (`new`) has already shown not to be the case.
        self.rng.fill(&mut nonce).expect("the OS's random source");
        let expiry = now.saturating_add(self.ttl.as_secs());
        let state = q.state.unwrap_or_default();
        let keys: usize = q.asks.iter().map(|(_, k)| 2 + k.len()).sum();
        let mut buf =
            Vec::with_capacity(1 + NONCE_LEN + 2 * EXPIRY_LEN + 2 + keys + state.len() + TAG_LEN);
        buf.push(version);
        buf.extend_from_slice(&nonce);
        // The plaintext: the issue time (version 2), the expiry; the form
        // (one question's kind, or `m` and the count of a set), upper case
        // when a state follows; each question's kind (a set's only), key
        // length and key; the state.
        if version != VERSION_1 {
            buf.extend_from_slice(&now.to_be_bytes());
        }
        buf.extend_from_slice(&expiry.to_be_bytes());
        let kind = |a: Asked| match a {
            Asked::Elicitation => b'e',
            Asked::Sampling => b's',
            Asked::Roots => b'r',
        };
        let form = if q.many { b'm' } else { kind(q.asks[0].0) };
        buf.push(if q.state.is_some() {
            form.to_ascii_uppercase()
        } else {
            form
        });
        if q.many {
            buf.push(q.asks.len() as u8);
        }
        for &(asked, key) in &q.asks {
            if q.many {
                buf.push(kind(asked));
            }
            buf.push(key.len() as u8);
            buf.extend_from_slice(key.as_bytes());
        }
        buf.extend_from_slice(state.as_bytes());
        let mut sealed = buf.split_off(1 + NONCE_LEN);
        let tag = self
            .key
            .seal_in_place_separate_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(aad(version, tool, subject)),
                &mut sealed,
            )
            .expect("a plaintext far below AES-GCM's limit");
        buf.extend_from_slice(&sealed);
        buf.extend_from_slice(tag.as_ref());
        URL_SAFE_NO_PAD.encode(&buf)
    }

    /// The question a token carries for `tool` called by `subject`.
    pub fn open(
        &self,
        token: &str,
        tool: &str,
        subject: &str,
    ) -> Result<Question<String>, Refused> {
        let opened = self.open_at(token, tool, subject, now_secs());
        if let Err(why) = opened {
            self.count_refusal(why);
            // A client's mistake, or a fleet whose brokers hold different
            // keys: the metric tells which, the log names the tool.
            tracing::debug!(tool, reason = why.as_str(), "requestState refused");
        }
        opened
    }

    /// Counts a retry refused for its `requestState` before any token was
    /// opened (one that is not a string is `Malformed`).
    pub fn count_refusal(&self, why: Refused) {
        self.refused[why as usize].fetch_add(1, Ordering::Relaxed);
    }

    fn open_at(
        &self,
        token: &str,
        tool: &str,
        subject: &str,
        now: u64,
    ) -> Result<Question<String>, Refused> {
        let mut buf = URL_SAFE_NO_PAD
            .decode(token)
            .map_err(|_| Refused::Malformed)?;
        let version = *buf.first().ok_or(Refused::Malformed)?;
        let times = match version {
            VERSION => 2 * EXPIRY_LEN,
            VERSION_1 => EXPIRY_LEN,
            _ => return Err(Refused::Malformed),
        };
        if buf.len() < 1 + NONCE_LEN + times + TAG_LEN {
            return Err(Refused::Malformed);
        }
        let nonce: [u8; NONCE_LEN] = buf[1..1 + NONCE_LEN].try_into().expect("length checked");
        let plain = self
            .key
            .open_in_place(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(aad(version, tool, subject)),
                &mut buf[1 + NONCE_LEN..],
            )
            .map_err(|_| Refused::Integrity)?;
        let (times, rest) = plain.split_at(times);
        let time = |b: &[u8]| u64::from_be_bytes(b.try_into().expect("length checked"));
        let (issued, expiry) = if version == VERSION_1 {
            (None, time(times))
        } else {
            let (issued, expiry) = times.split_at(EXPIRY_LEN);
            (Some(time(issued)), time(expiry))
        };
        if issued.is_some_and(|i| i > now.saturating_add(SKEW)) {
            return Err(Refused::ClockSkew);
        }
        if now > expiry {
            return Err(Refused::Expired);
        }
        // Sealed by `seal`: only a forged token could fail from here on,
        // and a forged one fails the tag first.
        let (&form, mut rest) = rest.split_first().ok_or(Refused::Integrity)?;
        let byte = |rest: &mut &[u8]| -> Result<u8, Refused> {
            let (&b, more) = rest.split_first().ok_or(Refused::Integrity)?;
            *rest = more;
            Ok(b)
        };
        let kind = |b: u8| match b {
            b'e' => Ok(Asked::Elicitation),
            b's' => Ok(Asked::Sampling),
            b'r' => Ok(Asked::Roots),
            _ => Err(Refused::Integrity),
        };
        let text = |b: &[u8]| String::from_utf8(b.to_vec()).map_err(|_| Refused::Integrity);
        let many = form.eq_ignore_ascii_case(&b'm');
        let count = if many {
            usize::from(byte(&mut rest)?)
        } else {
            1
        };
        let mut asks = Vec::with_capacity(count);
        for _ in 0..count {
            let asked = kind(if many {
                byte(&mut rest)?
            } else {
                form.to_ascii_lowercase()
            })?;
            let len = usize::from(byte(&mut rest)?);
            let (key, more) = rest.split_at_checked(len).ok_or(Refused::Integrity)?;
            asks.push((asked, text(key)?));
            rest = more;
        }
        if asks.is_empty() {
            return Err(Refused::Integrity);
        }
        Ok(Question {
            asks,
            many,
            state: form.is_ascii_uppercase().then(|| text(rest)).transpose()?,
        })
    }
}

/// What a token is bound to besides its key: the tool and the caller. The
/// lengths keep ("ab", "c") and ("a", "bc") apart.
fn aad(version: u8, tool: &str, subject: &str) -> Vec<u8> {
    let mut a = Vec::with_capacity(33 + tool.len() + subject.len());
    a.extend_from_slice(b"mcp-broker requestState\0");
    for part in [tool, subject] {
        a.extend_from_slice(&(part.len() as u64).to_be_bytes());
        a.extend_from_slice(part.as_bytes());
    }
    // Version 2 on: its version byte, outside the sealed text, is bound
    // too (so that no token reads as another version's).
    if version != VERSION_1 {
        a.push(version);
    }
    a
}

fn parse_key(bytes: &[u8]) -> Option<[u8; KEY_LEN]> {
    if let Ok(raw) = <[u8; KEY_LEN]>::try_from(bytes) {
        return Some(raw);
    }
    let text = std::str::from_utf8(bytes).ok()?;
    let hex = text.strip_suffix('\n').unwrap_or(text);
    let hex = hex.strip_suffix('\r').unwrap_or(hex);
    if hex.len() != 2 * KEY_LEN || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let mut key = [0u8; KEY_LEN];
    for (i, k) in key.iter_mut().enumerate() {
        *k = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(key)
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn states(key: u8) -> RequestStates {
        RequestStates::with_key(
            &[key; KEY_LEN],
            Duration::from_secs(600),
            SystemRandom::new(),
        )
    }

    fn q(state: &str) -> Question<&str> {
        Question::one(Asked::Elicitation, "elicitation", Some(state))
    }

    fn state_of(r: Result<Question<String>, Refused>) -> Result<String, Refused> {
        r.map(|q| q.state.expect("a state"))
    }

    #[test]
    fn a_token_carries_the_questions_kind_key_and_state() {
        let s = states(5);
        for asked in [Asked::Elicitation, Asked::Sampling, Asked::Roots] {
            for state in [None, Some(""), Some(r#"{"a":[1,2]}"#)] {
                for key in ["", "user_name", &"k".repeat(MAX_INPUT_KEY_BYTES)] {
                    let t = s.seal("t", "", &Question::one(asked, key, state));
                    let got = s.open(&t, "t", "").unwrap();
                    assert_eq!(got.asks, [(asked, key.to_owned())]);
                    assert!(!got.many);
                    assert_eq!(got.state.as_deref(), state);
                }
            }
        }
    }

    #[test]
    fn a_token_carries_a_set_of_questions_in_order() {
        let s = states(9);
        let long = "k".repeat(MAX_INPUT_KEY_BYTES);
        let sets: [&[(Asked, &str)]; 3] = [
            &[(Asked::Roots, "only")],
            &[
                (Asked::Elicitation, "user_name"),
                (Asked::Sampling, "greeting"),
                (Asked::Roots, "client_roots"),
            ],
            &[(Asked::Sampling, long.as_str()); MAX_INPUT_REQUESTS],
        ];
        for asks in sets {
            for state in [None, Some(r#"{"n":1}"#)] {
                let q = Question {
                    asks: asks.to_vec(),
                    many: true,
                    state,
                };
                let got = s.open(&s.seal("t", "", &q), "t", "").unwrap();
                let want: Vec<_> = asks.iter().map(|&(a, k)| (a, k.to_owned())).collect();
                assert_eq!(got.asks, want);
                assert!(got.many, "a set of one stays a set");
                assert_eq!(got.state.as_deref(), state);
            }
        }
    }

    #[test]
    fn a_token_opens_for_its_own_call_only() {
        let s = states(7);
        let t = s.seal("kv__ask", "alice", &q(r#"{"step":2}"#));
        assert_eq!(
            state_of(s.open(&t, "kv__ask", "alice")).unwrap(),
            r#"{"step":2}"#
        );
        // Another tool, another caller, another broker's key.
        assert_eq!(s.open(&t, "kv__other", "alice"), Err(Refused::Integrity));
        assert_eq!(s.open(&t, "kv__ask", "bob"), Err(Refused::Integrity));
        assert_eq!(s.open(&t, "kv__ask", ""), Err(Refused::Integrity));
        assert_eq!(
            states(8).open(&t, "kv__ask", "alice"),
            Err(Refused::Integrity)
        );
        // The binding's parts cannot be shifted into one another.
        let t = s.seal("ab", "c", &q("1"));
        assert_eq!(s.open(&t, "a", "bc"), Err(Refused::Integrity));
    }

    #[test]
    fn every_token_is_fresh_and_hides_the_state() {
        let s = states(1);
        let (a, b) = (
            s.seal("t", "", &q("\"secret\"")),
            s.seal("t", "", &q("\"secret\"")),
        );
        assert_ne!(a, b, "a fresh nonce each time");
        for t in [&a, &b] {
            let raw = URL_SAFE_NO_PAD.decode(t).unwrap();
            assert!(!raw.windows(6).any(|w| w == b"secret"), "{t}");
        }
    }

    #[test]
    fn a_changed_token_is_refused() {
        let s = states(3);
        let t = s.seal("t", "", &q(r#"{"n":1}"#));
        // What the conformance suite does, and a flipped bit at every place.
        assert!(s.open(&format!("{t}-TAMPERED"), "t", "").is_err());
        let raw = URL_SAFE_NO_PAD.decode(&t).unwrap();
        for i in 0..raw.len() {
            let mut bad = raw.clone();
            bad[i] ^= 0x01;
            let r = s.open(&URL_SAFE_NO_PAD.encode(&bad), "t", "");
            assert!(r.is_err(), "byte {i} flipped was accepted");
        }
        for junk in [
            "",
            "not base64!",
            "AAAA",
            &URL_SAFE_NO_PAD.encode([3u8; 64]),
        ] {
            assert_eq!(s.open(junk, "t", ""), Err(Refused::Malformed), "{junk:?}");
        }
        assert!(s.open(&t[..t.len() - 1], "t", "").is_err());
    }

    #[test]
    fn seals_and_refusals_are_counted_by_reason() {
        let s = states(6);
        let t = s.seal("t", "", &q("1"));
        s.open(&t, "t", "").unwrap();
        let _ = s.open(&t, "u", "");
        let _ = s.open("!", "t", "");
        let _ = s.open("!!", "t", "");
        assert_eq!(s.issued(), 1);
        let got: Vec<_> = s.refusals().map(|(r, n)| (r.as_str(), n)).collect();
        assert_eq!(
            got,
            [
                ("malformed", 2),
                ("integrity", 1),
                ("expired", 0),
                ("clock_skew", 0)
            ]
        );
    }

    #[test]
    fn a_token_expires_after_the_ttl_and_the_clocks_skew() {
        let s = states(4);
        let t = s.seal_at("t", "", &q("1"), 1_000);
        assert_eq!(state_of(s.open_at(&t, "t", "", 1_600)).unwrap(), "1");
        assert_eq!(s.open_at(&t, "t", "", 1_601), Err(Refused::Expired));
        // An opener whose clock runs behind by up to SKEW opens it; past
        // that, its clock would hold the token longer than the ttl (an
        // hour behind: an hour longer).
        assert_eq!(state_of(s.open_at(&t, "t", "", 970)).unwrap(), "1");
        assert_eq!(s.open_at(&t, "t", "", 969), Err(Refused::ClockSkew));
    }

    #[test]
    fn a_version_1_token_of_the_release_before_opens_within_its_ttl() {
        let s = states(4);
        let t = s.seal_as(VERSION_1, "t", "", &q("1"), 1_000);
        assert_eq!(state_of(s.open_at(&t, "t", "", 1_600)).unwrap(), "1");
        assert_eq!(s.open_at(&t, "t", "", 1_601), Err(Refused::Expired));
        assert_eq!(state_of(s.open_at(&t, "t", "", 0)).unwrap(), "1");
        // Its version byte cannot be changed to read it as the other one.
        let mut raw = URL_SAFE_NO_PAD.decode(&t).unwrap();
        raw[0] = VERSION;
        let t2 = URL_SAFE_NO_PAD.encode(&raw);
        assert_eq!(s.open_at(&t2, "t", "", 1_000), Err(Refused::Integrity));
    }

    #[test]
    fn key_files_hold_raw_or_hex_keys() {
        let dir = std::env::temp_dir().join(format!("mcp-rs-key-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ttl = Duration::from_secs(60);
        let raw = dir.join("raw");
        std::fs::write(&raw, [9u8; 32]).unwrap();
        let hex = dir.join("hex");
        std::fs::write(&hex, format!("{}\n", "09".repeat(32))).unwrap();
        let (a, b) = (
            RequestStates::new(&raw, ttl).unwrap(),
            RequestStates::new(&hex, ttl).unwrap(),
        );
        // The same key either way: one's token opens with the other.
        assert_eq!(
            state_of(b.open(&a.seal("t", "", &q("true")), "t", "")).unwrap(),
            "true"
        );
        let short = dir.join("short");
        std::fs::write(&short, "abc\n").unwrap();
        let e = RequestStates::new(&short, ttl).unwrap_err();
        assert!(e.contains("4 bytes") && e.contains("64 hexadecimal"), "{e}");
        let e = RequestStates::new(&dir.join("missing"), ttl).unwrap_err();
        assert!(e.contains("cannot read"), "{e}");
        // Without a file: a random key, different per process (and call).
        let (r1, r2) = (
            RequestStates::new(Path::new(""), ttl).unwrap(),
            RequestStates::new(Path::new(""), ttl).unwrap(),
        );
        assert_eq!(
            r2.open(&r1.seal("t", "", &q("1")), "t", ""),
            Err(Refused::Integrity)
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
