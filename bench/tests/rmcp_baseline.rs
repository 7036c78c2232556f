//! `rmcp-baseline` serves the broker's `echo` tools the way the bundled
//! `echo` router does, over a real Streamable HTTP session: the HTTP-edge
//! benchmark (`scripts/bench --slo`) compares the broker with it, so its
//! answers must be the same work.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start() -> (Server, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_rmcp-baseline"))
        .args(["--listen", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn rmcp-baseline");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("http="))
        .unwrap_or_else(|| panic!("no ready line: {line:?}"))
        .to_owned();
    (Server(child), addr)
}

/// One POST on its own connection (`Connection: close`, read to the end):
/// (status line, head, body).
fn post(addr: &str, session: Option<&str>, body: &str) -> (String, String, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let session = session.map_or(String::new(), |id| format!("Mcp-Session-Id: {id}\r\n"));
    write!(
        s,
        "POST /mcp HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nMCP-Protocol-Version: 2025-11-25\r\n\
         {session}Connection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").expect("a response head");
    let status = head.lines().next().unwrap_or_default().to_owned();
    (status, head.to_owned(), body.to_owned())
}

#[test]
fn serves_the_echo_tools_in_a_session() {
    let (_server, addr) = start();
    let (status, head, body) = post(
        &addr,
        None,
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#,
    );
    assert!(status.contains(" 200"), "{status}\n{body}");
    assert!(body.contains(r#""protocolVersion":"2025-11-25""#), "{body}");
    let session = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("mcp-session-id")
                .then(|| v.trim().to_owned())
        })
        .expect("a session id");
    let (status, _, _) = post(
        &addr,
        Some(&session),
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
    );
    assert!(status.contains(" 202"), "{status}");

    let (_, _, body) = post(
        &addr,
        Some(&session),
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#,
    );
    assert!(
        body.contains(r#""name":"echo""#) && body.contains(r#""name":"echo_text""#),
        "{body}"
    );

    let (_, _, body) = post(
        &addr,
        Some(&session),
        r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"echo","arguments":{"text":"hello"}}}"#,
    );
    assert!(
        body.contains(r#""structuredContent":{"text":"hello"}"#),
        "{body}"
    );
    let (_, _, body) = post(
        &addr,
        Some(&session),
        r#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"echo_text","arguments":{"text":"hi"}}}"#,
    );
    assert!(body.contains(r#""text":"hi""#), "{body}");
    let (_, _, body) = post(
        &addr,
        Some(&session),
        r#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"echo_text","arguments":{}}}"#,
    );
    assert!(
        body.contains(r#""error""#) && body.contains("echo_text needs"),
        "{body}"
    );
}
