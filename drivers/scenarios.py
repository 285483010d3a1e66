"""The driver matrix's scenarios: finding them (every drivers/*/scenarios.json, the contract
in drivers/README.md), choosing them (--only), running each driver directory's setup once
per change of its inputs (a stamp in drivers/.cache), and asking a driver its version.
drivers/run.py runs them; nothing here starts PostgreSQL or parsnip."""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import subprocess
import time
from pathlib import Path

from throwaway import REPO, log, tail

DRIVERS = REPO / "drivers"
CACHE = DRIVERS / ".cache"
DEFAULT_TIMEOUT_S = 120


@dataclasses.dataclass
class Scenario:
    name: str
    driver: str
    dir: Path
    version_cmd: list[str]
    setup: list[list[str]]
    run: list[str]
    timeout_s: float
    setup_inputs: list[str] = dataclasses.field(default_factory=list)
    # A parsnip failure already understood and written down (docs/design.md "Known gaps"):
    # reported as KNOWN, not counted as failed. Direct failures always count.
    known_issue: str = ""
    # Extra lines for parsnip's configuration in this scenario's parsnip run (an opt-in
    # feature judged by a driver that already runs elsewhere in the matrix without it).
    parsnip_config: list[str] = dataclasses.field(default_factory=list)

    @property
    def mode(self) -> str:
        for p in (self.driver + "-", self.driver + "_", self.dir.name + "-", self.dir.name + "_"):
            if self.name.startswith(p):
                return self.name[len(p):]
        return self.name if self.name != self.driver else "default"


def discover() -> tuple[list[Scenario], list[str]]:
    """Every scenario of every drivers/*/scenarios.json, and the problems found reading them."""
    found, problems = [], []
    for f in sorted(DRIVERS.glob("*/scenarios.json")):
        try:
            entries = json.loads(f.read_text())
            for e in entries:
                found.append(Scenario(
                    name=e["name"], driver=e.get("driver", f.parent.name), dir=f.parent,
                    version_cmd=list(e.get("version_cmd") or []), setup=[list(c) for c in e.get("setup") or []],
                    run=list(e["run"]), timeout_s=float(e.get("timeout_s", DEFAULT_TIMEOUT_S)),
                    setup_inputs=[str(x) for x in e.get("setup_inputs") or []],
                    known_issue=str(e.get("known_issue", "")),
                    parsnip_config=[str(x) for x in e.get("parsnip_config") or []],
                ))
        except (ValueError, KeyError, TypeError) as e:
            problems.append(f"{f.relative_to(REPO)}: {type(e).__name__}: {e}")
    names = [s.name for s in found]
    for n in sorted({n for n in names if names.count(n) > 1}):
        problems.append(f"scenario name {n!r} is used more than once")
    return found, problems


def selected(s: Scenario, only: list[str]) -> bool:
    return not only or any(s.name.startswith(p) or s.driver.startswith(p) or s.dir.name.startswith(p) for p in only)


def input_hash(d: Path, setup: list[list[str]], inputs: list[str] | None) -> str:
    """What setup depends on: its commands and the files named by `setup_inputs`, or, when
    no scenario names any, every file of the driver directory that git does not ignore
    (so build outputs don't count)."""
    h = hashlib.sha256(json.dumps(setup).encode())
    r = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z", "--", *(inputs or ["."])], cwd=d,
                       capture_output=True)
    if r.returncode == 0:
        files = sorted(set(p for p in r.stdout.decode().split("\0") if p) | set(inputs or []))
    else:
        files = sorted(inputs or (str(p.relative_to(d)) for p in d.rglob("*") if p.is_file()))
    for rel in files:
        p = d / rel
        if p.is_file():
            h.update(rel.encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def outputs_present(d: Path, scenarios: list[Scenario]) -> bool:
    """Whether the paths the run commands name (arguments with a '/', relative to the
    driver directory) exist: a deleted venv or build output makes setup run again."""
    for s in scenarios:
        for arg in s.run:
            if "/" in arg and not arg.startswith("-") and not (d / arg).exists():
                return False
    return True


def run_setup(d: Path, scenarios: list[Scenario], skip: bool) -> tuple[bool, str, float]:
    """Runs the directory's setup commands once (the union of its scenarios', in order),
    unless done before with the same inputs. (ok, note, seconds)."""
    cmds: list[list[str]] = []
    for s in scenarios:
        for c in s.setup:
            if c not in cmds:
                cmds.append(c)
    if skip or not cmds:
        return True, "skipped" if skip else "nothing to do", 0.0
    stamp = CACHE / f"{d.name}.setup.json"
    inputs = sorted({i for s in scenarios for i in s.setup_inputs})
    digest = input_hash(d, cmds, inputs or None)
    try:
        if json.loads(stamp.read_text()).get("hash") == digest and outputs_present(d, scenarios):
            return True, "cached (inputs unchanged)", 0.0
    except (OSError, ValueError):
        pass
    t0 = time.monotonic()
    logf = CACHE / f"{d.name}.setup.log"
    CACHE.mkdir(exist_ok=True)
    with open(logf, "w") as f:
        for c in cmds:
            log(f"setup {d.relative_to(REPO)}: {' '.join(c)}")
            f.write(f"$ {' '.join(c)}\n")
            f.flush()
            try:
                r = subprocess.run(c, cwd=d, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   timeout=1800)
            except (OSError, subprocess.TimeoutExpired) as e:
                return False, f"`{' '.join(c)}`: {e}", time.monotonic() - t0
            if r.returncode != 0:
                return False, f"`{' '.join(c)}` exited {r.returncode}: {tail(logf, 3)}", time.monotonic() - t0
    stamp.write_text(json.dumps({"hash": digest, "at": datetime.datetime.now().isoformat(timespec="seconds")}))
    return True, "installed", time.monotonic() - t0


_versions: dict = {}


def driver_version(s: Scenario) -> str:
    if not s.version_cmd:
        return "?"
    key = (str(s.dir), tuple(s.version_cmd))
    if key not in _versions:
        try:
            r = subprocess.run(s.version_cmd, cwd=s.dir, capture_output=True, text=True, timeout=120)
            lines = (r.stdout.strip() or r.stderr.strip()).splitlines()
            _versions[key] = lines[0].strip() if r.returncode == 0 and lines else "?"
        except (OSError, subprocess.TimeoutExpired):
            _versions[key] = "?"
    return _versions[key]
