//! Bounded lifting of a router's answers (`max_result_bytes`): `call-tool`,
//! `read-resource`, `get-prompt` and `complete`.
//!
//! The generated bindings lift a guest's answer straight into owned host
//! values: every `string` is copied out of linear memory, once per place
//! it is referenced. A guest with 64 MiB of memory can return a million
//! content blocks that all point at one 32 MiB string, and lifting that
//! would copy terabytes. Linear-memory limits bound what the guest holds,
//! not what lifting makes of it, and wasmtime offers no hook between the
//! guest's return and the lift (`TypedFunc` and `Func::call_async` with
//! `Val`s both lift, then run the guest's post-return, which frees the
//! guest's copy).
//!
//! So these exports are called through typed functions whose result types
//! mirror the WIT types with two metered leaves, [`Metered<String>`] and
//! [`Metered<Vec<T>>`]: each reads the length from the canonical-ABI
//! pointer pair (no copy) and charges it against the call's budget before
//! the ordinary lift copies anything. Running out fails the lift with
//! [`ResultTooLarge`], so the host never holds more than the budget (plus
//! the fixed-size parts of the records, which the list charges cover).
//!
//! What a charge is: a string's length in bytes (UTF-8; a UTF-16 guest's
//! length is charged three times, what transcoding may make of it), and a
//! list's length times its host element size.
//!
//! # Invariants
//! - The budget is thread-local and set by [`budgeted`] at every poll of
//!   the call: a lift runs to completion inside one poll (it runs no guest
//!   code and never yields), so no other call's lift can interleave with it
//!   on this shard thread.
//! - The mirror types are checked against the component's own types when
//!   an instance is made (`Func::typed`); a mismatch refuses the instance.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use wasmtime::ValRaw;
use wasmtime::component::__internal::{
    CanonicalAbiInfo, InstanceType, InterfaceType, LiftContext, wasmtime_environ,
};
use wasmtime::component::{ComponentType, Lift};

use super::bindings::types as w;

thread_local! {
    /// Bytes the lift in progress on this thread may still make.
    static REMAINING: Cell<usize> = const { Cell::new(usize::MAX) };
    /// The budget of the call being polled, for the error message.
    static LIMIT: Cell<usize> = const { Cell::new(usize::MAX) };
}

/// A lift stopped because the answer would exceed the router's
/// `max_result_bytes`.
#[derive(Debug)]
pub(crate) struct ResultTooLarge {
    pub(crate) limit: usize,
}

impl std::fmt::Display for ResultTooLarge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "router answer exceeds max_result_bytes ({})", self.limit)
    }
}

impl std::error::Error for ResultTooLarge {}

fn charge(bytes: usize) -> wasmtime::Result<()> {
    REMAINING.with(|r| match r.get().checked_sub(bytes) {
        Some(left) => {
            r.set(left);
            Ok(())
        }
        None => Err(wasmtime::Error::new(ResultTooLarge {
            limit: LIMIT.with(Cell::get),
        })),
    })
}

/// Runs `fut` with the lift budget set to `limit` at every poll (see the
/// module's invariants).
pub(crate) fn budgeted<F: Future>(limit: usize, fut: F) -> Budgeted<F> {
    Budgeted { limit, fut }
}

/// The future of [`budgeted`]: a struct, so that the call's future is held
/// once (an `async fn` would hold it twice, as argument and pinned).
pub(crate) struct Budgeted<F> {
    limit: usize,
    /// Structurally pinned: never moved out of once `Budgeted` is pinned.
    fut: F,
}

impl<F: Future> Future for Budgeted<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        // SAFETY: `fut` is only reached through this projection and
        // `Budgeted` has no `Drop`, so it stays where it was pinned.
        let this = unsafe { self.get_unchecked_mut() };
        let fut = unsafe { Pin::new_unchecked(&mut this.fut) };
        with_budget(this.limit, || fut.poll(cx))
    }
}

/// Runs `f` (a synchronous call, or one poll of an asynchronous one) with
/// the lift budget set to `limit`.
pub(crate) fn with_budget<R>(limit: usize, f: impl FnOnce() -> R) -> R {
    REMAINING.with(|r| r.set(limit));
    LIMIT.with(|l| l.set(limit));
    let r = f();
    // Lifts outside a budgeted call (other exports) stay unlimited.
    REMAINING.with(|r| r.set(usize::MAX));
    r
}

/// A string or list whose lift is charged to the budget before it copies.
pub(crate) struct Metered<T>(pub(crate) T);

/// The length half of a canonical-ABI pointer pair, flat or in memory.
fn flat_len(src: &[ValRaw; 2]) -> usize {
    src[1].get_u32() as usize
}

fn memory_len(bytes: &[u8]) -> usize {
    bytes
        .get(4..8)
        .and_then(|b| <[u8; 4]>::try_from(b).ok())
        .map_or(usize::MAX, |b| u32::from_le_bytes(b) as usize)
}

/// Host bytes a guest string of `len` code units may become.
fn string_cost(cx: &LiftContext<'_>, len: usize) -> usize {
    use wasmtime_environ::component::StringEncoding;
    const UTF16_TAG: usize = 1 << 31;
    match cx.options().string_encoding {
        StringEncoding::Utf8 => len,
        _ => (len & !UTF16_TAG).saturating_mul(3),
    }
}

// SAFETY: every item forwards to `String`'s own implementation, whose
// lowered form (a pointer pair) this wrapper shares.
unsafe impl ComponentType for Metered<String> {
    type Lower = <String as ComponentType>::Lower;
    const ABI: CanonicalAbiInfo = <String as ComponentType>::ABI;

    fn typecheck(ty: &InterfaceType, types: &InstanceType<'_>) -> wasmtime::Result<()> {
        <String as ComponentType>::typecheck(ty, types)
    }
}

// SAFETY: the lift is `String`'s, preceded by a charge that reads only the
// length the canonical ABI already passed.
unsafe impl Lift for Metered<String> {
    fn linear_lift_from_flat(
        cx: &mut LiftContext<'_>,
        ty: InterfaceType,
        src: &Self::Lower,
    ) -> wasmtime::Result<Self> {
        charge(string_cost(cx, flat_len(src)))?;
        String::linear_lift_from_flat(cx, ty, src).map(Metered)
    }

    fn linear_lift_from_memory(
        cx: &mut LiftContext<'_>,
        ty: InterfaceType,
        bytes: &[u8],
    ) -> wasmtime::Result<Self> {
        charge(string_cost(cx, memory_len(bytes)))?;
        String::linear_lift_from_memory(cx, ty, bytes).map(Metered)
    }
}

// SAFETY: as for `Metered<String>`: `Vec<T>`'s implementation, forwarded.
unsafe impl<T: ComponentType> ComponentType for Metered<Vec<T>> {
    type Lower = <Vec<T> as ComponentType>::Lower;
    const ABI: CanonicalAbiInfo = <Vec<T> as ComponentType>::ABI;

    fn typecheck(ty: &InterfaceType, types: &InstanceType<'_>) -> wasmtime::Result<()> {
        <Vec<T> as ComponentType>::typecheck(ty, types)
    }
}

// SAFETY: `Vec<T>`'s lift, preceded by a charge for its host elements.
unsafe impl<T: Lift> Lift for Metered<Vec<T>> {
    fn linear_lift_from_flat(
        cx: &mut LiftContext<'_>,
        ty: InterfaceType,
        src: &Self::Lower,
    ) -> wasmtime::Result<Self> {
        charge(flat_len(src).saturating_mul(size_of::<T>()))?;
        Vec::<T>::linear_lift_from_flat(cx, ty, src).map(Metered)
    }

    fn linear_lift_from_memory(
        cx: &mut LiftContext<'_>,
        ty: InterfaceType,
        bytes: &[u8],
    ) -> wasmtime::Result<Self> {
        charge(memory_len(bytes).saturating_mul(size_of::<T>()))?;
        Vec::<T>::linear_lift_from_memory(cx, ty, bytes).map(Metered)
    }
}

type Str = Metered<String>;
type List<T> = Metered<Vec<T>>;

// The mirror of the WIT types `call-tool` returns. Field and case names are
// the WIT's; `Func::typed` checks them against the component.

#[derive(ComponentType, Lift)]
#[component(record)]
pub(crate) struct Annotations {
    audience: Option<List<w::Role>>,
    priority: Option<f32>,
    timestamp: Option<Str>,
}

#[derive(ComponentType, Lift)]
#[component(record)]
pub(crate) struct MetaEntry {
    key: Str,
    value: Str,
}

#[derive(ComponentType, Lift)]
#[component(record)]
pub(crate) struct ProgressNotification {
    progress: Option<f32>,
    message: Option<Str>,
    annotations: Option<Annotations>,
}

#[derive(ComponentType, Lift)]
#[component(record)]
pub(crate) struct TextContent {
    text: Str,
    annotations: Option<Annotations>,
}

#[derive(ComponentType, Lift)]
#[component(record)]
pub(crate) struct ImageContent {
    data: Str,
    #[component(name = "mime-type")]
    mime_type: Str,
    annotations: Option<Annotations>,
}

#[derive(ComponentType, Lift)]
#[component(record)]
pub(crate) struct AudioContent {
    data: Str,
    #[component(name = "mime-type")]
    mime_type: Str,
    annotations: Option<Annotations>,
}

#[derive(ComponentType, Lift)]
#[component(record)]
pub(crate) struct ResourceLinkContent {
    uri: Str,
    title: Option<Str>,
    description: Option<Str>,
    #[component(name = "mime-type")]
    mime_type: Option<Str>,
    annotations: Option<Annotations>,
}

#[derive(ComponentType, Lift)]
#[component(record)]
pub(crate) struct EmbeddedResource {
    uri: Str,
    title: Option<Str>,
    description: Option<Str>,
    #[component(name = "mime-type")]
    mime_type: Option<Str>,
    data: Str,
    annotations: Option<Annotations>,
}

#[derive(ComponentType, Lift)]
#[component(variant)]
pub(crate) enum ContentBlock {
    #[component(name = "text")]
    Text(TextContent),
    #[component(name = "image")]
    Image(ImageContent),
    #[component(name = "audio")]
    Audio(AudioContent),
    #[component(name = "resource-link")]
    ResourceLink(ResourceLinkContent),
    #[component(name = "embedded-resource")]
    EmbeddedResource(EmbeddedResource),
}

#[derive(ComponentType, Lift)]
#[component(record)]
pub(crate) struct ToolResult {
    content: List<ContentBlock>,
    #[component(name = "structured-content")]
    structured_content: Option<Str>,
    progress: Option<List<ProgressNotification>>,
    meta: Option<List<MetaEntry>>,
    #[component(name = "is-error")]
    is_error: Option<bool>,
}

#[derive(ComponentType, Lift)]
#[component(record)]
pub(crate) struct ElicitationRequest {
    title: Option<Str>,
    message: Str,
    schema: Str,
    annotations: Option<Annotations>,
    meta: Option<List<MetaEntry>>,
}

#[derive(ComponentType, Lift)]
#[component(variant)]
pub(crate) enum Response {
    #[component(name = "completed")]
    Completed(ToolResult),
    #[component(name = "elicit")]
    Elicit(ElicitationRequest),
}

#[derive(ComponentType, Lift)]
#[component(variant)]
pub(crate) enum ToolError {
    #[component(name = "invalid-parameters")]
    InvalidParameters(Str),
    #[component(name = "execution-error")]
    ExecutionError(Str),
    #[component(name = "schema-error")]
    SchemaError(Str),
    #[component(name = "not-found")]
    NotFound(Str),
}

/// `call-tool`'s parameters and results, as the typed function sees them.
pub(crate) type CallToolParams<'a> = (&'a str, &'a str);
pub(crate) type CallToolResults = (Result<Response, ToolError>,);

// Into the generated types: moves, no copies.

fn s(m: Str) -> String {
    m.0
}

fn opt(m: Option<Str>) -> Option<String> {
    m.map(s)
}

fn list<T, U>(m: List<T>, f: impl FnMut(T) -> U) -> Vec<U> {
    m.0.into_iter().map(f).collect()
}

impl From<Annotations> for w::Annotations {
    fn from(a: Annotations) -> Self {
        Self {
            audience: a.audience.map(|r| r.0),
            priority: a.priority,
            timestamp: opt(a.timestamp),
        }
    }
}

fn ann(a: Option<Annotations>) -> Option<w::Annotations> {
    a.map(Into::into)
}

fn meta(m: Option<List<MetaEntry>>) -> Option<Vec<w::MetaEntry>> {
    m.map(|m| {
        list(m, |e| w::MetaEntry {
            key: s(e.key),
            value: s(e.value),
        })
    })
}

impl From<ContentBlock> for w::ContentBlock {
    fn from(b: ContentBlock) -> Self {
        match b {
            ContentBlock::Text(t) => Self::Text(w::TextContent {
                text: s(t.text),
                annotations: ann(t.annotations),
            }),
            ContentBlock::Image(i) => Self::Image(w::ImageContent {
                data: s(i.data),
                mime_type: s(i.mime_type),
                annotations: ann(i.annotations),
            }),
            ContentBlock::Audio(a) => Self::Audio(w::AudioContent {
                data: s(a.data),
                mime_type: s(a.mime_type),
                annotations: ann(a.annotations),
            }),
            ContentBlock::ResourceLink(l) => Self::ResourceLink(w::ResourceLinkContent {
                uri: s(l.uri),
                title: opt(l.title),
                description: opt(l.description),
                mime_type: opt(l.mime_type),
                annotations: ann(l.annotations),
            }),
            ContentBlock::EmbeddedResource(e) => Self::EmbeddedResource(w::EmbeddedResource {
                uri: s(e.uri),
                title: opt(e.title),
                description: opt(e.description),
                mime_type: opt(e.mime_type),
                data: s(e.data),
                annotations: ann(e.annotations),
            }),
        }
    }
}

impl From<Response> for w::Response {
    fn from(r: Response) -> Self {
        match r {
            Response::Completed(t) => Self::Completed(w::ToolResult {
                content: list(t.content, Into::into),
                structured_content: opt(t.structured_content),
                progress: t.progress.map(|p| {
                    list(p, |p| w::ProgressNotification {
                        progress: p.progress,
                        message: opt(p.message),
                        annotations: ann(p.annotations),
                    })
                }),
                meta: meta(t.meta),
                is_error: t.is_error,
            }),
            Response::Elicit(e) => Self::Elicit(w::ElicitationRequest {
                title: opt(e.title),
                message: s(e.message),
                schema: s(e.schema),
                annotations: ann(e.annotations),
                meta: meta(e.meta),
            }),
        }
    }
}

impl From<ToolError> for w::ToolError {
    fn from(e: ToolError) -> Self {
        match e {
            ToolError::InvalidParameters(m) => Self::InvalidParameters(s(m)),
            ToolError::ExecutionError(m) => Self::ExecutionError(s(m)),
            ToolError::SchemaError(m) => Self::SchemaError(s(m)),
            ToolError::NotFound(m) => Self::NotFound(s(m)),
        }
    }
}

// `read-resource`, `get-prompt` and `complete`: the same, for their answers.

#[derive(ComponentType, Lift)]
#[component(record)]
pub(crate) struct TextResourceContents {
    uri: Str,
    #[component(name = "mime-type")]
    mime_type: Option<Str>,
    text: Str,
}

#[derive(ComponentType, Lift)]
#[component(record)]
pub(crate) struct BlobResourceContents {
    uri: Str,
    #[component(name = "mime-type")]
    mime_type: Option<Str>,
    blob: Str,
}

#[derive(ComponentType, Lift)]
#[component(variant)]
pub(crate) enum ResourceContents {
    #[component(name = "text")]
    Text(TextResourceContents),
    #[component(name = "blob")]
    Blob(BlobResourceContents),
}

#[derive(ComponentType, Lift)]
#[component(record)]
pub(crate) struct ReadResourceResult {
    contents: List<ResourceContents>,
}

#[derive(ComponentType, Lift)]
#[component(variant)]
pub(crate) enum ResourceError {
    #[component(name = "execution-error")]
    ExecutionError(Str),
    #[component(name = "not-found")]
    NotFound(Str),
}

#[derive(ComponentType, Lift)]
#[component(variant)]
pub(crate) enum PromptMessageContent {
    #[component(name = "text")]
    Text(TextContent),
    #[component(name = "image")]
    Image(ImageContent),
    #[component(name = "mcp-resource")]
    McpResource(EmbeddedResource),
}

#[derive(ComponentType, Lift)]
#[component(record)]
pub(crate) struct PromptMessage {
    role: w::PromptMessageRole,
    content: PromptMessageContent,
}

#[derive(ComponentType, Lift)]
#[component(record)]
pub(crate) struct GetPromptResult {
    description: Option<Str>,
    messages: List<PromptMessage>,
}

#[derive(ComponentType, Lift)]
#[component(variant)]
pub(crate) enum PromptError {
    #[component(name = "invalid-parameters")]
    InvalidParameters(Str),
    #[component(name = "internal-error")]
    InternalError(Str),
    #[component(name = "not-found")]
    NotFound(Str),
}

#[derive(ComponentType, Lift)]
#[component(record)]
pub(crate) struct CompletionResponse {
    content: List<ContentBlock>,
    meta: Option<List<MetaEntry>>,
    #[component(name = "is-error")]
    is_error: Option<bool>,
}

#[derive(ComponentType, Lift)]
#[component(variant)]
pub(crate) enum CompletionError {
    #[component(name = "invalid-parameters")]
    InvalidParameters(Str),
    #[component(name = "execution-error")]
    ExecutionError(Str),
    #[component(name = "schema-error")]
    SchemaError(Str),
    #[component(name = "not-found")]
    NotFound(Str),
}

pub(crate) type ReadResourceParams<'a> = (&'a str,);
pub(crate) type ReadResourceResults = (Result<ReadResourceResult, ResourceError>,);
pub(crate) type GetPromptParams<'a> = (&'a str,);
pub(crate) type GetPromptResults = (Result<GetPromptResult, PromptError>,);
pub(crate) type CompleteParams<'a> = (&'a w::CompletionRequest,);
pub(crate) type CompleteResults = (Result<CompletionResponse, CompletionError>,);

impl From<ReadResourceResult> for w::ReadResourceResult {
    fn from(r: ReadResourceResult) -> Self {
        Self {
            contents: list(r.contents, |c| match c {
                ResourceContents::Text(t) => w::ResourceContents::Text(w::TextResourceContents {
                    uri: s(t.uri),
                    mime_type: opt(t.mime_type),
                    text: s(t.text),
                }),
                ResourceContents::Blob(b) => w::ResourceContents::Blob(w::BlobResourceContents {
                    uri: s(b.uri),
                    mime_type: opt(b.mime_type),
                    blob: s(b.blob),
                }),
            }),
        }
    }
}

impl From<ResourceError> for w::ResourceError {
    fn from(e: ResourceError) -> Self {
        match e {
            ResourceError::ExecutionError(m) => Self::ExecutionError(s(m)),
            ResourceError::NotFound(m) => Self::NotFound(s(m)),
        }
    }
}

impl From<GetPromptResult> for w::GetPromptResult {
    fn from(r: GetPromptResult) -> Self {
        Self {
            description: opt(r.description),
            messages: list(r.messages, |m| w::PromptMessage {
                role: m.role,
                content: match m.content {
                    PromptMessageContent::Text(t) => {
                        w::PromptMessageContent::Text(w::TextContent {
                            text: s(t.text),
                            annotations: ann(t.annotations),
                        })
                    }
                    PromptMessageContent::Image(i) => {
                        w::PromptMessageContent::Image(w::ImageContent {
                            data: s(i.data),
                            mime_type: s(i.mime_type),
                            annotations: ann(i.annotations),
                        })
                    }
                    PromptMessageContent::McpResource(e) => {
                        w::PromptMessageContent::McpResource(w::EmbeddedResource {
                            uri: s(e.uri),
                            title: opt(e.title),
                            description: opt(e.description),
                            mime_type: opt(e.mime_type),
                            data: s(e.data),
                            annotations: ann(e.annotations),
                        })
                    }
                },
            }),
        }
    }
}

impl From<PromptError> for w::PromptError {
    fn from(e: PromptError) -> Self {
        match e {
            PromptError::InvalidParameters(m) => Self::InvalidParameters(s(m)),
            PromptError::InternalError(m) => Self::InternalError(s(m)),
            PromptError::NotFound(m) => Self::NotFound(s(m)),
        }
    }
}

impl From<CompletionResponse> for w::CompletionResponse {
    fn from(r: CompletionResponse) -> Self {
        Self {
            content: list(r.content, Into::into),
            meta: meta(r.meta),
            is_error: r.is_error,
        }
    }
}

impl From<CompletionError> for w::CompletionError {
    fn from(e: CompletionError) -> Self {
        match e {
            CompletionError::InvalidParameters(m) => Self::InvalidParameters(s(m)),
            CompletionError::ExecutionError(m) => Self::ExecutionError(s(m)),
            CompletionError::SchemaError(m) => Self::SchemaError(s(m)),
            CompletionError::NotFound(m) => Self::NotFound(s(m)),
        }
    }
}
