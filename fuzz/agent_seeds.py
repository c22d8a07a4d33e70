#!/usr/bin/python3
"""fuzz/agent_seeds.py -- the fuzz_agent_request seeds: agent request bodies.

    /usr/bin/python3 fuzz/agent_seeds.py [--spec docs/agent.md] [OUTDIR]

Every POST body of the agent-vector blocks of docs/agent.md Appendix A,
prefixed with the byte that picks its endpoint in fuzz/fuzz_agent_request.c
(seal 0, open 1, seal-batch 2, open-batch 3, parse 4), and a few built
here: batches at the fuzzer's bound, every member of the wrong type,
escapes; into corpus/fuzz_agent_request/<sha1>.

Idempotent: a seed's name is its content's hash; nothing is removed.
Standard library only; run from anywhere.
"""
import json
import os
import re
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
    return out


def main():
    args = sys.argv[1:]
    spec = os.path.join(ROOT, "docs", "agent.md")
    if args[:1] == ["--spec"]:
        spec, args = args[1], args[2:]
    out = args[0] if args else CORPUS
    write_corpus("fuzz_agent_request", spec_seeds(spec) + built_seeds(), out)


if __name__ == "__main__":
    main()
