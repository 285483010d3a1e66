#!/usr/bin/env python3
"""Runqueue stalls: how long PostgreSQL's backends (and a pooler's threads) waited for a CPU.

A diagnostic for latency tails under load (issue 26): every `--every` seconds it reads
`/proc/PID/schedstat` (time run, time waited on a runqueue) of each backend of `--db` and of
each thread of `--pid`, and prints one line whenever a process waited more than `--min-ms`
since the previous sample, so that a transaction that took 500 ms can be matched with the
backend that sat 500 ms on a runqueue (or with a pooler thread that did). Standard library
only; Linux only; run it alongside a load run:

    python3 bench/runq.py --db bench --pid POOLER_PID --seconds 10 > runq.txt &
    target/release/examples/loadgen -p PORT -d bench -c 200 -T 5 ...
"""

import argparse
import glob
import os
import time


def backends(db: str) -> dict[str, str]:
    """schedstat path -> label, for every backend of `db` (any user)."""
    found = {}
    for d in glob.glob("/proc/[0-9]*"):
        try:
            cmd = open(f"{d}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        words = cmd.split()
        if len(words) >= 3 and words[0] == "postgres:" and words[2] == db:
            found[f"{d}/schedstat"] = f"backend {d[6:]}"
    return found


def threads(pid: int) -> dict[str, str]:
    """schedstat path -> label, for every thread of `pid`."""
    found = {}
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            name = open(f"/proc/{pid}/task/{t}/comm").read().strip()
        except OSError:
            continue
        found[f"/proc/{pid}/task/{t}/schedstat"] = f"{name} {t}"
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", default="bench", help="the database whose backends are watched")
    ap.add_argument("--pid", type=int, help="a pooler whose threads are watched too")
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--every", type=float, default=0.01, help="sampling period, seconds")
    ap.add_argument("--min-ms", type=float, default=30, help="report waits above this (ms per sample)")
    ap.add_argument("--settle", type=float, default=2.5, help="seconds before the processes are listed "
                    "(the pooler opens its server connections when the load starts)")
    args = ap.parse_args()
    time.sleep(args.settle)
    end = time.monotonic() + args.seconds
    watched = backends(args.db) | (threads(args.pid) if args.pid else {})
    last: dict[str, tuple[float, int, int]] = {}
    while time.monotonic() < end:
        now = time.monotonic()
        for path, label in watched.items():
            try:
                ran, waited, _ = map(int, open(path).read().split())
            except (OSError, ValueError):
                continue
            if path in last:
                t0, ran0, waited0 = last[path]
                if (waited - waited0) / 1e6 >= args.min_ms:
                    wall = time.time()
                    print(f"{time.strftime('%H:%M:%S', time.gmtime(wall))}.{int(wall % 1 * 1000):03d} {label}: "
                          f"waited {(waited - waited0) / 1e6:.0f} ms, ran {(ran - ran0) / 1e6:.1f} ms "
                          f"in {(now - t0) * 1000:.0f} ms", flush=True)
            last[path] = (now, ran, waited)
        time.sleep(args.every)


if __name__ == "__main__":
    main()
