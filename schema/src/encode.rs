//! Building Response frames with a reused `FlatBufferBuilder`.
//!
//! One encoder lives per shard (or per connection task). `begin` resets the
//! builder without freeing its buffer, so after warm-up encoding allocates
//! nothing; `finish` writes the header by the correlation rules and returns
//! the size-prefixed bytes, ready to be appended to a write buffer.

use flatbuffers::{FlatBufferBuilder, UnionWIPOffset, WIPOffset};

use crate::content_vec::{ToolResultParts, create_tool_result};
use crate::error::ErrorCode;
use crate::fb::protocol::{
    Content, EmptyResult, EmptyResultArgs, ErrorResponse, ErrorResponseArgs, MessageHeader,
    MessageHeaderArgs, PingResponse, PingResponseArgs, ProtocolVersion, Response, ResponseArgs,
    ResponsePayload, TextContent, TextContentArgs,
};
use crate::fb::{Error, ErrorArgs, Timestamp, UUID};
use crate::uuid::{HYPHENATED_LEN, IdGenerator, format_hyphenated};

/// The newest protocol version this schema speaks; stamped on responses.
pub const LATEST_PROTOCOL_VERSION: ProtocolVersion = ProtocolVersion::V2025_06_18;

/// What a response's `header.correlation_id` will be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Correlation<'a> {
    /// The request's non-empty `correlation_id`, echoed.
    Text(&'a str),
    /// The request had none: its `message_id`, written hyphenated.
    MessageId([u8; 16]),
}

/// Where a response goes: its correlation and the request's session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplyTo<'a> {
    pub correlation: Correlation<'a>,
    pub session_id: Option<&'a str>,
}

impl ReplyTo<'_> {
    /// For a frame whose header could not be read: the response carries an
    /// empty correlation id.
    pub const UNKNOWN: ReplyTo<'static> = ReplyTo {
        correlation: Correlation::Text(""),
        session_id: None,
    };
}

/// Encodes responses into one reused builder.
pub struct ResponseEncoder {
    fbb: FlatBufferBuilder<'static>,
    ids: IdGenerator,
    /// Reused list of a ToolResult's content blocks (tag and table), so that
    /// building one allocates nothing once warm.
    content: Vec<(Content, WIPOffset<UnionWIPOffset>)>,
}

impl std::fmt::Debug for ResponseEncoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseEncoder").finish_non_exhaustive()
    }
}

impl ResponseEncoder {
    /// `seed` distinguishes encoders (e.g. the shard index) in message ids.
    pub fn new(seed: u64) -> Self {
        Self {
            fbb: FlatBufferBuilder::with_capacity(1024),
            ids: IdGenerator::new(seed),
            content: Vec::new(),
        }
    }

    /// Resets the builder for a new response and hands it out to build the
    /// payload table. Call [`Self::finish`] next.
    pub fn begin(&mut self) -> &mut FlatBufferBuilder<'static> {
        self.fbb.reset();
        &mut self.fbb
    }

    /// [`Self::begin`], plus an emptied reusable list to collect a
    /// ToolResult's content blocks in (pass it as
    /// [`crate::content_vec::ToolResultParts::content`]).
    #[allow(clippy::type_complexity)]
    pub fn begin_with_content(
        &mut self,
    ) -> (
        &mut FlatBufferBuilder<'static>,
        &mut Vec<(Content, WIPOffset<UnionWIPOffset>)>,
    ) {
        self.fbb.reset();
        self.content.clear();
        (&mut self.fbb, &mut self.content)
    }

    /// Writes the header and the Response root around `payload` (built since
    /// `begin`) and returns the size-prefixed frame.
    pub fn finish(
        &mut self,
        to: &ReplyTo<'_>,
        payload_type: ResponsePayload,
        payload: WIPOffset<UnionWIPOffset>,
        success: bool,
    ) -> &[u8] {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let message_id = self.ids.next(now.as_millis() as u64);
        let fbb = &mut self.fbb;
        let correlation_id = match to.correlation {
            Correlation::Text(s) => fbb.create_string(s),
            Correlation::MessageId(id) => {
                let mut text = [0u8; HYPHENATED_LEN];
                format_hyphenated(&id, &mut text);
                // Only ASCII hex digits and '-' were written.
                fbb.create_string(std::str::from_utf8(&text).unwrap_or_default())
            }
        };
        let session_id = to.session_id.map(|s| fbb.create_string(s));
        let header = MessageHeader::create(
            fbb,
            &MessageHeaderArgs {
                version: LATEST_PROTOCOL_VERSION,
                message_id: Some(&message_id),
                timestamp: Some(&Timestamp::new(now.as_nanos() as i64)),
                session_id,
                correlation_id: Some(correlation_id),
                timeout_ms: 0,
            },
        );
        let root = Response::create(
            fbb,
            &ResponseArgs {
                header: Some(header),
                payload_type,
                payload: Some(payload),
                success,
            },
        );
        fbb.finish_size_prefixed(root, None);
        fbb.finished_data()
    }

    /// An `ErrorResponse` with `code` and `message` (and optional JSON
    /// `data`).
    pub fn error(
        &mut self,
        to: &ReplyTo<'_>,
        code: ErrorCode,
        message: &str,
        data: Option<&str>,
    ) -> &[u8] {
        let fbb = self.begin();
        let message = fbb.create_string(message);
        let data = data.map(|d| fbb.create_string(d));
        let error = Error::create(
            fbb,
            &ErrorArgs {
                code: code.code(),
                message: Some(message),
                data,
            },
        );
        let payload = ErrorResponse::create(fbb, &ErrorResponseArgs { error: Some(error) });
        self.finish(
            to,
            ResponsePayload::ErrorResponse,
            payload.as_union_value(),
            false,
        )
    }

    /// `PingResponse`.
    pub fn pong(&mut self, to: &ReplyTo<'_>) -> &[u8] {
        let fbb = self.begin();
        let p = PingResponse::create(fbb, &PingResponseArgs {});
        self.finish(to, ResponsePayload::PingResponse, p.as_union_value(), true)
    }

    /// `EmptyResult` (set log level, subscribe, unsubscribe).
    pub fn empty(&mut self, to: &ReplyTo<'_>) -> &[u8] {
        let fbb = self.begin();
        let p = EmptyResult::create(fbb, &EmptyResultArgs {});
        self.finish(to, ResponsePayload::EmptyResult, p.as_union_value(), true)
    }

    /// A ToolResult with one text block and optional structured content:
    /// the common shape of a tool's answer.
    pub fn tool_text(
        &mut self,
        to: &ReplyTo<'_>,
        tool_call_id: &UUID,
        text: &str,
        structured_content: Option<&str>,
        is_error: bool,
    ) -> &[u8] {
        let fbb = self.begin();
        let text = fbb.create_string(text);
        let block = TextContent::create(
            fbb,
            &TextContentArgs {
                text: Some(text),
                annotations: None,
            },
        );
        let structured_content = structured_content.map(|s| fbb.create_string(s));
        let content = [(
            crate::fb::protocol::Content::TextContent,
            block.as_union_value(),
        )];
        let tr = create_tool_result(
            fbb,
            &ToolResultParts {
                tool_call_id: *tool_call_id,
                success: !is_error,
                content: &content,
                structured_content,
                is_error,
                ..Default::default()
            },
        );
        self.finish(
            to,
            ResponsePayload::ToolResult,
            tr.as_union_value(),
            !is_error,
        )
    }
}
