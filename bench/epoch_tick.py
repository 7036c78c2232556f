#!/usr/bin/env python3
"""bench/epoch_tick.py: what the WASM epoch ticker costs, by `[broker]
epoch_tick` (issue 15, items 3 and 5).

Starts one broker per tick given (scripts/bench's broker: one shard on the
upper CPU, the WASM `echo` router `never_waits`; its other threads, the
ticker among them, unpinned as in scripts/bench) and, with EDGE=grpc, the
tonic-baseline beside them, all at once. Each round drives every server in
an order rotated every round, open loop at RATE over 16 connections from the
lower CPU (1 s warmup, SECONDS measured). CPU per request is the server's
on-CPU time over each run (/proc/PID/task/*/schedstat, every thread),
divided by its requests; the ticker thread's share is printed apart.

  bench/epoch_tick.py [ROUNDS] [RATE] [SECONDS] [EDGE] [TICKS]
  (defaults: 8 22000 4 grpc 1ms,10ms; EDGE: grpc or frames; TICKS
  comma-separated humantime values)

Stdlib only; reuses scripts/bench's helpers. Prints a Markdown table of
medians [min-max], and each tick's paired ratio to the first tick's (the
median of the per-round ratios, which cancels most of the host's drift).
"""
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import scriptload  # noqa: E402

B = scriptload.bench_script()
CONNECTIONS = 16


def main():
    args = sys.argv[1:]
    rounds = int(args[0]) if len(args) > 0 else 8
    rate = int(args[1]) if len(args) > 1 else 22000
    seconds = float(args[2]) if len(args) > 2 else 4
    edge = args[3] if len(args) > 3 else "grpc"
    ticks = (args[4] if len(args) > 4 else "1ms,10ms").split(",")
    if edge not in ("grpc", "frames"):
        sys.exit("EDGE: grpc or frames")
    srv_cpus, lg_cpus = B.cpu_split(os.cpu_count() or 2)
    srv_cpus = srv_cpus[:1]
    wd = tempfile.mkdtemp(prefix="epoch-tick-")
    servers = {}
    try:
        for tick in ticks:
            toml = B.broker_toml(1, srv_cpus, False).replace(
                "[broker]\n", f'[broker]\nepoch_tick = "{tick}"\n', 1)
            cfg = os.path.join(wd, f"tick-{tick}.toml")
            with open(cfg, "w") as f:
                f.write(toml)
            servers[f"broker tick {tick}"] = B.Server(f"broker-tick-{tick}",
                                                      [B.BROKER, "--config", cfg], wd,
                                                      addr_key=edge)
        if edge == "grpc":
            servers["tonic-baseline"] = B.start_tonic(wd, 1, srv_cpus)
        keys = ("cpu", "ticker", "p50", "p99", "p999")
        res = {k: {m: [] for m in keys} for k in servers}
        for r in range(rounds):
            for name in B.rotate(list(servers), r):
                s, d = servers[name], res[name]
                c0, t0 = B.cpu_ns(s.proc.pid), B.cpu_ns(s.proc.pid, "wasm-epoch")
                o = B.loadgen(s.addr, lg_cpus, "open", wd, f"{s.name}-{r}", 1, seconds,
                              rate=rate, connections=CONNECTIONS, scheme=edge)
                c1, t1 = B.cpu_ns(s.proc.pid), B.cpu_ns(s.proc.pid, "wasm-epoch")
                # Requests over the whole run, warmup included, as the CPU is.
                n = (o.get("achieved_rps") or 0) * (seconds + 1)
                ok = n and not o.get("failure") and not o.get("errors")
                lat = o.get("latency_us") or {}
                d["cpu"].append((c1 - c0) / n / 1e3 if ok else None)
                d["ticker"].append((t1 - t0) / n / 1e3 if ok else None)
                d["p50"].append(lat.get("p50"))
                d["p99"].append(lat.get("p99"))
                d["p999"].append(lat.get("p999"))
                B.log(f"{name} round {r}: {o.get('achieved_rps') or 0:,.0f} req/s, "
                      f"{d['cpu'][-1] or 0:.2f} µs/request, errors {o.get('errors')}, "
                      f"kept up {o.get('kept_up')}")
    finally:
        for s in servers.values():
            s.stop()
    print(f"Open loop at {rate:,} req/s on the {edge} edge, {CONNECTIONS} connections, "
          f"{rounds} rounds of 1 s warmup + {seconds:g} s; medians [min–max].\n")
    print("| server | CPU µs/request | of which the ticker | p50 µs | p99 µs | p99.9 µs |")
    print("|---|---|---|---|---|---|")
    for k, d in res.items():
        cells = [B.fmt_med_range(d["cpu"], 2), B.fmt_med_range(d["ticker"], 2),
                 *(B.fmt_med_range(d[q]) for q in ("p50", "p99", "p999"))]
        print(f"| {k} | " + " | ".join(cells) + " |")
    base = next(iter(res))
    print(f"\nPaired CPU ratios (median of the per-round ratios to `{base}`):\n")
    for k, d in res.items():
        if k == base:
            continue
        pairs = [a / b for a, b in zip(d["cpu"], res[base]["cpu"]) if a and b]
        print(f"- {k}: {B.med(pairs):.3f}× over {len(pairs)} rounds" if pairs else f"- {k}: n/a")


if __name__ == "__main__":
    main()
