#!/usr/bin/python3
"""fuzz/agent_policy_seeds.py -- the agent policy vectors and the fuzz_agent_policy seeds.

    /usr/bin/python3 fuzz/agent_policy_seeds.py [--markdown] [--list]

Builds agent policy files (docs/agent-policy.md) with a writer of its own,
independent of tools/agent/policy.c: accepted files with the decisions
they make, and at least one input of every rejection class.  The offset
of each rejection is computed here from the text (where the offending
element starts), not taken from the parser.

  (default)   write each vector of docs/agent-policy.md (fenced
              ks-agent-policy-vector blocks) and each input built here,
              plus every truncation of one accepted file and a query tail
              on a few, as corpus/fuzz_agent_policy/<sha1 of content>;
  --markdown  print the built-in vectors as ks-agent-policy-vector blocks,
              the form in which docs/agent-policy.md holds them;
  --list      print name, expectation and length of each built-in vector.

Idempotent: a seed's name is its content's hash; nothing is removed.
Standard library only; run from anywhere.
"""
import os
import sys

from seedlib import at, line_markdown, line_spec_vectors, text, write_corpus

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(ROOT, "corpus", "fuzz_agent_policy")
SPEC = os.path.join(ROOT, "docs", "agent-policy.md")

HEADER = "keyshift-agent-policy 1"


def rule(who, scope, tenant, ops):
    return "allow %s scope %s tenant %s ops %s" % (who, scope, tenant, ops)


R1 = rule("uid 1000", "payments.card", "acme", "seal,open")


def vectors():
    """[(name, description, expect, bytes, result)]; expect is 'ok' or (error, offset);
    result lists the `rule:` and `check:` lines of an ok vector."""
    v = []

    def add(name, desc, expect, data, result=None):
        assert (expect == "ok") == (result is not None)
        v.append((name, desc, expect, data, result))

    def bad(name, desc, error, data, offset):
        add(name, desc, (error, offset), data)

    # ---- accepted --------------------------------------------------------
    add("one-rule", "One uid may seal and open one scope for one tenant; nothing else is allowed.",
        "ok", text(HEADER, R1),
        ["rule: " + R1,
         "check: allow 1000 1000 seal payments.card acme",
         "check: allow 1000 50 open payments.card acme",
         "check: deny 1000 1000 parse payments.card acme",
         "check: deny 1000 1000 seal payments.card acme2",
         "check: deny 1000 1000 seal payments.cvv acme",
         "check: deny 1001 1000 seal payments.card acme",
         "check: deny 1000 1000 open payments.card -",
         "check: deny 1000 1000 seal - acme"])
    add("empty-policy", "A header and no rule: valid, and every request is denied.", "ok",
        text("# nobody yet", "", HEADER),
        ["check: deny 0 0 seal payments.card acme", "check: deny 1000 1000 parse - -"])
    r_gid = rule("gid 33", "*", "*", "parse")
    r_any = rule("uid 1000", "orders.note", "*", "open")
    add("wildcards-and-groups",
        "Comments and empty lines anywhere; a gid rule; `*` scope and tenant; rules add up.",
        "ok",
        text("# agent policy", "", HEADER, "", "# web servers parse anything", r_gid,
             "# the billing service", R1, "", r_any, "#"),
        ["rule: " + r_gid, "rule: " + R1, "rule: " + r_any,
         "check: allow 5000 33 parse - -",
         "check: allow 5000 33 parse payments.card acme",
         "check: deny 5000 33 open payments.card acme",
         "check: deny 33 5000 parse - -",
         "check: allow 1000 33 seal payments.card acme",
         "check: allow 1000 1000 open orders.note -",
         "check: allow 1000 1000 open orders.note globex",
         "check: deny 1000 1000 seal orders.note globex"])
    r_case = rule("uid 0", "Payments.Card", "Acme", "seal,open,parse")
    add("scope-case",
        "Scope names match ASCII case-insensitively, as SQL identifiers do; tenants exactly.",
        "ok", text(HEADER, r_case),
        ["rule: " + r_case,
         "check: allow 0 0 seal payments.card Acme",
         "check: allow 0 0 parse PAYMENTS.CARD Acme",
         "check: deny 0 0 seal payments.card acme",
         "check: deny 0 0 seal payments.card.x Acme"])
    t64 = "t" * 63 + "9"
    tbl = "T" * 255
    col = "_" + "c$" * 127
    r_max = rule("gid 4294967294", tbl + "." + col, t64, "open,parse")
    add("limits", "The largest id, names of 255 bytes, a tenant of 64 bytes.", "ok",
        text(HEADER, r_max),
        ["rule: " + r_max,
         "check: allow 7 4294967294 open %s.%s %s" % (tbl.lower(), col, t64),
         "check: deny 7 4294967294 seal %s.%s %s" % (tbl, col, t64)])
    r_a = rule("uid 1000", "payments.card", "*", "open")
    r_b = rule("uid 1000", "payments.card", "acme", "seal")
    r_c = rule("gid 1000", "payments.card", "acme", "open")
    add("overlap", "Rules that overlap are allowed; the same principal, scope and tenant twice "
        "is not ([AP-DUP-1]); a uid and a gid of one number are different principals.", "ok",
        text(HEADER, r_a, r_b, r_c),
        ["rule: " + r_a, "rule: " + r_b, "rule: " + r_c,
         "check: allow 1000 0 open payments.card anyone",
         "check: allow 1000 0 seal payments.card acme",
         "check: deny 1000 0 seal payments.card globex",
         "check: allow 0 1000 open payments.card acme",
         "check: deny 0 1000 seal payments.card acme"])

    # ---- rejected: the file and its lines ----------------------------------
    bad("empty", "An empty file has no header.", "truncated", b"", 0)
    d = text("# only a comment")
    bad("no-header", "Ignored lines only.", "truncated", d, len(d))
    d = text(HEADER, R1)[:-1]
    bad("no-final-lf", "The last line has no LF.", "truncated", d, len(d))
    d = text("keyshift-providers 1")
    bad("bad-magic", "Another file's header.", "bad-magic", d, 0)
    d = text("keyshift-agent-policy 2")
    bad("version-2", "A later version.", "unsupported-version", d, 22)
    d = text("keyshift-agent-policy 1 ")
    bad("header-trailing-space", "A trailing space.", "bad-value", d, 23)
    d = text(HEADER, R1).replace(b"acme", b"ac\tme")
    bad("tab", "A tab inside a line.", "bad-value", d, at(d, "\t"))
    d = text(HEADER, R1).replace(b"\n", b"\r\n", 1)
    bad("crlf", "CR LF line ends.", "bad-value", d, at(d, "\r"))
    d = text(HEADER, "# " + "x" * 1023)
    bad("line-1025", "A comment of 1025 bytes.", "too-large", d, at(d, "#") + 1024)
    d = text(HEADER, "  " + R1)
    bad("indented", "A rule line begins with a space.", "bad-value", d, at(d, "  "))
    d = text(HEADER, R1.replace("uid 1000", "uid  1000"))
    bad("two-spaces", "Two spaces between words.", "bad-value", d, at(d, "  ", plus=1))
    # ---- rejected: the words of a rule ---------------------------------------
    d = text(HEADER, "deny uid 1 scope * tenant * ops open")
    bad("deny", "There are only allow rules.", "unknown-field", d, at(d, "deny"))
    d = text(HEADER, rule("user 1000", "*", "*", "open"))
    bad("user-name", "The principal is `uid` or `gid`.", "unknown-field", d, at(d, "user"))
    d = text(HEADER, rule("uid www-data", "*", "*", "open"))
    bad("uid-name", "Names are not looked up ([AP-ID-1]).", "bad-value", d, at(d, "www"))
    d = text(HEADER, rule("uid 01000", "*", "*", "open"))
    bad("uid-leading-zero", "A leading zero.", "bad-value", d, at(d, "01000"))
    d = text(HEADER, rule("gid 4294967295", "*", "*", "open"))
    bad("gid-too-big", "4294967295 is (gid_t)-1, no group.", "bad-value", d, at(d, "4294967295"))
    d = text(HEADER, "allow uid 1000 tenant acme scope payments.card ops open")
    bad("word-order", "`tenant` before `scope`.", "field-order", d, at(d, "tenant"))
    d = text(HEADER, "allow uid 1000 scope payments.card tenant acme op open")
    bad("unknown-word", "`op` is not a word of a rule.", "unknown-field", d, at(d, "op "))
    d = text(HEADER, "allow uid 1000 scope payments.card tenant acme")
    bad("no-ops", "The line ends before `ops`.", "missing-field", d, len(d) - 1)
    d = text(HEADER, "allow")
    bad("allow-alone", "`allow` alone.", "missing-field", d, len(d) - 1)
    d = text(HEADER, R1 + " # all")
    bad("trailing-words", "Words after the operations (a comment is a line of its own).",
        "unknown-field", d, at(d, " # all", plus=1))
    # ---- rejected: values ----------------------------------------------------
    d = text(HEADER, rule("uid 1", "payments", "*", "open"))
    bad("scope-no-dot", "A scope without its column.", "bad-value", d, at(d, "payments"))
    d = text(HEADER, rule("uid 1", "payments.", "*", "open"))
    bad("scope-empty-column", "An empty column name.", "bad-value", d, at(d, "payments.", plus=8))
    d = text(HEADER, rule("uid 1", ".card", "*", "open"))
    bad("scope-empty-table", "An empty table name.", "bad-value", d, at(d, ".card"))
    d = text(HEADER, rule("uid 1", "payments.*", "*", "open"))
    bad("scope-column-star", "`*` is a whole scope only.", "bad-value", d, at(d, "*"))
    d = text(HEADER, rule("uid 1", "a.b.c", "*", "open"))
    bad("scope-two-dots", "A second dot.", "bad-value", d, at(d, "a.b.c", plus=3))
    d = text(HEADER, rule("uid 1", "pay-ments.card", "*", "open"))
    bad("scope-hyphen", "A byte outside [A-Za-z0-9_$].", "bad-value", d, at(d, "pay-", plus=3))
    d = text(HEADER, rule("uid 1", "t." + "c" * 256, "*", "open"))
    bad("scope-column-256", "A column name of 256 bytes.", "too-large", d, at(d, "t.c", plus=2 + 255))
    d = text(HEADER, rule("uid 1", "*", "acme/eu", "open"))
    bad("tenant-slash", "A byte outside [F-NAME-1].", "bad-value", d, at(d, "/"))
    d = text(HEADER, rule("uid 1", "*", "t" * 65, "open"))
    bad("tenant-65", "A tenant of 65 bytes.", "too-large", d, at(d, "ttt", plus=64))
    d = text(HEADER, rule("uid 1", "*", "*", "open,seal"))
    bad("ops-order", "Operations out of order.", "field-order", d, at(d, "seal"))
    d = text(HEADER, rule("uid 1", "*", "*", "seal,seal"))
    bad("ops-twice", "An operation twice.", "field-order", d, at(d, "seal", 1))
    d = text(HEADER, rule("uid 1", "*", "*", "seal,,open"))
    bad("ops-empty", "An empty operation.", "bad-value", d, at(d, ",,", plus=1))
    d = text(HEADER, rule("uid 1", "*", "*", "seal,"))
    bad("ops-trailing-comma", "A trailing comma: the empty operation is at the line's end.",
        "bad-value", d, len(d) - 1)
    d = text(HEADER, rule("uid 1", "*", "*", "*"))
    bad("ops-star", "There is no `*` of operations.", "bad-value", d, at(d, "ops *", plus=4))
    d = text(HEADER, rule("uid 1", "*", "*", "decrypt"))
    bad("ops-unknown", "An unknown operation.", "bad-value", d, at(d, "decrypt"))
    # ---- rejected: the whole file ----------------------------------------------
    r2 = rule("uid 1000", "PAYMENTS.card", "acme", "parse")
    d = text(HEADER, R1, rule("uid 1000", "*", "*", "open"), r2, r2)
    bad("repeated-rule", "The same uid, scope (in another case) and tenant twice; the earliest "
        "repeat is reported.", "conflict", d, at(d, r2))
    many = [HEADER] + [rule("uid %d" % i, "*", "*", "open") for i in range(1025)]
    d = text(*many)
    bad("rules-1025", "A 1025th rule.", "too-large", d, at(d, "allow uid 1024 "))
    d = text(HEADER) + text("#" + "x" * 1000) * 66
    bad("file-65537", "A file longer than 65536 bytes.", "too-large", d, 65536)
    return v


def check_unique(vs):
    names = [x[0] for x in vs]
    assert len(names) == len(set(names)), "vector names must be unique"
    for name, _, expect, data, _ in vs:
        if expect != "ok":
            assert 0 <= expect[1] <= len(data), name
    return vs


def extra_seeds():
    """Inputs for branches the vectors leave alone: many rules of one principal
    (the index's order and its binary search), names of one length that differ
    late or only in case, every op list, odd ids; each with a query tail."""
    out = []
    rng = 12345

    def rand_bytes(n):
        nonlocal rng
        b = bytearray()
        for _ in range(n):
            rng = (rng * 1103515245 + 12345) & 0x7FFFFFFF
            b.append(rng >> 16 & 0xFF)
        return bytes(b)

    opsets = ["seal", "open", "parse", "seal,open", "seal,parse", "open,parse", "seal,open,parse"]
    shapes = []
    rules = []
    for i in range(12):
        who = ("uid %d" if i % 3 else "gid %d") % (i % 4)
        scope = ["*", "ab.cd", "ab.ce", "AB.CD", "ac.cd", "x$.y_"][i % 6]
        tenant = ["*", "acme", "acmf", "globex", "t:1.a-b"][i % 5]
        rules.append(rule(who, scope, tenant, opsets[i % 7]))
    shapes.append(text(HEADER, *rules))
    shapes.append(text(HEADER, *[rule("uid %d" % (1000 + i), "payments.card", "acme", "open")
                                 for i in range(20)], rule("gid 1000", "*", "*", "parse")))
    shapes.append(text(HEADER, rule("uid 4294967294", "a.b", "*", "seal"),
                       rule("gid 0", "*", "acme", "open")))
    shapes.append(text(HEADER, rule("uid 7", "t.c", "aaaa", "seal"), rule("uid 7", "t.c", "aaab", "seal"),
                       rule("uid 7", "t.d", "aaaa", "seal"), rule("uid 7", "T.C", "*", "open"),
                       rule("uid 7", "*", "aaaa", "parse")))
    for d in shapes:
        out.append(d)
        for k in range(6):
            out.append(d + b"\0" + rand_bytes(8 * (4 + 4 * k)))
    # Rejections the vectors do not reach.
    out.append(text(HEADER, rule("uid 99999999999", "*", "*", "open")))
    out.append(text(HEADER) + b"   \n")
    out.append(text(rule("uid 1", "*", "*", "open"), HEADER))
    out.append(text(HEADER, rule("uid 1", "a{.b", "*", "open")))
    out.append(text(HEADER, rule("uid 7", "t.c", "aaaa", "seal"), rule("uid 7", "t.c", "aaaaa", "open"),
                    rule("uid 7", "t.c", "aaa", "parse")))
    out.append(text(HEADER) + b"allow  \n")
    out.append(text(HEADER, rule("uid 1", "a.b", "*", "open"), rule("uid 1", "a.B", "*", "seal")))
    out.append(text(HEADER, rule("gid 1", "*", "*", "open"), rule("uid 1", "*", "*", "seal"),
                    rule("gid 1", "*", "*", "parse")))
    out.append(text(HEADER, rule("uid 1", "*", "*", "open,open")))
    out.append(text(HEADER, "allow uid 1 scope * tenant * ops open tenant"))
    out.append(text(HEADER, "allow uid 1 scope * tenant * scope *"))
    out.append(text(HEADER, "allow uid 1 scope * scope * tenant"))
    out.append(text(HEADER, rule("uid 1", "a" * 256 + ".b", "*", "open")))
    out.append(text(HEADER, rule("uid 1", "a" * 255 + "." + "b" * 255, "t" * 64, "open")))
    return out


TAG = "ks-agent-policy-vector"


def markdown(vs):
    return line_markdown(TAG, vs)


def spec_vectors():
    """The bytes of every ks-agent-policy-vector block of docs/agent-policy.md."""
    return line_spec_vectors(SPEC, TAG)


def query_tail(data, *queries):
    """An accepted file followed by the fuzz target's query section: a NUL,
    then queries of 8 bytes each (see fuzz/fuzz_agent_policy.c)."""
    return data + b"\0" + b"".join(queries)


def main():
    vs = check_unique(vectors())
    if "--markdown" in sys.argv:
        print(markdown(vs))
        return
    if "--list" in sys.argv:
        for name, _, expect, data, _ in vs:
            print(name, expect, len(data))
        return
    seeds = [x[3] for x in vs] + spec_vectors() + extra_seeds()
    for n, _, _, d, _ in vs:
        if n == "wildcards-and-groups":
            seeds += [d[:i] for i in range(len(d))]
        if n in ("one-rule", "wildcards-and-groups", "overlap", "scope-case"):
            seeds.append(query_tail(d, bytes(range(8)), bytes([1, 2, 0, 0, 3, 1, 0, 5])))
    write_corpus("agent_policy_seeds", list(dict.fromkeys(seeds)), CORPUS)


if __name__ == "__main__":
    main()
