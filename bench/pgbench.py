"""The benchmark's usual client: one pgbench run of a case (-S, TPC-B or bench/planheavy.sql in
one -M mode) against PostgreSQL or a pooler, its figures read from pgbench's output and its
per-transaction log (latency percentiles). bench/loadgen.py is the other client; bench/run.py
picks one (--client)."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
from throwaway import run_bounded  # noqa: E402
from report import WORKLOADS, Case  # noqa: E402
from systems import DB, DB_USER, TRANSPORT, Postgres  # noqa: E402


def first_error(text: str) -> str:
    lines = [l.strip() for l in text.splitlines() if l.strip()]
    pick = next((l for l in lines if re.search(r"error|fatal|abort", l, re.I)), lines[0] if lines else "unknown error")
    pick = re.sub(r"^pgbench: (error: )?", "", pick)
    pick = re.sub(r"\s+", " ", pick)
    return pick[:160]


def percentiles(prefix: Path) -> dict:
    """p50/p95/p99 (ms) of the latencies in pgbench's per-transaction logs PREFIX.PID[.THREAD]
    (3rd field, µs; 'failed' or 'skipped' there for transactions that have none); deletes them."""
    lat = []
    for f in prefix.parent.glob(prefix.name + ".*"):
        with open(f) as fh:
            for line in fh:
                fields = line.split(maxsplit=3)
                if len(fields) > 2 and fields[2].isdigit():
                    lat.append(int(fields[2]))
        f.unlink()
    if not lat:
        return {}
    lat.sort()
    pick = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] / 1000  # noqa: E731
    return {"p50_ms": pick(0.50), "p95_ms": pick(0.95), "p99_ms": pick(0.99), "log_samples": len(lat)}


def run_pgbench(pg: Postgres, port: int, case: Case, duration: int, jobs: int, host: str = "127.0.0.1",
                log_prefix: Path | None = None, sampling: float = 1.0) -> dict:
    """One pgbench run; with log_prefix, pgbench logs (a sample of) its transactions there
    (read them with percentiles())."""
    clients = case.clients
    j = 1 if case.latency else max(1, min(jobs, clients))
    argv = [pg.bin("pgbench"), "-n", *WORKLOADS[case.workload][0], "-M", case.mode, "-c", str(clients),
            "-j", str(j), "-T", str(duration), "-h", host, "-p", str(port), "-U", DB_USER, DB]
    if log_prefix is not None:
        argv[1:1] = ["--log", f"--log-prefix={log_prefix}"] + ([f"--sampling-rate={sampling:g}"] if sampling < 1 else [])
    if TRANSPORT["connect"]:
        argv.insert(1, "-C")
    env = dict(os.environ, PGSSLMODE="require") if TRANSPORT["tls"] else None
    timeout = duration + 15 + clients * 0.05
    ran = run_bounded(argv, timeout, env)
    if ran is None:
        return {"ok": False, "error": f"pgbench hung: no result {timeout:.0f}s after start (killed)"}
    returncode, out, err = ran
    res: dict = {"rc": returncode}
    if m := re.search(r"tps = ([\d.]+) \((?:without initial connection time|including reconnection times)\)", out):
        res["tps"] = float(m.group(1))
    if m := re.search(r"latency average = ([\d.]+) ms", out):
        res["latency_ms"] = float(m.group(1))
    if m := re.search(r"number of transactions actually processed: (\d+)", out):
        res["processed"] = int(m.group(1))
    if m := re.search(r"number of failed transactions: (\d+)", out):
        res["failed_txns"] = int(m.group(1))
    res["aborted"] = "aborted" in (out + err).lower()
    res["errors_logged"] = sum(1 for l in err.splitlines() if "error" in l.lower())
    res["ok"] = returncode == 0 and not res["aborted"] and "tps" in res and res.get("processed", 0) > 0
    if not res["ok"]:
        res["error"] = first_error(err if err.strip() else out)
    return res
