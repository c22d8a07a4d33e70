/*
 * tests/test_rowstore_sqlite.c -- the SQLite row store
 * (keyshift/rowstore.h, migrate/store/sqlite/sqlite_store.c).
 *
 * Every test builds its database with the SQLite C API in a fresh
 * mkdtemp directory under /tmp and removes it afterwards.  Lock tests use
 * a thread with its own connection and pipes for ordering; no test passes
 * or fails on a measured duration.
 */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <pthread.h>
#include <sqlite3.h>

#include <keyshift/migrate.h>
#include <keyshift/rowstore.h>

#include "../migrate/store/sqlite/sqlite_store.h"
#include "sqlite_test_util.h"

/* One test's world: a temporary directory holding db.sqlite. */
typedef struct world {
    char dir[64];
    char path[96];
    char err[256];
    ks_rowstore store;
} world;

/* ---- helpers --------------------------------------------------------------- */

/* Create the test directory and its database path. */
static int world_setup(void **state)
{
    world *w = calloc(1, sizeof *w);
    assert_non_null(w);
    strcpy(w->dir, "/tmp/ks_rowstore_XXXXXX");
    assert_non_null(mkdtemp(w->dir));
    snprintf(w->path, sizeof w->path, "%s/db.sqlite", w->dir);
    *state = w;
    return 0;
}

/* Close the store, remove the database files and the directory. */
static int world_teardown(void **state)
{
    world *w = *state;
    ks_rowstore_close(&w->store);
    remove_db_dir(w->dir, w->path);
    free(w);
    return 0;
}

/* Run sql on the database at path through a separate connection
 * (creating the file). */
static void exec_sql(const char *path, const char *sql)
{
    sqlite3 *db = NULL;
    assert_int_equal(sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL),
                     SQLITE_OK);
    char *msg = NULL;
    int rc = sqlite3_exec(db, sql, NULL, NULL, &msg);
    if (rc != SQLITE_OK)
        fprintf(stderr, "exec_sql: %s\n", msg ? msg : "?");
    sqlite3_free(msg);
    assert_int_equal(rc, SQLITE_OK);
    assert_int_equal(sqlite3_close(db), SQLITE_OK);
}

/* A target over table/column with optional id column. */
static ks_rowstore_target target(const char *table, const char *column, const char *id)
{
    ks_rowstore_target t;
    memset(&t, 0, sizeof t);
    t.table = table;
    t.column = column;
    t.id_column = id;
    return t;
}

/* Open w's store over t with opts. */
static ks_err open_store(world *w, const ks_rowstore_target *t, const ks_sqlite_options *opts)
{
    ks_rowstore_close(&w->store);
    w->err[0] = '\0';
    return ks_rowstore_sqlite_open(w->path, t, opts, &w->store, w->err, sizeof w->err);
}

/* Open expecting err, with errbuf containing needle. */
static void open_fails(world *w, const ks_rowstore_target *t, ks_err err, const char *needle)
{
    assert_int_equal(open_store(w, t, NULL), err);
    assert_null(w->store.self);
    if (strstr(w->err, needle) == NULL)
        fail_msg("message \"%s\" lacks \"%s\"", w->err, needle);
}

/* Shorthands for the store's operations. */
static ks_err scan(world *w, const ks_value *after, size_t max, ks_row *rows, size_t *n)
{
    return w->store.ops->scan(w->store.self, after, max, rows, n);
}

static ks_err begin(world *w)
{
    return w->store.ops->begin(w->store.self);
}

static ks_err commit(world *w)
{
    return w->store.ops->commit(w->store.self);
}

static void rollback(world *w)
{
    w->store.ops->rollback(w->store.self);
}

static ks_err cas(world *w, const ks_value *id, const ks_value *old, const char *nv, int *swapped)
{
    ks_bytes b = {(const uint8_t *)nv, strlen(nv)};
    return w->store.ops->cas(w->store.self, id, old, b, swapped);
}

/* What a visit_values callback saw: each value's type and bytes, in
 * order, as "<type>:<bytes>" lines; stops with stop_code after stop_at
 * values (0: never). */
typedef struct visited {
    char log[512];
    size_t n, stop_at;
    ks_err stop_code;
} visited;

/* Append line to vs's log and count it; stop_code once stop_at lines
 * are in (the visit callbacks' common end). */
static ks_err log_line(visited *vs, const char *line)
{
    assert_true(strlen(vs->log) + strlen(line) < sizeof vs->log);
    strcat(vs->log, line);
    vs->n++;
    return vs->stop_at != 0 && vs->n == vs->stop_at ? vs->stop_code : KS_OK;
}

/* The visit_values callback of the tests: log v (see visited). */
static ks_err visit_log(void *arg, const ks_value *v)
{
    visited *vs = arg;
    char line[64];
    if (v->type == KS_VALUE_TEXT || v->type == KS_VALUE_BLOB) {
        assert_non_null(v->bytes.ptr); /* present even when empty */
        snprintf(line, sizeof line, "%d:%.*s\n", (int)v->type, (int)v->bytes.len,
                 (const char *)v->bytes.ptr);
    } else {
        snprintf(line, sizeof line, "%d:%lld\n", (int)v->type, (long long)v->integer);
    }
    return log_line(vs, line);
}

/* Visit every value of w's store into vs (cleared first). */
static ks_err visit(world *w, visited *vs)
{
    vs->log[0] = '\0';
    vs->n = 0;
    return w->store.ops->visit_values(w->store.self, visit_log, vs);
}

/* Quarantine id in a transaction of its own. */
static void quarantine_one(world *w, const ks_value *id)
{
    assert_int_equal(begin(w), KS_OK);
    assert_int_equal(w->store.ops->quarantine(w->store.self, id, "auth-failed"), KS_OK);
    assert_int_equal(commit(w), KS_OK);
}

/* An INTEGER value. */
static ks_value vint(int64_t i)
{
    ks_value v = {KS_VALUE_INTEGER, i, {NULL, 0}};
    return v;
}

/* A TEXT or BLOB value viewing the C string s. */
static ks_value vbytes(ks_value_type type, const char *s)
{
    ks_value v = {type, 0, {(const uint8_t *)s, strlen(s)}};
    return v;
}

/* Assert v is a TEXT or BLOB equal to s. */
static void assert_bytes(const ks_value *v, ks_value_type type, const char *s)
{
    assert_int_equal(v->type, type);
    assert_int_equal(v->bytes.len, strlen(s));
    assert_non_null(v->bytes.ptr);
    assert_memory_equal(v->bytes.ptr, s, strlen(s) ? strlen(s) : 1);
}

/* ---- target validation ------------------------------------------------------- */

/* A missing file is KS_ERR_NO_TARGET and is not created. */
static void test_missing_file(void **state)
{
    world *w = *state;
    ks_rowstore_target t = target("t", "v", NULL);
    open_fails(w, &t, KS_ERR_NO_TARGET, "no database file");
    assert_int_not_equal(access(w->path, F_OK), 0);
    ks_sqlite_options ro = {0, 1, 0, KS_SQLITE_SYNC_FULL};
    assert_int_equal(open_store(w, &t, &ro), KS_ERR_NO_TARGET);
    assert_int_not_equal(access(w->path, F_OK), 0);
}

/* Missing tables and columns (every role) are named in the message. */
static void test_missing_table_or_column(void **state)
{
    world *w = *state;
    exec_sql(w->path, "CREATE TABLE t(id INTEGER PRIMARY KEY, v, tn, c1)");
    ks_rowstore_target t = target("nope", "v", NULL);
    open_fails(w, &t, KS_ERR_NO_TARGET, "no table \"nope\"");
    t = target("t", "nope", NULL);
    open_fails(w, &t, KS_ERR_NO_TARGET, "no target column \"nope\"");
    t = target("t", "v", "nope");
    open_fails(w, &t, KS_ERR_NO_TARGET, "no id column \"nope\"");
    t = target("t", "v", NULL);
    t.tenant_column = "nope";
    open_fails(w, &t, KS_ERR_NO_TARGET, "no tenant column \"nope\"");
    t = target("t", "v", NULL);
    t.context_columns[0] = "c1";
    t.context_columns[1] = "nope";
    t.n_context_columns = 2;
    open_fails(w, &t, KS_ERR_NO_TARGET, "no context column \"nope\"");
    t = target("t", "v", NULL);
    t.n_context_columns = KS_ROWSTORE_MAX_CONTEXT_COLUMNS + 1;
    assert_int_equal(open_store(w, &t, NULL), KS_ERR_INVALID_ARGUMENT);
    t = target("t", "", NULL);
    assert_int_equal(open_store(w, &t, NULL), KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_rowstore_sqlite_open(w->path, NULL, NULL, &w->store, NULL, 0),
                     KS_ERR_INVALID_ARGUMENT);
    /* the encrypted column cannot be the id nor a context column */
    t = target("t", "v", NULL);
    t.context_columns[0] = "V";
    t.n_context_columns = 1;
    assert_int_equal(open_store(w, &t, NULL), KS_ERR_INVALID_ARGUMENT);
    t = target("t", "id", NULL);
    assert_int_equal(open_store(w, &t, NULL), KS_ERR_INVALID_ARGUMENT);
    /* reserved tables and views are refused */
    t = target("keyshift_migration", "state", NULL);
    assert_int_equal(open_store(w, &t, NULL), KS_ERR_INVALID_ARGUMENT);
    exec_sql(w->path, "CREATE VIEW vw AS SELECT id, v FROM t");
    t = target("vw", "v", NULL);
    assert_int_equal(open_store(w, &t, NULL), KS_ERR_INVALID_ARGUMENT);
    /* names match as SQLite matches them: case-insensitively */
    t = target("T", "V", "ID");
    assert_int_equal(open_store(w, &t, NULL), KS_OK);
}

/* Names that look like SQL are looked up, reported missing, never run. */
static void test_injection_names_missing(void **state)
{
    world *w = *state;
    exec_sql(w->path, "CREATE TABLE t(id INTEGER PRIMARY KEY, v); INSERT INTO t(v) VALUES('a');");
    static const char *const evil[] = {
        "t; DROP TABLE t; --", "t\" ; DROP TABLE t; --", "t WHERE 1=1", "main.t", "\"t\"",
    };
    for (size_t i = 0; i < sizeof evil / sizeof evil[0]; i++) {
        ks_rowstore_target t = target(evil[i], "v", NULL);
        open_fails(w, &t, KS_ERR_NO_TARGET, "no table");
        t = target("t", evil[i], NULL);
        open_fails(w, &t, KS_ERR_NO_TARGET, "no target column");
        t = target("t", "v", evil[i]);
        open_fails(w, &t, KS_ERR_NO_TARGET, "no id column");
    }
    assert_int_equal(query_int(w->path, "SELECT count(*) FROM t"), 1);
}

/* An id column must be unique and NOT NULL (or the rowid alias). */
static void test_id_column_rules(void **state)
{
    world *w = *state;
    exec_sql(w->path,
             "CREATE TABLE a(k INTEGER, v);"
             "CREATE TABLE b(k TEXT UNIQUE, v);"
             "CREATE TABLE c(k TEXT NOT NULL, v); CREATE UNIQUE INDEX c_k ON c(k) WHERE k > 'a';"
             "CREATE TABLE d(k TEXT NOT NULL, j, v); CREATE UNIQUE INDEX d_kj ON d(k, j);"
             "CREATE TABLE e(k TEXT NOT NULL UNIQUE, v);"
             "CREATE TABLE f(k TEXT PRIMARY KEY NOT NULL, v);"
             "CREATE TABLE g(k INTEGER PRIMARY KEY, v);"
             "CREATE TABLE h(k TEXT PRIMARY KEY, v) WITHOUT ROWID;"
             "CREATE TABLE i(k INTEGER NOT NULL, v); CREATE UNIQUE INDEX i_k ON i(k);"
             "CREATE TABLE j(k TEXT PRIMARY KEY, v);");
    static const char *const refused[] = {"a", "b", "c", "d", "j"};
    for (size_t n = 0; n < sizeof refused / sizeof refused[0]; n++) {
        ks_rowstore_target t = target(refused[n], "v", "k");
        open_fails(w, &t, KS_ERR_NO_TARGET, "is neither the INTEGER PRIMARY KEY");
    }
    static const char *const accepted[] = {"e", "f", "g", "h", "i"};
    for (size_t n = 0; n < sizeof accepted / sizeof accepted[0]; n++) {
        ks_rowstore_target t = target(accepted[n], "v", "k");
        assert_int_equal(open_store(w, &t, NULL), KS_OK);
    }
    /* a WITHOUT ROWID table needs an id column: its primary key */
    ks_rowstore_target t = target("h", "v", NULL);
    open_fails(w, &t, KS_ERR_INVALID_ARGUMENT, "WITHOUT ROWID): name its primary key as the id column");
}

/* Only the bare rowid of a table without an INTEGER PRIMARY KEY is an
 * unstable id (VACUUM renumbers it once rows were deleted): a context
 * that binds {id} is refused on it (KS_ERR_UNSTABLE_ID), a context
 * without {id} is not.  An INTEGER PRIMARY KEY DESC or an INT PRIMARY
 * KEY is no rowid alias; a UNIQUE NOT NULL id column and a WITHOUT
 * ROWID table's primary key are stable. */
static void test_id_stable(void **state)
{
    world *w = *state;
    exec_sql(w->path, "CREATE TABLE bare(tenant TEXT NOT NULL, v);"
                      "CREATE TABLE ipk(id INTEGER PRIMARY KEY, v);"
                      "CREATE TABLE ipk_lower(id integer primary key, v);"
                      "CREATE TABLE desc_pk(id INTEGER PRIMARY KEY DESC, v);"
                      "CREATE TABLE int_pk(id INT PRIMARY KEY, v);"
                      "CREATE TABLE uniq(k TEXT NOT NULL UNIQUE, v);"
                      "CREATE TABLE wr(k TEXT PRIMARY KEY, v) WITHOUT ROWID;"
                      "INSERT INTO bare VALUES('acme', 'x'), ('acme', 'y');");
    static const struct {
        const char *table, *id;
        int stable;
    } cases[] = {
        {"bare", NULL, 0},   {"ipk", NULL, 1},     {"ipk", "id", 1},  {"ipk_lower", NULL, 1},
        {"desc_pk", NULL, 0}, {"int_pk", NULL, 0}, {"uniq", NULL, 0}, {"uniq", "k", 1},
        {"wr", "k", 1},
    };
    const ks_bytes with_id = {(const uint8_t *)"t:{id}:v", 8};
    const ks_bytes without = {(const uint8_t *)"t:{{id}}:v", 10};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ks_rowstore_target t = target(cases[i].table, "v", cases[i].id);
        assert_int_equal(open_store(w, &t, NULL), KS_OK);
        if (w->store.id_stable != cases[i].stable)
            fail_msg("table %s, id %s: id_stable %d", cases[i].table,
                     cases[i].id ? cases[i].id : "(rowid)", w->store.id_stable);
        assert_int_equal(ks_migrate_check_context(&w->store, with_id),
                         cases[i].stable ? KS_OK : KS_ERR_UNSTABLE_ID);
        assert_int_equal(ks_migrate_check_context(&w->store, without), KS_OK);
    }
    /* read-only (census, verify) reports the same */
    ks_rowstore_target t = target("bare", "v", NULL);
    ks_sqlite_options ro = {0, 1, 0, KS_SQLITE_SYNC_FULL};
    assert_int_equal(open_store(w, &t, &ro), KS_OK);
    assert_int_equal(w->store.id_stable, 0);
    ks_rowstore_close(&w->store);
    /* VACUUM renumbers the bare rowid, which is why */
    exec_sql(w->path, "DELETE FROM bare WHERE rowid = 1; VACUUM;");
    assert_int_equal(query_int(w->path, "SELECT rowid FROM bare WHERE v = 'y'"), 1);
}

/* A table and columns whose names need quoting work. */
static void test_odd_names_quoted(void **state)
{
    world *w = *state;
    exec_sql(w->path, "CREATE TABLE \"my \"\"odd\"\" table\"(\"the \"\"id\"\"\" INTEGER PRIMARY KEY,"
                      " \"va'l ue\" TEXT, \"ten;ant\" TEXT);"
                      "INSERT INTO \"my \"\"odd\"\" table\" VALUES(7, 'x', 'acme');");
    ks_rowstore_target t = target("my \"odd\" table", "va'l ue", "the \"id\"");
    t.tenant_column = "ten;ant";
    assert_int_equal(open_store(w, &t, NULL), KS_OK);
    ks_row rows[2];
    size_t n = 0;
    assert_int_equal(scan(w, NULL, 2, rows, &n), KS_OK);
    assert_int_equal(n, 1);
    assert_int_equal(rows[0].id.integer, 7);
    assert_bytes(&rows[0].tenant, KS_VALUE_TEXT, "acme");
    ks_value id = rows[0].id, old = vbytes(KS_VALUE_TEXT, "x");
    int swapped = 0;
    assert_int_equal(begin(w), KS_OK);
    assert_int_equal(cas(w, &id, &old, "y", &swapped), KS_OK);
    assert_int_equal(swapped, 1);
    assert_int_equal(commit(w), KS_OK);
    quarantine_one(w, &id);
    assert_int_equal(scan(w, NULL, 2, rows, &n), KS_OK);
    assert_bytes(&rows[0].value, KS_VALUE_BLOB, "y");
    assert_true(rows[0].quarantined);
    visited vs = {0};
    assert_int_equal(visit(w, &vs), KS_OK);
    assert_string_equal(vs.log, "3:y\n");
}

/* ---- scan -------------------------------------------------------------------- */

/* Rowid tables scan in id order, in batches, to an empty batch. */
static void test_scan_rowid_batches(void **state)
{
    world *w = *state;
    exec_sql(w->path, "CREATE TABLE t(v); "
                      "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 10)"
                      " INSERT INTO t(rowid, v) SELECT 11 - i, 'v' || (11 - i) FROM n;");
    ks_rowstore_target t = target("t", "v", NULL);
    assert_int_equal(open_store(w, &t, NULL), KS_OK);
    uint64_t count = 0;
    assert_int_equal(w->store.ops->count(w->store.self, &count), KS_OK);
    assert_int_equal(count, 10);
    ks_row rows[3];
    ks_value after = {KS_VALUE_NULL, 0, {NULL, 0}};
    int64_t expect = 1;
    size_t n = 0;
    for (;;) {
        assert_int_equal(scan(w, &after, 3, rows, &n), KS_OK);
        if (n == 0)
            break;
        assert_true(n <= 3);
        for (size_t i = 0; i < n; i++) {
            assert_int_equal(rows[i].id.type, KS_VALUE_INTEGER);
            assert_int_equal(rows[i].id.integer, expect);
            char v[8];
            snprintf(v, sizeof v, "v%d", (int)expect);
            assert_bytes(&rows[i].value, KS_VALUE_TEXT, v);
            assert_int_equal(rows[i].tenant.type, KS_VALUE_NULL);
            assert_false(rows[i].quarantined);
            expect++;
        }
        after = rows[n - 1].id;
    }
    assert_int_equal(expect, 11);
}

/* A TEXT primary key scans in its order; `after` may view the previous
 * batch (the store's own buffer). */
static void test_scan_text_key(void **state)
{
    world *w = *state;
    exec_sql(w->path, "CREATE TABLE t(k TEXT PRIMARY KEY NOT NULL, v, tn, c1, c2);"
                      "INSERT INTO t VALUES('delta', 4, 't1', 'x', 1),('alpha', 1, 't2', 'y', 2),"
                      "('charlie', 3, 't1', NULL, 3),('bravo', 2, 't2', 'z', 4);");
    ks_rowstore_target t = target("t", "v", "k");
    t.tenant_column = "tn";
    t.context_columns[0] = "c2";
    t.context_columns[1] = "c1";
    t.n_context_columns = 2;
    assert_int_equal(open_store(w, &t, NULL), KS_OK);
    static const char *const order[] = {"alpha", "bravo", "charlie", "delta"};
    ks_row rows[2];
    size_t n = 0, seen = 0;
    assert_int_equal(scan(w, NULL, 2, rows, &n), KS_OK);
    while (n > 0) {
        for (size_t i = 0; i < n; i++, seen++) {
            assert_bytes(&rows[i].id, KS_VALUE_TEXT, order[seen]);
            assert_int_equal(rows[i].value.type, KS_VALUE_INTEGER);
            assert_int_equal(rows[i].value.integer, (int64_t)seen + 1);
            assert_int_equal(rows[i].tenant.type, KS_VALUE_TEXT);
            assert_int_equal(rows[i].context[0].type, KS_VALUE_INTEGER);
            assert_int_equal(rows[i].context[2].type, KS_VALUE_NULL);
        }
        ks_value after = rows[n - 1].id; /* views the store's buffer */
        assert_int_equal(scan(w, &after, 2, rows, &n), KS_OK);
    }
    assert_int_equal(seen, 4);
    assert_int_equal(scan(w, NULL, 0, rows, &n), KS_OK);
    assert_int_equal(n, 0);
}

/* Every storage class comes back with its type; REAL as its text. */
static void test_scan_value_types(void **state)
{
    world *w = *state;
    exec_sql(w->path, "CREATE TABLE t(id INTEGER PRIMARY KEY, v);"
                      "INSERT INTO t VALUES(1, NULL),(2, -42),(3, 'text'),(4, x'00ff00'),"
                      "(5, ''),(6, x''),(7, 1.5);");
    ks_rowstore_target t = target("t", "v", "id");
    assert_int_equal(open_store(w, &t, NULL), KS_OK);
    ks_row rows[8];
    size_t n = 0;
    assert_int_equal(scan(w, NULL, 8, rows, &n), KS_OK);
    assert_int_equal(n, 7);
    assert_int_equal(rows[0].value.type, KS_VALUE_NULL);
    assert_int_equal(rows[1].value.type, KS_VALUE_INTEGER);
    assert_int_equal(rows[1].value.integer, -42);
    assert_bytes(&rows[2].value, KS_VALUE_TEXT, "text");
    assert_int_equal(rows[3].value.type, KS_VALUE_BLOB);
    assert_int_equal(rows[3].value.bytes.len, 3);
    assert_memory_equal(rows[3].value.bytes.ptr, "\0\xff\0", 3);
    assert_bytes(&rows[4].value, KS_VALUE_TEXT, "");
    assert_bytes(&rows[5].value, KS_VALUE_BLOB, "");
    assert_bytes(&rows[6].value, KS_VALUE_TEXT, "1.5");
}

/* Quarantined rows are flagged in scans, per table and column. */
static void test_scan_quarantine_flag(void **state)
{
    world *w = *state;
    exec_sql(w->path, "CREATE TABLE t(k TEXT PRIMARY KEY NOT NULL, v, w);"
                      "INSERT INTO t VALUES('a', 1, 1),('b', 2, 2),('c', 3, 3);");
    ks_rowstore_target t = target("t", "v", "k");
    assert_int_equal(open_store(w, &t, NULL), KS_OK);
    ks_value b = vbytes(KS_VALUE_TEXT, "b");
    assert_int_equal(w->store.ops->quarantine(w->store.self, &b, "x"), KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(begin(w), KS_OK);
    assert_int_equal(w->store.ops->quarantine(w->store.self, &b, "bad-magic"), KS_OK);
    assert_int_equal(w->store.ops->quarantine(w->store.self, &b, "bad-magic"), KS_OK);
    assert_int_equal(commit(w), KS_OK);
    ks_row rows[4];
    size_t n = 0;
    assert_int_equal(scan(w, NULL, 4, rows, &n), KS_OK);
    assert_int_equal(n, 3);
    assert_false(rows[0].quarantined);
    assert_true(rows[1].quarantined);
    assert_false(rows[2].quarantined);
    assert_int_equal(query_int(w->path, "SELECT count(*) FROM keyshift_quarantine WHERE tbl = 't'"
                                        " AND col = 'v' AND id = 'b' AND error = 'bad-magic'"),
                     1);
    /* another column of the same table is not quarantined */
    t = target("t", "w", "k");
    assert_int_equal(open_store(w, &t, NULL), KS_OK);
    assert_int_equal(scan(w, NULL, 4, rows, &n), KS_OK);
    assert_false(rows[1].quarantined);
}

/* What quarantine_list hands over, copied. */
typedef struct qlisted {
    int n;
    int64_t ids[8];
    char errors[8][32];
    char params[8][32];
} qlisted;

/* quarantine_list's callback: copy the entry into a qlisted. */
static int qlist_one(void *arg, const ks_quarantine_entry *e)
{
    qlisted *l = arg;
    assert_true(l->n < 8);
    assert_int_equal(e->id.type, KS_VALUE_INTEGER);
    assert_true(e->error.len < 32 && e->params.len < 32);
    assert_true(e->time > 0);
    l->ids[l->n] = e->id.integer;
    memcpy(l->errors[l->n], e->error.ptr, e->error.len);
    l->errors[l->n][e->error.len] = '\0';
    if (e->params.len > 0)
        memcpy(l->params[l->n], e->params.ptr, e->params.len);
    l->params[l->n][e->params.len] = '\0';
    l->n++;
    return 0;
}

/* List w's quarantine into *l. */
static void qlist(world *w, qlisted *l)
{
    memset(l, 0, sizeof *l);
    assert_int_equal(w->store.ops->quarantine_list(w->store.self, qlist_one, l), KS_OK);
}

/* Which of rows 1..3 scan flags quarantined, as a bit mask (bit id-1). */
static int flagged(world *w)
{
    ks_row rows[4];
    size_t n = 0;
    assert_int_equal(scan(w, NULL, 4, rows, &n), KS_OK);
    assert_int_equal(n, 3);
    int mask = 0;
    for (size_t i = 0; i < n; i++)
        mask |= rows[i].quarantined ? 1 << (rows[i].id.integer - 1) : 0;
    return mask;
}

/* Quarantine belongs to the bound migration: a row quarantined under
 * "m1" holds back m1's scans, not m2's; m2 quarantining it again takes
 * the entry over (new error and params); unbound, every entry counts.
 * list shows each entry with its migration; release by id, by error or
 * all deletes only what it selects, inside a transaction, and refuses an
 * empty selector. */
static void test_quarantine_per_migration(void **state)
{
    world *w = *state;
    exec_sql(w->path, "CREATE TABLE t(id INTEGER PRIMARY KEY, v);"
                      "INSERT INTO t VALUES(1, 'a'),(2, 'b'),(3, 'c');");
    ks_rowstore_target t = target("t", "v", NULL);
    assert_int_equal(open_store(w, &t, NULL), KS_OK);
    const ks_rowstore_ops *ops = w->store.ops;
    assert_int_equal(ops->bind_migration(w->store.self, (ks_bytes){(const uint8_t *)"m1", 2}), KS_OK);
    ks_value one = vint(1), two = vint(2);
    assert_int_equal(begin(w), KS_OK);
    assert_int_equal(ops->quarantine(w->store.self, &one, "auth-failed"), KS_OK);
    assert_int_equal(ops->quarantine(w->store.self, &two, "auth-failed"), KS_OK);
    assert_int_equal(commit(w), KS_OK);
    assert_int_equal(flagged(w), 3);
    assert_int_equal(ops->bind_migration(w->store.self, (ks_bytes){(const uint8_t *)"m2", 2}), KS_OK);
    assert_int_equal(flagged(w), 0); /* m2 tries m1's rows again */
    assert_int_equal(begin(w), KS_OK);
    assert_int_equal(ops->quarantine(w->store.self, &two, "bad-tenant"), KS_OK);
    assert_int_equal(commit(w), KS_OK);
    assert_int_equal(flagged(w), 2);
    assert_int_equal(ops->bind_migration(w->store.self, (ks_bytes){NULL, 0}), KS_OK);
    assert_int_equal(flagged(w), 3); /* unbound: every entry of the column */
    qlisted l;
    qlist(w, &l);
    assert_int_equal(l.n, 2);
    assert_int_equal(l.ids[0], 1);
    assert_string_equal(l.errors[0], "auth-failed");
    assert_string_equal(l.params[0], "m1");
    assert_int_equal(l.ids[1], 2);
    assert_string_equal(l.errors[1], "bad-tenant");
    assert_string_equal(l.params[1], "m2");
    /* release: a selector is required, and only inside a transaction */
    uint64_t released = 9;
    ks_quarantine_select none = {NULL, NULL, 0}, by_error = {NULL, "auth-failed", 0};
    ks_quarantine_select by_id = {&two, NULL, 0}, all = {NULL, NULL, 1};
    assert_int_equal(ops->quarantine_release(w->store.self, &by_error, &released),
                     KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(begin(w), KS_OK);
    assert_int_equal(ops->quarantine_release(w->store.self, &none, &released),
                     KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ops->quarantine_release(w->store.self, &by_error, &released), KS_OK);
    assert_int_equal(released, 1);
    assert_int_equal(commit(w), KS_OK);
    qlist(w, &l);
    assert_int_equal(l.n, 1);
    assert_int_equal(l.ids[0], 2);
    assert_int_equal(begin(w), KS_OK);
    assert_int_equal(ops->quarantine_release(w->store.self, &by_id, &released), KS_OK);
    assert_int_equal(released, 1);
    assert_int_equal(ops->quarantine_release(w->store.self, &all, &released), KS_OK);
    assert_int_equal(released, 0);
    assert_int_equal(commit(w), KS_OK);
    qlist(w, &l);
    assert_int_equal(l.n, 0);
}

/* A keyshift_quarantine of a store from before quarantine kept its
 * migration (no params column): a read-only open reads it as it is
 * (every entry flags its row, list shows no migration); a writable open
 * adds the column and its index in place, and the old entries keep
 * holding their rows back from every migration until released. */
static void test_quarantine_upgrade(void **state)
{
    world *w = *state;
    exec_sql(w->path,
             "CREATE TABLE t(id INTEGER PRIMARY KEY, v);"
             "INSERT INTO t VALUES(1, 'a'),(2, 'b'),(3, 'c');"
             "CREATE TABLE keyshift_meta(key TEXT PRIMARY KEY, value);"
             "INSERT INTO keyshift_meta VALUES('schema_version', 1);"
             "CREATE TABLE keyshift_migration(tbl TEXT NOT NULL, col TEXT NOT NULL,"
             " params TEXT NOT NULL, state TEXT NOT NULL, cursor, pass INTEGER NOT NULL,"
             " done INTEGER NOT NULL, skipped INTEGER NOT NULL, raced INTEGER NOT NULL,"
             " quarantined INTEGER NOT NULL, wrong_state INTEGER NOT NULL,"
             " started INTEGER NOT NULL, updated INTEGER NOT NULL, finished INTEGER NOT NULL,"
             " PRIMARY KEY (tbl, col, params));"
             "CREATE TABLE keyshift_quarantine(tbl TEXT NOT NULL, col TEXT NOT NULL, id NOT NULL,"
             " error TEXT NOT NULL, time INTEGER NOT NULL, PRIMARY KEY (tbl, col, id));"
             "INSERT INTO keyshift_quarantine VALUES('t', 'v', 3, 'auth-failed', 1000);");
    ks_rowstore_target t = target("t", "v", NULL);
    ks_sqlite_options ro = {.read_only = 1};
    assert_int_equal(open_store(w, &t, &ro), KS_OK);
    assert_int_equal(w->store.ops->bind_migration(w->store.self, (ks_bytes){(const uint8_t *)"m", 1}),
                     KS_OK);
    assert_int_equal(flagged(w), 4);
    qlisted l;
    qlist(w, &l);
    assert_int_equal(l.n, 1);
    assert_string_equal(l.params[0], "");
    assert_int_equal(query_int(w->path, "SELECT count(*) FROM pragma_table_info('keyshift_quarantine')"
                                        " WHERE name = 'params'"),
                     0);
    assert_int_equal(open_store(w, &t, NULL), KS_OK);
    assert_int_equal(query_int(w->path, "SELECT count(*) FROM pragma_table_info('keyshift_quarantine')"
                                        " WHERE name = 'params'"),
                     1);
    assert_int_equal(query_int(w->path, "SELECT count(*) FROM sqlite_master WHERE type = 'index'"
                                        " AND name = 'keyshift_quarantine_params'"),
                     1);
    assert_int_equal(w->store.ops->bind_migration(w->store.self, (ks_bytes){(const uint8_t *)"m", 1}),
                     KS_OK);
    assert_int_equal(flagged(w), 4); /* the old entry holds row 3 back from every migration */
    ks_value one = vint(1);
    assert_int_equal(begin(w), KS_OK);
    assert_int_equal(w->store.ops->quarantine(w->store.self, &one, "auth-failed"), KS_OK);
    assert_int_equal(commit(w), KS_OK);
    assert_int_equal(flagged(w), 5);
    assert_int_equal(w->store.ops->bind_migration(w->store.self, (ks_bytes){(const uint8_t *)"n", 1}),
                     KS_OK);
    assert_int_equal(flagged(w), 4);
    /* opening again changes nothing more */
    assert_int_equal(open_store(w, &t, NULL), KS_OK);
    qlist(w, &l);
    assert_int_equal(l.n, 2);
    assert_string_equal(l.params[0], "m");
    assert_string_equal(l.params[1], "");
}

/* ---- visit_values ------------------------------------------------------------- */

/* visit_values hands every value, of every storage class (REAL as its
 * text), in id order (a TEXT key: not the rowid order), quarantined rows
 * included; a callback's code stops it and is returned, and the store
 * goes on working; inside a transaction it sees the transaction's writes
 * and a stop leaves the transaction open. */
static void test_visit_values(void **state)
{
    world *w = *state;
    exec_sql(w->path, "CREATE TABLE t(k TEXT PRIMARY KEY NOT NULL, v);"
                      "INSERT INTO t VALUES('g', 1.5),('a', NULL),('f', x''),('b', -42),"
                      "('e', ''),('c', 'text'),('d', x'4b5345');");
    static const char all[] = "0:0\n1:-42\n2:text\n3:KSE\n2:\n3:\n2:1.5\n";
    ks_rowstore_target t = target("t", "v", "k");
    assert_int_equal(open_store(w, &t, NULL), KS_OK);
    visited vs = {0};
    assert_int_equal(visit(w, &vs), KS_OK);
    assert_string_equal(vs.log, all);
    assert_int_equal(vs.n, 7);
    ks_value b = vbytes(KS_VALUE_TEXT, "b");
    quarantine_one(w, &b);
    vs.stop_at = 3;
    vs.stop_code = KS_ERR_STOPPED;
    assert_int_equal(visit(w, &vs), KS_ERR_STOPPED);
    assert_string_equal(vs.log, "0:0\n1:-42\n2:text\n");
    vs.stop_at = 0;
    assert_int_equal(visit(w, &vs), KS_OK); /* from the start again, the quarantined row too */
    assert_string_equal(vs.log, all);
    ks_row rows[8];
    size_t n = 0;
    assert_int_equal(scan(w, NULL, 8, rows, &n), KS_OK);
    assert_int_equal(n, 7);
    /* inside a transaction: its own writes; a stop keeps it open */
    assert_int_equal(begin(w), KS_OK);
    ks_value a = vbytes(KS_VALUE_TEXT, "a"), null = {KS_VALUE_NULL, 0, {NULL, 0}};
    int swapped = 0;
    assert_int_equal(cas(w, &a, &null, "new", &swapped), KS_OK);
    assert_int_equal(swapped, 1);
    vs.stop_at = 1;
    assert_int_equal(visit(w, &vs), KS_ERR_STOPPED);
    assert_string_equal(vs.log, "3:new\n");
    assert_int_equal(commit(w), KS_OK);
    assert_int_equal(query_int(w->path, "SELECT count(*) FROM t WHERE k = 'a' AND v = x'6e6577'"),
                     1);
    /* a read-only store visits too, without keyshift's tables */
    exec_sql(w->path, "CREATE TABLE u(v); INSERT INTO u(rowid, v) VALUES(2, 'y'),(1, 'x');");
    t = target("u", "v", NULL);
    ks_sqlite_options ro = {0, 1, 0, KS_SQLITE_SYNC_FULL};
    assert_int_equal(open_store(w, &t, &ro), KS_OK);
    vs.stop_at = 0;
    assert_int_equal(visit(w, &vs), KS_OK);
    assert_string_equal(vs.log, "2:x\n2:y\n");
    assert_int_equal(w->store.ops->visit_values(w->store.self, NULL, &vs), KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(w->store.ops->visit_values(NULL, visit_log, &vs), KS_ERR_INVALID_ARGUMENT);
}

/* ---- visit_rows ---------------------------------------------------------------- */

/* Assert that values a and b are equal: type, integer or bytes. */
static void assert_same_value(const ks_value *a, const ks_value *b)
{
    assert_int_equal(a->type, b->type);
    if (a->type == KS_VALUE_TEXT || a->type == KS_VALUE_BLOB) {
        assert_int_equal(a->bytes.len, b->bytes.len);
        assert_non_null(a->bytes.ptr); /* present even when empty */
        if (a->bytes.len > 0)
            assert_memory_equal(a->bytes.ptr, b->bytes.ptr, a->bytes.len);
    } else if (a->type == KS_VALUE_INTEGER) {
        assert_int_equal(a->integer, b->integer);
    }
}

/* What visit_rows handed its callback, compared row by row with what a
 * scan returned (expect[0, n_expect)); stops with stop_code after stop_at
 * rows (0: never). */
typedef struct rows_seen {
    const ks_row *expect;
    size_t n_expect, n, stop_at;
    ks_err stop_code;
} rows_seen;

/* The visit_rows callback of the tests: the row equals the scan's. */
static ks_err row_check(void *arg, const ks_row *row)
{
    rows_seen *rs = arg;
    assert_true(rs->n < rs->n_expect);
    const ks_row *e = &rs->expect[rs->n++];
    assert_same_value(&row->id, &e->id);
    assert_same_value(&row->value, &e->value);
    assert_same_value(&row->tenant, &e->tenant);
    for (size_t k = 0; k < KS_ROWSTORE_MAX_CONTEXT_COLUMNS; k++)
        assert_same_value(&row->context[k], &e->context[k]);
    assert_int_equal(row->quarantined != 0, e->quarantined != 0);
    return rs->stop_at != 0 && rs->n == rs->stop_at ? rs->stop_code : KS_OK;
}

/* visit_rows hands exactly the rows scan returns for the same after and
 * max (every storage class, tenant, context columns, quarantine flag, a
 * TEXT key's order), batch after batch; a callback's code stops it and
 * is returned, leaving a transaction open; bad arguments are refused. */
static void test_visit_rows(void **state)
{
    world *w = *state;
    exec_sql(w->path, "CREATE TABLE t(k TEXT PRIMARY KEY NOT NULL, v, tn, c1);"
                      "INSERT INTO t VALUES('g', 1.5, 't1', 7),('a', NULL, 't2', 'x'),"
                      "('f', x'', NULL, x'0102'),('b', -42, 't1', NULL),('e', '', 't3', 2.5),"
                      "('c', 'text', 't2', ''),('d', x'4b5345', 't1', 'y');");
    ks_rowstore_target t = target("t", "v", "k");
    t.tenant_column = "tn";
    t.context_columns[0] = "c1";
    t.n_context_columns = 1;
    assert_int_equal(open_store(w, &t, NULL), KS_OK);
    ks_value c = vbytes(KS_VALUE_TEXT, "c");
    quarantine_one(w, &c);
    ks_row rows[3];
    size_t n = 0, total = 0;
    ks_value after = {KS_VALUE_NULL, 0, {NULL, 0}};
    char after_buf[8] = "";
    for (;;) {
        assert_int_equal(scan(w, &after, 3, rows, &n), KS_OK);
        rows_seen rs = {rows, n, 0, 0, KS_OK};
        assert_int_equal(w->store.ops->visit_rows(w->store.self, &after, 3, row_check, &rs), KS_OK);
        assert_int_equal(rs.n, n);
        if (n == 0)
            break;
        total += n;
        /* the next batch starts after this one's last id (copied: the
         * scan's views die at the next call) */
        assert_true(rows[n - 1].id.bytes.len < sizeof after_buf);
        memcpy(after_buf, rows[n - 1].id.bytes.ptr, rows[n - 1].id.bytes.len);
        after = vbytes(KS_VALUE_TEXT, "");
        after.bytes.ptr = (const uint8_t *)after_buf;
        after.bytes.len = rows[n - 1].id.bytes.len;
    }
    assert_int_equal(total, 7);
    /* a stop inside a transaction returns the code and keeps it open */
    assert_int_equal(scan(w, NULL, 3, rows, &n), KS_OK);
    assert_int_equal(n, 3);
    assert_true(rows[2].quarantined);
    assert_int_equal(begin(w), KS_OK);
    rows_seen rs = {rows, n, 0, 2, KS_ERR_STOPPED};
    assert_int_equal(w->store.ops->visit_rows(w->store.self, NULL, 3, row_check, &rs),
                     KS_ERR_STOPPED);
    assert_int_equal(rs.n, 2);
    ks_value a = vbytes(KS_VALUE_TEXT, "a"), null = {KS_VALUE_NULL, 0, {NULL, 0}};
    int swapped = 0;
    assert_int_equal(cas(w, &a, &null, "new", &swapped), KS_OK);
    assert_int_equal(swapped, 1);
    assert_int_equal(commit(w), KS_OK);
    /* max 0 visits nothing; bad arguments */
    rs = (rows_seen){rows, 0, 0, 0, KS_OK};
    assert_int_equal(w->store.ops->visit_rows(w->store.self, NULL, 0, row_check, &rs), KS_OK);
    assert_int_equal(rs.n, 0);
    assert_int_equal(w->store.ops->visit_rows(w->store.self, NULL, 3, NULL, &rs),
                     KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(w->store.ops->visit_rows(NULL, NULL, 3, row_check, &rs),
                     KS_ERR_INVALID_ARGUMENT);
    ks_value bad = {(ks_value_type)9, 0, {NULL, 0}};
    assert_int_equal(w->store.ops->visit_rows(w->store.self, &bad, 3, row_check, &rs),
                     KS_ERR_INVALID_ARGUMENT);
}

/* ---- visit_rows_range ------------------------------------------------------------ */

/* The visit_rows_range callback of the tests: log the row's id (always
 * an INTEGER: a range holds integer ids only) into a visited as "<id>,",
 * with a '*' after a quarantined row's. */
static ks_err range_log(void *arg, const ks_row *row)
{
    char line[32];
    assert_int_equal(row->id.type, KS_VALUE_INTEGER);
    snprintf(line, sizeof line, "%lld%s,", (long long)row->id.integer, row->quarantined ? "*" : "");
    return log_line(arg, line);
}

/* visit_rows_range of w's store for ids after *after (NULL: from the
 * start) up to upto, at most max rows, into rs (cleared first). */
static ks_err range(world *w, const ks_value *after, int64_t upto, size_t max, visited *rs)
{
    ks_value u = vint(upto);
    rs->log[0] = '\0';
    rs->n = 0;
    return w->store.ops->visit_rows_range(w->store.self, after, &u, max, range_log, rs);
}

/* Assert that the range (after, upto] with at most max rows logs want. */
static void assert_range(world *w, const ks_value *after, int64_t upto, size_t max,
                         const char *want)
{
    visited rs = {.stop_at = 0};
    assert_int_equal(range(w, after, upto, max, &rs), KS_OK);
    assert_string_equal(rs.log, want);
}

/* The rowid's range scan: ids above after (or from the start) and at most
 * upto, both bounds at the int64 extremes too, at most max rows in id
 * order; an empty range and one whose upto is below after give nothing;
 * batches of exactly the rows left consume the range; the rows are those
 * visit_rows gives (quarantine flag, tenant, context); a callback's code
 * stops it; bad bounds are refused. */
static void test_visit_rows_range(void **state)
{
    world *w = *state;
    exec_sql(w->path, "CREATE TABLE t(id INTEGER PRIMARY KEY, v, tn, c1);"
                      "INSERT INTO t VALUES(-9223372036854775808, 'min', 'a', 1),(-5, 'm5', 'b', 2),"
                      "(1, 'one', 'a', NULL),(2, x'02', NULL, 'x'),(3, NULL, 'a', 3),"
                      "(5, 5, 'c', 4),(8, 'eight', 'a', 5),(13, '', 'a', 6),"
                      "(9223372036854775807, 'max', 'a', 7);");
    ks_rowstore_target t = target("t", "v", NULL);
    t.tenant_column = "tn";
    t.context_columns[0] = "c1";
    t.n_context_columns = 1;
    assert_int_equal(open_store(w, &t, NULL), KS_OK);
    ks_value q = vint(5);
    quarantine_one(w, &q);
    ks_value null = {KS_VALUE_NULL, 0, {NULL, 0}}, one = vint(1), three = vint(3), five = vint(5),
             eight = vint(8), thirteen = vint(13), max = vint(INT64_MAX), min = vint(INT64_MIN);
    /* bounds: from the start (NULL or a NULL value), after, upto inclusive */
    assert_range(w, NULL, 3, 100, "-9223372036854775808,-5,1,2,3,");
    assert_range(w, &null, -5, 100, "-9223372036854775808,-5,");
    assert_range(w, &one, 8, 100, "2,3,5*,8,");
    assert_range(w, &min, 1, 100, "-5,1,");
    assert_range(w, &thirteen, INT64_MAX, 100, "9223372036854775807,");
    assert_range(w, NULL, INT64_MIN, 100, "-9223372036854775808,");
    /* empty: no id in (3, 4], (5, 5], nothing above INT64_MAX; upto below after */
    assert_range(w, &three, 4, 100, "");
    assert_range(w, &five, 5, 100, "");
    assert_range(w, &max, INT64_MAX, 100, "");
    assert_range(w, &eight, 2, 100, "");
    assert_range(w, &max, INT64_MIN, 100, "");
    /* at most max rows; exact consumption: (1, 8] in batches of 2, then of
     * exactly the rows it holds, ends with an empty batch */
    assert_range(w, NULL, INT64_MAX, 3, "-9223372036854775808,-5,1,");
    assert_range(w, &one, 8, 2, "2,3,");
    assert_range(w, &three, 8, 2, "5*,8,");
    assert_range(w, &eight, 8, 2, "");
    assert_range(w, &one, 8, 4, "2,3,5*,8,");
    assert_range(w, &eight, 8, 4, "");
    assert_range(w, &one, 8, 0, "");
    /* the rows are visit_rows's, cut at upto */
    ks_row rows[8];
    size_t n = 0;
    assert_int_equal(scan(w, &one, 8, rows, &n), KS_OK);
    assert_int_equal(n, 6); /* 2, 3, 5, 8, 13, max */
    rows_seen same = {rows, 4, 0, 0, KS_OK};
    ks_value upto = vint(12);
    assert_int_equal(w->store.ops->visit_rows_range(w->store.self, &one, &upto, 8, row_check, &same),
                     KS_OK);
    assert_int_equal(same.n, 4);
    /* a callback's code stops the visit, inside a transaction that stands */
    assert_int_equal(begin(w), KS_OK);
    visited rs = {.stop_at = 2, .stop_code = KS_ERR_STOPPED};
    assert_int_equal(range(w, NULL, INT64_MAX, 100, &rs), KS_ERR_STOPPED);
    assert_string_equal(rs.log, "-9223372036854775808,-5,");
    int swapped = 0;
    ks_value two = vint(2), old = vbytes(KS_VALUE_BLOB, "\x02");
    assert_int_equal(cas(w, &two, &old, "new", &swapped), KS_OK);
    assert_int_equal(swapped, 1);
    assert_int_equal(commit(w), KS_OK);
    /* bad arguments: upto missing or not an INTEGER, after neither NULL nor
     * an INTEGER, no callback, no store */
    ks_value text = vbytes(KS_VALUE_TEXT, "1"), blob = vbytes(KS_VALUE_BLOB, "1");
    const ks_rowstore_ops *ops = w->store.ops;
    assert_int_equal(ops->visit_rows_range(w->store.self, NULL, NULL, 8, range_log, &rs),
                     KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ops->visit_rows_range(w->store.self, NULL, &text, 8, range_log, &rs),
                     KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ops->visit_rows_range(w->store.self, NULL, &null, 8, range_log, &rs),
                     KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ops->visit_rows_range(w->store.self, &text, &upto, 8, range_log, &rs),
                     KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ops->visit_rows_range(w->store.self, &blob, &upto, 8, range_log, &rs),
                     KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ops->visit_rows_range(w->store.self, NULL, &upto, 8, NULL, &rs),
                     KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ops->visit_rows_range(NULL, NULL, &upto, 8, range_log, &rs),
                     KS_ERR_INVALID_ARGUMENT);
}

/* Ids other than the rowid: an INTEGER PRIMARY KEY column ranges as the
 * rowid; a column of no affinity holding integers and other types gives
 * its integers only (TEXT and BLOB are in no range), and a REAL id in
 * range is refused as scan refuses it; a TEXT key has no row in any range
 * (its bounds would compare as text); a read-only store ranges too. */
static void test_visit_rows_range_id_types(void **state)
{
    world *w = *state;
    exec_sql(w->path, "CREATE TABLE p(k INTEGER PRIMARY KEY, v);"
                      "INSERT INTO p VALUES(4, 'a'),(7, 'b'),(9, 'c');"
                      "CREATE TABLE m(k NOT NULL UNIQUE, v);"
                      "INSERT INTO m VALUES(3, 'a'),('2', 'b'),(x'01', 'c'),(1, 'd'),('abc', 'e'),"
                      "(10, 'f'),(20.5, 'g');"
                      "CREATE TABLE s(k TEXT PRIMARY KEY NOT NULL, v);"
                      "INSERT INTO s VALUES('1', 'a'),('2', 'b'),('10', 'c'),('x', 'd');");
    ks_rowstore_target t = target("p", "v", "k");
    assert_int_equal(open_store(w, &t, NULL), KS_OK);
    ks_value four = vint(4), three = vint(3), ten = vint(10);
    assert_range(w, NULL, 8, 100, "4,7,");
    assert_range(w, &four, 9, 1, "7,");
    t = target("m", "v", "k");
    assert_int_equal(open_store(w, &t, NULL), KS_OK);
    assert_range(w, NULL, 20, 100, "1,3,10,"); /* '2' stays TEXT: no affinity */
    assert_range(w, &three, 10, 100, "10,");
    visited rs = {.stop_at = 0};
    assert_int_equal(range(w, &ten, 30, 100, &rs), KS_ERR_STORE); /* the REAL 20.5 */
    assert_int_equal(range(w, &ten, 20, 100, &rs), KS_OK);
    assert_int_equal(rs.n, 0);
    t = target("s", "v", "k");
    assert_int_equal(open_store(w, &t, NULL), KS_OK);
    assert_range(w, NULL, INT64_MAX, 100, "");
    assert_range(w, NULL, 2, 100, "");
    ks_row rows[4];
    size_t n = 0;
    assert_int_equal(scan(w, NULL, 4, rows, &n), KS_OK); /* scan still reads them all */
    assert_int_equal(n, 4);
    ks_sqlite_options ro = {0, 1, 0, KS_SQLITE_SYNC_FULL};
    t = target("p", "v", "k");
    assert_int_equal(open_store(w, &t, &ro), KS_OK);
    assert_range(w, &four, INT64_MAX, 100, "7,9,");
}

/* ---- cas ----------------------------------------------------------------------- */

/* cas swaps an unchanged row (storing a BLOB), not one changed or deleted
 * by another connection, and compares types (TEXT 'x' is not BLOB 'x'). */
static void test_cas(void **state)
{
    world *w = *state;
    exec_sql(w->path, "CREATE TABLE t(id INTEGER PRIMARY KEY, v);"
                      "INSERT INTO t VALUES(1, 'x'),(2, 'x'),(3, 'x'),(4, x'78'),(5, NULL);");
    ks_rowstore_target t = target("t", "v", NULL);
    assert_int_equal(open_store(w, &t, NULL), KS_OK);
    exec_sql(w->path, "UPDATE t SET v = 'changed' WHERE rowid = 2; DELETE FROM t WHERE rowid = 3;");
    ks_value text_x = vbytes(KS_VALUE_TEXT, "x"), blob_x = vbytes(KS_VALUE_BLOB, "x");
    ks_value null = {KS_VALUE_NULL, 0, {NULL, 0}};
    int swapped = -1;
    ks_value id = vint(1);
    assert_int_equal(cas(w, &id, &text_x, "n", &swapped), KS_ERR_INVALID_ARGUMENT); /* no txn */
    assert_int_equal(begin(w), KS_OK);
    assert_int_equal(begin(w), KS_ERR_INVALID_ARGUMENT); /* nested */
    assert_int_equal(cas(w, &id, &blob_x, "n", &swapped), KS_OK);
    assert_int_equal(swapped, 0); /* TEXT 'x' IS NOT BLOB 'x' */
    assert_int_equal(cas(w, &id, &text_x, "n1", &swapped), KS_OK);
    assert_int_equal(swapped, 1);
    id = vint(2);
    assert_int_equal(cas(w, &id, &text_x, "n2", &swapped), KS_OK);
    assert_int_equal(swapped, 0); /* raced */
    id = vint(3);
    assert_int_equal(cas(w, &id, &text_x, "n3", &swapped), KS_OK);
    assert_int_equal(swapped, 0); /* vanished */
    id = vint(4);
    assert_int_equal(cas(w, &id, &text_x, "n4", &swapped), KS_OK);
    assert_int_equal(swapped, 0);
    assert_int_equal(cas(w, &id, &blob_x, "n4", &swapped), KS_OK);
    assert_int_equal(swapped, 1);
    id = vint(5);
    assert_int_equal(cas(w, &id, &null, "n5", &swapped), KS_OK);
    assert_int_equal(swapped, 1);
    assert_int_equal(commit(w), KS_OK);
    assert_int_equal(query_int(w->path, "SELECT count(*) FROM t WHERE typeof(v) = 'blob' AND "
                                        "v IN (x'6e31', x'6e34', x'6e35')"),
                     3);
    assert_int_equal(query_int(w->path, "SELECT count(*) FROM t WHERE v = 'changed'"), 1);
}

/* ---- transactions and checkpoints -------------------------------------------- */

/* A checkpoint with these counts. */
static ks_checkpoint make_cp(const char *params, const char *state, ks_value cursor, int64_t t)
{
    ks_checkpoint cp;
    memset(&cp, 0, sizeof cp);
    cp.params = (ks_bytes){(const uint8_t *)params, strlen(params)};
    cp.state = (ks_bytes){(const uint8_t *)state, strlen(state)};
    cp.cursor = cursor;
    cp.pass = 2;
    cp.done = 10;
    cp.skipped = 11;
    cp.raced = 12;
    cp.quarantined = 13;
    cp.wrong_state = 14;
    cp.started = 1000;
    cp.updated = t;
    cp.finished = 0;
    return cp;
}

/* A checkpoint saved with a cas rolls back with it; after a commit it
 * loads back; params {NULL, 0} loads the most recently updated one. */
static void test_checkpoint_transactions(void **state)
{
    world *w = *state;
    exec_sql(w->path, "CREATE TABLE t(id INTEGER PRIMARY KEY, v); INSERT INTO t VALUES(1, 'x');");
    ks_rowstore_target t = target("t", "v", NULL);
    assert_int_equal(open_store(w, &t, NULL), KS_OK);
    void *self = w->store.self;
    const ks_rowstore_ops *ops = w->store.ops;
    ks_checkpoint cp = make_cp("mode=rewrap", "running", vint(1), 2000), got;
    ks_bytes p1 = {(const uint8_t *)"mode=rewrap", 11}, none = {NULL, 0};
    assert_int_equal(ops->checkpoint_load(self, p1, &got), KS_ERR_NOT_FOUND);
    assert_int_equal(ops->checkpoint_load(self, none, &got), KS_ERR_NOT_FOUND);
    assert_int_equal(ops->checkpoint_save(self, &cp), KS_ERR_INVALID_ARGUMENT); /* no txn */

    ks_value id = vint(1), old = vbytes(KS_VALUE_TEXT, "x");
    int swapped = 0;
    assert_int_equal(begin(w), KS_OK);
    assert_int_equal(cas(w, &id, &old, "new", &swapped), KS_OK);
    assert_int_equal(swapped, 1);
    assert_int_equal(ops->checkpoint_save(self, &cp), KS_OK);
    rollback(w);
    rollback(w); /* no-op outside a transaction */
    assert_int_equal(ops->checkpoint_load(self, p1, &got), KS_ERR_NOT_FOUND);
    assert_int_equal(query_int(w->path, "SELECT count(*) FROM t WHERE v = 'x'"), 1);

    assert_int_equal(begin(w), KS_OK);
    assert_int_equal(cas(w, &id, &old, "new", &swapped), KS_OK);
    assert_int_equal(ops->checkpoint_save(self, &cp), KS_OK);
    assert_int_equal(commit(w), KS_OK);
    assert_int_equal(ops->checkpoint_load(self, p1, &got), KS_OK);
    assert_int_equal(got.params.len, 11);
    assert_memory_equal(got.params.ptr, "mode=rewrap", 11);
    assert_int_equal(got.state.len, 7);
    assert_memory_equal(got.state.ptr, "running", 7);
    assert_int_equal(got.cursor.type, KS_VALUE_INTEGER);
    assert_int_equal(got.cursor.integer, 1);
    assert_int_equal(got.pass, 2);
    assert_int_equal(got.done, 10);
    assert_int_equal(got.skipped, 11);
    assert_int_equal(got.raced, 12);
    assert_int_equal(got.quarantined, 13);
    assert_int_equal(got.wrong_state, 14);
    assert_int_equal(got.started, 1000);
    assert_int_equal(got.updated, 2000);
    assert_int_equal(got.finished, 0);

    /* a second migration, updated later, then the first saved again
     * (from its loaded views) with an even later time */
    ks_checkpoint cp2 = make_cp("mode=encrypt", "paused", vbytes(KS_VALUE_BLOB, "k\0y"), 3000);
    assert_int_equal(begin(w), KS_OK);
    assert_int_equal(ops->checkpoint_save(self, &cp2), KS_OK);
    assert_int_equal(commit(w), KS_OK);
    assert_int_equal(ops->checkpoint_load(self, none, &got), KS_OK);
    assert_int_equal(got.params.len, 12);
    assert_memory_equal(got.params.ptr, "mode=encrypt", 12);
    assert_int_equal(got.cursor.type, KS_VALUE_BLOB);
    got.updated = 4000;
    got.state = (ks_bytes){(const uint8_t *)"complete", 8};
    assert_int_equal(ops->checkpoint_load(self, p1, &got), KS_OK);
    got.updated = 4000;
    got.finished = 4000;
    assert_int_equal(begin(w), KS_OK);
    assert_int_equal(ops->checkpoint_save(self, &got), KS_OK);
    assert_int_equal(commit(w), KS_OK);
    assert_int_equal(ops->checkpoint_load(self, none, &got), KS_OK);
    assert_memory_equal(got.params.ptr, "mode=rewrap", 11);
    assert_int_equal(got.finished, 4000);
    assert_int_equal(query_int(w->path, "SELECT count(*) FROM keyshift_migration"), 2);
    assert_int_equal(query_int(w->path, "SELECT value FROM keyshift_meta WHERE key = "
                                        "'schema_version'"),
                     KS_SQLITE_SCHEMA_VERSION);
}

/* What test_checkpoint_listing's callback saw. */
typedef struct listed {
    int n, stop_after;
    char what[4][64]; /* "table.column|params" */
} listed;

/* ks_checkpoint_list_fn of the test: record, stop after stop_after. */
static int list_one(void *arg, ks_bytes tbl, ks_bytes col, const ks_checkpoint *cp)
{
    listed *l = arg;
    assert_true(l->n < 4);
    snprintf(l->what[l->n], sizeof l->what[0], "%.*s.%.*s|%.*s", (int)tbl.len, (const char *)tbl.ptr,
             (int)col.len, (const char *)col.ptr, (int)cp->params.len, (const char *)cp->params.ptr);
    l->n++;
    return l->stop_after != 0 && l->n >= l->stop_after;
}

/* Save cp as column's checkpoint through w's store, in its own
 * transaction. */
static void save_cp(world *w, const char *column, const ks_checkpoint *cp)
{
    ks_rowstore_target t = target("t", column, NULL);
    assert_int_equal(open_store(w, &t, NULL), KS_OK);
    assert_int_equal(begin(w), KS_OK);
    assert_int_equal(w->store.ops->checkpoint_save(w->store.self, cp), KS_OK);
    assert_int_equal(commit(w), KS_OK);
    ks_rowstore_close(&w->store);
}

/* List w's checkpoints (of t.column, or all with NULL) into *l. */
static ks_err list_cps(world *w, const char *column, listed *l)
{
    int stop = l->stop_after;
    memset(l, 0, sizeof *l);
    l->stop_after = stop;
    w->err[0] = '\0';
    return ks_rowstore_sqlite_checkpoints(w->path, column ? "t" : NULL, column, list_one, l, w->err,
                                          sizeof w->err);
}

/* ks_rowstore_sqlite_checkpoints (`migrate status`): every column's
 * checkpoints, most recently updated first, or one column's; none, and
 * nothing created, without keyshift's tables; a missing file; a row that
 * checkpoint_load would refuse is refused here too. */
static void test_checkpoint_listing(void **state)
{
    world *w = *state;
    listed l = {0};
    assert_int_equal(list_cps(w, NULL, &l), KS_ERR_NO_TARGET);
    exec_sql(w->path, "CREATE TABLE t(id INTEGER PRIMARY KEY, v, u); INSERT INTO t VALUES(1, 'x', 'y');");
    assert_int_equal(list_cps(w, NULL, &l), KS_OK);
    assert_int_equal(l.n, 0);
    assert_int_equal(query_int(w->path, "SELECT count(*) FROM sqlite_master WHERE name LIKE 'keyshift%'"), 0);

    ks_checkpoint a = make_cp("mode=rewrap", "complete", vint(1), 2000);
    ks_checkpoint b = make_cp("mode=encrypt", "paused", vint(1), 3000);
    ks_checkpoint c = make_cp("mode=encrypt", "running", vint(1), 2500);
    save_cp(w, "v", &a);
    save_cp(w, "v", &b);
    save_cp(w, "u", &c);
    assert_int_equal(list_cps(w, NULL, &l), KS_OK);
    assert_int_equal(l.n, 3);
    assert_string_equal(l.what[0], "t.v|mode=encrypt");
    assert_string_equal(l.what[1], "t.u|mode=encrypt");
    assert_string_equal(l.what[2], "t.v|mode=rewrap");
    assert_int_equal(list_cps(w, "u", &l), KS_OK);
    assert_int_equal(l.n, 1);
    assert_string_equal(l.what[0], "t.u|mode=encrypt");
    l.stop_after = 1;
    assert_int_equal(list_cps(w, NULL, &l), KS_OK);
    assert_int_equal(l.n, 1);
    l.stop_after = 0;

    assert_int_equal(ks_rowstore_sqlite_checkpoints(w->path, "t", NULL, list_one, &l, NULL, 0),
                     KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_rowstore_sqlite_checkpoints(w->path, NULL, NULL, NULL, &l, NULL, 0),
                     KS_ERR_INVALID_ARGUMENT);
    /* untrusted rows: a negative count, a name that is not TEXT */
    exec_sql(w->path, "UPDATE keyshift_migration SET done = -1 WHERE col = 'u'");
    assert_int_equal(list_cps(w, NULL, &l), KS_ERR_STORE);
    assert_non_null(strstr(w->err, "malformed"));
    assert_int_equal(list_cps(w, "v", &l), KS_OK); /* the other column still lists */
    assert_int_equal(l.n, 2);
    exec_sql(w->path, "UPDATE keyshift_migration SET done = 1, col = X'75' WHERE col = 'u'");
    assert_int_equal(list_cps(w, NULL, &l), KS_ERR_STORE);
}

/* Closing with an open transaction rolls it back. */
static void test_close_rolls_back(void **state)
{
    world *w = *state;
    exec_sql(w->path, "CREATE TABLE t(id INTEGER PRIMARY KEY, v); INSERT INTO t VALUES(1, 'x');");
    ks_rowstore_target t = target("t", "v", NULL);
    assert_int_equal(open_store(w, &t, NULL), KS_OK);
    ks_value id = vint(1), old = vbytes(KS_VALUE_TEXT, "x");
    int swapped = 0;
    assert_int_equal(begin(w), KS_OK);
    assert_int_equal(cas(w, &id, &old, "new", &swapped), KS_OK);
    ks_rowstore_close(&w->store);
    assert_null(w->store.ops);
    ks_rowstore_close(&w->store); /* {NULL}: no-op */
    assert_int_equal(query_int(w->path, "SELECT count(*) FROM t WHERE v = 'x'"), 1);
}

/* ---- locks ---------------------------------------------------------------------- */

/* A thread with its own connection that holds BEGIN IMMEDIATE: it writes
 * a byte to `locked` once it holds the lock, then either commits a marker
 * after ~1.5 s (hold_ms) or waits for a byte on `release` and rolls back. */
typedef struct holder {
    const char *path;
    int locked[2];
    int release[2];
    int hold_ms;              /* > 0: commit a marker after this long; 0: wait for release */
    int exclusive;            /* BEGIN EXCLUSIVE (blocks readers too) instead of IMMEDIATE */
} holder;

/* The holder thread's body (see holder). */
static void *hold_lock(void *arg)
{
    holder *h = arg;
    sqlite3 *db = NULL;
    char c = 'L';
    if (sqlite3_open_v2(h->path, &db, SQLITE_OPEN_READWRITE, NULL) != SQLITE_OK ||
        sqlite3_exec(db, h->exclusive ? "BEGIN EXCLUSIVE" : "BEGIN IMMEDIATE", NULL, NULL,
                     NULL) != SQLITE_OK)
        c = 'E';
    if (write(h->locked[1], &c, 1) != 1 || c == 'E') {
        sqlite3_close(db);
        return NULL;
    }
    if (h->hold_ms > 0) {
        struct timespec ts = {h->hold_ms / 1000, (long)(h->hold_ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
        (void)sqlite3_exec(db, "UPDATE t SET v = 'holder' WHERE id = 1; COMMIT", NULL, NULL, NULL);
    } else {
        ssize_t r = read(h->release[0], &c, 1);
        (void)r;
        (void)sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
    }
    sqlite3_close(db);
    return NULL;
}

/* Start a holder on w's database and wait until it holds the lock. */
static void start_holder(world *w, holder *h, pthread_t *th, int hold_ms, int exclusive)
{
    h->path = w->path;
    h->hold_ms = hold_ms;
    h->exclusive = exclusive;
    assert_int_equal(pipe(h->locked), 0);
    assert_int_equal(pipe(h->release), 0);
    assert_int_equal(pthread_create(th, NULL, hold_lock, h), 0);
    char c = 0;
    assert_int_equal(read(h->locked[0], &c, 1), 1);
    assert_int_equal(c, 'L');
}

/* Join the holder and close its pipes. */
static void stop_holder(holder *h, pthread_t th)
{
    char c = 'R';
    assert_int_equal(write(h->release[1], &c, 1), 1);
    assert_int_equal(pthread_join(th, NULL), 0);
    close(h->locked[0]);
    close(h->locked[1]);
    close(h->release[0]);
    close(h->release[1]);
}

/* Create t(id INTEGER PRIMARY KEY, v) holding (1, 'x') and open w's
 * (writable) store on t.v with a busy timeout of timeout_ms. */
static void open_one_row(world *w, uint32_t timeout_ms)
{
    exec_sql(w->path, "CREATE TABLE t(id INTEGER PRIMARY KEY, v); INSERT INTO t VALUES(1, 'x');");
    ks_rowstore_target t = target("t", "v", NULL);
    ks_sqlite_options opts = {timeout_ms, 0, 0, KS_SQLITE_SYNC_FULL};
    assert_int_equal(open_store(w, &t, &opts), KS_OK);
}

/* begin waits (with backoff) while another connection holds the lock and
 * succeeds once it is released: the holder's commit is visible. */
static void test_busy_waits(void **state)
{
    world *w = *state;
    open_one_row(w, 20000);
    holder h;
    pthread_t th;
    start_holder(w, &h, &th, 1500, 0);
    assert_int_equal(begin(w), KS_OK);
    ks_row rows[1];
    size_t n = 0;
    assert_int_equal(scan(w, NULL, 1, rows, &n), KS_OK);
    assert_int_equal(n, 1);
    assert_bytes(&rows[0].value, KS_VALUE_TEXT, "holder"); /* begin came after the release */
    assert_int_equal(commit(w), KS_OK);
    stop_holder(&h, th);
}

/* With a short timeout and the lock held until released, begin gives up
 * with KS_ERR_BUSY; afterwards it succeeds.  Likewise visit_values, a
 * read, under an exclusive lock (a commit under way in rollback-journal
 * mode): it waits through the busy handler, then KS_ERR_BUSY. */
static void test_busy_timeout(void **state)
{
    world *w = *state;
    open_one_row(w, 100);
    holder h;
    pthread_t th;
    start_holder(w, &h, &th, 0, 0);
    assert_int_equal(begin(w), KS_ERR_BUSY);
    /* opening another writable store (tables exist: no write) still works */
    stop_holder(&h, th);
    assert_int_equal(begin(w), KS_OK);
    assert_int_equal(commit(w), KS_OK);
    start_holder(w, &h, &th, 0, 1);
    visited vs = {0};
    assert_int_equal(visit(w, &vs), KS_ERR_BUSY);
    assert_int_equal(vs.n, 0);
    stop_holder(&h, th);
    assert_int_equal(visit(w, &vs), KS_OK);
    assert_string_equal(vs.log, "2:x\n");
}

/* ---- write gate -------------------------------------------------------------------- */

/* A write gate lets begin() through while its SELECT says 1, stops it
 * (KS_ERR_STOPPED, nothing left open) otherwise, sees a change another
 * connection committed, and can be removed; it is refused on read-only
 * stores, inside a transaction and for SQL that does not prepare. */
static void test_write_gate(void **state)
{
    world *w = *state;
    exec_sql(w->path, "CREATE TABLE t(id INTEGER PRIMARY KEY, v);"
                      "INSERT INTO t VALUES(1, 'x');"
                      "CREATE TABLE flag(open INTEGER); INSERT INTO flag VALUES(1);");
    ks_rowstore_target t = target("t", "v", NULL);
    assert_int_equal(open_store(w, &t, NULL), KS_OK);
    assert_int_equal(ks_rowstore_sqlite_set_write_gate(&w->store, "SELECT open FROM main.flag"),
                     KS_OK);
    assert_int_equal(begin(w), KS_OK);
    assert_int_equal(ks_rowstore_sqlite_set_write_gate(&w->store, NULL), KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(commit(w), KS_OK);
    exec_sql(w->path, "UPDATE flag SET open = 0;"); /* e.g. the rollout left backfill */
    assert_int_equal(begin(w), KS_ERR_STOPPED);
    assert_int_equal(commit(w), KS_ERR_INVALID_ARGUMENT); /* nothing was left open */
    exec_sql(w->path, "DELETE FROM flag;");           /* no row: closed too */
    assert_int_equal(begin(w), KS_ERR_STOPPED);
    exec_sql(w->path, "INSERT INTO flag VALUES(2);");   /* only the integer 1 opens it */
    assert_int_equal(begin(w), KS_ERR_STOPPED);
    assert_int_equal(ks_rowstore_sqlite_set_write_gate(&w->store, NULL), KS_OK);
    assert_int_equal(begin(w), KS_OK);
    assert_int_equal(commit(w), KS_OK);
    assert_int_equal(ks_rowstore_sqlite_set_write_gate(&w->store, "SELECT nonsense FROM nowhere"),
                     KS_ERR_STORE);
    ks_sqlite_options ro = {0, 1, 0, KS_SQLITE_SYNC_FULL};
    assert_int_equal(open_store(w, &t, &ro), KS_OK);
    assert_int_equal(ks_rowstore_sqlite_set_write_gate(&w->store, "SELECT 1"),
                     KS_ERR_INVALID_ARGUMENT);
    ks_rowstore other = {NULL, NULL, NULL, 0, KS_ENCODING_BINARY};
    assert_int_equal(ks_rowstore_sqlite_set_write_gate(&other, "SELECT 1"), KS_ERR_INVALID_ARGUMENT);
}

/* ---- full ---------------------------------------------------------------------------- */

/* A cas that cannot grow the database fails with KS_ERR_FULL, rolls the
 * batch back and leaves the database unchanged. */
static void test_full(void **state)
{
    world *w = *state;
    exec_sql(w->path, "CREATE TABLE t(id INTEGER PRIMARY KEY, v);"
                      "INSERT INTO t VALUES(1, 'x'),(2, 'y');");
    ks_rowstore_target t = target("t", "v", NULL);
    assert_int_equal(open_store(w, &t, NULL), KS_OK);
    assert_int_equal(ks_rowstore_sqlite_test_max_pages(&w->store, 1), KS_OK); /* = current size */
    size_t big_len = 256 * 1024;
    char *big = malloc(big_len + 1);
    assert_non_null(big);
    memset(big, 'B', big_len);
    big[big_len] = '\0';
    ks_value id1 = vint(1), id2 = vint(2), x = vbytes(KS_VALUE_TEXT, "x"),
             y = vbytes(KS_VALUE_TEXT, "y");
    int swapped = 0;
    assert_int_equal(begin(w), KS_OK);
    assert_int_equal(cas(w, &id1, &x, "small", &swapped), KS_OK);
    assert_int_equal(swapped, 1);
    ks_err err = cas(w, &id2, &y, big, &swapped);
    if (err == KS_OK)
        err = commit(w);
    assert_int_equal(err, KS_ERR_FULL);
    free(big);
    assert_int_equal(commit(w), KS_ERR_INVALID_ARGUMENT); /* rolled back already */
    assert_int_equal(query_int(w->path, "SELECT count(*) FROM t WHERE id = 1 AND v = 'x'"), 1);
    assert_int_equal(query_int(w->path, "SELECT count(*) FROM t WHERE id = 2 AND v = 'y'"), 1);
    /* the store goes on working */
    assert_int_equal(begin(w), KS_OK);
    assert_int_equal(cas(w, &id1, &x, "s", &swapped), KS_OK);
    assert_int_equal(swapped, 1);
    assert_int_equal(commit(w), KS_OK);
    ks_rowstore other = {NULL, NULL, NULL, 0, KS_ENCODING_BINARY};
    assert_int_equal(ks_rowstore_sqlite_test_max_pages(&other, 1), KS_ERR_INVALID_ARGUMENT);
}

/* ---- read-only, schema version, memory -------------------------------------------- */

/* A read-only store reads, refuses writes and creates nothing. */
static void test_read_only(void **state)
{
    world *w = *state;
    exec_sql(w->path, "CREATE TABLE t(id INTEGER PRIMARY KEY, v); INSERT INTO t VALUES(1, 'x');");
    ks_rowstore_target t = target("t", "v", NULL);
    ks_sqlite_options ro = {0, 1, 0, KS_SQLITE_SYNC_FULL};
    assert_int_equal(open_store(w, &t, &ro), KS_OK);
    ks_row rows[2];
    size_t n = 0;
    assert_int_equal(scan(w, NULL, 2, rows, &n), KS_OK);
    assert_int_equal(n, 1);
    assert_false(rows[0].quarantined);
    assert_int_equal(begin(w), KS_ERR_INVALID_ARGUMENT);
    int swapped = 0;
    ks_value id = vint(1), old = vbytes(KS_VALUE_TEXT, "x");
    assert_int_equal(cas(w, &id, &old, "n", &swapped), KS_ERR_INVALID_ARGUMENT);
    ks_checkpoint cp;
    assert_int_equal(w->store.ops->checkpoint_load(w->store.self, (ks_bytes){NULL, 0}, &cp),
                     KS_ERR_NOT_FOUND);
    assert_int_equal(query_int(w->path, "SELECT count(*) FROM sqlite_master WHERE name LIKE "
                                        "'keyshift%'"),
                     0);
    /* once the tables exist, a read-only store sees quarantine and checkpoints */
    ks_rowstore_close(&w->store);
    assert_int_equal(open_store(w, &t, NULL), KS_OK);
    quarantine_one(w, &id);
    assert_int_equal(open_store(w, &t, &ro), KS_OK);
    assert_int_equal(scan(w, NULL, 2, rows, &n), KS_OK);
    assert_true(rows[0].quarantined);
}

/* ---- synchronous ------------------------------------------------------------------- */

/* PRAGMA synchronous as the store's own connection has it. */
static int64_t store_synchronous(world *w)
{
    int64_t v = -1;
    assert_int_equal(ks_rowstore_sqlite_test_pragma(&w->store, "synchronous", &v), KS_OK);
    return v;
}

/* One compare-and-swap of row 1 from old to nv, committed. */
static void write_one(world *w, const char *old, const char *nv)
{
    ks_value id = vint(1), o = vbytes(KS_VALUE_TEXT, old);
    int swapped = 0;
    assert_int_equal(begin(w), KS_OK);
    assert_int_equal(cas(w, &id, &o, nv, &swapped), KS_OK);
    assert_int_equal(swapped, 1);
    assert_int_equal(commit(w), KS_OK);
}

/* By default the connection runs FULL (2), in a rollback journal and in
 * WAL alike, whatever the build's default. */
static void test_synchronous_default_full(void **state)
{
    world *w = *state;
    exec_sql(w->path, "CREATE TABLE t(id INTEGER PRIMARY KEY, v); INSERT INTO t VALUES(1, 'x');");
    ks_rowstore_target t = target("t", "v", NULL);
    assert_int_equal(open_store(w, &t, NULL), KS_OK);
    assert_int_equal(store_synchronous(w), 2);
    ks_sqlite_options full = {0, 0, 0, KS_SQLITE_SYNC_FULL};
    assert_int_equal(open_store(w, &t, &full), KS_OK);
    assert_int_equal(store_synchronous(w), 2);
    ks_rowstore_close(&w->store);
    exec_sql(w->path, "PRAGMA journal_mode = WAL");
    assert_int_equal(open_store(w, &t, NULL), KS_OK);
    assert_int_equal(store_synchronous(w), 2);
    write_one(w, "x", "y");
    ks_rowstore other = {NULL, NULL, NULL, 0, KS_ENCODING_BINARY};
    int64_t v = 0;
    assert_int_equal(ks_rowstore_sqlite_test_pragma(&other, "synchronous", &v),
                     KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_rowstore_sqlite_test_pragma(&w->store, "synchronous; --", &v),
                     KS_ERR_INVALID_ARGUMENT);
}

/* NORMAL on a WAL database: the connection runs NORMAL (1), writes commit
 * and another connection sees them; a read-only store accepts it too. */
static void test_synchronous_normal_wal(void **state)
{
    world *w = *state;
    exec_sql(w->path, "PRAGMA journal_mode = WAL;"
                      "CREATE TABLE t(id INTEGER PRIMARY KEY, v); INSERT INTO t VALUES(1, 'x');");
    ks_rowstore_target t = target("t", "v", NULL);
    ks_sqlite_options normal = {0, 0, 0, KS_SQLITE_SYNC_NORMAL};
    assert_int_equal(open_store(w, &t, &normal), KS_OK);
    assert_int_equal(store_synchronous(w), 1);
    write_one(w, "x", "y");
    assert_int_equal(query_int(w->path, "SELECT count(*) FROM t WHERE id = 1 AND v = x'79'"), 1);
    ks_sqlite_options ro = {0, 1, 0, KS_SQLITE_SYNC_NORMAL};
    assert_int_equal(open_store(w, &t, &ro), KS_OK);
    assert_int_equal(store_synchronous(w), 1);
}

/* NORMAL on a database in a rollback journal is refused, with a message
 * naming the mode, before anything is created: one that never was in WAL
 * and one taken out of it (only WAL persists in the file: a rollback
 * mode another connection set is that connection's, and the store's own
 * is delete).  So is a value that is neither FULL nor NORMAL. */
static void test_synchronous_normal_refused(void **state)
{
    world *w = *state;
    exec_sql(w->path, "CREATE TABLE t(id INTEGER PRIMARY KEY, v); INSERT INTO t VALUES(1, 'x');");
    ks_rowstore_target t = target("t", "v", NULL);
    ks_sqlite_options normal = {0, 0, 0, KS_SQLITE_SYNC_NORMAL};
    static const char *const setup[] = {"PRAGMA journal_mode = truncate",
                                        "PRAGMA journal_mode = WAL; PRAGMA journal_mode = delete"};
    for (size_t i = 0; i < sizeof setup / sizeof setup[0]; i++) {
        exec_sql(w->path, setup[i]);
        assert_int_equal(open_store(w, &t, &normal), KS_ERR_INVALID_ARGUMENT);
        assert_null(w->store.self);
        if (strstr(w->err, "WAL mode") == NULL || strstr(w->err, "is delete") == NULL)
            fail_msg("message \"%s\" lacks the modes", w->err);
    }
    assert_int_equal(query_int(w->path, "SELECT count(*) FROM sqlite_master WHERE name LIKE "
                                        "'keyshift%'"),
                     0);
    ks_sqlite_options bad = {0, 0, 0, (ks_sqlite_sync)7};
    exec_sql(w->path, "PRAGMA journal_mode = WAL");
    assert_int_equal(open_store(w, &t, &bad), KS_ERR_INVALID_ARGUMENT);
    assert_null(w->store.self);
    assert_non_null(strstr(w->err, "synchronous"));
    assert_int_equal(open_store(w, &t, &normal), KS_OK); /* the same file, now in WAL */
}

/* A database whose keyshift tables are newer than this code is refused. */
static void test_newer_schema_refused(void **state)
{
    world *w = *state;
    exec_sql(w->path, "CREATE TABLE t(id INTEGER PRIMARY KEY, v);"
                      "CREATE TABLE keyshift_meta(key TEXT PRIMARY KEY, value);"
                      "INSERT INTO keyshift_meta VALUES('schema_version', 99);");
    ks_rowstore_target t = target("t", "v", NULL);
    open_fails(w, &t, KS_ERR_STORE, "newer");
}

/* After close, SQLite's memory use returns to its value before open. */
static void test_memory_returns(void **state)
{
    world *w = *state;
    exec_sql(w->path, "CREATE TABLE t(id INTEGER PRIMARY KEY, v); INSERT INTO t VALUES(1, 'x');");
    assert_int_equal(sqlite3_initialize(), SQLITE_OK);
    sqlite3_int64 before = sqlite3_memory_used();
    ks_rowstore_target t = target("t", "v", NULL);
    assert_int_equal(open_store(w, &t, NULL), KS_OK);
    assert_true(sqlite3_memory_used() > before); /* the API counts */
    ks_row rows[2];
    size_t n = 0;
    assert_int_equal(scan(w, NULL, 2, rows, &n), KS_OK);
    visited vs = {0};
    assert_int_equal(visit(w, &vs), KS_OK);
    assert_int_equal(begin(w), KS_OK);
    rollback(w);
    ks_rowstore_close(&w->store);
    assert_int_equal(sqlite3_memory_used(), before);
    /* a failed open releases everything too */
    t = target("t", "nope", NULL);
    assert_int_equal(open_store(w, &t, NULL), KS_ERR_NO_TARGET);
    assert_int_equal(sqlite3_memory_used(), before);
}

int main(void)
{
#define T(f) cmocka_unit_test_setup_teardown(f, world_setup, world_teardown)
    const struct CMUnitTest tests[] = {
        T(test_missing_file),
        T(test_missing_table_or_column),
        T(test_injection_names_missing),
        T(test_id_column_rules),
        T(test_id_stable),
        T(test_odd_names_quoted),
        T(test_scan_rowid_batches),
        T(test_scan_text_key),
        T(test_scan_value_types),
        T(test_scan_quarantine_flag),
        T(test_quarantine_per_migration),
        T(test_quarantine_upgrade),
        T(test_visit_values),
        T(test_visit_rows),
        T(test_visit_rows_range),
        T(test_visit_rows_range_id_types),
        T(test_cas),
        T(test_checkpoint_transactions),
        T(test_checkpoint_listing),
        T(test_close_rolls_back),
        T(test_busy_waits),
        T(test_busy_timeout),
        T(test_full),
        T(test_write_gate),
        T(test_read_only),
        T(test_synchronous_default_full),
        T(test_synchronous_normal_wal),
        T(test_synchronous_normal_refused),
        T(test_newer_schema_refused),
        T(test_memory_returns),
    };
#undef T
    return cmocka_run_group_tests(tests, NULL, NULL);
}
