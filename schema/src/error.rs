//! Error codes on the wire and errors of the codec.
//!
//! Every `Error.code` the broker puts on the wire is an [`ErrorCode`]; the
//! table in `schema/README.md` ("Error codes") is the one place they are
//! documented for clients.

use flatbuffers::InvalidFlatbuffer;

/// The `code` of a wire `Error`: the JSON-RPC 2.0 codes MCP uses, plus the
/// broker's own in the implementation-defined server range (-32000..-32099).
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum ErrorCode {
    /// The frame is not a valid FlatBuffer `Request` (failed verification,
    /// a missing required field such as `payload` included).
    ParseError = -32700,
    /// A valid FlatBuffer that is not an acceptable request (a payload of
    /// type `NONE`, a missing routing key, an empty name).
    InvalidRequest = -32600,
    /// No router serves the tool, resource, prompt or request kind asked for.
    NotFound = -32601,
    /// The router refused the arguments.
    InvalidParams = -32602,
    /// A broker bug or an unexpected host failure.
    Internal = -32603,
    /// The router's instances and queue are full: retry later (retryable).
    Overloaded = -32000,
    /// The call ran past its deadline and was stopped (retryable).
    DeadlineExceeded = -32001,
    /// The router trapped, ran out of memory or stack, or returned output
    /// the broker could not use; its instance was replaced (retryable).
    RouterFault = -32002,
    /// The caller is not allowed to make this request.
    Unauthorized = -32003,
    /// The broker is draining and takes no new work (retry elsewhere).
    ShuttingDown = -32004,
    /// The router reported a tool/resource/prompt execution error.
    ExecutionError = -32005,
    /// An upstream router's MCP server could not be reached, refused, or
    /// answered with something unusable (retryable).
    UpstreamUnavailable = -32006,
}

impl ErrorCode {
    /// All codes, for documentation tests and exhaustive mapping checks.
    pub const ALL: [ErrorCode; 12] = [
        ErrorCode::ParseError,
        ErrorCode::InvalidRequest,
        ErrorCode::NotFound,
        ErrorCode::InvalidParams,
        ErrorCode::Internal,
        ErrorCode::Overloaded,
        ErrorCode::DeadlineExceeded,
        ErrorCode::RouterFault,
        ErrorCode::Unauthorized,
        ErrorCode::ShuttingDown,
        ErrorCode::ExecutionError,
        ErrorCode::UpstreamUnavailable,
    ];

    /// The wire value.
    pub const fn code(self) -> i32 {
        self as i32
    }

    /// The code for a wire value, if it is one of ours.
    pub fn from_code(code: i32) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.code() == code)
    }

    /// Whether sending the same request again may succeed.
    pub const fn is_retryable(self) -> bool {
        matches!(
            self,
            ErrorCode::Overloaded
                | ErrorCode::DeadlineExceeded
                | ErrorCode::RouterFault
                | ErrorCode::ShuttingDown
                | ErrorCode::UpstreamUnavailable
        )
    }

    /// A short stable name, used in logs and metric labels.
    pub const fn as_str(self) -> &'static str {
        match self {
            ErrorCode::ParseError => "parse_error",
            ErrorCode::InvalidRequest => "invalid_request",
            ErrorCode::NotFound => "not_found",
            ErrorCode::InvalidParams => "invalid_params",
            ErrorCode::Internal => "internal",
            ErrorCode::Overloaded => "overloaded",
            ErrorCode::DeadlineExceeded => "deadline_exceeded",
            ErrorCode::RouterFault => "router_fault",
            ErrorCode::Unauthorized => "unauthorized",
            ErrorCode::ShuttingDown => "shutting_down",
            ErrorCode::ExecutionError => "execution_error",
            ErrorCode::UpstreamUnavailable => "upstream_unavailable",
        }
    }
}

/// Why a frame could not be taken from the stream or read.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The length prefix announces more than the configured maximum. The
    /// stream cannot be resynchronised: the connection must be closed.
    #[error("frame length {len} exceeds the maximum of {max} bytes")]
    TooLarge { len: u32, max: u32 },
    /// The frame failed FlatBuffers verification as a `Request`.
    #[error("frame is not a valid Request: {0}")]
    Invalid(#[from] InvalidFlatbuffer),
    /// The frame is a valid `Request` that names a payload type this broker
    /// does not know (a newer client).
    #[error("unsupported request payload type {0}")]
    UnsupportedPayload(u8),
    /// The request is well-formed but unusable (e.g. an empty tool name).
    #[error("invalid request: {0}")]
    InvalidRequest(&'static str),
}

impl FrameError {
    /// The wire code a client gets for this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            FrameError::TooLarge { .. } | FrameError::InvalidRequest(_) => {
                ErrorCode::InvalidRequest
            }
            FrameError::Invalid(_) => ErrorCode::ParseError,
            FrameError::UnsupportedPayload(_) => ErrorCode::NotFound,
        }
    }

    /// Whether the connection must be closed (the byte stream can no longer
    /// be split into frames).
    pub fn is_fatal(&self) -> bool {
        matches!(self, FrameError::TooLarge { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_are_distinct() {
        for c in ErrorCode::ALL {
            assert_eq!(ErrorCode::from_code(c.code()), Some(c));
        }
        let mut codes: Vec<i32> = ErrorCode::ALL.iter().map(|c| c.code()).collect();
        codes.sort_unstable();
        codes.dedup();
        assert_eq!(codes.len(), ErrorCode::ALL.len());
    }

    #[test]
    fn json_rpc_codes_keep_their_standard_values() {
        assert_eq!(ErrorCode::ParseError.code(), -32700);
        assert_eq!(ErrorCode::InvalidRequest.code(), -32600);
        assert_eq!(ErrorCode::NotFound.code(), -32601);
        assert_eq!(ErrorCode::InvalidParams.code(), -32602);
        assert_eq!(ErrorCode::Internal.code(), -32603);
    }
}
