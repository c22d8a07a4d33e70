"""Tests of the Python package (tools/python/keyshift) against libkeyshift.

Round trips in both formats and both algorithms, every error class and the
mapping of every error code, the rollout policy from a SQLite database
(the class written, a phase refusing a read, the reader registered), many
threads on one App, the GIL released around the C calls, interoperability
with the CLI both ways, batches, parse, close, and the README's "From
Python" example.

unittest test cases, so that pytest (Debian's python3-pytest) collects
them and ``python3 -m unittest`` runs them where pytest is missing.
Environment: KEYSHIFT_LIBRARY (the shared library) and KEYSHIFT_CLI (the
keyshift program); by default the ones under build/ of this tree.
"""

import base64
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, os.path.dirname(HERE))
_lib = os.path.join(ROOT, "build", "lib", "libkeyshift.so.0")
if "KEYSHIFT_LIBRARY" not in os.environ and os.path.exists(_lib):
    os.environ["KEYSHIFT_LIBRARY"] = _lib
CLI = os.environ.get("KEYSHIFT_CLI", os.path.join(ROOT, "build", "bin", "keyshift"))

import keyshift  # noqa: E402
from keyshift import _native  # noqa: E402

T, C = "payments", "card"


class World:
    """A temporary directory with an unsealed keyring (payments-kek:1
    primary, payments-kek:2) and shop.db with payments(id, tenant, card)."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="ks_py_")
        self.keyring = os.path.join(self.dir, "keyring")
        self.db = os.path.join(self.dir, "shop.db")
        self.env = dict(os.environ, KEYSHIFT_KEYRING=self.keyring)
        self.env.pop("KEYSHIFT_PASSPHRASE", None)
        self.env.pop("KEYSHIFT_PROVIDERS", None)
        self.cli("keys", "init")
        self.cli("keys", "create", "payments-kek")
        self.cli("keys", "add-version", "payments-kek")
        con = sqlite3.connect(self.db)
        con.execute("CREATE TABLE payments(id INTEGER PRIMARY KEY, tenant TEXT, card BLOB)")
        con.commit()
        con.close()

    def cli(self, *args: str, stdin: bytes = b"", check: bool = True) -> subprocess.CompletedProcess:
        p = subprocess.run([CLI, *args], input=stdin, env=self.env, cwd=self.dir,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        if check and p.returncode != 0:
            raise AssertionError("keyshift %s: exit %d: %s" % (" ".join(args), p.returncode,
                                                              p.stderr.decode()))
        return p

    def app(self, **kw) -> keyshift.App:
        kw.setdefault("keyring", self.keyring)
        kw.setdefault("default_key_id", "payments-kek")
        return keyshift.App(**kw)

    def remove(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def aes_available(w: World) -> bool:
    """AES-256-GCM needs AES-NI; the library refuses it elsewhere."""
    try:
        with w.app(default_algorithm=keyshift.AES_256_GCM) as a:
            a.seal(T, C, "acme", b"x")
        return True
    except keyshift.ConfigError as e:
        assert e.name == "algorithm-unavailable", e
        return False


class KeyshiftTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.w = World()

    @classmethod
    def tearDownClass(cls) -> None:
        cls.w.remove()

    # ---- round trips ----

    def test_round_trip_formats_and_algorithms(self) -> None:
        algs = [keyshift.XCHACHA20_POLY1305]
        if aes_available(self.w):
            algs.append(keyshift.AES_256_GCM)
        for fmt in (1, 2):
            for alg in algs:
                with self.subTest(format=fmt, algorithm=alg), \
                        self.w.app(default_format=fmt, default_algorithm=alg) as app:
                    for pt in (b"", b"4111 1111 1111 1111", os.urandom(65536)):
                        v, cls = app.seal_class(T, C, "acme", pt, context="payments:42:card")
                        self.assertIsInstance(v, bytes)
                        self.assertEqual((cls.plaintext, cls.version, cls.algorithm,
                                          cls.key_id, cls.key_version),
                                         (False, fmt, alg, "payments-kek", 1))
                        h = keyshift.parse(v)
                        self.assertEqual((h.version, h.algorithm, h.tenant, h.key_id,
                                          h.key_version, h.total_len),
                                         (fmt, alg, "acme", "payments-kek", 1, len(v)))
                        self.assertEqual(h.purpose, "card" if fmt == 2 else None)
                        out, rcls = app.open_class(T, C, "acme", v, context="payments:42:card")
                        self.assertEqual(out, pt)
                        self.assertEqual(rcls, cls)
                        # bytearray and memoryview inputs, str or bytes arguments
                        self.assertEqual(app.open(T, C, b"acme", bytearray(v),
                                                  context=b"payments:42:card"), pt)
                        self.assertEqual(app.open(T, C, None, memoryview(v),
                                                  context="payments:42:card"), pt)

    def test_portable_record_path(self) -> None:
        """The ctypes-structure record (interpreters other than CPython)
        gives the same results as the per-thread buffer CPython uses."""
        self.assertTrue(keyshift._FAST or sys.implementation.name != "cpython")
        saved = keyshift._FAST
        try:
            with self.w.app() as app:
                v = app.seal(T, C, "acme", b"fast", context="1", purpose="p")
                keyshift._FAST = False
                app._names.clear()
                self.assertEqual(app.open(T, C, "acme", v, context="1", purpose="p"), b"fast")
                v2 = app.seal(T, C, "acme", b"slow", context="2")
                items = [("acme", "b%d" % i, bytearray(b"x" * i)) for i in range(5)]
                sealed = app.seal_batch(T, C, items + [("a b", "c", b"y")])
                self.assertIsInstance(sealed[-1], keyshift.InvalidArgument)
                self.assertEqual(app.open_batch(T, C, [(t, c, v) for (t, c, _), v
                                                        in zip(items, sealed)]),
                                 [bytes(d) for _, _, d in items])
                with self.assertRaises(keyshift.AuthFailed):
                    app.open(T, C, "acme", v, context="2", purpose="p")
                keyshift._FAST = saved
                app._names.clear()
                self.assertEqual(app.open(T, C, "acme", v2, context="2"), b"slow")
        finally:
            keyshift._FAST = saved

    def test_purpose_and_default_purpose(self) -> None:
        with self.w.app(purpose="pan") as app:
            v = app.seal(T, C, "acme", b"x", context="1")
            self.assertEqual(keyshift.parse(v).purpose, "pan")
            v2 = app.seal(T, C, "acme", b"x", context="1", purpose="cvv")
            self.assertEqual(keyshift.parse(v2).purpose, "cvv")
            self.assertEqual(app.open(T, C, "acme", v2, context="1", purpose="cvv"), b"x")
            with self.assertRaises(keyshift.AuthFailed):
                app.open(T, C, "acme", v2, context="1")

    def test_many_column_names(self) -> None:
        """Past the cache of encoded table and column names, each call's
        own names are kept alive for the call."""
        with self.w.app() as app:
            for i in range(1100):
                col = "c%d" % i
                v = app.seal(T, col, "acme", b"v%d" % i, context="x")
                self.assertEqual(app.open(T, col, "acme", v, context="x"), b"v%d" % i)
            self.assertLessEqual(len(app._names), 1024)

    def test_bytearray_plaintext_read_in_place(self) -> None:
        with self.w.app() as app:
            pt = bytearray(b"secret")
            v = app.seal(T, C, "acme", pt)
            pt[:] = b"\0" * len(pt)
            self.assertEqual(app.open(T, C, "acme", v), b"secret")
            self.assertEqual(app.seal_class(T, C, "acme", bytearray())[1].plaintext, False)

    def test_open_wipes_its_buffer(self) -> None:
        # the thread's output buffer holds no plaintext once open returns
        with self.w.app() as app:
            secret = b"4111 1111 1111 1111" * 8
            v = app.seal(T, C, "acme", secret)
            self.assertEqual(app.open(T, C, "acme", v), secret)
            buf = app._tls.st.buf  # the buffer the library opened into
            self.assertEqual(bytes(buf[:len(secret)]), bytes(len(secret)))
            self.assertNotIn(secret[:16], bytes(buf))
            # past the 64 KiB of zeros the wipe slices: a grown buffer, the
            # outgrown one wiped too
            big = os.urandom(70000)
            self.assertEqual(app.open(T, C, "acme", app.seal(T, C, "acme", big)), big)
            self.assertEqual(bytes(buf), bytes(len(buf)))
            st = app._tls.st
            self.assertGreaterEqual(st.cap, 70000)
            self.assertEqual(bytes(st.buf[:70000]), bytes(70000))

    # ---- errors ----

    def test_every_error_code_maps_to_its_class(self) -> None:
        lib = _native.LIB
        by_class = {1: keyshift.Unavailable, 2: keyshift.Refused, 3: keyshift.ConfigError}
        names = set()
        for code in range(1, 256):
            e = keyshift._error(code, 7)
            self.assertIsInstance(e, keyshift.Error)
            self.assertIsInstance(e, by_class[lib.ks_err_class(code)], code)
            self.assertEqual(e.name, lib.ks_err_name(code).decode())
            self.assertEqual(e.code, code)
            self.assertEqual(e.error_class, lib.ks_error_class_name(lib.ks_err_class(code)).decode())
            self.assertEqual(e.retryable, lib.ks_err_class(code) == 1)
            if 1 <= code <= 31 and e.name != "unknown-error":
                self.assertIsInstance(e, keyshift.Malformed)
                self.assertEqual(e.offset, 7)
            else:
                self.assertIsNone(e.offset)
            names.add(e.name)
        expect = {
            "auth-failed": keyshift.AuthFailed, "phase": keyshift.PhaseRefused,
            "denied": keyshift.KeyRefused, "revoked": keyshift.KeyRefused,
            "not-found": keyshift.KeyRefused, "invalid-argument": keyshift.InvalidArgument,
            "buffer-too-small": keyshift.InvalidArgument, "unavailable": keyshift.Unavailable,
            "timeout": keyshift.Unavailable, "busy": keyshift.Unavailable,
            "no-memory": keyshift.Unavailable, "io": keyshift.ConfigError,
            "no-rollout": keyshift.ConfigError, "state": keyshift.ConfigError,
            "algorithm-unavailable": keyshift.ConfigError, "unknown-error": keyshift.ConfigError,
        }
        for code in range(1, 256):
            name = lib.ks_err_name(code).decode()
            if name in expect:
                self.assertIsInstance(keyshift._error(code), expect[name], name)
        self.assertTrue(set(expect) <= names)

    def test_auth_failed(self) -> None:
        with self.w.app() as app:
            v = app.seal(T, C, "acme", b"x", context="payments:1:card")
            for kw in ({"context": "payments:2:card"}, {"purpose": "other"}):
                with self.assertRaises(keyshift.AuthFailed) as cm:
                    app.open(T, C, "acme", v, context=kw.get("context", "payments:1:card"),
                             purpose=kw.get("purpose"))
                self.assertEqual(cm.exception.name, "auth-failed")
                self.assertEqual(cm.exception.error_class, "refused")
                self.assertFalse(cm.exception.retryable)
            bad = bytearray(v)
            bad[-1] ^= 1
            with self.assertRaises(keyshift.AuthFailed):
                app.open(T, C, "acme", bytes(bad), context="payments:1:card")
            with self.assertRaises(keyshift.AuthFailed):
                app.open(T, C, "globex", v, context="payments:1:card")

    def test_malformed_with_offset(self) -> None:
        with self.w.app() as app:
            v = app.seal(T, C, "acme", b"x")
            with self.assertRaises(keyshift.Malformed) as cm:
                app.open(T, C, "acme", v[:10])
            self.assertEqual(cm.exception.name, "truncated")
            self.assertIsInstance(cm.exception.offset, int)
            self.assertIn("at byte", str(cm.exception))
            with self.assertRaises(keyshift.Malformed) as cm:
                app.open(T, C, "acme", b"plain text")  # no rollout: plaintext refused
            self.assertEqual(cm.exception.name, "bad-magic")
            with self.assertRaises(keyshift.Malformed) as cm:
                keyshift.parse(v + b"\0")
            self.assertIsNotNone(cm.exception.offset)
            with self.assertRaises(keyshift.Malformed) as cm:
                keyshift.parse(b"KSE\x09")
            self.assertEqual(cm.exception.name, "unsupported-version")

    def test_invalid_argument(self) -> None:
        with self.w.app() as app:
            for tenant in ("", "a b", "x" * 65):
                with self.assertRaises(keyshift.InvalidArgument):
                    app.seal(T, C, tenant, b"x")
            with self.assertRaises(ValueError):
                app.seal(T, C, "acme", b"x", context="c" * 4097)
            with self.assertRaises(keyshift.InvalidArgument):
                app.seal("pay\0ments", C, "acme", b"x")
            with self.assertRaises(TypeError):
                app.seal(T, C, "acme", "not bytes")  # type: ignore[arg-type]

    def test_key_refused(self) -> None:
        with self.w.app(default_key_version=9) as app:
            with self.assertRaises(keyshift.KeyRefused) as cm:
                app.seal(T, C, "acme", b"x")
            self.assertEqual(cm.exception.name, "not-found")

    def test_configuration_errors(self) -> None:
        with self.assertRaises(keyshift.ConfigError) as cm:
            keyshift.App(keyring=os.path.join(self.w.dir, "missing"))
        self.assertEqual(cm.exception.name, "io")
        self.assertIn("keyring", str(cm.exception))
        with self.assertRaises(keyshift.InvalidArgument) as cm:  # two key sources
            keyshift.App(keyring=self.w.keyring, providers="p.conf")
        self.assertIn("not several", str(cm.exception))
        with self.assertRaises(keyshift.InvalidArgument):
            keyshift.App(keyring=self.w.keyring, default_algorithm="rot13")
        for kw in ({"max_format": 258}, {"default_format": -1}, {"interval_ms": 1 << 32},
                   {"default_key_version": "2"}):
            with self.assertRaises(keyshift.InvalidArgument):
                keyshift.App(keyring=self.w.keyring, **kw)
        with keyshift.App(keyring=self.w.keyring) as app:
            with self.assertRaises(keyshift.ConfigError) as cm:
                app.seal(T, C, "acme", b"x")
            self.assertEqual(cm.exception.name, "no-rollout")

    def test_unavailable_database_is_retryable_or_config(self) -> None:
        # A database that does not exist is the setup's fault.
        with self.assertRaises(keyshift.ConfigError):
            self.w.app(database=os.path.join(self.w.dir, "nope.db"), instance_id="py-x")

    def test_unavailable_provider_is_retryable(self) -> None:
        """A KMS plugin answering `unavailable' (tests/keyshift-kms-fault)
        makes seal raise Unavailable, retryable; once the plugin answers
        again, the same call succeeds."""
        d = tempfile.mkdtemp(prefix="ks_py_kms_")
        try:
            fault_dir = os.path.join(d, "fault")
            os.mkdir(fault_dir)
            keys = os.path.join(d, "kms-keys.json")
            with open(keys, "w") as f:
                json.dump({"kms/card": {"primary": 1, "versions": {"1": {
                    "state": "active", "kek": base64.b64encode(os.urandom(32)).decode()}}}}, f)
            reg = os.path.join(d, "providers")
            with open(reg, "w") as f:
                f.write("keyshift-providers 1\n\nprovider kms\n  type plugin\n  command %s\n"
                        "  env KEYSHIFT_FAULT_DIR\n  env KEYSHIFT_KMS_EXAMPLE_KEYS\n"
                        "  env PYTHONDONTWRITEBYTECODE\n"
                        "  timeout-ms 2000\n  retries 0\n  rate-limit 0\n  serve-prefix kms/\n"
                        % os.path.join(ROOT, "tests", "keyshift-kms-fault"))
            os.chmod(reg, 0o600)
            plan = os.path.join(fault_dir, "plan")
            with open(plan, "w") as f:
                f.write("wrap error:unavailable *\n")
            saved = {k: os.environ.get(k) for k in ("KEYSHIFT_FAULT_DIR", "KEYSHIFT_KMS_EXAMPLE_KEYS",
                                                    "PYTHONDONTWRITEBYTECODE")}
            # the plugin writes no bytecode into the source tree
            os.environ.update(KEYSHIFT_FAULT_DIR=fault_dir, KEYSHIFT_KMS_EXAMPLE_KEYS=keys,
                              PYTHONDONTWRITEBYTECODE="1")
            try:
                with keyshift.App(providers=reg, default_key_id="kms/card") as app:
                    with self.assertRaises(keyshift.Unavailable) as cm:
                        app.seal(T, C, "acme", b"x", context="1")
                    self.assertEqual(cm.exception.name, "unavailable")
                    self.assertTrue(cm.exception.retryable)
                    self.assertEqual(cm.exception.error_class, "retryable")
                    open(plan, "w").close()
                    v = app.seal(T, C, "acme", b"x", context="1")
                    self.assertEqual(app.open(T, C, "acme", v, context="1"), b"x")
            finally:
                for k, val in saved.items():
                    if val is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = val
        finally:
            shutil.rmtree(d, ignore_errors=True)

    def test_close(self) -> None:
        app = self.w.app()
        v = app.seal(T, C, "acme", b"x")
        app.close()
        app.close()
        with self.assertRaises(keyshift.ConfigError):
            app.open(T, C, "acme", v)
        with self.assertRaises(keyshift.ConfigError):
            app.seal(T, C, "acme", b"x")

    # ---- the rollout ----

    def test_rollout_phase_and_registration(self) -> None:
        w = World()
        try:
            with w.app(database=w.db, instance_id="py-1", interval_ms=50) as app:
                self.assertEqual(app.keys(), "payments-kek:1,payments-kek:2")
                readers = w.cli("rollout", "readers", "--db", w.db).stdout.decode()
                self.assertIn("py-1", readers)
                w.cli("rollout", "start", "--db", w.db, "--table", T, "--column", C,
                      "--source", "v2:xchacha20-poly1305:payments-kek:1",
                      "--target", "v2:xchacha20-poly1305:payments-kek:2", "--reason", "test")
                # planned: writes and reads the source only
                with w.app(default_key_version=2) as other:
                    target_value = other.seal(T, C, "acme", b"new", context="1")
                import time
                deadline = time.monotonic() + 10
                while True:
                    try:
                        app.open(T, C, "acme", target_value, context="1")
                    except keyshift.PhaseRefused as e:
                        self.assertEqual(e.name, "phase")
                        break
                    self.assertLess(time.monotonic(), deadline, "the rollout was never seen")
                    time.sleep(0.05)
                v, cls = app.seal_class(T, C, "acme", b"old", context="1")
                self.assertEqual((cls.key_id, cls.key_version), ("payments-kek", 1))
                self.assertEqual(app.open(T, C, "acme", v, context="1"), b"old")
                time.sleep(0.2)
                st = app.stats()
                self.assertGreater(st.heartbeats, 0)
                self.assertGreater(st.reports, 0)
            readers = w.cli("rollout", "readers", "--db", w.db).stdout.decode()
            self.assertNotIn("py-1", readers)
        finally:
            w.remove()

    def test_text_columns(self) -> None:
        """seal and open work in the column's encoding: default_encoding
        where no rollout covers it, the rollout's --encoding where one does."""
        w = World()
        try:
            pt = b"ada@example.com"
            with w.app(default_encoding=keyshift.BASE64) as text_app, w.app() as bin_app:
                self.assertEqual(text_app.column_encoding("users", "email"), "base64")
                self.assertEqual(bin_app.column_encoding("users", "email"), "binary")
                v = text_app.seal("users", "email", "acme", pt, context="u:1")
                self.assertTrue(v.startswith(b"S1NF"))
                self.assertLessEqual(len(v), keyshift.seal_max_len(len(pt)))
                self.assertEqual(text_app.open("users", "email", "acme", v, context="u:1"), pt)
                b = bin_app.seal("users", "email", "acme", pt, context="u:1")
                with self.assertRaises(keyshift.Malformed):
                    text_app.open("users", "email", "acme", b, context="u:1")
                with self.assertRaises(keyshift.InvalidArgument):
                    w.app(default_encoding="hex")
            con = sqlite3.connect(w.db)
            con.execute("CREATE TABLE users(id INTEGER PRIMARY KEY, email TEXT)")
            con.commit()
            con.close()
            w.cli("rollout", "start", "--db", w.db, "--table", "users", "--column", "email",
                  "--encoding", "base64", "--source", "plaintext",
                  "--target", "v2:xchacha20-poly1305:payments-kek:2")
            with w.app(database=w.db, instance_id="py-text") as app:
                self.assertEqual(app.column_encoding("users", "email"), "base64")
                self.assertEqual(app.column_encoding(T, C), "binary")
                self.assertEqual(app.seal("users", "email", "acme", pt, context="u:1"), pt)
                self.assertEqual(app.open("users", "email", "acme", pt, context="u:1"), pt)
            status = json.loads(w.cli("rollout", "status", "--db", w.db, "--json").stdout)
            self.assertEqual(status["encoding"], "base64")
        finally:
            w.remove()

    # ---- threads ----

    def test_gil_released(self) -> None:
        self.assertTrue(_native.releases_gil())
        self.assertTrue(_native.releases_gil(_native.LIB.ks_app_open_value))
        # the two per-call functions convert no argument (App passes ctypes objects)
        self.assertIsNone(_native.LIB.ks_app_seal.argtypes)
        self.assertIsNone(_native.LIB.ks_app_open_value.argtypes)
        self.assertIs(_native.LIB.ks_app_open_value.restype, _native.ctypes.c_int)
        self.assertIsInstance(_native.LIB, _native.ctypes.CDLL)
        self.assertNotIsInstance(_native.LIB, _native.ctypes.PyDLL)

    def test_many_threads_one_app(self) -> None:
        errors = []
        with self.w.app() as app:
            def work(n: int) -> None:
                try:
                    for i in range(200):
                        pt = os.urandom(n % 300 + i)
                        ctx = "payments:%d:%d" % (n, i)
                        v = app.seal(T, C, "t%d" % n, pt, context=ctx)
                        if app.open(T, C, "t%d" % n, v, context=ctx) != pt:
                            errors.append("mismatch")
                        try:
                            app.open(T, C, "t%d" % n, v, context=ctx + "x")
                            errors.append("opened with a wrong context")
                        except keyshift.AuthFailed:
                            pass
                except Exception as e:  # noqa: BLE001 - reported below
                    errors.append(repr(e))

            threads = [threading.Thread(target=work, args=(n,)) for n in range(16)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        self.assertEqual(errors, [])

    def test_close_waits_for_calls(self) -> None:
        app = self.w.app()
        stop = threading.Event()
        seen = []

        def work() -> None:
            while not stop.is_set():
                try:
                    app.seal(T, C, "acme", b"x" * 65536)
                except keyshift.ConfigError as e:
                    seen.append(e.name)
                    return

        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        app.close()
        stop.set()
        for t in threads:
            t.join()
        self.assertEqual(seen, ["invalid-argument"] * 4)

    # ---- batches ----

    def test_batches(self) -> None:
        with self.w.app() as app:
            items = [("acme", "ctx:%d" % i, os.urandom(i * 10)) for i in range(20)]
            items.append(("bad tenant", "c", b"x"))
            sealed = app.seal_batch(T, C, items)
            self.assertIsInstance(sealed[-1], keyshift.InvalidArgument)
            opened = app.open_batch(T, C, [(t, c, v) for (t, c, _), v in zip(items[:-1], sealed)]
                                    + [("acme", "c", b"KSE\x02")])
            self.assertEqual(opened[:-1], [d for _, _, d in items[:-1]])
            self.assertIsInstance(opened[-1], keyshift.Malformed)
            self.assertEqual(app.seal_batch(T, C, []), [])

    # ---- interoperability with the CLI ----

    def test_python_seals_cli_opens(self) -> None:
        for fmt in (1, 2):
            with self.w.app(default_format=fmt) as app:
                v = app.seal(T, C, "acme", b"4111 1111 1111 1111", context="payments:42:card",
                             purpose="card")
            args = ["decrypt", "--context", "payments:42:card", "--tenant", "acme"]
            if fmt == 2:
                args += ["--purpose", "card"]
            p = self.w.cli(*args, stdin=v)
            self.assertEqual(p.stdout, b"4111 1111 1111 1111")
            p = self.w.cli("decrypt", "--context", "payments:41:card", stdin=v, check=False)
            self.assertEqual(p.returncode, 65)
            self.assertEqual(p.stdout, b"")

    def test_cli_seals_python_opens(self) -> None:
        for fmt in ("1", "2"):
            args = ["encrypt", "--tenant", "acme", "--key-id", "payments-kek", "--key-version", "2",
                    "--context", "payments:42:card", "--format", fmt]
            if fmt == "2":
                args += ["--purpose", "card"]
            v = self.w.cli(*args, stdin=b"from the CLI").stdout
            with self.w.app() as app:
                pt, cls = app.open_class(T, C, "acme", v, context="payments:42:card")
                self.assertEqual(pt, b"from the CLI")
                self.assertEqual((cls.version, cls.key_version), (int(fmt), 2))
                with self.assertRaises(keyshift.AuthFailed):
                    app.open(T, C, "acme", v, context="payments:43:card")

    def test_sealed_keyring_passphrase(self) -> None:
        """A sealed keyring opens with its passphrase (str or bytes) and
        refuses a wrong one as a configuration error."""
        d = tempfile.mkdtemp(prefix="ks_py_sealed_")
        try:
            kr = os.path.join(d, "keyring")
            env = dict(self.w.env, KEYSHIFT_KEYRING=kr, KEYSHIFT_PASSPHRASE="correct horse")
            for args in (["keys", "init"], ["keys", "create", "payments-kek"]):
                subprocess.run([CLI] + args, env=env, check=True, stderr=subprocess.PIPE)
            for pw in ("correct horse", b"correct horse"):
                with keyshift.App(keyring=kr, passphrase=pw, default_key_id="payments-kek") as app:
                    self.assertEqual(app.open(T, C, "acme", app.seal(T, C, "acme", b"s")), b"s")
            with self.assertRaises(keyshift.ConfigError) as cm:
                keyshift.App(keyring=kr, passphrase="Tr0ub4dor-not-it", default_key_id="payments-kek")
            self.assertEqual(cm.exception.name, "bad-passphrase")
            self.assertNotIn("Tr0ub4dor", str(cm.exception))  # the passphrase is never shown
        finally:
            shutil.rmtree(d, ignore_errors=True)

    def test_keys_from_the_environment(self) -> None:
        old = os.environ.get("KEYSHIFT_KEYRING")
        os.environ["KEYSHIFT_KEYRING"] = self.w.keyring
        try:
            with keyshift.App(default_key_id="payments-kek") as app:
                self.assertEqual(app.open(T, C, "acme", app.seal(T, C, "acme", b"e")), b"e")
        finally:
            if old is None:
                del os.environ["KEYSHIFT_KEYRING"]
            else:
                os.environ["KEYSHIFT_KEYRING"] = old

    # ---- the example service ----

    def test_example_service_under_a_rollout(self) -> None:
        """example_service.py reads and writes rows of a SQLite table in
        write-upgrade with tenants t1 and t2 as the canary: every read
        succeeds and the canary's writes go to the target key version;
        a wrong --read-context makes its reads fail (exit 65)."""
        w = World()
        try:
            con = sqlite3.connect(w.db)
            with w.app(database=w.db, instance_id="seed") as app:
                for i in range(1, 41):
                    value = app.seal(T, C, "t%d" % (i % 4), json.dumps({"id": i}).encode(),
                                     context="payments:%d:card" % i)
                    con.execute("INSERT INTO payments VALUES (?, ?, ?)", (i, "t%d" % (i % 4), value))
            con.commit()
            svc = [sys.executable, os.path.join(os.path.dirname(HERE), "example_service.py"),
                   "--db", w.db, "--table", T, "--column", C, "--tenant-column", "tenant",
                   "--context", "payments:{id}:card", "--keyring", w.keyring,
                   "--instance", "py-svc", "--json", "--reload-ms", "50", "--seed", "1"]
            env = dict(w.env, PYTHONPATH=os.path.dirname(HERE))

            def run(*args: str, rc: int = 0) -> dict:
                p = subprocess.run(svc + list(args), env=env, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE)
                self.assertEqual(p.returncode, rc, p.stderr.decode() + p.stdout.decode())
                return json.loads(p.stdout)

            w.cli("rollout", "start", "--db", w.db, "--table", T, "--column", C,
                  "--source", "v2:xchacha20-poly1305:payments-kek:1",
                  "--target", "v2:xchacha20-poly1305:payments-kek:2", "--min-soak", "0",
                  "--reason", "test")
            w.cli("rollout", "advance", "--db", w.db)
            w.cli("rollout", "advance", "--db", w.db, "--tenants", "t1,t2")
            s = run("--ops", "300", "--write-percent", "50")
            self.assertEqual((s["ops"], s["reads"], s["failed_reads"], s["write_failures"],
                              s["db_errors"]), (300, 300, 0, {}, 0), s)
            self.assertGreater(s["writes"].get("v2:xchacha20-poly1305:payments-kek:2", 0), 0)
            self.assertGreater(s["writes"].get("v2:xchacha20-poly1305:payments-kek:1", 0), 0)
            for tenant, value in con.execute("SELECT tenant, card FROM payments"):
                want = 2 if tenant in ("t1", "t2") else 1
                self.assertIn(keyshift.parse(value).key_version, (1, want))
            con.close()
            s = run("--ops", "50", "--write-percent", "0", "--read-context", "other:{id}", rc=65)
            self.assertEqual(s["open_failures"], {"auth-failed": 50}, s)
            try:
                import psycopg2  # noqa: F401
            except ImportError:  # this interpreter cannot reach PostgreSQL: it says so
                p = subprocess.run(svc[:2] + ["--db", "host=/nonexistent dbname=x", "--table", T,
                                              "--column", C, "--tenant-column", "tenant",
                                              "--context", "x", "--instance", "i"],
                                   env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                self.assertEqual(p.returncode, 69, p.stderr)
                self.assertIn(b"needs psycopg2", p.stderr)
                self.assertIn(b"/usr/bin/python3", p.stderr)
        finally:
            w.remove()

    # ---- the README ----

    def test_readme_example(self) -> None:
        """The README's "From Python" section runs as written: its shell
        block with the CLI first on PATH, then its Python block."""
        with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
            text = f.read()
        section = text.split("\n## From Python\n", 1)[1].split("\n## ", 1)[0]
        sh = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
        py = re.search(r"```python\n(.*?)```", section, re.S).group(1)
        d = tempfile.mkdtemp(prefix="ks_py_readme_")
        try:
            env = dict(os.environ)
            for k in ("KEYSHIFT_KEYRING", "KEYSHIFT_PASSPHRASE", "KEYSHIFT_PROVIDERS"):
                env.pop(k, None)
            bindir = os.path.join(d, "bin")
            os.mkdir(bindir)
            os.symlink(os.path.abspath(CLI), os.path.join(bindir, "keyshift"))
            env["PATH"] = bindir + os.pathsep + env["PATH"]
            env["PYTHONPATH"] = os.path.dirname(HERE)
            script = sh + "\n" + "%s - <<'PY'\n%sPY\n" % (sys.executable, py)
            p = subprocess.run(["sh", "-ec", script], cwd=d, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
            self.assertEqual(p.returncode, 0, p.stderr.decode())
            self.assertIn(b"4111 1111 1111 1111", p.stdout)
        finally:
            shutil.rmtree(d, ignore_errors=True)

    def test_version_matches_library(self) -> None:
        self.assertEqual(keyshift.__version__, keyshift.version())
        self.assertEqual(keyshift.seal_max_len(0) > 0, True)

    # ---- packaging ----

    def test_wheel(self) -> None:
        """The in-tree build backend (what pip install --no-build-isolation
        tools/python runs) makes a pure wheel of the package."""
        import importlib.util
        import zipfile
        spec = importlib.util.spec_from_file_location(
            "build_wheel", os.path.join(os.path.dirname(HERE), "build_wheel.py"))
        bw = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(bw)
        d = tempfile.mkdtemp(prefix="ks_py_wheel_")
        try:
            self.assertEqual(bw.get_requires_for_build_wheel(), [])
            name = bw.build_wheel(d)
            self.assertEqual(name, "keyshift-%s-py3-none-any.whl" % keyshift.__version__)
            with zipfile.ZipFile(os.path.join(d, name)) as z:
                names = set(z.namelist())
                di = "keyshift-%s.dist-info/" % keyshift.__version__
                self.assertTrue({"keyshift/__init__.py", "keyshift/_native.py", "keyshift/py.typed",
                                 di + "METADATA", di + "WHEEL", di + "RECORD"} <= names, names)
                self.assertNotIn("keyshift/_libdir.py", names)
                record = z.read(di + "RECORD").decode()
                self.assertEqual(len(record.splitlines()), len(names))
        finally:
            shutil.rmtree(d, ignore_errors=True)

    # ---- the structures ----

    def test_structure_layouts_match_the_c_compiler(self) -> None:
        """Every field of every mirrored structure lies at the offset, and
        every structure has the size, that a C program including
        keyshift/app.h prints (skipped without a C compiler)."""
        cc = shutil.which("cc") or shutil.which("gcc")
        if cc is None:
            self.skipTest("no C compiler")
        structs = {
            "ks_bytes": _native.Bytes, "ks_app_options": _native.AppOptions,
            "ks_app_record": _native.AppRecord, "ks_rollout_class": _native.RolloutClass,
            "ks_parse_error": _native.ParseError, "ks_app_item": _native.AppItem,
            "ks_app_span": _native.AppSpan, "ks_app_header": _native.AppHeader,
            "ks_app_stats": _native.AppStats,
        }
        lines, want = [], []
        for cname, cls in structs.items():
            lines.append('printf("%%zu\\n", sizeof(%s));' % cname)
            want.append(_native.ctypes.sizeof(cls))
            for fname, _ in cls._fields_:
                cfield = "in" if fname == "in_" else fname
                lines.append('printf("%%zu\\n", offsetof(%s, %s));' % (cname, cfield))
                want.append(getattr(cls, fname).offset)
        src = ("#include <stddef.h>\n#include <stdio.h>\n#include <keyshift/app.h>\n"
               "int main(void) {\n%s\nreturn 0;\n}\n" % "\n".join(lines))
        d = tempfile.mkdtemp(prefix="ks_py_layout_")
        try:
            with open(os.path.join(d, "layout.c"), "w") as f:
                f.write(src)
            exe = os.path.join(d, "layout")
            subprocess.run([cc, "-I", os.path.join(ROOT, "include"), os.path.join(d, "layout.c"),
                            "-o", exe], check=True)
            got = [int(x) for x in subprocess.run([exe], check=True, stdout=subprocess.PIPE)
                   .stdout.split()]
        finally:
            shutil.rmtree(d, ignore_errors=True)
        self.assertEqual(len(got), len(want))
        self.assertEqual(got, want)

    def test_structure_sizes(self) -> None:
        """The sizes and offsets the C compiler gives the structures of
        keyshift/app.h on x86-64 (as the test above prints them), for
        machines without a compiler."""
        ct = _native.ctypes
        if ct.sizeof(ct.c_void_p) != 8:
            self.skipTest("sizes checked on LP64 only")
        self.assertEqual(ct.sizeof(_native.Bytes), 16)
        self.assertEqual(ct.sizeof(_native.AppRecord), 64)
        self.assertEqual(ct.sizeof(_native.RolloutClass), 276)
        self.assertEqual(ct.sizeof(_native.ParseError), 24)
        self.assertEqual(ct.sizeof(_native.AppHeader), 144)
        self.assertEqual(ct.sizeof(_native.AppStats), 64)
        self.assertEqual(ct.sizeof(_native.AppItem), 368)
        self.assertEqual(ct.sizeof(_native.AppOptions), 128)
        self.assertEqual(_native.AppOptions.purpose.offset, 112)
        self.assertEqual(_native.AppOptions.default_encoding.offset, 120)
        self.assertEqual(_native.AppItem.cls.offset, 92)
        self.assertEqual(_native.AppHeader.total_len.offset, 136)
        self.assertEqual(_native.RolloutClass.key_version.offset, 272)


if __name__ == "__main__":
    unittest.main()
