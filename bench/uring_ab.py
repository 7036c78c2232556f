#!/usr/bin/env python3
"""bench/uring_ab.py: echo-baseline (monoio) against uring-echo (io-uring
crate) variants, alternated, with each server's CPU time per request.

All servers run at once on the server CPU (idle ones cost nothing); every
round drives each of them in turn, in an order rotated every round, so that
drift from other jobs on a shared machine spreads over all of them. Per run:
mcp-loadgen's report, plus the server's on-CPU time over the measured phase
(sum over its threads of the first field of /proc/PID/task/*/schedstat,
sampled after the warmup and before the end) divided by the requests served
in that window: on a shared box this moves less than throughput does.

  bench/uring_ab.py [--rounds 6] [--warmup 1] [--duration 4] [--rates 50000,100000]
                    [--only NAME,NAME] [--out FILE]

Needs target/release/{mcp-loadgen,echo-baseline,uring-echo}. Stdlib only.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REL = os.path.join(ROOT, "target", "release")
LOADGEN = os.path.join(REL, "mcp-loadgen")
TOOL_ARGS = ["--tool", "echo", "--args", '{"text":"hello"}']
SERVER_CPU, LOADGEN_CPU = 1, 0

VARIANTS = [
    ("echo-baseline", ["echo-baseline"]),
    ("echo-baseline --defer-taskrun", ["echo-baseline", "--defer-taskrun"]),
    ("uring-echo", ["uring-echo"]),
    ("uring-echo --no-fixed", ["uring-echo", "--no-fixed"]),
    ("uring-echo --zc", ["uring-echo", "--zc"]),
    ("uring-echo --defer-taskrun", ["uring-echo", "--defer-taskrun"]),
]


def start(argv):
    exe = os.path.join(REL, argv[0])
    p = subprocess.Popen([exe, "--cpus", str(SERVER_CPU), *argv[1:]], stdout=subprocess.PIPE,
                         text=True, preexec_fn=lambda: os.sched_setaffinity(0, {SERVER_CPU}))
    line = p.stdout.readline()
    addr = next(w.split("=", 1)[1] for w in line.split() if w.startswith("frames="))
    return p, addr


def on_cpu_ns(pid):
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except OSError:
            pass
    return total


def tcp_out_segs():
    """Machine-wide TCP segments sent (loopback: each crosses once)."""
    with open("/proc/net/snmp") as f:
        rows = [line.split() for line in f if line.startswith("Tcp:")]
    return int(rows[1][rows[0].index("OutSegs")])


def run(pid, addr, mode, rate, a, tmp):
    out = os.path.join(tmp, "r.json")
    argv = [LOADGEN, "--target", f"frames://{addr}", *TOOL_ARGS, "--cpus", str(LOADGEN_CPU),
            "--warmup", f"{a.warmup}s", "--duration", f"{a.duration}s", "-q", "--json", out,
            "--connections", "4"]
    argv += ["--concurrency", "256"] if mode == "closed" else ["--rate", str(rate)]
    t0 = time.monotonic()
    lg = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    # The window: from 0.2 s after the warmup to 0.2 s before the end.
    time.sleep(max(0.0, t0 + a.warmup + 0.2 - time.monotonic()))
    c0, l0, s0, w0 = on_cpu_ns(pid), on_cpu_ns(lg.pid), tcp_out_segs(), time.monotonic()
    time.sleep(max(0.0, t0 + a.warmup + a.duration - 0.2 - time.monotonic()))
    c1, l1, s1, w1 = on_cpu_ns(pid), on_cpu_ns(lg.pid), tcp_out_segs(), time.monotonic()
    err = lg.communicate()[1]
    with open(out) as f:
        rep = json.load(f)
    lat = rep.get("latency_us") or {}
    rps = rep.get("achieved_rps") or 0
    return {
        "rps": rps,
        "errors": rep.get("errors"),
        "kept_up": rep.get("kept_up"),
        "p50": lat.get("p50"), "p99": lat.get("p99"), "p999": lat.get("p999"),
        "cpu_share": (c1 - c0) / 1e9 / (w1 - w0),
        "cpu_ns_per_req": (c1 - c0) / (rps * (w1 - w0)) if rps else None,
        # The generator's side: smaller server batches cost it more.
        "loadgen_ns_per_req": (l1 - l0) / (rps * (w1 - w0)) if rps else None,
        # Segments both ways per request (other TCP traffic on the box too).
        "segs_per_req": (s1 - s0) / (rps * (w1 - w0)) if rps else None,
        "loadavg": os.getloadavg()[0],
        "failure": rep.get("failure") or (err[-300:] if lg.returncode else None),
    }


def med(xs):
    xs = [x for x in xs if x is not None]
    return (statistics.median(xs), min(xs), max(xs)) if xs else (None, None, None)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--warmup", type=float, default=1)
    ap.add_argument("--duration", type=float, default=4)
    ap.add_argument("--rates", default="50000,100000", help="open-loop rates, req/s")
    ap.add_argument("--only", help="comma-separated variant names (default: all)")
    ap.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "uring-ab.json"),
                    help="raw runs as JSON")
    a = ap.parse_args()
    variants = [(n, v) for n, v in VARIANTS if not a.only or n in a.only.split(",")]
    servers = {name: start(argv) for name, argv in variants}
    names = [n for n, _ in variants]
    modes = [("closed", None)] + [(f"open{r}", int(r)) for r in a.rates.split(",")]
    res = {n: {m: [] for m, _ in modes} for n in names}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for r in range(a.rounds):
                order = names[r % len(names):] + names[:r % len(names)]
                for n in order:
                    p, addr = servers[n]
                    for mode, rate in modes:
                        x = run(p.pid, addr, "open" if rate else "closed", rate, a, tmp)
                        res[n][mode].append(x)
                        print(f"[{r}] {n:28} {mode:10} {x['rps']:>9.0f} req/s "
                              f"{x['cpu_ns_per_req'] or 0:>7.0f} ns/req cpu {x['cpu_share']:.2f} "
                              f"p50 {x['p50']} p99 {x['p99']} load {x['loadavg']:.2f}"
                              + (f" FAIL {x['failure']}" if x["failure"] else ""),
                              file=sys.stderr, flush=True)
    finally:
        for p, _ in servers.values():
            p.terminate()
            p.wait()
    with open(a.out, "w") as f:
        json.dump({"args": vars(a), "runs": res}, f, indent=1)

    def cell(n, mode, key, fmt):
        m, lo, hi = med([x[key] for x in res[n][mode]])
        return "–" if m is None else f"{fmt(m)} [{fmt(lo)}–{fmt(hi)}]"

    k = lambda v: f"{v / 1000:.0f}k"
    num = lambda v: f"{v:.0f}"
    two = lambda v: f"{v:.2f}"
    print("| server | closed req/s | server CPU ns/req | loadgen CPU ns/req | TCP segments/req |")
    print("|---|---|---|---|---|")
    for n in names:
        print(f"| {n} | {cell(n, 'closed', 'rps', k)} | {cell(n, 'closed', 'cpu_ns_per_req', num)} "
              f"| {cell(n, 'closed', 'loadgen_ns_per_req', num)} "
              f"| {cell(n, 'closed', 'segs_per_req', two)} |")
    for mode, rate in modes[1:]:
        print(f"\nOpen loop at {k(rate)} req/s\n")
        print("| server | p50 µs | p99 µs | p99.9 µs | CPU ns/req | CPU share |")
        print("|---|---|---|---|---|---|")
        for n in names:
            print(f"| {n} | {cell(n, mode, 'p50', num)} | {cell(n, mode, 'p99', num)} "
                  f"| {cell(n, mode, 'p999', num)} | {cell(n, mode, 'cpu_ns_per_req', num)} "
                  f"| {cell(n, mode, 'cpu_share', two)} |")


if __name__ == "__main__":
    main()
