#!/usr/bin/env bash
# tools/demo/demo.sh -- the keyshift demo (`make demo`): encrypt a live column of
# a sample SQLite database, rotate its key, rewrap and verify.
#
# In a fresh directory under build/demo/ it:
#   1. creates payments.db with DEMO_ROWS payment records (default 100000),
#      each about 2 KiB of plaintext card-holder JSON, and a local keyring;
#   2. runs `keyshift census`, then `keyshift migrate run --mode encrypt`;
#   3. adds and promotes a new key version, runs `migrate run --mode rewrap`
#      and `migrate verify`, and prints a summary.
# Every step is checked; the script stops with a non-zero status at the
# first failure.  The sample data is synthetic; the keyring is a throwaway.
#
# Usage: tools/demo/demo.sh [path/to/keyshift]     (default: build/bin/keyshift)
#   DEMO_ROWS=N   how many records (default 100000)
#   DEMO_DIR=DIR  where to work (default: a new directory under build/demo/)
set -euo pipefail

KS=${1:-build/bin/keyshift}
ROWS=${DEMO_ROWS:-100000}
case $ROWS in '' | *[!0-9]*) echo "demo: DEMO_ROWS must be a number" >&2; exit 64 ;; esac
[ -x "$KS" ] || { echo "demo: $KS is not built (run make)" >&2; exit 66; }
. "$(dirname "$0")/demo_lib.sh"
KS=$(abs_path "$KS")
demo_workdir run
TARGET=(--db "$DB" --table payments --column card)
CONTEXT=(--context 'payments:{id}:card' --purpose card)
START=$(date +%s.%N)

# Run a command, showing it; stop the demo if it fails.
show() {
    printf '$ %s\n' "$*" | sed "s|$D/||g; s|$KS|keyshift|g"
    if ! "$@"; then
        echo "demo: step $step failed: $*" >&2
        exit 1
    fi
}

heading "Create $ROWS payment records (~2 KiB of plaintext JSON each) and a keyring in ${D#"$PWD"/}"
sqlite3 "$DB" >/dev/null <<SQL
PRAGMA journal_mode = WAL;
BEGIN;
CREATE TABLE payments (
    id     INTEGER PRIMARY KEY,
    tenant TEXT NOT NULL,
    card   TEXT
);
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < $ROWS)
INSERT INTO payments (id, tenant, card)
SELECT i, 'acme',
       printf('{"holder":"Customer %d","pan":"4111%012d","exp":"%02d/%02d","cvv_hash":"%s",'
              || '"address":"%d Main Street, Springfield","history":"%s"}',
              i, i, 1 + i % 12, 27 + i % 5, hex(randomblob(16)), i, hex(randomblob(950)))
FROM n;
COMMIT;
SQL
echo "payments.db: $(sqlite3 "$DB" 'SELECT count(*) FROM payments') rows, \
$(sqlite3 "$DB" 'SELECT avg(length(card)) FROM payments' | cut -d. -f1) bytes of plaintext per card on average"
show "$KS" keys init
show "$KS" keys create payments/kek

heading "Census before: everything is plaintext"
show "$KS" census "${TARGET[@]}"

heading "Encrypt the column in place (verified batches, resumable, live-safe)"
show "$KS" migrate run "${TARGET[@]}" --mode encrypt --to-key payments/kek \
    --tenant-column tenant "${CONTEXT[@]}"
show "$KS" census "${TARGET[@]}"
plain=$("$KS" census "${TARGET[@]}" --json | sed -n 's/.*"plaintext":\([0-9]*\).*/\1/p')
[ "$plain" = 0 ] || { echo "demo: $plain rows are still plaintext" >&2; exit 1; }

heading "Rotate: add version 2 of payments/kek and promote it"
show "$KS" keys add-version payments/kek
show "$KS" keys promote payments/kek 2
show "$KS" keys list

heading "Rewrap every row's data key under version 2 (ciphertext untouched)"
show "$KS" migrate run "${TARGET[@]}" --mode rewrap --to-key payments/kek:2 --tenant-column tenant \
    "${CONTEXT[@]}"
show "$KS" census "${TARGET[@]}"

heading "Verify: every envelope opens with its row's context"
show "$KS" migrate verify "${TARGET[@]}" --tenant-column tenant "${CONTEXT[@]}"
show "$KS" migrate status --db "$DB"

heading "One record, decrypted with the CLI"
env_hex=$(sqlite3 "$DB" "SELECT hex(card) FROM payments WHERE id = 42")
printf "$(printf '%s' "$env_hex" | sed 's/../\\x&/g')" >"$D/42.kse"
show "$KS" inspect "$D/42.kse"
printf '$ keyshift decrypt --context payments:42:card < 42.kse | head -c 120\n'
"$KS" decrypt --context payments:42:card --tenant acme --purpose card <"$D/42.kse" | head -c 120
echo

END=$(date +%s.%N)
heading "Summary"
awk -v s="$START" -v e="$END" -v n="$ROWS" 'BEGIN {
    printf "%d records encrypted, rotated to key version 2 and verified in %.1f s\n", n, e - s }'
echo "everything is in ${D#"$PWD"/} (payments.db, keyring); remove it when done"
