#!/usr/bin/env python3
"""bench/idle_poll.py: capacity at SLO with `[broker] idle_poll` off and on,
every server side by side in one run (bench/NOTES.md, "idle polling").

  bench/idle_poll.py [EDGES] [WINDOW_US] [BISECT]   (default frames,http,grpc 100 3)

For each edge, each server twice, without and with a WINDOW_US window
(echo-baseline through its --idle-poll-us, the broker through
broker.idle_poll), plus the edge's foreign baseline once (tonic-baseline,
rmcp-baseline: they have no such knob):
  frames  echo-baseline, broker-wasm
  http    broker-http (2025-11-25, sessions), rmcp-baseline
  grpc    broker-grpc, tonic-baseline
Capacity at SLO as scripts/bench --slo finds it (bench/slo.py: p99 <= 1 ms,
no errors, the generator on schedule; a x2 sweep then BISECT bisection
steps), then every server at two fixed rates (a tenth and half of the
slowest server's capacity) for its CPU per request and tail latencies. Writes
bench/results/<date>-<host>-idle-poll-<edges>.{md,json} and prints the report.

Needs the release binaries (scripts/bench builds them). Stdlib only.
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


def servers_for(edge, wd, srv_cpus, window):
    """[(name, start, scheme, extra loadgen args)] for one edge."""
    n = len(srv_cpus)
    if edge == "frames":
        return [
            ("echo-baseline", lambda: B.start_echo(wd, n, srv_cpus), "frames", ()),
            (f"echo-baseline +poll {window}us",
             lambda: B.start_echo(wd, n, srv_cpus, idle_poll_us=window, name="echo-poll"),
             "frames", ()),
            ("broker-wasm", lambda: B.start_broker("broker-wasm", wd, n, srv_cpus, False),
             "frames", ()),
            (f"broker-wasm +poll {window}us",
             lambda: B.start_broker("broker-wasm-poll", wd, n, srv_cpus, False,
                                    idle_poll_us=window), "frames", ()),
        ]
    era = ("--mcp-version", "2025-11-25")
    if edge == "http":
        out = [
            ("broker-http", lambda: B.start_broker("broker-http", wd, n, srv_cpus, False,
                                                   addr_key="http", pin_process=True),
             "http", era),
            (f"broker-http +poll {window}us",
             lambda: B.start_broker("broker-http-poll", wd, n, srv_cpus, False, addr_key="http",
                                    pin_process=True, idle_poll_us=window), "http", era),
        ]
        if os.path.exists(B.RMCP):
            out.append(("rmcp-baseline",
                        lambda: B.Server("rmcp-baseline", [B.RMCP, "--listen", "127.0.0.1:0"],
                                         wd, addr_key="http", cpus=srv_cpus), "http", era))
        return out
    if edge == "grpc":
        return [
            ("tonic-baseline", lambda: B.start_tonic(wd, n, srv_cpus), "grpc", ()),
            ("broker-grpc", lambda: B.start_broker("broker-grpc", wd, n, srv_cpus, False,
                                                   addr_key="grpc", pin_process=True),
             "grpc", ()),
            (f"broker-grpc +poll {window}us",
             lambda: B.start_broker("broker-grpc-poll", wd, n, srv_cpus, False, addr_key="grpc",
                                    pin_process=True, idle_poll_us=window), "grpc", ()),
        ]
    sys.exit(f"unknown edge {edge!r}: frames, http or grpc")


def target(scheme, srv):
    return f"{scheme}://{srv.addr}" + ("/mcp" if scheme == "http" else "")


def main():
    edges = (sys.argv[1] if len(sys.argv) > 1 else "frames,http,grpc").split(",")
    window = int(sys.argv[2]) if len(sys.argv) > 2 else 100
    bisect = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    m = B.machine()
    srv_cpus, lg_cpus = B.cpu_split(m["nproc"])
    conns, dur, warmup = 16, 3.0, 1.0
    wd = tempfile.mkdtemp(prefix="idle-poll-")
    lines = []
    doc = {"machine": m, "window_us": window, "edges": {}}

    def probe(name, srv, scheme, extra, rate, tag):
        return S.probe(B.LOADGEN, target(scheme, srv), [*B.TOOL_ARGS, *extra], lg_cpus, wd,
                       tag, rate, conns, dur, warmup, server=srv, server_cpus=len(srv_cpus))

    for edge in edges:
        entries = servers_for(edge, wd, srv_cpus, window)
        started = []
        caps, fixed = {}, {}
        try:
            for name, start, scheme, extra in entries:
                started.append((name, start(), scheme, extra))
            for name, srv, scheme, extra in started:
                probe(name, srv, scheme, extra, 200, f"warm-{srv.name}")
            for name, srv, scheme, extra in started:
                B.log(f"{edge} / {name}: sweep")
                c = S.capacity(lambda r, n=name, s=srv, sc=scheme, x=extra:
                               probe(n, s, sc, x, r, f"{edge}-{s.name}-{int(r)}"),
                               bisect_steps=bisect, log=B.log)
                caps[name] = c
                B.log(f"{edge} / {name}: capacity at SLO {S.fmt_capacity(c)} req/s")
            slowest = min((c["capacity"] or 0) for c in caps.values()) or 1000
            rates = sorted({max(1000, int(slowest / 10 // 500 * 500)),
                            max(1000, int(slowest / 2 // 500 * 500))})
            for rate in rates:
                for rnd in range(2):
                    for name, srv, scheme, extra in B.rotate(started, rnd):
                        p = probe(name, srv, scheme, extra, rate,
                                  f"fixed-{edge}-{srv.name}-{rate}-{rnd}")
                        fixed.setdefault(rate, {}).setdefault(name, []).append(p)
        finally:
            for _, srv, _, _ in started:
                srv.stop()
        doc["edges"][edge] = {"capacity": caps, "fixed": fixed}
        lines += [f"\n## {edge}\n",
                  "| server | capacity at SLO (req/s) | first failing probe | server CPU µs/request at capacity |",
                  "|---|---|---|---|"]
        for name, c in caps.items():
            at = next((p for p in c["points"] if p["rate"] == c["capacity"]), None)
            cpu = at.get("server_cpu_us_per_request") if at else None
            fails = [p["rate"] for p in c["points"]
                     if p["verdict"] != "holds" and p["rate"] > (c["capacity"] or 0)]
            lines.append(f"| {name} | {S.fmt_capacity(c)} | "
                         f"{format(min(fails), ',.0f') + ' (' + c['bound'] + ')' if fails else 'n/a'} | "
                         f"{'n/a' if cpu is None else format(cpu, '.1f')} |")
        for rate, per in fixed.items():
            lines += [f"\nAt {rate:,} req/s (medians of 2 rounds, order rotated):\n",
                      "| server | p50 | p99 | p99.9 | server CPU µs/request | server CPU share |",
                      "|---|---|---|---|---|---|"]
            for name, ps in per.items():
                def med(k):
                    return B.med([p.get(k) for p in ps])
                cpu, share = med("server_cpu_us_per_request"), med("server_cpu")
                lines.append(f"| {name} | {B.fmt_us(med('p50_us'))} | {B.fmt_us(med('p99_us'))} | "
                             f"{B.fmt_us(med('p999_us'))} | "
                             f"{'n/a' if cpu is None else format(cpu, '.1f')} | "
                             f"{'n/a' if share is None else format(share, '.0%')} |")
    stamp = datetime.datetime.now().strftime("%Y-%m-%d")
    head = [f"# Idle polling off and on, {datetime.datetime.now():%Y-%m-%d %H:%M} on {m['host']}\n",
            f"Written by `bench/idle_poll.py {','.join(edges)} {window} {bisect}`. Machine: "
            f"{m['cpu_model']}, {m['nproc']} CPUs, kernel {m['kernel']}, commit "
            f"{m['commit']}; servers on CPU {srv_cpus}, mcp-loadgen on {lg_cpus}; "
            f"{conns} keep-alive connections (HTTP: one request in flight each), probes "
            f"{warmup:g} s warmup + {dur:g} s; SLO p99 ≤ 1 ms, no errors, generator on "
            f"schedule. `+poll` rows: the same server with a {window} µs idle-poll window. "
            "Discussion: bench/NOTES.md, \"idle polling\"."]
    text = "\n".join(head + lines) + "\n"
    out = os.path.join(B.ROOT, "bench", "results",
                       f"{stamp}-{m['host']}-idle-poll-{'-'.join(edges)}.md")
    with open(out, "w") as f:
        f.write(text)
    with open(out[:-3] + ".json", "w") as f:
        json.dump(doc, f, indent=1, default=str)
    print(text)
    B.log(f"wrote {out}")
    shutil.rmtree(wd, ignore_errors=True)


if __name__ == "__main__":
    main()
