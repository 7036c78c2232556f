//! `affinity = "session"` against the real `mcp-broker` binary: one
//! session's calls run on one instance of the session-affine `kv` router, in
//! order, whatever edge or shard they come from, and no session sees another's
//! keys. Uses the embedded default (`kv` with its default 4 instances per
//! shard) on two shards, with pipelined and concurrent calls.
//!
//! Needs the bundled routers (`scripts/build-routers`).

mod common;
mod grpc_harness;

use std::collections::HashMap;
use std::io::Write;

use common::{Client, error_code, tool_text};
use mcp_proto::v1 as pb;
use mcp_proto::v1::mcp_service_client::McpServiceClient;
use mcp_schema::client::{RequestHeader, ResponseView};
use tonic::Request;
use tonic::transport::Channel;

/// Pipelined put/get rounds per connection.
const ROUNDS: usize = 60;
/// A `list` after every this many rounds.
const LIST_EVERY: usize = 10;

/// What one pipelined request expects back.
enum Expect {
    Put(String),
    Get(String),
    /// The keys this connection has put so far (all must be listed, and
    /// every listed key must belong to the session).
    List(Vec<String>),
}

/// Writes every request of `rounds` pipelined put→get rounds (plus a `list`
/// now and then) on `c` in one go, and returns what each correlation id
/// expects.
fn send_pipeline(
    c: &mut Client,
    session: &str,
    tag: &str,
    rounds: usize,
) -> HashMap<String, Expect> {
    let mut frames = Vec::new();
    let mut expect = HashMap::new();
    let mut mine = Vec::new();
    let mut push = |c: &mut Client, tool: &str, args: &[(&str, &str)], e: Expect| {
        let (corr, id) = c.header();
        let h = RequestHeader {
            message_id: id,
            correlation_id: Some(&corr),
            session_id: Some(session),
            timeout_ms: 0,
            unix_nanos: 0,
        };
        frames.extend_from_slice(c.enc.tool_call(&h, id, tool, args));
        expect.insert(corr, e);
    };
    for i in 0..rounds {
        let key = format!("{session}-{tag}-k{i:03}");
        let value = format!("\"{session}-{tag}-v{i}\"");
        let k = format!("\"{key}\"");
        push(
            c,
            "put",
            &[("key", &k), ("value", &value)],
            Expect::Put(format!("stored {key}")),
        );
        push(c, "get", &[("key", &k)], Expect::Get(value));
        mine.push(key);
        if (i + 1) % LIST_EVERY == 0 {
            push(c, "list", &[], Expect::List(mine.clone()));
        }
    }
    c.stream.write_all(&frames).unwrap();
    expect
}

/// Reads every answer `expect` waits for on `c` (any order) and checks it.
fn check_pipeline(c: &mut Client, session: &str, mut expect: HashMap<String, Expect>) {
    for _ in 0..expect.len() {
        let f = c.read_final();
        let corr = ResponseView::parse(&f)
            .unwrap()
            .correlation_id()
            .to_string();
        let e = expect
            .remove(&corr)
            .unwrap_or_else(|| panic!("unexpected or duplicate answer {corr}"));
        let text = tool_text(&f);
        match e {
            Expect::Put(want) | Expect::Get(want) => {
                assert_eq!(text, want, "session {session}, request {corr}")
            }
            Expect::List(put) => {
                let listed: Vec<&str> = text.lines().collect();
                for k in &listed {
                    assert!(
                        k.starts_with(&format!("{session}-")),
                        "session {session} lists another session's key {k:?}: {listed:?}"
                    );
                }
                for k in &put {
                    assert!(
                        listed.contains(&k.as_str()),
                        "session {session} does not list its own key {k:?} put before the list: {listed:?}"
                    );
                }
            }
        }
    }
    assert!(expect.is_empty());
}

fn list_keys(c: &mut Client, session: &'static str) -> Vec<String> {
    let r = c.call("list", &[], Some(session));
    tool_text(&r).lines().map(String::from).collect()
}

#[test]
fn a_sessions_pipelined_calls_over_the_frame_edge_see_its_own_writes_and_only_them() {
    let b = common::Broker::start(&["--shards", "2"]);
    assert_eq!(b.shards, 2);
    // Six sessions on two shards: several share an owner shard, whose kv
    // instances they must not share.
    let sessions: Vec<&'static str> = (0..6)
        .map(|i| &*Box::leak(format!("frames-s{i}").into_boxed_str()))
        .collect();
    let addr = b.frames;
    std::thread::scope(|scope| {
        for &session in &sessions {
            scope.spawn(move || {
                // Two connections per session, both pipelining at once: the
                // kernel spreads them over the shards, so one is usually not
                // on the session's owner shard.
                let mut conns: Vec<Client> = (0..2).map(|_| Client::connect(addr)).collect();
                let expects: Vec<_> = conns
                    .iter_mut()
                    .enumerate()
                    .map(|(i, c)| send_pipeline(c, session, &format!("c{i}"), ROUNDS))
                    .collect();
                for (c, e) in conns.iter_mut().zip(expects) {
                    check_pipeline(c, session, e);
                }
                let mut keys = list_keys(&mut conns[0], session);
                keys.sort();
                let mut want: Vec<String> = (0..2)
                    .flat_map(|c| (0..ROUNDS).map(move |i| format!("{session}-c{c}-k{i:03}")))
                    .collect();
                want.sort();
                assert_eq!(keys, want, "session {session}");
            });
        }
    });
}

#[test]
fn an_overlong_session_id_is_refused_by_a_session_affine_router_only() {
    let b = common::Broker::start(&["--shards", "2"]);
    let long: &'static str = Box::leak("s".repeat(257).into_boxed_str());
    let mut c = b.connect();
    let r = c.call("list", &[], Some(long));
    assert_eq!(
        error_code(&r),
        Some(mcp_schema::ErrorCode::InvalidRequest.code())
    );
    assert_eq!(tool_text(&c.call("echo", &[], Some(long))), "{}");
    let ok: &'static str = Box::leak("s".repeat(256).into_boxed_str());
    assert_eq!(tool_text(&c.call("list", &[], Some(ok))), "");
}

async fn grpc_client(b: &grpc_harness::Broker) -> McpServiceClient<Channel> {
    let ch = Channel::from_shared(b.uri())
        .unwrap()
        .connect()
        .await
        .expect("connecting to the gRPC edge");
    McpServiceClient::new(ch)
}

async fn grpc_session(c: &mut McpServiceClient<Channel>) -> String {
    let r = c
        .initialize(pb::InitializeRequest {
            protocol_version: "2025-06-18".into(),
            capabilities: Some(pb::ClientCapabilities::default()),
            client_info: Some(pb::Implementation {
                name: "affinity-test".into(),
                version: "1".into(),
                ..Default::default()
            }),
        })
        .await
        .unwrap();
    let s = r.metadata().get(mcp_proto::SESSION_METADATA_KEY).unwrap();
    s.to_str().unwrap().to_string()
}

async fn grpc_call(
    c: &mut McpServiceClient<Channel>,
    session: &str,
    tool: &str,
    args: String,
) -> String {
    let mut r = Request::new(pb::CallToolRequest {
        name: tool.into(),
        arguments: Some(args.into_bytes()),
    });
    r.metadata_mut()
        .insert(mcp_proto::SESSION_METADATA_KEY, session.parse().unwrap());
    let r = c.call_tool(r).await.unwrap().into_inner();
    assert_ne!(r.is_error, Some(true), "{tool}: {r:?}");
    // The first block is the router's text (the edge may add the structured
    // content as a second one).
    match r.content.first().and_then(|c| c.content.as_ref()) {
        Some(pb::content::Content::Text(t)) => t.text.clone(),
        other => panic!("{tool}: the first block is not text: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_sessions_concurrent_calls_and_its_frame_calls_share_one_instance() {
    let b = grpc_harness::Broker::start();
    let c = grpc_client(&b).await;
    const SESSIONS: usize = 4;
    const KEYS: usize = 40;
    let mut sessions = Vec::new();
    for _ in 0..SESSIONS {
        sessions.push(grpc_session(&mut c.clone()).await);
    }
    // Every session's keys at once, each a put then a get: concurrent calls
    // of one session and of sessions sharing an owner shard.
    let mut tasks = tokio::task::JoinSet::new();
    for s in &sessions {
        for i in 0..KEYS {
            let (mut c, s) = (c.clone(), s.clone());
            tasks.spawn(async move {
                let value = format!("\"{s}-{i}\"");
                let put = format!(r#"{{"key":"g{i:03}","value":{value}}}"#);
                assert_eq!(
                    grpc_call(&mut c, &s, "put", put).await,
                    format!("stored g{i:03}")
                );
                let get = format!(r#"{{"key":"g{i:03}"}}"#);
                assert_eq!(
                    grpc_call(&mut c, &s, "get", get).await,
                    value,
                    "session {s}"
                );
            });
        }
    }
    while let Some(r) = tasks.join_next().await {
        r.expect("a session's put/get task");
    }
    // The frame edge reaches the same instance with the same session id.
    let frames = b.frames;
    let first = sessions[0].clone();
    tokio::task::spawn_blocking(move || {
        let session: &'static str = Box::leak(first.into_boxed_str());
        let mut f = Client::connect(frames);
        let r = f.call(
            "put",
            &[("key", "\"from-frames\""), ("value", "true")],
            Some(session),
        );
        assert_eq!(tool_text(&r), "stored from-frames");
        let r = f.call("get", &[("key", "\"g000\"")], Some(session));
        assert_eq!(tool_text(&r), format!("\"{session}-0\""));
    })
    .await
    .unwrap();
    for (n, s) in sessions.iter().enumerate() {
        let listed = grpc_call(&mut c.clone(), s, "list", "{}".into()).await;
        let mut want: Vec<String> = (0..KEYS).map(|i| format!("g{i:03}")).collect();
        if n == 0 {
            want.insert(0, "from-frames".into());
        }
        assert_eq!(listed, want.join("\n"), "session {s}");
    }
}

/// A frame request handed to its session's owner shard is in flight once:
/// on its connection's shard (both shards counted it: 8 calls read 12).
#[test]
fn a_handed_off_frame_call_is_in_flight_once() {
    let cfg = "[broker]\nshards = 2\n\n[[routers]]\nname = \"chaos\"\nwasm = \"chaos.wasm\"\naffinity = \"session\"\n";
    let b = common::Broker::start_with_config(cfg, &[]);
    assert_eq!(b.shards, 2);
    // Eight sessions, each on a connection of its own: the kernel spreads
    // the connections and the ids' hash the owners, so some calls cross.
    let mut conns: Vec<Client> = (0..8).map(|_| Client::connect(b.frames)).collect();
    for (i, c) in conns.iter_mut().enumerate() {
        let session: &'static str = Box::leak(format!("inflight-{i}").into_boxed_str());
        let (_, f) = c.tool_call_frame("sleep", &[("ms", "1500")], Some(session));
        c.send_raw(&f);
    }
    let in_flight = || b.metric_sum("mcp_in_flight_requests");
    assert!(
        common::http::eventually(std::time::Duration::from_secs(5), || in_flight() >= 8.0),
        "{} in flight",
        in_flight()
    );
    assert_eq!(in_flight(), 8.0);
    for c in &mut conns {
        assert!(tool_text(&c.read_final()).starts_with("slept"));
    }
    assert_eq!(in_flight(), 0.0);
}
