//! TLS: the edges' server side (`[tls]`) and the client settings of the
//! broker's outgoing connections (upstream routers, `auth.jwks_url`).
//!
//! # Server side
//! - One rustls configuration per edge, differing only in ALPN: `h2` for
//!   gRPC (grpc clients insist on it), `http/1.1` for the MCP HTTP edge,
//!   none for frames. TLS 1.3 and 1.2 only, with ring's default suites
//!   (AEAD only, forward-secret key exchange only).
//! - [`ServerTls`] holds the configurations behind an `ArcSwap`: each
//!   handshake takes the current one, so loading the files again (a reload,
//!   or a change seen by the watcher of the `routing` thread) changes what
//!   new connections get and leaves established ones alone.
//! - A handshake is bounded by `tls.handshake_timeout` and runs in the
//!   connection's own task, never in an accept loop.
//! - The shards' streams are in [`uring`]; the gRPC edge uses tokio-rustls.
//! - rustls does not look at the served certificates' dates. Each load
//!   reads them ([`Validity`]): an expired or not yet valid certificate is
//!   served all the same (refusing to start would turn a renewal that came
//!   late into an outage of every client, the ones that do not check dates
//!   included), but it is logged as a warning, and the chain's expiry is a
//!   metric, `mcp_tls_certificate_expiry_timestamp_seconds`, which the
//!   shipped alerts watch.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use arc_swap::ArcSwap;
use rustls::ServerConfig;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::config::TlsSection;

pub mod record;
pub mod uring;

/// The edges that serve TLS, as metrics label them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Edge {
    Frames = 0,
    Grpc = 1,
    Http = 2,
}

impl Edge {
    pub const ALL: [Edge; 3] = [Edge::Frames, Edge::Grpc, Edge::Http];

    pub fn as_str(self) -> &'static str {
        match self {
            Edge::Frames => "frames",
            Edge::Grpc => "grpc",
            Edge::Http => "http",
        }
    }
}

/// The rustls configuration of each edge, built from one `[tls]`.
pub struct ServerConfigs {
    edges: [Arc<ServerConfig>; 3],
    /// The served chain's dates; `None` if they could not be read (rustls
    /// accepted the chain, so this is logged, not refused).
    validity: Option<Validity>,
}

/// When every certificate of a chain is valid: from the latest notBefore
/// to the earliest notAfter, as Unix times. A client that checks dates
/// refuses the chain outside this window, whichever certificate is out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Validity {
    pub not_before: i64,
    pub not_after: i64,
}

impl Validity {
    /// The window of `certs` (DER), or why a certificate's dates could not
    /// be read.
    pub fn of_chain(certs: &[CertificateDer<'_>]) -> Result<Validity, String> {
        let mut window = Validity {
            not_before: i64::MIN,
            not_after: i64::MAX,
        };
        for (i, der) in certs.iter().enumerate() {
            let (_, cert) = x509_parser::parse_x509_certificate(der)
                .map_err(|e| format!("certificate {} of the chain: {e}", i + 1))?;
            let v = cert.validity();
            window.not_before = window.not_before.max(v.not_before.timestamp());
            window.not_after = window.not_after.min(v.not_after.timestamp());
        }
        Ok(window)
    }

    /// What is wrong with the window at `now` (Unix seconds), worded for
    /// the log; `None` when `now` is inside it.
    pub fn problem(&self, now: i64) -> Option<String> {
        let at = |t: i64| match u64::try_from(t) {
            Ok(secs) => humantime_serde::re::humantime::format_rfc3339_seconds(
                std::time::UNIX_EPOCH + Duration::from_secs(secs),
            )
            .to_string(),
            // humantime formats no time before 1970 (it panics), which a
            // certificate's notAfter may still be.
            Err(_) => format!("{t} (Unix time)"),
        };
        if now > self.not_after {
            Some(format!(
                "expired at {}: clients that check dates refuse every handshake",
                at(self.not_after)
            ))
        } else if now < self.not_before {
            Some(format!(
                "not valid until {} (is the clock right?): clients that check dates refuse every handshake until then",
                at(self.not_before)
            ))
        } else {
            None
        }
    }
}

/// Now, in Unix seconds.
fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

impl ServerConfigs {
    /// Reads the files of `section`. Every error names its file.
    pub fn load(section: &TlsSection) -> Result<Self, Vec<String>> {
        let mut errors = Vec::new();
        let certs = read_certs(&section.cert_file, "tls.cert_file")
            .map_err(|e| errors.push(e))
            .ok();
        let key = read_key(&section.key_file).map_err(|e| errors.push(e)).ok();
        let verifier = match &section.client_ca_file {
            None => None,
            Some(p) => match client_verifier(p) {
                Ok(v) => Some(v),
                Err(e) => {
                    errors.push(e);
                    None
                }
            },
        };
        let (Some(certs), Some(key)) = (certs, key) else {
            return Err(errors);
        };
        if !errors.is_empty() {
            return Err(errors);
        }
        let validity = Validity::of_chain(&certs)
            .map_err(|e| {
                tracing::warn!(
                    cert_file = %section.cert_file.display(),
                    "cannot read the certificates' dates ({e}); they are served, but mcp_tls_certificate_expiry_timestamp_seconds is not reported"
                )
            })
            .ok();
        let builder = ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
            .map_err(|e| vec![format!("TLS settings: {e}")])?;
        let builder = match verifier {
            Some(v) => builder.with_client_cert_verifier(v),
            None => builder.with_no_client_auth(),
        };
        let base = builder.with_single_cert(certs, key).map_err(|e| {
            vec![format!(
                "tls.cert_file {}, tls.key_file {}: {e}",
                section.cert_file.display(),
                section.key_file.display()
            )]
        })?;
        let with_alpn = |alpn: &[&[u8]]| {
            let mut c = base.clone();
            c.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
            // The shards take the traffic keys out of rustls once the
            // handshake is done and run the record layer themselves
            // (tls/record.rs); the keys never leave the connection's halves.
            c.enable_secret_extraction = true;
            Arc::new(c)
        };
        Ok(Self {
            edges: [
                with_alpn(&[]),
                with_alpn(&[b"h2"]),
                with_alpn(&[b"http/1.1"]),
            ],
            validity,
        })
    }

    pub fn get(&self, edge: Edge) -> &Arc<ServerConfig> {
        &self.edges[edge as usize]
    }

    /// Logs a warning if the served chain is out of date now; called when
    /// the configurations go into effect.
    fn warn_if_out_of_date(&self, cert_file: &Path) {
        if let Some(problem) = self.validity.and_then(|v| v.problem(unix_now())) {
            tracing::warn!(cert_file = %cert_file.display(), "the TLS certificate is {problem}");
        }
    }
}

/// The key exchange groups of every TLS connection, in the broker's order
/// of preference as a client: the post-quantum hybrid X25519MLKEM768, from
/// aws-lc-rs (ring has no ML-KEM), so that traffic recorded today stays safe
/// against a future quantum computer; then ring's X25519, P-256 and P-384.
///
/// Listed here rather than taken from ring's defaults, whose order rustls
/// 0.23.48 changed to P-384 first. A rustls client sends key shares for its
/// first group and, beside a hybrid, for the hybrid's X25519 half. With
/// P-384 second, a classic server that also speaks P-384 (a rustls server
/// follows the client's order) would choose it, find no share for it and
/// ask again: a HelloRetryRequest, one round trip more, on every connection
/// to an upstream or a JWKS server.
pub const KX_GROUPS: &[&dyn rustls::crypto::SupportedKxGroup] = &[
    rustls::crypto::aws_lc_rs::kx_group::X25519MLKEM768,
    rustls::crypto::ring::kx_group::X25519,
    rustls::crypto::ring::kx_group::SECP256R1,
    rustls::crypto::ring::kx_group::SECP384R1,
];

/// The crypto of every TLS connection the broker makes or takes: ring's
/// (the record layer, `tls/record.rs`, seals with ring's AEADs under the
/// keys rustls derives, and JWTs are checked with ring), with the key
/// exchange groups of [`KX_GROUPS`].
/// A rustls server follows the client's order of preference: a client that
/// prefers the hybrid (browsers, Go, OpenSSL 3.5+) gets it, one that does
/// not know it gets its own first choice (X25519 for most) as before; both
/// sent a key share for that group, so neither pays a round trip. As a
/// client (upstreams, JWKS) the broker offers the hybrid first. TLS 1.2
/// never uses it.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::CryptoProvider {
        kx_groups: KX_GROUPS.to_vec(),
        ..ring_provider()
    })
}

/// ring's provider as rustls ships it: its cipher suites, signature
/// algorithms, key loading and random numbers, and its classic key exchange
/// groups in rustls's order.
///
/// rustls 0.23.48 deprecates it for having no post-quantum key exchange;
/// [`provider`] adds the hybrid, and this is the only way to ring's random
/// numbers and key loading.
#[expect(
    deprecated,
    reason = "the post-quantum group it lacks is added by `provider`"
)]
pub fn ring_provider() -> rustls::crypto::CryptoProvider {
    rustls::crypto::ring::default_provider()
}

fn read_certs(path: &Path, key: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let shown = path.display();
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .map_err(|e| format!("{key} {shown}: {e}"))?
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{key} {shown}: {e}"))?;
    if certs.is_empty() {
        return Err(format!("{key} {shown}: no PEM certificate in it"));
    }
    Ok(certs)
}

fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, String> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| {
        format!(
            "tls.key_file {}: {e} (expected a PEM private key: PKCS#8, PKCS#1 or SEC1)",
            path.display()
        )
    })
}

fn client_verifier(
    path: &Path,
) -> Result<Arc<dyn rustls::server::danger::ClientCertVerifier>, String> {
    let mut roots = rustls::RootCertStore::empty();
    for c in read_certs(path, "tls.client_ca_file")? {
        roots
            .add(c)
            .map_err(|e| format!("tls.client_ca_file {}: {e}", path.display()))?;
    }
    rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
        .build()
        .map_err(|e| format!("tls.client_ca_file {}: {e}", path.display()))
}

/// What the watcher compares: each file's modification time and size.
type Stamps = Vec<Option<(SystemTime, u64)>>;

fn stamps(section: &TlsSection) -> Stamps {
    let mut files: Vec<&PathBuf> = vec![&section.cert_file, &section.key_file];
    files.extend(section.client_ca_file.as_ref());
    files
        .into_iter()
        .map(|p| {
            std::fs::metadata(p)
                .ok()
                .and_then(|m| Some((m.modified().ok()?, m.len())))
        })
        .collect()
}

/// The edges' TLS: the current configurations, what they were loaded from,
/// and counters for `/metrics`.
pub struct ServerTls {
    configs: ArcSwap<ServerConfigs>,
    /// The section in effect, the files' stamps when last loaded (or last
    /// tried), and when the watcher looks next.
    state: Mutex<(TlsSection, Stamps, Instant)>,
    reloads: AtomicU64,
    reload_failures: AtomicU64,
    handshake_failures: [AtomicU64; 3],
}

impl ServerTls {
    /// Loads the files of `section` (start-up).
    pub fn new(section: &TlsSection) -> Result<Self, Vec<String>> {
        let stamps = stamps(section);
        let configs = ServerConfigs::load(section)?;
        configs.warn_if_out_of_date(&section.cert_file);
        Ok(Self {
            configs: ArcSwap::from_pointee(configs),
            state: Mutex::new((
                section.clone(),
                stamps,
                Instant::now() + section.watch_interval,
            )),
            reloads: AtomicU64::new(0),
            reload_failures: AtomicU64::new(0),
            handshake_failures: Default::default(),
        })
    }

    /// The configuration a new connection of `edge` handshakes with.
    pub fn config(&self, edge: Edge) -> Arc<ServerConfig> {
        self.configs.load().get(edge).clone()
    }

    /// The handshake timeout in effect.
    pub fn handshake_timeout(&self) -> Duration {
        self.lock().0.handshake_timeout
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (TlsSection, Stamps, Instant)> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Loads `section`'s files, for a reload: built first, then swapped in
    /// whole by [`Self::install`] once the rest of the reload succeeded.
    pub fn prepare(section: &TlsSection) -> Result<(ServerConfigs, Stamps), Vec<String>> {
        let stamps = stamps(section);
        ServerConfigs::load(section).map(|c| (c, stamps))
    }

    /// Puts what [`Self::prepare`] loaded in effect for new connections.
    pub fn install(&self, section: &TlsSection, (configs, stamps): (ServerConfigs, Stamps)) {
        configs.warn_if_out_of_date(&section.cert_file);
        self.configs.store(Arc::new(configs));
        *self.lock() = (
            section.clone(),
            stamps,
            Instant::now() + section.watch_interval,
        );
        self.reloads.fetch_add(1, Ordering::Relaxed);
    }

    /// The watcher (the `routing` thread, about once a second): when
    /// `watch_interval` has passed and a file changed since it was last
    /// loaded, load them again. A failure keeps the configuration in effect
    /// and is tried again only after the files change once more.
    pub fn watch(&self) {
        let section = {
            let mut st = self.lock();
            if st.0.watch_interval.is_zero() || Instant::now() < st.2 {
                return;
            }
            st.2 = Instant::now() + st.0.watch_interval;
            let now = stamps(&st.0);
            if now == st.1 {
                return;
            }
            st.1 = now;
            st.0.clone()
        };
        match ServerConfigs::load(&section) {
            Ok(c) => {
                c.warn_if_out_of_date(&section.cert_file);
                self.configs.store(Arc::new(c));
                self.reloads.fetch_add(1, Ordering::Relaxed);
                tracing::info!(
                    cert_file = %section.cert_file.display(),
                    "TLS certificate files changed; new connections use them"
                );
            }
            Err(errors) => {
                self.reload_failures.fetch_add(1, Ordering::Relaxed);
                // One record (journald and log shippers split lines).
                tracing::error!(
                    ?errors,
                    "TLS certificate files changed but cannot be used; the ones loaded before stay in effect"
                );
            }
        }
    }

    /// A reload refused for its TLS files.
    pub fn reload_failed(&self) {
        self.reload_failures.fetch_add(1, Ordering::Relaxed);
    }

    /// A handshake on `edge` failed (or timed out).
    pub fn handshake_failed(&self, edge: Edge) {
        self.handshake_failures[edge as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// The server side of a TLS handshake on a shard's connection to
    /// `edge`, bounded by `tls.handshake_timeout` and abandoned when the
    /// drain begins (a connection not yet handshaken has sent nothing to
    /// answer). A failure is counted for `/metrics` and logged; `None` then,
    /// and the caller drops the connection.
    pub async fn accept_on_shard(
        &self,
        edge: Edge,
        stream: monoio::net::TcpStream,
        peer: std::net::SocketAddr,
        draining: &crate::local::Latch,
    ) -> Option<(uring::TlsReadHalf, uring::TlsWriteHalf)> {
        let timeout = self.handshake_timeout();
        let handshake = uring::accept(stream, self.config(edge));
        let done = monoio::select! {
            r = monoio::time::timeout(timeout, handshake) => r,
            _ = draining.wait() => return None,
        };
        let what = edge.as_str();
        match done {
            Ok(Ok((rd, wr, _))) => return Some((rd, wr)),
            Ok(Err(e)) => {
                tracing::debug!(edge = what, %peer, error = %e, "TLS handshake failed");
            }
            Err(_) => {
                tracing::debug!(edge = what, %peer, ?timeout, "TLS handshake not finished within tls.handshake_timeout");
            }
        }
        self.handshake_failed(edge);
        None
    }

    /// The earliest notAfter of the chain new connections get (Unix
    /// seconds), if its dates could be read.
    pub fn certificate_expiry(&self) -> Option<i64> {
        self.configs.load().validity.map(|v| v.not_after)
    }

    /// The latest notBefore of that chain (Unix seconds): before it,
    /// clients that check dates refuse the chain, as after its notAfter.
    pub fn certificate_not_before(&self) -> Option<i64> {
        self.configs.load().validity.map(|v| v.not_before)
    }

    pub fn handshake_failures(&self, edge: Edge) -> u64 {
        self.handshake_failures[edge as usize].load(Ordering::Relaxed)
    }

    /// Loads of the files after start-up: (applied, failed).
    pub fn reload_counts(&self) -> (u64, u64) {
        (
            self.reloads.load(Ordering::Relaxed),
            self.reload_failures.load(Ordering::Relaxed),
        )
    }
}

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
    rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS settings: {e}"))
        .map(|b| b.with_root_certificates(roots).with_no_client_auth())
}

#[cfg(test)]
mod tests {
    use super::Validity;

    #[test]
    fn a_window_is_out_of_date_only_outside_its_bounds_and_says_which_way() {
        // 2026-01-01T00:00:00Z to 2026-04-01T00:00:00Z.
        let v = Validity {
            not_before: 1_767_225_600,
            not_after: 1_775_001_600,
        };
        for inside in [v.not_before, v.not_before + 1, v.not_after] {
            assert_eq!(v.problem(inside), None, "{inside}");
        }
        let late = v.problem(v.not_after + 1).unwrap();
        assert!(
            late.starts_with("expired at 2026-04-01T00:00:00Z"),
            "{late}"
        );
        // Before 1970 (a certificate may say so): no panic in the wording.
        let ancient = Validity {
            not_before: -100,
            not_after: -10,
        };
        assert!(
            ancient
                .problem(0)
                .unwrap()
                .starts_with("expired at -10 (Unix time)")
        );
        let early = v.problem(v.not_before - 1).unwrap();
        assert!(
            early.starts_with("not valid until 2026-01-01T00:00:00Z"),
            "{early}"
        );
    }

    #[test]
    fn bytes_that_are_no_certificate_are_an_error_naming_their_place() {
        let not_a_certificate =
            rustls_pki_types::CertificateDer::from(vec![0x30, 0x03, 0x02, 0x01, 0x01]);
        let err = Validity::of_chain(&[not_a_certificate]).unwrap_err();
        assert!(err.starts_with("certificate 1 of the chain"), "{err}");
        assert_eq!(
            Validity::of_chain(&[]),
            Ok(Validity {
                not_before: i64::MIN,
                not_after: i64::MAX
            }),
            "no certificate bounds nothing (rustls refuses an empty chain first)"
        );
    }
}
