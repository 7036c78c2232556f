//! Splitting a byte stream into size-prefixed frames, without copying.
//!
//! A frame is a little-endian `u32` length N followed by N bytes of
//! FlatBuffer: exactly the FlatBuffers size-prefixed layout. The splitter
//! hands out each frame, prefix included, as a [`Bytes`] view of the receive
//! buffer (`BytesMut::split_to` + `freeze`: a reference count, not a copy), so
//! it can be verified in place and cross threads without being copied.

use bytes::{Bytes, BytesMut};

use crate::error::FrameError;

/// Default largest frame body accepted: 4 MiB.
///
/// Large enough for any tool call a person or an agent writes by hand, small
/// enough that a peer cannot make a shard reserve much memory per connection.
pub const DEFAULT_MAX_FRAME_LEN: u32 = 4 * 1024 * 1024;

/// Size of the length prefix.
pub const PREFIX_LEN: usize = 4;

/// Incremental frame splitter over a connection's receive buffer.
#[derive(Debug, Clone, Copy)]
pub struct FrameSplitter {
    max_frame_len: u32,
}

impl Default for FrameSplitter {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_FRAME_LEN)
    }
}

impl FrameSplitter {
    /// A splitter rejecting frame bodies longer than `max_frame_len` bytes.
    pub const fn new(max_frame_len: u32) -> Self {
        Self { max_frame_len }
    }

    /// The configured maximum body length.
    pub const fn max_frame_len(&self) -> u32 {
        self.max_frame_len
    }

    /// Reads the length prefix at the start of `buf`, if there is one, and
    /// checks it against the maximum.
    pub fn peek_len(&self, buf: &[u8]) -> Result<Option<u32>, FrameError> {
        let Some(prefix) = buf.first_chunk::<PREFIX_LEN>() else {
            return Ok(None);
        };
        let len = u32::from_le_bytes(*prefix);
        if len > self.max_frame_len {
            return Err(FrameError::TooLarge {
                len,
                max: self.max_frame_len,
            });
        }
        Ok(Some(len))
    }

    /// Takes the next complete frame (prefix and body) off the front of
    /// `buf`. Returns `Ok(None)` when more bytes are needed; in that case
    /// `buf` has room reserved for the rest of the announced frame, which is
    /// at most the configured maximum. An oversized prefix is an error before
    /// anything is reserved; the stream is then unusable.
    pub fn next_frame(&self, buf: &mut BytesMut) -> Result<Option<Bytes>, FrameError> {
        let Some(len) = self.peek_len(buf)? else {
            return Ok(None);
        };
        let total = PREFIX_LEN + len as usize;
        if buf.len() < total {
            buf.reserve(total - buf.len());
            return Ok(None);
        }
        Ok(Some(buf.split_to(total).freeze()))
    }

    /// Bytes still needed to complete the frame at the front of `buf` (0 if
    /// it is complete). Lets a reader size its next read.
    pub fn missing(&self, buf: &[u8]) -> Result<usize, FrameError> {
        Ok(match self.peek_len(buf)? {
            None => PREFIX_LEN - buf.len(),
            Some(len) => (PREFIX_LEN + len as usize).saturating_sub(buf.len()),
        })
    }
}

/// The body of a frame (the bytes after the length prefix).
pub fn body(frame: &[u8]) -> &[u8] {
    frame.get(PREFIX_LEN..).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn framed(bodies: &[Vec<u8>]) -> Vec<u8> {
        let mut out = Vec::new();
        for b in bodies {
            out.extend_from_slice(&(b.len() as u32).to_le_bytes());
            out.extend_from_slice(b);
        }
        out
    }

    #[test]
    fn oversized_prefix_is_rejected_before_reserving() {
        let s = FrameSplitter::new(1024);
        let mut buf = BytesMut::from(&u32::MAX.to_le_bytes()[..]);
        let cap = buf.capacity();
        let err = s.next_frame(&mut buf).unwrap_err();
        assert!(matches!(
            err,
            FrameError::TooLarge {
                len: u32::MAX,
                max: 1024
            }
        ));
        assert!(err.is_fatal());
        assert_eq!(
            buf.capacity(),
            cap,
            "nothing may be reserved for a rejected frame"
        );
    }

    #[test]
    fn partial_frame_reserves_only_what_is_announced() {
        let s = FrameSplitter::new(1 << 20);
        let mut buf = BytesMut::from(&1000u32.to_le_bytes()[..]);
        assert!(s.next_frame(&mut buf).unwrap().is_none());
        assert!(buf.capacity() >= 1004);
        assert!(buf.capacity() < 4096);
        assert_eq!(s.missing(&buf).unwrap(), 1000);
    }

    #[test]
    fn empty_frame_is_split() {
        let s = FrameSplitter::default();
        let mut buf = BytesMut::from(&[0u8, 0, 0, 0, 9][..]);
        assert_eq!(&s.next_frame(&mut buf).unwrap().unwrap()[..], &[0, 0, 0, 0]);
        assert_eq!(&buf[..], &[9]);
    }

    #[test]
    fn frames_are_views_of_the_receive_buffer() {
        let s = FrameSplitter::default();
        let mut buf = BytesMut::from(&framed(&[vec![1, 2, 3], vec![4]])[..]);
        let base = buf.as_ptr();
        let a = s.next_frame(&mut buf).unwrap().unwrap();
        let b = s.next_frame(&mut buf).unwrap().unwrap();
        assert_eq!(a.as_ptr(), base, "the frame shares the buffer's memory");
        assert_eq!(b.as_ptr(), base.wrapping_add(7));
        assert_eq!(body(&a), &[1, 2, 3]);
        assert_eq!(body(&b), &[4]);
        assert!(s.next_frame(&mut buf).unwrap().is_none());
    }

    proptest! {
        /// Whatever the read boundaries, the same frames come out in order.
        #[test]
        fn frames_split_across_reads_at_any_boundary(
            bodies in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..64), 0..8),
            cuts in prop::collection::vec(1usize..17, 1..64),
        ) {
            let s = FrameSplitter::new(64);
            let wire = framed(&bodies);
            let mut buf = BytesMut::new();
            let mut got = Vec::new();
            let mut pos = 0;
            let mut cut = cuts.iter().cycle();
            while pos < wire.len() {
                let n = (*cut.next().unwrap()).min(wire.len() - pos);
                buf.extend_from_slice(&wire[pos..pos + n]);
                pos += n;
                while let Some(f) = s.next_frame(&mut buf).unwrap() {
                    got.push(body(&f).to_vec());
                }
            }
            prop_assert_eq!(got, bodies);
            prop_assert!(buf.is_empty());
        }
    }

    #[test]
    fn every_single_byte_boundary_of_a_two_frame_stream() {
        let s = FrameSplitter::default();
        let bodies = vec![b"hello".to_vec(), b"world!".to_vec()];
        let wire = framed(&bodies);
        for cut in 0..=wire.len() {
            let mut buf = BytesMut::from(&wire[..cut]);
            let mut got = Vec::new();
            while let Some(f) = s.next_frame(&mut buf).unwrap() {
                got.push(body(&f).to_vec());
            }
            buf.extend_from_slice(&wire[cut..]);
            while let Some(f) = s.next_frame(&mut buf).unwrap() {
                got.push(body(&f).to_vec());
            }
            assert_eq!(got, bodies, "cut at {cut}");
        }
    }
}
