#!/usr/bin/python3
"""fuzz/agent_seeds.py -- the fuzz_agent_request seeds: agent request bodies.

    /usr/bin/python3 fuzz/agent_seeds.py [--spec docs/agent.md] [OUTDIR]

Every POST body of the agent-vector blocks of docs/agent.md Appendix A,
prefixed with the byte that picks its endpoint in fuzz/fuzz_agent_request.c
(seal 0, open 1, seal-batch 2, open-batch 3, parse 4; with 0x80 added, a
batch frame of docs/agent.md section 4a), and a few built here: batches at
the fuzzer's bound, every member of the wrong type, escapes, long values,
frames of every shape; into corpus/fuzz_agent_request/<sha1>.

Idempotent: a seed's name is its content's hash; nothing is removed.
Standard library only; run from anywhere.
"""
import json
import os
import re
import struct
import sys

from seedlib import write_corpus

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(ROOT, "corpus", "fuzz_agent_request")
BLOCK = re.compile(r"^```agent-vector\n(.*?)^```$", re.M | re.S)
VERB = {"/v1/seal": 0, "/v1/open": 1, "/v1/seal-batch": 2, "/v1/open-batch": 3, "/v1/parse": 4}


def spec_seeds(spec):
    """The bodies of the spec's POST vectors, each for every endpoint."""
    out = []
    for block in BLOCK.findall(open(spec, encoding="utf-8").read()):
        v = dict(line.split(" ", 1) for line in block.strip().split("\n"))
        method, path = v["request"].split(" ", 1)
        if method == "POST" and "body" in v:
            body = v["body"].encode()
            first = VERB.get(path, 0)
            out += [bytes([(first + k) % 5]) + body for k in range(5)]
        if method == "POST" and "body-hex" in v:
            body = bytes.fromhex("".join(v["body-hex"].split()))
            out += [bytes([0x80 | 2]) + body, bytes([0x80 | 3]) + body]
    return out


def frame(records, magic=b"KSB1", count=None):
    """A batch frame (docs/agent.md [AG-BIN-2]) of records, each a tuple
    of five bytes fields: scope, tenant, purpose, context, input."""
    out = magic + struct.pack(">I", len(records) if count is None else count)
    for r in records:
        for f in r:
            out += struct.pack(">I", len(f)) + f
    return out


def frame_seeds():
    """Frames at the bound, empty and bad fields, a truncation at every
    field, trailing bytes."""
    seal = (b"pay.card", b"acme", b"card", b"pay:1:card", b"4111")
    opn = (b"pay.card", b"", b"", b"", b"S1NF" + bytes(20))
    out = []
    for n in (1, 8, 9):
        out.append(b"\x82" + frame([seal] * n))
        out.append(b"\x83" + frame([opn] * n))
    full = frame([seal, opn])
    for cut in range(0, len(full), 3):
        out.append(b"\x82" + full[:cut])
    out += [b"\x82" + full + b"\x00", b"\x82" + frame([seal], count=0),
            b"\x82" + frame([seal], magic=b"KSB2"), b"\x82" + frame([seal], count=0xFFFFFFFF)]
    for k, bad in ((0, b"paycard"), (1, b""), (1, b"ac me"), (2, b"c" * 65), (3, b"x" * 4097)):
        r = list(seal)
        r[k] = bad
        out.append(b"\x82" + frame([seal, tuple(r)]))
        out.append(b"\x83" + frame([tuple(r)]))
    return out


def built_seeds():
    """Records of every shape, and batches at the bound (8 records)."""
    rec = {"scope": "pay.card", "tenant": "acme", "purpose": "card", "context": "cGF5OjE6Y2FyZA==",
           "plaintext": "NDExMQ=="}
    opn = {"scope": "pay.card", "tenant": "acme", "value": "S1NFAQgBEgF0GgFrIAEqAQAyDAA="}
    out = [b"\x00" + json.dumps(rec).encode(), b"\x01" + json.dumps(opn).encode(),
           b"\x04" + json.dumps({"scope": "a.b", "value": ""}).encode()]
    for n in (1, 8, 9):
        out.append(b"\x02" + json.dumps({"records": [rec] * n}).encode())
        out.append(b"\x03" + json.dumps({"records": [opn] * n}).encode())
    for k in rec:
        for bad in (1, None, [], {}, True):
            r = dict(rec)
            r[k] = bad
            out.append(b"\x00" + json.dumps(r).encode())
    out.append(b"\x00" + json.dumps(rec).encode().replace(b"acme", b"\\u0061cme"))
    # Long values, taken from the body rather than through jansson: at the
    # threshold, below it, as a key, in an array, beside an escape.
    lv = dict(rec, plaintext="QUFB" * 4, context="QUFB" * 3 + "QQ==")
    out += [b"\x00" + json.dumps(lv).encode(), b"\x00" + json.dumps(dict(lv, tenant="A" * 16)).encode(),
            b"\x00" + json.dumps(dict(lv, **{"QUFBQUFBQUFBQUFBQUFBQQ": "x"})).encode(),
            b"\x02" + json.dumps({"records": [lv] * 3}).encode(),
            b"\x00" + json.dumps(dict(lv, purpose="c\u0061rd")).encode(),
            b"\x00" + json.dumps(lv).encode().replace(b'"plaintext":', b'"plaintext" :  ')]
    return out


def main():
    args = sys.argv[1:]
    spec = os.path.join(ROOT, "docs", "agent.md")
    if args[:1] == ["--spec"]:
        spec, args = args[1], args[2:]
    out = args[0] if args else CORPUS
    write_corpus("fuzz_agent_request", spec_seeds(spec) + built_seeds() + frame_seeds(), out)


if __name__ == "__main__":
    main()
