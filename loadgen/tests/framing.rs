//! Responses cut across reads at any point (in the length prefix, in the
//! body) are reassembled: no frame is lost, none is misread.

mod common;

use common::{Behaviour, loadgen, report, spawn};

#[test]
fn frames_split_across_reads_are_reassembled() {
    let server = spawn(Behaviour::Fragmented);
    let json = common::json_path("fragmented");
    let out = loadgen(
        &[
            "--target",
            &server.target(),
            "--tool",
            "echo",
            "--requests",
            "3000",
            "--connections",
            "2",
            "--concurrency",
            "16",
        ],
        &json,
    );
    assert!(out.status.success());
    let r = report(&json);
    assert_eq!(r["ok"], 3000, "{r}");
    assert_eq!(r["errors"], 0, "{r}");
}
