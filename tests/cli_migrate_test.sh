#!/usr/bin/env bash
# tests/cli_migrate_test.sh -- end-to-end tests of `keyshift census` and
# `keyshift migrate run|status|verify` on small SQLite databases built with
# the sqlite3 CLI: exact census counts, encrypt/rewrap round trips checked
# with `keyshift decrypt`, idempotent reruns, verify, every documented exit
# code (64, 65, 66, 75, 77), a mistaken rewrap (no --context) then the
# corrected one retrying its quarantined rows, quarantine list and
# release, one name for a bad-tenant row in verify and quarantine, a TEXT
# column of base64 envelopes (--encoding base64) through census, encrypt,
# rewrap, verify and quarantine, pause
# on SIGINT and resume, --synchronous
# (normal on a WAL database, refused on a rollback journal), and a smoke
# run of tools/demo/demo.sh.
#
# Usage: KEYSHIFT=path/to/keyshift tests/cli_migrate_test.sh
set -u

. "$(dirname "$0")/cli_lib.sh"
unset KEYSHIFT_PASSPHRASE
export KEYSHIFT_KEYRING="$T/keyring"
IN=/dev/null
ROOT=$(cd "$(dirname "$0")/.." && pwd)

command -v sqlite3 >/dev/null || { echo "cli_migrate_test: sqlite3 is missing (tools/deps.sh)"; exit 1; }

# sql DB STATEMENTS: run SQL with the sqlite3 CLI.
sql() { sqlite3 "$1" "$2"; }

# open_row DB ID: decrypt row ID of table pay (context pay:ID:card).
open_row() { open_hex "$(sql "$1" "SELECT hex(card) FROM pay WHERE id = $2")" "$2"; }

run "keys init" 0 "$KS" keys init
run "keys create" 0 "$KS" keys create payments/kek

# ---- help ------------------------------------------------------------------------
run "census --help" 0 "$KS" census --help
expect_grep "census manual has EXIT STATUS" "$T/out" "^EXIT STATUS"
run "migrate --help" 0 "$KS" migrate --help
expect_grep "--no-verify states the risk" "$T/out" "guarantees every written row opens"
run "keyshift --help lists migrate" 0 "$KS" --help
expect_grep "top-level help lists migrate" "$T/out" "migrate "

# ---- census ----------------------------------------------------------------------
C="$T/census.db"
sql "$C" "CREATE TABLE t (id INTEGER PRIMARY KEY, v BLOB);
INSERT INTO t (v) VALUES (NULL), (NULL), (NULL), ('plain 1'), ('plain 2'), (X'00'), ('');
INSERT INTO t (v) VALUES (X'$(seal_card c1 1)'), (X'$(seal_card c2 1)');
INSERT INTO t (v) VALUES (X'$(seal_card c3 2)'), (X'$(seal_card c4 2)'), (X'$(seal_card c5 2)');
INSERT INTO t (v) VALUES (X'4B534502'), (X'4B534509');"
run "census" 0 "$KS" census --db "$C" --table t --column v
expect_grep "census: 14 rows" "$T/out" "^rows *14$"
expect_grep "census: 3 NULL" "$T/out" "^null *3$"
expect_grep "census: 4 plaintext" "$T/out" "^plaintext *4$"
expect_grep "census: 5 envelopes" "$T/out" "^envelopes *5$"
expect_grep "census: 2 malformed" "$T/out" "^malformed *2$"
expect_grep "census: v1 class" "$T/out" "^v1 *xchacha20-poly1305 *payments/kek *1 *2$"
expect_grep "census: v2 class" "$T/out" "^v2 *xchacha20-poly1305 *payments/kek *1 *3$"
expect_grep "census: unsupported-version" "$T/out" "^unsupported-version *1$"
run "census --json" 0 "$KS" census --db "$C" --table t --column v --json
expect_grep "census --json totals" "$T/out" '^{"rows":14,"null":3,"plaintext":4,"envelopes":5,"malformed":2,"classes":\['
expect_grep "census --json v1 class" "$T/out" '{"version":1,"algorithm":"xchacha20-poly1305","key_id":"payments/kek","key_version":1,"rows":2}'
expect_grep "census --json v2 class" "$T/out" '{"version":2,"algorithm":"xchacha20-poly1305","key_id":"payments/kek","key_version":1,"rows":3}'
expect_grep "census --json malformed by error" "$T/out" '"unsupported-version":1'
if [ "$(grep -c . "$T/out")" = 1 ]; then ok "census --json is one line"; else bad "census --json is one line"; fi
run "census: no such database" 66 "$KS" census --db "$T/nosuch.db" --table t --column v
run "census: no such table" 66 "$KS" census --db "$C" --table nosuch --column v
run "census: no such column" 66 "$KS" census --db "$C" --table t --column nosuch
run "census: --table missing" 64 "$KS" census --db "$C" --column v
run "census: unknown option" 64 "$KS" census --db "$C" --table t --column v --bogus

# ---- migrate encrypt -------------------------------------------------------------
D="$T/pay.db"
sql "$D" "CREATE TABLE pay (id INTEGER PRIMARY KEY, tenant TEXT NOT NULL, card TEXT);
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 200)
INSERT INTO pay SELECT i, 'acme', printf('card-%04d-4111', i) FROM n;
INSERT INTO pay VALUES (201, 'acme', NULL), (202, 'acme', NULL);"
TGT=(--db "$D" --table pay --column card)
CTX=(--context 'pay:{id}:card' --purpose card --tenant-column tenant)
run "encrypt: bad mode" 64 "$KS" migrate run "${TGT[@]}" --mode decrypt --to-key payments/kek "${CTX[@]}"
run "encrypt: missing --to-key" 64 "$KS" migrate run "${TGT[@]}" --mode encrypt "${CTX[@]}"
run "encrypt: no tenant" 64 "$KS" migrate run "${TGT[@]}" --mode encrypt --to-key payments/kek
run "encrypt: bad context template" 64 "$KS" migrate run "${TGT[@]}" --mode encrypt --to-key payments/kek --tenant acme --context 'pay:{id'
run "encrypt: unclosed brace" 64 "$KS" migrate run "${TGT[@]}" --mode encrypt --to-key payments/kek --tenant acme --context 'orders:{id:card'
expect_grep "unclosed brace: its byte offset" "$T/err" 'an unclosed "{" (write "{{" for a literal brace) at byte 7 '
run "encrypt: lone closing brace" 64 "$KS" migrate run "${TGT[@]}" --mode encrypt --to-key payments/kek --tenant acme --context 'a}b'
expect_grep "lone closing brace: its byte offset" "$T/err" 'a lone "}" .* at byte 1 '
run "encrypt: unknown key" 77 "$KS" migrate run "${TGT[@]}" --mode encrypt --to-key nosuch/kek "${CTX[@]}"
run "encrypt: no such column" 66 "$KS" migrate run --db "$D" --table pay --column nosuch --mode encrypt --to-key payments/kek "${CTX[@]}"
run "encrypt: no such database" 66 "$KS" migrate run --db "$T/nosuch.db" --table pay --column card --mode encrypt --to-key payments/kek "${CTX[@]}"
if [ ! -e "$T/nosuch.db" ]; then ok "no database file was created"; else bad "no database file was created"; fi
run "status before any run" 0 "$KS" migrate status --db "$D"
run "encrypt" 0 "$KS" migrate run "${TGT[@]}" --mode encrypt --to-key payments/kek "${CTX[@]}" --batch-size 50
expect_grep "encrypt: summary on stderr" "$T/err" "complete: 200 rewritten"
expect_empty "encrypt: nothing on stdout without --json" "$T/out"
run "census after encrypt" 0 "$KS" census "${TGT[@]}" --json
expect_grep "census after encrypt: 0 plaintext, 200 envelopes" "$T/out" '"null":2,"plaintext":0,"envelopes":200,"malformed":0'
for id in 1 77 200; do
    if [ "$(open_row "$D" $id 2>&1)" = "$(printf 'card-%04d-4111' $id)" ]; then ok "row $id decrypts to its plaintext"; else bad "row $id decrypts" "$(open_row "$D" $id 2>&1 | head -c 200)"; fi
done
if sql "$D" "SELECT count(*) FROM pay WHERE card LIKE '%4111%'" | grep -qx 0; then ok "no plaintext left in the column"; else bad "no plaintext left in the column"; fi
sql "$D" "SELECT id, hex(card) FROM pay ORDER BY id" >"$T/before"
run "status --json after encrypt" 0 "$KS" migrate status --db "$D" --json
cp "$T/out" "$T/status1"
expect_grep "status: complete" "$T/out" '"state":"complete"'
expect_grep "status: 200 done" "$T/out" '"done":200,'
run "encrypt again" 0 "$KS" migrate run "${TGT[@]}" --mode encrypt --to-key payments/kek "${CTX[@]}" --batch-size 50
sql "$D" "SELECT id, hex(card) FROM pay ORDER BY id" >"$T/after"
expect_same "encrypt again writes nothing" "$T/before" "$T/after"
run "status --json after the rerun" 0 "$KS" migrate status --db "$D" --json
if [ "$(json_field "$T/out" done)" = "$(json_field "$T/status1" done)" ] || [ "$(json_field "$T/out" done)" = 0 ]; then
    ok "rerun: no row counted as rewritten"; else bad "rerun: no row counted as rewritten" "$(cat "$T/out")"; fi
run "status --table --column" 0 "$KS" migrate status --db "$D" --table pay --column card
expect_grep "status text: state" "$T/out" "^state *complete"
run "status: no such database" 66 "$KS" migrate status --db "$T/nosuch.db"
# the checkpoint rows are read back as untrusted bytes: a malformed one is refused
cp "$D" "$T/badcp.db"
sql "$T/badcp.db" "UPDATE keyshift_migration SET done = -1"
run "status: a malformed checkpoint row" 74 "$KS" migrate status --db "$T/badcp.db" --json
expect_grep "status: malformed row named" "$T/err" "malformed row in keyshift_migration"

# ---- rotate: rewrap -------------------------------------------------------------------
run "add-version" 0 "$KS" keys add-version payments/kek
run "promote 2" 0 "$KS" keys promote payments/kek 2
run "rewrap --json" 0 "$KS" migrate run "${TGT[@]}" --mode rewrap --to-key payments/kek "${CTX[@]}" --json --batch-size 64
expect_grep "rewrap --json: per-batch objects" "$T/out" '^{"batch":1,'
expect_grep "rewrap --json: summary" "$T/out" '^{"result":"complete","error":"ok","exit":0,'
run "census after rewrap" 0 "$KS" census "${TGT[@]}" --json
expect_grep "census: all 200 under version 2" "$T/out" '"classes":\[{"version":2,"algorithm":"xchacha20-poly1305","key_id":"payments/kek","key_version":2,"rows":200}\]'
if [ "$(open_row "$D" 5 2>&1)" = "card-0005-4111" ]; then ok "rewrapped row decrypts"; else bad "rewrapped row decrypts"; fi
run "verify" 0 "$KS" migrate verify "${TGT[@]}" "${CTX[@]}"
expect_grep "verify: 200 checked" "$T/out" "200 envelopes checked, 0 failed"
run "verify --sample --json" 0 "$KS" migrate verify "${TGT[@]}" "${CTX[@]}" --sample 20 --json
expect_grep "verify --json summary" "$T/out" '"failed":0,'
sql "$D" "UPDATE pay SET card = (SELECT card FROM pay WHERE id = 2) WHERE id = 1"
run "verify finds a moved envelope" 65 "$KS" migrate verify "${TGT[@]}" "${CTX[@]}"
expect_grep "verify names the row by id" "$T/out" "FAILED id 1: auth-failed"
if grep -q "card-0002" "$T/out" "$T/err"; then bad "verify prints no plaintext"; else ok "verify prints no plaintext"; fi

# ---- failure threshold ---------------------------------------------------------------
M="$T/malformed.db"
sql "$M" "CREATE TABLE pay (id INTEGER PRIMARY KEY, tenant TEXT NOT NULL, card BLOB);
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 100)
INSERT INTO pay SELECT i, 'acme', CASE WHEN i % 2 THEN X'4B534502' ELSE 'plain' END FROM n;"
run "threshold: exit 65" 65 "$KS" migrate run --db "$M" --table pay --column card --mode encrypt \
    --to-key payments/kek "${CTX[@]}" --max-failure-rate 0.001 --batch-size 10
expect_grep "threshold: explained" "$T/err" "keyshift_quarantine"
if [ "$(sql "$M" "SELECT count(*) FROM pay WHERE hex(card) = '4B534502'")" = 50 ]; then ok "quarantined rows are untouched"; else bad "quarantined rows are untouched"; fi

# ---- a mistaken rewrap (no --context), then the corrected one -------------------------
# The mistaken run quarantines every row auth-failed and says the likely
# cause; the corrected command is refused as a mismatch only (not as a
# bug); with --supersede it tries every quarantined row again and rewraps
# them all; quarantine list shows the mistaken run's rows, release frees
# them, and a rerun's summary counts what that run did.
run "keys create mistake/kek" 0 "$KS" keys create mistake/kek
R="$T/mistake.db"
sql "$R" "CREATE TABLE pay (id INTEGER PRIMARY KEY, tenant TEXT NOT NULL, card TEXT);
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 40)
INSERT INTO pay SELECT i, 'acme', printf('card-%04d-4111', i) FROM n;"
RTGT=(--db "$R" --table pay --column card)
run "mistake: encrypt" 0 "$KS" migrate run "${RTGT[@]}" --mode encrypt --to-key payments/kek "${CTX[@]}" --batch-size 10
sql "$R" "SELECT id, hex(card) FROM pay ORDER BY id" >"$T/mistake-before"
run "mistake: rewrap without --context: exit 65" 65 "$KS" migrate run "${RTGT[@]}" --mode rewrap \
    --to-key mistake/kek --tenant-column tenant --purpose card --batch-size 10
expect_grep "mistake: the likely cause is named" "$T/err" "most rows of the first batch failed with auth-failed"
expect_grep "mistake: context, purpose or tenant" "$T/err" "context, --purpose or tenant"
sql "$R" "SELECT id, hex(card) FROM pay ORDER BY id" >"$T/mistake-after"
expect_same "mistake: no row modified" "$T/mistake-before" "$T/mistake-after"
run "mistake: corrected command: exit 65 (mismatch)" 65 "$KS" migrate run "${RTGT[@]}" --mode rewrap \
    --to-key mistake/kek "${CTX[@]}" --batch-size 10
expect_grep "mismatch: one cause, named" "$T/err" "an unfinished migration of this column with other parameters exists"
if grep -q "report it as a bug" "$T/err"; then bad "mismatch: not blamed on a bug" "$(cat "$T/err")"; else ok "mismatch: not blamed on a bug"; fi
run "mistake: corrected command with --supersede" 0 "$KS" migrate run "${RTGT[@]}" --mode rewrap \
    --to-key mistake/kek "${CTX[@]}" --batch-size 10 --supersede
expect_grep "corrected: every quarantined row retried and rewrapped" "$T/err" "complete: 40 rewritten, 0 already at target, 0 raced, 0 quarantined"
run "census after the corrected run" 0 "$KS" census "${RTGT[@]}" --json
expect_grep "census: all 40 under the new key" "$T/out" '"classes":\[{"version":2,"algorithm":"xchacha20-poly1305","key_id":"mistake/kek","key_version":1,"rows":40}\]'
run "verify after the corrected run" 0 "$KS" migrate verify "${RTGT[@]}" "${CTX[@]}"
run "quarantine --help" 0 "$KS" migrate quarantine --help
expect_grep "quarantine --help: release selectors" "$T/out" "--error NAME | --id ID --error NAME | --all"
run "quarantine list" 0 "$KS" migrate quarantine list "${RTGT[@]}"
if [ "$(grep -c ' auth-failed .* migration mode=rewrap' "$T/out")" = 40 ]; then ok "quarantine list: 40 rows of the mistaken run"; else bad "quarantine list: 40 rows of the mistaken run" "$(head -3 "$T/out")"; fi
run "quarantine list --json" 0 "$KS" migrate quarantine list "${RTGT[@]}" --json
if [ "$(grep -c '^{"id":[0-9]*,"error":"auth-failed","migration":"mode=rewrap;.*","time":"' "$T/out")" = 40 ]; then ok "quarantine list --json: one object per line"; else bad "quarantine list --json: one object per line" "$(head -2 "$T/out")"; fi
run "quarantine release: no selector" 64 "$KS" migrate quarantine release "${RTGT[@]}"
run "quarantine release: --all with --id" 64 "$KS" migrate quarantine release "${RTGT[@]}" --all --id 3
run "quarantine release --id 3" 0 "$KS" migrate quarantine release "${RTGT[@]}" --id 3
expect_grep "quarantine release: logged" "$T/err" "released 1 row(s) of pay.card from quarantine (selected: id 3)"
run "quarantine release --error auth-failed --json" 0 "$KS" migrate quarantine release "${RTGT[@]}" --error auth-failed --json
expect_grep "quarantine release --json" "$T/out" '^{"released":39}$'
run "quarantine list: empty" 0 "$KS" migrate quarantine list "${RTGT[@]}" --json
expect_empty "quarantine list: nothing left" "$T/out"
run "corrected rerun --json" 0 "$KS" migrate run "${RTGT[@]}" --mode rewrap --to-key mistake/kek "${CTX[@]}" --json
expect_grep "rerun summary: this run's counts, then the migration's" "$T/out" '^{"result":"complete","error":"ok","exit":0,"pass":[0-9]*,"done":0,"skipped":0,"raced":0,"quarantined":0,"wrong_state":0,.*"migration":{"done":40,'
# verify and quarantine name a row with a bad tenant the same way
B="$T/badtenant.db"
sql "$B" "ATTACH '$R' AS r; CREATE TABLE pay (id INTEGER PRIMARY KEY, tenant TEXT, card BLOB);
INSERT INTO pay SELECT id, CASE WHEN id = 1 THEN NULL ELSE tenant END, card FROM r.pay;"
run "verify: a row without a tenant" 65 "$KS" migrate verify --db "$B" --table pay --column card "${CTX[@]}"
expect_grep "verify names it bad-tenant, as quarantine does" "$T/out" "FAILED id 1: bad-tenant"

# ---- SIGINT: pause, then resume ------------------------------------------------------------
S="$T/slow.db"
sql "$S" "CREATE TABLE pay (id INTEGER PRIMARY KEY, tenant TEXT NOT NULL, card TEXT);
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 3000)
INSERT INTO pay SELECT i, 'acme', printf('card-%04d-4111', i) FROM n;"
STGT=(--db "$S" --table pay --column card --mode encrypt --to-key payments/kek "${CTX[@]}")
sigint_run "${STGT[@]}"
left=$(sql "$S" "SELECT count(*) FROM pay WHERE card LIKE 'card-%'")
if [ "$left" -gt 0 ] && [ "$left" -lt 3000 ]; then ok "SIGINT: paused part-way ($left rows left)"; else bad "SIGINT: paused part-way" "$left rows left"; fi
run "status: paused" 0 "$KS" migrate status --db "$S" --json
expect_grep "status: state paused" "$T/out" '"state":"paused"'
run "other parameters while paused: exit 65" 65 "$KS" migrate run --db "$S" --table pay --column card \
    --mode encrypt --to-key payments/kek --tenant-column tenant --context 'other:{id}' --purpose card
expect_grep "mismatch: explained" "$T/err" "migrate status"
expect_grep "mismatch: names --supersede" "$T/err" "supersede"
cp "$S" "$T/supersede.db"
run "other parameters with --supersede" 0 "$KS" migrate run --db "$T/supersede.db" --table pay --column card \
    --mode encrypt --to-key payments/kek --tenant-column tenant --context 'other:{id}' --purpose card --supersede
run "status after --supersede" 0 "$KS" migrate status --db "$T/supersede.db" --json
expect_grep "status: the paused run is superseded" "$T/out" '"state":"superseded"'
expect_grep "status: the new run is complete" "$T/out" '"state":"complete"'
run "resume" 0 "$KS" migrate run "${STGT[@]}" --batch-size 500
if [ "$(sql "$S" "SELECT count(*) FROM pay WHERE card LIKE 'card-%'")" = 0 ]; then ok "resume: every row migrated"; else bad "resume: every row migrated"; fi
run "verify after resume" 0 "$KS" migrate verify --db "$S" --table pay --column card "${CTX[@]}"

# ---- --no-verify, and a missing keyring ----------------------------------------------
N="$T/noverify.db"
sql "$N" "CREATE TABLE pay (id INTEGER PRIMARY KEY, tenant TEXT NOT NULL, card TEXT);
INSERT INTO pay VALUES (1, 'acme', 'card-0001-4111'), (2, 'acme', 'card-0002-4111');"
run "encrypt --no-verify" 0 "$KS" migrate run --db "$N" --table pay --column card --mode encrypt \
    --to-key payments/kek "${CTX[@]}" --no-verify
if [ "$(open_row "$N" 2 2>&1)" = "card-0002-4111" ]; then ok "--no-verify row decrypts"; else bad "--no-verify row decrypts"; fi
KEYSHIFT_KEYRING="$T/nosuch-keyring" run "missing keyring: exit 78" 78 "$KS" migrate verify --db "$N" --table pay --column card "${CTX[@]}"

# ---- two columns, same parameters: separate checkpoints ------------------------------
W="$T/twocols.db"
sql "$W" "CREATE TABLE pay (id INTEGER PRIMARY KEY, a TEXT, b TEXT);
INSERT INTO pay VALUES (1, 'a-secret-1', 'b-secret-1'), (2, 'a-secret-2', 'b-secret-2');"
run "column a" 0 "$KS" migrate run --db "$W" --table pay --column a --mode encrypt --to-key payments/kek --tenant acme
run "column b, same parameters, --serial (no helper thread)" 0 "$KS" migrate run --db "$W" --table pay --column b --mode encrypt --to-key payments/kek --tenant acme --serial
run "--serial is an option of run only" 64 "$KS" migrate verify --db "$W" --table pay --column b --tenant acme --serial
if [ "$(sql "$W" "SELECT count(*) FROM pay WHERE a LIKE '%secret%' OR b LIKE '%secret%'")" = 0 ]; then
    ok "both columns encrypted (checkpoints scoped per column)"
else
    bad "both columns encrypted (checkpoints scoped per column)"
fi
run "status lists both" 0 "$KS" migrate status --db "$W" --json
expect_grep "status: column a" "$T/out" '"column":"a"'
expect_grep "status: column b" "$T/out" '"column":"b"'

# ---- --synchronous: normal only for a WAL database ------------------------------------
Y="$T/sync-wal.db"
sql "$Y" "PRAGMA journal_mode = WAL;
CREATE TABLE pay (id INTEGER PRIMARY KEY, tenant TEXT NOT NULL, card TEXT);
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 300)
INSERT INTO pay SELECT i, 'acme', printf('card-%04d-4111', i) FROM n;" >/dev/null
YTGT=(--db "$Y" --table pay --column card --mode encrypt --to-key payments/kek "${CTX[@]}")
run "migrate --help" 0 "$KS" migrate --help
expect_grep "migrate --help documents --synchronous" "$T/out" "--synchronous full|normal"
run "--synchronous: bad value" 64 "$KS" migrate run "${YTGT[@]}" --synchronous fast
expect_grep "--synchronous: bad value named" "$T/err" "synchronous must be full or normal"
run "--synchronous is an option of run only" 64 "$KS" migrate verify --db "$Y" --table pay --column card --tenant acme --synchronous normal
run "--synchronous normal on a WAL database" 0 "$KS" migrate run "${YTGT[@]}" --synchronous normal --batch-size 50
expect_grep "--synchronous normal: complete" "$T/err" "complete: 300 rewritten"
run "--synchronous normal: census" 0 "$KS" census --db "$Y" --table pay --column card --json
expect_grep "--synchronous normal: converged (0 plaintext, 300 envelopes)" "$T/out" '"plaintext":0,"envelopes":300,'
run "--synchronous normal: verify" 0 "$KS" migrate verify --db "$Y" --table pay --column card "${CTX[@]}"
if [ "$(sql "$Y" "PRAGMA journal_mode")" = wal ]; then ok "--synchronous normal: the database stays in WAL"; else bad "--synchronous normal: the database stays in WAL"; fi
R="$T/sync-delete.db"
sql "$R" "CREATE TABLE pay (id INTEGER PRIMARY KEY, tenant TEXT NOT NULL, card TEXT);
INSERT INTO pay VALUES (1, 'acme', 'card-0001-4111'), (2, 'acme', 'card-0002-4111');"
run "--synchronous normal on a rollback journal: refused" 64 "$KS" migrate run --db "$R" --table pay --column card \
    --mode encrypt --to-key payments/kek "${CTX[@]}" --synchronous normal
expect_grep "--synchronous normal refused: why" "$T/err" "synchronous NORMAL is safe only in WAL mode, and the database's journal mode is delete"
if [ "$(sql "$R" "SELECT count(*) FROM sqlite_master WHERE name LIKE 'keyshift%'")-$(sql "$R" "SELECT count(*) FROM pay WHERE card LIKE '%4111'")" = 0-2 ]; then
    ok "--synchronous normal refused: nothing written"; else bad "--synchronous normal refused: nothing written"; fi
run "--synchronous full on a rollback journal" 0 "$KS" migrate run --db "$R" --table pay --column card \
    --mode encrypt --to-key payments/kek "${CTX[@]}" --synchronous full
expect_grep "--synchronous full: complete" "$T/err" "complete: 2 rewritten"

# ---- the adaptive batch size (--batch-target) -------------------------------------------
A="$T/adapt.db"
sql "$A" "CREATE TABLE pay (id INTEGER PRIMARY KEY, tenant TEXT NOT NULL, card TEXT);
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 3000)
INSERT INTO pay SELECT i, 'acme', printf('card-%04d-4111', i) FROM n;"
ATGT=(--db "$A" --table pay --column card --mode encrypt --to-key payments/kek "${CTX[@]}")
for bad_target in 0.5x 2h -1s 0.0001s 1.5ms ''; do
    run "--batch-target '$bad_target': refused" 64 "$KS" migrate run "${ATGT[@]}" --batch-target "$bad_target"
done
run "--batch-max 5: refused" 64 "$KS" migrate run "${ATGT[@]}" --batch-target 1s --batch-max 5
run "--batch-max 100001: refused" 64 "$KS" migrate run "${ATGT[@]}" --batch-target 1s --batch-max 100001
run "--batch-max without --batch-target: refused" 64 "$KS" migrate run "${ATGT[@]}" --batch-max 100
run "--batch-target is not verify's" 64 "$KS" migrate verify --db "$A" --table pay --column card "${CTX[@]}" --batch-target 1s
if [ "$(sql "$A" "SELECT count(*) FROM sqlite_master WHERE name LIKE 'keyshift%'")" = 0 ]; then
    ok "--batch-target refused: nothing written"; else bad "--batch-target refused: nothing written"; fi
# batch_rows of every per-batch line of $T/out, one a line (not the
# pass's end, a line of 0 rows)
batch_rows() { sed -n 's/^{"batch":[0-9]*,"batch_rows":\([1-9][0-9]*\),.*/\1/p' "$T/out"; }
# quick batches grow (at most twice a step) up to --batch-max; pipelined,
# the batch after a commit is already read, so a size shows a batch late
run "--batch-target 10s grows" 0 "$KS" migrate run "${ATGT[@]}" --batch-size 10 --batch-target 10s --batch-max 400 --json
batch_rows >"$T/rows"
if [ "$(head -4 "$T/rows" | tr '\n' ' ')" = "10 10 20 40 " ]; then ok "--batch-target: 10, 10, 20, 40 rows"; else bad "--batch-target: 10, 10, 20, 40 rows" "$(tr '\n' ' ' <"$T/rows")"; fi
if [ "$(sort -n "$T/rows" | tail -1)" = 400 ]; then ok "--batch-target: up to --batch-max"; else bad "--batch-target: up to --batch-max" "$(tr '\n' ' ' <"$T/rows")"; fi
expect_grep "--batch-target: complete" "$T/out" '"result":"complete"'
expect_grep "--batch-target: every row" "$T/out" '"done":3000,'
# batches far over the target shrink at once, down to the floor of 10 rows
sql "$A" "DELETE FROM keyshift_migration; UPDATE pay SET card = printf('card-%04d-4111', id)"
run "--batch-target 1ms shrinks" 0 "$KS" migrate run "${ATGT[@]}" --batch-size 1000 --batch-target 1ms --json
batch_rows >"$T/rows"
# (the pass's last batch, the rows left, may have fewer than 10)
if [ "$(head -2 "$T/rows" | tr '\n' ' ')" = "1000 1000 " ] && [ "$(sed -n 3p "$T/rows")" -lt 1000 ] &&
   [ "$(sed '$d' "$T/rows" | sort -n | head -1)" -ge 10 ]; then
    ok "--batch-target 1ms: 1000 rows, then fewer (not under 10)"; else bad "--batch-target 1ms: 1000 rows, then fewer" "$(tr '\n' ' ' <"$T/rows")"; fi
if [ "$(grep -c . "$T/rows")" -gt 5 ]; then ok "--batch-target 1ms: many small batches"; else bad "--batch-target 1ms: many small batches" "$(tr '\n' ' ' <"$T/rows")"; fi
expect_grep "--batch-target 1ms: every row" "$T/out" '"done":3000,'

# ---- row ids that survive VACUUM and dump/restore ---------------------------------------------
# A table without an INTEGER PRIMARY KEY: its bare rowid is renumbered by
# VACUUM once rows were deleted, so a context binding {id} is refused
# before anything is written to it.
U="$T/bare_rowid.db"
sql "$U" "CREATE TABLE pay (tenant TEXT NOT NULL, card BLOB);
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 300)
INSERT INTO pay SELECT 'acme', printf('card-%04d-4111', i) FROM n;"
sql "$U" "SELECT rowid, hex(tenant), hex(card) FROM pay ORDER BY rowid" >"$T/bare_before"
UTGT=(--db "$U" --table pay --column card)
run "bare rowid, {id}: encrypt refused" 64 "$KS" migrate run "${UTGT[@]}" --mode encrypt --to-key payments/kek "${CTX[@]}"
expect_grep "bare rowid: says why" "$T/err" 'no INTEGER PRIMARY KEY, so its row id is the bare rowid, which VACUUM and a dump/restore renumber'
expect_grep "bare rowid: fix 1, --id-column" "$T/err" 'Give --id-column naming the INTEGER PRIMARY KEY or a UNIQUE NOT NULL column'
expect_grep "bare rowid: fix 2, a context without {id}" "$T/err" 'or a --context that does not bind {id} (unstable-id)'
run "bare rowid, {id}: verify refused" 64 "$KS" migrate verify "${UTGT[@]}" "${CTX[@]}"
sql "$U" "SELECT rowid, hex(tenant), hex(card) FROM pay ORDER BY rowid" >"$T/bare_after"
expect_same "bare rowid refused: the table is unchanged" "$T/bare_before" "$T/bare_after"
if [ "$(sql "$U" "SELECT count(*) FROM pay WHERE card LIKE 'card-%'")" = 300 ]; then
    ok "bare rowid refused: every row still plaintext"; else bad "bare rowid refused: every row still plaintext"; fi
run "bare rowid: census still reads it" 0 "$KS" census "${UTGT[@]}"
expect_grep "bare rowid census: 300 plaintext" "$T/out" "^plaintext *300$"
run "bare rowid, no {id}: encrypt runs" 0 "$KS" migrate run "${UTGT[@]}" --mode encrypt --to-key payments/kek --context 'pay:card' --purpose card --tenant-column tenant
sql "$U" "DELETE FROM pay WHERE rowid IN (1, 50, 120); VACUUM;"
run "bare rowid, no {id}: verify after VACUUM" 0 "$KS" migrate verify "${UTGT[@]}" --context 'pay:card' --purpose card --tenant-column tenant
# a WITHOUT ROWID table has no rowid: refused, and taken through its primary key
sql "$U" "CREATE TABLE wr (k TEXT PRIMARY KEY, tenant TEXT NOT NULL, card BLOB) WITHOUT ROWID;
INSERT INTO wr VALUES ('a', 'acme', 'card-a'), ('b', 'acme', 'card-b');"
run "WITHOUT ROWID: no id column refused" 64 "$KS" migrate run --db "$U" --table wr --column card --mode encrypt --to-key payments/kek --context 'wr:{id}' --purpose card --tenant-column tenant
expect_grep "WITHOUT ROWID: says to name the primary key" "$T/err" 'WITHOUT ROWID): name its primary key as the id column'
run "WITHOUT ROWID: --id-column k" 0 "$KS" migrate run --db "$U" --table wr --column card --id-column k --mode encrypt --to-key payments/kek --context 'wr:{id}' --purpose card --tenant-column tenant
run "WITHOUT ROWID: verify" 0 "$KS" migrate verify --db "$U" --table wr --column card --id-column k --context 'wr:{id}' --purpose card --tenant-column tenant

# envelopes already sealed under a bare rowid: the rebuild of
# docs/migration.md ("Ids") gives the table an INTEGER PRIMARY KEY holding
# each row's rowid, and they verify
sql "$U" "CREATE TABLE old (tenant TEXT NOT NULL, card BLOB);
INSERT INTO old (rowid, tenant, card) VALUES (1, 'acme', X'$(seal_card pay:1:card 2)'),
    (2, 'acme', X'$(seal_card pay:2:card 2)'), (7, 'acme', X'$(seal_card pay:7:card 2)');"
run "sealed under a bare rowid: verify refused" 64 "$KS" migrate verify --db "$U" --table old --column card "${CTX[@]}"
sql "$U" "BEGIN;
CREATE TABLE old_new (id INTEGER PRIMARY KEY, tenant TEXT NOT NULL, card BLOB);
INSERT INTO old_new (id, tenant, card) SELECT rowid, tenant, card FROM old;
DROP TABLE old; ALTER TABLE old_new RENAME TO old; COMMIT; VACUUM;"
run "rebuilt with an INTEGER PRIMARY KEY: verify" 0 "$KS" migrate verify --db "$U" --table old --column card "${CTX[@]}"
expect_grep "rebuilt: 3 checked" "$T/out" "^3 envelopes checked, 0 failed"

# An INTEGER PRIMARY KEY keeps its values through DELETE + VACUUM and a
# dump/restore: verify stays clean.
K="$T/ipk.db"
sql "$K" "CREATE TABLE pay (id INTEGER PRIMARY KEY, tenant TEXT NOT NULL, card BLOB);
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 300)
INSERT INTO pay SELECT i, 'acme', printf('card-%04d-4111', i) FROM n;"
KTGT=(--db "$K" --table pay --column card)
run "INTEGER PRIMARY KEY: encrypt" 0 "$KS" migrate run "${KTGT[@]}" --mode encrypt --to-key payments/kek "${CTX[@]}"
sql "$K" "DELETE FROM pay WHERE id IN (1, 50, 120); VACUUM;"
run "INTEGER PRIMARY KEY: verify after DELETE + VACUUM" 0 "$KS" migrate verify "${KTGT[@]}" "${CTX[@]}"
expect_grep "INTEGER PRIMARY KEY: 297 checked" "$T/out" "^297 envelopes checked, 0 failed"
rm -f "$T/restored.db"
sqlite3 "$K" .dump | sqlite3 "$T/restored.db"
run "INTEGER PRIMARY KEY: verify after dump/restore" 0 "$KS" migrate verify --db "$T/restored.db" --table pay --column card "${CTX[@]}"
expect_grep "dump/restore: 297 checked" "$T/out" "^297 envelopes checked, 0 failed"
if [ "$(open_row "$T/restored.db" 299)" = card-0299-4111 ]; then ok "dump/restore: row 299 opens"; else bad "dump/restore: row 299 opens"; fi

# ---- a TEXT column of base64 envelopes (docs/format.md section 10) ---------------------------
# --encoding base64: encrypt writes each envelope's canonical text, as TEXT;
# census, rewrap, verify and quarantine read it back; a value beginning
# "S1NF" with non-zero pad bits is malformed: quarantined "bad-value" and
# left as it was, never re-encoded; a binary envelope in the column is
# malformed too (bad-magic), never sealed again.
X="$T/text.db"
NONCANON='S1NFAQgBEgF0GgFrIAEqAaAyDAABAgMEBQYHCAkKC3oQwMHCw8TFxsfIycrLzM3Ozx=='
sql "$X" "CREATE TABLE orders (id INTEGER PRIMARY KEY, tenant TEXT NOT NULL, card_text TEXT);
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 30)
INSERT INTO orders SELECT i, 'acme', printf('card-%04d-4111', i) FROM n;
INSERT INTO orders VALUES (31, 'acme', '$NONCANON'), (32, 'acme', NULL),
    (33, 'acme', X'$(seal_card c1 1)');"
XT=(--db "$X" --table orders --column card_text --encoding base64)
run "keys create text/kek" 0 "$KS" keys create text/kek
run "base64: bad --encoding" 64 "$KS" census --db "$X" --table orders --column card_text --encoding hex
expect_grep "base64: bad --encoding named" "$T/err" "encoding must be binary or base64"
run "base64: census before" 0 "$KS" census "${XT[@]}" --json
expect_grep "base64: census before: 30 plaintext, 2 malformed" "$T/out" '"rows":33,"null":1,"plaintext":30,"envelopes":0,"malformed":2'
expect_grep "base64: census names bad-magic and bad-value" "$T/out" '"malformed_by_error":{"bad-magic":1,"bad-value":1}'
run "base64: encrypt" 0 "$KS" migrate run "${XT[@]}" --mode encrypt --to-key text/kek "${CTX[@]}" --max-failure-rate 0.5
if sql "$X" "SELECT count(*) FROM orders WHERE typeof(card_text) = 'text' AND substr(card_text, 1, 4) = 'S1NF'" | grep -qx 31; then
    ok "base64: every value is text beginning S1NF"; else bad "base64: every value is text beginning S1NF"; fi
if [ "$(sql "$X" "SELECT card_text FROM orders WHERE id = 31")" = "$NONCANON" ]; then
    ok "base64: the non-canonical value is untouched"; else bad "base64: the non-canonical value is untouched"; fi
if [ "$(sql "$X" "SELECT typeof(card_text) || substr(hex(card_text), 1, 6) FROM orders WHERE id = 33")" = blob4B5345 ]; then
    ok "base64: the binary envelope is not sealed again"; else bad "base64: the binary envelope is not sealed again"; fi
xopen() { sql "$X" "SELECT card_text FROM orders WHERE id = $1" | base64 -d >"$T/row.kse" &&
          "$KS" decrypt --context "pay:$1:card" --tenant acme --purpose card <"$T/row.kse"; }
if [ "$(xopen 7 2>&1)" = card-0007-4111 ]; then ok "base64: row 7 decodes and decrypts"; else bad "base64: row 7 decodes and decrypts" "$(xopen 7 2>&1 | head -c 200)"; fi
run "base64: quarantine list" 0 "$KS" migrate quarantine list "${XT[@]}" --json
expect_grep "base64: row 31 quarantined bad-value" "$T/out" '^{"id":31,"error":"bad-value","migration":"mode=encrypt;.*encoding=base64;'
expect_grep "base64: row 33 quarantined bad-magic" "$T/out" '^{"id":33,"error":"bad-magic","migration":"mode=encrypt;.*encoding=base64;'
run "base64: census after encrypt" 0 "$KS" census "${XT[@]}" --json
expect_grep "base64: 30 envelopes" "$T/out" '"plaintext":0,"envelopes":30,"malformed":2'
run "base64: census read as binary" 0 "$KS" census --db "$X" --table orders --column card_text --json
expect_grep "base64: as binary, texts are plaintext" "$T/out" '"plaintext":31,"envelopes":1'
run "text/kek add-version" 0 "$KS" keys add-version text/kek
run "text/kek promote 2" 0 "$KS" keys promote text/kek 2
run "base64: rewrap" 0 "$KS" migrate run "${XT[@]}" --mode rewrap --to-key text/kek "${CTX[@]}" --max-failure-rate 0.5
run "base64: census after rewrap" 0 "$KS" census "${XT[@]}" --json
expect_grep "base64: all 30 under version 2" "$T/out" '"classes":\[{"version":2,"algorithm":"xchacha20-poly1305","key_id":"text/kek","key_version":2,"rows":30}\]'
if [ "$(xopen 30 2>&1)" = card-0030-4111 ]; then ok "base64: rewrapped row 30 decrypts"; else bad "base64: rewrapped row 30 decrypts"; fi
run "base64: verify finds the malformed row" 65 "$KS" migrate verify "${XT[@]}" "${CTX[@]}"
expect_grep "base64: verify: 32 checked, 2 failed" "$T/out" "32 envelopes checked, 2 failed"
expect_grep "base64: verify names it bad-value" "$T/out" "FAILED id 31: bad-value"
sql "$X" "DELETE FROM orders WHERE id IN (31, 33)"
run "base64: verify" 0 "$KS" migrate verify "${XT[@]}" "${CTX[@]}"
expect_grep "base64: verify: 30 checked" "$T/out" "30 envelopes checked, 0 failed"
run "base64: verify without --encoding checks nothing" 0 "$KS" migrate verify --db "$X" --table orders --column card_text "${CTX[@]}"
expect_grep "base64: as binary, 0 checked" "$T/out" "^0 envelopes checked, 0 failed"

# ---- the demo, small -------------------------------------------------------------------------
DEMO_ROWS=2000 DEMO_DIR="$T/demo" run "demo smoke (2000 rows)" 0 "$ROOT/tools/demo/demo.sh" "$KS"
expect_grep "demo: summary" "$T/out" "2000 records encrypted, rotated to key version 2 and verified"

cli_finish cli_migrate_test
