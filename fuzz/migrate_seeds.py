#!/usr/bin/env python3
"""fuzz/migrate_seeds.py -- write the seed corpus of fuzz_migrate.

Usage: python3 fuzz/migrate_seeds.py [corpus/fuzz_migrate]

Each seed is an input in the format of fuzz/fuzz_migrate.c (its header
comment): four parameter bytes, then rows.  Genuine envelopes are named by
their index in GENUINE of fuzz/fuzz_migrate.c (the harness seals them at
init), so the seeds stay genuine as long as that table keeps its order.
Files are named by the SHA-1 of their content; the script only adds files.
"""
import struct
import sys

from seedlib import write_corpus

# mode (FILTERED: rewrap confined by from_key_id to fuzz-key, or other-key with fmt1=True)
ENCRYPT, REWRAP, REENCRYPT, FILTERED = 0, 1, 2, 3
# templates
T_EMPTY, T_ID, T_ORG, T_FIXED = 0, 1, 2, 3
# targets: fuzz-key primary (2), fuzz-key 1, fuzz-key 2, other-key primary
TG_PRIMARY, TG_V1, TG_V2, TG_OTHER = 0, 1, 2, 3
# actions of byte 3 (A_HALT and A_STALE: slice mode)
A_NONE, A_STOP, A_UNWRAP, A_WRAP, A_KEYINFO, A_DENIED, A_HALT, A_STALE = 0, 1, 2, 3, 4, 5, 6, 7
# slice mode: the start's cursor (none, lo, a middle id, hi); MIN and MAX the int64 extremes
C_NONE, C_LO, C_MID, C_HI = 0, 1, 2, 3
MIN, MAX = "min", "max"
# tenant column values (TENANTS of fuzz/fuzz_migrate.c) and org column values
TN_ACME, TN_GLOBEX, TN_NULL, TN_BAD = 0, 1, 2, 3
ORG_NULL, ORG_7, ORG_SALES, ORG_DEAD = 0, 1, 2, 3  # ORG_7: the integer -7


def params(mode, fmt1=False, aes=False, batch=1, no_verify=False, tmpl=T_ID, tenant_col=False,
           orders=False, target=TG_PRIMARY, both=False, verify=False, rate=255, after=0,
           action=A_NONE, count=1):
    b0 = mode | fmt1 << 2 | aes << 3 | (batch - 1) << 4 | no_verify << 7
    b1 = tmpl | tenant_col << 2 | orders << 3 | target << 4 | both << 6 | verify << 7
    b3 = after | action << 3 | (count - 1) << 6
    return bytes([b0, b1, rate, b3])


def slice_id(v):
    """The slice byte of id v: -2..17, or the int64 extreme MIN (lo) or MAX (hi)."""
    if v in (MIN, MAX):
        return 255
    assert -2 <= v <= 17
    return v + 2


def sliced(mode, lo, hi, cursor=C_NONE, mid=1, start_pass=0, action=A_HALT, after=0,
           stop_flag=False, no_halt=False, **kw):
    """The parameter bytes of a slice-mode input: byte 3's action A_HALT
    (halt, or the stop flag, after batch `after`; 0: never) or A_STALE
    (save number after + 1 fails), then lo, hi and the start."""
    assert action in (A_HALT, A_STALE)
    p = params(mode, action=action, after=after, **kw)
    b3 = p[3] | stop_flag << 6 | no_halt << 7
    start = cursor | start_pass << 2 | (mid - 1) << 4
    return p[:3] + bytes([b3, slice_id(lo), slice_id(hi), start])


def hdr(kind, q=False, tenant=TN_ACME, org=ORG_NULL):
    return bytes([kind | q << 3 | tenant << 4 | org << 6])


def null(**kw):
    return hdr(0, **kw)


def integer(v, **kw):
    return hdr(1, **kw) + struct.pack(">q", v)


def text(b, **kw):
    return hdr(2, **kw) + bytes([len(b)]) + b


def blob(b, **kw):
    return hdr(3, **kw) + bytes([len(b)]) + b


def genuine(k, as_text=False, mut=0, xor=0, **kw):
    tail = bytes([k, mut]) + (bytes([xor]) if mut else b"")
    return hdr(5 if as_text else 4, **kw) + tail


def real(v, **kw):
    return hdr(6, **kw) + struct.pack(">i", 0) + struct.pack(">i", v)


def kse(b, **kw):
    return hdr(7, **kw) + bytes([len(b)]) + b


def seeds():
    s = []
    plain = [text(b"hello"), blob(b"\x00\x01\xff"), integer(42), null(), integer(-7),
             text(b""), blob(b"card 4111 1111 1111 1111")]
    # encrypt, every format/algorithm, several batch sizes
    for fmt1 in (False, True):
        for aes in (False, True):
            s.append(params(ENCRYPT, fmt1=fmt1, aes=aes, batch=3) + b"".join(plain))
    s.append(params(ENCRYPT, batch=8, verify=True) + b"".join(plain) + genuine(1) +
             kse(b"\x02garbage") + text(b"KSE"))
    s.append(params(ENCRYPT, no_verify=True, tmpl=T_EMPTY) + text(b"x" * 255) + integer(2**63 - 1))
    s.append(params(ENCRYPT, tmpl=T_ORG, tenant_col=True, batch=2) +
             text(b"a", tenant=TN_ACME, org=ORG_7) + text(b"b", tenant=TN_GLOBEX, org=ORG_SALES) +
             text(b"c", tenant=TN_NULL, org=ORG_DEAD) + text(b"d", tenant=TN_BAD))
    s.append(params(ENCRYPT, tmpl=T_FIXED, orders=True, target=TG_OTHER) + text(b"p") + text(b"q", q=True))
    # quarantined rows and a threshold stop (rate 0)
    s.append(params(ENCRYPT, rate=0) + text(b"a") + kse(b"\x01\x00") + text(b"b", q=True) + text(b"c"))
    s.append(params(ENCRYPT, rate=127, batch=2) + kse(b"") + kse(b"\x09") + text(b"ok") + null(q=True))
    # REAL values (docs/fuzzing.md, "fuzz_migrate": a REAL is compared
    # as SQLite's text rendering)
    s.append(params(REWRAP) + real(100) + genuine(1))
    s.append(params(ENCRYPT, batch=4) + real(-3) + text(b"r"))
    # rewrap: genuine envelopes where their contexts render (row i has id i+1)
    gid = genuine(1) + genuine(2) + genuine(3)
    for target in (TG_PRIMARY, TG_V1, TG_V2, TG_OTHER):
        s.append(params(REWRAP, target=target, batch=2, verify=target == TG_PRIMARY) + gid +
                 genuine(14) + text(b"plain") + null() + genuine(2, mut=5, xor=1) + genuine(3, q=True))
    s.append(params(REWRAP, fmt1=True) + genuine(5) + genuine(6) + genuine(11) + genuine(14))
    s.append(params(REWRAP, aes=True, batch=4) + genuine(10, as_text=True) + genuine(7) + genuine(15))
    s.append(params(REWRAP, no_verify=True) + genuine(2) + genuine(1) + genuine(0))
    s.append(params(REWRAP, tmpl=T_EMPTY, tenant_col=True) + genuine(0, tenant=TN_ACME) +
             genuine(13, tenant=TN_GLOBEX) + genuine(4, tenant=TN_BAD) + genuine(0, tenant=TN_NULL))
    s.append(params(REWRAP, tmpl=T_ID, tenant_col=True) + genuine(1) + genuine(8, tenant=TN_GLOBEX))
    s.append(params(REWRAP, tmpl=T_ORG, verify=True) + genuine(1) + genuine(2) +
             genuine(9, org=ORG_SALES))
    s.append(params(REWRAP, tmpl=T_FIXED) + genuine(12) + genuine(12, mut=200, xor=0x80))
    s.append(params(REWRAP, both=True, tenant_col=True) + genuine(1, tenant=TN_ACME))
    s.append(params(REWRAP, orders=True) + genuine(1) + kse(b"\x02\x0a\x04acme"))
    # reencrypt
    for fmt1, aes in ((False, False), (True, False), (False, True), (True, True)):
        s.append(params(REENCRYPT, fmt1=fmt1, aes=aes, batch=2) + gid + genuine(14) + text(b"pt") +
                 genuine(1, mut=1, xor=0xff))
    s.append(params(REENCRYPT, target=TG_V2, verify=True) + genuine(7) + genuine(13) + genuine(15))
    s.append(params(REENCRYPT, tmpl=T_ORG) + genuine(1) + genuine(2) + genuine(9, org=ORG_SALES))
    # stops and provider failures, after batch 0 (before the run), 1 or 2
    for action in (A_STOP, A_UNWRAP, A_WRAP, A_KEYINFO, A_DENIED):
        for after in (0, 1, 2):
            mode = ENCRYPT if action == A_WRAP and after == 2 else REWRAP
            body = (b"".join(plain) if mode == ENCRYPT else gid + genuine(1))
            s.append(params(mode, after=after, action=action, count=2) + body)
    s.append(params(REENCRYPT, after=1, action=A_WRAP, count=4) + gid)
    # rewrap confined to one key (genuine 16 and 17 are other-key's, the rest fuzz-key's;
    # each opens at the row id its context names)
    mixed = (gid + text(b"plain") + null() + genuine(16) + genuine(2, mut=5, xor=1) +
             kse(b"\x02\x0a"))
    s.append(params(FILTERED, batch=2, verify=True, rate=254) + mixed)
    s.append(params(FILTERED, fmt1=True, batch=3, verify=True, rate=254) +
             genuine(16) + genuine(17, as_text=True) + genuine(3) + genuine(16, mut=9, xor=4))
    s.append(params(FILTERED, target=TG_OTHER, verify=True) + genuine(16) + genuine(2))
    # TEXT rows read as context templates (oracle 7): literals, "{{" and "}}",
    # {id}, repeated and distinct columns, and every malformed shape
    tmpls = [b"{id}:{org}:{kind}:{org}", b"{{x}}", b"a}b", b"{x", b"{a{b}", b"{}", b"{ok}{id}",
             b"".join(b"{c%d}" % i for i in range(12)), b"{nul\x00}", b"}}{{", b"{"]
    s.append(params(ENCRYPT, batch=8) + b"".join(text(t) for t in tmpls))
    # census through the scan and sampled verify with failures (odd row counts)
    s.append(params(REWRAP, batch=2, verify=True) + gid + genuine(2, mut=5, xor=1) +
             genuine(3, mut=9, xor=4) + null() + text(b"plain"))
    s.append(params(REENCRYPT, tmpl=T_ORG, verify=True, batch=3) + genuine(9, org=ORG_SALES) +
             genuine(1, org=ORG_DEAD) + genuine(2, org=ORG_7) + genuine(9, mut=3, xor=2, org=ORG_SALES) +
             text(b"x", org=ORG_DEAD))
    s.append(params(ENCRYPT, tmpl=T_ORG, verify=True, tenant_col=True) +
             text(b"a", tenant=TN_GLOBEX, org=ORG_DEAD) + blob(b"b", org=ORG_7) + integer(-5, org=ORG_DEAD))
    s.append(params(FILTERED, verify=True, batch=8) + genuine(16) + genuine(1) + genuine(16, mut=4, xor=8))
    s.append(params(REWRAP, both=True, tenant_col=True, verify=True) + genuine(1) + genuine(2) + genuine(3))
    # verify of one row (the sample covers it), and of rows whose tenant column is unusable
    s.append(params(REWRAP, verify=True) + genuine(1))
    s.append(params(REWRAP, tmpl=T_EMPTY, tenant_col=True, verify=True) + genuine(0, tenant=TN_NULL) +
             genuine(0, tenant=TN_BAD) + genuine(13, tenant=TN_GLOBEX) + genuine(0))
    s.append(params(REWRAP, tmpl=T_ID, tenant_col=True, verify=True, batch=3) +
             genuine(1, tenant=TN_NULL) + genuine(8, tenant=TN_GLOBEX) + genuine(3, tenant=TN_BAD))
    # values that start like the envelope magic and are not envelopes
    near = text(b"K") + text(b"Kx") + text(b"KSx") + blob(b"KS") + blob(b"KSF")
    s.append(params(ENCRYPT, batch=8, verify=True) + near)
    s.append(params(REWRAP, batch=8, verify=True) + near + genuine(1) + genuine(2))
    s.append(params(FILTERED, batch=8, verify=True) + near + genuine(16) + genuine(2) + null())
    # the census of every envelope class of GENUINE (nine: more than its first allocation),
    # by the scan (nine rows) and by visit_values (ten); encrypt leaves them as they are
    classes = b"".join(genuine(k) for k in (0, 4, 7, 10, 11, 14, 15, 16, 17))
    s.append(params(ENCRYPT, batch=8) + classes)
    s.append(params(ENCRYPT, batch=8) + classes + genuine(1))
    s.append(b"")
    s.append(params(ENCRYPT))
    s.extend(slice_seeds(plain, gid, mixed))
    return s


def slice_seeds(plain, gid, mixed):
    """Slice mode: one chunk through ks_engine_run_slice (fuzz_migrate.c, oracle 8)."""
    s = []
    eight = b"".join(plain) + text(b"z")
    rewrap8 = gid + genuine(14) + text(b"plain") + null() + genuine(2, mut=5, xor=1) + genuine(3, q=True)
    # the whole table, the int64 extremes as bounds, and chunks inside it
    s.append(sliced(ENCRYPT, MIN, MAX, batch=3) + eight)
    s.append(sliced(ENCRYPT, 3, 6, batch=2) + eight)
    s.append(sliced(REWRAP, 2, 5, batch=2, verify=True) + rewrap8)
    s.append(sliced(REWRAP, -2, 3, batch=1) + rewrap8)
    s.append(sliced(REWRAP, 6, MAX, batch=2, target=TG_V1) + rewrap8)
    s.append(sliced(REENCRYPT, MIN, 4, batch=2, aes=True) + gid + genuine(14) + text(b"pt"))
    s.append(sliced(FILTERED, 1, 6, batch=2, rate=254) + mixed)
    # chunks with no row, and a refused one (lo > hi)
    s.append(sliced(ENCRYPT, -2, 0) + eight)
    s.append(sliced(ENCRYPT, 12, 17) + eight)
    s.append(sliced(ENCRYPT, 5, 4) + eight)
    # a refused chunk's start byte names the parameter its refusals break (15: no context)
    for k in range(1, 16):
        s.append(sliced(FILTERED if k in (8, 9) else ENCRYPT, 5, 4, cursor=k & 3, start_pass=k >> 2) +
                 text(b"x"))
    # halts: the slice's flag after batch 1 and 2 and after the last, the stop flag, no flag
    s.append(sliced(REWRAP, 1, 7, batch=2, after=1) + rewrap8)
    s.append(sliced(ENCRYPT, MIN, MAX, batch=2, after=2) + eight)
    s.append(sliced(ENCRYPT, 2, 8, batch=4, after=2) + eight)
    s.append(sliced(ENCRYPT, 2, 8, batch=2, after=1, stop_flag=True) + eight)
    s.append(sliced(ENCRYPT, 2, 8, batch=2, after=1, no_halt=True) + eight)
    # a lost chunk: save 1, 2 and the end of the pass's fail (KS_ERR_STALE)
    s.append(sliced(ENCRYPT, 1, 6, batch=2, action=A_STALE, after=0) + eight)
    s.append(sliced(REWRAP, 1, 8, batch=3, action=A_STALE, after=1) + rewrap8)
    s.append(sliced(ENCRYPT, 3, 4, batch=2, action=A_STALE, after=1) + eight)
    # resumed chunks: a cursor at lo, in the middle and at hi; a later pass with and
    # without one (with one, the start's raced row makes the engine run another pass)
    s.append(sliced(ENCRYPT, 2, 7, cursor=C_LO, batch=2) + eight)
    s.append(sliced(REWRAP, 1, 8, cursor=C_MID, mid=3, batch=2) + rewrap8)
    s.append(sliced(ENCRYPT, 2, 7, cursor=C_HI) + eight)
    s.append(sliced(ENCRYPT, MIN, MAX, cursor=C_MID, mid=4, start_pass=2, batch=3) + eight)
    s.append(sliced(ENCRYPT, 1, 8, start_pass=3, batch=4) + eight)
    # pass 3 starts with 300 rows done: the threshold is checked after each batch
    s.append(sliced(ENCRYPT, MIN, MAX, start_pass=3, batch=2) + text(b"a") + kse(b"\x01\x00") +
             text(b"b") + text(b"c"))
    # the threshold inside a chunk, and a tenant both constant and a column (refused per row)
    s.append(sliced(ENCRYPT, 1, 4, rate=0) + text(b"a") + kse(b"\x01\x00") + text(b"b", q=True) + text(b"c"))
    s.append(sliced(REWRAP, MIN, MAX, both=True, tenant_col=True) + genuine(1, tenant=TN_ACME))
    return s


def main():
    write_corpus("migrate_seeds", seeds(), sys.argv[1] if len(sys.argv) > 1 else "corpus/fuzz_migrate")


if __name__ == "__main__":
    main()
