//! Subscribe: one bounded stream per subscriber, filtered by its topics,
//! its session and the log level that applies to it.
//!
//! # What is delivered
//! A notification belongs to one session (the `mcp-session-id` of the call
//! that produced it) or to none (a broadcast). A subscriber receives the
//! notifications of its own session that match its topics, plus matching
//! broadcasts; a subscriber without a session receives broadcasts only.
//! Log notifications below the level that applies are not delivered: the
//! session's (see `session::Sessions::level`), and for a broadcast the
//! subscriber's connection's (a session-less SetLoggingLevel).
//! Sources today: progress frames of CallTool, log/resource-updated frames a
//! router's answer carries, and the edge's own log notifications for calls
//! that fail with a fault, deadline or overload; and `*_list_changed`
//! broadcasts when a new route table is swapped in (an upstream router's
//! listings changed, `crate::upstream`).
//!
//! # Invariants
//! - Publishing never blocks: a subscriber whose buffer is full loses that
//!   notification (counted), it never slows a call down.
//! - A stream removes its subscriber when it is dropped (client gone), and
//!   [`Hub::close`] drops every sender, which ends every stream cleanly.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Instant;

use futures_channel::mpsc;
use mcp_proto::v1::notification::Notification as N;
use mcp_proto::v1::{LogLevel, Notification};
use tonic::Status;
use tonic::codegen::tokio_stream::Stream;

use super::conn::ConnInfo;

/// Notifications buffered per subscriber before new ones are dropped.
pub const SUBSCRIBER_BUFFER: usize = 256;

/// Kinds of notification, as a bit set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Kinds(u16);

impl Kinds {
    pub const ALL: Kinds = Kinds(0xff);
    const NAMES: [(&'static str, &'static str, u16); 8] = [
        ("progress", "notifications/progress", 1),
        ("log", "notifications/message", 1 << 1),
        (
            "resource_updated",
            "notifications/resources/updated",
            1 << 2,
        ),
        (
            "resource_list_changed",
            "notifications/resources/list_changed",
            1 << 3,
        ),
        (
            "tool_list_changed",
            "notifications/tools/list_changed",
            1 << 4,
        ),
        (
            "prompt_list_changed",
            "notifications/prompts/list_changed",
            1 << 5,
        ),
        (
            "roots_list_changed",
            "notifications/roots/list_changed",
            1 << 6,
        ),
        ("cancelled", "notifications/cancelled", 1 << 7),
    ];

    fn of(n: &N) -> u16 {
        match n {
            N::Progress(_) => 1,
            N::Log(_) => 1 << 1,
            N::ResourceUpdated(_) => 1 << 2,
            N::ResourceListChanged(_) => 1 << 3,
            N::ToolListChanged(_) => 1 << 4,
            N::PromptListChanged(_) => 1 << 5,
            N::RootsListChanged(_) => 1 << 6,
            N::Cancelled(_) => 1 << 7,
        }
    }

    /// The topic names a client may use.
    pub fn names() -> impl Iterator<Item = &'static str> {
        Self::NAMES.iter().map(|(n, _, _)| *n)
    }
}

/// What one subscriber asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Topics {
    kinds: Kinds,
    /// Resource URIs whose `resource_updated` is wanted (beyond `kinds`).
    uris: Vec<String>,
}

/// A topic that is a resource URI (it has a scheme): the client wants that
/// resource's updates.
pub fn is_resource_topic(t: &str) -> bool {
    t.contains("://")
}

use crate::edge::{
    MAX_RESOURCE_SUBSCRIPTIONS as MAX_TOPIC_URIS, MAX_SUBSCRIBED_URI_BYTES as MAX_TOPIC_URI_BYTES,
};

impl Topics {
    /// Parses the topics of a SubscribeRequest: a kind name (`progress`,
    /// `log`, …; the MCP method names are accepted too) or a resource URI.
    /// Empty means every kind.
    /// Parses a Subscribe's topics; at most [`MAX_TOPIC_URIS`] distinct
    /// resource URIs of at most [`MAX_TOPIC_URI_BYTES`] each.
    pub fn parse(topics: &[String]) -> Result<Self, String> {
        if topics.is_empty() {
            return Ok(Topics {
                kinds: Kinds::ALL,
                uris: Vec::new(),
            });
        }
        let mut kinds = 0u16;
        let mut uris: Vec<String> = Vec::new();
        for t in topics {
            if is_resource_topic(t) {
                // The HTTP edge's bounds: every update is matched against
                // every subscriber's URIs, and a 4 MiB message held 4,000
                // one-KB URIs (+4 MB a stream, each update 10× slower).
                if t.len() > MAX_TOPIC_URI_BYTES {
                    return Err(format!(
                        "resource topic of {} bytes: at most {MAX_TOPIC_URI_BYTES}",
                        t.len()
                    ));
                }
                if !uris.contains(t) {
                    if uris.len() == MAX_TOPIC_URIS {
                        return Err(format!(
                            "more than {MAX_TOPIC_URIS} resource topics in one Subscribe"
                        ));
                    }
                    uris.push(t.clone());
                }
                continue;
            }
            match Kinds::NAMES
                .iter()
                .find(|(a, b, _)| a == t || b == t || (t == "message" && *a == "log"))
            {
                Some((_, _, bit)) => kinds |= bit,
                None => {
                    let known: Vec<_> = Kinds::names().collect();
                    return Err(format!(
                        "unknown topic `{t}`: use one of {} (or their MCP method names), or a resource URI",
                        known.join(", ")
                    ));
                }
            }
        }
        Ok(Topics {
            kinds: Kinds(kinds),
            uris,
        })
    }

    /// The distinct resource URIs asked for.
    pub fn uris(&self) -> &[String] {
        &self.uris
    }

    /// Whether a resource update could be for this subscriber.
    fn wants_resources(&self) -> bool {
        !self.uris.is_empty()
            || self.kinds.0 & Kinds::of(&N::ResourceUpdated(Default::default())) != 0
    }

    fn wants(&self, n: &N) -> bool {
        if self.kinds.0 & Kinds::of(n) != 0 {
            return true;
        }
        matches!(n, N::ResourceUpdated(r) if self.uris.contains(&r.uri))
    }
}

struct Sub {
    id: u64,
    session: Option<String>,
    /// The subscriber's connection: its log level filters broadcasts.
    conn: ConnInfo,
    topics: Topics,
    tx: mpsc::Sender<Result<Notification, Status>>,
}

/// All subscribers of the edge.
#[derive(Default)]
pub struct Hub {
    // The edge's control plane, not the request path: a std mutex held for
    // a scan of the subscribers, never across an await.
    subs: Mutex<Vec<Sub>>,
    next_id: AtomicU64,
    closed: AtomicBool,
    /// Notifications dropped because a subscriber's buffer was full.
    pub dropped: AtomicU64,
    /// Subscribers whose topics could want a resource update.
    resource_subs: AtomicUsize,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock cannot leave the vector or map
    // half-updated in a way that matters here; keep serving.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Why a subscription was refused.
#[derive(Debug, PartialEq, Eq)]
pub enum SubscribeError {
    Closed,
    TooMany,
}

impl Hub {
    pub fn subscribe(
        self: &Arc<Self>,
        session: Option<String>,
        conn: ConnInfo,
        topics: Topics,
        max: usize,
    ) -> Result<SubscriptionStream, SubscribeError> {
        let (tx, rx) = mpsc::channel(SUBSCRIBER_BUFFER);
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        {
            let mut subs = lock(&self.subs);
            // Checked under the lock, so `close` cannot miss this one.
            if self.closed.load(Ordering::Acquire) {
                return Err(SubscribeError::Closed);
            }
            if subs.len() >= max {
                return Err(SubscribeError::TooMany);
            }
            if topics.wants_resources() {
                self.resource_subs.fetch_add(1, Ordering::Relaxed);
            }
            subs.push(Sub {
                id,
                session,
                conn,
                topics,
                tx,
            });
        }
        Ok(SubscriptionStream {
            rx,
            hub: self.clone(),
            id,
            on_drop: None,
            until: None,
            expired: false,
        })
    }

    /// Delivers `n` to the subscribers of `session` (or, for `None`, to
    /// every subscriber: a broadcast) that asked for it. Log notifications
    /// below `session_level` (for a broadcast: below each subscriber's
    /// connection level) are not delivered.
    pub fn publish(&self, session: Option<&str>, session_level: Option<LogLevel>, n: N) {
        let log_level = match &n {
            N::Log(log) => Some(log.level),
            _ => None,
        };
        if let (Some(l), Some(min)) = (log_level, session_level)
            && session.is_some()
            && l < min as i32
        {
            return;
        }
        let mut subs = lock(&self.subs);
        for sub in subs.iter_mut() {
            let mine = session.is_none_or(|s| sub.session.as_deref() == Some(s));
            let quiet = session.is_none()
                && log_level
                    .zip(sub.conn.level())
                    .is_some_and(|(l, min)| l < min as i32);
            if mine && !quiet && sub.topics.wants(&n) {
                self.send(sub, &n);
            }
        }
    }

    /// Queues `n` on `sub`'s stream, or counts it dropped when the stream
    /// is full.
    fn send(&self, sub: &mut Sub, n: &N) {
        let msg = Notification {
            notification: Some(n.clone()),
        };
        if sub.tx.try_send(Ok(msg)).is_err() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A resource update, to the subscribers `scope` reaches: skipped
    /// without the lock while no subscriber could want one (a router's
    /// write is on the call path).
    pub fn publish_resource_updated(&self, n: N, scope: &crate::shared::UpdateScope) {
        if self.resource_subs.load(Ordering::Relaxed) == 0 {
            return;
        }
        // To the subscribers whose view changed: a session-affine router's
        // write is its session's (a Subscribe's session is its calls' key).
        let mut subs = lock(&self.subs);
        for sub in subs.iter_mut() {
            if scope.reaches(sub.session.as_deref()) && sub.topics.wants(&n) {
                self.send(sub, &n);
            }
        }
    }

    /// Subscribe streams open (`mcp_grpc_subscriptions_open`).
    pub fn subscribers(&self) -> usize {
        lock(&self.subs).len()
    }

    /// Ends every stream (drain) and refuses new subscriptions.
    pub fn close(&self) {
        let mut subs = lock(&self.subs);
        self.closed.store(true, Ordering::Release);
        subs.clear();
        self.resource_subs.store(0, Ordering::Relaxed);
    }

    fn remove(&self, id: u64) {
        lock(&self.subs).retain(|s| {
            let gone = s.id == id;
            if gone && s.topics.wants_resources() {
                self.resource_subs.fetch_sub(1, Ordering::Relaxed);
            }
            !gone
        });
    }
}

/// The stream a Subscribe call returns; dropping it (the client went away,
/// or the call ended) unsubscribes.
pub struct SubscriptionStream {
    rx: mpsc::Receiver<Result<Notification, Status>>,
    hub: Arc<Hub>,
    id: u64,
    on_drop: Option<Box<dyn FnOnce() + Send + Sync>>,
    /// With `[auth]`: when the token that opened it expires.
    until: Option<Instant>,
    /// Ended by its token's expiry.
    expired: bool,
}

impl SubscriptionStream {
    /// Runs `f` when the stream ends (e.g. to let its session idle again).
    pub fn on_drop(mut self, f: impl FnOnce() + Send + Sync + 'static) -> Self {
        self.on_drop = Some(Box::new(f));
        self
    }

    /// Ends the stream, UNAUTHENTICATED, at its first notification from
    /// `until` on: the token is checked once per call, and this call would
    /// otherwise hear its session's updates without limit. (Checked as a
    /// notification comes: a timer would make the stream `!Send`, which
    /// tonic refuses; a stream that hears nothing tells nothing.)
    pub fn until(mut self, until: Instant) -> Self {
        self.until = Some(until);
        self
    }
}

impl Stream for SubscriptionStream {
    type Item = Result<Notification, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.expired {
            return Poll::Ready(None);
        }
        match Pin::new(&mut self.rx).poll_next(cx) {
            Poll::Ready(Some(_)) if self.until.is_some_and(|t| Instant::now() >= t) => {
                self.expired = true;
                // UNAUTHENTICATED, as a call with the expired token is
                // answered (`auth_status`), with the wire code in the trailer.
                let mut st = Status::unauthenticated(
                    "the access token expired: subscribe again with a fresh one",
                );
                st.metadata_mut().insert(
                    super::status::ERROR_CODE_METADATA_KEY,
                    mcp_schema::ErrorCode::Unauthorized.code().into(),
                );
                Poll::Ready(Some(Err(st)))
            }
            other => other,
        }
    }
}

impl Drop for SubscriptionStream {
    fn drop(&mut self) {
        self.hub.remove(self.id);
        if let Some(f) = self.on_drop.take() {
            f();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mcp_proto::v1::{LogNotification, ProgressNotification, ResourceUpdatedNotification};

    fn log(level: LogLevel, m: &str) -> N {
        N::Log(LogNotification {
            level: level as i32,
            logger: "t".into(),
            message: m.into(),
            data: None,
        })
    }

    fn c() -> ConnInfo {
        ConnInfo::detached()
    }

    fn drain_now(s: &mut SubscriptionStream) -> Vec<Notification> {
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        let mut out = Vec::new();
        while let Poll::Ready(Some(Ok(n))) = Pin::new(&mut *s).poll_next(&mut cx) {
            out.push(n);
        }
        out
    }

    #[test]
    fn a_resource_update_reaches_the_subscribers_its_scope_does() {
        use crate::shared::UpdateScope;
        let hub = Arc::new(Hub::default());
        let topic = Topics::parse(&["kv://k".into()]).unwrap();
        let every = Topics::parse(&[]).unwrap();
        let mut a = hub
            .subscribe(Some("a".into()), c(), topic.clone(), 10)
            .unwrap();
        // Every kind, resource updates among them: scoped all the same.
        let mut b = hub.subscribe(Some("b".into()), c(), every, 10).unwrap();
        let mut anon = hub.subscribe(None, c(), topic, 10).unwrap();
        let k = || {
            N::ResourceUpdated(ResourceUpdatedNotification {
                uri: "kv://k".into(),
            })
        };
        hub.publish_resource_updated(k(), &UpdateScope::Session(Some("a".into())));
        assert_eq!(drain_now(&mut a).len(), 1);
        assert!(drain_now(&mut b).is_empty());
        assert!(drain_now(&mut anon).is_empty());
        hub.publish_resource_updated(k(), &UpdateScope::Session(None));
        assert!(drain_now(&mut a).is_empty());
        assert!(drain_now(&mut b).is_empty());
        assert_eq!(drain_now(&mut anon).len(), 1);
        hub.publish_resource_updated(k(), &UpdateScope::Everyone);
        assert_eq!(drain_now(&mut a).len(), 1);
        assert_eq!(drain_now(&mut b).len(), 1);
        assert_eq!(drain_now(&mut anon).len(), 1);
    }

    #[test]
    fn notifications_reach_only_their_sessions_subscribers_with_matching_topics() {
        let hub = Arc::new(Hub::default());
        let all = Topics::parse(&[]).unwrap();
        let logs = Topics::parse(&["log".into()]).unwrap();
        let mut a = hub
            .subscribe(Some("a".into()), c(), all.clone(), 10)
            .unwrap();
        let mut a_logs = hub.subscribe(Some("a".into()), c(), logs, 10).unwrap();
        let mut b = hub
            .subscribe(Some("b".into()), c(), all.clone(), 10)
            .unwrap();
        let mut anon = hub.subscribe(None, c(), all, 10).unwrap();
        let progress = N::Progress(ProgressNotification {
            progress_token: "t".into(),
            progress: 0.5,
            total: None,
            message: None,
        });
        hub.publish(Some("a"), None, progress);
        hub.publish(Some("a"), None, log(LogLevel::Error, "x"));
        assert_eq!(drain_now(&mut a).len(), 2);
        assert_eq!(drain_now(&mut a_logs).len(), 1);
        assert!(drain_now(&mut b).is_empty());
        assert!(drain_now(&mut anon).is_empty());
        // A broadcast reaches everyone who asked for its kind.
        hub.publish(None, None, log(LogLevel::Info, "all"));
        assert_eq!(drain_now(&mut b).len(), 1);
        assert_eq!(drain_now(&mut anon).len(), 1);
    }

    #[test]
    fn resource_topics_select_one_uri_and_log_level_filters_per_session() {
        let hub = Arc::new(Hub::default());
        let mut s = hub
            .subscribe(
                Some("a".into()),
                c(),
                Topics::parse(&["kv://k1".into(), "log".into()]).unwrap(),
                10,
            )
            .unwrap();
        hub.publish(
            Some("a"),
            None,
            N::ResourceUpdated(ResourceUpdatedNotification {
                uri: "kv://k2".into(),
            }),
        );
        hub.publish(
            Some("a"),
            None,
            N::ResourceUpdated(ResourceUpdatedNotification {
                uri: "kv://k1".into(),
            }),
        );
        let error = Some(LogLevel::Error);
        hub.publish(Some("a"), error, log(LogLevel::Warning, "quiet"));
        hub.publish(Some("a"), error, log(LogLevel::Critical, "loud"));
        let got = drain_now(&mut s);
        assert_eq!(got.len(), 2, "{got:?}");
        assert!(matches!(&got[0].notification, Some(N::ResourceUpdated(r)) if r.uri == "kv://k1"));
        assert!(matches!(&got[1].notification, Some(N::Log(l)) if l.message == "loud"));
    }

    #[test]
    fn a_broadcast_log_is_filtered_by_each_subscribers_connection_level() {
        let hub = Arc::new(Hub::default());
        let quiet = c();
        quiet.set_level(LogLevel::Error);
        let all = Topics::parse(&[]).unwrap();
        let mut q = hub.subscribe(None, quiet, all.clone(), 10).unwrap();
        let mut loud = hub.subscribe(None, c(), all, 10).unwrap();
        hub.publish(None, None, log(LogLevel::Warning, "w"));
        hub.publish(None, None, log(LogLevel::Error, "e"));
        assert_eq!(drain_now(&mut q).len(), 1);
        assert_eq!(drain_now(&mut loud).len(), 2);
    }

    #[test]
    fn dropping_a_stream_unsubscribes_and_close_ends_streams_and_refuses_new_ones() {
        let hub = Arc::new(Hub::default());
        let s = hub
            .subscribe(None, c(), Topics::parse(&[]).unwrap(), 1)
            .unwrap();
        assert_eq!(
            hub.subscribe(None, c(), Topics::parse(&[]).unwrap(), 1)
                .err(),
            Some(SubscribeError::TooMany)
        );
        let ended = Arc::new(AtomicBool::new(false));
        let flag = ended.clone();
        let s = s.on_drop(move || flag.store(true, Ordering::Relaxed));
        drop(s);
        assert_eq!(hub.subscribers(), 0);
        assert!(ended.load(Ordering::Relaxed));
        let mut s = hub
            .subscribe(None, c(), Topics::parse(&[]).unwrap(), 1)
            .unwrap();
        hub.close();
        let waker = std::task::Waker::noop();
        assert!(matches!(
            Pin::new(&mut s).poll_next(&mut Context::from_waker(waker)),
            Poll::Ready(None)
        ));
        assert_eq!(
            hub.subscribe(None, c(), Topics::parse(&[]).unwrap(), 1)
                .err(),
            Some(SubscribeError::Closed)
        );
    }

    #[test]
    fn unknown_topics_are_refused_with_the_known_ones() {
        let e = Topics::parse(&["bogus".into()]).unwrap_err();
        assert!(
            e.contains("progress") && e.contains("resource_updated"),
            "{e}"
        );
        assert_eq!(
            Topics::parse(&["notifications/message".into()]).unwrap(),
            Topics::parse(&["log".into()]).unwrap()
        );
    }

    #[test]
    fn resource_topics_are_bounded_like_an_http_sessions_subscriptions() {
        let uri = |i: usize| format!("kv://k{i}");
        let most: Vec<String> = (0..MAX_TOPIC_URIS).map(uri).collect();
        assert_eq!(Topics::parse(&most).unwrap().uris().len(), MAX_TOPIC_URIS);
        // Repeats count once.
        let mut repeated = most.clone();
        repeated.extend(most.iter().cloned());
        assert_eq!(
            Topics::parse(&repeated).unwrap().uris().len(),
            MAX_TOPIC_URIS
        );
        let mut one_more = most;
        one_more.push(uri(MAX_TOPIC_URIS));
        let e = Topics::parse(&one_more).unwrap_err();
        assert!(e.contains("more than 64 resource topics"), "{e}");
        let long = format!("kv://{}", "k".repeat(MAX_TOPIC_URI_BYTES));
        let e = Topics::parse(&[long]).unwrap_err();
        assert!(e.contains("at most 2048"), "{e}");
    }
}
