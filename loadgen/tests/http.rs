//! The `http://` target against real MCP servers: a Python FastMCP server
//! (the `mcp` SDK, Streamable HTTP, SSE and JSON answers), and against HTTP
//! servers of known bad behaviour (404/500, closed connections, garbage SSE,
//! wrong ids, no answer at all): each is counted as what it is, nothing
//! hangs, and the run ends on time.
//!
//! And against the real broker's HTTP edge (`mcp-broker --http-listen`).
//!
//! The FastMCP tests need Python with the `mcp` package: the venv
//! `.tools/mcp1` that `scripts/setup` creates, else `python3`. The broker
//! tests need `mcp-broker` built beside `mcp-loadgen` and the routers built
//! (`scripts/build-routers`).

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use common::broker::Broker;
use common::{json_path, loadgen, report, serial};

/// The Python with `mcp` installed, or a panic that says how to get one.
fn python() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let venv = root.join(".tools/mcp1/bin/python");
    let py = if venv.exists() {
        venv
    } else {
        PathBuf::from("python3")
    };
    let ok = Command::new(&py)
        .args(["-c", "import mcp.server.fastmcp, uvicorn"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "{} cannot `import mcp.server.fastmcp, uvicorn`: run scripts/setup (it creates \
         .tools/mcp1 with the PyPI `mcp` 1.x SDK), or `pip install 'mcp>=1.9,<2'`",
        py.display()
    );
    py
}

/// `bench/servers/fastmcp_echo.py` on a free port; killed on drop.
struct FastMcp {
    child: Child,
    addr: String,
}

impl FastMcp {
    fn start(extra: &[&str]) -> Self {
        let script =
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../bench/servers/fastmcp_echo.py");
        let mut child = Command::new(python())
            .arg(script)
            .arg("0")
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start fastmcp_echo.py");
        let out = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) if line.contains("ready") => {
                    let addr = line
                        .split_whitespace()
                        .find_map(|w| w.strip_prefix("http="))
                        .expect("the ready line names http=HOST:PORT")
                        .to_owned();
                    return Self { child, addr };
                }
                Ok(_) => {}
                Err(_) => {
                    let _ = child.kill();
                    panic!("fastmcp_echo.py printed no ready line within 30 s");
                }
            }
        }
    }

    fn target(&self) -> String {
        format!("http://{}/mcp", self.addr)
    }
}

impl Drop for FastMcp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn n(v: &serde_json::Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

#[test]
fn fastmcp_sse_answers_are_all_checked_and_ok() {
    let _g = serial();
    let server = FastMcp::start(&[]);
    let json = json_path("http-fastmcp-sse");
    let out = loadgen(
        &[
            "--target",
            &server.target(),
            "--tool",
            "echo",
            "--args",
            r#"{"text":"hello","n":3}"#,
            "--connections",
            "2",
            "--requests",
            "200",
        ],
        &json,
    );
    assert!(out.status.success());
    let r = report(&json);
    assert_eq!(n(&r["ok"]), 200, "{r:#}");
    assert_eq!(n(&r["errors"]), 0, "{r:#}");
    assert_eq!(r["failure"], serde_json::Value::Null);
}

#[test]
fn fastmcp_json_answers_and_a_mixed_workload_are_checked_per_method() {
    let _g = serial();
    let server = FastMcp::start(&["--json"]);
    let wl = json_path("http-fastmcp-workload").with_extension("toml");
    std::fs::write(
        &wl,
        r#"
        [[op]]
        kind = "tool"
        name = "echo"
        args = { text = { random = "string", len = [4, 64] }, k = { random = "key", prefix = "u", count = 9 } }
        [[op]]
        kind = "tool"
        name = "echo_text"
        args = { text = "hi" }
        [[op]]
        kind = "list"
        list = "tools"
        [[op]]
        kind = "ping"
        [[op]]
        kind = "tool"
        name = "no_such_tool"
        "#,
    )
    .unwrap();
    let json = json_path("http-fastmcp-json");
    let out = loadgen(
        &[
            "--target",
            &server.target(),
            "--workload",
            wl.to_str().unwrap(),
            "--connections",
            "2",
            "--requests",
            "300",
        ],
        &json,
    );
    assert!(out.status.success());
    let r = report(&json);
    let k = &r["errors_by_kind"];
    // FastMCP answers an unknown tool with an isError result; everything
    // else succeeds.
    let tool_errors = n(&k["tool_error"]);
    assert!(tool_errors > 20, "{r:#}");
    assert_eq!(n(&r["ok"]) + tool_errors, 300, "{r:#}");
    assert_eq!(n(&r["errors"]), tool_errors, "{r:#}");
}

#[test]
fn fastmcp_answers_pipelined_requests_in_order() {
    let _g = serial();
    let server = FastMcp::start(&["--json"]);
    let json = json_path("http-fastmcp-pipeline");
    let out = loadgen(
        &[
            "--target",
            &server.target(),
            "--tool",
            "echo",
            "--args",
            r#"{"text":"hello"}"#,
            "--connections",
            "2",
            "--pipeline",
            "4",
            "--requests",
            "200",
        ],
        &json,
    );
    assert!(out.status.success());
    let r = report(&json);
    assert_eq!(n(&r["concurrency"]), 8);
    assert_eq!(n(&r["ok"]), 200, "{r:#}");
    assert_eq!(n(&r["errors"]), 0, "{r:#}");
}

#[test]
fn fastmcp_open_loop_keeps_its_schedule() {
    let _g = serial();
    let server = FastMcp::start(&[]);
    let json = json_path("http-fastmcp-open");
    let out = loadgen(
        &[
            "--target",
            &server.target(),
            "--tool",
            "echo",
            "--args",
            r#"{"text":"hello"}"#,
            "--connections",
            "4",
            "--rate",
            "50",
            "--duration",
            "2s",
        ],
        &json,
    );
    assert!(out.status.success());
    let r = report(&json);
    assert_eq!(r["mode"], "rate_limited_closed");
    assert_eq!(n(&r["scheduled"]), 100, "{r:#}");
    assert_eq!(n(&r["ok"]), 100, "{r:#}");
}

// ---- HTTP servers of known (mis)behaviour ----------------------------------

#[derive(Clone, Copy, Debug)]
enum Bad {
    /// Answer every tools/call with this status (and a short text body).
    Status(u16),
    /// Read a tools/call and close the connection without answering.
    Close,
    /// Answer 200 `text/event-stream` with lines that are no JSON-RPC, then
    /// end the stream without the response.
    GarbageSse,
    /// Answer with a JSON response carrying another id.
    WrongId,
    /// Never answer a tools/call (keep the connection open).
    Hang,
    /// Answer over SSE: two progress notifications, then the response.
    ProgressThenOk,
    /// Answer `initialize` and every call over SSE, and never end the
    /// stream (no last chunk).
    OpenStream,
    /// Answer calls, but a session's calls after this many get 404 (the
    /// session expired); `initialize` makes a new session each time.
    Expire(usize),
    /// Answer each call over SSE at once, then end the stream this long
    /// after: the connection is busy until the body's end.
    LateEnd(Duration),
    /// Answer each call after this long: a server slower than the rate.
    Slow(Duration),
}

struct Counters {
    inits: AtomicUsize,
    /// Calls per session id (`Expire`).
    per_session: std::sync::Mutex<std::collections::HashMap<String, usize>>,
    deletes: AtomicUsize,
    calls: AtomicUsize,
    /// Requests that lacked the session or protocol-version header.
    unsessioned: AtomicUsize,
}

const SESSION: &str = "sess-4f2a";

/// Reads one request (head and Content-Length body); `None` at EOF.
fn read_request(r: &mut BufReader<TcpStream>) -> Option<(String, String)> {
    let mut head = String::new();
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).ok()? == 0 {
            return None;
        }
        if line == "\r\n" {
            break;
        }
        head.push_str(&line);
    }
    let len = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse::<usize>().ok())?
        })
        .unwrap_or(0);
    let mut body = vec![0; len];
    r.read_exact(&mut body).ok()?;
    Some((head, String::from_utf8(body).ok()?))
}

fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

fn respond(w: &mut TcpStream, status: &str, ctype: &str, extra: &str, body: &str) -> bool {
    let msg = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\n{extra}Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    w.write_all(msg.as_bytes()).is_ok()
}

fn chunked(w: &mut TcpStream, pieces: &[&str]) -> bool {
    chunked_with(w, "", pieces, true)
}

fn chunked_with(w: &mut TcpStream, extra: &str, pieces: &[&str], end: bool) -> bool {
    let mut msg = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n{extra}Transfer-Encoding: chunked\r\n\r\n",
    );
    for p in pieces {
        msg.push_str(&format!("{:x}\r\n{p}\r\n", p.len()));
    }
    if end {
        msg.push_str("0\r\n\r\n");
    }
    w.write_all(msg.as_bytes()).is_ok()
}

fn serve_conn(s: TcpStream, bad: Bad, c: Arc<Counters>) {
    let mut w = s.try_clone().unwrap();
    let mut r = BufReader::new(s);
    while let Some((head, body)) = read_request(&mut r) {
        if head.starts_with("DELETE ") {
            c.deletes.fetch_add(1, Ordering::SeqCst);
            respond(&mut w, "200 OK", "text/plain", "", "");
            continue;
        }
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        let method = v["method"].as_str().unwrap_or_default();
        let session = match bad {
            Bad::Expire(_) => header(&head, "mcp-session-id").unwrap_or_default(),
            _ => SESSION,
        };
        if method == "initialize" {
            let k = c.inits.fetch_add(1, Ordering::SeqCst);
            let session = match bad {
                Bad::Expire(_) => format!("sess-{k}"),
                _ => SESSION.to_owned(),
            };
            let ok = format!(
                r#"{{"jsonrpc":"2.0","id":{},"result":{{"protocolVersion":"2025-06-18","capabilities":{{"tools":{{}}}},"serverInfo":{{"name":"bad","version":"0"}}}}}}"#,
                v["id"]
            );
            let extra = format!("Mcp-Session-Id: {session}\r\n");
            let alive = if matches!(bad, Bad::OpenStream) {
                chunked_with(&mut w, &extra, &[&format!("data: {ok}\n\n")], false)
            } else {
                respond(&mut w, "200 OK", "application/json", &extra, &ok)
            };
            if !alive {
                return;
            }
            continue;
        }
        if header(&head, "mcp-session-id") != Some(session)
            || !session.starts_with("sess-")
            || header(&head, "mcp-protocol-version") != Some("2025-06-18")
        {
            c.unsessioned.fetch_add(1, Ordering::SeqCst);
        }
        if method == "notifications/initialized" {
            respond(&mut w, "202 Accepted", "text/plain", "", "");
            continue;
        }
        c.calls.fetch_add(1, Ordering::SeqCst);
        let id = &v["id"];
        let ok_result = format!(
            r#"{{"jsonrpc":"2.0","id":{id},"result":{{"content":[{{"type":"text","text":"ok"}}]}}}}"#
        );
        let alive = match bad {
            Bad::Status(code) => respond(
                &mut w,
                &format!("{code} Nope"),
                "text/plain",
                "",
                "no such thing",
            ),
            Bad::Close => return,
            Bad::GarbageSse => chunked(
                &mut w,
                &[
                    ": keep-alive\r\n\r\n",
                    "data: {not json\r\n\r\n",
                    "event: message\ndata: \u{1}\u{2}garbage\n\n",
                    "nonsense line without colon\n\n",
                ],
            ),
            Bad::WrongId => respond(
                &mut w,
                "200 OK",
                "application/json",
                "",
                &ok_result.replacen(&format!(r#""id":{id}"#), r#""id":999999"#, 1),
            ),
            Bad::Hang => {
                // Hold the connection until the client drops it.
                let mut sink = [0u8; 1024];
                while r.get_mut().read(&mut sink).is_ok_and(|n| n > 0) {}
                return;
            }
            Bad::ProgressThenOk => chunked(
                &mut w,
                &[
                    // A 2025-11-25 priming event: an id and empty data.
                    "id: 7-0\r\ndata:\r\n\r\n",
                    "event: message\r\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"progressToken\":1,\"progress\":1}}\r\n\r\n",
                    "data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\r\ndata: \"params\":{\"level\":\"info\",\"data\":\"x\"}}\r\n\r\n",
                    &format!("id: 3\r\ndata: {ok_result}\r\n\r\n"),
                ],
            ),
            Bad::Expire(after) => {
                let calls = {
                    let mut m = c.per_session.lock().unwrap();
                    let n = m.entry(session.to_owned()).or_default();
                    *n += 1;
                    *n
                };
                if calls > after {
                    respond(&mut w, "404 Not Found", "text/plain", "", "no such session")
                } else {
                    respond(&mut w, "200 OK", "application/json", "", &ok_result)
                }
            }
            Bad::LateEnd(d) => {
                let answer = format!("event: message\ndata: {ok_result}\n\n");
                chunked_with(&mut w, "", &[&answer], false) && {
                    std::thread::sleep(d);
                    w.write_all(b"0\r\n\r\n").is_ok()
                }
            }
            Bad::Slow(d) => {
                std::thread::sleep(d);
                respond(&mut w, "200 OK", "application/json", "", &ok_result)
            }
            Bad::OpenStream => chunked_with(
                &mut w,
                "",
                &[&format!("data: {ok_result}\n\n"), ": still here\n\n"],
                false,
            ),
        };
        if !alive {
            return;
        }
    }
}

fn bad_server(bad: Bad) -> (SocketAddr, Arc<Counters>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let c = Arc::new(Counters {
        inits: AtomicUsize::new(0),
        per_session: Default::default(),
        deletes: AtomicUsize::new(0),
        calls: AtomicUsize::new(0),
        unsessioned: AtomicUsize::new(0),
    });
    let cc = Arc::clone(&c);
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(s) = s else { return };
            let _ = s.set_nodelay(true);
            let c = Arc::clone(&cc);
            std::thread::spawn(move || serve_conn(s, bad, c));
        }
    });
    (addr, c)
}

/// Runs 2 connections for `duration` against `bad`; returns the report,
/// the server's counters and the wall time.
fn run_bad(bad: Bad, name: &str, extra: &[&str]) -> (serde_json::Value, Arc<Counters>, Duration) {
    let (addr, c) = bad_server(bad);
    let json = json_path(name);
    let t0 = Instant::now();
    let target = format!("http://{addr}/mcp");
    let mut args = vec![
        "--target",
        &target,
        "--tool",
        "echo",
        "--args",
        r#"{"text":"x"}"#,
        "--connections",
        "2",
    ];
    args.extend_from_slice(extra);
    let out = loadgen(&args, &json);
    let took = t0.elapsed();
    assert!(
        out.status.success(),
        "a misbehaving server is measured, not a failed run"
    );
    let r = report(&json);
    assert_eq!(r["failure"], serde_json::Value::Null, "{r:#}");
    assert_eq!(
        c.unsessioned.load(Ordering::SeqCst),
        0,
        "every request after initialize carries the session and protocol version"
    );
    (r, c, took)
}

#[test]
fn non_2xx_statuses_are_counted_by_status_and_the_session_is_deleted() {
    let _g = serial();
    for status in [404, 500] {
        let (r, c, _) = run_bad(Bad::Status(status), "http-status", &["--requests", "40"]);
        assert_eq!(
            n(&r["errors_by_kind"][format!("http_{status}")]),
            40,
            "{r:#}"
        );
        assert_eq!(n(&r["ok"]), 0);
        assert!(
            r["achieved_rps"].as_f64().unwrap() > 0.0,
            "a status is an answer: {r:#}"
        );
        assert_eq!(
            c.deletes.load(Ordering::SeqCst),
            2,
            "one DELETE per session"
        );
    }
}

#[test]
fn an_expired_session_is_counted_as_404_and_replaced_by_a_new_one() {
    let _g = serial();
    // One connection: 5 calls per session succeed, the 6th is a 404.
    let (addr, c) = bad_server(Bad::Expire(5));
    let json = json_path("http-expire");
    let target = format!("http://{addr}/mcp");
    let out = loadgen(
        &[
            "--target",
            &target,
            "--tool",
            "echo",
            "--connections",
            "1",
            "--requests",
            "24",
        ],
        &json,
    );
    assert!(out.status.success());
    let r = report(&json);
    // Sessions 0..3 each serve 5 and refuse the 6th (4 × 6 = 24).
    assert_eq!(n(&r["ok"]), 20, "{r:#}");
    assert_eq!(n(&r["errors_by_kind"]["http_404"]), 4, "{r:#}");
    assert_eq!(
        c.inits.load(Ordering::SeqCst),
        4,
        "one initialize per session"
    );
    assert_eq!(c.unsessioned.load(Ordering::SeqCst), 0);
}

#[test]
fn a_server_closing_connections_is_counted_and_the_generator_reconnects() {
    let _g = serial();
    let (r, c, _) = run_bad(Bad::Close, "http-close", &["--requests", "30"]);
    assert_eq!(n(&r["errors_by_kind"]["connection_closed"]), 30, "{r:#}");
    assert_eq!(c.calls.load(Ordering::SeqCst), 30, "each request was sent");
}

#[test]
fn pipelined_requests_on_a_closed_connection_all_end_as_closed() {
    let _g = serial();
    let (r, c, _) = run_bad(
        Bad::Close,
        "http-close-pipelined",
        &["--requests", "32", "--pipeline", "4"],
    );
    assert_eq!(n(&r["errors_by_kind"]["connection_closed"]), 32, "{r:#}");
    assert_eq!(n(&r["requests"]), 32, "{r:#}");
    // The server reads one request per connection before closing it.
    assert!(c.calls.load(Ordering::SeqCst) >= 8);
}

#[test]
fn garbage_sse_is_counted_and_ends_the_request() {
    let _g = serial();
    let (r, _, _) = run_bad(Bad::GarbageSse, "http-garbage", &["--requests", "20"]);
    let k = &r["errors_by_kind"];
    assert_eq!(n(&k["invalid_response"]), 20, "{r:#}");
    // Two undecodable events per answer.
    assert_eq!(n(&k["invalid_frame"]), 40, "{r:#}");
    assert_eq!(n(&r["requests"]), 20);
}

#[test]
fn a_json_answer_with_another_id_is_an_invalid_response() {
    let _g = serial();
    let (r, _, _) = run_bad(Bad::WrongId, "http-wrong-id", &["--requests", "20"]);
    assert_eq!(n(&r["errors_by_kind"]["invalid_response"]), 20, "{r:#}");
    assert_eq!(n(&r["ok"]), 0);
}

#[test]
fn sse_notifications_before_the_answer_are_counted_and_the_answer_is_ok() {
    let _g = serial();
    let (r, _, _) = run_bad(Bad::ProgressThenOk, "http-progress", &["--requests", "25"]);
    assert_eq!(n(&r["ok"]), 25, "{r:#}");
    assert_eq!(n(&r["errors"]), 0, "{r:#}");
    assert_eq!(n(&r["progress_frames"]), 50, "{r:#}");
}

#[test]
fn a_server_that_never_answers_times_out_and_the_run_ends_on_time() {
    let _g = serial();
    let (r, c, took) = run_bad(
        Bad::Hang,
        "http-hang",
        &["--duration", "1s", "--timeout", "300ms", "--drain", "500ms"],
    );
    let timeouts = n(&r["errors_by_kind"]["timeout"]);
    // Each connection times out a request every 300 ms, reconnects and
    // sends the next: about 3 each in the second.
    assert!(timeouts >= 4, "{r:#}");
    assert_eq!(n(&r["ok"]), 0);
    assert!(c.calls.load(Ordering::SeqCst) as u64 >= timeouts);
    assert!(
        took < Duration::from_secs(5),
        "1 s + 0.5 s drain + 1 s DELETE bound, took {took:?}"
    );
}

#[test]
fn a_run_behind_its_schedule_stops_sending_at_the_end_of_its_duration() {
    let _g = serial();
    // Two connections answered one call per 5 ms each: 400 calls/s at most,
    // a fifth of the rate asked. Each answer frees room in the pipeline
    // window, so only the send phase's end can stop the backlog of ~1,600
    // requests the schedule put before it (4 s more at the server's pace).
    let (r, c, took) = run_bad(
        Bad::Slow(Duration::from_millis(5)),
        "http-behind",
        &[
            "--rate",
            "2000",
            "--pipeline",
            "4",
            "--duration",
            "1s",
            "--drain",
            "1s",
            "--warmup",
            "0s",
        ],
    );
    assert_eq!(n(&r["scheduled"]), 2000, "{r:#}");
    assert!(n(&r["sent"]) < 1000, "the backlog was sent: {r:#}");
    assert_eq!(r["kept_up"], false, "{r:#}");
    // The sends waited for the slow answers (the backlog grew to about a
    // second), not for the generator: its own lag is counted from each
    // answer that made room in the window. Medians, so that a stall of
    // this process on a busy machine (which its p99 would show) cannot
    // fail the test.
    assert!(n(&r["send_lag_us"]["p50"]) > 100_000, "{r:#}");
    assert!(n(&r["generator_lag_us"]["p50"]) < 2_000, "{r:#}");
    assert_eq!(n(&r["errors"]), 0, "what was sent is answered: {r:#}");
    assert_eq!(n(&r["ok"]), n(&r["sent"]), "{r:#}");
    assert!(c.calls.load(Ordering::SeqCst) as u64 >= n(&r["sent"]));
    assert!(
        took < Duration::from_secs(3),
        "1 s + 100 ms of catching up + 8 answers in flight + the DELETEs, took {took:?}"
    );
}

#[test]
fn a_wait_for_the_end_of_an_answers_stream_is_the_servers_not_the_generators() {
    let _g = serial();
    // Each answer comes at once, but its SSE stream ends 20 ms later, and
    // only then can the connection carry the next request: two
    // connections carry at most 100 calls/s, a tenth of the rate asked.
    let (r, _, _) = run_bad(
        Bad::LateEnd(Duration::from_millis(20)),
        "http-late-end",
        &["--rate", "1000", "--duration", "1s", "--drain", "1s"],
    );
    assert_eq!(n(&r["errors"]), 0, "{r:#}");
    assert_eq!(r["kept_up"], false, "{r:#}");
    assert!(n(&r["send_lag_us"]["p50"]) > 100_000, "{r:#}");
    // Counted from each answer, the generator's own lag would be the
    // stream's 20 ms for every request; counted from the stream's end, it
    // is its own (medians: see the test above).
    assert!(n(&r["generator_lag_us"]["p50"]) < 5_000, "{r:#}");
}

#[test]
fn sse_streams_left_open_after_the_answer_are_ok_and_their_connections_replaced() {
    let _g = serial();
    let t0 = Instant::now();
    let (r, c, _) = run_bad(
        Bad::OpenStream,
        "http-open-stream",
        &["--requests", "6", "--timeout", "200ms"],
    );
    assert_eq!(n(&r["ok"]), 6, "{r:#}");
    assert_eq!(n(&r["errors"]), 0, "{r:#}");
    // Latency ends at the answer, not when the stream is given up.
    assert!(n(&r["latency_us"]["max"]) < 150_000, "{r:#}");
    assert_eq!(c.calls.load(Ordering::SeqCst), 6);
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
}

// ---- the real broker's HTTP edge ----------------------------------------------

#[test]
fn broker_http_edge_closed_loop_echo_calls_have_zero_errors() {
    let _g = serial();
    let b = Broker::start();
    let json = json_path("http-broker-closed");
    let out = loadgen(
        &[
            "--target",
            &b.http_target(),
            "--tool",
            "echo",
            "--args",
            r#"{"text":"hello","n":1}"#,
            "--connections",
            "8",
            "--threads",
            "2",
            "--requests",
            "3000",
        ],
        &json,
    );
    assert!(out.status.success());
    let r = report(&json);
    assert_eq!(n(&r["ok"]), 3000, "{r:#}");
    assert_eq!(n(&r["errors"]), 0, "{r:#}");
}

/// `frames://` aimed at the broker's HTTP or gRPC port: the error names the
/// protocol that answered, not only the absurd frame length its first bytes
/// make.
#[test]
fn a_frames_target_on_another_edges_port_is_named_as_such() {
    let _g = serial();
    let b = Broker::start();
    for (addr, says) in [(b.http, "HTTP/1"), (b.grpc, "HTTP/2")] {
        let json = json_path("frames-on-http");
        let out = loadgen(
            &[
                "--target",
                &format!("frames://{addr}"),
                "--tool",
                "echo",
                "--requests",
                "1",
            ],
            &json,
        );
        assert_eq!(out.status.code(), Some(1));
        let failure = report(&json)["failure"].as_str().unwrap().to_owned();
        assert!(
            failure.contains(says) && failure.contains("scheme and port"),
            "{failure}"
        );
    }
}

#[test]
fn broker_http_edge_open_loop_offers_the_asked_rate_pipelined() {
    let _g = serial();
    let b = Broker::start();
    let json = json_path("http-broker-open");
    let out = loadgen(
        &[
            "--target",
            &b.http_target(),
            "--tool",
            "echo",
            "--args",
            r#"{"text":"hello"}"#,
            "--connections",
            "4",
            "--pipeline",
            "4",
            "--rate",
            "500",
            "--duration",
            "2s",
        ],
        &json,
    );
    assert!(out.status.success());
    let r = report(&json);
    assert_eq!(r["mode"], "rate_limited_closed");
    assert_eq!(n(&r["scheduled"]), 1000, "{r:#}");
    assert_eq!(n(&r["errors"]), 0, "{r:#}");
    // Every request sent is answered; on a busy machine a few scheduled
    // at the very end may not have gone out (reported, not hidden).
    assert_eq!(n(&r["ok"]), n(&r["sent"]), "{r:#}");
    assert!(n(&r["sent"]) >= 900, "{r:#}");
}

#[test]
fn broker_http_edge_mixed_workload_is_checked_per_method_and_errors_counted_by_code() {
    let _g = serial();
    let b = Broker::start();
    let wl = json_path("http-broker-workload").with_extension("toml");
    std::fs::write(
        &wl,
        r#"
        [[op]]
        kind = "tool"
        name = "echo"
        args = { text = { random = "string", len = [4, 64] } }
        [[op]]
        kind = "list"
        list = "tools"
        [[op]]
        kind = "ping"
        [[op]]
        kind = "tool"
        name = "no_such_tool"
        "#,
    )
    .unwrap();
    let json = json_path("http-broker-mixed");
    let out = loadgen(
        &[
            "--target",
            &b.http_target(),
            "--workload",
            wl.to_str().unwrap(),
            "--connections",
            "4",
            "--requests",
            "800",
        ],
        &json,
    );
    assert!(out.status.success());
    let r = report(&json);
    let k = r["errors_by_kind"].as_object().unwrap();
    // The unknown tool is the only error, and it is a JSON-RPC error or an
    // isError result: an answer either way, never a broken one.
    let errors = n(&r["errors"]);
    assert!(errors > 100, "{r:#}");
    assert!(
        k.keys()
            .all(|key| key.starts_with("error_response.") || key == "tool_error"),
        "{r:#}"
    );
    assert_eq!(n(&r["ok"]) + errors, 800, "{r:#}");
}
