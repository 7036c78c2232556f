#!/usr/bin/env python3
"""bench/http_eras.py: the MCP HTTP edge in its two protocol eras.

One broker (one shard, the WASM `echo` router) serves both, side by side
in time: `session` is MCP 2025-11-25 (initialize, then every request in
its session, routed after the body is parsed), `stateless` is 2026-07-28
(no session; every POST names its method and tool in `Mcp-Method` /
`Mcp-Name`, which the edge checks against the body). mcp-loadgen
(`--mcp-version`) drives `echo_text` over keep-alive connections on the
other CPU; each round runs both eras, in an order rotated every round:
- closed loop at 8 and 64 connections (one request in flight each):
  throughput and the broker's CPU per request;
- open loop at half of the session era's 64-connection peak: p50/p99.

  cargo build --release -p mcp-broker -p mcp-loadgen
  bench/http_eras.py [ROUNDS]          (default 3)

Stdlib only; reuses scripts/bench's and bench/auth_cost.py's helpers.
"""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")


sys.path.insert(0, HERE)
from scriptload import load as _load  # noqa: E402

B = _load("mcp_bench_script", os.path.join(ROOT, "scripts", "bench"))
A = _load("mcp_auth_cost", os.path.join(HERE, "auth_cost.py"))
ERAS = {"session": "2025-11-25", "stateless": "2026-07-28"}


def run(server, era, lg_cpus, wd, tag, connections, rate=None):
    out = os.path.join(wd, f"{tag}.json")
    argv = [B.LOADGEN, "--target", f"http://{server.addr}/mcp", "--mcp-version", ERAS[era],
            "--tool", "echo_text", "--args", '{"text":"hello"}',
            "--cpus", ",".join(map(str, lg_cpus)), "--connections", str(connections),
            "--warmup", "1s", "--duration", "4s", "-q", "--json", out]
    argv += ["--rate", str(int(rate))] if rate else ["--concurrency", str(connections)]
    cpu0 = server.cpu_seconds()
    r = subprocess.run(argv, text=True, capture_output=True)
    cpu1 = server.cpu_seconds()
    try:
        with open(out) as f:
            rep = json.load(f)
    except (OSError, ValueError):
        sys.exit(f"{era} {tag}: no report (exit {r.returncode}): {r.stderr[-500:]}")
    if rep.get("failure") or rep.get("errors"):
        sys.exit(f"{era} {tag}: {rep.get('failure')} errors={rep.get('errors_by_kind')}")
    total = rep.get("requests") or 0
    if cpu0 is not None and cpu1 is not None and total:
        rep["cpu_us_per_request"] = (cpu1 - cpu0) * 1e6 / total
    return rep


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    srv_cpus, lg_cpus = B.cpu_split(os.cpu_count() or 2)
    srv_cpus = srv_cpus[:1]
    wd = tempfile.mkdtemp(prefix="http-eras-")
    cfg = os.path.join(wd, "broker.toml")
    with open(cfg, "w") as f:
        f.write(A.config(srv_cpus, None))
    server = B.Server("broker", [B.BROKER, "--config", cfg], wd, addr_key="http")
    keys = ("c8", "c64", "open")
    res = {e: {k: [] for k in keys + ("cpu8", "cpu64")} for e in ERAS}
    try:
        for rnd in range(rounds):
            order = B.rotate(list(ERAS), rnd)
            for era in order:
                for conns in (8, 64):
                    rep = run(server, era, lg_cpus, wd, f"{era}-c{conns}-{rnd}", conns)
                    res[era][f"c{conns}"].append(rep["achieved_rps"])
                    res[era][f"cpu{conns}"].append(rep.get("cpu_us_per_request"))
                    B.log(f"round {rnd} {era} {conns} conns: {rep['achieved_rps']:,.0f} req/s, "
                          f"{rep.get('cpu_us_per_request', 0):.1f} µs CPU/request")
            rate = res["session"]["c64"][-1] * 0.5
            for era in order:
                rep = run(server, era, lg_cpus, wd, f"{era}-open-{rnd}", 64, rate)
                lat = rep["latency_us"]
                res[era]["open"].append((lat["p50"], lat["p99"], rep.get("kept_up")))
                B.log(f"round {rnd} {era} @ {rate:,.0f}/s: p50 {lat['p50']} p99 {lat['p99']} µs "
                      f"kept_up {rep.get('kept_up')}")
    finally:
        server.stop()
    m = B.machine()
    print(f"\nMachine: {m['cpu_model']}, {m['nproc']} CPUs, kernel {m['kernel']}, commit "
          f"{m['commit']}, {m['date']}; broker (1 shard) on CPU {srv_cpus}, mcp-loadgen on "
          f"{lg_cpus}; {rounds} rounds.\n")
    print("| era | req/s, 8 conns | CPU µs/req, 8 | req/s, 64 conns | CPU µs/req, 64 | p50 / p99 µs at 50% |")
    print("|---|---|---|---|---|---|")
    for era in ERAS:
        r = res[era]
        cell = lambda xs, f: f"{f(B.med(xs))} [{f(min(xs))}–{f(max(xs))}]"
        rps = lambda x: f"{x:,.0f}"
        us = lambda x: f"{x:.1f}"
        p50 = B.med([o[0] for o in r["open"]])
        p99 = B.med([o[1] for o in r["open"]])
        lag = "" if all(o[2] for o in r["open"]) else " (generator lagged in a round)"
        print(f"| {era} ({ERAS[era]}) | {cell(r['c8'], rps)} | {cell([c for c in r['cpu8'] if c], us)} "
              f"| {cell(r['c64'], rps)} | {cell([c for c in r['cpu64'] if c], us)} | {p50:,.0f} / {p99:,.0f}{lag} |")
    print("\nstateless / session, paired by round (median [min-max]):")
    for key in ("c8", "cpu8", "c64", "cpu64"):
        xs = [a / b for a, b in zip(res["stateless"][key], res["session"][key]) if a and b]
        print(f"- {key}: {B.med(xs):.3f}× [{min(xs):.3f}–{max(xs):.3f}]")


if __name__ == "__main__":
    main()
