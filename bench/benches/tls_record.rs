//! TLS records on the shards' hot path (`broker/src/tls/record.rs`) against
//! rustls's own record layer, side by side in one run: one request sealed
//! by the client and opened by the server, and its answer the other way,
//! in memory, TLS 1.3 with AES-256-GCM (what rustls's ring provider prefers).
//!
//! - `record_layer/round_trip`: the broker's record layer, `Keys::seal` and
//!   `Keys::open` each way, the plaintext copied out as the read half does.
//! - `rustls/round_trip`: a rustls client and server connection (the
//!   buffered API `tls/uring.rs` ran before 2026-12-02): `writer().write`,
//!   `write_tls`, `read_tls`, `process_new_packets`, `reader().read`, each way.
//!
//! The request is 1,000 bytes (an HTTP POST carrying a bearer token, as
//! `bench/security_cost.py`'s TLS + auth sends), the answer 300. Heap
//! allocations per round trip are counted first and printed; the record
//! layer's must be none. Needs openssl (`scripts/dev-certs` makes the
//! rustls pair's certificate).
//!
//! cargo bench -p mcp-bench --bench tls_record

use std::hint::black_box;
use std::io::{Read, Write};
use std::sync::Arc;

use criterion::{Criterion, criterion_group, criterion_main};
use mcp_bench::alloc_counter::{CountingAlloc, count};
use mcp_bench::tls_fixture::{self, pump};
use mcp_broker::tls::record::{self, Keys, Version};
use rustls::ConnectionTrafficSecrets;
use rustls::crypto::cipher::{AeadKey, Iv};

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

const REQUEST: usize = 1000;
const ANSWER: usize = 300;
const ALLOC_ITERS: usize = 10_000;

/// One direction's keys, as rustls would extract them.
fn keys(seed: u8) -> Keys {
    let secrets = ConnectionTrafficSecrets::Aes256Gcm {
        key: AeadKey::from([seed; 32]),
        iv: Iv::new([seed ^ 0x5a; 12]),
    };
    Keys::new(Version::Tls13, (0, secrets)).expect("keys")
}

/// Both directions of one connection through the broker's record layer.
struct Ours {
    client_tx: Keys,
    server_rx: Keys,
    server_tx: Keys,
    client_rx: Keys,
    wire: Vec<u8>,
    read: Vec<u8>,
}

impl Ours {
    fn new() -> Ours {
        Ours {
            client_tx: keys(1),
            server_rx: keys(1),
            server_tx: keys(2),
            client_rx: keys(2),
            wire: Vec::with_capacity(record::MAX_RECORD),
            read: vec![0; 4096],
        }
    }

    /// Seals `plain` with `tx`, opens it with `rx`, copies it out.
    fn one_way(wire: &mut Vec<u8>, read: &mut [u8], tx: &mut Keys, rx: &mut Keys, plain: &[u8]) {
        wire.clear();
        tx.seal(record::APPLICATION_DATA, plain, wire).unwrap();
        let len = record::record_len(wire, Version::Tls13).unwrap().unwrap();
        let o = rx.open(&mut wire[..len]).unwrap();
        let n = o.end - o.start;
        read[..n].copy_from_slice(&wire[o.start..o.end]);
        assert_eq!(n, plain.len());
    }

    fn round_trip(&mut self, request: &[u8], answer: &[u8]) {
        let s = self;
        Ours::one_way(
            &mut s.wire,
            &mut s.read,
            &mut s.client_tx,
            &mut s.server_rx,
            request,
        );
        Ours::one_way(
            &mut s.wire,
            &mut s.read,
            &mut s.server_tx,
            &mut s.client_rx,
            answer,
        );
    }
}

/// A rustls client and server connection, handshaken in memory.
struct Rustls {
    client: rustls::ClientConnection,
    server: rustls::ServerConnection,
    wire: Vec<u8>,
    read: Vec<u8>,
}

impl Rustls {
    fn new() -> Rustls {
        use rustls_pki_types::ServerName;
        let (certs, key, roots) = tls_fixture::dev_certs("tls-record");
        let provider = Arc::new(mcp_broker::tls::ring_provider());
        let server = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .unwrap();
        let client = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let name = ServerName::try_from("localhost").unwrap();
        let mut r = Rustls {
            client: rustls::ClientConnection::new(Arc::new(client), name).unwrap(),
            server: rustls::ServerConnection::new(Arc::new(server)).unwrap(),
            wire: Vec::with_capacity(record::MAX_RECORD),
            read: vec![0; 4096],
        };
        while r.client.is_handshaking() || r.server.is_handshaking() || r.server.wants_write() {
            r.transfer(true);
            r.transfer(false);
        }
        assert_eq!(
            r.client.negotiated_cipher_suite().map(|s| s.suite()),
            Some(rustls::CipherSuite::TLS13_AES_256_GCM_SHA384)
        );
        r
    }

    /// Moves what one side has to send to the other and processes it.
    fn transfer(&mut self, client_to_server: bool) {
        if client_to_server {
            pump(&mut self.client, &mut self.server, &mut self.wire);
        } else {
            pump(&mut self.server, &mut self.client, &mut self.wire);
        }
    }

    fn round_trip(&mut self, request: &[u8], answer: &[u8]) {
        self.client.writer().write_all(request).unwrap();
        self.transfer(true);
        let n = self.server.reader().read(&mut self.read).unwrap();
        assert_eq!(n, request.len());
        self.server.writer().write_all(answer).unwrap();
        self.transfer(false);
        let n = self.client.reader().read(&mut self.read).unwrap();
        assert_eq!(n, answer.len());
    }
}

fn bench(c: &mut Criterion) {
    let request = vec![b'q'; REQUEST];
    let answer = vec![b'a'; ANSWER];
    let mut ours = Ours::new();
    let mut theirs = Rustls::new();
    for _ in 0..1000 {
        ours.round_trip(&request, &answer);
        theirs.round_trip(&request, &answer);
    }
    let ((), mine) = count(|| {
        for _ in 0..ALLOC_ITERS {
            ours.round_trip(&request, &answer);
        }
    });
    let ((), rustls) = count(|| {
        for _ in 0..ALLOC_ITERS {
            theirs.round_trip(&request, &answer);
        }
    });
    let per = |n: u64| n as f64 / ALLOC_ITERS as f64;
    println!(
        "allocating calls per round trip: record layer {:.2}, rustls {:.2}",
        per(mine.allocating_calls()),
        per(rustls.allocating_calls())
    );
    assert_eq!(mine.allocating_calls(), 0, "the record layer allocated");

    let mut g = c.benchmark_group("tls_record");
    g.bench_function("record_layer/round_trip", |b| {
        b.iter(|| ours.round_trip(black_box(&request), black_box(&answer)))
    });
    g.bench_function("rustls/round_trip", |b| {
        b.iter(|| theirs.round_trip(black_box(&request), black_box(&answer)))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
