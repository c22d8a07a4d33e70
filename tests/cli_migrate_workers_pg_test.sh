#!/usr/bin/env bash
# tests/cli_migrate_workers_pg_test.sh -- end-to-end tests of `keyshift
# migrate run --workers N` and of `migrate status`'s chunks on a
# throw-away PostgreSQL cluster of tests/pg_cluster.sh (stopped and
# removed on any exit, with every process the test started):
#
#   1. usage: --workers out of range, more than one on SQLite (one writer
#      at a time), --lease and --chunk-ids without --workers: exit 64.
#   2. live writers: 4 workers encrypt a table while two other sessions
#      keep updating random rows (half right after a running chunk's
#      cursor) with new plaintext or an envelope made beforehand, each
#      update logged with its value in the same transaction.  Every
#      write's plaintext has a length of its own, so an envelope of any
#      other value than the row's last write has another length: after
#      the catch-up pass every row the writers touched holds their last
#      envelope, or an envelope exactly as long as their last plaintext's
#      (a sample decrypts to it); the untouched rows open to their
#      originals (verify, and a sample); the chunks' counts sum to the
#      checkpoint's.
#   3. kill -9: three processes with 2 workers each on one rewrap, with a
#      2 s lease; one is killed, then all, at random moments, 10 times.
#      After each round the chunks' done equals the rows at the new key
#      version; the last run takes the dead workers' chunks over and
#      completes: done == rows exactly, every nonce and ciphertext
#      unchanged.
#   4. throttling: a throttle query turning true pauses every worker
#      within one batch each (no more rows committed than one batch per
#      worker after it, none for the next 1.5 s, past the lease: the
#      paused workers keep their chunks), status lists the running chunks
#      with owner and lease; false resumes them; the same for `migrate
#      pause` and `resume`; the throttled time is reported.
#   5. SIGINT stops every worker (75) and a rerun completes; a chunk row
#      corrupted through SQL (pass 0) fails the rerun with 74 and status
#      leaves the chunks out, and once fixed the rerun completes; the
#      server stopped mid-run gives 69, and the rerun once it is back
#      completes.
#
# Needs the PostgreSQL server programs (initdb, pg_ctl) and psql.
# Usage: KEYSHIFT=path/to/keyshift tests/cli_migrate_workers_pg_test.sh
# About a minute under ASan+UBSan on 2 cores.
set -u

. "$(dirname "$0")/cli_lib.sh"
. "$(dirname "$0")/cli_pg_lib.sh"
START=$SECONDS

# several processes of several workers each, and the test's own sessions
# (every background process joins PIDS, killed on any exit)
pg_lib_start cli_migrate_workers_pg_test 60

# kse_rows TABLE: rows of TABLE holding an envelope.
kse_rows() { q "SELECT count(*) FROM $1 WHERE substring(card FROM 1 FOR 3) = 'KSE'::bytea"; }
# chunk_sum TABLE FIELD [MODE]: the sum of FIELD over the chunks of
# TABLE's migration (of MODE, when TABLE has had several).
chunk_sum() { q "SELECT coalesce(sum($2), 0) FROM keyshift_chunk WHERE tbl = '$1' AND params LIKE '${3:-}%'"; }
# status_json TABLE: TABLE.card's status (--json) into $T/st.
status_json() { "$KS" migrate status --db "$CI" --table "$1" --column card --json >"$T/st" 2>"$T/st.err"; }
# check_sample TABLE N NAME: N random rows of TABLE decrypt to their original.
check_sample() {
    local i id wrong="" checked=0 max
    max=$(q "SELECT max(id) FROM $1_orig")
    for ((i = 0; i < $2; i++)); do
        id=$(((RANDOM * 32768 + RANDOM) % max + 1))
        [ -n "${TOUCHED[$id]:-}" ] && continue
        checked=$((checked + 1))
        if [ "$(open_hex "$(q "SELECT encode(card, 'hex') FROM $1 WHERE id = $id")" "$id" 2>/dev/null)" != \
             "$(q "SELECT convert_from(card, 'UTF8') FROM $1_orig WHERE id = $id")" ]; then
            wrong+=" $id"
        fi
    done
    if [ -z "$wrong" ] && [ "$checked" -gt 0 ]; then ok "$3: $checked sampled rows decrypt to their original plaintext"
    else bad "$3: sampled rows decrypt to their original plaintext" "wrong:$wrong"; fi
}
# idle_wait: until no keyshift session is left on the server (the killed
# processes' backends have noticed and rolled back).
idle_wait() {
    local i
    for ((i = 0; i < 100; i++)); do
        [ "$(q "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'keyshift'")" = 0 ] && return 0
        sleep 0.1
    done
}
declare -A TOUCHED

run "keys init" 0 "$KS" keys init
run "keys create" 0 "$KS" keys create payments/kek
CTX=(--context 'pay:{id}:card' --purpose card --tenant-column tenant)

# ---- 1. usage ---------------------------------------------------------------------------
run "migrate --help documents --workers" 0 "$KS" migrate --help
expect_grep "--help: --workers" "$T/out" "--workers N"
expect_grep "--help: --lease" "$T/out" "--lease DURATION"
expect_grep "--help: status --chunks" "$T/out" "--chunks"
make_pay u 10
U=(--db "$CI" --table u --column card --mode encrypt --to-key payments/kek "${CTX[@]}")
run "--workers 0: 64" 64 "$KS" migrate run "${U[@]}" --workers 0
run "--workers 65: 64" 64 "$KS" migrate run "${U[@]}" --workers 65
run "--lease without --workers: 64" 64 "$KS" migrate run "${U[@]}" --lease 5s
run "--chunk-ids without --workers: 64" 64 "$KS" migrate run "${U[@]}" --chunk-ids 10
run "--lease not a duration: 64" 64 "$KS" migrate run "${U[@]}" --workers 2 --lease soon
run "--chunks is status's: 64" 64 "$KS" migrate run "${U[@]}" --chunks
sqlite3 "$T/s.db" "CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT); INSERT INTO t VALUES (1, 'x')"
run "SQLite --workers 2: 64" 64 "$KS" migrate run --db "$T/s.db" --table t --column v --mode encrypt \
    --to-key payments/kek --tenant acme --workers 2
expect_grep "SQLite --workers 2: one writer at a time" "$T/err" "one writer at a time"
run "SQLite --workers 1: the single run" 0 "$KS" migrate run --db "$T/s.db" --table t --column v \
    --mode encrypt --to-key payments/kek --tenant acme --workers 1
if [ "$(q "SELECT count(*) FROM u WHERE substring(card FROM 1 FOR 3) = 'KSE'::bytea")" = 0 ]; then
    ok "usage errors wrote nothing"; else bad "usage errors wrote nothing"; fi
mkdir -p "$T/tf"
run "4 workers on 10 rows, --textfile" 0 "$KS" migrate run "${U[@]}" --workers 4 --textfile "$T/tf"
expect_grep "4 workers on 10 rows: summary" "$T/err" "complete: 10 rewritten"
M="$T/tf/keyshift_migrate_u_card.prom"
expect_grep "--textfile with workers: every chunk's rows" "$M" '^keyshift_migrate_rows_total{table="u",column="card",outcome="done"} 10$'
expect_grep "--textfile with workers: the table's rows" "$M" '^keyshift_migrate_target_rows{table="u",column="card"} 10$'
expect_grep "--textfile with workers: ended" "$M" '^keyshift_migrate_running{table="u",column="card"} 0$'
expect_grep "--textfile with workers: complete" "$M" '^keyshift_migrate_complete{table="u",column="card"} 1$'
if ls -A "$T/tf" | grep -q '^\.'; then bad "--textfile with workers: a temporary file was left behind"; else ok "--textfile with workers: renamed into place"; fi

# ---- 2. live writers ----------------------------------------------------------------------
t0=$SECONDS
LROWS=16000
make_pay live $LROWS
q "CREATE TABLE wlast (id bigint PRIMARY KEY, kind text NOT NULL, val text NOT NULL);
   CREATE TABLE wenv (k int PRIMARY KEY, id bigint NOT NULL, env bytea NOT NULL, pt text NOT NULL);
   CREATE TABLE wstop (x int); CREATE SEQUENCE wseq;"
# envelopes the writers store (as an application in write-upgrade would)
for k in 0 1 2 3 4 5; do
    id=$((RANDOM % LROWS + 1)) pt="env-$k-written-by-the-application"
    hx=$(printf '%s' "$pt" | "$KS" encrypt --tenant acme --key-id payments/kek --purpose card \
        --context "pay:$id:card" | od -An -tx1 | tr -d ' \n')
    q "INSERT INTO wenv VALUES ($k, $id, '\\x$hx', '$pt')"
done
# writer N: until wstop has a row, update one random row per transaction
# (half of them just after a running chunk's cursor), logging its value in
# wlast in the same transaction.  A plaintext's length is 200 + a number
# of the shared sequence: no two writes have the same length.
writer() {
    psql "$CI" -qXAt -v ON_ERROR_STOP=1 >/dev/null 2>"$T/writer$1.err" <<SQL
DO \$\$
DECLARE rid bigint; v text; s bigint; e record;
BEGIN
  LOOP
    EXIT WHEN EXISTS (SELECT 1 FROM wstop);
    rid := NULL;
    IF random() < 0.5 THEN
      SELECT c.cursor + 1 + floor(random() * 150)::bigint INTO rid FROM keyshift_chunk c
        WHERE c.tbl = 'live' AND c.state = 'running' AND c.cursor IS NOT NULL ORDER BY random() LIMIT 1;
    END IF;
    IF rid IS NULL OR rid > $LROWS THEN rid := 1 + floor(random() * $LROWS)::bigint; END IF;
    IF random() < 0.1 THEN
      SELECT * INTO e FROM wenv ORDER BY random() LIMIT 1;
      UPDATE live SET card = e.env WHERE id = e.id;
      INSERT INTO wlast VALUES (e.id, 'E', e.k::text)
        ON CONFLICT (id) DO UPDATE SET kind = EXCLUDED.kind, val = EXCLUDED.val;
    ELSE
      s := nextval('wseq');
      v := rpad(format('w%s-%s-%s-', $1, rid, s), (200 + s)::int, 'x');
      UPDATE live SET card = convert_to(v, 'UTF8') WHERE id = rid;
      INSERT INTO wlast VALUES (rid, 'P', v)
        ON CONFLICT (id) DO UPDATE SET kind = EXCLUDED.kind, val = EXCLUDED.val;
    END IF;
    COMMIT;
    PERFORM pg_sleep(0.008);
  END LOOP;
END
\$\$;
SQL
}
LIVE=(--db "$CI" --table live --column card --mode encrypt --to-key payments/kek "${CTX[@]}"
      --workers 4 --chunk-ids 1500 --batch-size 100)
"$KS" migrate run "${LIVE[@]}" --max-rows-per-second 1000 --json >"$T/live.json" 2>"$T/live.err" &
mpid=$!
PIDS+=("$mpid")
for ((i = 0; i < 100; i++)); do # the writers aim at the chunks' cursors
    [ "$(q "SELECT count(*) FROM pg_class WHERE relname = 'keyshift_chunk'")" = 1 ] &&
        [ "$(q "SELECT count(*) FROM keyshift_chunk WHERE tbl = 'live'")" -gt 0 ] && break
    sleep 0.05
done
writer 1 &
w1=$!
writer 2 &
w2=$!
PIDS+=("$w1" "$w2")
wait "$mpid"
rc=$?
q "INSERT INTO wstop VALUES (1)"
wait "$w1"
wr1=$?
wait "$w2"
wr2=$?
if [ "$rc" = 0 ]; then ok "live: 4 workers with two writers: exit 0 ($((SECONDS - t0)) s)"; else bad "live: exit 0" "exit $rc: $(head -c 400 "$T/live.err")"; fi
if [ "$wr1$wr2" = 00 ]; then ok "live: both writers ran to the end"; else bad "live: writers ran" "$(head -c 300 "$T/writer1.err" "$T/writer2.err")"; fi
nw=$(q "SELECT last_value FROM wseq")
nt=$(q "SELECT count(*) FROM wlast")
if [ "$nw" -ge 300 ]; then ok "live: the writers wrote during the whole run ($nw plaintext writes, $nt rows touched)"; else bad "live: writers wrote" "$nw writes"; fi
expect_grep "live: JSON lines name the worker and chunk" "$T/live.json" '^{"batch":1,"worker":[0-9],"chunk":[0-9]*,'
expect_grep "live: JSON summary" "$T/live.json" '^{"result":"complete","error":"ok","exit":0,.*"workers":4,'
expect_grep "live: JSON summary: this run's counts, then every host's and run's" "$T/live.json" '^{"result":"complete",.*"migration":{"done":[0-9]*,"skipped":[0-9]*,"raced":[0-9]*,"quarantined":[0-9]*,"wrong_state":[0-9]*},"workers":4,'
status_json live
for f in done skipped raced quarantined wrong_state; do
    a=$(json_field "$T/st" "$f") b=$(chunk_sum live "$f")
    if [ "$a" = "$b" ]; then ok "live: the checkpoint's $f ($a) is the chunks' sum"; else bad "live: checkpoint $f = chunks' sum" "$a vs $b"; fi
done
# every row looked at; a row done twice only after the writers made it
# plaintext again behind the chunk's pass (then a later pass does it again)
done1=$(json_field "$T/st" done) skip1=$(json_field "$T/st" skipped) raced1=$(json_field "$T/st" raced)
if [ $((done1 + skip1 + raced1)) -ge $LROWS ] && [ "$done1" -le $((LROWS + nw)) ]; then
    ok "live: counts add up (done $done1 + at-target $skip1 + raced $raced1 >= $LROWS rows; done <= rows + $nw plaintext writes)"
else bad "live: counts add up" "done=$done1 skipped=$skip1 raced=$raced1 rows=$LROWS writes=$nw"; fi
if grep -q '"pass":[2-9]' "$T/live.json" || [ "$raced1" = 0 ]; then ok "live: raced rows redone in a later pass of their chunk (raced=$raced1)"; else bad "live: raced rows redone"; fi
run "live: rerun: the catch-up pass" 0 "$KS" migrate run "${LIVE[@]}"
run "live: second rerun: nothing left" 0 "$KS" migrate run "${LIVE[@]}" --json
expect_grep "live: the catch-up pass converged" "$T/out" '"result":"complete".*"done":'
if [ "$(kse_rows live)" = $LROWS ]; then ok "live: every row is an envelope"; else bad "live: every row is an envelope" "$(kse_rows live) of $LROWS"; fi
# every touched row: the writers' last envelope, or an envelope exactly as
# long as one of their last plaintext (the length tells every write apart)
q "SELECT id FROM wlast" >"$T/touched"
while read -r id; do TOUCHED[$id]=1; done <"$T/touched"
pid1=$(q "SELECT id FROM wlast WHERE kind = 'P' ORDER BY id LIMIT 1")
want1=$(q "SELECT val FROM wlast WHERE id = $pid1")
if [ "$(open_hex "$(q "SELECT encode(card, 'hex') FROM live WHERE id = $pid1")" "$pid1")" = "$want1" ]; then
    ok "live: row $pid1 opens to the writers' last value"; else bad "live: row $pid1 opens to the writers' last value"; fi
over=$(q "SELECT octet_length(l.card) - octet_length(w.val) FROM live l JOIN wlast w USING (id) WHERE w.id = $pid1")
wrong=$(q "SELECT count(*) FROM live l JOIN wlast w USING (id) LEFT JOIN wenv e ON w.kind = 'E' AND e.k::text = w.val
           WHERE CASE WHEN w.kind = 'E' THEN l.card IS DISTINCT FROM e.env
                      ELSE octet_length(l.card) - octet_length(w.val) <> $over END")
if [ "$wrong" = 0 ]; then ok "live: zero lost writer updates: all $nt touched rows hold the last write (its envelope, or one of its length)"
else bad "live: zero lost writer updates" "$wrong of $nt rows hold another value: $(q "SELECT w.id, w.kind, octet_length(l.card), octet_length(w.val) FROM live l JOIN wlast w USING (id) LIMIT 3")"; fi
sample=$(q "SELECT id FROM wlast WHERE kind = 'P' ORDER BY random() LIMIT 8")
wrong=""
for id in $sample; do
    [ "$(open_hex "$(q "SELECT encode(card, 'hex') FROM live WHERE id = $id")" "$id" 2>/dev/null)" = \
      "$(q "SELECT val FROM wlast WHERE id = $id")" ] || wrong+=" $id"
done
if [ -z "$wrong" ]; then ok "live: 8 sampled touched rows decrypt to the writers' last value"; else bad "live: touched rows decrypt" "wrong:$wrong"; fi
run "live: verify: every envelope opens" 0 "$KS" migrate verify --db "$CI" --table live --column card "${CTX[@]}"
check_sample live 8 "live (untouched)"
echo "       (live: $((SECONDS - t0)) s)"

# ---- 3. kill -9 ---------------------------------------------------------------------------
t0=$SECONDS
KROWS=24000
make_pay kil $KROWS
KIL=(--db "$CI" --table kil --column card "${CTX[@]}")
run "kill: encrypt with 4 workers" 0 "$KS" migrate run "${KIL[@]}" --mode encrypt --to-key payments/kek --workers 4
run "add-version" 0 "$KS" keys add-version payments/kek
run "promote 2" 0 "$KS" keys promote payments/kek 2
# the nonce's offset in these envelopes (their header is the same length
# in every row), from one row's inspect; then every row's nonce and
# ciphertext (with its tag: the rest of the envelope after the purpose
# and commitment) as a digest
hx=$(q "SELECT encode(card, 'hex') FROM kil WHERE id = 1")
unhex "$hx" >"$T/one.kse"
nonce=$("$KS" inspect --json "$T/one.kse" | sed -n 's/.*"nonce":"\([0-9a-f]*\)".*/\1/p')
ctlen=$("$KS" inspect --json "$T/one.kse" | sed -n 's/.*"ciphertext_len":\([0-9]*\).*/\1/p')
pre=${hx%%"$nonce"*}
noff=$((${#pre} / 2 + 1))
PAYLOAD="SELECT md5(string_agg(encode(substring(card FROM $noff FOR 24), 'hex') || encode(substring(card FROM octet_length(card) - $ctlen + 1), 'hex'), ',' ORDER BY id)) FROM kil"
payload=$(q "$PAYLOAD")
if [ -n "$nonce" ] && [ "$noff" -gt 1 ] && [ "${#payload}" = 32 ]; then ok "kill: nonces and ciphertexts digested (nonce at byte $noff)"; else bad "kill: payload digest" "nonce=$nonce off=$noff"; fi
RW=("${KIL[@]}" --mode rewrap --to-key payments/kek --lease 2s --batch-size 100 --chunk-ids 1500)
# at_v2: envelopes of kil under payments/kek version 2 (census)
at_v2() {
    "$KS" census --db "$CI" --table kil --column card --json >"$T/census" 2>&1
    local n
    n=$(sed -n 's/.*"key_version":2,"rows":\([0-9]*\).*/\1/p' "$T/census")
    echo "${n:-0}"
}
mismatch="" kills=0
for ((round = 1; round <= 10; round++)); do
    kp=()
    for n in 1 2 3; do
        "$KS" migrate run "${RW[@]}" --workers 2 --max-rows-per-second 300 >/dev/null 2>"$T/kill$n.err" &
        kp+=($!)
        PIDS+=($!)
    done
    sleep "0.$((3 + RANDOM % 6))"
    victim=${kp[RANDOM % 3]}
    kill -9 "$victim" 2>/dev/null && kills=$((kills + 1))
    { wait "$victim"; } 2>/dev/null # no "Killed" notice
    sleep "0.$((2 + RANDOM % 5))"
    for p in "${kp[@]}"; do
        [ "$p" != "$victim" ] && kill -9 "$p" 2>/dev/null && kills=$((kills + 1))
    done
    for p in "${kp[@]}"; do [ "$p" != "$victim" ] && { wait "$p"; } 2>/dev/null; done
    idle_wait
    a=$(at_v2) b=$(chunk_sum kil done mode=rewrap)
    [ "$a" = "$b" ] || mismatch+=" [round $round: $a rows at version 2, chunks' done $b]"
done
if [ "$kills" -ge 20 ]; then ok "kill: $kills processes killed -9 mid-run in 10 rounds"; else bad "kill: kills landed" "$kills"; fi
if [ -z "$mismatch" ]; then ok "kill: after every round the chunks' done matches the rows at the new version ($b so far)"
else bad "kill: chunks' done matches the data" "$mismatch"; fi
expired=$(q "SELECT count(*) FROM keyshift_chunk WHERE tbl = 'kil' AND state <> 'complete' AND owner IS NOT NULL")
run "kill: status lists the dead workers' chunks" 0 "$KS" migrate status --db "$CI" --table kil --column card
expect_grep "kill: status: a chunks line" "$T/out" "^chunks  *[0-9]*: [0-9]* complete"
run "kill: the last run takes the chunks over and completes" 0 "$KS" migrate run "${RW[@]}" --workers 4 --json
takeovers=$(last_field "$T/out" takeovers)
if [ "${takeovers:-0}" -ge 1 ]; then ok "kill: $takeovers chunks taken over from a dead worker's cursor ($expired leased by the dead)"; else bad "kill: chunks taken over" "$(tail -1 "$T/out")"; fi
status_json kil
expect_grep "kill: status: complete" "$T/st" '"state":"complete"'
d=$(json_field "$T/st" done)
if [ "$d" = $KROWS ] && [ "$(chunk_sum kil done mode=rewrap)" = $KROWS ]; then ok "kill: done == $KROWS exactly: no row done twice, none skipped"; else bad "kill: done == rows" "done=$d chunks=$(chunk_sum kil done mode=rewrap)"; fi
if [ "$(at_v2)" = $KROWS ]; then ok "kill: every row at version 2"; else bad "kill: every row at version 2" "$(head -c 300 "$T/census")"; fi
if [ "$(q "$PAYLOAD")" = "$payload" ]; then ok "kill: every nonce and ciphertext unchanged by the rewrap"; else bad "kill: nonces and ciphertexts unchanged"; fi
run "kill: status --json --chunks lists every chunk" 0 "$KS" migrate status --db "$CI" --table kil --column card --json --chunks
nch=$(q "SELECT count(*) FROM keyshift_chunk WHERE tbl = 'kil'") # the encrypt's and the rewrap's
if [ "$(grep -o '"chunk":[0-9]*' "$T/out" | wc -l)" = "$nch" ]; then ok "kill: --chunks lists all $nch chunks"; else bad "kill: --chunks lists all chunks" "$(head -c 300 "$T/out")"; fi
check_sample kil 6 "kill"
echo "       (kill: $((SECONDS - t0)) s)"

# ---- 4. throttling --------------------------------------------------------------------------
t0=$SECONDS
# paused_check TABLE NAME: after the pause began (the caller just set it):
# at most one batch (50 rows) per worker afterwards, then nothing for 1.5 s
paused_check() {
    local c1 c2 c3
    c1=$(kse_rows "$1")
    sleep 1
    c2=$(kse_rows "$1")
    sleep 1.5
    c3=$(kse_rows "$1")
    if [ $((c2 - c1)) -le 200 ] && [ "$c2" = "$c3" ] && [ "$c3" -lt 8000 ]; then
        ok "$2: every worker paused within one batch ($c1, $c2, $c3 rows)"
    else
        bad "$2: every worker paused within one batch" "$c1 then $c2 then $c3 rows"
    fi
}
make_pay thr 8000
q "CREATE TABLE throttle_flag (busy boolean NOT NULL); INSERT INTO throttle_flag VALUES (false)"
THR=(--db "$CI" --table thr --column card --mode encrypt --to-key payments/kek "${CTX[@]}" --workers 4
     --batch-size 50 --chunk-ids 500 --lease 1s --max-rows-per-second 400)
"$KS" migrate run "${THR[@]}" --throttle-query "SELECT busy FROM throttle_flag" --json >"$T/thr.json" 2>"$T/thr.err" &
tpid=$!
PIDS+=("$tpid")
sleep 0.8
q "UPDATE throttle_flag SET busy = true"
paused_check thr "throttle query true"
run "throttle: status while paused" 0 "$KS" migrate status --db "$CI" --table thr --column card
expect_grep "throttle: status: running chunks with owner and lease" "$T/out" "^  chunk [0-9]* .* owner .* lease until "
status_json thr
r=$(sed -n 's/.*"running":\([0-9]*\).*/\1/p' "$T/st") e=$(sed -n 's/.*"expired":\([0-9]*\).*/\1/p' "$T/st")
if [ "${r:-0}" -ge 1 ] && [ "$e" = 0 ]; then ok "throttle: paused workers keep their chunks past the 1 s lease ($r running, 0 expired)"; else bad "throttle: paused workers keep their leases" "$(head -c 400 "$T/st")"; fi
q "UPDATE throttle_flag SET busy = false"
wait "$tpid"
rc=$?
if [ $rc = 0 ]; then ok "throttle query false: every worker resumes, the run completes"; else bad "throttle: the run completes" "exit $rc: $(head -c 300 "$T/thr.err")"; fi
expect_grep "throttle: a JSON line says throttled" "$T/thr.json" '"throttled":true,"reason":"the throttle query returned true"'
thr_s=$(grep '"result"' "$T/thr.json" | sed -n 's/.*"throttled_s":\([0-9.]*\).*/\1/p')
if awk -v t="${thr_s:-0}" 'BEGIN { exit !(t >= 2.0) }'; then ok "throttle: the summary counts the time throttled (${thr_s} s)"; else bad "throttle: throttled_s >= 2" "$(tail -1 "$T/thr.json")"; fi
if [ "$(kse_rows thr)" = 8000 ]; then ok "throttle: every row converted"; else bad "throttle: every row converted"; fi

make_pay pau 8000
PAU=(--db "$CI" --table pau --column card)
"$KS" migrate run "${PAU[@]}" --mode encrypt --to-key payments/kek "${CTX[@]}" --workers 4 --batch-size 50 \
    --chunk-ids 500 --lease 1s --max-rows-per-second 400 >"$T/pau.out" 2>"$T/pau.err" &
ppid=$!
PIDS+=("$ppid")
sleep 0.8
run "pause: a running migration with workers" 0 "$KS" migrate pause "${PAU[@]}" --reason "peak hour"
paused_check pau "pause"
run "resume" 0 "$KS" migrate resume "${PAU[@]}"
wait "$ppid"
rc=$?
if [ $rc = 0 ]; then ok "resume: every worker resumes, the run completes"; else bad "resume: the run completes" "exit $rc: $(head -c 300 "$T/pau.err")"; fi
expect_grep "pause: the run says why it waits" "$T/pau.err" "throttled: paused by keyshift migrate pause (peak hour)"
expect_grep "pause: the summary counts the pause" "$T/pau.err" "throttled .* s in 1 pauses"
expect_grep "pause: the summary names the workers' share" "$T/pau.err" "workers: 8000 rows in"
if [ "$(kse_rows pau)" = 8000 ]; then ok "pause: every row converted after resume"; else bad "pause: every row converted"; fi
echo "       (throttle: $((SECONDS - t0)) s)"

# ---- 5. SIGINT; the server gone ------------------------------------------------------------
t0=$SECONDS
# interrupt TABLE WANT NAME ACTION: encrypt a new 8000-row TABLE with 4
# workers (throttled), eval ACTION a second into the run ($pid is the
# run's) and check that it exits WANT; its output in $T/out and $T/err.
# IRUN holds the run's arguments, for the rerun.
interrupt() {
    local pid rc
    make_pay "$1" 8000
    IRUN=(--db "$CI" --table "$1" --column card --mode encrypt --to-key payments/kek "${CTX[@]}"
          --workers 4 --batch-size 50 --chunk-ids 500 --lease 2s)
    "$KS" migrate run "${IRUN[@]}" --max-rows-per-second 300 >"$T/out" 2>"$T/err" &
    pid=$!
    PIDS+=("$pid")
    sleep 1
    eval "$4"
    wait "$pid"
    rc=$?
    if [ $rc = "$2" ]; then ok "$3: exit $2"; else bad "$3: exit $2" "exit $rc: $(head -c 300 "$T/err")"; fi
}
# rerun_exact TABLE NAME: the same run again completes, every row done once.
rerun_exact() {
    run "$2: the rerun completes" 0 "$KS" migrate run "${IRUN[@]}"
    if [ "$(chunk_sum "$1" done)" = 8000 ] && [ "$(kse_rows "$1")" = 8000 ]; then ok "$2: done == 8000 exactly"
    else bad "$2: done == 8000" "$(chunk_sum "$1" done)"; fi
}
interrupt sig 75 "SIGINT: every worker stops" 'kill -INT $pid'
expect_grep "SIGINT: says how to resume" "$T/err" "run the same command again"
left=$(q "SELECT count(*) FROM keyshift_chunk WHERE tbl = 'sig' AND owner IS NOT NULL")
if [ "$left" = 0 ]; then ok "SIGINT: every chunk given up (no owner left)"; else bad "SIGINT: chunks given up" "$left owned"; fi
if [ "$(chunk_sum sig done)" = "$(kse_rows sig)" ]; then ok "SIGINT: the chunks' done matches the data"; else bad "SIGINT: chunks match the data"; fi
rerun_exact sig "SIGINT"

# a chunk row corrupted through SQL: the workers refuse it (store error,
# 74) instead of reading some value; status leaves the chunks out; fixed,
# the rerun completes
interrupt bad 75 "corrupt chunk: the first run stops on SIGINT" 'kill -INT $pid'
q "UPDATE keyshift_chunk SET pass = 0 WHERE tbl = 'bad' AND state <> 'complete'" >/dev/null
run "corrupt chunk: the rerun fails with a store error" 74 "$KS" migrate run "${IRUN[@]}"
if grep -q "AddressSanitizer\|runtime error" "$T/err"; then bad "corrupt chunk: no sanitizer report"; else ok "corrupt chunk: no sanitizer report"; fi
run "corrupt chunk: status still answers" 0 "$KS" migrate status --db "$CI" --table bad --column card
if grep -q "^chunks " "$T/out"; then bad "corrupt chunk: status lists no malformed chunks"; else ok "corrupt chunk: status lists no malformed chunks"; fi
q "UPDATE keyshift_chunk SET pass = 1, owner = NULL, lease_until = NULL, state = 'paused' WHERE tbl = 'bad' AND pass = 0" >/dev/null
rerun_exact bad "corrupt chunk fixed"

interrupt gone 69 "server stopped mid-run" '"$CLUSTER" down "$PGD" || bad "cluster down"'
expect_grep "server stopped: says to rerun once it is back" "$T/err" "database went away.*run the same command again"
if grep -q "AddressSanitizer\|runtime error" "$T/err"; then bad "server stopped: no sanitizer report"; else ok "server stopped: no sanitizer report"; fi
"$CLUSTER" up "$PGD" || bad "cluster up"
rerun_exact gone "server back (the chunks' leases expire first)"
echo "       (signals and the server gone: $((SECONDS - t0)) s; total $((SECONDS - START)) s)"

cli_finish cli_migrate_workers_pg_test
