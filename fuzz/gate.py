#!/usr/bin/python3
"""fuzz/gate.py -- the fuzz gates of `make fuzz-smoke` and `make coverage`.

    gate.py lines GATES TARGET...            every target has a line in GATES
    gate.py run LOG -- CMD...                run one libFuzzer command, its output in LOG,
                                             then the CPU time it used as a last line
    gate.py check GATES|- TARGET LOG SECONDS CORPUS [HOST]
                                             one libFuzzer run against its line
                                             (-: print the figures, gate nothing);
                                             HOST: the file `calib` wrote
    gate.py calib GATES HOST LOG...          the host's speed from the calibration
                                             runs' logs, written to HOST
    gate.py canary SECONDS LOG -- CMD...     run the negative canary, expect a find
    gate.py coverage SUMMARY GROUP MIN_LINES MIN_BRANCHES [LINES BRANCHES REASON...]
                                             per-file and group coverage figures from
                                             llvm-cov export; the optional allowance is
                                             enforced while the group is below its floors

GATES (fuzz/gates.txt) has one line per fuzz target:

    TARGET  MIN_FEATURES  MIN_EXEC_PER_S  [REASON...]

A run fails when it ends with fewer features (libFuzzer's `ft:` on its
last status line) than MIN_FEATURES, or runs slower than MIN_EXEC_PER_S:
its executions (stat::number_of_executed_units) per second of the CPU
time the process used (`gate.py run` records it), so that the floor
measures the harness, not how much of a core a shared or noisy machine
gave it (libFuzzer's stat::average_exec_per_sec, per wall-clock second,
is printed beside it).  MIN_EXEC_PER_S is 1000 (the rule) unless a
REASON says why a target may be slower: a line with a lower figure and no
reason is itself an error.  `#` starts a comment.  Standard library only.

One more line, `host-reference EXEC_PER_S REASON`, scales the exec/s
floors to the host: fuzz/calib/fuzz_calib.c does the same fixed work for
every input, so its speed (two copies at once, as the smoke runs go, the
mean of their exec/s per CPU second) is the host's, not the harnesses'.
On a host where it runs at EXEC_PER_S or faster the floors hold as
written; on a slower one each floor is multiplied by speed / EXEC_PER_S.
A floor is thus a ratio to a workload measured in the same run, as the
project's benchmarks are, and a target made slower by the same factor on
any host fails the same way.
"""
import json
import os
import re
import subprocess
import sys
import time

SPEED_RULE = 1000
REFERENCE = "host-reference"


def fail(msg):
    """Print a gate failure and exit non-zero."""
    print(msg)
    sys.exit(1)


def read_gates(path):
    """Parse GATES into ({target: (min_features, min_eps, reason)}, the
    host-reference exec/s or None); exit on a bad line."""
    gates = {}
    reference = None
    with open(path, encoding="utf-8") as f:
        for no, raw in enumerate(f, 1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            parts = line.split(None, 3)
            where = "%s:%d" % (path, no)
            if parts[0] == REFERENCE:
                parts = line.split(None, 2)
                if len(parts) < 3 or not parts[1].isdigit() or int(parts[1]) == 0:
                    fail("fuzz-gate: %s: want %s EXEC_PER_S REASON" % (where, REFERENCE))
                if reference is not None:
                    fail("fuzz-gate: %s: a second %s line" % (where, REFERENCE))
                reference = int(parts[1])
                continue
            if len(parts) < 3 or not parts[1].isdigit() or not parts[2].isdigit():
                fail("fuzz-gate: %s: want TARGET MIN_FEATURES MIN_EXEC_PER_S [REASON]" % where)
            target, feats, eps = parts[0], int(parts[1]), int(parts[2])
            reason = parts[3].strip() if len(parts) == 4 else ""
            if target in gates:
                fail("fuzz-gate: %s: a second line for %s" % (where, target))
            if eps < SPEED_RULE and not reason:
                fail("fuzz-gate: %s: %s allows %d exec/s, below the %d rule, without a reason"
                     % (where, target, eps, SPEED_RULE))
            gates[target] = (feats, eps, reason)
    return gates, reference


def cmd_lines(path, targets):
    """Fail, naming them, when some targets have no line in GATES."""
    gates, _ = read_gates(path)
    missing = [t for t in targets if t not in gates]
    if missing:
        fail("fuzz-gate: FAILED: no line in %s for %s; add `TARGET MIN_FEATURES MIN_EXEC_PER_S "
             "[REASON]` (measure with make fuzz-smoke, floor ~65%% of the features)"
             % (path, " ".join(missing)))
    extra = sorted(set(gates) - set(targets))
    if extra:
        print("fuzz-gate: note: %s has lines for targets not in FUZZ_TARGETS: %s"
              % (path, " ".join(extra)))


def cmd_run(log, cmd):
    """Run cmd with its output in log, then append the CPU time (user and
    system) it and its children used; exit with its status."""
    with open(log, "w", encoding="utf-8") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    with open(log, "a", encoding="utf-8") as out:
        out.write("gate::cpu_seconds: %.3f\n" % (usage.ru_utime + usage.ru_stime))
    rc = proc.returncode
    sys.exit(rc if rc >= 0 else 128 - rc)


def log_figures(log):
    """(execs, exec/s, features, cov, cpu seconds) from a libFuzzer log run
    with -print_final_stats=1 (cpu None when `gate.py run` did not run it)."""
    execs = eps = feats = cov = cpu = None
    with open(log, encoding="utf-8", errors="replace") as f:
        for line in f:
            m = re.match(r"gate::cpu_seconds:\s*([0-9.]+)", line)
            if m:
                cpu = float(m.group(1))
            m = re.match(r"stat::number_of_executed_units:\s*(\d+)", line)
            if m:
                execs = int(m.group(1))
            m = re.match(r"stat::average_exec_per_sec:\s*(\d+)", line)
            if m:
                eps = int(m.group(1))
            m = re.match(r"#\d+\s+\w+\s+cov: (\d+) ft: (\d+)", line)
            if m:
                cov, feats = int(m.group(1)), int(m.group(2))
    return execs, eps, feats, cov, cpu


def cpu_speed(figures, what, log):
    """(exec/s per CPU second, exec/s per wall second) from log's figures
    (log_figures); fail when it has no final stats.  Per CPU second when
    `gate.py run` recorded at least 1 ms of it, else per wall second."""
    execs, wall_eps, feats, _, cpu = figures
    if execs is None or wall_eps is None or feats is None:
        fail("%s: FAILED: no final stats or status line in %s" % (what, log))
    return (int(execs / cpu) if cpu is not None and cpu >= 0.001 else wall_eps), wall_eps


def host_factor(speed, reference):
    """What the exec/s floors are multiplied by on a host of this speed."""
    return min(1.0, speed / reference)


def cmd_calib(path, host, logs):
    """Write the host's speed, the mean of the calibration runs' exec/s per
    CPU second, to host, and print it with the scale it gives the floors."""
    speeds = [cpu_speed(log_figures(log), "fuzz_calib", log)[0] for log in logs]
    speed = sum(speeds) // len(speeds)
    with open(host, "w", encoding="utf-8") as f:
        f.write("%d\n" % speed)
    _, ref = read_gates(path)
    if ref is None:
        print("fuzz_calib: %d exec/s per CPU second (runs: %s); %s has no %s line: "
              "floors as written" % (speed, ", ".join(map(str, speeds)), path, REFERENCE))
        return
    print("fuzz_calib: %d exec/s per CPU second (runs: %s), reference %d: exec/s floors x %.2f"
          % (speed, ", ".join(map(str, speeds)), ref, host_factor(speed, ref)))


def host_scale(ref, host):
    """The factor for the exec/s floors (reference ref, None for none; the
    host's speed in the file host), and a note saying where it came from."""
    if ref is None:
        return 1.0, ""
    if not host or not os.path.exists(host):
        return 1.0, ", host not measured (make fuzz-calib)"
    with open(host, encoding="utf-8") as f:
        speed = int(f.read().strip() or "0")
    scale = host_factor(speed, ref)
    return scale, (", host %d of %d exec/s" % (speed, ref) if scale < 1.0 else "")


def cmd_check(path, target, log, seconds, corpus, host=None):
    """Print one run's figures and fail when they are below the target's line."""
    figures = log_figures(log)
    execs, _, feats, cov, _ = figures
    eps, wall_eps = cpu_speed(figures, target, log)
    speed = "%d exec/s per CPU second (%d per wall second)" % (eps, wall_eps)
    files = len(os.listdir(corpus))
    if path == "-":
        print("%s: ok, %d execs in %s s, %s, %d features, cov %d, corpus %d files (%s)"
              % (target, execs, seconds, speed, feats, cov, files, os.path.dirname(log)))
        return
    gates, ref = read_gates(path)
    if target not in gates:
        cmd_lines(path, [target])
    min_feats, line_eps, reason = gates[target]
    scale, host_note = host_scale(ref, host)
    min_eps = max(1, int(line_eps * scale))
    bad = []
    if feats < min_feats:
        bad.append("%d features, below its floor of %d" % (feats, min_feats))
    if eps < min_eps:
        bad.append("%d exec/s, below its floor of %d" % (eps, min_eps))
    floor = "%d" % min_eps if min_eps == line_eps else "%d (%d x %.2f)" % (min_eps, line_eps, scale)
    print("%s: %s, %d execs in %s s, %s (floor %s%s%s), %d features (floor %d), cov %d, "
          "corpus %d files (%s)" % (target, "FAILED" if bad else "ok", execs, seconds, speed,
                                    floor, host_note,
                                    ", allowlisted" if line_eps < SPEED_RULE else "",
                                    feats, min_feats, cov, files, os.path.dirname(log)))
    if bad:
        fail("%s: FAILED the gate (%s): %s" % (target, path, "; ".join(bad)))
    if line_eps < SPEED_RULE:
        print("%s: note: allowed below %d exec/s: %s" % (target, SPEED_RULE, reason))


def cmd_canary(seconds, log, cmd):
    """Run the canary fuzzer; pass only when it reports the planted over-read in time."""
    start = time.monotonic()
    with open(log, "w", encoding="utf-8") as out:
        rc = subprocess.call(cmd, stdout=out, stderr=subprocess.STDOUT)
    took = time.monotonic() - start
    with open(log, encoding="utf-8", errors="replace") as f:
        text = f.read()
    # The report's stack names walk() when a symbolizer is installed; the
    # two lines below are there either way.
    found = "ERROR: AddressSanitizer: heap-buffer-overflow" in text and "READ of size 1" in text
    if rc != 0 and found and took <= float(seconds) + 5:
        print("fuzz_canary: ok, found the planted out-of-bounds read in %.1f s (limit %s s)"
              % (took, seconds))
        return
    print(text[-3000:])
    fail("fuzz_canary: FAILED: the planted out-of-bounds read was not found within %s s "
         "(exit %d after %.1f s, log %s): the fuzzing setup does not find bugs"
         % (seconds, rc, took, log))


def cmd_coverage(summary, group, min_lines, min_branches, allow):
    """Print each file's and the group's figures from llvm-cov's export; gate the group.

    allow, when given, is [LINES, BRANCHES, REASON...]: lower floors enforced
    while the group is below its own, with the reason printed on every run."""
    with open(summary, encoding="utf-8") as f:
        data = json.load(f)["data"][0]
    for fi in sorted(data["files"], key=lambda x: x["filename"]):
        name = os.path.relpath(fi["filename"])
        s = fi["summary"]
        print("coverage: %-34s lines %6.2f%% (%d/%d), branches %6.2f%% (%d/%d)"
              % (name, s["lines"]["percent"], s["lines"]["covered"], s["lines"]["count"],
                 s["branches"]["percent"], s["branches"]["covered"], s["branches"]["count"]))
    t = data["totals"]
    ln, br = t["lines"], t["branches"]
    figures = ("coverage: group %s: lines %.2f%% (%d/%d), branches %.2f%% (%d/%d)"
               % (group, ln["percent"], ln["covered"], ln["count"], br["percent"],
                  br["covered"], br["count"]))

    def meets(lines, branches):
        """Nonzero when the group reaches both floors."""
        return ln["percent"] >= float(lines) and br["percent"] >= float(branches)

    if meets(min_lines, min_branches):
        print("%s; gate %s%% / %s%%: ok" % (figures, min_lines, min_branches))
        if allow:
            print("coverage: group %s: note: it reaches its floors; drop its allowance" % group)
        return
    if allow and meets(allow[0], allow[1]):
        print("%s; gate %s%% / %s%%: BELOW, allowed down to %s%% / %s%%: %s"
              % (figures, min_lines, min_branches, allow[0], allow[1], " ".join(allow[2:])))
        return
    print("%s; gate %s%% / %s%%%s: FAILED" % (figures, min_lines, min_branches,
                                             " (allowed down to %s%% / %s%%)" % tuple(allow[:2])
                                             if allow else ""))
    sys.exit(1)


def main(argv):
    """Dispatch on the subcommand."""
    if len(argv) >= 3 and argv[1] == "lines":
        cmd_lines(argv[2], argv[3:])
    elif len(argv) >= 5 and argv[1] == "run" and argv[3] == "--":
        cmd_run(argv[2], argv[4:])
    elif len(argv) in (7, 8) and argv[1] == "check":
        cmd_check(*argv[2:])
    elif len(argv) >= 5 and argv[1] == "calib":
        cmd_calib(argv[2], argv[3], argv[4:])
    elif len(argv) >= 6 and argv[1] == "canary" and argv[4] == "--":
        cmd_canary(argv[2], argv[3], argv[5:])
    elif (len(argv) == 6 or len(argv) >= 9) and argv[1] == "coverage":
        cmd_coverage(argv[2], argv[3], argv[4], argv[5], argv[6:])
    else:
        print(__doc__.strip())
        sys.exit(2)


if __name__ == "__main__":
    main(sys.argv)
