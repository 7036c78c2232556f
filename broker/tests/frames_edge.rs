//! The frame edge, end to end: the real binary on loopback port 0, real
//! sockets, the bundled routers.

mod common;

use std::io::Write;
use std::time::{Duration, Instant};

use common::{Broker, Client, error_code, tool_text};
use mcp_schema::client::{Listing, RequestHeader, ResponseView};
use mcp_schema::fb::protocol::{CompletionRefKind, ProtocolVersion, ResponsePayload};

#[test]
fn ready_line_names_bound_addresses_shards_and_routers() {
    let b = Broker::start(&["--shards", "2"]);
    assert_eq!(b.shards, 2);
    assert_eq!(b.routers, ["echo", "kv", "library", "chaos"]);
    assert_ne!(b.frames.port(), 0);
    assert_ne!(b.metrics.port(), 0);
    assert_eq!(b.http_get("/healthz").0, 200);
    assert_eq!(b.http_get("/readyz").0, 200);
    let (status, metrics) = b.http_get("/metrics");
    assert_eq!(status, 200);
    assert!(metrics.contains("mcp_shards 2"), "{metrics}");
}

#[test]
fn every_payload_kind_is_answered_by_the_bundled_routers() {
    let b = Broker::start(&["--shards", "1"]);
    let mut c = b.connect();

    // Tool call through echo: the arguments object comes back verbatim.
    let r = c.call("echo", &[("text", "\"hi\"")], None);
    assert_eq!(tool_text(&r), r#"{"text":"hi"}"#);
    let tr = ResponseView::parse(&r)
        .unwrap()
        .response
        .payload_as_tool_result()
        .unwrap();
    assert_eq!(tr.structured_content(), Some(r#"{"text":"hi"}"#));
    assert!(tr.success());

    // Stateful router.
    let r = c.call("put", &[("key", "\"a\""), ("value", "42")], Some("s1"));
    assert_eq!(tool_text(&r), "stored a");
    assert_eq!(
        tool_text(&c.call("get", &[("key", "\"a\"")], Some("s1"))),
        "42"
    );

    // Resources, templates, prompts, completion.
    let r = c.request(None, |e, h| e.read_resource(h, "library://readme").to_vec());
    let rd = ResponseView::parse(&r)
        .unwrap()
        .response
        .payload_as_resource_data()
        .expect("ResourceData");
    assert!(
        rd.content_as_resource_content()
            .unwrap()
            .text()
            .unwrap()
            .len()
            > 10
    );
    let r = c.request(None, |e, h| {
        e.read_resource(h, "library://books/dune").to_vec()
    });
    assert!(
        error_code(&r).is_none() || error_code(&r) == Some(-32601),
        "template read answered"
    );
    // Read in the session that wrote it: each session has its own instance.
    let r = c.request(Some("s1"), |e, h| e.read_resource(h, "kv://a").to_vec());
    assert_eq!(
        ResponseView::parse(&r).unwrap().payload_type(),
        ResponsePayload::ResourceData,
        "kv:// routes by router name"
    );

    let r = c.request(None, |e, h| {
        e.get_prompt(
            h,
            "summarize_book",
            &[("book_id", "\"dune\""), ("style", "\"short\"")],
        )
        .to_vec()
    });
    let ap = ResponseView::parse(&r)
        .unwrap()
        .response
        .payload_as_applied_prompt()
        .expect("AppliedPrompt");
    let first = ap
        .messages()
        .unwrap()
        .get(0)
        .content_as_text_content()
        .unwrap()
        .text()
        .to_string();
    assert!(
        first.contains("library://books/dune") && first.contains("short"),
        "{first}"
    );

    let r = c.request(None, |e, h| {
        e.complete(
            h,
            CompletionRefKind::Prompt,
            "summarize_book",
            "style",
            "",
            &[],
        )
        .to_vec()
    });
    let cr = ResponseView::parse(&r)
        .unwrap()
        .response
        .payload_as_complete_result()
        .expect("CompleteResult");
    assert!(!cr.values().unwrap().is_empty());

    // Listings.
    let r = c.request(None, |e, h| e.list(h, Listing::Tools, None).to_vec());
    let tools = ResponseView::parse(&r)
        .unwrap()
        .response
        .payload_as_list_tools_result()
        .unwrap();
    let names: Vec<&str> = tools.tools().unwrap().iter().map(|t| t.name()).collect();
    for n in ["echo", "put", "get", "search", "loop"] {
        assert!(names.contains(&n), "{n} missing from {names:?}");
    }
    let r = c.request(None, |e, h| {
        e.list(h, Listing::ResourceTemplates, None).to_vec()
    });
    let t = ResponseView::parse(&r)
        .unwrap()
        .response
        .payload_as_list_resource_templates_result()
        .unwrap();
    assert!(
        t.resource_templates()
            .unwrap()
            .iter()
            .any(|t| t.uri_template() == "library://books/{id}")
    );
    let r = c.request(None, |e, h| e.list(h, Listing::Prompts, None).to_vec());
    assert!(
        ResponseView::parse(&r)
            .unwrap()
            .response
            .payload_as_list_prompts_result()
            .unwrap()
            .prompts()
            .unwrap()
            .len()
            >= 2
    );
    let r = c.request(None, |e, h| {
        e.list(h, Listing::Resources, Some("garbage")).to_vec()
    });
    assert_eq!(
        error_code(&r),
        Some(-32602),
        "a bad cursor is invalid params"
    );

    // Broker-level requests.
    let r = c.request(None, |e, h| {
        e.initialize(h, ProtocolVersion::V2024_11_05, "test", "1")
            .to_vec()
    });
    let ir = ResponseView::parse(&r)
        .unwrap()
        .response
        .payload_as_initialize_response()
        .unwrap();
    assert_eq!(
        ir.server_capabilities().protocol_version(),
        ProtocolVersion::V2024_11_05
    );
    assert!(ir.server_capabilities().supports_tools());
    let r = c.request(None, |e, h| e.ping(h).to_vec());
    assert_eq!(
        ResponseView::parse(&r).unwrap().payload_type(),
        ResponsePayload::PingResponse
    );

    // Unknown names are -32601 naming what was asked for.
    let r = c.call("no_such_tool", &[], None);
    let (code, msg) = ResponseView::parse(&r).unwrap().error().unwrap();
    assert_eq!(code, -32601);
    assert!(msg.contains("no_such_tool"), "{msg}");
}

#[test]
fn correlation_falls_back_to_the_message_id() {
    let b = Broker::start(&["--shards", "1"]);
    let mut c = b.connect();
    let id = *b"\x01\x23\x45\x67\x89\xab\xcd\xef\x01\x23\x45\x67\x89\xab\xcd\xef";
    let h = RequestHeader {
        message_id: id,
        correlation_id: None,
        session_id: None,
        timeout_ms: 0,
        unix_nanos: 0,
    };
    let f = c.enc.ping(&h).to_vec();
    c.send_raw(&f);
    let r = c.read_final();
    assert_eq!(
        ResponseView::parse(&r).unwrap().correlation_id(),
        "01234567-89ab-cdef-0123-456789abcdef"
    );
}

/// Sends `n` requests on one connection without waiting, then reads `n`
/// answers: each correlation id exactly once, each success echoing its own
/// arguments. Returns how many were refused as overloaded (-32000), the only
/// error allowed.
fn pipeline(c: &mut Client, n: usize, tag: &str) -> usize {
    let mut batch = Vec::with_capacity(n * 128);
    for i in 0..n {
        let corr = format!("{tag}-{i}");
        let h = RequestHeader {
            message_id: [1; 16],
            correlation_id: Some(&corr),
            session_id: None,
            timeout_ms: 0,
            unix_nanos: 0,
        };
        batch.extend_from_slice(
            c.enc
                .tool_call(&h, [2; 16], "echo", &[("i", &i.to_string())]),
        );
    }
    let writer = {
        let mut s = c.stream.try_clone().unwrap();
        std::thread::spawn(move || s.write_all(&batch).unwrap())
    };
    let mut seen = vec![false; n];
    let mut overloaded = 0;
    for _ in 0..n {
        let f = c.read_final();
        let r = ResponseView::parse(&f).unwrap();
        let i: usize = r
            .correlation_id()
            .strip_prefix(&format!("{tag}-"))
            .unwrap()
            .parse()
            .unwrap();
        assert!(!seen[i], "answer {i} twice");
        seen[i] = true;
        match r.error() {
            None => assert_eq!(tool_text(&f), format!("{{\"i\":{i}}}")),
            Some((-32000, _)) => overloaded += 1,
            Some(e) => panic!("request {i}: unexpected error {e:?}"),
        }
    }
    writer.join().unwrap();
    overloaded
}

#[test]
fn ten_thousand_pipelined_requests_on_one_connection_each_answered_once() {
    let b = Broker::start(&["--shards", "2"]);
    let mut c = b.connect();
    // At most max_in_flight_per_connection (256) are admitted at once, well
    // within one router's instances plus queue: nothing may be refused.
    assert_eq!(pipeline(&mut c, 10_000, "p"), 0);
}

#[test]
fn ten_thousand_requests_over_64_connections_each_answered_once() {
    // 64 connections each pipelining 157 requests put ~5,000 requests per
    // shard in flight at once, more than a router's queue admits (1,024 by
    // default): the excess is refused with -32000 by design. What must hold
    // is that every request gets exactly one answer, and most succeed.
    let b = Broker::start(&["--shards", "2"]);
    let threads: Vec<_> = (0..64)
        .map(|t| {
            let addr = b.frames;
            std::thread::spawn(move || pipeline(&mut Client::connect(addr), 157, &format!("t{t}")))
        })
        .collect();
    let overloaded: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
    assert!(
        overloaded < 10_048 / 2,
        "{overloaded} of 10,048 refused as overloaded"
    );
}

#[test]
fn bad_frames_get_their_error_and_other_connections_carry_on() {
    let b = Broker::start(&["--shards", "1"]);
    let mut good = b.connect();
    assert_eq!(tool_text(&good.call("echo", &[], None)), "{}");

    // Garbage with a plausible length: -32700, connection stays usable.
    let mut bad = b.connect();
    bad.send_raw(&[8, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8]);
    let r = bad.read_frame().expect("an error response");
    assert_eq!(error_code(&r), Some(-32700));
    assert_eq!(ResponseView::parse(&r).unwrap().correlation_id(), "");
    assert_eq!(tool_text(&bad.call("echo", &[], None)), "{}");

    // A Response (wrong root) whose layout conflicts: -32700.
    let mut enc = mcp_schema::ResponseEncoder::new(9);
    let to = mcp_schema::encode::ReplyTo {
        correlation: mcp_schema::encode::Correlation::Text("x"),
        session_id: None,
    };
    let wrong = enc
        .tool_text(&to, &mcp_schema::fb::UUID::new(&[0; 16]), "t", None, false)
        .to_vec();
    bad.send_raw(&wrong);
    assert_eq!(error_code(&bad.read_frame().unwrap()), Some(-32700));

    // Truncated then closed: the broker just closes its side.
    let mut trunc = b.connect();
    trunc.send_raw(&[100, 0, 0, 0, 1, 2, 3]);
    trunc.stream.shutdown(std::net::Shutdown::Write).unwrap();
    assert!(trunc.read_frame().is_none());

    // Oversized prefix: closed without an answer, before any allocation.
    let mut big = b.connect();
    big.send_raw(&u32::MAX.to_le_bytes());
    assert!(big.read_frame().is_none(), "connection closed");

    assert_eq!(
        tool_text(&good.call("echo", &[("still", "true")], None)),
        r#"{"still":true}"#
    );
}

/// A connection and, encoded for it, a call of chaos's `loop` (a guest that
/// computes until chaos's 2 s deadline), not yet sent.
fn loop_call(b: &Broker) -> (Client, Vec<u8>) {
    let mut c = b.connect();
    let h = RequestHeader {
        message_id: [3; 16],
        correlation_id: Some("loop"),
        session_id: None,
        timeout_ms: 0,
        unix_nanos: 0,
    };
    let f = c.enc.tool_call(&h, [3; 16], "loop", &[]).to_vec();
    (c, f)
}

#[test]
fn a_guest_looping_forever_does_not_stall_its_shard() {
    let b = Broker::start(&["--shards", "1"]);
    let (mut stuck, f) = loop_call(&b);
    stuck.send_raw(&f);
    let mut other = b.connect();
    let t = Instant::now();
    for _ in 0..50 {
        assert_eq!(tool_text(&other.call("echo", &[], None)), "{}");
    }
    assert!(
        // Under the loop's 2 s deadline: a stalled shard would answer only
        // after it; the margin absorbs a loaded CI machine.
        t.elapsed() < Duration::from_millis(1500),
        "echo calls stalled for {:?}",
        t.elapsed()
    );
    // The loop ends at chaos's 2 s deadline with -32001.
    assert_eq!(error_code(&stuck.read_final()), Some(-32001));
}

#[test]
fn requests_behind_a_computing_guest_wait_about_one_epoch_tick_not_for_its_call() {
    // Before the shard's own yield (`shard::guest_yield`), a guest's yield
    // woke its task from another thread, which often kept the shard from
    // waiting in the kernel, and its DEFER_TASKRUN ring posts socket
    // completions only then: echo calls here waited, now and then, for
    // hundreds of milliseconds (bench/NOTES.md, "a computing guest held its
    // shard's sockets"). Now every tick (1 ms) lets the shard read and
    // answer them.
    let b = Broker::start(&["--shards", "1"]);
    let (mut stuck, f) = loop_call(&b);
    let mut others: Vec<Client> = (0..8).map(|_| b.connect()).collect();
    for c in &mut others {
        assert_eq!(tool_text(&c.call("echo", &[], None)), "{}");
    }
    stuck.send_raw(&f);
    // The loop is under way (it runs for chaos's 2 s deadline).
    std::thread::sleep(Duration::from_millis(50));
    let started = Instant::now();
    // Four clients at once, each a call at a time: the shard has other
    // tasks to run when the guest yields, as under real load.
    let mut waits: Vec<Duration> = std::thread::scope(|s| {
        let clients: Vec<_> = others
            .iter_mut()
            .map(|c| {
                s.spawn(move || {
                    let mut waits = Vec::new();
                    while started.elapsed() < Duration::from_millis(1400) {
                        let t = Instant::now();
                        assert_eq!(tool_text(&c.call("echo", &[], None)), "{}");
                        waits.push(t.elapsed());
                    }
                    waits
                })
            })
            .collect();
        clients
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    assert!(
        started.elapsed() < Duration::from_millis(1900),
        "the calls outlasted the loop"
    );
    waits.sort();
    let (median, longest) = (waits[waits.len() / 2], waits[waits.len() - 1]);
    assert!(
        // One tick is 1 ms: 1.07 ms median and 2-6 ms at most on the
        // project's VM. The margins absorb a loaded CI machine's stalls;
        // before, the longest wait was 0.3-1.6 s in half the runs (the
        // others: 32-84 ms; the mechanism itself is tested deterministically
        // in `shard::tests`).
        median < Duration::from_millis(6) && longest < Duration::from_millis(250),
        "an echo call behind a looping guest waited {median:?} (median), {longest:?} at most"
    );
    assert_eq!(error_code(&stuck.read_final()), Some(-32001));
}

#[test]
fn a_never_waits_guest_overflows_and_loops_on_the_shard_stack_and_the_broker_stays_up() {
    // The chaos router called without a fiber: deep recursion uses the
    // shard thread's own stack (sized for it), and a loop holds the shard
    // for at most 10 ms of guest time before -32001.
    let cfg = "[broker]\nshards = 1\n[[routers]]\nname = \"chaos\"\nwasm = \"chaos.wasm\"\n\
               instances_per_shard = 1\ncall_deadline = \"5s\"\nnever_waits = true\n";
    let b = Broker::start_with_config(cfg, &[]);
    let mut c = b.connect();
    // The overflow traps (-32002); on a loaded machine the descent can
    // outlast the 10 ms run limit, counted in wall-clock ticks, first
    // (-32001, seen once in a full parallel run). Either way the call
    // fails alone and the shard goes on.
    let code = error_code(&c.call("recurse", &[], None));
    assert!(matches!(code, Some(-32002 | -32001)), "{code:?}");
    let t = Instant::now();
    assert_eq!(error_code(&c.call("loop", &[], None)), Some(-32001));
    assert!(
        // Far below the 5 s call deadline; the margin absorbs a loaded CI
        // machine (guest time is counted in ticks, not wall time).
        t.elapsed() < Duration::from_secs(2),
        "the loop ran {:?}",
        t.elapsed()
    );
    assert_eq!(
        error_code(&c.call("sleep", &[("ms", "1")], None)),
        Some(-32002)
    );
    // The instance was replaced each time; the next call is served.
    assert_eq!(
        tool_text(&c.call("print", &[("text", "\"ok\"")], None)),
        "printed"
    );
}

#[test]
fn overload_beyond_the_queue_is_refused_with_overload_errors() {
    let cfg = format!(
        "{}\n[[routers]]\nname = \"chaos\"\nwasm = \"chaos.wasm\"\ninstances_per_shard = 1\nqueue_depth = 2\ncall_deadline = \"5s\"\n",
        "[broker]\nshards = 1\n"
    );
    let b = Broker::start_with_config(&cfg, &[]);
    let mut c = b.connect();
    for i in 0..20 {
        let corr = format!("s{i}");
        let h = RequestHeader {
            message_id: [4; 16],
            correlation_id: Some(&corr),
            session_id: None,
            timeout_ms: 0,
            unix_nanos: 0,
        };
        let f = c
            .enc
            .tool_call(&h, [4; 16], "sleep", &[("ms", "300")])
            .to_vec();
        c.send_raw(&f);
    }
    let mut overloaded = 0;
    let mut ok = 0;
    for _ in 0..20 {
        match error_code(&c.read_final()) {
            Some(-32000) => overloaded += 1,
            None => ok += 1,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(ok, 3, "one running plus a queue of two");
    assert_eq!(overloaded, 17);
}

#[test]
fn sigterm_during_load_answers_every_request_sent_before_it_and_exits_zero() {
    let mut b = Broker::start(&["--shards", "2"]);
    let mut c = b.connect();
    let n = 200;
    for i in 0..n {
        let corr = format!("d{i}");
        let h = RequestHeader {
            message_id: [5; 16],
            correlation_id: Some(&corr),
            session_id: None,
            timeout_ms: 0,
            unix_nanos: 0,
        };
        let (tool, args): (&str, &[(&str, &str)]) = if i % 20 == 0 {
            ("sleep", &[("ms", "200")])
        } else {
            ("echo", &[])
        };
        let f = c.enc.tool_call(&h, [5; 16], tool, args).to_vec();
        c.send_raw(&f);
    }
    let status = {
        let reader = std::thread::spawn(move || {
            let mut seen = std::collections::HashSet::new();
            while seen.len() < n {
                let Some(f) = c.read_frame() else { break };
                let r = ResponseView::parse(&f).unwrap();
                if r.is_final() {
                    assert!(
                        seen.insert(r.correlation_id().to_string()),
                        "twice: {}",
                        r.correlation_id()
                    );
                    if let Some((code, _)) = r.error() {
                        assert_eq!(code, -32004, "only shutting-down errors are acceptable");
                    }
                }
            }
            seen.len()
        });
        std::thread::sleep(Duration::from_millis(50));
        let status = b.terminate(Duration::from_secs(30));
        assert_eq!(
            reader.join().unwrap(),
            n,
            "every request answered exactly once"
        );
        status
    };
    assert!(status.success(), "exit status {status:?}");
}

/// Sends a `chaos` tool call without waiting for its answer.
fn send_tool(c: &mut Client, corr: &str, tool: &str, args: &[(&str, &str)]) {
    let h = RequestHeader {
        message_id: [6; 16],
        correlation_id: Some(corr),
        session_id: None,
        timeout_ms: 0,
        unix_nanos: 0,
    };
    let f = c.enc.tool_call(&h, [6; 16], tool, args).to_vec();
    c.send_raw(&f);
}

#[test]
fn a_waiting_call_does_not_hold_up_later_requests_on_its_connection() {
    // The reader answers what finishes at once and hands only waiting calls
    // to workers: echo calls sent after a sleeping call on the same
    // connection are answered before it.
    let b = Broker::start(&["--shards", "1"]);
    let mut c = b.connect();
    send_tool(&mut c, "slow", "sleep", &[("ms", "600")]);
    for i in 0..50 {
        send_tool(&mut c, &format!("e{i}"), "echo", &[]);
    }
    let mut order = Vec::new();
    while order.len() < 51 {
        let f = c.read_final();
        let r = ResponseView::parse(&f).unwrap();
        assert_eq!(r.error(), None, "{}", r.correlation_id());
        order.push(r.correlation_id().to_string());
    }
    assert_eq!(order.last().map(String::as_str), Some("slow"), "{order:?}");
    let mut echoes: Vec<_> = order[..50].to_vec();
    echoes.sort();
    echoes.dedup();
    assert_eq!(echoes.len(), 50, "each echo answered once");
}

#[test]
fn the_drain_deadline_answers_a_waiting_call_with_shutting_down() {
    let cfg = "[broker]\nshards = 1\ndrain_timeout = \"300ms\"\n\n[[routers]]\nname = \"chaos\"\nwasm = \"chaos.wasm\"\ncall_deadline = \"20s\"\n\n[[routers]]\nname = \"echo\"\nwasm = \"echo.wasm\"\n";
    let mut b = Broker::start_with_config(cfg, &[]);
    let mut c = b.connect();
    send_tool(&mut c, "long", "sleep", &[("ms", "15000")]);
    // Answered at once: the connection is live and served.
    send_tool(&mut c, "quick", "echo", &[("a", "1")]);
    let quick = c.read_final();
    assert_eq!(
        ResponseView::parse(&quick).unwrap().correlation_id(),
        "quick"
    );
    let t = Instant::now();
    let status = b.terminate(Duration::from_secs(10));
    let long = c.read_final();
    let r = ResponseView::parse(&long).unwrap();
    assert_eq!(r.correlation_id(), "long");
    assert_eq!(r.error().map(|(code, _)| code), Some(-32004));
    assert!(status.success(), "exit status {status:?}");
    assert!(
        t.elapsed() < Duration::from_secs(8),
        "drain took {:?}, not bounded by drain_timeout",
        t.elapsed()
    );
}

#[test]
fn a_burst_written_before_sigterm_is_answered_whole() {
    // 5,000 frames in one write: more than the kernel holds on the broker's
    // side, so part of it is still in the client's socket when the drain
    // begins. Reading only what the broker's side held left 4,271 of them
    // unanswered.
    let mut b = Broker::start(&["--shards", "1"]);
    let mut c = b.connect();
    let mut writer = c.stream.try_clone().unwrap();
    let mut burst = Vec::new();
    let n = 5000;
    for i in 0..n {
        let corr = format!("burst-{i}");
        let h = RequestHeader {
            message_id: [9; 16],
            correlation_id: Some(&corr),
            session_id: None,
            timeout_ms: 0,
            unix_nanos: 0,
        };
        burst.extend_from_slice(
            c.enc
                .tool_call(&h, [9; 16], "echo", &[("pad", &"7".repeat(120))]),
        );
    }
    let reading = std::thread::spawn(move || {
        let mut seen = std::collections::HashSet::new();
        while let Some(f) = c.read_frame() {
            let r = ResponseView::parse(&f).unwrap();
            if r.is_final() {
                assert!(
                    seen.insert(r.correlation_id().to_string()),
                    "answered twice"
                );
            }
        }
        seen.len()
    });
    writer.write_all(&burst).unwrap();
    let status = b.terminate(Duration::from_secs(30));
    assert!(status.success(), "{status:?}");
    assert_eq!(
        reading.join().unwrap(),
        n,
        "every request written before the signal answered"
    );
}

#[test]
fn a_client_that_keeps_sending_does_not_hold_the_drain_to_its_deadline() {
    // A connection is read at the drain only up to what its peer had sent
    // when the drain began. It was read until the peer stayed quiet for
    // 100 ms, which a client under steady load never is: every shutdown
    // took the whole drain_timeout while the broker refused thousands of
    // new requests, then cut the connection.
    let cfg = "[broker]\nshards = 1\ndrain_timeout = \"30s\"\n\n[[routers]]\nname = \"echo\"\nwasm = \"echo.wasm\"\n";
    let mut b = Broker::start_with_config(cfg, &[]);
    let mut c = b.connect();
    let mut writer = c.stream.try_clone().unwrap();
    let h = RequestHeader {
        message_id: [8; 16],
        correlation_id: Some("steady"),
        session_id: None,
        timeout_ms: 0,
        unix_nanos: 0,
    };
    let batch = c.enc.tool_call(&h, [8; 16], "echo", &[]).repeat(32);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sending = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let t = Instant::now();
            // Until the broker stops reading (the write fails or blocks
            // past its timeout), or 40 s at most.
            writer
                .set_write_timeout(Some(Duration::from_secs(1)))
                .unwrap();
            while !stop.load(std::sync::atomic::Ordering::Relaxed)
                && t.elapsed() < Duration::from_secs(40)
                && writer.write_all(&batch).is_ok()
            {
                std::thread::sleep(Duration::from_millis(1));
            }
        })
    };
    let reading = std::thread::spawn(move || {
        let mut answered = 0u64;
        while c.read_frame().is_some() {
            answered += 1;
        }
        answered
    });
    std::thread::sleep(Duration::from_millis(300));
    let t = Instant::now();
    let status = b.terminate(Duration::from_secs(60));
    let took = t.elapsed();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    sending.join().unwrap();
    assert!(reading.join().unwrap() > 0, "the load was served");
    assert!(status.success(), "exit status {status:?}");
    assert!(
        took < Duration::from_secs(15),
        "the drain took {took:?}: the connection was read until the 30 s deadline"
    );
}

#[test]
fn a_subscribed_frame_client_hears_of_the_resources_updates() {
    // A SubscribeRequest was answered, and the resource's updates then went
    // to HTTP and gRPC subscribers only.
    let b = Broker::start(&["--shards", "2"]);
    let mut w = b.connect();
    let put = |w: &mut Client, v: &str| {
        tool_text(&w.call("put", &[("key", "\"color\""), ("value", v)], Some("writer")));
    };
    put(&mut w, "\"red\"");
    // Subscribed in the writer's session (`kv` is session-affine: its
    // state is the session's), from another connection.
    let mut sub = b.connect();
    let r = sub.request(Some("writer"), |e, h| {
        e.subscribe(h, "kv://color", true).to_vec()
    });
    assert_eq!(ResponseView::parse(&r).unwrap().error(), None);
    // And in another session, whose `kv://color` no write here changes.
    let mut stranger = b.connect();
    let r = stranger.request(Some("reader"), |e, h| {
        e.subscribe(h, "kv://color", true).to_vec()
    });
    assert_eq!(ResponseView::parse(&r).unwrap().error(), None);
    // Written from another connection, in a session whose instance may be
    // on the other shard.
    put(&mut w, "\"blue\"");
    let updated = |f: &[u8]| {
        ResponseView::parse(f)
            .unwrap()
            .response
            .payload_as_resource_updated_notification()
            .map(|n| n.uri().to_string())
    };
    let f = sub.read_frame().expect("a notification");
    assert_eq!(updated(&f).as_deref(), Some("kv://color"));
    // The other session's subscriber was told nothing (it used to hear of
    // every session's writes): its next frame is the answer to a ping.
    let pong = stranger.first_after_ping();
    assert_eq!(updated(&pong), None);
    // Its own session's write is its own to hear.
    tool_text(&w.call(
        "put",
        &[("key", "\"color\""), ("value", "\"grey\"")],
        Some("reader"),
    ));
    let f = stranger.read_frame().expect("a notification");
    assert_eq!(updated(&f).as_deref(), Some("kv://color"));
    // Unsubscribed: the next write says nothing; the next frame is the
    // answer to a ping sent after it.
    let r = sub.request(Some("writer"), |e, h| {
        e.subscribe(h, "kv://color", false).to_vec()
    });
    assert_eq!(ResponseView::parse(&r).unwrap().error(), None);
    put(&mut w, "\"green\"");
    let pong = sub.first_after_ping();
    assert_eq!(updated(&pong), None);
    // A URI longer than HTTP and gRPC take is refused, not kept.
    let long = format!("kv://{}", "k".repeat(3000));
    let r = sub.request(None, |e, h| e.subscribe(h, &long, true).to_vec());
    assert_eq!(error_code(&r), Some(-32602));
}

/// A connection subscribed to a URI in several sessions hears each update
/// once when the router's instances are shared (every session sees the
/// write): it got one identical frame per subscription.
#[test]
fn a_connection_subscribed_in_several_sessions_hears_an_update_once() {
    // kv's sessions' own keys apply to session routers only.
    let mut toml = mcp_broker::config::DEFAULT_TOML.to_string();
    for (from, to) in [
        ("\naffinity = \"session\"\n", "\naffinity = \"none\"\n"),
        ("\nmax_sessions_per_shard = 64\n", "\n"),
        ("\nsession_idle_timeout = \"10m\"\n", "\n"),
    ] {
        assert_eq!(toml.matches(from).count(), 1, "{from}");
        toml = toml.replace(from, to);
    }
    let b = Broker::start_with_config(&toml, &["--shards", "1"]);
    let mut sub = b.connect();
    for session in [None, Some("x"), Some("y")] {
        let r = sub.request(session, |e, h| e.subscribe(h, "kv://d", true).to_vec());
        assert_eq!(ResponseView::parse(&r).unwrap().error(), None);
    }
    let mut w = b.connect();
    tool_text(&w.call("put", &[("key", "\"d\""), ("value", "1")], Some("w")));
    let f = sub.read_frame().expect("a notification");
    let v = ResponseView::parse(&f).unwrap();
    assert!(
        v.response
            .payload_as_resource_updated_notification()
            .is_some()
    );
    let pong = sub.first_after_ping();
    let v = ResponseView::parse(&pong).unwrap();
    assert!(
        v.response
            .payload_as_resource_updated_notification()
            .is_none(),
        "a second notification of the same write"
    );
}

/// Closes `s` with a TCP reset (SO_LINGER 0), as a crashed client's kernel
/// does.
fn reset(s: std::net::TcpStream) {
    use std::os::fd::AsRawFd;
    unsafe extern "C" {
        fn setsockopt(fd: i32, level: i32, name: i32, value: *const i32, len: u32) -> i32;
    }
    const SOL_SOCKET: i32 = 1;
    const SO_LINGER: i32 = 13;
    let linger = [1i32, 0];
    // SAFETY: `struct linger` is two ints; the pointer is valid for the call.
    let rc = unsafe { setsockopt(s.as_raw_fd(), SOL_SOCKET, SO_LINGER, linger.as_ptr(), 8) };
    assert_eq!(rc, 0, "setsockopt(SO_LINGER)");
    drop(s);
}

#[test]
fn a_reset_connection_stops_its_calls_and_is_no_longer_counted() {
    // Its calls ran to their end (8 s here) for nobody, and the dead
    // connection stayed in mcp_connections_open, against the shard's
    // connection limit, until they did.
    let cfg = "[broker]\nshards = 1\n\n[[routers]]\nname = \"chaos\"\nwasm = \"chaos.wasm\"\ncall_deadline = \"20s\"\n";
    let b = Broker::start_with_config(cfg, &[]);
    let replaced = || b.metric_sum("mcp_router_instances_replaced_total");
    let before = replaced();
    let mut c = b.connect();
    send_tool(&mut c, "long", "sleep", &[("ms", "8000")]);
    let open = || b.metric_sum("mcp_connections_open");
    assert!(
        common::http::eventually(Duration::from_secs(5), || b
            .metric_sum("mcp_in_flight_requests")
            >= 1.0),
        "the call is running"
    );
    assert_eq!(open(), 1.0);
    let t = Instant::now();
    reset(c.stream);
    assert!(
        common::http::eventually(Duration::from_secs(5), || open() == 0.0
            && b.metric_sum("mcp_in_flight_requests") == 0.0
            && replaced() >= before + 1.0),
        "after a reset: {} open, {} in flight, {} replaced",
        open(),
        b.metric_sum("mcp_in_flight_requests"),
        replaced() - before
    );
    assert!(
        t.elapsed() < Duration::from_secs(7),
        "the call ran to its end"
    );
}

#[test]
fn instance_slots_are_reserved_for_every_shard_and_router_of_the_config() {
    // 16 shards × 64 instances = 1024 pooled instances: more than a fixed
    // reservation of 1000 slots, which refused to start such a deployment.
    let cfg = "[broker]\nshards = 16\n\n[[routers]]\nname = \"echo\"\nwasm = \"echo.wasm\"\ninstances_per_shard = 64\n";
    let b = Broker::start_with_config(cfg, &[]);
    let mut conns: Vec<Client> = (0..32).map(|_| b.connect()).collect();
    for (i, c) in conns.iter_mut().enumerate() {
        let i = i.to_string();
        assert_eq!(
            tool_text(&c.call("echo", &[("i", &i)], None)),
            format!(r#"{{"i":{i}}}"#)
        );
    }
}

#[test]
fn the_classic_ring_serves_as_the_deferred_one_does() {
    // `io_uring_defer_taskrun = false` (and kernels before 6.1, which refuse
    // the flag) build the shard's ring without DEFER_TASKRUN; the default
    // tests run with it. Pipelining and a waiting call cover reads, writes,
    // timers and a cross-thread wake-up (the WASI sleep).
    let cfg = "[broker]\nshards = 1\nio_uring_defer_taskrun = false\n\n[[routers]]\nname = \"echo\"\nwasm = \"echo.wasm\"\n\n[[routers]]\nname = \"chaos\"\nwasm = \"chaos.wasm\"\n";
    let b = Broker::start_with_config(cfg, &[]);
    let mut c = b.connect();
    assert_eq!(pipeline(&mut c, 500, "classic"), 0, "none overloaded");
    send_tool(&mut c, "nap", "sleep", &[("ms", "50")]);
    let r = c.read_final();
    assert_eq!(ResponseView::parse(&r).unwrap().error(), None);
}

#[test]
fn idle_polling_serves_every_edge_and_its_timers_fire_under_steady_load() {
    // With `idle_poll` a shard that keeps getting requests keeps polling
    // its ring instead of parking, and monoio advances its timers only when
    // it parks: the poller must let it park now and then
    // (`idle_poll::PARK_EVERY`). Steady echo traffic on one connection
    // keeps the poller polling while a call on another waits out its 1 s
    // call deadline, which must end it at the deadline, not when the load
    // stops. The ring is COOP_TASKRUN then; HTTP is served as usual.
    let cfg = "[broker]\nshards = 1\nidle_poll = \"2ms\"\n\n[[routers]]\nname = \"echo\"\nwasm = \"echo.wasm\"\n\n[[routers]]\nname = \"chaos\"\nwasm = \"chaos.wasm\"\ncall_deadline = \"1s\"\n";
    let b = Broker::start_with_config(cfg, &[]);
    let mut c = b.connect();
    assert_eq!(pipeline(&mut c, 500, "polled"), 0, "none overloaded");
    let mut h = common::http::Conn::connect(b.http);
    h.initialize("2025-11-25");

    let mut slow = b.connect();
    let sent = Instant::now();
    send_tool(&mut slow, "nap", "sleep", &[("ms", "60000")]);
    let waiter = std::thread::spawn(move || {
        let f = slow.read_final();
        (sent.elapsed(), error_code(&f))
    });
    let mut calls = 0;
    while !waiter.is_finished() && sent.elapsed() < Duration::from_secs(10) {
        assert_eq!(
            tool_text(&c.call("echo", &[("i", "1")], None)),
            r#"{"i":1}"#
        );
        calls += 1;
    }
    let (took, code) = waiter.join().unwrap();
    assert_eq!(
        code,
        Some(-32001),
        "the sleeping call ends in deadline_exceeded"
    );
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(4),
        "the 1 s deadline fired after {took:?} under load"
    );
    assert!(
        calls > 100,
        "the load ran while the call waited: {calls} calls"
    );
    let polled = b.metric_sum("mcp_shard_idle_poll_seconds_total");
    assert!(
        polled > 0.0 && polled < 60.0,
        "idle polling reported {polled} s"
    );
}

#[test]
fn slowloris_and_idle_connections_are_closed_on_time() {
    let cfg = "[frames]\nidle_timeout = \"500ms\"\npartial_frame_timeout = \"300ms\"\n\n[[routers]]\nname = \"echo\"\nwasm = \"echo.wasm\"\n";
    let b = Broker::start_with_config(cfg, &["--shards", "1"]);
    let mut slow = b.connect();
    slow.send_raw(&[50, 0, 0, 0, 1]);
    let t = Instant::now();
    assert!(slow.read_frame().is_none());
    let e = t.elapsed();
    assert!(
        e >= Duration::from_millis(250) && e < Duration::from_secs(5),
        "closed after {e:?}"
    );

    let mut idle = b.connect();
    assert_eq!(tool_text(&idle.call("echo", &[], None)), "{}");
    let t = Instant::now();
    assert!(idle.read_frame().is_none());
    let e = t.elapsed();
    assert!(
        e >= Duration::from_millis(400) && e < Duration::from_secs(5),
        "closed after {e:?}"
    );
}

#[test]
fn session_affinity_sends_one_sessions_requests_to_one_instance_across_connections() {
    // One instance per shard and two shards: without affinity, a key put
    // through one connection is absent on the other shard half the time.
    let cfg = "[broker]\nshards = 2\n\n[[routers]]\nname = \"kv\"\nwasm = \"kv.wasm\"\naffinity = \"session\"\ninstances_per_shard = 1\n";
    let b = Broker::start_with_config(cfg, &[]);
    for s in ["alpha", "beta", "gamma", "delta"] {
        let session: &'static str = Box::leak(s.to_string().into_boxed_str());
        let mut w = b.connect();
        assert_eq!(
            tool_text(&w.call(
                "put",
                &[("key", "\"k\""), ("value", &format!("\"{s}\""))],
                Some(session)
            )),
            "stored k"
        );
        // Fresh connections land on either shard (SO_REUSEPORT spreads them).
        for _ in 0..8 {
            let mut r = b.connect();
            assert_eq!(
                tool_text(&r.call("get", &[("key", "\"k\"")], Some(session))),
                format!("\"{s}\"")
            );
        }
    }
}
