#!/usr/bin/env python3
"""bench/vcpu_gaps.py: how often, and for how long, this VM's CPUs stop
running its code (bench/NOTES.md, "what the frame goal allows per
request", its paragraph "The host, measured directly").

  bench/vcpu_gaps.py [SECONDS] [THRESHOLD_US]      (default 10 300)

One spinning process per CPU, pinned, for SECONDS: each reads the clock in
a tight loop and records every gap between two readings longer than
THRESHOLD_US. A gap is time the process did not run. The kernel's own
account of the process (/proc/self/schedstat: time it waited runnable
while another thread of this VM ran) says how much of that the guest's
scheduler knows of; the rest was taken below the guest (the hypervisor
descheduling the vCPU, or an interrupt handler). Prints, per CPU: the
gaps, the longest, their total, and the runqueue wait the guest counted.

Meant for a quiet machine (nothing else running): a server's latency tail
at a rate it normally holds is no figure of the server when the CPUs it ran
on lost milliseconds at a time. /proc/stat's steal column does not show
these (bench/NOTES.md, "a starved host, which steal time does not show").
Stdlib only.
"""
import multiprocessing
import os
import sys
import time


def schedstat():
    """(ns on CPU, ns waiting runnable) of the calling thread."""
    with open("/proc/thread-self/schedstat") as f:
        run, wait, _ = f.read().split()
    return int(run), int(wait)


def spin(cpu, seconds, threshold, out):
    os.sched_setaffinity(0, {cpu})
    pc = time.perf_counter
    gaps = []
    _, wait0 = schedstat()
    t0 = last = pc()
    end = t0 + seconds
    while last < end:
        t = pc()
        if t - last > threshold:
            gaps.append((last - t0, t - last))
        last = t
    _, wait1 = schedstat()
    out.put((cpu, gaps, (wait1 - wait0) / 1e9))


def main():
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 10.0
    threshold_us = float(sys.argv[2]) if len(sys.argv) > 2 else 300.0
    cpus = sorted(os.sched_getaffinity(0))
    q = multiprocessing.Queue()
    procs = [multiprocessing.Process(target=spin, args=(c, seconds, threshold_us / 1e6, q))
             for c in cpus]
    for p in procs:
        p.start()
    results = sorted(q.get() for _ in procs)
    for p in procs:
        p.join()
    print(f"{seconds:g} s spinning on each of CPUs {cpus}; gaps over {threshold_us:g} µs:\n")
    print("| CPU | gaps | longest | total | of which the guest's runqueue wait |")
    print("|---|---|---|---|---|")
    for cpu, gaps, wait in results:
        longest = max((g for _, g in gaps), default=0.0)
        total = sum(g for _, g in gaps)
        print(f"| {cpu} | {len(gaps)} | {longest * 1e3:.2f} ms | {total * 1e3:.2f} ms | "
              f"{wait * 1e3:.2f} ms |")
    for cpu, gaps, _ in results:
        if gaps:
            print(f"\nCPU {cpu}: " + ", ".join(f"{g * 1e3:.2f} ms at {at:.3f} s"
                                            for at, g in gaps[:40]))


if __name__ == "__main__":
    main()
