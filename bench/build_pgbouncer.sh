#!/usr/bin/env bash
# Builds PgBouncer from a source tree (a release tarball or a git checkout at a tag, e.g.
# pgbouncer_1_25_1) for the side-by-side benchmarks: Debian's 1.18 cannot run pgbench
# -M prepared, 1.21 and later can (max_prepared_statements).
#
#   bench/build_pgbouncer.sh SRC_DIR     # prints the binary's path: SRC_DIR/pgbouncer
#   python3 bench/run.py --pgbouncer-bin "$(bench/build_pgbouncer.sh SRC_DIR)" ...
#
# Installs the build dependencies with apt-get when missing (Debian).
set -euo pipefail
src=$(cd "$1" && pwd)
need=()
for p in autoconf automake libtool pkg-config libevent-dev libssl-dev; do
    dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >&2
fi
cd "$src"
if [ ! -x configure ]; then
    ./autogen.sh >&2
fi
./configure --without-cares --with-openssl --disable-evdns >&2 || ./configure --without-cares --with-openssl >&2
# The binary only: the manual pages need pandoc.
make -j"$(nproc)" pgbouncer >&2
echo "$src/pgbouncer"
