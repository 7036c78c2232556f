#!/usr/bin/env python3
"""bench/small_batch.py: what one request costs each frame (or gRPC) server in
open loop (issue 15, items 3 and 5), counted by the kernel.

Starts echo-baseline, broker-native and broker-wasm (scripts/bench's servers,
one shard on the upper CPU) -- or, with EDGE=grpc, tonic-baseline and the
broker's gRPC edge; with EDGE=http, the broker's HTTP edge and rmcp-baseline,
each in both protocol eras -- and drives each in turn with mcp-loadgen open
loop at RATE over 16 connections for a fixed number of requests, with
`perf stat` attached to the server process for exactly that run. Prints,
per request: on-CPU time, context switches, all syscalls, io_uring_enter
calls, io_uring submissions and completions, task-work runs and wake-ups
the server's threads issued; and the on-CPU time per request of each of
the server's threads (which thread pays).

  bench/small_batch.py [RATE] [SECONDS] [ROUNDS] [EDGE]   (default 60000 5 3 frames)

With WARM=1 every server is also measured a second time in each round
("+warm" rows) with a SCHED_IDLE busy loop on its CPU: the loop yields to
the server the moment it wakes, and does nothing else, but the CPU never
goes idle, so a (virtual) CPU is never halted between two requests. The
difference between a server's two rows is what its wake-ups from idle cost
it (the hypervisor's halt and wake-up, and caches cooled while the CPU was
given away); the loop's own CPU time is not the server's and is not counted.

Needs `perf` with tracepoint access (run as root, or lower
/proc/sys/kernel/perf_event_paranoid) and the release binaries (scripts/bench
builds them). Stdlib only.
"""
import json
import os
import subprocess
import sys
import tempfile
import types

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import tls_http_probe as P  # noqa: E402

B = P.B
# The TLS probe's ring events, plus task work run outside the ring and the
# wake-ups the server's threads issue.
EVENTS = P.EVENTS + ["io_uring:io_uring_task_work_run", "sched:sched_wakeup"]
CONNECTIONS = 16


def spinner(cpu):
    """A busy loop on `cpu` at SCHED_IDLE: it runs only when nothing else
    there wants to, so it keeps the CPU out of its idle state without taking
    time from the server."""
    def idle():
        os.sched_setaffinity(0, {cpu})
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    return subprocess.Popen([sys.executable, "-c", "while True: pass"], preexec_fn=idle)


def run(server, rate, seconds, lg_cpus, wd, tag):
    """One measured open-loop run; returns ({event: per request},
    {thread: CPU µs per request}, loadgen report)."""
    requests = int(rate * seconds)
    argv = [B.LOADGEN, "--target", server.target, *B.TOOL_ARGS, *server.extra,
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
        elif edge == "http":
            # As scripts/bench --slo starts them: both pinned whole.
            http = B.start_broker("broker-http", wd, 1, srv_cpus, False, addr_key="http",
                                  pin_process=True)
            rmcp = B.Server("rmcp-baseline", [B.RMCP, "--listen", "127.0.0.1:0"], wd,
                            addr_key="http", cpus=srv_cpus)
            # One entry per era, sharing the server process.
            for s in (http, rmcp):
                for era in B.ERAS:
                    servers[f"{s.name} {era}"] = types.SimpleNamespace(
                        name=s.name, proc=s.proc, addr=s.addr, target=f"http://{s.addr}/mcp",
                        extra=["--mcp-version", era], stop=s.stop)
        else:
            sys.exit(f"EDGE must be frames, grpc or http, not {edge!r}")
        for s in servers.values():
            if edge != "http":
                s.target, s.extra = f"{edge}://{s.addr}", []
        warm = os.environ.get("WARM") == "1"
        variants = [(n, False) for n in sorted(servers)]
        if warm:
            variants += [(n, True) for n in sorted(servers)]
        res = {n + (" +warm" if w else ""): [] for n, w in variants}
        for rnd in range(rounds):
            for base, w in B.rotate(variants, rnd):
                n = base + (" +warm" if w else "")
                spin = spinner(srv_cpus[0]) if w else None
                try:
                    per, threads, rep = run(servers[base], rate, seconds, lg_cpus, wd,
                                            f"{n.replace(' +', '-')}-{rnd}")
                finally:
                    if spin:
                        spin.kill()
                        spin.wait()
                lat = rep.get("latency_us") or {}
                B.log(f"{n} round {rnd}: {per['task-clock']:.2f} µs/request, p99 "
                      f"{lat.get('p99')} µs, kept up {rep.get('kept_up')}, errors "
                      f"{rep.get('errors')}")
                res[n].append((per, threads))
    finally:
        # Two entries share each HTTP server process: stop each once.
        for s in {id(s.proc): s for s in servers.values()}.values():
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
