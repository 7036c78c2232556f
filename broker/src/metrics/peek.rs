//! The outcome of a request, read from the final response frame the broker
//! just built for it.
//!
//! Reading the outcome from the bytes the client receives, rather than
//! setting it at each of the many places `dispatch` answers, makes the
//! `outcome` label exactly what the client saw (drain expiry and hand-off
//! failures included) with one hook instead of a dozen.
//!
//! # Invariants
//! - Safe code only: every offset is bounds-checked, so a frame that is not
//!   what we expect yields [`Outcome::OtherError`], never a panic. The
//!   frames are our own encoder's output, so full verification (hundreds of
//!   nanoseconds) would buy nothing on this path.
//! - Allocation-free; a handful of loads.

use mcp_schema::fb;
use mcp_schema::fb::protocol as p;

use super::series::Outcome;

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}
fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// Where field `vt` (a generated `VT_*` constant) of the table at `table`
/// lives, if present.
fn field(b: &[u8], table: usize, vt: u16) -> Option<usize> {
    let soff = u32_at(b, table)? as i32 as i64;
    let vtable = usize::try_from(table as i64 - soff).ok()?;
    let vlen = u16_at(b, vtable)?;
    if vt + 2 > vlen {
        return None;
    }
    match u16_at(b, vtable + vt as usize)? {
        0 => None,
        off => Some(table + off as usize),
    }
}

/// The table an offset field points to.
fn deref(b: &[u8], at: usize) -> Option<usize> {
    at.checked_add(u32_at(b, at)? as usize)
}

/// The last complete size-prefixed frame in `frames` (the final response;
/// progress frames come before it).
fn last_frame(frames: &[u8]) -> Option<&[u8]> {
    let mut pos = 0usize;
    let mut last = None;
    while let Some(n) = u32_at(frames, pos) {
        let body = frames.get(pos + 4..pos + 4 + n as usize)?;
        last = Some(body);
        pos += 4 + n as usize;
    }
    last
}

/// The error code an `Error` table holds.
fn error_code(b: &[u8], error: usize) -> Option<i32> {
    match field(b, error, fb::Error::VT_CODE) {
        Some(at) => Some(u32_at(b, at)? as i32),
        None => Some(0),
    }
}

fn read(frames: &[u8]) -> Option<Outcome> {
    let b = last_frame(frames)?;
    let root = u32_at(b, 0)? as usize;
    let ty = match field(b, root, p::Response::VT_PAYLOAD_TYPE) {
        Some(at) => *b.get(at)?,
        None => 0,
    };
    let payload = deref(b, field(b, root, p::Response::VT_PAYLOAD)?)?;
    if ty == p::ResponsePayload::ErrorResponse.0 {
        let error = deref(b, field(b, payload, p::ErrorResponse::VT_ERROR)?)?;
        return Some(Outcome::from_code(error_code(b, error)?));
    }
    if ty == p::ResponsePayload::ToolResult.0 {
        let is_error = match field(b, payload, p::ToolResult::VT_IS_ERROR) {
            Some(at) => *b.get(at)? != 0,
            None => false,
        };
        if is_error {
            let code = match field(b, payload, p::ToolResult::VT_ERROR) {
                Some(at) => error_code(b, deref(b, at)?)?,
                None => mcp_schema::ErrorCode::ExecutionError.code(),
            };
            return Some(Outcome::from_code(code));
        }
    }
    Some(Outcome::Ok)
}

/// How the request whose response frames are `frames` ended.
pub fn outcome(frames: &[u8]) -> Outcome {
    read(frames).unwrap_or(Outcome::OtherError)
}

#[cfg(test)]
mod tests {
    use super::*;
    use mcp_schema::encode::{Correlation, ReplyTo};
    use mcp_schema::{ErrorCode, ResponseEncoder};

    const TO: ReplyTo<'static> = ReplyTo {
        correlation: Correlation::Text("c-1"),
        session_id: Some("s"),
    };

    #[test]
    fn error_responses_give_their_code_as_the_outcome() {
        let mut enc = ResponseEncoder::new(1);
        for code in ErrorCode::ALL {
            let frame = enc.error(&TO, code, "boom", Some("{}")).to_vec();
            assert_eq!(outcome(&frame), Outcome::from_code(code.code()), "{code:?}");
        }
    }

    #[test]
    fn successes_are_ok_and_the_last_frame_decides() {
        let mut enc = ResponseEncoder::new(1);
        let mut frames = enc.error(&TO, ErrorCode::Internal, "x", None).to_vec();
        frames.extend_from_slice(enc.pong(&TO));
        assert_eq!(outcome(&frames), Outcome::Ok);
        let id = fb::UUID::new(&[7; 16]);
        let ok = enc.tool_text(&TO, &id, "hello", None, false).to_vec();
        assert_eq!(outcome(&ok), Outcome::Ok);
        let failed = enc.tool_text(&TO, &id, "no", None, true).to_vec();
        assert_eq!(outcome(&failed), Outcome::ExecutionError);
    }

    #[test]
    fn garbage_is_an_other_error_not_a_panic() {
        assert_eq!(outcome(&[]), Outcome::OtherError);
        assert_eq!(outcome(&[8, 0, 0, 0, 1, 2]), Outcome::OtherError);
        assert_eq!(
            outcome(&[4, 0, 0, 0, 0xff, 0xff, 0xff, 0x7f]),
            Outcome::OtherError
        );
        let mut enc = ResponseEncoder::new(1);
        let frame = enc.pong(&TO).to_vec();
        for cut in 0..frame.len() {
            let _ = outcome(&frame[..cut]);
        }
        for i in 4..frame.len() {
            let mut f = frame.clone();
            f[i] ^= 0xff;
            let _ = outcome(&f);
        }
    }
}
