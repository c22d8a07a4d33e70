#!/usr/bin/env python3
"""fuzz/faults_seeds.py -- write the seed corpus of fuzz_faults.

Usage: python3 fuzz/faults_seeds.py [corpus/fuzz_faults]

Each seed is an input in the format of fuzz/fuzz_faults.c (its header
comment): the operation and fault byte, the batch byte, the call to fail
(big-endian), then rows as a length byte and plaintext bytes.  The seeds
cross every operation with every fault at a few early, middle and late
call positions (the sweep of tests/test_faults.c gives the ranges: about
1,500 allocations, 20 to 30 reads and writes, a few syncs per run), and
one seed per operation with no fault.  Files are named by the SHA-1 of
their content; the script only adds files.
"""
import os
import sys

from seedlib import write_corpus

OPS = range(4)          # encrypt, rewrap, reencrypt, census
FAULTS = range(1, 9)    # FAULTS[1..8] of fuzz/fuzz_faults.c (0 is none)
AT = {1: (1, 40, 400, 900, 1400), 2: (1, 5, 15), 3: (1, 8, 20), 4: (1, 8, 20),
      5: (1,), 6: (1, 2, 4), 7: (1, 4, 10), 8: (1, 4, 10)}
ROWS = [b"4111-0000-0000-0001", b"", b"card three"]


def seed(op, fault, at, batch=8, rows=ROWS):
    b = bytes([op | fault << 4, batch - 1, at >> 8, at & 0xff])
    for r in rows:
        b += bytes([len(r)]) + r
    return b


def seeds():
    out = [seed(op, 0, 1) for op in OPS]
    out += [seed(op, f, at) for op in OPS for f in FAULTS for at in AT[f]]
    out += [seed(0, 3, 10, batch=1), seed(1, 6, 3, batch=2), seed(2, 1, 700, batch=1)]
    return out


if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))
    dest = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "corpus", "fuzz_faults")
    write_corpus("fuzz_faults", seeds(), dest)
