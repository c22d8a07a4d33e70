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
# EVERY_SERVICE_AGENT=1 runs the Python application through the agent
# instead of the library (tests/cli_every_service_agent_test.sh): a
# `keyshift serve` on a Unix socket in the test's directory (instance
# "agent", the keyring of the other applications, a policy that lets this
# uid seal and open pay.card and audit.card) holds the keys, and the Python
# example (--agent SOCKET) holds none.  The agent is then the registered
# reader, with its key versions (`keyshift rollout readers`), and the
# health reporter (rows of keyshift_metrics) for that application.  In
# step 2 the old Python application goes through an agent of its own,
# "agent-old", whose provider registry names the old keyring: it blocks
# write-upgrade and is named; after its registry names the keyring with
# pay/kek:2 and it is sent SIGHUP, it re-registers both versions and
# write-upgrade proceeds with it live (it and its application stop at the
# end, exit 0, no read failed).  In step 4 py-bad goes through an agent
# "agent-bad", whose health reports trip the rollback.  EVERY_SERVICE_KINDS
# names the databases (default "sqlite pg").
#
# Usage: KEYSHIFT=path/to/keyshift DEMO_APP=path/to/keyshift-demo-app \
#        GO_EXAMPLE=path/to/keyshift-go-example PY_EXAMPLE=path/to/example_service.py \
#        PY_EXAMPLE_PYTHON=/usr/bin/python3 KEYSHIFT_LIBRARY=path/to/libkeyshift.so.0 \
#            tests/cli_every_service_test.sh
# The two databases run side by side: about 70 s under ASan+UBSan on 2
# cores busy with other work (load average 15), 25 s of CPU.  Needs curl
# in agent mode.
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
AGENT=${EVERY_SERVICE_AGENT:-}
KINDS=${EVERY_SERVICE_KINDS:-sqlite pg}
# How long a phase change takes to reach every application: the library's
# applications refresh every 200 ms (--reload-ms), the agents too
# (--interval 200ms, which also keeps their heartbeats well inside the
# tests' 5 s reader TTL), then a round trip through the agent.
SETTLE=0.6
[ -n "$AGENT" ] && SETTLE=0.9

for p in "$C_APP" "$GO_APP"; do
    [ -x "$p" ] || { echo "cli_every_service_test: $p is not built"; exit 1; }
done
"$PY" -c 'import psycopg2' 2>/dev/null || { echo "cli_every_service_test: $PY has no psycopg2 (tools/deps.sh)"; exit 1; }
command -v sqlite3 >/dev/null || { echo "cli_every_service_test: sqlite3 is missing (tools/deps.sh)"; exit 1; }
[ -z "$AGENT" ] || command -v curl >/dev/null || { echo "cli_every_service_test: curl is missing (tools/deps.sh)"; exit 1; }
# three applications and two old ones (two sessions each), migrate's
# workers and the test's own sessions
case " $KINDS " in
*" pg "*) pg_lib_start cli_every_service_test 40 ;;
*) trap 'for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done; pg_lib_hook; rm -rf "$T"' EXIT ;;
esac

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

# bg NAME CMD...: CMD in the background, its output in $T/NAME.json and
# its messages in $T/NAME.err; its pid joins PIDS (and $TOP/pids, for
# the exit hook) and is left in BG_PID.
bg() {
    local name=$1
    shift
    "$@" >"$T/$name.json" 2>"$T/$name.err" &
    BG_PID=$!
    PIDS+=("$BG_PID")
    echo "$BG_PID" >>"$TOP/pids"
}
# app_cmd LANG [SOCKET]: the command of application LANG (c, go, py) in
# APP_CMD, the library's with its period; the Python one through the
# agent on SOCKET when one is given, without the keyring in its
# environment.
app_cmd() {
    case $1 in
    c) APP_CMD=("$C_APP" --reload-ms 200) ;;
    go) APP_CMD=("$GO_APP" --reload-ms 200) ;;
    py) APP_CMD=("$PY" "$PY_APP" --reload-ms 200)
        [ -n "${2:-}" ] && APP_CMD=(env -u KEYSHIFT_KEYRING "$PY" "$PY_APP" --agent "$2") ;;
    esac
}
# start_app LANG NAME [--agent SOCKET] ARGS...: application LANG (c, go,
# py) as instance NAME on table pay in the background until signalled
# (the Python one through the agent on SOCKET), its summaries (one JSON
# line each) in $T/NAME.json; its pid is left in APP_PID.
start_app() {
    local lang=$1 name=$2 sock=
    shift 2
    [ "${1:-}" = --agent ] && { sock=$2; shift 2; }
    app_cmd "$lang" "$sock"
    bg "$name" "${APP_CMD[@]}" --db "$DB" --table pay --column card "${CTX[@]}" --purpose card \
        "${ENC[@]}" --instance "$name" --rate 50 --write-percent 50 --json "$@"
    APP_PID=$BG_PID
}
# usr1_caught PID: process PID has installed its SIGUSR1 handler (bit 10
# of SigCgt in /proc/PID/status; no process started).
usr1_caught() {
    local k v
    while read -r k v; do
        [ "$k" = SigCgt: ] && return $(((16#$v >> 9 & 1) == 0))
    done <"/proc/$1/status"
    return 1
}
# agent_up SOCKET: the agent on SOCKET answers /healthz.
agent_up() { curl -s --unix-socket "$1" http://agent/healthz 2>/dev/null | grep -q '^ok$'; }
# start_agent NAME SERVE_OPTIONS...: `keyshift serve` as reader instance
# NAME on $T/KIND/NAME.sock (left in AGENT_SOCK) for pay.card and
# audit.card, under the scenario's policy, until signalled; its log in
# $T/NAME.err, its pid in AGENT_PID.  Waits until it answers.
start_agent() {
    local name=$1
    shift
    AGENT_SOCK=$T/$KIND/$name.sock
    bg "$name" "$KS" serve --listen "unix:$AGENT_SOCK" --policy "$T/$KIND/policy" --scope pay.card \
        --scope audit.card --db "$DB" --instance-id "$name" --interval 200ms "$@"
    AGENT_PID=$BG_PID
    wait_for 20 agent_up "$AGENT_SOCK" && ok "$KIND: agent $name serves on its socket" ||
        bad "$KIND: agent $name serves" "$(head -c 400 "$T/$name.err")"
}
# stop_agent PID NAME: SIGTERM; the agent drains, deregisters and exits 0.
stop_agent() {
    local rc
    kill -TERM "$1"
    wait "$1"
    rc=$?
    [ "$rc" = 0 ] && ok "$KIND: agent $2 exits 0 on SIGTERM" ||
        bad "$KIND: agent $2 exit" "exit $rc: $(tail -c 400 "$T/$2.err")"
}
# reader_keys NAME: the key versions reader NAME registered, as `keyshift
# rollout readers` lists them (its last column).
reader_keys() { "$KS" rollout readers --db "$DB" 2>/dev/null | awk -v n="$1" '$1 == n { print $NF }'; }
reader_keys_are() { [ "$(reader_keys "$1")" = "$2" ]; }
# start_apps: the three applications, once the first rollout is started
# (the bindings read a plaintext only where a rollout's phase reads it);
# wait for them to register: the Python one is the agent in agent mode.
start_apps() {
    local py_via=()
    if [ -n "$AGENT" ]; then
        start_agent agent
        MAIN_AGENT=$AGENT_PID
        py_via=(--agent "$AGENT_SOCK")
    fi
    start_app c "$KIND-c" --seed 11
    APPS=("$APP_PID")
    start_app go "$KIND-go" --seed 12
    APPS+=("$APP_PID")
    start_app py "$KIND-py" "${py_via[@]}" --seed 13
    APPS+=("$APP_PID")
    NAMES=("$KIND-c" "$KIND-go" "$KIND-py")
    wait_for 20 readers_count_is 3 && ok "$KIND: the C, Go and Python applications registered" ||
        bad "$KIND: the applications registered" "$(head -c 600 "$T/$KIND"-*.err)"
    if [ -n "$AGENT" ]; then
        # registered, the others are ready for SIGUSR1; this one registers nothing
        wait_for 20 usr1_caught "$APP_PID" || bad "$KIND: $KIND-py started" "$(head -c 600 "$T/$KIND-py.err")"
        reader_keys_are agent pay/kek:1 && reader_keys_are "$KIND-py" "" &&
            ok "$KIND: the agent is the Python application's reader: keyshift rollout readers lists agent with pay/kek:1, not $KIND-py" ||
            bad "$KIND: the agent listed as a reader with pay/kek:1" "$("$KS" rollout readers --db "$DB" 2>&1 | head -c 600)"
    fi
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
    sleep "$SETTLE"
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
# app_state NAME: application NAME's summaries around the phase and the
# end of its log, for a failure's report.
app_state() {
    local i
    for i in "${!APPS[@]}"; do
        [ "${NAMES[$i]}" = "$1" ] || continue
        printf 'before: %s\n       after:  %s\n       log: %s' "${BEFORE[$i]:0:600}" \
            "${LAST[$i]:0:600}" "$(tail -c 400 "$T/$1.err" | tr '\n' ' ')"
    done
}
# phase_close NAME CLASSES: after at least DWELL seconds of the phase,
# every application wrote some rows since phase_open, and exactly in
# CLASSES (space-separated, sorted).  One that wrote nothing yet gets up
# to 3 s more: on a busy machine its own UPDATEs can wait that long for
# SQLite's write lock.
phase_close() {
    local name=$1 want=$2 i app cl co in rows tries=0
    sleep "${DWELL:-0.8}"
    while :; do
        snapshot
        in=()
        for i in "${!APPS[@]}"; do in+=("${NAMES[$i]}" "${BEFORE[$i]}" "${LAST[$i]}"); done
        rows=$(printf '%s\n' "${in[@]}" | awk "$DELTA_AWK")
        grep -q '^[^|]*||' <<<"$rows" && [ "$tries" -lt 6 ] || break
        tries=$((tries + 1))
        sleep 0.5
    done
    while IFS='|' read -r app cl co; do
        if [ "$cl" = "$want" ]; then
            ok "$KIND: $name: $app wrote$co"
        else
            bad "$KIND: $name: $app wrote [$co ], want $want" "$(app_state "$app")"
        fi
    done <<<"$rows"
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
        "${NO_LATENCY[@]}" \
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
# one on its own too; stopped, they exit 0 and deregister.  In agent
# mode the Python one goes through agent-old, the reader named: its
# registry then names the keyring with pay/kek:2 and SIGHUP makes it
# register both versions; it stays live (OLD_AGENT, OLD_PY), and
# write-upgrade must proceed with it.
old_readers() {
    local go_old py_old rc1 rc2 py_via=() old=py-old
    if [ -n "$AGENT" ]; then
        printf 'keyshift-providers 1\n\nprovider local\n  type local\n  keyring %s\n  serve-prefix pay/\n' \
            "$T/$KIND/keyring-old" >"$T/$KIND/providers-old"
        chmod 600 "$T/$KIND/providers-old"
        start_agent agent-old --providers "$T/$KIND/providers-old"
        OLD_AGENT=$AGENT_PID
        py_via=(--agent "$AGENT_SOCK")
        old=agent-old
    fi
    start_app go go-old --keyring "$T/$KIND/keyring-old" --seed 31
    go_old=$APP_PID
    if [ -n "$AGENT" ]; then
        start_app py py-old "${py_via[@]}" --seed 32
    else
        start_app py py-old --keyring "$T/$KIND/keyring-old" --seed 32
    fi
    py_old=$APP_PID
    wait_for 20 readers_count_is 5 && ok "$KIND: old readers: go-old and $old registered" ||
        bad "$KIND: old readers registered" "$(head -c 300 "$T/go-old.err" "$T/$old.err")"
    run "$KIND: old readers: write-upgrade refused while they are live" 75 \
        "$KS" rollout advance "${R[@]}" --all
    expect_grep "$KIND: old readers: the refusal names go-old" "$T/err" "go-old"
    expect_grep "$KIND: old readers: the refusal names $old" "$T/err" "$old"
    kill -TERM "$go_old"
    wait "$go_old"; rc1=$?
    run "$KIND: old readers: with go-old stopped, $old alone still blocks" 75 \
        "$KS" rollout advance "${R[@]}" --all
    if grep -q "$old" "$T/err" && ! grep -q "go-old" "$T/err"; then
        ok "$KIND: old readers: the refusal names $old only"
    else
        bad "$KIND: old readers: the refusal names $old only" "$(head -c 300 "$T/err")"
    fi
    if [ -n "$AGENT" ]; then
        OLD_PY=$py_old
        [ "$rc1" = 0 ] && ok "$KIND: old readers: go-old exits 0 on SIGTERM" ||
            bad "$KIND: old readers: go-old exit 0" "exit $rc1: $(head -c 300 "$T/go-old.json" "$T/go-old.err")"
        sed -i "s|keyring-old\$|keyring|" "$T/$KIND/providers-old"
        kill -HUP "$OLD_AGENT"
        # the reload never takes the agent off the readers (docs/agent.md
        # [AG-RUN-2]): it is listed at every look for 1.5 s
        local gone=0
        for _ in $(seq 30); do
            [ "$(dbq "SELECT count(*) FROM keyshift_readers WHERE instance_id = 'agent-old'" 2>/dev/null)" = 1 ] || gone=1
            sleep 0.05
        done
        [ "$gone" = 0 ] && ok "$KIND: old readers: agent-old stays listed through its SIGHUP" ||
            bad "$KIND: old readers: agent-old stays listed through its SIGHUP" "it was missing at one look"
        wait_for 10 reader_keys_are agent-old pay/kek:1,pay/kek:2 &&
            ok "$KIND: old readers: after SIGHUP agent-old registered pay/kek:1,pay/kek:2" ||
            bad "$KIND: old readers: SIGHUP re-registered agent-old" "$("$KS" rollout readers --db "$DB" 2>&1 | head -c 600) $(tail -c 300 "$T/agent-old.err")"
        wait_for 5 readers_count_is 4 && ok "$KIND: old readers: go-old deregistered" ||
            bad "$KIND: old readers: go-old deregistered" "$("$KS" rollout readers --db "$DB" 2>&1 | head -c 600)"
        return
    fi
    kill -TERM "$py_old"
    wait "$py_old"; rc2=$?
    [ "$rc1 $rc2" = "0 0" ] && ok "$KIND: old readers: both exit 0 on SIGTERM" ||
        bad "$KIND: old readers exit 0" "exits $rc1 $rc2: $(head -c 300 "$T/go-old.json" "$T/go-old.err" "$T/py-old.json" "$T/py-old.err")"
    readers_count_is 3 && ok "$KIND: old readers: deregistered" || bad "$KIND: old readers deregistered"
}

# health: on table audit, a Python application opening with a wrong
# context trips the auth-failure threshold in write-upgrade; check
# --auto-rollback rolls the rollout back.  In agent mode it goes through
# agent-bad, whose health reports trip it.  The latency checks are off: a
# loaded host's p99 must not trip the rollout before the auth failures do.
health() {
    local bad_pid rc agent_pid sock=
    make_table audit
    R=(--db "$DB" --table audit --column card)
    run "$KIND: health: start on audit.card" 0 "$KS" rollout start "${R[@]}" "${ENC[@]}" \
        --source plaintext --target "$K2" --min-soak 0 --reader-ttl 5 --min-samples 20 \
        --max-auth-failure-rate 0.01 "${NO_LATENCY[@]}" --window 60
    run "$KIND: health: advance to read-compat" 0 "$KS" rollout advance "${R[@]}"
    if [ -n "$AGENT" ]; then
        start_agent agent-bad
        agent_pid=$AGENT_PID
        sock=$AGENT_SOCK
    fi
    app_cmd py "$sock"
    bg py-bad "${APP_CMD[@]}" --db "$DB" --table audit --column card "${CTX[@]}" \
        --purpose card "${ENC[@]}" --instance py-bad --read-context 'audit:{id}:wrong' --rate 200 \
        --write-percent 50 --seed 41 --json
    bad_pid=$BG_PID
    wait_for 20 readers_count_is 1 || bad "$KIND: health: py-bad registered"
    run "$KIND: health: advance to write-upgrade" 0 "$KS" rollout advance "${R[@]}" --all
    check_trips "${R[@]}"
    rc=$?
    [ "$rc" = 1 ] && ok "$KIND: health: check --auto-rollback tripped (exit 1)" ||
        bad "$KIND: health: check exit" "exit $rc: $(head -c 300 "$T/check.json" "$T/check.err")"
    expect_tripped "$KIND: health: the auth-failure rate tripped" auth-failure-rate "$T/check.json"
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
    if [ -n "$AGENT" ]; then
        [ "$(dbq "SELECT count(*) FROM keyshift_metrics WHERE instance_id = 'agent-bad' AND auth_failures > 0")" -gt 0 ] &&
            ok "$KIND: health: the auth failures were reported by agent-bad" ||
            bad "$KIND: health: agent-bad reported the auth failures"
        stop_agent "$agent_pid" agent-bad
    fi
}

# scenario KIND DB: the whole test on one database.
scenario() {
    KIND=$1 DB=$2
    local t0=$SECONDS p i rcs=""
    mkdir -p "$T/$KIND"
    WORKERS=() # SQLite has one writer at a time: migrate refuses --workers there
    [ "$KIND" = pg ] && WORKERS=(--workers 2)
    export KEYSHIFT_KEYRING="$T/$KIND/keyring"
    # the agents serve this uid (docs/agent-policy.md)
    printf 'keyshift-agent-policy 1\nallow uid %s scope pay.card tenant * ops seal,open\nallow uid %s scope audit.card tenant * ops seal,open\n' \
        "$(id -u)" "$(id -u)" >"$T/$KIND/policy"
    chmod 600 "$T/$KIND/policy"
    "$KS" keys init 2>/dev/null && "$KS" keys create pay/kek 2>/dev/null ||
        { bad "$KIND: cannot create the keyring"; return 1; }
    make_table pay
    APPS=() NAMES=() BEFORE=() LAST=()
    lifecycle "plaintext -> key 1" plaintext 1 "" --mode encrypt --to-format 1
    cp "$KEYSHIFT_KEYRING" "$T/$KIND/keyring-old" # holds pay/kek:1 only
    chmod 600 "$T/$KIND/keyring-old"
    "$KS" keys add-version pay/kek >/dev/null 2>&1 # version 2: the applications reload it
    sleep 0.5
    if [ -n "$AGENT" ]; then
        wait_for 10 reader_keys_are agent pay/kek:1,pay/kek:2 &&
            ok "$KIND: the agent reopened the changed keyring and registered pay/kek:1,pay/kek:2" ||
            bad "$KIND: the agent registered pay/kek:2" "$("$KS" rollout readers --db "$DB" 2>&1 | head -c 600)"
    fi
    lifecycle "key 1 -> key 2" "$K1" 2 old_readers --mode rewrap
    if [ -n "$AGENT" ]; then # py-old, through agent-old, ran to the end
        APPS+=("$OLD_PY")
        NAMES+=(py-old)
    fi
    for p in "${APPS[@]}"; do kill -TERM "$p"; done
    for p in "${APPS[@]}"; do wait "$p"; rcs+="$? "; done
    [ "$rcs" = "${APPS[*]/*/0} " ] && ok "$KIND: all ${#APPS[@]} applications exit 0 after SIGTERM: 0 failed reads" ||
        bad "$KIND: all applications exit 0" "exits $rcs"
    if [ -n "$AGENT" ]; then
        [ "$(dbq "SELECT count(*) FROM keyshift_metrics WHERE instance_id = 'agent' AND source = 'app' AND opens > 0 AND seals > 0")" -gt 0 ] &&
            ok "$KIND: the agent reported the health of the Python application's seals and opens" ||
            bad "$KIND: the agent reported health"
        stop_agent "$MAIN_AGENT" agent
        stop_agent "$OLD_AGENT" agent-old
    fi
    PIDS=()
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
RUNS=()
for k in $KINDS; do
    case $k in
    sqlite) run_scenario sqlite "$TOP/sqlite/shop.db" & ;;
    pg) run_scenario pg "$CI" & ;;
    *) echo "cli_every_service_test: no database kind $k"; exit 1 ;;
    esac
    RUNS+=($!)
    PIDS+=($!)
done
for p in "${RUNS[@]}"; do wait "$p"; done
PIDS=()
rm -f "$TOP/pids" # every application has been waited for
for k in $KINDS; do
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
