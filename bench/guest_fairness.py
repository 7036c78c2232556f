#!/usr/bin/env python3
"""bench/guest_fairness.py: how long a quick request waits behind a guest
that computes on the same shard, by `[broker] epoch_tick`.

One broker at a time (scripts/bench's broker: one shard on the upper CPU,
the WASM `echo` router `never_waits`) also serves the bundled `chaos` router
(async, so its guest yields at every epoch tick). One mcp-loadgen calls
chaos's `spin` (20 ms of guest computation; TOOL=loop: an endless loop cut
at a 20 ms call deadline) 20 times a second on one connection, which keeps
the shard's guest busy 40% of the time; another drives `echo` open loop at
2,000 req/s over 4 connections (1 s warmup, SECONDS measured), both from
the lower CPU and over the same edge. An echo request that arrives while the guest computes waits
for the guest's next yield: about one tick, if yields let the shard's
sockets in (bench/NOTES.md, "a computing guest held its shard's sockets").

  bench/guest_fairness.py [ROUNDS] [SECONDS] [TICKS] [TOOL] [EDGE]
  (defaults: 3 5 250us,1ms,4ms spin frames; EDGE, which both loads use:
  frames, grpc or http, the 2025-11-25 era with one session per connection)

BROKERS=name=/path/to/mcp-broker,... compares builds (default: this
build, as `broker`); a build that predates `epoch_tick` runs at its fixed
1 ms only (the key is left out at 1ms). Each round runs every build and
tick in an order rotated every round. Prints the echo latency's medians
over the rounds [min-max]. Stdlib only; reuses scripts/bench's helpers.
"""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import scriptload  # noqa: E402

B = scriptload.bench_script()
QUANTILES = ("p50", "p90", "p99", "p999", "max")


def config(cpus, tick, tool, edge):
    toml = B.broker_toml(1, cpus, False)
    if tick != "1ms":
        toml = toml.replace("[broker]\n", f'[broker]\nepoch_tick = "{tick}"\n', 1)
    deadline = "20ms" if tool == "loop" else "5s"
    return toml + f"""
[[routers]]
name = "chaos"
wasm = "chaos.wasm"
instances_per_shard = 4
call_deadline = "{deadline}"
"""


def one(binary, tick, tool, edge, seconds, srv_cpus, lg_cpus, wd, tag):
    cfg = os.path.join(wd, f"{tag}.toml")
    with open(cfg, "w") as f:
        f.write(config(srv_cpus, tick, tool, edge))
    try:
        # This tree's routers, also for a build made elsewhere (which would
        # look beside its own sources).
        routers = os.path.join(HERE, "..", "routers", "target", "wasm32-wasip2", "release")
        s = B.Server(tag, [binary, "--config", cfg], wd, addr_key=edge,
                     env={"MCP_BROKER_ROUTERS_DIR": os.path.abspath(routers)})
    except RuntimeError as e:
        B.log(f"{tag}: did not start ({str(e).splitlines()[0]})")
        return None
    cpus = ",".join(map(str, lg_cpus))
    target = f"http://{s.addr}/mcp" if edge == "http" else f"{edge}://{s.addr}"
    args = ["--args", '{"ms":20}'] if tool == "spin" else []
    # The computing calls: timer-driven sends (no spin), so that this
    # generator leaves the lower CPU to the one that measures.
    compute = subprocess.Popen(
        [B.LOADGEN, "--target", target, "--tool", tool, *args, "--cpus", cpus,
         "--connections", "1", "--rate", "20", "--spin", "0",
         "--duration", f"{seconds + 2:g}s", "-q"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        out = os.path.join(wd, f"{tag}.json")
        subprocess.run([B.LOADGEN, "--target", target, *B.TOOL_ARGS, "--cpus", cpus,
                        "--connections", "4", "--rate", "2000", "--warmup", "1s",
                        "--duration", f"{seconds:g}s", "-q", "--json", out],
                       capture_output=True)
        with open(out) as f:
            rep = json.load(f)
    finally:
        compute.wait()
        s.stop()
    lat = rep.get("latency_us") or {}
    if rep.get("errors"):
        B.log(f"{tag}: {rep.get('errors')} echo errors")
    return {q: lat.get(q) for q in QUANTILES}


def main():
    args = sys.argv[1:]
    rounds = int(args[0]) if len(args) > 0 else 3
    seconds = float(args[1]) if len(args) > 1 else 5
    ticks = (args[2] if len(args) > 2 else "250us,1ms,4ms").split(",")
    tool = args[3] if len(args) > 3 else "spin"
    edge = args[4] if len(args) > 4 else "frames"
    if tool not in ("spin", "loop"):
        sys.exit("TOOL: spin or loop")
    if edge not in ("frames", "grpc", "http"):
        sys.exit("EDGE: frames, grpc or http")
    builds = [("broker", B.BROKER)]
    if os.environ.get("BROKERS"):
        builds = [tuple(b.split("=", 1)) for b in os.environ["BROKERS"].split(",")]
    srv_cpus, lg_cpus = B.cpu_split(os.cpu_count() or 2)
    srv_cpus = srv_cpus[:1]
    wd = tempfile.mkdtemp(prefix="guest-fairness-")
    runs = [(name, binary, tick) for name, binary in builds for tick in ticks]
    res = {(name, tick): {q: [] for q in QUANTILES} for name, _, tick in runs}
    for r in range(rounds):
        for name, binary, tick in B.rotate(runs, r):
            got = one(binary, tick, tool, edge, seconds, srv_cpus, lg_cpus, wd,
                      f"{name}-{tick}-{r}")
            if got is None:
                continue
            for q in QUANTILES:
                res[(name, tick)][q].append(got[q])
            B.log(f"{name} tick {tick} round {r}: echo p50 {got['p50']} µs, "
                  f"p99 {got['p99']} µs")
    print(f"Echo open loop at 2,000 req/s (4 connections, {edge}) beside `chaos` `{tool}` "
          f"({'20 ms of computation' if tool == 'spin' else 'cut at a 20 ms deadline'}, "
          f"20 calls/s) on one shard; {rounds} rounds of 1 s warmup + {seconds:g} s; "
          "echo latency in µs, medians [min–max].\n")
    print("| build | epoch tick | " + " | ".join(QUANTILES) + " |")
    print("|---|---|" + "---|" * len(QUANTILES))
    for (name, tick), d in res.items():
        if not d["p50"]:
            continue
        cells = (B.fmt_med_range(d[q]) for q in QUANTILES)
        print(f"| {name} | {tick} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
