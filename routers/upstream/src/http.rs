//! The HTTP leg: one POST over `wasi:http/outgoing-handler`, and the answer's
//! body read in bounded chunks. Errors are plain reasons ("connection
//! refused", "HTTP 500: …"); the caller words them with method and URL.
//!
//! While it waits for an answer, a request may also serve a second stream
//! ([`Beside`]): the session's standing GET stream, on which a server sends
//! what is not tied to a request (lib.rs, "Listener"). Both are waited on
//! with one `wasi:io/poll.poll`.
//!
//! [`Endpoint::parse`] is pure and tested natively; the rest calls WASI
//! imports and only runs inside the component.

use wasi::http::outgoing_handler;
use wasi::http::types::{
    ErrorCode, Fields, FutureIncomingResponse, IncomingBody, IncomingResponse, Method,
    OutgoingBody, OutgoingRequest, Scheme,
};
use wasi::io::poll::Pollable;
use wasi::io::streams::{InputStream, StreamError};

/// An answer body larger than this is refused: the WIT carries whole
/// strings, and a runaway upstream must not exhaust the instance's memory.
pub const MAX_BODY: usize = 16 << 20;
/// Bytes asked for per read.
const READ_CHUNK: u64 = 64 << 10;
/// `blocking-write-and-flush` accepts at most 4096 bytes per call.
const WRITE_CHUNK: usize = 4096;

/// A second stream served while a request waits for its answer.
pub trait Beside {
    /// What to wait on besides the answer (its stream, or the head it
    /// waits for), while there is something.
    fn pollable(&mut self) -> Option<&Pollable>;
    /// Whether there is something beside: without, an answer is read with
    /// one blocking read; the native tests, which have no pollables, serve
    /// it before every chunk of the answer.
    fn active(&self) -> bool;
    /// Takes what is ready beside.
    fn serve(&mut self);
}

/// Nothing beside: a plain request.
pub struct Alone;

impl Beside for Alone {
    fn pollable(&mut self) -> Option<&Pollable> {
        None
    }
    fn active(&self) -> bool {
        false
    }
    fn serve(&mut self) {}
}

/// Blocks until `p` is ready, serving `side` whenever it is.
fn wait(p: &Pollable, side: &mut dyn Beside) {
    loop {
        let Some(theirs) = side.pollable() else {
            p.block();
            return;
        };
        let ready = wasi::io::poll::poll(&[p, theirs]);
        if ready.contains(&1) {
            side.serve();
        }
        if ready.contains(&0) {
            return;
        }
    }
}

/// The upstream's MCP endpoint, split as wasi:http wants it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// Scheme and authority only, for error messages: they reach the log,
    /// `/readyz` and clients, and a path or query may hold a key.
    pub shown: String,
    pub https: bool,
    /// `host[:port]`.
    pub authority: String,
    /// Path and query, starting with `/`.
    pub path: String,
}

impl Endpoint {
    pub fn parse(url: &str) -> Result<Self, String> {
        let url = url.trim();
        let (https, rest) = if let Some(r) = strip_prefix_ci(url, "https://") {
            (true, r)
        } else if let Some(r) = strip_prefix_ci(url, "http://") {
            (false, r)
        } else {
            return Err(format!("`{url}` is not an http:// or https:// URL"));
        };
        // The fragment never goes on the wire.
        let rest = rest.split('#').next().unwrap_or_default();
        let cut = rest.find(['/', '?']).unwrap_or(rest.len());
        let (authority, path) = rest.split_at(cut);
        if authority.is_empty() {
            return Err(format!("`{url}` has no host"));
        }
        if authority.contains('@') {
            // Credentials belong in the operator's upstream_headers, which
            // the host injects; a URL must not smuggle them. Not echoed: it
            // holds a password (the broker's configuration refuses it first).
            return Err("user info in the upstream URL is not supported".into());
        }
        let path = match path {
            "" => "/".to_owned(),
            p if p.starts_with('?') => format!("/{p}"),
            p => p.to_owned(),
        };
        Ok(Self {
            shown: format!("{}://{authority}", if https { "https" } else { "http" }),
            https,
            authority: authority.to_owned(),
            path,
        })
    }
}

fn strip_prefix_ci<'a>(s: &'a str, prefix: &str) -> Option<&'a str> {
    let head = s.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix)
        .then(|| &s[prefix.len()..])
}

/// Words a wasi:http error code the way an operator reads it.
pub fn reason(e: &ErrorCode) -> String {
    match e {
        ErrorCode::ConnectionRefused => "connection refused".into(),
        ErrorCode::ConnectionTerminated => "connection terminated".into(),
        ErrorCode::ConnectionTimeout => "connection timed out".into(),
        ErrorCode::ConnectionReadTimeout => "read timed out".into(),
        ErrorCode::ConnectionWriteTimeout => "write timed out".into(),
        ErrorCode::DnsTimeout => "DNS timed out".into(),
        ErrorCode::DnsError(p) => format!(
            "DNS error{}",
            p.rcode
                .as_deref()
                .map(|r| format!(" ({r})"))
                .unwrap_or_default()
        ),
        ErrorCode::DestinationNotFound => "destination not found".into(),
        ErrorCode::DestinationUnavailable => "destination unavailable".into(),
        ErrorCode::HttpRequestDenied => "request denied by the broker's host".into(),
        ErrorCode::HttpResponseTimeout => "response timed out".into(),
        ErrorCode::HttpResponseIncomplete => "response incomplete".into(),
        ErrorCode::TlsCertificateError => "TLS certificate error".into(),
        ErrorCode::TlsProtocolError => "TLS protocol error".into(),
        ErrorCode::InternalError(Some(m)) => m.clone(),
        other => {
            let d = format!("{other:?}");
            d.strip_prefix("ErrorCode::").unwrap_or(&d).to_owned()
        }
    }
}

fn stream_read(stream: &InputStream, block: bool) -> Result<Vec<u8>, StreamError> {
    if block {
        stream.blocking_read(READ_CHUNK)
    } else {
        stream.read(READ_CHUNK)
    }
}

/// A response whose body is read on demand.
pub struct Answer {
    pub status: u16,
    pub content_type: String,
    pub session_id: Option<String>,
    /// A redirect's target, to name it (redirects are not followed).
    pub location: Option<String>,
    source: Source,
    read: usize,
    /// A standing stream's bytes are not bounded as a whole (its events
    /// are, by the caller).
    endless: bool,
}

enum Source {
    /// Field order is drop order: the pollable is a child of the stream,
    /// the stream of the body; children go first.
    Wasi {
        /// The stream's, made once: a request served beside another
        /// waits many times, and each subscription is two host calls.
        pollable: Option<Pollable>,
        stream: InputStream,
        _body: IncomingBody,
        _response: IncomingResponse,
    },
    /// A scripted body, for the native tests of the session logic.
    #[cfg(test)]
    Canned(std::collections::VecDeque<Vec<u8>>),
}

impl Answer {
    #[cfg(test)]
    pub fn canned(
        status: u16,
        content_type: &str,
        session_id: Option<&str>,
        chunks: Vec<Vec<u8>>,
    ) -> Self {
        Self {
            status,
            content_type: content_type.into(),
            session_id: session_id.map(str::to_owned),
            location: None,
            source: Source::Canned(chunks.into()),
            read: 0,
            endless: false,
        }
    }

    /// What to wait on for the next chunk (`None` in the native tests).
    pub fn pollable(&mut self) -> Option<&Pollable> {
        match &mut self.source {
            Source::Wasi {
                pollable, stream, ..
            } => Some(pollable.get_or_insert_with(|| stream.subscribe())),
            #[cfg(test)]
            Source::Canned(_) => None,
        }
    }

    /// The next chunk, or `None` at the end of the body, serving `side`
    /// while it waits.
    pub fn chunk_beside(&mut self, side: &mut dyn Beside) -> Result<Option<Vec<u8>>, String> {
        loop {
            #[cfg(test)]
            if matches!(self.source, Source::Canned(_)) && side.active() {
                side.serve();
            }
            if !side.active() {
                // One host call, where a read, a poll and a read are three.
                return self.read_chunk(true);
            }
            match self.try_chunk()? {
                Some(bytes) if bytes.is_empty() => {
                    if let Some(p) = self.pollable() {
                        wait(p, side);
                    }
                }
                next => return Ok(next),
            }
        }
    }

    /// What has arrived, without waiting: `Some` of no bytes when nothing
    /// has, `None` at the end of the body.
    pub fn try_chunk(&mut self) -> Result<Option<Vec<u8>>, String> {
        self.read_chunk(false)
    }

    /// What has arrived, waiting for something if `block`.
    fn read_chunk(&mut self, block: bool) -> Result<Option<Vec<u8>>, String> {
        let next = match &mut self.source {
            Source::Wasi { stream, .. } => match stream_read(stream, block) {
                Ok(bytes) => Some(bytes),
                Err(StreamError::Closed) => None,
                Err(StreamError::LastOperationFailed(e)) => {
                    return Err(match wasi::http::types::http_error_code(&e) {
                        Some(code) => format!("reading the answer: {}", reason(&code)),
                        None => format!("reading the answer: {}", e.to_debug_string()),
                    });
                }
            },
            #[cfg(test)]
            Source::Canned(chunks) => chunks.pop_front(),
        };
        if let Some(bytes) = &next
            && !self.endless
        {
            self.read += bytes.len();
            if self.read > MAX_BODY {
                return Err("answer larger than 16 MiB".into());
            }
        }
        Ok(next)
    }

    /// The whole (bounded) body.
    pub fn all(&mut self) -> Result<Vec<u8>, String> {
        self.all_beside(&mut Alone)
    }

    /// The whole (bounded) body, serving `side` while it waits.
    pub fn all_beside(&mut self, side: &mut dyn Beside) -> Result<Vec<u8>, String> {
        let mut out = Vec::new();
        while let Some(c) = self.chunk_beside(side)? {
            out.extend_from_slice(&c);
        }
        Ok(out)
    }
}

fn header(fields: &Fields, name: &str) -> Option<String> {
    let v = fields.get(name).into_iter().next()?;
    String::from_utf8(v).ok().map(|s| s.trim().to_owned())
}

/// POSTs `body` with `headers`; returns once the response head arrived,
/// serving `side` while it waits.
pub fn post(
    ep: &Endpoint,
    headers: &[(&str, &str)],
    body: &[u8],
    side: &mut dyn Beside,
) -> Result<Answer, String> {
    let mut list: Vec<(String, Vec<u8>)> = headers
        .iter()
        .map(|(k, v)| ((*k).to_owned(), v.as_bytes().to_vec()))
        .collect();
    // The length is known: say it, so that the body is not sent chunked
    // (not every server reads a chunked request body).
    list.push((
        "content-length".to_owned(),
        body.len().to_string().into_bytes(),
    ));
    let req = request(ep, &Method::Post, &list)?;
    let out_body = req
        .body()
        .map_err(|()| "request body unavailable".to_owned())?;
    // Handle first, then write: writing a large body before the request is
    // sent could fill the host's pipe and block forever.
    let future = outgoing_handler::handle(req, None).map_err(|e| reason(&e))?;
    let sent = (|| {
        let stream = out_body
            .write()
            .map_err(|()| "request body stream unavailable".to_owned())?;
        for piece in body.chunks(WRITE_CHUNK) {
            stream
                .blocking_write_and_flush(piece)
                .map_err(|e| format!("sending the request: {e:?}"))?;
        }
        // The stream (a child of the body) drops here, before `finish`.
        drop(stream);
        OutgoingBody::finish(out_body, None).map_err(|e| reason(&e))
    })();
    // A body that could not be sent usually means the request failed (the
    // connection was refused or reset): the response's own error names
    // why, so it is preferred to the write's.
    wait(&future.subscribe(), side);
    let response = match (future.get(), sent) {
        (Some(Ok(Ok(r))), Ok(())) => r,
        (Some(Ok(Err(e))), _) => return Err(reason(&e)),
        (_, Err(e)) => return Err(e),
        (Some(Err(())), Ok(())) => return Err("response already taken".into()),
        (None, Ok(())) => return Err("no response".into()),
    };
    answer(response, false)
}

/// GETs the endpoint with `headers` (no body) without waiting for the
/// answer: its head is taken from the [`Pending`] when it comes, within
/// `first_byte` (else the request fails). The answer is a stream meant to
/// stay open, read with [`Answer::try_chunk`] and [`Beside`].
pub fn get(
    ep: &Endpoint,
    headers: &[(&str, &str)],
    first_byte: std::time::Duration,
) -> Result<Pending, String> {
    let list: Vec<(String, Vec<u8>)> = headers
        .iter()
        .map(|(k, v)| ((*k).to_owned(), v.as_bytes().to_vec()))
        .collect();
    let req = request(ep, &Method::Get, &list)?;
    let options = wasi::http::types::RequestOptions::new();
    let nanos = u64::try_from(first_byte.as_nanos()).unwrap_or(u64::MAX);
    options
        .set_first_byte_timeout(Some(nanos))
        .map_err(|()| "the first-byte timeout was refused by wasi:http".to_owned())?;
    let future = outgoing_handler::handle(req, Some(options)).map_err(|e| reason(&e))?;
    Ok(Pending(PendingSource::Wasi {
        pollable: None,
        future,
    }))
}

/// A request sent whose answer's head has not been taken yet.
pub struct Pending(PendingSource);

enum PendingSource {
    /// Field order is drop order: the pollable is the future's child.
    Wasi {
        pollable: Option<Pollable>,
        future: FutureIncomingResponse,
    },
    /// A scripted answer, for the native tests.
    #[cfg(test)]
    Canned(Option<Result<Answer, String>>),
}

impl Pending {
    #[cfg(test)]
    pub fn canned(answer: Result<Answer, String>) -> Self {
        Self(PendingSource::Canned(Some(answer)))
    }

    /// What to wait on for the head (`None` in the native tests).
    pub fn pollable(&mut self) -> Option<&Pollable> {
        match &mut self.0 {
            PendingSource::Wasi { pollable, future } => {
                Some(pollable.get_or_insert_with(|| future.subscribe()))
            }
            #[cfg(test)]
            PendingSource::Canned(_) => None,
        }
    }

    /// The answer, once its head came (or the request failed); `None`
    /// while it has not.
    pub fn take(&mut self) -> Option<Result<Answer, String>> {
        match &mut self.0 {
            PendingSource::Wasi { future, .. } => Some(match future.get()? {
                Ok(Ok(r)) => answer(r, true),
                Ok(Err(e)) => Err(reason(&e)),
                Err(()) => Err("response already taken".into()),
            }),
            #[cfg(test)]
            PendingSource::Canned(a) => a.take(),
        }
    }
}

/// An outgoing request to the endpoint, its head set.
fn request(
    ep: &Endpoint,
    method: &Method,
    headers: &[(String, Vec<u8>)],
) -> Result<OutgoingRequest, String> {
    let fields = Fields::from_list(headers).map_err(|e| format!("request headers: {e:?}"))?;
    let req = OutgoingRequest::new(fields);
    let scheme = if ep.https {
        Scheme::Https
    } else {
        Scheme::Http
    };
    req.set_method(method)
        .and_then(|()| req.set_scheme(Some(&scheme)))
        .and_then(|()| req.set_authority(Some(&ep.authority)))
        .and_then(|()| req.set_path_with_query(Some(&ep.path)))
        .map_err(|()| "the URL was refused by wasi:http".to_owned())?;
    Ok(req)
}

/// A response whose head arrived, its body to be read; `endless`: a
/// standing stream, whose total is not bounded.
fn answer(response: IncomingResponse, endless: bool) -> Result<Answer, String> {
    let status = response.status();
    let (content_type, session_id, location, length) = {
        let h = response.headers();
        (
            header(&h, "content-type").unwrap_or_default(),
            header(&h, "mcp-session-id"),
            header(&h, "location"),
            header(&h, "content-length").and_then(|l| l.parse::<u64>().ok()),
        )
    };
    if length.is_some_and(|l| l > MAX_BODY as u64) {
        return Err("answer larger than 16 MiB".into());
    }
    let body = response
        .consume()
        .map_err(|()| "response body unavailable".to_owned())?;
    let stream = body
        .stream()
        .map_err(|()| "response body stream unavailable".to_owned())?;
    Ok(Answer {
        status,
        content_type,
        session_id,
        location,
        source: Source::Wasi {
            pollable: None,
            stream,
            _body: body,
            _response: response,
        },
        read: 0,
        endless,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let e = Endpoint::parse("http://127.0.0.1:9000/mcp").unwrap();
        assert_eq!(
            (e.https, e.authority.as_str(), e.path.as_str()),
            (false, "127.0.0.1:9000", "/mcp")
        );
        let e = Endpoint::parse("HTTPS://example.com").unwrap();
        assert_eq!((e.https, e.path.as_str()), (true, "/"));
        let e = Endpoint::parse("https://[::1]:8443/a/b?x=1#frag").unwrap();
        assert_eq!(
            (e.authority.as_str(), e.path.as_str()),
            ("[::1]:8443", "/a/b?x=1")
        );
        // Messages show where, never a path or query that may hold a key.
        assert_eq!(e.shown, "https://[::1]:8443");
        let e = Endpoint::parse("HTTP://h:1/mcp/k3y?api_key=s3cret").unwrap();
        assert_eq!(e.shown, "http://h:1");
        let e = Endpoint::parse("http://u:s3cret@h/").unwrap_err();
        assert!(!e.contains("s3cret"), "{e}");
        let e = Endpoint::parse("http://h?q").unwrap();
        assert_eq!(e.path, "/?q");
        assert!(Endpoint::parse("ftp://h/").is_err());
        assert!(Endpoint::parse("http:///mcp").is_err());
        assert!(Endpoint::parse("").is_err());
    }
}
