//! MCP JSON (2025-06-18) → the WIT's records, and JSON-RPC errors → the
//! WIT's error variants. Lenient: a missing optional field is `None`, a
//! missing required one gets an empty default, nothing panics.
//!
//! Uses only the generated *export* types (plain Rust data); no import is
//! called, so the unit tests run natively.

use serde_json::{Map, Value};

use crate::exports::wasix::mcp::router::{
    Annotations, AudioContent, BlobResourceContents, CompletionError, CompletionResponse,
    CompletionsCapability, ContentBlock, EmbeddedResource, GetPromptResult, ImageContent,
    McpResource, MetaEntry, ProgressNotification, Prompt, PromptArgument, PromptError,
    PromptMessage, PromptMessageContent, PromptMessageRole, PromptsCapability, ResourceContents,
    ResourceError, ResourceLinkContent, ResourcesCapability, Role, ServerCapabilities, TextContent,
    TextResourceContents, Tool, ToolAnnotations, ToolError, ToolResult, ToolsCapability,
};
use crate::rpc::{Collected, Failure, RpcError};

fn s(v: &Value, key: &str) -> Option<String> {
    v.get(key).and_then(Value::as_str).map(str::to_owned)
}

fn flag(v: &Value, key: &str) -> Option<bool> {
    v.get(key).and_then(Value::as_bool)
}

/// The `_meta` key prefix MCP reserves for itself: such keys belong to the
/// hop between this router and its upstream (2026-07-28 puts the
/// upstream's `serverInfo` in every result's), not to what the broker's
/// client is told, which the broker's own edges write.
const PROTOCOL_META: &str = "io.modelcontextprotocol/";

/// `_meta` object → meta entries (value as JSON text), but MCP's own.
pub fn meta(v: &Value) -> Option<Vec<MetaEntry>> {
    let m = v.get("_meta")?.as_object()?;
    Some(
        m.iter()
            .filter(|(k, _)| !k.starts_with(PROTOCOL_META))
            .map(|(k, v)| MetaEntry {
                key: k.clone(),
                value: v.to_string(),
            })
            .collect(),
    )
}

fn meta_with(v: &Value, extra: Vec<(String, String)>) -> Option<Vec<MetaEntry>> {
    let mut m = meta(v).unwrap_or_default();
    m.extend(
        extra
            .into_iter()
            .map(|(key, value)| MetaEntry { key, value }),
    );
    (!m.is_empty()).then_some(m)
}

pub fn annotations(v: &Value) -> Option<Annotations> {
    let a = v.get("annotations")?;
    let audience = a.get("audience").and_then(Value::as_array).map(|roles| {
        roles
            .iter()
            .filter_map(|r| match r.as_str() {
                Some("user") => Some(Role::User),
                Some("assistant") => Some(Role::Assistant),
                _ => None,
            })
            .collect()
    });
    Some(Annotations {
        audience,
        priority: a.get("priority").and_then(Value::as_f64).map(|p| p as f32),
        timestamp: s(a, "lastModified"),
    })
}

/// A listed tool, or `None` for one without a name or one that must be
/// called as a task (`execution.taskSupport: "required"`, MCP 2025-11-25):
/// the broker does not offer tasks, so every call of it would be refused.
pub fn tool(v: &Value) -> Option<Tool> {
    let name = s(v, "name")?;
    if v.pointer("/execution/taskSupport").and_then(Value::as_str) == Some("required") {
        return None;
    }
    let ann = v.get("annotations");
    let annotations = ann.and_then(|a| {
        let read_only = flag(a, "readOnlyHint");
        let destructive = flag(a, "destructiveHint");
        (read_only.is_some() || destructive.is_some()).then_some(ToolAnnotations {
            read_only,
            destructive,
            streaming: None,
            experimental: None,
        })
    });
    Some(Tool {
        name,
        title: s(v, "title").or_else(|| ann.and_then(|a| s(a, "title"))),
        description: s(v, "description").unwrap_or_default(),
        input_schema: v
            .get("inputSchema")
            .map_or_else(|| r#"{"type":"object"}"#.to_owned(), Value::to_string),
        output_schema: v.get("outputSchema").map(Value::to_string),
        annotations,
        meta: meta(v),
    })
}

/// A resource; with `template`, a resource template whose `uriTemplate`
/// becomes the URI (routers/README.md "Resource templates").
pub fn resource(v: &Value, template: bool) -> Option<McpResource> {
    let uri = s(v, if template { "uriTemplate" } else { "uri" })?;
    Some(McpResource {
        name: s(v, "name").unwrap_or_else(|| uri.clone()),
        uri,
        title: s(v, "title"),
        description: s(v, "description"),
        mime_type: s(v, "mimeType").unwrap_or_default(),
        annotations: annotations(v),
    })
}

pub fn prompt(v: &Value) -> Option<Prompt> {
    let arguments = v.get("arguments").and_then(Value::as_array).map(|args| {
        args.iter()
            .filter_map(|a| {
                Some(PromptArgument {
                    name: s(a, "name")?,
                    description: s(a, "description"),
                    required: flag(a, "required"),
                })
            })
            .collect()
    });
    Some(Prompt {
        name: s(v, "name")?,
        description: s(v, "description"),
        arguments,
    })
}

/// `prompts/get` arguments for a prompt of `prompts/list`: each declared
/// argument set to its `{{name}}` placeholder, which the broker substitutes.
pub fn placeholders(prompt: &Value) -> Map<String, Value> {
    prompt
        .get("arguments")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|a| a.get("name").and_then(Value::as_str))
        .map(|n| (n.to_owned(), Value::String(format!("{{{{{n}}}}}"))))
        .collect()
}

fn embedded(r: &Value) -> EmbeddedResource {
    let mut mime_type = s(r, "mimeType");
    let data = match (s(r, "text"), s(r, "blob")) {
        (Some(t), _) => t,
        (None, Some(b)) => {
            // The WIT has one `data` string; the broker decides text or
            // blob from the MIME type (text/*, *json*, *xml* or none mean
            // text: broker/src/adapt.rs `embedded`), so an untyped blob
            // must say binary.
            if mime_type.is_none() {
                mime_type = Some("application/octet-stream".into());
            }
            b
        }
        (None, None) => String::new(),
    };
    EmbeddedResource {
        uri: s(r, "uri").unwrap_or_default(),
        title: s(r, "title"),
        description: s(r, "description"),
        mime_type,
        data,
        annotations: None,
    }
}

pub fn content_block(v: &Value) -> ContentBlock {
    let text = |t: String| {
        ContentBlock::Text(TextContent {
            text: t,
            annotations: annotations(v),
        })
    };
    match v.get("type").and_then(Value::as_str) {
        Some("text") => text(s(v, "text").unwrap_or_default()),
        Some("image") => ContentBlock::Image(ImageContent {
            data: s(v, "data").unwrap_or_default(),
            mime_type: s(v, "mimeType").unwrap_or_default(),
            annotations: annotations(v),
        }),
        Some("audio") => ContentBlock::Audio(AudioContent {
            data: s(v, "data").unwrap_or_default(),
            mime_type: s(v, "mimeType").unwrap_or_default(),
            annotations: annotations(v),
        }),
        Some("resource_link") => ContentBlock::ResourceLink(ResourceLinkContent {
            uri: s(v, "uri").unwrap_or_default(),
            // The WIT link has no `name`: the title, else the name, shows.
            title: s(v, "title").or_else(|| s(v, "name")),
            description: s(v, "description"),
            mime_type: s(v, "mimeType"),
            annotations: annotations(v),
        }),
        Some("resource") => {
            let mut e = embedded(v.get("resource").unwrap_or(&Value::Null));
            e.annotations = annotations(v);
            ContentBlock::EmbeddedResource(e)
        }
        // A block kind newer than this client: passed on as its JSON text
        // rather than dropped.
        _ => text(v.to_string()),
    }
}

/// A `tools/call` result plus what its stream carried.
pub fn tool_result(v: &Value, c: &Collected) -> ToolResult {
    let content = v
        .get("content")
        .and_then(Value::as_array)
        .map(|a| a.iter().map(content_block).collect())
        .unwrap_or_default();
    let progress = (!c.progress.is_empty()).then(|| {
        c.progress
            .iter()
            .map(|p| ProgressNotification {
                progress: p.progress,
                message: p.message.clone(),
                annotations: None,
            })
            .collect()
    });
    ToolResult {
        content,
        structured_content: v
            .get("structuredContent")
            .filter(|s| !s.is_null())
            .map(Value::to_string),
        progress,
        meta: meta_with(v, c.meta()),
        is_error: flag(v, "isError"),
    }
}

pub fn resource_contents(v: &Value) -> Vec<ResourceContents> {
    let Some(list) = v.get("contents").and_then(Value::as_array) else {
        return Vec::new();
    };
    list.iter()
        .map(|c| {
            let uri = s(c, "uri").unwrap_or_default();
            let mime_type = s(c, "mimeType");
            match (s(c, "text"), s(c, "blob")) {
                (None, Some(blob)) => ResourceContents::Blob(BlobResourceContents {
                    uri,
                    mime_type,
                    blob,
                }),
                (text, _) => ResourceContents::Text(TextResourceContents {
                    uri,
                    mime_type,
                    text: text.unwrap_or_default(),
                }),
            }
        })
        .collect()
}

fn prompt_content(c: &Value) -> PromptMessageContent {
    let text = |t: String| {
        PromptMessageContent::Text(TextContent {
            text: t,
            annotations: annotations(c),
        })
    };
    match c.get("type").and_then(Value::as_str) {
        Some("text") => text(s(c, "text").unwrap_or_default()),
        Some("image") => PromptMessageContent::Image(ImageContent {
            data: s(c, "data").unwrap_or_default(),
            mime_type: s(c, "mimeType").unwrap_or_default(),
            annotations: annotations(c),
        }),
        Some("resource") => {
            let mut e = embedded(c.get("resource").unwrap_or(&Value::Null));
            e.annotations = annotations(c);
            PromptMessageContent::McpResource(e)
        }
        // The WIT prompt content has no audio or link: a link becomes its
        // URI as text, anything else its JSON text.
        Some("resource_link") => text(s(c, "uri").unwrap_or_default()),
        _ => text(c.to_string()),
    }
}

pub fn prompt_result(v: &Value) -> GetPromptResult {
    let messages = v
        .get("messages")
        .and_then(Value::as_array)
        .map(|msgs| {
            msgs.iter()
                .map(|m| PromptMessage {
                    role: match m.get("role").and_then(Value::as_str) {
                        Some("assistant") => PromptMessageRole::Assistant,
                        _ => PromptMessageRole::User,
                    },
                    content: prompt_content(m.get("content").unwrap_or(&Value::Null)),
                })
                .collect()
        })
        .unwrap_or_default();
    GetPromptResult {
        description: s(v, "description"),
        messages,
    }
}

/// The `capabilities` of an `initialize` result.
pub fn capabilities(init: &Value) -> ServerCapabilities {
    let caps = init.get("capabilities").unwrap_or(&Value::Null);
    let cap = |k: &str| caps.get(k).filter(|c| c.is_object());
    ServerCapabilities {
        prompts: cap("prompts").map(|c| PromptsCapability {
            list_changed: flag(c, "listChanged"),
        }),
        resources: cap("resources").map(|c| ResourcesCapability {
            subscribe: flag(c, "subscribe"),
            list_changed: flag(c, "listChanged"),
        }),
        tools: cap("tools").map(|c| ToolsCapability {
            list_changed: flag(c, "listChanged"),
        }),
        completions: cap("completions").map(|_| CompletionsCapability { enabled: true }),
    }
}

/// A `completion/complete` result: one text block per value.
pub fn completion(v: &Value, c: &Collected) -> CompletionResponse {
    let content = v
        .pointer("/completion/values")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(|t| {
            ContentBlock::Text(TextContent {
                text: t.to_owned(),
                annotations: None,
            })
        })
        .collect();
    // The WIT's completion has values only: the upstream's `total` and
    // `hasMore` travel in a meta entry the broker reads (without it, it
    // counts the values and says there are no more, which an upstream
    // holding back values contradicts).
    let mut extra = c.meta();
    let mut counts = serde_json::Map::new();
    if let Some(t) = v.pointer("/completion/total").and_then(Value::as_u64) {
        counts.insert("total".into(), t.into());
    }
    if let Some(m) = v.pointer("/completion/hasMore").and_then(Value::as_bool) {
        counts.insert("hasMore".into(), m.into());
    }
    if !counts.is_empty() {
        extra.push((
            COMPLETION_META_KEY.into(),
            Value::Object(counts).to_string(),
        ));
    }
    CompletionResponse {
        content,
        meta: meta_with(v, extra),
        is_error: None,
    }
}

/// The meta entry of a completion that carries the upstream's `total` and
/// `hasMore` (a JSON object with either): the broker's
/// `adapt::COMPLETION_META_KEY`.
pub const COMPLETION_META_KEY: &str = "mcp-broker/completion";

/// The tool arguments only the broker sets, answering its own conventions
/// (elicitation, sampling, roots, sets of questions, a router's state),
/// which never reach an upstream (docs/http.md).
const RESERVED_ARGUMENTS: [&str; 5] = [
    "_elicitation",
    "_sampling",
    "_roots",
    "_inputs",
    "_request_state",
];

/// The broker's answers to a question the upstream asked (2026-07-28,
/// modern.rs): taken out of the arguments before they are forwarded.
#[derive(Debug, Default, PartialEq)]
pub struct Answers {
    /// `_inputs`: the answers by `inputRequests` key.
    pub inputs: Option<Value>,
    /// `_request_state`: this router's state, holding the upstream's
    /// `requestState`.
    pub state: Option<Value>,
}

/// `call-tool` arguments as forwarded: a JSON object without the broker's
/// reserved arguments ([`RESERVED_ARGUMENTS`]), and the answers among them.
pub fn tool_arguments(arguments: &str) -> Result<(Value, Answers), String> {
    if arguments.trim().is_empty() {
        return Ok((Value::Object(Map::new()), Answers::default()));
    }
    match serde_json::from_str::<Value>(arguments) {
        Ok(Value::Object(mut m)) => {
            let answers = Answers {
                inputs: m.remove(crate::modern::INPUTS_ARG),
                state: m.remove(crate::modern::STATE_ARG),
            };
            for name in RESERVED_ARGUMENTS {
                m.remove(name);
            }
            Ok((Value::Object(m), answers))
        }
        Ok(Value::Null) => Ok((Value::Object(Map::new()), Answers::default())),
        Ok(_) => Err("arguments must be a JSON object".into()),
        Err(e) => Err(format!("arguments are not JSON: {e}")),
    }
}

fn says_not_found(e: &RpcError) -> bool {
    let m = e.message.to_ascii_lowercase();
    m.contains("not found") || m.contains("unknown")
}

pub fn tool_error(f: Failure) -> ToolError {
    match f {
        Failure::Unavailable(m) => ToolError::ExecutionError(m),
        Failure::Rpc(e) if e.code == -32602 => {
            // Several SDKs answer an unknown tool with -32602 "Unknown tool".
            if e.message.to_ascii_lowercase().contains("unknown tool") {
                ToolError::NotFound(e.message)
            } else {
                ToolError::InvalidParameters(e.message)
            }
        }
        Failure::Rpc(e) if e.code == -32601 || says_not_found(&e) => ToolError::NotFound(e.message),
        Failure::Rpc(e) => {
            ToolError::ExecutionError(format!("upstream error {}: {}", e.code, e.message))
        }
    }
}

pub fn resource_error(f: Failure) -> ResourceError {
    match f {
        Failure::Unavailable(m) => ResourceError::ExecutionError(m),
        Failure::Rpc(e) if e.code == -32002 || e.data_uri.is_some() || says_not_found(&e) => {
            ResourceError::NotFound(e.message)
        }
        Failure::Rpc(e) => {
            ResourceError::ExecutionError(format!("upstream error {}: {}", e.code, e.message))
        }
    }
}

pub fn prompt_error(f: Failure) -> PromptError {
    match f {
        Failure::Unavailable(m) => PromptError::InternalError(m),
        Failure::Rpc(e) if e.code == -32602 && !says_not_found(&e) => {
            PromptError::InvalidParameters(e.message)
        }
        Failure::Rpc(e) if e.code == -32601 || e.code == -32602 || says_not_found(&e) => {
            PromptError::NotFound(e.message)
        }
        Failure::Rpc(e) => {
            PromptError::InternalError(format!("upstream error {}: {}", e.code, e.message))
        }
    }
}

pub fn completion_error(f: Failure) -> CompletionError {
    match f {
        Failure::Unavailable(m) => CompletionError::ExecutionError(m),
        Failure::Rpc(e) if e.code == -32602 && !says_not_found(&e) => {
            CompletionError::InvalidParameters(e.message)
        }
        Failure::Rpc(e) if e.code == -32601 || e.code == -32602 || says_not_found(&e) => {
            CompletionError::NotFound(e.message)
        }
        Failure::Rpc(e) => {
            CompletionError::ExecutionError(format!("upstream error {}: {}", e.code, e.message))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rpc::Progress;
    use serde_json::json;

    #[test]
    fn tool_mapping() {
        let t = tool(&json!({
            "name": "add", "title": "Add",
            "inputSchema": {"type":"object","properties":{"a":{"type":"number"}}},
            "outputSchema": {"type":"object"},
            "annotations": {"readOnlyHint": true, "title": "ignored"},
            "_meta": {"x": [1]}
        }))
        .unwrap();
        assert_eq!(t.name, "add");
        assert_eq!(t.title.as_deref(), Some("Add"));
        assert_eq!(t.description, "");
        let schema: Value = serde_json::from_str(&t.input_schema).unwrap();
        assert_eq!(schema["properties"]["a"]["type"], "number");
        assert_eq!(t.output_schema.as_deref(), Some(r#"{"type":"object"}"#));
        let a = t.annotations.unwrap();
        assert_eq!((a.read_only, a.destructive), (Some(true), None));
        let m = t.meta.unwrap();
        assert_eq!((m[0].key.as_str(), m[0].value.as_str()), ("x", "[1]"));
        let bare = tool(&json!({"name":"b","annotations":{"title":"B"}})).unwrap();
        assert_eq!(bare.title.as_deref(), Some("B"));
        assert!(bare.annotations.is_none());
        assert_eq!(bare.input_schema, r#"{"type":"object"}"#);
        assert!(tool(&json!({"title":"no name"})).is_none());
        let task = |support: &str| json!({"name":"t","execution":{"taskSupport":support}});
        assert!(tool(&task("required")).is_none());
        assert!(tool(&task("optional")).is_some());
        assert!(tool(&task("forbidden")).is_some());
    }

    /// Numbers pass through as written (serde_json's arbitrary_precision):
    /// integers past u64, or past what an f64 holds exactly, came back as
    /// floats (123456789012345678901 as 1.2345678901234567e+20).
    #[test]
    fn big_integers_in_arguments_are_kept_as_written() {
        let args = r#"{"big":123456789012345678901,"neg":-98765432109876543210,"f":0.1}"#;
        let (v, _) = tool_arguments(args).unwrap();
        let out = serde_json::to_string(&v).unwrap();
        for n in ["123456789012345678901", "-98765432109876543210", "0.1"] {
            assert!(out.contains(n), "{out}");
        }
    }

    #[test]
    fn resources_and_templates() {
        let r = resource(&json!({"uri":"file:///a","name":"a"}), false).unwrap();
        assert_eq!((r.uri.as_str(), r.mime_type.as_str()), ("file:///a", ""));
        let t = resource(
            &json!({"uriTemplate":"db://rows/{id}","name":"row","mimeType":"application/json",
                    "annotations":{"audience":["user","robot"],"priority":0.5}}),
            true,
        )
        .unwrap();
        assert_eq!(t.uri, "db://rows/{id}");
        assert_eq!(t.mime_type, "application/json");
        let a = t.annotations.unwrap();
        assert_eq!(a.audience.unwrap().len(), 1);
        assert_eq!(a.priority, Some(0.5));
    }

    #[test]
    fn prompt_placeholders() {
        let p =
            json!({"name":"greet","arguments":[{"name":"who","required":true},{"name":"tone"}]});
        let args = placeholders(&p);
        assert_eq!(
            Value::Object(args),
            json!({"who":"{{who}}","tone":"{{tone}}"})
        );
        assert!(placeholders(&json!({"name":"none"})).is_empty());
        let mapped = prompt(&p).unwrap();
        assert_eq!(mapped.arguments.unwrap()[0].required, Some(true));
    }

    #[test]
    fn tool_result_mapping() {
        let c = Collected {
            progress: vec![Progress {
                progress: Some(0.5),
                message: None,
            }],
            logs: vec![json!({"level":"info","data":"x"})],
            list_changed: vec!["tools"],
            refuse: vec![],
            pong: vec![],
            ..Collected::default()
        };
        let r = tool_result(
            &json!({
                "content": [
                    {"type":"text","text":"hi"},
                    {"type":"image","data":"AAA=","mimeType":"image/png"},
                    {"type":"audio","data":"UklG","mimeType":"audio/wav"},
                    {"type":"resource_link","uri":"x://1","name":"one"},
                    {"type":"resource","resource":{"uri":"x://t","mimeType":"text/plain","text":"body"}},
                    {"type":"resource","resource":{"uri":"x://b","blob":"AQI="}},
                    {"type":"hologram","z":1}
                ],
                "structuredContent": {"n": 1},
                "isError": true,
                "_meta": {"trace": "t1", "io.modelcontextprotocol/serverInfo": {"name": "up"}}
            }),
            &c,
        );
        assert_eq!(r.content.len(), 7);
        assert!(matches!(&r.content[0], ContentBlock::Text(t) if t.text == "hi"));
        assert!(matches!(&r.content[1], ContentBlock::Image(i) if i.mime_type == "image/png"));
        assert!(matches!(&r.content[2], ContentBlock::Audio(_)));
        assert!(
            matches!(&r.content[3], ContentBlock::ResourceLink(l) if l.title.as_deref() == Some("one"))
        );
        assert!(matches!(&r.content[4], ContentBlock::EmbeddedResource(e) if e.data == "body"));
        assert!(matches!(&r.content[5], ContentBlock::EmbeddedResource(e)
            if e.data == "AQI=" && e.mime_type.as_deref() == Some("application/octet-stream")));
        assert!(matches!(&r.content[6], ContentBlock::Text(t) if t.text.contains("hologram")));
        assert_eq!(r.structured_content.as_deref(), Some(r#"{"n":1}"#));
        assert_eq!(r.is_error, Some(true));
        assert_eq!(r.progress.unwrap()[0].progress, Some(0.5));
        let keys: Vec<_> = r.meta.unwrap().into_iter().map(|m| m.key).collect();
        assert_eq!(keys, ["trace", "mcp-broker/log", "mcp-broker/list-changed"]);
        let empty = tool_result(&json!({}), &Collected::default());
        assert!(empty.content.is_empty() && empty.meta.is_none() && empty.progress.is_none());
    }

    #[test]
    fn read_and_prompt_results() {
        let c = resource_contents(&json!({"contents":[
            {"uri":"a","text":"t","mimeType":"text/plain"},{"uri":"b","blob":"AA=="}]}));
        assert!(matches!(&c[0], ResourceContents::Text(t) if t.text == "t"));
        assert!(matches!(&c[1], ResourceContents::Blob(b) if b.blob == "AA=="));
        let p = prompt_result(&json!({"description":"d","messages":[
            {"role":"user","content":{"type":"text","text":"Hi {{who}}"}},
            {"role":"assistant","content":{"type":"resource","resource":{"uri":"u","text":"x"}}}]}));
        assert_eq!(p.messages.len(), 2);
        assert!(
            matches!(&p.messages[0].content, PromptMessageContent::Text(t) if t.text == "Hi {{who}}")
        );
        assert!(matches!(p.messages[1].role, PromptMessageRole::Assistant));
    }

    #[test]
    fn capabilities_and_completion() {
        let caps = capabilities(&json!({"capabilities":{
            "tools":{"listChanged":true},"resources":{"subscribe":true},"completions":{}}}));
        assert_eq!(caps.tools.unwrap().list_changed, Some(true));
        assert_eq!(caps.resources.unwrap().subscribe, Some(true));
        assert!(caps.prompts.is_none());
        assert!(caps.completions.unwrap().enabled);
        let r = completion(
            &json!({"completion":{"values":["a","b"],"total":12,"hasMore":true}}),
            &Collected::default(),
        );
        assert_eq!(r.content.len(), 2);
        // The upstream's counts go to the broker, which said 2 and no more.
        let counts = r.meta.unwrap();
        let e = counts
            .iter()
            .find(|e| e.key == COMPLETION_META_KEY)
            .unwrap();
        assert_eq!(e.value, r#"{"hasMore":true,"total":12}"#);
        let r = completion(
            &json!({"completion":{"values":["a"]}}),
            &Collected::default(),
        );
        assert!(r.meta.is_none(), "no counts given, none passed on");
    }

    #[test]
    fn reserved_arguments_stripped() {
        let (v, answers) = tool_arguments(
            r#"{"a":1,"_elicitation":{},"_sampling":{},"_roots":{},"_inputs":{"k":{}},"_request_state":1,"_other":2}"#,
        )
        .unwrap();
        assert_eq!(v, json!({"a":1,"_other":2}));
        assert_eq!(
            answers,
            Answers {
                inputs: Some(json!({"k":{}})),
                state: Some(json!(1))
            }
        );
        assert_eq!(tool_arguments("").unwrap(), (json!({}), Answers::default()));
        assert!(tool_arguments("[1]").is_err());
        assert!(tool_arguments("{").is_err());
    }

    #[test]
    fn error_mapping() {
        let rpc = |code, m: &str| {
            Failure::Rpc(RpcError {
                code,
                message: m.into(),
                data_uri: None,
            })
        };
        assert!(matches!(
            tool_error(rpc(-32602, "bad a")),
            ToolError::InvalidParameters(_)
        ));
        assert!(matches!(
            tool_error(rpc(-32602, "Unknown tool: x")),
            ToolError::NotFound(_)
        ));
        assert!(matches!(
            tool_error(rpc(-32601, "nope")),
            ToolError::NotFound(_)
        ));
        assert!(
            matches!(tool_error(rpc(-32000, "boom")), ToolError::ExecutionError(m) if m == "upstream error -32000: boom")
        );
        let down = Failure::Unavailable("upstream unavailable: tools/call to u: x".into());
        assert!(
            matches!(tool_error(down.clone()), ToolError::ExecutionError(m) if m.starts_with("upstream unavailable: "))
        );
        assert!(matches!(
            resource_error(rpc(-32002, "gone")),
            ResourceError::NotFound(_)
        ));
        assert!(matches!(
            resource_error(rpc(-32603, "Resource not found")),
            ResourceError::NotFound(_)
        ));
        assert!(matches!(
            resource_error(rpc(-32603, "disk")),
            ResourceError::ExecutionError(_)
        ));
        // 2026-07-28 (SEP-2164): an unknown resource is -32602 naming it
        // in `data.uri`, whatever the message says.
        let unknown = Failure::Rpc(RpcError {
            code: -32602,
            message: "no resource `test://x`".into(),
            data_uri: Some("test://x".into()),
        });
        assert!(matches!(
            resource_error(unknown),
            ResourceError::NotFound(_)
        ));
        assert!(matches!(
            resource_error(rpc(-32602, "bad uri")),
            ResourceError::ExecutionError(_)
        ));
        assert!(matches!(
            resource_error(down.clone()),
            ResourceError::ExecutionError(_)
        ));
        assert!(matches!(
            prompt_error(rpc(-32602, "Prompt x not found")),
            PromptError::NotFound(_)
        ));
        assert!(matches!(
            prompt_error(rpc(-32602, "missing who")),
            PromptError::InvalidParameters(_)
        ));
        assert!(matches!(prompt_error(down), PromptError::InternalError(_)));
        assert!(matches!(
            completion_error(rpc(-32601, "no")),
            CompletionError::NotFound(_)
        ));
    }
}

#[cfg(test)]
mod props {
    use super::*;
    use crate::arb;
    use proptest::prelude::*;
    use serde_json::json;

    /// JSON text as the broker reads it back.
    fn parsed(text: &str) -> Value {
        serde_json::from_str(text).expect("JSON text")
    }

    /// The `_meta` entries a record keeps: all but MCP's own, values as
    /// they were.
    fn kept_meta(v: &Value) -> Vec<(String, Value)> {
        v.get("_meta")
            .and_then(Value::as_object)
            .map(|m| {
                m.iter()
                    .filter(|(k, _)| !k.starts_with(PROTOCOL_META))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect()
            })
            .unwrap_or_default()
    }

    fn entries(m: Option<Vec<MetaEntry>>) -> Vec<(String, Value)> {
        m.unwrap_or_default()
            .into_iter()
            .map(|e| (e.key, parsed(&e.value)))
            .collect()
    }

    fn text_of(v: &Value, key: &str) -> String {
        v.get(key)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    }

    /// Which WIT block a content block's `type` makes.
    fn kind(b: &ContentBlock) -> &'static str {
        match b {
            ContentBlock::Text(_) => "text",
            ContentBlock::Image(_) => "image",
            ContentBlock::Audio(_) => "audio",
            ContentBlock::ResourceLink(_) => "resource_link",
            ContentBlock::EmbeddedResource(_) => "resource",
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// A listed tool: dropped only without a name or when it must run
        /// as a task; else its name, description, schemas (as JSON text,
        /// numbers as written) and `_meta` but MCP's own come through as
        /// they were.
        #[test]
        fn tools_keep_what_they_said(v in arb::or_any(arb::tool())) {
            let listed = tool(&v);
            let named = v.get("name").is_some_and(Value::is_string);
            let task = v.pointer("/execution/taskSupport") == Some(&json!("required"));
            prop_assert_eq!(listed.is_some(), named && !task);
            let Some(t) = listed else { return Ok(()) };
            prop_assert_eq!(&t.name, &text_of(&v, "name"));
            prop_assert_eq!(&t.description, &text_of(&v, "description"));
            let schema = v.get("inputSchema").cloned().unwrap_or(json!({"type": "object"}));
            prop_assert_eq!(parsed(&t.input_schema), schema);
            prop_assert_eq!(t.output_schema.map(|s| parsed(&s)), v.get("outputSchema").cloned());
            prop_assert_eq!(entries(t.meta), kept_meta(&v));
        }

        /// A `tools/call` result: every content block is passed on (one
        /// of a kind newer than this client as its JSON text), in order
        /// and of the kind it said; structured content and `_meta` as they
        /// were, then what the stream carried.
        #[test]
        fn tool_results_lose_no_block(
            v in arb::or_any(arb::tool_result()),
            logs in prop::collection::vec(arb::json(), 0..3),
            changed in any::<bool>(),
        ) {
            let c = Collected {
                logs: logs.into_iter().map(|data| json!({"level": "info", "data": data})).collect(),
                list_changed: if changed { vec!["tools"] } else { vec![] },
                ..Collected::default()
            };
            let r = tool_result(&v, &c);
            let blocks = v.get("content").and_then(Value::as_array).cloned().unwrap_or_default();
            prop_assert_eq!(r.content.len(), blocks.len());
            for (b, v) in r.content.iter().zip(&blocks) {
                let said = v.get("type").and_then(Value::as_str);
                let known = ["text", "image", "audio", "resource_link", "resource"];
                match said.filter(|t| known.contains(t)) {
                    Some(t) => prop_assert_eq!(kind(b), t),
                    None => prop_assert!(
                        matches!(b, ContentBlock::Text(t) if parsed(&t.text) == *v),
                        "{:?} from {}", b, v
                    ),
                }
                if let ContentBlock::EmbeddedResource(e) = b {
                    // The broker reads an untyped blob as binary.
                    let r = &v["resource"];
                    if r.get("text").and_then(Value::as_str).is_none()
                        && r.get("blob").and_then(Value::as_str).is_some()
                        && r.get("mimeType").and_then(Value::as_str).is_none()
                    {
                        prop_assert_eq!(e.mime_type.as_deref(), Some("application/octet-stream"));
                    }
                }
            }
            let structured = v.get("structuredContent").filter(|s| !s.is_null()).cloned();
            prop_assert_eq!(r.structured_content.map(|s| parsed(&s)), structured);
            prop_assert_eq!(r.is_error, v.get("isError").and_then(Value::as_bool));
            let mut meta = kept_meta(&v);
            meta.extend(c.meta().into_iter().map(|(k, t)| (k, parsed(&t))));
            prop_assert_eq!(entries(r.meta), meta);
        }

        /// Resources, templates and prompts: dropped only without their
        /// URI (template) or name, which are kept as they were.
        #[test]
        fn listings_keep_their_keys(
            r in arb::or_any(arb::resource()),
            template in any::<bool>(),
            p in arb::or_any(arb::prompt()),
        ) {
            let key = if template { "uriTemplate" } else { "uri" };
            let uri = v_str(&r, key);
            prop_assert_eq!(resource(&r, template).map(|m| m.uri), uri);
            let mapped = prompt(&p);
            prop_assert_eq!(mapped.as_ref().map(|m| m.name.clone()), v_str(&p, "name"));
            let declared: Vec<&str> = p
                .get("arguments")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|a| a.get("name").and_then(Value::as_str))
                .collect();
            if let Some(args) = mapped.and_then(|m| m.arguments) {
                let names: Vec<&str> = args.iter().map(|a| a.name.as_str()).collect();
                prop_assert_eq!(&names, &declared);
            }
            // Each declared argument is sent as its placeholder.
            let sent = placeholders(&p);
            prop_assert_eq!(sent.len(), {
                let mut d = declared.clone();
                d.sort_unstable();
                d.dedup();
                d.len()
            });
            for (name, value) in &sent {
                prop_assert_eq!(value, &Value::String(format!("{{{{{name}}}}}")));
            }
        }

        /// Reads, prompts and completions lose no entry: every content of
        /// a read, every message of a prompt, every string value of a
        /// completion.
        #[test]
        fn results_lose_no_entry(
            read in arb::or_any(arb::read_result()),
            got in arb::or_any(arb::prompt_result()),
            done in arb::or_any(arb::completion_result()),
            init in arb::or_any(arb::init_result()),
        ) {
            let count = |v: &Value, at: &str| {
                v.pointer(at).and_then(Value::as_array).map_or(0, Vec::len)
            };
            prop_assert_eq!(resource_contents(&read).len(), count(&read, "/contents"));
            prop_assert_eq!(prompt_result(&got).messages.len(), count(&got, "/messages"));
            let values = done
                .pointer("/completion/values")
                .and_then(Value::as_array)
                .map_or(0, |a| a.iter().filter(|v| v.is_string()).count());
            prop_assert_eq!(completion(&done, &Collected::default()).content.len(), values);
            // A capability is offered when it is an object.
            let caps = capabilities(&init);
            let offered = |k: &str| {
                init.pointer(&format!("/capabilities/{k}")).is_some_and(Value::is_object)
            };
            prop_assert_eq!(caps.tools.is_some(), offered("tools"));
            prop_assert_eq!(caps.resources.is_some(), offered("resources"));
            prop_assert_eq!(caps.prompts.is_some(), offered("prompts"));
            prop_assert_eq!(caps.completions.is_some(), offered("completions"));
        }
    }

    fn v_str(v: &Value, key: &str) -> Option<String> {
        v.get(key).and_then(Value::as_str).map(str::to_owned)
    }
}
