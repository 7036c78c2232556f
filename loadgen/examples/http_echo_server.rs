//! A bare MCP Streamable HTTP server: the smallest thing that answers
//! `mcp-loadgen --target http://…` correctly, for measuring the load
//! generator's `http://` target itself (`bench/results/loadgen-self.md`).
//!
//! `initialize` gets a session id, `notifications/initialized` a 202,
//! `tools/call` a text result, `ping` and the lists their empty results,
//! `DELETE` a 200. With `sse` the answers come as one-event SSE streams
//! (chunked), as most SDK servers send them; else as `application/json`.
//! One monoio runtime per thread, each with its own `SO_REUSEPORT`
//! listener.
//!
//! ```text
//! cargo run --release -p mcp-loadgen --example http_echo_server -- 127.0.0.1:7510 [THREADS] [CPU,CPU...] [sse]
//! ```
//!
//! Prints `http-echo-server ready http=HOST:PORT` on stdout once listening.

use std::io::Write;
use std::net::SocketAddr;

use bytes::{Buf, BytesMut};
use monoio::buf::IoBufMut;
use monoio::io::{AsyncReadRent, AsyncWriteRentExt};
use monoio::net::{ListenerOpts, TcpListener, TcpStream};
use serde::Deserialize;
use serde::de::IgnoredAny;

fn main() {
    let mut argv = std::env::args().skip(1);
    let addr: SocketAddr = argv
        .next()
        .unwrap_or_else(|| "127.0.0.1:7510".into())
        .parse()
        .expect("usage: http_echo_server HOST:PORT [THREADS] [CPUS] [sse]");
    let threads: usize = argv.next().map_or(1, |t| t.parse().expect("THREADS"));
    let cpus: Vec<usize> = argv
        .next()
        .filter(|c| !c.is_empty() && c != "-")
        .map(|c| c.split(',').map(|n| n.parse().expect("CPU")).collect())
        .unwrap_or_default();
    let sse = argv.next().is_some_and(|a| a == "sse");
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
                    monoio::spawn(serve(s, sse));
                }
            });
        }));
    }
    println!("http-echo-server ready http={addr}");
    for h in handles {
        let _ = h.join();
    }
}

#[derive(Deserialize)]
struct Rpc<'a> {
    id: Option<u64>,
    #[serde(borrow)]
    method: &'a str,
    #[allow(dead_code)]
    params: Option<IgnoredAny>,
}

async fn serve(mut s: TcpStream, sse: bool) {
    let mut rbuf = BytesMut::with_capacity(64 * 1024);
    let mut wbuf: Vec<u8> = Vec::with_capacity(64 * 1024);
    let mut body: Vec<u8> = Vec::with_capacity(1024);
    loop {
        if rbuf.capacity() - rbuf.len() < 16 * 1024 {
            rbuf.reserve(64 * 1024);
        }
        let len = rbuf.len();
        let (res, b) = s.read(rbuf.slice_mut(len..)).await;
        rbuf = b.into_inner();
        match res {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        // Every complete request in the buffer, answered in one write.
        loop {
            let mut headers = [httparse::EMPTY_HEADER; 32];
            let mut req = httparse::Request::new(&mut headers);
            let Ok(httparse::Status::Complete(n)) = req.parse(&rbuf) else {
                break;
            };
            let clen = req
                .headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case("content-length"))
                .and_then(|h| std::str::from_utf8(h.value).ok()?.trim().parse().ok())
                .unwrap_or(0usize);
            if rbuf.len() < n + clen {
                break;
            }
            let delete = req.method == Some("DELETE");
            let rpc = serde_json::from_slice::<Rpc<'_>>(&rbuf[n..n + clen]);
            body.clear();
            let (status, session) = match (&rpc, delete) {
                (_, true) => ("200 OK", false),
                (Ok(r), _) if r.id.is_none() => ("202 Accepted", false),
                (Ok(r), _) => {
                    let id = r.id.unwrap_or(0);
                    let result = match r.method {
                        "initialize" => {
                            r#"{"protocolVersion":"2025-06-18","capabilities":{"tools":{}},"serverInfo":{"name":"http-echo-server","version":"0"}}"#
                        }
                        "tools/call" => r#"{"content":[{"type":"text","text":"ok"}]}"#,
                        "tools/list" => r#"{"tools":[]}"#,
                        "resources/list" => r#"{"resources":[]}"#,
                        "resources/templates/list" => r#"{"resourceTemplates":[]}"#,
                        "prompts/list" => r#"{"prompts":[]}"#,
                        _ => "{}",
                    };
                    let _ = write!(body, r#"{{"jsonrpc":"2.0","id":{id},"result":{result}}}"#);
                    ("200 OK", r.method == "initialize")
                }
                (Err(_), _) => ("400 Bad Request", false),
            };
            rbuf.advance(n + clen);
            let _ = write!(wbuf, "HTTP/1.1 {status}\r\n");
            if session {
                wbuf.extend_from_slice(b"Mcp-Session-Id: 0123456789abcdef\r\n");
            }
            if body.is_empty() {
                wbuf.extend_from_slice(b"Content-Length: 0\r\n\r\n");
            } else if sse {
                let event_len = b"event: message\ndata: ".len() + body.len() + 2;
                let _ = write!(
                    wbuf,
                    "Content-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n\
                     {event_len:x}\r\nevent: message\ndata: "
                );
                wbuf.extend_from_slice(&body);
                wbuf.extend_from_slice(b"\n\n\r\n0\r\n\r\n");
            } else {
                let _ = write!(
                    wbuf,
                    "Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                    body.len()
                );
                wbuf.extend_from_slice(&body);
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
