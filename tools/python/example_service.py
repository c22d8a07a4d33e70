"""An example service in Python: keyshift-demo-app's job on the keyshift package.

It behaves like one instance of a service that keeps an encrypted column in
a SQLite database (the standard library's sqlite3) or a PostgreSQL one
(psycopg2: Debian's python3-psycopg2, for /usr/bin/python3) while the
rollouts stored in the same database (read by the C library through
App(database=...)) decide what it writes and which values it may read.
Each operation picks a random row by its integer id (--id-column):

  read   open its value with the row's tenant, the context rendered from
         --read-context (default --context; ``{id}`` is the row's id) and
         --purpose, when the rollout's phase reads its class (a plaintext
         the phase reads comes back as it is), and check that the
         plaintext is a JSON object whose "id", if any, is the row's;
  write  with probability --write-percent, seal a new JSON object for the
         row with --context and UPDATE it (the class written is the one
         the rollout names for the row's tenant; --key-id where no rollout
         governs).

A --read-context other than --context injects auth failures (each such
read fails, and the App reports it): how a rollout's health threshold is
tripped on purpose.  The App registers the instance as a reader,
heartbeats and reports its health every --reload-ms.

With --agent SOCKET it holds no keys and opens no App: every seal and open
goes to the ``keyshift serve`` listening on SOCKET (keyshift.AgentClient,
docs/agent.md), which holds the keys, is the registered reader with its own
--instance-id and reports the health of what it served; the rows, the SQL
and the summary are the same.  --keyring, --passphrase-file, --key-id and
--reload-ms are then the agent's business and refused here, and the
column's encoding is --encoding (the agent does not tell it).

SIGUSR1 prints the summary so far; SIGTERM and SIGINT stop after the
current operation.  The summary (one JSON object with --json, the names
of keyshift-demo-app's) counts reads, failed reads by error name and
writes by class, never a plaintext.  Exit status: 0 when no read failed, 65 when one did, 74 when
only database errors occurred, 69 when the database or the keys cannot be
opened (or psycopg2 is missing, or the agent's socket does not answer),
66 for an empty table, 64 for a usage error.

    python3 example_service.py --db shop.db --table payments --column card \\
        --tenant-column tenant --context 'payments:{id}:card' --purpose card \\
        --keyring keyring --instance web-1 --seconds 60
    python3 example_service.py --db shop.db --table payments --column card \\
        --tenant-column tenant --context 'payments:{id}:card' --purpose card \\
        --agent /run/keyshift/agent.sock --instance web-1 --seconds 60
"""

import argparse
import collections
import json
import random
import re
import signal
import socket
import sqlite3
import sys
import time

import keyshift

PG_DSN = re.compile(r"^(postgres(ql)?://|[a-z_]+\s*=)")  # as ks_app_open tells one


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--db", required=True, help="SQLite file or PostgreSQL connection string")
    p.add_argument("--table", required=True)
    p.add_argument("--column", required=True)
    p.add_argument("--id-column", default="id", help="the integer id column")
    p.add_argument("--tenant-column", required=True)
    p.add_argument("--context", required=True, help="context template ({id}: the row's id)")
    p.add_argument("--read-context", help="the template reads use (default --context)")
    p.add_argument("--purpose")
    p.add_argument("--instance", required=True, help="this instance's id")
    p.add_argument("--keyring", help="default: $KEYSHIFT_KEYRING")
    p.add_argument("--passphrase-file")
    p.add_argument("--key-id", help="the key to seal where no rollout governs the column")
    p.add_argument("--encoding", default="binary", choices=["binary", "base64"],
                   help="the column's encoding where no rollout records one")
    p.add_argument("--ops", type=int, default=0, help="stop after N operations")
    p.add_argument("--seconds", type=float, default=0, help="stop after S seconds")
    p.add_argument("--write-percent", type=int, default=10, choices=range(101), metavar="P")
    p.add_argument("--rate", type=float, default=0, help="at most N operations a second")
    p.add_argument("--seed", type=int)
    p.add_argument("--reload-ms", type=int)
    p.add_argument("--agent", metavar="SOCKET",
                   help="seal and open through the keyshift serve listening on SOCKET")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    if a.ops and a.seconds:
        p.error("give --ops or --seconds, not both")
    if a.agent:
        given = [o for o, v in (("--keyring", a.keyring), ("--passphrase-file", a.passphrase_file),
                                ("--key-id", a.key_id), ("--reload-ms", a.reload_ms)) if v is not None]
        if given:
            p.error("%s: the agent's keys and period, not this process's: give them to "
                    "keyshift serve, or drop --agent" % ", ".join(given))
    elif a.reload_ms is None:
        a.reload_ms = 500
    return a


class AgentApp:
    """What Service calls on an App, through the agent at ``args.agent``:
    seal_class and open go to it (keyshift.AgentClient), and the column's
    encoding is --encoding."""

    def __init__(self, args) -> None:
        self.encoding = args.encoding
        self.client = keyshift.AgentClient(args.agent)
        self.open = self.client.open
        self.seal_class = self.client.seal_class

    def column_encoding(self, table: str, column: str) -> str:
        return self.encoding

    def __enter__(self) -> "AgentApp":
        return self

    def __exit__(self, *exc: object) -> None:
        self.client.close()


def agent_answers(path: str) -> bool:
    """Whether something accepts connections on the Unix socket ``path``."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.settimeout(5)
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()


def class_name(c: keyshift.ValueClass) -> str:
    """plaintext, or v2:xchacha20-poly1305:payments/kek:1 (the CLI's notation)."""
    if c.plaintext:
        return "plaintext"
    return "v%d:%s:%s:%d" % (c.version, c.algorithm, c.key_id, c.key_version)


class Service:
    def __init__(self, args, app: keyshift.App, db, pg: bool) -> None:
        self.a, self.app, self.db, self.pg = args, app, db, pg
        self.rng = random.Random(args.seed)
        self.s = {"instance": args.instance, "ops": 0, "reads": 0, "failed_reads": 0,
                  "open_failures": collections.Counter(), "writes": collections.Counter(),
                  "write_failures": collections.Counter(), "db_errors": 0}
        self.serial = 0
        q = lambda n: '"%s"' % n.replace('"', '""')  # noqa: E731
        ph = "%s" if pg else "?"
        idc, t = q(args.id_column), q(args.table)
        self.sql_range = "SELECT min(%s), max(%s) FROM %s" % (idc, idc, t)
        self.sql_pick = "SELECT %s, %s, %s FROM %s WHERE %s >= %s ORDER BY %s LIMIT 1" % (
            idc, q(args.tenant_column), q(args.column), t, idc, ph, idc)
        self.sql_put = "UPDATE %s SET %s = %s WHERE %s = %s" % (t, q(args.column), ph, idc, ph)

    def execute(self, sql, params=()):
        cur = self.db.cursor()
        cur.execute(sql, params)
        return cur

    def step(self, lo: int, hi: int) -> None:
        s, a = self.s, self.a
        s["ops"] += 1
        try:
            row_id, tenant, value = self.execute(self.sql_pick, (self.rng.randint(lo, hi),)).fetchone()
        except Exception as e:  # the driver's error: counted, the next operation goes on
            s["db_errors"] += 1
            print("example_service: SELECT: %s" % type(e).__name__, file=sys.stderr)
            return
        value = value.encode() if isinstance(value, str) else None if value is None else bytes(value)
        if value is not None:
            s["reads"] += 1
            try:
                pt = self.app.open(a.table, a.column, tenant, value, purpose=a.purpose,
                                   context=(a.read_context or a.context).replace("{id}", str(row_id)))
                obj = json.loads(pt)
                if not isinstance(obj, dict) or obj.get("id", row_id) != row_id:
                    raise ValueError
            except keyshift.Error as e:
                s["failed_reads"] += 1
                s["open_failures"][e.name] += 1
            except ValueError:
                s["failed_reads"] += 1
                s["open_failures"]["malformed-plaintext"] += 1
        if self.rng.randrange(100) >= a.write_percent:
            return
        self.serial += 1
        pt = json.dumps({"id": row_id, "writer": a.instance, "n": self.serial},
                        separators=(",", ":")).encode()  # compact, as keyshift-demo-app writes
        try:
            new, cls = self.app.seal_class(a.table, a.column, tenant, pt, purpose=a.purpose,
                                           context=a.context.replace("{id}", str(row_id)))
        except keyshift.Error as e:
            s["write_failures"][e.name] += 1
            return
        if self.app.column_encoding(a.table, a.column) == "base64" or (cls.plaintext and not self.pg):
            new = new.decode()  # a text column's value, or a plaintext that stays TEXT
        try:
            self.execute(self.sql_put, (new, row_id))
            if not self.pg:
                self.db.commit()
            s["writes"][class_name(cls)] += 1
        except Exception as e:
            s["db_errors"] += 1
            print("example_service: UPDATE: %s" % type(e).__name__, file=sys.stderr)

    def report(self) -> None:
        if self.a.json:
            print(json.dumps(self.s, separators=(",", ":")), flush=True)
        else:
            print(", ".join("%s %s" % (k, dict(v) if isinstance(v, dict) else v)
                            for k, v in self.s.items()), flush=True)


def connect(args):
    """The database connection (autocommit), and whether it is PostgreSQL."""
    if not PG_DSN.match(args.db):
        return sqlite3.connect("file:%s?mode=rw" % args.db, uri=True, timeout=10), False
    try:
        import psycopg2
    except ImportError:
        raise SystemExit("example_service: PostgreSQL needs psycopg2, which this interpreter "
                         "(%s) lacks: run it with Debian's /usr/bin/python3 (package "
                         "python3-psycopg2)." % sys.executable) from None
    db = psycopg2.connect(args.db)
    db.autocommit = True
    return db, True


def main(argv=None) -> int:
    args = parse_args(argv if argv is not None else sys.argv[1:])
    passphrase = None
    if args.passphrase_file:
        with open(args.passphrase_file, "rb") as f:
            passphrase = f.read().rstrip(b"\n")
    stop, dump = [], []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))
    signal.signal(signal.SIGUSR1, lambda *_: dump.append(1))
    try:
        db, pg = connect(args)
    except SystemExit as e:
        print(e, file=sys.stderr)
        return 69
    except Exception as e:
        print("example_service: cannot open the database: %s" % type(e).__name__, file=sys.stderr)
        return 69
    if args.agent and not agent_answers(args.agent):
        print("example_service: no agent answers on %s: start keyshift serve --listen unix:%s "
              "first." % (args.agent, args.agent), file=sys.stderr)
        db.close()
        return 69
    try:
        with AgentApp(args) if args.agent else \
                keyshift.App(keyring=args.keyring, passphrase=passphrase, database=args.db,
                             instance_id=args.instance, default_key_id=args.key_id,
                             purpose=args.purpose, interval_ms=args.reload_ms,
                             default_encoding=args.encoding) as app:
            svc = Service(args, app, db, pg)
            lo, hi = svc.execute(svc.sql_range).fetchone()
            if lo is None:
                print("example_service: table %s has no rows." % args.table, file=sys.stderr)
                return 66
            start = time.monotonic()
            while not stop and (not args.ops or svc.s["ops"] < args.ops) and \
                    (not args.seconds or time.monotonic() - start < args.seconds):
                if dump:
                    dump.clear()
                    svc.report()
                if args.rate:
                    time.sleep(max(0.0, start + svc.s["ops"] / args.rate - time.monotonic()))
                svc.step(lo, hi)
    except keyshift.Error as e:
        print("example_service: %s" % e, file=sys.stderr)
        return 69
    finally:
        db.close()
    svc.report()
    return 65 if svc.s["failed_reads"] else 74 if svc.s["db_errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
