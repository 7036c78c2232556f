//! Hot reload of the configuration (`mcp-broker --config FILE`): the file is
//! read again on `POST /admin/reload` (the admin/metrics listener) or on
//! SIGHUP. The `[[routers]]`, `[naming]` and `broker.routers_dir` may
//! change; new and changed routers are compiled, the route table is swapped,
//! calls in flight finish where they started, and every edge's listening
//! clients are told the listings changed. Each edge's `listen` may move:
//! new connections go to the new address, established ones stay. Anything
//! else is refused (HTTP 422, every error listed) and the old configuration
//! keeps serving.
//!
//! Each test writes its own configuration file in its own directory (the
//! harness's `_config` file is private to it) and starts the real binary on
//! loopback with `--config` pointing at it; the file sets every listener to
//! port 0, the same value as the harness's `--listen …` overrides, so a
//! rewrite that keeps those sections is not a listener change.

mod common;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::Broker;
use common::grpc::{client as grpc_client, rt, with_session};
use common::http::{Conn, Reply, eventually};
use mcp_schema::client::ResponseView;
use serde_json::Value;

/// Where `scripts/build-routers` leaves the bundled routers.
fn routers_dir() -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../routers/target/wasm32-wasip2/release"
    ))
}

/// `mcp-loadgen`, built beside `mcp-broker` by `cargo test --workspace`.
fn loadgen() -> PathBuf {
    let p = PathBuf::from(env!("CARGO_BIN_EXE_mcp-broker")).with_file_name("mcp-loadgen");
    assert!(
        p.exists(),
        "{} is missing: build it with `cargo build -p mcp-loadgen` (scripts/test does)",
        p.display()
    );
    p
}

// The router tables the tests combine. `call_deadline` of chaos is long
// enough for the 1.5 s sleep of the in-flight test.
const ECHO: &str = "[[routers]]\nname = \"echo\"\nwasm = \"echo.wasm\"\n";
const KV: &str = "[[routers]]\nname = \"kv\"\nwasm = \"kv.wasm\"\naffinity = \"session\"\n\
                  instances_per_shard = 2\ncall_deadline = \"5s\"\n";
/// `KV` with another deadline: the same component, a changed entry.
const KV_CHANGED: &str = "[[routers]]\nname = \"kv\"\nwasm = \"kv.wasm\"\naffinity = \"session\"\n\
                          instances_per_shard = 2\ncall_deadline = \"7s\"\n";
const LIBRARY: &str = "[[routers]]\nname = \"library\"\nwasm = \"library.wasm\"\n\
                       instances_per_shard = 2\n";
const CHAOS: &str = "[[routers]]\nname = \"chaos\"\nwasm = \"chaos.wasm\"\n\
                     instances_per_shard = 2\nqueue_depth = 16\ncall_deadline = \"5s\"\n";

/// A whole configuration: two shards, every listener on port 0, the
/// bundled routers' directory, and `routers` (router tables, joined).
/// `frames_extra`: lines added to `[frames]`, which a reload may not change.
fn config_with(routers: &[&str], frames_extra: &str) -> String {
    format!(
        r#"[broker]
shards = 2
routers_dir = "{dir}"
drain_timeout = "5s"
drain_grace = "0s"

[frames]
listen = "127.0.0.1:0"
{frames_extra}

[grpc]
listen = "127.0.0.1:0"

[http]
listen = "127.0.0.1:0"

[metrics]
listen = "127.0.0.1:0"

[naming]
separator = "__"

{routers}"#,
        dir = routers_dir().display(),
        routers = routers.join("\n"),
    )
}

fn config(routers: &[&str]) -> String {
    config_with(routers, "")
}

/// A broker on a configuration file this test owns and rewrites.
struct Reloadable {
    b: Broker,
    dir: PathBuf,
    path: PathBuf,
}

impl Reloadable {
    /// Starts the broker on `toml`, written to a fresh directory for `test`.
    fn start(test: &str, toml: &str) -> Reloadable {
        Self::start_with(test, toml, |_| {})
    }

    fn start_with(test: &str, toml: &str, edit: impl FnOnce(&mut Command)) -> Reloadable {
        let dir = std::env::temp_dir().join(format!("mcp-reload-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("broker.toml");
        std::fs::write(&path, toml).unwrap();
        let b = Broker::start_command(None, &["--config", path.to_str().unwrap()], edit);
        Reloadable { b, dir, path }
    }

    /// Replaces the configuration file whole (write, then rename), so a
    /// reload never reads half a file.
    fn write(&self, toml: &str) {
        let tmp = self.dir.join("broker.toml.new");
        std::fs::write(&tmp, toml).unwrap();
        std::fs::rename(&tmp, &self.path).unwrap();
    }

    /// `POST /admin/reload`: the HTTP status and the JSON answer.
    fn reload(&self) -> (u16, Value) {
        let r = admin(&self.b, "POST", "/admin/reload");
        let ctype = r.header("content-type").unwrap_or("").to_string();
        assert!(
            ctype.starts_with("application/json"),
            "POST /admin/reload answered {} with Content-Type {ctype:?}: {}",
            r.status,
            r.text()
        );
        (r.status, r.json())
    }

    /// `write(toml)` then [`Self::reload`], expecting it applied: the answer.
    fn apply(&self, toml: &str) -> Value {
        self.write(toml);
        let (status, v) = self.reload();
        assert_eq!(status, 200, "the reload was not applied: {v}");
        assert_eq!(v["status"], "applied", "{v}");
        v
    }

    /// `write(toml)` then [`Self::reload`], expecting it refused: the
    /// answer's errors (after checking the answer's shape).
    fn refuse(&self, toml: &str, generation: u64) -> Vec<String> {
        self.write(toml);
        let (status, v) = self.reload();
        assert_eq!(status, 422, "the reload was not refused: {v}");
        assert_eq!(v["status"], "refused", "{v}");
        assert_eq!(
            v["generation"].as_u64(),
            Some(generation),
            "a refused reload must leave the generation as it was: {v}"
        );
        v["errors"]
            .as_array()
            .unwrap_or_else(|| panic!("no errors array in {v}"))
            .iter()
            .map(|e| {
                e.as_str()
                    .unwrap_or_else(|| panic!("error {e} is not a string"))
                    .to_string()
            })
            .collect()
    }
}

impl Drop for Reloadable {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One request to the admin/metrics listener (its own connection).
fn admin(b: &Broker, method: &str, path: &str) -> Reply {
    let mut c = Conn::connect(b.metrics);
    c.request(
        method,
        path,
        &[
            ("Connection", "close"),
            ("Content-Type", "application/json"),
        ],
        b"",
    )
}

/// The names in a reload answer's list `key`, sorted.
fn listed(v: &Value, key: &str) -> Vec<String> {
    let mut n: Vec<String> = v[key]
        .as_array()
        .unwrap_or_else(|| panic!("no {key} array in {v}"))
        .iter()
        .map(|x| x.as_str().unwrap().to_string())
        .collect();
    n.sort();
    n
}

/// The sum of the samples of `name` whose labels include `label` (absent:
/// 0, as for a counter never incremented).
fn metric_with(b: &Broker, name: &str, label: &str) -> f64 {
    metric_with_all(b, name, &[label])
}

/// [`metric_with`], the labels including every one of `labels`.
fn metric_with_all(b: &Broker, name: &str, labels: &[&str]) -> f64 {
    let (status, body) = b.http_get("/metrics");
    assert_eq!(status, 200);
    body.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .and_then(|r| r.strip_prefix('{'))
                .map(|r| r.split('}').next().unwrap())
                .is_some_and(|set| labels.iter().all(|l| set.contains(l)))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn reloads(b: &Broker, result: &str) -> f64 {
    metric_with(
        b,
        "mcp_config_reloads_total",
        &format!("result=\"{result}\""),
    )
}

/// `mcp_config_generation`, which must be exported.
fn generation(b: &Broker) -> u64 {
    let (_, body) = b.http_get("/metrics");
    body.lines()
        .find_map(|l| l.strip_prefix("mcp_config_generation "))
        .unwrap_or_else(|| panic!("no mcp_config_generation gauge in /metrics:\n{body}"))
        .trim()
        .parse::<f64>()
        .unwrap() as u64
}

/// An HTTP session on `b`.
fn session(b: &Broker) -> (Conn, String) {
    let mut c = Conn::connect(b.http);
    let s = c.initialize("2025-06-18");
    (c, s)
}

/// The tool names `tools/list` gives a fresh HTTP session.
fn tools(b: &Broker) -> Vec<String> {
    let (mut c, s) = session(b);
    let v = c.call(&s, 1, "tools/list", "{}");
    v["result"]["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("no tools in {v}"))
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_string())
        .collect()
}

fn has(tools: &[String], t: &str) -> bool {
    tools.iter().any(|x| x == t)
}

/// Calls `name` over HTTP in a fresh session: the JSON-RPC message.
fn http_call(b: &Broker, name: &str, args: &str) -> Value {
    let (mut c, s) = session(b);
    c.call(
        &s,
        7,
        "tools/call",
        &format!(r#"{{"name":"{name}","arguments":{args}}}"#),
    )
}

fn text_of(v: &Value) -> String {
    v["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("no text result in {v}"))
        .to_string()
}

/// Asserts `v` is the HTTP edge's unknown-tool error for `name` (MCP's
/// wording: invalid params, `Unknown tool: <name>`).
fn assert_unknown_tool(v: &Value, name: &str) {
    assert_eq!(
        v["error"]["code"], -32602,
        "{name} should be an unknown tool now: {v}"
    );
    let msg = v["error"]["message"].as_str().unwrap_or("");
    assert!(msg.contains(name), "the error should name {name}: {v}");
}

/// Reads what arrives on an open SSE stream until it contains `needle`, for
/// at most `within`: the raw text read (chunk framing included).
fn read_until(c: &mut Conn, needle: &str, within: Duration) -> String {
    let deadline = Instant::now() + within;
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&seen).into_owned();
        if text.contains(needle) {
            return text;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(
            !left.is_zero(),
            "no {needle} on the stream within {within:?}; it carried: {text:?}"
        );
        c.stream
            .get_ref()
            .set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .unwrap();
        match c.stream.read(&mut buf) {
            Ok(0) => panic!("the stream closed before {needle}; it carried: {text:?}"),
            Ok(n) => seen.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(e) => panic!("reading the stream: {e}; it carried: {text:?}"),
        }
    }
}

/// A connection holding session `s`'s GET (SSE) stream open.
fn listen(b: &Broker, s: &str) -> Conn {
    let mut c = Conn::connect(b.http);
    c.send_raw(
        format!(
            "GET /mcp HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\nMcp-Session-Id: {s}\r\n\r\n"
        )
        .as_bytes(),
    );
    assert_eq!(c.read_head().0, 200, "the session's GET stream");
    c
}

/// A frame connection that sent an InitializeRequest (so it is told when
/// listings change).
fn initialized_frames(b: &Broker) -> common::Client {
    let mut f = b.connect();
    f.request(None, |e, h| {
        e.initialize(
            h,
            mcp_schema::fb::protocol::ProtocolVersion::V2025_06_18,
            "reload-test",
            "1",
        )
        .to_vec()
    });
    f
}

/// A running `mcp-loadgen` against one edge, with its JSON report's path.
struct Load {
    edge: &'static str,
    child: Child,
    json: PathBuf,
}

impl Load {
    /// Closed-loop `echo_text` calls on `target` for `duration`.
    fn start(edge: &'static str, target: String, dir: &Path, duration: &str) -> Load {
        Self::start_tool(
            edge,
            target,
            dir,
            duration,
            "echo_text",
            r#"{"text":"reload"}"#,
        )
    }

    /// Closed-loop calls of `tool` with `args` on `target` for `duration`;
    /// `edge` names the run (and its report).
    fn start_tool(
        edge: &'static str,
        target: String,
        dir: &Path,
        duration: &str,
        tool: &str,
        args: &str,
    ) -> Load {
        let json = dir.join(format!("loadgen-{edge}.json"));
        let child = Command::new(loadgen())
            .args(["--target", &target, "--tool", tool])
            .args(["--args", args])
            .args(["--connections", "4", "--duration", duration])
            .args(["--timeout", "10s", "-q", "--json"])
            .arg(&json)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run mcp-loadgen");
        Load { edge, child, json }
    }

    /// Ends the run as Ctrl-C does, waits for it (bounded) and checks that
    /// nothing was lost: no error of any kind, every request sent reached
    /// its outcome, and it was a success. On SIGINT mcp-loadgen stops
    /// sending, still waits for every request already sent (its `--drain`),
    /// writes its report with the interruption as the reason the run ended
    /// early, and exits 130, as shells expect.
    fn interrupt(mut self) {
        // SAFETY: kill(2) with the pid of a child this test spawned and has
        // not reaped yet (it is waited for below).
        let sent = unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGINT) };
        assert_eq!(sent, 0, "SIGINT to mcp-loadgen on {}", self.edge);
        let deadline = Instant::now() + Duration::from_secs(40);
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            assert!(
                Instant::now() < deadline,
                "mcp-loadgen on {} did not finish within 40 s",
                self.edge
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        let mut stderr = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            let _ = e.read_to_string(&mut stderr);
        }
        let report: Value = serde_json::from_slice(
            &std::fs::read(&self.json)
                .unwrap_or_else(|e| panic!("{}: no JSON report ({e}): {stderr}", self.edge)),
        )
        .unwrap();
        let edge = self.edge;
        eprintln!(
            "mcp-loadgen {edge}: {} requests, {} ok, {} errors",
            report["requests"], report["ok"], report["errors"]
        );
        assert_eq!(
            status.code(),
            Some(130),
            "{edge}: mcp-loadgen after SIGINT ({status}): {stderr}\n{report}"
        );
        assert!(
            report["failure"]
                .as_str()
                .is_some_and(|f| f.starts_with("interrupted")),
            "{edge}: the run stopped for another reason: {report}"
        );
        assert_eq!(
            report["errors"], 0,
            "{edge}: requests failed across the reload: {}\n{report}",
            report["errors_by_kind"]
        );
        assert!(
            report["requests"].as_u64().unwrap() > 0,
            "{edge}: no request measured: {report}"
        );
        assert_eq!(
            report["requests"], report["sent"],
            "{edge}: requests sent without an outcome (lost): {report}"
        );
        assert_eq!(
            report["ok"], report["requests"],
            "{edge}: not every request succeeded: {report}"
        );
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The point of hot reload: the route table changes under full load on all
/// three edges and no client notices anything but the new listings. echo
/// (loaded on every edge) is unchanged, kv's entry changes (and is loaded
/// too), library goes, chaos comes; every loadgen request still succeeds.
#[test]
fn reload_under_load_on_every_edge_loses_nothing() {
    let r = Reloadable::start("load", &config(&[ECHO, KV, LIBRARY]));
    let b = &r.b;
    let gen0 = generation(b);
    assert_eq!(
        gen0, 1,
        "the configuration the broker started on is generation 1"
    );
    let before = tools(b);
    assert!(has(&before, "search"), "library serves search: {before:?}");
    assert!(
        !has(&before, "sleep"),
        "chaos is not served yet: {before:?}"
    );

    // Generators that run until this test ends them, once the reload is
    // applied: how long the reload takes (it compiles two components)
    // depends on the machine, and a fixed run could end before it. The
    // duration only bounds a test that fails before the end.
    let mut loads = [
        Load::start("frames", format!("frames://{}", b.frames), &r.dir, "60s"),
        Load::start("grpc", format!("grpc://{}", b.grpc), &r.dir, "60s"),
        Load::start("http", b.mcp_url(), &r.dir, "60s"),
        // kv is replaced by the reload: its calls move from the old pool to
        // the new one without a failure either.
        Load::start_tool(
            "frames-kv",
            format!("frames://{}", b.frames),
            &r.dir,
            "60s",
            "put",
            r#"{"key":"k","value":1}"#,
        ),
    ];
    // Let every generator connect and reach its steady state.
    std::thread::sleep(Duration::from_millis(1500));

    let v = r.apply(&config(&[ECHO, KV_CHANGED, CHAOS]));
    assert_eq!(listed(&v, "added"), ["chaos"], "{v}");
    assert_eq!(listed(&v, "changed"), ["kv"], "{v}");
    assert_eq!(listed(&v, "removed"), ["library"], "{v}");
    assert_eq!(listed(&v, "unchanged"), ["echo"], "{v}");
    assert_eq!(v["generation"].as_u64(), Some(gen0 + 1), "{v}");
    for l in &mut loads {
        assert!(
            l.child.try_wait().unwrap().is_none(),
            "mcp-loadgen on {} ended before the reload was applied: the reload \
             was not under load",
            l.edge
        );
    }
    // Load on the new route table too, then every generator drains.
    std::thread::sleep(Duration::from_millis(1000));
    for l in loads {
        l.interrupt();
    }

    let after = tools(b);
    for t in ["sleep", "fail", "echo_text", "get", "put"] {
        assert!(
            has(&after, t),
            "{t} is not listed after the reload: {after:?}"
        );
    }
    assert!(
        !has(&after, "search"),
        "library's search is still listed after its removal: {after:?}"
    );
    assert_unknown_tool(&http_call(b, "search", r#"{"query":"x"}"#), "search");
    // kv (replaced by its changed entry) serves a session's state.
    let (mut c, s) = session(b);
    let put = c.call(
        &s,
        1,
        "tools/call",
        r#"{"name":"put","arguments":{"key":"k","value":42}}"#,
    );
    assert!(
        put.get("result").is_some(),
        "kv put after the reload: {put}"
    );
    let got = c.call(
        &s,
        2,
        "tools/call",
        r#"{"name":"get","arguments":{"key":"k"}}"#,
    );
    assert_eq!(text_of(&got), "42", "kv get after the reload: {got}");
    let slept = http_call(b, "sleep", r#"{"ms":1}"#);
    assert!(text_of(&slept).starts_with("slept"), "{slept}");
    assert_eq!(reloads(b, "applied"), 1.0);
    assert_eq!(reloads(b, "refused"), 0.0);
    assert_eq!(generation(b), gen0 + 1);
}

/// Calls in flight finish on the instances they started on: removing their
/// router drains it rather than cutting them off. Afterwards the router's
/// tools are unknown.
#[test]
fn in_flight_call_on_a_removed_router_finishes() {
    let r = Reloadable::start("inflight", &config(&[ECHO, CHAOS]));
    let b = &r.b;
    let http = {
        let addr = b.http;
        std::thread::spawn(move || {
            let mut c = Conn::connect(addr);
            let s = c.initialize("2025-06-18");
            let t = Instant::now();
            let v = c.call(
                &s,
                1,
                "tools/call",
                r#"{"name":"sleep","arguments":{"ms":1500}}"#,
            );
            (v, t.elapsed())
        })
    };
    let frames = {
        let addr = b.frames;
        std::thread::spawn(move || {
            let mut f = common::Client::connect(addr);
            let t = Instant::now();
            let resp = f.call("sleep", &[("ms", "1500")], None);
            (resp, t.elapsed())
        })
    };
    // The calls reached their chaos instances before the reload: the frames
    // one is counted in flight; the HTTP one started at the same time
    // (its edge may not count it there), so give it a moment more.
    assert!(
        eventually(Duration::from_secs(5), || {
            b.metric_sum("mcp_in_flight_requests") >= 1.0
        }),
        "the sleep calls never showed as in flight"
    );
    std::thread::sleep(Duration::from_millis(300));
    let started = Instant::now();
    let v = r.apply(&config(&[ECHO]));
    assert_eq!(listed(&v, "removed"), ["chaos"], "{v}");
    assert_eq!(listed(&v, "unchanged"), ["echo"], "{v}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the reload answer took {:?}",
        started.elapsed()
    );

    let (v, took) = http.join().unwrap();
    assert!(
        text_of(&v).starts_with("slept"),
        "the HTTP call in flight on the removed router did not finish normally: {v}"
    );
    assert!(took >= Duration::from_millis(1400), "{took:?}");
    let (resp, took) = frames.join().unwrap();
    assert!(
        common::tool_text(&resp).starts_with("slept"),
        "the frames call in flight on the removed router did not finish normally"
    );
    assert!(took >= Duration::from_millis(1400), "{took:?}");
    // Counted under the router that ran them, though the route table no
    // longer has it when they are recorded (they once counted as the
    // broker's own answers, tool `other`).
    for edge in ["frames", "http"] {
        let ran = ["router=\"chaos\"", "kind=\"call_tool\"", "outcome=\"ok\""];
        let at = format!("edge=\"{edge}\"");
        let n = metric_with_all(b, "mcp_requests_total", &[&ran[..], &[&at[..]]].concat());
        assert_eq!(n, 1.0, "{edge}: the call is not counted under chaos");
    }
    let timed = ["router=\"chaos\"", "tool=\"sleep\""];
    let n = metric_with_all(b, "mcp_request_duration_seconds_count", &timed);
    assert_eq!(n, 2.0, "the calls' latency is not under chaos/sleep");
    // The removed router's WASM call histogram stays, with both calls (it
    // once left /metrics with its router).
    let chaos = ["router=\"chaos\""];
    let n = metric_with_all(b, "mcp_wasm_call_duration_seconds_count", &chaos);
    assert_eq!(n, 2.0, "chaos's WASM call histogram after its removal");
    let n = metric_with_all(b, "mcp_queue_wait_seconds_count", &chaos);
    assert!(
        n >= 1.0,
        "chaos's queue wait histogram after its removal: {n}"
    );

    // New calls: chaos is gone, on every edge this test speaks.
    assert_unknown_tool(&http_call(b, "sleep", r#"{"ms":1}"#), "sleep");
    let mut f = b.connect();
    let resp = f.call("sleep", &[("ms", "1")], None);
    let (code, msg) = ResponseView::parse(&resp)
        .unwrap()
        .error()
        .expect("calling a removed router's tool over frames must fail");
    assert_eq!(code, -32601, "frames unknown tool: {msg}");
    assert!(msg.contains("sleep"), "{msg}");
    assert_eq!(
        common::tool_text(&f.call("echo_text", &[("text", "\"still here\"")], None)),
        "still here"
    );
}

/// A reload that changes the listings is announced on every edge: the HTTP
/// session's GET stream, the gRPC session's Subscribe stream, and a frame
/// connection that initialized.
#[test]
fn list_changed_reaches_every_edge_on_reload() {
    use mcp_proto::v1 as pb;
    let r = Reloadable::start("notify", &config(&[ECHO]));
    let b = &r.b;
    let (_c, s) = session(b);
    let mut sse = listen(b, &s);
    let mut framed = initialized_frames(b);
    framed
        .stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let rt = rt();
    let (mut g, mut sub) = rt.block_on(async {
        let mut g = grpc_client(b).await;
        let session = common::grpc::initialize(&mut g, "reload-test").await;
        let sub = g
            .subscribe(with_session(
                pb::SubscribeRequest {
                    topics: vec!["tool_list_changed".into()],
                },
                &session,
            ))
            .await
            .unwrap()
            .into_inner();
        (g, sub)
    });

    let v = r.apply(&config(&[ECHO, CHAOS]));
    assert_eq!(listed(&v, "added"), ["chaos"], "{v}");

    read_until(
        &mut sse,
        "notifications/tools/list_changed",
        Duration::from_secs(10),
    );
    let n = rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(10), sub.message())
            .await
            .expect("a gRPC notification within 10 s of the reload")
            .expect("the Subscribe stream failed")
            .expect("the Subscribe stream ended")
    });
    assert!(
        matches!(
            n.notification,
            Some(pb::notification::Notification::ToolListChanged(_))
        ),
        "the gRPC Subscribe stream got {n:?}"
    );
    let f = framed
        .read_frame()
        .expect("a ListChangedNotification frame within 10 s of the reload");
    let lc = ResponseView::parse(&f).unwrap();
    assert_eq!(lc.correlation_id(), "", "a notification answers no request");
    let lc = lc
        .response
        .payload_as_list_changed_notification()
        .expect("a ListChangedNotification frame");
    assert!(lc.tools(), "the tools listing changed");

    // What they are told about is served on each edge.
    let listed_grpc = rt.block_on(async {
        g.list_tools(pb::ListToolsRequest::default())
            .await
            .unwrap()
            .into_inner()
    });
    assert!(
        listed_grpc.tools.iter().any(|t| t.name == "sleep"),
        "gRPC ListTools after the reload: {:?}",
        listed_grpc
            .tools
            .iter()
            .map(|t| &t.name)
            .collect::<Vec<_>>()
    );
    assert!(has(&tools(b), "sleep"));
    let resp = framed.call("sleep", &[("ms", "1")], None);
    assert!(common::tool_text(&resp).starts_with("slept"));
}

/// A reload that cannot be applied changes nothing: 422 with every error,
/// the old routers keep serving, the generation stays, and the refusals are
/// counted.
#[test]
fn refused_reload_keeps_the_old_config() {
    let good = config(&[ECHO, KV]);
    let r = Reloadable::start("refused", &good);
    let b = &r.b;
    let gen0 = generation(b);
    let old_tools = tools(b);
    let still_serving = |what: &str| {
        assert_eq!(
            tools(b),
            old_tools,
            "the listing changed after a refused reload ({what})"
        );
        let v = http_call(b, "echo_text", r#"{"text":"old"}"#);
        assert_eq!(text_of(&v), "old", "after a refused reload ({what}): {v}");
        assert_eq!(
            generation(b),
            gen0,
            "mcp_config_generation moved after a refused reload ({what})"
        );
    };

    // (a) Not TOML at all: one syntax error.
    let errors = r.refuse("[[routers]\nname = ", gen0);
    assert!(!errors.is_empty(), "a syntax error must be listed");
    still_serving("TOML syntax");

    // Two invalid values: both are listed, not just the first.
    let two_bad = config(&[ECHO, KV])
        .replace("instances_per_shard = 2", "instances_per_shard = 0")
        .replace("separator = \"__\"", "separator = \"\"");
    let errors = r.refuse(&two_bad, gen0);
    assert!(
        errors.iter().any(|e| e.contains("instances_per_shard")),
        "kv's instances_per_shard = 0 is not listed: {errors:?}"
    );
    assert!(
        errors.iter().any(|e| e.contains("separator")),
        "naming.separator = \"\" is not listed: {errors:?}"
    );
    still_serving("two invalid values");

    // (b) A component that does not compile and one that does not exist:
    // both named, each with its router and file.
    let junk = r.dir.join("junk.wasm");
    std::fs::write(&junk, b"\0asm this is not a component at all").unwrap();
    let ghost = r.dir.join("no-such-dir/ghost.wasm");
    let bad_components = config(&[
        ECHO,
        KV,
        &format!(
            "[[routers]]\nname = \"junk\"\nwasm = \"{}\"\n",
            junk.display()
        ),
        &format!(
            "[[routers]]\nname = \"ghost\"\nwasm = \"{}\"\n",
            ghost.display()
        ),
    ]);
    let errors = r.refuse(&bad_components, gen0);
    assert!(
        errors
            .iter()
            .any(|e| e.contains("junk") && e.contains("junk.wasm")),
        "the garbage component is not named with its router and file: {errors:?}"
    );
    assert!(
        errors
            .iter()
            .any(|e| e.contains("ghost") && e.contains("ghost.wasm")),
        "the missing component is not named with its router and file: {errors:?}"
    );
    still_serving("bad components");

    // (c) The frame edge's settings are read only at start-up: a change is
    // refused, naming the section and saying a restart is needed. (Not
    // `frames.listen`: the harness starts the broker with `--listen`, and a
    // reload applies the command line's overrides again, so the file's
    // listen address is not what runs.) A bad component beside it is
    // listed in the same refusal: the checks do not stop at the first
    // that fails, so one answer names everything to mend.
    let errors = r.refuse(
        &config_with(
            &[
                ECHO,
                KV,
                &format!(
                    "[[routers]]\nname = \"junk\"\nwasm = \"{}\"\n",
                    junk.display()
                ),
            ],
            "max_in_flight_per_connection = 128",
        ),
        gen0,
    );
    assert!(
        errors
            .iter()
            .any(|e| e.contains("frames") && e.contains("restart")),
        "the refusal must name [frames] and say it needs a restart: {errors:?}"
    );
    assert!(
        errors.iter().any(|e| e.contains("junk.wasm")),
        "the bad component beside a restart-only change is not listed: {errors:?}"
    );
    still_serving("[frames] changed");

    // (d) A duration past the clock's range, which once passed the checks
    // and panicked the reload (and with it the thread that reloads):
    // refused like any bad value, by its key path.
    let errors = r.refuse(
        &good.replace(
            "drain_timeout = \"5s\"",
            "drain_timeout = \"300000000000years\"",
        ),
        gen0,
    );
    assert!(
        errors
            .iter()
            .any(|e| e.contains("broker.drain_timeout: must be at most 365 days")),
        "{errors:?}"
    );
    still_serving("a duration past the clock's range");

    // (e) More instances than the slots reserved at start-up leave room
    // for. 200 chaos instances (2 shards) would warm (the new pools fit beside the
    // running ones), but they would take the slots kept for kv's sessions,
    // which are instantiated only as sessions open: new sessions then
    // failed with -32002 while the reload had been applied.
    let errors = r.refuse(
        &config(&[
            ECHO,
            KV,
            &CHAOS.replace("instances_per_shard = 2", "instances_per_shard = 100"),
        ]),
        gen0,
    );
    assert!(
        errors
            .iter()
            .any(|e| e.contains("pooled instance slots") && e.contains("restart")),
        "{errors:?}"
    );
    still_serving("more instances than the reserved slots");

    assert_eq!(
        reloads(b, "refused"),
        6.0,
        "mcp_config_reloads_total{{result=\"refused\"}}"
    );
    assert_eq!(reloads(b, "applied"), 0.0);

    // The good file again: applied, though it changes nothing.
    let v = r.apply(&good);
    assert_eq!(v["generation"].as_u64(), Some(gen0 + 1), "{v}");
    assert_eq!(listed(&v, "unchanged"), ["echo", "kv"], "{v}");
    for k in ["added", "changed", "removed"] {
        assert!(listed(&v, k).is_empty(), "{k} should be empty: {v}");
    }
    assert_eq!(reloads(b, "applied"), 1.0);
    assert_eq!(generation(b), gen0 + 1);
}

/// SIGHUP reloads like `POST /admin/reload` and says how it went on stderr.
#[test]
fn sighup_reloads() {
    let mut r = Reloadable::start_with("sighup", &config(&[ECHO]), |c| {
        c.stderr(Stdio::piped());
    });
    let log = common::Log::of(&mut r.b);
    let b = &r.b;
    let hup = || {
        // SAFETY: kill(2) on our own child's pid; no memory is involved.
        let rc = unsafe { kill(b.child.id() as i32, SIGHUP) };
        assert_eq!(rc, 0, "kill -HUP");
    };
    let gen0 = generation(b);

    r.write(&config(&[ECHO, CHAOS]));
    hup();
    assert!(
        eventually(Duration::from_secs(15), || has(&tools(b), "sleep")),
        "chaos's tools were not listed within 15 s of SIGHUP: {:?}",
        tools(b)
    );
    assert!(
        log.shows("reload applied", Duration::from_secs(5)),
        "no `reload applied` on stderr:\n{}",
        log.text()
    );
    assert_eq!(reloads(b, "applied"), 1.0);
    assert_eq!(generation(b), gen0 + 1);

    // A refused SIGHUP: logged, counted, and the broker keeps serving.
    r.write("[[routers]\nbroken");
    hup();
    assert!(
        log.shows("reload refused", Duration::from_secs(15)),
        "no `reload refused` on stderr:\n{}",
        log.text()
    );
    assert_eq!(reloads(b, "refused"), 1.0);
    assert_eq!(generation(b), gen0 + 1);
    assert!(has(&tools(b), "sleep"), "the applied config keeps serving");
    assert!(
        r.b.child.try_wait().unwrap().is_none(),
        "the broker must survive a SIGHUP with a bad configuration"
    );
}

/// Reloading is a state change: a GET (a crawler, a health check pointed
/// at the wrong path) must not trigger it.
#[test]
fn get_on_admin_reload_is_405() {
    let r = Reloadable::start("get405", &config(&[ECHO]));
    let b = &r.b;
    let gen0 = generation(b);
    r.write(&config(&[ECHO, CHAOS]));
    let reply = admin(b, "GET", "/admin/reload");
    assert_eq!(reply.status, 405, "{}", reply.text());
    assert_eq!(generation(b), gen0, "a GET reloaded the configuration");
    assert!(!has(&tools(b), "sleep"), "a GET reloaded the configuration");
    assert_eq!(reloads(b, "applied") + reloads(b, "refused"), 0.0);
}

/// A router whose entry is the same but whose .wasm file changed is
/// recompiled and swapped ("changed"); a reload that changes nothing is
/// still applied and counted as a new generation.
#[test]
fn a_changed_wasm_file_is_a_changed_router() {
    let mine = std::env::temp_dir().join(format!("mcp-reload-mine-{}.wasm", std::process::id()));
    std::fs::copy(routers_dir().join("echo.wasm"), &mine).unwrap();
    let table = format!(
        "[[routers]]\nname = \"mine\"\nwasm = \"{}\"\n",
        mine.display()
    );
    let toml = config(&[KV, &table]);
    let r = Reloadable::start("wasmfile", &toml);
    let b = &r.b;
    let gen0 = generation(b);
    assert!(has(&tools(b), "echo_text"));

    let v = r.apply(&toml);
    assert_eq!(listed(&v, "unchanged"), ["kv", "mine"], "{v}");
    assert_eq!(v["generation"].as_u64(), Some(gen0 + 1), "{v}");

    // Same path, same entry, other content: library in place of echo.
    std::fs::copy(routers_dir().join("library.wasm"), &mine).unwrap();
    let v = r.apply(&toml);
    let _ = std::fs::remove_file(&mine);
    assert_eq!(listed(&v, "changed"), ["mine"], "{v}");
    assert_eq!(listed(&v, "unchanged"), ["kv"], "{v}");
    assert_eq!(v["generation"].as_u64(), Some(gen0 + 2), "{v}");
    let now = tools(b);
    assert!(has(&now, "search"), "{now:?}");
    assert!(!has(&now, "echo_text"), "{now:?}");
    assert_eq!(reloads(b, "applied"), 2.0);
}

/// `[naming]` and `broker.routers_dir` are reloadable too: a new separator
/// renames the colliding tools, and a new routers directory is where the
/// routers' relative `wasm` paths are looked up from then on.
#[test]
fn naming_and_routers_dir_are_reloadable() {
    // Two routers on the same component: every tool name collides.
    let twin = "[[routers]]\nname = \"twin\"\nwasm = \"echo.wasm\"\n";
    let toml = config(&[ECHO, twin]);
    let r = Reloadable::start("naming", &toml);
    let b = &r.b;
    let now = tools(b);
    assert!(
        has(&now, "echo__echo_text") && has(&now, "twin__echo_text"),
        "colliding names are qualified with the separator: {now:?}"
    );

    let v = r.apply(&toml.replace("separator = \"__\"", "separator = \"--\""));
    assert_eq!(listed(&v, "unchanged"), ["echo", "twin"], "{v}");
    let now = tools(b);
    assert!(
        has(&now, "echo--echo_text") && has(&now, "twin--echo_text"),
        "the new separator is not applied: {now:?}"
    );
    assert!(!has(&now, "echo__echo_text"), "{now:?}");
    let v = http_call(b, "twin--echo_text", r#"{"text":"renamed"}"#);
    assert_eq!(text_of(&v), "renamed", "{v}");

    // Another routers directory, where `echo.wasm` is the library router.
    let other = r.dir.join("other-routers");
    std::fs::create_dir_all(&other).unwrap();
    std::fs::copy(routers_dir().join("library.wasm"), other.join("echo.wasm")).unwrap();
    let moved = config(&[ECHO]).replace(
        &format!("routers_dir = \"{}\"", routers_dir().display()),
        &format!("routers_dir = \"{}\"", other.display()),
    );
    assert_ne!(moved, config(&[ECHO]), "the routers_dir line was replaced");
    let v = r.apply(&moved);
    assert_eq!(listed(&v, "changed"), ["echo"], "{v}");
    assert_eq!(listed(&v, "removed"), ["twin"], "{v}");
    let now = tools(b);
    assert!(
        has(&now, "search") && !has(&now, "echo_text"),
        "echo.wasm was not read from the new routers_dir: {now:?}"
    );
}

/// While the broker drains (SIGTERM, a call still in flight) a reload is
/// refused with 503: the process is going away.
#[test]
fn reload_while_draining_is_503() {
    let r = Reloadable::start("drain", &config(&[ECHO, CHAOS]));
    let b = &r.b;
    let addr = b.frames;
    let call = std::thread::spawn(move || {
        let mut f = common::Client::connect(addr);
        f.call("sleep", &[("ms", "2500")], None)
    });
    assert!(
        eventually(Duration::from_secs(5), || {
            b.metric_sum("mcp_in_flight_requests") >= 1.0
        }),
        "the sleep call never showed as in flight"
    );
    b.sigterm();
    // Draining (drain_grace = 0s) once /readyz says so; the call holds the
    // drain open for about 2 s.
    let mut ready = (0, String::new());
    assert!(
        eventually(Duration::from_secs(2), || {
            ready = b.http_get("/readyz");
            ready.1.contains("draining")
        }),
        "/readyz never said the broker drains: {ready:?}"
    );
    let reply = admin(b, "POST", "/admin/reload");
    assert_eq!(
        reply.status,
        503,
        "POST /admin/reload while draining: {}",
        reply.text()
    );
    // The drain itself is undisturbed: the call in flight finishes.
    let resp = call.join().unwrap();
    assert!(common::tool_text(&resp).starts_with("slept"));
}

#[test]
fn a_reload_still_running_at_sigterm_gets_an_answer() {
    // Twelve routers to compile (seconds, in a debug build's compiler) keep
    // the reload busy past the signal. The process used to exit while it
    // ran, and the POST got no reply at all.
    // (kv's session slots reserve room for them: a reload past the slots
    // would be refused before compiling anything.)
    let r = Reloadable::start("term-during-reload", &config(&[ECHO, KV]));
    let routers: Vec<String> = (0..12)
        .map(|i| {
            format!(
                "[[routers]]\nname = \"chaos{i}\"\nwasm = \"chaos.wasm\"\ninstances_per_shard = 1\n"
            )
        })
        .collect();
    let mut all = vec![ECHO, KV];
    all.extend(routers.iter().map(String::as_str));
    r.write(&config(&all));
    let addr = r.b.metrics;
    let posting = std::thread::spawn(move || {
        let mut c = common::http::Conn::connect(addr);
        c.request("POST", "/admin/reload", &[], b"").status
    });
    std::thread::sleep(Duration::from_millis(100));
    let t = std::time::Instant::now();
    r.b.sigterm();
    let status = posting.join().expect("POST /admin/reload got no reply");
    assert_eq!(
        status, 503,
        "the reload ended before the signal, or was not answered so"
    );
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
}

const SIGHUP: i32 = 1;

unsafe extern "C" {
    fn kill(pid: i32, sig: i32) -> i32;
}

/// Whether process `pid` holds a TCP socket listening on `port` (IPv4): its
/// descriptors' socket inodes against `/proc/net/tcp`'s LISTEN entries.
fn listens_on(pid: u32, port: u16) -> bool {
    let inodes: std::collections::HashSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("the broker's descriptors")
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter_map(|l| {
            let l = l.to_string_lossy().into_owned();
            Some(l.strip_prefix("socket:[")?.strip_suffix(']')?.to_string())
        })
        .collect();
    let tcp = std::fs::read_to_string("/proc/net/tcp").expect("/proc/net/tcp");
    tcp.lines().skip(1).any(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        // local_address is ADDR:PORT in hex, st 0A is LISTEN, inode is the
        // tenth field.
        f.len() > 9
            && f[3] == "0A"
            && f[1].rsplit(':').next() == Some(&format!("{port:04X}"))
            && inodes.contains(f[9])
    })
}

/// Free loopback addresses (bound, then released: the broker binds them
/// next).
fn free_addrs<const N: usize>() -> [std::net::SocketAddr; N] {
    let held: Vec<_> = (0..N)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    std::array::from_fn(|i| held[i].local_addr().unwrap())
}

/// `config(routers)` with the four listeners at `[frames, grpc, http,
/// metrics]`.
fn config_listening(routers: &[&str], at: &[std::net::SocketAddr; 4]) -> String {
    let mut toml = config(routers);
    for (section, addr) in ["frames", "grpc", "http", "metrics"].iter().zip(at) {
        toml = toml.replace(
            &format!("[{section}]\nlisten = \"127.0.0.1:0\""),
            &format!("[{section}]\nlisten = \"{addr}\""),
        );
    }
    toml
}

/// A reload may not move an edge onto another edge's address: the
/// listeners are SO_REUSEPORT, so the bind would succeed and the two edges
/// would share that port's connections. Refused, naming both; the edge
/// that owns the address keeps all of its connections.
#[test]
fn a_reload_may_not_move_an_edge_onto_another_edges_address() {
    let dir = std::env::temp_dir().join(format!("mcp-reload-clash-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("broker.toml");
    // Every listener on port 0 in the file: the clash is with the address
    // the frame edge got, which only the running broker knows.
    let start = config(&[ECHO]);
    std::fs::write(&path, &start).unwrap();
    let b = Broker::start_on_file_listeners(&["--config", path.to_str().unwrap()]);
    let frames = b.frames;
    let onto = |addr: std::net::SocketAddr| {
        start.replace(
            "[http]\nlisten = \"127.0.0.1:0\"",
            &format!("[http]\nlisten = \"{addr}\""),
        )
    };
    std::fs::write(&path, onto(frames)).unwrap();
    let r = admin(&b, "POST", "/admin/reload");
    assert_eq!(r.status, 422, "{}", r.text());
    let text = r.text();
    assert!(
        text.contains("http.listen") && text.contains(&frames.to_string()),
        "{text}"
    );
    // The same address written IPv4-mapped is the same to the kernel.
    let mapped = std::net::SocketAddr::from((
        std::net::Ipv4Addr::LOCALHOST.to_ipv6_mapped(),
        frames.port(),
    ));
    std::fs::write(&path, onto(mapped)).unwrap();
    let r = admin(&b, "POST", "/admin/reload");
    assert_eq!(r.status, 422, "{}", r.text());
    assert!(
        r.text().contains("is the frames edge's address"),
        "{}",
        r.text()
    );
    // Another process's listener (another broker's, SO_REUSEPORT as well)
    // is as busy as any: the bind alone would have joined it.
    let other = Broker::start(&[]);
    std::fs::write(&path, onto(other.http)).unwrap();
    let r = admin(&b, "POST", "/admin/reload");
    assert_eq!(r.status, 422, "{}", r.text());
    assert!(
        r.text().contains("cannot bind") && r.text().contains("in use"),
        "{}",
        r.text()
    );
    // Every connection to the frame edge's address is still the frame edge's.
    for _ in 0..8 {
        let f = common::Client::connect(frames).call("echo_text", &[("text", "\"mine\"")], None);
        assert_eq!(common::tool_text(&f), "mine");
    }
    // An edge may move onto another spelling of its own address: its own
    // listeners, which hold the port until they close, do not make it busy.
    let own = start.replace(
        "[frames]\nlisten = \"127.0.0.1:0\"",
        &format!("[frames]\nlisten = \"{mapped}\""),
    );
    std::fs::write(&path, own).unwrap();
    let r = admin(&b, "POST", "/admin/reload");
    assert_eq!(r.status, 200, "{}", r.text());
    std::thread::sleep(Duration::from_secs(1));
    for _ in 0..8 {
        let f = common::Client::connect(frames).call("echo_text", &[("text", "\"moved\"")], None);
        assert_eq!(common::tool_text(&f), "moved");
    }
    std::fs::write(&path, &start).unwrap();
    // Two edges on one address in the file itself: refused by the checks.
    let [a] = free_addrs::<1>();
    let both = onto(a).replace(
        "[grpc]\nlisten = \"127.0.0.1:0\"",
        &format!("[grpc]\nlisten = \"{a}\""),
    );
    std::fs::write(&path, both).unwrap();
    let r = admin(&b, "POST", "/admin/reload");
    assert_eq!(r.status, 422, "{}", r.text());
    assert!(
        r.text().contains("http.listen") && r.text().contains("grpc.listen"),
        "{}",
        r.text()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A second broker started on a running broker's ports fails to start,
/// naming the edge and the address: its `SO_REUSEPORT` listeners would have
/// joined the first broker's, and the kernel would have split the clients
/// between two brokers.
#[test]
fn a_second_broker_on_a_running_brokers_port_fails_to_start() {
    let first = Broker::start(&[]);
    let any = "127.0.0.1:0";
    let (frames, grpc, http) = (
        first.frames.to_string(),
        first.grpc.to_string(),
        first.http.to_string(),
    );
    for (flags, edge, addr) in [
        (
            [
                "--listen",
                &frames,
                "--grpc-listen",
                any,
                "--http-listen",
                any,
            ],
            "frame edge",
            &frames,
        ),
        (
            [
                "--listen",
                any,
                "--grpc-listen",
                &grpc,
                "--http-listen",
                any,
            ],
            "gRPC edge",
            &grpc,
        ),
        (
            [
                "--listen",
                any,
                "--grpc-listen",
                any,
                "--http-listen",
                &http,
            ],
            "HTTP edge",
            &http,
        ),
    ] {
        let mut args = flags.to_vec();
        args.extend(["--metrics-listen", any]);
        let stderr = common::fails_to_start_with(&config(&[ECHO]), &args);
        assert!(
            stderr.contains(&format!("binding the {edge} on {addr}")) && stderr.contains("in use"),
            "{stderr}"
        );
    }
    // Every client of the first broker's frame port is its own.
    for _ in 0..8 {
        let f = first
            .connect()
            .call("echo_text", &[("text", "\"first\"")], None);
        assert_eq!(common::tool_text(&f), "first");
    }
}

/// A reload that moves every edge: the answer names the new addresses, new
/// connections are served there (frames, HTTP, gRPC, admin), connections
/// made before the reload keep being served, and the old addresses stop
/// accepting once their listeners' linger ends.
#[test]
fn moved_listeners_take_new_connections_and_keep_established_ones() {
    let old = free_addrs::<4>();
    let new = free_addrs::<4>();
    let dir = std::env::temp_dir().join(format!("mcp-reload-listen-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("broker.toml");
    std::fs::write(&path, config_listening(&[ECHO], &old)).unwrap();
    let b = Broker::start_on_file_listeners(&["--config", path.to_str().unwrap()]);
    assert_eq!(
        [b.frames, b.grpc, b.http, b.metrics],
        old,
        "{}",
        b.ready_line
    );

    // Established before the reload, used after it.
    let mut frames_before = common::Client::connect(old[0]);
    let mut http_before = Conn::connect(old[2]);
    let session_before = http_before.initialize("2025-06-18");

    std::fs::write(&path, config_listening(&[ECHO], &new)).unwrap();
    let r = admin(&b, "POST", "/admin/reload");
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    for (edge, addr) in ["frames", "grpc", "http", "metrics"].iter().zip(&new) {
        assert_eq!(v["listen"][edge], addr.to_string(), "{v}");
    }

    // New connections, at the new addresses.
    let f = common::Client::connect(new[0]).call("echo_text", &[("text", "\"moved\"")], None);
    assert_eq!(common::tool_text(&f), "moved");
    let mut c = Conn::connect(new[2]);
    let s = c.initialize("2025-06-18");
    let v = c.call(
        &s,
        2,
        "tools/call",
        r#"{"name":"echo_text","arguments":{"text":"moved"}}"#,
    );
    assert_eq!(text_of(&v), "moved", "{v}");
    let mut m = Conn::connect(new[3]);
    let metrics = m.request("GET", "/metrics", &[("Connection", "close")], b"");
    assert!(
        metrics.text().contains("mcp_config_generation 2"),
        "{}",
        metrics.text()
    );
    rt().block_on(async {
        let ch = tonic::transport::Channel::from_shared(format!("http://{}", new[1]))
            .unwrap()
            .connect()
            .await
            .expect("the gRPC edge at its new address");
        let mut g = mcp_proto::v1::mcp_service_client::McpServiceClient::new(ch);
        let tools = g
            .list_tools(mcp_proto::v1::ListToolsRequest::default())
            .await
            .expect("ListTools at the new address")
            .into_inner();
        assert!(
            tools.tools.iter().any(|t| t.name == "echo_text"),
            "{tools:?}"
        );
    });

    // Connections made before the reload are still served where they are.
    let f = frames_before.call("echo_text", &[("text", "\"stayed\"")], None);
    assert_eq!(common::tool_text(&f), "stayed");
    let v = http_before.call(
        &session_before,
        3,
        "tools/call",
        r#"{"name":"echo_text","arguments":{"text":"stayed"}}"#,
    );
    assert_eq!(text_of(&v), "stayed", "{v}");

    // The old listeners close after their linger. Asked of the broker's own
    // sockets, not by connecting: once closed, a port can be taken at once
    // by another test's listener (this binary's tests start brokers on port
    // 0 in parallel), and a connect would then succeed.
    let pid = b.child.id();
    for (edge, addr) in ["frames", "grpc", "http", "metrics"].iter().zip(&new) {
        assert!(
            listens_on(pid, addr.port()),
            "the new {edge} listener {addr} is not the broker's"
        );
    }
    for (edge, addr) in ["frames", "grpc", "http", "metrics"].iter().zip(&old) {
        assert!(
            eventually(Duration::from_secs(5), || !listens_on(pid, addr.port())),
            "the old {edge} listener {addr} still accepts after the reload"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A reload that moves the edges back at once, while their old listeners
/// still linger, is applied: the broker's own lingering listeners hold
/// those ports, not another process (it was refused, blaming one).
#[test]
fn edges_moved_back_at_once_take_their_old_ports_again() {
    let old = free_addrs::<4>();
    let mut new = free_addrs::<4>();
    // The admin endpoint stays, so that both reloads are asked of it.
    new[3] = old[3];
    let dir = std::env::temp_dir().join(format!("mcp-reload-back-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("broker.toml");
    std::fs::write(&path, config_listening(&[ECHO], &old)).unwrap();
    let b = Broker::start_on_file_listeners(&["--config", path.to_str().unwrap()]);
    std::fs::write(&path, config_listening(&[ECHO], &new)).unwrap();
    let r = admin(&b, "POST", "/admin/reload");
    assert_eq!(r.status, 200, "{}", r.text());
    std::fs::write(&path, config_listening(&[ECHO], &old)).unwrap();
    let r = admin(&b, "POST", "/admin/reload");
    assert_eq!(r.status, 200, "{}", r.text());
    // Served there once the linger is over, by the new listeners.
    std::thread::sleep(Duration::from_secs(1));
    let f = common::Client::connect(old[0]).call("echo_text", &[("text", "\"back\"")], None);
    assert_eq!(common::tool_text(&f), "back");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A refused reload spends none of the process's room for new router
/// names (`RELOAD_ROUTER_HEADROOM`, 64): each of 70 refusals below names
/// a router never served before, ahead of a component that does not load.
/// The names were once kept, and a valid reload then failed with "already
/// served 66 router names".
#[test]
fn refused_reloads_spend_no_router_names() {
    // kv's session slots leave room in the instance pool for two more
    // routers of one instance each.
    let r = Reloadable::start("names", &config(&[ECHO, KV]));
    let junk = r.dir.join("junk.wasm");
    std::fs::write(&junk, b"\0asm not a component").unwrap();
    let gen0 = generation(&r.b);
    let one = "instances_per_shard = 1\n";
    for i in 0..70 {
        let fresh = format!("[[routers]]\nname = \"fresh{i}\"\nwasm = \"echo.wasm\"\n{one}");
        let bad = format!(
            "[[routers]]\nname = \"junk\"\nwasm = \"{}\"\n{one}",
            junk.display()
        );
        let errors = r.refuse(&config(&[ECHO, KV, &fresh, &bad]), gen0);
        assert!(
            errors.iter().any(|e| e.contains("junk.wasm"))
                && errors.iter().all(|e| !e.contains("router names")),
            "refusal {i} is not the component's alone: {errors:?}"
        );
    }
    let late = "[[routers]]\nname = \"late\"\nwasm = \"echo.wasm\"\ninstances_per_shard = 1\n";
    let v = r.apply(&config(&[ECHO, KV, late]));
    assert_eq!(listed(&v, "added"), ["late"], "{v}");
}
