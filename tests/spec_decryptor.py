#!/usr/bin/python3
"""spec_decryptor.py -- an independent keyshift decrypter, written from the spec alone.

This is a second implementation of keyshift decryption, written only from
the normative documents docs/format.md (the envelope and its cryptography)
and docs/keyring.md (the local keyring file and the local wrap), without
looking at the C sources.  Its purpose is to show that those two documents
are enough to read what the `keyshift` tool writes; every step cites the
clause it comes from.  The test tests/cli_spec_decryptor_test.sh drives it.

It needs only Debian's python3 and two Debian packages: python3-cryptography
(AES-256-GCM and the RFC 8439 ChaCha20-Poly1305 AEAD) and python3-argon2
(Argon2id).  HChaCha20, HSalsa20, Salsa20 and Poly1305 are written out
below, as the spec spells them out ([F-CRYPTO-ALG-1], [K-SEAL-3]).

Usage:
    spec_decryptor.py --keyring FILE [--passphrase-file F] --context C
                      [--tenant T] [--purpose P] ENVELOPE_FILE
        prints the plaintext to stdout and exits 0; on any failure it
        prints one line to stderr and exits 65.
    spec_decryptor.py --self-test FORMAT_MD KEYRING_MD
        checks this implementation against every vector of Appendix A and
        C of docs/format.md and Appendix A of docs/keyring.md.
"""

import argparse
import errno
import hashlib
import hmac
import os
import re
import stat
import struct
import sys

import argon2.low_level
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM, ChaCha20Poly1305

EX_DATAERR = 65


class Failure(Exception):
    """Any reason not to release a plaintext; the message is the one line printed."""


class Rejection(Failure):
    """A parse rejection: an error name and a byte offset ([F-ERR-1..2], [K-ERR-1..2])."""

    def __init__(self, name, offset):
        super().__init__("%s at byte %d" % (name, offset))
        self.name = name
        self.offset = offset


# ---- primitives ----------------------------------------------------------------

MASK32 = 0xFFFFFFFF
SIGMA = b"expand 32-byte k"


def _rotl(x, n):
    return ((x << n) & MASK32) | (x >> (32 - n))


def _chacha_rounds(s):
    """20 ChaCha rounds (10 double rounds) in place, RFC 8439 section 2.1-2.3."""

    def qr(a, b, c, d):
        s[a] = (s[a] + s[b]) & MASK32; s[d] = _rotl(s[d] ^ s[a], 16)
        s[c] = (s[c] + s[d]) & MASK32; s[b] = _rotl(s[b] ^ s[c], 12)
        s[a] = (s[a] + s[b]) & MASK32; s[d] = _rotl(s[d] ^ s[a], 8)
        s[c] = (s[c] + s[d]) & MASK32; s[b] = _rotl(s[b] ^ s[c], 7)

    for _ in range(10):
        qr(0, 4, 8, 12); qr(1, 5, 9, 13); qr(2, 6, 10, 14); qr(3, 7, 11, 15)
        qr(0, 5, 10, 15); qr(1, 6, 11, 12); qr(2, 7, 8, 13); qr(3, 4, 9, 14)


def hchacha20(key, n16):
    """HChaCha20 of [XCHACHA] section 2.2: the ChaCha state of the constants,
    the key and the 16 input bytes, 20 rounds without the final addition,
    output words 0..3 and 12..15."""
    s = list(struct.unpack("<4I", SIGMA) + struct.unpack("<8I", key) + struct.unpack("<4I", n16))
    _chacha_rounds(s)
    return struct.pack("<8I", *(s[0:4] + s[12:16]))


def _salsa_rounds(s):
    """20 Salsa20 rounds (10 double rounds) in place, [SALSA20]."""

    def qr(a, b, c, d):
        s[b] ^= _rotl((s[a] + s[d]) & MASK32, 7)
        s[c] ^= _rotl((s[b] + s[a]) & MASK32, 9)
        s[d] ^= _rotl((s[c] + s[b]) & MASK32, 13)
        s[a] ^= _rotl((s[d] + s[c]) & MASK32, 18)

    for _ in range(10):
        # column round, then row round
        qr(0, 4, 8, 12); qr(5, 9, 13, 1); qr(10, 14, 2, 6); qr(15, 3, 7, 11)
        qr(0, 1, 2, 3); qr(5, 6, 7, 4); qr(10, 11, 8, 9); qr(15, 12, 13, 14)


def _salsa_state(key, in16):
    """Salsa20 input matrix: constants on the diagonal (words 0, 5, 10, 15),
    key words 1..4 and 11..14, the 16 input bytes in words 6..9."""
    c = struct.unpack("<4I", SIGMA)
    k = struct.unpack("<8I", key)
    i = struct.unpack("<4I", in16)
    return [c[0], k[0], k[1], k[2], k[3], c[1], i[0], i[1],
            i[2], i[3], c[2], k[4], k[5], k[6], k[7], c[3]]


def hsalsa20(key, n16):
    """HSalsa20 of [XSALSA20]: 20 rounds without the feed-forward, output
    words 0, 5, 10, 15, 6, 7, 8, 9 ([K-SEAL-3] step 1)."""
    s = _salsa_state(key, n16)
    _salsa_rounds(s)
    return struct.pack("<8I", *[s[i] for i in (0, 5, 10, 15, 6, 7, 8, 9)])


def salsa20_stream(key, n8, length):
    """Salsa20/20 keystream, 8-byte nonce, 64-bit little-endian block
    counter from 0 in words 8 and 9 ([K-SEAL-3] step 2)."""
    out = bytearray()
    block = 0
    while len(out) < length:
        init = _salsa_state(key, n8 + struct.pack("<Q", block))
        s = list(init)
        _salsa_rounds(s)
        out += struct.pack("<16I", *[(a + b) & MASK32 for a, b in zip(s, init)])
        block += 1
    return bytes(out[:length])


def poly1305(key32, msg):
    """Poly1305 with a 32-byte one-time key, [RFC 8439] section 2.5."""
    r = int.from_bytes(key32[:16], "little") & 0x0FFFFFFC0FFFFFFC0FFFFFFC0FFFFFFF
    s = int.from_bytes(key32[16:32], "little")
    p = (1 << 130) - 5
    acc = 0
    for i in range(0, len(msg), 16):
        acc = (acc + int.from_bytes(msg[i:i + 16] + b"\x01", "little")) * r % p
    return ((acc + s) & ((1 << 128) - 1)).to_bytes(16, "little")


def secretbox_open(box, nonce24, key):
    """crypto_secretbox_open_easy as [K-SEAL-3] spells it out: box = tag || c,
    XSalsa20 keystream S, Poly1305 key S[0..32), body = c XOR S[32..)."""
    tag, c = box[:16], box[16:]
    subkey = hsalsa20(key, nonce24[:16])                     # step 1
    stream = salsa20_stream(subkey, nonce24[16:24], 32 + len(c))  # step 2
    if not hmac.compare_digest(poly1305(stream[:32], c), tag):    # steps 3, 5, 6
        return None
    return bytes(a ^ b for a, b in zip(c, stream[32:]))      # step 4


def xchacha20poly1305_decrypt(key, nonce24, ct, aad):
    """AEAD_XChaCha20_Poly1305 decryption ([F-CRYPTO-ALG-1]): K' = HChaCha20(K,
    n[0..16)), then RFC 8439 ChaCha20-Poly1305 under K' with the nonce
    00000000 || n[16..24)."""
    sub = hchacha20(key, nonce24[:16])
    try:
        return ChaCha20Poly1305(sub).decrypt(b"\0" * 4 + nonce24[16:24], ct, aad)
    except InvalidTag:
        return None


def aes256gcm_decrypt(key, nonce12, ct, aad):
    """GCM with AES-256, 96-bit IV, 128-bit tag ([F-CRYPTO-ALG-1])."""
    try:
        return AESGCM(key).decrypt(nonce12, ct, aad)
    except InvalidTag:
        return None


# ---- keyring file (docs/keyring.md) --------------------------------------------

MAX_KEYRING_FILE = 61 + 16 + 193214468  # [K-ERR-3] step 4
KEYID_CLASS = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:/@+=-")
NAME_CLASS = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:-")
STATES = {1: "active", 2: "decrypt-only", 3: "disabled", 4: "destroyed"}


class _Reader:
    """Big-endian fixed-width reads from data[pos:end]; `base` maps an index
    of data to a file offset (nonzero for a decrypted box, [K-ERR-2])."""

    def __init__(self, data, pos, end, base=0):
        self.data, self.pos, self.end, self.base = data, pos, end, base

    def off(self, pos=None):
        return self.base + (self.pos if pos is None else pos)

    def take(self, n):
        if self.end - self.pos < n:
            raise Rejection("truncated", self.off())
        b = self.data[self.pos:self.pos + n]
        self.pos += n
        return b

    def uint(self, n):
        return int.from_bytes(self.take(n), "big")

    def bounded(self, n, lo, hi):
        """An n-byte count: below lo is bad-value, above hi too-large, at its first byte."""
        off = self.off()
        v = self.uint(n)
        if v > hi:
            raise Rejection("too-large", off)
        if v < lo:
            raise Rejection("bad-value", off)
        return v


def parse_keyring_header(data):
    """[K-FRAME-1..3], [K-SEAL-1..3]: returns (mode, salt, ops, mem, nonce)."""
    for i, m in enumerate(b"KSK"):                                   # [K-FRAME-1]
        if i < len(data) and data[i] != m:
            raise Rejection("bad-magic", i)
    if len(data) < 3:
        raise Rejection("truncated", 0)
    if len(data) < 4:                                                # [K-FRAME-2]
        raise Rejection("truncated", 3)
    if data[3] != 1:
        raise Rejection("unsupported-version", 3)
    if len(data) < 5:                                                # [K-FRAME-3]
        raise Rejection("truncated", 4)
    if data[4] not in (0, 1):
        raise Rejection("bad-value", 4)
    if data[4] == 0:
        return 0, None, None, None, None
    r = _Reader(data, 5, len(data))                                  # [K-SEAL-1]
    salt = r.take(16)
    ops = r.uint(8)
    if not 1 <= ops <= 16:                                           # [K-SEAL-2]
        raise Rejection("bad-value", 21)
    mem = r.uint(8)
    if not 8192 <= mem <= 1073741824:
        raise Rejection("bad-value", 29)
    nonce = r.take(24)
    if len(data) - 61 < 20:                                          # [K-SEAL-3]
        raise Rejection("truncated", 61)
    return 1, salt, ops, mem, nonce


def derive_seal_key(passphrase, salt, ops, mem):
    """[K-SEAL-4]: Argon2id v1.3, t = opslimit, m = memlimit / 1024 (floor),
    p = 1, 32 bytes, no secret, no associated data."""
    return argon2.low_level.hash_secret_raw(
        secret=passphrase, salt=salt, time_cost=ops, memory_cost=mem // 1024,
        parallelism=1, hash_len=32, type=argon2.low_level.Type.ID, version=0x13)


def parse_keyring_body(body, base):
    """Section 4: returns {key_id: {version: (state, material)}}.  `base` is
    the file offset of body byte 0 (5 plain, 77 sealed, [K-ERR-2])."""
    r = _Reader(body, 0, len(body), base)
    count = r.bounded(4, 0, 1024)                                    # [K-BODY-1]
    keys = {}
    prev = None
    for _ in range(count):
        rec_len = r.bounded(4, 0, 188682)                            # [K-KEY-1]
        if r.end - r.pos < rec_len:
            raise Rejection("truncated", r.off())
        rec = _Reader(body, r.pos, r.pos + rec_len, base)
        r.pos += rec_len
        il_off = rec.off()
        id_len = rec.bounded(2, 1, 256)                              # [K-KEY-2]
        id_start = rec.pos
        key_id = bytes(rec.take(id_len))
        for i, b in enumerate(key_id):
            if b not in KEYID_CLASS:
                raise Rejection("bad-value", rec.off(id_start + i))
        if prev is not None and key_id <= prev:                      # [K-KEY-3]
            raise Rejection("field-order", il_off)
        prev = key_id
        vcount = rec.bounded(4, 1, 4096)                             # [K-KEY-4]
        pr_off = rec.off()
        primary = rec.uint(4)                                        # [K-KEY-5]
        if not 1 <= primary <= vcount:
            raise Rejection("bad-value", pr_off)
        versions = {}
        for n in range(1, vcount + 1):
            num_off = rec.off()
            number = rec.uint(4)                                     # [K-VER-1]
            if number < n:
                raise Rejection("field-order", num_off)
            if number > n:
                raise Rejection("missing-field", num_off)
            st_off = rec.off()
            state = rec.uint(1)                                      # [K-VER-2]
            if state not in STATES:
                raise Rejection("bad-value", st_off)
            if n == primary and state != 1:                          # [K-KEY-5]
                raise Rejection("bad-value", st_off)
            rec.take(8)                                              # created, [K-VER-4]
            ml_off = rec.off()
            mlen = rec.uint(1)                                       # [K-VER-3]
            if mlen != (0 if state == 4 else 32):
                raise Rejection("bad-value", ml_off)
            versions[n] = (state, bytes(rec.take(mlen)))
        if rec.pos != rec.end:                                       # [K-KEY-1]
            raise Rejection("unknown-field", rec.off())
        keys[key_id] = versions
    if r.pos != r.end:                                               # [K-BODY-2]
        raise Rejection("unknown-field", r.off())
    return keys


def open_keyring_bytes(data, passphrase):
    """[K-ERR-3] step 6 / [K-SEAL-6] order: header, then the passphrase
    decision, then Argon2id and the box, then the body."""
    if len(data) > MAX_KEYRING_FILE:                                 # [K-ERR-3] step 4
        raise Rejection("too-large", MAX_KEYRING_FILE)
    mode, salt, ops, mem, nonce = parse_keyring_header(data)
    if mode == 0:
        if passphrase:
            raise Failure("bad-passphrase: a plain keyring opened with a passphrase")
        return parse_keyring_body(data[5:], 5)
    if not passphrase:
        raise Failure("bad-passphrase: a sealed keyring needs a passphrase")
    key = derive_seal_key(passphrase, salt, ops, mem)
    body = secretbox_open(data[61:], nonce, key)
    if body is None:
        raise Failure("bad-passphrase: the keyring box does not open")
    return parse_keyring_body(body, 61 + 16)                         # [K-SEAL-3] step 6


def read_keyring_file(path):
    """[K-FILE-1]: no symbolic link, a regular file owned by the effective user
    or root, no permission for group or others; [K-FILE-2]: read no more
    than the largest keyring."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise Failure("insecure: the keyring is a symbolic link")
        raise
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Failure("insecure: the keyring is not a regular file")
        if st.st_uid not in (os.geteuid(), 0) or st.st_mode & 0o077:
            raise Failure("insecure: the keyring is open to group or others, or owned by another user")
        if st.st_size > MAX_KEYRING_FILE:                            # [K-ERR-3] step 4
            raise Failure("keyring integrity: too-large at byte %d" % MAX_KEYRING_FILE)
        return f.read(MAX_KEYRING_FILE + 1)


def read_passphrase_file(path):
    """[K-SEAL-7]: at most 4096 bytes; exactly one trailing LF removed; empty refused."""
    with open(path, "rb") as f:
        data = f.read(4097)
    if len(data) > 4096:
        raise Failure("passphrase file longer than 4096 bytes")
    if data.endswith(b"\n"):
        data = data[:-1]
    if not data:
        raise Failure("empty passphrase")
    return data


# ---- envelope (docs/format.md sections 2-5) -------------------------------------

# [F-FIELDS-1]: (number, name, wire type) in the only order allowed.
FIELDS_V1 = [(1, "algorithm", 0), (2, "tenant", 2), (3, "key_id", 2), (4, "key_version", 0),
             (5, "wrapped_dek", 2), (6, "nonce", 2), (15, "ciphertext", 2)]
FIELDS_V2 = FIELDS_V1[:6] + [(7, "purpose", 2), (8, "commitment", 2)] + FIELDS_V1[6:]
# [F-LIMITS-1] defaults: (minimum, maximum)
VAR_LIMITS = {"tenant": (1, 64), "key_id": (1, 256), "wrapped_dek": (1, 1024),
              "purpose": (1, 64), "ciphertext": (16, 1048592)}
NONCE_LEN = {1: 12, 2: 24}                                            # [F-NONCE-1]
MAX_ENVELOPE = 1050086                                                # [F-LIMITS-3]


def read_varint32(data, p):
    """The procedure of section 3.2, verbatim."""
    v = 0
    for i in range(5):
        if p + i >= len(data):
            raise Rejection("truncated", p)
        b = data[p + i]
        if i == 4 and b > 0x0F:
            raise Rejection("varint-overflow", p)
        v |= (b & 0x7F) << (7 * i)
        if b & 0x80 == 0:
            if i > 0 and b == 0:
                raise Rejection("noncanonical-varint", p)
            return v, p + i + 1
    raise AssertionError("unreachable: the fifth byte has no continuation bit")


def parse_envelope(data):
    """Whole-envelope parse in the order of [F-ERR-3]; returns a dict of fields."""
    for i, m in enumerate(b"KSE"):                                    # step 1
        if i < len(data) and data[i] != m:
            raise Rejection("bad-magic", i)
    if len(data) < 3:                                                 # step 2
        raise Rejection("truncated", 0)
    if len(data) == 3:                                                # step 3
        raise Rejection("truncated", 3)
    version = data[3]
    if version not in (1, 2):                                         # step 4
        raise Rejection("unsupported-version", 3)
    table = FIELDS_V1 if version == 1 else FIELDS_V2
    numbers = [f[0] for f in table]
    env = {"version": version}
    expected = 0                                                      # index into table
    pos = 4
    while pos < len(data):
        t = pos
        tag, pos = read_varint32(data, t)                             # step 5
        n = tag >> 3
        if n not in numbers:                                          # step 6, [F-UNKNOWN-1]
            raise Rejection("unknown-field", t)
        idx = numbers.index(n)
        if idx < expected:                                            # step 7, [F-ORDER-1]
            raise Rejection("field-order", t)
        if idx > expected:                                            # step 8, [F-REQ-1]
            raise Rejection("missing-field", t)
        _, name, wire = table[idx]
        if tag & 7 != wire:                                           # step 9, [F-WIRE-2]
            raise Rejection("wire-type", t)
        q = pos
        val, pos = read_varint32(data, q)                             # step 10
        if wire == 0:                                                 # step 11
            if name == "algorithm" and val not in (1, 2):             # [F-ALG-1]
                raise Rejection("bad-value", q)
            if name == "key_version" and val == 0:                    # [F-KVER-1]
                raise Rejection("bad-value", q)
            env[name] = val
        else:
            if name in ("nonce", "commitment"):                       # step 12, [F-LEN-3]
                want = NONCE_LEN[env["algorithm"]] if name == "nonce" else 32
                if val != want:
                    raise Rejection("bad-value", q)
            else:                                                     # [F-LEN-2]
                lo, hi = VAR_LIMITS[name]
                if val > hi:
                    raise Rejection("too-large", q)
                if val < lo:
                    raise Rejection("bad-value", q)
            if len(data) - pos < val:                                 # step 13, [F-LEN-4]
                raise Rejection("truncated", pos)
            value = bytes(data[pos:pos + val])
            cls = KEYID_CLASS if name == "key_id" else NAME_CLASS
            if name in ("tenant", "key_id", "purpose"):               # step 14
                for i, b in enumerate(value):
                    if b not in cls:
                        raise Rejection("bad-value", pos + i)
            env[name] = value
            pos += val
        expected = idx + 1                                            # step 15
    if expected < len(table):                                         # step 16, [F-END-1]
        raise Rejection("truncated", len(data))
    return env


# ---- opening (docs/format.md section 7) -----------------------------------------

def lp(x):
    """[7.1] lp(x) = u32be(len(x)) || x."""
    return struct.pack(">I", len(x)) + x


def wrap_aad(env):
    """[F-CRYPTO-AAD-2]."""
    a = b"KSW" + bytes([env["version"]]) + struct.pack(">I", env["algorithm"])
    a += lp(env["tenant"]) + lp(env["key_id"]) + struct.pack(">I", env["key_version"])
    if env["version"] == 2:
        a += lp(env["purpose"])
    return a


def data_aad(env, context):
    """[F-CRYPTO-AAD-1]."""
    a = b"KSE" + bytes([env["version"]]) + struct.pack(">I", env["algorithm"]) + lp(env["tenant"])
    if env["version"] == 2:
        a += lp(env["purpose"]) + env["commitment"]
    return a + lp(context)


def v2_keys(dek, algorithm):
    """[F-CRYPTO-KEY-4], [F-CRYPTO-COMMIT-2]: (K, commitment), functions of
    (DEK, algorithm) only, so computed once per DEK ([F-CRYPTO-KEY-3])."""
    inp = b"KSE" + b"\x02" + struct.pack(">I", algorithm) + dek
    salt = b"\0" * 16
    k = hashlib.blake2b(inp, digest_size=32, salt=salt, person=b"keyshift.v2.mkey").digest()
    c = hashlib.blake2b(inp, digest_size=32, salt=salt, person=b"keyshift.v2.cmmt").digest()
    return k, c


def local_unwrap(kek, wrapped, aad):
    """[K-WRAP-1..2] / [F-CRYPTO-WRAP-1]: wrapped = wn(24) || XChaCha20-Poly1305
    of the 32-byte DEK; anything but 72 bytes, or a bad tag, is auth-failed."""
    if len(wrapped) != 72:
        return None
    dek = xchacha20poly1305_decrypt(kek, wrapped[:24], wrapped[24:], aad)
    return dek if dek is not None and len(dek) == 32 else None


AUTH_FAILED = "cannot decrypt: authentication failed"


def open_envelope(data, keys, context, tenant=None, purpose=None):
    """[F-CRYPTO-OPEN-1], in its order.  `keys` maps key_id to
    {version: (state, material)}, or is a callable (key_id, version) -> KEK."""
    if len(context) > 4096:                                           # [F-CRYPTO-CTX-1]
        raise Failure("invalid-argument: context longer than 4096 bytes")
    env = parse_envelope(data)                                        # step 1
    if tenant is not None and env["tenant"] != tenant:                # step 2
        raise Failure(AUTH_FAILED)
    if purpose is not None and (env["version"] == 1 or env["purpose"] != purpose):
        raise Failure(AUTH_FAILED)
    if callable(keys):                                                # step 3
        kek = keys(env["key_id"], env["key_version"])
    else:
        versions = keys.get(env["key_id"])
        if versions is None or env["key_version"] not in versions:
            raise Failure("not-found: no such key id or version")
        state, kek = versions[env["key_version"]]
        if state == 3:                                                # [K-STATE-1]
            raise Failure("denied: key version disabled")
        if state == 4:
            raise Failure("revoked: key version destroyed")
    dek = local_unwrap(kek, env["wrapped_dek"], wrap_aad(env))
    if dek is None:
        raise Failure(AUTH_FAILED)
    if env["version"] == 1:                                           # step 5, [F-CRYPTO-KEY-1]
        k = dek
    else:
        k, commitment = v2_keys(dek, env["algorithm"])
        if not hmac.compare_digest(commitment, env["commitment"]):    # step 4
            raise Failure(AUTH_FAILED)
    aad = data_aad(env, context)                                      # step 6
    if env["algorithm"] == 1:
        pt = aes256gcm_decrypt(k, env["nonce"], env["ciphertext"], aad)
    else:
        pt = xchacha20poly1305_decrypt(k, env["nonce"], env["ciphertext"], aad)
    if pt is None:
        raise Failure(AUTH_FAILED)
    return pt, env


# ---- self-test against the documents' vectors -----------------------------------

def _blocks(text, info):
    """Fenced blocks whose info string is exactly `info`, as lists of (key, value)."""
    out = []
    for m in re.finditer(r"^```" + re.escape(info) + r"\n(.*?)^```", text, re.S | re.M):
        out.append([tuple(line.split(": ", 1)) if ": " in line else (line.rstrip(":"), "")
                    for line in m.group(1).splitlines()])
    return out


def _vec(pairs):
    d = {}
    for k, v in pairs:
        if k in ("hex", "envelope", "wrap_aad", "wrapped_dek", "data_aad", "ciphertext"):
            d[k] = d.get(k, b"") + bytes.fromhex(v.replace(" ", ""))
        else:
            d[k] = v
    return d


def _s(v):
    assert v.startswith('"') and v.endswith('"'), v
    return v[1:-1].encode()


def _s_or_hex(v):
    """A string, or hex for a value that is not printable ASCII (C.1: `context`)."""
    return _s(v) if v.startswith('"') else bytes.fromhex(v.replace(" ", ""))


def self_test(format_md, keyring_md):
    with open(format_md, encoding="utf-8") as f:
        ftext = f.read()
    with open(keyring_md, encoding="utf-8") as f:
        ktext = f.read()
    fails = []
    count = 0

    def check(name, cond, why=""):
        nonlocal count
        count += 1
        if not cond:
            fails.append("%s %s" % (name, why))

    def outcome(fn):
        try:
            fn()
            return "ok"
        except Rejection as e:
            return "%s at %d" % (e.name, e.offset)

    for b in _blocks(ftext, "ks-vector"):                              # format.md Appendix A
        v = _vec(b)
        got = outcome(lambda: parse_envelope(v["hex"]))
        check(v["name"], got == v["expect"], "got %s, want %s" % (got, v["expect"]))

    for b in _blocks(ftext, "ks-crypto-vector"):                       # format.md Appendix C
        v = _vec(b)
        kek = bytes.fromhex(v["kek"])
        ctx, tenant = _s_or_hex(v["context"]), _s(v["tenant"])
        purpose = _s(v["purpose"]) if "purpose" in v else None

        def opener(key_id, ver, v=v, kek=kek):
            if key_id != _s(v["key_id"]) or ver != int(v["key_version"]):
                raise Failure("not-found")
            return kek
        try:
            pt, env = open_envelope(v["envelope"], opener, ctx, tenant, purpose)
            got = "ok"
        except Failure as e:
            got, pt, env = str(e), None, None
        if v["expect"] == "ok":
            check(v["name"], got == "ok" and pt == _s(v["plaintext"]), got)
            if env is None:
                continue
            check(v["name"] + " wrap_aad", wrap_aad(env) == v["wrap_aad"])
            check(v["name"] + " data_aad", data_aad(env, ctx) == v["data_aad"])
            check(v["name"] + " wrapped_dek", env["wrapped_dek"] == v["wrapped_dek"])
            check(v["name"] + " ciphertext", env["ciphertext"] == v["ciphertext"])
            dek = local_unwrap(kek, env["wrapped_dek"], v["wrap_aad"])
            check(v["name"] + " dek", dek == bytes.fromhex(v["dek"]))
            if env["version"] == 2:
                k, c = v2_keys(dek, env["algorithm"])
                check(v["name"] + " message_key", k == bytes.fromhex(v["message_key"]))
                check(v["name"] + " commitment", c == bytes.fromhex(v["commitment"]))
        else:
            check(v["name"], got == AUTH_FAILED, got)

    rings = {}
    for b in _blocks(ktext, "ks-keyring-vector"):                      # keyring.md Appendix A
        v = _vec(b)
        pw = v["passphrase"].encode() if "passphrase" in v else None
        if "derived_key" in v:
            _, salt, ops, mem, _ = parse_keyring_header(v["hex"])
            check(v["name"] + " derived_key",
                  derive_seal_key(pw, salt, ops, mem) == bytes.fromhex(v["derived_key"]))
        try:
            keys = open_keyring_bytes(v["hex"], pw)
            got = "ok"
            rings[v["name"]] = keys
        except Rejection as e:
            got = "%s at %d" % (e.name, e.offset)
        except Failure as e:
            got = "bad-passphrase" if str(e).startswith("bad-passphrase") else str(e)
        check(v["name"], got == v["expect"], "got %s, want %s" % (got, v["expect"]))
    for b in _blocks(ktext, "ks-wrap-vector"):
        v = _vec(b)
        state, kek = rings[v["keyring"]][v["key_id"].encode()][int(v["version"])]
        check(v["name"] + " kek", kek == bytes.fromhex(v["kek"]))
        dek = local_unwrap(kek, bytes.fromhex(v["wrapped"]), bytes.fromhex(v["aad"]))
        want = bytes.fromhex(v["dek"]) if v["expect"] == "ok" else None
        check(v["name"], dek == want)
    for f in fails:
        print("self-test FAIL: " + f, file=sys.stderr)
    print("self-test: %d checks, %d failed" % (count, len(fails)))
    return 0 if not fails else 1


# ---- command line ----------------------------------------------------------------

class _Args(argparse.ArgumentParser):
    def error(self, message):
        raise Failure("usage: " + message)


def main(argv):
    ap = _Args(prog="spec_decryptor.py", add_help=True)
    ap.add_argument("--keyring")
    ap.add_argument("--passphrase-file")
    ap.add_argument("--context", default="")
    ap.add_argument("--tenant")
    ap.add_argument("--purpose")
    ap.add_argument("--self-test", nargs=2, metavar=("FORMAT_MD", "KEYRING_MD"))
    ap.add_argument("envelope", nargs="?")
    try:
        a = ap.parse_args(argv)
        if a.self_test:
            return self_test(*a.self_test)
        if not a.keyring or not a.envelope:
            raise Failure("usage: --keyring FILE and ENVELOPE_FILE are required")
        passphrase = read_passphrase_file(a.passphrase_file) if a.passphrase_file else None
        ring = read_keyring_file(a.keyring)
        try:
            keys = open_keyring_bytes(ring, passphrase)
        except Rejection as e:
            raise Failure("keyring integrity: %s" % e)
        with open(a.envelope, "rb") as f:
            data = f.read(MAX_ENVELOPE + 1)
        if len(data) > MAX_ENVELOPE:                                  # [F-LIMITS-3]
            raise Failure("invalid envelope: too-large at byte %d" % MAX_ENVELOPE)
        fsenc = os.fsencode
        try:
            pt, _ = open_envelope(data, keys, fsenc(a.context),
                                  None if a.tenant is None else fsenc(a.tenant),
                                  None if a.purpose is None else fsenc(a.purpose))
        except Rejection as e:
            raise Failure("invalid envelope: %s" % e)
    except (Failure, OSError) as e:
        print("spec_decryptor: %s" % e, file=sys.stderr)
        return EX_DATAERR
    sys.stdout.buffer.write(pt)
    sys.stdout.buffer.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
