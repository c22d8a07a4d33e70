"""fuzz/seedlib.py -- what the seed scripts share: writing a corpus.

Seeds are files named by the SHA-1 of their content; writing only adds
files, so a corpus merged from fuzzer runs keeps what it found.
"""
import hashlib
import os


def write_corpus(name, seeds, out):
    """Write every seed into directory out (created) and say how many were new."""
    os.makedirs(out, exist_ok=True)
    new = 0
    for seed in seeds:
        path = os.path.join(out, hashlib.sha1(seed).hexdigest())
        if not os.path.exists(path):
            with open(path, "wb") as f:
                f.write(seed)
            new += 1
    print("%s: %d seeds (%d new) in %s" % (name, len(seeds), new, out))


# ---- line-based text files and their vector blocks ---------------------------
# The registry (docs/providers.md) and the agent policy (docs/agent-policy.md)
# are text files of LF-ended lines; their documents hold vectors as fenced
# blocks of `name:`, `expect:`, `position:`, `line:` or `hex:` lines and
# result lines.  providers_seeds.py and agent_policy_seeds.py share these.

def text(*lines):
    """The file of these lines, each ended by LF."""
    return "".join(l + "\n" for l in lines).encode("ascii")


def at(data, needle, nth=0, plus=0):
    """The offset of the nth occurrence of needle in data, plus `plus`."""
    needle = needle.encode("ascii") if isinstance(needle, str) else needle
    i = -1
    for _ in range(nth + 1):
        i = data.index(needle, i + 1)
    return i + plus


def position(data, offset):
    """The 1-based line and column of offset."""
    before = data[:offset]
    return before.count(b"\n") + 1, offset - (before.rfind(b"\n") + 1) + 1


def printable_lines(data):
    """data as `line:` values when every line is printable ASCII without a
    trailing space and at most 1024 bytes, and data ends with LF; else None."""
    if not data.endswith(b"\n") or len(data) > 4096:
        return None
    lines = data[:-1].split(b"\n")
    for l in lines:
        if any(b < 0x20 or b > 0x7E for b in l) or l.endswith(b" ") or len(l) > 1024:
            return None
    return [l.decode("ascii") for l in lines]


def line_block(tag, name, expect, data, result):
    """The lines of a fenced `tag` block for one vector; expect is 'ok' or
    (error-name, offset)."""
    exp = "ok" if expect == "ok" else "%s at %d" % expect
    out = ["```" + tag, "name: " + name, "expect: " + exp]
    if expect != "ok":
        out.append("position: %d:%d" % position(data, expect[1]))
    lines = printable_lines(data)
    if lines is not None:
        out += ["line: " + l if l else "line:" for l in lines]
    else:
        out += ["hex: " + data[i:i + 32].hex() for i in range(0, len(data), 32)] or ["hex:"]
    out += result or []
    out.append("```")
    return out


def line_markdown(tag, vs):
    """The vectors vs [(name, description, expect, bytes, result)] as the
    document holds them: each description, then its block; those longer than
    2048 bytes are left to the tests, which build their own."""
    out = []
    for name, desc, expect, data, result in vs:
        if len(data) > 2048:
            continue
        out += [desc, ""] + line_block(tag, name, expect, data, result) + [""]
    return "\n".join(out)


def line_spec_vectors(spec, tag):
    """The bytes of every fenced `tag` block of the document at spec."""
    import re
    if not os.path.exists(spec):
        return []
    doc = open(spec, encoding="utf-8").read()
    found = []
    for b in re.findall(r"```" + re.escape(tag) + r"\n(.*?)```", doc, re.S):
        hexes, lines = [], []
        for l in b.splitlines():
            if l.startswith("hex:"):
                hexes.append(l[4:].replace(" ", ""))
            elif l == "line:" or l.startswith("line: "):
                lines.append(l[6:])
        found.append(bytes.fromhex("".join(hexes)) if hexes else text(*lines))
    return found
