//! One JWT signature check, as the broker makes it for a token its
//! per-thread cache has not seen (and for every refused token): the
//! provider's verifier built from the key, then the check. The broker's
//! ring provider against the `jsonwebtoken` crate's RustCrypto backend, in
//! the same run, for the algorithms a JWK Set can hold.
//!
//! RSA keys come from `openssl genpkey` (2048 bits, the usual issuer key),
//! EC and Ed25519 keys from ring; the message is a JWT's signing input of
//! realistic claims (372 bytes).

#![allow(dead_code)]

use std::process::Command;

use base64::Engine as _;
use criterion::{Criterion, criterion_group, criterion_main};
use jsonwebtoken::crypto::CryptoProvider;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey};
use ring::rand::SystemRandom;
use ring::signature::{self as sig, KeyPair as _};

// The provider's own unit tests are compiled out here, their imports not.
#[allow(unused)]
#[path = "../../../broker/src/auth/jwt_ring.rs"]
mod jwt_ring;

fn b64(b: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b)
}

/// A signing input shaped like a real token's: header and claims.
fn message(alg: &str) -> Vec<u8> {
    let head = serde_json::json!({"alg": alg, "typ": "JWT", "kid": "bench"});
    let claims = serde_json::json!({
        "iss": "https://issuer.example", "aud": "https://broker.example/mcp",
        "sub": "bench-client-0001", "scope": "mcp tools:call",
        "exp": 4_000_000_000u64, "nbf": 1_700_000_000u64, "iat": 1_700_000_000u64,
        "jti": "0123456789abcdef0123456789abcdef", "client_id": "bench-client",
    });
    format!(
        "{}.{}",
        b64(head.to_string().as_bytes()),
        b64(claims.to_string().as_bytes())
    )
    .into_bytes()
}

fn openssl(args: &[&str], dir: &std::path::Path) -> Vec<u8> {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl");
    assert!(out.status.success(), "openssl {args:?}");
    out.stdout
}

/// (algorithm, signing key, the key as the broker holds it from a JWK).
fn keys() -> Vec<(Algorithm, EncodingKey, DecodingKey)> {
    let dir = std::env::temp_dir().join(format!("jwt-backends-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    openssl(
        &[
            "genpkey",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            "rsa_keygen_bits:2048",
            "-out",
            "k.pem",
        ],
        &dir,
    );
    let pem = std::fs::read(dir.join("k.pem")).unwrap();
    let m = String::from_utf8(openssl(
        &["rsa", "-in", "k.pem", "-noout", "-modulus"],
        &dir,
    ))
    .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let hex = m.trim().trim_start_matches("Modulus=");
    let n: Vec<u8> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect();
    let rsa = || {
        (
            EncodingKey::from_rsa_pem(&pem).unwrap(),
            DecodingKey::from_rsa_components(&b64(&n), "AQAB").unwrap(),
        )
    };
    let rng = SystemRandom::new();
    let p256 =
        sig::EcdsaKeyPair::generate_pkcs8(&sig::ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
    let pair =
        sig::EcdsaKeyPair::from_pkcs8(&sig::ECDSA_P256_SHA256_FIXED_SIGNING, p256.as_ref(), &rng)
            .unwrap();
    let (x, y) = pair.public_key().as_ref()[1..].split_at(32);
    let ec = DecodingKey::from_ec_components(&b64(x), &b64(y)).unwrap();
    let ed = sig::Ed25519KeyPair::generate_pkcs8(&rng).unwrap();
    let ed_pub = sig::Ed25519KeyPair::from_pkcs8(ed.as_ref())
        .unwrap()
        .public_key()
        .as_ref()
        .to_vec();
    let (rs_e, rs_d) = rsa();
    let (ps_e, ps_d) = rsa();
    vec![
        (Algorithm::RS256, rs_e, rs_d),
        (Algorithm::PS256, ps_e, ps_d),
        (
            Algorithm::ES256,
            EncodingKey::from_ec_der(p256.as_ref()),
            ec,
        ),
        (
            Algorithm::EdDSA,
            EncodingKey::from_ed_der(ed.as_ref()),
            DecodingKey::from_ed_components(&b64(&ed_pub)).unwrap(),
        ),
    ]
}

fn verify(p: &CryptoProvider, alg: Algorithm, key: &DecodingKey, msg: &[u8], s: &Vec<u8>) {
    let v = (p.verifier_factory)(&alg, key).unwrap();
    v.verify(msg, s).unwrap();
}

fn bench(c: &mut Criterion) {
    let ring_p = &jwt_ring::PROVIDER;
    let rust_crypto = &jsonwebtoken::crypto::rust_crypto::DEFAULT_PROVIDER;
    for (alg, enc, dec) in keys() {
        let msg = message(&format!("{alg:?}"));
        // Signed by the RustCrypto backend; each backend must accept the
        // other's signatures before either is timed.
        let s = (rust_crypto.signer_factory)(&alg, &enc)
            .unwrap()
            .try_sign(&msg)
            .unwrap();
        let s2 = (ring_p.signer_factory)(&alg, &enc)
            .unwrap()
            .try_sign(&msg)
            .unwrap();
        verify(ring_p, alg, &dec, &msg, &s);
        verify(rust_crypto, alg, &dec, &msg, &s2);
        let mut g = c.benchmark_group(format!("jwt_verify_{alg:?}"));
        g.bench_function("ring", |b| b.iter(|| verify(ring_p, alg, &dec, &msg, &s)));
        g.bench_function("rust_crypto", |b| {
            b.iter(|| verify(rust_crypto, alg, &dec, &msg, &s))
        });
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
