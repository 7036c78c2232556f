//! The routing state in effect: the route table and, for each router it
//! names, what serves it. Swapped whole ([`Shared::routing`]) when a
//! reload changes the routers or an upstream's listings change; a request
//! reads it once and keeps that snapshot.
//!
//! # Invariants
//! - `table`'s router ids index `routers`.
//! - Every shard holds a pool for each `uid` of a published routing: pools
//!   are installed on every shard before the routing that names them is
//!   published, and dropped only after a routing without them is
//!   (`reload.rs`).
//! - A router's metrics slot follows its name, not its `uid`: a router
//!   replaced by a reload keeps counting where it counted.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crate::config::{Affinity, Config, RouterConfig};
use crate::metrics::Layout;
use crate::route::{RouteError, RouteTable, RouterEntry};
use crate::shared::Capabilities;
use crate::upstream::UpstreamStatus;
use crate::wasm::{PoolStats, Router, RouterMeta, RouterPool, RouterSpec, WasmHost};

/// One router of a routing.
#[derive(Debug, Clone)]
pub struct Routed {
    pub name: String,
    pub router: Arc<Router>,
    /// Which pool serves it on every shard: unique per loaded component,
    /// never reused.
    pub uid: usize,
    /// Its metrics router label.
    pub slot: usize,
    /// Its `other` and `none` latency labels.
    pub labels: (u32, u32),
    pub affinity: Affinity,
    /// Availability of its upstream (`upstream = URL` routers only).
    pub upstream: Option<Arc<UpstreamStatus>>,
}

/// The routing state: immutable once published.
#[derive(Debug)]
pub struct Routing {
    /// Configuration generation: 1 at start-up, +1 per applied reload.
    pub generation: u64,
    /// This table's own number, unique in the process (an upstream's new
    /// listing builds a new table in the same generation): listing cursors
    /// carry it, so that one handed out by another table is refused rather
    /// than read as an offset into listings that changed.
    pub listing: u64,
    pub table: RouteTable,
    /// By `RouterId`.
    pub routers: Vec<Routed>,
    pub capabilities: Capabilities,
    pub instructions: String,
    /// Exposed tool name → latency label.
    pub tool_labels: crate::route::Names<u32>,
}

/// Notes of a route table (names and URIs left out) logged each time one
/// is built; the rest are counted in one line.
const MAX_NOTES: usize = 20;

impl Routing {
    /// Builds the table from `entries` (one per router, same order as
    /// `routers`) and registers its tools' metrics labels.
    pub fn build(
        generation: u64,
        routers: Vec<Routed>,
        entries: &[RouterEntry],
        separator: &str,
        layout: &Layout,
    ) -> Result<Self, RouteError> {
        let table = RouteTable::build(entries, separator)?;
        // Once per table: at start-up, a reload, or a change of listings.
        // At most MAX_NOTES lines a table: an upstream listing a thousand
        // unfit names, renamed on every listing, wrote thousands a second.
        for note in table.shadowed.iter().take(MAX_NOTES) {
            // Escaped: a note names what a router (an upstream) listed.
            tracing::warn!("{}", crate::escaped::Escaped(note));
        }
        if table.shadowed.len() > MAX_NOTES {
            tracing::warn!(
                more = table.shadowed.len() - MAX_NOTES,
                "more names and URIs left out of the route table, as above"
            );
        }
        let mut capabilities = Capabilities::default();
        let mut instructions = Vec::new();
        for e in entries {
            if let Some(server) = &e.meta.server {
                capabilities.completions |= server
                    .capabilities
                    .completions
                    .as_ref()
                    .is_some_and(|c| c.enabled);
                capabilities.subscribe |= server
                    .capabilities
                    .resources
                    .as_ref()
                    .and_then(|r| r.subscribe)
                    .unwrap_or(false);
            }
            if !e.meta.instructions.is_empty() {
                instructions.push(format!("{}: {}", e.name, e.meta.instructions));
            }
        }
        let tool_labels = table
            .tool_list
            .iter()
            .map(|t| {
                let slot = routers[t.router as usize].slot;
                (t.exposed.clone(), layout.tool_label(slot, &t.exposed))
            })
            .collect();
        static LISTINGS: AtomicU64 = AtomicU64::new(1);
        Ok(Self {
            generation,
            listing: LISTINGS.fetch_add(1, Ordering::Relaxed),
            table,
            routers,
            capabilities,
            instructions: instructions.join("\n"),
            tool_labels,
        })
    }

    /// Whether any router fronts an upstream (whose listings may appear
    /// later).
    pub fn any_upstream(&self) -> bool {
        self.routers.iter().any(|r| r.upstream.is_some())
    }

    /// The routers' names, in order.
    pub fn names(&self) -> Vec<String> {
        self.routers.iter().map(|r| r.name.clone()).collect()
    }
}

static NEXT_UID: AtomicUsize = AtomicUsize::new(0);

/// A router compiled from its configuration, not yet published.
pub struct Loaded {
    pub routed: Routed,
    pub entry: RouterEntry,
    pub config: RouterConfig,
    pub spec: RouterSpec,
    /// Digest of its `.wasm` file when it was loaded: a reload recompiles
    /// a router whose file changed even when its configuration did not.
    pub digest: u64,
}

/// Digest of a component file (a change of content, not of mtime).
pub fn file_digest(path: &Path) -> std::io::Result<u64> {
    use std::hash::{Hash, Hasher};
    let bytes = std::fs::read(path)?;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    bytes.hash(&mut h);
    Ok(h.finish())
}

/// Compiles router `r` of `config` and reads its metadata. An upstream
/// router whose upstream does not answer is loaded (with no listings) and
/// retried by the refresher. Blocks (compilation): never on a shard.
pub fn load(host: &WasmHost, config: &Config, r: &RouterConfig) -> Result<Loaded, String> {
    let spec = config.router_spec(r);
    // The load error names the router and the file.
    let router = host.load(&spec).map_err(|e| e.to_string())?;
    let digest = file_digest(&spec.wasm).map_err(|e| {
        format!(
            "router `{}`: cannot read {}: {e}",
            r.name,
            spec.wasm.display()
        )
    })?;
    let mut meta = router.meta().clone();
    let mut upstream = None;
    if r.upstream.is_some() {
        let unavailable = meta.unavailable();
        if let Some(reason) = &unavailable {
            // Not fatal: it is retried with backoff (upstream.rs), and the
            // other routers serve meanwhile.
            // Escaped: the reason quotes the upstream's own text, which could
            // otherwise forge log lines (newlines, terminal escapes).
            tracing::warn!(router = %r.name, reason = %crate::escaped::Escaped(reason), "upstream unavailable at load; retrying with backoff");
            meta = Arc::new(RouterMeta {
                server: meta.server.clone(),
                unread: meta.unread.clone(),
                ..Default::default()
            });
        }
        let protocol = router.meta().upstream_protocol();
        upstream = Some(Arc::new(UpstreamStatus::new(
            router.clone(),
            unavailable,
            protocol,
        )));
    }
    Ok(Loaded {
        routed: Routed {
            name: r.name.clone(),
            router,
            uid: NEXT_UID.fetch_add(1, Ordering::Relaxed),
            slot: crate::metrics::series::BROKER,
            labels: (0, 0),
            affinity: r.affinity,
            upstream,
        },
        entry: RouterEntry {
            name: r.name.clone(),
            prefix: r.prefix.clone(),
            meta,
        },
        config: r.clone(),
        spec,
        digest,
    })
}

/// How many routers load, or upstream listings are read, at once. A load
/// compiles (CPU) and an upstream router's load and refresh wait on the
/// network, up to the router's `call_deadline`: one after another, a few
/// hung upstreams held start-up, every reload and every other upstream's
/// refresh for the sum of their deadlines.
pub const SIDE_BY_SIDE: usize = 8;

/// `f` on every item, at most [`SIDE_BY_SIDE`] at once on scoped threads
/// named `name`; the results in the items' order. One item runs here.
pub fn side_by_side<T: Send, R: Send>(
    items: Vec<T>,
    name: &str,
    f: impl Fn(T) -> R + Sync,
) -> Vec<R> {
    if items.len() <= 1 {
        return items.into_iter().map(f).collect();
    }
    let n = items.len();
    let queue = std::sync::Mutex::new(items.into_iter().enumerate());
    let done = std::sync::Mutex::new(Vec::with_capacity(n));
    std::thread::scope(|s| {
        for _ in 0..SIDE_BY_SIDE.min(n) {
            let work = || {
                loop {
                    let next = queue.lock().unwrap_or_else(|e| e.into_inner()).next();
                    let Some((i, item)) = next else { break };
                    let r = f(item);
                    done.lock().unwrap_or_else(|e| e.into_inner()).push((i, r));
                }
            };
            // Without a thread (none left to spawn), the items still run,
            // here once the others have taken theirs.
            if std::thread::Builder::new()
                .name(name.into())
                .spawn_scoped(s, work)
                .is_err()
            {
                work();
            }
        }
    });
    let mut done = done.into_inner().unwrap_or_else(|e| e.into_inner());
    done.sort_unstable_by_key(|(i, _)| *i);
    done.into_iter().map(|(_, r)| r).collect()
}

impl Loaded {
    /// Gives the router its metrics labels (by name: the slot it had if the
    /// process served that name before).
    pub fn assign_slot(&mut self, layout: &Layout) -> Result<(), String> {
        let name = &self.routed.name;
        let slot = layout.router_slot(name).ok_or_else(|| {
            format!(
                "router `{name}`: this process has already served {} router names, its metrics capacity; restart the broker to add more",
                layout.router_capacity - 1
            )
        })?;
        self.routed.slot = slot;
        self.routed.labels = layout.router_labels(slot);
        Ok(())
    }
}

/// A shard's router pools, by uid, and the retired ones still finishing
/// calls. Shard-local (`RefCell` in `ShardCtx`); borrowed only between
/// awaits.
#[derive(Debug, Default)]
pub struct ShardPools {
    /// By uid: the pool and its router's metrics slot.
    by_uid: Vec<Option<(RouterPool, usize)>>,
    /// Removed or replaced by a reload, with calls still running in them.
    retiring: Vec<(RouterPool, usize)>,
    /// Counters of dropped pools, by metrics slot, so that a router's
    /// counters never go back when its pool is replaced.
    retired: Vec<PoolStats>,
}

impl ShardPools {
    /// The pool serving router `uid`, if this shard has it.
    pub fn get(&self, uid: usize) -> Option<&RouterPool> {
        self.by_uid.get(uid)?.as_ref().map(|(p, _)| p)
    }

    pub fn insert(&mut self, uid: usize, slot: usize, pool: RouterPool) {
        if self.by_uid.len() <= uid {
            self.by_uid.resize_with(uid + 1, || None);
        }
        self.by_uid[uid] = Some((pool, slot));
    }

    /// Takes router `uid`'s pool out of service: calls already in it finish,
    /// and [`Self::sweep`] drops it after the last one.
    pub fn retire(&mut self, uid: usize) {
        if let Some(p) = self.by_uid.get_mut(uid).and_then(Option::take) {
            self.retiring.push(p);
        }
        self.sweep();
    }

    /// Drops retired pools that no call holds any more (their instances go
    /// back to the engine's pooling allocator).
    pub fn sweep(&mut self) {
        let retired = &mut self.retired;
        self.retiring.retain(|(pool, slot)| {
            if pool.in_use() {
                return true;
            }
            if retired.len() <= *slot {
                retired.resize(*slot + 1, PoolStats::default());
            }
            retired[*slot].add(&pool.stats().counters());
            tracing::debug!(router = %pool.router().spec().name, "retired router pool drained and dropped");
            false
        });
    }

    /// Pools serving, then pools retiring.
    pub fn iter(&self) -> impl Iterator<Item = &RouterPool> {
        self.by_uid
            .iter()
            .flatten()
            .chain(&self.retiring)
            .map(|(p, _)| p)
    }

    /// Retired pools still finishing calls.
    pub fn draining(&self) -> usize {
        self.retiring.len()
    }

    /// Pool state by metrics slot: serving and retiring pools, plus the
    /// counters of dropped ones.
    pub fn stats(&self) -> Vec<PoolStats> {
        let mut by_slot = self.retired.clone();
        for (pool, slot) in self.by_uid.iter().flatten().chain(&self.retiring) {
            if by_slot.len() <= *slot {
                by_slot.resize(*slot + 1, PoolStats::default());
            }
            by_slot[*slot].add(&pool.stats());
        }
        by_slot
    }
}
