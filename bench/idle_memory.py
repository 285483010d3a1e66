#!/usr/bin/env python3
"""Memory per idle client: log N clients in through parsnip, run one query each, leave
them idle, and divide parsnip's RSS growth by N (DESIGN.md budget: <= 1.5 KiB).

Usage: bench/idle_memory.py [--clients 8000] [--prepared] [--no-build] [--pg-bin DIR]
--prepared: each client prepares a named statement and executes it (extended protocol, as
pgx, asyncpg or pgjdbc do) instead of one simple Query, and keeps it while idle.
Starts its own throwaway PostgreSQL via `parsnip --embedded` (trust auth), so it needs
only the release binary (cargo build --release) and PostgreSQL's binaries."""
import argparse
import asyncio
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
from throwaway import (  # noqa: E402  (scripts/throwaway.py: processes, binaries)
    find_pg_bindir, free_port, parsnip_env, parsnip_release, rss_kib, stop_process, wait_listening,
)


async def read_until_ready(reader):
    while True:
        hdr = await reader.readexactly(5)
        n = struct.unpack("!I", hdr[1:])[0]
        body = await reader.readexactly(n - 4)
        if hdr[0:1] == b"E":
            raise RuntimeError(body)
        if hdr[0:1] == b"Z":
            return


def msg(kind, body):
    return kind + struct.pack("!I", 4 + len(body)) + body


# Parse "s1", Bind it with one text parameter, Describe the portal, Execute, Sync.
EXTENDED = (msg(b"P", b"s1\0select $1::int + 1\0\0\0") + msg(b"B", b"\0s1\0\0\0\0\1" + struct.pack("!I", 2) + b"41\0\0")
            + msg(b"D", b"P\0") + msg(b"E", b"\0" + struct.pack("!I", 0)) + msg(b"S", b""))


async def client(port, conns, prepared=False):
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    params = b"user\0postgres\0database\0postgres\0\0"
    writer.write(struct.pack("!II", 8 + len(params), 196608) + params)
    await read_until_ready(reader)
    writer.write(EXTENDED if prepared else msg(b"Q", b"select 1\0"))
    await read_until_ready(reader)
    conns.append(writer)


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=8000)
    ap.add_argument("--prepared", action="store_true", help="clients prepare and execute a named statement "
                    "(extended protocol) instead of one simple Query")
    ap.add_argument("--no-build", action="store_true", help="use target/release/parsnip as it is")
    ap.add_argument("--pg-bin", metavar="DIR", help="PostgreSQL bin dir of the embedded cluster (default: as"
                    " parsnip finds it: $PARSNIP_PG_BIN, pg_config --bindir, the newest /usr/lib/postgresql/*/bin)")
    a = ap.parse_args()
    port = free_port()
    exe = parsnip_release(build=not a.no_build)
    env = dict(parsnip_env(), PARSNIP_PG_BIN=str(find_pg_bindir(a.pg_bin)))
    p = subprocess.Popen([str(exe), "--listen", f"127.0.0.1:{port}", "--max-client-conn", str(a.clients + 10),
                          "--pool-size", "4", "--log-level", "warn"], env=env, stdin=subprocess.DEVNULL,
                         start_new_session=True)
    try:
        wait_listening(port, p, timeout=120)  # the embedded cluster's initdb comes first
        conns = []
        await client(port, conns, a.prepared)  # warm-up: pool, runtime threads
        base = rss_kib(p.pid)
        sem = asyncio.Semaphore(200)

        async def one():
            async with sem:
                await client(port, conns, a.prepared)
        # Two steps: the first pays for what does not grow with the number of idle clients
        # (the login burst's buffers, allocator arenas); the second step's growth is the
        # marginal cost of one more idle client.
        first = a.clients // 3
        await asyncio.gather(*(one() for _ in range(first)))
        time.sleep(1)
        mid = rss_kib(p.pid)
        await asyncio.gather(*(one() for _ in range(a.clients - first)))
        time.sleep(1)
        after = rss_kib(p.pid)
        per = (after - base) / a.clients
        marginal = (after - mid) / (a.clients - first)
        kind = "prepared-statement" if a.prepared else "simple-Query"
        print(f"idle-memory: {a.clients} idle {kind} clients, parsnip RSS {base/1024:.1f} -> {mid/1024:.1f} "
              f"({first} clients) -> {after/1024:.1f} MiB; {per:.2f} KiB per idle client overall, "
              f"{marginal:.2f} KiB per additional idle client (clients {first + 1}..{a.clients})")
        for w in conns:
            w.close()
    finally:
        stop_process(p, signal.SIGINT, grace=20)


if __name__ == "__main__":
    asyncio.run(main())
