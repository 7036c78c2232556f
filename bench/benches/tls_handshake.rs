//! What a TLS 1.3 handshake costs the broker's side, by key exchange: the
//! post-quantum hybrid X25519MLKEM768 (offered since 2026-12-05) against
//! X25519, in memory, on the provider every TLS edge runs
//! (`mcp_broker::tls::provider()`) and `scripts/dev-certs`' ECDSA P-256
//! certificate.
//!
//! - `tls_handshake/server/x25519`: a client that knows only classic
//!   groups (ring's X25519 first), as OpenSSL before 3.5 is.
//! - `tls_handshake/server/x25519mlkem768`: a client that prefers the
//!   hybrid (aws-lc-rs's groups, hybrid first), as browsers and Go are.
//!
//! Each iteration is a whole handshake. `server/...` times the moves of the
//! client's flights into the server: the server's processing of them,
//! where it does its cryptography and queues its answers, plus the
//! client's copy of each flight out. `client/...` times the rest: the
//! client's processing, the server's copies out, and making both
//! connections (a few allocations).
//!
//! cargo bench -p mcp-bench --bench tls_handshake

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use mcp_bench::tls_fixture::{dev_certs, pump};
use rustls::crypto::SupportedKxGroup;
use rustls::{ClientConfig, ClientConnection, NamedGroup, ServerConfig, ServerConnection};
use rustls_pki_types::ServerName;

struct Pair {
    server: Arc<ServerConfig>,
    client: Arc<ClientConfig>,
}

impl Pair {
    fn new(
        groups: &[&'static dyn SupportedKxGroup],
        client: rustls::crypto::CryptoProvider,
    ) -> Pair {
        let (certs, key, roots) = dev_certs("tls-handshake");
        let server = ServerConfig::builder_with_provider(mcp_broker::tls::provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .unwrap();
        let provider = rustls::crypto::CryptoProvider {
            kx_groups: groups.to_vec(),
            ..client
        };
        let client = ClientConfig::builder_with_provider(Arc::new(provider))
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        Pair {
            server: Arc::new(server),
            client: Arc::new(client),
        }
    }

    /// One full handshake: the time of the moves into the server and of
    /// the rest (the module's comment), and the group it agreed on.
    fn handshake(&self, wire: &mut Vec<u8>) -> (Duration, Duration, Option<NamedGroup>) {
        let name = ServerName::try_from("localhost").unwrap();
        let (mut on_server, mut on_client) = (Duration::ZERO, Duration::ZERO);
        let t = Instant::now();
        let mut client = ClientConnection::new(self.client.clone(), name).unwrap();
        let mut server = ServerConnection::new(self.server.clone()).unwrap();
        on_client += t.elapsed();
        while client.is_handshaking() || server.is_handshaking() || server.wants_write() {
            // pump(a, b) writes a's records and processes them in b: the
            // writing is a copy, the processing is the work.
            let t = Instant::now();
            pump(&mut client, &mut server, wire);
            on_server += t.elapsed();
            let t = Instant::now();
            pump(&mut server, &mut client, wire);
            on_client += t.elapsed();
        }
        let group = client.negotiated_key_exchange_group().map(|g| g.name());
        (on_server, on_client, group)
    }
}

fn bench(c: &mut Criterion) {
    use rustls::crypto::aws_lc_rs::kx_group as pq;
    use rustls::crypto::ring::kx_group as classic;
    let cases = [
        (
            "x25519",
            Pair::new(
                &[classic::X25519, classic::SECP256R1],
                mcp_broker::tls::ring_provider(),
            ),
            NamedGroup::X25519,
        ),
        (
            "x25519mlkem768",
            Pair::new(
                &[pq::X25519MLKEM768, pq::X25519],
                rustls::crypto::aws_lc_rs::default_provider(),
            ),
            NamedGroup::X25519MLKEM768,
        ),
    ];
    let mut wire = Vec::with_capacity(16 * 1024);
    for (name, pair, want) in &cases {
        let (_, _, got) = pair.handshake(&mut wire);
        assert_eq!(got, Some(*want), "{name}: the group agreed on");
    }
    let mut g = c.benchmark_group("tls_handshake");
    for (name, pair, _) in &cases {
        g.bench_function(format!("server/{name}"), |b| {
            b.iter_custom(|iters| (0..iters).map(|_| pair.handshake(&mut wire).0).sum())
        });
        g.bench_function(format!("client/{name}"), |b| {
            b.iter_custom(|iters| (0..iters).map(|_| pair.handshake(&mut wire).1).sum())
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
