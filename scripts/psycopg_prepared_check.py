#!/usr/bin/env python3
"""pg_prepared_statements as psycopg's prepared-statement tests read it (issue 27).

psycopg's own suite is on GitHub only (docs/psycopg-suite.md); this check mimics what its
test_prepared*.py and test_pipeline*.py::test_prepared do with psycopg from PyPI: execute
queries with prepare_threshold 0/1/5, prepare=True/False, LRU eviction by DEALLOCATE, and
then read the view with an unnamed statement. Run it against PostgreSQL directly and
through parsnip in transaction mode; each check prints ok or FAIL, and the exit status is
the number of failures.

    python3 -m venv /tmp/venv && /tmp/venv/bin/pip install "psycopg[binary]"
    /tmp/venv/bin/python scripts/psycopg_prepared_check.py "host=127.0.0.1 port=6432 user=postgres"
"""

import datetime as dt
import sys
from decimal import Decimal

import psycopg
from psycopg.rows import namedtuple_row

DSN = sys.argv[1] if len(sys.argv) > 1 else "host=127.0.0.1 port=6432"


def stmts(conn):
    cur = conn.cursor(row_factory=namedtuple_row)
    cur.execute(
        r"""
        select name,
            regexp_replace(statement, 'prepare _pg3_\d+ as ', '', 'i') as statement,
            prepare_time, parameter_types
        from pg_prepared_statements where name != ''
        """,
        prepare=False,
    )
    return cur.fetchall()


def do_prepare(conn):
    conn.cursor().execute("select %s::int", [10], prepare=True)
    return len(stmts(conn)) == 1


def dont_prepare(conn):
    for i in range(10):
        conn.execute("select %s::int", [i], prepare=False)
    return len(stmts(conn)) == 0


def auto_prepare(conn):
    res = []
    for _ in range(10):
        conn.execute("select %s::int", [0])
        res.append(len(stmts(conn)))
    return res == [0] * 5 + [1] * 5


def no_prepare_multi(conn):
    res = []
    for _ in range(10):
        conn.execute("select 1; select 2")
        res.append(len(stmts(conn)))
    return res == [0] * 10


def params_types(conn):
    conn.execute("select %s, %s, %s", [dt.date(2020, 12, 10), 42, Decimal(42)], prepare=True)
    return [s.parameter_types for s in stmts(conn)] == [["date", "smallint", "numeric"]]


def evict_lru(conn):
    conn.prepared_max = 5
    for i in range(10):
        conn.execute("select 'a'")
        conn.execute(f"select {i}")
    got = stmts(conn)
    return len(got) == 1 and got[0].statement == "select 'a'"


def evict_lru_deallocate(conn):
    conn.prepared_max = 5
    conn.prepare_threshold = 0
    for i in range(10):
        conn.execute("select 'a'")
        conn.execute(f"select {i}")
    got = sorted(stmts(conn), key=lambda r: r.prepare_time)
    return [s.statement for s in got] == [f"select {i}" for i in ["'a'", 6, 7, 8, 9]]


def different_types(conn):
    conn.prepare_threshold = 0
    conn.execute("select %s", [None])
    conn.execute("select %s", [dt.date(2000, 1, 1)])
    conn.execute("select %s", [42])
    conn.execute("select %s", [41])
    conn.execute("select %s", [dt.date(2000, 1, 2)])
    got = sorted(stmts(conn), key=lambda r: r.prepare_time)
    return [s.parameter_types for s in got] == [["text"], ["date"], ["smallint"]]


def untyped_json(conn):
    conn.prepare_threshold = 1
    conn.execute("create temp table testjson(data jsonb)")
    for _ in range(2):
        conn.execute("insert into testjson (data) values (%s)", ["{}"])
    return [s.parameter_types for s in stmts(conn)] == [["jsonb"]]


def count_by_statement(conn):
    conn.prepare_threshold = 0
    for _ in range(3):
        conn.execute("select %s::text", ["x"])
    cur = conn.execute(
        "select count(*) from pg_prepared_statements where statement = %s", ["select $1::text"], prepare=False
    )
    return cur.fetchone()[0] == 1


def pipeline_prepared(conn):
    conn.autocommit = True
    with conn.pipeline():
        c1 = conn.execute("select %s::int", [10], prepare=True)
        c2 = conn.execute("select count(*) from pg_prepared_statements where name != ''")
        (r1,) = c1.fetchone()
        (r2,) = c2.fetchone()
    return r1 == 10 and r2 == 1


def autocommit_prepared(conn):
    conn.autocommit = True
    conn.prepare_threshold = 0
    for q in ["select 1", "select 2", "select 1"]:
        conn.execute(q)
    conn.execute("deallocate all")
    conn.execute("select 3")
    return [s.statement for s in stmts(conn)] == ["select 3"]


CHECKS = [
    do_prepare,
    dont_prepare,
    auto_prepare,
    no_prepare_multi,
    params_types,
    evict_lru,
    evict_lru_deallocate,
    different_types,
    untyped_json,
    count_by_statement,
    pipeline_prepared,
    autocommit_prepared,
]


def main():
    failed = 0
    # Another client's statements on the same pool must not show.
    with psycopg.connect(DSN, autocommit=True) as other:
        other.prepare_threshold = 0
        other.execute("select %s::int + 1", [1])
        for check in CHECKS:
            with psycopg.connect(DSN) as conn:
                try:
                    ok = check(conn)
                except Exception as e:  # noqa: BLE001 - a check's error is its failure
                    ok = False
                    print(f"  {type(e).__name__}: {e}")
            failed += not ok
            print(f"{'ok  ' if ok else 'FAIL'} {check.__name__}")
    return failed


if __name__ == "__main__":
    sys.exit(main())
