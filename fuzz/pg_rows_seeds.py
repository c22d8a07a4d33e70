#!/usr/bin/python3
"""fuzz/pg_rows_seeds.py -- the fuzz_pg_rows seeds: PostgreSQL result rows.

    /usr/bin/python3 fuzz/pg_rows_seeds.py [OUTDIR]

Builds inputs of fuzz/fuzz_pg_rows.c with a writer of its own: a decoder
byte, a row count, an attribute byte (and, for the scan, a context count
and a type per value column), then each cell as a tag (0xff NULL, 0xfe a
16-bit big-endian length, else the length) and its bytes; bigints 8 bytes
big-endian, doubles their bits, histograms 24 little-endian uint64,
booleans one byte.  For every decoder: valid rows (several
shapes, several rows, values at their limits) and malformed ones (each
range, type, length and name rule broken once, a column of another oid or
format), into corpus/fuzz_pg_rows/<sha1>.

Idempotent: a seed's name is its content's hash; nothing is removed.
Standard library only; run from anywhere.
"""
import os
import struct
import sys

from seedlib import write_corpus

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(ROOT, "corpus", "fuzz_pg_rows")

# The decoders, in fuzz_pg_rows.c's order.
(D_ROLLOUT, D_COLUMN, D_LOG, D_READER, D_SAMPLE, D_SCAN, D_CHECKPOINT, D_LISTED, D_CELL,
 D_CHUNK, D_SUMMARY) = range(11)
# Indexes into the harness's alt_oids and scan_letters.
OID_INT8, OID_TEXT, OID_BYTEA, OID_FLOAT8, OID_BOOL, OID_INT4, OID_ZERO = range(7)
T_BYTEA, T_TEXT, T_INT8, T_BOOL = range(4)
NULL = None
HIST_LEN = 24 * 8


def cell(v):
    """One cell: None is NULL, an int a bigint, a float a double, else bytes or text."""
    if v is None:
        return b"\xff"
    if isinstance(v, bool):
        v = b"\x01" if v else b"\x00"
    elif isinstance(v, int):
        v = struct.pack(">q", v) if v < 2**63 else struct.pack(">Q", v)
    elif isinstance(v, float):
        v = struct.pack(">d", v)
    elif isinstance(v, str):
        v = v.encode()
    if len(v) >= 0xfe:
        return b"\xfe" + struct.pack(">H", len(v)) + v
    return bytes([len(v)]) + v


def raw(b):
    """A cell of exactly these bytes (a bigint of the wrong length, say)."""
    return ("raw", b)


def enc(v):
    """Encode a cell value or a raw one."""
    if isinstance(v, tuple) and v[0] == "raw":
        b = v[1]
        return (b"\xfe" + struct.pack(">H", len(b)) if len(b) >= 0xfe else bytes([len(b)])) + b
    return cell(v)


def result(d, rows, bad=None, head=b""):
    """An input: decoder d, rows (lists of cells); bad = (column, oid index, flip format)."""
    attr = 0 if bad is None else 0x80 + bad[0]
    out = bytes([d, len(rows) - 1, attr]) + head
    if bad is not None:
        out += bytes([bad[1] | (0x80 if bad[2] else 0)])
    for r in rows:
        out += b"".join(enc(v) for v in r)
    return out


def hist(seed=0):
    """A stored histogram: 24 little-endian uint64."""
    return b"".join(struct.pack("<Q", (seed * 7 + i) % 2**64) for i in range(24))


def variants(d, ok, changes):
    """Row ok of decoder d with each (column, value) of changes in turn, one input each."""
    out = []
    for i, v in changes:
        r = list(ok)
        r[i] = v
        out.append(result(d, [r]))
    return out


def rollout(**kw):
    """A valid column-scoped rollout row; kw replaces cells by column name."""
    cols = dict(
        id=1, tbl="orders", col="card", src_plaintext=0, src_format=1, src_algorithm=1,
        src_key_id="k1", src_key_version=1, dst_format=2, dst_algorithm=2, dst_key_id="k1",
        dst_key_version=2, phase="planned", phase_since=1700000000, canary_kind="all",
        canary_percent=0, canary_tenants="", max_auth_failure_rate=0.001,
        max_parse_error_rate=0.001, max_provider_error_rate=-1.0, max_seal_p99_us=5000,
        max_open_p99_us=5000, min_samples=100, window_s=300, min_soak_s=600, reader_ttl_s=120,
        created=1700000000, updated=1700000000, verified_at=0, scope_key_id="")
    cols.update(kw)
    return list(cols.values())


def key_rollout(**kw):
    """A valid key-scoped rollout row."""
    base = dict(tbl="", col="", src_key_id="payments/kek", dst_key_id="payments/kek",
                scope_key_id="payments/kek", phase="backfill", canary_kind="tenants",
                canary_tenants="t1,t2,acme")
    base.update(kw)
    return rollout(**base)


def rollout_seeds():
    good = [
        [rollout()],
        [key_rollout()],
        [rollout(id=2**63 - 1, phase="read-compat", canary_kind="percent", canary_percent=100,
                 src_plaintext=1, src_format=0, src_algorithm=0, src_key_id="",
                 src_key_version=0, dst_format=255, dst_algorithm=2**32 - 1,
                 dst_key_version=2**32 - 1, window_s=2**32 - 1, min_soak_s=0,
                 reader_ttl_s=2**32 - 1, verified_at=2**63 - 1, phase_since=-2**63,
                 max_seal_p99_us=2**63 - 1, max_auth_failure_rate=float("inf"),
                 tbl="t" * 255, col="c" * 255, dst_key_id="k" * 256)],
        [rollout(id=i + 1, phase=p) for i, p in enumerate(
            ["planned", "read-compat", "write-upgrade", "backfill", "finalized"])],
        [key_rollout(canary_tenants=",".join("t%02d" % i for i in range(64)))],
        [key_rollout(canary_tenants="x" * 64)],
        [rollout(max_auth_failure_rate=-0.0, max_parse_error_rate=1e308)],
    ]
    bad = [
        rollout(id=0), rollout(id=-1), rollout(id=NULL), rollout(tbl="t" * 256),
        rollout(tbl="a\x00b"), rollout(tbl=""), rollout(col=""), rollout(src_plaintext=2),
        rollout(src_format=256), rollout(src_algorithm=2**32), rollout(src_key_id="k" * 257),
        rollout(dst_key_version=-1), rollout(phase="Planned"), rollout(phase="p" * 32),
        rollout(phase=""), rollout(canary_kind="some"), rollout(canary_percent=101),
        rollout(canary_percent=-1), rollout(canary_tenants="t1"),
        rollout(max_auth_failure_rate=float("nan")), rollout(max_seal_p99_us=-1),
        rollout(window_s=0), rollout(reader_ttl_s=0), rollout(min_soak_s=2**32),
        rollout(verified_at=-1), rollout(scope_key_id="k1"), rollout(id=raw(b"\x00" * 7)),
        rollout(max_open_p99_us=raw(b"\x00" * 9)), rollout(max_auth_failure_rate=raw(b"\x00" * 4)),
        key_rollout(tbl="orders"), key_rollout(src_plaintext=1), key_rollout(dst_key_id="other"),
        key_rollout(canary_tenants=""), key_rollout(canary_tenants="a,,b"),
        key_rollout(canary_tenants="t1,"), key_rollout(canary_tenants="x" * 65),
        key_rollout(canary_tenants=",".join("t%02d" % i for i in range(65))),
        key_rollout(canary_kind="all"),
    ]
    out = [result(D_ROLLOUT, rows) for rows in good]
    out += [result(D_ROLLOUT, [r]) for r in bad]
    out += [result(D_ROLLOUT, [rollout(), rollout(id=0), key_rollout()])]
    for col, oid, flip in [(0, OID_INT4, 0), (1, OID_BYTEA, 0), (17, OID_INT8, 0),
                           (12, OID_TEXT, 1), (29, OID_ZERO, 0), (28, OID_FLOAT8, 0)]:
        out.append(result(D_ROLLOUT, [rollout()], bad=(col, oid, flip)))
    return out


def column_seeds():
    rows = [["orders", "card", 0], ["Orders", "pan", 2**63 - 1], ["t" * 255, "c" * 255, 5]]
    out = [result(D_COLUMN, [r]) for r in rows] + [result(D_COLUMN, rows)]
    for r in [["t" * 256, "c", 0], ["t", "c", -1], [NULL, "c", 0], ["t", "c\x00", 0],
              ["t", "c", NULL], ["", "", 0]]:
        out.append(result(D_COLUMN, [r]))
    out.append(result(D_COLUMN, [rows[0]], bad=(2, OID_TEXT, 0)))
    return out


def log_seeds():
    ok = [1, 1, 1700000000, "operator", NULL, "planned", "", 0]
    rows = [ok, [2, 1, -5, "a" * 128, "planned", "read-compat", "r" * 1024, 1],
            [3, 9, 0, "guard", "backfill", "finalized", "auto", 1]]
    out = [result(D_LOG, [r]) for r in rows] + [result(D_LOG, rows)]
    out += variants(D_LOG, ok, [(0, 0), (1, 0), (3, "a" * 129), (4, "nope"), (4, ""), (5, NULL),
                                (5, "x"), (6, "r" * 1025), (7, 2), (7, -1), (3, "a\x00")])
    out.append(result(D_LOG, [ok], bad=(4, OID_BYTEA, 0)))
    return out


def reader_seeds():
    ok = ["web-1", "0.2.0", 2, 3, "k1:1,2;k2:7", 1700000000, 1700000100]
    rows = [ok, ["i" * 128, "v" * 32, 255, 2**32 - 1, "k" * 4096, -1, 2**63 - 1],
            ["w", "", 1, 0, "", 0, 0]]
    out = [result(D_READER, [r]) for r in rows] + [result(D_READER, rows)]
    out += variants(D_READER, ok, [(0, "i" * 129), (1, "v" * 33), (2, 0), (2, 256), (3, 2**32),
                                   (3, -1), (4, "k" * 4097), (5, NULL), (0, "a\x00b"),
                                   (6, raw(b"\x01"))])
    out.append(result(D_READER, [ok], bad=(3, OID_INT4, 0)))
    return out


def sample_seeds():
    ok = [1700000000, 10, 20, 1, 0, 5, 0, hist(1), hist(2), 25000, 61000]
    big = ([2**63 - 1] + [2**63 - 1] * 6 + [b"\xff" * HIST_LEN, b"\xff" * HIST_LEN] +
           [2**63 - 1] * 2)
    rows = [ok, big, [-2**63, 0, 0, 0, 0, 0, 0, b"\x00" * HIST_LEN, hist(3), 0, 0]]
    out = [result(D_SAMPLE, [r]) for r in rows] + [result(D_SAMPLE, rows)]
    out += variants(D_SAMPLE, ok, [(1, -1), (6, -1), (0, NULL), (7, hist(1)[:-1]),
                                   (8, hist(1) + b"\x00"), (7, NULL), (8, b""),
                                   (2, raw(b"\x00" * 8 + b"\x01")), (9, -1), (10, NULL),
                                   (10, -2**63)])
    out.append(result(D_SAMPLE, [ok], bad=(9, OID_INT4, 0)))
    out.append(result(D_SAMPLE, [ok], bad=(7, OID_TEXT, 0)))
    out.append(result(D_SAMPLE, [ok], bad=(0, OID_INT4, 0)))
    return out


def scan(types, rows, bad=None):
    """A scan input: types of value, tenant and each context column (T_*)."""
    head = bytes([len(types) - 2]) + bytes(types)
    return result(D_SCAN, rows, bad=bad, head=head)


def scan_seeds():
    out = [
        scan([T_BYTEA, T_INT8], [[1, b"\x01\x02", NULL, False]]),
        scan([T_BYTEA, T_TEXT], [[5, b"", "acme", True], [6, NULL, "t2", False]]),
        scan([T_TEXT, T_INT8, T_INT8, T_TEXT, T_BYTEA],
             [[-2**63, "v" * 300, 7, 42, "ctx", b"\x00"], [2**63 - 1, "", NULL, NULL, NULL,
                                                          NULL]]),
        scan([T_INT8, T_INT8] + [T_TEXT] * 8, [[1, 99, 1] + ["c%d" % i for i in range(8)] +
                                               [b"\x01"]]),
    ]
    for r in [[NULL, b"v", NULL, False], [raw(b"1"), b"v", NULL, False],
              [1, b"v", NULL, b"\x01\x00"], [1, b"v", NULL, NULL], [1, b"v", NULL, b""],
              [1, b"v", raw(b"\x00" * 4), False], [1, b"v", NULL, raw(b"\x02")],
              [1, b"v", NULL, raw(b"\xff")]]:
        out.append(scan([T_BYTEA, T_INT8], [r]))
    out.append(scan([T_BOOL, T_INT8], [[1, b"\x01", NULL, False]]))
    out.append(scan([T_BOOL, T_INT8], [[1, NULL, NULL, False]]))
    out.append(scan([T_BYTEA, T_INT8], [[1, b"v", NULL, False]], bad=(3, OID_INT8, 0)))
    out.append(scan([T_BYTEA, T_INT8], [[1, b"v", NULL, False]], bad=(0, OID_TEXT, 0)))
    out.append(scan([T_BYTEA, T_INT8], [[1, b"v", NULL, False]], bad=(1, OID_ZERO, 1)))
    return out


def checkpoint(**kw):
    """A valid checkpoint row; kw replaces cells by column name."""
    cols = dict(params="v=1;alg=2;key=k1", state="running", cursor=NULL, pass_=1, done=0,
                skipped=0, raced=0, quarantined=0, wrong_state=0, started=1700000000,
                updated=1700000000, finished=0)
    cols.update(kw)
    return list(cols.values())


def checkpoint_seeds():
    good = [checkpoint(), checkpoint(cursor=12345, state="complete", pass_=2**32 - 1,
                                     done=2**63 - 1, finished=1700000500),
            checkpoint(state="", params="", cursor=-2**63, pass_=0)]
    bad = [checkpoint(params=NULL), checkpoint(state=NULL), checkpoint(params=b"\x00\x01" * 3),
           checkpoint(pass_=2**32), checkpoint(pass_=-1), checkpoint(done=-1),
           checkpoint(wrong_state=-1), checkpoint(started=NULL), checkpoint(cursor="12"),
           checkpoint(finished=raw(b"\x00")), checkpoint(state="run\x00ning"),
           checkpoint(params="v=1\x00")]
    out = [result(D_CHECKPOINT, [r]) for r in good] + [result(D_CHECKPOINT, good)]
    out += [result(D_CHECKPOINT, [r]) for r in bad]
    out.append(result(D_CHECKPOINT, [good[0]], bad=(0, OID_BYTEA, 0)))
    out.append(result(D_CHECKPOINT, [good[1]], bad=(2, OID_TEXT, 0)))
    out.append(result(D_CHECKPOINT, [good[0]], bad=(3, OID_BOOL, 0)))
    lgood = [checkpoint() + ["orders", "card"], checkpoint(cursor=1) + ["t" * 1024, "c"]]
    out += [result(D_LISTED, [r]) for r in lgood] + [result(D_LISTED, lgood)]
    for t, c in [("", "card"), ("orders", ""), ("t" * 1025, "c"), ("a\x00", "c"), (NULL, "c"),
                 ("t", 5)]:
        out.append(result(D_LISTED, [checkpoint() + [t, c]]))
    out.append(result(D_LISTED, [checkpoint(done=-1) + ["t", "c"]]))
    out.append(result(D_LISTED, [lgood[0]], bad=(12, OID_BYTEA, 0)))
    return out


def cell_seeds():
    out = []
    for t, rows in [(T_INT8, [[0]]), (T_INT8, [[2**63 - 1], [-1], [NULL]]),
                    (T_INT8, [[raw(b"\x00" * 7)]]), (T_BYTEA, [[b"\x00\xff"], [b""]]),
                    (T_TEXT, [["count"], [""]]), (T_BOOL, [[True]]), (T_BOOL, [[NULL]])]:
        out.append(result(D_CELL, rows, head=bytes([t])))
    out.append(result(D_CELL, [[5]], bad=(0, OID_INT4, 0), head=bytes([T_INT8])))
    out.append(result(D_CELL, [[5]], bad=(0, OID_INT8, 1), head=bytes([T_INT8])))
    out.append(result(D_CELL, [[NULL]], bad=(0, OID_INT8, 1), head=bytes([T_INT8])))
    return out


def chunk(**kw):
    """A chunk row of the coordinator's binary result (CHUNK_COLS)."""
    cols = dict(chunk_id=0, lo=-2**63, hi=9999, state="running", cursor=42, pass_=1, done=10,
                skipped=2, raced=0, quarantined=0, wrong_state=0, owner="host-1/1234/ab12",
                lease=1700000000123, live=True)
    cols.update(kw)
    return list(cols.values())


def chunk_seeds():
    free = dict(owner=NULL, lease=NULL, live=False)
    good = [chunk(), chunk(chunk_id=7, lo=70000, hi=2**63 - 1, state="complete", cursor=NULL,
                           **free),
            chunk(state="pending", cursor=NULL, pass_=3, **free),
            chunk(chunk_id=99999, lo=5, hi=5, cursor=5, pass_=2**32 - 1, done=2**63 - 1,
                  live=False),
            chunk(state="paused", **free), chunk(state="stopped", cursor=-2**63, **free),
            chunk(state="running", **free)]
    # each refused: a NULL where the schema forbids one, a value out of its
    # range, an unknown state, owner and lease apart, a boolean not 0/1
    bad = [chunk(pass_=0), chunk(pass_=-5), chunk(pass_=2**32), chunk(done=-1),
           chunk(wrong_state=-1), chunk(chunk_id=-1), chunk(chunk_id=100000), chunk(lo=10000),
           chunk(cursor=10000), chunk(cursor=-2**63 + 0, lo=-2**63 + 1), chunk(state=NULL),
           chunk(state="bogus"), chunk(state="Running"), chunk(state=""),
           chunk(state="run\x00ning"), chunk(chunk_id=NULL), chunk(lo=NULL), chunk(pass_=NULL),
           chunk(done=NULL), chunk(owner=NULL), chunk(lease=NULL), chunk(owner=""),
           chunk(owner="o" * 1025), chunk(owner="a\x00b"), chunk(lease=0), chunk(lease=-1),
           chunk(live=NULL), chunk(live=raw(b"\x02")), chunk(live=raw(b"\x01\x00")),
           chunk(state="paused"), chunk(state="complete"), chunk(owner=NULL, lease=NULL),
           chunk(cursor=raw(b"\x00" * 4)), chunk(hi=raw(b"12abc")), chunk(cursor="42")]
    out = [result(D_CHUNK, [r]) for r in good] + [result(D_CHUNK, good)]
    out += [result(D_CHUNK, [r]) for r in bad]
    out.append(result(D_CHUNK, [good[0]], bad=(3, OID_INT8, 0)))
    out.append(result(D_CHUNK, [good[0]], bad=(0, OID_INT8, 1)))   # a text-format column
    out.append(result(D_CHUNK, [good[0]], bad=(13, OID_INT8, 0)))
    out.append(result(D_CHUNK, [good[0]], bad=(5, OID_INT4, 0)))
    sums = [[10, 4, 3, 100, 5, 2, 1, 0, 2], [0] * 9, [100000, 100000, 0, 2**63 - 1, 0, 0, 0, 0,
                                                      2**32 - 1]]
    bsums = [[1, 5, 0, 0, 0, 0, 0, 0, 1], [2, 1, 2, 0, 0, 0, 0, 0, 1], [1, 0, 0, -1, 0, 0, 0, 0, 1],
             [1, 0, 0, 0, 0, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0, 0, 0, 2**32],
             [0, 0, 0, 5, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 0, 0, 1], [100001] + [0] * 7 + [1],
             [NULL] * 9, [1, 0, 0, NULL, 0, 0, 0, 0, 1], [raw(b"1")] + [0] * 8]
    out += [result(D_SUMMARY, [r]) for r in sums + bsums]
    out.append(result(D_SUMMARY, [sums[0]], bad=(3, OID_INT8, 1)))
    return out


def seeds():
    return (rollout_seeds() + column_seeds() + log_seeds() + reader_seeds() + sample_seeds() +
            scan_seeds() + checkpoint_seeds() + cell_seeds() + chunk_seeds())


def main():
    write_corpus("pg_rows_seeds", seeds(), sys.argv[1] if len(sys.argv) > 1 else CORPUS)


if __name__ == "__main__":
    main()
