#!/usr/bin/env bash
# Runs parsnip. With no arguments: a throwaway local PostgreSQL (installed with apt if
# missing) and parsnip in front of it on 127.0.0.1:6432. Arguments go to parsnip, e.g.
#   scripts/run.sh postgres://app:secret@db.internal:5432/app --pool-size 20
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$#" = 0 ] && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && ! command -v initdb >/dev/null 2>&1; then
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq postgresql postgresql-client >/dev/null
fi
cargo build --release --quiet
exec target/release/parsnip "$@"
