#!/usr/bin/env bash
# tests/kms_aws_plugin_test.sh -- keyshift-kms-aws, the AWS KMS plugin
# (docs/kms-plugin.md, "The AWS KMS plugin"), driven through its standard
# input and output by tests/kms_plugin_drive.py, which reads every
# response strictly, against moto_server: hello; key-info of the primary
# and of each version; a wrap/unwrap round trip; a changed AAD; another
# KMS key under the same version; a disabled key; a key pending
# deletion; an unknown version; a decrypt-only version; malformed,
# oversized and unterminated lines; a deadline; the command line; exit 0
# at the end of input; no DEK on standard error; every source of the AWS
# credential chain, their precedence and a refresh.  What moto does not
# do (refuse a disabled key, IncorrectKeyException, throttling) is checked
# against tests/kms_aws_fake.py.
set -u
KEYSHIFT=${KEYSHIFT:-unused}
. "$(dirname "$0")/cli_lib.sh"
. "$(dirname "$0")/kms_aws_lib.sh"

PLUG=${KMS_AWS_PLUGIN:-build/san/bin/keyshift-kms-aws}
DRIVE="$(dirname "$0")/kms_plugin_drive.py"
if [ ! -x "$PLUG" ]; then
    bad "the plugin $PLUG is built (make kms-aws-test builds it)"
    cli_finish kms-aws-plugin
    exit 1
fi
kms_aws_start kms-aws-plugin || exit 1

new_key() { boto "print(k.create_key(Description='$1')['KeyMetadata']['KeyId'])"; }
A=$(new_key A) B=$(new_key B) C=$(new_key C) D=$(new_key D) E=$(new_key E)
E_ARN=$(boto "print(k.describe_key(KeyId='$E')['KeyMetadata']['Arn'])")
boto "k.create_alias(AliasName='alias/keyshift-e', TargetKeyId='$E')"
E_ALIAS_ARN=${E_ARN%:key/*}:alias/keyshift-e
if [ -n "$A" ] && [ -n "$E_ARN" ]; then ok "five keys and an alias created"; else bad "five keys created"; fi

DEK_B64=$(head -c 32 /dev/urandom | base64 -w0)
DEK_HEX=$(printf '%s' "$DEK_B64" | base64 -d | od -An -tx1 | tr -d ' \n')
: >"$T/stderr"

# aad TENANT KEY_ID VERSION [PURPOSE]: the base64 of a wrap AAD
# (docs/format.md [F-CRYPTO-AAD-2]), format 2 with a purpose, else 1.
aad() {
    python3 -c '
import base64, struct, sys
t, k, v = sys.argv[1].encode(), sys.argv[2].encode(), int(sys.argv[3])
lp = lambda b: struct.pack(">I", len(b)) + b
p = sys.argv[4].encode() if len(sys.argv) > 4 else None
a = b"KSW" + bytes([2 if p else 1]) + struct.pack(">I", 2) + lp(t) + lp(k) + struct.pack(">I", v)
print(base64.b64encode(a + (lp(p) if p else b"")).decode())' "$@"
}
# Request lines for the driver: ID KEY_ID VERSION ...
hello() { printf '> {"v":1,"id":%s,"op":"hello","versions":[1],"client":"keyshift test"}\n' "$1"; }
info() { printf '> {"v":1,"id":%s,"op":"key-info","key_id":"%s","key_version":%s}\n' "$@"; }
wrap() { printf '> {"v":1,"id":%s,"op":"wrap","key_id":"%s","key_version":%s,"dek":"%s","aad":"%s"}\n' "$@"; }
unwrap() { printf '> {"v":1,"id":%s,"op":"unwrap","key_id":"%s","key_version":%s,"wrapped":"%s","aad":"%s"}\n' "$@"; }

# session ARGS... < SCRIPT: run the plugin with ARGS through the driver;
# the transcript in $T/tr (one line per response, then "exit RC").
session() {
    python3 "$DRIVE" "$T/stderr" "$PLUG" "$@" >"$T/tr"
}
# resp N: the transcript's line N.
resp() { sed -n "${1}p" "$T/tr"; }
# expect_resp NAME N REGEX: line N matches REGEX (grep -E).
expect_resp() {
    local got
    got=$(resp "$2")
    if printf '%s\n' "$got" | grep -qE -- "$3"; then ok "$1"; else bad "$1" "line $2: '$got', want /$3/"; fi
}
# expect_dek NAME N: line N is an unwrap response whose dek is the DEK.
expect_dek() {
    local want="< {\"v\":1,\"id\":$2,\"ok\":true,\"dek\":\"$DEK_B64\"}"
    if [ "$(resp "$2")" = "$want" ]; then ok "$1"; else bad "$1" "line $2: '$(resp "$2" | cut -c1-60)...'"; fi
}
# kept N MEMBER: MEMBER of the JSON response on line N.
kept() {
    resp "$1" | sed 's/^< //' | python3 -c "import json, sys; print(json.load(sys.stdin).get('$2', ''))"
}
err_of() { printf '^< \\{"v":1,"id":%s,"ok":false,"error":"%s"' "$1" "$2"; }

# ---- the protocol, on enabled keys ------------------------------------
KEYS=(--key=app/kek,1,"$A",decrypt-only --key=app/kek,2,"$B" --key=app/off,1,"$C" --key=app/gone,1,"$D")
AAD2=$(aad acme app/kek 2 card)
AAD1=$(aad acme app/kek 1 card)
# a blob under version 1 while it is the primary (version 2 not yet added)
session --key=app/kek,1,"$A" <<S
$(hello 1)
$(wrap 2 app/kek 1 "$DEK_B64" "$AAD1")
.
S
W1=$(kept 2 wrapped)
[ -n "$W1" ] && ok "version 1 wraps while it is the primary" || bad "version 1 wraps while it is the primary" "$(cat "$T/tr")"

session "${KEYS[@]}" <<S
$(hello 1)
$(info 2 app/kek 0)
$(info 3 app/kek 1)
$(info 4 app/kek 2)
$(wrap 5 app/kek 2 "$DEK_B64" "$AAD2")
= W2 wrapped
$(unwrap 6 app/kek 2 @W2 "$AAD2")
$(unwrap 7 app/kek 2 @W2 "$(aad acmf app/kek 2 card)")
$(unwrap 8 app/kek 2 @W2 "$(aad acme app/kek 2 cvv)")
$(wrap 9 app/kek 1 "$DEK_B64" "$AAD1")
$(unwrap 10 app/kek 1 "$W1" "$AAD1")
$(unwrap 11 app/kek 2 "$W1" "$AAD1")
$(info 12 app/kek 3)
$(wrap 13 app/kek 3 "$DEK_B64" "$AAD2")
$(info 14 app/other 0)
$(info 15 "$E_ARN" 0)
$(info 16 "$E_ALIAS_ARN" 1)
$(info 17 "$E_ARN" 2)
$(wrap 18 "$E_ALIAS_ARN" 1 "$DEK_B64" "$(aad acme "$E_ALIAS_ARN" 1)")
= WE wrapped
$(unwrap 19 "$E_ALIAS_ARN" 1 @WE "$(aad acme "$E_ALIAS_ARN" 1)")
$(unwrap 20 app/kek 2 @W2 "$(printf 'not a wrap aad' | base64 -w0)")
.
S
cp "$T/tr" "$T/tr.main"
expect_resp "hello: version 1, the project's version, the three capabilities" 1 \
    '^< \{"v":1,"id":1,"ok":true,"version":1,"plugin":"keyshift-kms-aws [0-9]+\.[0-9]+\.[0-9]+","capabilities":\["wrap","unwrap","key-info"\]\}$'
expect_resp "key-info of the primary: the highest version not decrypt-only" 2 \
    '^< \{"v":1,"id":2,"ok":true,"version":2,"state":"active","primary":true\}$'
expect_resp "key-info v1: decrypt-only, not primary" 3 \
    '^< \{"v":1,"id":3,"ok":true,"version":1,"state":"decrypt-only","primary":false\}$'
expect_resp "key-info v2: active, primary" 4 '^< \{"v":1,"id":4,"ok":true,"version":2,"state":"active","primary":true\}$'
expect_resp "wrap under the primary" 5 '^< \{"v":1,"id":5,"ok":true,"wrapped":"[A-Za-z0-9+/=]+"\}$'
expect_dek "unwrap gives the DEK back" 6
expect_resp "unwrap with another tenant in the AAD: auth-failed" 7 "$(err_of 7 auth-failed)"
expect_resp "unwrap with another purpose in the AAD: auth-failed" 8 "$(err_of 8 auth-failed)"
expect_resp "wrap under a decrypt-only version: denied" 9 "$(err_of 9 denied)"
expect_dek "unwrap under a decrypt-only version: the DEK" 10
expect_resp "unwrap of version 1's blob named as version 2: auth-failed" 11 "$(err_of 11 auth-failed)"
expect_resp "key-info of an unknown version: not-found" 12 "$(err_of 12 not-found)"
expect_resp "wrap under an unknown version: not-found" 13 "$(err_of 13 not-found)"
expect_resp "an unknown key_id: not-found" 14 "$(err_of 14 not-found)"
expect_resp "a key ARN as key_id: version 1, primary" 15 '^< \{"v":1,"id":15,"ok":true,"version":1,"state":"active","primary":true\}$'
expect_resp "an alias ARN as key_id: version 1" 16 '^< \{"v":1,"id":16,"ok":true,"version":1,"state":"active","primary":true\}$'
expect_resp "a key ARN has no version 2" 17 "$(err_of 17 not-found)"
expect_resp "wrap under an alias ARN" 18 '^< \{"v":1,"id":18,"ok":true,"wrapped":'
expect_dek "... and unwrap under it" 19
expect_resp "an AAD that is not a wrap AAD is still bound" 20 "$(err_of 20 auth-failed)"
expect_resp "exit 0 at the end of input" 21 '^exit 0$'

# The same (key_id, version) mapped to another KMS key: Decrypt names it.
# moto answers AccessDeniedException (denied); AWS answers
# IncorrectKeyException (auth-failed), checked with the fake below.
cp "$T/tr" "$T/tr.keep" && cp "$T/tr.main" "$T/tr" && W2=$(kept 5 wrapped) && cp "$T/tr.keep" "$T/tr"
session --key=app/kek,2,"$A" <<S
$(unwrap 1 app/kek 2 "$W2" "$AAD2")
.
S
expect_resp "a blob of key B unwrapped naming key A: refused (moto: denied)" 1 \
    "$(err_of 1 '(denied|auth-failed)')"
echo "#   moto, Decrypt of another key's blob: $(resp 1)"

# ---- key states -----------------------------------------------------------
boto "k.disable_key(KeyId='$C')"
boto "k.schedule_key_deletion(KeyId='$D', PendingWindowInDays=7)"
AADO=$(aad acme app/off 1) AADG=$(aad acme app/gone 1)
session "${KEYS[@]}" <<S
$(info 1 app/off 1)
$(info 2 app/off 0)
$(wrap 3 app/off 1 "$DEK_B64" "$AADO")
$(info 4 app/gone 1)
$(info 5 app/gone 0)
$(wrap 6 app/gone 1 "$DEK_B64" "$AADG")
.
S
expect_resp "a disabled KMS key: disabled, not primary" 1 '^< \{"v":1,"id":1,"ok":true,"version":1,"state":"disabled","primary":false\}$'
expect_resp "... as the primary: denied" 2 "$(err_of 2 denied)"
expect_resp "a KMS key pending deletion: destroyed, not primary" 4 '^< \{"v":1,"id":4,"ok":true,"version":1,"state":"destroyed","primary":false\}$'
expect_resp "... as the primary: revoked" 5 "$(err_of 5 revoked)"
# moto 5 encrypts under disabled keys and keys pending deletion; AWS
# refuses (DisabledException: denied, KMSInvalidStateException: revoked),
# checked with the fake below.
expect_resp "wrap under a disabled key: denied, or ok (moto)" 3 "($(err_of 3 denied)|\"ok\":true)"
expect_resp "wrap under a key pending deletion: revoked, or ok (moto)" 6 "($(err_of 6 revoked)|\"ok\":true)"
echo "#   moto, Encrypt under a disabled key: $(resp 3 | cut -c1-60)"
echo "#   moto, Encrypt under a key pending deletion: $(resp 6 | cut -c1-60)"

# ---- malformed requests: answered invalid, and the plugin keeps serving --
session "${KEYS[@]}" <<S
$(hello 1)
> not json
> {"v":1,"id":3,"op":"key-info","key_id":"app/kek","key_version":1,"key_version":1}
> {"v":1,"id":4,"op":"key-info","key_id":"app/kek","key_version":1.0}
> {"v":1,"id":5,"op":"key-info","key_id":"app/kek","key_version":1,"note":"x"}
> {"v":1,"id":6,"op":"key-info","key_id":"app/kek","key_version":1,"x-trace":{"a":1}}
> {"v":2,"id":7,"op":"hello","versions":[2],"client":"k"}
> {"v":1,"id":8,"op":"delete","key_id":"app/kek","key_version":1}
> {"v":1,"id":9,"op":"wrap","key_id":"app/kek","key_version":2,"dek":"AAAA","aad":"$AAD2"}
> {"v":1,"id":10,"op":"wrap","key_id":"app/kek","key_version":2,"dek":"${DEK_B64%?}B","aad":"$AAD2"}
> {"v":1,"id":11,"op":"unwrap","key_id":"app kek","key_version":2,"wrapped":"AA==","aad":"$AAD2"}
> {"v":1,"id":12,"op":"unwrap","key_id":"app/kek","key_version":0,"wrapped":"AA==","aad":"$AAD2"}
> {"v":1,"id":13,"op":"unwrap","key_id":"app/kek","key_version":2,"wrapped":"AA==","aad":""}
> {"v":1,"id":"14","op":"hello","versions":[1],"client":"k"}
> {"v":1,"id":15,"op":"hello","versions":[2],"client":"k"}
> [1,2,3]
! 65537
! 65536
$(info 19 app/kek 2)
~ {"v":1,"id":20,"op":"key-info"
.
S
for n in 2 3 4 5 7 8 9 10 11 12 13 15 16 17 18 20; do
    expect_resp "malformed request $n: invalid, with its id or the next in sequence" "$n" "$(err_of "$n" invalid)"
done
expect_resp "an x- member is ignored" 6 '^< \{"v":1,"id":6,"ok":true,"version":1,"state":"decrypt-only"'
expect_resp "an id that is a string: answered with the next id" 14 "$(err_of 14 invalid)"
expect_resp "the plugin still serves after all of them" 19 '^< \{"v":1,"id":19,"ok":true,"version":2,"state":"active","primary":true\}$'
expect_resp "an unterminated last line, then exit 0" 21 '^exit 0$'
if [ "$(wc -l <"$T/tr")" -eq 21 ]; then
    ok "one response per request line, the oversized ones included"
else
    bad "one response per request line" "$(wc -l <"$T/tr") lines"
fi

# ---- the deadline and an endpoint that is down --------------------------
SLOW=$(free_port)
python3 -c "import socket, time; s = socket.socket(); s.bind(('127.0.0.1', $SLOW)); s.listen(8); time.sleep(60)" &
SLOWPID=$!
sleep 0.3
AWS_ENDPOINT_URL_KMS="http://127.0.0.1:$SLOW" session "${KEYS[@]}" --timeout-ms=300 <<S
$(info 1 app/kek 2)
.
S
expect_resp "no answer within --timeout-ms: timeout" 1 "$(err_of 1 timeout)"
kill "$SLOWPID" 2>/dev/null
wait "$SLOWPID" 2>/dev/null
AWS_ENDPOINT_URL_KMS="http://127.0.0.1:$(free_port)" session "${KEYS[@]}" <<S
$(wrap 1 app/kek 2 "$DEK_B64" "$AAD2")
.
S
expect_resp "an endpoint that refuses connections: unavailable" 1 "$(err_of 1 unavailable)"
(unset AWS_ENDPOINT_URL_KMS; session "${KEYS[@]}" --endpoint-url="http://127.0.0.1:$PORT/" --region=us-east-1 <<S
$(info 1 app/kek 2)
.
S
)
expect_resp "--endpoint-url and --region instead of the environment" 1 '"ok":true'

# ---- the command line ----------------------------------------------------
run "--version exits 0" 0 "$PLUG" --version
expect_grep "... and names the plugin and its version" "$T/out" '^keyshift-kms-aws [0-9.]*$'
run "--help exits 0" 0 "$PLUG" --help
expect_grep "... and is the manual" "$T/out" "KEYS AND VERSIONS"
for args in "--key=app/kek,1,$A --key=app/kek,1,$B" "--key=app/kek,0,$A" "--key=app/kek,01,$A" \
    "--key=app/kek,1" "--key=app kek,1,$A" "--key=app/kek,1,$A,decrypt" "--key=app/kek,1,not a key" \
    "--key=app/kek,1,$A --key=app/kek,2,$A" "--region=US_EAST" "--region=a --region=b" "--timeout-ms=0" \
    "--endpoint-url=ftp://x" "--profile=a/b" "--bogus" "positional"; do
    # shellcheck disable=SC2086
    IN=/dev/null run "bad arguments exit 64: $args" 64 "$PLUG" $args
done

# ---- the credential chain [KP-AWS-10..14] -----------------------------------
# chain NAME VAR=VALUE... : a plugin with only those AWS variables (and
# the region, HOME, the KMS endpoint) answers hello, then key-info of
# key A (with --timeout-ms=$CHAIN_TIMEOUT when set); its standard error
# in $T/chain.err, the transcript in $T/tr.
NOAWS=(-u AWS_ACCESS_KEY_ID -u AWS_SECRET_ACCESS_KEY -u AWS_SESSION_TOKEN -u AWS_PROFILE)
chain() {
    shift
    : >"$T/chain.err"
    env "${NOAWS[@]}" AWS_EC2_METADATA_DISABLED=true AWS_SHARED_CREDENTIALS_FILE="$T/aws.creds" \
        AWS_CONFIG_FILE="$T/aws.config" "$@" python3 "$DRIVE" "$T/chain.err" "$PLUG" "--key=c/a,1,$A" \
        ${CHAIN_TIMEOUT:+"--timeout-ms=$CHAIN_TIMEOUT"} >"$T/tr" <<S
$(hello 1)
$(info 2 c/a 0)
.
S
}
# chain_ok NAME SOURCE VAR=VALUE...: the chain finds credentials at SOURCE
# (a pattern of the plugin's "credentials from" line) and KMS answers.
chain_ok() {
    local name=$1 src=$2
    shift 2
    chain "$name" "$@"
    if [ "$(resp 1 | grep -c '"ok":true')" = 1 ] && [ "$(resp 2 | grep -c '"state":"active"')" = 1 ] &&
        grep -q "credentials from $src" "$T/chain.err"; then
        ok "$name"
    else
        bad "$name" "$(head -c 300 "$T/tr") / $(head -c 400 "$T/chain.err")"
    fi
}
MOTO_URL="http://127.0.0.1:$PORT"
: >"$T/aws.creds"
: >"$T/aws.config"
chain "nothing"
expect_resp "no credentials: hello is answered invalid (keyshift: 78)" 1 "$(err_of 1 invalid)"
expect_resp "... naming every source it tried" 1 \
    'no AWS credentials \(env: no key id; web identity: no token file; profile default: not found; container: no URI; IMDS: disabled\)'
expect_grep "... and on stderr with the variables and files" "$T/chain.err" \
    "AWS_WEB_IDENTITY_TOKEN_FILE not set; profile default: not in $T/aws.creds or $T/aws.config"
expect_resp "... and every later request too" 2 "$(err_of 2 invalid)"
chain "IMDS that does not answer" AWS_EC2_METADATA_DISABLED=false AWS_EC2_METADATA_SERVICE_ENDPOINT=http://127.0.0.1:1
expect_resp "IMDS that does not answer is skipped: invalid" 1 "$(err_of 1 invalid).*IMDS: no answer"
chain "a named profile that is missing" AWS_PROFILE=nosuch
expect_resp "a named profile that is missing: invalid" 1 "$(err_of 1 invalid).*profile nosuch is in neither"

chain_ok "environment" "environment" AWS_ACCESS_KEY_ID=AKIDENV AWS_SECRET_ACCESS_KEY=s \
    AWS_EC2_METADATA_SERVICE_ENDPOINT="$MOTO_URL" AWS_EC2_METADATA_DISABLED=false
printf 'eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJrZXlzaGlmdCJ9.c2ln\n' >"$T/web.token"
WEB=(AWS_WEB_IDENTITY_TOKEN_FILE="$T/web.token" AWS_ROLE_ARN=arn:aws:iam::123456789012:role/irsa
    AWS_ENDPOINT_URL_STS="$MOTO_URL")
printf '[default]\naws_access_key_id = AKIDFILE\naws_secret_access_key = sfile\n' >"$T/aws.creds"
chain_ok "web identity (STS AssumeRoleWithWebIdentity at moto), before the profile" \
    "web identity, role arn:aws:iam::123456789012:role/irsa" "${WEB[@]}"
chain_ok "the environment before web identity" "environment" "${WEB[@]}" AWS_ACCESS_KEY_ID=AKIDENV \
    AWS_SECRET_ACCESS_KEY=s
chain "web identity, STS down" AWS_WEB_IDENTITY_TOKEN_FILE="$T/web.token" \
    AWS_ROLE_ARN=arn:aws:iam::123456789012:role/irsa AWS_ENDPOINT_URL_STS=http://127.0.0.1:1
expect_resp "web identity with STS unreachable: unavailable (keyshift: 69), no fall-through" 1 \
    "$(err_of 1 unavailable)"
chain_ok "a profile's static keys" "profile default" AWS_CONTAINER_CREDENTIALS_FULL_URI=http://127.0.0.1:1/
printf '[base]\naws_access_key_id = AKIDBASE\naws_secret_access_key = sbase\n' >"$T/aws.creds"
printf '[profile app]\nrole_arn = arn:aws:iam::123456789012:role/app\nsource_profile = base\nrole_session_name = ks-test\n' \
    >"$T/aws.config"
chain_ok "role_arn with source_profile (STS AssumeRole at moto)" \
    "profile app, role arn:aws:iam::123456789012:role/app" AWS_PROFILE=app AWS_ENDPOINT_URL_STS="$MOTO_URL"
cat >"$T/cp.sh" <<'CP'
#!/bin/sh
printf '{"Version": 1, "AccessKeyId": "AKIDPROC", "SecretAccessKey": "sproc", "SessionToken": "tproc", "Expiration": "2099-01-01T00:00:00Z"}'
CP
chmod +x "$T/cp.sh"
printf '[profile proc]\ncredential_process = %s\n' "$T/cp.sh" >"$T/aws.config"
chain_ok "credential_process" "profile proc, credential_process" AWS_PROFILE=proc
printf '[profile slow]\ncredential_process = sleep 30\n' >"$T/aws.config"
CHAIN_TIMEOUT=800 chain "a credential_process that hangs" AWS_PROFILE=slow
# the whole walk ends by --timeout-ms: killed, answered timeout
expect_resp "a credential_process that hangs is killed at the deadline: timeout" 1 "$(err_of 1 timeout)"
: >"$T/aws.config"
chain_ok "IMDSv2 (moto's metadata endpoint)" "IMDS, role default-role" AWS_EC2_METADATA_DISABLED=false \
    AWS_EC2_METADATA_SERVICE_ENDPOINT="$MOTO_URL"
chain "a container URI over plain http to another host" AWS_CONTAINER_CREDENTIALS_FULL_URI=http://example.com/creds
expect_resp "a container URI over plain http to a host that is not local: invalid" 1 \
    "$(err_of 1 invalid).*plain http is allowed only"

# ---- the fake endpoint: what AWS answers and moto does not ---------------
python3 "$(dirname "$0")/kms_aws_fake.py" "$T/fake.port" "$T/fake.log" "$AWS_ACCESS_KEY_ID" \
    "$AWS_SECRET_ACCESS_KEY" >"$T/fake.out" 2>&1 &
FAKE=$!
trap 'kill "$MOTO" "$FAKE" 2>/dev/null; wait "$MOTO" "$FAKE" 2>/dev/null; rm -rf "$T"' EXIT
for _ in $(seq 1 100); do [ -s "$T/fake.port" ] && break; sleep 0.05; done
FAKE_KEYS=()
for k in disabled pending incorrect throttle internal good; do FAKE_KEYS+=(--key=f/$k,1,$k); done
AWS_ENDPOINT_URL_KMS="http://127.0.0.1:$(cat "$T/fake.port" 2>/dev/null)" session "${FAKE_KEYS[@]}" <<S
$(wrap 1 f/disabled 1 "$DEK_B64" "$(aad acme f/disabled 1)")
$(wrap 2 f/pending 1 "$DEK_B64" "$(aad acme f/pending 1)")
$(unwrap 3 f/incorrect 1 AA== "$(aad acme f/incorrect 1)")
$(wrap 4 f/throttle 1 "$DEK_B64" "$(aad acme f/throttle 1)")
$(wrap 5 f/internal 1 "$DEK_B64" "$(aad acme f/internal 1)")
$(unwrap 6 f/good 1 AA== "$(aad acme f/good 1 card)")
$(info 7 f/pending 1)
$(wrap 8 f/good 1 "$DEK_B64" "$(aad acme f/good 1 card)")
.
S
expect_resp "fake: Encrypt under a disabled key (DisabledException): denied" 1 "$(err_of 1 denied)"
expect_resp "fake: Encrypt under a key pending deletion: revoked" 2 "$(err_of 2 revoked)"
expect_resp "fake: IncorrectKeyException: auth-failed" 3 "$(err_of 3 auth-failed)"
expect_resp "fake: ThrottlingException: throttled, no retry_after_ms" 4 "$(err_of 4 throttled),\"message\":\"[^\"]*\"\\}\$"
expect_resp "fake: KMSInternalException: unavailable" 5 "$(err_of 5 unavailable)"
expect_resp "fake: a plaintext that is not 32 bytes: auth-failed" 6 "$(err_of 6 auth-failed)"
expect_resp "fake: key-info of a key pending deletion: destroyed" 7 '"state":"destroyed","primary":false'
expect_grep "fake: the encryption context has the readable members" "$T/fake.log" \
    "context {\"keyshift-aad\": \"$(aad acme f/good 1 card)\", \"keyshift-key-id\": \"f/good\", \"keyshift-key-version\": \"1\", \"keyshift-purpose\": \"card\", \"keyshift-tenant\": \"acme\"}"
if [ "$(grep -c '^sig-bad' "$T/fake.log")" -eq 0 ]; then ok "fake: botocore verified every signature"; else
    bad "fake: botocore verified every signature"; fi

# the chain against the fake: the container endpoint, and a refresh of
# IMDS credentials that expire 2 s after they are served (refreshed after
# half their life, [KP-AWS-13])
FAKE_URL="http://127.0.0.1:$(cat "$T/fake.port" 2>/dev/null)"
printf 'fake-container-token\n' >"$T/ecs.token"
chain_ok "the container endpoint with its token file (fake)" "container endpoint" \
    AWS_ENDPOINT_URL_KMS="$FAKE_URL" AWS_CONTAINER_CREDENTIALS_FULL_URI="$FAKE_URL/creds" \
    AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE="$T/ecs.token"
chain_ok "the container endpoint before IMDS" "container endpoint" AWS_ENDPOINT_URL_KMS="$FAKE_URL" \
    AWS_CONTAINER_CREDENTIALS_FULL_URI="$FAKE_URL/creds" AWS_CONTAINER_AUTHORIZATION_TOKEN=fake-container-token \
    AWS_EC2_METADATA_DISABLED=false AWS_EC2_METADATA_SERVICE_ENDPOINT="$FAKE_URL"
chain "a wrong container token" AWS_ENDPOINT_URL_KMS="$FAKE_URL" AWS_CONTAINER_CREDENTIALS_FULL_URI="$FAKE_URL/creds" \
    AWS_CONTAINER_AUTHORIZATION_TOKEN=wrong
expect_resp "a wrong container token: denied" 1 "$(err_of 1 denied)"
: >"$T/chain.err"
before=$(grep -c '^imds-creds' "$T/fake.log")
env "${NOAWS[@]}" AWS_EC2_METADATA_SERVICE_ENDPOINT="$FAKE_URL" AWS_ENDPOINT_URL_KMS="$FAKE_URL" \
    AWS_SHARED_CREDENTIALS_FILE="$T/aws.creds" AWS_CONFIG_FILE="$T/aws.config" \
    python3 "$DRIVE" "$T/chain.err" "$PLUG" --key=f/good,1,good >"$T/tr" <<S
$(hello 1)
$(info 2 f/good 0)
% 1.3
$(info 3 f/good 0)
$(info 4 f/good 0)
.
S
fetched=$(($(grep -c '^imds-creds' "$T/fake.log") - before))
if [ "$fetched" = 2 ] && [ "$(grep -c '"state":"active"' "$T/tr")" = 3 ]; then
    ok "IMDS credentials of 2 s are fetched again after half their life, and not before (2 fetches)"
else
    bad "IMDS refresh" "$fetched fetches; $(head -c 300 "$T/tr") / $(head -c 300 "$T/chain.err")"
fi
# no region in the environment or the config file: the EC2 instance's
# from IMDSv2 [KP-AWS-16], with which every call is signed (the fake
# checks the us-east-1 scope); with IMDS disabled, no region
: >"$T/chain.err"
: >"$T/empty.config"
before=$(grep -c '^imds-region' "$T/fake.log")
env "${NOAWS[@]}" -u AWS_REGION -u AWS_DEFAULT_REGION AWS_EC2_METADATA_DISABLED=false \
    AWS_EC2_METADATA_SERVICE_ENDPOINT="$FAKE_URL" AWS_ENDPOINT_URL_KMS="$FAKE_URL" \
    AWS_SHARED_CREDENTIALS_FILE="$T/aws.creds" AWS_CONFIG_FILE="$T/empty.config" \
    python3 "$DRIVE" "$T/chain.err" "$PLUG" --key=f/good,1,good >"$T/tr" <<S
$(hello 1)
$(info 2 f/good 0)
.
S
if [ "$(grep -c '^imds-region' "$T/fake.log")" = $((before + 1)) ] &&
    [ "$(resp 2 | grep -c '"state":"active"')" = 1 ]; then
    ok "the region from IMDS when nothing else gives one (one fetch, calls signed for it)"
else
    bad "the region from IMDS" "$(head -c 300 "$T/tr") / $(head -c 300 "$T/chain.err")"
fi
env "${NOAWS[@]}" -u AWS_REGION -u AWS_DEFAULT_REGION AWS_EC2_METADATA_DISABLED=true \
    AWS_ENDPOINT_URL_KMS="$FAKE_URL" AWS_SHARED_CREDENTIALS_FILE="$T/aws.creds" \
    AWS_CONFIG_FILE="$T/empty.config" python3 "$DRIVE" "$T/chain.err" "$PLUG" --key=f/good,1,good >"$T/tr" <<S
$(hello 1)
$(info 2 f/good 0)
.
S
expect_resp "IMDS disabled and no region elsewhere: invalid" 2 "$(err_of 2 invalid)"
expect_resp "... saying where a region may come from" 2 "no region: set AWS_REGION"
# a refresh that fails keeps the credentials in hand until they expire,
# then the request gets the refresh's error [KP-AWS-13]: credentials of
# 4 s (an Expiration in whole seconds: 3 to 4 s left), refreshed after
# half of that, asked for at 2.5 s and again at 4.5 s
: >"$T/chain.err"
env "${NOAWS[@]}" AWS_EC2_METADATA_DISABLED=true AWS_ENDPOINT_URL_KMS="$FAKE_URL" \
    AWS_CONTAINER_CREDENTIALS_FULL_URI="$FAKE_URL/creds-once" AWS_SHARED_CREDENTIALS_FILE="$T/aws.creds" \
    AWS_CONFIG_FILE="$T/aws.config" python3 "$DRIVE" "$T/chain.err" "$PLUG" --key=f/good,1,good >"$T/tr" <<S
$(hello 1)
% 2.5
$(info 2 f/good 0)
% 2.0
$(info 3 f/good 0)
.
S
expect_resp "a failed refresh keeps the unexpired credentials" 2 '"state":"active"'
expect_grep "... and says why on stderr" "$T/chain.err" "container endpoint (FULL_URI): HTTP 500"
expect_resp "once they expired, the refresh's error: unavailable" 3 "$(err_of 3 unavailable)"
if [ "$(grep -c '^sig-bad' "$T/fake.log")" -eq 0 ]; then ok "fake: every call signed with the chain's credentials verified"; else
    bad "fake: every call signed with the chain's credentials verified"; fi
for f in "$T/chain.err" "$T/stderr"; do
    if grep -q -e sfile -e sbase -e sproc -e fake-container-token -e fake-imds-token "$f"; then
        bad "no secret or token of the chain on the plugin's standard error"
    fi
done
ok "no secret or token of the chain on the plugin's standard error"

# ---- secrets ---------------------------------------------------------------
if grep -qi -- "$DEK_HEX" "$T/stderr" || grep -q -- "$DEK_B64" "$T/stderr"; then
    bad "the DEK never appears on the plugin's standard error"
else
    ok "the DEK never appears on the plugin's standard error ($(wc -c <"$T/stderr") bytes checked)"
fi
if grep -v '"dek":' "$T/tr.main" | grep -q -- "$DEK_B64"; then
    bad "the DEK appears in unwrap responses only"
else
    ok "the DEK appears in unwrap responses only"
fi
cli_finish kms-aws-plugin
