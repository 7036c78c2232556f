//! A clock for deadlines counted in seconds, a few nanoseconds a read.
//!
//! `Instant::now()` reads the TSC through the vDSO: about 20 ns in a tight
//! loop and 35–40 ns on a shard's request path (cold), and before this
//! module a gRPC call read it 16 times, an HTTP request 15
//! (`bench/NOTES.md`, "clock reads per request"). Most of those reads arm
//! or refresh timers of seconds or minutes: hyper's HTTP/2 keep-alive
//! (60 s), its HTTP/1 header-read timeout, the write watchdog, a session's
//! idle expiry. Those need neither nanoseconds nor milliseconds.
//!
//! `CLOCK_MONOTONIC_COARSE` is the clock `Instant` reads (`CLOCK_MONOTONIC`)
//! as of the kernel's last timer tick, so it lags it by at most one tick
//! (1–4 ms, by `CONFIG_HZ`; `clock_getres` tells) and is read from the
//! vDSO's data page without the TSC: about 3 ns. [`now`] returns it as an
//! `Instant`, so it mixes with `Instant::now()`: a deadline computed from it
//! falls due up to one tick early, and a duration measured from it to a
//! precise reading is up to one tick long. Never use it to measure latency.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// `Instant::now()` and `CLOCK_MONOTONIC` read back to back: the same
/// clock, so the pair translates a coarse reading into an `Instant`.
static ANCHOR: OnceLock<(Instant, Duration)> = OnceLock::new();

fn read(clock: libc::clockid_t) -> Option<Duration> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec.
    if unsafe { libc::clock_gettime(clock, &mut ts) } != 0 {
        return None;
    }
    Some(Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32))
}

fn anchor() -> Option<(Instant, Duration)> {
    let &(at, mono) = ANCHOR.get_or_init(|| {
        let at = Instant::now();
        (at, read(libc::CLOCK_MONOTONIC).unwrap_or_default())
    });
    (mono != Duration::ZERO).then_some((at, mono))
}

/// The monotonic clock as of the last timer tick (see the module's
/// comment); `Instant::now()` where the coarse clock cannot be read.
pub fn now() -> Instant {
    let (Some((at, mono)), Some(coarse)) = (anchor(), read(libc::CLOCK_MONOTONIC_COARSE)) else {
        return Instant::now();
    };
    match coarse.checked_sub(mono) {
        Some(ahead) => at + ahead,
        // Right after the anchor was read the coarse clock still lags it.
        None => at.checked_sub(mono - coarse).unwrap_or(at),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lags_the_precise_clock_by_at_most_a_tick_and_never_runs_back() {
        // CONFIG_HZ is at least 100: a tick is at most 10 ms. The slack is
        // for a VM whose host stalls the vCPU that keeps the kernel's time.
        let tick = Duration::from_millis(100);
        let mut last = now();
        for _ in 0..20_000 {
            let before = Instant::now();
            let c = now();
            let after = Instant::now();
            assert!(c <= after, "{c:?} is ahead of {after:?}");
            assert!(
                before.saturating_duration_since(c) <= tick,
                "{c:?} lags {before:?} by more than {tick:?}"
            );
            assert!(c >= last, "went back from {last:?} to {c:?}");
            last = c;
        }
    }

    #[test]
    fn follows_the_precise_clock_over_time() {
        // Each coarse reading between two precise ones, so that a
        // preemption anywhere only widens the bounds.
        let read = || (Instant::now(), now(), Instant::now());
        let (a0, c0, b0) = read();
        // Longer than the slack, so that a clock that stood still fails.
        std::thread::sleep(Duration::from_millis(250));
        let (a1, c1, b1) = read();
        let coarse = c1 - c0;
        let tick = Duration::from_millis(100);
        assert!(
            coarse + tick >= a1 - b0 && coarse <= b1 - a0 + tick,
            "coarse {coarse:?} against precise {:?}..{:?}",
            a1 - b0,
            b1 - a0
        );
    }
}
