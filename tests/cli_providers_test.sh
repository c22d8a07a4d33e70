#!/usr/bin/env bash
# tests/cli_providers_test.sh -- the provider registry from the command
# line (docs/providers.md): --providers and KEYSHIFT_PROVIDERS on the key
# commands, encrypt, decrypt and migrate; keyshift providers list|check;
# refusals of a bad or unsafe registry; and a rewrap that moves a column's
# DEKs from one provider to another without touching the ciphertext.
#
# Two local keyrings stand for two providers here; tests/cli_pkcs11_test.sh
# does the same with a SoftHSM2 token.  A KMS plugin provider is listed and
# checked here too.
set -u
. "$(dirname "$0")/cli_lib.sh"

sql() { sqlite3 -batch "$1" "$2"; }
unset KEYSHIFT_KEYRING KEYSHIFT_PASSPHRASE KEYSHIFT_PROVIDERS

A="$T/a.keyring"
B="$T/b.keyring"
REG="$T/providers"
run "init keyring a" 0 "$KS" keys init --keyring "$A"
printf 'pw-b\n' >"$T/b.pass"
chmod 600 "$T/b.pass"
run "init keyring b (sealed)" 0 "$KS" keys init --keyring "$B" --passphrase-file "$T/b.pass"
cat >"$REG" <<EOF
keyshift-providers 1

# team keys in a plain keyring
provider alpha
  type local
  keyring $A
  serve-prefix a/

provider beta
  type local
  keyring $B
  passphrase-file $T/b.pass
  serve b/main
  serve-prefix a/moved/
EOF
chmod 600 "$REG"

# ---- keys through the registry: each key in the provider that serves it ----
run "keys create a/k1 (routed to alpha)" 0 "$KS" keys create a/k1 --providers "$REG"
run "keys create b/main (routed to beta)" 0 "$KS" keys create b/main --providers "$REG"
run "keys create a/moved/k (longest prefix: beta)" 0 "$KS" keys create a/moved/k --providers "$REG"
run "keys create c/x: nothing serves it" 77 "$KS" keys create c/x --providers "$REG"
expect_grep "unserved key: message" "$T/err" "c/x"
run "alpha holds a/k1" 0 "$KS" keys list --keyring "$A"
expect_grep "a/k1 in keyring a" "$T/out" "^a/k1 "
if grep -q "b/main" "$T/out"; then bad "b/main not in keyring a"; else ok "b/main not in keyring a"; fi
run "beta holds b/main and a/moved/k" 0 "$KS" keys list --keyring "$B" --passphrase-file "$T/b.pass"
expect_grep "b/main in keyring b" "$T/out" "^b/main "
expect_grep "a/moved/k in keyring b" "$T/out" "^a/moved/k "
run "keys list --providers: every provider's keys" 0 "$KS" keys list --providers "$REG" --json
expect_grep "merged list: a/k1" "$T/out" '"key_id":"a/k1","primary":1'
expect_grep "merged list: a/moved/k" "$T/out" '"key_id":"a/moved/k","primary":1'
expect_grep "merged list: b/main" "$T/out" '"key_id":"b/main","primary":1'
run "KEYSHIFT_PROVIDERS works as --providers" 0 env KEYSHIFT_PROVIDERS="$REG" "$KS" keys add-version a/k1
expect_eq "add-version through the environment prints 2" "$T/out" "2"
run "--keyring beats KEYSHIFT_PROVIDERS" 0 env KEYSHIFT_PROVIDERS="$REG" "$KS" keys list --keyring "$A"
run "--keyring and --providers together" 64 "$KS" keys list --keyring "$A" --providers "$REG"
run "--passphrase-file with --providers" 64 "$KS" keys list --providers "$REG" --passphrase-file "$T/b.pass"
run "keys init with --providers" 64 "$KS" keys init --providers "$REG"

# ---- encrypt and decrypt through the registry ----------------------------
printf 'routed secret' >"$T/pt"
IN="$T/pt" run "encrypt under a/k1" 0 "$KS" encrypt --tenant acme --key-id a/k1 --context row:1 --providers "$REG"
cp "$T/out" "$T/env1"
IN="$T/env1" run "decrypt through the registry" 0 "$KS" decrypt --context row:1 --providers "$REG"
expect_same "registry decrypt gives the plaintext" "$T/out" "$T/pt"
IN="$T/env1" run "decrypt with keyring a alone" 0 "$KS" decrypt --context row:1 --keyring "$A"
expect_same "keyring decrypt gives the plaintext" "$T/out" "$T/pt"
IN="$T/pt" run "encrypt under an unserved key" 77 "$KS" encrypt --tenant acme --key-id c/x --providers "$REG"
expect_empty "unserved encrypt writes nothing" "$T/out"

# ---- providers list and check ---------------------------------------------
run "providers list" 0 "$KS" providers list --providers "$REG"
expect_grep "list: alpha" "$T/out" "^alpha (local)"
expect_grep "list: beta's exact serve" "$T/out" "serve  *b/main"
run "providers list --json" 0 "$KS" providers list --providers "$REG" --json
expect_grep "list --json: beta" "$T/out" '"name":"beta","type":"local"'
if grep -q "pw-b" "$T/out"; then bad "list shows no secret"; else ok "list shows no secret"; fi
run "providers check --json" 0 "$KS" providers check --providers "$REG" --json
expect_grep "check: alpha ok with its key" "$T/out" '"name":"alpha","type":"local","status":"ok","keys":1,"versions":2'
expect_grep "check: beta ok with its keys" "$T/out" '"name":"beta","type":"local","status":"ok","keys":2,"versions":2'
run "providers: no registry" 64 "$KS" providers list
run "providers: unknown action" 64 "$KS" providers frob --providers "$REG"
run "providers --help" 0 "$KS" providers --help
expect_grep "providers manual" "$T/out" "^EXIT STATUS"

# ---- a registry that must be refused ---------------------------------------
cp "$REG" "$T/open.reg"
chmod 620 "$T/open.reg"
run "group-writable registry" 78 "$KS" keys list --providers "$T/open.reg"
expect_grep "group-writable: says why" "$T/err" "has mode 0620, which would let group or others choose which provider serves a key; run: chmod go-w $T/open.reg"
printf 'keyshift-providers 1\nprovider x\n  type local\n  keyring %s\n  serve-prefix a/\n  colour blue\n' "$A" >"$T/bad.reg"
chmod 600 "$T/bad.reg"
run "unknown setting" 78 "$KS" keys list --providers "$T/bad.reg"
expect_grep "unknown setting: line and column" "$T/err" "unknown-field at line 6, column 3"
run "providers check: unknown setting" 78 "$KS" providers check --providers "$T/bad.reg"
run "missing registry" 78 "$KS" keys list --providers "$T/nosuch.reg"
sed "s|passphrase-file $T/b.pass|passphrase-file $T/nosuch.pass|" "$REG" >"$T/nopass.reg"
chmod 600 "$T/nopass.reg"
run "a provider's passphrase file missing" 78 "$KS" keys list --providers "$T/nopass.reg"
expect_grep "names the provider" "$T/err" "provider beta"
run "check: alpha ok, beta failed" 78 "$KS" providers check --providers "$T/nopass.reg" --json
expect_grep "check: first provider ok" "$T/out" '"name":"alpha","type":"local","status":"ok"'
expect_grep "check: second provider failed" "$T/out" '"name":"beta","type":"local","status":"failed"'
printf 'pw-wrong\n' >"$T/wrong.pass"
chmod 600 "$T/wrong.pass"
sed "s|passphrase-file $T/b.pass|passphrase-file $T/wrong.pass|" "$REG" >"$T/wrong.reg"
chmod 600 "$T/wrong.reg"
run "a provider's wrong passphrase" 78 "$KS" keys list --providers "$T/wrong.reg"
cp "$A" "$T/open.keyring" && chmod 644 "$T/open.keyring"
sed "s|keyring $A|keyring $T/open.keyring|" "$REG" >"$T/openkr.reg"
chmod 600 "$T/openkr.reg"
run "a provider's keyring readable by others" 78 "$KS" keys list --providers "$T/openkr.reg"
expect_grep "open keyring: names the provider" "$T/err" "provider alpha: cannot use its keyring: insecure"
expect_grep "open keyring: says the mode and the fix" "$T/err" "keyring $T/open.keyring has mode 0644, which would let group or others read or change its keys; run: chmod 600 $T/open.keyring"

# ---- a KMS plugin provider (docs/providers.md [P-PLUGIN-1..9]) ----------------
PREG="$T/plugin.reg"
cat >"$PREG" <<EOF
keyshift-providers 1
provider alpha
  type local
  keyring $A
  serve-prefix a/

provider kms
  type plugin
  command example
  arg --region eu-west-1
  arg two words
  rate-limit 0
  retries 1
  env KEYSHIFT_KMS_EXAMPLE_KEYS
  serve-prefix k/
EOF
chmod 600 "$PREG"
run "providers list: a plugin provider" 0 "$KS" providers list --providers "$PREG"
expect_grep "list: kms is a plugin" "$T/out" "^kms (plugin)"
expect_grep "list: its command" "$T/out" "command  *example"
expect_grep "list: an arg with a space, whole" "$T/out" "arg  *two words$"
run "providers list --json: a plugin provider" 0 "$KS" providers list --providers "$PREG" --json
expect_grep "list --json: settings and args in order" "$T/out" \
    '"name":"kms","type":"plugin","settings":{"command":"example","retries":"1","rate-limit":"0"},"args":\["--region eu-west-1","two words"\]'
expect_grep "list --json: the env lines of a plugin" "$T/out" '"args":\["--region eu-west-1","two words"\],"env":\["KEYSHIFT_KMS_EXAMPLE_KEYS"\],"env_prefixes":\[\]'
printf 'keyshift-providers 1\nprovider kms\n  type plugin\n  command aws\n  keyring /k\n  serve k\n' >"$T/badplug.reg"
chmod 600 "$T/badplug.reg"
run "keyring in a plugin provider" 78 "$KS" providers list --providers "$T/badplug.reg"
expect_grep "keyring in a plugin: line and column" "$T/err" "unknown-field at line 5, column 3"
printf 'keyshift-providers 1\nprovider kms\n  type plugin\n  command aws\n  retries 11\n  serve k\n' >"$T/badplug.reg"
run "retries 11" 78 "$KS" providers list --providers "$T/badplug.reg"
expect_grep "retries 11: bad-value at its value" "$T/err" "bad-value at line 5, column 11"

# check starts and greets the plugin: tools/kms-example/keyshift-kms-example, found on
# PATH by the NAME "example", with its key file.
TOOLS=$(cd "$(dirname "$0")/../tools/kms-example" && pwd)
kek=$(head -c 32 /dev/urandom | base64)
printf '{"k/main": {"primary": 1, "versions": {"1": {"state": "active", "kek": "%s"}}}}\n' "$kek" >"$T/kms-keys.json"
PLUGENV=(env PATH="$TOOLS:$PATH" KEYSHIFT_KMS_EXAMPLE_KEYS="$T/kms-keys.json")
run "providers check: the plugin starts and says hello" 0 "${PLUGENV[@]}" "$KS" providers check --providers "$PREG"
expect_grep "check: kms ok, its hello's plugin string" "$T/out" "^kms  *plugin  *ok  *plugin keyshift-kms-example 1$"
expect_grep "check: alpha ok beside it" "$T/out" "^alpha  *local  *ok  *keys 1"
run "providers check --json: the plugin" 0 "${PLUGENV[@]}" "$KS" providers check --providers "$PREG" --json
expect_grep "check --json: kms ok with its plugin string" "$T/out" \
    '"name":"kms","type":"plugin","status":"ok","plugin":"keyshift-kms-example 1"}'
IN="$T/pt" run "encrypt under k/main (the plugin)" 0 "${PLUGENV[@]}" "$KS" encrypt --tenant acme --key-id k/main --context row:7 --providers "$PREG"
cp "$T/out" "$T/env-kms"
IN="$T/env-kms" run "decrypt through the plugin" 0 "${PLUGENV[@]}" "$KS" decrypt --context row:7 --providers "$PREG"
expect_same "plugin decrypt gives the plaintext" "$T/out" "$T/pt"
run "keys create through a plugin: denied" 77 "${PLUGENV[@]}" "$KS" keys create k/new --providers "$PREG"
# A command that names no program: not on PATH, and an absolute path that is not there.
run "check: command names no program" 78 env KEYSHIFT_KMS_EXAMPLE_KEYS="$T/kms-keys.json" "$KS" providers check --providers "$PREG"
expect_grep "no program: alpha was ok" "$T/out" "^alpha  *local  *ok"
expect_grep "no program: kms failed" "$T/out" "^kms  *plugin  *failed  *not-found"
expect_grep "no program: says which, the stage and why" "$T/err" \
    "provider kms (plugin [^)]*) did not open: not-found at start.*keyshift-kms-NAME on PATH"
sed "s|command example|command $T/no-such-plugin|" "$PREG" >"$T/plugin-abs.reg"
chmod 600 "$T/plugin-abs.reg"
IN="$T/pt" run "encrypt: a plugin path that is not there" 78 "$KS" encrypt --tenant acme --key-id k/main --providers "$T/plugin-abs.reg"
expect_grep "absolute path: the provider named" "$T/err" "provider kms (plugin [^)]*) did not open: not-found"
expect_empty "absolute path: nothing written" "$T/out"
# A plugin that starts but fails its hello: its message and redacted stderr are shown.
printf '{}\n' >"$T/empty-keys.json"
cat >"$T/keyshift-kms-broken" <<'EOF'
#!/bin/sh
echo "broken plugin: secret 0123456789abcdef0123456789abcdef here" >&2
exit 3
EOF
chmod 755 "$T/keyshift-kms-broken"
sed "s|command example|command broken|" "$PREG" >"$T/plugin-broken.reg"
chmod 600 "$T/plugin-broken.reg"
run "check: a plugin that dies at hello" 69 env PATH="$T:$PATH" "$KS" providers check --providers "$T/plugin-broken.reg"
expect_grep "dies at hello: the stage" "$T/err" "provider kms (plugin [^)]*) did not open: unavailable at hello"
expect_grep "dies at hello: its stderr, redacted" "$T/err" "its stderr (redacted): broken plugin: secret \[redacted\] here"
if grep -q 0123456789abcdef "$T/err"; then bad "dies at hello: no key-like run shown"; else ok "dies at hello: no key-like run shown"; fi

# ---- providers open when first needed ([P-LOAD-5]) ---------------------------
# Beside alpha, an HSM whose PIN variable is not set and a plugin that
# marks its start and dies: a decrypt under alpha's key opens neither
# (no PIN read, no login, no process), while a command that needs one
# fails with the exit code and message a load that opened it would give.
printf '#!/bin/sh\ntouch "%s"\nexit 3\n' "$T/plugin-started" >"$T/keyshift-kms-marks"
chmod 755 "$T/keyshift-kms-marks"
printf 'keyshift-providers 1\nprovider alpha\n  type local\n  keyring %s\n  serve-prefix a/\n\nprovider hsm\n  type pkcs11\n  module %s\n  token-label nowhere\n  pin-env KS_TEST_UNSET_PIN\n  serve-prefix h/\n\nprovider kms\n  type plugin\n  command marks\n  serve-prefix k/\n' \
    "$A" "$T/no-such-module.so" >"$T/lazy.reg"
chmod 600 "$T/lazy.reg"
LAZY=(env -u KS_TEST_UNSET_PIN PATH="$T:$PATH")
rm -f "$T/plugin-started"
IN="$T/env1" run "lazy: decrypt under alpha beside a broken HSM and plugin" 0 "${LAZY[@]}" "$KS" decrypt --context row:1 --providers "$T/lazy.reg"
expect_same "lazy: the plaintext" "$T/out" "$T/pt"
if [ -e "$T/plugin-started" ]; then bad "lazy: the plugin was never started"; else ok "lazy: the plugin was never started"; fi
IN="$T/pt" run "lazy: encrypt under alpha" 0 "${LAZY[@]}" "$KS" encrypt --tenant acme --key-id a/k1 --providers "$T/lazy.reg"
run "lazy: keys add-version under alpha" 0 "${LAZY[@]}" "$KS" keys add-version a/k1 --providers "$T/lazy.reg"
if [ -e "$T/plugin-started" ]; then bad "lazy: still no plugin started"; else ok "lazy: still no plugin started"; fi
IN="$T/pt" run "lazy: a key nothing serves is still refused" 77 "${LAZY[@]}" "$KS" encrypt --tenant acme --key-id z/x --providers "$T/lazy.reg"
# the commands that need them: the codes an eager load gives (providers check)
run "eager: providers check fails on the HSM's PIN" 78 "${LAZY[@]}" "$KS" providers check --providers "$T/lazy.reg"
IN="$T/pt" run "lazy: encrypt under the HSM fails as a load would" 78 "${LAZY[@]}" "$KS" encrypt --tenant acme --key-id h/k --providers "$T/lazy.reg"
expect_grep "lazy: names the HSM and its setting" "$T/err" "provider hsm: cannot use its pin-env: not-found"
expect_empty "lazy: the failed encrypt writes nothing" "$T/out"
run "lazy: keys create under the HSM fails as a load would" 78 "${LAZY[@]}" "$KS" keys create h/k --providers "$T/lazy.reg"
expect_grep "lazy: keys names the HSM" "$T/err" "provider hsm: cannot use its pin-env: not-found"
IN="$T/pt" run "lazy: encrypt under the plugin fails as a load would" 69 "${LAZY[@]}" "$KS" encrypt --tenant acme --key-id k/main --providers "$T/lazy.reg"
expect_grep "lazy: names the plugin and its stage" "$T/err" "provider kms (plugin [^)]*) did not open: unavailable at hello"
if [ -e "$T/plugin-started" ]; then ok "lazy: the plugin started once needed"; else bad "lazy: the plugin started once needed"; fi
run "lazy: keys list opens every provider" 78 "${LAZY[@]}" "$KS" keys list --providers "$T/lazy.reg"

# ---- cross-provider rewrap: the DEKs move, the ciphertext stays --------------
D="$T/shop.db"
sql "$D" "CREATE TABLE pay(id INTEGER PRIMARY KEY, tenant TEXT, card BLOB);"
for i in $(seq 1 120); do echo "INSERT INTO pay VALUES($i, 'acme', 'card-$i');"; done | sqlite3 -batch "$D"
TGT=(--db "$D" --table pay --column card)
CTX=(--tenant-column tenant --context 'pay:{id}:card' --purpose card)
run "migrate encrypt under a/k1 (alpha)" 0 "$KS" migrate run "${TGT[@]}" --mode encrypt --to-key a/k1 "${CTX[@]}" --providers "$REG"
sql "$D" "SELECT id, hex(card) FROM pay ORDER BY id" >"$T/before"
run "migrate rewrap --to-key b/main (beta)" 0 "$KS" migrate run "${TGT[@]}" --mode rewrap --to-key b/main "${CTX[@]}" --providers "$REG" --json
expect_grep "rewrap complete" "$T/out" '"result":"complete"'
run "census after the move" 0 "$KS" census "${TGT[@]}" --json
expect_grep "census: every row under b/main" "$T/out" '"key_id":"b/main","key_version":1,"rows":120}'
if grep -q '"key_id":"a/k1"' "$T/out"; then bad "census: nothing left under a/k1"; else ok "census: nothing left under a/k1"; fi
run "migrate verify through the registry" 0 "$KS" migrate verify "${TGT[@]}" "${CTX[@]}" --providers "$REG"
run "migrate verify with keyring b alone" 0 "$KS" migrate verify "${TGT[@]}" "${CTX[@]}" --keyring "$B" --passphrase-file "$T/b.pass"
run "keyring a alone can no longer open the column" 65 "$KS" migrate verify "${TGT[@]}" "${CTX[@]}" --keyring "$A"
sql "$D" "SELECT id, hex(card) FROM pay ORDER BY id" >"$T/after"
# nonce and ciphertext are the envelope's tail: same in both
strip_head() { sed 's/|.*\(.\{160\}\)$/|\1/' "$1"; }
strip_head "$T/before" >"$T/before.tail"
strip_head "$T/after" >"$T/after.tail"
expect_same "nonce and ciphertext unchanged by the move" "$T/before.tail" "$T/after.tail"

cli_finish cli-providers
