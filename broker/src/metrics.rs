//! The admin endpoint and the broker's metrics: `GET /metrics` (Prometheus
//! text exposition 0.0.4), `GET /healthz` (the process answers),
//! `GET /readyz` (every shard accepts, every router is loaded, not
//! draining) and `POST /admin/reload` (re-read the config file, from
//! loopback peers only), on the admin thread. `docs/metrics.md` is the
//! reference.
//!
//! Where the numbers come from:
//! - [`series`]: the label space, fixed at start-up, and each shard's
//!   counters and bucket histograms ([`hist`]), single-writer atomics in the
//!   shard's [`ShardStats`](crate::shared::ShardStats);
//! - [`record`]: the hooks the shards call per request, and the shard-local
//!   HdrHistograms behind the exact-percentile summary;
//! - [`peek`]: a request's outcome, read from its final response frame;
//! - [`collect`]: the admin thread's side of the HdrHistograms (snapshots
//!   through the shards' inboxes, a one-minute sliding window) and the
//!   router pools' state that comes with them.
//!
//! # Invariants
//! - Off the request path: a scrape reads atomics that only their shard
//!   writes (relaxed loads) and asks each shard, through its inbox, for its
//!   HdrHistograms; it never takes a lock a shard takes and never pauses a
//!   shard, and a shard that does not answer within
//!   [`collect::SNAPSHOT_TIMEOUT`] only delays that scrape.
//! - No atomic is written by two threads; nothing on the request path
//!   allocates or locks for metrics.
//! - Every label set is bounded; its capacity is fixed at start-up
//!   ([`series::Layout`]).

pub mod collect;
pub mod hist;
pub mod peek;
pub mod record;
pub mod series;

use std::convert::Infallible;
use std::fmt::Write as _;
use std::net::TcpListener;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{ALLOW, CONTENT_TYPE, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};

pub use collect::{Collected, Collector};
pub use record::{ShardSnapshot, SnapshotRequest};
pub use series::{Edge, HTTP_STATUSES, Layout, Outcome, Reject, ShardSeries, http_status_slot};

use crate::shared::Shared;
use hist::HistSnapshot;

/// Admin connections served at once; one more is closed as soon as it is
/// accepted. Scrapers and probes need a handful; the bound keeps a flood
/// of connections from costing the process more than a few hundred KiB.
pub const MAX_ADMIN_CONNECTIONS: usize = 64;
/// A request's line and headers must arrive within this (also the longest
/// an idle keep-alive connection is kept): a client trickling bytes
/// (slowloris) holds a connection slot for at most this long.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// Read buffer per connection, and so the largest request head: a longer
/// request line or header block is answered 431 and the connection closed.
/// hyper's minimum is 8 KiB; no probe or scraper sends more than 1 KiB.
pub const MAX_HEAD_BYTES: usize = 16 * 1024;
/// The longest any one admin connection lives, requests and keep-alive
/// included: bounds a client that reads a large `/metrics` answer slowly.
pub const CONNECTION_TIMEOUT: Duration = Duration::from_secs(60);
/// Threads that render `/metrics`: a render waits up to
/// [`collect::SNAPSHOT_TIMEOUT`] for the shards, so it runs beside the
/// connections, not on their thread; further scrapes queue for them.
const RENDER_THREADS: usize = 2;

/// What the request handlers share.
struct Admin {
    shared: Arc<Shared>,
    collector: Arc<Collector>,
}

/// How long `POST /admin/reload` waits for the reload's outcome (compiling
/// components and warming their pools on every shard). Within
/// [`CONNECTION_TIMEOUT`], or the connection would close before a slow
/// reload's answer: such a reload is answered 504 and goes on, and its
/// outcome is logged and counted.
const RELOAD_ANSWER_TIMEOUT: Duration = Duration::from_secs(50);
const _: () = assert!(RELOAD_ANSWER_TIMEOUT.as_secs() + 5 < CONNECTION_TIMEOUT.as_secs());

/// The log writer's count of the lines it dropped (`main.rs` sets it): a
/// process-wide fact, as the writer is.
pub static LOG_DROPPED: std::sync::OnceLock<tracing_appender::non_blocking::ErrorCounter> =
    std::sync::OnceLock::new();

/// The admin endpoint on its listener, and the ticker that keeps the
/// summary's window moving between scrapes.
///
/// HTTP/1.1 (hyper) on a current-thread tokio runtime on the thread that
/// calls [`Endpoint::serve`]: connections are served concurrently, up to
/// [`MAX_ADMIN_CONNECTIONS`], each with a header deadline, a head size
/// limit and a lifetime limit, so no client can hold `/readyz` up for
/// another.
pub struct Endpoint {
    rt: tokio::runtime::Runtime,
    listener: TcpListener,
    admin: Arc<Admin>,
}

impl Endpoint {
    /// Makes what the endpoint runs on: its runtime and the thread that
    /// ticks the latency windows. Called before the ready line, so that a
    /// process that cannot make them (out of descriptors or threads) fails
    /// to start: it printed its ready line with an endpoint that never
    /// answered, and `/readyz` hung.
    pub fn new(listener: TcpListener, shared: Arc<Shared>) -> std::io::Result<Endpoint> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .max_blocking_threads(RENDER_THREADS)
            .thread_name("admin-render")
            .build()?;
        let collector = Arc::new(Collector::new(shared.clone()));
        {
            let collector = collector.clone();
            // Without it, a slot would hold whatever the next scrape
            // collects, however long ago it was recorded. It stops with the
            // process.
            std::thread::Builder::new()
                .name("metrics-ticker".into())
                .spawn(move || {
                    loop {
                        std::thread::sleep(collect::SLOT);
                        collector.collect();
                    }
                })?;
        }
        let admin = Arc::new(Admin { shared, collector });
        Ok(Endpoint {
            rt,
            listener,
            admin,
        })
    }

    /// Serves on the calling thread, for the process's life.
    pub fn serve(self) {
        self.rt.block_on(accept_loop(self.listener, self.admin));
    }
}

async fn accept_loop(listener: TcpListener, admin: Arc<Admin>) {
    let listener = match listener
        .set_nonblocking(true)
        .and_then(|()| tokio::net::TcpListener::from_std(listener))
    {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(error = %e, "cannot serve the admin endpoint");
            return;
        }
    };
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_ADMIN_CONNECTIONS));
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .max_buf_size(MAX_HEAD_BYTES)
        .keep_alive(true);
    // A reload may move the endpoint: new connections then go to the new
    // listener, and the old one closes at once (probes and scrapers retry).
    let (tx, mut rebinds) = futures_channel::mpsc::unbounded::<TcpListener>();
    let _ = admin.shared.admin_rebind.set(tx);
    let mut listener = listener;
    loop {
        let accepted = tokio::select! {
            r = listener.accept() => r,
            Some(l) = futures_util_next(&mut rebinds) => {
                match l
                    .set_nonblocking(true)
                    .and_then(|()| tokio::net::TcpListener::from_std(l))
                {
                    Ok(new) => {
                        tracing::info!(addr = ?new.local_addr().ok(), "admin endpoint listening on a new address after a reload");
                        listener = new;
                    }
                    Err(e) => tracing::error!(error = %e, "cannot take a reload's new admin listener; keeping the old one"),
                }
                continue;
            }
        };
        let (stream, peer) = match accepted {
            Ok(s) => s,
            Err(e) => {
                // EMFILE and the like: back off rather than spin.
                tracing::debug!(error = %e, "admin accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            tracing::debug!(%peer, "admin connection refused: {MAX_ADMIN_CONNECTIONS} open");
            drop(stream);
            continue;
        };
        let admin = admin.clone();
        let conn = http.serve_connection(
            TokioIo::new(stream),
            hyper::service::service_fn(move |req| answer(admin.clone(), peer, req)),
        );
        tokio::spawn(async move {
            match tokio::time::timeout(CONNECTION_TIMEOUT, conn).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::debug!(%peer, error = %e, "admin connection ended"),
                Err(_) => {
                    tracing::debug!(%peer, "admin connection closed after {CONNECTION_TIMEOUT:?}")
                }
            }
            drop(slot);
        });
    }
}

/// The next item of an unbounded channel (`None` once every sender is
/// gone, which `select!` then skips).
async fn futures_util_next<T>(rx: &mut futures_channel::mpsc::UnboundedReceiver<T>) -> Option<T> {
    use futures_core::Stream;
    std::future::poll_fn(|cx| std::pin::Pin::new(&mut *rx).poll_next(cx)).await
}

/// Whether the broker takes traffic: every shard accepting with its
/// routers warmed, and not draining. The gRPC edge's health service flips
/// to NOT_SERVING from the same drain flag.
pub fn is_ready(shared: &Shared) -> bool {
    !shared.is_draining()
        && !shared.is_leaving()
        && shared.stats.iter().all(|s| s.ready.load(Ordering::Relaxed))
}

fn text(status: StatusCode, ctype: &'static str, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(ctype));
    r
}

async fn answer(
    admin: Arc<Admin>,
    peer: std::net::SocketAddr,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    const PLAIN: &str = "text/plain";
    if req.uri().path() == "/admin/reload" {
        return Ok(reload(&admin, peer, req.method()).await);
    }
    if req.method() != Method::GET {
        let mut r = text(StatusCode::METHOD_NOT_ALLOWED, PLAIN, "only GET\n");
        r.headers_mut()
            .insert(ALLOW, HeaderValue::from_static("GET"));
        return Ok(r);
    }
    Ok(match req.uri().path() {
        "/metrics" => {
            let a = admin.clone();
            // Off this thread: a scrape may wait for the shards.
            match tokio::task::spawn_blocking(move || render(&a.shared, &a.collector.collect()))
                .await
            {
                Ok(body) => text(
                    StatusCode::OK,
                    "text/plain; version=0.0.4; charset=utf-8",
                    body,
                ),
                Err(e) => {
                    tracing::warn!(error = %e, "rendering /metrics failed");
                    text(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        PLAIN,
                        "metrics unavailable\n",
                    )
                }
            }
        }
        "/healthz" => text(StatusCode::OK, PLAIN, "ok\n"),
        "/readyz" => {
            let shared = &admin.shared;
            if is_ready(shared) {
                // An unavailable upstream does not make the broker unready
                // (its other routers serve); it is named in the detail.
                let mut body = String::from("ready\n");
                let routing = shared.routing.load();
                for r in &routing.routers {
                    let Some(s) = &r.upstream else { continue };
                    if !s.available.load(Ordering::Relaxed) {
                        let reason = s
                            .reason
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .clone()
                            .unwrap_or_default();
                        // Escaped: the reason quotes the upstream's own
                        // text, and /readyz is read in terminals and grepped.
                        let _ = writeln!(
                            body,
                            "upstream {} unavailable (retrying): {}",
                            r.name,
                            crate::escaped::Escaped(&reason)
                        );
                    }
                }
                text(StatusCode::OK, PLAIN, body)
            } else {
                // A dead shard first: the process is about to exit
                // non-zero, and that is what an operator must see.
                let why = if shared.any_shard_dead() {
                    "a shard thread died"
                } else if shared.is_draining() {
                    "draining"
                } else if shared.is_leaving() {
                    "shutting down (still serving during broker.drain_grace)"
                } else {
                    "starting"
                };
                text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    PLAIN,
                    format!("not ready: {why}\n"),
                )
            }
        }
        _ => text(
            StatusCode::NOT_FOUND,
            PLAIN,
            "not found: try /metrics, /healthz, /readyz, POST /admin/reload\n",
        ),
    })
}

/// Whether `peer` may ask for a reload: loopback only (IPv4, IPv6, and
/// IPv4-mapped IPv6 loopback).
fn reload_allowed(peer: std::net::SocketAddr) -> bool {
    peer.ip().to_canonical().is_loopback()
}

/// `POST /admin/reload`: asks the `routing` thread to reload the config
/// file and answers with the outcome as JSON (200 applied, 422 refused).
/// Only loopback peers may: the endpoint may be bound wider for scrapers,
/// and a reload is an operator's act.
async fn reload(
    admin: &Admin,
    peer: std::net::SocketAddr,
    method: &Method,
) -> Response<Full<Bytes>> {
    const PLAIN: &str = "text/plain";
    const JSON: &str = "application/json";
    if method != Method::POST {
        let mut r = text(StatusCode::METHOD_NOT_ALLOWED, PLAIN, "only POST\n");
        r.headers_mut()
            .insert(ALLOW, HeaderValue::from_static("POST"));
        return r;
    }
    if !reload_allowed(peer) {
        return text(
            StatusCode::FORBIDDEN,
            PLAIN,
            "reloads are taken from loopback peers only\n",
        );
    }
    if admin.shared.is_draining() {
        return text(
            StatusCode::SERVICE_UNAVAILABLE,
            PLAIN,
            "draining: no reloads\n",
        );
    }
    let (tx, rx) = crossbeam_channel::bounded(1);
    if !admin.shared.request_reload(Some(tx)) {
        return text(
            StatusCode::TOO_MANY_REQUESTS,
            PLAIN,
            "too many reloads queued; try again\n",
        );
    }
    // Counted until answered: the process waits for these at exit.
    struct Waiting<'a>(&'a std::sync::atomic::AtomicUsize);
    impl Drop for Waiting<'_> {
        fn drop(&mut self) {
            self.0.fetch_sub(1, Ordering::AcqRel);
        }
    }
    admin.shared.reloads_waiting.fetch_add(1, Ordering::AcqRel);
    let _waiting = Waiting(&admin.shared.reloads_waiting);
    let shared = admin.shared.clone();
    let outcome = tokio::task::spawn_blocking(move || {
        let deadline = std::time::Instant::now() + RELOAD_ANSWER_TIMEOUT;
        loop {
            match rx.recv_timeout(Duration::from_millis(50)) {
                // The drain began while the reload ran: the shards may be
                // gone before it ends. Answered now, not cut off at exit.
                Err(crossbeam_channel::RecvTimeoutError::Timeout) if shared.is_draining() => {
                    return Err(None);
                }
                Err(crossbeam_channel::RecvTimeoutError::Timeout)
                    if std::time::Instant::now() < deadline => {}
                other => return other.map_err(Some),
            }
        }
    })
    .await;
    match outcome {
        Ok(Err(None)) => {
            tracing::warn!(
                "a reload still running when the drain began is abandoned with the process"
            );
            text(
                StatusCode::SERVICE_UNAVAILABLE,
                PLAIN,
                "draining: the broker began shutting down while this reload ran, and it is \
                 abandoned with the process\n",
            )
        }
        Ok(Ok(o)) => {
            let status = if o.is_applied() {
                StatusCode::OK
            } else {
                StatusCode::UNPROCESSABLE_ENTITY
            };
            text(status, JSON, o.to_json())
        }
        Ok(Err(Some(crossbeam_channel::RecvTimeoutError::Timeout))) => text(
            StatusCode::GATEWAY_TIMEOUT,
            PLAIN,
            "the reload did not finish in time; it goes on, and its outcome will be logged \
             and counted in mcp_config_reloads_total\n",
        ),
        // The reload's answer was dropped unsent: not a slow reload.
        Ok(Err(Some(crossbeam_channel::RecvTimeoutError::Disconnected))) | Err(_) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            PLAIN,
            "the reload was lost without an outcome (see the broker's log)\n",
        ),
    }
}

/// A label value with `\`, `"` and newlines escaped, as the text format
/// requires.
fn esc(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// A metric family read from one value per series: name, type, help, getter.
type Family<T> = (&'static str, &'static str, &'static str, fn(&T) -> u64);

fn family(o: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// Prometheus float text: integers without a fraction, `NaN` as is.
fn num(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else {
        format!("{v}")
    }
}

fn histogram(o: &mut String, name: &str, labels: &str, h: &HistSnapshot) {
    let mut cumulative = 0u64;
    for (i, c) in h.counts.iter().enumerate() {
        cumulative += c;
        let _ = writeln!(
            o,
            "{name}_bucket{{{labels},le=\"{}\"}} {cumulative}",
            hist::le(i)
        );
    }
    let _ = writeln!(o, "{name}_sum{{{labels}}} {}", num(h.sum_ns as f64 / 1e9));
    let _ = writeln!(o, "{name}_count{{{labels}}} {cumulative}");
}

/// The Prometheus text exposition.
pub fn render(shared: &Shared, collected: &Collected) -> String {
    let layout = &*shared.layout;
    let names = layout.snapshot();
    let routing = shared.routing.load();
    // Series of routers being served, and `broker`.
    let serving: Vec<usize> = std::iter::once(series::BROKER)
        .chain(routing.routers.iter().map(|r| r.slot))
        .collect();
    let stats = &shared.stats;
    let mut o = String::with_capacity(32 * 1024);
    let load = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);

    // Requests: summed over shards; series appear at their first request.
    family(
        &mut o,
        "mcp_requests_total",
        "counter",
        "Requests answered, by edge they came in on, router that served them (broker: answered by the broker itself), request kind and outcome of the final response.",
    );
    for edge in Edge::ALL {
        for (r, router) in names.routers.iter().enumerate() {
            for kind in mcp_schema::RequestKind::ALL {
                for outcome in Outcome::ALL {
                    let slot = layout.request_slot(edge, r, series::kind_index(kind), outcome);
                    let n: u64 = stats.iter().map(|s| load(&s.series.requests[slot])).sum();
                    if n > 0 {
                        let _ = writeln!(
                            o,
                            "mcp_requests_total{{edge=\"{}\",router=\"{}\",kind=\"{}\",outcome=\"{}\"}} {n}",
                            edge.as_str(),
                            esc(router),
                            kind.as_str(),
                            outcome.as_str()
                        );
                    }
                }
            }
        }
    }

    // Latency histograms, summed over shards.
    family(
        &mut o,
        "mcp_request_duration_seconds",
        "histogram",
        "End-to-end request latency in the broker, from the read that completed the frame (or the gRPC hand-off, or the HTTP request's head) to the final response queued for writing, by router and tool (other: an unknown tool, or one past the label capacity; none: not a tool call).",
    );
    let mut by_router = vec![HistSnapshot::default(); names.routers.len()];
    for (label, (r, tool)) in names.labels.iter().enumerate() {
        let mut h = HistSnapshot::default();
        for s in stats {
            s.series.duration[label].add_to(&mut h);
        }
        if h.count() > 0 {
            by_router[*r].add(&h);
            let labels = format!(
                "router=\"{}\",tool=\"{}\"",
                esc(&names.routers[*r]),
                esc(tool)
            );
            histogram(&mut o, "mcp_request_duration_seconds", &labels, &h);
        }
    }
    family(
        &mut o,
        "mcp_request_duration_hdr_seconds",
        "summary",
        "End-to-end request latency by router: exact quantiles (HdrHistogram, 3 significant digits) over the last minute; _sum and _count since start.",
    );
    for (r, router) in names.routers.iter().enumerate() {
        let total = &by_router[r];
        if total.count() == 0 {
            continue;
        }
        let router = esc(router);
        let none = [f64::NAN; collect::QUANTILES.len()];
        let quantiles = collected.quantiles.get(r).unwrap_or(&none);
        for (q, v) in collect::QUANTILES.iter().zip(quantiles) {
            let _ = writeln!(
                o,
                "mcp_request_duration_hdr_seconds{{router=\"{router}\",quantile=\"{q}\"}} {}",
                num(*v)
            );
        }
        let _ = writeln!(
            o,
            "mcp_request_duration_hdr_seconds_sum{{router=\"{router}\"}} {}",
            num(total.sum_ns as f64 / 1e9)
        );
        let _ = writeln!(
            o,
            "mcp_request_duration_hdr_seconds_count{{router=\"{router}\"}} {}",
            total.count()
        );
    }
    family(
        &mut o,
        "mcp_wasm_call_duration_seconds",
        "histogram",
        "Router calls (call-tool, read-resource, get-prompt, complete) by router, from asking the pool for an instance to the result lifted out of the guest.",
    );
    // Every router served since start that has a sample, as the request
    // series are: a removed router's histograms stay (its calls that finish
    // after the reload land in them), and come back where they were if it
    // is added again.
    let shown = |r: usize, h: &HistSnapshot| h.count() > 0 || serving.contains(&r);
    for r in 1..names.routers.len() {
        let mut h = HistSnapshot::default();
        for s in stats {
            s.series.wasm[r].add_to(&mut h);
        }
        if !shown(r, &h) {
            continue;
        }
        histogram(
            &mut o,
            "mcp_wasm_call_duration_seconds",
            &format!("router=\"{}\"", esc(&names.routers[r])),
            &h,
        );
    }
    family(
        &mut o,
        "mcp_queue_wait_seconds",
        "histogram",
        "Time a request waited in the broker before a worker took it up (per-connection queue, or the inbox of the shard it was handed to), by router.",
    );
    for r in 0..names.routers.len() {
        let mut h = HistSnapshot::default();
        for s in stats {
            s.series.queue[r].add_to(&mut h);
        }
        if !shown(r, &h) {
            continue;
        }
        histogram(
            &mut o,
            "mcp_queue_wait_seconds",
            &format!("router=\"{}\"", esc(&names.routers[r])),
            &h,
        );
    }

    // Router pools, from the shards' last snapshot answers, for the routers
    // being served (a replaced router's pools count under its name).
    let no_pool = crate::wasm::PoolStats::default();
    let pools: Vec<(&str, &crate::wasm::PoolStats)> = serving[1..]
        .iter()
        .map(|&r| {
            (
                &*names.routers[r],
                collected.pools.get(r).unwrap_or(&no_pool),
            )
        })
        .collect();
    let pool_families: [Family<crate::wasm::PoolStats>; 8] = [
        (
            "mcp_router_queued_calls",
            "gauge",
            "Calls waiting for a free instance, by router (all shards).",
            |p| p.queued.into(),
        ),
        (
            "mcp_router_calls_total",
            "counter",
            "Calls that ran in an instance, by router.",
            |p| p.calls,
        ),
        (
            "mcp_router_faults_total",
            "counter",
            "Calls that ended in a fault of the router (trap, deadline, out of memory, malformed output; all but the last replace the instance), by router.",
            |p| p.faults,
        ),
        (
            "mcp_router_instances_replaced_total",
            "counter",
            "Instances discarded after a fault or a cancelled call and replaced by a fresh one, by router.",
            |p| p.replaced,
        ),
        (
            "mcp_router_overloaded_total",
            "counter",
            "Calls refused because every instance was busy and the queue was full, by router.",
            |p| p.overloaded,
        ),
        (
            "mcp_router_sessions",
            "gauge",
            "Sessions holding their own instance of a session-affine router, by router (all shards).",
            |p| p.sessions.into(),
        ),
        (
            "mcp_router_sessions_evicted_total",
            "counter",
            "Idle sessions whose instance was dropped to make room for a new session (max_sessions_per_shard reached), by router.",
            |p| p.sessions_evicted,
        ),
        (
            "mcp_router_compute_ticks_total",
            "counter",
            "Epoch ticks (broker.epoch_tick) that found a call's guest code running, by router: each one a yield of its shard, or for a never_waits router a tick towards its run limit. Requests behind such a guest wait about one tick.",
            |p| p.compute_ticks,
        ),
    ];
    family(
        &mut o,
        "mcp_router_instances",
        "gauge",
        "Router instances by pool (shared; session: a session-affine router's max_sessions_per_shard slots) and state (idle: free; busy: serving or handed to a call), all shards.",
    );
    for (router, p) in &pools {
        let router = esc(router);
        let _ = writeln!(
            o,
            "mcp_router_instances{{router=\"{router}\",pool=\"shared\",state=\"idle\"}} {}\nmcp_router_instances{{router=\"{router}\",pool=\"shared\",state=\"busy\"}} {}",
            p.idle, p.busy
        );
        if p.session_slots > 0 {
            let _ = writeln!(
                o,
                "mcp_router_instances{{router=\"{router}\",pool=\"session\",state=\"idle\"}} {}\nmcp_router_instances{{router=\"{router}\",pool=\"session\",state=\"busy\"}} {}",
                p.session_slots.saturating_sub(p.sessions_busy),
                p.sessions_busy
            );
        }
    }
    for (name, kind, help, get) in pool_families {
        family(&mut o, name, kind, help);
        for (router, p) in &pools {
            let _ = writeln!(o, "{name}{{router=\"{}\"}} {}", esc(router), get(p));
        }
    }

    // Connections and frames, per shard (bounded by the shard count; shows
    // how SO_REUSEPORT spread the connections).
    let per_shard: [Family<crate::shared::ShardStats>; 16] = [
        (
            "mcp_connections_open",
            "gauge",
            "Frame-edge connections open.",
            |s| s.connections_open.load(Ordering::Relaxed),
        ),
        (
            "mcp_http_connections_open",
            "gauge",
            "HTTP-edge connections open (TLS handshakes included).",
            |s| s.http_connections_open.load(Ordering::Relaxed),
        ),
        (
            "mcp_grpc_connections_open",
            "gauge",
            "gRPC-edge connections open (TLS handshakes included).",
            |s| s.grpc_connections_open.load(Ordering::Relaxed),
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
            "Frame-edge connections refused at frames.max_connections_per_shard.",
            |s| s.connections_refused.load(Ordering::Relaxed),
        ),
        (
            "mcp_connections_write_timeout_total",
            "counter",
            "Frame-edge connections closed because the peer read nothing within frames.write_timeout.",
            |s| s.write_timeouts.load(Ordering::Relaxed),
        ),
        (
            "mcp_http_write_timeouts_total",
            "counter",
            "HTTP-edge connections closed because the peer read nothing within http.write_timeout.",
            |s| s.http_write_timeouts.load(Ordering::Relaxed),
        ),
        (
            "mcp_http_connections_refused_total",
            "counter",
            "HTTP-edge connections refused at http.max_connections_per_shard.",
            |s| s.http_connections_refused.load(Ordering::Relaxed),
        ),
        (
            "mcp_grpc_connections_refused_total",
            "counter",
            "gRPC-edge connections refused at grpc.max_connections (counted by the shard that accepted them).",
            |s| s.grpc_connections_refused.load(Ordering::Relaxed),
        ),
        (
            "mcp_accept_errors_total",
            "counter",
            "Failed accepts on the shard's listeners, every edge (EMFILE: the process is out of file descriptors); each is followed by a 10 ms pause.",
            |s| s.accept_errors.load(Ordering::Relaxed),
        ),
        (
            "mcp_grpc_write_timeouts_total",
            "counter",
            "gRPC-edge connections closed because the peer's flow control let none of an answer out within grpc.write_timeout.",
            |s| s.grpc_write_timeouts.load(Ordering::Relaxed),
        ),
        (
            "mcp_frames_received_total",
            "counter",
            "Complete frames received on the frame edge (valid or not).",
            |s| s.requests.load(Ordering::Relaxed),
        ),
        (
            "mcp_error_responses_total",
            "counter",
            "Error responses sent at once for frames that failed verification.",
            |s| s.error_responses.load(Ordering::Relaxed),
        ),
        (
            "mcp_in_flight_requests",
            "gauge",
            "Requests being handled (frame edge, hand-offs, gRPC and HTTP).",
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
    for (name, kind, help, get) in per_shard {
        family(&mut o, name, kind, help);
        for (i, s) in stats.iter().enumerate() {
            let _ = writeln!(o, "{name}{{shard=\"{i}\"}} {}", get(s));
        }
    }
    family(
        &mut o,
        "mcp_http_streams_open",
        "gauge",
        "HTTP-edge SSE streams open, by kind: session_get (a session's GET stream), session_post (a session's POST answered on a stream), listen (2026-07-28 subscriptions/listen), call (a 2026-07-28 call's own stream).",
    );
    for (i, s) in stats.iter().enumerate() {
        for kind in crate::edge::http::StreamKind::ALL {
            let _ = writeln!(
                o,
                "mcp_http_streams_open{{shard=\"{i}\",kind=\"{}\"}} {}",
                kind.as_str(),
                s.http_streams_open[kind as usize].load(Ordering::Relaxed)
            );
        }
    }
    family(
        &mut o,
        "mcp_http_streams_cut_total",
        "counter",
        "HTTP-edge SSE streams that stay open (session_get, listen) ended because their client left more than 1 MiB of events unread (docs/http.md); the client reconnects.",
    );
    for (kind, n) in [
        ("session_get", &shared.http_get_streams_cut),
        ("listen", &shared.http_listen_streams_cut),
    ] {
        let _ = writeln!(
            o,
            "mcp_http_streams_cut_total{{kind=\"{kind}\"}} {}",
            n.load(Ordering::Relaxed)
        );
    }
    family(
        &mut o,
        "mcp_shard_idle_poll_seconds_total",
        "counter",
        "Time the shard spent in idle-polling windows (broker.idle_poll): polling its ring instead of sleeping, work done meanwhile included. 0 with idle_poll off.",
    );
    for (i, s) in stats.iter().enumerate() {
        let ns = s.idle_poll_ns.load(Ordering::Relaxed);
        let _ = writeln!(
            o,
            "mcp_shard_idle_poll_seconds_total{{shard=\"{i}\"}} {}",
            ns as f64 / 1e9
        );
    }
    family(
        &mut o,
        "mcp_frames_rejected_total",
        "counter",
        "Frames rejected before becoming requests, by reason (too_large closes the connection; the others are answered with an error).",
    );
    for reason in Reject::ALL {
        let n: u64 = stats
            .iter()
            .map(|s| load(&s.series.rejected[reason as usize]))
            .sum();
        let _ = writeln!(
            o,
            "mcp_frames_rejected_total{{reason=\"{}\"}} {n}",
            reason.as_str()
        );
    }
    family(
        &mut o,
        "mcp_http_responses_total",
        "counter",
        "HTTP-edge responses by status, counted as their head is sent: the edge's own refusals (4xx, 503) included, which never reach mcp_requests_total.",
    );
    let statuses = HTTP_STATUSES.iter().map(|s| s.to_string());
    for (slot, status) in statuses.chain(["other".to_string()]).enumerate() {
        let n: u64 = stats.iter().map(|s| load(&s.http_responses[slot])).sum();
        let _ = writeln!(o, "mcp_http_responses_total{{status=\"{status}\"}} {n}");
    }

    // The process.
    family(
        &mut o,
        "mcp_shard_ready",
        "gauge",
        "1 when the shard accepts (its routers warmed), else 0.",
    );
    for (i, s) in stats.iter().enumerate() {
        let _ = writeln!(
            o,
            "mcp_shard_ready{{shard=\"{i}\"}} {}",
            u8::from(s.ready.load(Ordering::Relaxed))
        );
    }
    let grpc = shared.grpc_counts.get().map_or((0, 0), |counts| counts());
    let scalars: [(&str, &str, &str, u64); 11] = [
        (
            "mcp_shards",
            "gauge",
            "Shards running.",
            shared.shards() as u64,
        ),
        (
            "mcp_ready",
            "gauge",
            "1 when /readyz answers 200 (all shards accepting, not draining).",
            is_ready(shared).into(),
        ),
        (
            "mcp_draining",
            "gauge",
            "1 from the shutdown signal on: the drain grace (not ready, still serving) and the drain.",
            // From the signal, not the drain: McpBrokerNotReady tells a
            // broker that cannot start from one that is leaving, and the
            // grace may be longer than the alert's 2 minutes.
            (shared.is_leaving() || shared.is_draining()).into(),
        ),
        (
            "mcp_metrics_recording",
            "gauge",
            "1 when per-request metrics are recorded (MCP_BROKER_METRICS is not off).",
            layout.recording.into(),
        ),
        (
            "mcp_http_sessions",
            "gauge",
            "MCP HTTP sessions open (2025-era; 2026-07-28 has none).",
            shared.http_sessions.count() as u64,
        ),
        (
            "mcp_grpc_sessions",
            "gauge",
            "gRPC-edge sessions open.",
            grpc.0 as u64,
        ),
        (
            "mcp_grpc_subscriptions_open",
            "gauge",
            "gRPC-edge Subscribe streams open.",
            grpc.1 as u64,
        ),
        (
            "mcp_log_lines_dropped_total",
            "counter",
            "Log lines dropped because 128 Ki were already waiting for stderr (its reader stalled or slow).",
            LOG_DROPPED.get().map_or(0, |c| c.dropped_lines() as u64),
        ),
        (
            "mcp_metrics_snapshot_timeouts_total",
            "counter",
            "Scrapes in which a shard did not hand over its HdrHistograms in time (they are merged by a later scrape).",
            collected.timeouts,
        ),
        (
            "mcp_config_generation",
            "gauge",
            "Generation of the configuration in effect: 1 at start-up, +1 per applied reload.",
            routing.generation,
        ),
        (
            "mcp_router_pools_draining",
            "gauge",
            "Pools of routers removed or replaced by a reload that still finish calls, over all shards.",
            collected.draining,
        ),
    ];
    for (name, kind, help, v) in scalars {
        family(&mut o, name, kind, help);
        let _ = writeln!(o, "{name} {v}");
    }
    // Upstream routers. The counters add what the routers a reload took out
    // counted under the same name (`upstream::Retired`): a replaced router
    // counts on where it counted. Read under the lock the `routing` thread
    // publishes with, from the routing published then.
    let (up, retired) = {
        let retired = shared
            .upstream_retired
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let routing = shared.routing.load_full();
        let counts: Vec<_> = routing
            .routers
            .iter()
            .map(|r| {
                let mut n = retired.counts(r.slot);
                if let Some(s) = &r.upstream {
                    for (n, c) in n.iter_mut().zip(s.counts()) {
                        *n += c;
                    }
                }
                n
            })
            .collect();
        (routing, counts)
    };
    // In the order of `UpstreamCounts`.
    let upstream_counters: [(&str, &str); 5] = [
        (
            "mcp_upstream_refreshes_total",
            "Re-reads of the upstream's listings (interval, list_changed hints, retries).",
        ),
        (
            "mcp_upstream_refresh_failures_total",
            "Re-reads that found the upstream unavailable.",
        ),
        (
            "mcp_upstream_table_swaps_total",
            "Route tables swapped in because this upstream's listings changed.",
        ),
        (
            "mcp_upstream_denied_total",
            "Outgoing requests to an origin other than the granted upstream, refused by the host.",
        ),
        (
            "mcp_upstream_cancels_total",
            "notifications/cancelled sent upstream for calls abandoned (client cancel, deadline, drain).",
        ),
    ];
    if up.any_upstream() {
        // A gauge: the router serving now.
        family(
            &mut o,
            "mcp_upstream_available",
            "gauge",
            "1 while the upstream router's upstream answers its listings, else 0 (retried with backoff).",
        );
        for r in &up.routers {
            let Some(s) = &r.upstream else { continue };
            let _ = writeln!(
                o,
                "mcp_upstream_available{{router=\"{}\"}} {}",
                esc(&r.name),
                u64::from(s.available.load(Ordering::Relaxed))
            );
        }
        for (i, (name, help)) in upstream_counters.into_iter().enumerate() {
            family(&mut o, name, "counter", help);
            for (r, n) in up.routers.iter().zip(&retired) {
                if r.upstream.is_none() {
                    continue;
                }
                let _ = writeln!(o, "{name}{{router=\"{}\"}} {}", esc(&r.name), n[i]);
            }
        }
        family(
            &mut o,
            "mcp_upstream_protocol_info",
            "gauge",
            "1, labelled with the MCP revision the upstream router speaks with its upstream (2026-07-28 where the server offers it, else the session's), once it has said.",
        );
        for r in &up.routers {
            let Some(p) = r.upstream.as_ref().and_then(|s| s.protocol()) else {
                continue;
            };
            let _ = writeln!(
                o,
                "mcp_upstream_protocol_info{{router=\"{}\",protocol=\"{}\"}} 1",
                esc(&r.name),
                esc(&p)
            );
        }
    }
    let states = &shared.request_states;
    family(
        &mut o,
        "mcp_http_request_states_issued_total",
        "counter",
        "requestState tokens issued on the HTTP edge (protocol 2026-07-28): questions whose router attached a state or named its input key.",
    );
    let _ = writeln!(
        o,
        "mcp_http_request_states_issued_total {}",
        states.issued()
    );
    family(
        &mut o,
        "mcp_http_request_states_refused_total",
        "counter",
        "Retries refused for their requestState, by reason: malformed (not a token of this format, or not a string), integrity (changed, for another tool or caller, or sealed under another key: brokers behind one balancer need the same http.request_state_key_file), expired (past http.request_state_ttl).",
    );
    for (why, n) in states.refusals() {
        let _ = writeln!(
            o,
            "mcp_http_request_states_refused_total{{reason=\"{}\"}} {n}",
            why.as_str()
        );
    }
    if let Some(auth) = &shared.auth {
        family(
            &mut o,
            "mcp_auth_failures_total",
            "counter",
            "Requests refused by [auth], every edge, by reason (missing, malformed, algorithm, unknown_key, signature, expired, not_yet_valid, issuer, audience, insufficient_scope). Tokens never appear in metrics or logs.",
        );
        for (f, n) in auth.failures() {
            let _ = writeln!(
                o,
                "mcp_auth_failures_total{{reason=\"{}\"}} {n}",
                f.as_str()
            );
        }
        for (name, help, n) in [
            (
                "mcp_auth_key_refreshes_total",
                "Reads of the issuer's JWK Set after start-up that stored a fresh set (periodic, or asked for by a token naming an unknown kid); failed ones are mcp_auth_key_refresh_failures_total.",
                auth.key_refreshes(),
            ),
            (
                "mcp_auth_key_refresh_failures_total",
                "Reads of the JWK Set that failed; the keys held are kept (the reason is logged).",
                auth.key_refresh_failures(),
            ),
        ] {
            family(&mut o, name, "counter", help);
            let _ = writeln!(o, "{name} {n}");
        }
    }
    if let Some(tls) = &shared.tls {
        family(
            &mut o,
            "mcp_tls_handshake_failures_total",
            "counter",
            "TLS handshakes that failed or did not finish within tls.handshake_timeout, by edge (a client offering no shared protocol version or suite, an untrusted or missing client certificate with mTLS, plaintext sent to a TLS port).",
        );
        for edge in crate::tls::Edge::ALL {
            let _ = writeln!(
                o,
                "mcp_tls_handshake_failures_total{{edge=\"{}\"}} {}",
                edge.as_str(),
                tls.handshake_failures(edge)
            );
        }
        let (applied, failed) = tls.reload_counts();
        family(
            &mut o,
            "mcp_tls_reloads_total",
            "counter",
            "Loads of [tls]'s certificate files after start-up (a reload, or a change the file watcher saw), by result: applied (new connections use them), or failed (the files loaded before stay in effect; the reason is logged).",
        );
        for (result, n) in [("applied", applied), ("failed", failed)] {
            let _ = writeln!(o, "mcp_tls_reloads_total{{result=\"{result}\"}} {n}");
        }
        if let Some(expiry) = tls.certificate_expiry() {
            family(
                &mut o,
                "mcp_tls_certificate_expiry_timestamp_seconds",
                "gauge",
                "When the certificate chain new TLS connections get (tls.cert_file) stops being valid: the earliest notAfter of its certificates, as a Unix time. Absent if their dates could not be read (logged).",
            );
            let _ = writeln!(o, "mcp_tls_certificate_expiry_timestamp_seconds {expiry}");
        }
        if let Some(from) = tls.certificate_not_before() {
            family(
                &mut o,
                "mcp_tls_certificate_not_before_timestamp_seconds",
                "gauge",
                "When that chain starts being valid: the latest notBefore of its certificates, as a Unix time (a chain minted on a machine whose clock runs ahead is refused by clients until then). Absent if their dates could not be read.",
            );
            let _ = writeln!(o, "mcp_tls_certificate_not_before_timestamp_seconds {from}");
        }
    }
    // Reloads.
    family(
        &mut o,
        "mcp_config_reloads_total",
        "counter",
        "Configuration reloads (SIGHUP, POST /admin/reload) by result: applied, or refused with the running configuration kept (the reasons are in the log and the reload's answer).",
    );
    for (result, n) in [
        ("applied", &shared.reloads_applied),
        ("refused", &shared.reloads_refused),
    ] {
        let _ = writeln!(
            o,
            "mcp_config_reloads_total{{result=\"{result}\"}} {}",
            n.load(Ordering::Relaxed)
        );
    }
    family(
        &mut o,
        "mcp_build_info",
        "gauge",
        "Build information: always 1.",
    );
    let _ = writeln!(
        o,
        "mcp_build_info{{version=\"{}\",routers=\"{}\"}} 1",
        env!("CARGO_PKG_VERSION"),
        esc(&routing.names().join(","))
    );
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_peers_may_reload() {
        for ok in [
            "127.0.0.1:1",
            "127.9.9.9:1",
            "[::1]:1",
            "[::ffff:127.0.0.1]:1",
        ] {
            assert!(reload_allowed(ok.parse().unwrap()), "{ok}");
        }
        for refused in [
            "10.0.0.1:1",
            "192.168.1.2:1",
            "[2001:db8::1]:1",
            "[::ffff:10.0.0.1]:1",
        ] {
            assert!(!reload_allowed(refused.parse().unwrap()), "{refused}");
        }
    }
}
