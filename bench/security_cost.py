#!/usr/bin/env python3
"""bench/security_cost.py: what `[tls]` and `[auth]` cost, on every edge.

Three brokers from the same binary run side by side, each with one shard
on the server CPU, serving `echo_text` through the WASM `echo` router:
- `plain`: no [tls], no [auth];
- `tls`: [tls] (ECDSA P-256 certificate from scripts/dev-certs);
- `tls+auth`: [tls] and [auth] (an RS256 JWK Set, one global scope and one
  tool rule); every request carries the same valid bearer token
  (mcp-loadgen --bearer-file): HTTP and gRPC verify it on every request
  (the verified-token cache makes repeats cheap), frames once per
  connection in its InitializeRequest.

For each edge (frames, grpc, http), each round drives every server, in an
order rotated every round, with mcp-loadgen on the other CPU over
keep-alive connections (8, one request in flight each):
- a closed loop: peak rate and server CPU per request (the process's CPU
  time over the measured phase, after the warmup that holds the
  connections' TLS handshakes, divided by its requests);
- capacity at SLO: the highest open-loop rate held with p99 <= 1 ms, no
  errors, and the generator on schedule, by bench/slo.py's x2 sweep from
  1,000/s and SEC_BISECT_STEPS (default 4) bisection steps on the knee. A
  step where the generator fell behind while the server had CPU to spare
  is marked: that bound is the generator's.

  cargo build --release -p mcp-broker -p mcp-loadgen
  bench/security_cost.py [ROUNDS] [EDGES]     (default 2, frames,grpc,http)
  SEC_CONNECTIONS=64 SEC_BISECT_STEPS=0 bench/security_cost.py 3 frames,http
      (the server's core saturated; closed loop only)
  SEC_RATE=30000 SEC_CONNECTIONS=16 bench/security_cost.py 10 http
      (an open loop at 30,000 req/s instead of the closed loop; no capacity)
  SEC_TOGETHER=1 SEC_TOKEN_ONLY=1 SEC_CONNECTIONS=16 bench/security_cost.py 10 http
      (every server at once on the one core, sharing it: see run_together;
      tls+token is TLS with the token sent and ignored, see SERVERS)
  SEC_TOGETHER=1 SEC_SERVERS=plain SEC_BEFORE=/tmp/old/mcp-broker SEC_BEFORE_OF=plain \
      SEC_CONNECTIONS=16 bench/security_cost.py 16 http
      (one build against another, plain, in the same rounds and at once)

Stdlib only; reuses scripts/bench's and bench/auth_cost.py's helpers.
Prints a Markdown table of medians [min-max] and paired ratios.
"""
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")


sys.path.insert(0, HERE)
from scriptload import load as _load  # noqa: E402

B = _load("mcp_bench_script", os.path.join(ROOT, "scripts", "bench"))
A = _load("mcp_auth_cost", os.path.join(HERE, "auth_cost.py"))
S = _load("mcp_bench_slo", os.path.join(HERE, "slo.py"))

BISECT_STEPS = int(os.environ.get("SEC_BISECT_STEPS", "4"))
# 8 (default): latency-bound, what open-loop clients look like; 64: the
# server's core saturated, so CPU per request is the work, not the wakeups.
CONNECTIONS = int(os.environ.get("SEC_CONNECTIONS", "8"))
SERVERS = ("plain", "tls", "tls+auth")
# SEC_SERVERS=plain,tls keeps only those of the three.
if os.environ.get("SEC_SERVERS"):
    SERVERS = tuple(n for n in SERVERS if n in os.environ["SEC_SERVERS"].split(","))
# SEC_BEFORE=/path/to/mcp-broker adds `tls+auth before`: the TLS + auth
# broker from another build, in the same rounds (for bench/NOTES.md's
# before/after figures of a change). SEC_BEFORE_OF=plain (or tls) makes
# it that server's configuration instead.
BEFORE = os.environ.get("SEC_BEFORE")
BEFORE_OF = os.environ.get("SEC_BEFORE_OF", "tls+auth")
if BEFORE:
    SERVERS += (f"{BEFORE_OF} before",)
# SEC_TOKEN_ONLY=1 adds `tls+token`: [tls] without [auth], and the
# generator sends the same bearer token anyway, which the broker ignores.
# The same bytes on the wire as `tls+auth` without auth's work on them:
# tls+auth / tls+token is what authenticating costs, tls+token / tls what
# carrying the token's bytes does.
if os.environ.get("SEC_TOKEN_ONLY") == "1":
    SERVERS += ("tls+token",)
# SEC_RATE=N: an open loop at N req/s instead of the closed loop, and no
# capacity sweep: CPU per request at a fixed rate below the knee, where
# requests arrive one or two per wake-up (as the SLO runs compare gRPC's
# CPU at half of tonic's capacity).
RATE = int(os.environ.get("SEC_RATE", "0")) or None
TOGETHER = os.environ.get("SEC_TOGETHER") == "1"
TOGETHER_S = 5
WARMUP_S = 1
SCHEMES = {  # edge -> (plain scheme, TLS scheme, ready-line key, path)
    "frames": ("frames", "frames+tls", "frames", ""),
    "grpc": ("grpc", "grpcs", "grpc", ""),
    "http": ("http", "https", "http", "/mcp"),
}


def config(cpus, certs, jwks):
    base = A.config(cpus, jwks)
    if certs is None:
        return base
    tls = f"""
[tls]
cert_file = "{certs}/server.pem"
key_file = "{certs}/server.key"
"""
    # Before the routers: the [[routers]] array must come last.
    head, routers = base.split("[[routers]]", 1)
    return head + tls + "\n[[routers]]" + routers


def base(name):
    """The configuration a server runs: `X before` runs X's."""
    return name.removesuffix(" before")


def sends_token(name):
    return base(name) in ("tls+auth", "tls+token")


def loadgen_argv(edge, name, addr, lg_cpus, out, certs, token, rate=None, seconds=3):
    plain, tls, _, path = SCHEMES[edge]
    scheme = plain if base(name) == "plain" else tls
    argv = [B.LOADGEN, "--target", f"{scheme}://{addr}{path}", "--tool", "echo_text",
            "--args", '{"text":"hello"}', "--cpus", ",".join(map(str, lg_cpus)),
            "--connections", str(CONNECTIONS), "--warmup", f"{WARMUP_S}s",
            "--duration", f"{seconds}s", "-q", "--json", out]
    if rate is None:
        argv += ["--concurrency", str(CONNECTIONS)]
    else:
        argv += ["--rate", str(int(rate))]
    if base(name) != "plain":
        argv += ["--tls-ca", os.path.join(certs, "ca.pem"), "--tls-server-name", "localhost"]
    if sends_token(name):
        argv += ["--bearer-file", token]
    return argv


def report(out, p, stderr):
    try:
        with open(out) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {"failure": f"no report (exit {p.returncode}): {stderr[-500:]}"}


def run(server, edge, name, addr, lg_cpus, wd, tag, certs, token, rate=None):
    out = os.path.join(wd, f"{tag}.json")
    argv = loadgen_argv(edge, name, addr, lg_cpus, out, certs, token, rate)
    # The server's CPU is read from the end of the warmup on: `sent` counts
    # the measured phase only, and the warmup holds the connections' TLS
    # handshakes, which are not the keep-alive cost this measures.
    p = subprocess.Popen(argv, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    time.sleep(WARMUP_S)
    cpu0, t0 = server.cpu_seconds(), time.monotonic()
    _, stderr = p.communicate()
    cpu1, t1 = server.cpu_seconds(), time.monotonic()
    rep = report(out, p, stderr)
    total = rep.get("sent") or rep.get("requests") or 0
    if cpu0 is not None and cpu1 is not None:
        rep["server_cpu"] = (cpu1 - cpu0) / (t1 - t0)
        if total:
            rep["cpu_us_per_request"] = (cpu1 - cpu0) * 1e6 / total
    return rep


def run_together(servers, edge, lg_cpus, wd, tag, certs, token):
    """SEC_TOGETHER=1: every server driven at once, closed loop, each by
    its own mcp-loadgen, all on the same CPUs. The host's slow spells (this
    VM's figures move by a third between runs) then fall on every server
    alike, so their ratios hold where back-to-back runs cannot show a few
    per cent. The CPU is the threads' on-CPU time (schedstat, ns), over
    the generators' measured phase, which starts after the same warmup in
    every one of them. {name: report}."""
    procs = {}
    for name, s in servers.items():
        out = os.path.join(wd, f"{tag}-{name.replace(' ', '-')}.json")
        argv = loadgen_argv(edge, name, s.addr, lg_cpus, out, certs, token,
                            seconds=TOGETHER_S)
        procs[name] = (out, subprocess.Popen(argv, text=True, stdout=subprocess.PIPE,
                                             stderr=subprocess.PIPE))
    time.sleep(WARMUP_S)
    cpu0 = {n: B.cpu_ns(s.proc.pid) for n, s in servers.items()}
    time.sleep(TOGETHER_S)
    cpu1 = {n: B.cpu_ns(s.proc.pid) for n, s in servers.items()}
    reps = {}
    for name, (out, p) in procs.items():
        _, stderr = p.communicate()
        rep = report(out, p, stderr)
        total = rep.get("sent") or rep.get("requests") or 0
        if total:
            rep["cpu_us_per_request"] = (cpu1[name] - cpu0[name]) / 1e3 / total
        reps[name] = rep
    return reps


def capacity(server, edge, name, addr, lg_cpus, wd, tag, certs, token, peak):
    """Capacity at SLO by bench/slo.py's sweep and bisection (the same rule
    as `scripts/bench --slo`): (req/s or None, bound by the generator)."""
    if BISECT_STEPS == 0:
        return None, False
    plain, tls, _, path = SCHEMES[edge]
    scheme = plain if base(name) == "plain" else tls
    args = ["--tool", "echo_text", "--args", '{"text":"hello"}']
    if base(name) != "plain":
        args += ["--tls-ca", os.path.join(certs, "ca.pem"), "--tls-server-name", "localhost"]
    if sends_token(name):
        args += ["--bearer-file", token]

    def probe(rate):
        return S.probe(B.LOADGEN, f"{scheme}://{addr}{path}", args, lg_cpus, wd,
                       f"{tag}-{int(rate)}", rate, CONNECTIONS, 3, server=server)
    c = S.capacity(probe, start=1000, limit=max(peak, 1000) * 2, bisect_steps=BISECT_STEPS,
                   log=B.log)
    return c["capacity"], c["bound"] == "generator"


def record(r, edge, name, rep):
    """Adds a run's throughput and CPU to `r`; a failed run ends the
    benchmark."""
    if rep.get("failure") or rep.get("errors"):
        sys.exit(f"{edge} {name}: the run failed: {rep.get('failure')} "
                 f"errors={rep.get('errors')} {rep.get('errors_by_kind')}")
    r["peak"].append(rep["achieved_rps"])
    r["cpu"].append(rep.get("cpu_us_per_request"))


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    edges = sys.argv[2].split(",") if len(sys.argv) > 2 else list(SCHEMES)
    nproc = os.cpu_count() or 2
    srv_cpus, lg_cpus = B.cpu_split(nproc)
    srv_cpus = srv_cpus[:1]
    wd = tempfile.mkdtemp(prefix="security-cost-")
    certs = os.path.join(wd, "certs")
    subprocess.run(["bash", os.path.join(ROOT, "scripts", "dev-certs"), certs], check=True)
    jwks, token = A.keys_and_token(wd)
    res = {e: {n: {"peak": [], "cpu": [], "cap": [], "gen": False} for n in SERVERS}
           for e in edges}
    for edge in edges:
        servers = {}
        try:
            for name in SERVERS:
                cfg = os.path.join(wd, f"{edge}-{name}.toml")
                with open(cfg, "w") as f:
                    f.write(config(srv_cpus, None if base(name) == "plain" else certs,
                                   jwks if base(name) == "tls+auth" else None))
                binary = BEFORE if name.endswith("before") else B.BROKER
                servers[name] = B.Server(f"{edge}-{name}".replace(" ", "-"),
                                         [binary, "--config", cfg], wd,
                                         addr_key=SCHEMES[edge][2])
            for rnd in range(rounds):
                if TOGETHER:
                    reps = run_together(servers, edge, lg_cpus, wd, f"{edge}-together-{rnd}",
                                        certs, token)
                    for n, rep in reps.items():
                        record(res[edge][n], edge, n, rep)
                        res[edge][n]["cap"].append(None)
                    B.log(f"round {rnd} {edge}: " + ", ".join(
                        f"{n} {rep.get('cpu_us_per_request', 0):.2f} µs" for n, rep in reps.items()))
                    continue
                for n in B.rotate(list(SERVERS), rnd):
                    s = servers[n]
                    rep = run(s, edge, n, s.addr, lg_cpus, wd, f"{edge}-{n}-closed-{rnd}",
                              certs, token, rate=RATE)
                    r = res[edge][n]
                    record(r, edge, n, rep)
                    B.log(f"round {rnd} {edge} {n}: {'closed' if RATE is None else 'open'} "
                          f"{rep['achieved_rps']:,.0f} req/s, "
                          f"{rep.get('cpu_us_per_request', 0):.2f} µs CPU/request, "
                          f"p99 {rep['latency_us']['p99']} µs")
                    if RATE is not None:
                        r["cap"].append(None)
                        continue
                    cap, gen = capacity(s, edge, n, s.addr, lg_cpus, wd,
                                        f"{edge}-{n}-open-{rnd}", certs, token,
                                        rep["achieved_rps"])
                    r["cap"].append(cap)
                    r["gen"] |= gen
                    if cap is not None:
                        B.log(f"round {rnd} {edge} {n}: capacity at SLO {cap:,.0f} req/s")
        finally:
            for s in servers.values():
                s.stop()
    m = B.machine()
    print(f"\nMachine: {m['cpu_model']}, {m['nproc']} CPUs, kernel {m['kernel']}, "
          f"commit {m['commit']}, {m['date']}; server on CPU {srv_cpus}, "
          f"mcp-loadgen on {lg_cpus}; {rounds} rounds; {CONNECTIONS} keep-alive connections, "
          f"one request in flight each"
          + ("" if RATE is None else f"; open loop at {RATE:,} req/s instead of the closed loop")
          + (f"; SEC_TOGETHER=1: every server driven at once, {TOGETHER_S} s a round, "
             f"closed-loop req/s is each server's share" if TOGETHER else "") + ".\n")
    load = "closed-loop" if RATE is None else "achieved"
    print(f"| edge | server | {load} req/s | server CPU µs/request | capacity at SLO (p99 ≤ 1 ms) |")
    print("|---|---|---|---|---|")
    for edge in edges:
        for n in SERVERS:
            r = res[edge][n]
            cpu = [c for c in r["cpu"] if c]
            caps = [c for c in r["cap"] if c is not None]
            cap = (f"{B.med(caps):,.0f} [{min(caps):,.0f}–{max(caps):,.0f}]" if caps else "not run") \
                + (" (a probe was generator-bound)" if r["gen"] else "")
            print(f"| {edge} | {n} | {B.med(r['peak']):,.0f} [{min(r['peak']):,.0f}–{max(r['peak']):,.0f}] "
                  f"| {B.med(cpu):.1f} [{min(cpu):.1f}–{max(cpu):.1f}] | {cap} |")
    print()
    print("Paired by round (the servers ran " + ("at once" if TOGETHER else "back to back")
          + "; median [min-max]):\n")
    print(f"| edge | ratio | {load} throughput | CPU per request | capacity at SLO |")
    print("|---|---|---|---|---|")
    pairs = [(num, "plain") for num in SERVERS
             if num != "plain" and not num.endswith(" before") and "plain" in SERVERS]
    if "tls+token" in SERVERS:
        pairs += [("tls+token", "tls"), ("tls+auth", "tls+token")]
    if BEFORE:
        # The old build against the same servers as the new one, and the
        # two against each other.
        pairs += [(f"{a} before", b) for a, b in pairs if a == BEFORE_OF]
        pairs += [(BEFORE_OF, f"{BEFORE_OF} before")]
    pairs = [(a, b) for a, b in pairs if a in SERVERS and b in SERVERS]
    for edge in edges:
        for num, den in pairs:
            a, b = res[edge][num], res[edge][den]
            cells = []
            for key in ("peak", "cpu", "cap"):
                xs = [x / y for x, y in zip(a[key], b[key]) if x and y]
                cells.append(f"{B.med(xs):.3f}× [{min(xs):.3f}–{max(xs):.3f}]" if xs else "n/a")
            print(f"| {edge} | {num} / {den} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
