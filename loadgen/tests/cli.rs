//! The command line and the report's bookkeeping: a bad argument of any kind
//! exits 1 with a JSON report, output paths are checked before the run, and
//! a request quota that ends the run early is the run's length.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{Behaviour, loadgen, report, spawn};

const PROMPT: Behaviour = Behaviour::Stall {
    delay: Duration::ZERO,
    period: Duration::from_secs(1),
    stall: Duration::ZERO,
};

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Values the argument parser itself refuses (not a number, a unit it does
/// not know, flags that exclude each other) are bad arguments like those
/// found later: exit 1 and a report saying why, as docs/loadgen.md promises
/// for every bad argument.
#[test]
fn arguments_the_parser_refuses_exit_1_with_a_report() {
    for (name, args, says) in [
        ("rate-abc", &["--rate", "abc"][..], "--rate"),
        ("duration-5x", &["--duration", "5x"][..], "--duration"),
        (
            "workload-and-tool",
            &["--workload", "w.toml"][..],
            "--workload",
        ),
    ] {
        let json = common::json_path(&format!("cli-{name}"));
        let mut all = vec!["--target", "frames://127.0.0.1:1", "--tool", "echo"];
        all.extend_from_slice(args);
        let out = loadgen(&all, &json);
        assert_eq!(out.status.code(), Some(1), "{name}: {}", stderr(&out));
        assert!(stderr(&out).contains(says), "{name}: {}", stderr(&out));
        let r = report(&json);
        let failure = r["failure"].as_str().unwrap_or_else(|| panic!("{r}"));
        assert!(failure.contains(says), "{name}: {failure}");
        assert_eq!(r["target"], "frames://127.0.0.1:1", "{r}");
        assert_eq!(r["requests"], 0, "{r}");
    }
    // `--json=PATH` is found too.
    let json = common::json_path("cli-json-equals");
    let out = Command::new(env!("CARGO_BIN_EXE_mcp-loadgen"))
        .args(["--target", "frames://127.0.0.1:1", "--rate", "-5"])
        .arg(format!("--json={}", json.display()))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(report(&json)["failure"].is_string());
    // Asking for help is not an error.
    for flag in ["--help", "--version"] {
        let out = Command::new(env!("CARGO_BIN_EXE_mcp-loadgen"))
            .arg(flag)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{flag}");
        assert!(!out.stdout.is_empty(), "{flag}");
    }
}

/// An interval log or JSON report that cannot be written is found before
/// anything connects, not after a run whose results it then loses.
#[test]
fn output_paths_that_cannot_be_written_fail_before_the_run() {
    let server = spawn(PROMPT);
    let missing_dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("no-such-dir");
    let hlog = missing_dir.join("x.hlog");
    let json = common::json_path("cli-bad-hlog");
    let t0 = Instant::now();
    let out = loadgen(
        &[
            "--target",
            &server.target(),
            "--tool",
            "echo",
            "--rate",
            "100",
            "--duration",
            "10s",
            "--hlog",
            hlog.to_str().unwrap(),
        ],
        &json,
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        t0.elapsed() < Duration::from_secs(8),
        "it ran the 10 s first"
    );
    assert!(
        stderr(&out).contains("cannot create the interval log"),
        "{}",
        stderr(&out)
    );
    let r = report(&json);
    let failure = r["failure"].as_str().unwrap_or_else(|| panic!("{r}"));
    assert!(failure.contains("interval log"), "{failure}");
    assert_eq!(r["sent"], 0, "{r}");

    let t0 = Instant::now();
    let out = loadgen(
        &[
            "--target",
            &server.target(),
            "--tool",
            "echo",
            "--rate",
            "100",
            "--duration",
            "10s",
        ],
        &missing_dir.join("x.json"),
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        t0.elapsed() < Duration::from_secs(8),
        "it ran the 10 s first"
    );
    assert!(
        stderr(&out).contains("cannot write the JSON report"),
        "{}",
        stderr(&out)
    );
}

/// `--requests` with `--duration`: the quota, reached long before the
/// duration, ends sending, and the report's length and rates are the run's,
/// not the duration's.
#[test]
fn a_request_quota_reached_first_is_the_runs_length() {
    let server = spawn(PROMPT);
    let json = common::json_path("cli-quota");
    let out = loadgen(
        &[
            "--target",
            &server.target(),
            "--tool",
            "echo",
            "--requests",
            "200",
            "--duration",
            "30s",
        ],
        &json,
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let r = report(&json);
    assert_eq!(r["requests"], 200, "{r}");
    let secs = r["duration_s"].as_f64().unwrap();
    assert!(secs < 20.0, "the report says the run took {secs} s: {r}");
    let achieved = r["achieved_rps"].as_f64().unwrap();
    assert!(
        (achieved * secs - 200.0).abs() < 1.0,
        "achieved {achieved} req/s over {secs} s is not the 200 requests: {r}"
    );
}

/// With no successful response there is no latency: the report says so
/// (`null`, and `-` in the summary), rather than an excellent 0 µs.
#[test]
fn a_run_without_a_success_has_no_latency_figures() {
    let server = spawn(Behaviour::WrongKind);
    let json = common::json_path("cli-no-success");
    let out = loadgen(
        &[
            "--target",
            &server.target(),
            "--tool",
            "echo",
            "--requests",
            "20",
        ],
        &json,
    );
    let r = report(&json);
    assert_eq!(r["ok"], 0, "{r}");
    for k in ["min", "mean", "p50", "p99", "p999", "max"] {
        assert!(r["latency_us"][k].is_null(), "{k}: {r}");
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("p99  -"), "{stdout}");
}
