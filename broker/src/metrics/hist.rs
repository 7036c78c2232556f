//! Fixed-bucket latency histograms made of single-writer atomics: what a
//! shard records into on the request path and the admin thread reads
//! without stopping it.
//!
//! # Invariants
//! - Only the owning shard writes (relaxed load + store, never a
//!   read-modify-write: there is no second writer to race with, and a plain
//!   store is cheaper than a locked `fetch_add`).
//! - A reader may see one observation's bucket without its sum (or the
//!   reverse); `_count` is derived from the buckets, so the buckets and the
//!   count always agree, and `_sum` is at most one observation behind.
//! - The bucket bounds are one constant table shared by every latency
//!   metric, so PromQL can sum and compare them across metrics.

use std::sync::atomic::{AtomicU64, Ordering};

/// Mantissas of the bounds in each decade: steps of at most 1.67× (about
/// ±25% around a bucket's middle) and bounds that read well in seconds.
const MANTISSAS: [u64; 6] = [10, 15, 20, 30, 50, 70];
/// First decade: 1 µs (in ns); last bound: 10 s. Below 1 µs nothing in the
/// broker is measurable end to end; a call over 10 s has long since missed
/// every deadline worth alerting on, and still lands in `+Inf`.
const FIRST_DECADE_NS: u64 = 1_000;
const DECADES: usize = 7;

/// Number of finite bucket bounds.
pub const BOUNDS: usize = DECADES * MANTISSAS.len() + 1;

/// The finite upper bounds (`le`), in nanoseconds, ascending: 1 µs, 1.5 µs,
/// 2 µs, 3 µs, 5 µs, 7 µs, 10 µs, … 5 s, 7 s, 10 s.
pub const BOUNDS_NS: [u64; BOUNDS] = bounds();

const fn bounds() -> [u64; BOUNDS] {
    let mut out = [0u64; BOUNDS];
    let mut decade = FIRST_DECADE_NS;
    let mut d = 0;
    while d < DECADES {
        let mut m = 0;
        while m < MANTISSAS.len() {
            out[d * MANTISSAS.len() + m] = decade * MANTISSAS[m] / 10;
            m += 1;
        }
        decade *= 10;
        d += 1;
    }
    out[BOUNDS - 1] = decade;
    out
}

/// The `le` label of bound `i` in seconds, as Prometheus text
/// (`0.0000015`), or `+Inf` past the last bound.
pub fn le(i: usize) -> String {
    match BOUNDS_NS.get(i) {
        Some(&ns) => format!("{}", ns as f64 / 1e9),
        None => "+Inf".into(),
    }
}

/// The bucket (index into the counts) an observation of `ns` falls in.
#[inline]
pub fn bucket_of(ns: u64) -> usize {
    BOUNDS_NS.partition_point(|&b| b < ns)
}

/// Adds `n` to a counter only its owner writes.
#[inline]
pub fn bump(c: &AtomicU64, n: u64) {
    c.store(c.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
}

/// One latency histogram of one shard: a count per bucket (the last is
/// `+Inf`) and the sum of observations in nanoseconds.
#[derive(Debug)]
pub struct AtomicHistogram {
    counts: [AtomicU64; BOUNDS + 1],
    sum_ns: AtomicU64,
}

impl Default for AtomicHistogram {
    fn default() -> Self {
        Self {
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
            sum_ns: AtomicU64::new(0),
        }
    }
}

impl AtomicHistogram {
    /// Records one observation. Owner shard only.
    #[inline]
    pub fn record(&self, ns: u64) {
        bump(&self.counts[bucket_of(ns)], 1);
        bump(&self.sum_ns, ns);
    }

    /// Adds this shard's counts into `into` (per bucket, not cumulative).
    pub fn add_to(&self, into: &mut HistSnapshot) {
        for (a, c) in into.counts.iter_mut().zip(&self.counts) {
            *a += c.load(Ordering::Relaxed);
        }
        into.sum_ns += self.sum_ns.load(Ordering::Relaxed);
    }
}

/// A histogram read (and possibly summed over shards) by the admin thread.
#[derive(Debug, Clone)]
pub struct HistSnapshot {
    pub counts: [u64; BOUNDS + 1],
    pub sum_ns: u64,
}

impl Default for HistSnapshot {
    fn default() -> Self {
        Self {
            counts: [0; BOUNDS + 1],
            sum_ns: 0,
        }
    }
}

impl HistSnapshot {
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    pub fn add(&mut self, other: &HistSnapshot) {
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        self.sum_ns += other.sum_ns;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_run_from_one_microsecond_to_ten_seconds_in_steps_of_at_most_five_thirds() {
        assert_eq!(BOUNDS_NS[0], 1_000);
        assert_eq!(BOUNDS_NS[BOUNDS - 1], 10_000_000_000);
        for w in BOUNDS_NS.windows(2) {
            assert!(w[1] > w[0]);
            assert!(w[1] * 3 <= w[0] * 5, "{} → {}", w[0], w[1]);
        }
        assert_eq!(le(0), "0.000001");
        assert_eq!(le(1), "0.0000015");
        assert_eq!(le(BOUNDS - 1), "10");
        assert_eq!(le(BOUNDS), "+Inf");
    }

    #[test]
    fn an_observation_on_a_bound_falls_in_that_bound_s_bucket() {
        assert_eq!(bucket_of(0), 0);
        assert_eq!(bucket_of(1_000), 0);
        assert_eq!(bucket_of(1_001), 1);
        assert_eq!(bucket_of(10_000_000_000), BOUNDS - 1);
        assert_eq!(bucket_of(u64::MAX), BOUNDS);
        let h = AtomicHistogram::default();
        h.record(1_400);
        h.record(20_000_000_000);
        let mut s = HistSnapshot::default();
        h.add_to(&mut s);
        assert_eq!(s.counts[1], 1);
        assert_eq!(s.counts[BOUNDS], 1);
        assert_eq!(s.count(), 2);
        assert_eq!(s.sum_ns, 20_000_001_400);
    }
}
