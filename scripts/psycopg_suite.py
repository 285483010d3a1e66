#!/usr/bin/env python3
"""psycopg 3's own test suite as a judge of parsnip: run directly against a throwaway
PostgreSQL and through parsnip (session and transaction pooling), and report every test
that passes directly but fails through parsnip.

    python3 scripts/psycopg_suite.py --src PSYCOPG_CHECKOUT [--modes direct,session,transaction]
        [--pg-bin DIR] [--no-build] [--out DIR] [-k EXPR] [-m MARKS]

PSYCOPG_CHECKOUT is a checkout of https://github.com/psycopg/psycopg (its tests are not in
the PyPI packages). The suite reads its DSN from PSYCOPG_TEST_DSN; psycopg is installed from
the checkout into a venv beside it (SRC/.parsnip-venv). Type-checking (test_typing), the
pool package and CockroachDB tests are left out. Results: OUT/<mode>.xml (JUnit) and a
summary on stdout; exit 1 if a test passing directly fails through parsnip and is not in
scripts/psycopg_suite_known.txt (each line: mode, test id, reason), listed with reasons in
docs/psycopg-suite.md.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from throwaway import (  # noqa: E402
    CLEANUPS, REPO, HarnessError, log, parsnip_env, parsnip_release, read_known, report_worse, start_parsnip,
    started_cluster, stop_process,
)

KNOWN = REPO / "scripts" / "psycopg_suite_known.txt"
IGNORED = ["tests/test_typing.py", "tests/pool", "tests/crdb"]


def venv(src: Path) -> Path:
    v = src / ".parsnip-venv"
    py = v / "bin" / "python"
    if not py.exists():
        log(f"venv {v}")
        subprocess.run([sys.executable, "-m", "venv", str(v)], check=True)
    # Not editable: the checkout's psycopg/ directory would shadow the package.
    log("pip install psycopg[test] from the checkout")
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", f"{src / 'psycopg'}[test]"],
                   check=True)
    return py


def run_suite(py: Path, src: Path, dsn: str, xml: Path, k: str | None, marks: str) -> None:
    # A cache of its own per run: the suite keeps a crash flag there.
    cmd = [str(py), "-m", "pytest", "-q", "-p", "no:randomly", "-o", "addopts=", "-o",
           f"cache_dir={xml.with_suffix('.cache')}", f"--junitxml={xml}"]
    cmd += [f"--ignore={i}" for i in IGNORED]
    if k:
        cmd += ["-k", k]
    if marks:
        cmd += ["-m", marks]
    cmd.append("tests")
    log(f"pytest ({dsn})")
    env = {**parsnip_env(), "PSYCOPG_TEST_DSN": dsn}
    r = subprocess.run(cmd, cwd=src, env=env, capture_output=True, text=True)
    lines = r.stdout.strip().splitlines()
    log(lines[-1] if lines else f"pytest exited {r.returncode}: {r.stderr[-500:]}")


def outcomes(xml: Path) -> dict[str, str]:
    if not xml.exists():
        raise HarnessError(f"pytest wrote no {xml}")
    out = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        tid = f"{case.get('classname')}::{case.get('name')}"
        kinds = {c.tag for c in case}
        out[tid] = ("failed" if kinds & {"failure", "error"} else "skipped" if "skipped" in kinds else "passed")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", required=True, type=Path)
    ap.add_argument("--modes", default="direct,session,transaction",
                    help="of direct, session, transaction (autoprepare at its default: on), transaction-autoprepare "
                         "(autoprepare_after = 1), transaction-noautoprepare (autoprepare = false)")
    ap.add_argument("--pg-bin")
    ap.add_argument("--no-build", action="store_true")
    ap.add_argument("--out", type=Path, default=REPO / "target" / "psycopg-suite")
    ap.add_argument("-k")
    ap.add_argument("-m", dest="marks", default="not slow and not flakey",
                    help="pytest marker expression (default: 'not slow and not flakey': leak and stress tests take most "
                         "of an hour on 2 cores; psycopg marks its flakey ones itself)")
    a = ap.parse_args()
    modes = a.modes.split(",")
    a.out.mkdir(parents=True, exist_ok=True)
    try:
        py = venv(a.src.resolve())
        binary = None if modes == ["direct"] else parsnip_release(build=not a.no_build)
        pg = started_cluster(a.pg_bin, "psycopg suite", {"max_connections": "300", "max_prepared_transactions": "10"})
        results = {}
        for mode in modes:
            db = f"psycopg_test_{mode.replace('-', '_')}"
            pg.psql(f"CREATE DATABASE {db}")
            xml = a.out / f"{mode}.xml"
            if mode == "direct":
                run_suite(py, a.src, f"host=127.0.0.1 port={pg.port} user=postgres dbname={db}", xml, a.k, a.marks)
            else:
                proc, port = start_parsnip(binary, pg.port, db, mode, a.out, pool_size=60, max_client_conn=2000)
                try:
                    run_suite(py, a.src, f"host=127.0.0.1 port={port} user=postgres dbname={db}", xml, a.k, a.marks)
                finally:
                    stop_process(proc)
            results[mode] = outcomes(xml)
    except HarnessError as e:
        log(f"error: {e}")
        return 2
    finally:
        CLEANUPS.run()
    known = read_known(KNOWN)
    status = 0
    for mode, res in results.items():
        counts = {k: sum(1 for v in res.values() if v == k) for k in ("passed", "failed", "skipped")}
        print(f"psycopg-suite {mode}: {counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped")
        if mode == "direct" or "direct" not in results:
            continue
        worse = sorted(t for t, v in res.items() if v == "failed" and results["direct"].get(t) == "passed")
        if report_worse("psycopg-suite", mode, worse, known, KNOWN.name):
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
