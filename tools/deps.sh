#!/bin/sh
# tools/deps.sh -- install the Debian packages keyshift needs to build and test.
#
# Idempotent: it asks dpkg which packages are already installed and calls
# apt-get only for the missing ones, so a second run does nothing and needs
# no network.  Run as root (or with sudo available) on Debian 12.
#
# Usage: tools/deps.sh [--check]
#   --check   only report what is missing; exit 1 if anything is.
set -eu

PKGS="make gcc clang-14 libclang-rt-14-dev llvm-14 pkg-config zip \
libsodium-dev libsqlite3-dev sqlite3 libcmocka-dev \
nanopb libnanopb-dev protobuf-compiler python3-protobuf afl++ \
python3-cryptography python3-argon2 python3-pytest softhsm2 libp11-kit-dev \
libcurl4-openssl-dev libjansson-dev frama-c-base why3 z3 \
postgresql-15 libpq-dev libssl-dev libmicrohttpd-dev libsystemd-dev curl \
golang-go golang-github-mattn-go-sqlite3-dev golang-github-lib-pq-dev python3-psycopg2 \
mandoc bash-completion debhelper dpkg-dev fakeroot lintian prometheus"

missing=""
for p in $PKGS; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
        missing="$missing $p"
    fi
done

if [ -z "$missing" ]; then
    exit 0
fi

if [ "${1:-}" = "--check" ]; then
    echo "deps.sh: missing:$missing" >&2
    exit 1
fi

echo "deps.sh: installing:$missing" >&2
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
# An apt-get update is needed on a fresh machine: its package lists are empty.
$SUDO apt-get update -qq >&2
# shellcheck disable=SC2086
$SUDO apt-get install -y -qq --no-install-recommends $missing >&2
