"""Monitoring as operators run it, judged by real tools: the prometheus-pgbouncer-exporter
package (PyPI), unchanged, against parsnip's console (it reads SHOW STATS, SHOW POOLS, SHOW
DATABASES and SHOW CONFIG through psycopg2 and turns them into Prometheus metrics); and
parsnip's own /metrics (metrics_listen) parsed by the Prometheus Python client's text
parser, its counters required to move by exactly what the workload did, and /ready.

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
import urllib.error
import urllib.request

import psycopg

TARGET_URL = os.environ["TARGET_URL"]
VIA_PARSNIP = os.environ.get("VIA_PARSNIP", "0") == "1"
CLIENTS = min(int(os.environ.get("CLIENTS", "100")), 20)
DB = os.environ["TARGET_DB"]
USER = os.environ["TARGET_USER"]
CONSOLE_DSN = f"postgresql://{USER}@{os.environ['TARGET_HOST']}:{os.environ['TARGET_PORT']}/pgbouncer"
METRICS_URL = os.environ.get("METRICS_URL", "")
STATEMENTS = 20  # autocommit statements per client (psycopg prepares from the 6th on)
IN_TX = 3  # statements in each client's one explicit transaction
FAILING = 1  # statements per client that PostgreSQL fails (division by zero: class 22)


def parsnip_metrics() -> dict[tuple[str, tuple], float]:
    """/metrics parsed by prometheus_client's parser: sample (name, labels) → value."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(METRICS_URL + "/metrics", timeout=10) as r:
        if r.status != 200:
            raise AssertionError(f"/metrics answered {r.status}")
        text = r.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def http_status(path: str) -> int:
    try:
        with urllib.request.urlopen(METRICS_URL + path, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


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


def check_parsnip_metrics(before: dict, after: dict, want_x: int, want_q: int) -> list[str]:
    """parsnip's own counters moved by exactly the work; the histogram is consistent."""
    out = []
    pool = (("database", DB), ("user", USER))

    def delta(name: str, labels=pool) -> float:
        return after.get((name, labels), 0) - before.get((name, labels), 0)

    for name, want in (("parsnip_transactions_total", want_x), ("parsnip_queries_total", want_q),
                       ("parsnip_errors_total", CLIENTS * FAILING)):
        labels = pool if name != "parsnip_errors_total" else (("class", "22"), ("database", DB), ("user", USER))
        if delta(name, labels) != want:
            out.append(f"/metrics: {name} moved by {delta(name, labels)}, want {want}")
    if delta("parsnip_sent_bytes_total") <= 0 or delta("parsnip_client_parses_total") <= 0:
        out.append("/metrics: bytes sent or client parses did not move")
    count = after.get(("parsnip_wait_seconds_count", pool), -1)
    inf = after.get(("parsnip_wait_seconds_bucket", (("database", DB), ("le", "+Inf"), ("user", USER))), -2)
    assignments = after.get(("parsnip_server_assignments_total", pool), -3)
    if not (count == inf and count >= assignments > 0):
        out.append(f"/metrics: wait histogram count {count}, +Inf bucket {inf}, assignments {assignments}")
    for path, want in (("/ready", 200), ("/live", 200), ("/nothing", 404)):
        if (got := http_status(path)) != want:
            out.append(f"{path} answered {got}, want {want}")
    return out


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
            for _ in range(FAILING):
                try:
                    conn.execute("SELECT 1 / 0")
                    errors.append("1 / 0 did not fail")
                except psycopg.errors.DivisionByZero:
                    pass
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
        mbefore = parsnip_metrics() if VIA_PARSNIP else {}
        errors = workload()
        result["transactions"] = CLIENTS * (STATEMENTS + 1 + FAILING)
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
            # BEGIN, the statements and COMMIT are queries; the transaction is one. A failed
            # autocommit statement is a query and a transaction too.
            want_x = CLIENTS * (STATEMENTS + 1 + FAILING)
            want_q = CLIENTS * (STATEMENTS + IN_TX + 2 + FAILING)
            if d["transactions_total"] != want_x:
                checks.append(f"transactions_total moved by {d['transactions_total']}, want {want_x}")
            if d["queries_total"] != want_q:
                checks.append(f"queries_total moved by {d['queries_total']}, want {want_q}")
            if not (0 < d["received_bytes_total"] < d["sent_bytes_total"]):
                checks.append(f"bytes received {d['received_bytes_total']}, sent {d['sent_bytes_total']}")
            metric(after, "pgbouncer_databases_database_pool_size", database=DB, backend_database=DB)
            checks += check_parsnip_metrics(mbefore, parsnip_metrics(), want_x, want_q)
            metric(after, "pgbouncer_config_max_client_conn")
            # From SHOW CONFIG's max_user_connections (issue 29).
            metric(after, "pgbouncer_config_max_user_connections")
            # A client in a transaction holds a server: the exporter sees it active.
            with psycopg.connect(TARGET_URL) as conn:
                conn.execute("SELECT 1").fetchone()  # BEGIN is implicit: in a transaction now
                held = scrape()
                active = metric(held, "pgbouncer_pools_server_active_connections", database=DB, user=USER)
                clients = metric(held, "pgbouncer_pools_client_active_connections", database=DB, user=USER)
                if active < 1 or clients < 1:
                    checks.append(f"in a transaction: server_active {active}, client_active {clients}")
                held = parsnip_metrics()
                busy = held.get(("parsnip_server_connections",
                                 (("database", DB), ("state", "active"), ("user", USER))), 0)
                if busy < 1:
                    checks.append(f"/metrics: server_connections active = {busy} while a client held one")
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
