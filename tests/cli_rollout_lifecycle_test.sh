#!/usr/bin/env bash
# tests/cli_rollout_lifecycle_test.sh -- rollouts with real processes: two
# keyshift-demo-app instances read and write a real SQLite file with a real
# keyring while the column is taken through its whole lifecycle
# (docs/rollout.md):
#
#   A. the demo application alone (no `keyshift rollout` needed): usage
#      and exit codes; two instances against a database with NO rollout
#      (the policy's not-found path: every value keeps its form), which
#      register in keyshift_readers, re-register the key versions they
#      hold when the operator adds one (ks_policy_set_keys) and deregister
#      on exit; SIGTERM; a tampered envelope and a too-new format make a
#      failed read (exit 65).
#   B. the lifecycle: plaintext -> v1 under key version 1 -> a rotation to
#      key version 2 -> an upgrade to format v2, each rollout taken through
#      start, read-compat, write-upgrade, backfill (`migrate run`,
#      `migrate verify`) and finalized while both apps run; census after
#      each; at the end both apps stop on SIGTERM and exit 0: no read
#      failed.
#   D. an old reader: a live app holding only the source key version
#      blocks write-upgrade (exit 75, named); killed with SIGKILL, it stops
#      blocking once its heartbeat is older than the reader TTL.
#   E. a threshold trip: envelopes copied over other rows make the app's
#      opens fail; its reported auth failures trip `rollout check
#      --auto-rollback` (exit 1), which moves the rollout back to
#      read-compat (logged automatic); an app then writes the source and
#      still reads the target.
#   F. canary: in write-upgrade for tenant acme only, an app's writes are
#      envelopes for acme's rows and plaintext (the source) for globex's.
#   G. a rollback while `migrate run` works in backfill stops the run
#      before its next batch (the store's write gate), and it resumes once
#      the rollout is back in backfill.
#   H. a key scope: one rollout rotates pay/kek from version 1 to 2 in two
#      tables (pay.card, refunds.card) while an app on each table writes
#      by key (--key-id) and reads; finalize is refused while refunds has
#      rows at the source, then until refunds is verified; both apps exit
#      0: no read failed.
#   I. a base64 text column (a SQLite TEXT column): a rollout recorded with
#      --encoding base64 from plaintext to format 2, planned through
#      finalized, while an app with --encoding base64 reads and writes;
#      migrate run and the app without --encoding base64 are refused (64)
#      (text_rollout in cli_rollout_lib.sh); a key version only base64
#      rows of a migration without a rollout use is not destroyed.
#   C. a smoke run of tools/demo/demo_rollout.sh (the second half of make demo).
#
# Usage: KEYSHIFT=path/to/keyshift DEMO_APP=path/to/keyshift-demo-app \
#            tests/cli_rollout_lifecycle_test.sh
# About 35 s under ASan+UBSan on 2 cores.
set -u

. "$(dirname "$0")/cli_lib.sh"
. "$(dirname "$0")/cli_rollout_lib.sh"
APP=${DEMO_APP:-build/bin/keyshift-demo-app}
unset KEYSHIFT_PASSPHRASE
export KEYSHIFT_KEYRING="$T/keyring"
IN=/dev/null
START=$SECONDS
PIDS=()
# Stop any app still running (by the pids this script started), then
# remove the temporary directory.
cleanup() {
    local p
    for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
    wait 2>/dev/null
    rm -rf "$T"
}
trap cleanup EXIT

command -v sqlite3 >/dev/null || { echo "cli_rollout_lifecycle_test: sqlite3 is missing (tools/deps.sh)"; exit 1; }
[ -x "$APP" ] || { echo "cli_rollout_lifecycle_test: $APP is not built"; exit 1; }

CTX=(--tenant-column tenant --context 'pay:{id}:card')
# The demo app's options for table pay (then --db and --instance).
APPARGS=(--table pay --column card "${CTX[@]}" --purpose card)
# app NAME DB ARGS...: the demo app on table pay of DB as instance NAME
# (in the foreground; background runs call "$APP" itself, so that $! is
# the app's pid).
app() {
    local name=$1 db=$2
    shift 2
    "$APP" --db "$db" "${APPARGS[@]}" --instance "$name" "$@"
}
# make_db DB ROWS: pay(id, tenant, card) with a JSON plaintext per row,
# tenants acme and globex.
make_db() {
    sqlite3 "$1" >/dev/null <<SQL
PRAGMA journal_mode = WAL;
BEGIN;
CREATE TABLE pay (id INTEGER PRIMARY KEY, tenant TEXT NOT NULL, card BLOB);
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < $2)
INSERT INTO pay SELECT i, CASE WHEN i % 2 THEN 'acme' ELSE 'globex' END,
       printf('{"id":%d,"pan":"4111%012d","note":"%s"}', i, i, hex(randomblob(40))) FROM n;
COMMIT;
SQL
}
# seal_row DB ID FORMAT: replace row ID's plaintext with an envelope made
# by `keyshift encrypt` (format 1, or 2 with purpose card).
seal_row() {
    local db=$1 id=$2 f=$3 tenant pt
    tenant=$(sqlite3 "$db" "SELECT tenant FROM pay WHERE id = $id")
    pt=$(sqlite3 "$db" "SELECT card FROM pay WHERE id = $id")
    local purpose=()
    [ "$f" = 2 ] && purpose=(--purpose card)
    printf '%s' "$pt" | "$KS" encrypt --tenant "$tenant" --key-id pay/kek --format "$f" "${purpose[@]}" \
        --context "pay:$id:card" >"$T/row.kse" || return 1
    sqlite3 "$db" "UPDATE pay SET card = X'$(od -An -tx1 -v "$T/row.kse" | tr -d ' \n')' WHERE id = $id"
}
readers_are() { [ "$(sqlite3 "$1" 2>/dev/null "SELECT group_concat(key_versions, ' ') FROM (SELECT key_versions FROM keyshift_readers ORDER BY instance_id)")" = "$2" ]; }
readers_count_is() { [ "$(sqlite3 "$1" 2>/dev/null "SELECT count(*) FROM keyshift_readers")" = "$2" ]; }

"$KS" keys init 2>/dev/null && "$KS" keys create pay/kek 2>/dev/null || { echo "cannot create the keyring"; exit 1; }

# ---- A. the demo application alone --------------------------------------------

run "--help prints the manual" 0 "$APP" --help
expect_grep "--help: synopsis" "$T/out" "SYNOPSIS"
expect_grep "--help: exit status" "$T/out" "EXIT STATUS"
run "no options: usage error" 64 "$APP"
expect_grep "usage error names the program" "$T/err" "^keyshift-demo-app: "
A=$T/a.db
make_db "$A" 300
run "--ops and --seconds together: usage" 64 app x "$A" --ops 1 --seconds 1
run "a context column other than {id}: usage" 64 "$APP" --db "$A" --table pay --column card \
    --tenant-column tenant --context 'pay:{tenant}' --purpose card --instance x
run "bad --write-percent: usage" 64 app x "$A" --write-percent 101
run "no such database: 66" 66 app x "$T/none.db" --ops 1
run "no such column: 66" 66 "$APP" --db "$A" --table pay --column nope --tenant-column tenant \
    --context 'pay:{id}' --purpose card --instance x --ops 1
sqlite3 "$T/empty.db" "CREATE TABLE pay (id INTEGER PRIMARY KEY, tenant TEXT, card BLOB)"
run "empty table: 66" 66 app x "$T/empty.db" --ops 1
# a bare rowid (no INTEGER PRIMARY KEY) is renumbered by VACUUM: {id} refused
sqlite3 "$T/bare.db" "CREATE TABLE pay (tenant TEXT, card BLOB); INSERT INTO pay VALUES ('acme', 'x')"
run "bare rowid with {id}: unstable-id, 64" 64 "$APP" --db "$T/bare.db" --table pay --column card \
    --tenant-column tenant --context 'pay:{id}' --purpose card --instance x --ops 1
expect_grep "bare rowid: says why and how" "$T/err" "no INTEGER PRIMARY KEY.*Give --id-column.*does not bind {id} (unstable-id)"
if [ "$(sqlite3 "$T/bare.db" "SELECT card FROM pay")" = x ]; then ok "bare rowid refused: row unchanged"; else bad "bare rowid refused: row unchanged"; fi
run "bad instance name: usage" 64 app "bad name" "$A" --ops 1

# A sealed keyring: the passphrase is read from a file (sodium_malloc'd).
printf 'correct horse battery\n' >"$T/pass"
chmod 600 "$T/pass"
"$KS" keys init --keyring "$T/sealed" --passphrase-file "$T/pass" 2>/dev/null &&
    "$KS" keys create pay/kek --keyring "$T/sealed" --passphrase-file "$T/pass" 2>/dev/null
make_db "$T/s.db" 20
run "a sealed keyring with --passphrase-file" 0 app x "$T/s.db" --keyring "$T/sealed" \
    --passphrase-file "$T/pass" --ops 100 --write-percent 50
printf 'wrong\n' >"$T/wrong"
run "a sealed keyring with the wrong passphrase: 78" 78 app x "$T/s.db" --keyring "$T/sealed" \
    --passphrase-file "$T/wrong" --ops 1
expect_grep "wrong passphrase: said so" "$T/err" "wrong or missing passphrase"

# Rows 1..10 v1 envelopes, 11..20 v2 envelopes, the rest plaintext.
sealed=1
for i in 1 2 3 4 5 6 7 8 9 10; do seal_row "$A" "$i" 1 || sealed=0; done
for i in 11 12 13 14 15 16 17 18 19 20; do seal_row "$A" "$i" 2 || sealed=0; done
[ "$sealed" = 1 ] && ok "20 rows sealed with keyshift encrypt (v1 and v2)" || bad "rows sealed"

"$APP" --db "$A" "${APPARGS[@]}" --instance app-a1 --seconds 4 --rate 300 --write-percent 30 --reload-ms 200 --seed 1 --json \
    >"$T/a1.json" 2>"$T/a1.err" &
P1=$!
"$APP" --db "$A" "${APPARGS[@]}" --instance app-a2 --seconds 4 --rate 300 --write-percent 30 --reload-ms 200 --seed 2 --json \
    >"$T/a2.json" 2>"$T/a2.err" &
P2=$!
PIDS=("$P1" "$P2")
if wait_for 10 readers_are "$A" "pay/kek:1 pay/kek:1"; then
    ok "both apps registered in keyshift_readers holding pay/kek:1"
else
    bad "both apps registered" "$(sqlite3 "$A" 'SELECT * FROM keyshift_readers' 2>&1)"
fi
"$KS" keys add-version pay/kek >/dev/null 2>&1
if wait_for 10 readers_are "$A" "pay/kek:1,pay/kek:2 pay/kek:1,pay/kek:2"; then
    ok "after keys add-version both apps re-registered holding pay/kek:1,pay/kek:2"
else
    bad "apps re-registered the new key version" "$(sqlite3 "$A" 'SELECT * FROM keyshift_readers' 2>&1)"
fi
wait "$P1"; rc1=$?
wait "$P2"; rc2=$?
PIDS=()
[ "$rc1" = 0 ] && [ "$rc2" = 0 ] && ok "no rollout: both apps exit 0" ||
    bad "no rollout: both apps exit 0" "exit $rc1 / $rc2: $(head -c 300 "$T/a1.err" "$T/a2.err")"
for f in "$T/a1.json" "$T/a2.json"; do
    n=$(jnum "$f" reads)
    if [ -n "$n" ] && [ "$n" -gt 100 ] && [ "$(jnum "$f" reads_no_rollout)" = "$n" ] &&
        [ "$(jnum "$f" failed_reads)" = 0 ] && [ "$(jnum "$f" key_changes)" = 1 ] &&
        [ "$(jnum "$f" writes_total)" -gt 10 ] && [ "$(jobj "$f" write_failures)" = "{}" ]; then
        ok "no rollout: $(basename "$f" .json) read $n values with no rollout, none failed, wrote $(jnum "$f" writes_total)"
    else
        bad "no rollout: $(basename "$f") counts" "$(cat "$f")"
    fi
done
expect_grep "writes kept plaintext as plaintext" "$T/a1.json" '"writes":{[^}]*"plaintext":'
cat "$T/a1.json" "$T/a2.json" >"$T/a.json"
expect_grep "writes kept v1 envelopes in their class" "$T/a.json" '"v1:xchacha20-poly1305:pay/kek:1":'
expect_grep "writes kept v2 envelopes in their class" "$T/a.json" '"v2:xchacha20-poly1305:pay/kek:1":'
if grep -q 'KSE\|pan\|4111' "$T/a.json" "$T/a1.err" "$T/a2.err"; then
    bad "the summary and messages carry no plaintext" "$(grep -h 'KSE\|pan\|4111' "$T/a.json" | head -c 200)"
else
    ok "the summary and messages carry no plaintext"
fi
readers_count_is "$A" 0 && ok "both apps deregistered on exit" || bad "apps deregistered"
"$KS" census --db "$A" --table pay --column card --json >"$T/census.json"
expect_grep "census: still 20 envelopes, the rest plaintext" "$T/census.json" '"plaintext":280,"envelopes":20'
run "every envelope, the apps' included, opens (migrate verify)" 0 \
    "$KS" migrate verify --db "$A" --table pay --column card "${CTX[@]}"

# SIGTERM: the current operation finishes, the summary is printed, exit 0.
"$APP" --db "$A" "${APPARGS[@]}" --instance app-a3 --rate 200 >"$T/a3.out" 2>"$T/a3.err" &
P3=$!
PIDS=("$P3")
wait_for 10 readers_count_is "$A" 1
sleep 0.5
kill -TERM "$P3"
wait "$P3"; rc=$?
PIDS=()
[ "$rc" = 0 ] && ok "SIGTERM: exit 0" || bad "SIGTERM: exit 0" "exit $rc: $(head -c 300 "$T/a3.err")"
expect_grep "SIGTERM: the summary is printed" "$T/a3.out" "result: 0 failed reads"
readers_count_is "$A" 0 && ok "SIGTERM: deregistered" || bad "SIGTERM: deregistered"

# A tampered envelope (last byte of the tag flipped) is a failed read.
hx=$(sqlite3 "$A" "SELECT hex(card) FROM pay WHERE id = 3")
last=${hx: -2}
flip=$(printf '%02X' $((0x$last ^ 1)))
sqlite3 "$A" "UPDATE pay SET card = X'${hx:0:${#hx}-2}$flip' WHERE id = 3"
run "a tampered envelope: exit 65" 65 app app-a4 "$A" --ops 3000 --write-percent 0 --seed 3 --json
expect_grep "a tampered envelope: counted as auth-failed" "$T/out" '"open_failures":{"auth-failed":[1-9]'
run "format 2 envelopes with --max-format 1: exit 65" 65 app app-a5 "$A" --ops 3000 \
    --write-percent 0 --seed 4 --max-format 1 --json
expect_grep "--max-format 1: counted as unsupported-version" "$T/out" '"unsupported-version":[1-9]'

# ---- B. the lifecycle ------------------------------------------------------------

B=$T/b.db
ROWS=2000
make_db "$B" "$ROWS"
rm -f "$KEYSHIFT_KEYRING"
"$KS" keys init 2>/dev/null && "$KS" keys create pay/kek 2>/dev/null
for n in 1 2; do
    "$APP" --db "$B" "${APPARGS[@]}" --instance "app-b$n" --seconds 3600 --rate 150 --write-percent 20 --reload-ms 200 --seed "1$n" \
        --json >"$T/b$n.json" 2>"$T/b$n.err" &
    PIDS+=($!)
done
wait_for 20 readers_count_is "$B" 2 && ok "lifecycle: both apps registered" || bad "lifecycle: apps registered"

# stop_apps NAME X MIN_READS CLASS: SIGTERM the two apps of $PIDS (their
# summaries in $T/X1.json and $T/X2.json); both must exit 0 (no read
# failed), each must have read more than MIN_READS values with no failed
# write, and written CLASS.
stop_apps() {
    local name=$1 x=$2 min=$3 class=$4 p n f rcs=""
    for p in "${PIDS[@]}"; do kill -TERM "$p"; done
    for p in "${PIDS[@]}"; do wait "$p"; rcs+="$? "; done
    PIDS=()
    [ "$rcs" = "0 0 " ] && ok "$name: both apps exit 0 after SIGTERM: no read failed" ||
        bad "$name: both apps exit 0" "exits $rcs: $(cat "$T/${x}1.json" "$T/${x}2.json" | head -c 600)"
    for n in 1 2; do
        f=$T/$x$n.json
        if [ "$(jnum "$f" failed_reads)" = 0 ] && [ "$(jnum "$f" reads)" -gt "$min" ] &&
            [ "$(jobj "$f" write_failures)" = "{}" ] && grep -q "\"$class\":" "$f"; then
            ok "$name: app-$x$n read $(jnum "$f" reads) values, none failed; it wrote $class"
        else
            bad "$name: app-$x$n summary" "$(cat "$f")"
        fi
    done
}
# at_class FILE VERSION KEY_VERSION: rows in the census (JSON) of that class.
at_class() {
    tr '{' '\n' <"$1" | sed -n "s/^\"version\":$2,\"algorithm\":\"xchacha20-poly1305\",\"key_id\":\"pay\/kek\",\"key_version\":$3,\"rows\":\([0-9]*\).*/\1/p"
}
# lifecycle NAME SOURCE TARGET F KV MIGRATE_ARGS... -- VERIFY_ARGS...: one rollout
# from SOURCE to TARGET (format F, key version KV) through every phase.
lifecycle() {
    local name=$1 source=$2 target=$3 f=$4 kv=$5 id i
    shift 5
    local mig=() ver=()
    while [ "$#" -gt 0 ] && [ "$1" != -- ]; do mig+=("$1"); shift; done
    shift
    ver=("$@")
    R=(--db "$B")
    step "$name: start" "$KS" rollout start "${R[@]}" --table pay --column card --source "$source" \
        --target "$target" --min-soak 0 --reader-ttl 5 --min-samples 20 --window 60 \
        "${NO_LATENCY[@]}" --actor lifecycle-test --reason "$name" || return 1
    id=$(grep -o '[0-9][0-9]*' "$T/out" | head -1)
    step "$name: advance to read-compat" "$KS" rollout advance "${R[@]}" --rollout "$id" || return 1
    step "$name: advance to write-upgrade (every live reader holds the target)" \
        "$KS" rollout advance "${R[@]}" --rollout "$id" --all || return 1
    # Every live reader holds the target now (the guard said so): promote
    # it, as an operator would, so that key-default tools write it too and
    # the source can later become decrypt-only.
    "$KS" keys promote pay/kek "$kv" >/dev/null 2>&1
    sleep 1 # the apps see write-upgrade and report samples
    step "$name: advance to backfill (health from the apps)" \
        "$KS" rollout advance "${R[@]}" --rollout "$id" || return 1
    sleep 1 # every app's policy has refreshed: all of them write the target now
    for i in 1 2 3; do
        step "$name: migrate run (pass $i)" "$KS" migrate run "${R[@]}" --table pay --column card \
            "${CTX[@]}" "${mig[@]}" || return 1
        step "$name: migrate verify" "$KS" migrate verify "${R[@]}" --table pay --column card \
            "${CTX[@]}" "${ver[@]}" || return 1
        "$KS" rollout advance "${R[@]}" --rollout "$id" >"$T/out" 2>"$T/err" && break
        [ "$i" = 3 ] && { bad "$name: advance to finalized" "$(head -c 400 "$T/err")"; return 1; }
    done
    ok "$name: finalized"
    "$KS" census "${R[@]}" --table pay --column card --json >"$T/census.json"
    n=$(at_class "$T/census.json" "$f" "$kv")
    [ "$n" = "$ROWS" ] && ok "$name: census: all $ROWS rows at the target, 0 at the source" ||
        bad "$name: census at the target" "$(cat "$T/census.json")"
    "$KS" rollout status "${R[@]}" --rollout "$id" >"$T/status" 2>&1 &&
        expect_grep "$name: status says finalized" "$T/status" finalized
}

lifecycle "plaintext -> v1 key 1" plaintext v1:xchacha20-poly1305:pay/kek:1 1 1 \
    --mode encrypt --to-key pay/kek:1 --to-format 1 --
"$KS" keys add-version pay/kek >/dev/null 2>&1 # version 2: the apps pick it up on reload
lifecycle "rotation to key 2" v1:xchacha20-poly1305:pay/kek:1 v1:xchacha20-poly1305:pay/kek:2 1 2 \
    --mode rewrap --to-key pay/kek:2 --
"$KS" keys list --json 2>/dev/null | tr '{' '\n' | grep -q '^"version":1,"state":"decrypt-only"' &&
    ok "finalize moved the old key version 1 to decrypt-only" || bad "key version 1 to decrypt-only" "$("$KS" keys list 2>&1 | head -c 300)"
# The format upgrade re-encrypts format-1 envelopes into format 2 with a
# purpose: the engine opens the old envelopes without one (format 1 has
# none) and checks it on the new ones.
lifecycle "upgrade to format v2" v1:xchacha20-poly1305:pay/kek:2 v2:xchacha20-poly1305:pay/kek:2 2 2 \
    --mode reencrypt --to-key pay/kek:2 --to-format 2 --purpose card -- --purpose card

stop_apps lifecycle b 500 v2:xchacha20-poly1305:pay/kek:2
readers_count_is "$B" 0 && ok "lifecycle: both apps deregistered" || bad "lifecycle: apps deregistered"

# ---- D. an old reader blocks write-upgrade until its heartbeat expires -----------------
# A real application process that holds only pay/kek:1 (its keyring copy
# predates version 2) keeps a rollout to pay/kek:2 out of write-upgrade;
# once it dies without deregistering (SIGKILL) and its heartbeat is older
# than the reader TTL, the same transition is allowed.
D=$T/d.db
make_db "$D" 300
export KEYSHIFT_KEYRING="$T/keyring-d"
"$KS" keys init 2>/dev/null && "$KS" keys create pay/kek 2>/dev/null
cp "$KEYSHIFT_KEYRING" "$T/keyring-old"
chmod 600 "$T/keyring-old"
"$KS" keys add-version pay/kek >/dev/null 2>&1
"$APP" --db "$D" "${APPARGS[@]}" --instance old-web --keyring "$T/keyring-old" --seconds 3600 \
    --rate 100 --write-percent 10 --reload-ms 200 --json >"$T/old.json" 2>"$T/old.err" &
OLD=$!
PIDS+=($OLD)
"$APP" --db "$D" "${APPARGS[@]}" --instance new-web --seconds 3600 --rate 150 --write-percent 20 \
    --reload-ms 200 --json >"$T/new.json" 2>"$T/new.err" &
PIDS+=($!)
wait_for 20 readers_count_is "$D" 2 && ok "old reader: both apps registered" || bad "old reader: apps registered"
R=(--db "$D" --table pay --column card)
run "old reader: start a rollout to pay/kek:2" 0 "$KS" rollout start "${R[@]}" --source plaintext \
    --target v1:xchacha20-poly1305:pay/kek:2 --min-soak 0 --reader-ttl 2 --min-samples 20 \
    --max-auth-failure-rate 0.01 "${NO_LATENCY[@]}" --window 60
run "old reader: advance to read-compat" 0 "$KS" rollout advance "${R[@]}"
run "old reader: write-upgrade refused while old-web is live" 75 "$KS" rollout advance "${R[@]}" --all
expect_grep "old reader: the refusal names the old reader" "$T/err" "old-web"
kill -KILL "$OLD"
{ wait "$OLD"; } 2>/dev/null # no "Killed" notice
sleep 3 # past the 2 s reader TTL: old-web's last heartbeat expires
run "old reader: write-upgrade allowed once its heartbeat expired" 0 "$KS" rollout advance "${R[@]}" --all

# ---- E. a threshold trip rolls writes back to the source -------------------------------
# new-web writes pay/kek:2 envelopes in write-upgrade.  Copying one row's
# envelope over 100 others makes their opens fail (the context binds the
# row id): new-web reports the auth failures, `rollout check
# --auto-rollback` trips and moves the rollout back to read-compat, where
# writes go to the source again while the target stays readable.  (The
# rollout's latency checks are off, so only the auth failures can trip.)
sleep 2
env_id=$(sqlite3 "$D" "SELECT id FROM pay WHERE hex(substr(card, 1, 3)) = '4B5345' LIMIT 1")
if [ -n "$env_id" ]; then ok "threshold: new-web wrote target envelopes"; else bad "threshold: no envelope written"; fi
sqlite3 -cmd ".timeout 10000" "$D" "CREATE TABLE bak AS SELECT id, card FROM pay WHERE id != ${env_id:-0} LIMIT 100;
UPDATE pay SET card = (SELECT card FROM pay WHERE id = ${env_id:-0}) WHERE id IN (SELECT id FROM bak);"
check_trips "${R[@]}"
rc=$?
if [ "$rc" = 1 ]; then ok "threshold: check --auto-rollback tripped and rolled back (exit 1)"; else bad "threshold: check exit" "exit $rc: $(head -c 300 "$T/check.json") $(head -c 200 "$T/check.err")"; fi
expect_tripped "threshold: the auth-failure rate tripped" auth-failure-rate "$T/check.json"
"$KS" rollout status "${R[@]}" --json >"$T/st.json" 2>&1
expect_grep "threshold: back in read-compat" "$T/st.json" '"phase":"read-compat"'
"$KS" rollout log "${R[@]}" --json >"$T/log.json" 2>&1
expect_grep "threshold: the rollback is logged as automatic" "$T/log.json" '"automatic":true'
sqlite3 -cmd ".timeout 10000" "$D" "UPDATE pay SET card = (SELECT card FROM bak WHERE bak.id = pay.id) WHERE id IN (SELECT id FROM bak);"
sleep 1 # new-web's policy refreshes
run "threshold: after the rollback an app writes the source and reads the target" 0 \
    app late-web "$D" --ops 400 --write-percent 50 --seed 9 --json
if grep -q '"writes":{"plaintext":[1-9][0-9]*}' "$T/out" && [ "$(jnum "$T/out" reads_refused)" = 0 ] &&
    [ "$(jnum "$T/out" reads_envelope)" -gt 0 ]; then
    ok "threshold: late-web wrote only plaintext (the source) and read target envelopes"
else
    bad "threshold: late-web after the rollback" "$(head -c 500 "$T/out")"
fi
for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
wait 2>/dev/null
PIDS=()
export KEYSHIFT_KEYRING="$T/keyring"

# ---- F. canary: only the listed tenants write the target ------------------------------
F=$T/f.db
make_db "$F" 300
R=(--db "$F" --table pay --column card)
run "canary: start" 0 "$KS" rollout start "${R[@]}" --source plaintext \
    --target v1:xchacha20-poly1305:pay/kek:2 --min-soak 0 --reader-ttl 5
run "canary: advance to read-compat" 0 "$KS" rollout advance "${R[@]}"
run "canary: advance to write-upgrade for tenant acme only" 0 "$KS" rollout advance "${R[@]}" --tenants acme
run "canary: an app rewrites rows of both tenants" 0 app canary-web "$F" --ops 600 --write-percent 100 --seed 5 --json
acme_env=$(sqlite3 "$F" "SELECT count(*) FROM pay WHERE tenant = 'acme' AND hex(substr(card, 1, 3)) = '4B5345'")
globex_env=$(sqlite3 "$F" "SELECT count(*) FROM pay WHERE tenant = 'globex' AND hex(substr(card, 1, 3)) = '4B5345'")
globex_app=$(sqlite3 "$F" "SELECT count(*) FROM pay WHERE tenant = 'globex' AND card LIKE '%\"writer\":\"canary-web\"%'")
if [ "$acme_env" -gt 0 ] && [ "$globex_env" = 0 ] && [ "$globex_app" -gt 0 ]; then
    ok "canary: acme wrote the target ($acme_env envelopes), globex the source ($globex_app plaintext writes, 0 envelopes)"
else
    bad "canary: who wrote the target" "acme envelopes $acme_env, globex envelopes $globex_env, globex app writes $globex_app"
fi

# ---- G. a rollback stops a running migration before its next batch --------------------
# gate_race NAME PID DB TABLE ERRFILE ROLLOUT-SELECTION...: once the migrate run
# in the background (PID) has committed batches of TABLE (a running
# checkpoint: earlier, complete migrations of TABLE do not count), roll its rollout
# back to read-compat, then expect the run to stop before its next batch:
# exit 75, saying why (the store's write gate).
migration_started() {
    [ "$(sqlite3 "$1" "SELECT coalesce(max(done), 0) FROM keyshift_migration WHERE tbl = '$2' AND state = 'running'" 2>/dev/null)" -gt 0 ] 2>/dev/null
}
gate_race() {
    local name=$1 pid=$2 db=$3 tbl=$4 err=$5 rc
    shift 5
    wait_for 20 migration_started "$db" "$tbl" || bad "$name: the migration did not start"
    run "$name: roll back to read-compat while migrate runs" 0 "$KS" rollout rollback "$@" --reason "stop the backfill"
    wait "$pid"
    rc=$?
    if [ "$rc" = 75 ] && grep -q "the rollout left backfill" "$err"; then
        ok "$name: the running migration stopped before its next batch (exit 75, says why)"
    else
        bad "$name: migration stopped by the rollback" "exit $rc: $(head -c 300 "$err")"
    fi
}
G=$T/g.db
make_db "$G" 2000
R=(--db "$G" --table pay --column card)
GMIG=(migrate run "${R[@]}" "${CTX[@]}" --mode encrypt --to-key pay/kek:2 --to-format 1 --batch-size 100)
# no application reports here: every health check is disabled (a check
# left enabled would have no data, which is never healthy)
run "gate: start" 0 "$KS" rollout start "${R[@]}" --source plaintext \
    --target v1:xchacha20-poly1305:pay/kek:2 --min-soak 0 --reader-ttl 5 --min-samples 0 \
    --max-auth-failure-rate -1 --max-parse-error-rate -1 --max-provider-error-rate -1 \
    --max-seal-p99-us 0 --max-open-p99-us 0
for ph in read-compat write-upgrade backfill; do run "gate: advance to $ph" 0 "$KS" rollout advance "${R[@]}"; done
"$KS" "${GMIG[@]}" --max-rows-per-second 300 >"$T/g.out" 2>"$T/g.err" &
gate_race "gate" $! "$G" pay "$T/g.err" "${R[@]}"
genv=$(sqlite3 "$G" "SELECT count(*) FROM pay WHERE hex(substr(card, 1, 3)) = '4B5345'")
gdone=$(sqlite3 "$G" "SELECT done FROM keyshift_migration")
if [ "$genv" = "$gdone" ] && [ "$genv" -gt 0 ] && [ "$genv" -lt 2000 ]; then
    ok "gate: $genv rows written before the rollback, none after (checkpoint matches)"
else
    bad "gate: rows written around the rollback" "envelopes $genv, checkpoint done $gdone"
fi
run "gate: migrate refused in read-compat" 78 "$KS" "${GMIG[@]}"
for ph in write-upgrade backfill; do run "gate: advance to $ph again" 0 "$KS" rollout advance "${R[@]}"; done
run "gate: the migration resumes and completes" 0 "$KS" "${GMIG[@]}"
expect_eq "gate: every row at the target" <(sqlite3 "$G" "SELECT count(*) FROM pay WHERE hex(substr(card, 1, 3)) = '4B5345'") "2000"

# ---- H. a key scope: rotate pay/kek in two tables at once ----------------------------
H=$T/h.db
make_db "$H" 1000
sqlite3 "$H" "CREATE TABLE refunds (id INTEGER PRIMARY KEY, tenant TEXT NOT NULL, card BLOB);
INSERT INTO refunds SELECT * FROM pay;"
export KEYSHIFT_KEYRING="$T/keyring-h"
"$KS" keys init 2>/dev/null && "$KS" keys create pay/kek 2>/dev/null
CTX_R=(--tenant-column tenant --context 'refunds:{id}:card')
run "key scope: encrypt pay.card under pay/kek:1 (no rollout)" 0 "$KS" migrate run --db "$H" \
    --table pay --column card "${CTX[@]}" --mode encrypt --to-key pay/kek:1 --to-format 1
run "key scope: encrypt refunds.card under pay/kek:1 (no rollout)" 0 "$KS" migrate run --db "$H" \
    --table refunds --column card "${CTX_R[@]}" --mode encrypt --to-key pay/kek:1 --to-format 1
"$KS" keys add-version pay/kek >/dev/null 2>&1 # version 2, held by the apps from the start
"$APP" --db "$H" "${APPARGS[@]}" --key-id pay/kek --instance app-h1 --seconds 3600 --rate 150 \
    --write-percent 20 --reload-ms 200 --seed 21 --json >"$T/h1.json" 2>"$T/h1.err" &
PIDS+=($!)
"$APP" --db "$H" --table refunds --column card "${CTX_R[@]}" --purpose card --key-id pay/kek \
    --instance app-h2 --seconds 3600 --rate 150 --write-percent 20 --reload-ms 200 --seed 22 \
    --json >"$T/h2.json" 2>"$T/h2.err" &
PIDS+=($!)
wait_for 20 readers_count_is "$H" 2 && ok "key scope: both apps registered" || bad "key scope: apps registered"
R=(--db "$H" --key-id pay/kek)
step "key scope: start over pay.card and refunds.card" "$KS" rollout start --db "$H" --key-id pay/kek \
    --columns pay.card,refunds.card --source v1:xchacha20-poly1305:pay/kek:1 \
    --target v1:xchacha20-poly1305:pay/kek:2 --min-soak 0 --reader-ttl 5 --min-samples 20 \
    --window 60 --actor lifecycle-test --reason "rotate pay/kek in two tables"
step "key scope: advance to read-compat" "$KS" rollout advance "${R[@]}"
step "key scope: advance to write-upgrade" "$KS" rollout advance "${R[@]}" --all
"$KS" keys promote pay/kek 2 >/dev/null 2>&1
sleep 1 # the apps see write-upgrade and report samples
step "key scope: advance to backfill (health from both apps)" "$KS" rollout advance "${R[@]}"
sleep 1 # both apps' policies have refreshed: they write pay/kek:2 now
# a rollback stops a running key-scoped migration before its next batch (the write gate)
HMIG=(migrate run --db "$H" --table refunds --column card "${CTX_R[@]}" --mode rewrap --to-key pay/kek:2)
"$KS" "${HMIG[@]}" --max-rows-per-second 200 --batch-size 50 >"$T/hg.out" 2>"$T/hg.err" &
gate_race "key scope gate" $! "$H" refunds "$T/hg.err" "${R[@]}"
run "key scope gate: migrate refused in read-compat" 78 "$KS" "${HMIG[@]}"
step "key scope: advance to write-upgrade again" "$KS" rollout advance "${R[@]}" --all
sleep 1
step "key scope: advance to backfill again" "$KS" rollout advance "${R[@]}"
sleep 1
step "key scope: migrate run pay.card" "$KS" migrate run --db "$H" --table pay --column card \
    "${CTX[@]}" --mode rewrap --to-key pay/kek:2
step "key scope: migrate verify pay.card" "$KS" migrate verify --db "$H" --table pay --column card "${CTX[@]}"
run "key scope: finalize refused while refunds.card has rows at the source" 75 \
    "$KS" rollout advance "${R[@]}"
expect_grep "key scope: the refusal counts the rows left" "$T/err" "still at the source"
step "key scope: migrate run refunds.card (resumes the stopped run)" "$KS" "${HMIG[@]}"
# rows the apps wrote at the source while rolled back, behind the resumed cursor: a catch-up pass
step "key scope: migrate run refunds.card again (catch-up pass)" "$KS" "${HMIG[@]}"
run "key scope: finalize refused until refunds.card is verified" 75 "$KS" rollout advance "${R[@]}"
expect_grep "key scope: the refusal names the column" "$T/err" "for 1 of 2 columns: refunds.card"
step "key scope: migrate verify refunds.card" "$KS" migrate verify --db "$H" --table refunds \
    --column card "${CTX_R[@]}"
step "key scope: advance to finalized" "$KS" rollout advance "${R[@]}"
for tb in pay refunds; do
    n=$(sqlite3 "$H" "SELECT count(*) FROM $tb WHERE hex(substr(card, 1, 3)) = '4B5345'")
    "$KS" census --db "$H" --table "$tb" --column card --json >"$T/census.json"
    [ "$(at_class "$T/census.json" 1 2)" = 1000 ] && [ "$n" = 1000 ] &&
        ok "key scope: census of $tb.card: all 1000 rows at pay/kek:2" ||
        bad "key scope: census of $tb.card" "$(cat "$T/census.json")"
done
"$KS" rollout status "${R[@]}" --json >"$T/st.json" 2>&1
expect_grep "key scope: status shows the finalized key scope" "$T/st.json" '"scope":"key","key_id":"pay/kek","columns":\[{"table":"pay","column":"card"'
stop_apps "key scope" h 200 v1:xchacha20-poly1305:pay/kek:2
export KEYSHIFT_KEYRING="$T/keyring"

# ---- I. a base64 text column ----------------------------------------------------------
I=$T/i.db
sqlite3 "$I" >/dev/null <<SQL
PRAGMA journal_mode = WAL;
CREATE TABLE txt (id INTEGER PRIMARY KEY, tenant TEXT NOT NULL, card TEXT);
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 300)
INSERT INTO txt SELECT i, CASE WHEN i % 2 THEN 'acme' ELSE 'globex' END,
       printf('{"id":%d,"pan":"4111%012d"}', i, i) FROM n;
SQL
export KEYSHIFT_KEYRING="$T/keyring-i"
"$KS" keys init 2>/dev/null && "$KS" keys create pay/kek 2>/dev/null
text_rows() { sqlite3 "$I" "SELECT count(*) FROM txt WHERE typeof(card) = 'text' AND card LIKE 'S1NF%'"; }
text_rollout "text column" "$I" 1 300 text_rows
# A version that only base64 rows of a migration without a rollout use is
# still referenced: keys set-state ... destroyed counts both forms.
sqlite3 "$I" "CREATE TABLE txt2 (id INTEGER PRIMARY KEY, tenant TEXT NOT NULL, card TEXT);
INSERT INTO txt2 SELECT id, tenant, printf('{\"id\":%d}', id) FROM txt WHERE id <= 20;"
"$KS" keys add-version pay/kek >/dev/null 2>&1 # version 2, not the primary
run "text column: migrate run --encoding base64 with no rollout" 0 "$KS" migrate run --db "$I" \
    --table txt2 --column card --tenant-column tenant --context 'txt2:{id}:card' --mode encrypt \
    --to-key pay/kek:2 --encoding base64
run "text column: destroy refused while base64 rows use the version" 75 "$KS" keys set-state \
    pay/kek 2 destroyed --db "$I"
expect_grep "text column: the refusal counts the base64 rows" "$T/err" "20 rows of txt2.card"
export KEYSHIFT_KEYRING="$T/keyring"

# ---- C. the phase-by-phase demo of `make demo` --------------------------------------
DEMO_ROWS=2000 DEMO_DIR="$T/demo" run "demo_rollout smoke (2000 rows)" 0 \
    "$(dirname "$0")/../tools/demo/demo_rollout.sh" "$KS" "$APP"
expect_grep "demo_rollout: the application saw no failed read" "$T/out" "result: 0 failed reads"
echo "cli_rollout_lifecycle_test: $((SECONDS - START)) s"
cli_finish cli_rollout_lifecycle_test
