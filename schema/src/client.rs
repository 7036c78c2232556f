//! The client side of the wire: building Request frames and reading
//! Response frames. Used by the load generator, the tests and the gRPC edge
//! (which turns each RPC into a Request frame for the shards).

use flatbuffers::{FlatBufferBuilder, ForwardsUOffset, UnionWIPOffset, Vector, WIPOffset};

use crate::fb::protocol::{
    ClientCapabilities, ClientCapabilitiesArgs, CompleteRequest, CompleteRequestArgs,
    CompletionRefKind, InitializeRequest, InitializeRequestArgs, ListPromptsRequest,
    ListPromptsRequestArgs, ListResourceTemplatesRequest, ListResourceTemplatesRequestArgs,
    ListResourcesRequest, ListResourcesRequestArgs, ListToolsRequest, ListToolsRequestArgs,
    LogLevel, MessageHeader, MessageHeaderArgs, PingRequest, PingRequestArgs, PromptRequest,
    PromptRequestArgs, ProtocolVersion, Request, RequestArgs, RequestPayload, ResourceRequest,
    ResourceRequestArgs, Response, ResponsePayload, SetLogLevelRequest, SetLogLevelRequestArgs,
    SubscribeRequest, SubscribeRequestArgs, ToolCall, ToolCallArgs, UnsubscribeRequest,
    UnsubscribeRequestArgs,
};
use crate::fb::{KeyValue, KeyValueArgs, Timestamp, UUID};

/// Header fields of a request being built.
#[derive(Clone, Copy, Debug, Default)]
pub struct RequestHeader<'a> {
    pub message_id: [u8; 16],
    pub correlation_id: Option<&'a str>,
    pub session_id: Option<&'a str>,
    /// Client-side deadline (extension); 0 = the broker's default.
    pub timeout_ms: u32,
    pub unix_nanos: i64,
}

/// Builds Request frames into one reused builder.
pub struct RequestEncoder {
    fbb: FlatBufferBuilder<'static>,
    scratch: Vec<WIPOffset<KeyValue<'static>>>,
}

impl std::fmt::Debug for RequestEncoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestEncoder").finish_non_exhaustive()
    }
}

impl Default for RequestEncoder {
    fn default() -> Self {
        Self {
            fbb: FlatBufferBuilder::with_capacity(1024),
            scratch: Vec::new(),
        }
    }
}

type KeyValues<'f> = WIPOffset<Vector<'f, ForwardsUOffset<KeyValue<'f>>>>;

/// Builds a `[KeyValue]` vector. The tables must exist before the vector
/// that points at them, so their offsets are collected in `scratch` (reused:
/// no allocation once it has grown).
fn key_values<'f>(
    fbb: &mut FlatBufferBuilder<'f>,
    scratch: &mut Vec<WIPOffset<KeyValue<'static>>>,
    kvs: &[(&str, &str)],
) -> KeyValues<'f> {
    scratch.clear();
    for (k, v) in kvs {
        let key = fbb.create_string(k);
        let value = fbb.create_string(v);
        let kv = KeyValue::create(
            fbb,
            &KeyValueArgs {
                key: Some(key),
                value: Some(value),
            },
        );
        scratch.push(WIPOffset::new(kv.value()));
    }
    fbb.start_vector::<WIPOffset<KeyValue>>(scratch.len());
    for kv in scratch.iter().rev() {
        fbb.push(*kv);
    }
    fbb.end_vector(scratch.len())
}

impl RequestEncoder {
    pub fn new() -> Self {
        Self::default()
    }

    fn finish(
        &mut self,
        h: &RequestHeader<'_>,
        payload_type: RequestPayload,
        payload: WIPOffset<UnionWIPOffset>,
    ) -> &[u8] {
        let fbb = &mut self.fbb;
        let correlation_id = h.correlation_id.map(|s| fbb.create_string(s));
        let session_id = h.session_id.map(|s| fbb.create_string(s));
        let header = MessageHeader::create(
            fbb,
            &MessageHeaderArgs {
                version: ProtocolVersion::V2025_06_18,
                message_id: Some(&UUID::new(&h.message_id)),
                timestamp: Some(&Timestamp::new(h.unix_nanos)),
                session_id,
                correlation_id,
                timeout_ms: h.timeout_ms,
            },
        );
        let root = Request::create(
            fbb,
            &RequestArgs {
                header: Some(header),
                payload_type,
                payload: Some(payload),
            },
        );
        fbb.finish_size_prefixed(root, None);
        fbb.finished_data()
    }

    /// A `ToolCall` with `tool_call_id` and arguments given as (key, JSON
    /// text) pairs.
    pub fn tool_call(
        &mut self,
        h: &RequestHeader<'_>,
        tool_call_id: [u8; 16],
        tool_name: &str,
        args: &[(&str, &str)],
    ) -> &[u8] {
        self.fbb.reset();
        let fbb = &mut self.fbb;
        let name = fbb.create_string(tool_name);
        let arguments = key_values(fbb, &mut self.scratch, args);
        let p = ToolCall::create(
            fbb,
            &ToolCallArgs {
                id: Some(&UUID::new(&tool_call_id)),
                tool_name: Some(name),
                arguments: Some(arguments),
                timestamp: Some(&Timestamp::new(h.unix_nanos)),
            },
        );
        self.finish(h, RequestPayload::ToolCall, p.as_union_value())
    }

    /// A `ResourceRequest` (read resource).
    pub fn read_resource(&mut self, h: &RequestHeader<'_>, uri: &str) -> &[u8] {
        self.fbb.reset();
        let uri = self.fbb.create_string(uri);
        let p = ResourceRequest::create(
            &mut self.fbb,
            &ResourceRequestArgs {
                uri: Some(uri),
                range_start: 0,
                range_end: 0,
            },
        );
        self.finish(h, RequestPayload::ResourceRequest, p.as_union_value())
    }

    /// A `PromptRequest` (get prompt) with (name, JSON text) arguments.
    pub fn get_prompt(
        &mut self,
        h: &RequestHeader<'_>,
        name: &str,
        args: &[(&str, &str)],
    ) -> &[u8] {
        self.fbb.reset();
        let fbb = &mut self.fbb;
        let name = fbb.create_string(name);
        let arguments = (!args.is_empty()).then(|| key_values(fbb, &mut self.scratch, args));
        let p = PromptRequest::create(
            fbb,
            &PromptRequestArgs {
                name: Some(name),
                arguments,
            },
        );
        self.finish(h, RequestPayload::PromptRequest, p.as_union_value())
    }

    /// An `InitializeRequest` announcing `version`.
    pub fn initialize(
        &mut self,
        h: &RequestHeader<'_>,
        version: ProtocolVersion,
        client_name: &str,
        client_version: &str,
    ) -> &[u8] {
        self.initialize_with_token(h, version, client_name, client_version, None)
    }

    /// [`Self::initialize`] carrying the connection's bearer token (a
    /// broker running `[auth]` answers nothing else but ping without one).
    pub fn initialize_with_token(
        &mut self,
        h: &RequestHeader<'_>,
        version: ProtocolVersion,
        client_name: &str,
        client_version: &str,
        auth_token: Option<&str>,
    ) -> &[u8] {
        self.fbb.reset();
        let fbb = &mut self.fbb;
        let auth_token = auth_token.map(|t| fbb.create_string(t));
        let client_name = fbb.create_string(client_name);
        let client_version = fbb.create_string(client_version);
        let caps = ClientCapabilities::create(
            fbb,
            &ClientCapabilitiesArgs {
                supports_tools: true,
                supports_resources: true,
                supports_prompts: true,
                protocol_version: version,
                client_name: Some(client_name),
                client_version: Some(client_version),
            },
        );
        let p = InitializeRequest::create(
            fbb,
            &InitializeRequestArgs {
                client_capabilities: Some(caps),
                client_info: None,
                auth_token,
            },
        );
        self.finish(h, RequestPayload::InitializeRequest, p.as_union_value())
    }

    /// A `PingRequest`.
    pub fn ping(&mut self, h: &RequestHeader<'_>) -> &[u8] {
        self.fbb.reset();
        let p = PingRequest::create(&mut self.fbb, &PingRequestArgs {});
        self.finish(h, RequestPayload::PingRequest, p.as_union_value())
    }

    /// A listing request of `what` kind, continuing from `cursor`.
    pub fn list(&mut self, h: &RequestHeader<'_>, what: Listing, cursor: Option<&str>) -> &[u8] {
        self.fbb.reset();
        let fbb = &mut self.fbb;
        let cursor = cursor.map(|c| fbb.create_string(c));
        let (t, p) = match what {
            Listing::Tools => (
                RequestPayload::ListToolsRequest,
                ListToolsRequest::create(fbb, &ListToolsRequestArgs { cursor }).as_union_value(),
            ),
            Listing::Resources => (
                RequestPayload::ListResourcesRequest,
                ListResourcesRequest::create(fbb, &ListResourcesRequestArgs { cursor })
                    .as_union_value(),
            ),
            Listing::ResourceTemplates => (
                RequestPayload::ListResourceTemplatesRequest,
                ListResourceTemplatesRequest::create(
                    fbb,
                    &ListResourceTemplatesRequestArgs { cursor },
                )
                .as_union_value(),
            ),
            Listing::Prompts => (
                RequestPayload::ListPromptsRequest,
                ListPromptsRequest::create(fbb, &ListPromptsRequestArgs { cursor })
                    .as_union_value(),
            ),
        };
        self.finish(h, t, p)
    }

    /// A `CompleteRequest` for `argument_name` of a prompt or resource
    /// template.
    pub fn complete(
        &mut self,
        h: &RequestHeader<'_>,
        ref_kind: CompletionRefKind,
        ref_name: &str,
        argument_name: &str,
        argument_value: &str,
        context: &[(&str, &str)],
    ) -> &[u8] {
        self.fbb.reset();
        let fbb = &mut self.fbb;
        let ref_name = fbb.create_string(ref_name);
        let argument_name = fbb.create_string(argument_name);
        let argument_value = fbb.create_string(argument_value);
        let context = (!context.is_empty()).then(|| key_values(fbb, &mut self.scratch, context));
        let p = CompleteRequest::create(
            fbb,
            &CompleteRequestArgs {
                ref_kind,
                ref_name: Some(ref_name),
                argument_name: Some(argument_name),
                argument_value: Some(argument_value),
                context,
            },
        );
        self.finish(h, RequestPayload::CompleteRequest, p.as_union_value())
    }

    /// A `SetLogLevelRequest`.
    pub fn set_log_level(&mut self, h: &RequestHeader<'_>, level: LogLevel) -> &[u8] {
        self.fbb.reset();
        let p = SetLogLevelRequest::create(&mut self.fbb, &SetLogLevelRequestArgs { level });
        self.finish(h, RequestPayload::SetLogLevelRequest, p.as_union_value())
    }

    /// A `SubscribeRequest` (or, with `subscribe = false`, an
    /// `UnsubscribeRequest`) for `uri`.
    pub fn subscribe(&mut self, h: &RequestHeader<'_>, uri: &str, subscribe: bool) -> &[u8] {
        self.fbb.reset();
        let uri = self.fbb.create_string(uri);
        let (t, p) = if subscribe {
            (
                RequestPayload::SubscribeRequest,
                SubscribeRequest::create(&mut self.fbb, &SubscribeRequestArgs { uri: Some(uri) })
                    .as_union_value(),
            )
        } else {
            (
                RequestPayload::UnsubscribeRequest,
                UnsubscribeRequest::create(
                    &mut self.fbb,
                    &UnsubscribeRequestArgs { uri: Some(uri) },
                )
                .as_union_value(),
            )
        };
        self.finish(h, t, p)
    }
}

/// Which list a listing request asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Listing {
    Tools,
    Resources,
    ResourceTemplates,
    Prompts,
}

/// The parts of a verified Response a client checks first.
#[derive(Clone, Copy, Debug)]
pub struct ResponseView<'a> {
    pub response: Response<'a>,
}

impl<'a> ResponseView<'a> {
    /// Verifies a size-prefixed Response frame (vector of unions included).
    pub fn parse(frame: &'a [u8]) -> Result<Self, flatbuffers::InvalidFlatbuffer> {
        crate::verify::verify_response(frame).map(|response| Self { response })
    }

    pub fn correlation_id(&self) -> &'a str {
        self.response.header().correlation_id().unwrap_or_default()
    }

    pub fn payload_type(&self) -> ResponsePayload {
        self.response.payload_type()
    }

    /// `(code, message)` when this is an ErrorResponse.
    pub fn error(&self) -> Option<(i32, &'a str)> {
        self.response
            .payload_as_error_response()
            .map(|e| (e.error().code(), e.error().message()))
    }

    /// Whether this is a `ToolResult` with `is_error`: the tool ran and
    /// failed (MCP's `isError`), an answer but no success.
    pub fn is_tool_error(&self) -> bool {
        self.response
            .payload_as_tool_result()
            .is_some_and(|t| t.is_error())
    }

    /// Whether this response ends its request (progress and log
    /// notifications do not).
    pub fn is_final(&self) -> bool {
        !matches!(
            self.payload_type(),
            ResponsePayload::ProgressNotification
                | ResponsePayload::LogMessage
                | ResponsePayload::ResourceUpdatedNotification
                | ResponsePayload::ListChangedNotification
        )
    }
}
