//! Keys and tokens for the `[auth]` tests: RSA keys made by `openssl` at
//! run time (nothing secret is checked in), JWK entries, base64url.

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use serde_json::{Value, json};

pub fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// Seconds since the Unix epoch (JWT times).
pub fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// An RSA key pair made by openssl: the private PEM, the public PEM, and
/// its modulus (for the JWK).
pub struct RsaKey {
    pub private_pem: Vec<u8>,
    pub public_pem: Vec<u8>,
    pub modulus: Vec<u8>,
}

/// A 2048-bit RSA key pair in `dir`, its files named after `name`.
pub fn rsa_key(dir: &Path, name: &str) -> RsaKey {
    let key = format!("{name}.pem");
    let public = format!("{name}.pub.pem");
    super::openssl(
        dir,
        &[
            "genpkey",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            "rsa_keygen_bits:2048",
            "-out",
            &key,
        ],
    );
    super::openssl(dir, &["rsa", "-in", &key, "-pubout", "-out", &public]);
    let m = String::from_utf8(super::openssl(
        dir,
        &["rsa", "-in", &key, "-noout", "-modulus"],
    ))
    .unwrap();
    let hex = m.trim().trim_start_matches("Modulus=");
    let modulus = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect();
    RsaKey {
        private_pem: std::fs::read(dir.join(&key)).unwrap(),
        public_pem: std::fs::read(dir.join(&public)).unwrap(),
        modulus,
    }
}

/// The JWK of `k`'s public key under `kid`.
pub fn jwk(kid: &str, k: &RsaKey) -> Value {
    json!({"kty": "RSA", "kid": kid, "use": "sig", "n": b64(&k.modulus), "e": "AQAB"})
}

/// `jsonwebtoken::encode` through the broker's own provider (ring,
/// `auth::install_jwt_crypto`): the crate is built without a backend of its
/// own, so one must be installed before the first token is signed.
pub fn encode(
    header: &jsonwebtoken::Header,
    claims: &impl serde::Serialize,
    key: &jsonwebtoken::EncodingKey,
) -> String {
    mcp_broker::auth::install_jwt_crypto();
    jsonwebtoken::encode(header, claims, key).unwrap()
}
