//! Streamable HTTP sessions: the edge's one piece of state shared by shards.
//!
//! A session is created by `initialize` on the shard that read it (its
//! owner) and named by an unguessable id that encodes the owner:
//! `<owner hex>-<128 random bits hex>`. Any shard may then serve the
//! session's requests (a client's connections land on shards at the
//! kernel's choice), so the registry is striped by owner: a lookup locks the
//! owner's stripe for one hash probe and returns the session's `Arc`.
//! Session-affine routers run the session's calls on its owner shard
//! (`Shared::owner_of` reads the owner from the id), where its own router
//! instance lives.
//!
//! # Invariants
//! - Ids come from the operating system's CSPRNG; nothing is derived from
//!   time, counters or the client.
//! - A stripe's lock is held only for a map probe, insert or removal, never
//!   across an await; a session's own lock only to register a call or an
//!   outstanding client request, or to append to a replay log.
//! - The number of live sessions is bounded (`http.max_sessions`); a session
//!   idle past `http.session_idle_timeout` with nothing in flight and no
//!   open stream is ended by its owner shard's sweep.
//! - Replay logs are bounded: `MAX_STREAM_LOGS` streams per session, each
//!   `http.sse_replay_events` events.

use std::collections::{HashMap, VecDeque};
use std::future::poll_fn;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Poll;
use std::time::{Duration, Instant};

use atomic_waker::AtomicWaker;
use bytes::Bytes;
use futures_channel::oneshot;

/// Streams whose events a session keeps for `Last-Event-ID` resumption; the
/// oldest finished one is forgotten first.
pub const MAX_STREAM_LOGS: usize = 16;

/// `http.sse_replay_bytes`' default: what one session keeps of its SSE
/// events for resumption, over all its streams.
pub const DEFAULT_REPLAY_BYTES: usize = 1 << 20;

/// Questions (elicitation, sampling, roots) a session may have waiting
/// for its client's answers at once; a call that would ask one more is
/// answered -32000 (overloaded) instead.
pub const MAX_PENDING_ASKS: usize = 32;

/// Longest session id accepted in `Mcp-Session-Id` (ours are at most 37).
pub const MAX_ID_LEN: usize = 64;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding a session lock leaves plain data behind (maps
    // and counters), still consistent enough to serve or to end.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A cancellation signal that crosses threads: the call runs on the shard
/// that read it, `notifications/cancelled` may arrive on any shard.
#[derive(Default)]
pub struct Cancel {
    flag: AtomicBool,
    waker: AtomicWaker,
}

impl Cancel {
    pub fn cancel(&self) {
        self.flag.store(true, Ordering::Release);
        self.waker.wake();
    }

    pub fn is_cancelled(&self) -> bool {
        self.flag.load(Ordering::Acquire)
    }

    /// Resolves once [`Self::cancel`] was called.
    pub async fn cancelled(&self) {
        poll_fn(|cx| {
            if self.is_cancelled() {
                return Poll::Ready(());
            }
            self.waker.register(cx.waker());
            if self.is_cancelled() {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
        .await
    }
}

/// One SSE stream's recent events, kept for resumption, and its live
/// receiver when a client is attached.
struct StreamLog {
    id: u64,
    events: VecDeque<(u64, Bytes)>,
    next_seq: u64,
    live: Option<super::sse::SseTx>,
    /// The stream ended (its request answered, or the session closing): a
    /// client resuming it gets the rest, then the end of the stream.
    done: bool,
    /// The session's standalone GET stream (server notifications).
    standalone: bool,
}

#[derive(Default)]
struct State {
    /// Requests in flight, by their JSON-RPC id text: what
    /// `notifications/cancelled` stops.
    calls: HashMap<String, Arc<Cancel>>,
    /// Requests the broker sent to the client (elicitation), by the id the
    /// broker gave them: where the client's answer goes.
    asks: HashMap<String, oneshot::Sender<Bytes>>,
    logs: VecDeque<StreamLog>,
    /// Bytes of the events `logs` keep, bounded by `replay_bytes`.
    kept_bytes: usize,
    next_stream: u64,
    /// `resources/subscribe`d URIs, sorted: their updates go to the GET
    /// stream.
    resources: Vec<String>,
}

pub use crate::edge::{MAX_RESOURCE_SUBSCRIPTIONS, MAX_SUBSCRIBED_URI_BYTES};

/// One live session.
pub struct Session {
    pub id: String,
    /// The random part of `id`, this session's key in its stripe.
    pub key: u128,
    /// The protocol version negotiated at `initialize`.
    pub version: &'static str,
    /// The client declared the `elicitation` capability.
    pub client_elicitation: bool,
    /// The client declared the `sampling` capability.
    pub client_sampling: bool,
    /// The client declared the `roots` capability.
    pub client_roots: bool,
    /// With `[auth]`: the subject of the token that created the session;
    /// a request with another subject's token treats it as unknown.
    pub subject: std::sync::OnceLock<String>,
    last_used_ms: AtomicU64,
    /// Open SSE streams and requests in flight: while non-zero the session
    /// is in use and never idles out.
    busy: AtomicUsize,
    /// `logging/setLevel`: 0 = not set, else 1 + index into [`LEVELS`].
    level: AtomicU8,
    ended: AtomicBool,
    next_ask: AtomicU64,
    replay_events: usize,
    replay_bytes: usize,
    epoch: Instant,
    state: Mutex<State>,
}

/// MCP log levels, least severe first (RFC 5424 order).
pub use super::jsonrpc::LOG_LEVELS as LEVELS;

/// Where an SSE event goes: a stream of a session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamId(pub u64);

impl Session {
    /// Twice a request: the coarse clock serves an idle expiry of minutes.
    pub fn touch(&self) {
        let now = crate::coarse::now().saturating_duration_since(self.epoch);
        self.last_used_ms
            .store(now.as_millis() as u64, Ordering::Relaxed);
    }

    pub fn is_ended(&self) -> bool {
        self.ended.load(Ordering::Acquire)
    }

    pub fn set_level(&self, level: &str) -> bool {
        match LEVELS.iter().position(|l| *l == level) {
            Some(i) => {
                self.level.store(i as u8 + 1, Ordering::Relaxed);
                true
            }
            None => false,
        }
    }

    /// The level set by `logging/setLevel`, if any.
    pub fn level(&self) -> Option<&'static str> {
        match self.level.load(Ordering::Relaxed) {
            0 => None,
            n => LEVELS.get(n as usize - 1).copied(),
        }
    }

    /// Marks the session in use until the guard drops.
    pub fn busy(self: &Arc<Self>) -> Busy {
        self.busy.fetch_add(1, Ordering::AcqRel);
        Busy(self.clone())
    }

    /// Registers request `id` as cancellable; `None` when a request with the
    /// same id is already in flight in this session (ids must be unique).
    /// The id stays registered until the returned guard drops.
    pub fn start_call(self: &Arc<Self>, id: &str) -> Option<CallInFlight> {
        let mut st = lock(&self.state);
        if st.calls.contains_key(id) {
            return None;
        }
        let cancel = Arc::new(Cancel::default());
        st.calls.insert(id.to_string(), cancel.clone());
        Some(CallInFlight {
            session: self.clone(),
            id: id.to_string(),
            cancel,
        })
    }

    /// `notifications/cancelled` for `id`: `true` if it was in flight.
    pub fn cancel_call(&self, id: &str) -> bool {
        match lock(&self.state).calls.get(id) {
            Some(c) => {
                c.cancel();
                true
            }
            None => false,
        }
    }

    /// A new id for a request the broker sends to the client, and where
    /// the client's answer will arrive; `None` when [`MAX_PENDING_ASKS`]
    /// already wait. A question outlives its client's connection (the
    /// client may resume the stream and answer), so a client that asks and
    /// leaves, over and over, held every question until
    /// `http.client_answer_timeout` (5 minutes by default): 9,350 of them,
    /// 100 MiB, at 10 s in an audit.
    pub fn ask(&self) -> Option<(String, oneshot::Receiver<Bytes>)> {
        let mut state = lock(&self.state);
        if state.asks.len() >= MAX_PENDING_ASKS {
            return None;
        }
        let n = self.next_ask.fetch_add(1, Ordering::Relaxed);
        let id = format!("mcp-broker-{n}");
        let (tx, rx) = oneshot::channel();
        state.asks.insert(id.clone(), tx);
        Some((id, rx))
    }

    pub fn forget_ask(&self, id: &str) {
        lock(&self.state).asks.remove(id);
    }

    /// A client's answer (its whole JSON-RPC message) to request `id`;
    /// `false` when no such request is outstanding.
    pub fn answer(&self, id: &str, message: Bytes) -> bool {
        match lock(&self.state).asks.remove(id) {
            Some(tx) => tx.send(message).is_ok(),
            None => false,
        }
    }

    /// Opens a new SSE stream whose events go to `live`.
    pub fn open_stream(&self, live: super::sse::SseTx, standalone: bool) -> StreamId {
        let mut st = lock(&self.state);
        if standalone {
            // One standalone stream per session: a new GET replaces the old,
            // whose client has most likely gone.
            for l in st.logs.iter_mut().filter(|l| l.standalone) {
                l.live = None;
                l.done = true;
            }
        }
        let id = st.next_stream;
        st.next_stream += 1;
        while st.logs.len() >= MAX_STREAM_LOGS {
            // The oldest finished stream goes. A stream still open is never
            // dropped for a new one: its call's answer would be lost, and a
            // standalone stream's notifications with it (a client with 17
            // calls running at once lost the first). Open streams are
            // bounded by the session's connections, and what they keep by
            // `sse_replay_bytes`.
            let Some(at) = st.logs.iter().position(|l| l.done) else {
                break;
            };
            if let Some(gone) = st.logs.remove(at) {
                st.kept_bytes -= gone.events.iter().map(|(_, e)| e.len()).sum::<usize>();
            }
        }
        st.logs.push_back(StreamLog {
            id,
            events: VecDeque::new(),
            next_seq: 1,
            live: Some(live),
            done: false,
            standalone,
        });
        StreamId(id)
    }

    /// Appends one event (a JSON-RPC message, or `None` for the priming
    /// event with empty data) to `stream`, sends it to the attached client,
    /// and returns whether a client is attached.
    pub fn emit(&self, stream: StreamId, message: Option<&[u8]>) -> bool {
        let mut guard = lock(&self.state);
        let st = &mut *guard;
        let Some(log) = st.logs.iter_mut().find(|l| l.id == stream.0) else {
            return false;
        };
        let seq = log.next_seq;
        log.next_seq += 1;
        let event = sse_event(stream.0, seq, message);
        if event.len() > self.replay_bytes {
            // Larger than the session may keep at all: sent, not kept, and
            // its stream's earlier events go too, so that a resumption
            // across it gets 404 rather than a gap. (Kept, it pushed out
            // every other stream's events first.)
            st.kept_bytes -= log.events.drain(..).map(|(_, e)| e.len()).sum::<usize>();
        } else {
            if log.events.len() >= self.replay_events
                && let Some((_, old)) = log.events.pop_front()
            {
                st.kept_bytes -= old.len();
            }
            st.kept_bytes += event.len();
            log.events.push_back((seq, event.clone()));
        }
        // The standalone stream is fed by others' writes at their rate:
        // bounded in what its client leaves unread (`sse.rs`). It ends
        // then; the event is kept, for the client's resumption.
        let standalone = log.standalone;
        let attached = match &log.live {
            Some(tx) if standalone => tx.send_bounded(event),
            Some(tx) => tx.send(event),
            None => false,
        };
        if !attached {
            log.live = None;
        }
        // The session's events past `http.sse_replay_bytes` go, oldest
        // stream first: whole answers of up to a frame each, kept after
        // their client left, once held ~40 MB a session.
        while st.kept_bytes > self.replay_bytes {
            let Some((_, old)) = st.logs.iter_mut().find_map(|l| l.events.pop_front()) else {
                break;
            };
            st.kept_bytes -= old.len();
        }
        attached
    }

    /// Appends a server notification to the session's standalone GET
    /// stream, if it has one that has not ended (the spec's place for
    /// messages unrelated to a request, e.g. `list_changed`). `false` when
    /// there is none: the notification is not kept for a later GET.
    pub fn emit_standalone(&self, message: &[u8]) -> bool {
        let stream = {
            let st = lock(&self.state);
            st.logs
                .iter()
                .find(|l| l.standalone && !l.done)
                .map(|l| StreamId(l.id))
        };
        stream.is_some_and(|s| self.emit(s, Some(message)))
    }

    /// Sends an SSE comment (keep-alive) to `stream`'s client attached as
    /// `attached` ([`super::sse::SseTx::id`]); not logged. `false` when
    /// that client is gone (then detached: the stream waits for a
    /// resumption) or another has resumed the stream since.
    pub fn comment(&self, stream: StreamId, attached: u64) -> bool {
        let mut st = lock(&self.state);
        let Some(log) = st.logs.iter_mut().find(|l| l.id == stream.0) else {
            return false;
        };
        match &log.live {
            Some(tx) if tx.id() == attached => {
                if tx.send_bounded(Bytes::from_static(b": keep-alive\n\n")) {
                    return true;
                }
                log.live = None;
                false
            }
            _ => false,
        }
    }

    /// Ends the body of `stream`'s client attached as `attached` without
    /// ending the stream: its events are still kept, and a client with
    /// `Last-Event-ID` resumes it (a GET stream whose token expired, or
    /// whose client went).
    pub fn detach_stream(&self, stream: StreamId, attached: u64) {
        let mut st = lock(&self.state);
        if let Some(log) = st.logs.iter_mut().find(|l| l.id == stream.0)
            && log.live.as_ref().is_some_and(|tx| tx.id() == attached)
        {
            log.live = None;
        }
    }

    /// The stream's last event was sent: its client's body ends.
    pub fn close_stream(&self, stream: StreamId) {
        let mut st = lock(&self.state);
        if let Some(log) = st.logs.iter_mut().find(|l| l.id == stream.0) {
            log.done = true;
            log.live = None;
        }
    }

    /// `GET` with `Last-Event-ID: <stream>-<seq>`: re-attaches that stream
    /// to `live`, replaying the events after `seq` first. `None` when the
    /// stream is unknown or its events are no longer kept.
    pub fn resume(&self, last_event_id: &str, live: super::sse::SseTx) -> Option<StreamId> {
        let (stream, seq) = parse_event_id(last_event_id)?;
        let mut st = lock(&self.state);
        let log = st.logs.iter_mut().find(|l| l.id == stream)?;
        // An event this stream never sent is unknown; events after `seq`
        // must all still be kept. (`seq + 1` overflowed on u64::MAX, a
        // panic that took the shard and with it the process down.)
        let oldest = log.events.front().map_or(log.next_seq, |e| e.0);
        if seq >= log.next_seq || seq + 1 < oldest {
            return None;
        }
        for (_, ev) in log.events.iter().filter(|(s, _)| *s > seq) {
            let _ = live.send(ev.clone());
        }
        if !log.done {
            log.live = Some(live);
        }
        Some(StreamId(stream))
    }

    /// Whether the session is subscribed to resource `uri`.
    pub fn subscribed_to(&self, uri: &str) -> bool {
        lock(&self.state)
            .resources
            .binary_search_by(|u| u.as_str().cmp(uri))
            .is_ok()
    }

    /// Ends the session; whether it had resource subscriptions.
    fn end(&self) -> bool {
        self.ended.store(true, Ordering::Release);
        let mut st = lock(&self.state);
        let subscribed = !st.resources.is_empty();
        st.resources.clear();
        for c in st.calls.values() {
            c.cancel();
        }
        st.asks.clear();
        // The standalone stream ends now. A request's stream stays attached
        // until its request writes its final answer: the calls just
        // cancelled and the questions just dropped answer at once (-32800,
        // "the client ended its session"), and that answer was lost when
        // every stream was cut here.
        for l in st.logs.iter_mut().filter(|l| l.standalone) {
            l.live = None;
            l.done = true;
        }
        subscribed
    }
}

/// Keeps a session in use (see [`Session::busy`]).
pub struct Busy(Arc<Session>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.touch();
        self.0.busy.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A request id in flight in its session ([`Session::start_call`]),
/// released when this drops: when the request was answered, after its
/// last round trip to the client, or when its client went away and its
/// future was dropped (which left the id taken for the session's life).
pub struct CallInFlight {
    session: Arc<Session>,
    id: String,
    cancel: Arc<Cancel>,
}

impl CallInFlight {
    pub fn cancel(&self) -> &Cancel {
        &self.cancel
    }
}

impl Drop for CallInFlight {
    fn drop(&mut self) {
        let mut st = lock(&self.session.state);
        if st
            .calls
            .get(&self.id)
            .is_some_and(|c| Arc::ptr_eq(c, &self.cancel))
        {
            st.calls.remove(&self.id);
        }
    }
}

fn sse_event(stream: u64, seq: u64, message: Option<&[u8]>) -> Bytes {
    let mut b = Vec::with_capacity(48 + message.map_or(0, <[u8]>::len));
    b.extend_from_slice(format!("id: {stream}-{seq}\n").as_bytes());
    // A JSON-RPC message written by the codec has no raw newline (JSON
    // escapes them inside strings), so it is one `data:` line. It names
    // its type, as the 2026-07-28 events and the SDKs' servers do: the
    // SSE default is the same `message`, but some clients (chuk-mcp)
    // dispatch only events that name one, and waited out their timeout.
    // The priming event (an id and empty data) names none.
    if let Some(m) = message {
        b.extend_from_slice(b"event: message\ndata: ");
        b.extend_from_slice(m);
    } else {
        b.extend_from_slice(b"data: ");
    }
    b.extend_from_slice(b"\n\n");
    Bytes::from(b)
}

fn parse_event_id(id: &str) -> Option<(u64, u64)> {
    let (s, n) = id.trim().split_once('-')?;
    Some((s.parse().ok()?, n.parse().ok()?))
}

/// Why no session was created.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("too many sessions ({0}); retry later")]
    Full(usize),
    #[error("the operating system's random source failed: {0}")]
    Random(String),
}

/// One owner shard's sessions, by key.
type Stripe = Mutex<HashMap<u128, Arc<Session>>>;

/// The edge's sessions, striped by owner shard.
pub struct Sessions {
    /// 2026-07-28 `subscriptions/listen` streams: no session, but told of
    /// the same route table changes as the sessions' GET streams.
    listeners: super::modern::Listeners,
    stripes: Box<[Stripe]>,
    count: AtomicUsize,
    /// Sessions with resource subscriptions: while none, a resource update
    /// costs one load, not a walk of every session.
    subscribed: AtomicUsize,
    max: usize,
    ttl: Duration,
    replay_events: usize,
    replay_bytes: usize,
    epoch: Instant,
}

impl Sessions {
    pub fn new(shards: usize, max: usize, ttl: Duration, replay_events: usize) -> Self {
        Self {
            listeners: super::modern::Listeners::default(),
            stripes: (0..shards.max(1)).map(|_| Mutex::default()).collect(),
            count: AtomicUsize::new(0),
            subscribed: AtomicUsize::new(0),
            max,
            ttl,
            replay_events,
            replay_bytes: DEFAULT_REPLAY_BYTES,
            epoch: Instant::now(),
        }
    }

    /// At most `bytes` of SSE events kept per session for resumption
    /// (`http.sse_replay_bytes`).
    pub fn with_replay_bytes(mut self, bytes: usize) -> Self {
        self.replay_bytes = bytes;
        self
    }

    /// The open `subscriptions/listen` streams.
    pub fn listeners(&self) -> &super::modern::Listeners {
        &self.listeners
    }

    /// Creates a session owned by shard `owner`.
    pub fn create(
        &self,
        owner: usize,
        version: &'static str,
        client_elicitation: bool,
        client_sampling: bool,
        client_roots: bool,
    ) -> Result<Arc<Session>, SessionError> {
        if self.count.fetch_add(1, Ordering::AcqRel) >= self.max {
            self.count.fetch_sub(1, Ordering::AcqRel);
            return Err(SessionError::Full(self.max));
        }
        let mut raw = [0u8; 16];
        if let Err(e) = getrandom::fill(&mut raw) {
            self.count.fetch_sub(1, Ordering::AcqRel);
            return Err(SessionError::Random(e.to_string()));
        }
        let key = u128::from_le_bytes(raw);
        let s = Arc::new(Session {
            id: format!("{owner:x}-{key:032x}"),
            key,
            version,
            client_elicitation,
            client_sampling,
            client_roots,
            subject: std::sync::OnceLock::new(),
            last_used_ms: AtomicU64::new(self.epoch.elapsed().as_millis() as u64),
            busy: AtomicUsize::new(0),
            level: AtomicU8::new(0),
            ended: AtomicBool::new(false),
            next_ask: AtomicU64::new(1),
            replay_events: self.replay_events,
            replay_bytes: self.replay_bytes,
            epoch: self.epoch,
            state: Mutex::default(),
        });
        lock(&self.stripes[owner % self.stripes.len()]).insert(key, s.clone());
        Ok(s)
    }

    /// The live session named `id`, marked used.
    pub fn get(&self, id: &str) -> Option<Arc<Session>> {
        let (owner, key) = parse_id(id)?;
        let s = lock(self.stripes.get(owner)?).get(&key).cloned()?;
        s.touch();
        Some(s)
    }

    /// Ends session `id` (DELETE); `false` if it was not live.
    pub fn remove(&self, id: &str) -> bool {
        let Some((owner, key)) = parse_id(id) else {
            return false;
        };
        let Some(stripe) = self.stripes.get(owner) else {
            return false;
        };
        let Some(s) = lock(stripe).remove(&key) else {
            return false;
        };
        self.count.fetch_sub(1, Ordering::AcqRel);
        if s.end() {
            self.subscribed.fetch_sub(1, Ordering::AcqRel);
        }
        true
    }

    /// `resources/subscribe` (`on`) or `unsubscribe` of `uri` by session
    /// `s`, answered by the router: its updates go to `s`'s GET stream.
    /// The -32602 message when the URI is over [`MAX_SUBSCRIBED_URI_BYTES`]
    /// (it is held for the session's life) or `s` already holds
    /// [`MAX_RESOURCE_SUBSCRIPTIONS`].
    pub fn set_subscription(&self, s: &Session, uri: &str, on: bool) -> Result<(), String> {
        if on && uri.len() > MAX_SUBSCRIBED_URI_BYTES {
            return Err(format!(
                "Invalid params: a resource URI of at most {MAX_SUBSCRIBED_URI_BYTES} bytes may be subscribed to"
            ));
        }
        let mut st = lock(&s.state);
        if s.ended.load(Ordering::Acquire) {
            return Ok(());
        }
        let was = st.resources.len();
        match (st.resources.binary_search_by(|u| u.as_str().cmp(uri)), on) {
            (Err(_), true) if was >= MAX_RESOURCE_SUBSCRIPTIONS => {
                return Err(format!(
                    "Invalid params: at most {MAX_RESOURCE_SUBSCRIPTIONS} resource subscriptions per session"
                ));
            }
            (Err(at), true) => st.resources.insert(at, uri.to_owned()),
            (Ok(at), false) => {
                st.resources.remove(at);
            }
            _ => {}
        }
        match (was, st.resources.len()) {
            (0, n) if n > 0 => self.subscribed.fetch_add(1, Ordering::AcqRel),
            (w, 0) if w > 0 => self.subscribed.fetch_sub(1, Ordering::AcqRel),
            _ => 0,
        };
        Ok(())
    }

    /// Sends `notifications/resources/updated` for `uri` to the GET stream
    /// of every session subscribed to it that `scope` reaches: a session's
    /// requests carry its id as their session key.
    pub fn resource_updated(&self, uri: &str, scope: &crate::shared::UpdateScope) {
        if self.subscribed.load(Ordering::Acquire) == 0 {
            return;
        }
        let mut msg = Vec::with_capacity(96 + uri.len());
        msg.extend_from_slice(
            b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/resources/updated\",\"params\":{\"uri\":",
        );
        mcp_schema::args::write_json_string(uri, &mut msg);
        msg.extend_from_slice(b"}}");
        for s in self.all() {
            if scope.reaches(Some(&s.id)) && s.subscribed_to(uri) {
                s.emit_standalone(&msg);
            }
        }
    }

    /// Ends the sessions of `owner` idle past the timeout with nothing in
    /// flight; returns how many.
    pub fn sweep(&self, owner: usize) -> usize {
        let Some(stripe) = self.stripes.get(owner) else {
            return 0;
        };
        let now = self.epoch.elapsed().as_millis() as u64;
        let ttl = self.ttl.as_millis() as u64;
        let mut ended = Vec::new();
        lock(stripe).retain(|_, s| {
            let idle = now.saturating_sub(s.last_used_ms.load(Ordering::Relaxed)) >= ttl
                && s.busy.load(Ordering::Acquire) == 0;
            if idle {
                ended.push(s.clone());
            }
            !idle
        });
        self.count.fetch_sub(ended.len(), Ordering::AcqRel);
        for s in &ended {
            if s.end() {
                self.subscribed.fetch_sub(1, Ordering::AcqRel);
            }
        }
        ended.len()
    }

    pub fn count(&self) -> usize {
        self.count.load(Ordering::Relaxed)
    }

    /// Every live session (a snapshot: the stripes' locks are released
    /// before the caller uses them).
    pub fn all(&self) -> Vec<Arc<Session>> {
        self.stripes
            .iter()
            .flat_map(|stripe| lock(stripe).values().cloned().collect::<Vec<_>>())
            .collect()
    }
}

/// The owner shard named by a session id of this edge, if `id` is one.
pub fn owner_of_id(id: &str) -> Option<usize> {
    parse_id(id).map(|(owner, _)| owner)
}

fn parse_id(id: &str) -> Option<(usize, u128)> {
    if id.len() > MAX_ID_LEN {
        return None;
    }
    let (owner, key) = id.split_once('-')?;
    if key.len() != 32 || owner.is_empty() || owner.len() > 4 {
        return None;
    }
    Some((
        usize::from_str_radix(owner, 16).ok()?,
        u128::from_str_radix(key, 16).ok()?,
    ))
}

#[cfg(test)]
mod tests {
    use super::super::sse;
    use super::*;

    #[test]
    fn ids_are_random_encode_their_owner_and_resolve_only_while_live() {
        let s = Sessions::new(4, 10, Duration::from_secs(60), 8);
        let a = s.create(3, "2025-06-18", false, false, false).unwrap();
        let b = s.create(3, "2025-06-18", false, false, false).unwrap();
        assert_ne!(a.id, b.id);
        assert_ne!(a.key, b.key);
        assert_eq!(owner_of_id(&a.id), Some(3));
        assert!(s.get(&a.id).is_some());
        // A forged id with the right shape but another key is unknown.
        let forged = format!("3-{:032x}", a.key ^ 1);
        assert!(s.get(&forged).is_none());
        for bad in [
            "",
            "3",
            "3-xyz",
            "99999-0",
            &format!("3-{}", "f".repeat(40)),
        ] {
            assert!(s.get(bad).is_none(), "{bad}");
        }
        assert!(s.remove(&a.id));
        assert!(a.is_ended());
        assert!(s.get(&a.id).is_none());
        assert!(!s.remove(&a.id));
        assert_eq!(s.count(), 1);
    }

    #[test]
    fn resource_subscriptions_are_capped_and_counted_until_the_session_ends() {
        let s = Sessions::new(1, 4, Duration::from_secs(60), 8);
        let a = s.create(0, "2025-06-18", false, false, false).unwrap();
        assert!(s.set_subscription(&a, "kv://x", true).is_ok());
        assert!(
            s.set_subscription(&a, "kv://x", true).is_ok(),
            "again: no change"
        );
        assert!(a.subscribed_to("kv://x") && !a.subscribed_to("kv://y"));
        assert_eq!(s.subscribed.load(Ordering::Relaxed), 1);
        assert!(s.set_subscription(&a, "kv://x", false).is_ok());
        assert_eq!(s.subscribed.load(Ordering::Relaxed), 0);
        for i in 0..MAX_RESOURCE_SUBSCRIPTIONS {
            assert!(s.set_subscription(&a, &format!("kv://{i}"), true).is_ok());
        }
        let full = s.set_subscription(&a, "kv://one-more", true).unwrap_err();
        assert!(full.contains("at most 64 resource subscriptions"), "{full}");
        // A URI too long to hold is refused before the count is looked at.
        let long = format!("kv://{}", "k".repeat(MAX_SUBSCRIBED_URI_BYTES));
        let e = s.set_subscription(&a, &long, true).unwrap_err();
        assert!(e.contains("at most 2048 bytes"), "{e}");
        assert_eq!(s.subscribed.load(Ordering::Relaxed), 1);
        assert!(s.remove(&a.id));
        assert_eq!(s.subscribed.load(Ordering::Relaxed), 0, "ended");
    }

    #[test]
    fn sessions_are_capped_and_idle_ones_are_swept_unless_busy() {
        let s = Sessions::new(1, 2, Duration::from_millis(1), 8);
        let a = s.create(0, "2025-06-18", false, false, false).unwrap();
        let b = s.create(0, "2025-06-18", false, false, false).unwrap();
        assert!(matches!(
            s.create(0, "2025-06-18", false, false, false),
            Err(SessionError::Full(2))
        ));
        let _busy = b.busy();
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(s.sweep(0), 1);
        assert!(a.is_ended() && !b.is_ended());
        assert!(s.create(0, "2025-06-18", false, false, false).is_ok());
    }

    #[test]
    fn a_stream_replays_what_its_client_missed_after_last_event_id() {
        let s = Sessions::new(1, 2, Duration::from_secs(60), 3);
        let a = s.create(0, "2025-11-25", false, false, false).unwrap();
        let (tx, rx) = sse::channel();
        let st = a.open_stream(tx, false);
        a.emit(st, None);
        drop(rx); // the client went away
        for m in [&b"{\"a\":1}"[..], b"{\"a\":2}", b"{\"a\":3}"] {
            assert!(!a.emit(st, Some(m)));
        }
        a.close_stream(st);
        // Kept: seq 2, 3, 4 (the priming event fell out of the buffer).
        let (tx, mut rx) = sse::channel();
        assert_eq!(a.resume(&format!("{}-1", st.0), tx), Some(st));
        let mut got = Vec::new();
        while let Ok(ev) = rx.try_recv() {
            got.push(String::from_utf8(ev.to_vec()).unwrap());
        }
        assert_eq!(got.len(), 3);
        assert!(got[0].starts_with(&format!(
            "id: {}-2\nevent: message\ndata: {{\"a\":1}}",
            st.0
        )));
        // The stream was done: nothing stays attached, the body ends.
        assert!(matches!(
            rx.try_recv(),
            Err(futures_channel::mpsc::TryRecvError::Closed)
        ));
        // Too old: seq 1 is gone, so resuming from 0 cannot be complete.
        let (tx, _rx) = sse::channel();
        assert_eq!(a.resume(&format!("{}-0", st.0), tx), None);
        let (tx, _rx) = sse::channel();
        assert_eq!(a.resume("99-1", tx), None);
        // Events it never sent: unknown (u64::MAX once overflowed `seq + 1`
        // and panicked the shard). The last one sent resumes with nothing.
        for never in [5, u64::MAX] {
            let (tx, _rx) = sse::channel();
            assert_eq!(a.resume(&format!("{}-{never}", st.0), tx), None, "{never}");
        }
        let (tx, _rx) = sse::channel();
        assert_eq!(a.resume(&format!("{}-4", st.0), tx), Some(st));
    }

    #[test]
    fn a_detached_get_stream_keeps_its_events_for_the_client_that_resumes_it() {
        let s = Sessions::new(1, 2, Duration::from_secs(60), 10);
        let a = s.create(0, "2025-11-25", false, false, false).unwrap();
        let (tx, mut first) = sse::channel();
        let old = tx.id();
        let get = a.open_stream(tx, true);
        assert!(a.emit_standalone(b"{\"n\":1}"));
        // Its token expired: the body ends, the stream does not.
        a.detach_stream(get, old);
        assert!(first.try_recv().is_ok());
        assert!(matches!(
            first.try_recv(),
            Err(futures_channel::mpsc::TryRecvError::Closed)
        ));
        assert!(!a.emit_standalone(b"{\"n\":2}"), "kept, not sent");
        let (tx, mut again) = sse::channel();
        let new = tx.id();
        assert_eq!(a.resume(&format!("{}-1", get.0), tx), Some(get));
        let replayed = String::from_utf8(again.try_recv().unwrap().to_vec()).unwrap();
        assert!(replayed.contains("\"n\":2"), "{replayed}");
        // The first client's task no longer speaks for the stream: its
        // keep-alive and its detachment leave the new client attached.
        assert!(!a.comment(get, old));
        a.detach_stream(get, old);
        assert!(a.comment(get, new));
        assert!(a.emit_standalone(b"{\"n\":3}"));
    }

    #[test]
    fn a_get_stream_left_unread_is_detached_at_its_bound_and_its_events_kept() {
        let s = Sessions::new(1, 2, Duration::from_secs(60), 10);
        let a = s.create(0, "2025-11-25", false, false, false).unwrap();
        let (tx, mut rx) = sse::channel();
        let get = a.open_stream(tx, true);
        let event = [b'x'; 1000];
        let fits = sse::MAX_UNREAD_BYTES / 1100;
        for _ in 0..fits {
            assert!(a.emit_standalone(&event));
        }
        // Past the bound: detached (its body ends), the event still kept
        // for a resumption.
        let mut sent = fits;
        while a.emit_standalone(&event) {
            sent += 1;
            assert!(sent < 2 * fits, "never detached");
        }
        assert!(
            lock(&a.state)
                .logs
                .iter()
                .any(|l| l.id == get.0 && l.live.is_none())
        );
        assert!(matches!(
            rx.try_recv(),
            Err(futures_channel::mpsc::TryRecvError::Closed)
        ));
        let last = lock(&a.state).logs[0].next_seq - 1;
        let (tx, mut rx) = sse::channel();
        assert_eq!(a.resume(&format!("{}-{}", get.0, last - 1), tx), Some(get));
        assert!(rx.try_recv().is_ok(), "the event past the bound was kept");
        // A request's own stream is its call's: never detached for it.
        let (tx, _rx) = sse::channel();
        let post = a.open_stream(tx, false);
        for _ in 0..2 * fits {
            assert!(a.emit(post, Some(&event)));
        }
    }

    #[test]
    fn a_sessions_kept_events_are_bounded_in_bytes_oldest_stream_first() {
        let s = Sessions::new(1, 2, Duration::from_secs(60), 100).with_replay_bytes(1000);
        let a = s.create(0, "2025-11-25", false, false, false).unwrap();
        let body = [b'x'; 200];
        let mut streams = Vec::new();
        for _ in 0..3 {
            let (tx, rx) = sse::channel();
            let st = a.open_stream(tx, false);
            drop(rx); // its client left
            for _ in 0..3 {
                a.emit(st, Some(&body));
            }
            a.close_stream(st);
            streams.push(st);
        }
        let kept = lock(&a.state).kept_bytes;
        let counted: usize = lock(&a.state)
            .logs
            .iter()
            .flat_map(|l| l.events.iter().map(|(_, e)| e.len()))
            .sum();
        assert_eq!(kept, counted);
        assert!(kept <= 1000, "{kept}");
        // The first stream lost its events, the last keeps all three.
        let (tx, _rx) = sse::channel();
        assert_eq!(a.resume(&format!("{}-0", streams[0].0), tx), None);
        let (tx, mut rx) = sse::channel();
        assert_eq!(
            a.resume(&format!("{}-0", streams[2].0), tx),
            Some(streams[2])
        );
        let mut n = 0;
        while rx.try_recv().is_ok() {
            n += 1;
        }
        assert_eq!(n, 3);
        // An event larger than the whole budget goes out but is not kept,
        // and pushes out nobody else's.
        let (tx, mut live) = sse::channel();
        let big = a.open_stream(tx, false);
        a.emit(big, Some(b"{}"));
        assert!(a.emit(big, Some(&[b'y'; 2000])));
        assert!(live.try_recv().is_ok() && live.try_recv().is_ok());
        assert_eq!(lock(&a.state).kept_bytes, kept);
        let (tx, _rx) = sse::channel();
        assert_eq!(
            a.resume(&format!("{}-0", streams[2].0), tx),
            Some(streams[2])
        );
        // Resuming across it would skip it: 404; after it, nothing is lost.
        let (tx, _rx) = sse::channel();
        assert_eq!(a.resume(&format!("{}-1", big.0), tx), None);
        let (tx, _rx) = sse::channel();
        assert_eq!(a.resume(&format!("{}-2", big.0), tx), Some(big));
    }

    #[test]
    fn cancel_and_answers_reach_their_request() {
        let s = Sessions::new(1, 2, Duration::from_secs(60), 3);
        let a = s.create(0, "2025-06-18", true, false, false).unwrap();
        let c = a.start_call("7").unwrap();
        assert!(a.start_call("7").is_none(), "duplicate ids are refused");
        assert!(a.cancel_call("7"));
        assert!(c.cancel().is_cancelled());
        // Released with its guard, however the request ended.
        drop(c);
        assert!(!a.cancel_call("7"));
        assert!(a.start_call("7").is_some());
        let (id, mut rx) = a.ask().unwrap();
        assert!(a.answer(&id, Bytes::from_static(b"{}")));
        assert_eq!(rx.try_recv().unwrap().unwrap(), Bytes::from_static(b"{}"));
        assert!(!a.answer(&id, Bytes::new()));
    }

    #[test]
    fn questions_waiting_for_the_client_are_bounded() {
        let s = Sessions::new(1, 2, Duration::from_secs(60), 3);
        let a = s.create(0, "2025-06-18", true, false, false).unwrap();
        let asked: Vec<_> = (0..MAX_PENDING_ASKS).map(|_| a.ask().unwrap()).collect();
        assert!(a.ask().is_none(), "one past the bound");
        // An answered (or forgotten) question makes room.
        assert!(a.answer(&asked[0].0, Bytes::new()));
        assert!(a.ask().is_some());
        assert!(a.ask().is_none());
        a.forget_ask(&asked[1].0);
        assert!(a.ask().is_some());
    }
}
