"""tests/kms_plugin_drive.py -- drive a KMS plugin through its stdin and
stdout for tests/kms_aws_plugin_test.sh, reading every response strictly
(docs/kms-plugin.md sections 3 to 7).  Standard library only.

Usage: python3 kms_plugin_drive.py STDERR_FILE PLUGIN [ARGS...] < SCRIPT

The script is one command a line:
  > JSON          send JSON (plus LF); @NAME in it is replaced by a value
                  kept with '='; then read one response
  = NAME MEMBER   keep MEMBER of the last response as NAME
  ! N             send a line of N bytes (N-1 'x', then LF); read one response
  ~ TEXT          send TEXT without an LF and close stdin; read one response
  % SECONDS       sleep SECONDS (a decimal)
  .               close stdin and wait for the plugin to exit
The transcript on stdout: '< ' and each response as compact JSON, members
in the plugin's order, or '< REFUSED reason' when the line breaks the
protocol, '< NONE' when the plugin wrote nothing within 30 s or closed
its stdout; 'exit RC' for '.'.  Nothing else reads the plugin's output.
"""
import base64
import binascii
import json
import os
import re
import select
import subprocess
import sys
import time

LINE_MAX = 65536
CLASSES = {"unavailable", "timeout", "throttled", "denied", "revoked", "not-found", "integrity", "invalid",
           "auth-failed"}
OK_MEMBERS = {"hello": {"version", "plugin", "capabilities"}, "wrap": {"wrapped"}, "unwrap": {"dek"},
              "key-info": {"version", "state", "primary"}}
ERR_MEMBERS = {"error", "message", "retry_after_ms"}


class Refused(Exception):
    pass


def no_dupes(pairs):
    names = [k for k, _ in pairs]
    if len(names) != len(set(names)):
        raise Refused("duplicate-key")
    return dict(pairs)


def reject_constant(name):
    raise Refused("bad-json " + name)


def integer(o, m, lo, hi):
    v = o.get(m)
    if type(v) is not int or not lo <= v <= hi:
        raise Refused("bad " + m)
    return v


def b64(o, m, lo, hi):
    s = o.get(m)
    if type(s) is not str or not re.fullmatch(r"(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?", s):
        raise Refused("bad-base64 " + m)
    try:
        b = base64.b64decode(s, validate=True)
    except binascii.Error:
        raise Refused("bad-base64 " + m)
    if base64.b64encode(b).decode() != s:
        raise Refused("bad-base64 " + m)
    if not lo <= len(b) <= hi:
        raise Refused("bad-length " + m)


def check(raw, req):
    """The response raw (bytes) to req (a dict, or None), or Refused."""
    if len(raw) > LINE_MAX:
        raise Refused("line-too-long")
    if not raw.endswith(b"\n"):
        raise Refused("unterminated")
    if b"\n" in raw[:-1] or b"\0" in raw:
        raise Refused("embedded-lf or nul")
    o = json.loads(raw.decode("utf-8"), object_pairs_hook=no_dupes, parse_float=lambda s: reject_constant(s),
                   parse_constant=reject_constant)
    if type(o) is not dict:
        raise Refused("not-object")
    integer(o, "v", 1, 1)
    rid = integer(o, "id", 1, 2**53 - 1)
    if req is not None and type(req.get("id")) is int and rid != req["id"]:
        raise Refused("id-mismatch")
    if type(o.get("ok")) is not bool:
        raise Refused("bad ok")
    op = req.get("op") if req is not None else None
    extra = set(o) - {"v", "id", "ok"}
    if not o["ok"]:
        if extra - ERR_MEMBERS or o.get("error") not in CLASSES:
            raise Refused("bad error response")
        if o["error"] == "auth-failed" and op != "unwrap":
            raise Refused("bad-class auth-failed to " + str(op))
        if "message" in o and (type(o["message"]) is not str or len(o["message"].encode()) > 1024):
            raise Refused("bad message")
        if "retry_after_ms" in o and (o["error"] != "throttled" or type(o["retry_after_ms"]) is not int):
            raise Refused("bad retry_after_ms")
        return o
    if op not in OK_MEMBERS or extra != OK_MEMBERS[op]:
        raise Refused("unknown-field or missing-field for " + str(op))
    if op == "wrap":
        b64(o, "wrapped", 1, 1024)
    elif op == "unwrap":
        b64(o, "dek", 32, 32)
    elif op == "hello":
        integer(o, "version", 1, 1)
        if type(o["plugin"]) is not str or not re.fullmatch(r"[\x20-\x7e]{1,128}", o["plugin"]):
            raise Refused("bad plugin")
        if not {"wrap", "unwrap", "key-info"} <= set(o["capabilities"]):
            raise Refused("bad capabilities")
    else:
        v = integer(o, "version", 1, 2**32 - 1)
        if o["state"] not in ("active", "decrypt-only", "disabled", "destroyed") or type(o["primary"]) is not bool:
            raise Refused("bad key-info")
        if (req["key_version"] != 0 and v != req["key_version"]) or (req["key_version"] == 0 and not o["primary"]):
            raise Refused("inconsistent version")
        if o["primary"] and o["state"] != "active":
            raise Refused("inconsistent primary")
    return o


def read_line(p):
    """One line of the plugin's stdout within 30 s, or None."""
    buf = b""
    while not buf.endswith(b"\n") and len(buf) <= LINE_MAX:
        r, _, _ = select.select([p.stdout], [], [], 30)
        if not r:
            return None
        c = os.read(p.stdout.fileno(), LINE_MAX + 1 - len(buf))
        if not c:
            return buf or None
        nl = c.find(b"\n")
        if nl >= 0 and nl + 1 < len(c):
            raise SystemExit("the plugin wrote more than one line at once")
        buf += c
    return buf


def answer(p, req):
    raw = read_line(p)
    if raw is None:
        print("< NONE")
        return None
    try:
        o = check(raw, req)
    except (Refused, ValueError, UnicodeDecodeError) as e:
        print("< REFUSED", e)
        return None
    print("< " + json.dumps(o, separators=(",", ":")))
    return o


def main():
    err = open(sys.argv[1], "ab")
    p = subprocess.Popen(sys.argv[2:], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, bufsize=0)
    kept, last = {}, None
    for cmd in sys.stdin.read().splitlines():
        if cmd.startswith("> "):
            text = re.sub(r"@([A-Za-z0-9_]+)", lambda m: kept[m.group(1)], cmd[2:])
            try:
                req = json.loads(text)
            except ValueError:
                req = None
            p.stdin.write(text.encode() + b"\n")
            last = answer(p, req if isinstance(req, dict) else None)
        elif cmd.startswith("= "):
            name, member = cmd[2:].split()
            kept[name] = last[member] if last is not None else "missing"
        elif cmd.startswith("! "):
            p.stdin.write(b"x" * (int(cmd[2:]) - 1) + b"\n")
            last = answer(p, None)
        elif cmd.startswith("~ "):
            p.stdin.write(cmd[2:].encode())
            p.stdin.close()
            last = answer(p, None)
        elif cmd.startswith("% "):
            time.sleep(float(cmd[2:]))
        elif cmd == ".":
            if not p.stdin.closed:
                p.stdin.close()
            rest = p.stdout.read()
            if rest:
                print("< EXTRA OUTPUT", len(rest), "bytes")
            print("exit", p.wait(timeout=30))
    return 0


sys.exit(main())
