//! An incremental `text/event-stream` parser (the WHATWG "server-sent events"
//! wire format), fed the body as it arrives in arbitrary chunks.
//!
//! Pure: no I/O, so the unit tests run natively. Lines end in LF, CRLF or a
//! lone CR; a CR at the very end of a chunk is held back until the next chunk
//! says whether an LF follows, so a CRLF split across two reads is one line
//! ending, not two.

/// One dispatched event.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Event {
    /// `event:` field; empty means the default type, "message".
    pub event: String,
    /// `data:` lines joined by `\n`.
    pub data: String,
    /// `id:` field, when the event (or an earlier one) set it.
    pub id: Option<String>,
}

#[derive(Debug, Default)]
pub struct Parser {
    /// Bytes of an unfinished line.
    line: Vec<u8>,
    /// The previous chunk ended in CR: an LF at the start of the next chunk
    /// belongs to that line ending.
    skip_lf: bool,
    /// At the start of the stream: a UTF-8 BOM there is dropped.
    started: bool,
    event: String,
    data: String,
    has_data: bool,
    last_id: Option<String>,
}

impl Parser {
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds one chunk; returns the events it completed, in order.
    pub fn feed(&mut self, mut chunk: &[u8]) -> Vec<Event> {
        let mut out = Vec::new();
        if !self.started && !chunk.is_empty() {
            // The BOM may itself be split; only the common unsplit case is
            // handled (servers rarely send one at all).
            if let Some(rest) = chunk.strip_prefix(b"\xEF\xBB\xBF") {
                chunk = rest;
            }
            self.started = true;
        }
        // The first byte after a held-back CR settles it, whether or not
        // it is the LF: a chunk that is that LF alone must not leave the
        // parser expecting another (it swallowed the next line ending).
        // An empty chunk settles nothing.
        if self.skip_lf && !chunk.is_empty() {
            self.skip_lf = false;
            if let Some(rest) = chunk.strip_prefix(b"\n") {
                chunk = rest;
            }
        }
        let mut i = 0;
        while i < chunk.len() {
            match chunk[i] {
                b'\n' => {
                    self.end_line(&mut out);
                    i += 1;
                }
                b'\r' => {
                    self.end_line(&mut out);
                    i += 1;
                    if i == chunk.len() {
                        self.skip_lf = true;
                    } else if chunk[i] == b'\n' {
                        i += 1;
                    }
                }
                _ => {
                    let start = i;
                    while i < chunk.len() && chunk[i] != b'\n' && chunk[i] != b'\r' {
                        i += 1;
                    }
                    self.line.extend_from_slice(&chunk[start..i]);
                }
            }
        }
        out
    }

    /// Bytes of an unfinished line or event. When the stream ends, such an
    /// event is discarded, as the SSE specification requires; the caller
    /// only uses this to word its error.
    pub fn pending_bytes(&self) -> usize {
        self.line.len() + self.data.len()
    }

    fn end_line(&mut self, out: &mut Vec<Event>) {
        let line = std::mem::take(&mut self.line);
        if line.is_empty() {
            if self.has_data {
                out.push(Event {
                    event: std::mem::take(&mut self.event),
                    data: std::mem::take(&mut self.data),
                    id: self.last_id.clone(),
                });
            } else {
                self.event.clear();
            }
            self.has_data = false;
            return;
        }
        if line[0] == b':' {
            return; // comment (keep-alive)
        }
        let line = String::from_utf8_lossy(&line);
        let (field, value) = match line.find(':') {
            Some(at) => {
                let value = &line[at + 1..];
                (&line[..at], value.strip_prefix(' ').unwrap_or(value))
            }
            None => (&line[..], ""),
        };
        match field {
            "event" => self.event = value.to_owned(),
            "data" => {
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(value);
                self.has_data = true;
            }
            // An id containing NUL is ignored (SSE specification).
            "id" if !value.contains('\0') => self.last_id = Some(value.to_owned()),
            _ => {} // `retry:` and unknown fields: irrelevant for one response
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(chunks: &[&[u8]]) -> Vec<Event> {
        let mut p = Parser::new();
        chunks.iter().flat_map(|c| p.feed(c)).collect()
    }

    /// Found by `props::reads_split_anywhere_yield_the_same_events`: the
    /// LF of a split CRLF arriving as a read of its own left the parser
    /// still expecting it, so the next read's LF (here the blank line
    /// that ends the event) was swallowed and the event never came.
    #[test]
    fn crlf_split_with_its_lf_read_alone() {
        let whole = all(&[b"data: a\r\n\n"]);
        assert_eq!(whole.len(), 1);
        assert_eq!(all(&[b"data: a\r", b"\n", b"\n"]), whole);
    }

    #[test]
    fn single_event() {
        let ev = all(&[b"event: message\ndata: {\"a\":1}\nid: 7\n\n"]);
        assert_eq!(
            ev,
            vec![Event {
                event: "message".into(),
                data: "{\"a\":1}".into(),
                id: Some("7".into())
            }]
        );
    }

    #[test]
    fn multi_line_data_joined_by_newline() {
        let ev = all(&[b"data: {\"a\":\ndata:1}\n\n"]);
        assert_eq!(ev.len(), 1);
        assert_eq!(ev[0].data, "{\"a\":\n1}");
    }

    #[test]
    fn crlf_and_lone_cr() {
        let ev = all(&[b"data: a\r\n\r\ndata: b\r\rdata: c\n\n"]);
        let data: Vec<_> = ev.iter().map(|e| e.data.as_str()).collect();
        assert_eq!(data, ["a", "b", "c"]);
    }

    #[test]
    fn crlf_split_across_reads() {
        // The CR ends one chunk, the LF starts the next: one line ending.
        let ev = all(&[b"data: a\r", b"\n\r", b"\ndata: b\n", b"\n"]);
        let data: Vec<_> = ev.iter().map(|e| e.data.as_str()).collect();
        assert_eq!(data, ["a", "b"]);
    }

    #[test]
    fn split_anywhere() {
        let text = b": keep-alive\nevent: message\ndata: {\"jsonrpc\":\"2.0\"}\nid: 1\n\ndata: x\ndata: y\n\n";
        let whole = all(&[text]);
        assert_eq!(whole.len(), 2);
        for cut in 0..text.len() {
            let (a, b) = text.split_at(cut);
            assert_eq!(all(&[a, b]), whole, "cut at {cut}");
        }
        let bytes: Vec<&[u8]> = text.chunks(1).collect();
        assert_eq!(all(&bytes), whole);
    }

    #[test]
    fn comments_and_empty_events_ignored() {
        let ev = all(&[b": ping\n\n:another\nevent: x\n\nretry: 10\ndata\n\n"]);
        // `data` with no colon is a data field with an empty value.
        assert_eq!(ev.len(), 1);
        assert_eq!(ev[0].data, "");
        assert_eq!(ev[0].event, "");
    }

    #[test]
    fn value_space_stripped_once() {
        let ev = all(&[b"data:  two\n\n"]);
        assert_eq!(ev[0].data, " two");
    }

    #[test]
    fn bom_dropped_and_unterminated_event_discarded() {
        let mut p = Parser::new();
        let ev = p.feed(b"\xEF\xBB\xBFdata: a\n\ndata: b");
        assert_eq!(ev.len(), 1);
        assert_eq!(ev[0].data, "a");
        assert!(p.pending_bytes() > 0);
    }
}

#[cfg(test)]
mod props {
    use super::*;
    use crate::arb;
    use proptest::prelude::*;

    const BOM: &[u8] = b"\xEF\xBB\xBF";

    /// Bytes made mostly of what SSE is made of (fields, line endings of
    /// every kind, a BOM, a multi-byte character), so that random streams
    /// hold events, with arbitrary bytes among them.
    fn stream() -> impl Strategy<Value = Vec<u8>> {
        let piece = prop_oneof![
            // Line endings weigh most: how reads cut between them is
            // where a parser that carries state across reads goes wrong.
            4 => prop::sample::select(vec![&b"\r"[..], b"\n", b"\r\n"]).prop_map(<[u8]>::to_vec),
            3 => prop::sample::select(vec![
                &b"data:"[..], b"data: x", b"event: message", b"id: 7", b"retry: 1", b":",
                BOM, b" ", b"\0", "\u{e9}".as_bytes(),
            ])
            .prop_map(<[u8]>::to_vec),
            1 => prop::collection::vec(any::<u8>(), 0..8),
        ];
        (any::<bool>(), prop::collection::vec(piece, 0..40)).prop_map(|(bom, pieces)| {
            let mut out = if bom { BOM.to_vec() } else { Vec::new() };
            out.extend(pieces.concat());
            out
        })
    }

    /// The events of `chunks` fed in turn, and what is left pending.
    fn parse(chunks: &[Vec<u8>]) -> (Vec<Event>, usize) {
        let mut p = Parser::new();
        let events = chunks.iter().flat_map(|c| p.feed(c)).collect();
        (events, p.pending_bytes())
    }

    /// One event as a server writes it: `lines` are its data.
    #[derive(Debug, Clone)]
    struct Written {
        event: String,
        lines: Vec<String>,
        id: Option<String>,
        comment: bool,
    }

    fn written() -> impl Strategy<Value = Written> {
        // A value holds no line ending; an id no NUL (one with a NUL is
        // ignored, by the specification).
        (
            "[^\r\n]{0,8}",
            prop::collection::vec("[^\r\n]{0,12}", 1..4),
            prop::option::of("[^\r\n\0]{0,8}"),
            any::<bool>(),
        )
            .prop_map(|(event, lines, id, comment)| Written {
                event,
                lines,
                id,
                comment,
            })
    }

    proptest! {
        // Cheap: more cases than the default, for the rarer interleavings of
        // reads and line endings.
        #![proptest_config(ProptestConfig::with_cases(1024))]

        /// Any bytes, in any reads: no panic.
        #[test]
        fn arbitrary_bytes_never_panic(
            bytes in prop::collection::vec(any::<u8>(), 0..512),
            reads in arb::reads(),
        ) {
            parse(&reads.split(&bytes));
        }

        /// Where the reads split the stream (within a CRLF, a field name,
        /// a UTF-8 character, with reads of no bytes) changes nothing: the
        /// same events, and the same bytes left pending. The one exception
        /// is the module's own: a BOM split across the first reads is not
        /// recognised, so no cut falls inside a leading BOM.
        #[test]
        fn reads_split_anywhere_yield_the_same_events(
            bytes in stream(),
            reads in arb::reads(),
        ) {
            let mut at = reads.cuts(bytes.len());
            if bytes.starts_with(BOM) {
                at.retain(|&c| c == 0 || c >= BOM.len());
            }
            prop_assert_eq!(parse(&arb::chunks(&bytes, &at)), parse(&[bytes]));
        }

        /// Events written with any data, event type and id, any one kind
        /// of line ending, comments between them and a BOM or not, come
        /// back as written, whatever the reads: data lines joined by `\n`,
        /// the id the last one set.
        #[test]
        fn written_events_round_trip(
            events in prop::collection::vec(written(), 0..5),
            eol in prop::sample::select(vec!["\n", "\r\n", "\r"]),
            bom in any::<bool>(),
            reads in arb::reads(),
        ) {
            let mut text = String::from(if bom { "\u{feff}" } else { "" });
            let mut expected = Vec::new();
            let mut last_id = None;
            for e in &events {
                if e.comment {
                    text.push_str(&format!(": keep-alive{eol}"));
                }
                text.push_str(&format!("event: {}{eol}", e.event));
                for l in &e.lines {
                    text.push_str(&format!("data: {l}{eol}"));
                }
                if let Some(id) = &e.id {
                    text.push_str(&format!("id: {id}{eol}"));
                    last_id = Some(id.clone());
                }
                text.push_str(eol);
                expected.push(Event {
                    event: e.event.clone(),
                    data: e.lines.join("\n"),
                    id: last_id.clone(),
                });
            }
            let bytes = text.into_bytes();
            let mut at = reads.cuts(bytes.len());
            if bom {
                at.retain(|&c| c == 0 || c >= BOM.len());
            }
            let (got, pending) = parse(&arb::chunks(&bytes, &at));
            prop_assert_eq!(got, expected);
            prop_assert_eq!(pending, 0);
        }
    }
}
