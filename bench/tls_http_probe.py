#!/usr/bin/env python3
"""bench/tls_http_probe.py: where TLS's extra CPU goes on the HTTP edge.

Starts a `plain` and a `tls` broker (bench/security_cost.py's configs, one
shard on the server CPU) and, per round and per server (order rotated),
sends a fixed number of `echo_text` requests over 64 keep-alive
connections (closed loop, the server's core saturated) while `perf stat`
counts, on the broker process only:
- task-clock, context switches;
- syscalls (raw_syscalls:sys_enter) and io_uring_enter calls;
- io_uring requests submitted, completed, poll-armed, task-work adds;
- per thread: CPU time (from /proc), so a thread other than the shard
  shows up.
Everything is printed per request, with the tls/plain ratio paired by round.

  cargo build --release -p mcp-broker -p mcp-loadgen
  bench/tls_http_probe.py [ROUNDS] [REQUESTS]      (default 3, 100000)
  PROBE_SERVERS=plain,tls,tls+auth bench/tls_http_probe.py
  PROBE_SERVERS=plain,tls,tls@/tmp/old-broker bench/tls_http_probe.py
      (`NAME@BINARY`: that server runs another build, e.g. before a change)

The loadgen warms its 64 connections up first (their TLS handshakes are not
counted: the figure is the keep-alive steady state).

Needs perf with tracepoint access (root, or perf_event_paranoid <= -1).
"""
import os
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import security_cost as S  # noqa: E402

B, A = S.B, S.A
EVENTS = [
    "task-clock",
    "context-switches",
    "raw_syscalls:sys_enter",
    "syscalls:sys_enter_io_uring_enter",
    "io_uring:io_uring_submit_req",
    "io_uring:io_uring_complete",
    "io_uring:io_uring_poll_arm",
    "io_uring:io_uring_task_add",
    "io_uring:io_uring_local_work_run",
]
CONNECTIONS = 64


def thread_cpu(pid):
    """{thread name: CPU seconds} of every thread of `pid`, and
    `NAME.user`, `NAME.sys` for the user and system shares."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                head, rest = f.read().rsplit(")", 1)
            name = head.split("(", 1)[1]
            fields = rest.split()
            tick = os.sysconf("SC_CLK_TCK")
            u, k = int(fields[11]) / tick, int(fields[12]) / tick
            out[name] = out.get(name, 0.0) + u + k
            out[name + ".user"] = out.get(name + ".user", 0.0) + u
            out[name + ".sys"] = out.get(name + ".sys", 0.0) + k
        except (OSError, ValueError, IndexError):
            pass
    return out


def loadgen_argv(server, name, certs, token, lg_cpus):
    """mcp-loadgen's closed loop over CONNECTIONS keep-alive connections
    against the HTTP edge of `server`, a `PROBE_SERVERS` kind (`plain`,
    `tls`, `tls+auth`, optionally `@BINARY`); the caller adds --requests."""
    kind = name.split("@", 1)[0]
    plain, tls, _, path = S.SCHEMES["http"]
    scheme = plain if kind == "plain" else tls
    argv = [B.LOADGEN, "--target", f"{scheme}://{server.addr}{path}", "--tool", "echo_text",
            "--args", '{"text":"hello"}', "--cpus", ",".join(map(str, lg_cpus)),
            "--connections", str(CONNECTIONS), "--concurrency", str(CONNECTIONS), "-q"]
    if kind != "plain":
        argv += ["--tls-ca", os.path.join(certs, "ca.pem"), "--tls-server-name", "localhost"]
    if kind == "tls+auth":
        argv += ["--bearer-file", token]
    return argv


def probe(server, name, certs, token, lg_cpus, requests, wd, tag):
    argv = loadgen_argv(server, name, certs, token, lg_cpus)
    # Warm up: handshakes, instance pools, buffers. The measured run opens
    # its own connections, so its 64 handshakes are counted: 64 against
    # `requests` (0.1 µs/request at 100,000 if a handshake costs 150 µs).
    subprocess.run(argv + ["--requests", "5000"], capture_output=True)
    argv += ["--requests", str(requests), "--json", os.path.join(wd, f"{tag}.json")]
    per, threads, r = perf_run(server.proc.pid, argv, requests, os.path.join(wd, f"{tag}.perf"))
    if r.returncode != 0:
        sys.exit(f"{name}: mcp-loadgen failed: {r.stderr[-800:]}")
    return per, threads


def perf_run(pid, argv, requests, out, events=None):
    """Runs `argv` (a load generator sending `requests` requests) with
    `perf stat` attached to process `pid` for exactly that run. Returns
    ({event: count per request; task-clock in µs}, {thread name, and
    NAME.user / NAME.sys: CPU µs per request}, the finished process)."""
    perf = subprocess.Popen(["perf", "stat", "-x", ",", "-o", out, "-p", str(pid),
                             "-e", ",".join(events or EVENTS)])
    time.sleep(0.3)  # perf attached before the first request
    t0 = thread_cpu(pid)
    r = subprocess.run(argv, text=True, capture_output=True)
    t1 = thread_cpu(pid)
    perf.send_signal(signal.SIGINT)
    perf.wait(timeout=30)
    counts = {}
    with open(out) as f:
        for line in f:
            parts = line.strip().split(",")
            if len(parts) < 3 or line.startswith("#"):
                continue
            try:
                counts[parts[2]] = float(parts[0])
            except ValueError:
                pass  # "<not counted>"
    per = {k: v / requests for k, v in counts.items()}
    per["task-clock"] = counts.get("task-clock", 0) * 1e3 / requests  # ms -> µs
    threads = {k: (t1.get(k, 0) - t0.get(k, 0)) * 1e6 / requests for k in t1}
    return per, threads, r


def start_servers(names, prefix):
    """Certificates, a JWKS and its token, and one broker per name of
    `PROBE_SERVERS` (`plain`, `tls` or `tls+auth`, each optionally
    `@BINARY` for another build) on the first server CPU. Returns the work
    directory, the CA directory, the token, the generator's CPUs and the
    servers by name; the caller stops the servers."""
    srv_cpus, lg_cpus = B.cpu_split(os.cpu_count() or 2)
    srv_cpus = srv_cpus[:1]
    wd = tempfile.mkdtemp(prefix=prefix)
    certs = os.path.join(wd, "certs")
    subprocess.run(["bash", os.path.join(S.ROOT, "scripts", "dev-certs"), certs], check=True,
                   capture_output=True)
    jwks, token = A.keys_and_token(wd)
    servers = {}
    try:
        for n in names:
            cfg = os.path.join(wd, f"http-{len(servers)}.toml")
            kind, _, binary = n.partition("@")
            with open(cfg, "w") as f:
                f.write(S.config(srv_cpus, None if kind == "plain" else certs,
                                 jwks if kind == "tls+auth" else None))
            servers[n] = B.Server(f"http-{kind}-{len(servers)}", [binary or B.BROKER, "--config",
                                  cfg], wd, addr_key="http")
    except BaseException:
        for srv in servers.values():
            srv.stop()
        raise
    return wd, certs, token, lg_cpus, servers


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    requests = int(sys.argv[2]) if len(sys.argv) > 2 else 100_000
    names = os.environ.get("PROBE_SERVERS", "plain,tls").split(",")
    res = {n: [] for n in names}
    wd, certs, token, lg_cpus, servers = start_servers(names, "tls-http-probe-")
    try:
        for rnd in range(rounds):
            for n in B.rotate(list(names), rnd):
                per, threads = probe(servers[n], n, certs, token, lg_cpus, requests, wd,
                                     f"{names.index(n)}-{rnd}")
                res[n].append((per, threads))
                busy = ", ".join(f"{k} {v:.1f}" for k, v in sorted(threads.items(),
                                 key=lambda kv: -kv[1]) if v > 0.05)
                B.log(f"round {rnd} {n}: {per['task-clock']:.1f} µs task-clock/request; "
                      f"threads µs/request: {busy}")
    finally:
        for s in servers.values():
            s.stop()
    m = B.machine()
    print(f"\nMachine: {m['cpu_model']}, {m['nproc']} CPUs, kernel {m['kernel']}, "
          f"commit {m['commit']}, {m['date']}; {rounds} rounds of {requests} requests, "
          f"{CONNECTIONS} connections.\n")
    for n in names:
        for p, t in res[n]:
            for k, v in t.items():
                if k.startswith("shard-0"):
                    p[k] = v
    keys = ["task-clock", "shard-0", "shard-0.user", "shard-0.sys"] + EVENTS[1:]
    print("| per request | " + " | ".join(names) + " | " +
          " | ".join(f"{n} / plain" for n in names if n != "plain") + " |")
    print("|---|" + "---|" * (2 * len(names) - 1))
    for k in keys:
        cells = []
        for n in names:
            xs = [p[k] for p, _ in res[n] if k in p]
            cells.append(f"{B.med(xs):.2f}" if xs else "n/a")
        for n in names:
            if n == "plain":
                continue
            xs = [a[0][k] / b[0][k] for a, b in zip(res[n], res["plain"])
                  if b[0].get(k) and k in a[0]]
            cells.append(f"{B.med(xs):.3f}× [{min(xs):.3f}–{max(xs):.3f}]" if xs else "n/a")
        label = f"{k} (µs)" if k.startswith(("task-clock", "shard")) else k
        print(f"| {label} | " + " | ".join(cells) + " |")
    print("\nCPU µs/request by thread (median):\n")
    for n in names:
        allk = sorted({k for _, t in res[n] for k in t})
        row = ", ".join(f"{k} {B.med([t.get(k, 0) for _, t in res[n]]):.2f}" for k in allk
                        if B.med([t.get(k, 0) for _, t in res[n]]) > 0.01)
        print(f"- {n}: {row}")


if __name__ == "__main__":
    main()
