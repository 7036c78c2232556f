//! Upstream routers' listings: re-read, rebuilt into a new route table, and
//! swapped whole (by the `routing` thread, `control.rs`).
//!
//! A router configured with `upstream = URL` runs the bundled `upstream`
//! component, whose tools, resources and prompts are its upstream's. They
//! change when the upstream changes, and they are unknown while it is
//! unreachable. One thread (`routing`, which also applies reloads) keeps them
//! current:
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
//! ([`Shared::routing`]); requests already running keep the table they
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
use std::time::Duration;

use crate::shared::ListKinds;
#[cfg(doc)]
use crate::shared::Shared;
use crate::wasm::{Router, RouterMeta};

/// Default `refresh_interval` of an upstream router.
pub const DEFAULT_REFRESH_INTERVAL: Duration = Duration::from_secs(60);
/// First retry after an upstream was found unavailable.
pub const FIRST_RETRY: Duration = Duration::from_secs(1);
/// Shortest time between two re-reads of one router that calls' hints ask
/// for: an upstream that announces changes on every call is re-read at
/// most this often.
pub const MIN_HINTED_GAP: Duration = Duration::from_millis(200);

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
    /// The MCP revision it speaks with its upstream, as it last said
    /// (`mcp_upstream_protocol_info`); kept while the upstream is away.
    pub protocol: Mutex<Option<String>>,
}

impl UpstreamStatus {
    /// A router just loaded; `unavailable`: why its upstream did not answer.
    /// `protocol`: the revision it said it speaks.
    pub fn new(router: Arc<Router>, unavailable: Option<String>, protocol: Option<String>) -> Self {
        Self {
            router,
            available: AtomicBool::new(unavailable.is_none()),
            reason: Mutex::new(unavailable),
            refreshes: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            swaps: AtomicU64::new(0),
            protocol: Mutex::new(protocol),
        }
    }

    /// Records the revision a re-read found (none: the upstream did not
    /// say, so the last one stays); logs a change of it.
    pub fn set_protocol(&self, name: &str, protocol: Option<String>) {
        let Some(protocol) = protocol else { return };
        let mut held = self.protocol.lock().unwrap_or_else(|e| e.into_inner());
        if held.as_deref() != Some(protocol.as_str()) {
            if let Some(was) = held.as_deref() {
                tracing::info!(router = %name, %was, now = %protocol, "upstream protocol changed");
            }
            *held = Some(protocol);
        }
    }

    /// The revision it speaks, as last said.
    pub fn protocol(&self) -> Option<String> {
        self.protocol
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Records a re-read's result; logs a change of availability.
    pub fn mark(&self, name: &str, unavailable: Option<String>) {
        self.refreshes.fetch_add(1, Ordering::Relaxed);
        let was = self
            .available
            .swap(unavailable.is_none(), Ordering::Relaxed);
        if let Some(reason) = &unavailable {
            self.failures.fetch_add(1, Ordering::Relaxed);
            if was {
                // Escaped: the reason quotes the upstream's own text, which could
                // otherwise forge log lines (newlines, terminal escapes).
                tracing::warn!(router = %name, reason = %crate::escaped::Escaped(reason), "upstream unavailable; retrying with backoff");
            }
        } else if !was {
            tracing::info!(router = %name, "upstream available again");
        }
        *self.reason.lock().unwrap_or_else(|e| e.into_inner()) = unavailable;
    }
}

/// The counters of `mcp_upstream_*_total`, in the order they are exposed:
/// refreshes, refresh failures, table swaps, denied, cancels.
pub type UpstreamCounts = [u64; 5];

impl UpstreamStatus {
    /// Its counters now.
    pub fn counts(&self) -> UpstreamCounts {
        [
            self.refreshes.load(Ordering::Relaxed),
            self.failures.load(Ordering::Relaxed),
            self.swaps.load(Ordering::Relaxed),
            self.router.outbound_denied(),
            self.router.outbound_cancels(),
        ]
    }
}

/// The counters of upstream routers that reloads took out of the routing
/// (replaced, or removed), by metrics slot: `mcp_upstream_*_total` adds
/// them to the serving router's, so that, like the pools' counters
/// (`ShardPools::retired`) and the request series, they follow the name and
/// never go back over a reload. Only the `routing` thread adds to it, in
/// the same critical section as it publishes the routing that drops them,
/// and `/metrics` reads it with the routing under that lock: a scrape sees
/// a router's counts either in the routing or here, never both or neither.
#[derive(Debug, Default)]
pub struct Retired {
    by_slot: Vec<RetiredSlot>,
}

#[derive(Debug, Default)]
struct RetiredSlot {
    /// Refreshes, failures and swaps are final once out of the routing
    /// (only the `routing` thread re-reads, and only routers it serves);
    /// denied and cancels of dropped routers are here too.
    settled: UpstreamCounts,
    /// Outbound counters of taken-out routers that may still count: calls
    /// they finish after the reload (a cancel, a refused request). Kept
    /// apart from the router (its compiled component and connections go
    /// when its last call does), and settled once nothing else holds them.
    live: Vec<Arc<crate::wasm::OutboundCounters>>,
}

impl Retired {
    /// Adds the counters of `status`, taken out of the routing, to `slot`.
    pub fn add(&mut self, slot: usize, status: &UpstreamStatus) {
        if self.by_slot.len() <= slot {
            self.by_slot.resize_with(slot + 1, RetiredSlot::default);
        }
        let s = &mut self.by_slot[slot];
        let [refreshes, failures, swaps, ..] = status.counts();
        s.settled[0] += refreshes;
        s.settled[1] += failures;
        s.settled[2] += swaps;
        if let Some(c) = status.router.outbound_counters() {
            s.live.push(c);
        }
        // Bounded by the routers still finishing calls, not by reloads.
        s.live.retain(|c| {
            if Arc::strong_count(c) > 1 {
                return true;
            }
            s.settled[3] += c.denied.load(Ordering::Relaxed);
            s.settled[4] += c.cancels.load(Ordering::Relaxed);
            false
        });
    }

    /// What router slot `slot` counted before the router serving it now.
    pub fn counts(&self, slot: usize) -> UpstreamCounts {
        let Some(s) = self.by_slot.get(slot) else {
            return [0; 5];
        };
        let mut n = s.settled;
        for c in &s.live {
            n[3] += c.denied.load(Ordering::Relaxed);
            n[4] += c.cancels.load(Ordering::Relaxed);
        }
        n
    }
}

/// Which of the listings the route table is built from differ between two
/// reads of a router.
pub fn changed(a: &RouterMeta, b: &RouterMeta) -> ListKinds {
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
