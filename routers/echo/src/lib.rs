//! `echo`: the benchmark router.
//!
//! `echo` returns its `arguments` string untouched, as a text block and as
//! structured content, without parsing it: the host-to-guest round trip is
//! what the benchmark measures, not a JSON parser. `echo_text` returns the
//! `text` field of its arguments.
//!
//! # Invariants
//! - Stateless: any instance answers any call identically.
//! - `echo` never parses or rewrites its input.

wit_bindgen::generate!({ path: "../../wit", world: "mcp-router" });

use exports::wasix::mcp::router::{
    CompletionError, CompletionRequest, CompletionResponse, ContentBlock, GetPromptResult, Guest,
    McpResource, Prompt, PromptError, ReadResourceResult, ResourceError, Response,
    ServerCapabilities, ServerDescription, TextContent, Tool, ToolError, ToolResult,
    ToolsCapability,
};

struct Echo;

fn text(text: String) -> ContentBlock {
    ContentBlock::Text(TextContent {
        text,
        annotations: None,
    })
}

impl Guest for Echo {
    fn name() -> String {
        "echo".into()
    }

    fn title() -> Option<String> {
        Some("Echo".into())
    }

    fn instructions() -> String {
        "Call `echo` with any JSON object to get it back unchanged; `echo_text` returns the `text` field.".into()
    }

    fn describe_server() -> ServerDescription {
        ServerDescription {
            name: Self::name(),
            title: Self::title(),
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
        vec![
            Tool {
                name: "echo".into(),
                title: Some("Echo".into()),
                description: "Returns its arguments unchanged, as text and as structured content."
                    .into(),
                input_schema: r#"{"type":"object","additionalProperties":true}"#.into(),
                output_schema: Some(r#"{"type":"object","additionalProperties":true}"#.into()),
                annotations: None,
                meta: None,
            },
            Tool {
                name: "echo_text".into(),
                title: Some("Echo text".into()),
                description: "Returns the `text` argument as a text block.".into(),
                input_schema: r#"{"type":"object","properties":{"text":{"type":"string"}},"required":["text"]}"#.into(),
                output_schema: None,
                annotations: None,
                meta: None,
            },
        ]
    }

    fn call_tool(tool_name: String, arguments: String) -> Result<Response, ToolError> {
        match tool_name.as_str() {
            "echo" => Ok(Response::Completed(ToolResult {
                content: vec![text(arguments.clone())],
                structured_content: Some(arguments),
                progress: None,
                meta: None,
                is_error: None,
            })),
            "echo_text" => {
                let value: serde_json::Value = serde_json::from_str(&arguments)
                    .map_err(|e| ToolError::InvalidParameters(format!("arguments: {e}")))?;
                let Some(t) = value.get("text").and_then(|t| t.as_str()) else {
                    return Err(ToolError::InvalidParameters(
                        "`text` (string) is required".into(),
                    ));
                };
                Ok(Response::Completed(ToolResult {
                    content: vec![text(t.to_owned())],
                    structured_content: None,
                    progress: None,
                    meta: None,
                    is_error: None,
                }))
            }
            other => Err(ToolError::NotFound(format!("no tool `{other}`"))),
        }
    }

    fn list_resources() -> Vec<McpResource> {
        Vec::new()
    }

    fn read_resource(uri: String) -> Result<ReadResourceResult, ResourceError> {
        Err(ResourceError::NotFound(format!(
            "echo has no resource `{uri}`"
        )))
    }

    fn list_prompts() -> Vec<Prompt> {
        Vec::new()
    }

    fn get_prompt(prompt_name: String) -> Result<GetPromptResult, PromptError> {
        Err(PromptError::NotFound(format!(
            "echo has no prompt `{prompt_name}`"
        )))
    }

    fn complete(_request: CompletionRequest) -> Result<CompletionResponse, CompletionError> {
        Err(CompletionError::NotFound(
            "echo offers no completions".into(),
        ))
    }
}

export!(Echo);
