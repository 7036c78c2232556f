//! One pooled `call-tool` round trip through the `echo` router with a
//! 256-byte argument object (target ≤ 1 µs median), and a call that traps
//! plus the replacement of the trapped instance (target ≤ 20 µs).
//!
//! Needs the bundled routers: run `scripts/build-routers` first.

use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use criterion::{Criterion, criterion_group, criterion_main};
use mcp_broker::wasm::{CallError, HostConfig, RouterPool, RouterSpec, WasmHost};

/// Polls until ready. The benchmarked calls never wait on a timer or I/O, so
/// this spins at most a few times; it keeps executor overhead out of the
/// figure.
fn run<F: Future>(fut: F) -> F::Output {
    let mut fut = pin!(fut);
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
            return v;
        }
    }
}

/// A JSON object of exactly 256 bytes.
fn args_256() -> String {
    let head = r#"{"query":"select","limit":10,"padding":""#;
    let tail = r#""}"#;
    let pad = 256 - head.len() - tail.len();
    let s = format!("{head}{}{tail}", "x".repeat(pad));
    assert_eq!(s.len(), 256);
    s
}

fn spec(name: &str) -> RouterSpec {
    let spec = RouterSpec::bundled(name);
    assert!(
        spec.wasm.is_file(),
        "{} missing: run scripts/build-routers",
        spec.wasm.display()
    );
    spec
}

fn bench(c: &mut Criterion) {
    // A small pool (the four pools below, one instance each, plus the
    // transient instance of each load): the call path does not depend on its
    // size, and valgrind cannot reserve the default pool's terabytes of
    // address space, so `valgrind --tool=callgrind` can count a call's
    // instructions (bench/results/wasm-host.md), which wall time on a shared
    // VM does not resolve.
    let config = HostConfig {
        max_instances: 10,
        ..HostConfig::default()
    };
    let host = WasmHost::new(&config).expect("host");
    let args = args_256();

    let mut echo = spec("echo");
    echo.instances_per_shard = 1;
    let pool = RouterPool::new(host.load(&echo).expect("echo loads"));
    run(pool.warm()).expect("warm");
    c.bench_function("wasm_call/echo_256B", |b| {
        b.iter(|| run(pool.call_tool("echo", black_box(&args))).expect("echo"))
    });

    echo.never_waits = true;
    let sync = RouterPool::new(host.load(&echo).expect("echo loads"));
    run(sync.warm()).expect("warm");
    // Every call moves this future into its caller's (bench/results/wasm-host.md).
    eprintln!(
        "wasm_call: a pooled call_tool future is {} bytes",
        std::mem::size_of_val(&sync.call_tool("echo", &args))
    );
    c.bench_function("wasm_call/echo_256B_never_waits", |b| {
        b.iter(|| run(sync.call_tool("echo", black_box(&args))).expect("echo"))
    });
    echo.never_waits = false;

    echo.validate_json = false;
    let raw = RouterPool::new(host.load(&echo).expect("echo loads"));
    run(raw.warm()).expect("warm");
    c.bench_function("wasm_call/echo_256B_no_json_check", |b| {
        b.iter(|| run(raw.call_tool("echo", black_box(&args))).expect("echo"))
    });

    let mut chaos = spec("chaos");
    chaos.instances_per_shard = 1;
    let chaos = RouterPool::new(host.load(&chaos).expect("chaos loads"));
    run(chaos.warm()).expect("warm");
    c.bench_function("wasm_call/trap_and_replace", |b| {
        b.iter(|| {
            let e = run(chaos.call_tool("trap", "{}")).unwrap_err();
            assert!(matches!(e, CallError::Trap(_)));
        })
    });
    let s = chaos.stats();
    assert_eq!(s.replaced, s.faults, "every trap replaced its instance");
}

criterion_group!(benches, bench);
criterion_main!(benches);
