//! Start-up and shutdown: configuration → WASM host → routers → route table
//! → keys (JWK Set, TLS, request-state) → listeners → shards → admin
//! endpoint → the ready line; then signals → drain → exit.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::config::Config;
use crate::routing::Routing;
use crate::shard::{self, ShardStart};
use crate::shared::Shared;
use crate::wasm::{HostConfig, WasmHost};

/// Native stack a shard thread keeps for its own frames (edges, dispatch,
/// wasmtime's entry) besides `HostConfig::max_wasm_stack`.
const SHARD_STACK_MARGIN: usize = 2 << 20;

/// A listener bound with `SO_REUSEPORT`, so each shard can have its own on
/// the same address and the kernel spreads connections across them.
pub fn bind_reuseport(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    use socket2::{Domain, Socket, Type};
    let s = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    s.set_reuse_address(true)?;
    s.set_reuse_port(true)?;
    s.set_nonblocking(true)?;
    s.bind(&addr.into())?;
    s.listen(1024)?;
    Ok(s.into())
}

/// One [`bind_reuseport`] listener per shard on `addr`, bound while a
/// [`claim`] holds the address: it resolves port 0 and refuses a port that
/// any other socket listens on. `SO_REUSEPORT` alone would let the shards'
/// listeners join another process's (another broker's) listeners on a busy
/// port, and the kernel would split the connections between the two.
pub fn bind_per_shard(
    addr: SocketAddr,
    shards: usize,
) -> std::io::Result<Vec<std::net::TcpListener>> {
    let claim = claim(addr)?;
    let resolved = claim.local_addr()?.as_socket().unwrap_or(addr);
    bind_per_shard_beside_own(resolved, shards)
}

/// [`bind_per_shard`] without the claim, for a reload that moves an edge to
/// an address its own listeners overlap (`127.0.0.1:7400` to
/// `0.0.0.0:7400`): they hold the port until they close, so a claim would
/// fail on them.
pub fn bind_per_shard_beside_own(
    addr: SocketAddr,
    shards: usize,
) -> std::io::Result<Vec<std::net::TcpListener>> {
    let first = bind_reuseport(addr)?;
    let resolved = first.local_addr()?;
    let mut all = vec![first];
    for _ in 1..shards {
        all.push(bind_reuseport(resolved)?);
    }
    Ok(all)
}

/// A socket bound to `addr` without `SO_REUSEPORT` and never listening:
/// the bind fails if anything listens there, and while it is held, the
/// broker's own `SO_REUSEPORT` listeners may still bind (`SO_REUSEADDR` on
/// both, and it does not listen), so nothing else takes the port between
/// the check and the listeners.
fn claim(addr: SocketAddr) -> std::io::Result<socket2::Socket> {
    use socket2::{Domain, Socket, Type};
    let s = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    s.set_reuse_address(true)?;
    s.bind(&addr.into()).map_err(|e| {
        if e.kind() == std::io::ErrorKind::AddrInUse {
            std::io::Error::new(
                e.kind(),
                "the address is in use by another listener (another process, or \
                 another broker: each broker needs its own ports)",
            )
        } else {
            e
        }
    })?;
    Ok(s)
}

/// The running broker: what `main` waits on.
pub struct Running {
    pub shared: Arc<Shared>,
    pub frames: SocketAddr,
    pub metrics: SocketAddr,
    pub grpc: SocketAddr,
    pub http: SocketAddr,
    pub routers: Vec<String>,
    /// The gRPC edge's shared state (health, drain); the shards serve it.
    grpc_edge: Arc<crate::edge::grpc::GrpcEdge>,
    shards: Vec<std::thread::JoinHandle<()>>,
    /// Owns the engine's epoch ticker: dropping it would stop every guest
    /// deadline and yield, so it lives as long as the shards.
    _host: Arc<WasmHost>,
}

impl Running {
    /// The ready line of the brief, exactly.
    pub fn ready_line(&self) -> String {
        format!(
            "mcp-broker ready frames={} grpc={} http={} metrics={} shards={} routers={}",
            self.frames,
            self.grpc,
            self.http,
            self.metrics,
            self.shards.len(),
            self.routers.join(",")
        )
    }

    /// The drain grace begins: `/readyz` and gRPC health say not ready,
    /// everything is still served.
    pub fn start_leaving(&self) {
        self.shared.start_leaving();
        self.grpc_edge.not_serving();
    }

    /// Drains: stop accepting, let in-flight calls finish within the drain
    /// timeout, answer the rest with shutting-down errors, stop the shards.
    pub fn drain(self) {
        let timeout = self.shared.config.broker.drain_timeout;
        tracing::info!(?timeout, in_flight = self.shared.in_flight(), "draining");
        // gRPC: NOT_SERVING, new calls UNAVAILABLE, Subscribe streams end;
        // then the shard drain below asks every connection to go away and
        // answers the calls in flight.
        self.grpc_edge.begin_drain();
        self.shared.start_drain();
        // Each shard ends once its connections have stopped reading and
        // written the answers to everything they read (and its gRPC calls are
        // done); at the deadline, what still runs is cut short.
        let until = Instant::now() + timeout;
        let mut watches_open = true;
        while !self.shards.iter().all(|h| h.is_finished()) && Instant::now() < until {
            // Nothing left to answer: the health watchers, told NOT_SERVING
            // at the drain's start, are let go, so that their connections
            // close rather than wait for the deadline.
            if watches_open && self.shared.in_flight() == 0 {
                self.grpc_edge.end_health_watches();
                watches_open = false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        // What still runs now is answered shutting down (-32004): said, so
        // that an operator can tell a clean drain from one that cut calls.
        let cut_short = self.shared.in_flight();
        self.shared.expire_drain();
        for h in self.shards {
            let _ = h.join();
        }
        if cut_short == 0 {
            tracing::info!("drained");
        } else {
            tracing::warn!(
                cut_short,
                ?timeout,
                "drained: calls still running at drain_timeout were answered -32004 shutting down"
            );
        }
    }
}

/// Descriptors that must be free once everything is open, or start-up
/// fails: enough for a few connections on each edge and the admin
/// endpoint.
const MIN_FREE_DESCRIPTORS: u64 = 32;

/// Threads the broker needs with `shards` shards and `routers` routers to
/// become ready, and at most (docs/deploy.md): 9 of its own (main,
/// signals, logging, admin, metrics ticker, routing, the WASM host's I/O
/// worker and epoch ticker, the gRPC edge's auxiliary runtime), one per
/// shard, the compiler's pool, which stays once routers compiled (rayon's:
/// one per CPU it may use), and the ready line's writer (which ends once
/// it wrote: without it the broker served and never said it was ready);
/// for a moment more, a loading thread per router (at most
/// [`crate::routing::SIDE_BY_SIDE`]) and two for a `/metrics` render.
fn threads_needed(shards: usize, routers: usize) -> (u64, u64) {
    let compilers = std::env::var("RAYON_NUM_THREADS")
        .ok()
        .and_then(|n| n.parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let at_rest = (10 + shards + compilers) as u64;
    let loading = if routers > 1 {
        routers.min(crate::routing::SIDE_BY_SIDE)
    } else {
        0
    };
    (at_rest, at_rest + loading as u64 + 2)
}

/// Starts everything and returns once every shard accepts. `source` is
/// where reloads read the configuration again.
pub fn start(config: Config, source: crate::control::Source) -> Result<Running> {
    // Before anything is opened or spawned: a placement error is the
    // operator's to fix, and should not wait for the routers to compile.
    let limit = crate::process::raise_nofile_limit();
    let allowed = crate::process::allowed_cpus().unwrap_or_else(|| {
        tracing::warn!("cannot read the CPU affinity mask: assuming every core is allowed");
        (0..std::thread::available_parallelism().map_or(1, |n| n.get())).collect()
    });
    if let Some(n) = config.grpc.threads {
        tracing::warn!(
            threads = n,
            "grpc.threads is ignored: the gRPC edge runs on the shards (set broker.shards)"
        );
    }
    let placement = crate::process::place(config.shard_count(), &config.broker.cpus, &allowed)?;
    if let Some(limit) = limit {
        let (frames, http) = (
            config.frames.max_connections_per_shard,
            config.http.max_connections_per_shard,
        );
        let grpc = config.grpc.max_connections;
        let need = crate::process::descriptors_needed(
            config.shard_count(),
            frames.saturating_add(http),
            grpc,
        );
        if need > limit.soft {
            tracing::warn!(
                limit = limit.soft,
                needed = need,
                "the open-file limit ({}) is below the {} descriptors that {} shard(s) x \
                 (frames.max_connections_per_shard {} + http.max_connections_per_shard {}) \
                 + grpc.max_connections {} may need: past it, new connections wait in the \
                 backlog while accepts fail (mcp_accept_errors_total); raise the hard limit \
                 (ulimit -Hn, LimitNOFILE=) or lower those bounds",
                limit.soft,
                need,
                config.shard_count(),
                frames,
                http,
                grpc,
            );
        }
    }
    // Short of threads, start-up failed from inside a thread pool (tokio's
    // or the compiler's), with its panic for a message.
    if let Some(room) = crate::process::thread_room() {
        let (at_rest, peak) = threads_needed(config.shard_count(), config.routers.len());
        // The threads this process may have in all: its own so far are
        // among those used.
        let own = crate::process::own_threads();
        let ours = room.left() + own;
        if room.limit < at_rest || ours < at_rest {
            let others = room.used.saturating_sub(own);
            bail!(
                "{} allows {} tasks ({others} of them taken by other processes), fewer than \
                 the {at_rest} threads the broker needs on {} shard(s) (10, one per shard, \
                 one per CPU to compile routers; up to {peak} while they load): raise it",
                room.bound,
                room.limit,
                config.shard_count(),
            );
        }
        if ours < peak {
            tracing::warn!(
                limit = room.limit,
                used = room.used,
                "{} allows {} tasks, {} of them in use: this process may run {ours} threads \
                 in all, short of the {peak} the broker may run at once ({at_rest} at rest on \
                 {} shard(s), more while routers load); start-up or a reload may fail: raise it",
                room.bound,
                room.limit,
                room.used,
                config.shard_count(),
            );
        }
    }
    // Each instance's memory is bounded, their sum only by the slots:
    // under a cgroup limit below it, guests that grow together get the
    // whole process OOM-killed (no error, no log line) instead of -32002.
    if let Some(limit) = crate::process::cgroup_memory_limit() {
        let shards = config.shard_count();
        let guests = config
            .routers
            .iter()
            .map(|r| (r.instance_slots(shards) as u64).saturating_mul(r.max_memory_bytes as u64))
            .fold(0u64, u64::saturating_add);
        if guests > limit {
            tracing::warn!(
                limit,
                guests,
                "the routers' instances may grow to {} MiB of memory together (instances x \
                 max_memory_bytes, every router and shard), above this cgroup's memory limit \
                 of {} MiB: if they do, the kernel's OOM killer ends the whole broker; lower \
                 instances_per_shard or max_memory_bytes, or raise the limit",
                guests >> 20,
                limit >> 20,
            );
        }
    }
    let host_config = host_config(&config);
    let host = Arc::new(WasmHost::new(&host_config).map_err(|e| {
        // The pool reserves the address space of every slot up front
        // (about 4 GiB each): a sum of pool sizes that validation accepts
        // key by key can still fail here, and the operator needs to know
        // which keys make it.
        let slots = host_config.max_instances;
        // (`mmap`: the reservation refused; `overflow`: a count whose
        // bytes do not fit a word.)
        let text = e.to_string();
        let hint = if text.contains("mmap") || text.contains("overflow") {
            format!(
                "; the {slots} pooled instance slots (every router's instances_per_shard, \
                 plus max_sessions_per_shard for a session-affine one, times {} shard(s), \
                 twice so that a reload can replace them) each reserve about 4 GiB of \
                 address space: lower those keys",
                config.shard_count()
            )
        } else {
            String::new()
        };
        anyhow::anyhow!("starting the WASM host with {slots} instance slots: {e}{hint}")
    })?);
    // Every router that cannot load is named, not only the first, as a
    // reload of the same file would.
    let mut loaded = Vec::new();
    let mut failed = Vec::new();
    let loads = crate::routing::side_by_side(config.routers.iter().collect(), "router-load", |r| {
        crate::routing::load(&host, &config, r)
    });
    for l in loads {
        match l {
            Ok(l) => loaded.push(l),
            Err(e) => failed.push(e),
        }
    }
    match failed.len() {
        0 => {}
        1 => anyhow::bail!("{}", failed[0]),
        _ => anyhow::bail!(
            "{} routers cannot be loaded:\n{}",
            failed.len(),
            failed
                .iter()
                .map(|e| format!("  - {e}"))
                .collect::<Vec<_>>()
                .join("\n")
        ),
    }
    let tools: usize = loaded.iter().map(|l| l.entry.meta.tools.len()).sum();
    let layout = Arc::new(crate::metrics::Layout::new(loaded.len(), tools));
    for l in &mut loaded {
        l.assign_slot(&layout).map_err(anyhow::Error::msg)?;
    }
    let mut left_out = Vec::new();
    let routing = loop {
        let entries: Vec<_> = loaded.iter().map(|l| l.entry.clone()).collect();
        let e = match Routing::build(
            1,
            loaded.iter().map(|l| l.routed.clone()).collect(),
            &entries,
            &config.naming.separator,
            &layout,
        ) {
            Ok(routing) => break routing,
            Err(e) => e,
        };
        // An upstream's listing is its server's, not the operator's: one
        // that collides is left out, as a refresh's would be, and the
        // broker starts without it (named on /readyz, retried at each
        // refresh). A collision of the configured components' own
        // listings stays fatal: no restart would mend it.
        let culprit = match &e {
            crate::route::RouteError::Collision { a, b, .. } => {
                loaded.iter_mut().enumerate().rev().find(|(i, l)| {
                    l.routed.upstream.is_some()
                        && (l.routed.name == *a || l.routed.name == *b)
                        && !left_out.contains(i)
                })
            }
            _ => None,
        };
        let Some((i, l)) = culprit else {
            return Err(anyhow::Error::new(e).context("building the route table"));
        };
        left_out.push(i);
        let reason = format!("its listing was left out of the route table: {e}");
        if let Some(status) = &l.routed.upstream {
            status.mark(&l.routed.name, Some(reason));
        }
        let old = &l.entry.meta;
        l.entry.meta = Arc::new(crate::wasm::RouterMeta {
            server: old.server.clone(),
            unread: old.unread.clone(),
            ..Default::default()
        });
    };
    let shards = config.shard_count();
    let names: Vec<String> = config.routers.iter().map(|r| r.name.clone()).collect();

    // Fails start-up, never serves open: a key file that cannot be read
    // is the operator's to fix. Read (and the JWK Set fetched) before any
    // listener is bound, so that no connection is accepted only to be
    // reset by the failure.
    let auth = match &config.auth {
        Some(a) => Some(Arc::new(
            crate::auth::Auth::new(a).map_err(anyhow::Error::msg)?,
        )),
        None => None,
    };
    let tls = match &config.tls {
        Some(t) => Some(Arc::new(crate::tls::ServerTls::new(t).map_err(|e| {
            anyhow::anyhow!(
                "[tls]:\n{}",
                e.iter()
                    .map(|e| format!("  - {e}"))
                    .collect::<Vec<_>>()
                    .join("\n")
            )
        })?)),
        None => None,
    };
    let request_states = crate::edge::http::request_state::RequestStates::new(
        &config.http.request_state_key_file,
        config.http.request_state_ttl,
    )
    .map_err(anyhow::Error::msg)?;
    // Bind everything before reporting ready, so port 0 resolves and a busy
    // port fails start-up with its address in the message.
    let metrics_listener = std::net::TcpListener::bind(config.metrics.listen)
        .with_context(|| format!("binding the metrics endpoint on {}", config.metrics.listen))?;
    let metrics = metrics_listener.local_addr()?;
    let listeners = bind_per_shard(config.frames.listen, shards)
        .with_context(|| format!("binding the frame edge on {}", config.frames.listen))?;
    let frames = listeners[0].local_addr()?;
    let http_listeners = bind_per_shard(config.http.listen, shards)
        .with_context(|| format!("binding the HTTP edge on {}", config.http.listen))?;
    let http = http_listeners[0].local_addr()?;
    let grpc_listeners = bind_per_shard(config.grpc.listen, shards)
        .with_context(|| format!("binding the gRPC edge on {}", config.grpc.listen))?;
    let grpc = grpc_listeners[0].local_addr()?;

    let shared = Arc::new(Shared::new(
        config.clone(),
        routing,
        layout,
        shards,
        auth,
        tls,
        request_states,
    ));
    *shared.addrs.lock().unwrap_or_else(|e| e.into_inner()) = Some(crate::shared::Addrs {
        frames,
        grpc,
        http,
        metrics,
    });

    let grpc_edge =
        crate::edge::grpc::GrpcEdge::new(shared.clone()).context("starting the gRPC edge")?;
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let mut handles = Vec::new();
    let per_shard = listeners
        .into_iter()
        .zip(http_listeners)
        .zip(grpc_listeners);
    for (index, ((listener, http_listener), grpc_listener)) in per_shard.enumerate() {
        let cpu = placement.cpus.get(index).copied().flatten();
        let start = ShardStart {
            index,
            shared: shared.clone(),
            listener,
            http_listener,
            grpc_listener,
            grpc: grpc_edge.clone(),
            cpu,
        };
        let tx = ready_tx.clone();
        handles.push(
            std::thread::Builder::new()
                .name(format!("shard-{index}"))
                // `never_waits` routers run on this stack, not a fiber's:
                // room for the whole wasm stack bound on top of the shard's
                // own frames, whatever RUST_MIN_STACK says.
                .stack_size(host_config.max_wasm_stack + SHARD_STACK_MARGIN)
                .spawn(move || shard::run(start, tx))
                .context("spawning a shard thread")?,
        );
    }
    drop(ready_tx);
    for _ in 0..shards {
        match ready_rx.recv() {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => bail!(e),
            Err(_) => bail!("a shard exited during start-up"),
        }
    }
    if !monoio::utils::detect_uring() {
        tracing::warn!("io_uring is unavailable: shards run on the epoll driver");
    }
    {
        let endpoint = crate::metrics::Endpoint::new(metrics_listener, shared.clone())
            .context("starting the admin endpoint")?;
        std::thread::Builder::new()
            .name("admin".into())
            .spawn(move || endpoint.serve())
            .context("spawning the admin thread")?;
    }
    crate::control::Control::new(shared.clone(), host.clone(), source, config, loaded)
        .spawn()
        .context("spawning the routing thread")?;
    // A limit that only just let everything open leaves no descriptor for
    // a single connection: every accept would fail from the first.
    if let Some(limit) = limit
        && let Ok(fds) = std::fs::read_dir("/proc/self/fd")
    {
        let open = fds.count() as u64;
        let left = limit.soft.saturating_sub(open);
        if left < MIN_FREE_DESCRIPTORS {
            bail!(
                "only {left} file descriptors are left after start-up ({open} open, limit {}): \
                 too few to serve; raise the limit (ulimit -Hn, LimitNOFILE=)",
                limit.soft
            );
        }
    }
    Ok(Running {
        shared,
        frames,
        metrics,
        grpc,
        http,
        grpc_edge,
        routers: names,
        shards: handles,
        _host: host,
    })
}

/// The process's WASM host settings for `config`.
fn host_config(config: &Config) -> HostConfig {
    // Reserve the instance slots this configuration can use: every
    // shard's pool of every router (shared instances plus, for a
    // session-affine router, one per session), plus two per router for the
    // transient instance that reads its metadata at load and an upstream
    // router's metadata reader; then as many again, so that a reload can
    // replace every router while the old pools drain. A fixed number either
    // refuses start-up for a large deployment (many routers × many shards)
    // or reserves terabytes of address space a small one never touches.
    let shards = config.shard_count();
    let slots = config
        .routers
        .iter()
        .map(|r| r.instance_slots(shards))
        .fold(0, usize::saturating_add)
        .saturating_mul(2)
        .max(16);
    HostConfig {
        max_instances: u32::try_from(slots).unwrap_or(u32::MAX),
        epoch_tick: config.broker.epoch_tick,
        ..HostConfig::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hosts_epoch_tick_is_the_configs() {
        let mut config = Config::embedded_default();
        assert_eq!(
            host_config(&config).epoch_tick,
            HostConfig::default().epoch_tick
        );
        config.broker.epoch_tick = Duration::from_millis(4);
        assert_eq!(host_config(&config).epoch_tick, Duration::from_millis(4));
    }
}
