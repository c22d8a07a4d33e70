#!/usr/bin/env bash
# tests/deb_test.sh -- the Debian packages (debian/): build them with
# dpkg-buildpackage from a copy of the tree, check them with lintian (every
# error and every warning fails, unless debian/*.lintian-overrides gives a
# reason), unpack each into a throw-away root with dpkg -x, and run one key
# rotation (tools/demo/demo.sh: encrypt, add a version, rewrap, verify)
# and the Python package from the unpacked files only.
#
# Usage: tests/deb_test.sh BUILD_DIR VERSION
set -euo pipefail

B=${1:?build dir}
VERSION=${2:?version}
TOP=$(pwd)
D="$TOP/$B/deb"
rm -rf "$D"
mkdir -p "$D/keyshift-$VERSION" "$D/root"
pass=0
fail=0
check() {
    if "${@:2}" >"$D/log" 2>&1; then pass=$((pass + 1)); echo "ok   - $1"
    else fail=$((fail + 1)); echo "FAIL - $1"; sed 's/^/       /' "$D/log" | tail -30; fi
}

# The tracked and the new (not ignored) files: what a clone would hold.
git ls-files -z --cached --others --exclude-standard \
    | tar --null -T - -cf - | tar -x -C "$D/keyshift-$VERSION"
if ! (cd "$D/keyshift-$VERSION" && DEB_BUILD_OPTIONS="parallel=$(nproc) nocheck" \
        dpkg-buildpackage -us -uc -b) >"$D/build.log" 2>&1; then
    tail -40 "$D/build.log"
    echo "deb: FAILED: dpkg-buildpackage (log in $D/build.log)"
    exit 1
fi
check "dpkg-buildpackage built every package" \
    test -f "$D/libkeyshift0_${VERSION}_amd64.deb" -a -f "$D/libkeyshift-dev_${VERSION}_amd64.deb" \
         -a -f "$D/keyshift_${VERSION}_amd64.deb" -a -f "$D/keyshift-kms-aws_${VERSION}_amd64.deb" \
         -a -f "$D/python3-keyshift_${VERSION}_all.deb"
check "lintian: no error, no warning that is not overridden" \
    sh -c "lintian --fail-on error,warning --suppress-tags-from-file /dev/null \
               '$D/keyshift_${VERSION}_amd64.changes' | tee '$D/lintian.log'; \
           ! grep -E '^(E|W):' '$D/lintian.log'"

for deb in "$D"/*.deb; do
    case "$deb" in *-dbgsym_*) continue ;; esac
    dpkg -x "$deb" "$D/root"
done
R="$D/root"
MA=$(dpkg-architecture -qDEB_HOST_MULTIARCH)
export LD_LIBRARY_PATH="$R/usr/lib/$MA"
check "the library's symbols file matches its exports exactly (dpkg-gensymbols -c4)" \
    sh -c "dpkg-deb -e '$D/libkeyshift0_${VERSION}_amd64.deb' '$D/ctl' && grep -q '^libkeyshift.so.0 libkeyshift0 #MINVER#' '$D/ctl/symbols' \
           && ! grep 'dpkg-gensymbols: warning' '$D/build.log'"
check "the installed CLI runs from the package" "$R/usr/bin/keyshift" --version
check "the installed plugin runs from the package" "$R/usr/bin/keyshift-kms-aws" --version
check "the agent's manual page and units are in the keyshift package" \
    test -f "$R/usr/share/man/man1/keyshift-serve.1.gz" -a -f "$R/lib/systemd/system/keyshift-agent.socket"
check "the packaged service runs the packaged keyshift" \
    grep -qx 'ExecStart=/usr/bin/keyshift serve .*' "$R/lib/systemd/system/keyshift-agent.service"
check "installing the package neither enables nor starts the agent (it needs a policy first)" \
    sh -c "dpkg-deb -e '$D/keyshift_${VERSION}_amd64.deb' '$D/ctl-keyshift' &&
           grep -q 'if deb-systemd-helper debian-installed .keyshift-agent.socket.' '$D/ctl-keyshift/postinst' &&
           grep -q 'deb-systemd-invoke try-restart' '$D/ctl-keyshift/postinst' &&
           ! grep -Eq 'deb-systemd-invoke (start|restart|[\$])' '$D/ctl-keyshift/postinst' &&
           grep -q 'deb-systemd-invoke stop keyshift-agent.socket keyshift-agent.service' '$D/ctl-keyshift/prerm'"
check "keyshift.pc names the multiarch directory" grep -qx "libdir=/usr/lib/$MA" "$R/usr/lib/$MA/pkgconfig/keyshift.pc"
check "one rotation with the packaged CLI (tools/demo/demo.sh)" \
    env DEMO_ROWS=500 DEMO_DIR="$D/demo" tools/demo/demo.sh "$R/usr/bin/keyshift"
check "the packaged Python package seals and opens under the rotated keyring" \
    env PYTHONPATH="$R/usr/lib/python3/dist-packages" KEYSHIFT_LIBRARY="$R/usr/lib/$MA/libkeyshift.so.0" \
        KEYRING="$D/demo/keyring" /usr/bin/python3 -c '
import os, keyshift
with keyshift.App(keyring=os.environ["KEYRING"], default_key_id="payments/kek") as app:
    v = app.seal("payments", "card", "acme", b"4111", context=b"1")
    assert keyshift.parse(v).key_id == "payments/kek", keyshift.parse(v)
    assert app.open("payments", "card", "acme", v, context=b"1") == b"4111"
'
echo "deb: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
