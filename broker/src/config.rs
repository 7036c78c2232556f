//! Configuration: TOML file (or the embedded default) plus command-line
//! overrides, validated as a whole.
//!
//! Each section is its own serde struct with `deny_unknown_fields`; the file
//! is read section by section, and a key that does not fit is reported with
//! its path and taken out before the section is read again
//! ([`deserialize_all`]), so that every such key is reported; then the
//! semantic checks add theirs: an operator fixing a file sees all of its
//! problems at once, each with its key path.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

/// The embedded default: exactly `broker/broker.example.toml`.
pub const DEFAULT_TOML: &str = include_str!("../broker.example.toml");

/// Upper bound of `frames.max_frame_bytes`: the codec's length prefix is a
/// u32, and a single frame larger than this is a misconfiguration.
pub const MAX_FRAME_BYTES_LIMIT: u32 = 1 << 30;

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct BrokerSection {
    /// Shard threads; 0 = one per CPU in the process's affinity mask.
    pub shards: usize,
    /// CPUs to pin shards to, in order; each must be in the affinity mask.
    pub cpus: Vec<usize>,
    /// Directory of router .wasm files; empty = the default search.
    pub routers_dir: PathBuf,
    /// Time in-flight requests get to finish on SIGTERM/SIGINT.
    #[serde(with = "duration")]
    pub drain_timeout: Duration,
    /// On SIGTERM/SIGINT, how long the broker reports not-ready on
    /// `/readyz` while still serving everything, before it starts draining:
    /// time for a load balancer's health checks to stop sending it new work.
    /// 0: drain at once. A second signal ends the grace early.
    #[serde(with = "duration")]
    pub drain_grace: Duration,
    /// Build each shard's io_uring with `SINGLE_ISSUER | DEFER_TASKRUN`
    /// when the kernel accepts it (Linux 6.1+), else without.
    pub io_uring_defer_taskrun: bool,
    /// After work arrives, how long a shard keeps polling its ring instead
    /// of sleeping in the kernel (`crate::idle_poll`); 0 = never. While
    /// it is on, the ring uses `COOP_TASKRUN` instead of `DEFER_TASKRUN`.
    #[serde(with = "duration")]
    pub idle_poll: Duration,
    /// How often the WASM engine's epoch moves while guest code may run:
    /// a running guest yields to its shard (or, `never_waits`, counts
    /// towards its run limit) and has its deadline checked at each tick.
    /// Within [`MIN_EPOCH_TICK`]..=[`MAX_EPOCH_TICK`].
    #[serde(with = "duration")]
    pub epoch_tick: Duration,
    /// Items per page of a listing (tools, resources, templates, prompts)
    /// on every edge; past it a `nextCursor` follows. Within
    /// 1..=[`MAX_LIST_PAGE_SIZE`].
    pub list_page_size: usize,
}

/// Upper bound of `broker.list_page_size`: a page is built, and on the
/// frame edge sent, as one message.
pub const MAX_LIST_PAGE_SIZE: usize = 10_000;

/// Upper bound of `broker.idle_poll`: past it the window is a busy loop
/// that never sleeps, not a tuning.
pub const MAX_IDLE_POLL: Duration = Duration::from_millis(100);

/// Lower bound of `broker.epoch_tick`: each tick wakes the ticker thread,
/// 10,000 times a second at this bound.
pub const MIN_EPOCH_TICK: Duration = Duration::from_micros(100);
/// Upper bound of `broker.epoch_tick`: a `never_waits` call's run limit
/// ([`crate::wasm::NEVER_WAITS_MAX_RUN`]) is counted in ticks, and a
/// coarser tick would stretch it.
pub const MAX_EPOCH_TICK: Duration = crate::wasm::NEVER_WAITS_MAX_RUN;

impl Default for BrokerSection {
    fn default() -> Self {
        Self {
            shards: 0,
            cpus: Vec::new(),
            routers_dir: PathBuf::new(),
            drain_timeout: Duration::from_secs(10),
            drain_grace: Duration::ZERO,
            io_uring_defer_taskrun: true,
            idle_poll: Duration::ZERO,
            epoch_tick: Duration::from_millis(1),
            list_page_size: 100,
        }
    }
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct FramesSection {
    pub listen: SocketAddr,
    pub max_frame_bytes: u32,
    pub max_connections_per_shard: usize,
    pub max_in_flight_per_connection: usize,
    #[serde(with = "duration")]
    pub idle_timeout: Duration,
    #[serde(with = "duration")]
    pub partial_frame_timeout: Duration,
    /// Answers queued for one connection and not yet written, in bytes:
    /// above it the broker stops reading that connection until its peer
    /// drains them. Counts every answer, errors included.
    pub max_output_bytes_per_connection: usize,
    /// A connection with answers to write whose peer accepts no byte for
    /// this long is closed (a client that never reads).
    #[serde(with = "duration")]
    pub write_timeout: Duration,
}

impl Default for FramesSection {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 7400)),
            max_frame_bytes: mcp_schema::DEFAULT_MAX_FRAME_LEN,
            max_connections_per_shard: 4096,
            max_in_flight_per_connection: 256,
            idle_timeout: Duration::from_secs(300),
            partial_frame_timeout: Duration::from_secs(10),
            max_output_bytes_per_connection: 1 << 20,
            write_timeout: Duration::from_secs(30),
        }
    }
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct GrpcSection {
    pub listen: SocketAddr,
    /// Deprecated and ignored: the edge ran on a tokio runtime of its own
    /// with this many threads; it now runs on the shards. Still accepted so
    /// that old configurations load (start-up warns).
    pub threads: Option<usize>,
    /// Largest request or response message, in bytes (decoded).
    pub max_message_bytes: usize,
    /// Unary calls in flight across the edge; beyond it a call is refused
    /// with RESOURCE_EXHAUSTED instead of queued.
    pub max_concurrent_requests: usize,
    /// Open Subscribe streams across the edge; beyond it RESOURCE_EXHAUSTED.
    pub max_subscribers: usize,
    /// Connections open at once on the edge, TLS handshakes in progress
    /// included; a connection accepted beyond it is closed at once.
    pub max_connections: usize,
    /// Time from accept until the HTTP/2 client preface has arrived;
    /// a connection still silent then is closed.
    #[serde(with = "duration")]
    pub handshake_timeout: Duration,
    /// HTTP/2 PING interval on every connection.
    #[serde(with = "duration")]
    pub keepalive_interval: Duration,
    /// A PING not acknowledged within this closes the connection.
    #[serde(with = "duration")]
    pub keepalive_timeout: Duration,
    /// A unary answer the peer's HTTP/2 flow control lets none of out for
    /// this long closes its connection (between one and two of it), and
    /// frees every answer held for it.
    #[serde(with = "duration")]
    pub write_timeout: Duration,
    /// A call's request message must have arrived whole (to the end of its
    /// stream) this long after its headers, or the call fails and its
    /// buffered part is freed.
    #[serde(with = "duration")]
    pub body_timeout: Duration,
    /// HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS: open calls per connection.
    pub max_concurrent_streams_per_connection: u32,
    /// Age at which a connection is asked to go away (GOAWAY, graceful).
    #[serde(with = "duration")]
    pub max_connection_age: Duration,
    /// After `max_connection_age`, how long its open calls may still run
    /// before the connection is closed.
    #[serde(with = "duration")]
    pub max_connection_age_grace: Duration,
    /// Sessions (Initialize) alive at once across the edge.
    pub max_sessions: usize,
    /// A session with no call and no open Subscribe stream for this long
    /// is forgotten.
    #[serde(with = "duration")]
    pub session_idle_timeout: Duration,
    /// What `ListRoots` answers.
    pub roots: Vec<RootConfig>,
}

/// One operator-configured root (`[[grpc.roots]]`), answered by ListRoots.
#[derive(Debug, Clone, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct RootConfig {
    pub uri: String,
    #[serde(default)]
    pub name: Option<String>,
}

impl Default for GrpcSection {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 7401)),
            threads: None,
            max_message_bytes: 4 << 20,
            max_concurrent_requests: 1024,
            max_subscribers: 1024,
            max_connections: 10_000,
            handshake_timeout: Duration::from_secs(10),
            keepalive_interval: Duration::from_secs(60),
            keepalive_timeout: Duration::from_secs(20),
            write_timeout: Duration::from_secs(30),
            body_timeout: Duration::from_secs(30),
            max_concurrent_streams_per_connection: 256,
            max_connection_age: Duration::from_secs(3600),
            max_connection_age_grace: Duration::from_secs(30),
            max_sessions: 100_000,
            session_idle_timeout: Duration::from_secs(1800),
            roots: Vec::new(),
        }
    }
}

/// The MCP Streamable HTTP edge (`[http]`), served on the shard threads.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct HttpSection {
    /// Address of the edge; the endpoint path is `/mcp`.
    pub listen: SocketAddr,
    /// `Origin` values accepted besides loopback ones (`http://localhost`,
    /// `http://127.0.0.1:…`, `http://[::1]…`); any other Origin gets 403.
    /// A request without `Origin` (not a browser) is accepted.
    pub allowed_origins: Vec<String>,
    /// Largest request body, in bytes; a larger `Content-Length` is refused
    /// with 413 before the body is read, a chunked body when it passes it.
    pub max_body_bytes: usize,
    /// Largest request head (request line and headers), in bytes.
    pub max_header_bytes: usize,
    /// Most header fields in one request.
    pub max_headers: usize,
    /// Time for a request's whole head to arrive, from its first byte (or,
    /// on a kept-alive connection, from the end of the previous answer).
    #[serde(with = "duration")]
    pub header_timeout: Duration,
    /// Time for a request's whole body to arrive once its head is in.
    #[serde(with = "duration")]
    pub body_timeout: Duration,
    /// A peer that takes none of an answer (or SSE event) for this long
    /// is cut off and its connection's answers freed.
    #[serde(with = "duration")]
    pub write_timeout: Duration,
    /// Connections per shard on this edge; beyond it new ones are closed.
    pub max_connections_per_shard: usize,
    /// Sessions alive at once across the edge; an `initialize` beyond it
    /// gets 503 (nothing is evicted: each session may hold a router instance).
    pub max_sessions: usize,
    /// A session with no request and no open stream for this long is ended
    /// (its id then gets 404, and the client starts a new one).
    #[serde(with = "duration")]
    pub session_idle_timeout: Duration,
    /// Interval of SSE keep-alive comments on open streams.
    #[serde(with = "duration")]
    pub sse_keepalive: Duration,
    /// Events kept per SSE stream for `Last-Event-ID` resumption.
    pub sse_replay_events: usize,
    /// Bytes of SSE events kept per session (all its streams) for
    /// resumption; the oldest go first.
    pub sse_replay_bytes: usize,
    /// How long the broker waits for a client's answer to a request it sent
    /// (elicitation) before the call fails with a deadline error.
    #[serde(with = "duration")]
    pub client_answer_timeout: Duration,
    /// The key that seals a router's state into 2026-07-28's
    /// `requestState` (`edge/http/request_state.rs`): 32 bytes, or 64
    /// hexadecimal digits. Empty: a random key drawn at start-up.
    pub request_state_key_file: PathBuf,
    /// How long a `requestState` stays good, within
    /// [`MIN_REQUEST_STATE_TTL`]..=[`MAX_REQUEST_STATE_TTL`].
    #[serde(with = "duration")]
    pub request_state_ttl: Duration,
}

/// Bounds of `http.request_state_ttl`: below a second no person could
/// answer; past a day a leaked token stays good too long.
pub const MIN_REQUEST_STATE_TTL: Duration = Duration::from_secs(1);
pub const MAX_REQUEST_STATE_TTL: Duration = Duration::from_secs(24 * 3600);

impl Default for HttpSection {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 7403)),
            allowed_origins: Vec::new(),
            max_body_bytes: 4 << 20,
            max_header_bytes: 16 << 10,
            max_headers: 100,
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            write_timeout: Duration::from_secs(30),
            max_connections_per_shard: 10_000,
            max_sessions: 100_000,
            session_idle_timeout: Duration::from_secs(1800),
            sse_keepalive: Duration::from_secs(15),
            sse_replay_events: 64,
            sse_replay_bytes: crate::edge::http::session::DEFAULT_REPLAY_BYTES,
            client_answer_timeout: Duration::from_secs(300),
            request_state_key_file: PathBuf::new(),
            request_state_ttl: Duration::from_secs(600),
        }
    }
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsSection {
    pub listen: SocketAddr,
}

impl Default for MetricsSection {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 7402)),
        }
    }
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct NamingSection {
    pub separator: String,
}

impl Default for NamingSection {
    fn default() -> Self {
        Self {
            separator: "__".into(),
        }
    }
}

/// `[auth]`: present, every edge requires a valid bearer JWT
/// (`docs/security.md`).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AuthSection {
    /// The `iss` every token must carry.
    pub issuer: String,
    /// This broker's canonical resource URI (RFC 8707): the `aud` every
    /// token must carry, and the `resource` of its RFC 9728 metadata.
    pub audience: String,
    /// The issuer's signing keys (a JWK Set file), read at start-up, every
    /// `jwks_refresh_interval`, and again (at most every 30 s) when a token
    /// names a key it does not hold. Exactly one of this and `jwks_url`.
    #[serde(default)]
    pub jwks_file: Option<PathBuf>,
    /// The issuer's JWK Set fetched over HTTPS (`http://` for loopback
    /// hosts only: a key set fetched in clear from a remote host could be
    /// forged on the way), on the same schedule as `jwks_file`. Start-up
    /// fails when the first fetch does.
    #[serde(default)]
    pub jwks_url: Option<String>,
    /// How often the JWK Set is read again without being asked to.
    #[serde(default = "default_jwks_refresh_interval", with = "duration")]
    pub jwks_refresh_interval: Duration,
    /// PEM certificates trusted for an `https://` `jwks_url` besides the
    /// webpki roots (a private issuer's CA).
    #[serde(default)]
    pub jwks_ca_file: Option<PathBuf>,
    /// Scopes every request needs.
    #[serde(default)]
    pub scopes: Vec<String>,
    /// Advertised in the RFC 9728 metadata; empty: `[issuer]`.
    #[serde(default)]
    pub authorization_servers: Vec<String>,
    /// Clock skew allowed on `exp` and `nbf`.
    #[serde(default = "default_leeway", with = "duration")]
    pub leeway: Duration,
    /// Extra scopes for some tools (`[[auth.rules]]`).
    #[serde(default)]
    pub rules: Vec<AuthRule>,
}

fn default_leeway() -> Duration {
    Duration::from_secs(30)
}

fn default_jwks_refresh_interval() -> Duration {
    Duration::from_secs(600)
}

/// `[tls]`: present, the frame, gRPC and MCP HTTP edges all serve TLS 1.3
/// and 1.2 (rustls) instead of plaintext (`docs/security.md`). The admin
/// endpoint stays plaintext.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TlsSection {
    /// The server's certificate chain (PEM, leaf first).
    pub cert_file: PathBuf,
    /// The leaf's private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key_file: PathBuf,
    /// Non-empty: clients must present a certificate signed by one of these
    /// PEM certificates (mutual TLS).
    #[serde(default, deserialize_with = "empty_path_is_none")]
    pub client_ca_file: Option<PathBuf>,
    /// Time from accept until the TLS handshake has finished; a connection
    /// still handshaking then is closed.
    #[serde(default = "default_tls_handshake_timeout", with = "duration")]
    pub handshake_timeout: Duration,
    /// How often the three files are checked for changes (modification time
    /// and size); a change loads them again for new connections. `0s`: only
    /// a reload (SIGHUP, `POST /admin/reload`) loads them again.
    #[serde(default = "default_tls_watch_interval", with = "duration")]
    pub watch_interval: Duration,
}

fn empty_path_is_none<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<PathBuf>, D::Error> {
    let s: Option<PathBuf> = Option::deserialize(d)?;
    Ok(s.filter(|p| !p.as_os_str().is_empty()))
}

fn default_tls_handshake_timeout() -> Duration {
    Duration::from_secs(10)
}

fn default_tls_watch_interval() -> Duration {
    Duration::from_secs(10)
}

/// One `[[auth.rules]]` entry: calling any of `tools` (the names clients
/// see) also needs every scope of `scopes`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AuthRule {
    pub tools: Vec<String>,
    pub scopes: Vec<String>,
}

/// `[bench]`: switches for `scripts/bench` only; never set in production.
#[derive(Debug, Clone, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields, default)]
pub struct BenchSection {
    /// Answer every routed tool call natively with its arguments (no WASM
    /// call), to measure the routing path without the router's cost.
    pub native_echo: bool,
}

/// Whether a router's requests may run on any instance.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum Affinity {
    /// Any shard's pool serves any request (stateless routers).
    #[default]
    None,
    /// All requests of one `session_id`, from any edge or shard, run on
    /// that session's own instance on its owner shard, one at a time, in
    /// arrival order. Requests without a session id use the shared
    /// instances.
    Session,
}

#[derive(Debug, Clone, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct DirGrantConfig {
    /// Host directory, opened read-only.
    pub host: PathBuf,
    /// Where the guest sees it.
    pub guest: String,
}

#[derive(Debug, Clone, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields, default)]
pub struct GrantsConfig {
    /// Guest stdout/stderr lines become the broker's log records
    /// (`wasm/guest_output.rs`; else discarded).
    pub stdio: bool,
    /// Names of environment variables passed through.
    pub env: Vec<String>,
    /// Read-only directories.
    pub dirs: Vec<DirGrantConfig>,
}

/// The values of a router's `upstream_protocol` (the `upstream` router's
/// `MCP_UPSTREAM_PROTOCOL`).
pub const UPSTREAM_PROTOCOLS: [&str; 3] = ["auto", "2026-07-28", "2025-06-18"];

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RouterConfig {
    pub name: String,
    /// The component (relative paths: in `broker.routers_dir`). Without it,
    /// `upstream` runs the bundled `upstream` router.
    #[serde(default)]
    pub wasm: Option<PathBuf>,
    /// A remote MCP server (Streamable HTTP endpoint URL) fronted by the
    /// bundled `upstream` router (or by `wasm`, when set), which gets
    /// outgoing HTTP to this origin only (`docs/upstreams.md`).
    #[serde(default)]
    pub upstream: Option<String>,
    /// Headers the host adds to every request to the upstream: this
    /// router's own credentials (the client's token is never forwarded).
    /// Printed by name only (`Debug` of [`Secrets`]).
    #[serde(default)]
    pub upstream_headers: Secrets,
    /// PEM certificates trusted for an `https://` upstream besides the
    /// webpki roots (a private CA). A file that cannot be read is a
    /// start-up error naming it.
    #[serde(default)]
    pub upstream_ca_file: Option<PathBuf>,
    /// The MCP revision spoken to the upstream: `auto` (the default:
    /// `server/discover` first, 2026-07-28 when the server offers it, else
    /// an `initialize`d 2025-06-18 session), `2026-07-28` or `2025-06-18`
    /// only.
    #[serde(default)]
    pub upstream_protocol: Option<String>,
    /// How often an upstream router's listings are read again (and, while
    /// its upstream is unreachable, the longest wait between retries).
    #[serde(default, with = "duration")]
    pub refresh_interval: Option<Duration>,
    /// Name prefix used when a tool or prompt name collides.
    #[serde(default)]
    pub prefix: Option<String>,
    #[serde(default)]
    pub affinity: Affinity,
    #[serde(default = "default_instances")]
    pub instances_per_shard: u32,
    #[serde(default = "default_queue_depth")]
    pub queue_depth: u32,
    #[serde(default = "default_deadline", with = "duration")]
    pub call_deadline: Duration,
    /// `affinity = "session"` only: sessions per shard with their own
    /// instance (default `wasm::DEFAULT_MAX_SESSIONS_PER_SHARD`).
    #[serde(default)]
    pub max_sessions_per_shard: Option<u32>,
    /// `affinity = "session"` only: idle time after which a session's
    /// instance is dropped (default `wasm::DEFAULT_SESSION_IDLE_TIMEOUT`).
    #[serde(default, with = "duration")]
    pub session_idle_timeout: Option<Duration>,
    /// Host memory one answer may take as it is read out of the guest;
    /// past it the call fails as a router fault (see `RouterSpec`).
    #[serde(default = "default_max_result_bytes")]
    pub max_result_bytes: usize,
    /// Linear memory one instance may grow to; past it, the guest's
    /// allocation is refused (most runtimes then trap: -32002, instance
    /// replaced). A router whose language runtime runs in the guest
    /// (componentize-py's CPython, a JavaScript engine) has it as its heap.
    #[serde(default = "default_max_memory_bytes")]
    pub max_memory_bytes: usize,
    /// The router never waits (no sleeps, outgoing requests or file
    /// reads): its calls run without a fiber, and since each holds its
    /// shard while it runs, its guest may run `wasm::NEVER_WAITS_MAX_RUN`
    /// at most (`call_deadline` still applies; see `RouterSpec::never_waits`).
    #[serde(default)]
    pub never_waits: bool,
    #[serde(default)]
    pub grants: GrantsConfig,
}

/// Header names and secret values (`upstream_headers`): a map whose
/// `Debug` shows the names only, so that a printed config never holds a
/// credential.
#[derive(Clone, Deserialize, PartialEq, Default)]
#[serde(transparent)]
pub struct Secrets(pub std::collections::BTreeMap<String, String>);

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.0.keys()).finish()
    }
}

impl std::ops::Deref for Secrets {
    type Target = std::collections::BTreeMap<String, String>;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

/// Largest `max_sessions_per_shard`: each session may hold a pooled
/// instance slot on every shard, all reserved at start-up, twice (for a
/// reload), at about 4 GiB of address space each. 8,192 on one shard is
/// 64 TiB, which starts within x86-64's 128 TiB; the 65,536 allowed
/// before could never start (an audit found 16,000 fail). The pool's sum
/// over routers and shards is checked when the host starts.
pub const MAX_SESSIONS_PER_SHARD_LIMIT: u32 = 8_192;

impl RouterConfig {
    /// The pooled instance slots this router can hold at once on `shards`
    /// shards: its shared instances and, session-affine, one per session on
    /// every shard; plus two for the transient instances that read its
    /// metadata (at load, and an upstream router's refreshes).
    pub fn instance_slots(&self, shards: usize) -> usize {
        let sessions = self
            .session_limits()
            .map_or(0, |l| l.max_per_shard as usize);
        (self.instances_per_shard as usize)
            .saturating_add(sessions)
            .saturating_mul(shards)
            .saturating_add(2)
    }

    /// The per-session instances of a session-affine router; `None` for
    /// any other.
    pub fn session_limits(&self) -> Option<crate::wasm::SessionLimits> {
        (self.affinity == Affinity::Session).then(|| {
            let d = crate::wasm::SessionLimits::default();
            crate::wasm::SessionLimits {
                max_per_shard: self.max_sessions_per_shard.unwrap_or(d.max_per_shard),
                idle_timeout: self.session_idle_timeout.unwrap_or(d.idle_timeout),
            }
        })
    }
}

/// Upper bound of `max_result_bytes`: far above any frame, low enough that
/// one answer cannot take the host's memory.
pub const MAX_RESULT_BYTES_LIMIT: usize = 1 << 30;

fn default_instances() -> u32 {
    crate::wasm::DEFAULT_INSTANCES_PER_SHARD
}
fn default_queue_depth() -> u32 {
    crate::wasm::DEFAULT_QUEUE_DEPTH
}
fn default_deadline() -> Duration {
    crate::wasm::DEFAULT_CALL_DEADLINE
}
fn default_max_result_bytes() -> usize {
    crate::wasm::DEFAULT_MAX_RESULT_BYTES
}
fn default_max_memory_bytes() -> usize {
    crate::wasm::DEFAULT_MAX_MEMORY_BYTES
}
/// Lower bound of `max_memory_bytes`: the bundled Rust routers' memory
/// starts at 17 pages (1.06 MiB), so below 2 MiB none would load.
pub const MIN_MEMORY_BYTES: usize = 2 << 20;

/// The whole configuration.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Config {
    pub broker: BrokerSection,
    pub frames: FramesSection,
    pub grpc: GrpcSection,
    pub http: HttpSection,
    pub metrics: MetricsSection,
    pub naming: NamingSection,
    pub bench: BenchSection,
    /// `None`: no authentication (`[auth]` absent).
    pub auth: Option<AuthSection>,
    /// `None`: plaintext edges (`[tls]` absent).
    pub tls: Option<TlsSection>,
    pub routers: Vec<RouterConfig>,
}

/// Command-line overrides (the brief's flags).
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub listen: Option<SocketAddr>,
    pub grpc_listen: Option<SocketAddr>,
    pub http_listen: Option<SocketAddr>,
    pub metrics_listen: Option<SocketAddr>,
    pub shards: Option<usize>,
}

/// Every problem found in a configuration, one per line, each with its key
/// path.
#[derive(Debug, thiserror::Error)]
#[error("invalid configuration:\n{}", .0.iter().map(|e| format!("  - {e}")).collect::<Vec<_>>().join("\n"))]
pub struct ConfigErrors(pub Vec<String>);

/// The longest duration the configuration takes, whatever the key: every
/// one of them is added to the clock somewhere (a connection's timer, a
/// call's deadline, the drain), and a deadline past the clock's range
/// would panic there instead of failing here.
const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

/// Longest `naming.separator`, and longest router `prefix`: both go into
/// every qualified tool name, which must stay within MCP's 128 characters
/// with room for the router's own name for the tool.
pub const MAX_SEPARATOR_LEN: usize = 16;
pub const MAX_PREFIX_LEN: usize = 64;

/// Why `part` (a router's `prefix` or `naming.separator`) cannot go into a
/// qualified tool name `<prefix><separator><name>`: a character outside the
/// MCP tool-name alphabet (A-Z a-z 0-9 `_` `-` `.`), or longer than `max`.
/// A router's name, the default prefix, is held to a subset of it.
fn check_name_part(part: &str, max: usize) -> Result<(), String> {
    if let Some(c) = part
        .chars()
        .find(|&c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')))
    {
        return Err(format!(
            "has `{}`: tool names take letters, digits, '_', '-' and '.' only",
            c.escape_debug()
        ));
    }
    if part.len() > max {
        return Err(format!(
            "is {} characters long, more than {max} (tool names take 128 at most)",
            part.len()
        ));
    }
    Ok(())
}

/// Whether `s` is a scope-token (RFC 6749 §3.3: `1*( %x21 / %x23-5B /
/// %x5D-7E )`), the only form a token's `scope` can carry.
fn is_scope_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| matches!(b, 0x21 | 0x23..=0x5B | 0x5D..=0x7E))
}

/// Why `value` is not an authorization server's issuer identifier (RFC
/// 8414 §2: an https URL with a host and no query or fragment), published
/// as it is in the RFC 9728 metadata. `http://` passes for a loopback host
/// only, as for `auth.jwks_url` ([`crate::auth::check_jwks_url`]): a client
/// would fetch the server's metadata in clear, where it could be forged.
fn check_authorization_server(value: &str) -> Result<(), String> {
    let url = url::Url::parse(value).map_err(|e| format!("is not a URL ({e})"))?;
    let Some(host) = url.host_str().filter(|h| !h.is_empty()) else {
        return Err("is not a URL with a host (https://host[/path])".into());
    };
    if !url.username().is_empty() || url.password().is_some() {
        return Err("has user information (an issuer identifier has none)".into());
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err("has a query or fragment (an issuer identifier has neither)".into());
    }
    match url.scheme() {
        "https" => Ok(()),
        "http" if crate::auth::is_loopback_host(host) => Ok(()),
        "http" => Err(
            "is http:// to a host that is not loopback (127.0.0.0/8, ::1, localhost): use https://"
                .into(),
        ),
        _ => Err("is not an https:// URL".into()),
    }
}

/// `value` as a browser sends it in an `Origin` header (the URL standard's
/// ASCII serialisation of an origin: scheme and host in lower case, a name
/// outside ASCII in its `xn--` form, no port when it is the scheme's
/// default), or why it is no http(s) origin.
fn ascii_origin(value: &str) -> Result<String, String> {
    // Refused on purpose: `null` is the Origin of sandboxed frames and
    // `file:` or `data:` documents, which any page can make, so allowing
    // it would allow every site; and no browser sends `*`, which would
    // only look like a wildcard.
    match value {
        "null" => {
            return Err(
                "`null` is the Origin any sandboxed page sends: allowing it would allow every site"
                    .into(),
            );
        }
        "*" => return Err("there is no wildcard: list each origin".into()),
        _ => {}
    }
    // The URL parser forgives what an origin may not have: a missing `//`
    // (`https:app.example`), and a trailing `/`, which it reads as the
    // root path. Nothing may follow the host and port.
    let Some((_, after_scheme)) = value.split_once("://") else {
        return Err("no scheme (http:// or https://)".into());
    };
    if after_scheme.contains(['/', '?', '#']) {
        return Err(
            "it has a path, query or fragment (nothing follows the host or port, not even '/')"
                .into(),
        );
    }
    let url = url::Url::parse(value).map_err(|e| format!("{e}"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!(
            "the scheme `{}` is not http or https",
            url.scheme()
        ));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err("it has user information".into());
    }
    if url.port() == Some(0) {
        return Err("port 0 is no port a browser sends".into());
    }
    Ok(url.origin().ascii_serialization())
}

const NO_ROUTERS: &str = "routers: at least one [[routers]] entry is needed";

/// How an error in the `[tls]` files begins (after the file's path, in
/// `Config::load`): a reload refused for one counts as a failed certificate
/// reload (`control.rs`).
pub const TLS_FILE_ERROR: &str = "tls: ";

/// Whether two listen addresses would take the same connections: the same
/// port (not 0, which the kernel picks apart) on the same address, or on
/// one side an unspecified address that takes the other's: `0.0.0.0` every
/// IPv4 address, `[::]` every address (the broker leaves `IPV6_V6ONLY` to
/// the host, whose default makes it dual-stack). An IPv4-mapped IPv6
/// address (`[::ffff:127.0.0.1]`) is its IPv4 address, as it is to the
/// kernel. `0.0.0.0:P` and `[::1]:P` take different connections.
pub fn addrs_overlap(a: SocketAddr, b: SocketAddr) -> bool {
    let (ia, ib) = (a.ip().to_canonical(), b.ip().to_canonical());
    a.port() != 0 && a.port() == b.port() && (ia == ib || covers(ia, ib) || covers(ib, ia))
}

/// Whether moving a listener from `own` to `addr`, which overlaps it, takes
/// connections `own` did not (127.0.0.1:P to 0.0.0.0:P, or to [::]:P).
pub fn widens(own: SocketAddr, addr: SocketAddr) -> bool {
    let (from, to) = (own.ip().to_canonical(), addr.ip().to_canonical());
    addrs_overlap(own, addr) && from != to && !covers(from, to)
}

/// Whether a listener on `wide` takes the connections to `addr` (both
/// canonical): `wide` is unspecified, and IPv6 or `addr` IPv4.
pub fn covers(wide: std::net::IpAddr, addr: std::net::IpAddr) -> bool {
    wide.is_unspecified() && (wide.is_ipv6() || addr.is_ipv4())
}

/// Every duration in the configuration: humantime's syntax (`30s`, `5m`,
/// `1h30m`), at most [`MAX_DURATION`].
mod duration {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, de::Error as _};

    /// A duration, or an optional one.
    pub trait Bounded {
        fn longest(&self) -> Option<Duration>;
    }
    impl Bounded for Duration {
        fn longest(&self) -> Option<Duration> {
            Some(*self)
        }
    }
    impl Bounded for Option<Duration> {
        fn longest(&self) -> Option<Duration> {
            *self
        }
    }

    pub fn deserialize<'de, T, D>(d: D) -> Result<T, D::Error>
    where
        T: Bounded,
        D: Deserializer<'de>,
        humantime_serde::Serde<T>: Deserialize<'de>,
    {
        let v: T = humantime_serde::deserialize(d)?;
        match v.longest() {
            Some(l) if l > super::MAX_DURATION => Err(D::Error::custom(format!(
                "must be at most 365 days ({l:?} given)"
            ))),
            _ => Ok(v),
        }
    }
}

impl Config {
    /// The embedded default.
    pub fn embedded_default() -> Self {
        // The embedded default is tested to parse; failing here is a build
        // defect, not an operator error.
        Self::parse(DEFAULT_TOML).unwrap_or_else(|e| panic!("embedded default config: {e}"))
    }

    /// Parses and validates a TOML document.
    pub fn parse(text: &str) -> Result<Self, ConfigErrors> {
        let mut errors = Vec::new();
        let table: toml::Table = match text.parse() {
            Ok(t) => t,
            // Where and what, not toml's quote of the line: that line may
            // hold a secret (`upstream_headers`), and errors are logged and
            // answered to `POST /admin/reload`.
            Err(e) => {
                let at = e.span().map_or(String::new(), |s| {
                    let before = &text[..s.start.min(text.len())];
                    let line = before.matches('\n').count() + 1;
                    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
                    format!(" at line {line}, column {column}")
                });
                return Err(ConfigErrors(vec![format!(
                    "TOML syntax{at}: {}",
                    e.message().trim_end()
                )]));
            }
        };
        let mut config = Config::default();
        let mut router_entries = 0;
        for (key, value) in table {
            let value = value.clone();
            match key.as_str() {
                "broker" => section(&key, value, &mut config.broker, &mut errors),
                "frames" => section(&key, value, &mut config.frames, &mut errors),
                "grpc" => section(&key, value, &mut config.grpc, &mut errors),
                "http" => section(&key, value, &mut config.http, &mut errors),
                "metrics" => section(&key, value, &mut config.metrics, &mut errors),
                "naming" => section(&key, value, &mut config.naming, &mut errors),
                "bench" => section(&key, value, &mut config.bench, &mut errors),
                "auth" => config.auth = deserialize_all(&key, value, &mut errors),
                "tls" => config.tls = deserialize_all(&key, value, &mut errors),
                "routers" => match value {
                    toml::Value::Array(items) => {
                        router_entries = items.len();
                        for (i, item) in items.into_iter().enumerate() {
                            let at = format!("routers[{i}]");
                            if let Some(r) = deserialize_all(&at, item, &mut errors) {
                                config.routers.push(r);
                            }
                        }
                    }
                    _ => errors.push("routers: must be an array of tables ([[routers]])".into()),
                },
                other => errors.push(format!(
                    "{other}: unknown section (expected broker, frames, grpc, http, metrics, naming, bench, auth, tls, routers)"
                )),
            }
        }
        config.validate(&mut errors);
        // Entries that are there but unreadable were reported as such.
        if router_entries > 0 {
            errors.retain(|e| e != NO_ROUTERS);
        }
        if errors.is_empty() {
            Ok(config)
        } else {
            Err(ConfigErrors(errors))
        }
    }

    /// Reads `path`, or the embedded default when `None`, then applies the
    /// overrides and validates again.
    pub fn load(path: Option<&std::path::Path>, o: &Overrides) -> Result<Self, ConfigErrors> {
        let mut config = match path {
            Some(p) => {
                let text = std::fs::read_to_string(p)
                    .map_err(|e| ConfigErrors(vec![format!("--config {}: {e}", p.display())]))?;
                Self::parse(&text).map_err(|ConfigErrors(errs)| {
                    ConfigErrors(
                        errs.into_iter()
                            .map(|e| format!("{}: {e}", p.display()))
                            .collect(),
                    )
                })?
            }
            None => Self::embedded_default(),
        };
        if let Some(a) = o.listen {
            config.frames.listen = a;
        }
        if let Some(a) = o.grpc_listen {
            config.grpc.listen = a;
        }
        if let Some(a) = o.http_listen {
            config.http.listen = a;
        }
        if let Some(a) = o.metrics_listen {
            config.metrics.listen = a;
        }
        if let Some(n) = o.shards {
            config.broker.shards = n;
        }
        let mut errors = Vec::new();
        config.validate(&mut errors);
        if errors.is_empty() {
            Ok(config)
        } else {
            Err(ConfigErrors(errors))
        }
    }

    /// The edges' listen keys and addresses.
    pub fn listeners(&self) -> [(&'static str, SocketAddr); 4] {
        [
            ("frames.listen", self.frames.listen),
            ("grpc.listen", self.grpc.listen),
            ("http.listen", self.http.listen),
            ("metrics.listen", self.metrics.listen),
        ]
    }

    /// Checks the whole configuration, adding one error per problem; and
    /// stores `http.allowed_origins` in the form browsers send them, since
    /// the HTTP edge compares them with the Origin header as strings.
    fn validate(&mut self, errors: &mut Vec<String>) {
        // Two shards pinned to one CPU only take turns on it.
        let mut seen = std::collections::BTreeSet::new();
        let twice: std::collections::BTreeSet<_> = self
            .broker
            .cpus
            .iter()
            .filter(|c| !seen.insert(**c))
            .collect();
        for c in twice {
            errors.push(format!(
                "broker.cpus: CPU {c} is listed more than once (each shard needs a CPU of its own)"
            ));
        }
        let tick = self.broker.epoch_tick;
        if !(MIN_EPOCH_TICK..=MAX_EPOCH_TICK).contains(&tick) {
            errors.push(format!(
                "broker.epoch_tick: {tick:?} is outside {MIN_EPOCH_TICK:?}..={MAX_EPOCH_TICK:?} (finer wakes the ticker too often; coarser would stretch a never_waits call's {MAX_EPOCH_TICK:?} run limit)"
            ));
        }
        let page = self.broker.list_page_size;
        if !(1..=MAX_LIST_PAGE_SIZE).contains(&page) {
            errors.push(format!(
                "broker.list_page_size: {page} is outside 1..={MAX_LIST_PAGE_SIZE}"
            ));
        }
        if self.broker.idle_poll > MAX_IDLE_POLL {
            errors.push(format!(
                "broker.idle_poll: {:?} is above {:?} (a shard would poll instead of sleeping; 0s turns it off)",
                self.broker.idle_poll, MAX_IDLE_POLL
            ));
        }
        if let Some(a) = &self.auth {
            if a.issuer.is_empty() {
                errors.push("auth.issuer: must not be empty".into());
            }
            if !(a.audience.starts_with("https://") || a.audience.starts_with("http://"))
                || a.audience.contains('#')
            {
                errors.push(format!(
                    "auth.audience: `{}` is not an absolute http(s) URI without a fragment (this broker's canonical resource URI, e.g. https://mcp.example/mcp)",
                    a.audience
                ));
            }
            // No network I/O here: a URL is checked for its form only, and
            // fetched by `Auth::new` at start-up.
            match (&a.jwks_file, &a.jwks_url) {
                (None, None) => errors.push(
                    "auth.jwks_file, auth.jwks_url: the issuer's JWK Set is needed (set one of them)"
                        .into(),
                ),
                (Some(_), Some(_)) => errors.push(
                    "auth.jwks_file, auth.jwks_url: set only one of them (both are set)".into(),
                ),
                (Some(p), None) => {
                    if let Err(e) = crate::auth::KeySet::load(p) {
                        errors.push(format!("auth.jwks_file: {e}"));
                    }
                }
                (None, Some(u)) => {
                    if let Err(e) = crate::auth::check_jwks_url(u) {
                        errors.push(format!("auth.jwks_url: {e}"));
                    }
                }
            }
            if a.jwks_refresh_interval < crate::auth::MIN_REFRESH_INTERVAL {
                errors.push(format!(
                    "auth.jwks_refresh_interval: {:?} is below {:?}",
                    a.jwks_refresh_interval,
                    crate::auth::MIN_REFRESH_INTERVAL
                ));
            }
            if let Some(ca) = &a.jwks_ca_file {
                if !a
                    .jwks_url
                    .as_deref()
                    .is_some_and(|u| u.starts_with("https://"))
                {
                    errors.push("auth.jwks_ca_file: only for an https:// auth.jwks_url".into());
                } else if let Err(e) = crate::tls::client_config(Some(ca)) {
                    errors.push(format!("auth.jwks_ca_file: {e}"));
                }
            }
            // A scope no token can carry would refuse every request (or
            // every call of the rule's tools) instead of failing here.
            let rule_scopes = a.rules.iter().enumerate().flat_map(|(i, r)| {
                r.scopes
                    .iter()
                    .enumerate()
                    .map(move |(j, s)| (format!("auth.rules[{i}].scopes[{j}]"), s))
            });
            let scopes = a.scopes.iter().enumerate();
            for (key, s) in scopes
                .map(|(i, s)| (format!("auth.scopes[{i}]"), s))
                .chain(rule_scopes)
            {
                if !is_scope_token(s) {
                    errors.push(format!(
                        "{key}: `{}` is not a scope token (RFC 6749 §3.3: one or more printable ASCII characters, no space, '\"' or '\\'); no token could carry it",
                        s.escape_debug()
                    ));
                }
            }
            for (i, u) in a.authorization_servers.iter().enumerate() {
                if let Err(why) = check_authorization_server(u) {
                    errors.push(format!(
                        "auth.authorization_servers[{i}]: `{}` {why}",
                        u.escape_debug()
                    ));
                }
            }
            for (i, r) in a.rules.iter().enumerate() {
                if r.tools.is_empty() || r.scopes.is_empty() {
                    errors.push(format!(
                        "auth.rules[{i}]: needs at least one tool and one scope"
                    ));
                }
            }
        }
        if let Some(t) = &self.tls {
            if t.handshake_timeout.is_zero() {
                errors.push("tls.handshake_timeout: must be greater than zero".into());
            }
            // The files are read here, so that a bad certificate or key is
            // a start-up error (and a refused reload) naming the file.
            if let Err(e) = crate::tls::ServerConfigs::load(t) {
                errors.extend(e.into_iter().map(|e| format!("{TLS_FILE_ERROR}{e}")));
            }
        }
        let f = &self.frames;
        if f.max_frame_bytes < 64 || f.max_frame_bytes > MAX_FRAME_BYTES_LIMIT {
            errors.push(format!(
                "frames.max_frame_bytes: {} is outside 64..={MAX_FRAME_BYTES_LIMIT}",
                f.max_frame_bytes
            ));
        }
        if f.max_connections_per_shard == 0 {
            errors.push("frames.max_connections_per_shard: must be at least 1".into());
        }
        if f.max_in_flight_per_connection == 0 {
            errors.push("frames.max_in_flight_per_connection: must be at least 1".into());
        }
        if f.max_output_bytes_per_connection < 4096 {
            errors.push(format!(
                "frames.max_output_bytes_per_connection: {} is below 4096",
                f.max_output_bytes_per_connection
            ));
        }
        for (name, d) in [
            ("frames.idle_timeout", f.idle_timeout),
            ("frames.partial_frame_timeout", f.partial_frame_timeout),
            ("frames.write_timeout", f.write_timeout),
        ] {
            if d.is_zero() {
                errors.push(format!("{name}: must be greater than zero"));
            }
        }
        let g = &self.grpc;
        if g.max_message_bytes < 1024 || g.max_message_bytes > MAX_FRAME_BYTES_LIMIT as usize {
            errors.push(format!(
                "grpc.max_message_bytes: {} is outside 1024..={MAX_FRAME_BYTES_LIMIT}",
                g.max_message_bytes
            ));
        }
        for (name, n) in [
            ("grpc.max_concurrent_requests", g.max_concurrent_requests),
            ("grpc.max_subscribers", g.max_subscribers),
            ("grpc.max_connections", g.max_connections),
            ("grpc.max_sessions", g.max_sessions),
            (
                "grpc.max_concurrent_streams_per_connection",
                g.max_concurrent_streams_per_connection as usize,
            ),
        ] {
            if n == 0 {
                errors.push(format!("{name}: must be at least 1"));
            }
        }
        for (name, d) in [
            ("grpc.handshake_timeout", g.handshake_timeout),
            ("grpc.keepalive_interval", g.keepalive_interval),
            ("grpc.keepalive_timeout", g.keepalive_timeout),
            ("grpc.write_timeout", g.write_timeout),
            ("grpc.body_timeout", g.body_timeout),
            ("grpc.max_connection_age", g.max_connection_age),
            ("grpc.max_connection_age_grace", g.max_connection_age_grace),
            ("grpc.session_idle_timeout", g.session_idle_timeout),
        ] {
            if d.is_zero() {
                errors.push(format!("{name}: must be greater than zero"));
            }
        }
        for (i, r) in g.roots.iter().enumerate() {
            if r.uri.is_empty() {
                errors.push(format!("grpc.roots[{i}].uri: must not be empty"));
            } else {
                // ListRoots hands the text as it is, and a client resolves
                // it: MCP's roots are `file://` URIs, and a space or a typo
                // names nothing it can find (the URL parser alone would
                // trim the one and take the other as a scheme).
                let parsed = url::Url::parse(&r.uri);
                let why = match &parsed {
                    Err(e) => Some(e.to_string()),
                    Ok(_) if r.uri.chars().any(char::is_whitespace) => {
                        Some("it holds whitespace".into())
                    }
                    Ok(u) if u.scheme() != "file" => Some(format!(
                        "its scheme is `{}`; MCP's roots are file:// URIs",
                        u.scheme()
                    )),
                    Ok(_) => None,
                };
                if let Some(why) = why {
                    errors.push(format!(
                        "grpc.roots[{i}].uri: `{}` is not a file:// URI ({why}), e.g. file:///srv/data",
                        r.uri
                    ));
                }
            }
        }
        let h = &self.http;
        if h.max_body_bytes < 1024 || h.max_body_bytes > MAX_FRAME_BYTES_LIMIT as usize {
            errors.push(format!(
                "http.max_body_bytes: {} is outside 1024..={MAX_FRAME_BYTES_LIMIT}",
                h.max_body_bytes
            ));
        }
        if h.max_header_bytes < 8192 {
            errors.push(format!(
                "http.max_header_bytes: {} is below 8192 (hyper's smallest read buffer)",
                h.max_header_bytes
            ));
        }
        for (name, n) in [
            ("http.max_headers", h.max_headers),
            (
                "http.max_connections_per_shard",
                h.max_connections_per_shard,
            ),
            ("http.max_sessions", h.max_sessions),
            ("http.sse_replay_events", h.sse_replay_events),
            ("http.sse_replay_bytes", h.sse_replay_bytes),
        ] {
            if n == 0 {
                errors.push(format!("{name}: must be at least 1"));
            }
        }
        for (name, d) in [
            ("http.header_timeout", h.header_timeout),
            ("http.body_timeout", h.body_timeout),
            ("http.write_timeout", h.write_timeout),
            ("http.session_idle_timeout", h.session_idle_timeout),
            ("http.sse_keepalive", h.sse_keepalive),
            ("http.client_answer_timeout", h.client_answer_timeout),
        ] {
            if d.is_zero() {
                errors.push(format!("{name}: must be greater than zero"));
            }
        }
        if !(MIN_REQUEST_STATE_TTL..=MAX_REQUEST_STATE_TTL).contains(&h.request_state_ttl) {
            errors.push(format!(
                "http.request_state_ttl: {:?} is outside {MIN_REQUEST_STATE_TTL:?}..={MAX_REQUEST_STATE_TTL:?}",
                h.request_state_ttl
            ));
        }
        // Stored as a browser serialises the origin, so that another
        // spelling of it (`https://App.Example:443`) still matches.
        for (i, o) in self.http.allowed_origins.iter_mut().enumerate() {
            match ascii_origin(o) {
                Ok(ascii) => *o = ascii,
                Err(why) => errors.push(format!(
                    "http.allowed_origins[{i}]: `{}` is not an origin (http[s]://host[:port]): {why}",
                    o.escape_debug()
                )),
            }
        }
        // Every listener is SO_REUSEPORT (one per shard): a second edge on
        // an edge's port would bind too, and the kernel would share the
        // connections between them.
        let edges = self.listeners();
        for (i, (b, addr_b)) in edges.iter().enumerate() {
            for (a, addr_a) in &edges[..i] {
                if addrs_overlap(*addr_a, *addr_b) {
                    errors.push(format!(
                        "{b}: {addr_b} is also {a}'s address (each edge needs its own port)"
                    ));
                }
            }
        }
        if self.broker.shards > 1024 {
            errors.push(format!(
                "broker.shards: {} is more than 1024",
                self.broker.shards
            ));
        }
        let sep = &self.naming.separator;
        if sep.is_empty() {
            errors.push("naming.separator: must not be empty".into());
        } else if let Err(why) = check_name_part(sep, MAX_SEPARATOR_LEN) {
            errors.push(format!("naming.separator: `{}` {why}", sep.escape_debug()));
        }
        if self.routers.is_empty() {
            errors.push(NO_ROUTERS.into());
        }
        let mut seen = std::collections::HashSet::new();
        for (i, r) in self.routers.iter().enumerate() {
            let at = format!("routers[{i}] ({})", r.name);
            if r.name.is_empty()
                || !r
                    .name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
            {
                errors.push(format!("{at}.name: use letters, digits, '-' and '_' only"));
            }
            if !seen.insert(r.name.as_str()) {
                errors.push(format!("{at}.name: another router has this name"));
            }
            if r.instances_per_shard == 0 {
                errors.push(format!("{at}.instances_per_shard: must be at least 1"));
            }
            if r.call_deadline.is_zero() {
                errors.push(format!("{at}.call_deadline: must be greater than zero"));
            }
            if r.max_result_bytes == 0 || r.max_result_bytes > MAX_RESULT_BYTES_LIMIT {
                errors.push(format!(
                    "{at}.max_result_bytes: {} is outside 1..={MAX_RESULT_BYTES_LIMIT}",
                    r.max_result_bytes
                ));
            }
            let memory = MIN_MEMORY_BYTES..=crate::wasm::MAX_MEMORY_BYTES_LIMIT;
            if !memory.contains(&r.max_memory_bytes) {
                errors.push(format!(
                    "{at}.max_memory_bytes: {} is outside {}..={} (the pooled instance slot)",
                    r.max_memory_bytes,
                    memory.start(),
                    memory.end()
                ));
            }
            if r.never_waits && r.upstream.is_some() {
                errors.push(format!(
                    "{at}.never_waits: an `upstream` router waits on its upstream"
                ));
            }
            if r.never_waits && !r.grants.dirs.is_empty() {
                errors.push(format!(
                    "{at}.never_waits: a router granted `dirs` waits on file reads"
                ));
            }
            if r.wasm.is_none() && r.upstream.is_none() {
                errors.push(format!(
                    "{at}: set `wasm` (a component) or `upstream` (a remote MCP server's URL)"
                ));
            }
            if let Some(full) = &r.upstream {
                // Shown without its query, which may hold a key.
                let url = shown_url(full);
                match full.parse::<hyper::Uri>() {
                    // An IPv6 zone id (`[fe80::1%eth0]`) parses, but the
                    // outgoing client connects to no such host.
                    Ok(u) if u.host().is_some_and(|h| h.contains('%')) => errors.push(format!(
                        "{at}.upstream: `{url}` names an IPv6 zone id, which the broker's HTTP client cannot connect with: use a routable address or a host name"
                    )),
                    // Never sent, and the URL is shown in logs and on
                    // /readyz: the password would be too. Not echoed here.
                    Ok(u) if u.authority().is_some_and(|a| a.as_str().contains('@')) => {
                        errors.push(format!(
                            "{at}.upstream: the URL has user information (`user:password@`), which the broker never sends: put the credentials in `upstream_headers` (e.g. `Authorization`)"
                        ))
                    }
                    // A port that is not a number parses, and then the
                    // router's every request is refused by wasi:http.
                    Ok(u) if u.authority().is_some_and(|a| {
                        let after_host = a.as_str().rsplit(']').next().unwrap_or_default();
                        after_host.contains(':') && a.port_u16().is_none()
                    }) => errors.push(format!(
                        "{at}.upstream: `{url}` has a port that is not a number from 0 to 65535"
                    )),
                    Ok(u)
                        if matches!(u.scheme_str(), Some("http" | "https"))
                            && u.host().is_some_and(|h| !h.is_empty()) => {}
                    _ => errors.push(format!(
                        "{at}.upstream: `{url}` is not an absolute http:// or https:// URL"
                    )),
                }
            } else {
                if !r.upstream_headers.is_empty() {
                    errors.push(format!(
                        "{at}.upstream_headers: only applies with `upstream`"
                    ));
                }
                if r.refresh_interval.is_some() {
                    errors.push(format!(
                        "{at}.refresh_interval: only applies with `upstream`"
                    ));
                }
                if r.upstream_ca_file.is_some() {
                    errors.push(format!(
                        "{at}.upstream_ca_file: only applies with `upstream`"
                    ));
                }
                if r.upstream_protocol.is_some() {
                    errors.push(format!(
                        "{at}.upstream_protocol: only applies with `upstream`"
                    ));
                }
            }
            if let Some(p) = &r.upstream_protocol
                && !UPSTREAM_PROTOCOLS.contains(&p.as_str())
            {
                errors.push(format!(
                    "{at}.upstream_protocol: `{p}` is none of {}",
                    UPSTREAM_PROTOCOLS.join(", ")
                ));
            }
            for (name, value) in r.upstream_headers.iter() {
                if hyper::header::HeaderName::try_from(name.as_str()).is_err() {
                    errors.push(format!(
                        "{at}.upstream_headers: `{name}` is not a valid header name"
                    ));
                }
                // The value may be a secret: name the header, never the value.
                if hyper::header::HeaderValue::try_from(value.as_str()).is_err() {
                    errors.push(format!(
                        "{at}.upstream_headers: the value of `{name}` is not a valid header value"
                    ));
                }
            }
            if r.refresh_interval
                .is_some_and(|d| d < Duration::from_secs(1))
            {
                errors.push(format!("{at}.refresh_interval: must be at least 1s"));
            }
            match r.prefix.as_deref() {
                Some("") => errors.push(format!("{at}.prefix: must not be empty when set")),
                Some(p) => {
                    if let Err(why) = check_name_part(p, MAX_PREFIX_LEN) {
                        errors.push(format!("{at}.prefix: `{}` {why}", p.escape_debug()));
                    }
                }
                None => {}
            }
            if r.affinity != Affinity::Session {
                for (key, set) in [
                    ("max_sessions_per_shard", r.max_sessions_per_shard.is_some()),
                    ("session_idle_timeout", r.session_idle_timeout.is_some()),
                ] {
                    if set {
                        errors.push(format!(
                            "{at}.{key}: only applies with affinity = \"session\""
                        ));
                    }
                }
            }
            if let Some(n) = r.max_sessions_per_shard
                && !(1..=MAX_SESSIONS_PER_SHARD_LIMIT).contains(&n)
            {
                errors.push(format!(
                    "{at}.max_sessions_per_shard: {n} is outside 1..={MAX_SESSIONS_PER_SHARD_LIMIT}"
                ));
            }
            if r.session_idle_timeout.is_some_and(|d| d.is_zero()) {
                errors.push(format!(
                    "{at}.session_idle_timeout: must be greater than zero"
                ));
            }
        }
    }

    /// The routers directory in effect.
    pub fn routers_dir(&self) -> PathBuf {
        if self.broker.routers_dir.as_os_str().is_empty() {
            crate::wasm::default_routers_dir()
        } else {
            self.broker.routers_dir.clone()
        }
    }

    /// Number of shards in effect (0 resolved to one per CPU this process
    /// may run on: its affinity mask, e.g. under `taskset` or a cpuset,
    /// and no more than its CPU quota, a container's `cpu.max`, which the
    /// standard library reads: a pod limited to one CPU on a 64-core node
    /// ran 64 shards, and 64 times the instance pools).
    pub fn shard_count(&self) -> usize {
        match self.broker.shards {
            0 => {
                let quota = std::thread::available_parallelism().map_or(1, |n| n.get());
                crate::process::allowed_cpus().map_or(quota, |c| c.len().min(quota))
            }
            n => n,
        }
    }

    /// The host-side spec of router `r`.
    pub fn router_spec(&self, r: &RouterConfig) -> crate::wasm::RouterSpec {
        let wasm = match (&r.wasm, &r.upstream) {
            (Some(wasm), _) if wasm.is_absolute() => wasm.clone(),
            (Some(wasm), _) => self.routers_dir().join(wasm),
            (None, _) => self
                .routers_dir()
                .join(format!("{}.wasm", crate::wasm::UPSTREAM_ROUTER)),
        };
        let mut spec = crate::wasm::RouterSpec::new(r.name.clone(), wasm);
        spec.instances_per_shard = r.instances_per_shard;
        spec.queue_depth = r.queue_depth;
        spec.call_deadline = r.call_deadline;
        spec.sessions = r.session_limits();
        spec.max_result_bytes = r.max_result_bytes;
        spec.max_memory_bytes = r.max_memory_bytes;
        spec.never_waits = r.never_waits;
        spec.grants = crate::wasm::Grants {
            stdio_to_stderr: r.grants.stdio,
            env: r.grants.env.clone(),
            read_only_dirs: r
                .grants
                .dirs
                .iter()
                .map(|d| crate::wasm::DirGrant {
                    host: d.host.clone(),
                    guest: d.guest.clone(),
                })
                .collect(),
            vars: Vec::new(),
            http: None,
        };
        if let Some(url) = &r.upstream {
            spec.grants.vars = vec![
                (crate::wasm::UPSTREAM_URL_VAR.into(), url.clone()),
                ("MCP_UPSTREAM_NAME".into(), r.name.clone()),
            ];
            if let Some(p) = &r.upstream_protocol {
                spec.grants
                    .vars
                    .push(("MCP_UPSTREAM_PROTOCOL".into(), p.clone()));
            }
            spec.grants.http = Some(crate::wasm::HttpGrant {
                url: url.clone(),
                headers: r
                    .upstream_headers
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
                ca_file: r.upstream_ca_file.clone(),
            });
        }
        spec
    }
}

fn section<T: for<'de> Deserialize<'de>>(
    key: &str,
    value: toml::Value,
    into: &mut T,
    errors: &mut Vec<String>,
) {
    if let Some(v) = deserialize_all(key, value, errors) {
        *into = v;
    }
}

/// Deserializes `value` (the table at `at`), reporting every field that
/// does not fit, each with its key path: serde stops at a struct's first
/// error, so the offending key is taken out and the rest tried again, until
/// what is left fits (its value then has defaults where the bad keys were,
/// and the semantic checks see the others) or an error names no key to
/// take out (a missing field). `None` when nothing fitted.
fn deserialize_all<T: for<'de> Deserialize<'de>>(
    at: &str,
    mut value: toml::Value,
    errors: &mut Vec<String>,
) -> Option<T> {
    // Each round takes one key out: never more rounds than keys.
    for _ in 0..=count_keys(&value) {
        let e = match T::deserialize(value.clone()) {
            Ok(v) => return Some(v),
            Err(e) => e,
        };
        let keys = error_keys(&e);
        let path = std::iter::once(at.to_owned())
            .chain(keys.iter().cloned())
            .collect::<Vec<_>>()
            .join(".");
        // Secrets are named, never shown: a value that does not fit under
        // `upstream_headers` (a header line given as a string) is one.
        if keys.iter().any(|k| k == "upstream_headers") {
            errors.push(format!("{path}: {}", without_strings(e.message())));
        } else {
            errors.push(format!("{path}: {}", e.message()));
        }
        // An unknown key names itself in the message, not in the path.
        let mut bad = keys;
        if let Some(name) = unknown_field(e.message()) {
            bad.push(name.to_owned());
        }
        if bad.is_empty() || !remove_key(&mut value, &bad) {
            return None;
        }
    }
    None
}

/// The keys from the table down to the field a deserialization error is
/// about. toml keeps them but shows them only in its `Display`, as a last
/// line "in `a.b`" (when it has no source text to point into, as for a
/// `toml::Value`): a test pins that form.
fn error_keys(e: &toml::de::Error) -> Vec<String> {
    let text = e.to_string();
    text.lines()
        .last()
        .and_then(|l| l.strip_prefix("in `"))
        .and_then(|l| l.strip_suffix('`'))
        .map(|k| k.split('.').map(str::to_owned).collect())
        .unwrap_or_default()
}

/// `message` with every double-quoted string replaced by `"…"`.
fn without_strings(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some((head, tail)) = rest.split_once('"') {
        out.push_str(head);
        match tail.rsplit_once('"') {
            Some((_, after)) => {
                out.push_str("\"…\"");
                rest = after;
            }
            None => {
                rest = "";
            }
        }
    }
    out.push_str(rest);
    out
}

/// The field of serde's "unknown field `x`, expected …".
fn unknown_field(message: &str) -> Option<&str> {
    message
        .strip_prefix("unknown field `")?
        .split_once('`')
        .map(|(name, _)| name)
}

/// Takes the key at `path` out of the tables of `value`.
fn remove_key(value: &mut toml::Value, path: &[String]) -> bool {
    let Some((last, parents)) = path.split_last() else {
        return false;
    };
    let mut v = value;
    for k in parents {
        match v.get_mut(k.as_str()) {
            Some(next) => v = next,
            None => return false,
        }
    }
    v.as_table_mut().is_some_and(|t| t.remove(last).is_some())
}

fn count_keys(value: &toml::Value) -> usize {
    match value {
        toml::Value::Table(t) => t.len() + t.values().map(count_keys).sum::<usize>(),
        toml::Value::Array(a) => a.iter().map(count_keys).sum(),
        _ => 0,
    }
}

/// `url` without its query and fragment (`?…` in their place) and without
/// user information (`…@` in its place), for messages that reach the log,
/// `/readyz` or a refused reload's answer: a query may hold a key
/// (`?api_key=…`), user information a password.
pub fn shown_url(url: &str) -> std::borrow::Cow<'_, str> {
    let (head, cut) = match url.find(['?', '#']) {
        Some(at) => (&url[..at], true),
        None => (url, false),
    };
    // The authority runs from after `scheme://` to the next `/`.
    let start = head.find("://").map_or(0, |i| i + 3);
    let end = head[start..].find('/').map_or(head.len(), |i| start + i);
    let user = head[start..end].rfind('@').map(|i| start + i);
    if !cut && user.is_none() {
        return url.into();
    }
    let mut shown = String::with_capacity(head.len() + 4);
    match user {
        Some(at) => {
            shown.push_str(&head[..start]);
            shown.push('…');
            shown.push_str(&head[at..]);
        }
        None => shown.push_str(head),
    }
    if cut {
        shown.push_str("?…");
    }
    shown.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_shown_without_a_query_or_user_information() {
        assert_eq!(
            shown_url("https://h:8443/jwks.json"),
            "https://h:8443/jwks.json"
        );
        assert_eq!(shown_url("https://h/j?k=s3cret#f"), "https://h/j?…");
        assert_eq!(shown_url("http://u:pw@h:1/p/a@b"), "http://…@h:1/p/a@b");
        assert_eq!(shown_url("http://u:pw@h/x?k=1"), "http://…@h/x?…");
        assert_eq!(shown_url("not a url"), "not a url");
    }

    #[test]
    fn embedded_default_is_the_example_file_and_parses() {
        let on_disk =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/broker.example.toml"))
                .unwrap();
        assert_eq!(on_disk, DEFAULT_TOML);
        let c = Config::parse(DEFAULT_TOML).unwrap();
        assert_eq!(c.frames.listen.to_string(), "127.0.0.1:7400");
        assert_eq!(c.grpc.listen.to_string(), "127.0.0.1:7401");
        assert_eq!(c.metrics.listen.to_string(), "127.0.0.1:7402");
        let names: Vec<_> = c.routers.iter().map(|r| r.name.as_str()).collect();
        // The chaos router is for tests only (tests/fixtures/chaos.toml).
        assert_eq!(names, ["echo", "kv", "library"]);
        assert!(
            c.routers.iter().all(
                |r| r.max_result_bytes == crate::wasm::DEFAULT_MAX_RESULT_BYTES
                    && r.max_memory_bytes == crate::wasm::DEFAULT_MAX_MEMORY_BYTES
            ),
            "the example states the default max_result_bytes and max_memory_bytes"
        );
        // The file states the same defaults the structs have.
        assert_eq!(c.frames, FramesSection::default());
        assert_eq!(c.broker, BrokerSection::default());
    }

    #[test]
    fn frame_timeouts_are_bounded() {
        let err = Config::parse(
            "[frames]\nidle_timeout = \"1000years\"\nwrite_timeout = \"366days\"\npartial_frame_timeout = \"365days\"\n",
        )
        .unwrap_err();
        let all = err.0.join("\n");
        assert!(
            all.contains("frames.idle_timeout: must be at most 365 days"),
            "{all}"
        );
        assert!(
            all.contains("frames.write_timeout: must be at most 365 days"),
            "{all}"
        );
        assert!(
            !all.contains("partial_frame_timeout"),
            "365 days is allowed: {all}"
        );
    }

    #[test]
    fn grpc_timers_are_bounded_and_the_old_threads_key_still_loads() {
        let err = Config::parse(
            "[grpc]\nmax_connection_age = \"1000years\"\nkeepalive_timeout = \"0s\"\n",
        )
        .unwrap_err();
        let all = err.0.join("\n");
        assert!(
            all.contains("grpc.max_connection_age: must be at most 365 days"),
            "{all}"
        );
        assert!(
            all.contains("grpc.keepalive_timeout: must be greater than zero"),
            "{all}"
        );
        let c = Config::parse(
            "[grpc]\nthreads = 2\n[[routers]]\nname = \"echo\"\nwasm = \"echo.wasm\"\n",
        )
        .unwrap();
        assert_eq!(
            c.grpc.threads,
            Some(2),
            "accepted (and ignored with a warning)"
        );
    }

    #[test]
    fn idle_poll_is_off_by_default_bounded_and_picks_the_ring() {
        use crate::shard::Ring;
        let c = Config::embedded_default();
        assert_eq!(c.broker.idle_poll, Duration::ZERO);
        assert_eq!(Ring::for_config(&c.broker), Ring::Defer);
        let router = "[[routers]]\nname = \"echo\"\nwasm = \"echo.wasm\"\n";
        let c = Config::parse(&format!("[broker]\nidle_poll = \"150us\"\n{router}")).unwrap();
        assert_eq!(c.broker.idle_poll, Duration::from_micros(150));
        // DEFER_TASKRUN would never post completions to a polling turn.
        assert_eq!(Ring::for_config(&c.broker), Ring::Coop);
        let c = Config::parse(&format!(
            "[broker]\nio_uring_defer_taskrun = false\n{router}"
        ))
        .unwrap();
        assert_eq!(Ring::for_config(&c.broker), Ring::Classic);
        let err = Config::parse(&format!("[broker]\nidle_poll = \"1s\"\n{router}")).unwrap_err();
        assert!(
            err.0
                .iter()
                .any(|e| e.starts_with("broker.idle_poll: 1s is above 100ms")),
            "{:?}",
            err.0
        );
    }

    #[test]
    fn request_state_defaults_to_a_random_key_and_ten_minutes_and_is_bounded() {
        let d = Config::embedded_default().http;
        assert_eq!(d.request_state_key_file, PathBuf::new());
        assert_eq!(d.request_state_ttl, Duration::from_secs(600));
        let router = "[[routers]]\nname = \"echo\"\nwasm = \"echo.wasm\"\n";
        let c = Config::parse(&format!(
            "[http]\nrequest_state_key_file = \"/k\"\nrequest_state_ttl = \"1h\"\n{router}"
        ))
        .unwrap();
        assert_eq!(c.http.request_state_key_file, PathBuf::from("/k"));
        assert_eq!(c.http.request_state_ttl, Duration::from_secs(3600));
        for ttl in ["0s", "999ms", "25h"] {
            let err = Config::parse(&format!("[http]\nrequest_state_ttl = \"{ttl}\"\n{router}"))
                .unwrap_err();
            assert!(
                err.0
                    .iter()
                    .any(|e| e.starts_with("http.request_state_ttl: ")
                        && e.ends_with("is outside 1s..=86400s")),
                "{ttl}: {:?}",
                err.0
            );
        }
    }

    #[test]
    fn list_page_size_defaults_to_100_and_is_bounded() {
        assert_eq!(Config::embedded_default().broker.list_page_size, 100);
        let router = "[[routers]]\nname = \"echo\"\nwasm = \"echo.wasm\"\n";
        let c = Config::parse(&format!("[broker]\nlist_page_size = 1000\n{router}")).unwrap();
        assert_eq!(c.broker.list_page_size, 1000);
        for n in [0, 10_001] {
            let err =
                Config::parse(&format!("[broker]\nlist_page_size = {n}\n{router}")).unwrap_err();
            let want = format!("broker.list_page_size: {n} is outside 1..=10000");
            assert!(err.0.iter().any(|e| e == &want), "{:?}", err.0);
        }
    }

    #[test]
    fn epoch_tick_defaults_to_a_millisecond_and_is_bounded() {
        assert_eq!(
            Config::embedded_default().broker.epoch_tick,
            Duration::from_millis(1)
        );
        let router = "[[routers]]\nname = \"echo\"\nwasm = \"echo.wasm\"\n";
        let c = Config::parse(&format!("[broker]\nepoch_tick = \"5ms\"\n{router}")).unwrap();
        assert_eq!(c.broker.epoch_tick, Duration::from_millis(5));
        for (tick, shown) in [("0s", "0ns"), ("50us", "50µs"), ("11ms", "11ms")] {
            let err =
                Config::parse(&format!("[broker]\nepoch_tick = \"{tick}\"\n{router}")).unwrap_err();
            let want = format!("broker.epoch_tick: {shown} is outside 100µs..=10ms");
            assert!(
                err.0.iter().any(|e| e.starts_with(&want)),
                "{tick}: {:?}",
                err.0
            );
        }
    }

    #[test]
    fn never_waits_refuses_what_waits_and_reaches_the_spec() {
        let err = Config::parse(
            r#"
            [[routers]]
            name = "up"
            upstream = "http://127.0.0.1:9/mcp"
            never_waits = true
            [[routers]]
            name = "files"
            wasm = "x.wasm"
            never_waits = true
            grants = { dirs = [{ host = "/tmp", guest = "/data" }] }
            "#,
        )
        .unwrap_err();
        let all = err.0.join("\n");
        assert!(
            all.contains("routers[0] (up).never_waits: an `upstream` router waits"),
            "{all}"
        );
        assert!(
            all.contains("routers[1] (files).never_waits: a router granted `dirs`"),
            "{all}"
        );
        let c = Config::parse(
            "[[routers]]\nname = \"echo\"\nwasm = \"echo.wasm\"\nnever_waits = true\n",
        )
        .unwrap();
        assert!(c.router_spec(&c.routers[0]).never_waits);
        let e = Config::parse(
            "[[grpc.roots]]\nuri = \"srv/data\"\n[[grpc.roots]]\nuri = \"file:///srv/data\"\n",
        )
        .unwrap_err()
        .0
        .join("\n");
        assert!(
            e.contains("grpc.roots[0].uri: `srv/data` is not a file:// URI")
                && !e.contains("roots[1]"),
            "{e}"
        );
        for bad in [
            " file:///srv/data",
            "file:///srv/da ta",
            "fiel:///srv",
            "https://x/y",
        ] {
            let e = Config::parse(&format!("[[grpc.roots]]\nuri = \"{bad}\"\n"))
                .unwrap_err()
                .0
                .join("\n");
            assert!(e.contains("is not a file:// URI"), "{bad}: {e}");
        }
        let c = Config::parse(
            "[[routers]]\nname = \"py\"\nwasm = \"py.wasm\"\nmax_memory_bytes = 268435456\n",
        )
        .unwrap();
        assert_eq!(c.router_spec(&c.routers[0]).max_memory_bytes, 256 << 20);
        // The example's `echo` never waits; its other routers keep the default.
        let d = Config::parse(DEFAULT_TOML).unwrap();
        let flags: Vec<bool> = d.routers.iter().map(|r| r.never_waits).collect();
        assert_eq!(flags, [true, false, false]);
    }

    #[test]
    fn all_errors_are_reported_at_once_with_key_paths() {
        let text = r#"
            [frames]
            max_frame_bytes = 1
            bogus = 3
            [broker]
            shards = "many"
            [naming]
            separator = ""
            [[routers]]
            name = "a b"
            wasm = "x.wasm"
            instances_per_shard = 0
            max_result_bytes = 0
            max_memory_bytes = 268435457
            [[routers]]
            wasm = "y.wasm"
            [extra]
        "#;
        let err = Config::parse(text).unwrap_err();
        let all = err.0.join("\n");
        for needle in [
            "frames: unknown field `bogus`",
            // Read again without `bogus`: its other value is checked too.
            "frames.max_frame_bytes: 1 is outside",
            "broker.shards: invalid type",
            "naming.separator",
            "routers[0] (a b).name",
            "routers[0] (a b).instances_per_shard",
            "routers[0] (a b).max_result_bytes: 0 is outside",
            "routers[0] (a b).max_memory_bytes: 268435457 is outside 2097152..=268435456",
            "routers[1]: missing field `name`",
            "extra: unknown section",
        ] {
            assert!(all.contains(needle), "missing {needle:?} in:\n{all}");
        }
    }

    /// Keys whose values do not deserialize name their path, and a section
    /// or router with one such key is read again without it, so that its
    /// other bad values are reported in the same run.
    #[test]
    fn every_value_that_does_not_fit_is_reported_with_its_key_path() {
        let text = r#"
            [broker]
            drain_timeout = "10"
            [frames]
            listen = "localhost:7400"
            idle_timeout = 300
            write_timeout = "0s"
            max_frame_bytes = 1
            [http]
            max_body_bytes = "4MiB"
            [[routers]]
            name = "echo"
            wasm = "echo.wasm"
            instances_per_shard = "4"
            affinity = "Session"
            call_deadline = "0s"
        "#;
        let all = Config::parse(text).unwrap_err().0.join("\n");
        for needle in [
            "broker.drain_timeout: ",
            "frames.listen: invalid socket address",
            "frames.idle_timeout: invalid type: integer `300`",
            "frames.write_timeout: must be greater than zero",
            "frames.max_frame_bytes: 1 is outside",
            "http.max_body_bytes: invalid type",
            "routers[0].instances_per_shard: invalid type",
            "routers[0].affinity: unknown variant `Session`",
            "routers[0] (echo).call_deadline: must be greater than zero",
        ] {
            assert!(all.contains(needle), "missing {needle:?} in:\n{all}");
        }
        assert!(!all.contains(NO_ROUTERS), "the entry is there:\n{all}");
    }

    /// Every duration is added to the clock somewhere; past its range that
    /// panicked (a shard at its first HTTP connection, the drain at
    /// SIGTERM, a router's start-up), so none may be longer than a year.
    #[test]
    fn no_duration_may_be_longer_than_a_year() {
        let text = r#"
            [broker]
            drain_timeout = "300000000000years"
            drain_grace = "366days"
            [http]
            header_timeout = "1000years"
            [[routers]]
            name = "echo"
            wasm = "echo.wasm"
            call_deadline = "300000000000years"
            session_idle_timeout = "400days"
        "#;
        let all = Config::parse(text).unwrap_err().0.join("\n");
        for key in [
            "broker.drain_timeout",
            "broker.drain_grace",
            "http.header_timeout",
            "routers[0].call_deadline",
            "routers[0].session_idle_timeout",
        ] {
            assert!(
                all.contains(&format!("{key}: must be at most 365 days")),
                "missing {key} in:\n{all}"
            );
        }
        let c = Config::parse(
            "[http]\nheader_timeout = \"365days\"\n[[routers]]\nname = \"echo\"\nwasm = \"echo.wasm\"\n",
        )
        .unwrap();
        assert_eq!(c.http.header_timeout, MAX_DURATION);
    }

    #[test]
    fn two_edges_may_not_share_a_port() {
        let router = "[[routers]]\nname = \"echo\"\nwasm = \"echo.wasm\"\n";
        let all = Config::parse(&format!(
            "[frames]\nlisten = \"127.0.0.1:7500\"\n[http]\nlisten = \"0.0.0.0:7500\"\n\
             [grpc]\nlisten = \"127.0.0.1:0\"\n[metrics]\nlisten = \"127.0.0.1:0\"\n{router}"
        ))
        .unwrap_err()
        .0
        .join("\n");
        assert!(
            all.contains("http.listen: 0.0.0.0:7500 is also frames.listen's address"),
            "{all}"
        );
        assert!(!all.contains("grpc.listen"), "port 0 is no clash: {all}");
        for (a, b, clash) in [
            ("127.0.0.1:1", "127.0.0.1:1", true),
            ("127.0.0.1:1", "127.0.0.2:1", false),
            ("[::]:1", "127.0.0.1:1", true),
            ("127.0.0.1:1", "127.0.0.1:2", false),
            ("127.0.0.1:0", "127.0.0.1:0", false),
            // The kernel takes an IPv4-mapped address as the IPv4 one.
            ("[::ffff:127.0.0.1]:1", "127.0.0.1:1", true),
            ("127.0.0.1:1", "[::ffff:127.0.0.1]:1", true),
            ("[::ffff:0.0.0.0]:1", "127.0.0.1:1", true),
            ("[::ffff:127.0.0.2]:1", "127.0.0.1:1", false),
            // 0.0.0.0 takes IPv4 only; [::] takes both.
            ("0.0.0.0:1", "[::1]:1", false),
            ("[::ffff:0.0.0.0]:1", "[::1]:1", false),
            ("[::1]:1", "0.0.0.0:1", false),
            ("[::]:1", "[::1]:1", true),
            ("[::]:1", "0.0.0.0:1", true),
        ] {
            assert_eq!(
                addrs_overlap(a.parse().unwrap(), b.parse().unwrap()),
                clash,
                "{a} {b}"
            );
        }
        // A reload may move an edge beside its own listeners only onto the
        // same address or a narrower one.
        for (own, to, wider) in [
            ("127.0.0.1:1", "0.0.0.0:1", true),
            ("127.0.0.1:1", "[::]:1", true),
            ("0.0.0.0:1", "[::]:1", true),
            ("0.0.0.0:1", "127.0.0.1:1", false),
            ("[::]:1", "[::1]:1", false),
            ("127.0.0.1:1", "[::ffff:127.0.0.1]:1", false),
            ("[::1]:1", "0.0.0.0:1", false),
        ] {
            assert_eq!(
                widens(own.parse().unwrap(), to.parse().unwrap()),
                wider,
                "{own} -> {to}"
            );
        }
    }

    /// Config errors are logged and answered to `POST /admin/reload`: they
    /// name an `upstream_headers` value's place, never the value.
    #[test]
    fn errors_never_show_an_upstream_headers_secret() {
        let router = "[[routers]]\nname = \"u\"\nupstream = \"http://127.0.0.1:1/mcp\"\n";
        let all = Config::parse(&format!(
            "{router}upstream_headers = {{ Authorization = \"Bearer S3CRET\", X = on }}\n"
        ))
        .unwrap_err()
        .0
        .join("\n");
        assert!(all.contains("TOML syntax at line 4, column"), "{all}");
        assert!(!all.contains("S3CRET"), "{all}");
        let all = Config::parse(&format!(
            "{router}upstream_headers = \"Authorization: Bearer S3CRET\"\n"
        ))
        .unwrap_err()
        .0
        .join("\n");
        assert!(
            all.contains("routers[0].upstream_headers: invalid type"),
            "{all}"
        );
        assert!(!all.contains("S3CRET"), "{all}");
        assert_eq!(without_strings(r#"a "x" b "y "z" c"#), r#"a "…" c"#);
        // A password in the URL is refused, and not shown either.
        let all = Config::parse(
            "[[routers]]\nname = \"u\"\nupstream = \"http://admin:S3CRET@127.0.0.1:1/mcp\"\n",
        )
        .unwrap_err()
        .0
        .join("\n");
        assert!(
            all.contains("routers[0] (u).upstream: the URL has user information"),
            "{all}"
        );
        assert!(!all.contains("S3CRET"), "{all}");
    }

    /// [`error_keys`] reads toml's `Display`: this pins the form it reads.
    #[test]
    fn toml_names_the_keys_of_a_value_that_does_not_fit() {
        let v: toml::Value = "[a]\nb = \"x\"\n".parse::<toml::Table>().unwrap().into();
        #[derive(Deserialize, Debug)]
        #[allow(dead_code)]
        struct A {
            a: B,
        }
        #[derive(Deserialize, Debug)]
        #[allow(dead_code)]
        struct B {
            b: u32,
        }
        let e = A::deserialize(v).unwrap_err();
        assert_eq!(error_keys(&e), ["a", "b"], "{e}");
        assert_eq!(
            unknown_field("unknown field `zz`, expected `b`"),
            Some("zz")
        );
    }

    #[test]
    fn session_limits_apply_to_session_routers_only_and_are_validated() {
        let c = Config::embedded_default();
        let kv = c.routers.iter().find(|r| r.name == "kv").unwrap();
        assert_eq!(
            c.router_spec(kv).sessions,
            Some(crate::wasm::SessionLimits::default())
        );
        let echo = c.routers.iter().find(|r| r.name == "echo").unwrap();
        assert_eq!(c.router_spec(echo).sessions, None);

        let text = r#"
            [[routers]]
            name = "s"
            wasm = "kv.wasm"
            affinity = "session"
            max_sessions_per_shard = 3
            session_idle_timeout = "90s"
        "#;
        let c = Config::parse(text).unwrap();
        let limits = c.router_spec(&c.routers[0]).sessions.unwrap();
        assert_eq!(limits.max_per_shard, 3);
        assert_eq!(limits.idle_timeout, Duration::from_secs(90));

        let text = r#"
            [[routers]]
            name = "a"
            wasm = "kv.wasm"
            max_sessions_per_shard = 3
            [[routers]]
            name = "b"
            wasm = "kv.wasm"
            affinity = "session"
            max_sessions_per_shard = 0
            session_idle_timeout = "0s"
        "#;
        let all = Config::parse(text).unwrap_err().0.join("\n");
        for needle in [
            "routers[0] (a).max_sessions_per_shard: only applies with affinity = \"session\"",
            "routers[1] (b).max_sessions_per_shard: 0 is outside",
            "routers[1] (b).session_idle_timeout: must be greater than zero",
        ] {
            assert!(all.contains(needle), "missing {needle:?} in:\n{all}");
        }
    }

    /// The HTTP edge compares the Origin header with each value as a
    /// string: another spelling of an origin is stored as browsers send
    /// it, and what is no origin (it would never match) is refused.
    #[test]
    fn allowed_origins_are_stored_as_browsers_send_them() {
        let router = "[[routers]]\nname = \"echo\"\nwasm = \"echo.wasm\"\n";
        let origins = |list: &[&str]| {
            let list: Vec<String> = list.iter().map(|o| format!("{o:?}")).collect();
            format!("[http]\nallowed_origins = [{}]\n{router}", list.join(", "))
        };
        for (written, sent) in [
            ("https://app.example", "https://app.example"),
            ("https://App.Example:443", "https://app.example"),
            ("HTTPS://APP.EXAMPLE", "https://app.example"),
            ("http://app.example:80", "http://app.example"),
            ("https://app.example:0443", "https://app.example"),
            ("https://app.example:8443", "https://app.example:8443"),
            ("http://app.example:443", "http://app.example:443"),
            ("https://app.example:80", "https://app.example:80"),
            (
                "https://xn--bcher-kva.example",
                "https://xn--bcher-kva.example",
            ),
            ("https://Bücher.example", "https://xn--bcher-kva.example"),
            ("http://10.0.0.1:8080", "http://10.0.0.1:8080"),
            (
                "https://[2001:DB8:0:0:1:0:0:1]:443",
                "https://[2001:db8::1:0:0:1]",
            ),
            ("https://[0:0:0:0:0:0:0:1]:8080", "https://[::1]:8080"),
            ("http://[::FFFF:127.0.0.1]", "http://[::ffff:7f00:1]"),
            ("http://[1:0:0:2:0:0:0:3]", "http://[1:0:0:2::3]"),
            ("http://[1:0:0:2:0:0:3:4]", "http://[1::2:0:0:3:4]"),
            ("http://[1:2:3:4:5:6:7:0]", "http://[1:2:3:4:5:6:7:0]"),
        ] {
            let c = Config::parse(&origins(&[written])).unwrap();
            assert_eq!(c.http.allowed_origins, [sent], "{written}");
        }
        // `load` validates what `parse` normalised again: it stays put.
        let dir = std::env::temp_dir().join(format!("mcp-broker-origins-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("broker.toml");
        std::fs::write(&file, origins(&["https://App.Example:443"])).unwrap();
        let c = Config::load(Some(&file), &Overrides::default());
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(c.unwrap().http.allowed_origins, ["https://app.example"]);

        let bad = [
            ("", "no scheme"),
            ("app.example", "no scheme"),
            ("//app.example", "no scheme"),
            ("https:app.example", "no scheme"),
            ("ftp://app.example", "the scheme `ftp` is not http or https"),
            ("https://app.example/", "path, query or fragment"),
            ("https://app.example/mcp", "path, query or fragment"),
            ("https://app.example?x=1", "path, query or fragment"),
            ("https://app.example#top", "path, query or fragment"),
            ("https://user@app.example", "user information"),
            ("https://", "empty host"),
            ("https://:443", "empty host"),
            ("https://app example", "invalid international domain name"),
            ("https://app.example:99999", "invalid port number"),
            ("https://app.example:0", "port 0"),
            ("https://app.example:+443", "invalid port number"),
            ("https://app.example:8x", "invalid port number"),
            ("https://[::1", "invalid IPv6 address"),
            ("https://[app.example]", "invalid IPv6 address"),
            ("null", "allowing it would allow every site"),
            ("*", "there is no wildcard"),
        ];
        let list: Vec<&str> = bad.iter().map(|(o, _)| *o).collect();
        let err = Config::parse(&origins(&list)).unwrap_err();
        // All at once, one each.
        assert_eq!(err.0.len(), bad.len(), "{:#?}", err.0);
        for (i, (o, why)) in bad.iter().enumerate() {
            let start = format!(
                "http.allowed_origins[{i}]: `{}` is not an origin (http[s]://host[:port]): ",
                o.escape_debug()
            );
            assert!(
                err.0
                    .iter()
                    .any(|e| e.starts_with(&start) && e.contains(why)),
                "{o:?}: want {why:?} in {:#?}",
                err.0
            );
        }
    }

    const AUTH: &str = "[auth]\nissuer = \"https://issuer.example\"\n\
        audience = \"https://mcp.example/mcp\"\n\
        jwks_url = \"https://issuer.example/jwks.json\"\n";

    /// A scope no token can carry (RFC 6749 §3.3) would refuse every
    /// request it applies to.
    #[test]
    fn scopes_must_be_scope_tokens() {
        let router = "[[routers]]\nname = \"echo\"\nwasm = \"echo.wasm\"\n";
        let text = format!(
            r#"{AUTH}scopes = ["mcp", "mcp read", "", "a\"b", "a\\b", "é", "tab	x", "!#[]~:/"]
            [[auth.rules]]
            tools = ["put"]
            scopes = ["kv:write", "kv write"]
            {router}"#
        );
        let err = Config::parse(&text).unwrap_err();
        let all = err.0.join("\n");
        for needle in [
            "auth.scopes[1]: `mcp read` is not a scope token (RFC 6749 §3.3",
            "auth.scopes[2]: `` is not a scope token",
            "auth.scopes[3]: `a\\\"b` is not a scope token",
            "auth.scopes[4]: `a\\\\b` is not a scope token",
            "auth.scopes[5]: `é` is not a scope token",
            "auth.scopes[6]: `tab\\tx` is not a scope token",
            "auth.rules[0].scopes[1]: `kv write` is not a scope token",
        ] {
            assert!(all.contains(needle), "missing {needle:?} in:\n{all}");
        }
        assert_eq!(err.0.len(), 7, "{all}");
        let c = Config::parse(&format!(
            "{AUTH}scopes = [\"mcp\", \"!#[]~:/\"]\n[[auth.rules]]\ntools = [\"put\"]\nscopes = [\"kv:write\"]\n{router}"
        ))
        .unwrap();
        assert_eq!(c.auth.unwrap().scopes, ["mcp", "!#[]~:/"]);
    }

    /// They are published as they are in the RFC 9728 metadata, where a
    /// client takes each for an issuer identifier (RFC 8414 §2).
    #[test]
    fn authorization_servers_must_be_issuer_urls() {
        let router = "[[routers]]\nname = \"echo\"\nwasm = \"echo.wasm\"\n";
        let servers = |list: &[&str]| {
            let list: Vec<String> = list.iter().map(|o| format!("{o:?}")).collect();
            format!(
                "{AUTH}authorization_servers = [{}]\n{router}",
                list.join(", ")
            )
        };
        let good = [
            "https://as.example",
            "https://login.example/tenant/v2.0",
            "http://127.0.0.1:8080",
            "http://localhost:9000/realms/x",
            "http://[::1]:1",
        ];
        let c = Config::parse(&servers(&good)).unwrap();
        assert_eq!(c.auth.unwrap().authorization_servers, good);
        let bad = [
            ("as.example", "is not a URL"),
            ("/as", "is not a URL"),
            ("not a url", "is not a URL"),
            ("https://", "is not a URL (empty host)"),
            ("ftp://as.example", "is not an https:// URL"),
            (
                "http://as.example",
                "is http:// to a host that is not loopback",
            ),
            ("https://as.example?tenant=1", "has a query"),
            ("https://as.example/#x", "has a query or fragment"),
            ("https://user@as.example", "has user information"),
        ];
        let list: Vec<&str> = bad.iter().map(|(u, _)| *u).collect();
        let err = Config::parse(&servers(&list)).unwrap_err();
        assert_eq!(err.0.len(), bad.len(), "{:#?}", err.0);
        for (i, (u, why)) in bad.iter().enumerate() {
            let want = format!("auth.authorization_servers[{i}]: `{u}` {why}");
            assert!(
                err.0.iter().any(|e| e.starts_with(&want)),
                "{u:?}: want {want:?} in {:#?}",
                err.0
            );
        }
    }

    /// The separator and a prefix go into tool names: MCP's alphabet and
    /// length (SEP-986: 1-128 of A-Z a-z 0-9 _ - .) hold for them too.
    #[test]
    fn separator_and_prefix_keep_to_the_tool_name_alphabet() {
        let with = |separator: &str, prefix: &str| {
            format!(
                "[naming]\nseparator = {separator:?}\n\
                 [[routers]]\nname = \"a\"\nwasm = \"a.wasm\"\nprefix = {prefix:?}\n"
            )
        };
        for (separator, prefix) in [
            ("__", "a"),
            (".", "my.tools-1_"),
            ("-", "X"),
            ("_x_", &"p".repeat(MAX_PREFIX_LEN)),
            (&"s".repeat(MAX_SEPARATOR_LEN), "a"),
        ] {
            let c = Config::parse(&with(separator, prefix)).unwrap();
            assert_eq!(c.naming.separator, separator);
            assert_eq!(c.routers[0].prefix.as_deref(), Some(prefix));
        }
        for (separator, prefix, sep_why, prefix_why) in [
            (" ", "my tools", "has ` `", "has ` `"),
            ("/", "a/b", "has `/`", "has `/`"),
            ("::", "a:b", "has `:`", "has `:`"),
            ("→", "ü", "has `→`", "has `ü`"),
            (
                &"s".repeat(MAX_SEPARATOR_LEN + 1),
                &"p".repeat(MAX_PREFIX_LEN + 1),
                "is 17 characters long, more than 16",
                "is 65 characters long, more than 64",
            ),
        ] {
            let err = Config::parse(&with(separator, prefix)).unwrap_err();
            let all = err.0.join("\n");
            let sep = format!("naming.separator: `{separator}` {sep_why}");
            let pre = format!("routers[0] (a).prefix: `{prefix}` {prefix_why}");
            assert!(all.contains(&sep), "missing {sep:?} in:\n{all}");
            assert!(all.contains(&pre), "missing {pre:?} in:\n{all}");
            assert_eq!(err.0.len(), 2, "{all}");
        }
        let all = Config::parse(&with("", "")).unwrap_err().0.join("\n");
        assert!(all.contains("naming.separator: must not be empty"), "{all}");
        assert!(
            all.contains("routers[0] (a).prefix: must not be empty when set"),
            "{all}"
        );
    }

    #[test]
    fn overrides_apply_and_are_validated() {
        let o = Overrides {
            listen: Some("127.0.0.1:0".parse().unwrap()),
            shards: Some(2000),
            ..Default::default()
        };
        let err = Config::load(None, &o).unwrap_err();
        assert!(err.0.iter().any(|e| e.contains("broker.shards")));
        let o = Overrides {
            shards: Some(2),
            ..o
        };
        let c = Config::load(None, &o).unwrap();
        assert_eq!(c.frames.listen.port(), 0);
        assert_eq!(c.shard_count(), 2);
    }
    #[test]
    fn a_cpu_listed_twice_is_refused() {
        let router = "[[routers]]\nname = \"echo\"\nwasm = \"echo.wasm\"\n";
        let err = Config::parse(&format!("[broker]\ncpus = [0, 1, 0]\n{router}")).unwrap_err();
        assert_eq!(
            err.0,
            ["broker.cpus: CPU 0 is listed more than once (each shard needs a CPU of its own)"]
        );
        assert!(Config::parse(&format!("[broker]\ncpus = [1, 0]\n{router}")).is_ok());
    }
}
