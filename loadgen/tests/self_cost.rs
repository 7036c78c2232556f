//! The generator reports its own CPU over the measured phase: total, the
//! share spent spinning for precise send times, and both per request.

mod common;

use std::time::Duration;

use common::{Behaviour, loadgen, report, serial, spawn};

const PROMPT: Behaviour = Behaviour::Stall {
    delay: Duration::ZERO,
    period: Duration::from_secs(1),
    stall: Duration::ZERO,
};

fn f(v: &serde_json::Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("{v} is not a number"))
}

/// Runs open loop at 400 req/s on two threads with `--spin spin`; returns
/// the report.
fn open_run(name: &str, spin: &str) -> serde_json::Value {
    let server = spawn(PROMPT);
    let json = common::json_path(name);
    let out = loadgen(
        &[
            "--target",
            &server.target(),
            "--tool",
            "echo",
            "--rate",
            "400",
            "--connections",
            "2",
            "--threads",
            "2",
            "--spin",
            spin,
            "--warmup",
            "200ms",
            "--duration",
            "1s",
        ],
        &json,
    );
    assert!(out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("loadgen CPU µs/request"), "{stdout}");
    report(&json)
}

#[test]
fn open_loop_reports_its_own_cpu_per_request_with_and_without_idle_spin() {
    let _g = serial();
    let r = open_run("self-cost-spin", "200us");
    assert_eq!(r["errors"], 0, "{r}");
    // A send due just before the end goes out even if its writer wakes a
    // little after it.
    assert_eq!(r["sent"], r["scheduled"], "{r}");
    let g = &r["generator"];
    assert_eq!(g["threads"], 2, "{r}");
    let (secs, cores) = (f(&g["cpu_seconds"]), f(&g["cpu_cores"]));
    let (per, busy, idle) = (
        f(&g["cpu_us_per_request"]),
        f(&g["busy_cpu_us_per_request"]),
        f(&g["idle_spin_cores"]),
    );
    for v in [secs, cores, per, busy, idle] {
        assert!(v.is_finite(), "{g}");
    }
    assert!(secs > 0.0 && per > 0.0 && busy > 0.0, "{g}");
    // Two threads over a 1 s measured phase cannot use more than 2 s.
    assert!(secs < 2.5 && cores <= 2.05, "{g}");
    // Spinning ~2.2 ms before every send 5 ms apart (per connection) is
    // mostly idle, and counted as such: nearly all of the CPU of threads
    // that sleep between their spins (it was once scaled down by their
    // share of the wall time, a sixth of it here).
    assert!(idle > 0.0 && idle <= cores, "{g}");
    assert!(idle >= 0.6 * cores, "{g}");
    assert!(busy < per, "{g}");
}

/// At a rate where the alarm clock spins without a break (a send due every
/// 0.5 ms on the one thread, within the 2.2 ms its spin reaches), the
/// worker's once-a-tick housekeeping still runs. It used to sleep on the
/// runtime's timer, which monoio fires only when it parks: it stood still
/// until sending ended, so the per-second interval histograms came as one
/// at the end, and the measured phase's start went unmarked (no
/// `generator` in the report).
#[test]
fn the_generator_keeps_its_housekeeping_while_its_clock_spins_without_a_break() {
    let _g = serial();
    let server = spawn(PROMPT);
    let json = common::json_path("self-cost-busy");
    let hlog = json.with_extension("hlog");
    let out = loadgen(
        &[
            "--target",
            &server.target(),
            "--tool",
            "echo",
            "--rate",
            "2000",
            "--connections",
            "2",
            "--warmup",
            "300ms",
            "--duration",
            "2500ms",
            "--hlog",
            hlog.to_str().unwrap(),
        ],
        &json,
    );
    assert!(out.status.success());
    let r = report(&json);
    assert_eq!(r["errors"], 0, "{r}");
    // One interval histogram per second as it passed (at 1 s, 2 s and the
    // last, partial one): the housekeeping ran during the run.
    let intervals = std::fs::read_to_string(&hlog).unwrap();
    let n = intervals
        .lines()
        .filter(|l| l.starts_with(|c: char| c.is_ascii_digit()))
        .count();
    assert!(n >= 3, "{n} interval histograms:\n{intervals}");
    let g = &r["generator"];
    assert_eq!(g["threads"], 1, "{r}");
    let (per, idle) = (f(&g["cpu_us_per_request"]), f(&g["idle_spin_cores"]));
    assert!(per > 0.0 && idle >= 0.0, "{g}");
    // The turns of its task loop while it spun: how long an answer could
    // wait to be read.
    let t = &g["turn_us"];
    let (p50, p99, max) = (f(&t["p50"]), f(&t["p99"]), f(&t["max"]));
    assert!(1.0 <= p50 && p50 <= p99 && p99 <= max, "{t}");
}

#[test]
fn without_spin_no_cpu_is_counted_as_idle_spin() {
    let _g = serial();
    let r = open_run("self-cost-nospin", "0");
    let g = &r["generator"];
    assert_eq!(f(&g["idle_spin_cores"]), 0.0, "{g}");
    let per = f(&g["cpu_us_per_request"]);
    assert!(per.is_finite() && per > 0.0, "{g}");
    assert_eq!(per, f(&g["busy_cpu_us_per_request"]), "{g}");
}

#[test]
fn a_run_that_never_starts_measures_no_generator_cpu() {
    // A port nothing listens on.
    let (_held, port) = common::refused_port();
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let json = common::json_path("self-cost-refused");
    let out = loadgen(
        &[
            "--target",
            &format!("frames://{addr}"),
            "--tool",
            "echo",
            "--requests",
            "10",
        ],
        &json,
    );
    assert!(!out.status.success());
    let r = report(&json);
    assert!(r["failure"].is_string(), "{r}");
    assert!(r["generator"].is_null(), "{r}");
}
