#!/usr/bin/env python3
"""fuzz/rollout_seeds.py -- write the seed corpus of fuzz_rollout.

Usage: /usr/bin/python3 fuzz/rollout_seeds.py [corpus/fuzz_rollout]

Each seed is an input in the format of fuzz/fuzz_rollout.c (its header
comment): a start byte (0: a new world from four header bytes; k + 1:
start state k of the harness's RECIPES), then up to MAX_OPS operations
of a tag byte and two argument bytes (raw-reader: a length and that many
bytes; pure: twelve bytes).  The scenarios: the first operations of a
full lifecycle, an old reader blocking write-upgrade until it expires, a
threshold trip and its rollback, rollbacks from every phase, destroy
attempts while a key is referenced, sloppy facts, stale and impossible
transitions, canary changes and raw key lists; aborts (refused, stale,
without the census, allowed and the rollout started again) and settings
changes; key scopes (header bits 0
and 1: every envelope of key k in t.v and u.v) migrated and verified
column by column; and from every start state, the steps an operator and
the application take next.  Longer scenarios are cut at MAX_OPS (the
harness reads no further); the pure-guard sweeps are split into inputs
of MAX_OPS operations.  Files are named by the SHA-1 of their content;
the script only adds files.
"""
import sys

from seedlib import write_corpus

(ADVANCE, ROLLBACK, WRITE, READ, MIGRATE, VERIFY, JOIN, LEAVE, BEAT, KEY, TIME, METRICS, START,
 CANARY, RAW, PURE) = range(16)
ADD, ACTIVE, DECRYPT_ONLY, DISABLED, DESTROYED = range(5)
ALL, TENANTS, PERCENT = 0, 1, 2
ACME, GLOBEX, INITECH, UMBRELLA = range(4)
K1, K2, K3, K4 = 1, 2, 4, 8

# fuzz/fuzz_rollout.c: operations per input, and the start states (RECIPES, in order)
MAX_OPS = 6
STARTS = ("plain read-compat", "plain write-upgrade", "plain backfill", "plain finalized",
          "plain next planned", "sealed read-compat", "sealed write-upgrade", "sealed backfill",
          "sealed finalized", "sealed next planned", "scope write-upgrade", "scope backfill",
          "scope backfill u verified", "scope finalized", "v1 write-upgrade",
          "plain backfill verified", "sealed backfill verified", "sealed tripped",
          "sealed old reader", "plain soaking", "sealed backfill k1 disabled", "sealed next planned, paused")

# transition argument bits (byte a)
SLOPPY, STALE, RAW_TO, PREV, AUTO = 0x80, 0x08, 0x10, 0x20, 0x40


def hdr(k1=False, v1=False, canary=ALL, rows=3, no_k2=False, percent=0, soak=0, ttl=120,
        key_scope=False):
    """key_scope: a key-scoped rollout of k over t.v and u.v (rows 9..16 in u)."""
    if key_scope:
        k1 = v1 = True
    h0 = k1 | v1 << 1 | canary << 2 | rows << 4 | no_k2 << 7
    return bytes([h0, percent, soak // 4, ttl - 1])


def op(tag, a=0, b=0):
    return bytes([tag, a, b])


def advance(a=0, b=0):
    return op(ADVANCE, a, b)


def rollback(a=0, b=0):
    return op(ROLLBACK, a, b)


def write(slot, row, tenant=ACME):
    return op(WRITE, slot, (row - 1) | tenant << 4)


def read(slot, row):
    return op(READ, slot, row - 1)


def migrate(batch=4, full=True, in_u=False):
    return op(MIGRATE, (batch - 1) | full << 2 | in_u << 3)


def verify(in_u=False):
    return op(VERIFY, in_u)


def join(slot, keys, fmt2=True):
    return op(JOIN, slot | fmt2 << 2, keys)


def leave(slot):
    return op(LEAVE, slot)


def beat(slot):
    return op(BEAT, slot)


def key(v, what):
    return op(KEY, v - 1, what)


def wait(seconds):
    """TIME: a < 64 is seconds, else (a - 63) minutes."""
    if seconds < 64:
        return op(TIME, seconds)
    return op(TIME, 63 + min(192, seconds // 60))


def metrics(opens10=10, fails=0, parse=False):
    return op(METRICS, opens10 - 1, fails | parse << 3)


def start():
    return op(START)


# ABORT and SET share START's tag: a & 3 selects (0, 3 start; 1 abort; 2 set)
AB_STALE, AB_SLOPPY, AB_NO_REASON = 1, 2, 4
MIN_SAMPLES, WINDOW, AUTH_RATE, SOAK = range(4)


def abort(bits=0):
    """ABORT: b bit 0 stale, bit 1 census left out, bit 2 no reason."""
    return op(START, 1, bits)


def setting(which, value):
    """SET: one setting (MIN_SAMPLES 16 * value, WINDOW 60 * value s,
    AUTH_RATE value / 64, SOAK 4 * value s), value 0..63."""
    return op(START, 2, which | (value & 0x3f) << 2)


def canary(kind, percent=0):
    return op(CANARY, kind << 6 | (percent & 0x3f))


def raw(text):
    return bytes([RAW, len(text)]) + text


def pure(frm, to, tks=2, sks=2, flags=0, health=0, src=0, tgt=0, lasted=20, soak=0, cls=b"\x0a\x05",
         misc=b"\x01\x00"):
    """PURE: ks_rollout_guard on facts from the bytes (see op_pure)."""
    return bytes([PURE, frm | to << 3, tks | sks << 4, flags, health, src, tgt, lasted, soak]) + cls + misc


def lifecycle(k1):
    """planned -> read-compat -> write-upgrade -> backfill + migrate -> verify
    -> finalized, writing and reading throughout; then the next rotation."""
    return (hdr(k1=k1, rows=3) + join(0, K1 | K2 | K3) + join(1, K1 | K2) + read(0, 1) +
            advance() + write(1, 4, GLOBEX) + read(0, 4) + advance() + write(0, 5) +
            write(1, 6, INITECH) + read(1, 5) + metrics(10) + advance() + write(0, 7) +
            migrate(2, False) + read(0, 1) + migrate() + verify() + advance() + read(0, 2) +
            read(1, 7) + write(0, 8, UMBRELLA) + start() + key(3, ADD) + leave(0) + join(0, K2 | K3) +
            leave(1) + join(1, K2 | K3) + advance() + advance() +
            metrics(5) + advance() + migrate() + verify() + advance() + read(0, 3))


def key_scope_seeds():
    """Key scopes: a lifecycle over both columns (finalize refused while
    u.v has rows at the source, then while it lacks a verify), the next
    rotation; rollbacks counting target rows in either table; destroy
    attempts counting both columns; the pure finalize guard with one
    column unverified."""
    s = []
    s.append(hdr(key_scope=True, rows=4) + join(0, K1 | K2 | K3) + join(1, K1 | K2) + read(0, 1) +
             read(0, 10) + advance() + write(1, 3, GLOBEX) + write(1, 12) + read(0, 12) +
             advance() + write(0, 5) + write(0, 13, INITECH) + read(1, 13) + metrics(10) +
             advance() + migrate() + advance() + migrate(in_u=True) + verify() + advance() +
             verify(in_u=True) + advance() + read(0, 10) + read(1, 1) + write(0, 14) +
             start() + key(3, ADD) + leave(0) + join(0, K2 | K3) + leave(1) + join(1, K2 | K3) +
             advance() + advance() + metrics(5) + advance() + migrate(in_u=True) +
             migrate(1, False) + migrate() + verify(in_u=True) + verify() + advance() +
             read(0, 12) + rollback(PREV))
    s.append(hdr(key_scope=True, rows=3) + join(0, K1 | K2) + advance() + rollback() + advance() +
             write(0, 15) + rollback() + advance() + advance() + write(0, 16) + rollback() +
             rollback() + key(1, DESTROYED) + key(2, DESTROYED) + advance() + metrics(4) +
             advance() + verify() + verify(in_u=True) + migrate(in_u=True) + key(1, DESTROYED) +
             migrate() + advance() + verify() + verify(in_u=True) + advance(SLOPPY | 1) +
             advance() + rollback() + advance() + key(1, DESTROYED) + leave(0) + join(1, K2) +
             key(1, DESTROYED) + rollback() + key(1, ACTIVE))
    s.append(hdr(key_scope=True, rows=2, canary=TENANTS) + join(0, K1 | K2) + advance() +
             advance() + write(0, 9, ACME) + write(0, 10, INITECH) + canary(PERCENT, 30) +
             write(0, 11, GLOBEX) + read(0, 11) + key(2, DISABLED) + verify(in_u=True) +
             key(2, ACTIVE) + rollback(STALE, 2) + rollback())
    s.append(hdr(key_scope=True, rows=0) + join(0, K1 | K2) +
             b"".join(pure(4, 5, flags=fl, health=h) for fl in (0x11, 0x01, 0x15)
                      for h in (0x00, 0x80, 0x84)))
    return s


def split_ops(body):
    """The operations of body, as the harness reads them."""
    ops, i = [], 0
    while i < len(body):
        tag = body[i] % 16
        if tag == RAW:
            n = 2 + (body[i + 1] % 24 if i + 1 < len(body) else 0)
        elif tag == PURE:
            n = 13
        else:
            n = 3
        ops.append(body[i:i + n])
        i += n
    return ops


def fresh(seed):
    """A new-world input: the start byte 0, then the seed cut at MAX_OPS."""
    return b"\0" + seed[:4] + b"".join(split_ops(seed[4:])[:MAX_OPS])


def chunked(prefix, body, per):
    """Seeds of prefix (a header and its operations) and then body's
    operations, per at a time."""
    ops = split_ops(body)
    return [prefix + b"".join(ops[i:i + per]) for i in range(0, len(ops), per)]


def at(state, *ops):
    """An input from start state `state` (a name of STARTS), cut at MAX_OPS."""
    return bytes([STARTS.index(state) + 1]) + b"".join(ops[:MAX_OPS])


def start_seeds():
    """From every start state: advancing and rolling back (plain, sloppy,
    stale, automatic), writing and reading, migrating and verifying,
    destroy attempts, the next rotation, readers coming and going, and
    the rest of the lifecycle into the next rotation (whose migration
    supersedes the previous one's checkpoint)."""
    s = []
    for name in STARTS:
        s.append(at(name, advance(), advance(), advance()))
        s.append(at(name, rollback(), rollback(), advance()))
        s.append(at(name, write(0, 9), write(1, 10, GLOBEX), read(0, 9), read(1, 1), write(2, 11)))
        s.append(at(name, migrate(1, False), migrate(), migrate(in_u=True), verify(), verify(True),
                    advance()))
        s.append(at(name, key(1, DESTROYED), key(2, DESTROYED), op(KEY, 0 | 0x0c, DESTROYED),
                    key(1, DISABLED), read(0, 1), key(1, ACTIVE)))
        s.append(at(name, start(), key(3, ADD), key(4, ADD), advance(), rollback(PREV)))
        s.append(at(name, wait(40), beat(0), leave(1), join(1, K2 | K3), join(2, K1, fmt2=False),
                    wait(200), advance()))
        s.append(at(name, advance(SLOPPY | 1), advance(STALE, 1), advance(RAW_TO, 3), metrics(10, 7),
                    rollback(AUTO), canary(PERCENT, 30)))
        s.append(at(name, advance(), advance(), advance(), migrate(), verify(), advance()))
        s.append(at(name, migrate(2, False), migrate(in_u=True), verify(True), migrate(), verify(),
                    advance()))
        s.append(at(name, verify(), advance(), start(), advance(), advance(), advance()))
        s.append(at(name, abort(AB_NO_REASON), abort(AB_STALE), abort(AB_SLOPPY), abort(),
                    advance(), abort()))
        s.append(at(name, setting(MIN_SAMPLES, 1), setting(WINDOW, 0), setting(AUTH_RATE, 63),
                    setting(SOAK, 0), setting(SOAK, 0), advance()))
    return s


def seeds():
    return ([fresh(x) for x in long_seeds() + chunked(hdr(rows=0) + join(0, K1 | K2), pure_sweep(),
                                                     MAX_OPS - 1)] + start_seeds())


def pure_sweep():
    """The pure guard on every (from, to), facts known and not, big census
    counts, invalid phases, states and health values, NULL readers."""
    return (b"".join(pure(f, t, flags=0x07 | 0x10) for f in range(7) for t in range(7)) +
            b"".join(pure(f, t, tks=k, sks=k, flags=0x60, health=3, src=7, tgt=3, lasted=5, soak=9)
                     for f in (1, 2, 3, 4, 5) for t in (1, 2, 3, 4, 5) for k in (0, 6)))


def long_seeds():
    s = key_scope_seeds()
    s.append(lifecycle(False))
    s.append(lifecycle(True))
    # format 1 target from plaintext, canaries by tenant list and percent
    s.append(hdr(v1=True, canary=TENANTS, rows=2) + join(0, K2, fmt2=False) + advance() +
             advance() + write(0, 3, ACME) + write(0, 4, INITECH) + read(0, 3) + read(0, 4))
    s.append(hdr(canary=PERCENT, percent=50, rows=1) + join(0, K2) + advance() + advance() +
             write(0, 2, ACME) + write(0, 3, GLOBEX) + write(0, 4, INITECH) +
             write(0, 5, UMBRELLA) + canary(PERCENT, 10) + canary(ALL) + canary(TENANTS))
    # an old reader blocks write-upgrade until its heartbeat expires
    s.append(hdr(k1=True, rows=2, ttl=30) + join(0, K1) + join(1, K1 | K2) + advance() +
             advance() + wait(20) + beat(1) + wait(20) + beat(1) + beat(0) + advance() +
             write(1, 3) + read(1, 3) + join(0, K1) + join(0, K1 | K2) + read(0, 3))
    # the minimum soak refuses, then passes
    s.append(hdr(rows=1, soak=120) + join(0, K2) + advance() + advance() + wait(60) + beat(0) +
             advance() + wait(70) + beat(0) + advance())
    # a threshold trip: refused, auto-rollback to read-compat; too few samples
    s.append(hdr(k1=True, rows=2) + join(0, K1 | K2) + advance() + advance() + write(0, 3) +
             metrics(10, 7) + advance() + rollback(AUTO) + read(0, 3) + write(0, 4) + advance() +
             wait(120) + metrics(1) + advance() + wait(120) + metrics(4, 3, parse=True) + advance())
    # a mistaken rollout: advance refused (k:2 missing), aborted and started
    # again; a rollback from write-upgrade with a row at the target refuses
    # the abort until the census is clean; set lets a short window pass
    s.append(hdr(k1=True, rows=2, no_k2=True) + join(0, K1) + advance() + abort() + key(2, ADD) +
             join(0, K1 | K2) + advance() + abort(AB_SLOPPY) + abort() + advance() + advance() +
             write(0, 3) + abort() + rollback() + abort() + setting(MIN_SAMPLES, 63) +
             metrics(4) + advance() + setting(MIN_SAMPLES, 0) + advance())
    # rollbacks from every phase
    s.append(hdr(rows=2) + join(0, K2) + rollback() + advance() + rollback() + advance() +
             advance() + write(0, 3) + rollback() + rollback() + migrate() + advance() +
             metrics(4) + advance() + rollback() + advance() + metrics(4) + advance() +
             migrate() + verify() + advance() + rollback() + verify() + advance())
    # destroy attempts: referenced by rows, readers, the open rollout; then allowed
    # dry runs of the destroy guard: forced with and without a reason, counts not gathered
    s.append(hdr(k1=True, rows=3) + join(0, K1 | K2) +
             b"".join(op(KEY, v | bits, DESTROYED) for v in (0, 2) for bits in (0x0c, 0x04, 0x10, 0x20)))
    s.append(hdr(k1=True, rows=3) + join(0, K1 | K2) + key(1, DESTROYED) + key(2, DESTROYED) +
             advance() + advance() + metrics(4) + advance() + migrate() + key(1, DESTROYED) +
             verify() + advance() + key(1, DESTROYED) + join(1, K2) + leave(0) +
             key(1, DESTROYED) + rollback() + key(1, ACTIVE) + read(1, 1) + start() +
             key(3, ADD) + rollback(PREV) + key(4, DESTROYED) + key(4, ADD) + key(4, DESTROYED))
    # key states: a missing target, disabled and decrypt-only keys
    s.append(hdr(k1=True, rows=2, no_k2=True) + join(0, K1) + advance() + key(2, ADD) +
             key(2, DISABLED) + advance() + key(2, DECRYPT_ONLY) + advance() + key(2, ACTIVE) +
             join(0, K1 | K2) + advance() + key(1, DECRYPT_ONLY) + write(0, 3) + key(2, DISABLED) +
             write(0, 4) + read(0, 1) + verify() + key(2, ACTIVE) + metrics(4) + advance() +
             key(1, DISABLED) + migrate() + key(1, ACTIVE) + migrate(1, False) + migrate())
    # sloppy facts, stale and impossible transitions
    s.append(hdr(rows=1) + join(0, K2) + advance(SLOPPY | 2) + advance(STALE, 1) +
             advance(RAW_TO, 3) + advance() + rollback(SLOPPY | 1) + advance() +
             advance(SLOPPY | 4) + metrics(4) + advance() + advance(SLOPPY | 1) + migrate() +
             verify() + advance() + advance() + rollback(RAW_TO, 0))
    # readers come and go
    s.append(hdr(rows=2, ttl=10) + join(0, K2) + join(1, K2, fmt2=False) + join(2, K1 | K2) +
             advance() + advance() + wait(11) + join(0, K2) + leave(0) + leave(2) + wait(100) +
             beat(1) + join(1, K2) + write(1, 5) + read(1, 5))
    s.extend(chunked(hdr(k1=True, rows=0) + join(0, K1 | K2),
             b"".join(pure(f, t, tks=k, sks=k, flags=fl, health=h, src=200, tgt=17, cls=c, misc=m)
                      for (f, t, k, fl, h, c, m) in (
                          (4, 5, 1, 0x01, 0, b"\x89\x10", b"\x02\x25"),
                          (4, 5, 1, 0x13, 0, b"\x80\x10", b"\x0b\xff"),
                          (4, 5, 1, 0x10, 0, b"\x06\x01", b"\x1c\x40"),
                          (5, 4, 3, 0x04, 0, b"\x0a\x0d", b"\x30\x61"),
                          (5, 4, 4, 0x04, 0, b"\x0a\x09", b"\x48\x25"),
                          (5, 4, 5, 0x04, 0, b"\x05\x05", b"\x59\x03"),
                          (5, 4, 0, 0x0c, 0, b"\x0a\x05", b"\x60\x08"),
                          (5, 4, 0, 0x04, 0, b"\x0e\x01", b"\x28\x1f"),
                          (5, 4, 1, 0x04, 0, b"\x0a\x1d", b"\x30\x61"),
                          (5, 4, 6, 0x04, 0, b"\x8a\x11", b"\x01\x00"),
                          (3, 4, 1, 0x02, 3, b"\x02\x05", b"\x01\x00"),
                          (3, 4, 1, 0x02, 1, b"\x0a\x05", b"\x01\x00"),
                          (3, 4, 1, 0x02, 2, b"\x0a\x05", b"\x01\x00"),
                          (3, 4, 1, 0x00, 2, b"\x0a\x05", b"\x01\x00"),
                          (3, 4, 1, 0x82, 0, b"\x0a\x05", b"\x01\x00"),
                          (2, 1, 1, 0x01, 0, b"\x0a\x05", b"\x01\x00"),
                          (1, 2, 6, 0x01, 0, b"\x0a\x05", b"\x01\x00"),
                          (1, 2, 3, 0x01, 0, b"\x0a\x05", b"\x01\x00"),
                          (1, 2, 0, 0x01, 0, b"\x0a\x05", b"\x01\x00"))), MAX_OPS - 1))
    # raw key lists
    for text in (b"k:1,k:2", b"k:01", b"k:2,k:1", b"a:b:3", b"k:", b"k:1,", b"k:99999999999",
                 b"", b"k:1,k:1", b":1", b"k:4294967296", b"k;1"):
        s.append(hdr(rows=0) + raw(text))
    s.append(b"")
    s.append(hdr())
    return s


def main():
    write_corpus("rollout_seeds", seeds(), sys.argv[1] if len(sys.argv) > 1 else "corpus/fuzz_rollout")


if __name__ == "__main__":
    main()
