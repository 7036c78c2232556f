//! The process-wide host: one wasmtime [`Engine`] (pooling allocator, CoW
//! memory images, epoch interruption), the WASI linker, the epoch ticker
//! thread and the small tokio runtime that WASI's timers and blocking file
//! I/O run on; and [`Router`], a loaded component shared by all shards.
//!
//! # Invariants
//! - One engine per process; components are compiled once and their
//!   `InstancePre` is shared read-only (`Send + Sync`) by every shard.
//! - Every store has limits, an epoch deadline with a yielding callback, and
//!   a WASI context built from the router's grants only.
//! - A guest call is only ever polled inside [`drive`], with the tokio
//!   context entered: WASI sleeps and file reads register on the host's
//!   tokio runtime and wake the shard's task across threads, never block it.

use std::cell::Cell;
use std::future::Future;
use std::num::NonZeroUsize;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Wake};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use wasmtime::component::{
    Component, ComponentExportIndex, Func, Linker, ResourceTable, TypedFunc,
};
use wasmtime::{
    Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig, ResourceLimiter, Store,
    StoreLimits, StoreLimitsBuilder, UpdateDeadline,
};
use wasmtime_wasi::{FsPerms, WasiCtx, WasiCtxView, WasiView};
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};

use super::bindings::host_world::mcp_broker::host::call as host_call;
use super::bindings::types::{McpResource, Prompt, ServerDescription, Tool};
use super::bindings::{HOST_CALL_INTERFACE, McpRouter, McpRouterPre, ROUTER_INTERFACE};
use super::error::{CallError, HostError, LoadError};
use super::metered::{
    self, CallToolParams, CallToolResults, CompleteParams, CompleteResults, GetPromptParams,
    GetPromptResults, ReadResourceParams, ReadResourceResults,
};
use super::outbound::{Outbound, OutboundHooks};
use super::spec::{HostConfig, NEVER_WAITS_MAX_RUN, RouterSpec};
use super::ticker;
use super::types as w;

/// Core instances, tables and memories one router store may create: a Rust
/// `wasm32-wasip2` component is one main module plus a few `wit-component`
/// shims; anything far beyond that is not a router.
const MAX_CORE_INSTANCES_PER_STORE: usize = 16;
const MAX_TABLES_PER_STORE: usize = 16;
const MAX_MEMORIES_PER_STORE: usize = 4;
/// Bytes of a pooled memory, table or fiber stack kept mapped and reset with
/// memset when its instance is dropped (the rest is decommitted).
const KEEP_RESIDENT_BYTES: usize = 128 << 10;

/// The process-wide WASM host. Cheap to share (`Arc`); dropping the last
/// reference stops the ticker thread and the WASI runtime.
pub struct WasmHost {
    shared: Arc<Shared>,
    ticker: Option<JoinHandle<()>>,
    stop: Arc<AtomicBool>,
    /// The ticker is parked: no guest code has run for
    /// [`ticker::PARK_AFTER`] (`ticker.rs`).
    parked: Arc<AtomicBool>,
    /// Pooled instance slots ([`HostConfig::max_instances`]).
    max_instances: u32,
    /// Components compiled, by their file's bytes: dozens of `upstream`
    /// routers are one component, compiled once (about a second each in a
    /// debug build, and each copy's code held in memory). Emptied when it
    /// holds [`COMPILED_KEPT`] (files that changed across reloads).
    compiled: std::sync::Mutex<std::collections::HashMap<Arc<[u8]>, Component>>,
    /// Components compiled so far (not taken from `compiled`).
    compilations: std::sync::atomic::AtomicU64,
}

/// Most distinct components [`WasmHost`] keeps compiled.
const COMPILED_KEPT: usize = 32;

/// What every router and pool of this host needs.
pub(crate) struct Shared {
    pub(crate) engine: Engine,
    linker: Linker<StoreState>,
    /// `linker` plus `wasi:http`, for routers granted an upstream only: a
    /// router without the grant that imports `wasi:http` fails to load.
    linker_http: Linker<StoreState>,
    /// The same imports, synchronous, for routers that never wait
    /// ([`RouterSpec::never_waits`]): a component linked against only
    /// synchronous host functions can be called without a fiber.
    linker_sync: Linker<StoreState>,
    pub(crate) tokio: tokio::runtime::Runtime,
    max_memory_bytes: usize,
    /// Ticks a `never_waits` call may see: [`NEVER_WAITS_MAX_RUN`] in epoch
    /// ticks.
    run_ticks: u32,
}

impl std::fmt::Debug for WasmHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WasmHost").finish_non_exhaustive()
    }
}

impl WasmHost {
    /// Builds the engine, the WASI linker, the epoch ticker thread and the
    /// WASI I/O runtime.
    pub fn new(config: &HostConfig) -> Result<Self, HostError> {
        let engine_err = |e: wasmtime::Error| HostError::Engine(format!("{e:#}"));
        let mut pool = PoolingAllocationConfig::default();
        pool.total_component_instances(config.max_instances)
            .total_core_instances(config.max_instances.saturating_mul(8))
            .total_memories(config.max_instances)
            .total_tables(config.max_instances.saturating_mul(4))
            .total_stacks(config.max_instances)
            .max_memory_size(config.max_memory_bytes)
            // Reset a released slot's first pages with memset instead of
            // `madvise`: a router touches little memory per call, and a
            // replaced instance then starts without page faults.
            .linear_memory_keep_resident(KEEP_RESIDENT_BYTES)
            .table_keep_resident(KEEP_RESIDENT_BYTES)
            .async_stack_keep_resident(KEEP_RESIDENT_BYTES);
        let mut cfg = Config::new();
        // Routers need no wasm GC; the workspace's `gc` feature compiles GC in
        // without a collector, which an engine refuses unless it is off.
        cfg.gc_support(false).wasm_exceptions(false);
        cfg.wasm_component_model(true)
            .epoch_interruption(true)
            .max_wasm_stack(config.max_wasm_stack)
            .memory_init_cow(true)
            .wasm_backtrace_max_frames(if config.trap_backtraces {
                NonZeroUsize::new(20)
            } else {
                None
            })
            .allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        let engine = Engine::new(&cfg).map_err(engine_err)?;

        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker).map_err(engine_err)?;
        // The broker's own imports (wit/host): every router may use them.
        host_call::add_to_linker::<_, wasmtime::component::HasSelf<StoreState>>(&mut linker, |s| s)
            .map_err(engine_err)?;
        // `wasi:http/types` for every router: its data types (headers,
        // requests, responses) send nothing without `outgoing-handler`,
        // which only routers granted an upstream get (below). Toolchains
        // import it whether a router sends requests or not: every
        // componentize-js (StarlingMonkey) build does, and was refused.
        wasmtime_wasi_http::p2::bindings::http::types::add_to_linker::<
            _,
            wasmtime_wasi_http::WasiHttp,
        >(
            &mut linker,
            &wasmtime_wasi_http::p2::bindings::LinkOptions::default().into(),
            StoreState::http,
        )
        .map_err(engine_err)?;
        let mut linker_http = linker.clone();
        wasmtime_wasi_http::p2::bindings::http::outgoing_handler::add_to_linker::<
            _,
            wasmtime_wasi_http::WasiHttp,
        >(&mut linker_http, StoreState::http)
        .map_err(engine_err)?;
        let linker_sync = sync_linker(&engine).map_err(engine_err)?;

        // One worker: WASI timers, the blocking pool's completions and
        // upstream routers' HTTP connections (`outbound.rs`) only wake shard
        // tasks; no guest code ever runs on this runtime.
        let tokio = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("wasm-wasi-io")
            .enable_time()
            .enable_io()
            .build()?;

        let stop = Arc::new(AtomicBool::new(false));
        let parked = Arc::new(AtomicBool::new(false));
        let ticker = {
            let engine = engine.weak();
            let (stop, parked) = (stop.clone(), parked.clone());
            let tick = config.epoch_tick;
            let may_park = ticker::can_park();
            if !may_park {
                tracing::debug!("membarrier refused: the epoch ticker ticks even when idle");
            }
            std::thread::Builder::new()
                .name("wasm-epoch".into())
                .spawn(move || {
                    // A dedicated thread, not a shard: sleeping is its job.
                    ticker::run(engine, tick, &stop, &parked, may_park)
                })?
        };
        Ok(Self {
            shared: Arc::new(Shared {
                engine,
                linker,
                linker_http,
                linker_sync,
                tokio,
                max_memory_bytes: config.max_memory_bytes,
                run_ticks: run_ticks(config.epoch_tick),
            }),
            ticker: Some(ticker),
            stop,
            parked,
            max_instances: config.max_instances,
            compiled: Default::default(),
            compilations: Default::default(),
        })
    }

    /// How many components this host has compiled: a file loaded again
    /// unchanged (another router of it, a reload) is not compiled again.
    pub fn compilations(&self) -> u64 {
        self.compilations.load(Ordering::Relaxed)
    }

    /// `bytes` compiled, or the component already compiled from the same
    /// bytes (the engine is the same: its code is too).
    fn compile(&self, bytes: Vec<u8>) -> wasmtime::Result<Component> {
        let lock = || self.compiled.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = lock().get(bytes.as_slice()) {
            return Ok(c.clone());
        }
        // Compiled unlocked: routers load side by side.
        let c = Component::new(&self.shared.engine, &bytes)?;
        self.compilations.fetch_add(1, Ordering::Relaxed);
        let mut cache = lock();
        if cache.len() >= COMPILED_KEPT {
            cache.clear();
        }
        cache.insert(bytes.into(), c.clone());
        Ok(c)
    }

    /// The pooled instance slots reserved at start-up: every instance of
    /// every router, on every shard, draining pools' included, must fit.
    pub fn max_instances(&self) -> u32 {
        self.max_instances
    }

    /// Whether the epoch ticker is parked because no guest code has run for
    /// a while (for tests and diagnostics: an idle broker makes no
    /// wake-ups of its own).
    pub fn epoch_ticker_parked(&self) -> bool {
        self.parked.load(Ordering::Relaxed)
    }

    /// The engine (for benchmarks and diagnostics).
    pub fn engine(&self) -> &Engine {
        &self.shared.engine
    }

    /// Compiles and checks a router component, reads its metadata once, and
    /// returns it ready to be pooled by every shard. Blocks the calling
    /// thread (compilation); call it at startup or off the shards.
    pub fn load(&self, spec: &RouterSpec) -> Result<Arc<Router>, LoadError> {
        let router = spec.name.clone();
        let spec_err = |message: String| LoadError::Spec {
            router: router.clone(),
            message,
        };
        if spec.instances_per_shard == 0 {
            return Err(spec_err("instances_per_shard must be at least 1".into()));
        }
        if spec.max_memory_bytes > self.shared.max_memory_bytes {
            return Err(spec_err(format!(
                "max_memory_bytes {} exceeds the host's pooled slot of {} bytes",
                spec.max_memory_bytes, self.shared.max_memory_bytes
            )));
        }
        if spec.call_deadline.is_zero() {
            return Err(spec_err("call_deadline must be positive".into()));
        }
        if spec.never_waits {
            if spec.grants.http.is_some() {
                return Err(spec_err(
                    "never_waits: a router granted outgoing HTTP waits on the network".into(),
                ));
            }
            if !spec.grants.read_only_dirs.is_empty() {
                return Err(spec_err(
                    "never_waits: a router granted directories waits on file reads".into(),
                ));
            }
        }
        let bytes = std::fs::read(&spec.wasm).map_err(|source| LoadError::Read {
            // The hint is for a bundled router not built yet, not for an
            // operator's own file, nor for a file there but unreadable.
            hint: if source.kind() == std::io::ErrorKind::NotFound
                && spec
                    .wasm
                    .file_stem()
                    .and_then(|s| s.to_str())
                    .is_some_and(|stem| {
                        super::BUNDLED_ROUTERS.contains(&stem)
                            || ["conformance", "netprobe"].contains(&stem)
                    })
            {
                " (run scripts/build-routers to build the bundled routers)"
            } else {
                ""
            },
            router: router.clone(),
            path: spec.wasm.clone(),
            source,
        })?;
        // wasmtime reads what is not a binary as WAT text, so a file that is
        // neither was refused as "input bytes aren't valid utf-8".
        if !bytes.starts_with(b"\0asm") && std::str::from_utf8(&bytes).is_err() {
            return Err(LoadError::Compile {
                router: router.clone(),
                path: spec.wasm.clone(),
                message: "not a WebAssembly component: the file starts with neither the \
                          binary format's `\\0asm` magic nor WAT text"
                    .into(),
            });
        }
        let component = self.compile(bytes).map_err(|e| LoadError::Compile {
            router: router.clone(),
            path: spec.wasm.clone(),
            message: format!("{e:#}"),
        })?;
        let pre = self.check(spec, &component)?;
        // `check` found the interface and the bindings' own check passed,
        // so these exports exist.
        let export = |name: &str| {
            component
                .get_export_index(None, ROUTER_INTERFACE)
                .and_then(|i| component.get_export_index(Some(&i), name))
                .ok_or_else(|| LoadError::Incompatible {
                    router: router.clone(),
                    path: spec.wasm.clone(),
                    problems: vec![format!("`{ROUTER_INTERFACE}` exports no `{name}`")],
                })
        };
        let metered = MeteredExports {
            call_tool: export("call-tool")?,
            read_resource: export("read-resource")?,
            get_prompt: export("get-prompt")?,
            complete: export("complete")?,
        };
        let env: Vec<(String, String)> = spec
            .grants
            .env
            .iter()
            .filter_map(|k| std::env::var(k).ok().map(|v| (k.clone(), v)))
            .collect();
        for dir in &spec.grants.read_only_dirs {
            if !dir.host.is_dir() {
                return Err(LoadError::Grant {
                    router,
                    message: format!("{} is not a directory", dir.host.display()),
                });
            }
        }
        let outbound = match &spec.grants.http {
            Some(grant) => Some(Arc::new(
                Outbound::new(&spec.name, grant, self.shared.tokio.handle().clone()).map_err(
                    |message| LoadError::Grant {
                        router: router.clone(),
                        message,
                    },
                )?,
            )),
            None => None,
        };
        let reports_live = component
            .component_type()
            .imports(&self.shared.engine)
            .any(|(name, _)| name == HOST_CALL_INTERFACE);
        let mut router = Router {
            shared: self.shared.clone(),
            pre,
            metered,
            spec: spec.clone(),
            env,
            outbound,
            reports_live,
            meta: Arc::new(RouterMeta::default()),
            output_rate: super::guest_output::Rate::new(&spec.name),
        };
        let upstream = spec
            .grants
            .vars
            .iter()
            .any(|(k, _)| k == super::UPSTREAM_URL_VAR);
        router.meta = Arc::new(match block_on(router.read_meta()) {
            Ok(meta) => meta,
            // An upstream that connects and then does not answer its
            // listing is not fatal, as one that cannot be reached is not
            // (docs/upstreams.md): the router starts unavailable, serving
            // nothing, and its listing is read again with backoff.
            Err(source @ CallError::DeadlineExceeded(_)) if upstream => RouterMeta {
                name: spec.name.clone(),
                unread: Some(format!("its upstream did not answer the listing: {source}")),
                ..RouterMeta::default()
            },
            Err(source) => {
                return Err(LoadError::Metadata {
                    router: spec.name.clone(),
                    source,
                });
            }
        });
        Ok(Arc::new(router))
    }

    /// Refuses a component that does not export the router interface or
    /// imports what the host does not provide, listing every problem.
    fn check(
        &self,
        spec: &RouterSpec,
        component: &Component,
    ) -> Result<McpRouterPre<StoreState>, LoadError> {
        let engine = &self.shared.engine;
        let ty = component.component_type();
        let mut problems = Vec::new();
        let exports: Vec<&str> = ty.exports(engine).map(|(name, _)| name).collect();
        if !exports.contains(&ROUTER_INTERFACE) {
            problems.push(format!(
                "does not export `{ROUTER_INTERFACE}` (exports: [{}])",
                exports.join(", ")
            ));
        }
        let refused = |problems: Vec<String>| LoadError::Incompatible {
            router: spec.name.clone(),
            path: spec.wasm.clone(),
            problems,
        };
        // The linker names the first import it cannot resolve (e.g.
        // "component imports instance `acme:vault/secrets@1.0.0`, but a
        // matching implementation was not found in the linker").
        let linker = if spec.never_waits {
            &self.shared.linker_sync
        } else if spec.grants.http.is_some() {
            &self.shared.linker_http
        } else {
            &self.shared.linker
        };
        let instance_pre = match linker.instantiate_pre(component) {
            Ok(pre) => Some(pre),
            Err(e) => {
                problems.push(format!("imports what this host does not provide: {e:#}"));
                None
            }
        };
        let Some(instance_pre) = instance_pre.filter(|_| problems.is_empty()) else {
            return Err(refused(problems));
        };
        McpRouterPre::new(instance_pre).map_err(|e| refused(vec![format!("{e:#}")]))
    }
}

impl Drop for WasmHost {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.ticker.take() {
            // The ticker exits within one tick, or at once if parked; a
            // panic there is already logged.
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

/// What a router says about itself, read once at load and shared by all
/// shards. A component's own lists cannot change without a new component;
/// an upstream router's follow its upstream and are re-read
/// ([`Router::reread_meta`]).
#[derive(Debug, Clone, Default)]
pub struct RouterMeta {
    /// `name()`.
    pub name: String,
    /// `title()`.
    pub title: Option<String>,
    /// `instructions()`.
    pub instructions: String,
    /// `describe-server()`.
    pub server: Option<ServerDescription>,
    /// `list-tools()`.
    pub tools: Vec<Tool>,
    /// `list-resources()` of a fresh instance (a stateful router's live list
    /// may differ: see [`super::RouterPool::list_resources`]).
    pub resources: Vec<McpResource>,
    /// `list-prompts()`.
    pub prompts: Vec<Prompt>,
    /// Why the host could not read the rest (an `upstream` router whose
    /// upstream did not answer its listing within the call deadline at
    /// load): it is then unavailable, as one that said so itself.
    pub unread: Option<String>,
}

/// The `describe-server` meta entry by which a router says it cannot serve
/// now (the `upstream` router: its upstream is unreachable); the value is
/// a JSON string, the reason.
pub const UNAVAILABLE_META_KEY: &str = "mcp-broker/unavailable";

/// The `describe-server` meta entry by which the `upstream` router names
/// the MCP revision it speaks with its upstream (a JSON string:
/// `2026-07-28`, or the session's negotiated version).
pub const UPSTREAM_PROTOCOL_META_KEY: &str = "mcp-broker/upstream-protocol";

impl RouterMeta {
    /// The reason this router said it cannot serve, if it did.
    pub fn unavailable(&self) -> Option<String> {
        self.unread
            .clone()
            .or_else(|| self.server_meta(UNAVAILABLE_META_KEY))
    }

    /// The revision an `upstream` router speaks with its upstream, if it
    /// said.
    pub fn upstream_protocol(&self) -> Option<String> {
        self.server_meta(UPSTREAM_PROTOCOL_META_KEY)
    }

    /// A `describe-server` meta entry's string: its JSON string, else its
    /// text.
    fn server_meta(&self, key: &str) -> Option<String> {
        let entry = self
            .server
            .as_ref()?
            .meta
            .as_ref()?
            .iter()
            .find(|e| e.key == key)?;
        Some(serde_json::from_str::<String>(&entry.value).unwrap_or_else(|_| entry.value.clone()))
    }
}

/// Reads a router's metadata again, on one instance kept between reads:
/// the `upstream` router opens an MCP session with its upstream on an
/// instance's first use and cannot close it (the router world has no
/// teardown), so a fresh instance per read would leave one abandoned
/// upstream session per refresh. Uses one pooled slot (the one reserved per
/// router for reading metadata at load).
pub struct MetaReader {
    router: Arc<Router>,
    inst: Option<Instance>,
}

impl std::fmt::Debug for MetaReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetaReader")
            .field("router", &self.router.spec.name)
            .finish_non_exhaustive()
    }
}

impl MetaReader {
    /// Reads the metadata now. Blocks the calling thread for up to the
    /// router's call deadline: call it off the shards. After a fault the
    /// instance is dropped and the next read starts a fresh one.
    pub fn read(&mut self) -> Result<RouterMeta, CallError> {
        let router = self.router.clone();
        let slot = &mut self.inst;
        block_on(async {
            let mut inst = match slot.take() {
                Some(inst) => inst,
                None => router.instantiate().await?,
            };
            let meta = router.read_meta_on(&mut inst).await?;
            inst.settled();
            *slot = Some(inst);
            Ok(meta)
        })
    }
}

/// A loaded router component: compiled once, shared by all shards.
pub struct Router {
    pub(crate) shared: Arc<Shared>,
    pre: McpRouterPre<StoreState>,
    /// The exports whose answers are read under `max_result_bytes`.
    metered: MeteredExports<ComponentExportIndex>,
    pub(crate) spec: RouterSpec,
    env: Vec<(String, String)>,
    /// The `wasi:http` grant with its connection pool, shared by every
    /// store of this router.
    outbound: Option<Arc<Outbound>>,
    /// The component imports `mcp-broker:host/call`: its calls may report
    /// progress and logs while they run.
    reports_live: bool,
    meta: Arc<RouterMeta>,
    /// The allowance of output lines of every instance, when granted
    /// stdio (`guest_output`).
    output_rate: Arc<std::sync::Mutex<super::guest_output::Rate>>,
}

impl std::fmt::Debug for Router {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Router")
            .field("spec", &self.spec)
            .finish_non_exhaustive()
    }
}

/// One live instance: its store and its typed exports.
pub(crate) struct Instance {
    pub(crate) store: Store<StoreState>,
    pub(crate) bindings: McpRouter,
    /// The metered exports, each type-checked against its `metered`
    /// parameter and result types when the instance was made.
    metered: MeteredExports<Func>,
    /// Linked against synchronous imports only
    /// ([`RouterSpec::never_waits`]): the metered exports are called on
    /// the caller's stack, not on a fiber.
    sync: bool,
}

/// The exports called through `metered`'s types: indices in a component,
/// then functions of an instance.
struct MeteredExports<T> {
    call_tool: T,
    read_resource: T,
    get_prompt: T,
    complete: T,
}

impl Router {
    /// The spec it was loaded with.
    pub fn spec(&self) -> &RouterSpec {
        &self.spec
    }

    /// Metadata read at load.
    pub fn meta(&self) -> &Arc<RouterMeta> {
        &self.meta
    }

    /// Whether its calls may report progress and logs while they run
    /// (`mcp-broker:host/call`, `wit/host/host.wit`).
    pub fn reports_live(&self) -> bool {
        self.reports_live
    }

    /// An instance kept for reading this router's metadata again (an
    /// upstream router's listings change with its upstream): see
    /// [`MetaReader`].
    pub fn meta_reader(self: &Arc<Self>) -> MetaReader {
        MetaReader {
            router: self.clone(),
            inst: None,
        }
    }

    /// Outgoing requests this router sent to an origin it was not granted
    /// (refused by the host).
    pub fn outbound_denied(&self) -> u64 {
        self.outbound.as_ref().map_or(0, |o| o.denied())
    }

    /// Upstream requests of abandoned calls that the host cancelled.
    pub fn outbound_cancels(&self) -> u64 {
        self.outbound.as_ref().map_or(0, |o| o.cancels())
    }

    /// The counters behind [`Self::outbound_denied`] and
    /// [`Self::outbound_cancels`] (none without a `wasi:http` grant).
    pub fn outbound_counters(&self) -> Option<Arc<super::OutboundCounters>> {
        self.outbound.as_ref().map(|o| o.counters().clone())
    }

    /// A fresh store with this router's limits, grants and deadline policy.
    fn new_store(&self) -> Result<Store<StoreState>, CallError> {
        let spec = &self.spec;
        let mut wasi = WasiCtx::builder();
        wasi.allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false);
        if spec.grants.stdio_to_stderr {
            // Through the log thread, never a write(2) on the shard.
            let (out, err) = super::guest_output::GuestOutput::pair(&self.output_rate);
            wasi.stdout(out).stderr(err);
        }
        wasi.envs(&self.env);
        wasi.envs(&spec.grants.vars);
        for dir in &spec.grants.read_only_dirs {
            wasi.preopened_dir(&dir.host, &dir.guest, FsPerms::ReadOnly)
                .map_err(|e| {
                    CallError::Instantiate(format!("preopen {}: {e:#}", dir.host.display()))
                })?;
        }
        let limits = Limits {
            inner: StoreLimitsBuilder::new()
                .memory_size(spec.max_memory_bytes)
                .table_elements(spec.max_table_elements)
                .instances(MAX_CORE_INSTANCES_PER_STORE)
                .tables(MAX_TABLES_PER_STORE)
                .memories(MAX_MEMORIES_PER_STORE)
                .build(),
            refused: false,
        };
        let mut store = Store::new(
            &self.shared.engine,
            StoreState {
                wasi: wasi.build(),
                http: WasiHttpCtx::new(),
                hooks: OutboundHooks::new(self.outbound.clone()),
                live: None,
                live_sent: 0,
                table: ResourceTable::new(),
                limits,
                deadline: Instant::now(),
                ticks: 0,
            },
        );
        store.limiter(|s| &mut s.limits);
        let tokio = self.shared.tokio.handle().clone();
        let never_waits = spec.never_waits;
        let run_ticks = self.shared.run_ticks;
        store.epoch_deadline_callback(move |mut ctx| {
            if Instant::now() >= ctx.data().deadline {
                Err(wasmtime::Error::new(DeadlinePassed))
            } else if never_waits {
                // A synchronous call cannot yield: it runs on until it
                // returns, or until it has seen `run_ticks` ticks. Ticks,
                // not the clock: the callback runs only while guest code
                // runs, so a shard thread the kernel preempted does not
                // count the time it was off the CPU against its guest.
                let data = ctx.data_mut();
                data.ticks += 1;
                if data.ticks > run_ticks {
                    Err(wasmtime::Error::new(RunLimit))
                } else {
                    Ok(UpdateDeadline::Continue(1))
                }
            } else if !ticker::ticked_in_this_poll() {
                // The epoch moved while the guest waited in a host call,
                // not while it ran: it has only just resumed.
                Ok(UpdateDeadline::Continue(1))
            } else {
                // Counted for `mcp_router_compute_ticks_total`; no limit.
                let data = ctx.data_mut();
                data.ticks = data.ticks.saturating_add(1);
                // Let the shard run its other tasks, then continue. Not
                // `UpdateDeadline::Yield`: that wakes the task from inside its
                // own poll, and monoio runs a task woken that way again at
                // once (front of its queue), starving every other task.
                let yielding = match THREAD_YIELD.with(Cell::get) {
                    Some(thread_yield) => thread_yield(),
                    None => Box::pin(YieldElsewhere::new(tokio.clone())),
                };
                Ok(UpdateDeadline::YieldCustom(1, yielding))
            }
        });
        Ok(store)
    }

    /// A fresh instance from the shared `InstancePre` (pooled slot, CoW
    /// memory image: microseconds).
    pub(crate) async fn instantiate(&self) -> Result<Instance, CallError> {
        let mut store = self.new_store()?;
        store.data_mut().deadline = Instant::now() + self.spec.call_deadline;
        store.set_epoch_deadline(1);
        let deadline = store.data().deadline;
        let instance = drive(
            &self.shared.tokio,
            deadline,
            self.pre.instance_pre().instantiate_async(&mut store),
        )
        .await
        .map_err(|_| CallError::Instantiate("start function exceeded the deadline".into()))?
        .map_err(|e| {
            let text = format!("{e:#}");
            // A component whose memory starts larger than the router may
            // grow: the key to raise, not only wasmtime's page count.
            if text.contains("exceeds memory limits") {
                CallError::Instantiate(format!(
                    "{text}: raise the router's max_memory_bytes (now {} bytes)",
                    self.spec.max_memory_bytes
                ))
            } else {
                CallError::Instantiate(text)
            }
        })?;
        let failed = |e: wasmtime::Error| CallError::Instantiate(format!("{e:#}"));
        let bindings = McpRouter::new(&mut store, &instance).map_err(|e| {
            CallError::Instantiate(
                mistyped_export(&mut store, &instance).unwrap_or_else(|| format!("{e:#}")),
            )
        })?;
        let idx = &self.metered;
        let mut func = |i: &ComponentExportIndex| {
            instance
                .get_func(&mut store, i)
                .ok_or_else(|| CallError::Instantiate("a router export is missing".into()))
        };
        let metered = MeteredExports {
            call_tool: func(&idx.call_tool)?,
            read_resource: func(&idx.read_resource)?,
            get_prompt: func(&idx.get_prompt)?,
            complete: func(&idx.complete)?,
        };
        // The type checks that make the `Instance` calls sound.
        metered
            .call_tool
            .typed::<CallToolParams<'_>, CallToolResults>(&store)
            .map_err(failed)?;
        metered
            .read_resource
            .typed::<ReadResourceParams<'_>, ReadResourceResults>(&store)
            .map_err(failed)?;
        metered
            .get_prompt
            .typed::<GetPromptParams<'_>, GetPromptResults>(&store)
            .map_err(failed)?;
        metered
            .complete
            .typed::<CompleteParams<'_>, CompleteResults>(&store)
            .map_err(failed)?;
        Ok(Instance {
            store,
            bindings,
            metered,
            sync: self.spec.never_waits,
        })
    }

    async fn read_meta(&self) -> Result<RouterMeta, CallError> {
        let mut inst = self.instantiate().await?;
        let meta = self.read_meta_on(&mut inst).await?;
        // Every request it made was answered: dropping it must not cancel
        // them (an upstream router's outbound hooks cancel what is still
        // pending, and an upstream was sent notifications/cancelled for
        // listings it had answered).
        inst.settled();
        Ok(meta)
    }

    /// The metadata calls on `inst`. An error other than the router's own
    /// answers leaves the instance unusable.
    async fn read_meta_on(&self, inst: &mut Instance) -> Result<RouterMeta, CallError> {
        let deadline = Instant::now() + self.spec.call_deadline;
        inst.begin(deadline);
        let Instance {
            store, bindings, ..
        } = inst;
        let r = bindings.wasix_mcp_router();
        let tokio = &self.shared.tokio;
        let d = self.spec.call_deadline;
        // Each call's result is taken before the next borrows the store.
        macro_rules! call {
            ($method:ident) => {{
                let r = drive(tokio, deadline, r.$method(&mut *store)).await;
                settle(d, store, r)?
            }};
        }
        let name = call!(call_name);
        let title = call!(call_title);
        let instructions = call!(call_instructions);
        let server = call!(call_describe_server);
        let tools = call!(call_list_tools);
        let resources = call!(call_list_resources);
        let prompts = call!(call_list_prompts);
        Ok(RouterMeta {
            name,
            title,
            instructions,
            server: Some(server),
            tools,
            resources,
            prompts,
            unread: None,
        })
    }
}

/// One call of a metered export under a lift budget: on the caller's stack
/// for a `never_waits` router, on a fiber otherwise. A macro, not an
/// `async fn`: another future layer around every call measured 4% dearer
/// (`bench/benches/wasm_call.rs`).
macro_rules! metered_call {
    ($inst:expr, $f:expr, $params:expr, $max:expr) => {
        if $inst.sync {
            metered::with_budget($max, || $f.call(&mut $inst.store, $params))
        } else {
            metered::budgeted($max, $f.call_async(&mut $inst.store, $params)).await
        }
    };
}

impl Instance {
    /// `call-tool`, its answer read out of the guest under a budget of
    /// `max_result_bytes` ([`CallError::ResultTooLarge`] past it, through
    /// [`settle`]).
    pub(crate) async fn call_tool(
        &mut self,
        tool: &str,
        arguments: &str,
        max_result_bytes: usize,
    ) -> wasmtime::Result<Result<w::Response, w::ToolError>> {
        // SAFETY: `instantiate` checked this function with `Func::typed`
        // against exactly these parameter and result types.
        let f = unsafe {
            TypedFunc::<CallToolParams<'_>, CallToolResults>::new_unchecked(self.metered.call_tool)
        };
        let (r,) = metered_call!(self, f, (tool, arguments), max_result_bytes)?;
        Ok(r.map(Into::into).map_err(Into::into))
    }

    /// `read-resource`, metered as [`Self::call_tool`].
    pub(crate) async fn read_resource(
        &mut self,
        uri: &str,
        max_result_bytes: usize,
    ) -> wasmtime::Result<Result<w::ReadResourceResult, w::ResourceError>> {
        // SAFETY: as in `call_tool`, checked by `instantiate`.
        let f = unsafe {
            TypedFunc::<ReadResourceParams<'_>, ReadResourceResults>::new_unchecked(
                self.metered.read_resource,
            )
        };
        let (r,) = metered_call!(self, f, (uri,), max_result_bytes)?;
        Ok(r.map(Into::into).map_err(Into::into))
    }

    /// `get-prompt`, metered as [`Self::call_tool`].
    pub(crate) async fn get_prompt(
        &mut self,
        name: &str,
        max_result_bytes: usize,
    ) -> wasmtime::Result<Result<w::GetPromptResult, w::PromptError>> {
        // SAFETY: as in `call_tool`, checked by `instantiate`.
        let f = unsafe {
            TypedFunc::<GetPromptParams<'_>, GetPromptResults>::new_unchecked(
                self.metered.get_prompt,
            )
        };
        let (r,) = metered_call!(self, f, (name,), max_result_bytes)?;
        Ok(r.map(Into::into).map_err(Into::into))
    }

    /// `complete`, metered as [`Self::call_tool`].
    pub(crate) async fn complete(
        &mut self,
        request: &w::CompletionRequest,
        max_result_bytes: usize,
    ) -> wasmtime::Result<Result<w::CompletionResponse, w::CompletionError>> {
        // SAFETY: as in `call_tool`, checked by `instantiate`.
        let f = unsafe {
            TypedFunc::<CompleteParams<'_>, CompleteResults>::new_unchecked(self.metered.complete)
        };
        let (r,) = metered_call!(self, f, (request,), max_result_bytes)?;
        Ok(r.map(Into::into).map_err(Into::into))
    }

    /// The call ended with an answer (of any kind): the upstream requests
    /// it made need no cancelling.
    pub(crate) fn settled(&mut self) {
        self.store.data_mut().hooks.settled();
    }

    /// Where the next call's progress and logs go while it runs (`None`:
    /// dropped).
    pub(crate) fn set_live(&mut self, live: Option<LiveSink>) {
        let data = self.store.data_mut();
        data.live = live;
        data.live_sent = 0;
    }

    /// Epoch ticks the call since [`Self::begin`] has seen while its guest
    /// code ran (the pool sums them into [`super::PoolStats::compute_ticks`]).
    pub(crate) fn ticks(&self) -> u32 {
        self.store.data().ticks
    }

    /// Arms the store for one call.
    pub(crate) fn begin(&mut self, deadline: Instant) {
        let data = self.store.data_mut();
        data.deadline = deadline;
        data.ticks = 0;
        data.limits.refused = false;
        // Fire the callback at the next tick: it yields or fails the call.
        self.store.set_epoch_deadline(1);
    }
}

/// WASI's clock subscriptions: the only way a component without network
/// or directory grants can wait (a sleep is a subscription polled until it
/// fires).
const CLOCK_SUBSCRIPTIONS: &str = "wasi:clocks/monotonic-clock@0.2.12";

/// The linker of [`RouterSpec::never_waits`] routers: WASI and the broker's
/// host interface, all synchronous, without `wasi:http`. A sleep would block
/// the shard's thread, so the clock's subscriptions trap instead, naming
/// the router's setting.
fn sync_linker(engine: &Engine) -> wasmtime::Result<Linker<StoreState>> {
    let mut linker = Linker::new(engine);
    wasmtime_wasi::p2::add_to_linker_sync(&mut linker)?;
    host_call::add_to_linker::<_, wasmtime::component::HasSelf<StoreState>>(&mut linker, |s| s)?;
    // As in the async linker: data types only, nothing that sends.
    wasmtime_wasi_http::p2::bindings::sync::http::types::add_to_linker::<
        _,
        wasmtime_wasi_http::WasiHttp,
    >(
        &mut linker,
        &wasmtime_wasi_http::p2::bindings::LinkOptions::default().into(),
        StoreState::http,
    )?;
    linker.allow_shadowing(true);
    let mut clock = linker.instance(CLOCK_SUBSCRIPTIONS)?;
    for name in ["subscribe-duration", "subscribe-instant"] {
        clock.func_new(name, |_, _, _, _| Err(wasmtime::Error::new(WaitRefused)))?;
    }
    linker.allow_shadowing(false);
    Ok(linker)
}

/// Which function of the router interface has another type than
/// `wit/mcp-router.wit` gives it, for an instance the bindings refused:
/// their error says what mismatched ("expected `record` found `string`")
/// but not in which of the eleven functions. `None` if none is found
/// mistyped (the bindings' error then stands).
fn mistyped_export(
    store: &mut Store<StoreState>,
    instance: &wasmtime::component::Instance,
) -> Option<String> {
    use super::bindings::types::{
        CompletionError, CompletionRequest, CompletionResponse, GetPromptResult, PromptError,
        ReadResourceResult, ResourceError, Response, ToolError,
    };
    let iface = instance.get_export_index(&mut *store, None, ROUTER_INTERFACE)?;
    macro_rules! check {
        ($name:literal, $params:ty, $results:ty) => {
            if let Some(f) = instance.get_export_index(&mut *store, Some(&iface), $name)
                && let Err(e) = instance.get_typed_func::<$params, $results>(&mut *store, &f)
            {
                return Some(format!(
                    "`{}` of {ROUTER_INTERFACE} does not have the type wit/mcp-router.wit gives it \
                     (was the component built from another version of the WIT?): {e:#}",
                    $name
                ));
            }
        };
    }
    check!("name", (), (String,));
    check!("title", (), (Option<String>,));
    check!("instructions", (), (String,));
    check!("describe-server", (), (ServerDescription,));
    check!("list-tools", (), (Vec<Tool>,));
    check!("call-tool", (&str, &str), (Result<Response, ToolError>,));
    check!("list-resources", (), (Vec<McpResource>,));
    check!(
        "read-resource",
        (&str,),
        (Result<ReadResourceResult, ResourceError>,)
    );
    check!("list-prompts", (), (Vec<Prompt>,));
    check!(
        "get-prompt",
        (&str,),
        (Result<GetPromptResult, PromptError>,)
    );
    check!(
        "complete",
        (CompletionRequest,),
        (Result<CompletionResponse, CompletionError>,)
    );
    None
}

/// [`NEVER_WAITS_MAX_RUN`] in epoch ticks (at least one).
fn run_ticks(tick: Duration) -> u32 {
    let ticks = NEVER_WAITS_MAX_RUN.as_nanos() / tick.as_nanos().max(1);
    u32::try_from(ticks).unwrap_or(u32::MAX).max(1)
}

/// A `never_waits` call ran past [`NEVER_WAITS_MAX_RUN`].
#[derive(Debug)]
struct RunLimit;

impl std::fmt::Display for RunLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "a never_waits call ran past {NEVER_WAITS_MAX_RUN:?}")
    }
}

impl std::error::Error for RunLimit {}

/// A `never_waits` router tried to wait (its fault: it traps).
#[derive(Debug)]
pub(crate) struct WaitRefused;

impl std::fmt::Display for WaitRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the router tried to wait on a clock, but is configured `never_waits`")
    }
}

impl std::error::Error for WaitRefused {}

/// A future a guest's task awaits when it yields at an epoch tick.
pub type GuestYield = Pin<Box<dyn Future<Output = ()> + Send>>;

thread_local! {
    /// How a guest yields on this thread, when its runtime needs more than
    /// [`YieldElsewhere`] (a shard's: `shard::guest_yield`).
    static THREAD_YIELD: Cell<Option<fn() -> GuestYield>> = const { Cell::new(None) };
}

/// Sets how a guest's task yields at an epoch tick on the calling thread
/// (`None`: through the WASI runtime's thread, [`YieldElsewhere`]).
///
/// A shard needs its own: with `DEFER_TASKRUN`, its ring posts the
/// completions of its sockets only when the shard waits in the kernel for
/// a completion. A task woken from another thread does not make the shard
/// wait, so while a guest computed, yielding that way, the shard's other
/// connections were read only when the guest's call ended (20 ms behind a
/// 20 ms guest at every tick length; bench/NOTES.md, "a computing guest
/// held its shard's sockets").
pub fn set_thread_yield(f: Option<fn() -> GuestYield>) {
    THREAD_YIELD.with(|y| y.set(f));
}

/// Pending once; the wake comes from the WASI runtime's thread after the
/// poll has returned, so any executor queues the task behind the others.
struct YieldElsewhere {
    tokio: Option<tokio::runtime::Handle>,
}

impl YieldElsewhere {
    fn new(tokio: tokio::runtime::Handle) -> Self {
        Self { tokio: Some(tokio) }
    }
}

impl Future for YieldElsewhere {
    type Output = ();

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        match self.tokio.take() {
            Some(tokio) => {
                let waker = cx.waker().clone();
                drop(tokio.spawn(async move { waker.wake() }));
                Poll::Pending
            }
            None => Poll::Ready(()),
        }
    }
}

/// Marker error of the epoch callback: the call's deadline passed.
#[derive(Debug)]
struct DeadlinePassed;

impl std::fmt::Display for DeadlinePassed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("call deadline passed")
    }
}

impl std::error::Error for DeadlinePassed {}

/// The host timer fired while the guest was blocked in a host call.
#[derive(Debug)]
pub(crate) struct Elapsed;

/// Turns the outcome of one guest call into the call's result. An `Err`
/// here (other than [`CallError::Instantiate`]) means the instance faulted
/// and must be discarded.
pub(crate) fn settle<T>(
    deadline: Duration,
    store: &Store<StoreState>,
    r: Result<wasmtime::Result<T>, Elapsed>,
) -> Result<T, CallError> {
    let e = match r {
        Ok(Ok(v)) => return Ok(v),
        Ok(Err(e)) => e,
        Err(Elapsed) => return Err(CallError::DeadlineExceeded(deadline)),
    };
    if e.downcast_ref::<DeadlinePassed>().is_some() {
        return Err(CallError::DeadlineExceeded(deadline));
    }
    if e.downcast_ref::<RunLimit>().is_some() {
        return Err(CallError::DeadlineExceeded(NEVER_WAITS_MAX_RUN));
    }
    if e.downcast_ref::<WaitRefused>().is_some() {
        return Err(CallError::Trap(WaitRefused.to_string()));
    }
    if let Some(big) = e.downcast_ref::<metered::ResultTooLarge>() {
        return Err(CallError::ResultTooLarge { limit: big.limit });
    }
    if let Some(trap) = e.downcast_ref::<wasmtime::Trap>() {
        return Err(match trap {
            wasmtime::Trap::StackOverflow => CallError::StackOverflow,
            wasmtime::Trap::Interrupt => CallError::DeadlineExceeded(deadline),
            _ if store.data().limits.refused => CallError::OutOfMemory,
            other => CallError::Trap(other.to_string()),
        });
    }
    if let Some(exit) = e.downcast_ref::<wasmtime_wasi::I32Exit>() {
        return Err(CallError::Trap(format!(
            "guest exited with status {}",
            exit.0
        )));
    }
    Err(CallError::Fault(format!("{e:#}")))
}

/// Polls a guest call with the WASI tokio runtime entered, and fails it with
/// [`Elapsed`] once `deadline` passes while it waits on a host future (the
/// epoch callback only runs while guest code runs).
///
/// The timer is created (and boxed) only after the first `Pending`, so a
/// call that completes in its first poll (the common case) registers no
/// timer. A struct rather than an `async fn`: an `async fn` keeps its
/// argument and the pinned copy of it side by side, and this future is
/// moved into its caller's on every call.
pub(crate) fn drive<F: Future>(
    tokio: &tokio::runtime::Runtime,
    deadline: Instant,
    fut: F,
) -> Drive<'_, F> {
    Drive {
        handle: tokio.handle(),
        deadline,
        fut,
        timer: None,
    }
}

/// The future of [`drive`].
pub(crate) struct Drive<'a, F> {
    handle: &'a tokio::runtime::Handle,
    deadline: Instant,
    /// Structurally pinned: never moved out of once `Drive` is pinned.
    fut: F,
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<F: Future> Future for Drive<'_, F> {
    type Output = Result<F::Output, Elapsed>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // SAFETY: `fut` is pinned with `self` (it is only ever reached through
        // this projection, and `Drive` has no `Drop` that could move it);
        // the other fields are `Unpin`.
        let this = unsafe { self.get_unchecked_mut() };
        let fut = unsafe { Pin::new_unchecked(&mut this.fut) };
        let _entered = this.handle.enter();
        // Guest code runs only inside this poll: the epoch must move.
        let running = ticker::GuestRunning::enter();
        let polled = fut.poll(cx);
        drop(running);
        if let Poll::Ready(v) = polled {
            return Poll::Ready(Ok(v));
        }
        let deadline = this.deadline;
        let timer = this.timer.get_or_insert_with(|| {
            Box::pin(tokio::time::sleep_until(tokio::time::Instant::from_std(
                deadline,
            )))
        });
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(Elapsed)),
            Poll::Pending => Poll::Pending,
        }
    }
}

/// Runs a future to completion on the calling thread (used at load, off the
/// shards). Parks between polls; wakers unpark.
pub(crate) fn block_on<F: Future>(fut: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Arc::new(Unpark(std::thread::current())).into();
    let mut cx = Context::from_waker(&waker);
    let mut fut = pin!(fut);
    loop {
        if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::park();
    }
}

/// Per-store state: WASI context, resource table, limits and the current
/// call's deadline.
pub(crate) struct StoreState {
    wasi: WasiCtx,
    http: WasiHttpCtx,
    hooks: OutboundHooks,
    /// The running call's live events, when its caller listens.
    live: Option<LiveSink>,
    /// Events sent during the running call (bounded per call).
    live_sent: u32,
    table: ResourceTable,
    limits: Limits,
    deadline: Instant,
    /// Epoch ticks the running call has seen while its guest code ran: the
    /// times it yielded its shard, or (`never_waits` routers, bounded by
    /// [`Shared::run_ticks`]) counted towards its run limit.
    ticks: u32,
}

impl WasiView for StoreState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

/// What a running call reported through `mcp-broker:host/call`.
#[derive(Debug, Clone, PartialEq)]
pub enum LiveEvent {
    Progress {
        progress: f64,
        total: Option<f64>,
        message: Option<String>,
    },
    Log {
        level: String,
        logger: Option<String>,
        data: String,
    },
    /// Resource `uri` changed: for its subscribers, not the call's client.
    ResourceUpdated { uri: String },
}

/// Where a call's [`LiveEvent`]s go: the dispatcher on the call's own shard.
pub type LiveSink = futures_channel::mpsc::UnboundedSender<LiveEvent>;

/// Events one call may report; later ones are dropped, so that a router
/// cannot grow the host's memory with notifications.
pub const MAX_LIVE_EVENTS_PER_CALL: u32 = 512;
/// Bytes of one event's strings kept; longer ones are cut.
const MAX_LIVE_EVENT_BYTES: usize = 4 << 10;

fn cut(mut s: String) -> String {
    if s.len() > MAX_LIVE_EVENT_BYTES {
        let mut at = MAX_LIVE_EVENT_BYTES;
        while !s.is_char_boundary(at) {
            at -= 1;
        }
        s.truncate(at);
    }
    s
}

/// A log's `data` (JSON text) bounded as [`cut`] bounds a string, but
/// still JSON: text cut at a byte count is no JSON value, and the edges
/// would pass it on as a string that starts like the value and ends
/// anywhere. Over the bound, the data becomes a JSON string that says so:
/// the first KiB of the text and the size the router logged.
fn cut_json(data: String) -> String {
    if data.len() <= MAX_LIVE_EVENT_BYTES {
        return data;
    }
    let mut at = 1 << 10;
    while !data.is_char_boundary(at) {
        at -= 1;
    }
    let note = format!(
        "{}… [cut: the router logged {} bytes of JSON; at most {MAX_LIVE_EVENT_BYTES} are passed on]",
        &data[..at],
        data.len()
    );
    serde_json::Value::String(note).to_string()
}

impl StoreState {
    fn report(&mut self, event: impl FnOnce() -> LiveEvent) {
        let Some(live) = &self.live else { return };
        if self.live_sent >= MAX_LIVE_EVENTS_PER_CALL {
            return;
        }
        self.live_sent += 1;
        // The receiver gone (the call's caller stopped listening) is not the
        // guest's concern.
        let _ = live.unbounded_send(event());
    }
}

impl host_call::Host for StoreState {
    fn progress(&mut self, progress: f64, total: Option<f64>, message: Option<String>) {
        self.report(|| LiveEvent::Progress {
            progress,
            total,
            message: message.map(cut),
        });
    }

    fn log(&mut self, level: String, logger: Option<String>, data: String) {
        self.report(|| LiveEvent::Log {
            level: cut(level),
            logger: logger.map(cut),
            data: cut_json(data),
        });
    }

    fn cancelled(&mut self) -> bool {
        Instant::now() >= self.deadline
    }

    fn resource_updated(&mut self, uri: String) {
        self.report(|| LiveEvent::ResourceUpdated { uri: cut(uri) });
    }
}

impl WasiHttpView for StoreState {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            ctx: &mut self.http,
            table: &mut self.table,
            hooks: &mut self.hooks,
        }
    }
}

/// [`StoreLimits`] that remembers a refusal, so that the trap that follows
/// (Rust aborts on allocation failure) is reported as out-of-memory.
struct Limits {
    inner: StoreLimits,
    refused: bool,
}

impl ResourceLimiter for Limits {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let ok = self.inner.memory_growing(current, desired, maximum)?;
        self.refused |= !ok;
        Ok(ok)
    }

    fn memory_grow_failed(&mut self, error: wasmtime::Error) -> wasmtime::Result<()> {
        self.refused = true;
        self.inner.memory_grow_failed(error)
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let ok = self.inner.table_growing(current, desired, maximum)?;
        self.refused |= !ok;
        Ok(ok)
    }

    fn instances(&self) -> usize {
        self.inner.instances()
    }

    fn tables(&self) -> usize {
        self.inner.tables()
    }

    fn memories(&self) -> usize {
        self.inner.memories()
    }
}

#[cfg(test)]
mod tests {
    use super::host_call::Host as _;
    use super::*;

    fn state(live: Option<LiveSink>) -> StoreState {
        StoreState {
            wasi: WasiCtx::builder().build(),
            http: WasiHttpCtx::new(),
            hooks: OutboundHooks::new(None),
            live,
            live_sent: 0,
            table: ResourceTable::new(),
            limits: Limits {
                inner: StoreLimitsBuilder::new().build(),
                refused: false,
            },
            deadline: Instant::now() + Duration::from_secs(60),
            ticks: 0,
        }
    }

    #[test]
    fn the_never_waits_run_limit_in_ticks() {
        assert_eq!(run_ticks(Duration::from_millis(1)), 10);
        assert_eq!(run_ticks(Duration::from_micros(500)), 20);
        // A tick longer than the limit still allows one.
        assert_eq!(run_ticks(Duration::from_millis(50)), 1);
        assert_eq!(run_ticks(Duration::ZERO), 10_000_000);
    }

    #[test]
    fn a_call_reports_a_bounded_number_of_bounded_events() {
        let (tx, mut rx) = futures_channel::mpsc::unbounded();
        let mut s = state(Some(tx));
        let long = format!("\"{}\"", "é".repeat(MAX_LIVE_EVENT_BYTES)); // 2 bytes each
        s.log("info".into(), None, long.clone());
        for i in 0..1000 {
            s.progress(f64::from(i), None, None);
        }
        let mut n = 0;
        while let Ok(ev) = rx.try_recv() {
            if let LiveEvent::Log { data, .. } = &ev {
                // Still JSON: a string with the text's head and its size.
                let said: String = serde_json::from_str(data).unwrap();
                assert!(said.starts_with("\"éé"), "{said}");
                assert!(
                    said.ends_with(&format!(
                        "[cut: the router logged {} bytes of JSON; at most 4096 are passed on]",
                        long.len()
                    )),
                    "{said}"
                );
                assert!(data.len() < MAX_LIVE_EVENT_BYTES, "{}", data.len());
            }
            n += 1;
        }
        assert_eq!(n, MAX_LIVE_EVENTS_PER_CALL);
        assert!(!s.cancelled());
        s.deadline = Instant::now();
        assert!(s.cancelled(), "past its deadline the call is given up");
    }

    #[test]
    fn without_a_listener_events_are_dropped() {
        let mut s = state(None);
        s.progress(1.0, Some(2.0), Some("half".into()));
        assert_eq!(s.live_sent, 0);
    }
}
