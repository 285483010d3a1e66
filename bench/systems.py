"""The systems the benchmark runs pgbench against: the throwaway PostgreSQL (with pgbench's
tables and a parse counter), parsnip and PgBouncer in front of it, where their binaries
come from, and how the CPU a pooler spends is measured from /proc. bench/run.py drives
them; nothing here decides what a run measures or how it is reported."""

from __future__ import annotations

import os
import re
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import throwaway  # noqa: E402  (scripts/throwaway.py: clusters, processes, binaries)
from throwaway import (  # noqa: E402
    REPO, apt_install, as_user, free_port, log, stop_process, tail, wait_listening,
)
from throwaway import CLEANUPS as PROCS  # noqa: E402
from throwaway import HarnessError as BenchError  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")
ALL_SYSTEMS = ("direct", "parsnip", "parsnip-base", "parsnip-noguard", "parsnip-nodefer", "parsnip-nocache", "parsnip-autoprepare",
               "parsnip-noautoprepare", "parsnip-w1", "parsnip-percore",
               "parsnip-stealing", "pgbouncer", "relay")
# relay: examples/relay.rs, a one-thread byte relay with one upstream connection per client and
# no protocol work: the CPU any proxy pays the kernel for the extra hop (the floor).
# parsnip-w1 / parsnip-percore / parsnip-stealing: parsnip with one event loop for everything
# (PARSNIP_WORKERS=1), with one loop per core (the default before it counted the cores a
# server on this machine needs: with the bench's local PostgreSQL the default is one loop per
# two cores), or with tokio's work-stealing runtime (PARSNIP_SCHEDULER=stealing): the
# threading models side by side with the default.
THREADING = {"parsnip-w1": {"PARSNIP_WORKERS": "1"}, "parsnip-percore": {"PARSNIP_WORKERS": str(os.cpu_count() or 1)},
             "parsnip-stealing": {"PARSNIP_SCHEDULER": "stealing"}}
# parsnip-nocache: parsnip with its statement cache off, to show what the cache costs and saves.
# parsnip-autoprepare: parsnip with `autoprepare = true` (simple-protocol queries from cached
# statements; the default since issue 24, kept so older commands run);
# parsnip-noautoprepare: with `autoprepare = false`, to show what autoprepare gives.
AUTOPREPARE = "autoprepare = true"
NOAUTOPREPARE = "autoprepare = false"
# parsnip-noguard: parsnip with `plan_guard = false`, to show what the guard's sampling costs.
NOGUARD = "plan_guard = false"
# parsnip-nodefer: parsnip with `defer_begin = false`, to show what answering a lone BEGIN gives.
NODEFER = "defer_begin = false"

DEFAULT_SYSTEMS = ("direct", "parsnip", "pgbouncer")
NOCACHE = "prepared_statements = false"
# (system, pgbench -M mode) pairs that cannot work, so are not run: without the cache, pgbench's
# statement names collide on shared server connections ("prepared statement P_0 already exists").
NOT_RUN = {("parsnip-nocache", "prepared"): "-M prepared needs the statement cache (pgbench's statement "
           "names collide on shared server connections without it)"}
# Direct PostgreSQL runs only cases with at most this many clients: the cluster's max_connections
# is 400 (scripts/throwaway.py), less superuser_reserved_connections and the harness's own.
DIRECT_MAX_CLIENTS = 390
ALL_MODES = ("simple", "extended", "prepared")
DB = "bench"
DB_USER = "postgres"
# "tcp" (127.0.0.1) or "unix" (sockets in each system's own directory); set from --unix.
TRANSPORT = {"unix": False, "server_unix": False, "tls": None, "connect": False}
# With --tls: TRANSPORT["tls"] = (certificate file, key file); pgbench connects with
# sslmode=require, PostgreSQL has ssl = on, and the poolers require TLS from clients and use
# it to PostgreSQL (over TCP).

# --------------------------------------------------------------------------- processes


def cpu_ticks(pid: int) -> int | None:
    """utime + stime (clock ticks, all threads) of a process, from /proc/PID/stat."""
    try:
        data = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = data[data.rindex(")") + 2 :].split()
    return int(fields[11]) + int(fields[12])  # fields 14 and 15 of the full line


def machine_busy_s() -> float:
    """CPU seconds all CPUs of the machine spent busy (user, nice, system, irq, softirq, steal)."""
    f = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in f[:8])
    return (user + nice + system + irq + softirq + steal) / CLK_TCK


def process_tree_s(root: int) -> float:
    """CPU seconds of `root` (with its reaped children) plus its live children."""
    total = 0.0
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            data = Path(f"/proc/{d}/stat").read_text()
        except OSError:
            continue
        f = data[data.rindex(")") + 2 :].split()
        pid, ppid = int(d), int(f[1])
        if pid == root:
            total += sum(int(x) for x in f[11:15]) / CLK_TCK  # utime stime cutime cstime
        elif ppid == root:
            total += (int(f[11]) + int(f[12])) / CLK_TCK
    return total


def own_children_s() -> float:
    """CPU seconds of this script and the children it has waited for (pgbench, psql)."""
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


# --------------------------------------------------------------------------- PostgreSQL


class Postgres(throwaway.Postgres):
    """The benchmark's cluster (scripts/throwaway.py's, with 256MB of shared buffers), plus
    pgbench's tables and counting the server's parses from its log."""

    def __init__(self, bindir: Path, tmp: Path, user) -> None:
        super().__init__(bindir, tmp, user, DB_USER, label="parsnip bench", settings={
            "shared_buffers": "256MB",
            "log_parser_stats": "off",
        })

    def init_pgbench(self, scale: int) -> None:
        self.psql(f"CREATE DATABASE {DB}")
        log(f"pgbench -i -s {scale}")
        r = subprocess.run(
            [self.bin("pgbench"), "-i", "-q", "-s", str(scale), "-h", "127.0.0.1", "-p", str(self.port),
             "-U", DB_USER, DB],
            capture_output=True,
            text=True,
        )
        if r.returncode != 0:
            raise BenchError(f"pgbench -i failed: {r.stderr.strip()}")
        self.psql("CHECKPOINT", DB)

    def set_parser_stats(self, on: bool) -> None:
        if on:
            self.psql("ALTER SYSTEM SET log_parser_stats = on")
        else:
            self.psql("ALTER SYSTEM RESET log_parser_stats")
        self.psql("SELECT pg_reload_conf()")

    def count_parses(self, start: int, end: int) -> int:
        """'PARSER STATISTICS' lines the server logged between two byte offsets of its log."""
        n = 0
        with open(self.log_path, "rb") as f:
            f.seek(start)
            remaining = end - start
            while remaining > 0:
                line = f.readline(min(remaining, 1 << 20))
                if not line:
                    break
                remaining -= len(line)
                if b"PARSER STATISTICS" in line:
                    n += 1
        return n

    def trim_log(self) -> None:
        """Drops the (huge) stats output once counted; postgres appends, so truncation is safe."""
        if self.log_size() > 64 << 20:
            os.truncate(self.log_path, 0)


# --------------------------------------------------------------------------- poolers


class Pooler:
    name = "?"
    # Clients it accepts (bench/idle_memory.py raises it).
    max_clients = 2000

    def __init__(self, pg: Postgres, tmp: Path, pool_size: int) -> None:
        self.pg = pg
        self.tmp = tmp
        self.pool_size = pool_size
        self.port = 0
        self.proc: subprocess.Popen | None = None
        self.log_path = tmp / f"{self.name}.log"
        # With --unix: the directory of this pooler's listening socket (pgbench -h takes it).
        self.sockdir: Path | None = tmp / f"{self.name}-sock" if TRANSPORT["unix"] else None

    def host(self) -> str:
        return str(self.sockdir) if self.sockdir else "127.0.0.1"

    def command(self) -> tuple[list[str], dict]:
        raise NotImplementedError

    def start(self) -> None:
        self.port = free_port()
        if self.sockdir:
            self.sockdir.mkdir(exist_ok=True)
            if getattr(self, "user", None):
                os.chown(self.sockdir, self.user.pw_uid, self.user.pw_gid)
        argv, kwargs = self.command()
        logf = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT, process_group=0,
            cwd=self.tmp, **kwargs
        )
        logf.close()
        PROCS.push(self.stop)
        try:
            wait_listening(self.port, self.proc, sockdir=self.sockdir)
        except BenchError as e:
            self.stop()
            last = tail(self.log_path, 3)
            raise BenchError(f"{self.name} {e}" + (f": {last}" if last else "")) from None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def death_note(self) -> str:
        code = self.proc.returncode if self.proc else None
        last = tail(self.log_path, 1).strip()
        return f"{self.name} exited with code {code}" + (f": {last}" if last else "")

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc, signal.SIGINT, grace=5)
            PROCS.remove(self.stop)
            self.proc = None


class Parsnip(Pooler):
    name = "parsnip"

    def __init__(self, pg, tmp, pool_size, binary: Path, extra_config: list[str], name: str = "parsnip") -> None:
        self.name = name  # before Pooler.__init__: it names the log and socket directory
        super().__init__(pg, tmp, pool_size)
        self.binary = binary
        self.extra_config = extra_config
        if name == "parsnip-nocache":
            keep = [l for l in extra_config if not l.strip().startswith("prepared_statements")]
            self.extra_config = keep + [NOCACHE]
        if name in ("parsnip-autoprepare", "parsnip-noautoprepare"):
            keep = [l for l in extra_config if not l.strip().startswith("autoprepare ")]
            self.extra_config = keep + [AUTOPREPARE if name == "parsnip-autoprepare" else NOAUTOPREPARE]
        if name == "parsnip-noguard":
            keep = [l for l in extra_config if not l.strip().startswith("plan_guard ")]
            self.extra_config = keep + [NOGUARD]
        if name == "parsnip-nodefer":
            keep = [l for l in extra_config if not l.strip().startswith("defer_begin ")]
            self.extra_config = keep + [NODEFER]

    def command(self):
        cfg = self.tmp / f"{self.name}.toml"
        cfg.write_text('log_level = "warn"\nauth_type = "trust"\n' + "".join(f"{l}\n" for l in self.extra_config))
        env = {k: v for k, v in os.environ.items() if k != "RUST_LOG"}
        env.update(THREADING.get(self.name, {}))
        tls = TRANSPORT["tls"]
        if self.sockdir or TRANSPORT["server_unix"]:
            url = f"postgres://{DB_USER}@:{self.pg.port}/{DB}?host={self.pg.sock}"
        else:
            url = f"postgres://{DB_USER}@127.0.0.1:{self.pg.port}/{DB}" + ("?sslmode=require" if tls else "")
        if tls:
            cfg.write_text(cfg.read_text() + f'client_tls_cert_file = "{tls[0]}"\nclient_tls_key_file = "{tls[1]}"\n'
                           'client_tls_sslmode = "require"\n')
        listen = f"{self.sockdir}/.s.PGSQL.{self.port}" if self.sockdir else f"127.0.0.1:{self.port}"
        return (
            [str(self.binary), url, "--listen", listen, "--pool-size", str(self.pool_size),
             "--pool-mode", "transaction", "--max-client-conn", str(self.max_clients), "-c", str(cfg)],
            {"env": env},
        )


class Relay(Pooler):
    name = "relay"

    def __init__(self, pg, tmp, pool_size, binary: Path) -> None:
        super().__init__(pg, tmp, pool_size)
        self.binary = binary

    def command(self):
        if self.sockdir:
            raise BenchError("relay listens on TCP only (no --unix)")
        up = f"{self.pg.sock}/.s.PGSQL.{self.pg.port}" if TRANSPORT["server_unix"] else f"127.0.0.1:{self.pg.port}"
        if TRANSPORT["tls"]:
            raise BenchError("relay does not speak TLS")
        return [str(self.binary), f"127.0.0.1:{self.port}", up], {}


class PgBouncer(Pooler):
    name = "pgbouncer"

    def __init__(self, pg, tmp, pool_size, binary: Path, user, version: str = "") -> None:
        super().__init__(pg, tmp, pool_size)
        self.binary = binary
        self.user = user
        # PgBouncer 1.21 on caches prepared statements (max_prepared_statements); older
        # ones refuse the key.
        m = re.search(r"(\d+)\.(\d+)", version)
        self.prepared = bool(m) and (int(m.group(1)), int(m.group(2))) >= (1, 21)

    def command(self):
        users = self.tmp / "pgbouncer-users.txt"
        users.write_text(f'"{DB_USER}" ""\n')
        ini = self.tmp / "pgbouncer.ini"
        ini.write_text(
            "[databases]\n"
            f"{DB} = host={self.pg.sock if self.sockdir or TRANSPORT['server_unix'] else '127.0.0.1'} "
            f"port={self.pg.port} dbname={DB} "
            f"user={DB_USER}\n"
            "[pgbouncer]\n"
            f"listen_addr = {'' if self.sockdir else '127.0.0.1'}\n"
            f"listen_port = {self.port}\n"
            f"unix_socket_dir = {self.sockdir or ''}\n"
            "auth_type = trust\n"
            f"auth_file = {users}\n"
            "pool_mode = transaction\n"
            f"default_pool_size = {self.pool_size}\n"
            f"max_client_conn = {self.max_clients}\n"
            "max_db_connections = 0\n"
            "log_connections = 0\n"
            "log_disconnections = 0\n"
            "ignore_startup_parameters = extra_float_digits\n"
            + ("max_prepared_statements = 200\n" if self.prepared else "")
            + (f"client_tls_sslmode = require\nclient_tls_cert_file = {TRANSPORT['tls'][0]}\n"
               f"client_tls_key_file = {TRANSPORT['tls'][1]}\nserver_tls_sslmode = require\n"
               if TRANSPORT["tls"] else "")
        )
        for p in (users, ini):
            if self.user:
                os.chown(p, self.user.pw_uid, self.user.pw_gid)
        return [str(self.binary), str(ini)], as_user(self.user)


def pgbouncer_binary(install: bool, explicit: str | None = None) -> tuple[Path | None, str]:
    """(binary, version) or (None, reason it is unavailable). `explicit`: a binary built from
    source (bench/build_pgbouncer.sh), else Debian's."""

    def find():
        if explicit:
            return Path(explicit) if Path(explicit).exists() else None
        for c in (shutil.which("pgbouncer"), "/usr/sbin/pgbouncer"):
            if c and Path(c).exists():
                return Path(c)
        return None

    b = find()
    if b is None and not explicit and install and apt_install("pgbouncer"):
        b = find()
    if b is None:
        return None, "pgbouncer not installed and could not be installed"
    r = subprocess.run([str(b), "--version"], capture_output=True, text=True)
    first = (r.stdout.strip() or r.stderr.strip()).splitlines()
    return b, (first[0] if first else "PgBouncer ?")


def parsnip_binary(explicit: str | None, build: bool) -> tuple[Path | None, str]:
    if explicit:
        b = Path(explicit)
        return (b, "") if b.exists() else (None, f"{b} does not exist")
    try:
        return throwaway.parsnip_release(build), ""
    except BenchError as e:
        return None, str(e)


def git_describe() -> str:
    def git(*args):
        r = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True)
        return r.stdout.strip() if r.returncode == 0 else ""

    rev = git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = git("status", "--porcelain", "--", "src", "Cargo.toml", "Cargo.lock")
    return rev + (" + uncommitted changes in src/" if dirty else "")
