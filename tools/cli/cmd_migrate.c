/*
 * tools/cli/cmd_migrate.c -- `keyshift migrate run|status|verify`: encrypt,
 * rewrap or re-encrypt one column of a live SQLite or PostgreSQL database
 * in short, resumable, verified batches (docs/migration.md).
 *
 * The engine (ks_migrate_run) does the work; this file parses options,
 * opens the store and the keyring, reports progress (a bar on a terminal,
 * JSON lines with --json), turns SIGINT/SIGTERM into a clean pause after
 * the current batch, and maps each outcome to a sysexits code with a
 * message saying what state the data is in and what to do.  No output
 * ever carries plaintext or key material: only counts, row ids, key ids
 * and error names.
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
#include "cmd_migrate_textfile.h"
#include "cmd_migrate_workers.h"
#include "throttle.h"

/* Set by SIGINT/SIGTERM; the engine polls it between batches. */
static volatile sig_atomic_t stop_requested;

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

/* Every option of the three subcommands (each checks which it accepts). */
typedef struct mig_opts {
    const char *db, *table, *column, *id_column, *mode, *to_key, *to_format, *algorithm;
    const char *tenant_column, *tenant, *context, *purpose, *batch_size, *max_failure_rate;
    const char *max_rps, *busy_timeout, *sample, *keyring, *passfile, *from_key, *providers;
    const char *synchronous, *throttle_query, *max_replica_lag, *reason;
    const char *workers, *chunk_ids, *lease; /* run --workers (cmd_migrate_workers.c) */
    const char *batch_target, *batch_max;
    const char *encoding; /* --encoding: run, verify, quarantine */
    const char *textfile; /* run --textfile DIR */
    const char *id, *error; /* quarantine release --id, --error */
    int no_verify, serial, json, supersede;
    int all; /* quarantine release --all */
    int chunks; /* status --chunks */
} mig_opts;

/* Parse argv into o. */
static int parse(const char *cmd, int argc, char **argv, mig_opts *o, int *rc)
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

/* Refuse options a subcommand does not take (names listed in `allowed`). */
static int only_options(const char *cmd, const mig_opts *o, const char *allowed)
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

/* A ks_bytes view of a C string (NULL gives the empty view). */
static ks_bytes str_view(const char *s)
{
    return s == NULL ? (ks_bytes){NULL, 0} : (ks_bytes){(const uint8_t *)s, strlen(s)};
}

/* Split KEY_ID[:VERSION]: a trailing ':<digits>' is the version. */
static int parse_to_key(const char *cmd, const char *s, ks_migrate_params *p)
{
    const char *colon = strrchr(s, ':');
    size_t v = 0;
    if (colon != NULL && colon[1] != '\0' && strspn(colon + 1, "0123456789") == strlen(colon + 1)) {
        if (ks_cli_parse_size(colon + 1, 1, UINT32_MAX, &v) != 0) {
            return ks_cli_usage_error(cmd, "--to-key: the version must be a number from 1");
        }
        p->to_key_id = (ks_bytes){(const uint8_t *)s, (size_t)(colon - s)};
    } else {
        p->to_key_id = str_view(s);
    }
    if (p->to_key_id.len == 0 || p->to_key_id.len > KS_KEY_ID_MAX) {
        return ks_cli_usage_error(cmd, "--to-key: a key id of 1..%d bytes is required", KS_KEY_ID_MAX);
    }
    p->to_key_version = (uint32_t)v;
    return EX_OK;
}

/* Parse a fraction in [0, 1]. */
static int parse_rate(const char *s, double *out)
{
    char *end;
    errno = 0;
    double d = strtod(s, &end);
    if (errno != 0 || end == s || *end != '\0' || !(d >= 0.0 && d <= 1.0)) {
        return -1;
    }
    *out = d;
    return 0;
}

/* Fill the options shared by run and verify: tenant, context, purpose and
 * the target (with the template's columns, stored in names). */
static int common_params(const char *cmd, const mig_opts *o, ks_migrate_params *p,
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
    p->tenant = str_view(o->tenant);
    p->purpose = str_view(o->purpose);
    p->context_template = str_view(o->context);
    p->from_key_id = str_view(o->from_key);
    if (o->from_key != NULL && (p->from_key_id.len == 0 || p->from_key_id.len > KS_KEY_ID_MAX)) {
        return ks_cli_usage_error(cmd, "--from-key: a key id of 1..%d bytes is required",
                                  KS_KEY_ID_MAX);
    }
    return EX_OK;
}

/* Parse the mode and the target key and format of `migrate run`. */
static int run_target(const mig_opts *o, ks_migrate_params *p)
{
    static const char cmd[] = "migrate run";
    if (o->mode == NULL || o->to_key == NULL) {
        return ks_cli_usage_error(cmd, "--mode and --to-key are required");
    }
    if (strcmp(o->mode, "encrypt") == 0) {
        p->mode = KS_MIGRATE_ENCRYPT;
    } else if (strcmp(o->mode, "rewrap") == 0) {
        p->mode = KS_MIGRATE_REWRAP;
    } else if (strcmp(o->mode, "reencrypt") == 0) {
        p->mode = KS_MIGRATE_REENCRYPT;
    } else {
        return ks_cli_usage_error(cmd, "--mode must be encrypt, rewrap or reencrypt");
    }
    if (p->mode == KS_MIGRATE_REWRAP && (o->to_format != NULL || o->algorithm != NULL)) {
        return ks_cli_usage_error(cmd, "rewrap keeps the format and algorithm: "
                                       "use --mode reencrypt to change them");
    }
    if (o->to_format != NULL && strcmp(o->to_format, "1") != 0 && strcmp(o->to_format, "2") != 0) {
        return ks_cli_usage_error(cmd, "--to-format must be 1 or 2");
    }
    p->to_format = o->to_format != NULL && o->to_format[0] == '1' ? KS_FORMAT_V1 : KS_FORMAT_V2;
    p->algorithm = o->algorithm != NULL ? ks_alg_from_name(o->algorithm) : KS_ALG_XCHACHA20POLY1305;
    if (p->algorithm == 0) {
        return ks_cli_usage_error(cmd, "--algorithm must be xchacha20-poly1305 or aes-256-gcm");
    }
    if (p->mode == KS_MIGRATE_ENCRYPT && o->from_key != NULL) {
        return ks_cli_usage_error(cmd, "--from-key selects envelopes; encrypt reads plaintext");
    }
    if (p->mode == KS_MIGRATE_ENCRYPT && o->tenant == NULL && o->tenant_column == NULL) {
        return ks_cli_usage_error(cmd, "encrypt needs --tenant or --tenant-column");
    }
    if (p->mode == KS_MIGRATE_ENCRYPT && p->to_format == KS_FORMAT_V1 && o->purpose != NULL) {
        return ks_cli_usage_error(cmd, "--purpose needs --to-format 2");
    }
    if (p->mode == KS_MIGRATE_ENCRYPT && p->to_format == KS_FORMAT_V2 && o->purpose == NULL) {
        p->purpose = str_view("default"); /* as `keyshift encrypt` */
    }
    return parse_to_key(cmd, o->to_key, p);
}

/* Parse the pacing, locking and durability options of `migrate run`. */
static int run_limits(const mig_opts *o, ks_migrate_params *p, uint32_t *busy_ms,
                      ks_sqlite_sync *sync)
{
    static const char cmd[] = "migrate run";
    size_t v;
    p->batch_size = 500;
    p->max_failure_rate = 0.001;
    if (o->batch_size != NULL) {
        if (ks_cli_parse_size(o->batch_size, 1, 100000, &v) != 0) {
            return ks_cli_usage_error(cmd, "--batch-size must be a number from 1 to 100000");
        }
        p->batch_size = v;
    }
    if (o->batch_target != NULL &&
        (ks_cli_parse_duration_ms(o->batch_target, &p->batch_target_ms) != 0 ||
         p->batch_target_ms > KS_MIGRATE_BATCH_TARGET_MAX_MS)) {
        return ks_cli_usage_error(cmd, "--batch-target must be a duration up to 1h (e.g. 500ms)");
    }
    if (o->batch_max != NULL) {
        if (o->batch_target == NULL || ks_cli_parse_size(o->batch_max, 10, 100000, &v) != 0) {
            return ks_cli_usage_error(cmd, "--batch-max must be a number from 10 to 100000, "
                                           "with --batch-target");
        }
        p->batch_max = v;
    }
    if (o->max_failure_rate != NULL && parse_rate(o->max_failure_rate, &p->max_failure_rate) != 0) {
        return ks_cli_usage_error(cmd, "--max-failure-rate must be a number from 0 to 1");
    }
    if (o->max_rps != NULL) {
        if (ks_cli_parse_size(o->max_rps, 1, UINT32_MAX, &v) != 0) {
            return ks_cli_usage_error(cmd, "--max-rows-per-second must be a number from 1");
        }
        p->max_rows_per_second = (uint32_t)v;
    }
    *busy_ms = 30000;
    if (o->busy_timeout != NULL) {
        if (ks_cli_parse_size(o->busy_timeout, 0, 86400000, &v) != 0) {
            return ks_cli_usage_error(cmd, "--busy-timeout must be milliseconds (0..86400000)");
        }
        *busy_ms = (uint32_t)v;
    }
    *sync = KS_SQLITE_SYNC_FULL;
    if (o->synchronous != NULL && ks_cli_parse_synchronous(cmd, o->synchronous, sync) != EX_OK) {
        return EX_USAGE;
    }
    p->no_verify = o->no_verify;
    p->serial = o->serial;
    return EX_OK;
}

/* Set stop_requested; async-signal-safe. */
static void on_signal(int sig)
{
    (void)sig;
    stop_requested = 1;
}

/* Install the SIGINT/SIGTERM handlers that pause a run after its batch. */
static void install_signals(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

/* The counts of a checkpoint, copied out of the store's views. */
typedef struct counts {
    uint64_t done, skipped, raced, quarantined, wrong_state;
    uint32_t pass;
} counts;

/* What the progress callback keeps between batches. */
typedef struct progress_state {
    int json, tty;
    uint64_t batches, total;
    uint64_t run_rows; /* rows of the batches committed by this invocation */
    double elapsed, last_draw;
    int have;
    counts c;              /* the migration's counts (the checkpoint's, every run's) */
    ks_migrate_counts run; /* this run's own (the summary's) */
    /* health samples for the rollout in backfill (0: none) */
    int64_t rollout_id;
    const char *db;
    ks_ctx *ctx;
    ks_health_sample reported;
    double last_report;
    ks_cli_throttle *throttle; /* PostgreSQL's pauses between batches (tools/cli/throttle.h) */
    ks_cli_mig_textfile textfile; /* --textfile */
    int64_t last_progress_time;
} progress_state;

/* Seconds of the run spent working: elapsed less the time throttled,
 * which the rate and the ETA leave out. */
static double working_s(const progress_state *s, double elapsed)
{
    double w = elapsed - (s->throttle != NULL ? s->throttle->throttled_s : 0);
    return w > 0 ? w : 0;
}

/* Copy the counts of cp. */
static counts counts_of(const ks_checkpoint *cp)
{
    return (counts){cp->done, cp->skipped, cp->raced, cp->quarantined, cp->wrong_state, cp->pass};
}

/* Rows looked at so far, whatever became of them. */
static uint64_t processed(const counts *c)
{
    return c->done + c->skipped + c->quarantined + c->wrong_state;
}

/* Draw the progress bar on standard error (a terminal). */
static void draw_bar(const progress_state *s)
{
    uint64_t n = processed(&s->c);
    double work = working_s(s, s->elapsed);
    double rate = work > 0 ? (double)s->run_rows / work : 0.0;
    double eta = rate > 0 && n < s->total ? (double)(s->total - n) / rate : -1;
    ks_cli_draw_bar(n, s->total, rate, eta, "");
}

/* See cmd_migrate_workers.h. */
void ks_cli_draw_bar(uint64_t n, uint64_t total, double rate, double eta_s, const char *extra)
{
    double frac = total ? (double)n / (double)total : 1.0;
    frac = frac > 1.0 ? 1.0 : frac;
    char bar[31];
    int fill = (int)(frac * 30.0);
    for (int i = 0; i < 30; i++) {
        bar[i] = i < fill ? '#' : '.';
    }
    bar[30] = '\0';
    fprintf(stderr, "\r[%s] %3d%% %llu/%llu rows  %.0f rows/s", bar, (int)(frac * 100.0),
            (unsigned long long)n, (unsigned long long)total, rate);
    if (eta_s >= 0) {
        fprintf(stderr, "  ETA %.0fs%s   ", eta_s, extra);
    } else {
        fprintf(stderr, "%s            ", extra);
    }
    fflush(stderr);
}

/* The seconds between two health samples of a run (and one at its end). */
#define REPORT_EVERY_S 5.0

/*
 * Write this run's health sample (source "migrate", docs/rollout.md) for
 * the rollout in backfill: the growth of the context's totals since the
 * previous sample.  They are the migration's own figures: `rollout
 * status` and `metrics` show them apart, and the guards and `rollout
 * check` never judge them (an operator's wrong --context is not the
 * applications' health).  Best effort: a failure is said once on
 * standard error and the run goes on (the sample is carried into the
 * next one).
 */
static void report_health(progress_state *s)
{
    if (s->rollout_id == 0) {
        return;
    }
    ks_health_sample totals, d;
    ks_ctx_health_sample(s->ctx, &totals);
    ks_health_growth(&d, &totals, &s->reported);
    d.time = (int64_t)time(NULL);
    char instance[KS_INSTANCE_ID_MAX + 1], host[64];
    ks_cli_hostname(host, sizeof host);
    for (char *c = host; *c != '\0'; c++) { /* an instance id is [F-NAME-1] */
        if (!isalnum((unsigned char)*c) && *c != '.' && *c != '-' && *c != '_') {
            *c = '-';
        }
    }
    snprintf(instance, sizeof instance, "migrate.%s.%ld", host, (long)getpid());
    ks_rollout_db *db = NULL;
    ks_err e = KS_ERR_STORE;
    if (ks_cli_rollout_open(s->db, 0, &db) == EX_OK) {
        e = ks_rollout_db_metrics_insert(db, s->rollout_id, instance, "migrate", &d);
        ks_rollout_db_close(db);
    }
    if (e == KS_OK) {
        s->reported = totals;
    } else if (s->rollout_id > 0) {
        ks_cli_error("warning: cannot write this run's health sample to rollout %lld: %s",
                     (long long)s->rollout_id, ks_err_name(e));
        s->rollout_id = -s->rollout_id; /* said once; stop trying */
    }
}

/* Write the run's progress to --textfile (running or not, complete or
 * not): the migration's counts, every run's. */
static void write_textfile(progress_state *s, int running, int complete)
{
    ks_metrics_migrate m = {NULL,
                            {s->c.done, s->c.skipped, s->c.raced, s->c.quarantined,
                             s->c.wrong_state},
                            s->total,
                            s->throttle != NULL ? s->throttle->throttled_s : 0.0,
                            s->last_progress_time,
                            running,
                            complete};
    ks_cli_mig_textfile_write(&s->textfile, &m);
}

/* The engine's per-batch report: a JSON line or a bar redraw, and a
 * health sample every REPORT_EVERY_S seconds. */
static void on_progress(void *arg, const ks_migrate_progress *p)
{
    progress_state *s = arg;
    if (s->rollout_id > 0 && p->elapsed_s - s->last_report >= REPORT_EVERY_S) {
        s->last_report = p->elapsed_s;
        report_health(s);
    }
    s->batches++;
    s->run_rows += p->batch_rows;
    s->total = p->total_rows;
    s->elapsed = p->elapsed_s;
    s->c = counts_of(p->checkpoint);
    s->run = p->run;
    s->have = 1;
    s->last_progress_time = (int64_t)time(NULL);
    if (ks_cli_mig_textfile_due(&s->textfile, p->elapsed_s)) {
        write_textfile(s, 1, 0);
    }
    if (s->json) {
        double work = working_s(s, p->elapsed_s);
        double rate = work > 0 ? (double)s->run_rows / work : 0.0;
        printf("{\"batch\":%llu,\"batch_rows\":%llu,\"pass\":%u,\"done\":%llu,\"skipped\":%llu,\"raced\":%llu,"
               "\"quarantined\":%llu,\"wrong_state\":%llu,\"total\":%llu,\"rows_per_s\":%.1f,"
               "\"throttled_s\":%.1f}\n",
               (unsigned long long)s->batches, (unsigned long long)p->batch_rows, s->c.pass, (unsigned long long)s->c.done,
               (unsigned long long)s->c.skipped, (unsigned long long)s->c.raced,
               (unsigned long long)s->c.quarantined, (unsigned long long)s->c.wrong_state,
               (unsigned long long)s->total, rate, p->elapsed_s - work);
        fflush(stdout);
    } else if (s->tty && (p->elapsed_s - s->last_draw >= 0.1 || s->batches == 1)) {
        s->last_draw = p->elapsed_s;
        draw_bar(s);
    }
    /* between batches: the batch is committed, no row lock is held */
    if (s->throttle != NULL) {
        ks_cli_throttle_wait(s->throttle, &stop_requested, s->json);
    }
}

/* See cmd_migrate_workers.h. */
const char *ks_cli_migrate_advice(ks_err e, int pg, int rollout_left)
{
    if (e == KS_ERR_STOPPED && rollout_left) {
        return "the rollout left backfill (rolled back?); the batch was not written and the "
               "checkpoint kept: run the same command again once it is back in backfill";
    }
    if (e == KS_ERR_UNAVAILABLE && pg) {
        return "the database went away (server stopped or connection lost) or the key "
               "provider is unavailable; the batch was rolled back and the checkpoint "
               "kept: run the same command again once both are back";
    }
    switch (e) {
    case KS_OK: return "complete";
    case KS_ERR_STOPPED:
        return "paused after the last committed batch; run the same command again to resume";
    case KS_ERR_BUSY:
        return "the database stayed locked past --busy-timeout (PostgreSQL: or a statement ran "
               "past statement_timeout, or a deadlock); the batch was rolled back and "
               "the checkpoint kept: run the same command again to resume";
    case KS_ERR_TIMEOUT:
        return "the key provider timed out; the batch was rolled back and the checkpoint kept: "
               "run the same command again to resume";
    case KS_ERR_UNAVAILABLE:
        return "the key provider is unavailable; the batch was rolled back and the checkpoint "
               "kept: run the same command again once it is back";
    case KS_ERR_THRESHOLD:
        return "stopped: too many rows failed and were quarantined (see the keyshift_quarantine "
               "table); committed batches stand. Investigate, then rerun (raise "
               "--max-failure-rate only if the failures are understood)";
    case KS_ERR_MISMATCH:
        return "an unfinished migration of this column with other parameters exists (see "
               "'keyshift migrate status'); nothing was written. Finish it by running it again "
               "with its own parameters, or, if it was the mistake (a wrong --context, "
               "--purpose or tenant), give --supersede to run this one instead: the rows it "
               "quarantined are tried again under the new parameters";
    case KS_ERR_VERIFY_FAILED:
        return "verify-before-commit found a new value that does not open to the old "
               "plaintext: a bug or faulty hardware, not bad data. Nothing of that batch was "
               "written and earlier batches stand (each was verified); do not rerun: report "
               "it as a bug, with the command and 'keyshift version'";
    case KS_ERR_FULL:
        return "the database or its disk is full; the batch was rolled back and the checkpoint "
               "kept: free space, then run the same command again to resume";
    case KS_ERR_STORE:
        return "database error; the batch was rolled back and the checkpoint kept: fix the "
               "cause, then run the same command again to resume";
    case KS_ERR_NOT_FOUND: return "the target key or version does not exist (in the keyring, or in the provider "
                                   "serving it)";
    case KS_ERR_DENIED:
        return "the target key version may not wrap (disabled or decrypt-only); promote an "
               "active version or pick another";
    case KS_ERR_REVOKED: return "the target key version was destroyed";
    default: return NULL;
    }
}

/* The advice when a run stopped on its failure threshold and most rows
 * of its first batch failed "auth-failed": the run's parameters, not the
 * data, are the likely cause. */
static const char *auth_failed_advice(const ks_migrate_counts *run)
{
    if (run->first_batch_rows == 0 || run->first_batch_auth_failed * 2 <= run->first_batch_rows) {
        return NULL;
    }
    return "stopped: most rows of the first batch failed with auth-failed. The likely cause is "
           "a --context, --purpose or tenant (--tenant, --tenant-column) that differs from the "
           "one the values were encrypted with; compare with the application's. Committed "
           "batches stand and nothing was modified. Run the corrected command with "
           "--supersede: the rows this run quarantined are tried again under the new "
           "parameters ('keyshift migrate quarantine list' shows them)";
}

/* Print the final summary of what this run did (s->run): a JSON object
 * on stdout, or a line on stderr; the migration's totals too when other
 * runs added to them. */
static void print_summary(const progress_state *s, ks_err e, int rc, double elapsed)
{
    const counts *m = &s->c;
    counts mine = {s->run.done, s->run.skipped, s->run.raced, s->run.quarantined,
                   s->run.wrong_state, m->pass};
    const counts *c = &mine;
    int others = m->done != c->done || m->skipped != c->skipped || m->raced != c->raced ||
                 m->quarantined != c->quarantined || m->wrong_state != c->wrong_state;
    double work = working_s(s, elapsed);
    double rate = work > 0 ? (double)s->run_rows / work : 0.0;
    double throttled = elapsed - work;
    int idle = c->done + c->skipped + c->raced + c->quarantined + c->wrong_state == 0;
    const char *result = e == KS_OK ? (idle ? "already complete, nothing to do" : "complete")
                         : rc == EX_TEMPFAIL ? "paused" : "failed";
    if (s->tty && !s->json && s->have) {
        fputc('\n', stderr);
    }
    if (s->json) {
        result = e == KS_OK ? "complete" : rc == EX_TEMPFAIL ? "paused" : "failed";
        printf("{\"result\":\"%s\",\"error\":\"%s\",\"exit\":%d,\"pass\":%u,\"done\":%llu,"
               "\"skipped\":%llu,\"raced\":%llu,\"quarantined\":%llu,\"wrong_state\":%llu,"
               "\"total\":%llu,\"elapsed_s\":%.3f,\"rows_per_s\":%.1f,\"throttled_s\":%.3f,"
               "\"migration\":{\"done\":%llu,\"skipped\":%llu,\"raced\":%llu,"
               "\"quarantined\":%llu,\"wrong_state\":%llu}}\n",
               result, ks_err_name(e), rc, c->pass, (unsigned long long)c->done,
               (unsigned long long)c->skipped, (unsigned long long)c->raced,
               (unsigned long long)c->quarantined, (unsigned long long)c->wrong_state,
               (unsigned long long)s->total, elapsed, rate, throttled,
               (unsigned long long)m->done, (unsigned long long)m->skipped,
               (unsigned long long)m->raced, (unsigned long long)m->quarantined,
               (unsigned long long)m->wrong_state);
        return;
    }
    if (s->throttle != NULL && s->throttle->pauses > 0) {
        fprintf(stderr, KS_PROG " migrate: throttled %.1f s in %u pauses (left out of the rate)\n",
                throttled, s->throttle->pauses);
    }
    fprintf(stderr,
            KS_PROG " migrate: %s: %llu rewritten, %llu already at target, %llu raced, "
            "%llu quarantined, %llu in the wrong state; pass %u, %.1f s, %.0f rows/s\n",
            result, (unsigned long long)c->done, (unsigned long long)c->skipped,
            (unsigned long long)c->raced, (unsigned long long)c->quarantined,
            (unsigned long long)c->wrong_state, c->pass, elapsed, rate);
    if (others) {
        fprintf(stderr,
                KS_PROG " migrate: the migration so far, every run: %llu rewritten, %llu already "
                "at target, %llu raced, %llu quarantined, %llu in the wrong state\n",
                (unsigned long long)m->done, (unsigned long long)m->skipped,
                (unsigned long long)m->raced, (unsigned long long)m->quarantined,
                (unsigned long long)m->wrong_state);
    }
}

/* Run the engine with progress and signals, then report its outcome
 * (pg: the store is PostgreSQL, whose lost connection is
 * KS_ERR_UNAVAILABLE too). */
static int run_engine(ks_ctx *ctx, const ks_rowstore *store, const ks_migrate_params *p,
                      const mig_opts *o, int64_t rollout_id, int pg, ks_cli_throttle *throttle)
{
    progress_state s;
    memset(&s, 0, sizeof s);
    s.throttle = throttle;
    s.rollout_id = rollout_id;
    s.db = o->db;
    s.ctx = ctx;
    s.json = o->json;
    s.tty = isatty(STDERR_FILENO);
    s.textfile = (ks_cli_mig_textfile){o->textfile, o->table, o->column, rollout_id, 0, 0};
    s.last_progress_time = (int64_t)time(NULL);
    ks_checkpoint cp;
    memset(&cp, 0, sizeof cp);
    install_signals();
    double t0 = ks_cli_mono_s();
    ks_err e = ks_migrate_run(ctx, store, p, &stop_requested, on_progress, &s, &cp);
    double elapsed = ks_cli_mono_s() - t0;
    if (s.rollout_id > 0) {
        report_health(&s);
    }
    if (cp.state.ptr != NULL || cp.pass != 0) {
        s.c = counts_of(&cp);
        s.have = 1;
    }
    if (s.have) { /* the counts are known: never write zeros over a resumed migration's */
        write_textfile(&s, 0, e == KS_OK);
    }
    int rc = e == KS_ERR_STOPPED ? EX_TEMPFAIL : ks_cli_exit_code(e);
    if (e != KS_OK) {
        const char *advice = e == KS_ERR_THRESHOLD ? auth_failed_advice(&s.run) : NULL;
        advice = advice != NULL ? advice
                                : ks_cli_migrate_advice(e, pg, rollout_id != 0 && !stop_requested);
        if (s.tty && !s.json && s.have) {
            fputc('\n', stderr);
            s.have = 0;
        }
        ks_cli_error("migrate %s %s.%s: %s (%s)", ks_migrate_mode_name(p->mode), o->table,
                     o->column, advice != NULL ? advice : "failed", ks_err_name(e));
    }
    print_summary(&s, e, rc, elapsed);
    return rc;
}

/* Every rollout of o's database whose scope covers o's column (a
 * malloc'd array the caller frees), read read-only so that a database
 * without rollouts is not changed: EX_OK, or an exit code after a
 * message. */
static int covering_rollouts(const mig_opts *o, ks_rollout **rs, size_t *n)
{
    ks_rollout_db *db;
    int rc = ks_cli_rollout_open(o->db, 1, &db);
    if (rc != EX_OK) {
        return rc;
    }
    rc = ks_cli_rollouts_all(db, o->db, rs, n);
    ks_rollout_db_close(db);
    size_t kept = 0;
    for (size_t i = 0; rc == EX_OK && i < *n; i++) {
        if (ks_rollout_scope_covers(&(*rs)[i], o->table, o->column)) {
            (*rs)[kept++] = (*rs)[i];
        }
    }
    *n = kept;
    return rc;
}

/* Refuse (exit 64) a run or verify of o's column whose encoding differs
 * from the one recorded with a rollout that is not finalized and covers
 * the column: its census, its policy and its applications read the
 * column in the rollout's form, and a run in another would write, or
 * judge, values of two forms. */
static int check_rollout_encoding(const char *cmd, const mig_opts *o, ks_value_encoding enc)
{
    ks_rollout *rs = NULL;
    size_t n = 0;
    int rc = covering_rollouts(o, &rs, &n);
    for (size_t i = 0; rc == EX_OK && i < n; i++) {
        const ks_rollout *r = &rs[i];
        if (r->phase != KS_PHASE_FINALIZED && r->encoding != enc) {
            const char *want = ks_value_encoding_name((int)r->encoding);
            rc = ks_cli_usage_error(cmd, "rollout %lld records %s.%s as of %s encoding; this "
                                    "run's is %s: give --encoding %s",
                                    (long long)r->id, o->table, o->column, want,
                                    ks_value_encoding_name((int)enc), want);
        }
    }
    free(rs);
    return rc;
}

/* The rollout governing what a run toward key_id writes into o's column
 * (ks_rollout_scope_find: the column's own latest rollout, or a later
 * key-scoped one of key_id covering it) into *r, *found 1.  EX_CONFIG
 * after a message when another key-scoped rollout that is not finalized
 * covers the column: the run would convert that rollout's envelopes out
 * of its scope under its feet.  EX_OK with *found 0 when none governs. */
static int governing_rollout(const mig_opts *o, const char *key_id, ks_rollout *r, int *found)
{
    ks_rollout *rs = NULL;
    size_t n = 0;
    *found = 0;
    int rc = covering_rollouts(o, &rs, &n);
    const ks_rollout *g = rc == EX_OK ? ks_rollout_scope_find(rs, n, o->table, o->column, key_id)
                                      : NULL;
    for (size_t i = 0; rc == EX_OK && i < n; i++) {
        const ks_rollout *k = &rs[i];
        if (k != g && k->scope == KS_SCOPE_KEY && k->phase != KS_PHASE_FINALIZED) {
            ks_cli_error("rollout %lld (key %s, %s) covers %s.%s: migrate runs on it only toward "
                         "that rollout's target, in backfill (--to-key %s:%u)",
                         (long long)k->id, k->source.key_id,
                         ks_rollout_phase_name((int)k->phase), o->table, o->column,
                         k->target.key_id, (unsigned)k->target.key_version);
            rc = EX_CONFIG;
        }
    }
    if (rc == EX_OK && g != NULL) {
        *r = *g;
        *found = 1;
    }
    free(rs);
    return rc;
}

/* Under a key-scoped rollout r: confine the run to r's key_id
 * (p->from_key_id, a view of key, which the caller keeps), so that
 * plaintext and other keys' envelopes in the column (another tenant's
 * key, say) are never moved under r's key.  A --from-key naming another
 * key is refused. */
static int key_scope_filter(const ks_rollout *r, ks_migrate_params *p, char key[KS_KEY_ID_MAX + 1])
{
    if (r->scope != KS_SCOPE_KEY) {
        return EX_OK;
    }
    size_t n = strlen(r->source.key_id);
    if (p->from_key_id.len != 0 &&
        (p->from_key_id.len != n || memcmp(p->from_key_id.ptr, r->source.key_id, n) != 0)) {
        ks_cli_error("rollout %lld moves the envelopes of key %s; this run's --from-key is "
                     "%.*s: give --from-key %s, or leave it out", (long long)r->id,
                     r->source.key_id, (int)p->from_key_id.len,
                     (const char *)p->from_key_id.ptr, r->source.key_id);
        return EX_CONFIG;
    }
    assert(n <= KS_KEY_ID_MAX);
    memcpy(key, r->source.key_id, n + 1);
    p->from_key_id = (ks_bytes){(const uint8_t *)key, n};
    return EX_OK;
}

/* Refuse a run that the rollout governing the column does not allow:
 * outside backfill, or toward another target than the rollout's.  No
 * rollout (or no rollout tables): the run goes ahead as before.  A
 * key-scoped rollout confines the run to its key (key_scope_filter;
 * from_key holds the key).  The store is opened read-only, so a database
 * without rollouts is not changed. */
static int rollout_gate(const mig_opts *o, ks_migrate_params *p, ks_ctx *ctx, int64_t *rollout_id,
                        char from_key[KS_KEY_ID_MAX + 1])
{
    ks_rollout r;
    char key_id[KS_KEY_ID_MAX + 1];
    *rollout_id = 0;
    if (p->to_key_id.len == 0 || p->to_key_id.len > KS_KEY_ID_MAX) {
        return ks_cli_usage_error("migrate run", "the target key id is empty or too long");
    }
    memcpy(key_id, p->to_key_id.ptr, p->to_key_id.len);
    key_id[p->to_key_id.len] = '\0';
    int found, rc = governing_rollout(o, key_id, &r, &found);
    if (rc != EX_OK || !found) {
        return rc;
    }
    const char *phase = ks_rollout_phase_name((int)r.phase);
    if (r.phase != KS_PHASE_BACKFILL) {
        ks_cli_error("rollout %lld is in phase %s; migrate runs only in backfill: "
                     "keyshift rollout advance --db %s --rollout %lld", (long long)r.id, phase,
                     o->db, (long long)r.id);
        return EX_CONFIG;
    }
    uint32_t version = p->to_key_version;
    if (version == 0) { /* the primary, as the engine will resolve it */
        ks_key_info info;
        ks_err ke = ks_ctx_key_info(ctx, p->to_key_id, 0, &info);
        if (ke != KS_OK) {
            ks_cli_error("cannot resolve the primary of the target key: %s", ks_err_name(ke));
            return ks_cli_exit_code(ke);
        }
        version = info.version;
    }
    const ks_rollout_class *t = &r.target, *src = &r.source;
    int same_key = p->to_key_id.len == strlen(t->key_id) &&
                   memcmp(p->to_key_id.ptr, t->key_id, p->to_key_id.len) == 0 &&
                   version == t->key_version;
    int same_shape = p->mode == KS_MIGRATE_REWRAP ||
                     (p->to_format == t->version && p->algorithm == t->algorithm);
    if (!same_key || !same_shape) {
        char scope[256];
        ks_cli_error("rollout %lld moves %s to v%u:%s:%s:%u; this run targets %.*s:%u%s: give "
                     "the rollout's target (--to-key %s:%u --to-format %u --algorithm %s)",
                     (long long)r.id, ks_rollout_scope_text(&r, scope, sizeof scope),
                     (unsigned)t->version,
                     ks_alg_name(t->algorithm), t->key_id, (unsigned)t->key_version,
                     (int)p->to_key_id.len, (const char *)p->to_key_id.ptr, (unsigned)version,
                     same_shape ? "" : " in another format or algorithm", t->key_id,
                     (unsigned)t->key_version, (unsigned)t->version, ks_alg_name(t->algorithm));
        return EX_CONFIG;
    }
    if (p->mode == KS_MIGRATE_REWRAP &&
        (src->is_plaintext || src->version != t->version || src->algorithm != t->algorithm)) {
        ks_cli_error("rollout %lld changes %s; rewrap keeps each envelope's format and "
                     "algorithm: use --mode %s", (long long)r.id,
                     src->is_plaintext ? "plaintext into envelopes" : "the format or algorithm",
                     src->is_plaintext ? "encrypt" : "reencrypt");
        return EX_CONFIG;
    }
    int frc = key_scope_filter(&r, p, from_key);
    if (frc != EX_OK) {
        return frc;
    }
    p->supersede = 1; /* the rollout's target makes any other unfinished run obsolete */
    *rollout_id = r.id;
    return EX_OK;
}

/*
 * With a rollout in backfill governing the column: make every batch's
 * write transaction check, under the write lock, that the rollout is
 * still in backfill (ks_rowstore_sqlite_set_write_gate, or the PostgreSQL
 * store's with the row locked FOR SHARE).  A rollback
 * committed meanwhile then stops the run before its next batch is
 * written (KS_ERR_STOPPED, exit 75, resumable once the rollout is back in
 * backfill), so that no target row is written after, say, a rollback to
 * read-compat and on to planned counted none.  The id is ours, not data.
 */
int ks_cli_backfill_gate(const ks_rowstore *store, int64_t rollout_id, int pg)
{
    if (rollout_id <= 0) {
        return EX_OK;
    }
    char sql[128];
    ks_err e;
    if (pg) {
        /* FOR SHARE: a transition of the rollout waits for the batch's
         * commit, and the next batch sees it (rowstore_pg.h) */
        snprintf(sql, sizeof sql,
                 "SELECT phase = 'backfill' FROM keyshift_rollout WHERE id = %lld FOR SHARE",
                 (long long)rollout_id);
        e = ks_rowstore_pg_set_write_gate(store, sql);
    } else {
        snprintf(sql, sizeof sql,
                 "SELECT phase = 'backfill' FROM main.keyshift_rollout WHERE id = %lld",
                 (long long)rollout_id);
        e = ks_rowstore_sqlite_set_write_gate(store, sql);
    }
    if (e != KS_OK) {
        ks_cli_error("cannot watch rollout %lld during the run: %s", (long long)rollout_id,
                     ks_err_name(e));
        return ks_cli_exit_code(e);
    }
    return EX_OK;
}

/* A health sample of a run with workers (ks_cli_workers_env.health). */
static void workers_health(void *arg)
{
    report_health(arg);
}

/* Run o's migration with workers (cmd_migrate_workers.c) on PostgreSQL,
 * with this file's signals, rollout gate and health samples; the exit
 * code, or KS_CLI_WORKERS_CATCHUP for the caller's single-connection
 * catch-up pass. */
static int run_workers(ks_ctx *ctx, const ks_rowstore *store, const ks_migrate_params *p,
                       const mig_opts *o, const ks_rowstore_target *t, uint32_t busy_ms,
                       int64_t rollout_id, const ks_cli_workers *wo, ks_cli_throttle *throttle)
{
    progress_state s; /* for the health samples only */
    memset(&s, 0, sizeof s);
    s.rollout_id = rollout_id;
    s.db = o->db;
    s.ctx = ctx;
    ks_cli_mig_textfile tf = {o->textfile, o->table, o->column, rollout_id, 0, 0};
    ks_cli_workers_env env = {o->db,    t,         busy_ms,        o->json,
                              rollout_id, throttle, &stop_requested,
                              rollout_id > 0 ? workers_health : NULL, &s, &tf};
    install_signals();
    return ks_cli_workers_run(ctx, store, p, wo, &env);
}

/* `migrate run`. */
static int cmd_run(int argc, char **argv)
{
    static const char cmd[] = "migrate run";
    mig_opts o;
    memset(&o, 0, sizeof o);
    int rc;
    if (parse(cmd, argc, argv, &o, &rc)) {
        return rc;
    }
    if ((rc = only_options(cmd, &o, " --mode --to-key --to-format --algorithm --tenant-column "
                                    "--tenant --context --purpose --batch-size --max-failure-rate "
                                    "--max-rows-per-second --busy-timeout --synchronous --keyring "
                                    "--passphrase-file --providers --no-verify --id-column --serial --encoding "
                                    "--from-key --supersede --throttle-query --max-replica-lag "
                                    "--workers --chunk-ids --lease --batch-target --batch-max --textfile ")) != EX_OK) {
        return rc;
    }
    ks_migrate_params p;
    memset(&p, 0, sizeof p);
    ks_rowstore_target t;
    char names[KS_CONTEXT_TEMPLATE_MAX];
    uint32_t busy_ms;
    ks_sqlite_sync sync;
    if ((rc = common_params(cmd, &o, &p, &t, names)) != EX_OK || (rc = run_target(&o, &p)) != EX_OK ||
        (rc = run_limits(&o, &p, &busy_ms, &sync)) != EX_OK) {
        return rc;
    }
    p.supersede = o.supersede;
    int pg;
    if ((rc = ks_cli_db_check(o.db, &pg)) != EX_OK ||
        (rc = check_rollout_encoding(cmd, &o, p.encoding)) != EX_OK) {
        return rc;
    }
    if (pg && o.synchronous != NULL) {
        return ks_cli_usage_error(cmd, "--synchronous is a SQLite option; a PostgreSQL commit "
                                       "is as durable as the server's synchronous_commit");
    }
    if (!pg && (o.throttle_query != NULL || o.max_replica_lag != NULL)) {
        return ks_cli_usage_error(cmd, "--throttle-query and --max-replica-lag need a PostgreSQL "
                                       "--db (a SQLite run pauses on SIGINT and resumes)");
    }
    ks_cli_workers wo;
    if ((rc = ks_cli_workers_parse(o.workers, o.chunk_ids, o.lease, pg, &wo)) != EX_OK) {
        return rc;
    }
    ks_cli_throttle throttle;
    memset(&throttle, 0, sizeof throttle);
    ks_cli_keys keys = {0};
    ks_ctx *ctx = NULL;
    ks_rowstore store = {NULL, NULL, NULL, 0, KS_ENCODING_BINARY};
    int64_t rollout_id = 0;
    char from_key[KS_KEY_ID_MAX + 1];
    if ((rc = ks_cli_store_open(o.db, &t, 0, busy_ms, sync, &store)) == EX_OK &&
        (rc = ks_cli_check_context(cmd, &store, o.table, o.context)) == EX_OK &&
        (rc = ks_cli_ctx_open(cmd, o.keyring, o.passfile, o.providers, &keys, &ctx)) == EX_OK &&
        (rc = rollout_gate(&o, &p, ctx, &rollout_id, from_key)) == EX_OK &&
        (rc = ks_cli_backfill_gate(&store, rollout_id, pg)) == EX_OK &&
        (!pg || (rc = ks_cli_throttle_open(&throttle, o.db, o.table, o.column, o.throttle_query,
                                           o.max_replica_lag)) == EX_OK)) {
        rc = wo.workers ? run_workers(ctx, &store, &p, &o, &t, busy_ms, rollout_id, &wo, &throttle)
                        : KS_CLI_WORKERS_CATCHUP;
        if (rc == KS_CLI_WORKERS_CATCHUP) {
            rc = run_engine(ctx, &store, &p, &o, rollout_id, pg, pg ? &throttle : NULL);
        }
    }
    ks_cli_throttle_close(&throttle);
    ks_rowstore_close(&store);
    ks_ctx_free(ctx);
    ks_cli_keys_close(&keys);
    return rc;
}

/* See cmd_migrate_workers.h. */
void ks_cli_put_progress_json(const ks_checkpoint *cp)
{
    printf("\"state\":");
    ks_cli_put_json_string(stdout, cp->state.ptr, cp->state.len);
    printf(",\"pass\":%u,\"cursor\":", cp->pass);
    ks_cli_put_value(stdout, &cp->cursor, 1);
    printf(",\"done\":%llu,\"skipped\":%llu,\"raced\":%llu,\"quarantined\":%llu,"
           "\"wrong_state\":%llu",
           (unsigned long long)cp->done, (unsigned long long)cp->skipped,
           (unsigned long long)cp->raced, (unsigned long long)cp->quarantined,
           (unsigned long long)cp->wrong_state);
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
static int list_checkpoints(const char *db, const mig_opts *o)
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
    mig_opts o;
    memset(&o, 0, sizeof o);
    int rc;
    if (parse(cmd, argc, argv, &o, &rc)) {
        return rc;
    }
    if ((rc = only_options(cmd, &o, " --id-column --chunks ")) != EX_OK) {
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

/* What verify keeps while reporting failures. */
typedef struct verify_state {
    int json;
    uint64_t reported;
} verify_state;

/* Report one row that did not open: its id and error, never its value. */
static void on_failure(void *arg, const ks_verify_failure *f)
{
    verify_state *s = arg;
    s->reported++;
    if (s->json) {
        printf("{\"id\":");
        ks_cli_put_value(stdout, &f->id, 1);
        printf(",\"error\":\"%s\"}\n", f->name);
    } else {
        printf("FAILED id ");
        ks_cli_put_value(stdout, &f->id, 0);
        printf(": %s\n", f->name);
    }
}

/* Record the pass of a complete verify of o's column in rollout r of
 * db: the column of a key scope, or the whole column scope. */
static int record_one(ks_rollout_db *db, const mig_opts *o, const ks_rollout *r,
                      const char *actor)
{
    int64_t now = (int64_t)time(NULL);
    ks_err e = r->scope == KS_SCOPE_KEY
                   ? ks_rollout_db_record_verify_column(db, r->id, o->table, o->column, actor, now)
                   : ks_rollout_db_record_verify(db, r->id, actor, now);
    if (e != KS_OK) {
        ks_cli_error("verify passed but was not recorded for rollout %lld (%s.%s): %s",
                     (long long)r->id, o->table, o->column, ks_err_name(e));
        return ks_cli_exit_code(e);
    }
    if (r->scope == KS_SCOPE_KEY) {
        fprintf(stderr, KS_PROG ": verify pass recorded for rollout %lld (backfill, key %s) "
                "for %s.%s: it may be finalized once every column it lists is verified\n",
                (long long)r->id, r->source.key_id, o->table, o->column);
    } else {
        fprintf(stderr, KS_PROG ": verify pass recorded for rollout %lld (backfill): it may now "
                "be finalized with 'keyshift rollout advance'\n", (long long)r->id);
    }
    return EX_OK;
}

/* After a complete verify that found no failure: record the pass in each
 * rollout in backfill that governs the column (its own, or a key-scoped
 * one for its key_id), so that it may be finalized.  A verify confined to
 * one key (--from-key) opened only that key's envelopes, so it counts
 * only for a key-scoped rollout of that key.  Looked up read-only first,
 * so a database without rollouts is not changed. */
static int record_verify(const mig_opts *o)
{
    ks_rollout_db *db = NULL;
    ks_rollout *rs = NULL;
    size_t n = 0;
    char actor[KS_ROLLOUT_ACTOR_MAX + 1];
    int rc = covering_rollouts(o, &rs, &n);
    for (size_t i = 0; rc == EX_OK && i < n; i++) {
        const ks_rollout *r = &rs[i];
        const char *key = r->scope == KS_SCOPE_KEY ? r->source.key_id : NULL;
        if (r->phase != KS_PHASE_BACKFILL ||
            ks_rollout_scope_find(rs, n, o->table, o->column, key) != r ||
            (o->from_key != NULL && (key == NULL || strcmp(key, o->from_key) != 0))) {
            continue;
        }
        if (db == NULL && ((rc = ks_cli_actor("migrate verify", NULL, actor, sizeof actor)) !=
                               EX_OK ||
                           (rc = ks_cli_rollout_open(o->db, 0, &db)) != EX_OK)) {
            break;
        }
        rc = record_one(db, o, r, actor);
    }
    ks_rollout_db_close(db);
    free(rs);
    return rc;
}

/* `migrate verify`. */
static int cmd_verify(int argc, char **argv)
{
    static const char cmd[] = "migrate verify";
    mig_opts o;
    memset(&o, 0, sizeof o);
    int rc;
    if (parse(cmd, argc, argv, &o, &rc)) {
        return rc;
    }
    if ((rc = only_options(cmd, &o, " --tenant-column --tenant --context --purpose --sample "
                                    "--keyring --passphrase-file --providers --id-column "
                                    "--from-key --encoding ")) != EX_OK) {
        return rc;
    }
    ks_migrate_params p;
    memset(&p, 0, sizeof p);
    ks_rowstore_target t;
    char names[KS_CONTEXT_TEMPLATE_MAX];
    if ((rc = common_params(cmd, &o, &p, &t, names)) != EX_OK) {
        return rc;
    }
    size_t sample = 0;
    if (o.sample != NULL && ks_cli_parse_size(o.sample, 1, SIZE_MAX, &sample) != 0) {
        return ks_cli_usage_error(cmd, "--sample must be a number from 1");
    }
    if ((rc = check_rollout_encoding(cmd, &o, p.encoding)) != EX_OK) {
        return rc;
    }
    ks_cli_keys keys = {0};
    ks_ctx *ctx = NULL;
    ks_rowstore store = {NULL, NULL, NULL, 0, KS_ENCODING_BINARY};
    verify_state s = {o.json, 0};
    ks_verify_result r = {0, 0, 0};
    if ((rc = ks_cli_store_open(o.db, &t, 1, 0, KS_SQLITE_SYNC_FULL, &store)) == EX_OK &&
        (rc = ks_cli_check_context(cmd, &store, o.table, o.context)) == EX_OK &&
        (rc = ks_cli_ctx_open(cmd, o.keyring, o.passfile, o.providers, &keys, &ctx)) == EX_OK) {
        ks_err e = ks_migrate_verify(ctx, &store, &p, sample, on_failure, &s, &r);
        if (e != KS_OK) {
            ks_cli_error("verify of %s.%s stopped: %s", o.table, o.column, ks_err_name(e));
            rc = ks_cli_exit_code(e);
        } else {
            rc = r.failed ? EX_DATAERR : EX_OK;
        }
        if (rc == EX_OK && sample == 0) {
            rc = record_verify(&o);
        }
        if (o.json) {
            printf("{\"checked\":%llu,\"failed\":%llu,\"skipped\":%llu,\"result\":\"%s\"}\n",
                   (unsigned long long)r.checked, (unsigned long long)r.failed,
                   (unsigned long long)r.skipped, e != KS_OK ? ks_err_name(e) : r.failed ? "failed" : "ok");
        } else {
            printf("%llu envelopes checked, %llu failed, %llu rows skipped (%s)\n",
                   (unsigned long long)r.checked, (unsigned long long)r.failed,
                   (unsigned long long)r.skipped,
                   o.from_key != NULL ? "NULL, plaintext or another key" : "NULL or plaintext");
        }
    }
    ks_rowstore_close(&store);
    ks_ctx_free(ctx);
    ks_cli_keys_close(&keys);
    return rc;
}

/* `migrate pause` (paused nonzero) and `migrate resume`: set or clear
 * the column's flag, which every run over it (on any host) checks after
 * each batch. */
static int cmd_pause(int argc, char **argv, int paused)
{
    const char *cmd = paused ? "migrate pause" : "migrate resume";
    mig_opts o;
    memset(&o, 0, sizeof o);
    int rc, pg = 0;
    if (parse(cmd, argc, argv, &o, &rc)) {
        return rc;
    }
    if ((rc = only_options(cmd, &o, paused ? " --reason " : " ")) != EX_OK) {
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

/* Manual of `keyshift migrate quarantine`. */
static void quarantine_usage(FILE *f)
{
    fputs("NAME\n"
          "    keyshift migrate quarantine - list and release a column's quarantined rows\n"
          "\n"
          "SYNOPSIS\n"
          "    keyshift migrate quarantine list --db DB --table T --column C\n"
          "        [--id-column I] [--encoding binary|base64] [--json]\n"
          "    keyshift migrate quarantine release --db DB --table T --column C\n"
          "        (--id ID | --error NAME | --id ID --error NAME | --all)\n"
          "        [--id-column I] [--busy-timeout MS] [--encoding binary|base64] [--json]\n"
          "\n"
          "DESCRIPTION\n"
          "    A run quarantines a row that does not parse or open (keyshift_quarantine)\n"
          "    and never modifies it. Quarantine belongs to the migration that put the\n"
          "    row there (its mode, keys, context template, purpose, tenant...): a\n"
          "    run with other parameters, such as the corrected command after a run\n"
          "    with a wrong --context, tries the row again and quarantines it again,\n"
          "    under its own parameters, only if it fails again. Rows quarantined\n"
          "    before quarantine kept its migration hold back every migration until\n"
          "    released.\n"
          "    list     prints each quarantined row of column C: its id, the error\n"
          "             name, when, and the parameters of the migration that\n"
          "             quarantined it; with --json one object per line,\n"
          "             {\"id\":...,\"error\":...,\"migration\":...|null,\"time\":...}.\n"
          "             Read-only.\n"
          "    release  deletes the selected rows' quarantine entries, in one\n"
          "             transaction, so that the next run of their migration tries\n"
          "             them again (rows that still fail are quarantined again). The\n"
          "             rows themselves are never touched. --id ID selects one row\n"
          "             (a decimal number is an integer id, anything else a text\n"
          "             id), --error NAME the rows quarantined under that error name\n"
          "             (auth-failed, bad-tenant, bad-context, a parse error...),\n"
          "             both the rows matching both, --all every row of the column;\n"
          "             without one of them it is refused (exit 64). Each release is\n"
          "             logged on standard error: who ($USER@host), the column, the\n"
          "             selector and how many rows; with --json {\"released\":N} on\n"
          "             standard output.\n"
          "\n"
          "EXIT STATUS\n"
          "    0   listed (also when nothing is in quarantine), or released\n"
          "    64  usage error (release without a selector, --all with another one)\n"
          "    66  no such database, table or column\n"
          "    69  the PostgreSQL database cannot be reached\n"
          "    74  database error (nothing released); list: a malformed entry\n"
          "    75  the database stayed locked past --busy-timeout (nothing released)\n"
          "\n"
          "EXAMPLES\n"
          "    keyshift migrate quarantine list --db shop.db --table payments --column card\n"
          "    keyshift migrate quarantine release --db shop.db --table payments \\\n"
          "        --column card --error auth-failed\n",
          f);
}

/* What `migrate quarantine list` keeps while printing. */
typedef struct qlist_state {
    int json;
    uint64_t n;
} qlist_state;

/* Print one quarantine entry (ks_rowstore_quarantine_fn): a line, or a
 * JSON object per line; text read back from the database is printed
 * with non-printable bytes as '?' (JSON: escaped). */
static int print_entry(void *arg, const ks_quarantine_entry *e)
{
    qlist_state *l = arg;
    char when[32];
    ks_cli_format_time(e->time, when, sizeof when);
    ks_value error = {KS_VALUE_TEXT, 0, e->error}, params = {KS_VALUE_TEXT, 0, e->params};
    if (l->json) {
        printf("{\"id\":");
        ks_cli_put_value(stdout, &e->id, 1);
        printf(",\"error\":");
        ks_cli_put_json_string(stdout, e->error.ptr, e->error.len);
        printf(",\"migration\":");
        if (e->params.len > 0) {
            ks_cli_put_json_string(stdout, e->params.ptr, e->params.len);
        } else {
            printf("null");
        }
        printf(",\"time\":\"%s\"}\n", when);
    } else {
        printf("id ");
        ks_cli_put_value(stdout, &e->id, 0);
        printf("  ");
        ks_cli_put_value(stdout, &error, 0);
        printf("  %s  migration ", when);
        if (e->params.len > 0) {
            ks_cli_put_value(stdout, &params, 0);
        } else {
            printf("(any: recorded before quarantine kept its migration)");
        }
        fputc('\n', stdout);
    }
    l->n++;
    return 0;
}

/* The id of --id: an INTEGER when it is canonical decimal (the rowid, an
 * INTEGER or PostgreSQL key), else TEXT (a TEXT key). */
static ks_value id_of(const char *text)
{
    ks_value v = {KS_VALUE_TEXT, 0, str_view(text)};
    char *end = NULL, canon[24];
    errno = 0;
    long long n = strtoll(text, &end, 10);
    if (errno == 0 && end != text && *end == '\0' &&
        snprintf(canon, sizeof canon, "%lld", n) > 0 && strcmp(canon, text) == 0) {
        v = (ks_value){KS_VALUE_INTEGER, (int64_t)n, {NULL, 0}};
    }
    return v;
}

/* Delete the quarantine entries o selects from store, in one
 * transaction, and log it on stderr (who, what, how many). */
static int release_entries(const ks_rowstore *store, const mig_opts *o, const ks_value *id)
{
    static const char cmd[] = "migrate quarantine release";
    char actor[KS_ROLLOUT_ACTOR_MAX + 1];
    int rc = ks_cli_actor(cmd, NULL, actor, sizeof actor);
    if (rc != EX_OK) {
        return rc;
    }
    ks_quarantine_select sel = {id, o->error, o->all};
    uint64_t released = 0;
    ks_err e = store->ops->begin(store->self);
    if (e == KS_OK) {
        e = store->ops->quarantine_release(store->self, &sel, &released);
    }
    if (e == KS_OK) {
        e = store->ops->commit(store->self);
    }
    if (e != KS_OK) {
        store->ops->rollback(store->self);
        ks_cli_error("cannot release quarantined rows of %s.%s: %s (nothing was released)",
                     o->table, o->column, ks_err_name(e));
        return ks_cli_exit_code(e);
    }
    char what[160];
    if (o->all) {
        snprintf(what, sizeof what, "all");
    } else {
        snprintf(what, sizeof what, "%s%.64s%s%s%s", o->id != NULL ? "id " : "",
                 o->id != NULL ? o->id : "", o->id != NULL && o->error != NULL ? " and " : "",
                 o->error != NULL ? "error " : "", o->error != NULL ? o->error : "");
    }
    for (char *c = what; *c != '\0'; c++) {
        *c = *c < 0x20 || *c > 0x7e ? '?' : *c; /* --id is the operator's text */
    }
    fprintf(stderr,
            KS_PROG " %s: %s released %llu row(s) of %s.%s from quarantine (selected: %s); "
            "the next run of a migration tries them again\n",
            cmd, actor, (unsigned long long)released, o->table, o->column, what);
    if (o->json) {
        printf("{\"released\":%llu}\n", (unsigned long long)released);
    }
    return EX_OK;
}

/* Nonzero when s may be an error name: 1..128 of [a-z0-9-]. */
static int error_name_ok(const char *s)
{
    size_t n = strlen(s);
    return n >= 1 && n <= 128 && strspn(s, "abcdefghijklmnopqrstuvwxyz0123456789-") == n;
}

/* `migrate quarantine list|release`: the rows of one column in
 * keyshift_quarantine, and releasing them (by id, by error name, or all)
 * so that the next run tries them again. */
static int cmd_quarantine(int argc, char **argv)
{
    if (argc >= 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
        quarantine_usage(stdout);
        ks_cli_help_footer(stdout, "migrate quarantine");
        return EX_OK;
    }
    if (argc < 2 || (strcmp(argv[1], "list") != 0 && strcmp(argv[1], "release") != 0)) {
        return ks_cli_usage_error("migrate quarantine", "list or release is required");
    }
    int release = strcmp(argv[1], "release") == 0;
    const char *cmd = release ? "migrate quarantine release" : "migrate quarantine list";
    mig_opts o;
    memset(&o, 0, sizeof o);
    int rc;
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            quarantine_usage(stdout);
            ks_cli_help_footer(stdout, "migrate quarantine");
            return EX_OK;
        }
    }
    if (parse(cmd, argc - 1, argv + 1, &o, &rc)) {
        return rc;
    }
    if ((rc = only_options(cmd, &o, release ? " --id-column --id --error --all --busy-timeout "
                                              "--encoding "
                                            : " --id-column --encoding ")) != EX_OK) {
        return rc;
    }
    if (o.db == NULL || o.table == NULL || o.column == NULL) {
        return ks_cli_usage_error(cmd, "--db, --table and --column are required");
    }
    if (release && !o.all && o.id == NULL && o.error == NULL) {
        return ks_cli_usage_error(cmd, "say which rows: --id ID, --error NAME (both: rows "
                                       "matching both), or --all");
    }
    if (o.all && (o.id != NULL || o.error != NULL)) {
        return ks_cli_usage_error(cmd, "--all releases every row; give it alone");
    }
    if (o.error != NULL && !error_name_ok(o.error)) {
        return ks_cli_usage_error(cmd, "--error must be an error name such as auth-failed");
    }
    if (o.id != NULL && o.id[0] == '\0') {
        return ks_cli_usage_error(cmd, "--id must not be empty");
    }
    size_t busy = 30000;
    if (o.busy_timeout != NULL && ks_cli_parse_size(o.busy_timeout, 0, 86400000, &busy) != 0) {
        return ks_cli_usage_error(cmd, "--busy-timeout must be milliseconds (0..86400000)");
    }
    if ((rc = ks_cli_db_check(o.db, NULL)) != EX_OK) {
        return rc;
    }
    ks_rowstore_target t = {.table = o.table, .column = o.column, .id_column = o.id_column};
    if ((rc = ks_cli_parse_encoding(cmd, o.encoding, &t.encoding)) != EX_OK) {
        return rc;
    }
    ks_rowstore store = {NULL, NULL, NULL, 0, KS_ENCODING_BINARY};
    if ((rc = ks_cli_store_open(o.db, &t, !release, (uint32_t)busy, KS_SQLITE_SYNC_FULL,
                                &store)) != EX_OK) {
        return rc;
    }
    if (release) {
        ks_value id = o.id != NULL ? id_of(o.id) : (ks_value){KS_VALUE_NULL, 0, {NULL, 0}};
        rc = release_entries(&store, &o, o.id != NULL ? &id : NULL);
    } else {
        qlist_state l = {o.json, 0};
        ks_err e = store.ops->quarantine_list(store.self, print_entry, &l);
        if (e != KS_OK) {
            ks_cli_error("cannot read the quarantine of %s.%s: %s", o.table, o.column,
                         ks_err_name(e));
            rc = ks_cli_exit_code(e);
        } else if (l.n == 0 && !o.json) {
            fprintf(stderr, KS_PROG " %s: no row of %s.%s is in quarantine\n", cmd, o.table,
                    o.column);
        }
    }
    ks_rowstore_close(&store);
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
        return cmd_run(argc - 1, argv + 1);
    }
    if (strcmp(argv[1], "status") == 0) {
        return cmd_status(argc - 1, argv + 1);
    }
    if (strcmp(argv[1], "verify") == 0) {
        return cmd_verify(argc - 1, argv + 1);
    }
    if (strcmp(argv[1], "pause") == 0 || strcmp(argv[1], "resume") == 0) {
        return cmd_pause(argc - 1, argv + 1, strcmp(argv[1], "pause") == 0);
    }
    if (strcmp(argv[1], "quarantine") == 0) {
        return cmd_quarantine(argc - 1, argv + 1);
    }
    return ks_cli_usage_error("migrate", "no such subcommand '%s' (run, status, verify, "
                                         "quarantine, pause or resume)", argv[1]);
}
