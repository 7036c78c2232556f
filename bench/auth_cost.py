#!/usr/bin/env python3
"""bench/auth_cost.py: what `[auth]` costs on the MCP HTTP edge.

Three brokers from the same binary run side by side, each with one shard
on the server CPU: `off` (no [auth]), `off+header` (no [auth], but the
client sends the token anyway: what its bytes cost apart from checking
it) and `on` ([auth] with an RS256 JWK Set, one global scope and one tool
rule). Both serve `echo_text` through the
WASM `echo` router on the HTTP edge, over keep-alive connections. Every
request to `on` carries the same valid bearer token (mcp-loadgen
--bearer-file), so each one pays a full verification: header parse, key
lookup, RSA-2048 signature check, claim checks.

Each round drives every server, in an order rotated every round, with
mcp-loadgen on the other CPU:
- a closed loop: 8 connections, one request in flight each;
- open loops at fixed fractions of `off`'s closed-loop rate, reporting p99
  and errors.
CPU per request is the server process's CPU time over the run divided by
its requests.

  cargo build --release -p mcp-broker -p mcp-loadgen
  bench/auth_cost.py [ROUNDS]            (default 3)

The keys are made by openssl in a temporary directory; the token is signed
with `openssl dgst`. Stdlib only; reuses scripts/bench's helpers. Prints a
Markdown table of medians [min-max].
"""
import base64
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import scriptload  # noqa: E402

B = scriptload.bench_script()

ISSUER = "https://issuer.bench"
AUDIENCE = "https://mcp.bench/mcp"
FRACTIONS = (0.5, 0.7, 0.85)


def b64(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def keys_and_token(wd):
    key = os.path.join(wd, "key.pem")
    subprocess.run(["openssl", "genpkey", "-algorithm", "RSA", "-pkeyopt",
                    "rsa_keygen_bits:2048", "-out", key], check=True, capture_output=True)
    mod = subprocess.run(["openssl", "rsa", "-in", key, "-noout", "-modulus"], check=True,
                         capture_output=True, text=True).stdout.strip().split("=", 1)[1]
    jwks = {"keys": [{"kty": "RSA", "kid": "bench", "use": "sig",
                      "n": b64(bytes.fromhex(mod)), "e": "AQAB"}]}
    jwks_path = os.path.join(wd, "jwks.json")
    with open(jwks_path, "w") as f:
        json.dump(jwks, f)
    now = int(time.time())
    header = b64(json.dumps({"alg": "RS256", "typ": "JWT", "kid": "bench"}).encode())
    claims = b64(json.dumps({"iss": ISSUER, "aud": AUDIENCE, "sub": "bench",
                             "scope": "mcp", "exp": now + 3600, "nbf": now - 60}).encode())
    signing_input = f"{header}.{claims}".encode()
    sig = subprocess.run(["openssl", "dgst", "-sha256", "-sign", key], input=signing_input,
                         check=True, capture_output=True).stdout
    token_path = os.path.join(wd, "token")
    with open(token_path, "w") as f:
        f.write(f"{header}.{claims}.{b64(sig)}")
    return jwks_path, token_path


def config(cpus, jwks):
    auth = "" if jwks is None else f"""
[auth]
issuer = "{ISSUER}"
audience = "{AUDIENCE}"
jwks_file = "{jwks}"
scopes = ["mcp"]

[[auth.rules]]
tools = ["put"]
scopes = ["kv:write"]
"""
    return f"""[broker]
shards = 1
cpus = {json.dumps(cpus)}
drain_timeout = "1s"

[frames]
listen = "127.0.0.1:0"

[grpc]
listen = "127.0.0.1:0"

[http]
listen = "127.0.0.1:0"

[metrics]
listen = "127.0.0.1:0"
{auth}
[[routers]]
name = "echo"
wasm = "echo.wasm"
"""


def run(server, addr, lg_cpus, wd, tag, token, rate=None):
    out = os.path.join(wd, f"{tag}.json")
    argv = [B.LOADGEN, "--target", f"http://{addr}/mcp", "--tool", "echo_text",
            "--args", '{"text":"hello"}', "--cpus", ",".join(map(str, lg_cpus)),
            "--connections", "8", "--warmup", "1s", "--duration", "4s", "-q", "--json", out]
    if rate is not None:
        argv += ["--rate", str(int(rate))]
    if token is not None:
        argv += ["--bearer-file", token]
    cpu0, t0 = server.cpu_seconds(), time.monotonic()
    r = subprocess.run(argv, text=True, capture_output=True)
    cpu1 = server.cpu_seconds()
    try:
        with open(out) as f:
            rep = json.load(f)
    except (OSError, ValueError):
        rep = {"failure": f"no report (exit {r.returncode}): {r.stderr[-500:]}"}
    total = rep.get("sent") or rep.get("requests") or 0
    if cpu0 is not None and cpu1 is not None and total:
        # The whole run's requests (warmup included) over the whole run's CPU.
        rep["cpu_us_per_request"] = (cpu1 - cpu0) * 1e6 / total
    rep["wall"] = time.monotonic() - t0
    return rep


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    nproc = os.cpu_count() or 2
    srv_cpus, lg_cpus = B.cpu_split(nproc)
    srv_cpus = srv_cpus[:1]
    wd = tempfile.mkdtemp(prefix="auth-cost-")
    jwks, token = keys_and_token(wd)
    servers = {}
    # `off+header`: no [auth], but the client sends the same token: what
    # the bytes of the header cost by themselves, apart from checking it.
    for name, j in (("off", None), ("off+header", None), ("on", jwks)):
        cfg = os.path.join(wd, f"{name}.toml")
        with open(cfg, "w") as f:
            f.write(config(srv_cpus, j))
        servers[name] = B.Server(name, [B.BROKER, "--config", cfg], wd, addr_key="http")
    tokens = {"off": None, "off+header": token, "on": token}
    res = {n: {"peak": [], "cpu": [], **{f: [] for f in FRACTIONS}} for n in servers}
    try:
        for rnd in range(rounds):
            order = B.rotate(list(servers), rnd)
            peaks = {}
            for n in order:
                rep = run(servers[n], servers[n].addr, lg_cpus, wd, f"{n}-closed-{rnd}", tokens[n])
                if rep.get("failure") or rep.get("errors"):
                    sys.exit(f"{n}: closed loop failed: {rep.get('failure')} errors={rep.get('errors')}")
                peaks[n] = rep["achieved_rps"]
                res[n]["peak"].append(rep["achieved_rps"])
                res[n]["cpu"].append(rep.get("cpu_us_per_request"))
                B.log(f"round {rnd} {n}: closed {rep['achieved_rps']:,.0f} req/s, "
                      f"{rep.get('cpu_us_per_request', 0):.1f} µs CPU/request")
            for frac in FRACTIONS:
                rate = peaks["off"] * frac
                for n in order:
                    rep = run(servers[n], servers[n].addr, lg_cpus, wd,
                              f"{n}-open-{frac}-{rnd}", tokens[n], rate)
                    p99 = None if rep.get("failure") else rep["latency_us"]["p99"]
                    res[n][frac].append((p99, rep.get("errors", 0), rep.get("lagged")))
                    B.log(f"round {rnd} {n}: {rate:,.0f} req/s p99 {p99} µs errors {rep.get('errors')}")
    finally:
        for s in servers.values():
            s.stop()
    print(f"\n{B.machine()}\n")
    print("| | closed-loop req/s | server CPU µs/request | "
          + " | ".join(f"p99 µs at {int(f * 100)}% of off's peak" for f in FRACTIONS) + " |")
    print("|---|---|---|" + "---|" * len(FRACTIONS))
    for n in servers:
        cells = [B.fmt_rps(B.med(res[n]["peak"])) + f" [{min(res[n]['peak']):,.0f}–{max(res[n]['peak']):,.0f}]",
                 f"{B.med([c for c in res[n]['cpu'] if c]):.1f}"]
        for f in FRACTIONS:
            p99s = [p for p, e, _ in res[n][f] if p is not None]
            errs = sum(e or 0 for _, e, _ in res[n][f])
            cells.append((f"{B.med(p99s):,.0f}" if p99s else "n/a") + (f" ({errs} errors)" if errs else ""))
        print(f"| {n} | " + " | ".join(cells) + " |")
    # Paired by round (the two servers ran back to back): drift of the
    # machine between rounds cancels out of each ratio.
    for num, den in (("on", "off"), ("off+header", "off"), ("on", "off+header")):
        tput = [a / b for a, b in zip(res[num]["peak"], res[den]["peak"])]
        cpu = [(a / b, a - b) for a, b in zip(res[num]["cpu"], res[den]["cpu"]) if a and b]
        print(f"\n{num} / {den}, paired by round (median [min-max]): closed-loop throughput "
              f"{B.med(tput):.3f}× [{min(tput):.3f}–{max(tput):.3f}], CPU per request "
              f"{B.med([r for r, _ in cpu]):.3f}× "
              f"[{min(r for r, _ in cpu):.3f}–{max(r for r, _ in cpu):.3f}] "
              f"({B.med([d for _, d in cpu]):+.1f} µs)")


if __name__ == "__main__":
    main()
