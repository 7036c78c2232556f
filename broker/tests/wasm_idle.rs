//! The epoch ticker parks while no guest code runs, and a guest that starts
//! while it is parked is still cut at its deadline (`broker/src/wasm/ticker.rs`).
//!
//! A test binary of its own: the ticker watches every thread of the process
//! that runs guest code, so the other `wasm_*` tests would keep it awake.

#[path = "fixtures/support.rs"]
mod support;

use std::sync::mpsc;
use std::time::{Duration, Instant};

use mcp_broker::wasm::{CallError, HostConfig, NEVER_WAITS_MAX_RUN, RouterPool, WasmHost};
use support::{bundled, on_shard};

/// The ticker thread's voluntary context switches, from `/proc`.
fn ticker_wakeups() -> u64 {
    for task in std::fs::read_dir("/proc/self/task").expect("/proc/self/task") {
        let dir = task.unwrap().path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        if comm.trim() != "wasm-epoch" {
            continue;
        }
        let status = std::fs::read_to_string(dir.join("status")).unwrap();
        let line = status
            .lines()
            .find(|l| l.starts_with("voluntary_ctxt_switches:"))
            .expect("voluntary_ctxt_switches in /proc status");
        return line.split_whitespace().nth(1).unwrap().parse().unwrap();
    }
    panic!("no wasm-epoch thread in this process");
}

/// Waits (bounded) until the host's ticker has parked.
fn until_parked(host: &WasmHost) {
    let start = Instant::now();
    while !host.epoch_ticker_parked() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the epoch ticker never parked on an idle host"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Runs `loop` (a guest that spins without host calls) on `pool`'s router
/// on a shard thread of its own and returns its error, failing when it has
/// not ended within 60 s: with the epoch standing still, nothing would end it.
fn run_loop(pool_of: impl FnOnce() -> RouterPool + Send + 'static) -> CallError {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let pool = pool_of();
        let r = on_shard(pool.call_tool_within("loop", "{}", Duration::from_millis(300)));
        let _ = tx.send(r);
    });
    match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(r) => r.expect_err("`loop` never returns"),
        Err(_) => panic!("a guest started while the ticker was parked ran on unbounded"),
    }
}

#[test]
fn the_ticker_parks_when_idle_and_wakes_for_a_runaway_guest() {
    let host: &'static WasmHost = Box::leak(Box::new(
        WasmHost::new(&HostConfig {
            max_instances: 20,
            ..HostConfig::default()
        })
        .expect("wasm host starts"),
    ));
    let load = |never_waits: bool| {
        let mut spec = bundled("chaos");
        spec.instances_per_shard = 1;
        spec.never_waits = never_waits;
        host.load(&spec)
            .unwrap_or_else(|e| panic!("loading chaos: {e}"))
    };
    let (fiber, sync) = (load(false), load(true));

    // Idle: the ticker parks, and then stays asleep. In one full-suite run
    // on the loaded 2-core VM a window saw 51 wake-ups: one wake (from a
    // guest poll not yet identified) and the 50 ticks of `PARK_AFTER` before
    // it parked again. So up to three windows are tried; a ticker that does
    // not stay parked (≈ 300 wake-ups a window) fails every one.
    let mut woke = Vec::new();
    let quiet = (0..3).any(|_| {
        until_parked(host);
        let before = ticker_wakeups();
        std::thread::sleep(Duration::from_millis(300));
        let n = ticker_wakeups() - before;
        woke.push(n);
        n <= 2 && host.epoch_ticker_parked()
    });
    assert!(
        quiet,
        "a parked ticker woke {woke:?} times in three 300 ms windows"
    );

    // A guest on a fiber, begun while the ticker is parked, yields and is
    // cut at its deadline.
    let e = run_loop(move || RouterPool::new(fiber));
    assert!(
        matches!(e, CallError::DeadlineExceeded(d) if d == Duration::from_millis(300)),
        "{e:?}"
    );

    // The same for a `never_waits` guest on the shard's own stack: the run
    // limit, counted in ticks, needs the ticker awake too.
    until_parked(host);
    let e = run_loop(move || RouterPool::new(sync));
    assert!(
        matches!(e, CallError::DeadlineExceeded(d) if d == NEVER_WAITS_MAX_RUN),
        "{e:?}"
    );

    // And it parks again once the guests are gone.
    until_parked(host);
}
