#!/usr/bin/env python3
"""pgbench (libpq) scenarios: the system's PostgreSQL 15 `pgbench` runs generated custom
scripts against TARGET_URL; schema set-up and read-back go through DIRECT_URL with `psql`
(drivers/README.md is the contract). Stdlib only.

Usage: pgbench_scenario.py MODE   (or --version: the pgbench version line)
  simple     -M simple: the simple query protocol, values inlined by pgbench
  extended   -M extended: unnamed statements with parameters
  prepared   -M prepared: named statements (P<script>_<command>), prepared once per connection
  pipeline   -M prepared, every transaction one \\startpipeline ... \\endpipeline; then short
             runs of a pipeline with a division by zero in the middle (-M extended and
             -M prepared, in an explicit transaction and not), whose clients must all abort
             with that error, and a normal run again on the same target with 0 failures

The load: CLIENTS clients (-c CLIENTS -j 2), TX transactions each (-t, so the totals are
known), picking among SCRIPTS generated scripts. Every transaction, in BEGIN ... COMMIT,
inserts the client's next row (seq = its own row count, val = client * 1000 + seq), adds 1
to it, bumps one of 10 shared counters (random) and its script's counter, checks its own
row count inside the transaction, and runs 4 of the SCRIPTS x 4 churn statements, whose
results are checked (with \\gset and a pgbench expression that divides by zero when the
value is wrong; in pipelines by the statement itself, against a value pgbench computed). A
read of pb_ref (random id) runs before it, outside the transaction. The distinct statement
texts (about 40) exceed parsnip's max_prepared_statements = 20.

Afterwards psql, through DIRECT_URL, checks per client the count, seq range and sum of its
rows, the shared counters' total, each script's counter against its rows, and that nothing
of the failing pipelines was committed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODES = ("simple", "extended", "prepared", "pipeline")
SCRIPTS = 6  # generated scripts, picked at random (equal weights)
CHURN_PER_SCRIPT = 4  # churn statements per script: 24 in all
COUNTERS = 10
REF_ROWS = 1000
ERR_CLIENTS = 8  # clients of each failing-pipeline run
ERR_TX = 2
RECOVERY_TX = 3


def find_bin(name: str) -> str:
    for cand in (shutil.which(name), f"/usr/lib/postgresql/15/bin/{name}"):
        if cand and os.path.exists(cand):
            return cand
    raise SystemExit(f"{name} not found (apt-get install postgresql-client-15)")


if len(sys.argv) > 1 and sys.argv[1] == "--version":
    print(subprocess.run([find_bin("pgbench"), "--version"], capture_output=True, text=True).stdout.strip())
    sys.exit(0)

MODE = sys.argv[1] if len(sys.argv) > 1 else ""
if MODE not in MODES:
    sys.exit(f"usage: {sys.argv[0]} {'|'.join(MODES)}|--version")

T0 = time.monotonic()
TARGET_URL = os.environ["TARGET_URL"]
DIRECT_URL = os.environ["DIRECT_URL"]
VIA_PARSNIP = os.environ.get("VIA_PARSNIP", "0") == "1"
CLIENTS = int(os.environ.get("CLIENTS", "100"))
TX = int(os.environ.get("PGBENCH_TX", "20"))  # transactions per client
# Every subprocess gets a timeout ending before the runner's kill, so a hang is reported.
DEADLINE = T0 + max(20.0, float(os.environ.get("SCENARIO_TIMEOUT_S", "120")) - 8.0)
PGBENCH, PSQL = find_bin("pgbench"), find_bin("psql")
QUERY_MODE = {"simple": "simple", "extended": "extended", "prepared": "prepared", "pipeline": "prepared"}[MODE]


class Result:
    def __init__(self) -> None:
        self.transactions = 0
        self.errors: list[str] = []
        self.expected: dict[str, int] = {}
        self.notes: list[str] = []

    def error(self, where: str, what: str) -> None:
        self.errors.append(f"{where}: {what}")
        print(f"ERROR {where}: {what}", file=sys.stderr, flush=True)

    def finish(self) -> None:
        parts = [f"-M {QUERY_MODE}, {CLIENTS} clients x {TX} tx, {SCRIPTS} scripts", *self.notes,
                 f"{time.monotonic() - T0:.1f}s"]
        if self.errors:
            parts.append("errors: " + " | ".join(e[:400] for e in self.errors[:8]))
        ok = not self.errors
        print(json.dumps({
            "ok": ok, "transactions": self.transactions, "errors": len(self.errors),
            "expected_errors": sum(self.expected.values()), "expected_kinds": self.expected,
            "detail": "; ".join(parts),
        }), flush=True)
        sys.exit(0 if ok else 1)


R = Result()


def remaining() -> float:
    return DEADLINE - time.monotonic()


# ------------------------------------------------------------------ psql (DIRECT_URL)


class PsqlError(Exception):
    pass


def psql(sql: str, timeout: float = 30.0) -> list[list[str]]:
    try:
        r = subprocess.run(
            [PSQL, "-X", "-A", "-t", "-q", "-F", "\t", "-v", "ON_ERROR_STOP=1", "-d", DIRECT_URL, "-f", "-"],
            input=sql, capture_output=True, text=True, timeout=max(1.0, min(timeout, remaining())),
        )
    except subprocess.TimeoutExpired:
        raise PsqlError(f"psql timed out: {sql[:120]!r}") from None
    if r.returncode != 0:
        raise PsqlError(f"psql failed: {r.stderr.strip()[:400]}")
    return [line.split("\t") for line in r.stdout.splitlines() if line]


SCHEMA = f"""
CREATE TABLE IF NOT EXISTS pb_ref (id int PRIMARY KEY, a int NOT NULL, b text NOT NULL);
CREATE TABLE IF NOT EXISTS pb_items (client int NOT NULL, seq int NOT NULL, script int NOT NULL,
                                     val bigint NOT NULL, PRIMARY KEY (client, seq));
CREATE TABLE IF NOT EXISTS pb_counters (id int PRIMARY KEY, n bigint NOT NULL);
CREATE TABLE IF NOT EXISTS pb_scripts (id int PRIMARY KEY, n bigint NOT NULL);
CREATE TABLE IF NOT EXISTS pb_marks (client int NOT NULL, tag text NOT NULL);
TRUNCATE pb_ref, pb_items, pb_counters, pb_scripts, pb_marks;
INSERT INTO pb_ref SELECT g, g * 7, 'r' || g FROM generate_series(1, {REF_ROWS}) g;
INSERT INTO pb_counters SELECT g, 0 FROM generate_series(1, {COUNTERS}) g;
INSERT INTO pb_scripts SELECT g, 0 FROM generate_series(0, {SCRIPTS - 1}) g;
"""


# ------------------------------------------------------------------ the scripts


def churn_k(s: int, j: int) -> int:
    return s * CHURN_PER_SCRIPT + j


def load_script(s: int, pipeline: bool) -> str:
    """Script s: one transaction (see the module doc). `own` (-D own=N) is the number of
    transactions the client committed before: pgbench keeps variables per client."""
    ks = [churn_k(s, j) for j in range(CHURN_PER_SCRIPT)]
    lines = [
        f"-- parsnip driver matrix: pgbench load script {s} ({'pipeline' if pipeline else 'plain'})",
        f"\\set k random(1, {REF_ROWS})",
        f"\\set cid random(1, {COUNTERS})",
        "\\set x random(1, 100000)",
    ]
    ins = (f"INSERT INTO pb_items (client, seq, script, val) SELECT :client_id::int, count(*), {s},"
           f" :client_id::int * 1000 + count(*) FROM pb_items WHERE client = :client_id::int;")
    upd = ("UPDATE pb_items SET val = val + 1 WHERE client = :client_id::int"
           " AND seq = (SELECT max(seq) FROM pb_items WHERE client = :client_id::int);")
    ctr = "UPDATE pb_counters SET n = n + 1 WHERE id = :cid::int;"
    scr = f"UPDATE pb_scripts SET n = n + 1 WHERE id = {s};"
    if not pipeline:
        def churn(k: int) -> list[str]:
            return [f"SELECT :x::int * 1000 + {k} AS v{k}, 'churn-{k}' AS tag{k} \\gset",
                    f"\\set chk 1 / (CASE WHEN :v{k} = :x * 1000 + {k} THEN 1 ELSE 0 END)"]
        lines += [
            "SELECT a AS ref_a, b AS ref_b FROM pb_ref WHERE id = :k::int \\gset",
            "\\set chk 1 / (CASE WHEN :ref_a = :k * 7 THEN 1 ELSE 0 END)",
            "BEGIN;",
            ins,
            *churn(ks[0]),
            upd,
            *churn(ks[1]),
            "SELECT count(*) AS own_n, sum(val) AS own_sum FROM pb_items WHERE client = :client_id::int \\gset",
            "\\set chk 1 / (CASE WHEN :own_n = :own + 1 THEN 1 ELSE 0 END)",
            ctr,
            *churn(ks[2]),
            *churn(ks[3]),
            scr,
            "COMMIT;",
        ]
    else:
        # No \gset in a pipeline: each check divides by zero in the statement itself when
        # the value differs from the one pgbench computed (`want`), so a statement mixed up
        # with another (a different constant) fails the run.
        def churn(k: int) -> list[str]:
            return [f"SELECT 1 / ((:x::int * 1000 + {k} = :want{k}::int)::int) AS ok{k}, 'churn-{k}' AS tag{k};"]
        lines += [f"\\set want{k} :x * 1000 + {k}" for k in ks]
        lines += [
            "\\set refwant :k * 7",
            "\\startpipeline",
            "BEGIN;",
            "SELECT 1 / (coalesce((SELECT a FROM pb_ref WHERE id = :k::int) = :refwant::int, false)::int) AS ref_ok;",
            ins,
            *churn(ks[0]),
            upd,
            *churn(ks[1]),
            "SELECT 1 / ((count(*) = :own::int + 1)::int) AS own_ok FROM pb_items WHERE client = :client_id::int;",
            ctr,
            *churn(ks[2]),
            *churn(ks[3]),
            scr,
            "COMMIT;",
            "\\endpipeline",
        ]
    lines.append("\\set own :own + 1")
    return "\n".join(lines) + "\n"


def failing_script(explicit_tx: bool) -> str:
    """A pipeline with a division by zero in the middle: the client aborts with it; nothing
    of the pipeline may be committed (pb_marks stays empty)."""
    body = [
        "INSERT INTO pb_marks (client, tag) VALUES (:client_id::int, 'before');",
        "SELECT :x::int * 1000 + 1 AS v, 'churn-1' AS tag;",
        "SELECT 1 / (:x::int - :x::int) AS boom;",
        "INSERT INTO pb_marks (client, tag) VALUES (:client_id::int, 'after');",
        "SELECT count(*) FROM pb_items WHERE client = :client_id::int;",
    ]
    if explicit_tx:
        body = ["BEGIN;", *body, "COMMIT;"]
    return "\n".join([f"-- parsnip driver matrix: failing pipeline ({'in BEGIN/COMMIT' if explicit_tx else 'implicit tx'})",
                      "\\set x random(1, 100000)", "\\startpipeline", *body, "\\endpipeline"]) + "\n"


def sql_texts(script: str) -> set[str]:
    out = set()
    for line in script.splitlines():
        if line and not line.startswith(("\\", "--")):
            out.add(re.sub(r"\s*\\gset$", "", line).rstrip(";"))
    return out


# ------------------------------------------------------------------ running pgbench

ABORT_RE = re.compile(r"client (\d+) (?:script \d+ )?aborted in command \d+ [^;:]*[;:] ?(.*)")
PROCESSED_RE = re.compile(r"number of transactions actually processed: (\d+)/(\d+)")
FAILED_RE = re.compile(r"number of failed transactions: (\d+)")
TPS_RE = re.compile(r"tps = ([\d.]+)")


class Run:
    def __init__(self, label: str, rc: int | None, output: str, secs: float) -> None:
        self.label, self.rc, self.output, self.secs = label, rc, output, secs
        m = PROCESSED_RE.search(output)
        self.processed, self.planned = (int(m.group(1)), int(m.group(2))) if m else (None, None)
        m = FAILED_RE.search(output)
        self.failed = int(m.group(1)) if m else None
        m = TPS_RE.search(output)
        self.tps = float(m.group(1)) if m else 0.0
        self.aborts: dict[int, str] = {}
        lines = output.splitlines()
        for i, line in enumerate(lines):
            am = ABORT_RE.search(line)
            if am:
                msg = am.group(2).strip() or " ".join(x.strip() for x in lines[i + 1:i + 2])
                self.aborts[int(am.group(1))] = msg

    def summary(self, n: int = 6) -> str:
        interesting = [l for l in self.output.splitlines() if "error" in l.lower() or "abort" in l.lower()]
        return " / ".join(interesting[:n]) or "\n".join(self.output.strip().splitlines()[-n:])


def pgbench(label: str, scripts: list[Path], clients: int, tx: int, query_mode: str, own: int = 0,
            cap: float = 60.0) -> Run:
    cmd = [PGBENCH, "-n", "-M", query_mode, "-c", str(clients), "-j", str(min(2, clients)), "-t", str(tx),
           "-D", f"own={own}"]
    for p in scripts:
        cmd += ["-f", f"{p}@1"]
    cmd.append(TARGET_URL)
    timeout = max(1.0, min(cap, remaining()))
    t = time.monotonic()
    env = dict(os.environ, PGAPPNAME=f"pgbench-{MODE}-{label}", PGCONNECT_TIMEOUT="20")
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, stdin=subprocess.DEVNULL)
        run = Run(label, r.returncode, r.stdout + "\n" + r.stderr, time.monotonic() - t)
    except subprocess.TimeoutExpired as e:
        outp = (e.stdout or b"").decode(errors="replace") + "\n" + (e.stderr or b"").decode(errors="replace")
        run = Run(label, None, outp, time.monotonic() - t)
    print(f"--- pgbench {label}: rc={run.rc} processed={run.processed}/{run.planned} failed={run.failed}"
          f" aborted={len(run.aborts)} {run.secs:.1f}s\n{run.output.strip()[-3000:]}", file=sys.stderr, flush=True)
    return run


def check_load(run: Run, clients: int, tx: int) -> bool:
    """A normal run: exit 0, every transaction processed, 0 failed, no client aborted."""
    want = clients * tx
    ok = True
    if run.rc is None:
        R.error(run.label, f"pgbench hung: killed after {run.secs:.0f}s; {run.summary()}")
        return False
    if run.aborts:
        ok = False
        first = sorted(run.aborts.items())[:3]
        R.error(run.label, f"{len(run.aborts)} clients aborted, e.g. " + "; ".join(f"client {c}: {m}" for c, m in first))
    if run.failed is None or run.failed != 0:
        ok = False
        R.error(run.label, f"number of failed transactions: {run.failed}")
    if run.processed != want or run.planned != want:
        ok = False
        R.error(run.label, f"transactions processed {run.processed}/{run.planned}, want {want}/{want}")
    if run.rc != 0 and ok:
        ok = False
        R.error(run.label, f"pgbench exited {run.rc}: {run.summary()}")
    R.transactions += run.processed or 0
    return ok


def check_failing(run: Run, clients: int, tx: int) -> None:
    """The failing pipeline: every client aborts, with PostgreSQL's division by zero, and
    pgbench exits (2: run aborted) without hanging."""
    if run.rc is None:
        R.error(run.label, f"pgbench hung on the failing pipeline: killed after {run.secs:.0f}s; {run.summary()}")
        return
    wrong = {c: m for c, m in run.aborts.items() if "division by zero" not in m}
    if len(run.aborts) != clients or wrong:
        R.error(run.label, f"{len(run.aborts)}/{clients} clients aborted; not with 'division by zero':"
                           f" {dict(list(wrong.items())[:3])}; {run.summary()}")
    if run.processed not in (0, None) or run.planned != clients * tx:
        R.error(run.label, f"transactions processed {run.processed}/{run.planned}, want 0/{clients * tx}")
    if run.rc != 2:
        R.error(run.label, f"pgbench exited {run.rc}, want 2 (run aborted)")
    n = sum(1 for m in run.aborts.values() if "division by zero" in m)
    R.expected["22012"] = R.expected.get("22012", 0) + n


# ------------------------------------------------------------------ verification


def verify(total_tx: int) -> None:
    """Through DIRECT_URL: what every client must have committed."""
    t = total_tx
    rows = psql(
        "SELECT client, count(*), min(seq), max(seq), sum(val) FROM pb_items GROUP BY client ORDER BY client;"
    )
    got = {int(c): (int(n), int(lo), int(hi), int(s)) for c, n, lo, hi, s in rows}
    bad = []
    for c in range(CLIENTS):
        # val = c * 1000 + seq, plus the 1 every transaction adds to the row it inserted
        want = (t, 0, t - 1, t * c * 1000 + t * (t + 1) // 2)
        if got.get(c) != want:
            bad.append(f"client {c}: (count, min seq, max seq, sum) {got.get(c)} != {want}")
    extra = sorted(set(got) - set(range(CLIENTS)))
    if extra:
        bad.append(f"rows of unknown clients {extra[:5]}")
    if bad:
        R.error("verify", f"{len(bad)} clients' rows differ: " + "; ".join(bad[:3]))
    (n_items, ctr_total, scr_total), = [[int(x) for x in r] for r in psql(
        "SELECT (SELECT count(*) FROM pb_items), (SELECT sum(n) FROM pb_counters), (SELECT sum(n) FROM pb_scripts);")]
    want_total = CLIENTS * t
    if (n_items, ctr_total, scr_total) != (want_total,) * 3:
        R.error("verify", f"rows {n_items}, counters total {ctr_total}, script counters total {scr_total};"
                          f" want {want_total} each")
    mism = psql("SELECT s.id, s.n, (SELECT count(*) FROM pb_items i WHERE i.script = s.id) FROM pb_scripts s"
                " WHERE s.n <> (SELECT count(*) FROM pb_items i WHERE i.script = s.id);")
    if mism:
        R.error("verify", f"script counters differ from their rows (id, counter, rows): {mism[:3]}")
    used = psql("SELECT count(*) FROM pb_scripts WHERE n > 0;")[0][0]
    marks = psql("SELECT count(*) FROM pb_marks;")[0][0]
    if marks != "0":
        R.error("verify", f"{marks} rows of the failing pipelines were committed")
    R.notes.append(f"verified {n_items} rows of {CLIENTS} clients, counters {ctr_total}, {used}/{SCRIPTS} scripts used")


# ------------------------------------------------------------------ main


def main() -> None:
    psql(SCHEMA)
    tmp = Path(tempfile.mkdtemp(prefix=f"pgbench-{MODE}-"))
    try:
        pipeline = MODE == "pipeline"
        texts: set[str] = set()
        scripts = []
        for s in range(SCRIPTS):
            body = load_script(s, pipeline)
            texts |= sql_texts(body)
            p = tmp / f"load{s}.sql"
            p.write_text(body)
            scripts.append(p)
        R.notes.append(f"{len(texts)} distinct statements")
        run = pgbench("load", scripts, CLIENTS, TX, QUERY_MODE, cap=90.0)
        check_load(run, CLIENTS, TX)
        R.notes.append(f"load {run.processed}/{run.planned} tx, {run.failed} failed, {len(run.aborts)} aborted,"
                       f" {run.tps:.0f} tps, {run.secs:.1f}s")
        total = TX
        if pipeline:
            fails = []
            for qm in ("extended", "prepared"):
                for explicit in (True, False):
                    p = tmp / f"fail-{qm}-{'tx' if explicit else 'implicit'}.sql"
                    p.write_text(failing_script(explicit))
                    label = f"failing-pipeline -M {qm} {'BEGIN/COMMIT' if explicit else 'implicit tx'}"
                    fr = pgbench(label, [p], ERR_CLIENTS, ERR_TX, qm, cap=30.0)
                    check_failing(fr, ERR_CLIENTS, ERR_TX)
                    msgs = sorted(set(fr.aborts.values()))
                    fails.append(f"{label}: rc={fr.rc}, {len(fr.aborts)}/{ERR_CLIENTS} aborted"
                                 f" {msgs[:1]}, {fr.secs:.1f}s")
            R.notes.append("; ".join(fails))
            rr = pgbench("recovery", scripts, CLIENTS, RECOVERY_TX, QUERY_MODE, own=TX, cap=60.0)
            if check_load(rr, CLIENTS, RECOVERY_TX):
                total += RECOVERY_TX
            R.notes.append(f"recovery run {rr.processed}/{rr.planned} tx, {rr.failed} failed,"
                           f" {len(rr.aborts)} aborted, {rr.secs:.1f}s")
        if not R.errors:
            verify(total)
    except PsqlError as e:
        R.error("psql", str(e))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    R.finish()


if __name__ == "__main__":
    main()
