"""The benchmark's cases, the result of each pgbench run, and the Markdown tables they are
reported in (ratios to direct PostgreSQL from one run, pooler CPU per transaction,
latency). bench/run.py fills them in."""

from __future__ import annotations

import dataclasses
import os
import platform
import re
import statistics
from pathlib import Path

from systems import DIRECT_MAX_CLIENTS, NOT_RUN

# pgbench's scripts: --workload name -> (pgbench argument, label in the tables' headings).
WORKLOADS = {
    "select": (["-S"], "pgbench -S (select-only: one primary-key SELECT per transaction)"),
    "tpcb": ([], "pgbench's default TPC-B-like script (three UPDATEs, a SELECT and an INSERT in BEGIN ... END)"),
    "planheavy": (["-f", str(Path(__file__).resolve().parent / "planheavy.sql")],
                  "bench/planheavy.sql (a plan-heavy ORM-style read: four-way join with a lateral subquery, "
                  "planning about 4x its execution)"),
}

# How a workload is named in a case's label.
LABELS = {"select": "-S", "tpcb": "TPC-B", "planheavy": "plan-heavy"}


@dataclasses.dataclass
class Case:
    pool: int
    mode: str
    clients: int
    latency: bool = False  # the one-client latency case
    workload: str = "select"

    @property
    def label(self) -> str:
        script = LABELS[self.workload]
        return f"latency -c 1 {script} -M {self.mode}" if self.latency else f"{script} -M {self.mode}"


@dataclasses.dataclass
class Run:
    system: str
    pool: int
    mode: str
    clients: int
    latency_case: bool
    round: int
    workload: str = "select"
    ok: bool = False
    error: str = ""
    tps: float | None = None
    latency_ms: float | None = None
    # Percentiles of the per-transaction latency in pgbench's log (sampled: log_samples of them).
    p50_ms: float | None = None
    p95_ms: float | None = None
    p99_ms: float | None = None
    log_samples: int | None = None
    processed: int | None = None
    failed_txns: int | None = None
    errors_logged: int = 0  # error lines pgbench printed (e.g. a failed Prepare it carried on after)
    aborted: bool = False
    pooler_cpu_s: float | None = None
    cpu_us_per_txn: float | None = None
    server_parses: int | None = None
    parses_per_1k: float | None = None
    wall_s: float | None = None
    other_load: float | None = None  # CPUs used by processes outside the benchmark during the run
    # From examples/loadgen.rs only (--client loadgen): the slowest transaction, the longest
    # interval between two transaction starts of one client (fairness), the fewest transactions
    # a client completed, loadgen's own CPU, and the pooler's RSS growth per idle client.
    client: str = "pgbench"
    max_ms: float | None = None
    max_gap_ms: float | None = None
    min_client_txns: int | None = None
    client_cpu_s: float | None = None
    idle_kib_per_client: float | None = None


def md(s: str) -> str:
    return s.replace("|", "\\|")


def fmt_tps(r: Run | None) -> str:
    if r is None:
        return "—"
    if not r.ok:
        return f"FAILED: {r.error}"
    s = f"{r.tps / 1000:.1f}k" if r.tps >= 1000 else f"{r.tps:.0f}"
    if r.failed_txns:
        s += f" ({r.failed_txns} failed)"
    if r.errors_logged:
        s += f" ({r.errors_logged} errors logged)"
    return s


def join_rounds(values: list[str]) -> str:
    if not values:
        return "—"
    if len(values) > 1 and len(set(values)) == 1 and values[0].startswith("FAILED"):
        return values[0].replace("FAILED", f"FAILED ({len(values)}/{len(values)} rounds)", 1)
    if len(set(values)) == 1 and values[0] == "—":
        return "—"
    return ", ".join(values)


def with_median(cells: list[str], nums: list[float], fmt: str) -> str:
    s = join_rounds(cells)
    if len(nums) >= 3:
        s += f" (median {format(statistics.median(nums), fmt)})"
    return s


def fmt_ms(v: float) -> str:
    return f"{v:.3f}" if v < 1 else f"{v:.2f}" if v < 10 else f"{v:.1f}"


def render_table(pool: int, workload: str, cases: list[Case], runs: list[Run], args, skipped: dict[str, str],
                 systems: list[str]) -> str:
    """One row per case and system: TPS and its ratio to direct per round, the pooler's CPU per
    transaction per round, and latency percentiles (medians over rounds)."""
    systems = [s for s in systems if s not in skipped]
    cols = ["case", "clients", "system", "TPS", "× direct", "pooler µs CPU/txn", "p50 ms", "p95 ms", "p99 ms"]
    if args.count_parses:
        cols.append("server parses per 1000 txn")
    mine = [r for r in runs if r.pool == pool and r.workload == workload]
    # Without direct (more clients than its max_connections), pooler against PgBouncer.
    vs_pgb = "pgbouncer" in systems and any(
        not any(r.system == "direct" and r.clients == c.clients and r.mode == c.mode for r in mine) for c in cases)
    if vs_pgb:
        cols.insert(5, "× pgbouncer")
    fair = any(r.max_gap_ms is not None for r in mine)
    if fair:
        cols += ["max ms", "longest wait ms", "fewest txns of a client", "pooler KiB per idle client"]
    lines = [f"#### Pool of {pool} server connections (transaction mode), {WORKLOADS[workload][1]}", "",
             "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for case in cases:
        sel = [r for r in mine if r.mode == case.mode and r.clients == case.clients and r.latency_case == case.latency]
        by: dict[str, dict[int, Run]] = {s: {} for s in systems}
        for r in sel:
            by.setdefault(r.system, {})[r.round] = r
        rounds = sorted({r.round for r in sel})

        def ratio_cell(system, base="direct"):
            cells, nums = [], []
            for i in rounds:
                d, s = by.get(base, {}).get(i), by[system].get(i)
                if s is None or d is None:
                    cells.append("—")
                elif not s.ok:
                    cells.append("FAILED")
                elif not d.ok:
                    cells.append("n/a")
                else:
                    nums.append(s.tps / d.tps)
                    cells.append(f"{s.tps / d.tps:.2f}")
            if cells and all(c == "FAILED" for c in cells):
                return "FAILED"
            return with_median(cells, nums, ".2f")

        def cpu_cell(system):
            cells, nums = [], []
            for i in rounds:
                s = by[system].get(i)
                if s is None or not s.ok or s.cpu_us_per_txn is None:
                    cells.append("—")
                else:
                    nums.append(s.cpu_us_per_txn)
                    cells.append(f"{s.cpu_us_per_txn:.1f}")
            if all(c == "—" for c in cells):
                return "—"
            return with_median(cells, nums, ".1f")

        def med(system, attr):
            vals = [getattr(r, attr) for r in by.get(system, {}).values() if r.ok and getattr(r, attr) is not None]
            return statistics.median(vals) if vals else None

        def pct_cell(system, attr):
            v = med(system, attr)
            if v is None:
                return "—"
            d = med("direct", attr)
            # With one client, what a pooler adds to each transaction's latency is the point.
            if case.clients == 1 and system != "direct" and d is not None:
                return f"{fmt_ms(v)} ({(v - d) * 1000:+.0f} µs)"
            return fmt_ms(v)

        for system in systems:
            if system == "direct" and case.clients > DIRECT_MAX_CLIENTS:
                lines.append(f"| {case.label} | {case.clients} | {system} | not run (max_connections) |"
                             + " |" * (len(cols) - 4))
                continue
            if (system, case.mode) in NOT_RUN:
                lines.append(f"| {case.label} | {case.clients} | {system} | not run (see below) |" + " |" * (len(cols) - 4))
                continue
            row = [case.label, str(case.clients), system,
                   join_rounds([fmt_tps(by[system].get(i)) for i in rounds]),
                   "" if system == "direct" else ratio_cell(system),
                   "" if system == "direct" else cpu_cell(system),
                   pct_cell(system, "p50_ms"), pct_cell(system, "p95_ms"), pct_cell(system, "p99_ms")]
            if vs_pgb:
                row.insert(5, "" if system in ("direct", "pgbouncer") else ratio_cell(system, "pgbouncer"))
            if args.count_parses:
                v = med(system, "parses_per_1k")
                row.append("—" if v is None else (f"{v:.1f}" if v < 100 else f"{v:.0f}"))
            if fair:
                for attr, f in (("max_ms", fmt_ms), ("max_gap_ms", fmt_ms), ("min_client_txns", lambda v: f"{v:.0f}"),
                                ("idle_kib_per_client", lambda v: f"{v:.2f}")):
                    v = med(system, attr)
                    row.append("—" if v is None else f(v))
            lines.append("| " + " | ".join(md(c) for c in row) + " |")
    notes = []
    if len({r.round for r in mine}) > 1:
        notes.append("Comma-separated values are rounds 1, 2, …; each ratio divides a pooler's TPS by direct's "
                     "TPS of the same round. Latency percentiles"
                     + ("" if fair else " (from pgbench's per-transaction log)")
                     + (" and parses" if args.count_parses else "") + " are medians over rounds.")
    elif not fair:
        notes.append("Latency percentiles come from pgbench's per-transaction log.")
    if fair:
        notes.append("Client: examples/loadgen.rs (its percentiles cover every transaction of the run). 'longest "
                     "wait': the longest interval between the starts of two transactions of one client (or a "
                     "window edge), over all clients; 'pooler KiB per idle client': the pooler's RSS growth from "
                     "before the clients' logins to when all of them had run one transaction and sat idle 2 s, "
                     "divided by the clients, in round 1 (a fresh pooler; bench/idle_memory.py measures it "
                     "with care).")
    if vs_pgb:
        notes.append("× pgbouncer: a parsnip system's TPS over PgBouncer's of the same round.")
    if any(c.clients == 1 for c in cases):
        notes.append("One client: a pooler's latency cells add in brackets the difference to direct's.")
    loads = [r.other_load for r in mine if r.other_load is not None]
    if loads:
        notes.append(f"Other processes on the machine used {statistics.mean(loads):.2f} CPUs on average during "
                     f"these runs (max {max(loads):.2f}, of {len(os.sched_getaffinity(0))}).")
    if "direct" in systems and any(c.clients > DIRECT_MAX_CLIENTS for c in cases):
        notes.append(f"direct not run above {DIRECT_MAX_CLIENTS} clients: the cluster's max_connections is 400.")
    for s, why in skipped.items():
        notes.append(f"{s} not measured: {why}.")
    for (s, mode), why in NOT_RUN.items():
        if s in systems and any(c.mode == mode for c in cases):
            notes.append(f"{s} not run with -M {mode}: {why}.")
    if args.count_parses:
        notes.append("Run with --count-parses: log_parser_stats was on during every run, which costs throughput.")
    lines += [""] + [f"- {md(n)}" for n in notes]
    return "\n".join(lines)


def machine_info() -> str:
    model = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kb = int(re.search(r"MemTotal:\s+(\d+)", Path("/proc/meminfo").read_text()).group(1))
        mem = f", {kb / 1024 / 1024:.0f} GiB RAM"
    except (OSError, AttributeError):
        pass
    nproc = len(os.sched_getaffinity(0))
    return f"{nproc} CPUs (nproc), {model}{mem}, Linux {platform.release()}"
