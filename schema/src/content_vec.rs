//! `ToolResult.content: [Content]`, the seed's vector of unions, by hand.
//!
//! `flatc --rust` refuses vectors of unions, so `scripts/codegen` generates
//! Rust from a copy of the schema in which the field's two slots are
//! declared `deprecated`: slot 2 (`content_type`, a `[ubyte]` of union tags)
//! and slot 3 (`content`, a vector of offsets to the member tables). The wire
//! layout is exactly what `flatc --cpp`/`--ts` produce from the seed; this
//! module reads, verifies and writes those two slots. It is tested against
//! C++ code generated from the seed (`schema/tests/cpp_interop.rs`).

use flatbuffers::{
    FlatBufferBuilder, ForwardsUOffset, InvalidFlatbuffer, Table, UnionWIPOffset, Vector, Verifier,
    WIPOffset,
};

use crate::fb::protocol::{
    AudioContent, Content, ImageContent, ResourceContent, ResourceLinkContent, TextContent,
    ToolResult,
};
use crate::fb::{Error, KeyValue, UUID};
use crate::verify::options_for;

/// vtable offset of slot 2, `content_type: [ubyte]`.
pub const VT_CONTENT_TYPE: flatbuffers::VOffsetT = 8;
/// vtable offset of slot 3, `content: [Content]` (the offsets).
pub const VT_CONTENT: flatbuffers::VOffsetT = 10;

// The generated field after `content` must sit in slot 4; if the schema
// moved, these constants would be wrong.
const _: () = assert!(ToolResult::VT_ERROR == VT_CONTENT + 2);

/// One content block of a ToolResult.
#[derive(Clone, Copy, Debug)]
pub enum ContentRef<'a> {
    Text(TextContent<'a>),
    Image(ImageContent<'a>),
    Resource(ResourceContent<'a>),
    Audio(AudioContent<'a>),
    ResourceLink(ResourceLinkContent<'a>),
    /// A member added by a newer schema; its table was not verified and is
    /// not readable here.
    Unknown(u8),
}

/// The verified content vector of one ToolResult.
#[derive(Clone, Copy, Debug)]
pub struct ContentVec<'a> {
    types: Option<Vector<'a, u8>>,
    values: Option<Vector<'a, ForwardsUOffset<Table<'a>>>>,
}

impl<'a> ContentVec<'a> {
    pub fn len(&self) -> usize {
        self.types.map_or(0, |t| t.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The `i`th block. Panics when `i >= len()`, like slice indexing.
    pub fn get(&self, i: usize) -> ContentRef<'a> {
        let (Some(types), Some(values)) = (self.types, self.values) else {
            panic!("index {i} out of range for an empty content vector");
        };
        let tag = Content(types.get(i));
        let table = values.get(i);
        // SAFETY (each arm): `content()` verified element `i` as the table
        // type its tag names before this value could be constructed.
        unsafe {
            match tag {
                Content::TextContent => ContentRef::Text(TextContent::init_from_table(table)),
                Content::ImageContent => ContentRef::Image(ImageContent::init_from_table(table)),
                Content::ResourceContent => {
                    ContentRef::Resource(ResourceContent::init_from_table(table))
                }
                Content::AudioContent => ContentRef::Audio(AudioContent::init_from_table(table)),
                Content::ResourceLinkContent => {
                    ContentRef::ResourceLink(ResourceLinkContent::init_from_table(table))
                }
                Content(other) => ContentRef::Unknown(other),
            }
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = ContentRef<'a>> + '_ {
        (0..self.len()).map(|i| self.get(i))
    }
}

/// Verifies the two content slots of `tr`: both present or both absent,
/// equal lengths, each element the table its tag names.
pub fn verify(tr: &ToolResult<'_>) -> Result<(), InvalidFlatbuffer> {
    let buf = tr._tab.buf();
    let opts = options_for(buf.len());
    let mut v = Verifier::new(&opts, buf);
    let mut t = v.visit_table(tr._tab.loc())?;
    let types_pos = t.deref(VT_CONTENT_TYPE)?;
    let values_pos = t.deref(VT_CONTENT)?;
    let v = t.verifier();
    let (types_pos, values_pos) = match (types_pos, values_pos) {
        (None, None) => return Ok(()),
        (Some(a), Some(b)) => (a, b),
        _ => {
            return InvalidFlatbuffer::new_inconsistent_union("content_type", "content");
        }
    };
    <ForwardsUOffset<Vector<u8>> as flatbuffers::Verifiable>::run_verifier(v, types_pos)?;
    let types_vec = types_pos.saturating_add(v.get_uoffset(types_pos)? as usize);
    let n = v.get_uoffset(types_vec)? as usize;

    let values_vec = values_pos.saturating_add(v.get_uoffset(values_pos)? as usize);
    let m = v.get_uoffset(values_vec)? as usize;
    if m != n {
        return InvalidFlatbuffer::new_inconsistent_union("content_type", "content");
    }
    v.range_in_buffer(values_vec.saturating_add(4), n.saturating_mul(4))?;
    for i in 0..n {
        let tag = Content(v.get_u8(types_vec + 4 + i)?);
        let elem = values_vec + 4 + 4 * i;
        match tag {
            Content::TextContent => {
                v.verify_union_variant::<ForwardsUOffset<TextContent>>("TextContent", elem)?
            }
            Content::ImageContent => {
                v.verify_union_variant::<ForwardsUOffset<ImageContent>>("ImageContent", elem)?
            }
            Content::ResourceContent => {
                v.verify_union_variant::<ForwardsUOffset<ResourceContent>>("ResourceContent", elem)?
            }
            Content::AudioContent => {
                v.verify_union_variant::<ForwardsUOffset<AudioContent>>("AudioContent", elem)?
            }
            Content::ResourceLinkContent => v
                .verify_union_variant::<ForwardsUOffset<ResourceLinkContent>>(
                    "ResourceLinkContent",
                    elem,
                )?,
            // NONE is not a valid element; unknown tags come from newer
            // schemas and are skipped by readers, as flatc's readers do.
            Content::NONE => {
                return InvalidFlatbuffer::new_inconsistent_union("content_type", "content");
            }
            _ => {
                v.get_uoffset(elem)?;
            }
        }
    }
    Ok(())
}

/// The content blocks of `tr` without checking them again: for a
/// ToolResult of a Response that [`crate::verify::verify_response`]
/// accepted (which verifies this vector) or that
/// [`crate::verify::built_response`] read (an encoder's output). Debug
/// builds check it all the same and panic if it fails.
///
/// # Safety
/// `tr` belongs to such a Response.
pub unsafe fn content_unchecked<'a>(tr: &ToolResult<'a>) -> ContentVec<'a> {
    if cfg!(debug_assertions)
        && let Err(e) = verify(tr)
    {
        panic!("a ToolResult passed as checked has an invalid content vector: {e}");
    }
    // SAFETY: the caller promises a content vector that `verify` accepts
    // (checked above in debug builds).
    unsafe { read(tr) }
}

/// Both content slots as vectors; absent ones are empty.
///
/// # Safety
/// `verify(tr)` passes.
unsafe fn read<'a>(tr: &ToolResult<'a>) -> ContentVec<'a> {
    // SAFETY: the caller's: both slots are verified (vector of u8, and a
    // vector of offsets of the same length whose elements are verified
    // tables).
    unsafe {
        ContentVec {
            types: tr
                ._tab
                .get::<ForwardsUOffset<Vector<u8>>>(VT_CONTENT_TYPE, None),
            values: tr
                ._tab
                .get::<ForwardsUOffset<Vector<ForwardsUOffset<Table>>>>(VT_CONTENT, None),
        }
    }
}

/// The content blocks of `tr`, verified first (so this is safe on any
/// ToolResult, however it was obtained).
pub fn content<'a>(tr: &ToolResult<'a>) -> Result<ContentVec<'a>, InvalidFlatbuffer> {
    verify(tr)?;
    // SAFETY: verified just above.
    Ok(unsafe { read(tr) })
}

/// The fields of a ToolResult, offsets already created in `fbb`.
#[derive(Default)]
pub struct ToolResultParts<'a, 'fbb> {
    pub tool_call_id: UUID,
    pub success: bool,
    /// The content blocks in order: each union tag and its table.
    pub content: &'a [(Content, WIPOffset<UnionWIPOffset>)],
    pub error: Option<WIPOffset<Error<'fbb>>>,
    pub metadata: Option<WIPOffset<Vector<'fbb, ForwardsUOffset<KeyValue<'fbb>>>>>,
    pub execution_time_ms: u32,
    pub structured_content: Option<WIPOffset<&'fbb str>>,
    pub is_error: bool,
}

/// Writes the two content vectors; returns their offsets.
pub fn create_content_vectors<'fbb, A: flatbuffers::Allocator + 'fbb>(
    fbb: &mut FlatBufferBuilder<'fbb, A>,
    content: &[(Content, WIPOffset<UnionWIPOffset>)],
) -> (
    WIPOffset<Vector<'fbb, u8>>,
    WIPOffset<Vector<'fbb, ForwardsUOffset<Table<'fbb>>>>,
) {
    fbb.start_vector::<u8>(content.len());
    for (tag, _) in content.iter().rev() {
        fbb.push(tag.0);
    }
    let types = fbb.end_vector::<u8>(content.len());
    fbb.start_vector::<WIPOffset<UnionWIPOffset>>(content.len());
    for (_, off) in content.iter().rev() {
        fbb.push(*off);
    }
    let values = fbb.end_vector::<WIPOffset<UnionWIPOffset>>(content.len());
    (types, WIPOffset::new(values.value()))
}

/// Builds a ToolResult table including its content vector of unions.
pub fn create_tool_result<'fbb, A: flatbuffers::Allocator + 'fbb>(
    fbb: &mut FlatBufferBuilder<'fbb, A>,
    parts: &ToolResultParts<'_, 'fbb>,
) -> WIPOffset<ToolResult<'fbb>> {
    let vectors = (!parts.content.is_empty()).then(|| create_content_vectors(fbb, parts.content));
    let start = fbb.start_table();
    if let Some(s) = parts.structured_content {
        fbb.push_slot_always(ToolResult::VT_STRUCTURED_CONTENT, s);
    }
    fbb.push_slot::<u32>(ToolResult::VT_EXECUTION_TIME_MS, parts.execution_time_ms, 0);
    if let Some(m) = parts.metadata {
        fbb.push_slot_always(ToolResult::VT_METADATA, m);
    }
    if let Some(e) = parts.error {
        fbb.push_slot_always(ToolResult::VT_ERROR, e);
    }
    if let Some((types, values)) = vectors {
        fbb.push_slot_always(VT_CONTENT, values);
        fbb.push_slot_always(VT_CONTENT_TYPE, types);
    }
    fbb.push_slot_always::<&UUID>(ToolResult::VT_TOOL_CALL_ID, &parts.tool_call_id);
    fbb.push_slot::<bool>(ToolResult::VT_IS_ERROR, parts.is_error, false);
    fbb.push_slot::<bool>(ToolResult::VT_SUCCESS, parts.success, false);
    let end = fbb.end_table(start);
    fbb.required(end, ToolResult::VT_TOOL_CALL_ID, "tool_call_id");
    WIPOffset::new(end.value())
}
