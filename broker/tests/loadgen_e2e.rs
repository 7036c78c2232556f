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

#[test]
fn one_hundred_thousand_requests_with_zero_errors_and_matching_correlation_ids() {
    let b = Broker::start(&["--shards", "2"]);
    let json = std::env::temp_dir().join(format!("loadgen-e2e-{}.json", std::process::id()));
    let out = Command::new(loadgen())
        .args(["--target", &format!("frames://{}", b.frames)])
        .args(["--tool", "echo", "--args", r#"{"text":"hello","n":1}"#])
        .args([
            "--connections",
            "8",
            "--concurrency",
            "256",
            "--requests",
            "100000",
        ])
        .args(["--duration", "120s", "-q", "--json"])
        .arg(&json)
        .output()
        .expect("run mcp-loadgen");
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json).expect("JSON report written")).unwrap();
    let _ = std::fs::remove_file(&json);
    assert!(
        out.status.success(),
        "mcp-loadgen failed: {}\n{report}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Every response was verified and matched to its request by correlation
    // id: a mismatch, unknown id or wrong kind would be counted in `errors`.
    assert_eq!(report["errors"], 0, "{report}");
    assert_eq!(report["requests"], 100_000, "{report}");
    assert!(report["latency_us"]["p50"].as_f64().unwrap() > 0.0);
}

/// `--mcp-version 2026-07-28` on the HTTP edge: stateless POSTs routed by
/// their `Mcp-Method`/`Mcp-Name` headers (with a non-ASCII argument), every answer checked; and the session era
/// beside it on the same broker.
#[test]
fn both_protocol_eras_load_the_http_edge_with_zero_errors() {
    let b = Broker::start(&[]);
    for version in ["2025-11-25", "2026-07-28"] {
        let json =
            std::env::temp_dir().join(format!("loadgen-e2e-{version}-{}.json", std::process::id()));
        let out = Command::new(loadgen())
            .args(["--target", &format!("http://{}/mcp", b.http)])
            .args(["--mcp-version", version])
            .args(["--tool", "echo_text", "--args", r#"{"text":"héllo"}"#])
            .args(["--connections", "4", "--concurrency", "4"])
            .args(["--requests", "2000", "--duration", "60s", "-q", "--json"])
            .arg(&json)
            .output()
            .expect("run mcp-loadgen");
        let report: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&json).expect("JSON report written")).unwrap();
        let _ = std::fs::remove_file(&json);
        assert!(
            out.status.success(),
            "{version}: {}\n{report}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(report["errors"], 0, "{version}: {report}");
        assert_eq!(report["requests"], 2000, "{version}: {report}");
    }
}
