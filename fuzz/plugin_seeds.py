#!/usr/bin/python3
"""fuzz/plugin_seeds.py -- the fuzz_plugin_resp seeds: KMS plugin response lines.

    /usr/bin/python3 fuzz/plugin_seeds.py [OUTDIR]

Seeds (docs/kms-plugin.md, protocol 1):
  1. every vector of Appendix A (fenced ks-plugin-vector blocks): the
     response line with its LF, or the hex bytes as given;
  2. responses built here with Python's json, independently of the C
     reader: for each accepted or error vector, each member dropped, each
     member's value replaced by a value of every JSON type, an unknown and
     an "x-" member added, the first member repeated, the default
     separators (spaces), no LF, CRLF, an LF inside; every truncation of
     two responses; lines of exactly 65536 and of 65537 bytes; hello
     plugin names, capability lists and error messages at their bounds;
  3. inputs shaped for the harness's encoder oracle (requests()).

Written to corpus/fuzz_plugin_resp/ (or OUTDIR) as <sha1 of content>;
idempotent, nothing is removed.  Standard library only; run from anywhere.
"""
import json
import os
import re
import sys

from seedlib import write_corpus

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(ROOT, "corpus", "fuzz_plugin_resp")
SPEC = os.path.join(ROOT, "docs", "kms-plugin.md")

VALUES = [None, True, False, 0, 1, 7, -1, 1.5, 2 ** 63, "", "x", "AB==", "AQ==", [], ["wrap"], {}]


def spec_vectors(path):
    """[(name, expect, line bytes)] of the ks-plugin-vector blocks."""
    out = []
    text = open(path, encoding="utf-8").read()
    for m in re.finditer(r"^```ks-plugin-vector\n(.*?)^```", text, re.S | re.M):
        name, expect, line, hexs = None, None, None, []
        for row in m.group(1).splitlines():
            key, _, val = row.partition(": ")
            if key == "name":
                name = val
            elif key == "expect":
                expect = val
            elif key == "response":
                line = val.encode("utf-8") + b"\n"
            elif key == "hex":
                hexs.append(val.replace(" ", ""))
        if hexs:
            line = bytes.fromhex("".join(hexs))
        if name is None or expect is None or line is None:
            sys.exit("plugin_seeds.py: malformed ks-plugin-vector block %r" % name)
        out.append((name, expect, line))
    return out


def dumps(obj, spaced=False):
    seps = (", ", ": ") if spaced else (",", ":")
    return json.dumps(obj, separators=seps).encode("utf-8")


def mutations(obj):
    """Response lines derived from the decoded response obj (an ordered dict)."""
    keys = list(obj)
    yield dumps(obj, spaced=True) + b"\n"
    yield dumps(obj)
    yield dumps(obj) + b"\r\n"
    yield dumps(obj).replace(b",", b",\n", 1) + b"\n"
    for k in keys:
        yield dumps({j: obj[j] for j in keys if j != k}) + b"\n"
        for v in VALUES:
            yield dumps({j: (v if j == k else obj[j]) for j in keys}) + b"\n"
    for extra in (("x-vendor", {"a": [1, 2]}), ("note", "hi"), ("X-cap", 1), ("x-", None)):
        d = dict(obj)
        d[extra[0]] = extra[1]
        yield dumps(d) + b"\n"
    first = dumps(obj)
    k0 = keys[0]
    yield first[:-1] + b"," + dumps(k0) + b":" + dumps(obj[k0]) + b"}\n"


def built(vectors):
    seeds = []
    for name, expect, line in vectors:
        if expect.startswith("refused"):
            continue
        try:
            obj = json.loads(line.decode("utf-8"), object_pairs_hook=dict)
        except (ValueError, UnicodeDecodeError):
            continue
        if isinstance(obj, dict) and "ok" in obj:
            seeds.extend(mutations(obj))
    two = [l for n, _, l in vectors if n in ("unwrap-ok", "hello-ok")]
    for line in two:
        seeds.extend(line[:i] for i in range(len(line)))
    head = b'{"v":1,"id":7,"ok":true,"wrapped":"AQ==","x-pad":"'
    for size in (65536, 65537):
        seeds.append(head + b"p" * (size - len(head) - 3) + b'"}\n')
    hello = {"v": 1, "id": 1, "ok": True, "version": 1, "plugin": "p",
             "capabilities": ["wrap", "unwrap", "key-info"]}
    for plugin in ("", "p" * 128, "p" * 129, "tab\there", "caf\u00e9"):
        seeds.append(dumps(dict(hello, plugin=plugin)) + b"\n")
    for caps in (["x-%d" % i for i in range(13)] + ["wrap", "unwrap", "key-info"],
                 ["x-%d" % i for i in range(14)] + ["wrap", "unwrap", "key-info"],
                 ["wrap", "unwrap", 3], ["wrap", "unwrap", "key-info", "rewrap", "rewrap"]):
        seeds.append(dumps(dict(hello, capabilities=caps)) + b"\n")
    denied = {"v": 1, "id": 7, "ok": False, "error": "denied"}
    for n in (256, 257, 1024, 1025):
        seeds.append(dumps(dict(denied, message="m" * n)) + b"\n")
    seeds += [b"", b"\n", b"{}\n", b"[]\n", b"null\n", b'"x"\n', b"{\n", b"{}}\n",
              b'{"v":1,"id":7,"ok":true,"wrapped":"' + b"A" * 1366 + b'=="}\n',
              b'{"v":1,"id":7,"ok":true,"wrapped":"' + b"A" * 1367 + b'="}\n',
              b'{"v":1,"id":7,"ok":true,"wrapped":"' + b"A" * 1372 + b'"}\n']
    return seeds


def requests():
    """Inputs for the encoder oracle of fuzz/fuzz_plugin_resp.c: a 16-byte
    header (op, id, key_version, key_id and wrapped lengths, flags) then
    key_id || wrapped || aad; the DEK is the first 32 bytes after the header."""
    out = []
    for op in range(6):
        for flags in (0, 1, 2, 4):
            for key_id, wrapped, aad in ((b"app/main", b"\xde\xad\xbe\xef", b"aad-" * 10),
                                         (b"A-Za-z0-9._:/@+=", b"w" * 40, b"a"),
                                         (b"bad key", b"w", b"a" * 40),
                                         (b"k" * 40, b"w" * 8, b"")):
                rest = key_id + wrapped + aad
                head = bytes([op, 0, 1 + op, 0, 2 if op != 4 else 0, len(key_id), len(wrapped), flags])
                out.append(head + bytes(8) + rest)
    return out


def main(argv):
    vectors = spec_vectors(SPEC)
    seeds = [line for _, _, line in vectors] + built(vectors) + requests()
    write_corpus("plugin_seeds", list(dict.fromkeys(seeds)), argv[0] if argv else CORPUS)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
