#!/usr/bin/env bash
# tests/cli_spec_decryptor_test.sh -- every envelope `keyshift encrypt` and
# `keyshift migrate --mode rewrap` write must open with tests/spec_decryptor.py,
# a second decrypter written from docs/format.md and docs/keyring.md alone.
#
# First the decrypter is checked against the documents' own vectors; then,
# with a plain and a passphrase-sealed keyring, it opens envelopes of format
# 1 and 2, both algorithms, several plaintext sizes, with and without
# --context and --purpose, under key versions 1, 2 (after a promotion) and
# 3 (after a rewrap); and it refuses (exit 65, nothing on stdout) a wrong
# context, tenant, purpose or passphrase, flipped bytes and unusable keys.
#
# Usage: KEYSHIFT=path/to/keyshift tests/cli_spec_decryptor_test.sh
set -eu

. "$(dirname "$0")/cli_lib.sh"
unset KEYSHIFT_PASSPHRASE KEYSHIFT_KEYRING
ROOT=$(cd "$(dirname "$0")/.." && pwd)
# Debian's interpreter, whose python3-cryptography and python3-argon2 the
# decrypter uses (tools/deps.sh), not whatever python3 comes first on PATH.
PY=/usr/bin/python3
SD="$ROOT/tests/spec_decryptor.py"
command -v sqlite3 >/dev/null || { echo "cli_spec_decryptor_test: sqlite3 is missing (tools/deps.sh)"; exit 1; }

# spec_open NAME ENVELOPE PLAINTEXT ARGS...: the decrypter prints exactly PLAINTEXT.
spec_open() {
    local name=$1 env=$2 pt=$3 rc=0
    shift 3
    "$PY" "$SD" "$@" "$env" >"$T/out" 2>"$T/err" || rc=$?
    if [ "$rc" -eq 0 ] && cmp -s "$T/out" "$pt"; then
        ok "$name"
    else
        bad "$name" "exit $rc; stderr: $(head -c 300 "$T/err")"
    fi
}

# spec_refuse NAME REASON ENVELOPE ARGS...: exit 65, nothing on stdout, and
# one line on stderr that holds REASON.
spec_refuse() {
    local name=$1 why=$2 env=$3 rc=0
    shift 3
    "$PY" "$SD" "$@" "$env" >"$T/out" 2>"$T/err" || rc=$?
    if [ "$rc" -eq 65 ] && [ ! -s "$T/out" ] && [ "$(wc -l <"$T/err")" -eq 1 ] && grep -q -- "$why" "$T/err"; then
        ok "$name (exit $rc)"
    else
        bad "$name" "exit $rc, want 65 and '$why'; stdout $(wc -c <"$T/out") bytes; stderr: $(head -c 300 "$T/err")"
    fi
}

# flip FILE OFFSET OUT: OUT is FILE with the low bit of byte OFFSET inverted.
flip() {
    local b
    cp "$1" "$3"
    b=$(dd if="$1" bs=1 skip="$2" count=1 status=none | od -An -tu1 | tr -d ' ')
    printf '%b' "\\x$(printf %02x $((b ^ 1)))" | dd of="$3" bs=1 seek="$2" conv=notrunc status=none
}

# json_num FILE NAME: the numeric value of "NAME" in the JSON of FILE.
json_num() { sed -n "s/.*\"$2\":\([0-9]*\).*/\1/p" "$1" | head -1; }

# ---- the documents' own vectors ----------------------------------------------------
rc=0
"$PY" "$SD" --self-test "$ROOT/docs/format.md" "$ROOT/docs/keyring.md" >"$T/out" 2>"$T/err" || rc=$?
if [ "$rc" -eq 0 ]; then ok "$(cat "$T/out")"; else bad "self-test against the vectors of format.md and keyring.md" "$(head -c 600 "$T/err")"; fi

# ---- keyrings, plaintexts, algorithms --------------------------------------------------
printf 'correct horse battery staple\n' >"$T/pw"
PLAIN=(--keyring "$T/plain")
SEALED=(--keyring "$T/sealed" --passphrase-file "$T/pw")
SIZES="0 1 100 5000 70000"
for n in $SIZES; do head -c "$n" /dev/urandom >"$T/pt.$n"; done
CTX='payments:42:card'
CTX2='tbl ü/9 {x}'

for ring in plain sealed; do
    if [ $ring = plain ]; then KA=("${PLAIN[@]}"); else KA=("${SEALED[@]}"); fi
    rc=0; "$KS" keys init "${KA[@]}" 2>"$T/err" || rc=$?
    if [ $rc -eq 0 ]; then ok "$ring: keys init"; else bad "$ring: keys init" "exit $rc: $(cat "$T/err")"; fi
    "$KS" keys create app/main "${KA[@]}" 2>/dev/null
    "$KS" keys create other/kek "${KA[@]}" 2>/dev/null
done
ALGS="xchacha20-poly1305"
rc=0; "$KS" encrypt --tenant acme --key-id app/main --algorithm aes-256-gcm "${PLAIN[@]}" </dev/null >/dev/null 2>&1 || rc=$?
if [ $rc -eq 0 ]; then
    ALGS="$ALGS aes-256-gcm"
elif [ $rc -eq 69 ]; then
    ok "aes-256-gcm unavailable on this machine: skipped"
else
    bad "encrypt with aes-256-gcm" "exit $rc"
fi

# seal_open RING KEYVERSION FORMAT ALG SIZE VARIANT: encrypt pt.SIZE with the
# CLI, then open it with the decrypter.  VARIANT says which options:
# none, ctx, purpose, ctx-purpose (format 2 only for the last two).
# The envelope is kept as $T/env.RING.KEYVERSION.FORMAT.ALG.SIZE.VARIANT.
seal_open() {
    local ring=$1 kv=$2 fmt=$3 alg=$4 size=$5 var=$6 rc=0 enc=() dec=()
    local ka=("${PLAIN[@]}") e="$T/env.$1.$2.$3.$4.$5.$6"
    [ "$ring" = sealed ] && ka=("${SEALED[@]}")
    case $var in
        none) [ "$fmt" = 2 ] && dec=(--purpose default) ;;
        ctx) enc=(--context "$CTX2"); dec=(--context "$CTX2" --tenant acme) ;;
        purpose) enc=(--purpose card); dec=(--purpose card) ;;
        ctx-purpose) enc=(--context "$CTX" --purpose card); dec=(--context "$CTX" --purpose card --tenant acme) ;;
    esac
    "$KS" encrypt --tenant acme --key-id app/main --format "$fmt" --algorithm "$alg" "${enc[@]}" "${ka[@]}" \
        <"$T/pt.$size" >"$e" 2>"$T/err" || rc=$?
    if [ $rc -ne 0 ]; then
        bad "$ring kv$kv v$fmt $alg $size $var: encrypt" "exit $rc: $(head -c 300 "$T/err")"
        return 0
    fi
    spec_open "$ring kv$kv v$fmt $alg ${size}B $var" "$e" "$T/pt.$size" "${dec[@]}" "${ka[@]}"
}

variants() { if [ "$1" = 1 ]; then echo "none ctx"; else echo "none ctx purpose ctx-purpose"; fi; }

for ring in plain sealed; do
    if [ $ring = plain ]; then KA=("${PLAIN[@]}"); else KA=("${SEALED[@]}"); fi
    # every combination under key version 1, the primary
    for fmt in 1 2; do for alg in $ALGS; do for size in $SIZES; do for var in $(variants $fmt); do
        seal_open $ring 1 $fmt "$alg" "$size" "$var"
    done; done; done; done
    # rotate: version 2 becomes the primary, version 1 decrypt-only
    "$KS" keys add-version app/main "${KA[@]}" >/dev/null 2>&1
    "$KS" keys promote app/main 2 "${KA[@]}" 2>/dev/null
    "$KS" keys set-state app/main 1 decrypt-only "${KA[@]}" 2>/dev/null
    for fmt in 1 2; do for alg in $ALGS; do for size in 0 100 70000; do
        var=ctx; [ $fmt = 2 ] && var=ctx-purpose
        seal_open $ring 2 $fmt "$alg" "$size" "$var"
    done; done; done
    # the version 1 envelopes still open now that version 1 is decrypt-only
    for fmt in 1 2; do
        var=ctx; [ $fmt = 2 ] && var=ctx-purpose
        e="$T/env.$ring.1.$fmt.xchacha20-poly1305.5000.$var"
        a=(--context "$CTX"); [ $var = ctx ] && a=(--context "$CTX2")
        [ $fmt = 2 ] && a+=(--purpose card)
        spec_open "$ring: v$fmt envelope under decrypt-only version 1" "$e" "$T/pt.5000" "${a[@]}" "${KA[@]}"
    done
done
if IN=/dev/null "$KS" inspect --json <"$T/env.plain.2.2.xchacha20-poly1305.100.ctx-purpose" | grep -q '"key_version":2'; then
    ok "envelopes after the promotion are under version 2"
else
    bad "envelopes after the promotion are under version 2" "inspect shows no key_version 2"
fi

# ---- rewrap with keyshift migrate -----------------------------------------------------
# Rows hold envelopes under versions 1 and 2 and their contexts; after a
# rewrap to version 3 every row must still open, with the same context.
D="$T/rewrap.db"
sqlite3 "$D" "CREATE TABLE pay (id INTEGER PRIMARY KEY, ctx TEXT, card BLOB)"
id=0
for kv in 1 2; do for fmt in 1 2; do for alg in $ALGS; do for size in 0 100 70000; do
    var=ctx; c=$CTX2; [ $fmt = 2 ] && { var=ctx-purpose; c=$CTX; }
    id=$((id + 1))
    sqlite3 "$D" "INSERT INTO pay VALUES ($id, '$c', readfile('$T/env.plain.$kv.$fmt.$alg.$size.$var'))"
    echo "$id $fmt $size" >>"$T/rows"
done; done; done; done
"$KS" keys add-version app/main "${PLAIN[@]}" >/dev/null 2>&1
"$KS" keys promote app/main 3 "${PLAIN[@]}" 2>/dev/null
rc=0
"$KS" migrate run --db "$D" --table pay --column card --mode rewrap --to-key app/main:3 --tenant acme \
    --context '{ctx}' --purpose card "${PLAIN[@]}" >"$T/out" 2>"$T/err" || rc=$?
if [ $rc -eq 0 ]; then ok "migrate --mode rewrap to version 3"; else bad "migrate --mode rewrap to version 3" "exit $rc: $(head -c 400 "$T/err")"; fi
while read -r id fmt size; do
    sqlite3 "$D" "SELECT writefile('$T/rw.kse', card) FROM pay WHERE id = $id" >/dev/null
    c=$(sqlite3 "$D" "SELECT ctx FROM pay WHERE id = $id")
    "$KS" inspect --json <"$T/rw.kse" >"$T/insp" 2>/dev/null || true
    if [ "$(json_num "$T/insp" key_version)" != 3 ]; then bad "rewrapped row $id is under version 3" "$(head -c 300 "$T/insp")"; continue; fi
    a=(--context "$c"); [ "$fmt" = 2 ] && a+=(--purpose card)
    spec_open "rewrapped row $id (v$fmt, ${size}B, key version 3)" "$T/rw.kse" "$T/pt.$size" "${a[@]}" "${PLAIN[@]}"
done <"$T/rows"

# ---- refusals ---------------------------------------------------------------------------
E2="$T/env.plain.1.2.xchacha20-poly1305.100.ctx-purpose"
E1="$T/env.plain.1.1.xchacha20-poly1305.100.ctx"
S2="$T/env.sealed.1.2.xchacha20-poly1305.100.ctx-purpose"
spec_refuse "v2: wrong context" "authentication failed" "$E2" --context 'payments:43:card' "${PLAIN[@]}"
spec_refuse "v2: empty context instead of one" "authentication failed" "$E2" "${PLAIN[@]}"
spec_refuse "v2: wrong tenant" "authentication failed" "$E2" --context "$CTX" --tenant acmf "${PLAIN[@]}"
spec_refuse "v2: wrong purpose" "authentication failed" "$E2" --context "$CTX" --purpose cvv "${PLAIN[@]}"
spec_refuse "v1: wrong context" "authentication failed" "$E1" --context "$CTX" "${PLAIN[@]}"
spec_refuse "v1: a purpose expected of a version 1 envelope" "authentication failed" "$E1" --context "$CTX2" --purpose default "${PLAIN[@]}"
printf 'correct horse battery staple\n\n' >"$T/pw.wrong"
spec_refuse "sealed: wrong passphrase (a second LF stays part of it)" "bad-passphrase" "$S2" --context "$CTX" --keyring "$T/sealed" --passphrase-file "$T/pw.wrong"
spec_refuse "sealed: no passphrase" "bad-passphrase" "$S2" --context "$CTX" --keyring "$T/sealed"
spec_refuse "plain: a passphrase given" "bad-passphrase" "$E2" --context "$CTX" --keyring "$T/plain" --passphrase-file "$T/pw"
spec_refuse "another keyring's KEK of the same key version" "authentication failed" "$S2" --context "$CTX" "${PLAIN[@]}"
for e in "$E1" "$E2"; do
    a=(--context "$CTX2"); [ "$e" = "$E2" ] && a=(--context "$CTX" --purpose card)
    "$KS" inspect --json <"$e" >"$T/insp"
    hl=$(json_num "$T/insp" header_len)
    len=$(stat -c %s "$e")
    v=v1; [ "$e" = "$E2" ] && v=v2
    # the prefix, tenant, key_id, wrapped_dek, the last header byte (nonce or
    # commitment), the ciphertext and the tag
    for off in 0 3 8 20 40 60 $((hl - 1)) $((hl + 4)) $((len - 1)); do
        flip "$e" "$off" "$T/flipped"
        spec_refuse "$v: byte $off of $len flipped" "invalid envelope\|authentication failed\|not-found" "$T/flipped" "${a[@]}" "${PLAIN[@]}"
    done
    head -c $((len - 1)) "$e" >"$T/short"
    spec_refuse "$v: last byte cut" "invalid envelope: truncated" "$T/short" "${a[@]}" "${PLAIN[@]}"
    { cat "$e"; printf '\0'; } >"$T/long"
    spec_refuse "$v: a byte appended" "invalid envelope: unknown-field" "$T/long" "${a[@]}" "${PLAIN[@]}"
done
cp "$T/plain" "$T/open" && chmod 0640 "$T/open"
spec_refuse "a keyring readable by the group ([K-FILE-1])" "insecure" "$E2" --context "$CTX" --purpose card --keyring "$T/open"
ln -s "$T/plain" "$T/link"
spec_refuse "a keyring behind a symbolic link ([K-FILE-1])" "insecure: the keyring is a symbolic link" "$E2" --context "$CTX" --purpose card --keyring "$T/link"
# key states: disabled and destroyed versions do not unwrap
cp "$T/plain" "$T/states"
"$KS" keys set-state app/main 1 disabled --keyring "$T/states" 2>/dev/null
spec_refuse "v2: key version disabled" "denied" "$E2" --context "$CTX" --keyring "$T/states"
"$KS" keys set-state app/main 1 destroyed --force --reason test --keyring "$T/states" 2>/dev/null
spec_refuse "v2: key version destroyed" "revoked" "$E2" --context "$CTX" --keyring "$T/states"

cli_finish cli-spec-decryptor
