# tests/cli_pg_lib.sh -- a throw-away PostgreSQL cluster for the CLI test
# scripts (sourced after cli_lib.sh): pg_lib_start NAME [MAX_CONNECTIONS]
# starts one of tests/pg_cluster.sh in a directory of its own (given to
# the unprivileged owner under root) and sets CLUSTER, PGD and CI (its
# connection string); on any exit every pid the test added to PIDS (its
# background processes) is killed -9 and the test's pg_lib_hook (when
# defined) runs, then the cluster is stopped and removed, with $T.  q SQL
# runs SQL through psql; make_pay TABLE ROWS makes a table of plaintext
# cards.  Sourcing it also sets the environment every such test starts
# from (below).

CLUSTER="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/pg_cluster.sh"

# Every PostgreSQL CLI test starts from the same environment: no
# passphrase, password or service from the caller's, a keyring of its
# own in $T, and no standard input for the commands it runs.
unset KEYSHIFT_PASSPHRASE PGPASSWORD PGSERVICE
export KEYSHIFT_KEYRING="$T/keyring"
IN=/dev/null
# The test's background processes (it appends their pids).
PIDS=()

# Stop what the test started, then the cluster; remove $T.
pg_lib_cleanup() {
    local p
    for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done
    declare -F pg_lib_hook >/dev/null && pg_lib_hook
    "$CLUSTER" stop "$PGD" >/dev/null 2>&1 || rm -rf "$PGD"
    rm -rf "$T"
}

# pg_lib_start NAME [MAX_CONNECTIONS]: start the cluster (NAME names the
# test in messages), restarted with max_connections MAX_CONNECTIONS when
# given (tests/pg_cluster.sh allows 20) for a test of many sessions.
pg_lib_start() {
    command -v psql >/dev/null || { echo "$1: psql is missing (tools/deps.sh)"; exit 1; }
    PGD=$(mktemp -d /tmp/ks_pgcli_XXXXXX)
    trap pg_lib_cleanup EXIT
    trap 'exit 1' INT TERM HUP
    CI=$("$CLUSTER" start "$PGD") || { echo "$1: cannot start a cluster"; exit 1; }
    if [ -n "${2:-}" ]; then
        q "ALTER SYSTEM SET max_connections = $2" >/dev/null &&
            "$CLUSTER" down "$PGD" && "$CLUSTER" up "$PGD" ||
            { echo "$1: cannot restart the cluster"; exit 1; }
    fi
}

# q SQL: run SQL through psql, unaligned tuples only, stopping on error.
q() { psql "$CI" -qXAt -v ON_ERROR_STOP=1 -c "$1"; }

# make_pay TABLE ROWS: TABLE(id bigint primary key, tenant, card bytea)
# with ROWS rows of random plaintext ('row-ID-' and 64 random hex
# digits) and a copy of the cards in TABLE_orig.
make_pay() {
    q "CREATE TABLE $1 (id bigint PRIMARY KEY, tenant text NOT NULL, card bytea);
       INSERT INTO $1 SELECT i, 'acme', convert_to(format('row-%s-', lpad(i::text, 5, '0'))
           || md5(random()::text) || md5(random()::text), 'UTF8') FROM generate_series(1, $2) i;
       CREATE TABLE $1_orig AS SELECT id, card FROM $1;"
}
