//! Fault injection for the tests of the broker's own failure handling.
//!
//! Compiled into debug builds only (the ones `cargo test` runs); release
//! builds get empty functions, so production binaries carry no backdoor.
//! Each fault is armed by an environment variable naming a tool; a
//! `tools/call` of that name (before any routing) then:
//! - `MCP_BROKER_TEST_PANIC_TOOL`: panics inside the request's handler,
//!   which the shard must turn into a -32603 answer and survive;
//! - `MCP_BROKER_TEST_KILL_SHARD_TOOL`: panics in the shard's reader,
//!   outside any handler, which kills the shard thread (then `/readyz`
//!   must turn 503 and the process must exit non-zero);
//! - `MCP_BROKER_TEST_STALL_TOOL=name:ms`: blocks the thread of the shard
//!   running the call for `ms` milliseconds, as a shard too busy to turn
//!   to its inbox would be, then routes the call as usual.

#[cfg(debug_assertions)]
mod imp {
    use std::cell::Cell;
    use std::sync::OnceLock;

    fn armed(var: &'static str, cell: &'static OnceLock<Option<String>>) -> Option<&'static str> {
        cell.get_or_init(|| std::env::var(var).ok().filter(|v| !v.is_empty()))
            .as_deref()
    }

    static PANIC_TOOL: OnceLock<Option<String>> = OnceLock::new();
    static KILL_TOOL: OnceLock<Option<String>> = OnceLock::new();
    static STALL_TOOL: OnceLock<Option<String>> = OnceLock::new();

    thread_local! {
        static KILL: Cell<bool> = const { Cell::new(false) };
    }

    pub fn on_tool_call(name: &str) {
        if armed("MCP_BROKER_TEST_PANIC_TOOL", &PANIC_TOOL) == Some(name) {
            panic!("fault injection: handler panic for tool `{name}`");
        }
        if armed("MCP_BROKER_TEST_KILL_SHARD_TOOL", &KILL_TOOL) == Some(name) {
            KILL.with(|k| k.set(true));
        }
        if let Some((tool, ms)) =
            armed("MCP_BROKER_TEST_STALL_TOOL", &STALL_TOOL).and_then(|v| v.split_once(':'))
            && tool == name
        {
            let ms = ms.parse().expect("MCP_BROKER_TEST_STALL_TOOL=name:ms");
            std::thread::sleep(std::time::Duration::from_millis(ms));
        }
    }

    pub fn kill_shard_if_asked() {
        if KILL.with(|k| k.replace(false)) {
            panic!("fault injection: shard killed");
        }
    }
}

#[cfg(not(debug_assertions))]
mod imp {
    #[inline(always)]
    pub fn on_tool_call(_name: &str) {}
    #[inline(always)]
    pub fn kill_shard_if_asked() {}
}

/// Called by the frame reader after each frame, outside the unwind guard.
pub use imp::kill_shard_if_asked;
/// Called by the dispatcher for every `tools/call`, before routing.
pub use imp::on_tool_call;
