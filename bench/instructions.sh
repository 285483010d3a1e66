#!/usr/bin/env bash
# Instructions per transaction in parsnip's process, counted by callgrind (repeatable on a
# shared, noisy machine, unlike time). Needs valgrind, pgbench and a PostgreSQL initialised
# with `pgbench -i` (database bench) that trusts local TCP logins.
#
#   bench/instructions.sh MODE [CONFIG-LINE]     e.g. bench/instructions.sh extended 'prepared_statements = false'
#
# Env: WORKLOAD (select, the default: pgbench -S; tpcb: pgbench's TPC-B-like script); PGPORT (default 5432) and PGUSER (postgres) of that PostgreSQL; PARSNIP_BIN (default
# target/release/parsnip); KEEP (a directory: the callgrind outputs are copied there, for
# callgrind_annotate). Runs parsnip (one worker thread, pool 4) under callgrind twice, with
# 16 clients x 20 and x 60 transactions, and prints (Ir(60) - Ir(20)) / 640: logins, start-up
# and shutdown cancel out.
set -euo pipefail
mode=${1:?usage: bench/instructions.sh simple|extended|prepared [config line]}
cfgline=${2:-}
script=-S
[ "${WORKLOAD:-select}" = tpcb ] && script=
cd "$(dirname "$0")/.."
bin=${PARSNIP_BIN:-target/release/parsnip}
pgport=${PGPORT:-5432}
pguser=${PGUSER:-postgres}
work=$(mktemp -d)
trap 'pkill -INT -f "callgrind-out-file=$work" 2>/dev/null || true; [ -n "${KEEP:-}" ] && cp $work/cg.* $KEEP/ ; rm -rf "$work"' EXIT
printf 'log_level = "warn"\nauth_type = "trust"\n%s\n' "$cfgline" >"$work/parsnip.toml"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')

instructions() {
    local out="$work/cg.$1"
    PARSNIP_WORKERS=1 valgrind --tool=callgrind --callgrind-out-file="$out" "$bin" \
        "postgres://$pguser@127.0.0.1:$pgport/bench" --listen "127.0.0.1:$port" --pool-size 4 \
        --pool-mode transaction -c "$work/parsnip.toml" >"$work/parsnip.log" 2>&1 &
    local pid=$!
    for _ in $(seq 100); do pg_isready -q -h 127.0.0.1 -p "$port" && break; sleep 0.2; done
    pgbench -n $script -M "$mode" -c 16 -j 1 -t "$1" -h 127.0.0.1 -p "$port" -U "$pguser" bench >"$work/pgbench.log" 2>&1 ||
        { cat "$work/pgbench.log" >&2; exit 1; }
    kill -INT "$pid"
    wait "$pid" || true
    callgrind_annotate "$out" 2>/dev/null | awk '/PROGRAM TOTALS/ && !done { gsub(",", "", $1); print $1; done = 1 }'
}

a=$(instructions 20)
b=$(instructions 60)
echo "${WORKLOAD:-select} -M $mode${cfgline:+ [$cfgline]}: $(((b - a) / 640)) instructions per transaction in parsnip"
