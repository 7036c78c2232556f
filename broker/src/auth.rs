//! Bearer JWT authentication and scope authorization (`[auth]`,
//! `docs/security.md`): OAuth 2.1 resource-server rules as the MCP
//! authorization spec asks (2025-06-18, 2025-11-25).
//!
//! # Invariants
//! - A token is accepted only when signed by a key of the configured JWK
//!   Set with an algorithm of that key's type (RSA: RS*/PS*; EC: the
//!   curve's ES*; OKP Ed25519: EdDSA), never `none` and never HMAC: an
//!   issuer's JWK Set holds public keys, and `oct` keys are refused at load.
//! - `iss` must be the configured issuer and `aud` this broker's canonical
//!   resource URI (RFC 8707); `exp` is required; `exp` and `nbf` are checked
//!   with the configured leeway.
//! - A token, or any part of one, never reaches a log line or a metric; a
//!   failure is counted by its reason only.
//! - No request waits for the JWK Set: it is read (file) or fetched
//!   (`jwks_url`) on the `auth-keys` thread only, at start-up, every
//!   `jwks_refresh_interval`, and when kicked by a token naming an unknown
//!   key (at most once per [`KEY_REFRESH_GAP`]). A request path may be a
//!   shard thread, where blocking I/O would stall every connection of the
//!   shard. A failed refresh keeps the keys held.
//! - `http://` for `jwks_url` is refused but for loopback hosts: a key set
//!   fetched in clear from a remote host could be replaced on the way, and
//!   whoever controls it mints tokens.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use base64::Engine as _;
use http_body_util::BodyExt as _;
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};

use crate::config::AuthSection;

mod jwt_ring;
/// Installs the ring-backed JWT provider ([`jwt_ring`]); [`Auth::new`]
/// does, and so must anything that signs or verifies with `jsonwebtoken`
/// before one exists (the tests that mint tokens).
pub use jwt_ring::install as install_jwt_crypto;

/// The shortest time between two re-reads of the JWK Set caused by tokens
/// naming a key it does not hold: a flood of such tokens costs one read per
/// interval, not one per token. It counts from the last refresh made after
/// start-up (asked for or periodic), so the first unknown key after
/// start-up is looked up at once.
pub const KEY_REFRESH_GAP: Duration = Duration::from_secs(30);

/// The shortest `jwks_refresh_interval`: the issuer is not to be polled in
/// a loop.
pub const MIN_REFRESH_INTERVAL: Duration = Duration::from_secs(1);

/// Bound on one fetch of a `jwks_url`, connecting included: start-up waits
/// for the first one.
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(10);

/// The largest JWK Set answer read: a set of a few keys is a few KiB.
pub const MAX_JWKS_BYTES: usize = 1 << 20;

/// The RSA key sizes a JWK Set may hold: what the signature check
/// (ring) accepts. Shorter keys are breakable (NIST has disallowed
/// 1024-bit RSA signatures since 2013); a set holding one is refused when
/// it loads rather than every token signed with it being refused later.
pub const MIN_RSA_BITS: usize = 2048;
pub const MAX_RSA_BITS: usize = 8192;

/// The size in bits of a JWK's base64url modulus `n`.
fn rsa_bits(n: &str) -> Option<usize> {
    let n = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(n.trim_end_matches('='))
        .ok()?;
    let skip = n.iter().take_while(|&&b| b == 0).count();
    let n = &n[skip..];
    let top = *n.first()?;
    Some(n.len() * 8 - top.leading_zeros() as usize)
}

/// Why a request was not authenticated or not authorized; the label of
/// `mcp_auth_failures_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// No `Authorization: Bearer` credential.
    Missing,
    /// Not a JWT (three base64url parts with a JSON header and claims), or
    /// a required claim missing or of the wrong type.
    Malformed,
    /// `alg` is `none`, unknown, or not one the key's type allows (e.g.
    /// HS256 over an RSA key).
    Algorithm,
    /// `kid` names no key of the set held (the `auth-keys` thread is then
    /// asked to read it again, rate-limited: a later request may pass).
    UnknownKey,
    /// The signature does not verify.
    Signature,
    Expired,
    NotYetValid,
    Issuer,
    Audience,
    /// Authenticated, but without the scopes the request needs.
    InsufficientScope,
}

impl Failure {
    pub const ALL: [Failure; 10] = [
        Failure::Missing,
        Failure::Malformed,
        Failure::Algorithm,
        Failure::UnknownKey,
        Failure::Signature,
        Failure::Expired,
        Failure::NotYetValid,
        Failure::Issuer,
        Failure::Audience,
        Failure::InsufficientScope,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Failure::Missing => "missing",
            Failure::Malformed => "malformed",
            Failure::Algorithm => "algorithm",
            Failure::UnknownKey => "unknown_key",
            Failure::Signature => "signature",
            Failure::Expired => "expired",
            Failure::NotYetValid => "not_yet_valid",
            Failure::Issuer => "issuer",
            Failure::Audience => "audience",
            Failure::InsufficientScope => "insufficient_scope",
        }
    }

    /// What the client is told: [`Self::message`], and for a missing scope
    /// the scopes `needed` (never the token).
    pub fn describe(self, needed: &[String]) -> String {
        if needed.is_empty() || self != Failure::InsufficientScope {
            self.message().to_owned()
        } else {
            format!("{}: needs {}", self.message(), needed.join(" "))
        }
    }

    /// What the client is told (never the token).
    pub fn message(self) -> &'static str {
        match self {
            Failure::Missing => "authentication required: send Authorization: Bearer <token>",
            Failure::Malformed => "invalid token: not a well-formed JWT with the required claims",
            Failure::Algorithm => "invalid token: its algorithm is not accepted for its key",
            Failure::UnknownKey => "invalid token: signed by an unknown key",
            Failure::Signature => "invalid token: the signature does not verify",
            Failure::Expired => "invalid token: expired",
            Failure::NotYetValid => "invalid token: not valid yet (nbf)",
            Failure::Issuer => "invalid token: wrong issuer",
            Failure::Audience => "invalid token: not issued for this resource (aud)",
            Failure::InsufficientScope => "insufficient scope",
        }
    }
}

/// Who a valid token speaks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// `sub`: never empty (a token without one is malformed).
    pub subject: String,
    /// `scope` (space-separated) or `scp` (array).
    pub scopes: Vec<String>,
    /// `exp` plus `auth.leeway`, in seconds since the Unix epoch: when the
    /// token stops being accepted, as its verification judges it. A
    /// connection authenticated once (frames) stops being served then.
    /// (Without the leeway a frame connection whose token was inside it
    /// was accepted at `InitializeRequest` and then refused every call.)
    pub expires_at: u64,
}

impl Principal {
    /// Whether its token is past `exp` and the leeway.
    pub fn expired(&self) -> bool {
        jsonwebtoken::get_current_timestamp() > self.expires_at
    }

    /// When [`Self::expired`] turns true, as an instant: when a stream the
    /// token opened (a GET or listen stream, a gRPC Subscribe) must end,
    /// for it is one request that would otherwise outlive its token
    /// without limit. `None` for an `exp` too far ahead for an `Instant`
    /// (a signed `exp` of u64::MAX once panicked the shard here, taking
    /// the process down): such a token does not end its stream.
    pub fn stream_deadline(&self) -> Option<std::time::Instant> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        // `expired` compares whole seconds: true from `expires_at + 1` on.
        let left =
            std::time::Duration::from_secs(self.expires_at.saturating_add(1)).saturating_sub(now);
        std::time::Instant::now().checked_add(left)
    }
}

/// One verification key and the algorithms its type allows.
struct Key {
    kid: Option<String>,
    key: DecodingKey,
    algorithms: Vec<Algorithm>,
}

/// The issuer's signing keys.
pub struct KeySet {
    keys: Vec<Key>,
}

impl KeySet {
    /// Reads a JWK Set file; an error names the key it refuses.
    pub fn load(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        Self::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    pub fn parse(text: &str) -> Result<Self, String> {
        let set: JwkSet = serde_json::from_str(text).map_err(|e| format!("not a JWK Set: {e}"))?;
        let mut keys = Vec::with_capacity(set.keys.len());
        for (i, jwk) in set.keys.iter().enumerate() {
            let kid = jwk.common.key_id.clone();
            let name = kid
                .as_deref()
                // Escaped: the issuer's text, which reaches the log.
                .map_or_else(
                    || format!("keys[{i}]"),
                    |k| format!("key `{}`", k.escape_debug()),
                );
            let mut algorithms = match &jwk.algorithm {
                AlgorithmParameters::RSA(_) => vec![
                    Algorithm::RS256,
                    Algorithm::RS384,
                    Algorithm::RS512,
                    Algorithm::PS256,
                    Algorithm::PS384,
                    Algorithm::PS512,
                ],
                AlgorithmParameters::EllipticCurve(p) => match p.curve {
                    EllipticCurve::P256 => vec![Algorithm::ES256],
                    EllipticCurve::P384 => vec![Algorithm::ES384],
                    ref c => return Err(format!("{name}: curve {c:?} is not supported")),
                },
                AlgorithmParameters::OctetKeyPair(p) if p.curve == EllipticCurve::Ed25519 => {
                    vec![Algorithm::EdDSA]
                }
                AlgorithmParameters::OctetKey(_) => {
                    return Err(format!(
                        "{name}: symmetric (oct) keys are refused: a JWK Set for verification holds the issuer's public keys"
                    ));
                }
                _ => return Err(format!("{name}: key type not supported")),
            };
            // A key that names its algorithm allows that one only.
            if let Some(alg) = &jwk.common.key_algorithm {
                let named: Option<Algorithm> = format!("{alg:?}").parse().ok();
                match named {
                    Some(a) if algorithms.contains(&a) => algorithms = vec![a],
                    _ => {
                        return Err(format!(
                            "{name}: its `alg` {alg:?} does not fit its key type"
                        ));
                    }
                }
            }
            if let AlgorithmParameters::RSA(p) = &jwk.algorithm {
                let bits = rsa_bits(&p.n).ok_or_else(|| format!("{name}: `n` is not base64url"))?;
                if !(MIN_RSA_BITS..=MAX_RSA_BITS).contains(&bits) {
                    return Err(format!(
                        "{name}: an RSA key of {bits} bits; {MIN_RSA_BITS} to {MAX_RSA_BITS} are accepted"
                    ));
                }
            }
            let key = DecodingKey::from_jwk(jwk).map_err(|e| format!("{name}: {e}"))?;
            keys.push(Key {
                kid,
                key,
                algorithms,
            });
        }
        if keys.is_empty() {
            return Err("the JWK Set holds no key".into());
        }
        Ok(Self { keys })
    }

    /// The key a token's `kid` names; without a `kid`, the set's only key.
    fn find(&self, kid: Option<&str>) -> Option<&Key> {
        match kid {
            Some(k) => self.keys.iter().find(|x| x.kid.as_deref() == Some(k)),
            None if self.keys.len() == 1 => self.keys.first(),
            None => None,
        }
    }
}

/// What the request paths and the `auth-keys` thread share. The thread
/// holds it by a [`Weak`] only: dropping the [`Auth`] frees it.
struct KeyState {
    keys: arc_swap::ArcSwap<KeySet>,
    /// Which key set is in `keys`: this `Auth`'s unique id in the high 32
    /// bits, a count of stores in the low 32. A cached verification
    /// ([`VERIFIED`]) holds only under the generation it was made with.
    generation: AtomicU64,
    /// Refreshes after start-up that stored a new set.
    refreshes: AtomicU64,
    /// Refreshes after start-up that failed (the keys held were kept).
    refresh_failures: AtomicU64,
}

impl KeyState {
    /// Puts a new key set in service; verifications cached under the old
    /// one no longer count (a key removed from the set stops its tokens).
    fn store(&self, keys: KeySet) {
        self.keys.store(Arc::new(keys));
        self.generation.fetch_add(1, Ordering::AcqRel);
    }
}

/// Distinguishes the `Auth`s of one process (tests make several) in the
/// key-set generation.
static NEXT_AUTH: AtomicU64 = AtomicU64::new(1);

/// Verified tokens a thread keeps. A client presents the same token on
/// every request until it expires, and checking an RS256 signature costs
/// about 150 µs of CPU (`bench/results/2026-11-30-vm-auth.md`), three times
/// a whole HTTP request: so a valid token is verified once per thread and
/// key set, and found here after that (its `exp` still checked on every
/// use). Only successes are kept; the map is bounded and emptied when full.
const VERIFIED_PER_THREAD: usize = 1024;

/// A verified token's last [`TAIL`] bytes and its length → (the whole
/// token, key-set generation, whom it speaks for).
///
/// Keyed by the tail, not the whole token: hashing a ~1 KB token with
/// SipHash cost more than the rest of the lookup (`bench/NOTES.md`, issue
/// 14), and a JWT's tail is its signature, where two tokens differ. A hit
/// still compares every byte. foldhash, not SipHash: on these 40 bytes it
/// is several times cheaper and still seeded per process. Only verified
/// tokens are stored, so a caller cannot fill a bucket with tokens sharing
/// a tail; two valid ones that did would only replace each other.
type Verified = foldhash::HashMap<Tail, (Box<str>, u64, Arc<Principal>)>;

const TAIL: usize = 32;
type Tail = (usize, [u8; TAIL]);

fn tail(b: &[u8]) -> Tail {
    let mut t = [0; TAIL];
    let n = b.len().min(TAIL);
    t[..n].copy_from_slice(&b[b.len() - n..]);
    (b.len(), t)
}

thread_local! {
    static VERIFIED: std::cell::RefCell<Verified> = std::cell::RefCell::default();
}

/// The configured authentication: keys, rules, counters.
pub struct Auth {
    pub cfg: AuthSection,
    state: Arc<KeyState>,
    /// Asks the `auth-keys` thread for a refresh; bounded (1) and only ever
    /// `try_send`: a request never waits, and kicks while one is queued
    /// coalesce. Dropped with the `Auth`, which ends the thread.
    kick: crossbeam_channel::Sender<()>,
    /// Tool name (as clients see it) → scopes it needs besides `cfg.scopes`.
    rules: foldhash::HashMap<String, Vec<String>>,
    /// Failures by reason ([`Failure::ALL`] order).
    failures: [AtomicU64; Failure::ALL.len()],
    metadata: String,
    resource_metadata_url: String,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Auth")
            .field("issuer", &self.cfg.issuer)
            .field("audience", &self.cfg.audience)
            .finish_non_exhaustive()
    }
}

impl Auth {
    /// Reads the JWK Set (fetches it, for `jwks_url`, within
    /// [`FETCH_TIMEOUT`]) and starts the `auth-keys` thread; fails, naming
    /// the file or URL and why, when the set cannot be had: never serve
    /// without keys.
    pub fn new(cfg: &AuthSection) -> Result<Self, String> {
        jwt_ring::install();
        let source = Source::new(cfg)?;
        let state = Arc::new(KeyState {
            keys: arc_swap::ArcSwap::from_pointee(KeySet { keys: Vec::new() }),
            generation: AtomicU64::new(NEXT_AUTH.fetch_add(1, Ordering::Relaxed) << 32),
            refreshes: AtomicU64::new(0),
            refresh_failures: AtomicU64::new(0),
        });
        let (kick, kicked) = crossbeam_channel::bounded(1);
        start_refresher(
            source,
            Arc::downgrade(&state),
            kicked,
            cfg.jwks_refresh_interval,
        )?;
        let mut rules = foldhash::HashMap::<String, Vec<String>>::default();
        for r in &cfg.rules {
            for t in &r.tools {
                rules
                    .entry(t.clone())
                    .or_default()
                    .extend(r.scopes.iter().cloned());
            }
        }
        let servers = if cfg.authorization_servers.is_empty() {
            vec![cfg.issuer.clone()]
        } else {
            cfg.authorization_servers.clone()
        };
        let mut supported: Vec<String> = cfg.scopes.clone();
        for r in &cfg.rules {
            supported.extend(r.scopes.iter().cloned());
        }
        supported.sort();
        supported.dedup();
        let metadata = serde_json::json!({
            "resource": cfg.audience,
            "authorization_servers": servers,
            "scopes_supported": supported,
            "bearer_methods_supported": ["header"],
            "resource_name": "mcp-broker",
        })
        .to_string();
        Ok(Self {
            resource_metadata_url: resource_metadata_url(&cfg.audience),
            cfg: cfg.clone(),
            state,
            kick,
            rules,
            failures: std::array::from_fn(|_| AtomicU64::new(0)),
            metadata,
        })
    }

    /// The RFC 9728 metadata document.
    pub fn metadata(&self) -> &str {
        &self.metadata
    }

    /// [`Self::metadata`] with what the routers describe merged in: the
    /// `default-scopes` of each `resource-metadata` of their
    /// `describe-server` join `scopes_supported`. Their authorization
    /// servers and resource indicators do not: this broker accepts tokens
    /// of its own issuer for its own resource only, and advertising others
    /// would send clients for tokens it refuses.
    pub fn metadata_with(&self, routers: &[crate::routing::Routed]) -> String {
        let extra: Vec<String> = routers
            .iter()
            .filter_map(|r| r.router.meta().server.as_ref())
            .flat_map(|s| s.resource_metadata.iter().flatten())
            .flat_map(|m| m.default_scopes.iter().cloned())
            .collect();
        if extra.is_empty() {
            return self.metadata.clone();
        }
        merge_scopes(&self.metadata, extra)
    }

    /// Where clients find [`Self::metadata`] (for `WWW-Authenticate`).
    pub fn resource_metadata_url(&self) -> &str {
        &self.resource_metadata_url
    }

    /// Counts a failure by its reason.
    pub fn count(&self, f: Failure) {
        let i = Failure::ALL.iter().position(|x| *x == f).unwrap_or(0);
        self.failures[i].fetch_add(1, Ordering::Relaxed);
    }

    /// Failures so far, by reason.
    pub fn failures(&self) -> impl Iterator<Item = (Failure, u64)> + '_ {
        Failure::ALL
            .iter()
            .zip(&self.failures)
            .map(|(f, n)| (*f, n.load(Ordering::Relaxed)))
    }

    /// JWK Set refreshes after start-up that failed (the keys held were
    /// kept): for `/metrics`.
    pub fn key_refresh_failures(&self) -> u64 {
        self.state.refresh_failures.load(Ordering::Relaxed)
    }

    /// JWK Set refreshes after start-up that stored a fresh set.
    pub fn key_refreshes(&self) -> u64 {
        self.state.refreshes.load(Ordering::Relaxed)
    }

    /// The token of an `Authorization` header value (`Bearer`, any case).
    ///
    /// Bytes, not text: the header's value is checked as UTF-8 only when its
    /// token is not in the cache ([`Self::verify`]). A hit equals, byte for
    /// byte, a token that was checked, and checking ~1 KB of text again on
    /// every request showed in the profile (`bench/NOTES.md`, issue 14).
    pub fn bearer(header: Option<&[u8]>) -> Result<&[u8], Failure> {
        let h = header.ok_or(Failure::Missing)?.trim_ascii();
        let space = memchr::memchr(b' ', h).ok_or(Failure::Missing)?;
        let (scheme, token) = (&h[..space], h[space + 1..].trim_ascii());
        if !scheme.eq_ignore_ascii_case(b"bearer") || token.is_empty() {
            return Err(Failure::Missing);
        }
        Ok(token)
    }

    /// Verifies a bearer token and the scopes every request needs.
    /// `header` is the `Authorization` value (or gRPC metadata) as sent; a
    /// value that is not UTF-8 text counts as `missing`.
    /// [`Self::authenticate`] over every `Authorization` header a request
    /// carries: two or more are malformed (RFC 9110 §5.3 allows it once; a
    /// proxy reading the last one would judge another credential than this
    /// broker, which read the first).
    pub fn authenticate_all<'a>(
        &self,
        mut headers: impl Iterator<Item = &'a [u8]>,
    ) -> Result<Arc<Principal>, Failure> {
        let first = headers.next();
        if headers.next().is_some() {
            self.count(Failure::Malformed);
            return Err(Failure::Malformed);
        }
        self.authenticate(first)
    }

    pub fn authenticate(&self, header: Option<&[u8]>) -> Result<Arc<Principal>, Failure> {
        let r = Self::bearer(header).and_then(|t| self.verify(t));
        let r = r.and_then(|p| {
            if self.cfg.scopes.iter().all(|s| p.scopes.contains(s)) {
                Ok(p)
            } else {
                Err(Failure::InsufficientScope)
            }
        });
        if let Err(f) = r {
            self.count(f);
        }
        r
    }

    /// Verifies a token's signature and claims, or finds it verified
    /// already on this thread under the current key set ([`VERIFIED`]).
    pub fn verify(&self, token: &[u8]) -> Result<Arc<Principal>, Failure> {
        let generation = self.state.generation.load(Ordering::Acquire);
        let key = tail(token);
        let known = VERIFIED.with_borrow(|c| {
            c.get(&key)
                .filter(|(t, g, p)| t.as_bytes() == token && *g == generation && !p.expired())
                .map(|(_, _, p)| p.clone())
        });
        if let Some(p) = known {
            return Ok(p);
        }
        let token = std::str::from_utf8(token).map_err(|_| Failure::Missing)?;
        // Shared, not copied: a hit costs a reference count, not the
        // subject's and scopes' allocations.
        let p = Arc::new(self.verify_signed(token)?);
        VERIFIED.with_borrow_mut(|c| {
            if c.len() >= VERIFIED_PER_THREAD {
                c.clear();
            }
            c.insert(key, (token.into(), generation, p.clone()));
        });
        Ok(p)
    }

    /// [`Self::verify`] without the cache: header, key, signature, claims.
    fn verify_signed(&self, token: &str) -> Result<Principal, Failure> {
        let mut parts = token.split('.');
        let (Some(head), Some(_), Some(_), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(Failure::Malformed);
        };
        // The header is read before any key is chosen: `alg` decides
        // nothing but which of the key's algorithms to check with.
        let head = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(head)
            .map_err(|_| Failure::Malformed)?;
        #[derive(serde::Deserialize)]
        struct Head {
            alg: Option<String>,
            kid: Option<String>,
        }
        let head: Head = serde_json::from_slice(&head).map_err(|_| Failure::Malformed)?;
        let alg: Algorithm = head
            .alg
            .as_deref()
            .and_then(|a| a.parse().ok())
            .ok_or(Failure::Algorithm)?;
        let keys = self.keys_for(head.kid.as_deref())?;
        let key = keys.find(head.kid.as_deref()).ok_or(Failure::UnknownKey)?;
        if !key.algorithms.contains(&alg) {
            return Err(Failure::Algorithm);
        }
        let mut v = Validation::new(alg);
        v.algorithms = vec![alg];
        v.set_issuer(&[&self.cfg.issuer]);
        v.set_audience(&[&self.cfg.audience]);
        v.set_required_spec_claims(&["exp", "iss", "aud"]);
        v.validate_nbf = true;
        v.leeway = self.cfg.leeway.as_secs();
        let data = jsonwebtoken::decode::<serde_json::Value>(token, &key.key, &v).map_err(|e| {
            use jsonwebtoken::errors::ErrorKind as K;
            match e.kind() {
                K::InvalidSignature => Failure::Signature,
                K::ExpiredSignature => Failure::Expired,
                K::ImmatureSignature => Failure::NotYetValid,
                K::InvalidIssuer => Failure::Issuer,
                K::InvalidAudience => Failure::Audience,
                K::InvalidAlgorithm | K::InvalidAlgorithmName => Failure::Algorithm,
                _ => Failure::Malformed,
            }
        })?;
        let claims = data.claims;
        // One string (RFC 7519 §4.1.1: a StringOrURI). jsonwebtoken also
        // takes an array holding the issuer, which no issuer mints and a
        // stricter verifier behind the broker would read otherwise.
        if !matches!(claims.get("iss"), Some(serde_json::Value::String(_))) {
            return Err(Failure::Issuer);
        }
        // Required (RFC 9068 §2.2) and a non-empty string: sessions are
        // bound to it, so tokens without one would all be one subject, each
        // able to use the others' sessions.
        let subject = match claims.get("sub") {
            Some(serde_json::Value::String(s)) if !s.is_empty() => s.clone(),
            _ => return Err(Failure::Malformed),
        };
        let scopes = match (claims.get("scope"), claims.get("scp")) {
            (Some(serde_json::Value::String(s)), _) => {
                s.split_whitespace().map(str::to_owned).collect()
            }
            (_, Some(serde_json::Value::Array(a))) => a
                .iter()
                .filter_map(|x| x.as_str().map(str::to_owned))
                .collect(),
            _ => Vec::new(),
        };
        // A NumericDate may have a fraction (RFC 7519 §2): the whole
        // seconds, as jsonwebtoken's own check reads it. (Read as 0 it made
        // a frame connection's valid token expired at its first call.)
        let expires_at = claims
            .get("exp")
            .and_then(|e| {
                e.as_u64().or_else(|| {
                    e.as_f64()
                        .filter(|f| f.is_finite() && *f >= 0.0)
                        .map(|f| f as u64)
                })
            })
            .unwrap_or(0);
        Ok(Principal {
            subject,
            scopes,
            // jsonwebtoken refuses from `exp + leeway` on (`exp` is
            // checked as `exp < now - leeway`).
            expires_at: expires_at.saturating_add(self.cfg.leeway.as_secs()),
        })
    }

    /// The key set held. When `kid` names a key it lacks, the `auth-keys`
    /// thread is kicked (never waited for: this may run on a shard thread)
    /// and the token is refused; once the thread has stored a set with that
    /// key, the same token passes.
    fn keys_for(&self, kid: Option<&str>) -> Result<arc_swap::Guard<Arc<KeySet>>, Failure> {
        let keys = self.state.keys.load();
        if kid.is_some() && keys.find(kid).is_none() {
            // Full: a kick is already queued. Disconnected: the thread is
            // gone (it ends only with the `Auth`). Either way, nothing to do.
            let _ = self.kick.try_send(());
            return Err(Failure::UnknownKey);
        }
        Ok(keys)
    }

    /// Whether `p` may call tool `tool`; else the scopes it lacks, and the
    /// refusal is counted (every edge asks here).
    pub fn check_tool(&self, p: &Principal, tool: &str) -> Result<(), Vec<String>> {
        let missing = self.missing_for_tool(p, tool);
        if missing.is_empty() {
            return Ok(());
        }
        self.count(Failure::InsufficientScope);
        Err(missing)
    }

    /// Scopes `p` lacks to call tool `tool` (its `[[auth.rules]]`).
    pub fn missing_for_tool(&self, p: &Principal, tool: &str) -> Vec<String> {
        self.rules
            .get(tool)
            .map(|need| {
                need.iter()
                    .filter(|s| !p.scopes.contains(s))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Whether any tool needs scopes besides the global ones: without
    /// rules, a call's tool name need not be read for the scope check.
    pub fn has_tool_rules(&self) -> bool {
        !self.rules.is_empty()
    }

    /// Whether `p` may see and call `tool`.
    pub fn allows_tool(&self, p: &Principal, tool: &str) -> bool {
        self.missing_for_tool(p, tool).is_empty()
    }

    /// The `WWW-Authenticate` value for a refusal (RFC 6750 §3, RFC 9728
    /// §5.1): `error` and `error_description` only when a token was
    /// presented; `scope` with the scopes needed. The description is the
    /// body's message: a client that starts its OAuth flow on any 401
    /// (mcp-remote) shows the challenge, not the body, and its user saw
    /// only the flow's own failure, never "expired".
    pub fn challenge(&self, f: Failure, needed: &[String]) -> String {
        let mut v = format!(
            "Bearer resource_metadata=\"{}\"",
            self.resource_metadata_url
        );
        let error = match f {
            Failure::Missing => None,
            Failure::InsufficientScope => Some("insufficient_scope"),
            _ => Some("invalid_token"),
        };
        if let Some(error) = error {
            // The messages hold no `"` or `\` (RFC 6750's character set
            // for the description).
            v.push_str(&format!(
                ", error=\"{error}\", error_description=\"{}\"",
                f.message()
            ));
        }
        if !needed.is_empty() {
            v.push_str(&format!(", scope=\"{}\"", needed.join(" ")));
        }
        v
    }

    /// Every scope a request needs before any tool rule: for the
    /// insufficient-scope challenge.
    pub fn base_scopes(&self) -> &[String] {
        &self.cfg.scopes
    }
}

/// Checks a `jwks_url` without any network I/O: an absolute `https://`
/// URL with a host, or `http://` to a loopback host (see the module's
/// invariants).
pub fn check_jwks_url(full: &str) -> Result<hyper::Uri, String> {
    // Messages reach the log and a refused reload's answer: without the
    // query, which may hold a key.
    let url = crate::config::shown_url(full);
    let uri: hyper::Uri = full
        .parse()
        .map_err(|e| format!("`{url}` is not a URL: {e}"))?;
    let host = uri
        .host()
        .filter(|h| !h.is_empty())
        .ok_or_else(|| format!("`{url}` is not an absolute URL with a host"))?;
    if uri.authority().is_some_and(|a| a.as_str().contains('@')) {
        // Credentials in the URL would be logged with it.
        return Err(format!(
            "`{url}`: user information in the URL is not supported"
        ));
    }
    match uri.scheme_str() {
        Some("https") => Ok(uri),
        Some("http") if is_loopback_host(host) => Ok(uri),
        Some("http") => Err(format!(
            "`{url}`: http:// is allowed only to a loopback host (127.0.0.0/8, ::1, localhost); a JWK Set fetched in clear from elsewhere could be forged: use https://"
        )),
        _ => Err(format!("`{url}` must be an https:// URL")),
    }
}

/// 127.0.0.0/8, `::1` (as `[::1]` in a URL) or `localhost`.
pub(crate) fn is_loopback_host(host: &str) -> bool {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    match bare.parse::<IpAddr>() {
        Ok(IpAddr::V4(a)) => a.is_loopback(),
        // `::ffff:127.0.0.1` is not taken: the form is unusual in a URL and
        // needs no support.
        Ok(IpAddr::V6(a)) => a.is_loopback(),
        Err(_) => {
            let name = bare.strip_suffix('.').unwrap_or(bare);
            name.eq_ignore_ascii_case("localhost")
        }
    }
}

/// Where the JWK Set comes from, checked but not read yet.
enum Source {
    File(PathBuf),
    /// Boxed: the TLS settings are large, and a source is built once.
    Url(Box<UrlSource>),
}

struct UrlSource {
    url: String,
    uri: hyper::Uri,
    tls: rustls::ClientConfig,
}

impl Source {
    fn new(cfg: &AuthSection) -> Result<Self, String> {
        match (&cfg.jwks_file, &cfg.jwks_url) {
            (Some(p), None) => Ok(Source::File(p.clone())),
            (None, Some(u)) => {
                let uri = check_jwks_url(u).map_err(|e| format!("auth.jwks_url: {e}"))?;
                let tls = crate::tls::client_config(cfg.jwks_ca_file.as_deref())
                    .map_err(|e| format!("auth.jwks_ca_file: {e}"))?;
                Ok(Source::Url(Box::new(UrlSource {
                    url: u.clone(),
                    uri,
                    tls,
                })))
            }
            _ => Err("auth.jwks_file, auth.jwks_url: exactly one of them is needed".into()),
        }
    }

    /// The reader, built on the `auth-keys` thread: its tokio runtime
    /// lives and is dropped there, never inside another runtime.
    fn reader(self) -> Result<Reader, String> {
        match self {
            Source::File(p) => Ok(Reader::File(p)),
            Source::Url(u) => {
                let UrlSource { url, uri, tls } = *u;
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| format!("auth.jwks_url: a runtime to fetch with: {e}"))?;
                let mut connector = hyper_util::client::legacy::connect::HttpConnector::new();
                connector.set_connect_timeout(Some(FETCH_TIMEOUT));
                // The TLS layer below takes https:// itself.
                connector.enforce_http(false);
                let connector = hyper_rustls::HttpsConnectorBuilder::new()
                    .with_tls_config(tls)
                    .https_or_http()
                    .enable_http1()
                    .wrap_connector(connector);
                // No idle connection is kept: fetches are minutes apart.
                let client = hyper_util::client::legacy::Client::builder(
                    hyper_util::rt::TokioExecutor::new(),
                )
                .pool_max_idle_per_host(0)
                .build(connector);
                Ok(Reader::Url(Box::new(UrlReader {
                    url,
                    uri,
                    rt,
                    client,
                })))
            }
        }
    }
}

enum Reader {
    File(PathBuf),
    Url(Box<UrlReader>),
}

struct UrlReader {
    url: String,
    uri: hyper::Uri,
    rt: tokio::runtime::Runtime,
    client: hyper_util::client::legacy::Client<
        hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
        http_body_util::Empty<bytes::Bytes>,
    >,
}

impl Reader {
    /// The key set, or why not (naming the file or URL, with the config
    /// key it comes from).
    fn read(&self) -> Result<KeySet, String> {
        match self {
            Reader::File(p) => KeySet::load(p).map_err(|e| format!("auth.jwks_file: {e}")),
            Reader::Url(u) => u.fetch().map_err(|e| {
                format!(
                    "auth.jwks_url: fetching {}: {e}",
                    crate::config::shown_url(&u.url)
                )
            }),
        }
    }
}

impl UrlReader {
    /// One GET, bounded in time ([`FETCH_TIMEOUT`]) and size
    /// ([`MAX_JWKS_BYTES`]); anything but 200 is an error naming the status.
    fn fetch(&self) -> Result<KeySet, String> {
        let req = hyper::Request::get(self.uri.clone())
            .header(
                hyper::header::ACCEPT,
                "application/jwk-set+json, application/json",
            )
            .header(hyper::header::USER_AGENT, "mcp-broker")
            .body(http_body_util::Empty::new())
            .map_err(|e| e.to_string())?;
        let exchange = async {
            let res = self
                .client
                .request(req)
                .await
                .map_err(|e| error_chain(&e))?;
            if res.status() != hyper::StatusCode::OK {
                return Err(format!("the server answered {}", res.status()));
            }
            http_body_util::Limited::new(res.into_body(), MAX_JWKS_BYTES)
                .collect()
                .await
                .map(|b| b.to_bytes())
                .map_err(|e| {
                    if e.is::<http_body_util::LengthLimitError>() {
                        format!("the answer is larger than {MAX_JWKS_BYTES} bytes")
                    } else {
                        format!("reading the answer: {}", error_chain(&*e))
                    }
                })
        };
        let body = self.rt.block_on(async {
            tokio::time::timeout(FETCH_TIMEOUT, exchange)
                .await
                .map_err(|_| format!("no complete answer within {FETCH_TIMEOUT:?}"))?
        })?;
        let text = std::str::from_utf8(&body).map_err(|_| "the answer is not UTF-8".to_owned())?;
        KeySet::parse(text)
    }
}

/// An error with its sources: hyper's own message alone ("client error
/// (Connect)") does not say what failed.
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut next = e.source();
    while let Some(c) = next {
        let m = c.to_string();
        if !s.contains(&m) {
            s.push_str(": ");
            s.push_str(&m);
        }
        next = c.source();
    }
    s
}

/// Starts the `auth-keys` thread, which reads the set once before this
/// returns (the start-up read: its error is returned) and then refreshes
/// it (see [`refresh_loop`]).
fn start_refresher(
    source: Source,
    state: Weak<KeyState>,
    kicked: crossbeam_channel::Receiver<()>,
    interval: Duration,
) -> Result<(), String> {
    let (ready_tx, ready_rx) = std::sync::mpsc::sync_channel::<Result<(), String>>(1);
    std::thread::Builder::new()
        .name("auth-keys".into())
        .spawn(move || {
            let first = source.reader().and_then(|r| r.read().map(|k| (r, k)));
            let reader = match first {
                Ok((reader, keys)) => {
                    if let Some(s) = state.upgrade() {
                        s.store(keys);
                    }
                    let _ = ready_tx.send(Ok(()));
                    reader
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            };
            refresh_loop(&reader, &state, &kicked, interval);
        })
        .map_err(|e| format!("auth: starting the auth-keys thread: {e}"))?;
    ready_rx.recv().unwrap_or_else(|_| {
        Err("auth: the auth-keys thread ended before reading the JWK Set".into())
    })
}

/// The `auth-keys` thread after start-up: a refresh every `interval`, and
/// one when kicked, at most once per [`KEY_REFRESH_GAP`] (a kick within the
/// gap is remembered and served when the gap ends, so a rotated key is
/// found within the gap without another kick). Ends when the [`Auth`] is
/// dropped (the kick channel disconnects, or the state is gone).
fn refresh_loop(
    reader: &Reader,
    state: &Weak<KeyState>,
    kicked: &crossbeam_channel::Receiver<()>,
    interval: Duration,
) {
    // Bounded so that adding it to an `Instant` cannot overflow.
    let interval = interval.clamp(MIN_REFRESH_INTERVAL, Duration::from_secs(365 * 86_400));
    // The last refresh after start-up: the start-up read does not count, so
    // the first kick is served at once (a key rotated just before start-up).
    let mut last: Option<Instant> = None;
    let mut periodic_from = Instant::now();
    let mut pending = false;
    // Refreshes failed in a row: each failure is a WARN line, so the one
    // that ends the run is an INFO line, as an upstream's return is.
    let mut failing = 0u64;
    loop {
        let periodic_at = periodic_from + interval;
        let deferred_at = last.filter(|_| pending).map(|t| t + KEY_REFRESH_GAP);
        let wake = deferred_at.map_or(periodic_at, |d| d.min(periodic_at));
        let why = match kicked.recv_deadline(wake) {
            Ok(()) => {
                if last.is_some_and(|t| t.elapsed() < KEY_REFRESH_GAP) {
                    pending = true;
                    continue;
                }
                "a token named an unknown key"
            }
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                if deferred_at.is_some_and(|d| d <= Instant::now()) {
                    "a token named an unknown key (deferred by the refresh gap)"
                } else {
                    "periodic"
                }
            }
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => return,
        };
        let read = reader.read();
        let Some(state) = state.upgrade() else { return };
        let now = Instant::now();
        last = Some(now);
        periodic_from = now;
        pending = false;
        match read {
            Ok(keys) => {
                state.store(keys);
                state.refreshes.fetch_add(1, Ordering::Relaxed);
                match std::mem::take(&mut failing) {
                    0 => tracing::debug!(reason = why, "JWK Set refreshed"),
                    n => tracing::info!(reason = why, failures = n, "JWK Set refreshed again"),
                }
            }
            Err(e) => {
                failing += 1;
                state.refresh_failures.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(reason = why, error = %e, "refreshing the JWK Set failed; keeping the keys held");
            }
        }
    }
}

/// `metadata` (a JSON object) with `extra` joined to its `scopes_supported`,
/// sorted and without duplicates.
fn merge_scopes(metadata: &str, extra: Vec<String>) -> String {
    let Ok(mut v) = serde_json::from_str::<serde_json::Value>(metadata) else {
        return metadata.to_owned();
    };
    let mut all: Vec<String> = v["scopes_supported"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    all.extend(extra);
    all.sort();
    all.dedup();
    v["scopes_supported"] = serde_json::json!(all);
    v.to_string()
}

/// RFC 9728 §3.1: the well-known path inserted between the resource's
/// authority and its path (`https://h/mcp` →
/// `https://h/.well-known/oauth-protected-resource/mcp`).
fn resource_metadata_url(resource: &str) -> String {
    let (scheme, rest) = resource.split_once("://").unwrap_or(("https", resource));
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    let path = path
        .split('?')
        .next()
        .unwrap_or_default()
        .trim_end_matches('/');
    format!("{scheme}://{authority}/.well-known/oauth-protected-resource{path}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_streams_deadline_is_its_tokens_expiry_or_none_when_out_of_reach() {
        let p = |expires_at| Principal {
            subject: "s".into(),
            scopes: Vec::new(),
            expires_at,
        };
        let now = jsonwebtoken::get_current_timestamp();
        let soon = p(now + 10).stream_deadline().expect("a deadline");
        let left = soon.saturating_duration_since(std::time::Instant::now());
        assert!(
            left > std::time::Duration::from_secs(9) && left <= std::time::Duration::from_secs(11)
        );
        let past = p(now - 10).stream_deadline().expect("a deadline");
        assert!(past <= std::time::Instant::now());
        // An `exp` a signed token may carry, and no Instant can hold.
        assert_eq!(p(u64::MAX).stream_deadline(), None);
        assert_eq!(p(u64::MAX - 1).stream_deadline(), None);
    }

    #[test]
    fn every_refusal_message_fits_an_error_description() {
        // RFC 6750 §3: %x20-21 / %x23-5B / %x5D-7E, written raw between
        // quotes in the challenge.
        for f in Failure::ALL {
            let m = f.message();
            assert!(
                m.bytes()
                    .all(|b| (0x20..=0x7e).contains(&b) && b != b'"' && b != b'\\'),
                "{m}"
            );
        }
    }

    #[test]
    fn router_scopes_join_the_metadata_without_duplicates() {
        let m = r#"{"resource":"https://m/mcp","scopes_supported":["mcp"]}"#;
        let v: serde_json::Value =
            serde_json::from_str(&merge_scopes(m, vec!["kv:read".into(), "mcp".into()])).unwrap();
        assert_eq!(v["scopes_supported"], serde_json::json!(["kv:read", "mcp"]));
        assert_eq!(v["resource"], "https://m/mcp");
    }

    #[test]
    fn the_metadata_url_inserts_the_well_known_path() {
        assert_eq!(
            resource_metadata_url("https://mcp.example/mcp"),
            "https://mcp.example/.well-known/oauth-protected-resource/mcp"
        );
        assert_eq!(
            resource_metadata_url("http://127.0.0.1:7403"),
            "http://127.0.0.1:7403/.well-known/oauth-protected-resource"
        );
    }

    #[test]
    fn bearer_credentials_are_read_case_insensitively_and_nothing_else_is() {
        assert_eq!(Auth::bearer(Some(b"Bearer abc")), Ok(&b"abc"[..]));
        assert_eq!(Auth::bearer(Some(b"bearer  abc ")), Ok(&b"abc"[..]));
        assert_eq!(Auth::bearer(Some(b" BEARER\tx y")), Err(Failure::Missing));
        assert_eq!(Auth::bearer(Some(b"BEARER x\xff")), Ok(&b"x\xff"[..]));
        for bad in [
            None,
            Some(""),
            Some("Basic abc"),
            Some("Bearer"),
            Some("Bearer   "),
        ] {
            assert_eq!(
                Auth::bearer(bad.map(str::as_bytes)),
                Err(Failure::Missing),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn plain_http_is_allowed_only_to_loopback_hosts() {
        for ok in [
            "https://issuer.example/jwks.json",
            "https://10.0.0.1:8443/keys",
            "http://127.0.0.1:8080/jwks.json",
            "http://127.1.2.3/jwks.json",
            "http://[::1]:9000/jwks.json",
            "http://localhost/jwks.json",
            "http://LOCALHOST.:80/jwks.json",
        ] {
            assert!(check_jwks_url(ok).is_ok(), "{ok}: {:?}", check_jwks_url(ok));
        }
        for bad in [
            "http://issuer.example/jwks.json",
            "http://10.0.0.1/jwks.json",
            "http://128.0.0.1/jwks.json",
            "http://[::2]/jwks.json",
            "http://localhost.evil.example/jwks.json",
            "http://127.0.0.1.nip.io/jwks.json",
        ] {
            let e = check_jwks_url(bad).unwrap_err();
            assert!(e.contains("loopback") && e.contains(bad), "{bad}: {e}");
        }
        for bad in [
            "ftp://issuer.example/jwks.json",
            "/jwks.json",
            "issuer.example/jwks.json",
            "https://user:pw@issuer.example/jwks.json",
            "not a url",
        ] {
            assert!(check_jwks_url(bad).is_err(), "{bad}");
        }
        // A password or a query (which may hold a key): never in the message.
        let e = check_jwks_url("https://u:pw0rd@issuer.example/jwks.json").unwrap_err();
        assert!(
            e.contains("user information") && !e.contains("pw0rd"),
            "{e}"
        );
        let e = check_jwks_url("http://issuer.example/jwks.json?client_secret=s3cret").unwrap_err();
        assert!(
            e.contains("`http://issuer.example/jwks.json?…`") && !e.contains("s3cret"),
            "{e}"
        );
    }

    /// `[auth]` over the embedded default, with `extra` lines.
    fn config(extra: &str) -> Result<crate::config::Config, String> {
        crate::config::Config::parse(&format!(
            "{}\n[auth]\nissuer = \"https://issuer.test\"\naudience = \"https://mcp.test/mcp\"\n{extra}\n",
            crate::config::DEFAULT_TOML
        ))
        .map_err(|e| e.to_string())
    }

    #[test]
    fn exactly_one_key_source_is_configured_and_checked_without_network_io() {
        let dir = temp_dir("config");
        let file = dir.join("jwks.json");
        std::fs::write(&file, jwks(&["k1"])).unwrap();
        let file_line = format!("jwks_file = \"{}\"", file.display());

        let e = config("").unwrap_err();
        assert!(
            e.contains("auth.jwks_file") && e.contains("auth.jwks_url"),
            "{e}"
        );
        let e = config(&format!(
            "{file_line}\njwks_url = \"https://issuer.test/jwks.json\""
        ))
        .unwrap_err();
        assert!(
            e.contains("auth.jwks_file") && e.contains("auth.jwks_url") && e.contains("both"),
            "{e}"
        );
        let c = config(&file_line).unwrap();
        let a = c.auth.unwrap();
        assert_eq!(a.jwks_refresh_interval, Duration::from_secs(600));
        // Nothing listens there and the name does not resolve: validation
        // does not try.
        let c = config("jwks_url = \"https://jwks.invalid/keys\"\njwks_refresh_interval = \"2m\"")
            .unwrap();
        assert_eq!(
            c.auth.unwrap().jwks_refresh_interval,
            Duration::from_secs(120)
        );
        let e = config("jwks_url = \"http://issuer.test/jwks.json\"").unwrap_err();
        assert!(e.contains("auth.jwks_url") && e.contains("loopback"), "{e}");
        let e = config("jwks_url = \"https://issuer.test/k\"\njwks_refresh_interval = \"0s\"")
            .unwrap_err();
        assert!(e.contains("auth.jwks_refresh_interval"), "{e}");
        let e = config(&format!(
            "{file_line}\njwks_ca_file = \"{}\"",
            file.display()
        ))
        .unwrap_err();
        assert!(e.contains("auth.jwks_ca_file"), "{e}");
        let e = config(&format!(
            "jwks_url = \"https://issuer.test/k\"\njwks_ca_file = \"{}\"",
            file.display()
        ))
        .unwrap_err();
        assert!(
            e.contains("auth.jwks_ca_file") && e.contains("no PEM certificate"),
            "{e}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("mcp-auth-unit-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// A JWK Set of RSA keys named `kids` (their modulus is arbitrary: no
    /// signature is checked here).
    fn jwks(kids: &[&str]) -> String {
        let n = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode([0xC3u8; 256]);
        let keys: Vec<_> = kids
            .iter()
            .map(|k| serde_json::json!({"kty": "RSA", "kid": k, "n": n, "e": "AQAB"}))
            .collect();
        serde_json::json!({ "keys": keys }).to_string()
    }

    /// A token naming `kid` (not validly signed).
    fn token(kid: &str) -> String {
        let b = |v: serde_json::Value| {
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string())
        };
        format!(
            "{}.{}.c2ln",
            b(serde_json::json!({"alg": "RS256", "kid": kid})),
            b(serde_json::json!({"iss": "https://issuer.test"}))
        )
    }

    fn wait_for(mut f: impl FnMut() -> bool) -> bool {
        let until = Instant::now() + Duration::from_secs(10);
        while Instant::now() < until {
            if f() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        false
    }

    /// An `Auth` over a JWK Set file of keys `kids` in a fresh temp dir
    /// `name`: (the auth, the dir, the file).
    fn auth_over_file(name: &str, kids: &[&str]) -> (Auth, PathBuf, PathBuf) {
        let dir = temp_dir(name);
        let file = dir.join("jwks.json");
        std::fs::write(&file, jwks(kids)).unwrap();
        let c = config(&format!("jwks_file = \"{}\"", file.display())).unwrap();
        let auth = Auth::new(c.auth.as_ref().unwrap()).unwrap();
        (auth, dir, file)
    }

    #[test]
    fn a_token_that_is_not_utf8_text_is_missing_and_counted() {
        let (auth, dir, _) = auth_over_file("utf8", &["k1"]);
        let mut bad = b"Bearer ".to_vec();
        bad.extend_from_slice(token("k1").as_bytes());
        bad.push(0xff);
        assert_eq!(auth.authenticate(Some(&bad)).err(), Some(Failure::Missing));
        let missing = |a: &Auth| a.failures().find(|(f, _)| *f == Failure::Missing);
        assert_eq!(missing(&auth).map(|(_, n)| n), Some(1));
        // The same token as text gets as far as its (bogus) signature.
        let text = format!("Bearer {}", token("k1"));
        assert_eq!(
            auth.authenticate(Some(text.as_bytes())).err(),
            Some(Failure::Signature)
        );
        drop(auth);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn an_unknown_key_kicks_a_refresh_off_the_request_path_once_per_gap() {
        let (auth, dir, file) = auth_over_file("kick", &["k1"]);
        // A known key: past the key lookup (the signature is bogus).
        assert_eq!(auth.verify(token("k1").as_bytes()), Err(Failure::Signature));

        // Rotation: refused until the thread has read the new set; the
        // first kick after start-up is served at once.
        std::fs::write(&file, jwks(&["k1", "k2"])).unwrap();
        assert_eq!(
            auth.verify(token("k2").as_bytes()),
            Err(Failure::UnknownKey)
        );
        assert!(
            wait_for(|| auth.verify(token("k2").as_bytes()) == Err(Failure::Signature)),
            "k2 found after the kick"
        );
        assert_eq!(auth.key_refreshes(), 1);

        // Within the gap, kicks coalesce into one refresh at its end.
        std::fs::write(&file, jwks(&["k1", "k2", "k3"])).unwrap();
        for _ in 0..50 {
            assert_eq!(
                auth.verify(token("k3").as_bytes()),
                Err(Failure::UnknownKey)
            );
        }
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(auth.key_refreshes(), 1, "no refresh within the gap");
        assert_eq!(
            auth.verify(token("k3").as_bytes()),
            Err(Failure::UnknownKey)
        );

        assert_eq!(auth.key_refresh_failures(), 0);
        drop(auth);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn periodic_refreshes_keep_the_keys_held_when_they_fail() {
        let dir = temp_dir("periodic");
        let file = dir.join("jwks.json");
        std::fs::write(&file, jwks(&["k1"])).unwrap();
        let c = config(&format!(
            "jwks_file = \"{}\"\njwks_refresh_interval = \"1s\"",
            file.display()
        ))
        .unwrap();
        let auth = Auth::new(c.auth.as_ref().unwrap()).unwrap();
        std::fs::write(&file, "not json").unwrap();
        assert!(
            wait_for(|| auth.key_refresh_failures() >= 1),
            "a failed periodic refresh is counted"
        );
        assert_eq!(auth.verify(token("k1").as_bytes()), Err(Failure::Signature));
        std::fs::write(&file, jwks(&["k1", "k2"])).unwrap();
        assert!(
            wait_for(|| auth.verify(token("k2").as_bytes()) == Err(Failure::Signature)),
            "a periodic refresh finds k2 without a kick"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn start_up_fails_naming_the_source_and_the_thread_holds_no_strong_reference() {
        let dir = temp_dir("startup");
        let file = dir.join("jwks.json");
        std::fs::write(&file, jwks(&["k1"])).unwrap();
        let mut a = config(&format!("jwks_file = \"{}\"", file.display()))
            .unwrap()
            .auth
            .unwrap();
        let auth = Auth::new(&a).unwrap();
        let weak = Arc::downgrade(&auth.state);
        drop(auth);
        // The thread held only a Weak: nothing is left once the Auth goes.
        assert!(weak.upgrade().is_none());

        std::fs::remove_file(&file).unwrap();
        let e = Auth::new(&a).unwrap_err();
        assert!(
            e.contains("auth.jwks_file") && e.contains("jwks.json"),
            "{e}"
        );

        // A closed port: refused at once, naming the URL.
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let url = format!("http://127.0.0.1:{port}/jwks.json");
        a.jwks_file = None;
        a.jwks_url = Some(url.clone());
        let e = Auth::new(&a).unwrap_err();
        assert!(e.contains("auth.jwks_url") && e.contains(&url), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn symmetric_and_mismatched_keys_are_refused_at_load() {
        let oct = r#"{"keys":[{"kty":"oct","kid":"s","k":"c2VjcmV0"}]}"#;
        let e = KeySet::parse(oct).err().unwrap();
        assert!(e.contains("symmetric"), "{e}");
        assert!(KeySet::parse(r#"{"keys":[]}"#).is_err());
        assert!(KeySet::parse("not json").is_err());
    }

    #[test]
    fn rsa_keys_outside_2048_to_8192_bits_are_refused_at_load() {
        let set = |n: &[u8]| {
            let n = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(n);
            format!(r#"{{"keys":[{{"kty":"RSA","kid":"k","n":"{n}","e":"AQAB"}}]}}"#)
        };
        // 1024 bits: a key of the size that can be broken.
        let e = KeySet::parse(&set(&[0xC3; 128])).err().unwrap();
        assert!(e.contains("key `k`") && e.contains("1024 bits"), "{e}");
        // A leading zero byte does not count; 2047 bits is one short.
        let mut short = vec![0u8; 257];
        short[1] = 0x40;
        let e = KeySet::parse(&set(&short)).err().unwrap();
        assert!(e.contains("2047 bits"), "{e}");
        let e = KeySet::parse(&set(&[0xC3; 1025])).err().unwrap();
        assert!(e.contains("8200 bits"), "{e}");
        assert!(KeySet::parse(&set(&[0x80; 256])).is_ok());
        assert!(KeySet::parse(&set(&[0xFF; 1024])).is_ok());
        assert_eq!(rsa_bits("AQAB"), Some(17));
        assert_eq!(rsa_bits("not base64!"), None);
    }
}
