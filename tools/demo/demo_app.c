/*
 * tools/demo/demo_app.c -- keyshift-demo-app: an application process that reads
 * and writes one column of a SQLite or PostgreSQL database the way a
 * service embedding libkeyshift does, obeying the rollouts under way
 * (docs/rollout.md, "The demo application").
 *
 * It is an example of the application API (keyshift/app.h,
 * docs/embedding.md): the row SQL is its own, behind tools/demo/demo_app.h
 * (demo_app_sqlite.c, demo_app_pg.c); everything keyshift does is one
 * ks_app.  ks_app_open opens the keyring, registers the instance and
 * starts the thread that reloads the keyring, re-registers the key
 * versions held, refreshes the heartbeat and reports health every
 * --reload-ms.  Each operation picks a random row, asks ks_app_may_read
 * whether its value may be read, opens an envelope with
 * ks_app_open_value, and now and then writes a new value sealed by
 * ks_app_seal_update.  At the end it prints counts, never a plaintext, a
 * DEK or an AAD, and exits 65 if any read failed.
 */
#define _POSIX_C_SOURCE 200809L

#include <inttypes.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <sodium.h>

#include <keyshift/app.h>

#include "../cli/cli.h"
#include "demo_app.h"

#define PROG "keyshift-demo-app"
#define NAMES_MAX 16                 /* distinct names counted, then "other" */
#define NAME_LEN (KS_KEY_ID_MAX + 48) /* "v2:xchacha20-poly1305:" KEY_ID ":" VERSION */

/* Set by SIGINT/SIGTERM; the loop stops after the current operation. */
static volatile sig_atomic_t stop_requested;
/* Set by SIGUSR1; the loop prints the summary so far after the current
 * operation. */
static volatile sig_atomic_t summary_requested;

/* Manual of keyshift-demo-app. */
static void usage(FILE *f)
{
    fputs("NAME\n"
          "    keyshift-demo-app - an application process that reads and writes an\n"
          "    encrypted column under the rollouts of its database\n"
          "\n"
          "SYNOPSIS\n"
          "    keyshift-demo-app --db DB --table T --column C [--id-column I]\n"
          "        --tenant-column COL --context TEMPLATE --purpose P --instance NAME\n"
          "        --keyring FILE [--passphrase-file FILE] [--max-format 1|2]\n"
          "        [--key-id K] [--encoding binary|base64]\n"
          "        [--ops N | --seconds S] [--write-percent P] [--rate N] [--seed N]\n"
          "        [--reload-ms MS] [--json]\n"
          "\n"
          "DESCRIPTION\n"
          "    Behaves like one instance of a service that embeds libkeyshift, so\n"
          "    that rollouts (docs/rollout.md) can be exercised and demonstrated\n"
          "    with real processes, and as an example of the application API\n"
          "    (docs/embedding.md): it opens one ks_app on the keyring and the\n"
          "    database (registering NAME in keyshift_readers with the key\n"
          "    versions it holds), then repeats one operation:\n"
          "\n"
          "    read   pick a random row (seeded PRNG); read its value and tenant;\n"
          "           ask whether the value may be read (ks_app_may_read); if so,\n"
          "           open an envelope (ks_app_open_value) with the rendered\n"
          "           context, the row's tenant and, for format-2 envelopes only,\n"
          "           the purpose (format 1 has none), and check that the plaintext\n"
          "           is a JSON object (whose \"id\", if any, is the row's).\n"
          "           Plaintext values are read as they are.\n"
          "           An envelope of a format above --max-format is not opened, as\n"
          "           an older build could not (counted as unsupported-version).\n"
          "    write  with probability --write-percent, build a new plaintext (a\n"
          "           JSON object with the row id, this instance and a counter), ask\n"
          "           the rollout what to write for the row's tenant, and UPDATE the\n"
          "           row (autocommit; a lock is waited for up to 10 s) with the\n"
          "           plaintext, or an envelope sealed with exactly the class the\n"
          "           rollout names (format, algorithm, key_id, key_version;\n"
          "           ks_app_seal_update). When no rollout governs the column the\n"
          "           value keeps its current form: a plaintext stays plaintext, an\n"
          "           envelope is sealed again in its own class; a NULL or\n"
          "           unreadable value is not written. With --key-id K the rollout\n"
          "           is asked by key, as a column that a key-scoped rollout covers\n"
          "           requires.\n"
          "\n"
          "    DB is a SQLite file or a PostgreSQL connection string (see --db). On\n"
          "    PostgreSQL the rollout state is in the same database (docs/rollout.md,\n"
          "    \"Rollout state on PostgreSQL\"), and the instance's own SQL goes\n"
          "    through libpq on a session of its own: rows are\n"
          "    picked and updated by the id column (--id-column, else the table's\n"
          "    one-column primary key; a smallint, integer or bigint, as `keyshift\n"
          "    migrate` requires), the column is bytea, every value is a bound\n"
          "    parameter and the session's lock_timeout is 10 s. A lost connection\n"
          "    fails the operation that meets it (a database error) and the next\n"
          "    one reconnects.\n"
          "\n"
          "    With --encoding base64 the column holds envelopes as their canonical\n"
          "    base64 text, which begins \"S1NF\" (docs/format.md section 10): a\n"
          "    SQLite TEXT column, a PostgreSQL text or varchar one (instead of\n"
          "    bytea). ks_app seals and opens in the column's encoding, which a\n"
          "    rollout covering the column records (keyshift rollout start\n"
          "    --encoding); --encoding must then be the rollout's (exit 64\n"
          "    otherwise), and it is the form of a column no rollout covers.\n"
          "\n"
          "    Every MS milliseconds (--reload-ms) the ks_app's background thread\n"
          "    reopens the keyring when the file changed (versions the operator\n"
          "    added or retired are seen), and when the key versions held (every\n"
          "    version in state active or decrypt-only) changed, registers them;\n"
          "    then it refreshes the heartbeat and reports the growth of the seal\n"
          "    and open counters and latency histograms to every rollout under way\n"
          "    (docs/embedding.md, \"The background thread\").\n"
          "\n"
          "    On SIGUSR1 it prints the summary so far (below) and goes on; the\n"
          "    counts only grow, so two of them give what happened in between.\n"
          "    It stops after N operations, after S seconds, or on SIGTERM or SIGINT\n"
          "    (after finishing the current operation); without --ops or --seconds\n"
          "    it runs until signalled. It then closes the ks_app (which reports\n"
          "    once more and deregisters) and prints a summary on standard output:\n"
          "    operations, reads (plaintext,\n"
          "    envelope, NULL, with no rollout), reads refused by the policy, open\n"
          "    failures by error name, writes by class, failed and skipped writes,\n"
          "    the key versions held and the keyring reloads. A read is FAILED when\n"
          "    the policy refused it (or could not answer), or when a stored\n"
          "    envelope did not open to a well-formed plaintext. Nothing secret is\n"
          "    ever printed: no plaintext, no DEK, no AAD.\n"
          "\n"
          "OPTIONS\n"
          "    --db DB                " KS_CLI_DB_RULE
          "    --table T, --column C  the table and its encrypted column\n"
          "    --id-column I          the column whose value {id} renders (default: the\n"
          "          rowid); INTEGER as decimal, TEXT as is, BLOB as lowercase hex.\n"
          "          PostgreSQL: the integer column rows are picked and updated by\n"
          "          (default: the one-column primary key), in decimal.\n"
          "          A --context binding {id} needs a stable id, as `keyshift\n"
          "          migrate` does: never the bare rowid of a SQLite table\n"
          "          without an INTEGER PRIMARY KEY (VACUUM renumbers it)\n"
          "    --tenant-column COL    the column holding each row's tenant\n"
          "    --context TEMPLATE     the context bound into each envelope, e.g.\n"
          "          'payments:{id}:card': only {id} is substituted; '{{' and\n"
          "          '}}' are literal braces (the same rendering as `keyshift\n"
          "          migrate`)\n"
          "    --purpose P            the purpose of format-2 envelopes\n"
          "    --instance NAME        this instance's id in keyshift_readers (1..128\n"
          "          characters of [A-Za-z0-9._:-])\n"
          "    --keyring FILE         the local keyring (default: $KEYSHIFT_KEYRING)\n"
          "    --passphrase-file FILE keyring passphrase (default: $KEYSHIFT_PASSPHRASE);\n"
          "          " KS_CLI_PASSPHRASE_RULE "\n"
          "    --max-format 1|2       the highest envelope format this instance reads\n"
          "          and registers (default 2)\n"
          "    --key-id K             the key it writes with: ask what to write for K\n"
          "          (needed where a key-scoped rollout covers the column)\n"
          "    --encoding E           how the column holds envelopes: binary (the\n"
          "          default; BLOB, bytea) or base64 (TEXT; text or varchar)\n"
          "    --ops N                stop after N operations\n"
          "    --seconds S            stop after S seconds\n"
          "    --write-percent P      percent of operations that also write (0..100,\n"
          "          default 10)\n"
          "    --rate N               at most N operations per second (default: as fast\n"
          "          as it can)\n"
          "    --seed N               the PRNG seed (default: from the time and pid;\n"
          "          printed in the summary)\n"
          "    --reload-ms MS         keyring reload, heartbeat and health report period\n"
          "          (default 500; also the policy's refresh period)\n"
          "    --json                 print the summary as one JSON object on one line\n"
          "    -h, --help             print this manual\n"
          "\n"
          "ENVIRONMENT\n"
          "    KEYSHIFT_KEYRING, KEYSHIFT_PASSPHRASE  the defaults of --keyring and\n"
          "                --passphrase-file\n"
          KS_CLI_PG_ENV
          "\n"
          "EXIT STATUS\n"
          "    0   no read failed\n"
          "    65  at least one read failed (refused by the policy, or an envelope\n"
          "        that did not open to a well-formed plaintext)\n"
          "    74  no read failed, but database errors kept some operations from\n"
          "        running\n"
          "    64  usage error (also a password in a PostgreSQL --db, a PostgreSQL\n"
          "        column of the wrong type, or a --context binding {id} to an\n"
          "        unstable id: unstable-id, or an --encoding other than the\n"
          "        rollout's); 66 no such database, table or column,\n"
          "        an id column that is not unique and NOT NULL, or an empty table;\n"
          "        69 the PostgreSQL server cannot be reached;\n"
          "        78 keyring insecure, unreadable, corrupt or wrong passphrase;\n"
          "        others as `keyshift --help` lists\n"
          "\n"
          "EXAMPLES\n"
          "    keyshift-demo-app --db shop.db --table payments --column card \\\n"
          "        --tenant-column tenant --context 'payments:{id}:card' \\\n"
          "        --purpose card --instance web-1 --keyring keyring --seconds 60\n"
          "    keyshift-demo-app --db 'postgresql://app@db.internal/shop' \\\n"
          "        --table payments --column card --tenant-column tenant \\\n"
          "        --context 'payments:{id}:card' --purpose card --instance web-2 \\\n"
          "        --keyring keyring --seconds 60\n",
          f);
}

/* ---- counting --------------------------------------------------------------- */

/* Counts by name (error names, classes): the first NAMES_MAX names, then
 * "other". */
typedef struct name_counts {
    size_t n;
    char name[NAMES_MAX + 1][NAME_LEN];
    uint64_t count[NAMES_MAX + 1];
} name_counts;

/* Add one to name's count. */
static void count_name(name_counts *c, const char *name)
{
    for (size_t i = 0; i < c->n; i++) {
        if (strcmp(c->name[i], name) == 0) {
            c->count[i]++;
            return;
        }
    }
    size_t i = c->n < NAMES_MAX ? c->n : NAMES_MAX;
    if (i == c->n) {
        snprintf(c->name[i], NAME_LEN, "%s", i < NAMES_MAX ? name : "other");
        c->n++;
    }
    c->count[i]++;
}

/* The sum of every count. */
static uint64_t total(const name_counts *c)
{
    uint64_t t = 0;
    for (size_t i = 0; i < c->n; i++) {
        t += c->count[i];
    }
    return t;
}

/* What the summary reports. */
typedef struct stats {
    uint64_t ops, reads, reads_plaintext, reads_envelope, reads_null, reads_no_rollout;
    uint64_t reads_refused, writes_skipped, db_errors;
    name_counts open_failures;  /* by error name; "malformed-plaintext" when it opened */
    name_counts policy_errors;  /* the policy could not answer a read: by error name */
    name_counts writes;         /* by class */
    name_counts write_failures; /* by error name */
} stats;

/* ---- the application ------------------------------------------------------- */

/* Options as given. */
typedef struct app_opts {
    const char *db, *table, *column, *id_column, *tenant_column, *context, *purpose;
    const char *instance, *keyring, *passfile, *max_format, *ops, *seconds, *write_percent;
    const char *rate, *seed, *reload_ms, *key_id, *encoding;
    int json;
} app_opts;

/* One running instance. */
typedef struct app {
    app_opts o;
    uint8_t max_format;
    uint64_t max_ops;       /* 0: no limit */
    double seconds;         /* 0: no limit */
    uint32_t write_percent, rate, reload_ms;
    uint64_t seed, rng;
    int pg;                  /* --db is a PostgreSQL connection string */
    ks_value_encoding encoding; /* --encoding: how the column holds envelopes */
    demo_db *db;
    ks_app *ka;              /* keys, rollouts, registration: keyshift's part */
    uint64_t counter;        /* writes made, for the plaintexts */
    stats s;
    ks_app_stats bg;         /* the background thread's counts, at the end */
    char keys[KS_READER_KEYS_MAX + 1]; /* the key versions registered, at the end */
} app;

/* The row of the current operation, as far as keyshift needs it: its
 * id, and the tenant and context bound into its envelopes. */
typedef struct row_view {
    int id_is_int;                       /* the id is an INTEGER: id_int */
    long long id_int;
    uint8_t context[KS_CONTEXT_MAX + 1]; /* one byte more than valid: a context
                                            that does not fit stays invalid */
    uint8_t tenant[KS_TENANT_MAX + 1];   /* likewise for an over-long tenant */
    ks_app_record rec;                   /* the table, column, tenant and context */
} row_view;

/* splitmix64: a small, seedable PRNG (not for secrets: it picks rows). */
static uint64_t next_random(app *a)
{
    uint64_t z = (a->rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Monotonic seconds. */
static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Stop the loop after the current operation (SIGINT, SIGTERM), or
 * print the summary so far after it (SIGUSR1). */
static void on_signal(int sig)
{
    if (sig == SIGUSR1) {
        summary_requested = 1;
    } else {
        stop_requested = 1;
    }
}

/* Write class c as "plaintext" or "vF:ALG:KEY_ID:VERSION" (the notation
 * of `keyshift rollout start`) into out. */
static void class_name(const ks_rollout_class *c, char out[NAME_LEN])
{
    if (c->is_plaintext) {
        snprintf(out, NAME_LEN, "plaintext");
        return;
    }
    const char *alg = ks_alg_name(c->algorithm);
    snprintf(out, NAME_LEN, "v%u:%s:%s:%" PRIu32, (unsigned)c->version, alg ? alg : "?", c->key_id,
             c->key_version);
}

/* ---- the row's context --------------------------------------------------- */

/* Render the context template (only {id}; "{{" and "}}" literal) for
 * the id of row into out; its length goes to *len.  Nonzero when it does
 * not fit. */
static int render_context(const app *a, const demo_row *row, uint8_t *out, size_t *len)
{
    static const char hex[] = "0123456789abcdef";
    char idbuf[32];
    const uint8_t *id = row->id;
    size_t id_len = row->id_kind == DEMO_ID_NULL ? 0 : row->id_len, n = 0;
    int hexify = row->id_kind == DEMO_ID_BLOB;
    if (row->id_kind == DEMO_ID_INT) {
        id_len = (size_t)snprintf(idbuf, sizeof idbuf, "%lld", row->id_int);
        id = (const uint8_t *)idbuf;
    }
    for (const char *t = a->o.context; *t != '\0'; t++) {
        if ((t[0] == '{' && t[1] == '{') || (t[0] == '}' && t[1] == '}')) {
            t++;
        } else if (t[0] == '{') { /* "{id}": the only name the options admit */
            for (size_t i = 0; i < id_len; i++) {
                if (n + 2 > KS_CONTEXT_MAX) {
                    return 1;
                }
                if (hexify) {
                    out[n++] = (uint8_t)hex[id[i] >> 4];
                    out[n++] = (uint8_t)hex[id[i] & 15];
                } else {
                    out[n++] = id[i];
                }
            }
            t += 3;
            continue;
        }
        if (n + 1 > KS_CONTEXT_MAX) {
            return 1;
        }
        out[n++] = (uint8_t)*t;
    }
    *len = n;
    return 0;
}

/* ---- one operation -------------------------------------------------------- */

/* Nonzero when pt[0, len) is a JSON object (by its outer braces, with no
 * control bytes) whose "id" member, when it has one and the row id is an
 * integer, is the row's id. */
static int well_formed(const row_view *r, const uint8_t *pt, size_t len)
{
    if (len < 2 || pt[0] != '{' || pt[len - 1] != '}') {
        return 0;
    }
    for (size_t i = 0; i < len; i++) {
        if (pt[i] < 0x20) {
            return 0;
        }
    }
    static const char key[] = "\"id\":";
    const size_t klen = sizeof key - 1;
    if (!r->id_is_int) {
        return 1;
    }
    for (size_t i = 0; i + klen <= len; i++) {
        if (memcmp(pt + i, key, klen) == 0) {
            long long got = 0;
            size_t j = i + klen, digits = 0;
            int neg = j < len && pt[j] == '-';
            for (j += (size_t)neg; j < len && pt[j] >= '0' && pt[j] <= '9' && digits < 18;
                 j++, digits++) {
                got = got * 10 + (pt[j] - '0');
            }
            return digits > 0 && (neg ? -got : got) == r->id_int;
        }
    }
    return 1;
}

/* Open envelope v[0, len) of row r (ks_app_open_value: the phase, the
 * format this instance reads, the tenant, context and purpose) and
 * check its plaintext; the name of the failure, or NULL. */
static const char *open_value(app *a, const row_view *r, const uint8_t *v, size_t len)
{
    uint8_t *pt = malloc(len); /* a cap of len always suffices */
    if (pt == NULL) {
        return ks_err_name(KS_ERR_NO_MEMORY);
    }
    size_t pt_len = 0;
    const char *failure = NULL;
    ks_err e = ks_app_open_value(a->ka, &r->rec, v, len, pt, len, &pt_len, NULL, NULL);
    if (e != KS_OK) {
        failure = ks_err_name(e);
    } else if (!well_formed(r, pt, pt_len)) {
        failure = "malformed-plaintext";
    }
    sodium_memzero(pt, len);
    free(pt);
    return failure;
}

/* Nonzero when v[0, len) is to be opened rather than read as plaintext:
 * it begins "KSE" (a binary envelope) or, in a base64 column, "S1NF" (a
 * text envelope; a binary one there is malformed [F-TEXT-4], and opening
 * it reports so). */
static int is_envelope(const app *a, const uint8_t *v, size_t len)
{
    int magic = len >= 3 && v[0] == KS_MAGIC_0 && v[1] == KS_MAGIC_1 && v[2] == KS_MAGIC_2;
    return magic || (a->encoding == KS_ENCODING_BASE64 && ks_envelope_text_is_candidate(v, len));
}

/* Read the picked row's value (v NULL: SQL NULL): ask whether it may be
 * read, then open it.  With no rollout governing the column every value
 * is read (the application's own rule: plaintext as it is). */
static void read_value(app *a, const row_view *r, const uint8_t *v, size_t len)
{
    int ok = 0;
    a->s.reads++;
    ks_err e = ks_app_may_read(a->ka, a->o.table, a->o.column, v, len, &ok);
    if (e == KS_ERR_NOT_FOUND) {
        a->s.reads_no_rollout++;
        ok = 1;
    } else if (e != KS_OK) {
        count_name(&a->s.policy_errors, ks_err_name(e));
        return;
    }
    if (!ok) {
        a->s.reads_refused++;
    } else if (v == NULL) {
        a->s.reads_null++;
    } else if (!is_envelope(a, v, len)) {
        a->s.reads_plaintext++;
    } else {
        a->s.reads_envelope++;
        const char *failure = open_value(a, r, v, len);
        if (failure != NULL) {
            count_name(&a->s.open_failures, failure);
        }
    }
}

/* Seal a new plaintext for row r to replace its value prev[0, prev_len)
 * (NULL: SQL NULL) in what ks_app_seal_update names (the rollout's class,
 * else prev's own form) into *out (malloc'd), its class to *c.  KS_OK,
 * KS_ERR_NO_ROLLOUT when nothing says what to write, or the error. */
static ks_err seal_new(app *a, const row_view *r, const uint8_t *prev, size_t prev_len,
                       uint8_t **out, size_t *out_len, ks_rollout_class *c)
{
    char pt[256];
    int n;
    if (r->id_is_int) {
        n = snprintf(pt, sizeof pt, "{\"id\":%lld,\"writer\":\"%s\",\"n\":%" PRIu64 "}",
                     r->id_int, a->o.instance, ++a->counter);
    } else {
        n = snprintf(pt, sizeof pt, "{\"writer\":\"%s\",\"n\":%" PRIu64 "}", a->o.instance,
                     ++a->counter);
    }
    size_t pt_len = n > 0 && (size_t)n < sizeof pt ? (size_t)n : 0;
    size_t cap = ks_app_seal_max_len(pt_len);
    *out = pt_len > 0 ? malloc(cap) : NULL;
    ks_err e = pt_len == 0 ? KS_ERR_BUFFER_TOO_SMALL : *out == NULL ? KS_ERR_NO_MEMORY : KS_OK;
    if (e == KS_OK) {
        e = ks_app_seal_update(a->ka, &r->rec, prev, prev_len, (const uint8_t *)pt, pt_len, *out,
                               cap, out_len, c);
    }
    sodium_memzero(pt, sizeof pt);
    return e;
}

/* Keep what keyshift needs of the picked row in *r: its id, tenant and
 * rendered context, as a record of the column. */
static void keep_row(const app *a, const demo_row *row, row_view *r)
{
    r->id_is_int = row->id_kind == DEMO_ID_INT;
    r->id_int = r->id_is_int ? row->id_int : 0;
    size_t clen = 0;
    if (render_context(a, row, r->context, &clen) != 0) {
        clen = KS_CONTEXT_MAX + 1; /* refused by every seal and open */
    }
    size_t tl = row->tenant != NULL ? row->tenant_len : 0;
    tl = tl < sizeof r->tenant ? tl : sizeof r->tenant;
    if (tl > 0) {
        memcpy(r->tenant, row->tenant, tl);
    }
    r->rec = (ks_app_record){a->o.table, a->o.column, {r->tenant, tl}, {r->context, clen},
                             {NULL, 0}};
}

/* One operation: pick a row, read it, and maybe write it.  The new
 * value is sealed while the row is picked (the seal needs its stored
 * value) and written once the pick is released: in SQLite's WAL mode a
 * read transaction that another connection wrote past cannot become a
 * write one. */
static void run_op(app *a)
{
    demo_db *db = a->db;
    uint64_t span = (uint64_t)(db->max_key - db->min_key) + 1;
    int64_t start = db->min_key + (int64_t)(span ? next_random(a) % span : 0);
    int write = next_random(a) % 100 < a->write_percent;
    a->s.ops++;
    demo_row row;
    int rc = db->ops->pick(db, start, &row);
    if (rc == 0) { /* past the last row (rows were deleted): wrap */
        rc = db->ops->pick(db, db->min_key, &row);
    }
    if (rc != 1) {
        if (rc < 0) {
            a->s.db_errors++;
            ks_cli_error("SELECT: %s", db->ops->errmsg(db));
        }
        db->ops->release(db);
        return;
    }
    row_view r;
    keep_row(a, &row, &r);
    int64_t key = row.key;
    const uint8_t *v = row.value_null ? NULL : row.value;
    size_t len = row.value_null ? 0 : row.value_len;
    read_value(a, &r, v, len);
    uint8_t *out = NULL;
    size_t out_len = 0;
    ks_rollout_class c;
    ks_err e = write ? seal_new(a, &r, v, len, &out, &out_len, &c) : KS_ERR_NOT_FOUND;
    db->ops->release(db); /* ends the read snapshot before the UPDATE */
    if (e == KS_OK) {
        int blob = !c.is_plaintext && a->encoding == KS_ENCODING_BINARY;
        if (db->ops->update(db, key, out, out_len, blob) != 0) {
            a->s.db_errors++;
            ks_cli_error("UPDATE: %s", db->ops->errmsg(db));
        } else {
            char name[NAME_LEN];
            class_name(&c, name);
            count_name(&a->s.writes, name);
        }
    } else if (e == KS_ERR_NO_ROLLOUT) { /* no rollout, and a NULL or unreadable value */
        a->s.writes_skipped++;
    } else if (write) {
        count_name(&a->s.write_failures, ks_err_name(e));
    }
    if (out != NULL) {
        sodium_memzero(out, out_len); /* a plaintext written as it is */
        free(out);
    }
}

/* ---- options, summary, main ------------------------------------------------ */

/* Check the parsed options and turn them into a's settings; EX_OK or
 * EX_USAGE after a message. */
static int check_opts(app *a)
{
    const app_opts *o = &a->o;
    if (!o->db || !o->table || !o->column || !o->tenant_column || !o->context || !o->purpose ||
        !o->instance) {
        return ks_cli_usage_error(NULL, "--db, --table, --column, --tenant-column, --context, "
                                        "--purpose and --instance are required");
    }
    if (o->ops != NULL && o->seconds != NULL) {
        return ks_cli_usage_error(NULL, "give --ops or --seconds, not both");
    }
    int rc = ks_cli_db_check(o->db, &a->pg); /* a connection string: no password */
    if (rc != EX_OK) {
        return rc;
    }
    const char *idents[] = {o->table, o->column, o->tenant_column, o->id_column};
    for (size_t i = 0; i < sizeof idents / sizeof idents[0]; i++) {
        size_t len = idents[i] != NULL ? strlen(idents[i]) : 1;
        if (len == 0 || len > KS_ROLLOUT_IDENT_MAX) {
            return ks_cli_usage_error(NULL, "a table or column name has 1 to %d bytes",
                                      KS_ROLLOUT_IDENT_MAX);
        }
    }
    size_t fmt, ops, secs, wp, rate, reload, seed;
    const size_t now_pid = ((size_t)time(NULL) << 20) ^ (size_t)getpid();
    const struct {
        const char *name, *value;
        size_t lo, hi, dflt, *out;
    } nums[] = {
        {"--max-format", o->max_format, 1, 2, KS_FORMAT_V2, &fmt},
        {"--ops", o->ops, 1, SIZE_MAX, 0, &ops},
        {"--seconds", o->seconds, 1, 31u * 24 * 3600, 0, &secs},
        {"--write-percent", o->write_percent, 0, 100, 10, &wp},
        {"--rate", o->rate, 1, 1000000, 0, &rate},
        {"--reload-ms", o->reload_ms, 10, 3600000, 500, &reload},
        {"--seed", o->seed, 0, SIZE_MAX, now_pid, &seed},
    };
    for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++) {
        *nums[i].out = nums[i].dflt;
        if (nums[i].value != NULL &&
            ks_cli_parse_size(nums[i].value, nums[i].lo, nums[i].hi, nums[i].out) != 0) {
            return ks_cli_usage_error(NULL, "%s must be a number from %zu to %zu", nums[i].name,
                                      nums[i].lo, nums[i].hi);
        }
    }
    a->max_format = (uint8_t)fmt;
    a->max_ops = ops;
    a->seconds = (double)secs;
    a->write_percent = (uint32_t)wp;
    a->rate = (uint32_t)rate;
    a->reload_ms = (uint32_t)reload;
    a->seed = seed;
    a->rng = a->seed;
    int erc = ks_cli_parse_encoding(NULL, o->encoding, &a->encoding);
    if (erc != EX_OK) {
        return erc;
    }
    const char *names[KS_ROWSTORE_MAX_CONTEXT_COLUMNS];
    char storage[KS_CONTEXT_TEMPLATE_MAX];
    size_t n = 0;
    if (ks_context_template_columns((ks_bytes){(const uint8_t *)o->context, strlen(o->context)},
                                    names, storage, &n) != KS_OK ||
        n != 0) {
        return ks_cli_usage_error(NULL, "--context: a template of at most %d bytes in which "
                                        "only {id} is substituted ('{{' and '}}' for braces)",
                                  KS_CONTEXT_TEMPLATE_MAX);
    }
    return EX_OK;
}

/* Parse the options into a.  Returns 0 to go on; otherwise the program
 * is over (help printed, or a usage error) and *rc is its exit code. */
static int parse(app *a, int argc, char **argv, int *rc)
{
    app_opts *o = &a->o;
    int npos = 0;
    const ks_cli_opt opts[] = {
        {"--db", &o->db, NULL},
        {"--table", &o->table, NULL},
        {"--column", &o->column, NULL},
        {"--id-column", &o->id_column, NULL},
        {"--tenant-column", &o->tenant_column, NULL},
        {"--context", &o->context, NULL},
        {"--purpose", &o->purpose, NULL},
        {"--instance", &o->instance, NULL},
        {"--keyring", &o->keyring, NULL},
        {"--passphrase-file", &o->passfile, NULL},
        {"--max-format", &o->max_format, NULL},
        {"--ops", &o->ops, NULL},
        {"--seconds", &o->seconds, NULL},
        {"--write-percent", &o->write_percent, NULL},
        {"--rate", &o->rate, NULL},
        {"--seed", &o->seed, NULL},
        {"--reload-ms", &o->reload_ms, NULL},
        {"--key-id", &o->key_id, NULL},
        {"--encoding", &o->encoding, NULL},
        {"--json", NULL, &o->json},
        {NULL, NULL, NULL},
    };
    if (ks_cli_parse_opts(NULL, usage, argc, argv, opts, NULL, 0, &npos, rc)) {
        return 1;
    }
    *rc = check_opts(a);
    return *rc != EX_OK;
}

/* Print counts as "name n, name n" (text) or {"name":n,...} (JSON). */
static void put_counts(FILE *f, const name_counts *c, int json)
{
    if (json) {
        fputc('{', f);
    }
    for (size_t i = 0; i < c->n; i++) {
        if (json) {
            ks_cli_put_json_string(f, (const uint8_t *)c->name[i], strlen(c->name[i]));
            fprintf(f, ":%" PRIu64 "%s", c->count[i], i + 1 < c->n ? "," : "");
        } else {
            fprintf(f, "%s%s %" PRIu64, i ? ", " : "", c->name[i], c->count[i]);
        }
    }
    fputs(json ? "}" : (c->n ? "" : "none"), f);
}

/* The number of failed reads: refused, unanswered or not opened. */
static uint64_t failed_reads(const stats *s)
{
    return s->reads_refused + total(&s->policy_errors) + total(&s->open_failures);
}

/* Print the summary on standard output. */
static void summary(const app *a, double elapsed)
{
    const stats *s = &a->s;
    const ks_app_stats *bg = &a->bg;
    FILE *f = stdout;
    if (a->o.json) {
        const struct {
            const char *key;
            uint64_t v;
        } nums[] = {
            {"ops", s->ops}, {"reads", s->reads}, {"reads_plaintext", s->reads_plaintext},
            {"reads_envelope", s->reads_envelope}, {"reads_null", s->reads_null},
            {"reads_no_rollout", s->reads_no_rollout}, {"reads_refused", s->reads_refused},
            {"failed_reads", failed_reads(s)}, {"writes_total", total(&s->writes)},
            {"writes_skipped", s->writes_skipped}, {"key_changes", bg->key_changes},
            {"keyring_reloads", bg->key_reloads}, {"reload_errors", bg->reload_errors},
            {"heartbeat_errors", bg->heartbeat_errors}, {"report_errors", bg->report_errors},
            {"db_errors", s->db_errors},
        };
        const struct {
            const char *key;
            const name_counts *c;
        } groups[] = {
            {"policy_errors", &s->policy_errors}, {"open_failures", &s->open_failures},
            {"writes", &s->writes}, {"write_failures", &s->write_failures},
        };
        fputs("{\"instance\":", f);
        ks_cli_put_json_string(f, (const uint8_t *)a->o.instance, strlen(a->o.instance));
        fprintf(f, ",\"seed\":%" PRIu64 ",\"seconds\":%.3f", a->seed, elapsed);
        for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++) {
            fprintf(f, ",\"%s\":%" PRIu64, nums[i].key, nums[i].v);
        }
        for (size_t i = 0; i < sizeof groups / sizeof groups[0]; i++) {
            fprintf(f, ",\"%s\":", groups[i].key);
            put_counts(f, groups[i].c, 1);
        }
        fprintf(f, ",\"keys\":\"%s\"}\n", a->keys);
        return;
    }
    fprintf(f, PROG " %s: %" PRIu64 " operations in %.1f s (seed %" PRIu64 ")\n", a->o.instance,
            s->ops, elapsed, a->seed);
    fprintf(f, "  reads: %" PRIu64 " (plaintext %" PRIu64 ", envelopes %" PRIu64 ", NULL %" PRIu64
               "; %" PRIu64 " with no rollout)\n",
            s->reads, s->reads_plaintext, s->reads_envelope, s->reads_null, s->reads_no_rollout);
    fprintf(f, "  refused by the policy: %" PRIu64 "; policy errors: ", s->reads_refused);
    put_counts(f, &s->policy_errors, 0);
    fputs("\n  open failures: ", f);
    put_counts(f, &s->open_failures, 0);
    fprintf(f, "\n  writes: %" PRIu64 ": ", total(&s->writes));
    put_counts(f, &s->writes, 0);
    fputs("\n  write failures: ", f);
    put_counts(f, &s->write_failures, 0);
    fprintf(f, "; skipped (no rollout, value NULL or unreadable): %" PRIu64 "\n",
            s->writes_skipped);
    fprintf(f, "  key versions held: %s (%" PRIu64 " changes; keyring reloads %" PRIu64
               ", reload errors %" PRIu64 ")\n",
            a->keys[0] ? a->keys : "none", bg->key_changes, bg->key_reloads, bg->reload_errors);
    fprintf(f, "  heartbeat errors %" PRIu64 ", report errors %" PRIu64 ", database errors %" PRIu64
               "\n",
            bg->heartbeat_errors, bg->report_errors, s->db_errors);
    fprintf(f, "  result: %" PRIu64 " failed reads\n", failed_reads(s));
}

/* Sleep until monotonic time t (or a signal). */
static void sleep_until(double t)
{
    double d = t - now_s();
    if (d > 0) {
        struct timespec ts = {(time_t)d, (long)((d - (double)(time_t)d) * 1e9)};
        nanosleep(&ts, NULL);
    }
}

/* Take the background thread's counters and the key versions held into
 * a, for the summary. */
static void take_stats(app *a)
{
    ks_app_stats_get(a->ka, &a->bg);
    if (ks_app_keys(a->ka, a->keys, sizeof a->keys) != KS_OK) {
        a->keys[0] = '\0';
    }
}

/* The loop: operations until the count, the time or a signal (the
 * periodic work is the ks_app's background thread); the summary so far
 * after each SIGUSR1. */
static void run(app *a)
{
    double start = now_s(), next_op = start;
    while (!stop_requested && (a->max_ops == 0 || a->s.ops < a->max_ops) &&
           (a->seconds == 0 || now_s() - start < a->seconds)) {
        if (a->rate != 0) {
            sleep_until(next_op);
            next_op += 1.0 / a->rate;
            if (stop_requested) {
                break;
            }
        }
        run_op(a);
        if (summary_requested) {
            summary_requested = 0;
            take_stats(a);
            summary(a, now_s() - start);
            fflush(stdout);
        }
    }
}

/* Open a's ks_app: the keyring (--keyring, else $KEYSHIFT_KEYRING) with
 * its passphrase, and the rollouts of the database, registering the
 * instance.  EX_OK, or an exit code after a message. */
static int app_open(app *a)
{
    const char *keyring = a->o.keyring;
    ks_bytes pass;
    int rc = ks_cli_keyring_args(&keyring, a->o.passfile, &pass);
    if (rc != EX_OK) {
        return rc;
    }
    ks_app_options o;
    memset(&o, 0, sizeof o);
    o.keyring = keyring;
    o.passphrase = pass;
    o.database = a->o.db;
    o.instance_id = a->o.instance;
    o.max_format = a->max_format;
    o.interval_ms = a->reload_ms;
    o.default_key_id = a->o.key_id; /* asks a key-scoped rollout by key */
    o.purpose = a->o.purpose;
    o.default_encoding = a->encoding;
    char msg[512];
    ks_err e = ks_app_open(&o, &a->ka, msg, sizeof msg);
    ks_cli_passphrase_free(&pass); /* the ks_app keeps its own copy */
    if (e != KS_OK) {
        ks_cli_error("%s", msg);
        return ks_cli_exit_code(e);
    }
    ks_value_encoding enc = KS_ENCODING_BINARY;
    e = ks_app_column_encoding(a->ka, a->o.table, a->o.column, &enc);
    rc = EX_OK;
    if (e == KS_OK && enc != a->encoding) {
        ks_cli_error("a rollout records %s.%s as of %s encoding: give --encoding %s",
                     a->o.table, a->o.column, ks_value_encoding_name((int)enc),
                     ks_value_encoding_name((int)enc));
        rc = EX_USAGE;
    } else if (e != KS_OK) {
        ks_cli_error("cannot tell the encoding of %s.%s: %s", a->o.table, a->o.column,
                     ks_err_name(e));
        rc = ks_cli_exit_code(e);
    }
    if (rc != EX_OK) { /* deregisters the instance it just registered */
        ks_app_close(a->ka);
        a->ka = NULL;
    }
    return rc;
}

/* Refuse, as `keyshift migrate run` does, a --context that binds {id}
 * to a row id that VACUUM or a dump/restore would renumber: open the
 * target read-only through the row store, which checks the id as a
 * migration does, and ks_cli_check_context.  EX_OK, or an exit code
 * after a message. */
static int check_target(const app *a)
{
    ks_rowstore_target t = {.table = a->o.table, .column = a->o.column,
                            .id_column = a->o.id_column, .tenant_column = a->o.tenant_column,
                            .encoding = a->encoding};
    ks_rowstore store;
    int rc = ks_cli_store_open(a->o.db, &t, 1, 0, KS_SQLITE_SYNC_FULL, &store);
    if (rc == EX_OK) {
        rc = ks_cli_check_context(NULL, &store, a->o.table, a->o.context);
        ks_rowstore_close(&store);
    }
    return rc;
}

/* Set up the database and the ks_app; run; close; report. */
int main(int argc, char **argv)
{
    static app a; /* large (name tables): not on the stack */
    ks_cli_set_prog(PROG);
    int rc = EX_OK;
    if (parse(&a, argc, argv, &rc)) {
        return rc;
    }
    if (sodium_init() < 0) { /* before the passphrase's sodium_malloc */
        ks_cli_error("cannot initialise libsodium");
        return EX_OSERR;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);

    const demo_target tg = {a.o.db,          a.o.table,         a.o.column, a.o.id_column,
                            a.o.tenant_column, a.encoding == KS_ENCODING_BASE64};
    rc = a.pg ? demo_db_pg_open(&tg, &a.db) : demo_db_sqlite_open(&tg, &a.db);
    if (rc == EX_OK) {
        rc = check_target(&a); /* before any read, write or registration */
    }
    if (rc == EX_OK) {
        rc = app_open(&a);
    }
    if (rc == EX_OK) {
        double start = now_s();
        run(&a);
        take_stats(&a);
        ks_app_close(a.ka); /* the last report, then deregistration */
        if (a.bg.last_error != KS_OK) {
            ks_cli_error("background work failed %" PRIu64 " times, the last with %s",
                         a.bg.heartbeat_errors + a.bg.report_errors + a.bg.reload_errors,
                         ks_err_name(a.bg.last_error));
        }
        summary(&a, now_s() - start);
        rc = failed_reads(&a.s) > 0 ? EX_DATAERR : a.s.db_errors > 0 ? EX_IOERR : EX_OK;
    }
    if (a.db != NULL) {
        a.db->ops->close(a.db);
    }
    return rc;
}
