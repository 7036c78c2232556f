#!/usr/bin/env python3
"""bench/upstream_router_ab.py: two builds of the `upstream` router side by side.

For bench/NOTES.md attempts on the router's own cost. One release broker
(shards = 1, on CPU 1) fronts a FastMCP server (`bench/servers/fastmcp_echo.py`,
on CPU 0 with mcp-loadgen; `--answers modern`: the Python SDK 2.x fixture
`broker/tests/upstreams/server2.py`, spoken to in 2026-07-28); only the
routers directory (its `upstream.wasm`) differs between A and B. Each run:
closed loop through the frame edge, 8 connections x concurrency 8, a 3 s
warm-up, then DURATION s measured; the broker's and the upstream's CPU
(utime + stime from /proc/PID/stat) over the measured run only.
Rounds alternate the order (A B, B A, ...). Prints calls/s and broker CPU
per call for every run, and the medians.

  git worktree add /tmp/before <commit>
  (cd /tmp/before/routers && cargo build --release --target wasm32-wasip2 -p upstream \\
      --target-dir /tmp/before-target)
  mkdir /tmp/a && cp routers/target/wasm32-wasip2/release/*.wasm /tmp/a/ \\
      && cp /tmp/before-target/wasm32-wasip2/release/upstream.wasm /tmp/a/
  CARGO_TARGET_DIR=... bench/upstream_router_ab.py --answers json --rounds 3 \\
      before=/tmp/a after=routers/target/wasm32-wasip2/release

Stdlib only.
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
BROKER = os.path.join(TARGET, "release", "mcp-broker")
LOADGEN = os.path.join(TARGET, "release", "mcp-loadgen")
PYTHON = os.environ.get("MCP_BENCH_PYTHON", os.path.join(ROOT, ".tools", "mcp1", "bin", "python"))
PYTHON2 = os.environ.get("MCP_BENCH_PYTHON2", os.path.join(ROOT, ".tools", "mcp2", "bin", "python"))
# The upstreams: FastMCP 1.x (session era; JSON or SSE answers), and the
# Python SDK 2.x fixture spoken to in 2026-07-28 (no GET stream there).
SERVERS = {
    "json": ([PYTHON, os.path.join(ROOT, "bench", "servers", "fastmcp_echo.py")], ["--json"],
             "echo_text", '{"text":"hi"}', ""),
    "sse": ([PYTHON, os.path.join(ROOT, "bench", "servers", "fastmcp_echo.py")], [],
            "echo_text", '{"text":"hi"}', ""),
    "modern": ([PYTHON2, os.path.join(ROOT, "broker", "tests", "upstreams", "server2.py")], [],
               "add", '{"a":2,"b":3}', 'upstream_protocol = "2026-07-28"\n'),
}
TICKS = os.sysconf("SC_CLK_TCK")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def loadgen(frames, seconds, tool, args, out=None):
    argv = [LOADGEN, "--target", f"frames://{frames}", "--tool", tool,
            "--args", args, "--cpus", "0", "--connections", "8",
            "--concurrency", "8", "--warmup", "0s", "--duration", f"{seconds}s", "-q"]
    if out:
        argv += ["--json", out]
    subprocess.run(argv, capture_output=True, check=True)


def run(workdir, routers, answers, duration):
    port = free_port()
    argv, extra, tool, args, protocol = SERVERS[answers]
    server = subprocess.Popen(
        ["taskset", "-c", "0", *argv, str(port), *extra],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    broker = None
    try:
        server.stdout.readline()
        cfg = os.path.join(workdir, "broker.toml")
        with open(cfg, "w") as f:
            f.write(f"""[broker]
shards = 1
cpus = [1]
[frames]
listen = "127.0.0.1:0"
[http]
listen = "127.0.0.1:0"
[grpc]
listen = "127.0.0.1:0"
[metrics]
listen = "127.0.0.1:0"
[[routers]]
name = "fastmcp"
upstream = "http://127.0.0.1:{port}/mcp"
instances_per_shard = 8
{protocol}""")
        broker = subprocess.Popen(
            ["taskset", "-c", "1", BROKER, "--config", cfg], stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, text=True,
            env=dict(os.environ, MCP_BROKER_ROUTERS_DIR=routers))
        ready = broker.stdout.readline()
        frames = next(w.split("=", 1)[1] for w in ready.split() if w.startswith("frames="))
        loadgen(frames, 3, tool, args)
        before = cpu_seconds(broker.pid), cpu_seconds(server.pid)
        out = os.path.join(workdir, "run.json")
        loadgen(frames, duration, tool, args, out)
        cpu = cpu_seconds(broker.pid) - before[0], cpu_seconds(server.pid) - before[1]
        report = json.load(open(out))
        ok = max(report["ok"], 1)
        return (report["ok"] / report["duration_s"], cpu[0] * 1e6 / ok, cpu[1] * 1e6 / ok,
                report["errors"])
    finally:
        for p in (broker, server):
            if p:
                p.terminate()
                p.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("specs", nargs=2, metavar="NAME=ROUTERS_DIR")
    ap.add_argument("--answers", choices=sorted(SERVERS), default="json",
                    help="FastMCP answering in JSON or SSE, or the 2.x fixture in 2026-07-28")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=float, default=8)
    a = ap.parse_args()
    specs = [s.split("=", 1) for s in a.specs]
    rows = {name: [] for name, _ in specs}
    with tempfile.TemporaryDirectory() as workdir:
        for i in range(a.rounds):
            for name, routers in (specs if i % 2 == 0 else specs[::-1]):
                rps, cpu, server_cpu, errors = run(workdir, routers, a.answers, a.duration)
                rows[name].append((rps, cpu, server_cpu, errors))
                print(f"round {i + 1} {name}: {rps:,.0f} calls/s, broker {cpu:.1f} µs a call, "
                      f"upstream {server_cpu:.0f} µs a call, {errors} errors", flush=True)
    print("\n| upstream | router | calls/s | median | broker CPU a call | median "
          "| upstream CPU a call (median) |")
    print("|---|---|---|---|---|---|---|")
    for name, r in rows.items():
        print(f"| {a.answers} | {name} | {' · '.join(f'{x[0]:,.0f}' for x in r)} "
              f"| {statistics.median(x[0] for x in r):,.0f} "
              f"| {' · '.join(f'{x[1]:.0f}' for x in r)} µs "
              f"| {statistics.median(x[1] for x in r):.0f} µs "
              f"| {statistics.median(x[2] for x in r):.0f} µs |")
    if any(x[3] for r in rows.values() for x in r):
        sys.exit("errors in some runs")


if __name__ == "__main__":
    main()
