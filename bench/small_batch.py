#!/usr/bin/env python3
"""bench/small_batch.py: what one request costs each frame (or gRPC) server in
open loop (issue 15, items 3 and 5), counted by the kernel.

Starts echo-baseline, broker-native and broker-wasm (scripts/bench's servers,
one shard on the upper CPU) -- or, with EDGE=grpc, tonic-baseline and the
broker's gRPC edge -- and drives each in turn with mcp-loadgen open
loop at RATE over 16 connections for a fixed number of requests, with
`perf stat` attached to the server process for exactly that run. Prints,
per request: on-CPU time, context switches, all syscalls, io_uring_enter
calls, io_uring submissions and completions, task-work runs and wake-ups
the server's threads issued; and the on-CPU time per request of each of
the server's threads (which thread pays).

  bench/small_batch.py [RATE] [SECONDS] [ROUNDS] [EDGE]   (default 60000 5 3 frames)

Needs `perf` with tracepoint access (run as root, or lower
/proc/sys/kernel/perf_event_paranoid) and the release binaries (scripts/bench
builds them). Stdlib only.
"""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import tls_http_probe as P  # noqa: E402

B = P.B
# The TLS probe's ring events, plus task work run outside the ring and the
# wake-ups the server's threads issue.
EVENTS = P.EVENTS + ["io_uring:io_uring_task_work_run", "sched:sched_wakeup"]
CONNECTIONS = 16


def run(server, rate, seconds, lg_cpus, wd, tag):
    """One measured open-loop run; returns ({event: per request},
    {thread: CPU µs per request}, loadgen report)."""
    requests = int(rate * seconds)
    argv = [B.LOADGEN, "--target", f"{server.scheme}://{server.addr}", *B.TOOL_ARGS,
            "--cpus", ",".join(map(str, lg_cpus)), "--connections", str(CONNECTIONS),
            "--rate", str(rate), "-q"]
    # Warm: instances, buffers, the ring's registered state.
    subprocess.run(argv + ["--requests", str(min(requests, 20_000))], capture_output=True)
    report = os.path.join(wd, f"{tag}.json")
    per, threads, r = P.perf_run(server.proc.pid,
                                 argv + ["--requests", str(requests), "--json", report],
                                 requests, os.path.join(wd, f"{tag}.perf"), EVENTS)
    if r.returncode != 0:
        sys.exit(f"{server.name}: mcp-loadgen failed: {r.stderr[-800:]}")
    with open(report) as f:
        rep = json.load(f)
    return per, threads, rep


def main():
    rate = int(sys.argv[1]) if len(sys.argv) > 1 else 60_000
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 5
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    edge = sys.argv[4] if len(sys.argv) > 4 else "frames"
    srv_cpus, lg_cpus = B.cpu_split(os.cpu_count() or 2)
    srv_cpus = srv_cpus[:1]
    wd = tempfile.mkdtemp(prefix="small-batch-")
    servers = {}
    try:
        if edge == "grpc":
            # As scripts/bench --slo starts them: both pinned whole.
            servers["tonic-baseline"] = B.start_tonic(wd, 1, srv_cpus)
            servers["broker-grpc"] = B.start_broker("broker-grpc", wd, 1, srv_cpus, False,
                                                    addr_key="grpc", pin_process=True)
        elif edge == "frames":
            servers["echo-baseline"] = B.start_echo(wd, 1, srv_cpus)
            servers["broker-native"] = B.start_broker("broker-native", wd, 1, srv_cpus, True)
            servers["broker-wasm"] = B.start_broker("broker-wasm", wd, 1, srv_cpus, False)
        else:
            sys.exit(f"EDGE must be frames or grpc, not {edge!r}")
        for s in servers.values():
            s.scheme = edge
        res = {n: [] for n in servers}
        for rnd in range(rounds):
            for n in B.rotate(sorted(servers), rnd):
                per, threads, rep = run(servers[n], rate, seconds, lg_cpus, wd, f"{n}-{rnd}")
                lat = rep.get("latency_us") or {}
                B.log(f"{n} round {rnd}: {per['task-clock']:.2f} µs/request, p99 "
                      f"{lat.get('p99')} µs, kept up {rep.get('kept_up')}, errors "
                      f"{rep.get('errors')}")
                res[n].append((per, threads))
    finally:
        for s in servers.values():
            s.stop()
    print(f"Open loop at {rate:,} req/s, {CONNECTIONS} connections, {rate * seconds:,.0f} "
          f"requests per run; medians of {rounds} rounds, per request:\n")
    cols = EVENTS
    print("| server | " + " | ".join(c.split(":")[-1] for c in cols) + " |")
    print("|---" * (len(cols) + 1) + "|")
    for n, runs in res.items():
        cells = []
        for c in cols:
            v = B.med([p.get(c, 0) for p, _ in runs])
            cells.append(f"{v:.2f}" if c == "task-clock" else f"{v:.3f}")
        print(f"| {n} | " + " | ".join(cells) + " |")
    print("\nOn-CPU µs per request by thread, and its user / kernel split (medians):\n")
    for n, runs in res.items():
        names = sorted({t for _, th in runs for t in th if not t.endswith((".user", ".sys"))})
        parts = []
        for t in names:
            m = {k: B.med([th.get(t + k, 0) for _, th in runs]) for k in ("", ".user", ".sys")}
            if m[""] >= 0.005:
                parts.append(f"{t} {m['']:.2f} (user {m['.user']:.2f}, kernel {m['.sys']:.2f})")
        print(f"- {n}: " + ", ".join(parts))


if __name__ == "__main__":
    main()
