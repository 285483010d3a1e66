#!/usr/bin/env python3
"""PHP's own PDO PostgreSQL test suite as a judge of parsnip: php-src's
ext/pdo_pgsql/tests/*.phpt, and through their common.phpt the driver-independent
ext/pdo/tests/*.phpt, run directly against a throwaway PostgreSQL and through parsnip
(transaction pooling, with and without autoprepare), reporting every test that passes
directly but fails through parsnip.

    python3 scripts/pdo_suite.py --src PHP_SRC [--modes direct,transaction,transaction-autoprepare,...]
        [--native-prepares] [--php PHP] [--pg-bin DIR] [--no-build] [--out DIR] [TEST ...]

PHP_SRC is a php-src tree of the installed PHP's version holding run-tests.php, ext/pdo and
ext/pdo_pgsql (the tests are not in Debian's binary packages; docs/pdo-suite.md says where
to get them). The suite reads its DSN from PDO_PGSQL_TEST_DSN and the PDO constructor's
options from PDO_PGSQL_TEST_ATTR (a serialized array, the suite's own switch): by default
{PDO::ATTR_EMULATE_PREPARES: true}, so PDO interpolates the values into the SQL and sends
simple Queries, which is what autoprepare lifts; --native-prepares leaves it unset (PDO's
own named prepared statements, the extended protocol). Tests that set the attribute
themselves, or open a connection of their own, keep theirs.

Modes: direct; transaction (parsnip, transaction pooling, autoprepare at its default: on,
after 3 sightings); transaction-autoprepare (the same with autoprepare_after = 1, so every
simple-protocol data statement with a numeric literal runs from a cached statement from its
first sighting); transaction-noautoprepare (autoprepare = false).
After a parsnip mode its console's SHOW PREPARED_STATEMENTS is printed (promotions and
server_parses say whether autoprepare engaged). Results: OUT/<mode>.txt (run-tests.php's
-W list), OUT/<mode>-diffs/ (the .diff and .out of each failed test), a summary on stdout;
exit 1 if a test passing directly fails through parsnip and is not in
scripts/pdo_suite_known.txt (each line: mode, test file, reason; a mode's variant such as
transaction-autoprepare shares its mode's lines), listed with reasons in docs/pdo-suite.md.
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from throwaway import (  # noqa: E402
    CLEANUPS, REPO, HarnessError, Postgres, log, parsnip_release, read_known, report_worse, start_parsnip,
    started_cluster, stop_process,
)

KNOWN = REPO / "scripts" / "pdo_suite_known.txt"
TESTS = "ext/pdo_pgsql/tests"  # its common.phpt redirects to ext/pdo/tests with the same DSN


def php_version(php: str) -> str:
    return subprocess.run([php, "-r", "echo PHP_VERSION;"], capture_output=True, text=True, check=True).stdout


def emulate_attr(php: str) -> str:
    """PDO_PGSQL_TEST_ATTR asking for emulated prepares, serialized by PHP itself."""
    return subprocess.run([php, "-r", "echo serialize([PDO::ATTR_EMULATE_PREPARES => true]);"],
                          capture_output=True, text=True, check=True).stdout


def run_suite(php: str, src: Path, dsn: str, attr: str | None, out: Path, mode: str, tests: list[str]) -> None:
    result = out / f"{mode}.txt"
    result.unlink(missing_ok=True)
    cmd = [php, "run-tests.php", "-p", php, "-q", "-j1", "--set-timeout", "60", "-W", str(result),
           *(tests or [TESTS])]
    # PDO_PGSQL_*: what ext/pdo_pgsql's config.inc and common.phpt read; PDOTEST_*: what
    # ext/pdo/tests read when one of them is named on its own instead of through common.phpt.
    env = {**os.environ, "PDO_PGSQL_TEST_DSN": dsn, "PDOTEST_DSN": dsn, "REDIR_TEST_DIR": f"{src}/ext/pdo/tests/",
           "NO_INTERACTION": "1", "TEST_PHP_EXECUTABLE": php}
    for k in ("PDO_PGSQL_TEST_ATTR", "PDOTEST_ATTR", "PDOTEST_USER", "PDOTEST_PASS"):
        env.pop(k, None)
    if attr:
        env["PDO_PGSQL_TEST_ATTR"] = env["PDOTEST_ATTR"] = attr
    log(f"run-tests.php ({dsn})")
    r = subprocess.run(cmd, cwd=src, env=env, capture_output=True, text=True)
    (out / f"{mode}.log").write_text(r.stdout + r.stderr)
    summary = [line.strip() for line in r.stdout.splitlines() if line.startswith("Tests ")]
    log(", ".join(summary) if summary else f"run-tests.php exited {r.returncode}: {r.stderr[-500:]}")
    # Keep each failed test's .diff and .out: the next mode's run overwrites them in the tree.
    diffs = out / f"{mode}-diffs"
    shutil.rmtree(diffs, ignore_errors=True)
    diffs.mkdir()
    for test, status in outcomes(result, src).items():
        if status == "FAILED":
            for ext in (".diff", ".out"):
                # A test run through common.phpt leaves them in common.phpt's directory.
                f = (src / test).with_suffix(ext)
                if not f.exists():
                    f = src / TESTS / f.name
                if f.exists():
                    shutil.copy(f, diffs / f"{Path(test).parts[1]}-{f.name}")  # pdo- or pdo_pgsql-


def outcomes(result: Path, src: Path) -> dict[str, str]:
    """test file (relative to the php-src tree) -> PASSED, FAILED, SKIPPED, XFAILED, BORKED, ... from a -W list
    (whose redirected tests read "# SRC/ext/pdo_pgsql/tests/common.phpt: SRC/ext/pdo/tests/x.phpt")."""
    if not result.exists():
        raise HarnessError(f"run-tests.php wrote no {result}")
    out = {}
    for line in result.read_text().splitlines():
        status, _, test = line.partition("\t")
        test = test.rpartition(": ")[2].strip() if test.startswith("#") else test.strip()
        if test:
            out[str(Path(test).relative_to(src))] = status.strip()
    return out


def first_difference(out: Path, mode_a: str, mode_b: str, test: str) -> str | None:
    """The first line pair in which the kept .out of `test` differs between two modes."""
    name = f"{Path(test).parts[1]}-{Path(test).stem}.out"
    a, b = out / f"{mode_a}-diffs" / name, out / f"{mode_b}-diffs" / name
    if not a.exists() or not b.exists():
        return "(no .out kept)"
    la, lb = a.read_text(errors="replace").splitlines(), b.read_text(errors="replace").splitlines()
    for x, y in zip(la + [""] * len(lb), lb + [""] * len(la)):
        if x != y:
            return f"{x.strip()[:100]!r} -> {y.strip()[:100]!r}"
    return None


def console(pg: Postgres, port: int, command: str) -> list[dict[str, str]]:
    """A SHOW command on parsnip's admin console (database `parsnip`), rows as dicts."""
    r = subprocess.run([pg.bin("psql"), "-X", "--csv", "-h", "127.0.0.1", "-p", str(port), "-U", "postgres",
                        "-d", "parsnip", "-c", command], capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        raise HarnessError(f"console {command!r}: {r.stderr.strip()}")
    return list(csv.DictReader(io.StringIO(r.stdout)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", required=True, type=Path, help="php-src tree (run-tests.php, ext/pdo, ext/pdo_pgsql)")
    ap.add_argument("--modes", default="direct,transaction,transaction-autoprepare,transaction-noautoprepare",
                    help="of direct, session, transaction (autoprepare at its default: on), transaction-autoprepare "
                         "(autoprepare_after = 1), transaction-noautoprepare (autoprepare = false)")
    ap.add_argument("--native-prepares", action="store_true",
                    help="leave PDO_PGSQL_TEST_ATTR unset: PDO's server-side prepares instead of emulated ones")
    ap.add_argument("--php", default=shutil.which("php") or "php")
    ap.add_argument("--pg-bin")
    ap.add_argument("--no-build", action="store_true")
    ap.add_argument("--log-level", default="warn", help="parsnip's log_level (its log: OUT/parsnip-<mode>.log)")
    ap.add_argument("--out", type=Path, default=REPO / "target" / "pdo-suite")
    ap.add_argument("tests", nargs="*", help=f"test files or directories under --src (default {TESTS})")
    a = ap.parse_args()
    modes = a.modes.split(",")
    src = a.src.resolve()
    a.out = a.out.resolve()
    a.out.mkdir(parents=True, exist_ok=True)
    stats = {}
    try:
        if not (src / "run-tests.php").exists() or not (src / TESTS).is_dir():
            raise HarnessError(f"{src} has no run-tests.php and {TESTS}")
        version = php_version(a.php)
        attr = None if a.native_prepares else emulate_attr(a.php)
        log(f"PHP {version}; PDO_PGSQL_TEST_ATTR={attr or '(unset)'}")
        binary = None if modes == ["direct"] else parsnip_release(build=not a.no_build)
        pg = started_cluster(a.pg_bin, "pdo suite")
        results = {}
        for mode in modes:
            db = f"pdo_test_{mode.replace('-', '_')}"
            pg.psql(f"CREATE DATABASE {db}")
            if mode == "direct":
                run_suite(a.php, src, f"pgsql:host=127.0.0.1 port={pg.port} dbname={db} user=postgres", attr,
                          a.out, mode, a.tests)
            else:
                proc, port = start_parsnip(binary, pg.port, db, mode, a.out, pool_size=20, max_client_conn=500, log_level=a.log_level)
                try:
                    run_suite(a.php, src, f"pgsql:host=127.0.0.1 port={port} dbname={db} user=postgres", attr,
                              a.out, mode, a.tests)
                    stats[mode] = console(pg, port, "SHOW PREPARED_STATEMENTS")
                finally:
                    stop_process(proc)
            results[mode] = outcomes(a.out / f"{mode}.txt", src)
    except HarnessError as e:
        log(f"error: {e}")
        return 2
    finally:
        CLEANUPS.run()
    known = read_known(KNOWN)
    print(f"pdo-suite: PHP {version}, {pg.version}, "
          f"{'native prepares' if a.native_prepares else 'emulated prepares (PDO_PGSQL_TEST_ATTR)'}")
    status = 0
    for mode, res in results.items():
        counts = {k: sum(1 for v in res.values() if v == k) for k in ("PASSED", "FAILED", "SKIPPED")}
        other = len(res) - sum(counts.values())
        print(f"pdo-suite {mode}: {counts['PASSED']} passed, {counts['FAILED']} failed, {counts['SKIPPED']} skipped"
              + (f", {other} other ({', '.join(sorted({v for v in res.values()} - set(counts)))})" if other else ""))
        for row in stats.get(mode, []):
            print("  SHOW PREPARED_STATEMENTS: " + ", ".join(f"{k}={v}" for k, v in row.items()))
        if mode == "direct" or "direct" not in results:
            continue
        worse = sorted(t for t, v in res.items() if v not in ("PASSED", "SKIPPED") and results["direct"].get(t) == "PASSED")
        if report_worse("pdo-suite", mode, worse, known, KNOWN.name):
            status = 1
        # A test failing both ways (e.g. one whose expectations assume native prepares) still
        # says something: its output through parsnip should be the output it gave directly.
        both = sorted(t for t, v in res.items() if v == "FAILED" and results["direct"].get(t) == "FAILED")
        for t in both:
            first = first_difference(a.out, "direct", mode, t)
            if first:
                print(f"  fails both ways, output differs from direct: {t}: {first}")
    return status


if __name__ == "__main__":
    sys.exit(main())
