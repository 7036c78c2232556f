#!/usr/bin/env python3
"""bench/steal_check.py: does the VM's steal time show a slow spell of the host?

Starts echo-baseline (one shard on CPU 1, as scripts/bench does) and drives
it open loop from CPU 0 at each RATE for 5 s, reading /proc/stat's steal
column per CPU around each run. Prints, per rate, echo's achieved rate and
p99 and each CPU's steal share. A slow spell that steal does not show reads
as a high p99 at a rate echo normally holds with steal near 0%
(bench/NOTES.md, "a starved host, which steal time does not show").

  bench/steal_check.py [RATE ...]        (default 20000 100000)

Needs the release binaries (scripts/bench builds them). Stdlib only.
"""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import scriptload  # noqa: E402

B = scriptload.bench_script()


def cpu_times():
    """{cpuN: (steal ticks, all ticks)} from /proc/stat."""
    out = {}
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("cpu") and line[3] != " ":
                v = line.split()
                out[v[0]] = (int(v[8]), sum(int(x) for x in v[1:9]))
    return out


def main():
    rates = [int(r) for r in sys.argv[1:]] or [20_000, 100_000]
    wd = tempfile.mkdtemp(prefix="steal-check-")
    echo = B.start_echo(wd, 1, [1])
    try:
        for rate in rates:
            out = os.path.join(wd, f"{rate}.json")
            a = cpu_times()
            subprocess.run([B.LOADGEN, "--target", f"frames://{echo.addr}", *B.TOOL_ARGS,
                            "--cpus", "0", "--connections", "16", "--rate", str(rate),
                            "--duration", "5s", "--warmup", "1s", "-q", "--json", out],
                           check=True, capture_output=True)
            b = cpu_times()
            with open(out) as f:
                r = json.load(f)
            steal = ", ".join(f"{c} {100 * (b[c][0] - a[c][0]) / max(1, b[c][1] - a[c][1]):.1f}%"
                              for c in sorted(a))
            print(f"rate {rate:,}: achieved {r.get('achieved_rps') or 0:,.0f}, "
                  f"p99 {(r.get('latency_us') or {}).get('p99')} µs; steal {steal}")
    finally:
        echo.stop()


if __name__ == "__main__":
    main()
