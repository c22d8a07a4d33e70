#!/usr/bin/env bash
# tests/cli_migrate_faults_test.sh -- faults of `keyshift migrate run` in
# real processes on real SQLite files, provoked through the test build's
# environment hooks (compiled only with -DKS_TEST_HOOKS, i.e. the
# sanitizer build that `make cli-test` uses; release builds ignore them):
#   - the database fills up (KEYSHIFT_TEST_MAX_PAGES caps the database's
#     pages: SQLITE_FULL): exit 74;
#   - the key provider goes away mid-run (KEYSHIFT_TEST_PROVIDER_FAIL_AFTER:
#     every wrap and unwrap after the first N fails "unavailable"): exit 69.
# Each time: the failed batch is rolled back, the checkpoint is that of
# the last committed batch and matches the data, no row is half-written,
# and running the same command again (without the fault) completes, with
# every row opening to its original plaintext.
#
# Usage: KEYSHIFT=path/to/keyshift tests/cli_migrate_faults_test.sh
set -u

. "$(dirname "$0")/cli_lib.sh"
unset KEYSHIFT_PASSPHRASE KEYSHIFT_TEST_MAX_PAGES KEYSHIFT_TEST_PROVIDER_FAIL_AFTER
export KEYSHIFT_KEYRING="$T/keyring"
IN=/dev/null

command -v sqlite3 >/dev/null || { echo "cli_migrate_faults_test: sqlite3 is missing (tools/deps.sh)"; exit 1; }

# sql DB STATEMENTS: run SQL with the sqlite3 CLI.
sql() { sqlite3 "$1" "$2"; }

# cp_field DB MODE NAME: a column of the checkpoint of the MODE migration.
cp_field() { sql "$1" "SELECT $3 FROM keyshift_migration WHERE params LIKE 'mode=$2;%'"; }

# envelopes DB: rows of pay holding an envelope.
envelopes() { sql "$1" "SELECT count(*) FROM pay WHERE hex(substr(card, 1, 3)) = '4B5345'"; }

# all_open DB NAME: every row opens (migrate verify), and a sample of rows
# decrypts (`keyshift decrypt`) to the plaintext made from its id.
all_open() {
    local db=$1 name=$2 id wrong=""
    "$KS" migrate verify --db "$db" --table pay --column card --context 'pay:{id}:card' \
        --tenant-column tenant --purpose card >/dev/null 2>"$T/verify.err" ||
        wrong="verify: $(head -c 200 "$T/verify.err")"
    for id in 1 7 33 64 80; do
        sql "$db" "SELECT hex(card) FROM pay WHERE id = $id" >"$T/hex"
        unhex "$(cat "$T/hex")" >"$T/row.kse"
        "$KS" decrypt --context "pay:$id:card" --tenant acme --purpose card <"$T/row.kse" >"$T/pt" 2>/dev/null
        [ "$(cut -c1-24 "$T/pt")" = "$(printf 'card-holder-%012d' "$id")" ] || wrong+=" row $id"
    done
    if [ -z "$wrong" ]; then ok "$name: every row opens to its original plaintext"; else bad "$name: rows open" "$wrong"; fi
}

run "keys init" 0 "$KS" keys init
run "keys create pay/kek" 0 "$KS" keys create pay/kek

# ---- 1. the database fills up --------------------------------------------------
# 400 rows of ~1.3 KB plaintext: three to a 4 KiB page, which their
# envelopes (~150 bytes larger) no longer fit, so encrypting grows the file.
F="$T/full.db"
sql "$F" "CREATE TABLE pay (id INTEGER PRIMARY KEY, tenant TEXT NOT NULL, card TEXT);
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 400)
INSERT INTO pay SELECT i, 'acme', printf('card-holder-%012d-', i) || hex(randomblob(640)) FROM n;"
FTGT=(--db "$F" --table pay --column card --mode encrypt --to-key pay/kek --tenant-column tenant
      --context 'pay:{id}:card' --purpose card --batch-size 20)
pages=$(sql "$F" "PRAGMA page_count")
KEYSHIFT_TEST_MAX_PAGES=$((pages + 30)) run "full: migrate run stops with exit 74" 74 "$KS" migrate run "${FTGT[@]}"
expect_grep "full: the error says the database is full" "$T/err" "full"
done=$(cp_field "$F" encrypt done) env=$(envelopes "$F")
if [ -n "$done" ] && [ "$done" -gt 0 ] && [ $((done % 20)) = 0 ] && [ "$done" -lt 400 ]; then
    ok "full: the checkpoint holds whole batches ($done rows)"
else
    bad "full: the checkpoint holds whole batches" "done=$done"
fi
if [ "$env" = "$done" ]; then ok "full: the checkpoint matches the data ($env envelopes)"; else bad "full: checkpoint matches data" "envelopes=$env done=$done"; fi
plain=$(sql "$F" "SELECT count(*) FROM pay WHERE card LIKE 'card-holder-%'")
if [ $((plain + env)) = 400 ]; then ok "full: every other row is its untouched plaintext"; else bad "full: untouched rows" "plain=$plain env=$env"; fi
expect_eq "full: the checkpoint is resumable" <(cp_field "$F" encrypt state) "running"
run "full: the same command without the limit completes" 0 "$KS" migrate run "${FTGT[@]}"
expect_eq "full: all 400 rows are envelopes" <(envelopes "$F") "400"
all_open "$F" "full"

# ---- 2. the key provider goes away mid-run ------------------------------------------
# Eight groups of 10 rows, each encrypted by its own run (so under its own
# data key); then a rewrap to version 2 makes three provider calls per
# data key (unwrap the old wrap, wrap anew, unwrap the new one to verify):
# failing after 6 calls lets two data keys through, so the run fails in
# its third batch of 10.
P="$T/outage.db"
sql "$P" "CREATE TABLE pay (id INTEGER PRIMARY KEY, tenant TEXT NOT NULL, card TEXT);"
PENC=(--db "$P" --table pay --column card --mode encrypt --to-key pay/kek --tenant-column tenant
      --context 'pay:{id}:card' --purpose card)
made=0
for g in 0 1 2 3 4 5 6 7; do
    sql "$P" "WITH RECURSIVE n(i) AS (SELECT $((g * 10 + 1)) UNION ALL SELECT i + 1 FROM n WHERE i < $((g * 10 + 10)))
INSERT INTO pay SELECT i, 'acme', printf('card-holder-%012d-', i) || hex(randomblob(40)) FROM n;"
    "$KS" migrate run "${PENC[@]}" >/dev/null 2>&1 && made=$((made + 1))
done
if [ "$made" = 8 ]; then ok "outage: 80 rows encrypted under 8 data keys"; else bad "outage: setup" "$made of 8 runs"; fi
run "outage: add version 2" 0 "$KS" keys add-version pay/kek
run "outage: promote version 2" 0 "$KS" keys promote pay/kek 2
PREWRAP=(--db "$P" --table pay --column card --mode rewrap --to-key pay/kek --tenant-column tenant
         --context 'pay:{id}:card' --purpose card --batch-size 10)
KEYSHIFT_TEST_PROVIDER_FAIL_AFTER=6 run "outage: migrate run stops with exit 69" 69 "$KS" migrate run "${PREWRAP[@]}"
expect_grep "outage: the error names the provider" "$T/err" "unavailable"
done=$(cp_field "$P" rewrap done)
v2=$("$KS" census --db "$P" --table pay --column card --json | sed -n 's/.*"key_version":2,"rows":\([0-9]*\).*/\1/p')
v2=${v2:-0}
if [ -n "$done" ] && [ "$done" -ge 10 ] && [ $((done % 10)) = 0 ] && [ "$done" -lt 80 ]; then
    ok "outage: the checkpoint holds whole batches ($done rows)"
else
    bad "outage: the checkpoint holds whole batches" "done=$done"
fi
if [ "$v2" = "$done" ]; then ok "outage: the checkpoint matches the data ($v2 rows at version 2)"; else bad "outage: checkpoint matches data" "v2=$v2 done=$done"; fi
expect_eq "outage: the checkpoint is resumable" <(cp_field "$P" rewrap state) "running"
run "outage: the same command once the provider is back completes" 0 "$KS" migrate run "${PREWRAP[@]}"
"$KS" census --db "$P" --table pay --column card --json >"$T/census.json"
expect_grep "outage: all 80 rows at version 2" "$T/census.json" '"key_version":2,"rows":80}'
all_open "$P" "outage"

cli_finish cli_migrate_faults
