#!/usr/bin/env bash
# The whole test suite: formatting and lint gates, unit and property tests, and the
# end-to-end tests against real PostgreSQL clusters that the suite starts itself (a first
# pass against Debian's PostgreSQL 15, a second against PostgreSQL 18 from
# scripts/fetch-pg.sh), and the driver matrix (drivers/run.py: every scenario against
# PostgreSQL 15, one per driver against 18).
# Installs what is missing (PostgreSQL server binaries; slapd, which the LDAP tests start
# their own of) on a Debian machine.
#
# PARSNIP_SKIP_PG2=1 skips the PostgreSQL 18 pass (and its download);
# PARSNIP_SKIP_DRIVERS=1 skips the driver matrix;
# PSYCOPG_SRC=DIR (a checkout of github.com/psycopg/psycopg, which package registries do not
# carry) adds psycopg's own test suite through parsnip (scripts/psycopg_suite.py, about two
# minutes): every test that passes directly must pass in session mode, and in transaction mode
# fail only as scripts/psycopg_suite_known.txt says.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && ! command -v initdb >/dev/null 2>&1; then
    echo "== installing PostgreSQL server (apt)"
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq postgresql postgresql-client >/dev/null
fi

# The LDAP tests (tests/e2e_external_auth.rs) start a slapd of their own on a port of their
# own, so a system slapd the package starts is stopped (it would not interfere, but it is
# not needed). The PAM test needs only libpam and pam_exec, which every Debian has.
missing=()
[ -x /usr/sbin/slapd ] || missing+=(slapd ldap-utils)
if [ "${#missing[@]}" -gt 0 ]; then
    echo "== installing ${missing[*]} (apt)"
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    if [[ " ${missing[*]} " == *" slapd "* ]] && command -v systemctl >/dev/null 2>&1 \
        && systemctl is-active --quiet slapd 2>/dev/null; then
        $SUDO systemctl disable --now slapd >/dev/null 2>&1 || true
    fi
fi
# Ubuntu confines /usr/sbin/slapd with AppArmor to its own paths: the tests' slapd keeps its
# files in the temp directory, so the profile is put in complain mode when there is one.
if [ -e /etc/apparmor.d/usr.sbin.slapd ] && command -v aa-complain >/dev/null 2>&1; then
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
    $SUDO aa-complain /usr/sbin/slapd >/dev/null 2>&1 || true
fi

# The second PostgreSQL major version, fetched first so that a machine without it (no
# network, say) fails here, loudly, rather than after the first pass.
pg2_bin=""
if [ "${PARSNIP_SKIP_PG2:-0}" != 1 ]; then
    echo "== PostgreSQL 18 for the second pass (scripts/fetch-pg.sh)"
    if ! pg2_bin=$(bash scripts/fetch-pg.sh); then
        echo "ERROR: could not fetch PostgreSQL 18 (see above); PARSNIP_SKIP_PG2=1 runs without the second pass" >&2
        exit 1
    fi
fi

# The major version of the PostgreSQL in bin dir $1 ("?" if it does not say).
pg_major() {
    "$1/postgres" --version 2>/dev/null | sed -nE 's/.*PostgreSQL\) ([0-9]+).*/\1/p' | grep . || echo "?"
}

# The bin dir the embedded clusters use without PARSNIP_PG_BIN: scripts/throwaway.py finds
# it in the same order as src/embedded/sys.rs find_bin_dir (one way, for every harness).
default_pg_bin() {
    python3 scripts/throwaway.py bindir
}

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --all-targets --quiet -- -D warnings

total_passed=0
total_failed=0
cargo_status=0
# Runs `cargo test ARGS...` against the PostgreSQL labelled $1, prints the result lines
# (and the log's tail on failure) and a total; adds to the totals and cargo_status.
cargo_pass() {
    local label=$1; shift
    local log status passed failed start
    log=$(mktemp)
    start=$(date +%s)
    echo "== cargo test $* (PostgreSQL $label)"
    set +e
    cargo test --no-fail-fast "$@" >"$log" 2>&1
    status=$?
    set -e
    grep -E "^(test result|     Running|failures:|---- |thread .* panicked)|FAILED" "$log" || true
    if [ "$status" != 0 ]; then
        echo "== test failures: the panic messages"
        grep -E -A6 "^thread .* panicked" "$log" | head -n 80 || true
        echo "== test failures (tail of the log)"
        tail -n 150 "$log"
        cargo_status=$status
    fi
    passed=$(grep -Eo "test result: [a-zA-Z]+\. [0-9]+ passed" "$log" | awk '{s+=$4} END {print s+0}')
    failed=$(grep -Eo "; [0-9]+ failed" "$log" | awk '{s+=$2} END {print s+0}')
    rm -f "$log"
    if [ "$status" != 0 ] && [ "$failed" = 0 ]; then
        failed=1 # it failed before any test ran (a build error)
    fi
    total_passed=$((total_passed + passed))
    total_failed=$((total_failed + failed))
    echo "cargo (PostgreSQL $label): $passed passed, $failed failed ($(($(date +%s) - start)) s)"
}

cargo_pass "$(pg_major "$(default_pg_bin)")" --all-targets
if [ -n "$pg2_bin" ]; then
    # The library's and the end-to-end tests again, every cluster from the other version
    # (the embedded module honours PARSNIP_PG_BIN).
    PARSNIP_PG_BIN="$pg2_bin" cargo_pass "$(pg_major "$pg2_bin")" --lib --test '*'
fi
# The concurrent hostile-client test (issue 23): hostile and honest clients at once, alone
# since it loads both cores (tests/e2e_hostile.rs). Half a minute against each major
# version (PARSNIP_HOSTILE_SECS; a failure prints the seed to replay).
PARSNIP_HOSTILE_SECS=${PARSNIP_HOSTILE_SECS:-30} cargo_pass "$(pg_major "$(default_pg_bin)"), hostile clients" \
    --test e2e_hostile hostile_clients_do_not_disturb_honest_ones -- --ignored
if [ -n "$pg2_bin" ]; then
    PARSNIP_HOSTILE_SECS=${PARSNIP_HOSTILE_SECS:-30} PARSNIP_PG_BIN="$pg2_bin" \
        cargo_pass "$(pg_major "$pg2_bin"), hostile clients" \
        --test e2e_hostile hostile_clients_do_not_disturb_honest_ones -- --ignored
fi
echo "cargo: $total_passed passed, $total_failed failed"

# The driver matrix (issue 4): real drivers from their registries, through parsnip and
# directly (drivers/README.md). PARSNIP_SKIP_DRIVERS=1 skips it (e.g. a quick local run).
drivers_status=0
matrix_logs=()
# Runs drivers/run.py with ARGS, its output also kept for the summary at the end.
matrix_pass() {
    local log status
    log=$(mktemp)
    matrix_logs+=("$log")
    set +e
    python3 drivers/run.py "$@" 2>&1 | tee "$log"
    status=${PIPESTATUS[0]}
    set -e
    [ "$status" = 0 ] || drivers_status=$status
}
if [ "${PARSNIP_SKIP_DRIVERS:-0}" != 1 ]; then
    echo "== driver matrix (python3 drivers/run.py)"
    matrix_pass
    if [ -n "$pg2_bin" ]; then
        # One scenario of each driver again against the second major version (PostgreSQL 18
        # signals a cancelled backend once, 15 twice; its log and catalog differ too). Not
        # written to README's table, which is the PostgreSQL 15 run's.
        echo "== driver matrix, one scenario per driver (PostgreSQL $(pg_major "$pg2_bin"))"
        matrix_pass --pg-bin "$pg2_bin" --skip-setup --no-build --no-readme \
            --only pgx-cache-statement --only pgjdbc-threshold5 --only node-pg-named \
            --only node-postgresjs --only pgbench-prepared --only psycopg-default \
            --only asyncpg-default --only tokio-postgres-prepare --only sqlx-persistent
    fi
fi

suite_status=0
if [ -n "${PSYCOPG_SRC:-}" ]; then
    echo "== psycopg's test suite (scripts/psycopg_suite.py --src $PSYCOPG_SRC)"
    set +e
    python3 scripts/psycopg_suite.py --src "$PSYCOPG_SRC" 2>&1 | tee /tmp/parsnip-psycopg-suite.log
    suite_status=${PIPESTATUS[0]}
    set -e
fi

# The verdict last, where a log cut to its tail still shows it.
echo "== summary"
echo "cargo: $total_passed passed, $total_failed failed"
for log in "${matrix_logs[@]}"; do
    grep -E "^driver-matrix: ([0-9]+ passed|error)" "$log" | tail -n 1 || echo "driver-matrix: no result line"
    sed -n '/^driver-matrix: failed scenarios:/,/^driver-matrix: [0-9]* passed/p' "$log" | sed '$d'
    rm -f "$log"
done
if [ -n "${PSYCOPG_SRC:-}" ]; then
    grep -E "^psycopg-suite" /tmp/parsnip-psycopg-suite.log || echo "psycopg-suite: no result line"
fi
[ "$cargo_status" = 0 ] || exit "$cargo_status"
[ "$suite_status" = 0 ] || exit "$suite_status"
exit "$drivers_status"
