#!/usr/bin/env bash
# tests/cli_kms_aws_test.sh -- keys in AWS KMS from the command line, as the
# README's "Keys in AWS KMS" tells a user: the provider registry runs
# keyshift-kms-aws (found on PATH, `command aws`), against moto_server.
#
#   - a round trip: encrypt and decrypt under a KMS key;
#   - a column encrypted into KMS, then rotated to a second KMS key (a new
#     keyshift key version) and rewrapped, verified, every row decrypting;
#   - the old version marked decrypt-only: still opens, refuses to wrap;
#   - a wrong encryption context (another purpose in the wrap AAD) and a
#     wrong key (the version mapped to another KMS key) are refused;
#   - kill -9 of keyshift during a rewrap into KMS, then resume, nothing
#     lost;
#   - no credentials: providers check exits 78 naming every source tried;
#     STS unreachable for web identity: 69; web identity through moto: ok;
#   - staging a version (decrypt-only first): keys add-version and promote
#     refused for a plugin key, keys list showing the registry's versions;
#   - no plaintext and no AWS secret in any output.
set -u
. "$(dirname "$0")/cli_lib.sh"
. "$(dirname "$0")/kms_aws_lib.sh"

sql() { sqlite3 -batch "$1" "$2"; }
unset KEYSHIFT_KEYRING KEYSHIFT_PASSPHRASE KEYSHIFT_PROVIDERS
PLUG=${KMS_AWS_PLUGIN:-build/san/bin/keyshift-kms-aws}
if [ ! -x "$PLUG" ]; then
    bad "the plugin $PLUG is built (make kms-aws-test builds it)"
    cli_finish cli-kms-aws
    exit 1
fi
kms_aws_start cli-kms-aws || exit 1
# the plugin is found on PATH by its name, as an installed one would be
mkdir -p "$T/bin"
cp "$PLUG" "$T/bin/keyshift-kms-aws"
export PATH="$T/bin:$PATH"

arn_of() { boto "print(k.create_key(Description='$1')['KeyMetadata']['Arn'])"; }
A=$(arn_of "keyshift app/card v1")
B=$(arn_of "keyshift app/card v2")
C=$(arn_of "keyshift app/card v3")
if [ -n "$A" ] && [ -n "$B" ] && [ -n "$C" ]; then ok "three KMS keys"; else bad "three KMS keys"; fi

# reg FILE ARG...: the registry, one provider `aws` serving app/
reg() {
    local f=$1
    shift
    {
        printf 'keyshift-providers 1\n\nprovider aws\n  type plugin\n  command aws\n'
        printf '  env-prefix AWS_\n' # [KP-SEC-1]: the credentials and endpoint reach the plugin
        local a
        for a in "$@"; do printf '  arg %s\n' "$a"; done
        printf '  serve-prefix app/\n'
    } >"$f"
    chmod 600 "$f"
}
REG="$T/providers"
reg "$REG" "--key=app/card,1,$A"
export KEYSHIFT_PROVIDERS="$REG"
run "providers check: the plugin greets" 0 "$KS" providers check
expect_grep "check names keyshift-kms-aws" "$T/out" "keyshift-kms-aws"

# ---- no credentials: a configuration error naming every source (78) -----------------------
run "providers check without credentials: a configuration error" 78 env -u AWS_ACCESS_KEY_ID \
    -u AWS_SECRET_ACCESS_KEY AWS_EC2_METADATA_DISABLED=true "$KS" providers check
expect_grep "... the plugin names every source it tried and why" "$T/err" \
    "no AWS credentials (env: no key id; web identity: no token file; profile default: not found; container: no URI; IMDS: disabled)"
printf 'eyJhbGciOiJSUzI1NiJ9.e30.c2ln\n' >"$T/web.token"
run "web identity with STS unreachable: unavailable, as an unreachable KMS is" 69 env -u AWS_ACCESS_KEY_ID \
    -u AWS_SECRET_ACCESS_KEY AWS_WEB_IDENTITY_TOKEN_FILE="$T/web.token" \
    AWS_ROLE_ARN=arn:aws:iam::123456789012:role/app AWS_ENDPOINT_URL_STS=http://127.0.0.1:1 "$KS" providers check
expect_grep "... saying which call failed, unredacted" "$T/err" "the plugin says: STS web identity at http://127.0.0.1:1/"
run "web identity through moto's STS: ok" 0 env -u AWS_ACCESS_KEY_ID -u AWS_SECRET_ACCESS_KEY \
    AWS_WEB_IDENTITY_TOKEN_FILE="$T/web.token" AWS_ROLE_ARN=arn:aws:iam::123456789012:role/app \
    AWS_ENDPOINT_URL_STS="$AWS_ENDPOINT_URL_KMS" "$KS" providers check

# ---- a round trip -------------------------------------------------------------------------
printf 'card 4111 1111 1111 1111' >"$T/pt"
IN="$T/pt" run "encrypt under app/card (KMS key A)" 0 "$KS" encrypt --tenant acme --key-id app/card --purpose card \
    --context row:1
cp "$T/out" "$T/env1"
IN="$T/env1" run "decrypt through KMS" 0 "$KS" decrypt --context row:1 --purpose card
expect_same "round trip" "$T/out" "$T/pt"
run "inspect: key version 1" 0 "$KS" inspect --json "$T/env1"
expect_grep "the envelope names app/card version 1" "$T/out" '"key_id":"app/card","key_version":1'

# ---- a wrong encryption context, a wrong key ----------------------------------------------------
IN="$T/env1" run "another purpose: KMS refuses the context (65)" 65 "$KS" decrypt --context row:1 --purpose other
expect_empty "nothing written for a wrong context" "$T/out"
reg "$T/wrongkey" "--key=app/card,1,$B"
IN="$T/env1" "$KS" decrypt --context row:1 --purpose card --providers "$T/wrongkey" >"$T/out" 2>"$T/err"
rc=$?
# real AWS: IncorrectKeyException (auth-failed, 65); moto: AccessDeniedException (denied, 77)
if [ "$rc" = 65 ] || [ "$rc" = 77 ]; then ok "the version mapped to another KMS key is refused (exit $rc)"; else bad "wrong key refused" "exit $rc: $(head -c 300 "$T/err")"; fi
expect_empty "nothing written for a wrong key" "$T/out"

# ---- a column into KMS, then a rotation ---------------------------------------------------------
D="$T/shop.db"
ROWS=30
sql "$D" "PRAGMA journal_mode=WAL; CREATE TABLE pay(id INTEGER PRIMARY KEY, tenant TEXT, card BLOB);" >/dev/null
for i in $(seq 1 $ROWS); do echo "INSERT INTO pay VALUES($i, 'acme', 'card-$i-4111');"; done | sqlite3 -batch "$D"
TGT=(--db "$D" --table pay --column card)
CTX=(--tenant-column tenant --context 'pay:{id}:card' --purpose card)
run "encrypt the column into KMS" 0 "$KS" migrate run "${TGT[@]}" --mode encrypt --to-key app/card "${CTX[@]}" --json
cat "$T/out" "$T/err" >"$T/all.out"
run "census: every row under app/card v1" 0 "$KS" census "${TGT[@]}" --json
expect_grep "census v1" "$T/out" "\"key_id\":\"app/card\",\"key_version\":1,\"rows\":$ROWS}\\]"

reg "$REG" "--key=app/card,1,$A" "--key=app/card,2,$B"
run "keys create is refused: KMS keys are made in AWS, not by keyshift" 77 "$KS" keys create app/other
IN="$T/pt" run "a new envelope goes to the new primary, version 2" 0 "$KS" encrypt --tenant acme --key-id app/card \
    --purpose card --context row:2
cp "$T/out" "$T/env2"
run "inspect: key version 2" 0 "$KS" inspect --json "$T/env2"
expect_grep "the new primary is version 2" "$T/out" '"key_version":2'
run "rewrap the column to version 2 (KMS key B)" 0 "$KS" migrate run "${TGT[@]}" --mode rewrap --to-key app/card:2 \
    "${CTX[@]}" --json
cat "$T/out" "$T/err" >>"$T/all.out"
run "census: every row under app/card v2" 0 "$KS" census "${TGT[@]}" --json
expect_grep "census v2" "$T/out" "\"key_id\":\"app/card\",\"key_version\":2,\"rows\":$ROWS}\\]"
run "verify through KMS" 0 "$KS" migrate verify "${TGT[@]}" "${CTX[@]}"

# the old version retired to decrypt-only: opens, never wraps
reg "$REG" "--key=app/card,1,$A,decrypt-only" "--key=app/card,2,$B"
IN="$T/env1" run "a decrypt-only version still opens" 0 "$KS" decrypt --context row:1 --purpose card
expect_same "and gives the plaintext" "$T/out" "$T/pt"
IN="$T/pt" run "a decrypt-only version does not wrap (77)" 77 "$KS" encrypt --tenant acme --key-id app/card \
    --key-version 1 --purpose card --context row:3

# ---- staging version 3: decrypt-only until every reader has it, then primary ---------------
run "keys add-version on a plugin key is refused: its versions are in the registry (64)" 64 \
    "$KS" keys add-version app/card
expect_grep "... saying how to stage one there" "$T/err" "add 'arg --key=app/card,N+1,KMSKEY,decrypt-only'"
run "keys promote on a plugin key is refused the same way (64)" 64 "$KS" keys promote app/card 2
reg "$REG" "--key=app/card,1,$A,decrypt-only" "--key=app/card,2,$B" "--key=app/card,3,$C,decrypt-only"
IN="$T/pt" run "staged: a new envelope still goes to version 2" 0 "$KS" encrypt --tenant acme --key-id app/card \
    --purpose card --context row:4
cp "$T/out" "$T/env4"
run "inspect the staged-time envelope" 0 "$KS" inspect --json "$T/env4"
cp "$T/out" "$T/insp"
expect_grep "... the primary stays version 2 while 3 is staged" "$T/insp" '"key_version":2'
run "keys list shows the plugin's keys from the registry" 0 "$KS" keys list
expect_grep "... version 3 staged decrypt-only" "$T/out" "^app/card  *3  *decrypt-only  *- (plugin aws, $C)"
expect_grep "... version 2 primary" "$T/out" "^app/card  *2  *active  *\\*  *- (plugin aws"
run "keys list --json" 0 "$KS" keys list --json
if python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); k=[x for x in d["keys"] if x["key_id"]=="app/card"][0]; assert k["primary"]==2 and k["provider"]=="aws" and [v["state"] for v in k["versions"]]==["decrypt-only","active","decrypt-only"], d' "$T/out"; then
    ok "... one JSON object, primary 2, the three versions in file order"
else
    bad "keys list --json" "$(head -c 400 "$T/out")"
fi

# ---- kill -9 during a rewrap into KMS, then resume ----------------------------------------------
reg "$REG" "--key=app/card,1,$A,decrypt-only" "--key=app/card,2,$B" "--key=app/card,3,$C"
# rows under distinct DEKs, so the rewrap makes KMS calls all along
D2="$T/many.db"
sql "$D2" "CREATE TABLE pay(id INTEGER PRIMARY KEY, tenant TEXT, card BLOB);"
for i in $(seq 1 $ROWS); do
    hx=$(printf 'card-%s-4111' "$i" | "$KS" encrypt --tenant acme --key-id app/card --key-version 2 --purpose card \
        --context "pay:$i:card" 2>/dev/null | od -An -tx1 | tr -d ' \n')
    echo "INSERT INTO pay VALUES($i, 'acme', X'$hx');"
done | sqlite3 -batch "$D2"
if [ "$(sql "$D2" "SELECT count(*) FROM pay WHERE length(card) > 0")" = "$ROWS" ]; then ok "$ROWS rows under their own DEKs"; else bad "the many-DEK column"; fi
ct_tails "$D2" >"$T/before.tails"
T2=(--db "$D2" --table pay --column card)
"$KS" migrate run "${T2[@]}" --mode rewrap --to-key app/card:3 "${CTX[@]}" --batch-size 2 --max-rows-per-second 10 \
    >"$T/kill.out" 2>"$T/kill.err" &
kpid=$!
sleep 1.5
kill -9 "$kpid" 2>/dev/null
wait "$kpid" 2>/dev/null
cat "$T/kill.out" "$T/kill.err" >>"$T/all.out"
for _ in $(seq 1 50); do pgrep -f "$T/bin/keyshift-kms-aws" >/dev/null || break; sleep 0.1; done
if pgrep -f "$T/bin/keyshift-kms-aws" >/dev/null; then bad "kill -9: the plugin exited with keyshift"; else ok "kill -9: the plugin exited with keyshift (its input closed)"; fi
run "resume after kill -9" 0 "$KS" migrate run "${T2[@]}" --mode rewrap --to-key app/card:3 "${CTX[@]}" --json
cat "$T/out" "$T/err" >>"$T/all.out"
run "census after the resume" 0 "$KS" census "${T2[@]}" --json
expect_grep "every row under app/card v3" "$T/out" "\"key_id\":\"app/card\",\"key_version\":3,\"rows\":$ROWS}\\]"
ct_tails "$D2" >"$T/after.tails"
expect_same "kill -9 and resume: every ciphertext unchanged (nothing lost)" "$T/before.tails" "$T/after.tails"
wrong=""
for i in $(seq 1 $ROWS); do
    got=$(unhex "$(sql "$D2" "SELECT hex(card) FROM pay WHERE id = $i")" |
        "$KS" decrypt --context "pay:$i:card" --purpose card 2>/dev/null)
    [ "$got" = "card-$i-4111" ] || wrong+=" $i"
done
if [ -z "$wrong" ]; then ok "every row decrypts through KMS key C"; else bad "rows that do not decrypt" "$wrong"; fi

# ---- nothing secret in any output ---------------------------------------------------------------
if grep -q 'card-[0-9]*-4111' "$T/all.out"; then bad "no plaintext in the migrations' output"; else ok "no plaintext in the migrations' output"; fi
if grep -q -F "$AWS_SECRET_ACCESS_KEY" "$T/all.out" "$T/err"; then bad "no AWS secret in the output"; else ok "no AWS secret in the output"; fi

cli_finish cli-kms-aws
