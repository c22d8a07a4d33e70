#!/usr/bin/python3
"""fuzz/p11meta_seeds.py -- the fuzz_p11meta seeds: pkcs11 provider metadata records.

    /usr/bin/python3 fuzz/p11meta_seeds.py [OUTDIR]

Builds records of migrate/keys/p11_meta.h with a writer of its own
("KSPM", version 1, seq u64, key_id length u16 and bytes, version count
u32, primary u32, one state byte per version; big-endian): valid records
of several shapes and at least one input of every rejection class, plus
every truncation of one valid record, into corpus/fuzz_p11meta/<sha1>.

Idempotent: a seed's name is its content's hash; nothing is removed.
Standard library only; run from anywhere.
"""
import os
import struct
import sys

from seedlib import write_corpus

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(ROOT, "corpus", "fuzz_p11meta")


def record(seq=1, key_id=b"k", states=b"\x01", primary=1, magic=b"KSPM", version=1,
           id_len=None, count=None, tail=b""):
    """One record; the overrides make it break one rule."""
    return (magic + struct.pack(">BQH", version, seq, len(key_id) if id_len is None else id_len)
            + key_id + struct.pack(">II", len(states) if count is None else count, primary)
            + states + tail)


def seeds():
    s = [
        record(),
        record(seq=7, key_id=b"payments/kek", states=b"\x02\x01\x04", primary=2),
        record(seq=2**64 - 1, key_id=b"a.b:c_d-e/f@g+h=i", states=b"\x04\x03\x02\x01", primary=4),
        record(key_id=b"z" * 256, states=b"\x01" * 4096, primary=4096),
        record(key_id=b"x" * 200, states=bytes([1 + i % 4 for i in range(300)]), primary=1),
    ]
    bad = [
        record(magic=b"KSPX"), record(magic=b"KSK\x01"), record(version=0), record(version=2),
        record(seq=0), record(id_len=0, key_id=b""), record(key_id=b"k k"), record(key_id=b"k\x00"),
        record(key_id=b"z" * 257), record(id_len=300), record(id_len=0xFFFF),
        record(states=b"", count=0, primary=0), record(count=4097), record(count=2**32 - 1),
        record(primary=0), record(primary=2), record(states=b"\x02", primary=1),
        record(states=b"\x01\x00"), record(states=b"\x01\x05"), record(tail=b"\x00"),
        record(count=2), b"", b"KSPM", b"KSPM\x01",
    ]
    v = record(seq=3, key_id=b"t/k", states=b"\x01\x02", primary=1)
    return s + bad + [v[:n] for n in range(len(v))]


def main():
    write_corpus("p11meta_seeds", seeds(), sys.argv[1] if len(sys.argv) > 1 else CORPUS)


if __name__ == "__main__":
    main()
