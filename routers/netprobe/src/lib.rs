//! `netprobe`: a test router that sends a GET to any URL it is given, so
//! that the tests can show what the host's `wasi:http` grant allows.
//!
//! Tool `fetch {"url": "http://host:port/path"}` answers `status NNN` or
//! `error: <wasi:http error code>` (e.g. `HttpRequestDenied` when the host
//! refuses an origin it did not grant). It imports `wasi:http`, so the
//! broker loads it only for a router configured with `upstream = URL`
//! (`broker/tests/upstream.rs`); not in the embedded default.

wit_bindgen::generate!({ path: "../../wit", world: "mcp-router" });

use exports::wasix::mcp::router::{
    CompletionError, CompletionRequest, CompletionResponse, ContentBlock, GetPromptResult, Guest,
    McpResource, Prompt, PromptError, ReadResourceResult, ResourceError, Response,
    ServerCapabilities, ServerDescription, TextContent, Tool, ToolError, ToolResult,
    ToolsCapability,
};
use wasi::http::outgoing_handler;
use wasi::http::types::{Fields, Method, OutgoingRequest, Scheme};

struct NetProbe;

/// GETs `url`; the status, or the error code the host gave.
fn fetch(url: &str) -> Result<String, String> {
    let (scheme, rest) = if let Some(r) = url.strip_prefix("http://") {
        (Scheme::Http, r)
    } else if let Some(r) = url.strip_prefix("https://") {
        (Scheme::Https, r)
    } else {
        return Err(format!("`{url}` is not an http(s) URL"));
    };
    let cut = rest.find('/').unwrap_or(rest.len());
    let (authority, path) = rest.split_at(cut);
    let req = OutgoingRequest::new(Fields::new());
    let set = |ok: Result<(), ()>, what: &str| ok.map_err(|()| format!("bad {what}"));
    set(req.set_method(&Method::Get), "method")?;
    set(req.set_scheme(Some(&scheme)), "scheme")?;
    set(req.set_authority(Some(authority)), "authority")?;
    set(
        req.set_path_with_query(Some(if path.is_empty() { "/" } else { path })),
        "path",
    )?;
    let pending = outgoing_handler::handle(req, None).map_err(|e| format!("{e:?}"))?;
    pending.subscribe().block();
    match pending.get() {
        Some(Ok(Ok(resp))) => Ok(format!("status {}", resp.status())),
        Some(Ok(Err(e))) => Err(format!("{e:?}")),
        Some(Err(())) | None => Err("no response".into()),
    }
}

impl Guest for NetProbe {
    fn name() -> String {
        "netprobe".into()
    }

    fn title() -> Option<String> {
        None
    }

    fn instructions() -> String {
        String::new()
    }

    fn describe_server() -> ServerDescription {
        ServerDescription {
            name: Self::name(),
            title: None,
            capabilities: ServerCapabilities {
                prompts: None,
                resources: None,
                tools: Some(ToolsCapability {
                    list_changed: Some(false),
                }),
                completions: None,
            },
            resources: None,
            resource_metadata: None,
            meta: None,
        }
    }

    fn list_tools() -> Vec<Tool> {
        vec![Tool {
            name: "fetch".into(),
            title: None,
            description: "GETs `url` and answers its status or the error code.".into(),
            input_schema:
                r#"{"type":"object","properties":{"url":{"type":"string"}},"required":["url"]}"#
                    .into(),
            output_schema: None,
            annotations: None,
            meta: None,
        }]
    }

    fn call_tool(tool_name: String, arguments: String) -> Result<Response, ToolError> {
        if tool_name != "fetch" {
            return Err(ToolError::NotFound(tool_name));
        }
        let args: serde_json::Value = serde_json::from_str(&arguments)
            .map_err(|e| ToolError::InvalidParameters(e.to_string()))?;
        let url = args["url"]
            .as_str()
            .ok_or_else(|| ToolError::InvalidParameters("`url` must be a string".into()))?;
        let text = match fetch(url) {
            Ok(s) => s,
            Err(e) => format!("error: {e}"),
        };
        Ok(Response::Completed(ToolResult {
            content: vec![ContentBlock::Text(TextContent {
                text,
                annotations: None,
            })],
            structured_content: None,
            progress: None,
            meta: None,
            is_error: None,
        }))
    }

    fn list_resources() -> Vec<McpResource> {
        Vec::new()
    }

    fn read_resource(uri: String) -> Result<ReadResourceResult, ResourceError> {
        Err(ResourceError::NotFound(uri))
    }

    fn list_prompts() -> Vec<Prompt> {
        Vec::new()
    }

    fn get_prompt(prompt_name: String) -> Result<GetPromptResult, PromptError> {
        Err(PromptError::NotFound(prompt_name))
    }

    fn complete(_request: CompletionRequest) -> Result<CompletionResponse, CompletionError> {
        Err(CompletionError::NotFound(
            "netprobe completes nothing".into(),
        ))
    }
}

export!(NetProbe);
