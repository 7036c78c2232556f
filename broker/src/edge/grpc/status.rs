//! Wire error codes (`ErrorCode`, schema/README.md "Error codes") → gRPC
//! status codes. Every error status also carries the MCP code in the
//! `mcp-error-code` trailer, so nothing is lost in the mapping.

use mcp_schema::ErrorCode;
use tonic::{Code, Status};

/// Trailer holding the wire error code of a failed call.
pub const ERROR_CODE_METADATA_KEY: &str = "mcp-error-code";

/// The gRPC code a wire error code maps to (table in proto/README.md).
pub fn code_of(code: i32) -> Code {
    match ErrorCode::from_code(code) {
        Some(ErrorCode::NotFound) => Code::NotFound,
        Some(ErrorCode::InvalidParams | ErrorCode::InvalidRequest | ErrorCode::ParseError) => {
            Code::InvalidArgument
        }
        Some(ErrorCode::Overloaded) => Code::ResourceExhausted,
        Some(ErrorCode::DeadlineExceeded) => Code::DeadlineExceeded,
        Some(ErrorCode::RouterFault | ErrorCode::Internal) => Code::Internal,
        Some(ErrorCode::Unauthorized) => Code::PermissionDenied,
        Some(ErrorCode::ShuttingDown | ErrorCode::UpstreamUnavailable) => Code::Unavailable,
        // A router's own execution error (resource, prompt, completion):
        // an error raised in another address space with no better mapping,
        // which is what UNKNOWN means in gRPC.
        Some(ErrorCode::ExecutionError) => Code::Unknown,
        // A code from a newer broker or router.
        _ => Code::Unknown,
    }
}

/// The status for a wire error response.
pub fn from_wire(code: i32, message: &str) -> Status {
    let grpc = code_of(code);
    let message = match ErrorCode::from_code(code) {
        Some(ErrorCode::RouterFault) => format!("router fault: {message}"),
        _ => message.to_string(),
    };
    let message = bounded(message);
    let mut status = Status::new(grpc, message);
    if let Ok(v) = code.to_string().parse() {
        status.metadata_mut().insert(ERROR_CODE_METADATA_KEY, v);
    }
    status
}

/// The most characters of a message a status carries. It travels
/// percent-encoded in the `grpc-message` trailer, up to 12 bytes a
/// character; clients refuse trailers past 8 KiB (grpc's default), and a
/// message that copied a client's 12,000-character tool name turned the
/// NOT_FOUND it explained into RESOURCE_EXHAUSTED.
pub const MAX_MESSAGE_CHARS: usize = 512;

fn bounded(message: String) -> String {
    match message.char_indices().nth(MAX_MESSAGE_CHARS) {
        None => message,
        Some((cut, _)) => format!(
            "{}… (cut at {MAX_MESSAGE_CHARS} characters)",
            &message[..cut]
        ),
    }
}

/// A status for an error the edge detects itself, with the wire code it
/// corresponds to.
pub fn edge(code: ErrorCode, message: impl Into<String>) -> Status {
    from_wire(code.code(), &message.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_messages_are_cut_to_fit_a_trailer() {
        let name = "工".repeat(2000);
        let s = from_wire(
            ErrorCode::NotFound.code(),
            &format!("unknown tool `{name}`"),
        );
        assert_eq!(s.code(), Code::NotFound);
        assert!(
            s.message().chars().count() < MAX_MESSAGE_CHARS + 40,
            "{}",
            s.message().len()
        );
        assert!(s.message().ends_with("(cut at 512 characters)"));
        let short = from_wire(ErrorCode::NotFound.code(), "unknown tool `x`");
        assert_eq!(short.message(), "unknown tool `x`");
    }

    #[test]
    fn every_wire_code_maps_as_documented() {
        let expect = [
            (ErrorCode::ParseError, Code::InvalidArgument),
            (ErrorCode::InvalidRequest, Code::InvalidArgument),
            (ErrorCode::NotFound, Code::NotFound),
            (ErrorCode::InvalidParams, Code::InvalidArgument),
            (ErrorCode::Internal, Code::Internal),
            (ErrorCode::Overloaded, Code::ResourceExhausted),
            (ErrorCode::DeadlineExceeded, Code::DeadlineExceeded),
            (ErrorCode::RouterFault, Code::Internal),
            (ErrorCode::Unauthorized, Code::PermissionDenied),
            (ErrorCode::ShuttingDown, Code::Unavailable),
            (ErrorCode::ExecutionError, Code::Unknown),
            (ErrorCode::UpstreamUnavailable, Code::Unavailable),
        ];
        assert_eq!(expect.len(), ErrorCode::ALL.len());
        for (wire, grpc) in expect {
            let s = from_wire(wire.code(), "m");
            assert_eq!(s.code(), grpc, "{wire:?}");
            assert_eq!(
                s.metadata()
                    .get(ERROR_CODE_METADATA_KEY)
                    .unwrap()
                    .to_str()
                    .unwrap(),
                wire.code().to_string()
            );
        }
        assert!(
            from_wire(ErrorCode::RouterFault.code(), "trap")
                .message()
                .contains("router fault: trap")
        );
    }
}
