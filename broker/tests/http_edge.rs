//! The MCP Streamable HTTP edge, driven over real sockets against the real
//! binary: the protocol, the transport rules, and every bad input's answer.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::Broker;
use common::http::{ACCEPT_BOTH, Conn, JSON, eventually};
use serde_json::json;

fn broker() -> Broker {
    Broker::start(&[])
}

/// The broker on the embedded default (plus chaos) with `keys` added to its
/// `[http]` table.
fn with_http(keys: &str) -> Broker {
    Broker::start_with_config(
        &common::with_http_keys(&common::default_with_chaos(), keys),
        &[],
    )
}

#[test]
fn the_ready_line_names_the_http_edge_and_initialize_issues_a_session() {
    let b = broker();
    assert!(
        b.ready_line.contains(&format!(" http={} ", b.http)),
        "{}",
        b.ready_line
    );
    let mut c = Conn::connect(b.http);
    let r = c.post(
        None,
        r#"{"jsonrpc":"2.0","id":"init","method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["id"], "init");
    assert_eq!(v["result"]["protocolVersion"], "2025-06-18");
    assert_eq!(v["result"]["serverInfo"]["name"], "mcp-broker");
    assert!(v["result"]["capabilities"]["tools"].is_object());
    // The GET stream gets list_changed on every route table change
    // (reload::), so initialize says so, as server/discover does.
    for kind in ["tools", "resources", "prompts"] {
        assert_eq!(
            v["result"]["capabilities"][kind]["listChanged"], true,
            "{kind}: {v}"
        );
    }
    let id = r.header("mcp-session-id").unwrap();
    // Visible ASCII, the owner shard, then 128 random bits in hex.
    let (owner, key) = id.split_once('-').unwrap();
    assert!(usize::from_str_radix(owner, 16).unwrap() < b.shards);
    assert_eq!(key.len(), 32);
    // A second session gets another id.
    let other = c.initialize("2025-06-18");
    assert_ne!(other, id);
    // An unknown version is answered with the latest one.
    let r = c.post(
        None,
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"1999-01-01","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#,
    );
    assert_eq!(r.json()["result"]["protocolVersion"], "2025-11-25");
}

#[test]
fn every_method_is_served_through_the_routers_on_one_kept_alive_connection() {
    let b = broker();
    let mut c = Conn::connect(b.http);
    let s = c.initialize("2025-06-18");
    let v = c.call(&s, 1, "ping", "{}");
    assert_eq!(v["result"], json!({}));
    let v = c.call(&s, 2, "tools/list", "{}");
    let names: Vec<_> = v["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_string())
        .collect();
    for n in ["echo", "put", "get", "search"] {
        assert!(names.iter().any(|x| x == n), "{n} not in {names:?}");
    }
    // Arguments reach the router as the client wrote them.
    let v = c.call(
        &s,
        3,
        "tools/call",
        r#"{"name":"echo","arguments":{"n":1.50,"big":123456789012345678901234567890,"s":"é\n"}}"#,
    );
    let text = v["result"]["content"][0]["text"].as_str().unwrap();
    assert!(
        text.contains("1.50") && text.contains("123456789012345678901234567890"),
        "{text}"
    );
    // kv state lives in the session.
    let v = c.call(
        &s,
        4,
        "tools/call",
        r#"{"name":"put","arguments":{"key":"k","value":"v1"}}"#,
    );
    assert_eq!(v["result"]["isError"], false, "{v}");
    let v = c.call(
        &s,
        5,
        "tools/call",
        r#"{"name":"get","arguments":{"key":"k"}}"#,
    );
    assert!(
        v["result"]["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("v1"),
        "{v}"
    );
    let v = c.call(&s, 6, "resources/list", "{}");
    assert!(
        v["result"]["resources"].as_array().unwrap().len() >= 2,
        "{v}"
    );
    let v = c.call(&s, 7, "resources/templates/list", "{}");
    assert!(
        !v["result"]["resourceTemplates"]
            .as_array()
            .unwrap()
            .is_empty(),
        "{v}"
    );
    let v = c.call(&s, 8, "resources/read", r#"{"uri":"library://readme"}"#);
    assert_eq!(v["result"]["contents"][0]["uri"], "library://readme", "{v}");
    let v = c.call(&s, 9, "prompts/list", "{}");
    assert!(
        !v["result"]["prompts"].as_array().unwrap().is_empty(),
        "{v}"
    );
    let v = c.call(
        &s,
        10,
        "prompts/get",
        r#"{"name":"summarize_book","arguments":{"book_id":"dune","style":"terse"}}"#,
    );
    let text = v["result"]["messages"][0]["content"]["text"]
        .as_str()
        .unwrap();
    assert!(text.contains("dune") && text.contains("terse"), "{text}");
    // A required argument missing is invalid params; an optional one
    // missing leaves no placeholder behind.
    let v = c.call(
        &s,
        101,
        "prompts/get",
        r#"{"name":"summarize_book","arguments":{}}"#,
    );
    assert_eq!(v["error"]["code"], -32602, "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("book_id"),
        "{v}"
    );
    let v = c.call(
        &s,
        102,
        "prompts/get",
        r#"{"name":"summarize_book","arguments":{"book_id":"dune"}}"#,
    );
    let text = v["result"]["messages"][0]["content"]["text"]
        .as_str()
        .unwrap();
    assert!(!text.contains("{{"), "{text}");
    let v = c.call(
        &s,
        11,
        "completion/complete",
        r#"{"ref":{"type":"ref/prompt","name":"summarize_book"},"argument":{"name":"book_id","value":""}}"#,
    );
    assert!(v["result"]["completion"]["values"].is_array(), "{v}");
    let v = c.call(&s, 12, "logging/setLevel", r#"{"level":"warning"}"#);
    assert_eq!(v["result"], json!({}), "{v}");
    let v = c.call(
        &s,
        13,
        "resources/subscribe",
        r#"{"uri":"library://readme"}"#,
    );
    assert_eq!(v["result"], json!({}), "{v}");
    let v = c.call(
        &s,
        14,
        "resources/unsubscribe",
        r#"{"uri":"library://readme"}"#,
    );
    assert_eq!(v["result"], json!({}), "{v}");
    // Another session has its own kv instance.
    let s2 = c.initialize("2025-06-18");
    let v = c.call(
        &s2,
        1,
        "tools/call",
        r#"{"name":"get","arguments":{"key":"k"}}"#,
    );
    assert!(!v.to_string().contains("v1"), "{v}");
    // Counted in /metrics under edge="http", by router and outcome.
    let (status, text) = b.http_get("/metrics");
    assert_eq!(status, 200);
    let http_ok: f64 = text
        .lines()
        .filter(|l| {
            l.starts_with("mcp_requests_total{edge=\"http\"") && l.contains("outcome=\"ok\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(http_ok >= 15.0, "{http_ok}: {text}");
    assert!(
        text.contains(
            "mcp_requests_total{edge=\"http\",router=\"kv\",kind=\"call_tool\",outcome=\"ok\"}"
        ),
        "{text}"
    );
}

/// Every tool of a listing, page by page through its cursors (at most 100
/// pages), in session `s`: the names, and each page's length.
fn tools_paged(c: &mut Conn, s: &str) -> (Vec<String>, Vec<usize>) {
    let (mut names, mut pages) = (Vec::new(), Vec::new());
    let mut cursor: Option<String> = None;
    for i in 0..100 {
        let params = match &cursor {
            Some(c) => format!(r#"{{"cursor":"{c}"}}"#),
            None => "{}".into(),
        };
        let v = c.call(s, 10 + i, "tools/list", &params);
        let tools = v["result"]["tools"].as_array().unwrap();
        pages.push(tools.len());
        names.extend(tools.iter().map(|t| t["name"].as_str().unwrap().to_owned()));
        match v["result"]["nextCursor"].as_str() {
            Some(n) => cursor = Some(n.to_string()),
            None => break,
        }
    }
    (names, pages)
}

#[test]
fn listings_are_paged_with_cursors_and_a_bad_cursor_is_invalid_params() {
    let b = broker();
    let mut c = Conn::connect(b.http);
    let s = c.initialize("2025-06-18");
    let v = c.call(&s, 1, "tools/list", r#"{"cursor":"not-a-cursor"}"#);
    assert_eq!(v["error"]["code"], -32602, "{v}");
    let (names, _) = tools_paged(&mut c, &s);
    assert!(names.len() >= 10, "{names:?}");
}

/// `broker.list_page_size` sets the page: at 3 the tools of the embedded
/// default (with chaos) come in pages of 3 whose cursors lead through all
/// of them, the same tools, in the same order, as one page of the default
/// 100.
#[test]
fn the_page_size_is_the_configured_one_and_pages_cover_the_listing() {
    let names = |b: &Broker| {
        let mut c = Conn::connect(b.http);
        let s = c.initialize("2025-11-25");
        tools_paged(&mut c, &s)
    };
    let (all, one) = names(&broker());
    assert_eq!(one, [all.len()], "the default: one page of at most 100");
    assert!(all.len() > 3, "{all:?}");
    let toml = common::default_with_chaos().replace("list_page_size = 100", "list_page_size = 3");
    assert!(toml.contains("list_page_size = 3"));
    let (paged, sizes) = names(&Broker::start_with_config(&toml, &[]));
    assert_eq!(paged, all);
    assert!(
        sizes.iter().all(|&n| n <= 3) && sizes.len() == all.len().div_ceil(3),
        "{sizes:?}"
    );
}

#[test]
fn json_rpc_errors_have_their_codes() {
    let b = broker();
    let mut c = Conn::connect(b.http);
    let s = c.initialize("2025-06-18");
    let cases = [
        // (body, HTTP status, JSON-RPC code)
        ("{not json", 400, -32700),
        (r#"{"jsonrpc":"1.0","id":1,"method":"ping"}"#, 400, -32600),
        (
            r#"{"jsonrpc":"2.0","id":{"a":1},"method":"ping"}"#,
            400,
            -32600,
        ),
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"no/such"}"#,
            200,
            -32601,
        ),
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{}}"#,
            200,
            -32602,
        ),
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":[1]}}"#,
            200,
            -32602,
        ),
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"no_such_tool"}}"#,
            200,
            -32602,
        ),
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"resources/read","params":{"uri":"nope://x"}}"#,
            200,
            -32002,
        ),
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"logging/setLevel","params":{"level":"loud"}}"#,
            200,
            -32602,
        ),
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}"#,
            200,
            -32602,
        ),
    ];
    for (body, status, code) in cases {
        let r = c.post(Some(&s), body);
        assert_eq!(r.status, status, "{body}: {}", r.text());
        let v = r.json();
        assert_eq!(v["error"]["code"], code, "{body}: {v}");
        assert!(!v["error"]["message"].as_str().unwrap().is_empty());
        assert!(v.get("result").is_none());
    }
}

#[test]
fn transport_rules_have_their_statuses() {
    let b = broker();
    let mut c = Conn::connect(b.http);
    let s = c.initialize("2025-06-18");
    let ping = br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;
    let sid = ("Mcp-Session-Id", s.as_str());
    // (method, path, headers, status)
    type Case<'a> = (&'a str, &'a str, Vec<(&'a str, &'a str)>, u16);
    let cases: Vec<Case<'_>> = vec![
        ("POST", "/mcp", vec![ACCEPT_BOTH, JSON], 400), // no session
        (
            "POST",
            "/mcp",
            vec![
                ACCEPT_BOTH,
                JSON,
                ("Mcp-Session-Id", "0-00000000000000000000000000000000"),
            ],
            404,
        ),
        (
            "POST",
            "/mcp",
            vec![ACCEPT_BOTH, JSON, ("Mcp-Session-Id", "garbage")],
            404,
        ),
        (
            "POST",
            "/mcp",
            vec![("Accept", "application/json"), JSON, sid],
            406,
        ),
        (
            "POST",
            "/mcp",
            vec![ACCEPT_BOTH, ("Content-Type", "text/plain"), sid],
            415,
        ),
        (
            "POST",
            "/mcp",
            vec![
                ACCEPT_BOTH,
                JSON,
                sid,
                ("MCP-Protocol-Version", "2099-01-01"),
            ],
            400,
        ),
        (
            "POST",
            "/mcp",
            vec![ACCEPT_BOTH, JSON, sid, ("Origin", "http://evil.example")],
            403,
        ),
        (
            "POST",
            "/mcp",
            vec![ACCEPT_BOTH, JSON, sid, ("Origin", "http://localhost:6274")],
            200,
        ),
        // Every Origin is judged: a loopback one does not vouch for another.
        (
            "POST",
            "/mcp",
            vec![
                ACCEPT_BOTH,
                JSON,
                sid,
                ("Origin", "http://localhost:6274"),
                ("Origin", "http://evil.example"),
            ],
            403,
        ),
        (
            "POST",
            "/mcp",
            vec![
                ACCEPT_BOTH,
                JSON,
                sid,
                ("MCP-Protocol-Version", "2025-06-18"),
            ],
            200,
        ),
        ("PUT", "/mcp", vec![sid], 405),
        ("OPTIONS", "/mcp", vec![], 204),
        ("POST", "/other", vec![ACCEPT_BOTH, JSON, sid], 404),
        (
            "GET",
            "/mcp",
            vec![("Accept", "application/json"), sid],
            406,
        ),
        ("GET", "/mcp", vec![("Accept", "text/event-stream")], 400),
        ("DELETE", "/mcp", vec![], 400),
    ];
    // Every response by status, the edge's own refusals included.
    // (`initialize` sent `notifications/initialized` too: 202.)
    let mut statuses = std::collections::BTreeMap::from([(200, 1.0), (202, 1.0)]);
    for (method, path, headers, status) in cases {
        *statuses.entry(status).or_default() += 1.0;
        let r = c.request(method, path, &headers, ping);
        assert_eq!(
            r.status,
            status,
            "{method} {path} {headers:?}: {}",
            r.text()
        );
        if status >= 400 {
            assert!(r.json()["error"]["message"].is_string(), "{}", r.text());
        }
        if status == 405 || method == "OPTIONS" {
            assert_eq!(r.header("allow"), Some("GET, POST, DELETE, OPTIONS"));
        }
    }
    // A GET without a session is how an HTTP+SSE (2024-11-05 transport)
    // client starts: the refusal names that transport.
    let r = c.request("GET", "/mcp", &[("Accept", "text/event-stream")], b"");
    let says = r.json()["error"]["message"].as_str().unwrap().to_owned();
    assert!(says.contains("HTTP+SSE"), "{says}");
    *statuses.entry(400).or_default() += 1.0;
    // Notifications and responses are accepted with 202 and no body.
    let r = c.post(
        Some(&s),
        r#"{"jsonrpc":"2.0","method":"notifications/roots/list_changed"}"#,
    );
    assert_eq!((r.status, r.body.len()), (202, 0));
    let r = c.post(Some(&s), r#"{"jsonrpc":"2.0","id":"x","result":{}}"#);
    assert_eq!(r.status, 202);
    // DELETE ends the session; its id is then unknown.
    let r = c.request("DELETE", "/mcp", &[sid], b"");
    assert_eq!(r.status, 200);
    let r = c.post(Some(&s), std::str::from_utf8(ping).unwrap());
    assert_eq!(r.status, 404);
    let r = c.request("DELETE", "/mcp", &[sid], b"");
    assert_eq!(r.status, 404);
    for (status, n) in [(202, 2.0), (200, 1.0), (404, 2.0)] {
        *statuses.entry(status).or_default() += n;
    }
    let (_, metrics) = b.http_get("/metrics");
    let counted: std::collections::BTreeMap<u16, f64> = metrics
        .lines()
        .filter_map(|l| l.strip_prefix("mcp_http_responses_total{status=\""))
        .filter_map(|l| {
            let (status, n) = l.split_once("\"} ")?;
            Some((status.parse().ok()?, n.parse().ok()?))
        })
        .filter(|(_, n)| *n > 0.0)
        .collect();
    assert_eq!(counted, statuses, "mcp_http_responses_total");
}

/// `server/discover` belongs to 2026-07-28 (broker/tests/http_modern.rs has
/// its rules): a malformed probe is refused by them, a well-formed one is
/// answered, and the handshake era goes on beside it on one connection.
#[test]
fn server_discover_follows_the_2026_rules_beside_the_session_era() {
    let b = broker();
    let mut c = Conn::connect(b.http);
    let r = c.post(
        None,
        r#"{"jsonrpc":"2.0","id":1,"method":"server/discover","params":{}}"#,
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], -32602, "no _meta");
    let r = c.request(
        "POST",
        "/mcp",
        &[
            ACCEPT_BOTH,
            JSON,
            ("MCP-Protocol-Version", "2026-07-28"),
            ("Mcp-Method", "server/discover"),
        ],
        br#"{"jsonrpc":"2.0","id":2,"method":"server/discover","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}"#,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["result"]["supportedVersions"][0], "2026-07-28");
    assert!(r.header("mcp-session-id").is_none());
    c.initialize("2025-11-25");
}

#[test]
fn batches_are_served_only_in_a_2025_03_26_session() {
    let b = broker();
    let mut c = Conn::connect(b.http);
    let batch = r#"[{"jsonrpc":"2.0","id":1,"method":"ping"},{"jsonrpc":"2.0","method":"notifications/initialized"},{"jsonrpc":"2.0","id":2,"method":"no/such"},{"jsonrpc":"1","id":3}]"#;
    let s = c.initialize("2025-06-18");
    let r = c.post(Some(&s), batch);
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("2025-03-26"));
    let s = c.initialize("2025-03-26");
    let r = c.post(Some(&s), batch);
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    let a = v.as_array().unwrap();
    assert_eq!(a.len(), 3, "{v}");
    assert_eq!(a[0]["result"], json!({}));
    assert_eq!(a[1]["error"]["code"], -32601);
    assert_eq!(a[2]["error"]["code"], -32600);
    let r = c.post(Some(&s), "[]");
    assert_eq!(r.status, 400);
    let r = c.post(
        Some(&s),
        r#"[{"jsonrpc":"2.0","method":"notifications/initialized"}]"#,
    );
    assert_eq!(r.status, 202);
}

#[test]
fn a_long_batch_lets_the_shards_other_clients_in() {
    // One shard: a batch of 10,000 calls and a ping on another connection
    // share it. The batch ran without a break for seconds, and the ping
    // waited for all of it.
    let b = Broker::start(&["--shards", "1"]);
    let mut c = Conn::connect(b.http);
    let s = c.initialize("2025-03-26");
    let items: Vec<String> = (0..10_000)
        .map(|i| format!(r#"{{"jsonrpc":"2.0","id":{i},"method":"tools/call","params":{{"name":"echo","arguments":{{}}}}}}"#))
        .collect();
    let batch = format!("[{}]", items.join(","));
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let batching = {
        let done = done.clone();
        std::thread::spawn(move || {
            let r = c.post(Some(&s), &batch);
            done.store(true, std::sync::atomic::Ordering::SeqCst);
            r
        })
    };
    // Once the batch's calls run (counted as they end)...
    assert!(
        eventually(Duration::from_secs(30), || b
            .metric_sum("mcp_requests_total")
            >= 100.0),
        "the batch's calls did not start"
    );
    // ... a ping on another connection is answered before the batch is.
    let mut other = Conn::connect(b.http);
    let s2 = other.initialize("2025-06-18");
    let v = other.call(&s2, 1, "ping", "{}");
    assert_eq!(v["result"], json!({}));
    assert!(
        !done.load(std::sync::atomic::Ordering::SeqCst),
        "the ping waited for the whole batch"
    );
    let r = batching.join().unwrap();
    assert_eq!(r.json().as_array().map(Vec::len), Some(10_000));
}

#[test]
fn an_oversized_body_is_refused_before_it_is_read() {
    let b = with_http("max_body_bytes = 2048\n");
    let mut c = Conn::connect(b.http);
    let s = c.initialize("2025-06-18");
    // Announced too large: answered at once, the body never sent.
    c.send_raw(
        format!(
            "POST /mcp HTTP/1.1\r\nHost: x\r\nAccept: application/json, text/event-stream\r\nContent-Type: application/json\r\nMcp-Session-Id: {s}\r\nContent-Length: 1000000000\r\n\r\n"
        )
        .as_bytes(),
    );
    let r = c.read_reply();
    assert_eq!(r.status, 413, "{}", r.text());
    // Chunked past the limit: refused when it passes.
    let mut c = Conn::connect(b.http);
    let big = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"echo","arguments":{{"x":"{}"}}}}}}"#,
        "a".repeat(4000)
    );
    let mut msg = format!(
        "POST /mcp HTTP/1.1\r\nHost: x\r\nAccept: application/json, text/event-stream\r\nContent-Type: application/json\r\nMcp-Session-Id: {s}\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    .into_bytes();
    for part in big.as_bytes().chunks(1000) {
        msg.extend_from_slice(format!("{:x}\r\n", part.len()).as_bytes());
        msg.extend_from_slice(part);
        msg.extend_from_slice(b"\r\n");
    }
    msg.extend_from_slice(b"0\r\n\r\n");
    c.send_raw(&msg);
    let r = c.read_reply();
    assert_eq!(r.status, 413, "{}", r.text());
}

#[test]
fn a_refused_body_is_read_and_dropped_so_the_answer_arrives_and_the_connection_goes_on() {
    let b = with_http("max_body_bytes = 2048\n");
    let mut c = Conn::connect(b.http);
    let s = c.initialize("2025-06-18");
    let head = |extra: &str| {
        format!(
            "POST /mcp HTTP/1.1\r\nHost: x\r\nAccept: application/json, text/event-stream\r\nContent-Type: application/json\r\nMcp-Session-Id: {s}\r\n{extra}"
        )
    };
    let still_served = |c: &mut Conn| {
        let v = c.call(&s, 9, "ping", "{}");
        assert_eq!(v["result"], json!({}), "{v}");
    };
    let closes = |r: &common::http::Reply| r.header("connection") == Some("close");
    // Announced too large and sent whole (as clients do without Expect):
    // answered once the body is dropped, and the connection is reused.
    // Before, it was closed with the body unread, and the reset that
    // followed could destroy the answer.
    let mut msg = head("Content-Length: 100000\r\n\r\n").into_bytes();
    msg.extend(std::iter::repeat_n(b' ', 100_000));
    c.send_raw(&msg);
    let r = c.read_reply();
    assert_eq!(r.status, 413, "{}", r.text());
    assert!(!closes(&r), "{:?}", r.headers);
    still_served(&mut c);
    // Chunked past the limit: the same.
    let mut msg = head("Transfer-Encoding: chunked\r\n\r\n").into_bytes();
    for _ in 0..50 {
        msg.extend_from_slice(format!("{:x}\r\n{}\r\n", 1000, " ".repeat(1000)).as_bytes());
    }
    msg.extend_from_slice(b"0\r\n\r\n");
    c.send_raw(&msg);
    let r = c.read_reply();
    assert_eq!(r.status, 413, "{}", r.text());
    assert!(!closes(&r), "{:?}", r.headers);
    still_served(&mut c);
    // A compressed body: 415 naming what is taken, the connection kept.
    let body = br#"{"jsonrpc":"2.0","id":3,"method":"ping"}"#;
    let mut msg = head(&format!(
        "Content-Encoding: gzip\r\nContent-Length: {}\r\n\r\n",
        body.len()
    ))
    .into_bytes();
    msg.extend_from_slice(body);
    c.send_raw(&msg);
    let r = c.read_reply();
    assert_eq!(r.status, 415, "{}", r.text());
    assert_eq!(r.header("accept-encoding"), Some("identity"));
    assert!(
        r.text().contains("Content-Encoding gzip is not taken"),
        "{}",
        r.text()
    );
    still_served(&mut c);
    // A byte order mark is named as such.
    let bom = "\u{feff}{\"jsonrpc\":\"2.0\",\"id\":4,\"method\":\"ping\"}";
    let mut msg = head(&format!("Content-Length: {}\r\n\r\n", bom.len())).into_bytes();
    msg.extend_from_slice(bom.as_bytes());
    c.send_raw(&msg);
    let r = c.read_reply();
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], -32700);
    assert!(r.text().contains("byte order mark"), "{}", r.text());
    still_served(&mut c);
    // A client waiting for `100 Continue` before its body gets none, and
    // the refusal says the connection closes (its body never comes).
    c.send_raw(head("Expect: 100-continue\r\nContent-Length: 100000\r\n\r\n").as_bytes());
    let r = c.read_reply();
    assert_eq!(r.status, 413, "{}", r.text());
    assert!(closes(&r), "{:?}", r.headers);
}

#[test]
fn host_must_be_one_valid_header_and_session_headers_must_agree() {
    let b = with_http("");
    let mut c = Conn::connect(b.http);
    let s = c.initialize("2025-11-25");
    let ping = r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;
    let send = |c: &mut Conn, host_lines: &str, extra: &str| {
        c.send_raw(
            format!(
                "POST /mcp HTTP/1.1\r\n{host_lines}Accept: application/json, text/event-stream\r\nContent-Type: application/json\r\nMcp-Session-Id: {s}\r\n{extra}Content-Length: {}\r\n\r\n{ping}",
                ping.len()
            )
            .as_bytes(),
        );
        c.read_reply()
    };
    // RFC 9112 §3.2: none, two, or one that is no host[:port] is 400.
    for (lines, why) in [
        ("", "no Host header"),
        ("Host: a\r\nHost: b\r\n", "more than one Host"),
        ("Host: a b/c\r\n", "no host[:port]"),
        ("Host: user@example.com\r\n", "no host[:port]"),
    ] {
        let mut c = Conn::connect(b.http);
        let r = send(&mut c, lines, "");
        assert_eq!(r.status, 400, "{lines:?}: {}", r.text());
        assert!(r.text().contains(why), "{lines:?}: {}", r.text());
    }
    for lines in [
        "Host: example.com:8080\r\n",
        "Host: [::1]:7403\r\n",
        "Host: \r\n",
    ] {
        let mut c = Conn::connect(b.http);
        assert_eq!(send(&mut c, lines, "").status, 200, "{lines:?}");
    }
    // Two session ids that differ: a proxy routes on one, the broker
    // would serve the other. The same id twice is one id.
    let r = send(&mut c, "Host: x\r\n", "Mcp-Session-Id: other\r\n");
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(
        r.text().contains("repeated with different values"),
        "{}",
        r.text()
    );
    let r = send(&mut c, "Host: x\r\n", &format!("Mcp-Session-Id: {s}\r\n"));
    assert_eq!(r.status, 200, "{}", r.text());
    let r = send(
        &mut c,
        "Host: x\r\n",
        "MCP-Protocol-Version: 2025-11-25\r\nMCP-Protocol-Version: 2025-06-18\r\n",
    );
    assert_eq!(r.status, 400, "{}", r.text());
}

#[test]
fn session_streams_tell_nginx_not_to_buffer_them() {
    let b = with_http("");
    let mut c = Conn::connect(b.http);
    let s = c.initialize("2025-11-25");
    let mut get = Conn::connect(b.http);
    get.send_raw(
        format!("GET /mcp HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\nMcp-Session-Id: {s}\r\n\r\n")
            .as_bytes(),
    );
    let (status, head) = get.read_head();
    assert_eq!(status, 200);
    assert!(
        head.iter()
            .any(|(k, v)| k.eq_ignore_ascii_case("x-accel-buffering") && v == "no"),
        "{head:?}"
    );
}

#[test]
fn slow_heads_and_slow_bodies_are_cut_off_and_huge_heads_refused() {
    let b = with_http(
        "header_timeout = \"300ms\"\nbody_timeout = \"300ms\"\nmax_header_bytes = 8192\n",
    );
    // Half a head, then silence: the connection is closed.
    let mut s = TcpStream::connect(b.http).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"POST /mcp HTTP/1.1\r\nHost: x\r\n").unwrap();
    let t0 = Instant::now();
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "held {:?}",
        t0.elapsed()
    );
    // A head, then half the body: 408.
    let mut c = Conn::connect(b.http);
    let sid = c.initialize("2025-06-18");
    c.send_raw(
        format!(
            "POST /mcp HTTP/1.1\r\nHost: x\r\nAccept: application/json, text/event-stream\r\nContent-Type: application/json\r\nMcp-Session-Id: {sid}\r\nContent-Length: 100\r\n\r\n{{\"jsonrpc\""
        )
        .as_bytes(),
    );
    let r = c.read_reply();
    assert_eq!(r.status, 408, "{}", r.text());
    // A body that comes in two pieces within the limit is gathered and
    // served (the edge reads a body that is already whole without a timer,
    // and one still on its way under it).
    let mut c = Conn::connect(b.http);
    let sid = c.initialize("2025-06-18");
    let body = r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"echo","arguments":{"text":"two pieces"}}}"#;
    let (first, rest) = body.split_at(body.len() / 2);
    c.send_raw(
        format!(
            "POST /mcp HTTP/1.1\r\nHost: x\r\nAccept: application/json, text/event-stream\r\nContent-Type: application/json\r\nMcp-Session-Id: {sid}\r\nContent-Length: {}\r\n\r\n{first}",
            body.len()
        )
        .as_bytes(),
    );
    std::thread::sleep(Duration::from_millis(100));
    c.send_raw(rest.as_bytes());
    let r = c.read_reply();
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.text().contains("two pieces"), "{}", r.text());
    // A head over the limit: 431.
    let mut c = Conn::connect(b.http);
    let big = "x".repeat(9000);
    c.send_raw(format!("GET /mcp HTTP/1.1\r\nHost: x\r\nX-Big: {big}\r\n\r\n").as_bytes());
    let (status, _) = c.read_head();
    assert_eq!(status, 431);
    // The edge still serves.
    Conn::connect(b.http).initialize("2025-06-18");
}

/// A keep-alive connection's next head gets a header deadline of its own,
/// counted from when the edge began waiting for it: neither cut short by
/// the first head's deadline nor left to wait forever.
#[test]
fn a_keep_alive_connections_next_head_gets_a_header_deadline_of_its_own() {
    let b = with_http("header_timeout = \"1s\"\n");
    let mut c = Conn::connect(b.http);
    // The first head comes in two pieces 600 ms apart, within its second:
    // the timer is armed for a second after the edge began reading it.
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;
    c.send_raw(b"POST /mcp HTTP/1.1\r\nHost: x\r\n");
    std::thread::sleep(Duration::from_millis(600));
    c.send_raw(
        format!(
            "Accept: application/json, text/event-stream\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    );
    assert_eq!(c.read_reply().status, 200);
    // Half of a second head at once: its deadline is a second after the
    // edge began waiting for it, about 600 ms after the first head's.
    let t0 = Instant::now();
    c.send_raw(b"POST /mcp HTTP/1.1\r\nHost: x\r\n");
    let mut rest = Vec::new();
    let _ = c.stream.read_to_end(&mut rest);
    let held = t0.elapsed();
    assert!(
        held >= Duration::from_millis(700),
        "cut at the first head's deadline: closed after {held:?}"
    );
    assert!(held < Duration::from_secs(5), "held {held:?}");
}

/// `resources/subscribe` sends the updates a router tells for that URI (the
/// kv router on `put`, here from another session) to the session's GET
/// stream; an unsubscribed URI's updates do not come.
#[test]
fn a_subscribed_resource_s_updates_reach_the_get_stream() {
    let b = broker();
    let mut c = Conn::connect(b.http);
    let s = c.initialize("2025-11-25");
    for (id, uri) in [(1, "kv://a"), (2, "kv://b")] {
        let r = c.call(
            &s,
            id,
            "resources/subscribe",
            &format!(r#"{{"uri":"{uri}"}}"#),
        );
        assert!(r["result"].is_object(), "{r}");
    }
    let mut g = Conn::connect(b.http);
    g.send_raw(
        format!("GET /mcp HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\nMcp-Session-Id: {s}\r\n\r\n")
            .as_bytes(),
    );
    assert_eq!(g.read_head().0, 200);
    let put = |c: &mut Conn, s: &str, id: u64, key: &str| {
        let r = c.call(
            s,
            id,
            "tools/call",
            &format!(r#"{{"name":"put","arguments":{{"key":"{key}","value":1}}}}"#),
        );
        assert_eq!(r["result"]["isError"], false, "{r}");
    };
    let updated = |g: &mut Conn| {
        let (body, ended) = g.read_chunked(Some(&|t: &str| t.contains("resources/updated")));
        assert!(!ended);
        let text = String::from_utf8(body).unwrap();
        let msgs = common::http::sse_messages(&text);
        let n = msgs.last().unwrap();
        assert_eq!(n["method"], "notifications/resources/updated", "{n}");
        (n["params"]["uri"].as_str().unwrap().to_owned(), text)
    };
    // `kv` is session-affine: another session's `kv://a` is another state,
    // and its write is not this session's to hear (it used to be told).
    let mut w = Conn::connect(b.http);
    let other = w.initialize("2025-11-25");
    put(&mut w, &other, 1, "a");
    // This session's own writes, from another connection, are told: the
    // first thing on the stream is the second write's.
    let mut mine = Conn::connect(b.http);
    put(&mut mine, &s, 2, "c");
    put(&mut mine, &s, 3, "b");
    let (uri, text) = updated(&mut g);
    assert_eq!(uri, "kv://b", "{text}");
    assert!(
        !text.contains("kv://a") && !text.contains("kv://c"),
        "{text}"
    );
    put(&mut mine, &s, 4, "a");
    assert_eq!(updated(&mut g).0, "kv://a");
}

/// Connections past `http.max_connections_per_shard` (and gRPC's
/// `grpc.max_connections`) are closed at once and counted, where they were
/// only logged, a line each; the ones within the bound are served.
#[test]
fn connections_past_the_http_and_grpc_bounds_are_closed_and_counted() {
    let toml = common::with_http_keys(
        &common::default_with_chaos(),
        "max_connections_per_shard = 2\n",
    )
    .replace("\nmax_connections = 10000\n", "\nmax_connections = 1\n");
    let b = Broker::start_with_config(&toml, &["--shards", "1"]);
    // Closed at once: the read ends (EOF or a reset) without an answer.
    let closed = |addr| {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let _ = s.write_all(b"POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n");
        let mut buf = [0u8; 64];
        match s.read(&mut buf) {
            Ok(n) => assert_eq!(n, 0, "answered: {:?}", String::from_utf8_lossy(&buf[..n])),
            Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}"),
        }
    };
    let mut a = Conn::connect(b.http);
    let s1 = a.initialize("2025-11-25");
    let mut c = Conn::connect(b.http);
    let s2 = c.initialize("2025-11-25");
    closed(b.http);
    assert_eq!(b.metric_sum("mcp_http_connections_refused_total"), 1.0);
    for (conn, s) in [(&mut a, &s1), (&mut c, &s2)] {
        let r = conn.call(s, 1, "tools/call", r#"{"name":"echo","arguments":{}}"#);
        assert!(r["result"].is_object(), "{r}");
    }
    // gRPC: one connection held open (its slot is taken at the accept),
    // then a second.
    let held = std::net::TcpStream::connect(b.grpc).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    closed(b.grpc);
    assert_eq!(b.metric_sum("mcp_grpc_connections_refused_total"), 1.0);
    // What is open, in gauges that come down when it closes (the leak
    // audit could tell a counting leak only by running into a bound).
    assert_eq!(b.metric_sum("mcp_http_connections_open"), 2.0);
    assert_eq!(b.metric_sum("mcp_grpc_connections_open"), 1.0);
    assert_eq!(b.metric_sum("mcp_http_sessions"), 2.0);
    drop((a, c, held));
    assert!(common::http::eventually(Duration::from_secs(5), || {
        b.metric_sum("mcp_http_connections_open") == 0.0
            && b.metric_sum("mcp_grpc_connections_open") == 0.0
    }));
    // Sessions outlive their connections.
    assert_eq!(b.metric_sum("mcp_http_sessions"), 2.0);
}

/// A session holds what it subscribes to for its life: a URI over 2048
/// bytes is refused with -32602, as on the frame and gRPC edges and in
/// 2026-07-28's listen, where it used to be held whatever its size (4 MiB
/// URIs, 64 a session).
#[test]
fn a_subscription_uri_over_2048_bytes_is_refused() {
    let b = broker();
    let mut c = Conn::connect(b.http);
    let s = c.initialize("2025-11-25");
    let uri = |len: usize| format!("kv://{}", "k".repeat(len - "kv://".len()));
    let r = c.call(
        &s,
        1,
        "resources/subscribe",
        &format!(r#"{{"uri":"{}"}}"#, uri(2048)),
    );
    assert!(r["result"].is_object(), "{r}");
    let r = c.call(
        &s,
        2,
        "resources/subscribe",
        &format!(r#"{{"uri":"{}"}}"#, uri(2049)),
    );
    assert_eq!(r["error"]["code"], -32602, "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("at most 2048 bytes"),
        "{r}"
    );
}

#[test]
fn the_get_stream_is_primed_kept_alive_and_resumable() {
    let b = with_http("sse_keepalive = \"100ms\"\n");
    let mut c = Conn::connect(b.http);
    let s = c.initialize("2025-11-25");
    let mut g = Conn::connect(b.http);
    g.send_raw(
        format!("GET /mcp HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\nMcp-Session-Id: {s}\r\n\r\n")
            .as_bytes(),
    );
    let (status, headers) = g.read_head();
    assert_eq!(status, 200);
    assert!(
        headers
            .iter()
            .any(|(k, v)| k.eq_ignore_ascii_case("content-type") && v == "text/event-stream")
    );
    let (body, ended) = g.read_chunked(Some(&|t: &str| t.contains(": keep-alive")));
    assert!(!ended);
    let text = String::from_utf8(body).unwrap();
    // The priming event: an id and empty data, before anything else.
    let first = text.split("\n\n").next().unwrap();
    assert!(
        first.starts_with("id: ") && first.ends_with("data: "),
        "{text:?}"
    );
    let event_id = first.lines().next().unwrap()[4..].to_string();
    let get_streams = || b.metric_where("mcp_http_streams_open", &[r#"kind="session_get""#]);
    assert_eq!(get_streams(), 1.0);
    // Reconnect with Last-Event-ID: the stream resumes, nothing missed,
    // not even a notice sent while no client was attached (the stream
    // used to end with its client: what came meanwhile was dropped, and
    // the resumption ended at once).
    let r = c.call(&s, 1, "resources/subscribe", r#"{"uri":"kv://r"}"#);
    assert!(r["result"].is_object(), "{r}");
    drop(g);
    assert!(common::http::eventually(Duration::from_secs(5), || {
        get_streams() == 0.0
    }));
    // Past a keep-alive: the stream's task has seen its client go.
    std::thread::sleep(Duration::from_millis(300));
    let r = c.call(
        &s,
        2,
        "tools/call",
        r#"{"name":"put","arguments":{"key":"r","value":1}}"#,
    );
    assert_eq!(r["result"]["isError"], false, "{r}");
    let mut g = Conn::connect(b.http);
    g.send_raw(
        format!("GET /mcp HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\nMcp-Session-Id: {s}\r\nLast-Event-ID: {event_id}\r\n\r\n")
            .as_bytes(),
    );
    let (status, _) = g.read_head();
    assert_eq!(status, 200);
    let (body, ended) = g.read_chunked(Some(&|t: &str| t.contains("resources/updated")));
    assert!(!ended, "{}", String::from_utf8_lossy(&body));
    let (_, ended) = g.read_chunked(Some(&|t: &str| t.contains(": keep-alive")));
    assert!(!ended);
    // An unknown stream cannot be resumed.
    let r = c.request(
        "GET",
        "/mcp",
        &[
            ("Accept", "text/event-stream"),
            ("Mcp-Session-Id", &s),
            ("Last-Event-ID", "999-1"),
        ],
        b"",
    );
    assert_eq!(r.status, 404);
    // DELETE ends the session, and its open stream ends.
    let r = c.request("DELETE", "/mcp", &[("Mcp-Session-Id", &s)], b"");
    assert_eq!(r.status, 200);
    let (_, ended) = g.read_chunked(None);
    assert!(ended);
    assert!(common::http::eventually(Duration::from_secs(5), || {
        b.metric_sum("mcp_http_streams_open") == 0.0
    }));
}

#[test]
fn notifications_cancelled_stops_the_call_in_the_guest() {
    let b = broker();
    let mut c = Conn::connect(b.http);
    let s = c.initialize("2025-06-18");
    let sid = s.clone();
    let addr = b.http;
    let t0 = Instant::now();
    let call = std::thread::spawn(move || {
        let mut c = Conn::connect(addr);
        c.post(
            Some(&sid),
            r#"{"jsonrpc":"2.0","id":"slow","method":"tools/call","params":{"name":"spin","arguments":{"ms":1500}}}"#,
        )
    });
    std::thread::sleep(Duration::from_millis(300));
    let r = c.post(
        Some(&s),
        r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"slow","reason":"user"}}"#,
    );
    assert_eq!(r.status, 202);
    let r = call.join().unwrap();
    assert!(
        t0.elapsed() < Duration::from_millis(1400),
        "{:?}",
        t0.elapsed()
    );
    let v = r.json();
    assert_eq!(v["id"], "slow");
    assert_eq!(v["error"]["code"], -32800, "{v}");
    // Counted as the client was answered: cancelled (it read
    // invalid_request, the run's own frame).
    let calls = |outcome: &str| b.requests("http", "call_tool", outcome);
    assert_eq!((calls("cancelled"), calls("invalid_request")), (1.0, 0.0));
    // The session goes on.
    let v = c.call(&s, 2, "ping", "{}");
    assert_eq!(v["result"], json!({}));
}

/// A client that resets its connection mid-call leaves no id in flight:
/// the id was taken for the session's life, and each one leaked memory.
#[test]
fn a_call_whose_client_went_away_leaves_its_id_free() {
    let b = broker();
    let mut c = Conn::connect(b.http);
    let s = c.initialize("2025-06-18");
    let call = r#"{"jsonrpc":"2.0","id":"gone","method":"tools/call","params":{"name":"sleep","arguments":{"ms":1500}}}"#;
    let mut gone = std::net::TcpStream::connect(b.http).unwrap();
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nMcp-Session-Id: {s}\r\n\
         MCP-Protocol-Version: 2025-06-18\r\nContent-Length: {}\r\n\r\n",
        call.len()
    );
    std::io::Write::write_all(&mut gone, format!("{head}{call}").as_bytes()).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    // A reset, not a close: SO_LINGER 0.
    socket2::SockRef::from(&gone)
        .set_linger(Some(Duration::ZERO))
        .unwrap();
    drop(gone);
    // The id is free again once the broker has seen the reset (well before
    // the abandoned sleep would have ended).
    let t0 = Instant::now();
    let quick = r#"{"jsonrpc":"2.0","id":"gone","method":"tools/call","params":{"name":"echo","arguments":{}}}"#;
    assert!(
        eventually(Duration::from_secs(5), || {
            c.post(Some(&s), quick).json()["result"].is_object()
        }),
        "the id stayed in flight"
    );
    assert!(
        t0.elapsed() < Duration::from_millis(1200),
        "{:?}",
        t0.elapsed()
    );
}

#[test]
fn an_elicitation_without_the_client_capability_is_refused_clearly() {
    let b = broker();
    let mut c = Conn::connect(b.http);
    let r = c.post(
        None,
        r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#,
    );
    let s = r.header("mcp-session-id").unwrap().to_string();
    let r = c.post(
        Some(&s),
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"elicit","arguments":{}}}"#,
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    let msgs = r.sse_messages();
    let last = msgs.last().unwrap();
    assert_eq!(last["id"], 1);
    assert!(
        last["error"]["message"]
            .as_str()
            .unwrap()
            .contains("elicitation"),
        "{last}"
    );
    // Counted with the refusal the client got, not the router's question.
    let calls = |outcome: &str| b.requests("http", "call_tool", outcome);
    assert_eq!((calls("invalid_request"), calls("ok")), (1.0, 0.0));
}

#[test]
fn sessions_are_capped_and_idle_ones_expire() {
    let b = with_http("max_sessions = 2\nsession_idle_timeout = \"300ms\"\n");
    let mut c = Conn::connect(b.http);
    let s1 = c.initialize("2025-06-18");
    let _s2 = c.initialize("2025-06-18");
    let r = c.post(
        None,
        r#"{"jsonrpc":"2.0","id":"init-42","method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#,
    );
    assert_eq!(r.status, 503, "{}", r.text());
    assert!(r.header("retry-after").is_some());
    // The request was read: its refusal names it (it said `null`).
    assert_eq!(r.json()["id"], "init-42", "{}", r.text());
    assert_eq!(r.json()["error"]["code"], -32000, "{}", r.text());
    let inits = |outcome: &str| b.requests("http", "initialize", outcome);
    assert_eq!((inits("ok"), inits("overloaded")), (2.0, 1.0));
    // Polled less often than the timeout: each request keeps it alive.
    assert!(eventually(Duration::from_secs(10), || {
        std::thread::sleep(Duration::from_millis(600));
        c.post(Some(&s1), r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#)
            .status
            == 404
    }));
    // Expired sessions free their places.
    c.initialize("2025-06-18");
}

/// A `sleep` of `ms` called as request `id` in a new session, on a
/// connection of its own in a thread: its reply, once it comes.
fn sleep_in_background(
    b: &Broker,
    id: u32,
    ms: u32,
) -> std::thread::JoinHandle<common::http::Reply> {
    let mut c = Conn::connect(b.http);
    let s = c.initialize("2025-06-18");
    let addr = b.http;
    std::thread::spawn(move || {
        let mut c = Conn::connect(addr);
        c.post(
            Some(&s),
            &format!(
                r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"sleep","arguments":{{"ms":{ms}}}}}}}"#
            ),
        )
    })
}

#[test]
fn a_drain_finishes_the_http_call_in_flight_and_refuses_new_work() {
    let mut b = broker();
    let call = sleep_in_background(&b, 7, 500);
    std::thread::sleep(Duration::from_millis(150));
    let status = b.terminate(Duration::from_secs(20));
    assert!(status.success(), "{status:?}");
    let r = call.join().unwrap();
    let v = r.json();
    assert_eq!(v["id"], 7);
    assert!(
        v["result"]["content"][0]["text"]
            .as_str()
            .is_some_and(|t| t.contains("slept")),
        "{v}"
    );
}

#[test]
fn a_call_still_running_at_the_drain_deadline_is_answered_shutting_down() {
    // It once got no answer at all: the shard closed the connection one
    // second after the deadline, and the Python SDK failed its session with
    // "Server disconnected without sending a response".
    let cfg = common::default_with_chaos()
        .replace("drain_timeout = \"10s\"", "drain_timeout = \"500ms\"");
    let (mut b, log) = Broker::start_logged(&cfg, &[]);
    let call = sleep_in_background(&b, 8, 10_000);
    std::thread::sleep(Duration::from_millis(300));
    let status = b.terminate(Duration::from_secs(20));
    assert!(status.success(), "{status:?}");
    // The log says the drain cut a call (it said "drained" either way).
    log.shows("drained", Duration::from_secs(5));
    let text = log.text();
    assert!(
        text.lines().any(|l| l.contains("WARN")
            && l.contains("drained: calls still running")
            && l.contains("cut_short=1")),
        "{text}"
    );
    let r = call.join().unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(
        (v["id"].clone(), v["error"]["code"].clone()),
        (json!(8), json!(-32004)),
        "{v}"
    );
}

/// The broker serving the `conformance` router (which elicits and reports
/// progress), with `keys` in its `[http]` table.
fn conformance(keys: &str) -> Broker {
    let toml = include_str!("fixtures/conformance.toml");
    Broker::start_with_config(&common::with_http_keys(toml, keys), &[])
}

/// POSTs `body` and returns the connection with the SSE answer's head read.
fn open_stream(b: &Broker, session: &str, body: &str) -> Conn {
    Conn::open_sse(b.http, &format!("Mcp-Session-Id: {session}\r\n"), body)
}

/// Reads an SSE answer to its end: its last message (the final answer), and
/// the whole text.
fn final_message(stream: &mut Conn) -> (serde_json::Value, String) {
    let (rest, ended) = stream.read_chunked(None);
    assert!(ended, "the stream ends with the answer");
    let text = String::from_utf8(rest).unwrap();
    let fin = common::http::sse_messages(&text).pop().expect("an answer");
    (fin, text)
}

/// Reads an SSE answer up to the broker's next request to the client (one
/// naming `method`), and returns that request.
fn next_ask(stream: &mut Conn, method: &str) -> serde_json::Value {
    let (body, ended) = stream.read_chunked(Some(&|t: &str| t.contains(method)));
    assert!(!ended, "the stream ended before asking {method}");
    let ask = common::http::sse_messages(&String::from_utf8(body).unwrap())
        .pop()
        .expect("a request");
    assert_eq!(ask["method"], method, "{ask}");
    ask
}

/// `fin` is the error `code`, its message saying `says`.
fn stream_error(fin: &serde_json::Value, code: i64, says: &str) {
    assert_eq!(fin["error"]["code"], code, "{fin}");
    assert!(
        fin["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains(says)),
        "{fin}"
    );
}

#[test]
fn an_elicitation_round_trip_ends_in_the_tools_result_on_the_same_stream() {
    let b = conformance("");
    let mut c = Conn::connect(b.http);
    let s = c.initialize("2025-06-18");
    let mut stream = open_stream(&b, &s, &elicitation_call(5));
    let ask = next_ask(&mut stream, "elicitation/create");
    assert!(ask["params"]["requestedSchema"].is_object(), "{ask}");
    let post_streams = || b.metric_where("mcp_http_streams_open", &[r#"kind="session_post""#]);
    assert_eq!(post_streams(), 1.0);
    // The answer arrives on another connection (any shard), as 202.
    accept_and_finish(&mut c, &s, &ask, &mut stream, 5);
    // The stream ended with the tool's result: no longer open, though its
    // connection is.
    assert!(common::http::eventually(Duration::from_secs(5), || {
        post_streams() == 0.0
    }));
}

/// A `tools/call` of the conformance router's `test_elicitation`, as
/// request `id`.
fn elicitation_call(id: u64) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"test_elicitation","arguments":{{"message":"Who are you?"}}}}}}"#
    )
}

/// Accepts elicitation `ask` (a POST on `c`, 202), then reads `stream` to
/// its end: its final answer is request `id`'s result.
fn accept_and_finish(c: &mut Conn, s: &str, ask: &serde_json::Value, stream: &mut Conn, id: u64) {
    let answer = json!({"jsonrpc":"2.0","id":ask["id"],"result":{"action":"accept","content":{"username":"ada","email":"ada@example.com"}}});
    let r = c.post(Some(s), &answer.to_string());
    assert_eq!(r.status, 202, "{}", r.text());
    let (fin, _) = final_message(stream);
    assert_eq!(fin["id"], id, "{fin}");
    assert!(fin["result"].to_string().contains("accept"), "{fin}");
}

/// A call that asks the client twice runs its tool three times, and is one
/// request: counted once, with the answer that ended it (each round was
/// counted, and an answer the edge wrote itself never was).
#[test]
fn a_call_that_asks_the_client_counts_once_with_its_final_answer() {
    let b = conformance("");
    let mut c = Conn::connect(b.http);
    let s = c.initialize("2025-06-18");
    let calls = |outcome: &str| b.requests("http", "call_tool", outcome);
    let body = r#"{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"test_input_required_result_multi_round","arguments":{}}}"#;
    let mut stream = open_stream(&b, &s, body);
    for answer in [json!({"name": "Ada"}), json!({"color": "blue"})] {
        let ask = next_ask(&mut stream, "elicitation/create");
        let reply =
            json!({"jsonrpc":"2.0","id":ask["id"],"result":{"action":"accept","content":answer}});
        assert_eq!(c.post(Some(&s), &reply.to_string()).status, 202);
    }
    let (fin, _) = final_message(&mut stream);
    assert!(fin["result"].is_object(), "{fin}");
    assert_eq!(calls("ok"), 1.0);
    // Ended by the edge, on the client's refusal to answer: counted once,
    // as that answer.
    let mut stream = open_stream(&b, &s, &body.replace(":9,", ":10,"));
    let ask = next_ask(&mut stream, "elicitation/create");
    let refusal = json!({"jsonrpc":"2.0","id":ask["id"],"error":{"code":-1,"message":"no"}});
    assert_eq!(c.post(Some(&s), &refusal.to_string()).status, 202);
    let (fin, _) = final_message(&mut stream);
    let code = fin["error"]["code"].as_i64().expect("an error");
    assert_eq!(calls("ok"), 1.0, "{fin}");
    let all = b.metric_where(
        "mcp_requests_total",
        &["edge=\"http\"", "kind=\"call_tool\""],
    );
    assert_eq!(all, 2.0, "{fin}: code {code}");
}

/// A session with more than 16 requests on their streams at once keeps
/// every one: the 16 streams kept for resumption once made room by dropping
/// the oldest stream, open or not, and that request's answer was lost (a
/// TypeScript SDK client with 17 calls running lost the first).
#[test]
fn more_than_sixteen_open_streams_in_a_session_all_get_their_answers() {
    let b = conformance("");
    let mut c = Conn::connect(b.http);
    let s = c.initialize("2025-06-18");
    let mut open = Vec::new();
    for id in 1..=20 {
        let mut stream = open_stream(&b, &s, &elicitation_call(id));
        let ask = next_ask(&mut stream, "elicitation/create");
        open.push((id, stream, ask));
    }
    for (id, mut stream, ask) in open {
        accept_and_finish(&mut c, &s, &ask, &mut stream, id);
    }
}

/// A session ended (DELETE) while a call waits for the client's answer:
/// the request still gets its one final answer. Ending the session once
/// cut every stream before the waiting call wrote it, and the client
/// waited for its own timeout.
#[test]
fn a_question_pending_when_its_session_is_deleted_ends_its_request() {
    let b = conformance("");
    let mut c = Conn::connect(b.http);
    let s = c.initialize("2025-06-18");
    let mut stream = open_stream(&b, &s, &elicitation_call(3));
    next_ask(&mut stream, "elicitation/create");
    let r = c.request("DELETE", "/mcp", &[("Mcp-Session-Id", &s)], b"");
    assert_eq!(r.status, 200, "{}", r.text());
    let (fin, _) = final_message(&mut stream);
    assert_eq!(fin["id"], 3, "{fin}");
    // The DELETE cancelled the call (the client's own act: -32800).
    assert_eq!(
        fin["error"],
        json!({"code": -32800, "message": "request cancelled: the client ended its session"}),
        "{fin}"
    );
}

/// A call waiting for the client's answer when the drain deadline passes
/// gets its final answer, -32004, before the broker exits: its stream once
/// closed with none.
#[test]
fn a_question_unanswered_at_the_drain_deadline_ends_its_request() {
    let toml = format!(
        "[broker]\ndrain_grace = \"0s\"\ndrain_timeout = \"500ms\"\n\n{}",
        include_str!("fixtures/conformance.toml")
    );
    let mut b = Broker::start_with_config(&toml, &[]);
    let mut c = Conn::connect(b.http);
    let s = c.initialize("2025-06-18");
    let level = c.call(&s, 1, "logging/setLevel", r#"{"level":"warning"}"#);
    assert!(level["result"].is_object(), "{level}");
    let mut stream = open_stream(&b, &s, &elicitation_call(11));
    next_ask(&mut stream, "elicitation/create");
    let status = b.terminate(Duration::from_secs(20));
    assert!(status.success(), "{status:?}");
    let (fin, text) = final_message(&mut stream);
    assert_eq!(fin["id"], 11, "{fin}");
    stream_error(&fin, -32004, "drain deadline");
    // Written by the edge, and still as a router's failure is: with its
    // kind, and after the failure log the session's level asks for (both
    // were missing from the answers of the round trip to the client).
    assert_eq!(
        fin["error"]["data"],
        json!({"kind": "shutting_down", "retryable": true}),
        "{fin}"
    );
    let log = common::http::sse_messages(&text)
        .into_iter()
        .find(|m| m["method"] == "notifications/message")
        .unwrap_or_else(|| panic!("no failure log before the answer: {text}"));
    assert_eq!(log["params"]["data"]["code"], -32004, "{log}");
    assert_eq!(log["params"]["data"]["kind"], "shutting_down", "{log}");
}

/// A router's state (`mcp-broker/state` on its question) comes back with
/// each answer as `_request_state` in the session era too, where the
/// stream holds it: two questions in turn, the first answer kept in it,
/// never shown to the client.
#[test]
fn a_routers_state_comes_back_with_each_answer_on_the_stream() {
    let b = conformance("");
    let mut c = Conn::connect(b.http);
    let s = c.initialize("2025-06-18");
    let mut stream = open_stream(
        &b,
        &s,
        r#"{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"test_input_required_result_multi_round","arguments":{}}}"#,
    );
    for (question, answer) in [
        ("What is your name?", json!({"name": "Ada"})),
        ("What is your favourite colour?", json!({"color": "blue"})),
    ] {
        let ask = next_ask(&mut stream, "elicitation/create");
        assert_eq!(ask["params"]["message"], question, "{ask}");
        assert!(
            ask["params"].get("_meta").is_none(),
            "the state is not shown: {ask}"
        );
        let reply =
            json!({"jsonrpc":"2.0","id":ask["id"],"result":{"action":"accept","content":answer}});
        let r = c.post(Some(&s), &reply.to_string());
        assert_eq!(r.status, 202, "{}", r.text());
    }
    let (fin, _) = final_message(&mut stream);
    assert_eq!(fin["id"], 9, "{fin}");
    assert_eq!(
        fin["result"]["content"][0]["text"], "Hello, Ada! Your colour: blue",
        "{fin}"
    );
}

/// A tool that asks for the client's roots (`mcp-broker/roots`): the
/// broker sends `roots/list` on the request's stream and calls the tool
/// again with the answer as `_roots`; a client that did not declare the
/// `roots` capability is told so, and the question is never sent.
#[test]
fn a_roots_request_goes_to_the_client_on_the_stream_and_its_answer_to_the_tool() {
    let b = conformance("");
    let call = r#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"test_input_required_result_list_roots","arguments":{}}}"#;
    let mut c = Conn::connect(b.http);
    let s = c.initialize_with(
        r#"{"protocolVersion":"2025-06-18","capabilities":{"roots":{"listChanged":true}},"clientInfo":{"name":"t","version":"1"}}"#,
    );
    let mut stream = open_stream(&b, &s, call);
    let ask = next_ask(&mut stream, "roots/list");
    let reply = json!({"jsonrpc":"2.0","id":ask["id"],"result":{"roots":[{"uri":"file:///src"}]}});
    let r = c.post(Some(&s), &reply.to_string());
    assert_eq!(r.status, 202, "{}", r.text());
    let (fin, _) = final_message(&mut stream);
    assert_eq!(fin["id"], 4, "{fin}");
    assert_eq!(
        fin["result"]["content"][0]["text"], "Roots: file:///src",
        "{fin}"
    );

    // Without the capability: an error answer, and no roots/list sent.
    let s = c.initialize("2025-06-18");
    let mut stream = open_stream(&b, &s, call);
    let (fin, text) = final_message(&mut stream);
    assert!(!text.contains("roots/list\""), "{text}");
    stream_error(&fin, -32600, "roots");
}

#[test]
fn a_set_of_questions_goes_to_the_client_in_turn_and_its_answers_to_the_tool_together() {
    let b = conformance("");
    let call = r#"{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"test_input_required_result_multiple_inputs","arguments":{}}}"#;
    let mut c = Conn::connect(b.http);
    let s = c.initialize_with(
        r#"{"protocolVersion":"2025-06-18","capabilities":{"elicitation":{},"sampling":{},"roots":{}},"clientInfo":{"name":"t","version":"1"}}"#,
    );
    let mut stream = open_stream(&b, &s, call);
    // In the order the router wrote them (its JSON's keys sorted), each
    // once the one before is answered.
    let answers = [
        (
            "roots/list",
            json!({"roots":[{"uri":"file:///a"},{"uri":"file:///b"}]}),
        ),
        (
            "sampling/createMessage",
            json!({"role":"assistant","content":{"type":"text","text":"Hi there"},"model":"m"}),
        ),
        (
            "elicitation/create",
            json!({"action":"accept","content":{"name":"Ada"}}),
        ),
    ];
    for (method, result) in answers {
        let ask = next_ask(&mut stream, method);
        let reply = json!({"jsonrpc":"2.0","id":ask["id"],"result":result});
        assert_eq!(c.post(Some(&s), &reply.to_string()).status, 202);
    }
    let (fin, _) = final_message(&mut stream);
    assert_eq!(fin["id"], 8, "{fin}");
    assert_eq!(
        fin["result"]["content"][0]["text"], "Hello, Ada! Greeting: Hi there. Roots: 2",
        "{fin}"
    );

    // A client lacking one of the capabilities is asked nothing.
    let s = c.initialize_with(
        r#"{"protocolVersion":"2025-06-18","capabilities":{"elicitation":{},"roots":{}},"clientInfo":{"name":"t","version":"1"}}"#,
    );
    let mut stream = open_stream(&b, &s, call);
    let (fin, text) = final_message(&mut stream);
    assert!(!text.contains("roots/list"), "{text}");
    stream_error(&fin, -32600, "sampling");
}

#[test]
fn a_set_of_questions_that_cannot_be_asked_fails_the_call_on_its_stream() {
    let b = with_http("");
    let mut c = Conn::connect(b.http);
    let s = c.initialize_with(
        r#"{"protocolVersion":"2025-06-18","capabilities":{"elicitation":{},"sampling":{},"roots":{}},"clientInfo":{"name":"t","version":"1"}}"#,
    );
    let call = json!({"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"bad_set","arguments":{"set":r#"{"a":{"method":"roots/list"},"b":{"method":"ping"}}"#}}});
    let mut stream = open_stream(&b, &s, &call.to_string());
    let (fin, text) = final_message(&mut stream);
    // Asked whole or not at all: not even the valid first question went out.
    assert!(!text.contains("\"roots/list\",\"params"), "{text}");
    stream_error(&fin, -32603, "`bad_set`");
    stream_error(&fin, -32603, "method `ping`");
}

/// A question outlives its client's connection (the stream may be resumed
/// and the question answered): a client that asks and leaves, over and
/// over, is bounded per session, and the calls waiting count as in flight.
#[test]
fn questions_left_by_clients_that_went_away_are_bounded_and_counted() {
    let b = conformance("client_answer_timeout = \"60s\"");
    let mut c = Conn::connect(b.http);
    let s = c.initialize("2025-06-18");
    for id in 1..=32 {
        let mut stream = open_stream(&b, &s, &elicitation_call(id));
        next_ask(&mut stream, "elicitation/create");
        // The client goes, its question unanswered.
    }
    assert!(common::http::eventually(Duration::from_secs(5), || {
        b.metric_sum("mcp_in_flight_requests") == 32.0
    }));
    let mut stream = open_stream(&b, &s, &elicitation_call(33));
    let (fin, _) = final_message(&mut stream);
    assert_eq!(fin["id"], 33, "{fin}");
    stream_error(&fin, -32000, "32 questions to this client already wait");
}

#[test]
fn an_elicitation_the_client_never_answers_fails_at_the_timeout() {
    let b = conformance("client_answer_timeout = \"300ms\"");
    let mut c = Conn::connect(b.http);
    let s = c.initialize("2025-06-18");
    let mut stream = open_stream(&b, &s, &elicitation_call(6));
    let t0 = Instant::now();
    let (body, ended) = stream.read_chunked(None);
    assert!(ended);
    assert!(t0.elapsed() < Duration::from_secs(10));
    let msgs = common::http::sse_messages(&String::from_utf8(body).unwrap());
    let fin = msgs.last().unwrap();
    assert_eq!(fin["id"], 6);
    assert_eq!(fin["error"]["code"], -32001, "{fin}");
}

#[test]
fn progress_reaches_a_client_that_asked_for_it_before_the_result() {
    let b = conformance("");
    let mut c = Conn::connect(b.http);
    let s = c.initialize("2025-11-25");
    let mut stream = open_stream(
        &b,
        &s,
        r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"test_tool_with_progress","arguments":{},"_meta":{"progressToken":"tok-1"}}}"#,
    );
    let (body, ended) = stream.read_chunked(None);
    assert!(ended);
    let text = String::from_utf8(body).unwrap();
    // Primed first (2025-11-25), then progress, then the result.
    assert!(text.starts_with("id: "), "{text}");
    let msgs = common::http::sse_messages(&text);
    let progress: Vec<_> = msgs
        .iter()
        .filter(|m| m["method"] == "notifications/progress")
        .collect();
    assert!(progress.len() >= 2, "{msgs:?}");
    assert!(
        progress
            .iter()
            .all(|m| m["params"]["progressToken"] == "tok-1")
    );
    assert_eq!(msgs.last().unwrap()["id"], 7);
    assert!(msgs.last().unwrap()["result"].is_object());
    // Without a token the same call is one JSON answer.
    let v = c.call(
        &s,
        8,
        "tools/call",
        r#"{"name":"test_tool_with_progress","arguments":{}}"#,
    );
    assert!(v["result"].is_object(), "{v}");
}

/// A failed call in a session that asked for warnings is also logged, with
/// the broker's own code and kind beside its message; the answer keeps
/// MCP's code, which for an unknown tool is another one.
#[test]
fn a_failed_call_is_logged_with_the_brokers_code_and_kind() {
    let b = broker();
    let mut c = Conn::connect(b.http);
    let s = c.initialize("2025-06-18");
    c.call(&s, 1, "logging/setLevel", r#"{"level":"warning"}"#);
    let mut stream = open_stream(
        &b,
        &s,
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"nope","arguments":{}}}"#,
    );
    let (fin, text) = final_message(&mut stream);
    assert_eq!(fin["error"]["code"], -32602, "{text}");
    let msgs = common::http::sse_messages(&text);
    let log = msgs
        .iter()
        .find(|m| m["method"] == "notifications/message")
        .unwrap_or_else(|| panic!("no log event in {text}"));
    let d = &log["params"]["data"];
    assert_eq!(log["params"]["logger"], "mcp-broker", "{log}");
    assert_eq!(d["method"], "tools/call", "{log}");
    assert_eq!(d["kind"], "not_found", "{log}");
    assert_eq!(d["code"], mcp_schema::ErrorCode::NotFound.code(), "{log}");
}

#[test]
fn what_a_tool_logged_reaches_a_session_that_set_a_level_filtered_by_it() {
    let b = conformance("");
    let mut c = Conn::connect(b.http);
    let s = c.initialize("2025-06-18");
    let call = r#"{"name":"test_tool_with_logging","arguments":{}}"#;
    // No level set: one JSON answer, no logs, and no broker key in _meta.
    let v = c.call(&s, 1, "tools/call", call);
    assert!(v["result"]["content"].is_array(), "{v}");
    assert!(!v.to_string().contains("mcp-broker/log"), "{v}");
    // Level info: the three info messages, then the answer.
    c.call(&s, 2, "logging/setLevel", r#"{"level":"info"}"#);
    let mut stream = open_stream(
        &b,
        &s,
        &format!(r#"{{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{call}}}"#),
    );
    let (body, ended) = stream.read_chunked(None);
    assert!(ended);
    let msgs = common::http::sse_messages(&String::from_utf8(body).unwrap());
    let logs: Vec<_> = msgs
        .iter()
        .filter(|m| m["method"] == "notifications/message")
        .collect();
    assert_eq!(logs.len(), 3, "{msgs:?}");
    assert_eq!(logs[0]["params"]["level"], "info");
    assert_eq!(logs[0]["params"]["data"], "Tool execution started");
    assert_eq!(msgs.last().unwrap()["id"], 3);
    // Level error: info messages are filtered out.
    c.call(&s, 4, "logging/setLevel", r#"{"level":"error"}"#);
    let mut stream = open_stream(
        &b,
        &s,
        &format!(r#"{{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{call}}}"#),
    );
    let (body, _) = stream.read_chunked(None);
    let msgs = common::http::sse_messages(&String::from_utf8(body).unwrap());
    assert_eq!(msgs.len(), 1, "{msgs:?}");
    assert_eq!(msgs[0]["id"], 5);
}

/// A batched call that asks the client a question (sampling, roots, a set
/// of inputs, elicitation) cannot get its answer: a batch is answered as
/// JSON. It is told so as a tool error; its first result is never passed
/// off as final, and the broker's directives in `_meta` never leave.
#[test]
fn a_batched_call_that_asks_the_client_is_told_it_needs_its_own_stream() {
    let b = conformance("");
    let mut c = Conn::connect(b.http);
    let s = c.initialize_with(
        r#"{"protocolVersion":"2025-03-26","capabilities":{"sampling":{},"roots":{},"elicitation":{}},"clientInfo":{"name":"t","version":"1"}}"#,
    );
    for (i, (tool, args)) in [
        ("test_sampling", r#"{"prompt":"hi"}"#),
        ("test_input_required_result_list_roots", "{}"),
        ("test_input_required_result_multiple_inputs", "{}"),
        ("test_elicitation", r#"{"message":"hi"}"#),
    ]
    .into_iter()
    .enumerate()
    {
        let batch = format!(
            r#"[{{"jsonrpc":"2.0","id":{i},"method":"tools/call","params":{{"name":"{tool}","arguments":{args}}}}},{{"jsonrpc":"2.0","id":"p","method":"ping"}}]"#
        );
        let r = c.post(Some(&s), &batch);
        assert_eq!(r.status, 200, "{tool}: {}", r.text());
        let text = r.text();
        assert!(!text.contains("mcp-broker/"), "{tool}: {text}");
        let v = r.json();
        let a = v.as_array().unwrap();
        assert_eq!(a.len(), 2, "{tool}: {v}");
        assert_eq!(a[0]["id"], i, "{v}");
        assert_eq!(a[0]["result"]["isError"], true, "{tool}: {v}");
        let said = a[0]["result"]["content"][0]["text"].as_str().unwrap();
        assert!(said.contains("outside a batch"), "{tool}: {said}");
        assert_eq!(a[1]["result"], json!({}), "{v}");
    }
}

/// A client that drops its connection mid-call takes its request out of
/// `mcp_in_flight_requests`: the handler is dropped with the connection,
/// and the gauge used to keep one for each such call for ever.
#[test]
fn a_dropped_connection_leaves_nothing_in_flight() {
    let b = broker();
    let mut c = Conn::connect(b.http);
    let s = c.initialize("2025-06-18");
    for id in 0..3 {
        let mut t = TcpStream::connect(b.http).unwrap();
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"sleep","arguments":{{"ms":30000}}}}}}"#
        );
        write!(
            t,
            "POST /mcp HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n\
             Accept: application/json, text/event-stream\r\nMcp-Session-Id: {s}\r\n\
             Content-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        assert!(
            eventually(Duration::from_secs(10), || b
                .metric_sum("mcp_in_flight_requests")
                >= 1.0),
            "the call never started"
        );
        drop(t);
        // Long before the 30 s sleep could end by itself.
        assert!(
            eventually(Duration::from_secs(10), || b
                .metric_sum("mcp_in_flight_requests")
                == 0.0),
            "{} in flight after the client left",
            b.metric_sum("mcp_in_flight_requests")
        );
    }
}

/// A slow upload is the client's time, not a queue in the broker:
/// `mcp_queue_wait_seconds` stays at 0 for HTTP requests (it counted the
/// body's upload, and set McpRequestsQueued off on an idle shard), while
/// `mcp_request_duration_seconds` includes it, as documented.
#[test]
fn a_slow_body_is_no_queue_wait() {
    let b = broker();
    let mut c = Conn::connect(b.http);
    let s = c.initialize("2025-06-18");
    let body = r#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"echo_text","arguments":{"text":"slow"}}}"#;
    let mut t = TcpStream::connect(b.http).unwrap();
    write!(
        t,
        "POST /mcp HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nMcp-Session-Id: {s}\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(400));
    t.write_all(body.as_bytes()).unwrap();
    let mut answer = String::new();
    t.read_to_string(&mut answer).unwrap();
    assert!(answer.contains("slow"), "{answer}");
    // The shards hand their observations over as scrapes ask: wait until
    // the request is in.
    assert!(
        eventually(Duration::from_secs(10), || b
            .metric_sum("mcp_request_duration_seconds_sum")
            >= 0.3),
        "the upload is the request's time: {} s",
        b.metric_sum("mcp_request_duration_seconds_sum")
    );
    assert!(b.metric_sum("mcp_queue_wait_seconds_count") >= 1.0);
    let queued = b.metric_sum("mcp_queue_wait_seconds_sum");
    assert!(queued < 0.1, "{queued} s of queue wait for an idle shard");
}

/// A client that cancels while the broker waits for its answer to the
/// tool's question ends the request there (-32800): the cancel used to go
/// unheard, and the tool ran again when the answer came.
#[test]
fn a_cancel_while_the_client_is_asked_ends_the_request() {
    let b = conformance("");
    let mut c = Conn::connect(b.http);
    let s = c.initialize_with(
        r#"{"protocolVersion":"2025-06-18","capabilities":{"sampling":{},"elicitation":{}},"clientInfo":{"name":"t","version":"1"}}"#,
    );
    for (id, call, asks) in [
        (
            9,
            r#"{"name":"test_sampling","arguments":{"prompt":"Say hi"}}"#,
            "sampling/createMessage",
        ),
        (
            10,
            r#"{"name":"test_elicitation","arguments":{"message":"Who?"}}"#,
            "elicitation/create",
        ),
    ] {
        let mut stream = open_stream(
            &b,
            &s,
            &format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{call}}}"#),
        );
        let (_, ended) = stream.read_chunked(Some(&|t: &str| t.contains(asks)));
        assert!(!ended, "{asks}");
        let cancel = format!(
            r#"{{"jsonrpc":"2.0","method":"notifications/cancelled","params":{{"requestId":{id}}}}}"#
        );
        assert_eq!(c.post(Some(&s), &cancel).status, 202);
        let (fin, text) = final_message(&mut stream);
        assert_eq!(fin["id"], id, "{text}");
        assert_eq!(fin["error"]["code"], -32800, "{asks}: {text}");
    }
}

#[test]
fn a_sampling_request_round_trip_ends_in_the_tools_result_and_needs_the_capability() {
    let b = conformance("");
    let mut c = Conn::connect(b.http);
    let r = c.post(
        None,
        r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{"sampling":{}},"clientInfo":{"name":"t","version":"1"}}}"#,
    );
    let s = r.header("mcp-session-id").unwrap().to_string();
    let call = r#"{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"test_sampling","arguments":{"prompt":"Say hi"}}}"#;
    let mut stream = open_stream(&b, &s, call);
    let (body, ended) = stream.read_chunked(Some(&|t: &str| t.contains("sampling/createMessage")));
    assert!(!ended);
    let msgs = common::http::sse_messages(&String::from_utf8(body).unwrap());
    let ask = msgs.last().unwrap();
    assert_eq!(ask["method"], "sampling/createMessage", "{ask}");
    assert_eq!(ask["params"]["messages"][0]["content"]["text"], "Say hi");
    let answer = json!({"jsonrpc":"2.0","id":ask["id"],"result":{"role":"assistant","content":{"type":"text","text":"hi there"},"model":"m"}});
    assert_eq!(c.post(Some(&s), &answer.to_string()).status, 202);
    let (rest, ended) = stream.read_chunked(None);
    assert!(ended);
    let msgs = common::http::sse_messages(&String::from_utf8(rest).unwrap());
    let fin = msgs.last().unwrap();
    assert_eq!(
        fin["result"]["content"][0]["text"], "LLM response: hi there",
        "{fin}"
    );
    // A client without the sampling capability gets an error saying so.
    let s2 = c.initialize("2025-06-18");
    let mut stream = open_stream(&b, &s2, call);
    let (fin, text) = final_message(&mut stream);
    assert!(!text.contains("sampling/createMessage"), "{text}");
    stream_error(&fin, -32600, "sampling");
}

#[test]
fn a_peer_that_reads_nothing_is_cut_off_at_the_write_timeout() {
    let b = with_http("write_timeout = \"300ms\"");
    let mut c = Conn::connect(b.http);
    let s = c.initialize("2025-06-18");
    // Twenty pipelined calls whose answers (about 1 MB each) far exceed
    // what the sockets buffer, and a peer that reads none of them.
    let call = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"echo","arguments":{{"x":"{}"}}}}}}"#,
        "a".repeat(500_000)
    );
    let mut burst = Vec::new();
    for _ in 0..20 {
        burst.extend_from_slice(
            format!(
                "POST /mcp HTTP/1.1\r\nHost: x\r\nAccept: application/json, text/event-stream\r\nContent-Type: application/json\r\nMcp-Session-Id: {s}\r\nContent-Length: {}\r\n\r\n",
                call.len()
            )
            .as_bytes(),
        );
        burst.extend_from_slice(call.as_bytes());
    }
    let mut raw = c.stream.get_ref().try_clone().unwrap();
    let writer = std::thread::spawn(move || {
        // The broker stops reading once it is stuck writing: a write error
        // here is the close this test waits for.
        let _ = raw.write_all(&burst);
    });
    std::thread::sleep(Duration::from_secs(3));
    // Now read: the broker must have closed the connection (EOF), not kept
    // it waiting for the reader forever.
    let s = c.stream.get_mut();
    s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    let mut got = Vec::new();
    let end = s.read_to_end(&mut got);
    assert!(
        end.is_ok()
            || end
                .as_ref()
                .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionReset),
        "the connection was not closed: {end:?} after {} bytes",
        got.len()
    );
    let answers = String::from_utf8_lossy(&got)
        .matches("HTTP/1.1 200")
        .count();
    assert!(answers < 20, "{answers} answers: nothing was cut off");
    writer.join().unwrap();
    assert_eq!(b.metric_sum("mcp_http_write_timeouts_total"), 1.0);
    // The edge still serves others.
    Conn::connect(b.http).initialize("2025-06-18");
}

/// A page on an accepted origin (a loopback one, or one of
/// `http.allowed_origins`) can use the endpoint from a browser: its
/// preflight is answered, and every answer names the origin and shows the
/// session id. Other origins get no CORS headers, and 403 as before.
#[test]
fn cors_lets_accepted_origins_in_and_no_other() {
    let b = with_http(r#"allowed_origins = ["https://app.example"]"#);
    let mut c = Conn::connect(b.http);
    for origin in ["http://localhost:6274", "https://app.example"] {
        let r = c.request(
            "OPTIONS",
            "/mcp",
            &[
                ("Origin", origin),
                ("Access-Control-Request-Method", "POST"),
                (
                    "Access-Control-Request-Headers",
                    "authorization, content-type, mcp-session-id, mcp-param-region",
                ),
            ],
            b"",
        );
        assert_eq!(r.status, 204, "{origin}: {}", r.text());
        assert_eq!(r.header("access-control-allow-origin"), Some(origin));
        assert_eq!(
            r.header("access-control-allow-methods"),
            Some("GET, POST, DELETE")
        );
        // Every header MCP's clients send, whatever this request asked
        // (a browser keeps one answer per URL: a page alternating between
        // header sets preflighted nearly every request), and what it asked.
        let allowed = r.header("access-control-allow-headers").unwrap();
        for name in [
            "Accept",
            "Authorization",
            "Content-Type",
            "Last-Event-ID",
            "Mcp-Method",
            "Mcp-Name",
            "Mcp-Protocol-Version",
            "Mcp-Session-Id",
            "mcp-param-region",
        ] {
            assert!(allowed.split(", ").any(|a| a == name), "{name}: {allowed}");
        }
        assert!(r.header("access-control-max-age").is_some());
        // The request itself: the page may read the answer and the session
        // id it must send back.
        let r = c.request(
            "POST",
            "/mcp",
            &[ACCEPT_BOTH, JSON, ("Origin", origin)],
            br#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#,
        );
        assert_eq!(r.status, 200, "{}", r.text());
        assert!(r.header("mcp-session-id").is_some());
        assert_eq!(r.header("access-control-allow-origin"), Some(origin));
        let exposed = r.header("access-control-expose-headers").unwrap();
        for name in ["Mcp-Session-Id", "WWW-Authenticate", "Retry-After", "Allow"] {
            assert!(exposed.contains(name), "{name}: {exposed}");
        }
        assert_eq!(r.header("vary"), Some("Origin"));
    }
    // Only header names are taken from what was asked: no echo of junk.
    let r = c.request(
        "OPTIONS",
        "/mcp",
        &[
            ("Origin", "https://app.example"),
            ("Access-Control-Request-Method", "POST"),
            (
                "Access-Control-Request-Headers",
                r#",,, bad header, "q", x:y, mcp-param-a,"#,
            ),
        ],
        b"",
    );
    let allowed = r.header("access-control-allow-headers").unwrap();
    assert!(allowed.ends_with(", mcp-param-a"), "{allowed}");
    for junk in ["bad header", "\"q\"", "x:y", ",,"] {
        assert!(!allowed.contains(junk), "{junk}: {allowed}");
    }
    // A preflight that asks for no header is told MCP's own.
    let r = c.request(
        "OPTIONS",
        "/mcp",
        &[
            ("Origin", "https://app.example"),
            ("Access-Control-Request-Method", "GET"),
        ],
        b"",
    );
    assert_eq!(r.status, 204, "{}", r.text());
    assert!(
        r.header("access-control-allow-headers")
            .is_some_and(|h| h.contains("Last-Event-ID") && h.contains("Mcp-Session-Id"))
    );
    // Another origin: 403 to the preflight and the request, no CORS header.
    for (method, body) in [("OPTIONS", &b""[..]), ("POST", &b"{}"[..])] {
        let r = c.request(
            method,
            "/mcp",
            &[
                ACCEPT_BOTH,
                JSON,
                ("Origin", "https://evil.example"),
                ("Access-Control-Request-Method", "POST"),
            ],
            body,
        );
        assert_eq!(r.status, 403, "{method}: {}", r.text());
        assert!(r.header("access-control-allow-origin").is_none());
    }
    // No Origin (not a browser): no CORS headers; and an OPTIONS that is
    // no preflight is answered with what the endpoint takes (RFC 9110
    // §9.3.7), not as a preflight.
    let r = c.request(
        "POST",
        "/mcp",
        &[ACCEPT_BOTH, JSON],
        br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#,
    );
    assert!(r.header("access-control-allow-origin").is_none());
    // Still `Vary: Origin`: a shared cache must not hand this answer
    // (without CORS headers) to a page.
    assert_eq!(r.header("vary"), Some("Origin"));
    let r = c.request("OPTIONS", "/mcp", &[("Origin", "https://app.example")], b"");
    assert_eq!(r.status, 204, "{}", r.text());
    assert_eq!(r.header("allow"), Some("GET, POST, DELETE, OPTIONS"));
    assert!(r.header("access-control-allow-methods").is_none());
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("https://app.example")
    );
}

/// An HTTP/2 client with prior knowledge (h2c, or a gRPC client pointed at
/// this port) got a bare close, which it reports as a reset connection.
/// It gets the server preface, its request (if it sent one) reset, and
/// GOAWAY with a reason; and the edge serves HTTP/1.1 on. (A GOAWAY alone
/// left grpcio holding its call for a retry until its deadline.)
#[test]
fn an_http2_client_with_prior_knowledge_is_told_http_1_1_is_required() {
    let b = broker();
    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0";
    // Frames: (type, stream, payload).
    let frames = |got: &[u8]| {
        let mut out = Vec::new();
        let mut at = 0;
        while at + 9 <= got.len() {
            let len = u32::from_be_bytes([0, got[at], got[at + 1], got[at + 2]]) as usize;
            let stream = u32::from_be_bytes(got[at + 5..at + 9].try_into().unwrap());
            out.push((got[at + 3], stream, got[at + 9..at + 9 + len].to_vec()));
            at += 9 + len;
        }
        assert_eq!(at, got.len(), "whole frames: {got:?}");
        out
    };
    let exchange = |sent: &[u8]| {
        let mut s = TcpStream::connect(b.http).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(sent).unwrap();
        let mut got = Vec::new();
        s.read_to_end(&mut got).unwrap();
        frames(&got)
    };
    let goaway = |payload: &[u8], last: u32| {
        assert_eq!(&payload[..4], &last.to_be_bytes(), "last stream");
        assert_eq!(&payload[4..8], &[0, 0, 0, 1], "PROTOCOL_ERROR");
        let reason = String::from_utf8_lossy(&payload[8..]);
        assert!(reason.contains("HTTP/1.1 only"), "{reason}");
    };
    // The preface alone: SETTINGS (empty), then GOAWAY, no stream taken.
    let f = exchange(PREFACE);
    assert_eq!(f.len(), 2, "{f:?}");
    assert_eq!((f[0].0, f[0].1, f[0].2.len()), (0x4, 0, 0), "SETTINGS");
    assert_eq!((f[1].0, f[1].1), (0x7, 0), "GOAWAY");
    goaway(&f[1].2, 0);
    // With a request (HEADERS on stream 1, END_HEADERS): it is reset, and
    // the GOAWAY names it.
    let mut with_request = PREFACE.to_vec();
    with_request.extend_from_slice(&[0, 0, 1, 0x1, 0x4, 0, 0, 0, 1, 0x82]);
    let f = exchange(&with_request);
    assert_eq!(f.len(), 3, "{f:?}");
    assert_eq!((f[0].0, f[0].2.len()), (0x4, 0), "SETTINGS");
    assert_eq!(
        (f[1].0, f[1].1, &f[1].2[..]),
        (0x3, 1, &[0, 0, 0, 1][..]),
        "RST_STREAM"
    );
    assert_eq!((f[2].0, f[2].1), (0x7, 0), "GOAWAY");
    goaway(&f[2].2, 1);
    // HTTP/1.1 is served as before.
    let mut c = Conn::connect(b.http);
    c.initialize("2025-11-25");
}

/// The reference gRPC client (Python `grpcio`, as `scripts/setup` installs
/// it) pointed at the HTTP port by mistake: its call fails at once, and
/// the client process lives. A GOAWAY alone held the call until its
/// deadline; one with HTTP_1_1_REQUIRED on a live stream aborted grpcio.
#[test]
fn a_grpc_client_at_the_http_port_fails_at_once() {
    let b = broker();
    let script = r#"
import sys, time, grpc
ch = grpc.insecure_channel(sys.argv[1])
call = ch.unary_unary("/mcp.v1.McpService/Ping", request_serializer=lambda x: x, response_deserializer=lambda x: x)
t = time.time()
try:
    call(b"", timeout=20)
    print("answered")
except grpc.RpcError as e:
    print(e.code().name, round(time.time() - t, 2))
"#;
    let out = std::process::Command::new("python3")
        .args(["-c", script, &b.http.to_string()])
        .output()
        .expect("python3 with grpcio (scripts/setup)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{:?}: {stdout}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let (code, secs) = stdout.trim().split_once(' ').expect("a failed call");
    assert_ne!(code, "DEADLINE_EXCEEDED", "{stdout}");
    assert!(secs.parse::<f64>().unwrap() < 5.0, "{stdout}");
}
