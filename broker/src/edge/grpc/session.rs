//! The gRPC edge's sessions: issued by Initialize, bound to the caller's
//! [`Identity`], bounded in number and expired when idle.
//!
//! # Invariants
//! - A session id is 128 bits from the operating system's CSPRNG, written
//!   as 32 lowercase hex digits: it cannot be guessed from other ids.
//! - A session is found only by the identity it was issued to. Any other
//!   caller, an id never issued, and an expired one all look the same:
//!   unknown (NOT_FOUND), so an id reveals nothing about other callers.
//! - At most `grpc.max_sessions` sessions exist. A session is reclaimed
//!   when its connection closes, or when it has been idle (no call, no open
//!   Subscribe stream) for `grpc.session_idle_timeout`; a new one is
//!   refused (RESOURCE_EXHAUSTED) only when the registry is full of live
//!   sessions.
//! - The lock guards a hash map lookup per call that carries a session,
//!   taken on whichever shard thread read the call (the edge runs on the
//!   shards) and never held across an await.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use mcp_proto::v1::LogLevel;

use super::conn::{ConnInfo, Identity};

/// Length of a session id: 16 random bytes in hex.
pub const SESSION_ID_LEN: usize = 32;

type Key = [u8; 16];

struct Entry {
    identity: Identity,
    /// The connection it was issued on: when that closes, the session can
    /// never be presented again by its identity (ids are never reused).
    conn: ConnInfo,
    last_used: Instant,
    level: Option<LogLevel>,
    /// Open Subscribe streams: a session someone listens on is not idle.
    subscribers: u32,
}

impl Entry {
    fn expired(&self, now: Instant, ttl: Duration) -> bool {
        !self.conn.is_open()
            || (self.subscribers == 0 && now.saturating_duration_since(self.last_used) >= ttl)
    }
}

/// Why a session was not created.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum SessionError {
    #[error("{0} sessions are live (grpc.max_sessions); retry later")]
    Full(usize),
    #[error("no randomness for a session id: {0}")]
    Random(String),
}

/// The registry.
pub struct Sessions {
    map: Mutex<HashMap<Key, Entry>>,
    max: usize,
    ttl: Duration,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every update is a single insert/remove/field store: a panic elsewhere
    // cannot leave an entry half-written.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Parses a session id as issued (exactly 32 lowercase hex digits).
fn parse(id: &str) -> Option<Key> {
    let b = id.as_bytes();
    if b.len() != SESSION_ID_LEN {
        return None;
    }
    let nibble = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut key = [0u8; 16];
    for (i, k) in key.iter_mut().enumerate() {
        *k = (nibble(b[2 * i])? << 4) | nibble(b[2 * i + 1])?;
    }
    Some(key)
}

fn format(key: &Key) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(SESSION_ID_LEN);
    for b in key {
        s.push(HEX[(b >> 4) as usize] as char);
        s.push(HEX[(b & 15) as usize] as char);
    }
    s
}

impl Sessions {
    pub fn new(max: usize, ttl: Duration) -> Self {
        Self {
            map: Mutex::new(HashMap::new()),
            max,
            ttl,
        }
    }

    /// Issues a new session to the caller on `conn` (no `[auth]`).
    #[cfg(test)]
    pub fn create(&self, conn: &ConnInfo) -> Result<String, SessionError> {
        self.create_for(conn, conn.identity())
    }

    /// Issues a new session on `conn` bound to `identity` (with `[auth]`:
    /// the connection and the token's subject).
    pub fn create_for(&self, conn: &ConnInfo, identity: Identity) -> Result<String, SessionError> {
        let mut key = [0u8; 16];
        getrandom::fill(&mut key).map_err(|e| SessionError::Random(e.to_string()))?;
        let now = Instant::now();
        let mut map = lock(&self.map);
        if map.len() >= self.max {
            let ttl = self.ttl;
            map.retain(|_, e| !e.expired(now, ttl));
            if map.len() >= self.max {
                return Err(SessionError::Full(self.max));
            }
        }
        map.insert(
            key,
            Entry {
                identity,
                conn: conn.clone(),
                last_used: now,
                level: None,
                subscribers: 0,
            },
        );
        Ok(format(&key))
    }

    /// Runs `f` on `id`'s entry when `caller` owns it and it is live, and
    /// marks it used; `None` means unknown to this caller.
    fn with<T>(&self, id: &str, caller: &Identity, f: impl FnOnce(&mut Entry) -> T) -> Option<T> {
        let key = parse(id)?;
        // Every call of a session comes here; its idle limit is minutes.
        let now = crate::coarse::now();
        let mut map = lock(&self.map);
        let e = map.get_mut(&key)?;
        if e.identity != *caller {
            return None;
        }
        if e.expired(now, self.ttl) {
            map.remove(&key);
            return None;
        }
        e.last_used = now;
        Some(f(e))
    }

    /// Whether `caller` may use session `id` (and marks it used).
    pub fn touch(&self, id: &str, caller: &Identity) -> bool {
        self.with(id, caller, |_| ()).is_some()
    }

    /// Sets the session's log level; `false` when it is unknown to `caller`.
    pub fn set_level(&self, id: &str, caller: &Identity, level: LogLevel) -> bool {
        self.with(id, caller, |e| e.level = Some(level)).is_some()
    }

    /// The least severe log level the session wants: its own, else its
    /// connection's (a session-less SetLoggingLevel).
    pub fn level(&self, id: &str) -> Option<LogLevel> {
        let key = parse(id)?;
        let map = lock(&self.map);
        let e = map.get(&key)?;
        e.level.or_else(|| e.conn.level())
    }

    /// Counts an open Subscribe stream on the session (it keeps the
    /// session from idling out); `false` when unknown to `caller`.
    pub fn subscribed(&self, id: &str, caller: &Identity) -> bool {
        self.with(id, caller, |e| e.subscribers += 1).is_some()
    }

    /// The stream counted by [`Self::subscribed`] ended.
    pub fn unsubscribed(&self, id: &str) {
        let Some(key) = parse(id) else { return };
        if let Some(e) = lock(&self.map).get_mut(&key) {
            e.subscribers = e.subscribers.saturating_sub(1);
            e.last_used = Instant::now();
        }
    }

    /// Forgets `id` (an Initialize that was not answered).
    pub fn remove(&self, id: &str) {
        if let Some(key) = parse(id) {
            lock(&self.map).remove(&key);
        }
    }

    /// Drops every expired session (run periodically, so that memory
    /// follows the live sessions, not the peak).
    pub fn sweep(&self) -> usize {
        let now = Instant::now();
        let mut map = lock(&self.map);
        let before = map.len();
        map.retain(|_, e| !e.expired(now, self.ttl));
        before - map.len()
    }

    /// Sessions that can still be used: not those of a closed connection,
    /// which the sweep reclaims only every `session_idle_timeout / 4` (up
    /// to a minute), and `mcp_grpc_sessions` counted meanwhile.
    pub fn count(&self) -> usize {
        lock(&self.map)
            .values()
            .filter(|e| e.conn.is_open())
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_128_random_bits_in_hex_and_round_trip() {
        let s = Sessions::new(10, Duration::from_secs(60));
        let c = ConnInfo::detached();
        let a = s.create(&c).unwrap();
        let b = s.create(&c).unwrap();
        assert_ne!(a, b);
        assert_eq!(a.len(), SESSION_ID_LEN);
        assert!(
            a.bytes()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
        );
        assert_eq!(format(&parse(&a).unwrap()), a);
        // Not a counter or a clock: the two ids differ in many bits.
        let (ka, kb) = (parse(&a).unwrap(), parse(&b).unwrap());
        let differing: u32 = ka.iter().zip(kb).map(|(x, y)| (x ^ y).count_ones()).sum();
        assert!(differing > 16, "{a} vs {b}");
        for bad in ["", "x", &a.to_uppercase(), &format!("{a}0"), &a[1..]] {
            assert!(parse(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn a_session_is_unknown_to_every_other_identity() {
        let s = Sessions::new(10, Duration::from_secs(60));
        let mine = ConnInfo::detached();
        let other = ConnInfo::detached();
        let id = s.create(&mine).unwrap();
        assert!(s.touch(&id, &mine.identity()));
        assert!(!s.touch(&id, &other.identity()));
        assert!(!s.set_level(&id, &other.identity(), LogLevel::Error));
        assert!(!s.subscribed(&id, &other.identity()));
        assert!(!s.touch("00000000000000000000000000000000", &mine.identity()));
        assert!(s.set_level(&id, &mine.identity(), LogLevel::Error));
        assert_eq!(s.level(&id), Some(LogLevel::Error));
    }

    #[test]
    fn the_connection_level_is_the_default_of_its_sessions() {
        let s = Sessions::new(10, Duration::from_secs(60));
        let c = ConnInfo::detached();
        let id = s.create(&c).unwrap();
        assert_eq!(s.level(&id), None);
        c.set_level(LogLevel::Warning);
        assert_eq!(s.level(&id), Some(LogLevel::Warning));
        assert!(s.set_level(&id, &c.identity(), LogLevel::Debug));
        assert_eq!(s.level(&id), Some(LogLevel::Debug));
    }

    #[test]
    fn the_registry_is_bounded_and_idle_sessions_expire_unless_subscribed() {
        let ttl = Duration::from_millis(50);
        let s = Sessions::new(2, ttl);
        let c = ConnInfo::detached();
        let a = s.create(&c).unwrap();
        let b = s.create(&c).unwrap();
        assert_eq!(s.create(&c), Err(SessionError::Full(2)));
        assert!(s.subscribed(&b, &c.identity()));
        let until = Instant::now() + Duration::from_secs(5);
        let third = loop {
            match s.create(&c) {
                Ok(id) => break id,
                Err(SessionError::Full(_)) if Instant::now() < until => {
                    std::thread::sleep(Duration::from_millis(5))
                }
                Err(e) => panic!("{e}"),
            }
        };
        // `a` idled out; `b` has a subscriber, so it stayed.
        assert!(!s.touch(&a, &c.identity()));
        assert!(s.touch(&b, &c.identity()));
        assert!(s.touch(&third, &c.identity()));
        s.unsubscribed(&b);
        assert_eq!(s.count(), 2);
    }

    #[test]
    fn sessions_of_a_closed_connection_are_reclaimed() {
        let s = Sessions::new(1, Duration::from_secs(3600));
        let gone = ConnInfo::detached();
        let id = s.create(&gone).unwrap();
        gone.close();
        assert!(!s.touch(&id, &gone.identity()));
        let c = ConnInfo::detached();
        s.create(&c).unwrap();
        assert_eq!(s.sweep(), 0);
        assert_eq!(s.count(), 1);
        c.close();
        assert_eq!(s.count(), 0, "not counted once its connection closed");
        assert_eq!(s.sweep(), 1);
        assert_eq!(s.count(), 0);
        let id = s.create(&ConnInfo::detached()).unwrap();
        s.remove(&id);
        assert_eq!(s.count(), 0);
    }
}
