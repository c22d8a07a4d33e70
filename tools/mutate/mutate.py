#!/usr/bin/env python3
"""tools/mutate/mutate.py -- mutation testing of parser/ and format/ (make mutate).

Generates systematic mutants of the files given with --src (relational
operators flipped, integer and character literals shifted by one, named
constants swapped or shifted, if/while conditions negated, `return KS_ERR_*`
statements removed), builds each one in a scratch copy under --work, and
runs the chosen tests against it, fastest first, stopping at the first
failure.  The checkout is only read: a killed run leaves nothing mutated in
it.  docs/fuzzing.md ("Mutation testing") describes the operators, the
scoring and the allowlist.

Invoked by tools/mutate.mk with the compiler, flags and prebuilt objects
(stdlib only; any python3).
"""
import argparse
import concurrent.futures
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time

# ---- a small C tokenizer ----------------------------------------------------

TOKEN_RE = re.compile(
    r"""
    (?P<ws>(?:[ \t\r\f\v]|\\\n)+) |
    (?P<nl>\n) |
    (?P<bcomment>/\*.*?\*/) |
    (?P<lcomment>//[^\n]*) |
    (?P<string>"(?:\\.|[^"\\\n])*") |
    (?P<char>'(?:\\.|[^'\\\n])*') |
    (?P<number>0[xX][0-9a-fA-F]+[uUlL]*|[0-9]+[uUlL]*) |
    (?P<ident>[A-Za-z_][A-Za-z_0-9]*) |
    (?P<punct><<=|>>=|->|\+\+|--|<<|>>|<=|>=|==|!=|&&|\|\||[-+*/%&|^]=|[-+*/%&|^!~<>=?:;,.(){}\[\]#])
    """,
    re.VERBOSE | re.DOTALL,
)


class Tok:
    __slots__ = ("kind", "text", "start", "end", "line", "col", "skip")

    def __init__(self, kind, text, start, end, line, col):
        self.kind, self.text, self.start, self.end = kind, text, start, end
        self.line, self.col = line, col
        self.skip = False


def tokenize(src):
    """Tokens of src, comments and whitespace dropped.  Preprocessor
    directives other than #define are dropped whole; for #define, the macro
    name and parameter list are dropped and the body kept."""
    toks = []
    pos, line, line_start = 0, 1, 0
    at_line_start = True
    directive = None  # None, "skip" or "define-name"
    while pos < len(src):
        m = TOKEN_RE.match(src, pos)
        if m is None:
            raise SystemExit("mutate: cannot tokenize at line %d: %r" % (line, src[pos:pos + 20]))
        kind, text = m.lastgroup, m.group()
        col = pos - line_start + 1
        start_line = line
        nls = text.count("\n")
        if nls:
            line += nls
            line_start = pos + text.rfind("\n") + 1
        pos = m.end()
        if kind == "nl":
            at_line_start, directive = True, None
            continue
        if kind in ("ws", "bcomment", "lcomment"):
            continue
        if at_line_start and text == "#":
            at_line_start = False
            m2 = re.compile(r"[ \t]*([a-z]+)").match(src, pos)
            name = m2.group(1) if m2 else ""
            if name == "define":
                directive = "define-name"
                pos = m2.end()
            else:
                directive = "skip"
            continue
        at_line_start = False
        if directive == "skip":
            continue
        if directive == "define-name":
            directive = None
            pos2 = pos
            if src.startswith("(", pos2):  # function-like macro: drop the parameters
                pos = src.index(")", pos2) + 1
            continue
        toks.append(Tok(kind, text, m.start(), m.end(), start_line, col))
    return toks


def match_paren(toks, i):
    """Index of the token closing the bracket at toks[i]."""
    pairs = {"(": ")", "[": "]", "{": "}"}
    open_, close = toks[i].text, pairs[toks[i].text]
    depth = 0
    for j in range(i, len(toks)):
        if toks[j].text == open_:
            depth += 1
        elif toks[j].text == close:
            depth -= 1
            if depth == 0:
                return j
    raise SystemExit("mutate: unbalanced %r at line %d" % (open_, toks[i].line))


# ---- mutation operators -----------------------------------------------------

ROR = {"<": ["<=", ">="], "<=": ["<", ">"], ">": [">=", "<="], ">=": [">", "<"],
       "==": ["!="], "!=": ["=="]}

ERR_ORDER = """KS_ERR_TRUNCATED KS_ERR_BAD_MAGIC KS_ERR_UNSUPPORTED_VERSION KS_ERR_WIRE_TYPE
KS_ERR_NONCANONICAL_VARINT KS_ERR_VARINT_OVERFLOW KS_ERR_FIELD_ORDER KS_ERR_UNKNOWN_FIELD
KS_ERR_MISSING_FIELD KS_ERR_TOO_LARGE KS_ERR_BAD_VALUE KS_ERR_INVALID_ARGUMENT
KS_ERR_BUFFER_TOO_SMALL""".split()
FIELDS = """KS_FIELD_ALGORITHM KS_FIELD_TENANT KS_FIELD_KEY_ID KS_FIELD_KEY_VERSION
KS_FIELD_WRAPPED_DEK KS_FIELD_NONCE KS_FIELD_PURPOSE KS_FIELD_COMMITMENT
KS_FIELD_CIPHERTEXT""".split()

# A named constant and the one it is swapped with.
SWAP = {}
for _seq in (ERR_ORDER, FIELDS, ["KS_MAGIC_0", "KS_MAGIC_1", "KS_MAGIC_2"]):
    for _i, _n in enumerate(_seq):
        SWAP[_n] = _seq[(_i + 1) % len(_seq)]
for _a, _b in (("KS_FORMAT_V1", "KS_FORMAT_V2"), ("KS_ALG_AES256GCM", "KS_ALG_XCHACHA20POLY1305"),
               ("KS_AES256GCM_NONCE_LEN", "KS_XCHACHA20POLY1305_NONCE_LEN"),
               ("KS_PARSE_FULL", "KS_PARSE_HEADER"), ("KS_WIRE_VARINT", "KS_WIRE_LEN"),
               ("KS_RULE_NAME", "KS_RULE_KEY_ID"), ("KS_RULE_NONCE", "KS_RULE_FIXED"),
               ("KS_RULE_ALGORITHM", "KS_RULE_KEY_VERSION"), ("KS_CC_NAME", "KS_CC_KEY_ID")):
    SWAP[_a], SWAP[_b] = _b, _a
SWAP["KS_RULE_OPAQUE"] = "KS_RULE_NAME"
# Named bounds: shifted by one either way.
BOUNDS = set("""KS_TENANT_MAX KS_KEY_ID_MAX KS_WRAPPED_DEK_MAX KS_PURPOSE_MAX
KS_CIPHERTEXT_DEFAULT_MAX KS_CIPHERTEXT_HARD_MAX KS_TAG_LEN KS_COMMITMENT_LEN KS_PREFIX_LEN
KS_CONTEXT_MAX""".split())

NO_MUTATE_CALLS = ("assert", "static_assert", "_Static_assert")


def mark_skips(toks):
    """Tokens that no operator touches: assertion arguments (checks, not
    behaviour: asserting code is compiled in, so mutating them only proves
    that assert() works), case labels (a changed label is a duplicate),
    designators of an array initializer, and enumerators being defined
    (a swapped name is a redefinition)."""
    for i, t in enumerate(toks):
        if t.kind == "ident" and t.text in NO_MUTATE_CALLS and i + 1 < len(toks) and toks[i + 1].text == "(":
            for j in range(i, match_paren(toks, i + 1) + 1):
                toks[j].skip = True
        elif t.text == "case":
            j = i
            while toks[j].text != ":":
                toks[j].skip = True
                j += 1
        elif t.text == "[" and i > 0 and toks[i - 1].text in ("{", ",") and toks[match_paren(toks, i) + 1].text == "=":
            for j in range(i, match_paren(toks, i) + 1):
                toks[j].skip = True
        elif t.text == "enum":
            j = i + 1
            while j < len(toks) and toks[j].text not in ("{", ";", ")", ","):
                j += 1
            if j < len(toks) and toks[j].text == "{":
                for k in range(j + 1, match_paren(toks, j)):
                    if toks[k].kind == "ident" and toks[k - 1].text in ("{", ","):
                        toks[k].skip = True  # an enumerator being defined


def shift_literal(text, delta):
    m = re.match(r"(0[xX])?([0-9a-fA-F]+)([uUlL]*)$", text)
    prefix, digits, suffix = m.groups()
    value = int(digits, 16 if prefix else 10) + delta
    if value < 0:
        return None
    if prefix:
        body = "%X" % value if digits.upper() == digits else "%x" % value
        return prefix + body.rjust(len(digits), "0") + suffix
    return str(value) + suffix


def function_depth(toks):
    """Brace depth before each token (1 inside a function body's top level)."""
    depth, out = 0, []
    for t in toks:
        if t.text == "}":
            depth -= 1
        out.append(depth)
        if t.text == "{":
            depth += 1
    return out


def generate(path, src):
    """The mutants of one file: dicts with the edit and its description."""
    toks = tokenize(src)
    mark_skips(toks)
    depth = function_depth(toks)
    muts = []

    def add(op, t_first, t_last, repl, desc):
        muts.append({"file": path, "line": t_first.line, "col": t_first.col, "op": op,
                     "start": t_first.start, "end": t_last.end, "repl": repl, "desc": desc})

    for i, t in enumerate(toks):
        if t.skip:
            continue
        if t.kind == "punct" and t.text in ROR:
            for r in ROR[t.text]:
                add("ror", t, t, r, "'%s' -> '%s'" % (t.text, r))
        elif t.kind == "number":
            for d in (1, -1):
                r = shift_literal(t.text, d)
                if r is not None:
                    add("bound", t, t, r, "%s -> %s" % (t.text, r))
        elif t.kind == "char" and not t.text.startswith("'\\"):
            r = "'%s'" % chr(ord(t.text[1]) + 1)
            if r != "''''" and r != "'\\'":
                add("const", t, t, r, "%s -> %s" % (t.text, r))
        elif t.kind == "ident" and t.text in SWAP:
            if t.text.startswith("KS_ERR_") and i > 0 and toks[i - 1].text == "return" and toks[i + 1].text == ";":
                if depth[i] > 1:
                    add("return", toks[i - 1], toks[i + 1], "", "delete 'return %s;'" % t.text)
                else:
                    add("return", toks[i - 1], toks[i + 1], "return KS_OK;",
                        "'return %s;' -> 'return KS_OK;'" % t.text)
            add("const", t, t, SWAP[t.text], "%s -> %s" % (t.text, SWAP[t.text]))
        elif t.kind == "ident" and t.text in BOUNDS:
            for d in ("+", "-"):
                add("bound", t, t, "(%s %s 1)" % (t.text, d), "%s -> %s %s 1" % (t.text, t.text, d))
        elif t.kind == "ident" and t.text in ("if", "while") and toks[i + 1].text == "(":
            close = toks[match_paren(toks, i + 1)]
            cond = src[toks[i + 1].end:close.start]
            muts.append({"file": path, "line": t.line, "col": t.col, "op": "negate",
                         "start": toks[i + 1].end, "end": close.start, "repl": "!(%s)" % cond,
                         "desc": "%s (c) -> %s (!(c))" % (t.text, t.text)})
    return muts


def apply(src, m):
    return src[:m["start"]] + m["repl"] + src[m["end"]:]


# ---- building and running ---------------------------------------------------

class Config:
    pass


def run(cmd, cwd, timeout=None, env=None):
    """(returncode or 'timeout', output)."""
    try:
        p = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=timeout, env=env, start_new_session=True)
        return p.returncode, p.stdout.decode("utf-8", "replace")
    except subprocess.TimeoutExpired as e:
        return "timeout", (e.stdout or b"").decode("utf-8", "replace")


class Worker:
    """A scratch tree build/mutate/w<N>/ holding copies of the sources a
    mutant can reach; mutants are applied there, never in the checkout.

    The library units of the mutated files (cfg.lib) are linked into a
    shared library of the worker's own, lib/libksmut.so, against which
    the test programs are linked once: a mutant then costs the compile of
    what it reaches and one small link.  A test program is relinked only
    when one of its own units includes the mutated header."""

    def __init__(self, cfg, n):
        self.cfg = cfg
        self.dir = os.path.abspath(os.path.join(cfg.work, "w%d" % n))
        shutil.rmtree(self.dir, ignore_errors=True)
        for d in cfg.copy_dirs:
            shutil.copytree(os.path.join(cfg.root, d), os.path.join(self.dir, "src", d),
                            ignore=shutil.ignore_patterns("*.o", "__pycache__"))
        for d in ("orig", "mut", "lib", "bin"):
            os.makedirs(os.path.join(self.dir, d), exist_ok=True)
        self.libdir = os.path.join(self.dir, "lib")

    def src(self, rel):
        return os.path.join(self.dir, "src", rel)

    def obj(self, rel, kind):
        return os.path.join(self.dir, kind, rel.replace("/", "__") + ".o")

    def compile(self, rel, kind):
        flags = self.cfg.cflags + (["-fPIC"] if rel in self.cfg.lib else [])
        cmd = [self.cfg.cc] + flags + ["-c", self.src(rel), "-o", self.obj(rel, kind)]
        return run(cmd, self.cfg.root)

    def link_lib(self, units):
        objs = [self.obj(u, "mut" if u in units else "orig") for u in self.cfg.lib]
        return run([self.cfg.cc, "-shared"] + self.cfg.ldflags + objs +
                   ["-o", os.path.join(self.libdir, "libksmut.so")], self.cfg.root)

    def link_exe(self, t, exe, units):
        cfg = self.cfg
        objs = [self.obj(o, "mut") if o in units else cfg.base_obj[o] for o in t["objs"] if o not in cfg.lib]
        return run([cfg.cc] + cfg.ldflags + objs + t["extra"] +
                   ["-L" + self.libdir, "-lksmut", "-Wl,-rpath," + self.libdir] + t["libs"] + ["-o", exe],
                   cfg.root)

    def setup(self):
        """Build the unmutated library and test programs; None or an error."""
        for u in self.cfg.lib:
            rc, out = self.compile(u, "orig")
            if rc != 0:
                return "%s does not compile:\n%s" % (u, out)
        rc, out = self.link_lib(())
        if rc != 0:
            return "cannot link the library:\n" + out
        for t in self.cfg.tests:
            rc, out = self.link_exe(t, os.path.join(self.dir, "bin", t["name"]), ())
            if rc != 0:
                return "cannot link %s:\n%s" % (t["name"], out)
        return None

    def test(self, t, exe):
        return run([exe] + t["args"], self.cfg.root, timeout=t.get("timeout"), env=self.cfg.env)

    def mutant(self, m):
        """Build and test mutant m; returns (status, detail)."""
        path = self.src(m["file"])
        original = self.cfg.sources[m["file"]]
        with open(path, "w") as f:
            f.write(apply(original, m))
        try:
            return self._build_and_test(m)
        finally:
            with open(path, "w") as f:
                f.write(original)

    def _build_and_test(self, m):
        cfg = self.cfg
        units = cfg.reaches[m["file"]]  # the translation units the mutated file reaches
        for u in units:
            rc, out = self.compile(u, "mut")
            if rc != 0:
                lines = [l for l in out.splitlines() if "error" in l] or ["compile failed"]
                return "stillborn", lines[0]
        rc, out = self.link_lib(units)
        if rc != 0:
            return "stillborn", "link: " + (out.strip().splitlines() or ["failed"])[0]
        for t in cfg.tests:
            exe = os.path.join(self.dir, "bin", t["name"])
            if any(o in units and o not in cfg.lib for o in t["objs"]):
                exe = os.path.join(self.dir, "mut", t["name"])
                rc, out = self.link_exe(t, exe, units)
                if rc != 0:
                    return "stillborn", "link: " + (out.strip().splitlines() or ["failed"])[0]
            rc, out = self.test(t, exe)
            if rc == "timeout":
                return "killed", "%s: timeout (%.0f s)" % (t["name"], t["timeout"])
            if rc != 0:
                return "killed", "%s: exit %s" % (t["name"], rc)
        return "survived", ""


def load_allowlist(path):
    """{'file:line:col desc': why}; lines 'file:line:col desc — why'."""
    out = {}
    if not os.path.exists(path):
        return out
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line.strip() or line.startswith("#"):
                continue
            if " — " not in line:
                raise SystemExit("mutate: %s:%d: expected 'file:line:col mutation — why'" % (path, n))
            key, why = line.split(" — ", 1)
            if not why.strip():
                raise SystemExit("mutate: %s:%d: an allowlisted survivor needs a reason" % (path, n))
            out[key.strip()] = why.strip()
    return out


def key_of(m):
    return "%s:%d:%d %s" % (m["file"], m["line"], m["col"], m["desc"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", required=True, help="JSON written by tools/mutate.mk")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--min", type=float, default=95.0, help="score goal, percent")
    ap.add_argument("--timeout", type=float, default=0, help="per test run, s (0: 5x baseline, >= 5 s)")
    ap.add_argument("--filter", default="", help="only mutants whose 'file:line' starts with this")
    ap.add_argument("--list", action="store_true", help="list the mutants and exit")
    args = ap.parse_args()

    with open(args.config) as f:
        conf = json.load(f)
    cfg = Config()
    cfg.root = os.getcwd()
    cfg.work = conf["work"]
    cfg.cc = conf["cc"]
    # -O0: a tenth of -O1's compile time; warnings are not what is tested.
    cfg.cflags = shlex.split(conf["cflags"]) + ["-O0", "-w"]
    cfg.ldflags = shlex.split(conf["ldflags"])
    cfg.copy_dirs = conf["copy_dirs"]
    # translation unit -> its prebuilt object
    cfg.base_obj = dict(e.split("=", 1) for e in conf["base_obj"])
    cfg.env = dict(os.environ, **conf.get("env", {}))
    cfg.sources = {}
    for s in conf["mutate"]:
        with open(s) as f:
            cfg.sources[s] = f.read()

    # Which translation units each mutated file reaches: itself, or every
    # unit of base_obj that includes the header (directly or through
    # another mutated header).
    units = {}
    for u in cfg.base_obj:
        with open(u) as f:
            units[u] = f.read()
    inc_re = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)

    def includes(u, text, seen):
        for inc in inc_re.findall(text):
            p = os.path.normpath(os.path.join(os.path.dirname(u), inc))
            if p in cfg.sources and p not in seen:
                seen.add(p)
                includes(p, cfg.sources[p], seen)
        return seen

    cfg.reaches = {s: [] for s in cfg.sources}
    for u, text in units.items():
        for h in includes(u, text, {u}):
            if h in cfg.reaches:
                cfg.reaches[h].append(u)

    mutants, seen = [], set()
    for s in conf["mutate"]:
        for m in generate(s, cfg.sources[s]):
            h = hashlib.sha1((s + "\0" + apply(cfg.sources[s], m)).encode()).hexdigest()
            if h not in seen:
                seen.add(h)
                mutants.append(m)
    if args.filter:
        mutants = [m for m in mutants if ("%s:%d" % (m["file"], m["line"])).startswith(args.filter)]
    if args.list:
        for m in mutants:
            print(key_of(m))
        print("mutate: %d mutants" % len(mutants))
        return 0

    allow = load_allowlist(conf["allowlist"])
    os.makedirs(cfg.work, exist_ok=True)
    t0 = time.time()

    # The unmutated tree must pass, and sets each test's timeout.
    cfg.tests = conf["tests"]
    cfg.lib = [u for u in cfg.base_obj if u in cfg.sources]  # the library units mutated
    workers = [Worker(cfg, n + 1) for n in range(args.jobs)]
    for w in workers:
        err = w.setup()
        if err:
            raise SystemExit("mutate: unmutated tree: " + err)
    for t in cfg.tests:
        s = time.time()
        rc, out = workers[0].test(t, os.path.join(workers[0].dir, "bin", t["name"]))
        took = time.time() - s
        if rc != 0:
            print(out)
            raise SystemExit("mutate: %s fails on the unmutated tree" % t["name"])
        t["timeout"] = args.timeout or max(5.0, 5 * took)
        print("mutate: baseline %s %.2f s (timeout %.0f s)" % (t["name"], took, t["timeout"]))
    print("mutate: %d mutants of %s, %d jobs" % (len(mutants), " ".join(conf["mutate"]), args.jobs),
          flush=True)

    free = list(workers)
    lock = threading.Lock()
    done = [0]

    def job(m):
        with lock:
            w = free.pop()
        try:
            status, detail = w.mutant(m)
        finally:
            with lock:
                free.append(w)
                done[0] += 1
                if done[0] % 50 == 0:
                    print("mutate: %d/%d (%.0f s)" % (done[0], len(mutants), time.time() - t0), flush=True)
        m["status"], m["detail"] = status, detail
        return m

    with concurrent.futures.ThreadPoolExecutor(args.jobs) as ex:
        results = list(ex.map(job, mutants))

    killed = [m for m in results if m["status"] == "killed"]
    stillborn = [m for m in results if m["status"] == "stillborn"]
    survived = [m for m in results if m["status"] == "survived"]
    allowed = [m for m in survived if key_of(m) in allow]
    survivors = [m for m in survived if key_of(m) not in allow]
    keys = {key_of(m): m for m in results}
    stale = [k for k in allow if k.startswith(args.filter) and (k not in keys or keys[k]["status"] != "survived")]
    scored = len(results) - len(stillborn) - len(allowed)
    score = 100.0 * len(killed) / scored if scored else 100.0
    elapsed = time.time() - t0

    by_file = {}
    for m in results:
        by_file.setdefault(m["file"], {"killed": 0, "survived": 0, "stillborn": 0})[m["status"]] += 1
    with open(os.path.join(cfg.work, "results.json"), "w") as f:
        json.dump([{k: m[k] for k in ("file", "line", "col", "op", "desc", "status", "detail")}
                   for m in results], f, indent=1)
    for fname, c in by_file.items():
        print("mutate: %-18s killed %4d  survived %3d  stillborn %3d" % (fname, c["killed"], c["survived"],
                                                                         c["stillborn"]))
    for m in survivors:
        print("SURVIVED %s" % key_of(m))
    for k in stale:
        print("mutate: allowlist entry no longer a survivor (remove it): %s" % k)
    print("mutate: %d mutants: %d killed, %d survived (%d allowlisted), %d stillborn; "
          "score killed / (total - stillborn - allowlisted) = %d/%d = %.2f%% (goal %.0f%%); %.0f s"
          % (len(results), len(killed), len(survived), len(allowed), len(stillborn), len(killed), scored,
             score, args.min, elapsed))
    if score < args.min:
        print("mutate: FAILED: score below %.0f%%; kill the survivors with a test, or allowlist an "
              "equivalent one in %s" % (args.min, conf["allowlist"]))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
