/*
 * tools/cli/cmd_migrate.c -- `keyshift migrate`: encrypt, rewrap or
 * re-encrypt one column of a live SQLite or PostgreSQL database in
 * short, resumable, verified batches (docs/migration.md).
 *
 * This file holds the manual, the options every subcommand shares and
 * their parsing, `status`, `pause` and `resume`, and the dispatch; the
 * run is tools/cli/cmd_migrate_run.c, `verify` and `quarantine`
 * tools/cli/cmd_migrate_check.c.  No output ever carries plaintext or
 * key material: only counts, row ids, key ids and error names.
 */
#define _POSIX_C_SOURCE 200809L

#include <assert.h>
#include <ctype.h>
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "cmd_migrate.h"
#include "cmd_migrate_workers.h"

/* Manual of `keyshift migrate`. */
static void usage(FILE *f)
{
    fputs("NAME\n"
          "    keyshift migrate - encrypt, rewrap or re-encrypt a column of a live database\n"
          "\n"
          "SYNOPSIS\n"
          "    keyshift migrate run --db DB --table T --column C\n"
          "        --mode encrypt|rewrap|reencrypt --to-key KEY_ID[:VERSION]\n"
          "        [--to-format 1|2] [--algorithm NAME] [--id-column I]\n"
          "        [--tenant-column COL | --tenant T] [--context TEMPLATE]\n"
          "        [--purpose P] [--batch-size N] [--batch-target DURATION]\n"
          "        [--batch-max N] [--max-failure-rate R]\n"
          "        [--max-rows-per-second N] [--no-verify] [--serial]\n"
          "        [--from-key KEY_ID] [--supersede] [--busy-timeout MS]\n"
          "        [--synchronous full|normal] [--throttle-query SQL]\n"
          "        [--max-replica-lag DURATION] [--encoding binary|base64] [--json]\n"
          "        [--textfile DIR] [--workers N [--chunk-ids N] [--lease DURATION]]\n"
          "        [--keyring FILE [--passphrase-file FILE] | --providers FILE]\n"
          "    keyshift migrate status --db DB [--table T --column C] [--id-column I]\n"
          "        [--chunks] [--json]\n"
          "    keyshift migrate quarantine list --db DB --table T --column C\n"
          "        [--id-column I] [--encoding binary|base64] [--json]\n"
          "    keyshift migrate quarantine release --db DB --table T --column C\n"
          "        (--id ID | --error NAME | --all) [--id-column I]\n"
          "        [--busy-timeout MS] [--encoding binary|base64] [--json]\n"
          "    keyshift migrate pause --db PG --table T --column C [--reason R]\n"
          "    keyshift migrate resume --db PG --table T --column C\n"
          "    keyshift migrate verify --db DB --table T --column C [--sample N]\n"
          "        [--id-column I] [--context TEMPLATE] [--tenant-column COL |\n"
          "        --tenant T] [--purpose P] [--from-key KEY_ID]\n"
          "        [--encoding binary|base64] [--json]\n"
          "        [--keyring FILE [--passphrase-file FILE] | --providers FILE]\n"
          "    DB is a SQLite file or a PostgreSQL connection string:\n"
          "        --db shop.db\n"
          "        --db 'postgresql://app@db.example/shop?sslmode=verify-full'\n"
          "        --db 'host=/run/postgresql dbname=shop user=app'\n"
          "\n"
          "DESCRIPTION\n"
          "    run     rewrites column C of table T, batch by batch, while the\n"
          "            application keeps using the database. Modes:\n"
          "              encrypt    plaintext values become envelopes under KEY_ID\n"
          "              rewrap     envelopes get their data key rewrapped under\n"
          "                         KEY_ID[:VERSION]; the ciphertext is unchanged\n"
          "                         (fast: the usual rotation after 'keys\n"
          "                         add-version' and 'keys promote')\n"
          "              reencrypt  envelopes are opened and sealed again under a\n"
          "                         fresh data key (after a data-key compromise, or\n"
          "                         to change format or algorithm)\n"
          "            Each batch is one short write transaction: every row is replaced\n"
          "            only if it still holds the value read (compare-and-swap), each\n"
          "            new value is checked to open before the commit (encrypt and\n"
          "            reencrypt also decrypt it and compare with the old plaintext;\n"
          "            a rewrap must keep the old nonce and ciphertext byte for byte),\n"
          "            and the checkpoint is saved in the same transaction. Rows\n"
          "            already at the target are skipped, in every mode; rows of the\n"
          "            wrong kind (plaintext for rewrap and reencrypt, an envelope not\n"
          "            at the target for encrypt) are counted as wrong-state, untouched.\n"
          "            The crypto of the next batch runs on a second thread while a\n"
          "            batch is written (--serial: one thread; same writes either way).\n"
          "            A crash or a kill at any moment loses nothing; running the same\n"
          "            command again resumes after the last committed batch. Rows the\n"
          "            application changed meanwhile are retried in a later pass; rows\n"
          "            that do not parse or open are quarantined (keyshift_quarantine)\n"
          "            and never modified. Quarantine belongs to the migration: a run\n"
          "            with other parameters (the corrected command after a wrong\n"
          "            --context, --purpose or tenant) tries those rows again, and\n"
          "            quarantines them again only if they fail again. When most rows\n"
          "            of the first batch fail with auth-failed, the run says so: the\n"
          "            likely cause is its context, purpose or tenant. The summary\n"
          "            counts what this run did (and, on a second line, the\n"
          "            migration's totals over every run when they differ). No mode\n"
          "            ever writes plaintext.\n"
          "    quarantine list|release  the column's quarantined rows (id, error,\n"
          "            when, the migration that quarantined them), and releasing them\n"
          "            by --id, --error NAME or --all so that the next run tries them\n"
          "            again; logged on standard error ('keyshift migrate quarantine\n"
          "            --help').\n"
          "    pause, resume  (PostgreSQL) set or clear column C's pause flag\n"
          "            (keyshift_migrate_pause, created if missing): every run over\n"
          "            the column, on any host, waits after its current batch while\n"
          "            the flag is set, and goes on when it is cleared.\n"
          "    status  lists the migration checkpoints kept in the database, most\n"
          "            recently updated first (target, parameters, state, pass, cursor,\n"
          "            counts, times); with --json one object {\"migrations\":[...]}.\n"
          "            --table and --column show only that column's migrations.\n"
          "            PostgreSQL: a migration run with --workers also shows its\n"
          "            chunks: a line 'chunks N: C complete, R running, P pending'\n"
          "            (pending counts those with an expired lease too: their\n"
          "            worker died, the next claim takes them over) and one line\n"
          "            per running chunk (its ids, state, pass, cursor, done, the\n"
          "            worker holding it and its lease's end); --chunks lists\n"
          "            every chunk. With --json a \"chunks\" member: chunks,\n"
          "            complete, running, pending, expired and \"list\" (the running\n"
          "            chunks, or all with --chunks).\n"
          "            Read-only; a malformed checkpoint row stops it (exit 74).\n"
          "    verify  opens every envelope of the column (or a random sample of about\n"
          "            N rows) and lists, by row id and error name, those that do not\n"
          "            open. Read-only; it checks every envelope as an open would, tag\n"
          "            included, without decrypting: no plaintext is ever in memory.\n"
          "            When a rollout of the column is in backfill, a complete verify\n"
          "            (no --sample) that found no failure is recorded in it, so it may\n"
          "            be finalized; a key-scoped rollout records it for this column,\n"
          "            and needs one for each column it lists (--from-key KEY_ID\n"
          "            verifies only that key's envelopes, enough for a key-scoped\n"
          "            rollout of it).\n"
          "\n"
          "    Rollouts: when a rollout governs the column (docs/rollout.md), run is\n"
          "    refused unless the rollout is in backfill and the run's target (key,\n"
          "    version and, to encrypt or re-encrypt, format and algorithm) is the\n"
          "    rollout's target. The governing rollout is the column's own latest,\n"
          "    or a later key-scoped rollout of the run's target key covering the\n"
          "    column; another key-scoped rollout that is not finalized and covers\n"
          "    the column refuses the run (exit 78). A run the rollout allows\n"
          "    supersedes an unfinished migration of the column with other\n"
          "    parameters (as --supersede). Under a key-scoped rollout the\n"
          "    run touches only envelopes of the rollout's key (as --from-key): the\n"
          "    column's plaintext and other keys' envelopes are skipped, never moved\n"
          "    under that key. The run then writes its health\n"
          "    counts to the rollout (keyshift_metrics, source 'migrate') every 5 s\n"
          "    and at its end, and stops before its next batch (exit 75) if the\n"
          "    rollout leaves backfill.\n"
          "\n"
          "    PostgreSQL: the table needs a smallint, integer or bigint primary key\n"
          "    (or a unique NOT NULL --id-column) and a bytea column C. run needs\n"
          "    SELECT and UPDATE on the table, and keeps its checkpoints and\n"
          "    quarantine in keyshift_migration and keyshift_quarantine in the\n"
          "    table's schema, which it creates on its first run (CREATE on the\n"
          "    schema, or have them created beforehand: docs/migration.md). Each\n"
          "    batch is one READ COMMITTED transaction; --busy-timeout is its\n"
          "    lock_timeout. verify, status and census use a read-only session.\n"
          "    Rollouts live in the same PostgreSQL database (keyshift_rollout and\n"
          "    its tables) and govern run and verify as on SQLite; each batch reads\n"
          "    its rollout's phase FOR SHARE, so a rollback waits for the batch and\n"
          "    stops the next one. A run\n"
          "    whose database goes away (the server stopped, the connection lost)\n"
          "    exits 69 with its last committed batch kept: rerun it once the\n"
          "    server is back and it resumes from its checkpoint.\n"
          "\n"
          "    Workers (PostgreSQL): run --workers N runs N worker threads, each on a\n"
          "    connection of its own. The column's id range is split once into\n"
          "    chunks of about --chunk-ids ids, kept in keyshift_chunk beside the\n"
          "    table; each worker claims a chunk (a lease of --lease, timed by the\n"
          "    database's clock), migrates it in batches that save the chunk's\n"
          "    cursor and counts in their own transaction, and claims the next,\n"
          "    until every chunk is complete. Running the same command on several\n"
          "    hosts adds their workers to the same migration. A worker that dies\n"
          "    (kill -9, a host lost) leaves its chunk leased until the lease ends;\n"
          "    then another worker takes it over from its last committed batch.\n"
          "    The throttle (--throttle-query, --max-replica-lag, pause) holds\n"
          "    every worker after its current batch, keeping its chunk's lease,\n"
          "    and lets them all go on together. --max-rows-per-second applies to\n"
          "    each worker. --workers 1 runs the chunked way too (it joins other\n"
          "    hosts' workers); without --workers the run is the single-connection\n"
          "    one. Finish a migration the way it began: both ways are safe\n"
          "    together (every write is a compare-and-swap, rows at the target are\n"
          "    skipped), but their counts do not add up across the switch. A\n"
          "    rerun of a complete migration with --workers is the catch-up pass,\n"
          "    on one connection. SQLite has one writer at a time: --workers 1\n"
          "    is the single run there, more is refused (exit 64).\n"
          "\n"
          "    Progress: on a terminal, run draws a progress bar on standard error\n"
          "    (rows done/total, rows/s, ETA); with --json it writes one JSON object\n"
          "    per committed batch to standard output, then a summary object.\n"
          "    Otherwise it prints only the summary, on standard error. With\n"
          "    --workers, one bar over every worker: the migration's rows done\n"
          "    (every host's, from the chunks), this process's rows/s, an ETA at\n"
          "    the whole migration's rate, and chunks complete/planned; the JSON\n"
          "    lines add worker, chunk, chunks and chunks_complete, the summary\n"
          "    workers, rows_here, chunks, chunks_complete, claims, takeovers\n"
          "    (chunks resumed from a dead worker's cursor) and lost (chunks\n"
          "    another worker took over meanwhile: that batch rolled back).\n"
          "\n"
          "OPTIONS\n"
          "    --db DB                " KS_CLI_DB_RULE
          "    --table T, --column C  the table and the column to migrate\n"
          "    --id-column I          unique NOT NULL column identifying rows, scanned in\n"
          "          order (default: the rowid; a WITHOUT ROWID table names\n"
          "          its primary key). A --context binding {id} needs a\n"
          "          stable id: an INTEGER PRIMARY KEY or a unique NOT NULL\n"
          "          column, never the bare rowid of a table without an\n"
          "          INTEGER PRIMARY KEY, which VACUUM and a dump/restore\n"
          "          renumber (refused: unstable-id, exit 64)\n"
          "    --encoding E           how column C holds envelopes (run, verify,\n"
          "          quarantine): binary (the default; BLOB, bytea) or base64, each\n"
          "          envelope's canonical text, which begins \"S1NF\" (a SQLite TEXT,\n"
          "          a PostgreSQL text or varchar column; docs/format.md section\n"
          "          10), written as text. Part of the migration's parameters. A\n"
          "          value beginning \"S1NF\" that is not canonical base64 is\n"
          "          malformed: quarantined, never re-encoded. A run or verify\n"
          "          of a column that a rollout not yet finalized covers must give\n"
          "          the rollout's encoding ('rollout status'); another is refused\n"
          "          (exit 64)\n"
          "    --mode M               encrypt, rewrap or reencrypt\n"
          "    --to-key KEY_ID[:V]    the target key, and version V (default: the key's\n"
          "          primary, resolved once and recorded in the checkpoint).\n"
          "          A key id that itself ends in ':<digits>' needs ':V'\n"
          "    --to-format 1|2        encrypt/reencrypt: envelope format (default 2)\n"
          "    --algorithm NAME       encrypt/reencrypt: xchacha20-poly1305 (default) or\n"
          "          aes-256-gcm\n"
          "    --tenant-column COL    the column holding each row's tenant\n"
          "    --tenant T             one tenant for every row (required by encrypt unless\n"
          "          --tenant-column is given)\n"
          "    --context TEMPLATE     context bound into each envelope, rebuilt per row:\n"
          "          {id} is the row id, {name} the value of column name\n"
          "          (INTEGER as decimal, TEXT as is, BLOB as lowercase\n"
          "          hex, NULL as empty); '{{' and '}}' are literal braces.\n"
          "          E.g. 'payments:{id}:card' (default: empty)\n"
          "    --purpose P            format 2: the purpose written and expected (encrypt\n"
          "          default: 'default'); format-1 envelopes have none and\n"
          "          are opened without it\n"
          "    --batch-size N         rows per transaction (default 500; 1..100000); with\n"
          "          --batch-target, the first batch's\n"
          "    --batch-target DURATION  run: size every batch so that it takes about\n"
          "          DURATION (e.g. 500ms or 0.5s; s, m and h; at most 1h),\n"
          "          from the time per row of the batches before it,\n"
          "          measured on a monotonic clock without the pauses of\n"
          "          --max-rows-per-second, --throttle-query or 'migrate\n"
          "          pause': at most twice the last size, at once smaller\n"
          "          after a batch over DURATION, between 10 rows and\n"
          "          --batch-max. A short batch holds its row locks briefly\n"
          "          on a loaded server; a long one commits less often on an\n"
          "          idle one. 0 or absent: every batch has --batch-size\n"
          "          rows. Not part of the migration's parameters: a rerun\n"
          "          may change it\n"
          "    --batch-max N          run, with --batch-target: the most rows of a batch\n"
          "          (default 10000; 10..100000; memory: about 1 KiB a row)\n"
          "    --max-failure-rate R   stop (exit 65) once quarantined rows exceed this\n"
          "          fraction of rows processed (default 0.001)\n"
          "    --max-rows-per-second N  throttle, to leave the database to the application\n"
          "          (default: unlimited)\n"
          "    --no-verify            DANGEROUS: skip verify-before-commit. A bug or a bad\n"
          "          key could then write envelopes that do not open, and\n"
          "          the old value is gone: verify-before-commit is what\n"
          "          guarantees every written row opens to its old\n"
          "          plaintext. Only for benchmarking on copies\n"
          "    --serial               run: do every batch's crypto on the main thread instead\n"
          "          of overlapping it with the previous batch's writes\n"
          "          (slower; leaves the other cores to the application;\n"
          "          throttled runs (--max-rows-per-second) are serial)\n"
          "    --busy-timeout MS      wait up to MS for the database lock, with backoff,\n"
          "          before giving up with exit 75 (default 30000); on\n"
          "          PostgreSQL the batch's lock_timeout (a statement also\n"
          "          stops after 300 s: exit 75)\n"
          "    --synchronous full|normal  run: how the run's own connection makes each\n"
          "          batch durable (PRAGMA synchronous; the application's\n"
          "          connections keep theirs). full (default): every\n"
          "          committed batch is on disk, in any journal mode.\n"
          "          normal: only for a database in WAL mode (the usual\n"
          "          setting of a WAL application), faster; a power loss\n"
          "          (not a crash or a kill) may roll back the last\n"
          "          batches, never corrupting the database, and since\n"
          "          each batch commits its checkpoint with its rows, the\n"
          "          next run redoes just those. Refused (exit 64) for a\n"
          "          database in a rollback-journal mode (DELETE,\n"
          "          TRUNCATE, ...), which keeps full. SQLite only: refused\n"
          "          (exit 64) with a PostgreSQL --db, whose commits are as\n"
          "          durable as the server's synchronous_commit makes them\n"
          "    --throttle-query SQL   run, PostgreSQL: after every batch, run SQL (a\n"
          "          SELECT of the operator's, on a read-only session of its\n"
          "          own) and wait while its first row's first column is\n"
          "          true, checking every 0.5 s (e.g. \"SELECT load > 0.8 FROM\n"
          "          app_load\"). A query that does not prepare: exit 64\n"
          "    --max-replica-lag DURATION  run, PostgreSQL: wait while a replica's\n"
          "          replay lag (pg_stat_replication.replay_lag; seeing it\n"
          "          needs pg_monitor) is above DURATION (5s, 1m)\n"
          "          Throttled time (these two and the pause flag) is\n"
          "          reported (stderr, or {\"throttled\":...} lines and\n"
          "          throttled_s with --json) and left out of the rate and\n"
          "          the ETA; no row lock is held while waiting\n"
          "    --textfile DIR         run: write the progress (rows by outcome, throttled\n"
          "          seconds, last progress time, running, complete) as\n"
          "          Prometheus text to DIR/keyshift_migrate_TABLE_COLUMN.prom\n"
          "          for node_exporter's textfile collector, atomically\n"
          "          (temporary file, fsync, rename), at most once a second\n"
          "          while batches commit and at the end (docs/prometheus.md).\n"
          "          With --workers the rows are the migration's, over every\n"
          "          worker of every host (the chunks' counts), as the bar's\n"
          "    --workers N            run, PostgreSQL: N worker threads (1..64), each with a\n"
          "          connection of its own, sharing the migration with the\n"
          "          other hosts' (see Workers). The server needs N + 2\n"
          "          connections per process (the run's own and the\n"
          "          throttle's)\n"
          "    --chunk-ids N          run --workers: about N ids per chunk (default 10000;\n"
          "          wider when that would make more than 100000 chunks).\n"
          "          Used by the first run of a migration only: its plan stays\n"
          "    --lease DURATION       run --workers: how long a worker keeps a chunk without\n"
          "          committing a batch (default 60s; 1s..1d). Longer than\n"
          "          one batch, provider calls included; a dead worker's\n"
          "          chunk waits this long to be taken over\n"
          "    --chunks               status: list every chunk, not only the running ones\n"
          "    --reason R             pause: why (shown by the runs that wait)\n"
          "    --from-key KEY_ID      run (rewrap, reencrypt) and verify: only envelopes\n"
          "          whose key id is KEY_ID; plaintext and other keys'\n"
          "          envelopes are skipped and counted so (a column holding\n"
          "          several tenants' keys). Part of the run's checkpoint.\n"
          "          Set by itself under a key-scoped rollout; a verify\n"
          "          with it counts only for a key-scoped rollout of KEY_ID\n"
          "    --supersede            run: go ahead although an unfinished migration of\n"
          "          this database with other parameters exists (exit 65\n"
          "          otherwise); it is marked superseded in migrate status\n"
          "          and can still be resumed by running it again\n"
          "    --sample N             verify: about N random rows instead of all\n"
          "    --json                 machine-readable output (see DESCRIPTION)\n"
          "    --keyring FILE         default: $KEYSHIFT_KEYRING\n"
          "    --passphrase-file FILE keyring passphrase (default: $KEYSHIFT_PASSPHRASE);\n"
          "          " KS_CLI_PASSPHRASE_RULE "\n"
          "    --providers FILE       " KS_CLI_KEYS_RULE
          "          A rewrap to a key another provider serves (--to-key hsm/k)\n"
          "          moves every DEK into that provider without touching the\n"
          "          ciphertext: how a column leaves a key file for an HSM.\n"
          "    -h, --help             print this manual\n"
          "\n"
          "ENVIRONMENT\n"
          "    KEYSHIFT_KEYRING, KEYSHIFT_PASSPHRASE, KEYSHIFT_PROVIDERS  as the options\n"
          "                say\n"
          KS_CLI_PG_ENV
          "\n"
          "EXIT STATUS\n"
          "    0   run: complete; verify: every envelope opened; status: printed\n"
          "    64  usage error (a bad --context gives its byte offset); a\n"
          "        --context binding {id} to an unstable id (unstable-id);\n"
          "        an --encoding other than the covering rollout's;\n"
          "        a password in a PostgreSQL --db; run: also\n"
          "        --synchronous normal on a database not in WAL mode, or\n"
          "        --synchronous with PostgreSQL, or --workers above 1 on SQLite\n"
          "        (nothing written)\n"
          "    65  run: stopped by --max-failure-rate (checkpoint valid; see\n"
          "        'migrate quarantine list'), or (mismatch) an unfinished migration\n"
          "        of this column with other parameters exists (resume it, or\n"
          "        --supersede; nothing written); verify: some rows did not open\n"
          "    66  no such database, table or column\n"
          "    69  key provider unavailable, or the PostgreSQL database unreachable or\n"
          "        gone away mid-run (batch rolled back, checkpoint kept; rerun once it\n"
          "        is back; --workers: its chunks are taken over once their leases end)\n"
          "    70  run: verify-failed: verify-before-commit found a new value that\n"
          "        does not open to the old plaintext (a bug or faulty hardware;\n"
          "        that batch not written): report it, do not rerun\n"
          "    74  database error or disk full (batch rolled back; rerun once fixed);\n"
          "        status: a malformed checkpoint row\n"
          "    75  paused by SIGINT/SIGTERM, key provider timeout, or the database\n"
          "        stayed locked (PostgreSQL: lock_timeout, statement_timeout, a\n"
          "        deadlock or serialization failure): rerun the same command to resume\n"
          "        (--workers: every worker committed its batch and gave its chunk up)\n"
          "    77  target key unknown, disabled, destroyed or denied\n"
          "    78  keyring or providers file insecure, unreadable or corrupt, wrong\n"
          "        passphrase, or wrong or locked PIN; run:\n"
          "        the column's rollout is not in backfill, or targets another class\n"
          "    Every code is explained, with recovery steps, in docs/migration.md.\n"
          "\n"
          "EXAMPLES\n"
          "    keyshift migrate run --db shop.db --table payments --column card \\\n"
          "        --mode encrypt --to-key payments/kek --tenant acme \\\n"
          "        --context 'payments:{id}:card' --purpose card\n"
          "    keyshift keys add-version payments/kek     # prints 2\n"
          "    keyshift keys promote payments/kek 2\n"
          "    keyshift migrate run --db shop.db --table payments --column card \\\n"
          "        --mode rewrap --to-key payments/kek:2 --max-rows-per-second 5000\n"
          "    keyshift migrate status --db shop.db --json\n"
          "    keyshift migrate run --db 'host=db.example dbname=shop user=migrator' \\\n"
          "        --table payments --column card --mode rewrap --to-key payments/kek:2 \\\n"
          "        --workers 8      # the same command on each of several hosts\n"
          "    keyshift migrate status --db 'host=db.example dbname=shop user=reader' \\\n"
          "        --table payments --column card\n"
          "    PGPASSFILE=~/.pgpass keyshift migrate run \\\n"
          "        --db 'postgresql://migrator@db.example/shop' --table payments \\\n"
          "        --column card --mode rewrap --to-key payments/kek:2\n"
          "    keyshift migrate verify --db shop.db --table payments --column card \\\n"
          "        --context 'payments:{id}:card' --purpose card --sample 1000\n",
          f);
}

/* See cmd_migrate.h. */
int ks_cli_mig_parse(const char *cmd, int argc, char **argv, ks_cli_mig_opts *o, int *rc)
{
    int npos = 0;
    const ks_cli_opt opts[] = {
        {"--db", &o->db, NULL},
        {"--table", &o->table, NULL},
        {"--column", &o->column, NULL},
        {"--id-column", &o->id_column, NULL},
        {"--encoding", &o->encoding, NULL},
        {"--mode", &o->mode, NULL},
        {"--to-key", &o->to_key, NULL},
        {"--from-key", &o->from_key, NULL},
        {"--to-format", &o->to_format, NULL},
        {"--algorithm", &o->algorithm, NULL},
        {"--tenant-column", &o->tenant_column, NULL},
        {"--tenant", &o->tenant, NULL},
        {"--context", &o->context, NULL},
        {"--purpose", &o->purpose, NULL},
        {"--batch-size", &o->batch_size, NULL},
        {"--batch-target", &o->batch_target, NULL},
        {"--batch-max", &o->batch_max, NULL},
        {"--max-failure-rate", &o->max_failure_rate, NULL},
        {"--max-rows-per-second", &o->max_rps, NULL},
        {"--busy-timeout", &o->busy_timeout, NULL},
        {"--synchronous", &o->synchronous, NULL},
        {"--throttle-query", &o->throttle_query, NULL},
        {"--max-replica-lag", &o->max_replica_lag, NULL},
        {"--workers", &o->workers, NULL},
        {"--chunk-ids", &o->chunk_ids, NULL},
        {"--lease", &o->lease, NULL},
        {"--textfile", &o->textfile, NULL},
        {"--chunks", NULL, &o->chunks},
        {"--id", &o->id, NULL},
        {"--error", &o->error, NULL},
        {"--all", NULL, &o->all},
        {"--reason", &o->reason, NULL},
        {"--sample", &o->sample, NULL},
        {"--keyring", &o->keyring, NULL},
        {"--passphrase-file", &o->passfile, NULL},
        {"--providers", &o->providers, NULL},
        {"--no-verify", NULL, &o->no_verify},
        {"--serial", NULL, &o->serial},
        {"--supersede", NULL, &o->supersede},
        {"--json", NULL, &o->json},
        {NULL, NULL, NULL},
    };
    return ks_cli_parse_opts(cmd, usage, argc, argv, opts, NULL, 0, &npos, rc);
}

/* See cmd_migrate.h. */
int ks_cli_mig_only_options(const char *cmd, const ks_cli_mig_opts *o, const char *allowed)
{
    const struct {
        const char *name;
        int given;
    } all[] = {
        {"--mode", o->mode != NULL},           {"--to-key", o->to_key != NULL},
        {"--to-format", o->to_format != NULL}, {"--algorithm", o->algorithm != NULL},
        {"--tenant-column", o->tenant_column != NULL}, {"--tenant", o->tenant != NULL},
        {"--context", o->context != NULL},     {"--purpose", o->purpose != NULL},
        {"--batch-size", o->batch_size != NULL},
        {"--batch-target", o->batch_target != NULL}, {"--batch-max", o->batch_max != NULL},
        {"--max-failure-rate", o->max_failure_rate != NULL},
        {"--max-rows-per-second", o->max_rps != NULL},
        {"--busy-timeout", o->busy_timeout != NULL}, {"--sample", o->sample != NULL},
        {"--synchronous", o->synchronous != NULL},
        {"--throttle-query", o->throttle_query != NULL},
        {"--max-replica-lag", o->max_replica_lag != NULL},
        {"--workers", o->workers != NULL},     {"--chunk-ids", o->chunk_ids != NULL},
        {"--lease", o->lease != NULL},         {"--chunks", o->chunks},
        {"--textfile", o->textfile != NULL},
        {"--reason", o->reason != NULL},
        {"--keyring", o->keyring != NULL},     {"--passphrase-file", o->passfile != NULL},
        {"--providers", o->providers != NULL},
        {"--no-verify", o->no_verify},         {"--id-column", o->id_column != NULL},
        {"--serial", o->serial},               {"--from-key", o->from_key != NULL},
        {"--supersede", o->supersede},
        {"--id", o->id != NULL},               {"--error", o->error != NULL},
        {"--encoding", o->encoding != NULL},
        {"--all", o->all},
    };
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        char word[40];
        snprintf(word, sizeof word, " %s ", all[i].name);
        if (all[i].given && strstr(allowed, word) == NULL) {
            return ks_cli_usage_error(cmd, "%s is not an option of '%s'", all[i].name, cmd);
        }
    }
    return EX_OK;
}

/* See cmd_migrate.h. */
ks_bytes ks_cli_mig_str_view(const char *s)
{
    return s == NULL ? (ks_bytes){NULL, 0} : (ks_bytes){(const uint8_t *)s, strlen(s)};
}


/* See cmd_migrate.h. */
int ks_cli_mig_common_params(const char *cmd, const ks_cli_mig_opts *o, ks_migrate_params *p,
                             ks_rowstore_target *t, char names[KS_CONTEXT_TEMPLATE_MAX])
{
    if (o->db == NULL || o->table == NULL || o->column == NULL) {
        return ks_cli_usage_error(cmd, "--db, --table and --column are required");
    }
    if (o->tenant != NULL && o->tenant_column != NULL) {
        return ks_cli_usage_error(cmd, "give --tenant or --tenant-column, not both");
    }
    *t = (ks_rowstore_target){.table = o->table, .column = o->column, .id_column = o->id_column,
                              .tenant_column = o->tenant_column};
    int rc = ks_cli_parse_encoding(cmd, o->encoding, &t->encoding);
    if (rc != EX_OK) {
        return rc;
    }
    p->encoding = t->encoding;
    rc = ks_cli_template_columns(cmd, o->context, t, names);
    if (rc != EX_OK) {
        return rc;
    }
    p->tenant = ks_cli_mig_str_view(o->tenant);
    p->purpose = ks_cli_mig_str_view(o->purpose);
    p->context_template = ks_cli_mig_str_view(o->context);
    p->from_key_id = ks_cli_mig_str_view(o->from_key);
    if (o->from_key != NULL && (p->from_key_id.len == 0 || p->from_key_id.len > KS_KEY_ID_MAX)) {
        return ks_cli_usage_error(cmd, "--from-key: a key id of 1..%d bytes is required",
                                  KS_KEY_ID_MAX);
    }
    return EX_OK;
}


/* Print one checkpoint of column tbl.col, as JSON (its object left
 * open, for the caller's members) or as a list of fields. */
static void print_checkpoint(ks_bytes tbl, ks_bytes col, const ks_checkpoint *cp, int json)
{
    char started[32], updated[32], finished[32];
    ks_cli_format_time(cp->started, started, sizeof started);
    ks_cli_format_time(cp->updated, updated, sizeof updated);
    ks_cli_format_time(cp->finished, finished, sizeof finished);
    if (json) {
        printf("{\"table\":");
        ks_cli_put_json_string(stdout, tbl.ptr, tbl.len);
        printf(",\"column\":");
        ks_cli_put_json_string(stdout, col.ptr, col.len);
        printf(",\"params\":");
        ks_cli_put_json_string(stdout, cp->params.ptr, cp->params.len);
        fputc(',', stdout);
        ks_cli_put_progress_json(cp);
        printf(",\"started\":\"%s\",\"updated\":\"%s\",\"finished\":", started, updated);
        printf(cp->finished ? "\"%s\"" : "null", finished);
        return;
    }
    /* text read back from the database: printed with non-printable bytes as '?' */
    printf("%-12s ", "target");
    ks_cli_put_value(stdout, &(ks_value){KS_VALUE_TEXT, 0, tbl}, 0);
    fputc('.', stdout);
    ks_cli_put_value(stdout, &(ks_value){KS_VALUE_TEXT, 0, col}, 0);
    printf("\n%-12s ", "migration");
    ks_cli_put_value(stdout, &(ks_value){KS_VALUE_TEXT, 0, cp->params}, 0);
    printf("\n%-12s ", "state");
    ks_cli_put_value(stdout, &(ks_value){KS_VALUE_TEXT, 0, cp->state}, 0);
    printf("\n%-12s %u\n%-12s ", "pass", cp->pass, "cursor");
    ks_cli_put_value(stdout, &cp->cursor, 0);
    printf("\n%-12s %llu\n%-12s %llu\n%-12s %llu\n%-12s %llu\n%-12s %llu\n%-12s %s\n%-12s %s\n"
           "%-12s %s\n",
           "rewritten", (unsigned long long)cp->done, "at-target", (unsigned long long)cp->skipped,
           "raced", (unsigned long long)cp->raced, "quarantined",
           (unsigned long long)cp->quarantined, "wrong-state", (unsigned long long)cp->wrong_state,
           "started", started, "updated", updated, "finished", cp->finished ? finished : "-");
}

/* What list_checkpoints keeps while printing. */
typedef struct list_state {
    int json;
    int n;
    const char *db;        /* PostgreSQL: each checkpoint's chunks too; SQLite: NULL */
    const char *id_column; /* --id-column */
    int all_chunks;        /* --chunks */
} list_state;

/* Print one listed checkpoint (ks_checkpoint_list_fn). */
static int print_listed(void *arg, ks_bytes tbl, ks_bytes col, const ks_checkpoint *cp)
{
    list_state *l = arg;
    if (l->json) {
        fputs(l->n ? "," : "{\"migrations\":[", stdout);
    } else if (l->n) {
        fputc('\n', stdout);
    }
    print_checkpoint(tbl, col, cp, l->json);
    if (l->db != NULL) {
        ks_cli_chunks_print(l->db, tbl, col, cp->params, l->id_column, l->json, l->all_chunks);
    }
    if (l->json) {
        fputc('}', stdout);
    }
    l->n++;
    return 0;
}

/*
 * Print every checkpoint of db (or of o's table.column), most recently
 * updated first, read-only, through the store's listing (which checks
 * each row; SQLite or PostgreSQL, ks_cli_checkpoints); on PostgreSQL
 * each with its chunks, if it ran with workers (ks_cli_chunks_print).  A
 * database without keyshift's tables has had no migration.
 */
static int list_checkpoints(const char *db, const ks_cli_mig_opts *o)
{
    const char *table = o->table, *column = o->column;
    int json = o->json;
    list_state l = {json, 0, ks_cli_db_is_pg(db) ? db : NULL, o->id_column, o->chunks};
    char msg[256];
    ks_err err = ks_cli_checkpoints(db, table, column, print_listed, &l, msg, sizeof msg);
    if (err != KS_OK) {
        if (json && l.n) {
            printf("]}\n"); /* keep stdout well-formed; the error goes to stderr */
        }
        ks_cli_error("cannot read the checkpoints of %s: %s", db, msg[0] ? msg : ks_err_name(err));
        return ks_cli_exit_code(err);
    }
    if (json) {
        printf(l.n ? "]}\n" : "{\"migrations\":[]}\n");
    } else if (l.n == 0) {
        printf("no migration has run on %s\n", db);
    }
    return EX_OK;
}

/* `migrate status`. */
static int cmd_status(int argc, char **argv)
{
    static const char cmd[] = "migrate status";
    ks_cli_mig_opts o;
    memset(&o, 0, sizeof o);
    int rc;
    if (ks_cli_mig_parse(cmd, argc, argv, &o, &rc)) {
        return rc;
    }
    if ((rc = ks_cli_mig_only_options(cmd, &o, " --id-column --chunks ")) != EX_OK) {
        return rc;
    }
    if (o.db == NULL) {
        return ks_cli_usage_error(cmd, "--db is required");
    }
    if ((o.table == NULL) != (o.column == NULL)) {
        return ks_cli_usage_error(cmd, "give --table and --column together");
    }
    if ((rc = ks_cli_db_check(o.db, NULL)) != EX_OK) {
        return rc;
    }
    ks_rowstore store;
    if (o.table != NULL) { /* check the target exists */
        ks_rowstore_target t = {.table = o.table, .column = o.column, .id_column = o.id_column};
        if ((rc = ks_cli_store_open(o.db, &t, 1, 0, KS_SQLITE_SYNC_FULL, &store)) != EX_OK) {
            return rc;
        }
        ks_rowstore_close(&store);
    }
    return list_checkpoints(o.db, &o);
}


/* `migrate pause` (paused nonzero) and `migrate resume`: set or clear
 * the column's flag, which every run over it (on any host) checks after
 * each batch. */
static int cmd_pause(int argc, char **argv, int paused)
{
    const char *cmd = paused ? "migrate pause" : "migrate resume";
    ks_cli_mig_opts o;
    memset(&o, 0, sizeof o);
    int rc, pg = 0;
    if (ks_cli_mig_parse(cmd, argc, argv, &o, &rc)) {
        return rc;
    }
    if ((rc = ks_cli_mig_only_options(cmd, &o, paused ? " --reason " : " ")) != EX_OK) {
        return rc;
    }
    if (o.db == NULL || o.table == NULL || o.column == NULL) {
        return ks_cli_usage_error(cmd, "--db, --table and --column are required");
    }
    if ((rc = ks_cli_db_check(o.db, &pg)) != EX_OK) {
        return rc;
    }
    if (!pg) {
        return ks_cli_usage_error(cmd, "a PostgreSQL --db only (stop a SQLite run with SIGINT)");
    }
    rc = ks_cli_pause_set(o.db, o.table, o.column, paused, o.reason);
    if (rc == EX_OK && !o.json) {
        fprintf(stderr, KS_PROG " %s: %s.%s %s\n", cmd, o.table, o.column,
                paused ? "paused: every run over it waits after its current batch"
                       : "resumed");
    }
    return rc;
}


/* See cli.h. */
int ks_cmd_migrate(int argc, char **argv)
{
    int rc;
    if (ks_cli_subcommand_help(argc, argv, usage, &rc)) {
        return rc;
    }
    if (strcmp(argv[1], "run") == 0) {
        return ks_cli_migrate_run(argc - 1, argv + 1);
    }
    if (strcmp(argv[1], "status") == 0) {
        return cmd_status(argc - 1, argv + 1);
    }
    if (strcmp(argv[1], "verify") == 0) {
        return ks_cli_migrate_verify(argc - 1, argv + 1);
    }
    if (strcmp(argv[1], "pause") == 0 || strcmp(argv[1], "resume") == 0) {
        return cmd_pause(argc - 1, argv + 1, strcmp(argv[1], "pause") == 0);
    }
    if (strcmp(argv[1], "quarantine") == 0) {
        return ks_cli_migrate_quarantine(argc - 1, argv + 1);
    }
    return ks_cli_usage_error("migrate", "no such subcommand '%s' (run, status, verify, "
                                         "quarantine, pause or resume)", argv[1]);
}
