//! `upstream`: a router that is a Streamable HTTP MCP client of one remote
//! MCP server, reached over `wasi:http/outgoing-handler`: in protocol
//! 2026-07-28 (stateless, `modern.rs`) when the server offers it, else in
//! 2025-06-18 sessions.
//!
//! Configuration (wasi:cli/environment):
//! - `MCP_UPSTREAM_URL` (required): the MCP endpoint, `http://` or `https://`.
//! - `MCP_UPSTREAM_NAME` (optional): this router's name (`name()`), else
//!   "upstream".
//! - `MCP_UPSTREAM_PROTOCOL` (optional): `auto` (the default:
//!   `server/discover` first, then 2026-07-28 if offered, else
//!   `initialize`), `2026-07-28` or `2025-06-18` only.
//!
//! Its world (`wit/world.wit`) is the seed router world plus the broker's
//! host imports, through which it reports the upstream's progress and logs
//! while a call runs.
//!
//! The host links wasi:http for this router only, refuses every authority
//! but the configured one, and adds the operator's `upstream_headers`
//! (credentials) to each request itself: this guest never sees them.
//!
//! # Invariants
//! - One MCP session per instance, in instance memory, opened lazily by the
//!   first export that needs the upstream (`server/discover` in 2026-07-28,
//!   which opens nothing on the server; else `initialize`, then
//!   `notifications/initialized`). Requests carry `Mcp-Session-Id` (when the
//!   server gave one) and `MCP-Protocol-Version` (the negotiated one). A 404
//!   while holding a session id means the server forgot it, and so does a
//!   400 that answers no request (servers built on the TypeScript SDK's
//!   examples): the session is dropped, re-opened, and that request retried
//!   once.
//! - A failed `initialize` is not remembered: the next call tries again, so
//!   an upstream that comes up later is picked up without replacing the
//!   instance.
//! - Upstream input never traps the instance: every transport or protocol
//!   failure is an error value whose text starts with
//!   `upstream unavailable: ` followed by method, URL and reason (the host
//!   maps that prefix to its own error code); `describe-server` reports it
//!   as the meta entry `mcp-broker/unavailable` (a JSON string) instead.
//! - An answer body is bounded to 16 MiB; JSON-RPC ids are a per-instance
//!   counter, and the `tools/call` progress token is the request's id.
//!
//! # Mapping and losses
//!
//! | MCP (upstream) | WIT / broker | lost or changed |
//! |---|---|---|
//! | `initialize` result | `title` (serverInfo.title, else name), `instructions`, `describe-server` capabilities | serverInfo.version; `logging`, `experimental` and `tasks` capabilities; the guest never DELETEs its session (the WIT has no teardown): the host does, with the last session id the instance sent, when it drops the instance (`broker/src/wasm/outbound.rs`) |
//! | `tools/list`, `resources/list`, `resources/templates/list`, `prompts/list` | whole lists | pagination is flattened (at most 100 pages each); a list that fails reads as empty; a resource's `size` (the WIT `mcp-resource` has no field for it); in 2026-07-28, a tool whose `x-mcp-header` declarations break that revision's rules (`modern::header_declarations`), which a client MUST drop; the `_meta` of resources, templates and prompts (the WIT records have no field for it: fastmcp's tags are there); tools keep theirs |
//! | 2026-07-28 `ttlMs`, `cacheScope` of listings and reads | — | the broker's edge writes its own (`ttlMs: 0`; `cacheScope` `public`, or `private` with `[auth]`), whatever the upstream said |
//! | resource template | an `mcp-resource` whose `uri` is the `uriTemplate` (README "Resource templates") | — |
//! | tool `annotations` | `read-only`, `destructive`; `title` used when the tool has none | `idempotentHint`, `openWorldHint` |
//! | tool `execution.taskSupport` | a tool that requires to be called as a task (`"required"`) is not listed: the broker does not offer the tasks extension, and such a tool refuses every plain call | `"optional"` tools are listed and called plainly |
//! | `tools/call` result | content, `structuredContent` (JSON text), `isError`, `_meta` entries | `_meta` keys under MCP's own prefix `io.modelcontextprotocol/` (2026-07-28's `serverInfo` of the upstream: the client talks to the broker); resource_link `name` (its title, else name, is the title); an embedded blob without MIME type is labelled `application/octet-stream` so the broker reads it as binary; a blob with a textual MIME type (or text with a binary one) is misread by the broker, which picks text/blob from the MIME type |
//! | `notifications/progress` on the call's stream (or the GET stream, with the call's token) | passed to the host at once (`mcp-broker:host/call.progress`, `../../wit/host/host.wit`), which sends it to the client while the call runs | — |
//! | `notifications/message` on the call's stream | passed to the host at once (`call.log`) | no `logging/setLevel` is sent upstream: the broker filters; logs of list/read/get calls are dropped by the host; logs on the GET stream are not taken |
//! | `notifications/*/list_changed` on a stream | meta `mcp-broker/list-changed` = `["tools",…]` on call/complete results | on other exports only the prompt cache is invalidated; one announced on the GET stream is seen when a request next waits |
//! | the session's GET stream (2025-06-18, a session with an id) | opened by the first request that needs the session (never waited for) and kept ([`Listen`]); read while a request waits: its progress (with its token), questions (refused), pings, list changes | logs (nothing ties them to a request); progress without the request's token; questions past 64 a request; a server that refuses the GET is not asked again in the session |
//! | server→client requests (`elicitation/create`, `sampling/createMessage`, `roots/list`, …) on a stream (2025-06-18) | refused: error -32601 POSTed back at once (`ping` is answered `{}`) | a session-era upstream cannot elicit, sample or list roots through the broker |
//! | 2026-07-28 `InputRequiredResult` of `tools/call` | a result asking the broker's client the same `inputRequests` (meta `mcp-broker/input-requests`), the upstream's `requestState` in this router's state (`mcp-broker/state`); the retry's `_inputs` and `_request_state` become `inputResponses` and `requestState` | more than 8 questions, or a `requestState` over about 4 KB, fail the call (the broker's bounds); an `InputRequiredResult` of `prompts/get` or `resources/read` is an error |
//! | 2026-07-28 errors with a 4xx status | the JSON-RPC error they carry | — |
//! | `prompts/get` arguments | called with each declared argument = `{{name}}`; the broker substitutes (README "Prompt arguments") | an upstream that computes on the values (not just formats them) sees the placeholders; an optional argument left out becomes an empty string in the text; audio/link prompt content becomes text; the prompt's `title` (the WIT prompt has none) |
//! | `completion/complete` | the client's params as they come (`ref`, `argument`, `context.arguments`); one text block per value; `total` and `hasMore` in the meta entry `mcp-broker/completion`, which the broker answers with | — |
//! | `resources/subscribe`, `notifications/resources/updated` | not forwarded | the `subscribe` capability flag is reported as the upstream gives it |
//! | `notifications/cancelled` | not sent by the guest (a call's end is invisible to it); each request but `initialize` carries `mcp-broker-request-id: <id>`, which the host strips and uses to send `notifications/cancelled` in the same session when it abandons the call | cancellation needs that host support |
//! | broker arguments `_elicitation`, `_sampling`, `_roots`, `_inputs`, `_request_state` | stripped before `tools/call` | — |
//!
//! # Errors
//! JSON-RPC errors from the upstream: -32602 → `invalid-parameters` (or
//! `not-found` when the text says "unknown tool"), -32601 or a "not found" /
//! "unknown" text → `not-found`, -32002 → `not-found` for resources, others →
//! `execution-error("upstream error <code>: <message>")` (`internal-error`
//! for prompts). Transport failures (refused connection, HTTP status other
//! than 200, non-JSON body, SSE stream ended early, body over 16 MiB) are
//! `execution-error("upstream unavailable: <method> to <url>: <reason>")`.
//! Lists skip a kind the upstream's capabilities lack, without a request.
//!
//! # Tests
//! `sse`, `rpc`, `map` and `http::Endpoint` are pure; the session logic is
//! tested natively against a scripted upstream (`tests` below replaces the
//! POST): `cargo test -p upstream --target x86_64-unknown-linux-gnu`.
//! Property tests (`props` modules, their strategies in `arb.rs`) hold the
//! invariant above to any upstream input: the parsers and mappings to
//! arbitrary JSON and bytes read in arbitrary chunks, and every export to
//! a scripted upstream answering anything.

wit_bindgen::generate!({
    path: ["../../wit", "../../wit/host", "wit"],
    world: "mcp-broker:upstream-router/upstream",
    with: { "mcp-broker:host/call@0.1.0": generate },
});

// The native tests swap the real POST for a scripted one (see `tests`).
#[cfg_attr(test, allow(dead_code))]
mod http;
// Strategies of the property tests (`props` modules).
#[cfg(test)]
mod arb;
mod map;
mod modern;
mod rpc;
mod sse;

use std::cell::RefCell;

use serde_json::{Value, json};

use exports::wasix::mcp::router::{
    CompletionError, CompletionRequest, CompletionResponse, GetPromptResult, Guest, McpResource,
    MetaEntry, Prompt, PromptError, ReadResourceResult, ResourceError, Response,
    ServerCapabilities, ServerDescription, Tool, ToolError,
};
use http::Endpoint;
use rpc::{Collected, Failure, RpcError};

/// Pages read of one list before giving up (a cursor loop must end).
const MAX_PAGES: usize = 100;

/// The MCP session with the upstream: a 2025-06-18 session, or in
/// 2026-07-28 what `server/discover` said (there is no session).
struct Session {
    /// `Mcp-Session-Id`, when the server assigned one.
    id: Option<String>,
    /// Negotiated `protocolVersion`, sent as `MCP-Protocol-Version`.
    version: String,
    /// The `initialize` result (serverInfo, capabilities, instructions);
    /// in 2026-07-28 the `server/discover` result in that shape.
    init: Value,
    /// Protocol 2026-07-28 (modern.rs).
    modern: bool,
    /// The session's standing GET stream.
    listen: Listen,
}

/// The session's standing GET stream, on which a session-era server sends
/// what it does not tie to a request: FastMCP before 1.30 sends a call's
/// progress there, and any release a question asked without
/// `related_request_id`. Without it that progress is lost and such a
/// question waits for an answer until the call's deadline. Opened by the
/// first request of a session with an id, read only while a request waits
/// (an instance runs one call at a time), dropped with the session.
///
/// Only what is certainly the request's is taken from it: progress with
/// its token, questions (refused, as on the call's stream), pings and
/// list changes. Logs are not: nothing ties them to a request, and the
/// session is the instance's, whose calls come from many clients (a log
/// sent between two calls would reach the second caller).
#[derive(Default)]
enum Listen {
    /// Not open: the next request opens it.
    #[default]
    Closed,
    /// Sent; its head is taken while a request waits (never waited for
    /// alone: a server or proxy that holds it back costs nothing).
    Opening(http::Pending),
    Open(Box<Listener>),
    /// The server answered the GET with an error (405 from servers without
    /// one, 409 …) or not within [`LISTEN_HEAD_TIMEOUT`]: not asked again
    /// in this session. A 2026-07-28 session, which has no GET stream,
    /// starts here.
    Refused,
}

struct Listener {
    answer: http::Answer,
    parser: sse::Parser,
}

/// An event on the GET stream longer than this ends the stream (it is
/// opened again by the next request): nothing sent there is large.
const MAX_LISTEN_EVENT: usize = 1 << 20;
/// How long the upstream may take to answer the GET's head.
#[cfg_attr(test, allow(dead_code))]
const LISTEN_HEAD_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);
/// Questions and pings from the GET stream answered per request, each a
/// POST of its own: a server asking in a loop must not hold the call.
/// Beyond it they go unanswered.
const MAX_ANSWERS_PER_REQUEST: usize = 64;

#[derive(Default)]
struct State {
    session: Option<Session>,
    next_id: u64,
    /// The raw `prompts/list` entries, for `get-prompt`'s placeholders.
    prompts: Option<Vec<Value>>,
    /// The raw `tools/list` entries as last listed: in 2026-07-28 a call
    /// sends the `x-mcp-header` arguments of its tool's schema as headers.
    tools: Option<Vec<Value>>,
}

thread_local! {
    // An instance is single-threaded; this is its memory for the session.
    static STATE: RefCell<State> = RefCell::default();
}

fn next_id() -> u64 {
    STATE.with_borrow_mut(|s| {
        s.next_id += 1;
        s.next_id
    })
}

#[cfg(not(test))]
fn upstream_url() -> String {
    std::env::var("MCP_UPSTREAM_URL").unwrap_or_default()
}

/// `MCP_UPSTREAM_PROTOCOL`: `auto` (the default), `2026-07-28` or
/// `2025-06-18` ([`modern::Choice`]).
#[cfg(not(test))]
fn protocol_setting() -> String {
    std::env::var("MCP_UPSTREAM_PROTOCOL").unwrap_or_default()
}

#[cfg(not(test))]
fn post(
    ep: &Endpoint,
    headers: &[(&str, &str)],
    body: &[u8],
    side: &mut dyn http::Beside,
) -> Result<http::Answer, String> {
    http::post(ep, headers, body, side)
}

#[cfg(not(test))]
fn get(ep: &Endpoint, headers: &[(&str, &str)]) -> Result<http::Pending, String> {
    http::get(ep, headers, LISTEN_HEAD_TIMEOUT)
}

/// Passes a progress or log notification of the running call to the broker
/// at once (`mcp-broker:host/call`), which sends it to the client before
/// the result. Outside a tool call the host drops it.
#[cfg(not(test))]
fn report(live: rpc::Live) {
    use mcp_broker::host::call;
    match live {
        rpc::Live::Progress {
            progress,
            total,
            message,
        } => call::progress(progress, total, message.as_deref()),
        rpc::Live::Log {
            level,
            logger,
            data,
        } => call::log(&level, logger.as_deref(), &data),
    }
}

#[cfg(test)]
use tests::{get, post, protocol_setting, report, upstream_url};

fn endpoint(method: &str) -> Result<Endpoint, Failure> {
    let url = upstream_url();
    if url.trim().is_empty() {
        return Err(Failure::Unavailable(format!(
            "{}{method}: MCP_UPSTREAM_URL is not set",
            rpc::UNAVAILABLE
        )));
    }
    Endpoint::parse(&url).map_err(|e| Failure::Unavailable(rpc::unavailable(method, &url, &e)))
}

/// Headers of one request: session id and protocol version when known.
struct Hdr {
    session: Option<String>,
    version: Option<String>,
    /// Protocol 2026-07-28: every request also repeats its method and name
    /// in headers (modern.rs), and an error may come with a 4xx status.
    modern: bool,
}

impl Hdr {
    fn list(&self) -> Vec<(&str, &str)> {
        let mut h = vec![
            ("content-type", "application/json"),
            ("accept", "application/json, text/event-stream"),
        ];
        if let Some(id) = &self.session {
            h.push(("mcp-session-id", id));
        }
        if let Some(v) = &self.version {
            h.push(("mcp-protocol-version", v));
        }
        h
    }
}

// Returned once per request and matched at once: boxing the large
// variant would allocate on every request to save a move of ~200 bytes.
#[allow(clippy::large_enum_variant)]
enum Sent {
    /// The server does not know the session it was sent (it restarted, or
    /// expired it): HTTP 404, as the transport asks, or a 400 that answers
    /// no request, as servers built on the TypeScript SDK's examples send
    /// (the reference server `server-everything` among them:
    /// `{"id":null,"error":{"message":"Bad Request: No valid session ID
    /// provided"}}`). The status, for the failure's wording.
    SessionGone(u16),
    Done {
        outcome: Result<Value, RpcError>,
        collected: Collected,
        session_id: Option<String>,
    },
}

fn snippet(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let text = text.trim();
    if text.is_empty() {
        return String::new();
    }
    let cut: String = text.chars().take(200).collect();
    format!(": {cut}")
}

/// POSTs a message and expects nothing back but an acknowledgement.
fn post_ack(ep: &Endpoint, hdr: &Hdr, payload: &[u8]) -> Result<(), String> {
    let mut a = post(ep, &hdr.list(), payload, &mut http::Alone)?;
    let body = a.all().unwrap_or_default();
    match a.status {
        200..=299 => Ok(()),
        _ => Err(status_reason(ep, &a, &body)),
    }
}

/// A failing status as a reason: `HTTP <status>` first ([`Probe`] reads
/// it), then what to do about a redirect (not followed: an upstream URL
/// that redirects, e.g. `/mcp` to `/mcp/`, only said "HTTP 307"), or a
/// snippet of the body.
fn status_reason(ep: &Endpoint, a: &http::Answer, body: &[u8]) -> String {
    match (&a.location, a.status) {
        // A relative target, as FastMCP sends (`/mcp/`), made whole.
        (Some(to), 300..=399) if to.starts_with('/') => format!(
            "HTTP {} redirect to `{}{to}`: redirects are not followed; set the router's \
             upstream to the URL it names",
            a.status, ep.shown
        ),
        (Some(to), 300..=399) => format!(
            "HTTP {} redirect to `{to}`: redirects are not followed; set the router's upstream \
             to the URL it names",
            a.status
        ),
        _ => format!("HTTP {}{}", a.status, snippet(body)),
    }
}

/// Answers the server's requests collected so far: `ping` with `{}`,
/// anything else refused. Best effort: the server may be waiting on them
/// before it sends our response.
fn answer_requests(ep: &Endpoint, hdr: &Hdr, collected: &mut Collected) {
    for req_id in std::mem::take(&mut collected.refuse) {
        let _ = post_ack(ep, hdr, &rpc::refusal(&req_id));
    }
    for req_id in std::mem::take(&mut collected.pong) {
        let _ = post_ack(ep, hdr, &rpc::pong(&req_id));
    }
}

/// Whether a message from the GET stream is request `id`'s to take: not a
/// log, nor progress without its token (see [`Listen`]).
fn taken_off_stream(msg: &Value, id: u64) -> bool {
    match msg.get("method").and_then(Value::as_str) {
        Some("notifications/message") => false,
        Some("notifications/progress") => msg
            .pointer("/params/progressToken")
            .is_some_and(|t| rpc::is_our_id(t, id)),
        _ => true,
    }
}

/// One request's wait for its answer, with the session's GET stream
/// ([`Listen`]) served beside it.
struct Listening<'a> {
    ep: &'a Endpoint,
    hdr: &'a Hdr,
    id: u64,
    /// Taken from the session for the request, given back on drop.
    listen: Listen,
    /// Whether to give it back: not for a request that had none to take.
    own: bool,
    /// Questions and pings answered from the GET stream so far.
    answered: usize,
    collected: Collected,
}

impl<'a> Listening<'a> {
    /// Takes the session's GET stream (a session-era session with an id),
    /// sending the GET if it is not open; one found ended meanwhile (a
    /// proxy's idle timeout) is sent again for this very request.
    fn start(ep: &'a Endpoint, hdr: &'a Hdr, id: u64, listen: bool) -> Self {
        let mut side = Self {
            ep,
            hdr,
            id,
            listen: Listen::Refused,
            own: false,
            answered: 0,
            collected: Collected {
                forward: rpc::Forward(Some(report)),
                ..Collected::default()
            },
        };
        if !listen || hdr.modern || hdr.session.is_none() {
            return side;
        }
        let Some(taken) = STATE.with_borrow_mut(|s| {
            s.session
                .as_mut()
                .map(|s| std::mem::replace(&mut s.listen, Listen::Refused))
        }) else {
            return side;
        };
        side.listen = taken;
        side.own = true;
        if matches!(side.listen, Listen::Open(_)) {
            // Whatever is there is taken (or answered) as this request's.
            http::Beside::serve(&mut side);
        }
        if matches!(side.listen, Listen::Closed) {
            let mut headers = vec![("accept", "text/event-stream")];
            headers.extend(
                hdr.list()
                    .into_iter()
                    .filter(|(k, _)| k.starts_with("mcp-")),
            );
            side.listen = match get(ep, &headers) {
                Ok(pending) => Listen::Opening(pending),
                Err(_) => Listen::Refused,
            };
        }
        side
    }

    /// Reads what the GET stream has ready; a stream that ended or failed
    /// is let go (the next request opens another).
    fn read_ready(&mut self) {
        let Listen::Open(l) = &mut self.listen else {
            return;
        };
        // Bounded, so that a stream that never pauses cannot hold the call.
        for _ in 0..64 {
            match l.answer.try_chunk() {
                Ok(Some(bytes)) if bytes.is_empty() => return,
                Ok(Some(bytes)) => {
                    for ev in l.parser.feed(&bytes) {
                        if !(ev.event.is_empty() || ev.event == "message") {
                            continue;
                        }
                        if let Ok(msg) = serde_json::from_str::<Value>(&ev.data)
                            && taken_off_stream(&msg, self.id)
                        {
                            // A response has no place here: the request's
                            // own comes on its POST.
                            let _ = rpc::absorb(&msg, self.id, &mut self.collected);
                        }
                    }
                    if l.parser.pending_bytes() > MAX_LISTEN_EVENT {
                        self.listen = Listen::Closed;
                        return;
                    }
                }
                Ok(None) | Err(_) => {
                    self.listen = Listen::Closed;
                    return;
                }
            }
        }
    }
}

impl http::Beside for Listening<'_> {
    fn pollable(&mut self) -> Option<&wasi::io::poll::Pollable> {
        match &mut self.listen {
            Listen::Opening(p) => p.pollable(),
            Listen::Open(l) => l.answer.pollable(),
            Listen::Closed | Listen::Refused => None,
        }
    }

    fn active(&self) -> bool {
        matches!(self.listen, Listen::Opening(_) | Listen::Open(_))
    }

    fn serve(&mut self) {
        if let Listen::Opening(p) = &mut self.listen {
            self.listen = match p.take() {
                None => return,
                Some(Ok(answer))
                    if answer.status == 200
                        && answer
                            .content_type
                            .to_ascii_lowercase()
                            .starts_with("text/event-stream") =>
                {
                    Listen::Open(Box::new(Listener {
                        answer,
                        parser: sse::Parser::new(),
                    }))
                }
                Some(_) => Listen::Refused,
            };
        }
        self.read_ready();
        // The request's own stream answers its questions in `send`; these
        // came from the GET stream, within the request's allowance.
        let room = MAX_ANSWERS_PER_REQUEST.saturating_sub(self.answered);
        self.collected.refuse.truncate(room);
        let room = room - self.collected.refuse.len();
        self.collected.pong.truncate(room);
        self.answered += self.collected.refuse.len() + self.collected.pong.len();
        answer_requests(self.ep, self.hdr, &mut self.collected);
    }
}

impl Drop for Listening<'_> {
    fn drop(&mut self) {
        if !self.own {
            return;
        }
        let back = std::mem::take(&mut self.listen);
        STATE.with_borrow_mut(|s| {
            if let Some(s) = &mut s.session {
                s.listen = back;
            }
        });
    }
}

/// One request/answer exchange; `Err` is a transport reason.
/// With `cancellable`, the request names its id to the host in
/// [`rpc::REQUEST_ID_HEADER`] (`initialize` must never be cancelled), and
/// the session's GET stream is served while it waits ([`Listening`]).
/// `extra`: the request's own headers (2026-07-28's `Mcp-Method`, …).
fn send(
    ep: &Endpoint,
    hdr: &Hdr,
    id: u64,
    payload: &[u8],
    cancellable: bool,
    extra: &[(String, String)],
) -> Result<Sent, String> {
    let id_text = id.to_string();
    let mut headers = hdr.list();
    if cancellable {
        headers.push((rpc::REQUEST_ID_HEADER, &id_text));
    }
    headers.extend(extra.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    let mut side = Listening::start(ep, hdr, id, cancellable);
    let mut a = post(ep, &headers, payload, &mut side)?;
    if hdr.session.is_some() && a.status == 404 {
        return Ok(Sent::SessionGone(404));
    }
    if hdr.session.is_some() && a.status == 400 {
        // A 400 that answers this request is the request's own failure
        // (read below as before); one that answers none refused the
        // session. Either way nothing ran, so a retry is safe.
        let body = a.all().unwrap_or_default();
        let answers_this = serde_json::from_slice::<Value>(&body)
            .is_ok_and(|m| m.get("id").and_then(Value::as_u64) == Some(id));
        if !answers_this {
            return Ok(Sent::SessionGone(400));
        }
        return Err(format!("HTTP 400{}", snippet(&body)));
    }
    let ct = a.content_type.to_ascii_lowercase();
    let session_id = a.session_id.clone();
    let done = move |outcome, side: &mut Listening| Sent::Done {
        outcome,
        collected: std::mem::take(&mut side.collected),
        session_id,
    };
    if a.status != 200 {
        // A 202 has no response in it; anything else is a failure, but in
        // 2026-07-28 a refused request is a JSON-RPC error with a 4xx
        // status (400 -32602, 404 -32601, …): that error is the answer.
        let body = a.all().unwrap_or_default();
        if hdr.modern
            && (400..500).contains(&a.status)
            && ct.starts_with("application/json")
            && let Ok(msg) = serde_json::from_slice::<Value>(&body)
            && let Some(outcome @ Err(_)) = rpc::absorb(&msg, id, &mut side.collected)
        {
            return Ok(done(outcome, &mut side));
        }
        return Err(status_reason(ep, &a, &body));
    }
    if ct.starts_with("application/json") {
        // A server answering in JSON sends the call's progress, if any,
        // on the GET stream: served while the body is awaited.
        let body = a.all_beside(&mut side)?;
        let msg: Value = serde_json::from_slice(&body).map_err(|e| format!("invalid JSON: {e}"))?;
        return match rpc::absorb(&msg, id, &mut side.collected) {
            Some(outcome) => Ok(done(outcome, &mut side)),
            None => Err(format!("the answer holds no response to request {id}")),
        };
    }
    if !ct.starts_with("text/event-stream") {
        return Err(format!("unexpected Content-Type `{}`", a.content_type));
    }
    let mut parser = sse::Parser::new();
    while let Some(chunk) = a.chunk_beside(&mut side)? {
        for ev in parser.feed(&chunk) {
            if !(ev.event.is_empty() || ev.event == "message") || ev.data.trim().is_empty() {
                continue;
            }
            let msg: Value =
                serde_json::from_str(&ev.data).map_err(|e| format!("invalid JSON: {e}"))?;
            let outcome = rpc::absorb(&msg, id, &mut side.collected);
            answer_requests(ep, hdr, &mut side.collected);
            if let Some(outcome) = outcome {
                return Ok(done(outcome, &mut side));
            }
        }
    }
    Err(match parser.pending_bytes() {
        0 => "the SSE stream ended before the response".into(),
        n => {
            format!("the SSE stream ended before the response ({n} bytes of an unterminated event)")
        }
    })
}

/// The open session's headers, initializing first if needed; `Err` is a
/// reason (without method and URL).
fn ensure(ep: &Endpoint) -> Result<Hdr, String> {
    let open = STATE.with_borrow(|s| {
        s.session.as_ref().map(|s| Hdr {
            session: s.id.clone(),
            version: Some(s.version.clone()),
            modern: s.modern,
        })
    });
    if let Some(h) = open {
        return Ok(h);
    }
    let choice = modern::Choice::parse(&protocol_setting())?;
    if choice != modern::Choice::Legacy {
        match discover(ep) {
            Ok(init) => {
                STATE.with_borrow_mut(|s| {
                    s.session = Some(Session {
                        id: None,
                        version: modern::VERSION.into(),
                        init,
                        modern: true,
                        listen: Listen::Refused,
                    });
                    s.prompts = None;
                    s.tools = None;
                });
                return Ok(modern_hdr());
            }
            // A server of the session era: it answers the probe with an
            // error (most: 400, no session), and gets `initialize`.
            Err(Probe::Refused(_)) if choice == modern::Choice::Auto => {}
            Err(Probe::Refused(reason) | Probe::Unanswered(reason)) => {
                return Err(format!("server/discover: {reason}"));
            }
        }
    }
    // Reasons are worded for the request that needed the session; a failed
    // transport on `initialize` reads as the plain transport reason.
    let fail = |step: &str, reason: &str| match step {
        "" => reason.to_owned(),
        s => format!("{s}: {reason}"),
    };
    let id = next_id();
    let payload = rpc::request(id, "initialize", Some(rpc::initialize_params()));
    let bare = Hdr {
        session: None,
        version: None,
        modern: false,
    };
    let (init, session_id) = match send(ep, &bare, id, &payload, false, &[]) {
        Err(reason) => return Err(fail("", &reason)),
        Ok(Sent::SessionGone(status)) => return Err(fail("initialize", &format!("HTTP {status}"))),
        Ok(Sent::Done {
            outcome: Err(e), ..
        }) => {
            return Err(fail(
                "initialize failed",
                &format!("upstream error {}: {}", e.code, e.message),
            ));
        }
        Ok(Sent::Done {
            outcome: Ok(init),
            session_id,
            ..
        }) => (init, session_id),
    };
    if !init.is_object() {
        return Err(fail("initialize failed", "the result is not an object"));
    }
    // The server's answer is the negotiated version; it is sent back as is.
    let version = init
        .get("protocolVersion")
        .and_then(Value::as_str)
        .unwrap_or(rpc::PROTOCOL_VERSION)
        .to_owned();
    let hdr = Hdr {
        session: session_id.clone(),
        version: Some(version.clone()),
        modern: false,
    };
    post_ack(ep, &hdr, &rpc::notification("notifications/initialized"))
        .map_err(|r| fail("notifications/initialized", &r))?;
    STATE.with_borrow_mut(|s| {
        s.session = Some(Session {
            id: session_id,
            version,
            init,
            modern: false,
            listen: Listen::Closed,
        });
        s.prompts = None;
        s.tools = None;
    });
    Ok(hdr)
}

fn modern_hdr() -> Hdr {
    Hdr {
        session: None,
        version: Some(modern::VERSION.into()),
        modern: true,
    }
}

/// `server/discover` in 2026-07-28: the `initialize`-shaped result when the
/// server offers that revision; `Err` says whether the server answered.
/// A probe whose connection failed before any answer is sent once more: it
/// changes nothing on the server, and the usual cause is a pooled
/// connection the server had just closed (uvicorn resets the one whose
/// request a deadline cancelled), which a fresh connection does not share.
fn discover(ep: &Endpoint) -> Result<Value, Probe> {
    match discover_once(ep) {
        Err(Probe::Unanswered(reason)) if !reason.starts_with("HTTP ") => discover_once(ep),
        probed => probed,
    }
}

fn discover_once(ep: &Endpoint) -> Result<Value, Probe> {
    let id = next_id();
    let params = modern::with_meta(None, modern::request_meta(false));
    let extra = modern::request_headers("server/discover", &params);
    let payload = rpc::request(id, "server/discover", Some(params));
    let sent = send(ep, &modern_hdr(), id, &payload, false, &extra);
    match sent.map_err(Probe::of_transport)? {
        Sent::Done {
            outcome: Ok(result),
            ..
        } => modern::discovered(&result).map_err(Probe::Refused),
        Sent::Done {
            outcome: Err(e), ..
        } => Err(Probe::Refused(format!(
            "upstream error {}: {}",
            e.code, e.message
        ))),
        Sent::SessionGone(status) => Err(Probe::Refused(format!("HTTP {status}"))),
    }
}

/// Why `server/discover` found no 2026-07-28 server.
#[derive(Debug)]
enum Probe {
    /// The server answered: an error, a client-error status, or a result
    /// that does not offer the revision. Under `auto`, a session follows.
    Refused(String),
    /// No answer: the network failed, or the server or a proxy before it
    /// was busy or broken (5xx, 408, 429). That says nothing of the
    /// server's revision, so the upstream is unavailable until the next
    /// try (one such probe once kept an `auto` upstream on 2025-06-18 until
    /// it restarted).
    Unanswered(String),
}

impl Probe {
    /// A [`send`] failure: `HTTP <status>…` when the server answered with
    /// a status other than 200, else a transport failure.
    fn of_transport(reason: String) -> Self {
        let status = reason
            .strip_prefix("HTTP ")
            .and_then(|r| r.get(..3))
            .and_then(|s| s.parse::<u16>().ok());
        match status {
            Some(s) if (400..500).contains(&s) && s != 408 && s != 429 => Self::Refused(reason),
            // Some session-era servers answer every method they do not
            // know so (FastMCP 1.8's stateless mode, 500): retried for
            // ever. Not said of 502–504, which a proxy answers for a
            // server that is down, where the hint only misleads.
            Some(500 | 501) => Self::Unanswered(format!(
                "{reason} (if this server answers every method it does not know with a 5xx, \
                 set upstream_protocol = \"2025-06-18\")"
            )),
            _ => Self::Unanswered(reason),
        }
    }
}

/// The `initialize` result of the (possibly new) session; `Err` words the
/// failure for `method`.
fn init(method: &str) -> Result<Value, Failure> {
    let ep = endpoint(method)?;
    ensure(&ep).map_err(|r| Failure::Unavailable(rpc::unavailable(method, &ep.shown, &r)))?;
    Ok(session_init())
}

fn session_init() -> Value {
    STATE.with_borrow(|s| {
        s.session
            .as_ref()
            .map(|s| s.init.clone())
            .unwrap_or_default()
    })
}

fn title_of(init: &Value) -> Option<String> {
    let info = init.get("serverInfo")?;
    info.get("title")
        .or_else(|| info.get("name"))
        .and_then(Value::as_str)
        .map(str::to_owned)
}

fn has_capability(init: &Value, cap: &str) -> bool {
    init.pointer(&format!("/capabilities/{cap}"))
        .is_some_and(|c| !c.is_null())
}

/// One request with the session's headers, retried once on a lost session.
fn call(method: &str, params: Option<Value>) -> Result<(Value, Collected), Failure> {
    let ep = endpoint(method)?;
    let mut retried = false;
    loop {
        let hdr = ensure(&ep)
            .map_err(|r| Failure::Unavailable(rpc::unavailable(method, &ep.shown, &r)))?;
        let id = next_id();
        let mut params = params.clone();
        if method == "tools/call"
            && let Some(Value::Object(p)) = &mut params
        {
            // Progress notifications come only for a request that asks.
            p.insert("_meta".into(), json!({"progressToken": id}));
        }
        let mut extra = Vec::new();
        if hdr.modern {
            let p = modern::with_meta(params, modern::request_meta(method == "tools/call"));
            extra = modern::request_headers(method, &p);
            if method == "tools/call" {
                extra.extend(tool_param_headers(&p));
            }
            params = Some(p);
        } else if let Some(Value::Object(p)) = &mut params {
            // A session-era upstream never asked anything: a client's
            // answers (a broker retry with `_inputs`) mean nothing to it.
            p.remove("inputResponses");
            p.remove("requestState");
        }
        let payload = rpc::request(id, method, params);
        match send(&ep, &hdr, id, &payload, true, &extra) {
            Err(reason) => {
                return Err(Failure::Unavailable(rpc::unavailable(
                    method, &ep.shown, &reason,
                )));
            }
            Ok(Sent::SessionGone(_)) if !retried => {
                retried = true;
                STATE.with_borrow_mut(|s| s.session = None);
            }
            Ok(Sent::SessionGone(status)) => {
                return Err(Failure::Unavailable(rpc::unavailable(
                    method,
                    &ep.shown,
                    &format!("HTTP {status} again after re-initializing the session"),
                )));
            }
            Ok(Sent::Done {
                outcome, collected, ..
            }) => {
                if collected.list_changed.contains(&"prompts") {
                    STATE.with_borrow_mut(|s| s.prompts = None);
                }
                return outcome.map(|v| (v, collected)).map_err(Failure::Rpc);
            }
        }
    }
}

/// Whether a tool a 2026-07-28 server listed declares its `x-mcp-header`s
/// as that revision allows ([`modern::header_declarations`]); a client
/// MUST drop one that does not, and SHOULD say so: on the router's stderr,
/// which the broker logs when the router is granted `stdio`.
fn fit_for_headers(tool: &Value) -> bool {
    let Some(schema) = tool.get("inputSchema") else {
        return true;
    };
    match modern::header_declarations(schema) {
        Ok(()) => true,
        Err(why) => {
            use std::io::Write;
            let name = tool.get("name").and_then(Value::as_str).unwrap_or("");
            // Not eprintln!: a failed write must not trap the instance.
            let _ = writeln!(
                std::io::stderr(),
                "tool {name:?} left out: {why} (MCP 2026-07-28 x-mcp-header)"
            );
            false
        }
    }
}

/// The `Mcp-Param-*` headers of a 2026-07-28 `tools/call` with `params`,
/// from its tool's schema as last listed (read once if the tool is not in
/// the list yet). A tool without `x-mcp-header` properties has none.
fn tool_param_headers(params: &Value) -> Vec<(String, String)> {
    let name = params
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let find = |tools: &[Value]| {
        tools
            .iter()
            .find(|t| t.get("name").and_then(Value::as_str) == Some(name))
            .and_then(|t| t.get("inputSchema"))
            .cloned()
    };
    let mut schema = STATE.with_borrow(|s| s.tools.as_deref().and_then(find));
    if schema.is_none() {
        // Each instance keeps its own list: read it on its first call, and
        // again for a tool it does not know yet (listed since).
        if let Ok(tools) = list_all("tools/list", "tools") {
            schema = find(&tools);
            STATE.with_borrow_mut(|s| s.tools = Some(tools));
        }
    }
    let args = params.get("arguments").cloned().unwrap_or(Value::Null);
    schema
        .map(|s| modern::param_headers(&s, &args))
        .unwrap_or_default()
}

/// Every page of a list method, concatenated.
fn list_all(method: &str, key: &str) -> Result<Vec<Value>, Failure> {
    let mut out = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..MAX_PAGES {
        let params = cursor.take().map(|c| json!({"cursor": c}));
        let (page, _) = call(method, params)?;
        if let Some(items) = page.get(key).and_then(Value::as_array) {
            out.extend(items.iter().cloned());
        }
        match page.get("nextCursor").and_then(Value::as_str) {
            Some(c) if !c.is_empty() => cursor = Some(c.to_owned()),
            _ => break,
        }
    }
    Ok(out)
}

fn prompts_raw() -> Result<Vec<Value>, Failure> {
    if let Some(p) = STATE.with_borrow(|s| s.prompts.clone()) {
        return Ok(p);
    }
    let list = list_all("prompts/list", "prompts")?;
    STATE.with_borrow_mut(|s| s.prompts = Some(list.clone()));
    Ok(list)
}

struct Upstream;

impl Guest for Upstream {
    fn name() -> String {
        std::env::var("MCP_UPSTREAM_NAME")
            .ok()
            .filter(|n| !n.trim().is_empty())
            .unwrap_or_else(|| "upstream".into())
    }

    fn title() -> Option<String> {
        title_of(&init("initialize").ok()?)
    }

    fn instructions() -> String {
        init("initialize")
            .ok()
            .and_then(|i| {
                i.get("instructions")
                    .and_then(Value::as_str)
                    .map(str::to_owned)
            })
            .unwrap_or_default()
    }

    fn describe_server() -> ServerDescription {
        let reason = |m: String| {
            m.strip_prefix(rpc::UNAVAILABLE)
                .map(str::to_owned)
                .unwrap_or(m)
        };
        // The reason reads `POST <url>: <why>` (or the configuration error,
        // or `ping to <url>: <why>`).
        let opened = match endpoint("initialize") {
            Err(Failure::Unavailable(m)) => Err(reason(m)),
            Err(Failure::Rpc(e)) => Err(e.message),
            Ok(ep) => {
                // The broker re-reads the listings through one instance,
                // whose session outlives the upstream: ask the upstream
                // itself, or one that went away since would read as
                // available with nothing listed. A session-era upstream is
                // pinged (an error answer is an upstream that answers; a
                // lost session is opened again); a 2026-07-28 one, which
                // has no session, is discovered again.
                let open = STATE.with_borrow(|s| s.session.as_ref().map(|s| s.modern));
                if open == Some(true) {
                    STATE.with_borrow_mut(|s| s.session = None);
                }
                match (open == Some(false)).then(|| call("ping", None)) {
                    Some(Err(Failure::Unavailable(m))) => Err(reason(m)),
                    _ => ensure(&ep)
                        .map(|_| session_init())
                        .map_err(|r| format!("POST {}: {r}", ep.shown)),
                }
            }
        };
        let (title, capabilities, meta) = match opened {
            Ok(init) => {
                // The revision spoken, for the broker's metrics.
                let protocol = STATE.with_borrow(|s| s.session.as_ref().map(|s| s.version.clone()));
                let meta = protocol.map(|p| {
                    vec![MetaEntry {
                        key: rpc::META_PROTOCOL.into(),
                        value: Value::String(p).to_string(),
                    }]
                });
                (title_of(&init), map::capabilities(&init), meta)
            }
            Err(reason) => {
                let caps = ServerCapabilities {
                    prompts: None,
                    resources: None,
                    tools: None,
                    completions: None,
                };
                let entry = MetaEntry {
                    key: rpc::META_UNAVAILABLE.into(),
                    value: Value::String(reason).to_string(),
                };
                (None, caps, Some(vec![entry]))
            }
        };
        ServerDescription {
            name: Self::name(),
            title,
            capabilities,
            resources: None,
            resource_metadata: None,
            meta,
        }
    }

    fn list_tools() -> Vec<Tool> {
        match init("initialize") {
            Ok(i) if has_capability(&i, "tools") => {}
            _ => return Vec::new(),
        }
        let tools = list_all("tools/list", "tools").unwrap_or_default();
        let modern = STATE.with_borrow(|s| s.session.as_ref().is_some_and(|s| s.modern));
        let out = tools
            .iter()
            .filter(|t| !modern || fit_for_headers(t))
            .filter_map(map::tool)
            .collect();
        STATE.with_borrow_mut(|s| s.tools = Some(tools));
        out
    }

    fn call_tool(tool_name: String, arguments: String) -> Result<Response, ToolError> {
        let (arguments, answers) =
            map::tool_arguments(&arguments).map_err(ToolError::InvalidParameters)?;
        let mut params = json!({"name": tool_name, "arguments": arguments});
        if let Value::Object(p) = &mut params {
            // A retry of a question the upstream asked (2026-07-28).
            p.extend(modern::retry(answers.inputs, answers.state));
        }
        let (result, collected) = call("tools/call", Some(params)).map_err(map::tool_error)?;
        if modern::asks(&result) {
            // Its questions go to the broker's client as a set, its
            // requestState rides this router's state (modern.rs).
            let meta = modern::question(&result).map_err(|e| {
                ToolError::ExecutionError(format!("upstream asked for input it cannot get: {e}"))
            })?;
            // The text is what a client on an edge without the round trip
            // (gRPC, frames) sees: the HTTP edge never shows this result.
            let said = json!({"content": [{"type": "text", "text": modern::ASKED}]});
            let mut r = map::tool_result(&said, &collected);
            r.meta.get_or_insert_with(Vec::new).extend(
                meta.into_iter()
                    .map(|(key, value)| MetaEntry { key, value }),
            );
            return Ok(Response::Completed(r));
        }
        Ok(Response::Completed(map::tool_result(&result, &collected)))
    }

    fn list_resources() -> Vec<McpResource> {
        let Ok(init) = init("initialize") else {
            return Vec::new();
        };
        if !has_capability(&init, "resources") {
            return Vec::new();
        }
        let Ok(resources) = list_all("resources/list", "resources") else {
            return Vec::new();
        };
        let mut out: Vec<McpResource> = resources
            .iter()
            .filter_map(|r| map::resource(r, false))
            .collect();
        // A server may list resources but not templates; that is no failure.
        if let Ok(templates) = list_all("resources/templates/list", "resourceTemplates") {
            out.extend(templates.iter().filter_map(|t| map::resource(t, true)));
        }
        out
    }

    fn read_resource(uri: String) -> Result<ReadResourceResult, ResourceError> {
        let (result, _) =
            call("resources/read", Some(json!({"uri": uri}))).map_err(map::resource_error)?;
        if modern::asks(&result) {
            return Err(ResourceError::ExecutionError(
                modern::CANNOT_ASK.replace("{what}", "reading this resource"),
            ));
        }
        Ok(ReadResourceResult {
            contents: map::resource_contents(&result),
        })
    }

    fn list_prompts() -> Vec<Prompt> {
        match init("initialize") {
            Ok(i) if has_capability(&i, "prompts") => {}
            _ => return Vec::new(),
        }
        prompts_raw()
            .unwrap_or_default()
            .iter()
            .filter_map(map::prompt)
            .collect()
    }

    fn get_prompt(prompt_name: String) -> Result<GetPromptResult, PromptError> {
        let find = |list: &[Value]| {
            list.iter()
                .find(|p| p.get("name").and_then(Value::as_str) == Some(prompt_name.as_str()))
                .cloned()
        };
        let mut declared = find(&prompts_raw().map_err(map::prompt_error)?);
        if declared.is_none() {
            // The cache may predate the prompt: read the list once more.
            STATE.with_borrow_mut(|s| s.prompts = None);
            declared = find(&prompts_raw().map_err(map::prompt_error)?);
        }
        let arguments = declared.as_ref().map(map::placeholders).unwrap_or_default();
        let params = json!({"name": prompt_name, "arguments": arguments});
        let (result, _) = call("prompts/get", Some(params)).map_err(map::prompt_error)?;
        if modern::asks(&result) {
            return Err(PromptError::InternalError(
                modern::CANNOT_ASK.replace("{what}", "getting this prompt"),
            ));
        }
        Ok(map::prompt_result(&result))
    }

    fn complete(request: CompletionRequest) -> Result<CompletionResponse, CompletionError> {
        let params: Value = serde_json::from_str(&request.input)
            .map_err(|e| CompletionError::InvalidParameters(format!("input is not JSON: {e}")))?;
        if !params.is_object() {
            return Err(CompletionError::InvalidParameters(
                "input must be the completion/complete params object".into(),
            ));
        }
        let init = init("completion/complete").map_err(map::completion_error)?;
        if !has_capability(&init, "completions") {
            return Err(CompletionError::NotFound(
                "the upstream offers no completions".into(),
            ));
        }
        let (result, collected) =
            call("completion/complete", Some(params)).map_err(map::completion_error)?;
        Ok(map::completion(&result, &collected))
    }
}

export!(Upstream);

/// The session logic against a scripted upstream: `post` and the URL are
/// swapped for fakes, everything else is the component's own code.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::exports::wasix::mcp::router::{ContentBlock, PromptMessageContent};
    use http::Answer;

    const URL: &str = "http://up.test/mcp";

    struct Req {
        headers: Vec<(String, String)>,
        body: Value,
    }

    impl Req {
        fn header(&self, name: &str) -> Option<&str> {
            self.headers
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.as_str())
        }
        fn method(&self) -> &str {
            self.body["method"].as_str().unwrap_or("")
        }
    }

    type Server = Box<dyn FnMut(&Req) -> Result<Answer, String>>;

    thread_local! {
        static SERVER: RefCell<Option<Server>> = RefCell::default();
        static LOG: RefCell<Vec<Req>> = RefCell::default();
        static REPORTED: RefCell<Vec<rpc::Live>> = RefCell::default();
    }

    /// The host import, as the tests see it: what a call reported live.
    pub(super) fn report(live: rpc::Live) {
        REPORTED.with_borrow_mut(|r| r.push(live));
    }

    pub(super) fn upstream_url() -> String {
        URL.into()
    }

    thread_local! {
        // The session-era tests pin 2025-06-18 (their scripted servers
        // know `initialize` only); the 2026-07-28 tests set their own.
        static PROTOCOL: RefCell<&'static str> = const { RefCell::new("2025-06-18") };
    }

    pub(super) fn protocol_setting() -> String {
        PROTOCOL.with_borrow(|p| (*p).to_owned())
    }

    fn speak(protocol: &'static str) {
        PROTOCOL.with_borrow_mut(|p| *p = protocol);
    }

    pub(super) fn post(
        _: &Endpoint,
        headers: &[(&str, &str)],
        body: &[u8],
        side: &mut dyn http::Beside,
    ) -> Result<Answer, String> {
        // The wait for the response head, which serves the GET stream.
        if side.active() {
            side.serve();
        }
        let req = Req {
            headers: headers
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            body: serde_json::from_slice(body).expect("the client sends JSON"),
        };
        let mut server = SERVER.with_borrow_mut(Option::take).expect("a server");
        let reply = server(&req);
        SERVER.with_borrow_mut(|s| *s = Some(server));
        LOG.with_borrow_mut(|l| l.push(req));
        reply
    }

    thread_local! {
        /// What the GETs of this test are answered, in turn (none: an
        /// error, as from a server that serves no GET stream).
        static GETS: RefCell<std::collections::VecDeque<Answer>> = RefCell::default();
        /// The headers of every GET sent.
        static GET_LOG: RefCell<Vec<Vec<(String, String)>>> = RefCell::default();
    }

    pub(super) fn get(_: &Endpoint, headers: &[(&str, &str)]) -> Result<http::Pending, String> {
        GET_LOG.with_borrow_mut(|l| {
            l.push(
                headers
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            )
        });
        let answer = GETS
            .with_borrow_mut(|g| g.pop_front())
            .unwrap_or_else(|| Answer::canned(405, "text/plain", None, vec![]));
        Ok(http::Pending::canned(Ok(answer)))
    }

    fn json_answer(v: &Value) -> Answer {
        Answer::canned(
            200,
            "application/json",
            None,
            vec![v.to_string().into_bytes()],
        )
    }

    /// SSE frames cut into 7-byte reads, with CRLF line ends.
    fn sse_answer(msgs: &[Value]) -> Answer {
        let mut text = String::from(": stream start\r\n\r\n");
        for m in msgs {
            text.push_str(&format!("event: message\r\ndata: {m}\r\n\r\n"));
        }
        let chunks = text.as_bytes().chunks(7).map(<[u8]>::to_vec).collect();
        Answer::canned(200, "text/event-stream", None, chunks)
    }

    fn result(req: &Req, r: Value) -> Value {
        json!({"jsonrpc": "2.0", "id": req.body["id"], "result": r})
    }

    /// A server that handles the handshake (session id `session`, or none)
    /// and passes every other request to `on`.
    fn serve(
        session: Option<&'static str>,
        mut on: impl FnMut(&Req) -> Result<Answer, String> + 'static,
    ) {
        let server: Server = Box::new(move |req| match req.method() {
            "initialize" => {
                let mut a = json_answer(&result(
                    req,
                    json!({
                        "protocolVersion": "2025-06-18",
                        "capabilities": {"tools": {"listChanged": true}, "prompts": {}, "completions": {}},
                        "serverInfo": {"name": "srv", "title": "The Server", "version": "1"},
                        "instructions": "Be nice."
                    }),
                ));
                a.session_id = session.map(str::to_owned);
                Ok(a)
            }
            "notifications/initialized" => Ok(Answer::canned(202, "", None, vec![])),
            _ => on(req),
        });
        SERVER.with_borrow_mut(|s| *s = Some(server));
    }

    fn log<T>(f: impl FnOnce(&[Req]) -> T) -> T {
        LOG.with_borrow(|l| f(l))
    }

    #[test]
    fn handshake_headers_and_pagination() {
        serve(Some("s1"), |req| {
            let page = match req.body.pointer("/params/cursor").and_then(Value::as_str) {
                None => {
                    json!({"tools": [{"name": "a", "inputSchema": {"type": "object"}}], "nextCursor": "c2"})
                }
                Some("c2") => json!({"tools": [{"name": "b"}]}),
                Some(other) => panic!("cursor {other}"),
            };
            Ok(json_answer(&result(req, page)))
        });
        let tools = <Upstream as Guest>::list_tools();
        let names: Vec<_> = tools.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["a", "b"]);
        assert_eq!(<Upstream as Guest>::title().as_deref(), Some("The Server"));
        assert_eq!(<Upstream as Guest>::instructions(), "Be nice.");
        let d = <Upstream as Guest>::describe_server();
        let meta = d.meta.expect("the revision spoken");
        assert_eq!(meta.len(), 1);
        assert_eq!(meta[0].key, "mcp-broker/upstream-protocol");
        assert_eq!(meta[0].value, r#""2025-06-18""#);
        assert_eq!(d.capabilities.tools.unwrap().list_changed, Some(true));
        assert!(d.capabilities.resources.is_none());
        log(|l| {
            let methods: Vec<_> = l.iter().map(Req::method).collect();
            // One handshake for the whole instance; describing it again
            // asks the upstream whether it is still there.
            assert_eq!(
                methods,
                [
                    "initialize",
                    "notifications/initialized",
                    "tools/list",
                    "tools/list",
                    "ping"
                ]
            );
            assert_eq!(l[0].header("mcp-session-id"), None);
            // initialize must never be cancelled; later requests name their id.
            assert_eq!(l[0].header("mcp-broker-request-id"), None);
            assert_eq!(l[1].header("mcp-broker-request-id"), None);
            assert_eq!(l[2].header("mcp-broker-request-id"), Some("2"));
            assert_eq!(l[3].header("mcp-broker-request-id"), Some("3"));
            assert_eq!(l[0].body["params"]["protocolVersion"], "2025-06-18");
            for r in &l[1..] {
                assert_eq!(r.header("mcp-session-id"), Some("s1"));
                assert_eq!(r.header("mcp-protocol-version"), Some("2025-06-18"));
                assert_eq!(
                    r.header("accept"),
                    Some("application/json, text/event-stream")
                );
                assert_eq!(r.header("content-type"), Some("application/json"));
            }
            assert!(l[1].body.get("id").is_none());
            // Ids are a per-instance counter.
            let ids: Vec<_> = l.iter().filter_map(|r| r.body["id"].as_u64()).collect();
            assert_eq!(ids, [1, 2, 3, 4]);
        });
    }

    #[test]
    fn sse_stream_collects_and_refuses_server_requests() {
        serve(None, |req| match req.method() {
            "tools/call" => {
                assert!(req.body["params"]["arguments"].get("_sampling").is_none());
                let token = req.body["params"]["_meta"]["progressToken"].clone();
                Ok(sse_answer(&[
                    json!({"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":token,"progress":1,"total":2}}),
                    json!({"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"working"}}),
                    json!({"jsonrpc":"2.0","id":"e1","method":"elicitation/create","params":{}}),
                    json!({"jsonrpc":"2.0","method":"notifications/tools/list_changed"}),
                    result(
                        req,
                        json!({"content":[{"type":"text","text":"done"}],"structuredContent":{"ok":true}}),
                    ),
                    json!({"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"after"}}),
                ]))
            }
            // The refusal of `e1`.
            _ => Ok(Answer::canned(202, "", None, vec![])),
        });
        let r = <Upstream as Guest>::call_tool("t".into(), r#"{"x":1,"_sampling":{}}"#.into());
        let Ok(Response::Completed(r)) = r else {
            panic!("{r:?}")
        };
        assert!(matches!(&r.content[0], ContentBlock::Text(t) if t.text == "done"));
        assert_eq!(r.structured_content.as_deref(), Some(r#"{"ok":true}"#));
        // Progress and the log before the response went to the host as
        // they arrived, not into the result; the log after it was dropped.
        assert!(r.progress.is_none());
        assert_eq!(
            REPORTED.with_borrow(Clone::clone),
            [
                rpc::Live::Progress {
                    progress: 1.0,
                    total: Some(2.0),
                    message: None
                },
                rpc::Live::Log {
                    level: "info".into(),
                    logger: None,
                    data: r#""working""#.into()
                },
            ]
        );
        let meta: Vec<_> = r
            .meta
            .unwrap()
            .into_iter()
            .map(|m| (m.key, m.value))
            .collect();
        assert_eq!(
            meta,
            [(
                "mcp-broker/list-changed".to_owned(),
                r#"["tools"]"#.to_owned()
            ),]
        );
        log(|l| {
            let refusal = &l.last().unwrap().body;
            assert_eq!(refusal["id"], "e1");
            assert_eq!(refusal["error"]["code"], -32601);
            assert_eq!(l[2].body["params"]["arguments"], json!({"x": 1}));
        });
    }

    /// A GET stream's answer: SSE events, one chunk each; `None`: a chunk
    /// of no bytes, which the listener reads as "nothing more for now".
    fn listen_answer(msgs: &[Option<Value>]) -> Answer {
        let chunks = msgs
            .iter()
            .map(|m| match m {
                Some(m) => format!("data: {m}\n\n").into_bytes(),
                None => Vec::new(),
            })
            .collect();
        Answer::canned(200, "text/event-stream", None, chunks)
    }

    /// Session `s1`, whose `tools/call` answers `content` in JSON and
    /// whose other requests (refusals, pongs) are acknowledged.
    fn serve_calls(content: Value) {
        serve(Some("s1"), move |req| match req.method() {
            "tools/call" => Ok(json_answer(&result(req, content.clone()))),
            _ => Ok(Answer::canned(202, "", None, vec![])),
        });
    }

    #[test]
    fn the_get_stream_carries_progress_questions_and_list_changes_beside_a_call() {
        serve_calls(json!({"content":[{"type":"text","text":"done"}]}));
        // initialize is request 1, so the call is 2.
        GETS.with_borrow_mut(|g| {
            g.push_back(listen_answer(&[
                    Some(progress(2, 1)),
                    // Another request's, and none's: not this call's.
                    Some(progress(77, 1)),
                    Some(json!({"jsonrpc":"2.0","method":"notifications/progress","params":{"progress":5}})),
                    // Nothing ties a log to a request.
                    Some(log_msg("whose?")),
                    Some(json!({"jsonrpc":"2.0","id":"q1","method":"sampling/createMessage","params":{}})),
                    Some(json!({"jsonrpc":"2.0","id":"p1","method":"ping"})),
                    Some(json!({"jsonrpc":"2.0","method":"notifications/tools/list_changed"})),
                    // Quiet from here on (a canned stream that runs out
                    // has ended).
                    None, None, None, None, None, None, None, None, None, None,
            ]));
        });
        let r = <Upstream as Guest>::call_tool("t".into(), "{}".into());
        let Ok(Response::Completed(r)) = r else {
            panic!("{r:?}")
        };
        assert!(matches!(&r.content[0], ContentBlock::Text(t) if t.text == "done"));
        assert_eq!(
            REPORTED.with_borrow(Clone::clone),
            [rpc::Live::Progress {
                progress: 1.0,
                total: None,
                message: None
            }]
        );
        // A change announced on the GET stream is the call's news.
        let meta: Vec<_> = r.meta.unwrap().into_iter().map(|m| m.key).collect();
        assert_eq!(meta, ["mcp-broker/list-changed"]);
        log(|l| {
            let answers: Vec<_> = l
                .iter()
                .filter(|r| r.body.get("method").is_none())
                .map(|r| (r.body["id"].clone(), r.body.get("error").is_some()))
                .collect();
            assert_eq!(answers, [(json!("q1"), true), (json!("p1"), false)]);
        });
        GET_LOG.with_borrow(|g| {
            assert_eq!(g.len(), 1);
            let h: std::collections::HashMap<_, _> = g[0].iter().cloned().collect();
            assert_eq!(h["accept"], "text/event-stream");
            assert_eq!(h["mcp-session-id"], "s1");
            assert_eq!(h["mcp-protocol-version"], "2025-06-18");
            assert!(!h.contains_key(rpc::REQUEST_ID_HEADER), "{h:?}");
        });
        // The stream stayed open (it paused, it did not end): the next
        // call sends no second GET.
        <Upstream as Guest>::call_tool("t".into(), "{}".into()).unwrap();
        assert_eq!(GET_LOG.with_borrow(Vec::len), 1);
    }

    fn progress(token: u64, n: u32) -> Value {
        json!({"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":token,"progress":n}})
    }

    fn log_msg(data: &str) -> Value {
        json!({"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":data}})
    }

    #[test]
    fn a_get_stream_found_ended_is_opened_again_for_the_request_that_finds_it() {
        serve_calls(json!({"content":[]}));
        GETS.with_borrow_mut(|g| {
            // Ends after the first call, while the instance is idle (a
            // proxy's idle timeout).
            g.push_back(listen_answer(&[Some(progress(2, 1)), None, None]));
            g.push_back(listen_answer(&[
                Some(progress(3, 1)),
                None,
                None,
                None,
                None,
            ]));
        });
        <Upstream as Guest>::call_tool("t".into(), "{}".into()).unwrap();
        assert_eq!(GET_LOG.with_borrow(Vec::len), 1);
        // The second call finds it ended, and listens on a new one.
        <Upstream as Guest>::call_tool("t".into(), "{}".into()).unwrap();
        assert_eq!(GET_LOG.with_borrow(Vec::len), 2);
        assert_eq!(
            REPORTED.with_borrow(Vec::len),
            2,
            "{:?}",
            REPORTED.with_borrow(Clone::clone)
        );
    }

    #[test]
    fn questions_from_the_get_stream_are_answered_within_an_allowance() {
        serve_calls(json!({"content":[]}));
        let asks: Vec<Option<Value>> = (0..100)
            .map(|i| {
                Some(json!({"jsonrpc":"2.0","id":i,"method":"sampling/createMessage","params":{}}))
            })
            .chain([None, None, None])
            .collect();
        GETS.with_borrow_mut(|g| {
            g.push_back(listen_answer(&asks));
        });
        <Upstream as Guest>::call_tool("t".into(), "{}".into()).unwrap();
        let answered = log(|l| l.iter().filter(|r| r.body.get("method").is_none()).count());
        assert_eq!(answered, MAX_ANSWERS_PER_REQUEST);
    }

    #[test]
    fn a_server_without_a_get_stream_is_asked_once_per_session() {
        serve(Some("s1"), |req| {
            Ok(json_answer(&result(req, json!({"content":[]}))))
        });
        for _ in 0..3 {
            <Upstream as Guest>::call_tool("t".into(), "{}".into()).unwrap();
        }
        assert_eq!(GET_LOG.with_borrow(Vec::len), 1);
        // Without a session id there is no session to listen to.
        STATE.with_borrow_mut(|s| *s = State::default());
        GET_LOG.with_borrow_mut(Vec::clear);
        serve(None, |req| {
            Ok(json_answer(&result(req, json!({"content":[]}))))
        });
        <Upstream as Guest>::call_tool("t".into(), "{}".into()).unwrap();
        assert_eq!(GET_LOG.with_borrow(Vec::len), 0);
    }

    #[test]
    fn lost_session_reinitializes_and_retries_once() {
        let mut calls = 0;
        serve(Some("s1"), move |req| {
            calls += 1;
            if calls == 1 {
                return Ok(Answer::canned(
                    404,
                    "text/plain",
                    None,
                    vec![b"no session".to_vec()],
                ));
            }
            Ok(json_answer(&result(req, json!({"content": []}))))
        });
        assert!(<Upstream as Guest>::call_tool("t".into(), "{}".into()).is_ok());
        log(|l| {
            let methods: Vec<_> = l.iter().map(Req::method).collect();
            assert_eq!(
                methods,
                [
                    "initialize",
                    "notifications/initialized",
                    "tools/call",
                    "initialize",
                    "notifications/initialized",
                    "tools/call"
                ]
            );
        });
        // A server that keeps answering 404: one retry, then the error.
        serve(Some("s1"), |_| Ok(Answer::canned(404, "", None, vec![])));
        let Err(ToolError::ExecutionError(m)) =
            <Upstream as Guest>::call_tool("t".into(), "{}".into())
        else {
            panic!()
        };
        assert_eq!(
            m,
            "upstream unavailable: tools/call to http://up.test: HTTP 404 again after re-initializing the session"
        );
    }

    #[test]
    fn unreachable_upstream_never_traps() {
        SERVER.with_borrow_mut(|s| *s = Some(Box::new(|_| Err("connection refused".into()))));
        let Err(ToolError::ExecutionError(m)) =
            <Upstream as Guest>::call_tool("t".into(), "{}".into())
        else {
            panic!()
        };
        assert_eq!(
            m,
            "upstream unavailable: tools/call to http://up.test: connection refused"
        );
        let d = <Upstream as Guest>::describe_server();
        let meta = d.meta.unwrap();
        assert_eq!(meta[0].key, "mcp-broker/unavailable");
        assert_eq!(
            meta[0].value,
            r#""POST http://up.test: connection refused""#
        );
        assert!(d.capabilities.tools.is_none() && d.title.is_none());
        assert!(<Upstream as Guest>::list_tools().is_empty());
        assert!(<Upstream as Guest>::list_resources().is_empty());
        assert_eq!(<Upstream as Guest>::instructions(), "");
        assert!(matches!(
            <Upstream as Guest>::read_resource("x://1".into()),
            Err(ResourceError::ExecutionError(m)) if m.starts_with("upstream unavailable: resources/read to ")
        ));
    }

    /// An upstream that goes away after its listings were read is
    /// unavailable at the next re-read, not an upstream that lists nothing.
    #[test]
    fn an_upstream_gone_after_its_session_opened_reads_unavailable() {
        serve(Some("s1"), |req| match req.method() {
            "ping" => Ok(json_answer(&result(req, json!({})))),
            _ => Ok(json_answer(&result(req, json!({"tools": []})))),
        });
        let d = <Upstream as Guest>::describe_server();
        assert!(d.meta.unwrap()[0].key != "mcp-broker/unavailable");
        // The second read asks the upstream, which is still there.
        let d = <Upstream as Guest>::describe_server();
        assert!(d.meta.unwrap()[0].key != "mcp-broker/unavailable");
        log(|l| assert_eq!(l.iter().filter(|r| r.method() == "ping").count(), 1));
        SERVER.with_borrow_mut(|s| *s = Some(Box::new(|_| Err("connection refused".into()))));
        let d = <Upstream as Guest>::describe_server();
        let meta = d.meta.unwrap();
        assert_eq!(meta[0].key, "mcp-broker/unavailable");
        assert_eq!(
            meta[0].value,
            r#""ping to http://up.test: connection refused""#
        );
        assert!(d.capabilities.tools.is_none());
        // An upstream that refuses `ping` answers, so it is available.
        serve(Some("s1"), |req| {
            Ok(json_answer(&json!({
                "jsonrpc": "2.0", "id": req.body["id"],
                "error": {"code": -32601, "message": "no ping here"}
            })))
        });
        let d = <Upstream as Guest>::describe_server();
        assert!(d.capabilities.tools.is_some());
    }

    #[test]
    fn transport_and_protocol_failures() {
        let mut n = 0;
        serve(None, move |req| {
            n += 1;
            Ok(match n {
                1 => Answer::canned(200, "application/json", None, vec![b"not json".to_vec()]),
                2 => Answer::canned(500, "text/plain", None, vec![b"boom".to_vec()]),
                3 => sse_answer(&[
                    json!({"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":1}}),
                ]),
                4 => json_answer(
                    &json!({"jsonrpc":"2.0","id":req.body["id"],"error":{"code":-32602,"message":"x must be a number"}}),
                ),
                5 => Answer::canned(200, "application/json", None, vec![vec![b' '; 1 << 20]; 17]),
                6 => Answer::canned(200, "text/html", None, vec![]),
                _ => {
                    let mut a = Answer::canned(307, "text/plain", None, vec![]);
                    a.location = Some("/mcp/".into());
                    a
                }
            })
        });
        let mut errors = Vec::new();
        for _ in 0..7 {
            errors.push(<Upstream as Guest>::call_tool("t".into(), "{}".into()).unwrap_err());
        }
        let texts: Vec<String> = errors
            .iter()
            .map(|e| match e {
                ToolError::ExecutionError(m) | ToolError::InvalidParameters(m) => m.clone(),
                other => format!("{other:?}"),
            })
            .collect();
        let prefix = "upstream unavailable: tools/call to http://up.test: ";
        assert!(
            texts[0].starts_with(&format!("{prefix}invalid JSON: ")),
            "{}",
            texts[0]
        );
        assert_eq!(texts[1], format!("{prefix}HTTP 500: boom"));
        assert_eq!(
            texts[2],
            format!("{prefix}the SSE stream ended before the response")
        );
        assert!(matches!(&errors[3], ToolError::InvalidParameters(m) if m == "x must be a number"));
        assert_eq!(texts[4], format!("{prefix}answer larger than 16 MiB"));
        assert_eq!(
            texts[5],
            format!("{prefix}unexpected Content-Type `text/html`")
        );
        // A redirect names where it points: it is not followed.
        assert!(
            texts[6].starts_with(&format!(
                "{prefix}HTTP 307 redirect to `http://up.test/mcp/`: redirects are not followed"
            )),
            "{}",
            texts[6]
        );
    }

    #[test]
    fn prompts_get_placeholders_and_completion() {
        serve(None, |req| {
            Ok(json_answer(&result(
                req,
                match req.method() {
                    "prompts/list" => {
                        json!({"prompts": [{"name": "greet", "arguments": [{"name": "who", "required": true}]}]})
                    }
                    "prompts/get" => {
                        let who = req.body["params"]["arguments"]["who"].as_str().unwrap();
                        json!({"messages": [{"role": "user", "content": {"type": "text", "text": format!("Hello {who}")}}]})
                    }
                    "completion/complete" => {
                        assert_eq!(req.body["params"]["argument"]["value"], "a");
                        json!({"completion": {"values": ["alpha", "alps"], "hasMore": false}})
                    }
                    m => panic!("{m}"),
                },
            )))
        });
        let p = <Upstream as Guest>::get_prompt("greet".into()).unwrap();
        assert!(
            matches!(&p.messages[0].content, PromptMessageContent::Text(t) if t.text == "Hello {{who}}")
        );
        let prompts = <Upstream as Guest>::list_prompts();
        assert_eq!(prompts[0].arguments.as_ref().unwrap()[0].name, "who");
        // prompts/list was read once and cached.
        log(|l| assert_eq!(l.iter().filter(|r| r.method() == "prompts/list").count(), 1));
        let c = <Upstream as Guest>::complete(CompletionRequest {
            input: r#"{"ref":{"type":"ref/prompt","name":"greet"},"argument":{"name":"who","value":"a"}}"#.into(),
            streaming: None,
            meta: None,
        })
        .unwrap();
        assert_eq!(c.content.len(), 2);
    }

    /// A 2026-07-28 server: `server/discover` offers the revision, every
    /// other request goes to `on`. Each request must carry the revision in
    /// its `_meta` and headers, and `Mcp-Method` equal to its method.
    fn serve_modern(mut on: impl FnMut(&Req) -> Result<Answer, String> + 'static) {
        speak("auto");
        let server: Server = Box::new(move |req| {
            let meta = &req.body["params"]["_meta"];
            assert_eq!(
                meta["io.modelcontextprotocol/protocolVersion"],
                modern::VERSION
            );
            assert!(meta["io.modelcontextprotocol/clientCapabilities"].is_object());
            assert_eq!(req.header("mcp-protocol-version"), Some(modern::VERSION));
            assert_eq!(req.header("mcp-method"), Some(req.method()));
            assert_eq!(req.header("mcp-session-id"), None);
            match req.method() {
                "server/discover" => Ok(json_answer(&result(
                    req,
                    json!({
                        "resultType": "complete",
                        "supportedVersions": ["2026-07-28"],
                        "capabilities": {"tools": {"listChanged": true}, "prompts": {}},
                        "instructions": "Be modern.",
                        "_meta": {"io.modelcontextprotocol/serverInfo": {"name": "m", "title": "Modern", "version": "2"}}
                    }),
                ))),
                "initialize" => panic!("a 2026-07-28 server is never initialized"),
                _ => on(req),
            }
        });
        SERVER.with_borrow_mut(|s| *s = Some(server));
    }

    /// Two tools, the second with a header name that is not a token.
    fn tools_one_badly_declared(req: &Req) -> Result<Answer, String> {
        let bad = json!({"type": "object", "properties": {
            "region": {"type": "string", "x-mcp-header": "Cloud Region"}}});
        Ok(json_answer(&result(
            req,
            json!({"resultType": "complete", "tools": [
                {"name": "fine", "inputSchema": {"type": "object"}},
                {"name": "bad", "inputSchema": bad}]}),
        )))
    }

    #[test]
    fn a_modern_servers_tool_with_an_invalid_header_declaration_is_left_out() {
        serve_modern(|req| match req.method() {
            "tools/list" => tools_one_badly_declared(req),
            other => panic!("unexpected {other}"),
        });
        let names: Vec<String> = <Upstream as Guest>::list_tools()
            .into_iter()
            .map(|t| t.name)
            .collect();
        assert_eq!(names, ["fine"]);
        // A session-era server's tools keep it: the keyword means nothing
        // there, and no header is sent.
        serve(Some("s1"), |req| match req.method() {
            "tools/list" => tools_one_badly_declared(req),
            other => panic!("unexpected {other}"),
        });
        STATE.with_borrow_mut(|s| s.session = None);
        speak("2025-06-18");
        assert_eq!(<Upstream as Guest>::list_tools().len(), 2);
    }

    #[test]
    fn a_modern_server_is_discovered_and_every_request_names_itself() {
        serve_modern(|req| match req.method() {
            "tools/list" => Ok(json_answer(&result(
                req,
                json!({"resultType": "complete", "tools": [{"name": "geo", "inputSchema": {"type": "object", "properties": {
                    "region": {"type": "string", "x-mcp-header": "Region"}}}}]}),
            ))),
            "tools/call" => {
                assert_eq!(req.header("mcp-name"), Some("geo"));
                assert_eq!(
                    req.header("mcp-param-region"),
                    Some("=?base64?WsO8cmljaA==?=")
                );
                assert_eq!(
                    req.body["params"]["_meta"]["io.modelcontextprotocol/logLevel"],
                    "debug"
                );
                Ok(json_answer(&result(
                    req,
                    json!({"resultType": "complete", "content": [{"type": "text", "text": "ok"}]}),
                )))
            }
            other => panic!("unexpected {other}"),
        });
        assert_eq!(<Upstream as Guest>::title().as_deref(), Some("Modern"));
        assert_eq!(<Upstream as Guest>::instructions(), "Be modern.");
        let d = <Upstream as Guest>::describe_server();
        assert_eq!(d.meta.expect("the revision")[0].value, r#""2026-07-28""#);
        assert!(d.capabilities.tools.is_some() && d.capabilities.prompts.is_some());
        assert_eq!(<Upstream as Guest>::list_tools().len(), 1);
        let r =
            <Upstream as Guest>::call_tool("geo".into(), r#"{"region":"Zürich"}"#.into()).unwrap();
        let Response::Completed(r) = r else {
            panic!("completed")
        };
        assert!(matches!(&r.content[0], ContentBlock::Text(t) if t.text == "ok"));
        log(|l| {
            let methods: Vec<_> = l.iter().map(Req::method).collect();
            // Describing it again discovers it again: there is no session.
            assert_eq!(
                methods,
                [
                    "server/discover",
                    "server/discover",
                    "tools/list",
                    "tools/call"
                ]
            );
        });
    }

    #[test]
    fn a_modern_refusal_is_the_upstreams_error_not_a_transport_failure() {
        serve_modern(|req| {
            let body = json!({"jsonrpc": "2.0", "id": req.body["id"], "error": {"code": -32602, "message": "Unknown tool: nope"}});
            Ok(Answer::canned(
                400,
                "application/json",
                None,
                vec![body.to_string().into_bytes()],
            ))
        });
        let e = <Upstream as Guest>::call_tool("nope".into(), "{}".into()).unwrap_err();
        assert!(
            matches!(&e, ToolError::NotFound(m) if m.contains("Unknown tool")),
            "{e:?}"
        );
    }

    #[test]
    fn an_upstreams_questions_go_to_the_broker_and_its_retry_carries_the_answers() {
        serve_modern(|req| {
            let p = &req.body["params"];
            let r = match p.get("inputResponses") {
                None => json!({
                    "resultType": "input_required",
                    "inputRequests": {
                        "user_name": {"method": "elicitation/create", "params": {"message": "Name?", "requestedSchema": {"type": "object", "properties": {}}}},
                        "client_roots": {"method": "roots/list", "params": {}}
                    },
                    "requestState": "up-state-1"
                }),
                Some(answers) => {
                    assert_eq!(p["requestState"], "up-state-1");
                    // The broker's arguments never reach the upstream.
                    assert_eq!(p["arguments"], json!({"x": 1}));
                    let name = answers.pointer("/user_name/content/name").cloned();
                    json!({"resultType": "complete", "content": [{"type": "text", "text": format!("hi {}", name.unwrap_or_default())}]})
                }
            };
            Ok(json_answer(&result(req, r)))
        });
        let Response::Completed(first) =
            <Upstream as Guest>::call_tool("ask".into(), r#"{"x":1}"#.into()).unwrap()
        else {
            panic!("completed")
        };
        assert!(matches!(&first.content[0], ContentBlock::Text(t) if t.text == modern::ASKED));
        let meta = first.meta.unwrap_or_default();
        let entry = |k: &str| meta.iter().find(|e| e.key == k).map(|e| e.value.clone());
        let set: Value =
            serde_json::from_str(&entry("mcp-broker/input-requests").unwrap()).unwrap();
        assert_eq!(set["client_roots"]["method"], "roots/list");
        let state = entry("mcp-broker/state").unwrap();
        // The broker's retry: the answers by key, and this router's state.
        let retry = json!({
            "x": 1,
            "_inputs": {"user_name": {"action": "accept", "content": {"name": "Ada"}}, "client_roots": {"roots": []}},
            "_request_state": serde_json::from_str::<Value>(&state).unwrap()
        });
        let Response::Completed(second) =
            <Upstream as Guest>::call_tool("ask".into(), retry.to_string()).unwrap()
        else {
            panic!("completed")
        };
        assert!(matches!(&second.content[0], ContentBlock::Text(t) if t.text == "hi \"Ada\""));
    }

    #[test]
    fn auto_falls_back_to_a_session_when_discover_is_refused_and_modern_only_does_not() {
        speak("auto");
        serve(Some("s9"), |req| {
            match req.method() {
            // What a session-era server says to a request without a session.
            "server/discover" => Ok(Answer::canned(
                400,
                "application/json",
                None,
                vec![br#"{"jsonrpc":"2.0","id":"server-error","error":{"code":-32600,"message":"Bad Request: Missing session ID"}}"#.to_vec()],
            )),
            "tools/list" => Ok(json_answer(&result(req, json!({"tools": []})))),
            other => panic!("unexpected {other}"),
        }
        });
        assert!(<Upstream as Guest>::list_tools().is_empty());
        log(|l| {
            let methods: Vec<_> = l.iter().map(Req::method).collect();
            assert_eq!(
                methods,
                [
                    "server/discover",
                    "initialize",
                    "notifications/initialized",
                    "tools/list"
                ]
            );
            assert_eq!(l[3].header("mcp-session-id"), Some("s9"));
            assert_eq!(l[3].header("mcp-method"), None);
        });
    }

    #[test]
    fn auto_settles_for_a_session_only_when_the_server_refuses_discover() {
        speak("auto");
        // A reset (a pooled connection the server had just closed), a
        // proxy with no backend, a rate limit: none is the server saying
        // it serves no 2026-07-28.
        let reset = || Err("connection error: Connection reset by peer (os error 104)".to_owned());
        let mut unanswered = vec![
            // Twice: a probe whose connection failed is sent once more.
            reset(),
            reset(),
            Ok(Answer::canned(
                503,
                "text/plain",
                None,
                vec![b"no backend".to_vec()],
            )),
            Ok(Answer::canned(429, "text/plain", None, vec![])),
            Ok(Answer::canned(
                500,
                "text/plain",
                None,
                vec![b"Internal Server Error".to_vec()],
            )),
        ]
        .into_iter();
        let server: Server = Box::new(move |req| {
            match req.method() {
            "server/discover" => unanswered.next().unwrap_or_else(|| {
                Ok(json_answer(&result(
                    req,
                    json!({"resultType": "complete", "supportedVersions": ["2026-07-28"], "capabilities": {"tools": {}}}),
                )))
            }),
            "initialize" => panic!("an unanswered probe is no refusal: never initialize"),
            other => panic!("unexpected {other}"),
        }
        });
        SERVER.with_borrow_mut(|s| *s = Some(server));
        for why in ["reset by peer", "HTTP 503", "HTTP 429", "HTTP 500"] {
            let d = <Upstream as Guest>::describe_server();
            let reason = &d.meta.expect("unavailable")[0].value;
            assert!(
                reason.contains("server/discover") && reason.contains(why),
                "{reason}"
            );
            // Only a 500 may be a server refusing what it does not know
            // (FastMCP 1.8, stateless); a 503 is a server that is down.
            assert_eq!(
                reason.contains("upstream_protocol"),
                why == "HTTP 500",
                "{reason}"
            );
        }
        // Answered at the next try: the revision, not a session.
        let d = <Upstream as Guest>::describe_server();
        assert_eq!(d.meta.expect("the revision")[0].value, r#""2026-07-28""#);
    }

    #[test]
    fn a_probe_whose_connection_failed_is_sent_once_more() {
        speak("auto");
        let mut sent = 0;
        serve(None, move |req| match req.method() {
            "server/discover" => {
                sent += 1;
                if sent == 1 {
                    Err("connection error: Connection reset by peer (os error 104)".to_owned())
                } else {
                    Ok(json_answer(&result(
                        req,
                        json!({"resultType": "complete", "supportedVersions": ["2026-07-28"], "capabilities": {"tools": {}}}),
                    )))
                }
            }
            other => panic!("unexpected {other}"),
        });
        let d = <Upstream as Guest>::describe_server();
        assert_eq!(d.meta.expect("the revision")[0].value, r#""2026-07-28""#);
    }

    #[test]
    fn modern_only_reports_a_server_without_the_revision_unavailable() {
        speak("2026-07-28");
        serve(None, |req| match req.method() {
            "server/discover" => Ok(json_answer(&result(
                req,
                json!({"supportedVersions": ["2025-11-25"], "capabilities": {}}),
            ))),
            other => panic!("unexpected {other}"),
        });
        let d = <Upstream as Guest>::describe_server();
        let reason = &d.meta.expect("unavailable")[0].value;
        assert!(
            reason.contains("server/discover") && reason.contains("2025-11-25"),
            "{reason}"
        );
        speak("1999-01-01");
        STATE.with_borrow_mut(|s| s.session = None);
        let d = <Upstream as Guest>::describe_server();
        let reason = &d.meta.expect("unavailable")[0].value;
        assert!(reason.contains("MCP_UPSTREAM_PROTOCOL"), "{reason}");
    }

    #[test]
    fn a_session_era_upstream_gets_no_answers_it_never_asked_for() {
        serve(Some("s3"), |req| {
            let p = &req.body["params"];
            assert!(
                p.get("inputResponses").is_none() && p.get("requestState").is_none(),
                "{p}"
            );
            assert_eq!(p["arguments"], json!({"x": 1}));
            Ok(json_answer(&result(
                req,
                json!({"content": [{"type": "text", "text": "ok"}]}),
            )))
        });
        let args =
            r#"{"x":1,"_inputs":{"k":{"action":"accept"}},"_request_state":{"requestState":"t"}}"#;
        assert!(<Upstream as Guest>::call_tool("t".into(), args.into()).is_ok());
        log(|l| assert_eq!(l.last().map(Req::method), Some("tools/call")));
    }

    /// The session logic against an upstream that answers anything: any
    /// status, content type, session id and redirect target, bodies of
    /// JSON-RPC (right, wrong or half) or of bytes, in JSON or SSE, read
    /// in any chunks, or no answer at all. Every export returns, with a
    /// value or an error value (a panic here is a trap in the component).
    mod props {
        use super::*;
        use crate::arb;
        use proptest::prelude::*;
        use proptest::sample::select;

        /// Stands for the id of the request being answered: a scripted
        /// answer is written before the request it answers is sent.
        const THIS_ID: &str = "$this-request";

        #[derive(Debug, Clone)]
        enum Body {
            Bytes(Vec<u8>),
            Json(Value),
            /// Messages as SSE events, with this line ending; `cut`: the
            /// stream ends in the middle of its last event.
            Sse {
                msgs: Vec<Value>,
                eol: &'static str,
                cut: bool,
            },
        }

        #[derive(Debug, Clone)]
        struct Reply {
            /// No answer: a transport failure.
            fail: bool,
            status: u16,
            /// `None`: the one the body's kind calls for.
            content_type: Option<String>,
            session: Option<String>,
            location: Option<String>,
            body: Body,
            reads: arb::Reads,
        }

        /// A response to the request (a result answering every method,
        /// or an error), or any message, or a batch of them.
        fn message() -> BoxedStrategy<Value> {
            let error = arb::object(vec![
                (
                    "code",
                    arb::or_any(prop_oneof![
                        Just(json!(-32602)),
                        Just(json!(-32601)),
                        Just(json!(-32002)),
                        arb::number()
                    ]),
                ),
                ("message", arb::text()),
            ]);
            prop_oneof![
                4 => (arb::or_any(arb::any_result()), prop::option::weighted(0.2, error)).prop_map(
                    |(result, error)| {
                        let mut m = json!({"jsonrpc": "2.0", "id": THIS_ID, "result": result});
                        if let Some(e) = error {
                            m["error"] = e;
                        }
                        m
                    }
                ),
                2 => arb::message(),
                1 => arb::message_or_batch(),
            ]
            .boxed()
        }

        fn body() -> impl Strategy<Value = Body> {
            prop_oneof![
                1 => prop::collection::vec(any::<u8>(), 0..64).prop_map(Body::Bytes),
                3 => message().prop_map(Body::Json),
                3 => (
                    prop::collection::vec(message(), 0..4),
                    select(vec!["\n", "\r\n", "\r"]),
                    prop::bool::weighted(0.1),
                )
                    .prop_map(|(msgs, eol, cut)| Body::Sse { msgs, eol, cut }),
            ]
        }

        /// Any answer: a status, content type, session id, redirect target
        /// and body of any kind, or none.
        fn any_reply() -> impl Strategy<Value = Reply> {
            (
                prop::bool::weighted(0.05),
                prop_oneof![
                    6 => Just(200u16),
                    2 => select(vec![202u16, 204, 307, 400, 404, 405, 429, 500, 503]),
                    1 => any::<u16>(),
                ],
                prop::option::weighted(
                    0.2,
                    prop_oneof![
                        select(vec![
                            "application/json",
                            "Application/JSON; charset=utf-8",
                            "text/event-stream",
                            "text/event-stream;charset=UTF-8",
                            "text/plain",
                            "",
                        ])
                        .prop_map(str::to_owned),
                        arb::string(),
                    ],
                ),
                prop::option::weighted(0.3, prop_oneof![Just("s1".to_owned()), arb::string()]),
                prop::option::weighted(0.1, prop_oneof![Just("/mcp/".to_owned()), arb::string()]),
                body(),
                arb::reads(),
            )
                .prop_map(
                    |(fail, status, content_type, session, location, body, reads)| Reply {
                        fail,
                        status,
                        content_type,
                        session,
                        location,
                        body,
                        reads,
                    },
                )
        }

        /// A result that answers whatever was asked, and opens a session
        /// of either revision offering every capability, so that the
        /// exports go past the handshake to their own requests.
        fn good_result() -> BoxedStrategy<Value> {
            (arb::any_result(), prop::bool::weighted(0.8))
                .prop_map(|(mut r, last_page)| {
                    // Mostly the last page: a list whose every page names a
                    // next one is read 100 times, which costs time and finds
                    // nothing more.
                    if last_page && let Some(o) = r.as_object_mut() {
                        o.remove("nextCursor");
                    }
                    r["supportedVersions"] = json!([modern::VERSION]);
                    r["capabilities"] =
                        json!({"tools": {}, "resources": {}, "prompts": {}, "completions": {}});
                    r
                })
                .boxed()
        }

        /// A 200 answering the request with a result (in JSON, or on SSE
        /// after other messages), in any reads.
        fn good_reply() -> impl Strategy<Value = Reply> {
            let response = good_result()
                .prop_map(|r| json!({"jsonrpc": "2.0", "id": THIS_ID, "result": r}))
                .boxed();
            let body = prop_oneof![
                response.clone().prop_map(Body::Json),
                (
                    prop::collection::vec(arb::message(), 0..3),
                    response,
                    select(vec!["\n", "\r\n", "\r"])
                )
                    .prop_map(|(mut msgs, r, eol)| {
                        msgs.push(r);
                        Body::Sse {
                            msgs,
                            eol,
                            cut: false,
                        }
                    }),
            ];
            (prop::option::of(Just("s1".to_owned())), body, arb::reads()).prop_map(
                |(session, body, reads)| Reply {
                    fail: false,
                    status: 200,
                    content_type: None,
                    session,
                    location: None,
                    body,
                    reads,
                },
            )
        }

        fn reply() -> impl Strategy<Value = Reply> {
            prop_oneof![3 => good_reply().boxed(), 2 => any_reply().boxed()]
        }

        /// `m` with [`THIS_ID`] made `id`, in a batch too.
        fn addressed(m: &Value, id: &Value) -> Value {
            match m {
                Value::Array(batch) => {
                    Value::Array(batch.iter().map(|m| addressed(m, id)).collect())
                }
                Value::Object(o) if o.get("id") == Some(&json!(THIS_ID)) => {
                    let mut o = o.clone();
                    o.insert("id".into(), id.clone());
                    Value::Object(o)
                }
                m => m.clone(),
            }
        }

        impl Reply {
            /// The answer to a request with `id`.
            fn answer(&self, id: &Value) -> Result<Answer, String> {
                if self.fail {
                    return Err("connection reset".into());
                }
                let (bytes, kind) = match &self.body {
                    Body::Bytes(b) => (b.clone(), "text/plain"),
                    Body::Json(m) => (
                        addressed(m, id).to_string().into_bytes(),
                        "application/json",
                    ),
                    Body::Sse { msgs, eol, cut } => {
                        let mut text = format!(": hello{eol}{eol}");
                        for m in msgs {
                            text.push_str(&format!(
                                "event: message{eol}data: {}{eol}{eol}",
                                addressed(m, id)
                            ));
                        }
                        if *cut {
                            text.truncate(text.len().saturating_sub(1 + 2 * eol.len()));
                        }
                        (text.into_bytes(), "text/event-stream")
                    }
                };
                let ct = self.content_type.as_deref().unwrap_or(kind);
                let mut a = Answer::canned(
                    self.status,
                    ct,
                    self.session.as_deref(),
                    self.reads.split(&bytes),
                );
                a.location = self.location.clone();
                Ok(a)
            }
        }

        /// A fresh instance, whose upstream answers `replies` in turn (over
        /// and over), its GETs `gets`; bounded, so that a cursor loop or
        /// retries end.
        fn script(protocol: &'static str, replies: Vec<Reply>, gets: Vec<Reply>) {
            STATE.with_borrow_mut(|s| *s = State::default());
            LOG.with_borrow_mut(Vec::clear);
            REPORTED.with_borrow_mut(Vec::clear);
            GET_LOG.with_borrow_mut(Vec::clear);
            speak(protocol);
            GETS.with_borrow_mut(|g| {
                *g = gets
                    .iter()
                    .filter_map(|r| r.answer(&json!(0)).ok())
                    .collect();
            });
            let mut n = 0;
            let server: Server = Box::new(move |req| {
                n += 1;
                if n > 200 {
                    return Err("connection refused".into());
                }
                replies[n % replies.len()].answer(&req.body["id"])
            });
            SERVER.with_borrow_mut(|s| *s = Some(server));
        }

        /// An error of the router's own making says it is the upstream's
        /// (unavailable, its error, its question): nothing bare escapes.
        fn worded(m: &str) -> Result<(), TestCaseError> {
            prop_assert!(
                m.starts_with("upstream ") || m.starts_with("the upstream asks"),
                "{}",
                m
            );
            Ok(())
        }

        proptest! {
            // Each case scripts up to ten answers (generating them is what
            // costs) and runs every export against them.
            #![proptest_config(ProptestConfig::with_cases(64))]

            #[test]
            fn any_upstream_answer_is_a_value_never_a_trap(
                protocol in select(vec!["2025-06-18", "auto", "2026-07-28"]),
                replies in prop::collection::vec(reply(), 1..8),
                gets in prop::collection::vec(reply(), 0..2),
            ) {
                script(protocol, replies, gets);
                let d = <Upstream as Guest>::describe_server();
                let meta = d.meta.unwrap_or_default();
                // Either the revision spoken or why the upstream is
                // unavailable, as a JSON string.
                prop_assert_eq!(meta.len(), 1);
                prop_assert!(
                    [rpc::META_PROTOCOL, rpc::META_UNAVAILABLE].contains(&meta[0].key.as_str()),
                    "{}",
                    meta[0].key
                );
                let value = serde_json::from_str::<Value>(&meta[0].value);
                prop_assert!(value.is_ok_and(|v| v.is_string()));
                <Upstream as Guest>::title();
                <Upstream as Guest>::instructions();
                <Upstream as Guest>::list_tools();
                <Upstream as Guest>::list_resources();
                <Upstream as Guest>::list_prompts();
                let called = <Upstream as Guest>::call_tool("t".into(), r#"{"x":1}"#.into());
                if let Err(ToolError::ExecutionError(m)) = called {
                    worded(&m)?;
                }
                let read = <Upstream as Guest>::read_resource("x://1".into());
                if let Err(ResourceError::ExecutionError(m)) = read {
                    worded(&m)?;
                }
                let got = <Upstream as Guest>::get_prompt("greet".into());
                if let Err(PromptError::InternalError(m)) = got {
                    worded(&m)?;
                }
                let request = CompletionRequest {
                    input: json!({
                        "ref": {"type": "ref/prompt", "name": "greet"},
                        "argument": {"name": "who", "value": "a"}
                    })
                    .to_string(),
                    streaming: None,
                    meta: None,
                };
                let completed = <Upstream as Guest>::complete(request);
                if let Err(CompletionError::ExecutionError(m)) = completed {
                    worded(&m)?;
                }
            }
        }
    }
}
