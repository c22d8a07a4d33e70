#!/usr/bin/env bash
# tests/cli_plugin_test.sh -- a KMS plugin behind the provider registry,
# from the command line, under every fault of tests/keyshift-kms-fault
# (docs/kms-plugin.md section 10).
#
# A column of 40 rows, each sealed under its own DEK of a local key, is
# rewrapped into a key held by the fault plugin (40 wraps, 40 verify
# unwraps). For each fault the plan lets the first wraps through, then
# misbehaves; the test asserts
#   - the exit code of `keyshift migrate run`;
#   - that the run stopped cleanly and a second run (faults off) resumes
#     and finishes with nothing lost: every row at the target, `migrate
#     verify` clean, each row's nonce and ciphertext those of the source;
#   - that no DEK the plugin saw and no plaintext is in any output;
#   - that the plugin received no more attempts of the faulting call than
#     1 + retries, and keyshift started no more processes than that.
# Then the rate limit (requests counted at the plugin), kill -9 during a
# rewrap and resume, and a plugin that is not there.
set -u
. "$(dirname "$0")/cli_lib.sh"

sql() { sqlite3 -batch "$1" "$2"; }
unset KEYSHIFT_KEYRING KEYSHIFT_PASSPHRASE KEYSHIFT_PROVIDERS
ROOT=$(cd "$(dirname "$0")/.." && pwd)
FAULT="$ROOT/tests/keyshift-kms-fault"
if ! command -v python3 >/dev/null; then
    bad "python3 is on PATH (the fault plugin is a Python script)"
    cli_finish cli-plugin
    exit 1
fi

# ---- keys: a local legacy key, the plugin's key ---------------------------------------
export KEYSHIFT_FAULT_DIR="$T/fault"
mkdir -p "$KEYSHIFT_FAULT_DIR"
export KEYSHIFT_KMS_EXAMPLE_KEYS="$T/kms-keys.json"
printf '{"kms/card": {"primary": 1, "versions": {"1": {"state": "active", "kek": "%s"}}}}\n' \
    "$(head -c 32 /dev/urandom | base64)" >"$KEYSHIFT_KMS_EXAMPLE_KEYS"
K="$T/keyring"
run "init the keyring" 0 "$KS" keys init --keyring "$K"
run "create the legacy key" 0 "$KS" keys create legacy/card --keyring "$K"

# reg FILE [SETTING...]: the registry, the plugin with short deadlines
reg() {
    local f=$1
    shift
    {
        printf 'keyshift-providers 1\n\nprovider legacy\n  type local\n  keyring %s\n  serve-prefix legacy/\n\n' "$K"
        printf 'provider kms\n  type plugin\n  command %s\n' "$FAULT"
        printf '  env KEYSHIFT_FAULT_DIR\n  env KEYSHIFT_KMS_EXAMPLE_KEYS\n'
        local s
        for s in "$@"; do printf '  %s\n' "$s"; done
        printf '  serve-prefix kms/\n'
    } >"$f"
    chmod 600 "$f"
}
REG="$T/providers"
# 2 s per request: ample for the Python plugin on a loaded host
reg "$REG" "timeout-ms 2000" "retries 2" "rate-limit 0"
export KEYSHIFT_PROVIDERS="$REG"
: >"$KEYSHIFT_FAULT_DIR/plan"
run "providers check: the plugin greets" 0 "$KS" providers check --json
expect_grep "check: the plugin's name" "$T/out" 'keyshift-kms-example 1'

# ---- the source column: 40 rows, 40 DEKs -------------------------------------------------
ROWS=40
SRC="$T/src.db"
sql "$SRC" "CREATE TABLE pay(id INTEGER PRIMARY KEY, tenant TEXT, card BLOB);"
for i in $(seq 1 $ROWS); do
    hx=$(printf 'card-%s-4111' "$i" | "$KS" encrypt --tenant acme --key-id legacy/card --purpose card \
        --context "pay:$i:card" | od -An -tx1 | tr -d ' \n')
    echo "INSERT INTO pay VALUES($i, 'acme', X'$hx');"
done | sqlite3 -batch "$SRC"
if [ "$(sql "$SRC" "SELECT count(*) FROM pay")" = "$ROWS" ]; then ok "40 rows, each under its own DEK"; else bad "the source column"; fi
ct_tails "$SRC" >"$T/src.tails"
CTX=(--tenant-column tenant --context 'pay:{id}:card' --purpose card)

# no_secrets NAME FILE...: no DEK the plugin saw, no plaintext, in FILEs
no_secrets() {
    local name=$1
    shift
    local hit=""
    if [ -s "$KEYSHIFT_FAULT_DIR/deks" ] && grep -F -q -f "$KEYSHIFT_FAULT_DIR/deks" "$@"; then hit+=" dek"; fi
    if grep -q 'card-[0-9]*-4111' "$@"; then hit+=" plaintext"; fi
    if [ -z "$hit" ]; then ok "$name: no DEK and no plaintext in the output"; else bad "$name: secrets in the output" "$hit"; fi
}

# attempts FAULT: requests of the plugin's log that got FAULT
attempts() { awk -v f="$1" '$5 == f' "$KEYSHIFT_FAULT_DIR/log" | grep -c .; }
# starts: hellos in the plugin's log
starts() { awk '$3 == "hello"' "$KEYSHIFT_FAULT_DIR/log" | grep -c .; }

# fault_case NAME PLAN WANT_RC MAX_ATTEMPTS: one rewrap under PLAN, then a
# clean resume; MAX_ATTEMPTS bounds the faulting requests (and starts).
fault_case() {
    local name=$1 plan=$2 want=$3 max=$4 db="$T/case.db"
    cp "$SRC" "$db"
    rm -f "$KEYSHIFT_FAULT_DIR/used" "$KEYSHIFT_FAULT_DIR/log"
    printf '%b' "$plan" >"$KEYSHIFT_FAULT_DIR/plan"
    local tgt=(--db "$db" --table pay --column card)
    run "$name: migrate exits $want" "$want" "$KS" migrate run "${tgt[@]}" --mode rewrap --to-key kms/card:1 "${CTX[@]}" \
        --batch-size 5 --json
    cp "$T/out" "$T/case.out"
    cp "$T/err" "$T/case.err"
    local f
    f=$(printf '%b' "$plan" | awk '$2 != "ok" { print $2; exit }')
    local n s
    n=$(attempts "$f")
    s=$(starts)
    if [ "$n" -ge 1 ] && [ "$n" -le "$max" ] && [ "$s" -le $((max + 1)) ]; then
        ok "$name: $n attempts of the faulting call, $s starts (at most $max and $((max + 1)))"
    else
        bad "$name: attempts bounded" "$n attempts (max $max), $s starts"
    fi
    : >"$KEYSHIFT_FAULT_DIR/plan"
    run "$name: resume exits 0" 0 "$KS" migrate run "${tgt[@]}" --mode rewrap --to-key kms/card:1 "${CTX[@]}" --json
    cat "$T/out" >>"$T/case.out"
    cat "$T/err" >>"$T/case.err"
    run "$name: census" 0 "$KS" census "${tgt[@]}" --json
    expect_grep "$name: every row under kms/card" "$T/out" "\"key_id\":\"kms/card\",\"key_version\":1,\"rows\":$ROWS}\\]"
    run "$name: verify" 0 "$KS" migrate verify "${tgt[@]}" "${CTX[@]}"
    ct_tails "$db" >"$T/case.tails"
    expect_same "$name: every row's ciphertext unchanged (nothing lost)" "$T/src.tails" "$T/case.tails"
    no_secrets "$name" "$T/case.out" "$T/case.err"
}

# ---- faults the retries get past ------------------------------------------------------------
fault_case "hang once" 'wrap ok 6\nwrap hang 1\n' 0 1
fault_case "exit once" 'wrap ok 6\nwrap exit 1\n' 0 1
fault_case "exit mid-line once" 'wrap ok 6\nwrap midline 1\n' 0 1
fault_case "slow within the deadline" 'wrap ok 6\nwrap slow:300 3\n' 0 3
fault_case "throttled twice" 'wrap ok 6\nwrap error:throttled 2\n' 0 2
fault_case "a DEK on stderr and in a vendor member" 'wrap ok 6\nwrap leak 3\nunwrap leak 3\n' 0 6

# ---- faults that stop the run (retried ones give up after 1 + retries) -------------------------
fault_case "hang" 'wrap ok 6\nwrap hang *\n' 75 3
fault_case "slower than the deadline" 'wrap ok 6\nwrap slow:3000 *\n' 75 3
fault_case "exit" 'wrap ok 6\nwrap exit *\n' 69 3
fault_case "unavailable" 'wrap ok 6\nwrap error:unavailable *\n' 69 3
fault_case "timeout" 'wrap ok 6\nwrap error:timeout *\n' 75 3
fault_case "throttled" 'wrap ok 6\nwrap error:throttled *\n' 69 3
fault_case "a DEK in an error message" 'wrap ok 6\nwrap message-leak *\n' 69 3
# a line the protocol refuses is an integrity failure of the provider: 78
fault_case "garbage" 'wrap ok 6\nwrap garbage *\n' 78 1
fault_case "an oversized line" 'wrap ok 6\nwrap oversized *\n' 78 1
fault_case "a wrong id" 'wrap ok 6\nwrap wrong-id *\n' 78 1
fault_case "denied" 'wrap ok 6\nwrap error:denied *\n' 77 1
fault_case "revoked" 'wrap ok 6\nwrap error:revoked *\n' 77 1
fault_case "not-found" 'wrap ok 6\nwrap error:not-found *\n' 77 1
fault_case "integrity" 'wrap ok 6\nwrap error:integrity *\n' 78 1
fault_case "invalid" 'wrap ok 6\nwrap error:invalid *\n' 64 1
fault_case "auth-failed on the verify's unwrap" 'unwrap ok 6\nunwrap error:auth-failed *\n' 70 1
fault_case "a duplicate answer" 'wrap ok 6\nwrap duplicate *\n' 0 40

# ---- the rate limit, counted at the plugin ------------------------------------------------------
reg "$T/limited" "rate-limit 10"
cp "$SRC" "$T/rate.db"
rm -f "$KEYSHIFT_FAULT_DIR/used" "$KEYSHIFT_FAULT_DIR/log"
: >"$KEYSHIFT_FAULT_DIR/plan"
run "rewrap at 10 requests/s" 0 "$KS" migrate run --db "$T/rate.db" --table pay --column card --mode rewrap \
    --to-key kms/card:1 "${CTX[@]}" --providers "$T/limited"
worst=$(awk '$3 != "hello" { t[n++] = $1 } END { w = 0; j = 0; for (i = 0; i < n; i++) { while (t[i] - t[j] >= 1e9) j++; if (i - j + 1 > w) w = i - j + 1 } print w }' "$KEYSHIFT_FAULT_DIR/log")
total=$(awk '$3 != "hello"' "$KEYSHIFT_FAULT_DIR/log" | grep -c .)
# [KP-BRIDGE-7]: turns are 1.05 / 10 s apart, so a plugin counting with its
# own clock sees at most 10 + 1 in one second (a request delayed in the
# pipe or the scheduler past the start of that second, the next one not).
if [ "$worst" -le 11 ] && [ "$total" -ge 40 ]; then ok "rate limit: $total requests, at most $worst in any second at the plugin"; else bad "rate limit" "$worst in one second, $total in all"; fi

# ---- kill -9 during a rewrap into the plugin, then resume -----------------------------------------
cp "$SRC" "$T/kill.db"
rm -f "$KEYSHIFT_FAULT_DIR/used" "$KEYSHIFT_FAULT_DIR/log"
printf 'wrap slow:100 *\n' >"$KEYSHIFT_FAULT_DIR/plan"
KT=(--db "$T/kill.db" --table pay --column card)
"$KS" migrate run "${KT[@]}" --mode rewrap --to-key kms/card:1 "${CTX[@]}" --batch-size 4 >"$T/kill.out" 2>"$T/kill.err" &
kpid=$!
sleep 1.5
kill -9 "$kpid" 2>/dev/null
wait "$kpid" 2>/dev/null
done_rows=$(sql "$T/kill.db" "SELECT count(*) FROM pay")
: >"$KEYSHIFT_FAULT_DIR/plan"
# the plugin processes of that run (their pids are in the plugin's log) end
# once keyshift's end of their socket is closed
left=""
for _ in $(seq 1 50); do
    left=""
    for pid in $(awk '{ print $2 }' "$KEYSHIFT_FAULT_DIR/log" | sort -u); do
        kill -0 "$pid" 2>/dev/null && left+=" $pid"
    done
    [ -z "$left" ] && break
    sleep 0.1
done
if [ -z "$left" ]; then ok "kill -9: the plugin exited with keyshift (its input closed)"; else bad "kill -9: plugin processes left" "$left"; fi
run "resume after kill -9" 0 "$KS" migrate run "${KT[@]}" --mode rewrap --to-key kms/card:1 "${CTX[@]}"
run "census after the resume" 0 "$KS" census "${KT[@]}" --json
expect_grep "after kill -9 and resume, every row under kms/card" "$T/out" "\"key_id\":\"kms/card\",\"key_version\":1,\"rows\":$ROWS}\\]"
ct_tails "$T/kill.db" >"$T/kill.tails"
expect_same "after kill -9 and resume: ciphertexts unchanged ($done_rows rows)" "$T/src.tails" "$T/kill.tails"
# every row opens to its plaintext through the plugin
wrong=""
for i in $(seq 1 $ROWS); do
    got=$(unhex "$(sql "$T/kill.db" "SELECT hex(card) FROM pay WHERE id = $i")" |
        "$KS" decrypt --context "pay:$i:card" --purpose card 2>/dev/null)
    [ "$got" = "card-$i-4111" ] || wrong+=" $i"
done
if [ -z "$wrong" ]; then ok "every row decrypts through the plugin to its plaintext"; else bad "rows that do not decrypt" "$wrong"; fi
no_secrets "kill -9" "$T/kill.out" "$T/kill.err"

# ---- a plugin that is not there, or dies at once ------------------------------------------------------
cat >"$T/missing" <<EOF
keyshift-providers 1

provider kms
  type plugin
  command none-such
  serve-prefix kms/
EOF
chmod 600 "$T/missing"
run "a plugin not on PATH" 78 "$KS" providers check --providers "$T/missing"
expect_grep "the message names the program" "$T/err" "keyshift-kms-none-such"
printf 'hello exit *\n' >"$KEYSHIFT_FAULT_DIR/plan"
run "a plugin that exits before its hello" 69 "$KS" providers check
printf 'hello garbage *\n' >"$KEYSHIFT_FAULT_DIR/plan"
run "a plugin whose hello is garbage" 78 "$KS" providers check
expect_grep "the refusal's reason is named" "$T/err" "bad-json"
# A plugin that starts a child (sleep 300) and hangs past its hello's
# deadline: the timeout kills its process group, the child too.
rm -f "$KEYSHIFT_FAULT_DIR/child"
printf 'hello spawn-hang *\n' >"$KEYSHIFT_FAULT_DIR/plan"
run "a plugin that starts a child and hangs: timeout" 75 "$KS" providers check
child=$(cat "$KEYSHIFT_FAULT_DIR/child" 2>/dev/null)
gone=0
for _ in $(seq 1 100); do
    state=$(sed -n 's/^[^)]*) \(.\).*/\1/p' "/proc/$child/stat" 2>/dev/null)
    if [ -n "$child" ] && { [ -z "$state" ] || [ "$state" = Z ]; }; then gone=1; break; fi
    sleep 0.05
done
if [ "$gone" = 1 ]; then ok "the plugin's child died with it"; else
    bad "the plugin's child died with it" "pid ${child:-none} state ${state:-?}"
    [ -n "$child" ] && kill -9 "$child" 2>/dev/null
fi
: >"$KEYSHIFT_FAULT_DIR/plan"

# ---- what a plugin receives [KP-SEC-1] ------------------------------------------------------------------
# A sealed keyring whose passphrase is in DEV_PASS, and a plugin whose
# registry names DEV_PASS and KEYSHIFT_PASSPHRASE: neither reaches it, nor
# PGPASSWORD or DATABASE_URL, which it does not name; AWS_* does, by prefix.
printf 'dev-pass-secret\n' >"$T/dev-pass"
chmod 600 "$T/dev-pass"
run "init a sealed keyring" 0 "$KS" keys init --keyring "$T/sealed" --passphrase-file "$T/dev-pass"
cat >"$T/envreg" <<EOF
keyshift-providers 1

provider sealed
  type local
  keyring $T/sealed
  passphrase-env DEV_PASS
  serve-prefix sealed/

provider kms
  type plugin
  command $FAULT
  env KEYSHIFT_FAULT_DIR
  env KEYSHIFT_KMS_EXAMPLE_KEYS
  env DEV_PASS
  env KEYSHIFT_PASSPHRASE
  env-prefix AWS_
  serve-prefix kms/
EOF
chmod 600 "$T/envreg"
rm -f "$KEYSHIFT_FAULT_DIR/env"
run "the plugin starts with an allow-listed environment" 0 env DEV_PASS=dev-pass-secret \
    KEYSHIFT_PASSPHRASE=kp-secret PGPASSWORD=pg-secret DATABASE_URL=postgres://u:db-secret@db/x \
    AWS_REGION=eu-west-1 "$KS" providers check --providers "$T/envreg"
expect_grep "env: AWS_* passed by env-prefix" "$KEYSHIFT_FAULT_DIR/env" "^AWS_REGION=eu-west-1$"
expect_grep "env: a named variable passed" "$KEYSHIFT_FAULT_DIR/env" "^KEYSHIFT_FAULT_DIR="
if grep -q -e dev-pass-secret -e kp-secret -e pg-secret -e db-secret "$KEYSHIFT_FAULT_DIR/env"; then
    bad "env: no passphrase, PIN or database secret reaches the plugin" "$(grep -e secret "$KEYSHIFT_FAULT_DIR/env")"
else
    ok "env: no passphrase, PIN or database secret reaches the plugin"
fi

cli_finish cli-plugin
