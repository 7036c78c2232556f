//! `mcp-loadgen` against the real broker: the two binaries as users run
//! them, on loopback.

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::Broker;

/// `mcp-loadgen` is built beside `mcp-broker` by `cargo test --workspace`.
fn loadgen() -> PathBuf {
    let p = PathBuf::from(env!("CARGO_BIN_EXE_mcp-broker")).with_file_name("mcp-loadgen");
    assert!(
        p.exists(),
        "{} is missing: run the tests with `cargo test --workspace` (scripts/test)",
        p.display()
    );
    p
}

/// Runs mcp-loadgen with `args` (plus `-q --json`), expecting it to
/// succeed; its JSON report.
fn run_loadgen(args: &[&str]) -> serde_json::Value {
    static RUN: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let json = std::env::temp_dir().join(format!(
        "loadgen-e2e-{}-{}.json",
        std::process::id(),
        RUN.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    let out = Command::new(loadgen())
        .args(args)
        .args(["-q", "--json"])
        .arg(&json)
        .output()
        .expect("run mcp-loadgen");
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json).expect("JSON report written")).unwrap();
    let _ = std::fs::remove_file(&json);
    assert!(
        out.status.success(),
        "mcp-loadgen {args:?} failed: {}\n{report}",
        String::from_utf8_lossy(&out.stderr)
    );
    report
}

/// A stall of the generator's own process (here SIGSTOP, as a descheduled
/// or starved generator) holds its answers unread and its sends back. The
/// verdict once blamed the server ("The server is saturated") while the
/// broker answered in well under a millisecond; the stall meter now sees
/// it, and the report says the lag may be the generator's.
#[test]
fn a_stalled_generator_does_not_blame_the_server() {
    let b = Broker::start(&[]);
    let json = std::env::temp_dir().join(format!("loadgen-e2e-stall-{}.json", std::process::id()));
    let target = format!("http://{}/mcp", b.http);
    let child = Command::new(loadgen())
        .args([
            "--target",
            &target,
            "--tool",
            "echo",
            "--args",
            r#"{"text":"hi"}"#,
        ])
        .args([
            "--rate",
            "400",
            // Enough connections that a busy machine's slower answers
            // (one request at a time on each) never hold a send back:
            // with 4, a run beside other load lagged on its window, which
            // is the server's verdict, not the stall's.
            "--connections",
            "32",
            "--duration",
            "3s",
            "-q",
            "--json",
        ])
        .arg(&json)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run mcp-loadgen");
    std::thread::sleep(std::time::Duration::from_millis(1000));
    for _ in 0..3 {
        // SAFETY: kill(2) on our own child's pid; no memory is involved.
        unsafe { libc::kill(child.id() as i32, libc::SIGSTOP) };
        std::thread::sleep(std::time::Duration::from_millis(150));
        // SAFETY: as above.
        unsafe { libc::kill(child.id() as i32, libc::SIGCONT) };
        std::thread::sleep(std::time::Duration::from_millis(300));
    }
    let out = child.wait_with_output().expect("mcp-loadgen ends");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json).expect("JSON report written")).unwrap();
    let _ = std::fs::remove_file(&json);
    let stall = report["generator_stalls_us"]["max"].as_u64().unwrap_or(0);
    assert!(stall >= 100_000, "the meter saw the stops: {report}");
    assert_eq!(report["kept_up"], false, "{report}");
    assert_eq!(report["generator_kept_up"], false, "{report}");
    assert!(
        stderr.contains("process stalled") && !stderr.contains("The server is saturated"),
        "{stderr}"
    );
}

#[test]
fn one_hundred_thousand_requests_with_zero_errors_and_matching_correlation_ids() {
    let b = Broker::start(&["--shards", "2"]);
    let target = format!("frames://{}", b.frames);
    let report = run_loadgen(&[
        "--target",
        &target,
        "--tool",
        "echo",
        "--args",
        r#"{"text":"hello","n":1}"#,
        "--connections",
        "8",
        "--concurrency",
        "256",
        "--requests",
        "100000",
        "--duration",
        "120s",
    ]);
    // Every response was verified and matched to its request by correlation
    // id: a mismatch, unknown id or wrong kind would be counted in `errors`.
    assert_eq!(report["errors"], 0, "{report}");
    assert_eq!(report["requests"], 100_000, "{report}");
    assert!(report["latency_us"]["p50"].as_f64().unwrap() > 0.0);
}

/// `--mcp-version 2026-07-28` on the HTTP edge: stateless POSTs routed by
/// their `Mcp-Method`/`Mcp-Name` headers (with a non-ASCII argument), every
/// answer checked; and the session era beside it on the same broker.
#[test]
fn both_protocol_eras_load_the_http_edge_with_zero_errors() {
    let b = Broker::start(&[]);
    let target = format!("http://{}/mcp", b.http);
    for version in ["2025-11-25", "2026-07-28"] {
        let report = run_loadgen(&[
            "--target",
            &target,
            "--mcp-version",
            version,
            "--tool",
            "echo_text",
            "--args",
            r#"{"text":"héllo"}"#,
            "--connections",
            "4",
            "--concurrency",
            "4",
            "--requests",
            "2000",
            "--duration",
            "60s",
        ]);
        assert_eq!(report["errors"], 0, "{version}: {report}");
        assert_eq!(report["requests"], 2000, "{version}: {report}");
    }
}

/// A tool that runs and fails (MCP's `isError`, the `chaos` router's
/// `fail`) is a `tool_error` on every target, as the broker's
/// `outcome="execution_error"` is on every edge: it used to be `ok` (and
/// in the latency figures) on frames and gRPC, and an error only on HTTP.
#[test]
fn a_failed_tool_is_a_tool_error_on_every_target() {
    let b = Broker::start(&[]);
    let http = format!("http://{}/mcp", b.http);
    let targets = [
        (format!("frames://{}", b.frames), None),
        (format!("grpc://{}", b.grpc), None),
        (http.clone(), Some("2025-11-25")),
        (http, Some("2026-07-28")),
    ];
    for (target, version) in &targets {
        let mut args = vec![
            "--target",
            target,
            "--tool",
            "fail",
            "--connections",
            "1",
            "--requests",
            "40",
            "--duration",
            "60s",
        ];
        if let Some(v) = version {
            args.extend(["--mcp-version", v]);
        }
        let r = run_loadgen(&args);
        assert_eq!(r["requests"], 40, "{target}: {r}");
        assert_eq!(r["ok"], 0, "{target}: {r}");
        assert_eq!(r["errors_by_kind"]["tool_error"], 40, "{target}: {r}");
        assert!(r["latency_us"]["p50"].is_null(), "{target}: {r}");
    }
}

/// With `--mcp-version 2026-07-28` (no `initialize`) a wrong path, or a
/// port that is no MCP endpoint, fails the run before it starts, as
/// `initialize` does for a session: it used to exit 0 with every request
/// an `http_404` (or `http_405`).
#[test]
fn a_stateless_run_against_no_mcp_endpoint_fails_before_it_starts() {
    let b = Broker::start(&[]);
    for target in [
        format!("http://{}/nope", b.http),
        format!("http://{}/mcp", b.metrics),
    ] {
        let out = Command::new(loadgen())
            .args(["--target", &target, "--mcp-version", "2026-07-28"])
            .args(["--tool", "echo", "--requests", "20", "-q"])
            .output()
            .expect("run mcp-loadgen");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{target}: {stderr}");
        assert!(
            stderr.contains("server/discover answered HTTP 40"),
            "{target}: {stderr}"
        );
    }
}
