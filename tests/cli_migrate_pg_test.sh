#!/usr/bin/env bash
# tests/cli_migrate_pg_test.sh -- end-to-end tests of `keyshift census` and
# `keyshift migrate run|status|verify` with a PostgreSQL --db, on a
# throw-away cluster of tests/pg_cluster.sh (a Unix socket in a mktemp
# directory, stopped and removed on any exit): the SQLite tests of
# tests/cli_migrate_test.sh that apply (census counts, encrypt, rewrap and
# reencrypt checked with `keyshift decrypt`, idempotent reruns, status in
# text and JSON, verify clean and with a moved envelope, quarantine of a
# corrupted envelope and the failure threshold, a mistaken rewrap
# (no --context) then the corrected one retrying its quarantined rows,
# quarantine list and release, pause on SIGINT and
# resume, a parameter mismatch, a text and a varchar column of base64
# envelopes with --encoding base64), and what PostgreSQL adds: a password in
# --db refused (64), --synchronous refused (64), an unreachable server
# (69), kill -9 mid-run then resume (the checkpoint matches the data),
# rows changed by another connection during the run raced and redone in
# a catch-up pass, a lock held past --busy-timeout (75, then rerun), a
# rollout's lifecycle kept in the same database (start, read-compat,
# write-upgrade, backfill with migrate run gated on the phase, a recorded
# verify, finalize; the log append-only), and the cluster stopped mid-run (a clean exit 69: the
# store maps a lost connection to 69, docs/migration.md) then
# started again, the rerun completing from the checkpoint.
#
# Needs the PostgreSQL server programs (initdb, pg_ctl) and psql.
# Usage: KEYSHIFT=path/to/keyshift tests/cli_migrate_pg_test.sh
set -u

. "$(dirname "$0")/cli_lib.sh"
. "$(dirname "$0")/cli_pg_lib.sh"

# the other session of a test, stopped on any exit
pg_lib_hook() { [ -n "${wpid:-}" ] && kill "$wpid" 2>/dev/null; }
pg_lib_start cli_migrate_pg_test

# card_hex TABLE ID: the card of row ID as hex.
card_hex() { q "SELECT encode(card, 'hex') FROM $1 WHERE id = $2"; }

# check_sample TABLE N NAME: N random rows of TABLE (context pay:ID:card)
# decrypt to their original plaintext.
check_sample() {
    local i id wrong="" checked=0 max
    max=$(q "SELECT max(id) FROM $1_orig")
    for ((i = 0; i < $2; i++)); do
        id=$(((RANDOM * 32768 + RANDOM) % max + 1))
        checked=$((checked + 1))
        if [ "$(open_hex "$(card_hex "$1" "$id")" "$id" 2>/dev/null)" != \
             "$(q "SELECT convert_from(card, 'UTF8') FROM $1_orig WHERE id = $id")" ]; then
            wrong+=" $id"
        fi
    done
    if [ -z "$wrong" ]; then ok "$3: $checked sampled rows decrypt to their original plaintext"
    else bad "$3: sampled rows decrypt to their original plaintext" "wrong:$wrong"; fi
}

# no_plaintext TABLE NAME: no row of TABLE still holds its original value
# and every non-NULL card is an envelope.
no_plaintext() {
    local n
    n=$(q "SELECT count(*) FROM $1 t JOIN $1_orig o USING (id)
           WHERE t.card = o.card OR substring(t.card FROM 1 FOR 3) <> 'KSE'::bytea")
    if [ "$n" = 0 ]; then ok "$2: no plaintext left"; else bad "$2: no plaintext left" "$n rows"; fi
}

# status_field TABLE NAME: field NAME of TABLE.card's checkpoint.
status_field() {
    "$KS" migrate status --db "$CI" --table "$1" --column card --json >"$T/st" 2>"$T/st.err"
    json_field "$T/st" "$2"
}

run "keys init" 0 "$KS" keys init
run "keys create" 0 "$KS" keys create payments/kek
CTX=(--context 'pay:{id}:card' --purpose card --tenant-column tenant)

# ---- help and usage -----------------------------------------------------------------
run "migrate --help" 0 "$KS" migrate --help
expect_grep "migrate --help: a PostgreSQL URI for --db" "$T/out" "postgresql://"
expect_grep "migrate --help: ENVIRONMENT names PGPASSFILE" "$T/out" "PGPASSFILE, PGPASSWORD"
expect_grep "migrate --help: 69 for a database gone away" "$T/out" "PostgreSQL database unreachable"
run "census --help" 0 "$KS" census --help
expect_grep "census --help: a PostgreSQL URI for --db" "$T/out" "postgresql://"
expect_grep "census --help: ENVIRONMENT" "$T/out" "^ENVIRONMENT"
run "keyshift --help" 0 "$KS" --help
expect_grep "keyshift --help: 69 covers PostgreSQL" "$T/out" "PostgreSQL database"
sock="${CI#host=}"
sock="${sock%% *}"
URI="postgresql://$(id -un)@/postgres?host=$sock"
[ "$(id -u)" -eq 0 ] && URI="postgresql://${KS_PG_USER:-keyshift-test}@/postgres?host=$sock"
run "password in a URI: refused" 64 "$KS" census --db "${URI/@/:hunter2@}" --table t --column v
expect_grep "password refused: says PGPASSFILE" "$T/err" "PGPASSFILE"
if grep -q hunter2 "$T/err" "$T/out"; then bad "password refused: not echoed"; else ok "password refused: not echoed"; fi
run "password= keyword: refused" 64 "$KS" migrate status --db "$CI password=hunter2"
if grep -q hunter2 "$T/err" "$T/out"; then bad "password= refused: not echoed"; else ok "password= refused: not echoed"; fi
run "password in a URI query: refused" 64 "$KS" migrate verify --db "$URI&password=hunter2" --table t --column v --tenant acme
run "a bad connection string: 64" 64 "$KS" census --db "host='unterminated" --table t --column v
run "unreachable server: 69" 69 "$KS" census --db "host=$T/nosock dbname=postgres" --table t --column v
expect_grep "unreachable: says it cannot connect" "$T/err" "cannot connect"
run "a path with '=' stays a SQLite file" 66 "$KS" census --db "$T/host=x.db" --table t --column v
expect_grep "a path with '=': no such database" "$T/err" "no such database"
run "./dbname=... stays a SQLite file" 66 "$KS" census --db "./dbname=nosuch.db" --table t --column v
run "--synchronous with PostgreSQL: refused" 64 "$KS" migrate run --db "$CI" --table t --column v \
    --mode encrypt --to-key payments/kek --tenant acme --synchronous full
expect_grep "--synchronous refused: why" "$T/err" "SQLite option"
run "rollouts on PostgreSQL: none yet" 66 "$KS" rollout status --db "$CI"
run "rollouts: a password in --db refused" 64 "$KS" rollout status --db "$CI password=hunter2"
if grep -q hunter2 "$T/err"; then bad "rollouts: the password is not echoed"; else ok "rollouts: the password is not echoed"; fi
run "status before any run" 0 "$KS" migrate status --db "$CI"
expect_grep "status: no migration yet" "$T/out" "no migration has run"
run "status --json before any run" 0 "$KS" migrate status --db "$URI" --json
expect_eq "status --json: empty list" "$T/out" '{"migrations":[]}'

# ---- census ----------------------------------------------------------------------------
q "CREATE TABLE t (id bigint PRIMARY KEY, v bytea);
   INSERT INTO t (id, v) VALUES (1, NULL), (2, NULL), (3, NULL), (4, 'plain 1'), (5, 'plain 2'),
       (6, '\\x00'), (7, ''),
       (8, '\\x$(seal_card c1 1)'), (9, '\\x$(seal_card c2 1)'),
       (10, '\\x$(seal_card c3 2)'), (11, '\\x$(seal_card c4 2)'), (12, '\\x$(seal_card c5 2)'),
       (13, '\\x4B534502'), (14, '\\x4B534509');"
run "census" 0 "$KS" census --db "$CI" --table t --column v
expect_grep "census: 14 rows" "$T/out" "^rows *14$"
expect_grep "census: 3 NULL" "$T/out" "^null *3$"
expect_grep "census: 4 plaintext" "$T/out" "^plaintext *4$"
expect_grep "census: 5 envelopes" "$T/out" "^envelopes *5$"
expect_grep "census: 2 malformed" "$T/out" "^malformed *2$"
run "census --json (URI form)" 0 "$KS" census --db "$URI" --table t --column v --json
expect_grep "census --json totals" "$T/out" '^{"rows":14,"null":3,"plaintext":4,"envelopes":5,"malformed":2,"classes":\['
expect_grep "census --json v1 class" "$T/out" '{"version":1,"algorithm":"xchacha20-poly1305","key_id":"payments/kek","key_version":1,"rows":2}'
run "census: no such table" 66 "$KS" census --db "$CI" --table nosuch --column v
run "census: no such column" 66 "$KS" census --db "$CI" --table t --column nosuch
if [ "$(q "SELECT count(*) FROM pg_class WHERE relname LIKE 'keyshift%'")" = 0 ]; then
    ok "census and status created no table"; else bad "census and status created no table"; fi

# ---- encrypt, rewrap, reencrypt ---------------------------------------------------------
make_pay pay 2000
q "INSERT INTO pay VALUES (2001, 'acme', NULL), (2002, 'acme', NULL)"
TGT=(--db "$CI" --table pay --column card)
run "encrypt: unknown key" 77 "$KS" migrate run "${TGT[@]}" --mode encrypt --to-key nosuch/kek "${CTX[@]}"
run "encrypt: no such column" 66 "$KS" migrate run --db "$CI" --table pay --column nosuch --mode encrypt --to-key payments/kek "${CTX[@]}"
# an id a context binds must be stable: a --id-column that is neither the
# primary key nor UNIQUE and NOT NULL is refused before anything is written
q "ALTER TABLE pay ADD COLUMN seq bigint; UPDATE pay SET seq = id"
run "encrypt: --id-column not unique refused" 66 "$KS" migrate run "${TGT[@]}" --id-column seq --mode encrypt --to-key payments/kek "${CTX[@]}"
expect_grep "--id-column not unique: says why" "$T/err" 'id column "seq" of table "pay" is neither the primary key nor NOT NULL with a unique index'
run "verify: --id-column not unique refused" 66 "$KS" migrate verify "${TGT[@]}" --id-column seq "${CTX[@]}"
if [ "$(q "SELECT count(*) FROM pay p JOIN pay_orig o USING (id) WHERE p.card = o.card")" = 2000 ]; then
    ok "--id-column not unique: nothing written"; else bad "--id-column not unique: nothing written"; fi
q "ALTER TABLE pay DROP COLUMN seq"
run "encrypt" 0 "$KS" migrate run "${TGT[@]}" --mode encrypt --to-key payments/kek "${CTX[@]}" --batch-size 250
expect_grep "encrypt: summary on stderr" "$T/err" "complete: 2000 rewritten"
expect_empty "encrypt: nothing on stdout without --json" "$T/out"
run "census after encrypt" 0 "$KS" census "${TGT[@]}" --json
expect_grep "census after encrypt: 0 plaintext, 2000 envelopes" "$T/out" '"null":2,"plaintext":0,"envelopes":2000,"malformed":0'
check_sample pay 8 "encrypt"
no_plaintext pay "encrypt"
if [ "$(q "SELECT count(*) FROM pg_class WHERE relname IN ('keyshift_migration', 'keyshift_quarantine')")" = 2 ]; then
    ok "run created keyshift_migration and keyshift_quarantine"; else bad "run created keyshift's tables"; fi
run "status --json after encrypt" 0 "$KS" migrate status --db "$CI" --json
expect_grep "status --json: complete" "$T/out" '"state":"complete"'
expect_grep "status --json: 2000 done" "$T/out" '"done":2000,'
expect_grep "status --json: the shape of SQLite's" "$T/out" '^{"migrations":\[{"table":"pay","column":"card","params":"mode=encrypt;'
run "status --table --column" 0 "$KS" migrate status --db "$CI" --table pay --column card
expect_grep "status text: state" "$T/out" "^state *complete"
expect_grep "status text: rewritten" "$T/out" "^rewritten *2000"
run "status: no such table" 66 "$KS" migrate status --db "$CI" --table nosuch --column card
SUM="SELECT md5(string_agg(encode(card, 'hex'), ',' ORDER BY id)) FROM pay"
before=$(q "$SUM")
run "encrypt again" 0 "$KS" migrate run "${TGT[@]}" --mode encrypt --to-key payments/kek "${CTX[@]}" --batch-size 250
if [ "$(q "$SUM")" = "$before" ]; then ok "encrypt again writes nothing"; else bad "encrypt again writes nothing"; fi

run "add-version" 0 "$KS" keys add-version payments/kek
run "promote 2" 0 "$KS" keys promote payments/kek 2
TAILS="SELECT md5(string_agg(right(encode(card, 'hex'), 80), ',' ORDER BY id)) FROM pay"
tails=$(q "$TAILS")
run "rewrap --json" 0 "$KS" migrate run "${TGT[@]}" --mode rewrap --to-key payments/kek "${CTX[@]}" --json --batch-size 300
expect_grep "rewrap --json: per-batch objects" "$T/out" '^{"batch":1,'
expect_grep "rewrap --json: summary" "$T/out" '^{"result":"complete","error":"ok","exit":0,'
if [ "$(q "$TAILS")" = "$tails" ]; then ok "rewrap kept every ciphertext and tag"; else bad "rewrap kept every ciphertext and tag"; fi
run "census after rewrap" 0 "$KS" census "${TGT[@]}" --json
expect_grep "census: all 2000 under version 2" "$T/out" '"classes":\[{"version":2,"algorithm":"xchacha20-poly1305","key_id":"payments/kek","key_version":2,"rows":2000}\]'
check_sample pay 5 "rewrap"

run "verify" 0 "$KS" migrate verify "${TGT[@]}" "${CTX[@]}"
expect_grep "verify: 2000 checked" "$T/out" "2000 envelopes checked, 0 failed"
run "verify --sample --json" 0 "$KS" migrate verify "${TGT[@]}" "${CTX[@]}" --sample 50 --json
expect_grep "verify --json summary" "$T/out" '"failed":0,'
row1=$(card_hex pay 1)
q "UPDATE pay SET card = (SELECT card FROM pay WHERE id = 2) WHERE id = 1"
run "verify finds a moved envelope" 65 "$KS" migrate verify "${TGT[@]}" "${CTX[@]}"
expect_grep "verify names the row by id" "$T/out" "FAILED id 1: auth-failed"
expect_grep "verify counts one failure" "$T/out" "2000 envelopes checked, 1 failed"
if grep -q "row-00002" "$T/out" "$T/err"; then bad "verify prints no plaintext"; else ok "verify prints no plaintext"; fi
q "UPDATE pay SET card = '\\x$row1' WHERE id = 1"

# reencrypt with one envelope's tag corrupted: that row is quarantined,
# untouched, and every other row re-encrypted
q "UPDATE pay SET card = set_byte(card, length(card) - 1, get_byte(card, length(card) - 1) # 1) WHERE id = 10"
row10=$(card_hex pay 10)
run "reencrypt to aes-256-gcm, one corrupted envelope" 0 "$KS" migrate run "${TGT[@]}" --mode reencrypt \
    --to-key payments/kek --algorithm aes-256-gcm "${CTX[@]}" --batch-size 400 --max-failure-rate 0.01
expect_grep "reencrypt: 1999 rewritten, 1 quarantined" "$T/err" "1999 rewritten, 0 already at target, 0 raced, 1 quarantined"
expect_eq "reencrypt: the corrupted row is in keyshift_quarantine" <(q "SELECT tbl, col, id, error FROM keyshift_quarantine") "pay|card|10|auth-failed"
if [ "$(card_hex pay 10)" = "$row10" ]; then ok "reencrypt: the quarantined row is untouched"; else bad "reencrypt: the quarantined row is untouched"; fi
run "census after reencrypt" 0 "$KS" census "${TGT[@]}" --json
expect_grep "census: 1999 under aes-256-gcm" "$T/out" '{"version":2,"algorithm":"aes-256-gcm","key_id":"payments/kek","key_version":2,"rows":1999}'
check_sample pay 5 "reencrypt"
run "verify after reencrypt: the corrupted row" 65 "$KS" migrate verify "${TGT[@]}" "${CTX[@]}"
expect_grep "verify names the corrupted row" "$T/out" "FAILED id 10: auth-failed"

# ---- failure threshold --------------------------------------------------------------------
q "CREATE TABLE mal (id bigint PRIMARY KEY, tenant text NOT NULL, card bytea);
   INSERT INTO mal SELECT i, 'acme', CASE WHEN i % 2 = 1 THEN '\\x4B534502'::bytea ELSE 'plain'::bytea END
   FROM generate_series(1, 100) i;"
run "threshold: exit 65" 65 "$KS" migrate run --db "$CI" --table mal --column card --mode encrypt \
    --to-key payments/kek "${CTX[@]}" --max-failure-rate 0.001 --batch-size 10
expect_grep "threshold: explained" "$T/err" "keyshift_quarantine"
if [ "$(q "SELECT count(*) FROM mal WHERE card = '\\x4B534502'")" = 50 ]; then ok "threshold: quarantined rows are untouched"; else bad "threshold: quarantined rows are untouched"; fi
run "threshold raised: complete" 0 "$KS" migrate run --db "$CI" --table mal --column card --mode encrypt \
    --to-key payments/kek "${CTX[@]}" --max-failure-rate 1 --batch-size 10
expect_eq "threshold: 50 rows quarantined" <(q "SELECT count(*) FROM keyshift_quarantine WHERE tbl = 'mal'") "50"
run "threshold: census" 0 "$KS" census --db "$CI" --table mal --column card --json
expect_grep "threshold: 50 envelopes, 50 malformed" "$T/out" '"plaintext":0,"envelopes":50,"malformed":50'

# ---- a mistaken rewrap (no --context), then the corrected one --------------------------------
# As on SQLite: the mistaken run quarantines every row and names the
# likely cause; the corrected command is refused as a mismatch only; with
# --supersede it retries and rewraps every row; quarantine list/release.
make_pay mis 40
MTGT=(--db "$CI" --table mis --column card)
run "mistake: encrypt" 0 "$KS" migrate run "${MTGT[@]}" --mode encrypt --to-key payments/kek "${CTX[@]}" --batch-size 10
run "keys create mistake/kek" 0 "$KS" keys create mistake/kek
run "mistake: rewrap without --context: exit 65" 65 "$KS" migrate run "${MTGT[@]}" --mode rewrap \
    --to-key mistake/kek --tenant-column tenant --purpose card --batch-size 10
expect_grep "mistake: the likely cause is named" "$T/err" "most rows of the first batch failed with auth-failed"
run "mistake: corrected command: exit 65 (mismatch)" 65 "$KS" migrate run "${MTGT[@]}" --mode rewrap \
    --to-key mistake/kek "${CTX[@]}" --batch-size 10
if grep -q "report it as a bug" "$T/err"; then bad "mismatch: not blamed on a bug" "$(cat "$T/err")"; else ok "mismatch: not blamed on a bug"; fi
run "mistake: corrected command with --supersede" 0 "$KS" migrate run "${MTGT[@]}" --mode rewrap \
    --to-key mistake/kek "${CTX[@]}" --batch-size 10 --supersede
expect_grep "corrected: every quarantined row retried and rewrapped" "$T/err" "complete: 40 rewritten, 0 already at target, 0 raced, 0 quarantined"
run "census after the corrected run" 0 "$KS" census "${MTGT[@]}" --json
expect_grep "census: all 40 under the new key" "$T/out" '"classes":\[{"version":2,"algorithm":"xchacha20-poly1305","key_id":"mistake/kek","key_version":1,"rows":40}\]'
check_sample mis 3 "corrected rewrap"
run "quarantine list --json" 0 "$KS" migrate quarantine list "${MTGT[@]}" --json
if [ "$(grep -c '^{"id":[0-9]*,"error":"auth-failed","migration":"mode=rewrap;.*","time":"' "$T/out")" = 40 ]; then ok "quarantine list --json: the mistaken run's 40 rows"; else bad "quarantine list --json: the mistaken run's 40 rows" "$(head -2 "$T/out")"; fi
expect_grep "quarantine list: ids in numeric order" "$T/out" '^{"id":1,'
run "quarantine release: no selector" 64 "$KS" migrate quarantine release "${MTGT[@]}"
run "quarantine release --id 7" 0 "$KS" migrate quarantine release "${MTGT[@]}" --id 7
expect_grep "quarantine release: logged" "$T/err" "released 1 row(s) of mis.card from quarantine (selected: id 7)"
run "quarantine release --all" 0 "$KS" migrate quarantine release "${MTGT[@]}" --all
expect_grep "quarantine release --all: 39 rows" "$T/err" "released 39 row(s)"
expect_eq "quarantine: nothing left" <(q "SELECT count(*) FROM keyshift_quarantine WHERE tbl = 'mis'") "0"

# ---- SIGINT: pause, then resume; kill -9, then resume ------------------------------------------
make_pay slow 2000
STGT=(--db "$CI" --table slow --column card --mode encrypt --to-key payments/kek "${CTX[@]}")
sigint_run "${STGT[@]}"
left=$(q "SELECT count(*) FROM slow WHERE substring(card FROM 1 FOR 3) <> 'KSE'::bytea")
if [ "$left" -gt 0 ] && [ "$left" -lt 2000 ]; then ok "SIGINT: paused part-way ($left rows left)"; else bad "SIGINT: paused part-way" "$left rows left"; fi
if [ "$(status_field slow done)" = $((2000 - left)) ]; then ok "SIGINT: the checkpoint counts the rows written"; else bad "SIGINT: checkpoint counts" "$(cat "$T/st")"; fi
expect_grep "status: state paused" "$T/st" '"state":"paused"'
run "other parameters while paused: exit 65" 65 "$KS" migrate run --db "$CI" --table slow --column card \
    --mode encrypt --to-key payments/kek --tenant-column tenant --context 'other:{id}' --purpose card
expect_grep "mismatch: names --supersede" "$T/err" "supersede"
# kill -9 mid-run: the batch in flight is rolled back with the session
"$KS" migrate run "${STGT[@]}" --max-rows-per-second 1000 --batch-size 100 >"$T/out" 2>"$T/err" &
pid=$!
sleep 0.7
kill -9 $pid
wait $pid 2>/dev/null
left=$(q "SELECT count(*) FROM slow WHERE substring(card FROM 1 FOR 3) <> 'KSE'::bytea")
if [ "$(status_field slow done)" = $((2000 - left)) ]; then ok "kill -9: the checkpoint matches the data ($left rows left)"; else bad "kill -9: checkpoint matches the data" "$left left; $(cat "$T/st")"; fi
run "resume" 0 "$KS" migrate run "${STGT[@]}" --batch-size 500
if [ "$(status_field slow done)" = 2000 ]; then ok "resume: done == 2000 exactly"; else bad "resume: done == 2000" "$(cat "$T/st")"; fi
no_plaintext slow "resume"
check_sample slow 6 "resume"
run "verify after resume" 0 "$KS" migrate verify --db "$CI" --table slow --column card "${CTX[@]}"

# ---- rows changed by another connection: raced, then redone ----------------------------------
# The other session holds the row locks of two rows of one batch (changing
# their plaintext) while the run reaches them: the run read the committed
# values, its compare-and-swap waits for the locks, then finds other
# values (READ COMMITTED re-reads the rows), counts both rows raced and
# redoes them in the catch-up pass.
make_pay live 2000
psql "$CI" -qXAt -v ON_ERROR_STOP=1 >/dev/null 2>"$T/writer.err" <<'SQL' &
BEGIN;
UPDATE live SET card = convert_to('changed-' || id, 'UTF8') WHERE id IN (650, 651);
SELECT pg_sleep(3);
COMMIT;
SQL
wpid=$!
for ((i = 0; i < 50; i++)); do
    [ "$(q "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
             WHERE c.relname = 'live' AND l.mode = 'RowExclusiveLock' AND l.granted")" -gt 0 ] && break
    sleep 0.1
done
run "live: run while another session changes rows" 0 "$KS" migrate run --db "$CI" --table live --column card \
    --mode encrypt --to-key payments/kek "${CTX[@]}" --batch-size 100 --json
wait "$wpid"
wrc=$?
wpid=
if [ "$wrc" = 0 ]; then ok "live: the other session committed"; else bad "live: the other session committed" "$(cat "$T/writer.err")"; fi
raced=$(last_field "$T/out" raced)
passes=$(last_field "$T/out" pass)
if [ "${raced:-0}" -ge 2 ] && [ "${passes:-0}" -ge 2 ]; then ok "live: both rows raced, redone in a catch-up pass (raced=$raced, pass=$passes)"
else bad "live: rows raced and redone" "raced=$raced pass=$passes: $(tail -n 1 "$T/out")"; fi
for id in 650 651; do
    if [ "$(open_hex "$(card_hex live $id)" $id 2>&1)" = "changed-$id" ]; then ok "live: row $id opens to the other session's value"
    else bad "live: row $id opens to the other session's value"; fi
done
q "UPDATE live_orig SET card = convert_to('changed-' || id, 'UTF8') WHERE id IN (650, 651)"
no_plaintext live "live"
check_sample live 5 "live"

# ---- a lock held past --busy-timeout (lock_timeout): 75, then resumed ---------------------------
# hold_lock TABLE MODE SQL: another session runs SQL (taking a lock of
# MODE on TABLE) and holds it for 3 s; returns once the lock is granted.
hold_lock() {
    printf 'BEGIN;\n%s;\nSELECT pg_sleep(3);\nCOMMIT;\n' "$3" |
        psql "$CI" -qXAt -v ON_ERROR_STOP=1 >/dev/null 2>"$T/locker.err" &
    wpid=$!
    local i
    for ((i = 0; i < 50; i++)); do
        [ "$(q "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
                 WHERE c.relname = '$1' AND l.mode = '$2' AND l.granted")" -gt 0 ] && return 0
        sleep 0.1
    done
}
make_pay busy 300
BTGT=(--db "$CI" --table busy --column card --mode encrypt --to-key payments/kek "${CTX[@]}")
# a row lock: the batch's UPDATE waits for it, then gives up
hold_lock busy RowShareLock "SELECT id FROM busy WHERE id = 150 FOR UPDATE"
run "a row lock held past --busy-timeout: 75" 75 "$KS" migrate run "${BTGT[@]}" --busy-timeout 300 --batch-size 100
expect_grep "row lock: says to rerun" "$T/err" "stayed locked.*run the same command again"
wait "$wpid"
wpid=
if [ "$(status_field busy done)" = 100 ]; then ok "row lock: the batches before it stand (done 100)"; else bad "row lock: the batches before it stand" "$(cat "$T/st")"; fi
# a table lock: the run cannot even prepare its UPDATE
hold_lock busy ExclusiveLock "LOCK TABLE busy IN EXCLUSIVE MODE"
run "a table lock held past --busy-timeout: 75" 75 "$KS" migrate run "${BTGT[@]}" --busy-timeout 300
expect_grep "table lock: says to rerun" "$T/err" "stayed locked.*run the same command again"
wait "$wpid"
wpid=
run "busy: rerun once the locks are gone" 0 "$KS" migrate run "${BTGT[@]}" --busy-timeout 300
no_plaintext busy "busy"

# ---- a rollout's lifecycle on PostgreSQL ----------------------------------------------------------
# The rollout state (keyshift_rollout, its log, readers, metrics) lives in
# the same PostgreSQL database: start, read-compat, write-upgrade,
# backfill with `migrate run` (gated on the phase, the rollout row locked
# FOR SHARE in each batch), a complete `migrate verify` recorded, finalize.
make_roll() { make_pay roll 300; }
make_roll
RTGT=v2:xchacha20-poly1305:payments/kek:2
R=(--db "$CI")
run "rollout: start on PostgreSQL" 0 "$KS" rollout start "${R[@]}" --table roll --column card --source plaintext \
    --target "$RTGT" --min-soak 0s --reader-ttl 60 --actor ops --reason "encrypt roll.card"
rid=$(cat "$T/out")
if [ "$(q "SELECT phase FROM keyshift_rollout WHERE id = $rid")" = planned ]; then ok "rollout: planned in keyshift_rollout"; else bad "rollout: planned in keyshift_rollout"; fi
run "rollout: migrate run refused before backfill" 78 "$KS" migrate run --db "$CI" --table roll --column card --mode encrypt --to-key payments/kek "${CTX[@]}"
run "rollout: advance to read-compat" 0 "$KS" rollout advance "${R[@]}" --rollout "$rid" --reason "key everywhere"
run "rollout: advance to write-upgrade" 0 "$KS" rollout advance "${R[@]}" --rollout "$rid" --all
# a healthy window, as the application's policy reports it (keyshift_metrics):
# 2000 seals and 2000 opens, each timed in the fastest latency bucket
q "INSERT INTO keyshift_metrics(rollout_id, instance_id, source, time, seals, opens, auth_failures,
       parse_errors, provider_calls, provider_errors, seal_ns, open_ns)
   VALUES ($rid, 'web-1', 'app', extract(epoch FROM now())::bigint, 2000, 2000, 0, 0, 10, 0,
       decode('d007000000000000' || repeat('00', 184), 'hex'),
       decode('d007000000000000' || repeat('00', 184), 'hex'))"
run "rollout: advance to backfill" 0 "$KS" rollout advance "${R[@]}" --rollout "$rid"
if [ "$(q "SELECT phase FROM keyshift_rollout WHERE id = $rid")" = backfill ]; then ok "rollout: in backfill"; else bad "rollout: in backfill"; fi
run "rollout: finalize refused before the backfill" 75 "$KS" rollout advance "${R[@]}" --rollout "$rid"
run "rollout: migrate run in backfill" 0 "$KS" migrate run --db "$CI" --table roll --column card --mode encrypt --to-key payments/kek "${CTX[@]}"
no_plaintext roll "rollout backfill"
run "rollout: finalize refused without a verify" 75 "$KS" rollout advance "${R[@]}" --rollout "$rid"
run "rollout: migrate verify (recorded)" 0 "$KS" migrate verify --db "$CI" --table roll --column card "${CTX[@]}" --tenant-column tenant
if [ "$(q "SELECT verified_at > 0 FROM keyshift_rollout WHERE id = $rid")" = t ]; then ok "rollout: verify recorded"; else bad "rollout: verify recorded"; fi
run "rollout: advance to finalized" 0 "$KS" rollout advance "${R[@]}" --rollout "$rid"
if [ "$(q "SELECT phase FROM keyshift_rollout WHERE id = $rid")" = finalized ]; then ok "rollout: finalized"; else bad "rollout: finalized"; fi
run "rollout: status --json" 0 "$KS" rollout status "${R[@]}" --rollout "$rid" --json
expect_grep "rollout: status shows finalized" "$T/out" '"phase":"finalized"'
run "rollout: log" 0 "$KS" rollout log "${R[@]}" --rollout "$rid" --json
expect_grep "rollout: the log holds the finalize" "$T/out" '"to":"finalized"'
if q "UPDATE keyshift_rollout_log SET reason = 'x'" >/dev/null 2>&1; then bad "rollout: the log is append-only"; else ok "rollout: the log is append-only"; fi

# ---- throttling: a throttle query, the pause flag ------------------------------------------------
# converted KSE rows of TABLE
kse_rows() { q "SELECT count(*) FROM $1 WHERE substring(card FROM 1 FOR 3) = 'KSE'::bytea"; }
make_pay thr 1500
q "CREATE TABLE throttle_flag (busy boolean NOT NULL); INSERT INTO throttle_flag VALUES (false)"
THR=(--db "$CI" --table thr --column card --mode encrypt --to-key payments/kek "${CTX[@]}" --batch-size 50 --max-rows-per-second 1000)
"$KS" migrate run "${THR[@]}" --throttle-query "SELECT busy FROM throttle_flag" --json >"$T/thr.json" 2>"$T/thr.err" &
tpid=$!
sleep 0.5
q "UPDATE throttle_flag SET busy = true"
sleep 1
d1=$(kse_rows thr)
sleep 1.5
d2=$(kse_rows thr)
if [ "$d1" = "$d2" ] && [ "$d1" -lt 1500 ]; then ok "throttle query true: the run waits after its batch ($d1 rows)"; else bad "throttle query true: the run waits" "$d1 then $d2 rows"; fi
q "UPDATE throttle_flag SET busy = false"
wait $tpid
rc=$?
if [ $rc = 0 ]; then ok "throttle query false again: the run completes"; else bad "throttle: the run completes" "exit $rc: $(head -c 300 "$T/thr.err")"; fi
expect_grep "throttle: a JSON line says throttled" "$T/thr.json" '"throttled":true,"reason":"the throttle query returned true"'
thr_s=$(grep '"result"' "$T/thr.json" | sed -n 's/.*"throttled_s":\([0-9.]*\).*/\1/p')
if awk -v t="${thr_s:-0}" 'BEGIN { exit !(t >= 1.5) }'; then ok "throttle: the summary counts the time throttled (${thr_s} s)"; else bad "throttle: throttled_s >= 1.5" "$(tail -1 "$T/thr.json")"; fi
run "throttle: a query that does not prepare: 64" 64 "$KS" migrate run "${THR[@]}" --throttle-query "SELEC nonsense"
run "throttle: --max-replica-lag must be a duration" 64 "$KS" migrate run "${THR[@]}" --max-replica-lag soon
run "throttle: no replica, no lag: runs" 0 "$KS" migrate run "${THR[@]}" --max-replica-lag 5s
run "throttle: --throttle-query on SQLite: 64" 64 "$KS" migrate run --db "$T/x.db" --table t --column v --mode encrypt --to-key payments/kek --throttle-query "SELECT 1"

make_pay pau 1000
PAU=(--db "$CI" --table pau --column card)
"$KS" migrate run "${PAU[@]}" --mode encrypt --to-key payments/kek "${CTX[@]}" --batch-size 50 --max-rows-per-second 500 >"$T/pau.out" 2>"$T/pau.err" &
ppid=$!
sleep 0.5
run "pause: a running migration" 0 "$KS" migrate pause "${PAU[@]}" --reason "peak hour"
sleep 1
c1=$(kse_rows pau)
sleep 1.5
c2=$(kse_rows pau)
if [ "$c1" = "$c2" ] && [ "$c1" -lt 1000 ]; then ok "pause: the run waits after its batch ($c1 rows)"; else bad "pause: the run waits" "$c1 then $c2 rows"; fi
run "resume" 0 "$KS" migrate resume "${PAU[@]}"
wait $ppid
rc=$?
if [ $rc = 0 ]; then ok "resume: the run completes"; else bad "resume: the run completes" "exit $rc: $(head -c 300 "$T/pau.err")"; fi
expect_grep "pause: the run says why it waits" "$T/pau.err" "throttled: paused by keyshift migrate pause (peak hour)"
expect_grep "pause: the summary counts the pause" "$T/pau.err" "throttled .* s in 1 pauses"
if [ "$(kse_rows pau)" = 1000 ]; then ok "pause: every row converted after resume"; else bad "pause: every row converted"; fi
run "pause: needs --table and --column" 64 "$KS" migrate pause --db "$CI" --table pau
run "pause: a SQLite --db is refused" 64 "$KS" migrate pause --db "$T/x.db" --table t --column v

# ---- the cluster stopped mid-run, then started again -----------------------------------------------
make_pay gone 2000
GTGT=(--db "$CI" --table gone --column card --mode encrypt --to-key payments/kek "${CTX[@]}")
"$KS" migrate run "${GTGT[@]}" --max-rows-per-second 1000 --batch-size 100 >"$T/out" 2>"$T/err" &
pid=$!
sleep 1
"$CLUSTER" down "$PGD" || bad "cluster down"
wait $pid
rc=$?
if [ $rc = 69 ]; then ok "cluster stopped mid-run: clean exit 69"; else bad "cluster stopped mid-run: exit 69" "exit $rc: $(head -c 300 "$T/err")"; fi
expect_grep "cluster stopped: says the database went away, and to rerun" "$T/err" "database went away.*run the same command again"
if grep -q "WARNING\|terminating connection" "$T/err"; then bad "cluster stopped: no server text on stderr"; else ok "cluster stopped: no server text on stderr"; fi
if grep -q "AddressSanitizer\|runtime error" "$T/err"; then bad "cluster stopped: no sanitizer report"; else ok "cluster stopped: no sanitizer report"; fi
run "status while the cluster is down: 69" 69 "$KS" migrate status --db "$CI"
run "census while the cluster is down: 69" 69 "$KS" census --db "$CI" --table gone --column card
"$CLUSTER" up "$PGD" || bad "cluster up"
left=$(q "SELECT count(*) FROM gone WHERE substring(card FROM 1 FOR 3) <> 'KSE'::bytea")
if [ "$left" -gt 0 ] && [ "$left" -lt 2000 ] && [ "$(status_field gone done)" = $((2000 - left)) ]; then
    ok "cluster back: the checkpoint matches the data ($left rows left)"
else
    bad "cluster back: the checkpoint matches the data" "$left left; $(cat "$T/st")"
fi
run "rerun once the cluster is back" 0 "$KS" migrate run "${GTGT[@]}" --batch-size 500
if [ "$(status_field gone done)" = 2000 ]; then ok "rerun: done == 2000 exactly"; else bad "rerun: done == 2000" "$(cat "$T/st")"; fi
no_plaintext gone "rerun"
check_sample gone 5 "rerun"
# ---- a text column and a varchar column of base64 envelopes (--encoding base64) ----------
NONCANON='S1NFAQgBEgF0GgFrIAEqAaAyDAABAgMEBQYHCAkKC3oQwMHCw8TFxsfIycrLzM3Ozx=='
q "CREATE TABLE orders (id bigint PRIMARY KEY, tenant text NOT NULL, card_text text, card_vc varchar(400));
   INSERT INTO orders SELECT i, 'acme', format('card-%s-4111', lpad(i::text, 4, '0')),
       format('card-%s-4111', lpad(i::text, 4, '0')) FROM generate_series(1, 40) i;
   INSERT INTO orders VALUES (41, 'acme', '$NONCANON', '$NONCANON'), (42, 'acme', NULL, NULL);"
run "text column without --encoding: not bytea" 66 "$KS" census --db "$CI" --table orders --column card_text
expect_grep "not bytea: says what to give" "$T/err" 'is not bytea (a text or varchar column of base64 envelopes needs --encoding base64)'
run "bytea column with --encoding base64: refused" 66 "$KS" census --db "$CI" --table t --column v --encoding base64
run "keys create text/kek" 0 "$KS" keys create text/kek
for col in card_text card_vc; do
    XT=(--db "$CI" --table orders --column "$col" --encoding base64)
    run "$col: census before" 0 "$KS" census "${XT[@]}" --json
    expect_grep "$col: 40 plaintext, 1 malformed bad-value" "$T/out" '"rows":42,"null":1,"plaintext":40,"envelopes":0,"malformed":1,.*"malformed_by_error":{"bad-value":1}'
    run "$col: encrypt" 0 "$KS" migrate run "${XT[@]}" --mode encrypt --to-key text/kek "${CTX[@]}" --max-failure-rate 0.5
    if [ "$(q "SELECT count(*) FROM orders WHERE substring($col FROM 1 FOR 4) = 'S1NF'")" = 41 ]; then
        ok "$col: every value begins S1NF"; else bad "$col: every value begins S1NF"; fi
    if [ "$(q "SELECT $col FROM orders WHERE id = 41")" = "$NONCANON" ]; then
        ok "$col: the non-canonical value is untouched"; else bad "$col: the non-canonical value is untouched"; fi
    q "SELECT $col FROM orders WHERE id = 9" | base64 -d >"$T/row.kse"
    if [ "$("$KS" decrypt --context pay:9:card --tenant acme --purpose card <"$T/row.kse" 2>&1)" = card-0009-4111 ]; then
        ok "$col: row 9 decodes and decrypts"; else bad "$col: row 9 decodes and decrypts"; fi
    run "$col: quarantine list" 0 "$KS" migrate quarantine list "${XT[@]}" --json
    expect_grep "$col: row 41 quarantined bad-value" "$T/out" '^{"id":41,"error":"bad-value","migration":"mode=encrypt;.*encoding=base64;'
    run "$col: reencrypt" 0 "$KS" migrate run "${XT[@]}" --mode reencrypt --to-key text/kek --algorithm aes-256-gcm "${CTX[@]}" --max-failure-rate 0.5
    run "$col: census after" 0 "$KS" census "${XT[@]}" --json
    expect_grep "$col: 40 aes-256-gcm envelopes" "$T/out" '"classes":\[{"version":2,"algorithm":"aes-256-gcm","key_id":"text/kek","key_version":1,"rows":40}\]'
    run "$col: verify finds the malformed row" 65 "$KS" migrate verify "${XT[@]}" "${CTX[@]}"
    expect_grep "$col: verify names it bad-value" "$T/out" "FAILED id 41: bad-value"
done
run "text/kek add-version" 0 "$KS" keys add-version text/kek
run "text/kek promote 2" 0 "$KS" keys promote text/kek 2
run "card_text: rewrap" 0 "$KS" migrate run --db "$CI" --table orders --column card_text --encoding base64 --mode rewrap --to-key text/kek "${CTX[@]}" --max-failure-rate 0.5
q "DELETE FROM orders WHERE id = 41"
run "card_text: verify after rewrap" 0 "$KS" migrate verify --db "$CI" --table orders --column card_text --encoding base64 "${CTX[@]}"
expect_grep "card_text: 40 checked" "$T/out" "40 envelopes checked, 0 failed"

run "status lists every column's migration" 0 "$KS" migrate status --db "$CI" --json
for t in pay mal slow live busy gone orders; do expect_grep "status lists $t" "$T/out" "\"table\":\"$t\""; done

cli_finish cli_migrate_pg_test
