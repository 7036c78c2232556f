//! The admin endpoint against the real binary: request counters carry the
//! outcome the client got, a request handed to its session's owner shard
//! is counted once, rejected frames are counted by reason, and `/readyz`
//! turns 503 while draining.

mod common;

use std::collections::HashMap;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{Broker, error_code, tool_text};
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

/// A call its pool refuses at once (every instance busy, the queue full)
/// ran nothing: it is counted overloaded, not as a router call's duration,
/// whose histogram it used to pull down exactly when the router saturated.
#[test]
fn calls_refused_as_overloaded_are_no_router_call_durations() {
    let toml = format!(
        "{}\n[[routers]]\nname = \"slow\"\nwasm = \"chaos.wasm\"\ninstances_per_shard = 1\nqueue_depth = 1\n",
        mcp_broker::config::DEFAULT_TOML
    );
    let b = Broker::start_with_config(&toml, &["--shards", "1"]);
    let mut c = b.connect();
    let n = 6;
    let mut batch = Vec::new();
    for i in 0..n {
        let corr = format!("s-{i}");
        let h = RequestHeader {
            message_id: [1; 16],
            correlation_id: Some(&corr),
            session_id: None,
            timeout_ms: 0,
            unix_nanos: 0,
        };
        batch.extend_from_slice(c.enc.tool_call(&h, [2; 16], "sleep", &[("ms", "300")]));
    }
    c.send_raw(&batch);
    let (mut ran, mut refused) = (0, 0);
    for _ in 0..n {
        match error_code(&c.read_final()) {
            None => ran += 1,
            Some(-32000) => refused += 1,
            Some(e) => panic!("unexpected error {e}"),
        }
    }
    assert!(refused >= 1 && ran >= 1, "ran {ran}, refused {refused}");
    let count = |b: &Broker| {
        let m = scrape(b);
        m.iter()
            .filter(|(k, _)| k.starts_with("mcp_wasm_call_duration_seconds_count"))
            .map(|(_, v)| v)
            .sum::<f64>()
    };
    // The shards hand their observations over as scrapes ask.
    assert!(
        common::http::eventually(Duration::from_secs(10), || count(&b) >= ran as f64),
        "{} call durations for {ran} calls that ran",
        count(&b)
    );
    assert_eq!(
        count(&b),
        ran as f64,
        "{refused} refused calls counted as calls"
    );
}

#[test]
fn epoch_ticks_that_find_a_guest_computing_are_counted_by_router() {
    // chaos's `spin` computes for 20 ms: at the default 1 ms tick its guest
    // yields its shard about twenty times. echo's calls take microseconds.
    let b = Broker::start(&["--shards", "1"]);
    let mut c = b.connect();
    let ticks = |m: &HashMap<String, f64>, router: &str| {
        get(
            m,
            &format!("mcp_router_compute_ticks_total{{router=\"{router}\"}}"),
        )
    };
    assert_eq!(ticks(&scrape(&b), "chaos"), 0.0);
    // chaos's `sleep` waits in a host call (WASI clocks): the epoch moves
    // while it waits, and the deadline it finds passed as it resumes is no
    // computing. That counted at least a tick a call; now only a tick the
    // shard spends inside the resumed poll counts, which on a quiet
    // machine is none (0 in 10 calls), and under load (three busy loops on
    // two CPUs: 4 and 8 in 10) what the kernel takes from the poll.
    for _ in 0..20 {
        let r = c.call("sleep", &[("ms", "10")], None);
        assert!(tool_text(&r).starts_with("slept"), "{}", tool_text(&r));
    }
    let slept = ticks(&scrape(&b), "chaos");
    assert!(slept < 20.0, "20 sleeps: {slept} ticks");
    let r = c.call("spin", &[("ms", "20")], None);
    assert!(tool_text(&r).starts_with("spun"), "{}", tool_text(&r));
    for _ in 0..10 {
        assert_eq!(tool_text(&c.call("echo", &[], None)), "{}");
    }
    let m = scrape(&b);
    let chaos = ticks(&m, "chaos");
    // At most one tick a millisecond; at least a few, unless the ticker
    // was kept off the CPU for most of the 20 ms.
    let chaos = chaos - slept;
    assert!((2.0..=25.0).contains(&chaos), "chaos: {chaos} ticks");
    // echo's calls take microseconds: a tick lands in one only when the
    // kernel takes the shard's CPU mid-call, which the other tests of this
    // binary, run beside it on two CPUs, did for 5 of its 10 calls. Fewer
    // than one a call: the ticks are its own, not the spinning guest's.
    assert!(
        ticks(&m, "echo") < 10.0,
        "echo: {} ticks",
        ticks(&m, "echo")
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

/// The broker's resident set, from /proc.
fn rss_kib(b: &Broker) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", b.child.id())).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/PID/status")
}

/// `GET path` on a fresh connection, timed.
fn timed_get(b: &Broker, path: &str) -> (u16, Duration) {
    let t = Instant::now();
    let (status, _) = b.http_get(path);
    (status, t.elapsed())
}

#[test]
fn slowloris_admin_client_does_not_delay_readyz_for_others() {
    use std::io::Write;
    use std::sync::atomic::{AtomicBool, Ordering};
    let b = Broker::start(&["--shards", "1"]);
    let mut slow = std::net::TcpStream::connect(b.metrics).unwrap();
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let (tx, rx) = std::sync::mpsc::channel();
    let trickle = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            // A request head that never ends: one byte a second, for at
            // most 8 s.
            for (i, byte) in b"GET /readyz HTTP/1.1\r\nHost".iter().take(8).enumerate() {
                if stop.load(Ordering::Relaxed) || slow.write_all(&[*byte]).is_err() {
                    return;
                }
                let _ = tx.send(i);
                std::thread::sleep(Duration::from_secs(1));
            }
        })
    };
    // Probe while the trickle is under way (its second byte has gone).
    rx.recv_timeout(Duration::from_secs(5)).unwrap();
    rx.recv_timeout(Duration::from_secs(5)).unwrap();
    for _ in 0..3 {
        let (status, took) = timed_get(&b, "/readyz");
        assert_eq!(status, 200);
        assert!(
            took < Duration::from_secs(1),
            "/readyz took {took:?} behind a slowloris client"
        );
    }
    stop.store(true, Ordering::Relaxed);
    trickle.join().unwrap();
}

/// Sends `GET /aaa…` of `len` bytes with no newline and reads until the
/// server closes (EOF or reset): what it answered, if anything. Panics if
/// it neither answers nor closes within 2 s (it still holds the line).
fn endless_request_line(b: &Broker, len: usize) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(b.metrics).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut line = b"GET /".to_vec();
    line.resize(len, b'a');
    let t = Instant::now();
    // The server may close before taking it all: a failed write is fine.
    let _ = s.write_all(&line);
    let mut answer = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        match s.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => answer.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(e) => panic!(
                "no answer or close within 2 s ({e}) after {:?}",
                t.elapsed()
            ),
        }
    }
    String::from_utf8_lossy(&answer).into_owned()
}

#[test]
fn megabyte_request_line_is_refused_without_growing_the_broker() {
    let b = Broker::start(&["--shards", "1"]);
    // The endpoint's own first-use allocations are not the attack's.
    assert_eq!(b.http_get("/healthz").0, 200);
    let answer = endless_request_line(&b, 1 << 20);
    if let Some(status) = answer.split_whitespace().nth(1) {
        assert!(status == "431" || status == "400", "answered {answer:?}");
    }
    // Memory: a line far larger than the broker's background RSS drift
    // (a few MiB while it settles), so a server that buffered it shows.
    let before = rss_kib(&b);
    endless_request_line(&b, 32 << 20);
    let after = rss_kib(&b);
    assert!(
        after < before + 8 * 1024,
        "RSS grew from {before} KiB to {after} KiB for a 32 MiB request line"
    );
    // And the endpoint still answers.
    assert_eq!(b.http_get("/readyz").0, 200);
}

#[test]
fn idle_admin_connections_do_not_block_healthz() {
    let b = Broker::start(&["--shards", "1"]);
    // Below the endpoint's connection bound (64), so every one of them is
    // served, and each says nothing.
    let idle: Vec<_> = (0..32)
        .map(|_| std::net::TcpStream::connect(b.metrics).unwrap())
        .collect();
    for _ in 0..3 {
        let (status, took) = timed_get(&b, "/healthz");
        assert_eq!(status, 200);
        assert!(
            took < Duration::from_secs(1),
            "/healthz took {took:?} behind {} idle connections",
            idle.len()
        );
    }
    drop(idle);
}

#[test]
fn admin_connection_serves_several_requests_with_keep_alive() {
    use std::io::{BufRead, BufReader, Read, Write};
    let b = Broker::start(&["--shards", "1"]);
    let s = std::net::TcpStream::connect(b.metrics).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut w = s.try_clone().unwrap();
    let mut r = BufReader::new(s);
    for (path, want) in [("/healthz", 200), ("/readyz", 200), ("/nope", 404)] {
        write!(w, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut status = String::new();
        r.read_line(&mut status).unwrap();
        assert!(
            status.starts_with(&format!("HTTP/1.1 {want} ")),
            "{path}: {status:?}"
        );
        let mut len = 0usize;
        loop {
            let mut h = String::new();
            r.read_line(&mut h).unwrap();
            if h == "\r\n" {
                break;
            }
            if let Some(v) = h.to_ascii_lowercase().strip_prefix("content-length:") {
                len = v.trim().parse().unwrap();
            }
        }
        let mut body = vec![0u8; len];
        r.read_exact(&mut body).unwrap();
    }
    write!(
        w,
        "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut rest = String::new();
    r.read_to_string(&mut rest).unwrap();
    assert!(rest.starts_with("HTTP/1.1 405 "), "{rest:?}");
    assert!(rest.to_ascii_lowercase().contains("allow: get"), "{rest:?}");
}
