//! Inputs built to make the broker do unbounded work, end to end through
//! the real binary: prompt arguments that expand each other, listing
//! cursors at the integer limit, argument values that add keys, and router
//! answers that alias one big string many times.

mod common;

use common::{Broker, error_code, tool_text};
use mcp_schema::client::{Listing, ResponseView};

/// The library and chaos routers, with `extra` TOML before them.
fn config(extra: &str) -> String {
    format!(
        "[broker]\nshards = 1\n{extra}\n\
         [[routers]]\nname = \"library\"\nwasm = \"library.wasm\"\n\n\
         [[routers]]\nname = \"echo\"\nwasm = \"echo.wasm\"\n\n\
         [[routers]]\nname = \"chaos\"\nwasm = \"chaos.wasm\"\ninstances_per_shard = 1\n"
    )
}

/// The error message of an error response.
fn error_message(frame: &[u8]) -> String {
    let (_, msg) = ResponseView::parse(frame)
        .unwrap()
        .error()
        .expect("an error");
    msg.to_string()
}

/// `VmHWM` (peak resident set) of process `pid`, in KiB.
fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/<pid>/status")
}

#[test]
fn nested_prompt_arguments_are_filled_once_not_expanded() {
    let b = Broker::start_with_config(&config(""), &[]);
    let mut c = b.connect();
    // book_id holds eight {{l1}}, each l<n> eight {{l<n+1>}}: expanded
    // level by level that is 8^6 placeholders, megabytes from 300 bytes.
    let level = |n: usize| format!("\"{}\"", format!("{{{{l{n}}}}}").repeat(8));
    let values: Vec<String> = (1..=6).map(level).collect();
    let mut args: Vec<(String, &str)> = vec![("book_id".into(), values[0].as_str())];
    for (n, v) in values.iter().enumerate().skip(1) {
        args.push((format!("l{n}"), v.as_str()));
    }
    args.push(("l6".into(), "\"x\""));
    args.push(("style".into(), "\"brief\""));
    let kvs: Vec<(&str, &str)> = args.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    let r = c.request(None, |e, h| {
        e.get_prompt(h, "summarize_book", &kvs).to_vec()
    });
    assert!(r.len() < 16 << 10, "answer of {} bytes", r.len());
    let applied = ResponseView::parse(&r)
        .unwrap()
        .response
        .payload_as_applied_prompt()
        .expect("an AppliedPrompt");
    let text = applied
        .filled_content_as_text_content()
        .expect("text")
        .text();
    assert_eq!(
        text,
        format!(
            "Summarize the book library://books/{} in a brief style.",
            "{{l1}}".repeat(8)
        )
    );
}

#[test]
fn a_filled_prompt_larger_than_a_frame_is_invalid_params() {
    let b = Broker::start_with_config(&config("[frames]\nmax_frame_bytes = 65536\n"), &[]);
    let mut c = b.connect();
    // 40 KB fits a request frame; filled into both messages it is 80 KB.
    let big = format!("\"{}\"", "b".repeat(40_000));
    let r = c.request(None, |e, h| {
        e.get_prompt(
            h,
            "summarize_book",
            &[("book_id", &big), ("style", "\"x\"")],
        )
        .to_vec()
    });
    assert_eq!(error_code(&r), Some(-32602));
    assert!(error_message(&r).contains("65536"), "{}", error_message(&r));
    // The same prompt with small arguments is still served.
    let r = c.request(None, |e, h| {
        e.get_prompt(h, "summarize_book", &[("book_id", "\"dune\"")])
            .to_vec()
    });
    assert_eq!(error_code(&r), None);
}

#[test]
fn a_cursor_at_the_integer_limit_is_invalid_params() {
    let b = Broker::start_with_config(&config(""), &[]);
    let mut c = b.connect();
    for cursor in ["o18446744073709551615", "o18446744073709551616", "o999"] {
        for what in [Listing::Tools, Listing::Prompts, Listing::Resources] {
            let r = c.request(None, |e, h| e.list(h, what, Some(cursor)).to_vec());
            assert_eq!(error_code(&r), Some(-32602), "{cursor} {what:?}");
        }
    }
    // The shard is alive and pages from the start as before.
    let r = c.request(None, |e, h| e.list(h, Listing::Tools, None).to_vec());
    assert_eq!(error_code(&r), None);
}

#[test]
fn an_argument_value_that_adds_keys_is_invalid_params_naming_it() {
    let b = Broker::start_with_config(&config(""), &[]);
    let mut c = b.connect();
    for (key, value) in [
        ("a", r#"1,"admin":true"#),
        ("b", r#""x"}, {"admin":true"#),
        ("c", "1 2"),
        ("d", "[1,"),
    ] {
        let r = c.call("echo", &[("ok", "1"), (key, value)], None);
        assert_eq!(error_code(&r), Some(-32602), "{value}");
        let msg = error_message(&r);
        assert!(msg.contains(&format!("`{key}`")), "{msg}");
        assert!(msg.ends_with("is not exactly one JSON value"), "{msg}");
    }
    // Too deep is told apart from malformed, so that a client knows which
    // to fix: one level past the bound, with a fault after it still says
    // depth (the scan stops there).
    let deep = "[".repeat(127) + &"]".repeat(127);
    for value in [deep.clone(), deep.replace("[]", "[1,]")] {
        let r = c.call("echo", &[("t", &value)], None);
        assert_eq!(error_code(&r), Some(-32602));
        let msg = error_message(&r);
        assert_eq!(msg, "argument `t` nests arrays and objects deeper than 126");
    }
    // Values that are one JSON value each, spaced or empty, pass as before.
    let r = c.call("echo", &[("a", " [1, {\"b\": null}] "), ("e", "")], None);
    assert_eq!(tool_text(&r), r#"{"a": [1, {"b": null}] ,"e":null}"#);
}

#[test]
fn an_answer_past_max_result_bytes_is_a_router_fault_and_memory_stays_bounded() {
    let b = Broker::start_with_config(&config(""), &[]);
    let mut c = b.connect();
    // 1000 blocks pointing at one 32 MiB string: a naive lift copies
    // 32 GiB. Refused as a router fault while being measured.
    let before = peak_rss_kib(b.child.id());
    let r = c.call("fanout", &[("blocks", "1000"), ("bytes", "33554432")], None);
    assert_eq!(error_code(&r), Some(-32002), "{}", error_message(&r));
    let msg = error_message(&r);
    assert!(msg.contains("max_result_bytes"), "{msg}");
    let after = peak_rss_kib(b.child.id());
    // The guest's own 32 MiB string is resident in its linear memory; the
    // host adds at most the 4 MiB budget on top.
    assert!(
        after < before + (256 << 10),
        "peak RSS grew from {before} KiB to {after} KiB"
    );

    // Aliasing counts once per reference: five blocks of one 1 MiB string
    // are 5 MiB to copy, past the 4 MiB default, though the guest holds 1.
    let r = c.call("fanout", &[("blocks", "5"), ("bytes", "1048576")], None);
    assert_eq!(error_code(&r), Some(-32002), "{}", error_message(&r));

    // The faulted instances were replaced: the router still answers, and
    // an answer within the budget comes back whole. (Last: a guest whose
    // aliased answer is accepted frees the string once per block, which
    // corrupts its own heap.)
    let r = c.call("fanout", &[("blocks", "1"), ("bytes", "10")], None);
    assert_eq!(tool_text(&r), "x".repeat(10));
    let r = c.call("fanout", &[("blocks", "3"), ("bytes", "1000")], None);
    let tr = ResponseView::parse(&r)
        .unwrap()
        .response
        .payload_as_tool_result()
        .expect("a ToolResult");
    assert_eq!(mcp_schema::content_vec::content(&tr).unwrap().len(), 3);
}
