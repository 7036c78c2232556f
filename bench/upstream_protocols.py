#!/usr/bin/env python3
"""bench/upstream_protocols.py: what the upstream router costs in each MCP
revision it speaks, against the same server.

One Python SDK 2.x MCPServer (broker/tests/upstreams/server2.py), which
serves protocol 2026-07-28 beside the session-based revisions, and two
brokers side by side, each with one shard and one upstream router pointing
at that server: `upstream_protocol = "2025-06-18"` (an initialized session
per instance) and `"2026-07-28"` (server/discover, then stateless requests
carrying `_meta` and the Mcp-* headers). Each round drives both, in an
order rotated every round, with mcp-loadgen on the frame edge (the tool
`add` {"a":2,"b":3}; open loop at --rate over 4 connections), and records
per call: the broker's CPU (every thread: the shard, which runs the guest,
and the WASI I/O thread, which does its HTTP), the upstream's CPU, and the
latency. The figures are medians over rounds; B/A is 2026-07-28 over
2025-06-18.

CPU placement on 2 cores: the brokers on CPU 1, the server and
mcp-loadgen on CPU 0.

  cargo build --release -p mcp-broker -p mcp-loadgen && scripts/build-routers
  bench/upstream_protocols.py [--rounds 3] [--rate 200] [--duration 10] [--warmup 3] [--json out.json]

Binaries and routers as bench/upstream.py finds them; the 2.x Python:
$MCP_BENCH_PYTHON2, else .tools/mcp2/bin/python (scripts/setup).
"""
import argparse
import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import upstream as U  # noqa: E402  (its helpers: Proc, run, broker_toml, ...)

PYTHON2 = os.environ.get("MCP_BENCH_PYTHON2", os.path.join(U.ROOT, ".tools", "mcp2", "bin", "python"))
PROTOCOLS = ["2025-06-18", "2026-07-28"]


def log(msg):
    print(f"[upstream-protocols] {msg}", file=sys.stderr, flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rate", type=int, default=200)
    ap.add_argument("--duration", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--json")
    a = ap.parse_args()
    workdir = tempfile.mkdtemp(prefix="mcp-upstream-protocols-")
    log(f"work directory {workdir}")
    server = U.Proc("server2", [PYTHON2, os.path.join(U.ROOT, "broker", "tests", "upstreams", "server2.py"), "0"],
                    workdir, U.LOADGEN_CPU)
    url = f"http://{server.ready['http']}/mcp"
    brokers = {}
    try:
        for proto in PROTOCOLS:
            toml = U.broker_toml(
                f'[[routers]]\nname = "up"\nupstream = "{url}"\nupstream_protocol = "{proto}"\n'
                'instances_per_shard = 4\n')
            path = os.path.join(workdir, f"broker-{proto}.toml")
            with open(path, "w") as f:
                f.write(toml)
            brokers[proto] = U.Proc(f"broker-{proto}", [U.B.BROKER, "--config", path], workdir, U.SERVER_CPU)
        rows = {p: [] for p in PROTOCOLS}
        for r in range(a.rounds):
            order = PROTOCOLS if r % 2 == 0 else list(reversed(PROTOCOLS))
            for proto in order:
                b = brokers[proto]
                tag = f"r{r}-{proto}"
                argv = U.loadgen_argv(f"frames://{b.ready['frames']}", "add", {"a": 2, "b": 3}, tag,
                                      workdir, a.warmup, a.duration, 4, rate=a.rate)
                rep = U.run(argv, tag, workdir, watch=(b, server))
                calls = rep.get("ok") or 0
                cpu = rep["cpu_s"]
                # The loadgen's warmup is inside the CPU window too: count
                # its calls by the offered rate.
                window = calls + a.rate * a.warmup
                row = {
                    "calls": calls,
                    "errors": U.errs(rep),
                    "broker_us": 1e6 * cpu[b.name]["total"] / window if window else None,
                    "server_us": 1e6 * cpu["server2"]["total"] / window if window else None,
                    "p50_us": U.lat(rep, "p50"),
                    "p99_us": U.lat(rep, "p99"),
                }
                rows[proto].append(row)
                log(f"round {r + 1} {proto}: {json.dumps(row)}")
    finally:
        for b in brokers.values():
            b.stop()
        server.stop()
    meds = {p: {k: U.med([row[k] for row in rows[p]]) for k in ("broker_us", "server_us", "p50_us", "p99_us")}
            for p in PROTOCOLS}
    print(f"\n{a.rounds} rounds, open loop at {a.rate} calls/s over 4 connections (frames://, tool `add`); medians:\n")
    print("| upstream_protocol | broker CPU µs/call | upstream CPU µs/call | p50 | p99 | errors (each round) |")
    print("|---|---|---|---|---|---|")
    for p in PROTOCOLS:
        m = meds[p]
        e = "; ".join(row["errors"] for row in rows[p])
        print(f"| {p} | {m['broker_us']:.0f} | {m['server_us']:.0f} | {U.fmt_us(m['p50_us'])} | "
              f"{U.fmt_us(m['p99_us'])} | {e} |")
    a_, b_ = meds[PROTOCOLS[0]], meds[PROTOCOLS[1]]

    def ratio(k):
        return f"{b_[k] / a_[k]:.3f}" if a_[k] and b_[k] else "n/a"
    print(f"\nB/A (2026-07-28 / 2025-06-18): broker CPU {ratio('broker_us')}, upstream CPU {ratio('server_us')}, "
          f"p50 {ratio('p50_us')}, p99 {ratio('p99_us')}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rows": rows, "medians": meds, "args": vars(a)}, f, indent=1)


if __name__ == "__main__":
    main()
