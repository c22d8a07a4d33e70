#!/usr/bin/env bash
# tools/demo/demo_rollout.sh -- a key rotation taken through the rollout phases
# (docs/rollout.md) while an application keeps reading and writing: the
# phase-by-phase half of `make demo` (after tools/demo/demo.sh).
#
# In a fresh directory under build/demo/ it:
#   1. creates payments.db with DEMO_ROWS payment records (default 100000)
#      and a local keyring, and starts one keyshift-demo-app instance that
#      reads and writes the column for the whole demo;
#   2. encrypts the column under payments/kek version 1 through a first
#      rollout (start, read-compat, write-upgrade, backfill with
#      `migrate run --mode encrypt`, verify, finalized);
#   3. adds version 2 and rotates to it through a second rollout, one
#      phase at a time, printing `keyshift rollout status` after each
#      step: start (planned), read-compat, write-upgrade (all tenants;
#      every live reader holds version 2, so it is promoted), backfill
#      (`migrate run --mode rewrap`, `migrate verify`), finalized (which
#      makes version 1 decrypt-only);
#   4. stops the application (SIGTERM) and prints its summary: no read
#      failed.
# Every step is checked; the script stops with a non-zero status at the
# first failure.
#
# Usage: tools/demo/demo_rollout.sh [path/to/keyshift [path/to/keyshift-demo-app]]
#   DEMO_ROWS=N   how many records (default 100000)
#   DEMO_DIR=DIR  where to work (default: a new directory under build/demo/)
set -euo pipefail

KS=${1:-build/bin/keyshift}
APP=${2:-$(dirname "$KS")/keyshift-demo-app}
ROWS=${DEMO_ROWS:-100000}
case $ROWS in '' | *[!0-9]*) echo "demo: DEMO_ROWS must be a number" >&2; exit 64 ;; esac
for b in "$KS" "$APP"; do
    [ -x "$b" ] || { echo "demo: $b is not built (run make)" >&2; exit 66; }
done
. "$(dirname "$0")/demo_lib.sh"
KS=$(abs_path "$KS")
APP=$(abs_path "$APP")
demo_workdir rollout
SCOPE=(--db "$DB" --table payments --column card)
ROW=(--tenant-column tenant --context 'payments:{id}:card')
V1=v2:xchacha20-poly1305:payments/kek:1
V2=v2:xchacha20-poly1305:payments/kek:2
APP_PID=

# Stop the demo application if it is still running.
stop_app() {
    if [ -n "$APP_PID" ]; then
        kill -TERM "$APP_PID" 2>/dev/null || true
        wait "$APP_PID" 2>/dev/null || true
        APP_PID=
    fi
}
trap stop_app EXIT

# Print a command as the reader would type it (the demo directory and
# the binaries' paths left out).
echo_cmd() {
    printf '$ %s\n' "$*" | sed "s|$D/||g; s|$KS|keyshift|g; s|$APP|keyshift-demo-app|g"
}
# Run a command, showing it; stop the demo if it fails.
show() {
    echo_cmd "$@"
    "$@" || { echo "demo: step $step failed: $*" >&2; exit 1; }
}
# Run a transition, showing it; while a guard refuses (exit 75: the soak,
# the readers or the health window are not there yet) say why and retry,
# for up to 30 s.
advance() {
    local deadline=$((SECONDS + 30)) rc
    echo_cmd "$KS" rollout advance "${SCOPE[@]:0:2}" --rollout "$ID" "$@"
    while :; do
        rc=0
        "$KS" rollout advance "${SCOPE[@]:0:2}" --rollout "$ID" "$@" 2>"$D/advance.err" || rc=$?
        [ "$rc" = 0 ] && return 0
        if [ "$rc" != 75 ] || [ "$SECONDS" -ge "$deadline" ]; then
            cat "$D/advance.err" >&2
            echo "demo: step $step failed: rollout advance (exit $rc)" >&2
            exit 1
        fi
        printf '  (guard: %s; retrying)\n' "$(tr '\n' ' ' <"$D/advance.err" | head -c 200)"
        sleep 1
    done
}
# Start a rollout from $1 to $2; its id goes to ID.
start() {
    echo_cmd "$KS" rollout start "${SCOPE[@]}" --source "$1" --target "$2" --min-soak 2 \
        --reader-ttl 10 --min-samples 50 --window 60 --actor demo --reason "$3"
    ID=$("$KS" rollout start "${SCOPE[@]}" --source "$1" --target "$2" --min-soak 2 \
        --reader-ttl 10 --min-samples 50 --window 60 --actor demo --reason "$3" |
        grep -o '[0-9][0-9]*' | head -1)
    [ -n "$ID" ] || { echo "demo: rollout start printed no id" >&2; exit 1; }
    echo "rollout $ID"
}
status() { show "$KS" rollout status "${SCOPE[@]:0:2}" --rollout "$ID"; }

heading "Create $ROWS payment records and a keyring in ${D#"$PWD"/}; start an application"
sqlite3 "$DB" >/dev/null <<SQL
PRAGMA journal_mode = WAL;
BEGIN;
CREATE TABLE payments (id INTEGER PRIMARY KEY, tenant TEXT NOT NULL, card BLOB);
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < $ROWS)
INSERT INTO payments (id, tenant, card)
SELECT i, printf('tenant-%d', i % 20),
       printf('{"id":%d,"holder":"Customer %d","pan":"4111%012d","exp":"%02d/%02d"}',
              i, i, i, 1 + i % 12, 27 + i % 5)
FROM n;
COMMIT;
SQL
show "$KS" keys init
show "$KS" keys create payments/kek
echo_cmd "$APP" "${SCOPE[@]}" "${ROW[@]}" --purpose card --instance web-1 --rate 200 \
    --reload-ms 250 '&'
"$APP" "${SCOPE[@]}" "${ROW[@]}" --purpose card --instance web-1 --rate 200 --reload-ms 250 \
    >"$D/app.out" 2>"$D/app.err" &
APP_PID=$!
sleep 1
kill -0 "$APP_PID" 2>/dev/null || { cat "$D/app.err" >&2; echo "demo: the application did not start" >&2; exit 1; }

heading "Encrypt the column under payments/kek:1 through a first rollout"
start plaintext "$V1" "encrypt the card column"
advance
advance --all
sleep 2
advance
show "$KS" migrate run "${SCOPE[@]}" "${ROW[@]}" --mode encrypt --to-key payments/kek:1 --purpose card
show "$KS" migrate verify "${SCOPE[@]}" "${ROW[@]}" --purpose card
advance
status

heading "Rotate: add payments/kek version 2 (not primary yet) and plan the rollout"
show "$KS" keys add-version payments/kek
start "$V1" "$V2" "rotate payments/kek to version 2"
status

heading "read-compat: readers accept version 2, writers still use version 1"
advance
status

heading "write-upgrade: every live reader holds version 2; new writes use it"
advance --all
show "$KS" keys promote payments/kek 2
status

heading "backfill: the health window is clean; rewrap the old rows"
sleep 3
advance
show "$KS" migrate run "${SCOPE[@]}" "${ROW[@]}" --mode rewrap --to-key payments/kek:2
show "$KS" migrate verify "${SCOPE[@]}" "${ROW[@]}" --purpose card
status

heading "finalized: 0 rows at the source; readers accept version 2 only"
advance
status
show "$KS" census "${SCOPE[@]}"
show "$KS" keys list
show "$KS" rollout log "${SCOPE[@]:0:2}" --rollout "$ID"

heading "Stop the application: no read failed during the whole rotation"
kill -TERM "$APP_PID"
rc=0
wait "$APP_PID" || rc=$?
APP_PID=
cat "$D/app.out"
[ "$rc" = 0 ] || { echo "demo: the application saw failed reads (exit $rc)" >&2; exit 1; }
echo "everything is in ${D#"$PWD"/} (payments.db, keyring); remove it when done"
