//! The soak on the MCP Streamable HTTP edge (`--edge http`): the requests
//! its abusers and checker send there, the garbage, and how answers are
//! read back.
//!
//! The checker and the abusers speak the stateless 2026-07-28 revision:
//! every request stands alone (no `initialize` to precede it), so a
//! slowloris or never-reading connection needs nothing but its own bytes,
//! and a checker connection that the broker closes can go on from the next
//! request. The well-behaved load is mcp-loadgen, in the revision
//! `--mcp-version` names (by default the 2025-11-25 session era), so a
//! run covers both.

use std::borrow::Cow;

use serde_json::{Value, json};

use super::{Answer, Rng, Unframeable};

/// The revision the soak's own clients speak.
const VERSION: &str = "2026-07-28";

/// Names of the five kinds of garbage, in the order of [`garbage`]'s
/// `kind`; the last one closes the connection (431).
pub(crate) const GARBAGE_KINDS: [&str; 5] = [
    "random_bytes",
    "truncated_request",
    "bit_flipped_request",
    "bad_json_body",
    "oversized_head",
];

/// A complete 2026-07-28 `tools/call` of `echo` with JSON-RPC id `id`.
pub(crate) fn echo_request(id: &str, text: &str) -> Vec<u8> {
    let body = json!({
        "jsonrpc": "2.0",
        "id": id,
        "method": "tools/call",
        "params": {
            "name": "echo",
            "arguments": {"text": text},
            "_meta": {
                "io.modelcontextprotocol/protocolVersion": VERSION,
                "io.modelcontextprotocol/clientCapabilities": {},
            },
        },
    })
    .to_string();
    let mut req = head(body.len());
    req.extend_from_slice(body.as_bytes());
    req
}

/// The head of a 2026-07-28 `tools/call` of `echo` with a body of `len`
/// bytes.
fn head(len: usize) -> Vec<u8> {
    format!(
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nMCP-Protocol-Version: {VERSION}\r\n\
         Mcp-Method: tools/call\r\nMcp-Name: echo\r\nContent-Length: {len}\r\n\r\n"
    )
    .into_bytes()
}

/// Appends one piece of garbage of `kind` (see [`GARBAGE_KINDS`]) to `out`.
/// `template` is a valid request; `max_head` the broker's
/// `http.max_header_bytes`.
pub(crate) fn garbage(
    rng: &mut Rng,
    kind: usize,
    template: &[u8],
    max_head: u32,
    _seq: u64,
    out: &mut Vec<u8>,
) {
    match kind {
        0 => {
            let len = 16 + rng.below(1009) as usize;
            rng.fill(out, len);
        }
        1 => {
            let cut = 8 + rng.below(template.len() as u64 - 12) as usize;
            out.extend_from_slice(&template[..cut]);
        }
        2 => {
            let start = out.len();
            out.extend_from_slice(template);
            rng.flip_bits(&mut out[start..]);
        }
        3 => {
            let len = 16 + rng.below(497) as usize;
            out.extend_from_slice(&head(len));
            rng.fill(out, len);
        }
        _ => {
            out.extend_from_slice(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: ");
            out.resize(out.len() + max_head as usize + 1, b'a');
            out.extend_from_slice(b"\r\n\r\n");
        }
    }
}

/// Moves every complete response at the front of `buf` into `out` (one
/// [`Answer`] each), leaving a partial one. `Err` when the bytes cannot be
/// an HTTP/1.1 response: the connection can no longer be read.
pub(crate) fn answers(buf: &mut Vec<u8>, out: &mut Vec<Answer>) -> Result<(), Unframeable> {
    let mut at = 0;
    let res = loop {
        match response(&buf[at..]) {
            Ok(Some((n, a))) => {
                out.push(a);
                at += n;
            }
            Ok(None) => break Ok(()),
            Err(e) => break Err(e),
        }
    };
    match res {
        Ok(()) => drop(buf.drain(..at)),
        Err(_) => buf.clear(),
    }
    res
}

/// The response at the start of `b` and its length, `None` while it is
/// incomplete.
fn response(b: &[u8]) -> Result<Option<(usize, Answer)>, Unframeable> {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut r = httparse::Response::new(&mut headers);
    let head = match r.parse(b) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(_) => return Err(Unframeable),
    };
    let status = r.code.unwrap_or(0);
    let (mut len, mut chunked, mut sse) = (None, false, false);
    for h in r.headers.iter() {
        let v = std::str::from_utf8(h.value).unwrap_or("").trim();
        if h.name.eq_ignore_ascii_case("content-length") {
            len = Some(v.parse::<usize>().map_err(|_| Unframeable)?);
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = v.to_ascii_lowercase().contains("chunked");
        } else if h.name.eq_ignore_ascii_case("content-type") {
            sse = v.starts_with("text/event-stream");
        }
    }
    let rest = &b[head..];
    let (body, used): (Cow<'_, [u8]>, usize) = if chunked {
        match dechunk(rest)? {
            Some((body, n)) => (Cow::Owned(body), n),
            None => return Ok(None),
        }
    } else {
        // The broker frames every body; one without a length is empty (202).
        let len = len.unwrap_or(0);
        if rest.len() < len {
            return Ok(None);
        }
        (Cow::Borrowed(&rest[..len]), len)
    };
    Ok(Some((head + used, classify(status, &body, sse))))
}

/// A chunked body at the start of `b`: its bytes and how much of `b` it
/// took, `None` while it is incomplete.
fn dechunk(b: &[u8]) -> Result<Option<(Vec<u8>, usize)>, Unframeable> {
    let mut body = Vec::new();
    let mut at = 0;
    loop {
        let (start, size) = match httparse::parse_chunk_size(&b[at..]) {
            Ok(httparse::Status::Complete((n, size))) => (at + n, size as usize),
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(_) => return Err(Unframeable),
        };
        // The chunk and its CRLF (the last chunk: no trailers, its CRLF).
        if b.len() < start + size + 2 {
            return Ok(None);
        }
        if &b[start + size..start + size + 2] != b"\r\n" {
            return Err(Unframeable);
        }
        body.extend_from_slice(&b[start..start + size]);
        at = start + size + 2;
        if size == 0 {
            return Ok(Some((body, at)));
        }
    }
}

/// The JSON-RPC answer in a response body (for an SSE body, its last
/// event that carries an id: the events before it are progress and logs).
fn classify(status: u16, body: &[u8], sse: bool) -> Answer {
    let msg: Option<Value> = if sse {
        String::from_utf8_lossy(body)
            .lines()
            .rev()
            .filter_map(|l| l.strip_prefix("data:"))
            .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
            .find(|v| v.get("id").is_some())
    } else {
        serde_json::from_slice(body).ok()
    };
    let Some(msg) = msg else {
        return if status == 200 || !body.is_empty() {
            Answer::Invalid
        } else {
            Answer::Final {
                corr: None,
                outcome: format!("http_{status}"),
            }
        };
    };
    let corr = match &msg["id"] {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    };
    let code = msg["error"]["code"].as_i64();
    let outcome = match (status, code) {
        (200, Some(c)) => format!("error_{c}"),
        (200, None) if msg["result"]["isError"] == Value::Bool(true) => "tool_error".into(),
        (200, None) if msg.get("result").is_some() => "result".into(),
        (200, None) => "no_result".into(),
        (s, Some(c)) => format!("http_{s}_error_{c}"),
        (s, None) => format!("http_{s}"),
    };
    Answer::Final { corr, outcome }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(bytes: &[u8]) -> (Result<(), Unframeable>, Vec<Answer>, usize) {
        let mut buf = bytes.to_vec();
        let mut out = Vec::new();
        let r = answers(&mut buf, &mut out);
        (r, out, buf.len())
    }

    fn finals(out: &[Answer]) -> Vec<(Option<&str>, &str)> {
        out.iter()
            .map(|a| match a {
                Answer::Final { corr, outcome } => (corr.as_deref(), outcome.as_str()),
                Answer::Invalid => (None, "invalid"),
                Answer::Progress => (None, "progress"),
            })
            .collect()
    }

    #[test]
    fn pipelined_responses_are_split_and_a_partial_one_is_kept() {
        let ok = r#"{"jsonrpc":"2.0","id":"c0.1","result":{"content":[]}}"#;
        let err = r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"x"}}"#;
        let sse = "event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\"}\n\n\
                   event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":7,\"error\":{\"code\":-32001}}\n\n";
        let chunked: String = sse
            .as_bytes()
            .chunks(40)
            .map(|c| format!("{:x}\r\n{}\r\n", c.len(), String::from_utf8_lossy(c)))
            .collect();
        let stream = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{ok}\
             HTTP/1.1 400 Bad Request\r\nContent-Length: {}\r\n\r\n{err}\
             HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n{chunked}0\r\n\r\n\
             HTTP/1.1 202 Accepted\r\n\r\n\
             HTTP/1.1 200 OK\r\ncontent-length: 50\r\n\r\n{{\"id\"",
            ok.len(),
            err.len()
        );
        let (r, out, left) = parse(stream.as_bytes());
        assert!(r.is_ok());
        assert_eq!(
            finals(&out),
            [
                (Some("c0.1"), "result"),
                (None, "http_400_error_-32700"),
                (Some("7"), "error_-32001"),
                (None, "http_202"),
            ]
        );
        // The fifth response's head and five bytes of its 50-byte body.
        assert_eq!(
            left,
            "HTTP/1.1 200 OK\r\ncontent-length: 50\r\n\r\n{\"id\"".len()
        );
    }

    #[test]
    fn bytes_that_are_no_response_end_the_reading() {
        let (r, out, left) = parse(b"\x00\x01garbage\r\n\r\n");
        assert!(r.is_err());
        assert!(out.is_empty());
        assert_eq!(left, 0);
        // A 200 whose body is not JSON is an invalid answer, not a lost one.
        let (r, out, _) = parse(b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\nabc");
        assert!(r.is_ok());
        assert_eq!(finals(&out), [(None, "invalid")]);
    }

    #[test]
    fn the_request_is_one_complete_http_message() {
        let req = echo_request("c1.9", "soak");
        let mut headers = [httparse::EMPTY_HEADER; 16];
        let mut r = httparse::Request::new(&mut headers);
        let n = match r.parse(&req) {
            Ok(httparse::Status::Complete(n)) => n,
            other => panic!("{other:?}"),
        };
        let len: usize = r
            .headers
            .iter()
            .find(|h| h.name == "Content-Length")
            .and_then(|h| std::str::from_utf8(h.value).ok()?.parse().ok())
            .expect("content-length");
        assert_eq!(req.len(), n + len);
        let body: Value = serde_json::from_slice(&req[n..]).expect("json body");
        assert_eq!(body["id"], "c1.9");
        assert_eq!(body["params"]["arguments"]["text"], "soak");
        // Garbage of the last kind passes the head limit it is given.
        let mut out = Vec::new();
        garbage(&mut Rng(1), 4, &req, 1024, 0, &mut out);
        assert!(out.len() > 1024 && out.ends_with(b"\r\n\r\n"));
    }
}
