#!/usr/bin/env python3
"""bench/broker_ab.py: two or more broker builds or settings side by side.

For bench/NOTES.md attempts: each SPEC is NAME=BINARY,NATIVE,DEFER[,WAITS]
(NATIVE 1 = [bench] native_echo; DEFER 1/0 sets [broker]
io_uring_defer_taskrun; WAITS 1/0 sets the echo router's never_waits (default
1); - leaves the binary's default, for builds that predate the option). Every server runs
one shard on CPU 1, all started at once; each round drives every server in
an order rotated every round (drift from other jobs spreads over all), with
mcp-loadgen on CPU 0: closed loop (4 connections, 256 in flight), open loop
at RATE, idle (1 in flight). CPU per request is the server's on-CPU time
(/proc/PID/task/*/schedstat) over each run divided by its requests: steadier
than throughput on a shared machine.

  git worktree add /tmp/before <commit> && (cd /tmp/before && cargo build --release -p mcp-broker)
  bench/broker_ab.py 5 100000 before=/tmp/before/target/release/mcp-broker,0,- \\
      after=target/release/mcp-broker,0,1

Stdlib only; reuses scripts/bench's helpers. Prints a Markdown table of
medians [min-max].
"""
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import scriptload  # noqa: E402

B = scriptload.bench_script()


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    rounds, rate, specs = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
    duration = 3
    wd = tempfile.mkdtemp(prefix="broker-ab-")
    servers = {}
    try:
        for spec in specs:
            name, rest = spec.split("=", 1)
            binary, native, defer, *waits = rest.split(",")
            waits = waits[0] if waits else "1"
            toml = B.broker_toml(1, [1], native == "1",
                                 never_waits=None if waits == "-" else waits == "1")
            if defer != "-":
                flag = "true" if defer == "1" else "false"
                toml = toml.replace("[broker]\n", f"[broker]\nio_uring_defer_taskrun = {flag}\n", 1)
            cfg = os.path.join(wd, f"{name}.toml")
            with open(cfg, "w") as f:
                f.write(toml)
            servers[name] = B.Server(name, [binary, "--config", cfg], wd)
        keys = ("closed", "cpu_closed", "cpu_open", "p50", "p99", "p999", "idle")
        res = {k: {m: [] for m in keys} for k in servers}
        for r in range(rounds):
            for name in B.rotate(sorted(servers), r):
                s, d = servers[name], res[name]
                c0 = B.cpu_ns(s.proc.pid)
                c = B.loadgen(s.addr, [0], "closed", wd, f"{name}-c{r}", 1, duration)
                c1 = B.cpu_ns(s.proc.pid)
                o = B.loadgen(s.addr, [0], "open", wd, f"{name}-o{r}", 1, duration, rate=rate)
                c2 = B.cpu_ns(s.proc.pid)
                i = B.loadgen(s.addr, [0], "idle", wd, f"{name}-i{r}", 0.5, 2)
                # Requests over the whole run, warmup included, as the CPU is.
                nc = (c.get("achieved_rps") or 0) * (duration + 1)
                no = (o.get("achieved_rps") or 0) * (duration + 1)
                lat = o.get("latency_us") or {}
                d["closed"].append(c.get("achieved_rps"))
                d["cpu_closed"].append((c1 - c0) / nc if nc else None)
                d["cpu_open"].append((c2 - c1) / no if no else None)
                d["p50"].append(lat.get("p50"))
                d["p99"].append(lat.get("p99"))
                d["p999"].append(lat.get("p999"))
                d["idle"].append((i.get("latency_us") or {}).get("p50"))
                B.log(f"{name} round {r}: closed {c.get('achieved_rps') or 0:,.0f} req/s "
                      f"(errors {c.get('errors')}), open {o.get('achieved_rps') or 0:,.0f} "
                      f"(errors {o.get('errors')}, kept up {o.get('kept_up')})")
    finally:
        for s in servers.values():
            s.stop()
    print(f"| server | closed req/s | CPU ns/req closed | CPU ns/req open {rate:,}/s "
          "| open p50 µs | open p99 µs | open p99.9 µs | idle p50 µs |")
    print("|---|---|---|---|---|---|---|---|")
    for k, d in sorted(res.items()):
        print(f"| {k} | " + " | ".join(B.fmt_med_range(d[m]) for m in keys) + " |")


if __name__ == "__main__":
    main()
