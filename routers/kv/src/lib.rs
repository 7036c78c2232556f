//! `kv`: a key-value store whose state lives in the instance.
//!
//! Tools `put {"key","value"}`, `get {"key"}`, `delete {"key"}` and `list {}`;
//! every key is also a resource `kv://KEY` (JSON text of the stored value).
//! A `put` or a `delete` that removed something tells the broker that
//! `kv://KEY` changed (`mcp-broker:host/call.resource-updated`), which
//! sends `notifications/resources/updated` to the clients subscribed to it;
//! hence `resources.subscribe`.
//!
//! Per-instance state: each instance in a pool has its own linear memory, so
//! each holds its own map. A `put` answered by one instance is invisible to
//! the other instances of the same shard, to other shards, and to the
//! replacement made after a fault (which starts empty). Routers that need a
//! shared view must keep it outside the instance; this one shows the limit.
//!
//! # Invariants
//! - A value is stored as the JSON text it arrived as and returned unchanged.
//! - Keys iterate in byte order (`BTreeMap`), so `list` and `list-resources`
//!   are deterministic.

wit_bindgen::generate!({
    path: ["../../wit", "../../wit/host", "wit"],
    world: "mcp-broker:kv-router/kv",
    with: { "mcp-broker:host/call@0.1.0": generate },
});

use std::cell::RefCell;
use std::collections::BTreeMap;

use exports::wasix::mcp::router::{
    CompletionError, CompletionRequest, CompletionResponse, ContentBlock, GetPromptResult, Guest,
    McpResource, Prompt, PromptError, ReadResourceResult, ResourceContents, ResourceError,
    ResourcesCapability, Response, ServerCapabilities, ServerDescription, TextContent,
    TextResourceContents, Tool, ToolError, ToolResult, ToolsCapability,
};

thread_local! {
    // A component instance is single threaded: the cell is never contended.
    static STORE: RefCell<BTreeMap<String, String>> = const { RefCell::new(BTreeMap::new()) };
}

const URI_PREFIX: &str = "kv://";

struct Kv;

/// Tells the broker that resource `kv://key` changed.
fn updated(key: &str) {
    mcp_broker::host::call::resource_updated(&format!("{URI_PREFIX}{key}"));
}

fn completed(text: String, structured: Option<String>) -> Response {
    Response::Completed(ToolResult {
        content: vec![ContentBlock::Text(TextContent {
            text,
            annotations: None,
        })],
        structured_content: structured,
        progress: None,
        meta: None,
        is_error: None,
    })
}

fn args(arguments: &str) -> Result<serde_json::Map<String, serde_json::Value>, ToolError> {
    match serde_json::from_str::<serde_json::Value>(arguments) {
        Ok(serde_json::Value::Object(map)) => Ok(map),
        Ok(_) => Err(ToolError::InvalidParameters(
            "arguments must be a JSON object".into(),
        )),
        Err(e) => Err(ToolError::InvalidParameters(format!("arguments: {e}"))),
    }
}

fn key(map: &serde_json::Map<String, serde_json::Value>) -> Result<String, ToolError> {
    match map.get("key") {
        Some(serde_json::Value::String(k)) if !k.is_empty() => Ok(k.clone()),
        _ => Err(ToolError::InvalidParameters(
            "`key` (non-empty string) is required".into(),
        )),
    }
}

fn tool(name: &str, description: &str, schema: &str) -> Tool {
    Tool {
        name: name.into(),
        title: None,
        description: description.into(),
        input_schema: schema.into(),
        output_schema: None,
        annotations: None,
        meta: None,
    }
}

impl Guest for Kv {
    fn name() -> String {
        "kv".into()
    }

    fn title() -> Option<String> {
        Some("Key-value store".into())
    }

    fn instructions() -> String {
        "A per-instance key-value store: put/get/delete/list; each key is the resource kv://KEY. \
         State is not shared between instances and is lost when an instance is replaced."
            .into()
    }

    fn describe_server() -> ServerDescription {
        ServerDescription {
            name: Self::name(),
            title: Self::title(),
            capabilities: ServerCapabilities {
                prompts: None,
                resources: Some(ResourcesCapability {
                    subscribe: Some(true),
                    list_changed: Some(false),
                }),
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
        const KEY: &str =
            r#"{"type":"object","properties":{"key":{"type":"string"}},"required":["key"]}"#;
        vec![
            tool(
                "put",
                "Stores `value` (any JSON) under `key`; returns the previous value if any.",
                r#"{"type":"object","properties":{"key":{"type":"string"},"value":{}},"required":["key","value"]}"#,
            ),
            tool("get", "Returns the JSON value stored under `key`.", KEY),
            tool("delete", "Removes `key`; returns the removed value.", KEY),
            tool(
                "list",
                "Returns the stored keys in byte order.",
                r#"{"type":"object"}"#,
            ),
        ]
    }

    fn call_tool(tool_name: String, arguments: String) -> Result<Response, ToolError> {
        match tool_name.as_str() {
            "put" => {
                let map = args(&arguments)?;
                let key = key(&map)?;
                let Some(value) = map.get("value") else {
                    return Err(ToolError::InvalidParameters("`value` is required".into()));
                };
                let value = value.to_string();
                let previous = STORE.with_borrow_mut(|s| s.insert(key.clone(), value));
                updated(&key);
                let structured = serde_json::json!({
                    "key": key,
                    "replaced": previous.is_some(),
                })
                .to_string();
                Ok(completed(format!("stored {key}"), Some(structured)))
            }
            "get" => {
                let key = key(&args(&arguments)?)?;
                match STORE.with_borrow(|s| s.get(&key).cloned()) {
                    Some(value) => Ok(completed(value.clone(), Some(value))),
                    None => Err(ToolError::NotFound(format!("no key `{key}`"))),
                }
            }
            "delete" => {
                let key = key(&args(&arguments)?)?;
                match STORE.with_borrow_mut(|s| s.remove(&key)) {
                    Some(value) => {
                        updated(&key);
                        Ok(completed(value.clone(), Some(value)))
                    }
                    None => Err(ToolError::NotFound(format!("no key `{key}`"))),
                }
            }
            "list" => {
                let keys: Vec<String> = STORE.with_borrow(|s| s.keys().cloned().collect());
                let structured = serde_json::json!({ "keys": keys }).to_string();
                Ok(completed(keys.join("\n"), Some(structured)))
            }
            other => Err(ToolError::NotFound(format!("no tool `{other}`"))),
        }
    }

    fn list_resources() -> Vec<McpResource> {
        STORE.with_borrow(|s| {
            s.keys()
                .map(|k| McpResource {
                    uri: format!("{URI_PREFIX}{k}"),
                    name: k.clone(),
                    title: None,
                    description: None,
                    mime_type: "application/json".into(),
                    annotations: None,
                })
                .collect()
        })
    }

    fn read_resource(uri: String) -> Result<ReadResourceResult, ResourceError> {
        let Some(key) = uri.strip_prefix(URI_PREFIX) else {
            return Err(ResourceError::NotFound(format!("not a kv:// URI: `{uri}`")));
        };
        match STORE.with_borrow(|s| s.get(key).cloned()) {
            Some(text) => Ok(ReadResourceResult {
                contents: vec![ResourceContents::Text(TextResourceContents {
                    uri: uri.clone(),
                    mime_type: Some("application/json".into()),
                    text,
                })],
            }),
            None => Err(ResourceError::NotFound(format!("no key `{key}`"))),
        }
    }

    fn list_prompts() -> Vec<Prompt> {
        Vec::new()
    }

    fn get_prompt(prompt_name: String) -> Result<GetPromptResult, PromptError> {
        Err(PromptError::NotFound(format!(
            "kv has no prompt `{prompt_name}`"
        )))
    }

    fn complete(_request: CompletionRequest) -> Result<CompletionResponse, CompletionError> {
        Err(CompletionError::NotFound("kv offers no completions".into()))
    }
}

export!(Kv);
