//! JSON-RPC messages of MCP ⇄ frames: the pure half of the HTTP edge.
//!
//! Bytes in, bytes out: a POST body is parsed once ([`parse`], borrowing
//! from the body), each request becomes a Request frame
//! ([`request_frame`]), and each Response frame the shards answer with
//! becomes one complete JSON-RPC message written straight into the edge's
//! buffer ([`write_response`], [`write_progress`], [`write_log`],
//! [`write_elicitation_create`]). No I/O, no async, no hyper: the transport
//! (sessions, SSE, headers) is `super`'s.
//!
//! It is the HTTP counterpart of `edge::grpc::request` (JSON → frame) and
//! `edge::grpc::convert` (frame → proto); it reuses the first's rules
//! (arguments as raw JSON text, one value each, never re-serialised).
//!
//! # Error codes
//!
//! What a client gets for a frame's `ErrorResponse` (code as
//! `mcp_schema::ErrorCode`), by method:
//!
//! | frame code            | method                                 | JSON-RPC error            | why |
//! |-----------------------|----------------------------------------|---------------------------|-----|
//! | NotFound -32601       | `tools/call`, the broker's unknown tool | -32602, `Unknown tool: <name>` | MCP: an unknown tool is invalid params (MCP's wording) |
//! | NotFound -32601       | `tools/call`, from the router          | a result, `isError: true` | the tool found no such thing: business logic, which the model should see |
//! | NotFound -32601       | `prompts/get`, `completion/complete`   | -32602, frame message     | MCP: an unknown prompt (or completion ref) is invalid params |
//! | NotFound -32601       | `resources/read`, `resources/(un)subscribe` | -32002, data `{"uri":…}` | MCP: resource not found |
//! | NotFound -32601       | any other                              | -32601                    | no router serves that kind of request: method not found |
//! | ExecutionError -32005 | `tools/call`                           | a result, `isError: true` | MCP: a tool's own failure is a result the model sees |
//! | InvalidParams -32602  | `tools/call`                           | a result, `isError: true` | MCP 2025-11-25: a tool's input validation error is a tool execution error (the unknown tool is NotFound, above) |
//! | ParseError -32700     | any                                    | -32603                    | the broker could not read the frame this edge built: an edge bug, not the client's JSON |
//! | every other code      | any                                    | same code and message     | InvalidRequest -32600, InvalidParams -32602 (bad cursor included), Internal -32603, and the broker's own: Overloaded -32000, DeadlineExceeded -32001, RouterFault -32002, Unauthorized -32003, ShuttingDown -32004, ExecutionError -32005 |
//!
//! The broker's own codes (-32000..-32005, and -32603) carry `data`
//! `{"kind":"<ErrorCode::as_str>","retryable":<bool>}` unless the frame has
//! its own `data`. RouterFault's -32002 is MCP's "resource not found" too;
//! `data.kind` (`"router_fault"`) or `data.uri` tells them apart. In
//! 2026-07-28, which forbids -32002, an unknown resource is -32602 and a
//! router fault -32603 (with the same `data`).
//! A tool's failure that the router reported as a result (`isError`) stays
//! a result, exactly as `adapt` built it.
//!
//! Errors this module makes itself: malformed JSON -32700 (id null); valid
//! JSON that is not a JSON-RPC 2.0 message -32600 (with the id when it
//! could be read); bad params of a known method -32602 with a message
//! naming what is wrong.
//!
//! # Losses
//! What the frames carry and MCP's JSON here does not:
//! - an embedded resource's `title` and `description` (MCP's resource
//!   contents have neither); tool annotations `streaming` and
//!   `experimental` (no MCP hint);
//! - a progress frame's `current_step`/`total_steps` (its value and total
//!   are sent, or its fraction with `total: 1`); a log frame's `timestamp` and `metadata`; an
//!   elicitation's `title` and `annotations`;
//! - for clients of older versions: audio (before 2025-03-26) and resource
//!   links (before 2025-06-18), rewritten as blocks they know.
//!
//! And what MCP's requests carry that the frames do not: the client's
//! capabilities other than elicitation (read into [`RequestInfo`]),
//! `completion/complete`'s `context`.
//!
//! # Invariants
//! - Every JSON text taken from a frame (schemas, structured content, meta
//!   values, elicitation schema, error data) is inserted raw only after it
//!   was checked to be exactly one JSON value (and an object where MCP
//!   wants one); otherwise a safe substitute is written (named at each
//!   place).
//! - Every string is written escaped ([`write_json_string`]).
//! - Tool and prompt arguments reach the frame as the raw JSON text the
//!   client sent (one `KeyValue` each), never re-serialised.
//! - Outside its tests the module uses only `mcp_schema`, `serde` and
//!   `serde_json` (no `crate::` or `super::` paths), so that a fuzz target
//!   can compile this very file by `#[path]`, as `grpc_convert` does with
//!   `edge::grpc::request`.
//! - No `serde_json::Value` tree is built on the request or the response
//!   path; results are written directly into `out`.

use std::borrow::Cow;
use std::io::Write as _;

use mcp_schema::ErrorCode;
use mcp_schema::args::{is_one_json_value, write_json_string};
use mcp_schema::client::{Listing, RequestEncoder, RequestHeader, ResponseView};
use mcp_schema::content_vec::ContentRef;
use mcp_schema::fb::KeyValue;
use mcp_schema::fb::protocol as p;
use mcp_schema::flatbuffers::{ForwardsUOffset, Vector};
use serde::Deserialize;
use serde::de::{Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;

use super::request_state::{Asked, MAX_INPUT_KEY_BYTES, MAX_INPUT_REQUESTS};

// ---------------------------------------------------------------------------
// Messages in
// ---------------------------------------------------------------------------

/// A JSON-RPC id (string or number), kept as its raw JSON text and echoed
/// verbatim (so `1.0`, `"\u0041"` and 40-digit numbers come back exactly
/// as sent).
#[derive(Clone, Copy, Debug)]
pub struct Id<'a>(pub &'a RawValue);

impl<'a> Id<'a> {
    /// The id's JSON text.
    pub fn get(&self) -> &'a str {
        self.0.get()
    }

    /// The id's value when it is a string (unescaped), e.g. to match a
    /// client's answer to our own `elicitation/create` id.
    pub fn as_string(&self) -> Option<Cow<'a, str>> {
        string_of(self.0)
    }
}

impl PartialEq for Id<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.0.get() == other.0.get()
    }
}

/// One JSON-RPC message from the client.
#[derive(Debug)]
pub enum Message<'a> {
    Request {
        id: Id<'a>,
        method: Cow<'a, str>,
        params: Option<&'a RawValue>,
    },
    Notification {
        method: Cow<'a, str>,
        params: Option<&'a RawValue>,
    },
    /// A client's answer to a server request (elicitation/create).
    Response {
        id: Id<'a>,
        result: Option<&'a RawValue>,
        error: Option<&'a RawValue>,
    },
}

/// A POST body: one message or a batch (2025-03-26 allows batches; each
/// member is answered or refused on its own).
#[derive(Debug)]
pub enum Body<'a> {
    One(Message<'a>),
    Batch(Vec<Result<Message<'a>, RpcError<'a>>>),
}

/// A JSON-RPC error to send back.
#[derive(Debug, Clone, PartialEq)]
pub struct RpcError<'a> {
    /// `None` when the id could not be read (sent as `null`).
    pub id: Option<Id<'a>>,
    pub code: i32,
    pub message: String,
    /// JSON text of `error.data`.
    pub data: Option<String>,
}

/// JSON-RPC's own codes, beside `mcp_schema::ErrorCode`'s.
pub mod code {
    pub const PARSE_ERROR: i32 = -32700;
    pub const INVALID_REQUEST: i32 = -32600;
    pub const METHOD_NOT_FOUND: i32 = -32601;
    pub const INVALID_PARAMS: i32 = -32602;
    pub const INTERNAL_ERROR: i32 = -32603;
    /// MCP: the resource asked for does not exist.
    pub const RESOURCE_NOT_FOUND: i32 = -32002;
}

impl<'a> RpcError<'a> {
    pub fn new(id: Option<Id<'a>>, code: i32, message: impl Into<String>) -> Self {
        Self {
            id,
            code,
            message: message.into(),
            data: None,
        }
    }

    fn invalid_request(id: Option<Id<'a>>, message: impl Into<String>) -> Self {
        Self::new(id, code::INVALID_REQUEST, message)
    }

    fn invalid_params(message: impl Into<String>) -> Self {
        Self::new(None, code::INVALID_PARAMS, message)
    }

    /// -32601 for a method this edge does not serve.
    pub fn method_not_found(id: Option<Id<'a>>, method: &str) -> Self {
        Self::new(
            id,
            code::METHOD_NOT_FOUND,
            format!("Method not found: {method}"),
        )
    }

    /// The same error answering the request `id`.
    pub fn with_id(mut self, id: Option<Id<'a>>) -> Self {
        self.id = id;
        self
    }

    /// Writes this error as a complete JSON-RPC message.
    pub fn write(&self, out: &mut Vec<u8>) {
        write_error(
            out,
            self.id.as_ref(),
            self.code,
            &self.message,
            self.data.as_deref(),
        );
    }
}

/// Deserialises a member that is present, `null` included, as `Some`
/// (plain `Option` would read `null` as absent, and `"id": null` is not
/// a notification).
fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&'de RawValue>::deserialize(d).map(Some)
}

/// The members of a JSON-RPC message, each left as raw JSON until checked.
#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(borrow, default, deserialize_with = "present")]
    jsonrpc: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    id: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    method: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    params: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    result: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    error: Option<&'a RawValue>,
}

pub fn first_byte(raw: &RawValue) -> u8 {
    // A RawValue holds no surrounding whitespace, and is never empty.
    raw.get().as_bytes().first().copied().unwrap_or(b' ')
}

fn is_string_or_number(raw: &RawValue) -> bool {
    matches!(first_byte(raw), b'"' | b'-' | b'0'..=b'9')
}

/// The text of a JSON string value: borrowed unless it has escapes.
pub fn string_of(raw: &RawValue) -> Option<Cow<'_, str>> {
    let t = raw.get();
    if !t.starts_with('"') {
        return None;
    }
    let inner = &t[1..t.len() - 1];
    if !inner.contains('\\') {
        // A valid JSON string with no escapes is its own text.
        return Some(Cow::Borrowed(inner));
    }
    serde_json::from_str::<String>(t).ok().map(Cow::Owned)
}

/// Parses a POST body once (serde_json borrowing from `body`). Malformed
/// JSON → -32700 (id null); valid JSON but not a JSON-RPC 2.0 message
/// (wrong or missing `"jsonrpc":"2.0"`, id not a string or number, method
/// not a string, params neither object nor array, empty batch, ...) →
/// -32600 with the id when it could be read. A batch member that is not a
/// message is its own error; the other members stand.
pub fn parse(body: &[u8]) -> Result<Body<'_>, RpcError<'_>> {
    let text = std::str::from_utf8(body).map_err(|e| {
        RpcError::new(
            None,
            code::PARSE_ERROR,
            format!("Parse error: the body is not UTF-8: {e}"),
        )
    })?;
    // serde_json's own message ("expected value at line 1 column 1") does
    // not say what is wrong; some Windows tools write the mark.
    if text.starts_with('\u{feff}') {
        return Err(RpcError::new(
            None,
            code::PARSE_ERROR,
            "Parse error: the body starts with a byte order mark (U+FEFF), which JSON text must not (RFC 8259 section 8.1)",
        ));
    }
    let batch = text.trim_ascii_start().starts_with('[');
    if batch {
        let members: Vec<&RawValue> = serde_json::from_str(text).map_err(json_error)?;
        if members.is_empty() {
            return Err(RpcError::invalid_request(
                None,
                "Invalid Request: an empty batch",
            ));
        }
        return Ok(Body::Batch(
            members.into_iter().map(|m| message(m.get())).collect(),
        ));
    }
    message(text).map(Body::One)
}

fn json_error(e: serde_json::Error) -> RpcError<'static> {
    use serde_json::error::Category;
    match e.classify() {
        Category::Syntax | Category::Eof | Category::Io => {
            RpcError::new(None, code::PARSE_ERROR, format!("Parse error: {e}"))
        }
        Category::Data => RpcError::invalid_request(None, format!("Invalid Request: {e}")),
    }
}

fn message(text: &str) -> Result<Message<'_>, RpcError<'_>> {
    let env: Envelope<'_> = serde_json::from_str(text).map_err(json_error)?;
    let id = match env.id {
        Some(raw) if is_string_or_number(raw) => Some(Id(raw)),
        Some(_) => {
            return Err(RpcError::invalid_request(
                None,
                "Invalid Request: id must be a string or a number",
            ));
        }
        None => None,
    };
    let version_ok = env.jsonrpc.and_then(string_of).is_some_and(|v| v == "2.0");
    if !version_ok {
        return Err(RpcError::invalid_request(
            id,
            "Invalid Request: \"jsonrpc\" must be \"2.0\"",
        ));
    }
    if let Some(m) = env.method {
        let Some(method) = string_of(m) else {
            return Err(RpcError::invalid_request(
                id,
                "Invalid Request: method must be a string",
            ));
        };
        let params = match env.params {
            // Some clients send `"params": null` for none.
            Some(p) if p.get() == "null" => None,
            Some(p) if matches!(first_byte(p), b'{' | b'[') => Some(p),
            Some(_) => {
                return Err(RpcError::invalid_request(
                    id,
                    "Invalid Request: params must be an object or an array",
                ));
            }
            None => None,
        };
        return Ok(match id {
            Some(id) => Message::Request { id, method, params },
            None => Message::Notification { method, params },
        });
    }
    // `"error": null` beside a result is no error.
    let error = env.error.filter(|e| e.get() != "null");
    match (id, env.result, error) {
        (Some(id), Some(result), None) => Ok(Message::Response {
            id,
            result: Some(result),
            error: None,
        }),
        (Some(id), None, Some(error)) => Ok(Message::Response {
            id,
            result: None,
            error: Some(error),
        }),
        (id, _, _) => Err(RpcError::invalid_request(
            id,
            "Invalid Request: neither a request (id and method), a notification (method) \
             nor a response (id and one of result or error)",
        )),
    }
}

// ---------------------------------------------------------------------------
// Requests → frames
// ---------------------------------------------------------------------------

/// The methods the edge routes to dispatch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Method {
    Initialize,
    Ping,
    ListTools,
    CallTool,
    ListResources,
    ListResourceTemplates,
    ReadResource,
    Subscribe,
    Unsubscribe,
    ListPrompts,
    GetPrompt,
    Complete,
    SetLevel,
}

impl Method {
    pub const ALL: [Method; 13] = [
        Method::Initialize,
        Method::Ping,
        Method::ListTools,
        Method::CallTool,
        Method::ListResources,
        Method::ListResourceTemplates,
        Method::ReadResource,
        Method::Subscribe,
        Method::Unsubscribe,
        Method::ListPrompts,
        Method::GetPrompt,
        Method::Complete,
        Method::SetLevel,
    ];

    pub fn from_name(m: &str) -> Option<Method> {
        Some(match m {
            "initialize" => Method::Initialize,
            "ping" => Method::Ping,
            "tools/list" => Method::ListTools,
            "tools/call" => Method::CallTool,
            "resources/list" => Method::ListResources,
            "resources/templates/list" => Method::ListResourceTemplates,
            "resources/read" => Method::ReadResource,
            "resources/subscribe" => Method::Subscribe,
            "resources/unsubscribe" => Method::Unsubscribe,
            "prompts/list" => Method::ListPrompts,
            "prompts/get" => Method::GetPrompt,
            "completion/complete" => Method::Complete,
            "logging/setLevel" => Method::SetLevel,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Method::Initialize => "initialize",
            Method::Ping => "ping",
            Method::ListTools => "tools/list",
            Method::CallTool => "tools/call",
            Method::ListResources => "resources/list",
            Method::ListResourceTemplates => "resources/templates/list",
            Method::ReadResource => "resources/read",
            Method::Subscribe => "resources/subscribe",
            Method::Unsubscribe => "resources/unsubscribe",
            Method::ListPrompts => "prompts/list",
            Method::GetPrompt => "prompts/get",
            Method::Complete => "completion/complete",
            Method::SetLevel => "logging/setLevel",
        }
    }
}

/// What the edge needs to know about a request besides its frame.
///
/// Names are unescaped (`Cow`): an auth rule on the tool `put` must see
/// `"p\u0075t"` as `put`, as the frame does.
#[derive(Clone, Debug)]
pub struct RequestInfo<'a> {
    pub method: Method,
    /// `params._meta.progressToken` (string or number), raw JSON text.
    pub progress_token: Option<&'a RawValue>,
    /// initialize: `params.protocolVersion`.
    pub protocol_version: Option<Cow<'a, str>>,
    /// initialize: `params.capabilities.elicitation` covers form mode
    /// (present, and not `{"url":{}}` alone).
    pub client_elicitation: bool,
    /// initialize: `params.capabilities.sampling` is present.
    pub client_sampling: bool,
    /// initialize: `params.capabilities.roots` is present.
    pub client_roots: bool,
    /// logging/setLevel: `params.level`, one of [`LOG_LEVELS`].
    pub log_level: Option<&'static str>,
    /// tools/call: `params.name`.
    pub tool_name: Option<Cow<'a, str>>,
    /// resources/read, subscribe, unsubscribe: `params.uri` (for the
    /// "resource not found" error's `data`).
    pub uri: Option<Cow<'a, str>>,
}

impl RequestInfo<'_> {
    /// What is known of a request of `method` before its params are read.
    pub fn new(method: Method) -> Self {
        Self {
            method,
            progress_token: None,
            protocol_version: None,
            client_elicitation: false,
            client_sampling: false,
            client_roots: false,
            log_level: None,
            tool_name: None,
            uri: None,
        }
    }
}

/// MCP's log levels (RFC 5424 severities), least severe first.
pub const LOG_LEVELS: [&str; 8] = [
    "debug",
    "info",
    "notice",
    "warning",
    "error",
    "critical",
    "alert",
    "emergency",
];

/// The wire's coarser level for an MCP level (as the gRPC edge maps).
pub fn log_level_to_wire(level: &str) -> Option<p::LogLevel> {
    Some(match level {
        "debug" => p::LogLevel::Debug,
        "info" => p::LogLevel::Info,
        "notice" | "warning" => p::LogLevel::Warning,
        "error" => p::LogLevel::Error,
        "critical" | "alert" | "emergency" => p::LogLevel::Critical,
        _ => return None,
    })
}

/// The frame's protocol version for an MCP version string: the frame enum
/// knows three; a version between them gets the nearest older one it knows
/// (the edge negotiates the HTTP version itself).
pub fn frame_version(v: &str) -> p::ProtocolVersion {
    match v {
        "2024-11-05" => p::ProtocolVersion::V2024_11_05,
        "2025-01-01" | "2025-03-26" => p::ProtocolVersion::V2025_01_01,
        "2025-06-18" | "2025-11-25" => p::ProtocolVersion::V2025_06_18,
        _ => p::ProtocolVersion::Unspecified,
    }
}

/// The params members any method may use, each raw until its method reads
/// it. Unknown members are ignored; `null` counts as absent.
#[derive(Deserialize, Default)]
struct Params<'a> {
    #[serde(borrow, default)]
    name: Option<&'a RawValue>,
    #[serde(borrow, default)]
    arguments: Option<&'a RawValue>,
    #[serde(borrow, default)]
    uri: Option<&'a RawValue>,
    #[serde(borrow, default)]
    cursor: Option<&'a RawValue>,
    #[serde(borrow, default)]
    level: Option<&'a RawValue>,
    #[serde(borrow, default, rename = "protocolVersion")]
    protocol_version: Option<&'a RawValue>,
    #[serde(borrow, default)]
    capabilities: Option<&'a RawValue>,
    #[serde(borrow, default, rename = "clientInfo")]
    client_info: Option<&'a RawValue>,
    #[serde(borrow, default, rename = "ref")]
    reference: Option<&'a RawValue>,
    #[serde(borrow, default)]
    argument: Option<&'a RawValue>,
    #[serde(borrow, default)]
    context: Option<&'a RawValue>,
    #[serde(borrow, default, rename = "_meta")]
    meta: Option<&'a RawValue>,
}

#[derive(Deserialize, Default)]
struct Meta<'a> {
    #[serde(borrow, default, rename = "progressToken")]
    progress_token: Option<&'a RawValue>,
}

/// A client's `capabilities` (initialize) or `clientCapabilities`
/// (2026-07-28 `_meta`), as far as the edge reads them.
#[derive(Deserialize, Default)]
pub(super) struct Capabilities<'a> {
    #[serde(borrow, default)]
    pub(super) elicitation: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub(super) sampling: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub(super) roots: Option<&'a RawValue>,
}

#[derive(Deserialize, Default)]
struct ElicitationModes<'a> {
    #[serde(borrow, default)]
    form: Option<&'a RawValue>,
    #[serde(borrow, default)]
    url: Option<&'a RawValue>,
}

/// Whether a client's `capabilities.elicitation` covers form mode, the one
/// routers use: 2025-06-18's `{}` does, and so does 2025-11-25's
/// `{"form":{}}`; `{"url":{}}` alone does not.
pub fn form_elicitation(elicitation: Option<&RawValue>) -> bool {
    let Some(e) = elicitation.filter(|e| first_byte(e) == b'{') else {
        return false;
    };
    serde_json::from_str::<ElicitationModes<'_>>(e.get())
        .is_ok_and(|m| m.form.is_some() || m.url.is_none())
}

#[derive(Deserialize, Default)]
struct ClientInfo<'a> {
    #[serde(borrow, default)]
    name: Option<&'a RawValue>,
    #[serde(borrow, default)]
    version: Option<&'a RawValue>,
}

#[derive(Deserialize, Default)]
struct CompletionRef<'a> {
    #[serde(borrow, default, rename = "type")]
    kind: Option<&'a RawValue>,
    #[serde(borrow, default)]
    name: Option<&'a RawValue>,
    #[serde(borrow, default)]
    uri: Option<&'a RawValue>,
}

/// `completion/complete`'s `context`: the arguments the client already
/// chose (`{"arguments": {name: value}}`), for completions that depend on
/// them.
#[derive(Deserialize, Default)]
struct CompletionContext<'a> {
    #[serde(borrow, default)]
    arguments: Option<&'a RawValue>,
}

#[derive(Deserialize, Default)]
struct CompletionArgument<'a> {
    #[serde(borrow, default)]
    name: Option<&'a RawValue>,
    #[serde(borrow, default)]
    value: Option<&'a RawValue>,
}

/// Reads an object member of params (`what` names it in errors).
fn object<'a, T: Deserialize<'a> + Default>(
    raw: Option<&'a RawValue>,
    what: &str,
) -> Result<T, RpcError<'a>> {
    match raw {
        None => Ok(T::default()),
        Some(r) if first_byte(r) == b'{' => serde_json::from_str(r.get())
            .map_err(|e| RpcError::invalid_params(format!("Invalid params: `{what}`: {e}"))),
        Some(_) => Err(RpcError::invalid_params(format!(
            "Invalid params: `{what}` must be an object"
        ))),
    }
}

fn opt_string<'a>(
    raw: Option<&'a RawValue>,
    what: &str,
) -> Result<Option<Cow<'a, str>>, RpcError<'a>> {
    match raw {
        None => Ok(None),
        Some(r) => string_of(r).map(Some).ok_or_else(|| {
            RpcError::invalid_params(format!("Invalid params: `{what}` must be a string"))
        }),
    }
}

fn required_string<'a>(
    raw: Option<&'a RawValue>,
    what: &str,
) -> Result<Cow<'a, str>, RpcError<'a>> {
    opt_string(raw, what)?
        .ok_or_else(|| RpcError::invalid_params(format!("Invalid params: `{what}` is required")))
}

/// A name or URI that routes: required, and not empty (the frame would
/// refuse it, in its own field names and as a malformed request; an empty
/// name is a bad parameter of a well-formed one).
fn required_name<'a>(raw: Option<&'a RawValue>, what: &str) -> Result<Cow<'a, str>, RpcError<'a>> {
    let v = required_string(raw, what)?;
    if v.is_empty() {
        return Err(RpcError::invalid_params(format!(
            "Invalid params: `{what}` must not be empty"
        )));
    }
    Ok(v)
}

/// A JSON object key, borrowed from the body unless it has escapes.
struct Key<'a>(Cow<'a, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: serde::de::Error>(self, v: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(v)))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(v)))
            }
        }
        d.deserialize_str(V)
    }
}

/// The members of an arguments object: (unescaped key, raw JSON value).
pub type Members<'a> = Vec<(Cow<'a, str>, &'a RawValue)>;

/// Splits `arguments` (absent or `null` = none) into its members in order,
/// values untouched (the object was already checked by the body's parse,
/// so an error here is only a wrong type).
fn members<'a>(raw: Option<&'a RawValue>) -> Result<Members<'a>, RpcError<'a>> {
    let Some(raw) = raw else {
        return Ok(Vec::new());
    };
    object_members(raw, "`arguments`").map_err(RpcError::invalid_params)
}

/// The members of the JSON object `raw` in order, values untouched; `Err`
/// names `what` when it is not one ("Invalid params: …").
pub fn object_members<'a>(raw: &'a RawValue, what: &str) -> Result<Members<'a>, String> {
    if first_byte(raw) != b'{' {
        return Err(format!("Invalid params: {what} must be an object"));
    }
    struct Split;
    impl<'de> Visitor<'de> for Split {
        type Value = Members<'de>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a JSON object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Self::Value, A::Error> {
            let mut out = Vec::with_capacity(m.size_hint().unwrap_or(4));
            while let Some((k, v)) = m.next_entry::<Key<'de>, &'de RawValue>()? {
                out.push((k.0, v));
            }
            Ok(out)
        }
    }
    let mut de = serde_json::Deserializer::from_str(raw.get());
    de.deserialize_map(Split)
        .map_err(|e| format!("Invalid params: {what}: {e}"))
}

/// The tool argument that carries a client's answer to an elicitation
/// into the re-called tool (docs/http.md); reserved in every tool call.
pub const ELICITATION_ARG: &str = "_elicitation";

/// The tool argument that carries a client's answer to a sampling request
/// (`sampling/createMessage`) into the re-called tool; reserved likewise.
pub const SAMPLING_ARG: &str = "_sampling";

/// The `meta` key by which a router attaches its own state to a question
/// (an elicitation, or a result asking for sampling or roots); the re-called tool
/// gets it back under [`STATE_ARG`] (`request_state.rs`, docs/http.md).
pub const STATE_META_KEY: &str = "mcp-broker/state";

/// The tool argument that hands a router's state back; reserved likewise.
pub const STATE_ARG: &str = "_request_state";

/// The tool argument that carries the answers to a set of questions
/// ([`INPUT_REQUESTS_META_KEY`]) as one object by `inputRequests` key, and
/// on a 2026-07-28 retry that names no question, the answers under keys
/// other than the defaults; reserved likewise.
pub const INPUTS_ARG: &str = "_inputs";

/// The tool arguments only the broker sets (each begins with `_`).
const RESERVED_ARGS: [&str; 5] = [
    ELICITATION_ARG,
    SAMPLING_ARG,
    ROOTS_ARG,
    STATE_ARG,
    INPUTS_ARG,
];

/// Whether a final answer asks the client something ([`sampling_request`],
/// [`roots_request`]): asked of every answer of a session's call, so one
/// byte search for the broker's key prefix answers most of them.
pub fn result_asks(frame: &[u8]) -> bool {
    static PREFIX: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
        std::sync::LazyLock::new(|| memchr::memmem::Finder::new("mcp-broker/"));
    PREFIX.find(frame).is_some()
        && (sampling_request(frame).is_some()
            || roots_request(frame).is_some()
            || input_requests(frame).is_some())
}

/// The `meta` key by which a router names its question's `inputRequests`
/// key in protocol 2026-07-28 (a string; default `elicitation`, `sampling`
/// or `roots`); the retry's answer is read under it.
pub const INPUT_KEY_META_KEY: &str = "mcp-broker/input-key";

/// `meta` entries that instruct the broker: carried or acted on, never
/// shown to the client.
fn is_broker_meta(key: &str) -> bool {
    key == STATE_META_KEY || key == INPUT_KEY_META_KEY
}

/// The tool argument that carries the client's roots (`roots/list`'s
/// result) into the re-called tool; reserved likewise.
pub const ROOTS_ARG: &str = "_roots";

/// The tool-result `meta` key by which a router asks for the client's
/// roots: its value is the `roots/list` params (a JSON object, normally
/// `{}`); the broker asks and calls the tool again with the client's
/// `ListRootsResult` under [`ROOTS_ARG`] (docs/http.md).
pub const ROOTS_META_KEY: &str = "mcp-broker/roots";

/// The tool-result `meta` key by which a router asks the client for an LLM
/// completion: its value is the `sampling/createMessage` params (a JSON
/// object); the broker sends the request and calls the tool again with the
/// client's result under [`SAMPLING_ARG`] (docs/http.md).
pub const SAMPLING_META_KEY: &str = "mcp-broker/sample";

/// The `sampling/createMessage` params a final ToolResult frame asks for
/// under [`SAMPLING_META_KEY`], when it is one JSON object.
pub fn sampling_request(frame: &[u8]) -> Option<&str> {
    static KEY: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
        std::sync::LazyLock::new(|| memchr::memmem::Finder::new(SAMPLING_META_KEY));
    json_object(result_meta(frame, &KEY, SAMPLING_META_KEY)?)
}

/// The value of the `meta` entry `key` of a final ToolResult frame;
/// `finder` searches for `key`'s bytes.
fn result_meta<'f>(
    frame: &'f [u8],
    finder: &memchr::memmem::Finder<'_>,
    key: &str,
) -> Option<&'f str> {
    // Most results do not ask: a byte search spares them a verification.
    finder.find(frame)?;
    let tr = ResponseView::parse(frame)
        .ok()?
        .response
        .payload_as_tool_result()?;
    tr.metadata()?.iter().find(|kv| kv.key() == key)?.value()
}

/// The state a router attached to its question (`meta` entry
/// [`STATE_META_KEY`] of an elicitation, or of a result asking for
/// sampling or roots), as the JSON text handed back in [`STATE_ARG`]: the value when
/// it is one JSON value, else the entry's text as a JSON string.
pub fn router_state(frame: &[u8]) -> Option<Cow<'_, str>> {
    let v = question_meta(frame, STATE_META_KEY)?;
    Some(match json_value(v) {
        Some(j) => Cow::Borrowed(j),
        None => {
            let mut b = Vec::with_capacity(v.len() + 2);
            write_json_string(v, &mut b);
            Cow::Owned(String::from_utf8(b).unwrap_or_default())
        }
    })
}

/// The `inputRequests` key a router named for its question
/// ([`INPUT_KEY_META_KEY`]): the entry's JSON string, or its text when it
/// is not JSON.
pub fn router_input_key(frame: &[u8]) -> Option<Cow<'_, str>> {
    let v = question_meta(frame, INPUT_KEY_META_KEY)?;
    match json_value(v) {
        Some(j) => serde_json::from_str::<String>(j).ok().map(Cow::Owned),
        None => Some(Cow::Borrowed(v)),
    }
}

/// The value of the `meta` entry `key` of a question: an elicitation's, or
/// a tool result's (one asking for sampling or roots).
fn question_meta<'f>(frame: &'f [u8], key: &str) -> Option<&'f str> {
    // Most questions carry none: a byte search spares them a verification.
    memchr::memmem::find(frame, key.as_bytes())?;
    let resp = ResponseView::parse(frame).ok()?.response;
    let kvs = match resp.payload_as_elicitation_request() {
        Some(e) => e.meta(),
        None => resp.payload_as_tool_result()?.metadata(),
    }?;
    kvs.iter().find(|kv| kv.key() == key)?.value()
}

/// The `roots/list` params a final ToolResult frame asks for under
/// [`ROOTS_META_KEY`], when it is one JSON object (and does not ask for
/// sampling, which comes first: a result asks one question).
pub fn roots_request(frame: &[u8]) -> Option<&str> {
    // Every final answer of a session's call is asked this: a byte search
    // with a searcher built once answers most of them.
    static KEY: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
        std::sync::LazyLock::new(|| memchr::memmem::Finder::new(ROOTS_META_KEY));
    KEY.find(frame)?;
    let params = json_object(question_meta(frame, ROOTS_META_KEY)?)?;
    sampling_request(frame).is_none().then_some(params)
}

/// The tool-result `meta` key by which a router asks several questions at
/// once: a JSON object of 1 to [`MAX_INPUT_REQUESTS`] entries, each
/// `"<key>": {"method": <elicitation/create | sampling/createMessage |
/// roots/list>, "params": {…}}`, the key 1 to [`MAX_INPUT_KEY_BYTES`]
/// bytes. The answers come back together under [`INPUTS_ARG`], by key
/// (docs/http.md). A result asks one thing: a set before sampling, sampling
/// before roots.
pub const INPUT_REQUESTS_META_KEY: &str = "mcp-broker/input-requests";

/// One question of a set ([`INPUT_REQUESTS_META_KEY`]).
#[derive(Debug, PartialEq, Eq)]
pub struct InputRequest<'f> {
    pub key: Cow<'f, str>,
    pub asked: Asked,
    /// Its params: one JSON object (`{}` for a `roots/list` without any).
    pub params: &'f str,
}

impl InputRequest<'_> {
    /// The MCP method that asks it.
    pub fn method(&self) -> &'static str {
        match self.asked {
            Asked::Elicitation => "elicitation/create",
            Asked::Sampling => "sampling/createMessage",
            Asked::Roots => "roots/list",
        }
    }
}

/// The set of questions a final ToolResult frame asks under
/// [`INPUT_REQUESTS_META_KEY`]: `None` when it asks none, `Err` naming
/// what is wrong with a set that cannot be asked (the router's fault).
pub fn input_requests(frame: &[u8]) -> Option<Result<Vec<InputRequest<'_>>, String>> {
    static KEY: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
        std::sync::LazyLock::new(|| memchr::memmem::Finder::new(INPUT_REQUESTS_META_KEY));
    Some(parse_input_requests(result_meta(
        frame,
        &KEY,
        INPUT_REQUESTS_META_KEY,
    )?))
}

/// A set of questions from its meta value's text ([`input_requests`]).
pub fn parse_input_requests(text: &str) -> Result<Vec<InputRequest<'_>>, String> {
    #[derive(Deserialize)]
    struct Entry<'a> {
        #[serde(borrow)]
        method: Cow<'a, str>,
        #[serde(borrow, default)]
        params: Option<&'a RawValue>,
    }
    let raw: &RawValue = serde_json::from_str(text.trim_ascii())
        .map_err(|e| format!("{INPUT_REQUESTS_META_KEY} is not JSON: {e}"))?;
    let members = object_members(raw, INPUT_REQUESTS_META_KEY)
        .map_err(|e| e.trim_start_matches("Invalid params: ").to_owned())?;
    if members.is_empty() || members.len() > MAX_INPUT_REQUESTS {
        return Err(format!(
            "{INPUT_REQUESTS_META_KEY} holds {} questions; a set is 1 to {MAX_INPUT_REQUESTS}",
            members.len()
        ));
    }
    let mut out = Vec::with_capacity(members.len());
    for (key, v) in members {
        if key.is_empty() || key.len() > MAX_INPUT_KEY_BYTES {
            return Err(format!(
                "{INPUT_REQUESTS_META_KEY}: a key must be 1 to {MAX_INPUT_KEY_BYTES} bytes long, not {}",
                key.len()
            ));
        }
        let e: Entry<'_> = serde_json::from_str(v.get())
            .map_err(|e| format!("{INPUT_REQUESTS_META_KEY}.{key}: {e}"))?;
        let asked = match &*e.method {
            "elicitation/create" => Asked::Elicitation,
            "sampling/createMessage" => Asked::Sampling,
            "roots/list" => Asked::Roots,
            m => {
                return Err(format!(
                    "{INPUT_REQUESTS_META_KEY}.{key}: method `{m}` is none of elicitation/create, sampling/createMessage and roots/list"
                ));
            }
        };
        let params = match e.params {
            Some(p) if first_byte(p) == b'{' => p.get().trim_ascii(),
            None if asked == Asked::Roots => "{}",
            _ => {
                return Err(format!(
                    "{INPUT_REQUESTS_META_KEY}.{key}: `params` must be an object"
                ));
            }
        };
        if out.iter().any(|q: &InputRequest<'_>| q.key == key) {
            return Err(format!(
                "{INPUT_REQUESTS_META_KEY}: the key {key} appears twice"
            ));
        }
        out.push(InputRequest { key, asked, params });
    }
    Ok(out)
}

/// A request of the broker's to the client: `method` (`roots/list`,
/// `sampling/createMessage`) with our own `id` and the router's `params`
/// (checked to be one JSON object by [`roots_request`] or
/// [`sampling_request`]).
pub fn write_client_request(out: &mut Vec<u8>, id: &str, method: &str, params: &str) {
    out.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"id\":");
    write_json_string(id, out);
    out.extend_from_slice(b",\"method\":");
    write_json_string(method, out);
    out.extend_from_slice(b",\"params\":");
    out.extend_from_slice(params.trim().as_bytes());
    out.push(b'}');
}

/// Builds the Request frame for `method` with `params` into `enc` (header
/// `h` carries message id, correlation id, session id, timeout; a tool
/// call's id is the message id). Bad params → -32602 naming what is wrong
/// (the error's `id` is `None`: set it with [`RpcError::with_id`]).
///
/// Tool and prompt arguments become the frame's `KeyValue`s as the raw JSON
/// text the client sent. A prompt argument's JSON string arrives quoted,
/// as from the gRPC edge: `adapt::PromptArgs` unquotes it when filling.
/// `extra` is appended to a tool call's arguments (the answer under
/// [`ELICITATION_ARG`], [`SAMPLING_ARG`] or [`ROOTS_ARG`], a set's answers
/// under [`INPUTS_ARG`], the router's state under [`STATE_ARG`]); a client
/// argument of any of these names is always refused.
/// `completion/complete`'s `context` is not carried (the frame encoder
/// has no slot for it yet).
pub fn request_frame<'e, 'a>(
    enc: &'e mut RequestEncoder,
    h: &RequestHeader<'_>,
    method: Method,
    params: Option<&'a RawValue>,
    extra: &[(&str, &str)],
) -> Result<(&'e [u8], RequestInfo<'a>), RpcError<'a>> {
    let ps: Params<'a> = match params {
        None => Params::default(),
        Some(raw) if first_byte(raw) == b'{' => serde_json::from_str(raw.get())
            .map_err(|e| RpcError::invalid_params(format!("Invalid params: {e}")))?,
        Some(_) => {
            return Err(RpcError::invalid_params(
                "Invalid params: params must be an object",
            ));
        }
    };
    let meta: Meta<'a> = object(ps.meta, "_meta")?;
    if let Some(t) = meta.progress_token
        && !is_string_or_number(t)
    {
        return Err(RpcError::invalid_params(
            "Invalid params: `_meta.progressToken` must be a string or a number",
        ));
    }
    let mut info = RequestInfo::new(method);
    info.progress_token = meta.progress_token;
    let frame = match method {
        Method::Initialize => {
            let version = required_string(ps.protocol_version, "protocolVersion")?;
            let caps: Capabilities<'a> = object(ps.capabilities, "capabilities")?;
            let client: ClientInfo<'a> = object(ps.client_info, "clientInfo")?;
            let name = opt_string(client.name, "clientInfo.name")?;
            let ver = opt_string(client.version, "clientInfo.version")?;
            info.client_elicitation = form_elicitation(caps.elicitation);
            info.client_sampling = caps.sampling.is_some_and(|v| first_byte(v) == b'{');
            info.client_roots = caps.roots.is_some_and(|v| first_byte(v) == b'{');
            let frame = enc.initialize(
                h,
                frame_version(&version),
                name.as_deref().unwrap_or(""),
                ver.as_deref().unwrap_or(""),
            );
            info.protocol_version = Some(version);
            frame
        }
        Method::Ping => enc.ping(h),
        Method::ListTools => list(enc, h, Listing::Tools, ps.cursor)?,
        Method::ListResources => list(enc, h, Listing::Resources, ps.cursor)?,
        Method::ListResourceTemplates => list(enc, h, Listing::ResourceTemplates, ps.cursor)?,
        Method::ListPrompts => list(enc, h, Listing::Prompts, ps.cursor)?,
        Method::CallTool => {
            let name = required_name(ps.name, "name")?;
            let args = members(ps.arguments)?;
            let mut kvs: Vec<(&str, &str)> = Vec::with_capacity(args.len() + extra.len());
            kvs.extend(args.iter().map(|(k, v)| (&**k, v.get())));
            // Reserved whether or not this call carries an answer: a client
            // must not be able to forge the answer to an elicitation, nor a
            // router's state. One pass; most names fail the first byte.
            debug_assert!(extra.iter().all(|(k, _)| RESERVED_ARGS.contains(k)));
            if let Some((key, _)) = kvs
                .iter()
                .find(|(k, _)| k.starts_with('_') && RESERVED_ARGS.contains(k))
            {
                return Err(RpcError::invalid_params(format!(
                    "Invalid params: the argument name `{key}` is reserved"
                )));
            }
            kvs.extend_from_slice(extra);
            let frame = enc.tool_call(h, h.message_id, &name, &kvs);
            info.tool_name = Some(name);
            frame
        }
        Method::ReadResource | Method::Subscribe | Method::Unsubscribe => {
            let uri = required_name(ps.uri, "uri")?;
            let frame = match method {
                Method::ReadResource => enc.read_resource(h, &uri),
                m => enc.subscribe(h, &uri, m == Method::Subscribe),
            };
            info.uri = Some(uri);
            frame
        }
        Method::GetPrompt => {
            let name = required_name(ps.name, "name")?;
            let args = members(ps.arguments)?;
            // MCP's prompt arguments are strings (`{[key: string]: string}`),
            // which servers should check: a number is refused, not filled
            // in as text, as the SDKs' own servers refuse it.
            if let Some((k, _)) = args.iter().find(|(_, v)| first_byte(v) != b'"') {
                return Err(RpcError::invalid_params(format!(
                    "Invalid params: prompt argument `{k}` must be a string"
                )));
            }
            let kvs: Vec<(&str, &str)> = args.iter().map(|(k, v)| (&**k, v.get())).collect();
            enc.get_prompt(h, &name, &kvs)
        }
        Method::Complete => {
            let r: CompletionRef<'a> = object(ps.reference, "ref")?;
            let a: CompletionArgument<'a> = object(ps.argument, "argument")?;
            let kind = required_string(r.kind, "ref.type")?;
            let (kind, target) = match &*kind {
                "ref/prompt" => (
                    p::CompletionRefKind::Prompt,
                    required_name(r.name, "ref.name")?,
                ),
                "ref/resource" => (
                    p::CompletionRefKind::Resource,
                    required_name(r.uri, "ref.uri")?,
                ),
                other => {
                    return Err(RpcError::invalid_params(format!(
                        "Invalid params: unknown `ref.type` `{other}` (ref/prompt or ref/resource)"
                    )));
                }
            };
            let arg_name = required_string(a.name, "argument.name")?;
            let arg_value = opt_string(a.value, "argument.value")?;
            let context: CompletionContext<'a> = object(ps.context, "context")?;
            let chosen = match context.arguments {
                Some(raw) => {
                    object_members(raw, "`context.arguments`").map_err(RpcError::invalid_params)?
                }
                None => Vec::new(),
            };
            let chosen: Vec<(&str, &str)> = chosen.iter().map(|(k, v)| (&**k, v.get())).collect();
            enc.complete(
                h,
                kind,
                &target,
                &arg_name,
                arg_value.as_deref().unwrap_or(""),
                &chosen,
            )
        }
        Method::SetLevel => {
            let level = required_string(ps.level, "level")?;
            let Some(i) = LOG_LEVELS.iter().position(|l| *l == level) else {
                return Err(RpcError::invalid_params(format!(
                    "Invalid params: unknown log level `{level}` (one of {})",
                    LOG_LEVELS.join(", ")
                )));
            };
            let name = LOG_LEVELS[i];
            info.log_level = Some(name);
            enc.set_log_level(h, log_level_to_wire(name).unwrap_or(p::LogLevel::Info))
        }
    };
    Ok((frame, info))
}

fn list<'e, 'a>(
    enc: &'e mut RequestEncoder,
    h: &RequestHeader<'_>,
    what: Listing,
    cursor: Option<&'a RawValue>,
) -> Result<&'e [u8], RpcError<'a>> {
    let cursor = opt_string(cursor, "cursor")?;
    Ok(enc.list(h, what, cursor.as_deref()))
}

// ---------------------------------------------------------------------------
// JSON writing
// ---------------------------------------------------------------------------

/// An object being written: commas between members, keys written as given
/// (every key passed to [`Obj::key`] is a plain ASCII literal).
struct Obj<'o> {
    out: &'o mut Vec<u8>,
    first: bool,
}

impl<'o> Obj<'o> {
    fn new(out: &'o mut Vec<u8>) -> Self {
        out.push(b'{');
        Obj { out, first: true }
    }

    fn comma(&mut self) {
        if !self.first {
            self.out.push(b',');
        }
        self.first = false;
    }

    fn key(&mut self, k: &str) -> &mut Vec<u8> {
        self.comma();
        self.out.push(b'"');
        self.out.extend_from_slice(k.as_bytes());
        self.out.extend_from_slice(b"\":");
        self.out
    }

    /// A key that may need escaping (from a frame).
    fn key_escaped(&mut self, k: &str) -> &mut Vec<u8> {
        self.comma();
        write_json_string(k, self.out);
        self.out.push(b':');
        self.out
    }

    fn str(&mut self, k: &str, v: &str) {
        let out = self.key(k);
        write_json_string(v, out);
    }

    fn opt_str(&mut self, k: &str, v: Option<&str>) {
        if let Some(v) = v {
            self.str(k, v);
        }
    }

    /// A member whose value is JSON text already checked.
    fn raw(&mut self, k: &str, v: &str) {
        self.key(k).extend_from_slice(v.as_bytes());
    }

    fn bool(&mut self, k: &str, v: bool) {
        self.raw(k, if v { "true" } else { "false" });
    }

    fn num(&mut self, k: &str, v: impl std::fmt::Display) {
        let out = self.key(k);
        // Writing to a Vec cannot fail.
        let _ = write!(out, "{v}");
    }

    fn end(self) {
        self.out.push(b'}');
    }
}

/// Commas between array elements.
struct Arr<'o> {
    out: &'o mut Vec<u8>,
    first: bool,
}

impl<'o> Arr<'o> {
    fn new(out: &'o mut Vec<u8>) -> Self {
        out.push(b'[');
        Arr { out, first: true }
    }

    fn item(&mut self) -> &mut Vec<u8> {
        if !self.first {
            self.out.push(b',');
        }
        self.first = false;
        self.out
    }

    fn end(self) {
        self.out.push(b']');
    }
}

/// `text` trimmed, if it is exactly one JSON value.
fn json_value(text: &str) -> Option<&str> {
    let t = text.trim_ascii();
    is_one_json_value(t.as_bytes()).then_some(t)
}

/// `text` trimmed, if it is exactly one JSON object.
fn json_object(text: &str) -> Option<&str> {
    json_value(text).filter(|t| t.starts_with('{'))
}

/// The schema text for MCP's `inputSchema`, `outputSchema` or
/// `requestedSchema`, which must be object schemas (`"type":"object"`; the
/// TypeScript SDK refuses a whole tool listing otherwise; a requested
/// schema needs `properties` too): the text when it says so, with the
/// missing members put first (`"type":"object"`, `"properties":{}`);
/// `None` when it is not one JSON object, names another type or has
/// `properties` that are not an object (the callers say what they
/// substitute).
fn object_schema(text: &str, need_properties: bool) -> Option<Cow<'_, str>> {
    #[derive(Deserialize)]
    struct Typed<'a> {
        #[serde(borrow, default, rename = "type", deserialize_with = "present")]
        ty: Option<&'a RawValue>,
        #[serde(borrow, default, deserialize_with = "present")]
        properties: Option<&'a RawValue>,
    }
    let t = json_object(text)?;
    let typed: Typed<'_> = serde_json::from_str(t).ok()?;
    if let Some(ty) = typed.ty
        && string_of(ty)? != "object"
    {
        return None;
    }
    if let Some(ps) = typed.properties
        && need_properties
        && first_byte(ps) != b'{'
    {
        return None;
    }
    let add_type = typed.ty.is_none();
    let add_properties = need_properties && typed.properties.is_none();
    if !add_type && !add_properties {
        return Some(Cow::Borrowed(t));
    }
    let rest = t[1..].trim_ascii_start();
    let mut s = String::with_capacity(t.len() + 32);
    s.push('{');
    let mut added = Vec::with_capacity(2);
    if add_type {
        added.push("\"type\":\"object\"");
    }
    if add_properties {
        added.push("\"properties\":{}");
    }
    s.push_str(&added.join(","));
    if !rest.starts_with('}') {
        s.push(',');
    }
    s.push_str(rest);
    Some(Cow::Owned(s))
}

/// What the negotiated protocol version's content blocks can be: audio
/// came with 2025-03-26, resource links with 2025-06-18. A client of an
/// older version refuses the whole result over an unknown block type, so
/// those are rewritten (see [`write_content`]). An unknown version string
/// is taken as the newest.
#[derive(Clone, Copy, Debug)]
struct Compat {
    audio: bool,
    resource_link: bool,
    /// 2026-07-28: every result names the server in its `_meta`.
    server_info: bool,
}

impl Compat {
    fn of(version: &str) -> Self {
        Compat {
            audio: version != "2024-11-05",
            resource_link: !matches!(version, "2024-11-05" | "2025-03-26"),
            server_info: version == MODERN_VERSION,
        }
    }
}

/// A float as a JSON number; JSON has no NaN or infinity, so those are 0.
fn finite(x: f32) -> f32 {
    if x.is_finite() { x } else { 0.0 }
}

fn envelope_start<'o>(out: &'o mut Vec<u8>, id: Option<&Id<'_>>) -> Obj<'o> {
    let mut o = Obj::new(out);
    o.raw("jsonrpc", "\"2.0\"");
    o.raw("id", id.map_or("null", |i| i.get()));
    o
}

/// `{"jsonrpc":"2.0","id":…,"result":{}}`: the answer to a `ping` the edge
/// answers itself.
pub fn write_empty_result(out: &mut Vec<u8>, id: &Id<'_>) {
    let mut o = envelope_start(out, Some(id));
    o.raw("result", "{}");
    o.end();
}

#[derive(Deserialize)]
struct Cancelled<'a> {
    #[serde(borrow, default, rename = "requestId")]
    request_id: Option<&'a RawValue>,
}

/// The `requestId` of a `notifications/cancelled`'s params, as its raw
/// JSON text (compare with a request's [`Id::get`]); `None` when absent or
/// not a string or number.
pub fn cancelled_request_id(params: Option<&RawValue>) -> Option<Id<'_>> {
    let params = params.filter(|p| first_byte(p) == b'{')?;
    let c: Cancelled<'_> = serde_json::from_str(params.get()).ok()?;
    c.request_id.filter(|r| is_string_or_number(r)).map(Id)
}

/// The `data` of an error the broker itself answers with `code` (one of
/// its `ErrorCode`s): `{"kind":…,"retryable":…}` for an internal error and
/// the server-error range (-32000..=-32099), written into `buf`; `None`
/// for the JSON-RPC codes, which say enough.
pub fn broker_error_data(code: i32, buf: &mut Vec<u8>) -> Option<&str> {
    match ErrorCode::from_code(code) {
        Some(c) if c == ErrorCode::Internal || (-32099..=-32000).contains(&c.code()) => {
            buf.clear();
            let mut d = Obj::new(buf);
            d.str("kind", c.as_str());
            d.bool("retryable", c.is_retryable());
            d.end();
            Some(std::str::from_utf8(buf).unwrap_or("null"))
        }
        _ => None,
    }
}

/// A JSON-RPC error message: `{"jsonrpc":"2.0","id":…,"error":{…}}`.
/// `data` is inserted raw if it is one JSON value, else as a string.
pub fn write_error(
    out: &mut Vec<u8>,
    id: Option<&Id<'_>>,
    code: i32,
    message: &str,
    data: Option<&str>,
) {
    let mut o = envelope_start(out, id);
    let mut e = Obj::new(o.key("error"));
    e.num("code", code);
    e.str("message", message);
    if let Some(d) = data {
        match json_value(d) {
            Some(v) => e.raw("data", v),
            None => e.str("data", d),
        }
    }
    e.end();
    o.end();
}

/// The `_meta` key under which 2026-07-28 results name the server.
const SERVER_INFO_KEY: &str = "io.modelcontextprotocol/serverInfo";

/// `"io.modelcontextprotocol/serverInfo":{…}`, the broker's name and version
/// as `initialize` and `server/discover` report them (`dispatch`'s
/// InitializeResponse). 2026-07-28 asks a server to put it in every result's
/// `_meta` ("Per-response protocol fields", a SHOULD), since no connection
/// state tells a client which server answered.
pub const SERVER_INFO_MEMBER: &str = concat!(
    "\"io.modelcontextprotocol/serverInfo\":{\"name\":\"mcp-broker\",\"version\":\"",
    env!("CARGO_PKG_VERSION"),
    "\"}"
);

/// `"_meta":{<serverInfo>}` on a 2026-07-28 result that has no `_meta` of
/// its own.
fn write_server_info_meta(o: &mut Obj<'_>) {
    let m = o.key("_meta");
    m.push(b'{');
    m.extend_from_slice(SERVER_INFO_MEMBER.as_bytes());
    m.push(b'}');
}

/// [`write_server_info_meta`] for the object that ends `out`, written by a
/// writer that knows nothing of the revision (no `_meta` of its own).
fn close_with_server_info(out: &mut Vec<u8>) {
    debug_assert_eq!(out.last(), Some(&b'}'));
    out.pop();
    if out.last() != Some(&b'{') {
        out.push(b',');
    }
    out.extend_from_slice(b"\"_meta\":{");
    out.extend_from_slice(SERVER_INFO_MEMBER.as_bytes());
    out.extend_from_slice(b"}}");
}

/// `[KeyValue]` (values JSON text) as a `_meta` object; a value that is not
/// one JSON value goes out as a JSON string rather than breaking the JSON.
/// Entries addressed to the broker ([`is_broker_meta`]: a router's state,
/// its input key) are never shown to the client. With `server_info` (a
/// 2026-07-28 result), `_meta` is always written and names the broker first;
/// a router's own entry under that key gives way, as two would be a
/// duplicate key.
fn write_meta<'f>(
    o: &mut Obj<'_>,
    kvs: Option<Vector<'f, ForwardsUOffset<KeyValue<'f>>>>,
    server_info: bool,
) {
    let hidden = |k: &str| is_broker_meta(k) || (server_info && k == SERVER_INFO_KEY);
    let shown = |kv: &KeyValue<'_>| !hidden(kv.key());
    let kvs = kvs.filter(|k| k.iter().any(|kv| shown(&kv)));
    if kvs.is_none() && !server_info {
        return;
    }
    let mut m = Obj::new(o.key("_meta"));
    if server_info {
        m.comma();
        m.out.extend_from_slice(SERVER_INFO_MEMBER.as_bytes());
    }
    for kv in kvs.iter().flat_map(|k| k.iter()).filter(|kv| shown(kv)) {
        let v = kv.value().unwrap_or("null");
        match json_value(v) {
            Some(v) => {
                m.key_escaped(kv.key()).extend_from_slice(v.as_bytes());
            }
            None => write_json_string(v, m.key_escaped(kv.key())),
        }
    }
    m.end();
}

fn write_annotations(o: &mut Obj<'_>, a: Option<p::Annotations<'_>>) {
    let Some(a) = a else {
        return;
    };
    let mut ao = Obj::new(o.key("annotations"));
    if let Some(aud) = a.audience() {
        let mut arr = Arr::new(ao.key("audience"));
        for r in aud.iter() {
            let s = match r {
                p::Role::User => "\"user\"",
                p::Role::Assistant => "\"assistant\"",
                _ => continue,
            };
            arr.item().extend_from_slice(s.as_bytes());
        }
        arr.end();
    }
    if let Some(pr) = a.priority() {
        ao.num("priority", finite(pr));
    }
    ao.opt_str("lastModified", a.timestamp());
    ao.end();
}

/// MCP `TextResourceContents` / `BlobResourceContents`. A content with
/// neither text nor blob gets an empty text (MCP needs one of them).
fn write_resource_contents(
    out: &mut Vec<u8>,
    uri: &str,
    mime: Option<&str>,
    text: Option<&str>,
    blob: Option<&str>,
) {
    let mut o = Obj::new(out);
    o.str("uri", uri);
    o.opt_str("mimeType", mime);
    match (text, blob) {
        (_, Some(b)) if text.is_none() => o.str("blob", b),
        (t, _) => o.str("text", t.unwrap_or("")),
    }
    o.end();
}

/// One content block as an MCP `ContentBlock`; `false` (nothing written)
/// for a member of a newer schema. For a client of a version without them,
/// audio becomes an embedded blob resource (`uri` `"audio:"`, its MIME type
/// and data kept) and a resource link a text block naming the link.
fn write_content(out: &mut Vec<u8>, c: ContentRef<'_>, compat: Compat) -> bool {
    if matches!(c, ContentRef::Unknown(_)) {
        return false;
    }
    let mut o = Obj::new(out);
    match c {
        ContentRef::Text(t) => {
            o.raw("type", "\"text\"");
            o.str("text", t.text());
            write_annotations(&mut o, t.annotations());
        }
        ContentRef::Image(i) => {
            o.raw("type", "\"image\"");
            o.str("data", i.data());
            o.str("mimeType", i.mime_type());
            write_annotations(&mut o, i.annotations());
        }
        ContentRef::Audio(a) if !compat.audio => {
            o.raw("type", "\"resource\"");
            write_resource_contents(
                o.key("resource"),
                "audio:",
                Some(a.mime_type()),
                None,
                Some(a.data()),
            );
            write_annotations(&mut o, a.annotations());
        }
        ContentRef::ResourceLink(l) if !compat.resource_link => {
            o.raw("type", "\"text\"");
            let text = match (l.title(), l.description()) {
                (Some(t), Some(d)) => format!("{t} ({}): {d}", l.uri()),
                (Some(t), None) => format!("{t} ({})", l.uri()),
                (None, Some(d)) => format!("{}: {d}", l.uri()),
                (None, None) => l.uri().to_owned(),
            };
            o.str("text", &text);
            write_annotations(&mut o, l.annotations());
        }
        ContentRef::Audio(a) => {
            o.raw("type", "\"audio\"");
            o.str("data", a.data());
            o.str("mimeType", a.mime_type());
            write_annotations(&mut o, a.annotations());
        }
        ContentRef::Resource(r) => {
            o.raw("type", "\"resource\"");
            // MCP's resource contents have no title or description: lost.
            write_resource_contents(
                o.key("resource"),
                r.uri(),
                r.mime_type(),
                r.text(),
                r.blob(),
            );
            write_annotations(&mut o, r.annotations());
        }
        ContentRef::ResourceLink(l) => {
            o.raw("type", "\"resource_link\"");
            o.str("uri", l.uri());
            // MCP requires a name; the frame has none: the title, else the URI.
            o.str("name", l.title().unwrap_or(l.uri()));
            o.opt_str("title", l.title());
            o.opt_str("description", l.description());
            o.opt_str("mimeType", l.mime_type());
            write_annotations(&mut o, l.annotations());
        }
        ContentRef::Unknown(_) => unreachable!("returned above"),
    }
    o.end();
    true
}

macro_rules! union_content {
    ($x:expr, $t:ident, $i:ident, $r:ident, $a:ident, $l:ident) => {{
        let x = $x;
        if let Some(c) = x.$t() {
            ContentRef::Text(c)
        } else if let Some(c) = x.$i() {
            ContentRef::Image(c)
        } else if let Some(c) = x.$r() {
            ContentRef::Resource(c)
        } else if let Some(c) = x.$a() {
            ContentRef::Audio(c)
        } else if let Some(c) = x.$l() {
            ContentRef::ResourceLink(c)
        } else {
            ContentRef::Unknown(0)
        }
    }};
}

// ---------------------------------------------------------------------------
// Frames → messages
// ---------------------------------------------------------------------------

/// What a Response frame is to the edge's loop over a call's frames.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameKind {
    /// `notifications/progress` ([`write_progress`]); more frames follow.
    Progress,
    /// `notifications/message` ([`write_log`]); more frames follow.
    Log,
    /// `notifications/resources/updated` ([`write_resource_updated`]).
    ResourceUpdated,
    /// The call's final frame asks the client for input
    /// ([`write_elicitation_create`]).
    Elicitation,
    /// The call's answer ([`write_response`]); an unreadable frame is
    /// `Final` too (it becomes an internal error).
    Final,
}

/// Whether `frame` is a progress / log / elicitation / final frame.
///
/// The common frame, a call's answer, is only classified here (a shallow
/// look at its payload type) and verified once, where it is written out
/// ([`write_response_for`]); the rare other kinds are verified here, so an
/// unreadable frame is `Final` either way.
pub fn frame_kind(frame: &[u8]) -> FrameKind {
    let kind = match mcp_schema::verify::response_payload_type(frame) {
        Ok(p::ResponsePayload::ProgressNotification) => FrameKind::Progress,
        Ok(p::ResponsePayload::LogMessage) => FrameKind::Log,
        Ok(p::ResponsePayload::ResourceUpdatedNotification) => FrameKind::ResourceUpdated,
        Ok(p::ResponsePayload::ElicitationRequest) => FrameKind::Elicitation,
        _ => return FrameKind::Final,
    };
    if ResponseView::parse(frame).is_ok() {
        kind
    } else {
        FrameKind::Final
    }
}

/// The JSON-RPC code for a frame's error code answering `method` (see the
/// table at the top).
pub fn error_code_for(method: Method, frame_code: i32) -> i32 {
    match ErrorCode::from_code(frame_code) {
        Some(ErrorCode::NotFound) => match method {
            Method::CallTool | Method::GetPrompt | Method::Complete => code::INVALID_PARAMS,
            Method::ReadResource | Method::Subscribe | Method::Unsubscribe => {
                code::RESOURCE_NOT_FOUND
            }
            _ => code::METHOD_NOT_FOUND,
        },
        Some(ErrorCode::ParseError) => code::INTERNAL_ERROR,
        _ => frame_code,
    }
}

/// A final response frame → `{"jsonrpc":"2.0","id":<id>,"result":{…}}` or
/// `{…,"error":{code,message,data?}}` (see the table at the top).
/// `version`: the negotiated protocol version (initialize's
/// `protocolVersion`). A "resource not found" error has no `data.uri`
/// here: [`write_response_for`] has the URI.
pub fn write_response(out: &mut Vec<u8>, id: &Id<'_>, method: Method, frame: &[u8], version: &str) {
    let info = RequestInfo::new(method);
    write_response_for(out, id, &info, frame, version);
}

/// [`write_response`] with what [`request_frame`] learnt of the request
/// (its URI goes into a "resource not found" error's `data`).
pub fn write_response_for(
    out: &mut Vec<u8>,
    id: &Id<'_>,
    info: &RequestInfo<'_>,
    frame: &[u8],
    version: &str,
) {
    match ResponseView::parse(frame) {
        // SAFETY: `verify_response` accepted it, content vector included.
        Ok(v) => unsafe { write_response_of(out, id, info, v.response, version) },
        Err(e) => {
            let msg = format!("the broker answered with an unreadable frame: {e}");
            write_error(out, Some(id), code::INTERNAL_ERROR, &msg, None)
        }
    }
}

/// [`write_response_for`] of a Response already read: the edge's own
/// answers, which it takes without the verifier
/// (`mcp_schema::verify::built_response`). A tool result's content is read
/// without checking it again.
///
/// # Safety
/// `resp` was accepted by `mcp_schema::verify::verify_response` or read by
/// `built_response` (whose contract then held).
pub unsafe fn write_response_of(
    out: &mut Vec<u8>,
    id: &Id<'_>,
    info: &RequestInfo<'_>,
    resp: p::Response<'_>,
    version: &str,
) {
    let method = info.method;
    if let Some(e) = resp.payload_as_error_response() {
        return write_frame_error(out, id, info, method, e.error(), version);
    }
    let compat = Compat::of(version);
    if let Some(tr) = resp.payload_as_tool_result() {
        // SAFETY: the caller's: `resp` is verified or an encoder's output,
        // content vector included.
        let blocks = unsafe { mcp_schema::content_vec::content_unchecked(&tr) };
        let mut o = envelope_start(out, Some(id));
        write_tool_result(o.key("result"), tr, blocks, compat);
        return o.end();
    }
    let mut o = envelope_start(out, Some(id));
    let r = o.key("result");
    if let Some(x) = resp.payload_as_list_tools_result() {
        write_tools(r, x);
    } else if let Some(x) = resp.payload_as_list_resources_result() {
        write_resources(r, x);
    } else if let Some(x) = resp.payload_as_list_resource_templates_result() {
        write_templates(r, x);
    } else if let Some(x) = resp.payload_as_list_prompts_result() {
        write_prompts(r, x);
    } else if let Some(x) = resp.payload_as_resource_data() {
        write_resource_data(r, x);
    } else if let Some(x) = resp.payload_as_applied_prompt() {
        write_applied_prompt(r, x, compat);
    } else if let Some(x) = resp.payload_as_complete_result() {
        write_completion(r, x);
    } else if let Some(x) = resp.payload_as_initialize_response() {
        write_initialize(r, x, version);
    } else if let Some(x) = resp.payload_as_elicitation_request() {
        // The edge sends elicitation/create to clients that can answer it;
        // for one that cannot, the tool's question becomes its error result.
        let mut t = Obj::new(r);
        let mut c = Arr::new(t.key("content"));
        let mut b = Obj::new(c.item());
        b.raw("type", "\"text\"");
        b.str(
            "text",
            &format!(
                "the tool needs more input (elicitation), which this client did not declare \
                 it can give: {}",
                x.message()
            ),
        );
        b.end();
        c.end();
        t.bool("isError", true);
        t.end();
    } else {
        // Ping, EmptyResult, and anything a newer broker adds: `{}`.
        r.extend_from_slice(b"{}");
    }
    // None of these results has a `_meta` of its own.
    if compat.server_info {
        close_with_server_info(r);
    }
    o.end();
}

/// A `tools/call` answered with a tool error result (`isError`, one text
/// block): the model sees why the call could not be carried out as asked.
pub fn write_tool_error(out: &mut Vec<u8>, id: &Id<'_>, text: &str) {
    let mut o = envelope_start(out, Some(id));
    let mut t = Obj::new(o.key("result"));
    let mut c = Arr::new(t.key("content"));
    let mut b = Obj::new(c.item());
    b.raw("type", "\"text\"");
    b.str("text", text);
    b.end();
    c.end();
    t.bool("isError", true);
    t.end();
    o.end();
}

fn write_frame_error(
    out: &mut Vec<u8>,
    id: &Id<'_>,
    info: &RequestInfo<'_>,
    method: Method,
    e: mcp_schema::fb::Error<'_>,
    version: &str,
) {
    let frame_code = e.code();
    // A tool's own failure and its refusal of the arguments it was given
    // are tool execution errors, which MCP (2025-11-25) wants as results
    // the model can read and correct; an unknown tool or a malformed
    // request stays a protocol error. The frame edge's InvalidParams for a
    // tool call comes only from the router or from an argument that is not
    // one JSON value, which this edge's parser never lets through.
    // A NotFound from the router itself (a key, a record: business logic)
    // is one too; only the broker's own "unknown tool `name`"
    // (`dispatch::not_found`) is the protocol's unknown tool.
    let tool_failure = frame_code == ErrorCode::ExecutionError.code()
        || frame_code == ErrorCode::InvalidParams.code()
        || (frame_code == ErrorCode::NotFound.code() && !e.message().starts_with("unknown tool `"));
    if method == Method::CallTool && tool_failure {
        let mut o = envelope_start(out, Some(id));
        let mut t = Obj::new(o.key("result"));
        let mut c = Arr::new(t.key("content"));
        let mut b = Obj::new(c.item());
        b.raw("type", "\"text\"");
        b.str("text", e.message());
        b.end();
        c.end();
        t.bool("isError", true);
        if version == MODERN_VERSION {
            write_server_info_meta(&mut t);
        }
        t.end();
        return o.end();
    }
    let mut rpc_code = error_code_for(method, frame_code);
    // 2026-07-28 retired -32002, and its implementations MUST NOT emit it
    // (basic/index, "Error Codes"): an unknown resource is invalid params
    // there (still with `data.uri`), and the broker's router fault, which
    // shares the code, is an internal error (still with `data.kind`
    // `"router_fault"` and `data.retryable`).
    if rpc_code == code::RESOURCE_NOT_FOUND && version == MODERN_VERSION {
        rpc_code = if ErrorCode::from_code(frame_code) == Some(ErrorCode::NotFound) {
            code::INVALID_PARAMS
        } else {
            code::INTERNAL_ERROR
        };
    }
    let mut data_buf = Vec::new();
    let data: Option<&str> = if error_code_for(method, frame_code) == code::RESOURCE_NOT_FOUND
        && ErrorCode::from_code(frame_code) == Some(ErrorCode::NotFound)
    {
        info.uri.as_deref().map(|uri| {
            let mut d = Obj::new(&mut data_buf);
            d.str("uri", uri);
            d.end();
            std::str::from_utf8(&data_buf).unwrap_or("null")
        })
    } else if let Some(d) = e.data().filter(|d| !d.trim_ascii().is_empty()) {
        Some(d)
    } else {
        broker_error_data(frame_code, &mut data_buf)
    };
    // MCP's own wording for an unknown tool, when the request named it.
    let unknown_tool;
    let message = match (&info.tool_name, ErrorCode::from_code(frame_code)) {
        (Some(name), Some(ErrorCode::NotFound)) if method == Method::CallTool => {
            unknown_tool = format!("Unknown tool: {name}");
            &unknown_tool
        }
        _ => e.message(),
    };
    write_error(out, Some(id), rpc_code, message, data);
}

/// MCP `CallToolResult`. Structured content goes out as
/// `structuredContent` when it is one JSON object; one that is not (MCP
/// requires an object) is dropped when the router sent content blocks
/// (which, by MCP's advice, already carry it as text: repeating it would
/// show the model the value twice). With no content blocks, the structured
/// content or the error's message becomes the one text block.
fn write_tool_result(
    out: &mut Vec<u8>,
    tr: p::ToolResult<'_>,
    blocks: mcp_schema::content_vec::ContentVec<'_>,
    compat: Compat,
) {
    let structured = tr.structured_content();
    let structured_object = structured.and_then(json_object);
    let mut o = Obj::new(out);
    let mut c = Arr::new(o.key("content"));
    let mut any = false;
    for b in blocks.iter() {
        // A newer schema's block is skipped before its comma is written.
        if matches!(b, ContentRef::Unknown(_)) {
            continue;
        }
        any |= write_content(c.item(), b, compat);
    }
    let text_block = |c: &mut Arr<'_>, text: &str| {
        let mut b = Obj::new(c.item());
        b.raw("type", "\"text\"");
        b.str("text", text);
        b.end();
    };
    match (structured, structured_object) {
        (Some(s), _) if !any => text_block(&mut c, s),
        _ if !any => {
            if let Some(e) = tr.error() {
                text_block(&mut c, e.message());
            }
        }
        _ => {}
    }
    c.end();
    if let Some(s) = structured_object {
        o.raw("structuredContent", s);
    }
    o.bool("isError", tr.is_error() || tr.error().is_some());
    write_meta(&mut o, tr.metadata(), compat.server_info);
    o.end();
}

fn write_tools(out: &mut Vec<u8>, r: p::ListToolsResult<'_>) {
    let mut o = Obj::new(out);
    let mut arr = Arr::new(o.key("tools"));
    for t in r.tools().iter().flatten() {
        let mut to = Obj::new(arr.item());
        to.str("name", t.name());
        to.opt_str("title", t.title());
        if !t.description().is_empty() {
            to.str("description", t.description());
        }
        // MCP requires an object schema; a router's broken one (or one of
        // another type) is replaced by the schema of any object.
        let input = t.input_schema().and_then(|s| object_schema(s, false));
        to.raw(
            "inputSchema",
            input.as_deref().unwrap_or("{\"type\":\"object\"}"),
        );
        // A broken output schema is dropped: without it clients do not
        // validate structured content, which is what a broken one means.
        if let Some(s) = t.output_schema().and_then(|s| object_schema(s, false)) {
            to.raw("outputSchema", &s);
        }
        if let Some(a) = t.annotations() {
            // `streaming` and `experimental` have no MCP hint: lost.
            let mut ao = Obj::new(to.key("annotations"));
            if let Some(v) = a.read_only() {
                ao.bool("readOnlyHint", v);
            }
            if let Some(v) = a.destructive() {
                ao.bool("destructiveHint", v);
            }
            ao.end();
        }
        write_meta(&mut to, t.metadata(), false);
        to.end();
    }
    arr.end();
    o.opt_str("nextCursor", r.next_cursor());
    o.end();
}

fn write_resources(out: &mut Vec<u8>, r: p::ListResourcesResult<'_>) {
    let mut o = Obj::new(out);
    let mut arr = Arr::new(o.key("resources"));
    for x in r.resources().iter().flatten() {
        let mut ro = Obj::new(arr.item());
        ro.str("uri", x.uri());
        ro.str("name", x.name());
        ro.opt_str("title", x.title());
        ro.opt_str("description", x.description());
        ro.opt_str("mimeType", x.mime_type());
        // 0 is the wire's "absent" (no presence bit for scalars).
        if x.size_bytes() > 0 {
            ro.num("size", x.size_bytes());
        }
        write_annotations(&mut ro, x.annotations());
        write_meta(&mut ro, x.metadata(), false);
        ro.end();
    }
    arr.end();
    o.opt_str("nextCursor", r.next_cursor());
    o.end();
}

fn write_templates(out: &mut Vec<u8>, r: p::ListResourceTemplatesResult<'_>) {
    let mut o = Obj::new(out);
    let mut arr = Arr::new(o.key("resourceTemplates"));
    for x in r.resource_templates().iter().flatten() {
        let mut ro = Obj::new(arr.item());
        ro.str("uriTemplate", x.uri_template());
        ro.str("name", x.name());
        ro.opt_str("title", x.title());
        ro.opt_str("description", x.description());
        ro.opt_str("mimeType", x.mime_type());
        write_annotations(&mut ro, x.annotations());
        ro.end();
    }
    arr.end();
    o.opt_str("nextCursor", r.next_cursor());
    o.end();
}

fn write_prompts(out: &mut Vec<u8>, r: p::ListPromptsResult<'_>) {
    let mut o = Obj::new(out);
    let mut arr = Arr::new(o.key("prompts"));
    for x in r.prompts().iter().flatten() {
        let mut po = Obj::new(arr.item());
        po.str("name", x.name());
        po.opt_str("description", x.description());
        if let Some(args) = x.arguments() {
            let mut aa = Arr::new(po.key("arguments"));
            for a in args.iter() {
                let mut ao = Obj::new(aa.item());
                ao.str("name", a.name());
                ao.opt_str("description", a.description());
                ao.bool("required", a.required());
                ao.end();
            }
            aa.end();
        }
        write_meta(&mut po, x.metadata(), false);
        po.end();
    }
    arr.end();
    o.opt_str("nextCursor", r.next_cursor());
    o.end();
}

/// MCP `ReadResourceResult`: `content` first, then `extra_contents`. A
/// first block that is not resource contents is given the resource's URI
/// and MIME type (an image or audio block's data becomes a blob).
fn write_resource_data(out: &mut Vec<u8>, d: p::ResourceData<'_>) {
    let res = d.resource();
    let mut o = Obj::new(out);
    let mut arr = Arr::new(o.key("contents"));
    let first = union_content!(
        d,
        content_as_text_content,
        content_as_image_content,
        content_as_resource_content,
        content_as_audio_content,
        content_as_resource_link_content
    );
    match first {
        ContentRef::Resource(r) => {
            write_resource_contents(arr.item(), r.uri(), r.mime_type(), r.text(), r.blob())
        }
        ContentRef::Text(t) => {
            write_resource_contents(arr.item(), res.uri(), res.mime_type(), Some(t.text()), None)
        }
        ContentRef::Image(i) => write_resource_contents(
            arr.item(),
            res.uri(),
            Some(i.mime_type()),
            None,
            Some(i.data()),
        ),
        ContentRef::Audio(a) => write_resource_contents(
            arr.item(),
            res.uri(),
            Some(a.mime_type()),
            None,
            Some(a.data()),
        ),
        ContentRef::ResourceLink(l) => {
            write_resource_contents(arr.item(), l.uri(), l.mime_type(), None, None)
        }
        ContentRef::Unknown(_) => {}
    }
    for r in d.extra_contents().iter().flatten() {
        write_resource_contents(arr.item(), r.uri(), r.mime_type(), r.text(), r.blob());
    }
    arr.end();
    o.end();
}

/// MCP `GetPromptResult`. A seed router's prompt with only
/// `filled_content` is one user message. MCP roles are user and assistant:
/// any other role (the seed's "system") is sent as "user".
fn write_applied_prompt(out: &mut Vec<u8>, a: p::AppliedPrompt<'_>, compat: Compat) {
    let mut o = Obj::new(out);
    o.opt_str("description", a.description());
    let mut arr = Arr::new(o.key("messages"));
    let message = |arr: &mut Arr<'_>, role: &str, c: ContentRef<'_>| {
        if matches!(c, ContentRef::Unknown(_)) {
            return;
        }
        let mut m = Obj::new(arr.item());
        m.raw(
            "role",
            if role == "assistant" {
                "\"assistant\""
            } else {
                "\"user\""
            },
        );
        write_content(m.key("content"), c, compat);
        m.end();
    };
    let messages = a.messages().filter(|m| !m.is_empty());
    match messages {
        Some(ms) => {
            for m in ms.iter() {
                let c = union_content!(
                    m,
                    content_as_text_content,
                    content_as_image_content,
                    content_as_resource_content,
                    content_as_audio_content,
                    content_as_resource_link_content
                );
                message(&mut arr, m.role(), c);
            }
        }
        None => {
            let c = union_content!(
                a,
                filled_content_as_text_content,
                filled_content_as_image_content,
                filled_content_as_resource_content,
                filled_content_as_audio_content,
                filled_content_as_resource_link_content
            );
            message(&mut arr, "user", c);
        }
    }
    arr.end();
    o.end();
}

/// MCP allows at most this many completion values in one answer.
pub const MAX_COMPLETION_VALUES: usize = 100;

/// MCP `CompleteResult`: past [`MAX_COMPLETION_VALUES`] the values are cut
/// and `hasMore` is set.
fn write_completion(out: &mut Vec<u8>, c: p::CompleteResult<'_>) {
    let mut o = Obj::new(out);
    let mut co = Obj::new(o.key("completion"));
    let values = c.values();
    let n = values.map_or(0, |v| v.len());
    let mut arr = Arr::new(co.key("values"));
    for v in values.iter().flatten().take(MAX_COMPLETION_VALUES) {
        write_json_string(v, arr.item());
    }
    arr.end();
    if let Some(t) = c.total() {
        co.num("total", t);
    }
    co.bool("hasMore", c.has_more() || n > MAX_COMPLETION_VALUES);
    co.end();
    o.end();
}

/// MCP `InitializeResult`, its `protocolVersion` the one the edge
/// negotiated (the frame's enum knows fewer).
fn write_initialize(out: &mut Vec<u8>, r: p::InitializeResponse<'_>, version: &str) {
    let c = r.server_capabilities();
    let mut o = Obj::new(out);
    o.str("protocolVersion", version);
    let mut caps = Obj::new(o.key("capabilities"));
    if c.supports_tools() {
        let mut t = Obj::new(caps.key("tools"));
        t.bool("listChanged", c.tools_list_changed());
        t.end();
    }
    if c.supports_resources() {
        let mut t = Obj::new(caps.key("resources"));
        t.bool("subscribe", c.supports_resource_subscribe());
        t.bool("listChanged", c.resources_list_changed());
        t.end();
    }
    if c.supports_prompts() {
        let mut t = Obj::new(caps.key("prompts"));
        t.bool("listChanged", c.prompts_list_changed());
        t.end();
    }
    if c.supports_logging() {
        caps.raw("logging", "{}");
    }
    if c.supports_completions() {
        caps.raw("completions", "{}");
    }
    caps.end();
    let mut si = Obj::new(o.key("serverInfo"));
    si.str("name", c.server_name().unwrap_or("mcp-broker"));
    si.str("version", c.server_version().unwrap_or(""));
    si.end();
    if let Some(i) = r.instructions().filter(|i| !i.is_empty()) {
        o.str("instructions", i);
    }
    o.end();
}

fn notification_start<'o>(out: &'o mut Vec<u8>, method: &str) -> Obj<'o> {
    let mut o = Obj::new(out);
    o.raw("jsonrpc", "\"2.0\"");
    o.str("method", method);
    o
}

/// A progress frame → `notifications/progress` with the client's token.
///
/// The progress as the router reported it when the frame has it (`value`,
/// and `total` only when known); else the frame's fraction (0..1) as is
/// with `total: 1`, as the gRPC edge does: exact (no rounding of
/// `f32 × 100`) and increasing whenever the router's fractions are. Returns
/// `false` (nothing written) when the frame is not a progress notification.
pub fn write_progress(out: &mut Vec<u8>, token: &RawValue, frame: &[u8]) -> bool {
    let Some(n) = ResponseView::parse(frame)
        .ok()
        .and_then(|v| v.response.payload_as_progress_notification())
    else {
        return false;
    };
    let mut o = notification_start(out, "notifications/progress");
    let mut ps = Obj::new(o.key("params"));
    ps.raw("progressToken", token.get());
    match n.value().filter(|v| v.is_finite()) {
        Some(v) => {
            ps.num("progress", v);
            if let Some(t) = n.total().filter(|t| t.is_finite()) {
                ps.num("total", t);
            }
        }
        None => {
            ps.num("progress", finite(n.progress()));
            ps.raw("total", "1");
        }
    }
    ps.opt_str("message", n.message());
    ps.end();
    o.end();
    true
}

/// The MCP level name of a wire level.
pub fn log_level_name(l: p::LogLevel) -> &'static str {
    match l {
        p::LogLevel::Debug => "debug",
        p::LogLevel::Info => "info",
        p::LogLevel::Warning => "warning",
        p::LogLevel::Error => "error",
        _ => "critical",
    }
}

/// The rank of an MCP log level (debug 0 .. emergency 7), to compare a
/// message's level with a session's `logging/setLevel` minimum.
pub fn level_rank(name: &str) -> Option<usize> {
    LOG_LEVELS.iter().position(|l| *l == name)
}

/// The LogMessage metadata key that keeps an MCP level the frame's five
/// cannot name (`notice`, `alert`, `emergency`), so that an edge speaking
/// MCP filters and shows the level the router gave (`adapt::log_frame`).
pub const LOG_LEVEL_META_KEY: &str = "mcp-broker/level";

/// The LogMessage metadata key that keeps structured log `data` (JSON
/// text other than a string): the frame's `message` holds its text, and an
/// edge speaking MCP sends the value itself.
pub const LOG_DATA_META_KEY: &str = "mcp-broker/data";

/// The MCP level of a LogMessage frame (`None` for any other frame): the
/// one kept in its metadata when the frame's own five cannot name it.
pub fn log_level_of(frame: &[u8]) -> Option<&'static str> {
    let l = ResponseView::parse(frame)
        .ok()?
        .response
        .payload_as_log_message()?;
    Some(mcp_level(&l))
}

fn mcp_level(l: &p::LogMessage<'_>) -> &'static str {
    log_meta(l, LOG_LEVEL_META_KEY)
        .and_then(|v| LOG_LEVELS.iter().find(|n| **n == v))
        .copied()
        .unwrap_or_else(|| log_level_name(l.level()))
}

fn log_meta<'a>(l: &p::LogMessage<'a>, key: &str) -> Option<&'a str> {
    l.metadata()?
        .iter()
        .find(|kv| kv.key() == key)
        .and_then(|kv| kv.value())
}

/// A LogMessage frame → `notifications/message {level, logger?, data}`:
/// `data` the structured value the router logged when the frame keeps one
/// ([`LOG_DATA_META_KEY`]), else the message text. Returns `false`
/// (nothing written) when the frame is not a log message.
pub fn write_log(out: &mut Vec<u8>, frame: &[u8]) -> bool {
    let Some(l) = ResponseView::parse(frame)
        .ok()
        .and_then(|v| v.response.payload_as_log_message())
    else {
        return false;
    };
    let mut o = notification_start(out, "notifications/message");
    let mut ps = Obj::new(o.key("params"));
    ps.raw("level", &format!("\"{}\"", mcp_level(&l)));
    ps.opt_str("logger", l.source());
    match log_meta(&l, LOG_DATA_META_KEY).and_then(json_value) {
        Some(v) => ps.raw("data", v),
        None => ps.str("data", l.message()),
    }
    ps.end();
    o.end();
    true
}

/// A ResourceUpdatedNotification frame → `notifications/resources/updated
/// {uri}`. Returns `false` (nothing written) for any other frame.
pub fn write_resource_updated(out: &mut Vec<u8>, frame: &[u8]) -> bool {
    let Some(u) = ResponseView::parse(frame)
        .ok()
        .and_then(|v| v.response.payload_as_resource_updated_notification())
    else {
        return false;
    };
    let mut o = notification_start(out, "notifications/resources/updated");
    let mut ps = Obj::new(o.key("params"));
    ps.str("uri", u.uri());
    ps.end();
    o.end();
    true
}

/// An ElicitationRequest frame → the server's request `elicitation/create`
/// with our own string `id`: params `message`, `requestedSchema` (the
/// frame's schema when it is one JSON object schema, else the empty form
/// `{"type":"object","properties":{}}`) and `_meta`. `mode` is left out:
/// 2025-11-25 makes it optional with "form" the default, and 2025-06-18
/// clients do not know it. Returns `false` (nothing written) for any other
/// frame.
pub fn write_elicitation_create(out: &mut Vec<u8>, id: &str, frame: &[u8]) -> bool {
    let Some(e) = ResponseView::parse(frame)
        .ok()
        .and_then(|v| v.response.payload_as_elicitation_request())
    else {
        return false;
    };
    let mut o = Obj::new(out);
    o.raw("jsonrpc", "\"2.0\"");
    o.str("id", id);
    o.raw("method", "\"elicitation/create\"");
    let mut ps = Obj::new(o.key("params"));
    ps.str("message", e.message());
    let schema = object_schema(e.schema(), true);
    ps.raw(
        "requestedSchema",
        schema
            .as_deref()
            .unwrap_or("{\"type\":\"object\",\"properties\":{}}"),
    );
    write_meta(&mut ps, e.meta(), false);
    ps.end();
    o.end();
    true
}

/// The 2026-07-28 revision's version string (the modern era).
pub const MODERN_VERSION: &str = "2026-07-28";

/// `server/discover`'s `DiscoverResult` from an InitializeResponse frame
/// (the same capabilities `initialize` reports): `supportedVersions`,
/// `capabilities`, `instructions`, the caching hints the revision requires
/// (`ttlMs`, `cacheScope`) and `serverInfo` under `_meta`, where 2026-07-28
/// moved it. `listChanged` is `notifies`: whether the edge delivers them
/// (over `subscriptions/listen`, on every route table change, whatever the
/// routers say); `subscribe` is `subscribes`: whether some router's
/// resource updates reach listen streams (`resourceSubscriptions`).
/// An error frame is written as the error it is.
pub fn write_discover(
    out: &mut Vec<u8>,
    id: &Id<'_>,
    frame: &[u8],
    versions: &[&str],
    cache_scope: &str,
    notifies: bool,
    subscribes: bool,
) {
    let Some(r) = ResponseView::parse(frame)
        .ok()
        .and_then(|v| v.response.payload_as_initialize_response())
    else {
        let info = RequestInfo::new(Method::Initialize);
        return write_response_for(out, id, &info, frame, MODERN_VERSION);
    };
    let c = r.server_capabilities();
    let mut o = envelope_start(out, Some(id));
    let mut res = Obj::new(o.key("result"));
    res.raw("resultType", "\"complete\"");
    let mut vs = Arr::new(res.key("supportedVersions"));
    for v in versions {
        write_json_string(v, vs.item());
    }
    vs.end();
    let mut caps = Obj::new(res.key("capabilities"));
    if c.supports_tools() {
        let mut t = Obj::new(caps.key("tools"));
        t.bool("listChanged", notifies);
        t.end();
    }
    if c.supports_resources() {
        let mut t = Obj::new(caps.key("resources"));
        t.bool("subscribe", subscribes);
        t.bool("listChanged", notifies);
        t.end();
    }
    if c.supports_prompts() {
        let mut t = Obj::new(caps.key("prompts"));
        t.bool("listChanged", notifies);
        t.end();
    }
    // Deprecated by 2026-07-28 (SEP-2577) but still in its schema: the
    // edge sends log messages to a request that carries
    // `_meta["io.modelcontextprotocol/logLevel"]`, and a client that
    // checks capabilities first would otherwise never ask.
    if c.supports_logging() {
        caps.raw("logging", "{}");
    }
    if c.supports_completions() {
        caps.raw("completions", "{}");
    }
    caps.end();
    if let Some(i) = r.instructions().filter(|i| !i.is_empty()) {
        res.str("instructions", i);
    }
    res.raw("ttlMs", "0");
    res.str("cacheScope", cache_scope);
    let mut meta = Obj::new(res.key("_meta"));
    let mut si = Obj::new(meta.key("io.modelcontextprotocol/serverInfo"));
    si.str("name", c.server_name().unwrap_or("mcp-broker"));
    si.str("version", c.server_version().unwrap_or(""));
    si.end();
    meta.end();
    res.end();
    o.end();
}

/// Multi round-trip (2026-07-28): an ElicitationRequest frame →
/// `{"resultType":"input_required","inputRequests":{<key>:{"method":
/// "elicitation/create","params":{"mode":"form",message,requestedSchema}}}}`
/// (the schema as [`write_elicitation_create`] sends it), with
/// `"requestState"` when one is given. Returns `false` (nothing written)
/// for any other frame.
pub fn write_input_required_elicitation(
    out: &mut Vec<u8>,
    id: &Id<'_>,
    key: &str,
    frame: &[u8],
    request_state: Option<&str>,
) -> bool {
    let Some(e) = ResponseView::parse(frame)
        .ok()
        .and_then(|v| v.response.payload_as_elicitation_request())
    else {
        return false;
    };
    let mut o = envelope_start(out, Some(id));
    let mut res = Obj::new(o.key("result"));
    res.raw("resultType", "\"input_required\"");
    let mut reqs = Obj::new(res.key("inputRequests"));
    let mut r = Obj::new(reqs.key_escaped(key));
    r.raw("method", "\"elicitation/create\"");
    let mut ps = Obj::new(r.key("params"));
    ps.raw("mode", "\"form\"");
    ps.str("message", e.message());
    let schema = object_schema(e.schema(), true);
    ps.raw(
        "requestedSchema",
        schema
            .as_deref()
            .unwrap_or("{\"type\":\"object\",\"properties\":{}}"),
    );
    write_meta(&mut ps, e.meta(), false);
    ps.end();
    r.end();
    reqs.end();
    if let Some(t) = request_state {
        res.str("requestState", t);
    }
    write_server_info_meta(&mut res);
    res.end();
    o.end();
    true
}

/// Multi round-trip: a tool result that asks for sampling or roots
/// ([`sampling_request`]'s or [`roots_request`]'s `params`, one JSON
/// object) → an `InputRequiredResult` with one input request of `method`
/// (`sampling/createMessage`, `roots/list`), and `"requestState"` when one
/// is given.
pub fn write_input_required_request(
    out: &mut Vec<u8>,
    id: &Id<'_>,
    key: &str,
    method: &str,
    params: &str,
    request_state: Option<&str>,
) {
    let mut o = envelope_start(out, Some(id));
    let mut res = Obj::new(o.key("result"));
    res.raw("resultType", "\"input_required\"");
    let mut reqs = Obj::new(res.key("inputRequests"));
    let mut r = Obj::new(reqs.key_escaped(key));
    r.str("method", method);
    r.raw("params", params.trim());
    r.end();
    reqs.end();
    if let Some(t) = request_state {
        res.str("requestState", t);
    }
    write_server_info_meta(&mut res);
    res.end();
    o.end();
}

/// Multi round-trip: a tool result that asks a set of questions
/// ([`input_requests`]) → an `InputRequiredResult` with one input request
/// each, under its key, and the `requestState` that names them.
pub fn write_input_required_set(
    out: &mut Vec<u8>,
    id: &Id<'_>,
    set: &[InputRequest<'_>],
    request_state: &str,
) {
    let mut o = envelope_start(out, Some(id));
    let mut res = Obj::new(o.key("result"));
    res.raw("resultType", "\"input_required\"");
    let mut reqs = Obj::new(res.key("inputRequests"));
    for q in set {
        let mut r = Obj::new(reqs.key_escaped(&q.key));
        r.str("method", q.method());
        r.raw("params", q.params);
        r.end();
    }
    reqs.end();
    res.str("requestState", request_state);
    write_server_info_meta(&mut res);
    res.end();
    o.end();
}

/// Marks a response written by [`write_response_for`] as a 2026-07-28
/// complete result: `"resultType":"complete"` first in `result` (required
/// on every result of that revision), plus the caching hints
/// `"ttlMs":0,"cacheScope":<scope>` when `cache_scope` is given (required
/// on listings and `resources/read`). An error response is left as is.
pub fn mark_complete(out: &mut Vec<u8>, id: &Id<'_>, cache_scope: Option<&str>) {
    const HEAD: &[u8] = b"{\"jsonrpc\":\"2.0\",\"id\":";
    const RESULT: &[u8] = b",\"result\":{";
    let at = HEAD.len() + id.get().len() + RESULT.len();
    if out.len() <= at || !out[..at].starts_with(HEAD) || !out[..at].ends_with(RESULT) {
        return;
    }
    let mut ins = Vec::with_capacity(64);
    ins.extend_from_slice(b"\"resultType\":\"complete\"");
    if let Some(scope) = cache_scope {
        ins.extend_from_slice(b",\"ttlMs\":0,\"cacheScope\":");
        write_json_string(scope, &mut ins);
    }
    if out[at] != b'}' {
        ins.push(b',');
    }
    out.splice(at..at, ins);
}

#[derive(Deserialize)]
struct ElicitResult<'a> {
    #[serde(borrow, default)]
    action: Option<&'a RawValue>,
    #[serde(borrow, default)]
    content: Option<&'a RawValue>,
}

/// The client's answer to elicitation/create (`result: {action,
/// content?}`) → the JSON text of the `_elicitation` argument handed to the
/// re-called tool: `{"action":"accept","content":{…}}` (content only with
/// accept, as the client sent it), `{"action":"decline"}`,
/// `{"action":"cancel"}`. Anything else → -32602.
pub fn elicitation_answer(result: &RawValue) -> Result<String, RpcError<'static>> {
    let bad = |m: String| RpcError::new(None, code::INVALID_PARAMS, m);
    if first_byte(result) != b'{' {
        return Err(bad("elicitation result must be an object".into()));
    }
    let r: ElicitResult<'_> =
        serde_json::from_str(result.get()).map_err(|e| bad(format!("elicitation result: {e}")))?;
    let action = r.action.and_then(string_of);
    let action = match action.as_deref() {
        Some(a @ ("accept" | "decline" | "cancel")) => a,
        _ => {
            return Err(bad(
                "elicitation result: `action` must be accept, decline or cancel".into(),
            ));
        }
    };
    let mut out = Vec::with_capacity(32 + r.content.map_or(0, |c| c.get().len()));
    let mut o = Obj::new(&mut out);
    o.str("action", action);
    if action == "accept"
        && let Some(c) = r.content.filter(|c| c.get() != "null")
    {
        if first_byte(c) != b'{' {
            return Err(bad("elicitation result: `content` must be an object".into()));
        }
        o.raw("content", c.get());
    }
    o.end();
    // Only UTF-8 was written: escaped strings and JSON text from a &str.
    Ok(String::from_utf8(out).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adapt;
    use crate::route::Listed;
    use crate::wasm::types as w;
    use bytes::Bytes;
    use mcp_schema::encode::{Correlation, ReplyTo};
    use mcp_schema::fb::UUID;
    use mcp_schema::verify::VerifiedRequest;
    use mcp_schema::{RequestKind, ResponseEncoder, RouteKey};
    use serde_json::{Value, json};

    /// A listing's first page, at the default page size.
    const FIRST_PAGE: adapt::Page = adapt::Page {
        start: 0,
        size: 100,
        table: 1,
    };

    const TO: ReplyTo<'static> = ReplyTo {
        correlation: Correlation::Text("c1"),
        session_id: Some("s1"),
    };

    fn header() -> RequestHeader<'static> {
        RequestHeader {
            message_id: [7; 16],
            correlation_id: Some("corr-1"),
            session_id: Some("sess-1"),
            timeout_ms: 2500,
            unix_nanos: 1,
        }
    }

    fn raw(text: &str) -> &RawValue {
        serde_json::from_str(text).unwrap()
    }

    /// Builds and verifies the frame of `method` with `params` (JSON text).
    fn build<'a>(
        method: Method,
        params: Option<&'a str>,
        extra: &[(&str, &str)],
    ) -> Result<(VerifiedRequest, RequestInfo<'a>), RpcError<'a>> {
        let mut enc = RequestEncoder::new();
        let params = params.map(raw);
        let (frame, info) = request_frame(&mut enc, &header(), method, params, extra)?;
        let v = VerifiedRequest::verify(Bytes::copy_from_slice(frame)).expect("frame verifies");
        Ok((v, info))
    }

    fn refused(method: Method, params: &str) -> RpcError<'_> {
        match build(method, Some(params), &[]) {
            Ok(_) => panic!("{params} was accepted"),
            Err(e) => e,
        }
    }

    fn one(body: &str) -> Message<'_> {
        match parse(body.as_bytes()) {
            Ok(Body::One(m)) => m,
            other => panic!("{body}: {other:?}"),
        }
    }

    fn err(body: &str) -> RpcError<'_> {
        match parse(body.as_bytes()) {
            Err(e) => e,
            Ok(b) => panic!("{body} parsed: {b:?}"),
        }
    }

    fn json_of(out: &[u8]) -> Value {
        serde_json::from_slice(out)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(out)))
    }

    /// The size-prefixed frames of a buffer, in order.
    fn frames(buf: &[u8]) -> Vec<&[u8]> {
        let mut v = Vec::new();
        let mut rest = buf;
        while !rest.is_empty() {
            let n = u32::from_le_bytes(rest[..4].try_into().unwrap()) as usize;
            v.push(&rest[..4 + n]);
            rest = &rest[4 + n..];
        }
        v
    }

    fn response(id: &str, method: Method, frame: &[u8]) -> Value {
        response_in("2025-06-18", id, method, frame)
    }

    fn response_in(version: &str, id: &str, method: Method, frame: &[u8]) -> Value {
        let mut out = Vec::new();
        write_response(&mut out, &Id(raw(id)), method, frame, version);
        json_of(&out)
    }

    fn text(t: &str) -> w::ContentBlock {
        w::ContentBlock::Text(w::TextContent {
            text: t.into(),
            annotations: None,
        })
    }

    fn completed(content: Vec<w::ContentBlock>, structured: Option<&str>) -> w::Response {
        w::Response::Completed(w::ToolResult {
            content,
            structured_content: structured.map(Into::into),
            progress: None,
            meta: None,
            is_error: None,
        })
    }

    fn tool_frames(r: &w::Response) -> Vec<u8> {
        let mut enc = ResponseEncoder::new(1);
        let mut out = Vec::new();
        adapt::tool_response(&mut enc, &mut out, &TO, &UUID::new(&[7; 16]), r);
        out
    }

    #[test]
    fn a_set_of_questions_is_read_in_order_and_refused_with_its_fault() {
        let ask = |value: &str| {
            let r = w::Response::Completed(w::ToolResult {
                content: vec![],
                structured_content: None,
                progress: None,
                meta: Some(vec![w::MetaEntry {
                    key: INPUT_REQUESTS_META_KEY.into(),
                    value: value.into(),
                }]),
                is_error: None,
            });
            frames(&tool_frames(&r)).last().unwrap().to_vec()
        };
        let f = ask(
            r#" {"user_name":{"method":"elicitation/create","params":{"message":"Name?"}},
                 "greeting":{"method":"sampling/createMessage","params":{"maxTokens":5}},
                 "client_roots":{"method":"roots/list"}} "#,
        );
        assert!(result_asks(&f));
        let set = input_requests(&f).unwrap().unwrap();
        let got: Vec<_> = set
            .iter()
            .map(|q| (&*q.key, q.method(), q.params))
            .collect();
        assert_eq!(
            got,
            [
                ("user_name", "elicitation/create", r#"{"message":"Name?"}"#),
                ("greeting", "sampling/createMessage", r#"{"maxTokens":5}"#),
                ("client_roots", "roots/list", "{}"),
            ]
        );
        let id_raw = RawValue::from_string("3".into()).unwrap();
        let mut out = Vec::new();
        write_input_required_set(&mut out, &Id(&id_raw), &set, "tok");
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["result"]["resultType"], "input_required");
        assert_eq!(v["result"]["requestState"], "tok");
        assert_eq!(
            v["result"]["inputRequests"]["greeting"],
            serde_json::json!({"method": "sampling/createMessage", "params": {"maxTokens": 5}})
        );
        assert_eq!(
            v["result"]["inputRequests"]["client_roots"]["params"],
            serde_json::json!({})
        );
        // Each fault is named.
        let long = format!(r#"{{"{}":{{"method":"roots/list"}}}}"#, "k".repeat(65));
        let many: Vec<String> = (0..=MAX_INPUT_REQUESTS)
            .map(|i| format!(r#""k{i}":{{"method":"roots/list"}}"#))
            .collect();
        let many = format!("{{{}}}", many.join(","));
        for (bad, says) in [
            ("[1]", "must be an object"),
            ("{", "not JSON"),
            ("{}", "holds 0 questions"),
            (&many[..], "holds 9 questions"),
            (&long[..], "1 to 64 bytes"),
            (
                r#"{"a":{"method":"tools/call","params":{}}}"#,
                "method `tools/call`",
            ),
            (r#"{"a":{"params":{}}}"#, "missing field `method`"),
            (
                r#"{"a":{"method":"sampling/createMessage"}}"#,
                "`params` must be an object",
            ),
            (
                r#"{"a":{"method":"roots/list","params":[]}}"#,
                "`params` must be an object",
            ),
            (
                r#"{"a":{"method":"roots/list"},"a":{"method":"roots/list"}}"#,
                "appears twice",
            ),
        ] {
            let e = input_requests(&ask(bad)).unwrap().unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
            assert!(e.starts_with(INPUT_REQUESTS_META_KEY), "{bad}: {e}");
        }
    }

    #[test]
    fn a_sampling_request_is_found_only_under_its_meta_key() {
        let ask = |meta: Vec<w::MetaEntry>, text: &str| {
            let r = w::Response::Completed(w::ToolResult {
                content: vec![w::ContentBlock::Text(w::TextContent {
                    text: text.into(),
                    annotations: None,
                })],
                structured_content: None,
                progress: None,
                meta: Some(meta),
                is_error: None,
            });
            let buf = tool_frames(&r);
            frames(&buf).last().unwrap().to_vec()
        };
        let entry = |key: &str, value: &str| w::MetaEntry {
            key: key.into(),
            value: value.into(),
        };
        let f = ask(vec![entry(SAMPLING_META_KEY, r#"{"maxTokens":5}"#)], "hi");
        assert_eq!(sampling_request(&f), Some(r#"{"maxTokens":5}"#));
        // The key's bytes elsewhere in the answer (a text, another key's
        // value) are not a request.
        let f = ask(
            vec![entry("other", SAMPLING_META_KEY)],
            "mcp-broker/sample in a text",
        );
        assert_eq!(sampling_request(&f), None);
        // Under the key but not one JSON object: not a request.
        let f = ask(vec![entry(SAMPLING_META_KEY, "[1]")], "hi");
        assert_eq!(sampling_request(&f), None);
        let f = ask(vec![entry("k", "v")], "hi");
        assert_eq!(sampling_request(&f), None);

        // Roots likewise, and a result asking for both asks for sampling.
        let f = ask(vec![entry(ROOTS_META_KEY, "{}")], "hi");
        assert_eq!(roots_request(&f), Some("{}"));
        assert_eq!(sampling_request(&f), None);
        let f = ask(vec![entry(ROOTS_META_KEY, "true")], "hi");
        assert_eq!(roots_request(&f), None);
        let f = ask(
            vec![entry(ROOTS_META_KEY, "{}"), entry(SAMPLING_META_KEY, "{}")],
            "hi",
        );
        assert_eq!(
            (sampling_request(&f), roots_request(&f)),
            (Some("{}"), None)
        );
        // The router's state and input key ride any question, and are read
        // whether the value is JSON or bare text.
        let f = ask(
            vec![
                entry(ROOTS_META_KEY, "{}"),
                entry(STATE_META_KEY, r#"{"n":1}"#),
                entry(INPUT_KEY_META_KEY, r#""client_roots""#),
            ],
            "hi",
        );
        assert_eq!(router_state(&f).as_deref(), Some(r#"{"n":1}"#));
        assert_eq!(router_input_key(&f).as_deref(), Some("client_roots"));
        let f = ask(
            vec![
                entry(STATE_META_KEY, "bare text"),
                entry(INPUT_KEY_META_KEY, "k1"),
            ],
            "hi",
        );
        assert_eq!(router_state(&f).as_deref(), Some(r#""bare text""#));
        assert_eq!(router_input_key(&f).as_deref(), Some("k1"));
        let mut out = Vec::new();
        write_client_request(&mut out, "mcp-broker-3", "roots/list", " {} ");
        assert_eq!(
            json_of(&out),
            json!({"jsonrpc":"2.0","id":"mcp-broker-3","method":"roots/list","params":{}})
        );
    }

    // ---- parse -----------------------------------------------------------

    #[test]
    fn requests_keep_their_id_text_verbatim() {
        let big = r#"{"jsonrpc":"2.0","id":123456789012345678901234567890,"method":"ping"}"#;
        let Message::Request { id, method, params } = one(big) else {
            panic!()
        };
        assert_eq!(id.get(), "123456789012345678901234567890");
        assert_eq!(method, "ping");
        assert!(params.is_none());
        let s = r#"{"params":{"a":1},"method":"tools/call","id":"x\"y\u0041","jsonrpc":"2.0"}"#;
        let Message::Request { id, params, .. } = one(s) else {
            panic!()
        };
        assert_eq!(id.get(), r#""x\"y\u0041""#);
        assert_eq!(params.unwrap().get(), r#"{"a":1}"#);
        let mut out = Vec::new();
        write_error(&mut out, Some(&id), -32601, "nope", None);
        assert_eq!(
            json_of(&out),
            json!({"jsonrpc":"2.0","id":"x\"yA","error":{"code":-32601,"message":"nope"}})
        );
    }

    #[test]
    fn escaped_method_names_are_unescaped() {
        let Message::Request { method, .. } =
            one(r#"{"jsonrpc":"2.0","id":1,"method":"tools\/c\u0061ll"}"#)
        else {
            panic!()
        };
        assert_eq!(Method::from_name(&method), Some(Method::CallTool));
    }

    #[test]
    fn notifications_and_client_responses_are_told_apart() {
        assert!(matches!(
            one(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#),
            Message::Notification { method, params: None } if method == "notifications/initialized"
        ));
        let Message::Response { id, result, error } =
            one(r#"{"jsonrpc":"2.0","id":"e1","result":{"action":"decline"}}"#)
        else {
            panic!()
        };
        assert_eq!(id.get(), "\"e1\"");
        assert_eq!(result.unwrap().get(), r#"{"action":"decline"}"#);
        assert!(error.is_none());
        assert!(matches!(
            one(r#"{"jsonrpc":"2.0","id":3,"error":{"code":-1,"message":"no"}}"#),
            Message::Response {
                result: None,
                error: Some(_),
                ..
            }
        ));
    }

    #[test]
    fn malformed_json_is_a_parse_error_with_a_null_id() {
        for bad in [
            &b"{"[..],
            b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"",
            b"not json",
            b"{\"a\":1} trailing",
            b"[{\"jsonrpc\":\"2.0\"},",
            b"\xff\xfe",
        ] {
            let e = parse(bad).unwrap_err();
            assert_eq!(e.code, -32700, "{}", String::from_utf8_lossy(bad));
            assert!(e.id.is_none());
            let mut out = Vec::new();
            e.write(&mut out);
            assert_eq!(json_of(&out)["id"], Value::Null);
        }
    }

    #[test]
    fn valid_json_that_is_not_json_rpc_is_an_invalid_request() {
        let e = err(r#"{"jsonrpc":"1.0","id":5,"method":"ping"}"#);
        assert_eq!((e.code, e.id.map(|i| i.get())), (-32600, Some("5")));
        let e = err(r#"{"id":"a","method":"ping"}"#);
        assert_eq!((e.code, e.id.map(|i| i.get())), (-32600, Some("\"a\"")));
        for bad in [
            r#"{"jsonrpc":"2.0","id":{"a":1},"method":"ping"}"#,
            r#"{"jsonrpc":"2.0","id":true,"method":"ping"}"#,
            r#"{"jsonrpc":"2.0","id":null,"method":"ping"}"#,
            r#"{"jsonrpc":"2.0","id":[1],"method":"ping"}"#,
        ] {
            let e = err(bad);
            assert_eq!((e.code, e.id), (-32600, None), "{bad}");
            assert!(e.message.contains("id"), "{}", e.message);
        }
        for (bad, what) in [
            (r#"{"jsonrpc":"2.0","id":1}"#, "neither"),
            (r#"{"jsonrpc":"2.0","id":1,"method":7}"#, "method"),
            (
                r#"{"jsonrpc":"2.0","id":1,"method":"ping","params":"x"}"#,
                "params",
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"method":"ping","params":3}"#,
                "params",
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"result":{},"error":{}}"#,
                "neither",
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"id":2,"method":"ping"}"#,
                "duplicate",
            ),
            ("42", "invalid type"),
            ("\"s\"", "invalid type"),
        ] {
            let e = err(bad);
            assert_eq!(e.code, -32600, "{bad}");
            assert!(e.message.contains(what), "{bad}: {}", e.message);
        }
        // `params: null` is no params.
        assert!(matches!(
            one(r#"{"jsonrpc":"2.0","id":1,"method":"ping","params":null}"#),
            Message::Request { params: None, .. }
        ));
    }

    #[test]
    fn a_batch_answers_each_member_on_its_own() {
        assert_eq!(err("[]").code, -32600);
        assert_eq!(err(" [ ] ").code, -32600);
        let body = r#"[{"jsonrpc":"2.0","id":1,"method":"ping"},
                      {"jsonrpc":"2.0","id":{},"method":"ping"},
                      5,
                      {"jsonrpc":"2.0","method":"notifications/initialized"},
                      {"jsonrpc":"2.1","id":"z","method":"ping"}]"#;
        let Ok(Body::Batch(ms)) = parse(body.as_bytes()) else {
            panic!()
        };
        assert_eq!(ms.len(), 5);
        assert!(matches!(&ms[0], Ok(Message::Request { id, .. }) if id.get() == "1"));
        assert!(matches!(&ms[1], Err(e) if e.code == -32600 && e.id.is_none()));
        assert!(matches!(&ms[2], Err(e) if e.code == -32600));
        assert!(matches!(&ms[3], Ok(Message::Notification { .. })));
        assert!(
            matches!(&ms[4], Err(e) if e.code == -32600 && e.id.map(|i| i.get()) == Some("\"z\""))
        );
    }

    #[test]
    fn method_names_round_trip() {
        for m in Method::ALL {
            assert_eq!(Method::from_name(m.name()), Some(m));
        }
        assert_eq!(Method::from_name("tools/lists"), None);
        let e = RpcError::method_not_found(None, "x/y");
        assert_eq!(
            (e.code, e.message.as_str()),
            (-32601, "Method not found: x/y")
        );
    }

    // ---- requests → frames -----------------------------------------------

    #[test]
    fn tool_call_arguments_arrive_as_the_raw_text_sent() {
        let params = r#"{"name":"echo","arguments":{"a": 1.50, "k\"ey\u00e9": "v\n", "big": 123456789012345678901234567890, "n": {"x": [1, "y"]}, "nul": null},"_meta":{"progressToken":"tok-1"}}"#;
        let (v, info) = build(Method::CallTool, Some(params), &[]).unwrap();
        let view = v.view();
        assert_eq!(view.kind(), RequestKind::CallTool);
        assert_eq!(view.route_key(), RouteKey::Tool("echo"));
        assert_eq!(view.session_id(), Some("sess-1"));
        assert_eq!(view.correlation_id(), Some("corr-1"));
        assert_eq!(view.timeout_ms(), Some(2500));
        let tc = view.tool_call().unwrap();
        assert_eq!(tc.id().0, [7; 16]);
        let args: Vec<(&str, Option<&str>)> = tc
            .arguments()
            .iter()
            .map(|kv| (kv.key(), kv.value()))
            .collect();
        assert_eq!(
            args,
            [
                ("a", Some("1.50")),
                ("k\"eyé", Some("\"v\\n\"")),
                ("big", Some("123456789012345678901234567890")),
                ("n", Some(r#"{"x": [1, "y"]}"#)),
                ("nul", Some("null")),
            ]
        );
        assert_eq!(info.method, Method::CallTool);
        assert_eq!(info.tool_name.as_deref(), Some("echo"));
        assert_eq!(info.progress_token.map(RawValue::get), Some("\"tok-1\""));
        // The router gets them as one object, exactly.
        let mut json = Vec::new();
        mcp_schema::write_arguments_json_checked(Some(tc.arguments()), &mut json).unwrap();
        let got: Value = serde_json::from_slice(&json).unwrap();
        assert_eq!(got["k\"eyé"], "v\n");
    }

    #[test]
    fn an_escaped_tool_name_is_the_name_it_spells() {
        let (v, info) = build(Method::CallTool, Some(r#"{"name":"p\u0075t"}"#), &[]).unwrap();
        assert_eq!(v.view().route_key(), RouteKey::Tool("put"));
        assert_eq!(info.tool_name.as_deref(), Some("put"));
        assert_eq!(v.view().tool_call().unwrap().arguments().len(), 0);
        // A numeric progress token is kept as written.
        let (_, info) = build(
            Method::CallTool,
            Some(r#"{"name":"x","_meta":{"progressToken":12345678901234567890123}}"#),
            &[],
        )
        .unwrap();
        assert_eq!(
            info.progress_token.map(RawValue::get),
            Some("12345678901234567890123")
        );
    }

    #[test]
    fn bad_tool_call_params_are_refused_naming_what_is_wrong() {
        for (params, what) in [
            (r#"{"arguments":{}}"#, "`name` is required"),
            (r#"{"name":5}"#, "`name` must be a string"),
            (r#"{"name":""}"#, "`name` must not be empty"),
            (
                r#"{"name":"x","arguments":[1,2]}"#,
                "`arguments` must be an object",
            ),
            (
                r#"{"name":"x","arguments":"{}"}"#,
                "`arguments` must be an object",
            ),
            (
                r#"{"name":"x","_meta":{"progressToken":{}}}"#,
                "progressToken",
            ),
            (r#"{"name":"x","_meta":[]}"#, "`_meta` must be an object"),
            (r#"[1]"#, "params must be an object"),
            (r#"{"name":"x","name":"y"}"#, "duplicate"),
        ] {
            let e = refused(Method::CallTool, params);
            assert_eq!(e.code, -32602, "{params}");
            assert!(e.message.contains(what), "{params}: {}", e.message);
            assert!(e.id.is_none());
        }
        let e = build(Method::CallTool, None, &[]).unwrap_err();
        assert!(e.message.contains("`name` is required"));
    }

    #[test]
    fn the_elicitation_answer_rides_as_an_extra_argument_that_clients_cannot_forge() {
        let answer = r#"{"action":"accept","content":{"age":3}}"#;
        let (v, _) = build(
            Method::CallTool,
            Some(r#"{"name":"t","arguments":{"a":1}}"#),
            &[("_elicitation", answer)],
        )
        .unwrap();
        let tc = v.view().tool_call().unwrap();
        let args: Vec<_> = tc
            .arguments()
            .iter()
            .map(|kv| (kv.key(), kv.value()))
            .collect();
        assert_eq!(args, [("a", Some("1")), ("_elicitation", Some(answer))]);
        let mut enc = RequestEncoder::new();
        let p = raw(r#"{"name":"t","arguments":{"_elicitation":{"action":"accept"}}}"#);
        let e = request_frame(
            &mut enc,
            &header(),
            Method::CallTool,
            Some(p),
            &[("_elicitation", answer)],
        )
        .unwrap_err();
        assert_eq!(e.code, -32602);
        assert!(e.message.contains("_elicitation"));
        // Refused on a first call too: the answer cannot be forged.
        let e = request_frame(&mut enc, &header(), Method::CallTool, Some(p), &[]).unwrap_err();
        assert_eq!(e.code, -32602);
        // The router's state likewise.
        let p = raw(r#"{"name":"t","arguments":{"_request_state":{"step":9}}}"#);
        let e = request_frame(&mut enc, &header(), Method::CallTool, Some(p), &[]).unwrap_err();
        assert!(
            e.message.contains("`_request_state` is reserved"),
            "{}",
            e.message
        );
        let p = raw(r#"{"name":"t","arguments":{"_roots":{"roots":[]}}}"#);
        let e = request_frame(&mut enc, &header(), Method::CallTool, Some(p), &[]).unwrap_err();
        assert!(e.message.contains("`_roots` is reserved"), "{}", e.message);
    }

    #[test]
    fn initialize_reads_version_elicitation_and_client() {
        let p = r#"{"protocolVersion":"2025-11-25","capabilities":{"elicitation":{}},"clientInfo":{"name":"cli","version":"1.2"}}"#;
        let (v, info) = build(Method::Initialize, Some(p), &[]).unwrap();
        assert_eq!(v.view().kind(), RequestKind::Initialize);
        let init = v.view().request().payload_as_initialize_request().unwrap();
        let caps = init.client_capabilities();
        assert_eq!(caps.protocol_version(), p::ProtocolVersion::V2025_06_18);
        assert_eq!(caps.client_name(), Some("cli"));
        assert_eq!(caps.client_version(), Some("1.2"));
        assert_eq!(info.protocol_version.as_deref(), Some("2025-11-25"));
        assert!(info.client_elicitation);
        let (_, info) = build(
            Method::Initialize,
            Some(r#"{"protocolVersion":"2024-11-05","capabilities":{}}"#),
            &[],
        )
        .unwrap();
        assert!(!info.client_elicitation);
        for (caps, form) in [
            (r#"{"elicitation":{"form":{}}}"#, true),
            (r#"{"elicitation":{"form":{},"url":{}}}"#, true),
            (r#"{"elicitation":{"url":{}}}"#, false),
            (r#"{"elicitation":null}"#, false),
            (r#"{"elicitation":true}"#, false),
        ] {
            let p = format!(r#"{{"protocolVersion":"2025-11-25","capabilities":{caps}}}"#);
            let (_, info) = build(Method::Initialize, Some(&p), &[]).unwrap();
            assert_eq!(info.client_elicitation, form, "{caps}");
        }
        let e = refused(Method::Initialize, r#"{"capabilities":{}}"#);
        assert!(e.message.contains("protocolVersion"), "{}", e.message);
        let e = refused(
            Method::Initialize,
            r#"{"protocolVersion":"2025-06-18","capabilities":1}"#,
        );
        assert!(e.message.contains("capabilities"), "{}", e.message);
        assert_eq!(frame_version("2025-03-26"), p::ProtocolVersion::V2025_01_01);
        assert_eq!(frame_version("1999-01-01"), p::ProtocolVersion::Unspecified);
    }

    #[test]
    fn listings_carry_their_cursor_and_refuse_a_bad_one() {
        for (m, kind) in [
            (Method::ListTools, RequestKind::ListTools),
            (Method::ListResources, RequestKind::ListResources),
            (
                Method::ListResourceTemplates,
                RequestKind::ListResourceTemplates,
            ),
            (Method::ListPrompts, RequestKind::ListPrompts),
        ] {
            let (v, _) = build(m, Some(r#"{"cursor":"o100"}"#), &[]).unwrap();
            assert_eq!(v.view().kind(), kind);
            let (v, _) = build(m, None, &[]).unwrap();
            assert_eq!(v.view().kind(), kind);
            let e = refused(m, r#"{"cursor":100}"#);
            assert!(
                e.message.contains("`cursor` must be a string"),
                "{}",
                e.message
            );
        }
        let (v, _) = build(Method::ListTools, Some(r#"{"cursor":"o100"}"#), &[]).unwrap();
        let r = v.view().request().payload_as_list_tools_request().unwrap();
        assert_eq!(r.cursor(), Some("o100"));
        let (v, _) = build(Method::Ping, Some(r#"{"_meta":{}}"#), &[]).unwrap();
        assert_eq!(v.view().kind(), RequestKind::Ping);
    }

    #[test]
    fn resource_requests_carry_their_uri() {
        let (v, info) = build(Method::ReadResource, Some(r#"{"uri":"file:///a b"}"#), &[]).unwrap();
        assert_eq!(v.view().route_key(), RouteKey::Resource("file:///a b"));
        assert_eq!(info.uri.as_deref(), Some("file:///a b"));
        let (v, _) = build(Method::Subscribe, Some(r#"{"uri":"u:1"}"#), &[]).unwrap();
        assert_eq!(v.view().kind(), RequestKind::Subscribe);
        let (v, _) = build(Method::Unsubscribe, Some(r#"{"uri":"u:1"}"#), &[]).unwrap();
        assert_eq!(v.view().kind(), RequestKind::Unsubscribe);
        let e = refused(Method::ReadResource, r#"{"name":"x"}"#);
        assert!(e.message.contains("`uri` is required"));
    }

    #[test]
    fn prompt_arguments_arrive_raw_and_fill_as_their_string_value() {
        let (v, _) = build(
            Method::GetPrompt,
            Some(r#"{"name":"greet","arguments":{"who":"Ada \"L\"","n":"3"}}"#),
            &[],
        )
        .unwrap();
        assert_eq!(v.view().route_key(), RouteKey::Prompt("greet"));
        let pr = v.view().request().payload_as_prompt_request().unwrap();
        let args: Vec<(&str, &str)> = pr
            .arguments()
            .iter()
            .flatten()
            .map(|kv| (kv.key(), kv.value().unwrap_or("null")))
            .collect();
        assert_eq!(args, [("who", r#""Ada \"L\"""#), ("n", r#""3""#)]);
        // What dispatch does with them: JSON strings fill unquoted.
        let mut budget = 1 << 20;
        let filled = adapt::fill_placeholders(
            "Hi {{who}} x{{n}}",
            &adapt::PromptArgs::new(&args),
            &mut budget,
        )
        .unwrap();
        assert_eq!(filled, "Hi Ada \"L\" x3");
        let e = refused(Method::GetPrompt, r#"{"name":"g","arguments":["a"]}"#);
        assert!(e.message.contains("`arguments` must be an object"));
        for bad in ["1", "null", "{}", "[\"a\"]", "true"] {
            let params = format!(r#"{{"name":"g","arguments":{{"a":"x","n":{bad}}}}}"#);
            let e = refused(Method::GetPrompt, &params);
            assert_eq!(e.code, code::INVALID_PARAMS, "{bad}");
            assert!(
                e.message.contains("prompt argument `n` must be a string"),
                "{bad}: {}",
                e.message
            );
        }
    }

    #[test]
    fn completions_name_their_reference_and_argument() {
        let (v, _) = build(
            Method::Complete,
            Some(r#"{"ref":{"type":"ref/prompt","name":"greet"},"argument":{"name":"who","value":"A"},"context":{"arguments":{}}}"#),
            &[],
        )
        .unwrap();
        let c = v.view().request().payload_as_complete_request().unwrap();
        assert_eq!(
            (
                c.ref_kind(),
                c.ref_name(),
                c.argument_name(),
                c.argument_value()
            ),
            (p::CompletionRefKind::Prompt, "greet", "who", Some("A"))
        );
        let (v, _) = build(
            Method::Complete,
            Some(r#"{"ref":{"type":"ref/resource","uri":"db://{t}"},"argument":{"name":"t","value":""}}"#),
            &[],
        )
        .unwrap();
        let c = v.view().request().payload_as_complete_request().unwrap();
        assert_eq!(
            (c.ref_kind(), c.ref_name()),
            (p::CompletionRefKind::Resource, "db://{t}")
        );
        for (params, what) in [
            (
                r#"{"ref":{"type":"ref/tool","name":"x"},"argument":{"name":"a"}}"#,
                "ref.type",
            ),
            (
                r#"{"ref":{"type":"ref/prompt"},"argument":{"name":"a"}}"#,
                "ref.name",
            ),
            (
                r#"{"ref":{"type":"ref/prompt","name":"p"}}"#,
                "argument.name",
            ),
            (
                r#"{"ref":{"type":"ref/prompt","name":"p"},"argument":{"name":"a","value":1}}"#,
                "argument.value",
            ),
        ] {
            let e = refused(Method::Complete, params);
            assert!(e.message.contains(what), "{params}: {}", e.message);
        }
    }

    #[test]
    fn log_levels_are_validated_and_mapped_to_the_wire() {
        let (v, info) = build(Method::SetLevel, Some(r#"{"level":"notice"}"#), &[]).unwrap();
        let r = v
            .view()
            .request()
            .payload_as_set_log_level_request()
            .unwrap();
        assert_eq!(r.level(), p::LogLevel::Warning);
        assert_eq!(info.log_level, Some("notice"));
        for l in LOG_LEVELS {
            let params = format!(r#"{{"level":"{l}"}}"#);
            let (_, info) = build(Method::SetLevel, Some(&params), &[]).unwrap();
            assert_eq!(info.log_level, Some(l));
        }
        let e = refused(Method::SetLevel, r#"{"level":"verbose"}"#);
        assert!(
            e.message.contains("unknown log level `verbose`"),
            "{}",
            e.message
        );
        let e = refused(Method::SetLevel, r#"{}"#);
        assert!(e.message.contains("`level` is required"));
    }

    // ---- frames → messages -----------------------------------------------

    fn ann() -> Option<w::Annotations> {
        Some(w::Annotations {
            audience: Some(vec![w::Role::User, w::Role::Assistant]),
            priority: Some(0.5),
            timestamp: Some("2025-01-01T00:00:00Z".into()),
        })
    }

    #[test]
    fn tool_results_carry_every_content_kind_structured_content_and_meta() {
        let r = w::Response::Completed(w::ToolResult {
            content: vec![
                w::ContentBlock::Text(w::TextContent {
                    text: "hé \"q\"\n".into(),
                    annotations: ann(),
                }),
                w::ContentBlock::Image(w::ImageContent {
                    data: "aW1n".into(),
                    mime_type: "image/png".into(),
                    annotations: None,
                }),
                w::ContentBlock::Audio(w::AudioContent {
                    data: "YXU=".into(),
                    mime_type: "audio/wav".into(),
                    annotations: None,
                }),
                w::ContentBlock::ResourceLink(w::ResourceLinkContent {
                    uri: "file:///x".into(),
                    title: Some("X".into()),
                    description: Some("d".into()),
                    mime_type: Some("text/plain".into()),
                    annotations: None,
                }),
                w::ContentBlock::EmbeddedResource(w::EmbeddedResource {
                    uri: "file:///t".into(),
                    title: None,
                    description: None,
                    mime_type: Some("text/plain".into()),
                    data: "body".into(),
                    annotations: None,
                }),
                w::ContentBlock::EmbeddedResource(w::EmbeddedResource {
                    uri: "file:///b".into(),
                    title: None,
                    description: None,
                    mime_type: Some("application/octet-stream".into()),
                    data: "AAE=".into(),
                    annotations: None,
                }),
            ],
            structured_content: Some(r#" {"n": 1.50, "s": "x"} "#.into()),
            progress: Some(vec![
                w::ProgressNotification {
                    progress: Some(0.25),
                    message: Some("a quarter".into()),
                    annotations: None,
                },
                w::ProgressNotification {
                    progress: None,
                    message: None,
                    annotations: None,
                },
            ]),
            meta: Some(vec![
                w::MetaEntry {
                    key: "k\"1".into(),
                    value: r#"{"a":[1]}"#.into(),
                },
                w::MetaEntry {
                    key: "k2".into(),
                    value: "not json".into(),
                },
            ]),
            is_error: None,
        });
        let buf = tool_frames(&r);
        let fs = frames(&buf);
        assert_eq!(fs.len(), 3);
        assert_eq!(frame_kind(fs[0]), FrameKind::Progress);
        assert_eq!(frame_kind(fs[1]), FrameKind::Progress);
        assert_eq!(frame_kind(fs[2]), FrameKind::Final);
        let mut out = Vec::new();
        assert!(write_progress(&mut out, raw("\"tok\""), fs[0]));
        assert_eq!(
            json_of(&out),
            json!({"jsonrpc":"2.0","method":"notifications/progress",
                   "params":{"progressToken":"tok","progress":0.25,"total":1,"message":"a quarter"}})
        );
        out.clear();
        assert!(write_progress(&mut out, raw("17"), fs[1]));
        assert_eq!(
            json_of(&out)["params"],
            json!({"progressToken":17,"progress":1,"total":1})
        );
        assert!(!write_progress(&mut out, raw("1"), fs[2]));
        // Live progress keeps the router's value and total, and has no
        // total when it had none (not "3 of 1").
        let mut enc = ResponseEncoder::new(1);
        let id = UUID::new(&[7; 16]);
        for (mcp, want) in [
            (Some((3.0, None)), json!({"progressToken":1,"progress":3})),
            (
                Some((3.0, Some(8.0))),
                json!({"progressToken":1,"progress":3,"total":8}),
            ),
            (None, json!({"progressToken":1,"progress":0.5,"total":1})),
        ] {
            let f = adapt::progress_frame(&mut enc, &TO, &id, 0.5, None, 1, 0, mcp).to_vec();
            out.clear();
            assert!(write_progress(&mut out, raw("1"), &f));
            assert_eq!(json_of(&out)["params"], want, "{mcp:?}");
        }
        let v = response("\"r1\"", Method::CallTool, fs[2]);
        assert_eq!(
            v,
            json!({"jsonrpc":"2.0","id":"r1","result":{
                "content":[
                    {"type":"text","text":"hé \"q\"\n","annotations":{"audience":["user","assistant"],"priority":0.5,"lastModified":"2025-01-01T00:00:00Z"}},
                    {"type":"image","data":"aW1n","mimeType":"image/png"},
                    {"type":"audio","data":"YXU=","mimeType":"audio/wav"},
                    {"type":"resource_link","uri":"file:///x","name":"X","title":"X","description":"d","mimeType":"text/plain"},
                    {"type":"resource","resource":{"uri":"file:///t","mimeType":"text/plain","text":"body"}},
                    {"type":"resource","resource":{"uri":"file:///b","mimeType":"application/octet-stream","blob":"AAE="}}
                ],
                "structuredContent":{"n":1.50,"s":"x"},
                "isError":false,
                "_meta":{"k\"1":{"a":[1]},"k2":"not json"}
            }})
        );
    }

    /// 2026-07-28 results name the broker first in `_meta`, beside the
    /// router's entries; a router's own entry under that key gives way (a
    /// duplicate key would leave which one a client reads to its parser).
    #[test]
    fn modern_results_name_the_server_in_meta_beside_the_routers_entries() {
        let meta = |entries: &[(&str, &str)]| {
            let r = w::Response::Completed(w::ToolResult {
                content: vec![text("t")],
                structured_content: None,
                progress: None,
                meta: (!entries.is_empty()).then(|| {
                    entries
                        .iter()
                        .map(|(k, v)| w::MetaEntry {
                            key: (*k).into(),
                            value: (*v).into(),
                        })
                        .collect()
                }),
                is_error: None,
            });
            let buf = tool_frames(&r);
            let fin = *frames(&buf).last().unwrap();
            let mut out = Vec::new();
            write_response(
                &mut out,
                &Id(raw("1")),
                Method::CallTool,
                fin,
                MODERN_VERSION,
            );
            let text = String::from_utf8(out).unwrap();
            let first = text.find("\"_meta\":").expect(&text);
            assert!(
                text[first + 1..].find("\"_meta\":").is_none(),
                "one `_meta`: {text}"
            );
            json_of(text.as_bytes())["result"]["_meta"].clone()
        };
        let info = json!({"name":"mcp-broker","version":env!("CARGO_PKG_VERSION")});
        assert_eq!(
            meta(&[]),
            json!({"io.modelcontextprotocol/serverInfo":info})
        );
        assert_eq!(
            meta(&[("k", "[1]"), ("mcp-broker/state", "{}")]),
            json!({"io.modelcontextprotocol/serverInfo":info,"k":[1]})
        );
        assert_eq!(
            meta(&[
                ("io.modelcontextprotocol/serverInfo", r#"{"name":"other"}"#),
                ("k", "2")
            ]),
            json!({"io.modelcontextprotocol/serverInfo":info,"k":2})
        );
        // Every other kind of result gets it too, and the session era none.
        let mut enc = ResponseEncoder::new(1);
        let empty = enc.empty(&TO).to_vec();
        assert_eq!(
            response_in(MODERN_VERSION, "1", Method::Ping, &empty)["result"],
            json!({"_meta":{"io.modelcontextprotocol/serverInfo":info}})
        );
        assert_eq!(response("1", Method::Ping, &empty)["result"], json!({}));
        // A tool's failure, a result there too.
        let f = enc
            .error(&TO, ErrorCode::ExecutionError, "m", None)
            .to_vec();
        assert_eq!(
            response_in(MODERN_VERSION, "1", Method::CallTool, &f)["result"]["_meta"],
            json!({"io.modelcontextprotocol/serverInfo":info})
        );
        // Errors are no results; a router fault is -32603 there, not -32002.
        let f = enc.error(&TO, ErrorCode::RouterFault, "m", None).to_vec();
        for m in [Method::CallTool, Method::ReadResource, Method::ListTools] {
            assert_eq!(
                response_in(MODERN_VERSION, "1", m, &f)["error"],
                json!({"code":-32603,"message":"m","data":{"kind":"router_fault","retryable":true}}),
                "{m:?}"
            );
        }
    }

    #[test]
    fn structured_content_that_is_not_an_object_goes_out_as_text_only_without_content() {
        for bad in ["[1,2]", "{\"a\":", "1,\"admin\":true"] {
            let v = response(
                "1",
                Method::CallTool,
                &tool_frames(&completed(vec![text("t")], Some(bad))),
            );
            let r = &v["result"];
            assert!(r.get("structuredContent").is_none(), "{bad}: {r}");
            // The router's own text is not repeated.
            assert_eq!(r["content"], json!([{"type":"text","text":"t"}]), "{bad}");
            let v = response(
                "1",
                Method::CallTool,
                &tool_frames(&completed(vec![], Some(bad))),
            );
            assert_eq!(v["result"]["content"], json!([{"type":"text","text":bad}]));
        }
        // No content: the structured content is also the text block.
        let v = response(
            "1",
            Method::CallTool,
            &tool_frames(&completed(vec![], Some(r#"{"a":1}"#))),
        );
        assert_eq!(
            v["result"],
            json!({"content":[{"type":"text","text":"{\"a\":1}"}],"structuredContent":{"a":1},"isError":false})
        );
    }

    #[test]
    fn a_tool_failure_stays_a_result_with_is_error() {
        let r = w::Response::Completed(w::ToolResult {
            content: vec![text("boom")],
            structured_content: None,
            progress: None,
            meta: None,
            is_error: Some(true),
        });
        let v = response("2", Method::CallTool, &tool_frames(&r));
        assert_eq!(
            v["result"],
            json!({"content":[{"type":"text","text":"boom"}],"isError":true})
        );
        // A router's execution-error, as adapt reports it.
        let mut enc = ResponseEncoder::new(1);
        let mut out = Vec::new();
        let e = crate::wasm::CallError::Tool(w::ToolError::ExecutionError("disk full".into()));
        adapt::call_error(&mut enc, &mut out, &TO, Some(&UUID::new(&[1; 16])), &e);
        let v = response("2", Method::CallTool, &out);
        assert_eq!(
            v["result"],
            json!({"content":[{"type":"text","text":"disk full"}],"isError":true})
        );
        // The same code as an error frame on tools/call is a result too.
        let v = response(
            "2",
            Method::CallTool,
            enc.error(&TO, ErrorCode::ExecutionError, "bad", None),
        );
        assert_eq!(v["result"]["isError"], true);
        assert_eq!(v["result"]["content"][0]["text"], "bad");
    }

    #[test]
    fn errors_map_per_method_as_mcp_defines_them() {
        let mut enc = ResponseEncoder::new(1);
        let nf = enc
            .error(&TO, ErrorCode::NotFound, "unknown tool `x`", None)
            .to_vec();
        // With the request's tool name: MCP's wording.
        let (_, info) = build(Method::CallTool, Some(r#"{"name":"no\"pe"}"#), &[]).unwrap();
        let mut out = Vec::new();
        write_response_for(&mut out, &Id(raw("4")), &info, &nf, "2025-06-18");
        assert_eq!(
            json_of(&out),
            json!({"jsonrpc":"2.0","id":4,"error":{"code":-32602,"message":"Unknown tool: no\"pe"}})
        );
        let v = response("1", Method::CallTool, &nf);
        assert_eq!(
            v["error"],
            json!({"code":-32602,"message":"unknown tool `x`"})
        );
        assert_eq!(
            response("1", Method::GetPrompt, &nf)["error"]["code"],
            -32602
        );
        assert_eq!(
            response("1", Method::Complete, &nf)["error"]["code"],
            -32602
        );
        assert_eq!(
            response("1", Method::ListTools, &nf)["error"]["code"],
            -32601
        );
        // resources/read: -32002 with the URI the request named.
        let (_, info) = build(
            Method::ReadResource,
            Some(r#"{"uri":"file:///gone\"x"}"#),
            &[],
        )
        .unwrap();
        let mut out = Vec::new();
        write_response_for(&mut out, &Id(raw("9")), &info, &nf, "2025-06-18");
        assert_eq!(
            json_of(&out)["error"],
            json!({"code":-32002,"message":"unknown tool `x`","data":{"uri":"file:///gone\"x"}})
        );
        let bad_cursor = enc
            .error(&TO, ErrorCode::InvalidParams, "invalid cursor", None)
            .to_vec();
        assert_eq!(
            response("1", Method::ListTools, &bad_cursor)["error"],
            json!({"code":-32602,"message":"invalid cursor"})
        );
        for (c, kind, retry) in [
            (ErrorCode::Overloaded, "overloaded", true),
            (ErrorCode::DeadlineExceeded, "deadline_exceeded", true),
            (ErrorCode::RouterFault, "router_fault", true),
            (ErrorCode::ShuttingDown, "shutting_down", true),
            (ErrorCode::Unauthorized, "unauthorized", false),
            (ErrorCode::Internal, "internal", false),
        ] {
            let f = enc.error(&TO, c, "m", None).to_vec();
            for m in [Method::CallTool, Method::ReadResource, Method::ListTools] {
                assert_eq!(
                    response("1", m, &f)["error"],
                    json!({"code":c.code(),"message":"m","data":{"kind":kind,"retryable":retry}}),
                    "{c:?} {m:?}"
                );
            }
        }
        let f = enc
            .error(&TO, ErrorCode::ParseError, "bad frame", None)
            .to_vec();
        assert_eq!(response("1", Method::Ping, &f)["error"]["code"], -32603);
        // The frame's own data: raw if it is one JSON value, else a string.
        let f = enc
            .error(&TO, ErrorCode::InvalidParams, "m", Some(r#"{"field":"a"}"#))
            .to_vec();
        assert_eq!(
            response("1", Method::GetPrompt, &f)["error"]["data"],
            json!({"field":"a"})
        );
        // On a tool call, a refusal of the arguments is the tool's result.
        assert_eq!(
            response("1", Method::CallTool, &f)["result"],
            json!({"content":[{"type":"text","text":"m"}],"isError":true})
        );
        let f = enc
            .error(&TO, ErrorCode::InvalidParams, "m", Some("1,\"x\":2"))
            .to_vec();
        assert_eq!(
            response("1", Method::GetPrompt, &f)["error"]["data"],
            json!("1,\"x\":2")
        );
        // An unreadable frame is the broker's fault.
        let v = response("1", Method::CallTool, b"\x08\0\0\0garbage!");
        assert_eq!(v["error"]["code"], -32603);
        assert_eq!(frame_kind(b"\x08\0\0\0garbage!"), FrameKind::Final);
    }

    fn tool(name: &str, schema: &str, out: Option<&str>) -> Listed<w::Tool> {
        Listed {
            router: 0,
            exposed: name.into(),
            item: w::Tool {
                name: name.into(),
                title: Some("T".into()),
                description: "does \"x\"".into(),
                input_schema: schema.into(),
                output_schema: out.map(Into::into),
                annotations: Some(w::ToolAnnotations {
                    read_only: Some(true),
                    destructive: None,
                    streaming: Some(true),
                    experimental: None,
                }),
                meta: None,
            },
        }
    }

    #[test]
    fn tool_listings_keep_good_schemas_replace_broken_ones_and_page() {
        let mut all = vec![
            tool(
                "a",
                r#"{"type":"object","properties":{"x":{"type":"number"}}}"#,
                Some(r#"{"type":"object"}"#),
            ),
            tool("b", "{broken", Some("[]")),
        ];
        let mut enc = ResponseEncoder::new(1);
        let mut out = Vec::new();
        adapt::list_tools(&mut enc, &mut out, &TO, &all, FIRST_PAGE);
        let v = response("1", Method::ListTools, &out);
        assert_eq!(
            v["result"],
            json!({"tools":[
                {"name":"a","title":"T","description":"does \"x\"",
                 "inputSchema":{"type":"object","properties":{"x":{"type":"number"}}},
                 "outputSchema":{"type":"object"},"annotations":{"readOnlyHint":true}},
                {"name":"b","title":"T","description":"does \"x\"",
                 "inputSchema":{"type":"object"},"annotations":{"readOnlyHint":true}}
            ]})
        );
        all = (0..150)
            .map(|i| tool(&format!("t{i}"), "{}", None))
            .collect();
        out.clear();
        adapt::list_tools(&mut enc, &mut out, &TO, &all, FIRST_PAGE);
        let v = response("1", Method::ListTools, &out);
        assert_eq!(v["result"]["tools"].as_array().unwrap().len(), 100);
        assert_eq!(v["result"]["nextCursor"], "o100.1");
    }

    fn resource(uri: &str) -> Listed<w::McpResource> {
        Listed {
            router: 0,
            exposed: uri.into(),
            item: w::McpResource {
                uri: uri.into(),
                name: "R".into(),
                title: None,
                description: Some("d".into()),
                mime_type: "text/plain".into(),
                annotations: ann(),
            },
        }
    }

    #[test]
    fn resource_and_template_listings_are_mcp_shaped() {
        let mut enc = ResponseEncoder::new(1);
        let mut out = Vec::new();
        adapt::list_resources(
            &mut enc,
            &mut out,
            &TO,
            &[resource("file:///a")],
            FIRST_PAGE,
        );
        assert_eq!(
            response("1", Method::ListResources, &out)["result"],
            json!({"resources":[{"uri":"file:///a","name":"R","description":"d","mimeType":"text/plain",
                "annotations":{"audience":["user","assistant"],"priority":0.5,"lastModified":"2025-01-01T00:00:00Z"}}]})
        );
        out.clear();
        adapt::list_templates(&mut enc, &mut out, &TO, &[resource("db://{t}")], FIRST_PAGE);
        let v = response("1", Method::ListResourceTemplates, &out);
        assert_eq!(
            v["result"]["resourceTemplates"][0]["uriTemplate"],
            "db://{t}"
        );
        assert_eq!(v["result"]["resourceTemplates"][0]["name"], "R");
        assert!(v["result"].get("nextCursor").is_none());
    }

    #[test]
    fn prompt_listings_and_applied_prompts_are_mcp_shaped() {
        let pr = Listed {
            router: 0,
            exposed: "greet".into(),
            item: w::Prompt {
                name: "greet".into(),
                description: Some("says hi".into()),
                arguments: Some(vec![w::PromptArgument {
                    name: "who".into(),
                    description: None,
                    required: Some(true),
                }]),
            },
        };
        let mut enc = ResponseEncoder::new(1);
        let mut out = Vec::new();
        adapt::list_prompts(&mut enc, &mut out, &TO, &[pr], FIRST_PAGE);
        assert_eq!(
            response("1", Method::ListPrompts, &out)["result"],
            json!({"prompts":[{"name":"greet","description":"says hi","arguments":[{"name":"who","required":true}]}]})
        );
        let got = w::GetPromptResult {
            description: Some("d".into()),
            messages: vec![
                w::PromptMessage {
                    role: w::PromptMessageRole::User,
                    content: w::PromptMessageContent::Text(w::TextContent {
                        text: "Hi {{who}}".into(),
                        annotations: None,
                    }),
                },
                w::PromptMessage {
                    role: w::PromptMessageRole::Assistant,
                    content: w::PromptMessageContent::Image(w::ImageContent {
                        data: "aW1n".into(),
                        mime_type: "image/png".into(),
                        annotations: None,
                    }),
                },
            ],
        };
        out.clear();
        adapt::prompt_response(
            &mut enc,
            &mut out,
            &TO,
            "greet",
            &got,
            &[("who", "\"Ada\"")],
            1 << 20,
        );
        assert_eq!(
            response("1", Method::GetPrompt, &out)["result"],
            json!({"description":"d","messages":[
                {"role":"user","content":{"type":"text","text":"Hi Ada"}},
                {"role":"assistant","content":{"type":"image","data":"aW1n","mimeType":"image/png"}}
            ]})
        );
    }

    #[test]
    fn resource_reads_list_every_contents() {
        let r = w::ReadResourceResult {
            contents: vec![
                w::ResourceContents::Text(w::TextResourceContents {
                    uri: "file:///a".into(),
                    mime_type: Some("text/plain".into()),
                    text: "hello".into(),
                }),
                w::ResourceContents::Blob(w::BlobResourceContents {
                    uri: "file:///a#2".into(),
                    mime_type: None,
                    blob: "AAE=".into(),
                }),
            ],
        };
        let mut enc = ResponseEncoder::new(1);
        let mut out = Vec::new();
        adapt::resource_response(&mut enc, &mut out, &TO, "file:///a", &r, None);
        assert_eq!(
            response("1", Method::ReadResource, &out)["result"],
            json!({"contents":[
                {"uri":"file:///a","mimeType":"text/plain","text":"hello"},
                {"uri":"file:///a#2","blob":"AAE="}
            ]})
        );
    }

    #[test]
    fn completions_are_capped_at_a_hundred_values() {
        let mut enc = ResponseEncoder::new(1);
        let mut out = Vec::new();
        let r = w::CompletionResponse {
            content: vec![text("alpha"), text("al\"t")],
            meta: None,
            is_error: None,
        };
        adapt::complete_response(&mut enc, &mut out, &TO, &r);
        assert_eq!(
            response("1", Method::Complete, &out)["result"],
            json!({"completion":{"values":["alpha","al\"t"],"total":2,"hasMore":false}})
        );
        let r = w::CompletionResponse {
            content: (0..150).map(|i| text(&format!("v{i}"))).collect(),
            meta: None,
            is_error: None,
        };
        out.clear();
        adapt::complete_response(&mut enc, &mut out, &TO, &r);
        let v = response("1", Method::Complete, &out);
        assert_eq!(
            v["result"]["completion"]["values"]
                .as_array()
                .unwrap()
                .len(),
            100
        );
        assert_eq!(v["result"]["completion"]["total"], 150);
        assert_eq!(v["result"]["completion"]["hasMore"], true);
    }

    #[test]
    fn initialize_answers_with_the_negotiated_version_and_capabilities() {
        let mut enc = ResponseEncoder::new(1);
        let fbb = enc.begin();
        let name = fbb.create_string("mcp-broker");
        let ver = fbb.create_string("0.1.0");
        let caps = p::ServerCapabilities::create(
            fbb,
            &p::ServerCapabilitiesArgs {
                supports_tools: true,
                supports_resources: true,
                supports_prompts: false,
                supports_logging: true,
                supports_completions: true,
                supports_resource_subscribe: true,
                protocol_version: p::ProtocolVersion::V2025_06_18,
                server_name: Some(name),
                server_version: Some(ver),
                ..Default::default()
            },
        );
        let instructions = fbb.create_string("use \"echo\"");
        let r = p::InitializeResponse::create(
            fbb,
            &p::InitializeResponseArgs {
                server_capabilities: Some(caps),
                server_info: None,
                instructions: Some(instructions),
            },
        );
        let f = enc
            .finish(
                &TO,
                p::ResponsePayload::InitializeResponse,
                r.as_union_value(),
                true,
            )
            .to_vec();
        let mut out = Vec::new();
        write_response(
            &mut out,
            &Id(raw("0")),
            Method::Initialize,
            &f,
            "2025-11-25",
        );
        assert_eq!(
            json_of(&out),
            json!({"jsonrpc":"2.0","id":0,"result":{
                "protocolVersion":"2025-11-25",
                "capabilities":{"tools":{"listChanged":false},"resources":{"subscribe":true,"listChanged":false},
                                "logging":{},"completions":{}},
                "serverInfo":{"name":"mcp-broker","version":"0.1.0"},
                "instructions":"use \"echo\""}})
        );
        assert_eq!(
            response("1", Method::Ping, enc.pong(&TO)),
            json!({"jsonrpc":"2.0","id":1,"result":{}})
        );
        assert_eq!(
            response("1", Method::SetLevel, enc.empty(&TO))["result"],
            json!({})
        );
    }

    #[test]
    fn log_and_resource_update_frames_become_notifications() {
        let mut enc = ResponseEncoder::new(1);
        let fbb = enc.begin();
        let message = fbb.create_string("disk \"low\"");
        let source = fbb.create_string("fs");
        let l = p::LogMessage::create(
            fbb,
            &p::LogMessageArgs {
                level: p::LogLevel::Warning,
                message: Some(message),
                timestamp: None,
                source: Some(source),
                metadata: None,
            },
        );
        let f = enc
            .finish(
                &TO,
                p::ResponsePayload::LogMessage,
                l.as_union_value(),
                true,
            )
            .to_vec();
        assert_eq!(frame_kind(&f), FrameKind::Log);
        // Spoilt below its root, a log frame is unreadable, and an
        // unreadable frame is final (it becomes an internal error), though
        // its payload type still reads as a log.
        let mut spoilt = f.clone();
        let at = spoilt.windows(4).position(|w| w == b"disk").unwrap();
        spoilt[at] = 0xff;
        assert_eq!(frame_kind(&spoilt), FrameKind::Final);
        let mut out = Vec::new();
        assert!(write_log(&mut out, &f));
        assert_eq!(
            json_of(&out),
            json!({"jsonrpc":"2.0","method":"notifications/message",
                   "params":{"level":"warning","logger":"fs","data":"disk \"low\""}})
        );
        let fbb = enc.begin();
        let uri = fbb.create_string("file:///a");
        let u = p::ResourceUpdatedNotification::create(
            fbb,
            &p::ResourceUpdatedNotificationArgs { uri: Some(uri) },
        );
        let f = enc
            .finish(
                &TO,
                p::ResponsePayload::ResourceUpdatedNotification,
                u.as_union_value(),
                true,
            )
            .to_vec();
        assert_eq!(frame_kind(&f), FrameKind::ResourceUpdated);
        out.clear();
        assert!(!write_log(&mut out, &f));
        assert!(write_resource_updated(&mut out, &f));
        assert_eq!(
            json_of(&out),
            json!({"jsonrpc":"2.0","method":"notifications/resources/updated","params":{"uri":"file:///a"}})
        );
    }

    #[test]
    fn an_elicitation_becomes_a_server_request_and_its_answer_an_argument() {
        let el = |schema: &str| {
            w::Response::Elicit(w::ElicitationRequest {
                title: None,
                message: "How old?".into(),
                schema: schema.into(),
                annotations: None,
                meta: None,
            })
        };
        let good =
            r#"{"type":"object","properties":{"age":{"type":"integer"}},"required":["age"]}"#;
        let f = tool_frames(&el(good));
        assert_eq!(frame_kind(&f), FrameKind::Elicitation);
        let mut out = Vec::new();
        assert!(write_elicitation_create(&mut out, "el-\"1", &f));
        assert_eq!(
            json_of(&out),
            json!({"jsonrpc":"2.0","id":"el-\"1","method":"elicitation/create",
                   "params":{"message":"How old?","requestedSchema":
                     {"type":"object","properties":{"age":{"type":"integer"}},"required":["age"]}}})
        );
        out.clear();
        assert!(write_elicitation_create(
            &mut out,
            "e2",
            &tool_frames(&el("[nope"))
        ));
        assert_eq!(
            json_of(&out)["params"]["requestedSchema"],
            json!({"type":"object","properties":{}})
        );
        // A client that cannot answer gets the question as an error result.
        let v = response("1", Method::CallTool, &f);
        assert_eq!(v["result"]["isError"], true);
        assert!(
            v["result"]["content"][0]["text"]
                .as_str()
                .unwrap()
                .contains("How old?")
        );
        out.clear();
        assert!(!write_elicitation_create(
            &mut out,
            "e3",
            &tool_frames(&completed(vec![], None))
        ));
        assert!(out.is_empty());

        let a = elicitation_answer(raw(
            r#"{"action":"accept","content":{"age":30,"n":"x\"y"}}"#,
        ))
        .unwrap();
        assert_eq!(a, r#"{"action":"accept","content":{"age":30,"n":"x\"y"}}"#);
        assert_eq!(
            elicitation_answer(raw(r#"{"action":"decline","content":{"x":1}}"#)).unwrap(),
            r#"{"action":"decline"}"#
        );
        assert_eq!(
            elicitation_answer(raw(r#"{"action":"cancel"}"#)).unwrap(),
            r#"{"action":"cancel"}"#
        );
        for bad in [
            r#"{"action":"maybe"}"#,
            r#"{"content":{}}"#,
            r#"{"action":"accept","content":[1]}"#,
            r#"[]"#,
        ] {
            assert_eq!(
                elicitation_answer(raw(bad)).unwrap_err().code,
                -32602,
                "{bad}"
            );
        }
    }

    #[test]
    fn schemas_that_mcp_clients_would_refuse_are_made_object_schemas() {
        for (given, sent) in [
            ("{}", Some(r#"{"type":"object"}"#)),
            ("  { }  ", Some(r#"{"type":"object"}"#)),
            (
                r#"{"properties":{"a":{}}}"#,
                Some(r#"{"type":"object","properties":{"a":{}}}"#),
            ),
            (r#" {"type":"object"} "#, Some(r#"{"type":"object"}"#)),
            (
                r#"{"type":"obj\u0065ct","x":1}"#,
                Some(r#"{"type":"obj\u0065ct","x":1}"#),
            ),
            (r#"{"type":"string"}"#, None),
            (r#"{"type":null}"#, None),
            (r#"{"type":["object"]}"#, None),
            (r#"{"type":"object","type":"object"}"#, None),
            ("[]", None),
            ("{", None),
            (r#"{"a":1},{"b":2}"#, None),
        ] {
            assert_eq!(object_schema(given, false).as_deref(), sent, "{given}");
        }
        let l = tool("s", r#"{"properties":{}}"#, Some(r#"{"type":"array"}"#));
        let mut enc = ResponseEncoder::new(1);
        let mut out = Vec::new();
        adapt::list_tools(&mut enc, &mut out, &TO, &[l], FIRST_PAGE);
        let v = response("1", Method::ListTools, &out);
        assert_eq!(
            v["result"]["tools"][0]["inputSchema"],
            json!({"type":"object","properties":{}})
        );
        assert!(v["result"]["tools"][0].get("outputSchema").is_none());
    }

    #[test]
    fn requested_schemas_get_the_members_mcp_requires() {
        for (given, sent) in [
            ("{}", Some(r#"{"type":"object","properties":{}}"#)),
            (
                r#"{"type":"object"}"#,
                Some(r#"{"properties":{},"type":"object"}"#),
            ),
            (
                r#"{"properties":{"a":{"type":"string"}}}"#,
                Some(r#"{"type":"object","properties":{"a":{"type":"string"}}}"#),
            ),
            (
                r#"{"required":["a"]}"#,
                Some(r#"{"type":"object","properties":{},"required":["a"]}"#),
            ),
            (r#"{"type":"object","properties":[]}"#, None),
        ] {
            assert_eq!(object_schema(given, true).as_deref(), sent, "{given}");
        }
    }

    #[test]
    fn older_clients_get_blocks_their_version_knows() {
        let r = completed(
            vec![
                w::ContentBlock::Audio(w::AudioContent {
                    data: "YXU=".into(),
                    mime_type: "audio/wav".into(),
                    annotations: None,
                }),
                w::ContentBlock::ResourceLink(w::ResourceLinkContent {
                    uri: "file:///x".into(),
                    title: Some("X".into()),
                    description: None,
                    mime_type: None,
                    annotations: None,
                }),
            ],
            None,
        );
        let f = tool_frames(&r);
        let audio = json!({"type":"audio","data":"YXU=","mimeType":"audio/wav"});
        let link = json!({"type":"resource_link","uri":"file:///x","name":"X","title":"X"});
        let audio_old = json!({"type":"resource","resource":{"uri":"audio:","mimeType":"audio/wav","blob":"YXU="}});
        let link_old = json!({"type":"text","text":"X (file:///x)"});
        for (v, want) in [
            ("2025-11-25", [&audio, &link]),
            ("2025-06-18", [&audio, &link]),
            ("2025-03-26", [&audio, &link_old]),
            ("2024-11-05", [&audio_old, &link_old]),
        ] {
            let got = response_in(v, "1", Method::CallTool, &f);
            assert_eq!(got["result"]["content"], json!(want), "{v}");
        }
    }

    #[test]
    fn log_levels_rank_and_read_from_frames() {
        assert!(level_rank("debug") < level_rank("warning"));
        assert_eq!(level_rank("emergency"), Some(7));
        assert_eq!(level_rank("loud"), None);
        let mut enc = ResponseEncoder::new(1);
        let fbb = enc.begin();
        let message = fbb.create_string("m");
        let l = p::LogMessage::create(
            fbb,
            &p::LogMessageArgs {
                level: p::LogLevel::Error,
                message: Some(message),
                ..Default::default()
            },
        );
        let f = enc
            .finish(
                &TO,
                p::ResponsePayload::LogMessage,
                l.as_union_value(),
                true,
            )
            .to_vec();
        assert_eq!(log_level_of(&f), Some("error"));
        assert_eq!(log_level_of(enc.pong(&TO)), None);
        let mut out = Vec::new();
        assert!(write_log(&mut out, &f));
        // No source: no logger.
        assert_eq!(json_of(&out)["params"], json!({"level":"error","data":"m"}));
    }

    /// A router's (or an upstream's) log keeps its MCP level, the three the
    /// frame cannot name included, and structured data as the value it
    /// logged, through the frame into `notifications/message`.
    #[test]
    fn a_routers_log_keeps_its_level_and_structured_data() {
        let mut enc = ResponseEncoder::new(1);
        for level in LOG_LEVELS {
            let f = crate::adapt::log_frame(&mut enc, &TO, level, Some("up"), r#"{"k":[1,2,"ü"]}"#)
                .to_vec();
            assert_eq!(log_level_of(&f), Some(level));
            let mut out = Vec::new();
            assert!(write_log(&mut out, &f));
            assert_eq!(
                json_of(&out)["params"],
                json!({"level":level,"logger":"up","data":{"k":[1,2,"ü"]}}),
                "{level}"
            );
        }
        // A string is the message itself; text that is not JSON stays text.
        for (data, want) in [
            (r#""plain""#, json!("plain")),
            ("not json", json!("not json")),
        ] {
            let f = crate::adapt::log_frame(&mut enc, &TO, "notice", None, data).to_vec();
            let mut out = Vec::new();
            assert!(write_log(&mut out, &f));
            assert_eq!(json_of(&out)["params"]["data"], want, "{data}");
        }
    }

    #[test]
    fn client_answers_match_our_string_ids() {
        let Message::Response { id, error, .. } =
            one(r#"{"jsonrpc":"2.0","id":"el-\u0031","result":{"action":"cancel"},"error":null}"#)
        else {
            panic!()
        };
        assert_eq!(id.as_string().as_deref(), Some("el-1"));
        assert!(error.is_none());
        assert_eq!(Id(raw("12")).as_string(), None);
    }

    #[test]
    fn cancellations_name_the_request_and_pings_get_an_empty_result() {
        let p = raw(r#"{"requestId":"r-1","reason":"user"}"#);
        assert_eq!(
            cancelled_request_id(Some(p)).map(|i| i.get()),
            Some("\"r-1\"")
        );
        let p = raw(r#"{"requestId":12}"#);
        assert_eq!(cancelled_request_id(Some(p)), Some(Id(raw("12"))));
        for bad in [r#"{"requestId":{}}"#, r#"{"reason":"x"}"#, "[1]"] {
            assert_eq!(cancelled_request_id(Some(raw(bad))), None, "{bad}");
        }
        assert_eq!(cancelled_request_id(None), None);
        let mut out = Vec::new();
        write_empty_result(&mut out, &Id(raw("\"p\"")));
        assert_eq!(out, br#"{"jsonrpc":"2.0","id":"p","result":{}}"#);
    }

    /// A small deterministic PRNG (xorshift64*): mutations that are the
    /// same on every run.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }

        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    /// Every body, however broken, is either refused with an error that is
    /// one JSON-RPC message, or parsed into messages whose requests build
    /// frames that verify as the method asked (or are refused the same way).
    fn check_body(body: &[u8], enc: &mut RequestEncoder) {
        let mut out = Vec::new();
        let messages = match parse(body) {
            Err(e) => {
                assert!(matches!(e.code, -32700 | -32600), "{e:?}");
                e.write(&mut out);
                json_of(&out);
                return;
            }
            Ok(Body::One(m)) => vec![Ok(m)],
            Ok(Body::Batch(ms)) => ms,
        };
        for m in messages {
            let (id, method, params) = match m {
                Ok(Message::Request { id, method, params }) => (id, method, params),
                Ok(_) => continue,
                Err(e) => {
                    out.clear();
                    e.write(&mut out);
                    json_of(&out);
                    continue;
                }
            };
            let Some(method) = Method::from_name(&method) else {
                continue;
            };
            match request_frame(enc, &header(), method, params, &[("_elicitation", "{}")]) {
                Ok((frame, info)) => {
                    let v = VerifiedRequest::verify(Bytes::copy_from_slice(frame));
                    // Only an empty routing name is refused by verification.
                    if let Ok(v) = v {
                        assert_eq!(info.method, method);
                        if let Some(name) = &info.tool_name {
                            assert_eq!(v.view().route_key(), RouteKey::Tool(name));
                        }
                    }
                }
                Err(e) => {
                    assert_eq!(e.code, -32602, "{e:?}");
                    out.clear();
                    e.with_id(Some(id)).write(&mut out);
                    assert_eq!(
                        json_of(&out)["id"],
                        serde_json::from_str::<Value>(id.get()).unwrap()
                    );
                }
            }
        }
    }

    /// Mutations a randomized test tries: fewer under Miri, which runs
    /// the same code (the answer writers read verified frames through
    /// `unsafe` accessors) a thousand times slower.
    const MUTATIONS: usize = if cfg!(miri) { 60 } else { 3000 };

    #[test]
    fn mutated_bodies_are_answered_or_refused_never_mishandled() {
        let seeds: [&[u8]; 6] = [
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"hi","n":[1,2,{"a":null}]},"_meta":{"progressToken":"t"}}}"#,
            br#"{"jsonrpc":"2.0","id":"i","method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{"elicitation":{}},"clientInfo":{"name":"c","version":"1"}}}"#,
            br#"[{"jsonrpc":"2.0","id":2,"method":"prompts/get","params":{"name":"p","arguments":{"a":"b"}}},{"jsonrpc":"2.0","method":"notifications/initialized"}]"#,
            br#"{"jsonrpc":"2.0","id":3,"method":"completion/complete","params":{"ref":{"type":"ref/prompt","name":"p"},"argument":{"name":"a","value":"x"}}}"#,
            br#"{"jsonrpc":"2.0","id":4,"method":"logging/setLevel","params":{"level":"info"}}"#,
            br#"{"jsonrpc":"2.0","id":5,"method":"resources/read","params":{"uri":"file:///\u00e9"}}"#,
        ];
        const SPECIAL: &[u8] = b"{}[]\",:\\u0-1e9 nulltruefalse\x00\xff";
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let mut enc = RequestEncoder::new();
        for seed in seeds {
            check_body(seed, &mut enc);
            for _ in 0..MUTATIONS / 2 {
                let mut b = seed.to_vec();
                for _ in 0..1 + rng.below(4) {
                    let i = rng.below(b.len() + 1);
                    match rng.below(4) {
                        0 if i < b.len() => {
                            b.remove(i);
                        }
                        1 if i < b.len() => b[i] = SPECIAL[rng.below(SPECIAL.len())],
                        2 => b.insert(i, SPECIAL[rng.below(SPECIAL.len())]),
                        _ => b.truncate(i.max(1)),
                    }
                }
                check_body(&b, &mut enc);
            }
        }
    }

    #[test]
    fn broken_frames_become_internal_errors_not_broken_json() {
        let good = tool_frames(&completed(vec![text("t")], Some(r#"{"a":1}"#)));
        let mut rng = Rng(7);
        for _ in 0..MUTATIONS {
            let mut f = good.clone();
            for _ in 0..1 + rng.below(3) {
                let i = rng.below(f.len());
                f[i] = rng.next() as u8;
            }
            if rng.below(4) == 0 {
                f.truncate(rng.below(f.len()) + 1);
            }
            for m in [Method::CallTool, Method::ListTools, Method::Initialize] {
                let v = response("1", m, &f);
                assert!(
                    v.get("result").is_some() || v["error"]["code"].is_i64(),
                    "{v}"
                );
            }
            let mut out = Vec::new();
            if write_progress(&mut out, raw("1"), &f) || write_log(&mut out, &f) {
                json_of(&out);
            }
            out.clear();
            if write_elicitation_create(&mut out, "e", &f) {
                json_of(&out);
            }
        }
    }

    #[test]
    fn errors_without_an_id_say_null_and_keep_data_json() {
        let mut out = Vec::new();
        write_error(
            &mut out,
            None,
            -32700,
            "Parse error: \"x\"",
            Some(r#"{"at":3}"#),
        );
        assert_eq!(
            json_of(&out),
            json!({"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"Parse error: \"x\"","data":{"at":3}}})
        );
        assert!(!out.ends_with(b"\n"));
    }
}
