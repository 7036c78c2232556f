//! What all shards share: read-only after start-up (but for the routing,
//! which is swapped whole by a reload or when an upstream's listings
//! change), plus the cross-thread hand-off queues.
//!
//! # Invariants
//! - Nothing here is written on the request path except a shard's own inbox
//!   queue (crossbeam, lock-free) and its own statistics (single writer).
//! - A frame handed to another shard is the same `Bytes` (a reference
//!   count), never a copy.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};

use atomic_waker::AtomicWaker;
use crossbeam_channel::{Receiver, Sender, TrySendError};
use futures_channel::oneshot;
use mcp_schema::verify::VerifiedRequest;

use crate::config::Config;
use crate::routing::Routing;

/// A request handed to a shard from another thread, and where its response
/// frames go.
pub struct Job {
    pub req: VerifiedRequest,
    pub reply: oneshot::Sender<Vec<u8>>,
    /// Handed over by another shard's frame connection (session affinity):
    /// that connection's worker records the request in the metrics, so the
    /// shard running it must not record it again.
    pub forwarded: bool,
    /// Where the request's progress and log frames go while it runs (the
    /// gRPC edge: its session's Subscribe streams); `None`: with the answer.
    pub live: Option<LiveSender>,
    /// Claimed by the gRPC edge if it answered the call DEADLINE_EXCEEDED
    /// itself (`None`: the caller has no deadline).
    pub edge_deadline: Option<EdgeDeadline>,
}

/// Who answers a gRPC call with a deadline: the edge's timer
/// (DEADLINE_EXCEEDED) or the shard running it, whichever claims it first.
///
/// The edge claims it ([`Self::fire`]) before it drops the call's future or
/// receiver; the shard running the call then records that answer in the
/// metrics (the router is usually still waiting, on a clock or the network,
/// and never answers). A call dropped unclaimed (its client cancelled, its
/// connection closed) got no answer from the broker and is not counted.
/// A shard that finished a handed-off call claims it before recording its
/// answer ([`Self::claim_answer`]); an edge that then finds the call
/// claimed waits for that answer instead of its own. So the metrics hold
/// what the client got, also when the two finish at the same moment.
///
/// An explicit signal, not an inference from the time: a hand-off can reach
/// a busy owner shard after the deadline has passed, and a cancel can come
/// just before it.
#[derive(Clone, Default)]
pub struct EdgeDeadline(Arc<AtomicU8>);

const UNCLAIMED: u8 = 0;
const EDGE_ANSWERED: u8 = 1;
const SHARD_ANSWERED: u8 = 2;

impl EdgeDeadline {
    /// The edge's timer claims the call: `true` if the edge answers
    /// DEADLINE_EXCEEDED, `false` if the shard's answer is on its way.
    pub fn fire(&self) -> bool {
        self.claim(EDGE_ANSWERED)
    }

    /// The shard claims the call for the answer it is about to send:
    /// `false` if the edge has already answered.
    pub fn claim_answer(&self) -> bool {
        self.claim(SHARD_ANSWERED)
    }

    /// Whether the edge answered the call itself.
    pub fn fired(&self) -> bool {
        self.0.load(Ordering::Acquire) == EDGE_ANSWERED
    }

    fn claim(&self, by: u8) -> bool {
        match self
            .0
            .compare_exchange(UNCLAIMED, by, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => true,
            Err(now) => now == by,
        }
    }
}

/// A thread-safe [`crate::dispatch::LiveOut`] for requests handed to a shard.
pub type LiveSender = Arc<dyn Fn(&[u8]) + Send + Sync>;

/// How many frame connections of each shard subscribe to each resource
/// URI (`frames.rs`): a resource update is sent to those shards only.
#[derive(Default)]
pub struct FrameSubscriptions {
    any: AtomicUsize,
    by_uri: std::sync::Mutex<std::collections::HashMap<Box<str>, Vec<u32>>>,
}

impl FrameSubscriptions {
    fn map(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<Box<str>, Vec<u32>>> {
        self.by_uri.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A connection of `shard` (of `shards`) subscribed to `uri`.
    pub fn add(&self, uri: &str, shard: usize, shards: usize) {
        let mut m = self.map();
        let counts = m.entry(uri.into()).or_insert_with(|| vec![0; shards]);
        if let Some(n) = counts.get_mut(shard) {
            *n += 1;
            self.any.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A connection of `shard` no longer subscribes to `uri`.
    pub fn remove(&self, uri: &str, shard: usize) {
        let mut m = self.map();
        let Some(counts) = m.get_mut(uri) else { return };
        if let Some(n) = counts.get_mut(shard).filter(|n| **n > 0) {
            *n -= 1;
            self.any.fetch_sub(1, Ordering::Relaxed);
        }
        if counts.iter().all(|n| *n == 0) {
            m.remove(uri);
        }
    }

    /// The shards with a connection subscribed to `uri`.
    pub fn shards_for(&self, uri: &str) -> Vec<usize> {
        if self.any.load(Ordering::Relaxed) == 0 {
            return Vec::new();
        }
        self.map().get(uri).map_or_else(Vec::new, |counts| {
            (0..counts.len()).filter(|&i| counts[i] > 0).collect()
        })
    }
}

/// Messages a shard receives from other threads.
pub enum ShardMsg {
    Job(Job),
    /// Stop accepting; answer new requests with shutting-down errors.
    Drain,
    /// The drain deadline passed: answer what is still running with
    /// shutting-down errors.
    DrainExpired,
    /// The admin thread asks for the shard's HdrHistograms and pool state
    /// (see `metrics::record`).
    Snapshot(crate::metrics::SnapshotRequest),
    /// The route table changed: tell the shard's frame connections that
    /// initialized.
    ListChanged(ListKinds),
    /// A resource changed: tell the shard's frame connections subscribed
    /// to it whose view it changed.
    ResourceUpdated(Box<str>, UpdateScope),
    /// A reload brings routers: make and warm their pools, then answer.
    AddPools(AddPools),
    /// A reload removed or replaced these routers (by uid): drop their
    /// pools once the calls running in them end.
    DropPools(Vec<usize>),
    /// A reload moved the frame, HTTP or gRPC edge: accept new connections on
    /// these listeners (this shard's own, `SO_REUSEPORT`); the old one
    /// lingers for [`LISTENER_LINGER`] and closes.
    Listen {
        frames: Option<std::net::TcpListener>,
        http: Option<std::net::TcpListener>,
        grpc: Option<std::net::TcpListener>,
    },
}

/// After a reload moved an edge, how long its old listener still accepts
/// (connections already in its backlog, clients that raced the change)
/// before it closes.
pub const LISTENER_LINGER: std::time::Duration = std::time::Duration::from_millis(500);

/// Where each edge listens now (port 0 resolved).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Addrs {
    pub frames: std::net::SocketAddr,
    pub grpc: std::net::SocketAddr,
    pub http: std::net::SocketAddr,
    pub metrics: std::net::SocketAddr,
}

/// A channel that hands a reload's new listener to an edge off the shards
/// (the admin endpoint).
pub type ListenerSender = futures_channel::mpsc::UnboundedSender<std::net::TcpListener>;

/// New routers' pools for a shard to make: `(uid, metrics slot, router)`.
pub struct AddPools {
    pub pools: Vec<(usize, usize, Arc<crate::wasm::Router>)>,
    /// `Err`: why a pool could not be warmed on this shard.
    pub reply: Sender<Result<(), String>>,
}

/// One shard's inbox: a bounded lock-free queue plus the waker of the task
/// that empties it (monoio wakes it across threads with its `sync` feature).
pub struct Inbox {
    pub tx: Sender<ShardMsg>,
    pub rx: Receiver<ShardMsg>,
    pub waker: AtomicWaker,
    /// Set when the shard has stopped (drained or died): nothing more is
    /// queued for it.
    closed: AtomicBool,
}

/// Bound of an inbox: beyond it hand-offs are refused as overload rather
/// than queued without limit.
pub const INBOX_CAPACITY: usize = 65_536;

/// Per-shard counters, each written only by its own shard (relaxed stores,
/// no contention) and read by the metrics endpoint.
#[derive(Debug)]
pub struct ShardStats {
    pub connections_open: AtomicU64,
    pub connections_accepted: AtomicU64,
    pub connections_refused: AtomicU64,
    pub frames_rejected: AtomicU64,
    pub requests: AtomicU64,
    pub error_responses: AtomicU64,
    pub in_flight: AtomicU64,
    pub bytes_in: AtomicU64,
    pub bytes_out: AtomicU64,
    /// Connections closed because the peer read nothing within
    /// `frames.write_timeout`.
    pub write_timeouts: AtomicU64,
    /// HTTP-edge connections closed at `http.write_timeout`.
    pub http_write_timeouts: AtomicU64,
    /// HTTP-edge connections refused at `http.max_connections_per_shard`.
    pub http_connections_refused: AtomicU64,
    /// gRPC-edge connections refused at `grpc.max_connections`.
    pub grpc_connections_refused: AtomicU64,
    /// HTTP-edge connections open on this shard (TLS handshakes included).
    pub http_connections_open: AtomicU64,
    /// gRPC-edge connections open on this shard (TLS handshakes included).
    pub grpc_connections_open: AtomicU64,
    /// HTTP-edge SSE streams open on this shard, by kind
    /// (`edge::http::StreamKind`).
    pub http_streams_open: [AtomicU64; crate::edge::http::StreamKind::ALL.len()],
    /// Failed accepts on this shard's listeners, every edge (EMFILE: the
    /// process is out of descriptors).
    pub accept_errors: AtomicU64,
    /// HTTP-edge responses by status (`metrics::http_status_slot`).
    pub http_responses: [AtomicU64; crate::metrics::HTTP_STATUSES.len() + 1],
    /// gRPC-edge connections closed at `grpc.write_timeout`.
    pub grpc_write_timeouts: AtomicU64,
    /// Nanoseconds the shard spent in idle-polling windows (`broker.idle_poll`).
    pub idle_poll_ns: AtomicU64,
    pub ready: AtomicBool,
    /// The shard thread died (a panic outside any request's handler).
    pub dead: AtomicBool,
    /// The label space, the same for every shard.
    pub layout: Arc<crate::metrics::Layout>,
    /// Requests, latency histograms and rejections by reason.
    pub series: crate::metrics::ShardSeries,
}

impl ShardStats {
    pub fn new(layout: &Arc<crate::metrics::Layout>) -> Self {
        Self {
            connections_open: AtomicU64::new(0),
            connections_accepted: AtomicU64::new(0),
            connections_refused: AtomicU64::new(0),
            frames_rejected: AtomicU64::new(0),
            requests: AtomicU64::new(0),
            error_responses: AtomicU64::new(0),
            in_flight: AtomicU64::new(0),
            bytes_in: AtomicU64::new(0),
            bytes_out: AtomicU64::new(0),
            write_timeouts: AtomicU64::new(0),
            http_write_timeouts: AtomicU64::new(0),
            http_connections_refused: AtomicU64::new(0),
            grpc_connections_refused: AtomicU64::new(0),
            http_connections_open: AtomicU64::new(0),
            grpc_connections_open: AtomicU64::new(0),
            http_streams_open: std::array::from_fn(|_| AtomicU64::new(0)),
            accept_errors: AtomicU64::new(0),
            http_responses: std::array::from_fn(|_| AtomicU64::new(0)),
            grpc_write_timeouts: AtomicU64::new(0),
            idle_poll_ns: AtomicU64::new(0),
            ready: AtomicBool::new(false),
            dead: AtomicBool::new(false),
            layout: layout.clone(),
            series: crate::metrics::ShardSeries::new(layout),
        }
    }

    /// Counts a rejected frame, in the total and by its reason.
    pub fn reject(&self, e: &mcp_schema::FrameError) {
        Self::add(&self.frames_rejected, 1);
        let reason = crate::metrics::Reject::of(e) as usize;
        Self::add(&self.series.rejected[reason], 1);
    }

    pub fn add(c: &AtomicU64, n: u64) {
        c.store(c.load(Ordering::Relaxed) + n, Ordering::Relaxed);
    }
    pub fn sub(c: &AtomicU64, n: u64) {
        c.store(
            c.load(Ordering::Relaxed).saturating_sub(n),
            Ordering::Relaxed,
        );
    }
}

/// Capabilities the routers advertise, unioned.
#[derive(Debug, Default, Clone, Copy)]
pub struct Capabilities {
    pub completions: bool,
    pub subscribe: bool,
}

pub struct Shared {
    /// The configuration the process started with. Its `[[routers]]` and
    /// `[naming]` are those of start-up: a reload's are in [`Self::routing`].
    pub config: Config,
    /// The routing in effect. Readers `load()` it per request (no lock);
    /// only the `routing` thread (`control.rs`) stores a new one.
    pub routing: arc_swap::ArcSwap<Routing>,
    /// Counters of upstream routers that reloads took out of the routing.
    /// Held by the `routing` thread while it publishes a routing that
    /// drops one, and by `/metrics` while it reads the upstream series.
    pub upstream_retired: std::sync::Mutex<crate::upstream::Retired>,
    /// The metrics label space.
    pub layout: Arc<crate::metrics::Layout>,
    /// `[auth]`: bearer tokens are required on every edge.
    pub auth: Option<Arc<crate::auth::Auth>>,
    /// `[tls]`: the edges serve TLS; what new handshakes use.
    pub tls: Option<Arc<crate::tls::ServerTls>>,
    /// Seals routers' state into 2026-07-28's `requestState`, with one key
    /// for every shard (a retry may reach any of them). Boxed: the AES key
    /// schedule is some 500 bytes that no request reads, kept off the cache
    /// lines of the fields every request does.
    pub request_states: Box<crate::edge::http::request_state::RequestStates>,
    /// Upstream routers whose calls' answers said their listings changed
    /// (by uid), for the `routing` thread.
    kicks: (Sender<usize>, Receiver<usize>),
    /// Reloads asked for (SIGHUP, `POST /admin/reload`).
    reloads: (
        Sender<crate::control::ReloadRequest>,
        Receiver<crate::control::ReloadRequest>,
    ),
    pub reloads_applied: AtomicU64,
    pub reloads_refused: AtomicU64,
    /// Where each edge listens; a reload may move them.
    pub addrs: std::sync::Mutex<Option<Addrs>>,
    /// Where a reload hands the admin endpoint's new listener.
    pub admin_rebind: std::sync::OnceLock<ListenerSender>,
    pub inboxes: Vec<Inbox>,
    pub stats: Vec<ShardStats>,
    draining: AtomicBool,
    /// Reporting not-ready before draining (`broker.drain_grace`).
    leaving: AtomicBool,
    /// Shards that died, for `main` (which then exits non-zero).
    deaths: (Sender<usize>, Receiver<usize>),
    /// The HTTP edge's sessions, striped by owner shard
    /// (`edge/http/session.rs`).
    pub http_sessions: crate::edge::http::session::Sessions,
    /// The gRPC edge's sessions and Subscribe streams open, for `/metrics`
    /// (they live in its service, which sets this once).
    pub grpc_counts: std::sync::OnceLock<Box<dyn Fn() -> (usize, usize) + Send + Sync>>,
    list_observers: std::sync::Mutex<Vec<ListObserver>>,
    /// Told of every resource update: read lock-free on each update (a
    /// router's write), written once per edge at start.
    resource_observers: arc_swap::ArcSwap<Vec<ResourceObserver>>,
    /// Frame connections' resource subscriptions, by URI and shard: an
    /// update goes to the shards with a subscriber, and while there is
    /// none anywhere it costs one load.
    pub frame_subscriptions: FrameSubscriptions,
    /// `POST /admin/reload` requests waiting for their outcome: the
    /// process answers them before it exits.
    pub reloads_waiting: AtomicUsize,
    /// HTTP streams ended for what their client left unread
    /// (`edge::http::sse`): session GET streams, listen streams.
    pub http_get_streams_cut: Arc<AtomicU64>,
    pub http_listen_streams_cut: Arc<AtomicU64>,
}

/// Told of every route table change (the gRPC edge's Subscribe hub).
pub type ListObserver = Arc<dyn Fn(ListKinds) + Send + Sync>;

/// Told of every resource update, with its URI and whose view of it
/// changed (the gRPC edge's Subscribe hub, for its resource topics).
pub type ResourceObserver = Arc<dyn Fn(&str, &UpdateScope) + Send + Sync>;

/// Whose view of a resource an update changed, and so which subscribers
/// are told of it. A session-affine router keeps one instance, and one
/// state, per session key: its write changed what that key's requests
/// read and nobody else's. Telling every subscriber of the URI told other
/// sessions (and, with `[auth]`, other subjects) that someone wrote there,
/// and had them read back a state that had not moved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UpdateScope {
    /// A router whose instances every caller shares: every subscriber.
    Everyone,
    /// A session-affine router's instance of this session key
    /// (`VerifiedRequest::session_key`; `None`: the shared instances that
    /// requests without a session reach).
    Session(Option<Arc<str>>),
}

impl UpdateScope {
    /// Whether a subscriber whose own requests carry session key `key`
    /// (as `VerifiedRequest::session_key` makes it) sees this update.
    pub fn reaches(&self, key: Option<&str>) -> bool {
        match self {
            UpdateScope::Everyone => true,
            UpdateScope::Session(k) => k.as_deref() == key,
        }
    }
}

/// Which listings changed, as a bit set.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ListKinds {
    pub tools: bool,
    pub resources: bool,
    pub prompts: bool,
}

impl ListKinds {
    /// The MCP notification methods for these kinds.
    pub fn methods(self) -> impl Iterator<Item = &'static str> {
        [
            (self.tools, "notifications/tools/list_changed"),
            (self.resources, "notifications/resources/list_changed"),
            (self.prompts, "notifications/prompts/list_changed"),
        ]
        .into_iter()
        .filter_map(|(on, m)| on.then_some(m))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    #[error("shard {0}'s inbox is full")]
    Full(usize),
    #[error("shard {0} has stopped")]
    Stopped(usize),
}

impl Shared {
    pub fn new(
        config: Config,
        routing: Routing,
        layout: Arc<crate::metrics::Layout>,
        shards: usize,
        auth: Option<Arc<crate::auth::Auth>>,
        tls: Option<Arc<crate::tls::ServerTls>>,
        request_states: crate::edge::http::request_state::RequestStates,
    ) -> Self {
        let inboxes = (0..shards)
            .map(|_| {
                let (tx, rx) = crossbeam_channel::bounded(INBOX_CAPACITY);
                Inbox {
                    tx,
                    rx,
                    waker: AtomicWaker::new(),
                    closed: AtomicBool::new(false),
                }
            })
            .collect();
        let http_sessions = crate::edge::http::session::Sessions::new(
            shards,
            config.http.max_sessions,
            config.http.session_idle_timeout,
            config.http.sse_replay_events,
        )
        .with_replay_bytes(config.http.sse_replay_bytes);
        Self {
            http_sessions,
            grpc_counts: std::sync::OnceLock::new(),
            config,
            routing: arc_swap::ArcSwap::from_pointee(routing),
            upstream_retired: std::sync::Mutex::default(),
            auth,
            tls,
            request_states: Box::new(request_states),
            kicks: crossbeam_channel::bounded(1024),
            reloads: crossbeam_channel::bounded(64),
            reloads_applied: AtomicU64::new(0),
            reloads_refused: AtomicU64::new(0),
            addrs: std::sync::Mutex::new(None),
            admin_rebind: std::sync::OnceLock::new(),
            inboxes,
            stats: (0..shards).map(|_| ShardStats::new(&layout)).collect(),
            layout,
            draining: AtomicBool::new(false),
            leaving: AtomicBool::new(false),
            deaths: crossbeam_channel::unbounded(),
            list_observers: std::sync::Mutex::default(),
            resource_observers: arc_swap::ArcSwap::default(),
            frame_subscriptions: FrameSubscriptions::default(),
            reloads_waiting: AtomicUsize::new(0),
            http_get_streams_cut: Arc::default(),
            http_listen_streams_cut: Arc::default(),
        }
    }

    pub fn shards(&self) -> usize {
        self.inboxes.len()
    }

    /// Asks for upstream router `uid`'s listings to be re-read soon (from a
    /// shard: never blocks; a full queue already holds enough requests).
    pub fn request_refresh(&self, uid: usize) {
        let _ = self.kicks.0.try_send(uid);
    }

    pub(crate) fn kicks(&self) -> &Receiver<usize> {
        &self.kicks.1
    }

    /// Asks the `routing` thread to reload the config file; the outcome
    /// goes to `reply`. `false` when too many reloads are already queued.
    pub fn request_reload(&self, reply: Option<Sender<crate::control::ReloadOutcome>>) -> bool {
        self.reloads
            .0
            .try_send(crate::control::ReloadRequest { reply })
            .is_ok()
    }

    pub(crate) fn reloads(&self) -> &Receiver<crate::control::ReloadRequest> {
        &self.reloads.1
    }

    /// Where each edge listens now (`None` before start-up bound them).
    pub fn addrs(&self) -> Option<Addrs> {
        *self.addrs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The shard that owns a session: the one an HTTP edge session id
    /// names (the shard that created it, where its session-affine router
    /// instances then live), else FNV-1a of the id, so every edge and every
    /// shard agree without coordination.
    pub fn owner_of(&self, session: &str) -> usize {
        if let Some(owner) = crate::edge::http::session::owner_of_id(session)
            && owner < self.shards()
        {
            return owner;
        }
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in session.as_bytes() {
            h ^= *b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        (h % self.shards() as u64) as usize
    }

    /// Hands `req` to shard `shard`; the receiver yields its response
    /// frames.
    pub fn submit(
        &self,
        shard: usize,
        req: VerifiedRequest,
        live: Option<LiveSender>,
        edge_deadline: Option<EdgeDeadline>,
    ) -> Result<oneshot::Receiver<Vec<u8>>, SubmitError> {
        let (reply, rx) = oneshot::channel();
        let forwarded = false;
        self.send(
            shard,
            ShardMsg::Job(Job {
                req,
                reply,
                forwarded,
                live,
                edge_deadline,
            }),
        )?;
        Ok(rx)
    }

    /// [`Self::submit`] for a frame-edge request handed to its session's
    /// owner shard: recorded in the metrics by the shard it came in on.
    pub fn forward(
        &self,
        shard: usize,
        req: VerifiedRequest,
    ) -> Result<oneshot::Receiver<Vec<u8>>, SubmitError> {
        let (reply, rx) = oneshot::channel();
        let forwarded = true;
        self.send(
            shard,
            ShardMsg::Job(Job {
                req,
                reply,
                forwarded,
                // The origin connection is on another thread: its
                // notifications come back with the answer.
                live: None,
                // Frame calls have no edge timer: the shard answers their
                // deadlines itself.
                edge_deadline: None,
            }),
        )?;
        Ok(rx)
    }

    pub fn send(&self, shard: usize, msg: ShardMsg) -> Result<(), SubmitError> {
        let inbox = &self.inboxes[shard];
        if inbox.closed.load(Ordering::Acquire) {
            return Err(SubmitError::Stopped(shard));
        }
        match inbox.tx.try_send(msg) {
            Ok(()) => {
                // The shard may have stopped between the check and the send,
                // after emptying its inbox for the last time: empty it here,
                // so what was queued is dropped (its sender sees the shard
                // stopped) rather than left waiting forever.
                if inbox.closed.load(Ordering::Acquire) {
                    while inbox.rx.try_recv().is_ok() {}
                    return Err(SubmitError::Stopped(shard));
                }
                inbox.waker.wake();
                Ok(())
            }
            Err(TrySendError::Full(_)) => Err(SubmitError::Full(shard)),
            Err(TrySendError::Disconnected(_)) => Err(SubmitError::Stopped(shard)),
        }
    }

    /// Marks shard `shard` stopped and drops what is queued for it: each
    /// dropped job's reply channel closes, which its sender answers as
    /// "shard stopped".
    pub fn close_inbox(&self, shard: usize) {
        let inbox = &self.inboxes[shard];
        inbox.closed.store(true, Ordering::Release);
        while inbox.rx.try_recv().is_ok() {}
    }

    /// Called by a shard thread that is dying.
    pub fn report_death(&self, shard: usize) {
        let _ = self.deaths.0.send(shard);
    }

    /// Where `main` learns of shards that died.
    pub fn deaths(&self) -> &Receiver<usize> {
        &self.deaths.1
    }

    /// Whether any shard thread died.
    pub fn any_shard_dead(&self) -> bool {
        self.stats.iter().any(|s| s.dead.load(Ordering::Relaxed))
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    /// Reports not-ready from now on, while still serving (the drain
    /// grace before [`Self::start_drain`]).
    pub fn start_leaving(&self) {
        self.leaving.store(true, Ordering::Relaxed);
    }

    pub fn is_leaving(&self) -> bool {
        self.leaving.load(Ordering::Relaxed)
    }

    /// Starts draining: every shard stops accepting.
    pub fn start_drain(&self) {
        self.draining.store(true, Ordering::Relaxed);
        for i in 0..self.shards() {
            let _ = self.send(i, ShardMsg::Drain);
        }
    }

    pub fn expire_drain(&self) {
        for i in 0..self.shards() {
            let _ = self.send(i, ShardMsg::DrainExpired);
        }
    }

    /// Tells the clients that listen that the route table changed: frame
    /// connections that initialized (through their shards), HTTP sessions
    /// on their GET stream, gRPC Subscribe streams through the observers the
    /// gRPC edge registered. Called off the shards.
    pub fn notify_list_changed(&self, kinds: ListKinds) {
        for i in 0..self.shards() {
            let _ = self.send(i, ShardMsg::ListChanged(kinds));
        }
        for method in kinds.methods() {
            let msg = format!(r#"{{"jsonrpc":"2.0","method":"{method}"}}"#);
            for s in self.http_sessions.all() {
                s.emit_standalone(msg.as_bytes());
            }
        }
        self.http_sessions.listeners().notify(kinds);
        let observers = self
            .list_observers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        for o in observers {
            o(kinds);
        }
    }

    /// Tells the listen streams subscribed to resource `uri` that it
    /// changed (a router's `resource-updated`, from any shard), the HTTP
    /// sessions that `resources/subscribe`d to it (on their GET stream), the
    /// frame connections subscribed to it, and the observers the other
    /// edges registered (gRPC resource topics): of each, those that `scope`
    /// reaches.
    pub fn notify_resource_updated(&self, uri: &str, scope: &UpdateScope) {
        for i in self.frame_subscriptions.shards_for(uri) {
            let _ = self.send(i, ShardMsg::ResourceUpdated(uri.into(), scope.clone()));
        }
        self.http_sessions.listeners().resource_updated(uri, scope);
        self.http_sessions.resource_updated(uri, scope);
        for o in self.resource_observers.load().iter() {
            o(uri, scope);
        }
    }

    /// Registers `f` to be told of every resource update.
    pub fn on_resource_updated(&self, f: ResourceObserver) {
        self.resource_observers.rcu(|v| {
            let mut v = Vec::clone(v);
            v.push(f.clone());
            v
        });
    }

    /// Registers `f` to be told of every route table change.
    pub fn on_list_changed(&self, f: ListObserver) {
        self.list_observers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(f);
    }

    pub fn in_flight(&self) -> u64 {
        self.stats
            .iter()
            .map(|s| s.in_flight.load(Ordering::Relaxed))
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::EdgeDeadline;

    #[test]
    fn the_first_to_claim_a_deadline_call_answers_it() {
        // The edge's timer first: the shard's answer is not the client's.
        let d = EdgeDeadline::default();
        assert!(!d.fired());
        assert!(d.fire());
        assert!(d.fire(), "firing again changes nothing");
        assert!(!d.claim_answer());
        assert!(d.fired());

        // The shard first: the edge waits for its answer.
        let d = EdgeDeadline::default();
        assert!(d.claim_answer());
        assert!(!d.fire());
        assert!(!d.fired());

        // Clones share the claim, as the edge's and the shard's copies do.
        let edge = EdgeDeadline::default();
        let shard = edge.clone();
        assert!(shard.claim_answer());
        assert!(!edge.fire());
        assert!(!shard.fired());
    }

    #[test]
    fn an_update_scope_reaches_everyone_or_its_own_session_key_only() {
        use super::UpdateScope;
        assert!(UpdateScope::Everyone.reaches(None));
        assert!(UpdateScope::Everyone.reaches(Some("a")));
        let a = UpdateScope::Session(Some("a".into()));
        assert!(a.reaches(Some("a")));
        assert!(!a.reaches(Some("b")));
        assert!(!a.reaches(None));
        let shared = UpdateScope::Session(None);
        assert!(shared.reaches(None));
        assert!(!shared.reaches(Some("a")));
    }

    #[test]
    fn frame_subscriptions_send_an_update_to_the_subscribed_shards_only() {
        use super::FrameSubscriptions;
        use std::sync::atomic::Ordering;
        let f = FrameSubscriptions::default();
        assert!(f.shards_for("kv://a").is_empty());
        f.add("kv://a", 1, 3);
        f.add("kv://a", 1, 3);
        f.add("kv://a", 2, 3);
        f.add("kv://b", 0, 3);
        assert_eq!(f.shards_for("kv://a"), [1, 2]);
        assert_eq!(f.shards_for("kv://b"), [0]);
        f.remove("kv://a", 1);
        assert_eq!(f.shards_for("kv://a"), [1, 2]);
        f.remove("kv://a", 1);
        f.remove("kv://a", 1); // one too many: no underflow
        f.remove("kv://a", 2);
        assert!(f.shards_for("kv://a").is_empty());
        f.remove("kv://b", 0);
        assert_eq!(f.any.load(Ordering::Relaxed), 0);
        assert!(f.map().is_empty());
    }
}
