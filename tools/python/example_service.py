"""An example service in Python: keyshift-demo-app's job on the keyshift package.

It behaves like one instance of a service that keeps an encrypted column in
a SQLite database (Python's sqlite3 module holds the rows) while the
rollouts stored in the same database (read by the C library through
App(database=...)) decide what it writes and which values it may read:

  read   pick a random row, open its value with the row's tenant, the
         context rendered from --context (``{id}`` is the row's id) and
         --purpose, and check that the plaintext is a JSON object whose
         "id" is the row's;
  write  with probability --write-percent, seal a new JSON object for the
         row and UPDATE it (the class written is the one the rollout names
         for the row's tenant; the default key where no rollout governs).

The App registers the instance as a reader, heartbeats and reports its
health every --reload-ms.  --populate N first inserts N rows (tenants t0
to t9).  At the end it prints counts (never a plaintext), as JSON with
--json, and exits 65 if any read failed, 75 if a key provider or the
database was unavailable.

    python3 example_service.py --db shop.db --keyring keyring --key-id payments/kek \\
        --instance web-1 --populate 100 --ops 1000
"""

import argparse
import collections
import json
import random
import sqlite3
import sys
import time

import keyshift


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--db", required=True, help="the SQLite database (rows and rollout state)")
    p.add_argument("--table", default="payments")
    p.add_argument("--column", default="card")
    p.add_argument("--id-column", default="id")
    p.add_argument("--tenant-column", default="tenant")
    p.add_argument("--context", default="payments:{id}:card", help="context template")
    p.add_argument("--purpose", default="card")
    p.add_argument("--instance", required=True, help="this instance's id")
    p.add_argument("--keyring", help="default: $KEYSHIFT_KEYRING")
    p.add_argument("--passphrase-file")
    p.add_argument("--key-id", help="the key to seal where no rollout governs the column")
    p.add_argument("--populate", type=int, default=0, metavar="N")
    p.add_argument("--ops", type=int, default=1000)
    p.add_argument("--seconds", type=float, help="run this long instead of --ops")
    p.add_argument("--write-percent", type=float, default=20.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--reload-ms", type=int, default=500)
    p.add_argument("--json", action="store_true")
    return p.parse_args(argv)


def class_name(c: keyshift.ValueClass) -> str:
    """v2:xchacha20-poly1305:payments/kek:1, or plaintext."""
    if c.plaintext:
        return "plaintext"
    return "v%d:%s:%s:%d" % (c.version, c.algorithm, c.key_id, c.key_version)


class Service:
    def __init__(self, args, app: keyshift.App, db: sqlite3.Connection) -> None:
        self.a, self.app, self.db = args, app, db
        self.rng = random.Random(args.seed)
        self.counts = collections.Counter()
        self.serial = 0
        q = '"%s"' % args.table.replace('"', '""')
        col = lambda n: '"%s"' % n.replace('"', '""')  # noqa: E731
        self.sql_ids = "SELECT %s FROM %s" % (col(args.id_column), q)
        self.sql_get = "SELECT %s, %s FROM %s WHERE %s = ?" % (
            col(args.column), col(args.tenant_column), q, col(args.id_column))
        self.sql_put = "UPDATE %s SET %s = ? WHERE %s = ?" % (
            q, col(args.column), col(args.id_column))
        self.sql_add = "INSERT INTO %s (%s, %s, %s) VALUES (?, ?, ?)" % (
            q, col(args.id_column), col(args.tenant_column), col(args.column))

    def context(self, row_id) -> str:
        return self.a.context.replace("{id}", str(row_id))

    def plaintext(self, row_id) -> bytes:
        self.serial += 1
        return json.dumps({"id": row_id, "instance": self.a.instance, "n": self.serial}).encode()

    def populate(self, n: int) -> None:
        for i in range(1, n + 1):
            value = self.app.seal(self.a.table, self.a.column, "t%d" % (i % 10), self.plaintext(i),
                                  context=self.context(i), purpose=self.a.purpose)
            self.db.execute(self.sql_add, (i, "t%d" % (i % 10), value))
        self.db.commit()

    def step(self, ids) -> None:
        row_id = self.rng.choice(ids)
        row = self.db.execute(self.sql_get, (row_id,)).fetchone()
        if row is None or row[0] is None:
            self.counts["read-skipped"] += 1
            return
        value, tenant = bytes(row[0]) if not isinstance(row[0], str) else row[0].encode(), row[1]
        try:
            pt, cls = self.app.open_class(self.a.table, self.a.column, tenant, value,
                                          context=self.context(row_id), purpose=self.a.purpose)
            obj = json.loads(pt)
            if not isinstance(obj, dict) or obj.get("id", row_id) != row_id:
                self.counts["read-wrong-row"] += 1
            else:
                self.counts["read " + class_name(cls)] += 1
        except keyshift.Error as e:
            self.counts["read-failed %s %s" % (e.error_class, e.name)] += 1
            return
        except ValueError:
            self.counts["read-not-json"] += 1
            return
        if self.rng.random() * 100 < self.a.write_percent:
            try:
                new, cls = self.app.seal_class(self.a.table, self.a.column, tenant,
                                               self.plaintext(row_id),
                                               context=self.context(row_id),
                                               purpose=self.a.purpose)
            except keyshift.Error as e:
                self.counts["write-failed %s %s" % (e.error_class, e.name)] += 1
                return
            self.db.execute(self.sql_put, (new, row_id))
            self.db.commit()
            self.counts["write " + class_name(cls)] += 1

    def run(self) -> None:
        ids = [r[0] for r in self.db.execute(self.sql_ids)]
        if not ids:
            return
        deadline = time.monotonic() + self.a.seconds if self.a.seconds else None
        n = 0
        while (deadline is None and n < self.a.ops) or (deadline and time.monotonic() < deadline):
            self.step(ids)
            n += 1
        self.counts["ops"] = n


def main(argv=None) -> int:
    args = parse_args(argv if argv is not None else sys.argv[1:])
    passphrase = None
    if args.passphrase_file:
        with open(args.passphrase_file, "rb") as f:
            passphrase = f.read().rstrip(b"\n")
    db = sqlite3.connect(args.db, timeout=10)
    try:
        with keyshift.App(keyring=args.keyring, passphrase=passphrase, database=args.db,
                          instance_id=args.instance, default_key_id=args.key_id,
                          interval_ms=args.reload_ms) as app:
            svc = Service(args, app, db)
            if args.populate:
                svc.populate(args.populate)
            svc.run()
            stats = app.stats()
    except keyshift.Error as e:
        print("example_service: %s" % e, file=sys.stderr)
        return 75 if e.retryable else 78
    finally:
        db.close()
    counts = dict(sorted(svc.counts.items()))
    counts["reports"] = stats.reports
    if args.json:
        print(json.dumps(counts))
    else:
        for k, v in counts.items():
            print("%-60s %d" % (k, v))
    if any(k.startswith("read-failed") and "retryable" in k for k in counts):
        return 75
    return 65 if any(k.startswith(("read-failed", "read-wrong", "read-not")) for k in counts) else 0


if __name__ == "__main__":
    sys.exit(main())
