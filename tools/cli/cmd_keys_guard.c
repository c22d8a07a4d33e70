/*
 * tools/cli/cmd_keys_guard.c -- the guard of `keyshift keys set-state KEY_ID
 * VERSION destroyed`: find what still uses the version in the databases
 * named with --db (rows of rollout and migration scopes, live readers,
 * rollouts not finalized) and refuse, or with --force log the forced
 * destruction in each.
 */
#define _POSIX_C_SOURCE 200809L

#include <inttypes.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include <sqlite3.h>

#include <keyshift/rowstore_pg.h>

#include "cmd_keys.h"

/* Collect every --db FILE / --db=FILE of argv (before "--") into d, since
 * the option parser keeps only the last value of an option. */
int ks_cli_collect_dbs(int argc, char **argv, ks_cli_destroy_opts *d)
{
    for (int i = 1; i < argc && strcmp(argv[i], "--") != 0; i++) {
        const char *v = NULL;
        if (strcmp(argv[i], "--db") == 0 && i + 1 < argc) {
            v = argv[++i];
        } else if (strncmp(argv[i], "--db=", 5) == 0) {
            v = argv[i] + 5;
        } else if (strcmp(argv[i], "--reason") == 0 || strcmp(argv[i], "--keyring") == 0 ||
                   strcmp(argv[i], "--passphrase-file") == 0) {
            i++; /* skip its value */
        }
        if (v != NULL) {
            if (d->n_dbs == (int)(sizeof d->dbs / sizeof d->dbs[0])) {
                return ks_cli_usage_error("keys", "more than 16 --db options were given; run the "
                                                  "command with at most 16");
            }
            d->dbs[d->n_dbs++] = v;
        }
    }
    return EX_OK;
}

/* A column to count, once. */
typedef struct scope {
    char table[KS_ROLLOUT_IDENT_MAX + 1], column[KS_ROLLOUT_IDENT_MAX + 1];
    ks_value_encoding encoding; /* how its census reads it: a rollout's record; else for
                                   PostgreSQL the column's type, for SQLite binary (and
                                   base64 too: scope_key_rows) */
} scope;

/* Add table.column to scopes[0, *n) unless there (names compared as
 * the database compares identifiers: SQLite without regard to ASCII
 * case, PostgreSQL exactly, when exact, since its store opens a table by
 * its exact spelling); a column that does not fit (a full list, a name
 * too long) sets *cut, so that the rows are known not to be all counted
 * (fail closed: the destroy is then refused unless forced). */
static void add_scope(scope *scopes, size_t *n, size_t max, const char *t, const char *c,
                      ks_value_encoding encoding, int exact, int *cut)
{
    for (size_t i = 0; i < *n; i++) {
        if (exact ? strcmp(scopes[i].table, t) == 0 && strcmp(scopes[i].column, c) == 0
                  : strcasecmp(scopes[i].table, t) == 0 && strcasecmp(scopes[i].column, c) == 0) {
            return;
        }
    }
    if (*n < max && strlen(t) <= KS_ROLLOUT_IDENT_MAX && strlen(c) <= KS_ROLLOUT_IDENT_MAX) {
        memcpy(scopes[*n].table, t, strlen(t) + 1);
        memcpy(scopes[*n].column, c, strlen(c) + 1);
        scopes[*n].encoding = encoding;
        (*n)++;
    } else {
        *cut = 1;
    }
}

/* Add the columns the keyshift_migration of SQLite file db has
 * checkpoints for (read-only; none when the table does not exist). */
static int sqlite_migration_scopes(const char *db, scope *scopes, size_t *n, size_t max, int *cut)
{
    sqlite3 *h = NULL;
    sqlite3_stmt *st = NULL;
    int r = sqlite3_open_v2(db, &h, SQLITE_OPEN_READONLY, NULL);
    if (r == SQLITE_OK) {
        sqlite3_busy_timeout(h, 30000);
        r = sqlite3_prepare_v2(h, "SELECT DISTINCT tbl, col FROM keyshift_migration", -1, &st,
                               NULL);
        if (r != SQLITE_OK && sqlite3_prepare_v2(h, "SELECT 1 FROM sqlite_master WHERE name = "
                                                    "'keyshift_migration'", -1, &st, NULL) ==
                                  SQLITE_OK && sqlite3_step(st) == SQLITE_DONE) {
            r = SQLITE_DONE; /* no migration has run */
        } else if (r == SQLITE_OK) {
            while ((r = sqlite3_step(st)) == SQLITE_ROW) {
                const char *t = (const char *)sqlite3_column_text(st, 0);
                const char *c = (const char *)sqlite3_column_text(st, 1);
                if (t != NULL && c != NULL) {
                    add_scope(scopes, n, max, t, c, KS_ENCODING_BINARY, 0, cut);
                }
            }
        }
    }
    if (r != SQLITE_DONE) {
        ks_cli_error("cannot read the migrations of %s: %s", db, sqlite3_errstr(r));
    }
    sqlite3_finalize(st);
    sqlite3_close(h);
    return r == SQLITE_DONE ? EX_OK : r == SQLITE_BUSY ? EX_TEMPFAIL : EX_IOERR;
}

/* Where pg_scope_one adds the migrated columns of a PostgreSQL database. */
typedef struct pg_scopes {
    scope *scopes;
    size_t *n, max;
    int *cut;
    int unseen;         /* a migrated table the census would not open: rows not counted */
    const char *label;  /* the database in messages */
    const char *db;     /* its connection string (never printed) */
} pg_scopes;

/*
 * How migrated PostgreSQL column table.column holds envelopes, which its
 * migration's checkpoints do not record: its type says, as the store's
 * open checks it (bytea: binary envelopes; text or varchar: base64
 * text).  The store is opened read-only in binary, then, if it refuses
 * the column's type (KS_ERR_NO_TARGET), in base64.  When neither opens,
 * binary: the census then says what is wrong, and the destroy is refused.
 */
static ks_value_encoding pg_column_encoding(const char *db, const char *table, const char *column)
{
    static const ks_value_encoding order[2] = {KS_ENCODING_BINARY, KS_ENCODING_BASE64};
    for (size_t i = 0; i < 2; i++) {
        const ks_rowstore_target t = {.table = table, .column = column, .encoding = order[i]};
        const ks_pg_options o = {30000, 0, 1};
        ks_rowstore st;
        char msg[256];
        ks_err e = ks_rowstore_pg_open(db, &t, &o, &st, msg, sizeof msg);
        if (e == KS_OK) {
            ks_rowstore_close(&st);
            return order[i];
        }
        if (e != KS_ERR_NO_TARGET) {
            break;
        }
    }
    return KS_ENCODING_BINARY;
}

/* Add one migrated column (a ks_migrated_column_fn) to the scopes; one
 * whose table the connection's search_path does not show (the table of
 * that name the census would open is another schema's, or there is
 * none) cannot be counted: say so and mark the rows as not all counted. */
static int pg_scope_one(void *arg, ks_bytes schema, ks_bytes table, ks_bytes column, int visible)
{
    pg_scopes *p = arg;
    char t[KS_ROLLOUT_IDENT_MAX + 1], c[KS_ROLLOUT_IDENT_MAX + 1];
    if (table.len >= sizeof t || column.len >= sizeof c) {
        *p->cut = 1;
        return 0;
    }
    memcpy(t, table.ptr, table.len);
    t[table.len] = '\0';
    memcpy(c, column.ptr, column.len);
    c[column.len] = '\0';
    if (!visible) {
        fprintf(stderr, "    %s: %s.%s of schema %.*s was migrated, but the search_path of the "
                        "connection does not show that table: its rows were not counted\n",
                p->label, t, c, schema.len > 255 ? 255 : (int)schema.len,
                (const char *)schema.ptr);
        p->unseen = 1;
        return 0;
    }
    add_scope(p->scopes, p->n, p->max, t, c, pg_column_encoding(p->db, t, c), 1, p->cut);
    return 0;
}

/* Add the columns of every keyshift_migration of PostgreSQL database db
 * (one per schema of a migrated table; ks_rowstore_pg_migrated_columns);
 * *unseen when a migrated table cannot be counted on this connection. */
static int pg_migration_scopes(const char *db, const char *label, scope *scopes, size_t *n,
                               size_t max, int *cut, int *unseen)
{
    pg_scopes p = {scopes, n, max, cut, 0, label, db};
    char msg[256] = "";
    ks_err e = ks_rowstore_pg_migrated_columns(db, pg_scope_one, &p, msg, sizeof msg);
    if (e != KS_OK) {
        ks_cli_error("cannot read the migrations of %s: %s%s", label, msg[0] ? msg : ks_err_name(e),
                     e == KS_ERR_UNAVAILABLE ? " (run the same command again once the server "
                                               "is reachable)" : "");
        return ks_cli_exit_code(e);
    }
    *unseen = p.unseen;
    return EX_OK;
}

/* Add the columns that past migrations of db ran on: from its
 * keyshift_migration (SQLite) or from the keyshift_migration of each
 * schema (PostgreSQL). */
static int migration_scopes(const char *db, const char *label, scope *scopes, size_t *n,
                            size_t max, int *cut, int *unseen)
{
    *unseen = 0;
    return ks_cli_db_is_pg(db) ? pg_migration_scopes(db, label, scopes, n, max, cut, unseen)
                               : sqlite_migration_scopes(db, scopes, n, max, cut);
}

/* The rows of scope s of database db under (key_id, version) into *rows:
 * counted in the scope's encoding and, with both (SQLite, where a column
 * of no declared type may hold either form whatever a migration used),
 * in the other encoding too.  A value is an envelope in at most one of
 * them ("KSE" bytes or "S1NF" text), so the sum counts each reference
 * once and misses none.  EX_OK, or the census's exit code. */
static int scope_key_rows(const char *db, const scope *s, int both, const char *key_id,
                          uint32_t version, uint64_t *rows)
{
    *rows = 0;
    for (int pass = 0; pass < (both ? 2 : 1); pass++) {
        ks_value_encoding enc = s->encoding;
        if (pass == 1) {
            enc = enc == KS_ENCODING_BINARY ? KS_ENCODING_BASE64 : KS_ENCODING_BINARY;
        }
        ks_census c;
        int rc = ks_cli_census(db, s->table, s->column, enc, &c);
        if (rc != EX_OK) {
            return rc;
        }
        *rows += ks_cli_census_key_rows(&c, key_id, version);
        ks_census_free(&c);
    }
    return EX_OK;
}

/* Nonzero when class c is (key_id, version); any version when version 0. */
static int class_uses(const ks_rollout_class *c, const char *key_id, uint32_t version)
{
    return !c->is_plaintext && strcmp(c->key_id, key_id) == 0 &&
           (version == 0 || c->key_version == version);
}

/*
 * The references to (key_id, version) in database db: rows in the
 * scopes of rollouts using the key and of migrations, live readers
 * holding it (live: within the longest reader TTL of its rollouts, 60 s
 * without), and rollouts not finalized whose source or target it is.
 * Prints each (naming the database label) and adds them to f's counts.
 * The ids of rollouts whose source or target is that version go to
 * affected[0, *n_affected).
 */
static int find_refs(const char *db, const char *label, const char *key_id, uint32_t version,
                     ks_rollout_destroy_facts *f, int64_t *affected, size_t *n_affected)
{
    ks_rollout_db *rdb;
    int rc = ks_cli_rollout_open(db, 1, &rdb);
    if (rc != EX_OK) {
        return rc;
    }
    scope scopes[64];
    size_t n_scopes = 0;
    int cut = 0, unseen = 0, exact = ks_cli_db_is_pg(db);
    uint32_t ttl = 60;
    int64_t after = 0;
    ks_rollout rs[8];
    size_t n = 8;
    ks_err e = KS_OK;
    while (e == KS_OK && n == 8) {
        e = ks_rollout_db_list(rdb, after, rs, 8, &n);
        for (size_t i = 0; e == KS_OK && i < n; i++) {
            const ks_rollout *r = &rs[i];
            after = r->id;
            ttl = r->reader_ttl_s > ttl ? r->reader_ttl_s : ttl;
            if (class_uses(&r->source, key_id, 0) || class_uses(&r->target, key_id, 0)) {
                /* a key-scoped rollout references the rows of each column it lists */
                for (size_t c = 0; r->scope == KS_SCOPE_KEY && c < r->n_columns; c++) {
                    add_scope(scopes, &n_scopes, 64, r->columns[c].table, r->columns[c].column,
                              r->encoding, exact, &cut);
                }
                if (r->scope == KS_SCOPE_COLUMN) {
                    add_scope(scopes, &n_scopes, 64, r->table, r->column, r->encoding, exact,
                              &cut);
                }
            }
            int uses = class_uses(&r->source, key_id, version) ||
                       class_uses(&r->target, key_id, version);
            if (uses && *n_affected < 64) {
                affected[(*n_affected)++] = r->id;
            }
            if (uses && r->phase != KS_PHASE_FINALIZED) {
                char what[KS_ROLLOUT_SCOPE_TEXT_MAX];
                fprintf(stderr, "    %s: rollout %" PRId64 " of %s (%s) moves it\n", label, r->id,
                        ks_rollout_scope_text(r, what, sizeof what),
                        ks_rollout_phase_name((int)r->phase));
                f->open_rollouts++;
            }
        }
    }
    ks_rollout_reader *readers = NULL;
    size_t n_readers = 0;
    if (e == KS_OK) {
        size_t cap = 64;
        readers = calloc(cap, sizeof *readers);
        e = readers == NULL ? KS_ERR_NO_MEMORY
                            : ks_rollout_db_readers_live(rdb, ttl, (int64_t)time(NULL), readers,
                                                         cap, &n_readers);
        if (e == KS_ERR_BUFFER_TOO_SMALL) { /* more than 64 live readers: count them all */
            e = KS_OK;
            n_readers = cap;
            f->live_readers += 1;
            fprintf(stderr, "    %s: more than %zu live readers (not all checked)\n", label, cap);
        }
    }
    ks_rollout_db_close(rdb);
    if (e != KS_OK) {
        free(readers);
        ks_cli_error("cannot read the rollouts of %s: %s", label, ks_err_name(e));
        return ks_cli_exit_code(e);
    }
    for (size_t i = 0; i < n_readers; i++) {
        if (ks_rollout_keys_holds(readers[i].keys, key_id, version)) {
            fprintf(stderr, "    %s: live reader %s holds it\n", label, readers[i].instance_id);
            f->live_readers++;
        }
    }
    free(readers);
    rc = migration_scopes(db, label, scopes, &n_scopes, 64, &cut, &unseen);
    if (rc == EX_OK && cut) {
        fprintf(stderr, "    %s: more than %d columns to count: the rows were not all counted\n",
                label, 64);
    }
    if (rc == EX_OK && (cut || unseen)) {
        f->rows_known = 0;
    }
    for (size_t i = 0; rc == EX_OK && i < n_scopes; i++) {
        uint64_t rows = 0;
        if ((rc = scope_key_rows(db, &scopes[i], !exact, key_id, version, &rows)) != EX_OK) {
            break;
        }
        if (rows > 0) {
            fprintf(stderr, "    %s: %" PRIu64 " %s of %s.%s\n", label, rows, rows == 1 ? "row" : "rows",
                    scopes[i].table, scopes[i].column);
            f->rows += rows;
        }
    }
    return rc;
}

/* Log the forced destruction in each affected rollout of db (label
 * names it in messages). */
int ks_cli_note_forced(const char *db, const char *label, const int64_t *ids, size_t n,
                       const char *key_id, uint32_t version, const char *reason)
{
    char actor[KS_ROLLOUT_ACTOR_MAX + 1], text[KS_ROLLOUT_REASON_MAX + 1];
    ks_rollout_db *rdb;
    int rc;
    if (n == 0) {
        return EX_OK;
    }
    if ((rc = ks_cli_actor("keys", NULL, actor, sizeof actor)) != EX_OK ||
        (rc = ks_cli_rollout_open(db, 0, &rdb)) != EX_OK) {
        return rc;
    }
    int w = snprintf(text, sizeof text, "key %s:%" PRIu32 " destroyed with --force: %s", key_id,
                     version, reason);
    if (w < 0) {
        text[0] = '\0';
    }
    for (size_t i = 0; i < n && rc == EX_OK; i++) {
        ks_err e = ks_rollout_db_note(rdb, ids[i], actor, text, (int64_t)time(NULL));
        if (e != KS_OK) {
            ks_cli_error("cannot log the forced destruction in rollout %" PRId64 " of %s: %s",
                         ids[i], label, ks_err_name(e));
            rc = ks_cli_exit_code(e);
        }
    }
    ks_rollout_db_close(rdb);
    return rc;
}

/* How messages name database i of d: a SQLite file by its path, a
 * PostgreSQL database by its place among the --db options (written into
 * buf), never by its connection string (which may say more than where
 * the database is). */
const char *ks_cli_db_label(const ks_cli_destroy_opts *d, int i, char *buf, size_t cap)
{
    if (!ks_cli_db_is_pg(d->dbs[i])) {
        return d->dbs[i];
    }
    snprintf(buf, cap, "PostgreSQL database (--db %d)", i + 1);
    return buf;
}

/*
 * Before set-state destroyed: count what still references (key_id,
 * version) in each database of d (rows in the columns of its rollouts and
 * migrations, live readers holding it, rollouts not finalized that move
 * it), then let the library's rule decide (ks_rollout_destroy_guard): a
 * reference refuses (EX_TEMPFAIL), so does a database that could not be
 * checked, and so does having no --db at all (EX_USAGE: nothing was
 * checked), unless --force --reason.  Fills affected rollouts per
 * database for ks_cli_note_forced.
 */
int ks_cli_destroy_guard(const ks_cli_destroy_opts *d, const char *key_id, uint32_t version,
                         int64_t affected[][64], size_t *n_affected)
{
    ks_rollout_destroy_facts f;
    memset(&f, 0, sizeof f);
    f.key_id = key_id;
    f.key_version = version;
    f.force = d->force;
    f.reason = d->reason;
    f.rows_known = f.readers_known = d->n_dbs > 0;
    int failed = EX_OK;
    for (int i = 0; i < d->n_dbs; i++) {
        n_affected[i] = 0;
        char buf[48];
        const char *label = ks_cli_db_label(d, i, buf, sizeof buf);
        int rc = find_refs(d->dbs[i], label, key_id, version, &f, affected[i], &n_affected[i]);
        if (rc != EX_OK) {
            failed = rc;
            f.rows_known = f.readers_known = 0;
        }
    }
    char why[512];
    ks_err e = ks_rollout_destroy_guard(&f, why, sizeof why);
    if (e == KS_OK) {
        if (d->force && why[0] != '\0') {
            fprintf(stderr, KS_PROG ": warning: %s\n", why);
        }
        return EX_OK;
    }
    if (e != KS_ERR_GUARD) {
        return ks_cli_usage_error("keys", "%s", why[0] != '\0' ? why : ks_err_name(e));
    }
    if (d->n_dbs == 0) {
        return ks_cli_usage_error("keys", "%s:%" PRIu32 " was not destroyed, because without "
                                          "--db nothing that references it can be checked; give "
                                          "--db DB for each database that may hold its rows or "
                                          "readers, or --force --reason TEXT", key_id, version);
    }
    if (failed != EX_OK) {
        return failed; /* the database's error was said */
    }
    ks_cli_error("%s, so %s:%" PRIu32 " was not destroyed: once destroyed, those rows could "
                 "never be read again. Move the rows ('keyshift migrate run', 'keyshift "
                 "rollout') and retire the readers, then retry, or give --force --reason TEXT",
                 why, key_id, version);
    return EX_TEMPFAIL;
}
