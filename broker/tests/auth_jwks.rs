//! `[auth] jwks_url`: the issuer's JWK Set fetched over HTTP, against the
//! real binary.
//!
//! The JWK Set is served by a minimal HTTP/1.1 responder on 127.0.0.1
//! (plain `http://` is allowed to loopback hosts only), which counts the
//! fetches: start-up fetches once, a token naming an unknown key kicks one
//! refresh on the `auth-keys` thread (the request itself is refused, never
//! waits), and a burst of such tokens costs one fetch, not one per token.
//! The keys are made by `openssl` per run (`common::jwt`).

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::Broker;
use common::http::{Conn, eventually};
use common::jwt::{RsaKey, jwk, now, rsa_key};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{Value, json};

const ISSUER: &str = "https://issuer.test";
const AUDIENCE: &str = "https://mcp.test/mcp";

/// The test's keys, removed when it ends (passed or not).
fn temp_dir(test: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("mcp-auth-jwks-{test}-"))
        .tempdir()
        .expect("a scratch directory")
}

/// A JWK Set served on 127.0.0.1 by a thread: `GET /jwks.json` answers the
/// current body (200, `Connection: close`), anything else 404. Counts the
/// fetches of /jwks.json.
struct JwksServer {
    addr: SocketAddr,
    body: Arc<Mutex<String>>,
    fetches: Arc<AtomicUsize>,
}

impl JwksServer {
    fn start(body: &Value) -> JwksServer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let body = Arc::new(Mutex::new(body.to_string()));
        let fetches = Arc::new(AtomicUsize::new(0));
        let (b, f) = (body.clone(), fetches.clone());
        // Lives as long as the test process: a blocked accept costs nothing.
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut request_line = String::new();
                if reader.read_line(&mut request_line).is_err() {
                    continue;
                }
                // The rest of the head (a GET has no body).
                loop {
                    let mut line = String::new();
                    match reader.read_line(&mut line) {
                        Ok(0) | Err(_) => break,
                        Ok(_) if line == "\r\n" || line == "\n" => break,
                        Ok(_) => {}
                    }
                }
                let path = request_line.split_whitespace().nth(1).unwrap_or_default();
                let (status, text) = if request_line.starts_with("GET ") && path == "/jwks.json" {
                    f.fetch_add(1, Ordering::SeqCst);
                    ("200 OK", b.lock().unwrap().clone())
                } else {
                    ("404 Not Found", String::new())
                };
                let _ = stream.write_all(
                    format!(
                        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
                        text.len()
                    )
                    .as_bytes(),
                );
            }
        });
        JwksServer {
            addr,
            body,
            fetches,
        }
    }

    fn url(&self) -> String {
        format!("http://{}/jwks.json", self.addr)
    }

    fn serve(&self, body: &Value) {
        *self.body.lock().unwrap() = body.to_string();
    }

    fn fetches(&self) -> usize {
        self.fetches.load(Ordering::SeqCst)
    }
}

/// The embedded default with `[auth]` taking its keys from `url`.
fn config(url: &str) -> String {
    format!(
        r#"{}

[auth]
issuer = "{ISSUER}"
audience = "{AUDIENCE}"
jwks_url = "{url}"
scopes = ["mcp"]
"#,
        mcp_broker::config::DEFAULT_TOML
    )
}

fn token(kid: &str, key: &RsaKey) -> String {
    let mut h = Header::new(Algorithm::RS256);
    h.kid = Some(kid.into());
    let claims = json!({
        "iss": ISSUER, "aud": AUDIENCE, "sub": "alice", "scope": "mcp",
        "exp": now() + 300, "nbf": now() - 10, "iat": now(),
    });
    let k = EncodingKey::from_rsa_pem(&key.private_pem).unwrap();
    common::jwt::encode(&h, &claims, &k)
}

/// The status of an `initialize` POSTed with `token`.
fn initialize(b: &Broker, token: &str) -> u16 {
    let mut c = Conn::connect(b.http);
    let auth = format!("Bearer {token}");
    c.request(
        "POST",
        "/mcp",
        &[
            ("Content-Type", "application/json"),
            ("Accept", "application/json, text/event-stream"),
            ("MCP-Protocol-Version", "2025-06-18"),
            ("Authorization", &auth),
        ],
        br#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#,
    )
    .status
}

#[test]
fn keys_are_fetched_at_start_up_and_a_rotated_key_is_found_after_a_kick() {
    let scratch = temp_dir("rotate");
    let dir = scratch.path();
    let k1 = rsa_key(dir, "k1");
    let k2 = rsa_key(dir, "k2");
    let server = JwksServer::start(&json!({"keys": [jwk("k1", &k1)]}));
    let b = Broker::start_with_config(&config(&server.url()), &[]);
    assert_eq!(server.fetches(), 1, "fetched once at start-up");
    assert_eq!(initialize(&b, &token("k1", &k1)), 200);

    // The issuer rotates: k2 appears in its set. The first token signed
    // with it is refused (the request never waits for a fetch) and kicks a
    // refresh; the same token passes once the new set is stored.
    server.serve(&json!({"keys": [jwk("k1", &k1), jwk("k2", &k2)]}));
    let t2 = token("k2", &k2);
    assert_eq!(initialize(&b, &t2), 401, "unknown until fetched again");
    assert!(
        eventually(Duration::from_secs(15), || initialize(&b, &t2) == 200),
        "k2 accepted after the kick's refresh"
    );
    assert_eq!(server.fetches(), 2, "one fetch for the kick");
    assert_eq!(initialize(&b, &token("k1", &k1)), 200, "k1 still held");
}

#[test]
fn a_burst_of_unknown_keys_costs_one_fetch() {
    let scratch = temp_dir("burst");
    let dir = scratch.path();
    let k1 = rsa_key(dir, "k1");
    let stranger = rsa_key(dir, "stranger");
    let server = JwksServer::start(&json!({"keys": [jwk("k1", &k1)]}));
    let b = Broker::start_with_config(&config(&server.url()), &[]);
    assert_eq!(server.fetches(), 1);
    for i in 0..20 {
        let t = token(&format!("unknown-{i}"), &stranger);
        assert_eq!(initialize(&b, &t), 401, "unknown-{i}");
    }
    // The first kick after start-up is served at once; the others fall in
    // the 30 s refresh gap and coalesce into (at most) one fetch at its end.
    assert!(
        eventually(Duration::from_secs(10), || server.fetches() >= 2),
        "the first kick fetches"
    );
    std::thread::sleep(Duration::from_secs(2));
    let n = server.fetches();
    assert!(
        (2..=3).contains(&n),
        "20 unknown keys: {} fetches after start-up",
        n - 1
    );
    // Serving goes on with the keys held.
    assert_eq!(initialize(&b, &token("k1", &k1)), 200);
}

#[test]
fn the_broker_does_not_start_without_its_keys() {
    // A port nothing listens on: connection refused.
    let dead = common::DeadPort::any();
    let url = format!("http://127.0.0.1:{}/jwks.json", dead.port);
    let stderr = common::fails_to_start(&config(&url));
    assert!(
        stderr.contains(&url) && stderr.contains("auth.jwks_url"),
        "{stderr}"
    );

    // A server that answers, but not 200.
    let server = JwksServer::start(&json!({"keys": []}));
    let url = format!("http://{}/elsewhere.json", server.addr);
    let stderr = common::fails_to_start(&config(&url));
    assert!(stderr.contains(&url) && stderr.contains("404"), "{stderr}");
}

#[test]
fn plain_http_to_a_remote_host_is_a_config_error() {
    let stderr = common::fails_to_start(&config("http://issuer.test/jwks.json"));
    assert!(
        stderr.contains("auth.jwks_url") && stderr.contains("loopback"),
        "{stderr}"
    );
}

/// The JWK Set is fetched before any listener is bound: while the fetch
/// waits, the broker's ports refuse connections, rather than accepting
/// ones that the failure then resets.
#[test]
fn no_port_listens_while_the_keys_are_fetched() {
    // A JWK Set server that accepts, holds the fetch for 2 s, then closes.
    let jwks = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/jwks.json", jwks.local_addr().unwrap());
    let (fetching, fetched) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        if let Ok((conn, _)) = jwks.accept() {
            let _ = fetching.send(());
            std::thread::sleep(Duration::from_secs(2));
            drop(conn);
        }
    });
    let port = common::DeadPort::any();
    let frames = format!("127.0.0.1:{}", port.port);
    let broker = {
        let (toml, frames) = (config(&url), frames.clone());
        std::thread::spawn(move || {
            let any = "127.0.0.1:0";
            common::fails_to_start_with(
                &toml,
                &[
                    "--listen",
                    &frames,
                    "--grpc-listen",
                    any,
                    "--http-listen",
                    any,
                    "--metrics-listen",
                    any,
                ],
            )
        })
    };
    fetched
        .recv_timeout(Duration::from_secs(60))
        .expect("the broker fetches its keys");
    let refused = std::net::TcpStream::connect(&frames).unwrap_err();
    assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused);
    let stderr = broker.join().unwrap();
    assert!(stderr.contains("auth.jwks_url"), "{stderr}");
}

/// Each failed refresh is a WARN line; the refresh that ends the run of
/// failures says so at INFO (it was DEBUG only, so a log showed the
/// failures and never the recovery).
#[test]
fn a_refresh_that_succeeds_after_failures_is_logged() {
    let scratch = temp_dir("recover");
    let dir = scratch.path();
    let k1 = rsa_key(dir, "k1");
    let server = JwksServer::start(&json!({"keys": [jwk("k1", &k1)]}));
    let cfg = format!("{}jwks_refresh_interval = \"1s\"\n", config(&server.url()));
    let (b, log) = Broker::start_logged(&cfg, &[]);
    server.serve(&json!("not a key set"));
    assert!(
        eventually(Duration::from_secs(10), || log
            .text()
            .contains("refreshing the JWK Set failed")),
        "{}",
        log.text()
    );
    server.serve(&json!({"keys": [jwk("k1", &k1)]}));
    assert!(
        eventually(Duration::from_secs(10), || log
            .text()
            .lines()
            .any(|l| l.contains("INFO")
                && l.contains("JWK Set refreshed again")
                && l.contains("failures="))),
        "{}",
        log.text()
    );
    assert_eq!(initialize(&b, &token("k1", &k1)), 200);
}
