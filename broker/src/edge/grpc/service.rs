//! The `McpService` implementation: each RPC → one Request frame → a shard
//! → its response frames → the proto answer.
//!
//! # Invariants
//! - A call is refused before any work when the edge is draining
//!   (UNAVAILABLE) or `grpc.max_concurrent_requests` calls are in flight
//!   (RESOURCE_EXHAUSTED); the in-flight count is released on every path,
//!   including the client going away (the guard is dropped with the future).
//! - The client's `grpc-timeout` becomes the frame's `timeout_ms`, a little
//!   shorter than the deadline so that the broker's DEADLINE_EXCEEDED reaches
//!   the client before the transport's own timer cancels the call.
//! - The encoders are per thread and borrowed only while encoding (never
//!   across an await).
//! - A call that carries an `mcp-session-id` is served only when that
//!   session was issued to the caller's identity and is live; otherwise it
//!   fails with NOT_FOUND before any work (`session.rs`).

use std::cell::RefCell;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use mcp_proto::v1 as pb;
use mcp_proto::v1::mcp_service_server::McpService;
use mcp_schema::ErrorCode;
use mcp_schema::client::{Listing, RequestEncoder, RequestHeader, ResponseView};
use mcp_schema::fb::protocol as p;
use mcp_schema::uuid::IdGenerator;
use mcp_schema::verify::VerifiedRequest;
use tonic::metadata::MetadataValue;
use tonic::{Request, Response, Status};

use super::conn::{ConnInfo, Identity};
use super::convert;
use super::notify::{Hub, SubscribeError, SubscriptionStream, Topics};
use super::request::{self, Refused};
use super::session::{SessionError, Sessions};
use super::status;
use crate::auth::Principal;
use crate::shared::{EdgeDeadline, Shared, SubmitError};

thread_local! {
    /// Reused per shard thread: building a frame allocates nothing once the
    /// builder has grown.
    static ENCODER: RefCell<RequestEncoder> = RefCell::new(RequestEncoder::new());
    static IDS: RefCell<IdGenerator> = RefCell::new(IdGenerator::new(thread_seed()));
}

fn thread_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(format!("{:?}", std::thread::current().id()).len() as u64);
    h.finish()
}

fn unix_now() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}

/// A UUIDv7 stamped with `unix_nanos`, the time in the request's header,
/// so that a request reads the wall clock once for all of its ids.
fn id_at(unix_nanos: i64) -> [u8; 16] {
    let millis = (unix_nanos / 1_000_000) as u64;
    IDS.with(|g| g.borrow_mut().next(millis).0)
}

fn hyphenated(id: &[u8; 16]) -> String {
    let mut buf = [0u8; mcp_schema::uuid::HYPHENATED_LEN];
    mcp_schema::uuid::hyphenated(id, &mut buf).to_string()
}

/// The edge's shared state.
pub struct EdgeState {
    shared: Arc<Shared>,
    hub: Arc<Hub>,
    sessions: Arc<Sessions>,
    next_shard: AtomicUsize,
    in_flight: AtomicUsize,
    draining: AtomicBool,
}

/// The tonic service (a handle on [`EdgeState`]).
#[derive(Clone)]
pub struct Edge(pub(super) Arc<EdgeState>);

impl EdgeState {
    pub fn new(shared: Arc<Shared>) -> Self {
        let g = &shared.config.grpc;
        let sessions = Arc::new(Sessions::new(g.max_sessions, g.session_idle_timeout));
        let hub = Arc::new(Hub::default());
        {
            let (sessions, hub) = (sessions.clone(), hub.clone());
            let _ = shared
                .grpc_counts
                .set(Box::new(move || (sessions.count(), hub.subscribers())));
        }
        {
            // A route table swap (an upstream's listings changed) is a
            // broadcast to every subscriber that asked for its kind.
            let hub = hub.clone();
            shared.on_list_changed(Arc::new(move |kinds| {
                use mcp_proto::v1::notification::Notification as N;
                use mcp_proto::v1::{
                    PromptListChangedNotification, ResourceListChangedNotification,
                    ToolListChangedNotification,
                };
                if kinds.tools {
                    hub.publish(
                        None,
                        None,
                        N::ToolListChanged(ToolListChangedNotification {}),
                    );
                }
                if kinds.resources {
                    hub.publish(
                        None,
                        None,
                        N::ResourceListChanged(ResourceListChangedNotification {}),
                    );
                }
                if kinds.prompts {
                    hub.publish(
                        None,
                        None,
                        N::PromptListChanged(PromptListChangedNotification {}),
                    );
                }
            }));
        }
        {
            // A router's resource update goes to the subscribers whose
            // topics name its URI (or every kind).
            let hub = hub.clone();
            shared.on_resource_updated(Arc::new(move |uri, scope| {
                use mcp_proto::v1::ResourceUpdatedNotification;
                use mcp_proto::v1::notification::Notification as N;
                hub.publish_resource_updated(
                    N::ResourceUpdated(ResourceUpdatedNotification {
                        uri: uri.to_owned(),
                    }),
                    scope,
                );
            }));
        }
        Self {
            shared,
            hub,
            sessions,
            next_shard: AtomicUsize::new(0),
            in_flight: AtomicUsize::new(0),
            draining: AtomicBool::new(false),
        }
    }

    /// Forgets expired sessions (called on a timer).
    pub fn sweep_sessions(&self) {
        let n = self.sessions.sweep();
        if n > 0 {
            tracing::debug!(
                expired = n,
                live = self.sessions.count(),
                "gRPC sessions swept"
            );
        }
    }

    /// A call's metadata, its session checked against the caller: a session
    /// the caller does not own is unknown (NOT_FOUND), whoever owns it.
    fn meta<T>(&self, req: &Request<T>) -> Result<CallMeta, Status> {
        let mut meta = CallMeta::of(req)?;
        meta.principal = self.authorize(req)?;
        if let Some(s) = &meta.session
            && !self.sessions.touch(s, &meta.identity())
        {
            return Err(unknown_session());
        }
        Ok(meta)
    }

    /// With `[auth]`: the caller's bearer token (`authorization` metadata),
    /// verified; UNAUTHENTICATED without a valid one, PERMISSION_DENIED
    /// without the scopes every request needs.
    fn authorize<T>(&self, req: &Request<T>) -> Result<Option<Arc<Principal>>, Status> {
        let Some(auth) = &self.shared.auth else {
            return Ok(None);
        };
        let headers = req
            .metadata()
            .get_all("authorization")
            .iter()
            .map(|v| v.as_bytes());
        auth.authenticate_all(headers)
            .map(Some)
            .map_err(|f| auth_status(f, auth.base_scopes()))
    }

    /// With `[auth]`: PERMISSION_DENIED when tool `tool` needs scopes the
    /// caller lacks (`[[auth.rules]]`).
    fn authorize_tool(&self, meta: &CallMeta, tool: &str) -> Result<(), Status> {
        let (Some(auth), Some(p)) = (&self.shared.auth, &meta.principal) else {
            return Ok(());
        };
        auth.check_tool(p, tool)
            .map_err(|missing| auth_status(crate::auth::Failure::InsufficientScope, &missing))
    }

    /// Publishes `n` for `session`, filtered by the log level that applies.
    fn publish(&self, session: Option<&str>, n: pb::notification::Notification) {
        let level = session.and_then(|s| self.sessions.level(s));
        self.hub.publish(session, level, n);
    }

    pub fn begin_drain(&self) {
        self.draining.store(true, Ordering::Release);
        self.hub.close();
    }

    fn refuse_when_draining(&self) -> Result<(), Status> {
        if self.draining.load(Ordering::Acquire) || self.shared.is_draining() {
            return Err(status::edge(
                ErrorCode::ShuttingDown,
                "the broker is shutting down",
            ));
        }
        Ok(())
    }

    fn admit(&self) -> Result<InFlight<'_>, Status> {
        self.refuse_when_draining()?;
        let limit = self.shared.config.grpc.max_concurrent_requests;
        if self.in_flight.fetch_add(1, Ordering::AcqRel) >= limit {
            self.in_flight.fetch_sub(1, Ordering::AcqRel);
            return Err(status::edge(
                ErrorCode::Overloaded,
                format!(
                    "the gRPC edge has {limit} calls in flight (grpc.max_concurrent_requests); retry later"
                ),
            ));
        }
        Ok(InFlight(&self.in_flight))
    }
}

struct InFlight<'a>(&'a AtomicUsize);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

fn unknown_session() -> Status {
    status::edge(
        ErrorCode::NotFound,
        "unknown mcp-session-id: never issued, expired, or issued to another connection \
         or subject; call Initialize for a new session",
    )
}

/// UNIMPLEMENTED for a client capability asked of the broker, with the
/// `mcp-error-code` trailer every error status carries: -32601, what an MCP
/// server answers a method it does not serve.
fn client_capability(why: &str) -> Status {
    // Not `status::edge`: that maps -32601 to NOT_FOUND (an unknown tool or
    // resource); here the method itself is not served.
    let mut st = Status::unimplemented(why);
    st.metadata_mut().insert(
        status::ERROR_CODE_METADATA_KEY,
        MetadataValue::from(ErrorCode::NotFound.code()),
    );
    st
}

/// The status for a hand-off a shard refused: a full inbox is overload
/// (retryable), a stopped shard is shutdown.
fn submit_status(e: SubmitError) -> Status {
    match e {
        SubmitError::Full(_) => status::edge(ErrorCode::Overloaded, format!("{e}; retry later")),
        SubmitError::Stopped(_) => status::edge(ErrorCode::ShuttingDown, e.to_string()),
    }
}

/// A session issued by an Initialize still being answered: removed again
/// when dropped before [`Issued::keep`].
struct Issued<'a> {
    sessions: &'a Sessions,
    id: Option<&'a str>,
}

impl Issued<'_> {
    fn keep(mut self) {
        self.id = None;
    }
}

impl Drop for Issued<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.id {
            self.sessions.remove(id);
        }
    }
}

/// The status of an auth refusal: the reason in the message, never the
/// token; and, like every error status, the wire code (-32003) in the
/// `mcp-error-code` trailer.
fn auth_status(f: crate::auth::Failure, needed: &[String]) -> Status {
    let mut st = if f == crate::auth::Failure::InsufficientScope {
        Status::permission_denied(f.describe(needed))
    } else {
        Status::unauthenticated(f.message())
    };
    st.metadata_mut().insert(
        status::ERROR_CODE_METADATA_KEY,
        MetadataValue::from(ErrorCode::Unauthorized.code()),
    );
    st
}

/// What a call's metadata says.
struct CallMeta {
    session: Option<String>,
    /// With `[auth]`: whom the call's token speaks for.
    principal: Option<Arc<Principal>>,
    /// The client's deadline (`grpc-timeout`).
    deadline: Option<Duration>,
    /// The connection the call came on.
    conn: ConnInfo,
}

impl CallMeta {
    /// Reads the metadata without checking the session (Initialize ignores
    /// it; every other call goes through [`EdgeState::meta`]).
    fn of<T>(req: &Request<T>) -> Result<Self, Status> {
        Self::read(req, true)
    }

    /// `session`: whether to read (and check) the request's session id;
    /// Initialize ignores any it carries (proto/README).
    fn read<T>(req: &Request<T>, session: bool) -> Result<Self, Status> {
        // Every connection the edge accepts carries one; a request built
        // elsewhere (none today) gets an identity that owns nothing.
        let conn = req
            .extensions()
            .get::<ConnInfo>()
            .cloned()
            .unwrap_or_else(ConnInfo::detached);
        let md = req.metadata();
        let session = match md.get(mcp_proto::SESSION_METADATA_KEY).filter(|_| session) {
            None => None,
            Some(v) => {
                // Not visible ASCII: refused like an empty one.
                let s = request::session_id(v.to_str().unwrap_or_default()).map_err(refused)?;
                Some(s.to_string())
            }
        };
        let deadline = md
            .get("grpc-timeout")
            .and_then(|v| v.to_str().ok())
            .and_then(parse_grpc_timeout);
        Ok(Self {
            session,
            principal: None,
            deadline,
            conn,
        })
    }

    fn identity(&self) -> Identity {
        match &self.principal {
            Some(p) => self.conn.authenticated(&p.subject),
            None => self.conn.identity(),
        }
    }

    /// The frame's `timeout_ms`: the deadline less a margin for the answer
    /// to travel back (a tenth, at most 20 ms), at least 1 ms; 0 = the
    /// router's own deadline.
    fn timeout_ms(&self) -> u32 {
        self.deadline.map_or(0, |d| {
            let margin = (d / 10).min(Duration::from_millis(20));
            (d - margin).as_millis().clamp(1, u32::MAX as u128) as u32
        })
    }
}

/// Parses a `grpc-timeout` value: at most 8 digits and a unit
/// (H, M, S, m, u, n).
pub fn parse_grpc_timeout(v: &str) -> Option<Duration> {
    let (digits, unit) = v.split_at(v.len().checked_sub(1)?);
    if digits.is_empty() || digits.len() > 8 {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

/// The response frames of one request: zero or more non-final frames, then
/// the final one. They are what dispatch wrote with a shard's
/// `ResponseEncoder` (this shard's, or the session owner's across the
/// inbox), unchanged since, so the final one is read without the verifier
/// (`verify::built_response`; debug builds still verify it).
struct Reply {
    frames: Vec<u8>,
    last: usize,
}

impl Reply {
    fn split(frames: Vec<u8>) -> Result<Self, Status> {
        let mut at = 0;
        let mut last = None;
        while at + 4 <= frames.len() {
            let n = u32::from_le_bytes([frames[at], frames[at + 1], frames[at + 2], frames[at + 3]])
                as usize;
            if at + 4 + n > frames.len() {
                break;
            }
            last = Some(at);
            at += 4 + n;
        }
        match last {
            Some(last) if at == frames.len() => Ok(Self { frames, last }),
            _ => Err(status::edge(
                ErrorCode::Internal,
                "a shard returned a truncated response",
            )),
        }
    }

    fn frame_at(&self, at: usize) -> &[u8] {
        let n = u32::from_le_bytes([
            self.frames[at],
            self.frames[at + 1],
            self.frames[at + 2],
            self.frames[at + 3],
        ]);
        &self.frames[at..at + 4 + n as usize]
    }

    /// Every non-final frame, parsed.
    fn non_final(&self) -> impl Iterator<Item = ResponseView<'_>> {
        let mut at = 0;
        std::iter::from_fn(move || {
            while at < self.last {
                let f = self.frame_at(at);
                at += f.len();
                if let Ok(v) = ResponseView::parse(f) {
                    return Some(v);
                }
            }
            None
        })
    }

    /// The final response, or the status its ErrorResponse maps to.
    fn answer(&self) -> Result<p::Response<'_>, Status> {
        // SAFETY: the final frame as a shard's ResponseEncoder wrote it (see
        // `Reply`); `split` checked that it lies whole within `frames`,
        // which never change after it.
        let v = ResponseView {
            response: unsafe { mcp_schema::verify::built_response(self.frame_at(self.last)) },
        };
        if let Some((code, message)) = v.error() {
            return Err(status::from_wire(code, message));
        }
        Ok(v.response)
    }
}

/// `rx`, unless `after` passes first (`None`). The timer is the shard's
/// (`crate::edge::rt::ShardTimer`): a call is served on a shard thread.
/// `rx` is borrowed: the caller drops it, after telling the shard why.
async fn with_deadline<F: std::future::Future + Unpin>(
    rx: &mut F,
    after: Duration,
) -> Option<F::Output> {
    use hyper::rt::Timer;
    let mut sleep = crate::edge::rt::ShardTimer.sleep(after);
    std::future::poll_fn(|cx| {
        if let std::task::Poll::Ready(r) = Pin::new(&mut *rx).poll(cx) {
            return std::task::Poll::Ready(Some(r));
        }
        sleep.as_mut().poll(cx).map(|()| None)
    })
    .await
}

/// What a call is about, for the edge's log notifications.
#[derive(Clone, Copy)]
struct Op<'a> {
    method: &'static str,
    target: &'a str,
}

fn unexpected(what: &str) -> Status {
    status::edge(
        ErrorCode::Internal,
        format!("a shard answered {what} with an unexpected payload"),
    )
}

impl EdgeState {
    /// Where a tool call's progress and logs go while it runs: its
    /// session's Subscribe streams, at once. Only for a call in a session
    /// (nobody else could receive them).
    fn live(&self, op: Op<'_>, session: Option<&str>) -> Option<crate::shared::LiveSender> {
        if op.method != "tools/call" {
            return None;
        }
        let session = session?.to_owned();
        let hub = self.hub.clone();
        let sessions = self.sessions.clone();
        Some(Arc::new(move |frame: &[u8]| {
            if let Ok(v) = ResponseView::parse(frame)
                && let Some(n) = convert::notification(v.response)
            {
                hub.publish(Some(&session), sessions.level(&session), n);
            }
        }))
    }

    /// A session's calls run on its owner shard; others on the shard that
    /// serves the call (no hop), or round-robin off the shards (tests).
    fn pick_shard(&self, session: Option<&str>) -> usize {
        match session {
            Some(s) => self.shared.owner_of(s),
            None => crate::shard::current().unwrap_or_else(|| {
                self.next_shard.fetch_add(1, Ordering::Relaxed) % self.shared.shards()
            }),
        }
    }

    /// The one routing path: encode, verify, submit to the owning (or next)
    /// shard, await the frames, publish the non-final ones to the session's
    /// subscribers.
    async fn roundtrip(
        &self,
        meta: &CallMeta,
        op: Op<'_>,
        session_override: Option<&str>,
        build: impl FnOnce(&mut RequestEncoder, &RequestHeader<'_>) -> Bytes,
    ) -> Result<Reply, Status> {
        let _guard = self.admit()?;
        let session = session_override.or(meta.session.as_deref());
        let unix_nanos = unix_now().as_nanos() as i64;
        let header = RequestHeader {
            message_id: id_at(unix_nanos),
            correlation_id: None,
            session_id: session,
            timeout_ms: meta.timeout_ms(),
            unix_nanos,
        };
        let frame = ENCODER.with(|e| build(&mut e.borrow_mut(), &header));
        // SAFETY: every `build` passed here returns a copy of what one of
        // the encoder's methods returned (`Bytes::copy_from_slice(e.…)`),
        // unmodified. Only the routing checks run: an empty name is refused.
        let req = unsafe { VerifiedRequest::from_encoder(frame) }
            .map_err(|e| status::edge(e.code(), e.to_string()))?;
        let shard = self.pick_shard(session);
        let live = self.live(op, session);
        // Told to the shard when this edge answers DEADLINE_EXCEEDED itself,
        // so that the answer is counted (`await_reply`).
        let expiry = meta.deadline.map(|_| EdgeDeadline::default());
        // The call's shard is this thread's (every call without a session,
        // and a session's calls on its owner): handled right here, as the
        // HTTP edge does, without the inbox, a spawned task and a oneshot.
        // Else handed to the owner shard.
        let frames = match crate::shard::handle_here(shard, req, live, expiry.clone()) {
            Ok(run) => {
                let run = std::pin::pin!(async move { Ok::<_, ()>(run.await) });
                self.await_reply(run, meta, header.timeout_ms, expiry.as_ref(), session, op)
                    .await?
            }
            Err((req, live)) => {
                let rx = self
                    .shared
                    .submit(shard, req, live, expiry.clone())
                    .map_err(submit_status)?;
                self.await_reply(rx, meta, header.timeout_ms, expiry.as_ref(), session, op)
                    .await?
                    .map_err(drop)
            }
        }
        .map_err(|_| status::edge(ErrorCode::ShuttingDown, format!("shard {shard} stopped")))?;
        let reply = Reply::split(frames)?;
        if let Some(s) = session {
            for v in reply.non_final() {
                if let Some(n) = convert::notification(v.response) {
                    self.publish(Some(s), n);
                }
            }
        }
        if let Err(st) = reply.answer() {
            self.log_failure(session, op, &st);
        }
        Ok(reply)
    }

    /// The frames `reply` yields, unless the client's deadline passes
    /// first. The router is stopped at `timeout_ms`, but its stop lands on
    /// the next epoch tick and the answer still has to travel: the edge
    /// answers DEADLINE_EXCEEDED itself at `timeout_ms`, before the
    /// transport's own timer would cancel the call (CANCELLED), and claims
    /// `expiry` before `reply` is dropped, for the shard to record it.
    async fn await_reply<E>(
        &self,
        mut reply: impl std::future::Future<Output = Result<Vec<u8>, E>> + Unpin,
        meta: &CallMeta,
        timeout_ms: u32,
        expiry: Option<&EdgeDeadline>,
        session: Option<&str>,
        op: Op<'_>,
    ) -> Result<Result<Vec<u8>, E>, Status> {
        if meta.deadline.is_none() {
            return Ok(reply.await);
        }
        match with_deadline(&mut reply, Duration::from_millis(timeout_ms.into())).await {
            Some(r) => Ok(r),
            // A shard that finished the call as the timer fired has claimed
            // it, and its answer (already counted) is on its way.
            None if expiry.is_some_and(|e| !e.fire()) => Ok(reply.await),
            None => {
                let s = status::edge(ErrorCode::DeadlineExceeded, "the client's deadline passed");
                self.log_failure(session, op, &s);
                Err(s)
            }
        }
    }

    /// Tells the session's `log` subscribers about a call that failed for
    /// an operational reason (fault, deadline, overload, drain), as an MCP
    /// server would with `notifications/message`. Session-less calls have
    /// nobody to tell.
    fn log_failure(&self, session: Option<&str>, op: Op<'_>, st: &Status) {
        let Some(session) = session else { return };
        let level = match st.code() {
            tonic::Code::Internal => pb::LogLevel::Error,
            tonic::Code::DeadlineExceeded
            | tonic::Code::ResourceExhausted
            | tonic::Code::Unavailable => pb::LogLevel::Warning,
            _ => return,
        };
        let code = st
            .metadata()
            .get(status::ERROR_CODE_METADATA_KEY)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let data = serde_json::json!({ "method": op.method, "target": op.target, "code": code, "grpc_status": st.code() as i32 });
        self.publish(
            Some(session),
            pb::notification::Notification::Log(pb::LogNotification {
                level: level as i32,
                logger: "mcp-broker".into(),
                message: format!("{} `{}` failed: {}", op.method, op.target, st.message()),
                data: Some(data.to_string().into_bytes()),
            }),
        );
    }

    async fn list(
        &self,
        req: &CallMeta,
        what: Listing,
        cursor: Option<&str>,
    ) -> Result<Reply, Status> {
        let op = Op {
            method: "list",
            target: "",
        };
        self.roundtrip(req, op, None, |e, h| {
            Bytes::copy_from_slice(e.list(h, what, cursor))
        })
        .await
    }
}

fn refused(r: Refused) -> Status {
    status::edge(r.code, r.message)
}

type NotificationStream = Pin<Box<SubscriptionStream>>;

#[tonic::async_trait]
impl McpService for Edge {
    async fn initialize(
        &self,
        req: Request<pb::InitializeRequest>,
    ) -> Result<Response<pb::InitializeResult>, Status> {
        let mut meta = CallMeta::read(&req, false)?;
        meta.principal = self.0.authorize(&req)?;
        let r = req.into_inner();
        // Initialize starts a session: a fresh unguessable id bound to this
        // caller, owned (by hash) by one shard, which answers this call
        // already. A session id the call may carry is ignored.
        let session = self
            .0
            .sessions
            .create_for(&meta.conn, meta.identity())
            .map_err(|e| match e {
                SessionError::Full(_) => status::edge(ErrorCode::Overloaded, e.to_string()),
                SessionError::Random(_) => status::edge(ErrorCode::Internal, e.to_string()),
            })?;
        // Unless the answer carries it, the session is nobody's: a refused,
        // failed or cancelled Initialize must not hold a registry place.
        let issued = Issued {
            sessions: &self.0.sessions,
            id: Some(session.as_str()),
        };
        let op = Op {
            method: "initialize",
            target: "",
        };
        let reply = self
            .0
            .roundtrip(&meta, op, Some(&session), |e, h| {
                Bytes::copy_from_slice(request::initialize(e, h, &r))
            })
            .await?;
        let init = reply
            .answer()?
            .payload_as_initialize_response()
            .ok_or_else(|| unexpected("initialize"))?;
        let mut resp = Response::new(convert::initialize(init));
        let v = MetadataValue::try_from(session.as_str()).map_err(|_| unexpected("initialize"))?;
        resp.metadata_mut()
            .insert(mcp_proto::SESSION_METADATA_KEY, v);
        issued.keep();
        Ok(resp)
    }

    async fn ping(
        &self,
        req: Request<pb::PingRequest>,
    ) -> Result<Response<pb::PingResponse>, Status> {
        let meta = self.0.meta(&req)?;
        let op = Op {
            method: "ping",
            target: "",
        };
        let reply = self
            .0
            .roundtrip(&meta, op, None, |e, h| Bytes::copy_from_slice(e.ping(h)))
            .await?;
        reply
            .answer()?
            .payload_as_ping_response()
            .ok_or_else(|| unexpected("ping"))?;
        Ok(Response::new(pb::PingResponse {}))
    }

    async fn list_tools(
        &self,
        req: Request<pb::ListToolsRequest>,
    ) -> Result<Response<pb::ListToolsResult>, Status> {
        let meta = self.0.meta(&req)?;
        let reply = self
            .0
            .list(&meta, Listing::Tools, req.get_ref().cursor.as_deref())
            .await?;
        let r = reply
            .answer()?
            .payload_as_list_tools_result()
            .ok_or_else(|| unexpected("list tools"))?;
        let mut tools = convert::tools(r);
        // With `[auth]`, a caller sees only the tools it may call.
        if let (Some(auth), Some(p)) = (&self.0.shared.auth, &meta.principal) {
            tools.tools.retain(|t| auth.allows_tool(p, &t.name));
        }
        Ok(Response::new(tools))
    }

    async fn call_tool(
        &self,
        req: Request<pb::CallToolRequest>,
    ) -> Result<Response<pb::CallToolResult>, Status> {
        let meta = self.0.meta(&req)?;
        let r = req.get_ref();
        self.0.authorize_tool(&meta, &r.name)?;
        let members = request::arguments(r.arguments.as_deref()).map_err(refused)?;
        let mut tool_call_id = [0; 16];
        let op = Op {
            method: "tools/call",
            target: &r.name,
        };
        let reply = self
            .0
            .roundtrip(&meta, op, None, |e, h| {
                tool_call_id = id_at(h.unix_nanos);
                Bytes::copy_from_slice(request::tool_call(e, h, tool_call_id, &r.name, &members))
            })
            .await?;
        let answer = reply.answer()?;
        let result = if let Some(tr) = answer.payload_as_tool_result() {
            // SAFETY: `answer` read the final frame with `built_response`.
            unsafe { convert::tool_result(tr) }
        } else if let Some(el) = answer.payload_as_elicitation_request() {
            convert::elicitation(el)
        } else {
            return Err(unexpected("call tool"));
        };
        let mut resp = Response::new(result);
        // Progress notifications of this call carry this token. They reach
        // only the session's Subscribe streams, so a call without a session
        // has no use for it; and a fresh value in every response is a new
        // HPACK literal (and table entry) for both ends to code.
        if meta.session.is_some()
            && let Ok(v) = MetadataValue::try_from(hyphenated(&tool_call_id).as_str())
        {
            resp.metadata_mut().insert("mcp-progress-token", v);
        }
        Ok(resp)
    }

    async fn list_resources(
        &self,
        req: Request<pb::ListResourcesRequest>,
    ) -> Result<Response<pb::ListResourcesResult>, Status> {
        let meta = self.0.meta(&req)?;
        let reply = self
            .0
            .list(&meta, Listing::Resources, req.get_ref().cursor.as_deref())
            .await?;
        let r = reply
            .answer()?
            .payload_as_list_resources_result()
            .ok_or_else(|| unexpected("list resources"))?;
        Ok(Response::new(convert::resources(r)))
    }

    async fn list_resource_templates(
        &self,
        req: Request<pb::ListResourceTemplatesRequest>,
    ) -> Result<Response<pb::ListResourceTemplatesResult>, Status> {
        let meta = self.0.meta(&req)?;
        let reply = self
            .0
            .list(
                &meta,
                Listing::ResourceTemplates,
                req.get_ref().cursor.as_deref(),
            )
            .await?;
        let r = reply
            .answer()?
            .payload_as_list_resource_templates_result()
            .ok_or_else(|| unexpected("list resource templates"))?;
        Ok(Response::new(convert::templates(r)))
    }

    async fn read_resource(
        &self,
        req: Request<pb::ReadResourceRequest>,
    ) -> Result<Response<pb::ReadResourceResult>, Status> {
        let meta = self.0.meta(&req)?;
        let uri = &req.get_ref().uri;
        let op = Op {
            method: "resources/read",
            target: uri,
        };
        let reply = self
            .0
            .roundtrip(&meta, op, None, |e, h| {
                Bytes::copy_from_slice(e.read_resource(h, uri))
            })
            .await?;
        let r = reply
            .answer()?
            .payload_as_resource_data()
            .ok_or_else(|| unexpected("read resource"))?;
        Ok(Response::new(convert::resource_data(r)))
    }

    async fn list_prompts(
        &self,
        req: Request<pb::ListPromptsRequest>,
    ) -> Result<Response<pb::ListPromptsResult>, Status> {
        let meta = self.0.meta(&req)?;
        let reply = self
            .0
            .list(&meta, Listing::Prompts, req.get_ref().cursor.as_deref())
            .await?;
        let r = reply
            .answer()?
            .payload_as_list_prompts_result()
            .ok_or_else(|| unexpected("list prompts"))?;
        Ok(Response::new(convert::prompts(r)))
    }

    async fn get_prompt(
        &self,
        req: Request<pb::GetPromptRequest>,
    ) -> Result<Response<pb::GetPromptResult>, Status> {
        let meta = self.0.meta(&req)?;
        let r = req.get_ref();
        // `[[auth.rules]]` name tools (docs/security.md); a prompt is
        // served as on the other edges, whatever its name.
        let members = request::arguments(r.arguments.as_deref()).map_err(refused)?;
        let op = Op {
            method: "prompts/get",
            target: &r.name,
        };
        let reply = self
            .0
            .roundtrip(&meta, op, None, |e, h| {
                Bytes::copy_from_slice(request::get_prompt(e, h, &r.name, &members))
            })
            .await?;
        let a = reply
            .answer()?
            .payload_as_applied_prompt()
            .ok_or_else(|| unexpected("get prompt"))?;
        Ok(Response::new(convert::applied_prompt(a)))
    }

    async fn complete(
        &self,
        req: Request<pb::CompleteRequest>,
    ) -> Result<Response<pb::CompleteResult>, Status> {
        let meta = self.0.meta(&req)?;
        let r = req.get_ref();
        let (kind, name, arg) = request::completion_target(r).map_err(refused)?;
        let op = Op {
            method: "completion/complete",
            target: name,
        };
        let reply = self
            .0
            .roundtrip(&meta, op, None, |e, h| {
                Bytes::copy_from_slice(request::complete(e, h, kind, name, arg))
            })
            .await?;
        let c = reply
            .answer()?
            .payload_as_complete_result()
            .ok_or_else(|| unexpected("complete"))?;
        Ok(Response::new(convert::completion(c)))
    }

    type SubscribeStream = NotificationStream;

    async fn subscribe(
        &self,
        req: Request<pb::SubscribeRequest>,
    ) -> Result<Response<Self::SubscribeStream>, Status> {
        let meta = self.0.meta(&req)?;
        self.0.refuse_when_draining()?;
        let topics = Topics::parse(&req.get_ref().topics)
            .map_err(|e| status::edge(ErrorCode::InvalidParams, e))?;
        // A resource topic is an MCP resources/subscribe: the shard checks
        // that a router serves the URI (NOT_FOUND otherwise).
        for uri in topics.uris() {
            let op = Op {
                method: "resources/subscribe",
                target: uri,
            };
            let reply = self
                .0
                .roundtrip(&meta, op, None, |e, h| {
                    Bytes::copy_from_slice(e.subscribe(h, uri, true))
                })
                .await?;
            reply.answer()?;
        }
        let max = self.0.shared.config.grpc.max_subscribers;
        let session = meta.session.clone();
        let identity = meta.identity();
        let principal = meta.principal.clone();
        match self
            .0
            .hub
            .subscribe(meta.session, meta.conn.clone(), topics, max)
        {
            Ok(s) => {
                // An open stream keeps its session from idling out.
                let s = match session {
                    Some(id) if self.0.sessions.subscribed(&id, &identity) => {
                        let sessions = self.0.sessions.clone();
                        s.on_drop(move || sessions.unsubscribed(&id))
                    }
                    Some(_) => return Err(unknown_session()),
                    None => s,
                };
                let s = match principal.as_deref().and_then(Principal::stream_deadline) {
                    Some(t) => s.until(t),
                    None => s,
                };
                Ok(Response::new(Box::pin(s)))
            }
            Err(SubscribeError::Closed) => Err(status::edge(
                ErrorCode::ShuttingDown,
                "the broker is shutting down",
            )),
            Err(SubscribeError::TooMany) => Err(status::edge(
                ErrorCode::Overloaded,
                format!("{max} Subscribe streams are open (grpc.max_subscribers)"),
            )),
        }
    }

    async fn set_logging_level(
        &self,
        req: Request<pb::SetLoggingLevelRequest>,
    ) -> Result<Response<pb::SetLoggingLevelResponse>, Status> {
        let meta = self.0.meta(&req)?;
        let level = request::log_level(req.get_ref().level).map_err(refused)?;
        let op = Op {
            method: "logging/setLevel",
            target: meta.session.as_deref().unwrap_or(""),
        };
        let wire = request::log_level_to_wire(level);
        let reply = self
            .0
            .roundtrip(&meta, op, None, |e, h| {
                Bytes::copy_from_slice(e.set_log_level(h, wire))
            })
            .await?;
        reply.answer()?;
        match &meta.session {
            // The session's own level.
            Some(session) => {
                if !self.0.sessions.set_level(session, &meta.identity(), level) {
                    return Err(unknown_session());
                }
            }
            // A client that knows only the proto: the level of its
            // connection, the default for its sessions and for the
            // broadcasts its Subscribe streams receive.
            None => meta.conn.set_level(level),
        }
        Ok(Response::new(pb::SetLoggingLevelResponse {}))
    }

    async fn list_roots(
        &self,
        req: Request<pb::ListRootsRequest>,
    ) -> Result<Response<pb::ListRootsResult>, Status> {
        self.0.meta(&req)?;
        self.0.refuse_when_draining()?;
        let roots = self
            .0
            .shared
            .config
            .grpc
            .roots
            .iter()
            .map(|r| pb::Root {
                uri: r.uri.clone(),
                name: r.name.clone(),
            })
            .collect();
        Ok(Response::new(pb::ListRootsResult { roots }))
    }

    async fn create_sampling_message(
        &self,
        req: Request<pb::CreateSamplingMessageRequest>,
    ) -> Result<Response<pb::CreateSamplingMessageResult>, Status> {
        // Checked like every other call first: a caller without a valid
        // token learns UNAUTHENTICATED, not which methods exist, and a bad
        // session id is NOT_FOUND on every RPC alike.
        self.0.meta(&req)?;
        Err(client_capability(
            "sampling/createMessage is a client capability in MCP: a server asks its client's model to sample. \
             This broker is a server with no model of its own, and the WIT router world gives routers no way to \
             ask, so there is nothing to relay the request to",
        ))
    }

    async fn elicit(
        &self,
        req: Request<pb::ElicitRequest>,
    ) -> Result<Response<pb::ElicitResult>, Status> {
        self.0.meta(&req)?;
        Err(client_capability(
            "elicitation/create is a client capability in MCP: a server asks its client's user for input. \
             This broker is a server with no user to ask; a router's own elicitation reaches the CallTool \
             caller as an is_error result carrying its message and schema",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeouts_parse_per_the_http2_protocol_spec() {
        assert_eq!(parse_grpc_timeout("250m"), Some(Duration::from_millis(250)));
        assert_eq!(parse_grpc_timeout("3S"), Some(Duration::from_secs(3)));
        assert_eq!(parse_grpc_timeout("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(
            parse_grpc_timeout("99999999u"),
            Some(Duration::from_micros(99_999_999))
        );
        for bad in ["", "m", "123456789m", "10x", "-1S"] {
            assert_eq!(parse_grpc_timeout(bad), None, "{bad}");
        }
    }

    #[test]
    fn the_frame_deadline_leaves_room_for_the_answer() {
        let m = |d| CallMeta {
            session: None,
            principal: None,
            deadline: Some(d),
            conn: ConnInfo::detached(),
        };
        assert_eq!(m(Duration::from_millis(300)).timeout_ms(), 280);
        assert_eq!(m(Duration::from_millis(50)).timeout_ms(), 45);
        assert_eq!(m(Duration::from_micros(10)).timeout_ms(), 1);
        assert_eq!(
            CallMeta {
                session: None,
                principal: None,
                deadline: None,
                conn: ConnInfo::detached(),
            }
            .timeout_ms(),
            0
        );
    }

    #[test]
    fn a_full_shard_inbox_is_overload_not_shutdown() {
        let full = submit_status(SubmitError::Full(1));
        assert_eq!(full.code(), tonic::Code::ResourceExhausted);
        assert_eq!(
            full.metadata()
                .get(status::ERROR_CODE_METADATA_KEY)
                .unwrap(),
            &ErrorCode::Overloaded.code().to_string()
        );
        assert!(full.message().contains("retry"), "{}", full.message());
        let stopped = submit_status(SubmitError::Stopped(1));
        assert_eq!(stopped.code(), tonic::Code::Unavailable);
    }

    #[test]
    fn concatenated_frames_split_into_progress_and_final() {
        let mut frames = Vec::new();
        for body in [&b"ab"[..], b"cde"] {
            frames.extend_from_slice(&(body.len() as u32).to_le_bytes());
            frames.extend_from_slice(body);
        }
        let r = Reply::split(frames.clone()).unwrap();
        assert_eq!(r.last, 6);
        assert_eq!(r.frame_at(r.last), &[3, 0, 0, 0, b'c', b'd', b'e']);
        frames.pop();
        assert!(Reply::split(frames).is_err());
        assert!(Reply::split(Vec::new()).is_err());
    }
}
