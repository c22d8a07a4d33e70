#!/usr/bin/env bash
# tests/cli_rollout_lifecycle_pg_test.sh -- the rollout lifecycle on
# PostgreSQL with real processes: two keyshift-demo-app
# instances read and write a table of a throw-away cluster of
# tests/pg_cluster.sh (stopped and removed on any exit, with every process
# the test started) through the policy, whose state lives in the same
# database, while the column is taken through its whole lifecycle:
#
#   1. the demo application on PostgreSQL: --help names the connection
#      string; a password in --db is refused (exit 64) without being
#      echoed; no such table, an empty table: 66; a column that is not
#      bytea: 64; a server that cannot be reached: 69.
#   2. plaintext -> v1 under pay/kek:1: start, read-compat, write-upgrade,
#      backfill (`migrate run --workers 4`, `migrate verify`), finalized,
#      each step while both apps run; census after: every row at the
#      target.
#   3. an old reader: a third app whose keyring holds only pay/kek:1
#      blocks the rotation to pay/kek:2 at write-upgrade (exit 75, named);
#      stopped (SIGTERM, it deregisters), it no longer does.  The rotation
#      then runs to finalized as in 2 (`migrate run --mode rewrap
#      --workers 4`).
#   At the end both apps stop on SIGTERM and exit 0 (no read failed), each
#   having read and written; they deregister; every row opens (`migrate
#   verify` complete) and the census shows the target class only.
#   5. a base64 text column (a PostgreSQL text column): a rollout recorded
#      with --encoding base64 from plaintext to format 2, planned through
#      finalized, while an app with --encoding base64 reads and writes
#      (text_rollout in cli_rollout_lib.sh); run before 4.
#   4. a lost connection: an app whose data session the server ends
#      counts one database error (exit 74, no read failed) and reconnects.
#
# Needs the PostgreSQL server programs (initdb, pg_ctl) and psql.
# Usage: KEYSHIFT=path/to/keyshift DEMO_APP=path/to/keyshift-demo-app \
#            tests/cli_rollout_lifecycle_pg_test.sh
# About 25 s under ASan+UBSan on 2 cores.
set -u

. "$(dirname "$0")/cli_lib.sh"
. "$(dirname "$0")/cli_pg_lib.sh"
. "$(dirname "$0")/cli_rollout_lib.sh"
APP=${DEMO_APP:-build/bin/keyshift-demo-app}
START=$SECONDS

[ -x "$APP" ] || { echo "cli_rollout_lifecycle_pg_test: $APP is not built"; exit 1; }
# three apps (two sessions each), migrate's four workers and the test's
# own sessions (every background process joins PIDS, killed on any exit)
pg_lib_start cli_rollout_lifecycle_pg_test 40

ROWS=20000
CTX=(--tenant-column tenant --context 'pay:{id}:card')
# The demo app's options for table pay of the cluster (then --instance).
APPARGS=(--db "$CI" --table pay --column card "${CTX[@]}" --purpose card)
# readers_count_is N: N instances registered in keyshift_readers.
readers_count_is() { [ "$(q "SELECT count(*) FROM keyshift_readers" 2>/dev/null)" = "$1" ]; }
# start_app NAME OUT ARGS...: the demo app as instance NAME in the
# background until signalled, its JSON summary in $T/OUT.json; its pid
# joins PIDS and is left in APP_PID.
start_app() {
    local name=$1 out=$2
    shift 2
    "$APP" "${APPARGS[@]}" --instance "$name" --seconds 3600 --rate 200 --write-percent 20 \
        --reload-ms 200 --json "$@" >"$T/$out.json" 2>"$T/$out.err" &
    APP_PID=$!
    PIDS+=("$APP_PID")
}
# at_class FILE KEY_VERSION: rows of format 1 under pay/kek:KEY_VERSION in
# the census (JSON) in FILE.
at_class() {
    tr '{' '\n' <"$1" | sed -n "s/^\"version\":1,\"algorithm\":\"xchacha20-poly1305\",\"key_id\":\"pay\/kek\",\"key_version\":$2,\"rows\":\([0-9]*\).*/\1/p"
}

"$KS" keys init 2>/dev/null && "$KS" keys create pay/kek 2>/dev/null || { echo "cannot create the keyring"; exit 1; }

# ---- 1. the demo application on PostgreSQL ------------------------------------------
run "--help prints the manual" 0 "$APP" --help
expect_grep "--help: --db takes a connection string" "$T/out" "PostgreSQL connection URI"
expect_grep "--help: the PostgreSQL environment" "$T/out" "PGPASSFILE"
q "CREATE TABLE pay (id bigint PRIMARY KEY, tenant text NOT NULL, card bytea);
   INSERT INTO pay SELECT i, CASE WHEN i % 2 = 1 THEN 'acme' ELSE 'globex' END,
       convert_to(format('{\"id\":%s,\"pan\":\"4111%s\",\"note\":\"%s\"}', i, lpad(i::text, 12, '0'),
                         md5(random()::text)), 'UTF8') FROM generate_series(1, $ROWS) i;
   CREATE TABLE empty_pay (id bigint PRIMARY KEY, tenant text, card bytea);
   CREATE TABLE text_pay (id bigint PRIMARY KEY, tenant text, card text);
   INSERT INTO text_pay VALUES (1, 'acme', 'x');"
run "a password in --db: 64" 64 "$APP" --db "postgresql://u:hunter2@localhost/x" --table pay \
    --column card "${CTX[@]}" --purpose card --instance x --ops 1
expect_grep "a password in --db: says why" "$T/err" "holds a password"
if grep -q hunter2 "$T/err" "$T/out"; then bad "a password in --db: not echoed"; else ok "a password in --db: not echoed"; fi
run "no such table: 66" 66 "$APP" "${APPARGS[@]/pay/nope}" --instance x --ops 1
run "an empty table: 66" 66 "$APP" "${APPARGS[@]/pay/empty_pay}" --instance x --ops 1
run "a column that is not bytea: 64" 64 "$APP" "${APPARGS[@]/pay/text_pay}" --instance x --ops 1
expect_grep "not bytea: says so" "$T/err" "is not bytea"
run "no server: 69" 69 "$APP" --db "host=$T/nosocket dbname=postgres" --table pay --column card \
    "${CTX[@]}" --purpose card --instance x --ops 1
run "a short run with no rollout" 0 "$APP" "${APPARGS[@]}" --instance smoke --ops 300 \
    --write-percent 50 --seed 7 --json
if [ "$(jnum "$T/out" reads_no_rollout)" = 300 ] && [ "$(jnum "$T/out" failed_reads)" = 0 ] &&
    grep -q '"writes":{"plaintext":[1-9]' "$T/out" && [ "$(jnum "$T/out" db_errors)" = 0 ]; then
    ok "no rollout: 300 reads, none failed, plaintext kept as plaintext"
else
    bad "no rollout: the short run's counts" "$(head -c 500 "$T/out")"
fi
readers_count_is 0 && ok "the short run deregistered" || bad "the short run deregistered"
mine=$(q "SELECT count(*) FROM pay WHERE convert_from(card, 'UTF8') LIKE '%\"writer\":\"smoke\"%'")
wrong=$(q "SELECT count(*) FROM pay WHERE convert_from(card, 'UTF8') LIKE '%\"writer\":\"smoke\"%'
           AND convert_from(card, 'UTF8') NOT LIKE '{\"id\":' || id || ',%'")
[ "$mine" -gt 0 ] && [ "$wrong" = 0 ] && ok "its $mine UPDATEs landed on the rows they name (by id)" ||
    bad "the short run's UPDATEs" "$mine rows written, $wrong of another id"

# ---- 2. plaintext -> v1 pay/kek:1 with two apps ------------------------------------
start_app app-1 b1 --seed 11
start_app app-2 b2 --seed 12
APPS=("${PIDS[@]}")
wait_for 20 readers_count_is 2 && ok "lifecycle: both apps registered in the database's keyshift_readers" ||
    bad "lifecycle: apps registered" "$(head -c 300 "$T/b1.err" "$T/b2.err")"
n=$(q "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'keyshift-demo-app'")
[ "$n" = 2 ] && ok "lifecycle: each app has its own data session (application_name keyshift-demo-app)" ||
    bad "lifecycle: the apps' data sessions" "$n"

# lifecycle NAME SOURCE KV HOOK MIGRATE_ARGS...: one rollout from SOURCE
# to v1:xchacha20-poly1305:pay/kek:KV through every phase while the apps
# run; HOOK (a function name, or "") runs in read-compat.  The backfill
# is `migrate run --workers 4` with MIGRATE_ARGS, throttled so that it
# takes a few seconds of the apps' traffic.
lifecycle() {
    local name=$1 source=$2 kv=$3 hook=$4 id i t0=$SECONDS
    shift 4
    local target=v1:xchacha20-poly1305:pay/kek:$kv
    R=(--db "$CI")
    step "$name: start" "$KS" rollout start "${R[@]}" --table pay --column card --source "$source" \
        --target "$target" --min-soak 0 --reader-ttl 5 --min-samples 20 --window 60 \
        "${NO_LATENCY[@]}" --actor lifecycle-pg-test --reason "$name" || return 1
    id=$(grep -o '[0-9][0-9]*' "$T/out" | head -1)
    R+=(--rollout "$id")
    step "$name: advance to read-compat" "$KS" rollout advance "${R[@]}" || return 1
    [ -n "$hook" ] && "$hook"
    step "$name: advance to write-upgrade (every live reader holds the target)" \
        "$KS" rollout advance "${R[@]}" --all || return 1
    "$KS" keys promote pay/kek "$kv" >/dev/null 2>&1
    sleep 1 # the apps see write-upgrade and report samples
    step "$name: advance to backfill (health from the apps)" "$KS" rollout advance "${R[@]}" || return 1
    sleep 1 # every app's policy has refreshed: all of them write the target now
    for i in 1 2 3; do
        step "$name: migrate run --workers 4 (pass $i)" "$KS" migrate run --db "$CI" --table pay \
            --column card "${CTX[@]}" "$@" --to-key "pay/kek:$kv" --workers 4 \
            --max-rows-per-second 5000 --json || return 1
        expect_grep "$name: the run had 4 workers" "$T/out" '"result":"complete".*"workers":4'
        step "$name: migrate verify" "$KS" migrate verify --db "$CI" --table pay --column card \
            "${CTX[@]}" || return 1
        "$KS" rollout advance "${R[@]}" >"$T/out" 2>"$T/err" && break
        [ "$i" = 3 ] && { bad "$name: advance to finalized" "$(head -c 400 "$T/err")"; return 1; }
    done
    ok "$name: finalized ($((SECONDS - t0)) s)"
    "$KS" census --db "$CI" --table pay --column card --json >"$T/census.json"
    n=$(at_class "$T/census.json" "$kv")
    [ "$n" = "$ROWS" ] && ok "$name: census: all $ROWS rows at the target, 0 at the source" ||
        bad "$name: census at the target" "$(cat "$T/census.json")"
    "$KS" rollout status "${R[@]}" >"$T/status" 2>&1 &&
        expect_grep "$name: status says finalized" "$T/status" finalized
}
lifecycle "plaintext -> v1 key 1" plaintext 1 "" --mode encrypt --to-format 1

# ---- 3. an old reader blocks the rotation, then the rotation ----------------------------
cp "$KEYSHIFT_KEYRING" "$T/keyring-old" # holds pay/kek:1 only
chmod 600 "$T/keyring-old"
"$KS" keys add-version pay/kek >/dev/null 2>&1 # version 2: app-1 and app-2 pick it up on reload
start_app old-web old --keyring "$T/keyring-old" --rate 100 --seed 13
OLD=$APP_PID
wait_for 20 readers_count_is 3 && ok "old reader: old-web registered" || bad "old reader: old-web registered"
# old_reader: in read-compat, write-upgrade is refused while old-web is
# live; stopped with SIGTERM it exits 0 and deregisters.
old_reader() {
    run "old reader: write-upgrade refused while old-web is live" 75 "$KS" rollout advance "${R[@]}" --all
    expect_grep "old reader: the refusal names old-web" "$T/err" "old-web"
    kill -TERM "$OLD"
    wait "$OLD"
    local rc=$?
    [ "$rc" = 0 ] && ok "old reader: old-web exits 0 on SIGTERM (read $(jnum "$T/old.json" reads), none failed)" ||
        bad "old reader: old-web exit 0" "exit $rc: $(head -c 300 "$T/old.json" "$T/old.err")"
    readers_count_is 2 && ok "old reader: old-web deregistered" || bad "old reader: old-web deregistered"
}
lifecycle "rotation to key 2" v1:xchacha20-poly1305:pay/kek:1 2 old_reader --mode rewrap
"$KS" keys list --json 2>/dev/null | tr '{' '\n' | grep -q '^"version":1,"state":"decrypt-only"' &&
    ok "finalize moved the old key version 1 to decrypt-only" || bad "key version 1 to decrypt-only"

# ---- the end: both apps stop; every row opens ------------------------------------------
for p in "${APPS[@]}"; do kill -TERM "$p"; done
rcs=""
for p in "${APPS[@]}"; do wait "$p"; rcs+="$? "; done
PIDS=()
[ "$rcs" = "0 0 " ] && ok "both apps exit 0 after SIGTERM: 0 failed reads" ||
    bad "both apps exit 0" "exits $rcs: $(cat "$T/b1.json" "$T/b2.json" "$T/b1.err" "$T/b2.err" | head -c 800)"
for n in 1 2; do
    f=$T/b$n.json
    if [ "$(jnum "$f" failed_reads)" = 0 ] && [ "$(jnum "$f" reads)" -gt 1000 ] &&
        [ "$(jnum "$f" writes_total)" -gt 100 ] && [ "$(jobj "$f" write_failures)" = "{}" ] &&
        [ "$(jnum "$f" db_errors)" = 0 ] && grep -q '"plaintext":[1-9]' "$f" &&
        grep -q '"v1:xchacha20-poly1305:pay/kek:1":[1-9]' "$f" &&
        grep -q '"v1:xchacha20-poly1305:pay/kek:2":[1-9]' "$f"; then
        ok "app-$n read $(jnum "$f" reads) values ($(jnum "$f" reads_envelope) envelopes), none failed; wrote $(jnum "$f" writes_total): plaintext, key 1 and key 2"
    else
        bad "app-$n summary" "$(cat "$f")"
    fi
done
readers_count_is 0 && ok "both apps deregistered" || bad "apps deregistered"
run "every row opens (migrate verify, complete)" 0 "$KS" migrate verify --db "$CI" --table pay \
    --column card "${CTX[@]}" --json
expect_grep "verify: every row checked" "$T/out" "\"checked\":$ROWS"
"$KS" census --db "$CI" --table pay --column card --json >"$T/census.json"
if [ "$(at_class "$T/census.json" 2)" = "$ROWS" ] && grep -q '"plaintext":0' "$T/census.json" &&
    [ "$(tr '{' '\n' <"$T/census.json" | grep -c '"key_version":')" = 1 ]; then
    ok "census: only the target class, all $ROWS rows"
else
    bad "census: only the target class" "$(cat "$T/census.json")"
fi

# ---- 5. a base64 text column -----------------------------------------------------------
q "CREATE TABLE txt (id bigint PRIMARY KEY, tenant text NOT NULL, card text);
   INSERT INTO txt SELECT i, CASE WHEN i % 2 = 1 THEN 'acme' ELSE 'globex' END,
       format('{\"id\":%s,\"pan\":\"4111%s\"}', i, lpad(i::text, 12, '0'))
   FROM generate_series(1, 300) i;"
run "text column: start --encoding base64 on a bytea column: 66" 66 "$KS" rollout start \
    --db "$CI" --table empty_pay --column card --encoding base64 --source plaintext \
    --target v2:xchacha20-poly1305:pay/kek:2
expect_grep "text column: the refusal says what the column needs" "$T/err" "neither text nor varchar"
text_rows() { q "SELECT count(*) FROM txt WHERE card LIKE 'S1NF%'"; }
text_rollout "text column" "$CI" 2 300 text_rows

# ---- 4. a lost connection ----------------------------------------------------------------
# The server ends an app's data session mid-run: the operation that meets
# it fails (a database error: exit 74, no read failed), the next one
# reconnects and the app goes on.
"$APP" "${APPARGS[@]}" --instance flaky --seconds 4 --rate 200 --reload-ms 200 --seed 14 --json \
    >"$T/flaky.json" 2>"$T/flaky.err" &
FLAKY=$!
PIDS+=("$FLAKY")
wait_for 10 readers_count_is 1
sleep 1
killed=$(q "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = 'keyshift-demo-app'")
wait "$FLAKY"
rc=$?
if [ "$killed" = 1 ] && [ "$rc" = 74 ] && [ "$(jnum "$T/flaky.json" failed_reads)" = 0 ] &&
    [ "$(jnum "$T/flaky.json" db_errors)" -ge 1 ] && [ "$(jnum "$T/flaky.json" db_errors)" -le 2 ] &&
    [ "$(jnum "$T/flaky.json" reads)" -gt 300 ]; then
    ok "a lost connection: $(jnum "$T/flaky.json" db_errors) database error, then $(jnum "$T/flaky.json" reads) reads in all, none failed (exit 74)"
else
    bad "a lost connection" "killed $killed, exit $rc: $(head -c 400 "$T/flaky.json" "$T/flaky.err")"
fi
expect_grep "a lost connection: said so" "$T/flaky.err" "connection to the PostgreSQL server was lost"
if grep -q "4111\|KSE" "$T/flaky.err" "$T/b1.err" "$T/b2.err"; then bad "messages carry no row data"; else ok "messages carry no row data"; fi
echo "cli_rollout_lifecycle_pg_test: $((SECONDS - START)) s"
cli_finish cli_rollout_lifecycle_pg_test
