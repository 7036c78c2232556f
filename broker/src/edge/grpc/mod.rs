//! The gRPC edge: `turbomcp.mcp.v1.McpService` (tonic) in front of the same
//! routing path as the frame edge, served on the shard threads.
//!
//! ```text
//! gRPC call ──hyper HTTP/2 on shard i──▶ proto ──RequestEncoder──▶ Request frame
//!   ──VerifiedRequest::from_encoder──▶ shard::handle_here (shard i)
//!                                 | Shared::submit(owner_of(session) on another shard)
//!   ──▶ dispatch::handle ──response frames──▶ verify::built_response ──▶ proto / Status
//! ```
//!
//! Both frames are built by this process's encoders, so neither is verified
//! again in release builds (debug builds, and so every test, still verify
//! them): `bench/NOTES.md`, 2026-12-02.
//!
//! Every shard has its own `SO_REUSEPORT` listener on `[grpc] listen` and
//! serves its connections with hyper's HTTP/2 server on its own monoio
//! runtime (`crate::edge::rt`), tonic's generated service on top. A call
//! without a session runs on the shard that took it; a call in a session
//! runs on the session's owner shard, which is the only cross-thread hop
//! left. (The edge used to run on a tokio runtime of its own: every call
//! then crossed threads twice, which cost more CPU than the call itself at
//! open-loop rates; `bench/NOTES.md` has the measurement.) Health
//! (`grpc.health.v1`) and reflection (v1 and v1alpha) are served beside the
//! MCP service, through tonic's router; the MCP service's own calls are
//! handed to it by their path prefix, past the router (going through it
//! cost 5–7% of a call's CPU: `bench/NOTES.md`, "the gRPC edge's calls past
//! tonic's router"). gzip is accepted on every service.
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
//!   thread) and runs in its HTTP/2 stream's task when that is on the
//!   serving shard (no inbox, no second task, no oneshot); only a session's
//!   call read by another shard becomes a job in the owner's inbox.
//! - Draining flips health to NOT_SERVING, refuses new calls with
//!   UNAVAILABLE, ends every Subscribe stream, and only then asks every
//!   connection to go away (GOAWAY); connections still open at the drain
//!   deadline (plus [`SHUTDOWN_GRACE`]) are closed (a peer must not be able
//!   to hold the process up).
//! - Every connection is bounded: handshake deadline, HTTP/2 keepalive,
//!   streams per connection, connection age (`[grpc]` in the config).

mod conn;
mod convert;
mod guard;
mod notify;
// Also compiled, as this very file, by the fuzz crate (`#[path]`): see its
// module docs.
mod request;
mod service;
mod session;
mod status;

use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use anyhow::{Context, Result};
use mcp_proto::v1::mcp_service_server::McpServiceServer;
use tonic::codec::CompressionEncoding;

use crate::shared::Shared;

pub use conn::{ShardGrpc, accept_loop};
pub use service::Edge;

/// How long a connection may take, after the drain deadline, to write the
/// answers the shards gave at that deadline (shutting-down errors) before
/// it is closed.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(1);

/// The edge's state shared by every shard: the MCP service's state, tonic's
/// services (cloned once per shard) and the connection count. Held by
/// `server::Running` for health and the drain.
pub struct GrpcEdge {
    state: Arc<service::EdgeState>,
    health: tonic_health::server::HealthReporter,
    /// Each shard clones its own at start-up.
    routes: tonic::service::Routes,
    /// The MCP service alone (also inside `routes`): its calls skip the
    /// router ([`conn`]'s `serve`).
    mcp: McpServiceServer<Edge>,
    /// Connections open across the shards (`grpc.max_connections`).
    open: Arc<AtomicUsize>,
    /// One idle thread: the context tonic's reflection service spawns its
    /// answer task in (`guard.rs`), and where health changes run. No call
    /// of the MCP service runs here.
    aux: tokio::runtime::Runtime,
}

impl GrpcEdge {
    /// Builds the services; nothing is served until the shards accept.
    pub fn new(shared: Arc<Shared>) -> Result<Arc<Self>> {
        let cfg = shared.config.grpc.clone();
        let state = Arc::new(service::EdgeState::new(shared));
        let (health, health_service) = tonic_health::server::health_reporter();
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
        let mcp = McpServiceServer::new(Edge(state.clone()))
            .accept_compressed(CompressionEncoding::Gzip)
            .send_compressed(CompressionEncoding::Gzip)
            .max_decoding_message_size(cfg.max_message_bytes)
            .max_encoding_message_size(cfg.max_message_bytes);
        let routes = tonic::service::Routes::new(
            health_service.accept_compressed(CompressionEncoding::Gzip),
        )
        .add_service(reflection_v1.accept_compressed(CompressionEncoding::Gzip))
        .add_service(reflection_v1alpha.accept_compressed(CompressionEncoding::Gzip))
        .add_service(mcp.clone())
        .prepare();
        let aux = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("grpc-aux")
            .build()
            .context("building the gRPC edge's auxiliary runtime")?;
        let edge = Arc::new(Self {
            state,
            health,
            routes,
            mcp,
            open: Arc::default(),
            aux,
        });
        edge.set_health(tonic_health::ServingStatus::Serving);
        Ok(edge)
    }

    /// The services, for a shard to serve.
    fn routes(&self) -> tonic::service::Routes {
        self.routes.clone()
    }

    /// The MCP service, for a shard to call without the router.
    fn mcp(&self) -> McpServiceServer<Edge> {
        self.mcp.clone()
    }

    /// The context calls are polled in (`guard.rs`).
    fn tokio(&self) -> tokio::runtime::Handle {
        self.aux.handle().clone()
    }

    /// Starts refusing new calls (UNAVAILABLE), reports NOT_SERVING and ends
    /// every Subscribe stream. Connections keep answering (so health checks
    /// see NOT_SERVING) until the shards drain them.
    pub fn begin_drain(&self) {
        self.state.begin_drain();
        self.not_serving();
    }

    /// Ends every open health `Watch` stream (its statuses are forgotten,
    /// so a later Check finds no service): called once the drain has no
    /// call left. gRPC client-side health checking keeps one open on each
    /// connection, which held every drain to its deadline (10 s by
    /// default) after the watcher had its NOT_SERVING.
    pub fn end_health_watches(&self) {
        let mut health = self.health.clone();
        self.aux.block_on(async move {
            health
                .clear_service_status(<McpServiceServer<Edge> as tonic::server::NamedService>::NAME)
                .await;
            health.clear_service_status("").await;
        });
    }

    /// gRPC health reports NOT_SERVING (the drain grace, then the drain);
    /// calls are still served until [`Self::begin_drain`].
    pub fn not_serving(&self) {
        self.set_health(tonic_health::ServingStatus::NotServing);
    }

    fn set_health(&self, status: tonic_health::ServingStatus) {
        let health = self.health.clone();
        // Called from the main thread (start-up, drain), never a shard's.
        self.aux.block_on(async move {
            health
                .set_service_status(
                    <McpServiceServer<Edge> as tonic::server::NamedService>::NAME,
                    status,
                )
                .await;
            health.set_service_status("", status).await;
        });
    }
}

/// Sweeps expired sessions a few times per `grpc.session_idle_timeout`,
/// until the drain (one shard runs this: the sessions are the edge's).
pub async fn sweep_sessions(
    edge: Arc<GrpcEdge>,
    idle: Duration,
    draining: std::rc::Rc<crate::local::Latch>,
) {
    let every = (idle / 4).clamp(Duration::from_secs(1), Duration::from_secs(60));
    loop {
        monoio::select! {
            _ = monoio::time::sleep(every) => edge.state.sweep_sessions(),
            _ = draining.wait() => return,
        }
    }
}
