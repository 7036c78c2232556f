//! TLS targets (`frames+tls://`, `https://`) through a TLS-terminating proxy
//! (tokio-rustls) in front of plaintext test servers: the frame server of
//! `common`, and a minimal MCP Streamable HTTP server here. Certificates
//! (a CA, a server certificate for `localhost` and `127.0.0.1`, a client
//! certificate) are made with `openssl` at test time; no key is checked in.
//!
//! Checked: load runs with zero errors over TLS 1.3 and TLS 1.2 (frames
//! with and without a bearer token in the initialize), mTLS with
//! and without a client certificate, and the errors a wrong CA or a wrong
//! name gets. The broker's own TLS edges are tested end to end in
//! broker/tests.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use common::{Behaviour, loadgen, report, serial, spawn};
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// Test certificates, made once per test binary.
struct Certs {
    dir: PathBuf,
}

impl Certs {
    fn path(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }
}

fn openssl(args: &[&str], dir: &Path) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run openssl (the TLS tests make their certificates with it)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn certs() -> &'static Certs {
    static CERTS: OnceLock<Certs> = OnceLock::new();
    CERTS.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("loadgen-tls-certs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
        ];
        let mut ca = vec!["req", "-x509"];
        ca.extend(ec);
        ca.extend([
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "2",
            "-subj",
            "/CN=loadgen test CA",
        ]);
        openssl(&ca, &dir);
        for (name, ext) in [
            (
                "server",
                "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n\
                 extendedKeyUsage=serverAuth\n",
            ),
            (
                "client",
                "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n",
            ),
        ] {
            std::fs::write(dir.join(format!("{name}.ext")), ext).unwrap();
            let (key, csr, pem, extf) = (
                format!("{name}.key"),
                format!("{name}.csr"),
                format!("{name}.pem"),
                format!("{name}.ext"),
            );
            let subj = format!("/CN={name}");
            let mut req = vec!["req"];
            req.extend(ec);
            req.extend(["-keyout", &key, "-out", &csr, "-subj", &subj]);
            openssl(&req, &dir);
            openssl(
                &[
                    "x509",
                    "-req",
                    "-in",
                    &csr,
                    "-CA",
                    "ca.pem",
                    "-CAkey",
                    "ca.key",
                    "-CAcreateserial",
                    "-out",
                    &pem,
                    "-days",
                    "2",
                    "-extfile",
                    &extf,
                ],
                &dir,
            );
        }
        Certs { dir }
    })
}

#[derive(Clone, Copy)]
struct ProxyOpts {
    /// Require a client certificate signed by the test CA.
    mtls: bool,
    /// Offer TLS 1.2 only.
    tls12_only: bool,
}

const PLAIN: ProxyOpts = ProxyOpts {
    mtls: false,
    tls12_only: false,
};

/// A TLS server on loopback that forwards each connection's plaintext to
/// `backend`. Runs until the test binary exits.
fn tls_proxy(backend: SocketAddr, opts: ProxyOpts) -> SocketAddr {
    let c = certs();
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(c.path("server.pem"))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_file(c.path("server.key")).unwrap();
    // A stock rustls server on ring, as its users build it.
    #[expect(deprecated, reason = "ring's provider as rustls ships it")]
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let versions: &[&rustls::SupportedProtocolVersion] = if opts.tls12_only {
        &[&rustls::version::TLS12]
    } else {
        &[&rustls::version::TLS13, &rustls::version::TLS12]
    };
    let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_protocol_versions(versions)
        .unwrap();
    let builder = if opts.mtls {
        let mut roots = rustls::RootCertStore::empty();
        for ca in CertificateDer::pem_file_iter(c.path("ca.pem")).unwrap() {
            roots.add(ca.unwrap()).unwrap();
        }
        let v =
            rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .unwrap();
        builder.with_client_cert_verifier(v)
    } else {
        builder.with_no_client_auth()
    };
    let mut config = builder.with_single_cert(chain, key).unwrap();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()
            .unwrap();
        rt.block_on(async move {
            let l = tokio::net::TcpListener::from_std(listener).unwrap();
            loop {
                let Ok((s, _)) = l.accept().await else { return };
                let _ = s.set_nodelay(true);
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(s).await else {
                        return;
                    };
                    if let Some(g) = tls.get_ref().1.negotiated_key_exchange_group() {
                        groups().lock().unwrap().push((addr.port(), g.name()));
                    }
                    let Ok(mut b) = tokio::net::TcpStream::connect(backend).await else {
                        return;
                    };
                    let _ = b.set_nodelay(true);
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut b).await;
                });
            }
        });
    });
    addr
}

/// The key exchange group of every handshake the proxies finished, with
/// the proxy's port.
fn groups() -> &'static std::sync::Mutex<Vec<(u16, rustls::NamedGroup)>> {
    static GROUPS: OnceLock<std::sync::Mutex<Vec<(u16, rustls::NamedGroup)>>> = OnceLock::new();
    GROUPS.get_or_init(Default::default)
}

/// A minimal MCP Streamable HTTP server: `initialize`, the initialized
/// notification, `tools/call` (JSON answers), `DELETE`. Counts calls and
/// the calls that carried `Authorization: Bearer test-token`.
#[derive(Default)]
struct Mcp {
    calls: AtomicUsize,
    authorized: AtomicUsize,
}

fn mcp_server() -> (SocketAddr, Arc<Mcp>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let stats = Arc::new(Mcp::default());
    let st = Arc::clone(&stats);
    std::thread::spawn(move || {
        for s in listener.incoming() {
            let Ok(s) = s else { return };
            let st = Arc::clone(&st);
            std::thread::spawn(move || serve_mcp(s, &st));
        }
    });
    (addr, stats)
}

fn serve_mcp(s: TcpStream, st: &Mcp) {
    let _ = s.set_nodelay(true);
    let mut w = s.try_clone().unwrap();
    let mut r = BufReader::new(s);
    loop {
        let mut head = String::new();
        loop {
            let mut line = String::new();
            if r.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            if line == "\r\n" {
                break;
            }
            head.push_str(&line);
        }
        let header = |name: &str| {
            head.lines().find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case(name).then(|| v.trim().to_owned())
            })
        };
        let len: usize = header("content-length").map_or(0, |v| v.parse().unwrap());
        let mut body = vec![0; len];
        if r.read_exact(&mut body).is_err() {
            return;
        }
        let (status, extra, body) = if head.starts_with("DELETE ") {
            ("200 OK", "", String::new())
        } else {
            let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
            let id = v["id"].clone();
            match v["method"].as_str().unwrap_or_default() {
                "initialize" => (
                    "200 OK",
                    "Mcp-Session-Id: s1\r\n",
                    serde_json::json!({"jsonrpc": "2.0", "id": id, "result": {
                        "protocolVersion": "2025-11-25", "capabilities": {},
                        "serverInfo": {"name": "tls-test", "version": "1"}}})
                    .to_string(),
                ),
                "notifications/initialized" => ("202 Accepted", "", String::new()),
                _ => {
                    st.calls.fetch_add(1, Ordering::SeqCst);
                    if header("authorization").as_deref() == Some("Bearer test-token") {
                        st.authorized.fetch_add(1, Ordering::SeqCst);
                    }
                    (
                        "200 OK",
                        "",
                        serde_json::json!({"jsonrpc": "2.0", "id": id, "result": {
                            "content": [{"type": "text", "text": "hello"}]}})
                        .to_string(),
                    )
                }
            }
        };
        let msg = format!(
            "HTTP/1.1 {status}\r\nContent-Type: application/json\r\n{extra}\
             Content-Length: {}\r\n\r\n{body}",
            body.len()
        );
        if w.write_all(msg.as_bytes()).is_err() {
            return;
        }
    }
}

fn frames_backend() -> SocketAddr {
    spawn(Behaviour::Stall {
        delay: Duration::ZERO,
        period: Duration::from_secs(1000),
        stall: Duration::ZERO,
    })
    .addr
}

/// Runs the generator; returns (exit success, report, stderr).
fn run(name: &str, args: &[&str]) -> (bool, serde_json::Value, String) {
    let json = common::json_path(name);
    let out = loadgen(args, &json);
    (
        out.status.success(),
        report(&json),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn assert_clean(r: &serde_json::Value, requests: u64) {
    assert_eq!(r["requests"], requests, "{r:#}");
    assert_eq!(r["errors"], 0, "{r:#}");
    assert!(r["failure"].is_null(), "{r:#}");
}

#[test]
fn frames_over_tls_13_and_12_run_clean_and_report_the_scheme_as_given() {
    let _g = serial();
    let ca = certs().path("ca.pem");
    for (opts, name) in [
        (PLAIN, "tls-frames-13"),
        (
            ProxyOpts {
                tls12_only: true,
                ..PLAIN
            },
            "tls-frames-12",
        ),
    ] {
        let proxy = tls_proxy(frames_backend(), opts);
        let target = format!("frames+tls://{proxy}");
        // Closed loop with several requests in flight per connection (reader
        // and writer tasks on one TLS connection), then open loop.
        let (ok, r, e) = run(
            name,
            &[
                "--target",
                &target,
                "--tool",
                "echo",
                "--args",
                r#"{"text":"hi"}"#,
                "--tls-ca",
                &ca,
                "--connections",
                "2",
                "--concurrency",
                "16",
                "--requests",
                "4000",
            ],
        );
        assert!(ok, "{e}");
        assert_clean(&r, 4000);
        assert_eq!(r["target"], target.as_str());
        let (ok, r, e) = run(
            name,
            &[
                "--target",
                &target,
                "--tool",
                "echo",
                "--tls-ca",
                &ca,
                "--rate",
                "500",
                "--duration",
                "1s",
            ],
        );
        assert!(ok, "{e}");
        assert_eq!(r["errors"], 0, "{r:#}");
        assert!(r["requests"].as_u64().unwrap() >= 450, "{r:#}");
    }
}

#[test]
fn frames_over_tls_initialize_with_the_bearer_token_after_the_handshake() {
    let _g = serial();
    let ca = certs().path("ca.pem");
    let (backend, seen) = common::bearer::spawn("tls-token");
    let proxy = tls_proxy(backend, PLAIN);
    let token = common::json_path("tls-frames-bearer").with_extension("token");
    std::fs::write(&token, "tls-token\n").unwrap();
    let (ok, r, e) = run(
        "tls-frames-bearer",
        &[
            "--target",
            &format!("frames+tls://{proxy}"),
            "--tool",
            "echo",
            "--tls-ca",
            &ca,
            "--connections",
            "2",
            "--concurrency",
            "8",
            "--requests",
            "1000",
            "--bearer-file",
            token.to_str().unwrap(),
        ],
    );
    let _ = std::fs::remove_file(&token);
    assert!(ok, "{e}");
    assert_clean(&r, 1000);
    let seen = seen.lock().unwrap();
    assert_eq!(seen.inits, vec![Some("tls-token".to_owned()); 2]);
    assert!(seen.init_first && seen.calls_before_init == 0, "{seen:?}");
}

#[test]
fn https_runs_clean_with_a_bearer_token_and_a_server_name() {
    let _g = serial();
    let (backend, stats) = mcp_server();
    let proxy = tls_proxy(backend, PLAIN);
    // Removed when the test ends.
    let token = tempfile::Builder::new()
        .prefix("loadgen-tls-token-")
        .tempfile()
        .expect("a token file");
    std::fs::write(token.path(), "test-token\n").unwrap();
    // Verified by name (`localhost`, a DNS SAN) instead of the IP.
    let target = format!("https://{proxy}/mcp");
    let (ok, r, e) = run(
        "tls-https",
        &[
            "--target",
            &target,
            "--tool",
            "echo",
            "--tls-ca",
            &certs().path("ca.pem"),
            "--tls-server-name",
            "localhost",
            "--bearer-file",
            token.path().to_str().unwrap(),
            "--connections",
            "2",
            "--pipeline",
            "4",
            "--requests",
            "2000",
        ],
    );
    assert!(ok, "{e}");
    assert_clean(&r, 2000);
    assert_eq!(r["target"], target.as_str());
    assert_eq!(stats.calls.load(Ordering::SeqCst), 2000);
    assert_eq!(stats.authorized.load(Ordering::SeqCst), 2000);
}

/// The generator offers X25519 first, on every edge. rustls 0.23.48 put
/// P-384 first in ring's defaults, and this proxy, like the broker, is a
/// stock rustls server on ring that follows the client's order: without
/// the generator's own order every handshake here would be a P-384 one.
/// `grpcs://` goes through tonic's own rustls client, which takes the
/// generator's provider only because the generator installs it as the
/// process's default.
#[test]
fn the_generator_prefers_x25519_over_rings_default_order() {
    let _g = serial();
    let ca = certs().path("ca.pem");
    let (backend, _) = mcp_server();
    let broker = common::broker::Broker::start();
    for target in [
        format!("frames+tls://{}", tls_proxy(frames_backend(), PLAIN)),
        format!("https://{}", tls_proxy(backend, PLAIN)),
        format!("grpcs://{}", tls_proxy(broker.grpc, PLAIN)),
    ] {
        let (ok, r, e) = run(
            "tls-groups",
            &[
                "--target",
                &target,
                "--tool",
                "echo",
                "--tls-ca",
                &ca,
                "--connections",
                "2",
                "--requests",
                "20",
            ],
        );
        assert!(ok, "{e}");
        assert_clean(&r, 20);
        let port: u16 = target.rsplit(':').next().unwrap().parse().unwrap();
        let seen: Vec<_> = groups()
            .lock()
            .unwrap()
            .iter()
            .filter(|(p, _)| *p == port)
            .map(|(_, g)| *g)
            .collect();
        assert!(!seen.is_empty(), "{target}: no handshake recorded");
        assert!(
            seen.iter().all(|g| *g == rustls::NamedGroup::X25519),
            "{target}: {seen:?}"
        );
    }
}

#[test]
fn mtls_needs_the_client_certificate() {
    let _g = serial();
    let c = certs();
    let ca = c.path("ca.pem");
    let mtls = ProxyOpts {
        mtls: true,
        ..PLAIN
    };
    let frames = format!("frames+tls://{}", tls_proxy(frames_backend(), mtls));
    let (backend, _) = mcp_server();
    let https = format!("https://{}", tls_proxy(backend, mtls));
    for target in [&frames, &https] {
        let (ok, r, e) = run(
            "tls-mtls",
            &[
                "--target",
                target,
                "--tool",
                "echo",
                "--tls-ca",
                &ca,
                "--tls-cert",
                &c.path("client.pem"),
                "--tls-key",
                &c.path("client.key"),
                "--requests",
                "300",
            ],
        );
        assert!(ok, "{e}");
        assert_clean(&r, 300);
        // Without one, TLS 1.3 servers refuse after the client's handshake
        // is done: the first read gets the alert, and the run fails.
        let (ok, r, e) = run(
            "tls-mtls-none",
            &[
                "--target",
                target,
                "--tool",
                "echo",
                "--tls-ca",
                &ca,
                "--requests",
                "300",
                "--timeout",
                "5s",
            ],
        );
        assert!(!ok, "{r:#}");
        let f = r["failure"].as_str().unwrap();
        assert!(f.to_lowercase().contains("certificate"), "{f}\n{e}");
    }
}

#[test]
fn a_wrong_ca_or_name_fails_at_connect_with_a_hint() {
    let _g = serial();
    let proxy = tls_proxy(frames_backend(), PLAIN);
    let target = format!("frames+tls://{proxy}");
    // No --tls-ca: the public roots do not know the test CA.
    let (ok, r, _) = run(
        "tls-no-ca",
        &["--target", &target, "--tool", "echo", "--requests", "10"],
    );
    assert!(!ok);
    let f = r["failure"].as_str().unwrap();
    assert!(
        f.contains("cannot connect") && f.contains("UnknownIssuer") && f.contains("--tls-ca"),
        "{f}"
    );
    // A name the certificate does not carry.
    let (ok, r, _) = run(
        "tls-bad-name",
        &[
            "--target",
            &target,
            "--tool",
            "echo",
            "--requests",
            "10",
            "--tls-ca",
            &certs().path("ca.pem"),
            "--tls-server-name",
            "other.example",
        ],
    );
    assert!(!ok);
    let f = r["failure"].as_str().unwrap();
    assert!(
        f.contains("not valid for name") && f.contains("--tls-server-name"),
        "{f}"
    );
}

#[test]
fn tls_flags_are_checked_before_anything_runs() {
    let ca = certs().path("ca.pem");
    for (args, needle) in [
        (
            vec!["--target", "frames://127.0.0.1:1", "--tls-ca", &ca],
            "for TLS targets only",
        ),
        (
            vec![
                "--target",
                "frames+tls://127.0.0.1:1",
                "--tls-ca",
                "/nonexistent/ca.pem",
            ],
            "--tls-ca /nonexistent/ca.pem",
        ),
        (
            vec!["--target", "https://127.0.0.1:1", "--tls-cert", &ca],
            "give both",
        ),
        (
            vec![
                "--target",
                "grpcs://127.0.0.1:1",
                "--tls-ca",
                &certs().path("server.ext"),
            ],
            "no PEM certificate",
        ),
        (
            vec![
                "--target",
                "https://127.0.0.1:1",
                "--tls-cert",
                &certs().path("client.pem"),
                "--tls-key",
                &certs().path("server.key"),
            ],
            "KeyMismatch",
        ),
        (
            vec![
                "--target",
                "frames+tls://127.0.0.1:1",
                "--tls-cert",
                &certs().path("client.pem"),
                "--tls-key",
                &ca,
            ],
            "no PEM private key",
        ),
    ] {
        let mut a = args.clone();
        a.extend(["--tool", "echo"]);
        let (ok, r, e) = run("tls-flags", &a);
        assert!(!ok);
        assert!(e.contains(needle), "{needle}: {e}");
        assert!(r["failure"].as_str().unwrap().contains(needle));
    }
}
