//! When each request of a connection is meant to be sent (open loop).
//!
//! Request `k` of a connection with rate `r` is due at the time `t` where
//! the cumulative offered count `N(t)` reaches `k + phase`; `phase` (in
//! 0..1) staggers the connections so that together they send evenly spaced
//! requests instead of bursts of one per connection. Without a ramp
//! `N(t) = r·t`; with a ramp of length `D` the rate grows linearly from 0,
//! so `N(t) = r·t²/(2D)` for `t ≤ D` and `r·D/2 + r·(t − D)` after.
//!
//! Latency is measured from these intended times, not from when the write
//! happened: a generator (or window) that falls behind shows up as latency,
//! which is what a user arriving at that moment would have seen. This is
//! what keeps coordinated omission out of the numbers.

use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug)]
pub struct Schedule {
    start: Instant,
    /// Requests per second of this connection at full rate.
    rate: f64,
    ramp: f64,
    phase: f64,
}

impl Schedule {
    pub fn new(start: Instant, rate: f64, ramp: Duration, phase: f64) -> Self {
        Self {
            start,
            rate,
            ramp: ramp.as_secs_f64(),
            phase,
        }
    }

    /// Seconds after start at which cumulative count `x` is reached.
    fn time_of(&self, x: f64) -> f64 {
        let ramp_count = self.rate * self.ramp / 2.0;
        if x < ramp_count {
            (2.0 * self.ramp * x / self.rate).sqrt()
        } else {
            self.ramp + (x - ramp_count) / self.rate
        }
    }

    /// Cumulative offered count at `secs` after start.
    fn count_at(&self, secs: f64) -> f64 {
        if secs <= 0.0 {
            0.0
        } else if secs < self.ramp {
            self.rate * secs * secs / (2.0 * self.ramp)
        } else {
            self.rate * self.ramp / 2.0 + self.rate * (secs - self.ramp)
        }
    }

    /// The intended send time of request `k`.
    pub fn at(&self, k: u64) -> Instant {
        let secs = self.time_of(k as f64 + self.phase);
        // Saturate instead of panicking on absurd values (a rate so low
        // that the next request lies centuries away).
        self.start + Duration::try_from_secs_f64(secs).unwrap_or(Duration::MAX / 4)
    }

    /// How many requests are due strictly before `t`.
    pub fn count_before(&self, t: Instant) -> u64 {
        let secs = t.saturating_duration_since(self.start).as_secs_f64();
        let x = self.count_at(secs) - self.phase;
        if x <= 0.0 { 0 } else { x.ceil() as u64 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_rate_is_evenly_spaced_and_phased() {
        let t0 = Instant::now();
        let s = Schedule::new(t0, 100.0, Duration::ZERO, 0.5);
        let d = |k| s.at(k).duration_since(t0).as_secs_f64();
        assert!((d(0) - 0.005).abs() < 1e-9);
        assert!((d(1) - 0.015).abs() < 1e-9);
        assert_eq!(s.count_before(t0 + Duration::from_millis(1000)), 100);
        assert_eq!(s.count_before(t0 + Duration::from_millis(4)), 0);
        assert_eq!(s.count_before(t0 + Duration::from_millis(6)), 1);
    }

    #[test]
    fn ramp_offers_half_the_full_rate_count_during_the_ramp() {
        let t0 = Instant::now();
        let s = Schedule::new(t0, 1000.0, Duration::from_secs(2), 0.0);
        // 1000/s ramped over 2 s: 1000 requests during the ramp, then 1000/s.
        assert_eq!(s.count_before(t0 + Duration::from_secs(2)), 1000);
        assert_eq!(s.count_before(t0 + Duration::from_secs(3)), 2000);
        // Sending is slower at first: the first half-second holds 1/16th.
        assert_eq!(s.count_before(t0 + Duration::from_millis(500)), 63);
        for k in [0, 10, 999, 1000, 1500] {
            let t = s.at(k);
            assert_eq!(
                s.count_before(t + Duration::from_nanos(100)),
                k + 1,
                "k={k}"
            );
        }
    }
}
