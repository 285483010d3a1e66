"""Throwaway PostgreSQL clusters and the child processes around them, for the Python
harnesses: bench/run.py, drivers/run.py and bench/idle_memory.py import this one module
instead of each keeping its own copy.

What it owns: finding PostgreSQL's binaries (the same order as parsnip's embedded mode,
src/embedded/sys.rs `find_bin_dir`), picking free ports, waiting for a listener, starting
and stopping child processes (each in its own process group, stopped by pid, never by
name), an initdb'd cluster with trust auth on 127.0.0.1 and its own socket directory, the
OS user to run PostgreSQL as when we are root, and building parsnip's release binary.
What it must not do: decide anything a harness measures or checks.

Python 3.11 standard library only.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
START = time.monotonic()


def log(msg: str) -> None:
    """A progress line on stderr, stamped with seconds since the harness started."""
    print(f"[{time.monotonic() - START:7.1f}s] {msg}", file=sys.stderr, flush=True)


class HarnessError(Exception):
    """Something the harness needs is missing or broke (not a test or benchmark result)."""


# --------------------------------------------------------------------------- processes


class Cleanups:
    """Every child process and temp dir a harness owns, torn down in reverse order."""

    def __init__(self) -> None:
        self._steps: list = []

    def push(self, fn) -> None:
        self._steps.append(fn)

    def remove(self, fn) -> None:
        if fn in self._steps:
            self._steps.remove(fn)

    def run(self) -> None:
        while self._steps:
            fn = self._steps.pop()
            try:
                fn()
            except Exception as e:  # keep tearing down the rest
                print(f"cleanup step failed: {e}", file=sys.stderr)


CLEANUPS = Cleanups()


def stop_process(p: subprocess.Popen, first=signal.SIGTERM, grace: float = 10.0) -> None:
    """Stops one child we started, by its pid: `first`, then SIGKILL after `grace` seconds."""
    if p.poll() is not None:
        return
    try:
        p.send_signal(first)
        p.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait(timeout=10)
    except ProcessLookupError:
        pass


def run_bounded(argv: list[str], timeout: float, env: dict[str, str] | None = None):
    """Runs a client program to its end within `timeout` seconds, stopped at the harness's
    exit meanwhile (CLEANUPS): (returncode, stdout, stderr), or None when it hung (then
    stopped)."""
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, process_group=0, env=env)
    kill = lambda: stop_process(p, signal.SIGTERM, grace=2)  # noqa: E731
    CLEANUPS.push(kill)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop_process(p, signal.SIGTERM, grace=2)
        p.communicate()
        return None
    finally:
        CLEANUPS.remove(kill)
    return p.returncode, out, err


def kill_group(p: subprocess.Popen) -> None:
    """Kills the process group of a child started with start_new_session (its own group)."""
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        p.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(port: int, proc: subprocess.Popen, timeout: float = 30.0, sockdir: Path | None = None) -> None:
    """Returns once `proc` accepts connections on 127.0.0.1:port (or, with sockdir, on the
    unix socket sockdir/.s.PGSQL.port); raises if it exits first or the time runs out."""
    where = f"{sockdir}/.s.PGSQL.{port}" if sockdir else f"127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise HarnessError(f"exited with code {proc.returncode} before listening")
        try:
            if sockdir:
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                    s.settimeout(0.5)
                    s.connect(where)
            else:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    pass
            return
        except OSError:
            time.sleep(0.05)  # polling a listener that is still starting, not synchronising a test
    raise HarnessError(f"not listening on {where} after {timeout:.0f}s")


def tail(path: Path, n: int = 5) -> str:
    """The last `n` lines of a log file ('' when it cannot be read)."""
    try:
        lines = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-n:])


def rss_kib(pid: int) -> int:
    """Resident memory of a process, KiB (VmRSS)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def apt_install(*pkgs: str) -> bool:
    """apt-get install -y PKGS as root (running `apt-get update` once if the first attempt fails)."""
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        return False
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for attempt in range(2):
        log(f"apt-get install -y {' '.join(pkgs)}")
        r = subprocess.run(["apt-get", "install", "-y", "-q", *pkgs], env=env, capture_output=True, text=True)
        if r.returncode == 0:
            return True
        if attempt == 0:
            log("apt-get install failed; running apt-get update")
            subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True)
    log(f"apt-get install {' '.join(pkgs)} failed: {(r.stderr.strip().splitlines() or ['?'])[-1]}")
    return False


def service_user() -> pwd.struct_passwd | None:
    """The unprivileged OS user to run PostgreSQL (and PgBouncer) as: None when we are not
    root, else `postgres` (or `nobody`): initdb refuses to run as root."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    raise HarnessError("running as root and neither a 'postgres' nor a 'nobody' user exists")


def as_user(user: pwd.struct_passwd | None) -> dict:
    """subprocess keyword arguments that run a child as `user` (none for ourselves)."""
    return {} if user is None else {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}


# --------------------------------------------------------------------------- PostgreSQL binaries

SERVER_PROGRAMS = ("initdb", "postgres", "pg_ctl")


def _version_key(d: Path) -> tuple:
    return tuple(int(x) for x in re.findall(r"\d+", d.parent.name)) or (0,)


def pg_bindir_candidates(explicit: str | None = None):
    """Where PostgreSQL's binaries may be, in parsnip's order (src/embedded/sys.rs
    `find_bin_dir`): an explicit directory, else $PARSNIP_PG_BIN, else `pg_config --bindir`,
    else the highest /usr/lib/postgresql/*/bin, else the directory of `initdb` on $PATH."""
    if explicit:
        yield Path(explicit)
        return
    env = os.environ.get("PARSNIP_PG_BIN")
    if env:
        yield Path(env)
        return
    if shutil.which("pg_config"):
        r = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True)
        if r.returncode == 0 and r.stdout.strip():
            yield Path(r.stdout.strip())
    yield from sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=_version_key, reverse=True)
    initdb = shutil.which("initdb")
    if initdb:
        yield Path(initdb).resolve().parent


def find_pg_bindir(explicit: str | None = None, need: tuple[str, ...] = (), install: bool = False) -> Path:
    """The first candidate directory holding the server programs and every program in `need`
    (e.g. pgbench, psql); with `install`, as root on Debian, apt-get installs PostgreSQL when
    none does."""
    wanted = SERVER_PROGRAMS + tuple(need)
    for d in pg_bindir_candidates(explicit):
        if all((d / p).is_file() for p in wanted):
            return d
    if install and not explicit and not os.environ.get("PARSNIP_PG_BIN") and apt_install("postgresql"):
        return find_pg_bindir(None, need, install=False)
    where = explicit or os.environ.get("PARSNIP_PG_BIN") or "pg_config --bindir, /usr/lib/postgresql/*/bin, PATH"
    raise HarnessError(f"PostgreSQL binaries ({', '.join(wanted)}) not found in {where}; install `postgresql`")


def pg_version(bindir: Path) -> str:
    """'PostgreSQL 15.14' for the server in `bindir`."""
    r = subprocess.run([str(bindir / "postgres"), "--version"], capture_output=True, text=True)
    return r.stdout.strip().replace("postgres (PostgreSQL) ", "PostgreSQL ")


# --------------------------------------------------------------------------- a cluster


class Postgres:
    """A throwaway cluster in `tmp`: initdb with trust auth for `db_user`, 127.0.0.1 and its
    own socket directory on a free port, durability off (fsync, synchronous_commit,
    full_page_writes), `settings` appended to postgresql.conf (there, not on the command
    line, so that ALTER SYSTEM can still change them). Its log is tmp/postgres.log; `psql`
    gives up after `psql_timeout` seconds (None: never)."""

    def __init__(self, bindir: Path, tmp: Path, user: pwd.struct_passwd | None, db_user: str = "postgres",
                 settings: dict[str, str] | None = None, label: str = "parsnip harness",
                 psql_timeout: float | None = None) -> None:
        self.bindir, self.tmp, self.user, self.db_user = bindir, tmp, user, db_user
        self.psql_timeout = psql_timeout
        self.settings = settings or {}
        self.label = label
        self.data = tmp / "pgdata"
        self.sock = tmp / "pgsock"
        self.log_path = tmp / "postgres.log"
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.version = pg_version(bindir)

    def bin(self, name: str) -> str:
        return str(self.bindir / name)

    def start(self) -> None:
        self.sock.mkdir()
        if self.user:
            os.chown(self.sock, self.user.pw_uid, self.user.pw_gid)
        log(f"initdb ({self.version}) in {self.data}")
        r = subprocess.run(
            [self.bin("initdb"), "-D", str(self.data), "-A", "trust", "-U", self.db_user, "-E", "UTF8", "--no-sync"],
            cwd=self.tmp, capture_output=True, text=True, **as_user(self.user),
        )
        if r.returncode != 0:
            raise HarnessError(f"initdb failed: {r.stderr.strip() or r.stdout.strip()}")
        conf = {
            "port": str(self.port),
            "listen_addresses": "'127.0.0.1'",
            "unix_socket_directories": f"'{self.sock}'",
            "fsync": "off",
            "synchronous_commit": "off",
            "full_page_writes": "off",
            "max_connections": "400",
            "logging_collector": "off",
            **self.settings,
        }
        with open(self.data / "postgresql.conf", "a") as f:
            f.write(f"\n# {self.label}\n" + "".join(f"{k} = {v}\n" for k, v in conf.items()))
        logf = open(self.log_path, "ab")
        # A process group of its own (a Ctrl-C at the terminal reaches the harness, which
        # stops it in order), but the harness's session: with the kernel's autogroup
        # scheduling (Linux's default) each session is one scheduling group, and a server in
        # a session of its own got the share of one group against the poolers' and clients'
        # together, leaving a backend runnable but unscheduled for up to 1.7 s now and then
        # (docs/benchmarks.md, "The `-S` fairness tail").
        self.proc = subprocess.Popen(
            [self.bin("postgres"), "-D", str(self.data)], cwd=self.tmp, stdin=subprocess.DEVNULL,
            stdout=logf, stderr=subprocess.STDOUT, process_group=0, **as_user(self.user),
        )
        logf.close()
        CLEANUPS.push(self.stop)
        deadline = time.monotonic() + 60
        while True:
            if self.proc.poll() is not None:
                raise HarnessError(f"postgres exited ({self.proc.returncode}):\n{tail(self.log_path)}")
            r = subprocess.run(
                [self.bin("pg_isready"), "-q", "-h", "127.0.0.1", "-p", str(self.port), "-U", self.db_user],
                capture_output=True,
            )
            if r.returncode == 0:
                break
            if time.monotonic() > deadline:
                raise HarnessError(f"postgres not ready after 60s:\n{tail(self.log_path)}")
            time.sleep(0.2)  # polling a starting server
        log(f"PostgreSQL ready on 127.0.0.1:{self.port}")

    def psql(self, sql: str, db: str = "postgres", port: int | None = None) -> str:
        """Runs `sql` with psql (unaligned, tuples only, tab-separated, stop on error) and
        returns its output; `port` points it at a pooler instead."""
        r = subprocess.run(
            [self.bin("psql"), "-X", "-A", "-t", "-q", "-F", "\t", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1",
             "-p", str(port or self.port), "-U", self.db_user, "-d", db, "-c", sql],
            capture_output=True, text=True, timeout=self.psql_timeout,
        )
        if r.returncode != 0:
            raise HarnessError(f"psql {sql!r}: {r.stderr.strip()}")
        return r.stdout.strip()

    def psql_rows(self, sql: str, db: str = "postgres", port: int | None = None) -> list[list[str]]:
        """Like psql, split into rows of columns."""
        return [line.split("\t") for line in self.psql(sql, db, port).splitlines() if line]

    def log_size(self) -> int:
        return self.log_path.stat().st_size

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc, signal.SIGINT, grace=20)  # fast shutdown
            CLEANUPS.remove(self.stop)
            self.proc = None


# --------------------------------------------------------------------------- parsnip


def cargo_release(target: list[str]) -> None:
    """`cargo build --release` of `target` (e.g. ["--bin", "parsnip"]); HarnessError with
    cargo's first error when it fails."""
    cmd = ["cargo", "build", "--release", *target]
    log(" ".join(cmd))
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if r.returncode != 0:
        errs = [line for line in r.stderr.splitlines() if line.startswith("error")]
        raise HarnessError(f"{' '.join(cmd)} failed: " + (errs[0] if errs else r.stderr.strip()[-300:]))


def parsnip_release(build: bool = True) -> Path:
    """target/release/parsnip, built first (cargo build --release) when `build`."""
    b = REPO / "target" / "release" / "parsnip"
    if build:
        cargo_release(["--bin", "parsnip"])
    if not b.exists():
        raise HarnessError(f"{b} does not exist (run cargo build --release)")
    return b


def parsnip_env() -> dict[str, str]:
    """The environment for a parsnip child: ours without RUST_LOG (its config sets the level)."""
    return {k: v for k, v in os.environ.items() if k != "RUST_LOG"}


def started_cluster(pg_bin: str | None, label: str, settings: dict[str, str] | None = None) -> "Postgres":
    """A throwaway PostgreSQL, started, in a temporary directory removed at exit (owned by the
    user initdb runs as, not root): the client suites' server."""
    tmp = Path(tempfile.mkdtemp(prefix=f"parsnip-{label.split()[0]}-"))
    CLEANUPS.push(lambda: shutil.rmtree(tmp, ignore_errors=True))
    user = service_user()
    if user:
        os.chown(tmp, user.pw_uid, user.pw_gid)
    pg = Postgres(find_pg_bindir(pg_bin), tmp, user, label=label, settings=settings)
    pg.start()
    return pg


def read_known(path: Path) -> dict[tuple[str, str], str]:
    """A client suite's known failures through parsnip: lines `mode<TAB>test<TAB>reason`
    ('#' starts a comment line)."""
    known = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip() and not line.startswith("#"):
                mode, test, reason = (line.split("\t") + ["", ""])[:3]
                known[(mode, test)] = reason
    return known


def report_worse(suite: str, mode: str, worse: list[str], known: dict[tuple[str, str], str], listed_in: str) -> bool:
    """Prints the tests of `mode` that pass directly and fail through parsnip, each marked
    known (with its reason) or NEW; a mode's variant ("transaction-autoprepare") shares its
    mode's known failures. True when one is not known."""
    base = mode.partition("-")[0]
    reason = {t: known.get((mode, t), known.get((base, t))) for t in worse}
    unknown = [t for t in worse if reason[t] is None]
    print(f"{suite} {mode}: {len(worse)} pass directly and fail through parsnip "
          f"({len(worse) - len(unknown)} listed in {listed_in}, {len(unknown)} not)")
    for t in worse:
        print(f"  {'NEW  ' if reason[t] is None else 'known'} {t}  {reason[t] or ''}")
    return bool(unknown)


def start_parsnip(binary: Path, pg_port: int, db: str, mode: str, work: Path, *, pool_size: int,
                  max_client_conn: int, log_level: str = "warn") -> tuple[subprocess.Popen, int]:
    """A parsnip (trust auth, TCP only) in front of database `db` of the PostgreSQL on `pg_port`,
    for the client suites. `mode` is a pool mode (autoprepare at its default: on, after 3
    sightings), `transaction-autoprepare`: transaction pooling with every simple-protocol
    data statement autoprepared from its first sighting, or `transaction-noautoprepare`:
    autoprepare off.
    Config and log go to `work`. Returns the process and its port."""
    port = free_port()
    cfg = work / f"parsnip-{mode}.toml"
    pool_mode, _, extra = mode.partition("-")
    more = {"autoprepare": "autoprepare = true\nautoprepare_after = 1\n",
            "noautoprepare": "autoprepare = false\n"}.get(extra, "")
    cfg.write_text(f'pool_mode = "{pool_mode}"\npool_size = {pool_size}\nauth_type = "trust"\n'
                   f'max_client_conn = {max_client_conn}\nlog_level = "{log_level}"\nunix_socket_dir = ""\n' + more)
    logf = open(work / f"parsnip-{mode}.log", "ab")
    proc = subprocess.Popen([str(binary), f"postgres://postgres@127.0.0.1:{pg_port}/{db}", "--listen",
                             f"127.0.0.1:{port}", "-c", str(cfg)], stdout=logf, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True, env=parsnip_env())
    logf.close()
    wait_listening(port, proc)
    return proc, port


if __name__ == "__main__":
    # `python3 scripts/throwaway.py bindir`: the directory the harnesses would use.
    if sys.argv[1:] == ["bindir"]:
        print(find_pg_bindir())
    else:
        print("usage: throwaway.py bindir", file=sys.stderr)
        sys.exit(2)
