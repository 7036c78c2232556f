//! A real Prometheus scraping a real broker under `mcp-loadgen` load: the
//! counts it stores match what the client sent, and `histogram_quantile`
//! over the scraped buckets agrees with the client's own percentiles to
//! within the buckets' resolution. `promtool check metrics` passes on the
//! exposition.
//!
//! Needs Debian's `prometheus` package (`prometheus` and `promtool` on the
//! PATH); `scripts/setup` installs it. Without it this test fails: an
//! unchecked exposition is not a passing one.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::Broker;
use common::prometheus::{Prometheus, promtool_check, scratch, tool};
use mcp_broker::metrics::hist::{BOUNDS_NS, bucket_of};

fn loadgen() -> PathBuf {
    let p = PathBuf::from(env!("CARGO_BIN_EXE_mcp-broker")).with_file_name("mcp-loadgen");
    assert!(
        p.exists(),
        "{} is missing: run the tests with `cargo test --workspace` (scripts/test)",
        p.display()
    );
    p
}

/// The bucket bounds (seconds) around an exact quantile of `us`: from the
/// lower bound of the bucket below its bucket to the upper bound of its
/// bucket. The one below: HdrHistogram reports the highest value
/// equivalent to the quantile (0.1% up), which can cross a bucket bound.
fn resolution_window(us: f64) -> (f64, f64) {
    let b = bucket_of((us * 1e3) as u64);
    let lo = b.checked_sub(2).map_or(0, |i| BOUNDS_NS[i]);
    let hi = BOUNDS_NS.get(b).copied().unwrap_or(u64::MAX);
    (lo as f64 / 1e9, hi as f64 / 1e9)
}

/// What each call of `run_loadgen` asks the chaos router's `sleep` tool
/// to sleep.
const TOOL_SLEEP_S: f64 = 0.002;

fn run_loadgen(broker: &Broker, json: &Path) -> serde_json::Value {
    // A server of known latency (the chaos router's 2 ms sleep), so that
    // the broker's share of the client's latency dominates. Closed loop,
    // two in flight: the chaos pools (2 instances per shard) never queue,
    // and on a shared machine a stalled client delays its next send instead
    // of charging the stall to requests the broker never saw (open loop
    // measures from the intended send time, which the broker cannot know).
    let out = Command::new(loadgen())
        .args(["--target", &format!("frames://{}", broker.frames)])
        .args(["--tool", "sleep", "--args"])
        .arg(format!(r#"{{"ms":{}}}"#, TOOL_SLEEP_S * 1e3))
        .args(["--connections", "2", "--concurrency", "2"])
        .args(["--requests", "1000", "--duration", "120s"])
        .args(["--timeout", "10s", "-q", "--json"])
        .arg(json)
        .output()
        .expect("run mcp-loadgen");
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(json).expect("JSON report written")).unwrap();
    assert!(
        out.status.success(),
        "mcp-loadgen failed: {}\n{report}",
        String::from_utf8_lossy(&out.stderr)
    );
    report
}

#[test]
fn prometheus_scrapes_counts_matching_the_client_and_quantiles_within_bucket_resolution() {
    // Fail early, before any load, when the tools are missing.
    tool("promtool");
    let broker = Broker::start(&["--shards", "2"]);
    let prom = Prometheus::start(broker.metrics);
    let up = prom.wait_for("up{job=\"mcp-broker\"}", |v| v == 1.0);
    assert_eq!(
        up,
        Some(1.0),
        "prometheus never scraped the broker: {}",
        prom.log()
    );

    let dir = scratch("mcp-metrics-loadgen");
    let report = run_loadgen(&broker, &dir.path().join("report.json"));
    let sent = report["sent"].as_u64().unwrap();
    let requests = report["requests"].as_u64().unwrap();
    assert_eq!(sent, 1000, "{report}");
    assert_eq!(report["errors"], 0, "{report}");
    assert_eq!(requests, sent, "every request answered: {report}");

    // Counts: what Prometheus stored equals what the client sent.
    let count = prom.wait_for(
        "sum(mcp_requests_total{edge=\"frames\",router=\"chaos\",kind=\"call_tool\"})",
        |v| v == sent as f64,
    );
    assert_eq!(count, Some(sent as f64), "scraped request count vs sent");
    let ok = prom.query("sum(mcp_requests_total{router=\"chaos\",outcome=\"ok\"})");
    assert_eq!(ok, report["ok"].as_f64(), "scraped ok count vs loadgen's");
    let hist_count = prom.wait_for(
        "sum(mcp_request_duration_seconds_count{router=\"chaos\",tool=\"sleep\"})",
        |v| v == sent as f64,
    );
    assert_eq!(hist_count, Some(sent as f64), "histogram count vs sent");
    let errors = prom.query("sum(mcp_requests_total{outcome!=\"ok\"})");
    assert!(
        errors.is_none_or(|e| e == 0.0),
        "errors recorded: {errors:?}"
    );

    // Quantiles, three measurements of one distribution: the client's
    // (loadgen), the broker's exact one (its HdrHistogram summary) and
    // Prometheus's estimate from the broker's buckets.
    // - The broker times a sub-interval of the client's (no network, no
    //   client), so its exact quantile is at most the client's (plus
    //   HdrHistogram's 0.1%), and at least the tool's own 2 ms sleep. How far
    //   under the client's depends on the machine, not on the broker: with
    //   another test binary beside it the client's p50 grew to 7.8 ms and
    //   the broker's to 4.8.
    // - The broker served nothing else, so the cumulative buckets are
    //   exactly this run's distribution, and Prometheus's estimate lies
    //   within bucket resolution of the exact quantile.
    for (q, key) in [(0.5, "p50"), (0.9, "p90"), (0.99, "p99")] {
        let client_s = report["latency_us"][key].as_f64().unwrap() / 1e6;
        let exact = prom
            .wait_for(
                &format!("mcp_request_duration_hdr_seconds{{router=\"chaos\",quantile=\"{q}\"}}"),
                |v| !v.is_nan(),
            )
            .unwrap_or(f64::NAN);
        assert!(
            exact <= client_s * 1.001 && exact >= TOOL_SLEEP_S,
            "{key}: the broker's {exact} s vs loadgen's {client_s} s and the tool's {TOOL_SLEEP_S} s sleep"
        );
        let promql = format!(
            "histogram_quantile({q}, sum by (le) (mcp_request_duration_seconds_bucket{{router=\"chaos\",tool=\"sleep\"}}))"
        );
        let estimate = prom.query(&promql).unwrap_or(f64::NAN);
        let (lo, hi) = resolution_window(exact * 1e6);
        eprintln!(
            "{key}: loadgen {client_s} s, broker {exact} s, histogram_quantile {estimate} s, accepted [{lo}, {hi}] s"
        );
        assert!(
            (lo..=hi).contains(&estimate),
            "{key}: histogram_quantile {estimate} s is outside [{lo}, {hi}] s around the broker's exact {exact} s\n{report}"
        );
    }

    // The exposition after load is clean for promtool.
    let (status, exposition) = broker.http_get("/metrics");
    assert_eq!(status, 200);
    let (ok, complaints) = promtool_check(&exposition);
    assert!(
        ok && complaints.trim().is_empty(),
        "promtool check metrics: {complaints}\n{exposition}"
    );
}
