#!/usr/bin/env python3
"""bench/pgo_train.py: the training load of scripts/build-pgo.

Runs an instrumented broker (built with `-Cprofile-generate`) under the
load its optimised build should be fast for, then stops it with SIGTERM so
that it writes its profile. What the profile does not see is laid out as
cold code, so the load covers what a deployment runs, not only what the
benchmarks measure:
- every edge (frames, gRPC, MCP HTTP in both protocol eras), in closed
  loop (large batches per wake-up) and open loop (one or two requests per
  wake-up, as real clients send them);
- the `echo` router on the synchronous path (`never_waits`) and on a fiber,
  its `echo` tool (the answer passed through) and `echo_text` (the guest
  parses JSON);
- `[tls]` and `[auth]` on every edge, each request carrying a bearer
  token (RS256);
- a `/metrics` scrape per broker.

  bench/pgo_train.py BROKER [SECONDS]     (SECONDS per load, default 3)

Each load is bounded in time; the whole run takes about two minutes. Stdlib
only; reuses scripts/bench's and bench/security_cost.py's helpers.
"""
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import scriptload  # noqa: E402

B = scriptload.bench_script()
SEC = scriptload.load("mcp_security_cost", os.path.join(HERE, "security_cost.py"))
A = SEC.A

OPEN_RATE = 10_000


def start(binary, config_text, wd, name):
    """A broker on `config_text`; its listeners are in `.ready` by edge."""
    cfg = os.path.join(wd, f"{name}.toml")
    with open(cfg, "w") as f:
        f.write(config_text)
    return B.Server(name, [binary, "--config", cfg], wd)


def stop(server):
    """SIGTERM: the broker drains and exits, and the instrumented build
    writes its profile on the way out (SIGKILL would lose it)."""
    server.stop()
    if server.proc.returncode != 0:
        sys.exit(f"pgo_train: {server.name} exited with {server.proc.returncode}; "
                 f"its profile may be incomplete (log: {server.log_path})")


def scrape(server):
    with urllib.request.urlopen(f"http://{server.ready['metrics']}/metrics", timeout=5) as r:
        r.read()


def drive(target, lg_cpus, seconds, tool="echo", rate=None, extra=()):
    argv = [B.LOADGEN, "--target", target, "--tool", tool, "--args", '{"text":"hello"}',
            "--cpus", ",".join(map(str, lg_cpus)), "--connections", "16",
            "--duration", f"{seconds}s", "-q", *extra]
    if rate:
        argv += ["--rate", str(rate)]
    elif not target.startswith("http"):
        # Closed loop, deep: batches of frames and HTTP/2 streams per read.
        # An HTTP/1.1 connection carries one request at a time.
        argv += ["--concurrency", "256"]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 60)
    if r.returncode != 0:
        sys.exit(f"pgo_train: {' '.join(argv)} failed:\n{r.stderr[-1000:]}")


def plain_config(cpus, never_waits):
    return B.broker_toml(1, cpus, False, never_waits=never_waits)


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    binary = os.path.abspath(sys.argv[1])
    seconds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    srv_cpus, lg_cpus = B.cpu_split(os.cpu_count() or 2)
    srv_cpus = srv_cpus[:1]
    wd = tempfile.mkdtemp(prefix="pgo-train-")

    for never_waits in (True, False):
        b = start(binary, plain_config(srv_cpus, never_waits), wd,
                  f"plain-{'sync' if never_waits else 'fiber'}")
        try:
            targets = [f"frames://{b.ready['frames']}", f"grpc://{b.ready['grpc']}",
                       f"http://{b.ready['http']}/mcp"]
            for t in targets:
                for tool in ("echo", "echo_text"):
                    drive(t, lg_cpus, seconds, tool)
                    drive(t, lg_cpus, seconds, tool, rate=OPEN_RATE)
            modern = ("--mcp-version", "2026-07-28")
            drive(targets[2], lg_cpus, seconds, extra=modern)
            drive(targets[2], lg_cpus, seconds, rate=OPEN_RATE, extra=modern)
            scrape(b)
        finally:
            stop(b)
        B.log(f"pgo_train: plain broker, never_waits = {never_waits}: done")

    certs = os.path.join(wd, "certs")
    subprocess.run(["bash", os.path.join(B.ROOT, "scripts", "dev-certs"), certs], check=True,
                   capture_output=True)
    jwks, token = A.keys_and_token(wd)
    b = start(binary, SEC.config(srv_cpus, certs, jwks), wd, "tls-auth")
    try:
        tls = ("--tls-ca", os.path.join(certs, "ca.pem"), "--tls-server-name", "localhost",
               "--bearer-file", token)
        for t in (f"frames+tls://{b.ready['frames']}", f"grpcs://{b.ready['grpc']}",
                  f"https://{b.ready['http']}/mcp"):
            drive(t, lg_cpus, seconds, "echo_text", extra=tls)
            drive(t, lg_cpus, seconds, "echo_text", rate=OPEN_RATE, extra=tls)
        scrape(b)
    finally:
        stop(b)
    B.log("pgo_train: TLS + auth broker: done")
    # Kept only when a step failed (sys.exit above), for its logs.
    shutil.rmtree(wd, ignore_errors=True)


if __name__ == "__main__":
    main()
