//! Two real `mcp-broker` processes behind a real HAProxy (Debian's
//! `haproxy`, which `scripts/setup` installs) running `deploy/haproxy.cfg`,
//! all on loopback: MCP HTTP sessions stick to the broker that issued them,
//! frames connections are balanced, and an MCP HTTP client of a broker
//! stopped with SIGTERM (and `broker.drain_grace`) or killed loses no
//! request but the killed one's sessions, which get 404 and start again on
//! the survivor. (A frame connection cannot be moved during the grace: its
//! requests after it get -32004, docs/deploy.md.)

mod common;

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::Broker;
use common::http::{Conn, eventually};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `mcp-loadgen`, built beside `mcp-broker` by `cargo test --workspace`.
fn loadgen() -> PathBuf {
    let p = PathBuf::from(env!("CARGO_BIN_EXE_mcp-broker")).with_file_name("mcp-loadgen");
    assert!(p.exists(), "{} is missing: run scripts/test", p.display());
    p
}

fn free_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// HAProxy on `deploy/haproxy.cfg` in front of `b1` and `b2`; killed on
/// drop.
struct Lb {
    child: Child,
    http: SocketAddr,
    frames: SocketAddr,
}

impl Lb {
    fn start(b1: &Broker, b2: &Broker) -> Lb {
        let (http, frames, grpc) = (free_addr(), free_addr(), free_addr());
        let mut cmd = Command::new("haproxy");
        cmd.arg("-db")
            .arg("-f")
            .arg(repo().join("deploy/haproxy.cfg"))
            .env("MCP_LB_HTTP", http.to_string())
            .env("MCP_LB_FRAMES", frames.to_string())
            .env("MCP_LB_GRPC", grpc.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        for (n, b) in [(1, b1), (2, b2)] {
            cmd.env(format!("BROKER{n}"), "127.0.0.1")
                .env(format!("BROKER{n}_HTTP"), b.http.to_string())
                .env(format!("BROKER{n}_FRAMES"), b.frames.to_string())
                .env(format!("BROKER{n}_GRPC"), b.grpc.to_string())
                .env(
                    format!("BROKER{n}_ADMIN_PORT"),
                    b.metrics.port().to_string(),
                );
        }
        let child = cmd
            .spawn()
            .expect("haproxy (Debian package; scripts/setup installs it)");
        let lb = Lb {
            child,
            http,
            frames,
        };
        assert!(
            eventually(Duration::from_secs(10), || TcpStream::connect(http).is_ok()),
            "haproxy did not listen"
        );
        lb
    }
}

impl Drop for Lb {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn broker() -> Broker {
    // Not ready for 2 s before draining: HAProxy checks every 500 ms and
    // takes a server out after 2 failed checks.
    let toml =
        mcp_broker::config::DEFAULT_TOML.replace("drain_grace = \"0s\"", "drain_grace = \"2s\"");
    Broker::start_with_config(&toml, &["--shards", "1"])
}

/// One MCP session through the balancer, with the `kv` key it wrote.
struct Session {
    conn: Conn,
    lb: SocketAddr,
    id: String,
    next: u64,
}

impl Session {
    fn open(lb: &Lb) -> Session {
        let mut conn = Conn::connect(lb.http);
        let id = conn.initialize("2025-06-18");
        Session {
            conn,
            lb: lb.http,
            id,
            next: 1,
        }
    }

    /// A tool call; the HTTP status and the JSON-RPC answer (if 200).
    ///
    /// A keep-alive connection closed without an answer is the race every
    /// HTTP/1.1 client meets (RFC 9112 §9.3.1): HAProxy reused a connection
    /// to a draining broker just as the broker closed it. Like a stock
    /// client, this one sends the request again, once, on a new connection
    /// (these tests send only reads and idempotent writes).
    fn call(&mut self, tool: &str, args: &str) -> (u16, serde_json::Value) {
        use std::io::{BufRead, Write};
        self.next += 1;
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":{},"method":"tools/call","params":{{"name":"{tool}","arguments":{args}}}}}"#,
            self.next
        );
        let head = format!(
            "POST /mcp HTTP/1.1\r\nHost: lb\r\nAccept: application/json, text/event-stream\r\n\
             Content-Type: application/json\r\nMcp-Session-Id: {}\r\nContent-Length: {}\r\n\r\n",
            self.id,
            body.len()
        );
        for attempt in 0..2 {
            let sent = self
                .conn
                .stream
                .get_mut()
                .write_all(format!("{head}{body}").as_bytes());
            let answered = sent.is_ok() && self.conn.stream.fill_buf().is_ok_and(|b| !b.is_empty());
            if answered {
                break;
            }
            assert_eq!(attempt, 0, "closed without an answer twice");
            self.conn = Conn::connect(self.lb);
        }
        let r = self.conn.read_reply();
        let v = if r.status == 200 {
            if r.header("content-type")
                .is_some_and(|c| c.starts_with("text/event-stream"))
            {
                r.sse_messages().pop().unwrap()
            } else {
                r.json()
            }
        } else {
            serde_json::Value::Null
        };
        (r.status, v)
    }

    /// Writes this session's own key; reads it back.
    fn check_state(&mut self) -> (u16, String) {
        let (st, v) = self.call("get", r#"{"key":"mine"}"#);
        (
            st,
            v["result"]["content"][0]["text"]
                .as_str()
                .unwrap_or("")
                .to_string(),
        )
    }
}

#[test]
fn sessions_stick_through_haproxy_and_a_drained_or_killed_broker_loses_nothing_else() {
    let mut b1 = broker();
    let mut b2 = broker();
    let lb = Lb::start(&b1, &b2);
    // Both servers up (each has answered a health check).
    assert!(eventually(Duration::from_secs(10), || {
        let mut s = Session::open(&lb);
        s.call("echo_text", r#"{"text":"x"}"#).0 == 200
    }));

    // Sessions are balanced at initialize, then stick: each writes a kv key
    // (the kv router keeps a session's state on the broker that owns it)
    // and reads it back many times.
    let mut sessions: Vec<Session> = (0..8).map(|_| Session::open(&lb)).collect();
    for (i, s) in sessions.iter_mut().enumerate() {
        let (st, v) = s.call("put", &format!(r#"{{"key":"mine","value":{i}}}"#));
        assert_eq!(st, 200, "{v}");
    }
    for _ in 0..5 {
        for (i, s) in sessions.iter_mut().enumerate() {
            assert_eq!(s.check_state(), (200, i.to_string()), "session {i} moved");
        }
    }
    let served = |b: &Broker| b.metric_sum("mcp_requests_total");
    assert!(
        served(&b1) > 0.0 && served(&b2) > 0.0,
        "initialize was not balanced"
    );

    // Frames connections are balanced per connection.
    for _ in 0..4 {
        let mut f = common::Client::connect(lb.frames);
        let r = f.call("echo_text", &[("text", "\"through haproxy\"")], None);
        assert_eq!(common::tool_text(&r), "through haproxy");
    }

    // mcp-loadgen through each frontend: one MCP session per HTTP
    // connection, balanced and then stuck; frames connections balanced.
    for (target, requests) in [
        (format!("http://{}/mcp", lb.http), "2000"),
        (format!("frames://{}", lb.frames), "20000"),
    ] {
        let json = std::env::temp_dir().join(format!("lb-loadgen-{}.json", std::process::id()));
        let out = Command::new(loadgen())
            .args(["--target", &target, "--tool", "echo_text"])
            .args(["--args", r#"{"text":"lb"}"#, "--connections", "4"])
            .args(["--requests", requests, "--duration", "60s", "-q", "--json"])
            .arg(&json)
            .output()
            .expect("run mcp-loadgen");
        let report: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&json).expect("a JSON report")).unwrap();
        let _ = std::fs::remove_file(&json);
        assert!(
            out.status.success() && report["errors"] == 0,
            "{target}: {}\n{report}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    // A stock client: the Python SDK 1.x, a session through HAProxy.
    let python = repo().join(".tools/mcp1/bin/python");
    let script = r#"
import asyncio, sys
from mcp import ClientSession
from mcp.client.streamable_http import streamablehttp_client
async def main(url):
    async with streamablehttp_client(url) as (r, w, _):
        async with ClientSession(r, w) as s:
            await s.initialize()
            await s.call_tool("put", {"key": "k", "value": 7})
            for _ in range(5):
                got = await s.call_tool("get", {"key": "k"})
                assert got.content[0].text == "7", got
    print("sdk through haproxy: ok")
asyncio.run(main(sys.argv[1]))
"#;
    let out = Command::new(&python)
        .args(["-c", script])
        .arg(format!("http://{}/mcp", lb.http))
        .output()
        .expect("the mcp 1.x venv (scripts/setup)");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("sdk through haproxy: ok"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // SIGTERM to broker 1, while every session keeps calling: during the
    // grace everything is served; then HAProxy has taken broker 1 out, its
    // sessions get 404 (unknown on broker 2) and nothing else fails.
    b1.sigterm();
    let t0 = Instant::now();
    let mut moved = vec![false; sessions.len()];
    while t0.elapsed() < Duration::from_secs(5) {
        for (i, s) in sessions.iter_mut().enumerate() {
            if moved[i] {
                continue;
            }
            match s.check_state() {
                (200, v) => assert_eq!(v, i.to_string(), "session {i}"),
                // Its broker left: a new session on the survivor.
                (404, _) => moved[i] = true,
                other => panic!("session {i} got {other:?} during the drain"),
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let status = b1.wait_exit(Duration::from_secs(15));
    assert!(status.success(), "{status:?}");
    let survivors = moved.iter().filter(|m| !**m).count();
    assert!(
        survivors > 0 && survivors < sessions.len(),
        "{survivors} sessions of {} kept their broker",
        sessions.len()
    );
    // The moved sessions start again, on broker 2.
    for (i, s) in sessions.iter_mut().enumerate() {
        if moved[i] {
            *s = Session::open(&lb);
            let (st, _) = s.call("put", &format!(r#"{{"key":"mine","value":{i}}}"#));
            assert_eq!(st, 200);
        }
        assert_eq!(s.check_state(), (200, i.to_string()));
    }

    // The other way to lose a broker: start broker 1 again behind a fresh
    // HAProxy, spread new sessions over both, then kill broker 2 outright
    // (SIGKILL, no drain, no grace).
    drop(lb);
    let b1 = broker();
    let lb = Lb::start(&b1, &b2);
    assert!(eventually(Duration::from_secs(10), || {
        let mut s = Session::open(&lb);
        s.call("echo_text", r#"{"text":"x"}"#).0 == 200
    }));
    let mut sessions: Vec<Session> = (0..8).map(|_| Session::open(&lb)).collect();
    for (i, s) in sessions.iter_mut().enumerate() {
        assert_eq!(
            s.call("put", &format!(r#"{{"key":"mine","value":{i}}}"#)).0,
            200
        );
    }
    let _ = b2.child.kill();
    let _ = b2.child.wait();
    let mut lost = 0;
    for (i, s) in sessions.iter_mut().enumerate() {
        match s.check_state() {
            (200, v) => assert_eq!(v, i.to_string(), "session {i} of the survivor"),
            (404, _) => {
                lost += 1;
                *s = Session::open(&lb);
                assert_eq!(s.call("echo_text", r#"{"text":"again"}"#).0, 200);
            }
            other => panic!("session {i}: {other:?} after the kill"),
        }
    }
    assert!(lost > 0 && lost < sessions.len(), "{lost} sessions lost");
}
