//! Bounded verification of frames received from the network.
//!
//! `flatbuffers`' default `VerifierOptions` allow 64 levels, a million tables
//! and 2 GiB of apparent size: far more than a frame of a few kilobytes can
//! legitimately hold. The bounds here are tied to the frame's own size so that
//! a hostile frame (deep nesting, shared sub-objects blowing up the apparent
//! size) costs at most a small multiple of reading its bytes once.

use bytes::Bytes;
use flatbuffers::{ForwardsUOffset, InvalidFlatbuffer, VerifierOptions};

use crate::error::FrameError;
use crate::fb::protocol::{MessageHeader, Request, Response, ResponsePayload};
use crate::split::PREFIX_LEN;
use crate::view::{RequestView, classify};

/// Deepest nesting any message of this schema has is 5 (Response →
/// ResourceData → Resource → KeyValue); 16 leaves room for extensions while
/// still stopping deep-nesting attacks early.
pub const MAX_DEPTH: usize = 16;

/// Smallest size of one table on the wire (its 4-byte vtable offset), which
/// bounds how many distinct tables a frame can hold.
const MIN_TABLE_BYTES: usize = 4;

/// Apparent size may exceed the frame's real size because vtables are shared
/// between tables and re-counted at each visit; 4× covers the worst honest
/// case (many small tables sharing one vtable) with margin.
const APPARENT_SIZE_FACTOR: usize = 4;

/// Verifier options for a buffer of `len` bytes.
pub fn options_for(len: usize) -> VerifierOptions {
    VerifierOptions {
        max_depth: MAX_DEPTH,
        max_tables: (len / MIN_TABLE_BYTES).max(1),
        max_apparent_size: len.saturating_mul(APPARENT_SIZE_FACTOR).max(64),
        ignore_missing_null_terminator: false,
    }
}

/// A frame (length prefix included) that has passed verification as a
/// `Request` and names a payload this broker understands.
///
/// Holding one is the proof that reading the frame through unchecked
/// accessors is sound; it is `Send` and cheap to clone (a `Bytes`), so it can
/// be handed to another shard without copying or verifying again.
#[derive(Clone, Debug)]
pub struct VerifiedRequest {
    frame: Bytes,
    /// Whose session ids the frame's are ([`Self::session_key`]); `None`:
    /// the id is used as it is.
    session_scope: Option<std::sync::Arc<str>>,
}

impl VerifiedRequest {
    /// Verifies `frame` (size prefix included) as a `Request`.
    ///
    /// On error, [`header_of_invalid`] may still recover the header so that
    /// the error can be correlated.
    pub fn verify(frame: Bytes) -> Result<Self, FrameError> {
        let opts = options_for(frame.len());
        let req = flatbuffers::size_prefixed_root_with_opts::<Request>(&opts, &frame)?;
        classify(&req)?;
        Ok(Self {
            frame,
            session_scope: None,
        })
    }

    /// Takes a frame this process built itself with
    /// [`crate::client::RequestEncoder`] (the gRPC and HTTP edges encode
    /// what they parsed) without running the verifier again: its bytes came
    /// out of a `FlatBufferBuilder`, which writes only what the generated
    /// accessors read back. The verifier was 3% of the HTTP edge's CPU per
    /// request (bench/NOTES.md, 2026-12-02). The routing checks still run,
    /// so an empty name is refused as from the network.
    ///
    /// Debug builds verify it all the same and panic if it does not pass,
    /// so every test that sends a request through an edge checks the claim;
    /// `fuzz/fuzz_targets/grpc_convert.rs` and `http_jsonrpc.rs` check it on
    /// fuzzed input.
    ///
    /// # Safety
    /// `frame` holds exactly the bytes one `RequestEncoder` method returned,
    /// unmodified. Frames from anywhere else go through [`Self::verify`].
    pub unsafe fn from_encoder(frame: Bytes) -> Result<Self, FrameError> {
        // The verifier alone, not `Self::verify`: an empty name is a
        // refusal (the classification below), not a broken frame.
        if cfg!(debug_assertions) {
            let opts = options_for(frame.len());
            if let Err(e) = flatbuffers::size_prefixed_root_with_opts::<Request>(&opts, &frame) {
                panic!("a frame built by RequestEncoder fails verification: {e}");
            }
        }
        // SAFETY: the caller promises an encoder's output: a size-prefixed
        // Request as a FlatBufferBuilder finished it.
        let req = unsafe { flatbuffers::size_prefixed_root_unchecked::<Request>(&frame) };
        classify(&req)?;
        Ok(Self {
            frame,
            session_scope: None,
        })
    }

    /// Scopes the frame's session id to `scope` (an authenticated
    /// caller's subject): [`Self::session_key`] is then that id within the
    /// scope, so that a client choosing its session ids reaches neither
    /// another caller's sessions nor those another edge minted.
    pub fn with_session_scope(mut self, scope: std::sync::Arc<str>) -> Self {
        self.session_scope = Some(scope);
        self
    }

    /// The key of the router session `id` names (the header's
    /// `session_id`, from the view the caller holds): the id itself, or
    /// within this request's scope if it has one (`<scope>` U+001F `<id>`,
    /// a separator no id or subject printed in JSON carries raw).
    pub fn session_key<'a>(&self, id: Option<&'a str>) -> Option<std::borrow::Cow<'a, str>> {
        Some(session_key_within(self.session_scope.as_deref(), id?))
    }

    /// The frame, length prefix included.
    pub fn frame(&self) -> &Bytes {
        &self.frame
    }

    /// The borrowed view of the request. Costs a few offset reads.
    pub fn view(&self) -> RequestView<'_> {
        // SAFETY: `self.frame` passed `size_prefixed_root_with_opts::<Request>`
        // in `verify`, and `Bytes` is immutable, so the buffer still holds a
        // verified Request.
        let req = unsafe { flatbuffers::size_prefixed_root_unchecked::<Request>(&self.frame) };
        match classify(&req) {
            Ok((kind, key)) => RequestView::new(req, kind, key),
            // `verify` ran the same classification on the same bytes.
            Err(_) => unreachable!("a verified request classifies"),
        }
    }
}

/// The router session key of session `id` within `scope` (see
/// [`VerifiedRequest::session_key`]): for an edge that must name the
/// instance a request of its own would reach (a subscriber's, told only of
/// its own state's updates) without holding such a request.
pub fn session_key_within<'a>(scope: Option<&str>, id: &'a str) -> std::borrow::Cow<'a, str> {
    match scope {
        None => std::borrow::Cow::Borrowed(id),
        Some(scope) => std::borrow::Cow::Owned(format!("{scope}\u{1f}{id}")),
    }
}

/// Reads a Response frame this process built itself with
/// [`crate::encode::ResponseEncoder`] (what dispatch answers into an edge's
/// buffer) without running the verifier again, as
/// [`VerifiedRequest::from_encoder`] does for requests; the edges that turn
/// answers into proto or JSON read every final frame. Debug builds verify
/// it all the same (the hand-written `ToolResult.content` included) and
/// panic if it does not pass.
///
/// # Safety
/// `frame` holds exactly the bytes one `ResponseEncoder` method returned,
/// unmodified. Frames from anywhere else go through [`verify_response`].
pub unsafe fn built_response(frame: &[u8]) -> Response<'_> {
    if cfg!(debug_assertions)
        && let Err(e) = verify_response(frame)
    {
        panic!("a frame built by ResponseEncoder fails verification: {e}");
    }
    // SAFETY: the caller promises an encoder's output.
    unsafe { flatbuffers::size_prefixed_root_unchecked::<Response>(frame) }
}

/// Reads the header of a frame that failed verification, if the header
/// itself (and the root table holding it) is sound, so that the error
/// response can carry the request's correlation id.
pub fn header_of_invalid(frame: &[u8]) -> Option<MessageHeader<'_>> {
    let opts = options_for(frame.len());
    let mut v = flatbuffers::Verifier::new(&opts, frame);
    let root = root_table_pos(&mut v).ok()?;
    let t = v.visit_table(root).ok()?;
    t.visit_field::<ForwardsUOffset<MessageHeader>>("header", Request::VT_HEADER, true)
        .ok()?;
    // SAFETY: the root table and its header field, deeply, were verified just
    // above; only the header is read.
    let req = unsafe { flatbuffers::size_prefixed_root_unchecked::<Request>(frame) };
    Some(req.header())
}

/// Verifies a size-prefixed `Response` frame (as a client reads one),
/// including the hand-written `ToolResult.content` vector of unions.
pub fn verify_response(frame: &[u8]) -> Result<Response<'_>, InvalidFlatbuffer> {
    let opts = options_for(frame.len());
    let resp = flatbuffers::size_prefixed_root_with_opts::<Response>(&opts, frame)?;
    if let Some(tr) = resp.payload_as_tool_result() {
        crate::content_vec::verify(&tr)?;
    }
    Ok(resp)
}

/// The payload type of a size-prefixed `Response` frame, verifying only the
/// root table and that one field: what sorting a call's frames (progress,
/// log, final answer) needs, without a second deep verification of the
/// frame that [`verify_response`] checks again where it is written out.
pub fn response_payload_type(frame: &[u8]) -> Result<ResponsePayload, InvalidFlatbuffer> {
    let opts = options_for(frame.len());
    let mut v = flatbuffers::Verifier::new(&opts, frame);
    let root = root_table_pos(&mut v)?;
    v.visit_table(root)?.visit_field::<ResponsePayload>(
        "payload_type",
        Response::VT_PAYLOAD_TYPE,
        false,
    )?;
    // SAFETY: the root table (its vtable included) and its `payload_type`
    // field were verified just above; only that field is read.
    let resp = unsafe { flatbuffers::size_prefixed_root_unchecked::<Response>(frame) };
    Ok(resp.payload_type())
}

/// The position of the root table of a size-prefixed buffer: the root
/// offset sits right after the 4-byte prefix and is relative to itself.
fn root_table_pos(v: &mut flatbuffers::Verifier) -> Result<usize, InvalidFlatbuffer> {
    let off = v.get_uoffset(PREFIX_LEN)? as usize;
    Ok(PREFIX_LEN.saturating_add(off))
}
