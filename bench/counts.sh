#!/bin/bash
# Counts per transaction (issue 26): starts parsnip BIN (pool 8, transaction mode, setsid) in
# front of a PostgreSQL on 127.0.0.1:$PGPORT with pgbench's tables (scale 10) in database
# bench, runs examples/loadgen with CLIENTS clients, and counts EVENTS (perf stat -p) and
# the threads' context switches over a 6 s window once transactions flow, divided by the
# transactions parsnip counted meanwhile (SHOW STATS). Counts, not timings: robust to other
# load. Needs root for perf and, once, the libc probes:
#   perf probe -x /lib/x86_64-linux-gnu/libc.so.6 malloc   (and free, realloc)
# RECORD=EVENTS [RECOPTS='--call-graph dwarf,16384']: perf record 2 s instead.
# usage: [DURATION=14 (loadgen -T)] [CONFIG="autoprepare = false\n"] [WORKLOAD=select|tpcb|planheavy] bench/counts.sh BIN LABEL [CLIENTS] [MODE]   (output in /tmp/parsnip-counts/LABEL)
BIN=$1; LABEL=$2; C=${3:-1000}; M=${4:-simple}
LG=${LG:-$(dirname "$0")/../target/release/examples/loadgen}
PORT=56871; OUT=/tmp/parsnip-counts/$LABEL; mkdir -p $OUT
printf 'log_level = "warn"\nauth_type = "trust"\n%b' "${CONFIG:-}" > $OUT/p.toml
setsid $BIN postgres://postgres@127.0.0.1:${PGPORT:-55871}/bench --listen 127.0.0.1:$PORT --pool-size 8 \
  --pool-mode transaction --max-client-conn 12000 -c $OUT/p.toml > $OUT/parsnip.log 2>&1 &
P=$!
for i in $(seq 50); do psql -h 127.0.0.1 -p $PORT -U postgres -d bench -Atc 'select 1' >/dev/null 2>&1 && break; sleep 0.1; done
xacts() { psql -h 127.0.0.1 -p $PORT -U postgres -d pgbouncer -Atc 'SHOW STATS' -F' ' 2>/dev/null | awk '$1=="bench"{print $3}'; }
$LG -p $PORT -U postgres -d bench -c $C -T ${DURATION:-14} -s 10 -M $M --workload ${WORKLOAD:-select} --watch-pid $P > $OUT/loadgen.json 2>$OUT/loadgen.err &
L=$!
# wait until transactions flow (after the ramp and the idle settle)
base=$(xacts); while :; do sleep 0.5; x=$(xacts); [ $((x - base)) -gt $((C + 5000)) ] && break; done
sleep 1
X0=$(xacts)
csw() { cat /proc/$P/task/*/status | awk '/^voluntary_ctxt/{v+=$2} /^nonvoluntary_ctxt/{n+=$2} END{print v, n}'; }
C0=$(csw)
if [ -n "$RECORD" ]; then perf record -o $OUT/perf.data -e $RECORD $RECOPTS -p $P -- sleep 2 2>/dev/null; else perf stat -x, -o $OUT/perf.csv -e ${EVENTS:-task-clock,context-switches,cpu-migrations,instructions:u,instructions:k,probe_libc:malloc,probe_libc:free,probe_libc:realloc,syscalls:sys_enter_recvfrom,syscalls:sys_enter_sendto,syscalls:sys_enter_epoll_wait,syscalls:sys_enter_epoll_ctl,syscalls:sys_enter_futex,syscalls:sys_enter_write,syscalls:sys_enter_read,raw_syscalls:sys_enter} -p $P -- sleep 6; fi
X1=$(xacts)
C1=$(csw)
wait $L
N=$((X1 - X0))
echo "$LABEL clients=$C mode=$M xacts=$N load=$(cut -d' ' -f1 /proc/loadavg)"
awk -F, -v n=$N '$1 ~ /^[0-9.]+$/ {printf "  %-36s %14.0f  %10.3f /txn\n", $3, $1, $1/n}' $OUT/perf.csv
echo "$C0 $C1" | awk -v n=$N '{printf "  voluntary %.3f /txn, involuntary %.3f /txn\n", ($3-$1)/n, ($4-$2)/n}'
cat $OUT/loadgen.json | head -c 600; echo
kill $P; wait $P 2>/dev/null
