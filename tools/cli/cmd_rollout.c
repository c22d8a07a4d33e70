/*
 * tools/cli/cmd_rollout.c -- `keyshift rollout`: start a rollout of one column
 * from a source to a target, move it through its guarded phases, roll it
 * back, watch its health and export it (docs/rollout.md, "Commands").
 *
 * The library decides (ks_rollout_guard, re-checked inside the store's
 * transaction by ks_rollout_db_transition); this file gathers the facts a
 * transition needs -- and only those: key states through the keyring, a
 * census of the scope, the health verdict of the window -- and reports
 * refusals with the library's sentence and exit 75.  Nothing printed ever
 * carries plaintext or key material: counts, key ids, names and times.
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "textfile.h"

/* Defaults documented in the manual and docs/rollout.md. */
#define DEFAULT_MIN_SOAK_S 300u
#define DEFAULT_READER_TTL_S 60u
#define STATUS_LOG_ENTRIES 10u

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

/* Every option of the subcommands; each says which it accepts. */
typedef struct ro_opts {
    const char *db, *rollout, *table, *column, *key_id, *columns, *source, *target, *min_soak;
    const char *reader_ttl;
    const char *max_auth, *max_parse, *max_provider, *max_seal, *max_open, *min_samples;
    const char *window, *actor, *reason, *tenants, *percent, *keyring, *passfile, *limit;
    const char *providers, *encoding, *textfile;
    int all, json, prometheus, auto_rollback;
    char actor_buf[KS_ROLLOUT_ACTOR_MAX + 1];
} ro_opts;

/* Parse argv into o, refusing options not named in allowed (--db,
 * --json and -h are always accepted).  Nonzero when the command is over
 * (then *rc is its exit code). */
static int parse(const char *cmd, int argc, char **argv, const char *allowed, ro_opts *o, int *rc)
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

/* ---- parsing values -------------------------------------------------------------- */

/* Parse a finite rate (a negative one disables its check). */
static int parse_rate(const char *s, double *out)
{
    char *end;
    errno = 0;
    double d = strtod(s, &end);
    if (errno != 0 || end == s || *end != '\0' || !isfinite(d)) {
        return -1;
    }
    *out = d;
    return 0;
}

/*
 * Parse a class: "plaintext" (when may_be_plaintext) or
 * vF:ALG:KEY_ID:VERSION, the version after the last ':' since a key id
 * may contain ':'.  Checked with ks_rollout_class_check.
 */
static int parse_class(const char *s, int may_be_plaintext, ks_rollout_class *c)
{
    memset(c, 0, sizeof *c);
    if (strcmp(s, "plaintext") == 0) {
        c->is_plaintext = 1;
        return may_be_plaintext ? 0 : -1;
    }
    if (s[0] != 'v' || (s[1] != '1' && s[1] != '2') || s[2] != ':') {
        return -1;
    }
    c->version = (uint8_t)(s[1] - '0');
    const char *alg = s + 3, *colon = strchr(alg, ':');
    char name[32];
    if (colon == NULL || colon == alg || (size_t)(colon - alg) >= sizeof name) {
        return -1;
    }
    memcpy(name, alg, (size_t)(colon - alg));
    name[colon - alg] = '\0';
    c->algorithm = ks_alg_from_name(name);
    const char *key = colon + 1, *last = strrchr(key, ':');
    size_t v;
    if (c->algorithm == 0 || last == NULL || last == key || (size_t)(last - key) > KS_KEY_ID_MAX ||
        ks_cli_parse_size(last + 1, 1, UINT32_MAX, &v) != 0) {
        return -1;
    }
    memcpy(c->key_id, key, (size_t)(last - key));
    c->key_id[last - key] = '\0';
    c->key_version = (uint32_t)v;
    return ks_rollout_class_check(c, may_be_plaintext) == KS_OK ? 0 : -1;
}

/* Write class c in the syntax parse_class reads. */
static const char *class_str(const ks_rollout_class *c, char *out, size_t cap)
{
    if (c->is_plaintext) {
        snprintf(out, cap, "plaintext");
    } else {
        const char *alg = ks_alg_name(c->algorithm);
        snprintf(out, cap, "v%u:%s:%s:%" PRIu32, (unsigned)c->version, alg ? alg : "?", c->key_id,
                 c->key_version);
    }
    return out;
}

/* The buffer size of class_str. */
#define CLASS_TEXT_MAX (KS_KEY_ID_MAX + 48)

/* Parse the canary options (at most one of --tenants, --percent, --all)
 * into c; *given says whether any was. */
static int parse_canary(const char *cmd, const ro_opts *o, ks_rollout_canary *c, int *given)
{
    memset(c, 0, sizeof *c);
    int n = (o->tenants != NULL) + (o->percent != NULL) + (o->all != 0);
    *given = n > 0;
    if (n > 1) {
        return ks_cli_usage_error(cmd, "give one of --tenants, --percent and --all");
    }
    c->kind = KS_CANARY_ALL;
    if (o->percent != NULL) {
        size_t p;
        if (ks_cli_parse_size(o->percent, 0, 100, &p) != 0) {
            return ks_cli_usage_error(cmd, "--percent must be a whole number from 0 to 100");
        }
        c->kind = KS_CANARY_PERCENT;
        c->percent = (uint32_t)p;
    }
    if (o->tenants != NULL) {
        c->kind = KS_CANARY_TENANTS;
        const char *p = o->tenants;
        for (;;) {
            size_t len = strcspn(p, ",");
            if (len == 0 || len > KS_TENANT_MAX || c->n_tenants == KS_ROLLOUT_TENANTS_MAX) {
                return ks_cli_usage_error(cmd, "--tenants takes 1..%d comma-separated tenants of "
                                               "1..%d bytes each", KS_ROLLOUT_TENANTS_MAX,
                                          KS_TENANT_MAX);
            }
            memcpy(c->tenants[c->n_tenants], p, len);
            c->tenants[c->n_tenants++][len] = '\0';
            if (p[len] == '\0') {
                break;
            }
            p += len + 1;
        }
    }
    return EX_OK;
}

/* Nonzero when canaries a and b say the same. */
static int canary_equal(const ks_rollout_canary *a, const ks_rollout_canary *b)
{
    if (a->kind != b->kind) {
        return 0;
    }
    if (a->kind == KS_CANARY_PERCENT) {
        return a->percent == b->percent;
    }
    if (a->kind == KS_CANARY_TENANTS) {
        if (a->n_tenants != b->n_tenants) {
            return 0;
        }
        for (size_t i = 0; i < a->n_tenants; i++) {
            if (strcmp(a->tenants[i], b->tenants[i]) != 0) {
                return 0;
            }
        }
    }
    return 1;
}

/* Write the canary as "all", "10%" or "tenants a,b". */
static void canary_str(const ks_rollout_canary *c, char *out, size_t cap)
{
    if (c->kind == KS_CANARY_PERCENT) {
        snprintf(out, cap, "%" PRIu32 "%%", c->percent);
        return;
    }
    if (c->kind == KS_CANARY_ALL) {
        snprintf(out, cap, "all");
        return;
    }
    size_t used = (size_t)snprintf(out, cap, "tenants ");
    for (size_t i = 0; i < c->n_tenants && used < cap; i++) {
        used += (size_t)snprintf(out + used, cap - used, "%s%s", i ? "," : "", c->tenants[i]);
    }
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
static int select_rollout(const char *cmd, ks_rollout_db *db, const ro_opts *o, ks_rollout *out)
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
static int open_selected(const char *cmd, const ro_opts *o, int read_only, ks_rollout_db **db,
                         ks_rollout *r)
{
    int rc = ks_cli_rollout_open(o->db, read_only, db);
    if (rc == EX_OK && (rc = select_rollout(cmd, *db, o, r)) != EX_OK) {
        ks_rollout_db_close(*db);
        *db = NULL;
    }
    return rc;
}

/* ---- facts ------------------------------------------------------------------------- */

/* The counts of one column against a rollout's source and target. */
typedef struct census_counts {
    uint64_t rows, null_rows, at_source, at_target, other;
} census_counts;

/* The census of a rollout's scope, against its source and target: the
 * sums (the census guards count over every column of a key scope), and
 * each column of a key scope. */
typedef struct scope_census {
    int known;
    uint64_t rows, null_rows, at_source, at_target, other;
    size_t n_cols;
    census_counts cols[KS_ROLLOUT_COLUMNS_MAX];
} scope_census;

/* Count table.column against r: rows at the source (plaintext rows for a
 * plaintext source), at the target, and the rest (other classes, other
 * keys, malformed). */
static int count_column(const char *path, const ks_rollout *r, const char *table,
                        const char *column, census_counts *out)
{
    ks_census c;
    memset(out, 0, sizeof *out);
    int rc = ks_cli_census(path, table, column, r->encoding, &c);
    if (rc != EX_OK) {
        return rc;
    }
    out->rows = c.rows;
    out->null_rows = c.null_rows;
    out->at_source = r->source.is_plaintext ? c.plaintext_rows : 0;
    for (size_t i = 0; i < c.n_classes; i++) {
        const ks_census_class *k = &c.classes[i];
        ks_rollout_class kc;
        memset(&kc, 0, sizeof kc);
        kc.version = k->version;
        kc.algorithm = k->algorithm;
        memcpy(kc.key_id, k->key_id, sizeof kc.key_id);
        kc.key_version = k->key_version;
        if (ks_rollout_class_equal(&kc, &r->target)) {
            out->at_target += k->rows;
        } else if (!r->source.is_plaintext && ks_rollout_class_equal(&kc, &r->source)) {
            out->at_source += k->rows;
        }
    }
    out->other = c.rows - c.null_rows - out->at_source - out->at_target;
    ks_census_free(&c);
    return EX_OK;
}

/* Count r's scope: its column, or each column of a key scope (summed). */
static int census_of(const char *path, const ks_rollout *r, scope_census *out)
{
    memset(out, 0, sizeof *out);
    size_t n = r->scope == KS_SCOPE_KEY ? r->n_columns : 1;
    for (size_t i = 0; i < n && i < KS_ROLLOUT_COLUMNS_MAX; i++) {
        census_counts *k = &out->cols[i];
        int rc = r->scope == KS_SCOPE_KEY
                     ? count_column(path, r, r->columns[i].table, r->columns[i].column, k)
                     : count_column(path, r, r->table, r->column, k);
        if (rc != EX_OK) {
            memset(out, 0, sizeof *out);
            return rc;
        }
        out->rows += k->rows;
        out->null_rows += k->null_rows;
        out->at_source += k->at_source;
        out->at_target += k->at_target;
        out->other += k->other;
    }
    out->known = 1;
    out->n_cols = r->scope == KS_SCOPE_KEY ? n : 0;
    return EX_OK;
}

/* The samples of source ("app" or "migrate") in r's window ending at
 * now, summed into *sum. */
static int window_of(ks_rollout_db *db, const ks_rollout *r, int64_t now, const char *source,
                     ks_health_sample *sum)
{
    memset(sum, 0, sizeof *sum);
    ks_err e = ks_rollout_db_metrics_sum_source(db, r->id, now - (int64_t)r->thresholds.window_s,
                                                source, sum);
    if (e != KS_OK) {
        ks_cli_error("cannot read the metrics of rollout %" PRId64 ": %s", r->id, ks_err_name(e));
        return ks_cli_exit_code(e);
    }
    return EX_OK;
}

/* Every sample of source ("app" or "migrate") r has stored, summed
 * into *sum: the totals since the rollout began, for counters. */
static int totals_of(ks_rollout_db *db, const ks_rollout *r, const char *source,
                     ks_health_sample *sum)
{
    memset(sum, 0, sizeof *sum);
    ks_err e = ks_rollout_db_metrics_sum_source(db, r->id, INT64_MIN, source, sum);
    if (e != KS_OK) {
        ks_cli_error("cannot read the metrics of rollout %" PRId64 ": %s", r->id, ks_err_name(e));
        return ks_cli_exit_code(e);
    }
    return EX_OK;
}

/* The health of r's window ending at now: the applications' samples
 * (source "app") summed since now - window_s and judged against r's
 * thresholds.  The migration's samples are its own figures, never
 * judged: an operator's mistake in `migrate run` (e.g. a wrong
 * --context) is not the applications' health. */
static int health_of(ks_rollout_db *db, const ks_rollout *r, int64_t now, ks_health_sample *sum,
                     ks_health_verdict *v)
{
    int rc = window_of(db, r, now, "app", sum);
    if (rc == EX_OK) {
        ks_health_evaluate(sum, &r->thresholds, v);
    }
    return rc;
}

/* Print the migration's own figures of a window (source "migrate"): a
 * JSON object, or one line. */
static void print_migration(const ks_health_sample *m, uint32_t window_s, int json)
{
    if (json) {
        printf("{\"window_s\":%" PRIu32 ",\"seals\":%" PRIu64 ",\"opens\":%" PRIu64
               ",\"auth_failures\":%" PRIu64 ",\"parse_errors\":%" PRIu64
               ",\"provider_calls\":%" PRIu64 ",\"provider_errors\":%" PRIu64 "}",
               window_s, m->seals, m->opens, m->auth_failures, m->parse_errors,
               m->provider_calls, m->provider_errors);
        return;
    }
    printf("migration    over the last %" PRIu32 " s (not judged): %" PRIu64 " seals, %" PRIu64
           " opens, %" PRIu64 " auth failures, %" PRIu64 " parse errors, %" PRIu64
           " of %" PRIu64 " provider calls failed\n",
           window_s, m->seals, m->opens, m->auth_failures, m->parse_errors, m->provider_errors,
           m->provider_calls);
}

/* Open the keys (--keyring, --providers, $KEYSHIFT_KEYRING or
 * $KEYSHIFT_PROVIDERS) when some are named, into *keys (then *opened is
 * set); when required and none are, a usage error says why they are
 * needed. */
static int keyring_for(const char *cmd, const ro_opts *o, int required, const char *why,
                       ks_cli_keys *keys, int *opened, ks_ctx **ctx)
{
    *opened = 0;
    *ctx = NULL;
    const char *env = getenv("KEYSHIFT_KEYRING"), *penv = getenv("KEYSHIFT_PROVIDERS");
    if (o->keyring == NULL && o->providers == NULL && (env == NULL || *env == '\0') &&
        (penv == NULL || *penv == '\0')) {
        return required ? ks_cli_usage_error(cmd, "%s: give --keyring FILE or --providers FILE "
                                                  "(or set KEYSHIFT_KEYRING or KEYSHIFT_PROVIDERS)",
                                             why)
                        : EX_OK;
    }
    int rc = ks_cli_ctx_open(cmd, o->keyring, o->passfile, o->providers, keys, ctx);
    *opened = rc == EX_OK;
    return rc;
}

/* Ask the keyring about class c's key version: its state into *state
 * (KS_ROLLOUT_KEY_MISSING when not found) and whether it is primary. */
static int key_fact(ks_ctx *ctx, const ks_rollout_class *c, int *state, int *is_primary)
{
    ks_key_info info;
    ks_bytes id = {(const uint8_t *)c->key_id, strlen(c->key_id)};
    ks_err e = ks_ctx_key_info(ctx, id, c->key_version, &info);
    *is_primary = 0;
    if (e == KS_ERR_NOT_FOUND) {
        *state = KS_ROLLOUT_KEY_MISSING;
        return EX_OK;
    }
    if (e != KS_OK) {
        ks_cli_error("cannot ask the key provider about %s:%" PRIu32 ": %s", c->key_id,
                     c->key_version, ks_err_name(e));
        return ks_cli_exit_code(e);
    }
    *state = (int)info.state;
    *is_primary = info.is_primary;
    return EX_OK;
}

/* ---- output helpers --------------------------------------------------------------- */

/* Write a JSON string from a C string. */
static void put_str(const char *s)
{
    ks_cli_put_json_string(stdout, (const uint8_t *)s, strlen(s));
}

/* Write a double as JSON (null when not finite). */
static void put_num(double d)
{
    if (isfinite(d)) {
        printf("%.9g", d);
    } else {
        fputs("null", stdout);
    }
}

/* One health check next to its limit. */
typedef struct check_row {
    unsigned bit;
    double observed, limit;
    int enabled, tripped, unbounded, no_data;
} check_row;

/* The five checks of verdict v under thresholds t. */
static void check_rows(const ks_health_verdict *v, const ks_thresholds *t, check_row out[5])
{
    const struct {
        unsigned bit;
        double observed, limit;
        int enabled, unbounded;
    } rows[5] = {
        {KS_HEALTH_AUTH_FAILURES, v->auth_failure_rate, t->max_auth_failure_rate,
         !(t->max_auth_failure_rate < 0), 0},
        {KS_HEALTH_PARSE_ERRORS, v->parse_error_rate, t->max_parse_error_rate,
         !(t->max_parse_error_rate < 0), 0},
        {KS_HEALTH_PROVIDER_ERRORS, v->provider_error_rate, t->max_provider_error_rate,
         !(t->max_provider_error_rate < 0), 0},
        {KS_HEALTH_SEAL_P99, (double)v->seal_p99_us, (double)t->max_seal_p99_us,
         t->max_seal_p99_us != 0, v->seal_p99_us == KS_HIST_UNBOUNDED},
        {KS_HEALTH_OPEN_P99, (double)v->open_p99_us, (double)t->max_open_p99_us,
         t->max_open_p99_us != 0, v->open_p99_us == KS_HIST_UNBOUNDED},
    };
    for (int i = 0; i < 5; i++) {
        out[i] = (check_row){rows[i].bit, rows[i].observed, rows[i].limit, rows[i].enabled,
                             (v->tripped & rows[i].bit) != 0, rows[i].unbounded,
                             (v->no_data & rows[i].bit) != 0};
    }
}

/* Write the checks with no data as "name, name" into out ("" when none). */
static void no_data_str(const ks_health_verdict *v, char *out, size_t cap)
{
    size_t used = 0;
    out[0] = '\0';
    for (unsigned i = 0; i < KS_HEALTH_N_CHECKS && used < cap; i++) {
        if (v->no_data & (1u << i)) {
            used += (size_t)snprintf(out + used, cap - used, "%s%s", used ? ", " : "",
                                     ks_health_check_name(1u << i));
        }
    }
}

/* Write the tripped checks as "name observed > limit; ..." into out. */
static void tripped_str(const ks_health_verdict *v, const ks_thresholds *t, char *out, size_t cap)
{
    check_row rows[5];
    check_rows(v, t, rows);
    size_t used = 0;
    out[0] = '\0';
    for (int i = 0; i < 5 && used < cap; i++) {
        if (!rows[i].tripped) {
            continue;
        }
        char obs[32];
        if (rows[i].unbounded) {
            snprintf(obs, sizeof obs, "unbounded");
        } else {
            snprintf(obs, sizeof obs, "%.6g", rows[i].observed);
        }
        used += (size_t)snprintf(out + used, cap - used, "%s%s %s > %.6g", used ? "; " : "",
                                 ks_health_check_name(rows[i].bit), obs, rows[i].limit);
    }
}

/* Print the health of a window: a JSON object, or a table. */
static void print_health(const ks_health_sample *sum, const ks_health_verdict *v,
                         const ks_thresholds *t, int json)
{
    check_row rows[5];
    check_rows(v, t, rows);
    if (json) {
        printf("{\"status\":\"%s\",\"window_s\":%" PRIu32 ",\"samples\":%" PRIu64
               ",\"min_samples\":%" PRIu64 ",\"seals\":%" PRIu64 ",\"opens\":%" PRIu64
               ",\"auth_failures\":%" PRIu64 ",\"parse_errors\":%" PRIu64
               ",\"provider_calls\":%" PRIu64 ",\"provider_errors\":%" PRIu64 ",\"checks\":[",
               ks_health_status_name(v->status), t->window_s, v->samples, t->min_samples,
               sum->seals, sum->opens, sum->auth_failures, sum->parse_errors, sum->provider_calls,
               sum->provider_errors);
        for (int i = 0; i < 5; i++) {
            printf("%s{\"check\":\"%s\",\"observed\":", i ? "," : "",
                   ks_health_check_name(rows[i].bit));
            put_num(rows[i].unbounded ? NAN : rows[i].observed);
            printf(",\"limit\":");
            put_num(rows[i].limit);
            printf(",\"enabled\":%s,\"no_data\":%s,\"tripped\":%s,\"over_by\":",
                   rows[i].enabled ? "true" : "false", rows[i].no_data ? "true" : "false",
                   rows[i].tripped ? "true" : "false");
            put_num(!rows[i].tripped ? 0.0 : rows[i].unbounded ? NAN
                                                              : rows[i].observed - rows[i].limit);
            printf("}");
        }
        printf("]}");
        return;
    }
    printf("health       %s over the last %" PRIu32 " s: %" PRIu64 " samples (minimum %" PRIu64
           ")\n", ks_health_status_name(v->status), t->window_s, v->samples, t->min_samples);
    printf("  %-20s %-14s %-14s %s\n", "CHECK", "OBSERVED", "LIMIT", "STATE");
    for (int i = 0; i < 5; i++) {
        char obs[32], lim[32];
        if (rows[i].unbounded) {
            snprintf(obs, sizeof obs, "unbounded");
        } else {
            snprintf(obs, sizeof obs, "%.6g", rows[i].observed);
        }
        snprintf(lim, sizeof lim, "%.6g", rows[i].limit);
        char state[64] = "ok";
        if (!rows[i].enabled) {
            snprintf(state, sizeof state, "disabled");
        } else if (rows[i].no_data && !rows[i].tripped) {
            snprintf(state, sizeof state, "no data (not healthy)");
        } else if (rows[i].tripped && rows[i].unbounded) {
            snprintf(state, sizeof state, "TRIPPED (beyond the largest bucket)");
        } else if (rows[i].tripped && rows[i].limit > 0) {
            snprintf(state, sizeof state, "TRIPPED by %.6g (%.3gx the limit)",
                     rows[i].observed - rows[i].limit, rows[i].observed / rows[i].limit);
        } else if (rows[i].tripped) {
            snprintf(state, sizeof state, "TRIPPED by %.6g", rows[i].observed - rows[i].limit);
        }
        printf("  %-20s %-14s %-14s %s\n", ks_health_check_name(rows[i].bit), obs,
               rows[i].enabled ? lim : "-", state);
    }
}

/* Print a rollout's scope: JSON members (no braces: "scope", then
 * "table" and "column", or "key_id" and "columns" with each column's
 * verify time), or lines. */
static void print_scope(const ks_rollout *r, int json)
{
    if (r->scope == KS_SCOPE_COLUMN) {
        if (json) {
            printf("\"scope\":\"column\",\"table\":");
            put_str(r->table);
            printf(",\"column\":");
            put_str(r->column);
        } else {
            printf("scope        %s.%s\n", r->table, r->column);
        }
        return;
    }
    if (json) {
        printf("\"scope\":\"key\",\"key_id\":");
        put_str(r->source.key_id);
        printf(",\"columns\":[");
    } else {
        printf("scope        key %s, %zu columns\n", r->source.key_id, r->n_columns);
    }
    for (size_t i = 0; i < r->n_columns; i++) {
        const ks_rollout_column *c = &r->columns[i];
        if (json) {
            printf("%s{\"table\":", i > 0 ? "," : "");
            put_str(c->table);
            printf(",\"column\":");
            put_str(c->column);
            printf(",\"verified_at\":%" PRId64 "}", c->verified_at);
        } else {
            char verified[32];
            ks_cli_format_time(c->verified_at, verified, sizeof verified);
            printf("  column     %s.%s (verified %s)\n", c->table, c->column,
                   verified[0] ? verified : "-");
        }
    }
    if (json) {
        printf("]");
    }
}

/* Print a rollout's fields: JSON members (no braces), or lines. */
static void print_rollout(const ks_rollout *r, int64_t now, int json)
{
    char src[CLASS_TEXT_MAX], dst[CLASS_TEXT_MAX], since[32], canary[KS_ROLLOUT_TENANTS_MAX *
                                                                        (KS_TENANT_MAX + 1) + 16];
    class_str(&r->source, src, sizeof src);
    class_str(&r->target, dst, sizeof dst);
    ks_cli_format_time(r->phase_since, since, sizeof since);
    canary_str(&r->canary, canary, sizeof canary);
    const char *phase = ks_rollout_phase_name((int)r->phase);
    if (json) {
        printf("\"rollout\":%" PRId64 ",", r->id);
        print_scope(r, 1);
        printf(",\"phase\":\"%s\",\"phase_since\":%" PRId64 ",\"in_phase_s\":%" PRId64
               ",\"source\":", phase, r->phase_since, now - r->phase_since);
        put_str(src);
        printf(",\"target\":");
        put_str(dst);
        printf(",\"canary\":");
        put_str(canary);
        printf(",\"encoding\":\"%s\",\"min_soak_s\":%" PRIu32 ",\"reader_ttl_s\":%" PRIu32
               ",\"verified_at\":%" PRId64,
               ks_value_encoding_name((int)r->encoding), r->min_soak_s, r->reader_ttl_s,
               r->verified_at);
        return;
    }
    char verified[32];
    ks_cli_format_time(r->verified_at, verified, sizeof verified);
    printf("rollout      %" PRId64 "\n", r->id);
    print_scope(r, 0);
    printf("phase        %s since %s (%" PRId64 " s)\nsource       %s\ntarget       %s\n"
           "encoding     %s\ncanary       %s\nmin soak     %" PRIu32 " s\n"
           "reader TTL   %" PRIu32 " s\n",
           phase, since, now - r->phase_since, src, dst, ks_value_encoding_name((int)r->encoding),
           canary, r->min_soak_s, r->reader_ttl_s);
    if (r->scope == KS_SCOPE_COLUMN) {
        printf("verified     %s\n", verified[0] ? verified : "-");
    }
}

/* Report the outcome of a transition attempt; returns the exit code. */
static int report_transition(const char *cmd, const ks_rollout *r, ks_rollout_phase to, ks_err e,
                             const char *why, int json)
{
    const char *from = ks_rollout_phase_name((int)r->phase), *tn = ks_rollout_phase_name((int)to);
    int rc = e == KS_ERR_STATE ? EX_DATAERR : ks_cli_exit_code(e);
    if (json) {
        printf("{\"rollout\":%" PRId64 ",\"from\":\"%s\",\"to\":\"%s\",\"result\":\"%s\","
               "\"reason\":", r->id, from, tn, e == KS_OK ? "ok" : ks_err_name(e));
        put_str(e == KS_OK ? "" : why[0] ? why : ks_err_name(e));
        printf(",\"exit\":%d}\n", rc);
    }
    if (e == KS_OK) {
        if (!json) {
            printf("rollout %" PRId64 ": %s -> %s\n", r->id, from, tn);
        }
        return EX_OK;
    }
    if (e == KS_ERR_GUARD) {
        fprintf(stderr, KS_PROG " %s: rollout %" PRId64 " cannot go from %s to %s yet: %s\n",
                cmd, r->id, from, tn, why);
    } else if (e == KS_ERR_STALE) {
        fprintf(stderr, KS_PROG " %s: rollout %" PRId64 " was moved by someone else meanwhile; "
                "look at 'keyshift rollout status' and retry\n", cmd, r->id);
    } else {
        fprintf(stderr, KS_PROG " %s: rollout %" PRId64 " cannot go from %s to %s: %s\n", cmd,
                r->id, from, tn, why[0] ? why : ks_err_name(e));
    }
    return rc;
}

/* Make the transition of r to `to` with facts f. */
static int transition(const char *cmd, ks_rollout_db *db, const ks_rollout *r,
                      ks_rollout_phase to, ks_rollout_facts *f, const ro_opts *o, int automatic,
                      const char *reason)
{
    char why[1024] = "";
    ks_rollout_change c = {r->id, r->phase, to, o->actor_buf, reason, automatic};
    ks_err e = ks_rollout_db_transition(db, &c, f, why, sizeof why);
    return report_transition(cmd, r, to, e, why, o->json);
}

/* ---- start --------------------------------------------------------------------------- */

/* Override the thresholds in *t with those the options give. */
static int parse_thresholds(const char *cmd, const ro_opts *o, ks_thresholds *t)
{
    const struct {
        const char *name, *value;
        double *out;
    } rates[] = {
        {"--max-auth-failure-rate", o->max_auth, &t->max_auth_failure_rate},
        {"--max-parse-error-rate", o->max_parse, &t->max_parse_error_rate},
        {"--max-provider-error-rate", o->max_provider, &t->max_provider_error_rate},
    };
    for (size_t i = 0; i < sizeof rates / sizeof rates[0]; i++) {
        if (rates[i].value != NULL && parse_rate(rates[i].value, rates[i].out) != 0) {
            return ks_cli_usage_error(cmd, "%s must be a number (a fraction: 0.001 is 0.1 %%; "
                                           "negative disables the check)", rates[i].name);
        }
    }
    const struct {
        const char *name, *value;
        uint64_t *out;
    } counts[] = {
        {"--max-seal-p99-us", o->max_seal, &t->max_seal_p99_us},
        {"--max-open-p99-us", o->max_open, &t->max_open_p99_us},
        {"--min-samples", o->min_samples, &t->min_samples},
    };
    for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++) {
        size_t v;
        if (counts[i].value == NULL) {
            continue;
        }
        if (ks_cli_parse_size(counts[i].value, 0, SIZE_MAX, &v) != 0) {
            return ks_cli_usage_error(cmd, "%s must be a whole number (0 disables a latency "
                                           "check)", counts[i].name);
        }
        *counts[i].out = v;
    }
    if (o->window != NULL && (ks_cli_parse_duration(o->window, &t->window_s) != 0 || t->window_s == 0)) {
        return ks_cli_usage_error(cmd, "--window must be a duration of at least 1 s "
                                       "(300, 300s, 5m, 1h)");
    }
    return EX_OK;
}

/* Parse --columns T.C,T2.C2 into s's list (each split at its first '.';
 * names are checked against the schema by the store). */
static int parse_columns(const char *cmd, const char *list, ks_rollout *s)
{
    const char *p = list;
    s->n_columns = 0;
    for (;;) {
        const char *comma = strchr(p, ',');
        size_t n = comma != NULL ? (size_t)(comma - p) : strlen(p);
        const char *dot = memchr(p, '.', n);
        if (s->n_columns == KS_ROLLOUT_COLUMNS_MAX || dot == NULL || dot == p ||
            dot + 1 == p + n || (size_t)(dot - p) > KS_ROLLOUT_IDENT_MAX ||
            (size_t)(p + n - dot - 1) > KS_ROLLOUT_IDENT_MAX) {
            return ks_cli_usage_error(cmd, "--columns must be 1 to %d TABLE.COLUMN names joined "
                                           "by ',' (names of at most %d bytes)",
                                      KS_ROLLOUT_COLUMNS_MAX, KS_ROLLOUT_IDENT_MAX);
        }
        ks_rollout_column *c = &s->columns[s->n_columns++];
        memcpy(c->table, p, (size_t)(dot - p));
        c->table[dot - p] = '\0';
        memcpy(c->column, dot + 1, (size_t)(p + n - dot - 1));
        c->column[p + n - dot - 1] = '\0';
        if (comma == NULL) {
            return EX_OK;
        }
        p = comma + 1;
    }
}

/* The scope of `start`: --table and --column, or --key-id and --columns
 * (the key_id must then be the source's and the target's). */
static int start_scope(const char *cmd, const ro_opts *o, ks_rollout *s)
{
    if (o->key_id != NULL || o->columns != NULL) {
        if (o->key_id == NULL || o->columns == NULL || o->table != NULL || o->column != NULL) {
            return ks_cli_usage_error(cmd, "a key scope is --key-id K --columns T.C[,T2.C2...], "
                                           "without --table and --column");
        }
        s->scope = KS_SCOPE_KEY;
        return parse_columns(cmd, o->columns, s);
    }
    if (o->table == NULL || o->column == NULL) {
        return ks_cli_usage_error(cmd, "--table and --column (or --key-id and --columns) are "
                                       "required");
    }
    if (strlen(o->table) > KS_ROLLOUT_IDENT_MAX || strlen(o->column) > KS_ROLLOUT_IDENT_MAX) {
        return ks_cli_usage_error(cmd, "table and column names are at most %d bytes",
                                  KS_ROLLOUT_IDENT_MAX);
    }
    memcpy(s->table, o->table, strlen(o->table) + 1);
    memcpy(s->column, o->column, strlen(o->column) + 1);
    return EX_OK;
}

/* Build the spec of `start` from the options. */
static int start_spec(const char *cmd, const ro_opts *o, ks_rollout *s)
{
    memset(s, 0, sizeof *s);
    int rc = start_scope(cmd, o, s);
    if (rc != EX_OK) {
        return rc;
    }
    if (o->source == NULL || o->target == NULL) {
        return ks_cli_usage_error(cmd, "--source and --target are required");
    }
    if (parse_class(o->source, 1, &s->source) != 0) {
        return ks_cli_usage_error(cmd, "--source must be plaintext or vF:ALG:KEY_ID:VERSION, "
                                       "e.g. v2:xchacha20-poly1305:payments/kek:1");
    }
    if (parse_class(o->target, 0, &s->target) != 0) {
        return ks_cli_usage_error(cmd, "--target must be vF:ALG:KEY_ID:VERSION, e.g. "
                                       "v2:xchacha20-poly1305:payments/kek:2");
    }
    if (ks_rollout_class_equal(&s->source, &s->target)) {
        return ks_cli_usage_error(cmd, "--source and --target are the same class");
    }
    if (s->scope == KS_SCOPE_KEY && s->source.is_plaintext) {
        return ks_cli_usage_error(cmd, "a key scope needs an envelope --source: plaintext has "
                                       "no key_id");
    }
    if (s->scope == KS_SCOPE_KEY && (strcmp(s->source.key_id, o->key_id) != 0 ||
                                     strcmp(s->target.key_id, o->key_id) != 0)) {
        return ks_cli_usage_error(cmd, "--key-id %s must be the key id of --source and --target "
                                       "(a key-scoped rollout keeps its key_id)", o->key_id);
    }
    s->min_soak_s = DEFAULT_MIN_SOAK_S;
    s->reader_ttl_s = DEFAULT_READER_TTL_S;
    if (o->min_soak != NULL && ks_cli_parse_duration(o->min_soak, &s->min_soak_s) != 0) {
        return ks_cli_usage_error(cmd, "--min-soak must be a duration (300, 300s, 5m, 1h)");
    }
    if (o->reader_ttl != NULL &&
        (ks_cli_parse_duration(o->reader_ttl, &s->reader_ttl_s) != 0 || s->reader_ttl_s == 0)) {
        return ks_cli_usage_error(cmd, "--reader-ttl must be a duration of at least 1 s");
    }
    if ((rc = ks_cli_parse_encoding(cmd, o->encoding, &s->encoding)) != EX_OK) {
        return rc;
    }
    s->canary.kind = KS_CANARY_ALL;
    ks_thresholds_default(&s->thresholds);
    return parse_thresholds(cmd, o, &s->thresholds);
}

/* Before start: ask the key provider about the target key version, which
 * must exist and be active (only an active version seals).  Returns
 * EX_OK, EX_DATAERR saying what is wrong, or the provider's error. */
static int check_target_key(const char *cmd, const ro_opts *o, const ks_rollout_class *t)
{
    ks_cli_keys keys = {0};
    ks_ctx *ctx = NULL;
    int opened = 0, state = 0, primary = 0;
    char why[KS_KEY_ID_MAX + 64];
    snprintf(why, sizeof why, "start checks target key %s:%" PRIu32 " with the key provider",
             t->key_id, t->key_version);
    int rc = keyring_for(cmd, o, 1, why, &keys, &opened, &ctx);
    if (rc == EX_OK) {
        rc = key_fact(ctx, t, &state, &primary);
    }
    ks_ctx_free(ctx);
    ks_cli_keys_close(&keys);
    if (rc != EX_OK) {
        return rc;
    }
    if (state == KS_ROLLOUT_KEY_MISSING) {
        ks_cli_error("target key %s:%" PRIu32 " does not exist in the key provider: check "
                     "--target ('keyshift keys list'), or create the version first with "
                     "'keyshift keys add-version %s'", t->key_id, t->key_version, t->key_id);
        return EX_DATAERR;
    }
    if (state != KS_KEY_ACTIVE) {
        ks_cli_error("target key %s:%" PRIu32 " is %s, so nothing can be sealed under it: "
                     "choose an active version for --target", t->key_id, t->key_version,
                     ks_key_state_name(state));
        return EX_DATAERR;
    }
    return EX_OK;
}

/* Before a start with --encoding base64: open each column of s's scope
 * as its census will (read-only, in that encoding), so that a column
 * that cannot hold base64 text (a PostgreSQL column that is not text or
 * varchar) is refused now rather than found by a census in a later
 * phase, where the rollout could neither finalize nor go back.  EX_OK,
 * or the store's exit code after its message. */
static int check_text_columns(const ro_opts *o, const ks_rollout *s)
{
    size_t n = s->scope == KS_SCOPE_KEY ? s->n_columns : 1;
    int rc = EX_OK;
    for (size_t i = 0; rc == EX_OK && s->encoding == KS_ENCODING_BASE64 && i < n; i++) {
        ks_rowstore_target t = {.encoding = s->encoding};
        t.table = s->scope == KS_SCOPE_KEY ? s->columns[i].table : s->table;
        t.column = s->scope == KS_SCOPE_KEY ? s->columns[i].column : s->column;
        ks_rowstore store;
        rc = ks_cli_store_open(o->db, &t, 1, 0, KS_SQLITE_SYNC_FULL, &store);
        if (rc == EX_OK) {
            ks_rowstore_close(&store);
        }
    }
    return rc;
}

/* `rollout start`. */
static int cmd_start(int argc, char **argv)
{
    static const char cmd[] = "rollout start";
    ro_opts o;
    int rc;
    if (parse(cmd, argc, argv,
              "--table --column --key-id --columns --source --target --min-soak --reader-ttl "
              "--max-auth-failure-rate --max-parse-error-rate --max-provider-error-rate "
              "--max-seal-p99-us --max-open-p99-us --min-samples --window --actor --reason "
              "--keyring --passphrase-file --providers --encoding",
              &o, &rc)) {
        return rc;
    }
    ks_rollout s;
    if ((rc = start_spec(cmd, &o, &s)) != EX_OK || (rc = check_text_columns(&o, &s)) != EX_OK) {
        return rc;
    }
    ks_rollout_db *db;
    if ((rc = ks_cli_rollout_open(o.db, 0, &db)) != EX_OK) {
        return rc;
    }
    if ((rc = check_target_key(cmd, &o, &s.target)) != EX_OK) {
        ks_rollout_db_close(db);
        return rc;
    }
    int64_t id = 0, now = (int64_t)time(NULL);
    char msg[512] = "";
    ks_err e = ks_rollout_db_start(db, &s, o.actor_buf, now, &id, msg, sizeof msg);
    char scope[KS_ROLLOUT_SCOPE_TEXT_MAX];
    ks_rollout_scope_text(&s, scope, sizeof scope);
    if (e != KS_OK) {
        ks_rollout_db_close(db);
        ks_cli_error("cannot start a rollout of %s: %s", scope, msg[0] ? msg : ks_err_name(e));
        return ks_cli_exit_code(e);
    }
    if (o.reason != NULL && o.reason[0] != '\0' &&
        (e = ks_rollout_db_note(db, id, o.actor_buf, o.reason, now)) != KS_OK) {
        ks_cli_error("warning: rollout %" PRId64 " started, but its reason was not logged: %s",
                     id, ks_err_name(e));
    }
    ks_rollout_db_close(db);
    if (o.json) {
        printf("{\"rollout\":%" PRId64 ",\"phase\":\"planned\"}\n", id);
    } else {
        printf("%" PRId64 "\n", id);
        char src[CLASS_TEXT_MAX], dst[CLASS_TEXT_MAX];
        fprintf(stderr, KS_PROG ": rollout %" PRId64 " of %s is planned: %s -> %s (%s); next: "
                "'keyshift rollout advance --db %s --rollout %" PRId64 "'\n", id, scope,
                class_str(&s.source, src, sizeof src),
                class_str(&s.target, dst, sizeof dst), ks_value_encoding_name((int)s.encoding),
                o.db, id);
    }
    return EX_OK;
}

/* ---- advance ----------------------------------------------------------------------- */

/* The phase after p, or 0 after finalized. */
static ks_rollout_phase next_phase(ks_rollout_phase p)
{
    return p < KS_PHASE_FINALIZED ? (ks_rollout_phase)(p + 1) : (ks_rollout_phase)0;
}

/* Nonzero when finalizing r retires a key version: the source is an
 * envelope class whose key version is not also the target's (a format or
 * algorithm upgrade keeps using the same key version). */
static int source_retires(const ks_rollout *r)
{
    const ks_rollout_class *s = &r->source, *t = &r->target;
    return !s->is_plaintext &&
           !(strcmp(s->key_id, t->key_id) == 0 && s->key_version == t->key_version);
}

/* Before finalizing with a keyring: the source key version will become
 * decrypt-only, which the keyring refuses for a primary.  Returns EX_OK
 * (with *retire set when the source is active) or EX_TEMPFAIL saying
 * what to promote first. */
static int finalize_precheck(const char *cmd, ks_ctx *ctx, const ks_rollout *r, int *retire)
{
    int state, primary;
    int rc = key_fact(ctx, &r->source, &state, &primary);
    *retire = 0;
    if (rc != EX_OK || state == KS_ROLLOUT_KEY_MISSING) {
        return rc;
    }
    if (primary) {
        const ks_rollout_class *s = &r->source, *t = &r->target;
        int same = strcmp(s->key_id, t->key_id) == 0;
        fprintf(stderr, KS_PROG " %s: source key %s:%" PRIu32 " is still the primary of %s, so "
                "it cannot become decrypt-only; first run 'keyshift keys promote %s %" PRIu32
                "'%s, then advance again\n", cmd, s->key_id, s->key_version, s->key_id,
                s->key_id, same ? t->key_version : s->key_version + 1,
                same ? " (the target)" : " (or another active version of that key)");
        return EX_TEMPFAIL;
    }
    *retire = state == KS_KEY_ACTIVE;
    return EX_OK;
}

/* After finalizing: move the source key version to decrypt-only. */
static int retire_source(const ks_cli_keys *keys, const ks_rollout *r)
{
    const ks_rollout_class *s = &r->source;
    ks_bytes id = {(const uint8_t *)s->key_id, strlen(s->key_id)};
    const ks_provider_admin_ops *a = keys->prov.ops->admin;
    ks_err e = a == NULL ? KS_ERR_DENIED
                         : a->set_state(keys->prov.self, id, s->key_version, KS_KEY_DECRYPT_ONLY, 0);
    if (e != KS_OK) {
        ks_cli_error("rollout %" PRId64 " is finalized, but source key %s:%" PRIu32 " did not "
                     "become decrypt-only: %s; run 'keyshift keys set-state %s %" PRIu32
                     " decrypt-only'", r->id, s->key_id, s->key_version, ks_err_name(e),
                     s->key_id, s->key_version);
        return ks_cli_exit_code(e);
    }
    fprintf(stderr, KS_PROG ": source key %s:%" PRIu32 " is now decrypt-only\n", s->key_id,
            s->key_version);
    return EX_OK;
}

/* Gather what the guard of r -> to needs into f: key states (ctx), the
 * census, the health.  Facts not needed stay unknown. */
static int gather_facts(const ro_opts *o, ks_rollout_db *db, ks_ctx *ctx, const ks_rollout *r,
                        ks_rollout_phase to, ks_rollout_facts *f)
{
    int rc = EX_OK, primary;
    memset(f, 0, sizeof *f);
    f->now = (int64_t)time(NULL);
    if (r->phase == KS_PHASE_PLANNED && to == KS_PHASE_READ_COMPAT) {
        rc = key_fact(ctx, &r->target, &f->target_key_state, &primary);
    } else if (r->phase == KS_PHASE_FINALIZED && to == KS_PHASE_BACKFILL && ctx != NULL &&
               !r->source.is_plaintext) {
        rc = key_fact(ctx, &r->source, &f->source_key_state, &primary);
    } else if (r->phase == KS_PHASE_WRITE_UPGRADE && to == KS_PHASE_BACKFILL) {
        ks_health_sample sum;
        ks_health_verdict v;
        rc = health_of(db, r, f->now, &sum, &v);
        f->health_known = rc == EX_OK;
        f->health = v.status;
        char t[512];
        if (rc == EX_OK && v.status == KS_HEALTH_TRIPPED) {
            tripped_str(&v, &r->thresholds, t, sizeof t);
            fprintf(stderr, KS_PROG ": tripped: %s\n", t);
        } else if (rc == EX_OK && v.status == KS_HEALTH_INSUFFICIENT && v.no_data != 0) {
            no_data_str(&v, t, sizeof t);
            fprintf(stderr, KS_PROG ": no data in the window for: %s (disable a check the "
                    "application cannot feed with 'keyshift rollout set')\n", t);
        }
    } else if ((r->phase == KS_PHASE_BACKFILL && to == KS_PHASE_FINALIZED) ||
               (r->phase == KS_PHASE_READ_COMPAT && to == KS_PHASE_PLANNED)) {
        scope_census c;
        rc = census_of(o->db, r, &c);
        f->census_known = c.known;
        f->rows_at_source = c.at_source;
        f->rows_at_target = c.at_target;
    }
    return rc;
}

/* Set the canary of r for write-upgrade when it differs (logged). */
static int apply_canary(ks_rollout_db *db, const ks_rollout *r, const ks_rollout_canary *c,
                        const ro_opts *o)
{
    if (canary_equal(&r->canary, c)) {
        return EX_OK;
    }
    ks_err e = ks_rollout_db_set_canary(db, r->id, c, o->actor_buf, (int64_t)time(NULL));
    if (e != KS_OK) {
        ks_cli_error("cannot set the canary of rollout %" PRId64 ": %s", r->id,
                     e == KS_ERR_INVALID_ARGUMENT ? "invalid tenants (distinct, 1..64 bytes of "
                                                    "[A-Za-z0-9._:/@+=-])" : ks_err_name(e));
        return e == KS_ERR_INVALID_ARGUMENT ? EX_USAGE : ks_cli_exit_code(e);
    }
    return EX_OK;
}

/* The advance itself, with the database and keyring open. */
static int advance(const char *cmd, const ro_opts *o, ks_rollout_db *db, const ks_rollout *r,
                   const ks_cli_keys *keys, ks_ctx *ctx, const ks_rollout_canary *canary)
{
    ks_rollout_phase to = next_phase(r->phase);
    ks_rollout_facts f;
    int rc = gather_facts(o, db, ctx, r, to, &f), retire = 0;
    if (rc != EX_OK) {
        return rc;
    }
    if (to == KS_PHASE_FINALIZED && ctx != NULL && source_retires(r)) {
        /* the guard first (pure), so its refusal wins over key advice */
        char why[1024] = "";
        f.rollout = *r;
        f.is_latest = 1;
        ks_err e = ks_rollout_guard(&f, to, why, sizeof why);
        if (e != KS_OK) {
            return report_transition(cmd, r, to, e, why, o->json);
        }
        if ((rc = finalize_precheck(cmd, ctx, r, &retire)) != EX_OK) {
            return rc;
        }
    }
    if (to == KS_PHASE_WRITE_UPGRADE && (rc = apply_canary(db, r, canary, o)) != EX_OK) {
        return rc;
    }
    rc = transition(cmd, db, r, to, &f, o, 0, o->reason);
    if (rc == EX_OK && retire) {
        rc = retire_source(keys, r);
    } else if (rc == EX_OK && to == KS_PHASE_FINALIZED && source_retires(r) && ctx == NULL) {
        fprintf(stderr, KS_PROG ": source key %s:%" PRIu32 " was left as it is (no keyring); "
                "retire it with 'keyshift keys set-state %s %" PRIu32 " decrypt-only'\n",
                r->source.key_id, r->source.key_version, r->source.key_id, r->source.key_version);
    }
    return rc;
}

/* What a step (advance or rollback) does once the keyring is open. */
typedef int (*step_fn)(const char *cmd, const ro_opts *o, ks_rollout_db *db, const ks_rollout *r,
                       const ks_cli_keys *keys, ks_ctx *ctx, const ks_rollout_canary *canary);

/* Run step with the keyring open when the transition uses it (wanted:
 * only then, so a keyring that is not needed is never opened) and one is
 * named; a required one that is not named is a usage error saying why. */
static int with_keyring(const char *cmd, const ro_opts *o, int wanted, int required,
                        const char *why, ks_rollout_db *db, const ks_rollout *r,
                        const ks_rollout_canary *canary, step_fn step)
{
    ks_cli_keys keys = {0};
    ks_ctx *ctx = NULL;
    int opened = 0;
    int rc = wanted ? keyring_for(cmd, o, required, why, &keys, &opened, &ctx) : EX_OK;
    if (rc == EX_OK) {
        rc = step(cmd, o, db, r, opened ? &keys : NULL, ctx, canary);
    }
    ks_ctx_free(ctx);
    ks_cli_keys_close(&keys);
    return rc;
}

/* `rollout advance`. */
static int on_advance(const char *cmd, const ro_opts *o, ks_rollout_db *db, const ks_rollout *r)
{
    ks_rollout_canary canary;
    int given, rc = parse_canary(cmd, o, &canary, &given);
    ks_rollout_phase to = next_phase(r->phase);
    if (rc != EX_OK) {
        return rc;
    }
    if (to == 0) {
        ks_cli_error("rollout %" PRId64 " is finalized: there is no next phase", r->id);
        return EX_DATAERR;
    }
    if (given && to != KS_PHASE_WRITE_UPGRADE) {
        return ks_cli_usage_error(cmd, "--tenants, --percent and --all apply when entering "
                                       "write-upgrade; use 'keyshift rollout canary' to change it");
    }
    char why[KS_KEY_ID_MAX + 128];
    snprintf(why, sizeof why, "entering read-compat checks target key %s:%" PRIu32
             " with the keyring", r->target.key_id, r->target.key_version);
    int source_key = to == KS_PHASE_FINALIZED && source_retires(r);
    return with_keyring(cmd, o, to == KS_PHASE_READ_COMPAT || source_key,
                        to == KS_PHASE_READ_COMPAT, why, db, r, &canary, advance);
}

/* ---- rollback ---------------------------------------------------------------------- */

/* The one safe step back from p, or 0 from planned. */
static ks_rollout_phase back_phase(ks_rollout_phase p)
{
    switch (p) {
    case KS_PHASE_READ_COMPAT: return KS_PHASE_PLANNED;
    case KS_PHASE_WRITE_UPGRADE:
    case KS_PHASE_BACKFILL: return KS_PHASE_READ_COMPAT;
    case KS_PHASE_FINALIZED: return KS_PHASE_BACKFILL;
    default: return (ks_rollout_phase)0;
    }
}

/* The rollback step, with the keyring open when needed. */
static int rollback(const char *cmd, const ro_opts *o, ks_rollout_db *db, const ks_rollout *r,
                    const ks_cli_keys *keys, ks_ctx *ctx, const ks_rollout_canary *canary)
{
    (void)keys;
    (void)canary;
    ks_rollout_phase to = back_phase(r->phase);
    ks_rollout_facts f;
    int rc = gather_facts(o, db, ctx, r, to, &f);
    return rc == EX_OK ? transition(cmd, db, r, to, &f, o, 0, o->reason) : rc;
}

/* `rollout rollback`. */
static int on_rollback(const char *cmd, const ro_opts *o, ks_rollout_db *db, const ks_rollout *r)
{
    if (o->reason == NULL || o->reason[0] == '\0') {
        return ks_cli_usage_error(cmd, "--reason TEXT is required: say why, for the log");
    }
    ks_rollout_phase to = back_phase(r->phase);
    if (to == 0) {
        ks_cli_error("rollout %" PRId64 " is planned: there is nothing to roll back (start "
                     "another rollout instead)", r->id);
        return EX_DATAERR;
    }
    char why[KS_KEY_ID_MAX + 128];
    snprintf(why, sizeof why, "leaving finalized checks that source key %s:%" PRIu32
             " was not destroyed, with the keyring", r->source.key_id, r->source.key_version);
    int source_key = to == KS_PHASE_BACKFILL && !r->source.is_plaintext;
    return with_keyring(cmd, o, source_key, source_key, why, db, r, NULL, rollback);
}

/* ---- canary ------------------------------------------------------------------------- */

/* `rollout canary`. */
static int on_canary(const char *cmd, const ro_opts *o, ks_rollout_db *db, const ks_rollout *r)
{
    ks_rollout_canary c;
    int given, rc = parse_canary(cmd, o, &c, &given);
    if (rc != EX_OK) {
        return rc;
    }
    if (!given) {
        return ks_cli_usage_error(cmd, "give --tenants a,b, --percent N or --all");
    }
    int64_t now = (int64_t)time(NULL);
    ks_err e = ks_rollout_db_set_canary(db, r->id, &c, o->actor_buf, now);
    if (e == KS_OK && o->reason != NULL && o->reason[0] != '\0') {
        e = ks_rollout_db_note(db, r->id, o->actor_buf, o->reason, now);
    }
    char text[KS_ROLLOUT_TENANTS_MAX * (KS_TENANT_MAX + 1) + 16];
    canary_str(&c, text, sizeof text);
    if (e == KS_ERR_STATE) {
        ks_cli_error("rollout %" PRId64 " is finalized: its canary no longer applies", r->id);
        return EX_DATAERR;
    }
    if (e == KS_ERR_INVALID_ARGUMENT) {
        return ks_cli_usage_error(cmd, "invalid canary: tenants are distinct, 1..%d bytes of "
                                       "[A-Za-z0-9._:/@+=-]", KS_TENANT_MAX);
    }
    if (e != KS_OK) {
        ks_cli_error("cannot set the canary of rollout %" PRId64 ": %s", r->id, ks_err_name(e));
        return ks_cli_exit_code(e);
    }
    if (o->json) {
        printf("{\"rollout\":%" PRId64 ",\"phase\":\"%s\",\"canary\":", r->id,
               ks_rollout_phase_name((int)r->phase));
        put_str(text);
        printf("}\n");
    } else {
        printf("rollout %" PRId64 " (%s): canary %s\n", r->id, ks_rollout_phase_name((int)r->phase),
               text);
    }
    return EX_OK;
}

/* ---- abort -------------------------------------------------------------------------- */

/* `rollout abort`: end a rollout that has written its target nowhere
 * (planned; read-compat while the census shows no row at the target),
 * removing it so that its scope is free for a new start.  --reason is
 * required; the log keeps the actor, the reason and what the rollout
 * was. */
static int on_abort(const char *cmd, const ro_opts *o, ks_rollout_db *db, const ks_rollout *r)
{
    if (o->reason == NULL || o->reason[0] == '\0') {
        return ks_cli_usage_error(cmd, "--reason TEXT is required: say why, for the log");
    }
    if (strlen(o->reason) > KS_ROLLOUT_REASON_MAX - 16) {
        return ks_cli_usage_error(cmd, "--reason must be at most %d characters for an abort",
                                  KS_ROLLOUT_REASON_MAX - 16);
    }
    ks_rollout_facts f;
    memset(&f, 0, sizeof f);
    f.now = (int64_t)time(NULL);
    if (r->phase == KS_PHASE_READ_COMPAT) {
        scope_census c;
        int rc = census_of(o->db, r, &c);
        if (rc != EX_OK) {
            return rc;
        }
        f.census_known = c.known;
        f.rows_at_source = c.at_source;
        f.rows_at_target = c.at_target;
    }
    char why[1024] = "", scope[KS_ROLLOUT_SCOPE_TEXT_MAX];
    const char *phase = ks_rollout_phase_name((int)r->phase);
    ks_rollout_scope_text(r, scope, sizeof scope);
    ks_err e = ks_rollout_db_abort(db, r->id, r->phase, &f, o->actor_buf, o->reason, why,
                                   sizeof why);
    int rc = e == KS_ERR_STATE ? EX_DATAERR : ks_cli_exit_code(e);
    if (o->json) {
        printf("{\"rollout\":%" PRId64 ",\"phase\":\"%s\",\"result\":\"%s\",\"reason\":",
               r->id, phase, e == KS_OK ? "aborted" : ks_err_name(e));
        put_str(e == KS_OK ? "" : why[0] ? why : ks_err_name(e));
        printf(",\"exit\":%d}\n", rc);
    }
    if (e == KS_OK) {
        if (!o->json) {
            printf("rollout %" PRId64 " (%s) aborted in %s\n", r->id, scope, phase);
        }
        fprintf(stderr, KS_PROG ": %s is free for a new 'keyshift rollout start'; the log of "
                "rollout %" PRId64 " stays ('keyshift rollout log --db %s' shows it)\n", scope,
                r->id, o->db);
    } else if (e == KS_ERR_STALE) {
        fprintf(stderr, KS_PROG " %s: rollout %" PRId64 " was moved by someone else meanwhile; "
                "look at 'keyshift rollout status' and retry\n", cmd, r->id);
    } else {
        fprintf(stderr, KS_PROG " %s: rollout %" PRId64 " cannot be aborted: %s\n", cmd, r->id,
                why[0] ? why : ks_err_name(e));
    }
    return rc;
}

/* ---- set ---------------------------------------------------------------------------- */

/* `rollout set`: change the thresholds and soak times of a rollout that
 * is not finalized; the options not given keep their values.  Logged
 * with the old and new value of each change. */
static int on_set(const char *cmd, const ro_opts *o, ks_rollout_db *db, const ks_rollout *r)
{
    if (o->max_auth == NULL && o->max_parse == NULL && o->max_provider == NULL &&
        o->max_seal == NULL && o->max_open == NULL && o->min_samples == NULL &&
        o->window == NULL && o->min_soak == NULL && o->reader_ttl == NULL) {
        return ks_cli_usage_error(cmd, "give at least one threshold, --window, --min-soak or "
                                       "--reader-ttl to change");
    }
    ks_thresholds t = r->thresholds;
    uint32_t soak = r->min_soak_s, ttl = r->reader_ttl_s;
    int rc = parse_thresholds(cmd, o, &t);
    if (rc != EX_OK) {
        return rc;
    }
    if (o->min_soak != NULL && ks_cli_parse_duration(o->min_soak, &soak) != 0) {
        return ks_cli_usage_error(cmd, "--min-soak must be a duration (300, 300s, 5m, 1h)");
    }
    if (o->reader_ttl != NULL && (ks_cli_parse_duration(o->reader_ttl, &ttl) != 0 || ttl == 0)) {
        return ks_cli_usage_error(cmd, "--reader-ttl must be a duration of at least 1 s");
    }
    char changes[KS_ROLLOUT_REASON_MAX + 1] = "";
    ks_err e = ks_rollout_db_set_settings(db, r->id, &t, soak, ttl, o->actor_buf, o->reason,
                                          (int64_t)time(NULL), changes, sizeof changes);
    if (e == KS_ERR_STATE) {
        ks_cli_error("rollout %" PRId64 " is finalized: its thresholds no longer apply", r->id);
        return EX_DATAERR;
    }
    if (e != KS_OK) {
        ks_cli_error("cannot change the settings of rollout %" PRId64 ": %s", r->id,
                     ks_err_name(e));
        return e == KS_ERR_INVALID_ARGUMENT ? EX_USAGE : ks_cli_exit_code(e);
    }
    if (o->json) {
        printf("{\"rollout\":%" PRId64 ",\"phase\":\"%s\",\"changes\":", r->id,
               ks_rollout_phase_name((int)r->phase));
        put_str(changes);
        printf("}\n");
    } else {
        printf("rollout %" PRId64 " (%s): %s\n", r->id, ks_rollout_phase_name((int)r->phase),
               changes[0] ? changes : "nothing changed");
    }
    return EX_OK;
}

/* ---- readers ------------------------------------------------------------------------ */

/* Every registered reader, live or not, into a malloc'd array. */
static int all_readers(ks_rollout_db *db, int64_t now, ks_rollout_reader **out, size_t *n)
{
    size_t cap = 16;
    for (;;) {
        ks_rollout_reader *rs = calloc(cap, sizeof *rs);
        if (rs == NULL) {
            ks_cli_error("out of memory");
            return EX_OSERR;
        }
        ks_err e = ks_rollout_db_readers_live(db, UINT32_MAX, now, rs, cap, n);
        if (e == KS_OK) {
            *out = rs;
            return EX_OK;
        }
        free(rs);
        if (e != KS_ERR_BUFFER_TOO_SMALL || *n <= cap) {
            ks_cli_error("cannot read the reader registry: %s", ks_err_name(e));
            return ks_cli_exit_code(e);
        }
        cap = *n;
    }
}

/* The algorithms of a reader as "aes-256-gcm,xchacha20-poly1305". */
static void algs_str(uint32_t bits, char *out, size_t cap)
{
    size_t used = 0;
    out[0] = '\0';
    for (uint32_t a = 1; a < 32 && used < cap; a++) {
        if ((bits & (1u << a)) != 0 && ks_alg_name(a) != NULL) {
            used += (size_t)snprintf(out + used, cap - used, "%s%s", used ? "," : "", ks_alg_name(a));
        }
    }
}

/* Print the readers: live when their heartbeat is within ttl of now;
 * with target (not NULL), whether each supports it. */
static void print_readers(const ks_rollout_reader *rs, size_t n, int64_t now, uint32_t ttl,
                          const ks_rollout_class *target, int json)
{
    if (!json) {
        printf("readers      %zu registered (live: heartbeat within %" PRIu32 " s)\n", n, ttl);
        if (n > 0) {
            printf("  %-24s %-5s %-7s %-6s %-8s %-10s %s\n", "INSTANCE", "LIVE", "AGE_S", "FORMAT",
                   "TARGET", "LIBRARY", "KEYS");
        }
    }
    for (size_t i = 0; i < n; i++) {
        const ks_rollout_reader *r = &rs[i];
        int live = r->heartbeat >= now - (int64_t)ttl;
        int sup = target != NULL && ks_rollout_reader_supports(r, target);
        char algs[64];
        algs_str(r->algorithms, algs, sizeof algs);
        if (json) {
            printf("%s{\"instance_id\":", i ? "," : "");
            put_str(r->instance_id);
            printf(",\"library_version\":");
            put_str(r->library_version);
            printf(",\"max_format\":%u,\"algorithms\":", (unsigned)r->max_format);
            put_str(algs);
            printf(",\"keys\":");
            put_str(r->keys);
            printf(",\"started\":%" PRId64 ",\"heartbeat\":%" PRId64 ",\"age_s\":%" PRId64
                   ",\"live\":%s", r->started, r->heartbeat, now - r->heartbeat,
                   live ? "true" : "false");
            if (target != NULL) {
                printf(",\"supports_target\":%s", sup ? "true" : "false");
            }
            printf("}");
        } else {
            printf("  %-24s %-5s %-7" PRId64 " v%-5u %-8s %-10s %s\n", r->instance_id,
                   live ? "yes" : "no", now - r->heartbeat, (unsigned)r->max_format,
                   target == NULL ? "-" : sup ? "yes" : "NO",
                   r->library_version[0] ? r->library_version : "-", r->keys[0] ? r->keys : "-");
        }
    }
}

/* `rollout readers`. */
static int cmd_readers(int argc, char **argv)
{
    static const char cmd[] = "rollout readers";
    ro_opts o;
    int rc;
    if (parse(cmd, argc, argv, "--reader-ttl", &o, &rc)) {
        return rc;
    }
    uint32_t ttl = DEFAULT_READER_TTL_S;
    if (o.reader_ttl != NULL && ks_cli_parse_duration(o.reader_ttl, &ttl) != 0) {
        return ks_cli_usage_error(cmd, "--reader-ttl must be a duration (60, 60s, 1m)");
    }
    ks_rollout_db *db;
    if ((rc = ks_cli_rollout_open(o.db, 1, &db)) != EX_OK) {
        return rc;
    }
    int64_t now = (int64_t)time(NULL);
    ks_rollout_reader *rs = NULL;
    size_t n = 0;
    if ((rc = all_readers(db, now, &rs, &n)) == EX_OK) {
        if (o.json) {
            printf("{\"reader_ttl_s\":%" PRIu32 ",\"readers\":[", ttl);
        }
        print_readers(rs, n, now, ttl, NULL, o.json);
        if (o.json) {
            printf("]}\n");
        }
    }
    free(rs);
    ks_rollout_db_close(db);
    return rc;
}

/* ---- log ------------------------------------------------------------------------------ */

/* The whole log of rollout id into a malloc'd array. */
static int read_log(ks_rollout_db *db, int64_t id, ks_rollout_log_entry **out, size_t *n)
{
    size_t cap = 32, len = 0;
    ks_rollout_log_entry *es = NULL;
    int64_t after = 0;
    for (;;) {
        if (len + 32 > cap || es == NULL) {
            cap = es == NULL ? cap : cap * 2;
            ks_rollout_log_entry *ne = realloc(es, cap * sizeof *ne);
            if (ne == NULL) {
                free(es);
                ks_cli_error("out of memory");
                return EX_OSERR;
            }
            es = ne;
        }
        size_t got = 0;
        ks_err e = ks_rollout_db_log(db, id, after, es + len, 32, &got);
        if (e != KS_OK) {
            free(es);
            ks_cli_error("cannot read the log of rollout %" PRId64 ": %s", id, ks_err_name(e));
            return ks_cli_exit_code(e);
        }
        len += got;
        if (got < 32) {
            break;
        }
        after = es[len - 1].id;
    }
    *out = es;
    *n = len;
    return EX_OK;
}

/* Print log entries es[0, n): JSON array members, or lines. */
static void print_log(const ks_rollout_log_entry *es, size_t n, int json)
{
    for (size_t i = 0; i < n; i++) {
        const ks_rollout_log_entry *e = &es[i];
        const char *from = e->from ? ks_rollout_phase_name(e->from) : NULL;
        const char *to = ks_rollout_phase_name(e->to);
        char when[32];
        ks_cli_format_time(e->time, when, sizeof when);
        if (json) {
            printf("%s{\"id\":%" PRId64 ",\"time\":%" PRId64 ",\"actor\":", i ? "," : "", e->id,
                   e->time);
            put_str(e->actor);
            printf(",\"from\":");
            if (from != NULL) {
                printf("\"%s\"", from);
            } else {
                fputs("null", stdout);
            }
            printf(",\"to\":\"%s\",\"reason\":", to ? to : "?");
            put_str(e->reason);
            printf(",\"automatic\":%s}", e->automatic ? "true" : "false");
        } else {
            printf("  %s  %-24s %-13s -> %-13s %s%s\n", when, e->actor, from ? from : "(new)",
                   to ? to : "?", e->automatic ? "[automatic] " : "", e->reason);
        }
    }
}

/* `rollout log`. */
static int on_log(const char *cmd, const ro_opts *o, ks_rollout_db *db, const ks_rollout *r)
{
    int rc;
    size_t limit = SIZE_MAX;
    if (o->limit != NULL && ks_cli_parse_size(o->limit, 1, SIZE_MAX, &limit) != 0) {
        return ks_cli_usage_error(cmd, "--limit must be a number from 1");
    }
    ks_rollout_log_entry *es = NULL;
    size_t n = 0;
    if ((rc = read_log(db, r->id, &es, &n)) == EX_OK) {
        size_t first = n > limit ? n - limit : 0;
        if (o->json) {
            printf("{\"rollout\":%" PRId64 ",", r->id);
            print_scope(r, 1);
            printf(",\"log\":[");
        } else {
            char scope[KS_ROLLOUT_SCOPE_TEXT_MAX];
            printf("log of rollout %" PRId64 " (%s)\n", r->id,
                   ks_rollout_scope_text(r, scope, sizeof scope));
        }
        print_log(es + first, n - first, o->json);
        if (o->json) {
            printf("]}\n");
        }
    }
    free(es);
    return rc;
}

/* `rollout log --rollout ID` of a rollout that no longer exists (it was
 * aborted; its log stays): EX_NOINPUT when the log has no row of it
 * either. */
static int log_of_aborted(const char *cmd, const ro_opts *o)
{
    size_t id, limit = SIZE_MAX, n = 0;
    if (ks_cli_parse_size(o->rollout, 1, INT64_MAX, &id) != 0) {
        return ks_cli_usage_error(cmd, "--rollout must be a rollout id (a number from 1)");
    }
    if (o->limit != NULL && ks_cli_parse_size(o->limit, 1, SIZE_MAX, &limit) != 0) {
        return ks_cli_usage_error(cmd, "--limit must be a number from 1");
    }
    ks_rollout_db *db;
    ks_rollout_log_entry *es = NULL;
    int rc = ks_cli_rollout_open(o->db, 1, &db);
    if (rc == EX_OK) {
        rc = read_log(db, (int64_t)id, &es, &n);
        ks_rollout_db_close(db);
    }
    if (rc == EX_OK && n == 0) {
        ks_cli_error("no rollout %zu in %s (see 'keyshift rollout status --db %s')", id, o->db,
                     o->db);
        rc = EX_NOINPUT;
    }
    if (rc == EX_OK) {
        size_t first = n > limit ? n - limit : 0;
        if (o->json) {
            printf("{\"rollout\":%zu,\"aborted\":true,\"log\":[", id);
        } else {
            printf("log of rollout %zu (aborted)\n", id);
        }
        print_log(es + first, n - first, o->json);
        if (o->json) {
            printf("]}\n");
        }
    }
    free(es);
    return rc;
}

/* ---- status --------------------------------------------------------------------------- */

/* Print the counts of one column or of the scope: a JSON object (no
 * closing brace), or a line after label. */
static void print_counts(const census_counts *k, int json, const char *label)
{
    if (json) {
        printf("{\"rows\":%" PRIu64 ",\"null\":%" PRIu64 ",\"at_source\":%" PRIu64
               ",\"at_target\":%" PRIu64 ",\"other\":%" PRIu64, k->rows, k->null_rows,
               k->at_source, k->at_target, k->other);
        return;
    }
    printf("%s%" PRIu64 " rows: %" PRIu64 " at the source, %" PRIu64 " at the target, %" PRIu64
           " other, %" PRIu64 " NULL\n", label, k->rows, k->at_source, k->at_target, k->other,
           k->null_rows);
}

/* Print the census of r's scope (JSON member value, or lines): the sums,
 * then, for a key scope, each column ("columns" in JSON). */
static void print_census(const ks_rollout *r, const scope_census *c, int json)
{
    if (!c->known) {
        fputs(json ? "null" : "census       unavailable (see the error above)\n", stdout);
        return;
    }
    census_counts total = {c->rows, c->null_rows, c->at_source, c->at_target, c->other};
    print_counts(&total, json, "census       ");
    if (json && c->n_cols > 0) {
        printf(",\"columns\":[");
    }
    for (size_t i = 0; i < c->n_cols; i++) {
        char label[2 * KS_ROLLOUT_IDENT_MAX + 16];
        snprintf(label, sizeof label, "  %s.%s: ", r->columns[i].table, r->columns[i].column);
        if (json) {
            printf("%s", i > 0 ? "," : "");
            print_counts(&c->cols[i], 1, NULL);
            printf(",\"table\":");
            put_str(r->columns[i].table);
            printf(",\"column\":");
            put_str(r->columns[i].column);
            printf("}");
        } else {
            print_counts(&c->cols[i], 0, label);
        }
    }
    if (json) {
        printf("%s}", c->n_cols > 0 ? "]" : "");
    }
}

/* Print everything status shows about r. */
static int print_status(const ro_opts *o, ks_rollout_db *db, const ks_rollout *r)
{
    int64_t now = (int64_t)time(NULL);
    ks_rollout_reader *rs = NULL;
    ks_rollout_log_entry *es = NULL;
    size_t nr = 0, ne = 0;
    ks_health_sample sum, mig;
    ks_health_verdict v;
    scope_census c;
    int rc = all_readers(db, now, &rs, &nr);
    if (rc == EX_OK) {
        rc = health_of(db, r, now, &sum, &v);
    }
    if (rc == EX_OK) {
        rc = window_of(db, r, now, "migrate", &mig);
    }
    if (rc == EX_OK) {
        rc = read_log(db, r->id, &es, &ne);
    }
    if (rc != EX_OK) {
        free(rs);
        return rc;
    }
    int crc = census_of(o->db, r, &c); /* a missing table still shows the rest */
    size_t first = ne > STATUS_LOG_ENTRIES ? ne - STATUS_LOG_ENTRIES : 0;
    if (o->json) {
        printf("{");
        print_rollout(r, now, 1);
        printf(",\"census\":");
        print_census(r, &c, 1);
        printf(",\"health\":");
        print_health(&sum, &v, &r->thresholds, 1);
        printf(",\"migration\":");
        print_migration(&mig, r->thresholds.window_s, 1);
        printf(",\"readers\":[");
        print_readers(rs, nr, now, r->reader_ttl_s, &r->target, 1);
        printf("],\"log\":[");
        print_log(es + first, ne - first, 1);
        printf("]}\n");
    } else {
        print_rollout(r, now, 0);
        print_census(r, &c, 0);
        print_health(&sum, &v, &r->thresholds, 0);
        print_migration(&mig, r->thresholds.window_s, 0);
        print_readers(rs, nr, now, r->reader_ttl_s, &r->target, 0);
        printf("log          last %zu of %zu entries\n", ne - first, ne);
        print_log(es + first, ne - first, 0);
    }
    free(rs);
    free(es);
    return crc;
}

/* `rollout status`. */
static int on_status(const char *cmd, const ro_opts *o, ks_rollout_db *db, const ks_rollout *r)
{
    (void)cmd;
    return print_status(o, db, r);
}

/* ---- check ------------------------------------------------------------------------------ */

/* Exit codes of `rollout check` (monitoring-plugin convention). */
enum { CHECK_HEALTHY = 0, CHECK_ROLLED_BACK = 1, CHECK_TRIPPED = 2, CHECK_INSUFFICIENT = 3 };

/* Roll r back to read-compat after a trip, logged as automatic with the
 * tripped checks as reason.  Returns the check's exit code. */
static int auto_rollback(const ro_opts *o, ks_rollout_db *db, const ks_rollout *r,
                         const char *tripped)
{
    if (r->phase != KS_PHASE_WRITE_UPGRADE && r->phase != KS_PHASE_BACKFILL) {
        fprintf(stderr, KS_PROG " rollout check: no safe automatic rollback from %s; act by "
                "hand ('keyshift rollout rollback')\n", ks_rollout_phase_name((int)r->phase));
        return CHECK_TRIPPED;
    }
    char reason[KS_ROLLOUT_REASON_MAX + 1];
    snprintf(reason, sizeof reason, "auto-rollback: %s", tripped);
    ks_rollout_facts f;
    memset(&f, 0, sizeof f);
    f.now = (int64_t)time(NULL);
    char why[1024] = "";
    ks_rollout_change c = {r->id, r->phase, KS_PHASE_READ_COMPAT, o->actor_buf, reason, 1};
    ks_err e = ks_rollout_db_transition(db, &c, &f, why, sizeof why);
    if (e != KS_OK) {
        ks_cli_error("automatic rollback of rollout %" PRId64 " failed: %s", r->id,
                     why[0] ? why : ks_err_name(e));
        return CHECK_TRIPPED;
    }
    fprintf(stderr, KS_PROG " rollout check: rolled rollout %" PRId64 " back from %s to "
            "read-compat\n", r->id, ks_rollout_phase_name((int)r->phase));
    return CHECK_ROLLED_BACK;
}

/* `rollout check`. */
static int on_check(const char *cmd, const ro_opts *o, ks_rollout_db *db, const ks_rollout *r)
{
    ks_health_sample sum;
    ks_health_verdict v;
    int rc = health_of(db, r, (int64_t)time(NULL), &sum, &v);
    (void)cmd;
    if (rc != EX_OK) {
        return rc;
    }
    char tripped[KS_ROLLOUT_REASON_MAX - 32];
    tripped_str(&v, &r->thresholds, tripped, sizeof tripped);
    rc = v.status == KS_HEALTH_OK ? CHECK_HEALTHY
         : v.status == KS_HEALTH_INSUFFICIENT ? CHECK_INSUFFICIENT
         : o->auto_rollback ? auto_rollback(o, db, r, tripped) : CHECK_TRIPPED;
    const char *result[] = {"healthy", "tripped, rolled back to read-compat",
                            "tripped, not rolled back", "insufficient data"};
    if (o->json) {
        printf("{\"rollout\":%" PRId64 ",\"phase\":\"%s\",\"result\":\"%s\",\"exit\":%d,"
               "\"health\":", r->id, ks_rollout_phase_name((int)r->phase), result[rc], rc);
        print_health(&sum, &v, &r->thresholds, 1);
        printf("}\n");
    } else {
        char scope[KS_ROLLOUT_SCOPE_TEXT_MAX];
        printf("rollout %" PRId64 " (%s, %s): %s\n", r->id,
               ks_rollout_scope_text(r, scope, sizeof scope),
               ks_rollout_phase_name((int)r->phase), result[rc]);
        if (v.status == KS_HEALTH_TRIPPED) {
            printf("tripped      %s\n", tripped);
        }
        if (v.status == KS_HEALTH_INSUFFICIENT && v.no_data != 0) {
            char nd[256];
            no_data_str(&v, nd, sizeof nd);
            printf("no data      %s\n", nd);
        }
        print_health(&sum, &v, &r->thresholds, 0);
    }
    return rc;
}

/* ---- metrics ------------------------------------------------------------------------------ */

/* Append name="value" (escaped) to labels[0, cap) at *used. */
static int add_label(char *labels, size_t cap, size_t *used, const char *name, const char *value)
{
    char esc[2 * KS_KEY_ID_MAX + 2]; /* the longest value: a key id */
    size_t n;
    if (ks_health_prometheus_label_escape(value, esc, sizeof esc, &n) != KS_OK) {
        return -1;
    }
    int w = snprintf(labels + *used, cap - *used, "%s%s=\"%s\"", *used ? "," : "", name, esc);
    if (w < 0 || (size_t)w >= cap - *used) {
        return -1;
    }
    *used += (size_t)w;
    return 0;
}

/* Render the rollout's exposition into a malloc'd *out (NUL-terminated,
 * length *len): the cumulative totals of its stored samples by source,
 * its phase, then its thresholds and the guard's verdict on the window. */
static int render_prometheus(const ks_rollout *r, const ks_health_sample *app,
                             const ks_health_sample *mig, const ks_health_verdict *v, char **out,
                             size_t *len)
{
    char labels[4 * (2 * KS_ROLLOUT_IDENT_MAX + 16) + 2 * KS_KEY_ID_MAX + 16], id[24];
    char app_l[sizeof labels + 16], mig_l[sizeof labels + 20];
    size_t used = 0;
    snprintf(id, sizeof id, "%" PRId64, r->id);
    if (add_label(labels, sizeof labels, &used, "rollout", id) != 0 ||
        add_label(labels, sizeof labels, &used, "scope",
                  r->scope == KS_SCOPE_KEY ? "key" : "column") != 0 ||
        add_label(labels, sizeof labels, &used, "table", r->table) != 0 ||
        add_label(labels, sizeof labels, &used, "column", r->column) != 0 ||
        (r->scope == KS_SCOPE_KEY &&
         add_label(labels, sizeof labels, &used, "key_id", r->source.key_id) != 0)) {
        ks_cli_error("cannot build the metric labels");
        return EX_SOFTWARE;
    }
    snprintf(app_l, sizeof app_l, "%s,source=\"app\"", labels);
    snprintf(mig_l, sizeof mig_l, "%s,source=\"migrate\"", labels);
    const ks_metrics_series series[2] = {{app_l, app}, {mig_l, mig}};
    const char *phases[KS_PHASE_FINALIZED];
    for (int i = 0; i < KS_PHASE_FINALIZED; i++) {
        phases[i] = ks_rollout_phase_name(i + 1);
    }
    *out = NULL;
    for (int pass = 0; pass < 2; pass++) {
        size_t cap = pass == 0 ? 0 : *len + 1, hlen = 0;
        ks_metrics_buf b;
        ks_metrics_begin(&b, *out, cap);
        ks_metrics_write_totals(&b, series, 2);
        ks_metrics_write_phase(&b, labels, phases, KS_PHASE_FINALIZED, (size_t)r->phase - 1);
        size_t mlen = 0;
        ks_err e = ks_metrics_end(&b, &mlen);
        if (e == KS_OK || e == KS_ERR_BUFFER_TOO_SMALL) {
            e = ks_health_prometheus(app, &r->thresholds, v, labels,
                                     pass == 0 ? NULL : *out + mlen, pass == 0 ? 0 : cap - mlen,
                                     &hlen);
        }
        if (e != KS_OK && !(pass == 0 && e == KS_ERR_BUFFER_TOO_SMALL)) {
            ks_cli_error("cannot write the metrics: %s", ks_err_name(e));
            free(*out);
            *out = NULL;
            return ks_cli_exit_code(e);
        }
        *len = mlen + hlen;
        if (pass == 0 && (*out = malloc(*len + 1)) == NULL) {
            ks_cli_error("out of memory");
            return EX_OSERR;
        }
    }
    return EX_OK;
}

/* The name of the rollout's file in a textfile collector's directory. */
#define TEXTFILE_NAME_FMT "keyshift_rollout_%" PRId64 ".prom"

/* Print (or, with --textfile, write atomically) the Prometheus text of r:
 * totals since the rollout began (every stored sample, by source), its
 * phase, its thresholds and the verdict on its window. */
static int print_prometheus(const ks_rollout *r, const ks_health_sample *app,
                            const ks_health_sample *mig, const ks_health_verdict *v,
                            const char *textfile)
{
    char *text = NULL;
    size_t len = 0;
    int rc = render_prometheus(r, app, mig, v, &text, &len);
    if (rc != EX_OK) {
        return rc;
    }
    if (textfile != NULL) {
        char name[64];
        snprintf(name, sizeof name, TEXTFILE_NAME_FMT, r->id);
        rc = ks_cli_textfile_write(textfile, name, text, len);
    } else {
        rc = ks_cli_write_stdout((const uint8_t *)text, len);
    }
    free(text);
    return rc;
}

/* `rollout metrics`. */
static int on_metrics(const char *cmd, const ro_opts *o, ks_rollout_db *db, const ks_rollout *r)
{
    if (o->textfile != NULL && !o->prometheus) {
        return ks_cli_usage_error(cmd, "--textfile needs --prometheus");
    }
    if (o->prometheus == o->json) {
        return ks_cli_usage_error(cmd, "give --prometheus or --json");
    }
    ks_health_sample sum;
    ks_health_verdict v;
    int64_t now = (int64_t)time(NULL);
    int rc = health_of(db, r, now, &sum, &v);
    if (rc != EX_OK) {
        return rc;
    }
    ks_health_sample mig;
    if ((rc = window_of(db, r, now, "migrate", &mig)) != EX_OK) {
        return rc;
    }
    if (o->prometheus) {
        /* Counters: every sample stored since the rollout began. */
        ks_health_sample app_all, mig_all;
        if ((rc = totals_of(db, r, "app", &app_all)) != EX_OK ||
            (rc = totals_of(db, r, "migrate", &mig_all)) != EX_OK) {
            return rc;
        }
        return print_prometheus(r, &app_all, &mig_all, &v, o->textfile);
    }
    printf("{");
    print_rollout(r, now, 1);
    printf(",\"health\":");
    print_health(&sum, &v, &r->thresholds, 1);
    printf(",\"migration\":");
    print_migration(&mig, r->thresholds.window_s, 1);
    printf("}\n");
    return EX_OK;
}

/* ---- dispatch ----------------------------------------------------------------------------- */

/* A subcommand that works on one selected rollout. */
typedef int (*on_rollout_fn)(const char *cmd, const ro_opts *o, ks_rollout_db *db,
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
     WRITES_ALWAYS, on_advance},
    {"rollback", "--reason --actor --keyring --passphrase-file --providers", WRITES_ALWAYS,
     on_rollback},
    {"canary", "--tenants --percent --all --actor --reason", WRITES_ALWAYS, on_canary},
    {"abort", "--reason --actor", WRITES_ALWAYS, on_abort},
    {"set", "--max-auth-failure-rate --max-parse-error-rate --max-provider-error-rate "
            "--max-seal-p99-us --max-open-p99-us --min-samples --window --min-soak --reader-ttl "
            "--actor --reason",
     WRITES_ALWAYS, on_set},
    {"status", "", WRITES_NEVER, on_status},
    {"log", "--limit", WRITES_NEVER, on_log},
    {"check", "--auto-rollback --actor", WRITES_WITH_AUTO_ROLLBACK, on_check},
    {"metrics", "--prometheus --textfile", WRITES_NEVER, on_metrics},
};

/* Parse the options of subcommand i of on_rollout_cmds, open the
 * database, select the rollout and run the subcommand on it. */
static int run_on_rollout(size_t i, int argc, char **argv)
{
    char cmd[32], allowed[512];
    ro_opts o;
    int rc;
    snprintf(cmd, sizeof cmd, "rollout %s", on_rollout_cmds[i].name);
    snprintf(allowed, sizeof allowed, "--rollout --table --column --key-id %s",
             on_rollout_cmds[i].options);
    if (parse(cmd, argc, argv, allowed, &o, &rc)) {
        return rc;
    }
    if (on_rollout_cmds[i].run == on_log && o.rollout != NULL && o.table == NULL &&
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
            return log_of_aborted(cmd, &o);
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
        return cmd_start(argc - 1, argv + 1);
    }
    if (strcmp(argv[1], "readers") == 0) {
        return cmd_readers(argc - 1, argv + 1);
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
