"""A monitoring tool written for PgBouncer, unchanged, against parsnip's console: the
prometheus-pgbouncer-exporter package (PyPI), which reads SHOW STATS, SHOW POOLS, SHOW
DATABASES and SHOW CONFIG through psycopg2 and turns them into Prometheus metrics.

Through parsnip: the exporter must scrape without an error (its pgbouncer_up gauge is 0 if
any of the four commands fails or returns nothing), and its metrics for this scenario's
database must move by exactly what the workload did: transactions and queries counted as
PgBouncer counts them (one query per ReadyForQuery, one transaction per ReadyForQuery that
ends a transaction), bytes both ways, a server connection shown active while a client holds
one in a transaction. Directly against PostgreSQL there is no console: the workload runs and
the scenario reports ok (the runner runs every scenario both ways).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

import psycopg

TARGET_URL = os.environ["TARGET_URL"]
VIA_PARSNIP = os.environ.get("VIA_PARSNIP", "0") == "1"
CLIENTS = min(int(os.environ.get("CLIENTS", "100")), 20)
DB = os.environ["TARGET_DB"]
USER = os.environ["TARGET_USER"]
CONSOLE_DSN = f"postgresql://{USER}@{os.environ['TARGET_HOST']}:{os.environ['TARGET_PORT']}/pgbouncer"
STATEMENTS = 20  # autocommit statements per client (psycopg prepares from the 6th on)
IN_TX = 3  # statements in each client's one explicit transaction


def scrape() -> dict[tuple[str, tuple], float]:
    """One scrape by the exporter's own collector: metric (name, labels) → value."""
    from prometheus_pgbouncer_exporter.collector import PgbouncerMetricsCollector
    from prometheus_pgbouncer_exporter.config import PgbouncerConfig

    collector = PgbouncerMetricsCollector(PgbouncerConfig({"dsn": CONSOLE_DSN}))
    return {(m["name"], tuple(sorted(m["labels"].items()))): m["value"] for m in collector.collect()}


def metric(m: dict, name: str, default: float | None = None, **labels) -> float:
    key = (name, tuple(sorted(labels.items())))
    if key not in m and default is not None:
        return default
    if key not in m:
        raise AssertionError(f"no {name}{labels} in the scrape: {sorted(k for k in m if k[0] == name)}")
    return m[key]


def client(errors: list[str]) -> None:
    try:
        with psycopg.connect(TARGET_URL, autocommit=True) as conn:
            for i in range(STATEMENTS):
                row = conn.execute("SELECT %s::int + 1", (i,)).fetchone()
                if row != (i + 1,):
                    errors.append(f"wrong result {row} for {i}")
            with conn.transaction():
                for i in range(IN_TX):
                    conn.execute("SELECT %s::int", (i,)).fetchone()
    except Exception as e:  # noqa: BLE001 - every failure is reported
        errors.append(f"{type(e).__name__}: {e}")


def workload() -> list[str]:
    errors: list[str] = []
    threads = [threading.Thread(target=client, args=(errors,)) for _ in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def main() -> None:
    t0 = time.monotonic()
    result = {"ok": True, "transactions": 0, "errors": 0, "expected_errors": 0, "detail": ""}
    checks: list[str] = []
    try:
        before = scrape() if VIA_PARSNIP else {}
        errors = workload()
        result["transactions"] = CLIENTS * (STATEMENTS + 1)
        if errors:
            checks.append(f"workload: {errors[:3]}")
        if VIA_PARSNIP:
            after = scrape()
            if metric(after, "pgbouncer_up") != 1:
                checks.append("pgbouncer_up is 0: a console command failed for the exporter")
            s = "pgbouncer_stats_"
            # Before its first client, a database has no pool and so no row (as in PgBouncer).
            d = {n: metric(after, s + n, database=DB) - metric(before, s + n, 0, database=DB)
                 for n in ("transactions_total", "queries_total", "received_bytes_total", "sent_bytes_total")}
            # BEGIN, the statements and COMMIT are queries; the transaction is one.
            want_x = CLIENTS * (STATEMENTS + 1)
            want_q = CLIENTS * (STATEMENTS + IN_TX + 2)
            if d["transactions_total"] != want_x:
                checks.append(f"transactions_total moved by {d['transactions_total']}, want {want_x}")
            if d["queries_total"] != want_q:
                checks.append(f"queries_total moved by {d['queries_total']}, want {want_q}")
            if not (0 < d["received_bytes_total"] < d["sent_bytes_total"]):
                checks.append(f"bytes received {d['received_bytes_total']}, sent {d['sent_bytes_total']}")
            metric(after, "pgbouncer_databases_database_pool_size", database=DB, backend_database=DB)
            metric(after, "pgbouncer_config_max_client_conn")
            # A client in a transaction holds a server: the exporter sees it active.
            with psycopg.connect(TARGET_URL) as conn:
                conn.execute("SELECT 1").fetchone()  # BEGIN is implicit: in a transaction now
                held = scrape()
                active = metric(held, "pgbouncer_pools_server_active_connections", database=DB, user=USER)
                clients = metric(held, "pgbouncer_pools_client_active_connections", database=DB, user=USER)
                if active < 1 or clients < 1:
                    checks.append(f"in a transaction: server_active {active}, client_active {clients}")
                conn.rollback()
            result["detail"] = (f"exporter: transactions +{d['transactions_total']:.0f}, "
                                f"queries +{d['queries_total']:.0f}, up")
        else:
            result["detail"] = "direct: the workload only (the console is parsnip's)"
    except Exception as e:  # noqa: BLE001
        checks.append(f"{type(e).__name__}: {e}")
    if checks:
        result.update(ok=False, errors=len(checks), detail="; ".join(checks)[:2000])
    result["detail"] += f" ({time.monotonic() - t0:.1f} s)"
    print(json.dumps(result))
    sys.exit(0 if result["ok"] else 1)


if __name__ == "__main__":
    main()
