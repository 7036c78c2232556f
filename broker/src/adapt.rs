//! WIT results → Response frames.
//!
//! The only place that knows both the router world's types and the wire
//! schema. Each function appends complete size-prefixed frames to `out` (a
//! connection's write buffer), so a tool result with progress becomes its
//! progress frames followed by its final frame, in order. Losses (what the
//! FlatBuffers form cannot carry) are listed in `schema/README.md`.

use flatbuffers::{FlatBufferBuilder, ForwardsUOffset, UnionWIPOffset, Vector, WIPOffset};
use mcp_schema::content_vec::{ToolResultParts, create_tool_result};
use mcp_schema::encode::ReplyTo;
use mcp_schema::fb::protocol as p;
use mcp_schema::fb::{self, KeyValue, KeyValueArgs, UUID};
use mcp_schema::{ErrorCode, ResponseEncoder};

use crate::edge::http::jsonrpc;
use crate::route::Listed;
use crate::wasm::CallError;
use crate::wasm::types as w;

type Fbb = FlatBufferBuilder<'static>;
type KeyValues = WIPOffset<Vector<'static, ForwardsUOffset<KeyValue<'static>>>>;

fn opt_str(fbb: &mut Fbb, s: &Option<String>) -> Option<WIPOffset<&'static str>> {
    s.as_deref().map(|s| fbb.create_string(s))
}

/// A resource's or template's MIME type: the WIT field is a plain string,
/// and an empty one means the router does not know it (the upstream
/// router's for a listing without `mimeType`): absent on the wire, never
/// `"mimeType": ""`, which is no MIME type.
fn known_mime(fbb: &mut Fbb, s: &str) -> Option<WIPOffset<&'static str>> {
    (!s.is_empty()).then(|| fbb.create_string(s))
}

fn annotations(
    fbb: &mut Fbb,
    a: &Option<w::Annotations>,
) -> Option<WIPOffset<p::Annotations<'static>>> {
    let a = a.as_ref()?;
    let audience = a.audience.as_ref().map(|roles| {
        let roles: Vec<p::Role> = roles
            .iter()
            .map(|r| match r {
                w::Role::User => p::Role::User,
                w::Role::Assistant => p::Role::Assistant,
            })
            .collect();
        fbb.create_vector(&roles)
    });
    let timestamp = opt_str(fbb, &a.timestamp);
    Some(p::Annotations::create(
        fbb,
        &p::AnnotationsArgs {
            audience,
            priority: a.priority,
            timestamp,
        },
    ))
}

fn meta(fbb: &mut Fbb, m: &Option<Vec<w::MetaEntry>>) -> Option<KeyValues> {
    let m = m.as_ref().filter(|m| !m.is_empty())?;
    let kvs: Vec<_> = m
        .iter()
        .map(|e| {
            let key = fbb.create_string(&e.key);
            let value = fbb.create_string(&e.value);
            KeyValue::create(
                fbb,
                &KeyValueArgs {
                    key: Some(key),
                    value: Some(value),
                },
            )
        })
        .collect();
    Some(fbb.create_vector(&kvs))
}

/// [`meta`] less the entries named `skip` (the broker's own conventions,
/// which it turns into frames rather than pass on).
fn meta_without(fbb: &mut Fbb, m: &Option<Vec<w::MetaEntry>>, skip: &[&str]) -> Option<KeyValues> {
    match m {
        Some(m) if m.iter().any(|e| skip.contains(&e.key.as_str())) => {
            let kept: Vec<w::MetaEntry> = m
                .iter()
                .filter(|e| !skip.contains(&e.key.as_str()))
                .cloned()
                .collect();
            meta(fbb, &Some(kept))
        }
        _ => meta(fbb, m),
    }
}

/// The tool-result `meta` key whose value, a JSON array of MCP log
/// messages (`{"level":"info","logger":"…","data":…}`), the broker sends as
/// log notifications before the result: the seed router world has no
/// logging import, so a router reports what it logged during the call this
/// way (routers/README.md). The entry itself is not passed on in `_meta`.
pub const LOG_META_KEY: &str = "mcp-broker/log";

/// Most log notifications one result may carry; the rest are dropped (the
/// result itself is bounded by `max_result_bytes`, this bounds the frames).
const MAX_LOGS_PER_RESULT: usize = 64;

/// LogMessage frames for the [`LOG_META_KEY`] entries of `tr`. An entry
/// that is not such an array is ignored (and still not passed on).
fn log_frames(enc: &mut ResponseEncoder, out: &mut Vec<u8>, to: &ReplyTo<'_>, tr: &w::ToolResult) {
    #[derive(serde::Deserialize)]
    struct Entry<'a> {
        #[serde(borrow)]
        level: std::borrow::Cow<'a, str>,
        #[serde(default, borrow)]
        logger: Option<std::borrow::Cow<'a, str>>,
        #[serde(borrow)]
        data: &'a serde_json::value::RawValue,
    }
    let entries = tr
        .meta
        .iter()
        .flatten()
        .filter(|e| e.key == LOG_META_KEY)
        .filter_map(|e| serde_json::from_str::<Vec<Entry<'_>>>(&e.value).ok())
        .flatten()
        .take(MAX_LOGS_PER_RESULT);
    for e in entries {
        out.extend_from_slice(log_frame(
            enc,
            to,
            &e.level,
            e.logger.as_deref(),
            e.data.get(),
        ));
    }
}

/// One LogMessage frame: an MCP log `level` name, the `logger`, and `data`
/// as JSON text (a JSON string is the message itself; anything else is
/// sent as its JSON text, and kept as JSON under
/// [`jsonrpc::LOG_DATA_META_KEY`]; a level the frame's five cannot name
/// under [`jsonrpc::LOG_LEVEL_META_KEY`]).
pub fn log_frame<'e>(
    enc: &'e mut ResponseEncoder,
    to: &ReplyTo<'_>,
    level: &str,
    logger: Option<&str>,
    data: &str,
) -> &'e [u8] {
    let (wire, exact) = match level {
        "debug" => (p::LogLevel::Debug, true),
        "info" => (p::LogLevel::Info, true),
        "notice" => (p::LogLevel::Info, false),
        "warning" => (p::LogLevel::Warning, true),
        "error" => (p::LogLevel::Error, true),
        "critical" => (p::LogLevel::Critical, true),
        _ => (p::LogLevel::Critical, false),
    };
    let text = serde_json::from_str::<String>(data).ok();
    let fbb = enc.begin();
    let message = fbb.create_string(text.as_deref().unwrap_or(data));
    let source = logger.map(|l| fbb.create_string(l));
    let mut kvs = Vec::new();
    let mut entry = |fbb: &mut Fbb, key: &str, value: &str| {
        let (key, value) = (fbb.create_string(key), fbb.create_string(value));
        kvs.push(KeyValue::create(
            fbb,
            &KeyValueArgs {
                key: Some(key),
                value: Some(value),
            },
        ));
    };
    if !exact && jsonrpc::level_rank(level).is_some() {
        entry(fbb, jsonrpc::LOG_LEVEL_META_KEY, level);
    }
    if text.is_none() && serde_json::from_str::<serde::de::IgnoredAny>(data).is_ok() {
        entry(fbb, jsonrpc::LOG_DATA_META_KEY, data);
    }
    let metadata = (!kvs.is_empty()).then(|| fbb.create_vector(&kvs));
    let m = p::LogMessage::create(
        fbb,
        &p::LogMessageArgs {
            level: wire,
            message: Some(message),
            source,
            metadata,
            ..Default::default()
        },
    );
    enc.finish(to, p::ResponsePayload::LogMessage, m.as_union_value(), true)
}

/// One ProgressNotification frame of tool call `id`: `progress` as a
/// fraction of the whole, step `step` of `steps` (0: unknown).
///
/// `mcp`: the progress as MCP has it (value, and total when known), for a
/// router that reported it so (`mcp-broker:host/call.progress`); the
/// edges that speak MCP send it as reported, which the fraction cannot
/// when there is no total.
#[allow(clippy::too_many_arguments)]
pub fn progress_frame<'e>(
    enc: &'e mut ResponseEncoder,
    to: &ReplyTo<'_>,
    id: &UUID,
    progress: f32,
    message: Option<&str>,
    step: u32,
    steps: u32,
    mcp: Option<(f64, Option<f64>)>,
) -> &'e [u8] {
    let fbb = enc.begin();
    let message = message.map(|m| fbb.create_string(m));
    let n = p::ProgressNotification::create(
        fbb,
        &p::ProgressNotificationArgs {
            operation_id: Some(id),
            progress,
            message,
            current_step: step,
            total_steps: steps,
            value: mcp.map(|(v, _)| v),
            total: mcp.and_then(|(_, t)| t),
        },
    );
    enc.finish(
        to,
        p::ResponsePayload::ProgressNotification,
        n.as_union_value(),
        true,
    )
}

fn text(
    fbb: &mut Fbb,
    t: &str,
    a: &Option<w::Annotations>,
) -> (p::Content, WIPOffset<UnionWIPOffset>) {
    let annotations = annotations(fbb, a);
    let text = fbb.create_string(t);
    let c = p::TextContent::create(
        fbb,
        &p::TextContentArgs {
            text: Some(text),
            annotations,
        },
    );
    (p::Content::TextContent, c.as_union_value())
}

fn image(fbb: &mut Fbb, i: &w::ImageContent) -> (p::Content, WIPOffset<UnionWIPOffset>) {
    let annotations = annotations(fbb, &i.annotations);
    let data = fbb.create_string(&i.data);
    let mime_type = fbb.create_string(&i.mime_type);
    let c = p::ImageContent::create(
        fbb,
        &p::ImageContentArgs {
            data: Some(data),
            mime_type: Some(mime_type),
            annotations,
        },
    );
    (p::Content::ImageContent, c.as_union_value())
}

fn embedded(fbb: &mut Fbb, e: &w::EmbeddedResource) -> (p::Content, WIPOffset<UnionWIPOffset>) {
    let annotations = annotations(fbb, &e.annotations);
    let uri = fbb.create_string(&e.uri);
    let mime_type = opt_str(fbb, &e.mime_type);
    let title = opt_str(fbb, &e.title);
    let description = opt_str(fbb, &e.description);
    // WIT carries one `data` string; text unless the MIME type says binary.
    let is_text = e
        .mime_type
        .as_deref()
        .is_none_or(|m| m.starts_with("text/") || m.contains("json") || m.contains("xml"));
    let data = fbb.create_string(&e.data);
    let (text, blob) = if is_text {
        (Some(data), None)
    } else {
        (None, Some(data))
    };
    let c = p::ResourceContent::create(
        fbb,
        &p::ResourceContentArgs {
            uri: Some(uri),
            mime_type,
            text,
            blob,
            title,
            description,
            annotations,
        },
    );
    (p::Content::ResourceContent, c.as_union_value())
}

/// One WIT content block as a `Content` union member.
pub fn content_block(
    fbb: &mut Fbb,
    b: &w::ContentBlock,
) -> (p::Content, WIPOffset<UnionWIPOffset>) {
    match b {
        w::ContentBlock::Text(t) => text(fbb, &t.text, &t.annotations),
        w::ContentBlock::Image(i) => image(fbb, i),
        w::ContentBlock::Audio(a) => {
            let annotations = annotations(fbb, &a.annotations);
            let data = fbb.create_string(&a.data);
            let mime_type = fbb.create_string(&a.mime_type);
            let c = p::AudioContent::create(
                fbb,
                &p::AudioContentArgs {
                    data: Some(data),
                    mime_type: Some(mime_type),
                    annotations,
                },
            );
            (p::Content::AudioContent, c.as_union_value())
        }
        w::ContentBlock::ResourceLink(l) => {
            let annotations = annotations(fbb, &l.annotations);
            let uri = fbb.create_string(&l.uri);
            let title = opt_str(fbb, &l.title);
            let description = opt_str(fbb, &l.description);
            let mime_type = opt_str(fbb, &l.mime_type);
            let c = p::ResourceLinkContent::create(
                fbb,
                &p::ResourceLinkContentArgs {
                    uri: Some(uri),
                    title,
                    description,
                    mime_type,
                    annotations,
                },
            );
            (p::Content::ResourceLinkContent, c.as_union_value())
        }
        w::ContentBlock::EmbeddedResource(e) => embedded(fbb, e),
    }
}

/// The answer to a `call-tool`: progress frames, then the final ToolResult
/// or ElicitationRequest.
pub fn tool_response(
    enc: &mut ResponseEncoder,
    out: &mut Vec<u8>,
    to: &ReplyTo<'_>,
    tool_call_id: &UUID,
    r: &w::Response,
) {
    match r {
        w::Response::Completed(tr) => {
            log_frames(enc, out, to, tr);
            let steps = tr.progress.as_ref().map_or(0, |p| p.len());
            for (i, pr) in tr.progress.iter().flatten().enumerate() {
                out.extend_from_slice(progress_frame(
                    enc,
                    to,
                    tool_call_id,
                    pr.progress.unwrap_or((i + 1) as f32 / steps as f32),
                    pr.message.as_deref(),
                    i as u32 + 1,
                    steps as u32,
                    None,
                ));
            }
            let (fbb, blocks) = enc.begin_with_content();
            blocks.extend(tr.content.iter().map(|b| content_block(fbb, b)));
            let structured_content = opt_str(fbb, &tr.structured_content);
            let metadata = meta_without(
                fbb,
                &tr.meta,
                &[LOG_META_KEY, crate::upstream::LIST_CHANGED_META_KEY],
            );
            let is_error = tr.is_error.unwrap_or(false);
            let res = create_tool_result(
                fbb,
                &ToolResultParts {
                    tool_call_id: *tool_call_id,
                    success: !is_error,
                    content: blocks,
                    metadata,
                    structured_content,
                    is_error,
                    ..Default::default()
                },
            );
            out.extend_from_slice(enc.finish(
                to,
                p::ResponsePayload::ToolResult,
                res.as_union_value(),
                !is_error,
            ));
        }
        w::Response::Elicit(e) => {
            let fbb = enc.begin();
            let title = opt_str(fbb, &e.title);
            let message = fbb.create_string(&e.message);
            let schema = fbb.create_string(&e.schema);
            let annotations = annotations(fbb, &e.annotations);
            let m = meta(fbb, &e.meta);
            let el = p::ElicitationRequest::create(
                fbb,
                &p::ElicitationRequestArgs {
                    tool_call_id: Some(tool_call_id),
                    title,
                    message: Some(message),
                    schema: Some(schema),
                    annotations,
                    meta: m,
                },
            );
            out.extend_from_slice(enc.finish(
                to,
                p::ResponsePayload::ElicitationRequest,
                el.as_union_value(),
                true,
            ));
        }
    }
}

fn resource_contents(
    fbb: &mut Fbb,
    c: &w::ResourceContents,
) -> WIPOffset<p::ResourceContent<'static>> {
    let (uri, mime, text, blob) = match c {
        w::ResourceContents::Text(t) => (&t.uri, &t.mime_type, Some(&t.text), None),
        w::ResourceContents::Blob(b) => (&b.uri, &b.mime_type, None, Some(&b.blob)),
    };
    let uri = fbb.create_string(uri);
    let mime_type = opt_str(fbb, mime);
    let text = text.map(|t| fbb.create_string(t));
    let blob = blob.map(|b| fbb.create_string(b));
    p::ResourceContent::create(
        fbb,
        &p::ResourceContentArgs {
            uri: Some(uri),
            mime_type,
            text,
            blob,
            ..Default::default()
        },
    )
}

/// The answer to a `read-resource`: the first contents in `content`, the
/// rest in `extra_contents`.
pub fn resource_response(
    enc: &mut ResponseEncoder,
    out: &mut Vec<u8>,
    to: &ReplyTo<'_>,
    uri: &str,
    r: &w::ReadResourceResult,
    listed: Option<&w::McpResource>,
) {
    let fbb = enc.begin();
    let mut all: Vec<_> = r
        .contents
        .iter()
        .map(|c| resource_contents(fbb, c))
        .collect();
    if all.is_empty() {
        // `content` is required: an empty read is one empty text content.
        let u = fbb.create_string(uri);
        let t = fbb.create_string("");
        all.push(p::ResourceContent::create(
            fbb,
            &p::ResourceContentArgs {
                uri: Some(u),
                text: Some(t),
                ..Default::default()
            },
        ));
    }
    let first = all[0];
    let extra_contents = (all.len() > 1).then(|| fbb.create_vector(&all[1..]));
    let resource = resource_table(fbb, uri, listed);
    let d = p::ResourceData::create(
        fbb,
        &p::ResourceDataArgs {
            resource: Some(resource),
            content_type: p::Content::ResourceContent,
            content: Some(first.as_union_value()),
            last_modified: None,
            etag: None,
            extra_contents,
        },
    );
    out.extend_from_slice(enc.finish(
        to,
        p::ResponsePayload::ResourceData,
        d.as_union_value(),
        true,
    ));
}

fn resource_table(
    fbb: &mut Fbb,
    uri: &str,
    r: Option<&w::McpResource>,
) -> WIPOffset<p::Resource<'static>> {
    let u = fbb.create_string(uri);
    let name = fbb.create_string(r.map_or(uri, |r| r.name.as_str()));
    let (title, description, mime_type, ann) = match r {
        Some(r) => (
            opt_str(fbb, &r.title),
            opt_str(fbb, &r.description),
            known_mime(fbb, &r.mime_type),
            annotations(fbb, &r.annotations),
        ),
        None => (None, None, None, None),
    };
    p::Resource::create(
        fbb,
        &p::ResourceArgs {
            uri: Some(u),
            name: Some(name),
            description,
            mime_type,
            size_bytes: 0,
            metadata: None,
            title,
            annotations: ann,
        },
    )
}

/// Longest placeholder name looked up: a `{{` whose `}}` is further than
/// this is text, which keeps filling linear in the template's length.
pub const MAX_PLACEHOLDER_NAME: usize = 128;

/// A filled prompt would be larger than the answer may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the prompt with its arguments filled in exceeds {limit} bytes")]
pub struct PromptTooLarge {
    /// The cap on the filled text of all messages together, in bytes.
    pub limit: usize,
}

/// Prompt arguments ready for filling: sorted by name (first one wins for a
/// repeated name), each value as inserted (a JSON string unquoted, anything
/// else as written).
pub struct PromptArgs<'a> {
    sorted: Vec<(&'a str, std::borrow::Cow<'a, str>)>,
}

impl<'a> PromptArgs<'a> {
    pub fn new(args: &[(&'a str, &'a str)]) -> Self {
        let mut sorted: Vec<_> = args
            .iter()
            .map(|&(k, v)| {
                let value = match serde_json::from_str::<String>(v) {
                    Ok(s) => std::borrow::Cow::Owned(s),
                    Err(_) => std::borrow::Cow::Borrowed(v),
                };
                (k, value)
            })
            .collect();
        sorted.sort_by(|a, b| a.0.cmp(b.0));
        sorted.dedup_by(|later, first| later.0 == first.0);
        Self { sorted }
    }

    fn get(&self, name: &str) -> Option<&str> {
        self.sorted
            .binary_search_by(|(k, _)| (*k).cmp(name))
            .ok()
            .map(|i| &*self.sorted[i].1)
    }
}

/// Fills `{{name}}` placeholders of `template` with prompt arguments in one
/// pass: inserted text is never scanned again, so an argument holding
/// `{{other}}` stays as written. An unknown name is left as it is. The WIT
/// `get-prompt` takes no arguments, so the broker applies them.
///
/// `budget` is what the filled text may still add to the answer; it is
/// charged for every byte written, and running out fails the whole prompt
/// before the text grows further.
pub fn fill_placeholders(
    template: &str,
    args: &PromptArgs<'_>,
    budget: &mut usize,
) -> Result<String, PromptTooLarge> {
    let limit = *budget;
    let mut out = String::new();
    let push = |out: &mut String, piece: &str, budget: &mut usize| -> Result<(), PromptTooLarge> {
        *budget = budget
            .checked_sub(piece.len())
            .ok_or(PromptTooLarge { limit })?;
        out.push_str(piece);
        Ok(())
    };
    let mut rest = template;
    while let Some(open) = rest.find("{{") {
        let after = &rest[open + 2..];
        let mut end = after.len().min(MAX_PLACEHOLDER_NAME + 2);
        while !after.is_char_boundary(end) {
            end -= 1;
        }
        let value = after[..end]
            .find("}}")
            .and_then(|close| Some((close, args.get(&after[..close])?)));
        match value {
            Some((close, value)) => {
                push(&mut out, &rest[..open], budget)?;
                push(&mut out, value, budget)?;
                rest = &after[close + 2..];
            }
            // Not a known placeholder: keep its first brace as text and look
            // again from the second (`{{{a}}}` fills the inner `{{a}}`).
            None => {
                push(&mut out, &rest[..open + 1], budget)?;
                rest = &rest[open + 1..];
            }
        }
    }
    push(&mut out, rest, budget)?;
    Ok(out)
}

/// The answer to a `get-prompt`, arguments applied. The filled text of all
/// messages together is capped at `max_filled_bytes`; past it the answer is
/// an InvalidParams error and nothing larger is built.
pub fn prompt_response(
    enc: &mut ResponseEncoder,
    out: &mut Vec<u8>,
    to: &ReplyTo<'_>,
    name: &str,
    r: &w::GetPromptResult,
    args: &[(&str, &str)],
    max_filled_bytes: usize,
) {
    let prompt_args = PromptArgs::new(args);
    let mut budget = max_filled_bytes;
    // Filled before the builder is touched, so a refusal leaves it clean.
    let filled: Result<Vec<Option<String>>, PromptTooLarge> = r
        .messages
        .iter()
        .map(|m| match &m.content {
            w::PromptMessageContent::Text(t) => {
                fill_placeholders(&t.text, &prompt_args, &mut budget)
                    .map(Some)
                    // The cap is on all messages together, not what was left.
                    .map_err(|_| PromptTooLarge {
                        limit: max_filled_bytes,
                    })
            }
            _ => Ok(None),
        })
        .collect();
    let filled = match filled {
        Ok(f) => f,
        Err(e) => {
            out.extend_from_slice(enc.error(to, ErrorCode::InvalidParams, &e.to_string(), None));
            return;
        }
    };
    let fbb = enc.begin();
    let mut first: Option<(p::Content, WIPOffset<UnionWIPOffset>)> = None;
    let messages: Vec<_> = r
        .messages
        .iter()
        .zip(&filled)
        .map(|(m, filled)| {
            let role = fbb.create_string(match m.role {
                w::PromptMessageRole::User => "user",
                w::PromptMessageRole::Assistant => "assistant",
            });
            let (t, c) = match (&m.content, filled) {
                (w::PromptMessageContent::Text(t), Some(f)) => text(fbb, f, &t.annotations),
                (w::PromptMessageContent::Text(t), None) => text(fbb, &t.text, &t.annotations),
                (w::PromptMessageContent::Image(i), _) => image(fbb, i),
                (w::PromptMessageContent::McpResource(e), _) => embedded(fbb, e),
            };
            first.get_or_insert((t, c));
            p::PromptMessage::create(
                fbb,
                &p::PromptMessageArgs {
                    role: Some(role),
                    content_type: t,
                    content: Some(c),
                },
            )
        })
        .collect();
    let (ft, fc) = match first {
        Some(f) => f,
        None => text(fbb, "", &None),
    };
    let prompt_name = fbb.create_string(name);
    let description = opt_str(fbb, &r.description);
    let messages = fbb.create_vector(&messages);
    let kvs: Vec<_> = args
        .iter()
        .map(|(k, v)| {
            let key = fbb.create_string(k);
            let value = fbb.create_string(v);
            KeyValue::create(
                fbb,
                &KeyValueArgs {
                    key: Some(key),
                    value: Some(value),
                },
            )
        })
        .collect();
    let argument_values = (!kvs.is_empty()).then(|| fbb.create_vector(&kvs));
    let a = p::AppliedPrompt::create(
        fbb,
        &p::AppliedPromptArgs {
            prompt_name: Some(prompt_name),
            filled_content_type: ft,
            filled_content: Some(fc),
            argument_values,
            description,
            messages: Some(messages),
        },
    );
    out.extend_from_slice(enc.finish(
        to,
        p::ResponsePayload::AppliedPrompt,
        a.as_union_value(),
        true,
    ));
}

/// The meta entry in which a router says how many completion values there
/// are in all (`{"total": N, "hasMore": bool}`, either member optional):
/// the upstream router passes its server's on (the WIT's completion has
/// values only). Not passed on to the client.
pub const COMPLETION_META_KEY: &str = "mcp-broker/completion";

/// `total` and `hasMore` from a router's [`COMPLETION_META_KEY`] entry;
/// `None` without one (or one that does not parse), when the values are
/// all there are.
fn completion_counts(r: &w::CompletionResponse) -> Option<(Option<u32>, bool)> {
    #[derive(serde::Deserialize)]
    struct Counts {
        total: Option<u32>,
        #[serde(rename = "hasMore", default)]
        has_more: bool,
    }
    let entry = r
        .meta
        .iter()
        .flatten()
        .find(|e| e.key == COMPLETION_META_KEY)?;
    let c: Counts = serde_json::from_str(&entry.value).ok()?;
    Some((c.total, c.has_more))
}

/// The answer to a `complete`: the text blocks as values.
pub fn complete_response(
    enc: &mut ResponseEncoder,
    out: &mut Vec<u8>,
    to: &ReplyTo<'_>,
    r: &w::CompletionResponse,
) {
    if r.is_error == Some(true) {
        let msg: Vec<&str> = r.content.iter().filter_map(text_of).collect();
        out.extend_from_slice(enc.error(to, ErrorCode::ExecutionError, &msg.join("\n"), None));
        return;
    }
    let fbb = enc.begin();
    let values: Vec<_> = r
        .content
        .iter()
        .filter_map(text_of)
        .map(|t| fbb.create_string(t))
        .collect();
    let (total, has_more) = completion_counts(r).unwrap_or((Some(values.len() as u32), false));
    let values = fbb.create_vector(&values);
    let c = p::CompleteResult::create(
        fbb,
        &p::CompleteResultArgs {
            values: Some(values),
            total,
            has_more,
        },
    );
    out.extend_from_slice(enc.finish(
        to,
        p::ResponsePayload::CompleteResult,
        c.as_union_value(),
        true,
    ));
}

fn text_of(b: &w::ContentBlock) -> Option<&str> {
    match b {
        w::ContentBlock::Text(t) => Some(&t.text),
        _ => None,
    }
}

/// The wire error for a call that did not produce the router's value.
/// A tool's `execution-error` is not a protocol error: MCP reports it as a
/// ToolResult with `is_error`, so the model sees the message.
/// How a router says that its upstream MCP server failed it (not the tool
/// itself): an execution error whose message starts with this. The
/// `upstream` router words every transport failure so (routers/README.md),
/// and the broker answers it with `UpstreamUnavailable` (-32006).
pub const UPSTREAM_UNAVAILABLE_PREFIX: &str = "upstream unavailable: ";

/// The message of an execution error that reports an upstream failure.
fn upstream_unavailable(e: &CallError) -> Option<&str> {
    let m = match e {
        CallError::Tool(w::ToolError::ExecutionError(m))
        | CallError::Resource(w::ResourceError::ExecutionError(m))
        | CallError::Prompt(w::PromptError::InternalError(m))
        | CallError::Completion(w::CompletionError::ExecutionError(m)) => m,
        _ => return None,
    };
    m.starts_with(UPSTREAM_UNAVAILABLE_PREFIX)
        .then_some(m.as_str())
}

pub fn call_error(
    enc: &mut ResponseEncoder,
    out: &mut Vec<u8>,
    to: &ReplyTo<'_>,
    tool_call_id: Option<&UUID>,
    e: &CallError,
) -> ErrorCode {
    if let Some(m) = upstream_unavailable(e) {
        out.extend_from_slice(enc.error(to, ErrorCode::UpstreamUnavailable, m, None));
        return ErrorCode::UpstreamUnavailable;
    }
    let (code, message): (ErrorCode, String) = match e {
        CallError::Overloaded | CallError::SessionsFull => (ErrorCode::Overloaded, e.to_string()),
        CallError::DeadlineExceeded(_) => (ErrorCode::DeadlineExceeded, e.to_string()),
        CallError::Tool(t) => match t {
            w::ToolError::InvalidParameters(m) | w::ToolError::SchemaError(m) => {
                (ErrorCode::InvalidParams, m.clone())
            }
            w::ToolError::NotFound(m) => (ErrorCode::NotFound, m.clone()),
            w::ToolError::ExecutionError(m) => {
                if let Some(id) = tool_call_id {
                    let fbb = enc.begin();
                    let block = text(fbb, m, &None);
                    let msg = fbb.create_string(m);
                    let err = fb::Error::create(
                        fbb,
                        &fb::ErrorArgs {
                            code: ErrorCode::ExecutionError.code(),
                            message: Some(msg),
                            data: None,
                        },
                    );
                    let res = create_tool_result(
                        fbb,
                        &ToolResultParts {
                            tool_call_id: *id,
                            success: false,
                            content: &[block],
                            error: Some(err),
                            is_error: true,
                            ..Default::default()
                        },
                    );
                    out.extend_from_slice(enc.finish(
                        to,
                        p::ResponsePayload::ToolResult,
                        res.as_union_value(),
                        false,
                    ));
                    return ErrorCode::ExecutionError;
                }
                (ErrorCode::ExecutionError, m.clone())
            }
        },
        CallError::Resource(r) => match r {
            w::ResourceError::NotFound(m) => (ErrorCode::NotFound, m.clone()),
            w::ResourceError::ExecutionError(m) => (ErrorCode::ExecutionError, m.clone()),
        },
        CallError::Prompt(r) => match r {
            w::PromptError::InvalidParameters(m) => (ErrorCode::InvalidParams, m.clone()),
            w::PromptError::NotFound(m) => (ErrorCode::NotFound, m.clone()),
            w::PromptError::InternalError(m) => (ErrorCode::ExecutionError, m.clone()),
        },
        CallError::Completion(r) => match r {
            w::CompletionError::InvalidParameters(m) | w::CompletionError::SchemaError(m) => {
                (ErrorCode::InvalidParams, m.clone())
            }
            w::CompletionError::NotFound(m) => (ErrorCode::NotFound, m.clone()),
            w::CompletionError::ExecutionError(m) => (ErrorCode::ExecutionError, m.clone()),
        },
        // Traps, resource exhaustion, malformed output, instantiation
        // failures: the router is at fault.
        _ => (ErrorCode::RouterFault, e.to_string()),
    };
    out.extend_from_slice(enc.error(to, code, &message, None));
    code
}

/// Why a listing cursor is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BadCursor {
    /// Not one this broker hands out for this listing.
    Invalid,
    /// Handed out for another route table: the listings changed since (a
    /// reload, an upstream's new listing), so its offset would skip or
    /// repeat items.
    Stale,
}

impl BadCursor {
    /// The error message clients get (-32602).
    pub fn message(self) -> &'static str {
        match self {
            BadCursor::Invalid => "invalid cursor",
            BadCursor::Stale => {
                "invalid cursor: the listing changed since it was handed out (a reload or an upstream's change); list again from the start"
            }
        }
    }
}

/// Parses an opaque listing cursor (`"o<offset>.<table>"`) for a listing
/// of `len` items of route table `table` ([`crate::routing::Routing::listing`]).
/// Bad: not of that form, or past the end (a cursor this broker hands out
/// is at most `len`; a table's listing cannot change). Stale: of another
/// table.
pub fn parse_cursor(c: Option<&str>, len: usize, table: u64) -> Result<usize, BadCursor> {
    let Some(c) = c.filter(|c| !c.is_empty()) else {
        return Ok(0);
    };
    let digits = |d: &str| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit());
    // `parse` takes a sign; neither number has one.
    let (offset, of) = c
        .strip_prefix('o')
        .and_then(|c| c.split_once('.'))
        .filter(|(o, t)| digits(o) && digits(t))
        .ok_or(BadCursor::Invalid)?;
    let of: u64 = of.parse().map_err(|_| BadCursor::Invalid)?;
    if of != table {
        return Err(BadCursor::Stale);
    }
    offset
        .parse()
        .ok()
        .filter(|&start| start <= len)
        .ok_or(BadCursor::Invalid)
}

/// Where a listing's page starts and how long it is (`broker.list_page_size`),
/// and the route table its cursors name.
#[derive(Debug, Clone, Copy)]
pub struct Page {
    pub start: usize,
    pub size: usize,
    pub table: u64,
}

fn page<T>(items: &[T], at: Page) -> (&[T], Option<String>) {
    let Page { start, size, table } = at;
    let start = start.min(items.len());
    let end = start.saturating_add(size.max(1)).min(items.len());
    let next = (end < items.len()).then(|| format!("o{end}.{table}"));
    (&items[start..end], next)
}

pub fn list_tools(
    enc: &mut ResponseEncoder,
    out: &mut Vec<u8>,
    to: &ReplyTo<'_>,
    all: &[Listed<w::Tool>],
    at: Page,
) {
    let (items, next) = page(all, at);
    let fbb = enc.begin();
    let tools: Vec<_> = items
        .iter()
        .map(|l| {
            let t = &l.item;
            let name = fbb.create_string(&l.exposed);
            let description = fbb.create_string(&t.description);
            let input_schema = fbb.create_string(&t.input_schema);
            let title = opt_str(fbb, &t.title);
            let output_schema = opt_str(fbb, &t.output_schema);
            let metadata = meta(fbb, &t.meta);
            let annotations = t.annotations.as_ref().map(|a| {
                p::ToolAnnotations::create(
                    fbb,
                    &p::ToolAnnotationsArgs {
                        read_only: a.read_only,
                        destructive: a.destructive,
                        streaming: a.streaming,
                        experimental: a.experimental,
                    },
                )
            });
            p::Tool::create(
                fbb,
                &p::ToolArgs {
                    name: Some(name),
                    description: Some(description),
                    parameters: None,
                    input_schema: Some(input_schema),
                    metadata,
                    title,
                    output_schema,
                    annotations,
                },
            )
        })
        .collect();
    let tools = fbb.create_vector(&tools);
    let next_cursor = opt_str(fbb, &next);
    let r = p::ListToolsResult::create(
        fbb,
        &p::ListToolsResultArgs {
            tools: Some(tools),
            next_cursor,
        },
    );
    out.extend_from_slice(enc.finish(
        to,
        p::ResponsePayload::ListToolsResult,
        r.as_union_value(),
        true,
    ));
}

pub fn list_resources(
    enc: &mut ResponseEncoder,
    out: &mut Vec<u8>,
    to: &ReplyTo<'_>,
    all: &[Listed<w::McpResource>],
    at: Page,
) {
    let (items, next) = page(all, at);
    let fbb = enc.begin();
    let v: Vec<_> = items
        .iter()
        .map(|l| resource_table(fbb, &l.exposed, Some(&l.item)))
        .collect();
    let resources = fbb.create_vector(&v);
    let next_cursor = opt_str(fbb, &next);
    let r = p::ListResourcesResult::create(
        fbb,
        &p::ListResourcesResultArgs {
            resources: Some(resources),
            next_cursor,
        },
    );
    out.extend_from_slice(enc.finish(
        to,
        p::ResponsePayload::ListResourcesResult,
        r.as_union_value(),
        true,
    ));
}

pub fn list_templates(
    enc: &mut ResponseEncoder,
    out: &mut Vec<u8>,
    to: &ReplyTo<'_>,
    all: &[Listed<w::McpResource>],
    at: Page,
) {
    let (items, next) = page(all, at);
    let fbb = enc.begin();
    let v: Vec<_> = items
        .iter()
        .map(|l| {
            let r = &l.item;
            let uri_template = fbb.create_string(&l.exposed);
            let name = fbb.create_string(&r.name);
            let title = opt_str(fbb, &r.title);
            let description = opt_str(fbb, &r.description);
            let mime_type = known_mime(fbb, &r.mime_type);
            let annotations = annotations(fbb, &r.annotations);
            p::ResourceTemplate::create(
                fbb,
                &p::ResourceTemplateArgs {
                    uri_template: Some(uri_template),
                    name: Some(name),
                    title,
                    description,
                    mime_type,
                    annotations,
                },
            )
        })
        .collect();
    let resource_templates = fbb.create_vector(&v);
    let next_cursor = opt_str(fbb, &next);
    let r = p::ListResourceTemplatesResult::create(
        fbb,
        &p::ListResourceTemplatesResultArgs {
            resource_templates: Some(resource_templates),
            next_cursor,
        },
    );
    out.extend_from_slice(enc.finish(
        to,
        p::ResponsePayload::ListResourceTemplatesResult,
        r.as_union_value(),
        true,
    ));
}

pub fn list_prompts(
    enc: &mut ResponseEncoder,
    out: &mut Vec<u8>,
    to: &ReplyTo<'_>,
    all: &[Listed<w::Prompt>],
    at: Page,
) {
    let (items, next) = page(all, at);
    let fbb = enc.begin();
    let v: Vec<_> = items
        .iter()
        .map(|l| {
            let pr = &l.item;
            let name = fbb.create_string(&l.exposed);
            let description = opt_str(fbb, &pr.description);
            // The seed requires `content`; a listed WIT prompt has none, so
            // it carries the description (see schema/README.md, losses).
            let (ct, c) = text(fbb, pr.description.as_deref().unwrap_or(""), &None);
            let arguments = pr.arguments.as_ref().map(|args| {
                let a: Vec<_> = args
                    .iter()
                    .map(|a| {
                        let name = fbb.create_string(&a.name);
                        let description = opt_str(fbb, &a.description);
                        p::PromptArgument::create(
                            fbb,
                            &p::PromptArgumentArgs {
                                name: Some(name),
                                description,
                                required: a.required.unwrap_or(false),
                                default_value: None,
                            },
                        )
                    })
                    .collect();
                fbb.create_vector(&a)
            });
            p::Prompt::create(
                fbb,
                &p::PromptArgs {
                    name: Some(name),
                    description,
                    content_type: ct,
                    content: Some(c),
                    arguments,
                    messages: None,
                    metadata: None,
                },
            )
        })
        .collect();
    let prompts = fbb.create_vector(&v);
    let next_cursor = opt_str(fbb, &next);
    let r = p::ListPromptsResult::create(
        fbb,
        &p::ListPromptsResultArgs {
            prompts: Some(prompts),
            next_cursor,
        },
    );
    out.extend_from_slice(enc.finish(
        to,
        p::ResponsePayload::ListPromptsResult,
        r.as_union_value(),
        true,
    ));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fill(
        template: &str,
        args: &[(&str, &str)],
        budget: usize,
    ) -> Result<String, PromptTooLarge> {
        let mut budget = budget;
        fill_placeholders(template, &PromptArgs::new(args), &mut budget)
    }

    #[test]
    fn placeholders_take_json_strings_unquoted_and_other_json_as_written() {
        assert_eq!(
            fill(
                "Hi {{name}}, you are {{age}}; {{missing}}",
                &[("name", "\"Ada\""), ("age", "36")],
                1 << 20
            )
            .unwrap(),
            "Hi Ada, you are 36; {{missing}}"
        );
    }

    #[test]
    fn inserted_text_is_never_expanded_again() {
        // Each argument refers to the next: one pass inserts `{{b}}` as text.
        let args = [
            ("a", "\"{{b}}{{b}}\""),
            ("b", "\"{{c}}{{c}}\""),
            ("c", "\"x\""),
        ];
        assert_eq!(
            fill("{{a}}|{{b}}", &args, 1 << 20).unwrap(),
            "{{b}}{{b}}|{{c}}{{c}}"
        );
        // The first of a repeated name wins; braces around a name stay.
        let args = [("a", "1"), ("a", "2")];
        assert_eq!(fill("{{{a}}} {{a", &args, 1 << 20).unwrap(), "{1} {{a");
    }

    #[test]
    fn filled_text_past_the_cap_is_refused_before_it_grows() {
        let big = format!("\"{}\"", "x".repeat(1000));
        let args = [("a", big.as_str())];
        let template = "{{a}}".repeat(100);
        assert_eq!(fill(&template, &args, 100_000).unwrap().len(), 100_000);
        assert_eq!(
            fill(&template, &args, 99_999),
            Err(PromptTooLarge { limit: 99_999 })
        );
        // The template's own text counts too.
        assert!(fill(&"y".repeat(11), &[], 10).is_err());
    }

    #[test]
    fn long_brace_runs_fill_in_linear_time() {
        // Scanning to the end for each `{{` would be 10^9 steps here.
        let template = "{{".repeat(50_000) + &"{{é".repeat(1_000);
        let t0 = std::time::Instant::now();
        assert_eq!(fill(&template, &[("a", "1")], 1 << 20).unwrap(), template);
        assert!(t0.elapsed() < std::time::Duration::from_secs(5));
    }

    #[test]
    fn cursors_are_opaque_offsets_and_bad_ones_are_refused() {
        use BadCursor::{Invalid, Stale};
        assert_eq!(parse_cursor(None, 250, 7), Ok(0));
        assert_eq!(parse_cursor(Some(""), 250, 7), Ok(0));
        assert_eq!(parse_cursor(Some("o100.7"), 250, 7), Ok(100));
        assert_eq!(parse_cursor(Some("o250.7"), 250, 7), Ok(250));
        for bad in [
            "100", "o100", "o+1.7", "o1.+7", "o.7", "o1.", "o251.7", "x1.7",
        ] {
            assert_eq!(parse_cursor(Some(bad), 250, 7), Err(Invalid), "{bad}");
        }
        // Another table's: its offset means nothing in this one.
        assert_eq!(parse_cursor(Some("o100.6"), 250, 7), Err(Stale));
        let items: Vec<u32> = (0..250).collect();
        let at = |start, size| Page {
            start,
            size,
            table: 7,
        };
        let (p1, n1) = page(&items, at(0, 100));
        assert_eq!((p1.len(), n1.as_deref()), (100, Some("o100.7")));
        let (p3, n3) = page(&items, at(200, 100));
        assert_eq!((p3.len(), n3), (50, None));
        assert!(page(&items, at(999, 100)).0.is_empty());
        // Another page size (`broker.list_page_size`).
        let (p, n) = page(&items, at(0, 1000));
        assert_eq!((p.len(), n), (250, None));
        let (p, n) = page(&items, at(3, 1));
        assert_eq!((p, n.as_deref()), (&[3][..], Some("o4.7")));
    }

    #[test]
    fn a_cursor_at_the_largest_offset_is_refused_not_overflowed() {
        let max = format!("o{}.1", usize::MAX);
        assert_eq!(parse_cursor(Some(&max), 250, 1), Err(BadCursor::Invalid));
        assert_eq!(
            parse_cursor(Some("o18446744073709551616.1"), 250, 1),
            Err(BadCursor::Invalid)
        );
        assert_eq!(
            parse_cursor(Some("o1.18446744073709551616"), 250, 1),
            Err(BadCursor::Invalid)
        );
        // Even a start no cursor can carry pages without overflow.
        let items: Vec<u32> = (0..250).collect();
        let (p, next) = page(
            &items,
            Page {
                start: usize::MAX,
                size: 100,
                table: 1,
            },
        );
        assert!(p.is_empty() && next.is_none());
    }

    /// What a guest returns is untrusted, and the gRPC and HTTP edges read
    /// the frames built from it without the verifier
    /// (`mcp_schema::verify::built_response`, `content_vec::content_unchecked`):
    /// that is sound only if every frame built here verifies. These build
    /// the answers of any tool result or elicitation a guest can return
    /// (every content kind, annotations, non-finite floats, meta with the
    /// broker's own keys, progress, any Unicode) and verify each frame.
    mod props {
        use super::*;
        use mcp_schema::content_vec::{ContentRef, content};
        use mcp_schema::encode::Correlation;
        use mcp_schema::verify::verify_response;
        use proptest::prelude::*;
        use proptest::string::string_regex;

        fn text() -> impl Strategy<Value = String> {
            string_regex("(?s).{0,24}").unwrap()
        }

        fn opt_text() -> impl Strategy<Value = Option<String>> {
            proptest::option::of(text())
        }

        fn annotations() -> impl Strategy<Value = Option<w::Annotations>> {
            let role = prop_oneof![Just(w::Role::User), Just(w::Role::Assistant)];
            proptest::option::of(
                (
                    proptest::option::of(proptest::collection::vec(role, 0..3)),
                    proptest::option::of(proptest::num::f32::ANY),
                    opt_text(),
                )
                    .prop_map(|(audience, priority, timestamp)| w::Annotations {
                        audience,
                        priority,
                        timestamp,
                    }),
            )
        }

        fn text_content() -> impl Strategy<Value = w::TextContent> {
            (text(), annotations())
                .prop_map(|(text, annotations)| w::TextContent { text, annotations })
        }

        fn image_content() -> impl Strategy<Value = w::ImageContent> {
            (text(), text(), annotations()).prop_map(|(data, mime_type, annotations)| {
                w::ImageContent {
                    data,
                    mime_type,
                    annotations,
                }
            })
        }

        /// Its MIME type sometimes binary, which makes its data a blob.
        fn embedded_resource() -> impl Strategy<Value = w::EmbeddedResource> {
            (
                text(),
                opt_text(),
                opt_text(),
                prop_oneof![
                    opt_text(),
                    Just(Some("application/octet-stream".to_string()))
                ],
                text(),
                annotations(),
            )
                .prop_map(|(uri, title, description, mime_type, data, annotations)| {
                    w::EmbeddedResource {
                        uri,
                        title,
                        description,
                        mime_type,
                        data,
                        annotations,
                    }
                })
        }

        fn block() -> impl Strategy<Value = w::ContentBlock> {
            prop_oneof![
                text_content().prop_map(w::ContentBlock::Text),
                image_content().prop_map(w::ContentBlock::Image),
                (text(), text(), annotations()).prop_map(|(data, mime_type, annotations)| {
                    w::ContentBlock::Audio(w::AudioContent {
                        data,
                        mime_type,
                        annotations,
                    })
                }),
                (text(), opt_text(), opt_text(), opt_text(), annotations()).prop_map(
                    |(uri, title, description, mime_type, annotations)| {
                        w::ContentBlock::ResourceLink(w::ResourceLinkContent {
                            uri,
                            title,
                            description,
                            mime_type,
                            annotations,
                        })
                    }
                ),
                embedded_resource().prop_map(w::ContentBlock::EmbeddedResource),
            ]
        }

        /// Meta entries, the broker's own keys among them: a log entry
        /// whose value is sometimes a valid list of log messages.
        fn meta() -> impl Strategy<Value = Option<Vec<w::MetaEntry>>> {
            let key = prop_oneof![
                text(),
                Just(LOG_META_KEY.to_string()),
                Just(crate::upstream::LIST_CHANGED_META_KEY.to_string()),
            ];
            let value = prop_oneof![
                text(),
                Just(r#"[{"level":"info","logger":"l","data":"x"},{"level":"error","data":{"a":1}}]"#.to_string()),
            ];
            proptest::option::of(proptest::collection::vec(
                (key, value).prop_map(|(key, value)| w::MetaEntry { key, value }),
                0..4,
            ))
        }

        fn response() -> impl Strategy<Value = w::Response> {
            let progress = proptest::option::of(proptest::collection::vec(
                (proptest::option::of(proptest::num::f32::ANY), opt_text()).prop_map(
                    |(progress, message)| w::ProgressNotification {
                        progress,
                        message,
                        annotations: None,
                    },
                ),
                0..3,
            ));
            prop_oneof![
                (
                    proptest::collection::vec(block(), 0..6),
                    opt_text(),
                    progress,
                    meta(),
                    proptest::option::of(any::<bool>()),
                )
                    .prop_map(
                        |(content, structured_content, progress, meta, is_error)| {
                            w::Response::Completed(w::ToolResult {
                                content,
                                structured_content,
                                progress,
                                meta,
                                is_error,
                            })
                        }
                    ),
                (opt_text(), text(), text(), annotations(), meta()).prop_map(
                    |(title, message, schema, annotations, meta)| {
                        w::Response::Elicit(w::ElicitationRequest {
                            title,
                            message,
                            schema,
                            annotations,
                            meta,
                        })
                    }
                ),
            ]
        }

        fn resource_result()
        -> impl Strategy<Value = (w::ReadResourceResult, Option<w::McpResource>)> {
            let contents = prop_oneof![
                (text(), opt_text(), text()).prop_map(|(uri, mime_type, text)| {
                    w::ResourceContents::Text(w::TextResourceContents {
                        uri,
                        mime_type,
                        text,
                    })
                }),
                (text(), opt_text(), text()).prop_map(|(uri, mime_type, blob)| {
                    w::ResourceContents::Blob(w::BlobResourceContents {
                        uri,
                        mime_type,
                        blob,
                    })
                }),
            ];
            let listed = proptest::option::of(
                (
                    text(),
                    text(),
                    opt_text(),
                    opt_text(),
                    text(),
                    annotations(),
                )
                    .prop_map(
                        |(uri, name, title, description, mime_type, annotations)| w::McpResource {
                            uri,
                            name,
                            title,
                            description,
                            mime_type,
                            annotations,
                        },
                    ),
            );
            (proptest::collection::vec(contents, 0..4), listed)
                .prop_map(|(contents, listed)| (w::ReadResourceResult { contents }, listed))
        }

        fn prompt_result() -> impl Strategy<Value = w::GetPromptResult> {
            let role = prop_oneof![
                Just(w::PromptMessageRole::User),
                Just(w::PromptMessageRole::Assistant)
            ];
            let content = prop_oneof![
                text_content().prop_map(w::PromptMessageContent::Text),
                image_content().prop_map(w::PromptMessageContent::Image),
                embedded_resource().prop_map(w::PromptMessageContent::McpResource),
            ];
            (
                opt_text(),
                proptest::collection::vec(
                    (role, content).prop_map(|(role, content)| w::PromptMessage { role, content }),
                    0..4,
                ),
            )
                .prop_map(|(description, messages)| w::GetPromptResult {
                    description,
                    messages,
                })
        }

        fn completion() -> impl Strategy<Value = w::CompletionResponse> {
            (
                proptest::collection::vec(block(), 0..6),
                meta(),
                proptest::option::of(any::<bool>()),
            )
                .prop_map(|(content, meta, is_error)| w::CompletionResponse {
                    content,
                    meta,
                    is_error,
                })
        }

        fn tool() -> impl Strategy<Value = w::Tool> {
            let tool_annotations = proptest::option::of(
                (
                    proptest::option::of(any::<bool>()),
                    proptest::option::of(any::<bool>()),
                    proptest::option::of(any::<bool>()),
                    proptest::option::of(any::<bool>()),
                )
                    .prop_map(
                        |(read_only, destructive, streaming, experimental)| w::ToolAnnotations {
                            read_only,
                            destructive,
                            streaming,
                            experimental,
                        },
                    ),
            );
            (
                (text(), opt_text(), text()),
                (text(), opt_text(), tool_annotations, meta()),
            )
                .prop_map(
                    |(
                        (name, title, description),
                        (input_schema, output_schema, annotations, meta),
                    )| {
                        w::Tool {
                            name,
                            title,
                            description,
                            input_schema,
                            output_schema,
                            annotations,
                            meta,
                        }
                    },
                )
        }

        fn prompt() -> impl Strategy<Value = w::Prompt> {
            let argument = (text(), opt_text(), proptest::option::of(any::<bool>())).prop_map(
                |(name, description, required)| w::PromptArgument {
                    name,
                    description,
                    required,
                },
            );
            (
                text(),
                opt_text(),
                proptest::option::of(proptest::collection::vec(argument, 0..3)),
            )
                .prop_map(|(name, description, arguments)| w::Prompt {
                    name,
                    description,
                    arguments,
                })
        }

        /// `items` as listed by router 0 under names of their own.
        fn listed<T>(items: Vec<(String, T)>) -> Vec<Listed<T>> {
            items
                .into_iter()
                .map(|(exposed, item)| Listed {
                    router: 0,
                    exposed: exposed.into(),
                    item,
                })
                .collect()
        }

        /// Every frame in `out` verifies and answers `to`.
        fn all_verify(out: &[u8]) -> Result<(), TestCaseError> {
            let frames = frames(out);
            prop_assert!(!frames.is_empty());
            for f in &frames {
                let resp = verify_response(f);
                prop_assert!(resp.is_ok(), "{:?}", resp.err());
                let header = resp.unwrap().header();
                prop_assert_eq!(header.correlation_id(), Some("corr"));
                prop_assert_eq!(header.session_id(), Some("sess"));
            }
            Ok(())
        }

        const TO: ReplyTo<'static> = ReplyTo {
            correlation: Correlation::Text("corr"),
            session_id: Some("sess"),
        };

        /// The size-prefixed frames appended to `out`, in order.
        fn frames(out: &[u8]) -> Vec<&[u8]> {
            let mut frames = Vec::new();
            let mut at = 0;
            while at < out.len() {
                let len = u32::from_le_bytes(out[at..at + 4].try_into().unwrap()) as usize;
                frames.push(&out[at..at + 4 + len]);
                at += 4 + len;
            }
            frames
        }

        /// The main text of a block as built, and as read back.
        fn built(b: &w::ContentBlock) -> &str {
            match b {
                w::ContentBlock::Text(t) => &t.text,
                w::ContentBlock::Image(i) => &i.data,
                w::ContentBlock::Audio(a) => &a.data,
                w::ContentBlock::ResourceLink(l) => &l.uri,
                w::ContentBlock::EmbeddedResource(e) => &e.uri,
            }
        }

        fn read<'a>(c: &ContentRef<'a>) -> Option<&'a str> {
            match c {
                ContentRef::Text(t) => Some(t.text()),
                ContentRef::Image(i) => Some(i.data()),
                ContentRef::Audio(a) => Some(a.data()),
                ContentRef::ResourceLink(l) => Some(l.uri()),
                ContentRef::Resource(r) => Some(r.uri()),
                ContentRef::Unknown(_) => None,
            }
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(512))]

            #[test]
            fn every_answer_a_guest_can_return_builds_frames_that_verify(r in response()) {
                let mut enc = ResponseEncoder::new(7);
                let mut out = Vec::new();
                tool_response(&mut enc, &mut out, &TO, &UUID::new(&[9; 16]), &r);
                all_verify(&out)?;
                let frames = frames(&out);
                let last = verify_response(frames.last().unwrap()).unwrap();
                match &r {
                    w::Response::Completed(tr) => {
                        let steps = tr.progress.as_ref().map_or(0, Vec::len);
                        // Progress frames first, then any log frames, then the result.
                        prop_assert!(frames.len() > steps);
                        let res = last.payload_as_tool_result().unwrap();
                        let blocks = content(&res).unwrap();
                        prop_assert_eq!(blocks.len(), tr.content.len());
                        for (got, want) in blocks.iter().zip(&tr.content) {
                            prop_assert_eq!(read(&got), Some(built(want)));
                        }
                        prop_assert_eq!(res.structured_content(), tr.structured_content.as_deref());
                        prop_assert_eq!(res.is_error(), tr.is_error.unwrap_or(false));
                    }
                    w::Response::Elicit(e) => {
                        let el = last.payload_as_elicitation_request().unwrap();
                        prop_assert_eq!(el.message(), e.message.as_str());
                        prop_assert_eq!(el.schema(), e.schema.as_str());
                        prop_assert_eq!(el.title(), e.title.as_deref());
                    }
                }
            }

            #[test]
            fn every_resource_a_guest_can_return_builds_a_frame_that_verifies(
                (r, listed) in resource_result(),
                uri in text(),
            ) {
                let mut enc = ResponseEncoder::new(7);
                let mut out = Vec::new();
                resource_response(&mut enc, &mut out, &TO, &uri, &r, listed.as_ref());
                all_verify(&out)?;
            }

            #[test]
            fn every_prompt_a_guest_can_return_builds_a_frame_that_verifies(
                r in prompt_result(),
                name in text(),
                budget in prop_oneof![Just(1usize << 20), 0usize..64],
            ) {
                let mut enc = ResponseEncoder::new(7);
                let mut out = Vec::new();
                prompt_response(&mut enc, &mut out, &TO, &name, &r, &[("a", "\"x\"")], budget);
                all_verify(&out)?;
            }

            #[test]
            fn every_listing_of_what_guests_describe_builds_frames_that_verify(
                tools in proptest::collection::vec((text(), tool()), 0..5),
                prompts in proptest::collection::vec((text(), prompt()), 0..5),
                resources in proptest::collection::vec((text(), resource_result()), 0..5),
                start in 0usize..6,
                size in 1usize..4,
            ) {
                let at = Page { start, size, table: 1 };
                let mut enc = ResponseEncoder::new(7);
                let mut out = Vec::new();
                list_tools(&mut enc, &mut out, &TO, &listed(tools), at);
                all_verify(&out)?;
                out.clear();
                list_prompts(&mut enc, &mut out, &TO, &listed(prompts), at);
                all_verify(&out)?;
                out.clear();
                let resources = resources
                    .into_iter()
                    .filter_map(|(name, (_, r))| Some((name, r?)))
                    .collect();
                let resources = listed(resources);
                list_resources(&mut enc, &mut out, &TO, &resources, at);
                all_verify(&out)?;
                out.clear();
                list_templates(&mut enc, &mut out, &TO, &resources, at);
                all_verify(&out)?;
            }

            #[test]
            fn every_completion_a_guest_can_return_builds_a_frame_that_verifies(
                r in completion(),
            ) {
                let mut enc = ResponseEncoder::new(7);
                let mut out = Vec::new();
                complete_response(&mut enc, &mut out, &TO, &r);
                all_verify(&out)?;
            }
        }

        /// A resource or template listed without a MIME type (the WIT's
        /// empty string) has none on the wire: it was `"mimeType": ""`.
        #[test]
        fn an_unknown_mime_type_is_left_out_not_empty() {
            let r = |uri: &str, mime: &str| w::McpResource {
                uri: uri.into(),
                name: uri.into(),
                title: None,
                description: None,
                mime_type: mime.into(),
                annotations: None,
            };
            let all = listed(vec![
                ("a".into(), r("a", "")),
                ("b".into(), r("b", "text/plain")),
            ]);
            let at = Page {
                start: 0,
                size: 10,
                table: 1,
            };
            let mut enc = ResponseEncoder::new(7);
            let mut out = Vec::new();
            list_resources(&mut enc, &mut out, &TO, &all, at);
            list_templates(&mut enc, &mut out, &TO, &all, at);
            let frames = frames(&out);
            let resp = verify_response(frames[0]).unwrap();
            let listed = resp.payload_as_list_resources_result().unwrap();
            let mimes: Vec<_> = listed
                .resources()
                .iter()
                .flatten()
                .map(|x| x.mime_type())
                .collect();
            assert_eq!(mimes, [None, Some("text/plain")]);
            let resp = verify_response(frames[1]).unwrap();
            let listed = resp.payload_as_list_resource_templates_result().unwrap();
            let mimes: Vec<_> = listed
                .resource_templates()
                .iter()
                .flatten()
                .map(|x| x.mime_type())
                .collect();
            assert_eq!(mimes, [None, Some("text/plain")]);
        }

        /// A router's counts (the upstream's `total` and `hasMore`) are the
        /// answer's; without them the values are all there are.
        #[test]
        fn completion_counts_come_from_the_routers_meta_entry() {
            let answer = |meta: Option<&str>| {
                let r = w::CompletionResponse {
                    content: vec![w::ContentBlock::Text(w::TextContent {
                        text: "a".into(),
                        annotations: None,
                    })],
                    meta: meta.map(|m| {
                        vec![w::MetaEntry {
                            key: COMPLETION_META_KEY.into(),
                            value: m.into(),
                        }]
                    }),
                    is_error: None,
                };
                let mut enc = ResponseEncoder::new(7);
                let mut out = Vec::new();
                complete_response(&mut enc, &mut out, &TO, &r);
                let resp = verify_response(frames(&out)[0]).unwrap();
                let c = resp.payload_as_complete_result().unwrap();
                (c.total(), c.has_more())
            };
            assert_eq!(answer(None), (Some(1), false));
            assert_eq!(
                answer(Some(r#"{"total":12,"hasMore":true}"#)),
                (Some(12), true)
            );
            assert_eq!(answer(Some(r#"{"hasMore":true}"#)), (None, true));
            assert_eq!(answer(Some("not json")), (Some(1), false));
        }
    }
}
