"""psycopg 3 scenarios: CLIENTS threads, one connection each (drivers/README.md).

Usage: psycopg_scenario.py MODE, MODE one of
  default      psycopg's defaults: prepare_threshold=5, autocommit off (commit()/rollback())
  prepare0     prepare_threshold=0: every statement prepared on first use
  pipeline     each transaction sent as one pipeline; an error in the middle of one
  executemany  inserts and updates with executemany (returning=True for the inserts)
  cursor       server-side (named) cursors inside transactions, fetched in small batches
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
import time

import psycopg
from psycopg import errors as pgerr

import common as cm
from common import STATS, STATE, SCHEMA_CHANGE, Plan, WrongResult, describe, pyformat

MODE = sys.argv[1] if len(sys.argv) > 1 else "default"
MODES = ("default", "prepare0", "pipeline", "executemany", "cursor")
if MODE not in MODES:
    sys.exit(f"usage: {sys.argv[0]} {'|'.join(MODES)}")

INS, UPD, CTR, SUM, WIDE, FAIL, MARK, ITEMS, GEN_FAIL = map(
    pyformat, (cm.INS, cm.UPD, cm.CTR, cm.SUM, cm.WIDE, cm.FAIL, cm.MARK, cm.ITEMS, cm.GEN_FAIL)
)
WIDE_KEY = WIDE.replace("%s", "$1").encode()
INSERTS_PER_ROUND = 3 if MODE == "executemany" else 1


def connect(c: int) -> psycopg.Connection:
    kwargs: dict = {"autocommit": MODE != "default", "application_name": f"psycopg-{MODE}-c{c}", "connect_timeout": 30}
    if MODE == "prepare0":
        kwargs["prepare_threshold"] = 0
    return psycopg.connect(cm.TARGET_URL, **kwargs)


@contextlib.contextmanager
def transaction(conn: psycopg.Connection):
    """An explicit transaction: conn.transaction() (BEGIN…COMMIT) on autocommit
    connections, the implicit one closed by commit()/rollback() otherwise."""
    if conn.autocommit:
        with conn.transaction():
            yield
    else:
        try:
            yield
        except BaseException:
            conn.rollback()
            raise
        conn.commit()


def wide_prepared(conn: psycopg.Connection) -> bool:
    """Whether psycopg holds, or is about to prepare, a named statement for the wide read.
    Only a named statement can meet 'cached plan must not change result type' from
    PostgreSQL; one prepared in this very call can too, as psycopg sends its Parse with a
    Sync of its own and the ALTER may commit before the Bind."""
    pm = getattr(conn, "_prepared", None)
    names, counts = getattr(pm, "_names", None), getattr(pm, "_counts", None)
    if names is None or counts is None:
        return True  # internals changed: can't tell, accept
    if any(key[0] == WIDE_KEY for key in names):
        return True
    threshold = pm.prepare_threshold
    if threshold is None:
        return False
    return max((n for key, n in counts.items() if key[0] == WIDE_KEY), default=0) >= threshold


# ------------------------------------------------------------------ the workload


def run_tx(conn: psycopg.Connection, plan: Plan) -> None:
    c = plan.model.c
    if MODE == "pipeline":
        with conn.transaction():
            with conn.pipeline():
                for row in plan.inserts:
                    conn.execute(INS, row)
                for u in plan.updates:
                    conn.execute(UPD, u)
                conn.execute(CTR, (plan.counter,))
                churn = [(k, conn.execute(pyformat(cm.churn_sql(k)), (plan.churn_arg,))) for k in plan.churn]
                total = conn.execute(SUM, (c,))
            for k, cur in churn:
                plan.check_churn(k, cur.fetchone())
            plan.check_sum(total.fetchone())
        return
    with transaction(conn):
        if MODE == "executemany":
            cur = conn.cursor()
            cur.executemany(INS + " RETURNING seq", plan.inserts, returning=True)
            seqs = []
            while True:
                seqs.extend(r[0] for r in cur.fetchall())
                if not cur.nextset():
                    break
            if seqs != [row[1] for row in plan.inserts]:
                raise WrongResult(f"executemany RETURNING gave {seqs}")
            cur.executemany(UPD, plan.updates)
        else:
            for row in plan.inserts:
                conn.execute(INS, row)
            for u in plan.updates:
                conn.execute(UPD, u)
        conn.execute(CTR, (plan.counter,))
        for k in plan.churn:
            plan.check_churn(k, conn.execute(pyformat(cm.churn_sql(k)), (plan.churn_arg,)).fetchone())
        plan.check_sum(conn.execute(SUM, (c,)).fetchone())
        if MODE == "cursor":
            with conn.cursor(name="items_cur") as cur:  # the same cursor name in every client
                cur.execute(ITEMS, (c,))
                rows = []
                while batch := cur.fetchmany(8):
                    rows.extend(batch)
            plan.check_items(rows)


def run_failing_tx(conn: psycopg.Connection, c: int, r: int) -> None:
    """A transaction with a failing statement in the middle; raises what it got."""
    if MODE == "pipeline":
        # The transaction inside the pipeline this time: its ROLLBACK, and the DEALLOCATE ALL
        # psycopg sends after it, go through the extended protocol.
        with conn.pipeline():
            with conn.transaction():
                conn.execute(INS, cm.induced_insert(c, r))
                conn.execute(FAIL, (0,))
                conn.execute(SUM, (c,))
                conn.execute(CTR, (c % 10,))
        return
    with transaction(conn):
        if MODE == "executemany":
            row = cm.induced_insert(c, r)
            dup = (c, row[1] - 1000, 0, "x", "odd")
            conn.cursor().executemany(INS, [dup, row, dup, (c, row[1] - 2000, 0, "y", "odd")])
        elif MODE == "cursor":
            conn.execute(INS, cm.induced_insert(c, r))
            with conn.cursor(name="items_cur") as cur:
                cur.execute(GEN_FAIL, (5,))
                rows = cur.fetchmany(3)
                if [x[0] for x in rows] != [-2, -3, -5]:
                    raise WrongResult(f"cursor's first rows {rows}")
                cur.fetchmany(3)  # x = 5: division by zero
        else:
            conn.execute(INS, cm.induced_insert(c, r))
            conn.execute(FAIL, (0,))
        conn.execute(CTR, (c % 10,))


def pipeline_out_of_tx(conn: psycopg.Connection, c: int, r: int) -> None:
    """Pipeline mode outside a transaction: three syncs, the middle one failing."""
    with conn.pipeline() as p:
        a = conn.execute(pyformat(cm.churn_sql(1)), (r,))
        p.sync()
        try:
            conn.execute(FAIL, (0,))
            p.sync()
        except pgerr.DivisionByZero:
            STATS.induce("22012")
        else:
            raise WrongResult("division by zero in a pipeline did not fail")
        b = conn.execute(pyformat(cm.churn_sql(2)), (r,))
    if a.fetchone() != (r * 1000 + 1, "churn-1") or b.fetchone() != (r * 1000 + 2, "churn-2"):
        raise WrongResult("statements around the failing one in the pipeline gave wrong results")


def wide_read(conn: psycopg.Connection, c: int, where: str) -> bool:
    """`SELECT * FROM wide WHERE id = $1` outside an explicit transaction; True on success."""
    wid = cm.wide_id(c)
    done_before = SCHEMA_CHANGE.done.is_set()
    prepared = wide_prepared(conn)
    try:
        row = conn.execute(WIDE, (wid,)).fetchone()
        if not conn.autocommit:
            conn.commit()
    except Exception as e:
        if not conn.autocommit and not conn.broken:
            conn.rollback()
        if cm.is_cached_plan_error(e) and SCHEMA_CHANGE.started.is_set():
            if prepared:
                STATS.expect(where, id(conn), WIDE, e)
                if conn.autocommit:
                    # psycopg keeps using a prepared statement that failed (it only drops
                    # its cache on ROLLBACK, DDL, DISCARD ALL or DEALLOCATE ALL): what an
                    # application does to recover without reconnecting.
                    conn.execute("DEALLOCATE ALL")
            else:
                STATS.error(where, f"{describe(e)} on a statement psycopg had not prepared")
            return False
        raise
    SCHEMA_CHANGE.check_row(row, wid, done_before, SCHEMA_CHANGE.started.is_set())
    return True


def cancel_test(conn: psycopg.Connection, c: int, in_tx: bool) -> None:
    """conn.cancel() from another thread while pg_sleep(5) runs on the server."""
    got: dict = {}

    def canceller() -> None:
        if cm.wait_active(c):
            conn.cancel()
            got["sent"] = time.monotonic()

    th = threading.Thread(target=canceller, daemon=True)
    t0 = time.monotonic()
    th.start()
    try:
        if in_tx:
            with transaction(conn):
                conn.execute(CTR, (c % 10,))
                conn.execute(cm.sleep_sql(c))
        else:
            conn.execute(cm.sleep_sql(c))
            if not conn.autocommit:
                conn.commit()
    except pgerr.QueryCanceled:
        if not conn.autocommit:
            conn.rollback()
        STATS.induce("57014")
    else:
        STATS.error(f"c{c} cancel", "pg_sleep(5) was not cancelled")
    th.join(15)
    if "sent" not in got:
        STATS.error(f"c{c} cancel", "the query never showed up as active on the server")
    elif time.monotonic() - t0 > 4.5:
        STATS.error(f"c{c} cancel", f"cancelled query returned only after {time.monotonic() - t0:.1f}s")


def disconnect(conn: psycopg.Connection, c: int, abrupt: bool) -> psycopg.Connection:
    """Opens a transaction, writes a marker row, and goes away mid-transaction."""
    if conn.autocommit:
        conn.execute("BEGIN")
    conn.execute(MARK, (c, f"abandoned by c{c}"))
    if abrupt:
        s = socket.socket(fileno=os.dup(conn.fileno()))
        s.shutdown(socket.SHUT_RDWR)
        s.close()
    conn.close()
    return connect(c)


def client(c: int, model: cm.Model) -> None:
    conn = None
    try:
        STATE.doing[c] = "connect"
        conn = connect(c)
        for r in range(cm.ROUNDS):
            STATE.progress[c] = r
            where = f"c{c} r{r}"
            try:
                if r == cm.DISCONNECT_ROUND and c in cm.ABRUPT_CLIENTS + cm.GRACEFUL_CLIENTS:
                    STATE.doing[c] = f"r{r} disconnect mid-transaction"
                    conn = disconnect(conn, c, abrupt=c in cm.ABRUPT_CLIENTS)
                if r == cm.CANCEL_ROUND and c in (cm.CANCEL_IN_TX, cm.CANCEL_OUT_OF_TX):
                    STATE.doing[c] = f"r{r} cancel"
                    cancel_test(conn, c, in_tx=c == cm.CANCEL_IN_TX)
                if cm.induced_round(r):
                    STATE.doing[c] = f"r{r} failing transaction"
                    try:
                        run_failing_tx(conn, c, r)
                    except (pgerr.DivisionByZero, pgerr.UniqueViolation) as e:
                        STATS.induce(e.sqlstate)
                    else:
                        STATS.error(where, "the failing transaction did not fail")
                    if MODE == "pipeline":
                        STATE.doing[c] = f"r{r} pipeline with a failing sync"
                        pipeline_out_of_tx(conn, c, r)
                else:
                    STATE.doing[c] = f"r{r} transaction"
                    plan = Plan(model, r, INSERTS_PER_ROUND)
                    run_tx(conn, plan)
                    plan.commit()
                    STATS.tx()
                if not (cm.gated(c) and r >= cm.ALTER_ROUND and not SCHEMA_CHANGE.done.is_set()):
                    STATE.doing[c] = f"r{r} wide read"
                    wide_read(conn, c, where)
            except WrongResult as e:
                STATS.error(where, f"wrong result: {e}")
            except Exception as e:  # noqa: BLE001
                STATS.error(where, describe(e))
                if conn.closed or conn.broken:
                    model.uncertain = True
                    conn = connect(c)
                elif not conn.autocommit:
                    conn.rollback()
        STATE.progress[c] = cm.ROUNDS
        STATE.doing[c] = "waiting for the ALTER"
        if not SCHEMA_CHANGE.done.wait(cm.DEADLINE_S):
            STATS.error(f"c{c}", "the ALTER never finished")
        STATE.doing[c] = "reading wide after the ALTER"
        for attempt in range(3):
            try:
                if wide_read(conn, c, f"c{c} after ALTER"):
                    break
            except WrongResult as e:
                STATS.error(f"c{c} after ALTER", f"wrong result: {e}")
            except Exception as e:  # noqa: BLE001
                STATS.error(f"c{c} after ALTER", describe(e))
                if conn.closed or conn.broken:
                    conn = connect(c)
        else:
            STATS.error(f"c{c} after ALTER", "the wide read kept failing")
        conn.close()
    except WrongResult as e:
        STATS.error(f"c{c}", f"wrong result: {e}")
    except Exception as e:  # noqa: BLE001
        STATS.error(f"c{c}", describe(e))
        model.uncertain = True
    finally:
        STATE.finished[c] = True
        STATE.doing[c] = "done"


def main() -> None:
    t0 = time.monotonic()
    cm.start_watchdog(t0)
    cm.create_schema()
    models = [cm.Model(c) for c in range(cm.CLIENTS)]
    SCHEMA_CHANGE.start()
    threads = [threading.Thread(target=client, args=(c, models[c]), daemon=True) for c in range(cm.CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    cm.verify(models)
    cm.finish(t0, f"psycopg {psycopg.__version__} libpq {psycopg.pq.version()} mode {MODE}")


if __name__ == "__main__":
    main()
