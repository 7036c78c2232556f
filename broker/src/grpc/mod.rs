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
//!   down gracefully.

mod convert;
mod notify;
// Also compiled, as this very file, by the fuzz crate (`#[path]`): see its
// module docs.
mod request;
mod service;
mod status;

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use mcp_proto::v1::mcp_service_server::McpServiceServer;
use tonic::codec::CompressionEncoding;

use crate::shared::Shared;

pub use service::Edge;

/// How long the server may take to finish open calls after the shards have
/// drained (they are all answered by then, so this only covers writing).
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// The running edge, held by `server::Running`.
pub struct EdgeHandle {
    edge: Arc<service::EdgeState>,
    health: tonic_health::server::HealthReporter,
    runtime: tokio::runtime::Handle,
    shutdown: Option<futures_channel::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl EdgeHandle {
    /// Starts refusing new calls (UNAVAILABLE), reports NOT_SERVING and ends
    /// every Subscribe stream. The server keeps answering (so health checks
    /// see NOT_SERVING) until [`EdgeHandle::shutdown`].
    pub fn begin_drain(&self) {
        self.edge.begin_drain();
        let health = self.health.clone();
        self.runtime.block_on(async move {
            health.set_not_serving::<McpServiceServer<Edge>>().await;
            health
                .set_service_status("", tonic_health::ServingStatus::NotServing)
                .await;
        });
    }

    /// Stops the server gracefully and waits for its thread.
    pub fn shutdown(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
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
        tonic::transport::server::TcpIncoming::from(l).with_nodelay(Some(true))
    };

    let edge = Arc::new(service::EdgeState::new(shared));
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

    let (shutdown_tx, shutdown_rx) = futures_channel::oneshot::channel::<()>();
    let router = tonic::transport::Server::builder()
        .add_service(health_service.accept_compressed(CompressionEncoding::Gzip))
        .add_service(reflection_v1.accept_compressed(CompressionEncoding::Gzip))
        .add_service(reflection_v1alpha.accept_compressed(CompressionEncoding::Gzip))
        .add_service(mcp);
    let handle = runtime.handle().clone();
    let thread = std::thread::Builder::new()
        .name("grpc-edge".into())
        .spawn(move || {
            let served = runtime.block_on(router.serve_with_incoming_shutdown(incoming, async {
                let _ = shutdown_rx.await;
            }));
            if let Err(e) = served {
                tracing::error!(error = %e, "gRPC edge stopped");
            }
            runtime.shutdown_timeout(SHUTDOWN_GRACE);
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
