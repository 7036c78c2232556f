//! Upstream routers against real MCP servers: Python FastMCP servers
//! (`tests/upstreams/server.py`, PyPI `mcp` 1.x from `.tools/mcp1`, which
//! `scripts/setup` creates) started by the tests on loopback, behind the
//! real `mcp-broker` binary, through all three edges.
//!
//! Needs the bundled routers (`scripts/build-routers`), including
//! `upstream` and the test-only `netprobe`.

mod common;

use std::ffi::OsString;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::grpc::{client as grpc_client, rt, with_session};
use common::http::{ACCEPT_BOTH, Conn, JSON, eventually};
use common::{Broker, DeadPort};
use mcp_schema::client::ResponseView;
use serde_json::{Value, json};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The Python with FastMCP: `.tools/mcp1` (scripts/setup), else python3.
fn python() -> PathBuf {
    let venv = repo().join(".tools/mcp1/bin/python");
    let py = if venv.exists() {
        venv
    } else {
        PathBuf::from("python3")
    };
    let ok = Command::new(&py)
        .args(["-c", "import mcp.server.fastmcp, uvicorn"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "{} cannot `import mcp.server.fastmcp, uvicorn`: run scripts/setup",
        py.display()
    );
    py
}

/// A FastMCP fixture server; killed on drop.
struct Upstream {
    child: Child,
    port: u16,
    name: String,
    state: PathBuf,
    /// `server.py`'s further arguments.
    extra: Vec<OsString>,
    /// Its port while it is killed, until `restart`.
    held: Option<DeadPort>,
}

impl Upstream {
    /// Starts server `name` on any free port, keeping counts in `state`.
    fn start(name: &str, state: &Path) -> Upstream {
        Self::start_on(name, DeadPort::any(), state, &[])
    }

    /// Starts server `name` listening on `port`'s socket, which it inherits
    /// (the port is never free in between); `extra`: `server.py`'s further
    /// arguments.
    fn start_on(name: &str, port: DeadPort, state: &Path, extra: &[OsString]) -> Upstream {
        use std::os::fd::AsRawFd;
        std::fs::create_dir_all(state).unwrap();
        let fd = port.sock.as_raw_fd();
        let mut cmd = Command::new(python());
        cmd.arg(repo().join("broker/tests/upstreams/server.py"))
            .arg("0")
            .args(["--fd", &fd.to_string()])
            .args(["--name", name, "--state"])
            .arg(state)
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        hand_over(&mut cmd, &port);
        let mut child = cmd.spawn().expect("start server.py");
        // The server holds the socket now; ours must go, or the port would
        // stay listening (with no one accepting) after the server is killed.
        drop(port);
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("http=127.0.0.1:"))
            .unwrap_or_else(|| panic!("no ready line from server.py: {line:?}"))
            .parse()
            .unwrap();
        Upstream {
            child,
            port,
            name: name.into(),
            state: state.into(),
            extra: extra.to_vec(),
            held: None,
        }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }

    /// Kills it and holds its port, dead, until `restart`.
    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.held = Some(DeadPort::reclaim(self.port));
    }

    /// Starts it again on the same port.
    fn restart(&mut self) {
        if self.held.is_none() {
            self.kill();
        }
        let port = self.held.take().unwrap();
        *self = Upstream::start_on(&self.name.clone(), port, &self.state.clone(), &self.extra);
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Lets the child `cmd` starts inherit `port`'s socket, under its own
/// descriptor number.
fn hand_over(cmd: &mut Command, port: &DeadPort) {
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;
    let fd = port.sock.as_raw_fd();
    // SAFETY: between fork and exec, only fcntl (async-signal-safe) on
    // a descriptor this process owns; cleared in the child alone, so no
    // other test's child inherits the socket.
    unsafe {
        cmd.pre_exec(move || {
            if libc::fcntl(fd, libc::F_SETFD, 0) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// The reference MCP server of the TypeScript SDK's authors,
/// `@modelcontextprotocol/server-everything` (tools/node, pinned), in its
/// Streamable HTTP mode on `port`'s socket (`upstreams/listen-fd.mjs`);
/// killed on drop.
struct Everything {
    child: Child,
    port: u16,
}

impl Everything {
    fn start_on(port: DeadPort) -> Everything {
        use std::os::fd::AsRawFd;
        let node = repo().join(".tools/node/bin/node");
        let server = repo()
            .join("tools/node/node_modules/@modelcontextprotocol/server-everything/dist/index.js");
        assert!(
            node.exists() && server.exists(),
            "{} or {} is missing: run scripts/setup",
            node.display(),
            server.display()
        );
        let mut cmd = Command::new(node);
        cmd.arg("--import")
            .arg(repo().join("broker/tests/upstreams/listen-fd.mjs"))
            .arg(server)
            .arg("streamableHttp")
            .env("MCP_TEST_LISTEN_FD", port.sock.as_raw_fd().to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        hand_over(&mut cmd, &port);
        let child = cmd.spawn().expect("start server-everything");
        let n = port.port;
        drop(port);
        // Listening once it answers: the socket was bound before, so a
        // connection is refused until node has called listen().
        let up = common::http::eventually(Duration::from_secs(30), || {
            std::net::TcpStream::connect(("127.0.0.1", n)).is_ok()
        });
        assert!(up, "server-everything did not listen within 30 s");
        Everything { child, port: n }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }

    /// Kills it, holding its port until it starts again on it.
    fn restart(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let port = DeadPort::reclaim(self.port);
        *self = Everything::start_on(port);
    }
}

impl Drop for Everything {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The upstream servers' state (and certificates) of one test, removed when
/// the test ends. Declared before the servers, it outlives them.
fn state_dir(test: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("mcp-broker-upstream-{test}-"))
        .tempdir()
        .expect("a scratch directory")
}

/// The embedded default plus one `[[routers]]` entry per `(name, url,
/// extra lines)`.
fn config(routers: &[(&str, &str, &str)]) -> String {
    let mut c = mcp_broker::config::DEFAULT_TOML.to_string();
    for (name, url, extra) in routers {
        c.push_str(&format!(
            "\n[[routers]]\nname = \"{name}\"\nupstream = \"{url}\"\n{extra}\n"
        ));
    }
    c
}

/// A connection holding session `s`'s GET stream open (head read).
fn listen(b: &Broker, s: &str) -> Conn {
    let mut c = Conn::connect(b.http);
    c.send_raw(
        format!(
            "GET /mcp HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\nMcp-Session-Id: {s}\r\n\r\n"
        )
        .as_bytes(),
    );
    assert_eq!(c.read_head().0, 200);
    c
}

/// Starts the broker on `toml` (written into `dir`), which must refuse to
/// start: its stderr.
fn refused_start(toml: &str, dir: &Path) -> String {
    std::fs::create_dir_all(dir).unwrap();
    let path = dir.join("refused.toml");
    std::fs::write(&path, toml).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_mcp-broker"))
        .arg("--config")
        .arg(&path)
        .args(["--listen", "127.0.0.1:0", "--grpc-listen", "127.0.0.1:0"])
        .args(["--http-listen", "127.0.0.1:0"])
        .args(["--metrics-listen", "127.0.0.1:0"])
        .output()
        .unwrap();
    assert!(!out.status.success(), "the broker started");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Whether the fixture upstream has counted `n` cancelled calls of `slow`
/// within 10 s (it counts a `notifications/cancelled` it acted on).
fn upstream_counts_cancelled(c: &mut Conn, s: &str, n: u32) -> bool {
    let mut id = 1000;
    eventually(Duration::from_secs(10), || {
        id += 1;
        let r = c.call(
            s,
            id,
            "tools/call",
            r#"{"name":"cancelled","arguments":{}}"#,
        );
        r["result"]["content"][0]["text"] == n.to_string().as_str()
    })
}

/// An HTTP session on `b`: the connection and the session id.
fn session(b: &Broker) -> (Conn, String) {
    let mut c = Conn::connect(b.http);
    let s = c.initialize("2025-06-18");
    (c, s)
}

fn text_of(result: &Value) -> String {
    result["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("no text block in {result}"))
        .to_string()
}

fn names(list: &Value, key: &str, field: &str) -> Vec<String> {
    list["result"][key]
        .as_array()
        .unwrap_or_else(|| panic!("no {key} in {list}"))
        .iter()
        .map(|t| t[field].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn two_upstreams_with_colliding_names_are_listed_and_called_on_every_edge() {
    let scratch = state_dir("two");
    let dir = scratch.path();
    let alpha = Upstream::start("alpha", &dir.join("alpha"));
    let beta = Upstream::start("beta", &dir.join("beta"));
    let b = Broker::start_with_config(
        &config(&[
            (
                "alpha",
                &alpha.url(),
                r#"upstream_headers = { Authorization = "Bearer alpha-secret" }"#,
            ),
            ("beta", &beta.url(), ""),
        ]),
        &["--shards", "2"],
    );
    assert!(
        b.ready_line.contains("routers=echo,kv,library,alpha,beta"),
        "{}",
        b.ready_line
    );

    // HTTP: listings merged, the colliding names qualified.
    let (mut c, s) = session(&b);
    let tools = c.call(&s, 1, "tools/list", "{}");
    let tools = names(&tools, "tools", "name");
    for t in [
        "alpha__add",
        "beta__add",
        "alpha__whoami",
        "beta__whoami",
        "alpha_only",
        "beta_only",
        "echo",
    ] {
        assert!(tools.contains(&t.to_string()), "{t} not in {tools:?}");
    }
    assert!(!tools.contains(&"add".to_string()), "{tools:?}");
    let r = c.call(
        &s,
        2,
        "tools/call",
        r#"{"name":"alpha__add","arguments":{"a":2,"b":3}}"#,
    );
    assert_eq!(text_of(&r["result"]), "5", "{r}");
    let r = c.call(
        &s,
        3,
        "tools/call",
        r#"{"name":"beta_only","arguments":{}}"#,
    );
    assert_eq!(text_of(&r["result"]), "only on beta", "{r}");

    // Resources, templates, prompts.
    let res = c.call(&s, 4, "resources/list", "{}");
    let uris = names(&res, "resources", "uri");
    assert!(
        uris.contains(&"fixture://alpha/about".to_string()),
        "{uris:?}"
    );
    assert!(
        uris.contains(&"fixture://beta/about".to_string()),
        "{uris:?}"
    );
    let r = c.call(&s, 5, "resources/read", r#"{"uri":"fixture://beta/about"}"#);
    assert_eq!(r["result"]["contents"][0]["text"], "about beta", "{r}");
    let t = c.call(&s, 6, "resources/templates/list", "{}");
    let templates = names(&t, "resourceTemplates", "uriTemplate");
    assert!(
        templates.contains(&"greeting://alpha/{who}".to_string()),
        "{templates:?}"
    );
    let r = c.call(&s, 7, "resources/read", r#"{"uri":"greeting://alpha/Ann"}"#);
    assert_eq!(
        r["result"]["contents"][0]["text"], "greetings, Ann, from alpha",
        "{r}"
    );
    let p = c.call(&s, 8, "prompts/list", "{}");
    let prompts = names(&p, "prompts", "name");
    assert!(prompts.contains(&"alpha__greet".to_string()), "{prompts:?}");
    let r = c.call(
        &s,
        9,
        "prompts/get",
        r#"{"name":"beta__greet","arguments":{"who":"Bob"}}"#,
    );
    assert_eq!(
        r["result"]["messages"][0]["content"]["text"], "Hello, Bob, from beta!",
        "{r}"
    );

    // No token passthrough: the client's token stays at the broker, the
    // upstream sees the router's own credentials (and beta none at all).
    let call = r#"{"jsonrpc":"2.0","id":10,"method":"tools/call","params":{"name":"alpha__whoami","arguments":{}}}"#;
    let r = c.request(
        "POST",
        "/mcp",
        &[
            ACCEPT_BOTH,
            JSON,
            ("Mcp-Session-Id", &s),
            ("Authorization", "Bearer client-token"),
        ],
        call.as_bytes(),
    );
    let v = last_message(&r);
    assert_eq!(
        text_of(&v["result"]),
        "alpha auth=Bearer alpha-secret",
        "{v}"
    );
    let r = c.call(
        &s,
        11,
        "tools/call",
        r#"{"name":"beta__whoami","arguments":{}}"#,
    );
    assert_eq!(text_of(&r["result"]), "beta auth=", "{r}");

    // Frames.
    let mut f = b.connect();
    let r = f.call("alpha__add", &[("a", "40"), ("b", "2")], None);
    assert_eq!(common::tool_text(&r), "42");
    let r = f.call("alpha_only", &[], None);
    assert_eq!(common::tool_text(&r), "only on alpha");
    let r = f.request(None, |e, h| {
        e.read_resource(h, "greeting://beta/Cy").to_vec()
    });
    let rd = ResponseView::parse(&r)
        .unwrap()
        .response
        .payload_as_resource_data()
        .expect("ResourceData");
    assert_eq!(
        rd.content_as_resource_content().unwrap().text(),
        Some("greetings, Cy, from beta")
    );
    let r = f.request(None, |e, h| {
        e.get_prompt(h, "alpha__greet", &[("who", "\"Di\"")])
            .to_vec()
    });
    let ap = ResponseView::parse(&r)
        .unwrap()
        .response
        .payload_as_applied_prompt()
        .expect("AppliedPrompt");
    let first = ap.messages().unwrap().get(0);
    assert_eq!(
        first.content_as_text_content().unwrap().text(),
        "Hello, Di, from alpha!"
    );

    // gRPC.
    let rt = rt();
    rt.block_on(async {
        use mcp_proto::v1 as pb;
        let mut g = grpc_client(&b).await;
        let list = g
            .list_tools(pb::ListToolsRequest { cursor: None })
            .await
            .unwrap()
            .into_inner();
        assert!(list.tools.iter().any(|t| t.name == "beta__add"), "{list:?}");
        let r = g
            .call_tool(pb::CallToolRequest {
                name: "beta__add".into(),
                arguments: Some(br#"{"a":1,"b":1}"#.to_vec()),
            })
            .await
            .unwrap()
            .into_inner();
        match &r.content[0].content {
            Some(pb::content::Content::Text(t)) => assert_eq!(t.text, "2"),
            other => panic!("{other:?}"),
        }
        let r = g
            .read_resource(pb::ReadResourceRequest {
                uri: "fixture://alpha/about".into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            r.contents[0].content,
            Some(pb::resource_content::Content::Text("about alpha".into()))
        );
        let r = g
            .get_prompt(pb::GetPromptRequest {
                name: "beta__greet".into(),
                arguments: Some(br#"{"who":"Ed"}"#.to_vec()),
            })
            .await
            .unwrap()
            .into_inner();
        match r.messages[0]
            .content
            .as_ref()
            .and_then(|c| c.content.as_ref())
        {
            Some(pb::content::Content::Text(t)) => assert_eq!(t.text, "Hello, Ed, from beta!"),
            other => panic!("{other:?}"),
        }
    });
}

/// The final JSON-RPC message of a reply (JSON, or the last SSE event).
fn last_message(r: &common::http::Reply) -> Value {
    assert_eq!(r.status, 200, "{}", r.text());
    if r.header("content-type")
        .is_some_and(|c| c.starts_with("text/event-stream"))
    {
        r.sse_messages().pop().unwrap()
    } else {
        r.json()
    }
}

#[test]
fn progress_and_logs_arrive_before_the_result_and_errors_are_clear() {
    let scratch = state_dir("progress");
    let dir = scratch.path();
    let alpha = Upstream::start("alpha", dir);
    let b = Broker::start_with_config(&config(&[("alpha", &alpha.url(), "")]), &[]);
    let (mut c, s) = session(&b);
    // The HTTP edge sends log notifications once the session asked for them.
    let r = c.call(&s, 0, "logging/setLevel", r#"{"level":"info"}"#);
    assert!(r["result"].is_object(), "{r}");
    let r = c.post(
        Some(&s),
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"steps","arguments":{"n":3},"_meta":{"progressToken":"tok"}}}"#,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let msgs = r.sse_messages();
    let progress: Vec<&Value> = msgs
        .iter()
        .filter(|m| m["method"] == "notifications/progress")
        .collect();
    assert_eq!(progress.len(), 3, "{msgs:?}");
    assert_eq!(progress[0]["params"]["progressToken"], "tok");
    // As the upstream reported them: 1, 2, 3 of 3.
    let reported: Vec<_> = progress
        .iter()
        .map(|p| {
            (
                p["params"]["progress"].clone(),
                p["params"]["total"].clone(),
            )
        })
        .collect();
    assert_eq!(
        reported,
        [1, 2, 3].map(|i| (json!(i), json!(3))),
        "{msgs:?}"
    );
    // With no total upstream, none here (it once read "3 of 1").
    let r = c.post(
        Some(&s),
        r#"{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"steps","arguments":{"n":3,"open_ended":true},"_meta":{"progressToken":"open"}}}"#,
    );
    let open: Vec<_> = r
        .sse_messages()
        .into_iter()
        .filter(|m| m["method"] == "notifications/progress")
        .map(|m| m["params"].clone())
        .collect();
    assert_eq!(
        open,
        [1, 2, 3].map(
            |i| json!({"progressToken": "open", "progress": i, "message": format!("step {i}")})
        ),
    );
    assert!(
        msgs.iter().any(|m| m["method"] == "notifications/message"
            && m["params"]["data"].to_string().contains("step 2 of 3")),
        "{msgs:?}"
    );
    let last = msgs.last().unwrap();
    assert_eq!(text_of(&last["result"]), "done 3", "{msgs:?}");

    // A tool that raises upstream: an isError result with its message.
    let r = c.call(&s, 2, "tools/call", r#"{"name":"fail","arguments":{}}"#);
    assert_eq!(r["result"]["isError"], true, "{r}");
    assert!(
        text_of(&r["result"]).contains("alpha failed on purpose"),
        "{r}"
    );
    // Bad arguments, as the upstream judges them.
    let r = c.call(
        &s,
        3,
        "tools/call",
        r#"{"name":"add","arguments":{"a":"x"}}"#,
    );
    assert!(
        r["result"]["isError"] == true || r["error"]["code"] == -32602,
        "{r}"
    );
}

/// FastMCP before 1.30 sends a call's progress unrelated to its request,
/// so on the session's GET stream; any release does so with a question
/// asked without `related_request_id`. The router listens there while a
/// call runs: the progress reaches the client live, and the question is
/// refused at once instead of waiting for the deadline. An
/// upstream answering in JSON, whose call stream carries nothing but the
/// result, is heard there too.
#[test]
fn progress_logs_and_questions_sent_on_the_get_stream_are_served_beside_the_call() {
    let scratch = state_dir("aside");
    let dir = scratch.path();
    let alpha = Upstream::start("alpha", dir);
    let beta = Upstream::start_on("beta", DeadPort::any(), dir, &["--json".into()]);
    let b = Broker::start_with_config(
        &config(&[
            ("alpha", &alpha.url(), "call_deadline = \"20s\""),
            ("beta", &beta.url(), "call_deadline = \"20s\""),
        ]),
        &[],
    );
    let (mut c, s) = session(&b);
    let r = c.call(&s, 0, "logging/setLevel", r#"{"level":"info"}"#);
    assert!(r["result"].is_object(), "{r}");
    for (round, server) in [(1, "alpha"), (2, "beta"), (3, "alpha")] {
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":{round},"method":"tools/call","params":{{"name":"{server}__steps_aside","arguments":{{"n":3,"delay":0.05}},"_meta":{{"progressToken":"t{round}"}}}}}}"#
        );
        let r = c.post(Some(&s), &body);
        assert_eq!(r.status, 200, "{}", r.text());
        let msgs = r.sse_messages();
        let progress: Vec<_> = msgs
            .iter()
            .filter(|m| m["method"] == "notifications/progress")
            .map(|m| m["params"].clone())
            .collect();
        assert_eq!(
            progress,
            [1, 2, 3].map(|i| json!({"progressToken": format!("t{round}"), "progress": i, "total": 3, "message": format!("aside {i}")})),
            "{server}, round {round}: {msgs:?}"
        );
        // Logs sent there are not taken: nothing ties them to the call,
        // and the instance's session serves many clients in turn.
        let logs = msgs
            .iter()
            .filter(|m| m["method"] == "notifications/message")
            .count();
        assert_eq!(logs, 0, "{server}: {msgs:?}");
        assert_eq!(text_of(&msgs.last().unwrap()["result"]), "done 3");
    }
    // A question on the GET stream is refused at once, as one on the
    // call's stream is; it used to wait for the 20 s deadline.
    for server in ["alpha", "beta"] {
        let t0 = Instant::now();
        let r = c.call(
            &s,
            5,
            "tools/call",
            &format!(r#"{{"name":"{server}__ask_aside","arguments":{{}}}}"#),
        );
        let text = text_of(&r["result"]);
        assert!(
            text.starts_with("refused:") && text.contains("not supported through mcp-broker"),
            "{server}: {r}"
        );
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "{server}: {:?}",
            t0.elapsed()
        );
    }
}

#[test]
fn an_upstream_down_at_start_is_retried_and_its_tools_appear_with_list_changed() {
    let scratch = state_dir("late");
    let dir = scratch.path();
    let port = DeadPort::any();
    let b = Broker::start_with_config(
        &config(&[(
            "late",
            &format!("http://127.0.0.1:{}/mcp", port.port),
            "refresh_interval = \"2s\"",
        )]),
        &[],
    );
    // Not fatal: the broker serves its other routers and says why.
    let (status, body) = b.http_get("/readyz");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("upstream late unavailable"), "{body}");
    assert_eq!(b.metric_sum("mcp_upstream_available"), 0.0);
    // No revision spoken yet: no protocol series.
    assert_eq!(b.metric_sum("mcp_upstream_protocol_info"), 0.0);
    let (mut c, s) = session(&b);
    let r = c.call(
        &s,
        1,
        "tools/call",
        r#"{"name":"echo_text","arguments":{"text":"hi"}}"#,
    );
    assert_eq!(text_of(&r["result"]), "hi");
    let tools = names(&c.call(&s, 2, "tools/list", "{}"), "tools", "name");
    assert!(!tools.contains(&"late_only".to_string()), "{tools:?}");

    // A client listening on the session's GET stream.
    let mut listen = listen(&b, &s);

    let up = Upstream::start_on("late", port, dir, &[]);
    // Retried with backoff (1 s, 2 s): the tools appear, and the listening
    // client is told.
    let (events, _) = listen.read_chunked(Some(&|t: &str| {
        t.contains("notifications/tools/list_changed")
    }));
    let events = String::from_utf8_lossy(&events);
    assert!(
        events.contains("notifications/tools/list_changed"),
        "{events}"
    );
    let tools = names(&c.call(&s, 3, "tools/list", "{}"), "tools", "name");
    assert!(tools.contains(&"late_only".to_string()), "{tools:?}");
    let r = c.call(
        &s,
        4,
        "tools/call",
        r#"{"name":"late_only","arguments":{}}"#,
    );
    assert_eq!(text_of(&r["result"]), "only on late");
    assert_eq!(b.metric_sum("mcp_upstream_available"), 1.0);
    // FastMCP 1.x refuses server/discover without a session: a session it
    // is.
    let (_, metrics) = b.http_get("/metrics");
    assert!(
        metrics.contains(r#"mcp_upstream_protocol_info{router="late",protocol="2025-06-18"} 1"#),
        "{metrics}"
    );
    let (_, body) = b.http_get("/readyz");
    assert_eq!(body, "ready\n");

    // The upstream goes away after its listings were read: a re-read finds
    // it unavailable (the refresh instance's session alone said nothing of
    // it), and its tools stay listed, their calls saying why, rather than
    // vanish from the listings.
    drop(up);
    assert!(
        eventually(Duration::from_secs(20), || {
            b.metric_sum("mcp_upstream_available") == 0.0
        }),
        "the gone upstream still reads available"
    );
    assert!(b.metric_sum("mcp_upstream_refresh_failures_total") >= 1.0);
    let (_, body) = b.http_get("/readyz");
    assert!(body.contains("upstream late unavailable"), "{body}");
    let tools = names(&c.call(&s, 5, "tools/list", "{}"), "tools", "name");
    assert!(tools.contains(&"late_only".to_string()), "{tools:?}");
    let r = c.call(
        &s,
        6,
        "tools/call",
        r#"{"name":"late_only","arguments":{}}"#,
    );
    assert!(r.to_string().contains("upstream unavailable"), "{r}");
}

#[test]
fn an_upstream_announcing_list_changed_is_relisted_for_every_edge() {
    let scratch = state_dir("grow");
    let dir = scratch.path();
    let alpha = Upstream::start("alpha", dir);
    let b = Broker::start_with_config(&config(&[("alpha", &alpha.url(), "")]), &[]);
    let (mut c, s) = session(&b);
    let mut listen = listen(&b, &s);
    // A frame client that initialized is told; one that did not is not.
    let mut framed = b.connect();
    framed.request(None, |e, h| {
        e.initialize(
            h,
            mcp_schema::fb::protocol::ProtocolVersion::V2025_06_18,
            "t",
            "1",
        )
        .to_vec()
    });
    let mut quiet = b.connect();
    quiet.call("echo_text", &[("text", "\"hi\"")], None);
    let rt = rt();
    let mut sub = rt.block_on(async {
        use mcp_proto::v1 as pb;
        let mut g = grpc_client(&b).await;
        g.subscribe(pb::SubscribeRequest {
            topics: vec!["tool_list_changed".into()],
        })
        .await
        .unwrap()
        .into_inner()
    });
    let r = c.call(&s, 1, "tools/call", r#"{"name":"grow","arguments":{}}"#);
    assert_eq!(text_of(&r["result"]), "grown_1", "{r}");
    // The hint is not passed on to the client.
    assert!(!r.to_string().contains("mcp-broker/list-changed"), "{r}");
    let (events, _) = listen.read_chunked(Some(&|t: &str| {
        t.contains("notifications/tools/list_changed")
    }));
    assert!(String::from_utf8_lossy(&events).contains("tools/list_changed"));
    let tools = names(&c.call(&s, 2, "tools/list", "{}"), "tools", "name");
    assert!(tools.contains(&"grown_1".to_string()), "{tools:?}");
    let r = c.call(&s, 3, "tools/call", r#"{"name":"grown_1","arguments":{}}"#);
    assert_eq!(text_of(&r["result"]), "grown 1");
    let n = rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(10), sub.message())
            .await
            .expect("a notification within 10 s")
            .unwrap()
            .unwrap()
    });
    assert!(
        matches!(
            n.notification,
            Some(mcp_proto::v1::notification::Notification::ToolListChanged(
                _
            ))
        ),
        "{n:?}"
    );
    let n = framed
        .read_frame()
        .expect("a ListChangedNotification frame");
    let v = ResponseView::parse(&n).unwrap();
    assert_eq!(v.correlation_id(), "");
    let lc = v
        .response
        .payload_as_list_changed_notification()
        .expect("ListChangedNotification");
    assert!(lc.tools() && !lc.resources() && !lc.prompts());
    assert_eq!(
        common::tool_text(&framed.call("grown_1", &[], None)),
        "grown 1"
    );
    // The first frame it reads after the change is the answer to its ping
    // (read raw: `request` would skip a notification).
    let (_, id) = quiet.header();
    let h = mcp_schema::client::RequestHeader {
        message_id: id,
        correlation_id: Some("q"),
        session_id: None,
        timeout_ms: 0,
        unix_nanos: 0,
    };
    let ping = quiet.enc.ping(&h).to_vec();
    quiet.send_raw(&ping);
    let pong = quiet.read_frame().unwrap();
    assert_eq!(
        ResponseView::parse(&pong).unwrap().payload_type(),
        mcp_schema::fb::protocol::ResponsePayload::PingResponse,
        "a connection that never initialized gets no notification"
    );
}

#[test]
fn a_killed_upstream_fails_calls_clearly_and_serves_again_after_restart() {
    let scratch = state_dir("restart");
    let dir = scratch.path();
    let mut alpha = Upstream::start("alpha", dir);
    let b = Broker::start_with_config(
        &config(&[("alpha", &alpha.url(), "call_deadline = \"20s\"")]),
        &[],
    );
    let (mut c, s) = session(&b);
    assert_eq!(
        text_of(
            &c.call(
                &s,
                1,
                "tools/call",
                r#"{"name":"add","arguments":{"a":1,"b":2}}"#
            )["result"]
        ),
        "3"
    );
    // Killed mid-call: the call ends at once with the reason, not at its
    // deadline.
    let http = b.http;
    let sid = s.clone();
    let slow = std::thread::spawn(move || {
        let mut c = Conn::connect(http);
        let t0 = Instant::now();
        let r = c.call(
            &sid,
            2,
            "tools/call",
            r#"{"name":"slow","arguments":{"seconds":30}}"#,
        );
        (r, t0.elapsed())
    });
    std::thread::sleep(Duration::from_millis(700));
    alpha.kill();
    let (r, took) = slow.join().unwrap();
    assert!(took < Duration::from_secs(10), "took {took:?}");
    assert_eq!(r["error"]["code"], -32006, "{r}");
    assert_eq!(r["error"]["data"]["retryable"], true, "{r}");
    let msg = r["error"]["message"].as_str().unwrap();
    assert!(
        msg.starts_with("upstream unavailable: tools/call to http://127.0.0.1:"),
        "{r}"
    );
    // While it is down, a call says so, on every edge. Usually the pool has
    // dropped the dead connection and a new one is refused; on a loaded
    // machine the pool may not have seen the close yet, and the call finds
    // the pooled connection closed instead. Either names the cause.
    let r = c.call(
        &s,
        3,
        "tools/call",
        r#"{"name":"add","arguments":{"a":1,"b":2}}"#,
    );
    assert_eq!(r["error"]["code"], -32006, "{r}");
    let msg = r["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("connection refused") || msg.contains("connection closed"),
        "{r}"
    );
    let mut f = b.connect();
    let r = f.call("add", &[("a", "1"), ("b", "2")], None);
    assert_eq!(common::error_code(&r), Some(-32006));
    let rt = rt();
    let status = rt.block_on(async {
        grpc_client(&b)
            .await
            .call_tool(mcp_proto::v1::CallToolRequest {
                name: "add".into(),
                arguments: Some(br#"{"a":1,"b":2}"#.to_vec()),
            })
            .await
            .unwrap_err()
    });
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    // Restarted (a new process: the old MCP session is gone, 404): calls
    // succeed again without restarting the broker.
    alpha.restart();
    assert!(eventually(Duration::from_secs(10), || {
        let r = c.call(
            &s,
            4,
            "tools/call",
            r#"{"name":"add","arguments":{"a":2,"b":2}}"#,
        );
        r["result"]["content"][0]["text"] == "4"
    }));
    // Other routers were never affected.
    let r = c.call(
        &s,
        5,
        "tools/call",
        r#"{"name":"echo_text","arguments":{"text":"ok"}}"#,
    );
    assert_eq!(text_of(&r["result"]), "ok");
}

#[test]
fn a_slow_upstream_hits_the_deadline_and_an_abandoned_call_is_cancelled_upstream() {
    let scratch = state_dir("slow");
    let dir = scratch.path();
    let alpha = Upstream::start("alpha", dir);
    let b = Broker::start_with_config(
        &config(&[("alpha", &alpha.url(), "call_deadline = \"1s\"")]),
        &[],
    );
    let (mut c, s) = session(&b);
    let t0 = Instant::now();
    let r = c.call(
        &s,
        1,
        "tools/call",
        r#"{"name":"slow","arguments":{"seconds":5}}"#,
    );
    let took = t0.elapsed();
    assert!(took < Duration::from_secs(4), "took {took:?}");
    assert_eq!(r["error"]["code"], -32001, "{r}");
    // The upstream was told, and cancelled the call.
    assert!(
        upstream_counts_cancelled(&mut c, &s, 1),
        "the upstream never saw notifications/cancelled"
    );
    assert!(b.metric_sum("mcp_upstream_cancels_total") >= 1.0);

    // A client's own cancellation reaches the upstream too.
    let http = b.http;
    let sid = s.clone();
    let t = std::thread::spawn(move || {
        let mut c = Conn::connect(http);
        c.post(
            Some(&sid),
            r#"{"jsonrpc":"2.0","id":"slow-2","method":"tools/call","params":{"name":"slow","arguments":{"seconds":0.9}}}"#,
        )
    });
    std::thread::sleep(Duration::from_millis(300));
    let n = c.post(
        Some(&s),
        r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"slow-2"}}"#,
    );
    assert_eq!(n.status, 202);
    let _ = t.join();
    assert!(
        upstream_counts_cancelled(&mut c, &s, 2),
        "the client's cancellation did not reach the upstream"
    );
}

#[test]
fn a_guest_reaches_its_granted_origin_only() {
    let scratch = state_dir("grant");
    let dir = scratch.path();
    let alpha = Upstream::start("alpha", &dir.join("a"));
    let other = Upstream::start("other", &dir.join("o"));
    let mut toml = config(&[]);
    toml.push_str(&format!(
        "\n[[routers]]\nname = \"probe\"\nwasm = \"netprobe.wasm\"\nupstream = \"{}\"\n",
        alpha.url()
    ));
    let b = Broker::start_with_config(&toml, &[]);
    let mut f = b.connect();
    let fetch = |f: &mut common::Client, url: &str| {
        common::tool_text(&f.call("fetch", &[("url", &format!("\"{url}\""))], None))
    };
    // The granted origin answers (FastMCP's 405/406 for a bare GET is fine:
    // the request got there).
    let ok = fetch(&mut f, &alpha.url());
    assert!(ok.starts_with("status "), "{ok}");
    // Another port, another host, another scheme: refused by the host.
    for url in [
        other.url(),
        format!("http://localhost:{}/mcp", alpha.port),
        format!("https://127.0.0.1:{}/mcp", alpha.port),
    ] {
        let r = fetch(&mut f, &url);
        assert!(r.contains("HttpRequestDenied"), "{url}: {r}");
    }
    assert!(b.metric_sum("mcp_upstream_denied_total") >= 3.0);

    // Without the grant, a component that imports wasi:http does not load.
    let mut toml = config(&[]);
    toml.push_str("\n[[routers]]\nname = \"probe\"\nwasm = \"netprobe.wasm\"\n");
    let err = refused_start(&toml, dir);
    assert!(err.contains("probe") && err.contains("wasi:http"), "{err}");
}

#[test]
fn bad_upstream_configs_are_refused_with_every_error() {
    let toml = format!(
        "{}\n[[routers]]\nname = \"u1\"\nupstream = \"ftp://x/mcp?api_key=secret\"\n\
         [[routers]]\nname = \"u2\"\nwasm = \"echo.wasm\"\nupstream_headers = {{ A = \"b\" }}\nrefresh_interval = \"5s\"\nupstream_protocol = \"auto\"\n\
         [[routers]]\nname = \"u3\"\nupstream = \"http://h/mcp\"\nupstream_headers = {{ \"bad name\" = \"secret\\n\" }}\nupstream_protocol = \"2024-11-05\"\n\
         [[routers]]\nname = \"u4\"\n\
         [[routers]]\nname = \"u5\"\nupstream = \"http://[fe80::1%25eth0]:8080/mcp\"\n\
         [[routers]]\nname = \"u6\"\nupstream = \"http://10.0.0.1:notaport/mcp\"\n\
         [[routers]]\nname = \"u7\"\nupstream = \"http://[::1]:9/mcp\"\n",
        mcp_broker::config::DEFAULT_TOML
    );
    let e = mcp_broker::config::Config::parse(&toml)
        .unwrap_err()
        .to_string();
    for want in [
        // The query (which may hold a key) is not shown.
        "routers[3] (u1).upstream: `ftp://x/mcp?…` is not an absolute http:// or https:// URL",
        "routers[4] (u2).upstream_headers: only applies with `upstream`",
        "routers[4] (u2).refresh_interval: only applies with `upstream`",
        "routers[5] (u3).upstream_headers: `bad name` is not a valid header name",
        "routers[5] (u3).upstream_headers: the value of `bad name` is not a valid header value",
        "routers[4] (u2).upstream_protocol: only applies with `upstream`",
        "routers[5] (u3).upstream_protocol: `2024-11-05` is none of auto, 2026-07-28, 2025-06-18",
        "routers[6] (u4): set `wasm` (a component) or `upstream`",
        "routers[7] (u5).upstream: `http://[fe80::1%25eth0]:8080/mcp` names an IPv6 zone id",
        "routers[8] (u6).upstream: `http://10.0.0.1:notaport/mcp` has a port that is not a number",
    ] {
        assert!(e.contains(want), "missing {want:?} in:\n{e}");
    }
    assert!(!e.contains("(u7)"), "an IPv6 host with a port is fine: {e}");
    assert!(!e.contains("secret"), "{e}");
}

/// A fixture server of `tests/upstreams/`, and its port; killed on drop.
struct Fixture(Child, u16);

impl Fixture {
    /// `tests/upstreams/broken.py`: an upstream that answers `tools/call`
    /// badly, in the way the URL's path names.
    fn broken() -> Fixture {
        Self::spawn(&python(), "broken.py")
    }

    /// `tests/upstreams/server2.py`: an MCPServer of the Python SDK 2.x,
    /// which serves protocol 2026-07-28.
    fn modern2() -> Fixture {
        let python = repo().join(".tools/mcp2/bin/python");
        assert!(
            python.exists(),
            "the Python mcp SDK 2.x is not installed ({} is missing): run scripts/setup",
            python.display()
        );
        Self::spawn(&python, "server2.py")
    }

    /// Starts `tests/upstreams/<script> 0` with `python` and reads its
    /// ready line (`… http=127.0.0.1:PORT …`).
    fn spawn(python: &Path, script: &str) -> Fixture {
        let mut child = Command::new(python)
            .arg(repo().join("broker/tests/upstreams").join(script))
            .arg("0")
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("start {script}: {e}"));
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("http="))
            .and_then(|a| a.rsplit(':').next())
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("no ready line from {script}: {line:?}"));
        Fixture(child, port)
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.1)
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn garbage_a_dropped_stream_and_http_errors_get_upstream_unavailable_with_the_reason() {
    let broken = Fixture::broken();
    let modes = [
        ("garbage", "invalid JSON"),
        ("drop", "ended before the response"),
        ("status500", "HTTP 500"),
        ("wrongid", "no response to request"),
    ];
    let routers: Vec<(String, String)> = modes
        .iter()
        .map(|(m, _)| (m.to_string(), format!("http://127.0.0.1:{}/{m}", broken.1)))
        .collect();
    let mut toml = mcp_broker::config::DEFAULT_TOML.to_string();
    for (name, url) in &routers {
        toml.push_str(&format!(
            "\n[[routers]]\nname = \"{name}\"\nupstream = \"{url}\"\ncall_deadline = \"5s\"\n"
        ));
    }
    let b = Broker::start_with_config(&toml, &[]);
    let (mut c, s) = session(&b);
    for (i, (mode, reason)) in modes.iter().enumerate() {
        let t0 = Instant::now();
        let r = c.call(
            &s,
            i as u64 + 1,
            "tools/call",
            &format!(r#"{{"name":"{mode}__boom","arguments":{{}}}}"#),
        );
        assert!(
            t0.elapsed() < Duration::from_secs(4),
            "{mode}: {:?}",
            t0.elapsed()
        );
        assert_eq!(r["error"]["code"], -32006, "{mode}: {r}");
        let msg = r["error"]["message"].as_str().unwrap();
        assert!(
            msg.starts_with(&format!(
                "upstream unavailable: tools/call to http://127.0.0.1:{}: ",
                broken.1
            )) && msg.contains(reason),
            "{mode}: {msg}"
        );
    }
    // The broker and its other routers are unaffected.
    let r = c.call(
        &s,
        9,
        "tools/call",
        r#"{"name":"echo_text","arguments":{"text":"fine"}}"#,
    );
    assert_eq!(text_of(&r["result"]), "fine");
}

/// An upstream's own text in a log line (the body of its error, quoted in
/// the reason) is escaped: it cannot forge a line or clear a terminal. Its
/// quotes stay as written (they were `can\'t \"serve\"`).
#[test]
fn an_upstreams_text_cannot_forge_log_lines() {
    let broken = Fixture::broken();
    let toml = format!(
        "{}\n[[routers]]\nname = \"forge\"\nupstream = \"http://127.0.0.1:{}/forge\"\ncall_deadline = \"5s\"\n",
        mcp_broker::config::DEFAULT_TOML,
        broken.1
    );
    let (b, log) = Broker::start_logged(&toml, &[]);
    log.shows("upstream unavailable at load", Duration::from_secs(10));
    let text = log.text();
    let line = text
        .lines()
        .find(|l| l.contains("upstream unavailable at load"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        line.contains(
            r#"HTTP 500: can't "serve": down\n2026-12-07T00:00:00.000000Z ERROR mcp_broker: forged\u{1b}[2J"#
        ),
        "{line}"
    );
    assert!(
        !text.contains('\u{1b}') && !text.contains("\n2026-12-07T00:00:00.000000Z"),
        "{text:?}"
    );
    // And on /readyz, which is read in terminals and grepped.
    let (_, readyz) = b.http_get("/readyz");
    assert!(
        readyz.contains(r"down\n2026-12-07") && !readyz.contains('\u{1b}'),
        "{readyz:?}"
    );
}

/// An upstream that answers `initialize` and then never its listing does
/// not stop the broker from starting (its router starts unavailable, as one
/// that cannot be reached does), and the listings an upstream did answer at
/// start-up are not cancelled afterwards.
#[test]
fn an_upstream_silent_on_its_listing_at_start_is_unavailable_not_fatal() {
    let broken = Fixture::broken();
    let mut toml = mcp_broker::config::DEFAULT_TOML.to_string();
    for (name, path) in [("silent", "silent"), ("answered", "garbage")] {
        toml.push_str(&format!(
            "\n[[routers]]\nname = \"{name}\"\nupstream = \"http://127.0.0.1:{}/{path}\"\ncall_deadline = \"2s\"\n",
            broken.1
        ));
    }
    let b = Broker::start_with_config(&toml, &[]);
    let (mut c, s) = session(&b);
    let r = c.call(
        &s,
        1,
        "tools/call",
        r#"{"name":"echo_text","arguments":{"text":"up"}}"#,
    );
    assert_eq!(text_of(&r["result"]), "up");
    let listed = c.call(&s, 2, "tools/list", "{}");
    let tools = names(&listed, "tools", "name");
    assert!(tools.iter().any(|t| t == "boom"), "{tools:?}");
    assert!(!tools.iter().any(|t| t.starts_with("silent")), "{tools:?}");
    // The upstream that answered its listings was sent no cancellation.
    let mut u = Conn::connect(format!("127.0.0.1:{}", broken.1).parse().unwrap());
    let r = u.request(
        "POST",
        "/garbage",
        &[("Content-Type", "application/json")],
        br#"{"jsonrpc":"2.0","id":1,"method":"test/cancelled"}"#,
    );
    assert_eq!(r.json()["result"]["count"], 0, "{}", r.text());
}

/// An upstream's listing is its server's, not the operator's: one that
/// collides with another router's qualified name is left out, and the
/// broker starts (it was fatal, and a restart loop under systemd), naming
/// it on /readyz.
#[test]
fn an_upstream_listing_that_collides_at_start_is_left_out_not_fatal() {
    let broken = Fixture::broken();
    let mut toml = mcp_broker::config::DEFAULT_TOML.to_string();
    // `g` and `s` both list `boom`, qualified `g__boom` and `s__boom`;
    // `clash` lists `g__boom` itself.
    for (name, path) in [
        ("g", "garbage"),
        ("s", "status500"),
        ("clash", "as/g__boom"),
    ] {
        toml.push_str(&format!(
            "\n[[routers]]\nname = \"{name}\"\nupstream = \"http://127.0.0.1:{}/{path}\"\n",
            broken.1
        ));
    }
    let b = Broker::start_with_config(&toml, &[]);
    let (mut c, s) = session(&b);
    let listed = c.call(&s, 1, "tools/list", "{}");
    let tools = names(&listed, "tools", "name");
    for t in ["g__boom", "s__boom", "echo_text"] {
        assert!(tools.iter().any(|x| x == t), "{t}: {tools:?}");
    }
    assert_eq!(tools.iter().filter(|x| *x == "g__boom").count(), 1);
    let (status, body) = b.http_get("/readyz");
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains("upstream clash unavailable") && body.contains("left out of the route table"),
        "{body}"
    );
}

/// Listing cursors are the offsets of one route table: one handed out
/// before a reload (or an upstream's new listing) is refused with a
/// message that says to list again, rather than skipping or repeating
/// tools in the new listing.
#[test]
fn a_listing_cursor_from_another_route_table_is_refused_not_misread() {
    let broken = Fixture::broken();
    let dir = state_dir("cursor");
    let path = dir.path().join("broker.toml");
    let base = format!(
        "{}\n[[routers]]\nname = \"many\"\nupstream = \"http://127.0.0.1:{}/many/150\"\n",
        mcp_broker::config::DEFAULT_TOML,
        broken.1
    );
    std::fs::write(&path, &base).unwrap();
    let b = Broker::start_command(None, &["--config", path.to_str().unwrap()], |_| {});
    let (mut c, s) = session(&b);
    let first = c.call(&s, 1, "tools/list", "{}");
    let cursor = first["result"]["nextCursor"].as_str().unwrap().to_owned();
    let page =
        |c: &mut Conn, id| c.call(&s, id, "tools/list", &format!(r#"{{"cursor":"{cursor}"}}"#));
    assert!(page(&mut c, 2)["result"]["tools"].is_array());
    // A reload that changes the routers: a new table.
    std::fs::write(
        &path,
        format!("{base}\n[[routers]]\nname = \"echo2\"\nwasm = \"echo.wasm\"\n"),
    )
    .unwrap();
    let mut admin = Conn::connect(b.metrics);
    let r = admin.request("POST", "/admin/reload", &[("Connection", "close")], b"");
    assert_eq!(r.status, 200, "{}", r.text());
    let v = page(&mut c, 3);
    assert_eq!(v["error"]["code"], -32602, "{v}");
    let m = v["error"]["message"].as_str().unwrap();
    assert!(m.contains("list again from the start"), "{m}");
    // From the start, every tool once.
    let mut seen = Vec::new();
    let mut next: Option<String> = None;
    for id in 10..20 {
        let params = next
            .as_ref()
            .map_or("{}".into(), |n| format!(r#"{{"cursor":"{n}"}}"#));
        let v = c.call(&s, id, "tools/list", &params);
        seen.extend(names(&v, "tools", "name"));
        next = v["result"]["nextCursor"].as_str().map(str::to_owned);
        if next.is_none() {
            break;
        }
    }
    let n = seen.len();
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), n, "a tool listed twice");
    assert!(
        seen.iter().any(|t| t == "t149") && seen.iter().any(|t| t == "t0"),
        "{seen:?}"
    );
}

/// Upstreams that hang on their listing are waited for side by side, not
/// one after another: four that never answer, at a 3 s deadline each, hold
/// start-up about one deadline, where in turn they held it four (and as
/// long every reload and every other upstream's refresh).
#[test]
fn upstreams_that_hang_at_start_are_waited_for_side_by_side() {
    let broken = Fixture::broken();
    let mut toml = mcp_broker::config::DEFAULT_TOML.to_string();
    for i in 0..4 {
        toml.push_str(&format!(
            "\n[[routers]]\nname = \"silent{i}\"\nupstream = \"http://127.0.0.1:{}/silent\"\ncall_deadline = \"3s\"\n",
            broken.1
        ));
    }
    let t0 = Instant::now();
    let b = Broker::start_with_config(&toml, &[]);
    let took = t0.elapsed();
    assert!(
        took < Duration::from_secs(10),
        "ready after {took:?}: the four waits of 3 s ran in turn"
    );
    let (mut c, s) = session(&b);
    let r = c.call(
        &s,
        1,
        "tools/call",
        r#"{"name":"echo_text","arguments":{"text":"up"}}"#,
    );
    assert_eq!(text_of(&r["result"]), "up");
}

/// How long after the call started each of its notifications and its final
/// answer arrived: for showing that notifications come while it runs.
const STEP: Duration = Duration::from_millis(400);

#[test]
fn progress_and_logs_reach_every_edge_while_the_call_runs() {
    let scratch = state_dir("live");
    let dir = scratch.path();
    let alpha = Upstream::start("alpha", dir);
    let b = Broker::start_with_config(&config(&[("alpha", &alpha.url(), "")]), &[]);
    let args = format!(r#"{{"n":3,"delay":{}}}"#, STEP.as_secs_f64());

    // HTTP: the SSE stream opens at once; the first progress and log come
    // about three steps before the result.
    let (mut c, s) = session(&b);
    let r = c.call(&s, 0, "logging/setLevel", r#"{"level":"info"}"#);
    assert!(r["result"].is_object(), "{r}");
    let body = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"steps","arguments":{args},"_meta":{{"progressToken":7}}}}}}"#
    );
    let t0 = Instant::now();
    c.send_raw(
        format!(
            "POST /mcp HTTP/1.1\r\nHost: x\r\nAccept: application/json, text/event-stream\r\n\
             Content-Type: application/json\r\nMcp-Session-Id: {s}\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    );
    let (status, _) = c.read_head();
    assert_eq!(status, 200);
    let (first, _) = c.read_chunked(Some(&|t: &str| {
        t.contains("notifications/progress") && t.contains("notifications/message")
    }));
    let first_at = t0.elapsed();
    let (rest, ended) = c.read_chunked(None);
    let final_at = t0.elapsed();
    assert!(ended);
    let text = String::from_utf8_lossy(&first).to_string() + &String::from_utf8_lossy(&rest);
    let msgs = common::http::sse_messages(&text);
    assert_eq!(
        msgs.iter()
            .filter(|m| m["method"] == "notifications/progress")
            .count(),
        3,
        "{msgs:?}"
    );
    let progress = msgs
        .iter()
        .find(|m| m["method"] == "notifications/progress")
        .unwrap();
    assert_eq!(progress["params"]["progressToken"], 7, "{msgs:?}");
    assert_eq!(text_of(&msgs.last().unwrap()["result"]), "done 3");
    assert!(
        final_at > first_at + STEP * 2,
        "first notification at {first_at:?}, result at {final_at:?}: not live"
    );

    // Frames: a progress frame before the final one, steps earlier.
    let mut f = b.connect();
    let (corr, frame) = f.tool_call_frame("steps", &[("n", "3"), ("delay", "0.4")], None);
    let t0 = Instant::now();
    f.send_raw(&frame);
    let first = f.read_frame().expect("a frame");
    let first_at = t0.elapsed();
    let v = ResponseView::parse(&first).unwrap();
    assert_eq!(v.correlation_id(), corr);
    assert!(!v.is_final(), "the first frame is a notification");
    let last = f.read_final();
    let final_at = t0.elapsed();
    assert_eq!(common::tool_text(&last), "done 3");
    assert!(
        final_at > first_at + STEP * 2,
        "frames: first at {first_at:?}, final at {final_at:?}"
    );

    // gRPC: the session's Subscribe stream gets the progress while the
    // call is still running.
    rt().block_on(async {
        use mcp_proto::v1 as pb;
        let mut g = grpc_client(&b).await;
        let session = common::grpc::initialize(&mut g, "live").await;
        let mut sub = g
            .subscribe(with_session(
                pb::SubscribeRequest {
                    topics: vec!["progress".into()],
                },
                &session,
            ))
            .await
            .unwrap()
            .into_inner();
        let mut g2 = g.clone();
        let call = tokio::spawn(async move {
            g2.call_tool(with_session(
                pb::CallToolRequest {
                    name: "steps".into(),
                    arguments: Some(br#"{"n":3,"delay":0.4}"#.to_vec()),
                },
                &session,
            ))
            .await
        });
        let n = tokio::time::timeout(Duration::from_secs(10), sub.message())
            .await
            .expect("progress within 10 s")
            .unwrap()
            .unwrap();
        // As the upstream reported it: 1 of 3, not the fraction of 1.
        match &n.notification {
            Some(pb::notification::Notification::Progress(p)) => {
                assert_eq!((p.progress, p.total), (1.0, Some(3.0)), "{p:?}");
            }
            other => panic!("{other:?}"),
        }
        assert!(
            !call.is_finished(),
            "the progress came after the call ended"
        );
        let r = call.await.unwrap().unwrap().into_inner();
        match &r.content[0].content {
            Some(pb::content::Content::Text(t)) => assert_eq!(t.text, "done 3"),
            other => panic!("{other:?}"),
        }
    });
}

/// A 2026-07-28 `tools/call` to `tool` with `args`, asking for progress
/// (token "p") and info logs in its `_meta`, sent on a new connection whose
/// SSE head is read.
fn modern_live_call(b: &Broker, id: u32, tool: &str, args: &str) -> Conn {
    let body = format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"_meta":{{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{{}},"io.modelcontextprotocol/logLevel":"info","progressToken":"p"}},"name":"{tool}","arguments":{args}}}}}"#
    );
    Conn::open_sse(
        b.http,
        &format!(
            "MCP-Protocol-Version: 2026-07-28\r\nMcp-Method: tools/call\r\nMcp-Name: {tool}\r\n"
        ),
        &body,
    )
}

#[test]
fn a_2026_07_28_call_streams_progress_and_logs_live_and_closing_it_cancels_upstream() {
    let scratch = state_dir("modern-live");
    let dir = scratch.path();
    let alpha = Upstream::start("alpha", dir);
    // A deadline far past the long call's end: only the close may cancel it.
    let b = Broker::start_with_config(
        &config(&[("alpha", &alpha.url(), "call_deadline = \"60s\"")]),
        &[],
    );
    // The first progress event arrives on its own, while the answer is
    // still pending: what was read up to it holds no result.
    let args = format!(r#"{{"n":3,"delay":{}}}"#, STEP.as_secs_f64());
    let mut c = modern_live_call(&b, 1, "steps", &args);
    let (first, ended) = c.read_chunked(Some(&|t: &str| t.contains("notifications/progress")));
    assert!(!ended);
    let first = String::from_utf8(first).unwrap();
    assert!(
        !first.contains("\"result\""),
        "the progress came with the answer, not before it: {first}"
    );
    let (rest, ended) = c.read_chunked(None);
    assert!(ended, "the answer ends the stream");
    let msgs = common::http::sse_messages(&(first + &String::from_utf8_lossy(&rest)));
    let progress: Vec<_> = msgs
        .iter()
        .filter(|m| m["method"] == "notifications/progress")
        .collect();
    assert_eq!(progress.len(), 3, "{msgs:?}");
    assert!(progress.iter().all(|m| m["params"]["progressToken"] == "p"));
    assert!(
        msgs.iter().any(|m| m["method"] == "notifications/message"),
        "the _meta log level asked for logs: {msgs:?}"
    );
    let last = msgs.last().unwrap();
    assert_eq!(last["id"], 1, "{last}");
    assert_eq!(last["result"]["resultType"], "complete", "{last}");
    assert_eq!(text_of(&last["result"]), "done 3");

    // Closing the stream of a live call abandons it: the guest call is
    // cancelled and the upstream told. (Not cancelled, the call would end
    // after about 5 s, uncounted.)
    let mut c = modern_live_call(&b, 2, "steps", r#"{"n":100,"delay":0.05}"#);
    let (first, ended) = c.read_chunked(Some(&|t: &str| t.contains("notifications/progress")));
    assert!(!ended, "{}", String::from_utf8_lossy(&first));
    drop(c);
    let (mut s, sid) = session(&b);
    assert!(
        upstream_counts_cancelled(&mut s, &sid, 1),
        "closing the 2026-07-28 stream did not cancel the call"
    );
}

#[test]
fn a_stock_python_client_gets_upstream_progress_while_the_call_runs() {
    let scratch = state_dir("sdk");
    let dir = scratch.path();
    let alpha = Upstream::start("alpha", dir);
    let b = Broker::start_with_config(&config(&[("alpha", &alpha.url(), "")]), &[]);
    let out = Command::new(python())
        .arg(repo().join("broker/tests/upstreams/sdk_progress.py"))
        .arg(b.mcp_url())
        .arg("steps")
        .output()
        .expect("run sdk_progress.py");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("sdk progress: ok"),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `openssl` makes a CA and a server certificate for `localhost` and
/// 127.0.0.1 signed by it, in `dir`: `ca.pem`, `server.pem`, `server.key`.
fn certificates(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let openssl = |args: &[&str]| {
        common::openssl(dir, args);
    };
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
    ];
    openssl(
        &[
            &["req", "-x509"][..],
            &ec,
            &["-keyout", "ca.key", "-out", "ca.pem"],
        ]
        .concat()
        .iter()
        .chain(&["-days", "1", "-subj", "/CN=mcp-broker test CA"])
        .copied()
        .collect::<Vec<_>>(),
    );
    openssl(
        &[
            &["req"][..],
            &ec,
            &["-keyout", "server.key", "-out", "server.csr"],
        ]
        .concat()
        .iter()
        .chain(&["-subj", "/CN=localhost"])
        .copied()
        .collect::<Vec<_>>(),
    );
    std::fs::write(
        dir.join("ext.cnf"),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\n",
    )
    .unwrap();
    openssl(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.pem",
        "-days",
        "1",
        "-extfile",
        "ext.cnf",
    ]);
}

#[test]
fn an_https_upstream_is_trusted_through_its_ca_file_only() {
    let scratch = state_dir("tls");
    let dir = scratch.path();
    certificates(dir);
    let upstream = Upstream::start_on(
        "secure",
        DeadPort::any(),
        dir,
        &[
            "--tls".into(),
            dir.join("server.pem").into(),
            dir.join("server.key").into(),
        ],
    );
    let url = format!("https://localhost:{}/mcp", upstream.port);
    let ca = dir.join("ca.pem");
    let b = Broker::start_with_config(
        &config(&[
            (
                "secure",
                &url,
                &format!("upstream_ca_file = \"{}\"", ca.display()),
            ),
            ("untrusted", &url, ""),
        ]),
        &[],
    );
    let (mut c, s) = session(&b);
    let r = c.call(
        &s,
        1,
        "tools/call",
        r#"{"name":"add","arguments":{"a":20,"b":22}}"#,
    );
    assert_eq!(text_of(&r["result"]), "42", "{r}");
    // Without the CA, the webpki roots do not know the certificate.
    let (status, body) = b.http_get("/readyz");
    assert_eq!(status, 200);
    assert!(
        body.contains("upstream untrusted unavailable") && body.contains("certificate"),
        "{body}"
    );

    // A CA file that is not one is a start-up error naming it.
    let bad = dir.join("not-a-ca.pem");
    std::fs::write(&bad, "not PEM\n").unwrap();
    let toml = config(&[(
        "secure",
        &url,
        &format!("upstream_ca_file = \"{}\"", bad.display()),
    )]);
    let err = refused_start(&toml, dir);
    assert!(err.contains("not-a-ca.pem"), "{err}");
}

/// The broker as an upstream speaking protocol 2026-07-28: the `conformance`
/// router behind a broker of its own (`fixtures/conformance.toml`), whose
/// HTTP edge answers `server/discover` and holds every request to its
/// headers (`Mcp-Method`, `Mcp-Name`, `Mcp-Param-*`).
fn modern_upstream() -> (Broker, Broker) {
    let inner = Broker::start_with_config(include_str!("fixtures/conformance.toml"), &[]);
    let outer = Broker::start_with_config(&config(&[("inner", &inner.mcp_url(), "")]), &[]);
    (inner, outer)
}

/// A 2026-07-28 `tools/call` of `tool` on `b`, declaring every client
/// capability; `extra`: more params (a retry's answers and state). The
/// HTTP status and the answer.
fn modern_call(b: &Broker, id: u32, tool: &str, extra: &str) -> (u16, Value) {
    let meta = r#"{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{"elicitation":{},"sampling":{},"roots":{}}}"#;
    let body = format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"_meta":{meta},"name":"{tool}","arguments":{{}}{extra}}}}}"#
    );
    let mut c = Conn::connect(b.http);
    let h = [
        ACCEPT_BOTH,
        JSON,
        ("MCP-Protocol-Version", "2026-07-28"),
        ("Mcp-Method", "tools/call"),
        ("Mcp-Name", tool),
    ];
    let r = c.request("POST", "/mcp", &h, body.as_bytes());
    (r.status, r.json())
}

/// An upstream that speaks 2026-07-28 is discovered, not initialized, and
/// the questions its tools ask (a set of three, here) reach the broker's
/// 2026-07-28 client as one InputRequiredResult; the retry's answers go
/// back upstream with the upstream's own requestState, carried sealed in
/// the broker's.
#[test]
fn a_2026_07_28_upstreams_questions_reach_a_2026_07_28_client_and_its_answers_go_back() {
    let (_inner, outer) = modern_upstream();
    let (_, metrics) = outer.http_get("/metrics");
    assert!(
        metrics.contains(r#"mcp_upstream_protocol_info{router="inner",protocol="2026-07-28"} 1"#),
        "{metrics}"
    );
    let (status, v) = modern_call(&outer, 1, "test_input_required_result_multiple_inputs", "");
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["result"]["resultType"], "input_required", "{v}");
    let asks = v["result"]["inputRequests"].as_object().expect("questions");
    let mut keys: Vec<&str> = asks.keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(keys, ["client_roots", "greeting", "user_name"], "{v}");
    let token = v["result"]["requestState"]
        .as_str()
        .expect("a requestState");
    let answers = format!(
        r#","inputResponses":{{"user_name":{{"action":"accept","content":{{"name":"Ada"}}}},"greeting":{{"role":"assistant","content":{{"type":"text","text":"Hi there"}},"model":"m"}},"client_roots":{{"roots":[{{"uri":"file:///a"}}]}}}},"requestState":"{token}""#
    );
    let (status, v) = modern_call(
        &outer,
        2,
        "test_input_required_result_multiple_inputs",
        &answers,
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["result"]["resultType"], "complete", "{v}");
    assert_eq!(
        v["result"]["content"][0]["text"], "Hello, Ada! Greeting: Hi there. Roots: 1",
        "{v}"
    );
    // The upstream's requestState rides the broker's own: changed, it is
    // refused by the broker before anything goes upstream.
    let changed = answers.replace(token, &format!("{token}x"));
    let (status, v) = modern_call(
        &outer,
        3,
        "test_input_required_result_multiple_inputs",
        &changed,
    );
    assert_eq!(
        (status, &v["error"]["code"]),
        (400, &serde_json::json!(-32602)),
        "{v}"
    );
}

/// The same upstream's questions reach a session-era client on its
/// request's stream; and a tool whose schema declares `x-mcp-header` gets
/// its `Mcp-Param-*` headers from the upstream router, which the upstream
/// holds to the arguments.
#[test]
fn a_2026_07_28_upstream_serves_a_session_era_client_with_questions_and_param_headers() {
    let (_inner, outer) = modern_upstream();
    let mut c = Conn::connect(outer.http);
    let s = c.initialize_with(
        r#"{"protocolVersion":"2025-06-18","capabilities":{"roots":{}},"clientInfo":{"name":"t","version":"1"}}"#,
    );
    let v = c.call(
        &s,
        1,
        "tools/call",
        r#"{"name":"test_param_header","arguments":{"region":"Zürich","count":42}}"#,
    );
    assert_eq!(
        v["result"]["content"][0]["text"], r#"region="Zürich", count=42"#,
        "{v}"
    );
    let call = r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"test_input_required_result_list_roots","arguments":{}}}"#;
    let mut stream = Conn::open_sse(outer.http, &format!("Mcp-Session-Id: {s}\r\n"), call);
    let (body, ended) = stream.read_chunked(Some(&|t: &str| t.contains("roots/list")));
    assert!(!ended, "the stream ended before asking for roots");
    let ask = common::http::sse_messages(&String::from_utf8(body).unwrap())
        .pop()
        .unwrap();
    let reply = serde_json::json!({"jsonrpc":"2.0","id":ask["id"],"result":{"roots":[{"uri":"file:///src"}]}});
    assert_eq!(c.post(Some(&s), &reply.to_string()).status, 202);
    let (rest, ended) = stream.read_chunked(None);
    assert!(ended);
    let fin = common::http::sse_messages(&String::from_utf8(rest).unwrap())
        .pop()
        .unwrap();
    assert_eq!(
        fin["result"]["content"][0]["text"], "Roots: file:///src",
        "{fin}"
    );
}

/// Software someone else wrote as the 2026-07-28 upstream: the Python SDK
/// 2.x's MCPServer is discovered (not initialized), its tools are called
/// statelessly, and a tool whose resolvers need a name, a completion and
/// the roots asks them through the broker, in one round, in the 2.x SDK's
/// own keys and sealed requestState, and completes on the retry.
#[test]
fn a_python_sdk_2x_upstream_is_spoken_to_in_2026_07_28_and_its_questions_pass_through() {
    let up = Fixture::modern2();
    let outer = Broker::start_with_config(&config(&[("py2", &up.url(), "")]), &[]);
    let body = r#"{"jsonrpc":"2.0","id":0,"method":"tools/call","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}},"name":"add","arguments":{"a":2,"b":3}}}"#;
    let mut c = Conn::connect(outer.http);
    let h = [
        ACCEPT_BOTH,
        JSON,
        ("MCP-Protocol-Version", "2026-07-28"),
        ("Mcp-Method", "tools/call"),
        ("Mcp-Name", "add"),
    ];
    let r = c.request("POST", "/mcp", &h, body.as_bytes());
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.json()["result"]["content"][0]["text"],
        "5",
        "{}",
        r.text()
    );

    let (status, v) = modern_call(&outer, 1, "welcome", "");
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["result"]["resultType"], "input_required", "{v}");
    let asks = v["result"]["inputRequests"].as_object().expect("questions");
    assert_eq!(asks.len(), 3, "{v}");
    // Answer each by its method, under the SDK's own keys.
    let mut answers = serde_json::Map::new();
    for (key, q) in asks {
        let a = match q["method"].as_str() {
            Some("elicitation/create") => {
                serde_json::json!({"action": "accept", "content": {"name": "Ada"}})
            }
            Some("sampling/createMessage") => {
                serde_json::json!({"role": "assistant", "content": {"type": "text", "text": "Hi there"}, "model": "m"})
            }
            Some("roots/list") => {
                serde_json::json!({"roots": [{"uri": "file:///a"}, {"uri": "file:///b"}]})
            }
            other => panic!("unexpected question {other:?}: {v}"),
        };
        answers.insert(key.clone(), a);
    }
    let token = v["result"]["requestState"]
        .as_str()
        .expect("a requestState");
    let extra = format!(
        r#","inputResponses":{},"requestState":"{token}""#,
        Value::Object(answers)
    );
    let (status, v) = modern_call(&outer, 2, "welcome", &extra);
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        v["result"]["content"][0]["text"], "Hi there, Ada! Roots: 2",
        "{v}"
    );

    // A session-era client of the broker is asked the same three on its
    // request's stream, one after another; the upstream still sees one
    // 2026-07-28 retry.
    let mut c = Conn::connect(outer.http);
    let s = c.initialize_with(
        r#"{"protocolVersion":"2025-06-18","capabilities":{"elicitation":{},"sampling":{},"roots":{}},"clientInfo":{"name":"t","version":"1"}}"#,
    );
    let call = r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"welcome","arguments":{}}}"#;
    let mut stream = Conn::open_sse(outer.http, &format!("Mcp-Session-Id: {s}\r\n"), call);
    let mut asked = Vec::new();
    let fin = loop {
        let (body, ended) = stream.read_chunked(Some(&|t: &str| t.contains("\"method\":")));
        let msg = common::http::sse_messages(&String::from_utf8(body).unwrap())
            .pop()
            .expect("a message");
        if ended || msg.get("method").is_none() {
            break msg;
        }
        let method = msg["method"].as_str().unwrap_or_default().to_owned();
        let result = match method.as_str() {
            "elicitation/create" => {
                serde_json::json!({"action": "accept", "content": {"name": "Bo"}})
            }
            "sampling/createMessage" => {
                serde_json::json!({"role": "assistant", "content": {"type": "text", "text": "Hello"}, "model": "m"})
            }
            "roots/list" => serde_json::json!({"roots": [{"uri": "file:///c"}]}),
            other => panic!("unexpected request {other}"),
        };
        let reply = serde_json::json!({"jsonrpc": "2.0", "id": msg["id"], "result": result});
        assert_eq!(c.post(Some(&s), &reply.to_string()).status, 202);
        asked.push(method);
        assert!(asked.len() <= 3, "asked more than three: {asked:?}");
    };
    asked.sort();
    assert_eq!(
        asked,
        ["elicitation/create", "roots/list", "sampling/createMessage"]
    );
    assert_eq!(
        fin["result"]["content"][0]["text"], "Hello, Bo! Roots: 1",
        "{fin}"
    );
}

/// The reference server answers a session it does not know (it restarted)
/// with 400 and a JSON-RPC error for no request, where the transport asks
/// for 404, as servers built on the TypeScript SDK's examples do. The
/// router once re-initialized on 404 only: after the upstream restarted,
/// every call and every readiness ping failed with that 400 until the
/// broker itself restarted. It now takes such a 400 as the session gone.
/// A completion that depends on the arguments the client already chose
/// (`context.arguments`, MCP 2025-06-18) reaches the upstream with them.
/// The HTTP edge once dropped them: the reference server's names by
/// department came back empty through the broker.
#[test]
fn a_completions_context_reaches_the_reference_server() {
    let everything = Everything::start_on(DeadPort::any());
    let b = Broker::start_with_config(&config(&[("ev", &everything.url(), "")]), &[]);
    let mut c = Conn::connect(b.http);
    let s = c.initialize("2025-06-18");
    let complete = |c: &mut Conn, id: u64, department: &str| {
        let r = c.call(
            &s,
            id,
            "completion/complete",
            &json!({
                "ref": {"type": "ref/prompt", "name": "completable-prompt"},
                "argument": {"name": "name", "value": ""},
                "context": {"arguments": {"department": department}},
            })
            .to_string(),
        );
        r["result"]["completion"]["values"].clone()
    };
    assert_eq!(
        complete(&mut c, 1, "Engineering"),
        json!(["Alice", "Bob", "Charlie"])
    );
    assert_eq!(
        complete(&mut c, 2, "Sales"),
        json!(["David", "Eve", "Frank"])
    );
    // A context that is not the documented object is the client's error.
    let r = c.call(
        &s,
        3,
        "completion/complete",
        r#"{"ref":{"type":"ref/prompt","name":"completable-prompt"},"argument":{"name":"name","value":""},"context":{"arguments":["Sales"]}}"#,
    );
    assert_eq!(r["error"]["code"], -32602, "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("context.arguments")),
        "{r}"
    );
}

/// gRPC's CallToolResult has no structured content: the edge appends it
/// as a text block unless one holds it already. The reference server's
/// text block is its structured content as JSON.stringify wrote it; the
/// upstream router passes that content on parsed and written again, with
/// its keys in another order, and the edge once appended it a second time.
#[test]
fn the_reference_servers_structured_content_reaches_grpc_once() {
    let everything = Everything::start_on(DeadPort::any());
    let b = Broker::start_with_config(&config(&[("ev", &everything.url(), "")]), &[]);
    let r = rt().block_on(async {
        grpc_client(&b)
            .await
            .call_tool(mcp_proto::v1::CallToolRequest {
                name: "get-structured-content".into(),
                arguments: Some(br#"{"location":"Chicago"}"#.to_vec()),
            })
            .await
            .unwrap()
            .into_inner()
    });
    let texts: Vec<Value> = r
        .content
        .iter()
        .filter_map(|c| match &c.content {
            Some(mcp_proto::v1::content::Content::Text(t)) => serde_json::from_str(&t.text).ok(),
            _ => None,
        })
        .collect();
    assert_eq!(
        texts,
        [json!({"temperature": 36, "conditions": "Light rain / drizzle", "humidity": 82})],
        "{r:?}"
    );
}

#[test]
fn the_reference_server_restarted_is_served_again_without_restarting_the_broker() {
    let mut everything = Everything::start_on(DeadPort::any());
    let b = Broker::start_with_config(&config(&[("ev", &everything.url(), "")]), &[]);
    let mut c = Conn::connect(b.http);
    let s = c.initialize("2025-06-18");
    let sum = |c: &mut Conn, id: u64| {
        c.call(
            &s,
            id,
            "tools/call",
            r#"{"name":"get-sum","arguments":{"a":2,"b":3}}"#,
        )
    };
    let r = sum(&mut c, 1);
    assert_eq!(
        r["result"]["content"][0]["text"], "The sum of 2 and 3 is 5.",
        "{r}"
    );
    // A tool that must be called as a task (the broker offers no tasks) is
    // not listed: every plain call of it would fail.
    let listed = c.call(&s, 10, "tools/list", "{}");
    let names: Vec<&str> = listed["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert!(
        names.contains(&"get-sum") && !names.contains(&"simulate-research-query"),
        "{names:?}"
    );

    everything.restart();
    // The first call after the restart finds the session gone and
    // re-initializes: it is answered, not refused.
    let r = sum(&mut c, 2);
    assert_eq!(
        r["result"]["content"][0]["text"], "The sum of 2 and 3 is 5.",
        "{r}"
    );
    // And the readiness pings that follow find it available.
    assert!(
        common::http::eventually(Duration::from_secs(15), || {
            b.http_get("/readyz").0 == 200
                && b.metric_where("mcp_upstream_available", &["router=\"ev\""]) == 1.0
        }),
        "readyz: {:?}",
        b.http_get("/readyz")
    );
}

/// Two instances of one server list the same resource URIs, which no
/// prefix qualifies. The router listed first serves them; the other's
/// tools and prompts are served all the same, qualified. The broker once
/// refused to start, advising a prefix they already had, and refused
/// every listing of an instance that came up later, tools included, while
/// reporting it available.
#[test]
fn two_instances_of_the_reference_server_share_resource_uris_and_both_serve_tools() {
    let one = Everything::start_on(DeadPort::any());
    let later = DeadPort::any();
    let later_url = format!("http://127.0.0.1:{}/mcp", later.port);
    let b = Broker::start_with_config(
        &config(&[("one", &one.url(), ""), ("two", &later_url, "")]),
        &[],
    );
    let mut c = Conn::connect(b.http);
    let s = c.initialize("2025-06-18");
    let tools = |c: &mut Conn, id: u64| -> Vec<String> {
        c.call(&s, id, "tools/list", "{}")["result"]["tools"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|t| t["name"].as_str().map(String::from))
            .collect()
    };
    assert!(tools(&mut c, 1).contains(&"get-sum".to_string()));

    let _two = Everything::start_on(later);
    let mut id = 10;
    assert!(
        eventually(Duration::from_secs(20), || {
            id += 1;
            tools(&mut c, id).contains(&"two__get-sum".to_string())
        }),
        "the instance that came up later is listed: {:?}",
        tools(&mut c, 100)
    );
    for (n, name) in ["one__get-sum", "two__get-sum"].into_iter().enumerate() {
        let r = c.call(
            &s,
            200 + n as u64,
            "tools/call",
            &json!({"name": name, "arguments": {"a": 1, "b": 2}}).to_string(),
        );
        assert_eq!(
            r["result"]["content"][0]["text"], "The sum of 1 and 2 is 3.",
            "{name}: {r}"
        );
    }
    // Each URI is listed once, and read from the instance listed first.
    let listed = c.call(&s, 300, "resources/list", "{}");
    let uris: Vec<&str> = listed["result"]["resources"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["uri"].as_str())
        .collect();
    let mut unique = uris.clone();
    unique.sort_unstable();
    unique.dedup();
    assert!(!uris.is_empty() && uris.len() == unique.len(), "{uris:?}");
    let read = c.call(
        &s,
        301,
        "resources/read",
        &json!({"uri": uris[0]}).to_string(),
    );
    assert!(read["result"]["contents"].is_array(), "{read}");
    assert_eq!(b.http_get("/readyz").0, 200);
}

/// An upstream session whose router instance is dropped (here: a call past
/// its deadline replaces the instance) is ended with `DELETE`, as MCP asks
/// of a client done with a session; it was left open until the server timed
/// it out, one more on every reload and replaced instance.
#[test]
fn a_dropped_instance_ends_its_upstream_session() {
    let broken = Fixture::broken();
    let url = format!("http://127.0.0.1:{}/hang", broken.1);
    let b = Broker::start_with_config(&config(&[("hung", &url, "call_deadline = \"1s\"")]), &[]);
    let (mut c, s) = session(&b);
    let r = c.call(&s, 1, "tools/call", r#"{"name":"boom","arguments":{}}"#);
    assert_eq!(r["error"]["code"], -32001, "{r}");
    let count = |method: &str| {
        let mut u = Conn::connect(format!("127.0.0.1:{}", broken.1).parse().unwrap());
        let body = format!(r#"{{"jsonrpc":"2.0","id":1,"method":"{method}"}}"#);
        let r = u.request(
            "POST",
            "/hang",
            &[("Content-Type", "application/json")],
            body.as_bytes(),
        );
        r.json()["result"]["count"].as_u64().unwrap_or(0)
    };
    assert!(
        eventually(Duration::from_secs(5), || count("test/deleted") >= 1),
        "the dropped instance's session was not ended (cancelled: {})",
        count("test/cancelled")
    );
    // Sent, and answered, before its session's DELETE: the fixture, like
    // a server that forgets a deleted session, answers a cancellation in
    // an ended session 404 and does not count it; sent side by side with
    // the DELETE, it often came second, and the call ran on upstream.
    assert!(
        eventually(Duration::from_secs(5), || count("test/cancelled") >= 1),
        "the abandoned call was not cancelled before its session ended"
    );
}

/// The `mcp_upstream_*_total` counters count on under the router's name
/// over a reload that replaces the router (here: only its `call_deadline`
/// changes), as `mcp_requests_total` and `mcp_router_calls_total` do. They
/// restarted at 0 with the new router, which `increase()` reads as a reset
/// and alerts on these counters misread. A router removed and added back
/// counts on from where it stopped, as the pools' counters do.
#[test]
fn upstream_counters_count_on_over_a_reload_that_replaces_the_router() {
    let broken = Fixture::broken();
    let url = format!("http://127.0.0.1:{}/hang", broken.1);
    let with = |deadline: &str| {
        config(&[(
            "hung",
            &url,
            &format!("call_deadline = \"{deadline}\"\nrefresh_interval = \"1s\""),
        )])
    };
    let dir = state_dir("counters");
    let path = dir.path().join("broker.toml");
    std::fs::write(&path, with("1s")).unwrap();
    let b = Broker::start_command(None, &["--config", path.to_str().unwrap()], |_| {});
    let reload = |toml: &str| -> Value {
        std::fs::write(&path, toml).unwrap();
        let mut admin = Conn::connect(b.metrics);
        let r = admin.request("POST", "/admin/reload", &[("Connection", "close")], b"");
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()
    };
    const COUNTERS: [&str; 5] = [
        "mcp_upstream_refreshes_total",
        "mcp_upstream_refresh_failures_total",
        "mcp_upstream_table_swaps_total",
        "mcp_upstream_denied_total",
        "mcp_upstream_cancels_total",
    ];
    let counters = || COUNTERS.map(|n| b.metric_where(n, &["router=\"hung\""]));
    // A call past its deadline: its instance is dropped and the call
    // cancelled upstream; and the listings re-read every second.
    let (mut c, s) = session(&b);
    let r = c.call(&s, 1, "tools/call", r#"{"name":"boom","arguments":{}}"#);
    assert_eq!(r["error"]["code"], -32001, "{r}");
    assert!(
        eventually(Duration::from_secs(10), || {
            let [refreshes, .., cancels] = counters();
            refreshes >= 2.0 && cancels >= 1.0
        }),
        "the counters never counted: {:?}",
        counters()
    );
    let before = counters();

    let v = reload(&with("2s"));
    assert_eq!(v["changed"], json!(["hung"]), "{v}");
    let after = counters();
    for ((name, was), now) in COUNTERS.iter().zip(before).zip(after) {
        assert!(
            now >= was,
            "{name} went back over the reload: {was} -> {now}"
        );
    }
    // And the new router's own counts add to them.
    assert!(
        eventually(Duration::from_secs(10), || counters()[0] > after[0]),
        "the replaced router's refreshes do not count on: {:?}",
        counters()
    );

    // Removed: its series go with it. Added back: they count on from
    // where they stopped.
    let stopped = counters();
    let v = reload(&config(&[]));
    assert_eq!(v["removed"], json!(["hung"]), "{v}");
    let (_, body) = b.http_get("/metrics");
    assert!(
        !body
            .lines()
            .any(|l| l.starts_with("mcp_upstream_") && l.contains(r#"router="hung""#)),
        "{body}"
    );
    let v = reload(&with("1s"));
    assert_eq!(v["added"], json!(["hung"]), "{v}");
    let back = counters();
    for ((name, was), now) in COUNTERS.iter().zip(stopped).zip(back) {
        assert!(
            now >= was,
            "{name} went back over remove and add: {was} -> {now}"
        );
    }
}
