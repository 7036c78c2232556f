//! `[auth]`: bearer JWTs on every edge, against the real binary.
//!
//! The keys are made by `openssl` in a temporary directory for each test
//! run (nothing is checked in); the tokens are signed here with the
//! `jsonwebtoken` crate, and the bad ones are built by hand where a signer
//! would refuse to make them (`alg: none`, HS256 over the RSA public key).
//! Every entry of the bad-token catalogue of `docs/security.md` gets its
//! documented outcome on the HTTP, gRPC and frame edges (frames: the token in
//! `InitializeRequest`; before a valid one only initialize and ping are
//! answered). `mcp-loadgen --bearer-file` is checked on all three.

mod common;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::Broker;
use common::http::Conn;
use common::jwt::{RsaKey, b64, now, rsa_key};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{Value, json};

const ISSUER: &str = "https://issuer.test";
const AUDIENCE: &str = "https://mcp.test/mcp";
const METADATA_URL: &str = "https://mcp.test/.well-known/oauth-protected-resource/mcp";

/// A test's keys, JWK Set file and broker.
struct Fixture {
    /// The broker's stderr (debug level).
    log: PathBuf,
    dir: PathBuf,
    trusted: RsaKey,
    /// Not in the JWK Set.
    stranger: RsaKey,
    b: Broker,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Fixture {
    fn start(test: &str) -> Fixture {
        let dir = std::env::temp_dir().join(format!("mcp-auth-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let trusted = rsa_key(&dir, "trusted");
        let stranger = rsa_key(&dir, "stranger");
        let jwks = json!({"keys": [common::jwt::jwk("k1", &trusted)]});
        let jwks_path = dir.join("jwks.json");
        std::fs::write(&jwks_path, jwks.to_string()).unwrap();
        let toml = format!(
            r#"{}

[auth]
issuer = "{ISSUER}"
audience = "{AUDIENCE}"
jwks_file = "{}"
scopes = ["mcp"]
leeway = "5s"

[[auth.rules]]
tools = ["put"]
scopes = ["kv:write"]
"#,
            mcp_broker::config::DEFAULT_TOML,
            jwks_path.display()
        );
        // Debug logs, kept in a file: no test may find a token in them.
        let log = dir.join("broker.log");
        let file = std::fs::File::create(&log).unwrap();
        let b = Broker::start_command(Some(&toml), &[], |c| {
            c.env("RUST_LOG", "debug,cranelift=info,wasmtime=info")
                .stderr(file);
        });
        Fixture {
            log,
            dir,
            trusted,
            stranger,
            b,
        }
    }

    fn sign(&self, claims: &Value) -> String {
        let mut h = Header::new(Algorithm::RS256);
        h.kid = Some("k1".into());
        let k = EncodingKey::from_rsa_pem(&self.trusted.private_pem).unwrap();
        common::jwt::encode(&h, claims, &k)
    }

    /// A valid token for `sub` with `scope`.
    fn token(&self, sub: &str, scope: &str) -> String {
        self.sign(&claims(sub, scope))
    }
}

fn claims(sub: &str, scope: &str) -> Value {
    json!({
        "iss": ISSUER, "aud": AUDIENCE, "sub": sub, "scope": scope,
        "exp": now() + 300, "nbf": now() - 10, "iat": now(),
    })
}

/// The bad-token catalogue: name, Authorization header value (None: no
/// header), and the failure reason `mcp_auth_failures_total` counts.
fn catalogue(f: &Fixture) -> Vec<(&'static str, Option<String>, &'static str)> {
    let good = claims("alice", "mcp");
    let with = |k: &str, v: Value| {
        let mut c = good.clone();
        c[k] = v;
        format!("Bearer {}", f.sign(&c))
    };
    let without = |k: &str| {
        let mut c = good.clone();
        c.as_object_mut().unwrap().remove(k);
        format!("Bearer {}", f.sign(&c))
    };
    let header = |h: Value| b64(h.to_string().as_bytes());
    let body = b64(good.to_string().as_bytes());
    // alg none: no signature at all.
    let none = format!(
        "Bearer {}.{body}.",
        header(json!({"alg":"none","typ":"JWT","kid":"k1"}))
    );
    // HS256 keyed with the RSA public key (the classic confusion attack).
    let hs = {
        let mut h = Header::new(Algorithm::HS256);
        h.kid = Some("k1".into());
        let k = EncodingKey::from_secret(&f.trusted.public_pem).unwrap();
        format!("Bearer {}", common::jwt::encode(&h, &good, &k))
    };
    let tampered = {
        let t = f.sign(&good);
        let (rest, sig) = t.rsplit_once('.').unwrap();
        let mut sig = sig.as_bytes().to_vec();
        sig[10] = if sig[10] == b'A' { b'B' } else { b'A' };
        format!("Bearer {rest}.{}", String::from_utf8(sig).unwrap())
    };
    let unknown_kid = {
        let mut h = Header::new(Algorithm::RS256);
        h.kid = Some("k-unknown".into());
        let k = EncodingKey::from_rsa_pem(&f.stranger.private_pem).unwrap();
        format!("Bearer {}", common::jwt::encode(&h, &good, &k))
    };
    let wrong_signer = {
        // The trusted kid, signed by another key.
        let mut h = Header::new(Algorithm::RS256);
        h.kid = Some("k1".into());
        let k = EncodingKey::from_rsa_pem(&f.stranger.private_pem).unwrap();
        format!("Bearer {}", common::jwt::encode(&h, &good, &k))
    };
    vec![
        ("missing", None, "missing"),
        ("not a JWT", Some("Bearer not-a-jwt".into()), "malformed"),
        // RFC 9068 requires `sub`; sessions are bound to it.
        ("no subject", Some(without("sub")), "malformed"),
        ("empty subject", Some(with("sub", json!(""))), "malformed"),
        ("numeric subject", Some(with("sub", json!(7))), "malformed"),
        ("alg none", Some(none), "algorithm"),
        ("HS256 with the RSA public key", Some(hs), "algorithm"),
        ("tampered signature", Some(tampered), "signature"),
        ("signed by another key", Some(wrong_signer), "signature"),
        ("unknown kid", Some(unknown_kid), "unknown_key"),
        ("expired", Some(with("exp", json!(now() - 600))), "expired"),
        (
            "not yet valid",
            Some(with("nbf", json!(now() + 600))),
            "not_yet_valid",
        ),
        (
            "wrong issuer",
            Some(with("iss", json!("https://evil.test"))),
            "issuer",
        ),
        // RFC 7519: one StringOrURI, not an array holding the issuer.
        (
            "issuer in an array",
            Some(with("iss", json!([ISSUER]))),
            "issuer",
        ),
        (
            "wrong audience",
            Some(with("aud", json!("https://other.test/mcp"))),
            "audience",
        ),
        (
            "without the scope every request needs",
            Some(with("scope", json!("other"))),
            "insufficient_scope",
        ),
    ]
}

fn initialize_body() -> &'static str {
    r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#
}

/// POSTs `body` to /mcp with `auth` (and `session`).
fn post(b: &Broker, auth: Option<&str>, session: Option<&str>, body: &str) -> common::http::Reply {
    let mut c = Conn::connect(b.http);
    let mut headers = vec![
        ("Content-Type", "application/json"),
        ("Accept", "application/json, text/event-stream"),
        ("MCP-Protocol-Version", "2025-06-18"),
    ];
    if let Some(a) = auth {
        headers.push(("Authorization", a));
    }
    if let Some(s) = session {
        headers.push(("Mcp-Session-Id", s));
    }
    c.request("POST", "/mcp", &headers, body.as_bytes())
}

/// An initialized session for `token`.
fn session(b: &Broker, token: &str) -> String {
    let auth = format!("Bearer {token}");
    let r = post(b, Some(&auth), None, initialize_body());
    assert_eq!(r.status, 200, "{}", r.text());
    r.header("mcp-session-id")
        .expect("a session id")
        .to_string()
}

fn call(b: &Broker, token: &str, session: &str, tool: &str, args: &str) -> common::http::Reply {
    let auth = format!("Bearer {token}");
    post(
        b,
        Some(&auth),
        Some(session),
        &format!(
            r#"{{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{{"name":"{tool}","arguments":{args}}}}}"#
        ),
    )
}

#[test]
fn every_bad_token_gets_its_documented_answer_on_http_and_is_counted() {
    let mut f = Fixture::start("http");
    let b = &f.b;
    let mut expected: std::collections::HashMap<&str, f64> = Default::default();
    for (name, auth, reason) in catalogue(&f) {
        let r = post(b, auth.as_deref(), None, initialize_body());
        let challenge = r.header("www-authenticate").unwrap_or_default().to_string();
        assert!(
            challenge.starts_with("Bearer ")
                && challenge.contains(&format!("resource_metadata=\"{METADATA_URL}\"")),
            "{name}: WWW-Authenticate {challenge:?}"
        );
        if reason == "insufficient_scope" {
            assert_eq!(r.status, 403, "{name}: {}", r.text());
            assert!(
                challenge.contains("error=\"insufficient_scope\""),
                "{name}: {challenge}"
            );
            assert!(challenge.contains("scope=\"mcp\""), "{name}: {challenge}");
        } else {
            assert_eq!(r.status, 401, "{name}: {}", r.text());
            if reason == "missing" {
                assert!(
                    !challenge.contains("error="),
                    "{name}: no token, no error: {challenge}"
                );
            } else {
                assert!(
                    challenge.contains("error=\"invalid_token\""),
                    "{name}: {challenge}"
                );
            }
        }
        let v = r.json();
        assert_eq!(v["error"]["code"], -32003, "{name}: {v}");
        // The body's reason is in the challenge too (RFC 6750's
        // error_description), for clients that show only the challenge.
        // (The scope refusal's body names the scopes; the challenge has
        // them in `scope`.)
        let message = match reason {
            "insufficient_scope" => "insufficient scope",
            _ => v["error"]["message"].as_str().unwrap(),
        };
        assert_eq!(
            challenge.contains(&format!("error_description=\"{message}\"")),
            reason != "missing",
            "{name}: {challenge}"
        );
        assert!(
            r.header("mcp-session-id").is_none(),
            "{name}: no session for a refused token"
        );
        *expected.entry(reason).or_default() += 1.0;
    }
    let metrics = b.http_get("/metrics").1;
    for (reason, n) in expected {
        let line = format!("mcp_auth_failures_total{{reason=\"{reason}\"}} ");
        let got: f64 = metrics
            .lines()
            .find_map(|l| l.strip_prefix(&line))
            .unwrap_or_else(|| panic!("no {line} in /metrics"))
            .parse()
            .unwrap();
        assert_eq!(got, n, "{reason}");
    }
    // Neither a presented token nor any signature appears in the logs. The
    // log is read once the broker has drained and exited: every line is
    // written by then, the drain's own DEBUG lines (`shard drained`)
    // included. Read while it ran, the check that debug logging was on
    // raced the events that log at DEBUG, and failed once under a loaded
    // full suite.
    assert!(f.b.terminate(Duration::from_secs(30)).success());
    let log = std::fs::read_to_string(&f.log).unwrap();
    assert!(log.contains("DEBUG"), "debug logging was on");
    for (name, auth, _) in catalogue(&f) {
        let Some(auth) = auth else { continue };
        let token = auth.trim_start_matches("Bearer ");
        let sig = token.rsplit('.').next().unwrap_or(token);
        if sig.len() > 8 {
            assert!(
                !log.contains(sig),
                "{name}: a token's signature is in the log"
            );
        }
        assert!(!log.contains(token), "{name}: the token is in the log");
    }
}

#[test]
fn a_valid_token_is_served_and_tool_rules_and_sessions_follow_it() {
    let f = Fixture::start("ok");
    let b = &f.b;
    let alice = f.token("alice", "mcp");
    let s = session(b, &alice);
    let r = call(b, &alice, &s, "echo_text", r#"{"text":"hi"}"#);
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.text().contains("hi"), "{}", r.text());

    // Listings show only what the token may call: `put` needs kv:write.
    let listed = |token: &str, body: &str| -> Vec<String> {
        let r = post(b, Some(&format!("Bearer {token}")), Some(&s), body);
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()["result"]["tools"]
            .as_array()
            .expect("a tools/list answer")
            .iter()
            .map(|t| t["name"].as_str().unwrap().to_string())
            .collect()
    };
    let list = r#"{"jsonrpc":"2.0","id":3,"method":"tools/list"}"#;
    let names = listed(&alice, list);
    assert!(
        names.iter().any(|n| n == "get") && !names.iter().any(|n| n == "put"),
        "{names:?}"
    );
    {
        // Batches (protocol 2025-03-26 only) hide it too.
        let auth = format!("Bearer {alice}");
        let init = initialize_body().replace("2025-06-18", "2025-03-26");
        let r = post(b, Some(&auth), None, &init);
        let old = r.header("mcp-session-id").unwrap().to_string();
        let mut c = Conn::connect(b.http);
        let r = c.request(
            "POST",
            "/mcp",
            &[
                ("Content-Type", "application/json"),
                ("Accept", "application/json, text/event-stream"),
                ("MCP-Protocol-Version", "2025-03-26"),
                ("Authorization", &auth),
                ("Mcp-Session-Id", &old),
            ],
            format!("[{list}]").as_bytes(),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        let v = r.json();
        let tools = v[0]["result"]["tools"].as_array().expect("a batch answer");
        assert!(
            tools.iter().any(|t| t["name"] == "get") && !tools.iter().any(|t| t["name"] == "put"),
            "{v}"
        );
    }
    let names = listed(&f.token("alice", "mcp kv:write"), list);
    assert!(names.iter().any(|n| n == "put"), "{names:?}");

    // Calling it anyway: 403 naming the scope.
    let r = call(b, &alice, &s, "put", r#"{"key":"k","value":1}"#);
    assert_eq!(r.status, 403, "{}", r.text());
    let challenge = r.header("www-authenticate").unwrap();
    assert!(
        challenge.contains("error=\"insufficient_scope\""),
        "{challenge}"
    );
    assert!(challenge.contains("scope=\"kv:write\""), "{challenge}");
    let writer = f.token("alice", "mcp kv:write");
    let r = call(b, &writer, &s, "put", r#"{"key":"k","value":1}"#);
    assert_eq!(r.status, 200, "{}", r.text());

    // Bob's valid token on Alice's session: as if it did not exist.
    let bob = f.token("bob", "mcp");
    let r = call(b, &bob, &s, "echo_text", r#"{"text":"hi"}"#);
    assert_eq!(
        r.status,
        404,
        "another subject's session is unknown: {}",
        r.text()
    );

    // Alice's verified signature (and so the tail the broker's cache of
    // verified tokens is keyed by) on claims of the same length naming
    // another subject: refused, not found in the cache.
    let forged = {
        use base64::Engine as _;
        let mut parts = writer.split('.');
        let (head, body, sig) = (
            parts.next().unwrap(),
            parts.next().unwrap(),
            parts.next().unwrap(),
        );
        let mut c: Value = serde_json::from_slice(
            &base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(body)
                .unwrap(),
        )
        .unwrap();
        c["sub"] = json!("mallo");
        let forged = format!("{head}.{}.{sig}", b64(c.to_string().as_bytes()));
        assert_eq!(
            forged.len(),
            writer.len(),
            "same length as the verified token"
        );
        forged
    };
    let r = call(b, &forged, &s, "echo_text", r#"{"text":"hi"}"#);
    assert_eq!(r.status, 401, "a forged payload: {}", r.text());
}

#[test]
fn protected_resource_metadata_is_public_and_names_the_issuer() {
    let f = Fixture::start("meta");
    for path in [
        "/.well-known/oauth-protected-resource",
        "/.well-known/oauth-protected-resource/mcp",
    ] {
        let mut c = Conn::connect(f.b.http);
        let r = c.request("GET", path, &[("Connection", "close")], b"");
        assert_eq!(r.status, 200, "{path}: {}", r.text());
        let v = r.json();
        assert_eq!(v["resource"], AUDIENCE, "{v}");
        assert_eq!(v["authorization_servers"], json!([ISSUER]), "{v}");
        assert_eq!(v["bearer_methods_supported"], json!(["header"]), "{v}");
        let scopes = v["scopes_supported"].as_array().unwrap();
        assert!(
            scopes.contains(&json!("kv:write")) && scopes.contains(&json!("mcp")),
            "{v}"
        );
        // The `library` router's describe-server names its scope.
        assert!(scopes.contains(&json!("library:read")), "{v}");
    }
}

/// `m` with `authorization: Bearer <token>` metadata when `token` is set.
/// A current-thread runtime and a gRPC client of `f`'s broker on it.
fn grpc_client(
    f: &Fixture,
) -> (
    tokio::runtime::Runtime,
    mcp_proto::v1::mcp_service_client::McpServiceClient<tonic::transport::Channel>,
) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let ch = rt.block_on(async {
        tonic::transport::Channel::from_shared(format!("http://{}", f.b.grpc))
            .unwrap()
            .connect()
            .await
            .unwrap()
    });
    (
        rt,
        mcp_proto::v1::mcp_service_client::McpServiceClient::new(ch),
    )
}

fn with<T>(token: Option<&str>, m: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(m);
    if let Some(t) = token {
        r.metadata_mut()
            .insert("authorization", format!("Bearer {t}").parse().unwrap());
    }
    r
}

/// A second `Authorization` header is refused as malformed on HTTP and
/// gRPC, whichever comes first: a proxy that reads the other one would
/// judge another credential than the broker.
#[test]
fn two_authorization_headers_are_refused() {
    use mcp_proto::v1 as pb;
    let f = Fixture::start("two-headers");
    let good = format!("Bearer {}", f.token("alice", "mcp"));
    for pair in [
        [good.as_str(), "Bearer junk"],
        ["Bearer junk", good.as_str()],
    ] {
        let mut c = Conn::connect(f.b.http);
        let r = c.request(
            "POST",
            "/mcp",
            &[
                ("Content-Type", "application/json"),
                ("Accept", "application/json, text/event-stream"),
                ("Authorization", pair[0]),
                ("Authorization", pair[1]),
            ],
            initialize_body().as_bytes(),
        );
        assert_eq!(r.status, 401, "{pair:?}: {}", r.text());
    }
    let (rt, mut g) = grpc_client(&f);
    rt.block_on(async {
        let mut r = with(
            Some(&f.token("alice", "mcp")),
            pb::ListToolsRequest::default(),
        );
        r.metadata_mut()
            .append("authorization", "Bearer junk".parse().unwrap());
        let e = g.list_tools(r).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e:?}");
        let ok = with(
            Some(&f.token("alice", "mcp")),
            pb::ListToolsRequest::default(),
        );
        g.list_tools(ok).await.expect("one header is served");
    });
}

#[test]
fn grpc_needs_a_token_and_the_scopes_of_each_tool() {
    use mcp_proto::v1 as pb;
    let f = Fixture::start("grpc");
    let (rt, mut g) = grpc_client(&f);
    rt.block_on(async {
        let e = g
            .list_tools(with(None, pb::ListToolsRequest::default()))
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e:?}");
        // Like every error status, with the wire code.
        assert_eq!(e.metadata().get("mcp-error-code").unwrap(), "-32003");
        // The client-capability RPCs the broker does not serve say so only
        // to an authenticated caller.
        let e = g
            .elicit(with(None, pb::ElicitRequest::default()))
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e:?}");
        let e = g
            .create_sampling_message(with(None, pb::CreateSamplingMessageRequest::default()))
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e:?}");
        for (name, auth, reason) in catalogue(&f) {
            let token = auth.as_deref().map(|a| a.trim_start_matches("Bearer "));
            let e = g
                .list_tools(with(token, pb::ListToolsRequest::default()))
                .await
                .unwrap_err();
            let code = if reason == "insufficient_scope" {
                tonic::Code::PermissionDenied
            } else {
                tonic::Code::Unauthenticated
            };
            assert_eq!(e.code(), code, "{name}: {e:?}");
            assert_eq!(
                e.metadata().get("mcp-error-code").unwrap(),
                "-32003",
                "{name}"
            );
        }
        let alice = f.token("alice", "mcp");
        let tools = g
            .list_tools(with(Some(&alice), pb::ListToolsRequest::default()))
            .await
            .expect("a valid token lists")
            .into_inner();
        // A caller sees only the tools its scopes let it call.
        assert!(tools.tools.iter().any(|t| t.name == "get"), "{tools:?}");
        assert!(!tools.tools.iter().any(|t| t.name == "put"), "{tools:?}");
        let put = |t: &str| {
            with(
                Some(t),
                pb::CallToolRequest {
                    name: "put".into(),
                    arguments: Some(br#"{"key":"k","value":1}"#.to_vec()),
                },
            )
        };
        let e = g.call_tool(put(&alice)).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
        assert!(e.message().contains("kv:write"), "{e:?}");
        let writer = f.token("alice", "mcp kv:write");
        let tools = g
            .list_tools(with(Some(&writer), pb::ListToolsRequest::default()))
            .await
            .unwrap()
            .into_inner();
        assert!(tools.tools.iter().any(|t| t.name == "put"), "{tools:?}");
        g.call_tool(put(&writer)).await.expect("with kv:write");

        // A session is bound to the subject that initialized it: Bob's
        // valid token on Alice's session id (same connection) is refused
        // as an unknown session.
        let init = g
            .initialize(with(
                Some(&alice),
                pb::InitializeRequest {
                    protocol_version: "2025-06-18".into(),
                    capabilities: Some(pb::ClientCapabilities::default()),
                    client_info: None,
                },
            ))
            .await
            .expect("initialize with a valid token");
        let session = init
            .metadata()
            .get(mcp_proto::SESSION_METADATA_KEY)
            .expect("a session id")
            .to_str()
            .unwrap()
            .to_owned();
        let in_session = |token: &str| {
            let mut r = with(Some(token), pb::ListToolsRequest::default());
            r.metadata_mut()
                .insert(mcp_proto::SESSION_METADATA_KEY, session.parse().unwrap());
            r
        };
        g.list_tools(in_session(&alice))
            .await
            .expect("Alice in her session");
        let bob = f.token("bob", "mcp");
        let e = g.list_tools(in_session(&bob)).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");
    });
}

/// Frames: the token rides in the connection's `InitializeRequest`; before
/// a valid one only initialize and ping are answered.
#[test]
fn the_frame_edge_takes_the_token_in_initialize() {
    use mcp_schema::fb::protocol::ProtocolVersion;
    let f = Fixture::start("frames");
    let init = |c: &mut common::Client, token: Option<&str>| {
        c.request(None, |e, h| {
            e.initialize_with_token(h, ProtocolVersion::V2025_06_18, "t", "1", token)
                .to_vec()
        })
    };
    let mut c = f.b.connect();
    let r = c.call("echo_text", &[("text", "\"hi\"")], None);
    assert_eq!(common::error_code(&r), Some(-32003), "before initialize");
    let pong = c.request(None, |e, h| e.ping(h).to_vec());
    assert_eq!(common::error_code(&pong), None, "ping is answered");
    for (name, auth, _) in catalogue(&f) {
        let token = auth.as_deref().map(|a| a.trim_start_matches("Bearer "));
        let r = init(&mut c, token);
        assert_eq!(common::error_code(&r), Some(-32003), "{name}");
        let r = c.call("echo_text", &[("text", "\"hi\"")], None);
        assert_eq!(
            common::error_code(&r),
            Some(-32003),
            "{name}: still refused"
        );
    }
    // Told where the token goes on this edge, not of a header it lacks.
    let r = init(&mut c, None);
    let (_, said) = mcp_schema::client::ResponseView::parse(&r)
        .unwrap()
        .error()
        .expect("refused");
    assert!(said.contains("auth_token"), "{said}");
    let r = init(&mut c, Some(&f.token("alice", "mcp")));
    assert_eq!(common::error_code(&r), None, "a valid token");
    let r = c.call("echo_text", &[("text", "\"hi\"")], None);
    assert_eq!(common::tool_text(&r), "hi");
    let r = c.call("put", &[("key", "\"k\""), ("value", "1")], None);
    assert_eq!(common::error_code(&r), Some(-32003), "put needs kv:write");
    // Its listing shows only the tools it may call.
    let listed = |c: &mut common::Client| -> Vec<String> {
        let r = c.request(None, |e, h| {
            e.list(h, mcp_schema::client::Listing::Tools, None).to_vec()
        });
        let v = mcp_schema::client::ResponseView::parse(&r).unwrap();
        let l = v
            .response
            .payload_as_list_tools_result()
            .expect("a tool list");
        l.tools()
            .iter()
            .flatten()
            .map(|t| t.name().to_string())
            .collect()
    };
    let names = listed(&mut c);
    assert!(
        names.iter().any(|n| n == "get") && !names.iter().any(|n| n == "put"),
        "{names:?}"
    );
    // A fractional `exp` (RFC 7519 allows one) lasts as a whole one does:
    // it was read as 0, and every call after initialize was "expired".
    let frac = f.sign(&json!({
        "iss": ISSUER, "aud": AUDIENCE, "sub": "alice", "scope": "mcp",
        "exp": (now() + 300) as f64 + 0.5, "nbf": now() - 10,
    }));
    let mut c = f.b.connect();
    let r = init(&mut c, Some(&frac));
    assert_eq!(common::error_code(&r), None);
    let r = c.call("echo_text", &[("text", "\"hi\"")], None);
    assert_eq!(common::tool_text(&r), "hi", "a fractional exp");
    // A token that expires: the connection stops being served with it,
    // once past `exp` and the leeway (5 s), as the other edges judge it.
    // This one's `exp` passed 3 s ago: inside the leeway it was accepted
    // at initialize and then refused every call.
    let short = f.sign(&json!({
        "iss": ISSUER, "aud": AUDIENCE, "sub": "alice", "scope": "mcp",
        "exp": now() - 3, "nbf": now() - 10,
    }));
    let mut c = f.b.connect();
    let r = init(&mut c, Some(&short));
    assert_eq!(common::error_code(&r), None);
    let r = c.call("echo_text", &[("text", "\"hi\"")], None);
    assert_eq!(common::tool_text(&r), "hi", "within the leeway");
    std::thread::sleep(std::time::Duration::from_millis(3100));
    let r = c.call("echo_text", &[("text", "\"hi\"")], None);
    assert_eq!(common::error_code(&r), Some(-32003), "after exp and leeway");
}

/// With `[auth]` a frame client's session ids are its subject's own: the
/// id of another subject's HTTP session, or the id another subject chose
/// on frames, reaches none of their session state (the `kv` router keeps
/// one instance per session), while the subject's own calls share theirs.
#[test]
fn frame_session_ids_are_the_subjects_own() {
    use mcp_schema::fb::protocol::ProtocolVersion;
    let f = Fixture::start("frames-sessions");
    let connect = |sub: &str| {
        let mut c = f.b.connect();
        let token = f.token(sub, "mcp kv:write");
        let r = c.request(None, |e, h| {
            e.initialize_with_token(h, ProtocolVersion::V2025_06_18, "t", "1", Some(&token))
                .to_vec()
        });
        assert_eq!(common::error_code(&r), None, "{sub}");
        c
    };
    // Alice's HTTP session holds a secret.
    let alice = f.token("alice", "mcp kv:write");
    let s = session(&f.b, &alice);
    let r = call(
        &f.b,
        &alice,
        &s,
        "put",
        r#"{"key":"secret","value":"alice's"}"#,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let sid: &'static str = Box::leak(s.clone().into_boxed_str());
    // Bob names it on frames: an empty session of his own.
    let mut bob = connect("bob");
    let not_found = Some(mcp_schema::ErrorCode::NotFound.code());
    let r = bob.call("get", &[("key", "\"secret\"")], Some(sid));
    assert_eq!(
        common::error_code(&r),
        not_found,
        "Bob read Alice's HTTP session through the frame edge"
    );
    let r = bob.call(
        "put",
        &[("key", "\"secret\""), ("value", "\"bob's\"")],
        Some(sid),
    );
    assert_eq!(common::tool_text(&r), "stored secret");
    let r = call(&f.b, &alice, &s, "get", r#"{"key":"secret"}"#);
    assert!(
        r.text().contains("alice's"),
        "Bob overwrote it: {}",
        r.text()
    );
    // Frame to frame: the same chosen id, two subjects, two sessions; the
    // same subject on another connection, the same session.
    let mut alice_frames = connect("alice");
    let r = alice_frames.call("put", &[("key", "\"k\""), ("value", "1")], Some("mine"));
    assert_eq!(common::tool_text(&r), "stored k");
    let r = connect("alice").call("get", &[("key", "\"k\"")], Some("mine"));
    assert_eq!(common::tool_text(&r), "1");
    let r = bob.call("get", &[("key", "\"k\"")], Some("mine"));
    assert_eq!(
        common::error_code(&r),
        not_found,
        "Bob read Alice's frame session"
    );
}

/// No token passthrough with `[auth]` on: a FastMCP upstream behind the
/// broker sees its router's `upstream_headers`, never the client's JWT.
#[test]
fn an_upstream_sees_its_routers_credentials_never_the_clients_token() {
    use std::io::BufRead;
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let venv = repo.join(".tools/mcp1/bin/python");
    let python = if venv.exists() {
        venv
    } else {
        PathBuf::from("python3")
    };
    let f = Fixture::start("upstream-keys");
    let state = f.dir.join("upstream");
    std::fs::create_dir_all(&state).unwrap();
    let mut server = Command::new(&python)
        .arg(repo.join("broker/tests/upstreams/server.py"))
        .args(["0", "--name", "alpha", "--state"])
        .arg(&state)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("FastMCP (scripts/setup installs it in .tools/mcp1)");
    let mut line = String::new();
    std::io::BufReader::new(server.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let port: u16 = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("http=127.0.0.1:"))
        .unwrap_or_else(|| panic!("no ready line from server.py: {line:?}"))
        .parse()
        .unwrap();
    let toml = format!(
        r#"[broker]
shards = 1

[auth]
issuer = "{ISSUER}"
audience = "{AUDIENCE}"
jwks_file = "{}"

[[routers]]
name = "alpha"
upstream = "http://127.0.0.1:{port}/mcp"
upstream_headers = {{ Authorization = "Bearer alpha-secret" }}
"#,
        f.dir.join("jwks.json").display()
    );
    let b = Broker::start_with_config(&toml, &[]);
    let token = f.token("alice", "");
    let s = session(&b, &token);
    let r = call(&b, &token, &s, "whoami", "{}");
    let _ = server.kill();
    let _ = server.wait();
    assert_eq!(r.status, 200, "{}", r.text());
    let text = r.text();
    assert!(
        text.contains("alpha auth=Bearer alpha-secret"),
        "the upstream must see the router's credentials: {text}"
    );
    assert!(
        !text.contains(&token),
        "the client's token reached the upstream: {text}"
    );
}

/// A verified token is remembered per thread, but only under the key set
/// that verified it: once its key leaves the JWK Set (rotated out), the
/// token is refused although it was served a moment before.
#[test]
fn a_key_rotated_out_stops_its_tokens_even_once_verified() {
    let f = Fixture::start("rotate");
    let b = &f.b;
    let old = f.token("alice", "mcp");
    for _ in 0..3 {
        let r = post(b, Some(&format!("Bearer {old}")), None, initialize_body());
        assert_eq!(r.status, 200, "{}", r.text());
    }
    // The new set holds only `k2` (the stranger key).
    let jwks = json!({"keys": [common::jwt::jwk("k2", &f.stranger)]});
    std::fs::write(f.dir.join("jwks.json"), jwks.to_string()).unwrap();
    let new = {
        let mut h = Header::new(Algorithm::RS256);
        h.kid = Some("k2".into());
        let k = EncodingKey::from_rsa_pem(&f.stranger.private_pem).unwrap();
        common::jwt::encode(&h, &claims("alice", "mcp"), &k)
    };
    // Its first use asks for the set to be read again.
    assert!(
        common::http::eventually(std::time::Duration::from_secs(10), || {
            post(b, Some(&format!("Bearer {new}")), None, initialize_body()).status == 200
        }),
        "the rotated-in key was never accepted"
    );
    for _ in 0..3 {
        let r = post(b, Some(&format!("Bearer {old}")), None, initialize_body());
        assert_eq!(r.status, 401, "a token of a removed key: {}", r.text());
    }
}

/// `mcp-loadgen --bearer-file` on every edge of a broker running `[auth]`:
/// the HTTP `Authorization` header, the gRPC `authorization` metadata of
/// every call, and the frame connections' `InitializeRequest` (sent and
/// answered before the measured traffic). Without the token the frame and
/// gRPC runs are all errors; a refused token fails a frame run up front.
#[test]
fn mcp_loadgen_sends_its_token_on_every_edge() {
    // Built beside mcp-broker (`cargo test --workspace`, or
    // `cargo build -p mcp-loadgen`), as broker/tests/loadgen_e2e.rs finds it.
    let loadgen = PathBuf::from(env!("CARGO_BIN_EXE_mcp-broker")).with_file_name("mcp-loadgen");
    assert!(
        loadgen.exists(),
        "{} is missing: run the tests with `cargo test --workspace` (scripts/test) or \
         `cargo build -p mcp-loadgen` first",
        loadgen.display()
    );
    let f = Fixture::start("loadgen");
    let good = f.dir.join("token");
    std::fs::write(&good, format!("{}\n", f.token("alice", "mcp"))).unwrap();
    let bad = f.dir.join("bad-token");
    std::fs::write(&bad, "not-a-jwt\n").unwrap();
    let run = |target: &str, bearer: Option<&PathBuf>, name: &str| {
        let json = f.dir.join(format!("{name}.json"));
        let mut c = Command::new(&loadgen);
        c.args(["--target", target])
            .args(["--tool", "echo_text", "--args", r#"{"text":"hi"}"#])
            .args(["--connections", "2", "--duration", "1s"])
            .args(["--timeout", "5s", "--drain", "2s", "-q", "--json"])
            .arg(&json);
        if let Some(p) = bearer {
            c.arg("--bearer-file").arg(p);
        }
        let out = c.output().expect("run mcp-loadgen");
        let report: Value = serde_json::from_slice(
            &std::fs::read(&json).unwrap_or_else(|e| panic!("{name}: no JSON report: {e}")),
        )
        .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        (out.status, report, stderr)
    };
    let b = &f.b;
    let targets = [
        ("frames", format!("frames://{}", b.frames)),
        ("grpc", format!("grpc://{}", b.grpc)),
        ("http", format!("http://{}/mcp", b.http)),
    ];
    for (name, target) in &targets {
        let (status, r, stderr) = run(target, Some(&good), name);
        assert!(status.success(), "{name}: {stderr}\n{r}");
        assert_eq!(r["errors"], 0, "{name}: {r}");
        let requests = r["requests"].as_u64().unwrap();
        assert!(requests > 0, "{name}: {r}");
        assert_eq!(r["ok"].as_u64(), Some(requests), "{name}: {r}");
    }
    // Without the token: every frame and gRPC request is refused (the run
    // itself completes), and an HTTP session cannot even start.
    for (name, target, kind) in [
        ("frames", &targets[0].1, "error_response.unauthorized"),
        ("grpc", &targets[1].1, "grpc_unauthenticated"),
    ] {
        let (status, r, stderr) = run(target, None, &format!("{name}-none"));
        assert!(status.success(), "{name}: {stderr}\n{r}");
        assert_eq!(r["ok"], 0, "{name} without a token: {r}");
        let refused = r["errors_by_kind"][kind].as_u64().unwrap_or(0);
        assert!(refused > 0, "{name} without a token: {r}");
        assert_eq!(r["errors"].as_u64(), Some(refused), "{name}: {r}");
    }
    let (status, r, _) = run(&targets[2].1, None, "http-none");
    assert!(!status.success(), "http without a token: {r}");
    // A token the broker refuses: the frame run fails before it starts,
    // naming the error.
    let (status, r, stderr) = run(&targets[0].1, Some(&bad), "frames-bad");
    assert!(!status.success(), "{r}");
    let failure = r["failure"].as_str().unwrap_or_default();
    for needle in ["initialize", "-32003", "unauthorized"] {
        assert!(failure.contains(needle), "{needle:?} in {failure:?}");
        assert!(stderr.contains(needle), "{needle:?} in {stderr}");
    }
    assert!(r["requests"].as_u64().unwrap_or(0) == 0, "{r}");
}

/// Protocol 2026-07-28 requests (stateless, broker/tests/http_modern.rs)
/// are authenticated like any other, their listings are marked private
/// (they depend on the token) and filtered, and tool rules hold.
#[test]
fn protocol_2026_07_28_requests_need_a_token_and_get_private_filtered_listings() {
    use common::http::{ACCEPT_BOTH, JSON};
    let f = Fixture::start("modern");
    let b = &f.b;
    let meta = r#""_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}"#;
    let send = |auth: Option<&str>, method: &str, name: Option<&str>, body: &str| {
        let mut c = Conn::connect(b.http);
        let mut h = vec![
            ACCEPT_BOTH,
            JSON,
            ("MCP-Protocol-Version", "2026-07-28"),
            ("Mcp-Method", method),
        ];
        if let Some(a) = auth {
            h.push(("Authorization", a));
        }
        if let Some(n) = name {
            h.push(("Mcp-Name", n));
        }
        c.request("POST", "/mcp", &h, body.as_bytes())
    };
    let list = format!(r#"{{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{{{meta}}}}}"#);
    let r = send(None, "tools/list", None, &list);
    assert_eq!(r.status, 401, "{}", r.text());
    assert!(
        r.header("www-authenticate")
            .is_some_and(|w| w.contains("resource_metadata=")),
        "{:?}",
        r.headers
    );
    let alice = format!("Bearer {}", f.token("alice", "mcp"));
    let r = send(Some(&alice), "tools/list", None, &list);
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["result"]["cacheScope"], "private", "{v}");
    let names: Vec<&str> = v["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"get") && !names.contains(&"put"),
        "{names:?}"
    );
    let call = format!(
        r#"{{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{{{meta},"name":"put","arguments":{{"key":"k","value":1}}}}}}"#
    );
    let r = send(Some(&alice), "tools/call", Some("put"), &call);
    assert_eq!(r.status, 403, "{}", r.text());
    assert!(
        r.header("www-authenticate")
            .is_some_and(|w| w.contains("insufficient_scope")),
        "{:?}",
        r.headers
    );
    let writer = format!("Bearer {}", f.token("bob", "mcp kv:write"));
    let r = send(Some(&writer), "tools/call", Some("put"), &call);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["result"]["resultType"], "complete", "{}", r.text());
    // A session-affine router's state is the subject's: bob reads what he
    // wrote on every call, whichever shard takes it (new connections, two
    // shards), and alice never does. It was the shard's shared instances,
    // read and changed by every subject.
    let get = format!(
        r#"{{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{{{meta},"name":"get","arguments":{{"key":"k"}}}}}}"#
    );
    for _ in 0..6 {
        let r = send(Some(&writer), "tools/call", Some("get"), &get);
        let v = r.json();
        assert_eq!(v["result"]["isError"], false, "{v}");
        assert_eq!(v["result"]["content"][0]["text"], "1", "{v}");
        let r = send(Some(&alice), "tools/call", Some("get"), &get);
        assert!(r.text().contains("no key `k`"), "{}", r.text());
    }
    // So are its updates: a listen stream hears of its own subject's
    // writes, never of another's (bob heard carol write `kv://k`, a key of
    // a state he cannot read).
    let listen = |auth: &str, uris: &str| {
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":"L","method":"subscriptions/listen","params":{{{meta},"notifications":{{"resourceSubscriptions":{uris}}}}}}}"#
        );
        let mut c = Conn::open_sse(
            b.http,
            &format!(
                "MCP-Protocol-Version: 2026-07-28\r\nMcp-Method: subscriptions/listen\r\nAuthorization: {auth}\r\n"
            ),
            &body,
        );
        let (ack, _) = c.read_chunked(Some(&|t: &str| t.contains("acknowledged")));
        assert!(String::from_utf8(ack).unwrap().contains(uris), "{uris}");
        c
    };
    let updated = |c: &mut Conn| {
        let (body, ended) = c.read_chunked(Some(&|t: &str| t.contains("resources/updated")));
        assert!(!ended);
        String::from_utf8(body).unwrap()
    };
    let carol = format!("Bearer {}", f.token("carol", "mcp kv:write"));
    let mut bobs = listen(&writer, r#"["kv://j","kv://k"]"#);
    let mut carols = listen(&carol, r#"["kv://k"]"#);
    let put = |auth: &str, key: &str| {
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{{{meta},"name":"put","arguments":{{"key":"{key}","value":2}}}}}}"#
        );
        let r = send(Some(auth), "tools/call", Some("put"), &body);
        assert_eq!(r.json()["result"]["isError"], false, "{}", r.text());
    };
    put(&carol, "k");
    put(&writer, "j");
    let text = updated(&mut carols);
    assert!(text.contains(r#""uri":"kv://k""#), "{text}");
    let text = updated(&mut bobs);
    assert!(text.contains(r#""uri":"kv://j""#), "{text}");
    assert!(
        !text.contains(r#""uri":"kv://k""#),
        "carol's write was told to bob: {text}"
    );
}

/// A stream is one request, its token checked once: a GET stream, a listen
/// stream, a gRPC Subscribe and a frame connection's subscription went on
/// telling their subject's updates long after the token expired (the
/// isolation audit). Each now ends, or goes quiet, once the token is past
/// `exp` and the leeway, as the edges judge every other request.
#[test]
fn notification_streams_end_when_their_token_expires() {
    use mcp_proto::v1 as pb;
    use mcp_schema::fb::protocol::ProtocolVersion;
    let f = Fixture::start("stream-expiry");
    let b = &f.b;
    let writer = f.token("alice", "mcp kv:write");
    // Accepted for about two seconds more: `exp` passed 3 s ago, and the
    // leeway is 5 s.
    let short = f.sign(&json!({
        "iss": ISSUER, "aud": AUDIENCE, "sub": "alice", "scope": "mcp kv:write",
        "exp": now() - 3, "nbf": now() - 10,
    }));
    // The HTTP session's GET stream, opened with the short token.
    let s = session(b, &writer);
    let r = post(
        b,
        Some(&format!("Bearer {writer}")),
        Some(&s),
        r#"{"jsonrpc":"2.0","id":1,"method":"resources/subscribe","params":{"uri":"kv://t"}}"#,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let mut get = Conn::connect(b.http);
    get.send_raw(
        format!(
            "GET /mcp HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\nMcp-Session-Id: {s}\r\nMCP-Protocol-Version: 2025-06-18\r\nAuthorization: Bearer {short}\r\n\r\n"
        )
        .as_bytes(),
    );
    assert_eq!(get.read_head().0, 200);
    // A 2026-07-28 listen stream.
    let meta = r#""_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}"#;
    let body = format!(
        r#"{{"jsonrpc":"2.0","id":"L","method":"subscriptions/listen","params":{{{meta},"notifications":{{"resourceSubscriptions":["kv://t"]}}}}}}"#
    );
    let mut listen = Conn::open_sse(
        b.http,
        &format!(
            "MCP-Protocol-Version: 2026-07-28\r\nMcp-Method: subscriptions/listen\r\nAuthorization: Bearer {short}\r\n"
        ),
        &body,
    );
    // A frame connection's subscription, in session `fx`.
    let mut frames = b.connect();
    let r = frames.request(None, |e, h| {
        e.initialize_with_token(h, ProtocolVersion::V2025_06_18, "t", "1", Some(&short))
            .to_vec()
    });
    assert_eq!(common::error_code(&r), None);
    let r = frames.request(Some("fx"), |e, h| e.subscribe(h, "kv://t", true).to_vec());
    assert_eq!(common::error_code(&r), None);
    // A gRPC Subscribe without a session.
    let (rt, mut g) = grpc_client(&f);
    let mut sub = rt.block_on(async {
        g.subscribe(with(
            Some(&short),
            pb::SubscribeRequest {
                topics: vec!["kv://t".into()],
            },
        ))
        .await
        .expect("subscribed within the leeway")
        .into_inner()
    });
    std::thread::sleep(Duration::from_millis(3500));
    // The HTTP streams end by themselves.
    let (text, ended) = get.read_chunked(None);
    assert!(ended, "the GET stream ended");
    assert!(!text.windows(7).any(|w| w == b"updated"), "{text:?}");
    let (text, ended) = listen.read_chunked(None);
    let text = String::from_utf8(text).unwrap();
    assert!(ended, "the listen stream ended: {text}");
    assert!(
        text.contains("notifications/cancelled") && text.contains("access token expired"),
        "{text}"
    );
    // Writes in each stream's state now tell the others nothing.
    let mut w = b.connect();
    let r = w.request(None, |e, h| {
        e.initialize_with_token(h, ProtocolVersion::V2025_06_18, "t", "1", Some(&writer))
            .to_vec()
    });
    assert_eq!(common::error_code(&r), None);
    for session in [None, Some("fx")] {
        let r = w.call("put", &[("key", "\"t\""), ("value", "1")], session);
        assert_eq!(common::tool_text(&r), "stored t", "{session:?}");
    }
    let pong = frames.first_after_ping();
    let v = mcp_schema::client::ResponseView::parse(&pong).unwrap();
    assert!(
        v.response
            .payload_as_resource_updated_notification()
            .is_none(),
        "the frame connection heard an update after its token expired"
    );
    assert!(!v.correlation_id().is_empty(), "the ping's own answer");
    rt.block_on(async {
        let next = tokio::time::timeout(Duration::from_secs(10), sub.message())
            .await
            .expect("the Subscribe stream ends");
        let e = next.expect_err("UNAUTHENTICATED, not the update");
        assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e:?}");
        assert!(e.message().contains("expired"), "{e:?}");
    });
    // A signed `exp` no clock reaches keeps its streams open: the
    // deadline's arithmetic once overflowed and took the process down.
    let forever = f.sign(&json!({
        "iss": ISSUER, "aud": AUDIENCE, "sub": "alice", "scope": "mcp kv:write",
        "exp": u64::MAX, "nbf": now() - 10,
    }));
    let mut listen = Conn::open_sse(
        b.http,
        &format!(
            "MCP-Protocol-Version: 2026-07-28\r\nMcp-Method: subscriptions/listen\r\nAuthorization: Bearer {forever}\r\n"
        ),
        &body,
    );
    let mut get = Conn::connect(b.http);
    get.send_raw(
        format!(
            "GET /mcp HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\nMcp-Session-Id: {s}\r\nMCP-Protocol-Version: 2025-06-18\r\nAuthorization: Bearer {forever}\r\n\r\n"
        )
        .as_bytes(),
    );
    assert_eq!(get.read_head().0, 200);
    let put = format!(
        r#"{{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{{{meta},"name":"put","arguments":{{"key":"t","value":2}}}}}}"#
    );
    let mut c = Conn::connect(b.http);
    let r = c.request(
        "POST",
        "/mcp",
        &[
            common::http::ACCEPT_BOTH,
            common::http::JSON,
            ("MCP-Protocol-Version", "2026-07-28"),
            ("Mcp-Method", "tools/call"),
            ("Mcp-Name", "put"),
            ("Authorization", &format!("Bearer {forever}")),
        ],
        put.as_bytes(),
    );
    assert_eq!(r.json()["result"]["isError"], false, "{}", r.text());
    let (text, ended) = listen.read_chunked(Some(&|t: &str| t.contains("resources/updated")));
    assert!(!ended, "{}", String::from_utf8_lossy(&text));
}
