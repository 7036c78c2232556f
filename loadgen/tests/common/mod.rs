//! A frame-protocol test server of known behaviour, built on std threads
//! and `mcp-schema` only (nothing from the load generator), so that it is an
//! independent referee of what the generator reports.
//!
//! Per connection: a reader thread parses requests and computes each
//! answer's due time; a writer thread sleeps until that time and writes.
//! The server-side sleep *is* the latency under test.

#![allow(dead_code)]

pub mod bearer;
pub mod broker;

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Output};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use mcp_schema::ResponseEncoder;
use mcp_schema::encode::{Correlation, ReplyTo};
use mcp_schema::verify::VerifiedRequest;

/// Timing-sensitive tests run one at a time: on a small machine, two load
/// runs in parallel would measure each other.
pub static SERIAL: Mutex<()> = Mutex::new(());

/// A loopback port whose connections are refused for as long as the
/// returned socket lives: bound, never listening. A port found free and
/// closed again could be taken by another test's listener meanwhile.
pub fn refused_port() -> (socket2::Socket, u16) {
    use socket2::{Domain, Socket, Type};
    let sock = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
    sock.bind(&std::net::SocketAddr::from(([127, 0, 0, 1], 0)).into())
        .unwrap();
    let port = sock.local_addr().unwrap().as_socket().unwrap().port();
    (sock, port)
}

pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

#[derive(Clone, Copy, Debug)]
pub enum Behaviour {
    /// Answer each tool call `delay` after it arrives, except that an
    /// answer falling in the last `stall` of each `period` (counted from
    /// server start) waits for that stall to end.
    Stall {
        delay: Duration,
        period: Duration,
        stall: Duration,
    },
    /// Answer at once, with a correlation id no request had.
    WrongCorrelation,
    /// Answer at once with a PingResponse (not a ToolResult).
    WrongKind,
    /// Answer at once, writing each response in two pieces split at an odd
    /// byte, so the client sees frames cut across reads.
    Fragmented,
    /// Answer at once; `after` the first connection, close every
    /// connection (a server killed mid-run).
    DieAfter(Duration),
}

pub struct Server {
    pub addr: std::net::SocketAddr,
}

impl Server {
    pub fn target(&self) -> String {
        format!("frames://{}", self.addr)
    }
}

pub fn spawn(b: Behaviour) -> Server {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let epoch = Instant::now();
    let first_conn: Arc<Mutex<Option<Instant>>> = Arc::default();
    std::thread::spawn(move || {
        for s in listener.incoming() {
            let Ok(s) = s else { return };
            s.set_nodelay(true).unwrap();
            let died_at = {
                let mut f = first_conn.lock().unwrap();
                let first = *f.get_or_insert_with(Instant::now);
                match b {
                    Behaviour::DieAfter(after) => Some(first + after),
                    _ => None,
                }
            };
            let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
            let w = s.try_clone().unwrap();
            let fragment = matches!(b, Behaviour::Fragmented);
            std::thread::spawn(move || writer(w, rx, fragment));
            std::thread::spawn(move || reader(s, tx, b, epoch, died_at));
        }
    });
    Server { addr }
}

fn reader(
    mut s: TcpStream,
    tx: mpsc::Sender<(Instant, Vec<u8>)>,
    b: Behaviour,
    epoch: Instant,
    dies_at: Option<Instant>,
) {
    let mut enc = ResponseEncoder::new(7);
    loop {
        let mut len = [0u8; 4];
        if s.read_exact(&mut len).is_err() {
            return;
        }
        let n = u32::from_le_bytes(len) as usize;
        let mut frame = vec![0u8; 4 + n];
        frame[..4].copy_from_slice(&len);
        if s.read_exact(&mut frame[4..]).is_err() {
            return;
        }
        let arrival = Instant::now();
        if dies_at.is_some_and(|d| arrival >= d) {
            let _ = s.shutdown(Shutdown::Both);
            return;
        }
        let req = VerifiedRequest::verify(Bytes::from(frame))
            .expect("the generator sends valid requests");
        let v = req.view();
        let tc = v.tool_call().expect("tests send tool calls");
        let to = v.reply_to();
        let wrong = ReplyTo {
            correlation: Correlation::Text("no-such-request"),
            session_id: None,
        };
        let (due, bytes) = match b {
            Behaviour::Stall {
                delay,
                period,
                stall,
            } => {
                let mut due = arrival + delay;
                let phase = Duration::from_nanos(
                    (due.duration_since(epoch).as_nanos() % period.as_nanos()) as u64,
                );
                if phase >= period - stall {
                    due += period - phase;
                }
                (due, enc.tool_text(&to, tc.id(), "ok", None, false).to_vec())
            }
            Behaviour::WrongCorrelation => (
                arrival,
                enc.tool_text(&wrong, tc.id(), "ok", None, false).to_vec(),
            ),
            Behaviour::WrongKind => (arrival, enc.pong(&to).to_vec()),
            Behaviour::Fragmented => (
                arrival,
                enc.tool_text(&to, tc.id(), "ok", None, false).to_vec(),
            ),
            Behaviour::DieAfter(_) => (
                arrival,
                enc.tool_text(&to, tc.id(), "ok", None, false).to_vec(),
            ),
        };
        if tx.send((due, bytes)).is_err() {
            return;
        }
    }
}

fn writer(mut s: TcpStream, rx: mpsc::Receiver<(Instant, Vec<u8>)>, fragment: bool) {
    for (due, bytes) in rx {
        let now = Instant::now();
        if due > now {
            std::thread::sleep(due - now);
        }
        // With TCP_NODELAY each write leaves as its own segment, so the
        // client's reads end mid-frame (in the prefix or in the body).
        let cut = if fragment {
            3 + bytes.len() % 5 * 7
        } else {
            bytes.len()
        };
        let (a, b) = bytes.split_at(cut.min(bytes.len()));
        if s.write_all(a).is_err() || s.write_all(b).is_err() {
            return;
        }
    }
}

/// Runs the real `mcp-loadgen` binary with `args`, writing its JSON report
/// to `json`.
pub fn loadgen(args: &[&str], json: &Path) -> Output {
    let out = Command::new(env!("CARGO_BIN_EXE_mcp-loadgen"))
        .args(args)
        .arg("--json")
        .arg(json)
        .arg("--quiet")
        .output()
        .unwrap();
    eprintln!(
        "mcp-loadgen {args:?}\n--- stdout\n{}--- stderr\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

pub fn report(json: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(json).expect("the JSON report is written");
    serde_json::from_str(&text).unwrap()
}

/// A fresh path for a report in the target's temporary directory.
pub fn json_path(name: &str) -> std::path::PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"));
    dir.join(format!("{name}-{}.json", std::process::id()))
}

pub fn ms(v: &serde_json::Value) -> f64 {
    v.as_f64().unwrap() / 1000.0
}
