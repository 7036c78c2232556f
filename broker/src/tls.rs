//! TLS settings shared by the broker's outgoing connections (upstream
//! routers, `auth.jwks_url`).

use std::path::Path;
use std::sync::Arc;

/// rustls client settings: TLS 1.3 and 1.2, the webpki roots plus the
/// certificates of `ca_file` (a private CA). Errors name the file.
pub fn client_config(ca_file: Option<&Path>) -> Result<rustls::ClientConfig, String> {
    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    if let Some(path) = ca_file {
        let shown = path.display();
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
            .map_err(|e| format!("{shown}: {e}"))?
            .collect::<Result<_, _>>()
            .map_err(|e| format!("{shown}: {e}"))?;
        if certs.is_empty() {
            return Err(format!("{shown}: no PEM certificate in it"));
        }
        for c in certs {
            roots.add(c).map_err(|e| format!("{shown}: {e}"))?;
        }
    }
    rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS settings: {e}"))
        .map(|b| b.with_root_certificates(roots).with_no_client_auth())
}
