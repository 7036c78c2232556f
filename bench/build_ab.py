#!/usr/bin/env python3
"""bench/build_ab.py: one server from two build directories, side by side.

A compiler setting (LTO, codegen units, a toolchain) moves the broker and
its baselines together, and the host's speed moves by up to x2 between runs
on this VM: so both builds of one server run here in one process tree,
alternated, with the same mcp-loadgen (the first directory's, so the
generator does not change with the setting under test).

  bench/build_ab.py SERVERS ROUNDS RATE DIR_A DIR_B
      SERVERS: comma-separated, of http | wasm | native | echo | grpc | tonic | rmcp
      e.g. CARGO_PROFILE_RELEASE_LTO=fat cargo build --release --target-dir /tmp/fat ...
           bench/build_ab.py http,rmcp 3 20000 target/release /tmp/fat/release

Each server runs one shard (or thread) on the upper CPU, the generator on
the lower, 16 connections, the WASM `echo` router (`native`: the broker's
built-in echo). Per round and build: a closed loop (saturated: its req/s and
the server's CPU per request), then an open loop at RATE (the server's CPU
per request and p99). Every build of a server is started once, all at once;
rounds rotate the order. CPU is the whole process's (user + system) over the
run divided by the requests answered. Prints a Markdown table of medians
[min-max] and the B/A ratio of each median.

Stdlib only; needs both directories' release binaries.
"""
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import scriptload  # noqa: E402

B = scriptload.bench_script()
CONNECTIONS = 16
WARMUP, DURATION = 1, 3


def start(which, bindir, wd, cpus, tag=""):
    """(server, target URL) of one server from `bindir`, `tag` added to its
    name (bench/loadgen_ab.py starts its servers here too)."""
    tag = f"-{tag}" if tag else ""
    # scripts/bench's helpers read their binaries from module globals.
    B.BROKER = os.path.join(bindir, "mcp-broker")
    B.TONIC = os.path.join(bindir, "tonic-baseline")
    B.ECHO = os.path.join(bindir, "echo-baseline")
    if which == "http":
        s = B.start_broker(f"broker-http{tag}", wd, 1, cpus, False, addr_key="http",
                           pin_process=True)
        return s, f"http://{s.addr}/mcp"
    if which in ("wasm", "native"):
        s = B.start_broker(f"broker-{which}{tag}", wd, 1, cpus, which == "native")
        return s, f"frames://{s.addr}"
    if which == "grpc":
        s = B.start_broker(f"broker-grpc{tag}", wd, 1, cpus, False, addr_key="grpc",
                           pin_process=True)
        return s, f"grpc://{s.addr}"
    if which == "tonic":
        s = B.start_tonic(wd, 1, cpus)
        return s, f"grpc://{s.addr}"
    if which == "echo":
        s = B.start_echo(wd, 1, cpus)
        return s, f"frames://{s.addr}"
    if which == "uring":
        # The fastest frames server here (raw io_uring, no runtime): the one
        # that shows the generator's own limit first.
        s = B.Server(f"uring-echo{tag}", [os.path.join(bindir, "uring-echo"), "--listen",
                                          "127.0.0.1:0", "--shards", "1", "--cpus",
                                          ",".join(map(str, cpus)), "--defer-taskrun"], wd,
                     cpus=cpus)
        return s, f"frames://{s.addr}"
    if which == "rmcp":
        s = B.Server(f"rmcp-baseline{tag}", [os.path.join(bindir, "rmcp-baseline"), "--listen",
                                              "127.0.0.1:0"], wd, addr_key="http", cpus=cpus)
        return s, f"http://{s.addr}/mcp"
    sys.exit(f"unknown server {which!r}: http, wasm, native, echo, uring, grpc, tonic "
             "or rmcp")


def run(target, lg_cpus, wd, tag, server, rate=None):
    """One loadgen run: (req/s, server CPU ns per request, p99 µs)."""
    scheme, addr = target.split("://", 1)
    addr = addr.removesuffix("/mcp")
    # HTTP/1.1 carries one request at a time per connection; frames and gRPC
    # multiplex scripts/bench's closed-loop depth.
    B.CLOSED_CONCURRENCY = CONNECTIONS if scheme == "http" else 256
    r = B.loadgen(addr, lg_cpus, "open" if rate else "closed", wd, tag, WARMUP, DURATION,
                  rate=rate, connections=CONNECTIONS, scheme=scheme, server=server)
    if r.get("failure") or r.get("errors"):
        B.log(f"{tag}: failure {r.get('failure')} errors {r.get('errors')}")
        return None, None, None
    rps = r.get("achieved_rps") or 0
    cpu = r.get("server_cpu")
    # server_cpu is the share of one core over the whole run; so many
    # requests were answered per second of it.
    per = cpu * 1e9 / rps if rps and cpu is not None else None
    return rps, per, (r.get("latency_us") or {}).get("p99")


def main():
    if len(sys.argv) != 6:
        sys.exit(__doc__)
    which = sys.argv[1].split(",")
    rounds, rate = int(sys.argv[2]), int(sys.argv[3])
    dirs = {"A": sys.argv[4], "B": sys.argv[5]}
    B.LOADGEN = os.path.join(dirs["A"], "mcp-loadgen")
    srv_cpus, lg_cpus = B.cpu_split(os.cpu_count() or 2)
    wd = tempfile.mkdtemp(prefix="build-ab-")
    servers = {}
    keys = ("closed", "cpu_closed", "cpu_open", "p99")
    res = {}
    try:
        for w in which:
            for build, d in dirs.items():
                # A directory per build: the baselines' logs have fixed names.
                bwd = os.path.join(wd, build)
                os.makedirs(bwd, exist_ok=True)
                servers[(w, build)] = start(w, d, bwd, srv_cpus[:1], build)
                res[(w, build)] = {k: [] for k in keys}
        for r in range(rounds):
            for key in B.rotate(sorted(servers), r):
                s, target = servers[key]
                tag = f"{key[0]}-{key[1]}-{r}"
                rps, cpu, _ = run(target, lg_cpus, wd, f"{tag}-c", s)
                _, cpu_o, p99 = run(target, lg_cpus, wd, f"{tag}-o", s, rate=rate)
                d = res[key]
                d["closed"].append(rps)
                d["cpu_closed"].append(cpu)
                d["cpu_open"].append(cpu_o)
                d["p99"].append(p99)
                B.log(f"{key} round {r}: closed {rps or 0:,.0f} req/s at {cpu or 0:,.0f} ns, "
                      f"open {rate:,}/s at {cpu_o or 0:,.0f} ns, p99 {p99} µs")
    finally:
        for s, _ in servers.values():
            s.stop()
    print(f"`bench/build_ab.py {' '.join(sys.argv[1:])}`, {B.machine()['date']}; "
          f"A = `{dirs['A']}`, B = `{dirs['B']}`\n")
    print(f"| server | build | closed req/s | CPU ns/req closed | CPU ns/req open {rate:,}/s "
          "| open p99 µs |\n|---|---|---|---|---|---|")
    for w in which:
        for build in dirs:
            d = res[(w, build)]
            cells = (B.fmt_med_range(d[m]) for m in ("closed", "cpu_closed", "cpu_open", "p99"))
            print(f"| {w} | {build} | " + " | ".join(cells) + " |")
        a, b = res[(w, "A")], res[(w, "B")]

        def q(k):
            xa = [x for x in a[k] if x is not None]
            xb = [x for x in b[k] if x is not None]
            return f"{B.med(xb) / B.med(xa):.3f}" if xa and xb else "n/a"
        print(f"| {w} | B/A | {q('closed')} | {q('cpu_closed')} | {q('cpu_open')} "
              f"| {q('p99')} |")


if __name__ == "__main__":
    main()
