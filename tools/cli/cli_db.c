/*
 * tools/cli/cli_db.c -- open the database a keyshift subcommand names with
 * --db (a SQLite file or a PostgreSQL connection string, in one place): its
 * row store, its checkpoints, its rollout store and a census of a column.
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <libpq-fe.h>

#include <keyshift/rollout_store.h>
#include <keyshift/rollout_store_pg.h>

#include "cli.h"

/* See cli.h. */
int ks_cli_template_columns(const char *cmd, const char *tmpl, ks_rowstore_target *t,
                            char storage[KS_CONTEXT_TEMPLATE_MAX])
{
    t->n_context_columns = 0;
    if (tmpl == NULL) {
        return EX_OK;
    }
    ks_bytes b = {(const uint8_t *)tmpl, strlen(tmpl)};
    size_t n = 0;
    ks_err e = ks_context_template_columns(b, t->context_columns, storage, &n);
    size_t off = 0;
    const char *why = NULL;
    if (e == KS_ERR_INVALID_ARGUMENT && ks_context_template_check(b, &off, &why) == e) {
        return ks_cli_usage_error(cmd, "invalid --context template: %s at byte %zu (at most %d "
                                       "bytes and %d distinct {column} names)", why, off,
                                  KS_CONTEXT_TEMPLATE_MAX, KS_ROWSTORE_MAX_CONTEXT_COLUMNS);
    }
    if (e != KS_OK) {
        ks_cli_error("cannot read the --context template: %s", ks_err_name(e));
        return ks_cli_exit_code(e);
    }
    t->n_context_columns = n;
    return EX_OK;
}

/* EX_OK when path names a regular file, else EX_NOINPUT after saying
 * why: databases are never created by a command that reads them. */
static int db_exists(const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        ks_cli_error("no such database %s: %s", path, strerror(errno));
        return EX_NOINPUT;
    }
    if (!S_ISREG(st.st_mode)) {
        ks_cli_error("no such database %s: not a regular file", path);
        return EX_NOINPUT;
    }
    return EX_OK;
}

/* See cli.h. */
int ks_cli_db_is_pg(const char *db)
{
    return ks_rollout_store_pg_names(db);
}

/* See cli.h.  libpq's parse error is not printed: it may quote part of
 * the string, which may hold a password. */
int ks_cli_db_check(const char *db, int *is_pg)
{
    int pg = ks_cli_db_is_pg(db);
    if (is_pg != NULL) {
        *is_pg = pg;
    }
    if (!pg) {
        return EX_OK;
    }
    char *err = NULL;
    PQconninfoOption *opts = PQconninfoParse(db, &err);
    if (err != NULL) {
        PQfreemem(err);
    }
    if (opts == NULL) {
        ks_cli_error("--db: not a valid PostgreSQL connection URI or key=value string");
        return EX_USAGE;
    }
    int password = 0;
    for (const PQconninfoOption *o = opts; o->keyword != NULL; o++) {
        password |= strcmp(o->keyword, "password") == 0 && o->val != NULL;
    }
    PQconninfoFree(opts);
    if (password) {
        ks_cli_error("--db: the PostgreSQL connection string holds a password, which the "
                     "command line would show to other users: remove it and give it through "
                     "PGPASSFILE (a 0600 file) or PGPASSWORD");
        return EX_USAGE;
    }
    return EX_OK;
}

/* Open the PostgreSQL store of ks_cli_store_open (db checked already). */
static int pg_store_open(const char *db, const ks_rowstore_target *t, int read_only,
                         uint32_t busy_timeout_ms, ks_rowstore *out)
{
    ks_pg_options o = {busy_timeout_ms ? busy_timeout_ms : 30000, 0, read_only};
    char msg[256] = "";
    ks_err e = ks_rowstore_pg_open(db, t, &o, out, msg, sizeof msg);
    if (e != KS_OK) {
        const char *advice = e == KS_ERR_BUSY ? " (the table stayed locked past --busy-timeout: "
                                                "run the same command again later)"
                             : e == KS_ERR_UNAVAILABLE ? " (run the same command again once the "
                                                         "server is reachable)"
                                                       : "";
        /* never the connection string: it may carry more than a host */
        ks_cli_error("PostgreSQL database: %s%s", msg[0] ? msg : ks_err_name(e), advice);
        return e == KS_ERR_INVALID_ARGUMENT ? EX_USAGE : ks_cli_exit_code(e);
    }
    return EX_OK;
}

/* See cli.h. */
ks_err ks_cli_checkpoints(const char *db, const char *table, const char *column,
                          ks_checkpoint_list_fn fn, void *arg, char *errbuf, size_t errbuf_len)
{
    return ks_cli_db_is_pg(db)
               ? ks_rowstore_pg_checkpoints(db, table, column, fn, arg, errbuf, errbuf_len)
               : ks_rowstore_sqlite_checkpoints(db, table, column, fn, arg, errbuf, errbuf_len);
}

/* See cli.h. */
int ks_cli_store_open(const char *db, const ks_rowstore_target *t, int read_only,
                      uint32_t busy_timeout_ms, ks_sqlite_sync sync, ks_rowstore *out)
{
    *out = (ks_rowstore){NULL, NULL, NULL, 0, KS_ENCODING_BINARY};
    int pg;
    int rc = ks_cli_db_check(db, &pg);
    if (rc != EX_OK || pg) {
        return rc != EX_OK ? rc : pg_store_open(db, t, read_only, busy_timeout_ms, out);
    }
    rc = db_exists(db);
    if (rc != EX_OK) {
        return rc;
    }
    ks_sqlite_options o = {busy_timeout_ms ? busy_timeout_ms : 30000, read_only, 0, sync};
    char msg[256] = "";
    ks_err e = ks_rowstore_sqlite_open(db, t, &o, out, msg, sizeof msg);
    if (e == KS_ERR_INVALID_ARGUMENT) {
        ks_cli_error("%s: %s", db, msg[0] ? msg : "invalid table or column name");
        return EX_USAGE;
    }
    if (e != KS_OK) {
        ks_cli_error("%s: %s", db, msg[0] ? msg : ks_err_name(e));
        return ks_cli_exit_code(e);
    }
    return EX_OK;
}

/* See cli.h. */
int ks_cli_check_context(const char *cmd, const ks_rowstore *store, const char *table,
                         const char *tmpl)
{
    ks_bytes b = {(const uint8_t *)(tmpl != NULL ? tmpl : ""), tmpl != NULL ? strlen(tmpl) : 0};
    ks_err e = ks_migrate_check_context(store, b);
    if (e == KS_ERR_UNSTABLE_ID) {
        ks_cli_error("%s%stable %s has no INTEGER PRIMARY KEY, so its row id is the bare rowid, "
                     "which VACUUM and a dump/restore renumber; --context binds {id}, so every "
                     "envelope would stop opening once its row is renumbered. Nothing was "
                     "written. Give --id-column naming the INTEGER PRIMARY KEY or a UNIQUE NOT "
                     "NULL column (add one to the table first if it has none), or a --context "
                     "that does not bind {id} (unstable-id)",
                     cmd != NULL ? cmd : "", cmd != NULL ? ": " : "", table);
        return ks_cli_exit_code(e);
    }
    if (e != KS_OK) {
        ks_cli_error("%s%scannot check the --context template: %s", cmd != NULL ? cmd : "",
                     cmd != NULL ? ": " : "", ks_err_name(e));
        return ks_cli_exit_code(e);
    }
    return EX_OK;
}

/* See cli.h. */
int ks_cli_rollout_open(const char *path, int read_only, ks_rollout_db **out)
{
    *out = NULL;
    char msg[256] = "";
    if (ks_cli_db_is_pg(path)) { /* the rollouts live in the application's PostgreSQL database */
        int rc = ks_cli_db_check(path, NULL); /* no password in argv */
        if (rc != EX_OK) {
            return rc;
        }
        ks_rollout_store *store = NULL;
        ks_err e = ks_rollout_store_pg_open(path, read_only, &store, msg, sizeof msg);
        if (e == KS_OK) {
            e = ks_rollout_db_wrap(store, out); /* it owns the store, even on failure */
        }
        if (e != KS_OK) {
            /* never the connection string: it may carry more than a host */
            ks_cli_error("cannot open the rollouts of the PostgreSQL database: %s",
                         msg[0] ? msg : ks_err_name(e));
            return ks_cli_exit_code(e);
        }
        return EX_OK;
    }
    int rc = db_exists(path);
    if (rc != EX_OK) {
        return rc;
    }
    ks_err e = ks_rollout_db_open(path, read_only ? KS_ROLLOUT_DB_READ_ONLY : 0, out, msg, sizeof msg);
    if (e != KS_OK) {
        ks_cli_error("cannot open the rollouts of %s: %s", path, msg[0] ? msg : ks_err_name(e));
        return ks_cli_exit_code(e);
    }
    return EX_OK;
}

/* See cli.h.  Paged, so that any number of rollouts is read in one
 * array: the rules of ks_rollout_scope_find need all of them. */
int ks_cli_rollouts_all(ks_rollout_db *db, const char *path, ks_rollout **out, size_t *n)
{
    enum { PAGE = 8 };
    ks_rollout *rs = NULL;
    size_t got = PAGE, cap = 0;
    ks_err e = KS_OK;
    *out = NULL;
    *n = 0;
    while (e == KS_OK && got == PAGE) {
        if (*n + PAGE > cap) {
            size_t ncap = cap ? cap * 2 : PAGE;
            ks_rollout *np = realloc(rs, ncap * sizeof *np);
            if (np == NULL) {
                e = KS_ERR_NO_MEMORY;
                break;
            }
            rs = np;
            cap = ncap;
        }
        e = ks_rollout_db_list(db, *n > 0 ? rs[*n - 1].id : 0, rs + *n, PAGE, &got);
        *n += e == KS_OK ? got : 0;
    }
    if (e != KS_OK) {
        free(rs);
        *n = 0;
        ks_cli_error("cannot read the rollouts of %s: %s", path, ks_err_name(e));
        return ks_cli_exit_code(e);
    }
    *out = rs;
    return EX_OK;
}

/* See cli.h. */
int ks_cli_census(const char *path, const char *table, const char *column,
                  ks_value_encoding encoding, ks_census *out)
{
    ks_rowstore_target t = {.table = table, .column = column, .encoding = encoding};
    ks_rowstore store;
    memset(out, 0, sizeof *out);
    int rc = ks_cli_store_open(path, &t, 1, 0, KS_SQLITE_SYNC_FULL, &store);
    if (rc != EX_OK) {
        return rc;
    }
    ks_err e = ks_census_run(&store, out);
    ks_rowstore_close(&store);
    if (e != KS_OK) {
        ks_cli_error("census of %s.%s failed: %s", table, column, ks_err_name(e));
        return ks_cli_exit_code(e);
    }
    return EX_OK;
}

/* See cli.h. */
uint64_t ks_cli_census_key_rows(const ks_census *c, const char *key_id, uint32_t key_version)
{
    uint64_t n = 0;
    for (size_t i = 0; i < c->n_classes; i++) {
        if (c->classes[i].key_version == key_version && strcmp(c->classes[i].key_id, key_id) == 0) {
            n += c->classes[i].rows;
        }
    }
    return n;
}
