//! Abuse of the frame edge by clients nobody here controls (issue 18):
//! clients that never read, pipelines that outrun the in-flight bound,
//! slow-but-healthy pipelining, shutdown with answers still unwritten, and
//! a broker bug (a panic) in one request. Each test drives the real binary
//! on loopback; `docs/abuse.md` lists them with the outcome they prove.

mod common;

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::{Broker, Client, error_code, tool_text};
use mcp_schema::client::ResponseView;

/// The bundled echo router plus the chaos router (slow and failing tools),
/// with frame-edge limits set by the test.
fn config(frames: &str) -> String {
    format!(
        r#"
[frames]
{frames}

[[routers]]
name = "echo"
wasm = "echo.wasm"

[[routers]]
name = "chaos"
wasm = "chaos.wasm"
instances_per_shard = 2
queue_depth = 16
call_deadline = "5s"
"#
    )
}

/// Reads final answers until `n` arrived or EOF; returns them by
/// correlation id (a duplicate is counted, not merged).
fn read_answers(client: &mut Client, n: usize) -> HashMap<String, (usize, Option<i32>)> {
    let mut seen: HashMap<String, (usize, Option<i32>)> = HashMap::new();
    let mut finals = 0;
    while finals < n {
        let Some(f) = client.read_frame() else { break };
        let r = ResponseView::parse(&f).expect("response verifies");
        if !r.is_final() {
            continue;
        }
        finals += 1;
        let e = seen
            .entry(r.correlation_id().to_string())
            .or_insert((0, None));
        e.0 += 1;
        e.1 = r.error().map(|(c, _)| c);
    }
    seen
}

/// A client that writes without ever reading (here: 8 MiB of zero bytes,
/// each 4 of them a zero-length frame that is answered with an error) used
/// to make the broker queue every answer in memory: 640 MB of RSS, kept
/// after the client left. Now the broker stops reading it once its unread
/// answers pass `max_output_bytes_per_connection`, cuts it off after
/// `write_timeout`, and frees what it held.
#[test]
fn a_client_that_never_reads_is_bounded_then_cut_off() {
    let mut broker = Broker::start_with_config(
        &config("max_output_bytes_per_connection = 65536\nwrite_timeout = \"1s\""),
        &["--shards", "1"],
    );
    // Warm up so the baseline includes the pools and buffers of a normal run.
    let mut ok = broker.connect();
    assert_eq!(
        tool_text(&ok.call("echo", &[("x", "1")], None)),
        r#"{"x":1}"#
    );
    let before = broker.rss_bytes();

    let mut hog = TcpStream::connect(broker.frames).unwrap();
    hog.set_write_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let zeros = vec![0u8; 64 << 10];
    let mut sent = 0usize;
    let until = Instant::now() + Duration::from_secs(10);
    // Write until 8 MiB went out, the broker stops taking bytes, or it
    // closes the connection; bounded in time either way.
    while sent < 8 << 20 && Instant::now() < until {
        match hog.write(&zeros) {
            Ok(n) => sent += n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => break,
        }
    }
    // The broker must cut the connection off within write_timeout (plus
    // scheduling slack), and say so in its metrics.
    let deadline = Instant::now() + Duration::from_secs(15);
    while broker.metric_sum("mcp_connections_write_timeout_total") < 1.0 {
        assert!(
            Instant::now() < deadline,
            "the non-reading connection was not closed within write_timeout"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let grown = broker.rss_bytes().saturating_sub(before);
    assert!(
        grown < 48 << 20,
        "RSS grew by {} MiB for one non-reading client ({} KiB sent)",
        grown >> 20,
        sent >> 10
    );
    drop(hog);
    // Everyone else is served as before.
    assert_eq!(
        tool_text(&ok.call("echo", &[("y", "2")], None)),
        r#"{"y":2}"#
    );
    assert!(broker.terminate(Duration::from_secs(15)).success());
}

/// One write carrying 40 slow calls used to be served all at once (the
/// in-flight bound was checked only between reads), overflowing the
/// router's queue with -32000 answers. Now at most
/// `max_in_flight_per_connection` are taken at a time and the rest wait in
/// the buffer: every call succeeds.
#[test]
fn in_flight_bound_holds_within_one_read() {
    let mut broker = Broker::start_with_config(
        &config("max_in_flight_per_connection = 4"),
        &["--shards", "1"],
    );
    let mut c = broker.connect();
    let mut batch = Vec::new();
    let n = 40;
    for _ in 0..n {
        batch.extend_from_slice(&c.tool_call_frame("sleep", &[("ms", "20")], None).1);
    }
    c.send_raw(&batch);
    let seen = read_answers(&mut c, n as usize);
    assert_eq!(seen.len(), n as usize, "answers: {seen:?}");
    for (corr, (count, err)) in &seen {
        assert_eq!(*count, 1, "{corr} answered {count} times");
        assert_eq!(*err, None, "{corr} failed with {err:?}");
    }
    assert!(broker.terminate(Duration::from_secs(15)).success());
}

/// A client that pipelines without pause always leaves part of a frame at
/// the end of a read. The slowloris timer used to count from when the
/// buffer was last empty, which for such a client is never, so a healthy
/// connection was closed after `partial_frame_timeout`. Now it counts from
/// the frame's own first bytes.
#[test]
fn steady_pipelining_is_not_mistaken_for_slowloris() {
    let mut broker = Broker::start_with_config(
        &config("partial_frame_timeout = \"300ms\""),
        &["--shards", "1"],
    );
    let mut c = broker.connect();
    let (_, frame) = c.tool_call_frame("echo", &[("pad", "\"0123456789abcdef\"")], None);
    let mut w = c.stream.try_clone().unwrap();
    let reader = std::thread::spawn(move || {
        let mut c = c;
        let mut n = 0usize;
        while c.read_frame().is_some() {
            n += 1;
        }
        n
    });
    // One frame and one byte every 10 ms for about 1.2 s: each read ends one
    // byte further into a frame, so a partial frame is always held (the
    // buffer would next be empty after `frame.len()` writes), yet every
    // frame completes within 10 ms of its first bytes.
    let total = 120;
    assert!(frame.len() > total, "the stream must not realign");
    let stream: Vec<u8> = frame
        .iter()
        .copied()
        .cycle()
        .take(frame.len() * total)
        .collect();
    for piece in stream.chunks(frame.len() + 1) {
        w.write_all(piece).unwrap();
        std::thread::sleep(Duration::from_millis(10));
    }
    let sent = total;
    w.shutdown(std::net::Shutdown::Write).unwrap();
    let answered = reader.join().unwrap();
    assert_eq!(answered, sent, "the connection was closed mid-stream");
    assert!(broker.terminate(Duration::from_secs(15)).success());
}

/// On SIGTERM a shard used to exit as soon as nothing was in flight,
/// dropping answers its writer had not flushed yet (a client reading
/// slowly lost them). Now every request read before the drain gets exactly
/// one answer on the wire before the connection closes.
#[test]
fn drain_writes_every_answer_before_closing() {
    let mut broker = Broker::start_with_config(
        &config("max_output_bytes_per_connection = 67108864"),
        &["--shards", "1"],
    );
    let mut c = broker.connect();
    let n: u64 = 400;
    let pad = format!("\"{}\"", "x".repeat(16 << 10));
    let mut batch = Vec::new();
    for _ in 0..n {
        batch.extend_from_slice(&c.tool_call_frame("echo", &[("pad", &pad)], None).1);
    }
    // Written from another thread: the broker answers while we send, and
    // we do not read until it has drained.
    let mut w = c.stream.try_clone().unwrap();
    let writer = std::thread::spawn(move || w.write_all(&batch).is_ok());
    let deadline = Instant::now() + Duration::from_secs(30);
    while broker.metric_sum("mcp_frames_received_total") < n as f64 {
        assert!(
            Instant::now() < deadline,
            "the broker did not read the batch"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(writer.join().unwrap());
    // SIGTERM with ~6.5 MB of answers unread by the client.
    // SAFETY: kill(2) on our own child's pid.
    unsafe { kill(broker.child.id() as i32, 15) };
    std::thread::sleep(Duration::from_millis(300));
    let seen = read_answers(&mut c, n as usize);
    assert_eq!(seen.len(), n as usize, "answers lost in the drain");
    assert!(seen.values().all(|(count, _)| *count == 1));
    // Then the broker closes the connection and exits cleanly.
    let mut rest = Vec::new();
    let _ = c.stream.read_to_end(&mut rest);
    assert!(rest.is_empty());
    let status = broker.wait_exit(Duration::from_secs(15));
    assert!(status.success(), "{status:?}");
}

/// A panic while handling one request used to kill its shard silently. Now
/// that request is answered with -32603 and the shard goes on serving.
#[test]
fn a_panicking_request_fails_alone() {
    let mut broker = Broker::start_with_env(
        &config(""),
        &["--shards", "1"],
        &[("MCP_BROKER_TEST_PANIC_TOOL", "boom")],
    );
    let mut c = broker.connect();
    let r = c.call("boom", &[], None);
    assert_eq!(error_code(&r), Some(-32603));
    assert_eq!(
        tool_text(&c.call("echo", &[("a", "1")], None)),
        r#"{"a":1}"#
    );
    assert_eq!(broker.http_get("/readyz").0, 200);
    assert!(broker.terminate(Duration::from_secs(15)).success());
}

/// A shard thread that dies anyway used to leave `/readyz` at 200 and the
/// process running with hand-offs to it waiting forever. Now readiness
/// fails at once, the surviving shard drains, and the process exits with
/// status 70, for a supervisor to restart it.
#[test]
fn a_dead_shard_fails_readiness_and_exits_nonzero() {
    let mut broker = Broker::start_with_env(
        &config(""),
        &["--shards", "2"],
        &[("MCP_BROKER_TEST_KILL_SHARD_TOOL", "die")],
    );
    assert_eq!(broker.http_get("/readyz").0, 200);
    // Slow calls on both shards (8 connections: all on one shard has odds
    // of 1 in 128), so the survivor has work to drain while readiness is
    // checked.
    let mut slow: Vec<Client> = (0..8).map(|_| broker.connect()).collect();
    for c in slow.iter_mut() {
        let f = c.tool_call_frame("sleep", &[("ms", "3000")], None).1;
        c.send_raw(&f);
    }
    let mut c = broker.connect();
    let f = c.tool_call_frame("die", &[], None).1;
    c.send_raw(&f);
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let (status, body) = broker.http_get("/readyz");
        if status == 503 {
            assert_eq!(body, "not ready: a shard thread died\n");
            break;
        }
        assert!(Instant::now() < deadline, "/readyz still {status}: {body}");
        std::thread::sleep(Duration::from_millis(10));
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = broker.child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "the broker kept running");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(70), "{status:?}");
}

unsafe extern "C" {
    fn kill(pid: i32, sig: i32) -> i32;
}

/// Connections beyond `max_connections_per_shard` are accepted and closed
/// at once (counted and logged); the ones within the bound are served.
#[test]
fn connections_beyond_the_shard_bound_are_closed_at_once() {
    let mut broker =
        Broker::start_with_config(&config("max_connections_per_shard = 2"), &["--shards", "1"]);
    let mut a = broker.connect();
    let mut b = broker.connect();
    // Both are served before the third arrives, so both are counted open.
    assert_eq!(tool_text(&a.call("echo", &[], None)), "{}");
    assert_eq!(tool_text(&b.call("echo", &[], None)), "{}");
    let mut c = broker.connect();
    assert!(c.read_frame().is_none(), "the third connection is closed");
    assert_eq!(broker.metric_sum("mcp_connections_refused_total"), 1.0);
    assert_eq!(
        tool_text(&a.call("echo", &[("x", "1")], None)),
        r#"{"x":1}"#
    );
    assert!(broker.terminate(Duration::from_secs(15)).success());
}
