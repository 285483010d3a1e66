#!/usr/bin/env python3
"""Where an idle client's memory goes: parsnip (release build) under valgrind's massif,
N idle clients logged in as bench/idle_memory.py logs them in, then SIGTERM; the peak
snapshot's allocation tree says what each idle client holds (task cell, socket
registration, cancel slot, ...). Divide each entry by N (or by its size, to count them).

Usage: bench/idle_massif.py [--clients 2000] [--prepared] [--out DIR]
Then: ms_print --threshold=0.3 DIR/massif.out.PID | less   (needs valgrind installed)"""
import argparse
import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "scripts"))
import idle_memory  # noqa: E402
from throwaway import find_pg_bindir, free_port, parsnip_env, parsnip_release, wait_listening  # noqa: E402


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=2000)
    ap.add_argument("--prepared", action="store_true")
    ap.add_argument("--out", default="/tmp")
    a = ap.parse_args()
    port = free_port()
    env = dict(parsnip_env(), PARSNIP_PG_BIN=str(find_pg_bindir(None)))
    p = subprocess.Popen(["valgrind", "--tool=massif", f"--massif-out-file={a.out}/massif.out.%p", "--threshold=0.2",
                          str(parsnip_release(build=False)), "--listen", f"127.0.0.1:{port}", "--max-client-conn",
                          str(a.clients + 10), "--pool-size", "4", "--log-level", "warn"],
                         env=env, stdin=subprocess.DEVNULL, start_new_session=True)
    wait_listening(port, p, timeout=300)
    conns = []
    await idle_memory.client(port, conns, a.prepared)
    sem = asyncio.Semaphore(50)

    async def one():
        async with sem:
            await idle_memory.client(port, conns, a.prepared)
    await asyncio.gather(*(one() for _ in range(a.clients)))
    time.sleep(5)  # idle: parked sessions, free lists trimmed
    os.kill(p.pid, signal.SIGTERM)
    p.wait(timeout=300)
    print(f"idle-massif: {a.clients} idle clients; profile in {a.out}/massif.out.{p.pid}")


if __name__ == "__main__":
    asyncio.run(main())
