#!/usr/bin/env bash
# tests/cli_migrate_stress_test.sh -- integration stress tests of
# `keyshift migrate run` on real SQLite files with real processes:
#
#   1. crash: a 20,000-row table is encrypted while `kill -9` interrupts
#      the run at 20+ random moments (rollback-journal mode), resuming each
#      time; after every kill the checkpoint must match the data (its
#      `done` equals the envelopes in the table, read in one snapshot).
#      Then the same for a rewrap to a new key version (WAL mode, 10+
#      kills).  At the end: verify, a sample of plaintexts, no plaintext
#      left, ids/tenants/row count unchanged, status and census exact.
#   2. live writer: a sqlite3 writer updates rows (new plaintext, and
#      envelopes made beforehand with `keyshift encrypt`) for the whole
#      duration of a throttled encrypt of 10,000 rows, partly right after
#      the migration's cursor to provoke compare-and-swap races.  Every
#      row the writer touched must hold its last value or the migration's
#      encryption of it; every other row must open to its original.
#   3. lock: the application holds the write lock for ~3 s; the migration
#      waits and completes; with a short --busy-timeout it exits 75,
#      nothing lost, and resumes.
#
# Usage: KEYSHIFT=path/to/keyshift tests/cli_migrate_stress_test.sh
# Takes about a minute, about 70 s under ASan+UBSan on 2 cores (the
# migrations are throttled; most of the time goes to `keyshift decrypt`
# of checked rows and to the writer).
set -u

. "$(dirname "$0")/cli_lib.sh"
unset KEYSHIFT_PASSPHRASE
export KEYSHIFT_KEYRING="$T/keyring"
IN=/dev/null
START=$SECONDS

command -v sqlite3 >/dev/null || { echo "cli_migrate_stress_test: sqlite3 is missing (tools/deps.sh)"; exit 1; }

sql() { sqlite3 "$1" "$2"; }
# make_table DB ROWS JOURNAL_MODE: pay(id, tenant, card) with ~200 bytes
# of random plaintext per row, and a copy of it as DB.orig.
make_table() {
    sqlite3 "$1" >/dev/null <<SQL
PRAGMA journal_mode = $3;
BEGIN;
CREATE TABLE pay (id INTEGER PRIMARY KEY, tenant TEXT NOT NULL, card TEXT);
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < $2)
INSERT INTO pay SELECT i, 'acme', printf('row-%05d-', i) || hex(randomblob(95)) FROM n;
COMMIT;
VACUUM INTO '$1.orig';
SQL
}
# check_sample DB N NAME: N random rows decrypt to their original plaintext.
check_sample() {
    local db=$1 n=$2 name=$3 ids="" i id hx bad_ids="" checked=0
    local max
    max=$(sql "$db" "SELECT max(id) FROM pay")
    for ((i = 0; i < n; i++)); do ids+="$(((RANDOM * 32768 + RANDOM) % max + 1))"$'\n'; done
    ids=$(printf '%s' "$ids" | sort -n -u | tr '\n' ',')
    ids=${ids%,}
    sql "$db.orig" "SELECT id, card FROM pay WHERE id IN ($ids) ORDER BY id" >"$T/sample.orig"
    sql "$db" "SELECT id, hex(card) FROM pay WHERE id IN ($ids) ORDER BY id" >"$T/sample.now"
    exec 3<"$T/sample.orig"
    while IFS='|' read -r id hx; do
        local oid opt
        IFS='|' read -r oid opt <&3
        checked=$((checked + 1))
        if [ "$oid" != "$id" ] || [ "$(open_hex "$hx" "$id" 2>/dev/null)" != "$opt" ]; then bad_ids+=" $id"; fi
    done <"$T/sample.now"
    exec 3<&-
    if [ -z "$bad_ids" ] && [ "$checked" -ge "$((n * 9 / 10))" ]; then
        ok "$name: $checked sampled rows decrypt to their original plaintext"
    else
        bad "$name: sampled rows decrypt to their original plaintext" "$checked checked; wrong:$bad_ids"
    fi
}

run "keys init" 0 "$KS" keys init
run "keys create p/kek" 0 "$KS" keys create p/kek

# ---- 1. crash: kill -9 at random moments ---------------------------------------
D="$T/crash.db"
ROWS=20000
make_table "$D" $ROWS DELETE
TGT=(--db "$D" --table pay --column card)
CTX=(--tenant-column tenant --context 'pay:{id}:card' --purpose card)

# at_target_count MODE: envelopes at the target in the table, and the
# migration's done count, as "envelopes done" (for encrypt: in one read
# transaction).
# A kill can land before the run created its checkpoint table: then
# nothing is done yet.
at_target_count() {
    if [ -z "$(sql "$D" "SELECT 1 FROM sqlite_master WHERE name = 'keyshift_migration'")" ]; then
        echo "$(sql "$D" "SELECT count(*) FROM pay WHERE hex(substr(card, 1, 3)) = '4B5345'") 0"
    elif [ "$1" = encrypt ]; then
        sql "$D" "BEGIN; SELECT (SELECT count(*) FROM pay WHERE hex(substr(card, 1, 3)) = '4B5345'),
                  coalesce((SELECT done FROM keyshift_migration WHERE params LIKE 'mode=encrypt;%'), 0); COMMIT;" | tr '|' ' '
    else
        local env done
        "$KS" census "${TGT[@]}" --json >"$T/census.kill" 2>&1
        env=$(sed -n 's/.*"key_version":2,"rows":\([0-9]*\).*/\1/p' "$T/census.kill")
        done=$(sql "$D" "SELECT coalesce((SELECT done FROM keyshift_migration WHERE params LIKE 'mode=rewrap;%'), 0)")
        echo "${env:-0} $done"
    fi
}

# crash_loop MODE MIN_KILLS NAME: kill -9 runs of MODE until MIN_KILLS
# kills landed while the run was alive; check the checkpoint after each.
crash_loop() {
    local mode=$1 min=$2 name=$3 kills=0 iters=0 finished=0 mismatch="" pid rc s rate pair
    while [ "$kills" -lt "$min" ] && [ "$iters" -lt 300 ]; do
        iters=$((iters + 1))
        if [ $((iters % 4)) = 0 ]; then
            # unthrottled, so pipelined (a batch computed ahead on a second
            # thread while one is written); kill mid-batch more often
            rate=() s=$(printf '0.%02d' $((1 + RANDOM % 5)))
        else
            rate=(--max-rows-per-second 2000) s=$(printf '0.%02d' $((5 + RANDOM % 36))) # 0.05 .. 0.40 s
        fi
        "$KS" migrate run "${TGT[@]}" --mode "$mode" --to-key p/kek "${CTX[@]}" --batch-size 200 \
            "${rate[@]}" >/dev/null 2>"$T/crash.err" &
        pid=$!
        sleep "$s"
        kill -9 "$pid" 2>/dev/null
        { wait "$pid"; } 2>/dev/null # no "Killed" notice
        rc=$?
        if [ "$rc" = 137 ]; then
            kills=$((kills + 1))
        elif [ "$rc" = 0 ]; then
            finished=1
            break
        else
            bad "$name: a killed-and-resumed run failed" "exit $rc: $(head -c 300 "$T/crash.err")"
            return
        fi
        pair=$(at_target_count "$mode")
        set -- $pair
        [ "$1" = "$2" ] || mismatch+=" [kill $kills: $1 envelopes at target, checkpoint done=$2]"
    done
    if [ "$kills" -ge "$min" ]; then ok "$name: $kills kill -9 landed mid-run ($iters runs)"; else bad "$name: $min kills landed" "only $kills (finished=$finished)"; fi
    if [ -z "$mismatch" ]; then ok "$name: after every kill the checkpoint's done matches the rows at the target"; else bad "$name: checkpoint matches the data after each kill" "$mismatch"; fi
    pair=$(at_target_count "$mode")
    echo "       ($name: $pair rows done of $ROWS before the final run)"
}

# check_final MODE VERSION NAME: everything after a complete migration.
check_final() {
    local mode=$1 v=$2 name=$3
    run "$name: status --json" 0 "$KS" migrate status "${TGT[@]}" --json
    sed 's/},{/}\n{/g' "$T/out" | grep "\"params\":\"mode=$mode;" >"$T/status.mine"
    expect_grep "$name: status: state complete" "$T/status.mine" '"state":"complete"'
    local done skipped raced q w
    done=$(json_field "$T/status.mine" done) skipped=$(json_field "$T/status.mine" skipped)
    raced=$(json_field "$T/status.mine" raced) q=$(json_field "$T/status.mine" quarantined)
    w=$(json_field "$T/status.mine" wrong_state)
    if [ "$done" = $ROWS ] && [ "$skipped" = 0 ] && [ "$raced" = 0 ] && [ "$q" = 0 ] && [ "$w" = 0 ]; then
        ok "$name: status: done == rows == $ROWS exactly (no batch counted twice or lost), 0 skipped/raced/quarantined/wrong"
    else
        bad "$name: status counts" "done=$done skipped=$skipped raced=$raced quarantined=$q wrong_state=$w"
    fi
    run "$name: census" 0 "$KS" census "${TGT[@]}" --json
    expect_grep "$name: census: $ROWS envelopes, 0 plaintext, 0 malformed" "$T/out" "^{\"rows\":$ROWS,\"null\":0,\"plaintext\":0,\"envelopes\":$ROWS,\"malformed\":0,"
    expect_grep "$name: census: every envelope at p/kek version $v" "$T/out" "\"classes\":\[{\"version\":2,\"algorithm\":\"xchacha20-poly1305\",\"key_id\":\"p/kek\",\"key_version\":$v,\"rows\":$ROWS}\]"
    sql "$D" "SELECT id, tenant FROM pay ORDER BY id" >"$T/ids.now"
    sql "$D.orig" "SELECT id, tenant FROM pay ORDER BY id" >"$T/ids.orig"
    expect_same "$name: same row count, ids and tenants as before" "$T/ids.now" "$T/ids.orig"
    if [ "$(sql "$D" "SELECT count(*), count(DISTINCT card) FROM pay WHERE card LIKE 'row-%' OR hex(substr(card, 1, 3)) != '4B5345'")" = "0|0" ] &&
        [ "$(sql "$D" "SELECT count(DISTINCT card) FROM pay")" = $ROWS ]; then
        ok "$name: no row holds plaintext; $ROWS distinct envelopes"
    else
        bad "$name: no row holds plaintext" "$(sql "$D" "SELECT count(*) FROM pay WHERE hex(substr(card, 1, 3)) != '4B5345'") non-envelopes"
    fi
    run "$name: verify (every row opens with its context)" 0 "$KS" migrate verify "${TGT[@]}" "${CTX[@]}"
    expect_grep "$name: verify: all $ROWS checked" "$T/out" "$ROWS envelopes checked, 0 failed"
    check_sample "$D" 250 "$name"
}

t0=$SECONDS
crash_loop encrypt 20 "crash/encrypt"
run "crash/encrypt: final run completes" 0 "$KS" migrate run "${TGT[@]}" --mode encrypt --to-key p/kek "${CTX[@]}" --batch-size 200
check_final encrypt 1 "crash/encrypt"
echo "       (crash/encrypt: $((SECONDS - t0)) s)"

t0=$SECONDS
run "keys add-version" 0 "$KS" keys add-version p/kek
run "keys promote 2" 0 "$KS" keys promote p/kek 2
sql "$D" "PRAGMA journal_mode = WAL" >/dev/null
crash_loop rewrap 10 "crash/rewrap"
run "crash/rewrap: final run completes" 0 "$KS" migrate run "${TGT[@]}" --mode rewrap --to-key p/kek "${CTX[@]}" --batch-size 200
check_final rewrap 2 "crash/rewrap"
echo "       (crash/rewrap: $((SECONDS - t0)) s)"

# ---- 2. live writer -----------------------------------------------------------
t0=$SECONDS
L="$T/live.db"
LROWS=10000
make_table "$L" $LROWS WAL
run "keys create live/kek" 0 "$KS" keys create live/kek
LTGT=(--db "$L" --table pay --column card --mode encrypt --to-key live/kek "${CTX[@]}" --batch-size 200)

# Envelopes the writer will store, made beforehand: ENV_ID[k] is the row,
# ENV_HEX[k] the envelope (context pay:ID:card), ENV_PT[k] its plaintext.
ENV_ID=() ENV_HEX=() ENV_PT=()
for ((k = 0; k < 24; k++)); do
    ENV_ID[k]=$((RANDOM % LROWS + 1))
    ENV_PT[k]="env-$k-${ENV_ID[k]}-written-by-the-application"
    ENV_HEX[k]=$(printf '%s' "${ENV_PT[k]}" | "$KS" encrypt --tenant acme --key-id live/kek --purpose card \
        --context "pay:${ENV_ID[k]}:card" | od -An -tx1 | tr -d ' \n')
done
if [ ${#ENV_HEX[23]} -gt 100 ]; then ok "live: 24 envelopes made with keyshift encrypt"; else bad "live: envelopes made"; fi

# The writer: chunks of 8 autocommitted UPDATEs through sqlite3 with a busy
# timeout, half of them just after the migration's cursor; each committed
# write is logged as "ID P PLAINTEXT" or "ID E k" in $T/writes.
writer() {
    local seq=0 cur id k i sqlf log
    : >"$T/writes"
    while [ -e "$T/writing" ]; do
        cur=$(sqlite3 "$L" "SELECT cursor FROM keyshift_migration" 2>/dev/null | tail -n 1)
        case $cur in '' | *[!0-9]*) cur=0 ;; esac
        sqlf=".timeout 10000"$'\n'
        log=""
        for ((i = 0; i < 8; i++)); do
            seq=$((seq + 1))
            if [ $((RANDOM % 2)) = 0 ]; then id=$(((cur + 1 + RANDOM % 300) % LROWS + 1)); else id=$((RANDOM % LROWS + 1)); fi
            if [ $((RANDOM % 5)) = 0 ]; then
                k=$((RANDOM % ${#ENV_ID[@]}))
                sqlf+="UPDATE pay SET card = X'${ENV_HEX[k]}' WHERE id = ${ENV_ID[k]};"$'\n'
                log+="${ENV_ID[k]} E $k"$'\n'
            else
                sqlf+="UPDATE pay SET card = 'w-$id-$seq-new-plaintext-from-the-app' WHERE id = $id;"$'\n'
                log+="$id P w-$id-$seq-new-plaintext-from-the-app"$'\n'
            fi
        done
        if printf '%s' "$sqlf" | sqlite3 -bail "$L" >/dev/null 2>>"$T/writer.err"; then
            printf '%s' "$log" >>"$T/writes"
        else
            echo "writer: a chunk failed" >>"$T/writer.fail"
        fi
        sleep 0.04
    done
}

touch "$T/writing"
writer &
wpid=$!
sleep 0.3
mt0=$SECONDS
"$KS" migrate run "${LTGT[@]}" --max-rows-per-second 2500 --json >"$T/live.json" 2>"$T/live.err"
rc=$?
mdur=$((SECONDS - mt0))
rm -f "$T/writing"
wait "$wpid"
if [ "$rc" = 0 ]; then ok "live: migration with a concurrent writer exits 0 (${mdur} s)"; else bad "live: migration exits 0" "exit $rc: $(head -c 300 "$T/live.err")"; fi
if [ ! -e "$T/writer.fail" ]; then ok "live: every writer chunk committed"; else bad "live: writer chunks committed" "$(head -c 300 "$T/writer.err")"; fi
raced=$(last_field "$T/live.json" raced) passes=$(last_field "$T/live.json" pass)
nwrites=$(grep -c . "$T/writes")
q=$(last_field "$T/live.json" quarantined)
if [ "$q" = 0 ]; then ok "live: nothing quarantined"; else bad "live: nothing quarantined" "quarantined=$q"; fi
echo "       (live: $nwrites writes by the application, raced=$raced, passes=$passes)"
if [ "$nwrites" -ge 100 ]; then ok "live: the writer wrote for the whole run ($nwrites writes)"; else bad "live: writer wrote" "$nwrites writes"; fi
# The rerun of the complete migration is a catch-up pass: it converts what
# the application wrote in plaintext after the last pass went by.
run "live: rerun after the writer stopped (catch-up pass)" 0 "$KS" migrate run "${LTGT[@]}"

# Every touched row holds the writer's last value or its encryption.
awk '{ last[$1] = $0 } END { for (i in last) print last[i] }' "$T/writes" | sort -n >"$T/last"
sql "$L" "SELECT id, hex(card) FROM pay ORDER BY id" >"$T/live.now"
wrong="" left_plain=0 kept_env=0 opened=0 touched=0
declare -A NOW
while IFS='|' read -r id hx; do NOW[$id]=$hx; done <"$T/live.now"
while read -r id kind val; do
    touched=$((touched + 1))
    hx=${NOW[$id]:-}
    if [ "$kind" = E ]; then
        want=${ENV_PT[val]}
        if [ "$hx" = "${ENV_HEX[val]^^}" ]; then kept_env=$((kept_env + 1)); continue; fi
    else
        want=$val
        if [ "$hx" = "$(strhex "$want" | tr a-f A-F)" ]; then left_plain=$((left_plain + 1)); continue; fi
    fi
    case $hx in 4B5345*) ;; *) wrong+=" $id(not-an-envelope)"; continue ;; esac
    if [ "$(open_hex "$hx" "$id" 2>/dev/null)" = "$want" ]; then opened=$((opened + 1)); else wrong+=" $id"; fi
done <"$T/last"
if [ -z "$wrong" ] && [ "$touched" -gt 0 ]; then
    ok "live: all $touched rows the writer touched hold its last envelope ($kept_env) or open to its last value ($opened)"
else
    bad "live: rows the writer touched hold its last value or its encryption" "wrong:${wrong:0:300}"
fi
run "live: census" 0 "$KS" census --db "$L" --table pay --column card --json
if [ "$left_plain" = 0 ]; then ok "live: the catch-up pass left no plaintext"; else bad "live: the catch-up pass left no plaintext" "$left_plain rows"; fi
expect_grep "live: census: all $LROWS rows are envelopes" "$T/out" \
    "^{\"rows\":$LROWS,\"null\":0,\"plaintext\":0,\"envelopes\":$LROWS,\"malformed\":0,"
expect_grep "live: census: every envelope at live/kek version 1" "$T/out" \
    "\"classes\":\[{\"version\":2,\"algorithm\":\"xchacha20-poly1305\",\"key_id\":\"live/kek\",\"key_version\":1,\"rows\":$LROWS}\]"
run "live: verify: every envelope opens" 0 "$KS" migrate verify --db "$L" --table pay --column card "${CTX[@]}"
sql "$L" "SELECT id, tenant FROM pay ORDER BY id" >"$T/ids.now"
sql "$L.orig" "SELECT id, tenant FROM pay ORDER BY id" >"$T/ids.orig"
expect_same "live: same row count, ids and tenants" "$T/ids.now" "$T/ids.orig"
# Untouched rows: every one is an envelope; a sample opens to the original.
cut -d' ' -f1 "$T/last" >"$T/touched.ids"
sql "$L" "SELECT id FROM pay WHERE hex(substr(card, 1, 3)) != '4B5345'" | sort >"$T/plain.ids"
if [ -z "$(comm -23 "$T/plain.ids" <(sort "$T/touched.ids"))" ]; then ok "live: no untouched row left in plaintext"; else bad "live: no untouched row left in plaintext"; fi
bad_ids="" n=0
sql "$L.orig" "SELECT id, card FROM pay" >"$T/live.orig"
declare -A ORIG TOUCHED
while IFS='|' read -r id v; do ORIG[$id]=$v; done <"$T/live.orig"
while read -r id; do TOUCHED[$id]=1; done <"$T/touched.ids"
for ((i = 0; i < 300 && n < 200; i++)); do
    id=$(((RANDOM * 32768 + RANDOM) % LROWS + 1))
    [ -n "${TOUCHED[$id]:-}" ] && continue
    n=$((n + 1))
    [ "$(open_hex "${NOW[$id]}" "$id" 2>/dev/null)" = "${ORIG[$id]}" ] || bad_ids+=" $id"
done
if [ -z "$bad_ids" ] && [ "$n" -ge 150 ]; then ok "live: $n sampled untouched rows open to their original plaintext"; else bad "live: untouched rows open to their original" "$n checked; wrong:$bad_ids"; fi
echo "       (live: $((SECONDS - t0)) s)"

# ---- 3. the application holds the write lock ----------------------------------
t0=$SECONDS
K="$T/lock.db"
ROWS=2000
make_table "$K" $ROWS DELETE
KTGT=(--db "$K" --table pay --column card --mode encrypt --to-key p/kek "${CTX[@]}" --batch-size 200)
# The application's transaction: its COMMIT must wait (busy timeout) for
# readers' shared locks to clear, as any application's would; without the
# timeout a reader of the migration (its count or scan) at that instant
# made the COMMIT fail with "database is locked".
hold_lock() { printf '.timeout 10000\nBEGIN IMMEDIATE;\nUPDATE pay SET tenant = tenant WHERE id = 1;\n.shell sleep %s\nCOMMIT;\n' "$1" | sqlite3 -bail "$K" >/dev/null 2>"$T/lock.err"; }
hold_lock 3 &
lpid=$!
for ((i = 0; i < 100; i++)); do # until the application holds the lock
    sqlite3 "$K" "BEGIN IMMEDIATE; ROLLBACK;" >/dev/null 2>&1 || break
    sleep 0.02
done
run "lock: short --busy-timeout: exit 75" 75 "$KS" migrate run "${KTGT[@]}" --busy-timeout 300
if [ "$(sql "$K.orig" "SELECT hex(card) FROM pay ORDER BY id" | md5sum)" = "$(sqlite3 -cmd '.timeout 10000' "$K" "SELECT hex(card) FROM pay ORDER BY id" | md5sum)" ]; then
    ok "lock: nothing written while locked"; else bad "lock: nothing written while locked"; fi
l0=$(date +%s.%N)
run "lock: the migration waits for the lock and completes" 0 "$KS" migrate run "${KTGT[@]}"
waited=$(awk -v a="$l0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
wait "$lpid"
if [ $? = 0 ]; then ok "lock: the application's transaction committed"; else bad "lock: application transaction" "$(head -c 200 "$T/lock.err")"; fi
echo "       (lock: the migration took $waited s)"
if [ "$(sql "$K" "SELECT count(*) FROM pay WHERE hex(substr(card, 1, 3)) != '4B5345'")" = 0 ]; then ok "lock: every row encrypted"; else bad "lock: every row encrypted"; fi
run "lock: verify" 0 "$KS" migrate verify --db "$K" --table pay --column card "${CTX[@]}"
echo "       (lock: $((SECONDS - t0)) s; total $((SECONDS - START)) s)"

cli_finish cli_migrate_stress
