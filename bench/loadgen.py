"""The benchmark's other client: examples/loadgen.rs (issue 26), for the runs pgbench does not
serve well (1,000 and 10,000 clients; fairness; a pooler's memory with every client idle).
This module builds it and runs it once per case, returning the same figures run_pgbench
returns plus the ones only loadgen has; bench/run.py picks the client (--client)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
from throwaway import REPO, cargo_release, run_bounded  # noqa: E402
from throwaway import HarnessError as BenchError  # noqa: E402

BINARY = REPO / "target" / "release" / "examples" / "loadgen"


def loadgen_binary(build: bool) -> Path:
    """target/release/examples/loadgen, built first (cargo build --release --example loadgen)."""
    if build:
        cargo_release(["--example", "loadgen"])
    if not BINARY.exists():
        raise BenchError(f"{BINARY} does not exist (cargo build --release --example loadgen)")
    return BINARY


def run_loadgen(binary: Path, port: int, case, duration: int, jobs: int, host: str, db: str, user: str,
                scale: int, watch_pid: int | None = None, warmup: float = 0) -> dict:
    """One loadgen run of `case` (workload, mode, clients) against host:port; with watch_pid,
    that process's RSS is read before the ramp and with every client idle."""
    argv = [str(binary), "-H", host, "-p", str(port), "-U", user, "-d", db, "-c", str(case.clients),
            "-j", str(max(1, min(jobs, case.clients))), "--workload", case.workload, "-M", case.mode,
            "-T", str(duration), "-s", str(scale)]
    if warmup:
        argv += ["--warmup", f"{warmup:g}"]
    if watch_pid is not None:
        argv += ["--watch-pid", str(watch_pid)]
    timeout = duration + warmup + 60 + case.clients * 0.02
    ran = run_bounded(argv, timeout)
    if ran is None:
        return {"ok": False, "error": f"loadgen hung: no result {timeout:.0f}s after start (killed)"}
    returncode, out, err = ran
    line = next((l for l in reversed(out.splitlines()) if l.startswith("{")), "")
    try:
        got = json.loads(line)
    except json.JSONDecodeError:
        tail = (err.strip().splitlines() or ["no output"])[-1]
        return {"ok": False, "error": f"loadgen exited {returncode}: {tail[:160]}"}
    res = {k: got[k] for k in ("tps", "latency_ms", "p50_ms", "p95_ms", "p99_ms", "max_ms", "max_gap_ms",
                               "min_client_txns", "processed", "failed_txns") if got.get(k) is not None}
    if got.get("cpu_s") is not None:
        res["client_cpu_s"] = got["cpu_s"]
    if got.get("watch_idle_kib_per_client") is not None:
        res["idle_kib_per_client"] = got["watch_idle_kib_per_client"]
    res["aborted"] = bool(got.get("aborted_clients"))
    res["ok"] = bool(got.get("ok")) and returncode == 0 and res.get("processed", 0) > 0
    if res.get("processed"):
        res["log_samples"] = res["processed"]
    if not res["ok"]:
        res["error"] = str(got.get("error") or got.get("first_txn_error") or f"loadgen exited {returncode}")[:160]
    return res
