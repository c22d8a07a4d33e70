#!/usr/bin/python3
"""The manual pages (docs/man/) against the programs' --help.

Every option that a command's --help names in its SYNOPSIS, OPTIONS (or
another section listing options, such as LIMITS) must appear, as an .Fl, in the SYNOPSIS or OPTIONS of that command's
manual page, and every option a page documents there must be named by the
--help of some command the page covers: the two cannot drift apart.  Every
KEYSHIFT_*, AWS_* and PG* variable of a --help's ENVIRONMENT must be an
.Ev of its page's ENVIRONMENT, and every page of section 1 must belong to
a command.  The
commands come from the programs themselves: `keyshift --help' lists the
commands, each command's SYNOPSIS its subcommands, whose --help is read
in turn.

    tests/man_help_test.py KEYSHIFT KMS_AWS MANDIR
        check, and name every option missing on either side
    tests/man_help_test.py --list KEYSHIFT KMS_AWS
        print the commands, subcommands, options and option values the
        --help texts name (for tests/completion_test.sh)
"""
import glob
import os
import re
import subprocess
import sys

# The page documenting each command, when it is not keyshift-COMMAND.1.
PAGE_OF = {"decrypt": "keyshift-encrypt.1"}
# mdoc macros that may follow an .Fl argument on the same line.
MACROS = set("Ac Ao Aq Ar Bc Bo Bq Brc Bro Brq Cm Dq Dv Ec Em Eo Ev Fl Ic Li Ms Nm No Ns "
             "Oc Oo Op Pa Pc Pf Po Pq Qc Qo Qq Ql Sc So Sq Sx Sy Va Xr".split())
OPTION = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*|-h)(?![\w-])")


def run_help(argv):
    """The standard output of ARGV --help, which must exit 0."""
    p = subprocess.run(argv + ["--help"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       universal_newlines=True)
    if p.returncode != 0:
        sys.exit("man_help_test: '%s --help' exited %d: %s" % (" ".join(argv), p.returncode,
                                                              p.stderr.strip()))
    return p.stdout


def help_sections(text):
    """The sections of a --help text: {HEADING: [lines]}."""
    secs, cur = {}, None
    for line in text.split("\n"):
        if re.match(r"^[A-Z][A-Z ]*$", line):
            cur = line.strip()
            secs[cur] = []
        elif cur is not None:
            secs[cur].append(line)
    return secs


# The sections of a --help that are prose, not lists of options.
PROSE = {"NAME", "DESCRIPTION", "OUTPUT", "ENVIRONMENT", "FILES", "EXIT STATUS", "EXAMPLE",
         "EXAMPLES", "SEE ALSO", "ERRORS", "SECURITY", "IAM PERMISSIONS"}


def help_options(text):
    """The options a --help names in its SYNOPSIS, OPTIONS and any other
    section that lists options (LIMITS, say), but not in its prose."""
    opts = set()
    for name, lines in help_sections(text).items():
        if name not in PROSE:
            for line in lines:
                opts.update(OPTION.findall(line))
    return opts


def subcommands(text, words):
    """The subcommands that a --help's SYNOPSIS shows after WORDS."""
    subs = []
    prefix = " ".join(words) + " "
    for line in help_sections(text).get("SYNOPSIS", []):
        line = line.strip()
        if line.startswith(prefix):
            w = line[len(prefix):].split()
            if w and re.match(r"^[a-z][a-z-]*$", w[0]) and w[0] not in subs:
                subs.append(w[0])
    return subs


def command_helps(keyshift):
    """[(words, help text)] for keyshift and every command and subcommand."""
    top = run_help([keyshift])
    out = [(["keyshift"], top)]
    cmds = []
    for line in help_sections(top).get("COMMANDS", []):
        m = re.match(r"^    ([a-z][a-z-]*)\s", line)
        if m:
            cmds.append(m.group(1))
    if not cmds:
        sys.exit("man_help_test: 'keyshift --help' lists no COMMANDS")
    todo = [["keyshift", c] for c in cmds]
    while todo:
        words = todo.pop(0)
        text = run_help([keyshift] + words[1:])
        out.append((words, text))
        if len(words) < 4:
            for s in subcommands(text, words):
                todo.append(words + [s])
    return out


def page_for(words):
    """The manual page file name for a command's words."""
    if words == ["keyshift"]:
        return "keyshift.1"
    return PAGE_OF.get(words[1], "keyshift-%s.1" % words[1])


ENV_VAR = re.compile(r"(?<![\w$])\$?((?:KEYSHIFT|AWS|PG)[A-Z0-9_]*[A-Z0-9])\b")


def help_env(text):
    """The environment variables a --help names in its ENVIRONMENT."""
    found = set()
    for line in help_sections(text).get("ENVIRONMENT", []):
        found.update(ENV_VAR.findall(line))
    return found


def man_env(path):
    """The variables (.Ev) of a page's ENVIRONMENT section."""
    found, sec = set(), None
    with open(path) as f:
        for line in f:
            m = re.match(r"^\.Sh\s+(.*)", line)
            if m:
                sec = m.group(1).strip()
            elif sec == "ENVIRONMENT" and line.startswith("."):
                toks, in_ev = line[1:].split(), False
                for t in toks:
                    if t == "Ev":
                        in_ev = True
                    elif t in MACROS:
                        in_ev = False
                    elif in_ev and re.match(r"^[A-Z][A-Z0-9_]*$", t):
                        found.add(t)
    return found


def man_options(path):
    """The options (.Fl) of a page's SYNOPSIS and OPTIONS sections."""
    opts, sec = set(), None
    with open(path) as f:
        for line in f:
            m = re.match(r"^\.Sh\s+(.*)", line)
            if m:
                sec = m.group(1).strip().strip('"')
                continue
            if sec not in ("SYNOPSIS", "OPTIONS") or not line.startswith("."):
                continue
            toks = line[1:].split()
            in_fl = False
            for t in toks:
                if t == "Fl":
                    in_fl = True
                elif t in MACROS:
                    in_fl = False
                elif in_fl and re.match(r"^-?[a-z][a-z0-9-]*$", t):
                    opts.add("-" + t)
    return opts


def check(keyshift, kms_aws, mandir):
    """Compare every --help with its page; return the problems."""
    problems = []
    by_page = {}
    for words, text in command_helps(keyshift):
        by_page.setdefault(page_for(words), []).append((" ".join(words), help_options(text),
                                                        help_env(text)))
    kms_help = run_help([kms_aws])
    by_page["keyshift-kms-aws.1"] = [("keyshift-kms-aws", help_options(kms_help),
                                      help_env(kms_help))]
    for path in sorted(glob.glob(os.path.join(mandir, "*.1"))):
        if os.path.basename(path) not in by_page:
            problems.append("%s: no command of 'keyshift --help' (nor keyshift-kms-aws) has this "
                            "page: remove it, or map its command in PAGE_OF" % path)
    for page, helps in sorted(by_page.items()):
        path = os.path.join(mandir, page)
        if not os.path.exists(path):
            problems.append("%s: missing; it documents %s" % (path, ", ".join(h[0] for h in helps)))
            continue
        documented, env = man_options(path), man_env(path)
        union = set()
        for words, opts, variables in helps:
            union |= opts
            for o in sorted(opts - documented):
                problems.append("'%s --help' names %s, but %s has no '.Fl %s' in its SYNOPSIS or "
                                "OPTIONS" % (words, o, path, o[1:]))
            for v in sorted(variables - env):
                problems.append("'%s --help' names %s in its ENVIRONMENT, but %s has no '.Ev %s' "
                                "in its ENVIRONMENT" % (words, v, path, v))
        for o in sorted(documented - union):
            problems.append("%s documents %s (SYNOPSIS or OPTIONS), but no --help of %s names it"
                            % (path, o, ", ".join(h[0] for h in helps)))
    return problems


def listing(keyshift, kms_aws):
    """What tests/completion_test.sh compares the completion with, one
    fact a line: `command C', `sub C[/S] S2', `opts C OPTION...' (every
    --help of C together) and `enum C OPTION VALUE...' (an option whose
    SYNOPSIS gives its values as a|b)."""
    out = []
    opts, enums = {}, {}
    for words, text in command_helps(keyshift):
        if len(words) == 1:
            continue
        if len(words) == 2:
            out.append("command " + words[1])
        else:
            out.append("sub %s %s" % ("/".join(words[1:-1]), words[-1]))
        opts.setdefault(words[1], set()).update(help_options(text) - {"-h"})
        for line in help_sections(text).get("SYNOPSIS", []):
            for o, vals in re.findall(r"(--[a-z][a-z0-9-]*) ([a-z0-9-]+(?:\|[a-z0-9-]+)+)", line):
                enums[(words[1], o)] = vals.split("|")
    out += ["opts %s %s" % (c, " ".join(sorted(o))) for c, o in opts.items()]
    out += ["enum %s %s %s" % (c, o, " ".join(v)) for (c, o), v in sorted(enums.items())]
    out.append("opts keyshift-kms-aws " +
               " ".join(sorted(help_options(run_help([kms_aws])) - {"-h"})))
    return out


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "--list":
        print("\n".join(listing(sys.argv[2], sys.argv[3])))
        return 0
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    problems = check(*sys.argv[1:])
    for p in problems:
        print("man_help_test: " + p)
    if problems:
        print("man_help_test: %d difference(s) between --help and the manual pages; fix whichever "
              "side is wrong" % len(problems))
        return 1
    print("man_help_test: every --help option and variable is in its manual page, and every "
          "option of a page in its --help")
    return 0


if __name__ == "__main__":
    sys.exit(main())
