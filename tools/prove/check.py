#!/usr/bin/env python3
"""tools/prove/check.py -- the gate of `make prove` (tools/prove.mk).

Reads the property report Frama-C wrote (-report-csv: one row per
property, with the status consolidated over Eva and WP) and fails when a
property of the project's own files is not proved and is not justified
in tools/prove/alarms.txt.  Prints the counts that docs/fuzzing.md
("Proof") records.

Usage: check.py REPORT.csv ALARMS.txt
"""
import collections
import csv
import sys

OURS = ("parser/", "format/", "tools/prove/")
# Statuses that need no justification: proved, a libc contract Frama-C
# takes as given, or code that no input reaches (Eva: dead).
PROVED = {"Valid", "Considered valid", "Dead"}


def load_alarms(path):
    """(file, function, source line, property) -> justification, from
    lines `file ¦ function ¦ source line ¦ property ¦ why`; `#` starts a
    comment line."""
    out = {}
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line.strip() or line.startswith("#"):
                continue
            parts = line.split(" ¦ ", 4)
            if len(parts) != 5 or not parts[4].strip():
                sys.exit(f"{path}:{n}: want `file ¦ function ¦ source line ¦ property ¦ why`")
            out[tuple(parts[:4])] = parts[4]
    return out


def source_line(path, line, cache={}):
    """The text of line `line` of `path`, stripped: it names the alarm's
    statement without its line number, so edits elsewhere do not move it."""
    if path not in cache:
        with open(path, encoding="utf-8") as f:
            cache[path] = f.read().split("\n")
    return cache[path][int(line) - 1].strip()


def main():
    report, alarms_path = sys.argv[1], sys.argv[2]
    alarms = load_alarms(alarms_path)
    counts = collections.Counter()
    unjustified, justified = [], set()
    with open(report, encoding="utf-8") as f:
        for row in csv.DictReader(f, delimiter="\t"):
            path = f"{row['directory']}/{row['file']}"
            if not path.startswith(OURS):
                continue
            status = row["status"]
            counts[status] += 1
            if status in PROVED:
                continue
            key = (path, row["function"], source_line(path, row["line"]), row["property"])
            if key in alarms:
                justified.add(key)
                continue
            unjustified.append(f"{row['property kind']}, {status} at {path}:{row['line']}:\n"
                               f"    {' | '.join(key)} | ?")
    total = sum(counts.values())
    print("prove: properties of parser/, format/ and the driver: "
          + ", ".join(f"{counts[s]} {s.lower()}" for s in sorted(counts)) + f" (of {total})")
    print(f"prove: {len(justified)} not proved and justified in {alarms_path}")
    for key in sorted(set(alarms) - justified):
        print(f"prove: note: {alarms_path} lists what is now proved: {' | '.join(key)}")
    if unjustified:
        print(f"prove: {len(unjustified)} not proved and not justified in {alarms_path}:")
        for line in unjustified:
            print("  " + line)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
