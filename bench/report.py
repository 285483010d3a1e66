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

from systems import ALL_SYSTEMS

@dataclasses.dataclass
class Case:
    pool: int
    mode: str
    clients: int
    latency: bool = False  # the one-client latency case

    @property
    def label(self) -> str:
        return f"latency -c 1 -M {self.mode}" if self.latency else f"-S -M {self.mode}"


@dataclasses.dataclass
class Run:
    system: str
    pool: int
    mode: str
    clients: int
    latency_case: bool
    round: int
    ok: bool = False
    error: str = ""
    tps: float | None = None
    latency_ms: float | None = None
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


def render_table(pool: int, cases: list[Case], runs: list[Run], args, skipped: dict[str, str]) -> str:
    cols = ["case", "clients", "direct TPS", "parsnip TPS", "parsnip/direct", "pgbouncer TPS", "pgbouncer/direct",
            "parsnip µs CPU/txn", "pgbouncer µs CPU/txn", "latency (direct / parsnip / pgbouncer)"]
    if args.count_parses:
        cols.append("server parses per 1000 txn (direct / parsnip / pgbouncer)")
    lines = [f"#### Pool of {pool} server connections (transaction mode)", "",
             "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for case in cases:
        sel = [r for r in runs if r.pool == pool and r.mode == case.mode and r.clients == case.clients
               and r.latency_case == case.latency]
        by: dict[str, dict[int, Run]] = {s: {} for s in ALL_SYSTEMS}
        for r in sel:
            by[r.system][r.round] = r
        rounds = sorted({r.round for r in sel})

        def tps_cell(system):
            return join_rounds([fmt_tps(by[system].get(i)) for i in rounds])

        def ratio_cell(system):
            cells, nums = [], []
            for i in rounds:
                d, s = by["direct"].get(i), by[system].get(i)
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
            vals = [getattr(r, attr) for r in by[system].values() if r.ok and getattr(r, attr) is not None]
            return statistics.median(vals) if vals else None

        if case.latency:
            d = med("direct", "latency_ms")
            parts = []
            for s in ALL_SYSTEMS:
                v = med(s, "latency_ms")
                if v is None:
                    parts.append(f"{s} " + ("FAILED" if by[s] else "—"))
                elif s == "direct" or d is None:
                    parts.append(f"{s} {v * 1000:.0f} µs")
                else:
                    parts.append(f"{s} {v * 1000:.0f} µs ({(v - d) * 1000:+.0f})")
            lat = "; ".join(parts)
        else:
            vals = []
            for s in ALL_SYSTEMS:
                v = med(s, "latency_ms")
                vals.append("FAILED" if v is None and by[s] else ("—" if v is None else f"{v:.2f}"))
            lat = " / ".join(vals) + " ms"
        row = [case.label, str(case.clients), tps_cell("direct"), tps_cell("parsnip"), ratio_cell("parsnip"),
               tps_cell("pgbouncer"), ratio_cell("pgbouncer"), cpu_cell("parsnip"), cpu_cell("pgbouncer"), lat]
        if args.count_parses:
            vals = []
            for s in ALL_SYSTEMS:
                v = med(s, "parses_per_1k")
                vals.append("—" if v is None else (f"{v:.1f}" if v < 100 else f"{v:.0f}"))
            row.append(" / ".join(vals))
        lines.append("| " + " | ".join(md(c) for c in row) + " |")
    notes = []
    if len({r.round for r in runs}) > 1:
        notes.append("Comma-separated values are rounds 1, 2, …; each ratio divides a pooler's TPS by direct's "
                     "TPS of the same round. Latency and parses are medians over rounds.")
    loads = [r.other_load for r in runs if r.pool == pool and r.other_load is not None]
    if loads:
        notes.append(f"Other processes on the machine used {statistics.mean(loads):.2f} CPUs on average during "
                     f"these runs (max {max(loads):.2f}, of {len(os.sched_getaffinity(0))}).")
    for s, why in skipped.items():
        notes.append(f"{s} not measured: {why}.")
    if args.count_parses:
        notes.append("Run with --count-parses: log_parser_stats was on during every run, which costs throughput.")
    if notes:
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
