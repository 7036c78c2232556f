//! One request in, its responses out: the broker's request handling,
//! shared by the frame edge, cross-shard hand-offs and the gRPC edge.
//!
//! # Invariants
//! - Every call of [`handle`] appends exactly one final response frame to
//!   `out` (preceded, for a tool with progress, by its progress frames).
//! - Payloads are never decoded here: the route key and arguments are read
//!   through the verified view; arguments become the router's JSON object by
//!   concatenation, after a scan (no allocation) that each value is exactly
//!   one JSON value, so that no value can add keys (InvalidParams if not).
//! - The shard's `ResponseEncoder` is borrowed only between awaits.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use mcp_schema::args::InvalidArgument;
use mcp_schema::encode::ReplyTo;
use mcp_schema::fb::protocol as p;
use mcp_schema::verify::VerifiedRequest;
use mcp_schema::{ErrorCode, RequestKind, ResponseEncoder, RouteKey, write_arguments_json_checked};

use crate::adapt;
use crate::config::Affinity;
use crate::routing::{Routed, Routing, ShardPools};
use crate::shared::{Shared, SubmitError};
use crate::wasm::{RouterPool, types as w};

/// Protocol versions this broker speaks, oldest first.
pub const SUPPORTED_VERSIONS: [p::ProtocolVersion; 3] = [
    p::ProtocolVersion::V2024_11_05,
    p::ProtocolVersion::V2025_01_01,
    p::ProtocolVersion::V2025_06_18,
];

/// MCP version negotiation: the client's version when supported, else the
/// latest we support.
pub fn negotiate(client: p::ProtocolVersion) -> p::ProtocolVersion {
    if SUPPORTED_VERSIONS.contains(&client) {
        client
    } else {
        SUPPORTED_VERSIONS[SUPPORTED_VERSIONS.len() - 1]
    }
}

/// A shard's request-handling state.
pub struct ShardCtx {
    pub index: usize,
    pub shared: Arc<Shared>,
    /// This shard's pools of every router of the published routing (and
    /// of retired ones still finishing calls).
    pub pools: RefCell<ShardPools>,
    pub enc: RefCell<ResponseEncoder>,
}

impl ShardCtx {
    /// The routing in effect (a request keeps the one it started with).
    fn routing(&self) -> arc_swap::Guard<Arc<Routing>> {
        self.shared.routing.load()
    }

    /// This shard's pool of `r`: a handle the call keeps, so that a reload
    /// retiring the pool meanwhile lets the call finish in it. `None` only
    /// if `r` was retired between the routing's load and this call, which
    /// the reload's order (install, publish, retire) rules out for a
    /// request that reads both without an await between.
    fn pool(&self, r: &Routed) -> Option<RouterPool> {
        self.pools.borrow().get(r.uid).cloned()
    }

    /// Where a router's request of `session` must run: `None` = here.
    fn owner_shard(&self, r: &Routed, session: Option<&str>) -> Option<usize> {
        if r.affinity != Affinity::Session {
            return None;
        }
        let session = session?;
        let owner = self.shared.owner_of(session);
        (owner != self.index).then_some(owner)
    }
}

/// A tool call to a router that reports progress and logs while it runs.
struct Live<'a> {
    ctx: &'a Rc<ShardCtx>,
    to: &'a mcp_schema::encode::ReplyTo<'a>,
    id: &'a mcp_schema::fb::UUID,
    /// The edge's live channel; `None`: the frames go to `out` before the
    /// final answer.
    out: Option<&'a dyn LiveOut>,
    /// The called router: the only one whose resources it may update.
    router: crate::route::RouterId,
}

impl Live<'_> {
    /// Runs the call, turning each event it reports into a frame as it
    /// arrives.
    async fn run(
        &self,
        caller: crate::wasm::Caller<'_>,
        tool: &str,
        json: &str,
        deadline: Duration,
        out: &mut Vec<u8>,
    ) -> Result<w::Response, crate::wasm::CallError> {
        use futures_core::Stream;
        let (tx, mut rx) = futures_channel::mpsc::unbounded();
        // Whose view of its resources the call changes.
        let instance = caller.instance();
        let call = caller.call_tool_live(tool, json, deadline, Some(tx));
        let mut call = std::pin::pin!(call);
        let mut step = 0u32;
        /// What woke the call's task: its answer, or an event before it.
        enum Next<R> {
            Done(R),
            Event(crate::wasm::LiveEvent),
        }
        let result = loop {
            let next = std::future::poll_fn(|cx| {
                use std::task::Poll;
                if let Poll::Ready(r) = call.as_mut().poll(cx) {
                    return Poll::Ready(Next::Done(r));
                }
                match std::pin::Pin::new(&mut rx).poll_next(cx) {
                    Poll::Ready(Some(ev)) => Poll::Ready(Next::Event(ev)),
                    // Every sender gone: only the call is left to wait for.
                    Poll::Ready(None) | Poll::Pending => Poll::Pending,
                }
            })
            .await;
            match next {
                Next::Event(ev) => self.emit(&ev, &mut step, out, instance),
                Next::Done(r) => break r,
            }
        };
        // Reported just before the call returned, not yet taken.
        while let Ok(ev) = rx.try_recv() {
            self.emit(&ev, &mut step, out, instance);
        }
        result
    }

    fn emit(
        &self,
        ev: &crate::wasm::LiveEvent,
        step: &mut u32,
        out: &mut Vec<u8>,
        instance: Option<Option<&str>>,
    ) {
        if let crate::wasm::LiveEvent::ResourceUpdated { uri } = ev {
            // Told to its subscribers, wherever they are, whose view of it
            // the call changed; only for a URI of this router, so that one
            // router cannot speak for another's.
            let routing = self.ctx.shared.routing.load();
            if routing.table.resource(uri) == Some(self.router) {
                use crate::shared::UpdateScope;
                let scope = match instance {
                    None => UpdateScope::Everyone,
                    Some(key) => UpdateScope::Session(key.map(Into::into)),
                };
                self.ctx.shared.notify_resource_updated(uri, &scope);
            }
            return;
        }
        let mut enc = self.ctx.enc.borrow_mut();
        let frame = match ev {
            crate::wasm::LiveEvent::Progress {
                progress,
                total,
                message,
            } => {
                *step += 1;
                // The frame's fraction, for frame clients; with no total
                // there is none (the value itself once went out as one:
                // "3 of 1"), and the MCP edges send the value as reported.
                let fraction = match total {
                    Some(t) if *t > 0.0 => progress / t,
                    _ => 0.0,
                };
                let finite = |x: f64| x.is_finite().then_some(x);
                // A total of 0 or less is none (no fraction was made of it
                // either).
                let total = total.and_then(finite).filter(|t| *t > 0.0);
                let mcp = finite(*progress).map(|v| (v, total));
                adapt::progress_frame(
                    &mut enc,
                    self.to,
                    self.id,
                    fraction as f32,
                    message.as_deref(),
                    *step,
                    0,
                    mcp,
                )
            }
            crate::wasm::LiveEvent::Log {
                level,
                logger,
                data,
            } => adapt::log_frame(&mut enc, self.to, level, logger.as_deref(), data),
            crate::wasm::LiveEvent::ResourceUpdated { .. } => return,
        };
        match self.out {
            Some(live) => {
                // The edge's conversion must be free to use the shard's
                // encoder: hand it a copy (notifications are few).
                let frame = frame.to_vec();
                drop(enc);
                live.frame(&frame);
            }
            None => out.extend_from_slice(frame),
        }
    }
}

/// Times a router call for `mcp_wasm_call_duration_seconds`, from asking
/// the pool for an instance to the result. Dropped unfinished (the request's
/// future was dropped: a gRPC deadline, a client gone), it records the time
/// until then, so calls cut short stay in the histogram.
struct CallTimer<'a> {
    ctx: &'a ShardCtx,
    slot: usize,
    t0: std::time::Instant,
    armed: bool,
}

impl<'a> CallTimer<'a> {
    fn start(ctx: &'a ShardCtx, slot: usize) -> Self {
        Self {
            ctx,
            slot,
            t0: std::time::Instant::now(),
            armed: true,
        }
    }

    /// Records the call unless its pool refused it at once (overloaded:
    /// every instance busy and the queue full): a refusal ran nothing, and
    /// its microseconds counted as calls pulled the histogram down exactly
    /// when the router was saturated.
    fn finish<T>(mut self, result: &Result<T, crate::wasm::CallError>) {
        use crate::wasm::CallError::{Overloaded, SessionsFull};
        self.armed = !matches!(result, Err(Overloaded | SessionsFull));
    }
}

impl Drop for CallTimer<'_> {
    fn drop(&mut self) {
        if self.armed {
            crate::metrics::record::wasm_call(self.ctx, self.slot, self.t0);
        }
    }
}

/// Longest session id a session-affine router accepts (the gRPC edge's own
/// limit): each live session keeps its id, so the id's length bounds that
/// memory.
pub const MAX_SESSION_ID_BYTES: usize = 256;

/// The session key `req` reaches `router`'s instances by: `None` unless the
/// router is session-affine, the only kind with per-session instances (a
/// scoped request's key is an allocation, not made for the others).
fn session_for<'a>(
    router: &Routed,
    req: &VerifiedRequest,
    view: &mcp_schema::RequestView<'a>,
) -> Option<std::borrow::Cow<'a, str>> {
    if router.affinity != Affinity::Session {
        return None;
    }
    req.session_key(view.session_id())
}

/// For a session-affine router: answers `req` when it does not run here,
/// either handed to its session's owner shard or refused for an overlong
/// session id. `true` when answered.
async fn answered_elsewhere(
    ctx: &Rc<ShardCtx>,
    router: &Routed,
    req: &VerifiedRequest,
    out: &mut Vec<u8>,
) -> bool {
    if router.affinity != Affinity::Session {
        return false;
    }
    let view = req.view();
    if view
        .session_id()
        .is_some_and(|s| s.len() > MAX_SESSION_ID_BYTES)
    {
        let msg = format!(
            "session_id is longer than {MAX_SESSION_ID_BYTES} bytes (session-affine router)"
        );
        let to = view.reply_to();
        out.extend_from_slice(ctx.enc.borrow_mut().error(
            &to,
            ErrorCode::InvalidRequest,
            &msg,
            None,
        ));
        return true;
    }
    match ctx.owner_shard(router, req.session_key(view.session_id()).as_deref()) {
        Some(owner) => {
            forward(ctx, owner, req, out).await;
            true
        }
        None => false,
    }
}

/// The answer for a router whose pool a reload retired under the request
/// (see [`ShardCtx::pool`]).
fn retired(ctx: &ShardCtx, out: &mut Vec<u8>, to: &ReplyTo<'_>, r: &Routed) {
    let msg = format!(
        "router `{}` was removed or replaced by a configuration reload",
        r.name
    );
    out.extend_from_slice(
        ctx.enc
            .borrow_mut()
            .error(to, ErrorCode::NotFound, &msg, None),
    );
}

fn not_found(ctx: &ShardCtx, out: &mut Vec<u8>, to: &ReplyTo<'_>, what: &str, name: &str) {
    let msg = format!("unknown {what} `{name}`");
    out.extend_from_slice(
        ctx.enc
            .borrow_mut()
            .error(to, ErrorCode::NotFound, &msg, None),
    );
}

/// Where an edge takes a request's notifications while it runs: the
/// progress and log frames a router reports through `mcp-broker:host/call`
/// (`wit/host/host.wit`), each sent on before the call ends. Without one,
/// they are appended to the request's frames ahead of its final answer.
pub trait LiveOut {
    /// One non-final response frame (progress or log) of the request.
    fn frame(&self, frame: &[u8]);

    /// With `[auth]`: whether the edge's caller may see tool `name` in a
    /// listing. Edges that filter their own answers (HTTP, gRPC) keep the
    /// default; the frame edge asks its connection's principal.
    fn shows_tool(&self, _auth: &crate::auth::Auth, _name: &str) -> bool {
        true
    }

    /// Whether a notification no request of its asked for now (a list
    /// change, a resource update) may go to it. The frame edge says no
    /// while its connection's token has expired: it refuses the
    /// connection's requests then, and its subscriptions went on hearing.
    /// They hear again once the connection authenticates anew.
    fn hears_unasked(&self) -> bool {
        true
    }
}

/// Handles one verified request, appending its response frames to `out`.
/// `args` is a reused buffer for the tool arguments' JSON.
pub async fn handle(
    ctx: &Rc<ShardCtx>,
    req: &VerifiedRequest,
    args: &mut Vec<u8>,
    out: &mut Vec<u8>,
) {
    handle_live(ctx, req, args, out, None).await
}

/// [`handle`], with the notifications of a running call sent to `live`.
pub async fn handle_live(
    ctx: &Rc<ShardCtx>,
    req: &VerifiedRequest,
    args: &mut Vec<u8>,
    out: &mut Vec<u8>,
    live: Option<&dyn LiveOut>,
) {
    let view = req.view();
    let to = view.reply_to();
    if ctx.shared.is_draining() {
        let mut enc = ctx.enc.borrow_mut();
        out.extend_from_slice(enc.error(
            &to,
            ErrorCode::ShuttingDown,
            "the broker is shutting down",
            None,
        ));
        return;
    }
    let routing = ctx.routing();
    let table = &routing.table;
    match (view.kind(), view.route_key()) {
        (RequestKind::Ping, _) => out.extend_from_slice(ctx.enc.borrow_mut().pong(&to)),
        (RequestKind::Initialize, _) => initialize(ctx, &view, out),
        (RequestKind::SetLogLevel, _) => out.extend_from_slice(ctx.enc.borrow_mut().empty(&to)),
        (
            kind @ (RequestKind::ListTools
            | RequestKind::ListResources
            | RequestKind::ListResourceTemplates
            | RequestKind::ListPrompts),
            _,
        ) => {
            let r = view.request();
            let cursor = match kind {
                RequestKind::ListTools => {
                    r.payload_as_list_tools_request().and_then(|x| x.cursor())
                }
                RequestKind::ListResources => r
                    .payload_as_list_resources_request()
                    .and_then(|x| x.cursor()),
                RequestKind::ListResourceTemplates => r
                    .payload_as_list_resource_templates_request()
                    .and_then(|x| x.cursor()),
                _ => r.payload_as_list_prompts_request().and_then(|x| x.cursor()),
            };
            // With `[auth]`, the tools this caller may call (the frame edge;
            // the others filter their own answers).
            let shown: Option<Vec<crate::route::Listed<w::Tool>>> =
                match (kind, &ctx.shared.auth, live) {
                    (RequestKind::ListTools, Some(auth), Some(l)) => Some(
                        table
                            .tool_list
                            .iter()
                            .filter(|t| l.shows_tool(auth, &t.exposed))
                            .cloned()
                            .collect(),
                    ),
                    _ => None,
                };
            let tool_list = shown.as_deref().unwrap_or(&table.tool_list);
            let len = match kind {
                RequestKind::ListTools => tool_list.len(),
                RequestKind::ListResources => table.resource_list.len(),
                RequestKind::ListResourceTemplates => table.template_list.len(),
                _ => table.prompt_list.len(),
            };
            let mut enc = ctx.enc.borrow_mut();
            let listing = routing.listing;
            let start = match adapt::parse_cursor(cursor, len, listing) {
                Ok(start) => start,
                Err(bad) => {
                    out.extend_from_slice(enc.error(
                        &to,
                        ErrorCode::InvalidParams,
                        bad.message(),
                        None,
                    ));
                    return;
                }
            };
            let at = adapt::Page {
                start,
                size: ctx.shared.config.broker.list_page_size,
                table: listing,
            };
            match kind {
                RequestKind::ListTools => adapt::list_tools(&mut enc, out, &to, tool_list, at),
                RequestKind::ListResources => {
                    adapt::list_resources(&mut enc, out, &to, &table.resource_list, at)
                }
                RequestKind::ListResourceTemplates => {
                    adapt::list_templates(&mut enc, out, &to, &table.template_list, at)
                }
                _ => adapt::list_prompts(&mut enc, out, &to, &table.prompt_list, at),
            }
        }
        (RequestKind::Subscribe | RequestKind::Unsubscribe, RouteKey::Resource(uri)) => {
            if table.resource(uri).is_none() {
                return not_found(ctx, out, &to, "resource", uri);
            }
            out.extend_from_slice(ctx.enc.borrow_mut().empty(&to));
        }
        (RequestKind::CallTool, RouteKey::Tool(name)) => {
            crate::fault::on_tool_call(name);
            let Some(target) = table.tool(name) else {
                return not_found(ctx, out, &to, "tool", name);
            };
            let router = &routing.routers[target.router as usize];
            if answered_elsewhere(ctx, router, req, out).await {
                return;
            }
            let tc = view.tool_call().expect("classified as a tool call");
            if let Err(e) = write_arguments_json_checked(Some(tc.arguments()), args) {
                return invalid_argument(ctx, out, &to, e);
            }
            // Keys are escaped and values are verified UTF-8 strings, so the
            // object is UTF-8; checked anyway, it is cheap and never unsafe.
            let Ok(json) = std::str::from_utf8(args) else {
                let mut enc = ctx.enc.borrow_mut();
                out.extend_from_slice(enc.error(
                    &to,
                    ErrorCode::InvalidParams,
                    "arguments are not UTF-8",
                    None,
                ));
                return;
            };
            if ctx.shared.config.bench.native_echo {
                // Bench-only ([bench] native_echo): routing without WASM.
                let mut enc = ctx.enc.borrow_mut();
                out.extend_from_slice(enc.tool_text(&to, tc.id(), json, None, false));
                return;
            }
            let Some(pool) = ctx.pool(router) else {
                return retired(ctx, out, &to, router);
            };
            let deadline = call_deadline(&pool, view.timeout_ms());
            let timer = CallTimer::start(ctx, router.slot);
            let session = session_for(router, req, &view);
            let caller = pool.caller(session.as_deref());
            let result = if pool.reports_live() {
                let id = *tc.id();
                let call = Live {
                    ctx,
                    to: &to,
                    id: &id,
                    out: live,
                    router: target.router,
                };
                call.run(caller, &target.name, json, deadline, out).await
            } else {
                caller.call_tool_within(&target.name, json, deadline).await
            };
            timer.finish(&result);
            if let Ok(w::Response::Completed(tr)) = &result
                && tr.meta.as_ref().is_some_and(|m| {
                    m.iter()
                        .any(|e| e.key == crate::upstream::LIST_CHANGED_META_KEY)
                })
            {
                // The upstream announced a list change during the call.
                ctx.shared.request_refresh(router.uid);
            }
            let mut enc = ctx.enc.borrow_mut();
            match result {
                Ok(r) => adapt::tool_response(&mut enc, out, &to, tc.id(), &r),
                Err(e) => {
                    adapt::call_error(&mut enc, out, &to, Some(tc.id()), &e);
                }
            }
        }
        (RequestKind::ReadResource, RouteKey::Resource(uri)) => {
            let Some(router) = table.resource(uri) else {
                return not_found(ctx, out, &to, "resource", uri);
            };
            let router = &routing.routers[router as usize];
            if answered_elsewhere(ctx, router, req, out).await {
                return;
            }
            let Some(pool) = ctx.pool(router) else {
                return retired(ctx, out, &to, router);
            };
            let timer = CallTimer::start(ctx, router.slot);
            let session = session_for(router, req, &view);
            let result = pool.caller(session.as_deref()).read_resource(uri).await;
            timer.finish(&result);
            let listed = table.listed_resource(uri);
            let mut enc = ctx.enc.borrow_mut();
            match result {
                Ok(r) => adapt::resource_response(&mut enc, out, &to, uri, &r, listed),
                Err(e) => {
                    adapt::call_error(&mut enc, out, &to, None, &e);
                }
            }
        }
        (RequestKind::GetPrompt, RouteKey::Prompt(name)) => {
            let Some(target) = table.prompt(name) else {
                return not_found(ctx, out, &to, "prompt", name);
            };
            let router = &routing.routers[target.router as usize];
            if answered_elsewhere(ctx, router, req, out).await {
                return;
            }
            let pr = view
                .request()
                .payload_as_prompt_request()
                .expect("classified as a prompt request");
            let mut prompt_args: Vec<(&str, &str)> = pr
                .arguments()
                .iter()
                .flatten()
                .map(|kv| (kv.key(), kv.value().unwrap_or("null")))
                .collect();
            // The prompt's declared arguments: a required one missing is the
            // client's error (MCP: invalid params), an optional one missing
            // fills its placeholders with nothing rather than leaving
            // `{{name}}` in the text.
            let declared = table
                .prompt_list
                .iter()
                .find(|l| &*l.exposed == name)
                .and_then(|l| l.item.arguments.as_deref())
                .unwrap_or_default();
            for a in declared {
                if prompt_args.iter().any(|(k, _)| *k == a.name) {
                    continue;
                }
                if a.required == Some(true) {
                    let msg = format!("prompt `{name}` needs the argument `{}`", a.name);
                    out.extend_from_slice(ctx.enc.borrow_mut().error(
                        &to,
                        ErrorCode::InvalidParams,
                        &msg,
                        None,
                    ));
                    return;
                }
                prompt_args.push((&a.name, "\"\""));
            }
            let Some(pool) = ctx.pool(router) else {
                return retired(ctx, out, &to, router);
            };
            let timer = CallTimer::start(ctx, router.slot);
            let result = pool
                .caller(session_for(router, req, &view).as_deref())
                .get_prompt(&target.name)
                .await;
            timer.finish(&result);
            let mut enc = ctx.enc.borrow_mut();
            match result {
                Ok(r) => {
                    // The answer is one frame: its filled text cannot be more.
                    let cap = ctx.shared.config.frames.max_frame_bytes as usize;
                    adapt::prompt_response(&mut enc, out, &to, name, &r, &prompt_args, cap)
                }
                Err(e) => {
                    adapt::call_error(&mut enc, out, &to, None, &e);
                }
            }
        }
        (RequestKind::Complete, RouteKey::Completion { kind, name }) => {
            let (router, ref_type, routed_name) = if kind == p::CompletionRefKind::Resource {
                (
                    table.resource(name).map(|r| r as usize),
                    "ref/resource",
                    name.to_string(),
                )
            } else {
                match table.prompt(name) {
                    Some(t) => (Some(t.router as usize), "ref/prompt", t.name.to_string()),
                    None => (None, "ref/prompt", name.to_string()),
                }
            };
            let Some(router) = router else {
                return not_found(
                    ctx,
                    out,
                    &to,
                    if ref_type == "ref/prompt" {
                        "prompt"
                    } else {
                        "resource"
                    },
                    name,
                );
            };
            let router = &routing.routers[router];
            if answered_elsewhere(ctx, router, req, out).await {
                return;
            }
            let c = view
                .request()
                .payload_as_complete_request()
                .expect("classified as a completion");
            let input = match completion_input(ref_type, &routed_name, c) {
                Ok(input) => input,
                Err(e) => return invalid_argument(ctx, out, &to, e),
            };
            let request = w::CompletionRequest {
                input,
                streaming: None,
                meta: None,
            };
            let Some(pool) = ctx.pool(router) else {
                return retired(ctx, out, &to, router);
            };
            let timer = CallTimer::start(ctx, router.slot);
            let session = session_for(router, req, &view);
            let result = pool.caller(session.as_deref()).complete(&request).await;
            timer.finish(&result);
            let mut enc = ctx.enc.borrow_mut();
            match result {
                Ok(r) => adapt::complete_response(&mut enc, out, &to, &r),
                Err(e) => {
                    adapt::call_error(&mut enc, out, &to, None, &e);
                }
            }
        }
        // `classify` pairs each kind with its key; no other pair exists.
        (kind, key) => {
            let msg = format!(
                "request kind {} with route key {key:?} is not served",
                kind.as_str()
            );
            out.extend_from_slice(
                ctx.enc
                    .borrow_mut()
                    .error(&to, ErrorCode::Internal, &msg, None),
            );
        }
    }
}

fn call_deadline(pool: &RouterPool, client_ms: Option<u32>) -> Duration {
    let router = pool.router().spec().call_deadline;
    match client_ms {
        Some(ms) => router.min(Duration::from_millis(ms.into())),
        None => router,
    }
}

/// The JSON the WIT `complete` receives (MCP `completion/complete` params);
/// refused like a tool call's when a context argument is not one JSON value.
fn completion_input<'a>(
    ref_type: &str,
    name: &str,
    c: p::CompleteRequest<'a>,
) -> Result<String, InvalidArgument<'a>> {
    use mcp_schema::args::write_json_string;
    let mut s = Vec::with_capacity(128);
    s.extend_from_slice(b"{\"ref\":{\"type\":");
    write_json_string(ref_type, &mut s);
    s.extend_from_slice(if ref_type == "ref/prompt" {
        b",\"name\":"
    } else {
        b",\"uri\":"
    });
    write_json_string(name, &mut s);
    s.extend_from_slice(b"},\"argument\":{\"name\":");
    write_json_string(c.argument_name(), &mut s);
    s.extend_from_slice(b",\"value\":");
    write_json_string(c.argument_value().unwrap_or(""), &mut s);
    s.extend_from_slice(b"}");
    if let Some(ctx) = c.context() {
        s.extend_from_slice(b",\"context\":{\"arguments\":");
        let mut obj = Vec::new();
        write_arguments_json_checked(Some(ctx), &mut obj)?;
        s.extend_from_slice(&obj);
        s.extend_from_slice(b"}");
    }
    s.push(b'}');
    Ok(String::from_utf8(s).unwrap_or_default())
}

/// The InvalidParams answer naming an argument that is not one JSON value.
fn invalid_argument(ctx: &ShardCtx, out: &mut Vec<u8>, to: &ReplyTo<'_>, e: InvalidArgument<'_>) {
    let msg = e.to_string();
    out.extend_from_slice(
        ctx.enc
            .borrow_mut()
            .error(to, ErrorCode::InvalidParams, &msg, None),
    );
}

fn initialize(ctx: &ShardCtx, view: &mcp_schema::RequestView<'_>, out: &mut Vec<u8>) {
    let to = view.reply_to();
    let init = view
        .request()
        .payload_as_initialize_request()
        .expect("classified as initialize");
    let version = negotiate(init.client_capabilities().protocol_version());
    let routing = ctx.shared.routing.load();
    let table = &routing.table;
    // An upstream router's listings may appear later (its upstream comes
    // back, or adds tools): offer what it may serve from the start.
    let any_upstream = routing.any_upstream();
    let mut enc = ctx.enc.borrow_mut();
    let fbb = enc.begin();
    let name = fbb.create_string("mcp-broker");
    let ver = fbb.create_string(env!("CARGO_PKG_VERSION"));
    let caps = p::ServerCapabilities::create(
        fbb,
        &p::ServerCapabilitiesArgs {
            supports_tools: !table.tool_list.is_empty() || any_upstream,
            supports_resources: !table.resource_list.is_empty()
                || !table.template_list.is_empty()
                || any_upstream,
            supports_prompts: !table.prompt_list.is_empty() || any_upstream,
            supports_sampling: false,
            supports_logging: true,
            protocol_version: version,
            server_name: Some(name),
            server_version: Some(ver),
            supports_completions: routing.capabilities.completions,
            supports_resource_subscribe: routing.capabilities.subscribe,
            // Every edge delivers list_changed on a route table change
            // (`Shared::notify_list_changed`: frame connections, HTTP GET
            // and listen streams, gRPC Subscribe), whatever the routers say.
            tools_list_changed: true,
            resources_list_changed: true,
            prompts_list_changed: true,
        },
    );
    let instructions = fbb.create_string(&routing.instructions);
    let r = p::InitializeResponse::create(
        fbb,
        &p::InitializeResponseArgs {
            server_capabilities: Some(caps),
            server_info: None,
            instructions: Some(instructions),
        },
    );
    out.extend_from_slice(enc.finish(
        &to,
        p::ResponsePayload::InitializeResponse,
        r.as_union_value(),
        true,
    ));
}

/// Runs `req` on shard `owner` (session affinity) and appends its answer.
/// The frame crosses as the same `Bytes`, not a copy.
async fn forward(ctx: &Rc<ShardCtx>, owner: usize, req: &VerifiedRequest, out: &mut Vec<u8>) {
    let (code, msg) = match ctx.shared.forward(owner, req.clone()) {
        Ok(rx) => match rx.await {
            Ok(frames) => {
                out.extend_from_slice(&frames);
                return;
            }
            // The owner dropped the job unanswered: it stopped.
            Err(_) => (ErrorCode::ShuttingDown, "owner shard stopped"),
        },
        Err(e) => refused_handoff(&e),
    };
    let to = req.view().reply_to();
    out.extend_from_slice(ctx.enc.borrow_mut().error(&to, code, msg, None));
}

/// The answer to a hand-off the owner shard's inbox refused: a full inbox
/// is overload (retryable, nothing ran), only a stopped shard is shutting
/// down.
fn refused_handoff(e: &SubmitError) -> (ErrorCode, &'static str) {
    match e {
        SubmitError::Full(_) => (
            ErrorCode::Overloaded,
            "the session's owner shard is overloaded (its inbox is full); retry later",
        ),
        SubmitError::Stopped(_) => (ErrorCode::ShuttingDown, "owner shard stopped"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A CompleteRequest for `ref/prompt` `p` with one context argument.
    fn complete_with_context(value: &str) -> Vec<u8> {
        use mcp_schema::fb::{KeyValue, KeyValueArgs};
        let mut fbb = flatbuffers::FlatBufferBuilder::new();
        let (k, v) = (fbb.create_string("a"), fbb.create_string(value));
        let kv = KeyValue::create(
            &mut fbb,
            &KeyValueArgs {
                key: Some(k),
                value: Some(v),
            },
        );
        let context = fbb.create_vector(&[kv]);
        let (ref_name, argument_name, argument_value) = (
            fbb.create_string("p"),
            fbb.create_string("x"),
            fbb.create_string("y"),
        );
        let c = p::CompleteRequest::create(
            &mut fbb,
            &p::CompleteRequestArgs {
                ref_kind: p::CompletionRefKind::Prompt,
                ref_name: Some(ref_name),
                argument_name: Some(argument_name),
                argument_value: Some(argument_value),
                context: Some(context),
            },
        );
        fbb.finish(c, None);
        fbb.finished_data().to_vec()
    }

    #[test]
    fn completion_context_values_that_add_keys_are_refused_naming_them() {
        let buf = complete_with_context(r#"1,"admin":true"#);
        let c = flatbuffers::root::<p::CompleteRequest>(&buf).unwrap();
        assert_eq!(completion_input("ref/prompt", "p", c).unwrap_err().key, "a");
        let buf = complete_with_context("[1]");
        let c = flatbuffers::root::<p::CompleteRequest>(&buf).unwrap();
        let input = completion_input("ref/prompt", "p", c).unwrap();
        let v: serde_json::Value = serde_json::from_str(&input).unwrap();
        assert_eq!(v["context"]["arguments"]["a"], serde_json::json!([1]));
    }

    #[test]
    fn negotiation_answers_the_clients_version_when_supported_else_the_latest() {
        assert_eq!(
            negotiate(p::ProtocolVersion::V2024_11_05),
            p::ProtocolVersion::V2024_11_05
        );
        assert_eq!(
            negotiate(p::ProtocolVersion::Unspecified),
            p::ProtocolVersion::V2025_06_18
        );
        assert_eq!(
            negotiate(p::ProtocolVersion(20990101)),
            p::ProtocolVersion::V2025_06_18
        );
    }

    #[test]
    fn a_full_owner_inbox_is_answered_overloaded_not_shutting_down() {
        use crate::shared::{INBOX_CAPACITY, ShardMsg};
        use mcp_schema::client::{RequestEncoder, RequestHeader, ResponseView};
        use std::future::Future;
        use std::task::{Context, Waker};

        let layout = Arc::new(crate::metrics::Layout::new(0, 0));
        let routing = Routing::build(1, Vec::new(), &[], "__", &layout).unwrap();
        let config = crate::config::Config::embedded_default();
        let states = crate::edge::http::request_state::RequestStates::new(
            &config.http.request_state_key_file,
            config.http.request_state_ttl,
        )
        .unwrap();
        let shared = Shared::new(config, routing, layout, 2, None, None, states);
        // Fill shard 1's inbox: nothing empties it in this test.
        let mut sent = 0;
        while sent <= INBOX_CAPACITY && shared.send(1, ShardMsg::Drain).is_ok() {
            sent += 1;
        }
        assert_eq!(sent, INBOX_CAPACITY);
        let ctx = Rc::new(ShardCtx {
            index: 0,
            shared: Arc::new(shared),
            pools: RefCell::default(),
            enc: RefCell::new(ResponseEncoder::new(0)),
        });
        let h = RequestHeader {
            message_id: [7; 16],
            correlation_id: Some("c1"),
            session_id: Some("s"),
            timeout_ms: 0,
            unix_nanos: 0,
        };
        let frame = RequestEncoder::new()
            .tool_call(&h, [1; 16], "put", &[])
            .to_vec();
        let req = VerifiedRequest::verify(frame.into()).unwrap();
        let mut out = Vec::new();
        let mut cx = Context::from_waker(Waker::noop());
        let done = std::pin::pin!(forward(&ctx, 1, &req, &mut out)).poll(&mut cx);
        assert!(done.is_ready(), "a refused hand-off is answered at once");
        let r = ResponseView::parse(&out).unwrap();
        assert_eq!(r.correlation_id(), "c1");
        assert_eq!(r.error().map(|e| e.0), Some(ErrorCode::Overloaded.code()));
        assert!(ErrorCode::Overloaded.is_retryable());

        assert_eq!(
            refused_handoff(&SubmitError::Stopped(1)).0,
            ErrorCode::ShuttingDown
        );
    }
}
