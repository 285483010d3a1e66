#!/usr/bin/env python3
"""Memory per idle client: log N clients in through parsnip, run one query each, leave
them idle, and divide parsnip's RSS growth by N (DESIGN.md budget: <= 1.5 KiB).

Usage: bench/idle_memory.py [--clients 8000] [--prepared | --mixed] [--no-build] [--pg-bin DIR]
                            [--pgbouncer-bin PATH]
--prepared: each client prepares a named statement and executes it (extended protocol, as
pgx, asyncpg or pgjdbc do) instead of one simple Query, and keeps it while idle.
--mixed: as --prepared, then runs another text as an unnamed statement (as psycopg does
below its prepare threshold), and keeps both while idle.
Starts its own throwaway PostgreSQL via `parsnip --embedded` (trust auth), so it needs
only the release binary (cargo build --release) and PostgreSQL's binaries.
--pgbouncer-bin: side by side in one run instead: a throwaway cluster of the benchmark's
(bench/systems.py), parsnip and then PgBouncer (with max_prepared_statements when 1.21 or
newer) in front of it, both measured the same way, and the ratio."""
import argparse
import asyncio
import os
import signal
import struct
import subprocess
import sys
import tempfile
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
# --mixed: then Parse an unnamed statement, Bind, Describe, Execute, Sync.
UNNAMED = (msg(b"P", b"\0select $1::int * 2\0\0\0") + msg(b"B", b"\0\0\0\0\0\1" + struct.pack("!I", 2) + b"21\0\0")
           + msg(b"D", b"P\0") + msg(b"E", b"\0" + struct.pack("!I", 0)) + msg(b"S", b""))
# What "prepared" clients send, and what the report calls them.
PREPARED = {"msgs": EXTENDED, "kind": "prepared-statement"}


async def client(port, conns, prepared=False, db=b"postgres"):
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    params = b"user\0postgres\0database\0" + db + b"\0\0"
    writer.write(struct.pack("!II", 8 + len(params), 196608) + params)
    await read_until_ready(reader)
    writer.write(PREPARED["msgs"] if prepared else msg(b"Q", b"select 1\0"))
    await read_until_ready(reader)
    if prepared and PREPARED["msgs"] is not EXTENDED:
        await read_until_ready(reader)
    conns.append(writer)


async def measure(port: int, pid: int, clients: int, prepared: bool, db: bytes = b"postgres") -> tuple:
    """Logs `clients` in (one query each, then idle) in two steps; RSS in KiB before, after
    the first third, after all. Closes them at the end."""
    conns = []
    try:
        await client(port, conns, prepared, db)  # warm-up: pool, runtime threads
        base = rss_kib(pid)
        sem = asyncio.Semaphore(200)

        async def one():
            async with sem:
                await client(port, conns, prepared, db)
        # Two steps: the first pays for what does not grow with the number of idle clients
        # (the login burst's buffers, allocator arenas); the second step's growth is the
        # marginal cost of one more idle client.
        first = clients // 3
        await asyncio.gather(*(one() for _ in range(first)))
        time.sleep(3)  # settled: parsnip trims its heap a tick after a burst of logins
        mid = rss_kib(pid)
        await asyncio.gather(*(one() for _ in range(clients - first)))
        time.sleep(3)  # settled: parsnip trims its heap a tick after a burst of logins
        return base, mid, rss_kib(pid)
    finally:
        for w in conns:
            w.close()


def report(name: str, clients: int, prepared: bool, rss: tuple) -> float:
    base, mid, after = rss
    first = clients // 3
    per = (after - base) / clients
    marginal = (after - mid) / (clients - first)
    kind = PREPARED["kind"] if prepared else "simple-Query"
    print(f"idle-memory: {name}: {clients} idle {kind} clients, RSS {base/1024:.1f} -> {mid/1024:.1f} "
          f"({first} clients) -> {after/1024:.1f} MiB; {per:.2f} KiB per idle client overall, "
          f"{marginal:.2f} KiB per additional idle client (clients {first + 1}..{clients})", flush=True)
    return per


async def embedded(a) -> None:
    port = free_port()
    exe = parsnip_release(build=not a.no_build)
    env = dict(parsnip_env(), PARSNIP_PG_BIN=str(find_pg_bindir(a.pg_bin)))
    p = subprocess.Popen([str(exe), "--listen", f"127.0.0.1:{port}", "--max-client-conn", str(a.clients + 10),
                          "--pool-size", "4", "--log-level", "warn"], env=env, stdin=subprocess.DEVNULL,
                         start_new_session=True)
    try:
        wait_listening(port, p, timeout=120)  # the embedded cluster's initdb comes first
        report("parsnip", a.clients, a.prepared, await measure(port, p.pid, a.clients, a.prepared))
    finally:
        stop_process(p, signal.SIGINT, grace=20)


async def side_by_side(a) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import systems  # bench/systems.py: the benchmark's cluster and poolers
    from throwaway import CLEANUPS, service_user
    user = service_user()
    pgb_bin, version = systems.pgbouncer_binary(False, a.pgbouncer_bin)
    if pgb_bin is None:
        raise SystemExit(f"idle-memory: {version}")
    tmp = Path(tempfile.mkdtemp(prefix="parsnip-idle-"))
    if user:
        os.chown(tmp, user.pw_uid, user.pw_gid)
    try:
        pg = systems.Postgres(find_pg_bindir(a.pg_bin), tmp, user)
        pg.start()
        pg.psql(f"CREATE DATABASE {systems.DB}")
        poolers = [systems.Parsnip(pg, tmp, 4, parsnip_release(build=not a.no_build), []),
                   systems.PgBouncer(pg, tmp, 4, pgb_bin, user, version)]
        per = {}
        for pooler in poolers:
            pooler.max_clients = a.clients + 10
            pooler.start()
            try:
                rss = await measure(pooler.port, pooler.pid(), a.clients, a.prepared, systems.DB.encode())
                per[pooler.name] = report(pooler.name, a.clients, a.prepared, rss)
            finally:
                pooler.stop()
        print(f"idle-memory: parsnip / {version}: {per['parsnip'] / per['pgbouncer']:.2f} (overall per client)")
    finally:
        CLEANUPS.run()


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=8000)
    ap.add_argument("--prepared", action="store_true", help="clients prepare and execute a named statement "
                    "(extended protocol) instead of one simple Query")
    ap.add_argument("--mixed", action="store_true", help="as --prepared, and an unnamed statement beside it")
    ap.add_argument("--no-build", action="store_true", help="use target/release/parsnip as it is")
    ap.add_argument("--pg-bin", metavar="DIR", help="PostgreSQL bin dir of the embedded cluster (default: as"
                    " parsnip finds it: $PARSNIP_PG_BIN, pg_config --bindir, the newest /usr/lib/postgresql/*/bin)")
    ap.add_argument("--pgbouncer-bin", metavar="PATH", help="also measure this PgBouncer (e.g. 1.25 from "
                    "bench/build_pgbouncer.sh), side by side with parsnip in front of one throwaway cluster")
    a = ap.parse_args()
    if a.mixed:
        PREPARED.update(msgs=EXTENDED + UNNAMED, kind="named-and-unnamed-statement")
        a.prepared = True
    await (side_by_side(a) if a.pgbouncer_bin else embedded(a))


if __name__ == "__main__":
    asyncio.run(main())
