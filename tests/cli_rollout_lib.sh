# tests/cli_rollout_lib.sh -- helpers the rollout lifecycle tests share
# (tests/cli_rollout_lifecycle_test.sh, cli_rollout_lifecycle_pg_test.sh,
# cli_every_service_test.sh; sourced after cli_lib.sh): reading the demo
# app's JSON summary, waiting for a condition, running a rollout step
# that a guard may refuse for a while, and waiting for a health check to
# trip.
#
# NO_LATENCY: the `rollout start` options the lifecycle tests give every
# rollout, the latency checks off.  Under ASan on a loaded host an
# application's p99 can pass the 10 ms default, which would hold an
# advance back for the whole health window or trip a rollback that the
# test is not about.  tests/test_health.c and tests/cli_rollout_test.sh
# check the latency checks themselves.
NO_LATENCY=(--max-seal-p99-us 0 --max-open-p99-us 0)

# jnum FILE NAME: the numeric value of "NAME" in FILE (one JSON line).
jnum() { sed -n "s/.*\"$2\":\([0-9]*\).*/\1/p" "$1" | head -1; }
# jobj FILE NAME: the object value of "NAME" in FILE, e.g. {"auth-failed":1}.
jobj() { sed -n "s/.*\"$2\":\({[^}]*}\).*/\1/p" "$1" | head -1; }

# wait_for SECONDS CMD...: run CMD every 0.2 s until it succeeds or the
# time is up; returns CMD's last status.
wait_for() {
    local deadline=$((SECONDS + $1))
    shift
    until "$@"; do
        [ "$SECONDS" -ge "$deadline" ] && return 1
        sleep 0.2
    done
}

# step NAME CMD...: run a `keyshift rollout` (or `migrate`) step, retrying
# while a guard refuses (exit 75: soak, readers, health) for up to 20 s;
# its output in $T/out and $T/err.  Returns the step's exit status.
step() {
    local name=$1 deadline=$((SECONDS + 20)) rc
    shift
    while :; do
        "$@" >"$T/out" 2>"$T/err"
        rc=$?
        [ "$rc" -ne 75 ] || [ "$SECONDS" -ge "$deadline" ] && break
        sleep 0.5
    done
    if [ "$rc" -eq 0 ]; then ok "$name"; else bad "$name" "exit $rc: $(head -c 400 "$T/err")"; fi
    return "$rc"
}

# check_trips SELECTION...: run `keyshift rollout check SELECTION
# --auto-rollback --json` while it finds the rollout healthy (0) or has too
# few samples to judge (3), for up to 20 s; its JSON in $T/check.json,
# its messages in $T/check.err.  Returns its last exit status (1: a
# threshold tripped and the rollout was rolled back).
check_trips() {
    local rc deadline=$((SECONDS + 20))
    while :; do
        "$KS" rollout check "$@" --auto-rollback --json >"$T/check.json" 2>"$T/check.err"
        rc=$?
        { [ "$rc" = 0 ] || [ "$rc" = 3 ]; } && [ "$SECONDS" -lt "$deadline" ] || return "$rc"
        sleep 0.3
    done
}

# expect_tripped NAME CHECK FILE: the `rollout check --json` output in FILE
# shows CHECK (e.g. auth-failure-rate) tripped.  Every check is listed by
# name whatever its state, so the name alone proves nothing.
expect_tripped() {
    if grep -q "\"check\":\"$2\",[^}]*\"tripped\":true" "$3"; then ok "$1"; else
        bad "$1" "$2 did not trip: $(head -c 900 "$3")"; fi
}

# text_rollout NAME DB KV ROWS COUNT: a rollout of the base64 text column
# txt.card of DB (ROWS plaintext rows, made by the caller: a SQLite TEXT
# or PostgreSQL text column) from plaintext to
# v2:xchacha20-poly1305:pay/kek:KV, recorded with --encoding base64 and
# taken from planned through finalized while a demo app (--encoding
# base64) reads and writes the column.  The rollout's census, migrate run
# and migrate verify read base64; a run without --encoding base64 is
# refused (exit 64), as is the app without it.  COUNT (a function) prints
# how many rows of txt.card hold "S1NF" text; at the end it must be ROWS,
# and the app must exit 0 having written the target.
text_rollout() {
    local name=$1 db=$2 kv=$3 rows=$4 count=$5 pid rc i t0=$SECONDS
    local target=v2:xchacha20-poly1305:pay/kek:$kv
    local tr=(--db "$db" --table txt --column card)
    local tctx=(--tenant-column tenant --context 'txt:{id}:card')
    local mig=(migrate run "${tr[@]}" "${tctx[@]}" --mode encrypt --to-key "pay/kek:$kv"
        --to-format 2 --purpose card)
    step "$name: start --encoding base64" "$KS" rollout start "${tr[@]}" --encoding base64 \
        --source plaintext --target "$target" --min-soak 0 --reader-ttl 5 --min-samples 20 \
        "${NO_LATENCY[@]}" --window 60 || return 1
    "$KS" rollout status "${tr[@]}" --json >"$T/tstatus.json" 2>&1
    expect_grep "$name: status shows the encoding" "$T/tstatus.json" '"encoding":"base64"'
    run "$name: the demo app without --encoding base64: 64" 64 "$APP" "${tr[@]}" "${tctx[@]}" \
        --purpose card --instance text-x --ops 1
    expect_grep "$name: the app's refusal names the encoding" "$T/err" "encoding base64"
    "$APP" "${tr[@]}" "${tctx[@]}" --purpose card --instance text-web --encoding base64 \
        --seconds 3600 --rate 150 --write-percent 20 --reload-ms 200 --json \
        >"$T/text.json" 2>"$T/text.err" &
    pid=$!
    PIDS+=("$pid")
    step "$name: advance to read-compat" "$KS" rollout advance "${tr[@]}" || return 1
    step "$name: advance to write-upgrade" "$KS" rollout advance "${tr[@]}" --all || return 1
    sleep 1 # the app sees write-upgrade and reports samples
    step "$name: advance to backfill (health from the app)" "$KS" rollout advance "${tr[@]}" ||
        return 1
    sleep 1 # the app's policy has refreshed: it writes the target now
    run "$name: migrate run without --encoding base64: 64" 64 "$KS" "${mig[@]}"
    expect_grep "$name: the run's refusal names the encoding" "$T/err" \
        "records txt.card as of base64 encoding; this run's is binary: give --encoding base64"
    for i in 1 2 3; do
        step "$name: migrate run --encoding base64 (pass $i)" "$KS" "${mig[@]}" --encoding base64 ||
            return 1
        step "$name: migrate verify --encoding base64" "$KS" migrate verify "${tr[@]}" \
            "${tctx[@]}" --purpose card --encoding base64 || return 1
        "$KS" rollout advance "${tr[@]}" >"$T/out" 2>"$T/err" && break
        [ "$i" = 3 ] && { bad "$name: advance to finalized" "$(head -c 400 "$T/err")"; return 1; }
    done
    ok "$name: finalized ($((SECONDS - t0)) s)"
    "$KS" census "${tr[@]}" --encoding base64 --json >"$T/census.json"
    if grep -q '"plaintext":0' "$T/census.json" && [ "$("$count")" = "$rows" ]; then
        ok "$name: census: every row at the target, as base64 text"
    else
        bad "$name: census at the target" "$("$count") text rows: $(cat "$T/census.json")"
    fi
    kill -TERM "$pid"
    wait "$pid"
    rc=$?
    if [ "$rc" = 0 ] && [ "$(jnum "$T/text.json" failed_reads)" = 0 ] &&
        [ "$(jnum "$T/text.json" reads_envelope)" -gt 0 ] &&
        grep -q "\"$target\":[1-9]" "$T/text.json"; then
        ok "$name: the app read $(jnum "$T/text.json" reads_envelope) text envelopes, none failed, and wrote the target"
    else
        bad "$name: the app's summary" "exit $rc: $(head -c 500 "$T/text.json" "$T/text.err")"
    fi
}
