//! What the bare echo servers (`echo-baseline` on monoio, `uring-echo` on
//! the `io-uring` crate) share, so that they differ only in their I/O: the
//! command line, the listener, the CPU each shard is pinned to, and the
//! answer to one frame.

use std::net::SocketAddr;

use mcp_schema::encode::ReplyTo;
use mcp_schema::verify::VerifiedRequest;
use mcp_schema::{ErrorCode, RequestKind, ResponseEncoder, write_arguments_json};

/// `--listen ADDR --shards N --cpus LIST`, the broker's frame-edge settings.
pub struct Args {
    pub listen: SocketAddr,
    pub shards: usize,
    pub cpus: Vec<usize>,
    /// Flags this binary accepts beyond the common ones (e.g. `--zc`).
    pub extra: Vec<String>,
}

/// Parses the common flags; `known_extra` lists the binary's own boolean
/// flags, which land in [`Args::extra`].
pub fn parse_args(name: &str, known_extra: &[&str]) -> Result<Args, String> {
    let mut a = Args {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        shards: 1,
        cpus: Vec::new(),
        extra: Vec::new(),
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
            // A known flag, or `--name=VALUE` for a known `--name=`.
            f if known_extra
                .iter()
                .any(|k| *k == f || (k.ends_with('=') && f.starts_with(k))) =>
            {
                a.extra.push(flag)
            }
            other => {
                return Err(format!(
                    "unknown argument {other}; usage: {name} [--listen ADDR] [--shards N] [--cpus LIST] {}",
                    known_extra.join(" ")
                ));
            }
        }
    }
    if a.shards == 0 {
        a.shards = std::thread::available_parallelism().map_or(1, |n| n.get());
    }
    Ok(a)
}

impl Args {
    /// The broker's pinning rule: broker.cpus in order, else shard i on core
    /// i when there are enough cores.
    pub fn shard_cpu(&self, index: usize) -> Option<usize> {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        self.cpus
            .get(index)
            .copied()
            .or((self.shards <= cores).then_some(index))
    }

    /// One listener per shard, all bound before the ready line, the first
    /// resolving port 0, exactly as the broker does. Returns them with the
    /// address they share.
    pub fn listeners(&self) -> std::io::Result<(SocketAddr, Vec<std::net::TcpListener>)> {
        let first = bind_reuseport(self.listen)?;
        let addr = first.local_addr()?;
        let mut listeners = vec![first];
        for _ in 1..self.shards {
            listeners.push(bind_reuseport(addr)?);
        }
        Ok((addr, listeners))
    }
}

/// The broker's `server::bind_reuseport`, repeated here so the baselines do
/// not link the broker (and wasmtime). `TCP_NODELAY` is set on the listener
/// too: Linux copies it into every accepted socket, which is how `uring-echo`
/// gets it for connections it only knows as registered files.
pub fn bind_reuseport(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    use socket2::{Domain, Socket, Type};
    let s = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    s.set_reuse_address(true)?;
    s.set_reuse_port(true)?;
    s.set_tcp_nodelay(true)?;
    s.set_nonblocking(true)?;
    s.bind(&addr.into())?;
    s.listen(1024)?;
    Ok(s.into())
}

/// Answers one frame into `out`: a ToolCall with a ToolResult whose text is
/// the call's arguments as a JSON object (what the `echo` router returns, so
/// `mcp-loadgen` verifies it like the broker's answers), a Ping with a Pong,
/// anything else with an error. `frame` is dropped before this returns.
pub fn answer(
    frame: bytes::Bytes,
    enc: &mut ResponseEncoder,
    json: &mut Vec<u8>,
    out: &mut Vec<u8>,
) {
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
            "the echo baselines answer tool calls and pings only",
            None,
        ));
    }
}
