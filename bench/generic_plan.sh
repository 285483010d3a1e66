#!/bin/bash
# Autoprepare's and promotion's plan-quality risk, measured (docs/configuration.md
# "Autoprepare", "The plan guard"): a query whose best plan depends on its literal (`id >
# N`: all rows for a small N, ten rows for a large one) runs first with wide ranges, then
# with a narrow one. Directly, PostgreSQL plans each literal Query afresh; through parsnip
# the statement is cached (autoprepared simple queries, promoted unnamed extended ones), and
# after five executions PostgreSQL's plan cache may keep a generic plan made for an average
# range; the plan guard should then demote it. Prints the narrow query's times: direct,
# through parsnip as simple queries (autoprepare, on by default), with plan_cache_mode =
# force_custom_plan, and as unnamed extended statements (pgbench -M extended, default
# settings). With REPEAT=N (default 3) the narrow query runs N times; with more than 3 the
# mean of executions 1-10, 11-50 and 51-N is printed instead of the last three. EXTRA adds
# a line to parsnip's configuration (EXTRA='plan_guard = false' shows the regression).
# Usage: bench/generic_plan.sh  (needs target/release/parsnip and PostgreSQL's binaries;
# runs a throwaway cluster as the postgres user on ports 55499/56499)
set -eu
PGB=${PGB:-$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)}
REPO=$(cd "$(dirname "$0")/.." && pwd)
REPEAT=${REPEAT:-3}
D=$(mktemp -d /tmp/generic-planXXXX); chown postgres "$D"
trap 'kill $PN 2>/dev/null; runuser -u postgres -- $PGB/pg_ctl -D $D/data stop -m immediate >/dev/null 2>&1; rm -rf $D' EXIT
runuser -u postgres -- "$PGB/initdb" -D "$D/data" -A trust -U postgres >/dev/null
runuser -u postgres -- "$PGB/pg_ctl" -D "$D/data" -o "-p 55499 -k $D -c listen_addresses=127.0.0.1 -c shared_buffers=256MB" -l "$D/pg.log" start -w >/dev/null
psql -X -q -h 127.0.0.1 -p 55499 -U postgres postgres -c "create table orders(id serial primary key, customer int, payload text); insert into orders(customer, payload) select g % 1000, repeat('x', 50) from generate_series(1, 2000000) g; analyze orders;"
start_parsnip() {
    "$REPO/target/release/parsnip" postgres://postgres@127.0.0.1:55499/postgres --listen 127.0.0.1:56499 --pool-size 1 -c "$D/p.toml" > "$D/parsnip.log" 2>&1 & PN=$!
    for i in $(seq 50); do (echo > /dev/tcp/127.0.0.1/56499) 2>/dev/null && break; sleep 0.1; done
}
# parsnip's defaults (autoprepare is on by default since issue 24), plus EXTRA.
printf 'log_level = "warn"\nauth_type = "trust"\nunix_socket_dir = ""\n%s\n' "${EXTRA:-}" > "$D/p.toml"
start_parsnip
queries() { echo '\timing on'; for n in 10 20 30 40 50 60; do echo "select count(payload) from orders where id > $n;"; done
            for i in $(seq "$REPEAT"); do echo "select count(payload) from orders where id > 1999990;"; done; }
narrow() {
    if [ "$REPEAT" -le 3 ]; then grep Time | tail -3 | awk '{printf "%s ms  ", $2} END {print ""}'; return; fi
    grep Time | awk '{print $2}' | tail -n "$REPEAT" | awk -v n="$REPEAT" '
        NR <= 10 {a += $1; na++} NR > 10 && NR <= 50 {b += $1; nb++} NR > 50 {c += $1; nc++}
        END {printf "mean ms: 1-10 %.3f  11-50 %.3f  51-%d %.3f\n", a/na, b/nb, n, (nc ? c/nc : 0)}'
}
echo "direct:                                   $(queries | psql -X -q -h 127.0.0.1 -p 55499 -U postgres postgres | narrow)"
echo "parsnip, autoprepare:                     $(queries | psql -X -q -h 127.0.0.1 -p 56499 -U postgres postgres | narrow)"
echo "parsnip, autoprepare, force_custom_plan:  $( (echo 'set plan_cache_mode = force_custom_plan;'; queries) | psql -X -q -h 127.0.0.1 -p 56499 -U postgres postgres | narrow)"
# Unnamed extended statements, parsnip's defaults (a fresh parsnip: a fresh cache).
kill $PN; wait $PN 2>/dev/null || true
printf 'log_level = "warn"\nauth_type = "trust"\nunix_socket_dir = ""\n%s\n' "${EXTRA:-}" > "$D/p.toml"
start_parsnip
extended() {
    local port=$1
    for n in 10 20 30 40 50 60; do
        printf '\\set n %s\nselect count(payload) from orders where id > :n;\n' "$n" > "$D/wide.sql"
        pgbench -n -M extended -t 1 -f "$D/wide.sql" -h 127.0.0.1 -p "$port" -U postgres postgres > /dev/null
    done
    printf '\\set n 1999990\nselect count(payload) from orders where id > :n;\n' > "$D/narrow.sql"
    (cd "$D" && rm -f pgbench_log.* && pgbench -n -M extended -t "$REPEAT" -l -f narrow.sql -h 127.0.0.1 -p "$port" -U postgres postgres > /dev/null)
    # Column 3: the transaction's latency in µs.
    awk '{print $3 / 1000}' "$D"/pgbench_log.* | awk -v n="$REPEAT" '
        NR <= 10 {a += $1; na++} NR > 10 && NR <= 50 {b += $1; nb++} NR > 50 {c += $1; nc++}
        END {printf "mean ms: 1-10 %.3f  11-50 %.3f  51-%d %.3f\n", a/na, (nb ? b/nb : 0), n, (nc ? c/nc : 0)}'
}
echo "direct, extended (pgbench):               $(extended 55499)"
echo "parsnip, unnamed extended (defaults):     $(extended 56499)"
