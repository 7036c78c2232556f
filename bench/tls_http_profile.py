#!/usr/bin/env python3
"""bench/tls_http_profile.py: where a TLS server's shard CPU goes, by code.

Starts the servers `bench/tls_http_probe.py` starts (same configs, one shard
on the server CPU, `NAME@BINARY` for another build), and per round and per
server (order rotated) sends a fixed number of `echo_text` requests over 64
keep-alive connections (after a 5,000-request warmup) while
`perf record -e cpu-clock -F 4999 -t <shard thread>` samples the shard.
Samples are sorted by symbol into the rows of
bench/results/2026-11-30-vm-tls-http-cut.md's profile (our TLS halves,
rustls, ring, memmove/memcpy, mimalloc, kernel, the rest) and printed in
µs per request, median over rounds.

  cargo build --release -p mcp-broker -p mcp-loadgen
  PROBE_SERVERS=plain,tls@/tmp/old-broker,tls bench/tls_http_profile.py [ROUNDS] [REQUESTS]
      (default 3 rounds of 40,000)

Needs perf (root, or perf_event_paranoid <= 1).
"""
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import tls_http_probe as P  # noqa: E402

B, S = P.B, P.S
FREQ = 4999
# First match wins; checked against "dso symbol".
ROWS = [
    ("kernel", re.compile(r"\[kernel")),
    ("tls::uring + record (ours)", re.compile(r"tls::(uring|record)")),
    ("rustls", re.compile(r"\brustls(_pki_types|_webpki|webpki)?::|\bwebpki::")),
    ("ring", re.compile(r"\bring::|ring_core_|aes_gcm|gcm_|aes_hw|aesni|ecp_nistz|"
                        r"sha256_block|sha512_block|GFp_|chacha|poly1305|x25519")),
    ("memmove/memcpy", re.compile(r"mem(move|cpy|set)")),
    ("mimalloc", re.compile(r"\b_?mi_|mimalloc")),
]


def shard_tid(pid):
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                if f.read().strip() == "shard-0":
                    return int(tid)
        except OSError:
            pass
    sys.exit(f"no shard-0 thread in {pid}")


def profile(server, name, certs, token, lg_cpus, requests, wd, tag):
    argv = P.loadgen_argv(server, name, certs, token, lg_cpus)
    subprocess.run(argv + ["--requests", "5000"], capture_output=True)
    data = os.path.join(wd, f"{tag}.data")
    perf = subprocess.Popen(["perf", "record", "-q", "-e", "cpu-clock", "-F", str(FREQ), "-o",
                             data, "-t", str(shard_tid(server.proc.pid))],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.3)  # perf attached before the first request
    r = subprocess.run(argv + ["--requests", str(requests)], text=True, capture_output=True)
    perf.send_signal(2)
    perf.wait(timeout=60)
    if r.returncode != 0:
        sys.exit(f"{name}: mcp-loadgen failed: {r.stderr[-800:]}")
    rep = subprocess.run(["perf", "report", "-i", data, "--stdio", "--no-children", "-g", "none",
                          "--percent-limit", "0", "--sort", "dso,sym", "-F", "sample,dso,sym"],
                         text=True, capture_output=True).stdout
    per = {row: 0.0 for row, _ in ROWS}
    per["everything else"] = 0.0
    total = 0
    for line in rep.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        parts = line.split(None, 1)
        try:
            n = int(parts[0])
        except (ValueError, IndexError):
            continue
        total += n
        rest = parts[1] if len(parts) > 1 else ""
        for row, rx in ROWS:
            if rx.search(rest):
                per[row] += n
                break
        else:
            per["everything else"] += n
    us = 1e6 / FREQ / requests
    out = {k: v * us for k, v in per.items()}
    out["total"] = total * us
    return out


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    requests = int(sys.argv[2]) if len(sys.argv) > 2 else 40_000
    names = os.environ.get("PROBE_SERVERS", "plain,tls").split(",")
    res = {n: [] for n in names}
    wd, certs, token, lg_cpus, servers = P.start_servers(names, "tls-http-profile-")
    try:
        for rnd in range(rounds):
            for n in B.rotate(list(names), rnd):
                p = profile(servers[n], n, certs, token, lg_cpus, requests, wd,
                            f"{names.index(n)}-{rnd}")
                res[n].append(p)
                B.log(f"round {rnd} {n}: " + ", ".join(f"{k} {v:.2f}" for k, v in p.items()))
    finally:
        for s in servers.values():
            s.stop()
    m = B.machine()
    print(f"\nMachine: {m['cpu_model']}, {m['nproc']} CPUs, kernel {m['kernel']}, "
          f"commit {m['commit']}, {m['date']}; {rounds} rounds of {requests} requests, "
          f"{P.CONNECTIONS} connections; shard-thread samples at {FREQ} Hz, "
          "µs per request, median [min–max].\n")
    keys = [row for row, _ in ROWS] + ["everything else", "total"]
    print("| | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for k in keys:
        cells = []
        for n in names:
            xs = [p[k] for p in res[n]]
            cells.append(f"{B.med(xs):.2f} [{min(xs):.2f}–{max(xs):.2f}]")
        print(f"| {k} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
