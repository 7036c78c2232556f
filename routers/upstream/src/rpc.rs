//! JSON-RPC 2.0 framing for the MCP client: building requests, telling the
//! messages of an answer apart, and collecting the notifications that arrive
//! on a request's SSE stream before its response.
//!
//! Pure: no I/O, so the unit tests run natively.

use serde_json::{Map, Value, json};

/// The MCP revision this client speaks (and offers in `initialize`).
pub const PROTOCOL_VERSION: &str = "2025-06-18";
/// Meta key of the log messages a call produced (routers/README.md "Logging").
pub const META_LOG: &str = "mcp-broker/log";
/// Meta key of the list kinds the upstream said changed during a call.
pub const META_LIST_CHANGED: &str = "mcp-broker/list-changed";
/// Meta key, in `describe-server`, of the reason the upstream is unusable.
pub const META_UNAVAILABLE: &str = "mcp-broker/unavailable";
/// Meta key, in `describe-server`, of the MCP revision spoken upstream.
pub const META_PROTOCOL: &str = "mcp-broker/upstream-protocol";
/// The broker forwards at most this many log messages per call.
pub const MAX_LOGS: usize = 64;
/// The prefix the host maps to its own "upstream unavailable" error code.
pub const UNAVAILABLE: &str = "upstream unavailable: ";
/// Request header naming the JSON-RPC id (its JSON text) of the MCP request
/// being sent, so that the host can send the upstream
/// `notifications/cancelled` for it if the broker abandons the call. The host
/// strips it before sending (broker/src/wasm/outbound.rs).
pub const REQUEST_ID_HEADER: &str = "mcp-broker-request-id";
/// Answer to a server-to-client request: the WIT has no way to ask the
/// broker's client, and leaving the request unanswered would stall the
/// upstream until it times out.
pub const REFUSAL: &str = "not supported through mcp-broker's upstream router";

/// A JSON-RPC error object from the upstream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RpcError {
    pub code: i64,
    pub message: String,
    /// `data.uri`: the resource an error names as unknown (-32002, or
    /// -32602 in 2026-07-28, SEP-2164).
    pub data_uri: Option<String>,
}

/// Why a request produced no result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// Transport or protocol failure; the text says what, with the method
    /// and URL, and starts with [`UNAVAILABLE`].
    Unavailable(String),
    /// The upstream answered with a JSON-RPC error.
    Rpc(RpcError),
}

/// `upstream unavailable: <method> to <origin>: <reason>`, the origin
/// being [`crate::http::Endpoint::shown`].
pub fn unavailable(method: &str, origin: &str, reason: &str) -> String {
    format!("{UNAVAILABLE}{method} to {origin}: {reason}")
}

pub fn request(id: u64, method: &str, params: Option<Value>) -> Vec<u8> {
    let mut m = Map::new();
    m.insert("jsonrpc".into(), "2.0".into());
    m.insert("id".into(), id.into());
    m.insert("method".into(), method.into());
    if let Some(p) = params {
        m.insert("params".into(), p);
    }
    Value::Object(m).to_string().into_bytes()
}

pub fn notification(method: &str) -> Vec<u8> {
    json!({"jsonrpc": "2.0", "method": method})
        .to_string()
        .into_bytes()
}

/// The error answer to a server-to-client request with this id.
pub fn refusal(id: &Value) -> Vec<u8> {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32601, "message": REFUSAL}})
        .to_string()
        .into_bytes()
}

/// The answer to a server `ping`.
pub fn pong(id: &Value) -> Vec<u8> {
    json!({"jsonrpc": "2.0", "id": id, "result": {}})
        .to_string()
        .into_bytes()
}

/// `initialize` params: this client's identity, no client capabilities
/// (no roots, sampling or elicitation: see the losses in lib.rs).
pub fn initialize_params() -> Value {
    json!({
        "protocolVersion": PROTOCOL_VERSION,
        "capabilities": {},
        "clientInfo": {"name": "mcp-broker-upstream", "version": env!("CARGO_PKG_VERSION")},
    })
}

/// One progress report seen during a call.
#[derive(Debug, Clone, PartialEq)]
pub struct Progress {
    pub progress: Option<f32>,
    pub message: Option<String>,
}

/// A notification passed on as it arrives, through the broker's host
/// imports (`mcp-broker:host/call`), instead of waiting for the result.
#[derive(Debug, Clone, PartialEq)]
pub enum Live {
    Progress {
        progress: f64,
        total: Option<f64>,
        message: Option<String>,
    },
    Log {
        level: String,
        logger: Option<String>,
        /// JSON text.
        data: String,
    },
}

/// Where [`Live`] notifications go; `None`: they are collected into the
/// result (progress list, `mcp-broker/log`).
#[derive(Clone, Copy, Default)]
pub struct Forward(pub Option<fn(Live)>);

impl std::fmt::Debug for Forward {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "Forward(on)"
        } else {
            "Forward(off)"
        })
    }
}

/// Two sinks are not told apart: what matters of a [`Collected`] is what it
/// collected.
impl PartialEq for Forward {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

/// What arrived on a request's stream besides its response.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Collected {
    /// Where progress and logs go as they arrive (else into the fields
    /// below).
    pub forward: Forward,
    pub progress: Vec<Progress>,
    /// MCP log messages `{level, logger?, data}`, at most [`MAX_LOGS`].
    pub logs: Vec<Value>,
    /// "tools", "resources", "prompts", each at most once, in arrival order.
    pub list_changed: Vec<&'static str>,
    /// Ids of server-to-client requests still to be refused.
    pub refuse: Vec<Value>,
    /// Ids of server `ping` requests still to be answered (with `{}`).
    pub pong: Vec<Value>,
}

impl Collected {
    /// Records one notification; unknown methods are dropped.
    pub fn note(&mut self, method: &str, params: &Value, progress_token: u64) {
        match method {
            "notifications/progress" => {
                // Only ours: the token we sent is the request id.
                let token = params.get("progressToken");
                let ours = match token {
                    Some(t @ (Value::Number(_) | Value::String(_))) => is_our_id(t, progress_token),
                    _ => true,
                };
                if !ours {
                    return;
                }
                let done = params.get("progress").and_then(Value::as_f64);
                let total = params.get("total").and_then(Value::as_f64);
                let message = params
                    .get("message")
                    .and_then(Value::as_str)
                    .map(str::to_owned);
                if let (Some(send), Some(progress)) = (self.forward.0, done) {
                    send(Live::Progress {
                        progress,
                        total,
                        message,
                    });
                    return;
                }
                let progress = match (done, total) {
                    (Some(d), Some(t)) if t > 0.0 => Some((d / t) as f32),
                    (Some(d), _) => Some(d as f32),
                    _ => None,
                };
                self.progress.push(Progress { progress, message });
            }
            "notifications/message" => {
                if let Some(send) = self.forward.0 {
                    let level = params.get("level").and_then(Value::as_str);
                    send(Live::Log {
                        level: level.unwrap_or("info").to_owned(),
                        logger: params
                            .get("logger")
                            .and_then(Value::as_str)
                            .map(str::to_owned),
                        data: params.get("data").unwrap_or(&Value::Null).to_string(),
                    });
                    return;
                }
                if self.logs.len() >= MAX_LOGS {
                    return;
                }
                let mut entry = Map::new();
                let level = params.get("level").and_then(Value::as_str);
                entry.insert("level".into(), level.unwrap_or("info").into());
                if let Some(l) = params.get("logger").and_then(Value::as_str) {
                    entry.insert("logger".into(), l.into());
                }
                entry.insert(
                    "data".into(),
                    params.get("data").cloned().unwrap_or(Value::Null),
                );
                self.logs.push(Value::Object(entry));
            }
            "notifications/tools/list_changed" => self.changed("tools"),
            "notifications/resources/list_changed" => self.changed("resources"),
            "notifications/prompts/list_changed" => self.changed("prompts"),
            _ => {}
        }
    }

    fn changed(&mut self, kind: &'static str) {
        if !self.list_changed.contains(&kind) {
            self.list_changed.push(kind);
        }
    }

    /// The meta entries (key, JSON text) carrying the logs and list changes.
    pub fn meta(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        if !self.logs.is_empty() {
            out.push((META_LOG.into(), Value::from(self.logs.clone()).to_string()));
        }
        if !self.list_changed.is_empty() {
            out.push((
                META_LIST_CHANGED.into(),
                Value::from(self.list_changed.clone()).to_string(),
            ));
        }
        out
    }
}

/// Whether `id` (a request id or progress token) is `ours`, sent as a
/// number: a server may echo it as a number or as its text.
pub fn is_our_id(id: &Value, ours: u64) -> bool {
    match id {
        Value::Number(n) => n.as_u64() == Some(ours),
        Value::String(s) => *s == ours.to_string(),
        _ => false,
    }
}

fn rpc_error(e: &Value) -> RpcError {
    RpcError {
        code: e.get("code").and_then(Value::as_i64).unwrap_or(-32603),
        message: e
            .get("message")
            .and_then(Value::as_str)
            .unwrap_or("(no message)")
            .to_owned(),
        data_uri: e
            .pointer("/data/uri")
            .and_then(Value::as_str)
            .map(str::to_owned),
    }
}

/// Takes one JSON-RPC message of the answer to request `id`: a notification
/// is collected, a server request queued for refusal, and the response to
/// `id` returned. Responses to other ids are ignored.
pub fn absorb(msg: &Value, id: u64, c: &mut Collected) -> Option<Result<Value, RpcError>> {
    if let Value::Array(batch) = msg {
        // Batches left MCP in 2025-06-18; accepted anyway, it costs nothing.
        let mut found = None;
        for m in batch {
            if let Some(r) = absorb(m, id, c) {
                found.get_or_insert(r);
            }
        }
        return found;
    }
    let method = msg.get("method").and_then(Value::as_str);
    let msg_id = msg.get("id");
    match (method, msg_id) {
        (Some(m), Some(req_id)) if !req_id.is_null() => {
            // A ping costs nothing to answer; anything else needs the
            // broker's client, which the WIT cannot reach.
            if m == "ping" {
                c.pong.push(req_id.clone());
            } else {
                c.refuse.push(req_id.clone());
            }
            None
        }
        (Some(m), _) => {
            let params = msg.get("params").cloned().unwrap_or(Value::Null);
            c.note(m, &params, id);
            None
        }
        (None, Some(r)) => {
            // An error with a null id is the upstream failing to parse what
            // we sent: it concerns our request.
            let error = msg.get("error");
            if !(is_our_id(r, id) || (r.is_null() && error.is_some())) {
                return None;
            }
            Some(match error {
                Some(e) => Err(rpc_error(e)),
                None => Ok(msg.get("result").cloned().unwrap_or(Value::Null)),
            })
        }
        (None, None) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_framing() {
        let r: Value = serde_json::from_slice(&request(3, "tools/list", None)).unwrap();
        assert_eq!(r, json!({"jsonrpc":"2.0","id":3,"method":"tools/list"}));
        let r: Value = serde_json::from_slice(&request(4, "x", Some(json!({"a": 1})))).unwrap();
        assert_eq!(r["params"]["a"], 1);
        let n: Value = serde_json::from_slice(&notification("notifications/initialized")).unwrap();
        assert!(n.get("id").is_none());
        let e: Value = serde_json::from_slice(&refusal(&json!("s-1"))).unwrap();
        assert_eq!(e["id"], "s-1");
        assert_eq!(e["error"]["code"], -32601);
    }

    #[test]
    fn response_matching() {
        let mut c = Collected::default();
        assert_eq!(
            absorb(&json!({"jsonrpc":"2.0","id":5,"result":{"x":1}}), 5, &mut c),
            Some(Ok(json!({"x":1})))
        );
        assert_eq!(
            absorb(&json!({"jsonrpc":"2.0","id":"5","result":{}}), 5, &mut c),
            Some(Ok(json!({})))
        );
        assert_eq!(
            absorb(&json!({"jsonrpc":"2.0","id":6,"result":{}}), 5, &mut c),
            None
        );
        assert_eq!(
            absorb(
                &json!({"jsonrpc":"2.0","id":5,"error":{"code":-32602,"message":"bad"}}),
                5,
                &mut c
            ),
            Some(Err(RpcError {
                code: -32602,
                message: "bad".into(),
                data_uri: None,
            }))
        );
        assert!(matches!(
            absorb(
                &json!({"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"parse"}}),
                5,
                &mut c
            ),
            Some(Err(RpcError { code: -32700, .. }))
        ));
    }

    #[test]
    fn notifications_collected() {
        let mut c = Collected::default();
        let msgs = [
            json!({"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":9,"progress":1,"total":4,"message":"a"}}),
            json!({"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":9,"progress":3}}),
            json!({"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":8,"progress":3}}),
            json!({"jsonrpc":"2.0","method":"notifications/message","params":{"level":"warning","logger":"db","data":{"k":1}}}),
            json!({"jsonrpc":"2.0","method":"notifications/message","params":{"data":"plain"}}),
            json!({"jsonrpc":"2.0","method":"notifications/tools/list_changed"}),
            json!({"jsonrpc":"2.0","method":"notifications/prompts/list_changed"}),
            json!({"jsonrpc":"2.0","method":"notifications/tools/list_changed"}),
            json!({"jsonrpc":"2.0","id":"srv-1","method":"elicitation/create","params":{}}),
            json!({"jsonrpc":"2.0","method":"notifications/unknown"}),
            json!({"jsonrpc":"2.0","id":77,"method":"ping"}),
        ];
        for m in &msgs {
            assert_eq!(absorb(m, 9, &mut c), None);
        }
        assert_eq!(
            c.progress,
            vec![
                Progress {
                    progress: Some(0.25),
                    message: Some("a".into())
                },
                Progress {
                    progress: Some(3.0),
                    message: None
                },
            ]
        );
        assert_eq!(
            c.logs,
            vec![
                json!({"level":"warning","logger":"db","data":{"k":1}}),
                json!({"level":"info","data":"plain"}),
            ]
        );
        assert_eq!(c.list_changed, vec!["tools", "prompts"]);
        assert_eq!(c.refuse, vec![json!("srv-1")]);
        assert_eq!(c.pong, vec![json!(77)]);
        let p: Value = serde_json::from_slice(&pong(&json!(77))).unwrap();
        assert_eq!(p, json!({"jsonrpc":"2.0","id":77,"result":{}}));
        let meta = c.meta();
        assert_eq!(meta[0].0, META_LOG);
        assert_eq!(
            meta[1],
            (META_LIST_CHANGED.into(), r#"["tools","prompts"]"#.into())
        );
    }

    #[test]
    fn logs_bounded() {
        let mut c = Collected::default();
        for i in 0..100 {
            c.note(
                "notifications/message",
                &json!({"level":"info","data":i}),
                1,
            );
        }
        assert_eq!(c.logs.len(), MAX_LOGS);
        assert_eq!(c.logs[63]["data"], 63);
    }

    #[test]
    fn batch_accepted() {
        let mut c = Collected::default();
        let b = json!([
            {"jsonrpc":"2.0","method":"notifications/resources/list_changed"},
            {"jsonrpc":"2.0","id":2,"result":{"ok":true}}
        ]);
        assert_eq!(absorb(&b, 2, &mut c), Some(Ok(json!({"ok":true}))));
        assert_eq!(c.list_changed, vec!["resources"]);
    }

    #[test]
    fn unavailable_wording() {
        assert_eq!(
            unavailable("tools/call", "http://127.0.0.1:9000", "connection refused"),
            "upstream unavailable: tools/call to http://127.0.0.1:9000: connection refused"
        );
    }
}

#[cfg(test)]
mod props {
    use super::*;
    use crate::arb;
    use proptest::prelude::*;

    /// The sink of forwarded notifications: what reaches the host must be
    /// what the host can send on (finite numbers, a log's data as JSON).
    fn check_live(live: Live) {
        match live {
            Live::Progress {
                progress, total, ..
            } => {
                assert!(progress.is_finite(), "{progress}");
                assert!(total.is_none_or(f64::is_finite), "{total:?}");
            }
            Live::Log { data, .. } => {
                serde_json::from_str::<Value>(&data).expect("a log's data is JSON text");
            }
        }
    }

    fn collected(forward: bool) -> Collected {
        Collected {
            forward: Forward(forward.then_some(check_live as fn(Live))),
            ..Collected::default()
        }
    }

    /// The messages of `msg`, batches opened.
    fn flat(msg: &Value, out: &mut Vec<Value>) {
        match msg {
            Value::Array(batch) => batch.iter().for_each(|m| flat(m, out)),
            m => out.push(m.clone()),
        }
    }

    /// What `absorb` keeps is bounded and well-formed, whatever came.
    fn check_collected(c: &Collected) -> Result<(), TestCaseError> {
        prop_assert!(c.logs.len() <= MAX_LOGS);
        let mut kinds = c.list_changed.clone();
        kinds.sort_unstable();
        kinds.dedup();
        prop_assert_eq!(kinds.len(), c.list_changed.len(), "each kind once");
        for (key, value) in c.meta() {
            prop_assert!(
                serde_json::from_str::<Value>(&value).is_ok(),
                "{}: {}",
                key,
                value
            );
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Any message, batch or value, for any request id, with the
        /// notifications forwarded or collected: no panic, bounded
        /// collections, and a response taken only from a message that
        /// answers this request (its id, or a null id with an error) and
        /// carries exactly what it said.
        #[test]
        fn absorb_takes_only_the_response_to_its_request(
            msg in arb::message_or_batch(),
            ours in 1u64..4,
            forward in any::<bool>(),
        ) {
            let mut c = collected(forward);
            let got = absorb(&msg, ours, &mut c);
            check_collected(&c)?;
            let mut msgs = Vec::new();
            flat(&msg, &mut msgs);
            let answers = |m: &Value| {
                m.get("method").and_then(Value::as_str).is_none()
                    && m.get("id").is_some_and(|id| {
                        is_our_id(id, ours) || (id.is_null() && m.get("error").is_some())
                    })
            };
            let matched = match &got {
                None => !msgs.iter().any(answers),
                Some(Ok(v)) => msgs.iter().any(|m| {
                    answers(m)
                        && m.get("error").is_none()
                        && m.get("result").unwrap_or(&Value::Null) == v
                }),
                Some(Err(e)) => msgs.iter().any(|m| {
                    answers(m)
                        && m.get("error").is_some_and(|err| {
                            err.get("code").and_then(Value::as_i64).unwrap_or(-32603) == e.code
                        })
                }),
            };
            prop_assert!(matched, "{:?} from {}", got, msg);
        }

    }

    proptest! {
        // Fewer cases: generating the messages is what costs (a debug
        // build), and these properties are narrower.
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// A batch is its messages taken in turn: the first response wins,
        /// and what they carry besides is collected alike.
        #[test]
        fn a_batch_is_its_messages_in_turn(
            batch in prop::collection::vec(arb::message(), 0..6),
            ours in 1u64..4,
        ) {
            let mut one = collected(false);
            let whole = absorb(&Value::Array(batch.clone()), ours, &mut one);
            let mut each = collected(false);
            let mut first = None;
            for m in &batch {
                if let Some(r) = absorb(m, ours, &mut each) {
                    first.get_or_insert(r);
                }
            }
            prop_assert_eq!(whole, first);
            prop_assert_eq!(one, each);
        }

        /// Bytes off the wire: a message's JSON text with bytes changed,
        /// cut short or not, and JSON that serde_json's
        /// `arbitrary_precision` reads specially. Parsed as the router
        /// does, then absorbed: no panic.
        #[test]
        fn arbitrary_bytes_never_panic(
            msg in arb::message_or_batch(),
            edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..4),
            cut in prop::option::of(any::<prop::sample::Index>()),
            special in prop::sample::select(vec![
                "",
                r#"{"$serde_json::private::Number":"1e400"}"#,
                r#"{"$serde_json::private::Number":"x"}"#,
                r#"{"$serde_json::private::Number":"1","id":1}"#,
                r#"{"id":1e400,"result":{}}"#,
                r#"{"id":-0,"result":{}}"#,
                r#"{"id":1.0,"result":{}}"#,
                r#"{"method":"notifications/progress","params":{"progress":1e308,"total":1e-308}}"#,
            ]),
            ours in 1u64..4,
            forward in any::<bool>(),
        ) {
            let mut bytes = if special.is_empty() {
                msg.to_string().into_bytes()
            } else {
                special.as_bytes().to_vec()
            };
            if !bytes.is_empty() {
                for (at, b) in edits {
                    let i = at.index(bytes.len());
                    bytes[i] = b;
                }
            }
            if let Some(cut) = cut {
                bytes.truncate(cut.index(bytes.len() + 1));
            }
            if let Ok(v) = serde_json::from_slice::<Value>(&bytes) {
                let mut c = collected(forward);
                absorb(&v, ours, &mut c);
                check_collected(&c)?;
            }
        }

        /// Our id is recognised as a number or as its text, and nothing
        /// else is.
        #[test]
        fn our_id_as_number_or_text(ours in any::<u64>(), other in arb::json()) {
            prop_assert!(is_our_id(&Value::from(ours), ours));
            prop_assert!(is_our_id(&Value::from(ours.to_string()), ours));
            let same = match &other {
                Value::Number(n) => n.as_u64() == Some(ours),
                Value::String(s) => *s == ours.to_string(),
                _ => false,
            };
            prop_assert_eq!(is_our_id(&other, ours), same);
        }
    }
}
