//! The admin endpoint: `GET /metrics` (Prometheus text format), `/healthz`
//! and `/readyz`, on its own small thread.
//!
//! It is off the request path: it only reads the shards' counters (relaxed
//! loads of values each shard alone writes), so a scrape never pauses a
//! shard. The full metric set with latency histograms is issue 7's work;
//! this serves the counters the shards keep today.

use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::shared::Shared;

/// Serves the admin endpoint on `listener` until the process exits.
pub fn serve(listener: TcpListener, shared: Arc<Shared>, routers: Vec<String>) {
    for stream in listener.incoming() {
        let Ok(stream) = stream else { continue };
        let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
        let _ = stream.set_write_timeout(Some(Duration::from_secs(5)));
        if let Err(e) = answer(stream, &shared, &routers) {
            tracing::debug!(error = %e, "admin request failed");
        }
    }
}

fn answer(stream: TcpStream, shared: &Shared, routers: &[String]) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    // Drain the headers; the endpoint takes no request body.
    let mut header = String::new();
    while reader.read_line(&mut header)? > 2 {
        header.clear();
    }
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = path.split('?').next().unwrap_or("");
    let (status, ctype, body) = match (method, path) {
        ("GET", "/metrics") => (
            "200 OK",
            "text/plain; version=0.0.4; charset=utf-8",
            render(shared, routers),
        ),
        ("GET", "/healthz") => ("200 OK", "text/plain", "ok\n".to_string()),
        ("GET", "/readyz") => {
            let ready = !shared.is_draining()
                && shared.stats.iter().all(|s| s.ready.load(Ordering::Relaxed));
            if ready {
                ("200 OK", "text/plain", "ready\n".to_string())
            } else {
                (
                    "503 Service Unavailable",
                    "text/plain",
                    "not ready\n".to_string(),
                )
            }
        }
        ("GET", _) => (
            "404 Not Found",
            "text/plain",
            "not found: try /metrics, /healthz, /readyz\n".to_string(),
        ),
        _ => (
            "405 Method Not Allowed",
            "text/plain",
            "only GET\n".to_string(),
        ),
    };
    let mut s = stream;
    write!(
        s,
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    s.flush()
}

/// The Prometheus text exposition of the shards' counters.
pub fn render(shared: &Shared, routers: &[String]) -> String {
    let mut o = String::with_capacity(4096);
    let counters: [(&str, &str, &str, fn(&crate::shared::ShardStats) -> u64); 9] = [
        (
            "mcp_connections_open",
            "gauge",
            "Frame-edge connections open.",
            |s| s.connections_open.load(Ordering::Relaxed),
        ),
        (
            "mcp_connections_accepted_total",
            "counter",
            "Frame-edge connections accepted.",
            |s| s.connections_accepted.load(Ordering::Relaxed),
        ),
        (
            "mcp_connections_refused_total",
            "counter",
            "Frame-edge connections refused at max_connections_per_shard.",
            |s| s.connections_refused.load(Ordering::Relaxed),
        ),
        (
            "mcp_frames_rejected_total",
            "counter",
            "Frames rejected (verification failed or length over the maximum).",
            |s| s.frames_rejected.load(Ordering::Relaxed),
        ),
        (
            "mcp_frames_received_total",
            "counter",
            "Frames received on the frame edge.",
            |s| s.requests.load(Ordering::Relaxed),
        ),
        (
            "mcp_error_responses_total",
            "counter",
            "Error responses sent for rejected frames.",
            |s| s.error_responses.load(Ordering::Relaxed),
        ),
        (
            "mcp_in_flight_requests",
            "gauge",
            "Requests being handled.",
            |s| s.in_flight.load(Ordering::Relaxed),
        ),
        (
            "mcp_received_bytes_total",
            "counter",
            "Bytes read on the frame edge.",
            |s| s.bytes_in.load(Ordering::Relaxed),
        ),
        (
            "mcp_sent_bytes_total",
            "counter",
            "Bytes written on the frame edge.",
            |s| s.bytes_out.load(Ordering::Relaxed),
        ),
    ];
    for (name, kind, help, get) in counters {
        let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (i, s) in shared.stats.iter().enumerate() {
            let _ = writeln!(o, "{name}{{shard=\"{i}\"}} {}", get(s));
        }
    }
    let _ = writeln!(
        o,
        "# HELP mcp_shards Shards running.\n# TYPE mcp_shards gauge\nmcp_shards {}",
        shared.shards()
    );
    let _ = writeln!(
        o,
        "# HELP mcp_build_info Build information.\n# TYPE mcp_build_info gauge"
    );
    let _ = writeln!(
        o,
        "mcp_build_info{{version=\"{}\",routers=\"{}\"}} 1",
        env!("CARGO_PKG_VERSION"),
        routers.join(",")
    );
    o
}
