"""Benchmark of the Python package against pyca/cryptography's AESGCM.

Prints JSON lines (make bench, make py-bench):

- ``py-crypt``: App.seal and App.open (format 2, no database, a keyring
  file) against ``AESGCM.encrypt`` / ``decrypt`` with a 12-byte nonce and
  the context as AAD, at 128 B, 2 KiB and 64 KiB, for both algorithms;
  ``ratio`` = AESGCM ns / keyshift ns (1.0: as fast as the bare AEAD).
  Each figure is the best of 5 rounds, contender and baseline alternating.
- ``py-threads``: seal and open on one App from 2 threads against 1
  (``speedup`` = 2-thread throughput / 1-thread throughput; 2.0 is
  perfect), AESGCM's own figure beside it (``raw_speedup``), the CPU
  seconds per wall second of the 2-thread run (``cpu_per_wall``: above
  1.0 only when the threads ran at the same time, i.e. the GIL was
  released) and the machine's load average (``load``; a speed-up needs
  a second core free).

The keys: an unsealed keyring made with the CLI ($KEYSHIFT_CLI, default
build/bin/keyshift) in a temporary directory.
"""

import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
if "KEYSHIFT_LIBRARY" not in os.environ:
    os.environ["KEYSHIFT_LIBRARY"] = os.path.join(ROOT, "build", "lib", "libkeyshift.so.0")
CLI = os.environ.get("KEYSHIFT_CLI", os.path.join(ROOT, "build", "bin", "keyshift"))

import keyshift  # noqa: E402
from cryptography import __version__ as crypto_version  # noqa: E402
from cryptography.hazmat.primitives.ciphers.aead import AESGCM  # noqa: E402

SIZES = (128, 2048, 65536)
ROUNDS = 5
CTX = b"payments:42:card"


def per_op_ns(fn, n):
    """ns per call of fn() over n calls."""
    t = time.perf_counter_ns()
    for _ in range(n):
        fn()
    return (time.perf_counter_ns() - t) / n


def calls_for(size):
    return 20000 if size <= 2048 else 1500


def best_pair(ks, raw, n):
    """Best of ROUNDS for each, alternating so both see the same machine."""
    k = r = float("inf")
    for _ in range(ROUNDS):
        k = min(k, per_op_ns(ks, n))
        r = min(r, per_op_ns(raw, n))
    return k, r


def threaded_rate(fn, threads, n):
    """Calls per second of fn from `threads` threads, n calls each."""
    barrier = threading.Barrier(threads + 1)

    def work():
        barrier.wait()
        for _ in range(n):
            fn()

    ts = [threading.Thread(target=work) for _ in range(threads)]
    for t in ts:
        t.start()
    barrier.wait()
    t0, c0 = time.perf_counter(), time.process_time()
    for t in ts:
        t.join()
    wall = time.perf_counter() - t0
    return threads * n / wall, (time.process_time() - c0) / wall


def best_rate(fn, threads, n):
    """The best rate of ROUNDS, with its CPU seconds per wall second (above
    1.0 only when the threads ran at the same time)."""
    return max(threaded_rate(fn, threads, n) for _ in range(ROUNDS))


def main():
    d = tempfile.mkdtemp(prefix="ks_py_bench_")
    try:
        env = dict(os.environ, KEYSHIFT_KEYRING=os.path.join(d, "keyring"))
        env.pop("KEYSHIFT_PASSPHRASE", None)
        for args in (["keys", "init"], ["keys", "create", "bench-kek"]):
            subprocess.run([CLI] + args, env=env, check=True, stderr=subprocess.DEVNULL)
        common = {"python": platform.python_version(), "executable": sys.executable,
                  "cryptography": crypto_version}
        aead = AESGCM(AESGCM.generate_key(256))
        nonce = os.urandom(12)
        for alg in (keyshift.AES_256_GCM, keyshift.XCHACHA20_POLY1305):
            try:
                app = keyshift.App(keyring=env["KEYSHIFT_KEYRING"], default_key_id="bench-kek",
                                   default_algorithm=alg)
            except keyshift.ConfigError as e:
                print(json.dumps(dict(common, bench="py-crypt", algorithm=alg, skipped=e.name)))
                continue
            with app:
                for size in SIZES:
                    pt = os.urandom(size)
                    env_v = app.seal("t", "c", "acme", pt, context=CTX)
                    ct = aead.encrypt(nonce, pt, CTX)
                    n = calls_for(size)
                    cases = (
                        ("seal", lambda: app.seal("t", "c", "acme", pt, context=CTX),
                         lambda: aead.encrypt(nonce, pt, CTX)),
                        ("open", lambda: app.open("t", "c", "acme", env_v, context=CTX),
                         lambda: aead.decrypt(nonce, ct, CTX)),
                    )
                    for op, ks, raw in cases:
                        k, r = best_pair(ks, raw, n)
                        print(json.dumps(dict(common, bench="py-crypt", op=op, algorithm=alg,
                                              bytes=size, ks_ns=round(k), raw_ns=round(r),
                                              ratio=round(r / k, 3))), flush=True)
                if alg != keyshift.AES_256_GCM:
                    continue
                for size in (2048, 65536):
                    pt = os.urandom(size)
                    env_v = app.seal("t", "c", "acme", pt, context=CTX)
                    ct = aead.encrypt(nonce, pt, CTX)
                    n = calls_for(size) // 2
                    cases = (
                        ("seal", lambda: app.seal("t", "c", "acme", pt, context=CTX),
                         lambda: aead.encrypt(nonce, pt, CTX)),
                        ("open", lambda: app.open("t", "c", "acme", env_v, context=CTX),
                         lambda: aead.decrypt(nonce, ct, CTX)),
                    )
                    for op, ks, raw in cases:
                        (k1, _), (k2, cpu) = best_rate(ks, 1, n), best_rate(ks, 2, n)
                        (r1, _), (r2, _) = best_rate(raw, 1, n), best_rate(raw, 2, n)
                        print(json.dumps(dict(common, bench="py-threads", op=op, algorithm=alg,
                                              bytes=size, threads=2,
                                              speedup=round(k2 / k1, 2),
                                              raw_speedup=round(r2 / r1, 2),
                                              cpu_per_wall=round(cpu, 2),
                                              load=round(os.getloadavg()[0], 1),
                                              gil_released=keyshift._native.releases_gil())),
                              flush=True)
    finally:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
