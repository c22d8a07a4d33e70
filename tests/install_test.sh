#!/usr/bin/env bash
# tests/install_test.sh -- `make install` into a staging DESTDIR, then build
# and run a program against the installed headers and libraries through
# pkg-config, once with the shared and once with the static library.
set -euo pipefail

T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
pass=0
fail=0
check() {
    if "${@:2}" >"$T/log" 2>&1; then pass=$((pass + 1)); echo "ok   - $1"
    else fail=$((fail + 1)); echo "FAIL - $1"; sed 's/^/       /' "$T/log" | head -20; fi
}

PREFIX=/opt/keyshift-test
make --no-print-directory -s install PREFIX="$PREFIX" DESTDIR="$T/stage" >/dev/null
R="$T/stage$PREFIX"

check "headers installed" test -f "$R/include/keyshift/keyshift.h" -a -f "$R/include/keyshift/envelope.h"
check "static library installed" test -f "$R/lib/libkeyshift.a"
check "shared library has a versioned soname" sh -c "readelf -d '$R/lib/libkeyshift.so' | grep -q 'SONAME.*libkeyshift.so.0'"
check "CLI installed" test -x "$R/bin/keyshift"
check "keyshift-kms-aws installed" test -x "$R/bin/keyshift-kms-aws"
check "keyshift.pc installed" test -f "$R/lib/pkgconfig/keyshift.pc"

cat >"$T/use.c" <<'C'
#include <keyshift/keyshift.h>
#include <stdio.h>
int main(void)
{
    static const unsigned char v[] = "KSE\x05";
    ks_envelope e;
    ks_parse_error err;
    ks_err r = ks_envelope_parse(v, 4, NULL, &e, &err);
    printf("%s %s %zu\n", ks_version(), ks_err_name(r), err.offset);
    return r == KS_ERR_UNSUPPORTED_VERSION ? 0 : 1;
}
C
export PKG_CONFIG_PATH="$R/lib/pkgconfig" PKG_CONFIG_SYSROOT_DIR="$T/stage"
check "pkg-config knows keyshift" pkg-config --exists keyshift
# shellcheck disable=SC2046
check "link against the shared library" cc -std=c11 -Wall -Werror "$T/use.c" $(pkg-config --cflags --libs keyshift) -o "$T/use_shared"
check "run against the shared library" env LD_LIBRARY_PATH="$R/lib" "$T/use_shared"
# shellcheck disable=SC2046
check "link against the static library" cc -std=c11 -Wall -Werror "$T/use.c" $(pkg-config --cflags keyshift) "$R/lib/libkeyshift.a" $(pkg-config --static --libs-only-l --libs-only-other keyshift | sed "s/-lkeyshift//") -o "$T/use_static"
check "run against the static library" "$T/use_static"
check "installed CLI runs" "$R/bin/keyshift" --version
check "installed keyshift-kms-aws runs" sh -c "'$R/bin/keyshift-kms-aws' --version | grep -qx 'keyshift-kms-aws [0-9.]*'"
check "the agent's manual page installed" test -f "$R/share/man/man1/keyshift-serve.1"
check "the agent's units installed, running the installed keyshift" \
    sh -c "test -f '$R/lib/systemd/system/keyshift-agent.socket' &&
           grep -qx 'ExecStart=$PREFIX/bin/keyshift serve .*' '$R/lib/systemd/system/keyshift-agent.service'"

# One version everywhere: the header's three numbers, KS_VERSION_STRING,
# the library's ks_version(), keyshift.pc, the CLI and the plugin.
cat >"$T/ver.c" <<'C'
#include <keyshift/keyshift.h>
#include <stdio.h>
#include <string.h>
int main(void)
{
    char nums[64];
    snprintf(nums, sizeof nums, "%d.%d.%d", KS_VERSION_MAJOR, KS_VERSION_MINOR, KS_VERSION_PATCH);
    printf("%s\n", nums);
    return strcmp(nums, KS_VERSION_STRING) == 0 && strcmp(nums, ks_version()) == 0 ? 0 : 1;
}
C
# shellcheck disable=SC2046
check "build the version check" cc -std=c11 -Wall -Werror "$T/ver.c" $(pkg-config --cflags --libs keyshift) -o "$T/ver"
check "KS_VERSION_MAJOR.MINOR.PATCH = KS_VERSION_STRING = ks_version()" env LD_LIBRARY_PATH="$R/lib" "$T/ver"
V=$(LD_LIBRARY_PATH="$R/lib" "$T/ver" || true)
check "keyshift.pc has the header's version" test "$(pkg-config --modversion keyshift)" = "$V"
check "the CLI has the header's version" sh -c "'$R/bin/keyshift' --version | grep -q '^keyshift $V (libkeyshift $V)'"
check "keyshift-kms-aws has the header's version" sh -c "'$R/bin/keyshift-kms-aws' --version | grep -qx 'keyshift-kms-aws $V'"
check "the shared library's file has the header's version" test -f "$R/lib/libkeyshift.so.$V"
# The Python package: in the interpreter's site-packages for PREFIX, naming
# the installed library, with the header's version.
PYDIR="$T/stage$(/usr/bin/python3 tools/python/sitedir.py "$PREFIX")"
check "Python package installed" test -f "$PYDIR/keyshift/__init__.py" -a -f "$PYDIR/keyshift/py.typed"
check "Python package names the installed library" grep -qx "LIBDIR = '$PREFIX/lib'" "$PYDIR/keyshift/_libdir.py"
check "Python package has the header's version" env PYTHONPATH="$PYDIR" KEYSHIFT_LIBRARY="$R/lib/libkeyshift.so.$V" \
    /usr/bin/python3 -c "import keyshift; assert keyshift.__version__ == keyshift.version() == '$V'"

# The manual pages (with the installed documents' path), the documents,
# the bash completion, and --help naming where the documents are.
M="$R/share/man"
for p in docs/man/*.[1-9]; do
    check "manual page ${p##*/} installed" test -f "$M/man${p##*.}/${p##*/}"
done
check "keyshift-decrypt(1) is keyshift-encrypt(1)" test "$(readlink "$M/man1/keyshift-decrypt.1")" = keyshift-encrypt.1
check "installed pages name the installed documents" sh -c "grep -q '$PREFIX/share/doc/keyshift/migration.md' \
    '$M/man1/keyshift-migrate.1' && ! grep -rq '@DOCDIR@' '$M'"
check "man -M renders keyshift(1)" sh -c "MANPAGER=cat MANWIDTH=80 man -M '$M' keyshift 2>&1 | grep -q 'envelope encryption'"
check "man -M renders keyshift-decrypt(1)" sh -c "MANPAGER=cat MANWIDTH=80 man -M '$M' keyshift-decrypt 2>&1 | grep -q 'keyshift decrypt'"
check "mandoc renders every installed page without a warning" sh -c "for f in '$M'/man?/*; do \
    mandoc -T utf8 -W warning \"\$f\" >/dev/null || exit 1; done"
check "documents installed" test -f "$R/share/doc/keyshift/format.md" -a -f "$R/share/doc/keyshift/rollout.md"
check "Prometheus rules and dashboard installed" test -f "$R/share/doc/keyshift/prometheus/keyshift-rules.yml" \
    -a -f "$R/share/doc/keyshift/prometheus/keyshift-dashboard.json"
check "installed --help names the installed documents" sh -c "'$R/bin/keyshift' migrate --help | \
    grep -q '$PREFIX/share/doc/keyshift/NAME.md'"
check "installed keyshift-kms-aws --help names the installed documents" sh -c "'$R/bin/keyshift-kms-aws' --help | \
    grep -q '$PREFIX/share/doc/keyshift/NAME.md'"
C="$R/share/bash-completion/completions"
check "bash completion installed" test -f "$C/keyshift" -a "$(readlink "$C/keyshift-kms-aws")" = keyshift
check "installed completion loads" bash -c "source /usr/share/bash-completion/bash_completion && \
    source '$C/keyshift' && complete -p keyshift | grep -q _keyshift && complete -p keyshift-kms-aws"

# A second install with another PREFIX writes a keyshift.pc of that PREFIX,
# and a CLI whose --help names that PREFIX's documents (rebuilt: outside
# the staged pkg-config, which would point libpq's headers into the stage).
PREFIX2=/opt/keyshift-test2
env -u PKG_CONFIG_PATH -u PKG_CONFIG_SYSROOT_DIR \
    make --no-print-directory -s install PREFIX="$PREFIX2" DESTDIR="$T/stage" >/dev/null
R2="$T/stage$PREFIX2"
check "second install: keyshift.pc names the new prefix" grep -qx "prefix=$PREFIX2" "$R2/lib/pkgconfig/keyshift.pc"
check "second install: keyshift.pc names the new libdir" grep -qx "libdir=$PREFIX2/lib" "$R2/lib/pkgconfig/keyshift.pc"
check "second install: the first keyshift.pc is unchanged" grep -qx "prefix=$PREFIX" "$R/lib/pkgconfig/keyshift.pc"
check "second install: --help names the new prefix's documents" sh -c "'$R2/bin/keyshift' --help | \
    grep -q '$PREFIX2/share/doc/keyshift/NAME.md'"
check "second install: keyshift-kms-aws --help names the new prefix's documents" sh -c \
    "'$R2/bin/keyshift-kms-aws' --help | grep -q '$PREFIX2/share/doc/keyshift/NAME.md'"
check "second install: the agent's service runs the new prefix's keyshift" \
    grep -qx "ExecStart=$PREFIX2/bin/keyshift serve .*" "$R2/lib/systemd/system/keyshift-agent.service"
check "second install: the pages name the new prefix's documents" \
    grep -q "$PREFIX2/share/doc/keyshift/rollout.md" "$R2/share/man/man1/keyshift-rollout.1"
make --no-print-directory -s uninstall PREFIX="$PREFIX2" DESTDIR="$T/stage" >/dev/null

# The Go package (tools/go/keyshift) builds against the installed library
# through the installed keyshift.pc, as docs/embedding.md "From Go" says.
mkdir -p "$T/gouse"
cat >"$T/gouse/main.go" <<'GO'
package main

import (
	"errors"
	"fmt"
	"os"

	"keyshift.local/keyshift"
)

func main() {
	_, err := keyshift.Parse([]byte("KSE\x05"))
	var ke *keyshift.Error
	fmt.Println(err)
	if !errors.As(err, &ke) || ke.Name != "unsupported-version" || ke.Offset != 3 {
		os.Exit(1)
	}
}
GO
printf '%s\n' 'module gouse' 'go 1.19' 'require keyshift.local/keyshift v0.0.0' \
    "replace keyshift.local/keyshift => $(pwd)/tools/go/keyshift" >"$T/gouse/go.mod"
# A cache of this run's own: go's cache key of a cgo package leaves out
# the flags pkg-config gives, so a cache that outlived a run (go-test's,
# or this test's last one) would link with the -L of a staged install
# removed since.
check "build a Go program against the installed library" sh -c "cd '$T/gouse' && \
    GOFLAGS=-mod=mod GOPROXY=off GOCACHE='$T/go-cache' GOPATH='$T/gopath' \
    go build -o '$T/gouse/gouse' ."
check "run it against the installed library" env LD_LIBRARY_PATH="$R/lib" "$T/gouse/gouse"

make --no-print-directory -s uninstall PREFIX="$PREFIX" DESTDIR="$T/stage" >/dev/null
check "uninstall removes keyshift-kms-aws" test ! -e "$R/bin/keyshift-kms-aws"
check "uninstall removes the CLI" test ! -e "$R/bin/keyshift"
check "uninstall removes the Python package" test ! -e "$PYDIR/keyshift"
check "uninstall removes the manual pages" sh -c "! ls '$M'/man?/* 2>/dev/null | grep -q ."
check "uninstall removes the documents" test ! -e "$R/share/doc/keyshift"
check "uninstall removes the bash completion" test ! -e "$C/keyshift" -a ! -L "$C/keyshift-kms-aws"
check "uninstall removes the agent's units" sh -c "! ls '$R/lib/systemd/system'/keyshift-agent.* 2>/dev/null | grep -q ."

echo "install: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
