//! Protocol 2026-07-28 on the MCP HTTP edge, over raw sockets against the
//! real binary: era selection, `server/discover`, stateless serving, the
//! validation order (`_meta` → headers → version → method), the
//! `=?base64?…?=` header encoding, and multi round-trip elicitation.

mod common;

use common::Broker;
use common::http::{ACCEPT_BOTH, Conn, JSON, Reply};
use serde_json::{Value, json};

const V: &str = "2026-07-28";

/// The broker on the embedded default plus `chaos` (whose `elicit` tool
/// never finishes) and `conformance` (whose `test_elicitation` does).
fn broker() -> Broker {
    let toml = format!(
        "{}\n[[routers]]\nname = \"conformance\"\nwasm = \"conformance.wasm\"\n",
        common::default_with_chaos()
    );
    Broker::start_with_config(&toml, &[])
}

/// The `_meta` every modern request carries, declaring `caps`.
fn meta(caps: &str) -> String {
    format!(
        r#""_meta":{{"io.modelcontextprotocol/protocolVersion":"{V}","io.modelcontextprotocol/clientCapabilities":{caps},"io.modelcontextprotocol/clientInfo":{{"name":"t","version":"1"}}}}"#
    )
}

/// A request whose params are `_meta` (declaring elicitation) plus `rest`.
fn req(id: &str, method: &str, rest: &str) -> String {
    let sep = if rest.is_empty() { "" } else { "," };
    format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"{method}","params":{{{}{sep}{rest}}}}}"#,
        meta(r#"{"elicitation":{}}"#)
    )
}

/// POSTs `body` with Accept and Content-Type plus `headers`.
fn post(c: &mut Conn, headers: &[(&str, &str)], body: &str) -> Reply {
    let mut h = vec![ACCEPT_BOTH, JSON];
    h.extend_from_slice(headers);
    c.request("POST", "/mcp", &h, body.as_bytes())
}

/// POSTs `body` with the standard headers a conformant client sends.
fn modern(c: &mut Conn, method: &str, name: Option<&str>, body: &str) -> Reply {
    let mut h = vec![("MCP-Protocol-Version", V), ("Mcp-Method", method)];
    if let Some(n) = name {
        h.push(("Mcp-Name", n));
    }
    post(c, &h, body)
}

/// `r` is a JSON-RPC error `code` for request `id`, with HTTP `status`.
fn refused(r: &Reply, status: u16, code: i64, id: Value) -> Value {
    assert_eq!(r.status, status, "{}", r.text());
    let v = r.json();
    assert_eq!(v["error"]["code"], code, "{v}");
    assert_eq!(v["id"], id, "the error echoes the request id: {v}");
    assert!(r.header("mcp-session-id").is_none());
    v
}

#[test]
fn server_discover_names_every_served_version_and_the_capabilities() {
    let b = broker();
    let mut c = Conn::connect(b.http);
    let r = modern(
        &mut c,
        "server/discover",
        None,
        &req("1", "server/discover", ""),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(
        r.header("mcp-session-id").is_none(),
        "stateless: no session"
    );
    let v = r.json();
    let res = &v["result"];
    assert_eq!(res["resultType"], "complete", "{v}");
    assert_eq!(
        res["supportedVersions"],
        json!([V, "2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"])
    );
    assert!(res["capabilities"]["tools"].is_object(), "{v}");
    assert!(res["capabilities"]["prompts"].is_object(), "{v}");
    // The same capabilities initialize reports: logs reach a request that
    // carries a level, so `logging` is offered (deprecated, not removed).
    assert_eq!(res["capabilities"]["logging"], json!({}), "{v}");
    assert_eq!(res["capabilities"]["completions"], json!({}), "{v}");
    assert_eq!(
        res["_meta"]["io.modelcontextprotocol/serverInfo"]["name"],
        "mcp-broker"
    );
    assert!(res["serverInfo"].is_null(), "serverInfo moved to _meta");
    assert_eq!(res["ttlMs"], 0);
    assert_eq!(res["cacheScope"], "public");
    // Delivered on subscriptions/listen; resource updates too, as the kv
    // router tells its writes.
    assert_eq!(res["capabilities"]["tools"]["listChanged"], true);
    assert_eq!(res["capabilities"]["resources"]["subscribe"], true);
}

#[test]
fn modern_requests_are_served_without_a_session_and_get_and_delete_get_405() {
    let b = broker();
    let mut c = Conn::connect(b.http);
    let r = modern(&mut c, "tools/list", None, &req("1", "tools/list", ""));
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.header("mcp-session-id").is_none());
    let v = r.json();
    assert_eq!(v["result"]["resultType"], "complete", "{v}");
    assert_eq!(v["result"]["cacheScope"], "public", "{v}");
    assert!(v["result"]["ttlMs"].is_u64(), "{v}");
    assert!(
        v["result"]["tools"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["name"] == "echo"),
        "{v}"
    );
    // A call, with a stray session id: ignored, neither looked up nor echoed.
    let body = req("2", "tools/call", r#""name":"echo","arguments":{"n":1.50}"#);
    let r = post(
        &mut c,
        &[
            ("MCP-Protocol-Version", V),
            ("Mcp-Method", "tools/call"),
            ("Mcp-Name", "echo"),
            ("Mcp-Session-Id", "0-00000000000000000000000000000000"),
        ],
        &body,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.header("mcp-session-id").is_none());
    let v = r.json();
    assert_eq!(v["id"], 2);
    assert_eq!(v["result"]["resultType"], "complete", "{v}");
    assert!(
        v["result"]["ttlMs"].is_null(),
        "a call is not cacheable: {v}"
    );
    assert!(
        v["result"]["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("1.50"),
        "{v}"
    );
    // Resources and prompts, with their Mcp-Name.
    let r = modern(
        &mut c,
        "resources/read",
        Some("library://readme"),
        &req("3", "resources/read", r#""uri":"library://readme""#),
    );
    let v = r.json();
    assert_eq!(v["result"]["contents"][0]["uri"], "library://readme", "{v}");
    assert_eq!(v["result"]["cacheScope"], "public", "{v}");
    let r = modern(
        &mut c,
        "prompts/get",
        Some("summarize_book"),
        &req(
            "4",
            "prompts/get",
            r#""name":"summarize_book","arguments":{"book_id":"12","style":"terse"}"#,
        ),
    );
    assert_eq!(r.json()["result"]["resultType"], "complete", "{}", r.text());
    for m in ["GET", "DELETE"] {
        let r = c.request(m, "/mcp", &[ACCEPT_BOTH, ("MCP-Protocol-Version", V)], b"");
        assert_eq!(r.status, 405, "{m}: {}", r.text());
        assert_eq!(r.header("allow"), Some("POST"));
    }
    // The old era on the same endpoint and connection is untouched.
    let s = c.initialize("2025-11-25");
    let v = c.call(&s, 9, "ping", "{}");
    assert_eq!(v["result"], json!({}));
}

#[test]
fn meta_is_checked_first_even_with_correct_headers() {
    let b = broker();
    let mut c = Conn::connect(b.http);
    let h = [("MCP-Protocol-Version", V), ("Mcp-Method", "tools/list")];
    for params in [
        "",
        r#","params":{}"#,
        r#","params":{"_meta":{"io.modelcontextprotocol/clientCapabilities":{}}}"#,
        r#","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}"#,
        r#","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":true}}"#,
    ] {
        let r = post(
            &mut c,
            &h,
            &format!(r#"{{"jsonrpc":"2.0","id":"m","method":"tools/list"{params}}}"#),
        );
        refused(&r, 400, -32602, json!("m"));
    }
    // clientInfo is optional.
    let r = post(
        &mut c,
        &h,
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}"#,
    );
    assert_eq!(r.status, 200, "{}", r.text());
}

#[test]
fn standard_headers_must_match_the_body() {
    let b = broker();
    let mut c = Conn::connect(b.http);
    let call = req("7", "tools/call", r#""name":"echo","arguments":{}"#);
    let id = json!(7);
    // (Without MCP-Protocol-Version a request is of the session era, as
    // the spec allows: a back-compatible default.)
    // Header version differs from the body's (conformance's probe).
    let r = post(
        &mut c,
        &[
            ("MCP-Protocol-Version", V),
            ("Mcp-Method", "tools/call"),
            ("Mcp-Name", "echo"),
        ],
        &call.replace(V, "v999.0.0"),
    );
    refused(&r, 400, -32020, id.clone());
    // Mcp-Method missing, different, or in another case.
    let r = post(
        &mut c,
        &[("MCP-Protocol-Version", V), ("Mcp-Name", "echo")],
        &call,
    );
    refused(&r, 400, -32020, id.clone());
    for m in ["tools/list", "TOOLS/CALL"] {
        let r = modern(&mut c, m, Some("echo"), &call);
        refused(&r, 400, -32020, id.clone());
    }
    // Mcp-Name missing or different.
    let r = modern(&mut c, "tools/call", None, &call);
    let v = refused(&r, 400, -32020, id.clone());
    assert!(
        v["error"]["message"].as_str().unwrap().contains("Mcp-Name"),
        "{v}"
    );
    let r = modern(&mut c, "tools/call", Some("echo_text"), &call);
    let v = refused(&r, 400, -32020, id.clone());
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("'echo_text' does not match body value 'echo'"),
        "{v}"
    );
    let read = req("8", "resources/read", r#""uri":"library://readme""#);
    let r = modern(&mut c, "resources/read", Some("library://other"), &read);
    refused(&r, 400, -32020, json!(8));
    let r = modern(
        &mut c,
        "prompts/get",
        None,
        &req("9", "prompts/get", r#""name":"summarize_book""#),
    );
    refused(&r, 400, -32020, json!(9));
    // A repeated routing header is ambiguous.
    let r = post(
        &mut c,
        &[
            ("MCP-Protocol-Version", V),
            ("Mcp-Method", "tools/call"),
            ("Mcp-Method", "tools/call"),
            ("Mcp-Name", "echo"),
        ],
        &call,
    );
    refused(&r, 400, -32020, id.clone());
    // Surrounding whitespace is not part of the value (RFC 9110 OWS).
    let r = modern(&mut c, "tools/call", Some("  echo  "), &call);
    assert_eq!(r.status, 200, "{}", r.text());
    // A header-less server/discover is a modern request missing its
    // version header.
    let r = post(
        &mut c,
        &[("Mcp-Method", "server/discover")],
        &req("\"d\"", "server/discover", ""),
    );
    refused(&r, 400, -32020, json!("d"));
}

#[test]
fn mcp_name_values_may_be_base64_encoded_and_bad_encodings_are_refused() {
    let b = broker();
    let mut c = Conn::connect(b.http);
    // "echo" as the sentinel encoding: decoded before comparing.
    let call = req("1", "tools/call", r#""name":"echo","arguments":{}"#);
    let r = modern(&mut c, "tools/call", Some("=?base64?ZWNobw==?="), &call);
    assert_eq!(r.status, 200, "{}", r.text());
    // A non-ASCII name must travel encoded; it then matches (and the
    // unknown tool is the tool's own error, not a header error).
    let call = req("2", "tools/call", r#""name":"Hello, 世界","arguments":{}"#);
    let r = modern(
        &mut c,
        "tools/call",
        Some("=?base64?SGVsbG8sIOS4lueVjA==?="),
        &call,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], -32602, "{}", r.text());
    // Invalid padding, characters outside the alphabet: -32020.
    let call = req("3", "tools/call", r#""name":"Hello","arguments":{}"#);
    for bad in ["=?base64?SGVsbG8?=", "=?base64?SGVs!!!bG8=?="] {
        let r = modern(&mut c, "tools/call", Some(bad), &call);
        refused(&r, 400, -32020, json!(3));
    }
    // The sentinel is case-sensitive: an uppercase one is a literal value,
    // which then does not match.
    let r = modern(&mut c, "tools/call", Some("=?BASE64?SGVsbG8=?="), &call);
    refused(&r, 400, -32020, json!(3));
    // Raw non-ASCII bytes in a header are invalid characters.
    let body = req("4", "tools/call", r#""name":"é","arguments":{}"#);
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: x\r\nAccept: application/json, text/event-stream\r\nContent-Type: application/json\r\nMCP-Protocol-Version: {V}\r\nMcp-Method: tools/call\r\nMcp-Name: "
    );
    let mut raw = head.into_bytes();
    raw.extend_from_slice("é".as_bytes());
    raw.extend_from_slice(format!("\r\nContent-Length: {}\r\n\r\n{body}", body.len()).as_bytes());
    c.send_raw(&raw);
    let r = c.read_reply();
    refused(&r, 400, -32020, json!(4));
}

#[test]
fn an_unsupported_version_gets_32022_with_the_discover_list() {
    let b = broker();
    let mut c = Conn::connect(b.http);
    let r = modern(
        &mut c,
        "server/discover",
        None,
        &req("1", "server/discover", ""),
    );
    let discover = r.json()["result"]["supportedVersions"].clone();
    let body = req("\"u\"", "tools/list", "").replace(V, "v999.0.0");
    let r = post(
        &mut c,
        &[
            ("MCP-Protocol-Version", "v999.0.0"),
            ("Mcp-Method", "tools/list"),
        ],
        &body,
    );
    let v = refused(&r, 400, -32022, json!("u"));
    assert_eq!(v["error"]["data"]["supported"], discover, "{v}");
    assert_eq!(v["error"]["data"]["requested"], "v999.0.0", "{v}");
    // An unknown version in the header is told so before anything else:
    // not that `_meta` is missing (a session-era request with a mistyped
    // header), nor 202 for a notification that would be dropped, nor 405
    // for GET and DELETE. Both revisions: 400 and the supported list.
    let h = [("MCP-Protocol-Version", "2025-13-01")];
    let r = post(
        &mut c,
        &h,
        r#"{"jsonrpc":"2.0","id":7,"method":"tools/list"}"#,
    );
    let v = refused(&r, 400, -32022, json!(7));
    assert_eq!(v["error"]["data"]["requested"], "2025-13-01", "{v}");
    let r = post(
        &mut c,
        &h,
        r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1}}"#,
    );
    refused(&r, 400, -32022, Value::Null);
    for method in ["GET", "DELETE"] {
        let r = c.request(method, "/mcp", &[ACCEPT_BOTH, h[0]], b"");
        let v = refused(&r, 400, -32022, Value::Null);
        assert_eq!(v["error"]["data"]["supported"], discover, "{method}: {v}");
    }
}

#[test]
fn methods_outside_2026_07_28_get_404_and_32601() {
    let b = broker();
    let mut c = Conn::connect(b.http);
    for m in [
        "initialize",
        "ping",
        "logging/setLevel",
        "resources/subscribe",
        "resources/unsubscribe",
        "unknown/method",
    ] {
        let r = modern(&mut c, m, None, &req("\"x\"", m, ""));
        refused(&r, 404, -32601, json!("x"));
    }
}

#[test]
fn other_messages_notifications_responses_batches_and_bad_json() {
    let b = broker();
    let mut c = Conn::connect(b.http);
    let h = [("MCP-Protocol-Version", V)];
    let r = post(
        &mut c,
        &h,
        r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1}}"#,
    );
    assert_eq!((r.status, r.body.len()), (202, 0));
    let r = post(&mut c, &h, r#"{"jsonrpc":"2.0","id":"r","result":{}}"#);
    refused(&r, 400, -32600, json!("r"));
    let r = post(&mut c, &h, &format!("[{}]", req("1", "tools/list", "")));
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], -32600);
    let r = post(&mut c, &h, "{not json");
    refused(&r, 400, -32700, Value::Null);
}

#[test]
fn an_unknown_resource_is_invalid_params_not_32002() {
    let b = broker();
    let mut c = Conn::connect(b.http);
    let r = modern(
        &mut c,
        "resources/read",
        Some("library://nothing"),
        &req("1", "resources/read", r#""uri":"library://nothing""#),
    );
    let v = r.json();
    assert_eq!(v["error"]["code"], -32602, "{v}");
    assert_eq!(v["error"]["data"]["uri"], "library://nothing", "{v}");
}

/// 2026-07-28 asks a server to name itself in every result's `_meta`
/// (basic/index, "Per-response protocol fields"), and forbids -32002
/// (basic/index, "Error Codes"), which the broker's router fault shares.
#[test]
fn every_result_names_the_server_and_a_router_fault_is_not_32002() {
    let b = broker();
    let mut c = Conn::connect(b.http);
    let named = |v: &Value| {
        let info = &v["result"]["_meta"]["io.modelcontextprotocol/serverInfo"];
        assert_eq!(info["name"], "mcp-broker", "{v}");
        assert_eq!(info["version"], env!("CARGO_PKG_VERSION"), "{v}");
    };
    let calls: [(&str, Option<&str>, &str); 9] = [
        ("tools/list", None, ""),
        ("resources/list", None, ""),
        ("resources/templates/list", None, ""),
        ("prompts/list", None, ""),
        (
            "tools/call",
            Some("echo"),
            r#""name":"echo","arguments":{"x":1}"#,
        ),
        // A tool's own failure: a result with isError.
        (
            "tools/call",
            Some("fail"),
            r#""name":"fail","arguments":{}"#,
        ),
        (
            "resources/read",
            Some("library://readme"),
            r#""uri":"library://readme""#,
        ),
        (
            "prompts/get",
            Some("summarize_book"),
            r#""name":"summarize_book","arguments":{"book_id":"12"}"#,
        ),
        // A question: an input_required result.
        (
            "tools/call",
            Some("test_elicitation"),
            r#""name":"test_elicitation","arguments":{"message":"Who?"}"#,
        ),
    ];
    for (i, (method, name, params)) in calls.into_iter().enumerate() {
        let r = modern(&mut c, method, name, &req(&i.to_string(), method, params));
        assert_eq!(r.status, 200, "{method} {name:?}: {}", r.text());
        named(&r.json());
    }
    let r = modern(
        &mut c,
        "server/discover",
        None,
        &req("20", "server/discover", ""),
    );
    named(&r.json());
    // The router trapped: an internal error with the broker's `data`, not
    // the -32002 of the session era.
    let r = modern(
        &mut c,
        "tools/call",
        Some("trap"),
        &req("22", "tools/call", r#""name":"trap","arguments":{}"#),
    );
    let v = r.json();
    assert_eq!(v["error"]["code"], -32603, "{v}");
    assert_eq!(v["error"]["data"]["kind"], "router_fault", "{v}");
    assert_eq!(v["error"]["data"]["retryable"], true, "{v}");
    // The session era keeps its results as they were, and -32002.
    let s = c.initialize("2025-11-25");
    let v = c.call(
        &s,
        30,
        "tools/call",
        r#"{"name":"echo","arguments":{"x":1}}"#,
    );
    assert!(v["result"].get("_meta").is_none(), "{v}");
    let v = c.call(&s, 31, "tools/call", r#"{"name":"trap","arguments":{}}"#);
    assert_eq!(v["error"]["code"], -32002, "{v}");
    assert_eq!(v["error"]["data"]["kind"], "router_fault", "{v}");
}

#[test]
fn an_elicitation_is_a_multi_round_trip_with_no_state_between_the_posts() {
    let b = broker();
    let mut c = Conn::connect(b.http);
    let first = req(
        "1",
        "tools/call",
        r#""name":"test_elicitation","arguments":{"message":"Who are you?"}"#,
    );
    let r = modern(&mut c, "tools/call", Some("test_elicitation"), &first);
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    let res = &v["result"];
    assert_eq!(res["resultType"], "input_required", "{v}");
    let ask = &res["inputRequests"]["elicitation"];
    assert_eq!(ask["method"], "elicitation/create", "{v}");
    assert!(
        ask.get("id").is_none() && ask.get("jsonrpc").is_none(),
        "{v}"
    );
    assert_eq!(ask["params"]["message"], "Who are you?", "{v}");
    assert_eq!(ask["params"]["mode"], "form", "{v}");
    assert!(
        ask["params"]["requestedSchema"]["properties"]["email"].is_object(),
        "{v}"
    );
    // The retry: a new id, the same params plus inputResponses, on another
    // connection (any shard would do: nothing was kept).
    let retry = req(
        "2",
        "tools/call",
        r#""name":"test_elicitation","arguments":{"message":"Who are you?"},"inputResponses":{"elicitation":{"action":"accept","content":{"username":"ada","email":"ada@example.com"}}}"#,
    );
    let mut c2 = Conn::connect(b.http);
    let r = modern(&mut c2, "tools/call", Some("test_elicitation"), &retry);
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["id"], 2);
    assert_eq!(v["result"]["resultType"], "complete", "{v}");
    let text = v["result"]["content"][0]["text"].as_str().unwrap();
    assert!(
        text.contains("action=accept") && text.contains("ada@example.com"),
        "{text}"
    );
    // A declined answer reaches the tool too.
    let decline = retry.replace(
        r#"{"action":"accept","content":{"username":"ada","email":"ada@example.com"}}"#,
        r#"{"action":"decline"}"#,
    );
    let r = modern(&mut c2, "tools/call", Some("test_elicitation"), &decline);
    let v = r.json();
    assert!(
        v["result"]["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("action=decline"),
        "{v}"
    );
    // A malformed answer is invalid params.
    let bad = retry.replace(r#""action":"accept""#, r#""action":"maybe""#);
    let r = modern(&mut c2, "tools/call", Some("test_elicitation"), &bad);
    refused(&r, 400, -32602, json!(2));
    // The argument the answer travels in cannot be forged by the client.
    let forged = req(
        "3",
        "tools/call",
        r#""name":"test_elicitation","arguments":{"message":"m","_elicitation":{"action":"accept"}}"#,
    );
    let r = modern(&mut c2, "tools/call", Some("test_elicitation"), &forged);
    refused(&r, 400, -32602, json!(3));
}

#[test]
fn an_elicitation_for_a_client_without_the_capability_is_32021() {
    let b = broker();
    let mut c = Conn::connect(b.http);
    let body = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{{},"name":"elicit","arguments":{{}}}}}}"#,
        meta("{}")
    );
    let r = modern(&mut c, "tools/call", Some("elicit"), &body);
    let v = refused(&r, 400, -32021, json!(1));
    assert_eq!(
        v["error"]["data"]["requiredCapabilities"],
        json!({"elicitation": {}}),
        "{v}"
    );
}

#[test]
fn progress_goes_before_the_answer_on_the_requests_own_stream() {
    let b = broker();
    let mut c = Conn::connect(b.http);
    let body = format!(
        r#"{{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{{"_meta":{{"io.modelcontextprotocol/protocolVersion":"{V}","io.modelcontextprotocol/clientCapabilities":{{}},"progressToken":"p1"}},"name":"test_tool_with_progress","arguments":{{}}}}}}"#
    );
    let r = modern(&mut c, "tools/call", Some("test_tool_with_progress"), &body);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    let msgs = r.sse_messages();
    let (last, notes) = msgs.split_last().unwrap();
    assert!(!notes.is_empty(), "{msgs:?}");
    for n in notes {
        assert_eq!(n["method"], "notifications/progress", "{n}");
        assert_eq!(n["params"]["progressToken"], "p1", "{n}");
    }
    assert_eq!(last["id"], 5);
    assert_eq!(last["result"]["resultType"], "complete", "{last}");
}

/// A broker on a config file this test can rewrite and reload: `routers`
/// are `[[routers]]` tables; keep-alive every 200 ms.
fn reloadable(test: &str, routers: &str) -> (Broker, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("mcp-modern-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("broker.toml");
    std::fs::write(&path, listen_config(routers)).unwrap();
    let b = Broker::start_command(None, &["--config", path.to_str().unwrap()], |_| {});
    (b, path)
}

fn listen_config(routers: &str) -> String {
    format!(
        "[broker]\nshards = 2\nrouters_dir = \"{}\"\n\n[frames]\nlisten = \"127.0.0.1:0\"\n\n[grpc]\nlisten = \"127.0.0.1:0\"\n\n[http]\nlisten = \"127.0.0.1:0\"\nsse_keepalive = \"200ms\"\n\n[metrics]\nlisten = \"127.0.0.1:0\"\n\n{routers}",
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../routers/target/wasm32-wasip2/release"
        )
    )
}

const ECHO: &str = "[[routers]]\nname = \"echo\"\nwasm = \"echo.wasm\"\n";
const LIBRARY: &str = "[[routers]]\nname = \"library\"\nwasm = \"library.wasm\"\n";

/// Opens a `subscriptions/listen` stream with `filter`; the connection with
/// the SSE head read.
fn listen(b: &Broker, id: &str, filter: &str) -> Conn {
    let body = req(
        id,
        "subscriptions/listen",
        &format!(r#""notifications":{filter}"#),
    );
    Conn::open_sse(
        b.http,
        &format!("MCP-Protocol-Version: {V}\r\nMcp-Method: subscriptions/listen\r\n"),
        &body,
    )
}

/// `subscriptions/listen` is answered on a stream whatever happens, so a
/// client that accepts only `text/event-stream` there is served (ax did,
/// and retried its 406 every second); any other request still needs both.
#[test]
fn subscriptions_listen_needs_only_an_event_stream_accepted() {
    let b = Broker::start_with_config(&listen_config(ECHO), &[]);
    let head = |method: &str, body: &str| {
        let mut c = Conn::connect(b.http);
        c.send_raw(
            format!(
                "POST /mcp HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\nContent-Type: application/json\r\nMCP-Protocol-Version: {V}\r\nMcp-Method: {method}\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            )
            .as_bytes(),
        );
        c.read_head()
    };
    let listen = req(
        "1",
        "subscriptions/listen",
        r#""notifications":{"toolsListChanged":true}"#,
    );
    let (status, h) = head("subscriptions/listen", &listen);
    assert_eq!(status, 200);
    assert!(
        h.iter()
            .any(|(k, v)| k.eq_ignore_ascii_case("content-type") && v == "text/event-stream"),
        "{h:?}"
    );
    let (status, _) = head("tools/list", &req("2", "tools/list", ""));
    assert_eq!(status, 406);
}

#[test]
fn subscriptions_listen_acknowledges_then_sends_list_changed_and_keep_alives() {
    let (b, path) = reloadable("listen", ECHO);
    let mut tools = listen(
        &b,
        "\"L1\"",
        r#"{"toolsListChanged":true,"resourceSubscriptions":["x://y"]}"#,
    );
    let mut prompts = listen(&b, "2", r#"{"promptsListChanged":true}"#);
    // The acknowledgment first: what is served of the filter (no router
    // serves x://y).
    let (body, ended) = tools.read_chunked(Some(&|t: &str| t.contains("acknowledged")));
    assert!(!ended);
    let msgs = common::http::sse_messages(&String::from_utf8(body).unwrap());
    assert_eq!(
        msgs[0]["method"],
        "notifications/subscriptions/acknowledged"
    );
    assert_eq!(
        msgs[0]["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"],
        "L1"
    );
    assert_eq!(
        msgs[0]["params"]["notifications"],
        json!({"toolsListChanged": true})
    );
    // Keep-alive comments while nothing changes.
    let (body, _) = tools.read_chunked(Some(&|t: &str| t.contains(": keep-alive")));
    assert!(String::from_utf8_lossy(&body).contains(": keep-alive"));
    // Both streams are counted open, as listen streams; one whose client
    // goes is not (a keep-alive finds it gone).
    assert_eq!(
        b.metric_where("mcp_http_streams_open", &[r#"kind="listen""#]),
        2.0
    );
    let gone = listen(&b, "3", r#"{"promptsListChanged":true}"#);
    assert_eq!(b.metric_sum("mcp_http_streams_open"), 3.0);
    drop(gone);
    assert!(common::http::eventually(
        std::time::Duration::from_secs(5),
        || b.metric_sum("mcp_http_streams_open") == 2.0
    ));
    // The discover capabilities now promise it.
    let mut c = Conn::connect(b.http);
    let r = modern(
        &mut c,
        "server/discover",
        None,
        &req("1", "server/discover", ""),
    );
    assert_eq!(
        r.json()["result"]["capabilities"]["tools"]["listChanged"],
        true,
        "{}",
        r.text()
    );
    // A reload that adds tools (and prompts).
    std::fs::write(&path, listen_config(&format!("{ECHO}{LIBRARY}"))).unwrap();
    let mut admin = Conn::connect(b.metrics);
    let r = admin.request("POST", "/admin/reload", &[("Connection", "close")], b"");
    assert_eq!(r.status, 200, "{}", r.text());
    let (body, ended) = tools.read_chunked(Some(&|t: &str| t.contains("list_changed")));
    assert!(!ended);
    let msgs = common::http::sse_messages(&String::from_utf8(body).unwrap());
    let n = msgs.last().unwrap();
    assert_eq!(n["method"], "notifications/tools/list_changed", "{n}");
    assert_eq!(
        n["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"],
        "L1"
    );
    // The other stream asked for prompts only, and got only those.
    let (body, _) = prompts.read_chunked(Some(&|t: &str| t.contains("list_changed")));
    let text = String::from_utf8(body).unwrap();
    assert!(!text.contains("tools/list_changed"), "{text}");
    let msgs = common::http::sse_messages(&text);
    let n = msgs.last().unwrap();
    assert_eq!(n["method"], "notifications/prompts/list_changed", "{n}");
    assert_eq!(
        n["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"],
        2
    );
    // A listen without its filter is invalid params.
    let r = modern(
        &mut c,
        "subscriptions/listen",
        None,
        &req("3", "subscriptions/listen", ""),
    );
    refused(&r, 400, -32602, json!(3));
    // The drain ends an open listen stream with the listen request's
    // result, and the broker exits.
    let mut b = b;
    let t0 = std::time::Instant::now();
    let status = b.terminate(std::time::Duration::from_secs(20));
    assert!(status.success(), "{status:?}");
    let (body, ended) = tools.read_chunked(None);
    assert!(ended);
    assert!(t0.elapsed() < std::time::Duration::from_secs(10));
    let msgs = common::http::sse_messages(&String::from_utf8(body).unwrap());
    let fin = msgs.last().unwrap();
    assert_eq!(fin["id"], "L1", "{fin}");
    assert_eq!(fin["result"]["resultType"], "complete", "{fin}");
    assert_eq!(
        fin["result"]["_meta"]["io.modelcontextprotocol/subscriptionId"],
        "L1"
    );
    // Before it, the teardown notice the cancellation page asks for.
    let bye = &msgs[msgs.len() - 2];
    assert_eq!(bye["method"], "notifications/cancelled", "{bye}");
    assert_eq!(bye["params"]["requestId"], "L1", "{bye}");
    assert_eq!(
        bye["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"],
        "L1"
    );
    drop(prompts);
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}

const KV: &str = "[[routers]]\nname = \"kv\"\nwasm = \"kv.wasm\"\n";

/// A 2026-07-28 `tools/call` of kv's `put`, on a new connection.
fn kv_put(b: &Broker, id: u32, key: &str) {
    let mut c = Conn::connect(b.http);
    let body = req(
        &id.to_string(),
        "tools/call",
        &format!(r#""name":"put","arguments":{{"key":"{key}","value":1}}"#),
    );
    let r = modern(&mut c, "tools/call", Some("put"), &body);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["result"]["isError"], false, "{}", r.text());
}

#[test]
fn listen_resource_subscriptions_get_the_updates_of_their_uris_only() {
    let (b, path) = reloadable("resources", KV);
    let mut color = listen(
        &b,
        "\"R1\"",
        r#"{"resourceSubscriptions":["kv://color","nope://x","kv://color"]}"#,
    );
    let mut other = listen(&b, "2", r#"{"resourceSubscriptions":["kv://other"]}"#);
    // The acknowledgment lists what is honoured: URIs of a router that
    // tells its updates (once each); not another scheme's.
    let (body, _) = color.read_chunked(Some(&|t: &str| t.contains("acknowledged")));
    let msgs = common::http::sse_messages(&String::from_utf8(body).unwrap());
    assert_eq!(
        msgs[0]["params"]["notifications"],
        json!({"resourceSubscriptions": ["kv://color"]}),
        "{msgs:?}"
    );
    let (body, _) = other.read_chunked(Some(&|t: &str| t.contains("acknowledged")));
    let msgs = common::http::sse_messages(&String::from_utf8(body).unwrap());
    assert_eq!(
        msgs[0]["params"]["notifications"],
        json!({"resourceSubscriptions": ["kv://other"]})
    );
    // A write from another connection (two shards: any of them) reaches
    // the stream subscribed to its URI, tagged with the subscription.
    kv_put(&b, 1, "color");
    let (body, ended) = color.read_chunked(Some(&|t: &str| t.contains("resources/updated")));
    assert!(!ended);
    let msgs = common::http::sse_messages(&String::from_utf8(body).unwrap());
    let n = msgs.last().unwrap();
    assert_eq!(n["method"], "notifications/resources/updated", "{n}");
    assert_eq!(n["params"]["uri"], "kv://color", "{n}");
    assert_eq!(
        n["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"],
        "R1"
    );
    // The other stream got nothing of it: its first update is its own URI,
    // written after.
    kv_put(&b, 2, "other");
    let (body, _) = other.read_chunked(Some(&|t: &str| t.contains("resources/updated")));
    let text = String::from_utf8(body).unwrap();
    assert!(!text.contains("kv://color"), "{text}");
    let msgs = common::http::sse_messages(&text);
    let n = msgs.last().unwrap();
    assert_eq!(n["params"]["uri"], "kv://other", "{n}");
    assert_eq!(
        n["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"],
        2
    );
    // Too many URIs in one listen: invalid params.
    let uris: Vec<String> = (0..65).map(|i| format!("\"kv://k{i}\"")).collect();
    let mut c = Conn::connect(b.http);
    let body = req(
        "3",
        "subscriptions/listen",
        &format!(
            r#""notifications":{{"resourceSubscriptions":[{}]}}"#,
            uris.join(",")
        ),
    );
    let r = modern(&mut c, "subscriptions/listen", None, &body);
    refused(&r, 400, -32602, json!(3));
    drop((color, other));
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}

#[test]
fn mcp_param_headers_declared_by_x_mcp_header_are_validated_against_the_body() {
    let b = broker();
    let mut c = Conn::connect(b.http);
    let r = modern(&mut c, "tools/list", None, &req("1", "tools/list", ""));
    let v = r.json();
    let tool = v["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "test_param_header")
        .cloned()
        .unwrap_or_else(|| panic!("{v}"));
    assert_eq!(
        tool["inputSchema"]["properties"]["region"]["x-mcp-header"],
        "Region"
    );
    let call = |args: &str| {
        req(
            "2",
            "tools/call",
            &format!(r#""name":"test_param_header","arguments":{args}"#),
        )
    };
    let send = |c: &mut Conn, params: &[(&str, &str)], body: &str| {
        let mut h = vec![
            ("MCP-Protocol-Version", V),
            ("Mcp-Method", "tools/call"),
            ("Mcp-Name", "test_param_header"),
        ];
        h.extend_from_slice(params);
        post(c, &h, body)
    };
    // Matching headers (an integer compared numerically, a value encoded).
    let body = call(r#"{"region":"Zürich","count":42}"#);
    let r = send(
        &mut c,
        &[
            ("Mcp-Param-Region", "=?base64?WsO8cmljaA==?="),
            ("mcp-param-count", "42.0"),
        ],
        &body,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let text = r.json()["result"]["content"][0]["text"].clone();
    assert_eq!(text, "region=\"Zürich\", count=42");
    // Missing, different, or set for an absent argument: -32020.
    let r = send(&mut c, &[("Mcp-Param-Count", "42")], &body);
    refused(&r, 400, -32020, json!(2));
    let r = send(
        &mut c,
        &[
            ("Mcp-Param-Region", "=?base64?WsO8cmljaA==?="),
            ("Mcp-Param-Count", "41"),
        ],
        &body,
    );
    let v = refused(&r, 400, -32020, json!(2));
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("Mcp-Param-Count"),
        "{v}"
    );
    let body = call(r#"{"region":"eu"}"#);
    let r = send(
        &mut c,
        &[("Mcp-Param-Region", "eu"), ("Mcp-Param-Count", "1")],
        &body,
    );
    refused(&r, 400, -32020, json!(2));
    // An absent argument needs no header; unknown Mcp-Param-* are ignored.
    let r = send(
        &mut c,
        &[("Mcp-Param-Region", "eu"), ("Mcp-Param-Other", "x")],
        &body,
    );
    assert_eq!(r.status, 200, "{}", r.text());
}

/// Scale-out without stickiness: two brokers (as behind a plain
/// round-robin balancer), each POST of one client going to the other one
/// than its previous POST. Discovery, listing, a call, and a multi
/// round-trip whose first leg and retry land on different brokers all work,
/// since nothing is kept between requests.
#[test]
fn two_brokers_serve_one_client_alternately_with_no_stickiness() {
    let brokers = [broker(), broker()];
    let mut next = 0;
    let mut send = |method: &str, name: Option<&str>, body: &str| {
        let b = &brokers[next % 2];
        next += 1;
        let mut c = Conn::connect(b.http);
        modern(&mut c, method, name, body)
    };
    let r = send("server/discover", None, &req("1", "server/discover", ""));
    assert_eq!(r.status, 200, "{}", r.text());
    let r = send("tools/list", None, &req("2", "tools/list", ""));
    assert_eq!(r.json()["result"]["resultType"], "complete", "{}", r.text());
    let r = send(
        "tools/call",
        Some("echo"),
        &req("3", "tools/call", r#""name":"echo","arguments":{"x":1}"#),
    );
    assert_eq!(r.json()["result"]["resultType"], "complete", "{}", r.text());
    let args = r#""name":"test_elicitation","arguments":{"message":"Who are you?"}"#;
    let r = send(
        "tools/call",
        Some("test_elicitation"),
        &req("4", "tools/call", args),
    );
    assert_eq!(
        r.json()["result"]["resultType"],
        "input_required",
        "{}",
        r.text()
    );
    let retry = format!(
        r#"{args},"inputResponses":{{"elicitation":{{"action":"accept","content":{{"username":"ada","email":"ada@example.com"}}}}}}"#
    );
    let r = send(
        "tools/call",
        Some("test_elicitation"),
        &req("5", "tools/call", &retry),
    );
    let v = r.json();
    assert_eq!(v["result"]["resultType"], "complete", "{v}");
    assert!(
        v["result"]["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("ada@example.com"),
        "{v}"
    );
    assert_eq!(next, 5, "the five requests alternated between the brokers");
}

/// Closing a 2026-07-28 request's connection cancels its call: the guest
/// stops at once and frees its instance (one per shard here, one shard),
/// so the next call of that router does not wait for the abandoned one.
#[test]
fn closing_the_connection_of_a_call_cancels_it_in_the_guest() {
    let toml = format!(
        "{}\n[[routers]]\nname = \"chaos\"\nwasm = \"chaos.wasm\"\ninstances_per_shard = 1\nqueue_depth = 4\ncall_deadline = \"5s\"\n",
        mcp_broker::config::DEFAULT_TOML
    );
    let b = Broker::start_with_config(&toml, &["--shards", "1"]);
    let slow = req(
        "1",
        "tools/call",
        r#""name":"spin","arguments":{"ms":4000}"#,
    );
    let mut c = Conn::connect(b.http);
    c.send_raw(
        format!(
            "POST /mcp HTTP/1.1\r\nHost: x\r\nAccept: application/json, text/event-stream\r\nContent-Type: application/json\r\nMCP-Protocol-Version: {V}\r\nMcp-Method: tools/call\r\nMcp-Name: spin\r\nContent-Length: {}\r\n\r\n{slow}",
            slow.len()
        )
        .as_bytes(),
    );
    std::thread::sleep(std::time::Duration::from_millis(300));
    drop(c);
    let t0 = std::time::Instant::now();
    let mut c = Conn::connect(b.http);
    let quick = req("2", "tools/call", r#""name":"spin","arguments":{"ms":1}"#);
    let r = modern(&mut c, "tools/call", Some("spin"), &quick);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["result"]["isError"], false, "{}", r.text());
    assert!(
        t0.elapsed() < std::time::Duration::from_millis(2500),
        "the abandoned call still held the instance: {:?}",
        t0.elapsed()
    );
}

/// A tools/call of the `conformance` router's `tool` (no arguments), plus
/// `extra` params (a retry's `inputResponses` and `requestState`).
fn call_of(id: u32, tool: &str, extra: &str) -> String {
    let rest = format!(r#""name":"{tool}","arguments":{{}}{extra}"#);
    req(&id.to_string(), "tools/call", &rest)
}

/// The retry's params: the answer `content` under `key`, and `token`.
fn answered(key: &str, content: &str, token: Option<&str>) -> String {
    let state = token.map_or(String::new(), |t| format!(r#","requestState":"{t}""#));
    format!(r#","inputResponses":{{"{key}":{{"action":"accept","content":{content}}}}}{state}"#)
}

/// An `InputRequiredResult`'s question under `key`, and its requestState.
fn input_required(r: &Reply, key: &str) -> (Value, Option<String>) {
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["result"]["resultType"], "input_required", "{v}");
    let ask = v["result"]["inputRequests"][key].clone();
    assert_eq!(ask["method"], "elicitation/create", "{v}");
    let token = v["result"]["requestState"].as_str().map(str::to_owned);
    (ask, token)
}

fn complete_text(r: &Reply) -> String {
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["result"]["resultType"], "complete", "{v}");
    v["result"]["content"][0]["text"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// A router's state rides its question (`mcp-broker/state`) and comes back
/// with the answer (`_request_state`) through the client, sealed as
/// `requestState`: never shown, never changed, bound to its tool, and made
/// by this broker's key only.
#[test]
fn a_routers_state_travels_sealed_in_request_state_and_comes_back_with_the_answer() {
    let b = broker();
    let mut c = Conn::connect(b.http);
    const TOOL: &str = "test_input_required_result_multi_round";
    let call = |id: u32, extra: &str| {
        let mut c = Conn::connect(b.http);
        modern(&mut c, "tools/call", Some(TOOL), &call_of(id, TOOL, extra))
    };
    let (ask, t1) = input_required(&call(1, ""), "elicitation");
    assert_eq!(ask["params"]["message"], "What is your name?", "{ask}");
    assert!(
        ask["params"].get("_meta").is_none(),
        "the state is not shown: {ask}"
    );
    let t1 = t1.expect("a requestState for a question with a state");
    // Round two: the first answer goes into the router's next state.
    let (ask, t2) = input_required(
        &call(2, &answered("elicitation", r#"{"name":"Ada"}"#, Some(&t1))),
        "elicitation",
    );
    assert_eq!(
        ask["params"]["message"], "What is your favourite colour?",
        "{ask}"
    );
    let t2 = t2.unwrap();
    assert_ne!(t1, t2);
    for t in [&t1, &t2] {
        assert!(
            !t.contains("step") && !t.contains("Ada"),
            "sealed, not readable: {t}"
        );
    }
    let text = complete_text(&call(
        3,
        &answered("elicitation", r#"{"color":"blue"}"#, Some(&t2)),
    ));
    assert_eq!(text, "Hello, Ada! Your colour: blue");
    // Without the token the tool has no state: it starts over.
    let (ask, _) = input_required(
        &call(4, &answered("elicitation", r#"{"color":"blue"}"#, None)),
        "elicitation",
    );
    assert_eq!(ask["params"]["message"], "What is your name?", "{ask}");

    // A changed token (one character in the sealed part), a token of
    // another tool, one sealed by another broker (its own random key), and
    // a state a client writes itself are all refused before the tool runs.
    let mut bytes = t2.clone().into_bytes();
    let i = bytes.len() / 2;
    bytes[i] = if bytes[i] == b'A' { b'B' } else { b'A' };
    let changed = String::from_utf8(bytes).unwrap();
    let r = call(
        5,
        &answered("elicitation", r#"{"color":"red"}"#, Some(&changed)),
    );
    let v = refused(&r, 400, -32602, json!(5));
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("integrity check"),
        "{v}"
    );
    let other = "test_input_required_result_request_state";
    let r = modern(
        &mut c,
        "tools/call",
        Some(other),
        &call_of(
            6,
            other,
            &answered("elicitation", r#"{"ok":true}"#, Some(&t2)),
        ),
    );
    refused(&r, 400, -32602, json!(6));
    let b2 = broker();
    let mut c2 = Conn::connect(b2.http);
    let r = modern(
        &mut c2,
        "tools/call",
        Some(TOOL),
        &call_of(7, TOOL, &answered("elicitation", "{}", Some(&t2))),
    );
    let v = refused(&r, 400, -32602, json!(7));
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("request_state_key_file"),
        "the refusal says how brokers share a key: {v}"
    );
    let forged = req(
        "8",
        "tools/call",
        &format!(r#""name":"{TOOL}","arguments":{{"_request_state":{{"step":2,"name":"Eve"}}}}"#),
    );
    let r = modern(&mut c, "tools/call", Some(TOOL), &forged);
    let v = refused(&r, 400, -32602, json!(8));
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("_request_state"),
        "{v}"
    );
    let r = modern(
        &mut c,
        "tools/call",
        Some(TOOL),
        &call_of(9, TOOL, r#","requestState":7"#),
    );
    refused(&r, 400, -32602, json!(9));
    // Counted: the three questions asked (rounds 1, 2, and the start over),
    // the two tokens refused here by their integrity, and the one that is
    // not a string as malformed (it was counted nowhere).
    assert_eq!(b.metric_sum("mcp_http_request_states_issued_total"), 3.0);
    let (_, metrics) = b.http_get("/metrics");
    assert!(
        metrics.contains("mcp_http_request_states_refused_total{reason=\"integrity\"} 2\n")
            && metrics.contains("mcp_http_request_states_refused_total{reason=\"malformed\"} 1\n")
            && metrics.contains("mcp_http_request_states_refused_total{reason=\"expired\"} 0\n"),
        "{metrics}"
    );
}

/// A router may name its question's key (`mcp-broker/input-key`): the
/// requestState then names it too, and the retry's answer is read there.
#[test]
fn a_named_input_key_is_asked_under_and_read_back_through_the_request_state() {
    let b = broker();
    const TOOL: &str = "test_input_required_result_elicitation";
    let call = |id: u32, extra: &str| {
        let mut c = Conn::connect(b.http);
        modern(&mut c, "tools/call", Some(TOOL), &call_of(id, TOOL, extra))
    };
    let (ask, token) = input_required(&call(1, ""), "user_name");
    assert!(ask["params"].get("_meta").is_none(), "{ask}");
    let token = token.expect("a named key needs a requestState to come back");
    let text = complete_text(&call(
        2,
        &answered("user_name", r#"{"name":"Alice"}"#, Some(&token)),
    ));
    assert_eq!(text, "Hello, Alice!");
    // Without the token nothing names `user_name`: the answer reaches the
    // tool in `_inputs`, where this tool looks for it too.
    let text = complete_text(&call(
        3,
        &answered("user_name", r#"{"name":"Alice"}"#, None),
    ));
    assert_eq!(text, "Hello, Alice!");
    // The token names `user_name`: an answer under the default key is not it.
    input_required(
        &call(
            4,
            &answered("elicitation", r#"{"name":"Alice"}"#, Some(&token)),
        ),
        "user_name",
    );
}

/// Brokers behind one balancer share `http.request_state_key_file`: a
/// question asked by one is answered at the other. A token outlives its
/// `http.request_state_ttl` at no broker whose clock agrees within 30 s
/// (`request_state::SKEW`). A key file that is not a key
/// fails start-up.
#[test]
fn brokers_sharing_a_key_file_accept_each_others_tokens_until_they_expire() {
    let dir = std::env::temp_dir().join(format!("mcp-rs-keys-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let key = dir.join("state.key");
    std::fs::write(&key, format!("{}\n", "5a".repeat(32))).unwrap();
    let with = |keys: &str| {
        let toml = format!(
            "{}\n[[routers]]\nname = \"conformance\"\nwasm = \"conformance.wasm\"\n",
            common::default_with_chaos()
        );
        common::with_http_keys(&toml, keys)
    };
    let shared = format!("request_state_key_file = \"{}\"", key.display());
    let (a, b) = (
        Broker::start_with_config(&with(&shared), &[]),
        Broker::start_with_config(&with(&shared), &[]),
    );
    const TOOL: &str = "test_input_required_result_multi_round";
    let at = |broker: &Broker, id: u32, extra: &str| {
        let mut c = Conn::connect(broker.http);
        modern(&mut c, "tools/call", Some(TOOL), &call_of(id, TOOL, extra))
    };
    let (_, t) = input_required(&at(&a, 1, ""), "elicitation");
    let (_, t) = input_required(
        &at(
            &b,
            2,
            &answered("elicitation", r#"{"name":"Bo"}"#, t.as_deref()),
        ),
        "elicitation",
    );
    let text = complete_text(&at(
        &a,
        3,
        &answered("elicitation", r#"{"color":"red"}"#, t.as_deref()),
    ));
    assert_eq!(text, "Hello, Bo! Your colour: red");

    let short =
        Broker::start_with_config(&with(&format!("{shared}\nrequest_state_ttl = \"1s\"")), &[]);
    let (_, t) = input_required(&at(&short, 4, ""), "elicitation");
    // Expiry is in whole seconds of the wall clock: past two, it has passed.
    std::thread::sleep(std::time::Duration::from_millis(2100));
    let r = at(
        &a,
        5,
        &answered("elicitation", r#"{"name":"Cy"}"#, t.as_deref()),
    );
    let v = refused(&r, 400, -32602, json!(5));
    assert!(
        v["error"]["message"].as_str().unwrap().contains("expired"),
        "{v}"
    );

    std::fs::write(&key, "not a key\n").unwrap();
    let err = common::fails_to_start(&with(&shared));
    assert!(
        err.contains("http.request_state_key_file") && err.contains("64 hexadecimal digits"),
        "{err}"
    );
    let err = common::fails_to_start(&with("request_state_ttl = \"0s\""));
    assert!(err.contains("http.request_state_ttl"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A router's state travels through the client in 2026-07-28, so it is
/// bounded (4 KiB of JSON text), as is a chosen input key (64 bytes): past
/// either, the call fails with -32603 naming the limit, and no token is
/// made. (`chaos`'s `big_state`.)
#[test]
fn a_state_or_key_too_large_to_travel_fails_the_call_naming_the_limit() {
    let b = broker();
    let call = |id: u32, args: &str| {
        let mut c = Conn::connect(b.http);
        let body = req(
            &id.to_string(),
            "tools/call",
            &format!(r#""name":"big_state","arguments":{args}"#),
        );
        modern(&mut c, "tools/call", Some("big_state"), &body)
    };
    // 4,094 characters are 4,096 bytes of JSON text: the largest that goes.
    let (_, token) = input_required(&call(1, r#"{"bytes":4094}"#), "elicitation");
    assert!(token.is_some());
    let (_, token) = input_required(&call(2, r#"{"bytes":1,"key_bytes":64}"#), &"k".repeat(64));
    assert!(token.is_some());
    for (id, args, says) in [
        (3, r#"{"bytes":4095}"#, "is 4097 bytes; at most 4096"),
        (
            4,
            r#"{"bytes":1,"key_bytes":65}"#,
            "must be 1 to 64 bytes long, not 65",
        ),
        (
            5,
            r#"{"bytes":1,"key_bytes":0}"#,
            "must be 1 to 64 bytes long, not 0",
        ),
    ] {
        let r = call(id, args);
        assert_eq!(r.status, 200, "{}", r.text());
        let v = r.json();
        assert_eq!(v["error"]["code"], -32603, "{v}");
        assert!(
            v["error"]["message"].as_str().unwrap().contains(says),
            "{v}"
        );
    }
    assert_eq!(b.metric_sum("mcp_http_request_states_issued_total"), 2.0);
    // Counted as the client was answered: two questions asked (ok), three
    // internal errors (each read `ok`, the router's question).
    let calls = |outcome: &str| b.requests("http", "call_tool", outcome);
    assert_eq!((calls("ok"), calls("internal")), (2.0, 3.0));
}

/// A set of questions that cannot be asked (the router's fault) fails the
/// call with -32603 naming the fault, and nothing is asked. (`chaos`'s
/// `bad_set`.)
#[test]
fn a_set_that_cannot_be_asked_fails_the_call_naming_its_fault() {
    let b = broker();
    let nine: Vec<String> = (0..9)
        .map(|i| format!(r#""k{i}":{{"method":"roots/list"}}"#))
        .collect();
    let nine = format!("{{{}}}", nine.join(","));
    for (id, set, says) in [
        (1, "[1]", "must be an object"),
        (2, "{}", "holds 0 questions"),
        (3, &nine[..], "holds 9 questions; a set is 1 to 8"),
        (
            4,
            r#"{"a":{"method":"tools/call","params":{}}}"#,
            "method `tools/call`",
        ),
        (
            5,
            r#"{"a":{"method":"sampling/createMessage"}}"#,
            "`params` must be an object",
        ),
        (
            6,
            r#"{"":{"method":"roots/list"}}"#,
            "1 to 64 bytes long, not 0",
        ),
    ] {
        let args = serde_json::json!({ "set": set }).to_string();
        let mut c = Conn::connect(b.http);
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{{},"name":"bad_set","arguments":{args}}}}}"#,
            meta(r#"{"elicitation":{},"sampling":{},"roots":{}}"#)
        );
        let r = modern(&mut c, "tools/call", Some("bad_set"), &body);
        assert_eq!(r.status, 200, "{}", r.text());
        let v = r.json();
        assert_eq!(v["error"]["code"], -32603, "{set}: {v}");
        let message = v["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("`bad_set`") && message.contains(says),
            "{set}: {v}"
        );
    }
    assert_eq!(b.metric_sum("mcp_http_request_states_issued_total"), 0.0);
}

/// A tool asks three questions at once (`mcp-broker/input-requests`): one
/// InputRequiredResult holding them all, with a requestState naming their
/// keys; the retry's answers reach the tool together as `_inputs`.
#[test]
fn a_set_of_questions_is_one_input_required_result_answered_together() {
    let b = broker();
    const TOOL: &str = "test_input_required_result_multiple_inputs";
    const ALL: &str = r#"{"elicitation":{},"sampling":{},"roots":{}}"#;
    let call = |id: u32, caps: &str, extra: &str| {
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{{},"name":"{TOOL}","arguments":{{}}{extra}}}}}"#,
            meta(caps)
        );
        let mut c = Conn::connect(b.http);
        modern(&mut c, "tools/call", Some(TOOL), &body)
    };
    let r = call(1, ALL, "");
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    let asks = v["result"]["inputRequests"]
        .as_object()
        .expect("input requests");
    let methods: Vec<(&str, &str)> = asks
        .iter()
        .map(|(k, q)| (k.as_str(), q["method"].as_str().unwrap_or_default()))
        .collect();
    assert_eq!(
        methods,
        [
            ("client_roots", "roots/list"),
            ("greeting", "sampling/createMessage"),
            ("user_name", "elicitation/create"),
        ],
        "{v}"
    );
    assert_eq!(asks["greeting"]["params"]["maxTokens"], 50, "{v}");
    // The router's own meta entry is the broker's, never the client's.
    assert!(!r.text().contains("mcp-broker/"), "{}", r.text());
    let token = v["result"]["requestState"]
        .as_str()
        .expect("a set always has its requestState")
        .to_owned();
    let name = r#""user_name":{"action":"accept","content":{"name":"Ada"}}"#;
    let greeting = r#""greeting":{"role":"assistant","content":{"type":"text","text":"Hi there"},"model":"m"}"#;
    let roots = r#""client_roots":{"roots":[{"uri":"file:///work"}]}"#;
    // Every answer: the tool completes with all three.
    let answers =
        format!(r#","inputResponses":{{{name},{greeting},{roots}}},"requestState":"{token}""#);
    assert_eq!(
        complete_text(&call(2, ALL, &answers)),
        "Hello, Ada! Greeting: Hi there. Roots: 1"
    );
    // One missing: the tool gets the two, and asks the set again.
    let two = format!(r#","inputResponses":{{{name},{roots}}},"requestState":"{token}""#);
    let v = call(3, ALL, &two).json();
    assert_eq!(v["result"]["resultType"], "input_required", "{v}");
    assert_eq!(
        v["result"]["inputRequests"].as_object().map(|o| o.len()),
        Some(3),
        "{v}"
    );
    // A wrong answer to any of them is refused, naming its key.
    let bad = format!(r#","inputResponses":{{{name},"client_roots":[]}},"requestState":"{token}""#);
    let v = refused(&call(4, ALL, &bad), 400, -32602, json!(4));
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("client_roots"),
        "{v}"
    );
    // A client lacking one capability the set needs is asked nothing.
    let v = refused(
        &call(5, r#"{"elicitation":{},"roots":{}}"#, ""),
        400,
        -32021,
        json!(5),
    );
    assert_eq!(
        v["error"]["data"]["requiredCapabilities"],
        json!({"sampling": {}}),
        "{v}"
    );
}

#[test]
fn a_retry_without_request_state_hands_other_answers_to_the_tool() {
    let b = broker();
    const TOOL: &str = "test_input_required_result_elicitation";
    let call = |id: u32, responses: &str| {
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{{},"name":"{TOOL}","arguments":{{}},"inputResponses":{responses}}}}}"#,
            meta(r#"{"elicitation":{}}"#)
        );
        let mut c = Conn::connect(b.http);
        modern(&mut c, "tools/call", Some(TOOL), &body)
    };
    // No requestState names `user_name`: the answer reaches the tool in
    // `_inputs` with the extras, and the tool reads its own.
    let r = call(
        1,
        r#"{"user_name":{"action":"accept","content":{"name":"Alice"}},"unknown_extra_key":{"action":"accept","content":{"foo":"bar"}}}"#,
    );
    assert_eq!(complete_text(&r), "Hello, Alice!");
    // Neither its key nor an object: nothing answers the tool, which asks
    // again.
    for responses in [
        r#"{"wrong_key":{"action":"accept"}}"#,
        r#"{"user_name":12345}"#,
    ] {
        let v = call(2, responses).json();
        assert_eq!(
            v["result"]["resultType"], "input_required",
            "{responses}: {v}"
        );
    }
    // `_inputs` is the broker's: a client argument of that name is refused.
    let body = format!(
        r#"{{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{{{},"name":"{TOOL}","arguments":{{"_inputs":{{}}}}}}}}"#,
        meta(r#"{"elicitation":{}}"#)
    );
    let mut c = Conn::connect(b.http);
    refused(
        &modern(&mut c, "tools/call", Some(TOOL), &body),
        400,
        -32602,
        json!(3),
    );
}

/// A tool asks for the client's roots (`mcp-broker/roots`): in 2026-07-28
/// a `roots/list` input request, under the key the router names (so with a
/// requestState), the retry's ListRootsResult handed to it as `_roots`; a
/// client that did not declare `roots` gets -32021.
#[test]
fn roots_are_an_input_request_and_come_back_as_an_argument() {
    let b = broker();
    const TOOL: &str = "test_input_required_result_list_roots";
    let with_caps = |id: u32, caps: &str, extra: &str| {
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{{},"name":"{TOOL}","arguments":{{}}{extra}}}}}"#,
            meta(caps)
        );
        let mut c = Conn::connect(b.http);
        modern(&mut c, "tools/call", Some(TOOL), &body)
    };
    let r = with_caps(1, r#"{"roots":{}}"#, "");
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    let ask = &v["result"]["inputRequests"]["client_roots"];
    assert_eq!(ask["method"], "roots/list", "{v}");
    assert_eq!(ask["params"], json!({}), "{v}");
    let token = v["result"]["requestState"]
        .as_str()
        .expect("a named key")
        .to_owned();
    let answer = format!(
        r#","inputResponses":{{"client_roots":{{"roots":[{{"uri":"file:///work","name":"Work"}},{{"uri":"file:///tmp"}}]}}}},"requestState":"{token}""#
    );
    let r = with_caps(2, r#"{"roots":{}}"#, &answer);
    assert_eq!(complete_text(&r), "Roots: file:///work, file:///tmp");
    // Not a ListRootsResult object: invalid params.
    let bad = format!(r#","inputResponses":{{"client_roots":[]}},"requestState":"{token}""#);
    refused(
        &with_caps(3, r#"{"roots":{}}"#, &bad),
        400,
        -32602,
        json!(3),
    );
    // No roots capability declared: the question is never sent.
    let r = with_caps(4, r#"{"elicitation":{}}"#, "");
    let v = refused(&r, 400, -32021, json!(4));
    assert_eq!(
        v["error"]["data"]["requiredCapabilities"],
        json!({"roots": {}}),
        "{v}"
    );
}

/// TCP does not tell a half-close from a close, and 2026-07-28 cancels a
/// call by closing its connection: a client that shuts its write side
/// after its POST is taken as gone, its call stopped rather than answered
/// (docs/abuse.md). The frame edge, whose protocol has a cancel of its own,
/// answers a half-closed peer instead.
#[test]
fn a_half_close_after_the_request_is_a_client_gone_and_stops_the_call() {
    use std::io::{Read, Write};
    use std::time::{Duration, Instant};
    let b = broker();
    let replaced = || b.metric_sum("mcp_router_instances_replaced_total");
    let before = replaced();
    let body = req(
        "1",
        "tools/call",
        r#""name":"sleep","arguments":{"ms":4000}"#,
    );
    let mut s = std::net::TcpStream::connect(b.http).unwrap();
    write!(
        s,
        "POST /mcp HTTP/1.1\r\nHost: t\r\nAccept: application/json, text/event-stream\r\n\
         Content-Type: application/json\r\nMCP-Protocol-Version: {V}\r\n\
         Mcp-Method: tools/call\r\nMcp-Name: sleep\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let t = Instant::now();
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    assert!(
        t.elapsed() < Duration::from_secs(3),
        "the connection was held for the call's 4 s: {:?}",
        t.elapsed()
    );
    assert!(
        !String::from_utf8_lossy(&got).contains("slept"),
        "answered after a half-close: {}",
        String::from_utf8_lossy(&got)
    );
    assert!(
        common::http::eventually(Duration::from_secs(5), || replaced() > before),
        "the call's guest was not stopped"
    );
}

/// A listen stream is fed at the writers' rate: one whose client reads
/// nothing is ended past 1 MiB unread, and counted, where its queue grew
/// until `http.write_timeout` cut its connection (the lifecycle audit). A
/// stream that reads hears every write.
#[test]
fn a_listen_stream_left_unread_is_ended_at_its_bound() {
    use std::io::{Read, Write};
    const WRITES: usize = 6000;
    let b = Broker::start_with_config(&listen_config(KV), &[]);
    let key = "x".repeat(2000);
    let filter = format!(r#"{{"resourceSubscriptions":["kv://{key}"]}}"#);
    // Never read after its head.
    let _stuck = listen(&b, "1", &filter);
    // Read by a thread, counting the notices as they come.
    let body = req(
        "2",
        "subscriptions/listen",
        &format!(r#""notifications":{filter}"#),
    );
    let mut s = std::net::TcpStream::connect(b.http).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .unwrap();
    s.write_all(
        format!(
            "POST /mcp HTTP/1.1\r\nHost: x\r\nAccept: application/json, text/event-stream\r\nContent-Type: application/json\r\nMCP-Protocol-Version: {V}\r\nMcp-Method: subscriptions/listen\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    )
    .unwrap();
    let (acked_tx, acked) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        let needle = b"resources/updated";
        let (mut seen, mut tail, mut buf) = (0usize, Vec::new(), vec![0u8; 64 << 10]);
        let mut acked_tx = Some(acked_tx);
        while seen < WRITES {
            let Ok(n) = s.read(&mut buf) else { break };
            if n == 0 {
                break;
            }
            tail.extend_from_slice(&buf[..n]);
            if tail.windows(12).any(|w| w == b"acknowledged")
                && let Some(tx) = acked_tx.take()
            {
                let _ = tx.send(());
            }
            seen += tail.windows(needle.len()).filter(|w| w == needle).count();
            // Kept: what could be the start of a needle cut by this read.
            tail.drain(..tail.len().saturating_sub(needle.len() - 1));
        }
        seen
    });
    acked
        .recv_timeout(std::time::Duration::from_secs(10))
        .expect("the reading stream was acknowledged");
    let mut w = b.connect();
    let quoted = format!("\"{key}\"");
    for _ in 0..WRITES {
        let r = w.call("put", &[("key", &quoted), ("value", "1")], None);
        assert!(common::tool_text(&r).starts_with("stored"));
    }
    assert_eq!(
        reader.join().unwrap(),
        WRITES,
        "the reading stream heard every write"
    );
    let cut = || b.metric_where("mcp_http_streams_cut_total", &[r#"kind="listen""#]);
    assert_eq!(cut(), 1.0, "the unread stream was ended, once");
}
