//! A small blocking HTTP/1.1 client for the MCP HTTP edge's tests: raw
//! sockets, so a test can also send what no well-behaved client sends
//! (slow heads, oversized bodies, half a request).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// One HTTP response.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body as JSON (panics with the body when it is not).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("body is not JSON ({e}): {}", self.text()))
    }

    /// The JSON-RPC messages of an SSE body (`data:` lines), in order.
    pub fn sse_messages(&self) -> Vec<serde_json::Value> {
        sse_messages(&self.text())
    }
}

pub fn sse_messages(text: &str) -> Vec<serde_json::Value> {
    text.split("\n\n")
        .filter_map(|ev| {
            let data: String = ev
                .lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .map(str::trim_start)
                .collect();
            (!data.is_empty()).then(|| serde_json::from_str(&data).unwrap())
        })
        .collect()
}

/// A kept-alive connection to the edge.
pub struct Conn {
    pub stream: BufReader<TcpStream>,
}

pub const ACCEPT_BOTH: (&str, &str) = ("Accept", "application/json, text/event-stream");
pub const JSON: (&str, &str) = ("Content-Type", "application/json");

impl Conn {
    pub fn connect(addr: SocketAddr) -> Conn {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        s.set_nodelay(true).unwrap();
        Conn {
            stream: BufReader::new(s),
        }
    }

    /// POSTs `body` to `/mcp` with the extra header lines `headers` (each
    /// ending in CRLF) and reads the head of an SSE answer: the connection,
    /// ready for its events.
    pub fn open_sse(addr: SocketAddr, headers: &str, body: &str) -> Conn {
        let mut c = Conn::connect(addr);
        c.send_raw(
            format!(
                "POST /mcp HTTP/1.1\r\nHost: x\r\nAccept: application/json, text/event-stream\r\nContent-Type: application/json\r\n{headers}Content-Length: {}\r\n\r\n{body}",
                body.len()
            )
            .as_bytes(),
        );
        let (status, head) = c.read_head();
        assert_eq!(status, 200);
        assert!(
            head.iter()
                .any(|(k, v)| k.eq_ignore_ascii_case("content-type") && v == "text/event-stream"),
            "{head:?}"
        );
        c
    }

    pub fn send_raw(&mut self, bytes: &[u8]) {
        self.stream.get_mut().write_all(bytes).unwrap();
    }

    /// Sends one request and reads its whole response.
    pub fn request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Reply {
        let mut head = format!("{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n");
        for (k, v) in headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        if method != "GET" || !body.is_empty() {
            head.push_str(&format!("Content-Length: {}\r\n", body.len()));
        }
        head.push_str("\r\n");
        let mut msg = head.into_bytes();
        msg.extend_from_slice(body);
        self.send_raw(&msg);
        self.read_reply()
    }

    /// Reads a response head, then its body: by length, chunked to its
    /// end, or (an SSE stream) until the connection closes.
    pub fn read_reply(&mut self) -> Reply {
        let (status, headers) = self.read_head();
        let get = |n: &str| {
            headers
                .iter()
                .find(|(k, _): &&(String, String)| k.eq_ignore_ascii_case(n))
                .map(|(_, v)| v.clone())
        };
        let body = if let Some(n) = get("content-length") {
            let mut b = vec![0; n.parse().unwrap()];
            self.stream.read_exact(&mut b).unwrap();
            b
        } else if get("transfer-encoding").is_some_and(|t| t.contains("chunked")) {
            self.read_chunked(None).0
        } else {
            Vec::new()
        };
        Reply {
            status,
            headers,
            body,
        }
    }

    pub fn read_head(&mut self) -> (u16, Vec<(String, String)>) {
        let mut line = String::new();
        self.stream.read_line(&mut line).unwrap();
        assert!(
            line.starts_with("HTTP/1.1 "),
            "not an HTTP response: {line:?}"
        );
        let status = line[9..12].parse().unwrap();
        let mut headers = Vec::new();
        loop {
            let mut l = String::new();
            self.stream.read_line(&mut l).unwrap();
            let l = l.trim_end();
            if l.is_empty() {
                break;
            }
            let (k, v) = l.split_once(':').unwrap();
            headers.push((k.trim().to_string(), v.trim().to_string()));
        }
        (status, headers)
    }

    /// Reads chunks until the terminating chunk, or until `until` says the
    /// text so far is enough (an open SSE stream); `true` if the body ended.
    pub fn read_chunked(&mut self, until: Option<&dyn Fn(&str) -> bool>) -> (Vec<u8>, bool) {
        let mut body = Vec::new();
        loop {
            let mut size = String::new();
            if self.stream.read_line(&mut size).unwrap() == 0 {
                return (body, true);
            }
            let n = usize::from_str_radix(size.trim(), 16).unwrap();
            if n == 0 {
                let mut crlf = String::new();
                self.stream.read_line(&mut crlf).unwrap();
                return (body, true);
            }
            let mut chunk = vec![0; n + 2];
            self.stream.read_exact(&mut chunk).unwrap();
            body.extend_from_slice(&chunk[..n]);
            if let Some(f) = until
                && f(&String::from_utf8_lossy(&body))
            {
                return (body, false);
            }
        }
    }

    /// POSTs a JSON-RPC message to `/mcp` in `session`.
    pub fn post(&mut self, session: Option<&str>, body: &str) -> Reply {
        let mut h = vec![ACCEPT_BOTH, JSON];
        if let Some(s) = session {
            h.push(("Mcp-Session-Id", s));
        }
        self.request("POST", "/mcp", &h, body.as_bytes())
    }

    /// `initialize` (+ `notifications/initialized`): the new session's id.
    pub fn initialize(&mut self, version: &str) -> String {
        self.initialize_with(&format!(
            r#"{{"protocolVersion":"{version}","capabilities":{{"elicitation":{{}}}},"clientInfo":{{"name":"test","version":"1"}}}}"#
        ))
    }

    /// `initialize` with these `params` (JSON text), then `initialized`:
    /// the new session's id.
    pub fn initialize_with(&mut self, params: &str) -> String {
        let r = self.post(
            None,
            &format!(r#"{{"jsonrpc":"2.0","id":0,"method":"initialize","params":{params}}}"#),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        let id = r
            .header("mcp-session-id")
            .unwrap_or_else(|| panic!("no session id: {r:?}"))
            .to_string();
        let n = self.post(
            Some(&id),
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        );
        assert_eq!(n.status, 202, "{}", n.text());
        id
    }

    /// A JSON-RPC call answered as JSON: its `result` or `error` object.
    pub fn call(
        &mut self,
        session: &str,
        id: u64,
        method: &str,
        params: &str,
    ) -> serde_json::Value {
        let r = self.post(
            Some(session),
            &format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"{method}","params":{params}}}"#),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        let v = if r
            .header("content-type")
            .is_some_and(|c| c.starts_with("text/event-stream"))
        {
            r.sse_messages().pop().unwrap()
        } else {
            r.json()
        };
        assert_eq!(v["id"], serde_json::json!(id), "{v}");
        v
    }
}

/// Waits until `f` holds, for at most `within`.
pub fn eventually(within: Duration, mut f: impl FnMut() -> bool) -> bool {
    let until = Instant::now() + within;
    while Instant::now() < until {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}
