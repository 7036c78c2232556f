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
//! echo-baseline [--listen 127.0.0.1:0] [--shards 1] [--cpus 1,2]
//! ```
//! Prints `echo-baseline ready frames=HOST:PORT shards=N` on stdout.

use std::net::SocketAddr;

use bytes::BytesMut;
use mcp_schema::encode::ReplyTo;
use mcp_schema::verify::VerifiedRequest;
use mcp_schema::{ErrorCode, FrameSplitter, RequestKind, ResponseEncoder, write_arguments_json};
use monoio::buf::IoBufMut;
use monoio::io::{AsyncReadRent, AsyncWriteRentExt};
use monoio::net::{TcpListener, TcpStream};

// The broker runs on mimalloc; the baseline must pay the same allocator.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Same read chunk as the broker's shard (`shard::READ_CHUNK`).
const READ_CHUNK: usize = 16 * 1024;

struct Args {
    listen: SocketAddr,
    shards: usize,
    cpus: Vec<usize>,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        shards: 1,
        cpus: Vec::new(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--listen" => a.listen = value()?.parse().map_err(|e| format!("--listen: {e}"))?,
            "--shards" => a.shards = value()?.parse().map_err(|e| format!("--shards: {e}"))?,
            "--cpus" => {
                a.cpus = value()?
                    .split(',')
                    .filter(|s| !s.is_empty())
                    .map(|c| c.parse().map_err(|e| format!("--cpus: {e}")))
                    .collect::<Result<_, _>>()?
            }
            other => {
                return Err(format!(
                    "unknown argument {other}; usage: echo-baseline [--listen ADDR] [--shards N] [--cpus LIST]"
                ));
            }
        }
    }
    if a.shards == 0 {
        a.shards = std::thread::available_parallelism().map_or(1, |n| n.get());
    }
    Ok(a)
}

/// The broker's `server::bind_reuseport`, repeated here so the baseline does
/// not link the broker (and wasmtime).
fn bind_reuseport(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    use socket2::{Domain, Socket, Type};
    let s = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    s.set_reuse_address(true)?;
    s.set_reuse_port(true)?;
    s.set_nonblocking(true)?;
    s.bind(&addr.into())?;
    s.listen(1024)?;
    Ok(s.into())
}

fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("echo-baseline: {e}");
            std::process::exit(2);
        }
    };
    // Every listener is bound before the ready line, the first one resolving
    // port 0, exactly as the broker does.
    let first = bind_reuseport(args.listen).expect("bind");
    let addr = first.local_addr().expect("local addr");
    let mut listeners = vec![first];
    for _ in 1..args.shards {
        listeners.push(bind_reuseport(addr).expect("bind shard listener"));
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut handles = Vec::new();
    for (index, listener) in listeners.into_iter().enumerate() {
        // The broker's pinning rule: broker.cpus in order, else shard i on
        // core i when there are enough cores.
        let cpu = args
            .cpus
            .get(index)
            .copied()
            .or((args.shards <= cores).then_some(index));
        handles.push(std::thread::spawn(move || shard(index, listener, cpu)));
    }
    println!("echo-baseline ready frames={addr} shards={}", args.shards);
    for h in handles {
        let _ = h.join();
    }
}

fn shard(index: usize, listener: std::net::TcpListener, cpu: Option<usize>) {
    if let Some(cpu) = cpu {
        monoio::utils::bind_to_cpu_set([cpu]).expect("pin shard");
    }
    let mut rt = monoio::RuntimeBuilder::<monoio::FusionDriver>::new()
        .enable_timer()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let listener = TcpListener::from_std(listener).expect("listener");
        loop {
            let Ok((s, _)) = listener.accept().await else {
                continue;
            };
            let _ = s.set_nodelay(true);
            monoio::spawn(serve(s, index as u64));
        }
    });
}

async fn serve(mut s: TcpStream, seed: u64) {
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
            Ok(_) => {}
            Err(_) => return,
        }
        loop {
            match splitter.next_frame(&mut rbuf) {
                Ok(Some(frame)) => answer(frame, &mut enc, &mut json, &mut wbuf),
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

fn answer(frame: bytes::Bytes, enc: &mut ResponseEncoder, json: &mut Vec<u8>, out: &mut Vec<u8>) {
    let req = match VerifiedRequest::verify(frame) {
        Ok(r) => r,
        Err(e) => {
            out.extend_from_slice(enc.error(&ReplyTo::UNKNOWN, e.code(), "bad frame", None));
            return;
        }
    };
    let v = req.view();
    let to = v.reply_to();
    if let Some(tc) = v.tool_call() {
        write_arguments_json(Some(tc.arguments()), json);
        let text = std::str::from_utf8(json).unwrap_or("{}");
        out.extend_from_slice(enc.tool_text(&to, tc.id(), text, None, false));
    } else if v.kind() == RequestKind::Ping {
        out.extend_from_slice(enc.pong(&to));
    } else {
        out.extend_from_slice(enc.error(
            &to,
            ErrorCode::NotFound,
            "echo-baseline answers tool calls and pings only",
            None,
        ));
    }
}
