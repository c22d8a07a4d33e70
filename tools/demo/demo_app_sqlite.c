/*
 * tools/demo/demo_app_sqlite.c -- keyshift-demo-app's data access on a SQLite
 * file (tools/demo/demo_app.h): rows picked by rowid, {id} from --id-column
 * (default the rowid), UPDATEs in autocommit with a 10 s busy timeout.
 */
#define _POSIX_C_SOURCE 200809L

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <sqlite3.h>

#include "../cli/cli.h"
#include "demo_app.h"

/* The SQLite backend. */
typedef struct sq_db {
    demo_db base;
    const char *path;
    sqlite3 *db;
    sqlite3_stmt *pick, *update;
} sq_db;

/* Append identifier name to sql as a double-quoted SQL identifier. */
static void put_ident(char *sql, size_t cap, const char *name)
{
    size_t n = strlen(sql);
    if (n + 1 < cap) {
        sql[n++] = '"';
    }
    for (const char *p = name; *p != '\0' && n + 2 < cap; p++) {
        if (*p == '"') {
            sql[n++] = '"';
        }
        sql[n++] = *p;
    }
    if (n + 1 < cap) {
        sql[n++] = '"';
    }
    sql[n] = '\0';
}

/* Build "PREFIX ident MIDDLE ident ..." from alternating literal parts
 * and identifiers (NULL-terminated), then prepare it. */
static int prepare(sq_db *s, sqlite3_stmt **st, const char *const *parts)
{
    char sql[2048] = "";
    for (size_t i = 0; parts[i] != NULL; i++) {
        if (i % 2 == 0) {
            strncat(sql, parts[i], sizeof sql - strlen(sql) - 1);
        } else {
            put_ident(sql, sizeof sql, parts[i]);
        }
    }
    if (sqlite3_prepare_v2(s->db, sql, -1, st, NULL) != SQLITE_OK) {
        ks_cli_error("%s: %s", s->path, sqlite3_errmsg(s->db));
        return EX_NOINPUT;
    }
    return EX_OK;
}

/* See demo_db_ops.pick: the picked row's columns are rowid, id, tenant
 * and value. */
static int sq_pick(demo_db *d, int64_t start, demo_row *row)
{
    sq_db *s = (sq_db *)d;
    sqlite3_stmt *st = s->pick;
    sqlite3_reset(st);
    sqlite3_bind_int64(st, 1, start);
    int rc = sqlite3_step(st);
    if (rc != SQLITE_ROW) {
        return rc == SQLITE_DONE ? 0 : -1;
    }
    memset(row, 0, sizeof *row);
    row->key = sqlite3_column_int64(st, 0);
    switch (sqlite3_column_type(st, 1)) {
    case SQLITE_INTEGER:
        row->id_kind = DEMO_ID_INT;
        row->id_int = (long long)sqlite3_column_int64(st, 1);
        break;
    case SQLITE_BLOB:
        row->id_kind = DEMO_ID_BLOB;
        row->id = sqlite3_column_blob(st, 1);
        row->id_len = (size_t)sqlite3_column_bytes(st, 1);
        break;
    case SQLITE_NULL:
        row->id_kind = DEMO_ID_NULL;
        break;
    default:
        row->id_kind = DEMO_ID_TEXT;
        row->id = sqlite3_column_text(st, 1);
        row->id_len = (size_t)sqlite3_column_bytes(st, 1);
        break;
    }
    row->tenant = sqlite3_column_text(st, 2);
    row->tenant_len = row->tenant != NULL ? (size_t)sqlite3_column_bytes(st, 2) : 0;
    row->value_null = sqlite3_column_type(st, 3) == SQLITE_NULL;
    row->value = sqlite3_column_blob(st, 3);
    row->value_len = (size_t)sqlite3_column_bytes(st, 3);
    if (row->value == NULL) {
        row->value = (const uint8_t *)"";
    }
    return 1;
}

/* See demo_db_ops.release: resetting the SELECT ends its read snapshot
 * (in WAL mode a read transaction that another connection wrote past
 * cannot become a write one). */
static void sq_release(demo_db *d)
{
    sqlite3_reset(((sq_db *)d)->pick);
}

/* See demo_db_ops.update. */
static int sq_update(demo_db *d, int64_t key, const uint8_t *value, size_t len, int blob)
{
    sq_db *s = (sq_db *)d;
    int rc = blob ? sqlite3_bind_blob(s->update, 1, value, (int)len, SQLITE_TRANSIENT)
                  : sqlite3_bind_text(s->update, 1, (const char *)value, (int)len,
                                      SQLITE_TRANSIENT);
    if (rc == SQLITE_OK) {
        rc = sqlite3_bind_int64(s->update, 2, key);
    }
    if (rc == SQLITE_OK) {
        rc = sqlite3_step(s->update);
    }
    sqlite3_reset(s->update);
    sqlite3_clear_bindings(s->update);
    return rc == SQLITE_DONE ? 0 : -1;
}

/* See demo_db_ops.errmsg. */
static const char *sq_errmsg(demo_db *d)
{
    return sqlite3_errmsg(((sq_db *)d)->db);
}

/* See demo_db_ops.close. */
static void sq_close(demo_db *d)
{
    sq_db *s = (sq_db *)d;
    sqlite3_finalize(s->pick);
    sqlite3_finalize(s->update);
    sqlite3_close(s->db);
    free(s);
}

static const demo_db_ops sq_ops = {sq_pick, sq_release, sq_update, sq_errmsg, sq_close};

/* Prepare the statements of s and find the rowid range. */
static int sq_prepare_all(sq_db *s, const demo_target *t)
{
    const char *id = t->id_column ? t->id_column : "rowid";
    const char *const pick[] = {"SELECT rowid, ", id, ", ", t->tenant_column, ", ",
                                t->column, " FROM ", t->table,
                                " WHERE rowid >= ?1 ORDER BY rowid LIMIT 1", NULL};
    const char *const update[] = {"UPDATE ", t->table, " SET ", t->column,
                                  " = ?1 WHERE rowid = ?2", NULL};
    const char *const range[] = {"SELECT min(rowid), max(rowid) FROM ", t->table, NULL};
    sqlite3_stmt *r = NULL;
    int rc = prepare(s, &s->pick, pick);
    if (rc == EX_OK) {
        rc = prepare(s, &s->update, update);
    }
    if (rc == EX_OK) {
        rc = prepare(s, &r, range);
    }
    if (rc == EX_OK) {
        int step = sqlite3_step(r);
        if (step != SQLITE_ROW) {
            ks_cli_error("%s: %s", s->path, sqlite3_errmsg(s->db));
            rc = EX_IOERR;
        } else if (sqlite3_column_type(r, 0) == SQLITE_NULL) {
            ks_cli_error("%s: table %s has no rows", s->path, t->table);
            rc = EX_NOINPUT;
        } else {
            s->base.min_key = sqlite3_column_int64(r, 0);
            s->base.max_key = sqlite3_column_int64(r, 1);
        }
    }
    sqlite3_finalize(r);
    return rc;
}

/* See demo_app.h. */
int demo_db_sqlite_open(const demo_target *t, demo_db **out)
{
    *out = NULL;
    struct stat st;
    if (stat(t->db, &st) != 0 || !S_ISREG(st.st_mode)) {
        ks_cli_error("no such database %s", t->db);
        return EX_NOINPUT;
    }
    sq_db *s = calloc(1, sizeof *s);
    if (s == NULL) {
        ks_cli_error("out of memory");
        return EX_OSERR;
    }
    s->base.ops = &sq_ops;
    s->path = t->db;
    int rc = EX_OK;
    if (sqlite3_open_v2(t->db, &s->db, SQLITE_OPEN_READWRITE, NULL) != SQLITE_OK) {
        ks_cli_error("%s: %s", t->db, s->db ? sqlite3_errmsg(s->db) : "cannot open");
        rc = EX_NOINPUT;
    } else {
        sqlite3_busy_timeout(s->db, DEMO_BUSY_TIMEOUT_MS);
        rc = sq_prepare_all(s, t);
    }
    if (rc != EX_OK) {
        sq_close(&s->base);
        return rc;
    }
    *out = &s->base;
    return EX_OK;
}
