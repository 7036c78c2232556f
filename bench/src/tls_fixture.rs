//! A rustls client and server in one process, for the TLS benches: the
//! certificate from `scripts/dev-certs` (needs openssl) and the loop that
//! moves one side's records to the other.

use rustls::RootCertStore;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// `scripts/dev-certs`' ECDSA P-256 server certificate for `localhost`, its
/// key, and roots holding its CA. The files are removed once read.
pub fn dev_certs(
    tag: &str,
) -> (
    Vec<CertificateDer<'static>>,
    PrivateKeyDer<'static>,
    RootCertStore,
) {
    let dir = std::env::temp_dir().join(format!("mcp-bench-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/dev-certs");
    let ok = std::process::Command::new("bash")
        .arg(script)
        .arg(&dir)
        .status();
    assert!(
        ok.is_ok_and(|s| s.success()),
        "scripts/dev-certs (needs openssl)"
    );
    let certs: Vec<_> = CertificateDer::pem_file_iter(dir.join("server.pem"))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let key = PrivateKeyDer::from_pem_file(dir.join("server.key")).unwrap();
    let mut roots = RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(dir.join("ca.pem")).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let _ = std::fs::remove_dir_all(&dir);
    (certs, key, roots)
}

/// Moves everything `from` has to send into `to` and processes it there.
pub fn pump<A, B>(
    from: &mut rustls::ConnectionCommon<A>,
    to: &mut rustls::ConnectionCommon<B>,
    wire: &mut Vec<u8>,
) {
    wire.clear();
    while from.wants_write() {
        from.write_tls(wire).unwrap();
    }
    let mut src = &wire[..];
    while !src.is_empty() {
        to.read_tls(&mut src).unwrap();
        to.process_new_packets().unwrap();
    }
}
