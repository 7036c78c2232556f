#!/usr/bin/env python3
"""bench/profile_diff.py: where one server spends more CPU per request than
another, symbol by symbol (the profiles behind bench/NOTES.md's 2026-12-01
sections).

  bench/profile_diff.py grpc    [RATE] [SECONDS]   broker-grpc against tonic-baseline
  bench/profile_diff.py frames  [RATE] [SECONDS]   broker-native (routing, no WASM)
                                                   against echo-baseline
  bench/profile_diff.py http    [RATE] [SECONDS]   the broker's HTTP edge, 2025-11-25
                                                   (sessions) against 2026-07-28
  bench/profile_diff.py loadgen [RATE] [SECONDS]   mcp-loadgen itself against
                                                   echo-baseline: its CPU by code
  bench/profile_diff.py tls     [REQUESTS]         the HTTP edge over TLS against
                                                   plaintext, saturated
  bench/profile_diff.py auth    [REQUESTS]         the same over TLS with [auth] (one
                                                   bearer token) against TLS alone
                                                   sent the same token
  bench/profile_diff.py top EDGE [REQUESTS]       one broker alone (EDGE: frames, grpc
                                                   or http), its top symbols and the
                                                   inclusive share of the broker's own
                                                   steps (verifier, encoders, timers)
  (defaults: 14000 6 for grpc, 100000 4 for frames, 20000 6 for http, 900000 4 for loadgen,
  400000 for tls and auth, 100000 for top)

grpc, frames and http: each server in turn (scripts/bench's, one shard on the upper
CPU, 16 connections, open loop at RATE from the lower CPU) gets a warmup,
then `perf record -F 4999 -g` attached for RATE x SECONDS requests. Prints
each profile's total, user and kernel CPU per request, then the symbols
whose µs per request differ most (first server minus second). loadgen:
echo-baseline on the upper CPU, the generator recorded for its whole run
on the lower; prints its CPU per request and the shares of the flatbuffers
verifier, of building requests and of the kernel. tls: two brokers as
bench/security_cost.py starts them (plain, and [tls] with scripts/dev-certs'
ECDSA certificate), each driven in a closed loop over 64 keep-alive
connections (its core saturated, the SEC_CONNECTIONS=64 figures of
docs/security.md) for REQUESTS requests. auth: the same with the [auth] of
security_cost.py (every request carries one valid RS256 token) against
[tls] alone, sent the same token (which it ignores), so that the difference
is what authenticating costs and not the token's bytes.

top: the broker as scripts/bench starts it (one shard, WASM `echo`) in a
closed loop over 16 connections, one request in flight each, recorded
with DWARF call graphs (`perf record --call-graph dwarf`, 999 Hz) so that
inlined callers count: prints its CPU per request, its top symbols by
self time, and the share of all samples spent inside each of STEPS
(inclusive). The bench/NOTES.md 2026-12-02 figures (the verifier at 6.7%
of the HTTP edge, with PROFILE_BROKER set to the build before) come
from it. PROFILE_DATA=/path keeps the recording, for reading one
symbol's callers afterwards (`perf report -i /path -G -S SYMBOL`).

Needs perf (root, or perf_event_paranoid <= 1) and the release binaries.
"""
import collections
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import scriptload  # noqa: E402

B = scriptload.bench_script()
FREQ = "4999"
CONNECTIONS = "16"
VERIFY = re.compile(r"verif|append_trace|get_uoffset|run_verifier|from_utf8")
BUILD = re.compile(r"builder|::create\b|::create<|encode|RequestEncoder|workload::fill|"
                   r"CorrIds::format")


def symbols(data, requests):
    """{(kind, symbol): CPU µs per request}; kind 'k' kernel, '.' user.
    cpu-clock sample periods are nanoseconds."""
    out = subprocess.run(["perf", "report", "-i", data, "--no-children", "--sort", "sym",
                          "--stdio", "-g", "none", "-F", "period,sym"],
                         capture_output=True, text=True).stdout
    per = collections.Counter()
    for line in out.splitlines():
        m = re.match(r"\s*(\d+)\s+\[(.)\]\s+(.*)", line)
        if m:
            sym = re.sub(r"\.(isra|constprop|part)\.\d+|::\{\{closure\}\}", "", m.group(3).strip())
            per[(m.group(2), sym)] += int(m.group(1)) / 1e3 / requests
    return per


def record_server(server, target, extra, rate, seconds, lg_cpus, wd, closed=None):
    """Open loop at `rate` for `seconds`, or with `closed` = (connections,
    requests) a closed loop of that many requests, one in flight on each."""
    if closed:
        conns, requests = closed
        load = ["--connections", str(conns), "--concurrency", str(conns)]
    else:
        requests = int(rate * seconds)
        load = ["--connections", CONNECTIONS, "--rate", str(rate)]
    argv = [B.LOADGEN, "--target", target, *B.TOOL_ARGS, *extra, "--cpus",
            ",".join(map(str, lg_cpus)), *load, "-q"]
    data = os.path.join(wd, f"{server.name}-{len(os.listdir(wd))}.data")
    run_recorded(argv, requests, server, data, ["-F", FREQ, "-g"])
    return symbols(data, requests)


def run_recorded(argv, requests, server, data, perf_args):
    """Warms `server` up with 20,000 requests of mcp-loadgen `argv`, then
    runs `requests` more under `perf record PERF_ARGS` into `data`."""
    subprocess.run(argv + ["--requests", "20000"], capture_output=True)
    perf = subprocess.Popen(["perf", "record", "-q", *perf_args, "-o", data, "-p",
                             str(server.proc.pid)], stderr=subprocess.DEVNULL)
    time.sleep(0.5)  # perf attached before the first request
    r = subprocess.run(argv + ["--requests", str(requests)], capture_output=True, text=True)
    perf.send_signal(2)
    perf.wait(timeout=120)
    if r.returncode != 0:
        sys.exit(f"{server.name}: mcp-loadgen failed: {r.stderr[-800:]}")


# The broker's own steps whose inclusive share `top` prints.
STEPS = ["mcp_schema::verify::VerifiedRequest::verify", "mcp_schema::verify::verify_response",
         "mcp_schema::content_vec::verify", "mcp_schema::encode::ResponseEncoder::finish",
         "mcp_schema::client::RequestEncoder::tool_call", "mcp_broker::dispatch::handle_live",
         "mcp_broker::metrics::record::request", "<monoio::time::timeout::Timeout<T> as",
         "__vdso_clock_gettime"]


def top(edge, requests, srv_cpus, lg_cpus, wd):
    """One broker under a closed loop, with DWARF call graphs."""
    print(f"`bench/profile_diff.py top {edge} {requests}`, {B.machine()['date']}: closed "
          f"loop over {CONNECTIONS} connections, one request in flight each, "
          f"{requests:,} requests recorded.")
    # PROFILE_BROKER=/path/to/mcp-broker profiles another build (a "before").
    B.BROKER = os.environ.get("PROFILE_BROKER", B.BROKER)
    s = B.start_broker(f"broker-{edge}", wd, 1, srv_cpus, False, addr_key=edge)
    target = f"http://{s.addr}/mcp" if edge == "http" else f"{edge}://{s.addr}"
    argv = [B.LOADGEN, "--target", target, *B.TOOL_ARGS, "--cpus",
            ",".join(map(str, lg_cpus)), "--connections", CONNECTIONS, "--concurrency",
            CONNECTIONS, "-q"]
    # PROFILE_DATA=/path keeps the recording (for `perf report -G -S SYMBOL`).
    data = os.environ.get("PROFILE_DATA") or os.path.join(wd, "top.data")
    try:
        run_recorded(argv, requests, s, data, ["-F", "999", "--call-graph", "dwarf,32768"])
    finally:
        s.stop()
    per = symbols(data, requests)
    print()
    summary(s.name, per)
    print("\n| µs/request (self) | symbol |\n|---|---|")
    for (k, sym), v in sorted(per.items(), key=lambda kv: -kv[1])[:25]:
        print(f"| {v:.3f} | `[{k}] {sym[:110]}` |")
    out = subprocess.run(["perf", "report", "-i", data, "--children", "--sort", "sym",
                          "--stdio", "-g", "none"], capture_output=True, text=True).stdout
    print("\n| share of all samples (inclusive) | step |\n|---|---|")
    for step in STEPS:
        shares = [float(m.group(1)) for line in out.splitlines()
                  if step in line and (m := re.match(r"\s*([\d.]+)%", line))]
        print(f"| {max(shares, default=0.0):.2f}% | `{step}` |")


def summary(name, per):
    user = sum(v for (k, _), v in per.items() if k == ".")
    kern = sum(v for (k, _), v in per.items() if k == "k")
    print(f"- {name}: {user + kern:.1f} µs/request (user {user:.1f}, kernel {kern:.1f})")


def diff(names, a, b, top=40):
    print()
    summary(names[0], a)
    summary(names[1], b)
    print(f"\n| {names[0]} − {names[1]} | {names[0]} | {names[1]} | symbol |\n|---|---|---|---|")
    for key in sorted(set(a) | set(b), key=lambda k: b[k] - a[k])[:top]:
        print(f"| {a[key] - b[key]:+.3f} | {a[key]:.3f} | {b[key]:.3f} | "
              f"`[{key[0]}] {key[1][:110]}` |")


def main():
    what = sys.argv[1] if len(sys.argv) > 1 else "grpc"
    default_rate, default_s = {"grpc": (14000, 6), "frames": (100000, 4), "http": (20000, 6),
                               "loadgen": (900000, 4), "tls": (400000, 1),
                               "auth": (400000, 1), "top": (1, 1)}.get(what, (0, 0))
    if not default_rate:
        sys.exit("first argument: grpc, frames, http, loadgen, tls, auth or top")
    if what == "top":
        edge = sys.argv[2] if len(sys.argv) > 2 else ""
        if edge not in ("frames", "grpc", "http"):
            sys.exit("top EDGE: frames, grpc or http")
        srv_cpus, lg_cpus = B.cpu_split(os.cpu_count() or 2)
        requests = int(sys.argv[3]) if len(sys.argv) > 3 else 100000
        return top(edge, requests, srv_cpus[:1], lg_cpus, tempfile.mkdtemp(prefix="profile-"))
    rate = int(sys.argv[2]) if len(sys.argv) > 2 else default_rate
    seconds = float(sys.argv[3]) if len(sys.argv) > 3 else default_s
    srv_cpus, lg_cpus = B.cpu_split(os.cpu_count() or 2)
    srv_cpus = srv_cpus[:1]
    wd = tempfile.mkdtemp(prefix="profile-diff-")
    if what in ("tls", "auth"):
        return tls(rate, srv_cpus, lg_cpus, wd, auth=what == "auth")
    print(f"`bench/profile_diff.py {what} {rate} {seconds:g}`, {B.machine()['date']}: open loop "
          f"at {rate:,} req/s over {CONNECTIONS} connections, {int(rate * seconds):,} "
          f"requests recorded per server.")
    if what == "loadgen":
        echo = B.start_echo(wd, 1, srv_cpus)
        try:
            data = os.path.join(wd, "loadgen.data")
            subprocess.run(["perf", "record", "-q", "-F", FREQ, "-g", "-o", data, "--",
                            B.LOADGEN, "--target", f"frames://{echo.addr}", *B.TOOL_ARGS,
                            "--cpus", ",".join(map(str, lg_cpus)), "--connections",
                            CONNECTIONS, "--rate", str(rate), "--warmup", "0s", "--duration",
                            f"{seconds}s", "-q"], capture_output=True, check=True)
        finally:
            echo.stop()
        per = symbols(data, rate * seconds)
        total = sum(per.values())
        print()
        summary("mcp-loadgen", per)
        for label, pick in [("the flatbuffers verifier", lambda k: VERIFY.search(k[1])),
                            ("building requests", lambda k: BUILD.search(k[1])),
                            ("kernel", lambda k: k[0] == "k")]:
            share = sum(v for k, v in per.items() if pick(k)) / total
            print(f"- {label}: {share:.0%} of its CPU")
        return
    servers = []
    try:
        if what == "grpc":
            servers.append(B.start_broker("broker-grpc", wd, 1, srv_cpus, False,
                                          addr_key="grpc", pin_process=True))
            servers.append(B.start_tonic(wd, 1, srv_cpus))
            runs = [(s.name, s, f"grpc://{s.addr}", ()) for s in servers]
        elif what == "frames":
            servers.append(B.start_broker("broker-native", wd, 1, srv_cpus, True))
            servers.append(B.start_echo(wd, 1, srv_cpus))
            runs = [(s.name, s, f"frames://{s.addr}", ()) for s in servers]
        else:
            servers.append(B.start_broker("broker-http", wd, 1, srv_cpus, False,
                                          addr_key="http"))
            s = servers[0]
            runs = [(f"http {era}", s, f"http://{s.addr}/mcp", ("--mcp-version", era))
                    for era in ("2025-11-25", "2026-07-28")]
        profiles = [record_server(s, t, x, rate, seconds, lg_cpus, wd) for _, s, t, x in runs]
    finally:
        for s in servers:
            s.stop()
    diff([n for n, *_ in runs], *profiles)


def tls(requests, srv_cpus, lg_cpus, wd, auth=False):
    sec = scriptload.load("mcp_security_cost", os.path.join(HERE, "security_cost.py"))
    print(f"`bench/profile_diff.py {'auth' if auth else 'tls'} {requests}`, "
          f"{B.machine()['date']}: closed loop over 64 connections, {requests:,} requests "
          f"recorded per server.")
    certs = os.path.join(wd, "certs")
    subprocess.run(["bash", os.path.join(HERE, "..", "scripts", "dev-certs"), certs],
                   check=True, capture_output=True)
    jwks, token = sec.A.keys_and_token(wd) if auth else (None, None)
    tls_args = ["--tls-ca", os.path.join(certs, "ca.pem"), "--tls-server-name", "localhost"]
    # (name, scheme, certificates, JWK Set, loadgen arguments)
    # auth: against the same token sent to a broker without [auth], which
    # ignores it, so the difference is auth's own work, not the token's bytes.
    runs = ([("https+auth", "https", certs, jwks, tls_args + ["--bearer-file", token]),
             ("https+token", "https", certs, None, tls_args + ["--bearer-file", token])]
            if auth else
            [("https", "https", certs, None, tls_args), ("http", "http", None, None, [])])
    servers, profiles = [], []
    try:
        for name, scheme, c, j, args in runs:
            cfg = os.path.join(wd, f"{name}.toml")
            with open(cfg, "w") as f:
                f.write(sec.config(srv_cpus, c, j))
            s = B.Server(f"broker-{name}", [B.BROKER, "--config", cfg], wd, addr_key="http")
            servers.append(s)
            profiles.append(record_server(s, f"{scheme}://{s.addr}/mcp", args, 0, 0, lg_cpus,
                                          wd, closed=(64, requests)))
    finally:
        for s in servers:
            s.stop()
    diff([s.name for s in servers], *profiles)


if __name__ == "__main__":
    main()
