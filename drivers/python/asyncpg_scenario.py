"""asyncpg scenarios: CLIENTS connections driven by one asyncio loop (drivers/README.md).

Usage: asyncpg_scenario.py MODE, MODE one of
  default      conn.execute/fetch*/ with asyncpg's statement cache (100 statements)
  prepare      explicit conn.prepare(): hot statements kept, churn statements prepared
               afresh and dropped (asyncpg closes them), one statement with a fixed name
  executemany  inserts and updates with conn.executemany() (B E x N, one Sync)
  cursor       cursors inside transactions (named portals, Execute with a row limit)

The `mood` enum in the items table makes asyncpg run its type introspection on each
connection.
"""

from __future__ import annotations

import asyncio
import sys
import time

import asyncpg

import common as cm
from common import STATS, STATE, SCHEMA_CHANGE, Plan, WrongResult, describe

MODE = sys.argv[1] if len(sys.argv) > 1 else "default"
MODES = ("default", "prepare", "executemany", "cursor")
if MODE not in MODES:
    sys.exit(f"usage: {sys.argv[0]} {'|'.join(MODES)}")
INSERTS_PER_ROUND = 3 if MODE == "executemany" else 1
WIDE_CURSOR = "SELECT * FROM wide WHERE id >= $1 ORDER BY id LIMIT 3"


class Client:
    def __init__(self, c: int, model: cm.Model) -> None:
        self.c = c
        self.model = model
        self.conn: asyncpg.Connection | None = None
        self.stmts: dict[str, asyncpg.prepared_stmt.PreparedStatement] = {}

    async def connect(self) -> None:
        self.conn = await asyncpg.connect(cm.TARGET_URL, timeout=60,
                                          server_settings={"application_name": f"asyncpg-{MODE}-c{self.c}"})
        self.stmts = {}
        if MODE == "prepare":
            # The same explicit statement name on every connection.
            self.stmts[cm.SUM] = await self.conn.prepare(cm.SUM, name="sum_by_client")

    # ---------------------------------------------------------------- statements

    async def ps(self, sql: str) -> asyncpg.prepared_stmt.PreparedStatement:
        if sql not in self.stmts:
            self.stmts[sql] = await self.conn.prepare(sql)
        return self.stmts[sql]

    async def execute(self, sql: str, *args) -> None:
        if MODE == "prepare":
            await (await self.ps(sql)).fetch(*args)
        else:
            await self.conn.execute(sql, *args)

    async def fetchrow(self, sql: str, *args):
        if MODE == "prepare":
            return await (await self.ps(sql)).fetchrow(*args)
        return await self.conn.fetchrow(sql, *args)

    async def churn(self, k: int, arg: int):
        if MODE == "prepare":
            # A new statement each time; asyncpg closes it once the object is gone.
            stmt = await self.conn.prepare(cm.churn_sql(k))
            row = await stmt.fetchrow(arg)
            del stmt
            return row
        return await self.conn.fetchrow(cm.churn_sql(k), arg)

    # ---------------------------------------------------------------- the workload

    async def run_tx(self, plan: Plan) -> None:
        c = self.c
        async with self.conn.transaction():
            if MODE == "executemany":
                await self.conn.executemany(cm.INS, plan.inserts)
                await self.conn.executemany(cm.UPD, plan.updates)
            else:
                for row in plan.inserts:
                    await self.execute(cm.INS, *row)
                for u in plan.updates:
                    await self.execute(cm.UPD, *u)
            await self.execute(cm.CTR, plan.counter)
            for k in plan.churn:
                plan.check_churn(k, await self.churn(k, plan.churn_arg))
            plan.check_sum(await self.fetchrow(cm.SUM, c))
            if MODE == "cursor":
                rows = [tuple(r) async for r in self.conn.cursor(cm.ITEMS, c, prefetch=8)]
                plan.check_items(rows)
                cur = await self.conn.cursor(cm.ITEMS, c)
                first = await cur.fetch(2)
                await cur.forward(1)
                third = await cur.fetchrow()
                want = plan.expected_items()
                got = [tuple(r) for r in first] + ([tuple(third)] if third else [])
                if got != (want[:2] + want[3:4]):
                    raise WrongResult(f"cursor fetch/forward/fetchrow gave {got}")

    async def run_failing_tx(self, r: int) -> None:
        c = self.c
        async with self.conn.transaction():
            if MODE == "executemany":
                row = cm.induced_insert(c, r)
                dup = (c, row[1] - 1000, 0, "x", "odd")
                await self.conn.executemany(cm.INS, [dup, row, dup, (c, row[1] - 2000, 0, "y", "odd")])
            elif MODE == "cursor":
                await self.execute(cm.INS, *cm.induced_insert(c, r))
                cur = await self.conn.cursor(cm.GEN_FAIL, 5)
                first = [x[0] for x in await cur.fetch(3)]
                if first != [-2, -3, -5]:
                    raise WrongResult(f"cursor's first rows {first}")
                await cur.fetch(3)  # x = 5: division by zero
            else:
                await self.execute(cm.INS, *cm.induced_insert(c, r))
                await self.fetchrow(cm.FAIL, 0)
            await self.execute(cm.CTR, c % 10)

    async def wide_read(self, where: str) -> bool:
        """`SELECT * FROM wide WHERE id = $1` outside a transaction (asyncpg re-prepares
        and retries by itself when PostgreSQL says the cached plan changed); in cursor mode
        also a cursor over the table inside a transaction (where asyncpg raises)."""
        wid = cm.wide_id(self.c)
        done_before = SCHEMA_CHANGE.done.is_set()
        stmt_sql = cm.WIDE
        try:
            row = await self.fetchrow(cm.WIDE, wid)
            SCHEMA_CHANGE.check_row(row, wid, done_before, SCHEMA_CHANGE.started.is_set())
            if MODE == "cursor":
                stmt_sql = WIDE_CURSOR
                async with self.conn.transaction():
                    rows = [r async for r in self.conn.cursor(WIDE_CURSOR, wid, prefetch=2)]
                started_after = SCHEMA_CHANGE.started.is_set()
                for i, r in enumerate(rows):
                    if r["id"] <= cm.WIDE_ROWS:
                        SCHEMA_CHANGE.check_row(r, r["id"], done_before, started_after)
                if len(rows) != min(3, cm.WIDE_ROWS - wid + 1):
                    raise WrongResult(f"wide cursor gave {len(rows)} rows")
        except asyncpg.exceptions.InvalidCachedStatementError as e:
            if not SCHEMA_CHANGE.started.is_set():
                STATS.error(where, f"{describe(e)} before the ALTER")
                return False
            STATS.expect(where, id(self.conn), stmt_sql, e)
            # An explicitly prepared statement stays invalid: prepare it again. (Cursors
            # leave asyncpg's cache as it is; a fetch outside a transaction repairs it.)
            self.stmts.pop(stmt_sql, None)
            if stmt_sql == WIDE_CURSOR:
                await self.conn.fetch(WIDE_CURSOR, wid)
            return False
        return True

    async def cancel_test(self, in_tx: bool) -> None:
        """asyncpg's timeout: it sends a cancel request for pg_sleep(5) and waits for the
        server to acknowledge it before the connection runs anything else."""
        t0 = time.monotonic()
        try:
            if in_tx:
                async with self.conn.transaction():
                    await self.execute(cm.CTR, self.c % 10)
                    await self.conn.fetchval(cm.sleep_sql(self.c), timeout=1.0)
            else:
                await self.conn.fetchval(cm.sleep_sql(self.c), timeout=1.0)
        except asyncio.TimeoutError:
            STATS.induce("timeout-cancel")
        else:
            STATS.error(f"c{self.c} cancel", "pg_sleep(5) did not time out")
        if await self.conn.fetchval("SELECT 42") != 42:
            raise WrongResult("query after the cancel")
        if time.monotonic() - t0 > 4.0:
            STATS.error(f"c{self.c} cancel", f"cancel + next query took {time.monotonic() - t0:.1f}s")

    async def disconnect(self, abrupt: bool) -> None:
        """Opens a transaction, writes a marker row, and goes away mid-transaction."""
        tr = self.conn.transaction()
        await tr.start()
        await self.conn.execute(cm.MARK, self.c, f"abandoned by c{self.c}")
        if abrupt:
            self.conn.terminate()  # the socket is closed, no Terminate message
        else:
            await self.conn.close()
        await self.connect()

    async def main(self) -> None:
        c = self.c
        STATE.doing[c] = "connect"
        await self.connect()
        for r in range(cm.ROUNDS):
            STATE.progress[c] = r
            where = f"c{c} r{r}"
            try:
                if r == cm.DISCONNECT_ROUND and c in cm.ABRUPT_CLIENTS + cm.GRACEFUL_CLIENTS:
                    STATE.doing[c] = f"r{r} disconnect mid-transaction"
                    await self.disconnect(abrupt=c in cm.ABRUPT_CLIENTS)
                if r == cm.CANCEL_ROUND and c in (cm.CANCEL_IN_TX, cm.CANCEL_OUT_OF_TX):
                    STATE.doing[c] = f"r{r} cancel"
                    await self.cancel_test(in_tx=c == cm.CANCEL_IN_TX)
                if cm.induced_round(r):
                    STATE.doing[c] = f"r{r} failing transaction"
                    try:
                        await self.run_failing_tx(r)
                    except (asyncpg.exceptions.DivisionByZeroError, asyncpg.exceptions.UniqueViolationError) as e:
                        STATS.induce(e.sqlstate)
                    else:
                        STATS.error(where, "the failing transaction did not fail")
                else:
                    STATE.doing[c] = f"r{r} transaction"
                    plan = Plan(self.model, r, INSERTS_PER_ROUND)
                    await self.run_tx(plan)
                    plan.commit()
                    STATS.tx()
                if not (cm.gated(c) and r >= cm.ALTER_ROUND and not SCHEMA_CHANGE.done.is_set()):
                    STATE.doing[c] = f"r{r} wide read"
                    await self.wide_read(where)
            except WrongResult as e:
                STATS.error(where, f"wrong result: {e}")
            except Exception as e:  # noqa: BLE001
                STATS.error(where, describe(e))
                if self.conn.is_closed():
                    self.model.uncertain = True
                    await self.connect()
        STATE.progress[c] = cm.ROUNDS
        STATE.doing[c] = "waiting for the ALTER"
        limit = time.monotonic() + cm.DEADLINE_S
        while not SCHEMA_CHANGE.done.is_set() and time.monotonic() < limit:
            await asyncio.sleep(0.05)
        STATE.doing[c] = "reading wide after the ALTER"
        for attempt in range(3):
            try:
                if await self.wide_read(f"c{c} after ALTER"):
                    break
            except WrongResult as e:
                STATS.error(f"c{c} after ALTER", f"wrong result: {e}")
            except Exception as e:  # noqa: BLE001
                STATS.error(f"c{c} after ALTER", describe(e))
                if self.conn.is_closed():
                    await self.connect()
        else:
            STATS.error(f"c{c} after ALTER", "the wide read kept failing")
        await self.conn.close()


async def run_client(cl: Client) -> None:
    try:
        await cl.main()
    except WrongResult as e:
        STATS.error(f"c{cl.c}", f"wrong result: {e}")
        cl.model.uncertain = True
    except Exception as e:  # noqa: BLE001
        STATS.error(f"c{cl.c}", describe(e))
        cl.model.uncertain = True
    finally:
        STATE.finished[cl.c] = True
        STATE.doing[cl.c] = "done"


async def amain(models: list[cm.Model]) -> None:
    await asyncio.gather(*(run_client(Client(c, models[c])) for c in range(cm.CLIENTS)))


def main() -> None:
    t0 = time.monotonic()
    cm.start_watchdog(t0)
    cm.create_schema()
    models = [cm.Model(c) for c in range(cm.CLIENTS)]
    SCHEMA_CHANGE.start()
    asyncio.run(amain(models))
    cm.verify(models)
    cm.finish(t0, f"asyncpg {asyncpg.__version__} mode {MODE}")


if __name__ == "__main__":
    main()
