#!/usr/bin/env python3
"""bench/upstream.py: what an upstream router costs (issue 13, item 8).

Two measurements, one command, bounded in time (with the defaults about
10 minutes: 4 per latency round, 2.5 for the slow-call section);
prints Markdown tables and writes a JSON report with every loadgen report.

1. Latency the broker adds over calling the same FastMCP server directly.
   One FastMCP server (bench/servers/fastmcp_echo.py, JSON answers unless
   --sse; the tool `echo_text` {"text":"hi"}) and one broker (1 shard; only
   an upstream router pointing at that server, so the tool keeps its name).
   First each path's closed-loop peak (8 in flight). Then each round
   drives, in an order rotated every round:
     direct        mcp-loadgen --target http://FASTMCP/mcp
     broker-http   mcp-loadgen --target http://BROKER_HTTP/mcp
     broker-frames mcp-loadgen --target frames://BROKER_FRAMES
   at each --rates R (open loop; 8 connections; http:// is then wrk2-style
   rate-limited closed loop, one request in flight per connection) and idle
   (1 connection, 1 in flight, closed loop). Added latency = broker - direct
   at each percentile, from the medians over rounds.

2. How many slow upstream calls one shard holds. A FastMCP server whose
   `sleep_ms` tool sleeps (bench/servers/fastmcp_slow.py); a broker with 1
   shard, the WASM `echo` router and an upstream router `slow` with
   `instances_per_shard = N`. For each N: closed loop, N calls in flight
   (frames://, 8 connections), each sleeping --sleep-ms; meanwhile an open-loop
   `echo` probe (200 req/s, 1 connection) on the WASM router, whose latency is
   compared with the same probe on the idle broker. Also recorded: the shard
   thread's and the WASI I/O thread's CPU time over a window of the slow
   load alone (from /proc/PID/task/*/stat), FastMCP's CPU, the broker's RSS. Plus the queue
   rows: N instances with 2N callers (queue_depth default: the excess waits)
   and, open loop at 2N calls/s, a queue_depth of N/2 (the excess is refused
   with -32000 overloaded).

CPU placement on 2 cores: the broker (every thread) on CPU 1, FastMCP and
mcp-loadgen on CPU 0, so that the direct runs and the broker runs give
FastMCP and the generator the same CPU and the broker a core of its own.

  CARGO_TARGET_DIR=... cargo build --release -p mcp-broker -p mcp-loadgen
  scripts/build-routers
  bench/upstream.py [--rounds 2] [--rates 100,200] [--duration 20] [--warmup 5]
                    [--sse] [--slow-ns 16,64,256] [--sleep-ms 1000] [--json out.json]

Binaries: $MCP_BENCH_BIN_DIR, else $CARGO_TARGET_DIR/release, else
target/release. Routers: $MCP_BROKER_ROUTERS_DIR, else
routers/target/wasm32-wasip2/release. Python with FastMCP: $MCP_BENCH_PYTHON,
else .tools/mcp1/bin/python (scripts/setup). Loopback only. Stdlib only;
reuses scripts/bench's helpers.
"""
import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import scriptload  # noqa: E402

B = scriptload.bench_script()

ROOT = B.ROOT
ROUTERS = os.environ.get("MCP_BROKER_ROUTERS_DIR",
                         os.path.join(ROOT, "routers", "target", "wasm32-wasip2", "release"))
PYTHON = os.environ.get("MCP_BENCH_PYTHON", os.path.join(ROOT, ".tools", "mcp1", "bin", "python"))
SERVER_CPU, LOADGEN_CPU = [1], [0]
TCK = os.sysconf("SC_CLK_TCK")
CONNECTIONS = 8


def log(msg):
    print(f"[upstream] {msg}", file=sys.stderr, flush=True)


class Proc:
    """A process with a ready line `... ready k=v ...`, pinned to `cpus`;
    stopped with SIGTERM (then SIGKILL after 15 s)."""

    def __init__(self, name, argv, workdir, cpus):
        self.name = name
        self.log_path = os.path.join(workdir, f"{name}.log")
        self.log = open(self.log_path, "w")
        env = dict(os.environ)
        env.setdefault("RUST_LOG", "warn")
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=self.log, text=True,
                                     env=env, cwd=ROOT,
                                     preexec_fn=lambda: os.sched_setaffinity(0, cpus))
        self.ready = {}
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            if " ready " in line:
                self.ready = dict(w.split("=", 1) for w in line.split() if "=" in w)
                break
        if not self.ready:
            self.stop()
            raise RuntimeError(f"{name} printed no ready line; {self.log_path}:\n"
                               + open(self.log_path).read()[-2000:])
        log(f"{name} ready (pid {self.proc.pid}): {line.strip()}")

    def threads_cpu(self):
        """CPU seconds (user + system) by thread name, and `total`."""
        out = {"total": 0.0}
        base = f"/proc/{self.proc.pid}/task"
        try:
            tids = os.listdir(base)
        except OSError:
            return out
        for tid in tids:
            try:
                with open(f"{base}/{tid}/stat") as f:
                    s = f.read()
            except OSError:
                continue
            comm = s[s.index("(") + 1:s.rindex(")")]
            fields = s.rsplit(")", 1)[1].split()
            t = (int(fields[11]) + int(fields[12])) / TCK
            out[comm] = out.get(comm, 0.0) + t
            out["total"] += t
        return out

    def rss_mib(self):
        try:
            with open(f"/proc/{self.proc.pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1]) / 1024
        except OSError:
            pass
        return None

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def cpu_delta(a, b):
    return {k: b.get(k, 0.0) - a.get(k, 0.0) for k in b}


def loadgen_argv(target, tool, args, tag, workdir, warmup, duration, connections,
                 rate=None, concurrency=None, timeout=None):
    argv = [B.LOADGEN, "--target", target, "--tool", tool, "--args", json.dumps(args),
            "--cpus", ",".join(map(str, LOADGEN_CPU)), "--connections", str(connections),
            "--warmup", f"{warmup}s", "--duration", f"{duration}s", "-q",
            "--json", os.path.join(workdir, f"{tag}.json")]
    if rate is not None:
        argv += ["--rate", str(rate)]
    if concurrency is not None:
        argv += ["--concurrency", str(concurrency)]
    if timeout is not None:
        argv += ["--timeout", timeout]
    return argv


def finish(p, tag, workdir):
    """Waits for a loadgen started with Popen (bounded by its own --timeout
    and --drain); returns its report, with `failure` set on error."""
    try:
        _, err = p.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        p.kill()
        _, err = p.communicate()
    try:
        with open(os.path.join(workdir, f"{tag}.json")) as f:
            rep = json.load(f)
    except (OSError, ValueError):
        rep = {"failure": f"no report (exit {p.returncode}): {err[-500:]}"}
    if p.returncode != 0 and not rep.get("failure"):
        rep["failure"] = f"exit {p.returncode}: {err[-500:]}"
    return rep


def run(argv, tag, workdir, watch=()):
    """One loadgen run; CPU seconds of each process in `watch` over it."""
    before = [w.threads_cpu() for w in watch]
    t0 = time.monotonic()
    p = subprocess.Popen(argv, text=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    rep = finish(p, tag, workdir)
    rep["wall_s"] = time.monotonic() - t0
    rep["cpu_s"] = {w.name: cpu_delta(b, w.threads_cpu()) for w, b in zip(watch, before)}
    rep["loadavg_after"] = list(os.getloadavg())
    return rep


def lat(rep, k):
    if not rep.get("ok"):
        return None
    return (rep.get("latency_us") or {}).get(k)


def errs(rep):
    e = rep.get("errors_by_kind") or {}
    s = ", ".join(f"{k} {v}" for k, v in sorted(e.items())) or "0"
    return s + (f" (FAILED: {rep['failure']})" if rep.get("failure") else "")


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def fmt_us(x):
    return B.fmt_us(x)


def fmt_add(x):
    if x is None:
        return "n/a"
    sign = "+" if x >= 0 else "−"
    return sign + fmt_us(abs(x))


# ---------------------------------------------------------------- part 1

def broker_toml(routers, instances_note=""):
    return f"""[broker]
shards = 1
cpus = {json.dumps(SERVER_CPU)}
routers_dir = {json.dumps(ROUTERS)}
drain_timeout = "2s"

[frames]
listen = "127.0.0.1:0"

[grpc]
listen = "127.0.0.1:0"

[http]
listen = "127.0.0.1:0"

[metrics]
listen = "127.0.0.1:0"
{instances_note}
{routers}"""


def latency_section(a, workdir, report):
    echo = Proc("fastmcp-echo", [PYTHON, os.path.join(HERE, "servers", "fastmcp_echo.py"), "0",
                                 *([] if a.sse else ["--json"])], workdir, LOADGEN_CPU)
    broker = None
    try:
        url = f"http://{echo.ready['http']}/mcp"
        cfg = os.path.join(workdir, "latency.toml")
        with open(cfg, "w") as f:
            f.write(broker_toml(f"""[[routers]]
name = "fastmcp"
upstream = "{url}"
# One instance per loadgen connection: no call waits for an instance.
instances_per_shard = {CONNECTIONS}
"""))
        broker = Proc("broker-latency", [B.BROKER, "--config", cfg], workdir, SERVER_CPU)
        targets = {
            "direct": url,
            "broker-http": f"http://{broker.ready['http']}/mcp",
            "broker-frames": f"frames://{broker.ready['frames']}",
        }
        loads = [("idle", None)] + [(f"{r} req/s", r) for r in a.rates]
        runs = report["latency_runs"] = []
        peak = report["peak_runs"] = {}
        # Each path's closed-loop peak first (8 in flight), to place the rates.
        for name in targets:
            tag = f"peak-{name}"
            argv = loadgen_argv(targets[name], "echo_text", {"text": "hi"}, tag, workdir, 1,
                                a.peak_duration, CONNECTIONS, concurrency=CONNECTIONS)
            log(f"peak: {name}")
            rep = run(argv, tag, workdir, watch=(broker, echo))
            rep["argv"] = argv
            peak[name] = rep
            log(f"  {rep.get('achieved_rps') or 0:.0f} req/s, p50 {fmt_us(lat(rep, 'p50'))},"
                f" errors {errs(rep)}")
        for rnd in range(a.rounds):
            for load, rate in loads:
                for name in B.rotate(list(targets), rnd):
                    tag = f"lat-r{rnd}-{name}-{rate or 'idle'}"
                    if rate is None:
                        argv = loadgen_argv(targets[name], "echo_text", {"text": "hi"}, tag,
                                            workdir, 2, a.idle_duration, 1, concurrency=1)
                    else:
                        argv = loadgen_argv(targets[name], "echo_text", {"text": "hi"}, tag,
                                            workdir, a.warmup, a.duration, CONNECTIONS,
                                            rate=rate)
                    log(f"round {rnd + 1}/{a.rounds}: {name}, {load}")
                    rep = run(argv, tag, workdir, watch=(broker, echo))
                    rep["argv"] = argv
                    runs.append({"round": rnd, "target": name, "load": load, "report": rep})
                    log(f"  {rep.get('achieved_rps') or 0:.0f} req/s, p50 {fmt_us(lat(rep, 'p50'))}"
                        f" p99 {fmt_us(lat(rep, 'p99'))} p99.9 {fmt_us(lat(rep, 'p999'))},"
                        f" kept_up {rep.get('kept_up')}, errors {errs(rep)}")
        report["latency_targets"] = targets
        return loads, list(targets)
    finally:
        if broker:
            broker.stop()
        echo.stop()


def latency_tables(report, loads, names):
    runs = report["latency_runs"]
    rows, added = [], []
    for load, _ in loads:
        figs = {}
        for name in names:
            reps = [r["report"] for r in runs if r["load"] == load and r["target"] == name]
            n = sum(1 for r in reps if r.get("ok"))

            def per_req(proc, thread):
                xs = []
                for r in reps:
                    c = (r.get("cpu_s") or {}).get(proc, {}).get(thread)
                    if c is not None and r.get("achieved_rps"):
                        # CPU over the whole run (warmup included) over the
                        # requests of the whole run at the measured rate.
                        whole = r["achieved_rps"] * (r.get("warmup_s", 0) + r["duration_s"])
                        xs.append(c / whole * 1e6)
                return med(xs)

            f = {k: med([lat(r, k) for r in reps]) for k in ("p50", "p99", "p999")}
            f["rps"] = med([r.get("achieved_rps") for r in reps])
            f["kept_up"] = all(r.get("kept_up") for r in reps)
            f["lag_p99"] = med([(r.get("send_lag_us") or {}).get("p99") for r in reps])
            f["errors"] = "; ".join(errs(r) for r in reps)
            f["broker_cpu_us"] = per_req("broker-latency", "total") if name != "direct" else None
            f["fastmcp_cpu_us"] = per_req("fastmcp-echo", "total")
            f["rounds_ok"] = n
            figs[name] = f
            rows.append(
                f"| {load} | {name} | {B.fmt_rps(f['rps'])} | {fmt_us(f['p50'])} | {fmt_us(f['p99'])}"
                f" | {fmt_us(f['p999'])} | {'yes' if f['kept_up'] else '**no** (COULD NOT KEEP UP)'}"
                f" | {fmt_us(f['lag_p99'])} | {fmt_us(f['broker_cpu_us']) if f['broker_cpu_us'] is not None else '—'}"
                f" | {fmt_us(f['fastmcp_cpu_us'])} | {f['errors']} |")
        d = figs["direct"]
        for name in names[1:]:
            b = figs[name]
            diff = {k: (None if b[k] is None or d[k] is None else b[k] - d[k])
                    for k in ("p50", "p99", "p999")}
            added.append(f"| {load} | {name} | {fmt_add(diff['p50'])} | {fmt_add(diff['p99'])}"
                         f" | {fmt_add(diff['p999'])} |")
        report.setdefault("latency_figures", {})[load] = figs
    peak = ["| path | closed-loop peak, 8 in flight | p50 | p99 | errors |",
            "|---|---|---|---|---|"]
    for name, r in report.get("peak_runs", {}).items():
        peak.append(f"| {name} | {B.fmt_rps(r.get('achieved_rps'))} req/s | {fmt_us(lat(r, 'p50'))}"
                    f" | {fmt_us(lat(r, 'p99'))} | {errs(r)} |")
    out = [*peak, "", "| load | path | req/s | p50 | p99 | p99.9 | generator kept up | send lag p99"
           " | broker CPU/req | FastMCP CPU/req | errors |",
           "|---|---|---|---|---|---|---|---|---|---|---|", *rows, "",
           "Added by the broker (broker − direct, medians over rounds):", "",
           "| load | edge | p50 | p99 | p99.9 |", "|---|---|---|---|---|", *added]
    return "\n".join(out)


# ---------------------------------------------------------------- part 2

def slow_case(a, workdir, slow_url, n, callers, queue_depth, rate, report):
    """One broker with `slow` at `n` instances; `callers` in flight (closed
    loop), or open loop at `rate`; the echo probe alongside."""
    tag = f"slow-n{n}-c{callers}-q{queue_depth}-r{rate or 0}"
    cfg = os.path.join(workdir, f"{tag}.toml")
    with open(cfg, "w") as f:
        f.write(broker_toml(f"""[[routers]]
name = "echo"
wasm = "echo.wasm"

[[routers]]
name = "slow"
upstream = "{slow_url}"
instances_per_shard = {n}
queue_depth = {queue_depth}
call_deadline = "30s"
"""))
    broker = Proc(f"broker-{tag}", [B.BROKER, "--config", cfg], workdir, SERVER_CPU)
    try:
        frames = f"frames://{broker.ready['frames']}"
        probe_secs = a.slow_duration - a.cpu_window - 4
        probe = lambda t, d=probe_secs: loadgen_argv(frames, "echo", {"text": "hi"}, t, workdir,
                                                     1, d, 1, rate=a.probe_rate)
        log(f"{tag}: echo probe on the idle broker")
        idle = run(probe(f"{tag}-probe-idle"), f"{tag}-probe-idle", workdir, watch=(broker,))
        args = {"ms": a.sleep_ms}
        conns = min(CONNECTIONS, callers)
        if rate is None:
            slow_argv = loadgen_argv(frames, "sleep_ms", args, f"{tag}-load", workdir, 3,
                                     a.slow_duration, conns, concurrency=callers, timeout="30s")
        else:
            slow_argv = loadgen_argv(frames, "sleep_ms", args, f"{tag}-load", workdir, 3,
                                     a.slow_duration, conns, rate=rate, timeout="30s")
        log(f"{tag}: {callers if rate is None else f'{rate}/s'} slow calls, then the echo probe")
        before = broker.threads_cpu()
        t0 = time.monotonic()
        load = subprocess.Popen(slow_argv, text=True, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE)
        # The load alone, past its warmup: the CPU the slow calls cost.
        time.sleep(3)
        w0, f0, tw0 = broker.threads_cpu(), a._slow_server.threads_cpu(), time.monotonic()
        time.sleep(a.cpu_window)
        w1, f1, tw1 = broker.threads_cpu(), a._slow_server.threads_cpu(), time.monotonic()
        window = {"seconds": tw1 - tw0, "broker_cpu_s": cpu_delta(w0, w1),
                  "fastmcp_cpu_s": cpu_delta(f0, f1)}
        # Then the probe, its measured phase inside the load's.
        pr = subprocess.Popen(probe(f"{tag}-probe-busy", a.slow_duration - a.cpu_window - 4),
                              text=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        busy = finish(pr, f"{tag}-probe-busy", workdir)
        rss = broker.rss_mib()
        fast_rss = a._slow_server.rss_mib()
        rep = finish(load, f"{tag}-load", workdir)
        wall = time.monotonic() - t0
        cpu = cpu_delta(before, broker.threads_cpu())
        fast_cpu = {}
        row = {"tag": tag, "instances": n, "callers": callers, "queue_depth": queue_depth,
               "rate": rate, "sleep_ms": a.sleep_ms, "load": rep, "probe_idle": idle,
               "probe_busy": busy, "wall_s": wall, "broker_cpu_s": cpu, "window": window,
               "fastmcp_cpu_s": fast_cpu, "broker_rss_mib": rss, "fastmcp_rss_mib": fast_rss,
               "argv": slow_argv, "loadavg_after": list(os.getloadavg())}
        report.setdefault("slow_runs", []).append(row)
        log(f"  {rep.get('achieved_rps') or 0:.1f} calls/s, p50 {fmt_us(lat(rep, 'p50'))},"
            f" errors {errs(rep)}; shard {window['broker_cpu_s'].get('shard-0', 0):.2f} s CPU"
            f" in {window['seconds']:.1f} s;"
            f" probe p99 {fmt_us(lat(idle, 'p99'))} idle / {fmt_us(lat(busy, 'p99'))} busy")
        return row
    finally:
        broker.stop()


def slow_section(a, workdir, report):
    server = Proc("fastmcp-slow", [PYTHON, os.path.join(HERE, "servers", "fastmcp_slow.py"), "0"],
                  workdir, LOADGEN_CPU)
    a._slow_server = server
    rows = []
    try:
        url = f"http://{server.ready['http']}/mcp"
        for n in a.slow_ns:
            rows.append(slow_case(a, workdir, url, n, n, 1024, None, report))
        if a.queue_rows:
            q = a.slow_ns[0]
            # 2N callers at N instances: N wait in the queue (default depth).
            rows.append(slow_case(a, workdir, url, q, 2 * q, 1024, None, report))
            # Open loop at 2N calls/s against N calls/s of capacity with a
            # queue of N/2: the queue fills, the rest is refused.
            rows.append(slow_case(a, workdir, url, q, 2 * q, max(1, q // 2), 2 * q, report))
    finally:
        server.stop()
    out = ["| instances | load | queue_depth | ok calls/s | in flight (ok/s × mean) | call p50"
           " | call p99 | errors | shard-0 CPU | wasm-wasi-io CPU | broker CPU, all threads"
           " | FastMCP CPU | broker RSS | echo probe p50 / p99, idle broker"
           " | echo probe p50 / p99, under the slow load |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        rep, win = r["load"], r["window"]
        c, fc, w = win["broker_cpu_s"], win["fastmcp_cpu_s"], win["seconds"]
        load = (f"{r['callers']} in flight (closed)" if r["rate"] is None
                else f"open loop {r['rate']}/s")
        ok_rps = (rep.get("ok") or 0) / rep["duration_s"] if rep.get("duration_s") else 0.0
        mean = lat(rep, "mean")
        inflight = ok_rps * mean / 1e6 if mean else 0.0
        pct = lambda x: f"{100 * x / w:.1f}%"
        out.append(
            f"| {r['instances']} | {load} | {r['queue_depth']} | {ok_rps:.1f} | {inflight:.1f}"
            f" | {fmt_us(lat(rep, 'p50'))} | {fmt_us(lat(rep, 'p99'))} | {errs(rep)}"
            f" | {pct(c.get('shard-0', 0.0))} | {pct(c.get('wasm-wasi-io', 0.0))}"
            f" | {pct(c.get('total', 0.0))} | {pct(fc.get('total', 0.0))}"
            f" | {r['broker_rss_mib'] or 0:.0f} MiB"
            f" | {fmt_us(lat(r['probe_idle'], 'p50'))} / {fmt_us(lat(r['probe_idle'], 'p99'))}"
            f" | {fmt_us(lat(r['probe_busy'], 'p50'))} / {fmt_us(lat(r['probe_busy'], 'p99'))}"
            f" ({errs(r['probe_busy'])}) |")
    out += ["", "CPU columns: share of one core over a window of the slow load alone"
            " (after its warmup, before the probe)."]
    return "\n".join(out), rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--rates", default="100,200", help="open-loop rates, req/s")
    ap.add_argument("--peak-duration", type=float, default=5)
    ap.add_argument("--sse", action="store_true",
                    help="FastMCP answers with SSE streams (default: application/json)")
    ap.add_argument("--duration", type=float, default=20)
    ap.add_argument("--warmup", type=float, default=5)
    ap.add_argument("--idle-duration", type=float, default=10)
    ap.add_argument("--slow-ns", default="16,64,256", help="instances_per_shard values")
    ap.add_argument("--sleep-ms", type=int, default=1000)
    ap.add_argument("--slow-duration", type=float, default=15,
                    help="measured seconds of each slow load (>= --cpu-window + 6)")
    ap.add_argument("--cpu-window", type=float, default=5,
                    help="seconds of the slow load alone over which CPU is read")
    ap.add_argument("--probe-rate", type=int, default=200)
    ap.add_argument("--no-queue-rows", dest="queue_rows", action="store_false")
    ap.add_argument("--only", choices=["latency", "slow"])
    ap.add_argument("--json", help="write the full report here")
    a = ap.parse_args()
    a.rates = [int(x) for x in a.rates.split(",") if x]
    a.slow_ns = [int(x) for x in a.slow_ns.split(",") if x]
    a.duration, a.warmup, a.peak_duration = int(a.duration), int(a.warmup), int(a.peak_duration)
    a.idle_duration, a.slow_duration = int(a.idle_duration), int(a.slow_duration)
    if a.slow_duration < a.cpu_window + 6:
        sys.exit("--slow-duration must be at least --cpu-window + 6")
    for path in (B.BROKER, B.LOADGEN, PYTHON, os.path.join(ROUTERS, "upstream.wasm")):
        if not os.path.exists(path):
            sys.exit(f"missing {path} (see the docstring: build, build-routers, scripts/setup)")
    report = {"machine": B.machine(), "args": {k: v for k, v in vars(a).items()
                                               if not k.startswith("_")},
              "binaries": {"broker": B.BROKER, "loadgen": B.LOADGEN, "routers": ROUTERS,
                           "python": PYTHON},
              "placement": {"broker": SERVER_CPU, "fastmcp_and_loadgen": LOADGEN_CPU}}
    workdir = tempfile.mkdtemp(prefix="mcp-upstream-bench-")
    log(f"work directory {workdir}")
    tables = []
    failed = None
    try:
        if a.only != "slow":
            loads, names = latency_section(a, workdir, report)
            tables.append("## Latency added over calling FastMCP directly"
                          f" ({'SSE' if a.sse else 'JSON'} answers)\n\n"
                          + latency_tables(report, loads, names))
        if a.only != "latency":
            t, _ = slow_section(a, workdir, report)
            tables.append(f"## Slow upstream calls held by one shard ({a.sleep_ms} ms each)"
                          "\n\n" + t)
    except Exception as e:  # noqa: BLE001 -- keep what the finished sections measured
        failed = f"{type(e).__name__}: {e}"
        report["failure"] = failed
        tables.append(f"**Run stopped:** {failed}")
    report["loadavg_end"] = list(os.getloadavg())
    text = "\n\n".join(tables)
    report["markdown"] = text
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)
    print(text)
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
