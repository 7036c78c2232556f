//! The results: the JSON report (`--json`), the human summary, and the
//! "could not keep up" verdict.
//!
//! # Invariants
//! - The JSON always carries the brief's fields (`requests`, `errors`,
//!   `offered_rps`, `achieved_rps`, `latency_us.{p50,p90,p99,p999,p9999,max}`),
//!   also for a failed run, so a script never has to special-case failure.

use std::collections::BTreeMap;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::engine::{Mode, Outcome, RunConfig};

/// Achieved below this share of the offered rate (open loop) is reported
/// as "could not keep up".
const KEEP_UP_RATIO: f64 = 0.95;

/// Writes more than this late (p99 of send lag) mean the generator itself,
/// or the in-flight window, could not follow the schedule.
const KEEP_UP_SEND_LAG_US: u64 = 5_000;

/// Latency of the successful responses, µs. Every field is `None` (JSON
/// `null`) when there were none: a run whose every request failed has no
/// latency, and a 0 would read as an excellent one.
#[derive(Serialize, Debug, Default)]
pub struct Latency {
    pub min: Option<u64>,
    pub mean: Option<f64>,
    pub stdev: Option<f64>,
    pub p50: Option<u64>,
    pub p75: Option<u64>,
    pub p90: Option<u64>,
    pub p95: Option<u64>,
    pub p99: Option<u64>,
    pub p999: Option<u64>,
    pub p9999: Option<u64>,
    pub max: Option<u64>,
}

impl Latency {
    pub fn of(h: &Histogram<u64>) -> Self {
        if h.is_empty() {
            return Self::default();
        }
        let q = |q: f64| Some(h.value_at_quantile(q));
        Self {
            min: Some(h.min()),
            mean: Some(h.mean()),
            stdev: Some(h.stdev()),
            p50: q(0.50),
            p75: q(0.75),
            p90: q(0.90),
            p95: q(0.95),
            p99: q(0.99),
            p999: q(0.999),
            p9999: q(0.9999),
            max: Some(h.max()),
        }
    }
}

/// The median, 99th percentile and maximum of a histogram of µs (send lag,
/// the generator's turns).
#[derive(Serialize, Debug)]
pub struct SendLag {
    pub p50: u64,
    pub p99: u64,
    pub max: u64,
}

impl SendLag {
    fn of(h: &Histogram<u64>) -> Self {
        SendLag {
            p50: h.value_at_quantile(0.5),
            p99: h.value_at_quantile(0.99),
            max: h.max(),
        }
    }
}

/// The generator's own cost over the measured phase.
#[derive(Serialize, Debug)]
pub struct Generator {
    /// Worker threads whose CPU was measured.
    pub threads: usize,
    /// CPU time (user + system) of the worker threads over the measured
    /// phase, seconds.
    pub cpu_seconds: f64,
    /// Cores busy (1.0 = one core the whole measured phase), summed over
    /// the worker threads.
    pub cpu_cores: f64,
    /// CPU per answered request, µs: `cpu_cores` over `achieved_rps`.
    /// Includes the idle spin of `--spin`, so at low rates it mostly says
    /// how much the spin costs.
    pub cpu_us_per_request: Option<f64>,
    /// Of `cpu_cores`, the cores spent spinning for precise send times with
    /// nothing else to do. `None` for `grpc://`: tonic's connection tasks
    /// cannot be told from idle spin.
    pub idle_spin_cores: Option<f64>,
    /// CPU per answered request without the idle spin, µs: what a request
    /// costs the generator, whatever the rate (`None` as above).
    pub busy_cpu_us_per_request: Option<f64>,
    /// Open loop: how long one turn of a worker's tasks took while it spun
    /// for its send times, µs, weighted by length: the turn that an answer
    /// arriving at a random moment fell in. Such an answer waited up to
    /// about that long to be read, and its latency includes the wait.
    /// `None` when the spin never ran (closed loop, `--spin 0`, low rates).
    pub turn_us: Option<SendLag>,
}

#[derive(Serialize, Debug)]
pub struct Report {
    pub target: String,
    pub mode: &'static str,
    pub workload: String,
    pub driver: &'static str,
    pub threads: usize,
    pub connections: usize,
    pub concurrency: Option<u64>,
    pub rate: Option<f64>,
    pub warmup_s: f64,
    /// Length of the measured phase: from the end of the warmup to the
    /// later of the last send and the last response.
    pub duration_s: f64,
    /// Measured requests that reached an outcome (success or a
    /// request-ending error).
    pub requests: u64,
    pub ok: u64,
    /// All error events (request-ending ones, plus stray frames).
    pub errors: u64,
    pub errors_by_kind: BTreeMap<String, u64>,
    pub sent: u64,
    /// Requests due by the schedule in the measured phase (closed loop:
    /// equal to `sent`); `scheduled - sent` were never sent.
    pub scheduled: u64,
    /// Requests the schedule called for in the measured phase, per second
    /// (closed loop: what was sent).
    pub offered_rps: f64,
    /// Final responses (success or error response) per second.
    pub achieved_rps: f64,
    pub latency_us: Latency,
    /// Open loop: how late requests were written after their intended time.
    pub send_lag_us: Option<SendLag>,
    /// Open loop: the generator's own part of `send_lag_us`, counted from
    /// when each request was both due and let go by its in-flight window.
    /// A request due while its window was full (`--concurrency`; http://:
    /// one request per connection, or `--pipeline`) waited for the
    /// server's answers, which `send_lag_us` counts and this does not.
    pub generator_lag_us: Option<SendLag>,
    /// Open loop: how late a thread of the generator that sleeps 1 ms woke
    /// (jHiccup's method), µs: stalls of the whole generator process
    /// (descheduled, stopped, starved of CPU). During one, answers wait
    /// unread and sends are held back, and the generator cannot tell that
    /// wait from the server's: stalls as long as the send lag mean the lag
    /// may be the generator's (`generator_kept_up` false).
    pub generator_stalls_us: Option<SendLag>,
    pub progress_frames: u64,
    /// Final answers that arrived after their request's `--timeout` (the
    /// request counts once, as `timeout` in `errors_by_kind`).
    pub late_responses: u64,
    pub kept_up: bool,
    /// Whether the generator itself followed the schedule: `generator_lag_us`
    /// p99 within 5 ms, and no stall of the process (`generator_stalls_us`)
    /// over 5 ms and as long as half the send lag's p99. `kept_up` false
    /// with this true: the server's answers, not the generator, held the
    /// sends back.
    pub generator_kept_up: bool,
    /// Open loop: every scheduled request was sent, and on time (send lag
    /// p99 within 5 ms); `kept_up` false with this true: answers missing,
    /// not late.
    #[serde(skip)]
    pub sent_on_time: bool,
    /// The generator's own CPU over the measured phase (`None`: not
    /// measured, e.g. the run failed before it).
    pub generator: Option<Generator>,
    /// Why the run stopped early, if it did; the numbers are then partial.
    pub failure: Option<String>,
    pub started_unix_ms: Option<u64>,
}

impl Report {
    pub fn new(cfg: Option<&RunConfig>, target: &str, outcome: &Outcome) -> Self {
        let s = &outcome.stats;
        let c = &s.counts;
        let warmup = cfg.map_or(Duration::ZERO, |c| c.warmup);
        let send_window = s.last_send.saturating_sub(warmup);
        // `--requests` with `--duration`: whichever came first ended sending.
        let quota_ended = cfg
            .and_then(|c| c.requests)
            .is_some_and(|n| s.sent_all >= n);
        let send_window = match cfg.and_then(|c| c.duration) {
            // A fixed measured phase ended on time unless the run failed or
            // its request quota ended it sooner.
            Some(d) if outcome.failure.is_none() && !quota_ended => d,
            _ => send_window,
        };
        let run_window = send_window.max(s.last_response.saturating_sub(warmup));
        let per_s = |n: u64, w: Duration| {
            if w.is_zero() {
                0.0
            } else {
                n as f64 / w.as_secs_f64()
            }
        };
        let responses = c.ok
            + crate::stats::ErrorKind::ALL
                .iter()
                .filter(|k| k.is_answer())
                .map(|k| c.errors[*k as usize])
                .sum::<u64>();
        let offered_rps = per_s(c.intended, send_window);
        let achieved_rps = per_s(responses, run_window);
        let mode = cfg.map(RunConfig::mode);
        let scheduled = matches!(mode, Some(Mode::Open | Mode::RateLimited));
        let send_lag = (scheduled && !s.send_lag.is_empty()).then(|| SendLag::of(&s.send_lag));
        let own_lag = (scheduled && !s.own_lag.is_empty()).then(|| SendLag::of(&s.own_lag));
        let within = |l: &Option<SendLag>| l.as_ref().is_none_or(|l| l.p99 <= KEEP_UP_SEND_LAG_US);
        let kept_up = !scheduled
            || (achieved_rps >= KEEP_UP_RATIO * offered_rps
                && c.sent >= c.intended
                && within(&send_lag));
        let stalls = (scheduled && !s.stalls.is_empty()).then(|| SendLag::of(&s.stalls));
        // A stall of the generator holds answers unread, and the wait looks
        // like the server's: one as long as the lateness explains it.
        let stalled = stall_explains_lag(stalls.as_ref(), send_lag.as_ref());
        let generator_kept_up = within(&own_lag) && !stalled;
        // Sends on schedule and on time: a shortfall of answers is not
        // lateness but answers that were no responses, or never came.
        let sent_on_time = c.sent >= c.intended && within(&send_lag);
        let per_request = |cores: f64| {
            (achieved_rps > 0.0 && cores.is_finite()).then(|| cores * 1e6 / achieved_rps)
        };
        // gRPC: hyper's connection tasks run outside the counted tasks
        // (`alarm.rs`), so their work would pass for idle spin.
        let idle_known = cfg.is_some_and(|c| c.target.scheme != crate::target::Scheme::Grpc);
        let generator = s.cpu.map(|u| {
            let idle = idle_known.then_some(u.idle_spin_cores);
            Generator {
                threads: u.threads,
                cpu_seconds: u.cpu.as_secs_f64(),
                cpu_cores: u.cores,
                cpu_us_per_request: per_request(u.cores),
                idle_spin_cores: idle,
                busy_cpu_us_per_request: idle.and_then(|i| per_request(u.cores - i)),
                turn_us: (!s.turns.is_empty()).then(|| SendLag::of(&s.turns)),
            }
        });
        Self {
            target: target.to_owned(),
            mode: mode.map_or("none", Mode::as_str),
            workload: cfg.map_or_else(String::new, |c| c.workload.describe()),
            driver: if outcome.io_uring {
                "io_uring"
            } else {
                "epoll"
            },
            threads: cfg.map_or(0, |c| c.threads),
            connections: cfg.map_or(0, |c| c.connections),
            concurrency: cfg.and_then(|c| c.concurrency),
            rate: cfg.and_then(|c| c.rate),
            warmup_s: warmup.as_secs_f64(),
            duration_s: run_window.as_secs_f64(),
            requests: c.completed(),
            ok: c.ok,
            errors: c.total_errors(),
            errors_by_kind: c.by_kind(),
            sent: c.sent,
            scheduled: c.intended,
            offered_rps,
            achieved_rps,
            latency_us: Latency::of(&s.latency),
            send_lag_us: send_lag,
            generator_lag_us: own_lag,
            generator_stalls_us: stalls,
            progress_frames: c.progress_frames,
            late_responses: c.late,
            kept_up,
            generator_kept_up,
            sent_on_time,
            generator,
            failure: outcome.failure.clone(),
            started_unix_ms: outcome.started.and_then(|t| {
                t.duration_since(std::time::UNIX_EPOCH)
                    .ok()
                    .map(|d| d.as_millis() as u64)
            }),
        }
    }

    /// The human summary, for stdout.
    pub fn human(&self) -> String {
        use std::fmt::Write;
        let mut o = String::new();
        let _ = writeln!(
            o,
            "{} {} | {} | {} thread(s), {} connection(s), {} | driver {}",
            self.mode,
            self.target,
            self.workload,
            self.threads,
            self.connections,
            match (self.rate, self.concurrency) {
                (Some(r), Some(c)) => format!("rate {r} req/s, at most {c} in flight"),
                (Some(r), None) => format!("rate {r} req/s"),
                (None, Some(c)) => format!("concurrency {c}"),
                (None, None) => String::new(),
            },
            self.driver
        );
        let _ = writeln!(
            o,
            "  requests {}  ok {}  errors {}  in {:.2}s  (warmup {:.2}s excluded)",
            self.requests, self.ok, self.errors, self.duration_s, self.warmup_s
        );
        let _ = writeln!(
            o,
            "  offered {:.1} req/s  achieved {:.1} req/s",
            self.offered_rps, self.achieved_rps
        );
        if let Some(g) = &self.generator
            && let Some(per) = g.cpu_us_per_request
        {
            let _ = writeln!(
                o,
                "  loadgen CPU µs/request {per:.2} ({:.2} core(s) over {} thread(s))",
                g.cpu_cores, g.threads
            );
            if let Some(busy) = g.busy_cpu_us_per_request.filter(|b| *b > 0.0) {
                let _ = writeln!(
                    o,
                    "  loadgen busy CPU µs/request {busy:.2} (without {:.2} core(s) of idle \
                     spin): ≈ {:.0} req/s per core",
                    g.idle_spin_cores.unwrap_or_default(),
                    1e6 / busy
                );
            }
        }
        if let Some(t) = self.generator.as_ref().and_then(|g| g.turn_us.as_ref()) {
            let _ = writeln!(
                o,
                "  loadgen turn (an answer waits up to one to be read): p50 {}  p99 {}  max {}",
                fmt_us(t.p50),
                fmt_us(t.p99),
                fmt_us(t.max)
            );
        }
        let l = &self.latency_us;
        let _ = writeln!(o, "  latency (successful responses only):");
        for (name, v) in [
            ("p50", l.p50),
            ("p75", l.p75),
            ("p90", l.p90),
            ("p99", l.p99),
            ("p99.9", l.p999),
            ("p99.99", l.p9999),
            ("max", l.max),
        ] {
            let _ = writeln!(
                o,
                "    {name:>7}  {}",
                v.map_or_else(|| "-".to_owned(), fmt_us)
            );
        }
        let mean = l.mean.map_or_else(|| "-".to_owned(), |m| fmt_us(m as u64));
        let _ = writeln!(o, "    {:>7}  {mean}", "mean");
        for (label, lag) in [
            ("  send lag behind schedule", &self.send_lag_us),
            (
                "    of which the generator's own (not waiting for answers)",
                &self.generator_lag_us,
            ),
            (
                "  generator stalls (how late a 1 ms sleep woke)",
                &self.generator_stalls_us,
            ),
        ] {
            if let Some(l) = lag {
                let _ = writeln!(
                    o,
                    "{label}: p50 {}  p99 {}  max {}",
                    fmt_us(l.p50),
                    fmt_us(l.p99),
                    fmt_us(l.max)
                );
            }
        }
        if !self.errors_by_kind.is_empty() {
            let _ = writeln!(o, "  errors by kind:");
            for (k, n) in &self.errors_by_kind {
                let _ = writeln!(o, "    {k}: {n}");
            }
        }
        if self.late_responses > 0 {
            let _ = writeln!(
                o,
                "  late answers (after their timeout, counted as timeouts): {}",
                self.late_responses
            );
        }
        o
    }

    /// Loud warnings for stderr, if any.
    pub fn warnings(&self) -> Vec<String> {
        let mut w = Vec::new();
        // A run that stopped early (the server gone, Ctrl-C) fell short of
        // its schedule for that reason, which `failure` gives: saying the
        // server was saturated, or the generator slow, would be false.
        if !self.kept_up && self.failure.is_none() {
            let lag = self.send_lag_us.as_ref().map_or(String::new(), |l| {
                format!(", sends ran up to {} late", fmt_us(l.max))
            });
            // The verdict's own rule: a stall far shorter than the lag
            // (6 ms against 2 s) explains none of it.
            let stall = self
                .generator_stalls_us
                .as_ref()
                .filter(|s| stall_explains_lag(Some(s), self.send_lag_us.as_ref()));
            // Sent on time, and answers short by errors: wrong or failed
            // answers, not a slow server. (Short with no errors, answers
            // were late past the run's end: the server's saturation.)
            let who = if self.sent_on_time && self.errors > 0 {
                format!(
                    "Every request was sent on time, but the responses fell short: {} ok and {} \
                     errors of {} sent (see errors by kind: answers that were no valid response, \
                     failed connections, timeouts; the rest got no answer)",
                    self.ok, self.errors, self.sent
                )
            } else if let (false, Some(s)) = (self.generator_kept_up, stall) {
                format!(
                    "This generator's process stalled for up to {} (a thread sleeping 1 ms \
                     woke that late: descheduled, stopped or starved of CPU), as long as the \
                     lateness: answers waited unread, so the lag may be its own, not the \
                     server's; compare the server's own latency, and give the generator cores \
                     of its own (--cpus)",
                    fmt_us(s.max)
                )
            } else if self.generator_kept_up {
                "The server is saturated: this generator followed its schedule and the \
                 answers did not (a full in-flight window, --concurrency or --pipeline, holds \
                 sends back until they come)"
                    .to_owned()
            } else {
                let own = self.generator_lag_us.as_ref().map_or(String::new(), |l| {
                    format!(" (its own part of the lag: p99 {})", fmt_us(l.p99))
                });
                format!("This generator fell behind its schedule{own}: see --threads and --cpus")
            };
            w.push(format!(
                "WARNING: COULD NOT KEEP UP: offered {:.1} req/s, achieved {:.1} req/s, \
                 {} of {} scheduled requests sent{lag}. {who}; the latencies include that \
                 queueing.",
                self.offered_rps, self.achieved_rps, self.sent, self.scheduled,
            ));
        }
        // A run that never started measured nothing to warn about.
        if self.mode == Mode::Closed.as_str() && self.started_unix_ms.is_some() {
            w.push(
                "note: closed loop: each request waited for a free slot, so stalls delay \
                 sending instead of showing as latency (coordinated omission). Use --rate for \
                 the latency users see."
                    .into(),
            );
        }
        w
    }
}

/// Whether the generator's process stalled long enough to explain the
/// send lag: over 5 ms, and at least half the lag's p99. During a stall
/// answers wait unread, so the wait looks like the server's.
fn stall_explains_lag(stalls: Option<&SendLag>, send_lag: Option<&SendLag>) -> bool {
    match (stalls, send_lag) {
        (Some(st), Some(l)) => st.max > KEEP_UP_SEND_LAG_US && st.max.saturating_mul(2) >= l.p99,
        _ => false,
    }
}

/// `1234` µs → `1.23ms`.
pub fn fmt_us(us: u64) -> String {
    match us {
        0..1_000 => format!("{us}µs"),
        1_000..1_000_000 => format!("{:.2}ms", us as f64 / 1e3),
        _ => format!("{:.3}s", us as f64 / 1e6),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn microseconds_print_readably() {
        assert_eq!(fmt_us(12), "12µs");
        assert_eq!(fmt_us(2_345), "2.35ms");
        assert_eq!(fmt_us(1_500_000), "1.500s");
    }

    /// A 1 s open-loop run of 1,000 requests, all sent and answered, whose
    /// sends lagged `total` µs after their intended times and `own` µs
    /// after the window let them go.
    fn lagging_run(total: u64, own: u64, answered: u64) -> Report {
        stalled_run(total, own, answered, 80)
    }

    /// [`lagging_run`] whose process stalled up to `stall` µs.
    fn stalled_run(total: u64, own: u64, answered: u64, stall: u64) -> Report {
        use clap::Parser as _;
        let cfg = crate::cli::Args::try_parse_from([
            "mcp-loadgen",
            "--target",
            "frames://127.0.0.1:7400",
            "--tool",
            "echo",
            "--rate",
            "1000",
            "--duration",
            "1s",
        ])
        .unwrap()
        .validate()
        .unwrap();
        let mut stats = crate::stats::ThreadStats::default();
        stats.counts.sent = 1000;
        stats.counts.intended = 1000;
        stats.counts.ok = answered;
        for _ in 0..1000 {
            crate::stats::record(&mut stats.send_lag, total);
            crate::stats::record(&mut stats.own_lag, own);
            crate::stats::record(&mut stats.latency, total + 100);
        }
        for _ in 0..900 {
            crate::stats::record(&mut stats.stalls, 80);
        }
        crate::stats::record(&mut stats.stalls, stall);
        stats.last_send = Duration::from_secs(1);
        stats.last_response = Duration::from_secs(1);
        let outcome = Outcome {
            stats,
            failure: None,
            started: None,
            io_uring: true,
        };
        Report::new(Some(&cfg), "frames://127.0.0.1:7400", &outcome)
    }

    #[test]
    fn a_lag_the_window_imposed_is_the_servers_and_the_generators_own_is_its() {
        // Sends 20 ms late, all of it waiting for answers: the server.
        let r = lagging_run(20_000, 30, 1000);
        assert!(!r.kept_up && r.generator_kept_up);
        let w = r.warnings().join("\n");
        assert!(w.contains("The server is saturated"), "{w}");
        // The same lag, all of it the generator's own.
        let r = lagging_run(20_000, 20_000, 1000);
        assert!(!r.kept_up && !r.generator_kept_up);
        let w = r.warnings().join("\n");
        assert!(w.contains("This generator fell behind"), "{w}");
        assert!(w.contains("p99 20."), "{w}");
        // On time, but a tenth of the answers missing with no error: they
        // came too late, a saturated server (frames, open loop: no window
        // holds the sends back).
        let r = lagging_run(30, 30, 900);
        assert!(!r.kept_up && r.generator_kept_up);
        assert!(r.warnings().join("\n").contains("The server is saturated"));
        // On time, and a tenth of the answers errors: not lateness.
        let mut r = lagging_run(30, 30, 900);
        r.errors = 100;
        let w = r.warnings().join("\n");
        assert!(
            w.contains("Every request was sent on time, but the responses fell short: 900 ok"),
            "{w}"
        );
        assert!(!w.contains("saturated"), "{w}");
        // Late by the window, while the process stalled as long: the
        // generator's, whatever its workers' own lag says (they were
        // stalled too, and an unread answer held the window).
        let r = stalled_run(95_000, 30, 1000, 100_000);
        assert!(!r.kept_up && !r.generator_kept_up);
        let w = r.warnings().join("\n");
        assert!(w.contains("process stalled for up to 100"), "{w}");
        assert!(!w.contains("saturated"), "{w}");
        // A stall far shorter than the lateness explains none of it.
        let r = stalled_run(2_000_000, 30, 1000, 20_000);
        assert!(!r.kept_up && r.generator_kept_up);
        assert!(r.warnings().join("\n").contains("The server is saturated"));
        // Nor when the generator's own lag is behind the lateness: the
        // text names that lag, not the short stall it once blamed.
        let r = stalled_run(2_000_000, 2_000_000, 1000, 20_000);
        assert!(!r.kept_up && !r.generator_kept_up);
        let w = r.warnings().join("\n");
        assert!(w.contains("This generator fell behind"), "{w}");
        assert!(!w.contains("stalled"), "{w}");
        // A run cut short (the server gone) is explained by its failure.
        let mut r = lagging_run(30, 30, 900);
        r.failure = Some("cannot reconnect: Connection refused".into());
        let w = r.warnings().join("\n");
        assert!(!w.contains("COULD NOT KEEP UP"), "{w}");
        // On time and answered: nothing to say.
        let r = lagging_run(30, 30, 1000);
        assert!(r.kept_up && r.generator_kept_up && r.warnings().is_empty());
    }

    #[test]
    fn a_failed_run_still_has_every_brief_field() {
        let outcome = Outcome {
            stats: Default::default(),
            failure: Some("cannot connect".into()),
            started: None,
            io_uring: false,
        };
        let r = Report::new(None, "frames://x:1", &outcome);
        let v = serde_json::to_value(&r).unwrap();
        for k in ["requests", "errors", "offered_rps", "achieved_rps"] {
            assert!(v.get(k).is_some(), "{k}");
        }
        for k in ["p50", "p90", "p99", "p999", "p9999", "max"] {
            assert!(v["latency_us"].get(k).is_some(), "{k}");
        }
        assert_eq!(v["failure"], "cannot connect");
    }
}
