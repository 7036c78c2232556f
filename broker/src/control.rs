//! The `routing` thread: the one writer of [`Shared::routing`]. It applies
//! configuration reloads (SIGHUP, `POST /admin/reload`) and keeps upstream
//! routers' listings current (`upstream.rs`), one change at a time, so that
//! a reload and a refresh never build tables from different router sets.
//!
//! # A reload
//! 1. Re-read the config file (with the command line's overrides) and
//!    validate it. Only `[[routers]]`, `[naming]` and `broker.routers_dir`
//!    may differ from the running configuration, and each edge's `listen`
//!    (new listeners are bound before anything changes; new connections go
//!    to them, established ones stay). Limits and the rest are read at
//!    start-up, and a reload that changes them is refused naming each
//!    section, so that what runs is always what the file says.
//! 2. Compile each router that is new or changed (its entry, its resolved
//!    spec or its `.wasm` content differs); the others are kept as they
//!    are, with their instances and sessions.
//! 3. Build the new route table.
//! 4. Install the new routers' pools on every shard and wait until each has
//!    warmed them (instantiated its `instances_per_shard`).
//! 5. Publish the new routing, tell listening clients what changed
//!    (`list_changed` on every edge), and retire the pools of removed and
//!    replaced routers: each shard drops one once its last call finished.
//!
//! A reload also loads `[tls]`'s certificate and key files again (new
//! connections use them; established ones keep theirs), and between
//! reloads this thread watches those files for changes
//! ([`crate::tls::ServerTls::watch`]).
//!
//! Any failure in 1–4 refuses the whole reload with every error found; the
//! running routing is untouched (pools installed on some shards are
//! dropped again).

use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;

use crate::config::{Config, Overrides};
use crate::route::RouteTable;
use crate::routing::{Loaded, Routing};
use crate::shared::{AddPools, ListKinds, ShardMsg, Shared};
use crate::upstream::{DEFAULT_REFRESH_INTERVAL, FIRST_RETRY, MIN_HINTED_GAP};
use crate::wasm::{MetaReader, WasmHost};

/// How long a reload waits for every shard to warm the new routers' pools.
pub const INSTALL_TIMEOUT: Duration = Duration::from_secs(60);

/// What a reload did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReloadOutcome {
    Applied {
        generation: u64,
        added: Vec<String>,
        changed: Vec<String>,
        removed: Vec<String>,
        unchanged: Vec<String>,
        /// Where each edge listens after the reload.
        listen: Option<crate::shared::Addrs>,
    },
    Refused {
        generation: u64,
        errors: Vec<String>,
    },
}

impl ReloadOutcome {
    pub fn is_applied(&self) -> bool {
        matches!(self, Self::Applied { .. })
    }

    /// The admin endpoint's answer body.
    pub fn to_json(&self) -> String {
        let v = match self {
            Self::Applied {
                generation,
                added,
                changed,
                removed,
                unchanged,
                listen,
            } => serde_json::json!({
                "status": "applied",
                "generation": generation,
                "added": added,
                "changed": changed,
                "removed": removed,
                "unchanged": unchanged,
                "listen": listen.map(|a| serde_json::json!({
                    "frames": a.frames.to_string(),
                    "grpc": a.grpc.to_string(),
                    "http": a.http.to_string(),
                    "metrics": a.metrics.to_string(),
                })),
            }),
            Self::Refused { generation, errors } => serde_json::json!({
                "status": "refused",
                "generation": generation,
                "errors": errors,
            }),
        };
        v.to_string()
    }
}

/// A reload asked for; the outcome goes to `reply` when there is one.
pub struct ReloadRequest {
    pub reply: Option<Sender<ReloadOutcome>>,
}

/// Where the configuration comes from, for reloads.
#[derive(Debug, Clone)]
pub struct Source {
    /// `None`: the embedded default.
    pub path: Option<PathBuf>,
    pub overrides: Overrides,
}

/// One router of the running routing, as this thread tracks it.
struct Current {
    loaded: Loaded,
    /// Upstream routers: their refresh interval.
    interval: Option<Duration>,
    /// Upstream routers: one metadata instance kept between reads (made on
    /// first use).
    reader: Option<MetaReader>,
    /// Upstream routers: when next due, and the backoff after the next
    /// failure.
    due: Option<(Instant, Duration)>,
    last_read: Option<Instant>,
}

impl Current {
    fn new(loaded: Loaded, now: Instant) -> Self {
        let interval = loaded.config.upstream.as_ref().map(|_| {
            loaded
                .config
                .refresh_interval
                .unwrap_or(DEFAULT_REFRESH_INTERVAL)
        });
        let due = interval.map(|iv| {
            let available = loaded
                .routed
                .upstream
                .as_ref()
                .is_some_and(|s| s.available.load(Ordering::Relaxed));
            if available {
                (now + iv, FIRST_RETRY)
            } else {
                (now + FIRST_RETRY, (FIRST_RETRY * 2).min(iv))
            }
        });
        Self {
            loaded,
            interval,
            reader: None,
            due,
            last_read: None,
        }
    }
}

/// The routing thread's state.
pub struct Control {
    pub shared: Arc<Shared>,
    /// Compiles the routers a reload brings (the process's one engine).
    pub host: Arc<WasmHost>,
    pub source: Source,
    /// The configuration in effect.
    pub config: Config,
    /// The routers of the published routing, in its order.
    current: Vec<Current>,
}

impl Control {
    pub fn new(
        shared: Arc<Shared>,
        host: Arc<WasmHost>,
        source: Source,
        config: Config,
        loaded: Vec<Loaded>,
    ) -> Self {
        let now = Instant::now();
        Self {
            shared,
            host,
            source,
            config,
            current: loaded.into_iter().map(|l| Current::new(l, now)).collect(),
        }
    }

    /// Starts the `routing` thread; it runs until the broker drains.
    pub fn spawn(self) -> std::io::Result<()> {
        std::thread::Builder::new()
            .name("routing".into())
            .spawn(move || self.run())
            .map(drop)
    }

    fn run(mut self) {
        let kicks = self.shared.kicks().clone();
        let reloads = self.shared.reloads().clone();
        loop {
            // This thread is the only one that reloads, refreshes upstream
            // listings and watches the certificate files: a bug that
            // panicked in one of them must not take the others with it, nor
            // leave later reloads queued for a thread that is gone. A
            // reload's own panic is answered as refused (`reload_guarded`).
            match std::panic::catch_unwind(AssertUnwindSafe(|| self.turn(&kicks, &reloads))) {
                Ok(true) => {}
                Ok(false) => return,
                Err(p) => {
                    tracing::error!(
                        "the routing thread caught a panic and goes on: {}",
                        crate::shard::Panicked::from(p).0
                    );
                    // A panic that recurs every turn logs once a second.
                    std::thread::sleep(Duration::from_secs(1));
                }
            }
        }
    }

    /// One turn of [`Self::run`]: `false` once the broker drains.
    fn turn(
        &mut self,
        kicks: &crossbeam_channel::Receiver<usize>,
        reloads: &crossbeam_channel::Receiver<ReloadRequest>,
    ) -> bool {
        if self.shared.is_draining() {
            // Answer reloads asked for meanwhile rather than leave their
            // askers waiting.
            while let Ok(req) = reloads.try_recv() {
                self.answer(req, self.refused(vec!["the broker is draining".into()]));
            }
            return false;
        }
        let next = self.current.iter().filter_map(|c| c.due).map(|d| d.0).min();
        // At most 1 s, so a drain is noticed.
        let wait = next
            .map_or(Duration::from_secs(1), |t| {
                t.saturating_duration_since(Instant::now())
            })
            .min(Duration::from_secs(1));
        crossbeam_channel::select! {
            recv(kicks) -> uid => {
                if let Ok(uid) = uid {
                    self.hint(uid);
                }
            }
            recv(reloads) -> req => {
                if let Ok(req) = req {
                    // A drain that began while the request was queued
                    // wins: nothing changes under a draining broker.
                    let outcome = if self.shared.is_draining() {
                        self.refused(vec!["the broker is draining".into()])
                    } else {
                        self.reload_guarded()
                    };
                    self.answer(req, outcome);
                }
            }
            default(wait) => {}
        }
        self.refresh_due();
        if let Some(tls) = &self.shared.tls {
            tls.watch();
        }
        true
    }

    /// [`Self::reload`], with a panic in it (a bug) answered as a refused
    /// reload that says so, counted and logged like any other refusal.
    fn reload_guarded(&mut self) -> ReloadOutcome {
        match std::panic::catch_unwind(AssertUnwindSafe(|| self.reload())) {
            Ok(outcome) => outcome,
            Err(p) => self.refused(vec![format!(
                "the reload failed on an internal error (a panic: {}); the configuration \
                 that was running is kept, as far as the reload had not yet changed it",
                crate::shard::Panicked::from(p).0
            )]),
        }
    }

    fn answer(&self, req: ReloadRequest, outcome: ReloadOutcome) {
        match &outcome {
            ReloadOutcome::Applied {
                generation,
                added,
                changed,
                removed,
                ..
            } => {
                self.shared.reloads_applied.fetch_add(1, Ordering::Relaxed);
                tracing::info!(generation, ?added, ?changed, ?removed, "reload applied");
            }
            ReloadOutcome::Refused { errors, .. } => {
                self.shared.reloads_refused.fetch_add(1, Ordering::Relaxed);
                // One record (journald and log shippers split lines),
                // each reason quoted and escaped.
                tracing::error!(?errors, "reload refused; the running configuration is kept");
            }
        }
        if let Some(reply) = req.reply {
            let _ = reply.send(outcome);
        }
    }

    fn generation(&self) -> u64 {
        self.shared.routing.load().generation
    }

    fn refused(&self, errors: Vec<String>) -> ReloadOutcome {
        ReloadOutcome::Refused {
            generation: self.generation(),
            errors,
        }
    }

    /// Reads the config file and applies what changed (module doc).
    fn reload(&mut self) -> ReloadOutcome {
        let config = match Config::load(self.source.path.as_deref(), &self.source.overrides) {
            Ok(c) => c,
            Err(e) => {
                // The configuration's checks read the certificate files: files
                // that cannot be used refuse the reload there, and count as a
                // failed certificate reload, as the file watcher's do (or
                // `McpTlsReloadFailed` never fired on SIGHUP's path).
                let tls_files = |m: &String| {
                    m.starts_with(crate::config::TLS_FILE_ERROR)
                        || m.contains(&format!(": {}", crate::config::TLS_FILE_ERROR))
                };
                if let Some(t) = &self.shared.tls
                    && e.0.iter().any(tls_files)
                {
                    t.reload_failed();
                }
                return self.refused(e.0);
            }
        };
        // Every error is reported: the sections that need a restart, the
        // listeners that cannot be bound, and each router that does not
        // compile. A check does not wait for an earlier one to pass, so
        // that one refusal names everything the operator must mend.
        let mut errors = restart_only_changes(&self.config, &config);
        let moves = {
            let running = *self.shared.addrs.lock().unwrap_or_else(|e| e.into_inner());
            match Moves::bind(
                &self.config,
                &config,
                running.as_ref(),
                self.shared.shards(),
            ) {
                Ok(m) => m,
                Err(e) => {
                    errors.extend(e);
                    Moves::default()
                }
            }
        };
        // The certificate files are read again on every reload (SIGHUP is
        // how certificate tools ask for it), and put in effect with the
        // rest.
        let tls = match (&self.shared.tls, &config.tls) {
            (Some(_), Some(section)) => match crate::tls::ServerTls::prepare(section) {
                Ok(p) => Some(p),
                Err(e) => {
                    if let Some(t) = &self.shared.tls {
                        t.reload_failed();
                    }
                    errors.extend(
                        e.into_iter()
                            .map(|e| format!("{}{e}", crate::config::TLS_FILE_ERROR)),
                    );
                    None
                }
            },
            _ => None,
        };

        // Keep, or compile anew: which, first.
        let (mut added, mut changed, mut unchanged) = (Vec::new(), Vec::new(), Vec::new());
        let kept: Vec<Option<usize>> = config
            .routers
            .iter()
            .map(|r| {
                let old = self
                    .current
                    .iter()
                    .position(|c| c.loaded.routed.name == r.name);
                let Some(i) = old else {
                    added.push(r.name.clone());
                    return None;
                };
                let cur = &self.current[i].loaded;
                let spec = config.router_spec(r);
                let same_file = crate::routing::file_digest(&spec.wasm).ok() == Some(cur.digest);
                if cur.config == *r && cur.spec == spec && same_file {
                    unchanged.push(r.name.clone());
                    Some(i)
                } else {
                    changed.push(r.name.clone());
                    None
                }
            })
            .collect();
        let removed: Vec<String> = self
            .current
            .iter()
            .map(|c| c.loaded.routed.name.clone())
            .filter(|n| !config.routers.iter().any(|r| &r.name == n))
            .collect();
        // Without enough pooled instance slots the new routers cannot be
        // instantiated, so nothing is compiled. Otherwise they are, even
        // when the reload is already refused: seconds of this thread, for
        // a refusal that lists each component that would not load too.
        if let Some(short) = self.slots_short(&config, &changed, &removed) {
            errors.push(short);
            return self.refused(errors);
        }
        // Names this reload registers (router slots, tool labels) are
        // taken back if it is refused before its routers run.
        let layout = &self.shared.layout;
        let mark = layout.registered();
        let mut next: Vec<Result<Loaded, usize>> = Vec::with_capacity(config.routers.len());
        let fresh: Vec<_> = config
            .routers
            .iter()
            .zip(&kept)
            .filter(|(_, k)| k.is_none())
            .map(|(r, _)| r)
            .collect();
        let host = &self.host;
        let mut loads = crate::routing::side_by_side(fresh, "router-load", |r| {
            crate::routing::load(host, &config, r)
        })
        .into_iter();
        for kept in kept {
            if let Some(i) = kept {
                next.push(Err(i));
                continue;
            }
            match loads.next().expect("one load per router not kept") {
                Ok(_) if !errors.is_empty() => {}
                Ok(mut l) => match l.assign_slot(&self.shared.layout) {
                    Ok(()) => next.push(Ok(l)),
                    Err(e) => errors.push(e),
                },
                Err(e) => errors.push(e),
            }
        }
        if !errors.is_empty() {
            layout.forget_since(mark);
            return self.refused(errors);
        }

        // The new table, from the kept routers' current listings.
        let routed: Vec<_> = next
            .iter()
            .map(|n| match n {
                Ok(l) => l.routed.clone(),
                Err(i) => self.current[*i].loaded.routed.clone(),
            })
            .collect();
        let entries: Vec<_> = next
            .iter()
            .map(|n| match n {
                Ok(l) => l.entry.clone(),
                Err(i) => self.current[*i].loaded.entry.clone(),
            })
            .collect();
        let old = self.shared.routing.load_full();
        let routing = match Routing::build(
            old.generation + 1,
            routed,
            &entries,
            &config.naming.separator,
            &self.shared.layout,
        ) {
            Ok(r) => r,
            Err(e) => {
                self.shared.layout.forget_since(mark);
                return self.refused(vec![format!("route table: {e}")]);
            }
        };

        // Every shard warms the new pools before anything routes to them.
        let fresh: Vec<_> = next
            .iter()
            .filter_map(|n| n.as_ref().ok())
            .map(|l| (l.routed.uid, l.routed.slot, l.routed.router.clone()))
            .collect();
        if let Err(errors) = self.install(&fresh) {
            self.retire(fresh.iter().map(|f| f.0).collect());
            return self.refused(errors);
        }

        let kinds = table_changes(&old.table, &routing.table);
        let kept: std::collections::HashSet<usize> =
            routing.routers.iter().map(|r| r.uid).collect();
        let dropped: Vec<usize> = old
            .routers
            .iter()
            .map(|r| r.uid)
            .filter(|u| !kept.contains(u))
            .collect();
        let generation = routing.generation;
        {
            // The upstream counters of the routers it drops move to their
            // name's retired counts as it is published, under the lock
            // `/metrics` reads both with: they never go back (or count
            // twice) in a scrape, even one that races the reload.
            let mut retired = self
                .shared
                .upstream_retired
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            for r in old.routers.iter().filter(|r| dropped.contains(&r.uid)) {
                if let Some(status) = &r.upstream {
                    retired.add(r.slot, status);
                }
            }
            self.shared.routing.store(Arc::new(routing));
        }
        if kinds != ListKinds::default() {
            self.shared.notify_list_changed(kinds);
        }
        self.retire(dropped);
        moves.hand_over(&self.shared);
        if let (Some(server), Some(section), Some(loaded)) = (&self.shared.tls, &config.tls, tls) {
            server.install(section, loaded);
        }

        // Track the new set: kept routers keep their refresh state.
        let now = Instant::now();
        let mut old_current: Vec<Option<Current>> = std::mem::take(&mut self.current)
            .into_iter()
            .map(Some)
            .collect();
        self.current = next
            .into_iter()
            .map(|n| match n {
                Ok(l) => Current::new(l, now),
                Err(i) => old_current[i].take().expect("each kept router once"),
            })
            .collect();
        self.config = config;
        ReloadOutcome::Applied {
            generation,
            added,
            changed,
            removed,
            unchanged,
            listen: self.shared.addrs(),
        }
    }

    /// Why `config` cannot run in the pooled instance slots reserved at
    /// start-up, if it cannot: its routers' slots, plus those of the
    /// changed and removed routers, whose pools drain beside the new ones.
    /// (Pools an earlier reload retired and that still finish calls are not
    /// counted: they hold their instances only while those calls run.)
    /// Checked before anything is built: a session-affine router's slots
    /// are taken only as sessions open, so warming the new pools alone
    /// could succeed and leave new sessions failing to instantiate later.
    fn slots_short(
        &self,
        config: &Config,
        changed: &[String],
        removed: &[String],
    ) -> Option<String> {
        let shards = self.shared.shards();
        let new: usize = config
            .routers
            .iter()
            .map(|r| r.instance_slots(shards))
            .sum();
        let draining: usize = self
            .config
            .routers
            .iter()
            .filter(|r| changed.contains(&r.name) || removed.contains(&r.name))
            .map(|r| r.instance_slots(shards))
            .sum();
        let have = self.host.max_instances() as usize;
        (new.saturating_add(draining) > have).then(|| {
            format!(
                "the routers need {new} pooled instance slots on {shards} shards (instances_per_shard, \
                 plus max_sessions_per_shard for session-affine ones, plus 2 each), and the changed \
                 and removed routers keep {draining} while they drain: {} in all, more than the \
                 {have} reserved at start-up (twice the starting configuration's need); restart the \
                 broker to apply it",
                new + draining
            )
        })
    }

    /// Installs pools of `fresh` routers on every shard, waiting for each to
    /// warm them.
    fn install(
        &self,
        fresh: &[(usize, usize, Arc<crate::wasm::Router>)],
    ) -> Result<(), Vec<String>> {
        if fresh.is_empty() {
            return Ok(());
        }
        let shards = self.shared.shards();
        let (tx, rx) = crossbeam_channel::bounded(shards);
        let mut asked = 0;
        let mut errors = Vec::new();
        for shard in 0..shards {
            let msg = ShardMsg::AddPools(AddPools {
                pools: fresh.to_vec(),
                reply: tx.clone(),
            });
            match self.shared.send(shard, msg) {
                Ok(()) => asked += 1,
                Err(e) => errors.push(format!("installing the new routers: {e}")),
            }
        }
        let deadline = Instant::now() + INSTALL_TIMEOUT;
        for _ in 0..asked {
            match rx.recv_deadline(deadline) {
                Ok(Ok(())) => {}
                Ok(Err(e)) => errors.push(e),
                Err(_) => {
                    errors.push(format!(
                        "the shards did not warm the new routers within {INSTALL_TIMEOUT:?}"
                    ));
                    break;
                }
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors)
        }
    }

    /// Tells every shard to drop the pools of `uids` once their calls end.
    fn retire(&self, uids: Vec<usize>) {
        if uids.is_empty() {
            return;
        }
        for shard in 0..self.shared.shards() {
            let _ = self.shared.send(shard, ShardMsg::DropPools(uids.clone()));
        }
    }

    /// A call's answer said router `uid`'s upstream announced a change:
    /// re-read it soon, but not more often than the gap.
    fn hint(&mut self, uid: usize) {
        let now = Instant::now();
        if let Some(c) = self.current.iter_mut().find(|c| c.loaded.routed.uid == uid)
            && let Some((t, _)) = c.due.as_mut()
        {
            let earliest = c.last_read.map_or(now, |l| l + MIN_HINTED_GAP);
            *t = (*t).min(earliest.max(now));
        }
    }

    fn refresh_due(&mut self) {
        let now = Instant::now();
        let due: Vec<_> = self
            .current
            .iter_mut()
            .enumerate()
            .filter(|(_, c)| c.due.is_some_and(|(t, _)| t <= now))
            .collect();
        // Read side by side: each read waits on its upstream, and a hung
        // one must not hold the others' refresh up.
        let reads = crate::routing::side_by_side(due, "upstream-read", |(i, c)| {
            if c.loaded.routed.upstream.is_none() {
                return (i, None);
            }
            let routed = &c.loaded.routed;
            let reader = c.reader.get_or_insert_with(|| routed.router.meta_reader());
            (i, Some(reader.read()))
        });
        for (i, read) in reads {
            let Some((_, backoff)) = self.current[i].due else {
                continue;
            };
            self.current[i].last_read = Some(now);
            let ok = self.refresh(i, read);
            // `backoff` is the wait after the next failure: it doubles up to
            // the interval, and a success resets it.
            let iv = self.current[i].interval.unwrap_or(DEFAULT_REFRESH_INTERVAL);
            let (wait, next) = if ok {
                (iv, FIRST_RETRY)
            } else {
                (backoff, (backoff * 2).min(iv))
            };
            self.current[i].due = Some((Instant::now() + wait, next));
        }
    }

    /// Takes upstream router `i`'s fresh `read` of its listings; publishes
    /// a new table if they changed. `false` when the upstream is
    /// unavailable.
    fn refresh(
        &mut self,
        i: usize,
        read: Option<Result<crate::wasm::RouterMeta, crate::wasm::CallError>>,
    ) -> bool {
        let cur = &mut self.current[i];
        let name = cur.loaded.routed.name.clone();
        let (Some(status), Some(read)) = (cur.loaded.routed.upstream.clone(), read) else {
            return true;
        };
        let meta = match read {
            Ok(m) => m,
            Err(e) => {
                status.mark(&name, Some(format!("reading its listings failed: {e}")));
                return false;
            }
        };
        if let Some(reason) = meta.unavailable() {
            status.mark(&name, Some(reason));
            return false;
        }
        status.set_protocol(&name, meta.upstream_protocol());
        let kinds = crate::upstream::changed(&cur.loaded.entry.meta, &meta);
        if kinds == ListKinds::default() {
            status.mark(&name, None);
            return true;
        }
        let old_meta = std::mem::replace(&mut cur.loaded.entry.meta, Arc::new(meta));
        let old = self.shared.routing.load_full();
        let entries: Vec<_> = self
            .current
            .iter()
            .map(|c| c.loaded.entry.clone())
            .collect();
        match Routing::build(
            old.generation,
            old.routers.clone(),
            &entries,
            &self.config.naming.separator,
            &self.shared.layout,
        ) {
            Ok(routing) => {
                self.shared.routing.store(Arc::new(routing));
                status.mark(&name, None);
                status.swaps.fetch_add(1, Ordering::Relaxed);
                tracing::info!(router = %name, "upstream listings changed: route table swapped");
                self.shared.notify_list_changed(kinds);
            }
            Err(e) => {
                self.current[i].loaded.entry.meta = old_meta;
                tracing::error!(router = %name, error = %crate::escaped::Escaped(&e.to_string()), "upstream listings changed but the new route table was refused; keeping the old one");
                // Shown on /readyz and in mcp_upstream_available, and
                // retried with backoff: the upstream may mend its listing.
                status.mark(
                    &name,
                    Some(format!(
                        "its new listing was refused (the one before still serves): {e}"
                    )),
                );
                return false;
            }
        }
        true
    }
}

/// Errors for every section a reload may not change, each naming the keys
/// that changed.
fn restart_only_changes(old: &Config, new: &Config) -> Vec<String> {
    let mut errors = Vec::new();
    let mut restart = |section: &str, old: &dyn std::fmt::Debug, new: &dyn std::fmt::Debug| {
        let keys = changed_fields(&format!("{old:#?}"), &format!("{new:#?}"));
        if !keys.is_empty() {
            let keys: Vec<String> = keys.iter().map(|k| format!("{section}.{k}")).collect();
            errors.push(format!(
                "[{section}] changed ({}): it is read only at start-up; restart the broker to apply it (a reload applies [[routers]], [naming], broker.routers_dir, each edge's listen and [tls])",
                keys.join(", ")
            ));
        }
    };
    let mut broker = new.broker.clone();
    broker.routers_dir = old.broker.routers_dir.clone();
    restart("broker", &old.broker, &broker);
    // The listeners may move (`Moves`); the rest of each section may not.
    let mut frames = new.frames.clone();
    frames.listen = old.frames.listen;
    restart("frames", &old.frames, &frames);
    let mut grpc = new.grpc.clone();
    grpc.listen = old.grpc.listen;
    restart("grpc", &old.grpc, &grpc);
    let mut http = new.http.clone();
    http.listen = old.http.listen;
    restart("http", &old.http, &http);
    let mut metrics = new.metrics.clone();
    metrics.listen = old.metrics.listen;
    restart("metrics", &old.metrics, &metrics);
    restart("bench", &old.bench, &new.bench);
    restart("auth", &old.auth, &new.auth);
    // The files (and the other keys) of [tls] reload; serving TLS or
    // plaintext is decided at start-up.
    if new.tls.is_some() != old.tls.is_some() {
        errors.push(
            "[tls] added or removed: whether the edges serve TLS is decided at start-up; restart the broker to apply it (a reload loads [tls]'s files again)"
                .into(),
        );
    }
    errors
}

/// The top-level fields whose values differ between two pretty `Debug`
/// renderings of one type (`{:#?}`: a field per line at four spaces, its
/// value's own lines deeper), in order; for an `Option` that is `None` on
/// one side, or any other shape, `*` when they differ at all. The config
/// types derive `Debug` and `PartialEq` only: this names the keys without
/// a second, hand-kept list of them.
fn changed_fields(old: &str, new: &str) -> Vec<String> {
    fn fields(text: &str) -> Vec<(&str, String)> {
        let mut out: Vec<(&str, String)> = Vec::new();
        for line in text.lines() {
            let top = line
                .strip_prefix("    ")
                .filter(|l| !l.starts_with(' '))
                .and_then(|l| l.split_once(": "));
            match (top, out.last_mut()) {
                (Some((name, value)), _) => out.push((name, value.to_owned())),
                (None, Some((_, value))) => {
                    value.push('\n');
                    value.push_str(line);
                }
                (None, None) => {}
            }
        }
        out
    }
    if old == new {
        return Vec::new();
    }
    let (a, b) = (fields(old), fields(new));
    let names: Vec<&str> = a.iter().map(|(n, _)| *n).collect();
    if a.is_empty() || names != b.iter().map(|(n, _)| *n).collect::<Vec<_>>() {
        return vec!["*".into()];
    }
    a.iter()
        .zip(&b)
        .filter(|((_, x), (_, y))| x != y)
        .map(|((n, _), _)| (*n).to_owned())
        .collect()
}

/// New listeners a reload binds before it changes anything, for the edges
/// whose `listen` changed: the frame, HTTP and gRPC edges get one per shard
/// (`SO_REUSEPORT`, as at start-up).
#[derive(Default)]
struct Moves {
    frames: Vec<std::net::TcpListener>,
    http: Vec<std::net::TcpListener>,
    grpc: Vec<std::net::TcpListener>,
    metrics: Option<std::net::TcpListener>,
}

impl Moves {
    /// Binds the listeners of every edge whose address changed; an error
    /// names the edge and the address.
    /// `running`: the addresses the edges are bound to now (a port 0 of the
    /// configuration resolved): a moved edge may not take another's, which
    /// its SO_REUSEPORT listeners could bind, and then share its connections
    /// (the new configuration's own addresses were checked apart by
    /// `Config::validate`).
    fn bind(
        old: &Config,
        new: &Config,
        running: Option<&crate::shared::Addrs>,
        shards: usize,
    ) -> Result<Self, Vec<String>> {
        let mut m = Moves::default();
        let mut errors = Vec::new();
        if let Some(r) = running {
            let now = [
                ("frames", r.frames),
                ("grpc", r.grpc),
                ("http", r.http),
                ("metrics", r.metrics),
            ];
            for ((key, to), (_, was)) in new.listeners().into_iter().zip(old.listeners()) {
                if to == was {
                    continue;
                }
                for (edge, at) in now {
                    if !key.starts_with(edge) && crate::config::addrs_overlap(to, at) {
                        errors.push(format!(
                            "{key}: {to} is the {edge} edge's address (each edge needs its own port)"
                        ));
                    }
                }
            }
            if !errors.is_empty() {
                return Err(errors);
            }
        }
        // An edge moving onto an address its own listeners overlap binds
        // beside them; any other move claims its port first, so that a
        // port another process listens on is refused.
        let per_shard = |addr: std::net::SocketAddr, own: Option<std::net::SocketAddr>| {
            if let Some(own) = own.filter(|&own| crate::config::addrs_overlap(addr, own)) {
                // Widening onto the own port (127.0.0.1:P to 0.0.0.0:P)
                // cannot be claimed (the own listeners hold the port), and
                // joining beside them would join another process's
                // listeners on the wider address, which then split the
                // clients between the two.
                if crate::config::widens(own, addr) {
                    return Err(std::io::Error::other(format!(
                        "moving from {own} to the wider {addr} on the same port cannot be told \
                         apart from joining another process's listeners there: restart the \
                         broker to apply it, or move to another port"
                    )));
                }
                return crate::server::bind_per_shard_beside_own(addr, shards);
            }
            // An edge moved away keeps its old listeners for LISTENER_LINGER,
            // so a reload that moves it back at once finds its own port
            // busy: wait that out before calling the port another's.
            let until =
                Instant::now() + crate::shared::LISTENER_LINGER + Duration::from_millis(500);
            loop {
                match crate::server::bind_per_shard(addr, shards) {
                    Err(e)
                        if e.kind() == std::io::ErrorKind::AddrInUse && Instant::now() < until =>
                    {
                        std::thread::sleep(Duration::from_millis(50));
                    }
                    r => return r,
                }
            }
        };
        if new.frames.listen != old.frames.listen {
            match per_shard(new.frames.listen, running.map(|r| r.frames)) {
                Ok(l) => m.frames = l,
                Err(e) => errors.push(format!(
                    "[frames] listen: cannot bind {}: {e}",
                    new.frames.listen
                )),
            }
        }
        if new.http.listen != old.http.listen {
            match per_shard(new.http.listen, running.map(|r| r.http)) {
                Ok(l) => m.http = l,
                Err(e) => errors.push(format!(
                    "[http] listen: cannot bind {}: {e}",
                    new.http.listen
                )),
            }
        }
        if new.grpc.listen != old.grpc.listen {
            match per_shard(new.grpc.listen, running.map(|r| r.grpc)) {
                Ok(l) => m.grpc = l,
                Err(e) => errors.push(format!(
                    "[grpc] listen: cannot bind {}: {e}",
                    new.grpc.listen
                )),
            }
        }
        if new.metrics.listen != old.metrics.listen {
            match std::net::TcpListener::bind(new.metrics.listen) {
                Ok(l) => m.metrics = Some(l),
                Err(e) => errors.push(format!(
                    "[metrics] listen: cannot bind {}: {e}",
                    new.metrics.listen
                )),
            }
        }
        if errors.is_empty() {
            Ok(m)
        } else {
            Err(errors)
        }
    }

    /// Hands the listeners to their edges and records the new addresses.
    fn hand_over(self, shared: &Shared) {
        let mut addrs = shared.addrs.lock().unwrap_or_else(|e| e.into_inner());
        let local = |l: &std::net::TcpListener| l.local_addr().ok();
        if let Some(a) = addrs.as_mut() {
            if let Some(x) = self.frames.first().and_then(local) {
                a.frames = x;
            }
            if let Some(x) = self.http.first().and_then(local) {
                a.http = x;
            }
            if let Some(x) = self.grpc.first().and_then(local) {
                a.grpc = x;
            }
            if let Some(x) = self.metrics.as_ref().and_then(local) {
                a.metrics = x;
            }
        }
        drop(addrs);
        if !self.frames.is_empty() || !self.http.is_empty() || !self.grpc.is_empty() {
            let mut frames = self.frames.into_iter();
            let mut http = self.http.into_iter();
            let mut grpc = self.grpc.into_iter();
            for shard in 0..shared.shards() {
                let _ = shared.send(
                    shard,
                    ShardMsg::Listen {
                        frames: frames.next(),
                        http: http.next(),
                        grpc: grpc.next(),
                    },
                );
            }
        }
        if let (Some(l), Some(to)) = (self.metrics, shared.admin_rebind.get()) {
            let _ = to.unbounded_send(l);
        }
    }
}

/// Which listings differ between two tables, by what clients see (served
/// names and items), not by router ids.
fn table_changes(a: &RouteTable, b: &RouteTable) -> ListKinds {
    fn seen<T: std::fmt::Debug>(l: &[crate::route::Listed<T>]) -> String {
        l.iter()
            .map(|x| format!("{}={:?}", x.exposed, x.item))
            .collect::<Vec<_>>()
            .join("\n")
    }
    ListKinds {
        tools: seen(&a.tool_list) != seen(&b.tool_list),
        resources: seen(&a.resource_list) != seen(&b.resource_list)
            || seen(&a.template_list) != seen(&b.template_list),
        prompts: seen(&a.prompt_list) != seen(&b.prompt_list),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_routers_naming_and_routers_dir_may_change_without_a_restart() {
        let old = Config::embedded_default();
        let mut new = old.clone();
        new.routers.pop();
        new.naming.separator = "::".into();
        new.broker.routers_dir = "/elsewhere".into();
        assert!(restart_only_changes(&old, &new).is_empty());

        new.frames.listen = "127.0.0.1:1".parse().unwrap();
        new.metrics.listen = "127.0.0.1:2".parse().unwrap();
        assert!(
            restart_only_changes(&old, &new).is_empty(),
            "listeners move without a restart"
        );
        new.frames.max_frame_bytes += 1;
        new.http.max_sessions += 1;
        new.broker.shards += 1;
        new.broker.list_page_size = 7;
        new.broker.cpus = vec![1];
        let errors = restart_only_changes(&old, &new);
        assert_eq!(errors.len(), 3, "{errors:?}");
        for (e, section) in errors.iter().zip([
            "[broker] changed (broker.shards, broker.cpus, broker.list_page_size)",
            "[frames] changed (frames.max_frame_bytes)",
            "[http] changed (http.max_sessions)",
        ]) {
            assert!(e.starts_with(section), "{e}");
            assert!(e.contains("restart"), "{e}");
        }
        // An optional section turned on or off names itself whole.
        let none = format!("{:#?}", None::<crate::config::BrokerSection>);
        let some = format!("{:#?}", Some(old.broker.clone()));
        assert_eq!(changed_fields(&none, &some), ["*"]);
        assert!(changed_fields(&some, &some).is_empty());
    }

    #[test]
    fn outcomes_are_the_documented_json() {
        let applied = ReloadOutcome::Applied {
            generation: 2,
            added: vec!["chaos".into()],
            changed: vec![],
            removed: vec!["library".into()],
            unchanged: vec!["echo".into()],
            listen: None,
        };
        let v: serde_json::Value = serde_json::from_str(&applied.to_json()).unwrap();
        assert_eq!(v["status"], "applied");
        assert_eq!(v["generation"], 2);
        assert_eq!(v["added"][0], "chaos");
        assert_eq!(v["removed"][0], "library");
        let refused = ReloadOutcome::Refused {
            generation: 2,
            errors: vec!["a".into(), "b".into()],
        };
        assert!(!refused.is_applied());
        let v: serde_json::Value = serde_json::from_str(&refused.to_json()).unwrap();
        assert_eq!(v["status"], "refused");
        assert_eq!(v["errors"].as_array().unwrap().len(), 2);
    }
}
