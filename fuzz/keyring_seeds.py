#!/usr/bin/python3
"""fuzz/keyring_seeds.py -- the keyring test vectors and the fuzz_keyring seeds.

    /usr/bin/python3 fuzz/keyring_seeds.py [--markdown] [--list]

Builds keyring files (docs/keyring.md) with a writer of its own,
independent of migrate/keyring_format.c: valid keyrings of several shapes
and at least one input of every rejection class at every element.

  (default)   write each vector of docs/keyring.md (fenced ks-keyring-vector
              blocks, which include the sealed vectors made with libsodium)
              and each input built here, plus every truncation of two
              valid keyrings, as corpus/fuzz_keyring/<sha1 of content>;
  --markdown  print the built-in vectors as ks-keyring-vector blocks, the
              form in which docs/keyring.md Appendix A holds them;
  --list      print name, expectation and length of each built-in vector.

Idempotent: a seed's name is its content's hash; nothing is removed.
Standard library only; run from anywhere.
"""
import os
import re
import struct
import sys

from seedlib import write_corpus

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(ROOT, "corpus", "fuzz_keyring")
SPEC = os.path.join(ROOT, "docs", "keyring.md")

ACTIVE, DECRYPT_ONLY, DISABLED, DESTROYED = 1, 2, 3, 4
T0 = 1700000000  # created, Unix seconds


def u8(v):
    return struct.pack(">B", v)


def u16(v):
    return struct.pack(">H", v)


def u32(v):
    return struct.pack(">I", v)


def u64(v):
    return struct.pack(">Q", v)


def material(seed):
    return bytes((seed * 32 + i) & 0xFF for i in range(32))


def version(number, state, created=T0, mat=None, mlen=None):
    """One version; mat None means the material the state calls for."""
    if mat is None:
        mat = b"" if state == DESTROYED else material(number)
    return u32(number) + u8(state) + u64(created) + u8(len(mat) if mlen is None else mlen) + mat


def record(key_id, versions, primary, count=None, id_len=None, extra=b""):
    body = u16(len(key_id) if id_len is None else id_len) + key_id
    body += u32(len(versions) if count is None else count) + u32(primary)
    body += b"".join(versions) + extra
    return body


def key(rec, rec_len=None):
    return u32(len(rec) if rec_len is None else rec_len) + rec


def body(keys, count=None):
    return u32(len(keys) if count is None else count) + b"".join(keys)


def plain(b, mode=0):
    return b"KSK\x01" + u8(mode) + b


def sealed_header(ops=2, mem=67108864):
    return b"KSK\x01\x01" + bytes(range(16)) + u64(ops) + u64(mem) + bytes(range(24))


def simple_key(key_id, n=1, primary=1):
    return key(record(key_id, [version(i, ACTIVE) for i in range(1, n + 1)], primary))


# ---- the vectors ------------------------------------------------------------

def vectors():
    """[(name, description, expect, bytes)]; expect is 'ok' or (error, offset)."""
    v = []

    def add(name, desc, expect, data):
        v.append((name, desc, expect, data))

    one = plain(body([simple_key(b"app/main")]))
    add("plain-empty", "An empty plain keyring, as ks_keyring_init writes it.", "ok",
        plain(body([])))
    add("plain-one-key", 'One key "app/main", version 1 active and primary, created 1700000000, material 20 21 .. 3f.',
        "ok", one)
    mixed = [
        key(record(b"a", [version(1, DESTROYED), version(2, DISABLED),
                          version(3, DECRYPT_ONLY), version(4, ACTIVE)], 4)),
        key(record(b"billing@eu+1=x", [version(1, ACTIVE, T0 + 1),
                                       version(2, ACTIVE, 0xFFFFFFFFFFFFFFFF)], 1)),
    ]
    add("plain-mixed-states", 'Two keys: "a" with versions destroyed, disabled, decrypt-only '
        'and active (primary 4); "billing@eu+1=x" with two active versions (primary 1).',
        "ok", plain(body(mixed)))
    add("plain-prefix-keys", 'Keys "a" and "ab": a proper prefix sorts first.', "ok",
        plain(body([simple_key(b"a"), simple_key(b"ab", n=2, primary=2)])))
    long_id = (b"kms:eu-west-1/acct@42+rot=7_Q.Z-" * 8)[:256]
    add("plain-long-key-id", "One key whose id has the maximum length, 256 bytes.", "ok",
        plain(body([simple_key(long_id)])))

    # Prefix [K-FRAME].
    add("bad-magic", 'The envelope magic "KSE" instead of "KSK".', ("bad-magic", 2),
        b"KSE\x01\x00" + body([]))
    add("short-magic", "Two bytes of the magic and nothing else.", ("truncated", 0), b"KS")
    add("no-version", "The magic alone.", ("truncated", 3), b"KSK")
    add("version-2", "Format version 2, which does not exist.", ("unsupported-version", 3),
        b"KSK\x02\x00" + body([]))
    add("no-mode", "The magic and the version, no mode byte.", ("truncated", 4), b"KSK\x01")
    add("mode-2", "Mode 2, which does not exist.", ("bad-value", 4), b"KSK\x01\x02" + body([]))

    # Sealed header [K-SEAL].
    add("sealed-short-salt", "Sealed, with only 10 bytes of salt.", ("truncated", 5),
        b"KSK\x01\x01" + bytes(10))
    add("sealed-opslimit-0", "Sealed, opslimit 0.", ("bad-value", 21),
        sealed_header(ops=0) + bytes(20))
    add("sealed-opslimit-17", "Sealed, opslimit 17, above the ceiling of 16.", ("bad-value", 21),
        sealed_header(ops=17) + bytes(20))
    add("sealed-memlimit-small", "Sealed, memlimit 8191, below libsodium's minimum.",
        ("bad-value", 29), sealed_header(mem=8191) + bytes(20))
    add("sealed-memlimit-large", "Sealed, memlimit 1 GiB + 1.", ("bad-value", 29),
        sealed_header(mem=(1 << 30) + 1) + bytes(20))
    add("sealed-short-nonce", "Sealed, the nonce cut after 7 bytes.", ("truncated", 37),
        sealed_header()[:44])
    add("sealed-short-box", "Sealed, a box of 19 bytes: less than the MAC and a key count.",
        ("truncated", 61), sealed_header() + bytes(19))

    # Body [K-BODY].
    add("short-count", "The key count cut after 3 bytes.", ("truncated", 5),
        b"KSK\x01\x00\x00\x00\x00")
    add("too-many-keys", "A key count of 1025.", ("too-large", 5), plain(u32(1025)))
    add("missing-key", "A key count of 2 and one key.", ("truncated", len(one)),
        plain(body([simple_key(b"app/main")], count=2)))
    add("trailing-byte", "One byte after the last key.", ("unknown-field", len(one)), one + b"\x00")

    # Key records [K-KEY].
    k = record(b"k", [version(1, ACTIVE)], 1)
    add("record-too-large", "A record length one above the largest record.", ("too-large", 9),
        plain(body([key(k, rec_len=2 + 256 + 8 + 4096 * 46 + 1)])))
    add("record-short", "A record length that runs past the end of the file.",
        ("truncated", 13), plain(body([key(k, rec_len=len(k) + 1)])))
    add("record-leftover", "A record one byte longer than its contents.", ("unknown-field", 13 + len(k)),
        plain(body([key(k + b"\x00")])))
    add("record-cut", "A record length one short: the material is cut.", ("truncated", 13 + 25),
        plain(body([key(k, rec_len=len(k) - 1)])))
    add("key-id-empty", "A key_id of length 0.", ("bad-value", 13),
        plain(body([key(record(b"", [version(1, ACTIVE)], 1))])))
    add("key-id-257", "A key_id length of 257.", ("too-large", 13),
        plain(body([key(record(b"x" * 257, [version(1, ACTIVE)], 1))])))
    add("key-id-charset", 'The key_id "app main": a space is outside the class.',
        ("bad-value", 18), plain(body([simple_key(b"app main")])))
    add("key-id-cut", "A key_id length of 9 with 8 bytes in the record.", ("truncated", 15),
        plain(body([key(record(b"app/main", [], 1, id_len=9, count=1)[:10])])))
    first = simple_key(b"b")
    add("keys-decreasing", 'Keys "b" then "a".', ("field-order", 9 + len(first) + 4),
        plain(body([first, simple_key(b"a")])))
    add("keys-duplicate", 'Key "b" twice.', ("field-order", 9 + len(first) + 4),
        plain(body([first, simple_key(b"b")])))
    add("keys-prefix-order", 'Keys "ab" then "a": a proper prefix sorts first.',
        ("field-order", 9 + len(simple_key(b"ab")) + 4),
        plain(body([simple_key(b"ab"), simple_key(b"a")])))
    add("keys-order-and-charset",
        'Keys "b" then "a a": out of order and a space; the charset is checked first.',
        ("bad-value", 9 + len(first) + 4 + 2 + 1), plain(body([first, simple_key(b"a a")])))
    add("version-count-0", "A key with no versions.", ("bad-value", 16),
        plain(body([key(record(b"k", [], 1))])))
    add("version-count-4097", "A version count of 4097.", ("too-large", 16),
        plain(body([key(record(b"k", [version(1, ACTIVE)], 1, count=4097))])))
    add("primary-0", "Primary version 0.", ("bad-value", 20),
        plain(body([key(record(b"k", [version(1, ACTIVE)], 0))])))
    add("primary-past-count", "Primary version 2 of 1.", ("bad-value", 20),
        plain(body([key(record(b"k", [version(1, ACTIVE)], 2))])))
    add("short-primary", "The record ends inside the primary field.", ("truncated", 20),
        plain(body([key(record(b"k", [], 1, count=1)[:9])])))

    # Versions [K-VER].
    add("version-gap", "The first version numbered 2.", ("missing-field", 24),
        plain(body([key(record(b"k", [version(2, ACTIVE)], 1, count=1))])))
    add("version-repeat", "Version 1 twice.", ("field-order", 24 + 46),
        plain(body([key(record(b"k", [version(1, ACTIVE), version(1, ACTIVE)], 1))])))
    add("state-0", "State 0 (version 2).", ("bad-value", 28 + 46),
        plain(body([key(record(b"k", [version(1, ACTIVE), version(2, 0, mat=material(2))], 1))])))
    add("state-5", "State 5 (version 2).", ("bad-value", 28 + 46),
        plain(body([key(record(b"k", [version(1, ACTIVE), version(2, 5, mat=material(2))], 1))])))
    add("primary-not-active", "The primary version is decrypt-only.", ("bad-value", 28),
        plain(body([key(record(b"k", [version(1, DECRYPT_ONLY)], 1))])))
    add("material-31", "An active version with 31 bytes of material.", ("bad-value", 37),
        plain(body([key(record(b"k", [version(1, ACTIVE, mat=material(1)[:31])], 1))])))
    add("destroyed-with-material", "A destroyed version that still carries 32 bytes.",
        ("bad-value", 37 + 46),
        plain(body([key(record(b"k", [version(1, ACTIVE), version(2, DESTROYED, mat=material(2))],
                               1))])))
    add("short-created", "The record ends inside `created`.", ("truncated", 29),
        plain(body([key(record(b"k", [version(1, ACTIVE)], 1)[:20])])))
    return v


def check_unique(vs):
    """Every vector's name is unique (the tests and the docs refer to them)."""
    names = [n for n, _, _, _ in vs]
    assert len(names) == len(set(names)), "duplicate vector names"
    return vs


def hexlines(data, width=32):
    return ["hex: " + data[i:i + width].hex() for i in range(0, len(data), width)] or ["hex:"]


def markdown(vs):
    out = []
    for name, desc, expect, data in vs:
        exp = "ok" if expect == "ok" else "%s at %d" % expect
        out += [desc, "", "```ks-keyring-vector", "name: " + name, "expect: " + exp]
        out += hexlines(data) + ["```", ""]
    return "\n".join(out)


def spec_vectors():
    """The bytes of every ks-keyring-vector block of docs/keyring.md."""
    if not os.path.exists(SPEC):
        return []
    text = open(SPEC, encoding="utf-8").read()
    found = []
    for block in re.findall(r"```ks-keyring-vector\n(.*?)```", text, re.S):
        hexes = [l[4:] for l in block.splitlines() if l.startswith("hex:")]
        found.append(bytes.fromhex("".join(h.replace(" ", "") for h in hexes)))
    return found


def main():
    vs = check_unique(vectors())
    if "--markdown" in sys.argv:
        print(markdown(vs))
        return
    if "--list" in sys.argv:
        for name, _, expect, data in vs:
            print(name, expect, len(data))
        return
    seeds = [d for _, _, _, d in vs] + spec_vectors()
    for n, _, exp, d in vs:
        if n in ("plain-one-key", "plain-mixed-states"):
            seeds += [d[:i] for i in range(len(d))]
    # Every cut inside a record whose length agrees with the cut, so that
    # each element of a record is found truncated by the record's end.
    rec = record(b"k", [version(1, ACTIVE), version(2, DESTROYED)], 1)
    seeds += [plain(body([key(rec[:i])])) for i in range(len(rec))]
    # Every cut of a sealed header.
    sealed = sealed_header() + bytes(20)
    seeds += [sealed[:i] for i in range(len(sealed) + 1)]
    write_corpus("keyring_seeds", list(dict.fromkeys(seeds)), CORPUS)


if __name__ == "__main__":
    main()
