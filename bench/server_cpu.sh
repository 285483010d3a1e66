#!/usr/bin/env bash
# PostgreSQL's CPU per transaction through a pooler, beside the pooler's own (issue 26): what
# the statement cache saves the server shows here, not in the pooler's CPU. Starts the
# pooler (parsnip BIN, pool 8, transaction mode; or PgBouncer from PGBOUNCER, same pool),
# runs examples/loadgen (CLIENTS, MODE, WORKLOAD) for 12 s, and over a 6-s window once
# transactions flow reads the user+system CPU ticks of every `postgres` process and of the
# pooler from /proc (the pooler's user and system time apart too), divided by the
# transactions the pooler counted (SHOW STATS). Linux only; needs a PostgreSQL with
# pgbench's tables (scale 10) in database bench that trusts local TCP logins, as
# bench/instructions.sh does. Run pairs back to back: the figures are
# for ratios between systems measured minutes apart, not absolute.
#
#   bench/server_cpu.sh BIN|pgbouncer [CLIENTS=64] [MODE=simple] [WORKLOAD=tpcb]
#
# Env: PGPORT (5432) and PGUSER (postgres) of that PostgreSQL; PGBOUNCER (a PgBouncer 1.25
# binary, run as PGBOUNCER_USER, default postgres: it refuses root); LG (loadgen binary);
# SYSCALLS=1: also count the pooler's system calls and context switches per transaction over
# the same window (`perf stat` on tracepoints: needs perf, no hardware counters).
set -euo pipefail
bin=${1:?usage: bench/server_cpu.sh BIN|pgbouncer [CLIENTS] [MODE] [WORKLOAD]}
clients=${2:-64}
mode=${3:-simple}
workload=${4:-tpcb}
cd "$(dirname "$0")/.."
lg=${LG:-target/release/examples/loadgen}
pgport=${PGPORT:-5432}
pguser=${PGUSER:-postgres}
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
work=$(mktemp -d)
chmod 755 "$work"
pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$work"' EXIT

if [ "$bin" = pgbouncer ]; then
    printf '"%s" ""\n' "$pguser" >"$work/users.txt"
    cat >"$work/pgbouncer.ini" <<EOF
[databases]
bench = host=127.0.0.1 port=$pgport dbname=bench user=$pguser
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $port
unix_socket_dir =
auth_type = trust
auth_file = $work/users.txt
admin_users = $pguser
pool_mode = transaction
default_pool_size = 8
max_client_conn = 12000
max_db_connections = 0
log_connections = 0
log_disconnections = 0
ignore_startup_parameters = extra_float_digits
max_prepared_statements = 200
EOF
    chown -R "${PGBOUNCER_USER:-postgres}" "$work"
    # 10,000 clients need more descriptors than a login's default 1,024.
    prlimit --nofile=20000 su "${PGBOUNCER_USER:-postgres}" -s /bin/sh \
        -c "ulimit -n 20000; exec ${PGBOUNCER:?PGBOUNCER: a PgBouncer binary} $work/pgbouncer.ini" \
        >"$work/pooler.log" 2>&1 &
    pid=$!
    # su's child is PgBouncer: its CPU is what is read.
    for _ in $(seq 50); do child=$(pgrep -P "$pid" || true); [ -n "$child" ] && break; sleep 0.1; done
    [ -n "$child" ] && pid=$child
else
    printf 'log_level = "warn"\nauth_type = "trust"\n' >"$work/parsnip.toml"
    "$bin" "postgres://$pguser@127.0.0.1:$pgport/bench" --listen "127.0.0.1:$port" --pool-size 8 \
        --pool-mode transaction --max-client-conn 12000 -c "$work/parsnip.toml" >"$work/pooler.log" 2>&1 &
    pid=$!
fi
for _ in $(seq 100); do pg_isready -q -h 127.0.0.1 -p "$port" && break; sleep 0.1; done

ticks() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0; }
# The pooler's user and system ticks apart: the kernel's share (sends, receives, wake-ups)
# is what any pooler doing the same system calls spends.
utick() { awk '{print $14}' "/proc/$1/stat" 2>/dev/null || echo 0; }
server_ticks() { for p in $(pgrep -x postgres); do ticks "$p"; done | awk '{s += $1} END {print s + 0}'; }
xacts() { psql -h 127.0.0.1 -p "$port" -U "$pguser" -d pgbouncer -AtF' ' -c 'SHOW STATS' | awk '$1 == "bench" {print $3}'; }

"$lg" -p "$port" -U "$pguser" -d bench -c "$clients" -T 12 -s 10 -M "$mode" --workload "$workload" >"$work/loadgen.json" 2>&1 &
load=$!
sleep 4
x0=$(xacts); s0=$(server_ticks); p0=$(ticks "$pid"); u0=$(utick "$pid")
if [ "${SYSCALLS:-}" = 1 ]; then
    perf stat -x, -o "$work/perf.csv" -p "$pid" -e raw_syscalls:sys_enter,syscalls:sys_enter_sendto \
        -e syscalls:sys_enter_recvfrom,syscalls:sys_enter_epoll_wait,context-switches -- sleep 6
else
    sleep 6
fi
x1=$(xacts); s1=$(server_ticks); p1=$(ticks "$pid"); u1=$(utick "$pid")
wait "$load" || true
hz=$(getconf CLK_TCK)
n=$((x1 - x0))
[ "$n" -gt 0 ] || { echo "no transactions counted" >&2; cat "$work/pooler.log" "$work/loadgen.json" >&2; exit 1; }
echo "$(basename "$bin") $workload -M $mode, $clients clients: $n transactions in 6 s; CPU us per transaction:" \
    "PostgreSQL $(( (s1 - s0) * 1000000 / hz / n )), pooler $(( (p1 - p0) * 1000000 / hz / n ))" \
    "(user $(( (u1 - u0) * 1000000 / hz / n )), system $(( (p1 - p0 - u1 + u0) * 1000000 / hz / n )))"
if [ "${SYSCALLS:-}" = 1 ]; then
    # perf's CSV: count,unit,event,...
    awk -F, -v n="$n" '$3 != "" && $1 ~ /^[0-9]+$/ { sub(/^(raw_)?syscalls:(sys_enter_)?/, "", $3); if ($3 == "sys_enter") $3 = "system calls"; printf "%s%s %.1f", sep, $3, $1 / n; sep = ", " }
        END { print " per transaction" }' "$work/perf.csv"
fi
