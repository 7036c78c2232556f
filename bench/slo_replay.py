#!/usr/bin/env python3
"""bench/slo_replay.py: recorded capacity-at-SLO sweeps decided again by
bench/slo.py's current rules, without measuring anything.

  bench/slo_replay.py bench/results/*slo*.json

Every server's sweep (each round's, in runs of several rounds) is replayed
through `slo.redecide`: the probes come back in the order they were taken,
so the sweep visits the same rates as long as the rules still say "holds"
where they did. Prints each sweep whose capacity or bound (server,
generator, limit) reads differently today, and each one the record cannot
replay. Sweeps bisected other than scripts/bench's four times (such as
bench/slo_budget.py's) are replayed with the step count that fits them.
A report keeps the figures of the rules it was written under; this shows
what a change of rule does to them (bench/NOTES.md names the runs).
Stdlib only.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import slo  # noqa: E402


def sweeps(o, path=""):
    """(path, sweep) of every recorded sweep in a report's JSON."""
    if isinstance(o, dict):
        if "points" in o and "capacity" in o and "bound" in o and "rounds" not in o:
            yield path, o
        for k, v in o.items():
            yield from sweeps(v, f"{path}/{k}")
    elif isinstance(o, list):
        for i, v in enumerate(o):
            yield from sweeps(v, f"{path}[{i}]")


def main(paths):
    changed = 0
    for f in paths:
        with open(f) as fh:
            d = json.load(fh)
        for path, c in sweeps(d.get("capacity", {}), "capacity"):
            # scripts/bench bisects 4 times by default, bench/slo_budget.py
            # 3: the steps that replay the record are the ones it was made
            # with.
            for steps in (4, 3, 5, 2, 6):
                now, exact = slo.redecide(c, bisect_steps=steps)
                if exact:
                    break
            name = f"{os.path.basename(f)} {path}"
            if not exact:
                print(f"{name}: not replayable (the record lacks a probe the sweep asks for)")
            elif (now["capacity"], now["bound"]) != (c["capacity"], c["bound"]):
                changed += 1
                print(f"{name}: {c['capacity']} ({c['bound']}) -> "
                      f"{now['capacity']} ({now['bound']})")
    print(f"{changed} sweep(s) read differently under today's rules")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
