#!/usr/bin/env bash
# tests/cli_every_service_test.sh -- every service in one rollout: three
# applications on three bindings of the application API read and write
# random rows of one column at once, throughout, while the column is taken
# through two whole rollouts, on a SQLite database and then on a
# PostgreSQL one (a throw-away cluster of tests/pg_cluster.sh, stopped
# and removed on any exit with every process the test started):
#
#   the applications: keyshift-demo-app (C), the Go example
#   (tools/go/example) and the Python example (tools/python/
#   example_service.py under Debian's python3, psycopg2 on PostgreSQL),
#   each with its own instance id, all registered as readers.
#
#   1. plaintext -> v1 pay/kek:1, then 3. pay/kek:1 -> pay/kek:2, each
#      through planned, read-compat, write-upgrade (tenant acme as the
#      canary), backfill (`migrate run`, with `--workers 2` on
#      PostgreSQL: SQLite has one writer, and migrate refuses workers
#      there; `migrate verify`) and finalized.  At each phase change every application prints its
#      summary (SIGUSR1); between the summary taken once the phase has
#      settled and the one taken before the next change, each application
#      wrote some rows, and only in the classes the phase names: the
#      source before write-upgrade, the source (globex) and the target
#      (acme) in write-upgrade, the target after; at the end of
#      write-upgrade from plaintext, acme's rows hold envelopes and
#      globex's none.  The census after each rollout: every row at the
#      target.
#   2. blocking: in read-compat of the rotation, a Go and a Python
#      application whose keyring lacks pay/kek:2 keep write-upgrade
#      refused (exit 75), the refusal naming both instances; with the Go
#      one stopped, the Python one alone still does, named alone;
#      stopped (SIGTERM: they deregister, exit 0), they no longer do.
#   At the end the three applications stop on SIGTERM and exit 0: not one
#   read failed, in any phase.
#   4. health: on a table of its own, a Python application that opens
#      with a wrong context (--read-context) reports auth failures in
#      write-upgrade, and `rollout check --auto-rollback` rolls the
#      rollout back to read-compat (exit 1, logged automatic).
#
# ENCODING is the column's encoding (EVERY_SERVICE_ENCODING, default
# binary: BLOB, bytea).  Every application, rollout, migrate and census
# command gets --encoding ENCODING when it is another (base64: TEXT,
# text).
#
# Usage: KEYSHIFT=path/to/keyshift DEMO_APP=path/to/keyshift-demo-app \
#        GO_EXAMPLE=path/to/keyshift-go-example PY_EXAMPLE=path/to/example_service.py \
#        PY_EXAMPLE_PYTHON=/usr/bin/python3 KEYSHIFT_LIBRARY=path/to/libkeyshift.so.0 \
#            tests/cli_every_service_test.sh
# The two databases run side by side: about 70 s under ASan+UBSan on 2
# cores busy with other work (load average 15), 25 s of CPU.
set -u

. "$(dirname "$0")/cli_lib.sh"
. "$(dirname "$0")/cli_pg_lib.sh"
. "$(dirname "$0")/cli_rollout_lib.sh"
ROOT=$(cd "$(dirname "$0")/.." && pwd)
C_APP=${DEMO_APP:-build/bin/keyshift-demo-app}
GO_APP=${GO_EXAMPLE:-build/bin/keyshift-go-example}
PY_APP=${PY_EXAMPLE:-$ROOT/tools/python/example_service.py}
PY=${PY_EXAMPLE_PYTHON:-/usr/bin/python3}
export KEYSHIFT_LIBRARY=${KEYSHIFT_LIBRARY:-$ROOT/build/lib/libkeyshift.so.0}
export PYTHONPATH=$ROOT/tools/python
START=$SECONDS

ENCODING=${EVERY_SERVICE_ENCODING:-binary}
case $ENCODING in
# the column's type, and SQL that is true of an envelope on each database
binary) SQLITE_TYPE=BLOB PG_TYPE=bytea SQLITE_ENV="substr(card, 1, 3) = X'4B5345'"
    PG_ENV="substring(card from 1 for 3) = '\x4b5345'::bytea" ;;
base64) SQLITE_TYPE=TEXT PG_TYPE=text SQLITE_ENV="substr(card, 1, 4) = 'S1NF'"
    PG_ENV="left(card, 4) = 'S1NF'" ;;
*) echo "cli_every_service_test: no encoding $ENCODING"; exit 1 ;;
esac
ENC=()
[ "$ENCODING" = binary ] || ENC=(--encoding "$ENCODING")

for p in "$C_APP" "$GO_APP"; do
    [ -x "$p" ] || { echo "cli_every_service_test: $p is not built"; exit 1; }
done
"$PY" -c 'import psycopg2' 2>/dev/null || { echo "cli_every_service_test: $PY has no psycopg2 (tools/deps.sh)"; exit 1; }
command -v sqlite3 >/dev/null || { echo "cli_every_service_test: sqlite3 is missing (tools/deps.sh)"; exit 1; }
# three applications and two old ones (two sessions each), migrate's
# workers and the test's own sessions
pg_lib_start cli_every_service_test 40

ROWS=1000
K1=v1:xchacha20-poly1305:pay/kek:1
K2=v1:xchacha20-poly1305:pay/kek:2
CTX=(--tenant-column tenant --context 'pay:{id}:card')

# dbq SQL: run SQL on the scenario's database, unaligned tuples only.
dbq() {
    if [ "$KIND" = pg ]; then q "$1"; else sqlite3 -cmd ".timeout 10000" "$DB" "$1"; fi
}
readers_count_is() { [ "$(dbq "SELECT count(*) FROM keyshift_readers" 2>/dev/null)" = "$1" ]; }
# make_table TABLE: TABLE(id, tenant, card) with ROWS JSON plaintexts,
# tenants acme (odd ids) and globex.
make_table() {
    if [ "$KIND" = pg ]; then
        # the JSON as text, or as its UTF-8 bytes in a bytea column
        local pt="format('{\"id\":%s,\"pan\":\"4111%s\"}', i, lpad(i::text, 12, '0'))"
        [ "$PG_TYPE" = bytea ] && pt="convert_to($pt, 'UTF8')"
        q "CREATE TABLE $1 (id bigint PRIMARY KEY, tenant text NOT NULL, card $PG_TYPE);
           INSERT INTO $1 SELECT i, CASE WHEN i % 2 = 1 THEN 'acme' ELSE 'globex' END,
               $pt
               FROM generate_series(1, $ROWS) i;"
    else
        sqlite3 "$DB" >/dev/null <<SQL
PRAGMA journal_mode = WAL;
CREATE TABLE $1 (id INTEGER PRIMARY KEY, tenant TEXT NOT NULL, card $SQLITE_TYPE);
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < $ROWS)
INSERT INTO $1 SELECT i, CASE WHEN i % 2 THEN 'acme' ELSE 'globex' END,
       printf('{"id":%d,"pan":"4111%012d"}', i, i) FROM n;
SQL
    fi
}

# start_app LANG NAME ARGS...: application LANG (c, go, py) as instance
# NAME on table pay in the background until signalled, its summaries (one
# JSON line each) in $T/NAME.json; its pid joins PIDS and is left in
# APP_PID.
start_app() {
    local lang=$1 name=$2 cmd
    shift 2
    case $lang in
    c) cmd=("$C_APP") ;;
    go) cmd=("$GO_APP") ;;
    py) cmd=("$PY" "$PY_APP") ;;
    esac
    "${cmd[@]}" --db "$DB" --table pay --column card "${CTX[@]}" --purpose card "${ENC[@]}" \
        --instance "$name" --rate 50 --write-percent 50 --reload-ms 200 --json "$@" \
        >"$T/$name.json" 2>"$T/$name.err" &
    APP_PID=$!
    PIDS+=("$APP_PID")
    echo "$APP_PID" >>"$TOP/pids"
}
# start_apps: the three applications, once the first rollout is started
# (the bindings read a plaintext only where a rollout's phase reads it);
# wait for them to register.
start_apps() {
    start_app c "$KIND-c" --seed 11
    start_app go "$KIND-go" --seed 12
    start_app py "$KIND-py" --seed 13
    APPS=("${PIDS[@]: -3}")
    NAMES=("$KIND-c" "$KIND-go" "$KIND-py")
    wait_for 20 readers_count_is 3 && ok "$KIND: the C, Go and Python applications registered" ||
        bad "$KIND: the applications registered" "$(head -c 600 "$T/$KIND"-*.err)"
}
# lines_of FILE: the lines of FILE into LINES (no process started: the
# machine this runs on is busy).
lines_of() { LINES=(); [ -f "$1" ] && mapfile -t LINES <"$1"; }
# snapshot: every application prints its summary (SIGUSR1); wait for the
# new lines and keep each application's last one in LAST.
snapshot() {
    local i n=() deadline=$((SECONDS + 10))
    for i in "${!APPS[@]}"; do lines_of "$T/${NAMES[$i]}.json"; n[$i]=${#LINES[@]}; done
    kill -USR1 "${APPS[@]}"
    for i in "${!APPS[@]}"; do
        while lines_of "$T/${NAMES[$i]}.json"; [ "${#LINES[@]}" -le "${n[$i]}" ]; do
            [ "$SECONDS" -ge "$deadline" ] && { bad "$KIND: ${NAMES[$i]} printed no summary" \
                "$(head -c 300 "$T/${NAMES[$i]}.err")"; break; }
            sleep 0.05
        done
        LAST[$i]=${LINES[${#LINES[@]} - 1]:-}
    done
}
# phase_open: the phase has settled (every application's policy has
# refreshed): take the summaries it is judged from.
phase_open() {
    sleep 0.6
    snapshot
    BEFORE=("${LAST[@]}")
}
# The classes written between two summaries (lines: NAME, the summary
# before, the one after; for each application), as "NAME|CLASSES|COUNTS",
# CLASSES sorted and space-separated, COUNTS "CLASS:N ...".
DELTA_AWK='
function writes(line, sign,    m, parts, n, i, kv) {
    if (!match(line, /"writes":\{[^}]*\}/)) return
    n = split(substr(line, RSTART + 10, RLENGTH - 11), parts, ",")
    for (i = 1; i <= n; i++)
        if (match(parts[i], /":[0-9]+$/)) d[substr(parts[i], 2, RSTART - 2)] += sign * substr(parts[i], RSTART + 2)
}
NR % 3 == 1 { name = $0; split("", d); next }
NR % 3 == 2 { writes($0, -1); next }
{
    writes($0, 1); n = 0
    for (c in d) if (d[c] > 0) { k[++n] = c; for (i = n; i > 1 && k[i - 1] > k[i]; i--) { t = k[i]; k[i] = k[i - 1]; k[i - 1] = t } }
    cl = ""; co = ""
    for (i = 1; i <= n; i++) { cl = cl (i > 1 ? " " : "") k[i]; co = co " " k[i] ":" d[k[i]] }
    print name "|" cl "|" co
}'
# phase_close NAME CLASSES: after at least DWELL seconds of the phase,
# every application wrote some rows since phase_open, and exactly in
# CLASSES (space-separated, sorted).
phase_close() {
    local name=$1 want=$2 i app cl co in=()
    sleep "${DWELL:-0.8}"
    snapshot
    for i in "${!APPS[@]}"; do in+=("${NAMES[$i]}" "${BEFORE[$i]}" "${LAST[$i]}"); done
    while IFS='|' read -r app cl co; do
        if [ "$cl" = "$want" ]; then
            ok "$KIND: $name: $app wrote$co"
        else
            bad "$KIND: $name: $app wrote [$co ], want $want"
        fi
    done < <(printf '%s\n' "${in[@]}" | awk "$DELTA_AWK")
}
# at_class FILE KEY_VERSION: rows at v1 pay/kek:KEY_VERSION in the census (JSON) in FILE.
at_class() {
    tr '{' '\n' <"$1" | sed -n "s/^\"version\":1,\"algorithm\":\"xchacha20-poly1305\",\"key_id\":\"pay\/kek\",\"key_version\":$2,\"rows\":\([0-9]*\).*/\1/p"
}

# canary_rows: in write-upgrade from plaintext with canary acme, acme's
# rows hold envelopes and globex's none (no migration runs yet).
canary_rows() {
    local env=$SQLITE_ENV acme globex
    [ "$KIND" = pg ] && env=$PG_ENV
    acme=$(dbq "SELECT count(*) FROM pay WHERE tenant = 'acme' AND $env")
    globex=$(dbq "SELECT count(*) FROM pay WHERE tenant = 'globex' AND $env")
    [ "$acme" -gt 0 ] && [ "$globex" = 0 ] &&
        ok "$KIND: canary: $acme of acme's rows are envelopes, none of globex's" ||
        bad "$KIND: canary rows" "acme envelopes $acme, globex envelopes $globex"
}
# lifecycle NAME SOURCE KV HOOK MIGRATE_ARGS...: one rollout of pay.card
# from SOURCE to pay/kek:KV through every phase while the applications
# run, each phase judged by phase_close; HOOK (a function name, or "")
# runs in read-compat.
lifecycle() {
    local name=$1 source=$2 kv=$3 hook=$4 id i t0=$SECONDS
    shift 4
    local target=v1:xchacha20-poly1305:pay/kek:$kv src=$source
    R=(--db "$DB")
    step "$KIND: $name: start" "$KS" rollout start "${R[@]}" --table pay --column card "${ENC[@]}" \
        --source "$source" --target "$target" --min-soak 0 --reader-ttl 5 --min-samples 20 \
        --window 60 --actor every-service-test --reason "$name" || return 1
    id=$(grep -o '[0-9][0-9]*' "$T/out" | head -1)
    R+=(--rollout "$id")
    [ "${#APPS[@]}" = 0 ] && start_apps
    phase_open
    phase_close "$name: planned" "$src"
    step "$KIND: $name: advance to read-compat" "$KS" rollout advance "${R[@]}" || return 1
    phase_open
    [ -n "$hook" ] && "$hook"
    phase_close "$name: read-compat" "$src"
    step "$KIND: $name: advance to write-upgrade, canary acme" \
        "$KS" rollout advance "${R[@]}" --tenants acme || return 1
    "$KS" keys promote pay/kek "$kv" >/dev/null 2>&1
    phase_open
    phase_close "$name: write-upgrade (acme)" "$src $target"
    [ "$source" = plaintext ] && canary_rows
    step "$KIND: $name: advance to backfill (health from the applications)" \
        "$KS" rollout advance "${R[@]}" || return 1
    phase_open
    for i in 1 2 3; do
        step "$KIND: $name: migrate run${WORKERS[*]:+ ${WORKERS[*]}} (pass $i)" "$KS" migrate run --db "$DB" \
            --table pay --column card "${CTX[@]}" "${ENC[@]}" "$@" --to-key "pay/kek:$kv" \
            "${WORKERS[@]}" --json || return 1
        step "$KIND: $name: migrate verify" "$KS" migrate verify --db "$DB" --table pay \
            --column card "${CTX[@]}" "${ENC[@]}" || return 1
        DWELL=0 phase_close "$name: backfill (pass $i)" "$target"
        "$KS" rollout advance "${R[@]}" >"$T/out" 2>"$T/err" && break
        [ "$i" = 3 ] && { bad "$KIND: $name: advance to finalized" "$(head -c 400 "$T/err")"; return 1; }
        phase_open
    done
    ok "$KIND: $name: finalized"
    phase_open
    phase_close "$name: finalized" "$target"
    "$KS" census --db "$DB" --table pay --column card "${ENC[@]}" --json >"$T/census.json"
    [ "$(at_class "$T/census.json" "$kv")" = "$ROWS" ] &&
        ok "$KIND: $name: census: all $ROWS rows at the target ($((SECONDS - t0)) s)" ||
        bad "$KIND: $name: census at the target" "$(cat "$T/census.json")"
}

# old_readers: in read-compat of the rotation, a Go and a Python
# application holding only pay/kek:1 block write-upgrade, named, each
# one on its own too; stopped, they exit 0 and deregister.
old_readers() {
    local go_old py_old rc1 rc2
    start_app go go-old --keyring "$T/$KIND/keyring-old" --seed 31
    go_old=$APP_PID
    start_app py py-old --keyring "$T/$KIND/keyring-old" --seed 32
    py_old=$APP_PID
    wait_for 20 readers_count_is 5 && ok "$KIND: old readers: go-old and py-old registered" ||
        bad "$KIND: old readers registered" "$(head -c 300 "$T/go-old.err" "$T/py-old.err")"
    run "$KIND: old readers: write-upgrade refused while they are live" 75 \
        "$KS" rollout advance "${R[@]}" --all
    expect_grep "$KIND: old readers: the refusal names go-old" "$T/err" "go-old"
    expect_grep "$KIND: old readers: the refusal names py-old" "$T/err" "py-old"
    kill -TERM "$go_old"
    wait "$go_old"; rc1=$?
    run "$KIND: old readers: with go-old stopped, py-old alone still blocks" 75 \
        "$KS" rollout advance "${R[@]}" --all
    if grep -q "py-old" "$T/err" && ! grep -q "go-old" "$T/err"; then
        ok "$KIND: old readers: the refusal names py-old only"
    else
        bad "$KIND: old readers: the refusal names py-old only" "$(head -c 300 "$T/err")"
    fi
    kill -TERM "$py_old"
    wait "$py_old"; rc2=$?
    [ "$rc1 $rc2" = "0 0" ] && ok "$KIND: old readers: both exit 0 on SIGTERM" ||
        bad "$KIND: old readers exit 0" "exits $rc1 $rc2: $(head -c 300 "$T/go-old.json" "$T/go-old.err" "$T/py-old.json" "$T/py-old.err")"
    readers_count_is 3 && ok "$KIND: old readers: deregistered" || bad "$KIND: old readers deregistered"
}

# health: on table audit, a Python application opening with a wrong
# context trips the auth-failure threshold in write-upgrade; check
# --auto-rollback rolls the rollout back.
health() {
    local bad_pid rc
    make_table audit
    R=(--db "$DB" --table audit --column card)
    run "$KIND: health: start on audit.card" 0 "$KS" rollout start "${R[@]}" "${ENC[@]}" \
        --source plaintext --target "$K2" --min-soak 0 --reader-ttl 5 --min-samples 20 \
        --max-auth-failure-rate 0.01 --window 60
    run "$KIND: health: advance to read-compat" 0 "$KS" rollout advance "${R[@]}"
    "$PY" "$PY_APP" --db "$DB" --table audit --column card "${CTX[@]}" --purpose card "${ENC[@]}" \
        --instance py-bad --read-context 'audit:{id}:wrong' --rate 200 --write-percent 50 \
        --reload-ms 200 --seed 41 --json >"$T/py-bad.json" 2>"$T/py-bad.err" &
    bad_pid=$!
    PIDS+=("$bad_pid")
    echo "$bad_pid" >>"$TOP/pids"
    wait_for 20 readers_count_is 1 || bad "$KIND: health: py-bad registered"
    run "$KIND: health: advance to write-upgrade" 0 "$KS" rollout advance "${R[@]}" --all
    check_trips "${R[@]}"
    rc=$?
    [ "$rc" = 1 ] && ok "$KIND: health: check --auto-rollback tripped (exit 1)" ||
        bad "$KIND: health: check exit" "exit $rc: $(head -c 300 "$T/check.json" "$T/check.err")"
    expect_grep "$KIND: health: the auth-failure rate tripped" "$T/check.json" "auth-failure-rate"
    "$KS" rollout status "${R[@]}" --json >"$T/st.json" 2>&1
    expect_grep "$KIND: health: back in read-compat" "$T/st.json" '"phase":"read-compat"'
    "$KS" rollout log "${R[@]}" --json >"$T/log.json" 2>&1
    expect_grep "$KIND: health: the rollback is logged as automatic" "$T/log.json" '"automatic":true'
    kill -TERM "$bad_pid"
    wait "$bad_pid"
    rc=$?
    [ "$rc" = 65 ] && grep -q '"auth-failed":[1-9]' "$T/py-bad.json" &&
        ok "$KIND: health: py-bad counted its auth failures (exit 65)" ||
        bad "$KIND: health: py-bad" "exit $rc: $(head -c 300 "$T/py-bad.json" "$T/py-bad.err")"
}

# scenario KIND DB: the whole test on one database.
scenario() {
    KIND=$1 DB=$2
    local t0=$SECONDS p i rcs=""
    mkdir -p "$T/$KIND"
    WORKERS=() # SQLite has one writer at a time: migrate refuses --workers there
    [ "$KIND" = pg ] && WORKERS=(--workers 2)
    export KEYSHIFT_KEYRING="$T/$KIND/keyring"
    "$KS" keys init 2>/dev/null && "$KS" keys create pay/kek 2>/dev/null ||
        { bad "$KIND: cannot create the keyring"; return 1; }
    make_table pay
    APPS=() NAMES=() BEFORE=() LAST=()
    lifecycle "plaintext -> key 1" plaintext 1 "" --mode encrypt --to-format 1
    cp "$KEYSHIFT_KEYRING" "$T/$KIND/keyring-old" # holds pay/kek:1 only
    chmod 600 "$T/$KIND/keyring-old"
    "$KS" keys add-version pay/kek >/dev/null 2>&1 # version 2: the applications reload it
    sleep 0.5
    lifecycle "key 1 -> key 2" "$K1" 2 old_readers --mode rewrap
    for p in "${APPS[@]}"; do kill -TERM "$p"; done
    for p in "${APPS[@]}"; do wait "$p"; rcs+="$? "; done
    PIDS=()
    [ "$rcs" = "0 0 0 " ] && ok "$KIND: all three applications exit 0 after SIGTERM: 0 failed reads" ||
        bad "$KIND: all three exit 0" "exits $rcs"
    for i in "${!NAMES[@]}"; do
        f=$T/${NAMES[$i]}.json
        [ "$(last_field "$f" failed_reads)" = 0 ] && [ "$(last_field "$f" db_errors)" = 0 ] &&
            tail -n 1 "$f" | grep -q '"write_failures":{}' &&
            ok "$KIND: ${NAMES[$i]} read $(last_field "$f" reads) values, none failed, no write failed" ||
            bad "$KIND: ${NAMES[$i]} summary" "$(tail -n 1 "$f" | head -c 600) $(head -c 300 "$T/${NAMES[$i]}.err")"
    done
    readers_count_is 0 && ok "$KIND: every application deregistered" || bad "$KIND: applications deregistered"
    health
    echo "cli_every_service_test: $KIND: $((SECONDS - t0)) s"
}

# run_scenario KIND DB: scenario KIND in a subshell with a directory of
# its own (T), its output and then its counts in $TOP/KIND.log.
run_scenario() {
    (
        T=$TOP/$1
        mkdir -p "$T"
        pass=0 fail=0
        scenario "$1" "$2"
        echo "counts $pass $fail"
    ) >"$TOP/$1.log" 2>&1
}
# The two databases side by side (each waits on its applications far
# more than it computes); on any exit every application either started
# is killed (pg_lib_hook, by the pids in $TOP/pids), then the cluster.
TOP=$T
pg_lib_hook() {
    local p
    [ -f "$TOP/pids" ] && while read -r p; do kill -9 "$p" 2>/dev/null; done <"$TOP/pids"
}
run_scenario sqlite "$TOP/sqlite/shop.db" &
S1=$!
run_scenario pg "$CI" &
S2=$!
PIDS+=("$S1" "$S2")
wait "$S1"
wait "$S2"
PIDS=()
rm -f "$TOP/pids" # every application has been waited for
for k in sqlite pg; do
    grep -v '^counts ' "$TOP/$k.log"
    set -- $(sed -n 's/^counts \([0-9]*\) \([0-9]*\)$/\1 \2/p' "$TOP/$k.log") 0 1
    pass=$((pass + $1)) fail=$((fail + $2))
done
if grep -rq "4111" --include='*.json' --include='*.err' "$TOP"; then
    bad "no summary or message carries a plaintext"
else
    ok "no summary or message carries a plaintext"
fi
echo "cli_every_service_test: $((SECONDS - START)) s"
cli_finish cli_every_service_test
