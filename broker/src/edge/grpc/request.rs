//! gRPC request messages → Request frames: the pure half of the edge.
//!
//! Everything a router-bound RPC does before its frame is submitted (split
//! the JSON arguments, check the required fields, map enums, encode) lives
//! here, with no I/O, no tonic runtime and nothing else of the broker, so
//! that `fuzz/fuzz_targets/grpc_convert.rs` compiles this very file (by
//! `#[path]`) and fuzzes what the edge runs without building wasmtime.
//!
//! # Invariants
//! - Uses only `mcp_proto`, `mcp_schema`, `serde` and `serde_json`: no
//!   `crate::` or `super::` paths (the fuzz crate includes the file alone).
//! - Every frame built here passes `VerifiedRequest::verify` unless a
//!   routing name is empty (the proto cannot forbid an empty string); the
//!   shard then refuses it as an invalid request. The edge relies on it:
//!   it takes these frames with `VerifiedRequest::from_encoder`, which runs
//!   the verifier only in debug builds.
//! - Arguments reach the frame as serde_json accepted them, one JSON value
//!   each (`RawValue` text, untouched).

use mcp_proto::v1 as pb;
use mcp_schema::ErrorCode;
use mcp_schema::client::{RequestEncoder, RequestHeader};
use mcp_schema::fb::protocol as p;
use serde::de::{Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;

/// Why the edge refuses a call before building its frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub code: ErrorCode,
    pub message: String,
}

impl Refused {
    fn invalid_params(message: impl Into<String>) -> Self {
        Self {
            code: ErrorCode::InvalidParams,
            message: message.into(),
        }
    }
}

/// Longest `mcp-session-id` the edge takes (a hyphenated UUID is 36).
pub const MAX_SESSION_ID_LEN: usize = 256;

/// The `mcp-session-id` metadata value (already checked to be visible
/// ASCII by tonic), refused when empty or too long.
pub fn session_id(v: &str) -> Result<&str, Refused> {
    if v.is_empty() || v.len() > MAX_SESSION_ID_LEN {
        return Err(Refused {
            code: ErrorCode::InvalidRequest,
            message: "mcp-session-id must be 1 to 256 printable ASCII characters".into(),
        });
    }
    Ok(v)
}

/// The members of a JSON arguments object, as (key, JSON text of the value).
pub type Members<'a> = Vec<(String, &'a RawValue)>;

/// Splits a JSON object into its top-level members as (key, JSON text of
/// the value), in order, without re-serialising the values (so numbers and
/// strings reach the router exactly as sent). `None`/empty is `{}`.
pub fn split_object(json: Option<&[u8]>) -> Result<Members<'_>, String> {
    let Some(json) = json.filter(|j| !j.iter().all(u8::is_ascii_whitespace)) else {
        return Ok(Vec::new());
    };
    struct Split;
    impl<'de> Visitor<'de> for Split {
        type Value = Members<'de>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a JSON object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Self::Value, A::Error> {
            let mut out = Vec::with_capacity(m.size_hint().unwrap_or(4));
            while let Some((k, v)) = m.next_entry::<String, &'de RawValue>()? {
                out.push((k, v));
            }
            Ok(out)
        }
    }
    let mut de = serde_json::Deserializer::from_slice(json);
    let members = de
        .deserialize_map(Split)
        .map_err(|e| format!("arguments must be a JSON object: {e}"))?;
    de.end()
        .map_err(|e| format!("arguments must be a JSON object: {e}"))?;
    Ok(members)
}

/// The arguments of a CallTool or GetPrompt, refused unless one JSON object.
pub fn arguments(json: Option<&[u8]>) -> Result<Members<'_>, Refused> {
    split_object(json).map_err(Refused::invalid_params)
}

fn kvs<'a>(members: &'a [(String, &'a RawValue)]) -> Vec<(&'a str, &'a str)> {
    members.iter().map(|(k, v)| (k.as_str(), v.get())).collect()
}

/// MCP protocol version string → the wire enum (unknown → Unspecified,
/// which negotiation answers with the latest supported version).
pub fn version_from_str(v: &str) -> p::ProtocolVersion {
    match v {
        "2024-11-05" => p::ProtocolVersion::V2024_11_05,
        "2025-01-01" => p::ProtocolVersion::V2025_01_01,
        "2025-06-18" => p::ProtocolVersion::V2025_06_18,
        _ => p::ProtocolVersion::Unspecified,
    }
}

/// Proto log level → the wire's coarser one (used for the frame; the edge
/// keeps the exact level for filtering).
pub fn log_level_to_wire(l: pb::LogLevel) -> p::LogLevel {
    use pb::LogLevel as L;
    match l {
        L::Unspecified | L::Debug => p::LogLevel::Debug,
        L::Info => p::LogLevel::Info,
        L::Notice | L::Warning => p::LogLevel::Warning,
        L::Error => p::LogLevel::Error,
        L::Critical | L::Alert | L::Emergency => p::LogLevel::Critical,
    }
}

/// A SetLoggingLevel's level, refused when unspecified or unknown.
pub fn log_level(level: i32) -> Result<pb::LogLevel, Refused> {
    match pb::LogLevel::try_from(level) {
        Ok(pb::LogLevel::Unspecified) | Err(_) => Err(Refused::invalid_params(
            "level must be one of LOG_LEVEL_DEBUG..EMERGENCY",
        )),
        Ok(l) => Ok(l),
    }
}

/// What a Complete names: the kind and name of its reference, and the
/// argument being completed.
pub fn completion_target(
    r: &pb::CompleteRequest,
) -> Result<(p::CompletionRefKind, &str, &pb::CompletionArgument), Refused> {
    use pb::completion_reference::Reference;
    let (kind, name) = match r.r#ref.as_ref().and_then(|x| x.reference.as_ref()) {
        Some(Reference::Prompt(pr)) => (p::CompletionRefKind::Prompt, pr.name.as_str()),
        Some(Reference::Resource(rr)) => (p::CompletionRefKind::Resource, rr.uri.as_str()),
        None => {
            return Err(Refused::invalid_params(
                "`ref` (a prompt or a resource) is required",
            ));
        }
    };
    let arg = r
        .argument
        .as_ref()
        .ok_or_else(|| Refused::invalid_params("`argument` is required"))?;
    Ok((kind, name, arg))
}

/// Initialize's frame.
pub fn initialize<'e>(
    e: &'e mut RequestEncoder,
    h: &RequestHeader<'_>,
    r: &pb::InitializeRequest,
) -> &'e [u8] {
    let (name, ver) = r
        .client_info
        .as_ref()
        .map_or(("", ""), |c| (c.name.as_str(), c.version.as_str()));
    e.initialize(h, version_from_str(&r.protocol_version), name, ver)
}

/// CallTool's frame, its arguments split by [`arguments`].
pub fn tool_call<'e>(
    e: &'e mut RequestEncoder,
    h: &RequestHeader<'_>,
    tool_call_id: [u8; 16],
    name: &str,
    members: &[(String, &RawValue)],
) -> &'e [u8] {
    e.tool_call(h, tool_call_id, name, &kvs(members))
}

/// GetPrompt's frame, its arguments split by [`arguments`].
pub fn get_prompt<'e>(
    e: &'e mut RequestEncoder,
    h: &RequestHeader<'_>,
    name: &str,
    members: &[(String, &RawValue)],
) -> &'e [u8] {
    e.get_prompt(h, name, &kvs(members))
}

/// Complete's frame, its target read by [`completion_target`].
pub fn complete<'e>(
    e: &'e mut RequestEncoder,
    h: &RequestHeader<'_>,
    kind: p::CompletionRefKind,
    name: &str,
    arg: &pb::CompletionArgument,
) -> &'e [u8] {
    // The proto's CompleteRequest has no context: the arguments already
    // chosen do not reach the router from gRPC (proto/README.md).
    e.complete(h, kind, name, &arg.name, &arg.value, &[])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_split_into_members_with_their_json_text_untouched() {
        let m = split_object(Some(
            br#" {"a": 1.50, "b": {"c": [1, "x"]}, "big": 123456789012345678901234567890} "#,
        ))
        .unwrap();
        let got: Vec<_> = m.iter().map(|(k, v)| (k.as_str(), v.get())).collect();
        assert_eq!(
            got,
            [
                ("a", "1.50"),
                ("b", r#"{"c": [1, "x"]}"#),
                ("big", "123456789012345678901234567890")
            ]
        );
        assert!(split_object(None).unwrap().is_empty());
        assert!(split_object(Some(b"  ")).unwrap().is_empty());
    }

    #[test]
    fn arguments_that_are_not_one_json_object_are_refused() {
        for bad in [&b"[1,2]"[..], b"{\"a\":", b"not json", b"{} {}", b"\"s\""] {
            let e = split_object(Some(bad)).unwrap_err();
            assert!(e.contains("JSON object"), "{e}");
        }
    }
}
