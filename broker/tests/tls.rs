//! `[tls]`: the frame, gRPC and MCP HTTP edges over TLS, against the real
//! binary, with stock clients where they exist: the Python `mcp` SDK over
//! `https://`, grpcio with TLS credentials, `openssl s_client`; the frame
//! edge with a rustls client.
//!
//! Certificates are made for each test by `scripts/dev-certs` (a throwaway
//! CA, a `localhost` server certificate and a client certificate); nothing
//! is checked in.

mod common;

use std::ffi::OsStr;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use common::Broker;
use mcp_schema::fb::protocol::ProtocolVersion;
use rustls::{ClientConfig, ClientConnection, StreamOwned};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A test's directory, removed on drop.
struct Dir(PathBuf);

impl Dir {
    fn new(test: &str) -> Dir {
        let dir = std::env::temp_dir().join(format!("mcp-tls-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Dir(dir)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A CA, a server and a client certificate in `dir` (`scripts/dev-certs`).
fn dev_certs(dir: &Path) {
    let ok = Command::new("bash")
        .arg(repo().join("scripts/dev-certs"))
        .arg(dir)
        .status()
        .expect("bash")
        .success();
    assert!(ok, "scripts/dev-certs {} failed", dir.display());
}

/// The embedded default with a `[tls]` table on `certs`' server files and
/// `extra` lines in it.
fn tls_toml(certs: &Path, extra: &str) -> String {
    format!(
        "{}\n[tls]\ncert_file = \"{}\"\nkey_file = \"{}\"\n{extra}\n",
        mcp_broker::config::DEFAULT_TOML,
        certs.join("server.pem").display(),
        certs.join("server.key").display(),
    )
}

/// rustls client settings trusting `ca`, with a client certificate from
/// `client` (`client.pem`/`client.key` in that directory) when given.
fn client_config(ca: &Path, client: Option<&Path>, alpn: &[&[u8]]) -> Arc<ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let builder = ClientConfig::builder_with_provider(Arc::new(mcp_broker::tls::ring_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let mut cfg = match client {
        None => builder.with_no_client_auth(),
        Some(dir) => {
            let chain: Vec<_> = CertificateDer::pem_file_iter(dir.join("client.pem"))
                .unwrap()
                .map(Result::unwrap)
                .collect();
            let key = PrivateKeyDer::from_pem_file(dir.join("client.key")).unwrap();
            builder.with_client_auth_cert(chain, key).unwrap()
        }
    };
    cfg.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Arc::new(cfg)
}

/// `cfg` offering `alpn`.
fn with_alpn(cfg: &Arc<ClientConfig>, alpn: &[u8]) -> Arc<ClientConfig> {
    let mut c = (**cfg).clone();
    c.alpn_protocols = vec![alpn.to_vec()];
    Arc::new(c)
}

type Tls = StreamOwned<ClientConnection, TcpStream>;

/// A TLS connection to `addr` for `localhost`, its handshake done.
fn tls_connect(addr: SocketAddr, cfg: &Arc<ClientConfig>) -> std::io::Result<Tls> {
    let mut tcp = TcpStream::connect(addr)?;
    tcp.set_read_timeout(Some(Duration::from_secs(30)))?;
    let name = ServerName::try_from("localhost").unwrap();
    let mut conn = ClientConnection::new(cfg.clone(), name).map_err(std::io::Error::other)?;
    while conn.is_handshaking() {
        conn.complete_io(&mut tcp)?;
    }
    Ok(StreamOwned::new(conn, tcp))
}

/// A frame client over TLS.
fn frames_client(
    addr: SocketAddr,
    cfg: &Arc<ClientConfig>,
) -> std::io::Result<common::Client<Tls>> {
    tls_connect(addr, cfg).map(common::Client::over)
}

/// `echo_text` over a TLS frame connection: its answer, or the I/O error
/// (a refused client certificate shows on the first read in TLS 1.3).
fn frames_echo(c: &mut common::Client<Tls>, text: &str) -> Result<String, String> {
    let (_, f) = c.tool_call_frame("echo_text", &[("text", &format!("\"{text}\""))], None);
    c.stream.write_all(&f).map_err(|e| e.to_string())?;
    c.stream.flush().map_err(|e| e.to_string())?;
    let mut len = [0u8; 4];
    c.stream.read_exact(&mut len).map_err(|e| e.to_string())?;
    let mut frame = len.to_vec();
    frame.resize(4 + u32::from_le_bytes(len) as usize, 0);
    c.stream
        .read_exact(&mut frame[4..])
        .map_err(|e| e.to_string())?;
    Ok(common::tool_text(&frame))
}

/// An HTTP/1.1 POST of an MCP `initialize` over TLS: the status line.
fn https_initialize(addr: SocketAddr, cfg: &Arc<ClientConfig>) -> Result<String, String> {
    let mut s = tls_connect(addr, cfg).map_err(|e| e.to_string())?;
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;
    let req = format!(
        "POST /mcp HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    match s.read_to_end(&mut out) {
        Ok(_) => {}
        // A close without close_notify after the answer (the HTTP edge
        // may not get to send one as it shuts down): the answer is whole.
        Err(_) if !out.is_empty() => {}
        Err(e) => return Err(e.to_string()),
    }
    let text = String::from_utf8_lossy(&out);
    Ok(text.lines().next().unwrap_or("").to_string())
}

/// `openssl s_client` connecting to `addr` for `localhost`, trusting `ca`,
/// with `args`, its standard streams piped, started.
fn spawn_s_client(addr: SocketAddr, ca: &Path, args: &[&OsStr]) -> std::process::Child {
    Command::new("openssl")
        .arg("s_client")
        .arg("-connect")
        .arg(addr.to_string())
        .args(["-servername", "localhost", "-CAfile"])
        .arg(ca)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("openssl (scripts/setup installs it)")
}

/// `openssl s_client` against `addr` with `args`: (handshake done, output).
fn s_client(addr: SocketAddr, ca: &Path, args: &[&str]) -> (bool, String) {
    let args: Vec<&OsStr> = args.iter().map(OsStr::new).collect();
    let mut child = spawn_s_client(addr, ca, &args);
    // Closing stdin ends the session once the handshake is over.
    drop(child.stdin.take());
    let out = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let done = text.contains("Verify return code: 0 (ok)")
        && !text.contains("Cipher is (NONE)")
        && !text.contains("alert");
    (done, text)
}

fn line_with<'a>(text: &'a str, needle: &str) -> &'a str {
    text.lines().find(|l| l.contains(needle)).unwrap_or("")
}

#[test]
fn openssl_s_client_sees_tls_1_3_and_1_2_only_with_aead_suites_on_every_edge() {
    let dir = Dir::new("versions");
    dev_certs(&dir.0);
    let b = Broker::start_with_config(&tls_toml(&dir.0, ""), &[]);
    let ca = dir.path("ca.pem");
    for (edge, addr, alpn) in [
        ("frames", b.frames, None),
        ("grpc", b.grpc, Some("h2")),
        ("http", b.http, Some("http/1.1")),
    ] {
        let with_alpn = |args: &[&str]| {
            let mut v: Vec<&str> = args.to_vec();
            if let Some(a) = alpn {
                v.extend(["-alpn", a]);
            }
            s_client(addr, &ca, &v)
        };
        let (ok, out) = with_alpn(&["-tls1_3"]);
        assert!(ok, "{edge}: TLS 1.3 refused:\n{out}");
        assert!(
            line_with(&out, "Cipher is").contains("TLSv1.3"),
            "{edge}: {out}"
        );
        if let Some(a) = alpn {
            assert!(
                line_with(&out, "ALPN protocol").contains(a),
                "{edge}: ALPN {a}:\n{out}"
            );
        }
        let (ok, out) = with_alpn(&["-tls1_2"]);
        assert!(ok, "{edge}: TLS 1.2 refused:\n{out}");
        let cipher = line_with(&out, "Cipher is");
        assert!(
            cipher.contains("TLSv1.2") && cipher.contains("ECDHE") && cipher.contains("GCM"),
            "{edge}: TLS 1.2 with a forward-secret AEAD suite: {cipher}"
        );
        // Refused: TLS 1.1 and 1.0 (the client is told to offer them at
        // its lowest security level, so that the refusal is the broker's),
        // and TLS 1.2 with only CBC suites.
        for old in ["-tls1_1", "-tls1"] {
            let (ok, out) = with_alpn(&[old, "-cipher", "DEFAULT@SECLEVEL=0"]);
            assert!(!ok, "{edge}: {old} accepted:\n{out}");
            assert!(
                out.contains("alert protocol version") || out.contains("alert handshake failure"),
                "{edge}: {old} refused by an alert:\n{out}"
            );
        }
        let (ok, out) = with_alpn(&["-tls1_2", "-cipher", "ECDHE-ECDSA-AES128-SHA"]);
        assert!(!ok, "{edge}: a CBC suite accepted:\n{out}");
    }
    // Each refusal is counted for its edge (the plaintext admin endpoint).
    assert!(b.metric_sum("mcp_tls_handshake_failures_total") >= 9.0);
}

/// An interactive `openssl s_client` session: what it prints (stdout and
/// stderr) is gathered by two threads, so that a test can wait for an
/// answer before it sends the next thing. That matters for commands:
/// s_client takes a chunk of its stdin that begins with `K`, `k` or `R` as
/// a command, so each must arrive on its own.
struct OpenSsl {
    child: std::process::Child,
    stdin: Option<std::process::ChildStdin>,
    out: Arc<std::sync::Mutex<String>>,
    msg: PathBuf,
}

impl OpenSsl {
    /// Connects to `addr` for `localhost` with `args`; protocol messages
    /// (`-msg`) go to the file `msg`, not between the application data.
    fn start(addr: SocketAddr, ca: &Path, msg: PathBuf, args: &[&str]) -> OpenSsl {
        let mut all: Vec<&OsStr> = ["-msgfile".as_ref(), msg.as_os_str()].into();
        all.extend(["-msg", "-alpn", "http/1.1"].map(OsStr::new));
        all.extend(args.iter().map(OsStr::new));
        let mut child = spawn_s_client(addr, ca, &all);
        let out = Arc::new(std::sync::Mutex::new(String::new()));
        let gather = |mut r: Box<dyn Read + Send>| {
            let out = out.clone();
            std::thread::spawn(move || {
                let mut buf = [0u8; 64 * 1024];
                while let Ok(n @ 1..) = r.read(&mut buf) {
                    out.lock()
                        .unwrap()
                        .push_str(&String::from_utf8_lossy(&buf[..n]));
                }
            });
        };
        gather(Box::new(child.stdout.take().unwrap()));
        gather(Box::new(child.stderr.take().unwrap()));
        let stdin = child.stdin.take();
        OpenSsl {
            child,
            stdin,
            out,
            msg,
        }
    }

    fn send(&mut self, bytes: &[u8]) {
        let stdin = self.stdin.as_mut().unwrap();
        stdin.write_all(bytes).unwrap();
        stdin.flush().unwrap();
    }

    /// Waits up to 20 s for the output to hold `needle` `count` times.
    fn wait_for(&self, needle: &str, count: usize) -> bool {
        common::http::eventually(Duration::from_secs(20), || {
            self.out.lock().unwrap().matches(needle).count() >= count
        })
    }

    /// Waits as `wait_for` for the `n`th `echo_text` answer holding `text`.
    fn answered(&self, text: &str, n: usize) -> bool {
        self.wait_for(&format!(r#""text":"{text}""#), n)
    }

    /// What s_client printed so far, for a failure's message.
    fn output(&self) -> String {
        self.out.lock().unwrap().clone()
    }

    /// The protocol messages logged so far in one direction (`>>>` sent,
    /// `<<<` received) whose line names `what` (s_client flushes each).
    fn messages(&self, direction: &str, what: &str) -> usize {
        std::fs::read_to_string(&self.msg)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.starts_with(direction) && l.contains(what))
            .count()
    }
}

impl Drop for OpenSsl {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A 2026-07-28 `tools/call` of `echo_text` with `text`, as HTTP/1.1 bytes
/// on a keep-alive connection.
fn modern_echo_request(text: &str) -> Vec<u8> {
    let body = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"_meta":{{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{{}}}},"name":"echo_text","arguments":{{"text":"{text}"}}}}}}"#
    );
    format!(
        "POST /mcp HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nMCP-Protocol-Version: 2026-07-28\r\nMcp-Method: tools/call\r\nMcp-Name: echo_text\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Sends s_client's KeyUpdate command `cmd` (its `n`th), then a call whose
/// answer must come under the new keys; `back` is how many KeyUpdates the
/// broker should have sent by then.
fn key_update_then_call(
    s: &mut OpenSsl,
    suite: &str,
    cmd: &[u8],
    n: usize,
    back: usize,
    text: &str,
) {
    s.send(cmd);
    assert!(s.wait_for("KEYUPDATE", n), "{suite}:\n{}", s.output());
    s.send(&modern_echo_request(text));
    assert!(
        s.answered(text, 1),
        "{suite}: no answer after the KeyUpdate:\n{}",
        s.output()
    );
    assert_eq!(s.messages(">>>", "KeyUpdate"), n, "{suite}: sent");
    assert_eq!(
        s.messages("<<<", "KeyUpdate"),
        back,
        "{suite}: from the broker"
    );
}

/// The broker's own record layer (`tls::record`) against OpenSSL, whose
/// records rustls never produces in the unit tests: in every suite of both
/// versions, requests and answers of one record and of several (a 40 KB
/// text crosses the 16 KB record limit both ways) on one keep-alive
/// connection; in TLS 1.3, a KeyUpdate that asks for the broker's own
/// (answered, and the answers after it read under the new keys) and one
/// that does not; in TLS 1.2, a renegotiation refused with
/// `unexpected_message`.
#[test]
fn openssl_round_trips_records_in_every_suite_and_through_key_updates() {
    let dir = Dir::new("openssl-records");
    dev_certs(&dir.0);
    let b = Broker::start_with_config(&tls_toml(&dir.0, ""), &[]);
    let ca = dir.path("ca.pem");
    let big = "x".repeat(40_000);
    let suites = [
        ("-tls1_3", "-ciphersuites", "TLS_AES_128_GCM_SHA256"),
        ("-tls1_3", "-ciphersuites", "TLS_AES_256_GCM_SHA384"),
        ("-tls1_3", "-ciphersuites", "TLS_CHACHA20_POLY1305_SHA256"),
        ("-tls1_2", "-cipher", "ECDHE-ECDSA-AES128-GCM-SHA256"),
        ("-tls1_2", "-cipher", "ECDHE-ECDSA-AES256-GCM-SHA384"),
        ("-tls1_2", "-cipher", "ECDHE-ECDSA-CHACHA20-POLY1305"),
    ];
    for (i, (version, flag, suite)) in suites.into_iter().enumerate() {
        let msg = dir.path(&format!("msg-{i}"));
        let mut s = OpenSsl::start(b.http, &ca, msg, &[version, flag, suite]);
        assert!(
            s.wait_for("Cipher is", 1),
            "{suite}: no handshake:\n{}",
            s.output()
        );
        assert!(
            line_with(&s.output(), "Cipher is").contains(suite),
            "{suite} negotiated:\n{}",
            s.output()
        );
        s.send(&modern_echo_request("one"));
        assert!(s.answered("one", 1), "{suite}: first call:\n{}", s.output());
        s.send(&modern_echo_request(&big));
        assert!(s.answered(&big, 1), "{suite}: 40 KB call unanswered or cut");
        if version == "-tls1_3" {
            // `K`: the client's KeyUpdate asks for the broker's, which
            // comes; `k`: it does not, and none comes.
            key_update_then_call(&mut s, suite, b"K\n", 1, 1, "after-K");
            key_update_then_call(&mut s, suite, b"k\n", 2, 1, "after-k");
            s.send(&modern_echo_request(&big));
            assert!(s.answered(&big, 2), "{suite}: 40 KB under new keys");
        } else {
            s.send(b"R\n");
            assert!(
                s.wait_for("alert unexpected message", 1),
                "{suite}: a renegotiation is refused:\n{}",
                s.output()
            );
        }
    }
}

/// Key exchange groups a test client offers, most preferred first.
type Groups<'a> = &'a [&'static dyn rustls::crypto::SupportedKxGroup];

/// A client trusting `ca` that offers only `groups` for key exchange, in
/// that order, over `version`.
fn client_with_groups(
    ca: &Path,
    provider: rustls::crypto::CryptoProvider,
    groups: Groups<'_>,
    version: &'static rustls::SupportedProtocolVersion,
    alpn: Option<&[u8]>,
) -> Arc<ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let provider = rustls::crypto::CryptoProvider {
        kx_groups: groups.to_vec(),
        ..provider
    };
    let mut c = ClientConfig::builder_with_provider(Arc::new(provider))
        .with_protocol_versions(&[version])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    c.alpn_protocols = alpn.into_iter().map(<[u8]>::to_vec).collect();
    Arc::new(c)
}

#[test]
fn a_client_that_prefers_post_quantum_key_exchange_gets_it_and_others_keep_x25519() {
    use mcp_broker::tls::ring_provider as ring;
    use rustls::NamedGroup;
    use rustls::crypto::aws_lc_rs::{default_provider as aws, kx_group as pq};
    use rustls::crypto::ring::kx_group as classic;
    use rustls::version::{TLS12, TLS13};
    let dir = Dir::new("pq");
    dev_certs(&dir.0);
    let b = Broker::start_with_config(&tls_toml(&dir.0, ""), &[]);
    let ca = dir.path("ca.pem");
    // What each client offers, in its order of preference, and the group
    // the broker must take. A client offering the hybrid alone connects
    // only if the broker supports it.
    let hybrid_only: Groups = &[pq::X25519MLKEM768];
    let hybrid_first: Groups = &[pq::X25519MLKEM768, pq::X25519];
    let classic_only: Groups = &[classic::X25519, classic::SECP256R1];
    // A stock rustls client on ring (P-384 first since rustls 0.23.48, and
    // its one key share P-384's) gets its first choice: the broker follows
    // the client's order.
    let ring_groups = ring().kx_groups;
    let ring_first = ring_groups[0].name();
    for (edge, addr, alpn) in [
        ("frames", b.frames, None),
        ("grpc", b.grpc, Some(&b"h2"[..])),
        ("http", b.http, Some(&b"http/1.1"[..])),
    ] {
        for (case, provider, groups, want) in [
            (
                "hybrid only",
                aws(),
                hybrid_only,
                NamedGroup::X25519MLKEM768,
            ),
            (
                "hybrid first",
                aws(),
                hybrid_first,
                NamedGroup::X25519MLKEM768,
            ),
            ("classic only", ring(), classic_only, NamedGroup::X25519),
            ("stock ring client", ring(), &ring_groups[..], ring_first),
        ] {
            let cfg = client_with_groups(&ca, provider, groups, &TLS13, alpn);
            let tls = tls_connect(addr, &cfg)
                .unwrap_or_else(|e| panic!("{edge}, {case}: handshake failed: {e}"));
            let got = tls.conn.negotiated_key_exchange_group().map(|g| g.name());
            assert_eq!(got, Some(want), "{edge}, {case}");
            assert_eq!(
                tls.conn.handshake_kind(),
                Some(rustls::HandshakeKind::Full),
                "{edge}, {case}: a HelloRetryRequest round trip"
            );
            if edge == "frames" {
                // The records after the handshake are the broker's own
                // record layer's, under the keys this exchange derived.
                let mut c = common::Client::over(tls);
                assert_eq!(frames_echo(&mut c, "pq").as_deref(), Ok("pq"), "{case}");
            }
        }
    }
    // TLS 1.2 has no hybrid: a client offering it first gets X25519.
    let cfg = client_with_groups(&ca, aws(), hybrid_first, &TLS12, None);
    let tls = tls_connect(b.frames, &cfg).expect("TLS 1.2 handshake");
    assert_eq!(
        tls.conn.negotiated_key_exchange_group().map(|g| g.name()),
        Some(NamedGroup::X25519)
    );
}

/// Plaintext sent to a TLS port is refused and counted, and the edge goes
/// on serving TLS clients.
#[test]
fn plaintext_to_a_tls_port_is_closed_and_counted() {
    let dir = Dir::new("plaintext");
    dev_certs(&dir.0);
    let b = Broker::start_with_config(&tls_toml(&dir.0, ""), &[]);
    let mut c = b.connect();
    let (_, f) = c.tool_call_frame("echo_text", &[("text", "\"x\"")], None);
    let _ = c.stream.write_all(&f);
    assert!(c.read_frame().is_none(), "no frame answers plaintext");
    let cfg = client_config(&dir.path("ca.pem"), None, &[]);
    let mut t = frames_client(b.frames, &cfg).unwrap();
    assert_eq!(frames_echo(&mut t, "after").unwrap(), "after");
    let failures = |b: &Broker| {
        b.http_get("/metrics")
            .1
            .lines()
            .find(|l| l.starts_with("mcp_tls_handshake_failures_total{edge=\"frames\"}"))
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    assert!(common::http::eventually(Duration::from_secs(5), || {
        failures(&b) >= 1.0
    }));
}

/// TLS handshakes in progress count against `grpc.max_connections`: with
/// both slots held by connections that never send a ClientHello, a third
/// is closed at once; when one of them goes, a handshake is served again,
/// and the connection it made holds the freed slot.
#[test]
fn grpc_handshakes_in_progress_count_against_the_connection_bound() {
    let dir = Dir::new("grpc-bound");
    dev_certs(&dir.0);
    // One shard: with several, each has its own listener, and the third
    // connection could be accepted on one shard before the first two are
    // on another.
    let toml = tls_toml(&dir.0, "")
        .replacen("\nmax_connections = 10000\n", "\nmax_connections = 2\n", 1)
        .replacen("\nshards = 0\n", "\nshards = 1\n", 1);
    assert!(toml.contains("\nmax_connections = 2\n"), "the [grpc] key");
    assert!(toml.contains("\nshards = 1\n"), "the [broker] key");
    let b = Broker::start_with_config(&toml, &[]);
    let cfg = client_config(&dir.path("ca.pem"), None, &[b"h2"]);
    // The listener takes connections in arrival order: these two first.
    let silent = TcpStream::connect(b.grpc).unwrap();
    let _silent = TcpStream::connect(b.grpc).unwrap();
    assert!(
        tls_connect(b.grpc, &cfg).is_err(),
        "a third connection is closed while two handshakes are open"
    );
    drop(silent);
    // The freed slot is seen once the server reads the close.
    let mut served = None;
    assert!(common::http::eventually(Duration::from_secs(10), || {
        served = tls_connect(b.grpc, &cfg).ok();
        served.is_some()
    }));
    assert_eq!(
        served.as_ref().and_then(|s| s.conn.alpn_protocol()),
        Some(&b"h2"[..])
    );
    assert!(
        tls_connect(b.grpc, &cfg).is_err(),
        "the served connection holds the slot"
    );
}

/// Stock clients over TLS with bearer tokens: the Python `mcp` SDK over
/// `https://`, grpcio with TLS credentials, and a frame client that sends
/// its token in `InitializeRequest`.
#[test]
fn stock_clients_call_tools_over_tls_with_a_bearer_token() {
    const ISSUER: &str = "https://issuer.test";
    const AUDIENCE: &str = "https://localhost/mcp";
    let dir = Dir::new("clients");
    dev_certs(&dir.0);
    let key = common::jwt::rsa_key(&dir.0, "issuer");
    let jwks = serde_json::json!({"keys": [common::jwt::jwk("k1", &key)]});
    std::fs::write(dir.path("jwks.json"), jwks.to_string()).unwrap();
    let toml = format!(
        "{}\n[auth]\nissuer = \"{ISSUER}\"\naudience = \"{AUDIENCE}\"\njwks_file = \"{}\"\n",
        tls_toml(&dir.0, ""),
        dir.path("jwks.json").display()
    );
    let b = Broker::start_with_config(&toml, &[]);
    let now = common::jwt::now();
    let claims = serde_json::json!({
        "iss": ISSUER, "aud": AUDIENCE, "sub": "alice",
        "exp": now + 300, "nbf": now - 10, "iat": now,
    });
    let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::RS256);
    header.kid = Some("k1".into());
    let token = common::jwt::encode(
        &header,
        &claims,
        &jsonwebtoken::EncodingKey::from_rsa_pem(&key.private_pem).unwrap(),
    );
    let ca = dir.path("ca.pem");

    // Frames: the token in InitializeRequest, over TLS.
    let cfg = client_config(&ca, None, &[]);
    let mut c = frames_client(b.frames, &cfg).unwrap();
    let r = c.request(None, |e, h| {
        e.initialize_with_token(h, ProtocolVersion::V2025_06_18, "t", "1", Some(&token))
            .to_vec()
    });
    assert_eq!(common::error_code(&r), None, "initialize with a token");
    assert_eq!(frames_echo(&mut c, "framed").unwrap(), "framed");

    // The Python SDK 1.x over https://.
    let python = repo().join(".tools/mcp1/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run scripts/setup",
        python.display()
    );
    let url = format!("https://localhost:{}/mcp", b.http.port());
    let out = Command::new(&python)
        .arg(repo().join("broker/tests/clients/tls_client.py"))
        .arg(&url)
        .arg(&ca)
        .arg(&token)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("tls client: ok"),
        "python SDK over https:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // grpcio with TLS credentials and the token as metadata.
    let gen_dir = dir.path("grpc-gen");
    std::fs::create_dir_all(&gen_dir).unwrap();
    let out = Command::new("python3")
        .arg(repo().join("broker/tests/python/grpc_tls.py"))
        .arg(b.grpc.to_string())
        .arg(repo().join("proto"))
        .arg(&gen_dir)
        .arg(&ca)
        .arg(&token)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .expect("python3 (scripts/setup installs grpcio and grpcio-tools)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("grpc tls: ok"),
        "grpcio over TLS:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn mutual_tls_refuses_a_client_without_a_certificate_from_the_ca() {
    let dir = Dir::new("mtls");
    dev_certs(&dir.0);
    // Another CA's client certificate: signed, but not by the CA the broker
    // trusts.
    let other = dir.path("other");
    dev_certs(&other);
    let toml = tls_toml(
        &dir.0,
        &format!("client_ca_file = \"{}\"", dir.path("ca.pem").display()),
    );
    let b = Broker::start_with_config(&toml, &[]);
    let ca = dir.path("ca.pem");

    let with_cert = client_config(&ca, Some(&dir.0), &[]);
    let mut c = frames_client(b.frames, &with_cert).unwrap();
    assert_eq!(frames_echo(&mut c, "mutual").unwrap(), "mutual");
    let status = https_initialize(b.http, &with_alpn(&with_cert, b"http/1.1")).unwrap();
    assert!(status.contains("200"), "{status}");

    for (label, cfg) in [
        ("no certificate", client_config(&ca, None, &[])),
        (
            "another CA's certificate",
            client_config(&ca, Some(&other), &[]),
        ),
    ] {
        // TLS 1.3: the client's handshake ends before the server has
        // checked its certificate; the refusal is the first thing read.
        let refused = match frames_client(b.frames, &cfg) {
            Err(e) => e.to_string(),
            Ok(mut c) => frames_echo(&mut c, "x").expect_err(label),
        };
        assert!(
            refused.contains("CertificateRequired")
                || refused.contains("BadCertificate")
                || refused.contains("UnknownCA")
                || refused.contains("DecryptError"),
            "{label}: refused with a TLS alert, got {refused}"
        );
        let http = https_initialize(b.http, &cfg);
        assert!(
            http.as_ref().is_err() || http.as_ref().is_ok_and(|s| s.is_empty()),
            "{label}: HTTP refused: {http:?}"
        );
        // gRPC: the HTTP/2 preface, then the refusal instead of SETTINGS.
        let grpc = tls_connect(b.grpc, &with_alpn(&cfg, b"h2")).and_then(|mut s| {
            s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")?;
            s.flush()?;
            let mut first = [0u8; 9];
            s.read_exact(&mut first)
        });
        assert!(grpc.is_err(), "{label}: gRPC answered");
    }
}

/// Certificates load again on a reload and on a file change; established
/// connections keep theirs; files that cannot be used change nothing.
#[test]
fn certificates_reload_for_new_connections_while_established_ones_stay() {
    let dir = Dir::new("reload");
    let (a, b_certs, c_certs) = (dir.path("a"), dir.path("b"), dir.path("c"));
    for d in [&a, &b_certs, &c_certs] {
        dev_certs(d);
    }
    let live = dir.path("live");
    std::fs::create_dir_all(&live).unwrap();
    let install = |from: &Path| {
        // Key first, then certificate, each by rename: what a certificate
        // tool does; the watcher may see the pair half-replaced and must
        // keep the old one until both match.
        for f in ["server.key", "server.pem"] {
            let tmp = live.join(format!("{f}.tmp"));
            std::fs::copy(from.join(f), &tmp).unwrap();
            std::fs::rename(&tmp, live.join(f)).unwrap();
        }
    };
    install(&a);
    let b = Broker::start_with_config(&tls_toml(&live, "watch_interval = \"1s\""), &[]);
    let trusts = |ca: &Path| client_config(&ca.join("ca.pem"), None, &[]);

    let mut kept = frames_client(b.frames, &trusts(&a)).unwrap();
    assert_eq!(frames_echo(&mut kept, "before").unwrap(), "before");

    // A reload with files that do not match is refused; A stays.
    std::fs::copy(b_certs.join("server.key"), live.join("server.key")).unwrap();
    let refused = common::http::Conn::connect(b.metrics).request("POST", "/admin/reload", &[], b"");
    assert_eq!(refused.status, 422, "{}", refused.text());
    assert!(
        refused.text().contains("tls.cert_file"),
        "{}",
        refused.text()
    );
    assert!(
        frames_client(b.frames, &trusts(&a)).is_ok(),
        "A still served"
    );

    // B, by reload.
    install(&b_certs);
    let applied = common::http::Conn::connect(b.metrics).request("POST", "/admin/reload", &[], b"");
    assert_eq!(applied.status, 200, "{}", applied.text());
    let err = frames_client(b.frames, &trusts(&a))
        .err()
        .map(|e| e.to_string());
    assert!(
        // All dev CAs share a name: A's CA is tried and fails the signature.
        err.as_deref()
            .is_some_and(|e| e.contains("UnknownIssuer") || e.contains("BadSignature")),
        "A's CA no longer verifies a new connection: {err:?}"
    );
    let mut fresh = frames_client(b.frames, &trusts(&b_certs)).unwrap();
    assert_eq!(frames_echo(&mut fresh, "b").unwrap(), "b");
    assert_eq!(
        frames_echo(&mut kept, "still").unwrap(),
        "still",
        "the connection made under A goes on"
    );

    // C, by the file watcher alone.
    install(&c_certs);
    assert!(
        common::http::eventually(Duration::from_secs(15), || {
            frames_client(b.frames, &trusts(&c_certs)).is_ok()
        }),
        "the watcher loads C"
    );
    assert_eq!(frames_echo(&mut kept, "still").unwrap(), "still");
    assert_eq!(frames_echo(&mut fresh, "b").unwrap(), "b");
    let metrics = b.http_get("/metrics").1;
    let applied = line_with(&metrics, "mcp_tls_reloads_total{result=\"applied\"}");
    let n: f64 = applied.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(n >= 2.0, "{applied}");
}

#[test]
fn a_bad_certificate_or_key_file_is_a_start_up_error_naming_it() {
    let dir = Dir::new("bad");
    dev_certs(&dir.0);
    let other = dir.path("other");
    dev_certs(&other);
    std::fs::write(dir.path("garbage.pem"), "not a certificate\n").unwrap();
    let with = |cert: &Path, key: &Path, extra: &str| {
        format!(
            "{}\n[tls]\ncert_file = \"{}\"\nkey_file = \"{}\"\n{extra}\n",
            mcp_broker::config::DEFAULT_TOML,
            cert.display(),
            key.display()
        )
    };
    let (cert, key) = (dir.path("server.pem"), dir.path("server.key"));
    let missing = dir.path("missing.pem");
    for (toml, file, what) in [
        (with(&missing, &key, ""), missing.clone(), "tls.cert_file"),
        (with(&cert, &missing, ""), missing.clone(), "tls.key_file"),
        (
            with(&dir.path("garbage.pem"), &key, ""),
            dir.path("garbage.pem"),
            "tls.cert_file",
        ),
        // A certificate where the key should be.
        (with(&cert, &cert, ""), cert.clone(), "tls.key_file"),
        // Another certificate's key.
        (
            with(&cert, &other.join("server.key"), ""),
            other.join("server.key"),
            "tls.key_file",
        ),
        (
            with(
                &cert,
                &key,
                &format!("client_ca_file = \"{}\"", missing.display()),
            ),
            missing.clone(),
            "tls.client_ca_file",
        ),
    ] {
        let stderr = common::fails_to_start(&toml);
        assert!(
            stderr.contains(&file.display().to_string()) && stderr.contains(what),
            "names {what} {}:\n{stderr}",
            file.display()
        );
    }
}

/// A reload refused for its certificate files (here a key of another
/// pair) counts as a failed certificate reload, as the file watcher's
/// failures do: the configuration's own checks refused it first, and
/// `McpTlsReloadFailed` never fired on SIGHUP's or the admin's path.
#[test]
fn a_reload_refused_for_its_certificate_files_counts_as_failed() {
    let dir = Dir::new("reload-failed");
    let (live, other) = (dir.path("live"), dir.path("other"));
    dev_certs(&live);
    dev_certs(&other);
    // No watcher: only the reload reads the files.
    let b = Broker::start_with_config(&tls_toml(&live, "watch_interval = \"0s\""), &[]);
    let failed = || b.metric_where("mcp_tls_reloads_total", &["result=\"failed\""]);
    assert_eq!(failed(), 0.0);
    std::fs::copy(other.join("server.key"), live.join("server.key")).unwrap();
    let refused = common::http::Conn::connect(b.metrics).request("POST", "/admin/reload", &[], b"");
    assert_eq!(refused.status, 422, "{}", refused.text());
    assert_eq!(failed(), 1.0);
}

/// A certificate for localhost signed by `ca`'s authority (made by
/// [`dev_certs`]), valid from `start` to `end` (openssl's `YYYYMMDDHHMMSSZ`):
/// `openssl ca` sets any dates, past and future, where `openssl x509 -req`
/// sets only a number of days from now. Written as `dir/NAME.pem` and
/// `dir/NAME.key`.
fn dated_certificate(ca: &Path, dir: &Path, name: &str, start: &str, end: &str) {
    let run = |args: &[&str]| {
        common::openssl(dir, args);
    };
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(
        dir.join("ca.cnf"),
        "[ca]\ndefault_ca = dev\n[dev]\ndatabase = index.txt\nnew_certs_dir = .\n\
         serial = serial.txt\ndefault_md = sha256\npolicy = any\ncopy_extensions = copy\n\
         [any]\ncommonName = supplied\n",
    )
    .unwrap();
    std::fs::write(dir.join("index.txt"), "").unwrap();
    std::fs::write(dir.join("serial.txt"), "1000\n").unwrap();
    let key = format!("{name}.key");
    let csr = format!("{name}.csr");
    let ca_pem = ca.join("ca.pem");
    let ca_key = ca.join("ca.key");
    run(&[
        "genpkey",
        "-algorithm",
        "EC",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-out",
        &key,
    ]);
    run(&[
        "req",
        "-new",
        "-key",
        &key,
        "-subj",
        "/CN=localhost",
        "-addext",
        "subjectAltName=DNS:localhost,IP:127.0.0.1,IP:::1",
        "-out",
        &csr,
    ]);
    run(&[
        "ca",
        "-batch",
        "-notext",
        "-config",
        "ca.cnf",
        "-cert",
        ca_pem.to_str().unwrap(),
        "-keyfile",
        ca_key.to_str().unwrap(),
        "-startdate",
        start,
        "-enddate",
        end,
        "-in",
        &csr,
        "-out",
        &format!("{name}.pem"),
    ]);
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// rustls does not look at the served certificate's dates; the broker
/// does. Its chain's earliest notAfter is a metric (the one the shipped
/// alerts watch), and a chain out of date is served all the same (so that
/// a late renewal does not stop clients that do not check) but logged as
/// a warning: at start-up, on a reload and when the file watcher loads it.
#[test]
fn the_certificates_expiry_is_a_metric_and_one_out_of_date_is_served_with_a_warning() {
    const EXPIRY: &str = "mcp_tls_certificate_expiry_timestamp_seconds";
    const NOT_BEFORE: &str = "mcp_tls_certificate_not_before_timestamp_seconds";
    let dir = Dir::new("dates");
    let live = dir.path("live");
    dev_certs(&live);
    let ca = live.clone();
    let dated = dir.path("dated");
    // Expired on 2020-01-02, and valid from 2099-12-31 on.
    dated_certificate(&ca, &dated, "expired", "20200101000000Z", "20200102000000Z");
    dated_certificate(&ca, &dated, "future", "20991231000000Z", "21000101000000Z");
    let (b, log) = Broker::start_logged(&tls_toml(&live, "watch_interval = \"1s\""), &[]);

    // scripts/dev-certs makes a certificate valid for 30 days from now.
    let thirty_days = unix_now() + 30.0 * 86400.0;
    let from = b.metric_sum(NOT_BEFORE);
    assert!(
        from > 0.0 && from <= unix_now() + 1.0,
        "{NOT_BEFORE} {from}: valid from now"
    );
    let valid = b.metric_sum(EXPIRY);
    assert!(
        (valid - thirty_days).abs() < 3600.0,
        "{EXPIRY} {valid}, 30 days from now is {thirty_days}"
    );
    assert!(
        !log.text().contains("the TLS certificate is"),
        "{}",
        log.text()
    );

    let install = |name: &str| {
        for (from, to) in [("key", "server.key"), ("pem", "server.pem")] {
            let tmp = live.join(format!("{to}.tmp"));
            std::fs::copy(dated.join(format!("{name}.{from}")), &tmp).unwrap();
            std::fs::rename(&tmp, live.join(to)).unwrap();
        }
    };
    let reload =
        || common::http::Conn::connect(b.metrics).request("POST", "/admin/reload", &[], b"");

    // Expired, by a reload: applied, served, logged, and the metric in the past.
    install("expired");
    let applied = reload();
    assert_eq!(applied.status, 200, "{}", applied.text());
    assert_eq!(
        b.metric_sum(EXPIRY),
        1_577_923_200.0,
        "2020-01-02T00:00:00Z"
    );
    assert!(
        log.shows(
            "the TLS certificate is expired at 2020-01-02T00:00:00Z",
            Duration::from_secs(5)
        ),
        "{}",
        log.text()
    );
    let err = frames_client(b.frames, &client_config(&ca.join("ca.pem"), None, &[]))
        .err()
        .map(|e| e.to_string());
    assert!(
        err.as_deref()
            .is_some_and(|e| e.contains("certificate expired")),
        "a client that checks dates refuses the certificate the broker serves: {err:?}"
    );

    // Not yet valid, by the file watcher alone.
    install("future");
    assert!(
        common::http::eventually(Duration::from_secs(15), || {
            b.metric_sum(EXPIRY) == 4_102_444_800.0
        }),
        "the watcher loads the next files: {EXPIRY} {}",
        b.metric_sum(EXPIRY)
    );
    assert_eq!(
        b.metric_sum(NOT_BEFORE),
        4_102_358_400.0,
        "2099-12-31T00:00:00Z"
    );
    assert!(
        log.shows(
            "the TLS certificate is not valid until 2099-12-31T00:00:00Z",
            Duration::from_secs(5)
        ),
        "{}",
        log.text()
    );

    // A chain: the leaf above with an authority that runs out sooner (30
    // days). The chain is out of date when its first certificate is.
    let chain = format!(
        "{}{}",
        std::fs::read_to_string(dated.join("future.pem")).unwrap(),
        std::fs::read_to_string(ca.join("ca.pem")).unwrap()
    );
    std::fs::write(live.join("server.pem.tmp"), chain).unwrap();
    std::fs::rename(live.join("server.pem.tmp"), live.join("server.pem")).unwrap();
    let applied = reload();
    assert_eq!(applied.status, 200, "{}", applied.text());
    let earliest = b.metric_sum(EXPIRY);
    assert!(
        (earliest - thirty_days).abs() < 3600.0,
        "the authority's notAfter: {EXPIRY} {earliest}"
    );

    // At start-up: an expired certificate starts the broker, with the warning.
    install("expired");
    let (started, start_log) = Broker::start_logged(&tls_toml(&live, ""), &[]);
    assert_eq!(started.metric_sum(EXPIRY), 1_577_923_200.0);
    assert!(
        start_log.shows("the TLS certificate is expired at", Duration::from_secs(5)),
        "{}",
        start_log.text()
    );
}
