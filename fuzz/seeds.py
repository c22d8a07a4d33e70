#!/usr/bin/python3
"""fuzz/seeds.py -- (re)generate the seed corpora of the fuzz targets.

    /usr/bin/python3 fuzz/seeds.py [--spec docs/format.md] [--prune] [--list]

Writes each seed as corpus/<target>/<sha1 of content> for every target in
TARGETS.  Seeds come from two places:

  1. every test vector of the spec: fenced blocks ```ks-vector ... ``` in
     docs/format.md, with `name:`, `expect:` and one or more `hex:` lines
     whose hex digits are concatenated (whitespace inside a line ignored);
  2. envelopes built here, independently of the C encoder: valid v1 and v2
     envelopes of both algorithms with field lengths at their bounds, and at
     least one input of every rejection class (docs/format.md section 5) at
     every field, every truncation point of a small envelope, and inputs
     aimed at the nanopb differential's known divergences.

Re-running is idempotent: a seed's name is its content's hash.  Existing
files are never removed unless --prune is given, which deletes seeds in
corpus/<target>/ that this script does not generate (use it only when no
fuzzer-found inputs have been committed there; they belong in
corpus/regressions/ anyway).  Standard library only; run from anywhere.
"""
import hashlib
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGETS = ["fuzz_parse", "fuzz_differential"]

VARINT, I64, LEN, SGROUP, EGROUP, I32 = 0, 1, 2, 3, 4, 5


def varint(v):
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def tag(number, wire):
    return varint(number << 3 | wire)


def vfield(number, value):
    return tag(number, VARINT) + varint(value)


def bfield(number, value):
    return tag(number, LEN) + varint(len(value)) + value


def pattern(n, seed=0):
    return bytes((i * 37 + seed * 11 + 1) & 0xFF for i in range(n))


NONCE = {1: 12, 2: 24}
CHARS_NAME = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:-"
CHARS_KEYID = CHARS_NAME + b"/@+="


def fields_of(version, alg=1, tenant=b"acme", key_id=b"kms:key/1", kver=1,
              wdek=None, nonce=None, purpose=b"db.users", commitment=None, ct=None):
    """The canonical field list: [(number, wire, payload bytes)]."""
    wdek = pattern(40, 1) if wdek is None else wdek
    nonce = pattern(NONCE.get(alg, 12), 2) if nonce is None else nonce
    commitment = pattern(32, 3) if commitment is None else commitment
    ct = pattern(32, 4) if ct is None else ct
    fl = [(1, VARINT, varint(alg)), (2, LEN, tenant), (3, LEN, key_id),
          (4, VARINT, varint(kver)), (5, LEN, wdek), (6, LEN, nonce)]
    if version == 2:
        fl += [(7, LEN, purpose), (8, LEN, commitment)]
    fl += [(15, LEN, ct)]
    return fl


def enc_field(f):
    number, wire, payload = f
    if wire == LEN:
        return tag(number, LEN) + varint(len(payload)) + payload
    return tag(number, wire) + payload


def envelope(version, fl=None, **kw):
    if fl is None:
        fl = fields_of(version, **kw)
    return b"KSE" + bytes([version]) + b"".join(enc_field(f) for f in fl)


def replace(fl, number, raw):
    """Replace field `number`'s encoding by raw bytes."""
    return [("raw", raw) if f[0] == number else f for f in fl]


def build(version, items):
    out = b"KSE" + bytes([version])
    for it in items:
        out += it[1] if it[0] == "raw" else enc_field(it)
    return out


def generated():
    seeds = []

    def add(b):
        seeds.append(bytes(b))

    # ---- accepted envelopes ------------------------------------------------
    for v in (1, 2):
        for alg in (1, 2):
            add(envelope(v, alg=alg))
        add(envelope(v, tenant=b"t", key_id=b"k", wdek=b"\x00", purpose=b"p", ct=bytes(16)))
        add(envelope(v, tenant=(CHARS_NAME * 2)[:64], key_id=(CHARS_KEYID * 4)[:256],
                     wdek=pattern(1024, 5), purpose=CHARS_NAME[::-1][:64], ct=pattern(300, 6),
                     alg=2))
        for kver in (127, 128, 16383, 16384, 1 << 21, 1 << 28, 0xFFFFFFFF):
            add(envelope(v, kver=kver))
        add(envelope(v, key_id=b"/@+=-._:", tenant=b"-._:", purpose=b":_.-"))
        add(envelope(v, wdek=pattern(127, 7), ct=pattern(127, 8)))
        add(envelope(v, wdek=pattern(128, 7), ct=pattern(128, 8)))

    # ---- prefix ------------------------------------------------------------
    for b in (b"", b"K", b"KS", b"KSE", b"X", b"KX", b"KSX", b"kse\x01", b"KSE\x00",
              b"KSE\x03", b"KSE\xff", b"KSE\x01", b"KSE\x02", b"\x00\x00\x00\x00"):
        add(b)

    for v in (1, 2):
        base = fields_of(v)
        numbers = [f[0] for f in base]
        # every truncation point of a small envelope (v2 gives ~190 inputs)
        small = envelope(v, wdek=b"w", tenant=b"t", key_id=b"k", purpose=b"p", ct=bytes(16))
        for i in range(len(small)):
            add(small[:i])
        full = envelope(v)
        # trailing bytes after the ciphertext
        for tail in (b"\x00", b"\x08", b"\x7a", b"\x7a\x10" + bytes(16), b"\x80", b"\x08\x01",
                     b"\x80\x01", b"\xff\xff\xff\xff\xff"):
            add(full + tail)
        for f in base:
            n, wire = f[0], f[1]
            # wrong wire types
            for w in ((LEN, I32, I64) if wire == VARINT else (VARINT, SGROUP, 7)):
                add(build(v, replace(base, n, tag(n, w) + b"\x01")))
            # missing (skipped) field
            add(build(v, [g for g in base if g[0] != n]))
            # duplicate field
            i = numbers.index(n)
            add(build(v, base[:i + 1] + [f] + base[i + 1:]))
            # non-canonical tag (two bytes for a one-byte tag)
            t = tag(n, wire)[0]
            rest = enc_field(f)[1:]
            add(build(v, replace(base, n, bytes([t | 0x80, 0x00]) + rest)))
            # truncated inside the tag, the length/value varint, the value
            prefix = build(v, base[:i])
            add(prefix + bytes([t | 0x80]))
            add(prefix + bytes([t, 0x80]))
            add(prefix + bytes([t, 0xff, 0xff]))
            if wire == LEN:
                add(prefix + bytes([t]) + varint(len(f[2]) + 1) + f[2])
                add(prefix + bytes([t]) + varint(len(f[2])) + f[2][:-1])
                # non-canonical length
                add(build(v, replace(base, n, bytes([t, len(f[2]) | 0x80, 0x00]) + f[2])))
                add(build(v, replace(base, n, bytes([t, len(f[2]) | 0x80, 0x80, 0x00]) + f[2])))
                # overflowing length varints
                add(prefix + bytes([t, 0xff, 0xff, 0xff, 0xff, 0x0f]))
                add(prefix + bytes([t, 0xff, 0xff, 0xff, 0xff, 0x10]))
                add(prefix + bytes([t, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]))
                # empty value
                add(build(v, replace(base, n, bytes([t, 0]))))
            else:
                add(build(v, replace(base, n, bytes([t, 0x81, 0x00]))))
                add(build(v, replace(base, n, bytes([t, 0x81, 0x80, 0x80, 0x80, 0x00]))))
                add(build(v, replace(base, n, bytes([t, 0xff, 0xff, 0xff, 0xff, 0x10]))))
                add(build(v, replace(base, n, bytes([t, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]))))
                add(build(v, replace(base, n, bytes([t, 0x80, 0x80, 0x80, 0x80, 0x80]))))
                add(build(v, replace(base, n, bytes([t, 0x00]))))
        # out of order: every adjacent pair swapped
        for i in range(len(base) - 1):
            add(build(v, base[:i] + [base[i + 1], base[i]] + base[i + 2:]))
        # unknown fields, at the start and in the middle
        for unk in (tag(0, VARINT) + b"\x01", tag(0, LEN) + b"\x00", tag(9, VARINT) + b"\x01",
                    tag(14, LEN) + b"\x01x", tag(16, LEN) + b"\x00", tag(15, I32) + b"abcd",
                    tag(10, I64) + bytes(8), tag(11, I32) + bytes(4), tag(12, SGROUP),
                    tag(100000, VARINT) + b"\x00", tag((1 << 29) - 1, VARINT) + b"\x00",
                    b"\xff\xff\xff\xff\x0f\x00"):
            add(build(v, [("raw", unk)] + base))
            add(build(v, base[:3] + [("raw", unk)] + base[3:]))
        if v == 1:
            # v2-only fields in v1
            add(build(1, base[:6] + [(7, LEN, b"p")] + base[6:]))
            add(build(1, base[:6] + [(8, LEN, pattern(32))] + base[6:]))
        # too large
        add(envelope(v, tenant=b"t" * 65))
        add(envelope(v, key_id=b"k" * 257))
        add(envelope(v, wdek=pattern(1025)))
        if v == 2:
            add(envelope(v, purpose=b"p" * 65))
        i15 = len(base) - 1
        add(build(v, base[:i15]) + b"\x7a" + varint((1 << 20) + 17))
        add(build(v, base[:i15]) + b"\x7a" + varint((16 << 20) + 17))
        add(build(v, base[:i15]) + b"\x7a" + varint(0xFFFFFFFF))
        # bad values
        for alg in (0, 3, 127, 128, 0xFFFFFFFF):
            add(build(v, replace(base, 1, tag(1, VARINT) + varint(alg))))
        add(envelope(v, kver=0))
        for n_len, alg in ((11, 1), (13, 1), (24, 1), (12, 2), (23, 2), (25, 2), (0, 1)):
            add(envelope(v, alg=alg, nonce=pattern(n_len)))
        add(envelope(v, ct=bytes(15)))
        add(envelope(v, ct=b""))
        add(envelope(v, ct=bytes(1)))
        if v == 2:
            for c in (0, 31, 33):
                add(envelope(v, commitment=pattern(c)))
        for bad in (b"/", b" ", b"\x00", b"\xff", b"!", b"@", b"\x80", b"~"):
            add(envelope(v, tenant=bad + b"acme"))
            add(envelope(v, tenant=b"ac" + bad + b"me"))
            add(envelope(v, tenant=b"acme" + bad))
            add(envelope(v, key_id=b"key" + bad))
            add(envelope(v, key_id=bad))
            if v == 2:
                add(envelope(v, purpose=b"db" + bad))

    # ---- aimed at nanopb's divergences --------------------------------------
    for v in (1, 2):
        base = fields_of(v)
        # ciphertext as a varint / fixed field: nanopb hands it to the callback
        add(build(v, base[:-1] + [(15, VARINT, varint(5))]))
        add(build(v, base[:-1] + [(15, I32, b"abcd")]))
        add(build(v, base[:-1] + [(15, I64, bytes(8))]))
        # ciphertext twice: last wins in nanopb
        add(build(v, base + [base[-1]]))
        # a varint of 10 bytes (valid for nanopb's 64-bit reader)
        add(build(v, replace(base, 4, tag(4, VARINT) + b"\x81\x80\x80\x80\x80\x80\x80\x80\x80\x00")))
        # a uint32 over 2^32 (nanopb: integer too large)
        add(build(v, replace(base, 4, tag(4, VARINT) + varint(1 << 32))))
        # packed encoding of a varint field (wire type 2)
        add(build(v, replace(base, 4, tag(4, LEN) + b"\x01\x07")))
        # every field in reverse order
        add(build(v, list(reversed(base))))
        # negative int32-style sign extension of a uint32 (10 bytes)
        add(build(v, replace(base, 4, tag(4, VARINT) + b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01")))
        # an empty body
        add(b"KSE" + bytes([v]))
    return seeds


def spec_vectors(path):
    """[(name, expect, bytes)] from ```ks-vector blocks of the spec."""
    if not os.path.exists(path):
        return []
    text = open(path, encoding="utf-8").read()
    out = []
    for m in re.finditer(r"^```ks-vector[^\n]*\n(.*?)^```", text, re.S | re.M):
        name, expect, hexs = None, None, []
        for line in m.group(1).splitlines():
            key, _, val = line.strip().partition(":")
            key = key.strip()
            if key == "name":
                name = val.strip()
            elif key == "expect":
                expect = val.strip()
            elif key == "hex":
                hexs.append(re.sub(r"\s+", "", val))
        h = "".join(hexs)
        if name is None or expect is None or re.fullmatch(r"(?:[0-9a-fA-F]{2})*", h) is None:
            sys.exit("seeds.py: malformed ks-vector block %r in %s" % (name, path))
        out.append((name, expect, bytes.fromhex(h)))
    return out


def main(argv):
    spec = os.path.join(ROOT, "docs", "format.md")
    prune = "--prune" in argv
    listing = "--list" in argv
    if "--spec" in argv:
        spec = argv[argv.index("--spec") + 1]
    vectors = spec_vectors(spec)
    seeds = [v[2] for v in vectors] + generated()
    if listing:
        for name, expect, b in vectors:
            print("%s %s %s" % (hashlib.sha1(b).hexdigest(), name, expect))
    names = {}
    for b in seeds:
        names[hashlib.sha1(b).hexdigest()] = b
    for t in TARGETS:
        d = os.path.join(ROOT, "corpus", t)
        os.makedirs(d, exist_ok=True)
        new = 0
        for h, b in names.items():
            p = os.path.join(d, h)
            if not os.path.exists(p):
                with open(p, "wb") as f:
                    f.write(b)
                new += 1
        pruned = 0
        if prune:
            for fn in os.listdir(d):
                if re.fullmatch(r"[0-9a-f]{40}", fn) and fn not in names:
                    os.unlink(os.path.join(d, fn))
                    pruned += 1
        print("seeds.py: corpus/%s: %d seeds (%d spec vectors), %d new, %d pruned"
              % (t, len(names), len(vectors), new, pruned))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
