#!/usr/bin/env bash
# tests/cli_rollout_test.sh -- end-to-end tests of `keyshift rollout` and
# of the rollout rules of `keyshift migrate` and `keyshift keys set-state
# ... destroyed`, on real SQLite files with a real keyring: two rollouts
# of one column (plaintext -> payments/kek:2, then a rotation to
# payments/kek:3), a key-scoped rotation of orders/kek over two tables
# (overlaps, per-column census and verify), every guard refusal and its exit 75, canaries, check's
# exit codes 0-3 with --auto-rollback, Prometheus output, migrate refused
# outside backfill, verify recording, key destruction refused while
# referenced.  No test waits on the clock: soak and heartbeats are moved
# into the past with SQL, and metrics are inserted with SQL.
#
# Usage: KEYSHIFT=path/to/keyshift tests/cli_rollout_test.sh
set -u

. "$(dirname "$0")/cli_lib.sh"
unset KEYSHIFT_PASSPHRASE
export KEYSHIFT_KEYRING="$T/keyring"
IN=/dev/null

command -v sqlite3 >/dev/null || { echo "cli_rollout_test: sqlite3 is missing (tools/deps.sh)"; exit 1; }
PY=python3
command -v "$PY" >/dev/null || PY=/usr/bin/python3

D="$T/shop.db"
TGT2=v2:xchacha20-poly1305:payments/kek:2
TGT3=v2:xchacha20-poly1305:payments/kek:3

# sql STATEMENTS: run SQL on the shop database.
sql() { sqlite3 "$D" "$1"; }

# json_ok NAME: $T/out parses as JSON.
json_ok() {
    if "$PY" -c 'import json,sys; json.load(sys.stdin)' <"$T/out" 2>/dev/null; then ok "$1 parses"
    else bad "$1 parses" "$(head -c 300 "$T/out")"; fi
}

# phase_is NAME PHASE: rollout ID's phase in the database.
phase_is() {
    local got
    got=$(sql "SELECT phase FROM keyshift_rollout WHERE id = $1")
    if [ "$got" = "$2" ]; then ok "rollout $1 is in $2"; else bad "rollout $1 is in $2" "got $got"; fi
}

# hist N: a latency histogram BLOB literal with N latencies in its first
# (fastest) bucket: 24 little-endian uint64.
hist() {
    local be le="" i
    be=$(printf '%016x' "$1")
    for i in 14 12 10 8 6 4 2 0; do le="$le${be:$i:2}"; done
    printf "X'%s%0368d'" "$le" 0
}

# metrics ROLLOUT OPENS AUTH_FAILURES [SOURCE [TIMED]]: insert one sample at
# the current time from SOURCE (default app), its seals and opens timed
# unless TIMED is 0 (each seal 200 ns, each open 250 ns: the first bucket).
metrics() {
    local timed=${5:-1}
    sql "INSERT INTO keyshift_metrics(rollout_id, instance_id, source, time, seals, opens,
         auth_failures, parse_errors, provider_calls, provider_errors, seal_ns, open_ns,
         seal_ns_sum, open_ns_sum)
         VALUES($1, 'web-1', '${4:-app}', strftime('%s','now'), $2, $2, $3, 0, 10, 0,
         $(hist $(($2 * timed))), $(hist $(($2 * timed))), $(($2 * timed * 200)),
         $(($2 * timed * 250)))"
}


# reader ID KEYS AGE: register a reader (format 2, both algorithms) whose
# heartbeat is AGE seconds old.
reader() {
    sql "INSERT OR REPLACE INTO keyshift_readers VALUES('$1', '0.1.0', 2, 6, '$2',
         strftime('%s','now') - $3, strftime('%s','now') - $3)"
}

# seal KEY_VERSION: an envelope of "secret" as hex, under payments/kek.
seal() {
    printf 'secret' | "$KS" encrypt --tenant acme --key-id payments/kek --key-version "$1" |
        od -An -tx1 | tr -d ' \n'
}

run "keys init" 0 "$KS" keys init
run "keys create" 0 "$KS" keys create payments/kek
cp "$KEYSHIFT_KEYRING" "$T/keyring-v1" # holds payments/kek:1 only
run "keys add-version 2" 0 "$KS" keys add-version payments/kek
sql "CREATE TABLE pay (id INTEGER PRIMARY KEY, card BLOB, tenant TEXT);
     INSERT INTO pay (card, tenant) VALUES ('4111', 'acme'), ('5500', 'acme'), (NULL, 'acme');"

# ---- help and usage -------------------------------------------------------------------
run "rollout --help" 0 "$KS" rollout --help
expect_grep "rollout manual has EXIT STATUS" "$T/out" "^EXIT STATUS"
expect_grep "rollout manual documents check's exit 3" "$T/out" "3   check: too few samples"
expect_grep "rollout manual documents 75" "$T/out" "75  not safe yet"
run "rollout start --help" 0 "$KS" rollout start --help
expect_grep "start's manual: checks the target" "$T/out" "It first asks the key provider"
run "rollout abort --help" 0 "$KS" rollout abort --help
expect_grep "abort's manual" "$T/out" "abort     ends a rollout that has written its target nowhere"
run "rollout set --help" 0 "$KS" rollout set --help
expect_grep "set's manual" "$T/out" "set       changes the thresholds"
expect_grep "manual: no data is not healthy" "$T/out" "has no data, and the health is then insufficient"
run "keyshift --help lists rollout" 0 "$KS" --help
expect_grep "top-level help lists rollout" "$T/out" "rollout  *move a column"
run "rollout: no subcommand" 64 "$KS" rollout
run "rollout: unknown subcommand" 64 "$KS" rollout frobnicate --db "$D"
run "start: --db missing" 64 "$KS" rollout start --table pay --column card --source plaintext --target "$TGT2"
expect_grep "start: names --db" "$T/err" "\-\-db FILE is required"
run "start: --target missing" 64 "$KS" rollout start --db "$D" --table pay --column card --source plaintext
expect_grep "start: names what is missing" "$T/err" "\-\-target are required"
run "start: plaintext target" 64 "$KS" rollout start --db "$D" --table pay --column card --source "$TGT2" --target plaintext
run "start: bad class" 64 "$KS" rollout start --db "$D" --table pay --column card --source plaintext --target v3:xchacha20-poly1305:k:1
run "start: bad algorithm" 64 "$KS" rollout start --db "$D" --table pay --column card --source plaintext --target v2:rot13:k:1
run "start: bad duration" 64 "$KS" rollout start --db "$D" --table pay --column card --source plaintext --target "$TGT2" --min-soak 5x
run "start: unknown table" 66 "$KS" rollout start --db "$D" --table nosuch --column card --source plaintext --target "$TGT2"
run "start: no such database" 66 "$KS" rollout start --db "$T/nosuch.db" --table pay --column card --source plaintext --target "$TGT2"
run "status: no rollout yet" 66 "$KS" rollout status --db "$D"
run "advance: option of another subcommand" 64 "$KS" rollout advance --db "$D" --source plaintext

# ---- start, status, log ------------------------------------------------------------------
run "start rollout 1" 0 "$KS" rollout start --db "$D" --table pay --column card --source plaintext \
    --target "$TGT2" --min-soak 1h --reader-ttl 60 --min-samples 100 --actor alice --reason "OPS-1 encrypt cards"
expect_eq "start prints the id" "$T/out" "1"
phase_is 1 planned
run "start: a second open rollout of the scope" 65 "$KS" rollout start --db "$D" --table pay --column card --source plaintext --target "$TGT2"
expect_grep "start: says finalize first" "$T/err" "finalize it first"
run "status" 0 "$KS" rollout status --db "$D"
expect_grep "status: phase" "$T/out" "^phase *planned since"
expect_grep "status: target" "$T/out" "^target *$TGT2"
expect_grep "status: census" "$T/out" "^census *3 rows: 2 at the source, 0 at the target"
expect_grep "status: health" "$T/out" "^health *insufficient"
expect_grep "status: log" "$T/out" "alice .*OPS-1 encrypt cards"
run "status --json" 0 "$KS" rollout status --db "$D" --json
json_ok "status --json"
expect_grep "status --json: census" "$T/out" '"census":{"rows":3,"null":1,"at_source":2,"at_target":0,"other":0}'
run "log --json" 0 "$KS" rollout log --db "$D" --json
json_ok "log --json"
expect_grep "log --json: creation row" "$T/out" '"actor":"alice","from":null,"to":"planned"'
run "log --limit 1" 0 "$KS" rollout log --db "$D" --rollout 1 --limit 1
if [ "$(grep -c ' -> ' "$T/out")" = 1 ]; then ok "log --limit 1 shows one entry"; else bad "log --limit 1 shows one entry" "$(cat "$T/out")"; fi
run "log: no such rollout" 66 "$KS" rollout log --db "$D" --rollout 9

# ---- planned -> read-compat: the target key version -----------------------------------------
run "advance without a keyring" 64 env -u KEYSHIFT_KEYRING "$KS" rollout advance --db "$D"
expect_grep "advance: names the keyring" "$T/err" "checks target key payments/kek:2 with the keyring"
run "advance: target key version missing" 75 "$KS" rollout advance --db "$D" --keyring "$T/keyring-v1"
expect_grep "refusal: missing target" "$T/err" "target key payments/kek:2 does not exist in the key provider"
run "keys disable 2" 0 "$KS" keys set-state payments/kek 2 disabled
run "advance: target key disabled" 75 "$KS" rollout advance --db "$D"
expect_grep "refusal: disabled target" "$T/err" "target key payments/kek:2 is disabled"
run "keys enable 2" 0 "$KS" keys set-state payments/kek 2 active
run "advance -> read-compat" 0 "$KS" rollout advance --db "$D" --reason "key 2 everywhere"
phase_is 1 read-compat

# ---- rollback read-compat -> planned -------------------------------------------------------------
sql "INSERT INTO pay (card, tenant) VALUES (X'$(seal 2)', 'acme')"
run "rollback without --reason" 64 "$KS" rollout rollback --db "$D"
run "rollback read-compat -> planned with target rows" 75 "$KS" rollout rollback --db "$D" --reason test
expect_grep "refusal: rows would be unreadable" "$T/err" "rolling back to planned would make 1 row unreadable"
sql "DELETE FROM pay WHERE id = 4"
run "rollback read-compat -> planned, no target rows" 0 "$KS" rollout rollback --db "$D" --reason "drill"
phase_is 1 planned
run "rollback from planned" 65 "$KS" rollout rollback --db "$D" --reason again
run "advance -> read-compat again" 0 "$KS" rollout advance --db "$D"

# ---- read-compat -> write-upgrade: readers and soak ------------------------------------------------
reader web-1 "payments/kek:1,payments/kek:2" 0
reader old-7 "payments/kek:1" 0
run "advance: a live reader lacks the target" 75 "$KS" rollout advance --db "$D" --tenants acme
expect_grep "refusal: names the reader" "$T/err" "1 live reader cannot read payments/kek:2 (v2, xchacha20-poly1305): old-7"
run "readers --json" 0 "$KS" rollout readers --db "$D" --json
json_ok "readers --json"
run "status shows the reader cannot read the target" 0 "$KS" rollout status --db "$D"
expect_grep "status: old-7 lacks the target" "$T/out" "old-7 *yes .* NO "
reader old-7 "payments/kek:1" 3600
run "advance: soak not elapsed" 75 "$KS" rollout advance --db "$D" --tenants acme
expect_grep "refusal: soak" "$T/err" "read-compat has lasted [0-9]* s of the 3600 s minimum soak"
sql "UPDATE keyshift_rollout SET phase_since = phase_since - 7200 WHERE id = 1"
run "advance: --percent with --tenants" 64 "$KS" rollout advance --db "$D" --tenants acme --percent 5
run "advance -> write-upgrade, canary acme,globex" 0 "$KS" rollout advance --db "$D" --tenants acme,globex
phase_is 1 write-upgrade
run "status: canary" 0 "$KS" rollout status --db "$D" --json
expect_grep "status: canary tenants" "$T/out" '"canary":"tenants acme,globex"'

# ---- canary ---------------------------------------------------------------------------------------------
run "canary --percent 25" 0 "$KS" rollout canary --db "$D" --percent 25 --reason "widen"
expect_grep "canary: printed" "$T/out" "canary 25%"
run "canary --percent 101" 64 "$KS" rollout canary --db "$D" --percent 101
run "canary without a choice" 64 "$KS" rollout canary --db "$D"
run "canary --all --json" 0 "$KS" rollout canary --db "$D" --all --json
json_ok "canary --json"
run "log: canary changes" 0 "$KS" rollout log --db "$D"
expect_grep "log: canary 25%" "$T/out" "canary: 25%"
expect_grep "log: canary reason" "$T/out" "widen"
expect_grep "log: canary all" "$T/out" "canary: all"

# ---- write-upgrade -> backfill: health; check --------------------------------------------------------
run "migrate refused in write-upgrade" 78 "$KS" migrate run --db "$D" --table pay --column card \
    --mode encrypt --to-key payments/kek:2 --tenant acme
expect_grep "migrate: names the phase" "$T/err" "rollout 1 is in phase write-upgrade; migrate runs only in backfill"
run "advance: health insufficient" 75 "$KS" rollout advance --db "$D"
expect_grep "refusal: too few samples" "$T/err" "too few samples (fewer than 100)"
run "check: insufficient data" 3 "$KS" rollout check --db "$D"
metrics 1 1000 50
run "advance: health tripped" 75 "$KS" rollout advance --db "$D"
expect_grep "refusal: tripped" "$T/err" "the health check tripped a threshold"
run "check: tripped" 2 "$KS" rollout check --db "$D"
expect_grep "check: names the check and values" "$T/out" "auth-failure-rate 0.05 > 0.001"
expect_grep "check: says by how much" "$T/out" "TRIPPED by 0.049 (50x the limit)"
run "check --json" 2 "$KS" rollout check --db "$D" --json
json_ok "check --json"
expect_grep "check --json: tripped check" "$T/out" '"check":"auth-failure-rate","observed":0.05,"limit":0.001,"enabled":true,"no_data":false,"tripped":true,"over_by":0.049'
run "metrics --prometheus" 0 "$KS" rollout metrics --db "$D" --prometheus
expect_grep "prometheus: HELP" "$T/out" "^# HELP keyshift_opens_total "
expect_grep "prometheus: TYPE" "$T/out" "^# TYPE keyshift_opens_total counter"
expect_grep "prometheus: labels" "$T/out" '^keyshift_opens_total{rollout="1",scope="column",table="pay",column="card",source="app"} 1000$'
expect_grep "prometheus: cumulative histogram" "$T/out" '^keyshift_open_duration_seconds_bucket{rollout="1",scope="column",table="pay",column="card",source="app",le="+Inf"} '
expect_grep "prometheus: seal _sum in seconds" "$T/out" '^keyshift_seal_duration_seconds_sum{rollout="1",scope="column",table="pay",column="card",source="app"} 0.0002$'
expect_grep "prometheus: open _sum in seconds" "$T/out" '^keyshift_open_duration_seconds_sum{rollout="1",scope="column",table="pay",column="card",source="app"} 0.00025$'
hist_sums_ok "prometheus: every _sum agrees with its buckets" "$T/out"
expect_grep "prometheus: phase is a gauge" "$T/out" '^keyshift_rollout_phase{rollout="1",scope="column",table="pay",column="card",phase="write-upgrade"} 1$'
expect_grep "prometheus: other phases are 0" "$T/out" '^keyshift_rollout_phase{rollout="1",scope="column",table="pay",column="card",phase="backfill"} 0$'
if grep -q '_total{.*phase=' "$T/out"; then bad "prometheus: a counter has a phase label"; else ok "prometheus: no phase label on counters"; fi
expect_grep "prometheus: tripped check" "$T/out" 'keyshift_health_tripped{.*check="auth-failure-rate"} 1'
mkdir -p "$T/textfile"
run "metrics --textfile" 0 "$KS" rollout metrics --db "$D" --prometheus --textfile "$T/textfile"
expect_grep "textfile: written" "$T/textfile/keyshift_rollout_1.prom" '^keyshift_opens_total{rollout="1",scope="column",table="pay",column="card",source="app"} 1000$'
expect_grep "textfile: _sum written" "$T/textfile/keyshift_rollout_1.prom" '^keyshift_open_duration_seconds_sum{rollout="1",scope="column",table="pay",column="card",source="app"} 0.00025$'
hist_sums_ok "textfile: every _sum agrees with its buckets" "$T/textfile/keyshift_rollout_1.prom"
if ls -A "$T/textfile" | grep -q '^\.'; then bad "textfile: a temporary file was left behind"; else ok "textfile: renamed into place"; fi
run "metrics --textfile: not a directory" 66 "$KS" rollout metrics --db "$D" --prometheus --textfile "$T/textfile/keyshift_rollout_1.prom"
run "metrics --textfile needs --prometheus" 64 "$KS" rollout metrics --db "$D" --json --textfile "$T/textfile"
run "metrics --json" 0 "$KS" rollout metrics --db "$D" --json
json_ok "metrics --json"
run "metrics needs a format" 64 "$KS" rollout metrics --db "$D"
run "check --auto-rollback" 1 "$KS" rollout check --db "$D" --auto-rollback --actor monitor
phase_is 1 read-compat
run "log: automatic rollback" 0 "$KS" rollout log --db "$D" --json
expect_grep "log: automatic entry" "$T/out" '"actor":"monitor","from":"write-upgrade","to":"read-compat","reason":"auto-rollback: auth-failure-rate 0.05 > 0.001","automatic":true'
run "check --auto-rollback from read-compat" 2 "$KS" rollout check --db "$D" --auto-rollback
expect_grep "check: no safe rollback" "$T/err" "no safe automatic rollback from read-compat"
sql "UPDATE keyshift_metrics SET time = time - 100000; UPDATE keyshift_rollout SET phase_since = phase_since - 7200 WHERE id = 1"
run "advance -> write-upgrade again" 0 "$KS" rollout advance --db "$D"
metrics 1 1000 0
run "metrics --prometheus after another sample" 0 "$KS" rollout metrics --db "$D" --prometheus
expect_grep "prometheus: seal _sum grew" "$T/out" '^keyshift_seal_duration_seconds_sum{rollout="1",scope="column",table="pay",column="card",source="app"} 0.0004$'
expect_grep "prometheus: open _sum grew" "$T/out" '^keyshift_open_duration_seconds_sum{rollout="1",scope="column",table="pay",column="card",source="app"} 0.0005$'
hist_sums_ok "prometheus: every _sum still agrees with its buckets" "$T/out"
run "check: healthy" 0 "$KS" rollout check --db "$D"
expect_grep "check: healthy printed" "$T/out" "healthy"
run "advance -> backfill" 0 "$KS" rollout advance --db "$D"
phase_is 1 backfill

# ---- backfill: migrate, verify, finalize --------------------------------------------------------------
run "migrate: another target key" 78 "$KS" migrate run --db "$D" --table pay --column card \
    --mode encrypt --to-key payments/kek:1 --tenant acme
expect_grep "migrate: names the rollout's target" "$T/err" "rollout 1 moves pay.card to v2:xchacha20-poly1305:payments/kek:2"
run "migrate: another format" 78 "$KS" migrate run --db "$D" --table pay --column card \
    --mode encrypt --to-key payments/kek:2 --to-format 1 --tenant acme
run "advance: finalize before backfill is complete" 75 "$KS" rollout advance --db "$D"
expect_grep "refusal: rows at the source" "$T/err" "2 rows are still at the source"
run "migrate run in backfill" 0 "$KS" migrate run --db "$D" --table pay --column card \
    --mode encrypt --to-key payments/kek:2 --tenant acme
n=$(sqlite3 "$D" "SELECT count(*) FROM keyshift_metrics WHERE rollout_id = 1 AND source = 'migrate' AND seals = 2")
if [ "$n" = 1 ]; then ok "migrate: wrote its health sample (2 seals) for the rollout"; else bad "migrate: health sample" "$n rows"; fi
run "advance: finalize without verify" 75 "$KS" rollout advance --db "$D"
expect_grep "refusal: no verify" "$T/err" "no \`migrate verify\` pass was recorded since backfill began"
run "verify --sample is not recorded" 0 "$KS" migrate verify --db "$D" --table pay --column card --tenant acme --sample 5
run "advance: still no verify" 75 "$KS" rollout advance --db "$D"
run "verify records the pass" 0 "$KS" migrate verify --db "$D" --table pay --column card --tenant acme
expect_grep "verify: says it was recorded" "$T/err" "verify pass recorded for rollout 1"
run "advance -> finalized" 0 "$KS" rollout advance --db "$D" --reason "all encrypted"
phase_is 1 finalized
run "advance past finalized" 65 "$KS" rollout advance --db "$D"
run "census: all at the target" 0 "$KS" rollout status --db "$D" --rollout 1
expect_grep "status: census after finalize" "$T/out" "2 at the target"

# ---- rollout 2: rotate payments/kek:2 -> payments/kek:3 ---------------------------------------------
run "keys add-version 3" 0 "$KS" keys add-version payments/kek
run "start rollout 2" 0 "$KS" rollout start --db "$D" --table pay --column card --source "$TGT2" \
    --target "$TGT3" --min-soak 0 --min-samples 0 --json
json_ok "start --json"
run "status with two rollouts, none selected" 64 "$KS" rollout status --db "$D"
expect_grep "several: lists rollout 1" "$T/err" "\-\-rollout 1 .*pay.card (finalized)"
expect_grep "several: lists rollout 2" "$T/err" "\-\-rollout 2 .*pay.card (planned)"
SEL=(--table pay --column card)
reader web-1 "payments/kek:1,payments/kek:2,payments/kek:3" 0
reader old-7 "payments/kek:1" 3600
run "rollout 2 -> read-compat" 0 "$KS" rollout advance --db "$D" "${SEL[@]}"
# these two guards need no key: a keyring that cannot open is not opened
run "rollout 2 -> write-upgrade" 0 env KEYSHIFT_KEYRING="$T/nosuch" "$KS" rollout advance --db "$D" "${SEL[@]}"
# --min-samples 0, but a window with nothing in it is not healthy
run "rollout 2: empty window is not healthy" 75 env KEYSHIFT_KEYRING="$T/nosuch" "$KS" rollout advance --db "$D" "${SEL[@]}"
expect_grep "empty window: no data" "$T/err" "no data in the window for: auth-failure-rate, parse-error-rate, provider-error-rate, seal-p99-us, open-p99-us"
metrics 2 500 0
run "rollout 2 -> backfill" 0 env KEYSHIFT_KEYRING="$T/nosuch" "$KS" rollout advance --db "$D" "${SEL[@]}"

# key destruction while referenced
run "destroy without --db" 64 "$KS" keys set-state payments/kek 2 destroyed
expect_grep "destroy: says why, in a sentence" "$T/err" "payments/kek:2 was not destroyed, because without --db nothing that references it can be checked"
run "destroy while rows and a reader reference it" 75 "$KS" keys set-state payments/kek 2 destroyed --db "$D"
expect_grep "destroy: names the rows" "$T/err" "2 rows of pay.card"
expect_grep "destroy: names the reader" "$T/err" "live reader web-1 holds it"
expect_grep "destroy: sums the references" "$T/err" "payments/kek:2 is still referenced by 2 rows, 1 live reader"
expect_grep "destroy: the refusal is a sentence" "$T/err" "payments/kek:2 is still referenced by 2 rows, 1 live reader and [0-9]* open rollouts\?, so payments/kek:2 was not destroyed: once destroyed"
run "--force without --reason" 64 "$KS" keys set-state payments/kek 2 destroyed --db "$D" --force
run "--db with another state" 64 "$KS" keys set-state payments/kek 2 disabled --db "$D"

run "rollout 2: rewrap" 0 "$KS" migrate run --db "$D" --table pay --column card --mode rewrap --to-key payments/kek:3 --tenant acme
run "rollout 2: verify" 0 "$KS" migrate verify --db "$D" --table pay --column card --tenant acme
run "keys promote 2" 0 "$KS" keys promote payments/kek 2
run "finalize while the source is primary" 75 "$KS" rollout advance --db "$D" "${SEL[@]}"
expect_grep "refusal: promote the target" "$T/err" "keyshift keys promote payments/kek 3"
phase_is 2 backfill
run "keys promote 3" 0 "$KS" keys promote payments/kek 3
run "rollout 2 -> finalized" 0 "$KS" rollout advance --db "$D" "${SEL[@]}"
phase_is 2 finalized
expect_grep "finalize: source retired" "$T/err" "payments/kek:2 is now decrypt-only"
run "keys list --json" 0 "$KS" keys list --json
expect_grep "source key version is decrypt-only" "$T/out" '{"version":2,"state":"decrypt-only"'

run "destroy while a live reader holds it" 75 "$KS" keys set-state payments/kek 2 destroyed --db "$D"
expect_grep "destroy: only the reader now" "$T/err" "live reader web-1 holds it"
run "destroy --force --reason" 0 "$KS" keys set-state payments/kek 2 destroyed --db "$D" --force --reason "drill OPS-9"
run "log: forced destruction noted" 0 "$KS" rollout log --db "$D" "${SEL[@]}"
expect_grep "log: force reason" "$T/out" "key payments/kek:2 destroyed with --force: drill OPS-9"
run "rollback finalized -> backfill after the source was destroyed" 75 "$KS" rollout rollback --db "$D" "${SEL[@]}" --reason "undo"
expect_grep "refusal: source destroyed" "$T/err" "source key payments/kek:2 was destroyed: its rows could never be read"
run "rollback rollout 1 (not the latest)" 75 "$KS" rollout rollback --db "$D" --rollout 1 --reason "undo"
expect_grep "refusal: a later rollout" "$T/err" "a later rollout governs pay.card"

reader web-1 "payments/kek:1,payments/kek:3" 3600
run "destroy an unreferenced version" 0 "$KS" keys set-state payments/kek 1 destroyed --db "$D"
run "readers (text)" 0 "$KS" rollout readers --db "$D"
expect_grep "readers: expired reader" "$T/out" "web-1 *no "

# ---- JSON of the transitions ----------------------------------------------------------------
run "start: target version that does not exist" 65 "$KS" rollout start --db "$D" --table pay --column card \
    --source "$TGT3" --target v1:aes-256-gcm:payments/kek:4 --json
expect_grep "start: names the missing target" "$T/err" "target key payments/kek:4 does not exist in the key provider"
expect_eq "start: nothing started" "$T/out" ""
run "keys add-version 4" 0 "$KS" keys add-version payments/kek
run "keys disable 4" 0 "$KS" keys set-state payments/kek 4 disabled
run "start: target that cannot seal" 65 "$KS" rollout start --db "$D" --table pay --column card \
    --source "$TGT3" --target v1:aes-256-gcm:payments/kek:4
expect_grep "start: names the disabled target" "$T/err" "target key payments/kek:4 is disabled, so nothing can be sealed under it"
run "start: without a keyring" 64 env -u KEYSHIFT_KEYRING "$KS" rollout start --db "$D" --table pay \
    --column card --source "$TGT3" --target v1:aes-256-gcm:payments/kek:4
expect_grep "start: says why it needs the keyring" "$T/err" "start checks target key payments/kek:4 with the key provider"
run "keys enable 4" 0 "$KS" keys set-state payments/kek 4 active
run "start rollout 3 --json" 0 "$KS" rollout start --db "$D" --table pay --column card --source "$TGT3" \
    --target v1:aes-256-gcm:payments/kek:4 --json
json_ok "start --json"
run "advance --json refused" 75 "$KS" rollout advance --db "$D" --rollout 3 --json --keyring "$T/keyring-v1"
json_ok "advance --json (refused)"
expect_grep "advance --json: refusal reason" "$T/out" '"result":"guard","reason":"target key payments/kek:4 does not exist'
run "advance --json" 0 "$KS" rollout advance --db "$D" --rollout 3 --json --keyring "$KEYSHIFT_KEYRING"
json_ok "advance --json"
expect_grep "advance --json: result" "$T/out" '"from":"planned","to":"read-compat","result":"ok"'
run "rollback --json" 0 "$KS" rollout rollback --db "$D" --rollout 3 --reason "not yet" --json
json_ok "rollback --json"

# ---- a key scope: every orders/kek envelope of two tables ------------------------------------
D="$T/keys.db"
KSRC=v2:xchacha20-poly1305:orders/kek:1
KTGT=v2:xchacha20-poly1305:orders/kek:2
oseal() {
    printf 'secret' | "$KS" encrypt --tenant acme --key-id orders/kek --key-version 1 |
        od -An -tx1 | tr -d ' \n'
}
run "keys create orders/kek" 0 "$KS" keys create orders/kek
run "keys add-version orders/kek" 0 "$KS" keys add-version orders/kek
sql "CREATE TABLE pay (id INTEGER PRIMARY KEY, card BLOB, tenant TEXT);
     CREATE TABLE refunds (id INTEGER PRIMARY KEY, card BLOB, tenant TEXT);
     INSERT INTO pay (card, tenant) VALUES (X'$(oseal)', 'acme'), (X'$(oseal)', 'acme');
     INSERT INTO refunds (card, tenant) VALUES (X'$(oseal)', 'acme'), (NULL, 'acme');"
KEYSEL=(--key-id orders/kek)
run "key start: --key-id without --columns" 64 "$KS" rollout start --db "$D" --key-id orders/kek --source "$KSRC" --target "$KTGT"
expect_grep "key start: says what a key scope is" "$T/err" "a key scope is --key-id K --columns"
run "key start: with --table too" 64 "$KS" rollout start --db "$D" --key-id orders/kek --columns pay.card --table pay --column card --source "$KSRC" --target "$KTGT"
run "key start: a column without a table" 64 "$KS" rollout start --db "$D" --key-id orders/kek --columns card --source "$KSRC" --target "$KTGT"
run "key start: plaintext source" 64 "$KS" rollout start --db "$D" --key-id orders/kek --columns pay.card --source plaintext --target "$KTGT"
expect_grep "key start: plaintext has no key_id" "$T/err" "plaintext has no key_id"
run "key start: target of another key" 64 "$KS" rollout start --db "$D" --key-id orders/kek --columns pay.card --source "$KSRC" --target "$TGT2"
expect_grep "key start: keeps its key_id" "$T/err" "keeps its key_id"
run "key start: unknown column" 66 "$KS" rollout start --db "$D" --key-id orders/kek --columns pay.card,refunds.nope --source "$KSRC" --target "$KTGT"
run "key start: a reserved table" 64 "$KS" rollout start --db "$D" --key-id orders/kek --columns keyshift_rollout.tbl --source "$KSRC" --target "$KTGT"
run "key start: a column twice" 64 "$KS" rollout start --db "$D" --key-id orders/kek --columns pay.card,PAY.CARD --source "$KSRC" --target "$KTGT"
run "key start" 0 "$KS" rollout start --db "$D" --key-id orders/kek --columns pay.card,refunds.card \
    --source "$KSRC" --target "$KTGT" --min-soak 0 --min-samples 0 --reason "rotate orders/kek"
expect_eq "key start prints the id" "$T/out" "1"
expect_grep "key start: names the scope" "$T/err" "rollout 1 of key orders/kek (pay.card, refunds.card) is planned"
run "key start: the same key again" 65 "$KS" rollout start --db "$D" --key-id orders/kek --columns pay.card --source "$KSRC" --target "$KTGT"
expect_grep "key start: names the open rollout" "$T/err" "rollout 1 of key orders/kek (pay.card, refunds.card) is in planned"
run "column start overlapping the key scope" 65 "$KS" rollout start --db "$D" --table refunds --column card --source plaintext --target "$TGT3"
expect_grep "column start: overlap named" "$T/err" "rollout 1 of key orders/kek .* overlaps refunds.card"
run "key status --json" 0 "$KS" rollout status --db "$D" "${KEYSEL[@]}" --json
json_ok "key status --json"
expect_grep "key status: scope" "$T/out" '"scope":"key","key_id":"orders/kek","columns":\[{"table":"pay","column":"card","verified_at":0},{"table":"refunds","column":"card","verified_at":0}\]'
expect_grep "key status: census per column" "$T/out" '"census":{"rows":4,"null":1,"at_source":3,"at_target":0,"other":0,"columns":\[{"rows":2,"null":0,"at_source":2,"at_target":0,"other":0,"table":"pay","column":"card"}'
run "key status (text)" 0 "$KS" rollout status --db "$D" --rollout 1
expect_grep "key status: scope line" "$T/out" "^scope *key orders/kek, 2 columns"
expect_grep "key status: a column line" "$T/out" "^  column *refunds.card (verified -)"
expect_grep "key status: a column's census" "$T/out" "^  refunds.card: 2 rows: 1 at the source"
run "select: --key-id with --rollout" 64 "$KS" rollout status --db "$D" --rollout 1 "${KEYSEL[@]}"
run "select: no rollout of that key" 66 "$KS" rollout status --db "$D" --key-id nosuch/kek
run "select: --table of a key-scoped column" 66 "$KS" rollout status --db "$D" --table pay --column card
run "key advance -> read-compat" 0 "$KS" rollout advance --db "$D" "${KEYSEL[@]}"
sql "INSERT INTO pay (card, tenant) VALUES (X'$(printf 'secret' | "$KS" encrypt --tenant acme --key-id orders/kek --key-version 2 | od -An -tx1 | tr -d ' \n')', 'acme')"
run "key rollback to planned with a target row" 75 "$KS" rollout rollback --db "$D" "${KEYSEL[@]}" --reason test
expect_grep "key rollback: counts every column" "$T/err" "would make 1 row unreadable"
run "key advance -> write-upgrade" 0 "$KS" rollout advance --db "$D" "${KEYSEL[@]}"
run "migrate refused outside backfill (key scope)" 78 "$KS" migrate run --db "$D" --table refunds --column card \
    --mode rewrap --to-key orders/kek:2 --tenant acme
expect_grep "migrate: names the key rollout's phase" "$T/err" "rollout 1 is in phase write-upgrade"
run "key advance -> backfill, no samples" 75 "$KS" rollout advance --db "$D" "${KEYSEL[@]}"
run "key check: no samples" 3 "$KS" rollout check --db "$D" "${KEYSEL[@]}"
expect_grep "key check: names the scope" "$T/out" "^rollout 1 (key orders/kek (pay.card, refunds.card), write-upgrade): insufficient data"
expect_grep "key check: says which checks have no data" "$T/out" "^no data *auth-failure-rate, parse-error-rate, provider-error-rate, seal-p99-us, open-p99-us"
metrics 1 40 0
run "key advance -> backfill" 0 "$KS" rollout advance --db "$D" "${KEYSEL[@]}"
run "key check: healthy" 0 "$KS" rollout check --db "$D" "${KEYSEL[@]}"
expect_grep "key check: healthy in backfill" "$T/out" "^rollout 1 (key orders/kek (pay.card, refunds.card), backfill): healthy"
run "metrics --prometheus of a key scope" 0 "$KS" rollout metrics --db "$D" "${KEYSEL[@]}" --prometheus
expect_grep "prometheus: key_id label" "$T/out" '^keyshift_opens_total{rollout="1",scope="key",table="",column="",key_id="orders/kek",source="app"} 40$'
run "migrate toward another key (key scope)" 78 "$KS" migrate run --db "$D" --table refunds --column card \
    --mode encrypt --to-key payments/kek:4 --tenant acme
expect_grep "migrate: another key scope covers the column" "$T/err" "rollout 1 (key orders/kek, backfill) covers refunds.card"
run "destroy orders/kek:1 while the key scope's rows use it" 75 "$KS" keys set-state orders/kek 1 destroyed --db "$D"
expect_grep "destroy: rows of a listed column" "$T/err" "1 row of refunds.card"
expect_grep "destroy: the key rollout moves it" "$T/err" "rollout 1 of key orders/kek (pay.card, refunds.card) (backfill) moves it"
# Another tenant's key and a plaintext value in a listed column: not the key scope's to move.
run "keys create other/kek" 0 "$KS" keys create other/kek
OTHER=$(printf 'globex secret' | "$KS" encrypt --tenant globex --key-id other/kek | od -An -tx1 | tr -d ' \n' | tr a-f A-F)
sql "INSERT INTO pay (id, card, tenant) VALUES (100, X'$OTHER', 'globex'), (101, 'plain text', 'acme')"
run "key migrate: --from-key of another key" 78 "$KS" migrate run --db "$D" --table pay --column card --mode rewrap --to-key orders/kek:2 --tenant acme --from-key other/kek
expect_grep "key migrate: names the scope's key" "$T/err" "rollout 1 moves the envelopes of key orders/kek; this run's --from-key is other/kek"
run "key migrate: --from-key with encrypt" 64 "$KS" migrate run --db "$D" --table pay --column card --mode encrypt --to-key orders/kek:2 --tenant acme --from-key orders/kek
run "key migrate pay.card" 0 "$KS" migrate run --db "$D" --table pay --column card --mode rewrap --to-key orders/kek:2 --tenant acme --json
expect_grep "key migrate: other key and plaintext skipped" "$T/out" '"skipped":3,.*"quarantined":0,.*"wrong_state":0'
expect_eq "key migrate: the other key's row is untouched" <(sql "SELECT hex(card) FROM pay WHERE id = 100") "$OTHER"
expect_eq "key migrate: the plaintext row is untouched" <(sql "SELECT card FROM pay WHERE id = 101") "plain text"
expect_eq "key migrate: nothing quarantined" <(sql "SELECT count(*) FROM keyshift_quarantine") "0"
expect_grep "key migrate: the checkpoint names the key" <(sql "SELECT params FROM keyshift_migration") "from"
run "key finalize: rows left in refunds.card" 75 "$KS" rollout advance --db "$D" "${KEYSEL[@]}"
expect_grep "key finalize: rows at the source" "$T/err" "1 row is still at the source"
run "key migrate refunds.card" 0 "$KS" migrate run --db "$D" --table refunds --column card --mode rewrap --to-key orders/kek:2 --tenant acme
run "key verify pay.card, every key" 65 "$KS" migrate verify --db "$D" --table pay --column card --tenant acme
expect_grep "key verify: globex's row fails under tenant acme" "$T/out" "^FAILED id 100: auth-failed"
run "key verify pay.card" 0 "$KS" migrate verify --db "$D" --table pay --column card --tenant acme --from-key orders/kek
expect_grep "key verify: other keys skipped" "$T/out" "3 envelopes checked, 0 failed, 2 rows skipped (NULL, plaintext or another key)"
expect_grep "key verify: recorded for the column" "$T/err" "verify pass recorded for rollout 1 (backfill, key orders/kek) for pay.card"
run "key finalize: refunds.card not verified" 75 "$KS" rollout advance --db "$D" "${KEYSEL[@]}"
expect_grep "key finalize: names the column" "$T/err" "since backfill began for 1 of 2 columns: refunds.card"
run "key verify refunds.card" 0 "$KS" migrate verify --db "$D" --table refunds --column card --tenant acme
run "keys promote orders/kek 2" 0 "$KS" keys promote orders/kek 2
run "key advance -> finalized" 0 "$KS" rollout advance --db "$D" "${KEYSEL[@]}" --json
json_ok "key advance --json"
phase_is 1 finalized
expect_grep "key finalize: source retired" "$T/err" "orders/kek:1 is now decrypt-only"
run "key log --json" 0 "$KS" rollout log --db "$D" "${KEYSEL[@]}" --json
json_ok "key log --json"
expect_grep "key log: the verify of each column" "$T/out" '"reason":"migrate verify passed for refunds.card"'
expect_grep "key log --json: the scope" "$T/out" '^{"rollout":1,"scope":"key","key_id":"orders/kek","columns":\[{"table":"pay"'
run "key log (text)" 0 "$KS" rollout log --db "$D" "${KEYSEL[@]}"
expect_grep "key log: the scope in its title" "$T/out" "^log of rollout 1 (key orders/kek (pay.card, refunds.card))"
run "column start after the key scope is finalized" 0 "$KS" rollout start --db "$D" --table refunds --column card --source "$KTGT" --target "$TGT3"
run "key rollback while a later column rollout exists" 75 "$KS" rollout rollback --db "$D" --rollout 1 --reason undo
expect_grep "key rollback: a later rollout governs" "$T/err" "a later rollout governs key orders/kek"

# ---- a mistaken rollout: abort, set, no data, the migration's own figures --------------------
D="$T/abort.db"
TGT4=v1:aes-256-gcm:payments/kek:4
sql "CREATE TABLE pay (id INTEGER PRIMARY KEY, card BLOB, tenant TEXT);
     INSERT INTO pay (card, tenant) VALUES ('4111', 'acme'), ('5500', 'acme');"
run "abort: start a rollout to kek:4" 0 "$KS" rollout start --db "$D" --table pay --column card \
    --source plaintext --target "$TGT4" --actor alice
run "abort: kek:4 disabled after start" 0 "$KS" keys set-state payments/kek 4 disabled
run "abort: advance refused" 75 "$KS" rollout advance --db "$D"
run "abort: a new start is refused" 65 "$KS" rollout start --db "$D" --table pay --column card \
    --source plaintext --target "$TGT3"
expect_grep "abort: the new start says finalize first" "$T/err" "finalize it first"
run "abort without --reason" 64 "$KS" rollout abort --db "$D"
expect_grep "abort: --reason is required" "$T/err" "\-\-reason TEXT is required"
run "abort in planned" 0 "$KS" rollout abort --db "$D" --actor bob --reason "kek:4 is retired"
expect_grep "abort: says what it did" "$T/out" "^rollout 1 (pay.card) aborted in planned"
expect_grep "abort: the scope is free" "$T/err" "pay.card is free for a new 'keyshift rollout start'"
expect_eq "abort: the rollout is gone" <(sql "SELECT count(*) FROM keyshift_rollout") "0"
run "abort: the log stays" 0 "$KS" rollout log --db "$D" --rollout 1 --json
expect_grep "abort: logged with actor and reason" "$T/out" '"actor":"bob","from":"planned","to":"planned","reason":"aborted: kek:4 is retired"'
expect_grep "abort: logged with what it was" "$T/out" '"reason":"abort: the rollout of plaintext to payments/kek:4 (v1, aes-256-gcm) is removed"'
run "abort: status of the aborted rollout" 66 "$KS" rollout status --db "$D" --rollout 1
run "keys enable 4 again" 0 "$KS" keys set-state payments/kek 4 active
run "abort: start again" 0 "$KS" rollout start --db "$D" --table pay --column card --source plaintext \
    --target "$TGT3" --min-soak 0 --actor alice
expect_eq "abort: the new rollout has a new id" "$T/out" "2"
run "abort: -> read-compat" 0 "$KS" rollout advance --db "$D"
sql "INSERT INTO pay (card, tenant) VALUES (X'$(seal 3)', 'acme')"
run "abort in read-compat with a row at the target" 75 "$KS" rollout abort --db "$D" --reason test
expect_grep "abort: names the rows" "$T/err" "aborting would make 1 row unreadable"
sql "DELETE FROM pay WHERE id = 3"
run "abort: -> write-upgrade" 0 "$KS" rollout advance --db "$D"
run "abort in write-upgrade" 65 "$KS" rollout abort --db "$D" --reason test --json
json_ok "abort --json (refused)"
expect_grep "abort: roll back first" "$T/out" "roll it back to read-compat first"
phase_is 2 write-upgrade

# the default --min-samples 1000 for an application that reports few
metrics 2 30 0
run "set: too few samples" 75 "$KS" rollout advance --db "$D"
expect_grep "set: the refusal" "$T/err" "too few samples (fewer than 1000)"
run "set: nothing to change" 64 "$KS" rollout set --db "$D"
run "set: a bad window" 64 "$KS" rollout set --db "$D" --window 0
run "set --min-samples 50" 0 "$KS" rollout set --db "$D" --min-samples 50 --actor carol --reason "batch app"
expect_grep "set: names the change" "$T/out" "min_samples 1000 -> 50"
run "set: the same again" 0 "$KS" rollout set --db "$D" --min-samples 50 --json
expect_grep "set: nothing changed" "$T/out" '"changes":""'
run "set: logged" 0 "$KS" rollout log --db "$D" --json
expect_grep "set: logged with old and new value" "$T/out" '"actor":"carol","from":"write-upgrade","to":"write-upgrade","reason":"set: min_samples 1000 -> 50"'
expect_grep "set: logged with the reason" "$T/out" '"actor":"carol","from":"write-upgrade","to":"write-upgrade","reason":"batch app"'

# opens that nobody timed: the p99 checks have no data, and do not pass
sql "DELETE FROM keyshift_metrics"
metrics 2 2970 0 app 0
run "no data: check" 3 "$KS" rollout check --db "$D"
expect_grep "no data: named" "$T/out" "^no data *seal-p99-us, open-p99-us"
expect_grep "no data: the checks say so" "$T/out" "^  open-p99-us .*no data (not healthy)"
run "no data: advance refused" 75 "$KS" rollout advance --db "$D"
expect_grep "no data: the refusal names them" "$T/err" "no data in the window for: seal-p99-us, open-p99-us"
run "no data: disable the latency checks" 0 "$KS" rollout set --db "$D" --max-seal-p99-us 0 --max-open-p99-us 0
run "no data: now healthy" 0 "$KS" rollout check --db "$D"

# a migration's failures are its own figures, not the applications' health
metrics 2 1980 1980 migrate
run "migration: check --auto-rollback stays healthy" 0 "$KS" rollout check --db "$D" --auto-rollback
phase_is 2 write-upgrade
run "migration: status" 0 "$KS" rollout status --db "$D"
expect_grep "migration: its own line" "$T/out" "^migration .*(not judged): 1980 seals, 1980 opens, 1980 auth failures"
expect_grep "migration: the health is the applications'" "$T/out" "^health *ok"
run "migration: status --json" 0 "$KS" rollout status --db "$D" --json
json_ok "migration: status --json"
expect_grep "migration: JSON" "$T/out" '"migration":{"window_s":300,"seals":1980,"opens":1980,"auth_failures":1980'
run "migration: metrics --json" 0 "$KS" rollout metrics --db "$D" --json
json_ok "migration: metrics --json"
run "migration: metrics --prometheus" 0 "$KS" rollout metrics --db "$D" --prometheus
expect_grep "migration: its own series" "$T/out" '^keyshift_auth_failures_total{rollout="2",scope="column",table="pay",column="card",source="migrate"} 1980$'
expect_grep "migration: not the applications'" "$T/out" '^keyshift_auth_failures_total{rollout="2",scope="column",table="pay",column="card",source="app"} 0$'
expect_grep "migration: the status is ok" "$T/out" '^keyshift_health_status{rollout="2",scope="column",table="pay",column="card"} 0$'
run "advance -> backfill" 0 "$KS" rollout advance --db "$D"
run "set on a finalized rollout" 65 "$KS" rollout set --db "$T/keys.db" --rollout 1 --min-samples 5

cli_finish cli_rollout_test
