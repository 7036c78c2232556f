//! `conformance`: the fixtures that the official MCP conformance suite
//! (`@modelcontextprotocol/conformance`, `server` mode) expects of the server
//! under test. Names, texts and schemas follow the suite's own reference
//! server (`examples/servers/typescript/everything-server.ts` of the pinned
//! release) wherever the WIT can say the same thing; `docs/conformance.md`
//! lists each scenario and what it needs.
//!
//! What the router world cannot express, and how this router answers anyway:
//! - **Log notifications** (`test_tool_with_logging`, `test_logging_tool`):
//!   the world has no logging import, so the tool returns its log lines
//!   under the broker's `mcp-broker/log` meta key, which the broker sends as
//!   `notifications/message` before the result (to a request that asked).
//! - **Sampling** (`test_sampling` and the 2026-07-28 fixtures): a router can
//!   ask its client only for an elicitation; the first call returns the
//!   `sampling/createMessage` params under the broker's `mcp-broker/sample`
//!   meta key, and the second call gets the client's answer as `_sampling`.
//! - **Multi round-trip (2026-07-28)**: the broker names an input request
//!   `elicitation` or `sampling` and asks one question at a time, without
//!   `requestState`; a router cannot ask for `roots/list`, nor elicit from a
//!   prompt. The suite's fixtures that need those are absent
//!   (`docs/conformance.md`).
//! - **Closing the SSE stream mid-call** (`test_reconnection`): a transport
//!   matter; the tool simply completes, on the request's stream.
//! - **Progress** (`test_tool_with_progress`): entries are fractions (the
//!   broker sends them with `total: 1`, where the reference server sends
//!   0, 50 and 100 of 100), and they travel with the result (the broker sends
//!   them as `notifications/progress` before it), so the ~50 ms gaps of the
//!   reference server do not exist.
//! - **Prompt arguments** are `{{name}}` placeholders that the broker fills in
//!   text messages only (`routers/README.md`), so the embedded resource of
//!   `test_prompt_with_embedded_resource` has a fixed URI and the argument
//!   appears in the text message that follows it.
//!
//! Elicitation follows the broker's convention: the first call (no
//! `_elicitation` argument) answers `elicit`; the broker relays it to the
//! client as `elicitation/create` and calls the tool again with the client's
//! answer under `"_elicitation": {"action": …, "content": {…}}`. A question
//! may carry the tool's own state (`mcp-broker/state`), which comes back as
//! `_request_state`: the multi-round tools keep their earlier answers there.
//!
//! # Invariants
//! - Stateless: every answer depends on the call's arguments alone (the
//!   state handed back among them), so any instance on any shard answers
//!   alike.

wit_bindgen::generate!({ path: "../../wit", world: "mcp-router" });

use exports::wasix::mcp::router::{
    AudioContent, BlobResourceContents, CompletionError, CompletionRequest, CompletionResponse,
    CompletionsCapability, ContentBlock, ElicitationRequest, EmbeddedResource, GetPromptResult,
    Guest, ImageContent, McpResource, MetaEntry, ProgressNotification, Prompt, PromptArgument,
    PromptError, PromptMessage, PromptMessageContent, PromptMessageRole, PromptsCapability,
    ReadResourceResult, ResourceContents, ResourceError, ResourcesCapability, Response,
    ServerCapabilities, ServerDescription, TextContent, TextResourceContents, Tool, ToolError,
    ToolResult, ToolsCapability,
};
use serde_json::{Value, json};

/// A 1×1 red PNG: the suite's reference image.
const PNG_BASE64: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg==";
/// A minimal WAV file: the suite's reference audio.
const WAV_BASE64: &str = "UklGRiYAAABXQVZFZm10IBAAAAABAAEAQB8AAAB9AAACABAAZGF0YQIAAAA=";

const STATIC_TEXT_URI: &str = "test://static-text";
const STATIC_TEXT: &str = "This is the content of the static text resource.";
const STATIC_BINARY_URI: &str = "test://static-binary";
const WATCHED_URI: &str = "test://watched-resource";
const WATCHED_TEXT: &str = "Watched resource content";
/// A template by the `{var}` convention of `routers/README.md`.
const TEMPLATE: &str = "test://template/{id}/data";
const TEMPLATE_PREFIX: &str = "test://template/";
const TEMPLATE_SUFFIX: &str = "/data";

/// The argument under which the broker hands a tool the client's answer to
/// its elicitation.
const ELICITATION_ARG: &str = "_elicitation";
/// Where the broker puts the client's sampling result on the second call.
const SAMPLING_ARG: &str = "_sampling";
/// The `meta` key under which a question carries the router's own state,
/// and the argument under which the broker hands it back with the answer
/// (in protocol 2026-07-28 through the client, sealed, as `requestState`).
const STATE_META_KEY: &str = "mcp-broker/state";
const STATE_ARG: &str = "_request_state";
/// The `meta` key that names a question's `inputRequests` key (2026-07-28).
const INPUT_KEY_META_KEY: &str = "mcp-broker/input-key";
/// A result's `meta` key asking several questions at once; their answers
/// come back together, by key, under `_inputs`.
const INPUT_REQUESTS_META_KEY: &str = "mcp-broker/input-requests";
const INPUTS_ARG: &str = "_inputs";

/// Values offered by `complete` for the arguments of
/// `test_prompt_with_arguments` (the spec's own example).
const ARG_VALUES: &[&str] = &["paris", "park", "party"];
/// Values offered by `complete` for the template's `id`.
const ID_VALUES: &[&str] = &["1", "2", "3", "123"];

/// Input schema of `json_schema_2020_12_tool`, byte for byte the suite's
/// reference (0.2.0-alpha.12): the broker must pass `$schema`, `$defs` and
/// `additionalProperties` (SEP-1613), and `$anchor`, `allOf`/`anyOf` and
/// `if`/`then`/`else` (SEP-2106) through untouched. The 0.1.16 scenario
/// checks the first three only, so one schema serves both suites.
const JSON_SCHEMA_2020_12: &str = r##"{"$schema":"https://json-schema.org/draft/2020-12/schema","type":"object","$defs":{"address":{"$anchor":"addressDef","type":"object","properties":{"street":{"type":"string"},"city":{"type":"string"}}}},"properties":{"name":{"type":"string"},"address":{"$ref":"#/$defs/address"},"contactMethod":{"type":"string","enum":["phone","email"]},"phone":{"type":"string"},"email":{"type":"string"}},"allOf":[{"anyOf":[{"required":["phone"]},{"required":["email"]}]}],"if":{"properties":{"contactMethod":{"const":"phone"}},"required":["contactMethod"]},"then":{"required":["phone"]},"else":{"required":["email"]},"additionalProperties":false}"##;

const NO_ARGS: &str = r#"{"type":"object","properties":{}}"#;

fn text(t: impl Into<String>) -> ContentBlock {
    ContentBlock::Text(TextContent {
        text: t.into(),
        annotations: None,
    })
}

fn image() -> ContentBlock {
    ContentBlock::Image(ImageContent {
        data: PNG_BASE64.into(),
        mime_type: "image/png".into(),
        annotations: None,
    })
}

fn embedded(uri: &str, mime: &str, data: &str) -> EmbeddedResource {
    EmbeddedResource {
        uri: uri.into(),
        title: None,
        description: None,
        mime_type: Some(mime.into()),
        data: data.into(),
        annotations: None,
    }
}

fn completed(content: Vec<ContentBlock>) -> Response {
    Response::Completed(ToolResult {
        content,
        structured_content: None,
        progress: None,
        meta: None,
        is_error: None,
    })
}

fn failed(message: &str) -> Response {
    Response::Completed(ToolResult {
        content: vec![text(message)],
        structured_content: None,
        progress: None,
        meta: None,
        is_error: Some(true),
    })
}

fn tool(name: &str, description: &str, input_schema: &str) -> Tool {
    Tool {
        name: name.into(),
        title: None,
        description: description.into(),
        input_schema: input_schema.into(),
        output_schema: None,
        annotations: None,
        meta: None,
    }
}

fn resource(uri: &str, name: &str, title: &str, description: &str, mime: &str) -> McpResource {
    McpResource {
        uri: uri.into(),
        name: name.into(),
        title: Some(title.into()),
        description: Some(description.into()),
        mime_type: mime.into(),
        annotations: None,
    }
}

fn message(content: PromptMessageContent) -> PromptMessage {
    PromptMessage {
        role: PromptMessageRole::User,
        content,
    }
}

fn text_message(t: &str) -> PromptMessage {
    message(PromptMessageContent::Text(TextContent {
        text: t.into(),
        annotations: None,
    }))
}

fn prompt_arg(name: &str, description: &str) -> PromptArgument {
    PromptArgument {
        name: name.into(),
        description: Some(description.into()),
        required: Some(true),
    }
}

/// The tool's arguments as a JSON object. A call without arguments (the
/// suite omits them for `test_simple_text`) may reach the router as empty
/// text or `null`; both mean `{}`.
fn parse_args(arguments: &str) -> Result<serde_json::Map<String, Value>, ToolError> {
    if arguments.trim().is_empty() {
        return Ok(serde_json::Map::new());
    }
    match serde_json::from_str::<Value>(arguments) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(Value::Null) => Ok(serde_json::Map::new()),
        Ok(other) => Err(ToolError::InvalidParameters(format!(
            "arguments must be a JSON object, got {other}"
        ))),
        Err(e) => Err(ToolError::InvalidParameters(format!("arguments: {e}"))),
    }
}

/// The client's answer to an elicitation, as `(action, content)`, when the
/// broker has added one; `None` on the first call.
fn elicitation_answer(
    args: &serde_json::Map<String, Value>,
) -> Result<Option<(String, Value)>, ToolError> {
    let Some(answer) = args.get(ELICITATION_ARG) else {
        return Ok(None);
    };
    let action = answer
        .get("action")
        .and_then(Value::as_str)
        .ok_or_else(|| {
            ToolError::InvalidParameters(format!("`{ELICITATION_ARG}.action` (string) is required"))
        })?;
    let content = answer.get("content").cloned().unwrap_or_else(|| json!({}));
    Ok(Some((action.to_owned(), content)))
}

/// The answer to the elicitation the tool asked under `key`, from
/// `_inputs`: where the broker puts it when a 2026-07-28 retry came
/// without the requestState that names the key.
fn input_answer(args: &serde_json::Map<String, Value>, key: &str) -> Option<(String, Value)> {
    let answer = args.get(INPUTS_ARG)?.get(key)?;
    let action = answer.get("action")?.as_str()?;
    let content = answer.get("content").cloned().unwrap_or_else(|| json!({}));
    Some((action.to_owned(), content))
}

/// A result asking the questions of `set` at once
/// (`mcp-broker/input-requests`: key → method and params).
fn ask_set(set: Value) -> Response {
    Response::Completed(ToolResult {
        content: vec![text("input requested")],
        structured_content: None,
        progress: None,
        meta: Some(vec![MetaEntry {
            key: INPUT_REQUESTS_META_KEY.into(),
            value: set.to_string(),
        }]),
        is_error: None,
    })
}

/// First call: ask for `schema`. Second call: `done(action, content)`.
fn elicit_then(
    args: &serde_json::Map<String, Value>,
    message: &str,
    schema: Value,
    done: impl FnOnce(&str, &Value) -> String,
) -> Result<Response, ToolError> {
    match elicitation_answer(args)? {
        None => Ok(Response::Elicit(ElicitationRequest {
            title: None,
            message: message.into(),
            schema: schema.to_string(),
            annotations: None,
            meta: None,
        })),
        Some((action, content)) => Ok(completed(vec![text(done(&action, &content))])),
    }
}

/// A question that carries `state` for the next round (`STATE_META_KEY`).
fn elicit_with_state(message: &str, schema: Value, state: Value) -> Response {
    Response::Elicit(ElicitationRequest {
        title: None,
        message: message.into(),
        schema: schema.to_string(),
        annotations: None,
        meta: Some(vec![MetaEntry {
            key: STATE_META_KEY.into(),
            value: state.to_string(),
        }]),
    })
}

/// The state the previous round attached, with the client's answer to that
/// round's question: both or neither (a first call).
fn answered_state(
    args: &serde_json::Map<String, Value>,
) -> Result<Option<(Value, String, Value)>, ToolError> {
    match (args.get(STATE_ARG), elicitation_answer(args)?) {
        (Some(state), Some((action, content))) => Ok(Some((state.clone(), action, content))),
        _ => Ok(None),
    }
}

fn one_string_schema(name: &str) -> Value {
    json!({"type": "object", "properties": {name: {"type": "string"}}, "required": [name]})
}

fn sep1034_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "description": "User name", "default": "John Doe"},
            "age": {"type": "integer", "description": "User age", "default": 30},
            "score": {"type": "number", "description": "User score", "default": 95.5},
            "status": {
                "type": "string",
                "description": "User status",
                "enum": ["active", "inactive", "pending"],
                "default": "active"
            },
            "verified": {"type": "boolean", "description": "Verification status", "default": true}
        },
        "required": []
    })
}

fn sep1330_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "untitledSingle": {
                "type": "string",
                "description": "Select one option",
                "enum": ["option1", "option2", "option3"]
            },
            "titledSingle": {
                "type": "string",
                "description": "Select one option with titles",
                "oneOf": [
                    {"const": "value1", "title": "First Option"},
                    {"const": "value2", "title": "Second Option"},
                    {"const": "value3", "title": "Third Option"}
                ]
            },
            "legacyEnum": {
                "type": "string",
                "description": "Select one option (legacy)",
                "enum": ["opt1", "opt2", "opt3"],
                "enumNames": ["Option One", "Option Two", "Option Three"]
            },
            "untitledMulti": {
                "type": "array",
                "description": "Select multiple options",
                "minItems": 1,
                "maxItems": 3,
                "items": {"type": "string", "enum": ["option1", "option2", "option3"]}
            },
            "titledMulti": {
                "type": "array",
                "description": "Select multiple options with titles",
                "minItems": 1,
                "maxItems": 3,
                "items": {
                    "anyOf": [
                        {"const": "value1", "title": "First Choice"},
                        {"const": "value2", "title": "Second Choice"},
                        {"const": "value3", "title": "Third Choice"}
                    ]
                }
            }
        },
        "required": []
    })
}

fn completed_text(action: &str, content: &Value) -> String {
    format!("Elicitation completed: action={action}, content={content}")
}

/// Progress is a fraction of the work (the broker sends it with `total: 1`,
/// `docs/http.md`); the message says the reference server's steps of 100.
fn progress(percent: u8) -> ProgressNotification {
    ProgressNotification {
        progress: Some(f32::from(percent) / 100.0),
        message: Some(format!("Completed step {percent} of 100")),
        annotations: None,
    }
}

/// A first call's answer asking the client's model (`sampling/createMessage`
/// with `params`) by the broker's `mcp-broker/sample` meta convention: in a
/// session the broker sends the request and calls again with `_sampling`;
/// in 2026-07-28 it becomes an `InputRequiredResult` (docs/http.md).
fn ask_sampling(params: &Value) -> Response {
    Response::Completed(ToolResult {
        content: vec![text("sampling requested")],
        structured_content: None,
        progress: None,
        meta: Some(vec![MetaEntry {
            key: "mcp-broker/sample".into(),
            value: params.to_string(),
        }]),
        is_error: None,
    })
}

/// Where the broker puts the client's `ListRootsResult` on the second call.
const ROOTS_ARG: &str = "_roots";

/// A result asking for the client's roots (`mcp-broker/roots`), its
/// question named `key` in 2026-07-28.
fn ask_roots(key: &str) -> Response {
    Response::Completed(ToolResult {
        content: vec![text("roots requested")],
        structured_content: None,
        progress: None,
        meta: Some(vec![
            MetaEntry {
                key: "mcp-broker/roots".into(),
                value: "{}".into(),
            },
            MetaEntry {
                key: INPUT_KEY_META_KEY.into(),
                value: json!(key).to_string(),
            },
        ]),
        is_error: None,
    })
}

/// The text of a `CreateMessageResult` the broker handed back as `_sampling`.
fn sampled_text(result: &Value) -> &str {
    result
        .pointer("/content/text")
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// First call: sample with `params`. Second call: `done(the model's text)`.
fn sample_then(
    args: &serde_json::Map<String, Value>,
    params: Value,
    done: impl FnOnce(&str) -> String,
) -> Response {
    match args.get(SAMPLING_ARG) {
        None => ask_sampling(&params),
        Some(result) => completed(vec![text(done(sampled_text(result)))]),
    }
}

/// A result carrying three info log lines under the broker's
/// `mcp-broker/log` meta key (the router world has no logging import).
fn logged(said: &str) -> Response {
    Response::Completed(ToolResult {
        content: vec![text(said)],
        structured_content: None,
        progress: None,
        meta: Some(vec![MetaEntry {
            key: "mcp-broker/log".into(),
            value: r#"[{"level":"info","logger":"conformance","data":"Tool execution started"},{"level":"info","logger":"conformance","data":"Tool processing data"},{"level":"info","logger":"conformance","data":"Tool execution completed"}]"#.into(),
        }]),
        is_error: None,
    })
}

struct Conformance;

impl Guest for Conformance {
    fn name() -> String {
        "conformance".into()
    }

    fn title() -> Option<String> {
        Some("MCP conformance fixtures".into())
    }

    fn instructions() -> String {
        "Fixtures for the official MCP conformance suite (server scenarios): tools test_*, \
         resources test://…, prompts test_*. Not for real clients."
            .into()
    }

    fn describe_server() -> ServerDescription {
        ServerDescription {
            name: Self::name(),
            title: Self::title(),
            capabilities: ServerCapabilities {
                prompts: Some(PromptsCapability {
                    list_changed: Some(false),
                }),
                // The resources never change, so a subscription is accepted
                // and simply never sees an update.
                resources: Some(ResourcesCapability {
                    subscribe: Some(true),
                    list_changed: Some(false),
                }),
                tools: Some(ToolsCapability {
                    list_changed: Some(false),
                }),
                completions: Some(CompletionsCapability { enabled: true }),
            },
            resources: Some(Self::list_resources()),
            resource_metadata: None,
            meta: None,
        }
    }

    fn list_tools() -> Vec<Tool> {
        vec![
            tool(
                "test_simple_text",
                "Tests simple text content response",
                NO_ARGS,
            ),
            tool(
                "test_image_content",
                "Tests image content response",
                NO_ARGS,
            ),
            tool(
                "test_audio_content",
                "Tests audio content response",
                NO_ARGS,
            ),
            tool(
                "test_embedded_resource",
                "Tests embedded resource content response",
                NO_ARGS,
            ),
            tool(
                "test_multiple_content_types",
                "Tests response with multiple content types (text, image, resource)",
                NO_ARGS,
            ),
            tool(
                "test_tool_with_logging",
                "Tests tool that emits log messages during execution (the router world has no \
                 logging import: it emits none)",
                NO_ARGS,
            ),
            tool(
                "test_tool_with_progress",
                "Tests tool that reports progress notifications",
                NO_ARGS,
            ),
            tool(
                "test_error_handling",
                "Tests error response handling",
                NO_ARGS,
            ),
            tool(
                "test_reconnection",
                "Tests SSE stream disconnection and client reconnection (SEP-1699); this router \
                 cannot close the stream, so it simply completes",
                NO_ARGS,
            ),
            tool(
                "test_sampling",
                "Tests server-initiated sampling (through the broker's mcp-broker/sample \
                 convention)",
                r#"{"type":"object","properties":{"prompt":{"type":"string","description":"The prompt to send to the LLM"}},"required":["prompt"]}"#,
            ),
            tool(
                "test_missing_capability",
                "Tests MissingRequiredClientCapabilityError: needs the client's sampling capability",
                NO_ARGS,
            ),
            tool(
                "test_streaming_elicitation",
                "Tests that a call needing input answers with an InputRequiredResult only",
                NO_ARGS,
            ),
            tool(
                "test_logging_tool",
                "Tests that logs are sent only to requests that set a log level",
                NO_ARGS,
            ),
            tool(
                "test_input_required_result_elicitation",
                "Tests InputRequiredResult with an elicitation input request (SEP-2322)",
                NO_ARGS,
            ),
            tool(
                "test_input_required_result_sampling",
                "Tests InputRequiredResult with a sampling input request (SEP-2322)",
                NO_ARGS,
            ),
            tool(
                "test_input_required_result_capabilities",
                "Tests that input requests respect the declared client capabilities (SEP-2322)",
                NO_ARGS,
            ),
            tool(
                "test_input_required_result_list_roots",
                "Asks for the client's roots, then names them (SEP-2322)",
                NO_ARGS,
            ),
            tool(
                "test_input_required_result_multiple_inputs",
                "Asks for a name, a greeting and the client's roots at once (SEP-2322)",
                NO_ARGS,
            ),
            tool(
                "test_input_required_result_request_state",
                "Tests that the question's state comes back with the answer (requestState, SEP-2322)",
                NO_ARGS,
            ),
            tool(
                "test_input_required_result_multi_round",
                "Asks two questions in turn, keeping the first answer in its state (SEP-2322)",
                NO_ARGS,
            ),
            tool(
                "test_input_required_result_tampered_state",
                "Tests that a changed requestState is refused (SEP-2322)",
                NO_ARGS,
            ),
            // SEP-2243 (protocol 2026-07-28): a tool whose arguments a
            // client also sends as `Mcp-Param-*` headers, which the broker
            // validates against the body.
            tool(
                "test_param_header",
                "Tests x-mcp-header: region and count are also sent as Mcp-Param-Region / Mcp-Param-Count",
                r#"{"type":"object","properties":{"region":{"type":"string","x-mcp-header":"Region"},"count":{"type":"integer","x-mcp-header":"Count"}},"required":["region"]}"#,
            ),
            tool(
                "test_elicitation",
                "Tests server-initiated elicitation (user input request)",
                r#"{"type":"object","properties":{"message":{"type":"string","description":"The message to show the user"}},"required":["message"]}"#,
            ),
            tool(
                "test_elicitation_sep1034_defaults",
                "Tests elicitation with default values per SEP-1034",
                NO_ARGS,
            ),
            tool(
                "test_elicitation_sep1330_enums",
                "Tests elicitation with enum schema improvements per SEP-1330",
                NO_ARGS,
            ),
            tool(
                "json_schema_2020_12_tool",
                "Tool with JSON Schema 2020-12 features for conformance testing (SEP-1613)",
                JSON_SCHEMA_2020_12,
            ),
            Tool {
                output_schema: Some(
                    r#"{"type":"object","properties":{"temperature":{"type":"number"},"conditions":{"type":"string"}},"required":["temperature","conditions"]}"#
                        .into(),
                ),
                ..tool(
                    "test_structured_output",
                    "Tests structured content conforming to the output schema",
                    NO_ARGS,
                )
            },
            tool(
                "test_resource_link",
                "Tests resource link content response",
                NO_ARGS,
            ),
        ]
    }

    fn call_tool(tool_name: String, arguments: String) -> Result<Response, ToolError> {
        let args = parse_args(&arguments)?;
        match tool_name.as_str() {
            "test_param_header" => Ok(completed(vec![text(format!(
                "region={}, count={}",
                args.get("region").unwrap_or(&Value::Null),
                args.get("count").unwrap_or(&Value::Null)
            ))])),
            "test_simple_text" => Ok(completed(vec![text(
                "This is a simple text response for testing.",
            )])),
            "test_image_content" => Ok(completed(vec![image()])),
            "test_audio_content" => Ok(completed(vec![ContentBlock::Audio(AudioContent {
                data: WAV_BASE64.into(),
                mime_type: "audio/wav".into(),
                annotations: None,
            })])),
            "test_embedded_resource" => {
                Ok(completed(vec![ContentBlock::EmbeddedResource(embedded(
                    "test://embedded-resource",
                    "text/plain",
                    "This is an embedded resource content.",
                ))]))
            }
            "test_multiple_content_types" => Ok(completed(vec![
                text("Multiple content types test:"),
                image(),
                ContentBlock::EmbeddedResource(embedded(
                    "test://mixed-content-resource",
                    "application/json",
                    r#"{"test":"data","value":123}"#,
                )),
            ])),
            // The router world has no logging import: what the tool logs
            // rides in the result's meta under the broker's key, and the
            // broker sends it as notifications/message before the result.
            "test_tool_with_logging" => Ok(logged("Tool with logging executed successfully")),
            "test_tool_with_progress" => Ok(Response::Completed(ToolResult {
                content: vec![text("Progress reported: 0%, 50% and 100%")],
                structured_content: None,
                progress: Some(vec![progress(0), progress(50), progress(100)]),
                meta: None,
                is_error: None,
            })),
            "test_error_handling" => Ok(failed(
                "This tool intentionally returns an error for testing",
            )),
            "test_reconnection" => Ok(completed(vec![text(
                "Reconnection test completed successfully. If you received this, the client \
                 properly reconnected after stream closure.",
            )])),
            // The router world cannot ask for sampling itself: the first call
            // returns the sampling/createMessage params under the broker's
            // meta key; the broker asks the client and calls again with the
            // client's CreateMessageResult as `_sampling`.
            "test_sampling" => match args.get(SAMPLING_ARG) {
                None => {
                    let prompt = args.get("prompt").and_then(Value::as_str).ok_or_else(|| {
                        ToolError::InvalidParameters("`prompt` (string) is required".into())
                    })?;
                    Ok(ask_sampling(&json!({
                        "messages": [{"role": "user", "content": {"type": "text", "text": prompt}}],
                        "maxTokens": 100
                    })))
                }
                Some(result) => Ok(completed(vec![text(format!(
                    "LLM response: {}",
                    sampled_text(result)
                ))])),
            },
            // Protocol 2026-07-28 (suite 0.2.0-alpha): `server-stateless`
            // calls this without declaring `sampling`, and expects -32021;
            // the broker refuses any sampling request the client did not
            // declare, before it reaches the client.
            "test_missing_capability" => Ok(sample_then(
                &args,
                json!({
                    "messages": [{"role": "user", "content": {"type": "text", "text": "Say hello"}}],
                    "maxTokens": 50
                }),
                |said| format!("LLM response: {said}"),
            )),
            // `server-stateless`: the response stream of a call that needs
            // input holds only the InputRequiredResult, never an independent
            // `elicitation/create` request.
            "test_streaming_elicitation" => elicit_then(
                &args,
                "Please confirm to continue",
                json!({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}),
                completed_text,
            ),
            // `server-stateless`: the logs of a request that carries no
            // `_meta` log level are never sent.
            "test_logging_tool" => Ok(logged("Tool with logging executed successfully")),
            // The `input-required-result-*` scenarios (SEP-2322, MRTR). The
            // question is named `user_name`, as the scenarios ask
            // (`mcp-broker/input-key`); the broker then issues a
            // requestState, which names the key the retry's answer is read
            // under.
            "test_input_required_result_elicitation" => {
                match elicitation_answer(&args)?.or_else(|| input_answer(&args, "user_name")) {
                    None => Ok(Response::Elicit(ElicitationRequest {
                        title: None,
                        message: "What is your name?".into(),
                        schema: one_string_schema("name").to_string(),
                        annotations: None,
                        meta: Some(vec![MetaEntry {
                            key: INPUT_KEY_META_KEY.into(),
                            value: json!("user_name").to_string(),
                        }]),
                    })),
                    Some((action, content)) => Ok(completed(vec![text(
                        match content.get("name").and_then(Value::as_str) {
                            Some(name) if action == "accept" => format!("Hello, {name}!"),
                            _ => format!("No name given: action={action}"),
                        },
                    )])),
                }
            }
            // Three questions at once (`mcp-broker/input-requests`): the
            // answers come back together under `_inputs`; the set is asked
            // again until every one is answered.
            "test_input_required_result_multiple_inputs" => {
                let inputs = args.get(INPUTS_ARG);
                let answer = |k: &str| inputs.and_then(|i| i.get(k));
                match (
                    answer("user_name"),
                    answer("greeting"),
                    answer("client_roots"),
                ) {
                    (Some(name), Some(greeting), Some(roots)) => {
                        let name = name.pointer("/content/name").and_then(Value::as_str);
                        let roots = roots["roots"].as_array().map_or(0, Vec::len);
                        Ok(completed(vec![text(format!(
                            "Hello, {}! Greeting: {}. Roots: {roots}",
                            name.unwrap_or("stranger"),
                            sampled_text(greeting)
                        ))]))
                    }
                    _ => Ok(ask_set(json!({
                        "user_name": {
                            "method": "elicitation/create",
                            "params": {"mode": "form", "message": "What is your name?", "requestedSchema": one_string_schema("name")}
                        },
                        "greeting": {
                            "method": "sampling/createMessage",
                            "params": {
                                "messages": [{"role": "user", "content": {"type": "text", "text": "Generate a greeting"}}],
                                "maxTokens": 50
                            }
                        },
                        "client_roots": {"method": "roots/list", "params": {}}
                    }))),
                }
            }
            // `mcp-broker/roots` asks for the client's roots; they come
            // back as `_roots` (a ListRootsResult).
            "test_input_required_result_list_roots" => match args.get(ROOTS_ARG) {
                None => Ok(ask_roots("client_roots")),
                Some(result) => {
                    let uris: Vec<&str> = result["roots"]
                        .as_array()
                        .map(|a| a.iter().filter_map(|r| r["uri"].as_str()).collect())
                        .unwrap_or_default();
                    Ok(completed(vec![text(format!("Roots: {}", uris.join(", ")))]))
                }
            },
            // The router's state rides the question (`mcp-broker/state`)
            // and comes back with the answer as `_request_state`: in
            // 2026-07-28 the broker seals it into `requestState`, and
            // refuses a changed one before the tool runs.
            "test_input_required_result_request_state"
            | "test_input_required_result_tampered_state" => {
                let state = json!({"asked": tool_name});
                match answered_state(&args)? {
                    Some((got, action, _)) if got == state => {
                        Ok(completed(vec![text(format!("state-ok: action={action}"))]))
                    }
                    _ => Ok(elicit_with_state(
                        "Please confirm to continue",
                        json!({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}),
                        state,
                    )),
                }
            }
            // Nothing is stored between the rounds: the first answer
            // travels in the second question's state.
            "test_input_required_result_multi_round" => match answered_state(&args)? {
                Some((state, _, content)) if state["step"] == 1 => {
                    let name = content.get("name").cloned().unwrap_or(Value::Null);
                    Ok(elicit_with_state(
                        "What is your favourite colour?",
                        one_string_schema("color"),
                        json!({"step": 2, "name": name}),
                    ))
                }
                Some((state, _, content)) if state["step"] == 2 => {
                    let name = state["name"].as_str().unwrap_or("stranger");
                    let color = content
                        .get("color")
                        .and_then(Value::as_str)
                        .unwrap_or("none");
                    Ok(completed(vec![text(format!(
                        "Hello, {name}! Your colour: {color}"
                    ))]))
                }
                _ => Ok(elicit_with_state(
                    "What is your name?",
                    one_string_schema("name"),
                    json!({"step": 1}),
                )),
            },
            "test_input_required_result_sampling" => Ok(sample_then(
                &args,
                json!({
                    "messages": [{"role": "user", "content": {"type": "text", "text": "What is the capital of France?"}}],
                    "maxTokens": 100
                }),
                |said| format!("LLM response: {said}"),
            )),
            // The router does not see the request's client capabilities, so
            // it asks for sampling alone; the broker refuses (-32021) a
            // request the client did not declare, so no undeclared input
            // request ever reaches a client.
            "test_input_required_result_capabilities" => Ok(sample_then(
                &args,
                json!({
                    "messages": [{"role": "user", "content": {"type": "text", "text": "Generate a greeting"}}],
                    "maxTokens": 50
                }),
                |said| format!("LLM response: {said}"),
            )),
            "test_elicitation" => {
                let message = args
                    .get("message")
                    .and_then(Value::as_str)
                    .ok_or_else(|| {
                        ToolError::InvalidParameters("`message` (string) is required".into())
                    })?
                    .to_owned();
                let schema = json!({
                    "type": "object",
                    "properties": {
                        "username": {"type": "string", "description": "User's response"},
                        "email": {"type": "string", "description": "User's email address"}
                    },
                    "required": ["username", "email"]
                });
                elicit_then(&args, &message, schema, |action, content| {
                    format!("User response: action={action}, content={content}")
                })
            }
            "test_elicitation_sep1034_defaults" => elicit_then(
                &args,
                "Please review and update the form fields with defaults",
                sep1034_schema(),
                completed_text,
            ),
            "test_elicitation_sep1330_enums" => elicit_then(
                &args,
                "Please select options from the enum fields",
                sep1330_schema(),
                completed_text,
            ),
            "json_schema_2020_12_tool" => {
                let shown = Value::Object(args);
                Ok(completed(vec![text(format!(
                    "JSON Schema 2020-12 tool called with: {shown}"
                ))]))
            }
            "test_structured_output" => {
                let structured = json!({"temperature": 22.5, "conditions": "Partly cloudy"});
                Ok(Response::Completed(ToolResult {
                    // The text block repeats the structured content, as the
                    // spec asks for clients that read only content.
                    content: vec![text(structured.to_string())],
                    structured_content: Some(structured.to_string()),
                    progress: None,
                    meta: None,
                    is_error: None,
                }))
            }
            "test_resource_link" => Ok(completed(vec![ContentBlock::ResourceLink(
                exports::wasix::mcp::router::ResourceLinkContent {
                    uri: STATIC_TEXT_URI.into(),
                    title: Some("Static Text Resource".into()),
                    description: Some("A static text resource for testing".into()),
                    mime_type: Some("text/plain".into()),
                    annotations: None,
                },
            )])),
            other => Err(ToolError::NotFound(format!("no tool `{other}`"))),
        }
    }

    fn list_resources() -> Vec<McpResource> {
        vec![
            resource(
                STATIC_TEXT_URI,
                "static-text",
                "Static Text Resource",
                "A static text resource for testing",
                "text/plain",
            ),
            resource(
                STATIC_BINARY_URI,
                "static-binary",
                "Static Binary Resource",
                "A static binary resource (image) for testing",
                "image/png",
            ),
            resource(
                WATCHED_URI,
                "watched-resource",
                "Watched Resource",
                "A resource clients may subscribe to (it never changes)",
                "text/plain",
            ),
            resource(
                TEMPLATE,
                "template",
                "Resource Template",
                "A resource template with parameter substitution",
                "application/json",
            ),
        ]
    }

    fn read_resource(uri: String) -> Result<ReadResourceResult, ResourceError> {
        let contents = match uri.as_str() {
            STATIC_TEXT_URI => ResourceContents::Text(TextResourceContents {
                uri,
                mime_type: Some("text/plain".into()),
                text: STATIC_TEXT.into(),
            }),
            STATIC_BINARY_URI => ResourceContents::Blob(BlobResourceContents {
                uri,
                mime_type: Some("image/png".into()),
                blob: PNG_BASE64.into(),
            }),
            WATCHED_URI => ResourceContents::Text(TextResourceContents {
                uri,
                mime_type: Some("text/plain".into()),
                text: WATCHED_TEXT.into(),
            }),
            _ => {
                let id = uri
                    .strip_prefix(TEMPLATE_PREFIX)
                    .and_then(|rest| rest.strip_suffix(TEMPLATE_SUFFIX))
                    .filter(|id| !id.is_empty() && !id.contains('/'))
                    .ok_or_else(|| ResourceError::NotFound(format!("no resource `{uri}`")))?;
                let text = json!({
                    "id": id,
                    "templateTest": true,
                    "data": format!("Data for ID: {id}"),
                })
                .to_string();
                ResourceContents::Text(TextResourceContents {
                    uri,
                    mime_type: Some("application/json".into()),
                    text,
                })
            }
        };
        Ok(ReadResourceResult {
            contents: vec![contents],
        })
    }

    fn list_prompts() -> Vec<Prompt> {
        vec![
            Prompt {
                name: "test_simple_prompt".into(),
                description: Some("A simple prompt without arguments".into()),
                arguments: None,
            },
            Prompt {
                name: "test_prompt_with_arguments".into(),
                description: Some("A prompt with required arguments".into()),
                arguments: Some(vec![
                    prompt_arg("arg1", "First test argument"),
                    prompt_arg("arg2", "Second test argument"),
                ]),
            },
            Prompt {
                name: "test_prompt_with_embedded_resource".into(),
                description: Some("A prompt that includes an embedded resource".into()),
                arguments: Some(vec![prompt_arg(
                    "resourceUri",
                    "URI of the resource to embed",
                )]),
            },
            Prompt {
                name: "test_prompt_with_image".into(),
                description: Some("A prompt that includes image content".into()),
                arguments: None,
            },
        ]
    }

    fn get_prompt(prompt_name: String) -> Result<GetPromptResult, PromptError> {
        let (description, messages) = match prompt_name.as_str() {
            "test_simple_prompt" => (
                "A simple prompt without arguments",
                vec![text_message("This is a simple prompt for testing.")],
            ),
            "test_prompt_with_arguments" => (
                "A prompt with required arguments",
                vec![text_message(
                    "Prompt with arguments: arg1='{{arg1}}', arg2='{{arg2}}'",
                )],
            ),
            // The broker fills placeholders in text only: the resource's URI
            // is fixed (the one the suite passes) and the argument shows in
            // the text.
            "test_prompt_with_embedded_resource" => (
                "A prompt that includes an embedded resource",
                vec![
                    message(PromptMessageContent::McpResource(embedded(
                        "test://example-resource",
                        "text/plain",
                        "Embedded resource content for testing.",
                    ))),
                    text_message("Please process the embedded resource above ({{resourceUri}})."),
                ],
            ),
            "test_prompt_with_image" => (
                "A prompt that includes image content",
                vec![
                    message(PromptMessageContent::Image(ImageContent {
                        data: PNG_BASE64.into(),
                        mime_type: "image/png".into(),
                        annotations: None,
                    })),
                    text_message("Please analyze the image above."),
                ],
            ),
            other => return Err(PromptError::NotFound(format!("no prompt `{other}`"))),
        };
        Ok(GetPromptResult {
            description: Some(description.into()),
            messages,
        })
    }

    fn complete(request: CompletionRequest) -> Result<CompletionResponse, CompletionError> {
        let input: Value = serde_json::from_str(&request.input)
            .map_err(|e| CompletionError::InvalidParameters(format!("input: {e}")))?;
        let field = |path: &[&str]| -> Result<&str, CompletionError> {
            let mut v = &input;
            for p in path {
                v = v.get(p).ok_or_else(|| {
                    CompletionError::InvalidParameters(format!("`{}` is required", path.join(".")))
                })?;
            }
            v.as_str().ok_or_else(|| {
                CompletionError::SchemaError(format!("`{}` must be a string", path.join(".")))
            })
        };
        let ref_type = field(&["ref", "type"])?;
        let arg_name = field(&["argument", "name"])?;
        let prefix = field(&["argument", "value"])?;
        let candidates: &[&str] = match ref_type {
            "ref/prompt" => match (field(&["ref", "name"])?, arg_name) {
                ("test_prompt_with_arguments", "arg1" | "arg2") => ARG_VALUES,
                // Any URI is accepted: nothing to suggest.
                ("test_prompt_with_embedded_resource", "resourceUri") => &[],
                (prompt, _) => {
                    return Err(CompletionError::NotFound(format!(
                        "no prompt `{prompt}` with argument `{arg_name}`"
                    )));
                }
            },
            "ref/resource" => match (field(&["ref", "uri"])?, arg_name) {
                (TEMPLATE, "id") => ID_VALUES,
                (uri, _) => {
                    return Err(CompletionError::NotFound(format!(
                        "no template `{uri}` with variable `{arg_name}`"
                    )));
                }
            },
            other => {
                return Err(CompletionError::InvalidParameters(format!(
                    "unknown ref type `{other}`"
                )));
            }
        };
        Ok(CompletionResponse {
            content: candidates
                .iter()
                .filter(|c| c.starts_with(prefix))
                .map(|c| text(*c))
                .collect(),
            meta: None,
            is_error: None,
        })
    }
}

export!(Conformance);
