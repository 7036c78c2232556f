//! Borrowed, allocation-free views of verified `Request` frames.
//!
//! Everything here reads through offsets into the frame: no string is
//! copied, no payload is decoded beyond the few fields routing needs.

use crate::encode::{Correlation, ReplyTo};
use crate::error::FrameError;
use crate::fb::protocol::{CompletionRefKind, MessageHeader, Request, RequestPayload, ToolCall};

/// What a request asks for: one per `RequestPayload` member we serve.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RequestKind {
    CallTool,
    ReadResource,
    GetPrompt,
    Initialize,
    Ping,
    ListTools,
    ListResources,
    ListResourceTemplates,
    ListPrompts,
    Complete,
    SetLogLevel,
    Subscribe,
    Unsubscribe,
}

impl RequestKind {
    /// Every kind, in `RequestPayload` order.
    pub const ALL: [RequestKind; 13] = [
        RequestKind::CallTool,
        RequestKind::ReadResource,
        RequestKind::GetPrompt,
        RequestKind::Initialize,
        RequestKind::Ping,
        RequestKind::ListTools,
        RequestKind::ListResources,
        RequestKind::ListResourceTemplates,
        RequestKind::ListPrompts,
        RequestKind::Complete,
        RequestKind::SetLogLevel,
        RequestKind::Subscribe,
        RequestKind::Unsubscribe,
    ];

    /// A short stable name, used in logs and metric labels.
    pub const fn as_str(self) -> &'static str {
        match self {
            RequestKind::CallTool => "call_tool",
            RequestKind::ReadResource => "read_resource",
            RequestKind::GetPrompt => "get_prompt",
            RequestKind::Initialize => "initialize",
            RequestKind::Ping => "ping",
            RequestKind::ListTools => "list_tools",
            RequestKind::ListResources => "list_resources",
            RequestKind::ListResourceTemplates => "list_resource_templates",
            RequestKind::ListPrompts => "list_prompts",
            RequestKind::Complete => "complete",
            RequestKind::SetLogLevel => "set_log_level",
            RequestKind::Subscribe => "subscribe",
            RequestKind::Unsubscribe => "unsubscribe",
        }
    }

    fn from_payload(t: RequestPayload) -> Option<Self> {
        Some(match t {
            RequestPayload::ToolCall => RequestKind::CallTool,
            RequestPayload::ResourceRequest => RequestKind::ReadResource,
            RequestPayload::PromptRequest => RequestKind::GetPrompt,
            RequestPayload::InitializeRequest => RequestKind::Initialize,
            RequestPayload::PingRequest => RequestKind::Ping,
            RequestPayload::ListToolsRequest => RequestKind::ListTools,
            RequestPayload::ListResourcesRequest => RequestKind::ListResources,
            RequestPayload::ListResourceTemplatesRequest => RequestKind::ListResourceTemplates,
            RequestPayload::ListPromptsRequest => RequestKind::ListPrompts,
            RequestPayload::CompleteRequest => RequestKind::Complete,
            RequestPayload::SetLogLevelRequest => RequestKind::SetLogLevel,
            RequestPayload::SubscribeRequest => RequestKind::Subscribe,
            RequestPayload::UnsubscribeRequest => RequestKind::Unsubscribe,
            _ => return None,
        })
    }
}

/// The key the route table looks up, borrowed from the frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RouteKey<'a> {
    /// `ToolCall.tool_name`.
    Tool(&'a str),
    /// `ResourceRequest.uri`, `SubscribeRequest.uri`, `UnsubscribeRequest.uri`.
    Resource(&'a str),
    /// `PromptRequest.name`.
    Prompt(&'a str),
    /// `CompleteRequest`: the prompt name or resource (template) URI whose
    /// argument is completed.
    Completion {
        kind: CompletionRefKind,
        name: &'a str,
    },
    /// Requests the broker answers itself (initialize, ping, listings, log
    /// level).
    Broker,
}

/// Checks the payload kind and routing key of a verified request.
pub(crate) fn classify<'a>(req: &Request<'a>) -> Result<(RequestKind, RouteKey<'a>), FrameError> {
    let t = req.payload_type();
    let kind = match RequestKind::from_payload(t) {
        Some(k) => k,
        None if t == RequestPayload::NONE => {
            return Err(FrameError::InvalidRequest("request has no payload"));
        }
        None => return Err(FrameError::UnsupportedPayload(t.0)),
    };
    fn named<'s>(s: &'s str, what: &'static str) -> Result<&'s str, FrameError> {
        if s.is_empty() {
            Err(FrameError::InvalidRequest(what))
        } else {
            Ok(s)
        }
    }
    // The `payload_as_*` accessors cannot return None here: the type tag was
    // matched above and the verifier checked the value against it.
    let missing = FrameError::InvalidRequest("payload does not match its type");
    let key = match kind {
        RequestKind::CallTool => {
            let p = req.payload_as_tool_call().ok_or(missing)?;
            RouteKey::Tool(named(p.tool_name(), "empty tool_name")?)
        }
        RequestKind::ReadResource => {
            let p = req.payload_as_resource_request().ok_or(missing)?;
            RouteKey::Resource(named(p.uri(), "empty resource uri")?)
        }
        RequestKind::GetPrompt => {
            let p = req.payload_as_prompt_request().ok_or(missing)?;
            RouteKey::Prompt(named(p.name(), "empty prompt name")?)
        }
        RequestKind::Complete => {
            let p = req.payload_as_complete_request().ok_or(missing)?;
            RouteKey::Completion {
                kind: p.ref_kind(),
                name: named(p.ref_name(), "empty completion ref_name")?,
            }
        }
        RequestKind::Subscribe => {
            let p = req.payload_as_subscribe_request().ok_or(missing)?;
            RouteKey::Resource(named(p.uri(), "empty subscription uri")?)
        }
        RequestKind::Unsubscribe => {
            let p = req.payload_as_unsubscribe_request().ok_or(missing)?;
            RouteKey::Resource(named(p.uri(), "empty subscription uri")?)
        }
        RequestKind::Initialize
        | RequestKind::Ping
        | RequestKind::ListTools
        | RequestKind::ListResources
        | RequestKind::ListResourceTemplates
        | RequestKind::ListPrompts
        | RequestKind::SetLogLevel => RouteKey::Broker,
    };
    Ok((kind, key))
}

/// A verified request, read in place. Obtain one from
/// [`crate::verify::VerifiedRequest::view`].
#[derive(Clone, Copy, Debug)]
pub struct RequestView<'a> {
    req: Request<'a>,
    kind: RequestKind,
    key: RouteKey<'a>,
}

impl<'a> RequestView<'a> {
    pub(crate) fn new(req: Request<'a>, kind: RequestKind, key: RouteKey<'a>) -> Self {
        Self { req, kind, key }
    }

    /// The whole generated accessor, for adapters that read the payload.
    pub fn request(&self) -> Request<'a> {
        self.req
    }

    pub fn header(&self) -> MessageHeader<'a> {
        self.req.header()
    }

    /// `header.message_id`, RFC 9562 byte order.
    pub fn message_id(&self) -> &'a [u8; 16] {
        &self.req.header().message_id().0
    }

    /// `header.correlation_id`, `None` when absent or empty.
    pub fn correlation_id(&self) -> Option<&'a str> {
        self.req.header().correlation_id().filter(|s| !s.is_empty())
    }

    /// `header.session_id`, `None` when absent or empty.
    pub fn session_id(&self) -> Option<&'a str> {
        self.req.header().session_id().filter(|s| !s.is_empty())
    }

    /// `header.timeout_ms` (extension): the client's deadline, if it set one.
    pub fn timeout_ms(&self) -> Option<u32> {
        Some(self.req.header().timeout_ms()).filter(|&t| t > 0)
    }

    pub fn kind(&self) -> RequestKind {
        self.kind
    }

    pub fn route_key(&self) -> RouteKey<'a> {
        self.key
    }

    /// The tool call, when this is one.
    pub fn tool_call(&self) -> Option<ToolCall<'a>> {
        self.req.payload_as_tool_call()
    }

    /// Where the response goes: correlation and session, by the brief's
    /// rule (the request's `correlation_id` when non-empty, else its
    /// `message_id` as a hyphenated UUID).
    pub fn reply_to(&self) -> ReplyTo<'a> {
        reply_to_header(&self.req.header())
    }
}

/// The reply address of any readable header (also for rejected frames).
pub fn reply_to_header<'a>(h: &MessageHeader<'a>) -> ReplyTo<'a> {
    let correlation = match h.correlation_id().filter(|s| !s.is_empty()) {
        Some(c) => Correlation::Text(c),
        None => Correlation::MessageId(h.message_id().0),
    };
    ReplyTo {
        correlation,
        session_id: h.session_id().filter(|s| !s.is_empty()),
    }
}
