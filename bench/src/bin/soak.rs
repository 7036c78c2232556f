//! `soak`: the overload and abuse soak of issue 18 (a benchmark, not a CI
//! test; `scripts/soak` builds and runs it).
//!
//! Starts `mcp-broker` on loopback port 0 with only the `echo` router,
//! measures its capacity with a short closed-loop `mcp-loadgen` run (unless
//! `--capacity` is given), then for `--duration` seconds runs all at once:
//! - well-behaved load: `mcp-loadgen --rate <overload × capacity>` (open loop);
//! - the checker: a few connections sending `echo` calls with unique
//!   correlation ids at a moderate rate; each must get exactly one final
//!   answer (none before the answer deadline = lost, two = duplicated);
//! - idle connections (connect, send nothing; reconnect when closed);
//! - slowloris connections (one byte of a valid frame per interval);
//! - never-readers, never reading: half pipeline valid calls with large
//!   arguments, half send zero bytes (each 4 a zero-length frame, each
//!   answered with an error: the amplification of issue 18's defect 2);
//! - garbage frames (random bodies, truncated and bit-flipped requests,
//!   zero and oversized length prefixes; answers are read and counted);
//!
//! sampling the broker's RSS every second. Then it lets the well-behaved
//! clients drain, stops the abusers, keeps sampling a few seconds, scrapes
//! `/metrics`, stops the broker with SIGTERM, and writes
//! `<out>/soak-<date>-<host>[-http|-grpc][-<tag>].md` and `.json`.
//!
//! `--edge http` runs the same on the MCP Streamable HTTP edge
//! (`soak/http.rs`): mcp-loadgen `http://` with `--pipeline`, a checker of
//! stateless 2026-07-28 POSTs matched by JSON-RPC id, slowloris and
//! never-readers sending HTTP requests (the second half of the
//! never-readers small calls instead of zeros), and HTTP garbage (random
//! bytes, truncated and bit-flipped requests, bodies that are not JSON, and
//! heads past `max_header_bytes` in place of oversized prefixes).
//! `--edge grpc` runs it on the gRPC edge (`soak/grpc.rs`): mcp-loadgen
//! `grpc://`, a checker of tonic clients whose answers must echo their own
//! call's id, slowloris dribbling the HTTP/2 preface, never-readers in raw
//! HTTP/2 with a stream window of 0, and HTTP/2 garbage after the preface.
//!
//! Every loop is bounded by the run's deadlines; every socket is loopback.
//! The broker and loadgen children die with this process (PDEATHSIG), and
//! the run stops early if the broker's RSS passes `--rss-limit-mb`, so an
//! unbounded broker cannot take the machine down with it.

use std::collections::{BTreeMap, HashMap};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, mpsc};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use clap::Parser;
use mcp_schema::client::{RequestEncoder, RequestHeader, ResponseView};
use serde_json::{Value, json};

#[path = "soak/grpc.rs"]
mod grpc;
#[path = "soak/http.rs"]
mod http;

/// Calls each gRPC never-reader sends (HTTP/2 stream ids only grow, so the
/// list is built once and not repeated): at the default 1 MiB/s, 32 s of
/// 32 KiB calls and 8 s of small ones, after which the connection is held
/// open, unread, until the broker closes it (h2 after 1,024 refused
/// streams, else `grpc.write_timeout`).
const GRPC_NEVER_READER_LARGE_CALLS: u32 = 1024;
const GRPC_NEVER_READER_SMALL_CALLS: u32 = 65_536;

/// The edge a run drives: its well-behaved load, checker and abusers all
/// go to that one listener.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Edge {
    /// Size-prefixed FlatBuffers frames.
    Frames,
    /// MCP Streamable HTTP (`POST /mcp`).
    Http,
    /// gRPC (`turbomcp.mcp.v1.McpService`).
    Grpc,
}

impl Edge {
    fn name(self) -> &'static str {
        match self {
            Edge::Frames => "frames",
            Edge::Http => "http",
            Edge::Grpc => "grpc",
        }
    }
}

/// The overload and abuse soak (issue 18); see the module docs and
/// README.md, "Overload and abuse soak".
#[derive(Parser, Debug)]
#[command(name = "soak")]
struct Args {
    /// The mcp-broker binary.
    #[arg(long)]
    broker: PathBuf,
    /// The mcp-loadgen binary.
    #[arg(long)]
    loadgen: PathBuf,
    /// The edge to soak.
    #[arg(long, value_enum, default_value_t = Edge::Frames)]
    edge: Edge,
    /// `--edge http`: the protocol revision of the well-behaved load
    /// (mcp-loadgen's `--mcp-version`; default its own, the 2025-11-25
    /// session era). The checker and abusers always send stateless
    /// 2026-07-28 requests.
    #[arg(long)]
    mcp_version: Option<String>,
    /// `--edge http`: requests in flight per mcp-loadgen connection
    /// (`--pipeline`); without pipelining 8 connections cannot overload
    /// the broker.
    #[arg(long, default_value_t = 32)]
    loadgen_pipeline: u64,
    /// Seconds of load and abuse.
    #[arg(long, default_value_t = 60.0)]
    duration: f64,
    /// The broker's capacity in requests/s; default: measured first with a
    /// closed-loop mcp-loadgen run (4 connections, 256 in flight).
    #[arg(long)]
    capacity: Option<f64>,
    /// Seconds of the capacity measurement.
    #[arg(long, default_value_t = 5.0)]
    capacity_duration: f64,
    /// The well-behaved load's rate as a multiple of the capacity.
    #[arg(long, default_value_t = 3.0)]
    overload: f64,
    /// Shards of the broker (default: half the CPUs, at least 1).
    #[arg(long)]
    shards: Option<usize>,
    /// Use this broker config instead of the generated one (its listen
    /// addresses are overridden with port 0 on the command line).
    #[arg(long)]
    broker_config: Option<PathBuf>,
    /// mcp-loadgen connections for the well-behaved load.
    #[arg(long, default_value_t = 8)]
    loadgen_connections: usize,
    /// Idle connections.
    #[arg(long, default_value_t = 500)]
    idle: usize,
    /// Slowloris connections.
    #[arg(long, default_value_t = 100)]
    slowloris: usize,
    /// Seconds between two bytes of one slowloris connection.
    #[arg(long, default_value_t = 1.0)]
    slowloris_interval: f64,
    /// Never-reading connections.
    #[arg(long, default_value_t = 50)]
    never_readers: usize,
    /// KiB of the `text` argument of each never-reader call.
    #[arg(long, default_value_t = 32)]
    never_reader_arg_kib: usize,
    /// KiB/s each never-reader tries to send (0 = as fast as the socket
    /// takes it). Bounded by default so that an unbounded broker grows
    /// visibly rather than filling the machine within seconds.
    #[arg(long, default_value_t = 1024)]
    never_reader_kib_per_s: u64,
    /// Connections sending garbage frames.
    #[arg(long, default_value_t = 4)]
    garbage_conns: usize,
    /// Garbage frames per second, over all garbage connections.
    #[arg(long, default_value_t = 500)]
    garbage_rate: u64,
    /// One garbage frame in this many is an oversized prefix, which makes
    /// the broker close the connection (0 = never).
    #[arg(long, default_value_t = 50)]
    garbage_close_every: usize,
    /// Checker connections.
    #[arg(long, default_value_t = 4)]
    checker_conns: usize,
    /// Checker calls per second, over all checker connections.
    #[arg(long, default_value_t = 200)]
    checker_rate: u64,
    /// Seconds after the load phase within which every well-behaved request
    /// must be answered (also mcp-loadgen's --drain).
    #[arg(long, default_value_t = 30.0)]
    answer_deadline: f64,
    /// Seconds the checker keeps listening after the answer deadline, to
    /// tell late answers (still counted lost) from missing ones.
    #[arg(long, default_value_t = 10.0)]
    grace: f64,
    /// Seconds of RSS samples after the abusers have closed.
    #[arg(long, default_value_t = 5.0)]
    after: f64,
    /// Stop the run early when the broker's RSS passes this many MiB.
    #[arg(long, default_value_t = 4096)]
    rss_limit_mb: u64,
    /// Where the report goes.
    #[arg(long, default_value = "bench/results")]
    out: PathBuf,
    /// Appended to the report's file name (e.g. `prefix-trial`).
    #[arg(long)]
    tag: Option<String>,
    /// A paragraph put at the top of the report.
    #[arg(long)]
    note: Option<String>,
    /// The command line to record in the report (scripts/soak passes its own).
    #[arg(long)]
    command: Option<String>,
    /// Scratch directory for the broker's config and log and the loadgen
    /// reports (default: a new one under $TMPDIR).
    #[arg(long)]
    workdir: Option<PathBuf>,
    /// Seed of the garbage generator.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

// ---------------------------------------------------------------- helpers

fn log(msg: impl AsRef<str>) {
    eprintln!("[soak] {}", msg.as_ref());
}

/// xorshift64*: garbage needs to be varied, not cryptographic.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn fill(&mut self, out: &mut Vec<u8>, n: usize) {
        out.extend((0..n).map(|_| self.next() as u8));
    }

    /// Flips one to four random bits of `bytes`.
    fn flip_bits(&mut self, bytes: &mut [u8]) {
        for _ in 0..1 + self.below(4) {
            let i = self.below(bytes.len() as u64) as usize;
            bytes[i] ^= 1 << self.below(8);
        }
    }
}

/// Sleeps until `start + period` in steps of at most 50 ms, returning early
/// when `stop` is raised (pacing, not synchronisation).
fn pace(start: Instant, period: Duration, stop: &AtomicBool) {
    let end = start + period;
    loop {
        let now = Instant::now();
        if now >= end || stop.load(Relaxed) {
            return;
        }
        thread::sleep((end - now).min(Duration::from_millis(50)));
    }
}

fn percentile(sorted: &[u64], q: f64) -> Option<u64> {
    if sorted.is_empty() {
        return None;
    }
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    Some(sorted[i.min(sorted.len() - 1)])
}

/// A message id unique within the run (RFC 9562 version 8 bits set).
fn message_id(stream: u64, seq: u64) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[0..8].copy_from_slice(&stream.to_be_bytes());
    b[8..16].copy_from_slice(&seq.to_be_bytes());
    b[6] = 0x80 | (b[6] & 0x0f);
    b[8] = 0x80 | (b[8] & 0x3f);
    b
}

fn echo_frame(enc: &mut RequestEncoder, stream: u64, seq: u64, corr: &str, text: &str) -> Vec<u8> {
    let h = RequestHeader {
        message_id: message_id(stream, seq),
        correlation_id: Some(corr),
        session_id: None,
        timeout_ms: 0,
        unix_nanos: 0,
    };
    let mut value = Vec::with_capacity(text.len() + 2);
    mcp_schema::args::write_json_string(text, &mut value);
    let value = String::from_utf8(value).unwrap_or_default();
    enc.tool_call(&h, message_id(stream, seq), "echo", &[("text", &value)])
        .to_vec()
}

// ------------------------------------------------------------ connections

/// How the broker ended a connection.
#[derive(Clone, Copy, Debug)]
enum Closed {
    /// Orderly close (FIN).
    Eof,
    /// Reset, broken pipe or any other socket error.
    Reset,
}

/// Counters of one kind of abusive connection.
#[derive(Default)]
struct ConnStats {
    connects: AtomicU64,
    connect_failures: AtomicU64,
    closed_eof: AtomicU64,
    closed_reset: AtomicU64,
    open: AtomicU64,
    bytes_sent: AtomicU64,
    bytes_received: AtomicU64,
    frames_sent: AtomicU64,
    /// Lifetimes (ms) of connections the broker ended.
    lifetimes_ms: Mutex<Vec<u64>>,
}

impl ConnStats {
    fn open(&self, addr: SocketAddr) -> Option<TcpStream> {
        let s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))
            .and_then(|s| {
                s.set_nodelay(true)?;
                s.set_nonblocking(true)?;
                Ok(s)
            })
            .ok();
        match s {
            Some(_) => {
                self.connects.fetch_add(1, Relaxed);
                self.open.fetch_add(1, Relaxed);
            }
            None => {
                self.connect_failures.fetch_add(1, Relaxed);
            }
        }
        s
    }

    fn closed(&self, how: Closed, since: Instant) {
        match how {
            Closed::Eof => self.closed_eof.fetch_add(1, Relaxed),
            Closed::Reset => self.closed_reset.fetch_add(1, Relaxed),
        };
        self.open.fetch_sub(1, Relaxed);
        if let Ok(mut l) = self.lifetimes_ms.lock() {
            l.push(since.elapsed().as_millis() as u64);
        }
    }

    fn report(&self, kind: &str, configured: usize) -> Value {
        let mut l = self
            .lifetimes_ms
            .lock()
            .map(|l| l.clone())
            .unwrap_or_default();
        l.sort_unstable();
        json!({
            "kind": kind,
            "configured": configured,
            "connects": self.connects.load(Relaxed),
            "connect_failures": self.connect_failures.load(Relaxed),
            "closed_by_broker_fin": self.closed_eof.load(Relaxed),
            "closed_by_broker_reset": self.closed_reset.load(Relaxed),
            "bytes_sent": self.bytes_sent.load(Relaxed),
            "bytes_received": self.bytes_received.load(Relaxed),
            "frames_sent": self.frames_sent.load(Relaxed),
            "lifetime_ms_p50": percentile(&l, 0.5),
            "lifetime_ms_min": l.first(),
            "lifetime_ms_max": l.last(),
        })
    }
}

/// Reads whatever is available (at most 1 MiB) into `sink` (or discards
/// it); `Err` when the broker has closed the connection.
fn drain(s: &mut TcpStream, sink: Option<&mut Vec<u8>>) -> Result<usize, Closed> {
    let mut buf = [0u8; 16 * 1024];
    let mut total = 0;
    let mut sink = sink;
    while total < 1 << 20 {
        match s.read(&mut buf) {
            Ok(0) => return Err(Closed::Eof),
            Ok(n) => {
                total += n;
                if let Some(v) = sink.as_deref_mut() {
                    v.extend_from_slice(&buf[..n]);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return Err(Closed::Reset),
        }
    }
    Ok(total)
}

/// Writes what the socket takes now; `Ok(0)` when it is full.
fn write_some(s: &mut TcpStream, data: &[u8]) -> Result<usize, Closed> {
    loop {
        match s.write(data) {
            Ok(n) => return Ok(n),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(0),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return Err(Closed::Reset),
        }
    }
}

/// Whether the connection is still ESTABLISHED (the broker has not sent
/// FIN or RST), without reading from it.
fn established(s: &TcpStream) -> bool {
    // SAFETY: tcp_info is plain old data; getsockopt writes at most `len`
    // bytes into it and the fd is owned by `s` for the whole call.
    unsafe {
        let mut info: libc::tcp_info = std::mem::zeroed();
        let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
        let rc = libc::getsockopt(
            s.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        );
        rc == 0 && info.tcpi_state == 1 // TCP_ESTABLISHED
    }
}

// ---------------------------------------------------------------- abusers

/// Connect and send nothing; check once a second whether the broker closed.
fn run_idle(addr: SocketAddr, n: usize, st: Arc<ConnStats>, stop: Arc<AtomicBool>) {
    let mut slots: Vec<Option<(TcpStream, Instant)>> = (0..n).map(|_| None).collect();
    while !stop.load(Relaxed) {
        let tick = Instant::now();
        for slot in slots.iter_mut() {
            if stop.load(Relaxed) {
                break;
            }
            match slot {
                None => *slot = st.open(addr).map(|s| (s, Instant::now())),
                Some((s, since)) => match drain(s, None) {
                    Ok(got) => {
                        st.bytes_received.fetch_add(got as u64, Relaxed);
                    }
                    Err(how) => {
                        st.closed(how, *since);
                        *slot = None;
                    }
                },
            }
        }
        pace(tick, Duration::from_secs(1), &stop);
    }
}

/// One byte of a valid frame per interval per connection.
fn run_slowloris(
    addr: SocketAddr,
    n: usize,
    interval: Duration,
    frame: Vec<u8>,
    st: Arc<ConnStats>,
    stop: Arc<AtomicBool>,
) {
    let mut slots: Vec<Option<(TcpStream, Instant, usize)>> = (0..n).map(|_| None).collect();
    while !stop.load(Relaxed) {
        let tick = Instant::now();
        for slot in slots.iter_mut() {
            if stop.load(Relaxed) {
                break;
            }
            let Some((s, since, pos)) = slot else {
                *slot = st.open(addr).map(|s| (s, Instant::now(), 0));
                continue;
            };
            let res = drain(s, None).and_then(|got| {
                st.bytes_received.fetch_add(got as u64, Relaxed);
                write_some(s, &frame[*pos..=*pos])
            });
            match res {
                Ok(1) => {
                    st.bytes_sent.fetch_add(1, Relaxed);
                    *pos += 1;
                    if *pos == frame.len() {
                        *pos = 0;
                        st.frames_sent.fetch_add(1, Relaxed);
                    }
                }
                Ok(_) => {}
                Err(how) => {
                    st.closed(how, *since);
                    *slot = None;
                }
            }
        }
        pace(tick, interval, &stop);
    }
}

/// What a never-reading connection sends: `messages` in turn, from the
/// first; after the last, again from the first when `cycle` (frames and
/// HTTP requests can repeat), else nothing more (HTTP/2 stream ids only
/// grow, so a gRPC list starts with its preface and is sent once).
struct NeverReaderPlan {
    messages: Vec<Vec<u8>>,
    cycle: bool,
}

/// Pipeline valid calls with large arguments; never read.
fn run_never_readers(
    addr: SocketAddr,
    n: usize,
    plan: NeverReaderPlan,
    bytes_per_s: u64,
    st: Arc<ConnStats>,
    stalled: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
) {
    struct Slot {
        s: TcpStream,
        since: Instant,
        frame: usize,
        off: usize,
        budget: f64,
    }
    const TICK: Duration = Duration::from_millis(10);
    // Per tick and connection when unlimited: enough to fill any socket
    // buffer, bounded so that one tick stays short.
    const UNLIMITED_PER_TICK: f64 = 4.0 * 1024.0 * 1024.0;
    let per_tick = if bytes_per_s == 0 {
        UNLIMITED_PER_TICK
    } else {
        bytes_per_s as f64 * TICK.as_secs_f64()
    };
    let NeverReaderPlan {
        messages: frames,
        cycle,
    } = plan;
    let mut slots: Vec<Option<Slot>> = (0..n).map(|_| None).collect();
    while !stop.load(Relaxed) {
        let tick = Instant::now();
        let mut blocked = 0;
        for slot in slots.iter_mut() {
            let Some(c) = slot else {
                *slot = st.open(addr).map(|s| Slot {
                    s,
                    since: Instant::now(),
                    frame: 0,
                    off: 0,
                    budget: 0.0,
                });
                continue;
            };
            if !established(&c.s) {
                st.closed(Closed::Eof, c.since);
                *slot = None;
                continue;
            }
            // Unused budget does not pile up beyond ten ticks' worth.
            c.budget = (c.budget + per_tick).min(per_tick * 10.0);
            let mut result = Ok(());
            while c.budget >= 1.0 && c.frame < frames.len() {
                let f = &frames[c.frame];
                let end = f.len().min(c.off + c.budget as usize);
                match write_some(&mut c.s, &f[c.off..end]) {
                    Ok(0) => {
                        blocked += 1;
                        break;
                    }
                    Ok(w) => {
                        st.bytes_sent.fetch_add(w as u64, Relaxed);
                        c.budget -= w as f64;
                        c.off += w;
                        if c.off == f.len() {
                            c.off = 0;
                            c.frame += 1;
                            if cycle {
                                c.frame %= frames.len();
                            }
                            st.frames_sent.fetch_add(1, Relaxed);
                        }
                    }
                    Err(how) => {
                        result = Err(how);
                        break;
                    }
                }
            }
            if let Err(how) = result {
                st.closed(how, c.since);
                *slot = None;
            }
        }
        stalled.store(blocked, Relaxed);
        pace(tick, TICK, &stop);
    }
}

/// The frame edge's garbage kinds, in the order of [`garbage_frame`]'s
/// `kind`; the last one closes the connection.
const GARBAGE_KINDS: [&str; 5] = [
    "random_body",
    "truncated_request",
    "bit_flipped_request",
    "zero_length",
    "oversized_prefix",
];

#[derive(Default)]
struct GarbageStats {
    conn: ConnStats,
    sent_by_kind: [AtomicU64; 5],
    /// Closes after an oversized prefix had been written on the connection
    /// (the documented outcome) and closes without one.
    closed_after_oversized: AtomicU64,
    closed_otherwise: AtomicU64,
    answers: Mutex<BTreeMap<String, u64>>,
}

fn garbage_frame(
    rng: &mut Rng,
    kind: usize,
    template: &[u8],
    max_frame: u32,
    _seq: u64,
    out: &mut Vec<u8>,
) {
    match kind {
        0 => {
            let len = 16 + rng.below(1009) as usize;
            out.extend_from_slice(&(len as u32).to_le_bytes());
            rng.fill(out, len);
        }
        1 => {
            let body = &template[4..];
            let cut = 8 + rng.below(body.len() as u64 - 12) as usize;
            out.extend_from_slice(&(cut as u32).to_le_bytes());
            out.extend_from_slice(&body[..cut]);
        }
        2 => {
            let start = out.len();
            out.extend_from_slice(template);
            rng.flip_bits(&mut out[start + 4..]);
        }
        3 => out.extend_from_slice(&0u32.to_le_bytes()),
        _ => {
            let over = max_frame as u64 + 1;
            let len = over + rng.below(u32::MAX as u64 - over);
            out.extend_from_slice(&(len as u32).to_le_bytes());
            rng.fill(out, 64);
        }
    }
}

/// One answer read back by the checker or a garbage connection.
enum Answer {
    /// A final answer: its request's correlation id (JSON-RPC id on HTTP),
    /// when it has one, and its outcome (`ToolResult`, `error_-32602`,
    /// `http_400_error_-32700`, ...).
    Final {
        corr: Option<String>,
        outcome: String,
    },
    /// A progress or log notification ahead of a final answer.
    Progress,
    /// Bytes framed as an answer that do not parse as one.
    Invalid,
}

/// The bytes a connection returned can no longer be split into answers
/// (a length prefix past any answer's, or no HTTP response head).
#[derive(Debug)]
struct Unframeable;

/// How answers are read off an edge's connection: every complete one at
/// the front of the buffer is moved out, a partial one stays.
type ReadAnswers = fn(&mut Vec<u8>, &mut Vec<Answer>) -> Result<(), Unframeable>;

/// [`ReadAnswers`] for the frame edge.
fn frame_answers(buf: &mut Vec<u8>, out: &mut Vec<Answer>) -> Result<(), Unframeable> {
    let mut at = 0;
    let res = loop {
        if buf.len() - at < 4 {
            break Ok(());
        }
        let len = u32::from_le_bytes([buf[at], buf[at + 1], buf[at + 2], buf[at + 3]]) as usize;
        if len > 64 << 20 {
            break Err(Unframeable);
        }
        if buf.len() - at < 4 + len {
            break Ok(());
        }
        out.push(match ResponseView::parse(&buf[at..at + 4 + len]) {
            Err(_) => Answer::Invalid,
            Ok(v) if !v.is_final() => Answer::Progress,
            Ok(v) => Answer::Final {
                corr: Some(v.correlation_id().to_owned()),
                outcome: match v.error() {
                    Some((code, _)) => format!("error_{code}"),
                    None => format!("{:?}", v.payload_type()),
                },
            },
        });
        at += 4 + len;
    };
    match res {
        Ok(()) => drop(buf.drain(..at)),
        Err(_) => buf.clear(),
    }
    res
}

/// Counts the answers to garbage in `buf` by kind, leaving a partial one.
fn count_answers(buf: &mut Vec<u8>, read: ReadAnswers, gs: &GarbageStats) {
    let mut answers = Vec::new();
    let res = read(buf, &mut answers);
    let mut seen: Vec<String> = answers
        .into_iter()
        .map(|a| match a {
            Answer::Final { outcome, .. } => outcome,
            Answer::Progress => "progress".into(),
            Answer::Invalid => "invalid_response".into(),
        })
        .collect();
    if res.is_err() {
        seen.push("unparseable_stream".into());
    }
    if !seen.is_empty()
        && let Ok(mut m) = gs.answers.lock()
    {
        for k in seen {
            *m.entry(k).or_default() += 1;
        }
    }
}

/// What the garbage thread sends, and where.
struct GarbagePlan {
    addr: SocketAddr,
    conns: usize,
    rate: u64,
    /// A valid request to truncate and flip bits in.
    template: Vec<u8>,
    /// The limit the last garbage kind passes: the frame edge's
    /// `max_frame_bytes`, the HTTP edge's `max_header_bytes`.
    limit: u32,
    seed: u64,
    close_every: usize,
    /// Appends garbage of a kind (0..5; 4 is the one that closes), the
    /// n-th on its connection.
    make: MakeGarbage,
    read: ReadAnswers,
    /// Sent first on every new connection (gRPC: the HTTP/2 preface).
    greeting: Vec<u8>,
}

/// Appends one piece of garbage: (rng, kind, template, limit, the piece's
/// number on its connection, out).
type MakeGarbage = fn(&mut Rng, usize, &[u8], u32, u64, &mut Vec<u8>);

fn run_garbage(plan: GarbagePlan, gs: Arc<GarbageStats>, stop: Arc<AtomicBool>) {
    let GarbagePlan {
        addr,
        conns: n,
        rate,
        template,
        limit,
        seed,
        close_every,
        make,
        read,
        greeting,
    } = plan;
    struct Slot {
        s: TcpStream,
        since: Instant,
        out: Vec<u8>,
        inbuf: Vec<u8>,
        appended: u64,
        written: u64,
        /// Stream offset 4 bytes into the first closing piece (kind 4)
        /// appended: on frames, just past its oversized length prefix.
        oversized_at: Option<u64>,
        /// Pieces of garbage appended so far.
        pieces: u64,
    }
    const TICK: Duration = Duration::from_millis(10);
    // What may wait unwritten per connection before no more is generated.
    const MAX_PENDING: usize = 64 * 1024;
    let mut rng = Rng(seed.max(1));
    let mut slots: Vec<Option<Slot>> = (0..n.max(1)).map(|_| None).collect();
    let mut due = 0.0f64;
    let mut last = Instant::now();
    let mut next_kind = 0usize;
    let mut next_slot = 0usize;
    while !stop.load(Relaxed) {
        let tick = Instant::now();
        due = (due + rate as f64 * (tick - last).as_secs_f64()).min(rate as f64);
        last = tick;
        for slot in slots.iter_mut() {
            if slot.is_none() {
                *slot = gs.conn.open(addr).map(|s| Slot {
                    s,
                    since: Instant::now(),
                    out: greeting.clone(),
                    inbuf: Vec::new(),
                    appended: greeting.len() as u64,
                    written: 0,
                    oversized_at: None,
                    pieces: 0,
                });
            }
        }
        // Spread the frames due round-robin over the open connections.
        let mut skipped = 0;
        while due >= 1.0 && skipped < slots.len() {
            let i = next_slot % slots.len();
            next_slot += 1;
            match &mut slots[i] {
                Some(c) if c.out.len() < MAX_PENDING => {
                    // The four kinds the broker answers or drops in turn, and
                    // every close_every-th frame an oversized prefix (which
                    // closes the connection and loses what follows it).
                    next_kind += 1;
                    let kind = if close_every > 0 && next_kind.is_multiple_of(close_every) {
                        4
                    } else {
                        next_kind % 4
                    };
                    let before = c.out.len();
                    make(&mut rng, kind, &template, limit, c.pieces, &mut c.out);
                    c.pieces += 1;
                    if kind == 4 && c.oversized_at.is_none() {
                        c.oversized_at = Some(c.appended + 4);
                    }
                    c.appended += (c.out.len() - before) as u64;
                    gs.sent_by_kind[kind].fetch_add(1, Relaxed);
                    gs.conn.frames_sent.fetch_add(1, Relaxed);
                    due -= 1.0;
                    skipped = 0;
                }
                _ => skipped += 1,
            }
        }
        for slot in slots.iter_mut() {
            let Some(c) = slot else { continue };
            let mut res = Ok(());
            if !c.out.is_empty() {
                match write_some(&mut c.s, &c.out) {
                    Ok(w) => {
                        gs.conn.bytes_sent.fetch_add(w as u64, Relaxed);
                        c.out.drain(..w);
                        c.written += w as u64;
                    }
                    Err(how) => res = Err(how),
                }
            }
            if res.is_ok() {
                match drain(&mut c.s, Some(&mut c.inbuf)) {
                    Ok(got) => {
                        gs.conn.bytes_received.fetch_add(got as u64, Relaxed);
                        count_answers(&mut c.inbuf, read, &gs);
                    }
                    Err(how) => res = Err(how),
                }
            }
            if let Err(how) = res {
                count_answers(&mut c.inbuf, read, &gs);
                if c.oversized_at.is_some_and(|o| c.written >= o) {
                    gs.closed_after_oversized.fetch_add(1, Relaxed);
                } else {
                    gs.closed_otherwise.fetch_add(1, Relaxed);
                }
                gs.conn.closed(how, c.since);
                *slot = None;
            }
        }
        pace(tick, TICK, &stop);
    }
}

// ---------------------------------------------------------------- checker

#[derive(Debug, Default)]
struct CheckerResult {
    sent: u64,
    /// Registered but never fully written when its connection closed: not
    /// the broker's to answer.
    unsent: u64,
    answered: u64,
    lost: u64,
    /// Of the lost: answered after the deadline, within the grace period.
    late: u64,
    duplicates: u64,
    unknown: u64,
    invalid: u64,
    progress: u64,
    conn_closed_eof: u64,
    conn_closed_reset: u64,
    connect_failures: u64,
    outcomes: BTreeMap<String, u64>,
    latencies_us: Vec<u64>,
}

struct Entry {
    sent_at: Instant,
    /// Stream offset just past this request's bytes.
    end: u64,
    generation: u32,
    finals: u32,
}

/// The bytes of an `echo` call: (sequence number, correlation id).
type EncodeCall = Box<dyn FnMut(u64, &str) -> Vec<u8> + Send>;

/// How a checker talks to its edge.
struct CheckerWire {
    request: EncodeCall,
    read: ReadAnswers,
}

impl CheckerWire {
    fn new(edge: Edge, idx: usize) -> Self {
        match edge {
            Edge::Frames => {
                let mut enc = RequestEncoder::new();
                Self {
                    request: Box::new(move |seq, corr| {
                        echo_frame(&mut enc, 0xC000 + idx as u64, seq, corr, "soak")
                    }),
                    read: frame_answers,
                }
            }
            Edge::Http => Self {
                request: Box::new(|_, corr| http::echo_request(corr, "soak")),
                read: http::answers,
            },
            Edge::Grpc => unreachable!("the gRPC checker is a tonic client: grpc::run_checker"),
        }
    }
}

/// One checker connection: `echo` calls with ids `c<idx>.<seq>` at `rate`
/// until `send_until`, then waits for every answer until `drain_until`
/// (missing then: lost), and until `grace_until` to tell late from never.
fn run_checker(
    idx: usize,
    addr: SocketAddr,
    mut wire: CheckerWire,
    rate: f64,
    (send_until, drain_until, grace_until): (Instant, Instant, Instant),
    abort: Arc<AtomicBool>,
) -> CheckerResult {
    let mut r = CheckerResult::default();
    let mut answers = Vec::new();
    let mut entries: HashMap<u64, Entry> = HashMap::new();
    let mut conn: Option<TcpStream> = None;
    let mut generation = 0u32;
    let (mut appended, mut written) = (0u64, 0u64);
    let mut out: Vec<u8> = Vec::new();
    let mut inbuf: Vec<u8> = Vec::new();
    let period = Duration::from_secs_f64(1.0 / rate.max(0.1));
    let mut next_send = Instant::now();
    let mut seq = 0u64;
    let mut outstanding = 0u64;
    let prefix = format!("c{idx}.");
    loop {
        let now = Instant::now();
        let sending = now < send_until;
        if abort.load(Relaxed) || now >= grace_until || (!sending && outstanding == 0) {
            break;
        }
        if conn.is_none() {
            if !sending {
                break;
            }
            match TcpStream::connect_timeout(&addr, Duration::from_secs(2)).and_then(|s| {
                s.set_nodelay(true)?;
                s.set_nonblocking(true)?;
                Ok(s)
            }) {
                Ok(s) => {
                    conn = Some(s);
                    generation += 1;
                    out.clear();
                    inbuf.clear();
                    appended = 0;
                    written = 0;
                }
                Err(_) => {
                    r.connect_failures += 1;
                    thread::sleep(Duration::from_millis(100));
                    continue;
                }
            }
        }
        let Some(s) = conn.as_mut() else { continue };
        while sending && next_send <= now && out.len() < 64 * 1024 {
            seq += 1;
            let corr = format!("{prefix}{seq}");
            let frame = (wire.request)(seq, &corr);
            out.extend_from_slice(&frame);
            appended += frame.len() as u64;
            entries.insert(
                seq,
                Entry {
                    sent_at: now,
                    end: appended,
                    generation,
                    finals: 0,
                },
            );
            r.sent += 1;
            outstanding += 1;
            next_send += period;
        }
        let mut closed = None;
        if !out.is_empty() {
            match write_some(s, &out) {
                Ok(w) => {
                    out.drain(..w);
                    written += w as u64;
                }
                Err(how) => closed = Some(how),
            }
        }
        if closed.is_none()
            && let Err(how) = drain(s, Some(&mut inbuf))
        {
            closed = Some(how);
        }
        // Answers already read count even when the connection then closed.
        let now = Instant::now();
        if (wire.read)(&mut inbuf, &mut answers).is_err() {
            r.invalid += 1;
            closed.get_or_insert(Closed::Reset);
        }
        for a in answers.drain(..) {
            let (corr, outcome) = match a {
                Answer::Invalid => {
                    r.invalid += 1;
                    continue;
                }
                Answer::Progress => {
                    r.progress += 1;
                    continue;
                }
                Answer::Final { corr, outcome } => (corr, outcome),
            };
            let id = corr
                .as_deref()
                .and_then(|c| c.strip_prefix(prefix.as_str()))
                .and_then(|x| x.parse::<u64>().ok());
            match id.and_then(|id| entries.get_mut(&id)) {
                None => {
                    r.unknown += 1;
                    *r.outcomes.entry(format!("unknown_{outcome}")).or_default() += 1;
                }
                Some(e) => {
                    e.finals += 1;
                    if e.finals == 1 {
                        r.answered += 1;
                        outstanding -= 1;
                        if now >= drain_until {
                            r.late += 1;
                        }
                        r.latencies_us.push((now - e.sent_at).as_micros() as u64);
                        *r.outcomes.entry(outcome).or_default() += 1;
                    } else {
                        r.duplicates += 1;
                    }
                }
            }
        }
        if let Some(how) = closed {
            match how {
                Closed::Eof => r.conn_closed_eof += 1,
                Closed::Reset => r.conn_closed_reset += 1,
            }
            // What never left this process cannot be answered: not lost.
            for e in entries.values_mut() {
                if e.generation == generation && e.finals == 0 && e.end > written {
                    e.finals = u32::MAX;
                    r.unsent += 1;
                    outstanding -= 1;
                }
            }
            conn = None;
            continue;
        }
        // Wait for an answer, room to write, or the next send time.
        let wait = (if sending {
            next_send.saturating_duration_since(Instant::now())
        } else {
            Duration::from_millis(20)
        })
        .min(Duration::from_millis(20));
        let mut pfd = libc::pollfd {
            fd: s.as_raw_fd(),
            events: libc::POLLIN | if out.is_empty() { 0 } else { libc::POLLOUT },
            revents: 0,
        };
        // SAFETY: one valid pollfd for a socket this function owns.
        unsafe { libc::poll(&mut pfd, 1, wait.as_millis() as libc::c_int) };
    }
    r.lost = entries.values().filter(|e| e.finals == 0).count() as u64 + r.late;
    r.latencies_us.sort_unstable();
    r
}

// ---------------------------------------------------------------- broker

struct Broker {
    child: Child,
    pid: i32,
    frames: SocketAddr,
    http: SocketAddr,
    grpc: SocketAddr,
    metrics: SocketAddr,
    ready_line: String,
    log_path: PathBuf,
}

/// Kill the child when this process dies, whatever way.
fn die_with_parent(cmd: &mut Command) {
    // SAFETY: prctl is async-signal-safe and touches no memory of the
    // parent; it runs in the forked child before exec.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
}

fn start_broker(a: &Args, workdir: &Path, shards: usize) -> Result<Broker> {
    let cfg = match &a.broker_config {
        Some(p) => p.clone(),
        None => {
            let p = workdir.join("broker.toml");
            std::fs::write(
                &p,
                format!(
                    "[broker]\nshards = {shards}\n\n[frames]\nlisten = \"127.0.0.1:0\"\n\n\
                     [[routers]]\nname = \"echo\"\nwasm = \"echo.wasm\"\n"
                ),
            )?;
            p
        }
    };
    // Every listener on port 0, whatever edges this build has.
    let help = Command::new(&a.broker)
        .arg("--help")
        .output()
        .context("running mcp-broker --help")?;
    let help = String::from_utf8_lossy(&help.stdout).into_owned();
    let mut cmd = Command::new(&a.broker);
    cmd.arg("--config").arg(&cfg);
    for flag in [
        "--listen",
        "--grpc-listen",
        "--metrics-listen",
        "--http-listen",
    ] {
        if help.contains(flag) {
            cmd.args([flag, "127.0.0.1:0"]);
        }
    }
    if a.broker_config.is_some() && a.shards.is_some() {
        cmd.args(["--shards", &shards.to_string()]);
    }
    let log_path = workdir.join("broker.log");
    let logf = std::fs::File::create(&log_path)?;
    cmd.stdout(Stdio::piped())
        .stderr(logf)
        .stdin(Stdio::null())
        .env("NO_COLOR", "1");
    // info: the broker logs each connection it closes, with the reason.
    if std::env::var_os("RUST_LOG").is_none() {
        cmd.env("RUST_LOG", "info");
    }
    die_with_parent(&mut cmd);
    let mut child = cmd.spawn().context("starting mcp-broker")?;
    let stdout = child.stdout.take().context("broker stdout")?;
    let (tx, rx) = mpsc::channel::<String>();
    // Reads the ready line, then keeps the pipe drained.
    thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                continue;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(180);
    let ready = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left.min(Duration::from_millis(500))) {
            Ok(line) if line.starts_with("mcp-broker ready ") => break line,
            Ok(_) => {}
            Err(mpsc::RecvTimeoutError::Timeout) if !left.is_zero() => {
                if let Some(st) = child.try_wait()? {
                    bail!(
                        "mcp-broker exited ({st}) before its ready line; log {}:\n{}",
                        log_path.display(),
                        tail(&log_path, 2000)
                    );
                }
            }
            Err(_) => {
                let _ = child.kill();
                bail!(
                    "mcp-broker printed no ready line within 180 s; log {}:\n{}",
                    log_path.display(),
                    tail(&log_path, 2000)
                );
            }
        }
    };
    let addr_of = |key: &str| -> Result<SocketAddr> {
        ready
            .split_whitespace()
            .find_map(|w| w.strip_prefix(key))
            .context(format!("no {key} in the ready line: {ready}"))?
            .parse()
            .context("bad address in the ready line")
    };
    Ok(Broker {
        pid: child.id() as i32,
        frames: addr_of("frames=")?,
        http: addr_of("http=")?,
        grpc: addr_of("grpc=")?,
        metrics: addr_of("metrics=")?,
        ready_line: ready.clone(),
        log_path,
        child,
    })
}

fn tail(p: &Path, n: usize) -> String {
    let s = std::fs::read_to_string(p).unwrap_or_default();
    let start = s.len().saturating_sub(n);
    let start = (start..s.len())
        .find(|&i| s.is_char_boundary(i))
        .unwrap_or(s.len());
    s[start..].to_owned()
}

/// (RSS MiB, threads, utime+stime seconds), or None when the process is gone
/// (or a zombie).
fn proc_sample(pid: i32) -> Option<(f64, u64, f64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| -> Option<u64> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    };
    if status
        .lines()
        .any(|l| l.starts_with("State:") && l.contains('Z'))
    {
        return None;
    }
    let rss_kb = field("VmRSS:")?;
    let threads = field("Threads:").unwrap_or(0);
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    // SAFETY: sysconf has no memory effects.
    let tck = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let cpu = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    Some((rss_kb as f64 / 1024.0, threads, cpu / tck))
}

/// A plain HTTP/1.0 GET: (status, body).
fn http_get(addr: SocketAddr, path: &str, timeout: Duration) -> io::Result<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, timeout)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    write!(
        s,
        "GET {path} HTTP/1.0\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut buf = Vec::new();
    let deadline = Instant::now() + timeout;
    let mut chunk = [0u8; 16 * 1024];
    loop {
        if Instant::now() >= deadline || buf.len() > 64 << 20 {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "response too slow"));
        }
        match s.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let text = String::from_utf8_lossy(&buf).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    Ok((status, body.to_owned()))
}

/// Counters (`*_total`) of a /metrics page summed over shards: key is the
/// name with its labels minus `shard`.
fn counters(body: &str) -> BTreeMap<String, f64> {
    let mut m = BTreeMap::new();
    for line in body.lines() {
        if line.starts_with('#') {
            continue;
        }
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(v) = value.parse::<f64>() else {
            continue;
        };
        let (name, labels) = match series.split_once('{') {
            Some((n, l)) => (n, l.trim_end_matches('}')),
            None => (series, ""),
        };
        if !name.ends_with("_total") {
            continue;
        }
        let labels: Vec<&str> = labels
            .split(',')
            .filter(|l| !l.is_empty() && !l.starts_with("shard="))
            .collect();
        let key = if labels.is_empty() {
            name.to_owned()
        } else {
            format!("{name}{{{}}}", labels.join(","))
        };
        *m.entry(key).or_default() += v;
    }
    m
}

/// Counts the broker log's lines by level and by message shape (digits
/// replaced by `#`), the most frequent first.
fn log_summary(p: &Path) -> (BTreeMap<String, u64>, Vec<(String, u64)>) {
    let text = std::fs::read_to_string(p).unwrap_or_default();
    let mut levels: BTreeMap<String, u64> = BTreeMap::new();
    let mut shapes: HashMap<String, u64> = HashMap::new();
    for line in text.lines() {
        let mut clean = String::with_capacity(line.len());
        let mut chars = line.chars().peekable();
        while let Some(c) = chars.next() {
            if c == '\u{1b}' {
                // An ANSI colour sequence: ESC [ ... letter.
                for d in chars.by_ref() {
                    if d.is_ascii_alphabetic() {
                        break;
                    }
                }
                continue;
            }
            clean.push(c);
        }
        let level = ["ERROR", "WARN", "INFO", "DEBUG", "TRACE"]
            .into_iter()
            .find(|l| clean.split_whitespace().take(3).any(|w| w == *l));
        let Some(level) = level else { continue };
        *levels.entry(level.to_owned()).or_default() += 1;
        let msg = clean
            .split_once(level)
            .map_or(clean.as_str(), |x| x.1)
            .trim();
        let mut shape = String::new();
        let mut last_digit = false;
        for c in msg.chars().take(160) {
            if c.is_ascii_digit() {
                if !last_digit {
                    shape.push('#');
                }
                last_digit = true;
            } else {
                shape.push(c);
                last_digit = false;
            }
        }
        *shapes.entry(format!("{level} {shape}")).or_default() += 1;
    }
    let mut top: Vec<(String, u64)> = shapes.into_iter().collect();
    top.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    top.truncate(15);
    (levels, top)
}

fn run_loadgen(a: &Args, target: SocketAddr, extra: &[String], json_path: &Path) -> Result<Child> {
    let mut cmd = Command::new(&a.loadgen);
    match a.edge {
        Edge::Frames => cmd.arg("--target").arg(format!("frames://{target}")),
        Edge::Grpc => cmd.arg("--target").arg(format!("grpc://{target}")),
        Edge::Http => {
            cmd.arg("--target").arg(format!("http://{target}/mcp"));
            cmd.args(["--pipeline", &a.loadgen_pipeline.to_string()]);
            if let Some(v) = &a.mcp_version {
                cmd.args(["--mcp-version", v]);
            }
            &mut cmd
        }
    };
    cmd.args(["--tool", "echo", "--args", r#"{"text":"hello"}"#, "-q"])
        .args(extra)
        .arg("--json")
        .arg(json_path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(json_path.with_extension("log"))?);
    die_with_parent(&mut cmd);
    cmd.spawn().context("starting mcp-loadgen")
}

/// Stops mcp-loadgen so that it still writes its report: a first SIGINT
/// ends its send phase, a second skips the drain (docs/loadgen.md); killed
/// if it has not exited 15 s later.
fn interrupt(mut c: Child) -> Option<std::process::ExitStatus> {
    for _ in 0..2 {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(c.id() as i32, libc::SIGINT) };
        thread::sleep(Duration::from_millis(200));
    }
    let until = Instant::now() + Duration::from_secs(15);
    while Instant::now() < until {
        if let Ok(Some(st)) = c.try_wait() {
            return Some(st);
        }
        thread::sleep(Duration::from_millis(50));
    }
    let _ = c.kill();
    c.wait().ok()
}

fn read_json(p: &Path) -> Value {
    std::fs::read_to_string(p)
        .ok()
        .and_then(|s| serde_json::from_str(&s).ok())
        .unwrap_or(Value::Null)
}

// ---------------------------------------------------------------- machine

fn machine() -> Value {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map_or("unknown".to_owned(), |x| x.1.trim().to_owned());
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .map(|s| s.trim().to_owned())
            .unwrap_or_default()
    };
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
    };
    let dirty = Command::new("git")
        .args(["diff", "--quiet", "HEAD", "--"])
        .status()
        .is_ok_and(|s| !s.success());
    let commit = git(&["rev-parse", "--short", "HEAD"]).unwrap_or_else(|| "unknown".into());
    let loadavg = read("/proc/loadavg");
    json!({
        "host": read("/proc/sys/kernel/hostname"),
        "nproc": thread::available_parallelism().map_or(1, |n| n.get()),
        "cpu_model": model,
        "kernel": read("/proc/sys/kernel/osrelease"),
        "commit": if dirty { format!("{commit}-dirty") } else { commit },
        "loadavg_start": loadavg.split_whitespace().take(3).collect::<Vec<_>>().join(" "),
    })
}

/// UTC (date, date and time) from the system clock.
fn utc_now() -> (String, String) {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs()) as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil-from-days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let date = format!("{y:04}-{m:02}-{d:02}");
    let time = format!("{date} {:02}:{:02} UTC", rem / 3600, (rem % 3600) / 60);
    (date, time)
}

// ---------------------------------------------------------------- the run

#[derive(Clone, Debug, serde::Serialize)]
struct Sample {
    t: f64,
    phase: &'static str,
    rss_mib: f64,
    threads: u64,
    cpu_s: f64,
    idle_open: u64,
    slowloris_open: u64,
    never_readers_open: u64,
    never_readers_stalled: u64,
    garbage_frames: u64,
}

#[derive(Clone, Debug, serde::Serialize)]
struct Probe {
    t: f64,
    ok: bool,
    ms: f64,
}

/// The plateau verdict: the highest RSS of the last `w` load samples is at
/// most `PLATEAU_TOLERANCE` × the highest of the `w` before them.
const PLATEAU_TOLERANCE: f64 = 1.05;

fn plateau(load: &[f64]) -> Value {
    let w = (load.len() / 3).min(20);
    if w < 2 {
        return json!({"met": null, "note": "too few samples"});
    }
    let n = load.len();
    let max = |s: &[f64]| s.iter().copied().fold(0.0f64, f64::max);
    let last = max(&load[n - w..]);
    let prev = max(&load[n - 2 * w..n - w]);
    // Least-squares slope over the second half of the load phase.
    let half = &load[n / 2..];
    let xm = (half.len() as f64 - 1.0) / 2.0;
    let ym = half.iter().sum::<f64>() / half.len() as f64;
    let (mut sxy, mut sxx) = (0.0, 0.0);
    for (i, y) in half.iter().enumerate() {
        sxy += (i as f64 - xm) * (y - ym);
        sxx += (i as f64 - xm) * (i as f64 - xm);
    }
    json!({
        "window_s": w,
        "max_last_window_mib": last,
        "max_previous_window_mib": prev,
        "ratio": if prev > 0.0 { last / prev } else { 0.0 },
        "slope_second_half_mib_per_s": if sxx > 0.0 { sxy / sxx } else { 0.0 },
        "met": last <= prev * PLATEAU_TOLERANCE,
    })
}

fn main() -> Result<()> {
    let a = Args::parse();
    let started = Instant::now();
    let nproc = thread::available_parallelism().map_or(1, |n| n.get());
    let shards = a.shards.unwrap_or((nproc / 2).max(1));
    let workdir = match &a.workdir {
        Some(w) => w.clone(),
        None => std::env::temp_dir().join(format!("mcp-soak-{}", std::process::id())),
    };
    std::fs::create_dir_all(&workdir)?;
    std::fs::create_dir_all(&a.out)?;
    let m = machine();
    let (date, when) = utc_now();
    log(format!("workdir {}", workdir.display()));

    let mut broker = start_broker(&a, &workdir, shards)?;
    log(format!("broker pid {}: {}", broker.pid, broker.ready_line));
    // The limit the closing garbage passes, from the config when it sets it.
    let (limit_key, limit_default) = match a.edge {
        Edge::Frames => ("max_frame_bytes", mcp_schema::DEFAULT_MAX_FRAME_LEN),
        // The broker's default `http.max_header_bytes` (docs/http.md).
        Edge::Http => ("max_header_bytes", 16 << 10),
        // The closing garbage passes HTTP/2's own frame size (no config
        // key: the broker does not raise it).
        Edge::Grpc => ("HTTP/2 SETTINGS_MAX_FRAME_SIZE", grpc::MAX_FRAME as u32),
    };
    let limit: u32 = a
        .broker_config
        .as_ref()
        .and_then(|p| std::fs::read_to_string(p).ok())
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.trim().strip_prefix(limit_key))
                .and_then(|v| v.trim_start_matches([' ', '=']).trim().parse().ok())
        })
        .unwrap_or(limit_default);
    let target = match a.edge {
        Edge::Frames => broker.frames,
        Edge::Http => broker.http,
        Edge::Grpc => broker.grpc,
    };

    // Capacity: closed loop, the settings scripts/bench uses for its peak.
    let (capacity, capacity_report) = match a.capacity {
        Some(c) => (c, Value::Null),
        None => {
            let p = workdir.join("capacity.json");
            // 256 in flight either way (HTTP: 8 connections × --pipeline).
            let in_flight: &[&str] = match a.edge {
                Edge::Frames | Edge::Grpc => &["--connections", "4", "--concurrency", "256"],
                Edge::Http => &["--connections", "8"],
            };
            let extra: Vec<String> = in_flight
                .iter()
                .chain(&["--warmup", "1s", "--duration"])
                .map(|s| s.to_string())
                .chain([format!("{}s", a.capacity_duration)])
                .collect();
            log("measuring capacity (closed loop)");
            let mut child = run_loadgen(&a, target, &extra, &p)?;
            let st = child.wait()?;
            let rep = read_json(&p);
            let c = rep["achieved_rps"].as_f64().unwrap_or(0.0);
            if c <= 0.0 {
                bail!("capacity measurement failed ({st}): {rep}");
            }
            log(format!("capacity {c:.0} req/s"));
            (c, rep)
        }
    };
    let rate = (capacity * a.overload).round();
    let before = http_get(broker.metrics, "/metrics", Duration::from_secs(5))
        .map(|(_, b)| counters(&b))
        .unwrap_or_default();

    // Abusers.
    let stop = Arc::new(AtomicBool::new(false));
    let abort = Arc::new(AtomicBool::new(false));
    let idle = Arc::new(ConnStats::default());
    let slow = Arc::new(ConnStats::default());
    let never = Arc::new(ConnStats::default());
    let zeros = Arc::new(ConnStats::default());
    let stalled = Arc::new(AtomicU64::new(0));
    let stalled_zeros = Arc::new(AtomicU64::new(0));
    let garbage = Arc::new(GarbageStats::default());
    let mut enc = RequestEncoder::new();
    let big_text = "x".repeat(a.never_reader_arg_kib * 1024);
    // What each abuser sends on this edge. The second half of the
    // never-readers: zero bytes on frames (each 4 a zero-length frame the
    // broker answers), small calls on HTTP and gRPC (zeros there are one
    // protocol error and a close); both make answers pile up unread.
    let (template, slow_frame, never_frames, small_frames) = match a.edge {
        Edge::Frames => (
            echo_frame(&mut enc, 0xA000, 1, "garbage.1", "garbage template"),
            echo_frame(&mut enc, 0xB000, 1, "slowloris.1", "slowloris"),
            (0..16)
                .map(|i| echo_frame(&mut enc, 0xD000, i, &format!("never.{i}"), &big_text))
                .collect::<Vec<_>>(),
            vec![vec![0u8; 64 * 1024]],
        ),
        Edge::Http => (
            http::echo_request("garbage.1", "garbage template"),
            http::echo_request("slowloris.1", "slowloris"),
            (0..16)
                .map(|i| http::echo_request(&format!("never.{i}"), &big_text))
                .collect(),
            (0..16)
                .map(|i| http::echo_request(&format!("small.{i}"), "x"))
                .collect(),
        ),
        // Each never-reader sends its preface and SETTINGS (an initial
        // window of 0: the broker can send no answer's DATA), then a finite
        // list of calls on fresh streams, then holds the connection.
        // gRPC garbage builds its calls on fresh streams: no template.
        Edge::Grpc => (
            Vec::new(),
            grpc::greeting(None),
            std::iter::once(grpc::greeting(Some(0)))
                .chain(grpc::calls(GRPC_NEVER_READER_LARGE_CALLS, &big_text))
                .collect(),
            std::iter::once(grpc::greeting(Some(0)))
                .chain(grpc::calls(GRPC_NEVER_READER_SMALL_CALLS, "x"))
                .collect(),
        ),
    };
    let cycle = a.edge != Edge::Grpc;
    let (make, read, garbage_kinds): (MakeGarbage, ReadAnswers, _) = match a.edge {
        Edge::Frames => (garbage_frame, frame_answers, GARBAGE_KINDS),
        Edge::Http => (http::garbage, http::answers, http::GARBAGE_KINDS),
        Edge::Grpc => (grpc::garbage, grpc::answers, grpc::GARBAGE_KINDS),
    };
    let greeting = match a.edge {
        Edge::Grpc => grpc::greeting(None),
        Edge::Frames | Edge::Http => Vec::new(),
    };
    let mut abusers: Vec<JoinHandle<()>> = Vec::new();
    {
        let addr = target;
        let (st, sp) = (Arc::clone(&idle), Arc::clone(&stop));
        let n = a.idle;
        abusers.push(thread::spawn(move || run_idle(addr, n, st, sp)));
        let (st, sp) = (Arc::clone(&slow), Arc::clone(&stop));
        let (n, iv) = (a.slowloris, Duration::from_secs_f64(a.slowloris_interval));
        abusers.push(thread::spawn(move || {
            run_slowloris(addr, n, iv, slow_frame, st, sp)
        }));
        let bps = a.never_reader_kib_per_s * 1024;
        let (st, sp, stl) = (Arc::clone(&never), Arc::clone(&stop), Arc::clone(&stalled));
        let n = a.never_readers - a.never_readers / 2;
        abusers.push(thread::spawn(move || {
            let plan = NeverReaderPlan {
                messages: never_frames,
                cycle,
            };
            run_never_readers(addr, n, plan, bps, st, stl, sp)
        }));
        let (st, sp, stl) = (
            Arc::clone(&zeros),
            Arc::clone(&stop),
            Arc::clone(&stalled_zeros),
        );
        let n = a.never_readers / 2;
        abusers.push(thread::spawn(move || {
            let plan = NeverReaderPlan {
                messages: small_frames,
                cycle,
            };
            run_never_readers(addr, n, plan, bps, st, stl, sp)
        }));
        let (gs, sp) = (Arc::clone(&garbage), Arc::clone(&stop));
        let plan = GarbagePlan {
            addr,
            conns: a.garbage_conns,
            rate: a.garbage_rate,
            template,
            limit,
            seed: a.seed,
            close_every: a.garbage_close_every,
            make,
            read,
            greeting,
        };
        if plan.conns > 0 && plan.rate > 0 {
            abusers.push(thread::spawn(move || run_garbage(plan, gs, sp)));
        }
    }

    // /healthz once a second, in its own thread so that a stuck admin
    // endpoint shows as failed probes, not as missing RSS samples.
    let t0 = Instant::now();
    let probes: Arc<Mutex<Vec<Probe>>> = Arc::new(Mutex::new(Vec::new()));
    let probe_stop = Arc::new(AtomicBool::new(false));
    let prober = {
        let (probes, ps, maddr) = (Arc::clone(&probes), Arc::clone(&probe_stop), broker.metrics);
        thread::spawn(move || {
            while !ps.load(Relaxed) {
                let tick = Instant::now();
                let res = http_get(maddr, "/healthz", Duration::from_secs(2));
                let ok = matches!(res, Ok((200, _)));
                if let Ok(mut p) = probes.lock() {
                    p.push(Probe {
                        t: (tick - t0).as_secs_f64(),
                        ok,
                        ms: tick.elapsed().as_secs_f64() * 1e3,
                    });
                }
                pace(tick, Duration::from_secs(1), &ps);
            }
        })
    };

    // Well-behaved load: loadgen and the checker.
    let dur = Duration::from_secs_f64(a.duration);
    let deadline = Duration::from_secs_f64(a.answer_deadline);
    let lg_path = workdir.join("soak-loadgen.json");
    // In open loop mcp-loadgen times a request from its *intended* send
    // time, and at 3x capacity it falls ever further behind its schedule
    // (the broker's backpressure holds its writes): a --timeout shorter
    // than the run would expire requests that are merely late. With the
    // whole run as timeout, `timeout` means what the checker's `lost` does:
    // no answer by `answer_deadline` after the last send.
    let mut lg_args: Vec<String> = vec![
        "--connections".into(),
        a.loadgen_connections.to_string(),
        "--rate".into(),
        format!("{rate}"),
        "--warmup".into(),
        "0s".into(),
        "--duration".into(),
        format!("{}s", a.duration),
        "--timeout".into(),
        format!("{}s", a.duration + a.answer_deadline + 1.0),
        "--drain".into(),
        format!("{}s", a.answer_deadline),
    ];
    if a.edge == Edge::Grpc {
        // Calls in flight in the generator at once (each is a task and an
        // HTTP/2 stream): bounded, and twice the broker's default
        // `grpc.max_concurrent_requests`, so that its own bound is reached.
        lg_args.extend(["--concurrency".into(), "2048".into()]);
    }
    log(format!(
        "load phase {:.0} s: loadgen {rate} req/s ({}x {capacity:.0}), checker {} req/s, \
         {} idle, {} slowloris, {} never-readers, {} garbage frames/s",
        a.duration,
        a.overload,
        a.checker_rate,
        a.idle,
        a.slowloris,
        a.never_readers,
        a.garbage_rate
    ));
    let mut lg = Some(run_loadgen(&a, target, &lg_args, &lg_path)?);
    let load_start = Instant::now();
    let send_until = load_start + dur;
    let drain_until = send_until + deadline;
    let grace_until = drain_until + Duration::from_secs_f64(a.grace);
    let checkers: Vec<JoinHandle<CheckerResult>> = (0..a.checker_conns)
        .map(|i| {
            let (addr, ab) = (target, Arc::clone(&abort));
            let r = a.checker_rate as f64 / a.checker_conns.max(1) as f64;
            let edge = a.edge;
            let deadlines = (send_until, drain_until, grace_until);
            thread::spawn(move || match edge {
                Edge::Grpc => grpc::run_checker(i, addr, r, deadlines, ab),
                Edge::Frames | Edge::Http => {
                    run_checker(i, addr, CheckerWire::new(edge, i), r, deadlines, ab)
                }
            })
        })
        .collect();

    // Sample until the well-behaved clients are done (bounded by the answer
    // deadline plus slack), then stop the abusers and sample `after` more.
    let mut samples: Vec<Sample> = Vec::new();
    let mut failure: Option<String> = None;
    let mut lg_status = None;
    let mut next_sample = Instant::now();
    let mut abusers_stopped_at: Option<Instant> = None;
    let hard_end = grace_until + Duration::from_secs(15);
    loop {
        let now = Instant::now();
        if let Some(c) = lg.as_mut()
            && let Some(st) = c.try_wait()?
        {
            lg_status = Some(st);
            lg = None;
        }
        let clients_done = lg.is_none() && checkers.iter().all(JoinHandle::is_finished);
        let phase = if now < send_until {
            "load"
        } else if abusers_stopped_at.is_none() {
            "drain"
        } else {
            "after"
        };
        let sample = proc_sample(broker.pid);
        match sample {
            None => {
                failure.get_or_insert_with(|| "the broker process died".into());
            }
            Some((rss, ..)) if rss > a.rss_limit_mb as f64 => {
                failure.get_or_insert_with(|| {
                    format!(
                        "RSS {rss:.0} MiB passed --rss-limit-mb {} at t={:.1} s: run stopped",
                        a.rss_limit_mb,
                        (now - t0).as_secs_f64()
                    )
                });
            }
            _ => {}
        }
        if now >= next_sample {
            next_sample += Duration::from_secs(1);
            if let Some((rss, threads, cpu)) = sample {
                samples.push(Sample {
                    t: (now - t0).as_secs_f64(),
                    phase,
                    rss_mib: rss,
                    threads,
                    cpu_s: cpu,
                    idle_open: idle.open.load(Relaxed),
                    slowloris_open: slow.open.load(Relaxed),
                    never_readers_open: never.open.load(Relaxed) + zeros.open.load(Relaxed),
                    never_readers_stalled: stalled.load(Relaxed) + stalled_zeros.load(Relaxed),
                    garbage_frames: garbage.conn.frames_sent.load(Relaxed),
                });
                if phase == "load" && samples.len().is_multiple_of(5) {
                    log(format!(
                        "t={:>4.0}s RSS {rss:>7.1} MiB, idle {} slowloris {} never-readers {} ({} stalled)",
                        (now - t0).as_secs_f64(),
                        idle.open.load(Relaxed),
                        slow.open.load(Relaxed),
                        never.open.load(Relaxed) + zeros.open.load(Relaxed),
                        stalled.load(Relaxed) + stalled_zeros.load(Relaxed)
                    ));
                }
            }
        }
        if failure.is_some() {
            abort.store(true, Relaxed);
            if let Some(c) = lg.take() {
                lg_status = interrupt(c);
            }
            break;
        }
        if abusers_stopped_at.is_none() && now >= send_until && (clients_done || now >= hard_end) {
            if !clients_done {
                failure = Some("well-behaved clients did not finish by the hard deadline".into());
                abort.store(true, Relaxed);
                if let Some(c) = lg.take() {
                    lg_status = interrupt(c);
                }
            }
            log("well-behaved clients done; closing the abusers");
            stop.store(true, Relaxed);
            abusers_stopped_at = Some(now);
        }
        if let Some(t) = abusers_stopped_at
            && now >= t + Duration::from_secs_f64(a.after)
        {
            break;
        }
        thread::sleep(Duration::from_millis(100));
    }
    stop.store(true, Relaxed);
    for h in abusers {
        let _ = h.join();
    }
    let checks: Vec<CheckerResult> = checkers.into_iter().filter_map(|h| h.join().ok()).collect();
    probe_stop.store(true, Relaxed);
    let _ = prober.join();

    // Final counters, then SIGTERM and the time the broker takes to exit.
    let after_scrape = http_get(broker.metrics, "/metrics", Duration::from_secs(5));
    let (after, scrape_error) = match &after_scrape {
        Ok((_, b)) => (counters(b), None),
        Err(e) => (BTreeMap::new(), Some(e.to_string())),
    };
    let term_at = Instant::now();
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(broker.pid, libc::SIGTERM) };
    let mut exit = None;
    while term_at.elapsed() < Duration::from_secs(60) {
        if let Some(st) = broker.child.try_wait()? {
            exit = Some(st);
            break;
        }
        thread::sleep(Duration::from_millis(50));
    }
    let shutdown_s = term_at.elapsed().as_secs_f64();
    let exit_desc = match exit {
        Some(st) => match (st.code(), st.signal()) {
            (Some(c), _) => format!("exit {c}"),
            (_, Some(s)) => format!("signal {s}"),
            _ => st.to_string(),
        },
        None => {
            let _ = broker.child.kill();
            let _ = broker.child.wait();
            "did not exit within 60 s (killed)".into()
        }
    };
    log(format!(
        "broker stopped: {exit_desc} after {shutdown_s:.1} s"
    ));

    // ------------------------------------------------------------ report
    let lgrep = read_json(&lg_path);
    let lg_kinds = lgrep["errors_by_kind"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    let lg_kind = |k: &str| lg_kinds.get(k).and_then(Value::as_u64).unwrap_or(0);
    let lg_lost = lg_kind("timeout") + lg_kind("connection_lost");
    let lg_dup = lg_kind("unknown_correlation");
    let mut ck = CheckerResult::default();
    for c in &checks {
        ck.sent += c.sent;
        ck.unsent += c.unsent;
        ck.answered += c.answered;
        ck.lost += c.lost;
        ck.late += c.late;
        ck.duplicates += c.duplicates;
        ck.unknown += c.unknown;
        ck.invalid += c.invalid;
        ck.progress += c.progress;
        ck.conn_closed_eof += c.conn_closed_eof;
        ck.conn_closed_reset += c.conn_closed_reset;
        ck.connect_failures += c.connect_failures;
        for (k, v) in &c.outcomes {
            *ck.outcomes.entry(k.clone()).or_default() += v;
        }
        ck.latencies_us.extend_from_slice(&c.latencies_us);
    }
    ck.latencies_us.sort_unstable();
    let load_rss: Vec<f64> = samples
        .iter()
        .filter(|s| s.phase == "load")
        .map(|s| s.rss_mib)
        .collect();
    let mut plat = plateau(&load_rss);
    if failure.is_some() {
        plat["met"] = json!(false);
    }
    let probes = probes.lock().map(|p| p.clone()).unwrap_or_default();
    let probes_ok = probes.iter().filter(|p| p.ok).count();
    let probe_max_ms = probes.iter().map(|p| p.ms).fold(0.0f64, f64::max);
    let deltas: BTreeMap<String, f64> = after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, d)| *d != 0.0)
        .collect();
    let (log_levels, log_top) = log_summary(&broker.log_path);
    let lg_failure = lgrep["failure"].as_str().map(str::to_owned);
    let checker_dup = ck.duplicates + ck.unknown;
    let checks_table = vec![
        (
            "RSS plateaus",
            format!(
                "max RSS of the last {} s of load ≤ {PLATEAU_TOLERANCE} × max of the {} s before",
                plat["window_s"], plat["window_s"]
            ),
            format!(
                "{:.1} MiB vs {:.1} MiB (×{:.3}); slope over the second half {:+.2} MiB/s",
                plat["max_last_window_mib"].as_f64().unwrap_or(0.0),
                plat["max_previous_window_mib"].as_f64().unwrap_or(0.0),
                plat["ratio"].as_f64().unwrap_or(0.0),
                plat["slope_second_half_mib_per_s"].as_f64().unwrap_or(0.0)
            ),
            plat["met"].as_bool(),
        ),
        (
            "Checker: lost answers",
            format!(
                "0 (no final answer within {} s of the load's end)",
                a.answer_deadline
            ),
            format!(
                "{} of {} sent ({} of them answered within {} s after the deadline)",
                ck.lost,
                ck.sent - ck.unsent,
                ck.late,
                a.grace
            ),
            Some(ck.lost == 0),
        ),
        (
            "Checker: duplicated answers",
            "0 (second final answer, or an answer to no request)".into(),
            format!(
                "{} duplicate(s), {} unknown id(s)",
                ck.duplicates, ck.unknown
            ),
            Some(checker_dup == 0),
        ),
        (
            "Checker: connections closed by the broker",
            "0".into(),
            format!("{}", ck.conn_closed_eof + ck.conn_closed_reset),
            Some(ck.conn_closed_eof + ck.conn_closed_reset == 0),
        ),
        (
            "Loadgen: lost answers",
            "0 `timeout` + `connection_lost`".into(),
            if lgrep.is_object() {
                format!("{lg_lost}")
            } else {
                "no report".into()
            },
            Some(lg_lost == 0 && lgrep.is_object()),
        ),
        (
            "Loadgen: duplicated answers",
            "0 `unknown_correlation`".into(),
            if lgrep.is_object() {
                format!("{lg_dup}")
            } else {
                "no report".into()
            },
            Some(lg_dup == 0 && lgrep.is_object()),
        ),
        (
            "Loadgen completed",
            "no `failure`".into(),
            match (&lg_failure, lgrep.is_object()) {
                (Some(f), _) => f.clone(),
                (None, true) => "completed".into(),
                (None, false) => "no report".into(),
            },
            Some(lg_failure.is_none() && lgrep.is_object()),
        ),
        (
            "Broker stayed up",
            "alive, RSS under the limit".into(),
            failure.clone().unwrap_or_else(|| "yes".into()),
            Some(failure.is_none()),
        ),
        (
            "/healthz",
            "200 within 2 s, every second".into(),
            format!(
                "{probes_ok} of {} probes; slowest {probe_max_ms:.0} ms",
                probes.len()
            ),
            Some(probes_ok == probes.len() && !probes.is_empty()),
        ),
        (
            "Clean shutdown",
            "exit 0 within 60 s of SIGTERM".into(),
            format!("{exit_desc} after {shutdown_s:.1} s"),
            Some(exit_desc == "exit 0"),
        ),
    ];
    let passed = checks_table.iter().all(|c| c.3 == Some(true));

    let abusers_json = vec![
        idle.report("idle", a.idle),
        slow.report("slowloris", a.slowloris),
        never.report("never_reader_calls", a.never_readers - a.never_readers / 2),
        zeros.report(
            match a.edge {
                Edge::Frames => "never_reader_zeros",
                Edge::Http | Edge::Grpc => "never_reader_small_calls",
            },
            a.never_readers / 2,
        ),
        garbage.conn.report("garbage", a.garbage_conns),
    ];
    let garbage_json = json!({
        "kinds": garbage_kinds,
        "sent_by_kind": garbage_kinds.iter().zip(&garbage.sent_by_kind)
            .map(|(k, v)| (k.to_string(), v.load(Relaxed))).collect::<BTreeMap<_, _>>(),
        "closed_after_oversized_prefix": garbage.closed_after_oversized.load(Relaxed),
        "closed_otherwise": garbage.closed_otherwise.load(Relaxed),
        "answers": garbage.answers.lock().map(|m| m.clone()).unwrap_or_default(),
    });
    let lat = |q| percentile(&ck.latencies_us, q);
    let checker_json = json!({
        "connections": a.checker_conns,
        "rate": a.checker_rate,
        "sent": ck.sent,
        "unsent_on_close": ck.unsent,
        "answered": ck.answered,
        "lost": ck.lost,
        "lost_but_answered_in_grace": ck.late,
        "duplicates": ck.duplicates,
        "unknown_ids": ck.unknown,
        "invalid_frames": ck.invalid,
        "progress_frames": ck.progress,
        "closed_by_broker_fin": ck.conn_closed_eof,
        "closed_by_broker_reset": ck.conn_closed_reset,
        "connect_failures": ck.connect_failures,
        "outcomes": ck.outcomes,
        "latency_us": {"p50": lat(0.5), "p99": lat(0.99), "max": ck.latencies_us.last()},
    });
    let command = a
        .command
        .clone()
        .unwrap_or_else(|| std::env::args().collect::<Vec<_>>().join(" "));
    let mut name = format!("soak-{date}-{}", m["host"].as_str().unwrap_or("host"));
    if a.edge != Edge::Frames {
        name = format!("{name}-{}", a.edge.name());
    }
    if let Some(t) = &a.tag {
        name = format!("{name}-{t}");
    }
    let loadavg_end = std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default();
    let doc = json!({
        "command": command,
        "note": a.note,
        "date": when,
        "machine": m,
        "loadavg_end": loadavg_end,
        "passed": passed,
        "checks": checks_table.iter().map(|c| json!({
            "check": c.0, "criterion": c.1, "measured": c.2, "met": c.3})).collect::<Vec<_>>(),
        "settings": {
            "duration_s": a.duration, "shards": shards, "overload": a.overload,
            "capacity_rps": capacity, "capacity_measured": a.capacity.is_none(),
            "rate_rps": rate, "loadgen_connections": a.loadgen_connections,
            "idle": a.idle, "slowloris": a.slowloris,
            "slowloris_interval_s": a.slowloris_interval,
            "never_readers": a.never_readers, "never_reader_arg_kib": a.never_reader_arg_kib,
            "never_reader_kib_per_s": a.never_reader_kib_per_s,
            "garbage_conns": a.garbage_conns, "garbage_rate": a.garbage_rate,
            "garbage_close_every": a.garbage_close_every,
            "checker_conns": a.checker_conns, "checker_rate": a.checker_rate,
            "answer_deadline_s": a.answer_deadline, "grace_s": a.grace, "rss_limit_mb": a.rss_limit_mb,
            "edge": a.edge.name(), "loadgen_pipeline": a.loadgen_pipeline,
            "mcp_version": a.mcp_version,
            "limit_key": limit_key, "limit_bytes": limit, "broker_ready_line": broker.ready_line,
        },
        "failure": failure,
        "capacity_run": capacity_report,
        "loadgen": lgrep,
        "loadgen_exit": lg_status.map(|s| s.to_string()),
        "checker": checker_json,
        "abusers": abusers_json,
        "garbage": garbage_json,
        "rss_plateau": plat,
        "healthz": {"probes": probes.len(), "ok": probes_ok, "max_ms": probe_max_ms},
        "metrics_deltas": deltas,
        "metrics_scrape_error": scrape_error,
        "broker_log_levels": log_levels,
        "broker_log_top": log_top,
        "shutdown": {"result": exit_desc, "seconds": shutdown_s},
        "samples": samples,
        "healthz_probes": probes,
        "elapsed_s": started.elapsed().as_secs_f64(),
    });
    let base = a.out.join(&name);
    std::fs::write(
        base.with_extension("json"),
        serde_json::to_string_pretty(&doc)?,
    )?;
    let md = markdown(&doc, &name);
    std::fs::write(base.with_extension("md"), &md)?;
    println!("{md}");
    log(format!(
        "report: {0}.md and {0}.json ({1})",
        base.display(),
        if passed { "PASSED" } else { "NOT PASSED" }
    ));
    // The report is the result; the exit status says whether it passed.
    if !passed {
        std::process::exit(2);
    }
    Ok(())
}

fn fmt_n(v: &Value) -> String {
    match v {
        Value::Null => "n/a".into(),
        Value::Number(n) => match n.as_f64() {
            Some(f) if f.fract() != 0.0 => format!("{f:.1}"),
            _ => n.to_string(),
        },
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn markdown(d: &Value, name: &str) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let m = &d["machine"];
    let s = &d["settings"];
    let _ = writeln!(
        o,
        "# Overload and abuse soak{}, {} on {}\n",
        match s["edge"].as_str() {
            Some("http") => " (MCP HTTP edge)",
            Some("grpc") => " (gRPC edge)",
            _ => "",
        },
        fmt_n(&d["date"]),
        fmt_n(&m["host"])
    );
    if let Some(note) = d["note"].as_str() {
        let _ = writeln!(o, "> {note}\n");
    }
    let _ = writeln!(
        o,
        "Written by `bench/src/bin/soak.rs` (issue 18). Command:\n\n```sh\n{}\n```\n",
        fmt_n(&d["command"])
    );
    let _ = writeln!(
        o,
        "**Result: {}**\n",
        if d["passed"].as_bool() == Some(true) {
            "PASSED"
        } else {
            "NOT PASSED"
        }
    );
    if let Some(f) = d["failure"].as_str() {
        let _ = writeln!(o, "Run stopped early: {f}\n");
    }
    let _ = writeln!(
        o,
        "| Check | Criterion | Measured | Met |\n|---|---|---|---|"
    );
    for c in d["checks"].as_array().into_iter().flatten() {
        let met = match c["met"].as_bool() {
            Some(true) => "yes",
            Some(false) => "**no**",
            None => "n/a",
        };
        let _ = writeln!(
            o,
            "| {} | {} | {} | {met} |",
            fmt_n(&c["check"]),
            fmt_n(&c["criterion"]),
            fmt_n(&c["measured"])
        );
    }
    let _ = writeln!(o, "\n## Machine and settings\n");
    let _ = writeln!(
        o,
        "- `nproc` {}; CPU `{}`; kernel `{}`; commit `{}`; load average {} at start, {} at end",
        fmt_n(&m["nproc"]),
        fmt_n(&m["cpu_model"]),
        fmt_n(&m["kernel"]),
        fmt_n(&m["commit"]),
        fmt_n(&m["loadavg_start"]),
        fmt_n(&d["loadavg_end"])
    );
    let http = s["edge"].as_str() == Some("http");
    let grpc = s["edge"].as_str() == Some("grpc");
    let _ = writeln!(
        o,
        "- edge: {}; broker: {} shard(s), `echo` router only, every listener on 127.0.0.1 \
         port 0, other settings default ({} {} bytes); nothing pinned: broker, load generator \
         and abusers share all CPUs",
        match (http, grpc) {
            (true, _) => "MCP Streamable HTTP (`POST /mcp`)",
            (_, true) => "gRPC (`turbomcp.mcp.v1.McpService`)",
            _ => "frames",
        },
        fmt_n(&s["shards"]),
        fmt_n(&s["limit_key"]),
        fmt_n(&s["limit_bytes"])
    );
    let in_flight = if http {
        format!(
            "{} connections × `--pipeline {}`, protocol {}",
            fmt_n(&s["loadgen_connections"]),
            fmt_n(&s["loadgen_pipeline"]),
            s["mcp_version"]
                .as_str()
                .unwrap_or("2025-11-25 (mcp-loadgen's default: sessions)")
        )
    } else if grpc {
        format!(
            "{} connections, at most 2,048 calls in flight",
            fmt_n(&s["loadgen_connections"])
        )
    } else {
        format!("{} connections", fmt_n(&s["loadgen_connections"]))
    };
    let _ = writeln!(
        o,
        "- capacity {} req/s ({}); well-behaved load `mcp-loadgen --rate {}` ({}× capacity, \
         {in_flight}, open loop, `echo {{\"text\":\"hello\"}}`) for {} s; `--drain` {} s and \
         `--timeout` the whole run (it counts from the intended send time, which falls ever \
         further behind at 3× capacity), so `timeout` = no answer by the drain's end",
        fmt_n(&s["capacity_rps"]),
        match (s["capacity_measured"].as_bool(), http) {
            (Some(true), false) => {
                "measured first: mcp-loadgen closed loop, 4 connections, 256 in flight".into()
            }
            (Some(true), true) => format!(
                "measured first: mcp-loadgen closed loop, 8 connections × `--pipeline {}`",
                fmt_n(&s["loadgen_pipeline"])
            ),
            _ => "given with --capacity".into(),
        },
        fmt_n(&s["rate_rps"]),
        fmt_n(&s["overload"]),
        fmt_n(&s["duration_s"]),
        fmt_n(&s["answer_deadline_s"])
    );
    let _ = writeln!(
        o,
        "- checker: {} connections, {} `echo` calls/s in total{}, unique {}, each \
         must get exactly one final answer within {} s of the load's end",
        fmt_n(&s["checker_conns"]),
        fmt_n(&s["checker_rate"]),
        match (http, grpc) {
            (true, _) => " (stateless 2026-07-28 POSTs, pipelined on keep-alive connections)",
            (_, true) =>
                " (tonic clients, one channel each; an answer must echo its own call's id)",
            _ => "",
        },
        match (http, grpc) {
            (true, _) => "JSON-RPC ids",
            (_, true) => "ids in the echoed text",
            _ => "correlation ids",
        },
        fmt_n(&s["answer_deadline_s"])
    );
    let common = format!(
        "- abusers: {idle} idle connections; {slow} slowloris (one byte of a valid {unit} every \
         {iv} s); {nr} never-readers, never reading, each sending at most {kib} KiB/s \
         (0 = unbounded): half pipelined `echo` calls with {arg} KiB arguments, ",
        unit = match (http, grpc) {
            (true, _) => "request",
            (_, true) => "HTTP/2 preface and SETTINGS frame",
            _ => "frame",
        },
        idle = fmt_n(&s["idle"]),
        slow = fmt_n(&s["slowloris"]),
        iv = fmt_n(&s["slowloris_interval_s"]),
        nr = fmt_n(&s["never_readers"]),
        kib = fmt_n(&s["never_reader_kib_per_s"]),
        arg = fmt_n(&s["never_reader_arg_kib"]),
    );
    let rest = if grpc {
        format!(
            "half small `echo` calls; both raw HTTP/2 advertising a stream window of 0 (the \
             broker can send no answer's DATA), at most {} and {} calls on fresh streams, then \
             holding the connection; {gc} garbage connections sending {gr} pieces/s in all after \
             the preface (random bytes, truncated and bit-flipped calls and HEADERS frames of \
             random HPACK in turn, and a DATA frame past the 16 KiB frame size every {ge}th \
             piece). Every abuser reconnects when the broker closes it.",
            GRPC_NEVER_READER_LARGE_CALLS,
            GRPC_NEVER_READER_SMALL_CALLS,
            gc = fmt_n(&s["garbage_conns"]),
            gr = fmt_n(&s["garbage_rate"]),
            ge = fmt_n(&s["garbage_close_every"]),
        )
    } else if http {
        format!(
            "half pipelined small `echo` calls (answers piling up unread); {gc} garbage \
             connections sending {gr} pieces/s in all (random bytes, truncated and bit-flipped \
             requests and valid heads with bodies that are not JSON in turn, and a head past \
             `max_header_bytes` every {ge}th piece). Every abuser reconnects when the broker \
             closes it.",
            gc = fmt_n(&s["garbage_conns"]),
            gr = fmt_n(&s["garbage_rate"]),
            ge = fmt_n(&s["garbage_close_every"]),
        )
    } else {
        format!(
            "half zero bytes (each 4 a zero-length frame that the broker answers with an error; \
             the table counts 64 KiB blocks as their frames); {gc} garbage connections sending \
             {gr} frames/s in all (random bodies, truncated and bit-flipped requests and \
             zero-length frames in turn, and an oversized prefix every {ge}th frame). Every \
             abuser reconnects when the broker closes it.",
            gc = fmt_n(&s["garbage_conns"]),
            gr = fmt_n(&s["garbage_rate"]),
            ge = fmt_n(&s["garbage_close_every"]),
        )
    };
    let _ = writeln!(o, "{common}{rest}");
    let lg = &d["loadgen"];
    let _ = writeln!(o, "\n## Well-behaved load\n");
    let _ = writeln!(
        o,
        "mcp-loadgen: scheduled {}, sent {}, requests ended {}, ok {}, errors {}; offered {} req/s, \
         achieved {} req/s; kept up: {}; latency p50 {} µs, p99 {} µs, max {} µs; {}{}.",
        fmt_n(&lg["scheduled"]),
        fmt_n(&lg["sent"]),
        fmt_n(&lg["requests"]),
        fmt_n(&lg["ok"]),
        fmt_n(&lg["errors"]),
        fmt_n(&lg["offered_rps"]),
        fmt_n(&lg["achieved_rps"]),
        fmt_n(&lg["kept_up"]),
        fmt_n(&lg["latency_us"]["p50"]),
        fmt_n(&lg["latency_us"]["p99"]),
        fmt_n(&lg["latency_us"]["max"]),
        fmt_n(&d["loadgen_exit"]),
        lg["failure"]
            .as_str()
            .map(|f| format!("; failure: {f}"))
            .unwrap_or_default()
    );
    let kinds = lg["errors_by_kind"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    if !kinds.is_empty() {
        let _ = writeln!(
            o,
            "\nmcp-loadgen errors by kind:\n\n| Kind | Count |\n|---|---|"
        );
        for (k, v) in kinds {
            let _ = writeln!(o, "| `{k}` | {} |", fmt_n(&v));
        }
    }
    let _ = writeln!(
        o,
        "\nmcp-loadgen counts a request with no answer by `--timeout` once, as `timeout`, and \
         an answer that comes later in `late_responses` (not as an error); the checker below \
         tells late answers from missing ones for its own calls."
    );
    let c = &d["checker"];
    let _ = writeln!(
        o,
        "\nChecker: sent {} ({} never written: their connection had closed), answered {}, lost \
         {}, duplicated {}, unknown ids {}, invalid answers {}; connections closed by the broker \
         {} (FIN) + {} (reset); latency p50 {} µs, p99 {} µs, max {} µs.",
        fmt_n(&c["sent"]),
        fmt_n(&c["unsent_on_close"]),
        fmt_n(&c["answered"]),
        fmt_n(&c["lost"]),
        fmt_n(&c["duplicates"]),
        fmt_n(&c["unknown_ids"]),
        fmt_n(&c["invalid_frames"]),
        fmt_n(&c["closed_by_broker_fin"]),
        fmt_n(&c["closed_by_broker_reset"]),
        fmt_n(&c["latency_us"]["p50"]),
        fmt_n(&c["latency_us"]["p99"]),
        fmt_n(&c["latency_us"]["max"])
    );
    if let Some(oc) = c["outcomes"].as_object() {
        let list: Vec<String> = oc
            .iter()
            .map(|(k, v)| format!("`{k}` {}", fmt_n(v)))
            .collect();
        let _ = writeln!(
            o,
            "Checker answers by kind: {}.",
            if list.is_empty() {
                "none".into()
            } else {
                list.join(", ")
            }
        );
    }
    let _ = writeln!(o, "\n## Abusers\n");
    let _ = writeln!(
        o,
        "| Kind | Configured | Connects | Connect failures | Closed by broker (FIN) | (reset) | \
         Lifetime p50 / max (s) | Bytes sent | Messages sent | Bytes received |\n\
         |---|---|---|---|---|---|---|---|---|---|"
    );
    for ab in d["abusers"].as_array().into_iter().flatten() {
        let secs = |v: &Value| {
            v.as_u64()
                .map_or("n/a".into(), |ms| format!("{:.1}", ms as f64 / 1e3))
        };
        let _ = writeln!(
            o,
            "| {} | {} | {} | {} | {} | {} | {} / {} | {} | {} | {} |",
            fmt_n(&ab["kind"]),
            fmt_n(&ab["configured"]),
            fmt_n(&ab["connects"]),
            fmt_n(&ab["connect_failures"]),
            fmt_n(&ab["closed_by_broker_fin"]),
            fmt_n(&ab["closed_by_broker_reset"]),
            secs(&ab["lifetime_ms_p50"]),
            secs(&ab["lifetime_ms_max"]),
            fmt_n(&ab["bytes_sent"]),
            fmt_n(&ab["frames_sent"]),
            fmt_n(&ab["bytes_received"])
        );
    }
    let g = &d["garbage"];
    let kinds: Vec<String> = g["kinds"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(|k| format!("`{k}` {}", fmt_n(&g["sent_by_kind"][k])))
        .collect();
    let _ = writeln!(
        o,
        "\nGarbage sent by kind: {}. Garbage connections the broker closed after the closing \
         kind ({}) had begun to be written on them (the documented outcome): {}; closed \
         without one: {}.",
        kinds.join(", "),
        match (http, grpc) {
            (true, _) => "a head past `max_header_bytes`, answered 431",
            (_, true) => "a DATA frame past the frame size, a FRAME_SIZE_ERROR",
            _ => "an oversized length prefix",
        },
        fmt_n(&g["closed_after_oversized_prefix"]),
        fmt_n(&g["closed_otherwise"])
    );
    if let Some(ans) = g["answers"].as_object() {
        let list: Vec<String> = ans
            .iter()
            .map(|(k, v)| format!("`{k}` {}", fmt_n(v)))
            .collect();
        let _ = writeln!(
            o,
            "\nAnswers to garbage: {}.",
            if list.is_empty() {
                "none".into()
            } else {
                list.join(", ")
            }
        );
    }
    let _ = writeln!(
        o,
        "\n## Broker counters (`/metrics`, change over the run, summed over shards)\n"
    );
    match d["metrics_scrape_error"].as_str() {
        Some(e) => {
            let _ = writeln!(o, "Final scrape failed: {e}");
        }
        None => {
            let _ = writeln!(o, "| Counter | Change |\n|---|---|");
            for (k, v) in d["metrics_deltas"].as_object().into_iter().flatten() {
                let _ = writeln!(o, "| `{k}` | {} |", fmt_n(v));
            }
        }
    }
    let _ = writeln!(o, "\n## Broker log\n");
    let levels: Vec<String> = d["broker_log_levels"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| format!("{k} {}", fmt_n(v)))
        .collect();
    let _ = writeln!(
        o,
        "Lines by level (RUST_LOG=info unless set: connection closes and their reasons are logged at info): {}. Most frequent (digits as `#`):\n",
        if levels.is_empty() {
            "none".into()
        } else {
            levels.join(", ")
        }
    );
    for t in d["broker_log_top"].as_array().into_iter().flatten() {
        let _ = writeln!(
            o,
            "- {} × `{}`",
            fmt_n(&t[1]),
            fmt_n(&t[0]).replace('`', "'")
        );
    }
    let _ = writeln!(
        o,
        "\nShutdown: SIGTERM after the run → {} after {:.1} s.",
        fmt_n(&d["shutdown"]["result"]),
        d["shutdown"]["seconds"].as_f64().unwrap_or(0.0)
    );
    let _ = writeln!(o, "\n## RSS (every 5 s; every second in `{name}.json`)\n");
    let _ = writeln!(
        o,
        "| t (s) | Phase | RSS (MiB) | Threads | Broker CPU (s) | Idle open | Slowloris open | \
         Never-readers open (stalled) | Garbage sent |\n|---|---|---|---|---|---|---|---|---|"
    );
    let samples = d["samples"].as_array().cloned().unwrap_or_default();
    let n = samples.len();
    for (i, smp) in samples.iter().enumerate() {
        if !i.is_multiple_of(5) && i + 1 != n {
            continue;
        }
        let _ = writeln!(
            o,
            "| {:.0} | {} | {:.1} | {} | {:.1} | {} | {} | {} ({}) | {} |",
            smp["t"].as_f64().unwrap_or(0.0),
            fmt_n(&smp["phase"]),
            smp["rss_mib"].as_f64().unwrap_or(0.0),
            fmt_n(&smp["threads"]),
            smp["cpu_s"].as_f64().unwrap_or(0.0),
            fmt_n(&smp["idle_open"]),
            fmt_n(&smp["slowloris_open"]),
            fmt_n(&smp["never_readers_open"]),
            fmt_n(&smp["never_readers_stalled"]),
            fmt_n(&smp["garbage_frames"])
        );
    }
    o
}
