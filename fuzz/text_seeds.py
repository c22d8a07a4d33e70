#!/usr/bin/python3
"""fuzz/text_seeds.py -- the fuzz_text seeds: text forms of envelopes.

    /usr/bin/python3 fuzz/text_seeds.py [--spec docs/format.md] [OUTDIR]

Every ks-text-vector of docs/format.md section 10.4 (text: or text-hex:),
the base64 of every ks-vector of Appendix A (valid envelopes and rejected
ones alike), and inputs of every rejection class of [F-TEXT-2] built here
with Python's own base64: every truncation of one text, every
non-canonical final quantum, whitespace, line breaks, the URL-safe
alphabet and '=' in every position of a short text; into
corpus/fuzz_text/<sha1>.

Idempotent: a seed's name is its content's hash; nothing is removed.
Standard library only; run from anywhere.
"""
import base64
import os
import re
import sys

from seedlib import write_corpus

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(ROOT, "corpus", "fuzz_text")
BLOCK = re.compile(r"^```(ks-text-vector|ks-vector)\n(.*?)^```$", re.M | re.S)


def spec_seeds(spec):
    """The spec's text vectors, and the base64 of its envelope vectors."""
    with open(spec, encoding="utf-8") as f:
        text = f.read()
    out = []
    for kind, body in BLOCK.findall(text):
        lines = dict((k.strip(), v.strip()) for k, _, v in
                     (ln.partition(":") for ln in body.splitlines() if ":" in ln))
        if kind == "ks-text-vector":
            if "text-hex" in lines:
                out.append(bytes.fromhex(lines["text-hex"]))
            else:
                out.append(lines["text"].encode())
        else:
            hexes = re.findall(r"^hex:(.*)$", body, re.M)
            out.append(base64.b64encode(bytes.fromhex("".join(hexes).replace(" ", ""))))
    return out


def built_seeds():
    """Texts of every rejection class, from one small envelope-like text."""
    env = bytes.fromhex("4b5345010801120174")
    good = base64.b64encode(env)
    out = [b"", b"S1NF", b"S1NFAQ==", b"S1NFAg==", b"s1nfAQ==", good, good + b"\n",
           good + b"\r\n", good[:4] + b" " + good[4:], good.replace(b"+", b"-"),
           good[:4] + b"\xd2" + good[5:]]  # libsodium 1.0.18 reads 0x80.. as '/'

    for i in range(len(good)):
        out.append(good[:i])
        out.append(good[:i] + b"=" + good[i + 1:])
        out.append(good[:i] + b"-" + good[i + 1:])
    for last in (b"AQ==", b"AR==", b"AQI=", b"AQJ=", b"A===", b"AQ=A", b"====", b"AQ="):
        out.append(b"S1NF" + last)
    for n in range(0, 8):
        out.append(base64.b64encode(bytes(range(n))))
    return out


def main(argv):
    spec = os.path.join(ROOT, "docs", "format.md")
    if len(argv) >= 2 and argv[0] == "--spec":
        spec, argv = argv[1], argv[2:]
    seeds = sorted(set(spec_seeds(spec) + built_seeds()))
    write_corpus("text_seeds", seeds, argv[0] if argv else CORPUS)


if __name__ == "__main__":
    main(sys.argv[1:])
