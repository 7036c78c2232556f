#!/usr/bin/env python3
"""bench/slo_budget.py: how much work per request a frame server can add to
the bare echo server and still hold a given share of its capacity at SLO
(issue 15, item 4: what the frame goal of 0.75x echo allows the broker).

  bench/slo_budget.py [WORK_NS] [ROUNDS] [BISECT]   (default 250,500,1000 2 3)

Servers, one at a time on the upper CPU, as scripts/bench --slo starts them:
echo-baseline, echo-baseline with `--work-ns=N` for each N of WORK_NS (N ns
of user-space spinning after each answered frame: the same I/O, plus a
fixed amount of work per request), broker-native (the broker routing
without WASM) and broker-wasm (the WASM `echo` router). For each: capacity
at SLO as scripts/bench --slo finds it (bench/slo.py: p99 <= 1 ms, no
errors, the generator on schedule; a x2 sweep, then BISECT bisection
steps, a failing probe tried twice), in ROUNDS rounds with the order
rotated, so that a slow spell of the host is spread over every server;
then each server at one fixed rate (half of the slowest capacity) for its
user and kernel CPU per request. Prints every capacity as a share of plain
echo's in the same round, and writes
bench/results/<date>-<host>-slo-budget.{md,json} (-2, -3, ... for a later
run the same day).

Reading it: the echo rows give capacity against added work on this
machine; where the brokers' rows fall on that curve says whether their
distance from the goal is the work they add per request or something else
(their I/O pattern, their timers). Needs the release binaries
(scripts/bench builds them). Stdlib only.
"""
import datetime
import json
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import scriptload  # noqa: E402
import slo as S  # noqa: E402

B = scriptload.bench_script()


def cpu_split_seconds(pid):
    """(user, kernel) CPU seconds of the whole process so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def main():
    work = [int(w) for w in (sys.argv[1] if len(sys.argv) > 1 else "250,500,1000").split(",")]
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    bisect = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    m = B.machine()
    srv_cpus, lg_cpus = B.cpu_split(m["nproc"])
    srv_cpus = srv_cpus[:1]
    conns, dur, warmup = 16, 3.0, 1.0
    wd = tempfile.mkdtemp(prefix="slo-budget-")

    def echo_with(ns):
        # scripts/bench's echo-baseline (B.start_echo), with the work flag.
        return lambda: B.Server(f"echo-work-{ns}",
                                [B.ECHO, "--listen", "127.0.0.1:0", "--shards", "1",
                                 "--cpus", ",".join(map(str, srv_cpus)), "--defer-taskrun",
                                 f"--work-ns={ns}"], wd)

    entries = [("echo-baseline", lambda: B.start_echo(wd, 1, srv_cpus))]
    entries += [(f"echo +{ns} ns", echo_with(ns)) for ns in work]
    entries += [
        ("broker-native", lambda: B.start_broker("broker-native", wd, 1, srv_cpus, True)),
        ("broker-wasm", lambda: B.start_broker("broker-wasm", wd, 1, srv_cpus, False)),
    ]
    started = []
    caps = {name: [] for name, _ in entries}
    fixed = {}
    try:
        for name, start in entries:
            started.append((name, start()))

        def probe(srv, rate, tag):
            return S.probe(B.LOADGEN, f"frames://{srv.addr}", list(B.TOOL_ARGS), lg_cpus, wd,
                           tag, rate, conns, dur, warmup, server=srv, server_cpus=1)

        for name, srv in started:
            probe(srv, 200, f"warm-{srv.name}")
        for rnd in range(rounds):
            for name, srv in B.rotate(started, rnd):
                B.log(f"round {rnd} / {name}: sweep")
                c = S.capacity(lambda r, s=srv: probe(s, r, f"{s.name}-{rnd}-{int(r)}"),
                               bisect_steps=bisect, log=B.log)
                caps[name].append(c)
                B.log(f"round {rnd} / {name}: capacity at SLO {S.fmt_capacity(c)} req/s")
        slowest = min((c["capacity"] or 0) for cs in caps.values() for c in cs) or 2000
        rate = max(1000, int(slowest / 2 // 1000 * 1000))
        for rnd in range(rounds):
            for name, srv in B.rotate(started, rnd):
                u0, k0 = cpu_split_seconds(srv.proc.pid)
                p = probe(srv, rate, f"fixed-{srv.name}-{rnd}")
                u1, k1 = cpu_split_seconds(srv.proc.pid)
                # The probe's own warmup is inside this window: it is short
                # and at the same rate, so the split holds.
                n = (p.get("achieved_rps") or 0) * (dur + warmup)
                p["user_us_per_request"] = (u1 - u0) * 1e6 / n if n else None
                p["kernel_us_per_request"] = (k1 - k0) * 1e6 / n if n else None
                fixed.setdefault(name, []).append(p)
    finally:
        for _, srv in started:
            srv.stop()

    def share(name, rnd):
        base = caps["echo-baseline"][rnd]["capacity"]
        c = caps[name][rnd]["capacity"]
        return c / base if base and c else None

    lines = ["| server | " + " | ".join(f"round {r}: capacity (share of echo)"
                                       for r in range(rounds)) +
             " | median share | user µs/request | kernel µs/request |",
             "|---|" + "---|" * rounds + "---|---|---|"]
    summary = {}
    for name, _ in entries:
        cells = []
        for r in range(rounds):
            sh = share(name, r)
            cells.append(f"{S.fmt_capacity(caps[name][r])} "
                         f"({'n/a' if sh is None else format(sh, '.2f')}×)")
        med_share = B.med([share(name, r) for r in range(rounds)])
        user = B.med([p.get("user_us_per_request") for p in fixed.get(name, [])])
        kern = B.med([p.get("kernel_us_per_request") for p in fixed.get(name, [])])
        summary[name] = {"median_share": med_share, "user_us": user, "kernel_us": kern}
        lines.append(f"| {name} | " + " | ".join(cells) +
                     f" | {'n/a' if med_share is None else format(med_share, '.2f') + '×'} | "
                     f"{'n/a' if user is None else format(user, '.2f')} | "
                     f"{'n/a' if kern is None else format(kern, '.2f')} |")
    now = datetime.datetime.now()
    head = [f"# Work per request against capacity at SLO, frames, {now:%Y-%m-%d %H:%M} on "
            f"{m['host']}\n",
            f"Written by `bench/slo_budget.py {','.join(map(str, work))} {rounds} {bisect}`. "
            f"Machine: {m['cpu_model']}, {m['nproc']} CPUs, kernel {m['kernel']}, commit "
            f"{m['commit']}"
            + (f" (the broker: `{m['broker']}`)" if m.get("broker") else "")
            + f"; each server alone on CPU {srv_cpus}, mcp-loadgen on {lg_cpus}; "
            f"{conns} keep-alive connections, open loop, probes {warmup:g} s warmup + {dur:g} s; "
            "SLO p99 ≤ 1 ms, no errors, generator on schedule. `echo +N ns`: echo-baseline "
            "spinning N ns of user CPU after each answered frame. Shares are of plain "
            "echo-baseline's capacity in the same round. CPU per request at "
            f"{rate:,} req/s (half the slowest capacity), medians over the rounds. "
            "Discussion: bench/NOTES.md, \"what the frame goal allows per request\".\n"]
    text = "\n".join(head + lines) + "\n"
    # A second run the same day gets -2, -3, ...: results are not overwritten.
    stem = os.path.join(B.ROOT, "bench", "results", f"{now:%Y-%m-%d}-{m['host']}-slo-budget")
    out, n = f"{stem}.md", 1
    while os.path.exists(out):
        n += 1
        out = f"{stem}-{n}.md"
    with open(out, "w") as f:
        f.write(text)
    with open(out[:-3] + ".json", "w") as f:
        json.dump({"machine": m, "work_ns": work, "fixed_rate": rate, "capacity": caps,
                   "fixed": fixed, "summary": summary}, f, indent=1, default=str)
    print(text)
    B.log(f"wrote {out}")
    shutil.rmtree(wd, ignore_errors=True)


if __name__ == "__main__":
    main()
