//! The `grpc://` target against the real broker binary on loopback: closed
//! and open loop with zero errors, gRPC statuses counted by kind, and
//! Ctrl-C writing partial results with exit status 130.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::broker::Broker;
use common::serial;

fn json_path(name: &str) -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("grpc-{name}-{}.json", std::process::id()))
}

fn loadgen(args: &[&str], json: &Path) -> (Output, serde_json::Value) {
    let out = Command::new(env!("CARGO_BIN_EXE_mcp-loadgen"))
        .args(args)
        .arg("--json")
        .arg(json)
        .arg("--quiet")
        .output()
        .expect("run mcp-loadgen");
    eprintln!(
        "mcp-loadgen {args:?}\n--- stdout\n{}--- stderr\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(json).expect("the JSON report is written");
    let _ = std::fs::remove_file(json);
    (out, serde_json::from_str(&text).unwrap())
}

#[test]
fn closed_loop_echo_calls_over_grpc_have_zero_errors() {
    let _g = serial();
    let b = Broker::start();
    let (out, r) = loadgen(
        &[
            "--target",
            &b.grpc_target(),
            "--tool",
            "echo",
            "--args",
            r#"{"text":"hello","n":1}"#,
            "--connections",
            "4",
            "--threads",
            "2",
            "--concurrency",
            "64",
            "--requests",
            "5000",
            "--duration",
            "120s",
        ],
        &json_path("closed"),
    );
    assert!(out.status.success(), "{r}");
    assert_eq!(r["errors"], 0, "{r}");
    assert_eq!(r["requests"], 5000, "{r}");
    assert_eq!(r["ok"], 5000, "{r}");
    assert_eq!(r["mode"], "closed");
    assert_eq!(r["connections"], 4);
    assert!(r["latency_us"]["p50"].as_u64().unwrap() > 0, "{r}");
    assert!(r["failure"].is_null(), "{r}");
}

#[test]
fn open_loop_over_grpc_offers_the_asked_rate() {
    let _g = serial();
    let b = Broker::start();
    let (out, r) = loadgen(
        &[
            "--target",
            &b.grpc_target(),
            "--tool",
            "echo",
            "--args",
            r#"{"text":"hello"}"#,
            "--connections",
            "2",
            "--rate",
            "400",
            "--duration",
            "2s",
        ],
        &json_path("open"),
    );
    assert!(out.status.success(), "{r}");
    assert_eq!(r["mode"], "open");
    assert_eq!(r["errors"], 0, "{r}");
    let offered = r["offered_rps"].as_f64().unwrap();
    assert!((offered - 400.0).abs() <= 20.0, "offered {offered}: {r}");
    let requests = r["requests"].as_u64().unwrap();
    assert!((760..=840).contains(&requests), "{r}");
    assert!(r["send_lag_us"]["p50"].is_u64(), "{r}");
}

#[test]
fn a_missing_tool_is_counted_as_a_grpc_status_kind() {
    let _g = serial();
    let b = Broker::start();
    let (out, r) = loadgen(
        &[
            "--target",
            &b.grpc_target(),
            "--tool",
            "no_such_tool",
            "--concurrency",
            "4",
            "--requests",
            "200",
        ],
        &json_path("not-found"),
    );
    // Error answers are results, not a failed run.
    assert!(out.status.success(), "{r}");
    assert_eq!(r["requests"], 200, "{r}");
    assert_eq!(r["ok"], 0, "{r}");
    assert_eq!(r["errors"], 200, "{r}");
    assert_eq!(r["errors_by_kind"]["grpc_not_found"], 200, "{r}");
    // Never folded into latency.
    assert!(r["latency_us"]["max"].is_null(), "{r}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("grpc_not_found: 200"),
        "the summary lists the kind"
    );
}

#[test]
fn ctrl_c_stops_the_run_writes_partial_results_and_exits_130() {
    let _g = serial();
    let b = Broker::start();
    let json = json_path("sigint");
    let hlog = json.with_extension("hlog");
    let mut child = Command::new(env!("CARGO_BIN_EXE_mcp-loadgen"))
        .args(["--target", &b.grpc_target(), "--tool", "echo"])
        .args(["--rate", "300", "--duration", "120s", "--json"])
        .arg(&json)
        .arg("--hlog")
        .arg(&hlog)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn mcp-loadgen");
    // Progress lines (one a second, stderr is not a terminal) show the run
    // is under way: interrupt it after the first one.
    let stderr = child.stderr.take().expect("piped stderr");
    let (tx, rx) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut all = String::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.starts_with("[") {
                let _ = tx.send(());
            }
            all.push_str(&line);
            all.push('\n');
        }
        all
    });
    rx.recv_timeout(Duration::from_secs(60))
        .expect("a progress line within 60 s");
    let status = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .expect("run kill(1)");
    assert!(status.success());
    let (wtx, wrx) = mpsc::channel();
    std::thread::spawn(move || {
        let out = child.wait_with_output();
        let _ = wtx.send(out);
    });
    let out = wrx
        .recv_timeout(Duration::from_secs(30))
        .expect("mcp-loadgen exits within 30 s of Ctrl-C")
        .expect("wait for mcp-loadgen");
    let err = reader.join().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("--- stdout\n{stdout}--- stderr\n{err}");
    assert_eq!(out.status.code(), Some(130), "{err}");
    assert!(stdout.contains("requests"), "the summary is printed");
    assert!(err.contains("interrupted"), "{err}");
    let text = std::fs::read_to_string(&json).expect("the JSON report is written");
    let _ = std::fs::remove_file(&json);
    let r: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert!(
        r["failure"].as_str().unwrap().contains("interrupted"),
        "{r}"
    );
    assert_eq!(r["errors"], 0, "outstanding calls drained: {r}");
    assert!(r["requests"].as_u64().unwrap() >= 200, "{r}");
    assert!(r["duration_s"].as_f64().unwrap() < 60.0, "{r}");
    // The rate stays what was sent until the interrupt, not diluted by the
    // 120 s that were asked for.
    let offered = r["offered_rps"].as_f64().unwrap();
    assert!((offered - 300.0).abs() <= 30.0, "offered {offered}: {r}");
    let log = std::fs::read_to_string(&hlog).expect("the interval log is written");
    let _ = std::fs::remove_file(&hlog);
    assert!(log.contains("#[StartTime:"), "{log}");
    assert!(
        log.lines()
            .any(|l| !l.starts_with('#') && !l.starts_with('"')),
        "at least one interval: {log}"
    );
}

#[test]
fn broker_killed_mid_run_stops_the_grpc_run_with_partial_results() {
    let _g = serial();
    let mut b = Broker::start();
    let json = json_path("killed");
    let mut child = Command::new(env!("CARGO_BIN_EXE_mcp-loadgen"))
        .args(["--target", &b.grpc_target(), "--tool", "echo"])
        .args(["--rate", "300", "--duration", "120s", "--json"])
        .arg(&json)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn mcp-loadgen");
    let stderr = child.stderr.take().expect("piped stderr");
    let (tx, rx) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut all = String::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.starts_with("[") {
                let _ = tx.send(());
            }
            all.push_str(&line);
            all.push('\n');
        }
        all
    });
    rx.recv_timeout(Duration::from_secs(60))
        .expect("a progress line within 60 s");
    b.child.kill().expect("kill the broker");
    let (wtx, wrx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = wtx.send(child.wait());
    });
    let status = wrx
        .recv_timeout(Duration::from_secs(30))
        .expect("mcp-loadgen stops within 30 s of losing the broker")
        .expect("wait for mcp-loadgen");
    let err = reader.join().unwrap();
    eprintln!("--- stderr\n{err}");
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(err.contains("connection to grpc://"), "{err}");
    let text = std::fs::read_to_string(&json).expect("the JSON report is written");
    let _ = std::fs::remove_file(&json);
    let r: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert!(r["failure"].as_str().unwrap().contains("failed"), "{r}");
    assert!(
        r["ok"].as_u64().unwrap() >= 200,
        "partial results kept: {r}"
    );
    let offered = r["offered_rps"].as_f64().unwrap();
    assert!(
        (offered - 300.0).abs() <= 45.0,
        "offered counts the run until the failure only: {offered}: {r}"
    );
}
