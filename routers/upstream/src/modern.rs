//! Protocol 2026-07-28 (stateless) towards the upstream: what a request
//! carries besides its params, how `server/discover` opens the "session",
//! and how a tool's `InputRequiredResult` becomes the broker's question.
//!
//! In 2026-07-28 there is no `initialize` and no session: every request
//! names the revision, the client's capabilities and identity in
//! `params._meta`, and repeats its method and name in headers
//! (`MCP-Protocol-Version`, `Mcp-Method`, `Mcp-Name`, and `Mcp-Param-*` for
//! the tool arguments whose schema says `x-mcp-header`), which the server
//! holds to the body. A tool that needs the client's input answers
//! `resultType: "input_required"` with its questions and an opaque
//! `requestState`; the client retries the same call with `inputResponses`
//! and that state. Through the broker this is the router convention for a
//! set of questions (`mcp-broker/input-requests`, docs/http.md): the
//! upstream's questions go to the broker's client as they are, the
//! upstream's `requestState` rides the router's own state
//! (`mcp-broker/state`), and the retry arrives as `_inputs` and
//! `_request_state`, which become the upstream retry's `inputResponses`
//! and `requestState`.
//!
//! Pure: no I/O, so the unit tests run natively.

use base64::Engine as _;
use serde_json::{Map, Value, json};

/// The revision.
pub const VERSION: &str = "2026-07-28";

/// Meta key of a set of questions for the broker's client.
pub const META_INPUT_REQUESTS: &str = "mcp-broker/input-requests";
/// Meta key of the router's own state, handed back on the retry.
pub const META_STATE: &str = "mcp-broker/state";
/// The arguments the broker re-calls the tool with: the answers by key,
/// and the state.
pub const INPUTS_ARG: &str = "_inputs";
pub const STATE_ARG: &str = "_request_state";

/// The error of a request other than `tools/call` that the upstream
/// answers with questions: the router world asks from `call-tool` alone.
/// `{what}`: what was being done.
pub const CANNOT_ASK: &str = "the upstream asks the client for input before {what}, which the broker cannot pass on: only a tool call can ask";

/// The text of the result that asks the upstream's questions: only a
/// client of an edge without the multi round-trip (gRPC, frames) sees it,
/// with the questions in the result's meta.
pub const ASKED: &str = "The upstream asks the client for input first (the questions are in this result's meta); the MCP HTTP edge asks them and retries.";

/// Which revision to speak: `MCP_UPSTREAM_PROTOCOL`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Choice {
    /// `server/discover` first; a server that does not offer 2026-07-28
    /// gets `initialize` (2025-06-18) instead. The default.
    Auto,
    /// 2026-07-28 only: a server that does not offer it is unavailable.
    Modern,
    /// 2025-06-18 sessions only, without the probe.
    Legacy,
}

impl Choice {
    /// The setting's value (empty: the default).
    pub fn parse(setting: &str) -> Result<Choice, String> {
        match setting.trim() {
            "" | "auto" => Ok(Choice::Auto),
            VERSION => Ok(Choice::Modern),
            crate::rpc::PROTOCOL_VERSION => Ok(Choice::Legacy),
            other => Err(format!(
                "MCP_UPSTREAM_PROTOCOL is `{other}`: one of auto, {VERSION} and {}",
                crate::rpc::PROTOCOL_VERSION
            )),
        }
    }
}

/// The `_meta` every request carries. The client capabilities are all
/// three kinds of question: the broker asks its own client, and refuses
/// one that lacks the capability before anything is asked. `log`: ask for
/// every log message of the call (the broker filters by its client's
/// level).
pub fn request_meta(log: bool) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert(
        "io.modelcontextprotocol/protocolVersion".into(),
        VERSION.into(),
    );
    m.insert(
        "io.modelcontextprotocol/clientCapabilities".into(),
        json!({"elicitation": {"form": {}}, "sampling": {}, "roots": {}}),
    );
    m.insert(
        "io.modelcontextprotocol/clientInfo".into(),
        json!({"name": "mcp-broker-upstream", "version": env!("CARGO_PKG_VERSION")}),
    );
    if log {
        m.insert("io.modelcontextprotocol/logLevel".into(), "debug".into());
    }
    m
}

/// `params` (none: an empty object) with `meta` merged into its `_meta`.
pub fn with_meta(params: Option<Value>, meta: Map<String, Value>) -> Value {
    let mut p = match params {
        Some(Value::Object(p)) => p,
        _ => Map::new(),
    };
    match p.get_mut("_meta") {
        Some(Value::Object(m)) => m.extend(meta),
        _ => {
            p.insert("_meta".into(), Value::Object(meta));
        }
    }
    Value::Object(p)
}

/// A header value as the revision sends it: as is when it is visible
/// ASCII without surrounding blanks, else `=?base64?<standard base64 of
/// its UTF-8>?=`.
pub fn header_value(s: &str) -> String {
    // A plain value that looks like the encoding is encoded too, so that
    // the server does not decode it.
    let looks_encoded = s.starts_with("=?base64?") && s.ends_with("?=");
    let plain = s.bytes().all(|b| (0x20..0x7f).contains(&b))
        && !s.starts_with([' ', '\t'])
        && !s.ends_with([' ', '\t'])
        && !looks_encoded;
    if plain {
        s.to_owned()
    } else {
        let b64 = base64::engine::general_purpose::STANDARD.encode(s.as_bytes());
        format!("=?base64?{b64}?=")
    }
}

/// `Mcp-Method`, and `Mcp-Name` for the methods that name something
/// (`tools/call` and `prompts/get` their `name`, `resources/read` its
/// `uri`).
pub fn request_headers(method: &str, params: &Value) -> Vec<(String, String)> {
    let mut h = vec![("mcp-method".to_owned(), header_value(method))];
    let named = match method {
        "tools/call" | "prompts/get" => params.get("name"),
        "resources/read" => params.get("uri"),
        _ => None,
    };
    if let Some(n) = named.and_then(Value::as_str) {
        h.push(("mcp-name".into(), header_value(n)));
    }
    h
}

/// The `Mcp-Param-<name>` headers of a `tools/call` with `args`: one per
/// property of the tool's `inputSchema` (reached through `properties`
/// only) that declares `x-mcp-header` on a string, integer or boolean and
/// has a value in the arguments; the server holds each to the body.
pub fn param_headers(schema: &Value, args: &Value) -> Vec<(String, String)> {
    fn walk(schema: &Value, args: Option<&Value>, out: &mut Vec<(String, String)>) {
        let Some(props) = schema.get("properties").and_then(Value::as_object) else {
            return;
        };
        for (key, prop) in props {
            let value = args.and_then(|a| a.get(key));
            if let Some(name) = prop.get("x-mcp-header").and_then(Value::as_str) {
                let text = match (prop.get("type").and_then(Value::as_str), value) {
                    (Some("string"), Some(Value::String(s))) => Some(s.clone()),
                    (Some("integer"), Some(n @ Value::Number(_))) => Some(n.to_string()),
                    (Some("boolean"), Some(Value::Bool(b))) => Some(b.to_string()),
                    _ => None,
                };
                if let Some(text) = text {
                    out.push((
                        format!("mcp-param-{}", name.to_ascii_lowercase()),
                        header_value(&text),
                    ));
                }
            }
            walk(prop, value, out);
        }
    }
    let mut out = Vec::new();
    walk(schema, Some(args), &mut out);
    out
}

/// The rules for `x-mcp-header`, shared with the broker's route table (one
/// file, included by path: both judge a schema alike).
#[path = "../../../broker/src/header_declarations.rs"]
mod rules;

/// Why a tool's `x-mcp-header` declarations make the tool invalid, or
/// `Ok` (the rules: `broker/src/header_declarations.rs`). 2026-07-28 says a
/// client MUST drop such a tool. Kept, it would be listed by the broker
/// and then fail every call: a header name that is not a token is refused
/// by the HTTP client, and a server drops the declaration anyway.
pub fn header_declarations(schema: &Value) -> Result<(), String> {
    rules::check(schema)
}

/// A `server/discover` result as the `initialize` result the rest of the
/// router reads (`protocolVersion`, `capabilities`, `serverInfo`,
/// `instructions`); `Err` when the server does not offer 2026-07-28.
pub fn discovered(result: &Value) -> Result<Value, String> {
    let versions: Vec<&str> = result
        .get("supportedVersions")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    if !versions.contains(&VERSION) {
        return Err(format!(
            "server/discover offers {versions:?}, not {VERSION}"
        ));
    }
    // serverInfo moved into `_meta` (spec PR #3002); older drafts kept it
    // in the result.
    let info = result
        .pointer("/_meta/io.modelcontextprotocol~1serverInfo")
        .or_else(|| result.get("serverInfo"))
        .cloned()
        .unwrap_or(Value::Null);
    let mut init = Map::new();
    init.insert("protocolVersion".into(), VERSION.into());
    init.insert(
        "capabilities".into(),
        result
            .get("capabilities")
            .cloned()
            .unwrap_or_else(|| json!({})),
    );
    init.insert("serverInfo".into(), info);
    if let Some(i) = result.get("instructions") {
        init.insert("instructions".into(), i.clone());
    }
    Ok(Value::Object(init))
}

/// Whether a result asks for input (`resultType: "input_required"`).
pub fn asks(result: &Value) -> bool {
    result.get("resultType").and_then(Value::as_str) == Some("input_required")
}

/// The meta entries (key, JSON text) that put an upstream's
/// `InputRequiredResult` to the broker's client: its `inputRequests` as a
/// set of questions, and its `requestState` as the router's state. `Err`
/// when it asks nothing the broker can pass on.
pub fn question(result: &Value) -> Result<Vec<(String, String)>, String> {
    let requests = match result.get("inputRequests") {
        Some(Value::Object(r)) if !r.is_empty() => r,
        _ => return Err("an InputRequiredResult without inputRequests".into()),
    };
    let mut out = vec![(
        META_INPUT_REQUESTS.to_owned(),
        Value::Object(requests.clone()).to_string(),
    )];
    match result.get("requestState") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => {
            out.push((META_STATE.into(), json!({"requestState": s}).to_string()));
        }
        Some(_) => return Err("an InputRequiredResult whose requestState is not a string".into()),
    }
    Ok(out)
}

/// What the broker's retry hands back, as the upstream retry's params:
/// `inputResponses` (the answers by key, as the broker's client gave
/// them) and `requestState` (the upstream's, from the router's state).
pub fn retry(inputs: Option<Value>, state: Option<Value>) -> Map<String, Value> {
    let mut p = Map::new();
    if let Some(i @ Value::Object(_)) = inputs {
        p.insert("inputResponses".into(), i);
    }
    if let Some(Value::String(s)) = state.as_ref().and_then(|s| s.get("requestState")) {
        p.insert("requestState".into(), Value::String(s.clone()));
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_setting_picks_a_revision_and_refuses_others() {
        assert_eq!(Choice::parse("").unwrap(), Choice::Auto);
        assert_eq!(Choice::parse(" auto ").unwrap(), Choice::Auto);
        assert_eq!(Choice::parse("2026-07-28").unwrap(), Choice::Modern);
        assert_eq!(Choice::parse("2025-06-18").unwrap(), Choice::Legacy);
        let e = Choice::parse("2024-11-05").unwrap_err();
        assert!(e.contains("2024-11-05") && e.contains("auto"), "{e}");
    }

    #[test]
    fn header_declarations_follow_the_revisions_rules() {
        let prop = |decl: Value, ty: &str| json!({"type": ty, "x-mcp-header": decl});
        let valid = json!({"type": "object", "properties": {
            "region": prop(json!("Region"), "string"),
            "n": prop(json!("N-1"), "integer"),
            "deep": {"type": "object", "properties": {"on": prop(json!("On"), "boolean")}},
            // Data, not a schema: its keys declare nothing.
            "plain": {"type": "object", "default": {"x-mcp-header": "Data"}},
            // A property may be named like the keyword.
            "properties": {"type": "string"}
        }});
        assert_eq!(header_declarations(&valid), Ok(()));
        assert_eq!(header_declarations(&json!({"type": "object"})), Ok(()));
        let invalid = [
            (
                json!({"properties": {"a": prop(json!("Has Space"), "string")}}),
                "header name",
            ),
            (
                json!({"properties": {"a": prop(json!(""), "string")}}),
                "header name",
            ),
            (
                json!({"properties": {"a": prop(json!("Ré"), "string")}}),
                "header name",
            ),
            (
                json!({"properties": {"a": prop(json!(7), "string")}}),
                "not a string",
            ),
            (
                json!({"properties": {"a": prop(json!("A"), "number")}}),
                "not a string, integer",
            ),
            (
                json!({"properties": {"a": {"x-mcp-header": "A"}}}),
                "not a string, integer",
            ),
            (
                json!({"properties": {"a": prop(json!("Dup"), "string"), "b": prop(json!("dUP"), "integer")}}),
                "declared twice",
            ),
            (
                json!({"properties": {"a": {"type": "array", "items": prop(json!("A"), "string")}}}),
                "reached through",
            ),
            (
                json!({"properties": {"a": {"oneOf": [prop(json!("A"), "string")]}}}),
                "reached through",
            ),
            (
                json!({"$defs": {"x": {"properties": {"a": prop(json!("A"), "string")}}}}),
                "reached through",
            ),
            (
                json!({"type": "string", "x-mcp-header": "Root"}),
                "reached through",
            ),
        ];
        for (schema, why) in invalid {
            let e = header_declarations(&schema).unwrap_err();
            assert!(e.contains(why), "{schema}: {e}");
        }
    }

    #[test]
    fn every_request_names_the_revision_and_the_client() {
        let p = with_meta(
            Some(json!({"name": "t", "_meta": {"progressToken": 3}})),
            request_meta(true),
        );
        assert_eq!(p["name"], "t");
        let m = &p["_meta"];
        assert_eq!(m["progressToken"], 3);
        assert_eq!(m["io.modelcontextprotocol/protocolVersion"], VERSION);
        assert_eq!(m["io.modelcontextprotocol/logLevel"], "debug");
        assert!(m["io.modelcontextprotocol/clientCapabilities"]["sampling"].is_object());
        let p = with_meta(None, request_meta(false));
        assert!(p["_meta"].get("io.modelcontextprotocol/logLevel").is_none());
    }

    #[test]
    fn headers_repeat_method_and_name_encoding_what_is_not_plain_ascii() {
        let h = request_headers("tools/call", &json!({"name": "echo"}));
        assert_eq!(
            h,
            [
                ("mcp-method".into(), "tools/call".into()),
                ("mcp-name".into(), "echo".into())
            ]
        );
        let h = request_headers("resources/read", &json!({"uri": "file:///Zürich"}));
        assert_eq!(h[1].1, "=?base64?ZmlsZTovLy9aw7xyaWNo?=");
        assert_eq!(request_headers("tools/list", &json!({})).len(), 1);
        assert_eq!(header_value(" x"), "=?base64?IHg=?=");
        assert_eq!(
            header_value("=?base64?eA==?="),
            "=?base64?PT9iYXNlNjQ/ZUE9PT89?="
        );
    }

    #[test]
    fn param_headers_follow_the_schema_and_the_arguments() {
        let schema = json!({"type": "object", "properties": {
            "region": {"type": "string", "x-mcp-header": "Region"},
            "count": {"type": "integer", "x-mcp-header": "Count"},
            "dry": {"type": "boolean", "x-mcp-header": "Dry"},
            "absent": {"type": "string", "x-mcp-header": "Absent"},
            "wrong": {"type": "string", "x-mcp-header": "Wrong"},
            "nested": {"type": "object", "properties": {"id": {"type": "string", "x-mcp-header": "Id"}}},
            "plain": {"type": "string"}
        }});
        let args = json!({"region": "Zürich", "count": 42, "dry": false, "wrong": 5, "nested": {"id": "a"}, "plain": "p"});
        let mut h = param_headers(&schema, &args);
        h.sort();
        assert_eq!(
            h,
            [
                ("mcp-param-count".into(), "42".into()),
                ("mcp-param-dry".into(), "false".into()),
                ("mcp-param-id".into(), "a".into()),
                ("mcp-param-region".into(), "=?base64?WsO8cmljaA==?=".into()),
            ]
        );
        assert!(param_headers(&json!({}), &args).is_empty());
    }

    #[test]
    fn discover_opens_a_modern_session_only_when_it_offers_the_revision() {
        let r = json!({
            "resultType": "complete",
            "supportedVersions": ["2025-11-25", "2026-07-28"],
            "capabilities": {"tools": {"listChanged": true}},
            "instructions": "Be brief.",
            "_meta": {"io.modelcontextprotocol/serverInfo": {"name": "up", "version": "1"}}
        });
        let init = discovered(&r).unwrap();
        assert_eq!(init["serverInfo"]["name"], "up");
        assert_eq!(init["capabilities"]["tools"]["listChanged"], true);
        assert_eq!(init["instructions"], "Be brief.");
        assert_eq!(init["protocolVersion"], VERSION);
        let old = json!({"supportedVersions": ["2025-11-25"], "serverInfo": {"name": "o"}});
        assert!(discovered(&old).unwrap_err().contains("2025-11-25"));
        let pre = json!({"supportedVersions": ["2026-07-28"], "serverInfo": {"name": "pre"}});
        assert_eq!(discovered(&pre).unwrap()["serverInfo"]["name"], "pre");
    }

    #[test]
    fn an_input_required_result_becomes_a_set_and_its_retry_the_upstreams() {
        let r = json!({
            "resultType": "input_required",
            "inputRequests": {"user_name": {"method": "elicitation/create", "params": {"message": "Name?"}}},
            "requestState": "opaque-1"
        });
        assert!(asks(&r));
        let meta = question(&r).unwrap();
        assert_eq!(meta[0].0, META_INPUT_REQUESTS);
        let set: Value = serde_json::from_str(&meta[0].1).unwrap();
        assert_eq!(set["user_name"]["method"], "elicitation/create");
        assert_eq!(
            meta[1],
            (META_STATE.into(), r#"{"requestState":"opaque-1"}"#.into())
        );
        // The broker hands both back; they become the upstream's retry.
        let state: Value = serde_json::from_str(&meta[1].1).unwrap();
        let p = retry(
            Some(json!({"user_name": {"action": "accept"}})),
            Some(state),
        );
        assert_eq!(
            Value::Object(p),
            json!({
                "inputResponses": {"user_name": {"action": "accept"}},
                "requestState": "opaque-1"
            })
        );
        // No state: the set alone. Nothing to ask, or a state of the wrong
        // type: refused.
        let r = json!({"resultType": "input_required", "inputRequests": {"r": {"method": "roots/list"}}});
        assert_eq!(question(&r).unwrap().len(), 1);
        assert!(question(&json!({"resultType": "input_required"})).is_err());
        let r =
            json!({"resultType": "input_required", "inputRequests": {"r": {}}, "requestState": 5});
        assert!(question(&r).is_err());
        assert!(!asks(&json!({"resultType": "complete"})));
        assert!(retry(None, None).is_empty());
    }
}

#[cfg(test)]
mod props {
    use super::*;
    use crate::arb;
    use proptest::prelude::*;

    /// What a header value may hold as sent: visible ASCII and spaces,
    /// no blank at either end.
    fn header_safe(v: &str) -> bool {
        v.bytes().all(|b| (0x20..0x7f).contains(&b)) && v.trim_matches([' ', '\t']) == v
    }

    /// A header value as the server decodes it.
    fn decoded(v: &str) -> String {
        match v
            .strip_prefix("=?base64?")
            .and_then(|b| b.strip_suffix("?="))
        {
            Some(b64) => {
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(b64)
                    .expect("base64");
                String::from_utf8(bytes).expect("UTF-8")
            }
            None => v.to_owned(),
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// `server/discover`: a 2026-07-28 session only when the result
        /// offers that revision, and then the `initialize` shape the rest
        /// of the router reads, with what the server said of itself.
        #[test]
        fn discover_opens_only_what_is_offered(r in arb::or_any(arb::init_result())) {
            let offered = r
                .get("supportedVersions")
                .and_then(Value::as_array)
                .is_some_and(|v| v.contains(&Value::from(VERSION)));
            let init = discovered(&r);
            prop_assert_eq!(init.is_ok(), offered);
            let Ok(init) = init else { return Ok(()) };
            prop_assert_eq!(&init["protocolVersion"], VERSION);
            let info = r
                .pointer("/_meta/io.modelcontextprotocol~1serverInfo")
                .or_else(|| r.get("serverInfo"))
                .cloned()
                .unwrap_or(Value::Null);
            prop_assert_eq!(&init["serverInfo"], &info);
            prop_assert_eq!(init.get("instructions"), r.get("instructions"));
        }

        /// An `InputRequiredResult`: its questions go to the broker's
        /// client as they were, and its `requestState` comes back whole in
        /// the retry the broker hands back; anything unfit is an error.
        #[test]
        fn questions_and_state_round_trip(r in arb::or_any(arb::input_required())) {
            let asked = question(&r);
            let requests = r
                .get("inputRequests")
                .and_then(Value::as_object)
                .filter(|m| !m.is_empty());
            let state = r.get("requestState").filter(|s| !s.is_null());
            let fit = requests.is_some() && state.is_none_or(Value::is_string);
            prop_assert_eq!(asked.is_ok(), fit);
            let Ok(meta) = asked else { return Ok(()) };
            prop_assert_eq!(&meta[0].0, META_INPUT_REQUESTS);
            let set: Value = serde_json::from_str(&meta[0].1).expect("JSON text");
            prop_assert_eq!(Some(&set), r.get("inputRequests"));
            let ours = meta
                .iter()
                .find(|(k, _)| k == META_STATE)
                .map(|(_, v)| serde_json::from_str::<Value>(v).expect("JSON text"));
            let back = retry(Some(set.clone()), ours);
            prop_assert_eq!(back.get("requestState"), state);
            prop_assert_eq!(back.get("inputResponses"), Some(&set));
        }

        /// Header values (a tool or resource name, an argument) are sent
        /// so that any string survives: plain when plain, else encoded,
        /// and decoded back to what it was.
        #[test]
        fn header_values_survive_any_string(s in arb::string()) {
            let v = header_value(&s);
            prop_assert!(header_safe(&v), "{:?}", v);
            prop_assert_eq!(decoded(&v), s);
        }

        /// `Mcp-Param-*` headers from any schema and arguments: no panic,
        /// every value fit for a header, and a declared argument of the
        /// declared type sent as its value (numbers as written).
        #[test]
        fn param_headers_carry_the_arguments(
            schema in arb::json(),
            args in arb::json(),
            declared in prop::collection::btree_map(
                arb::string(),
                (arb::string(), arb::string(), arb::number(), any::<bool>()),
                0..4,
            ),
        ) {
            // A schema that declares headers, with the arguments it names;
            // or any schema and arguments.
            let (schema, args, expected) = if declared.is_empty() {
                (schema, args, None)
            } else {
                let (mut props, mut values, mut expected) = (Map::new(), Map::new(), Vec::new());
                for (key, (header, text, n, int)) in declared {
                    let (ty, value, sent) = if int {
                        ("integer", n.clone(), n.to_string())
                    } else {
                        ("string", Value::String(text.clone()), text)
                    };
                    props.insert(key.clone(), json!({"type": ty, "x-mcp-header": header}));
                    values.insert(key, value);
                    expected.push((format!("mcp-param-{}", header.to_ascii_lowercase()), sent));
                }
                expected.sort();
                let schema = json!({"type": "object", "properties": props});
                (schema, Value::Object(values), Some(expected))
            };
            let mut sent = Vec::new();
            for (name, value) in param_headers(&schema, &args) {
                prop_assert!(name.starts_with("mcp-param-"), "{}", name);
                prop_assert!(header_safe(&value), "{:?}", value);
                sent.push((name, decoded(&value)));
            }
            if let Some(expected) = expected {
                sent.sort();
                prop_assert_eq!(sent, expected);
            }
        }
    }
}
