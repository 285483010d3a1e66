#!/usr/bin/env python3
"""The driver matrix: real PostgreSQL drivers run real workloads, directly against
PostgreSQL and then through parsnip in transaction mode (drivers/README.md is the contract
between this runner and the scenarios).

    python3 drivers/run.py                    # every scenario of every drivers/*/scenarios.json
    python3 drivers/run.py --only psycopg     # scenarios (or drivers) whose name starts so
    python3 drivers/run.py --skip-setup --clients 20 --keep

Stdlib only. Prints one line per scenario and a final `driver-matrix: N passed, M failed`;
exits non-zero when any scenario failed (through parsnip, or directly: a broken scenario).
Rewrites the table between the `<!-- driver-matrix -->` markers of the top-level README.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import throwaway  # noqa: E402  (scripts/throwaway.py: clusters, processes, binaries)
from throwaway import (  # noqa: E402
    CLEANUPS, REPO, free_port, kill_group, log, parsnip_env, service_user, stop_process, tail, wait_listening,
)
from throwaway import HarnessError as MatrixError  # noqa: E402
from scenarios import Scenario, discover, driver_version, run_setup, selected  # noqa: E402

README = REPO / "README.md"
DB_USER = "postgres"
POOL_SIZE = 4
MAX_PREPARED = 20
BEGIN_MARK, END_MARK = "<!-- driver-matrix -->", "<!-- /driver-matrix -->"

def out(msg: str) -> None:
    print(msg, flush=True)


# --------------------------------------------------------------------------- PostgreSQL and parsnip


class Postgres(throwaway.Postgres):
    """The matrix's cluster: 400 connections, its log line prefix carrying the pid and the
    database, so the parses of a parsnip run can be counted from PostgreSQL's side; psql
    gives up after a minute."""

    def __init__(self, bindir: Path, tmp: Path, user) -> None:
        super().__init__(bindir, tmp, user, DB_USER, label="parsnip driver matrix", psql_timeout=60, settings={
            "shared_buffers": "128MB",
            "log_line_prefix": "'%m [%p] %d '",
        })


class Parsnip:
    """parsnip in front of the cluster: transaction mode, pool_size 4, 20 statements per
    server connection, the admin console open (trust), Prometheus metrics on a port of
    its own (METRICS_URL)."""

    def __init__(self, binary: Path, pg: Postgres, db: str, work: Path, extra: list[str] | None = None) -> None:
        self.binary, self.pg, self.db, self.work = binary, pg, db, work
        self.extra = extra or []
        self.port = free_port()
        self.metrics_port = free_port()
        self.log_path = work / f"parsnip-{db}.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        cfg = self.work / f"parsnip-{self.db}.toml"
        cfg.write_text(
            'pool_mode = "transaction"\n'
            f"pool_size = {POOL_SIZE}\n"
            f"max_prepared_statements = {MAX_PREPARED}\n"
            'auth_type = "trust"\n'
            f'log_level = "{os.environ.get("PARSNIP_LOG", "warn")}"\n'
            "max_client_conn = 5000\n"
            f'metrics_listen = "127.0.0.1:{self.metrics_port}"\n'
            + "".join(f"{line}\n" for line in self.extra)
        )
        logf = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [str(self.binary), f"postgres://{DB_USER}@127.0.0.1:{self.pg.port}/{self.db}",
             "--listen", f"127.0.0.1:{self.port}", "-c", str(cfg)],
            stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True,
            cwd=self.work, env=parsnip_env(),
        )
        logf.close()
        CLEANUPS.push(self.stop)
        try:
            wait_listening(self.port, self.proc)
        except MatrixError as e:
            self.stop()
            raise MatrixError(f"parsnip {e}: {tail(self.log_path, 3)}") from None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc, signal.SIGINT, grace=5)
            CLEANUPS.remove(self.stop)
            self.proc = None


# --------------------------------------------------------------------------- one run


@dataclasses.dataclass
class ModeResult:
    mode: str  # direct | parsnip
    status: str = "SKIP"  # PASS | FAIL | TIMEOUT | SKIP
    secs: float = 0.0
    result: dict = dataclasses.field(default_factory=dict)
    problems: list[str] = dataclasses.field(default_factory=list)
    counters: dict = dataclasses.field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return self.status == "PASS"

    def get(self, k: str) -> int:
        v = self.result.get(k)
        return v if isinstance(v, int) else 0


def db_name(s: Scenario, mode: str) -> str:
    return re.sub(r"[^a-z0-9_]", "_", f"dm_{s.name}_{mode}".lower())[:60]


def run_scenario_process(s: Scenario, mode: str, env_extra: dict, work: Path, mr: ModeResult) -> None:
    env = dict(os.environ, **env_extra)
    stem = work / f"{s.name}.{mode}"
    t0 = time.monotonic()
    with open(f"{stem}.out", "wb") as so, open(f"{stem}.err", "wb") as se:
        try:
            p = subprocess.Popen(s.run, cwd=s.dir, env=env, stdin=subprocess.DEVNULL, stdout=so, stderr=se,
                                 start_new_session=True)
        except OSError as e:
            mr.status, mr.problems = "FAIL", [f"could not start {s.run}: {e}"]
            return
        try:
            rc = p.wait(timeout=s.timeout_s)
        except subprocess.TimeoutExpired:
            kill_group(p)
            rc = None
        except BaseException:  # Ctrl-C, SIGTERM: the scenario runs in its own session
            kill_group(p)
            raise
    mr.secs = time.monotonic() - t0
    lines = [line for line in Path(f"{stem}.out").read_text(errors="replace").splitlines() if line.strip()]
    try:
        mr.result = json.loads(lines[-1]) if lines else {}
        if not isinstance(mr.result, dict):
            raise ValueError
    except ValueError:
        mr.result = {}
    if rc is None:
        mr.status = "TIMEOUT"
        mr.problems.append(f"killed after {s.timeout_s:.0f}s (timeout_s)")
    elif not mr.result:
        mr.status = "FAIL"
        mr.problems.append(f"exit code {rc}, no JSON result line; stderr: {tail(Path(f'{stem}.err'), 6)}")
    elif rc != 0 or mr.result.get("ok") is not True or mr.get("errors") != 0:
        mr.status = "FAIL"
        mr.problems.append(f"exit code {rc}, ok={mr.result.get('ok')}, errors={mr.result.get('errors')}")
    else:
        mr.status = "PASS"


PARSE_RE = re.compile(r"\[(\d+)\] (\S*) LOG:\s+duration: [\d.]+ ms\s+(parse|bind|execute|statement) ?([^:]*): ?(.*)")


def scan_pg_log(pg: Postgres, start: int, db: str) -> dict:
    """What PostgreSQL logged (log_min_duration_statement = 0 for this database) since byte
    `start`: Parses of parsnip's named statements (pn_N, also as SQL PREPARE pn_N), the
    backends that received them, unnamed Parses, and executions."""
    named, pairs, names, pids = 0, set(), set(), set()
    unnamed = executes = 0
    with open(pg.log_path, "rb") as f:
        f.seek(start)
        for raw in f:
            if b" LOG:  duration: " not in raw:
                continue
            m = PARSE_RE.search(raw.decode(errors="replace"))
            if not m or m.group(2) != db:
                continue
            pid, kind, name, text = m.group(1), m.group(3), m.group(4).strip(), m.group(5)
            if kind == "parse":
                pm = re.match(r"PREPARE (pn_\d+)", text) if name == "<unnamed>" else None
                stmt = name if name.startswith("pn_") else (pm.group(1) if pm else None)
                if stmt:
                    named += 1
                    names.add(stmt)
                    pids.add(pid)
                    pairs.add((pid, stmt))
                else:
                    unnamed += 1
            elif kind in ("execute", "statement"):
                executes += 1
    return {"pg_named_parses": named, "pg_statements": len(names), "pg_backends": len(pids),
            "pg_first_parses": len(pairs), "pg_unnamed_parses": unnamed, "pg_executions": executes}


def console_counters(pg: Postgres, port: int, db: str) -> dict | None:
    rows = pg.psql_rows("SHOW PREPARED_STATEMENTS", db="parsnip", port=port)
    cols = ("database", "user", "cached", "client_parses", "server_parses", "hits", "evictions", "promotions",
            "invalidations")
    for r in rows:
        if len(r) >= len(cols) and r[0] == db:
            return {k: (int(v) if k not in ("database", "user") else v) for k, v in zip(cols, r)}
    return None


def dirty_backends(pg: Postgres, db: str) -> list[list[str]]:
    """Backends of `db` not idle (idle in transaction, still active), polled for 5 s so
    that parsnip has time to roll back or close what disconnected clients left."""
    deadline = time.monotonic() + 5
    while True:
        rows = pg.psql_rows(
            "SELECT pid, state, coalesce(application_name, ''), left(regexp_replace(query, '\\s+', ' ', 'g'), 100)"
            f" FROM pg_stat_activity WHERE datname = '{db}' AND pid <> pg_backend_pid()"
            " AND backend_type = 'client backend' AND state IS DISTINCT FROM 'idle'"
        )
        if not rows or time.monotonic() > deadline:
            return rows
        time.sleep(0.2)


def check_parsnip_run(pg: Postgres, px: Parsnip, db: str, log_start: int, mr: ModeResult) -> None:
    """After a parsnip run: parsnip alive and not panicking, no dirty server connection,
    and server Parses bounded (the bound is documented in drivers/README.md)."""
    problems = []
    if not px.alive():
        problems.append(f"parsnip died (exit {px.proc.returncode if px.proc else '?'}): {tail(px.log_path, 3)}")
    else:
        try:
            c = console_counters(pg, px.port, db)
            if c is None:
                problems.append(f"SHOW PREPARED_STATEMENTS has no row for database {db}")
            else:
                mr.counters.update(c)
        except (MatrixError, subprocess.TimeoutExpired) as e:
            problems.append(f"admin console: {e}")
    plog = px.log_path.read_text(errors="replace") if px.log_path.exists() else ""
    if "panicked" in plog:
        problems.append("parsnip panicked: " + next(line for line in plog.splitlines() if "panicked" in line)[:300])
    for pid, state, app, query in dirty_backends(pg, db):
        problems.append(f"server connection left {state!r} (pid {pid}, application_name {app!r}): {query}")
    mr.counters.update(scan_pg_log(pg, log_start, db))
    c = mr.counters
    if "server_parses" in c:
        sp, pgp = c["server_parses"], c["pg_named_parses"]
        bound = c["pg_statements"] * c["pg_backends"] + c["evictions"] + c["invalidations"] * MAX_PREPARED
        c["bound"] = bound
        if pgp > bound:
            problems.append(
                f"server Parses (PostgreSQL's count) {pgp} > bound {bound} = {c['pg_statements']} statements x"
                f" {c['pg_backends']} server connections + {c['evictions']} evictions + {c['invalidations']}"
                f" invalidations x {MAX_PREPARED}")
        # parsnip counts a Parse when the server completes it; a server connection closed
        # with replies unread (a client vanished mid-batch) takes a few with it.
        if pgp > sp + max(10, sp // 100):
            problems.append(f"PostgreSQL logged {pgp} Parses of parsnip's statements, parsnip counted {sp}")
    mr.problems += problems
    if problems and mr.status == "PASS":
        mr.status = "FAIL"


def run_mode(s: Scenario, mode: str, pg: Postgres, parsnip_bin: Path | None, work: Path, clients: int,
             keep: bool) -> ModeResult:
    mr = ModeResult(mode)
    db = db_name(s, mode)
    try:
        pg.psql(f"DROP DATABASE IF EXISTS {db}")
        pg.psql(f"CREATE DATABASE {db}")
    except MatrixError as e:
        mr.status, mr.problems = "FAIL", [str(e)]
        return mr
    direct_url = f"postgres://{DB_USER}@127.0.0.1:{pg.port}/{db}"
    env = {"DIRECT_URL": direct_url, "DIRECT_PORT": str(pg.port), "CLIENTS": str(clients),
           "TARGET_HOST": "127.0.0.1", "TARGET_DB": db, "TARGET_USER": DB_USER,
           "SCENARIO_TIMEOUT_S": str(int(s.timeout_s))}
    if mode == "direct":
        env.update(TARGET_URL=direct_url, TARGET_PORT=str(pg.port), VIA_PARSNIP="0")
        run_scenario_process(s, mode, env, work, mr)
    else:
        assert parsnip_bin is not None
        pg.psql(f"ALTER DATABASE {db} SET log_min_duration_statement = 0")
        px = Parsnip(parsnip_bin, pg, db, work, s.parsnip_config)
        try:
            px.start()
        except MatrixError as e:
            mr.status, mr.problems = "FAIL", [str(e)]
            return mr
        try:
            log_start = pg.log_size()
            env.update(TARGET_URL=f"postgres://{DB_USER}@127.0.0.1:{px.port}/{db}", TARGET_PORT=str(px.port),
                       VIA_PARSNIP="1", METRICS_URL=f"http://127.0.0.1:{px.metrics_port}")
            run_scenario_process(s, mode, env, work, mr)
            check_parsnip_run(pg, px, db, log_start, mr)
        finally:
            px.stop()
    if not keep:
        try:
            pg.psql(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
        except MatrixError as e:
            log(f"drop {db}: {e}")
    return mr


def compare_expected(direct: ModeResult, px: ModeResult) -> None:
    """Errors counted as expected through parsnip must be of a kind the direct run shows
    too (PostgreSQL raises them); otherwise they are parsnip's."""
    if not direct.passed or px.status != "PASS":
        return
    dk, pk = direct.result.get("expected_kinds"), px.result.get("expected_kinds")
    if isinstance(dk, dict) and isinstance(pk, dict):
        # 0A000 depends on when the schema change lands against each client's statements, so
        # a run may see none directly; every scenario bounds it itself (one per client,
        # statement and schema change).
        extra = {k: v for k, v in pk.items() if v and not dk.get(k) and k != "0A000"}
        if extra:
            px.status = "FAIL"
            px.problems.append(f"expected errors {extra} through parsnip that the direct run did not raise")
    elif px.get("expected_errors") and not direct.get("expected_errors"):
        px.status = "FAIL"
        px.problems.append(f"{px.get('expected_errors')} expected errors through parsnip, none directly")


# --------------------------------------------------------------------------- README table


def git_rev() -> str:
    r = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    rev = r.stdout.strip() if r.returncode == 0 else "unknown"
    d = subprocess.run(["git", "status", "--porcelain", "--", "src", "Cargo.toml", "Cargo.lock"], cwd=REPO,
                       capture_output=True, text=True)
    return rev + ("+dirty" if d.stdout.strip() else "")


def status_cell(mr: ModeResult) -> str:
    return {"PASS": "pass", "FAIL": "**FAIL**", "TIMEOUT": "**TIMEOUT**", "KNOWN": "known issue¹"}.get(
        mr.status, mr.status.lower())


def update_readme(rows: dict[str, list[str]], known: list[Scenario], header: str) -> bool:
    """Rewrites the table between the markers: this run's rows, plus the rows of earlier
    runs for scenarios that still exist and were not run this time."""
    text = README.read_text()
    if BEGIN_MARK not in text or END_MARK not in text:
        text = text.rstrip("\n") + f"\n\n## Driver matrix\n\n{BEGIN_MARK}\n{END_MARK}\n"
    head, rest = text.split(BEGIN_MARK, 1)
    old, tail_text = rest.split(END_MARK, 1)
    by_cells = {(s.driver, s.mode): s.name for s in known}
    merged: dict[str, list[str]] = {}
    for line in old.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) == 10 and (cells[0], cells[2]) in by_cells:
            merged[by_cells[(cells[0], cells[2])]] = cells
    merged.update(rows)
    order = {s.name: i for i, s in enumerate(known)}
    table = [
        "| driver | version | mode | direct | parsnip | transactions | errors | expected errors"
        " | server Parses (bound) | run |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name in sorted(merged, key=lambda n: order.get(n, 1 << 30)):
        table.append("| " + " | ".join(merged[name]) + " |")
    block = f"{BEGIN_MARK}\n{header}\n\n" + "\n".join(table) + f"\n{END_MARK}"
    README.write_text(head + block + tail_text)
    return True


# --------------------------------------------------------------------------- main


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", action="append", default=[], metavar="PREFIX",
                    help="run scenarios whose name (or driver, or directory) starts with PREFIX (repeatable,"
                         " or comma-separated)")
    ap.add_argument("--skip-setup", action="store_true", help="don't run the drivers' setup commands")
    ap.add_argument("--clients", type=int, default=100, help="CLIENTS given to each scenario (default 100)")
    ap.add_argument("--keep", action="store_true",
                    help="don't clean up: keep the temp dir (PostgreSQL data and log, parsnip logs, scenario"
                         " output) and the scenario databases")
    ap.add_argument("--no-build", action="store_true", help="use target/release/parsnip as it is")
    ap.add_argument("--no-readme", action="store_true", help="don't rewrite the table in README.md")
    ap.add_argument("--pg-bin", metavar="DIR",
                    help="the PostgreSQL bin dir of the cluster (default: $PARSNIP_PG_BIN, else pg_config --bindir,"
                         " else the newest /usr/lib/postgresql/*/bin, as parsnip's embedded mode finds it)")
    args = ap.parse_args()
    only = [p for o in args.only for p in o.split(",") if p]

    def on_term(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)

    everything, problems = discover()
    for p in problems:
        out(f"driver-matrix: scenarios.json problem: {p}")
    scenarios = [s for s in everything if selected(s, only)]
    if not scenarios:
        out(f"driver-matrix: no scenario matches {only or 'anything'}")
        out(f"driver-matrix: 0 passed, {1 if problems else 0} failed")
        return 1
    user = service_user()
    tmp = Path(tempfile.mkdtemp(prefix="parsnip-drivers-"))
    if user:
        os.chown(tmp, user.pw_uid, user.pw_gid)
    work = tmp / "work"
    work.mkdir()
    passed = failed = known = 0
    failures: list[str] = []
    rows: dict[str, list[str]] = {}
    pg = None
    t_setup = t_run = 0.0
    try:
        parsnip_bin = throwaway.parsnip_release(build=not args.no_build)
        setup_failed: dict[Path, str] = {}
        for d in sorted({s.dir for s in scenarios}):
            ok, note, secs = run_setup(d, [s for s in everything if s.dir == d], args.skip_setup)
            t_setup += secs
            log(f"setup drivers/{d.name}: {'ok' if ok else 'FAILED'}, {note} ({secs:.1f}s)")
            if not ok:
                setup_failed[d] = note
        pg = Postgres(throwaway.find_pg_bindir(args.pg_bin, need=("psql", "pg_isready"), install=True), tmp, user)
        pg.start()
        rev = git_rev()
        today = datetime.date.today().isoformat()
        for s in scenarios:
            if s.dir in setup_failed:
                failed += 1
                out(f"driver-matrix: {s.name} direct=SKIP parsnip=SKIP tx=0 errors=0 expected=0 server_parses=0")
                out(f"  setup failed: {setup_failed[s.dir]}")
                failures.append(f"{s.name}: setup failed: {setup_failed[s.dir]}"[:1000])
                continue
            version = driver_version(s)
            log(f"{s.name} ({version}): direct")
            direct = run_mode(s, "direct", pg, None, work, args.clients, args.keep)
            log(f"{s.name}: direct {direct.status} in {direct.secs:.1f}s; through parsnip")
            px = run_mode(s, "parsnip", pg, parsnip_bin, work, args.clients, args.keep)
            log(f"{s.name}: parsnip {px.status} in {px.secs:.1f}s")
            t_run += direct.secs + px.secs
            compare_expected(direct, px)
            ok = direct.passed and px.passed
            if not ok and direct.passed and s.known_issue and px.status == "FAIL":
                px.status = "KNOWN"
                known += 1
                out(f"  known issue (not counted as failed): {s.known_issue}")
            else:
                passed += ok
                failed += not ok
                if not ok:
                    failures.append(f"{s.name}: direct={direct.status} parsnip={px.status}")
                    for mr in (direct, px):
                        if not mr.passed:
                            failures.append(f"  {mr.mode}: {mr.result.get('detail', '')}"[:1000])
                            failures.extend(f"  {mr.mode}: {p}"[:1000] for p in mr.problems)
            sp = px.counters.get("server_parses", 0)
            out(f"driver-matrix: {s.name} direct={direct.status} parsnip={px.status} tx={px.get('transactions')}"
                f" errors={px.get('errors')} expected={px.get('expected_errors')} (direct {direct.get('expected_errors')})"
                f" server_parses={sp}")
            if not direct.passed:
                out("  BROKEN SCENARIO: it fails against PostgreSQL directly")
            c = px.counters
            if "bound" in c:
                out(f"  parsnip: {px.secs:.1f}s; server Parses: parsnip counted {sp}, PostgreSQL logged"
                    f" {c['pg_named_parses']}, bound {c['bound']} ({c['pg_statements']} statements x"
                    f" {c['pg_backends']} server connections + {c['evictions']} evictions + {c['invalidations']}"
                    f" invalidations x {MAX_PREPARED}); {c['pg_unnamed_parses']} unnamed Parses,"
                    f" {c['pg_executions']} executions; client Parses {c['client_parses']}, hits {c['hits']},"
                    f" promotions {c['promotions']}")
            for mr in (direct, px):
                if not mr.passed or mr.result.get("expected_errors"):
                    out(f"  {mr.mode}: {mr.status} in {mr.secs:.1f}s; {mr.result.get('detail', '')}"[:2000])
                for p in mr.problems:
                    out(f"  {mr.mode}: {p}"[:2000])
            if "bound" in c:
                over = c["pg_named_parses"] > c["bound"]
                bound = f"{sp} ({'**over** ' if over else ''}bound {c['bound']})"
            else:
                bound = "–"
            rows[s.name] = [s.driver, version, s.mode, status_cell(direct), status_cell(px),
                            str(px.get("transactions")), str(px.get("errors")), str(px.get("expected_errors")),
                            bound, f"{today} {rev}"]
        failed += len(problems)
        if not args.no_readme and rows:
            header = (f"Generated by `python3 drivers/run.py` (last run of each scenario; do not edit by hand)."
                      f" {pg.version}; parsnip in transaction mode, `pool_size = {POOL_SIZE}`,"
                      f" `max_prepared_statements = {MAX_PREPARED}`; {args.clients} client connections per"
                      f" scenario. *direct* is the same scenario against PostgreSQL itself. ¹ *known issue*:"
                      f" a parsnip failure already understood (the scenario's `known_issue`, and"
                      f" docs/design.md \"Known gaps\"); it does not fail the run.")
            update_readme(rows, everything, header)
    except MatrixError as e:
        out(f"driver-matrix: error: {e}")
        failed += 1
    except KeyboardInterrupt:
        out("driver-matrix: interrupted")
        failed += 1
    finally:
        CLEANUPS.run()
        if args.keep:
            log(f"kept {tmp} (restart PostgreSQL: {pg.bindir if pg else '<bindir>'}/postgres -D {tmp}/pgdata)")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    log(f"setup {t_setup:.1f}s, scenario runs {t_run:.1f}s, total {time.monotonic() - throwaway.START:.1f}s")
    if failures:
        # Again at the end, so a log cut to its tail still names what failed and why.
        out("driver-matrix: failed scenarios:")
        for line in failures:
            out(f"  {line}")
    out(f"driver-matrix: {passed} passed, {failed} failed" + (f", {known} known issues" if known else ""))
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
