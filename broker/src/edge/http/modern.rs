//! The 2026-07-28 revision of Streamable HTTP (the "modern era") on the
//! same `/mcp` endpoint as the session-based revisions.
//!
//! A request is modern when its `MCP-Protocol-Version` header is present
//! and names no handshake-era version ([`is_modern`]); a header-less
//! `server/discover` is answered here too. Modern requests are served
//! statelessly: every POST carries its version, capabilities and identity
//! in `params._meta`, no session is looked up, minted or echoed, and GET and
//! DELETE get 405. What a router needs from the client mid-call
//! (elicitation, sampling) comes back as an `InputRequiredResult` that the
//! client answers by retrying with `inputResponses` (multi round-trip, MRTR):
//! the retry carries everything, so nothing is kept between the two POSTs.
//!
//! # Validation order (the spec's "Server Validation", as its conformance
//! suite checks it)
//! 1. `params._meta` with `io.modelcontextprotocol/protocolVersion` (a
//!    string) and `io.modelcontextprotocol/clientCapabilities` (an object):
//!    else -32602, HTTP 400. First, because the header checks compare with
//!    these fields.
//! 2. Standard headers against the body, after trimming and decoding the
//!    `=?base64?…?=` sentinel: `MCP-Protocol-Version` equal to the `_meta`
//!    version, `Mcp-Method` equal to `method` (case-sensitive), and
//!    `Mcp-Name` equal to `params.name` (`tools/call`, `prompts/get`) or
//!    `params.uri` (`resources/read`). Missing, repeated, undecodable or
//!    different: -32020 HeaderMismatch, HTTP 400.
//! 3. The version: not one this edge serves as modern → -32022
//!    UnsupportedProtocolVersion with `data.supported` (the same list as
//!    `server/discover`'s `supportedVersions`) and `data.requested`, HTTP 400.
//! 4. The method: not part of 2026-07-28 here → -32601, HTTP 404.
//! 5. `tools/call`: the `Mcp-Param-*` headers its tool's input schema
//!    declares with `x-mcp-header` ([`check_param_headers`]): -32020.
//!
//! # `subscriptions/listen`
//! A POST whose answer is a long-lived SSE stream: first
//! `notifications/subscriptions/acknowledged` with the part of the filter
//! served (`toolsListChanged`, `promptsListChanged`, `resourcesListChanged`,
//! and of `resourceSubscriptions` the URIs whose router declares
//! `resources.subscribe` and can tell its updates through
//! `mcp-broker:host/call.resource-updated`), then the `list_changed`
//! notifications asked for as the route table changes and
//! `notifications/resources/updated` as routers tell writes (from any
//! connection, on any shard), each tagged with
//! `_meta["io.modelcontextprotocol/subscriptionId"]` (the listen request's
//! id), and a keep-alive comment every
//! `http.sse_keepalive`. The only state is the open stream itself
//! ([`Listeners`]); at the drain the stream ends with the listen request's
//! result.
//!
//! # MRTR argument convention
//! The same as the session-based round trip (docs/http.md): the router's
//! `elicit` answer becomes `inputRequests.elicitation` (an
//! `elicitation/create` request); the retry's `inputResponses.elicitation`
//! (an `ElicitResult`) reaches the tool as the argument `_elicitation`
//! (`{"action":…,"content":…}`, built by `jsonrpc::elicitation_answer`),
//! with the retry's other arguments as sent. Sampling likewise: key
//! `sampling`, argument `_sampling`; roots: key `roots`, argument `_roots`.
//! Only the answer to the latest question is carried, as in a session,
//! where each re-call holds one answer. What the router wants to keep
//! between the rounds (its state, the key it named) travels sealed as
//! `requestState` (`request_state.rs`) and reaches the tool as
//! `_request_state`.

use std::borrow::Cow;
use std::rc::Rc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

use base64::Engine as _;
use bytes::Bytes;
use futures_channel::mpsc;
use hyper::body::Incoming;
use hyper::header::{self, HeaderMap, HeaderValue};
use hyper::{Request, Response, StatusCode};
use mcp_schema::ErrorCode;
use serde::Deserialize;
use serde_json::value::RawValue;

use super::jsonrpc::{
    self, Body as RpcBody, FrameKind, Id, MODERN_VERSION, Message, Method, first_byte, string_of,
};
use super::request_state::{
    Asked, MAX_INPUT_KEY_BYTES, MAX_STATE_BYTES, Question, Refused, RequestStates,
};
use super::{
    Body, HttpEdge, empty, frames, hide_tools, json_response, level_allows, refuse, unparsable,
};
use crate::auth::Principal;
use crate::dispatch::LiveOut;
use crate::route::{RouteTable, RouterId, Target};
use crate::routing::Routing;
use crate::shared::ListKinds;

/// Versions served as modern (stateless, per-request `_meta`).
pub const MODERN_VERSIONS: [&str; 1] = [MODERN_VERSION];

/// Every version the edge serves, newest first: `server/discover`'s
/// `supportedVersions` and the `supported` list of -32022. The two must
/// agree (a client may pick any entry and retry), and the handshake-era
/// versions are listed so that a client knows it may also `initialize`.
pub const SUPPORTED: [&str; 5] = [
    MODERN_VERSION,
    "2025-11-25",
    "2025-06-18",
    "2025-03-26",
    "2024-11-05",
];

/// A standard header does not match the body (or is missing or malformed).
pub const HEADER_MISMATCH: i32 = -32020;
/// The request needs a client capability its `_meta` did not declare.
pub const MISSING_CAPABILITY: i32 = -32021;
/// The request's protocol version is not served.
pub const UNSUPPORTED_VERSION: i32 = -32022;

pub const VERSION_HEADER: &str = "mcp-protocol-version";
pub const METHOD_HEADER: &str = "mcp-method";
pub const NAME_HEADER: &str = "mcp-name";

/// The `inputRequests` / `inputResponses` key of an elicitation.
pub const ELICITATION_KEY: &str = "elicitation";
/// The `inputRequests` / `inputResponses` key of a sampling request.
pub const SAMPLING_KEY: &str = "sampling";
/// The `inputRequests` / `inputResponses` key of a `roots/list` request.
pub const ROOTS_KEY: &str = "roots";

/// `MCP-Protocol-Version` as a `HeaderName`: every request asks for it,
/// and the `&str` would be parsed again each time.
pub const VERSION: hyper::header::HeaderName =
    hyper::header::HeaderName::from_static(VERSION_HEADER);

/// Whether a request belongs to the modern era by its headers: an
/// `MCP-Protocol-Version` that is present and is not a handshake-era
/// version (an unknown one included, so that it gets a structured -32022
/// rather than the session path's refusal).
pub fn is_modern(h: &HeaderMap) -> bool {
    h.get(VERSION).is_some_and(|v| {
        v.to_str()
            .map_or(true, |v| !super::VERSIONS.contains(&v.trim()))
    })
}

/// Whether a method is part of 2026-07-28 and served here.
pub fn served(method: &str) -> bool {
    matches!(
        method,
        "server/discover"
            | "tools/list"
            | "tools/call"
            | "resources/list"
            | "resources/templates/list"
            | "resources/read"
            | "prompts/list"
            | "prompts/get"
            | "completion/complete"
            | "subscriptions/listen"
    )
}

/// Whether a result of `method` must carry caching hints (`ttlMs`,
/// `cacheScope`).
pub fn cacheable(method: &str) -> bool {
    matches!(
        method,
        "tools/list"
            | "resources/list"
            | "resources/templates/list"
            | "prompts/list"
            | "resources/read"
    )
}

/// A header value as the spec encodes it: optional whitespace trimmed
/// (RFC 9110), then `=?base64?<standard base64 of UTF-8>?=` decoded. The
/// sentinel is case-sensitive: anything else (`=?BASE64?…?=`, a missing
/// suffix) is a literal value. Bad padding, characters outside the
/// alphabet, non-canonical encodings and non-UTF-8 payloads are errors.
pub fn decode_header_value(raw: &str) -> Result<Cow<'_, str>, String> {
    let v = raw.trim_matches([' ', '\t']);
    let Some(payload) = v
        .strip_prefix("=?base64?")
        .and_then(|r| r.strip_suffix("?="))
    else {
        return Ok(Cow::Borrowed(v));
    };
    let engine = base64::engine::general_purpose::STANDARD;
    let bytes = engine
        .decode(payload)
        .map_err(|e| format!("its base64 value does not decode: {e}"))?;
    // Only one spelling per value: a header is compared, never re-encoded.
    if engine.encode(&bytes) != payload {
        return Err("its base64 value is not canonical".into());
    }
    String::from_utf8(bytes)
        .map(Cow::Owned)
        .map_err(|_| "its base64 value is not UTF-8".into())
}

/// The parts of a modern request's params the edge reads itself.
#[derive(Deserialize, Default)]
struct Envelope<'a> {
    #[serde(borrow, default, rename = "_meta")]
    meta: Option<&'a RawValue>,
    #[serde(borrow, default)]
    name: Option<&'a RawValue>,
    #[serde(borrow, default)]
    uri: Option<&'a RawValue>,
    #[serde(borrow, default, rename = "inputResponses")]
    input_responses: Option<&'a RawValue>,
    #[serde(borrow, default, rename = "requestState")]
    request_state: Option<&'a RawValue>,
}

#[derive(Deserialize, Default)]
struct Meta<'a> {
    #[serde(borrow, default, rename = "io.modelcontextprotocol/protocolVersion")]
    version: Option<&'a RawValue>,
    #[serde(borrow, default, rename = "io.modelcontextprotocol/clientCapabilities")]
    capabilities: Option<&'a RawValue>,
    #[serde(borrow, default, rename = "io.modelcontextprotocol/clientInfo")]
    client_info: Option<&'a RawValue>,
    #[serde(borrow, default, rename = "io.modelcontextprotocol/logLevel")]
    log_level: Option<&'a RawValue>,
}

#[derive(Deserialize, Default)]
struct ClientInfo<'a> {
    #[serde(borrow, default)]
    name: Option<&'a RawValue>,
    #[serde(borrow, default)]
    version: Option<&'a RawValue>,
}

/// What a valid modern request declares about itself.
#[derive(Debug, Default)]
pub struct Declared<'a> {
    /// `_meta`'s protocol version (not yet checked to be served).
    pub version: Cow<'a, str>,
    /// `clientCapabilities.elicitation` covers form mode.
    pub elicitation: bool,
    /// `clientCapabilities.sampling` is present.
    pub sampling: bool,
    /// `clientCapabilities.roots` is present.
    pub roots: bool,
    /// `clientInfo.name` / `.version`, for `server/discover`'s frame.
    pub client_name: Option<Cow<'a, str>>,
    pub client_version: Option<Cow<'a, str>>,
    /// `_meta`'s log level: the request's opt-in to log notifications.
    pub log_level: Option<&'static str>,
    /// `params.name` (`tools/call`, `prompts/get`) or `params.uri`
    /// (`resources/read`): what `Mcp-Name` must equal.
    pub name: Option<Cow<'a, str>>,
    /// `params.inputResponses`, raw: a retry's answers (MRTR).
    pub input_responses: Option<&'a RawValue>,
    /// `params.requestState`: the token a retry echoes (not yet opened).
    pub request_state: Option<Cow<'a, str>>,
}

/// A refusal: JSON-RPC code and message (`data` for -32022 and -32021).
#[derive(Debug, PartialEq)]
pub struct Refusal {
    pub code: i32,
    pub message: String,
    pub data: Option<String>,
}

impl Refusal {
    pub fn new(code: i32, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            data: None,
        }
    }

    /// The HTTP status of a modern error answer: 400 for malformed
    /// requests and the revision's own -32020..-32022, 404 for an unknown
    /// method (what tells a modern server's 404 from a legacy one's).
    pub fn status(&self) -> u16 {
        match self.code {
            jsonrpc::code::METHOD_NOT_FOUND => 404,
            _ => 400,
        }
    }
}

/// The refusal of a `requestState` that is not a string, which the edge
/// counts as a malformed one (`mcp_http_request_states_refused_total`).
const STATE_NOT_A_STRING: &str = "Invalid params: `requestState` must be a string";

/// Step 1: the `_meta` fields every modern request must carry, and what
/// the edge reads from the params besides.
pub fn declared<'a>(method: &str, params: Option<&'a RawValue>) -> Result<Declared<'a>, Refusal> {
    let invalid = |m: String| Refusal::new(jsonrpc::code::INVALID_PARAMS, m);
    let env: Envelope<'a> = match params {
        Some(p) if first_byte(p) == b'{' => {
            serde_json::from_str(p.get()).map_err(|e| invalid(format!("Invalid params: {e}")))?
        }
        Some(_) => return Err(invalid("Invalid params: params must be an object".into())),
        None => Envelope::default(),
    };
    let meta: Meta<'a> = match env.meta {
        Some(m) if first_byte(m) == b'{' => serde_json::from_str(m.get())
            .map_err(|e| invalid(format!("Invalid params: `_meta`: {e}")))?,
        _ => {
            return Err(invalid(
                "Invalid params: `params._meta` (an object) is required in protocol 2026-07-28"
                    .into(),
            ));
        }
    };
    let version = meta.version.and_then(string_of).ok_or_else(|| {
        invalid(
            "Invalid params: `_meta[\"io.modelcontextprotocol/protocolVersion\"]` (a string) is required"
                .into(),
        )
    })?;
    let caps: jsonrpc::Capabilities<'a> = match meta.capabilities {
        Some(c) if first_byte(c) == b'{' => serde_json::from_str(c.get()).map_err(|e| {
            invalid(format!(
                "Invalid params: `_meta[\"io.modelcontextprotocol/clientCapabilities\"]`: {e}"
            ))
        })?,
        _ => {
            return Err(invalid(
                "Invalid params: `_meta[\"io.modelcontextprotocol/clientCapabilities\"]` (an object) is required"
                    .into(),
            ));
        }
    };
    let info: ClientInfo<'a> = match meta.client_info {
        Some(c) if first_byte(c) == b'{' => serde_json::from_str(c.get()).unwrap_or_default(),
        _ => ClientInfo::default(),
    };
    let log_level = match meta.log_level {
        None => None,
        Some(l) => {
            let l = string_of(l).unwrap_or_default();
            match jsonrpc::LOG_LEVELS.iter().find(|x| **x == l) {
                Some(x) => Some(*x),
                None => {
                    return Err(invalid(format!(
                        "Invalid params: unknown `io.modelcontextprotocol/logLevel` `{l}` (one of {})",
                        jsonrpc::LOG_LEVELS.join(", ")
                    )));
                }
            }
        }
    };
    let request_state = match env.request_state.filter(|r| r.get() != "null") {
        None => None,
        Some(r) => Some(string_of(r).ok_or_else(|| invalid(STATE_NOT_A_STRING.into()))?),
    };
    let name = match method {
        "tools/call" | "prompts/get" => env.name.and_then(string_of),
        "resources/read" => env.uri.and_then(string_of),
        _ => None,
    };
    Ok(Declared {
        version,
        elicitation: jsonrpc::form_elicitation(caps.elicitation),
        sampling: caps.sampling.is_some_and(|s| first_byte(s) == b'{'),
        roots: caps.roots.is_some_and(|s| first_byte(s) == b'{'),
        client_name: info.name.and_then(string_of),
        client_version: info.version.and_then(string_of),
        log_level,
        name,
        input_responses: env.input_responses,
        request_state,
    })
}

/// The one value of a standard header, decoded; `Ok(None)` when absent.
fn one_header<'h>(h: &'h HeaderMap, name: &str) -> Result<Option<Cow<'h, str>>, Refusal> {
    let mismatch = |m: String| Refusal::new(HEADER_MISMATCH, m);
    let mut all = h.get_all(name).iter();
    let Some(v) = all.next() else {
        return Ok(None);
    };
    if all.next().is_some() {
        return Err(mismatch(format!(
            "Header mismatch: the {name} header is repeated"
        )));
    }
    let v = v.to_str().map_err(|_| {
        mismatch(format!(
            "Header mismatch: the {name} header has invalid characters (send non-ASCII values as =?base64?…?=)"
        ))
    })?;
    decode_header_value(v).map(Some).map_err(|e| {
        mismatch(format!(
            "Header mismatch: the {name} header is invalid: {e}"
        ))
    })
}

/// The single value of header `name`, as sent: for the headers the sentinel
/// encoding does not apply to (`MCP-Protocol-Version`, `Mcp-Method`).
fn one_plain_header<'h>(h: &'h HeaderMap, name: &str) -> Result<Option<Cow<'h, str>>, Refusal> {
    let mut all = h.get_all(name).iter();
    let Some(v) = all.next() else {
        return Ok(None);
    };
    if all.next().is_some() {
        return Err(Refusal::new(
            HEADER_MISMATCH,
            format!("Header mismatch: the {name} header is repeated"),
        ));
    }
    v.to_str().map(|v| Some(Cow::Borrowed(v))).map_err(|_| {
        Refusal::new(
            HEADER_MISMATCH,
            format!("Header mismatch: the {name} header has invalid characters"),
        )
    })
}

/// Step 2: the standard headers against the body.
pub fn check_headers(h: &HeaderMap, method: &str, d: &Declared<'_>) -> Result<(), Refusal> {
    let mismatch = |m: String| Refusal::new(HEADER_MISMATCH, m);
    let expect = |name: &str, header: &str, body: &str| -> Result<(), Refusal> {
        // The sentinel encoding is for `Mcp-Name` and `Mcp-Param-*` only:
        // a method or version header is compared as sent, or a gateway
        // routing on `=?base64?…?=` would see another value than the body.
        let v = if header == NAME_HEADER {
            one_header(h, header)?
        } else {
            one_plain_header(h, header)?
        };
        match v {
            None => Err(mismatch(format!(
                "Header mismatch: the {name} header is required (body value '{body}')"
            ))),
            Some(v) if v != body => Err(mismatch(format!(
                "Header mismatch: {name} header value '{v}' does not match body value '{body}'"
            ))),
            Some(_) => Ok(()),
        }
    };
    expect("MCP-Protocol-Version", VERSION_HEADER, &d.version)?;
    expect("Mcp-Method", METHOD_HEADER, method)?;
    if matches!(method, "tools/call" | "prompts/get" | "resources/read") {
        // A body without the name is the method's own -32602, later; the
        // header then has nothing to match, but must still be present.
        match &d.name {
            Some(n) => expect("Mcp-Name", NAME_HEADER, n)?,
            None => {
                if one_header(h, NAME_HEADER)?.is_none() {
                    return Err(mismatch(
                        "Header mismatch: the Mcp-Name header is required".into(),
                    ));
                }
            }
        }
    } else {
        // Not compared for other methods, but a repeated or broken one is
        // still refused rather than forwarded ambiguously.
        one_header(h, NAME_HEADER)?;
    }
    Ok(())
}

/// The route a `tools/call` names in its headers: `Mcp-Method` says
/// `tools/call` and the decoded `Mcp-Name` is a tool of `table`. Read
/// before the body is parsed (the revision's point: the headers route);
/// the body is held to the same name afterwards ([`check_headers`]), so
/// a request served is routed as its body says. `None` for other methods,
/// unknown tools and headers that are missing, repeated or undecodable
/// (refused later, in the validation order).
pub fn route_from_headers<'t>(h: &HeaderMap, table: &'t RouteTable) -> Option<&'t Target> {
    let mut methods = h.get_all(METHOD_HEADER).iter();
    let method = methods.next()?;
    // Method names are ASCII tokens: no sentinel to decode in practice,
    // but the comparison is the one check_headers makes.
    if methods.next().is_some() || method.as_bytes() != b"tools/call" {
        return None;
    }
    let name = one_header(h, NAME_HEADER).ok()??;
    table.tool(&name)
}

/// A `tools/call`'s route as its headers picked it, with the table it was
/// picked from (a reload meanwhile does not move it).
pub(super) struct HeaderRoute {
    routing: std::sync::Arc<Routing>,
    router: RouterId,
    listed: usize,
}

impl HeaderRoute {
    fn pick(h: &HeaderMap, shared: &arc_swap::ArcSwap<Routing>) -> Option<Self> {
        let routing = shared.load();
        let t = route_from_headers(h, &routing.table)?;
        let (router, listed) = (t.router, t.listed);
        Some(Self {
            routing: arc_swap::Guard::into_inner(routing),
            router,
            listed,
        })
    }

    /// The tool's listing entry (its input schema).
    fn tool(&self) -> &crate::route::Listed<crate::wasm::types::Tool> {
        &self.routing.table.tool_list[self.listed]
    }

    /// Whether its router reports progress and logs while a call runs.
    fn reports_live(&self) -> bool {
        self.routing.routers[self.router as usize]
            .router
            .reports_live()
    }
}

/// Step 3: the version.
pub fn check_version(d: &Declared<'_>) -> Result<(), Refusal> {
    if MODERN_VERSIONS.contains(&&*d.version) {
        return Ok(());
    }
    Err(unsupported_version(&d.version))
}

/// The -32022 refusal of a `MCP-Protocol-Version` header naming a version
/// this edge does not serve (neither a handshake-era one nor 2026-07-28),
/// whatever the message: both revisions say 400 for it, and the body
/// lists what is served. Checked before the body (a request without
/// `_meta` is told the version it asked for is unknown, not that its
/// `_meta` is missing); `None` for a served version, and for a repeated
/// or unreadable header, which step 2 refuses.
pub fn unserved_version_header(h: &HeaderMap) -> Option<Refusal> {
    let v = one_plain_header(h, VERSION_HEADER).ok()??;
    let v = v.trim();
    (!MODERN_VERSIONS.contains(&v)).then(|| unsupported_version(v))
}

fn unsupported_version(requested: &str) -> Refusal {
    let mut data = Vec::with_capacity(128);
    data.extend_from_slice(b"{\"supported\":[");
    for (i, v) in SUPPORTED.iter().enumerate() {
        if i > 0 {
            data.push(b',');
        }
        mcp_schema::args::write_json_string(v, &mut data);
    }
    data.extend_from_slice(b"],\"requested\":");
    mcp_schema::args::write_json_string(requested, &mut data);
    data.push(b'}');
    let mut r = Refusal::new(
        UNSUPPORTED_VERSION,
        format!(
            "Unsupported protocol version `{requested}` (supported: {})",
            SUPPORTED.join(", ")
        ),
    );
    r.data = Some(String::from_utf8(data).unwrap_or_default());
    r
}

/// The -32021 refusal of a request whose router needs `capability`.
pub fn missing_capability(capability: &str, what: &str) -> Refusal {
    let mut r = Refusal::new(
        MISSING_CAPABILITY,
        format!("Server requires the {capability} capability for this request: the tool {what}"),
    );
    r.data = Some(format!(
        "{{\"requiredCapabilities\":{{\"{capability}\":{{}}}}}}"
    ));
    r
}

/// A retry's answers and the router's state, as the arguments the tool is
/// called again with. `asked`: the questions the retry's `requestState`
/// carries.
/// - One question: its answer, read under its key, as its kind's argument
///   (`_elicitation`, `_sampling` or `_roots`).
/// - A set: every answer it has, by key, as one object under `_inputs`;
///   a missing one is left for the tool to ask again.
/// - No `requestState`: the answer under a default key (an elicitation's
///   first) as its kind's argument; and, since nothing names the keys the
///   tool asked under, every other answer that is an object under
///   `_inputs`, for the tool to read its own and ignore the rest.
///
/// Then (`_request_state`, its JSON) when the router attached one. Empty
/// when the request is not a retry.
pub fn retry_arguments(
    input_responses: Option<&RawValue>,
    asked: Option<Question<String>>,
) -> Result<Vec<(&'static str, String)>, Refusal> {
    let invalid = |m: String| Refusal::new(jsonrpc::code::INVALID_PARAMS, m);
    let responses = match input_responses.filter(|r| r.get() != "null") {
        Some(raw) => jsonrpc::object_members(raw, "`inputResponses`").map_err(invalid)?,
        None => Vec::new(),
    };
    let get = |k: &str| responses.iter().find(|(key, _)| key == k).map(|(_, v)| *v);
    let mut args = Vec::new();
    let mut inputs = Inputs::default();
    match &asked {
        Some(q) if q.many => {
            for (kind, key) in &q.asks {
                if let Some(a) = get(key) {
                    inputs.add(key, &answer_of(*kind, key, a)?);
                }
            }
            args.push((jsonrpc::INPUTS_ARG, inputs.end()));
        }
        _ => {
            const DEFAULTS: [(&str, Asked); 3] = [
                (ELICITATION_KEY, Asked::Elicitation),
                (SAMPLING_KEY, Asked::Sampling),
                (ROOTS_KEY, Asked::Roots),
            ];
            let one;
            let wanted: &[(&str, Asked)] = match &asked {
                Some(q) => {
                    one = [(q.asks[0].1.as_str(), q.asks[0].0)];
                    &one
                }
                None => &DEFAULTS,
            };
            if let Some((key, answer, kind)) = wanted
                .iter()
                .find_map(|&(k, kind)| Some((k, get(k)?, kind)))
            {
                let arg = match kind {
                    Asked::Elicitation => jsonrpc::ELICITATION_ARG,
                    Asked::Sampling => jsonrpc::SAMPLING_ARG,
                    Asked::Roots => jsonrpc::ROOTS_ARG,
                };
                args.push((arg, answer_of(kind, key, answer)?));
            }
            // With a question named, other keys are the client's extras,
            // ignored (the spec's advice).
            if asked.is_none() {
                // Every answer of every kind is an object: anything else
                // answers nothing, and is ignored with the other extras. A
                // key given twice counts once (the first), as `get` reads
                // it; a set, since the client chooses how many keys.
                let mut seen = std::collections::HashSet::new();
                for (key, answer) in &responses {
                    if first_byte(answer) == b'{'
                        && !DEFAULTS.iter().any(|(k, _)| k == key)
                        && seen.insert(&**key)
                    {
                        inputs.add(key, answer.get());
                    }
                }
                if !inputs.is_empty() {
                    args.push((jsonrpc::INPUTS_ARG, inputs.end()));
                }
            }
        }
    }
    if let Some(state) = asked.and_then(|q| q.state) {
        args.push((jsonrpc::STATE_ARG, state));
    }
    Ok(args)
}

/// An `_inputs` object being written: answers by key.
#[derive(Default)]
pub(super) struct Inputs(Vec<u8>);

impl Inputs {
    pub(super) fn add(&mut self, key: &str, answer: &str) {
        self.0.push(if self.0.is_empty() { b'{' } else { b',' });
        mcp_schema::args::write_json_string(key, &mut self.0);
        self.0.push(b':');
        self.0.extend_from_slice(answer.trim_ascii().as_bytes());
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub(super) fn end(mut self) -> String {
        if self.0.is_empty() {
            self.0.push(b'{');
        }
        self.0.push(b'}');
        // Only UTF-8 went in: escaped keys and JSON text from a &str.
        String::from_utf8(self.0).unwrap_or_default()
    }
}

/// The answer `raw` to a question of kind `asked` under `key`, checked, as
/// the JSON the tool gets: an elicitation's as the session path passes it
/// (`action`, and `content` when accepted), a sampling or roots result as
/// the client sent it.
fn answer_of(asked: Asked, key: &str, raw: &RawValue) -> Result<String, Refusal> {
    let invalid = |m: String| Refusal::new(jsonrpc::code::INVALID_PARAMS, m);
    match asked {
        Asked::Elicitation => jsonrpc::elicitation_answer(raw).map_err(|e| {
            invalid(format!(
                "Invalid params: `inputResponses.{key}`: {}",
                e.message
            ))
        }),
        Asked::Sampling | Asked::Roots if jsonrpc::first_byte(raw) != b'{' => {
            let what = if asked == Asked::Sampling {
                "CreateMessageResult"
            } else {
                "ListRootsResult"
            };
            Err(invalid(format!(
                "Invalid params: `inputResponses.{key}` must be a {what} object"
            )))
        }
        Asked::Sampling | Asked::Roots => Ok(raw.get().to_owned()),
    }
}

/// The session id of a 2026-07-28 call with `[auth]`, kept within the
/// token's subject (`VerifiedRequest::with_session_scope`): a session-affine
/// router (`kv`) then keeps one instance, and one state, per subject, as it
/// keeps one per session in the handshake era. Without it every subject's
/// calls shared the shard's instances, and one user read what another
/// wrote. Not a client's session: it is never sent, and no HTTP session id
/// (random hex) is this text.
pub(super) const SUBJECT_SESSION: &str = "2026-07-28 subject";

/// The session scope of a call by `subject` ("" without `[auth]`).
fn scope_of(subject: &str) -> Option<&str> {
    (!subject.is_empty()).then_some(subject)
}

/// The JSON type of a property that carries `x-mcp-header`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ParamKind {
    String,
    Integer,
    Boolean,
}

/// One `x-mcp-header` of a tool's input schema: the header's name after
/// `Mcp-Param-`, and where its value sits in the arguments.
#[derive(Debug, PartialEq, Eq)]
struct ParamHeader {
    name: String,
    path: Vec<String>,
    kind: ParamKind,
}

/// The `x-mcp-header` properties of an input schema, reached through
/// chains of `properties` only (the spec's "statically reachable"). A
/// tool whose declarations the spec calls invalid (not a token, on another
/// type, a repeated name) is served without any (`route.rs`,
/// `header_declarations`); the checks here are a second guard.
fn param_headers(schema: &str) -> Vec<ParamHeader> {
    fn walk(v: &serde_json::Value, path: &mut Vec<String>, out: &mut Vec<ParamHeader>) {
        let Some(props) = v.get("properties").and_then(|p| p.as_object()) else {
            return;
        };
        for (key, prop) in props {
            path.push(key.clone());
            if let Some(name) = prop.get("x-mcp-header").and_then(|n| n.as_str()) {
                let kind = match prop.get("type").and_then(|t| t.as_str()) {
                    Some("string") => Some(ParamKind::String),
                    Some("integer") => Some(ParamKind::Integer),
                    Some("boolean") => Some(ParamKind::Boolean),
                    _ => None,
                };
                let token = !name.is_empty()
                    && name
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
                if let (Some(kind), true) = (kind, token) {
                    out.push(ParamHeader {
                        name: name.to_owned(),
                        path: path.clone(),
                        kind,
                    });
                }
            }
            walk(prop, path, out);
            path.pop();
        }
    }
    // Most schemas have none: no parse for them.
    if !schema.contains("x-mcp-header") {
        return Vec::new();
    }
    let Ok(v) = serde_json::from_str::<serde_json::Value>(schema) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    walk(&v, &mut Vec::new(), &mut out);
    let mut seen = std::collections::HashSet::new();
    let repeated: Vec<String> = out
        .iter()
        .map(|p| p.name.to_ascii_lowercase())
        .filter(|n| !seen.insert(n.clone()))
        .collect();
    out.retain(|p| !repeated.contains(&p.name.to_ascii_lowercase()));
    out
}

/// Whether an integer-typed header value equals the body's number,
/// compared numerically (`42.0` equals `42`), as the spec advises.
fn same_integer(header: &str, body: &serde_json::Value) -> bool {
    let (int, frac) = header.split_once('.').unwrap_or((header, ""));
    let digits = int.strip_prefix('-').unwrap_or(int);
    let canonical = !digits.is_empty()
        && digits.bytes().all(|b| b.is_ascii_digit())
        && frac.bytes().all(|b| b == b'0')
        && !header.ends_with('.');
    if !canonical {
        return false;
    }
    let Ok(h) = int.parse::<i64>() else {
        return false;
    };
    // An integer body compares exactly; a float one (`42.0`) only within
    // the range where f64 holds every integer, the revision's ±(2^53−1):
    // beyond it two different integers round to the same float.
    const MAX_SAFE: i64 = (1 << 53) - 1;
    match body.as_i64() {
        Some(b) => b == h,
        None => {
            h.abs() <= MAX_SAFE
                && body
                    .as_f64()
                    .is_some_and(|f| f.fract() == 0.0 && f == h as f64)
        }
    }
}

/// `Mcp-Param-*` against a `tools/call`'s arguments, for a tool whose
/// input schema is `schema` (step 2's last rule): each declared header
/// must be present, once, and equal the argument at its path when that
/// argument is present and not null, and absent otherwise. Headers no
/// schema declares are ignored (the spec: forwarded and otherwise ignored).
pub fn check_param_headers(
    h: &HeaderMap,
    schema: &str,
    arguments: Option<&RawValue>,
) -> Result<(), Refusal> {
    let declared = param_headers(schema);
    if declared.is_empty() {
        return Ok(());
    }
    let args: serde_json::Value = arguments
        .and_then(|a| serde_json::from_str(a.get()).ok())
        .unwrap_or(serde_json::Value::Null);
    let mismatch = |m: String| Refusal::new(HEADER_MISMATCH, m);
    for p in &declared {
        let header = format!("mcp-param-{}", p.name.to_ascii_lowercase());
        let shown = format!("Mcp-Param-{}", p.name);
        let value = p
            .path
            .iter()
            .try_fold(&args, |v, k| v.get(k))
            .filter(|v| !v.is_null());
        let got = one_header(h, &header)?;
        match (value, got) {
            (None, None) => {}
            (None, Some(_)) => {
                return Err(mismatch(format!(
                    "Header mismatch: the {shown} header is set but its argument `{}` is absent",
                    p.path.join(".")
                )));
            }
            (Some(v), None) => {
                return Err(mismatch(format!(
                    "Header mismatch: the {shown} header is required (argument `{}` = {v})",
                    p.path.join(".")
                )));
            }
            (Some(v), Some(got)) => {
                let same = match (p.kind, v) {
                    (ParamKind::String, serde_json::Value::String(s)) => *s == *got,
                    (ParamKind::Boolean, serde_json::Value::Bool(b)) => {
                        got == if *b { "true" } else { "false" }
                    }
                    (ParamKind::Integer, n @ serde_json::Value::Number(_)) => same_integer(&got, n),
                    // The body breaks its own schema: the router's
                    // validation answers that; the header cannot match.
                    _ => false,
                };
                if !same {
                    return Err(mismatch(format!(
                        "Header mismatch: {shown} header value '{got}' does not match body value {v}"
                    )));
                }
            }
        }
    }
    Ok(())
}

use crate::edge::{MAX_RESOURCE_SUBSCRIPTIONS, MAX_SUBSCRIBED_URI_BYTES};

/// The change notifications a `subscriptions/listen` asked for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Filter {
    pub tools: bool,
    pub prompts: bool,
    pub resources: bool,
    /// `resourceSubscriptions`: the URIs asked for (before the edge keeps
    /// those it can serve, [`HttpEdge::listen`]).
    pub uris: Vec<String>,
}

impl Filter {
    /// `params.notifications` (required, an object; absent fields are
    /// `false` or empty).
    pub fn of(params: Option<&RawValue>) -> Result<Filter, Refusal> {
        let invalid = |m: String| Refusal::new(jsonrpc::code::INVALID_PARAMS, m);
        #[derive(Deserialize)]
        struct P<'a> {
            #[serde(borrow, default)]
            notifications: Option<&'a RawValue>,
        }
        #[derive(Deserialize, Default)]
        #[serde(rename_all = "camelCase")]
        struct N {
            #[serde(default)]
            tools_list_changed: Option<bool>,
            #[serde(default)]
            prompts_list_changed: Option<bool>,
            #[serde(default)]
            resources_list_changed: Option<bool>,
            #[serde(default)]
            resource_subscriptions: Option<Vec<String>>,
        }
        let p: P<'_> = params
            .map(|p| serde_json::from_str(p.get()))
            .transpose()
            .map_err(|e| invalid(format!("Invalid params: {e}")))?
            .unwrap_or(P {
                notifications: None,
            });
        let Some(n) = p.notifications.filter(|n| first_byte(n) == b'{') else {
            return Err(invalid(
                "Invalid params: `notifications` (an object) is required".into(),
            ));
        };
        let n: N = serde_json::from_str(n.get())
            .map_err(|e| invalid(format!("Invalid params: `notifications`: {e}")))?;
        let mut uris = n.resource_subscriptions.unwrap_or_default();
        if uris.len() > MAX_RESOURCE_SUBSCRIPTIONS {
            return Err(invalid(format!(
                "Invalid params: `resourceSubscriptions` names {} URIs; at most {MAX_RESOURCE_SUBSCRIPTIONS} per listen",
                uris.len()
            )));
        }
        if uris.iter().any(|u| u.len() > MAX_SUBSCRIBED_URI_BYTES) {
            return Err(invalid(format!(
                "Invalid params: a `resourceSubscriptions` URI is longer than {MAX_SUBSCRIBED_URI_BYTES} bytes"
            )));
        }
        uris.sort_unstable();
        uris.dedup();
        Ok(Filter {
            tools: n.tools_list_changed == Some(true),
            prompts: n.prompts_list_changed == Some(true),
            resources: n.resources_list_changed == Some(true),
            uris,
        })
    }
}

/// One open `subscriptions/listen` stream.
struct Listener {
    key: u64,
    /// The listen request's id, JSON text: the subscription id.
    id: String,
    filter: Filter,
    /// The session key of the stream's own calls (with `[auth]`, its
    /// subject's [`SUBJECT_SESSION`]; none without): a session-affine
    /// router's updates are told to the streams whose state they changed.
    session: Option<Box<str>>,
    tx: super::sse::SseTx,
}

/// Every open `subscriptions/listen` stream of the process, told of route
/// table changes (`Shared::notify_list_changed`) and of resource updates
/// (`Shared::notify_resource_updated`) from any thread. Each entry is only
/// a channel into its stream: it goes when the stream does.
#[derive(Default)]
pub struct Listeners {
    open: Mutex<Vec<Listener>>,
    next: AtomicU64,
    /// Open streams with resource subscriptions: while none, an update
    /// (a write in some router) costs one load, not the lock.
    watching: AtomicUsize,
}

/// One SSE event carrying `message`.
fn sse_event(message: &[u8]) -> Bytes {
    let mut b = Vec::with_capacity(message.len() + 24);
    b.extend_from_slice(b"event: message\ndata: ");
    b.extend_from_slice(message);
    b.extend_from_slice(b"\n\n");
    Bytes::from(b)
}

/// `{"_meta":{"io.modelcontextprotocol/subscriptionId":<id>}` (left open).
fn subscription_meta(out: &mut Vec<u8>, id: &str) {
    out.extend_from_slice(b"{\"_meta\":{\"io.modelcontextprotocol/subscriptionId\":");
    out.extend_from_slice(id.as_bytes());
    out.push(b'}');
}

impl Listeners {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Listener>> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers a stream; its key, to [`Self::remove`] it.
    fn add(
        &self,
        id: &str,
        filter: Filter,
        session: Option<Box<str>>,
        tx: super::sse::SseTx,
    ) -> u64 {
        let key = self.next.fetch_add(1, Ordering::Relaxed);
        if !filter.uris.is_empty() {
            self.watching.fetch_add(1, Ordering::Relaxed);
        }
        self.lock().push(Listener {
            key,
            id: id.to_owned(),
            filter,
            session,
            tx,
        });
        key
    }

    fn remove(&self, key: u64) {
        self.lock().retain(|l| l.key != key || !self.gone(l));
    }

    /// Accounts for a listener leaving the list: `true`, for `retain`.
    fn gone(&self, l: &Listener) -> bool {
        if !l.filter.uris.is_empty() {
            self.watching.fetch_sub(1, Ordering::Relaxed);
        }
        true
    }

    /// Sends `notifications/resources/updated` for `uri` to each stream
    /// subscribed to it that `scope` reaches; streams whose client is gone
    /// are dropped.
    pub fn resource_updated(&self, uri: &str, scope: &crate::shared::UpdateScope) {
        if self.watching.load(Ordering::Relaxed) == 0 {
            return;
        }
        let mut open = self.lock();
        open.retain(|l| {
            if !scope.reaches(l.session.as_deref())
                || l.filter
                    .uris
                    .binary_search_by(|u| u.as_str().cmp(uri))
                    .is_err()
            {
                return true;
            }
            let mut m = Vec::with_capacity(160 + uri.len());
            m.extend_from_slice(
                b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/resources/updated\",\"params\":",
            );
            subscription_meta(&mut m, &l.id);
            m.extend_from_slice(b",\"uri\":");
            mcp_schema::args::write_json_string(uri, &mut m);
            m.extend_from_slice(b"}}");
            // Bounded in what its client leaves unread (`sse.rs`): it is
            // fed at the writers' rate.
            l.tx.send_bounded(sse_event(&m)) || !self.gone(l)
        });
    }

    /// Open listen streams.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Sends each stream the `list_changed` notifications of `kinds` it
    /// asked for; streams whose client is gone are dropped.
    pub fn notify(&self, kinds: ListKinds) {
        let mut open = self.lock();
        open.retain(|l| {
            for (on, method) in [
                (kinds.tools && l.filter.tools, "tools"),
                (kinds.prompts && l.filter.prompts, "prompts"),
                (kinds.resources && l.filter.resources, "resources"),
            ] {
                if !on {
                    continue;
                }
                let mut m = Vec::with_capacity(160);
                m.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/");
                m.extend_from_slice(method.as_bytes());
                m.extend_from_slice(b"/list_changed\",\"params\":");
                subscription_meta(&mut m, &l.id);
                m.extend_from_slice(b"}}");
                if !l.tx.send_bounded(sse_event(&m)) {
                    return !self.gone(l);
                }
            }
            true
        });
    }
}

// ---------------------------------------------------------------------------
// Serving (the transport half: the edge's body reading, dispatch and
// answers, shared with the session path)
// ---------------------------------------------------------------------------

/// When and by whom a request arrived.
pub(super) struct Arrival<'a> {
    pub arrived: Instant,
    pub who: Option<&'a Principal>,
}

/// `Mcp-Param-*` of a `tools/call`, checked against the called tool's
/// input schema as the route table lists it, found through the route its
/// headers picked (an unknown tool has none: its call fails later, as an
/// unknown tool).
fn param_headers_match(
    headers: &HeaderMap,
    route: Option<&HeaderRoute>,
    params: Option<&RawValue>,
) -> Result<(), Refusal> {
    let Some(route) = route else {
        return Ok(());
    };
    let schema = &route.tool().item.input_schema;
    // Most tools declare no header: no parse of the arguments for them.
    if !schema.contains("x-mcp-header") {
        return Ok(());
    }
    #[derive(Deserialize)]
    struct Args<'a> {
        #[serde(borrow, default)]
        arguments: Option<&'a RawValue>,
    }
    let args = params
        .and_then(|p| serde_json::from_str::<Args<'_>>(p.get()).ok())
        .and_then(|a| a.arguments);
    check_param_headers(headers, schema, args)
}

/// A modern refusal as its HTTP answer (the request's id echoed).
pub(super) fn refusal_response(id: Option<&Id<'_>>, r: Refusal) -> Response<Body> {
    let mut out = Vec::with_capacity(96 + r.message.len());
    jsonrpc::write_error(&mut out, id, r.code, &r.message, r.data.as_deref());
    let status = StatusCode::from_u16(r.status()).unwrap_or(StatusCode::BAD_REQUEST);
    json_response(status, out)
}

/// Messages for one request as a finished SSE body: its notifications,
/// then its answer. No event ids: 2026-07-28 has no resumption.
fn sse_body(events: &[Vec<u8>], answer: &[u8]) -> Response<Body> {
    let mut body = Vec::with_capacity(answer.len() + 64 * (events.len() + 1));
    for e in events
        .iter()
        .map(Vec::as_slice)
        .chain(std::iter::once(answer))
    {
        body.extend_from_slice(b"event: message\ndata: ");
        body.extend_from_slice(e);
        body.extend_from_slice(b"\n\n");
    }
    sse(Response::new(Body::Full(Some(Bytes::from(body)))))
}

/// An SSE response head: never cached, never buffered by a proxy (the
/// events of a live call must reach the client as they happen).
fn sse(mut r: Response<Body>) -> Response<Body> {
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, super::SSE);
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(super::ACCEL_BUFFERING, HeaderValue::from_static("no"));
    r
}

impl HttpEdge {
    /// A modern-era POST: one JSON-RPC message, served without a session.
    pub(super) async fn post_modern(
        self: Rc<Self>,
        req: Request<Incoming>,
        who: Option<&Principal>,
    ) -> Response<Body> {
        let arrived = Instant::now();
        let (headers, body) = match self.read_post(req).await {
            Ok(r) => r,
            Err(refusal) => return refusal,
        };
        // The headers pick the route before the body is parsed; the body is
        // then validated against them (issue 17; bench: http_codec's route).
        let route = HeaderRoute::pick(&headers, &self.ctx.shared.routing);
        match jsonrpc::parse(&body) {
            Err(e) => unparsable(&e),
            Ok(RpcBody::Batch(_)) => refuse(
                StatusCode::BAD_REQUEST,
                ErrorCode::InvalidRequest.code(),
                "Invalid Request: protocol 2026-07-28 has no batches; send one message per POST",
            ),
            // The revision defines no client notification over HTTP:
            // accepted and dropped, as the reference server does; but a
            // version this edge does not serve is refused whatever the
            // message, so that nothing sent with it is dropped unnoticed.
            Ok(RpcBody::One(Message::Notification { .. })) => {
                match unserved_version_header(&headers) {
                    Some(r) => refusal_response(None, r),
                    None => empty(StatusCode::ACCEPTED),
                }
            }
            Ok(RpcBody::One(Message::Response { id, .. })) => refusal_response(
                Some(&id),
                Refusal::new(
                    jsonrpc::code::INVALID_REQUEST,
                    "Invalid Request: protocol 2026-07-28 clients do not POST responses; \
                     input goes in the retried request's inputResponses",
                ),
            ),
            Ok(RpcBody::One(Message::Request { id, method, params })) => {
                let at = Arrival { arrived, who };
                self.modern_routed(&headers, route.as_ref(), &id, &method, params, at)
                    .await
            }
        }
    }

    /// The `cacheScope` of cacheable answers: with [auth] what a client
    /// sees depends on its token, so caches must not share listings.
    fn cache_scope(&self) -> &'static str {
        if self.ctx.shared.auth.is_some() {
            "private"
        } else {
            "public"
        }
    }

    /// One modern request that no route was picked for (a header-less
    /// `server/discover` on the session path), validated and answered.
    pub(super) async fn modern_request(
        self: &Rc<Self>,
        headers: &HeaderMap,
        id: &Id<'_>,
        method: &str,
        params: Option<&RawValue>,
        arrived: Instant,
        who: Option<&Principal>,
    ) -> Response<Body> {
        let at = Arrival { arrived, who };
        self.modern_routed(headers, None, id, method, params, at)
            .await
    }

    /// One modern request, validated in the spec's order (module doc),
    /// then answered. `route`: what its headers picked ([`HeaderRoute`]),
    /// which the body, once validated against the headers, agrees with.
    async fn modern_routed(
        self: &Rc<Self>,
        headers: &HeaderMap,
        route: Option<&HeaderRoute>,
        id: &Id<'_>,
        method: &str,
        params: Option<&RawValue>,
        at: Arrival<'_>,
    ) -> Response<Body> {
        let Arrival { arrived, who } = at;
        if let Some(r) = unserved_version_header(headers) {
            return refusal_response(Some(id), r);
        }
        let d = match declared(method, params) {
            Ok(d) => d,
            Err(r) => {
                if r.message == STATE_NOT_A_STRING {
                    self.ctx
                        .shared
                        .request_states
                        .count_refusal(Refused::Malformed);
                }
                return refusal_response(Some(id), r);
            }
        };
        if let Err(r) = check_headers(headers, method, &d).and_then(|()| check_version(&d)) {
            return refusal_response(Some(id), r);
        }
        if !served(method) {
            return refusal_response(
                Some(id),
                Refusal::new(
                    jsonrpc::code::METHOD_NOT_FOUND,
                    format!("Method not found: {method} (not served in protocol 2026-07-28)"),
                ),
            );
        }
        if method == "tools/call"
            && let Err(r) = param_headers_match(headers, route, params)
        {
            return refusal_response(Some(id), r);
        }
        if let Some(r) = self.tool_refusal(who, method, params) {
            return r;
        }
        let scope = self.cache_scope();
        if method == "server/discover" {
            return self.discover(id, &d, arrived, scope).await;
        }
        if method == "subscriptions/listen" {
            return self.listen(id, params, who);
        }
        let live = route.is_some_and(HeaderRoute::reports_live);
        let r = self
            .modern_call(id, method, params, &d, Arrival { arrived, who }, live)
            .await;
        match (method, who, &self.ctx.shared.auth) {
            ("tools/list", Some(p), Some(auth)) => hide_tools(r, |t| auth.allows_tool(p, t)),
            _ => r,
        }
    }

    /// `server/discover`: the capabilities `initialize` would report, as a
    /// DiscoverResult (the same Initialize frame runs through dispatch).
    async fn discover(
        &self,
        id: &Id<'_>,
        d: &Declared<'_>,
        arrived: Instant,
        scope: &str,
    ) -> Response<Body> {
        let frame = {
            let h = self.header(None);
            let mut enc = self.enc.borrow_mut();
            Bytes::copy_from_slice(enc.initialize(
                &h,
                jsonrpc::frame_version(super::LATEST),
                d.client_name.as_deref().unwrap_or(""),
                d.client_version.as_deref().unwrap_or(""),
            ))
        };
        let called = self.run(frame, arrived, None, None, None, None).await;
        let mut out = Vec::with_capacity(384);
        match frames(&called.frames).last() {
            // list_changed is delivered on `subscriptions/listen` (the
            // route table's changes); resource updates when some router
            // tells them.
            Some(fin) => {
                let subscribes = self.tells_resource_updates(None);
                jsonrpc::write_discover(&mut out, id, fin, &SUPPORTED, scope, true, subscribes)
            }
            None => jsonrpc::write_error(
                &mut out,
                Some(id),
                ErrorCode::Internal.code(),
                "no answer",
                None,
            ),
        }
        json_response(StatusCode::OK, out)
    }

    /// Whether updates of resource `uri` reach listen streams: it routes to
    /// a router that declares `resources.subscribe` and can tell them (it
    /// imports `mcp-broker:host/call`, whose `resource-updated` it calls).
    /// `None`: whether any router can.
    fn tells_resource_updates(&self, uri: Option<&str>) -> bool {
        let routing = self.ctx.shared.routing.load();
        let tells = |r: &crate::routing::Routed| {
            r.router.reports_live()
                && r.router
                    .meta()
                    .server
                    .as_ref()
                    .and_then(|s| s.capabilities.resources.as_ref())
                    .and_then(|c| c.subscribe)
                    .unwrap_or(false)
        };
        match uri {
            Some(u) => routing
                .table
                .resource(u)
                .is_some_and(|r| tells(&routing.routers[r as usize])),
            None => routing.routers.iter().any(tells),
        }
    }

    /// `subscriptions/listen`: the acknowledgment, then the stream stays
    /// open for the notifications asked for (module doc).
    fn listen(
        self: &Rc<Self>,
        id: &Id<'_>,
        params: Option<&RawValue>,
        who: Option<&Principal>,
    ) -> Response<Body> {
        let mut filter = match Filter::of(params) {
            Ok(f) => f,
            Err(r) => return refusal_response(Some(id), r),
        };
        // Only URIs whose router can tell their updates are honoured; the
        // acknowledgment says which.
        filter.uris.retain(|u| self.tells_resource_updates(Some(u)));
        let (tx, rx) = super::sse::channel();
        let tx = tx.counting_cuts(self.ctx.shared.http_listen_streams_cut.clone());
        let mut ack = Vec::with_capacity(256);
        ack.extend_from_slice(
            b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/subscriptions/acknowledged\",\"params\":",
        );
        subscription_meta(&mut ack, id.get());
        ack.extend_from_slice(b",\"notifications\":{");
        let honored = [
            (filter.tools, "toolsListChanged"),
            (filter.prompts, "promptsListChanged"),
            (filter.resources, "resourcesListChanged"),
        ];
        let mut first = true;
        for (on, key) in honored {
            if on {
                if !first {
                    ack.push(b',');
                }
                first = false;
                ack.extend_from_slice(format!("\"{key}\":true").as_bytes());
            }
        }
        if !filter.uris.is_empty() {
            if !first {
                ack.push(b',');
            }
            ack.extend_from_slice(b"\"resourceSubscriptions\":[");
            for (i, u) in filter.uris.iter().enumerate() {
                if i > 0 {
                    ack.push(b',');
                }
                mcp_schema::args::write_json_string(u, &mut ack);
            }
            ack.push(b']');
        }
        ack.extend_from_slice(b"}}}");
        tx.send(sse_event(&ack));
        let listeners = self.sessions().listeners();
        // The key its calls reach a session-affine router by (`modern_call`).
        let session = who.map(|p| {
            mcp_schema::verify::session_key_within(scope_of(&p.subject), SUBJECT_SESSION).into()
        });
        let key = listeners.add(id.get(), filter, session, tx.clone());
        let until = who.and_then(Principal::stream_deadline);
        monoio::spawn(listen_keep_alive(
            self.clone(),
            key,
            id.get().to_owned(),
            tx,
            until,
        ));
        let open = super::OpenStream::count(self, super::StreamKind::Listen);
        sse(Response::new(Body::Sse(rx, open)))
    }

    /// A routed request of the modern era: run without a session; an
    /// `elicit` answer (or a result asking for sampling) becomes an
    /// `InputRequiredResult`, a retry's `inputResponses` the argument the
    /// session path would pass (module doc). Progress and log notifications
    /// the request asked for go before the answer on an SSE body: as they
    /// happen when its router reports them live (`reports_live`, from the
    /// route its headers picked; [`Self::modern_live`]), else all together
    /// with the answer.
    async fn modern_call(
        self: &Rc<Self>,
        id: &Id<'_>,
        method: &str,
        params: Option<&RawValue>,
        d: &Declared<'_>,
        at: Arrival<'_>,
        reports_live: bool,
    ) -> Response<Body> {
        let Arrival { arrived, who } = at;
        let Some(m) = Method::from_name(method) else {
            let r = Refusal::new(
                jsonrpc::code::METHOD_NOT_FOUND,
                format!("Method not found: {method}"),
            );
            return refusal_response(Some(id), r);
        };
        // Only a tool call can be re-called with an answer (the router
        // world elicits from call-tool alone), and only its requestState
        // is opened: the answer, and the router's state, become arguments.
        let subject = who.map_or("", |p| p.subject.as_str());
        let mut extra: Vec<(&str, String)> = Vec::new();
        if m == Method::CallTool {
            let asked = match d.request_state.as_deref() {
                None => None,
                Some(token) => {
                    let tool = d.name.as_deref().unwrap_or_default();
                    match self.ctx.shared.request_states.open(token, tool, subject) {
                        Ok(q) => Some(q),
                        Err(why) => {
                            let r = Refusal::new(
                                jsonrpc::code::INVALID_PARAMS,
                                format!("Invalid params: {why}"),
                            );
                            return refusal_response(Some(id), r);
                        }
                    }
                }
            };
            match retry_arguments(d.input_responses, asked) {
                Ok(e) => extra = e,
                Err(r) => return refusal_response(Some(id), r),
            }
        }
        let built = {
            // With `[auth]`, a session-affine router's state is the
            // subject's: every call of one subject reaches one instance,
            // and no other subject's ([`SUBJECT_SESSION`]).
            let h = self.header(who.map(|_| SUBJECT_SESSION));
            let mut enc = self.enc.borrow_mut();
            let extra: Vec<(&str, &str)> = extra.iter().map(|(k, v)| (*k, v.as_str())).collect();
            jsonrpc::request_frame(&mut enc, &h, m, params, &extra)
                .map(|(f, info)| (Bytes::copy_from_slice(f), info))
        };
        let (frame, info) = match built {
            Ok(b) => b,
            Err(e) => {
                return refusal_response(
                    Some(id),
                    Refusal {
                        code: e.code,
                        message: e.message,
                        data: e.data,
                    },
                );
            }
        };
        let wants = Wants::of(d, cacheable(method).then(|| self.cache_scope()));
        if reports_live && (info.progress_token.is_some() || wants.log_level.is_some()) {
            return self.modern_live(id, frame, &info, wants, arrived, subject);
        }
        let called = self
            .run(frame, arrived, None, None, None, scope_of(subject))
            .await;
        let mut events = Vec::new();
        let mut out = Vec::with_capacity(256);
        let seal = Seal {
            states: &self.ctx.shared.request_states,
            subject,
        };
        if let Err(r) = conclude(&mut events, &mut out, id, &info, &wants, &called, &seal) {
            called.answered(r.code);
            return refusal_response(Some(id), r);
        }
        if events.is_empty() {
            json_response(StatusCode::OK, out)
        } else {
            sse_body(&events, &out)
        }
    }

    /// Answers a call on an SSE stream opened at once: its progress and
    /// logs are sent as the router reports them, then its answer (or
    /// `InputRequiredResult`, or error) ends the stream. Nothing is kept
    /// but the task and its channel; when the client closes the stream the
    /// body's guard cancels the call in the guest.
    fn modern_live(
        self: &Rc<Self>,
        id: &Id<'_>,
        frame: Bytes,
        info: &jsonrpc::RequestInfo<'_>,
        wants: Wants,
        arrived: Instant,
        subject: &str,
    ) -> Response<Body> {
        let (tx, rx) = mpsc::unbounded();
        let subject = subject.to_owned();
        let cancel = std::sync::Arc::new(super::session::Cancel::default());
        let guard = CancelOnClose(cancel.clone());
        let edge = self.clone();
        let id = id.0.to_owned();
        let method = info.method;
        let name = info.tool_name.as_deref().map(str::to_owned);
        let token = info.progress_token.map(ToOwned::to_owned);
        monoio::spawn(async move {
            let live = ModernLive {
                tx,
                progress_token: token,
                log_level: wants.log_level,
            };
            let called = edge
                .run(
                    frame,
                    arrived,
                    Some(&cancel),
                    Some(&live),
                    None,
                    scope_of(&subject),
                )
                .await;
            if cancel.is_cancelled() {
                // The stream is gone: there is no one to answer. Closing
                // it cancelled the call, and it counts so.
                called.answered(super::REQUEST_CANCELLED);
                return;
            }
            let mut info = jsonrpc::RequestInfo::new(method);
            info.tool_name = name.as_deref().map(Cow::Borrowed);
            info.progress_token = live.progress_token.as_deref();
            let id = Id(&id);
            let mut events = Vec::new();
            let mut out = Vec::with_capacity(256);
            let seal = Seal {
                states: &edge.ctx.shared.request_states,
                subject: &subject,
            };
            if let Err(r) = conclude(&mut events, &mut out, &id, &info, &wants, &called, &seal) {
                // The status line is sent: the refusal is the answer.
                called.answered(r.code);
                out.clear();
                jsonrpc::write_error(&mut out, Some(&id), r.code, &r.message, r.data.as_deref());
            }
            for e in events
                .iter()
                .map(Vec::as_slice)
                .chain(std::iter::once(&out[..]))
            {
                if live.tx.unbounded_send(sse_event(e)).is_err() {
                    break;
                }
            }
        });
        let open = super::OpenStream::count(self, super::StreamKind::Call);
        sse(Response::new(Body::Call(rx, guard, open)))
    }
}

/// What a modern request asked to receive besides its answer, and how its
/// answer is marked: all it needs once its call has run.
#[derive(Clone, Copy)]
struct Wants {
    /// `_meta`'s log level: the request's opt-in to log notifications.
    log_level: Option<&'static str>,
    elicitation: bool,
    sampling: bool,
    roots: bool,
    /// The caching scope of a cacheable result.
    cache_scope: Option<&'static str>,
}

impl Wants {
    fn of(d: &Declared<'_>, cache_scope: Option<&'static str>) -> Self {
        Self {
            log_level: d.log_level,
            elicitation: d.elicitation,
            sampling: d.sampling,
            roots: d.roots,
            cache_scope,
        }
    }
}

/// What seals a router's state into an `InputRequiredResult`'s
/// `requestState`: the broker's key, and the caller it is bound to.
struct Seal<'a> {
    states: &'a RequestStates,
    /// The token's subject (`[auth]`), "" without auth.
    subject: &'a str,
}

impl Seal<'_> {
    /// The `inputRequests` key of the question in `frame` (the router's
    /// choice, else the default of its kind), and its `requestState` when
    /// the router attached a state or chose the key (the retry's answer is
    /// read under the key the token names). `Err` with the error's message
    /// when the router's key or state cannot travel.
    fn question(
        &self,
        tool: &str,
        frame: &[u8],
        asked: Asked,
    ) -> Result<(String, Option<String>), String> {
        let default = match asked {
            Asked::Elicitation => ELICITATION_KEY,
            Asked::Sampling => SAMPLING_KEY,
            Asked::Roots => ROOTS_KEY,
        };
        let key = jsonrpc::router_input_key(frame);
        if let Some(k) = &key
            && (k.is_empty() || k.len() > MAX_INPUT_KEY_BYTES)
        {
            return Err(format!(
                "the router's input key for `{tool}` must be 1 to {MAX_INPUT_KEY_BYTES} bytes long, not {}",
                k.len()
            ));
        }
        let key = key.unwrap_or(Cow::Borrowed(default));
        let state = router_state_within(tool, frame)?;
        let token = (state.is_some() || key != default).then(|| {
            let q = Question::one(asked, &*key, state.as_deref());
            self.states.seal(tool, self.subject, &q)
        });
        Ok((key.into_owned(), token))
    }

    /// The `requestState` of a set of questions asked by the result
    /// `frame`: always issued, since it names the keys and kinds the
    /// retry's answers are read by. `Err` when the router's state cannot
    /// travel.
    fn set(
        &self,
        tool: &str,
        frame: &[u8],
        set: &[jsonrpc::InputRequest<'_>],
    ) -> Result<String, String> {
        let state = router_state_within(tool, frame)?;
        let q = Question {
            asks: set.iter().map(|q| (q.asked, &*q.key)).collect(),
            many: true,
            state: state.as_deref(),
        };
        Ok(self.states.seal(tool, self.subject, &q))
    }
}

/// The state the router attached to the question in `frame`, if any;
/// `Err` when it is too large to travel as `requestState`.
fn router_state_within<'f>(tool: &str, frame: &'f [u8]) -> Result<Option<Cow<'f, str>>, String> {
    let state = jsonrpc::router_state(frame);
    if let Some(state) = &state
        && state.len() > MAX_STATE_BYTES
    {
        return Err(format!(
            "the router's state for `{tool}` is {} bytes; at most {MAX_STATE_BYTES} travel as requestState",
            state.len()
        ));
    }
    Ok(state)
}

/// Whether the client declared what a question of kind `asked` needs, and
/// the refusal when it did not.
fn capable(wants: &Wants, asked: Asked) -> Result<(), Refusal> {
    let (declared, capability, what) = match asked {
        Asked::Elicitation => (wants.elicitation, "elicitation", "asks the user for input"),
        Asked::Sampling => (
            wants.sampling,
            "sampling",
            "asks the client's model for a completion",
        ),
        Asked::Roots => (wants.roots, "roots", "asks for the client's roots"),
    };
    if declared {
        Ok(())
    } else {
        Err(missing_capability(capability, what))
    }
}

/// A ran modern call's messages: its progress and log notifications the
/// request asked for into `events` (those its router left with the answer;
/// live ones were sent already), its answer into `out`. `Err` when the
/// router needs a capability the client did not declare (-32021).
fn conclude(
    events: &mut Vec<Vec<u8>>,
    out: &mut Vec<u8>,
    id: &Id<'_>,
    info: &jsonrpc::RequestInfo<'_>,
    wants: &Wants,
    called: &super::Called,
    seal: &Seal<'_>,
) -> Result<(), Refusal> {
    let (mut elicit, mut fin) = (None, None);
    for f in frames(&called.frames) {
        match jsonrpc::frame_kind(f) {
            FrameKind::Progress => {
                let mut b = Vec::with_capacity(128);
                if let Some(t) = info.progress_token
                    && jsonrpc::write_progress(&mut b, t, f)
                {
                    events.push(b);
                }
            }
            // Logs only for a request that opted in (its `_meta` log
            // level): 2026-07-28 forbids them otherwise.
            FrameKind::Log => {
                let mut b = Vec::with_capacity(128);
                if let Some(l) = wants.log_level
                    && jsonrpc::log_level_of(f).is_some_and(|at| level_allows(l, at))
                    && jsonrpc::write_log(&mut b, f)
                {
                    events.push(b);
                }
            }
            FrameKind::ResourceUpdated => {}
            FrameKind::Elicitation => elicit = Some(f),
            FrameKind::Final => fin = Some(f),
        }
    }
    let tool = info.tool_name.as_deref().unwrap_or_default();
    // The client gets -32603 where the question cannot be sealed: the
    // request counts so, not as the router's question (`Record`).
    let internal = |out: &mut Vec<u8>, m: &str| {
        called.answered(ErrorCode::Internal.code());
        jsonrpc::write_error(out, Some(id), ErrorCode::Internal.code(), m, None);
    };
    if let Some(f) = elicit {
        capable(wants, Asked::Elicitation)?;
        match seal.question(tool, f, Asked::Elicitation) {
            Ok((key, token)) => {
                jsonrpc::write_input_required_elicitation(out, id, &key, f, token.as_deref());
            }
            Err(m) => internal(out, &m),
        }
    } else if let Some((f, set)) = fin
        .filter(|f| jsonrpc::result_asks(f))
        .and_then(|f| Some((f, jsonrpc::input_requests(f)?)))
    {
        let cannot = |m: String| format!("the tool `{tool}` asked what cannot be asked: {m}");
        match set {
            Ok(set) => {
                // A set is asked whole or not at all: every question's
                // capability first.
                for q in &set {
                    capable(wants, q.asked)?;
                }
                match seal.set(tool, f, &set) {
                    Ok(token) => jsonrpc::write_input_required_set(out, id, &set, &token),
                    Err(m) => internal(out, &cannot(m)),
                }
            }
            Err(m) => internal(out, &cannot(m)),
        }
    } else if let Some((f, asked, params)) = fin.filter(|f| jsonrpc::result_asks(f)).and_then(|f| {
        // A result asks one question: sampling before roots.
        let (asked, p) = match (jsonrpc::sampling_request(f), jsonrpc::roots_request(f)) {
            (Some(p), _) => (Asked::Sampling, p),
            (None, Some(p)) => (Asked::Roots, p),
            (None, None) => return None,
        };
        Some((f, asked, p))
    }) {
        capable(wants, asked)?;
        let method = match asked {
            Asked::Roots => "roots/list",
            _ => "sampling/createMessage",
        };
        match seal.question(tool, f, asked) {
            Ok((key, token)) => jsonrpc::write_input_required_request(
                out,
                id,
                &key,
                method,
                params,
                token.as_deref(),
            ),
            Err(m) => internal(out, &m),
        }
    } else if let Some(f) = fin {
        match called.answer() {
            // The common case: the answer ends the call.
            Some((last, resp)) if std::ptr::eq(last, f) => {
                // SAFETY: read by `built_response` from the call's own frames.
                unsafe { jsonrpc::write_response_of(out, id, info, resp, MODERN_VERSION) };
            }
            _ => jsonrpc::write_response_for(out, id, info, f, MODERN_VERSION),
        }
        jsonrpc::mark_complete(out, id, wants.cache_scope);
    } else {
        internal(out, "no answer");
    }
    Ok(())
}

/// Cancels a live 2026-07-28 call when its response body is dropped:
/// the client closed the stream (or the connection), or the answer was
/// sent, when cancelling is a no-op.
pub struct CancelOnClose(std::sync::Arc<super::session::Cancel>);

impl Drop for CancelOnClose {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

/// A live call's progress and log frames, sent on its own stream as
/// notifications as the router reports them (`dispatch::LiveOut`).
struct ModernLive {
    tx: mpsc::UnboundedSender<Bytes>,
    progress_token: Option<Box<RawValue>>,
    log_level: Option<&'static str>,
}

impl LiveOut for ModernLive {
    fn frame(&self, frame: &[u8]) {
        let mut buf = Vec::with_capacity(128);
        let wanted = match jsonrpc::frame_kind(frame) {
            FrameKind::Progress => self
                .progress_token
                .as_deref()
                .is_some_and(|t| jsonrpc::write_progress(&mut buf, t, frame)),
            FrameKind::Log => {
                self.log_level.is_some_and(|l| {
                    jsonrpc::log_level_of(frame).is_some_and(|at| level_allows(l, at))
                }) && jsonrpc::write_log(&mut buf, frame)
            }
            _ => false,
        };
        if wanted {
            // A closed stream: the body's guard cancels the call.
            let _ = self.tx.unbounded_send(sse_event(&buf));
        }
    }
}

/// `notifications/cancelled` for listen request `id`, with `reason` (a
/// JSON string's contents): how a server tearing a listen stream down
/// tells its client (the revision's cancellation page: a MUST).
fn listen_cancelled(id: &str, reason: &str) -> Bytes {
    let mut bye = Vec::with_capacity(160 + reason.len());
    bye.extend_from_slice(
        b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/cancelled\",\"params\":{\"requestId\":",
    );
    bye.extend_from_slice(id.as_bytes());
    bye.extend_from_slice(b",\"reason\":\"");
    bye.extend_from_slice(reason.as_bytes());
    bye.extend_from_slice(b"\",\"_meta\":{\"io.modelcontextprotocol/subscriptionId\":");
    bye.extend_from_slice(id.as_bytes());
    bye.extend_from_slice(b"}}}");
    sse_event(&bye)
}

/// Keeps a listen stream alive with comments until its client goes (a
/// send fails), the drain begins, when the stream ends with the listen
/// request's result, as the spec's graceful close, or the token that
/// opened it expires (`until`, with `[auth]`), when it ends cancelled (the
/// token is checked once per request, and this one would otherwise hear
/// its subject's updates without limit; the client listens again with a
/// fresh token); then unregisters it.
async fn listen_keep_alive(
    edge: Rc<HttpEdge>,
    key: u64,
    id: String,
    tx: super::sse::SseTx,
    until: Option<Instant>,
) {
    loop {
        monoio::select! {
            _ = monoio::time::sleep(super::next_wake(edge.cfg.sse_keepalive, until)) => {}
            _ = edge.draining.wait() => {
                // The revision asks for both, on two pages: cancellation
                // says a server tearing a listen stream down MUST send
                // `notifications/cancelled` for it, subscriptions that it
                // SHOULD answer the listen request ("graceful closure").
                // The notice goes first, as the answer ends the request.
                tx.send(listen_cancelled(&id, "the broker is shutting down"));
                let mut fin = Vec::with_capacity(160);
                fin.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"id\":");
                fin.extend_from_slice(id.as_bytes());
                fin.extend_from_slice(b",\"result\":{\"resultType\":\"complete\",\"_meta\":{\"io.modelcontextprotocol/subscriptionId\":");
                fin.extend_from_slice(id.as_bytes());
                fin.push(b',');
                fin.extend_from_slice(jsonrpc::SERVER_INFO_MEMBER.as_bytes());
                fin.extend_from_slice(b"}}}");
                tx.send(sse_event(&fin));
                break;
            }
        }
        if until.is_some_and(|t| Instant::now() >= t) {
            // Unregistered first: nothing more reaches the stream.
            edge.sessions().listeners().remove(key);
            tx.send(listen_cancelled(
                &id,
                "the access token expired: listen again with a fresh one",
            ));
            return;
        }
        if !tx.send_bounded(Bytes::from_static(b": keep-alive\n\n")) {
            break;
        }
    }
    edge.sessions().listeners().remove(key);
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::header::HeaderValue;

    fn raw(s: &str) -> Box<RawValue> {
        RawValue::from_string(s.to_owned()).unwrap()
    }

    #[test]
    fn header_values_decode_the_base64_sentinel_and_trim_whitespace() {
        assert_eq!(decode_header_value("  foo ").unwrap(), "foo");
        assert_eq!(
            decode_header_value("=?base64?SGVsbG8sIOS4lueVjA==?=").unwrap(),
            "Hello, 世界"
        );
        assert_eq!(
            decode_header_value("=?base64?IHBhZGRlZCA=?=").unwrap(),
            " padded "
        );
        assert_eq!(
            decode_header_value("=?base64?PT9iYXNlNjQ/bGl0ZXJhbD89?=").unwrap(),
            "=?base64?literal?="
        );
        // The sentinel is case-sensitive; without it the value is literal.
        assert_eq!(
            decode_header_value("=?BASE64?SGVsbG8=?=").unwrap(),
            "=?BASE64?SGVsbG8=?="
        );
        assert_eq!(
            decode_header_value("=?base64?SGVsbG8=").unwrap(),
            "=?base64?SGVsbG8="
        );
        // Bad padding, characters outside the alphabet: refused.
        assert!(decode_header_value("=?base64?SGVsbG8?=").is_err());
        assert!(decode_header_value("=?base64?SGVs!!!bG8=?=").is_err());
        assert!(decode_header_value("=?base64?/w==?=").is_err(), "not UTF-8");
    }

    #[test]
    fn only_a_present_non_handshake_version_header_is_modern() {
        let mut h = HeaderMap::new();
        assert!(!is_modern(&h));
        h.insert(VERSION_HEADER, HeaderValue::from_static("2025-06-18"));
        assert!(!is_modern(&h));
        h.insert(VERSION_HEADER, HeaderValue::from_static("2026-07-28"));
        assert!(is_modern(&h));
        h.insert(VERSION_HEADER, HeaderValue::from_static("v999.0.0"));
        assert!(is_modern(&h));
    }

    const META: &str = r#""_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{"elicitation":{}}}"#;

    #[test]
    fn meta_is_required_before_any_header_is_compared() {
        for p in [
            "{}".to_owned(),
            r#"{"_meta":{}}"#.to_owned(),
            r#"{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}"#.to_owned(),
            r#"{"_meta":{"io.modelcontextprotocol/clientCapabilities":{}}}"#.to_owned(),
        ] {
            let p = raw(&p);
            let e = declared("tools/list", Some(&p)).unwrap_err();
            assert_eq!(e.code, -32602, "{p}");
        }
        let p = raw(&format!(r#"{{{META},"name":"echo"}}"#));
        let d = declared("tools/call", Some(&p)).unwrap();
        assert_eq!(
            (&*d.version, d.elicitation, d.sampling),
            ("2026-07-28", true, false)
        );
        assert_eq!(d.name.as_deref(), Some("echo"));
    }

    #[test]
    fn headers_are_compared_with_the_body_in_order() {
        let p = raw(&format!(r#"{{{META},"name":"Hello, 世界"}}"#));
        let d = declared("tools/call", Some(&p)).unwrap();
        let mut h = HeaderMap::new();
        let code = |h: &HeaderMap| check_headers(h, "tools/call", &d).map_err(|e| e.code);
        assert_eq!(code(&h), Err(-32020));
        h.insert(VERSION_HEADER, HeaderValue::from_static("2026-07-28"));
        h.insert(METHOD_HEADER, HeaderValue::from_static("TOOLS/CALL"));
        assert_eq!(code(&h), Err(-32020), "values are case-sensitive");
        h.insert(METHOD_HEADER, HeaderValue::from_static("tools/call"));
        assert_eq!(code(&h), Err(-32020), "Mcp-Name missing");
        h.insert(NAME_HEADER, HeaderValue::from_static("Hello"));
        assert_eq!(code(&h), Err(-32020));
        h.insert(
            NAME_HEADER,
            HeaderValue::from_static("=?base64?SGVsbG8sIOS4lueVjA==?="),
        );
        assert_eq!(code(&h), Ok(()));
        // The sentinel is for Mcp-Name (and Mcp-Param-*) only: a method or
        // version header encoded with it is another value than the body's.
        h.insert(
            METHOD_HEADER,
            HeaderValue::from_static("=?base64?dG9vbHMvY2FsbA==?="),
        );
        assert_eq!(code(&h), Err(-32020), "Mcp-Method is never decoded");
        h.insert(METHOD_HEADER, HeaderValue::from_static("tools/call"));
        h.insert(
            VERSION_HEADER,
            HeaderValue::from_static("=?base64?MjAyNi0wNy0yOA==?="),
        );
        assert_eq!(code(&h), Err(-32020), "nor is MCP-Protocol-Version");
        h.insert(VERSION_HEADER, HeaderValue::from_static("2026-07-28"));
        assert_eq!(code(&h), Ok(()));
        h.append(NAME_HEADER, HeaderValue::from_static("x"));
        assert_eq!(code(&h), Err(-32020), "repeated");
    }

    /// A route table of one router `r` serving `tools`.
    fn table(tools: &[&str]) -> RouteTable {
        use crate::wasm::types::Tool;
        let meta = crate::wasm::RouterMeta {
            name: "r".into(),
            tools: tools
                .iter()
                .map(|t| Tool {
                    name: (*t).into(),
                    title: None,
                    description: String::new(),
                    input_schema: "{}".into(),
                    output_schema: None,
                    annotations: None,
                    meta: None,
                })
                .collect(),
            ..Default::default()
        };
        let entry = crate::route::RouterEntry {
            name: "r".into(),
            prefix: None,
            meta: std::sync::Arc::new(meta),
        };
        RouteTable::build(&[entry], "__").unwrap()
    }

    #[test]
    fn the_headers_of_a_tool_call_pick_its_route_before_the_body() {
        let t = table(&["echo", "Hello, 世界"]);
        let mut h = HeaderMap::new();
        h.insert(METHOD_HEADER, HeaderValue::from_static("tools/call"));
        assert_eq!(route_from_headers(&h, &t), None, "no Mcp-Name");
        h.insert(NAME_HEADER, HeaderValue::from_static(" echo "));
        assert_eq!(route_from_headers(&h, &t).map(|r| r.listed), Some(0));
        h.insert(
            NAME_HEADER,
            HeaderValue::from_static("=?base64?SGVsbG8sIOS4lueVjA==?="),
        );
        let r = route_from_headers(&h, &t).unwrap();
        assert_eq!((r.router, &*r.name, r.listed), (0, "Hello, 世界", 1));
        h.append(NAME_HEADER, HeaderValue::from_static("echo"));
        assert_eq!(route_from_headers(&h, &t), None, "repeated");
        h.insert(NAME_HEADER, HeaderValue::from_static("nope"));
        assert_eq!(route_from_headers(&h, &t), None, "unknown tool");
        h.insert(NAME_HEADER, HeaderValue::from_static("echo"));
        h.insert(
            METHOD_HEADER,
            HeaderValue::from_static("=?base64?dG9vbHMvY2FsbA==?="),
        );
        assert_eq!(
            route_from_headers(&h, &t),
            None,
            "Mcp-Method is not decoded"
        );
        h.insert(METHOD_HEADER, HeaderValue::from_static("prompts/get"));
        assert_eq!(route_from_headers(&h, &t), None, "not a tool call");
    }

    #[test]
    fn an_unserved_version_lists_what_is_served() {
        let p = raw(
            r#"{"_meta":{"io.modelcontextprotocol/protocolVersion":"v999.0.0","io.modelcontextprotocol/clientCapabilities":{}}}"#,
        );
        let d = declared("tools/list", Some(&p)).unwrap();
        let e = check_version(&d).unwrap_err();
        assert_eq!(e.code, -32022);
        let data: serde_json::Value = serde_json::from_str(e.data.as_deref().unwrap()).unwrap();
        assert_eq!(data["requested"], "v999.0.0");
        assert_eq!(data["supported"][0], "2026-07-28");
    }

    #[test]
    fn mcp_param_headers_follow_the_tool_schema() {
        let schema = r#"{"type":"object","properties":{
            "region":{"type":"string","x-mcp-header":"Region"},
            "n":{"type":"integer","x-mcp-header":"N"},
            "deep":{"type":"object","properties":{"on":{"type":"boolean","x-mcp-header":"On"}}},
            "f":{"type":"number","x-mcp-header":"F"},
            "list":{"type":"array","items":{"type":"string","x-mcp-header":"Item"}}}}"#;
        let mut names: Vec<_> = param_headers(schema).into_iter().map(|p| p.name).collect();
        names.sort();
        assert_eq!(
            names,
            ["N", "On", "Region"],
            "number and items-reachable ones are skipped"
        );
        let args = raw(r#"{"region":"us-west1","n":42,"deep":{"on":true},"f":1.5}"#);
        let mut h = HeaderMap::new();
        let check = |h: &HeaderMap| check_param_headers(h, schema, Some(&args)).map_err(|e| e.code);
        assert_eq!(check(&h), Err(-32020), "missing");
        h.insert("mcp-param-region", HeaderValue::from_static("us-west1"));
        h.insert("mcp-param-n", HeaderValue::from_static("42.0"));
        h.insert("mcp-param-on", HeaderValue::from_static("true"));
        assert_eq!(check(&h), Ok(()), "integers compare numerically");
        h.insert("mcp-param-n", HeaderValue::from_static("43"));
        assert_eq!(check(&h), Err(-32020));
        // Integers that one f64 cannot tell apart are still different.
        let big = raw(r#"{"region":"us-west1","n":9007199254740993,"deep":{"on":true}}"#);
        h.insert("mcp-param-n", HeaderValue::from_static("9007199254740992"));
        assert_eq!(
            check_param_headers(&h, schema, Some(&big)).map_err(|e| e.code),
            Err(-32020)
        );
        h.insert("mcp-param-n", HeaderValue::from_static("9007199254740993"));
        assert_eq!(
            check_param_headers(&h, schema, Some(&big)).map_err(|e| e.code),
            Ok(())
        );
        h.insert("mcp-param-n", HeaderValue::from_static("42"));
        h.insert(
            "mcp-param-region",
            HeaderValue::from_static("=?base64?dXMtd2VzdDE=?="),
        );
        assert_eq!(check(&h), Ok(()), "base64-encoded");
        h.insert("mcp-param-on", HeaderValue::from_static("false"));
        assert_eq!(check(&h), Err(-32020));
        // An absent or null argument: no header expected, none accepted.
        let args = raw(r#"{"region":null,"n":42,"deep":{"on":true}}"#);
        let mut h = HeaderMap::new();
        h.insert("mcp-param-n", HeaderValue::from_static("42"));
        h.insert("mcp-param-on", HeaderValue::from_static("true"));
        assert_eq!(
            check_param_headers(&h, schema, Some(&args)).map_err(|e| e.code),
            Ok(())
        );
        h.insert("mcp-param-region", HeaderValue::from_static("x"));
        assert_eq!(
            check_param_headers(&h, schema, Some(&args)).map_err(|e| e.code),
            Err(-32020)
        );
        // No declaration: nothing checked.
        assert_eq!(
            check_param_headers(&h, "{}", Some(&args)).map_err(|e| e.code),
            Ok(())
        );
    }

    #[test]
    fn results_are_marked_complete_and_errors_are_left_alone() {
        let id = raw("7");
        let id = Id(&id);
        let mut out = br#"{"jsonrpc":"2.0","id":7,"result":{}}"#.to_vec();
        jsonrpc::mark_complete(&mut out, &id, None);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#"{"jsonrpc":"2.0","id":7,"result":{"resultType":"complete"}}"#
        );
        let mut out = br#"{"jsonrpc":"2.0","id":7,"result":{"tools":[]}}"#.to_vec();
        jsonrpc::mark_complete(&mut out, &id, Some("public"));
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#"{"jsonrpc":"2.0","id":7,"result":{"resultType":"complete","ttlMs":0,"cacheScope":"public","tools":[]}}"#
        );
        let error = br#"{"jsonrpc":"2.0","id":7,"error":{"code":-32602,"message":"m"}}"#;
        let mut out = error.to_vec();
        jsonrpc::mark_complete(&mut out, &id, Some("public"));
        assert_eq!(out, error);
    }

    #[test]
    fn a_retry_carries_the_elicitation_answer_as_the_old_era_argument() {
        let r = raw(r#"{"elicitation":{"action":"accept","content":{"name":"Ada"}},"other":1}"#);
        let args = retry_arguments(Some(&r), None).unwrap();
        assert_eq!(
            args,
            [(
                "_elicitation",
                r#"{"action":"accept","content":{"name":"Ada"}}"#.to_owned()
            )]
        );
        let r = raw(r#"{"elicitation":{"action":"maybe"}}"#);
        assert_eq!(retry_arguments(Some(&r), None).unwrap_err().code, -32602);
        // Keys other than the defaults: handed over whole, for the tool to
        // read its own (nothing names the keys it asked under).
        let r = raw(r#"{"user_name":{"action":"accept"},"extra":{}}"#);
        assert_eq!(
            retry_arguments(Some(&r), None).unwrap(),
            [(
                "_inputs",
                r#"{"user_name":{"action":"accept"},"extra":{}}"#.to_owned()
            )]
        );
        let r = raw(r#"{"user_name":12345,"other":[]}"#);
        assert_eq!(retry_arguments(Some(&r), None).unwrap(), []);
        let r = raw(r#"{"k":{"n":1},"k":{"n":2}}"#);
        assert_eq!(
            retry_arguments(Some(&r), None).unwrap(),
            [("_inputs", r#"{"k":{"n":1}}"#.to_owned())]
        );
        let r = raw(r#"{"sampling":{"role":"assistant"}}"#);
        assert_eq!(retry_arguments(Some(&r), None).unwrap()[0].0, "_sampling");
        assert_eq!(
            retry_arguments(Some(&raw("[]")), None).unwrap_err().code,
            -32602
        );
    }

    #[test]
    fn a_retry_with_a_question_reads_its_key_and_hands_back_its_state() {
        let q = |asked, key: &str, state: Option<&str>| {
            Some(Question::one(
                asked,
                key.to_owned(),
                state.map(str::to_owned),
            ))
        };
        let r = raw(
            r#"{"user_name":{"action":"accept","content":{"name":"Ada"}},"elicitation":{"action":"decline"}}"#,
        );
        // The named key wins over the default one, the state follows, and
        // other keys are the client's extras, ignored.
        let args = retry_arguments(
            Some(&r),
            q(Asked::Elicitation, "user_name", Some(r#"{"step":1}"#)),
        )
        .unwrap();
        assert_eq!(
            args,
            [
                (
                    "_elicitation",
                    r#"{"action":"accept","content":{"name":"Ada"}}"#.to_owned()
                ),
                ("_request_state", r#"{"step":1}"#.to_owned()),
            ]
        );
        // Unanswered: the state alone (the tool asks again, knowing why).
        let args = retry_arguments(None, q(Asked::Sampling, "s", Some("2"))).unwrap();
        assert_eq!(args, [("_request_state", "2".to_owned())]);
        // A sampling question's answer must be an object, named in the error.
        let r = raw(r#"{"capital":42}"#);
        let e = retry_arguments(Some(&r), q(Asked::Sampling, "capital", None)).unwrap_err();
        assert!(
            e.message.contains("`inputResponses.capital`"),
            "{}",
            e.message
        );
        let r = raw(r#"{"capital":{"role":"assistant"}}"#);
        let args = retry_arguments(Some(&r), q(Asked::Sampling, "capital", None)).unwrap();
        assert_eq!(args, [("_sampling", r#"{"role":"assistant"}"#.to_owned())]);
        // Roots: under their default key without a token, as a ListRootsResult.
        let r = raw(r#"{"roots":{"roots":[{"uri":"file:///a"}]}}"#);
        let args = retry_arguments(Some(&r), None).unwrap();
        assert_eq!(
            args,
            [("_roots", r#"{"roots":[{"uri":"file:///a"}]}"#.to_owned())]
        );
        let r = raw(r#"{"client_roots":[]}"#);
        let e = retry_arguments(Some(&r), q(Asked::Roots, "client_roots", None)).unwrap_err();
        assert!(e.message.contains("ListRootsResult"), "{}", e.message);
    }

    #[test]
    fn a_retry_of_a_set_hands_its_answers_over_together_by_key() {
        let set = |state: Option<&str>| {
            Some(Question {
                asks: vec![
                    (Asked::Elicitation, "user_name".to_owned()),
                    (Asked::Sampling, "greeting".to_owned()),
                    (Asked::Roots, "client_roots".to_owned()),
                ],
                many: true,
                state: state.map(str::to_owned),
            })
        };
        let r = raw(
            r#"{"client_roots":{"roots":[]},"user_name":{"action":"accept","content":{"name":"Ada"},"extra":1},"greeting":{"role":"assistant"},"other":5}"#,
        );
        // In the set's order, each checked by its kind (the elicitation's
        // answer as the session path passes it); the stray key is ignored.
        assert_eq!(
            retry_arguments(Some(&r), set(Some("7"))).unwrap(),
            [
                (
                    "_inputs",
                    r#"{"user_name":{"action":"accept","content":{"name":"Ada"}},"greeting":{"role":"assistant"},"client_roots":{"roots":[]}}"#
                        .to_owned()
                ),
                ("_request_state", "7".to_owned()),
            ]
        );
        // A missing answer is left out; none at all is an empty object.
        let r = raw(r#"{"greeting":{"role":"assistant"}}"#);
        assert_eq!(
            retry_arguments(Some(&r), set(None)).unwrap(),
            [("_inputs", r#"{"greeting":{"role":"assistant"}}"#.to_owned())]
        );
        assert_eq!(
            retry_arguments(None, set(None)).unwrap(),
            [("_inputs", "{}".to_owned())]
        );
        // A wrong answer to any of them is refused, naming its key.
        let r = raw(r#"{"greeting":{"role":"assistant"},"client_roots":[]}"#);
        let e = retry_arguments(Some(&r), set(None)).unwrap_err();
        assert!(
            e.message.contains("`inputResponses.client_roots`"),
            "{}",
            e.message
        );
        let r = raw(r#"{"user_name":{"action":"maybe"}}"#);
        let e = retry_arguments(Some(&r), set(None)).unwrap_err();
        assert!(
            e.message.contains("`inputResponses.user_name`"),
            "{}",
            e.message
        );
    }
}
