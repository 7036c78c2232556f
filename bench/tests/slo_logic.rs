//! bench/slo.py's decisions, run by `cargo test`: the verdict on a probe,
//! the sweep and bisection, and how `--rounds` combines rounds into a
//! goal's figure (`bench/test_slo.py`, Python's unittest, stdlib only).
//!
//! Every capacity figure in the README rests on these rules, so a change
//! to them that reverses a verdict must fail here, not in a report.

use std::process::Command;

#[test]
fn slo_py_decides_as_its_tests_say() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new("python3")
        .arg(dir.join("test_slo.py"))
        .arg("-v")
        .output()
        .expect("python3 runs (scripts/setup installs it)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "bench/test_slo.py failed:\n{text}");
    // unittest says how many ran: a file that stopped defining its tests
    // (or a runner that found none) would otherwise pass.
    let ran: usize = text
        .split("Ran ")
        .nth(1)
        .and_then(|t| t.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no \"Ran N tests\" in:\n{text}"));
    assert!(
        ran >= 21,
        "bench/test_slo.py ran {ran} tests, fewer than its 21:\n{text}"
    );
}
