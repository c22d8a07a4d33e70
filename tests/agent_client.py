#!/usr/bin/env python3
"""tests/agent_client.py -- a client of the keyshift agent (docs/agent.md)
over its Unix socket, with the standard library only (http.client over
AF_UNIX), for tests/cli_agent_test.sh and the agent benchmark.

  agent_client.py SOCK req PATH [BODY]    one request: prints STATUS, then the body
  agent_client.py SOCK vectors DOC        checks DOC's agent-vector blocks
  agent_client.py SOCK load CLIENTS SECONDS [--batch N] [--size BYTES] [--max N]
                                          a bounded load: one JSON line of figures
"""
import base64
import http.client
import json
import os
import socket
import sys
import threading
import time


class UnixConnection(http.client.HTTPConnection):
    """An HTTP/1.1 connection to a Unix socket."""

    def __init__(self, path, timeout=30):
        super().__init__("agent", timeout=timeout)
        self.unix_path = path

    def connect(self):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        s.connect(self.unix_path)
        self.sock = s


FRAME_TYPE = "application/vnd.keyshift.batch"


def request(conn, path, body, ctype="application/json"):
    """POST body (bytes) of ctype to path, or GET when body is None: (status, bytes, headers)."""
    if body is None:
        conn.request("GET", path)
    else:
        conn.request("POST", path, body=body, headers={"Content-Type": ctype})
    r = conn.getresponse()
    return r.status, r.read(), dict(r.getheaders())


def cmd_req(sock, path, body):
    conn = UnixConnection(sock)
    status, data, headers = request(conn, path, body.encode() if body is not None else None)
    print(status)
    if "Retry-After" in headers:
        print("Retry-After: " + headers["Retry-After"])
    sys.stdout.write(data.decode())


def vectors(doc):
    """The agent-vector blocks of doc: (request line, body, status, response)."""
    out, lines, i = [], open(doc).read().split("\n"), 0
    while i < len(lines):
        if lines[i].strip() == "```agent-vector":
            block = []
            i += 1
            while lines[i].strip() != "```":
                block.append(lines[i])
                i += 1
            v = {}
            for ln in block:
                k, _, rest = ln.partition(" ")
                v[k] = rest
            out.append(v)
        i += 1
    return out


def hex_matches(want, got):
    """Nonzero when the bytes got match want, hexadecimal in groups where
    a group *N stands for N bytes of any value (docs/agent.md Appendix A)."""
    at = 0
    for g in want.split():
        if g.startswith("*"):
            at += int(g[1:])
            continue
        b = bytes.fromhex(g)
        if got[at:at + len(b)] != b:
            return False
        at += len(b)
    return at == len(got)


def cmd_vectors(sock, doc):
    """Check every vector: the status and, unless the response holds a
    "*" (a random field), the exact body; a batch frame's (body-hex,
    response-hex) byte for byte but for its *N groups."""
    failed = 0
    vs = vectors(doc)
    for n, v in enumerate(vs, 1):
        method, path = v["request"].split(" ", 1)
        conn = UnixConnection(sock)
        if "body-hex" in v:
            status, data, hdrs = request(conn, path, bytes.fromhex("".join(v["body-hex"].split())),
                                         FRAME_TYPE)
        else:
            body = v.get("body")
            status, data, hdrs = request(conn, path, body.encode() if method == "POST" else None)
        ok = str(status) == v["status"]
        if "response-hex" in v:
            ok = ok and hdrs.get("Content-Type") == FRAME_TYPE and hex_matches(v["response-hex"], data)
            if not ok:
                failed += 1
                print("vector %d (%s): got %d %s; want %s %s" % (n, path, status, data.hex(),
                                                                 v["status"], v["response-hex"]))
            continue
        want = v["response"]
        got = data.decode().rstrip("\n")
        if ok and '"*"' not in want:
            ok = got == want
        elif ok:
            w, g = json.loads(want), json.loads(got)
            ok = set(w) == set(g) and all(w[k] == "*" or w[k] == g[k] for k in w)
        if not ok:
            failed += 1
            print("vector %d (%s): got %d %s; want %s %s" % (n, path, status, got, v["status"], want))
    print("vectors: %d checked, %d failed" % (len(vs), failed))
    sys.exit(1 if failed or not vs else 0)


def cmd_load(sock, clients, seconds, batch=0, size=32, max_req=0):
    """CLIENTS threads, each on its own connection, seal then open for
    SECONDS (or max_req requests each): the count, the error rate by kind,
    p50 and p99 latency of the answers 200.  Kinds: "ok", "wrong" (a 200
    without the expected results), a status, "connect" (the connection was
    refused: the request was never sent) and "conn" (it failed after the
    request was sent), "idle-closed" (a reused connection closed before any
    answer: the agent closed it idle and never read the request).  A failure
    or a 503 reconnects."""
    pt = base64.b64encode(os.urandom(size)).decode()
    rec = {"scope": "pay.card", "tenant": "acme", "purpose": "card", "context": "cGF5OjE6Y2FyZA==",
           "plaintext": pt}
    if batch:
        path, body = "/v1/seal-batch", json.dumps({"records": [rec] * batch}).encode()
    else:
        path, body = "/v1/seal", json.dumps(rec).encode()
    lat, kinds, lock = [], {}, threading.Lock()
    stop = time.monotonic() + seconds

    def run():
        mine, mkinds, conn, n = [], {}, None, 0
        while time.monotonic() < stop and (max_req == 0 or n < max_req):
            n += 1
            if conn is None:
                try:
                    conn = UnixConnection(sock)
                    conn.connect()
                except OSError:
                    mkinds["connect"] = mkinds.get("connect", 0) + 1
                    conn = None
                    time.sleep(0.02)
                    continue
            try:
                t0 = time.monotonic()
                reused = getattr(conn, "used", False)
                conn.used = True
                status, data, _ = request(conn, path, body)
                dt = time.monotonic() - t0
                if status == 200:
                    if batch:
                        res = json.loads(data)["results"]
                        good = len(res) == batch and all("value" in r for r in res)
                    else:
                        good = "value" in json.loads(data)
                    kind = "ok" if good else "wrong"
                    mine.append(dt)
                else:
                    kind = str(status)
                    if status == 503:
                        conn.close()
                        conn = None
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                # On a reused connection, closed before any answer: the
                # agent closed it while idle and never read the request
                # (RFC 9112 section 9.3.1: safe to send again).
                kind = "idle-closed" if reused else "conn"
                conn = None
                time.sleep(0.01)
            except (FileNotFoundError, ConnectionRefusedError):
                # http.client connects again by itself after an answer
                # with "Connection: close": the request was never sent.
                kind = "connect"
                conn = None
                time.sleep(0.02)
            except (OSError, http.client.HTTPException, ValueError):
                kind = "conn"
                conn = None
                time.sleep(0.01)
            mkinds[kind] = mkinds.get(kind, 0) + 1
        with lock:
            lat.extend(mine)
            for k, c in mkinds.items():
                kinds[k] = kinds.get(k, 0) + c

    t0 = time.monotonic()
    ts = [threading.Thread(target=run) for _ in range(clients)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    wall = time.monotonic() - t0
    lat.sort()
    total = sum(kinds.values())

    def pct(p):
        return round(lat[min(len(lat) - 1, int(p * len(lat)))] * 1e6, 1) if lat else None

    print(json.dumps({"clients": clients, "batch": batch, "size": size, "requests": total,
                      "ok": kinds.get("ok", 0), "errors": {k: c for k, c in kinds.items() if k != "ok"},
                      "error_rate": round((total - kinds.get("ok", 0)) / total, 4) if total else None,
                      "p50_us": pct(0.50), "p99_us": pct(0.99),
                      "records_per_s": round(kinds.get("ok", 0) * max(batch, 1) / wall, 1)}))


def main():
    sock, cmd = sys.argv[1], sys.argv[2]
    if cmd == "req":
        cmd_req(sock, sys.argv[3], sys.argv[4] if len(sys.argv) > 4 else None)
    elif cmd == "vectors":
        cmd_vectors(sock, sys.argv[3])
    elif cmd == "load":
        args, opts = sys.argv[3:], {}
        pos = [a for a in args if not a.startswith("--")]
        for i, a in enumerate(args):
            if a.startswith("--"):
                opts[a[2:]] = int(args[i + 1])
        pos = [a for i, a in enumerate(args) if not a.startswith("--") and (i == 0 or not args[i - 1].startswith("--"))]
        cmd_load(sock, int(pos[0]), float(pos[1]), opts.get("batch", 0), opts.get("size", 32),
                 opts.get("max", 0))
    else:
        sys.exit("unknown command " + cmd)


if __name__ == "__main__":
    main()
