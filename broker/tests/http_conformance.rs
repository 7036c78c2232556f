//! The official MCP conformance suite (npm `@modelcontextprotocol/conformance`,
//! `server` mode) against the real broker binary's Streamable HTTP edge,
//! serving the bundled `conformance` router (`broker/tests/fixtures/conformance.toml`).
//! `scripts/conformance` runs the suite and holds the outcome to a list of
//! expected failures: a failure that is not listed fails the test, and so
//! does a listed one that passes. Two suite versions: the pinned 0.1.16 (the
//! session-era revisions, `conformance/expected-failures.txt`) and
//! 0.2.0-alpha.12's protocol 2026-07-28 scenarios
//! (`conformance/expected-failures-2026-07-28.txt`, per check).
//! `docs/conformance.md` describes each scenario.
//!
//! The router-level tests below pin the conventions the suite relies on
//! (elicitation's second call, the resource template) without the edge.

mod common;
#[path = "fixtures/support.rs"]
mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::Broker;
use mcp_broker::wasm::RouterPool;
use mcp_broker::wasm::types::{ContentBlock, ResourceContents, Response};
use support::{first_text, load_bundled, on_shard};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Fails (never skips) when `scripts/setup` has not installed the Node tools.
fn node_tools_installed(root: &Path) {
    for tool in [
        ".tools/node/bin/node",
        "tools/node/node_modules/@modelcontextprotocol/conformance/dist/index.js",
        "tools/node/node_modules/conformance-next/dist/index.js",
    ] {
        assert!(
            root.join(tool).exists(),
            "{tool} is missing: run scripts/setup (it installs Node >= 22 and the pinned \
             @modelcontextprotocol/conformance releases) before this test"
        );
    }
}

/// A broker serving the conformance router alone.
fn conformance_broker() -> Broker {
    // Fails with "run scripts/build-routers" when conformance.wasm is missing.
    support::bundled("conformance");
    let broker = Broker::start_with_config(include_str!("fixtures/conformance.toml"), &[]);
    assert_eq!(
        broker.routers,
        ["conformance"],
        "{}: the fixture serves the conformance router alone, so its names are unqualified",
        broker.ready_line
    );
    broker
}

/// Runs `scripts/conformance ARGS URL` against a broker serving the
/// conformance router alone, and asserts it passed; returns its stdout.
fn run_conformance(suite_args: &[&str]) -> String {
    let broker = conformance_broker();
    run_conformance_at(&broker.mcp_url(), suite_args)
}

/// Runs `scripts/conformance ARGS URL` against `url`, and asserts it
/// passed; returns its stdout.
fn run_conformance_at(url: &str, suite_args: &[&str]) -> String {
    let root = repo_root();
    node_tools_installed(&root);
    // The suite's per-scenario results go under the target directory, not
    // a fresh directory in /tmp per run: kept when the run fails (the
    // message names them), removed when it passes.
    let slug: String = suite_args
        .join("_")
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    // Tests run in parallel, some with the same suite: the server's port
    // tells their runs apart.
    let port: String = url.chars().filter(char::is_ascii_digit).collect();
    let results = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("conformance-{}-{port}-{slug}", std::process::id()));
    let _ = std::fs::remove_dir_all(&results);
    let out = Command::new(root.join("scripts/conformance"))
        .args(suite_args)
        .arg(url)
        // Bounds the run: the script kills the suite past this many seconds.
        .env("CONFORMANCE_TIMEOUT", "300")
        .env("CONFORMANCE_OUTPUT_DIR", &results)
        .output()
        .expect("run scripts/conformance");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "scripts/conformance {suite_args:?} {url} failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    // The run really happened: the suite printed its summary.
    assert!(stdout.contains("=== SUMMARY ==="), "{stdout}\n{stderr}");
    let _ = std::fs::remove_dir_all(&results);
    stdout.into_owned()
}

#[test]
fn official_conformance_suite_fails_exactly_the_listed_scenarios() {
    let stdout = run_conformance(&[]);
    assert!(stdout.contains("Baseline check passed"), "{stdout}");
}

/// Both suites through an `upstream` router: a broker whose one router
/// fronts another broker serving the conformance router, in protocol
/// 2026-07-28 (found by `server/discover`). Every scenario passes or fails
/// as it does against the conformance router directly: the same lists of
/// expected failures hold. The session-era suite's elicitation and
/// sampling, and the 2026-07-28 suite's input requests, travel as the
/// inner broker's questions, passed on by the router as sets.
#[test]
fn both_suites_pass_alike_through_an_upstream_router_speaking_2026_07_28() {
    let inner = conformance_broker();
    let outer_toml = format!(
        "[frames]\nlisten = \"127.0.0.1:0\"\n[grpc]\nlisten = \"127.0.0.1:0\"\n\
         [metrics]\nlisten = \"127.0.0.1:0\"\n[http]\nlisten = \"127.0.0.1:0\"\n\
         [[routers]]\nname = \"conformance\"\nupstream = \"{}\"\nupstream_protocol = \"2026-07-28\"\n",
        inner.mcp_url()
    );
    let outer = Broker::start_with_config(&outer_toml, &[]);
    assert_eq!(outer.routers, ["conformance"], "{}", outer.ready_line);
    let stdout = run_conformance_at(&outer.mcp_url(), &[]);
    assert!(stdout.contains("Baseline check passed"), "{stdout}");
    let stdout = run_conformance_at(&outer.mcp_url(), &["--suite-version", "next"]);
    assert!(
        stdout.contains("distinct failing checks, all listed"),
        "{stdout}"
    );
}

#[test]
fn conformance_suite_2026_07_28_scenarios_fail_exactly_the_listed_checks() {
    let stdout = run_conformance(&["--suite-version", "next"]);
    // The 2026-07-28 scenarios ran, and the per-check comparison passed.
    for scenario in [
        "server-stateless",
        "caching",
        "http-header-validation",
        "input-required-result-basic-sampling",
    ] {
        assert!(
            stdout.contains(&format!("=== Running scenario: {scenario} ===")),
            "{scenario} did not run:\n{stdout}"
        );
    }
    assert!(
        stdout.contains("distinct failing checks, all listed"),
        "{stdout}"
    );
}

#[test]
fn conformance_router_lists_every_fixture_the_suite_calls() {
    let router = load_bundled("conformance", 1, 0);
    let meta = router.meta();
    let tools: Vec<&str> = meta.tools.iter().map(|t| t.name.as_str()).collect();
    for name in [
        "test_simple_text",
        "test_image_content",
        "test_audio_content",
        "test_embedded_resource",
        "test_multiple_content_types",
        "test_tool_with_logging",
        "test_tool_with_progress",
        "test_error_handling",
        "test_reconnection",
        "test_sampling",
        "test_elicitation",
        "test_elicitation_sep1034_defaults",
        "test_elicitation_sep1330_enums",
        "json_schema_2020_12_tool",
        // The 2026-07-28 scenarios of suite 0.2.0-alpha.12.
        "test_missing_capability",
        "test_streaming_elicitation",
        "test_logging_tool",
        "test_input_required_result_elicitation",
        "test_input_required_result_sampling",
        "test_input_required_result_capabilities",
    ] {
        assert!(tools.contains(&name), "tool {name} missing from {tools:?}");
    }
    let resources: Vec<&str> = meta.resources.iter().map(|r| r.uri.as_str()).collect();
    for uri in [
        "test://static-text",
        "test://static-binary",
        "test://watched-resource",
        "test://template/{id}/data",
    ] {
        assert!(
            resources.contains(&uri),
            "resource {uri} missing from {resources:?}"
        );
    }
    let prompts: Vec<&str> = meta.prompts.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(
        prompts,
        [
            "test_simple_prompt",
            "test_prompt_with_arguments",
            "test_prompt_with_embedded_resource",
            "test_prompt_with_image"
        ]
    );
}

#[test]
fn conformance_router_elicits_first_and_reports_the_answer_on_the_second_call() {
    let pool = RouterPool::new(load_bundled("conformance", 1, 0));
    on_shard(async {
        let first = pool
            .call_tool("test_elicitation", r#"{"message":"Who are you?"}"#)
            .await
            .expect("first call answers");
        let Response::Elicit(e) = first else {
            panic!("the first call must elicit, got {first:?}");
        };
        assert_eq!(e.message, "Who are you?");
        let schema: serde_json::Value = serde_json::from_str(&e.schema).unwrap();
        assert_eq!(schema["required"], serde_json::json!(["username", "email"]));
        let second = pool
            .call_tool(
                "test_elicitation",
                r#"{"message":"Who are you?","_elicitation":{"action":"accept","content":{"username":"ada","email":"ada@example.com"}}}"#,
            )
            .await
            .expect("second call answers");
        assert_eq!(
            first_text(&second),
            r#"User response: action=accept, content={"email":"ada@example.com","username":"ada"}"#
        );
        let declined = pool
            .call_tool(
                "test_elicitation_sep1034_defaults",
                r#"{"_elicitation":{"action":"decline"}}"#,
            )
            .await
            .unwrap();
        assert_eq!(
            first_text(&declined),
            "Elicitation completed: action=decline, content={}"
        );
    });
}

#[test]
fn conformance_router_fills_its_template_and_refuses_other_uris() {
    let pool = RouterPool::new(load_bundled("conformance", 1, 0));
    on_shard(async {
        let r = pool
            .read_resource("test://template/123/data")
            .await
            .expect("template read");
        let [ResourceContents::Text(t)] = r.contents.as_slice() else {
            panic!("one text content expected, got {r:?}");
        };
        assert_eq!(t.uri, "test://template/123/data");
        let v: serde_json::Value = serde_json::from_str(&t.text).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"id":"123","templateTest":true,"data":"Data for ID: 123"})
        );
        for bad in [
            "test://template//data",
            "test://template/1/2/data",
            "test://nope",
        ] {
            assert!(
                pool.read_resource(bad).await.is_err(),
                "{bad} must not read"
            );
        }
    });
}

#[test]
fn conformance_router_sends_progress_with_its_result() {
    let pool = RouterPool::new(load_bundled("conformance", 1, 0));
    let r = on_shard(pool.call_tool("test_tool_with_progress", "{}")).unwrap();
    let Response::Completed(t) = r else {
        panic!("progress tool completes");
    };
    let steps: Vec<Option<f32>> = t.progress.unwrap().iter().map(|p| p.progress).collect();
    assert_eq!(steps, [Some(0.0), Some(0.5), Some(1.0)]);
    assert!(matches!(t.content.first(), Some(ContentBlock::Text(_))));
}

#[test]
fn conformance_router_asks_for_sampling_first_and_reports_the_answer_on_the_second_call() {
    let pool = RouterPool::new(load_bundled("conformance", 1, 0));
    on_shard(async {
        for tool in [
            "test_input_required_result_sampling",
            "test_input_required_result_capabilities",
            "test_missing_capability",
        ] {
            let first = pool
                .call_tool(tool, "{}")
                .await
                .expect("first call answers");
            let Response::Completed(t) = &first else {
                panic!(
                    "{tool}: the first call must complete with a sampling request, got {first:?}"
                );
            };
            let asked = t
                .meta
                .iter()
                .flatten()
                .find(|m| m.key == "mcp-broker/sample")
                .unwrap_or_else(|| panic!("{tool}: no mcp-broker/sample in {t:?}"));
            let params: serde_json::Value = serde_json::from_str(&asked.value).unwrap();
            assert!(params["maxTokens"].is_u64(), "{tool}: {params}");
            assert_eq!(params["messages"][0]["role"], "user", "{tool}: {params}");
            let second = pool
                .call_tool(
                    tool,
                    r#"{"_sampling":{"role":"assistant","content":{"type":"text","text":"Paris."},"model":"m","stopReason":"endTurn"}}"#,
                )
                .await
                .expect("second call answers");
            assert_eq!(first_text(&second), "LLM response: Paris.", "{tool}");
        }
    });
}
