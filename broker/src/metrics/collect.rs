//! The admin side of the HdrHistograms: gathering the shards' interval
//! histograms through their inboxes, and the sliding window the summary's
//! quantiles are computed over.
//!
//! # Invariants
//! - A collection never waits on a shard for more than
//!   [`SNAPSHOT_TIMEOUT`]; a late answer is kept and merged by the next
//!   collection (the reply channel outlives any one scrape), so no
//!   observation is lost, only attributed to a later window slot.
//! - The mutex here is the admin endpoint's (its render threads) and the
//!   ticker's; no shard ever takes it.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use hdrhistogram::Histogram;

use super::record::{ShardSnapshot, SnapshotRequest, new_hdr};
use crate::shared::{ShardMsg, Shared};
use crate::wasm::PoolStats;

/// How long a collection waits for the shards' answers. A shard answers as
/// soon as its inbox task runs, which is between two of its requests'
/// polls, so this is only reached by a shard that is stopping.
pub const SNAPSHOT_TIMEOUT: Duration = Duration::from_millis(250);

/// Length of one window slot, and how often the ticker collects.
pub const SLOT: Duration = Duration::from_secs(10);
/// Slots in the window: quantiles cover the last 50–60 s (the usual summary
/// `max_age` of 1 min in client libraries, in 6 age buckets).
pub const SLOTS: usize = 6;

/// Quantiles the summary exposes.
pub const QUANTILES: [f64; 5] = [0.5, 0.9, 0.99, 0.999, 0.9999];

struct Slot {
    start: Instant,
    hdr: Vec<Histogram<u64>>,
}

struct State {
    window: VecDeque<Slot>,
    /// Per shard: the pools' state at its last answer.
    pools: Vec<Option<Vec<PoolStats>>>,
    /// Per shard: retired pools still finishing calls, at its last answer.
    draining: Vec<usize>,
    /// Cleared histogram sets to hand to the shards.
    spares: Vec<Vec<Histogram<u64>>>,
    /// Collections in which some shard did not answer in time.
    timeouts: u64,
}

/// Gathers shard snapshots; shared by the HTTP handler and the ticker.
pub struct Collector {
    shared: Arc<Shared>,
    tx: Sender<ShardSnapshot>,
    rx: Receiver<ShardSnapshot>,
    state: Mutex<State>,
}

/// What a scrape reads from the collector.
pub struct Collected {
    /// Per router label: quantile values in seconds over the window (`NaN`
    /// when the window holds no observation).
    pub quantiles: Vec<[f64; QUANTILES.len()]>,
    /// Per router slot: pool state summed over shards (shards that never
    /// answered are missing from the sum).
    pub pools: Vec<PoolStats>,
    /// Retired pools still finishing calls, all shards.
    pub draining: u64,
    pub timeouts: u64,
}

impl Collector {
    pub fn new(shared: Arc<Shared>) -> Self {
        let shards = shared.shards();
        let (tx, rx) = crossbeam_channel::unbounded();
        Self {
            shared,
            tx,
            rx,
            state: Mutex::new(State {
                window: VecDeque::with_capacity(SLOTS + 1),
                pools: vec![None; shards],
                draining: vec![0; shards],
                spares: Vec::new(),
                timeouts: 0,
            }),
        }
    }

    /// Router labels registered so far (reloads add some).
    fn routers(&self) -> usize {
        self.shared.layout.routers_registered()
    }

    fn fresh(&self) -> Vec<Histogram<u64>> {
        (0..self.routers()).map(|_| new_hdr()).collect()
    }

    /// Asks every shard for its snapshot and merges what comes back (and
    /// anything that came back late from earlier collections).
    pub fn collect(&self) -> Collected {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let mut asked = 0;
        for shard in 0..self.shared.shards() {
            let spare = st.spares.pop().unwrap_or_else(|| self.fresh());
            let msg = ShardMsg::Snapshot(SnapshotRequest {
                spare,
                reply: self.tx.clone(),
            });
            // A full or stopped inbox: this shard keeps its histograms for
            // the next collection.
            if self.shared.send(shard, msg).is_ok() {
                asked += 1;
            }
        }
        // A late answer of an earlier collection may stand in for one of
        // this one; the one it stands for is merged next time. Either way
        // every answer is merged exactly once.
        let deadline = Instant::now() + SNAPSHOT_TIMEOUT;
        let mut answered = 0;
        while answered < asked {
            match self.rx.recv_deadline(deadline) {
                Ok(snap) => {
                    answered += 1;
                    self.merge(&mut st, snap);
                }
                Err(_) => {
                    st.timeouts += 1;
                    break;
                }
            }
        }
        while let Ok(snap) = self.rx.try_recv() {
            self.merge(&mut st, snap);
        }
        self.read(&st)
    }

    fn merge(&self, st: &mut State, snap: ShardSnapshot) {
        let now = Instant::now();
        if st
            .window
            .back()
            .is_none_or(|s| now.duration_since(s.start) >= SLOT)
        {
            let hdr = match st.window.len() >= SLOTS {
                true => {
                    let mut old = st.window.pop_front().map(|s| s.hdr).unwrap_or_default();
                    old.iter_mut().for_each(|h| h.reset());
                    old
                }
                false => self.fresh(),
            };
            st.window.push_back(Slot { start: now, hdr });
        }
        let slot = st.window.back_mut().expect("a slot was just ensured");
        let mut hdr = snap.hdr;
        // A router added by a reload: its histogram joins the slot.
        if slot.hdr.len() < hdr.len() {
            slot.hdr.resize_with(hdr.len(), new_hdr);
        }
        for (into, h) in slot.hdr.iter_mut().zip(hdr.iter_mut()) {
            // Same bounds on both sides: `add` cannot fail.
            let _ = into.add(&*h);
            h.reset();
        }
        if hdr.len() == self.routers() {
            st.spares.push(hdr);
        }
        if let Some(p) = st.pools.get_mut(snap.shard) {
            *p = Some(snap.pools);
        }
        if let Some(d) = st.draining.get_mut(snap.shard) {
            *d = snap.draining;
        }
    }

    fn read(&self, st: &State) -> Collected {
        let mut merged = new_hdr();
        let routers = self.routers();
        let mut quantiles = Vec::with_capacity(routers);
        for r in 0..routers {
            merged.reset();
            for h in st.window.iter().filter_map(|slot| slot.hdr.get(r)) {
                let _ = merged.add(h);
            }
            let mut q = [f64::NAN; QUANTILES.len()];
            if !merged.is_empty() {
                for (v, &p) in q.iter_mut().zip(&QUANTILES) {
                    // The highest value equivalent to the quantile's bucket:
                    // never under-reports, off by at most 0.1%.
                    *v = merged.highest_equivalent(merged.value_at_quantile(p)) as f64 / 1e9;
                }
            }
            quantiles.push(q);
        }
        // By router slot.
        let mut pools = Vec::new();
        for shard in st.pools.iter().flatten() {
            if pools.len() < shard.len() {
                pools.resize(shard.len(), PoolStats::default());
            }
            for (sum, p) in pools.iter_mut().zip(shard) {
                sum.add(p);
            }
        }
        Collected {
            quantiles,
            pools,
            draining: st.draining.iter().sum::<usize>() as u64,
            timeouts: st.timeouts,
        }
    }
}
