//! `tonic-baseline`: the gRPC baseline of `scripts/bench` (issue 8).
//!
//! The simplest thing a user would write instead of the broker's gRPC edge:
//! a plain tonic server for the seed proto (`mcp-proto`) on a tokio
//! multi-thread runtime, whose `CallTool` calls the `echo` router component
//! in-process, the way wasmtime's documentation shows: one `Engine` (pooling
//! allocator, component model), a `Linker` with WASI p2, one shared
//! `InstancePre` (here the `bindgen!` wrapper `McpRouterPre`) and a small
//! pool of instances (store + bindings) reused across calls. The brief's goal
//! is that the broker's gRPC edge reaches at least this server's throughput.
//!
//! What it deliberately lacks, so that it is an honest *lower bound* on what
//! the edge should do: no frames, shards, routing table, session affinity,
//! admission limits, drain, health or reflection; no epoch deadline on guest
//! calls and no per-store memory limits (a simple server would not set them;
//! both only make it faster). It pays what any such server pays: tonic,
//! HTTP/2, prost, the component call, and mimalloc like the broker.
//!
//! ```text
//! tonic-baseline [--listen 127.0.0.1:0] [--threads 1] [--router PATH]
//! ```
//! Prints `tonic-baseline ready grpc=HOST:PORT threads=N` on stdout once the
//! listener is bound and the router is loaded (`scripts/bench` waits for it).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use mcp_proto::v1 as pb;
use mcp_proto::v1::mcp_service_server::{McpService, McpServiceServer};
use tonic::{Request, Response, Status};
use wasmtime::component::{Component, Linker, ResourceTable};
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig, Store};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

// Generated host bindings of the router world, as wasmtime's docs show; every
// export is async so that guest calls run inside tonic's async handlers.
wasmtime::component::bindgen!({
    path: "../wit",
    world: "mcp-router",
    exports: { default: async },
});

use exports::wasix::mcp::router::{ContentBlock, Response as RouterResponse, ToolError};

// The broker runs on mimalloc; the baseline must pay the same allocator.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Pooled instance slots reserved up front. Instances are only created when
/// every pooled one is busy, which the worker count bounds (a call never
/// waits inside `echo`), so a few per thread is plenty.
const MAX_INSTANCES: u32 = 256;

struct Args {
    listen: SocketAddr,
    threads: usize,
    router: PathBuf,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        threads: 1,
        router: mcp_broker::wasm::default_routers_dir().join("echo.wasm"),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--listen" => a.listen = value()?.parse().map_err(|e| format!("--listen: {e}"))?,
            "--threads" => a.threads = value()?.parse().map_err(|e| format!("--threads: {e}"))?,
            "--router" => a.router = value()?.into(),
            other => {
                return Err(format!(
                    "unknown argument {other}; usage: tonic-baseline [--listen ADDR] [--threads N] [--router PATH]"
                ));
            }
        }
    }
    if a.threads == 0 {
        return Err("--threads must be at least 1".into());
    }
    Ok(a)
}

/// Per-store state: the WASI context a `wasm32-wasip2` component's imports
/// need (no capability granted) and its resource table.
struct State {
    wasi: WasiCtx,
    table: ResourceTable,
}

impl WasiView for State {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

/// One live instance of the router.
struct Instance {
    store: Store<State>,
    router: McpRouter,
}

/// The service: the engine's shared `InstancePre` and idle instances.
struct Baseline {
    engine: Engine,
    pre: McpRouterPre<State>,
    /// Idle instances. A mutex held only to push or pop: the simple pool a
    /// user writes first (one store per call would instead pay an
    /// instantiation per call, which is not what the broker is compared to).
    idle: Mutex<Vec<Instance>>,
}

impl Baseline {
    fn load(path: &std::path::Path) -> wasmtime::Result<Self> {
        let mut pool = PoolingAllocationConfig::default();
        pool.total_component_instances(MAX_INSTANCES)
            .total_core_instances(MAX_INSTANCES * 8)
            .total_memories(MAX_INSTANCES)
            .total_tables(MAX_INSTANCES * 4)
            .total_stacks(MAX_INSTANCES)
            // The broker's slot size (HostConfig::max_memory_bytes); the
            // default 4 GiB slots would reserve terabytes of address space.
            .max_memory_size(256 << 20);
        let mut cfg = Config::new();
        // The workspace's wasmtime has the `gc` feature without a collector,
        // which an engine refuses unless GC (and exceptions, built on it) are
        // off; routers need neither (the broker's host does the same).
        cfg.gc_support(false).wasm_exceptions(false);
        cfg.wasm_component_model(true)
            .allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        let engine = Engine::new(&cfg)?;
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker)?;
        let component = Component::from_file(&engine, path)?;
        let pre = McpRouterPre::new(linker.instantiate_pre(&component)?)?;
        Ok(Self {
            engine,
            pre,
            idle: Mutex::new(Vec::new()),
        })
    }

    async fn instantiate(&self) -> wasmtime::Result<Instance> {
        let state = State {
            wasi: WasiCtx::builder().build(),
            table: ResourceTable::new(),
        };
        let mut store = Store::new(&self.engine, state);
        let router = self.pre.instantiate_async(&mut store).await?;
        Ok(Instance { store, router })
    }

    fn take(&self) -> Option<Instance> {
        self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop()
    }

    fn give_back(&self, inst: Instance) {
        self.idle
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(inst);
    }
}

#[tonic::async_trait]
impl McpService for Baseline {
    async fn call_tool(
        &self,
        req: Request<pb::CallToolRequest>,
    ) -> Result<Response<pb::CallToolResult>, Status> {
        let req = req.into_inner();
        // The proto carries the JSON object as bytes; the WIT takes it as a
        // string. Passed through unparsed, as the router parses it anyway.
        let args = match req.arguments {
            Some(bytes) if !bytes.is_empty() => String::from_utf8(bytes)
                .map_err(|_| Status::invalid_argument("arguments are not UTF-8"))?,
            _ => "{}".to_string(),
        };
        let mut inst = match self.take() {
            Some(i) => i,
            None => self.instantiate().await.map_err(|e| {
                Status::resource_exhausted(format!("cannot instantiate the router: {e:#}"))
            })?,
        };
        let r = inst
            .router
            .wasix_mcp_router()
            .call_call_tool(&mut inst.store, &req.name, &args)
            .await;
        // A trapped instance is dropped (its state is unknown), never reused.
        let answer = match r {
            Ok(answer) => {
                self.give_back(inst);
                answer
            }
            Err(e) => return Err(Status::internal(format!("router fault: {e:#}"))),
        };
        match answer {
            Ok(RouterResponse::Completed(tr)) => {
                let mut content: Vec<pb::Content> = tr.content.into_iter().map(content).collect();
                // Structured output as a text block too (MCP's advice), unless
                // a text block already carries it: the broker's edge does the
                // same, so both answer `echo` with one block.
                if let Some(s) = tr.structured_content
                    && !content.iter().any(|c| is_text(c, &s))
                {
                    content.push(text(s));
                }
                Ok(Response::new(pb::CallToolResult {
                    content,
                    is_error: Some(tr.is_error.unwrap_or(false)),
                }))
            }
            // A unary call cannot ask back: the question becomes an error result.
            Ok(RouterResponse::Elicit(e)) => Ok(Response::new(pb::CallToolResult {
                content: vec![text(e.message), text(e.schema)],
                is_error: Some(true),
            })),
            // MCP: a tool's execution error is a result, not a protocol error.
            Err(ToolError::ExecutionError(m)) => Ok(Response::new(pb::CallToolResult {
                content: vec![text(m)],
                is_error: Some(true),
            })),
            Err(ToolError::NotFound(m)) => Err(Status::not_found(m)),
            Err(ToolError::InvalidParameters(m) | ToolError::SchemaError(m)) => {
                Err(Status::invalid_argument(m))
            }
        }
    }

    type SubscribeStream = tonic::codegen::tokio_stream::Empty<Result<pb::Notification, Status>>;

    async fn initialize(
        &self,
        _: Request<pb::InitializeRequest>,
    ) -> Result<Response<pb::InitializeResult>, Status> {
        Err(only_call_tool())
    }
    async fn ping(
        &self,
        _: Request<pb::PingRequest>,
    ) -> Result<Response<pb::PingResponse>, Status> {
        Err(only_call_tool())
    }
    async fn list_tools(
        &self,
        _: Request<pb::ListToolsRequest>,
    ) -> Result<Response<pb::ListToolsResult>, Status> {
        Err(only_call_tool())
    }
    async fn list_resources(
        &self,
        _: Request<pb::ListResourcesRequest>,
    ) -> Result<Response<pb::ListResourcesResult>, Status> {
        Err(only_call_tool())
    }
    async fn list_resource_templates(
        &self,
        _: Request<pb::ListResourceTemplatesRequest>,
    ) -> Result<Response<pb::ListResourceTemplatesResult>, Status> {
        Err(only_call_tool())
    }
    async fn read_resource(
        &self,
        _: Request<pb::ReadResourceRequest>,
    ) -> Result<Response<pb::ReadResourceResult>, Status> {
        Err(only_call_tool())
    }
    async fn list_prompts(
        &self,
        _: Request<pb::ListPromptsRequest>,
    ) -> Result<Response<pb::ListPromptsResult>, Status> {
        Err(only_call_tool())
    }
    async fn get_prompt(
        &self,
        _: Request<pb::GetPromptRequest>,
    ) -> Result<Response<pb::GetPromptResult>, Status> {
        Err(only_call_tool())
    }
    async fn complete(
        &self,
        _: Request<pb::CompleteRequest>,
    ) -> Result<Response<pb::CompleteResult>, Status> {
        Err(only_call_tool())
    }
    async fn subscribe(
        &self,
        _: Request<pb::SubscribeRequest>,
    ) -> Result<Response<Self::SubscribeStream>, Status> {
        Err(only_call_tool())
    }
    async fn set_logging_level(
        &self,
        _: Request<pb::SetLoggingLevelRequest>,
    ) -> Result<Response<pb::SetLoggingLevelResponse>, Status> {
        Err(only_call_tool())
    }
    async fn list_roots(
        &self,
        _: Request<pb::ListRootsRequest>,
    ) -> Result<Response<pb::ListRootsResult>, Status> {
        Err(only_call_tool())
    }
    async fn create_sampling_message(
        &self,
        _: Request<pb::CreateSamplingMessageRequest>,
    ) -> Result<Response<pb::CreateSamplingMessageResult>, Status> {
        Err(only_call_tool())
    }
    async fn elicit(
        &self,
        _: Request<pb::ElicitRequest>,
    ) -> Result<Response<pb::ElicitResult>, Status> {
        Err(only_call_tool())
    }
}

fn only_call_tool() -> Status {
    Status::unimplemented("tonic-baseline serves CallTool only")
}

fn text(text: String) -> pb::Content {
    pb::Content {
        content: Some(pb::content::Content::Text(pb::TextContent { text })),
        annotations: None,
    }
}

fn is_text(c: &pb::Content, s: &str) -> bool {
    matches!(&c.content, Some(pb::content::Content::Text(t)) if t.text == s)
}

/// One WIT content block as proto content (annotations are dropped: `echo`
/// sets none, and the baseline only needs to be correct for it).
fn content(block: ContentBlock) -> pb::Content {
    use pb::content::Content as C;
    let c = match block {
        ContentBlock::Text(t) => C::Text(pb::TextContent { text: t.text }),
        ContentBlock::Image(i) => C::Image(pb::ImageContent {
            data: i.data,
            mime_type: i.mime_type,
        }),
        ContentBlock::Audio(a) => C::Audio(pb::AudioContent {
            data: a.data,
            mime_type: a.mime_type,
        }),
        ContentBlock::ResourceLink(l) => C::Resource(pb::ResourceContent {
            uri: l.uri,
            mime_type: l.mime_type,
            content: None,
        }),
        ContentBlock::EmbeddedResource(r) => C::Resource(pb::ResourceContent {
            uri: r.uri,
            mime_type: r.mime_type,
            content: Some(pb::resource_content::Content::Text(r.data)),
        }),
    };
    pb::Content {
        content: Some(c),
        annotations: None,
    }
}

/// SIGTERM ends the process with `exit(0)`, not the signal's default
/// death: exit handlers run, so a build instrumented for PGO
/// (`-Cprofile-generate`) writes its profile when `scripts/bench` or
/// `bench/build_ab.py` stops it. Called before any other thread exists, so
/// that every thread inherits the blocked signal and only the waiting one
/// takes it.
fn exit_on_sigterm() {
    // SAFETY: plain libc calls on a local signal set; no handler runs in
    // signal context.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        std::thread::spawn(move || {
            let mut signal = 0;
            libc::sigwait(&set, &mut signal);
            std::process::exit(0);
        });
    }
}

fn main() {
    exit_on_sigterm();
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("tonic-baseline: {e}");
            std::process::exit(2);
        }
    };
    let service = match Baseline::load(&args.router) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("tonic-baseline: loading {}: {e:#}", args.router.display());
            std::process::exit(1);
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.threads)
        .enable_all()
        .build()
        .expect("tokio runtime");
    // Bound before the ready line so that port 0 has resolved.
    let listener = std::net::TcpListener::bind(args.listen).expect("bind");
    let addr = listener.local_addr().expect("local addr");
    listener.set_nonblocking(true).expect("nonblocking");
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
        // Nagle off, as the broker's edge sets it.
        let incoming =
            tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
        println!("tonic-baseline ready grpc={addr} threads={}", args.threads);
        let served = tonic::transport::Server::builder()
            .add_service(McpServiceServer::from_arc(Arc::new(service)))
            .serve_with_incoming(incoming)
            .await;
        if let Err(e) = served {
            eprintln!("tonic-baseline: {e}");
            std::process::exit(1);
        }
    });
}
