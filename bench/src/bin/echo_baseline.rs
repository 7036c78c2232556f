//! `echo-baseline`: the physical-limit baseline of `scripts/bench`.
//!
//! A bare frame echo server built like the broker's frame edge, minus
//! everything the broker adds on top of the wire: one thread per shard, each
//! with its own monoio runtime pinned to its CPU and its own `SO_REUSEPORT`
//! listener bound before the ready line; per connection one read takes every
//! frame the kernel has, each frame is split and verified with the same
//! codec (`mcp-schema`), and every response of the batch goes out in one
//! write. Each ToolCall is answered with a ToolResult whose text is the
//! call's arguments as a JSON object (what the `echo` router returns), so
//! `mcp-loadgen` verifies it like the broker's answers.
//!
//! What it deliberately lacks, so that the ratio broker/baseline is the cost
//! of the broker itself: routing, the per-connection worker queue, WASM,
//! counters, timeouts, drain.
//!
//! ```text
//! echo-baseline [--listen 127.0.0.1:0] [--shards 1] [--cpus 1,2] [--defer-taskrun]
//!               [--idle-poll-us=N] [--work-ns=N]
//! ```
//! Prints `echo-baseline ready frames=HOST:PORT shards=N` on stdout.
//!
//! `--defer-taskrun` builds monoio's rings with `IORING_SETUP_SINGLE_ISSUER |
//! DEFER_TASKRUN` through `RuntimeBuilder::uring_builder`: the one io_uring
//! setting `uring-echo` found worth having (`bench/results/io-uring.md`),
//! measured here without leaving monoio. Off by default (scripts/bench).
//!
//! `--idle-poll-us=N` runs the broker's own idle poller
//! (`mcp_broker::idle_poll`, `[broker] idle_poll`) with an N µs window on
//! every shard, with the ring the broker then uses (`COOP_TASKRUN`), so
//! that a broker with a window is compared with a baseline that has the
//! same one.
//!
//! `--work-ns=N` spins N ns of user-space CPU after answering each frame:
//! a server that does the same I/O as this one plus a fixed amount of work
//! per request, as a router does. `bench/slo_budget.py` uses it to find how
//! much work per request a server can add and still hold a given share of
//! this baseline's capacity at SLO.

use bytes::BytesMut;
use std::time::{Duration, Instant};

use mcp_bench::echo::{answer, parse_args};
use mcp_broker::config::BrokerSection;
use mcp_broker::idle_poll;
use mcp_broker::shard::Ring;
use mcp_schema::{FrameSplitter, ResponseEncoder};
use monoio::buf::IoBufMut;
use monoio::io::{AsyncReadRent, AsyncWriteRentExt};
use monoio::net::{TcpListener, TcpStream};

// The broker runs on mimalloc; the baseline must pay the same allocator.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Same read chunk as the broker's shard (`edge::frames::READ_CHUNK`).
const READ_CHUNK: usize = 16 * 1024;

fn main() {
    let args = match parse_args(
        "echo-baseline",
        &["--defer-taskrun", "--idle-poll-us=", "--work-ns="],
    ) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("echo-baseline: {e}");
            std::process::exit(2);
        }
    };
    let defer_taskrun = args.extra.iter().any(|f| f == "--defer-taskrun");
    let idle_poll = duration_flag(&args.extra, "--idle-poll-us=", Duration::from_micros);
    let work = duration_flag(&args.extra, "--work-ns=", Duration::from_nanos);
    let (addr, listeners) = args.listeners().expect("bind");
    let mut handles = Vec::new();
    for (index, listener) in listeners.into_iter().enumerate() {
        let cpu = args.shard_cpu(index);
        handles.push(std::thread::spawn(move || {
            shard(index, listener, cpu, defer_taskrun, idle_poll, work)
        }));
    }
    println!("echo-baseline ready frames={addr} shards={}", args.shards);
    for h in handles {
        let _ = h.join();
    }
}

/// The value of `--NAME=N` among `extra` as a duration (`unit` makes it),
/// zero when absent; exits with status 2 on a value that is not a number.
fn duration_flag(extra: &[String], flag: &str, unit: fn(u64) -> Duration) -> Duration {
    match extra
        .iter()
        .find_map(|f| f.strip_prefix(flag))
        .map(str::parse::<u64>)
    {
        None => Duration::ZERO,
        Some(Ok(n)) => unit(n),
        Some(Err(e)) => {
            eprintln!("echo-baseline: {}: {e}", flag.trim_end_matches('='));
            std::process::exit(2);
        }
    }
}

fn shard(
    index: usize,
    listener: std::net::TcpListener,
    cpu: Option<usize>,
    defer_taskrun: bool,
    idle_poll: Duration,
    work: Duration,
) {
    if let Some(cpu) = cpu {
        monoio::utils::bind_to_cpu_set([cpu]).expect("pin shard");
    }
    // The broker's own rule: a poller needs the COOP_TASKRUN ring.
    let ring = Ring::for_config(&BrokerSection {
        io_uring_defer_taskrun: defer_taskrun,
        idle_poll,
        ..BrokerSection::default()
    });
    let mut rt = monoio::RuntimeBuilder::<monoio::FusionDriver>::new()
        .uring_builder(ring.builder())
        .enable_timer()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        if !idle_poll.is_zero() {
            // The broker's shards yield through a queue of their own; so does
            // this one (`idle_poll::run`).
            let yields = std::rc::Rc::new(idle_poll::YieldQueue::default());
            let pump = yields.clone();
            monoio::spawn(async move { pump.run().await });
            monoio::spawn(async move { idle_poll::run(&yields, idle_poll, |_| {}).await });
        }
        let listener = TcpListener::from_std(listener).expect("listener");
        loop {
            let Ok((s, _)) = listener.accept().await else {
                continue;
            };
            let _ = s.set_nodelay(true);
            monoio::spawn(serve(s, index as u64, work));
        }
    });
}

async fn serve(mut s: TcpStream, seed: u64, work: Duration) {
    let splitter = FrameSplitter::default();
    let mut enc = ResponseEncoder::new(seed);
    let mut rbuf = BytesMut::with_capacity(READ_CHUNK);
    let mut wbuf: Vec<u8> = Vec::with_capacity(READ_CHUNK);
    let mut json = Vec::with_capacity(1024);
    loop {
        if rbuf.capacity() - rbuf.len() < 1024 {
            rbuf.reserve(READ_CHUNK);
        }
        // Into the spare capacity: monoio reads at the buffer start otherwise,
        // overwriting a partial frame.
        let held = rbuf.len();
        let (res, b) = s.read(rbuf.slice_mut(held..)).await;
        rbuf = b.into_inner();
        match res {
            Ok(0) => return,
            Ok(_) => idle_poll::note_activity(),
            Err(_) => return,
        }
        loop {
            match splitter.next_frame(&mut rbuf) {
                Ok(Some(frame)) => {
                    answer(frame, &mut enc, &mut json, &mut wbuf);
                    if !work.is_zero() {
                        spin_for(work);
                    }
                }
                Ok(None) => break,
                Err(_) => return,
            }
        }
        if !wbuf.is_empty() {
            let (res, b) = s.write_all(wbuf).await;
            wbuf = b;
            wbuf.clear();
            if res.is_err() {
                return;
            }
        }
    }
}

/// Busy for `work` of wall time on this thread: CPU spent in user space,
/// as a router's work is (the clock is the vDSO's, no system call).
fn spin_for(work: Duration) {
    let until = Instant::now() + work;
    while Instant::now() < until {
        std::hint::spin_loop();
    }
}
