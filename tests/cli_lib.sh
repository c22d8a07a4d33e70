# tests/cli_lib.sh -- helpers shared by the CLI test scripts (sourced).
#
# Sets KS (the binary under test, from $KEYSHIFT), T (a temporary
# directory removed on exit) and the pass/fail counters; cli_finish NAME
# prints the closing "NAME: N passed, N failed" line and sets the status.

KS=${KEYSHIFT:-build/bin/keyshift}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
pass=0
fail=0

# Write the bytes of a hex string (whitespace ignored) to stdout.
unhex() {
    local h
    h=$(printf '%s' "$*" | tr -d ' \n')
    printf "$(printf '%s' "$h" | sed 's/../\\x&/g')"
}

# Hex of an ASCII string.
strhex() {
    printf '%s' "$1" | od -An -tx1 | tr -d ' \n'
}

# n bytes of one hex byte value, as hex.
rep() {
    local i out=""
    for ((i = 0; i < $2; i++)); do out+=$1; done
    printf '%s' "$out"
}

# ct_tails DB: each row of DB's table pay as "ID|HEX", HEX the last 80 hex
# digits of its card (the tag and the ciphertext's tail, which a rewrap
# must keep byte for byte).
ct_tails() {
    sqlite3 -batch "$1" "SELECT id, substr(hex(card), length(hex(card)) - 79) FROM pay ORDER BY id"
}

# json_field FILE NAME: the first numeric value of "NAME" in FILE.
json_field() { sed -n "s/.*\"$2\":\([0-9]*\).*/\1/p" "$1" | head -1; }
# last_field FILE NAME: the numeric value of "NAME" on the last line of FILE.
last_field() { tail -n 1 "$1" | sed -n "s/.*\"$2\":\([0-9]*\).*/\1/p"; }

# seal_card CONTEXT FORMAT: an envelope of "secret" as hex, under
# payments/kek (tenant acme; format 2 with purpose card).
seal_card() {
    local purpose=()
    [ "$2" = 2 ] && purpose=(--purpose card)
    printf 'secret' | "$KS" encrypt --tenant acme --key-id payments/kek --context "$1" \
        --format "$2" "${purpose[@]}" | od -An -tx1 | tr -d ' \n'
}

# open_hex HEX ID: decrypt envelope HEX as row ID of table pay (context
# pay:ID:card, tenant acme, purpose card).
open_hex() {
    unhex "$1" >"$T/row.kse"
    "$KS" decrypt --context "pay:$2:card" --tenant acme --purpose card <"$T/row.kse"
}

ok() { pass=$((pass + 1)); echo "ok   - $1"; }
bad() { fail=$((fail + 1)); echo "FAIL - $1"; [ -n "${2:-}" ] && printf '       %s\n' "$2"; }

# run NAME EXPECTED_RC CMD... : run CMD with standard input from $IN when
# set (else the caller's), keeping stdout and stderr in $T/out and $T/err.
run() {
    local name=$1 want=$2
    shift 2
    "$@" <"${IN:-/dev/stdin}" >"$T/out" 2>"$T/err"
    local rc=$?
    if [ "$rc" -eq "$want" ]; then ok "$name (exit $rc)"; else bad "$name" "exit $rc, want $want; stderr: $(head -c 300 "$T/err")"; fi
}

# expect_eq NAME FILE EXACT_CONTENT
expect_eq() {
    if [ "$(cat "$2")" = "$3" ]; then ok "$1"; else bad "$1" "got: $(head -c 400 "$2") want: $3"; fi
}
# expect_grep NAME FILE PATTERN
expect_grep() {
    if grep -q -- "$3" "$2"; then ok "$1"; else bad "$1" "no '$3' in: $(head -c 400 "$2")"; fi
}
# expect_empty NAME FILE
expect_empty() {
    if [ ! -s "$2" ]; then ok "$1"; else bad "$1" "not empty: $(head -c 200 "$2" | od -c | head -3)"; fi
}
# expect_same NAME FILE1 FILE2
expect_same() {
    if cmp -s "$2" "$3"; then ok "$1"; else bad "$1" "$2 and $3 differ"; fi
}

# sigint_run ARGS...: start `keyshift migrate run ARGS`, throttled to
# 1000 rows/s in batches of 100, interrupt it with SIGINT after a second
# and check that it pauses (exit 75) saying how to resume; its output is
# left in $T/out and $T/err.
sigint_run() {
    local pid rc
    "$KS" migrate run "$@" --max-rows-per-second 1000 --batch-size 100 >"$T/out" 2>"$T/err" &
    pid=$!
    sleep 1
    kill -INT $pid
    wait $pid
    rc=$?
    if [ $rc = 75 ]; then ok "SIGINT: exit 75"; else bad "SIGINT: exit 75" "exit $rc: $(head -c 300 "$T/err")"; fi
    expect_grep "SIGINT: says how to resume" "$T/err" "run the same command again"
}

# hist_sums_ok WHAT FILE: every latency histogram series of the text FILE
# has a _sum that its buckets allow: 0 with a _count of 0, else above 0,
# at least each latency's bucket's lower bound and at most its le (no
# upper bound once a latency is past the last finite le).
hist_sums_ok() {
    if awk '
        function key(line) { sub(/ [^ ]*$/, "", line)
                             if (!sub(/,le="[^"]*"\}$/, "}", line)) sub(/\{le="[^"]*"\}$/, "", line)
                             if (line !~ /\{/) line = line "{}"
                             sub(/_(bucket|sum|count)\{/, "{", line); return line }
        /^keyshift_(seal|open)_duration_seconds_bucket\{/ {
            k = key($0); le = $0; sub(/.*[{,]le="/, "", le); sub(/".*/, "", le); v = $NF + 0
            n = v - cum[k]; cum[k] = v
            if (le == "+Inf") { if (n > 0) unbounded[k] = 1 }
            else { lo[k] += n * prev[k]; hi[k] += n * (le + 0); prev[k] = le + 0.000000001 }
            next }
        /^keyshift_(seal|open)_duration_seconds_sum[{ ]/ { sum[key($0)] = $NF + 0; seen[key($0)] = 1; next }
        /^keyshift_(seal|open)_duration_seconds_count[{ ]/ { count[key($0)] = $NF + 0; series++; next }
        END {
            if (series == 0) { print "no histogram"; exit 1 }
            for (k in count) {
                if (!(k in seen)) { print "no _sum: " k; exit 1 }
                if (count[k] == 0 && sum[k] != 0) { print "a sum without latencies: " k; exit 1 }
                if (count[k] > 0 && !(sum[k] > 0)) { print "a sum of 0: " k; exit 1 }
                if (sum[k] < lo[k] * 0.999999) { print "below its buckets: " k; exit 1 }
                if (!unbounded[k] && sum[k] > hi[k] * 1.000001) { print "above its buckets: " k; exit 1 }
            }
        }' "$2" >"$T/sums.err" 2>&1; then
        ok "$1"
    else
        bad "$1" "$(cat "$T/sums.err")"
    fi
}

# Print the closing line and return the status.
cli_finish() {
    echo "$1: $pass passed, $fail failed"
    [ "$fail" -eq 0 ]
}
