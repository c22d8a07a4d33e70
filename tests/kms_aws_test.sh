#!/usr/bin/env bash
# tests/kms_aws_test.sh -- the AWS KMS client of keyshift-kms-aws
# (tools/kms-aws/kms.c) against moto_server, the AWS emulator, through
# tests/kms_aws_driver.c: an Encrypt/Decrypt round trip with an
# encryption context; a wrong context (auth-failed); Decrypt naming the
# other key (auth-failed); an unknown key (not-found); a disabled key
# (denied); a key pending deletion (revoked); no endpoint (unavailable);
# credentials from a shared credentials file, and a malformed one refused;
# and the DEK never in the driver's output.
#
# moto_server and boto3 must be installed (the pyenv python3 has them):
# without them the test fails, it does not skip.
set -u
KEYSHIFT=${KEYSHIFT:-unused}
. "$(dirname "$0")/cli_lib.sh"
. "$(dirname "$0")/kms_aws_lib.sh"

DRV=${KMS_AWS_DRIVER:-build/san/bin/kms_aws_driver}
if [ ! -x "$DRV" ]; then
    bad "the driver $DRV is built (make kms-aws-test builds it)"
    cli_finish kms-aws
    exit 1
fi
kms_aws_start kms-aws || exit 1

A=$(boto "print(k.create_key(Description='keyshift A')['KeyMetadata']['KeyId'])")
B=$(boto "print(k.create_key(Description='keyshift B')['KeyMetadata']['KeyId'])")
C=$(boto "print(k.create_key(Description='keyshift C')['KeyMetadata']['KeyId'])")
if [ -n "$A" ] && [ -n "$B" ] && [ -n "$C" ]; then ok "three keys created"; else bad "three keys created"; fi

# The DEK: 32 random bytes, in a file only.
head -c 32 /dev/urandom >"$T/dek"
chmod 600 "$T/dek"
DEK_HEX=$(od -An -tx1 "$T/dek" | tr -d ' \n')
DEK_B64=$(base64 -w0 "$T/dek")
: >"$T/all"
# drv NAME WANT_STDOUT_FIRST_LINE ARGS...: run the driver, keep its output
drv() {
    local name=$1 want=$2
    shift 2
    "$DRV" "$@" >"$T/out" 2>"$T/err"
    cat "$T/out" "$T/err" >>"$T/all"
    local got
    got=$(head -1 "$T/out")
    if [ "$got" = "$want" ]; then ok "$name: $got"; else bad "$name" "got '$got', want '$want'; stderr: $(head -c 300 "$T/err")"; fi
}

drv "encrypt under A with a context" ok encrypt "$A" "$T/dek" "aad-1" "$T/ct"
drv "decrypt under A, same context" ok decrypt "$A" "$T/ct" "aad-1" "$T/dek2"
expect_same "the round trip gives the DEK back" "$T/dek" "$T/dek2"
drv "decrypt with another AAD" auth-failed decrypt "$A" "$T/ct" "aad-2" "$T/x"
drv "decrypt with another tenant" auth-failed decrypt "$A" "$T/ct" "aad-1" "$T/x" "other"
# moto answers a Decrypt naming another key than the ciphertext's with
# AccessDeniedException (AWS: IncorrectKeyException, auth-failed, checked
# against the fake endpoint below).
drv "decrypt naming the other key is refused (moto: AccessDeniedException)" denied \
    decrypt "$B" "$T/ct" "aad-1" "$T/x"
expect_grep "... as moto's AccessDeniedException" "$T/err" "AccessDeniedException"
cp "$T/err" "$T/err.otherkey"
[ ! -e "$T/x" ] && ok "no plaintext written on a refusal" || bad "no plaintext written on a refusal"
drv "encrypt under an unknown key" not-found encrypt "00000000-0000-4000-8000-000000000000" "$T/dek" "aad-1" "$T/x"
drv "describe an unknown key" not-found describe "00000000-0000-4000-8000-000000000000"
drv "describe A" ok describe "$A"
expect_grep "A is enabled" "$T/out" "^state Enabled$"

# moto records a disabled key and a pending deletion (DescribeKey shows
# them) but still encrypts and decrypts under them; the refusals AWS gives
# are checked against the fake endpoint below.
boto "k.disable_key(KeyId='$B')"
drv "describe a disabled key" ok describe "$B"
expect_grep "B is disabled" "$T/out" "^state Disabled$"
expect_grep "... and not enabled" "$T/out" "^enabled 0$"
drv "encrypt under C" ok encrypt "$C" "$T/dek" "aad-1" "$T/ct.c"
boto "k.schedule_key_deletion(KeyId='$C', PendingWindowInDays=7)"
drv "describe a key pending deletion" ok describe "$C"
expect_grep "C is pending deletion" "$T/out" "^state PendingDeletion$"
"$DRV" encrypt "$B" "$T/dek" "aad-1" "$T/x" >"$T/moto.disabled" 2>&1
"$DRV" decrypt "$C" "$T/ct.c" "aad-1" "$T/x" >"$T/moto.pending" 2>&1
cat "$T/moto.disabled" "$T/moto.pending" >>"$T/all"
rm -f "$T/x"

# Credentials from a shared credentials file (profile), region from the
# config file; a malformed file is refused before any call.
mkdir -p "$HOME/.aws"
printf '# test\n[default]\naws_access_key_id = nope\n\n[ks]\naws_access_key_id = AKIDFILE\naws_secret_access_key = s3cr3t\n' \
    >"$HOME/.aws/credentials"
printf '[profile ks]\nregion = us-east-1\n' >"$HOME/.aws/config"
env -u AWS_ACCESS_KEY_ID -u AWS_SECRET_ACCESS_KEY -u AWS_REGION AWS_PROFILE=ks \
    "$DRV" decrypt "$A" "$T/ct" "aad-1" "$T/dek3" >"$T/out" 2>"$T/err"
cat "$T/out" "$T/err" >>"$T/all"
expect_eq "credentials and region from the shared files" "$T/out" "ok"
expect_same "... and the DEK back" "$T/dek" "$T/dek3"
printf '[ks]\naws_access_key_id = AKIDFILE\naws_secret_access_key = s3cr3t\naws_access_key_id = AKID2\n' \
    >"$HOME/.aws/credentials"
env -u AWS_ACCESS_KEY_ID -u AWS_SECRET_ACCESS_KEY AWS_PROFILE=ks \
    "$DRV" describe "$A" >"$T/out" 2>"$T/err"
expect_eq "a key given twice in the profile is refused" "$T/out" "invalid"
expect_grep "... saying so" "$T/err" "given twice"
printf '[ks]\ncredential_process = /bin/true\n' >"$HOME/.aws/credentials"
env -u AWS_ACCESS_KEY_ID -u AWS_SECRET_ACCESS_KEY AWS_PROFILE=ks \
    "$DRV" describe "$A" >"$T/out" 2>"$T/err"
expect_eq "a credential_process that prints nothing is refused" "$T/out" "invalid"
expect_grep "... saying why" "$T/err" "not one JSON object"
printf 'aws_access_key_id = AKIDFILE\n' >"$HOME/.aws/credentials"
env -u AWS_ACCESS_KEY_ID -u AWS_SECRET_ACCESS_KEY \
    "$DRV" describe "$A" >"$T/out" 2>"$T/err"
expect_eq "a key outside any section is refused" "$T/out" "invalid"

# No endpoint: connection refused is retryable.
DEAD=$(free_port)
AWS_ENDPOINT_URL_KMS="http://127.0.0.1:$DEAD" "$DRV" describe "$A" >"$T/out" 2>"$T/err"
expect_eq "no endpoint is unavailable" "$T/out" "unavailable"

echo "#   moto, Decrypt naming the other key: $(cat "$T/err.otherkey")"
echo "#   moto, Encrypt under a disabled key: $(head -1 "$T/moto.disabled")"
echo "#   moto, Decrypt under a key pending deletion: $(head -1 "$T/moto.pending")"

# ---- the fake endpoint: error mapping, strict parsing, signatures ----
unset AWS_PROFILE
export AWS_ACCESS_KEY_ID=AKIDFAKE AWS_SECRET_ACCESS_KEY=fake-secret/with+chars AWS_REGION=us-east-1
python3 "$(dirname "$0")/kms_aws_fake.py" "$T/fake.port" "$T/fake.log" "$AWS_ACCESS_KEY_ID" \
    "$AWS_SECRET_ACCESS_KEY" >"$T/fake.out" 2>&1 &
FAKE=$!
trap 'kill "$MOTO" "$FAKE" 2>/dev/null; wait "$MOTO" "$FAKE" 2>/dev/null; rm -rf "$T"' EXIT
for _ in $(seq 1 100); do [ -s "$T/fake.port" ] && break; sleep 0.05; done
export AWS_ENDPOINT_URL_KMS="http://127.0.0.1:$(cat "$T/fake.port" 2>/dev/null)"
printf 'x' >"$T/ct1"
drv "fake: encrypt" ok encrypt good "$T/dek" "aad-1" "$T/x"
expect_grep "fake: the encryption context sent" "$T/fake.log" \
    'context {"keyshift-aad": "YWFkLTE=", "keyshift-key-id": "orders/card", "keyshift-key-version": "3", "keyshift-purpose": "dek", "keyshift-tenant": "acme"}'
drv "fake: decrypt" ok decrypt good "$T/ct1" "aad-1" "$T/x"
expect_eq "fake: the plaintext written" "$T/x" "AB"
drv "fake: describe" ok describe good
for c in "throttle throttled" "internal unavailable" "unavailable unavailable" "disabled denied" \
    "pending revoked" "importing denied" "incorrect auth-failed" "badctx auth-failed" "prefixed not-found" \
    "hdronly denied" "validation invalid" "dupe invalid" "badb64 invalid" "nopad invalid" "noncanon invalid" \
    "wrongtype invalid" "nul invalid" "notjson invalid" "array invalid" "huge invalid" "badalg invalid" \
    "otherkey auth-failed" "bigpt invalid"; do
    set -- $c
    drv "fake: decrypt answered '$1'" "$2" decrypt "$1" "$T/ct1" "aad-1" "$T/x"
done
drv "fake: encrypt under a key pending deletion" revoked encrypt pending "$T/dek" "aad-1" "$T/x"
AWS_SESSION_TOKEN=unused drv "fake: a session token the endpoint does not expect is signed (and refused)" denied \
    describe good
if grep -q '^sig-bad' "$T/fake.log" && [ "$(grep -c '^sig-bad' "$T/fake.log")" -eq 1 ] &&
    grep -q '^sig-bad signed headers content-type;host;x-amz-date;x-amz-security-token;x-amz-target' "$T/fake.log"; then
    ok "fake: botocore verified every other signature ($(grep -c '^sig-ok' "$T/fake.log"))"
else
    bad "fake: botocore verified every signature" "$(grep '^sig-bad' "$T/fake.log" | head -3)"
fi
kill "$FAKE" 2>/dev/null; wait "$FAKE" 2>/dev/null
rm -f "$T/fake.port" "$T/fake.log"
TOKEN="IQoJb3JpZ2luX2VjEXAMPLE/token+with=chars"
python3 "$(dirname "$0")/kms_aws_fake.py" "$T/fake.port" "$T/fake.log" "$AWS_ACCESS_KEY_ID" \
    "$AWS_SECRET_ACCESS_KEY" "$TOKEN" >"$T/fake.out" 2>&1 &
FAKE=$!
for _ in $(seq 1 100); do [ -s "$T/fake.port" ] && break; sleep 0.05; done
export AWS_ENDPOINT_URL_KMS="http://127.0.0.1:$(cat "$T/fake.port" 2>/dev/null)"
AWS_SESSION_TOKEN=$TOKEN drv "fake: with a session token, signed and verified" ok describe good
expect_grep "fake: botocore verified the session-token signature" "$T/fake.log" "^sig-ok TrentService.DescribeKey"

if grep -qi -- "$DEK_HEX" "$T/all" || grep -q -- "$DEK_B64" "$T/all"; then
    bad "the DEK never appears in the driver's output"
else
    ok "the DEK never appears in the driver's output ($(wc -l <"$T/all") lines checked)"
fi
cli_finish kms-aws
