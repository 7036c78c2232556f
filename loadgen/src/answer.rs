//! Reading a frame answer: verified in full, or by its likeness to an
//! answer that was.
//!
//! Every answer is verified before it is counted (a load test is where
//! intermittently corrupt answers show up), but running the flatbuffers
//! verifier over each was ≈ 40% of the generator's CPU against a fast
//! server (`bench/NOTES.md`, "the generator's headroom"). A load test sends
//! the same call again and again, and a server answers each with the same
//! bytes except for the header's `message_id` and `timestamp`, the
//! `correlation_id` it echoes and, in a `ToolResult`, the `tool_call_id` it
//! echoes and the `execution_time_ms` it measured. So a connection keeps a
//! few answers it verified in full, as templates, with where those fields
//! lie; an answer of a template's length whose bytes equal the template's
//! outside them, and whose correlation id is UTF-8, is accepted without
//! running the verifier again.
//!
//! Why that is the verifier's verdict, not an approximation of it: the
//! verifier's options depend only on the frame's length
//! (`mcp_schema::verify`), and what it checks (every offset, vtable,
//! length, union type and alignment, and each string's terminator and
//! UTF-8) lies outside those ranges, except the correlation id's UTF-8,
//! which is checked here. The ids and the timestamp are inline structs and
//! the execution time a scalar, whose bytes the verifier never reads. That
//! holds for a buffer in which no other object overlaps those fields, which
//! a FlatBuffers builder never makes but a hand-crafted buffer could; so an
//! answer becomes a template only if it verifies again, to the same answer,
//! with those fields overwritten two ways (all `0xff` or all `0x00` in the
//! structs and the scalar, which makes any string laid over them invalid
//! UTF-8 and any offset laid over them point out of the frame or at its
//! start), and only if the fields do not overlap one another. Any other
//! difference (a longer correlation id, another tool's answer, a flipped
//! bit anywhere else) is a miss: that answer is verified in full. The tests
//! hold the two paths to the same answer for every single-byte change of
//! real frames.

use std::ops::Range;

use mcp_schema::client::ResponseView;
use mcp_schema::fb::protocol::{ResponsePayload, ToolResult};

/// Templates kept per connection: a workload's kinds of answer (a final
/// answer, progress, log lines, an error) without searching long on a miss.
const TEMPLATES: usize = 4;

/// Once every template is in use, a miss replaces one only every this many
/// misses: making a template costs two more verifications, which a
/// workload whose answers never repeat must not pay on every answer.
const REPLACE_EVERY: u64 = 64;

/// What the generator reads of an answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Answer<'a> {
    pub correlation_id: &'a str,
    pub payload_type: ResponsePayload,
    /// It ends its request (progress and log notifications do not).
    pub is_final: bool,
    /// The code of an `ErrorResponse`.
    pub error_code: Option<i32>,
}

impl<'a> Answer<'a> {
    fn of(v: &ResponseView<'a>) -> Self {
        Answer {
            correlation_id: v.correlation_id(),
            payload_type: v.payload_type(),
            is_final: v.is_final(),
            error_code: v.error().map(|(code, _)| code),
        }
    }
}

/// An answer verified in full, and where the next ones may differ.
struct Template {
    bytes: Vec<u8>,
    /// The message id, the timestamp, the correlation id's text, and a
    /// `ToolResult`'s call id and execution time, in the frame's order; an
    /// absent one is an empty range at the frame's end.
    varying: [Range<usize>; 5],
    correlation: Range<usize>,
    payload_type: ResponsePayload,
    is_final: bool,
    error_code: Option<i32>,
}

impl Template {
    fn answer<'a>(&self, frame: &'a [u8]) -> Option<Answer<'a>> {
        if frame.len() != self.bytes.len() {
            return None;
        }
        let mut at = 0;
        for r in &self.varying {
            if frame[at..r.start] != self.bytes[at..r.start] {
                return None;
            }
            at = r.end;
        }
        if frame[at..] != self.bytes[at..] {
            return None;
        }
        let correlation_id = std::str::from_utf8(&frame[self.correlation.clone()]).ok()?;
        Some(Answer {
            correlation_id,
            payload_type: self.payload_type,
            is_final: self.is_final,
            error_code: self.error_code,
        })
    }

    /// Whether the varying fields overlap neither one another (which
    /// `answer` relies on) nor anything else the verifier reads: the
    /// template verifies again, to the same answer, with them overwritten
    /// two ways. `scratch` is reused for the copies.
    fn stands_alone(&self, scratch: &mut Vec<u8>) -> bool {
        if self.varying.windows(2).any(|w| w[0].end > w[1].start) {
            return false;
        }
        for (structs, text) in [(0xffu8, b'~'), (0x00, b'0')] {
            scratch.clear();
            scratch.extend_from_slice(&self.bytes);
            for r in &self.varying {
                let fill = if *r == self.correlation {
                    text
                } else {
                    structs
                };
                scratch[r.clone()].fill(fill);
            }
            let Ok(v) = ResponseView::parse(scratch) else {
                return false;
            };
            let a = Answer::of(&v);
            let id_at = a.correlation_id.as_ptr() as usize - scratch.as_ptr() as usize;
            let same_id = if self.correlation.is_empty() {
                a.correlation_id.is_empty()
            } else {
                (id_at..id_at + a.correlation_id.len()) == self.correlation
            };
            if !same_id
                || (a.payload_type, a.is_final, a.error_code)
                    != (self.payload_type, self.is_final, self.error_code)
            {
                return false;
            }
        }
        true
    }

    /// Takes `frame`, which `v` verified in full, as the template.
    fn set(&mut self, frame: &[u8], v: &ResponseView<'_>) {
        let at = |p: *const u8| p as usize - frame.as_ptr() as usize;
        let h = v.response.header();
        let id = at(h.message_id() as *const _ as *const u8);
        let ts = at(h.timestamp() as *const _ as *const u8);
        let end = frame.len()..frame.len();
        let correlation = match h.correlation_id() {
            Some(s) if !s.is_empty() => at(s.as_ptr())..at(s.as_ptr()) + s.len(),
            _ => end.clone(),
        };
        let (call_id, took) = match v.response.payload_as_tool_result() {
            Some(tr) => {
                let call = at(tr.tool_call_id() as *const _ as *const u8);
                let call = call..call + std::mem::size_of_val(tr.tool_call_id());
                let o = tr._tab.vtable().get(ToolResult::VT_EXECUTION_TIME_MS) as usize;
                let took = if o == 0 {
                    end.clone()
                } else {
                    let p = at(tr._tab.buf().as_ptr()) + tr._tab.loc() + o;
                    p..p + std::mem::size_of::<u32>()
                };
                (call, took)
            }
            None => (end.clone(), end),
        };
        let mut varying = [
            id..id + std::mem::size_of_val(h.message_id()),
            ts..ts + std::mem::size_of_val(h.timestamp()),
            correlation.clone(),
            call_id,
            took,
        ];
        varying.sort_by_key(|r| r.start);
        self.bytes.clear();
        self.bytes.extend_from_slice(frame);
        self.varying = varying;
        self.correlation = correlation;
        let a = Answer::of(v);
        self.payload_type = a.payload_type;
        self.is_final = a.is_final;
        self.error_code = a.error_code;
    }
}

/// One connection's templates.
#[derive(Default)]
pub struct Answers {
    templates: Vec<Template>,
    /// The template a miss replaces next, once all are in use.
    next: usize,
    /// Answers that matched no template.
    misses: u64,
    /// A candidate template, and the copies `stands_alone` checks.
    spare: Option<Template>,
    scratch: Vec<u8>,
}

impl Answers {
    /// The answer a size-prefixed `Response` frame carries, or `None` if
    /// the frame is not a valid `Response`.
    pub fn read<'a>(&mut self, frame: &'a [u8]) -> Option<Answer<'a>> {
        for t in &self.templates {
            if let Some(a) = t.answer(frame) {
                return Some(a);
            }
        }
        let v = ResponseView::parse(frame).ok()?;
        self.misses += 1;
        let full = self.templates.len() == TEMPLATES;
        if !full || self.misses.is_multiple_of(REPLACE_EVERY) {
            let mut t = self.spare.take().unwrap_or_else(|| Template {
                bytes: Vec::with_capacity(frame.len()),
                varying: [0..0, 0..0, 0..0, 0..0, 0..0],
                correlation: 0..0,
                payload_type: ResponsePayload::NONE,
                is_final: false,
                error_code: None,
            });
            t.set(frame, &v);
            if !t.stands_alone(&mut self.scratch) {
                self.spare = Some(t);
            } else if !full {
                self.templates.push(t);
            } else {
                // Round robin: a workload with more kinds of answer than
                // templates still verifies every answer, more of them in
                // full.
                let old = std::mem::replace(&mut self.templates[self.next], t);
                self.spare = Some(old);
                self.next = (self.next + 1) % TEMPLATES;
            }
        }
        Some(Answer::of(&v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mcp_schema::ErrorCode;
    use mcp_schema::encode::{Correlation, ReplyTo, ResponseEncoder};
    use mcp_schema::fb::UUID;

    fn to(correlation: &str) -> ReplyTo<'_> {
        ReplyTo {
            correlation: Correlation::Text(correlation),
            session_id: None,
        }
    }

    /// A `ToolResult` answer as a server makes one: its `tool_call_id`
    /// echoes the call's, which differs from call to call.
    fn tool_text(enc: &mut ResponseEncoder, correlation: &str, text: &str) -> Vec<u8> {
        let call = correlation.bytes().fold(7u8, |h, b| h.wrapping_mul(31) ^ b);
        enc.tool_text(&to(correlation), &UUID::new(&[call; 16]), text, None, false)
            .to_vec()
    }

    /// Both paths' answer, and whether it came from a template.
    fn read_both(answers: &mut Answers, frame: &[u8]) -> (Option<String>, bool) {
        let full = ResponseView::parse(frame).ok().map(|v| Answer::of(&v));
        let templated = answers.templates.iter().find_map(|t| t.answer(frame));
        if templated.is_some() {
            assert_eq!(
                templated, full,
                "a template accepted what the verifier did not"
            );
        }
        let got = answers.read(frame);
        assert_eq!(got, full);
        (
            got.map(|a| a.correlation_id.to_string()),
            templated.is_some(),
        )
    }

    #[test]
    fn repeated_answers_are_read_from_the_template_with_their_own_ids() {
        let mut enc = ResponseEncoder::new(1);
        let mut answers = Answers::default();
        let first = tool_text(&mut enc, "l0.10", "hello");
        assert_eq!(
            read_both(&mut answers, &first),
            (Some("l0.10".into()), false)
        );
        // A new message id and timestamp, another correlation id of the
        // same length: the template's.
        for seq in 11..40 {
            let c = format!("l0.{seq}");
            let f = tool_text(&mut enc, &c, "hello");
            assert_ne!(f, first);
            assert_eq!(read_both(&mut answers, &f), (Some(c), true));
        }
        // A longer correlation id moves everything after it: verified in
        // full, then a template of its own.
        let f = tool_text(&mut enc, "l0.100", "hello");
        assert_eq!(read_both(&mut answers, &f), (Some("l0.100".into()), false));
        let f = tool_text(&mut enc, "l0.101", "hello");
        assert_eq!(read_both(&mut answers, &f), (Some("l0.101".into()), true));
        // Another text of the same length is another answer.
        let f = tool_text(&mut enc, "l0.12", "jello");
        assert_eq!(read_both(&mut answers, &f), (Some("l0.12".into()), false));
        let e = enc
            .error(&to("l0.13"), ErrorCode::InvalidParams, "no", None)
            .to_vec();
        let a = answers.read(&e).expect("an error answer");
        assert_eq!(a.error_code, Some(ErrorCode::InvalidParams.code()));
        assert!(a.is_final);
        let e = enc
            .error(&to("l0.14"), ErrorCode::InvalidParams, "no", None)
            .to_vec();
        assert_eq!(read_both(&mut answers, &e), (Some("l0.14".into()), true));
    }

    /// Every single-byte change of a real answer, read with a template of
    /// the original in place: the template path and the verifier agree on
    /// each (accepted with the same fields, or refused).
    #[test]
    fn every_single_byte_change_gets_the_verifiers_verdict() {
        let mut enc = ResponseEncoder::new(2);
        let frames = [
            tool_text(&mut enc, "l3.5", "hello"),
            enc.error(&to("l3.6"), ErrorCode::Internal, "boom", None)
                .to_vec(),
        ];
        let mut templated = 0;
        let mut refused = 0;
        for original in &frames {
            for i in 0..original.len() {
                for x in [0x01u8, 0x80, 0xff] {
                    let mut answers = Answers::default();
                    answers.read(original).expect("the original verifies");
                    let mut m = original.clone();
                    m[i] ^= x;
                    let (got, from_template) = read_both(&mut answers, &m);
                    templated += usize::from(from_template);
                    refused += usize::from(got.is_none());
                }
            }
        }
        // Both kinds of outcome occurred: changes inside the varying fields
        // were read from the template, and some changes elsewhere were
        // refused by the verifier.
        assert!(templated > 0 && refused > 0, "{templated} {refused}");
    }

    #[test]
    fn a_correlation_id_that_is_not_utf8_is_refused_on_both_paths() {
        let mut enc = ResponseEncoder::new(3);
        let f = tool_text(&mut enc, "l1.7", "hello");
        let mut answers = Answers::default();
        answers.read(&f).expect("valid");
        let at = f
            .windows(4)
            .position(|w| w == b"l1.7")
            .expect("the id is in the frame");
        let mut m = f.clone();
        m[at + 3] = 0xff;
        assert_eq!(read_both(&mut answers, &m), (None, false));
    }

    #[test]
    fn templates_are_bounded_and_replaced_round_robin_now_and_then() {
        let mut enc = ResponseEncoder::new(4);
        let mut answers = Answers::default();
        let texts = ["a", "bb", "ccc", "dddd"];
        for text in texts {
            let f = tool_text(&mut enc, "l2.1", text);
            assert_eq!(read_both(&mut answers, &f), (Some("l2.1".into()), false));
        }
        assert_eq!(answers.templates.len(), TEMPLATES);
        // Answers of a fifth shape: verified in full, and only the
        // REPLACE_EVERY-th miss takes the oldest template's place.
        let fifth = |enc: &mut ResponseEncoder| tool_text(enc, "l2.2", "eeeee");
        for _ in TEMPLATES as u64..REPLACE_EVERY - 1 {
            let f = fifth(&mut enc);
            assert_eq!(read_both(&mut answers, &f), (Some("l2.2".into()), false));
        }
        let f = fifth(&mut enc);
        assert_eq!(read_both(&mut answers, &f), (Some("l2.2".into()), false));
        assert_eq!(answers.templates.len(), TEMPLATES);
        let f = fifth(&mut enc);
        assert_eq!(read_both(&mut answers, &f), (Some("l2.2".into()), true));
        // The oldest ("a") went; the others stay.
        let f = tool_text(&mut enc, "l2.3", "bb");
        assert_eq!(read_both(&mut answers, &f), (Some("l2.3".into()), true));
        let f = tool_text(&mut enc, "l2.3", "a");
        assert_eq!(read_both(&mut answers, &f), (Some("l2.3".into()), false));
    }

    /// The check a template must pass: with a varying range laid over
    /// anything else the verifier reads (a string's characters, its length,
    /// the root offset), overwriting it changes the verdict or the answer,
    /// and the template is refused. The real ranges pass.
    #[test]
    fn a_template_whose_varying_fields_overlap_anything_else_is_refused() {
        let mut enc = ResponseEncoder::new(5);
        let f = tool_text(&mut enc, "l4.1", "hello");
        let v = ResponseView::parse(&f).expect("valid");
        let mut t = Template {
            bytes: Vec::new(),
            varying: [0..0, 0..0, 0..0, 0..0, 0..0],
            correlation: 0..0,
            payload_type: ResponsePayload::NONE,
            is_final: false,
            error_code: None,
        };
        t.set(&f, &v);
        let mut scratch = Vec::new();
        assert!(t.stands_alone(&mut scratch));
        let text = f
            .windows(5)
            .position(|w| w == b"hello")
            .expect("the text is in the frame");
        // The last: over part of the timestamp, as a crafted buffer could
        // lay the execution time over it.
        let ts = t
            .varying
            .iter()
            .find(|r| r.len() == 8)
            .expect("the timestamp's range")
            .clone();
        for wrong in [
            text..text + 5,
            text - 4..text,
            4..8,
            ts.start + 2..ts.start + 6,
        ] {
            let mut bad = Template {
                bytes: t.bytes.clone(),
                varying: t.varying.clone(),
                correlation: t.correlation.clone(),
                ..t
            };
            // In place of the absent execution time's empty range.
            let i = bad
                .varying
                .iter()
                .position(|r| r.is_empty())
                .expect("this answer has no execution time");
            bad.varying[i] = wrong.clone();
            bad.varying.sort_by_key(|r| r.start);
            assert!(!bad.stands_alone(&mut scratch), "{wrong:?}");
        }
    }
}
