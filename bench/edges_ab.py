#!/usr/bin/env python3
"""bench/edges_ab.py: two or more broker builds side by side on every edge.

For a change that touches the request path of the frame, gRPC and HTTP
edges at once: each SPEC is NAME=BINARY. Every broker runs one shard on
CPU 1 with the WASM `echo` router (the embedded default's shape, no native
echo), all started at once; each round drives every (edge, server) pair in
an order rotated every round, so that drift from other jobs spreads over
all, with mcp-loadgen on CPU 0 in closed loop (frames and gRPC: 4
connections, 256 in flight; HTTP: 64 connections, one request each). CPU per request is the server's on-CPU time
(/proc/PID/task/*/schedstat) over the run divided by its requests: steadier
than throughput on a shared machine.

  git worktree add /tmp/before <commit>
  (cd /tmp/before && CARGO_TARGET_DIR=/tmp/before-target cargo build --release -p mcp-broker)
  bench/edges_ab.py 5 before=/tmp/before-target/release/mcp-broker \\
      after=target/release/mcp-broker

`http-2026` is the HTTP edge in protocol 2026-07-28 (stateless, every
POST carrying `Mcp-Method`/`Mcp-Name`); `http` is 2025-11-25 (sessions).
EDGES_AB_EDGES=http,http-2026 picks the edges to run (default: all).

Stdlib only; reuses scripts/bench's helpers. Prints a Markdown table of
medians [min-max].
"""
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import scriptload  # noqa: E402

B = scriptload.bench_script()

EDGES = tuple(
    e for e in ("frames", "grpc", "http", "http-2026")
    if e in os.environ.get("EDGES_AB_EDGES", "frames,grpc,http,http-2026").split(",")
)
# The MCP revision mcp-loadgen speaks on each HTTP edge.
MCP_VERSIONS = {"http": "2025-11-25", "http-2026": "2026-07-28"}


def target(server, edge):
    if edge in MCP_VERSIONS:
        return ("http", f"{server.ready['http']}/mcp")
    return (edge, server.ready[edge])


def http_closed(addr, wd, tag, duration, mcp_version, connections=64):
    """Closed loop on the HTTP edge: HTTP/1.1 carries one request at a time
    per connection, so the concurrency is the connections."""
    import json
    import subprocess
    out = os.path.join(wd, f"{tag}.json")
    argv = [B.LOADGEN, "--target", f"http://{addr}", *B.TOOL_ARGS, "--cpus", "0",
            "--warmup", "1s", "--duration", f"{duration}s", "-q", "--json", out,
            "--connections", str(connections), "--concurrency", str(connections),
            "--mcp-version", mcp_version]
    r = subprocess.run(argv, text=True, capture_output=True)
    try:
        with open(out) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {"failure": f"no report (exit {r.returncode}): {r.stderr[-500:]}"}


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    rounds, specs = int(sys.argv[1]), sys.argv[2:]
    duration = 3
    wd = tempfile.mkdtemp(prefix="edges-ab-")
    servers = {}
    try:
        for spec in specs:
            name, binary = spec.split("=", 1)
            cfg = os.path.join(wd, f"{name}.toml")
            with open(cfg, "w") as f:
                f.write(B.broker_toml(1, [1], False))
            servers[name] = B.Server(name, [binary, "--config", cfg], wd)
        res = {(e, k): {"rps": [], "cpu": []} for e in EDGES for k in servers}
        pairs = [(e, k) for e in EDGES for k in sorted(servers)]
        for r in range(rounds):
            for edge, name in B.rotate(pairs, r):
                s, d = servers[name], res[(edge, name)]
                scheme, addr = target(s, edge)
                c0 = B.cpu_ns(s.proc.pid)
                if edge in MCP_VERSIONS:
                    rep = http_closed(addr, wd, f"{name}-{edge}-{r}", duration,
                                      MCP_VERSIONS[edge])
                else:
                    rep = B.loadgen(addr, [0], "closed", wd, f"{name}-{edge}-{r}", 1, duration,
                                    scheme=scheme)
                c1 = B.cpu_ns(s.proc.pid)
                # Requests over the whole run, warmup included, as the CPU is.
                n = (rep.get("achieved_rps") or 0) * (duration + 1)
                d["rps"].append(rep.get("achieved_rps"))
                d["cpu"].append((c1 - c0) / n if n else None)
                failure = f", {rep['failure']}" if rep.get("failure") else ""
                B.log(f"{name} {edge} round {r}: {rep.get('achieved_rps') or 0:,.0f} req/s "
                      f"(errors {rep.get('errors')}{failure})")
    finally:
        for s in servers.values():
            s.stop()
    print("| edge | server | closed req/s | CPU ns/req |")
    print("|---|---|---|---|")
    for (edge, name), d in sorted(res.items()):
        print(f"| {edge} | {name} | {B.fmt_med_range(d['rps'])} | {B.fmt_med_range(d['cpu'])} |")


if __name__ == "__main__":
    main()
