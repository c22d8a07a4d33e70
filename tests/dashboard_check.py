#!/usr/bin/python3
"""tests/dashboard_check.py -- check a Grafana dashboard of keyshift.

Usage: dashboard_check.py [--rules-out FILE] DASHBOARD.json RULES.yml TEXTFILE...

The dashboard must be valid JSON with a title, a uid and panels; every
panel (rows' nested panels too) must have a title, and every query
target's PromQL expression may name only metrics that keyshift exports:
a family of a `# TYPE` line of the given text files (written by the
release CLI; a histogram's _bucket, _sum and _count series too) or a series
recorded by RULES.yml (its `- record:` lines).  Template variables
($rollout, $__rate_interval) are allowed, and label_values() queries are
checked the same way.  --rules-out FILE also writes every panel query
as a recording rule ($__rate_interval as 5m, other variables as .*), for
`promtool check rules FILE` to parse them as Prometheus would.  Exit 0 when all is well, 1 with a message per
problem otherwise.
"""

import json
import re
import sys

# PromQL words that are not metric names: operators, modifiers and the
# aggregations (whose `by (...)` may stand between them and their "(").
KEYWORDS = {
    "and", "or", "unless", "by", "without", "on", "ignoring", "group_left",
    "group_right", "bool", "offset", "inf", "nan", "Inf", "NaN",
    "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count",
    "count_values", "bottomk", "topk", "quantile", "limitk", "limit_ratio",
}


def exported(rules_path, textfiles):
    """The names a query may use: families and their series, records."""
    names = set()
    for path in textfiles:
        with open(path, encoding="utf-8") as f:
            for line in f:
                m = re.match(r"# TYPE (\S+) (\S+)", line)
                if m:
                    names.add(m.group(1))
                    if m.group(2) == "histogram":
                        names.update({m.group(1) + "_bucket", m.group(1) + "_sum",
                                      m.group(1) + "_count"})
    with open(rules_path, encoding="utf-8") as f:
        for line in f:
            m = re.match(r"\s*- record:\s*(\S+)", line)
            if m:
                names.add(m.group(1))
    return names


def metric_names(expr):
    """The metric names an expression uses (functions and keywords left out)."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)      # strings
    e = re.sub(r"\{[^}]*\}", "", e)                  # label matchers
    e = re.sub(r"\[[^\]]*\]", "", e)                 # ranges
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", r"\1", e)
    e = re.sub(r"\$\{?\w+\}?", "", e)                # template variables
    names = set()
    for m in re.finditer(r"(?<![\w.])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?", e):
        word, call = m.group(1), m.group(2)
        if call or word in KEYWORDS or re.fullmatch(r"\d+[smhdwy]", word):
            continue
        names.add(word)
    return names


def panels(items):
    """Every panel, rows' nested ones included."""
    for p in items:
        yield p
        yield from panels(p.get("panels", []))


def write_rules(path, queries):
    """The panel queries as a rules file, variables substituted."""
    with open(path, "w", encoding="utf-8") as f:
        f.write("groups:\n  - name: dashboard\n    rules:\n")
        for i, (_, expr) in enumerate(queries):
            e = expr.replace("$__rate_interval", "5m")
            e = re.sub(r"\$\{?\w+\}?", ".*", e)
            f.write(f"      - record: dashboard:q{i}\n        expr: {json.dumps(e)}\n")


def main(argv):
    rules_out = None
    if len(argv) > 2 and argv[1] == "--rules-out":
        rules_out = argv[2]
        argv = argv[:1] + argv[3:]
    if len(argv) < 4:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 64
    problems = []
    try:
        with open(argv[1], encoding="utf-8") as f:
            dash = json.load(f)
    except (OSError, ValueError) as e:
        print(f"dashboard_check: {argv[1]} is not valid JSON: {e}")
        return 1
    ok_names = exported(argv[2], argv[3:])
    for key in ("title", "uid", "panels"):
        if key not in dash:
            problems.append(f"the dashboard has no {key}")
    queries = []
    ids = set()
    for p in panels(dash.get("panels", [])):
        if not p.get("title"):
            problems.append(f"panel {p.get('id')} has no title")
        if p.get("id") in ids:
            problems.append(f"panel id {p.get('id')} is used twice")
        ids.add(p.get("id"))
        if p.get("type") != "row" and not p.get("targets"):
            problems.append(f"panel {p.get('title')!r} has no query")
        for t in p.get("targets", []):
            queries.append((p.get("title"), t.get("expr", "")))
    for v in dash.get("templating", {}).get("list", []):
        q = v.get("query")
        if isinstance(q, dict):
            q = q.get("query", "")
        m = re.fullmatch(r"label_values\((\w+),\s*\w+\)", q or "")
        if v.get("type") == "query":
            if not m:
                problems.append(f"variable {v.get('name')}: not a label_values() query: {q!r}")
            else:
                queries.append((f"variable {v.get('name')}", m.group(1)))
    for where, expr in queries:
        if not expr:
            problems.append(f"{where}: an empty expression")
        for name in sorted(metric_names(expr) - ok_names):
            problems.append(f"{where}: {name} is not a metric keyshift exports")
    if rules_out is not None:
        write_rules(rules_out, [q for q in queries if not q[0].startswith("variable ")])
    for p in problems:
        print(f"dashboard_check: {p}")
    if problems:
        return 1
    print(f"dashboard_check: {len(queries)} queries name only exported metrics")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
