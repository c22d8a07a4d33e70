#!/usr/bin/env bash
# tests/cli_pkcs11_test.sh -- keys in a real SoftHSM2 token through the
# provider registry (docs/providers.md), from the command line: keys
# create/add-version/promote/set-state/list on the token, encrypt and
# decrypt for every format and algorithm, a wrong PIN (78), a destroyed
# version (77), the move of a live column from the local keyring into the
# token while an application keeps writing, kill -9 during the move, and a
# token that goes away mid-run (the run stops) and comes back (it resumes).
#
# The token lives in this test's temporary directory (SOFTHSM2_CONF), never
# in the system's store.
set -u
. "$(dirname "$0")/cli_lib.sh"

sql() { sqlite3 -batch "$1" "$2"; }
unset KEYSHIFT_KEYRING KEYSHIFT_PASSPHRASE KEYSHIFT_PROVIDERS
MODULE=${KEYSHIFT_PKCS11_MODULE:-/usr/lib/softhsm/libsofthsm2.so}
if ! command -v softhsm2-util >/dev/null || [ ! -e "$MODULE" ]; then
    bad "softhsm2 is installed (tools/deps.sh installs it)"
    cli_finish cli-pkcs11
    exit 1
fi

mkdir -p "$T/tokens"
cat >"$T/softhsm2.conf" <<EOF
directories.tokendir = $T/tokens
objectstore.backend = file
log.level = ERROR
EOF
export SOFTHSM2_CONF="$T/softhsm2.conf"
run "init a token" 0 softhsm2-util --init-token --free --label ks-cli --so-pin 1234 --pin 5678
printf '5678\n' >"$T/pin"
printf '0000\n' >"$T/badpin"
chmod 600 "$T/pin" "$T/badpin"

K="$T/keyring"
run "init the keyring" 0 "$KS" keys init --keyring "$K"
run "create the legacy key" 0 "$KS" keys create legacy/card --keyring "$K"
# reg FILE PINFILE: a registry with the keyring and the token
reg() {
    cat >"$1" <<EOF
keyshift-providers 1

provider legacy
  type local
  keyring $K
  serve-prefix legacy/

provider hsm
  type pkcs11
  module $MODULE
  token-label ks-cli
  pin-file $2
  serve-prefix hsm/
EOF
    chmod 600 "$1"
}
REG="$T/providers"
reg "$REG" "$T/pin"
export KEYSHIFT_PROVIDERS="$REG"

run "providers check: both providers" 0 "$KS" providers check --json
expect_grep "check: the token is ok" "$T/out" '"name":"hsm","type":"pkcs11","status":"ok"'
expect_grep "check: the token's mechanisms" "$T/out" '"mechanisms":\["CKM_AES_GCM","CKM_AES_KEY_GEN"\]'

# ---- keys on the token, as on the keyring --------------------------------------
run "keys create hsm/card" 0 "$KS" keys create hsm/card
run "keys create hsm/card again" 65 "$KS" keys create hsm/card
run "keys add-version hsm/card" 0 "$KS" keys add-version hsm/card
expect_eq "the token's next version is 2" "$T/out" "2"
run "keys list: the token's and the keyring's keys" 0 "$KS" keys list --json
expect_grep "list: hsm/card with two versions" "$T/out" '"key_id":"hsm/card","primary":1,"versions":\[{"version":1,"state":"active","primary":true,"created":""},{"version":2,"state":"active","primary":false'
expect_grep "list: legacy/card" "$T/out" '"key_id":"legacy/card","primary":1'
# a token records no creation time: the manual says so rather than promise one
run "keys --help" 0 "$KS" keys --help
expect_grep "keys --help: a PKCS#11 key has no creation time" "$T/out" 'A key in a PKCS#11 token has no creation time'

# ---- every format and algorithm under the token's key ------------------------------
printf 'card 4111 1111 1111 1111' >"$T/pt"
for fmt in 1 2; do
    for alg in xchacha20-poly1305 aes-256-gcm; do
        extra=()
        [ "$fmt" = 2 ] && extra=(--purpose card)
        IN="$T/pt" run "encrypt v$fmt $alg under hsm/card" 0 "$KS" encrypt --tenant acme --key-id hsm/card \
            --format "$fmt" --algorithm "$alg" --context row:9 "${extra[@]}"
        if [ "$(cat "$T/err")" = "" ] || grep -q unavailable "$T/err"; then :; fi
        cp "$T/out" "$T/env.$fmt.$alg"
        IN="$T/env.$fmt.$alg" run "decrypt v$fmt $alg" 0 "$KS" decrypt --context row:9
        expect_same "v$fmt $alg round trip" "$T/out" "$T/pt"
        IN="$T/env.$fmt.$alg" run "decrypt v$fmt $alg, wrong context" 65 "$KS" decrypt --context row:8
    done
done
if grep -q "$(head -c 12 "$T/pt")" "$T"/env.*; then bad "no plaintext in the envelopes"; else ok "no plaintext in the envelopes"; fi

# ---- rotation on the token ---------------------------------------------------------
run "promote hsm/card 2" 0 "$KS" keys promote hsm/card 2
IN="$T/pt" run "encrypt under the new primary" 0 "$KS" encrypt --tenant acme --key-id hsm/card --context row:9
cp "$T/out" "$T/env.v2primary"
run "inspect: key version 2" 0 "$KS" inspect --json "$T/env.v2primary"
expect_grep "the envelope names version 2" "$T/out" '"key_version":2'
run "set-state hsm/card 1 decrypt-only" 0 "$KS" keys set-state hsm/card 1 decrypt-only
IN="$T/env.2.xchacha20-poly1305" run "a decrypt-only version still opens" 0 "$KS" decrypt --context row:9
IN="$T/pt" run "encrypt under decrypt-only version 1" 77 "$KS" encrypt --tenant acme --key-id hsm/card --key-version 1
run "set-state hsm/card 1 destroyed (forced)" 0 "$KS" keys set-state hsm/card 1 destroyed --force --reason "test"
IN="$T/env.2.xchacha20-poly1305" run "a destroyed version gives 77" 77 "$KS" decrypt --context row:9
expect_empty "nothing written for a destroyed version" "$T/out"
run "keys list shows destroyed" 0 "$KS" keys list
expect_grep "list: version 1 destroyed" "$T/out" "^hsm/card  *1  *destroyed"

# ---- a wrong PIN: 78, one login attempt -----------------------------------------------
reg "$T/badpin.reg" "$T/badpin"
IN="$T/env.v2primary" run "wrong PIN exits 78" 78 "$KS" decrypt --context row:9 --providers "$T/badpin.reg"
expect_grep "wrong PIN: names the provider" "$T/err" "provider hsm"
expect_empty "wrong PIN: nothing on stdout" "$T/out"
IN="$T/env.v2primary" run "the right PIN still works (no lockout)" 0 "$KS" decrypt --context row:9
expect_same "and opens" "$T/out" "$T/pt"

# ---- the move: a live column from the keyring into the token ------------------------------
D="$T/shop.db"
ROWS=300
sql "$D" "PRAGMA journal_mode=WAL; CREATE TABLE pay(id INTEGER PRIMARY KEY, tenant TEXT, card BLOB);" >/dev/null
for i in $(seq 1 $ROWS); do echo "INSERT INTO pay VALUES($i, 'acme', 'card-$i-4111');"; done | sqlite3 -batch "$D"
TGT=(--db "$D" --table pay --column card)
CTX=(--tenant-column tenant --context 'pay:{id}:card' --purpose card)
run "encrypt the column under legacy/card (keyring)" 0 "$KS" migrate run "${TGT[@]}" --mode encrypt --to-key legacy/card "${CTX[@]}"
# Envelopes the application writes meanwhile, under the old key: made beforehand.
W_ID=() W_HEX=() W_PT=()
for ((k = 0; k < 12; k++)); do
    W_ID[k]=$((RANDOM % ROWS + 1))
    W_PT[k]="app-$k-${W_ID[k]}"
    W_HEX[k]=$(printf '%s' "${W_PT[k]}" | "$KS" encrypt --tenant acme --key-id legacy/card --purpose card \
        --context "pay:${W_ID[k]}:card" | od -An -tx1 | tr -d ' \n')
done
writer() {
    : >"$T/writes"
    while [ -e "$T/writing" ]; do
        local k=$((RANDOM % 12))
        if printf '.timeout 10000\nUPDATE pay SET card = X%s WHERE id = %s;\n' "'${W_HEX[k]}'" "${W_ID[k]}" |
            sqlite3 -bail "$D" >/dev/null 2>>"$T/writer.err"; then
            echo "${W_ID[k]} $k" >>"$T/writes"
        else
            echo fail >>"$T/writer.fail"
        fi
        sleep 0.05
    done
}
sql "$D" "SELECT id, hex(card) FROM pay ORDER BY id" >"$T/before"
touch "$T/writing"
writer &
wpid=$!
"$KS" migrate run "${TGT[@]}" --mode rewrap --to-key hsm/card "${CTX[@]}" --batch-size 20 --max-rows-per-second 150 --json >"$T/move.json" 2>"$T/move.err"
rc=$?
rm -f "$T/writing"
wait "$wpid"
if [ "$rc" = 0 ]; then ok "move into the token with a live writer exits 0"; else bad "move exits 0" "exit $rc: $(head -c 300 "$T/move.err")"; fi
if [ ! -e "$T/writer.fail" ] && [ "$(grep -c . "$T/writes")" -ge 10 ]; then ok "the writer kept writing ($(grep -c . "$T/writes") writes)"; else bad "the writer kept writing" "$(head -c 200 "$T/writer.err")"; fi
run "catch-up pass for what the writer wrote meanwhile" 0 "$KS" migrate run "${TGT[@]}" --mode rewrap --to-key hsm/card "${CTX[@]}"
run "census after the move" 0 "$KS" census "${TGT[@]}" --json
expect_grep "census: every row under hsm/card" "$T/out" "\"key_id\":\"hsm/card\",\"key_version\":2,\"rows\":$ROWS}\\]"
run "verify through the registry" 0 "$KS" migrate verify "${TGT[@]}" "${CTX[@]}"
# Every row the writer touched opens to the writer's last value.
awk '{ last[$1] = $2 } END { for (i in last) print i, last[i] }' "$T/writes" >"$T/last"
wrong=""
while read -r id k; do
    hx=$(sql "$D" "SELECT hex(card) FROM pay WHERE id = $id")
    got=$(unhex "$hx" | "$KS" decrypt --context "pay:$id:card" --purpose card 2>/dev/null)
    [ "$got" = "${W_PT[k]}" ] || wrong+=" $id"
done <"$T/last"
if [ -z "$wrong" ]; then ok "every row the writer touched holds its last value (the compare-and-swap held)"; else bad "writer rows" "wrong:$wrong"; fi
# Rows the writer did not touch: nonce and ciphertext unchanged by the move.
sql "$D" "SELECT id, hex(card) FROM pay ORDER BY id" >"$T/after"
cut -d' ' -f1 "$T/last" | sort -n >"$T/touched"
tail80() { awk -F'|' 'NR==FNR { t[$1] = 1; next } !($1 in t) { print $1 "|" substr($2, length($2) - 159) }' "$T/touched" "$1"; }
tail80 "$T/before" >"$T/before.tail"
tail80 "$T/after" >"$T/after.tail"
expect_same "untouched rows: nonce and ciphertext unchanged" "$T/before.tail" "$T/after.tail"

# ---- kill -9 during a rewrap inside the token, then resume ---------------------------------
run "add hsm/card version 3" 0 "$KS" keys add-version hsm/card
run "promote hsm/card 3" 0 "$KS" keys promote hsm/card 3
sql "$D" "SELECT id, hex(card) FROM pay ORDER BY id" >"$T/k.before"
# an explicit version: without one the key's primary is pinned at a
# migration's first run (docs/migration.md), and this is that migration again
"$KS" migrate run "${TGT[@]}" --mode rewrap --to-key hsm/card:3 "${CTX[@]}" --batch-size 10 --max-rows-per-second 100 >/dev/null 2>&1 &
kpid=$!
sleep 1
kill -9 "$kpid" 2>/dev/null
wait "$kpid" 2>/dev/null
run "resume after kill -9" 0 "$KS" migrate run "${TGT[@]}" --mode rewrap --to-key hsm/card:3 "${CTX[@]}"
run "census: every row at version 3" 0 "$KS" census "${TGT[@]}" --json
expect_grep "census after the resume" "$T/out" "\"key_id\":\"hsm/card\",\"key_version\":3,\"rows\":$ROWS}\\]"
run "verify after the resume" 0 "$KS" migrate verify "${TGT[@]}" "${CTX[@]}"
sql "$D" "SELECT id, hex(card) FROM pay ORDER BY id" >"$T/k.after"
awk -F'|' '{ print $1 "|" substr($2, length($2) - 159) }' "$T/k.before" >"$T/k.before.tail"
awk -F'|' '{ print $1 "|" substr($2, length($2) - 159) }' "$T/k.after" >"$T/k.after.tail"
expect_same "kill -9 and resume: nonce and ciphertext unchanged" "$T/k.before.tail" "$T/k.after.tail"

# ---- the token goes away mid-run (69), comes back, the run resumes -------------------------
run "add hsm/card version 4" 0 "$KS" keys add-version hsm/card
run "promote hsm/card 4" 0 "$KS" keys promote hsm/card 4
"$KS" migrate run "${TGT[@]}" --mode rewrap --to-key hsm/card:4 "${CTX[@]}" --batch-size 10 --max-rows-per-second 100 >"$T/gone.out" 2>"$T/gone.err" &
gpid=$!
sleep 1
mv "$T/tokens" "$T/tokens.away"
wait "$gpid"
grc=$?
mv "$T/tokens.away" "$T/tokens"
# SoftHSM2's token is a directory: moved away, lookups find nothing and
# C_GetTokenInfo fails, which the provider reads as the token gone (a
# hardware token pulled out answers CKR_DEVICE_REMOVED; tests/test_pkcs11.c
# injects that): one reconnect, then unavailable, 69 -- never not-found.
if [ "$grc" = 69 ]; then ok "token gone mid-run: the run stops with 69"; else bad "token gone mid-run: exit 69" "exit $grc: $(head -c 300 "$T/gone.err")"; fi
echo "       (token gone: exit $grc; $(tail -c 200 "$T/gone.err" | tr '\n' ' '))"
run "the token is back: the run resumes" 0 "$KS" migrate run "${TGT[@]}" --mode rewrap --to-key hsm/card:4 "${CTX[@]}"
run "verify after the outage" 0 "$KS" migrate verify "${TGT[@]}" "${CTX[@]}"
run "census: every row at version 4" 0 "$KS" census "${TGT[@]}" --json
expect_grep "census after the outage" "$T/out" "\"key_id\":\"hsm/card\",\"key_version\":4,\"rows\":$ROWS}\\]"

cli_finish cli-pkcs11
