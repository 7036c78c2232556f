//! Failure behaviour: a clear message, a non-zero exit, and the JSON report
//! written anyway (with whatever was measured before the failure).

mod common;

use std::time::{Duration, Instant};

use common::{Behaviour, loadgen, report, serial, spawn};

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn bad_target_fails_with_a_clear_message_and_a_report() {
    let json = common::json_path("bad-target");
    let out = loadgen(&["--target", "frames://localhost", "--tool", "echo"], &json);
    assert!(!out.status.success());
    let e = stderr(&out);
    assert!(
        e.contains("bad target") && e.contains("missing `:PORT`"),
        "{e}"
    );
    let r = report(&json);
    assert!(r["failure"].as_str().unwrap().contains("bad target"));
    assert_eq!(r["requests"], 0);
}

#[test]
fn refused_connection_fails_with_a_clear_message_and_a_report() {
    // Nothing listens on it.
    let (_held, port) = common::refused_port();
    let json = common::json_path("refused");
    let target = format!("frames://127.0.0.1:{port}");
    let out = loadgen(
        &["--target", &target, "--tool", "echo", "--duration", "2s"],
        &json,
    );
    assert!(!out.status.success());
    let e = stderr(&out);
    assert!(
        e.contains("cannot connect to") && e.contains(&target),
        "{e}"
    );
    let r = report(&json);
    assert!(r["failure"].as_str().unwrap().contains("cannot connect"));
}

#[test]
fn refused_grpc_connection_fails_with_a_clear_message_and_a_report() {
    let (_held, port) = common::refused_port();
    let json = common::json_path("grpc-refused");
    let target = format!("grpc://127.0.0.1:{port}");
    let out = loadgen(
        &["--target", &target, "--tool", "echo", "--duration", "2s"],
        &json,
    );
    assert_eq!(out.status.code(), Some(1));
    let e = stderr(&out);
    assert!(
        e.contains("cannot connect to") && e.contains(&target),
        "{e}"
    );
    let r = report(&json);
    assert!(r["failure"].as_str().unwrap().contains("cannot connect"));
    assert_eq!(r["driver"], "epoll", "tonic runs on tokio (epoll)");
}

#[test]
fn server_killed_mid_run_stops_the_run_with_partial_results() {
    let _g = serial();
    let server = spawn(Behaviour::DieAfter(Duration::from_millis(800)));
    let json = common::json_path("killed");
    let started = Instant::now();
    let out = loadgen(
        &[
            "--target",
            &server.target(),
            "--tool",
            "echo",
            "--rate",
            "300",
            "--duration",
            "20s",
        ],
        &json,
    );
    assert!(!out.status.success());
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the run must stop when the server goes, not run its 20 s"
    );
    let e = stderr(&out);
    assert!(
        e.contains("closed by the server") || e.contains("failed"),
        "{e}"
    );
    assert!(e.contains("partial"), "{e}");
    let r = report(&json);
    assert!(r["ok"].as_u64().unwrap() > 100, "what was measured is kept");
    assert!(r["failure"].is_string());
}

#[test]
fn wrong_correlation_ids_are_counted_as_errors_not_latency() {
    let server = spawn(Behaviour::WrongCorrelation);
    let json = common::json_path("wrong-correlation");
    let out = loadgen(
        &[
            "--target",
            &server.target(),
            "--tool",
            "echo",
            "--requests",
            "20",
            "--concurrency",
            "4",
            "--timeout",
            "200ms",
        ],
        &json,
    );
    assert!(
        out.status.success(),
        "response errors are reported, not fatal"
    );
    let r = report(&json);
    let k = &r["errors_by_kind"];
    assert_eq!(k["unknown_correlation"], 20, "{r}");
    assert_eq!(k["timeout"], 20, "the real requests never got an answer");
    assert_eq!(r["ok"], 0);
    assert!(r["latency_us"]["max"].is_null(), "errors are never latency");
}

#[test]
fn wrong_response_kind_is_counted_as_an_error() {
    let server = spawn(Behaviour::WrongKind);
    let json = common::json_path("wrong-kind");
    let out = loadgen(
        &[
            "--target",
            &server.target(),
            "--tool",
            "echo",
            "--requests",
            "50",
            "--concurrency",
            "5",
        ],
        &json,
    );
    assert!(out.status.success());
    let r = report(&json);
    assert_eq!(r["errors_by_kind"]["kind_mismatch"], 50, "{r}");
    assert_eq!(r["requests"], 50);
    assert_eq!(r["ok"], 0);
}

#[test]
fn answers_after_the_timeout_are_late_not_unknown_correlations() {
    let _serial = serial();
    // Every answer comes 400 ms after its request; the generator gives up
    // after 100 ms. Two in flight and 40 requests: the run lasts about
    // 2 s, so most answers arrive while the connection is still read.
    let server = spawn(Behaviour::Stall {
        delay: Duration::from_millis(400),
        period: Duration::from_secs(3600),
        stall: Duration::ZERO,
    });
    let json = common::json_path("late-answers");
    let out = loadgen(
        &[
            "--target",
            &server.target(),
            "--tool",
            "echo",
            "--requests",
            "40",
            "--concurrency",
            "2",
            "--timeout",
            "100ms",
        ],
        &json,
    );
    assert!(out.status.success(), "timeouts are reported, not fatal");
    let r = report(&json);
    let k = &r["errors_by_kind"];
    assert_eq!(k["timeout"], 40, "{r}");
    assert!(
        k.get("unknown_correlation").is_none(),
        "a late answer is not a second error: {r}"
    );
    assert_eq!(r["errors"], 40, "each request counted once: {r}");
    let late = r["late_responses"].as_u64().unwrap();
    assert!((10..=40).contains(&late), "late answers counted: {r}");
    assert_eq!(r["ok"], 0);
    assert!(
        r["latency_us"]["max"].is_null(),
        "late answers are not latency"
    );
}
