//! Upstream routers' listings: re-read, rebuilt into a new route table, and
//! swapped whole.
//!
//! A router configured with `upstream = URL` runs the bundled `upstream`
//! component, whose tools, resources and prompts are its upstream's. They
//! change when the upstream changes, and they are unknown while it is
//! unreachable. One thread (`upstream-refresh`) keeps them current:
//! - every `refresh_interval` per upstream router;
//! - at once when a call's answer says its upstream announced a
//!   `notifications/*/list_changed` ([`LIST_CHANGED_META_KEY`]);
//! - while an upstream is unavailable (at start-up or later), with
//!   exponential backoff from 1 s up to its `refresh_interval`.
//!
//! Each re-read calls the router's list exports (off the shards) on one
//! instance kept per upstream router, so that its upstream session is
//! reused rather than a new one opened per read. When any listing changed,
//! the whole table is rebuilt from every router's current metadata and
//! swapped in
//! ([`Shared::table`]); requests already running keep the table they
//! started with. A rebuild that fails (a name collision the new listing
//! brings) keeps the old table and is logged.
//!
//! # Invariants
//! - An unavailable upstream is never fatal: its router serves nothing
//!   until its upstream answers, and the others are unaffected.
//! - The shards never wait for this thread; it never holds a lock a shard
//!   takes on the request path.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};

use crate::route::{RouteTable, RouterEntry};
use crate::shared::{ListKinds, Shared};
use crate::wasm::{MetaReader, Router, RouterMeta};

/// Default `refresh_interval` of an upstream router.
pub const DEFAULT_REFRESH_INTERVAL: Duration = Duration::from_secs(60);
/// First retry after an upstream was found unavailable.
const FIRST_RETRY: Duration = Duration::from_secs(1);
/// Shortest time between two re-reads of one router that calls' hints ask
/// for: an upstream that announces changes on every call is re-read at
/// most this often.
const MIN_HINTED_GAP: Duration = Duration::from_millis(200);

/// The tool-result meta entry by which the `upstream` router says that its
/// upstream announced a list change during the call (value: a JSON array of
/// `"tools"`, `"resources"`, `"prompts"`). The broker re-reads that
/// router's listings and does not pass the entry on.
pub const LIST_CHANGED_META_KEY: &str = "mcp-broker/list-changed";

/// What the broker knows of one upstream router, for `/readyz` and
/// `/metrics`.
#[derive(Debug)]
pub struct UpstreamStatus {
    /// The loaded router (its outbound counters).
    pub router: Arc<Router>,
    pub available: AtomicBool,
    /// Why it is unavailable (the router's own words), when it is.
    pub reason: Mutex<Option<String>>,
    /// Re-reads done, and of those, ones that found it unavailable.
    pub refreshes: AtomicU64,
    pub failures: AtomicU64,
    /// Route tables swapped in because this router's listings changed.
    pub swaps: AtomicU64,
}

/// Per router (by `RouterId`): `Some` for upstream routers.
#[derive(Debug)]
pub struct Upstreams {
    pub status: Vec<Option<UpstreamStatus>>,
    kick: Sender<usize>,
    kicks: Receiver<usize>,
}

impl Upstreams {
    /// `upstream[i]`: whether router `i` (`routers[i]`) is an upstream
    /// router, and why it was unavailable at load if it was.
    pub fn new(upstream: &[Option<Option<String>>], routers: &[Arc<Router>]) -> Self {
        let (kick, kicks) = crossbeam_channel::bounded(1024);
        Self {
            status: upstream
                .iter()
                .zip(routers)
                .map(|(u, router)| {
                    u.as_ref().map(|unavailable| UpstreamStatus {
                        router: router.clone(),
                        available: AtomicBool::new(unavailable.is_none()),
                        reason: Mutex::new(unavailable.clone()),
                        refreshes: AtomicU64::new(0),
                        failures: AtomicU64::new(0),
                        swaps: AtomicU64::new(0),
                    })
                })
                .collect(),
            kick,
            kicks,
        }
    }

    /// Asks for router `router`'s listings to be re-read soon (from a shard:
    /// never blocks; a full queue already holds enough requests).
    pub fn request_refresh(&self, router: usize) {
        if self.status.get(router).is_some_and(Option::is_some) {
            let _ = self.kick.try_send(router);
        }
    }

    /// `(router index, status)` of every upstream router.
    pub fn iter(&self) -> impl Iterator<Item = (usize, &UpstreamStatus)> {
        self.status
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.as_ref().map(|s| (i, s)))
    }
}

/// What the refresher owns: every router with its current entry.
pub struct Refresher {
    pub shared: Arc<Shared>,
    pub routers: Vec<Arc<Router>>,
    pub entries: Vec<RouterEntry>,
    /// Per router: its refresh interval (`None`: not an upstream router).
    pub intervals: Vec<Option<Duration>>,
}

impl Refresher {
    /// Starts the `upstream-refresh` thread if any router is an upstream
    /// router. It runs until the process exits.
    pub fn spawn(self) -> std::io::Result<()> {
        if self.intervals.iter().all(Option::is_none) {
            return Ok(());
        }
        std::thread::Builder::new()
            .name("upstream-refresh".into())
            .spawn(move || self.run())
            .map(drop)
    }

    fn run(mut self) {
        // One metadata instance per upstream router, kept between reads.
        let mut readers: Vec<Option<MetaReader>> = self
            .intervals
            .iter()
            .zip(&self.routers)
            .map(|(iv, r)| iv.map(|_| r.meta_reader()))
            .collect();
        let now = Instant::now();
        // When each upstream router is next due, and its current backoff.
        let mut due: Vec<Option<(Instant, Duration)>> = self
            .intervals
            .iter()
            .enumerate()
            .map(|(i, iv)| {
                let iv = (*iv)?;
                let available = self
                    .status(i)
                    .is_some_and(|s| s.available.load(Ordering::Relaxed));
                Some(if available {
                    (now + iv, FIRST_RETRY)
                } else {
                    (now + FIRST_RETRY, (FIRST_RETRY * 2).min(iv))
                })
            })
            .collect();
        let mut last_read: Vec<Option<Instant>> = vec![None; self.intervals.len()];
        loop {
            if self.shared.is_draining() {
                return;
            }
            let next = due.iter().flatten().map(|(t, _)| *t).min();
            let wait = next.map_or(Duration::from_secs(1), |t| {
                t.saturating_duration_since(Instant::now())
            });
            // At most 1 s, so a drain is noticed.
            let kicked = self
                .shared
                .upstreams
                .kicks
                .recv_timeout(wait.min(Duration::from_secs(1)))
                .ok();
            let now = Instant::now();
            if let Some(r) = kicked
                && let Some(Some((t, _))) = due.get_mut(r)
            {
                // A hint: re-read soon, but not more often than the gap.
                let earliest = last_read[r].map_or(now, |l| l + MIN_HINTED_GAP);
                *t = (*t).min(earliest.max(now));
            }
            for r in 0..due.len() {
                let Some((t, backoff)) = due[r] else { continue };
                if t > now {
                    continue;
                }
                last_read[r] = Some(now);
                let Some(reader) = readers[r].as_mut() else {
                    continue;
                };
                let ok = self.refresh(r, reader);
                // `backoff` is the wait after the next failure: it doubles
                // up to the interval, and a success resets it.
                let iv = self.intervals[r].unwrap_or(DEFAULT_REFRESH_INTERVAL);
                let (wait, next) = if ok {
                    (iv, FIRST_RETRY)
                } else {
                    (backoff, (backoff * 2).min(iv))
                };
                due[r] = Some((Instant::now() + wait, next));
            }
        }
    }

    fn status(&self, r: usize) -> Option<&UpstreamStatus> {
        self.shared.upstreams.status.get(r)?.as_ref()
    }

    /// Re-reads router `r`; swaps a new table in if its listings changed.
    /// `false` when the upstream is unavailable.
    fn refresh(&mut self, r: usize, reader: &mut MetaReader) -> bool {
        let name = self.entries[r].name.clone();
        let meta = match reader.read() {
            Ok(m) => m,
            Err(e) => {
                self.mark(r, Some(format!("reading its listings failed: {e}")));
                return false;
            }
        };
        if let Some(reason) = meta.unavailable() {
            self.mark(r, Some(reason));
            return false;
        }
        self.mark(r, None);
        let kinds = changed(&self.entries[r].meta, &meta);
        if kinds == ListKinds::default() {
            return true;
        }
        let old = std::mem::replace(&mut self.entries[r].meta, Arc::new(meta));
        match RouteTable::build(&self.entries, &self.shared.config.naming.separator) {
            Ok(table) => {
                self.shared.table.store(Arc::new(table));
                if let Some(s) = self.status(r) {
                    s.swaps.fetch_add(1, Ordering::Relaxed);
                }
                tracing::info!(router = %name, "upstream listings changed: route table swapped");
                self.shared.notify_list_changed(kinds);
            }
            Err(e) => {
                self.entries[r].meta = old;
                tracing::error!(router = %name, error = %e, "upstream listings changed but the new route table was refused; keeping the old one");
            }
        }
        true
    }

    fn mark(&self, r: usize, unavailable: Option<String>) {
        let Some(s) = self.status(r) else { return };
        s.refreshes.fetch_add(1, Ordering::Relaxed);
        let was = s.available.swap(unavailable.is_none(), Ordering::Relaxed);
        if let Some(reason) = &unavailable {
            s.failures.fetch_add(1, Ordering::Relaxed);
            if was {
                tracing::warn!(router = %self.entries[r].name, %reason, "upstream unavailable; retrying with backoff");
            }
        } else if !was {
            tracing::info!(router = %self.entries[r].name, "upstream available again");
        }
        *s.reason.lock().unwrap_or_else(|e| e.into_inner()) = unavailable;
    }
}

/// Which of the listings the route table is built from differ between two
/// reads of a router.
fn changed(a: &RouterMeta, b: &RouterMeta) -> ListKinds {
    // The WIT types have no `PartialEq`; their Debug forms are a faithful,
    // cheap-enough comparison for a check that runs once per interval.
    let differ =
        |x: &dyn std::fmt::Debug, y: &dyn std::fmt::Debug| format!("{x:?}") != format!("{y:?}");
    ListKinds {
        tools: differ(&a.tools, &b.tools),
        resources: differ(&a.resources, &b.resources),
        prompts: differ(&a.prompts, &b.prompts),
    }
}
