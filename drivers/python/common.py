"""What the Python driver scenarios share: the workload plan, the per-client model of what
each client wrote, error accounting, the schema change under load, the final read-back
verification, the watchdog and the result line (drivers/README.md is the contract).

Side actions (schema, ALTER TABLE, cancel checks, verification) go to PostgreSQL itself
through DIRECT_URL with psycopg's synchronous API, whichever driver the scenario tests.
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import re
import sys
import threading
import time

import psycopg

TARGET_URL = os.environ["TARGET_URL"]
DIRECT_URL = os.environ["DIRECT_URL"]
VIA_PARSNIP = os.environ.get("VIA_PARSNIP", "0") == "1"
CLIENTS = int(os.environ.get("CLIENTS", "100"))
ROUNDS = int(os.environ.get("ROUNDS", "24"))
# Leave the runner's kill as the last resort: report a hang ourselves before it.
DEADLINE_S = max(20.0, float(os.environ.get("SCENARIO_TIMEOUT_S", "120")) - 10.0)

# ------------------------------------------------------------------ the plan of the run

CHURN = 50  # distinct churn statements in the run (> max_prepared_statements = 20)
CHURN_WINDOW = 6  # of which each client cycles through 6 (each used often enough to be prepared)
ALTER_ROUND = max(2, ROUNDS // 2)  # the schema change happens once every client got here
DISCONNECT_ROUND = max(1, ROUNDS // 4)
CANCEL_ROUND = max(1, ROUNDS // 3)
ABRUPT_CLIENTS = (2, 3)  # close the socket mid-transaction, without a Terminate message
GRACEFUL_CLIENTS = (4,)  # close the connection (Terminate) mid-transaction
CANCEL_IN_TX, CANCEL_OUT_OF_TX = 0, 1
MOODS = ("calm", "busy", "odd")
WIDE_ROWS = 1000


def induced_round(r: int) -> bool:
    """Rounds whose transaction fails on purpose (then the client recovers)."""
    return r % 10 == 4


def gated(c: int) -> bool:
    """Odd clients pause their `SELECT * FROM wide` reads from ALTER_ROUND until the ALTER is
    done (so every one of them deterministically hits its cached statement after the change,
    in both runs); even clients keep reading while it happens (the race)."""
    return c % 2 == 1


SCHEMA = """
CREATE TYPE mood AS ENUM ('calm', 'busy', 'odd');
CREATE TABLE items (client int NOT NULL, seq int NOT NULL, val bigint NOT NULL,
                    note text NOT NULL, mood mood NOT NULL, PRIMARY KEY (client, seq));
CREATE TABLE counters (id int PRIMARY KEY, n bigint NOT NULL);
INSERT INTO counters SELECT g, 0 FROM generate_series(0, 9) g;
CREATE TABLE markers (client int NOT NULL, token text NOT NULL);
CREATE TABLE wide (id int PRIMARY KEY, a int NOT NULL, b text NOT NULL);
INSERT INTO wide SELECT g, g * 7, 'w' || g FROM generate_series(1, 1000) g;
"""
ALTER = "ALTER TABLE wide ADD COLUMN extra int NOT NULL DEFAULT 7"

# Statements, with $n placeholders (psycopg scenarios convert them with `pyformat`).
INS = "INSERT INTO items (client, seq, val, note, mood) VALUES ($1, $2, $3, $4, $5)"
UPD = "UPDATE items SET val = val + $1 WHERE client = $2 AND seq = $3"
CTR = "UPDATE counters SET n = n + 1 WHERE id = $1"
SUM = "SELECT count(*), coalesce(sum(val), 0)::bigint FROM items WHERE client = $1"
WIDE = "SELECT * FROM wide WHERE id = $1"
FAIL = "SELECT 1 / $1::int"
MARK = "INSERT INTO markers (client, token) VALUES ($1, $2)"
ITEMS = "SELECT seq, val, note, mood FROM items WHERE client = $1 ORDER BY seq"
GEN_FAIL = "SELECT 10 / (x - $1) FROM generate_series(1, 10) AS x"


def churn_sql(k: int) -> str:
    return f"SELECT $1::int * 1000 + {k} AS v, 'churn-{k}' AS tag"


def sleep_sql(c: int) -> str:
    return f"SELECT pg_sleep(5) /* cancel-me c{c}. */"


def pyformat(sql: str) -> str:
    return re.sub(r"\$\d+", "%s", sql)


def wide_id(c: int) -> int:
    return c % WIDE_ROWS + 1


# ------------------------------------------------------------------ accounting


class WrongResult(Exception):
    """A result that differs from what the client knows it must be."""


def sqlstate(e: BaseException) -> str | None:
    return getattr(e, "sqlstate", None)


def describe(e: BaseException) -> str:
    first = (str(e).strip().splitlines() or [""])[0]
    state = sqlstate(e)
    return f"{type(e).__name__}{f' [{state}]' if state else ''}: {first[:240]}"


def is_cached_plan_error(e: BaseException) -> bool:
    return sqlstate(e) == "0A000" and "cached plan must not change result type" in str(e)


class Stats:
    """Counters of the run (thread-safe)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.transactions = 0
        self.errors = 0
        self.samples: list[str] = []
        self.expected = collections.Counter()  # kind -> count
        self.induced = collections.Counter()  # sqlstate of errors caused on purpose
        self.budget: dict[tuple, int] = {}
        self.notes: list[str] = []

    def tx(self) -> None:
        with self.lock:
            self.transactions += 1

    def error(self, where: str, what: str) -> None:
        with self.lock:
            self.errors += 1
            if len(self.samples) < 12:
                self.samples.append(f"{where}: {what}")
        print(f"ERROR {where}: {what}", file=sys.stderr, flush=True)

    def induce(self, kind: str) -> None:
        with self.lock:
            self.induced[kind] += 1

    def expect(self, where: str, conn_key: object, stmt: str, e: BaseException) -> None:
        """An error PostgreSQL itself raises in this situation: at most once per connection
        and statement; any more are errors."""
        kind = sqlstate(e) or type(e).__name__
        with self.lock:
            n = self.budget.get((conn_key, stmt), 0) + 1
            self.budget[(conn_key, stmt)] = n
            if n == 1:
                self.expected[kind] += 1
                return
        self.error(where, f"{describe(e)} (again on the same connection and statement: {n} times)")

    def note(self, s: str) -> None:
        with self.lock:
            self.notes.append(s)


STATS = Stats()


class ClientState:
    """What each client is doing (for the hang report) and how far it got."""

    def __init__(self, n: int) -> None:
        self.doing = ["starting"] * n
        self.progress = [0] * n
        self.finished = [False] * n


STATE = ClientState(CLIENTS)


# ------------------------------------------------------------------ the per-client model


class Model:
    """What one client has committed, to compare with what the database holds."""

    def __init__(self, c: int) -> None:
        self.c = c
        self.rows: dict[int, tuple[int, str, str]] = {}  # seq -> (val, note, mood)
        self.counter_incs = 0
        self.uncertain = False  # a COMMIT whose outcome is unknown (connection lost)

    def count_sum(self) -> tuple[int, int]:
        return len(self.rows), sum(v for v, _, _ in self.rows.values())

    def digest(self) -> str:
        text = ",".join(f"{s}:{v}:{n}:{m}" for s, (v, n, m) in sorted(self.rows.items()))
        return hashlib.md5(text.encode()).hexdigest()


class Plan:
    """One round's transaction: rows to insert, values to add, a counter to bump, churn
    statements to run, and the client's state once it commits."""

    def __init__(self, model: Model, r: int, inserts_per_round: int = 1) -> None:
        c = model.c
        self.model = model
        self.inserts = []
        for i in range(inserts_per_round):
            seq = r * inserts_per_round + i
            self.inserts.append((c, seq, c * 100000 + seq + 1, f"c{c}-s{seq}-ñ", MOODS[(c + seq) % 3]))
        prev = [s for s in (r * inserts_per_round - 1, r * inserts_per_round - 2) if s in model.rows]
        self.updates = [(r + 1 + i, c, s) for i, s in enumerate(prev[: max(1, inserts_per_round - 1)])]
        self.counter = c % 10
        window = [(c * 7 + j) % CHURN for j in range(CHURN_WINDOW)]
        self.churn = [window[(2 * r) % CHURN_WINDOW], window[(2 * r + 1) % CHURN_WINDOW]]
        self.churn_arg = r + c
        rows = dict(model.rows)
        for _, seq, val, note, mood in self.inserts:
            rows[seq] = (val, note, mood)
        for delta, _, seq in self.updates:
            v, n, m = rows[seq]
            rows[seq] = (v + delta, n, m)
        self.after = rows

    def expected_sum(self) -> tuple[int, int]:
        return len(self.after), sum(v for v, _, _ in self.after.values())

    def expected_items(self) -> list[tuple]:
        return [(s, v, n, m) for s, (v, n, m) in sorted(self.after.items())]

    def check_churn(self, k: int, row) -> None:
        v, tag = row[0], row[1]
        if v != self.churn_arg * 1000 + k or tag != f"churn-{k}":
            raise WrongResult(f"churn statement {k} returned ({v!r}, {tag!r})")

    def check_sum(self, row) -> None:
        got = (int(row[0]), int(row[1]))
        if got != self.expected_sum():
            raise WrongResult(f"count/sum of own rows inside the transaction {got} != {self.expected_sum()}")

    def check_items(self, rows) -> None:
        got = [(int(s), int(v), n, str(m)) for s, v, n, m in rows]
        if got != self.expected_items():
            raise WrongResult(f"cursor read {len(got)} rows, differing from the {len(self.after)} expected")

    def commit(self) -> None:
        self.model.rows = self.after
        self.model.counter_incs += 1


def induced_insert(c: int, r: int) -> tuple:
    """A row the failing transaction writes first: it must never become visible."""
    return (c, -(r + 1), -1, f"rolled-back-{c}-{r}", MOODS[0])


# ------------------------------------------------------------------ the schema change


class SchemaChange:
    """ALTER TABLE wide ADD COLUMN, through DIRECT_URL, once every client reached
    ALTER_ROUND, while the even clients keep reading the table with cached statements."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, name="alter", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _run(self) -> None:
        limit = time.monotonic() + min(60.0, DEADLINE_S / 2)
        while time.monotonic() < limit:
            if all(p >= ALTER_ROUND or f for p, f in zip(STATE.progress, STATE.finished)):
                break
            time.sleep(0.02)
        else:
            STATS.note("ALTER ran before every client reached its round")
        self.started.set()
        try:
            with psycopg.connect(DIRECT_URL, autocommit=True, application_name="side-alter") as conn:
                conn.execute("SET lock_timeout = '20s'")
                conn.execute(ALTER)
        except Exception as e:  # noqa: BLE001
            STATS.error("ALTER TABLE through DIRECT_URL", describe(e))
        self.done.set()

    def check_row(self, row, wid: int, done_before: bool, started_after: bool) -> None:
        """The row of `SELECT * FROM wide WHERE id = wid`, read when the ALTER was done
        (`done_before`) or had not started yet (not `started_after`)."""
        if row is None:
            raise WrongResult(f"wide row {wid} missing")
        vals = tuple(row)
        if vals[:3] != (wid, wid * 7, f"w{wid}"):
            raise WrongResult(f"wide row {wid} is {vals!r}")
        if done_before and vals != (wid, wid * 7, f"w{wid}", 7):
            raise WrongResult(f"wide row {wid} read after the ALTER is {vals!r}: old shape")
        if not started_after and len(vals) != 3:
            raise WrongResult(f"wide row {wid} read before the ALTER is {vals!r}")
        if len(vals) == 4 and vals[3] != 7:
            raise WrongResult(f"wide row {wid} is {vals!r}")
        if len(vals) not in (3, 4):
            raise WrongResult(f"wide row {wid} has {len(vals)} columns")


SCHEMA_CHANGE = SchemaChange()


# ------------------------------------------------------------------ set-up, checks, result


def create_schema() -> None:
    with psycopg.connect(DIRECT_URL, autocommit=True, application_name="side-setup") as conn:
        conn.execute(SCHEMA)


def wait_active(c: int, timeout: float = 10.0) -> bool:
    """True once PostgreSQL runs client c's pg_sleep (so the cancel has a query to hit)."""
    marker = f"cancel-me c{c}."
    limit = time.monotonic() + timeout
    with psycopg.connect(DIRECT_URL, autocommit=True, application_name="side-cancel") as conn:
        while time.monotonic() < limit:
            n = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND position(%s in query) > 0"
                " AND pid <> pg_backend_pid()",
                (marker,),
            ).fetchone()[0]
            if n:
                return True
            time.sleep(0.02)
    return False


def verify(models: list[Model]) -> None:
    """Reads back, through PostgreSQL directly, what every client committed."""
    with psycopg.connect(DIRECT_URL, autocommit=True, application_name="side-verify") as conn:
        got = {
            c: (n, int(s), d)
            for c, n, s, d in conn.execute(
                "SELECT client, count(*), sum(val),"
                " md5(string_agg(seq || ':' || val || ':' || note || ':' || mood::text, ',' ORDER BY seq))"
                " FROM items WHERE seq >= 0 GROUP BY client"
            )
        }
        bad = 0
        for m in models:
            if m.uncertain:
                continue
            n, s = m.count_sum()
            want = (n, s, m.digest()) if n else None
            if got.get(m.c) != want:
                bad += 1
                if bad <= 3:
                    STATS.error(f"verify client {m.c}", f"rows (count, sum, md5) {got.get(m.c)} != {want}")
        if bad > 3:
            STATS.error("verify", f"{bad} clients' rows differ from what they committed")
        neg = conn.execute("SELECT count(*) FROM items WHERE seq < 0").fetchone()[0]
        if neg:
            STATS.error("verify", f"{neg} rows written by rolled-back transactions are visible")
        markers = conn.execute("SELECT client, token FROM markers ORDER BY client").fetchall()
        if markers:
            STATS.error("verify", f"rows of transactions abandoned by disconnecting clients were committed: {markers}")
        if not any(m.uncertain for m in models):
            total = conn.execute("SELECT sum(n) FROM counters").fetchone()[0]
            want = sum(m.counter_incs for m in models)
            if total != want:
                STATS.error("verify", f"counters sum {total} != {want} committed increments")
        ncols = conn.execute(
            "SELECT count(*) FROM information_schema.columns WHERE table_name = 'wide'"
        ).fetchone()[0]
        if ncols != 4:
            STATS.error("verify", f"table wide has {ncols} columns after the ALTER")


def finish(t0: float, extra: str = "") -> None:
    """Prints the result line and exits (0 when ok)."""
    with STATS.lock:
        ok = STATS.errors == 0
        parts = [
            f"{CLIENTS} clients x {ROUNDS} rounds",
            f"{time.monotonic() - t0:.1f}s",
            "induced " + (", ".join(f"{k}x{v}" for k, v in sorted(STATS.induced.items())) or "none"),
        ]
        if STATS.expected:
            parts.append("expected " + ", ".join(f"{k}x{v}" for k, v in sorted(STATS.expected.items())))
        if extra:
            parts.append(extra)
        parts += STATS.notes
        if STATS.samples:
            parts.append("errors: " + " | ".join(STATS.samples))
        result = {
            "ok": ok,
            "transactions": STATS.transactions,
            "errors": STATS.errors,
            "expected_errors": sum(STATS.expected.values()),
            "expected_kinds": dict(STATS.expected),
            "detail": "; ".join(parts),
        }
    sys.stdout.flush()
    print(json.dumps(result), flush=True)
    os._exit(0 if ok else 1)


def start_watchdog(t0: float) -> None:
    """Reports a hang (which clients, doing what) before the runner's timeout kills us."""

    def watch() -> None:
        time.sleep(max(1.0, DEADLINE_S - (time.monotonic() - t0)))
        stuck = [f"c{c}: {d}" for c, (d, f) in enumerate(zip(STATE.doing, STATE.finished)) if not f]
        STATS.error("hang", f"{len(stuck)} clients unfinished after {DEADLINE_S:.0f}s: " + "; ".join(stuck[:6]))
        finish(t0)

    threading.Thread(target=watch, name="watchdog", daemon=True).start()
