//! The gRPC edge: `turbomcp.mcp.v1.McpService` (tonic) in front of the same
//! routing path as the frame edge.
//!
//! ```text
//! gRPC call ──proto──▶ RequestEncoder ──Request frame──▶ VerifiedRequest::verify
//!   ──Shared::submit(owner_of(session) | round-robin)──▶ shard (dispatch::handle)
//!   ──response frames──▶ ResponseView::parse ──▶ proto message / Status
//! ```
//!
//! The edge runs on its own small tokio runtime (`grpc.threads` workers) on
//! its own threads; shards never see protobuf and the edge never runs a
//! router. Health (`grpc.health.v1`) and reflection (v1 and v1alpha) are
//! served beside the MCP service; gzip is accepted on every service.
//!
//! # Invariants
//! - Every router-bound RPC (and Initialize, Ping, listings, SetLoggingLevel,
//!   resource Subscribe topics) becomes exactly one Request frame submitted
//!   to a shard: one routing path. Only ListRoots, CreateSamplingMessage and
//!   Elicit are answered by the edge itself (nothing to route).
//! - Only this module and `mcp-proto` know protobuf.
//! - What a call does before its frame exists is pure (`request.rs`), and
//!   fuzzed as such (`fuzz/fuzz_targets/grpc_convert.rs`).
//! - Each call costs one frame copy into `Bytes` (the encoder is reused per
//!   thread) and one task on the owning shard; nothing here blocks a shard.
//! - Draining flips health to NOT_SERVING, refuses new calls with
//!   UNAVAILABLE, ends every Subscribe stream, and only then shuts the server
//!   down gracefully, within a deadline: connections still open at it are
//!   closed (a peer must not be able to hold the process up).
//! - Every connection is bounded: handshake deadline, HTTP/2 keepalive,
//!   streams per connection, connection age (`[grpc]` in the config).

mod conn;
mod convert;
mod notify;
// Also compiled, as this very file, by the fuzz crate (`#[path]`): see its
// module docs.
mod request;
mod service;
mod session;
mod status;

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use mcp_proto::v1::mcp_service_server::McpServiceServer;
use tonic::codec::CompressionEncoding;

use crate::shared::Shared;

pub use service::Edge;

/// How long the server may take, after the drain deadline, to write the
/// answers the shards gave at that deadline (shutting-down errors) before
/// every connection is closed.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(1);

/// Tasks still running on the edge's runtime once the server has stopped
/// get this long to reach an await point before the thread gives up.
const RUNTIME_STOP: Duration = Duration::from_millis(250);

/// The running edge, held by `server::Running`.
pub struct EdgeHandle {
    edge: Arc<service::EdgeState>,
    health: tonic_health::server::HealthReporter,
    runtime: tokio::runtime::Handle,
    shutdown: Option<futures_channel::oneshot::Sender<Instant>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl EdgeHandle {
    /// Starts refusing new calls (UNAVAILABLE), reports NOT_SERVING and ends
    /// every Subscribe stream. The server keeps answering (so health checks
    /// see NOT_SERVING) until [`EdgeHandle::shutdown`].
    pub fn begin_drain(&self) {
        self.edge.begin_drain();
        self.not_serving();
    }

    /// gRPC health reports NOT_SERVING (the drain grace, then the drain);
    /// calls are still served until [`Self::begin_drain`].
    pub fn not_serving(&self) {
        let health = self.health.clone();
        self.runtime.block_on(async move {
            health.set_not_serving::<McpServiceServer<Edge>>().await;
            health
                .set_service_status("", tonic_health::ServingStatus::NotServing)
                .await;
        });
    }

    /// Stops the server gracefully and waits for its thread: open
    /// connections get until `deadline` (the drain deadline) plus
    /// [`SHUTDOWN_GRACE`] to finish, then they are closed. Returns within
    /// that bound whatever the peers do.
    pub fn shutdown(mut self, deadline: Instant) {
        let deadline = deadline.max(Instant::now()) + SHUTDOWN_GRACE;
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(deadline);
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Starts the edge on `listener` (already bound, so port 0 has resolved).
pub fn start(listener: std::net::TcpListener, shared: Arc<Shared>) -> Result<EdgeHandle> {
    let cfg = shared.config.grpc.clone();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cfg.threads)
        .thread_name("grpc-edge")
        .enable_all()
        .build()
        .context("building the gRPC edge runtime")?;
    listener.set_nonblocking(true).context("gRPC listener")?;
    let incoming = {
        let _enter = runtime.enter();
        let l = tokio::net::TcpListener::from_std(listener).context("gRPC listener")?;
        let (tx, rebinds) = futures_channel::mpsc::unbounded();
        let _ = shared.grpc_rebind.set(tx);
        conn::Incoming::new(
            tonic::transport::server::TcpIncoming::from(l).with_nodelay(Some(true)),
            cfg.handshake_timeout,
            Some(rebinds),
            shared.tls.clone(),
            cfg.max_connections,
        )
    };

    let edge = Arc::new(service::EdgeState::new(shared));
    {
        // Memory follows the live sessions: expired ones are swept on a
        // timer, not only when the registry fills up.
        let edge = Arc::downgrade(&edge);
        let every =
            (cfg.session_idle_timeout / 4).clamp(Duration::from_secs(1), Duration::from_secs(60));
        runtime.spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(edge) = edge.upgrade() else { return };
                edge.sweep_sessions();
            }
        });
    }
    let (health, health_service) = tonic_health::server::health_reporter();
    runtime.block_on(async {
        health.set_serving::<McpServiceServer<Edge>>().await;
        health
            .set_service_status("", tonic_health::ServingStatus::Serving)
            .await;
    });
    let reflection_v1 = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(mcp_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .context("building gRPC reflection (v1)")?;
    let reflection_v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(mcp_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()
        .context("building gRPC reflection (v1alpha)")?;
    let mcp = McpServiceServer::new(Edge(edge.clone()))
        .accept_compressed(CompressionEncoding::Gzip)
        .send_compressed(CompressionEncoding::Gzip)
        .max_decoding_message_size(cfg.max_message_bytes)
        .max_encoding_message_size(cfg.max_message_bytes);

    let (shutdown_tx, shutdown_rx) = futures_channel::oneshot::channel::<Instant>();
    let router = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(cfg.keepalive_interval))
        .http2_keepalive_timeout(Some(cfg.keepalive_timeout))
        .max_concurrent_streams(cfg.max_concurrent_streams_per_connection)
        .max_connection_age(cfg.max_connection_age)
        .max_connection_age_grace(cfg.max_connection_age_grace)
        .add_service(health_service.accept_compressed(CompressionEncoding::Gzip))
        .add_service(reflection_v1.accept_compressed(CompressionEncoding::Gzip))
        .add_service(reflection_v1alpha.accept_compressed(CompressionEncoding::Gzip))
        .add_service(mcp);
    let handle = runtime.handle().clone();
    let thread = std::thread::Builder::new()
        .name("grpc-edge".into())
        .spawn(move || {
            runtime.block_on(async move {
                // tonic's signal, and the deadline after it for the
                // connections that do not close by themselves.
                let (stop_tx, stop_rx) = futures_channel::oneshot::channel::<()>();
                let (deadline_tx, deadline_rx) = futures_channel::oneshot::channel::<Instant>();
                tokio::spawn(async move {
                    if let Ok(deadline) = shutdown_rx.await {
                        let _ = deadline_tx.send(deadline);
                    }
                    let _ = stop_tx.send(());
                });
                let serve = router.serve_with_incoming_shutdown(incoming, async {
                    let _ = stop_rx.await;
                });
                let deadline = async {
                    match deadline_rx.await {
                        Ok(d) => tokio::time::sleep_until(d.into()).await,
                        Err(_) => std::future::pending().await,
                    }
                };
                tokio::select! {
                    served = serve => {
                        if let Err(e) = served {
                            tracing::error!(error = %e, "gRPC edge stopped");
                        }
                    }
                    () = deadline => {
                        tracing::warn!("gRPC connections still open at the drain deadline: closing them");
                    }
                }
            });
            // Drops the connection tasks still running (past the deadline).
            runtime.shutdown_timeout(RUNTIME_STOP);
        })
        .context("spawning the gRPC edge thread")?;
    Ok(EdgeHandle {
        edge,
        health,
        runtime: handle,
        shutdown: Some(shutdown_tx),
        thread: Some(thread),
    })
}
