#!/bin/bash
# Autoprepare's plan-quality risk, measured (docs/configuration.md "Autoprepare"): a query
# whose best plan depends on its literal (`id > N`: all rows for a small N, ten rows for a
# large one) runs first with wide ranges, then with a narrow one. Directly, PostgreSQL plans
# each literal Query afresh; through parsnip with `autoprepare = true` the lifted statement
# is prepared, and after five executions PostgreSQL's plan cache may keep a generic plan
# made for an average range. Prints the narrow query's times: direct, through parsnip, and
# through parsnip with plan_cache_mode = force_custom_plan.
# Usage: bench/generic_plan.sh  (needs target/release/parsnip and PostgreSQL's binaries;
# runs a throwaway cluster as the postgres user on ports 55499/56499)
set -eu
PGB=${PGB:-$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)}
REPO=$(cd "$(dirname "$0")/.." && pwd)
D=$(mktemp -d /tmp/generic-planXXXX); chown postgres "$D"
trap 'kill $PN 2>/dev/null; runuser -u postgres -- $PGB/pg_ctl -D $D/data stop -m immediate >/dev/null 2>&1; rm -rf $D' EXIT
runuser -u postgres -- "$PGB/initdb" -D "$D/data" -A trust -U postgres >/dev/null
runuser -u postgres -- "$PGB/pg_ctl" -D "$D/data" -o "-p 55499 -k $D -c listen_addresses=127.0.0.1 -c shared_buffers=256MB" -l "$D/pg.log" start -w >/dev/null
psql -X -q -h 127.0.0.1 -p 55499 -U postgres postgres -c "create table orders(id serial primary key, customer int, payload text); insert into orders(customer, payload) select g % 1000, repeat('x', 50) from generate_series(1, 2000000) g; analyze orders;"
printf 'log_level = "warn"\nauth_type = "trust"\nunix_socket_dir = ""\nautoprepare = true\nautoprepare_after = 1\n' > "$D/p.toml"
"$REPO/target/release/parsnip" postgres://postgres@127.0.0.1:55499/postgres --listen 127.0.0.1:56499 --pool-size 1 -c "$D/p.toml" > "$D/parsnip.log" 2>&1 & PN=$!
for i in $(seq 50); do (echo > /dev/tcp/127.0.0.1/56499) 2>/dev/null && break; sleep 0.1; done
queries() { echo '\timing on'; for n in 10 20 30 40 50 60; do echo "select count(payload) from orders where id > $n;"; done
            for i in 1 2 3; do echo "select count(payload) from orders where id > 1999990;"; done; }
narrow() { grep Time | tail -3 | awk '{printf "%s ms  ", $2} END {print ""}'; }
echo "direct:                                   $(queries | psql -X -q -h 127.0.0.1 -p 55499 -U postgres postgres | narrow)"
echo "parsnip, autoprepare:                     $(queries | psql -X -q -h 127.0.0.1 -p 56499 -U postgres postgres | narrow)"
echo "parsnip, autoprepare, force_custom_plan:  $( (echo 'set plan_cache_mode = force_custom_plan;'; queries) | psql -X -q -h 127.0.0.1 -p 56499 -U postgres postgres | narrow)"
