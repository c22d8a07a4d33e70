#!/usr/bin/env bash
# tests/cli_keys_pg_test.sh -- end-to-end tests of `keyshift keys set-state
# ... destroyed` with a PostgreSQL --db, on a throw-away cluster of
# tests/pg_cluster.sh (stopped and removed on any exit): the SQLite tests
# of tests/cli_rollout_test.sh that apply to the reference check, on
# PostgreSQL.  The destroy is refused (75, the message naming what
# references the version) while rows of a migrated column are under it,
# while a rollout not finalized moves it, and while a live reader
# (keyshift_readers) holds it; allowed once the rows moved (a rewrap to
# the next version), the rollout is finalized and the reader expired;
# --force --reason destroys a still referenced version and logs the
# reason in the rollout that moved it.  What PostgreSQL adds: the
# keyshift_migration of another schema (each migrated table's schema
# holds one) is read, and its rows are counted through a --db whose
# search_path shows that table, refused as not counted through one that
# does not (nor counted in another schema's table of the same name); the
# connection string is never printed; the rows of a text column of
# base64 envelopes that a migration without a rollout wrote are counted
# in base64 (the column's type says so); an unreachable server and the
# cluster stopped give 69.
#
# Needs the PostgreSQL server programs (initdb, pg_ctl) and psql.
# Usage: KEYSHIFT=path/to/keyshift tests/cli_keys_pg_test.sh
set -u

. "$(dirname "$0")/cli_lib.sh"
. "$(dirname "$0")/cli_pg_lib.sh"
pg_lib_start cli_keys_pg_test

CTX=(--context 'pay:{id}:card' --purpose card --tenant-column tenant)
SRC=v2:xchacha20-poly1305:payments/kek:1
TGT=v2:xchacha20-poly1305:payments/kek:2
R=(--db "$CI" --rollout 1)

# destroy KEY VERSION ARGS...: keys set-state KEY VERSION destroyed ARGS.
destroy() {
    local key=$1 version=$2
    shift 2
    "$KS" keys set-state "$key" "$version" destroyed "$@"
}

# no_conninfo NAME: the connection string is not in the messages (libpq's
# own "cannot connect" names the server's socket, not the string).
no_conninfo() {
    if grep -qF "$CI" "$T/err" "$T/out"; then bad "$1: the connection string is not printed" "$(head -c 300 "$T/err")"
    else ok "$1: the connection string is not printed"; fi
}

# reader ID KEYS AGE: register reader ID holding KEYS, last seen AGE s ago.
reader() {
    q "INSERT INTO keyshift_readers VALUES ('$1', '0.1.0', 2, 6, '$2',
           extract(epoch FROM now())::bigint - $3, extract(epoch FROM now())::bigint - $3)
       ON CONFLICT (instance_id) DO UPDATE SET key_versions = EXCLUDED.key_versions,
           started = EXCLUDED.started, heartbeat = EXCLUDED.heartbeat"
}

# phase_is PHASE: rollout 1's phase.
phase_is() {
    local got
    got=$(q "SELECT phase FROM keyshift_rollout WHERE id = 1")
    if [ "$got" = "$1" ]; then ok "rollout 1 is in $1"; else bad "rollout 1 is in $1" "got $got"; fi
}

run "keys init" 0 "$KS" keys init
run "keys create" 0 "$KS" keys create payments/kek
run "keys --help" 0 "$KS" keys --help
expect_grep "keys --help: --db takes a PostgreSQL connection string" "$T/out" "postgresql://"

# ---- no migration, no rollout yet ------------------------------------------------------------------
run "keys add-version 2" 0 "$KS" keys add-version payments/kek
run "destroy an unused version: nothing references it" 0 destroy payments/kek 2 --db "$CI"
if [ "$(q "SELECT count(*) FROM pg_class WHERE relname LIKE 'keyshift%'")" = 0 ]; then
    ok "the check created no table"; else bad "the check created no table"; fi
run "destroy without --db" 64 destroy payments/kek 1
run "unreachable server: 69" 69 destroy payments/kek 1 --db "host=$T/nosock dbname=postgres"
expect_grep "unreachable: says it cannot connect" "$T/err" "cannot connect"
run "a password in --db: refused" 64 destroy payments/kek 1 --db "$CI password=hunter2"
if grep -q hunter2 "$T/err"; then bad "password: not echoed"; else ok "password: not echoed"; fi

# ---- rows of a migrated column -------------------------------------------------------------------
make_pay pay 40
run "migrate run: encrypt pay.card under payments/kek:1" 0 "$KS" migrate run --db "$CI" --table pay \
    --column card --mode encrypt --to-key payments/kek "${CTX[@]}"
run "keys add-version 3" 0 "$KS" keys add-version payments/kek
run "keys promote 3" 0 "$KS" keys promote payments/kek 3
run "destroy while the rows of a migrated column use it" 75 destroy payments/kek 1 --db "$CI"
expect_grep "rows: names the rows" "$T/err" "PostgreSQL database (--db 1): 40 rows of pay.card"
expect_grep "rows: sums the references" "$T/err" "payments/kek:1 is still referenced by 40 rows"
no_conninfo "rows"
run "two --db, one missing: 66, each checked" 66 destroy payments/kek 1 --db "$T/nosuch.db" --db "$CI"
expect_grep "two --db: the missing file named" "$T/err" "no such database .*nosuch.db"
expect_grep "two --db: the other still counted" "$T/err" "PostgreSQL database (--db 2): 40 rows of pay.card"
run "the same database twice: counted twice" 75 destroy payments/kek 1 --db "$CI" --db "$CI"
expect_grep "twice: the second --db named" "$T/err" "PostgreSQL database (--db 2): 40 rows of pay.card"

# ---- a rollout not finalized, a live reader -------------------------------------------------------
# no application reports health here: every check is disabled (an enabled
# check with no data would never let the rollout into backfill)
run "rollout start: payments/kek:1 -> 3" 0 "$KS" rollout start --db "$CI" --table pay --column card \
    --source "$SRC" --target v2:xchacha20-poly1305:payments/kek:3 --min-soak 0s --min-samples 0 \
    --max-auth-failure-rate -1 --max-parse-error-rate -1 --max-provider-error-rate -1 \
    --max-seal-p99-us 0 --max-open-p99-us 0 --reader-ttl 60 --actor ops --reason "rotate pay.card"
run "rollout -> read-compat" 0 "$KS" rollout advance "${R[@]}"
phase_is read-compat
reader web-1 "payments/kek:1,payments/kek:3" 0
reader old-7 "payments/kek:1" 3600
run "destroy while rows, a rollout and a live reader reference it" 75 destroy payments/kek 1 --db "$CI"
expect_grep "rollout: names the rollout" "$T/err" "rollout 1 of pay.card (read-compat) moves it"
expect_grep "reader: names the live reader" "$T/err" "live reader web-1 holds it"
if grep -q old-7 "$T/err"; then bad "reader: an expired reader does not count"; else ok "reader: an expired reader does not count"; fi
expect_grep "sums rows, readers and rollouts" "$T/err" "still referenced by 40 rows, 1 live reader and 1 open rollout"
no_conninfo "rollout and reader"

# ---- the rows moved, the rollout finalized ---------------------------------------------------------
run "rollout -> write-upgrade" 0 "$KS" rollout advance "${R[@]}"
run "rollout -> backfill" 0 "$KS" rollout advance "${R[@]}"
phase_is backfill
run "migrate run: rewrap to payments/kek:3" 0 "$KS" migrate run --db "$CI" --table pay --column card \
    --mode rewrap --to-key payments/kek:3 "${CTX[@]}"
run "destroy while the rollout is open (rows moved)" 75 destroy payments/kek 1 --db "$CI"
expect_grep "backfill: the rollout still moves it" "$T/err" "rollout 1 of pay.card (backfill) moves it"
if grep -q "rows of pay.card" "$T/err"; then bad "backfill: no row left under it"; else ok "backfill: no row left under it"; fi
run "migrate verify (recorded)" 0 "$KS" migrate verify --db "$CI" --table pay --column card "${CTX[@]}"
run "rollout -> finalized" 0 "$KS" rollout advance "${R[@]}"
phase_is finalized
run "destroy while a live reader holds it" 75 destroy payments/kek 1 --db "$CI"
expect_grep "finalized: only the reader now" "$T/err" "payments/kek:1 is still referenced by 1 live reader, so payments/kek:1 was not destroyed:"
reader web-1 "payments/kek:1,payments/kek:3" 3600
run "destroy: rows moved, rollout finalized, reader expired" 0 destroy payments/kek 1 --db "$CI"
run "keys list: version 1 destroyed" 0 "$KS" keys list --json
expect_grep "list: version 1 destroyed" "$T/out" '{"version":1,"state":"destroyed"'
run "log: an unforced destroy is not logged" 0 "$KS" rollout log "${R[@]}"
if grep -q "destroyed with --force" "$T/out"; then bad "log: no force note"; else ok "log: no force note"; fi

# ---- --force --reason ------------------------------------------------------------------------------
run "keys add-version 4" 0 "$KS" keys add-version payments/kek
run "keys promote 4" 0 "$KS" keys promote payments/kek 4
reader web-1 "payments/kek:3,payments/kek:4" 0
run "destroy the rollout's target while its rows use it" 75 destroy payments/kek 3 --db "$CI"
expect_grep "target: rows and the reader" "$T/err" "payments/kek:3 is still referenced by 40 rows and 1 live reader"
run "--force without --reason" 64 destroy payments/kek 3 --db "$CI" --force
run "destroy --force --reason" 0 destroy payments/kek 3 --db "$CI" --force --reason "drill OPS-9"
expect_grep "force: says what it overrode" "$T/err" "warning: payments/kek:3 was still referenced by 40 rows and 1 live reader when its destroy was forced"
run "rollout log" 0 "$KS" rollout log "${R[@]}"
expect_grep "log: the forced destruction and its reason" "$T/out" "key payments/kek:3 destroyed with --force: drill OPS-9"
n=$(q "SELECT count(*) FROM keyshift_rollout_log WHERE rollout_id = 1 AND reason LIKE '%destroyed with --force: drill OPS-9'")
if [ "$n" = 1 ]; then ok "log: one row in keyshift_rollout_log"; else bad "log: one row in keyshift_rollout_log" "$n rows"; fi
no_conninfo "force"

# ---- the keyshift_migration of another schema ----------------------------------------------------
OTHER="$CI options=-csearch_path=other,public"
run "keys create ledger/kek" 0 "$KS" keys create ledger/kek
q "CREATE SCHEMA other; CREATE TABLE other.ledger (id bigint PRIMARY KEY, tenant text NOT NULL, card bytea);
   INSERT INTO other.ledger SELECT i, 'acme', convert_to('entry ' || i, 'UTF8') FROM generate_series(1, 7) i;"
run "migrate run: other.ledger through its search_path" 0 "$KS" migrate run --db "$OTHER" --table ledger \
    --column card --mode encrypt --to-key ledger/kek "${CTX[@]}"
if [ "$(q "SELECT count(*) FROM other.keyshift_migration WHERE tbl = 'ledger'")" = 1 ]; then
    ok "schema: the checkpoint is in other.keyshift_migration"; else bad "schema: the checkpoint is in other.keyshift_migration"; fi
run "keys add-version ledger/kek" 0 "$KS" keys add-version ledger/kek
run "keys promote ledger/kek 2" 0 "$KS" keys promote ledger/kek 2
run "schema: counted through a search_path that shows the table" 75 destroy ledger/kek 1 --db "$OTHER"
expect_grep "schema: names the rows" "$T/err" "7 rows of ledger.card"
run "schema: refused through one that does not" 75 destroy ledger/kek 1 --db "$CI"
expect_grep "schema: says the table is not shown" "$T/err" "ledger.card of schema other was migrated, but the search_path"
expect_grep "schema: the rows were not counted" "$T/err" "the rows referencing ledger/kek:1 were not counted"
q "CREATE TABLE public.ledger (id bigint PRIMARY KEY, tenant text NOT NULL, card bytea)"
run "schema: another schema's table of that name is not counted for it" 75 destroy ledger/kek 1 --db "$CI"
expect_grep "schema: still not counted" "$T/err" "the rows referencing ledger/kek:1 were not counted"
run "schema: --force overrides what was not counted" 0 destroy ledger/kek 1 --db "$CI" --force --reason "drill OPS-10"
expect_grep "schema: force says the rows were not checked" "$T/err" "warning: the rows referencing ledger/kek:1 were not checked, and its destroy was forced"

# ---- a text column of base64 envelopes, migrated without a rollout --------------------------------
run "keys create notes/kek" 0 "$KS" keys create notes/kek
q "CREATE TABLE notes (id bigint PRIMARY KEY, tenant text NOT NULL, body text);
   INSERT INTO notes SELECT i, 'acme', 'note ' || i FROM generate_series(1, 5) i;"
run "migrate run: notes.body as base64 text" 0 "$KS" migrate run --db "$CI" --table notes \
    --column body --mode encrypt --to-key notes/kek --encoding base64 "${CTX[@]}"
run "keys add-version notes/kek" 0 "$KS" keys add-version notes/kek
run "keys promote notes/kek 2" 0 "$KS" keys promote notes/kek 2
run "text column: its rows are counted in base64" 75 destroy notes/kek 1 --db "$OTHER"
expect_grep "text column: names the rows" "$T/err" "5 rows of notes.body"
run "migrate run: rewrap notes.body to notes/kek:2" 0 "$KS" migrate run --db "$CI" --table notes \
    --column body --mode rewrap --to-key notes/kek --encoding base64 "${CTX[@]}"
run "text column: destroyed once no row is under it" 0 destroy notes/kek 1 --db "$OTHER"

# ---- the database down -----------------------------------------------------------------------------
"$CLUSTER" down "$PGD" >/dev/null || bad "cluster down"
run "the cluster stopped: 69" 69 destroy payments/kek 4 --db "$CI"
expect_grep "down: says the database cannot be reached" "$T/err" "cannot connect"
no_conninfo "down"
run "keys list: version 4 still active" 0 "$KS" keys list --json
expect_grep "down: nothing destroyed" "$T/out" '{"version":4,"state":"active"'
if grep -q "AddressSanitizer\|runtime error" "$T/err"; then bad "no sanitizer report"; else ok "no sanitizer report"; fi

cli_finish cli_keys_pg_test
