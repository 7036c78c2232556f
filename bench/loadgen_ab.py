#!/usr/bin/env python3
"""bench/loadgen_ab.py: what two builds of mcp-loadgen make one server look
like, side by side: the server's CPU per request, the latency it is
measured at, and the generator's own send lag and CPU per request, at the
same open-loop rates.

Where a run falls behind its schedule, two columns say which side was the
bound: the generator's idle share (its spin with nothing to do; near zero
means it was saturated) and the server's CPU in cores (near one means the
server was). A third gives how long answers waited for the generator's
reader (`generator.turn_us` p99), which the latency columns include.

A change to the generator (its ring setup, its batching) can move every
server's figures; this shows by how much before the change lands in a
report. The server is scripts/bench's (one shard on the upper CPU, the
generator on the lower, 16 connections, the WASM `echo` router); each rate
runs every build in turn, twice (rounds), 1 s warmup + 3 s measured.

  bench/loadgen_ab.py SERVER RATES LOADGEN_A LOADGEN_B
      SERVER: http | wasm | native | echo | uring | grpc | tonic | rmcp
      e.g. bench/loadgen_ab.py http 20000,34000,40000 /tmp/lg-old target/release/mcp-loadgen

Stdlib only; needs the release binaries.
"""
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import scriptload  # noqa: E402

B = scriptload.bench_script()
# Its servers, from the workspace's release directory.
BA = scriptload.load("mcp_build_ab", os.path.join(HERE, "build_ab.py"))


def main():
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    which, rates, builds = sys.argv[1], [int(r) for r in sys.argv[2].split(",")], sys.argv[3:5]
    srv_cpus, lg_cpus = B.cpu_split(os.cpu_count() or 2)
    wd = tempfile.mkdtemp(prefix="loadgen-ab-")
    server, target = BA.start(which, B.REL, wd, srv_cpus[:1])
    print(f"`bench/loadgen_ab.py {' '.join(sys.argv[1:])}`, {B.machine()['date']}\n")
    print("| rate | build | server CPU µs/request | p50 µs | p99 µs | generator send lag p99 µs "
          "| generator busy CPU µs/request | generator idle share | generator read wait p99 µs "
          "| server CPU cores | achieved req/s | sent / scheduled | errors |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    try:
        for _ in range(2):
            for rate in rates:
                for build in builds:
                    out = os.path.join(wd, "run.json")
                    p = subprocess.Popen([build, "--target", target, *B.TOOL_ARGS, "--cpus",
                                          ",".join(map(str, lg_cpus)), "--connections", "16",
                                          "--rate", str(rate), "--warmup", "1s", "--duration",
                                          "3s", "-q", "--json", out],
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                    # The server's CPU over the measured phase only.
                    time.sleep(1.0)
                    c0, t0 = server.cpu_seconds(), time.monotonic()
                    p.wait()
                    c1, t1 = server.cpu_seconds(), time.monotonic()
                    with open(out) as f:
                        r = json.load(f)
                    lat = r.get("latency_us") or {}
                    # The generator's own CPU, less its idle spinning.
                    gen = r.get("generator") or {}
                    g = gen.get("busy_cpu_us_per_request")
                    idle = gen.get("idle_spin_cores")
                    idle = None if idle is None else idle / max(gen.get("cpu_cores") or 1, 1e-9)
                    print(f"| {rate:,} | `{build}` | {(c1 - c0) * 1e6 / (t1 - t0) / rate:.2f} "
                          f"| {lat.get('p50')} | {lat.get('p99')} "
                          f"| {(r.get('send_lag_us') or {}).get('p99')} "
                          f"| {'n/a' if g is None else f'{g:.2f}'} "
                          f"| {'n/a' if idle is None else f'{idle:.0%}'} "
                          f"| {(gen.get('turn_us') or {}).get('p99', 'n/a')} "
                          f"| {(c1 - c0) / (t1 - t0):.2f} "
                          f"| {r.get('achieved_rps') or 0:,.0f} "
                          f"| {r.get('sent')} / {r.get('scheduled')} | {r.get('errors')} |",
                          flush=True)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
