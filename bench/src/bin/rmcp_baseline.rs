//! rmcp-baseline: the official Rust MCP SDK (`rmcp`) serving the broker's
//! `echo` tools natively over Streamable HTTP, the baseline of the brief's
//! HTTP-edge goal (the broker's HTTP edge ≥ 3× its capacity at SLO).
//!
//! ```text
//! rmcp-baseline [--listen ADDR] [--threads N]
//! ```
//!
//! It serves `/mcp` the way a stock rmcp deployment does
//! (`StreamableHttpService` with its default configuration: sessions for the
//! 2025 revisions, answers on SSE; 2026-07-28 requests statelessly), over
//! hyper's HTTP/1.1 on a tokio runtime of `--threads` workers (default 1; the
//! bench pins the whole process to the server CPUs). Prints
//! `rmcp-baseline ready http=ADDR path=/mcp threads=N` once it accepts.
//!
//! Tools, as the bundled `echo` router (routers/echo/src/lib.rs) answers
//! them: `echo` returns its arguments as a text block (their JSON text) and
//! as `structuredContent`; `echo_text` returns its `text` argument.

use std::net::SocketAddr;
use std::sync::Arc;

use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, JsonObject,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde_json::{Value, json};

#[derive(Clone)]
struct Echo {
    tools: Arc<Vec<Tool>>,
}

fn schema(v: Value) -> Arc<JsonObject> {
    match v {
        Value::Object(o) => Arc::new(o),
        _ => unreachable!("a literal object"),
    }
}

impl Echo {
    fn new() -> Self {
        let tools = vec![
            Tool::new(
                "echo",
                "Returns its arguments, as text and as structured content.",
                schema(json!({"type": "object"})),
            ),
            Tool::new(
                "echo_text",
                "Returns its `text` argument.",
                schema(json!({
                    "type": "object",
                    "properties": {"text": {"type": "string"}},
                    "required": ["text"]
                })),
            ),
        ];
        Self {
            tools: Arc::new(tools),
        }
    }
}

impl ServerHandler for Echo {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        Ok(ListToolsResult::with_all_items(self.tools.to_vec()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let args = request.arguments.unwrap_or_default();
        match &*request.name {
            "echo" => {
                let args = Value::Object(args);
                let mut r = CallToolResult::success(vec![ContentBlock::text(args.to_string())]);
                r.structured_content = Some(args);
                Ok(r.into())
            }
            "echo_text" => match args.get("text").and_then(Value::as_str) {
                Some(t) => Ok(CallToolResult::success(vec![ContentBlock::text(t)]).into()),
                None => Err(McpError::invalid_params(
                    "echo_text needs a string argument `text`",
                    None,
                )),
            },
            other => Err(McpError::invalid_params(
                format!("unknown tool: {other}"),
                None,
            )),
        }
    }
}

struct Args {
    listen: SocketAddr,
    threads: usize,
}

fn args() -> Result<Args, String> {
    let mut a = Args {
        listen: "127.0.0.1:0".parse().expect("literal"),
        threads: 1,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--listen" => a.listen = value()?.parse().map_err(|e| format!("--listen: {e}"))?,
            "--threads" => {
                a.threads = value()?.parse().map_err(|e| format!("--threads: {e}"))?;
                if a.threads == 0 {
                    return Err("--threads must be at least 1".into());
                }
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(a)
}

fn main() {
    let args = match args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("rmcp-baseline: {e}; usage: rmcp-baseline [--listen ADDR] [--threads N]");
            std::process::exit(2);
        }
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.threads)
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(async move {
        let service = StreamableHttpService::new(
            || Ok(Echo::new()),
            Arc::new(LocalSessionManager::default()),
            StreamableHttpServerConfig::default(),
        );
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .unwrap_or_else(|e| {
                eprintln!("rmcp-baseline: bind {}: {e}", args.listen);
                std::process::exit(1);
            });
        let addr = listener.local_addr().expect("bound address");
        println!(
            "rmcp-baseline ready http={addr} path=/mcp threads={}",
            args.threads
        );
        loop {
            let (stream, _) = match listener.accept().await {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("rmcp-baseline: accept: {e}");
                    continue;
                }
            };
            let _ = stream.set_nodelay(true);
            let service = TowerToHyperService::new(service.clone());
            tokio::spawn(async move {
                // Keep-alive HTTP/1.1, as the broker's HTTP edge serves it.
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .http1_only()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
}
