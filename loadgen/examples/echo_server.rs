//! A bare frame echo server: the smallest thing that speaks the frame
//! protocol, for measuring the load generator itself (`bench/results/
//! loadgen-self.md`). Every ToolCall is answered at once with a ToolResult
//! whose text is the call's arguments as a JSON object; a ping with a pong;
//! anything else with a not-found error. One monoio runtime per thread,
//! each with its own `SO_REUSEPORT` listener, like the broker's shards.
//!
//! ```text
//! cargo run --release -p mcp-loadgen --example echo_server -- 127.0.0.1:7500 [THREADS] [CPU,CPU...]
//! ```
//!
//! Prints `echo-server ready HOST:PORT` on stdout once listening.

use std::net::SocketAddr;

use bytes::BytesMut;
use mcp_schema::encode::ReplyTo;
use mcp_schema::verify::VerifiedRequest;
use mcp_schema::{FrameSplitter, ResponseEncoder, write_arguments_json};
use monoio::buf::IoBufMut;
use monoio::io::{AsyncReadRent, AsyncWriteRentExt};
use monoio::net::{ListenerOpts, TcpListener, TcpStream};

fn main() {
    let mut argv = std::env::args().skip(1);
    let addr: SocketAddr = argv
        .next()
        .unwrap_or_else(|| "127.0.0.1:7500".into())
        .parse()
        .expect("usage: echo_server HOST:PORT [THREADS] [CPUS]");
    let threads: usize = argv.next().map_or(1, |t| t.parse().expect("THREADS"));
    let cpus: Vec<usize> = argv
        .next()
        .map(|c| c.split(',').map(|n| n.parse().expect("CPU")).collect())
        .unwrap_or_default();
    // Bind the first listener here so that port 0 resolves once and every
    // thread shares the port.
    let opts = ListenerOpts::new().reuse_port(true);
    let probe = std::net::TcpListener::bind(addr).expect("bind");
    let addr = probe.local_addr().expect("local addr");
    drop(probe);
    let mut handles = Vec::new();
    for t in 0..threads {
        let cpu = (!cpus.is_empty()).then(|| cpus[t % cpus.len()]);
        handles.push(std::thread::spawn(move || {
            if let Some(cpu) = cpu {
                monoio::utils::bind_to_cpu_set([cpu]).expect("pin");
            }
            let mut rt = monoio::RuntimeBuilder::<monoio::FusionDriver>::new()
                .enable_timer()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                let listener = TcpListener::bind_with_config(addr, &opts).expect("listen");
                loop {
                    let Ok((s, _)) = listener.accept().await else {
                        continue;
                    };
                    let _ = s.set_nodelay(true);
                    monoio::spawn(serve(s, t as u64));
                }
            });
        }));
    }
    println!("echo-server ready {addr}");
    for h in handles {
        let _ = h.join();
    }
}

async fn serve(mut s: TcpStream, seed: u64) {
    let splitter = FrameSplitter::default();
    let mut enc = ResponseEncoder::new(seed);
    let mut rbuf = BytesMut::with_capacity(64 * 1024);
    let mut wbuf: Vec<u8> = Vec::with_capacity(64 * 1024);
    let mut json = Vec::with_capacity(1024);
    loop {
        if rbuf.capacity() - rbuf.len() < 16 * 1024 {
            rbuf.reserve(64 * 1024);
        }
        // Into the spare capacity: monoio reads at the start of the buffer
        // otherwise, overwriting a partial frame.
        let len = rbuf.len();
        let (res, b) = s.read(rbuf.slice_mut(len..)).await;
        rbuf = b.into_inner();
        match res {
            Ok(0) => return,
            Ok(_) => {}
            Err(e) => return eprintln!("echo-server: read failed: {e}"),
        }
        loop {
            match splitter.next_frame(&mut rbuf) {
                Ok(Some(frame)) => answer(frame, &mut enc, &mut json, &mut wbuf),
                Ok(None) => break,
                Err(e) => return eprintln!("echo-server: bad stream: {e}"),
            }
        }
        if !wbuf.is_empty() {
            let (res, b) = s.write_all(wbuf).await;
            wbuf = b;
            wbuf.clear();
            if let Err(e) = res {
                return eprintln!("echo-server: write failed: {e}");
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
    } else if v.kind() == mcp_schema::RequestKind::Ping {
        out.extend_from_slice(enc.pong(&to));
    } else {
        out.extend_from_slice(enc.error(
            &to,
            mcp_schema::ErrorCode::NotFound,
            "the echo server only answers tool calls and pings",
            None,
        ));
    }
}
