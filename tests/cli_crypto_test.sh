#!/usr/bin/env bash
# tests/cli_crypto_test.sh -- end-to-end tests of `keyshift keys`,
# `encrypt` and `decrypt` with a real keyring file: round trips, fail-closed
# behaviour, key states, permissions, passphrases, exit codes, and that no
# secret reaches stdout or stderr.
#
# Usage: KEYSHIFT=path/to/keyshift tests/cli_crypto_test.sh
set -u

. "$(dirname "$0")/cli_lib.sh"
unset KEYSHIFT_PASSPHRASE
export KEYSHIFT_KEYRING="$T/keyring"
IN=/dev/null

printf 'card 4111-1111-1111-1111 exp 12/29' >"$T/pt"

# ---- keyring lifecycle --------------------------------------------------------
run "keys init" 0 "$KS" keys init
if [ "$(stat -c %a "$T/keyring")" = 600 ]; then ok "keyring created 0600"; else bad "keyring mode" "$(stat -c %a "$T/keyring")"; fi
run "keys init twice is refused" 73 "$KS" keys init
# a missing directory whose parent exists is made 0700; a deeper one is named
run "keys init in a missing directory" 0 "$KS" keys init --keyring "$T/newdir/keyring"
if [ "$(stat -c %a "$T/newdir")" = 700 ]; then ok "its directory created 0700"; else bad "directory mode" "$(stat -c %a "$T/newdir")"; fi
expect_grep "init: says it made the directory" "$T/err" "created directory $T/newdir (mode 0700)"
run "keys init two directories deep" 73 "$KS" keys init --keyring "$T/no/such/keyring"
expect_grep "init: names the missing directory" "$T/err" "its directory $T/no/such does not exist and cannot be created (No such file or directory); create it first: mkdir -p -m 700 $T/no/such"
run "keys create" 0 "$KS" keys create payments/kek
run "keys create twice is refused" 65 "$KS" keys create payments/kek
run "keys create with a bad key id" 64 "$KS" keys create 'bad key'
run "keys list" 0 "$KS" keys list
expect_grep "list shows version 1, active, primary" "$T/out" "payments/kek *1 *active *\*"
run "keys list --json" 0 "$KS" keys list --json
expect_grep "list --json" "$T/out" '{"keys":\[{"key_id":"payments/kek","primary":1,"versions":\[{"version":1,"state":"active","primary":true'

# ---- round trips -----------------------------------------------------------------
for fmt in 1 2; do
    for alg in xchacha20-poly1305 aes-256-gcm; do
        purpose=(); [ $fmt = 2 ] && purpose=(--purpose card)
        IN="$T/pt" run "encrypt v$fmt $alg" 0 "$KS" encrypt --tenant acme --key-id payments/kek \
            --context payments:42:card --format $fmt --algorithm $alg "${purpose[@]}"
        cp "$T/out" "$T/env.$fmt.$alg"
        expect_empty "encrypt v$fmt $alg: nothing on stderr" "$T/err"
        IN="$T/env.$fmt.$alg" run "decrypt v$fmt $alg" 0 "$KS" decrypt --context payments:42:card
        expect_same "decrypt v$fmt $alg gives the plaintext" "$T/out" "$T/pt"
        if grep -q -F "4111-1111" "$T/env.$fmt.$alg"; then bad "v$fmt $alg envelope holds no plaintext"; else ok "v$fmt $alg envelope holds no plaintext"; fi
    done
done
ENV="$T/env.2.xchacha20-poly1305"
IN="$ENV" run "inspect a sealed envelope" 0 "$KS" inspect --json
expect_grep "default is v2 xchacha, purpose card" "$T/out" '"version":2,"algorithm":"xchacha20-poly1305","tenant":"acme","key_id":"payments/kek","key_version":1'
: >"$T/empty"
IN="$T/empty" run "encrypt an empty plaintext" 0 "$KS" encrypt --tenant acme --key-id payments/kek
cp "$T/out" "$T/env.empty"
IN="$T/env.empty" run "decrypt an empty plaintext" 0 "$KS" decrypt
expect_empty "empty plaintext round trip" "$T/out"

# ---- fail closed ----------------------------------------------------------------------
IN="$ENV" run "wrong context" 65 "$KS" decrypt --context payments:43:card
expect_empty "wrong context: nothing on stdout" "$T/out"
expect_grep "wrong context: one message" "$T/err" "cannot decrypt: authentication failed"
IN="$ENV" run "wrong purpose" 65 "$KS" decrypt --context payments:42:card --purpose ssn
expect_empty "wrong purpose: nothing on stdout" "$T/out"
IN="$ENV" run "wrong tenant" 65 "$KS" decrypt --context payments:42:card --tenant other
expect_grep "wrong tenant: the same message" "$T/err" "cannot decrypt: authentication failed"
IN="$ENV" run "right tenant and purpose" 0 "$KS" decrypt --context payments:42:card --tenant acme --purpose card
# docs/format.md [F-CRYPTO-CTX-1]: decrypt without --context uses the empty
# context, which is not the writer's; a context is bytes, UTF-8 included.
IN="$ENV" run "decrypt without --context: the empty context, auth-failed" 65 "$KS" decrypt
expect_grep "no --context: the same message" "$T/err" "cannot decrypt: authentication failed"
IN="$T/pt" run "encrypt with a UTF-8 context" 0 "$KS" encrypt --tenant acme --key-id payments/kek --context 'payments:42:été'
cp "$T/out" "$T/env.utf8"
IN="$T/env.utf8" run "decrypt with the same UTF-8 context" 0 "$KS" decrypt --context 'payments:42:été'
expect_same "UTF-8 context round trip" "$T/out" "$T/pt"
IN="$T/env.utf8" run "the same letters decomposed (e + U+0301) do not open it" 65 "$KS" decrypt --context $'payments:42:e\xcc\x81te\xcc\x81'
size=$(stat -c %s "$ENV")
cp "$ENV" "$T/tampered"; printf '\x01' | dd of="$T/tampered" bs=1 seek=$((size - 1)) conv=notrunc status=none
IN="$T/tampered" run "tampered tag" 65 "$KS" decrypt --context payments:42:card
expect_empty "tampered: nothing on stdout" "$T/out"
expect_grep "tampered: the same message" "$T/err" "cannot decrypt: authentication failed"
printf 'not an envelope' >"$T/garbage"
IN="$T/garbage" run "garbage" 65 "$KS" decrypt
expect_grep "garbage: invalid envelope" "$T/err" "invalid envelope: bad-magic at byte 0"
head -c 1048577 /dev/zero >"$T/big"
IN="$T/big" run "plaintext over 1 MiB is refused" 65 "$KS" encrypt --tenant acme --key-id payments/kek
IN="$T/pt" run "unknown key" 77 "$KS" encrypt --tenant acme --key-id nosuch/kek

# ---- rotation and key states ---------------------------------------------------------
run "add-version prints the new version" 0 "$KS" keys add-version payments/kek
expect_grep "add-version: 2" "$T/out" "^2$"
run "promote 2" 0 "$KS" keys promote payments/kek 2
IN="$T/pt" run "encrypt under the new primary" 0 "$KS" encrypt --tenant acme --key-id payments/kek --context c
cp "$T/out" "$T/env.v2key"
IN="$T/env.v2key" run "inspect the new envelope" 0 "$KS" inspect --json
expect_grep "new envelope uses key version 2" "$T/out" '"key_version":2'
IN="$ENV" run "old envelope still opens" 0 "$KS" decrypt --context payments:42:card
run "decrypt-only version 1" 0 "$KS" keys set-state payments/kek 1 decrypt-only
IN="$ENV" run "decrypt-only still opens" 0 "$KS" decrypt --context payments:42:card
IN="$T/pt" run "decrypt-only refuses new wraps" 77 "$KS" encrypt --tenant acme --key-id payments/kek --key-version 1
run "disable version 1" 0 "$KS" keys set-state payments/kek 1 disabled
IN="$ENV" run "disabled version refuses to open" 77 "$KS" decrypt --context payments:42:card
expect_empty "disabled: nothing on stdout" "$T/out"
run "re-enable version 1" 0 "$KS" keys set-state payments/kek 1 decrypt-only
IN="$ENV" run "re-enabled opens again" 0 "$KS" decrypt --context payments:42:card
run "the primary cannot be disabled" 65 "$KS" keys set-state payments/kek 2 disabled
run "--reason without --force" 64 "$KS" keys set-state payments/kek 1 destroyed --reason "no force"
expect_grep "--reason without --force: a sentence" "$T/err" "keys: --reason was given without --force; it only explains a forced destroy"
run "destroy without --db: refused" 64 "$KS" keys set-state payments/kek 1 destroyed
expect_grep "no --db: a sentence" "$T/err" "payments/kek:1 was not destroyed, because without --db nothing that references it can be checked"
run "destroy version 1" 0 "$KS" keys set-state payments/kek 1 destroyed --force --reason "crypto test: no database"
expect_grep "forced: the warning is a sentence" "$T/err" "warning: the rows and live readers referencing payments/kek:1 were not checked, and its destroy was forced"
IN="$ENV" run "destroyed version refuses to open" 77 "$KS" decrypt --context payments:42:card
run "destroyed is final" 65 "$KS" keys set-state payments/kek 1 active
run "set-state of a missing version" 77 "$KS" keys set-state payments/kek 9 disabled
run "bad state name" 64 "$KS" keys set-state payments/kek 1 sleepy
IN="$T/env.v2key" run "version 2 envelope still opens" 0 "$KS" decrypt --context c

# ---- keyring safety --------------------------------------------------------------------
chmod 644 "$KEYSHIFT_KEYRING"
run "group/other-readable keyring refused" 78 "$KS" keys list
expect_grep "insecure keyring: says the mode and how to fix it" "$T/err" "has mode 0644, which would let group or others read or change its keys; run: chmod 600 $KEYSHIFT_KEYRING"
chmod 600 "$KEYSHIFT_KEYRING"
# [K-FILE-1] each refusal says what is actually wrong, and only the mode
# is answered with chmod
ln -s "$KEYSHIFT_KEYRING" "$T/link.keyring"
run "keyring: a symbolic link is refused" 78 "$KS" keys list --keyring "$T/link.keyring"
expect_grep "symlink: says it is one" "$T/err" "keyring $T/link.keyring is a symbolic link"
expect_grep "symlink: says what to do on Kubernetes" "$T/err" "name DIR/..data/NAME instead"
if grep -q chmod "$T/err"; then bad "symlink: no chmod advice"; else ok "symlink: no chmod advice"; fi
mkdir -m 700 "$T/dir.keyring"
run "keyring: a directory is refused" 78 "$KS" keys list --keyring "$T/dir.keyring"
expect_grep "directory: says it is one" "$T/err" "keyring $T/dir.keyring is a directory; name a regular file"
cp /etc/passwd "$T/passwd" && chmod 644 "$T/passwd"
run "keyring: another kind of file" 78 "$KS" keys list --keyring "$T/passwd"
expect_grep "not a keyring: says so, not chmod" "$T/err" "keyring $T/passwd is not a keyring (it does not start with \"KSK\") and has mode 0644; name the right file"
if [ "$(id -u)" = 0 ]; then
    cp -p "$KEYSHIFT_KEYRING" "$T/theirs.keyring" && chown 65534 "$T/theirs.keyring"
    run "keyring: another user's is refused" 78 "$KS" keys list --keyring "$T/theirs.keyring"
    expect_grep "owner: says whose it is" "$T/err" "keyring $T/theirs.keyring belongs to uid 65534, not to you (uid 0) or root"
fi
cp "$KEYSHIFT_KEYRING" "$T/cut"; truncate -s 20 "$T/cut"
run "truncated keyring refused" 78 "$KS" keys list --keyring "$T/cut"
run "missing keyring" 78 "$KS" keys list --keyring "$T/nope"
run "no keyring given" 64 env -u KEYSHIFT_KEYRING "$KS" keys list

# ---- passphrase-sealed keyring -------------------------------------------------------
export KEYSHIFT_KEYRING="$T/sealed"
printf 'correct horse battery staple\n' >"$T/passfile"
KEYSHIFT_PASSPHRASE='correct horse battery staple' run "init a sealed keyring (env)" 0 "$KS" keys init
run "sealed keyring without a passphrase" 78 "$KS" keys list
KEYSHIFT_PASSPHRASE=wrong run "sealed keyring, wrong passphrase" 78 "$KS" keys list
run "passphrase file works" 0 "$KS" keys create k1 --passphrase-file "$T/passfile"
IN="$T/pt" run "encrypt with a sealed keyring" 0 "$KS" encrypt --tenant t --key-id k1 --passphrase-file "$T/passfile"
cp "$T/out" "$T/env.sealed"
IN="$T/env.sealed" KEYSHIFT_PASSPHRASE='correct horse battery staple' run "decrypt with a sealed keyring" 0 "$KS" decrypt
expect_same "sealed keyring round trip" "$T/out" "$T/pt"
if grep -q -F "k1" "$KEYSHIFT_KEYRING"; then bad "sealed keyring hides key ids"; else ok "sealed keyring hides key ids"; fi

# docs/keyring.md [K-SEAL-7]: a passphrase file, or KEYSHIFT_PASSPHRASE,
# loses exactly one trailing LF and nothing else.
printf 'pw' >"$T/pw"; printf 'pw\n' >"$T/pw.lf"; printf 'pw\n\n' >"$T/pw.lflf"
printf 'pw\r\n' >"$T/pw.crlf"; printf '\n' >"$T/pw.empty"
run "init a keyring sealed with 'pw'" 0 "$KS" keys init --keyring "$T/pw.ring" --passphrase-file "$T/pw"
run "a file 'pw' opens it" 0 "$KS" keys list --keyring "$T/pw.ring" --passphrase-file "$T/pw"
run "a file 'pw\\n' opens it: one LF is stripped" 0 "$KS" keys list --keyring "$T/pw.ring" --passphrase-file "$T/pw.lf"
KEYSHIFT_PASSPHRASE=$'pw\n' run "KEYSHIFT_PASSPHRASE 'pw\\n' opens it too" 0 "$KS" keys list --keyring "$T/pw.ring"
run "a file 'pw\\n\\n' does not: only one LF is stripped" 78 "$KS" keys list --keyring "$T/pw.ring" --passphrase-file "$T/pw.lflf"
expect_grep "'pw\\n\\n': wrong passphrase" "$T/err" "wrong or missing passphrase"
run "a file 'pw\\r\\n' does not: the CR stays" 78 "$KS" keys list --keyring "$T/pw.ring" --passphrase-file "$T/pw.crlf"
expect_grep "'pw\\r\\n': wrong passphrase" "$T/err" "wrong or missing passphrase"
run "init a keyring from a file 'pw\\r\\n'" 0 "$KS" keys init --keyring "$T/pwcr.ring" --passphrase-file "$T/pw.crlf"
KEYSHIFT_PASSPHRASE=$'pw\r' run "its passphrase is 'pw\\r'" 0 "$KS" keys list --keyring "$T/pwcr.ring"
run "and 'pw' does not open it" 78 "$KS" keys list --keyring "$T/pwcr.ring" --passphrase-file "$T/pw"
run "init from a file 'pw\\n\\n'" 0 "$KS" keys init --keyring "$T/pwlf.ring" --passphrase-file "$T/pw.lflf"
KEYSHIFT_PASSPHRASE=$'pw\n\n' run "KEYSHIFT_PASSPHRASE 'pw\\n\\n' is the same passphrase" 0 "$KS" keys list --keyring "$T/pwlf.ring"
run "a file 'pw\\n' does not open it" 78 "$KS" keys list --keyring "$T/pwlf.ring" --passphrase-file "$T/pw.lf"
run "a file of one LF is an empty passphrase, refused" 78 "$KS" keys init --keyring "$T/pwe.ring" --passphrase-file "$T/pw.empty"
expect_grep "empty passphrase: said so" "$T/err" "the passphrase is empty"
KEYSHIFT_PASSPHRASE= run "KEYSHIFT_PASSPHRASE set but empty is given, and refused" 78 "$KS" keys init --keyring "$T/pwv.ring"
expect_grep "empty variable: said so" "$T/err" "the passphrase is empty"
KEYSHIFT_PASSPHRASE=$'\n' run "KEYSHIFT_PASSPHRASE of one LF is refused too" 78 "$KS" keys init --keyring "$T/pwv.ring"
if [ -e "$T/pwv.ring" ]; then bad "an empty KEYSHIFT_PASSPHRASE wrote no keyring"; else ok "an empty KEYSHIFT_PASSPHRASE wrote no keyring"; fi

# ---- usage ----------------------------------------------------------------------------
run "encrypt without --tenant" 64 "$KS" encrypt --key-id k1
run "encrypt bad algorithm" 64 "$KS" encrypt --tenant t --key-id k1 --algorithm rot13
run "encrypt bad format" 64 "$KS" encrypt --tenant t --key-id k1 --format 3
run "encrypt v1 with a purpose" 64 "$KS" encrypt --tenant t --key-id k1 --format 1 --purpose p
IN="$T/pt" run "encrypt bad tenant" 64 "$KS" encrypt --tenant 'a b' --key-id k1 --passphrase-file "$T/passfile"
run "keys without an action" 64 "$KS" keys
run "keys unknown action" 64 "$KS" keys frob
for c in keys encrypt decrypt; do
    run "$c --help" 0 "$KS" $c --help
    expect_grep "$c --help has EXIT STATUS" "$T/out" "EXIT STATUS"
done
# docs/kms-plugin.md [KP-BRIDGE-13]: the statuses of a plugin's answers.
for c in encrypt decrypt; do
    "$KS" $c --help >"$T/out" 2>&1
    expect_grep "$c --help: 64 for a plugin answering invalid" "$T/out" "64 usage, or a KMS plugin answering .invalid'"
    expect_grep "$c --help: 78 for a plugin answering integrity" "$T/out" "answers .integrity'"
done

# ---- no secret in any output ---------------------------------------------------------
# Everything the tool printed to stderr in this run, and every envelope,
# must be free of the plaintext.
export KEYSHIFT_KEYRING="$T/keyring"
IN="$T/pt" "$KS" encrypt --tenant acme --key-id payments/kek >"$T/e1" 2>"$T/e1.err"
"$KS" keys list --json >"$T/l1" 2>&1
"$KS" decrypt --context wrong <"$T/e1" >"$T/d1" 2>"$T/d1.err"
if cat "$T/e1" "$T/e1.err" "$T/l1" "$T/d1" "$T/d1.err" | grep -q -F "4111-1111"; then
    bad "no plaintext in any output but decrypt's"
else
    ok "no plaintext in any output but decrypt's"
fi

# The KEK itself: in a plain keyring holding one key "k" with one version,
# the material is the 32 bytes at offset 38 (docs/keyring.md section 4:
# 5 prefix + 4 count + 4 record_len + 2 id_len + 1 id + 4 versions +
# 4 primary + 4 number + 1 state + 8 created + 1 material_len).
export KEYSHIFT_KEYRING="$T/k3"
"$KS" keys init 2>/dev/null && "$KS" keys create k 2>/dev/null
kek=$(dd if="$T/k3" bs=1 skip=38 count=32 status=none | od -An -tx1 | tr -d ' \n')
IN="$T/pt" "$KS" encrypt --tenant acme --key-id k >"$T/e3" 2>"$T/e3.err"
"$KS" decrypt <"$T/e3" >"$T/d3" 2>"$T/d3.err"
"$KS" keys list --json >"$T/l3" 2>"$T/l3.err"
"$KS" decrypt --context bad <"$T/e3" >"$T/d4" 2>"$T/d4.err"
all_hex=$(cat "$T/e3" "$T/e3.err" "$T/d3" "$T/d3.err" "$T/l3" "$T/l3.err" "$T/d4" "$T/d4.err" | od -An -tx1 | tr -d ' \n')
if [ ${#kek} -eq 64 ] && [[ "$all_hex" != *"$kek"* ]] && ! grep -q -i -F "$kek" "$T/l3" "$T/e3.err" "$T/d4.err"; then
    ok "the KEK appears in no output, raw or as hex"
else
    bad "the KEK appears in no output, raw or as hex" "kek=$kek"
fi

# ---- concurrent keys commands ------------------------------------------------------
# Eight processes add versions to one key at once: the lock and re-read
# must keep every update, numbered 2..9 with no gap or repeat.
for i in 1 2 3 4 5 6 7 8; do "$KS" keys add-version k >"$T/av.$i" 2>/dev/null & done
wait
got=$(cat "$T"/av.* | sort -n | tr '\n' ' ')
if [ "$got" = "2 3 4 5 6 7 8 9 " ]; then ok "8 concurrent add-version: versions 2..9"; else bad "8 concurrent add-version" "got: $got"; fi
run "keyring still valid after concurrent changes" 0 "$KS" keys list --json
expect_grep "all nine versions listed" "$T/out" '"version":9,'

# ---- nothing freed unwiped ---------------------------------------------------------
# The release build, with tests/free_scan.c preloaded: no heap block that
# held the plaintext (32 KB read from standard input, grown past its first
# block) or the passphrase (4096 bytes from a file) is given back unwiped,
# realloc's moves included.
REL=${KEYSHIFT_REL:-build/bin/keyshift}
if cc -shared -fPIC -O1 -o "$T/free_scan.so" "$(dirname "$0")/free_scan.c" 2>"$T/cc.err" && [ -x "$REL" ]; then
    MARK=KS-WIPE-MARKER
    run "a keyring for the scan" 0 "$REL" keys init --keyring "$T/scan.keyring"
    run "a key for the scan" 0 "$REL" keys create scan/k --keyring "$T/scan.keyring"
    python3 -c "import sys; sys.stdout.write(('$MARK-0123456789-' * 1400)[:32768])" >"$T/big.pt"
    IN="$T/big.pt" run "encrypt 32 KB under the scan" 0 env FREE_SCAN_MARKER=$MARK LD_PRELOAD="$T/free_scan.so" \
        "$REL" encrypt --tenant acme --key-id scan/k --keyring "$T/scan.keyring"
    cp "$T/out" "$T/big.env"
    if grep -q free-scan "$T/err"; then bad "encrypt: no block held the plaintext when freed" "$(head -3 "$T/err")"; else ok "encrypt: no block held the plaintext when freed"; fi
    IN="$T/big.env" run "decrypt it under the scan" 0 env FREE_SCAN_MARKER=$MARK LD_PRELOAD="$T/free_scan.so" \
        "$REL" decrypt --tenant acme --keyring "$T/scan.keyring"
    expect_same "the 32 KB round trip" "$T/big.pt" "$T/out"
    python3 -c "import sys; sys.stdout.write(('$MARK-pass-' * 300)[:4095] + chr(10))" >"$T/long.pass"
    chmod 600 "$T/long.pass"
    run "init a keyring sealed by a 4095-byte passphrase" 0 "$REL" keys init --keyring "$T/sealed4k" --passphrase-file "$T/long.pass"
    run "open it under the scan" 0 env FREE_SCAN_MARKER=$MARK LD_PRELOAD="$T/free_scan.so" \
        "$REL" keys list --keyring "$T/sealed4k" --passphrase-file "$T/long.pass"
    if grep -q free-scan "$T/err"; then bad "passphrase: no block held it when freed" "$(head -3 "$T/err")"; else ok "passphrase: no block held it when freed"; fi
else
    bad "the free scan builds (cc, and the release build $REL)" "$(head -c 300 "$T/cc.err")"
fi

cli_finish cli-crypto
