//! Verified FlatBuffers response payloads → proto messages (the way in,
//! proto requests → frames, is `super::request`).
//!
//! Every field the proto cannot carry is named in proto/README.md
//! ("Losses"); the functions here drop exactly those.

use base64::Engine;
use mcp_proto::v1 as pb;
use mcp_schema::content_vec::ContentRef;
use mcp_schema::fb::protocol as p;

pub fn version_to_str(v: p::ProtocolVersion) -> String {
    match v {
        p::ProtocolVersion::V2024_11_05 => "2024-11-05".into(),
        p::ProtocolVersion::V2025_01_01 => "2025-01-01".into(),
        p::ProtocolVersion::V2025_06_18 => "2025-06-18".into(),
        other => format!("{}", other.0),
    }
}

pub fn log_level_from_wire(l: p::LogLevel) -> pb::LogLevel {
    match l {
        p::LogLevel::Debug => pb::LogLevel::Debug,
        p::LogLevel::Info => pb::LogLevel::Info,
        p::LogLevel::Warning => pb::LogLevel::Warning,
        p::LogLevel::Error => pb::LogLevel::Error,
        _ => pb::LogLevel::Critical,
    }
}

fn annotations(a: Option<p::Annotations<'_>>) -> Option<pb::Annotations> {
    let a = a?;
    Some(pb::Annotations {
        audience: a
            .audience()
            .iter()
            .flatten()
            .filter_map(|r| match r {
                p::Role::User => Some("user".to_string()),
                p::Role::Assistant => Some("assistant".to_string()),
                _ => None,
            })
            .collect(),
        priority: a.priority().map_or(0.0, f64::from),
    })
}

fn opt(s: Option<&str>) -> Option<String> {
    s.map(str::to_string)
}

/// A wire resource content → proto. A blob is base64 on the wire and raw
/// bytes in the proto; undecodable base64 is passed on as text rather than
/// dropped.
pub fn resource_content(r: p::ResourceContent<'_>) -> pb::ResourceContent {
    use pb::resource_content::Content as C;
    let content = match (r.text(), r.blob()) {
        (Some(t), _) => Some(C::Text(t.to_string())),
        (None, Some(b)) => Some(match base64::engine::general_purpose::STANDARD.decode(b) {
            Ok(bytes) => C::Blob(bytes),
            Err(_) => C::Text(b.to_string()),
        }),
        (None, None) => None,
    };
    pb::ResourceContent {
        uri: r.uri().to_string(),
        mime_type: opt(r.mime_type()),
        content,
    }
}

/// One content block → proto (`None` for a member added by a newer schema).
pub fn content(c: ContentRef<'_>) -> Option<pb::Content> {
    use pb::content::Content as C;
    let (content, ann) = match c {
        ContentRef::Text(t) => (
            C::Text(pb::TextContent {
                text: t.text().to_string(),
            }),
            t.annotations(),
        ),
        ContentRef::Image(i) => (
            C::Image(pb::ImageContent {
                data: i.data().to_string(),
                mime_type: i.mime_type().to_string(),
            }),
            i.annotations(),
        ),
        ContentRef::Audio(a) => (
            C::Audio(pb::AudioContent {
                data: a.data().to_string(),
                mime_type: a.mime_type().to_string(),
            }),
            a.annotations(),
        ),
        ContentRef::Resource(r) => (C::Resource(resource_content(r)), r.annotations()),
        // The proto has no resource link: a resource with no contents is
        // the closest (title and description are lost).
        ContentRef::ResourceLink(l) => (
            C::Resource(pb::ResourceContent {
                uri: l.uri().to_string(),
                mime_type: opt(l.mime_type()),
                content: None,
            }),
            l.annotations(),
        ),
        ContentRef::Unknown(_) => return None,
    };
    Some(pb::Content {
        content: Some(content),
        annotations: annotations(ann),
    })
}

fn text_block(text: String) -> pb::Content {
    pb::Content {
        content: Some(pb::content::Content::Text(pb::TextContent { text })),
        annotations: None,
    }
}

macro_rules! union_content {
    ($x:expr, $t:ident, $i:ident, $r:ident, $a:ident, $l:ident) => {{
        let x = $x;
        if let Some(c) = x.$t() {
            ContentRef::Text(c)
        } else if let Some(c) = x.$i() {
            ContentRef::Image(c)
        } else if let Some(c) = x.$r() {
            ContentRef::Resource(c)
        } else if let Some(c) = x.$a() {
            ContentRef::Audio(c)
        } else if let Some(c) = x.$l() {
            ContentRef::ResourceLink(c)
        } else {
            ContentRef::Unknown(0)
        }
    }};
}

/// ToolResult → CallToolResult: content blocks in order, structured content
/// appended as a text block (as MCP advises) unless a text block already
/// holds exactly it, the error message as a text block when there is no
/// content, `is_error` preserved. The content vector is read without
/// checking it again.
///
/// # Safety
/// `tr` belongs to a Response read by `mcp_schema::verify::built_response`
/// (whose contract then held) or accepted by `verify_response`.
pub unsafe fn tool_result(tr: p::ToolResult<'_>) -> pb::CallToolResult {
    // SAFETY: the caller's.
    let blocks = unsafe { mcp_schema::content_vec::content_unchecked(&tr) };
    let mut content: Vec<pb::Content> = blocks.iter().filter_map(content).collect();
    if let Some(s) = tr.structured_content() {
        let texts = || {
            content.iter().filter_map(|c| match &c.content {
                Some(pb::content::Content::Text(t)) => Some(t.text.as_str()),
                _ => None,
            })
        };
        // Byte for byte first (a router that wrote both from one string);
        // else as JSON values: a router that parsed the tool's output and
        // wrote it again (the upstream router, with its keys in another
        // order or indented) holds the same content in other bytes.
        // Nothing is parsed unless a text block could be that JSON (it
        // starts as it does): a text that is a sentence costs a byte read.
        let opens = |t: &str| t.trim_start().as_bytes().first().copied();
        let could_be = |t: &str| opens(t) == opens(s);
        let already = texts().any(|t| t == s)
            || texts().any(could_be)
                && serde_json::from_str::<serde_json::Value>(s).is_ok_and(|v| {
                    texts()
                        .filter(|t| could_be(t))
                        .any(|t| serde_json::from_str::<serde_json::Value>(t).is_ok_and(|t| t == v))
                });
        if !already {
            content.push(text_block(s.to_string()));
        }
    }
    if content.is_empty()
        && let Some(e) = tr.error()
    {
        content.push(text_block(e.message().to_string()));
    }
    pb::CallToolResult {
        content,
        is_error: Some(tr.is_error() || tr.error().is_some()),
    }
}

/// A router's elicitation request as the final answer of a CallTool: the
/// proto has no way to ask the caller back inside a unary call, so it
/// becomes an error result carrying the question and the schema.
pub fn elicitation(e: p::ElicitationRequest<'_>) -> pb::CallToolResult {
    let mut content = vec![text_block(format!(
        "the tool needs more input (MCP elicitation), which this gRPC edge cannot relay: {}",
        e.message()
    ))];
    content.push(text_block(e.schema().to_string()));
    pb::CallToolResult {
        content,
        is_error: Some(true),
    }
}

pub fn tools(r: p::ListToolsResult<'_>) -> pb::ListToolsResult {
    pb::ListToolsResult {
        tools: r
            .tools()
            .iter()
            .flatten()
            .map(|t| pb::Tool {
                name: t.name().to_string(),
                description: Some(t.description().to_string()).filter(|d| !d.is_empty()),
                input_schema: t
                    .input_schema()
                    .unwrap_or("{\"type\":\"object\"}")
                    .as_bytes()
                    .to_vec(),
                annotations: None,
                icons: Vec::new(),
                title: opt(t.title()),
            })
            .collect(),
        next_cursor: opt(r.next_cursor()),
    }
}

pub fn resources(r: p::ListResourcesResult<'_>) -> pb::ListResourcesResult {
    pb::ListResourcesResult {
        resources: r
            .resources()
            .iter()
            .flatten()
            .map(|x| pb::Resource {
                uri: x.uri().to_string(),
                name: x.name().to_string(),
                description: opt(x.description()),
                mime_type: opt(x.mime_type()),
                annotations: annotations(x.annotations()),
                icons: Vec::new(),
                title: opt(x.title()),
                // 0 is the wire's "absent" (no presence bit for scalars).
                size: Some(x.size_bytes()).filter(|&s| s > 0),
            })
            .collect(),
        next_cursor: opt(r.next_cursor()),
    }
}

pub fn templates(r: p::ListResourceTemplatesResult<'_>) -> pb::ListResourceTemplatesResult {
    pb::ListResourceTemplatesResult {
        resource_templates: r
            .resource_templates()
            .iter()
            .flatten()
            .map(|x| pb::ResourceTemplate {
                uri_template: x.uri_template().to_string(),
                name: x.name().to_string(),
                description: opt(x.description()),
                mime_type: opt(x.mime_type()),
                annotations: annotations(x.annotations()),
                icons: Vec::new(),
                title: opt(x.title()),
            })
            .collect(),
        next_cursor: opt(r.next_cursor()),
    }
}

pub fn prompts(r: p::ListPromptsResult<'_>) -> pb::ListPromptsResult {
    pb::ListPromptsResult {
        prompts: r
            .prompts()
            .iter()
            .flatten()
            .map(|x| pb::Prompt {
                name: x.name().to_string(),
                description: opt(x.description()),
                arguments: x
                    .arguments()
                    .iter()
                    .flatten()
                    .map(|a| pb::PromptArgument {
                        name: a.name().to_string(),
                        description: opt(a.description()),
                        required: Some(a.required()),
                    })
                    .collect(),
                icons: Vec::new(),
                title: None,
            })
            .collect(),
        next_cursor: opt(r.next_cursor()),
    }
}

/// ResourceData → ReadResourceResult: `content` first, then
/// `extra_contents`. A non-resource first block (a bare text, say) is given
/// the resource's URI and MIME type.
pub fn resource_data(d: p::ResourceData<'_>) -> pb::ReadResourceResult {
    let res = d.resource();
    let first = match union_content!(
        d,
        content_as_text_content,
        content_as_image_content,
        content_as_resource_content,
        content_as_audio_content,
        content_as_resource_link_content
    ) {
        ContentRef::Resource(r) => Some(resource_content(r)),
        ContentRef::Text(t) => Some(pb::ResourceContent {
            uri: res.uri().to_string(),
            mime_type: opt(res.mime_type()),
            content: Some(pb::resource_content::Content::Text(t.text().to_string())),
        }),
        ContentRef::Image(i) => Some(blob_of(res.uri(), i.mime_type(), i.data())),
        ContentRef::Audio(a) => Some(blob_of(res.uri(), a.mime_type(), a.data())),
        ContentRef::ResourceLink(l) => Some(pb::ResourceContent {
            uri: l.uri().to_string(),
            mime_type: opt(l.mime_type()),
            content: None,
        }),
        ContentRef::Unknown(_) => None,
    };
    let contents = first
        .into_iter()
        .chain(d.extra_contents().iter().flatten().map(resource_content))
        .collect();
    pb::ReadResourceResult { contents }
}

fn blob_of(uri: &str, mime: &str, data: &str) -> pb::ResourceContent {
    let content = match base64::engine::general_purpose::STANDARD.decode(data) {
        Ok(b) => pb::resource_content::Content::Blob(b),
        Err(_) => pb::resource_content::Content::Text(data.to_string()),
    };
    pb::ResourceContent {
        uri: uri.to_string(),
        mime_type: Some(mime.to_string()),
        content: Some(content),
    }
}

fn role(r: &str) -> pb::Role {
    match r {
        "user" => pb::Role::User,
        "assistant" => pb::Role::Assistant,
        // The proto's Role has no "system".
        _ => pb::Role::Unspecified,
    }
}

/// AppliedPrompt → GetPromptResult. Seed routers that send only
/// `filled_content` get it as one user message.
pub fn applied_prompt(a: p::AppliedPrompt<'_>) -> pb::GetPromptResult {
    let mut messages: Vec<pb::PromptMessage> = a
        .messages()
        .iter()
        .flatten()
        .map(|m| pb::PromptMessage {
            role: role(m.role()) as i32,
            content: content(union_content!(
                m,
                content_as_text_content,
                content_as_image_content,
                content_as_resource_content,
                content_as_audio_content,
                content_as_resource_link_content
            )),
        })
        .collect();
    if messages.is_empty() {
        messages.push(pb::PromptMessage {
            role: pb::Role::User as i32,
            content: content(union_content!(
                a,
                filled_content_as_text_content,
                filled_content_as_image_content,
                filled_content_as_resource_content,
                filled_content_as_audio_content,
                filled_content_as_resource_link_content
            )),
        });
    }
    pb::GetPromptResult {
        description: opt(a.description()),
        messages,
    }
}

pub fn completion(c: p::CompleteResult<'_>) -> pb::CompleteResult {
    pb::CompleteResult {
        completion: Some(pb::Completion {
            values: c.values().iter().flatten().map(str::to_string).collect(),
            total: c.total().map(i64::from),
            has_more: Some(c.has_more()),
        }),
    }
}

pub fn initialize(r: p::InitializeResponse<'_>) -> pb::InitializeResult {
    let c = r.server_capabilities();
    pb::InitializeResult {
        protocol_version: version_to_str(c.protocol_version()),
        capabilities: Some(pb::ServerCapabilities {
            prompts: c.supports_prompts().then_some(pb::PromptsCapability {
                list_changed: c.prompts_list_changed(),
            }),
            resources: c.supports_resources().then_some(pb::ResourcesCapability {
                subscribe: c.supports_resource_subscribe(),
                list_changed: c.resources_list_changed(),
            }),
            tools: c.supports_tools().then_some(pb::ToolsCapability {
                list_changed: c.tools_list_changed(),
            }),
            logging: c.supports_logging().then_some(pb::LoggingCapability {}),
            experimental: None,
            completions: c
                .supports_completions()
                .then_some(pb::CompletionCapability {}),
            tasks: None,
            extensions: None,
        }),
        server_info: Some(pb::Implementation {
            name: c.server_name().unwrap_or("mcp-broker").to_string(),
            version: c.server_version().unwrap_or_default().to_string(),
            title: None,
            description: None,
            icons: Vec::new(),
            website_url: None,
        }),
        instructions: r
            .instructions()
            .filter(|i| !i.is_empty())
            .map(str::to_string),
    }
}

/// A non-final frame (progress, log, resource update) as a notification.
pub fn notification(resp: p::Response<'_>) -> Option<pb::notification::Notification> {
    use pb::notification::Notification as N;
    if let Some(n) = resp.payload_as_progress_notification() {
        let mut id = [0u8; mcp_schema::uuid::HYPHENATED_LEN];
        let token = mcp_schema::uuid::hyphenated(&n.operation_id().0, &mut id).to_string();
        return Some(N::Progress(pb::ProgressNotification {
            progress_token: token,
            // As the router reported it, or the fraction of 1.
            progress: n.value().unwrap_or(f64::from(n.progress())),
            total: if n.value().is_some() {
                n.total()
            } else {
                Some(1.0)
            },
            message: opt(n.message()),
        }));
    }
    if let Some(l) = resp.payload_as_log_message() {
        // The MCP level and structured data the frame keeps in its
        // metadata where its own fields cannot hold them (`adapt::log_frame`).
        let meta = |key: &str| {
            l.metadata()?
                .iter()
                .find(|kv| kv.key() == key)
                .and_then(|kv| kv.value())
        };
        let level = match meta(crate::edge::http::jsonrpc::LOG_LEVEL_META_KEY) {
            Some("notice") => pb::LogLevel::Notice,
            Some("alert") => pb::LogLevel::Alert,
            Some("emergency") => pb::LogLevel::Emergency,
            _ => log_level_from_wire(l.level()),
        };
        return Some(N::Log(pb::LogNotification {
            level: level as i32,
            logger: l.source().unwrap_or("router").to_string(),
            message: l.message().to_string(),
            data: meta(crate::edge::http::jsonrpc::LOG_DATA_META_KEY)
                .map(|d| d.as_bytes().to_vec()),
        }));
    }
    if let Some(u) = resp.payload_as_resource_updated_notification() {
        return Some(N::ResourceUpdated(pb::ResourceUpdatedNotification {
            uri: u.uri().to_string(),
        }));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::super::request::version_from_str;
    use super::*;

    /// A router's notice, alert and emergency keep their level on gRPC
    /// too, and structured data arrives in `data` as JSON.
    #[test]
    fn log_notifications_keep_the_mcp_level_and_data() {
        let mut enc = mcp_schema::ResponseEncoder::new(1);
        let to = mcp_schema::encode::ReplyTo::UNKNOWN;
        for (level, want) in [
            ("notice", pb::LogLevel::Notice),
            ("alert", pb::LogLevel::Alert),
            ("emergency", pb::LogLevel::Emergency),
            ("info", pb::LogLevel::Info),
        ] {
            let f = crate::adapt::log_frame(&mut enc, &to, level, None, r#"{"k":1}"#).to_vec();
            let v = mcp_schema::client::ResponseView::parse(&f).unwrap();
            let Some(pb::notification::Notification::Log(l)) = notification(v.response) else {
                panic!("not a log notification")
            };
            assert_eq!(l.level, want as i32, "{level}");
            assert_eq!(l.data.as_deref(), Some(&br#"{"k":1}"#[..]), "{level}");
        }
    }

    #[test]
    fn versions_round_trip_and_unknown_ones_negotiate_to_the_latest() {
        for v in ["2024-11-05", "2025-06-18"] {
            assert_eq!(version_to_str(version_from_str(v)), v);
        }
        assert_eq!(
            version_from_str("2025-11-25"),
            p::ProtocolVersion::Unspecified
        );
        assert_eq!(
            crate::dispatch::negotiate(version_from_str("2025-11-25")),
            p::ProtocolVersion::V2025_06_18
        );
    }
}
