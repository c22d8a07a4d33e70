#!/bin/sh
# tests/pg_cluster.sh -- a throw-away PostgreSQL cluster for tests.
#
# Usage:
#   tests/pg_cluster.sh start DIR   initdb a cluster under DIR (which must
#                                   not exist, or be empty), start it
#                                   listening on a Unix socket in DIR only
#                                   (no TCP), and print its libpq
#                                   connection string on stdout
#   tests/pg_cluster.sh stop DIR    stop it at once (pg_ctl -m immediate)
#                                   and remove DIR
#   tests/pg_cluster.sh down DIR    stop its server at once (as a crash
#                                   would), keeping DIR, for a test of a
#                                   database that goes away
#   tests/pg_cluster.sh up DIR      start the server of DIR again (after
#                                   down), with the same connection string
#
# For tests only: fsync is off and local connections are trusted (the
# socket lives in DIR, mode 0700, which nobody else can enter).  initdb
# refuses to run as root, so as root the cluster belongs to the system
# user $KS_PG_USER (default keyshift-test), created if missing; DIR is
# given to that user.  The server programs are found through pg_config
# --bindir, else in the newest /usr/lib/postgresql/*/bin (Debian), else on
# PATH.  A failed start stops what it started and removes DIR.  stop
# removes only a DIR that start made (it holds .keyshift-pg-cluster).
set -eu

PG_USER=${KS_PG_USER:-keyshift-test}
PORT=5432

die() {
    echo "pg_cluster.sh: $*" >&2
    exit 1
}

# The directory holding initdb and pg_ctl.
find_bindir() {
    if command -v pg_config >/dev/null 2>&1; then
        d=$(pg_config --bindir 2>/dev/null || true)
        if [ -n "$d" ] && [ -x "$d/initdb" ]; then
            echo "$d"
            return 0
        fi
    fi
    best=""
    for d in /usr/lib/postgresql/*/bin; do
        [ -x "$d/initdb" ] && best=$d
    done
    if [ -n "$best" ]; then
        echo "$best"
        return 0
    fi
    if command -v initdb >/dev/null 2>&1; then
        dirname "$(command -v initdb)"
        return 0
    fi
    return 1
}

# Run a command as the cluster's owner (the unprivileged user under root).
as_owner() {
    if [ "$(id -u)" -eq 0 ]; then
        runuser -u "$PG_USER" -- "$@"
    else
        "$@"
    fi
}

# Under root, make sure the unprivileged owner exists.
ensure_user() {
    [ "$(id -u)" -eq 0 ] || return 0
    if ! id -u "$PG_USER" >/dev/null 2>&1; then
        useradd --system --no-create-home --shell /usr/sbin/nologin "$PG_USER" 2>/dev/null ||
            id -u "$PG_USER" >/dev/null 2>&1 || die "cannot create user $PG_USER"
    fi
}

# The user name the cluster's superuser has (initdb's default: the owner).
owner_name() {
    if [ "$(id -u)" -eq 0 ]; then
        echo "$PG_USER"
    else
        id -un
    fi
}

# Stop the cluster of $1 (if its postmaster runs) and remove $1.
stop_cluster() {
    dir=$1
    [ -f "$dir/.keyshift-pg-cluster" ] || die "$dir was not made by pg_cluster.sh start"
    if [ -f "$dir/data/postmaster.pid" ]; then
        bindir=$(find_bindir || true)
        if [ -n "$bindir" ]; then
            as_owner "$bindir/pg_ctl" -D "$dir/data" -m immediate -w -t 30 stop >/dev/null 2>&1 || true
        fi
        if [ -f "$dir/data/postmaster.pid" ]; then
            pid=$(head -n 1 "$dir/data/postmaster.pid" 2>/dev/null || true)
            case $pid in
            '' | *[!0-9]*) ;;
            *) kill -9 "$pid" 2>/dev/null || true ;;
            esac
        fi
    fi
    rm -rf "$dir"
}

# Stop the server of the cluster in $1 at once, keeping the cluster.
down_cluster() {
    [ -f "$1/.keyshift-pg-cluster" ] || die "$1 was not made by pg_cluster.sh start"
    bindir=$(find_bindir) || die "no PostgreSQL server programs (pg_ctl) found"
    as_owner "$bindir/pg_ctl" -D "$1/data" -m immediate -w -t 30 stop >/dev/null 2>&1 ||
        die "the server did not stop"
}

# Start the server of the cluster in $1 again (after down_cluster).
up_cluster() {
    [ -f "$1/.keyshift-pg-cluster" ] || die "$1 was not made by pg_cluster.sh start"
    bindir=$(find_bindir) || die "no PostgreSQL server programs (pg_ctl) found"
    as_owner "$bindir/pg_ctl" -D "$1/data" -l "$1/server.log" -w -t 60 start >/dev/null 2>&1 ||
        die "the server did not start"
}

# initdb and start a cluster in $1; print its connection string.
start_cluster() {
    dir=$1
    case $dir in
    /*) ;;
    *) dir=$(pwd)/$dir ;;
    esac
    case $dir in
    *[!A-Za-z0-9/._-]*) die "DIR may hold only letters, digits and / . _ -" ;;
    esac
    # the socket path DIR/.s.PGSQL.5432 must fit sun_path (108 bytes)
    [ ${#dir} -le 90 ] || die "DIR is too long for a Unix socket path"
    bindir=$(find_bindir) || die "no PostgreSQL server programs (initdb) found"
    ensure_user
    mkdir -p "$dir"
    [ -z "$(ls -A "$dir")" ] || die "$dir is not empty"
    : >"$dir/.keyshift-pg-cluster"
    trap 'stop_cluster "$dir"' EXIT
    trap 'exit 1' INT TERM HUP
    chmod 700 "$dir"
    if [ "$(id -u)" -eq 0 ]; then
        chown "$PG_USER" "$dir"
    fi
    as_owner "$bindir/initdb" -D "$dir/data" -A trust -E UTF8 --locale=C --no-sync \
        >"$dir/initdb.log" 2>&1 || {
        cat "$dir/initdb.log" >&2
        die "initdb failed"
    }
    as_owner sh -c "cat >>'$dir/data/postgresql.conf'" <<CONF
listen_addresses = ''
port = $PORT
unix_socket_directories = '$dir'
fsync = off
synchronous_commit = off
full_page_writes = off
max_connections = 20
deadlock_timeout = 100ms
shared_buffers = 32MB
CONF
    as_owner "$bindir/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 start >/dev/null 2>&1 || {
        cat "$dir/server.log" >&2 2>/dev/null || true
        die "the server did not start"
    }
    # a reader that went away (a killed test) must not leave the cluster
    # running: the EXIT trap stands until the line is written
    trap '' PIPE
    echo "host=$dir port=$PORT dbname=postgres user=$(owner_name)" || exit 1
    trap - EXIT INT TERM HUP
}

[ $# -eq 2 ] || die "usage: pg_cluster.sh start|stop|down|up DIR"
case $1 in
start) start_cluster "$2" ;;
stop) stop_cluster "$2" ;;
down) down_cluster "$2" ;;
up) up_cluster "$2" ;;
*) die "usage: pg_cluster.sh start|stop|down|up DIR" ;;
esac
