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

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use base64::Engine as _;
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};

use crate::config::AuthSection;

/// The shortest time between two re-reads of the JWK Set caused by tokens
/// naming a key it does not hold: a flood of such tokens costs one read per
/// interval, not one per token.
pub const KEY_REFRESH_GAP: Duration = Duration::from_secs(30);

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
    /// `kid` names no key of the set (after a rate-limited re-read).
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
    /// `sub` (empty when the token has none).
    pub subject: String,
    /// `scope` (space-separated) or `scp` (array).
    pub scopes: Vec<String>,
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
                .map_or_else(|| format!("keys[{i}]"), |k| format!("key `{k}`"));
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

/// The configured authentication: keys, rules, counters.
pub struct Auth {
    pub cfg: AuthSection,
    jwks_file: PathBuf,
    keys: arc_swap::ArcSwap<KeySet>,
    /// When the key set was last read.
    read_at: Mutex<Instant>,
    /// Tool name (as clients see it) → scopes it needs besides `cfg.scopes`.
    rules: HashMap<String, Vec<String>>,
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
    pub fn new(cfg: &AuthSection) -> Result<Self, String> {
        let jwks_file = cfg
            .jwks_file
            .clone()
            .ok_or("auth.jwks_file: the issuer's JWK Set is needed")?;
        let keys = KeySet::load(&jwks_file).map_err(|e| format!("auth.jwks_file: {e}"))?;
        let mut rules: HashMap<String, Vec<String>> = HashMap::new();
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
            jwks_file,
            keys: arc_swap::ArcSwap::from_pointee(keys),
            read_at: Mutex::new(Instant::now()),
            rules,
            failures: std::array::from_fn(|_| AtomicU64::new(0)),
            metadata,
        })
    }

    /// The RFC 9728 metadata document.
    pub fn metadata(&self) -> &str {
        &self.metadata
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

    /// The token of an `Authorization` header value (`Bearer`, any case).
    pub fn bearer(header: Option<&str>) -> Result<&str, Failure> {
        let h = header.ok_or(Failure::Missing)?.trim();
        let (scheme, token) = h.split_once(' ').ok_or(Failure::Missing)?;
        if !scheme.eq_ignore_ascii_case("bearer") {
            return Err(Failure::Missing);
        }
        let token = token.trim();
        if token.is_empty() {
            return Err(Failure::Missing);
        }
        Ok(token)
    }

    /// Verifies a bearer token and the scopes every request needs.
    pub fn authenticate(&self, header: Option<&str>) -> Result<Principal, Failure> {
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

    /// Verifies a token's signature and claims.
    pub fn verify(&self, token: &str) -> Result<Principal, Failure> {
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
        let subject = claims
            .get("sub")
            .and_then(|s| s.as_str())
            .unwrap_or_default()
            .to_owned();
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
        Ok(Principal { subject, scopes })
    }

    /// The key set, read again first when `kid` names a key it lacks and
    /// the last read is older than [`KEY_REFRESH_GAP`].
    fn keys_for(
        &self,
        kid: Option<&str>,
    ) -> Result<arc_swap::Guard<std::sync::Arc<KeySet>>, Failure> {
        let keys = self.keys.load();
        if kid.is_none() || keys.find(kid).is_some() {
            return Ok(keys);
        }
        {
            let mut at = self.read_at.lock().unwrap_or_else(|e| e.into_inner());
            if at.elapsed() < KEY_REFRESH_GAP {
                return Err(Failure::UnknownKey);
            }
            *at = Instant::now();
        }
        match KeySet::load(&self.jwks_file) {
            Ok(fresh) => {
                tracing::info!(file = %self.jwks_file.display(), "a token named an unknown key: JWK Set read again");
                self.keys.store(std::sync::Arc::new(fresh));
            }
            Err(e) => {
                tracing::warn!(error = %e, "re-reading the JWK Set failed; keeping the keys held")
            }
        }
        Ok(self.keys.load())
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

    /// Whether `p` may see and call `tool`.
    pub fn allows_tool(&self, p: &Principal, tool: &str) -> bool {
        self.missing_for_tool(p, tool).is_empty()
    }

    /// The `WWW-Authenticate` value for a refusal (RFC 6750 §3, RFC 9728
    /// §5.1): `error` only when a token was presented; `scope` with the
    /// scopes needed.
    pub fn challenge(&self, f: Failure, needed: &[String]) -> String {
        let mut v = format!(
            "Bearer resource_metadata=\"{}\"",
            self.resource_metadata_url
        );
        match f {
            Failure::Missing => {}
            Failure::InsufficientScope => v.push_str(", error=\"insufficient_scope\""),
            _ => v.push_str(", error=\"invalid_token\""),
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
        assert_eq!(Auth::bearer(Some("Bearer abc")), Ok("abc"));
        assert_eq!(Auth::bearer(Some("bearer  abc ")), Ok("abc"));
        for bad in [
            None,
            Some(""),
            Some("Basic abc"),
            Some("Bearer"),
            Some("Bearer   "),
        ] {
            assert_eq!(Auth::bearer(bad), Err(Failure::Missing), "{bad:?}");
        }
    }

    #[test]
    fn symmetric_and_mismatched_keys_are_refused_at_load() {
        let oct = r#"{"keys":[{"kty":"oct","kid":"s","k":"c2VjcmV0"}]}"#;
        let e = KeySet::parse(oct).err().unwrap();
        assert!(e.contains("symmetric"), "{e}");
        assert!(KeySet::parse(r#"{"keys":[]}"#).is_err());
        assert!(KeySet::parse("not json").is_err());
    }
}
