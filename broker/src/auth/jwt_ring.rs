//! JWT signatures with ring: the `jsonwebtoken` crate's [`CryptoProvider`]
//! for this broker, installed by [`install`] before any token is read.
//!
//! Why not the crate's own RustCrypto backend, which this replaced:
//! - An RS256 check cost 3.1–3.3× as much there: ≈ 110–150 µs (the
//!   pure-Rust `rsa` crate, which also rebuilds the key on every check)
//!   against ≈ 35–48 µs with ring on the 2-core VM; PS256 and ES256
//!   2.1–3.9× (`bench/jwt-backends`,
//!   `bench/results/2026-12-03-vm-jwt-verify.md`). Every token the
//!   per-thread cache has not seen pays it, and a refused one always does:
//!   a client with no valid token but a known `kid` could keep a shard's
//!   core busy with ≈ 7,000 forged tokens a second.
//! - Ed25519 is the exception: ring's check is slower than
//!   `ed25519-dalek`'s AVX2 one (0.6–1.0×). Kept: Ed25519 issuers are
//!   rare, and one crypto library is less to audit than two.
//! - `rsa` carries RUSTSEC-2023-0071 (Marvin, a timing leak of private-key
//!   operations; it has no fixed release). This broker makes none, but an
//!   advisory with no fix stays in every audit of the lock.
//! - ring is linked already: it is rustls's provider on every TLS edge.
//!
//! # Invariants
//! - A key is used only with an algorithm of its own family ([`family`]):
//!   HMAC with an RSA key's bytes, the classic confusion, is refused here
//!   too, not only by the key set's per-key algorithm list (`auth.rs`).
//! - RSA keys must have 2048 to 8192 bits (ring's bounds); the key set
//!   refuses others when it loads (`auth.rs`, `rsa_bits`), so that a short
//!   key is a configuration error, not a token refused later.
//! - Signing exists for the tests, which mint their tokens through the
//!   same crate API a client library would use; the broker itself never
//!   signs.

use jsonwebtoken::crypto::{CryptoProvider, JwtSigner, JwtVerifier, KeyUtils};
use jsonwebtoken::errors::{Error, ErrorKind};
use jsonwebtoken::signature;
use jsonwebtoken::{Algorithm, AlgorithmFamily, DecodingKey, DecodingKeyKind, EncodingKey};
use ring::hmac;
use ring::rand::SystemRandom;
use ring::signature as sig;

/// The provider. Its `key_utils` serve only the crate's JWK builders
/// (`Jwk::from_encoding_key`, `Jwk::thumbprint`), which the broker never
/// calls: they refuse with an error that says so, where the crate's own
/// placeholders (`KeyUtils::new_unimplemented`) would panic.
pub static PROVIDER: CryptoProvider = CryptoProvider {
    signer_factory: signer,
    verifier_factory: verifier,
    key_utils: KeyUtils {
        rsa_pub_components_from_private_key: |_| Err(not_used()),
        rsa_pub_components_from_public_key: |_| Err(not_used()),
        ec_pub_components_from_private_key: |_, _| Err(not_used()),
        ed_pub_components_from_private_key: |_, _| Err(not_used()),
        compute_digest: |_, _| Err(not_used()),
    },
};

fn not_used() -> Error {
    ErrorKind::Provider("JWKs are not built from keys in mcp-broker".into()).into()
}

/// Installs [`PROVIDER`] as the process's provider; later calls do nothing.
/// No backend feature of `jsonwebtoken` is enabled, so there is no other
/// provider it could find instead, and none another crate could install.
pub fn install() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // Err means a provider is installed already: only this function
        // installs one, so it is this one.
        let _ = PROVIDER.install_default();
    });
}

fn family(alg: Algorithm, have: AlgorithmFamily) -> Result<(), Error> {
    if alg.family() == have {
        Ok(())
    } else {
        Err(ErrorKind::InvalidKeyFormat.into())
    }
}

fn rsa_verify_params(alg: Algorithm) -> &'static sig::RsaParameters {
    match alg {
        Algorithm::RS384 => &sig::RSA_PKCS1_2048_8192_SHA384,
        Algorithm::RS512 => &sig::RSA_PKCS1_2048_8192_SHA512,
        Algorithm::PS256 => &sig::RSA_PSS_2048_8192_SHA256,
        Algorithm::PS384 => &sig::RSA_PSS_2048_8192_SHA384,
        Algorithm::PS512 => &sig::RSA_PSS_2048_8192_SHA512,
        _ => &sig::RSA_PKCS1_2048_8192_SHA256,
    }
}

fn hmac_algorithm(alg: Algorithm) -> hmac::Algorithm {
    match alg {
        Algorithm::HS384 => hmac::HMAC_SHA384,
        Algorithm::HS512 => hmac::HMAC_SHA512,
        _ => hmac::HMAC_SHA256,
    }
}

/// How one token's signature is checked.
enum Check {
    /// A JWK's RSA key: modulus and exponent, big-endian.
    RsaComponents {
        params: &'static sig::RsaParameters,
        n: Vec<u8>,
        e: Vec<u8>,
    },
    /// An RSA key as PKCS#1 DER, an EC point (uncompressed SEC1) or an
    /// Ed25519 key: the forms ring reads as they are.
    Public(sig::UnparsedPublicKey<Vec<u8>>),
    Hmac(hmac::Key),
}

struct Verifier {
    alg: Algorithm,
    check: Check,
}

fn verifier(alg: &Algorithm, key: &DecodingKey) -> Result<Box<dyn JwtVerifier>, Error> {
    let alg = *alg;
    family(alg, key.family())?;
    let check = match (alg.family(), key.kind()) {
        (AlgorithmFamily::Rsa, DecodingKeyKind::RsaModulusExponent { n, e }) => {
            Check::RsaComponents {
                params: rsa_verify_params(alg),
                n: n.clone(),
                e: e.clone(),
            }
        }
        (AlgorithmFamily::Rsa, DecodingKeyKind::SecretOrDer(der)) => Check::Public(
            sig::UnparsedPublicKey::new(rsa_verify_params(alg), der.clone()),
        ),
        (AlgorithmFamily::Ec, DecodingKeyKind::SecretOrDer(point)) => {
            let a: &'static dyn sig::VerificationAlgorithm = match alg {
                Algorithm::ES384 => &sig::ECDSA_P384_SHA384_FIXED,
                _ => &sig::ECDSA_P256_SHA256_FIXED,
            };
            Check::Public(sig::UnparsedPublicKey::new(a, point.clone()))
        }
        (AlgorithmFamily::Ed, DecodingKeyKind::SecretOrDer(x)) => {
            Check::Public(sig::UnparsedPublicKey::new(&sig::ED25519, x.clone()))
        }
        (AlgorithmFamily::Hmac, DecodingKeyKind::SecretOrDer(secret)) => {
            Check::Hmac(hmac::Key::new(hmac_algorithm(alg), secret))
        }
        _ => return Err(ErrorKind::InvalidKeyFormat.into()),
    };
    Ok(Box::new(Verifier { alg, check }))
}

impl signature::Verifier<Vec<u8>> for Verifier {
    fn verify(&self, msg: &[u8], signature: &Vec<u8>) -> Result<(), signature::Error> {
        let r = match &self.check {
            Check::RsaComponents { params, n, e } => sig::RsaPublicKeyComponents {
                n: n.as_slice(),
                e: e.as_slice(),
            }
            .verify(params, msg, signature),
            Check::Public(k) => k.verify(msg, signature),
            // Constant time: ring compares the tags without an early exit.
            Check::Hmac(k) => hmac::verify(k, msg, signature),
        };
        r.map_err(|_| signature::Error::new())
    }
}

impl JwtVerifier for Verifier {
    fn algorithm(&self) -> Algorithm {
        self.alg
    }
}

enum Key {
    Rsa(sig::RsaKeyPair, &'static dyn sig::RsaEncoding),
    Ecdsa(sig::EcdsaKeyPair),
    Ed25519(sig::Ed25519KeyPair),
    Hmac(hmac::Key),
}

struct Signer {
    alg: Algorithm,
    key: Key,
}

fn signer(alg: &Algorithm, key: &EncodingKey) -> Result<Box<dyn JwtSigner>, Error> {
    let alg = *alg;
    family(alg, key.family())?;
    let der = key.as_bytes();
    let key = match alg {
        Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512 => {
            Key::Hmac(hmac::Key::new(hmac_algorithm(alg), der))
        }
        Algorithm::ES256 | Algorithm::ES384 => {
            let a = if alg == Algorithm::ES384 {
                &sig::ECDSA_P384_SHA384_FIXED_SIGNING
            } else {
                &sig::ECDSA_P256_SHA256_FIXED_SIGNING
            };
            Key::Ecdsa(
                sig::EcdsaKeyPair::from_pkcs8(a, der, &SystemRandom::new())
                    .map_err(|_| Error::from(ErrorKind::InvalidEcdsaKey))?,
            )
        }
        Algorithm::EdDSA => Key::Ed25519(
            sig::Ed25519KeyPair::from_pkcs8_maybe_unchecked(der)
                .map_err(|_| Error::from(ErrorKind::InvalidEddsaKey))?,
        ),
        _ => {
            let encoding: &'static dyn sig::RsaEncoding = match alg {
                Algorithm::RS384 => &sig::RSA_PKCS1_SHA384,
                Algorithm::RS512 => &sig::RSA_PKCS1_SHA512,
                Algorithm::PS256 => &sig::RSA_PSS_SHA256,
                Algorithm::PS384 => &sig::RSA_PSS_SHA384,
                Algorithm::PS512 => &sig::RSA_PSS_SHA512,
                _ => &sig::RSA_PKCS1_SHA256,
            };
            let pair = sig::RsaKeyPair::from_der(der)
                .map_err(|e| Error::from(ErrorKind::InvalidRsaKey(e.to_string())))?;
            Key::Rsa(pair, encoding)
        }
    };
    Ok(Box::new(Signer { alg, key }))
}

impl signature::Signer<Vec<u8>> for Signer {
    fn try_sign(&self, msg: &[u8]) -> Result<Vec<u8>, signature::Error> {
        let rng = SystemRandom::new();
        match &self.key {
            Key::Rsa(pair, encoding) => {
                let mut out = vec![0; pair.public().modulus_len()];
                pair.sign(*encoding, &rng, msg, &mut out)
                    .map_err(|_| signature::Error::new())?;
                Ok(out)
            }
            Key::Ecdsa(pair) => pair
                .sign(&rng, msg)
                .map(|s| s.as_ref().to_vec())
                .map_err(|_| signature::Error::new()),
            Key::Ed25519(pair) => Ok(pair.sign(msg).as_ref().to_vec()),
            Key::Hmac(k) => Ok(hmac::sign(k, msg).as_ref().to_vec()),
        }
    }
}

impl JwtSigner for Signer {
    fn algorithm(&self) -> Algorithm {
        self.alg
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine as _;
    use jsonwebtoken::{Header, Validation};
    use ring::rand::SystemRandom;
    use serde_json::{Value, json};
    use sig::KeyPair as _;

    fn b64(b: &[u8]) -> String {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b)
    }

    fn claims() -> Value {
        json!({"sub": "alice", "exp": jsonwebtoken::get_current_timestamp() + 600})
    }

    fn check(token: &str, key: &DecodingKey, alg: Algorithm) -> Result<Value, ErrorKind> {
        install();
        let mut v = Validation::new(alg);
        v.set_required_spec_claims(&["exp"]);
        jsonwebtoken::decode::<Value>(token, key, &v)
            .map(|d| d.claims)
            .map_err(|e| e.into_kind())
    }

    /// Whether a check failed on the signature (not on anything else).
    fn refused(r: Result<Value, ErrorKind>) -> bool {
        matches!(r, Err(ErrorKind::InvalidSignature))
    }

    /// Flips a bit of the signature's first byte.
    fn tamper(token: &str) -> String {
        let (msg, s) = token.rsplit_once('.').unwrap();
        let mut s = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(s)
            .unwrap();
        s[0] ^= 1;
        format!("{msg}.{}", b64(&s))
    }

    fn openssl(dir: &std::path::Path, args: &[&str], stdin: &[u8]) -> Vec<u8> {
        use std::io::Write as _;
        let mut c = std::process::Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("openssl (scripts/setup installs it)");
        c.stdin.take().unwrap().write_all(stdin).unwrap();
        let out = c.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    }

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// Tokens signed by OpenSSL, another implementation, pass ring's check
    /// through the crate's API in every RSA algorithm, from a JWK's
    /// modulus and exponent and from PKCS#1 DER; a flipped bit fails.
    #[test]
    fn openssl_signed_rsa_tokens_verify_and_tampered_ones_do_not() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        openssl(
            d,
            &[
                "genpkey",
                "-algorithm",
                "RSA",
                "-pkeyopt",
                "rsa_keygen_bits:2048",
                "-out",
                "k.pem",
            ],
            b"",
        );
        let m = String::from_utf8(openssl(
            d,
            &["rsa", "-in", "k.pem", "-noout", "-modulus"],
            b"",
        ))
        .unwrap();
        let n = hex(m.trim().trim_start_matches("Modulus="));
        let from_jwk = DecodingKey::from_rsa_raw_components(&n, &[1, 0, 1]);
        let der = openssl(
            d,
            &[
                "rsa",
                "-in",
                "k.pem",
                "-RSAPublicKey_out",
                "-outform",
                "DER",
            ],
            b"",
        );
        let from_der = DecodingKey::from_rsa_der(&der);
        for (alg, name, digest, pss) in [
            (Algorithm::RS256, "RS256", "-sha256", false),
            (Algorithm::RS384, "RS384", "-sha384", false),
            (Algorithm::RS512, "RS512", "-sha512", false),
            (Algorithm::PS256, "PS256", "-sha256", true),
            (Algorithm::PS384, "PS384", "-sha384", true),
            (Algorithm::PS512, "PS512", "-sha512", true),
        ] {
            let msg = format!(
                "{}.{}",
                b64(json!({"alg": name, "typ": "JWT"}).to_string().as_bytes()),
                b64(claims().to_string().as_bytes())
            );
            let mut args = vec!["dgst", digest, "-sign", "k.pem"];
            if pss {
                // RFC 7518 3.5: MGF1 with the same hash, salt as long as it.
                args.extend([
                    "-sigopt",
                    "rsa_padding_mode:pss",
                    "-sigopt",
                    "rsa_pss_saltlen:digest",
                ]);
            }
            let s = openssl(d, &args, msg.as_bytes());
            let token = format!("{msg}.{}", b64(&s));
            for key in [&from_jwk, &from_der] {
                assert_eq!(check(&token, key, alg).unwrap()["sub"], "alice", "{name}");
                assert!(refused(check(&tamper(&token), key, alg)), "{name}");
            }
        }
    }

    /// EC and Ed25519 keys made by ring: what the provider signs, it
    /// verifies from the JWK's public parts; a flipped bit fails.
    #[test]
    fn ec_and_ed25519_tokens_round_trip_and_tampered_ones_do_not() {
        install();
        let rng = SystemRandom::new();
        for (alg, signing, half) in [
            (Algorithm::ES256, &sig::ECDSA_P256_SHA256_FIXED_SIGNING, 32),
            (Algorithm::ES384, &sig::ECDSA_P384_SHA384_FIXED_SIGNING, 48),
        ] {
            let pkcs8 = sig::EcdsaKeyPair::generate_pkcs8(signing, &rng).unwrap();
            let pair = sig::EcdsaKeyPair::from_pkcs8(signing, pkcs8.as_ref(), &rng).unwrap();
            let point = pair.public_key().as_ref();
            let (x, y) = point[1..].split_at(half);
            let key = DecodingKey::from_ec_components(&b64(x), &b64(y)).unwrap();
            let token = jsonwebtoken::encode(
                &Header::new(alg),
                &claims(),
                &EncodingKey::from_ec_der(pkcs8.as_ref()),
            )
            .unwrap();
            assert_eq!(check(&token, &key, alg).unwrap()["sub"], "alice");
            assert!(refused(check(&tamper(&token), &key, alg)));
        }
        let pkcs8 = sig::Ed25519KeyPair::generate_pkcs8(&rng).unwrap();
        let pair = sig::Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap();
        let x = pair.public_key().as_ref();
        let key = DecodingKey::from_ed_components(&b64(x)).unwrap();
        let token = jsonwebtoken::encode(
            &Header::new(Algorithm::EdDSA),
            &claims(),
            &EncodingKey::from_ed_der(pkcs8.as_ref()),
        )
        .unwrap();
        assert_eq!(
            check(&token, &key, Algorithm::EdDSA).unwrap()["sub"],
            "alice"
        );
        assert!(refused(check(&tamper(&token), &key, Algorithm::EdDSA)));
    }

    /// A key serves its own family only: HMAC over an RSA key's bytes, or
    /// an EC algorithm with an Ed25519 key, is refused before any check.
    #[test]
    fn a_key_of_another_family_is_refused() {
        install();
        let rng = SystemRandom::new();
        let pkcs8 = sig::Ed25519KeyPair::generate_pkcs8(&rng).unwrap();
        let pair = sig::Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap();
        let ed = DecodingKey::from_ed_components(&b64(pair.public_key().as_ref())).unwrap();
        let rsa = DecodingKey::from_rsa_raw_components(&[0xc5; 256], &[1, 0, 1]);
        for (alg, key) in [
            (Algorithm::HS256, &rsa),
            (Algorithm::HS256, &ed),
            (Algorithm::ES256, &ed),
            (Algorithm::RS256, &ed),
        ] {
            assert!(verifier(&alg, key).is_err(), "{alg:?}");
        }
        // And HMAC itself works with a secret, constant-time compare and all.
        let secret = EncodingKey::from_secret(b"a shared secret").unwrap();
        let token =
            jsonwebtoken::encode(&Header::new(Algorithm::HS256), &claims(), &secret).unwrap();
        let key = DecodingKey::from_secret(b"a shared secret").unwrap();
        assert!(check(&token, &key, Algorithm::HS256).is_ok());
        assert!(refused(check(&tamper(&token), &key, Algorithm::HS256)));
    }

    /// The crate's JWK builders get an error, not the panic of its
    /// placeholder helpers.
    #[test]
    fn building_a_jwk_from_a_key_is_refused_without_a_panic() {
        install();
        let key = EncodingKey::from_rsa_der(b"any bytes");
        let e = jsonwebtoken::jwk::Jwk::from_encoding_key(&key, Algorithm::RS256).unwrap_err();
        assert!(e.to_string().contains("not built from keys"), "{e}");
    }
}
