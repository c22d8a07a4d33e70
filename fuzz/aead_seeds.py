#!/usr/bin/python3
"""fuzz/aead_seeds.py -- the fuzz_aead seeds: inputs for the AEAD engines' differential.

    /usr/bin/python3 fuzz/aead_seeds.py [OUTDIR]

An input (fuzz/fuzz_aead.c) is a control byte, a 32-byte key, a 24-byte
nonce, a length byte and that many AAD bytes, a 2-byte tamper position and
the plaintext.  Seeds: both algorithms, either engine sealing, with and
without tampering, a repeated key, the expanded AES-GCM key; plaintexts
around the engine rule's thresholds (migrate/crypto/aead.h) and the block
sizes (0, 1, 15 to 17, 63 to 65, 127 to 129, 255 to 257, 511 to 513,
1024, 2048, 4000 bytes) and AADs of 0, 44, 84 and 255 bytes; into
corpus/fuzz_aead/<sha1>.

Idempotent: a seed's name is its content's hash; nothing is removed.
Standard library only; run from anywhere.
"""
import os
import sys

from seedlib import write_corpus

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(ROOT, "corpus", "fuzz_aead")
SIZES = [0, 1, 15, 16, 17, 63, 64, 65, 127, 128, 129, 255, 256, 257, 511, 512, 513, 1024, 2048, 4000]
AADS = [0, 44, 84, 255]


def pattern(n, seed):
    return bytes((i * 37 + seed * 11 + 1) & 0xFF for i in range(n))


def one(ctl, size, aad, at, seed):
    """One input: control byte, key, nonce, AAD, tamper position, plaintext."""
    return (bytes([ctl]) + pattern(32, seed) + pattern(24, seed + 1) + bytes([aad]) +
            pattern(aad, seed + 2) + at.to_bytes(2, "big") + pattern(size, seed + 3))


def seeds():
    out = []
    for i, size in enumerate(SIZES):
        for alg in (0, 1):
            ctl = alg | (2 if i % 2 else 0) | (4 if i % 3 == 0 else 0) | (8 if i % 4 == 1 else 0) \
                | (16 if i % 5 == 2 else 0)
            out.append(one(ctl, size, AADS[i % len(AADS)], (i * 977) & 0xFFFF, i))
    for ctl in range(32):
        out.append(one(ctl, 600, 84, 0x2003, ctl))
    return out


def main(argv):
    write_corpus("aead_seeds", sorted(set(seeds())), argv[0] if argv else CORPUS)


if __name__ == "__main__":
    main(sys.argv[1:])
