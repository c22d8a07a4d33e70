"""Tests of keyshift.AgentClient against a running ``keyshift serve``
(docs/agent.md): round trips and batches, an envelope of the agent opened by an App
and one of an App opened by the agent, and the mapping of the agent's
errors to the package's exceptions.  Skipped when there is no keyshift
program (KEYSHIFT_CLI unset and none under build/).
"""

import json
import os
import sqlite3
import subprocess
import sys
import time
import unittest

from test_keyshift import CLI, HERE, World, keyshift

T, C = "payments", "card"


@unittest.skipUnless(os.path.exists(CLI), "no keyshift program (set KEYSHIFT_CLI)")
class AgentClientTest(unittest.TestCase):
    """One agent serving payments.card and payments.note with the key
    payments-kek, closing connections idle for a second, under a policy that lets this uid seal, open and parse
    payments.card and nothing of payments.note."""

    @classmethod
    def setUpClass(cls) -> None:
        cls.w = World()
        cls.sock = os.path.join(cls.w.dir, "agent.sock")
        policy = os.path.join(cls.w.dir, "policy")
        fd = os.open(policy, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write("keyshift-agent-policy 1\n"
                    "allow uid %d scope payments.card tenant * ops seal,open,parse\n" % os.getuid())
        cls.log = open(os.path.join(cls.w.dir, "agent.log"), "wb")
        cls.proc = subprocess.Popen(
            [CLI, "serve", "--listen", "unix:" + cls.sock, "--policy", policy,
             "--scope", "payments.card", "--scope", "payments.note", "--key", "payments-kek",
             "--workers", "2", "--idle-timeout", "1"], env=cls.w.env, stdout=subprocess.DEVNULL, stderr=cls.log)
        for _ in range(200):
            try:
                with keyshift.AgentClient(cls.sock) as c:
                    c.open(T, C, None, b"plain")
            except keyshift.Malformed:
                return
            except keyshift.Unavailable:
                time.sleep(0.025)
        cls.tearDownClass()
        raise AssertionError("the agent did not start")

    @classmethod
    def tearDownClass(cls) -> None:
        cls.proc.terminate()
        cls.proc.wait()
        cls.log.close()
        cls.w.remove()

    def test_round_trips_both_ways(self) -> None:
        ctx = "payments:42:card"
        with keyshift.AgentClient(self.sock) as agent, self.w.app() as app:
            for n in (0, 1, 70000):
                pt = b"x" * n
                env = agent.seal(T, C, "acme", pt, context=ctx, purpose="card")
                self.assertEqual(agent.open(T, C, "acme", env, context=ctx, purpose="card"), pt)
                self.assertEqual(app.open(T, C, "acme", env, context=ctx, purpose="card"), pt)
                env2 = app.seal(T, C, "acme", bytearray(pt), context=ctx, purpose="card")
                self.assertEqual(agent.open(T, C, "acme", env2, context=ctx, purpose="card"), pt)
            # no purpose: the column's name, on both sides; no tenant: any
            env = agent.seal(T, C, b"acme", b"4111", context=ctx)
            self.assertEqual(app.open(T, C, "acme", env, context=ctx), b"4111")
            self.assertEqual(agent.open(T, C, None, env, context=ctx), b"4111")
        agent.close()  # closing twice is harmless

    def test_seal_class_names_what_the_app_would(self) -> None:
        with keyshift.AgentClient(self.sock) as agent, self.w.app() as app:
            env, cls = agent.seal_class(T, C, "acme", b"4111", context="c", purpose="card")
            _, want = app.seal_class(T, C, "acme", b"4111", context="c", purpose="card")
            self.assertEqual(cls, want)
            self.assertFalse(cls.plaintext)
            h = keyshift.parse(env)
            self.assertEqual((cls.version, cls.algorithm, cls.key_id, cls.key_version),
                             (h.version, h.algorithm, h.key_id, h.key_version))
            self.assertEqual(agent.open(T, C, "acme", env, context="c", purpose="card"), b"4111")

    def test_batches(self) -> None:
        with keyshift.AgentClient(self.sock) as agent, self.w.app() as app:
            sealed = agent.seal_batch(T, C, [("acme", "c1", b"one"), ("acme", None, b"two")])
            self.assertTrue(all(isinstance(v, bytes) for v in sealed), sealed)
            opened = agent.open_batch(T, C, [("acme", "c1", sealed[0]), ("acme", "c2", sealed[1]),
                                             (None, None, b"plain")])
            self.assertEqual(opened[0], b"one")
            self.assertIsInstance(opened[1], keyshift.AuthFailed)
            self.assertIsInstance(opened[2], keyshift.Malformed)
            self.assertEqual((opened[2].name, opened[2].offset), ("bad-magic", 0))
            self.assertEqual(app.open_batch(T, C, [("acme", None, sealed[1])]), [b"two"])
            with self.assertRaises(keyshift.NotAuthorized):
                agent.seal_batch(T, "note", [("acme", None, b"x")])

    def test_sends_again_after_the_agent_closed_an_idle_connection(self) -> None:
        with keyshift.AgentClient(self.sock) as agent:
            env = agent.seal(T, C, "acme", b"4111")
            first = agent._conn
            time.sleep(1.3)  # past --idle-timeout: the agent closes the connection
            self.assertEqual(agent.open(T, C, "acme", env), b"4111")
            self.assertIsNot(agent._conn, first)

    def test_errors(self) -> None:
        with keyshift.AgentClient(self.sock) as agent:
            env = agent.seal(T, C, "acme", b"4111", context="payments:42:card")
            with self.assertRaises(keyshift.AuthFailed) as cm:
                agent.open(T, C, "acme", env, context="payments:43:card")
            self.assertEqual((cm.exception.status, cm.exception.error_class), (422, "refused"))
            with self.assertRaises(keyshift.Malformed) as cm:
                agent.open(T, C, "acme", env[:20], context="payments:42:card")
            self.assertEqual(cm.exception.name, "truncated")
            self.assertIsNotNone(cm.exception.offset)
            with self.assertRaises(keyshift.Malformed) as cm:
                agent.open(T, C, "acme", b"plain")
            self.assertEqual((cm.exception.name, cm.exception.offset), ("bad-magic", 0))
            h = agent.parse(T, C, env)
            self.assertEqual((h["version"], h["tenant"], h["key_id"], h["total_len"]),
                             (2, "acme", "payments-kek", len(env)))
            self.assertEqual(h["header_len"], keyshift.parse(env).header_len)
            with self.assertRaises(keyshift.Malformed):
                agent.parse(T, C, env[:20])
            with self.assertRaises(keyshift.NotAuthorized) as cm:
                agent.seal(T, "note", "acme", b"x")
            self.assertIsInstance(cm.exception, keyshift.Refused)
            self.assertEqual(cm.exception.status, 403)
            with self.assertRaises(keyshift.BadRequest) as cm:
                agent.seal(T, C, "ac me", b"x")
            self.assertEqual((cm.exception.name, cm.exception.member), ("bad-value", "tenant"))
        with self.assertRaises(keyshift.Unavailable):
            keyshift.AgentClient(self.sock + ".absent").seal(T, C, "acme", b"x")


    def test_example_service_through_the_agent(self) -> None:
        """example_service.py --agent seals and opens through the agent
        (no rollout: its --key), holding no key; it refuses the App's own
        options, and exits 69 when no agent answers."""
        con = sqlite3.connect(self.w.db)
        with keyshift.AgentClient(self.sock) as agent:
            for i in range(1, 21):
                value = agent.seal(T, C, "acme", json.dumps({"id": i}).encode(),
                                   context="payments:%d:card" % i, purpose="card")
                con.execute("INSERT INTO payments VALUES (?, ?, ?)", (i, "acme", value))
        con.commit()
        con.close()
        svc = [sys.executable, os.path.join(os.path.dirname(HERE), "example_service.py"),
               "--db", self.w.db, "--table", T, "--column", C, "--tenant-column", "tenant",
               "--context", "payments:{id}:card", "--purpose", "card", "--instance", "py-agent",
               "--json", "--seed", "1"]
        env = dict(self.w.env, PYTHONPATH=os.path.dirname(HERE))
        env.pop("KEYSHIFT_KEYRING", None)

        def run(*args: str) -> subprocess.CompletedProcess:
            return subprocess.run(svc + list(args), env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE)

        p = run("--agent", self.sock, "--ops", "100", "--write-percent", "50")
        self.assertEqual(p.returncode, 0, p.stderr)
        s = json.loads(p.stdout)
        self.assertEqual((s["reads"], s["failed_reads"], s["write_failures"], s["db_errors"]),
                         (100, 0, {}, 0), s)
        self.assertEqual(list(s["writes"]), ["v2:xchacha20-poly1305:payments-kek:1"], s)
        p = run("--agent", self.sock, "--keyring", self.w.keyring, "--ops", "1")
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn(b"--keyring: the agent's", p.stderr)
        p = run("--agent", self.sock + ".absent", "--ops", "1")
        self.assertEqual(p.returncode, 69, p.stderr)
        self.assertIn(b"no agent answers", p.stderr)


if __name__ == "__main__":
    unittest.main()


class FrameTest(unittest.TestCase):
    """The batch frame of docs/agent.md section 4a, without an agent."""

    def test_request_frame_is_the_vector(self) -> None:
        from keyshift.agent import _frame
        want = bytes.fromhex(
            "4b534231 00000001 00000008 7061792e63617264 00000004 61636d65 00000000"
            " 0000000a 7061793a313a63617264 00000004 34313131".replace(" ", ""))
        self.assertEqual(_frame(b"pay.card", [("acme", "pay:1:card", b"4111")]), want)

    def test_result_frame_is_read_strictly(self) -> None:
        from keyshift.agent import _results
        res = bytes.fromhex(
            "4b535231 00000002 01 0009 6261642d6d61676963 0007 72656675736564 01 00000000"
            " 00 00000003 616263 01 02 00000001 0012 7863686163686132302d706f6c7931333035"
            " 0007 7061792f6b656b".replace(" ", ""))
        out = _results(res, 2)
        self.assertIsInstance(out[0], keyshift.Malformed)
        self.assertEqual((out[0].name, out[0].offset), ("bad-magic", 0))
        self.assertEqual(out[1], b"abc")
        for bad, n in ((res[:-1], 2), (res + b"\0", 2), (res[:8], 2), (b"KSR2" + res[4:], 2), (res, 3)):
            with self.assertRaises(keyshift.Error):
                _results(bad, n)
