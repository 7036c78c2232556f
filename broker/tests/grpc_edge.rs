//! The gRPC edge against the real `mcp-broker` binary: every RPC of
//! `turbomcp.mcp.v1.McpService` from a tonic client, the status-code
//! mapping, limits, health, reflection, gzip and drain.
//!
//! Needs the bundled routers (`scripts/build-routers`).

mod grpc_harness;

use std::time::Duration;

use grpc_harness::Broker;
use mcp_proto::v1 as pb;
use mcp_proto::v1::mcp_service_client::McpServiceClient;
use tonic::codec::CompressionEncoding;
use tonic::transport::Channel;
use tonic::{Code, Request};

async fn channel(b: &Broker) -> Channel {
    Channel::from_shared(b.uri())
        .unwrap()
        .connect()
        .await
        .expect("connecting to the gRPC edge")
}

async fn client(b: &Broker) -> McpServiceClient<Channel> {
    McpServiceClient::new(channel(b).await)
}

fn with_session<T>(msg: T, session: &str) -> Request<T> {
    let mut r = Request::new(msg);
    r.metadata_mut()
        .insert(mcp_proto::SESSION_METADATA_KEY, session.parse().unwrap());
    r
}

fn call(name: &str, args: &str) -> pb::CallToolRequest {
    pb::CallToolRequest {
        name: name.into(),
        arguments: Some(args.as_bytes().to_vec()),
    }
}

fn texts(r: &pb::CallToolResult) -> Vec<String> {
    r.content
        .iter()
        .filter_map(|c| match &c.content {
            Some(pb::content::Content::Text(t)) => Some(t.text.clone()),
            _ => None,
        })
        .collect()
}

async fn initialize(c: &mut McpServiceClient<Channel>) -> (pb::InitializeResult, String) {
    let r = c
        .initialize(pb::InitializeRequest {
            protocol_version: "2025-06-18".into(),
            capabilities: Some(pb::ClientCapabilities::default()),
            client_info: Some(pb::Implementation {
                name: "grpc-test".into(),
                version: "1".into(),
                ..Default::default()
            }),
        })
        .await
        .unwrap();
    let session = r
        .metadata()
        .get(mcp_proto::SESSION_METADATA_KEY)
        .expect("session id in metadata");
    let session = session.to_str().unwrap().to_string();
    (r.into_inner(), session)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rpc_answers_from_the_routers_through_the_shards() {
    let b = Broker::start_with_config(|c| {
        c.replace(
            "roots = []",
            r#"roots = [{ uri = "file:///srv/data", name = "data" }]"#,
        )
    });
    let mut c = client(&b).await;

    // Initialize: negotiation, capabilities, a session id.
    let (init, session) = initialize(&mut c).await;
    assert_eq!(init.protocol_version, "2025-06-18");
    let caps = init.capabilities.unwrap();
    assert!(
        caps.tools.is_some()
            && caps.resources.is_some()
            && caps.prompts.is_some()
            && caps.logging.is_some()
    );
    assert_eq!(init.server_info.unwrap().name, "mcp-broker");
    let (newer, _) = {
        let r = c
            .initialize(pb::InitializeRequest {
                protocol_version: "2099-01-01".into(),
                ..Default::default()
            })
            .await
            .unwrap();
        (r.into_inner(), ())
    };
    assert_eq!(
        newer.protocol_version, "2025-06-18",
        "an unknown version negotiates to the latest supported"
    );

    c.ping(pb::PingRequest {}).await.unwrap();

    // Listings, with cursors: the whole list fits one page, so no next
    // cursor; a bad cursor is INVALID_ARGUMENT.
    let tools = c
        .list_tools(pb::ListToolsRequest { cursor: None })
        .await
        .unwrap()
        .into_inner();
    let names: Vec<_> = tools.tools.iter().map(|t| t.name.as_str()).collect();
    for want in ["echo", "put", "get", "trap", "sleep"] {
        assert!(names.contains(&want), "{want} missing from {names:?}");
    }
    assert!(
        tools
            .tools
            .iter()
            .all(|t| serde_json::from_slice::<serde_json::Value>(&t.input_schema).is_ok())
    );
    assert_eq!(tools.next_cursor, None);
    let bad = c
        .list_tools(pb::ListToolsRequest {
            cursor: Some("nonsense".into()),
        })
        .await
        .unwrap_err();
    assert_eq!(bad.code(), Code::InvalidArgument);
    let resources = c
        .list_resources(pb::ListResourcesRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(!resources.resources.is_empty());
    let templates = c
        .list_resource_templates(pb::ListResourceTemplatesRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(
        templates
            .resource_templates
            .iter()
            .any(|t| t.uri_template.contains('{')),
        "{templates:?}"
    );
    let prompts = c
        .list_prompts(pb::ListPromptsRequest::default())
        .await
        .unwrap()
        .into_inner();
    let prompt = prompts
        .prompts
        .iter()
        .find(|p| !p.arguments.is_empty())
        .expect("a prompt with arguments")
        .clone();

    // CallTool: arguments reach the router exactly; structured content is
    // carried as text; is_error preserved.
    let r = c
        .call_tool(call("echo", r#"{"text":"hello","n":1.50}"#))
        .await
        .unwrap();
    // Progress reaches only a session's Subscribe streams: no token
    // without a session (see the session's calls below).
    assert!(r.metadata().get("mcp-progress-token").is_none());
    let r = r.into_inner();
    assert_eq!(r.is_error, Some(false));
    let all = texts(&r).join("\n");
    assert!(all.contains("\"hello\"") && all.contains("1.50"), "{all}");
    let r = c.call_tool(call("fail", "{}")).await.unwrap().into_inner();
    assert_eq!(r.is_error, Some(true), "{r:?}");

    // Session affinity: the kv router keeps state per instance, and a
    // session's calls all go to its owning shard.
    let put = with_session(call("put", r#"{"key":"k","value":"v1"}"#), &session);
    let put = c.call_tool(put).await.unwrap();
    assert!(put.metadata().get("mcp-progress-token").is_some());
    let got = c
        .call_tool(with_session(call("get", r#"{"key":"k"}"#), &session))
        .await
        .unwrap()
        .into_inner();
    assert!(texts(&got).join("").contains("v1"), "{got:?}");

    // ReadResource.
    let uri = resources.resources[0].uri.clone();
    let read = c
        .read_resource(pb::ReadResourceRequest { uri: uri.clone() })
        .await
        .unwrap()
        .into_inner();
    assert!(
        !read.contents.is_empty() && read.contents[0].content.is_some(),
        "{read:?}"
    );

    // GetPrompt with arguments.
    let args: serde_json::Map<String, serde_json::Value> = prompt
        .arguments
        .iter()
        .map(|a| {
            (
                a.name.clone(),
                serde_json::Value::String(format!("ARG-{}", a.name)),
            )
        })
        .collect();
    let got = c
        .get_prompt(pb::GetPromptRequest {
            name: prompt.name.clone(),
            arguments: Some(serde_json::to_vec(&args).unwrap()),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!got.messages.is_empty());
    let body = format!("{got:?}");
    assert!(body.contains("ARG-"), "arguments were substituted: {body}");

    // Complete a prompt argument.
    let done = c
        .complete(pb::CompleteRequest {
            r#ref: Some(pb::CompletionReference {
                reference: Some(pb::completion_reference::Reference::Prompt(
                    pb::PromptReference {
                        name: prompt.name.clone(),
                    },
                )),
            }),
            argument: Some(pb::CompletionArgument {
                name: prompt.arguments[0].name.clone(),
                value: String::new(),
            }),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(done.completion.is_some());

    // SetLoggingLevel: per session, or (without one) per connection.
    c.set_logging_level(pb::SetLoggingLevelRequest {
        level: pb::LogLevel::Debug as i32,
    })
    .await
    .unwrap();
    let lvl = pb::SetLoggingLevelRequest {
        level: pb::LogLevel::Info as i32,
    };
    c.set_logging_level(with_session(lvl, &session))
        .await
        .unwrap();

    // ListRoots: the operator's roots.
    let roots = c
        .list_roots(pb::ListRootsRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        roots.roots,
        [pb::Root {
            uri: "file:///srv/data".into(),
            name: Some("data".into())
        }]
    );

    // Client capabilities: UNIMPLEMENTED, saying why.
    let e = c
        .create_sampling_message(pb::CreateSamplingMessageRequest::default())
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unimplemented);
    assert!(e.message().contains("client capability"));
    assert_eq!(e.metadata().get("mcp-error-code").unwrap(), "-32601");
    let e = c.elicit(pb::ElicitRequest::default()).await.unwrap_err();
    assert_eq!(e.code(), Code::Unimplemented);
    assert_eq!(e.metadata().get("mcp-error-code").unwrap(), "-32601");
    // Like every RPC, they check the session first.
    let e = c
        .elicit(with_session(pb::ElicitRequest::default(), "never-issued"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    let e = c
        .create_sampling_message(with_session(
            pb::CreateSamplingMessageRequest::default(),
            "never-issued",
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    let el = c
        .call_tool(call("elicit", "{}"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(el.is_error, Some(true));
    assert!(texts(&el)[0].contains("elicitation"));

    // Subscribe: a session's log subscriber hears about its own failed
    // calls only. Session A's trap comes first, then B's panic: B's first
    // notification must be its own.
    let (_, other) = initialize(&mut c).await;
    let sub = |s: &str| {
        with_session(
            pb::SubscribeRequest {
                topics: vec!["log".into()],
            },
            s,
        )
    };
    let mut a_stream = c.subscribe(sub(&session)).await.unwrap().into_inner();
    let mut b_stream = c.subscribe(sub(&other)).await.unwrap().into_inner();
    let e = c
        .call_tool(with_session(call("trap", "{}"), &session))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Internal);
    let e = c
        .call_tool(with_session(call("panic", "{}"), &other))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Internal);
    let first_a = tokio::time::timeout(Duration::from_secs(10), a_stream.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let first_b = tokio::time::timeout(Duration::from_secs(10), b_stream.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let msg = |n: &pb::Notification| match &n.notification {
        Some(pb::notification::Notification::Log(l)) => l.message.clone(),
        other => panic!("expected a log notification, got {other:?}"),
    };
    assert!(msg(&first_a).contains("`trap`"), "{first_a:?}");
    assert!(msg(&first_b).contains("`panic`"), "{first_b:?}");
    // Both streams are counted open; one the client drops is not.
    assert_eq!(b.metric("mcp_grpc_subscriptions_open", ""), 2.0);
    drop(a_stream);
    assert!(
        eventually(Duration::from_secs(5), || {
            b.metric("mcp_grpc_subscriptions_open", "") == 1.0
        })
        .await
    );
    // An unknown topic and an unserved resource topic are refused.
    let e = c
        .subscribe(pb::SubscribeRequest {
            topics: vec!["bogus".into()],
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    let e = c
        .subscribe(pb::SubscribeRequest {
            topics: vec!["nope://x".into()],
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    let ok = c
        .subscribe(pb::SubscribeRequest { topics: vec![uri] })
        .await;
    assert!(ok.is_ok(), "{ok:?}");
}

/// A resource topic gets the updates a router tells for that URI (the kv
/// router on `put`), from a call on another connection; another URI's
/// subscriber gets none of them.
/// Initialize ignores any session id it carries (proto/README), a broken
/// one included; a not-found message copying a huge unknown name is cut,
/// so that its status still fits a client's trailer limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn initialize_ignores_a_session_id_and_long_errors_still_arrive() {
    let b = Broker::start();
    let mut c = client(&b).await;
    for bad in ["", &"s".repeat(300)] {
        let mut req = tonic::Request::new(pb::InitializeRequest {
            protocol_version: "2025-06-18".into(),
            capabilities: Some(pb::ClientCapabilities::default()),
            client_info: None,
        });
        req.metadata_mut()
            .insert(mcp_proto::SESSION_METADATA_KEY, bad.parse().unwrap());
        let r = c
            .initialize(req)
            .await
            .expect("initialize with a stray session id");
        assert!(r.metadata().get(mcp_proto::SESSION_METADATA_KEY).is_some());
    }
    let name = "工".repeat(2000);
    let e = c.call_tool(call(&name, "{}")).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");
}

/// A call's metadata is bounded at 16 KiB (proto/README.md, Connections):
/// one past it is refused with HTTP 431 before it reaches the broker, and
/// the connection serves the next call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_over_16_kib_is_refused_and_the_connection_goes_on() {
    let b = Broker::start();
    let mut c = client(&b).await;
    let mut big = Request::new(call("echo_text", r#"{"text":"x"}"#));
    big.metadata_mut()
        .insert("x-big", "v".repeat(17 << 10).parse().unwrap());
    let e = c.call_tool(big).await.unwrap_err();
    assert_eq!(e.code(), Code::Unknown, "{e:?}");
    assert!(e.message().contains("431"), "{e:?}");
    let mut fits = Request::new(call("echo_text", r#"{"text":"after"}"#));
    fits.metadata_mut()
        .insert("x-big", "v".repeat(8 << 10).parse().unwrap());
    let r = c.call_tool(fits).await.unwrap().into_inner();
    assert_eq!(texts(&r), ["after"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resource_topic_gets_the_updates_its_router_tells() {
    let b = Broker::start();
    let mut c = client(&b).await;
    let topic = |uri: &str| pb::SubscribeRequest {
        topics: vec![uri.into()],
    };
    let mut color = c.subscribe(topic("kv://color")).await.unwrap().into_inner();
    let mut other = c.subscribe(topic("kv://other")).await.unwrap().into_inner();
    let mut writer = client(&b).await;
    for key in ["color", "other"] {
        let r = writer
            .call_tool(call("put", &format!(r#"{{"key":"{key}","value":1}}"#)))
            .await
            .unwrap()
            .into_inner();
        assert_ne!(r.is_error, Some(true), "{r:?}");
    }
    let next = |n: Option<pb::Notification>| match n.and_then(|n| n.notification) {
        Some(pb::notification::Notification::ResourceUpdated(u)) => u.uri,
        other => panic!("expected resources/updated, got {other:?}"),
    };
    let within = Duration::from_secs(10);
    let n = tokio::time::timeout(within, color.message())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(next(n), "kv://color");
    // The other subscriber's first update is its own URI, written second.
    let n = tokio::time::timeout(within, other.message())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(next(n), "kv://other");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn router_and_input_errors_map_to_grpc_status_codes() {
    let b = Broker::start();
    let mut c = client(&b).await;
    let code_of = |s: &tonic::Status| {
        s.metadata()
            .get("mcp-error-code")
            .map(|v| v.to_str().unwrap().to_string())
    };

    let e = c.call_tool(call("no_such_tool", "{}")).await.unwrap_err();
    assert_eq!(
        (e.code(), code_of(&e).as_deref()),
        (Code::NotFound, Some("-32601"))
    );
    let e = c
        .read_resource(pb::ReadResourceRequest {
            uri: "nope://x".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    let e = c
        .get_prompt(pb::GetPromptRequest {
            name: "no_such_prompt".into(),
            arguments: None,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);

    // Malformed arguments: not JSON, not an object, or refused by the router.
    for bad in ["{not json", "[1,2]"] {
        let e = c.call_tool(call("echo", bad)).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{bad}: {e:?}");
    }
    let e = c
        .call_tool(call("sleep", r#"{"ms":"soon"}"#))
        .await
        .unwrap_err();
    assert_eq!(
        (e.code(), code_of(&e).as_deref()),
        (Code::InvalidArgument, Some("-32602"))
    );
    let e = c.call_tool(call("", "{}")).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    let e = c
        .complete(pb::CompleteRequest::default())
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);

    // Router faults: INTERNAL with a message.
    let e = c.call_tool(call("trap", "{}")).await.unwrap_err();
    assert_eq!(
        (e.code(), code_of(&e).as_deref()),
        (Code::Internal, Some("-32002"))
    );
    assert!(e.message().contains("router fault"), "{e:?}");

    // The client's deadline is the call's deadline: a 2 s spin or sleep
    // with a 300 ms grpc-timeout ends as DEADLINE_EXCEEDED from the broker,
    // well before the router's own 2 s deadline, and is counted so. A
    // sleeping router is still waiting when the edge's timer fires, and the
    // edge answers for it: that answer was once missing from the metrics.
    // The broker answers 20 ms early; tonic's client also times the call,
    // and on a starved machine (three test binaries on the two CPUs) its
    // own timer fired first, which it reports as CANCELLED ("Timeout
    // expired"). The metrics then still show the broker's verdict.
    let deadlines = || b.metric("mcp_requests_total", "outcome=\"deadline_exceeded\"");
    // Both calls are router calls too, though the sleep's was cut short
    // when the edge answered for it (its future dropped mid-call).
    let timed = || b.metric("mcp_wasm_call_duration_seconds_count", r#"router="chaos""#);
    for tool in ["spin", "sleep"] {
        let before = deadlines();
        let timed_before = timed();
        let mut r = Request::new(call(tool, r#"{"ms":2000}"#));
        r.set_timeout(Duration::from_millis(300));
        let t = std::time::Instant::now();
        let e = c.call_tool(r).await.unwrap_err();
        let took = t.elapsed();
        assert!(
            e.code() == Code::DeadlineExceeded
                || (e.code() == Code::Cancelled && e.message() == "Timeout expired"),
            "{tool}: {e:?}"
        );
        assert!(took < Duration::from_millis(1500), "{tool}: {took:?}");
        eventually(Duration::from_secs(5), || deadlines() >= before + 1.0).await;
        assert_eq!(
            deadlines(),
            before + 1.0,
            "{tool}: counted as deadline_exceeded in mcp_requests_total"
        );
        assert!(
            eventually(Duration::from_secs(5), || timed() >= timed_before + 1.0).await,
            "{tool}: missing from mcp_wasm_call_duration_seconds"
        );
    }
    // And the edge still serves.
    c.ping(pb::PingRequest {}).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_answered_while_the_owner_shard_is_busy_is_counted_once() {
    // A gRPC session belongs to its connection, and its calls run on its
    // owner shard, which may be another shard than the connection's. While
    // the owner is too busy to turn to its inbox (here: an `echo` of the
    // session stalls its thread for 3 s, by the debug build's fault
    // injection), a call of the session waits there, and the connection's
    // shard answers it DEADLINE_EXCEEDED at its deadline. That answer was
    // once missing from the metrics: the owner picked the call up after the
    // stall and, timing it from then, judged that no deadline had passed.
    let b = Broker::start_with_chaos_env(|c| c, &[("MCP_BROKER_TEST_STALL_TOOL", "echo:3000")]);
    let c = client(&b).await;
    let chaos = || b.metric("mcp_requests_total", r#"router="chaos""#);
    let deadlines = || b.metric("mcp_requests_total", r#"outcome="deadline_exceeded""#);
    let in_flight = || b.metric("mcp_in_flight_requests", "");
    let ran = || b.metric("mcp_router_calls_total", r#"router="chaos""#);
    let (chaos_before, deadlines_before, ran_before) = (chaos(), deadlines(), ran());

    // Sessions are spread over the two shards by their ids: stall one after
    // another until the connection still answers a ping meanwhile, i.e.
    // until the stalled owner is not the connection's shard.
    let mut found = None;
    for _ in 0..12 {
        let (_, session) = initialize(&mut c.clone()).await;
        let mut staller = c.clone();
        let s = session.clone();
        let stall = tokio::spawn(async move {
            staller
                .call_tool(with_session(call("echo", "{}"), &s))
                .await
        });
        assert!(
            eventually(Duration::from_secs(2), || in_flight() >= 1.0).await,
            "the stalled call reached its shard"
        );
        let mut pinger = c.clone();
        let ping = pinger.ping(pb::PingRequest {});
        if tokio::time::timeout(Duration::from_millis(300), ping)
            .await
            .is_ok()
        {
            found = Some((session, stall));
            break;
        }
        stall.await.unwrap().expect("the stalled echo completes");
    }
    let (session, stall) =
        found.expect("12 sessions, none owned by another shard than the connection's");

    let mut r = with_session(call("sleep", r#"{"ms":1}"#), &session);
    r.set_timeout(Duration::from_millis(300));
    let e = c.clone().call_tool(r).await.unwrap_err();
    // Or tonic's own timer, if it fired first on a starved machine (see
    // `router_and_input_errors_map_to_grpc_status_codes`).
    assert!(
        e.code() == Code::DeadlineExceeded
            || (e.code() == Code::Cancelled && e.message() == "Timeout expired"),
        "{e:?}"
    );
    assert!(
        !stall.is_finished(),
        "the owner turned to its inbox before the deadline: the stall ended early"
    );
    stall.await.unwrap().expect("the stalled echo completes");

    // The call counted once, as the deadline its client got, once the
    // owner turns to its inbox; and not run then, for nobody.
    assert!(
        eventually(Duration::from_secs(5), || deadlines()
            >= deadlines_before + 1.0)
        .await,
        "the edge's DEADLINE_EXCEEDED is not counted"
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(deadlines(), deadlines_before + 1.0, "counted once");
    assert_eq!(chaos(), chaos_before + 1.0, "the call counted once");
    assert_eq!(
        ran(),
        ran_before,
        "the call ran after its client had its answer"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_refuse_with_resource_exhausted_and_subscriptions_end_with_the_client() {
    let b = Broker::start_with_config(|c| {
        c.replace(
            "max_concurrent_requests = 1024",
            "max_concurrent_requests = 1",
        )
        .replace("max_subscribers = 1024", "max_subscribers = 1")
        .replace("max_message_bytes = 4194304", "max_message_bytes = 65536")
    });
    let mut c = client(&b).await;

    // One call in flight (a 1.5 s sleep; chaos's deadline is 2 s) fills the
    // edge: the next is refused at once. The pings start once the sleep has
    // had time to arrive; if a ping still got the slot first (a loaded
    // machine), the sleep was the refused one and the round is repeated.
    // Both loops are bounded.
    let mut outcome = None;
    for _ in 0..5 {
        let mut slow = c.clone();
        let held =
            tokio::spawn(async move { slow.call_tool(call("sleep", r#"{"ms":1500}"#)).await });
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut refused = None;
        for _ in 0..2000 {
            match c.ping(pb::PingRequest {}).await {
                Err(e) if e.code() == Code::ResourceExhausted => {
                    refused = Some(e);
                    break;
                }
                _ => tokio::task::yield_now().await,
            }
        }
        match held.await.unwrap() {
            Err(e) if e.code() == Code::ResourceExhausted => continue,
            held => {
                outcome = Some((refused, held));
                break;
            }
        }
    }
    let (refused, held) = outcome.expect("the sleep got the edge's one slot in 5 rounds");
    let e = refused.expect("the second concurrent call is refused");
    assert_eq!(e.metadata().get("mcp-error-code").unwrap(), "-32000");
    assert!(held.is_ok(), "{held:?}");

    // Messages over max_message_bytes are refused.
    let big = format!(r#"{{"text":"{}"}}"#, "x".repeat(100_000));
    let e = c.call_tool(call("echo", &big)).await.unwrap_err();
    assert_eq!(e.code(), Code::OutOfRange, "{e:?}");

    // One subscriber allowed; when its client goes away the slot frees.
    let s1 = c
        .subscribe(pb::SubscribeRequest::default())
        .await
        .unwrap()
        .into_inner();
    let e = c
        .subscribe(pb::SubscribeRequest::default())
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted);
    drop(s1);
    let mut again = None;
    for _ in 0..500 {
        match c.subscribe(pb::SubscribeRequest::default()).await {
            Ok(s) => {
                again = Some(s);
                break;
            }
            Err(e) if e.code() == Code::ResourceExhausted => {
                tokio::time::sleep(Duration::from_millis(10)).await
            }
            Err(e) => panic!("{e:?}"),
        }
    }
    assert!(again.is_some(), "the cancelled subscription was removed");
}

/// The MCP service's calls skip tonic's router (`edge/grpc/conn.rs`):
/// what neither it nor the router serves is still UNIMPLEMENTED, whichever
/// way it went, and the connection serves on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn methods_and_services_not_served_are_unimplemented_on_either_path() {
    use tonic::codegen::http::uri::PathAndQuery;
    let b = Broker::start();
    let ch = channel(&b).await;
    for path in [
        // Past the router: the MCP service's own answer.
        "/turbomcp.mcp.v1.McpService/NoSuchMethod",
        "/turbomcp.mcp.v1.McpService/",
        // Through the router: its fallback, or the health service's answer.
        "/turbomcp.mcp.v1.NoSuchService/CallTool",
        "/grpc.health.v1.Health/NoSuchMethod",
        "/no.such.Service/Call",
    ] {
        let mut grpc = tonic::client::Grpc::new(ch.clone());
        grpc.ready().await.unwrap();
        let codec = tonic_prost::ProstCodec::<(), ()>::default();
        let e = grpc
            .unary(Request::new(()), PathAndQuery::from_static(path), codec)
            .await
            .expect_err(path);
        assert_eq!(e.code(), Code::Unimplemented, "{path}: {e:?}");
    }
    let mut c = McpServiceClient::new(ch);
    let r = c
        .call_tool(call("echo", r#"{"text":"still"}"#))
        .await
        .unwrap();
    assert_eq!(texts(r.get_ref()), [r#"{"text":"still"}"#]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_reflection_and_gzip_then_drain_flips_health_and_closes_streams() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;

    let b = Broker::start();
    let ch = channel(&b).await;
    let mut health = HealthClient::new(ch.clone());
    for service in ["", mcp_proto::SERVICE_NAME] {
        let r = health
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.status(), ServingStatus::Serving, "{service:?}");
    }

    // Reflection: list the services, then fetch the file declaring ours.
    let mut refl = ServerReflectionClient::new(ch.clone());
    let reqs = vec![
        ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::ListServices(String::new())),
        },
        ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::FileContainingSymbol(
                mcp_proto::SERVICE_NAME.into(),
            )),
        },
    ];
    let mut answers = refl
        .server_reflection_info(tokio_stream_iter(reqs))
        .await
        .unwrap()
        .into_inner();
    let Some(MessageResponse::ListServicesResponse(list)) =
        answers.message().await.unwrap().unwrap().message_response
    else {
        panic!("expected a service list")
    };
    let services: Vec<_> = list.service.iter().map(|s| s.name.as_str()).collect();
    assert!(services.contains(&mcp_proto::SERVICE_NAME), "{services:?}");
    assert!(services.contains(&"grpc.health.v1.Health"), "{services:?}");
    let Some(MessageResponse::FileDescriptorResponse(fd)) =
        answers.message().await.unwrap().unwrap().message_response
    else {
        panic!("expected a file descriptor")
    };
    let file = <prost_types_like::FileDescriptorProto as prost::Message>::decode(
        &fd.file_descriptor_proto[0][..],
    )
    .unwrap();
    assert_eq!(file.package.as_deref(), Some("turbomcp.mcp.v1"));

    // gzip both ways.
    let mut gz = McpServiceClient::new(ch.clone())
        .send_compressed(CompressionEncoding::Gzip)
        .accept_compressed(CompressionEncoding::Gzip);
    let r = gz
        .call_tool(call(
            "echo",
            &format!(r#"{{"text":"{}"}}"#, "z".repeat(4096)),
        ))
        .await
        .unwrap();
    assert!(texts(r.get_ref()).join("").contains("zzzz"));

    // Drain: an open subscription ends cleanly; health says NOT_SERVING
    // while the broker finishes; the process exits 0.
    let mut stream = gz
        .subscribe(pb::SubscribeRequest::default())
        .await
        .unwrap()
        .into_inner();
    b.terminate();
    let end = tokio::time::timeout(Duration::from_secs(20), stream.message())
        .await
        .expect("stream ends on drain");
    assert!(matches!(end, Ok(None)), "clean end of stream, got {end:?}");
    let status = exit_status(b).await;
    assert!(status.success(), "{status:?}");
}

/// gRPC client-side health checking keeps a Watch open on each connection:
/// at the drain it gets NOT_SERVING, then its stream ends cleanly once no
/// call is left, and the broker exits without waiting for the drain's
/// deadline (set far beyond the test's bound, 120 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_health_watch_does_not_hold_the_drain() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    let b = Broker::start_with_config(|c| {
        c.replace("drain_timeout = \"10s\"", "drain_timeout = \"120s\"")
    });
    let mut health = HealthClient::new(channel(&b).await);
    let mut watch = health
        .watch(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    let first = watch.message().await.unwrap().unwrap();
    assert_eq!(first.status(), ServingStatus::Serving);
    b.terminate();
    let within = Duration::from_secs(60);
    let next = tokio::time::timeout(within, watch.message())
        .await
        .expect("NOT_SERVING at the drain")
        .unwrap()
        .unwrap();
    assert_eq!(next.status(), ServingStatus::NotServing);
    let end = tokio::time::timeout(within, watch.message())
        .await
        .expect("the watch ends before the drain's deadline");
    assert!(matches!(end, Ok(None)), "a clean end, got {end:?}");
    let status = exit_status(b).await;
    assert!(status.success(), "{status:?}");
}

/// How a terminated broker exited, waited for off the runtime.
async fn exit_status(mut b: Broker) -> std::process::ExitStatus {
    tokio::task::spawn_blocking(move || {
        let s = b.child.wait().unwrap();
        drop(b);
        s
    })
    .await
    .unwrap()
}

/// Polls `cond` every 20 ms until it holds or `within` passes.
async fn eventually(within: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let until = std::time::Instant::now() + within;
    while std::time::Instant::now() < until {
        if cond() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cond()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_is_unguessable_and_unknown_to_every_other_connection() {
    let b = Broker::start();
    // Two channels: two HTTP/2 connections, two callers.
    let mut mine = client(&b).await;
    let mut other = client(&b).await;
    let (_, session) = initialize(&mut mine).await;
    let (_, second) = initialize(&mut mine).await;
    // 128 random bits: 32 hex digits, no shared prefix or counter.
    for s in [&session, &second] {
        assert_eq!(s.len(), 32, "{s}");
        assert!(s.bytes().all(|c| c.is_ascii_hexdigit()), "{s}");
    }
    assert_ne!(session[..8], second[..8], "{session} {second}");

    let echo = || call("echo", r#"{"text":"x"}"#);
    mine.call_tool(with_session(echo(), &session))
        .await
        .unwrap();
    // Another connection presenting it: unknown, on every kind of call.
    let unknown = |e: tonic::Status| {
        assert_eq!(e.code(), Code::NotFound, "{e:?}");
        assert!(e.message().contains("mcp-session-id"), "{e:?}");
    };
    unknown(
        other
            .call_tool(with_session(echo(), &session))
            .await
            .unwrap_err(),
    );
    unknown(
        other
            .subscribe(with_session(pb::SubscribeRequest::default(), &session))
            .await
            .unwrap_err(),
    );
    let lvl = pb::SetLoggingLevelRequest {
        level: pb::LogLevel::Emergency as i32,
    };
    unknown(
        other
            .set_logging_level(with_session(lvl, &session))
            .await
            .unwrap_err(),
    );
    unknown(
        other
            .ping(with_session(pb::PingRequest {}, &session))
            .await
            .unwrap_err(),
    );
    // An id that was never issued is unknown to its caller too.
    unknown(
        mine.call_tool(with_session(echo(), "0123456789abcdef0123456789abcdef"))
            .await
            .unwrap_err(),
    );
    unknown(
        mine.call_tool(with_session(echo(), "my-own-session"))
            .await
            .unwrap_err(),
    );
    // The owner still has it, its notifications included.
    let mut stream = mine
        .subscribe(with_session(
            pb::SubscribeRequest {
                topics: vec!["log".into()],
            },
            &session,
        ))
        .await
        .unwrap()
        .into_inner();
    mine.call_tool(with_session(call("trap", "{}"), &session))
        .await
        .unwrap_err();
    let n = tokio::time::timeout(Duration::from_secs(10), stream.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(format!("{n:?}").contains("`trap`"), "{n:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_are_bounded_and_expire_when_idle() {
    let b = Broker::start_with_config(|c| {
        c.replace("max_sessions = 100000", "max_sessions = 2")
            .replace(
                r#"session_idle_timeout = "30m""#,
                r#"session_idle_timeout = "1s""#,
            )
    });
    let mut c = client(&b).await;
    let (_, first) = initialize(&mut c).await;
    initialize(&mut c).await;
    assert_eq!(b.metric("mcp_grpc_sessions", ""), 2.0);
    let e = c
        .initialize(pb::InitializeRequest::default())
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert_eq!(e.metadata().get("mcp-error-code").unwrap(), "-32000");
    // Once the two have idled out, there is room again, and the old ids
    // are gone.
    let until = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        match c.initialize(pb::InitializeRequest::default()).await {
            Ok(_) => break,
            Err(e) if e.code() == Code::ResourceExhausted => {
                assert!(std::time::Instant::now() < until, "sessions never expired");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("{e:?}"),
        }
    }
    let e = c
        .ping(with_session(pb::PingRequest {}, &first))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_logging_level_without_a_session_sets_the_level_of_the_connection() {
    let b = Broker::start_with_chaos(|c| c);
    let mut c = client(&b).await;
    // A client that knows only the proto: no session metadata.
    c.set_logging_level(pb::SetLoggingLevelRequest {
        level: pb::LogLevel::Error as i32,
    })
    .await
    .expect("SetLoggingLevel without a session succeeds");
    // It is the default of this connection's sessions: a deadline (a
    // WARNING) is filtered out, a router fault (an ERROR) is delivered.
    let (_, session) = initialize(&mut c).await;
    let mut stream = c
        .subscribe(with_session(
            pb::SubscribeRequest {
                topics: vec!["log".into()],
            },
            &session,
        ))
        .await
        .unwrap()
        .into_inner();
    let mut late = with_session(call("sleep", r#"{"ms":1000}"#), &session);
    late.set_timeout(Duration::from_millis(100));
    let e = c.call_tool(late).await.unwrap_err();
    // The broker answers 10 ms before the deadline; tonic's client also
    // times the call and says CANCELLED ("Timeout expired") when its own
    // timer fires first, as it did once with three test binaries on the two
    // CPUs. Either way the call ended at its deadline, and any WARNING it
    // logged is what this test expects to be filtered out.
    assert!(
        e.code() == Code::DeadlineExceeded
            || (e.code() == Code::Cancelled && e.message() == "Timeout expired"),
        "{e:?}"
    );
    c.call_tool(with_session(call("trap", "{}"), &session))
        .await
        .unwrap_err();
    let n = tokio::time::timeout(Duration::from_secs(10), stream.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let Some(pb::notification::Notification::Log(log)) = &n.notification else {
        panic!("{n:?}")
    };
    assert_eq!(log.level, pb::LogLevel::Error as i32, "{log:?}");
    assert!(log.message.contains("`trap`"), "{log:?}");
    // The session's own level overrides its connection's.
    let lvl = pb::SetLoggingLevelRequest {
        level: pb::LogLevel::Debug as i32,
    };
    c.set_logging_level(with_session(lvl, &session))
        .await
        .unwrap();
    let mut late = with_session(call("sleep", r#"{"ms":1000}"#), &session);
    late.set_timeout(Duration::from_millis(100));
    c.call_tool(late).await.unwrap_err();
    let n = tokio::time::timeout(Duration::from_secs(10), stream.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(
        matches!(&n.notification, Some(pb::notification::Notification::Log(l)) if l.level == pb::LogLevel::Warning as i32),
        "{n:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_call_stops_its_guest_long_before_the_router_deadline() {
    // One instance per shard and a 30 s deadline: only cancellation can end
    // the `loop` call early.
    let b = Broker::start_with_chaos(|c| c + "instances_per_shard = 1\ncall_deadline = \"30s\"\n");
    let c = client(&b).await;
    let replaced = || b.metric("mcp_router_instances_replaced_total", r#"router="chaos""#);
    let in_flight = || b.metric("mcp_in_flight_requests", "");
    let before = replaced();
    // No grpc-timeout: the frame carries no deadline of its own.
    let mut looping = c.clone();
    let task = tokio::spawn(async move { looping.call_tool(call("loop", "{}")).await });
    assert!(
        eventually(Duration::from_secs(10), || in_flight() >= 1.0).await,
        "the loop call reached a shard"
    );
    // The client goes away: tonic resets the stream.
    task.abort();
    let t = std::time::Instant::now();
    assert!(
        eventually(Duration::from_secs(10), || in_flight() == 0.0
            && replaced() > before)
        .await,
        "the guest still runs {:?} after the cancel: in flight {}, replaced {} (before {before})",
        t.elapsed(),
        in_flight(),
        replaced()
    );
    // The edge and the router serve on.
    let mut c = c;
    c.call_tool(call("echo", r#"{"text":"after"}"#))
        .await
        .unwrap();
}

#[test]
fn a_silent_tcp_connection_is_closed_at_the_handshake_timeout() {
    use std::io::Read;
    let b = Broker::start_with_config(|c| {
        c.replace(
            r#"handshake_timeout = "10s""#,
            r#"handshake_timeout = "300ms""#,
        )
    });
    let mut s = std::net::TcpStream::connect(b.grpc).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let t = std::time::Instant::now();
    // The server's SETTINGS may come first; then the close.
    let mut buf = [0u8; 256];
    let closed = loop {
        match s.read(&mut buf) {
            Ok(0) => break true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break true,
            Err(_) => break false,
        }
    };
    assert!(closed, "still open after {:?}", t.elapsed());
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
}

/// A raw HTTP/2 client: the preface and an empty SETTINGS frame, then
/// nothing (it never answers a PING or acknowledges anything).
fn raw_http2(b: &Broker) -> std::net::TcpStream {
    use std::io::Write;
    let mut s = std::net::TcpStream::connect(b.grpc).unwrap();
    s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").unwrap();
    s.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).unwrap();
    s
}

/// The (type, payload) of every HTTP/2 frame received until the server
/// closes the connection, or `None` if it is still open after `within`.
fn frames_until_close(s: &mut std::net::TcpStream, within: Duration) -> Option<Vec<(u8, Vec<u8>)>> {
    use std::io::Read;
    s.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let until = std::time::Instant::now() + within;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let closed = loop {
        match s.read(&mut chunk) {
            Ok(0) => break true,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break true,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                if std::time::Instant::now() >= until {
                    break false;
                }
            }
            Err(e) => panic!("{e}"),
        }
    };
    let mut frames = Vec::new();
    let mut at = 0;
    while at + 9 <= buf.len() {
        let len = u32::from_be_bytes([0, buf[at], buf[at + 1], buf[at + 2]]) as usize;
        let end = (at + 9 + len).min(buf.len());
        frames.push((buf[at + 3], buf[at + 9..end].to_vec()));
        at += 9 + len;
    }
    closed.then_some(frames)
}

const PING: u8 = 6;

#[test]
fn a_peer_that_ignores_keepalive_pings_is_disconnected_and_streams_are_capped() {
    let b = Broker::start_with_config(|c| {
        c.replace(
            r#"keepalive_interval = "60s""#,
            r#"keepalive_interval = "200ms""#,
        )
        .replace(
            r#"keepalive_timeout = "20s""#,
            r#"keepalive_timeout = "300ms""#,
        )
        .replace(
            "max_concurrent_streams_per_connection = 256",
            "max_concurrent_streams_per_connection = 7",
        )
    });
    let mut s = raw_http2(&b);
    let frames = frames_until_close(&mut s, Duration::from_secs(10))
        .expect("a peer that never answers a PING is disconnected");
    // The server's SETTINGS come first: SETTINGS_MAX_CONCURRENT_STREAMS
    // (0x3) is the configured cap.
    let (kind, settings) = &frames[0];
    assert_eq!(*kind, 4, "{frames:?}");
    let cap = settings
        .chunks(6)
        .find(|e| e.len() == 6 && e[..2] == [0, 3])
        .map(|e| u32::from_be_bytes([e[2], e[3], e[4], e[5]]));
    assert_eq!(cap, Some(7), "{settings:?}");
    assert!(frames.iter().any(|(k, _)| *k == PING), "{frames:?}");
}

/// A raw `CallTool` of `echo` on `stream`: HEADERS (HPACK literals without
/// indexing), then one DATA frame with the length-prefixed protobuf.
fn raw_echo_call(stream: u8, text: &str) -> Vec<u8> {
    let mut block = Vec::new();
    for (name, value) in [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", "/turbomcp.mcp.v1.McpService/CallTool"),
        (":authority", "127.0.0.1"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ] {
        block.push(0);
        for s in [name, value] {
            block.push(s.len() as u8);
            block.extend_from_slice(s.as_bytes());
        }
    }
    let args = format!(r#"{{"text":"{text}"}}"#);
    let mut pb = vec![0x0a, 4];
    pb.extend_from_slice(b"echo");
    pb.extend_from_slice(&[0x12, args.len() as u8]);
    pb.extend_from_slice(args.as_bytes());
    let mut msg = vec![0];
    msg.extend_from_slice(&(pb.len() as u32).to_be_bytes());
    msg.extend_from_slice(&pb);
    let mut out = Vec::new();
    for (kind, flags, payload) in [(1u8, 0x4u8, block), (0, 0x1, msg)] {
        out.extend_from_slice(&(payload.len() as u32).to_be_bytes()[1..]);
        out.extend_from_slice(&[kind, flags, 0, 0, 0, stream]);
        out.extend_from_slice(&payload);
    }
    out
}

#[test]
fn a_peer_whose_flow_control_lets_no_answer_out_is_disconnected_at_the_write_timeout() {
    use std::io::Write;
    // The [grpc] write_timeout (the example's [frames] and [http] have one
    // of the same value too).
    let b = Broker::start_with_config(|c| {
        c.replace(
            "answers per connection.\nwrite_timeout = \"30s\"",
            "answers per connection.\nwrite_timeout = \"300ms\"",
        )
    });
    // SETTINGS_INITIAL_WINDOW_SIZE (0x4) = 0: the answer's HEADERS may
    // come, its DATA may not. The peer reads everything (the test reads
    // until the close), but never opens the window; keepalive (60 s) alone
    // would keep it, and what it holds, for 80 s.
    let connect = |window: Option<u32>| {
        let mut s = std::net::TcpStream::connect(b.grpc).unwrap();
        s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").unwrap();
        let mut settings = vec![];
        if let Some(w) = window {
            settings.extend_from_slice(&[0, 4]);
            settings.extend_from_slice(&w.to_be_bytes());
        }
        s.write_all(&[0, 0, settings.len() as u8, 4, 0, 0, 0, 0, 0])
            .unwrap();
        s.write_all(&settings).unwrap();
        s.write_all(&raw_echo_call(1, "held")).unwrap();
        s
    };
    let mut stuck = connect(Some(0));
    let t = std::time::Instant::now();
    let frames = frames_until_close(&mut stuck, Duration::from_secs(10))
        .expect("a peer whose window lets no answer out is disconnected");
    let took = t.elapsed();
    // Between one write_timeout and two, plus the shard timer's slack.
    assert!(took >= Duration::from_millis(300), "{took:?}");
    assert!(took < Duration::from_secs(3), "{took:?}");
    assert!(
        frames.iter().any(|(k, _)| *k == 1),
        "the answer's HEADERS: {frames:?}"
    );
    assert!(
        !frames.iter().any(|(k, _)| *k == 0),
        "no DATA in a window of 0: {frames:?}"
    );
    assert_eq!(b.metric("mcp_grpc_write_timeouts_total", ""), 1.0);
    // The same call with the default window is answered, and the
    // connection outlives two write_timeouts.
    let mut open = connect(None);
    assert!(
        frames_until_close(&mut open, Duration::from_secs(1)).is_none(),
        "an answered peer keeps its connection"
    );
    // Other clients are served as usual.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut c = client(&b).await;
        let r = c
            .call_tool(call("echo", r#"{"text":"after"}"#))
            .await
            .expect("echo");
        assert!(!r.into_inner().content.is_empty());
    });
}

#[test]
fn a_connection_past_its_max_age_is_closed() {
    let b = Broker::start_with_config(|c| {
        c.replace(
            r#"max_connection_age = "1h""#,
            r#"max_connection_age = "300ms""#,
        )
        .replace(
            r#"max_connection_age_grace = "30s""#,
            r#"max_connection_age_grace = "300ms""#,
        )
    });
    // An idle, handshaken connection: nothing but its age can close it
    // (keepalive is 60 s, and this peer sent nothing to answer). The GOAWAY
    // may be lost to the reset of the close, so only the close is checked.
    let mut s = raw_http2(&b);
    let t = std::time::Instant::now();
    frames_until_close(&mut s, Duration::from_secs(10))
        .expect("the connection is closed after max_connection_age");
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
}

#[test]
fn sigterm_exits_within_the_drain_timeout_while_a_silent_connection_is_open() {
    use std::io::{Read, Write};
    // A handshake timeout far beyond the drain: only the drain deadline can
    // end these connections.
    let b = Broker::start_with_config(|c| {
        c.replace(r#"drain_timeout = "10s""#, r#"drain_timeout = "2s""#)
            .replace(
                r#"handshake_timeout = "10s""#,
                r#"handshake_timeout = "1h""#,
            )
    });
    // One never sends the HTTP/2 preface, one sends half of it. The
    // server's SETTINGS frame proves the edge took each connection (the
    // drain stops accepting, and a connection still in the backlog then
    // is simply reset).
    let accepted = |s: &mut std::net::TcpStream| {
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut buf = [0u8; 64];
        assert!(s.read(&mut buf).unwrap() > 0, "no SETTINGS from the server");
    };
    let mut silent = std::net::TcpStream::connect(b.grpc).unwrap();
    accepted(&mut silent);
    let mut half = std::net::TcpStream::connect(b.grpc).unwrap();
    half.write_all(b"PRI * HTTP/2.0\r\n").unwrap();
    accepted(&mut half);
    let mut b = b;
    let t = std::time::Instant::now();
    b.terminate();
    let limit = Duration::from_secs(2) + Duration::from_secs(4);
    let status = loop {
        if let Some(s) = b.child.try_wait().unwrap() {
            break s;
        }
        assert!(
            t.elapsed() < limit,
            "the broker did not exit within drain_timeout + 4 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status:?}");
}

/// A `Stream` of the given items (tonic wants a stream for client
/// streaming calls).
fn tokio_stream_iter<T: Send + 'static>(
    items: Vec<T>,
) -> impl tonic::codegen::tokio_stream::Stream<Item = T> + Send {
    struct Iter<T>(std::vec::IntoIter<T>);
    impl<T> Unpin for Iter<T> {}
    impl<T> tonic::codegen::tokio_stream::Stream for Iter<T> {
        type Item = T;
        fn poll_next(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<T>> {
            std::task::Poll::Ready(self.0.next())
        }
    }
    Iter(items.into_iter())
}

/// The two fields of `google.protobuf.FileDescriptorProto` this test reads
/// (prost decodes and skips the rest).
mod prost_types_like {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct FileDescriptorProto {
        #[prost(string, optional, tag = "1")]
        pub name: Option<String>,
        #[prost(string, optional, tag = "2")]
        pub package: Option<String>,
    }
}

/// A request body that sends `first` and then nothing, ever (a peer that
/// stopped mid-message but keeps its connection alive).
struct StalledBody(Option<bytes::Bytes>);

impl hyper::body::Body for StalledBody {
    type Data = bytes::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<bytes::Bytes>, Self::Error>>> {
        match self.0.take() {
            Some(b) => std::task::Poll::Ready(Some(Ok(hyper::body::Frame::data(b)))),
            None => std::task::Poll::Pending,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_message_that_never_arrives_whole_fails_at_the_body_timeout() {
    // A stream that announced a 4 MB message, sent part of it and idled
    // held that part until max_connection_age (an hour): +285 MB for 56 s
    // in the audit that found it.
    let b = Broker::start_with_config(|c| {
        c.replacen(
            "body_timeout = \"30s\"\n# Calls open at once",
            "body_timeout = \"1s\"\n# Calls open at once",
            1,
        )
    });
    let tcp = tokio::net::TcpStream::connect(b.grpc).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tcp),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    // The gRPC message header: uncompressed, 4,000,000 bytes; then 1,000.
    let mut part = vec![0u8];
    part.extend_from_slice(&4_000_000u32.to_be_bytes());
    part.extend_from_slice(&[0; 1000]);
    let req = hyper::Request::post(format!(
        "http://{}/turbomcp.mcp.v1.McpService/ListTools",
        b.grpc
    ))
    .header("content-type", "application/grpc")
    .header("te", "trailers")
    .body(StalledBody(Some(part.into())))
    .unwrap();
    let t = std::time::Instant::now();
    let resp = tokio::time::timeout(Duration::from_secs(10), send.send_request(req))
        .await
        .expect("no answer within 10 s: the half-sent message was held")
        .unwrap();
    let status = |h: &hyper::HeaderMap| {
        h.get("grpc-status")
            .map(|v| v.to_str().unwrap().to_string())
    };
    let mut code = status(resp.headers());
    if code.is_none() {
        use http_body_util::BodyExt;
        let body = tokio::time::timeout(Duration::from_secs(10), resp.into_body().collect())
            .await
            .expect("the answer's trailers within 10 s")
            .unwrap();
        code = body.trailers().and_then(status);
    }
    // INVALID_ARGUMENT, as HTTP answers a body past its timeout with -32600.
    assert_eq!(code.as_deref(), Some("3"), "grpc-status");
    assert!(
        t.elapsed() >= Duration::from_millis(900),
        "{:?}",
        t.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reflections_stream_outlives_the_body_timeout() {
    // Reflection is bidirectional: its client sends on the stream for as
    // long as it lasts. The body timeout once cut it at grpc.body_timeout.
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;

    struct Rx(tokio::sync::mpsc::UnboundedReceiver<ServerReflectionRequest>);
    impl tonic::codegen::tokio_stream::Stream for Rx {
        type Item = ServerReflectionRequest;
        fn poll_next(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<Self::Item>> {
            self.0.poll_recv(cx)
        }
    }

    let b = Broker::start_with_config(|c| {
        c.replacen(
            "body_timeout = \"30s\"\n# Calls open at once",
            "body_timeout = \"1s\"\n# Calls open at once",
            1,
        )
    });
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let list = || ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut refl = ServerReflectionClient::new(channel(&b).await);
    tx.send(list()).unwrap();
    let mut answers = refl
        .server_reflection_info(Rx(rx))
        .await
        .unwrap()
        .into_inner();
    for round in 0..2 {
        let a = tokio::time::timeout(Duration::from_secs(10), answers.message())
            .await
            .expect("an answer within 10 s");
        assert!(
            matches!(
                a.as_ref()
                    .map(|m| m.as_ref().and_then(|m| m.message_response.as_ref())),
                Ok(Some(MessageResponse::ListServicesResponse(_)))
            ),
            "round {round}: {a:?}"
        );
        // Past the body timeout before the next question.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        tx.send(list()).unwrap();
    }
}
