//! `--bearer-file` on the frame target, against a frame server of known
//! behaviour (`common::bearer`: std threads and `mcp-schema` only): each
//! connection's first frame is an `InitializeRequest` carrying the token,
//! answered before any measured request; a refused initialize fails the
//! run up front, naming the error. (`frames+tls://`: tests/tls.rs; the real
//! broker, every edge: `broker/tests/auth.rs`
//! `mcp_loadgen_sends_its_token_on_every_edge`.)

mod common;

use common::bearer::spawn;

fn token_file(name: &str, content: &str) -> std::path::PathBuf {
    let p = common::json_path(name).with_extension("token");
    std::fs::write(&p, content).unwrap();
    p
}

#[test]
fn each_frame_connection_initializes_with_the_token_before_any_request() {
    let _g = common::serial();
    let (addr, seen) = spawn("good-token");
    let token = token_file("bearer-good", "  good-token\n");
    let json = common::json_path("bearer-good");
    let out = common::loadgen(
        &[
            "--target",
            &format!("frames://{addr}"),
            "--tool",
            "echo",
            "--connections",
            "3",
            "--concurrency",
            "6",
            "--duration",
            "500ms",
            "--bearer-file",
            token.to_str().unwrap(),
        ],
        &json,
    );
    let r = common::report(&json);
    assert!(out.status.success(), "{r}");
    assert_eq!(r["errors"], 0, "the skipped frame is no error: {r}");
    let requests = r["requests"].as_u64().unwrap();
    assert!(requests > 0, "{r}");
    assert_eq!(r["ok"].as_u64(), Some(requests), "{r}");
    let seen = seen.lock().unwrap();
    assert_eq!(
        seen.inits,
        vec![Some("good-token".to_owned()); 3],
        "one initialize per connection, the token trimmed"
    );
    assert!(seen.init_first, "the initialize is the first frame");
    assert_eq!(seen.calls_before_init, 0);
    assert!(seen.calls >= requests, "{seen:?}");
    let _ = std::fs::remove_file(&token);
}

#[test]
fn a_refused_initialize_fails_the_frame_run_before_it_starts() {
    let _g = common::serial();
    let (addr, seen) = spawn("good-token");
    let token = token_file("bearer-bad", "wrong-token\n");
    let json = common::json_path("bearer-bad");
    let out = common::loadgen(
        &[
            "--target",
            &format!("frames://{addr}"),
            "--tool",
            "echo",
            "--duration",
            "2s",
            "--bearer-file",
            token.to_str().unwrap(),
        ],
        &json,
    );
    let r = common::report(&json);
    assert_eq!(out.status.code(), Some(1), "{r}");
    let failure = r["failure"].as_str().unwrap_or_default();
    let stderr = String::from_utf8_lossy(&out.stderr);
    for needle in [
        "initialize",
        "error -32003 (unauthorized)",
        "this test server refuses it",
    ] {
        assert!(failure.contains(needle), "{needle:?} in {failure:?}");
        assert!(stderr.contains(needle), "{needle:?} in {stderr}");
    }
    assert_eq!(r["requests"], 0, "{r}");
    assert_eq!(
        seen.lock().unwrap().calls,
        0,
        "nothing sent after a refusal"
    );
    let _ = std::fs::remove_file(&token);
}

#[test]
fn without_a_bearer_file_no_initialize_is_sent() {
    let _g = common::serial();
    let (addr, seen) = spawn("good-token");
    let json = common::json_path("bearer-none");
    let out = common::loadgen(
        &[
            "--target",
            &format!("frames://{addr}"),
            "--tool",
            "echo",
            "--requests",
            "100",
        ],
        &json,
    );
    let r = common::report(&json);
    assert!(out.status.success(), "{r}");
    assert_eq!(r["ok"], 100, "{r}");
    let seen = seen.lock().unwrap();
    assert!(seen.inits.is_empty(), "{seen:?}");
    assert_eq!(seen.calls, 100);
}
