#!/bin/sh
# tools/go/readme_test.sh -- run the README's "From Go" example as a
# module of its own that points at tools/go/keyshift with a replace line,
# against a fresh keyring holding payments/kek, and check what it prints.
# Run from the repository's root with make's GO_ENV (KEYSHIFT_CLI, the
# pkg-config path, GOFLAGS, GOCACHE).
set -eu
root=$(pwd)
t=$(mktemp -d)
trap 'rm -rf "$t"' EXIT
awk '/^## From Go$/ { s = 1 } s && /^```go$/ { c = 1; next } c && /^```$/ { exit } c { print }' \
    README.md > "$t/main.go"
[ -s "$t/main.go" ] || { echo "readme_test: no Go example under README's \"From Go\"" >&2; exit 1; }
cat > "$t/go.mod" <<MOD
module readme.example

go 1.19

require keyshift.local/keyshift v0.0.0

replace keyshift.local/keyshift => $root/tools/go/keyshift
MOD
unset KEYSHIFT_PASSPHRASE KEYSHIFT_PROVIDERS
export KEYSHIFT_KEYRING="$t/keyring"
"$KEYSHIFT_CLI" keys init >/dev/null 2>&1
"$KEYSHIFT_CLI" keys create payments/kek >/dev/null 2>&1
(cd "$t" && go run .) > "$t/out"
expect() {
    grep -q -F -- "$1" "$t/out" || { echo "readme_test: the example did not print \"$1\":" >&2; cat "$t/out" >&2; exit 1; }
}
expect 'opened "4111111111111111"'
expect 'another row'"'"'s context: keyshift: open-value: auth-failed'
expect 'format 2, xchacha20-poly1305, key payments/kek'
echo "readme_test: the README's Go example runs"
