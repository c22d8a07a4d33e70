/*
 * tools/cli/cmd_rollout.c -- `keyshift rollout`: start a rollout of one column
 * from a source to a target, move it through its guarded phases, roll it
 * back, watch its health and export it (docs/rollout.md, "Commands").
 * This file holds the manual, the options, the selection of a rollout and
 * the dispatch to its subcommands: cmd_rollout_start.c (start),
 * cmd_rollout_phase.c (advance, rollback, canary, abort, set),
 * cmd_rollout_status.c (readers, log, status), cmd_rollout_health.c
 * (check, metrics), over cmd_rollout_facts.c (censuses, health windows,
 * keys) and cmd_rollout_print.c (text and JSON), sharing cmd_rollout.h.
 *
 * The library decides (ks_rollout_guard, re-checked inside the store's
 * transaction by ks_rollout_db_transition); these files gather the facts
 * a transition needs -- and only those: key states through the keyring, a
 * census of the scope, the health verdict of the window -- and report
 * refusals with the library's sentence and exit 75.  Nothing printed ever
 * carries plaintext or key material: counts, key ids, names and times.
 */
#define _POSIX_C_SOURCE 200809L

#include <inttypes.h>
#include <string.h>

#include "cmd_rollout.h"

/* The manual of `keyshift rollout`. */
static void usage(FILE *f)
{
    fputs("NAME\n"
          "    keyshift rollout - move a column, or a key's envelopes, from a source to a\n"
          "    target in guarded phases\n"
          "\n"
          "SYNOPSIS\n"
          "    keyshift rollout start --db FILE --table T --column C --source CLASS\n"
          "        --target CLASS [--min-soak DUR] [--reader-ttl DUR]\n"
          "        [--max-auth-failure-rate R] [--max-parse-error-rate R]\n"
          "        [--max-provider-error-rate R] [--max-seal-p99-us N]\n"
          "        [--max-open-p99-us N] [--min-samples N] [--window DUR]\n"
          "        [--encoding binary|base64]\n"
          "        [--keyring FILE [--passphrase-file FILE] | --providers FILE]\n"
          "        [--actor A] [--reason TEXT] [--json]\n"
          "    keyshift rollout start --db FILE --key-id K --columns T.C[,T2.C2...]\n"
          "        --source CLASS --target CLASS [the options above]\n"
          "    keyshift rollout advance --db FILE [SELECT] [--tenants a,b | --percent N |\n"
          "        --all] [--keyring FILE [--passphrase-file FILE] | --providers FILE]\n"
          "        [--actor A]\n"
          "        [--reason TEXT] [--json]\n"
          "    keyshift rollout rollback --db FILE [SELECT] --reason TEXT [--actor A]\n"
          "        [--keyring FILE [--passphrase-file FILE] | --providers FILE] [--json]\n"
          "    keyshift rollout canary --db FILE [SELECT] --tenants a,b | --percent N |\n"
          "        --all [--actor A] [--reason TEXT] [--json]\n"
          "    keyshift rollout abort --db FILE [SELECT] --reason TEXT [--actor A] [--json]\n"
          "    keyshift rollout set --db FILE [SELECT] [--max-auth-failure-rate R]\n"
          "        [--max-parse-error-rate R] [--max-provider-error-rate R]\n"
          "        [--max-seal-p99-us N] [--max-open-p99-us N] [--min-samples N]\n"
          "        [--window DUR] [--min-soak DUR] [--reader-ttl DUR] [--actor A]\n"
          "        [--reason TEXT] [--json]\n"
          "    keyshift rollout status --db FILE [SELECT] [--json]\n"
          "    keyshift rollout log --db FILE [SELECT] [--limit N] [--json]\n"
          "    keyshift rollout check --db FILE [SELECT] [--auto-rollback] [--actor A]\n"
          "        [--json]\n"
          "    keyshift rollout metrics --db FILE [SELECT] --prometheus [--textfile DIR]\n"
          "        | --json\n"
          "    keyshift rollout readers --db FILE [--reader-ttl DUR] [--json]\n"
          "\n"
          "    SELECT is --rollout ID, --table T --column C (the latest rollout of\n"
          "    that column), or --key-id K (the latest key-scoped rollout of key K).\n"
          "    Without it the database must hold exactly one rollout; when it holds\n"
          "    several, the command lists them and exits 64.\n"
          "\n"
          "DESCRIPTION\n"
          "    A rollout moves a scope from a SOURCE to a TARGET through\n"
          "    the phases planned -> read-compat -> write-upgrade -> backfill ->\n"
          "    finalized. Applications (ks_policy) read the phase from the database:\n"
          "    what they write and what they may read follows it. Every transition\n"
          "    is checked by a guard inside one database transaction and logged\n"
          "    with time, actor and reason (docs/rollout.md).\n"
          "\n"
          "    The scope is column C of table T (every value in it), or key K: every\n"
          "    envelope of key id K in the listed columns (--columns T.C,T2.C2, up to\n"
          "    16; names holding ',' or '.' cannot be listed). A key scope's source is\n"
          "    an envelope class of key K (plaintext has no key id) and its target\n"
          "    keeps key K (another version, format or algorithm); its census guards\n"
          "    count every listed column, and it is finalized only when each column\n"
          "    has a complete 'migrate verify' since backfill began. A key scope and\n"
          "    a column scope that share a column cannot both be open (exit 65,\n"
          "    naming the other rollout); key scopes of different keys may share.\n"
          "\n"
          "    CLASS is 'plaintext' (source only) or vF:ALG:KEY_ID:VERSION, e.g.\n"
          "    v2:xchacha20-poly1305:payments/kek:2 -- format 1 or 2, algorithm\n"
          "    xchacha20-poly1305 or aes-256-gcm, key id (which may contain ':';\n"
          "    the version follows the last ':'), key version. DUR is seconds, or a\n"
          "    number with s, m, h or d (300, 300s, 5m, 1h).\n"
          "\n"
          "    start     creates the rollout in planned and prints its id (a column\n"
          "              scope with --table and --column, a key scope with --key-id\n"
          "              and --columns). It first asks the key provider (needs the\n"
          "              keyring) about the target key version and refuses (exit 65)\n"
          "              one that does not exist or is not active (cannot seal).\n"
          "              Defaults:\n"
          "              --min-soak 300 s (least time in read-compat before\n"
          "              write-upgrade, for the phase to reach every host),\n"
          "              --reader-ttl 60 s (a reader is live while its heartbeat is\n"
          "              this recent), thresholds 0.001 auth failures, 0.001 parse\n"
          "              errors, 0.01 provider errors, p99 seal and open 10000 us,\n"
          "              1000 samples, 300 s window. A negative rate or a 0 latency\n"
          "              disables that check; an enabled check with nothing to judge\n"
          "              in the window (no opens, no provider calls, latencies not\n"
          "              timed) has no data, and the health is then insufficient,\n"
          "              never ok. --encoding (default binary) records how the\n"
          "              scope's columns hold envelopes: the rollout's census\n"
          "              reads them so, a 'migrate run' or 'migrate verify' of\n"
          "              the scope with another --encoding is refused (exit 64),\n"
          "              and applications (ks_app) seal and open in that form.\n"
          "              With base64 each column is first opened as its census\n"
          "              will: one that cannot hold base64 text (a PostgreSQL\n"
          "              column that is not text or varchar) is refused (exit 66).\n"
          "    advance   moves to the next phase once its guard passes. It gathers:\n"
          "                planned -> read-compat: the target key version's state\n"
          "                  (needs the keyring): it must exist, not disabled or\n"
          "                  destroyed;\n"
          "                read-compat -> write-upgrade: every live reader supports\n"
          "                  the target, and read-compat lasted --min-soak. Takes the\n"
          "                  canary (--tenants, --percent or --all; default all);\n"
          "                write-upgrade -> backfill: the health of the window is ok;\n"
          "                backfill -> finalized: the census shows 0 rows at the\n"
          "                  source and 'migrate verify' passed since backfill\n"
          "                  began (of every listed column, for a key scope; the\n"
          "                  refusal names those without). With a keyring and an envelope source, the source\n"
          "                  key version then becomes decrypt-only (not when it is\n"
          "                  also the target's, as in a format upgrade); this is\n"
          "                  refused while it is its key's primary (promote the\n"
          "                  target, or another version, first).\n"
          "    rollback  takes the one safe step back: write-upgrade or backfill ->\n"
          "              read-compat (always); read-compat -> planned only while the\n"
          "              census shows 0 rows at the target; finalized -> backfill\n"
          "              only while the source key version is not destroyed (needs\n"
          "              the keyring for an envelope source) and every live reader\n"
          "              can read the source again.\n"
          "    canary    changes who writes the target in write-upgrade: a tenant\n"
          "              list, a percentage by a stable hash of the tenant, or all.\n"
          "    abort     ends a rollout that has written its target nowhere, e.g. one\n"
          "              started with a mistaken --target: in planned, or in\n"
          "              read-compat while the census shows 0 rows at the target (a\n"
          "              rollout in write-upgrade or backfill is rolled back to\n"
          "              read-compat first; a finalized one cannot be aborted). The\n"
          "              rollout is removed, its log stays (who, why, and what it\n"
          "              was), and its scope is free for a new start. --reason is\n"
          "              required.\n"
          "    set       changes the thresholds, --window, --min-soak and\n"
          "              --reader-ttl of a rollout that is not finalized (options\n"
          "              not given keep their values), e.g. --min-samples for an\n"
          "              application that reports few samples, or a 0 latency to\n"
          "              disable a check it cannot feed. Each change is logged with\n"
          "              its old and new value; guards judge the new values.\n"
          "    status    scope (a key scope's columns and their verify times),\n"
          "              phase and time in it, source and target, encoding, canary, readers\n"
          "              (live or expired, and whether each supports the target),\n"
          "              census against source and target (each column of a key\n"
          "              scope, and the sum), health against the\n"
          "              thresholds, the migration's own figures (its samples, never\n"
          "              judged), the last 10 log entries. Read-only.\n"
          "    log       the append-only log (time, actor, from, to, reason,\n"
          "              automatic); --limit N shows the last N entries.\n"
          "    check     judges the applications' samples of the window (not those\n"
          "              of 'migrate run') against the thresholds and names each\n"
          "              check that tripped, observed against limit, or that has\n"
          "              no data. With\n"
          "              --auto-rollback a trip in write-upgrade or backfill moves\n"
          "              the rollout back to read-compat, logged as automatic with\n"
          "              the tripped checks as reason. For cron and monitoring.\n"
          "    metrics   Prometheus text (labels rollout, scope, table, column;\n"
          "              key_id for a key scope): counters and histograms since\n"
          "              the rollout began (keyshift_*_total, by source app or\n"
          "              migrate), keyshift_rollout_phase{phase}, the thresholds\n"
          "              and the verdict on the window; with --textfile DIR,\n"
          "              written atomically to DIR/keyshift_rollout_ID.prom for\n"
          "              node_exporter's textfile collector. --json: the window\n"
          "              and the migration's own figures (\"migration\").\n"
          "    readers   the reader registry: instance, library version, format,\n"
          "              held keys, heartbeat age, live or not (--reader-ttl,\n"
          "              default 60 s).\n"
          "\n"
          "OPTIONS\n"
          "    --db DB                the application's database: a SQLite file (must\n"
          "                           exist) or a PostgreSQL connection string (URI or\n"
          "                           key=value; password via PGPASSFILE/PGPASSWORD),\n"
          "                           whose keyshift_rollout tables are created if missing\n"
          "    --rollout ID           the rollout\n"
          "    --table T, --column C  the column (start: the scope; else: select its\n"
          "                           latest rollout)\n"
          "    --key-id K             the key (start: a key scope, with --columns; else:\n"
          "                           select its latest key-scoped rollout)\n"
          "    --columns T.C,T2.C2    start: the columns of a key scope\n"
          "    --source, --target     the classes (start)\n"
          "    --encoding E           start: how the scope's columns hold envelopes:\n"
          "                           binary (the default; BLOB, bytea) or base64 (the\n"
          "                           canonical text of docs/format.md section 10;\n"
          "                           SQLite TEXT, PostgreSQL text or varchar)\n"
          "    --tenants a,b          canary: only these tenants (up to 64)\n"
          "    --percent N            canary: tenants whose hash bucket is below N %\n"
          "    --all                  canary: every tenant\n"
          "    --keyring FILE         default: $KEYSHIFT_KEYRING\n"
          "    --passphrase-file FILE keyring passphrase (default: $KEYSHIFT_PASSPHRASE);\n"
          "          " KS_CLI_PASSPHRASE_RULE "\n"
          "    --providers FILE       " KS_CLI_KEYS_RULE
          "    --actor A              who, in the log (default: $USER@hostname)\n"
          "    --reason TEXT          why, in the log (printable ASCII, up to 1024)\n"
          "    --limit N              log: the last N entries\n"
          "    --auto-rollback        check: roll back when a threshold tripped\n"
          "    --prometheus           metrics: Prometheus text exposition format\n"
          "    --textfile DIR         metrics: write DIR/keyshift_rollout_ID.prom\n"
          "                           atomically (temporary file, fsync, rename)\n"
          "    --json                 one JSON object on standard output\n"
          "    -h, --help             print this manual\n"
          "\n"
          "EXIT STATUS\n"
          "    0   success (check: healthy)\n"
          "    1   check: a threshold tripped and the rollout was rolled back\n"
          "    2   check: a threshold tripped, not rolled back (no --auto-rollback, or\n"
          "        no safe rollback from this phase)\n"
          "    3   check: too few samples in the window for a verdict, or an\n"
          "        enabled check has no data\n"
          "    64  usage error, or several rollouts and none selected\n"
          "    65  refused: no such transition (e.g. rollback from planned), the\n"
          "        scope already has, or overlaps, a rollout that is not finalized,\n"
          "        start's target key version does not exist or cannot seal, abort\n"
          "        of a rollout in write-upgrade, backfill or finalized, or set on a\n"
          "        finalized rollout\n"
          "    66  no such database, table, column or rollout\n"
          "    69  key provider unavailable\n"
          "    74  database error\n"
          "    75  not safe yet: a guard refused (for abort: rows are at the\n"
          "        target) and the message says what is missing, another\n"
          "        operator moved the rollout first, or the\n"
          "        database stayed locked. Scripts may retry later\n"
          "    77  key version unusable for the requested key state change\n"
          "    78  keyring insecure, unreadable or corrupt, or wrong passphrase\n"
          "\n"
          "EXAMPLES\n"
          "    keyshift keys add-version payments/kek                  # prints 2\n"
          "    keyshift rollout start --db shop.db --table payments --column card \\\n"
          "        --source v2:xchacha20-poly1305:payments/kek:1 \\\n"
          "        --target v2:xchacha20-poly1305:payments/kek:2 --reason OPS-42\n"
          "    keyshift rollout advance --db shop.db           # -> read-compat\n"
          "    keyshift rollout advance --db shop.db --percent 5   # -> write-upgrade\n"
          "    keyshift rollout check --db shop.db --auto-rollback\n"
          "    keyshift rollout advance --db shop.db           # -> backfill\n"
          "    keyshift keys promote payments/kek 2\n"
          "    keyshift migrate run --db shop.db --table payments --column card \\\n"
          "        --mode rewrap --to-key payments/kek:2\n"
          "    keyshift migrate verify --db shop.db --table payments --column card\n"
          "    keyshift rollout advance --db shop.db           # -> finalized\n"
          "    # rotate every payments/kek envelope of two columns at once:\n"
          "    keyshift rollout start --db shop.db --key-id payments/kek \\\n"
          "        --columns payments.card,refunds.card \\\n"
          "        --source v2:xchacha20-poly1305:payments/kek:2 \\\n"
          "        --target v2:xchacha20-poly1305:payments/kek:3\n"
          "    keyshift rollout status --db shop.db --key-id payments/kek\n"
          "    # a TEXT column of base64 envelopes, encrypted from plaintext:\n"
          "    keyshift rollout start --db shop.db --table users --column email \\\n"
          "        --encoding base64 --source plaintext \\\n"
          "        --target v2:xchacha20-poly1305:users/kek:1\n"
          "    # a mistaken target, or a threshold the application cannot meet:\n"
          "    keyshift rollout abort --db shop.db --rollout 7 --reason 'typo: kek:9'\n"
          "    keyshift rollout set --db shop.db --rollout 8 --min-samples 50 \\\n"
          "        --reason 'the batch app reports few samples'\n",
          f);
}

/* Parse argv into o, refusing options not named in allowed (--db,
 * --json and -h are always accepted).  Nonzero when the command is over
 * (then *rc is its exit code). */
int ks_cli_ro_parse(const char *cmd, int argc, char **argv, const char *allowed, ks_cli_ro_opts *o,
                    int *rc)
{
    int npos = 0;
    memset(o, 0, sizeof *o);
    const ks_cli_opt opts[] = {
        {"--db", &o->db, NULL},
        {"--rollout", &o->rollout, NULL},
        {"--table", &o->table, NULL},
        {"--column", &o->column, NULL},
        {"--key-id", &o->key_id, NULL},
        {"--columns", &o->columns, NULL},
        {"--source", &o->source, NULL},
        {"--target", &o->target, NULL},
        {"--min-soak", &o->min_soak, NULL},
        {"--reader-ttl", &o->reader_ttl, NULL},
        {"--max-auth-failure-rate", &o->max_auth, NULL},
        {"--max-parse-error-rate", &o->max_parse, NULL},
        {"--max-provider-error-rate", &o->max_provider, NULL},
        {"--max-seal-p99-us", &o->max_seal, NULL},
        {"--max-open-p99-us", &o->max_open, NULL},
        {"--min-samples", &o->min_samples, NULL},
        {"--window", &o->window, NULL},
        {"--actor", &o->actor, NULL},
        {"--reason", &o->reason, NULL},
        {"--tenants", &o->tenants, NULL},
        {"--percent", &o->percent, NULL},
        {"--keyring", &o->keyring, NULL},
        {"--passphrase-file", &o->passfile, NULL},
        {"--providers", &o->providers, NULL},
        {"--limit", &o->limit, NULL},
        {"--encoding", &o->encoding, NULL},
        {"--textfile", &o->textfile, NULL},
        {"--all", NULL, &o->all},
        {"--json", NULL, &o->json},
        {"--prometheus", NULL, &o->prometheus},
        {"--auto-rollback", NULL, &o->auto_rollback},
        {NULL, NULL, NULL},
    };
    if (ks_cli_parse_opts(cmd, usage, argc, argv, opts, NULL, 0, &npos, rc)) {
        return 1;
    }
    char all[512];
    snprintf(all, sizeof all, " --db --json %s ", allowed);
    if ((*rc = ks_cli_only_options(cmd, opts, all)) != EX_OK) {
        return 1;
    }
    if (o->db == NULL) {
        *rc = ks_cli_usage_error(cmd, "--db FILE is required (the application's database)");
        return 1;
    }
    if (o->reason != NULL && !ks_cli_printable(o->reason, 0, KS_ROLLOUT_REASON_MAX)) {
        *rc = ks_cli_usage_error(cmd, "--reason must be at most %d printable ASCII characters",
                                 KS_ROLLOUT_REASON_MAX);
        return 1;
    }
    if (strstr(all, " --actor ") != NULL &&
        (*rc = ks_cli_actor(cmd, o->actor, o->actor_buf, sizeof o->actor_buf)) != EX_OK) {
        return 1;
    }
    return 0;
}

/* ---- opening and selecting -------------------------------------------------------- */

/* Print the rollouts of db for an operator choosing one. */
static void list_rollouts(const ks_rollout *rs, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        char scope[KS_ROLLOUT_SCOPE_TEXT_MAX];
        fprintf(stderr, "    --rollout %-6" PRId64 " %s (%s)\n", rs[i].id,
                ks_rollout_scope_text(&rs[i], scope, sizeof scope),
                ks_rollout_phase_name((int)rs[i].phase));
    }
}

/*
 * The rollout the options select: --rollout ID, or the latest of --table
 * and --column (column-scoped), or the latest key-scoped rollout of
 * --key-id, or the only rollout of the database.  Returns EX_OK, or an
 * exit code after saying what is missing (EX_USAGE listing them when
 * several exist and none was selected).
 */
static int select_rollout(const char *cmd, ks_rollout_db *db, const ks_cli_ro_opts *o,
                          ks_rollout *out)
{
    ks_err e;
    int ways = (o->rollout != NULL) + (o->table != NULL || o->column != NULL) + (o->key_id != NULL);
    if (ways > 1) {
        return ks_cli_usage_error(cmd, "give one of --rollout, --table and --column, or --key-id");
    }
    if (o->key_id != NULL) {
        e = ks_rollout_db_latest_key(db, o->key_id, out);
        if (e == KS_ERR_INVALID_ARGUMENT) {
            return ks_cli_usage_error(cmd, "--key-id must be a valid key id (docs/format.md "
                                           "[F-KEYID-1])");
        }
        if (e == KS_ERR_NO_ROLLOUT) {
            ks_cli_error("no key-scoped rollout of %s in %s; start one with 'keyshift rollout "
                         "start --key-id'", o->key_id, o->db);
        }
    } else if (o->rollout != NULL) {
        size_t id;
        if (ks_cli_parse_size(o->rollout, 1, INT64_MAX, &id) != 0) {
            return ks_cli_usage_error(cmd, "--rollout must be a rollout id (a number from 1)");
        }
        e = ks_rollout_db_get(db, (int64_t)id, out);
        if (e == KS_ERR_NO_ROLLOUT) {
            ks_cli_error("no rollout %zu in %s (see 'keyshift rollout status --db %s')", id, o->db,
                         o->db);
        }
    } else if (o->table != NULL || o->column != NULL) {
        if (o->table == NULL || o->column == NULL) {
            return ks_cli_usage_error(cmd, "give --table and --column together");
        }
        e = ks_rollout_db_latest(db, o->table, o->column, out);
        if (e == KS_ERR_NO_ROLLOUT) {
            ks_cli_error("no rollout of %s.%s in %s; start one with 'keyshift rollout start'",
                         o->table, o->column, o->db);
        }
    } else {
        ks_rollout rs[8];
        size_t n = 0;
        e = ks_rollout_db_list(db, 0, rs, 8, &n);
        if (e == KS_OK && n == 0) {
            ks_cli_error("no rollout in %s; start one with 'keyshift rollout start'", o->db);
            return EX_NOINPUT;
        }
        if (e == KS_OK && n > 1) {
            fprintf(stderr, KS_PROG " %s: %s holds several rollouts; select one:\n", cmd, o->db);
            list_rollouts(rs, n);
            if (n == 8) {
                fprintf(stderr, "    ... (and maybe more: 'keyshift rollout status "
                                "--table T --column C' or '--key-id K')\n");
            }
            return ks_cli_usage_error(cmd, "give --rollout ID, --table T --column C or "
                                           "--key-id K");
        }
        if (e == KS_OK) {
            *out = rs[0];
        }
    }
    if (e != KS_OK && e != KS_ERR_NO_ROLLOUT) {
        ks_cli_error("cannot read the rollouts of %s: %s", o->db, ks_err_name(e));
    }
    return ks_cli_exit_code(e);
}

/* Open db (read-only or not) and select the rollout; on success the
 * caller closes *db. */
static int open_selected(const char *cmd, const ks_cli_ro_opts *o, int read_only,
                         ks_rollout_db **db, ks_rollout *r)
{
    int rc = ks_cli_rollout_open(o->db, read_only, db);
    if (rc == EX_OK && (rc = select_rollout(cmd, *db, o, r)) != EX_OK) {
        ks_rollout_db_close(*db);
        *db = NULL;
    }
    return rc;
}

/* ---- dispatch ----------------------------------------------------------------------------- */

/* A subcommand that works on one selected rollout. */
typedef int (*on_rollout_fn)(const char *cmd, const ks_cli_ro_opts *o, ks_rollout_db *db,
             const ks_rollout *r);

/* When a subcommand opens the database for writing. */
enum { WRITES_NEVER, WRITES_ALWAYS, WRITES_WITH_AUTO_ROLLBACK };

/* The subcommands on one rollout: the options they take (besides --db
 * and --json), whether they write, and what they do. */
static const struct {
    const char *name, *options;
    int writes;
    on_rollout_fn run;
} on_rollout_cmds[] = {
    {"advance", "--tenants --percent --all --keyring --passphrase-file --providers --actor --reason",
     WRITES_ALWAYS, ks_cli_ro_on_advance},
    {"rollback", "--reason --actor --keyring --passphrase-file --providers", WRITES_ALWAYS,
     ks_cli_ro_on_rollback},
    {"canary", "--tenants --percent --all --actor --reason", WRITES_ALWAYS, ks_cli_ro_on_canary},
    {"abort", "--reason --actor", WRITES_ALWAYS, ks_cli_ro_on_abort},
    {"set", "--max-auth-failure-rate --max-parse-error-rate --max-provider-error-rate "
            "--max-seal-p99-us --max-open-p99-us --min-samples --window --min-soak --reader-ttl "
            "--actor --reason",
     WRITES_ALWAYS, ks_cli_ro_on_set},
    {"status", "", WRITES_NEVER, ks_cli_ro_on_status},
    {"log", "--limit", WRITES_NEVER, ks_cli_ro_on_log},
    {"check", "--auto-rollback --actor", WRITES_WITH_AUTO_ROLLBACK, ks_cli_ro_on_check},
    {"metrics", "--prometheus --textfile", WRITES_NEVER, ks_cli_ro_on_metrics},
};

/* Parse the options of subcommand i of on_rollout_cmds, open the
 * database, select the rollout and run the subcommand on it. */
static int run_on_rollout(size_t i, int argc, char **argv)
{
    char cmd[32], allowed[512];
    ks_cli_ro_opts o;
    int rc;
    snprintf(cmd, sizeof cmd, "rollout %s", on_rollout_cmds[i].name);
    snprintf(allowed, sizeof allowed, "--rollout --table --column --key-id %s",
             on_rollout_cmds[i].options);
    if (ks_cli_ro_parse(cmd, argc, argv, allowed, &o, &rc)) {
        return rc;
    }
    if (on_rollout_cmds[i].run == ks_cli_ro_on_log && o.rollout != NULL && o.table == NULL &&
        o.column == NULL && o.key_id == NULL) {
        ks_rollout_db *probe;
        ks_rollout r;
        if ((rc = ks_cli_rollout_open(o.db, 1, &probe)) != EX_OK) {
            return rc;
        }
        size_t id = 0;
        int gone = ks_cli_parse_size(o.rollout, 1, INT64_MAX, &id) == 0 &&
                   ks_rollout_db_get(probe, (int64_t)id, &r) == KS_ERR_NO_ROLLOUT;
        ks_rollout_db_close(probe);
        if (gone) {
            return ks_cli_ro_log_of_aborted(cmd, &o);
        }
    }
    int writes = on_rollout_cmds[i].writes;
    int read_only = writes == WRITES_NEVER || (writes == WRITES_WITH_AUTO_ROLLBACK && !o.auto_rollback);
    ks_rollout_db *db;
    ks_rollout r;
    if ((rc = open_selected(cmd, &o, read_only, &db, &r)) != EX_OK) {
        return rc;
    }
    rc = on_rollout_cmds[i].run(cmd, &o, db, &r);
    ks_rollout_db_close(db);
    return rc;
}

/* See cli.h. */
int ks_cmd_rollout(int argc, char **argv)
{
    int rc;
    if (ks_cli_subcommand_help(argc, argv, usage, &rc)) {
        return rc;
    }
    if (strcmp(argv[1], "start") == 0) {
        return ks_cli_ro_cmd_start(argc - 1, argv + 1);
    }
    if (strcmp(argv[1], "readers") == 0) {
        return ks_cli_ro_cmd_readers(argc - 1, argv + 1);
    }
    for (size_t i = 0; i < sizeof on_rollout_cmds / sizeof on_rollout_cmds[0]; i++) {
        if (strcmp(argv[1], on_rollout_cmds[i].name) == 0) {
            return run_on_rollout(i, argc - 1, argv + 1);
        }
    }
    return ks_cli_usage_error("rollout", "no such subcommand '%s' (start, advance, rollback, "
                                         "canary, abort, set, status, log, check, metrics or "
                                         "readers)",
                              argv[1]);
}
