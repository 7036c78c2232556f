//! The admin endpoint against the real binary: request counters carry the
//! outcome the client got, a request handed to its session's owner shard
//! is counted once, rejected frames are counted by reason, and `/readyz`
//! turns 503 while draining.

mod common;

use std::collections::HashMap;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{Broker, error_code};
use mcp_schema::client::RequestHeader;

/// `/metrics` as series → value (comments dropped).
fn scrape(b: &Broker) -> HashMap<String, f64> {
    let (status, body) = b.http_get("/metrics");
    assert_eq!(status, 200);
    body.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}

fn get(m: &HashMap<String, f64>, series: &str) -> f64 {
    *m.get(series)
        .unwrap_or_else(|| panic!("no series {series} in {m:#?}"))
}

#[test]
fn outcomes_hand_offs_and_rejections_are_counted_once_with_their_labels() {
    let b = Broker::start(&["--shards", "2"]);
    let mut c = b.connect();
    for _ in 0..3 {
        c.call("echo", &[("text", "\"hi\"")], None);
    }
    c.call("nosuch", &[], None);
    c.call("fail", &[], None);
    // kv has session affinity: with two shards some of these sessions are
    // owned by the other shard and run there.
    for s in ["s1", "s2", "s3", "s4", "s5", "s6", "s7", "s8"] {
        c.call("put", &[("key", "\"k\""), ("value", "1")], Some(s));
    }
    c.request(None, |e, h| e.ping(h).to_vec());
    // A frame that is not a FlatBuffer: answered at once, never a request.
    c.send_raw(&[8, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8]);
    let f = c.read_frame().expect("an error response");
    assert_eq!(error_code(&f), Some(-32700));

    // Recorded before the response is queued: no wait needed.
    let m = scrape(&b);
    let req = |router: &str, kind: &str, outcome: &str| {
        get(
            &m,
            &format!(
                "mcp_requests_total{{edge=\"frames\",router=\"{router}\",kind=\"{kind}\",outcome=\"{outcome}\"}}"
            ),
        )
    };
    assert_eq!(req("echo", "call_tool", "ok"), 3.0);
    assert_eq!(req("broker", "call_tool", "not_found"), 1.0);
    assert_eq!(req("chaos", "call_tool", "execution_error"), 1.0);
    assert_eq!(req("kv", "call_tool", "ok"), 8.0);
    assert_eq!(req("broker", "ping", "ok"), 1.0);
    let total: f64 = m
        .iter()
        .filter(|(k, _)| k.starts_with("mcp_requests_total{"))
        .map(|(_, v)| v)
        .sum();
    assert_eq!(total, 14.0, "each request exactly once");
    assert_eq!(
        get(
            &m,
            "mcp_request_duration_seconds_count{router=\"kv\",tool=\"put\"}"
        ),
        8.0
    );
    assert_eq!(
        get(
            &m,
            "mcp_request_duration_seconds_count{router=\"broker\",tool=\"other\"}"
        ),
        1.0
    );
    assert_eq!(
        get(&m, "mcp_wasm_call_duration_seconds_count{router=\"kv\"}"),
        8.0
    );
    assert_eq!(
        get(&m, "mcp_frames_rejected_total{reason=\"invalid\"}"),
        1.0
    );
    assert_eq!(get(&m, "mcp_router_calls_total{router=\"echo\"}"), 3.0);
    assert_eq!(get(&m, "mcp_metrics_recording"), 1.0);
    assert_eq!(get(&m, "mcp_ready"), 1.0);
    assert!(
        get(
            &m,
            "mcp_request_duration_hdr_seconds{router=\"echo\",quantile=\"0.5\"}"
        ) > 0.0
    );
}

#[test]
fn readyz_is_unavailable_while_draining_and_healthz_stays_ok() {
    let b = Broker::start(&["--shards", "1"]);
    assert_eq!(b.http_get("/readyz").0, 200);
    // A call that keeps the drain waiting (under chaos's 2 s deadline).
    let mut c = b.connect();
    let (corr, id) = c.header();
    let h = RequestHeader {
        message_id: id,
        correlation_id: Some(&corr),
        session_id: None,
        timeout_ms: 0,
        unix_nanos: 0,
    };
    let f = c.enc.tool_call(&h, id, "sleep", &[("ms", "1500")]).to_vec();
    c.send_raw(&f);
    let deadline = Instant::now() + Duration::from_secs(10);
    while get(&scrape(&b), "mcp_in_flight_requests{shard=\"0\"}") < 1.0 {
        assert!(Instant::now() < deadline, "the call never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    let killed = Command::new("kill")
        .args(["-TERM", &b.child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, body) = b.http_get("/readyz");
        if status == 503 {
            assert!(body.contains("draining"), "{body}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "/readyz still {status} while draining"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(b.http_get("/healthz").0, 200);
    assert_eq!(get(&scrape(&b), "mcp_draining"), 1.0);
    // The call in flight is still answered.
    let r = c.read_final();
    assert_eq!(error_code(&r), None, "the sleep completes during the drain");
}
