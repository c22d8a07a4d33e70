# tests/cli_rollout_lib.sh -- helpers the rollout lifecycle tests share
# (tests/cli_rollout_lifecycle_test.sh, cli_rollout_lifecycle_pg_test.sh,
# cli_every_service_test.sh; sourced after cli_lib.sh): reading the demo
# app's JSON summary, waiting for a condition, running a rollout step
# that a guard may refuse for a while, and waiting for a health check to
# trip.

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
