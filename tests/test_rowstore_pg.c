/*
 * tests/test_rowstore_pg.c -- the PostgreSQL row store
 * (keyshift/rowstore_pg.h, migrate/store/pg/pg_store.c).
 *
 * The group setup starts a throw-away cluster (tests/pg_test.h) and its
 * teardown stops it, as do exit and fatal signals.  Each test starts from
 * an empty public schema; a second libpq connection (the "admin") builds
 * tables, plays the application racing the engine and holds row locks.
 * No test passes or fails on a measured duration.
 */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <libpq-fe.h>
#include <pthread.h>
#include <sodium.h>

#include <keyshift/migrate.h>
#include <keyshift/rowstore.h>
#include <keyshift/rowstore_pg.h>

#include "mem_provider.h"
#include "pg_test.h"

#define BV(s) ((ks_bytes){(const uint8_t *)(s), sizeof(s) - 1})

/* One test's world: the admin connection, the store under test and,
 * for the engine's tests, keys. */
typedef struct world {
    PGconn *admin;
    ks_rowstore store;
    char err[256];
    /* the engine tests' key provider and context (engine_setup) */
    ks_mem_provider mem;
    int have_mem;
    ks_provider prov;
    ks_ctx *ctx;
} world;

/* ---- helpers ------------------------------------------------------------------ */

/* Run sql (no values of the test's own) on the admin connection and
 * assert that it succeeded. */
static void admin_exec(world *w, const char *sql)
{
    ks_pg_test_exec(w->admin, sql);
}

/* A fresh public schema and an admin connection. */
static int world_setup(void **state)
{
    world *w = calloc(1, sizeof *w);
    assert_non_null(w);
    w->admin = ks_pg_test_admin();
    *state = w;
    return 0;
}

/* Close the store, the engine's context and provider, and the admin
 * connection. */
static int world_teardown(void **state)
{
    world *w = *state;
    ks_rowstore_close(&w->store);
    ks_ctx_free(w->ctx);
    if (w->have_mem)
        ks_mem_cleanup(&w->mem);
    PQfinish(w->admin);
    free(w);
    return 0;
}

/* Insert row (id, value) into table t (quoted by the caller) through
 * bound parameters; value NULL inserts NULL. */
static void admin_insert(world *w, const char *t, int64_t id, const void *value, size_t len)
{
    char sql[256], idtext[24];
    snprintf(sql, sizeof sql, "INSERT INTO %s(id, v) VALUES ($1::int8, $2::bytea)", t);
    snprintf(idtext, sizeof idtext, "%lld", (long long)id);
    const char *vals[] = {idtext, (const char *)value};
    int lens[] = {0, (int)len}, fmts[] = {0, 1};
    PGresult *res = PQexecParams(w->admin, sql, 2, NULL, vals, lens, fmts, 0);
    assert_int_equal(PQresultStatus(res), PGRES_COMMAND_OK);
    PQclear(res);
}

/* The value of row id of table t as the admin reads it (binary) into
 * out; returns its length, or -1 for NULL. */
static int admin_value(world *w, const char *t, int64_t id, uint8_t *out, size_t cap)
{
    char sql[256], idtext[24];
    snprintf(sql, sizeof sql, "SELECT v FROM %s WHERE id = $1::int8", t);
    snprintf(idtext, sizeof idtext, "%lld", (long long)id);
    const char *vals[] = {idtext};
    PGresult *res = PQexecParams(w->admin, sql, 1, NULL, vals, NULL, NULL, 1);
    assert_int_equal(PQresultStatus(res), PGRES_TUPLES_OK);
    assert_int_equal(PQntuples(res), 1);
    int n = -1;
    if (!PQgetisnull(res, 0, 0)) {
        n = PQgetlength(res, 0, 0);
        assert_true((size_t)n <= cap);
        memcpy(out, PQgetvalue(res, 0, 0), (size_t)n);
    }
    PQclear(res);
    return n;
}

/* A single-integer query's answer on the admin connection. */
static long long admin_int(world *w, const char *sql)
{
    return ks_pg_test_int(w->admin, sql);
}

/* Open the store on table t / column c (id column idc, may be NULL). */
static ks_err open_store(world *w, const char *t, const char *c, const char *idc,
                         const ks_pg_options *o)
{
    ks_rowstore_close(&w->store);
    ks_rowstore_target tg = {.table = t, .column = c, .id_column = idc};
    return ks_rowstore_pg_open(ks_pg_test_conninfo, &tg, o, &w->store, w->err, sizeof w->err);
}

/* Table items(id bigint primary key, v bytea) with rows 1..n, value "v<id>". */
static void make_items(world *w, int n)
{
    admin_exec(w, "CREATE TABLE items(id bigint PRIMARY KEY, v bytea)");
    for (int i = 1; i <= n; i++) {
        char v[16];
        snprintf(v, sizeof v, "v%d", i);
        admin_insert(w, "items", i, v, strlen(v));
    }
}

/* A ks_value view of a C string as a BLOB. */
static ks_value blob(const char *s)
{
    return (ks_value){KS_VALUE_BLOB, 0, {(const uint8_t *)s, strlen(s)}};
}

/* ---- opening --------------------------------------------------------------------- */

/* Missing, wrong and reserved targets are refused with the right code;
 * odd names are found and quoted; a hostile name is only ever looked up. */
static void test_open_checks(void **state)
{
    world *w = *state;
    admin_exec(w, "CREATE TABLE t(id bigint PRIMARY KEY, v bytea, tv text, n int)");
    admin_exec(w, "CREATE TABLE nouniq(id bigint NOT NULL, v bytea)");
    admin_exec(w, "CREATE TABLE nullable(id bigint UNIQUE, v bytea)");
    admin_exec(w, "CREATE TABLE tid(id text PRIMARY KEY, v bytea)");
    admin_exec(w, "CREATE TABLE nopk(a int, v bytea)");
    admin_exec(w, "CREATE TABLE uq(k serial PRIMARY KEY, id int NOT NULL UNIQUE, v bytea)");
    admin_exec(w, "CREATE VIEW tv AS SELECT * FROM t");
    admin_exec(w, "CREATE TABLE \"Mixed Case\"(\"the id\" int PRIMARY KEY, \"Val\"\"ue\" bytea)");
    admin_exec(w, "INSERT INTO \"Mixed Case\" VALUES (1, 'a'), (2, 'b')");

    assert_int_equal(open_store(w, "missing", "v", NULL, NULL), KS_ERR_NO_TARGET);
    assert_non_null(strstr(w->err, "missing"));
    assert_null(w->store.ops);
    assert_int_equal(open_store(w, "t", "nope", NULL, NULL), KS_ERR_NO_TARGET);
    assert_int_equal(open_store(w, "t", "v", "nope", NULL), KS_ERR_NO_TARGET);
    assert_int_equal(open_store(w, "t", "tv", NULL, NULL), KS_ERR_NO_TARGET); /* not bytea */
    assert_non_null(strstr(w->err, "bytea"));
    assert_int_equal(open_store(w, "t", "v", "n", NULL), KS_ERR_NO_TARGET);  /* not unique */
    assert_non_null(strstr(w->err, "neither the primary key nor NOT NULL with a unique index"));
    assert_int_equal(open_store(w, "nouniq", "v", "id", NULL), KS_ERR_NO_TARGET);
    assert_int_equal(open_store(w, "nullable", "v", "id", NULL), KS_ERR_NO_TARGET);
    assert_int_equal(open_store(w, "tid", "v", NULL, NULL), KS_ERR_NO_TARGET); /* text id */
    assert_int_equal(open_store(w, "nopk", "v", NULL, NULL), KS_ERR_NO_TARGET);
    assert_int_equal(open_store(w, "tv", "v", NULL, NULL), KS_ERR_INVALID_ARGUMENT); /* view */
    assert_int_equal(open_store(w, "t", "id", NULL, NULL), KS_ERR_NO_TARGET); /* id as value: bigint */
    assert_int_equal(open_store(w, "keyshift_migration", "v", NULL, NULL), KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(open_store(w, "", "v", NULL, NULL), KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(open_store(w, "t", NULL, NULL, NULL), KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(open_store(w, "T", "v", NULL, NULL), KS_ERR_NO_TARGET); /* exact spelling */
    /* a hostile name is a name, never SQL */
    assert_int_equal(open_store(w, "t; DROP TABLE t; --", "v", NULL, NULL), KS_ERR_NO_TARGET);
    assert_int_equal(open_store(w, "t", "v\"; DROP TABLE t; --", NULL, NULL), KS_ERR_NO_TARGET);
    assert_int_equal(admin_int(w, "SELECT count(*) FROM pg_class WHERE relname = 't'"), 1);
    /* a unique NOT NULL column that is not the primary key: a stable id
     * (no rowid here: every id the store accepts is), which a context
     * may bind (docs/migration.md, "Ids") */
    assert_int_equal(open_store(w, "uq", "v", "id", NULL), KS_OK);
    assert_int_equal(w->store.id_stable, 1);
    assert_int_equal(ks_migrate_check_context(&w->store, BV("uq:{id}:v")), KS_OK);
    assert_int_equal(open_store(w, "t", "v", NULL, NULL), KS_OK); /* the primary key */
    assert_int_equal(w->store.id_stable, 1);
    /* odd names: a space, capitals, a quote */
    assert_int_equal(open_store(w, "Mixed Case", "Val\"ue", NULL, NULL), KS_OK);
    ks_row rows[4];
    size_t n = 0;
    assert_int_equal(w->store.ops->scan(w->store.self, NULL, 4, rows, &n), KS_OK);
    assert_int_equal(n, 2);
    assert_int_equal(rows[1].id.integer, 2);
    assert_int_equal(rows[1].value.type, KS_VALUE_BLOB);
    assert_memory_equal(rows[1].value.bytes.ptr, "b", 1);
    assert_int_equal(w->store.ops->begin(w->store.self), KS_OK);
    ks_value id = {KS_VALUE_INTEGER, 2, {NULL, 0}}, old = blob("b");
    int swapped = 0;
    assert_int_equal(w->store.ops->cas(w->store.self, &id, &old, BV("B"), &swapped), KS_OK);
    assert_int_equal(swapped, 1);
    assert_int_equal(w->store.ops->commit(w->store.self), KS_OK);
    assert_int_equal(admin_int(w, "SELECT count(*) FROM \"Mixed Case\" WHERE \"Val\"\"ue\" = 'B'"), 1);
    /* the tables were made in the target's schema */
    assert_int_equal(admin_int(w, "SELECT count(*) FROM pg_tables WHERE schemaname = 'public' "
                                  "AND tablename LIKE 'keyshift_%'"),
                     2);
    /* an unreachable server */
    ks_rowstore_close(&w->store);
    ks_rowstore_target tg = {.table = "t", .column = "v"};
    assert_int_equal(ks_rowstore_pg_open("host=/nonexistent-ks-dir port=1 dbname=x connect_timeout=2",
                                         &tg, NULL, &w->store, w->err, sizeof w->err),
                     KS_ERR_UNAVAILABLE);
}

/* A read-only store creates nothing, scans, and refuses to write. */
static void test_read_only(void **state)
{
    world *w = *state;
    make_items(w, 3);
    ks_pg_options o = {.read_only = 1};
    assert_int_equal(open_store(w, "items", "v", NULL, &o), KS_OK);
    assert_int_equal(admin_int(w, "SELECT count(*) FROM pg_tables WHERE tablename LIKE 'keyshift_%'"), 0);
    ks_row rows[4];
    size_t n = 0;
    assert_int_equal(w->store.ops->scan(w->store.self, NULL, 4, rows, &n), KS_OK);
    assert_int_equal(n, 3);
    assert_int_equal(rows[0].quarantined, 0);
    ks_checkpoint cp;
    assert_int_equal(w->store.ops->checkpoint_load(w->store.self, (ks_bytes){NULL, 0}, &cp),
                     KS_ERR_NOT_FOUND);
    assert_int_equal(w->store.ops->begin(w->store.self), KS_ERR_INVALID_ARGUMENT);
    uint64_t c = 0;
    assert_int_equal(w->store.ops->count(w->store.self, &c), KS_OK);
    assert_int_equal(c, 3);
}

/* ---- scans ------------------------------------------------------------------------- */

/* The ids seen_fn saw, in order. */
static int64_t g_seen[64];
static size_t g_nseen;

/* Row visitor: record the row's id in g_seen. */
static ks_err seen_fn(void *arg, const ks_row *row)
{
    (void)arg;
    g_seen[g_nseen++] = row->id.integer;
    return KS_OK;
}

/* Keyset paging returns every row once in id order, whatever the
 * insertion order; tenant and context columns come back typed. */
static void test_scan_paging(void **state)
{
    world *w = *state;
    admin_exec(w, "CREATE TABLE p(id int PRIMARY KEY, v bytea, ten text, c1 int, c2 bytea, "
                  "c3 numeric)");
    /* ids -30, -27, ..., 42 inserted in a scrambled order */
    int ids[25];
    for (int i = 0; i < 25; i++)
        ids[i] = -30 + 3 * ((i * 7) % 25);
    for (int i = 0; i < 25; i++) {
        char sql[160];
        snprintf(sql, sizeof sql,
                 "INSERT INTO p VALUES (%d, 'x', 'acme', %d, '\\x0102', 1.5)", ids[i], ids[i] * 2);
        admin_exec(w, sql);
    }
    admin_exec(w, "UPDATE p SET v = NULL WHERE id = 0");
    ks_rowstore_target tg = {.table = "p", .column = "v", .tenant_column = "ten",
                             .context_columns = {"c1", "c2", "c3"}, .n_context_columns = 3};
    assert_int_equal(ks_rowstore_pg_open(ks_pg_test_conninfo, &tg, NULL, &w->store, w->err,
                                         sizeof w->err),
                     KS_OK);
    ks_row rows[7];
    ks_value after = {KS_VALUE_NULL, 0, {NULL, 0}};
    int64_t last = INT64_MIN;
    size_t total = 0, n;
    do {
        assert_int_equal(w->store.ops->scan(w->store.self, &after, 7, rows, &n), KS_OK);
        for (size_t i = 0; i < n; i++) {
            assert_int_equal(rows[i].id.type, KS_VALUE_INTEGER);
            assert_true(rows[i].id.integer > last);
            last = rows[i].id.integer;
            assert_int_equal(rows[i].id.integer, -30 + 3 * (int64_t)(total + i));
            if (last == 0) {
                assert_int_equal(rows[i].value.type, KS_VALUE_NULL);
            } else {
                assert_int_equal(rows[i].value.type, KS_VALUE_BLOB);
                assert_int_equal(rows[i].value.bytes.len, 1);
            }
            assert_int_equal(rows[i].tenant.type, KS_VALUE_TEXT);
            assert_memory_equal(rows[i].tenant.bytes.ptr, "acme", 4);
            assert_int_equal(rows[i].context[0].type, KS_VALUE_INTEGER);
            assert_int_equal(rows[i].context[0].integer, last * 2);
            assert_int_equal(rows[i].context[1].type, KS_VALUE_BLOB);
            assert_int_equal(rows[i].context[1].bytes.len, 2);
            assert_int_equal(rows[i].context[2].type, KS_VALUE_TEXT);
            assert_memory_equal(rows[i].context[2].bytes.ptr, "1.5", 3);
        }
        total += n;
        if (n > 0)
            after = (ks_value){KS_VALUE_INTEGER, last, {NULL, 0}};
    } while (n > 0);
    assert_int_equal(total, 25);
    uint64_t c = 0;
    assert_int_equal(w->store.ops->count(w->store.self, &c), KS_OK);
    assert_int_equal(c, 25);
    /* visit_rows: the same rows as scan */
    g_nseen = 0;
    ks_value from = {KS_VALUE_INTEGER, 3, {NULL, 0}};
    assert_int_equal(w->store.ops->visit_rows(w->store.self, &from, 5, seen_fn, NULL), KS_OK);
    assert_int_equal(g_nseen, 5);
    assert_int_equal(g_seen[0], 6);
    assert_int_equal(g_seen[4], 18);
    /* a text cursor is not an id of this store */
    ks_value bad = blob("x");
    assert_int_equal(w->store.ops->scan(w->store.self, &bad, 7, rows, &n), KS_ERR_INVALID_ARGUMENT);
}

/* ---- writes ------------------------------------------------------------------------ */

/* cas_batch swaps the rows still at their old values and reports the
 * one the application changed between the scan and the write as raced;
 * the application's value stands. */
static void test_cas_raced(void **state)
{
    world *w = *state;
    make_items(w, 4);
    assert_int_equal(open_store(w, "items", "v", NULL, NULL), KS_OK);
    const ks_rowstore_ops *ops = w->store.ops;
    assert_non_null(ops->cas_batch);
    ks_row rows[4];
    size_t n = 0;
    assert_int_equal(ops->scan(w->store.self, NULL, 4, rows, &n), KS_OK);
    assert_int_equal(n, 4);
    /* keep copies: the views die at the next call */
    ks_value ids[4], olds[4];
    char oldtext[4][8];
    for (size_t i = 0; i < 4; i++) {
        ids[i] = rows[i].id;
        memcpy(oldtext[i], rows[i].value.bytes.ptr, rows[i].value.bytes.len);
        oldtext[i][rows[i].value.bytes.len] = '\0';
        olds[i] = blob(oldtext[i]);
    }
    admin_exec(w, "UPDATE items SET v = 'app' WHERE id = 2");  /* the race */
    admin_exec(w, "DELETE FROM items WHERE id = 4");           /* vanished */
    const ks_value *pid[4] = {&ids[0], &ids[1], &ids[2], &ids[3]};
    const ks_value *pold[4] = {&olds[0], &olds[1], &olds[2], &olds[3]};
    ks_bytes news[4] = {BV("n1"), BV("n2"), BV("n3"), BV("n4")};
    int swapped[4] = {9, 9, 9, 9};
    assert_int_equal(ops->begin(w->store.self), KS_OK);
    assert_int_equal(ops->cas_batch(w->store.self, 4, pid, pold, news, swapped), KS_OK);
    assert_int_equal(swapped[0], 1);
    assert_int_equal(swapped[1], 0);
    assert_int_equal(swapped[2], 1);
    assert_int_equal(swapped[3], 0);
    assert_int_equal(ops->commit(w->store.self), KS_OK);
    uint8_t v[16];
    assert_int_equal(admin_value(w, "items", 1, v, sizeof v), 2);
    assert_memory_equal(v, "n1", 2);
    assert_int_equal(admin_value(w, "items", 2, v, sizeof v), 3);
    assert_memory_equal(v, "app", 3);
    assert_int_equal(admin_value(w, "items", 3, v, sizeof v), 2);
    assert_memory_equal(v, "n3", 2);
    /* a NULL old value matches a NULL row; cas outside a transaction is refused */
    admin_exec(w, "UPDATE items SET v = NULL WHERE id = 1");
    ks_value null = {KS_VALUE_NULL, 0, {NULL, 0}};
    int one = 0;
    assert_int_equal(ops->cas(w->store.self, &ids[0], &null, BV("z"), &one), KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ops->begin(w->store.self), KS_OK);
    assert_int_equal(ops->cas(w->store.self, &ids[0], &null, BV("z"), &one), KS_OK);
    assert_int_equal(one, 1);
    ops->rollback(w->store.self);
    assert_int_equal(admin_value(w, "items", 1, v, sizeof v), -1);
}

/* Quarantine is idempotent, never touches the row, and flags it in scans. */
static void test_quarantine(void **state)
{
    world *w = *state;
    make_items(w, 3);
    assert_int_equal(open_store(w, "items", "v", NULL, NULL), KS_OK);
    const ks_rowstore_ops *ops = w->store.ops;
    ks_value id = {KS_VALUE_INTEGER, 2, {NULL, 0}};
    for (int round = 0; round < 2; round++) {
        assert_int_equal(ops->begin(w->store.self), KS_OK);
        assert_int_equal(ops->quarantine(w->store.self, &id, "auth-failed"), KS_OK);
        assert_int_equal(ops->quarantine(w->store.self, &id, "auth-failed"), KS_OK);
        assert_int_equal(ops->commit(w->store.self), KS_OK);
    }
    assert_int_equal(admin_int(w, "SELECT count(*) FROM keyshift_quarantine WHERE tbl = 'items' "
                                  "AND col = 'v' AND id = '2' AND error = 'auth-failed'"),
                     1);
    ks_row rows[4];
    size_t n = 0;
    assert_int_equal(ops->scan(w->store.self, NULL, 4, rows, &n), KS_OK);
    assert_int_equal(n, 3);
    assert_int_equal(rows[0].quarantined, 0);
    assert_int_equal(rows[1].quarantined, 1);
    assert_int_equal(rows[2].quarantined, 0);
    uint8_t v[8];
    assert_int_equal(admin_value(w, "items", 2, v, sizeof v), 2);
    assert_memory_equal(v, "v2", 2);
    assert_int_equal(ops->begin(w->store.self), KS_OK);
    assert_int_equal(ops->quarantine(w->store.self, &id, ""), KS_ERR_INVALID_ARGUMENT);
    ops->rollback(w->store.self);
}

/* What quarantine_list hands over: ids and params, concatenated. */
static int pg_qlist_one(void *arg, const ks_quarantine_entry *e)
{
    char *out = arg;
    size_t len = strlen(out);
    assert_int_equal(e->id.type, KS_VALUE_INTEGER);
    snprintf(out + len, 128 - len, "%lld:%.*s:%.*s;", (long long)e->id.integer, (int)e->error.len,
             (const char *)e->error.ptr, (int)e->params.len, (const char *)e->params.ptr);
    return 0;
}

/* The quarantine flags of rows 1..3 as a bit mask (bit id-1). */
static int pg_flagged(world *w)
{
    ks_row rows[4];
    size_t n = 0;
    assert_int_equal(w->store.ops->scan(w->store.self, NULL, 4, rows, &n), KS_OK);
    assert_int_equal(n, 3);
    int mask = 0;
    for (size_t i = 0; i < n; i++)
        mask |= rows[i].quarantined ? 1 << (rows[i].id.integer - 1) : 0;
    return mask;
}

/* Bind w's store to migration m (NULL: unbind). */
static void pg_bind(world *w, const char *m)
{
    ks_bytes b = m != NULL ? (ks_bytes){(const uint8_t *)m, strlen(m)} : (ks_bytes){NULL, 0};
    assert_int_equal(w->store.ops->bind_migration(w->store.self, b), KS_OK);
}

/* As the SQLite store: quarantine belongs to the bound migration, an
 * older table (no params column) is upgraded in place and its entries
 * hold their rows back from every migration, list and release. */
static void test_quarantine_per_migration(void **state)
{
    world *w = *state;
    make_items(w, 3);
    admin_exec(w, "CREATE TABLE keyshift_migration(tbl text NOT NULL, col text NOT NULL, "
                  "params text NOT NULL, state text NOT NULL, cursor bigint, pass bigint NOT NULL, "
                  "done bigint NOT NULL, skipped bigint NOT NULL, raced bigint NOT NULL, "
                  "quarantined bigint NOT NULL, wrong_state bigint NOT NULL, started bigint NOT "
                  "NULL, updated bigint NOT NULL, finished bigint NOT NULL, saved timestamptz NOT "
                  "NULL, PRIMARY KEY (tbl, col, params))");
    admin_exec(w, "CREATE TABLE keyshift_quarantine(tbl text NOT NULL, col text NOT NULL, "
                  "id text NOT NULL, error text NOT NULL, time bigint NOT NULL, "
                  "PRIMARY KEY (tbl, col, id))");
    admin_exec(w, "INSERT INTO keyshift_quarantine VALUES ('items', 'v', '3', 'bad-magic', 1000)");
    ks_pg_options ro = {.read_only = 1};
    assert_int_equal(open_store(w, "items", "v", NULL, &ro), KS_OK);
    pg_bind(w, "m1");
    assert_int_equal(pg_flagged(w), 4);
    assert_int_equal(admin_int(w, "SELECT count(*) FROM pg_attribute WHERE attrelid = "
                                  "'keyshift_quarantine'::regclass AND attname = 'params'"),
                     0);
    assert_int_equal(open_store(w, "items", "v", NULL, NULL), KS_OK);
    assert_int_equal(admin_int(w, "SELECT count(*) FROM pg_attribute WHERE attrelid = "
                                  "'keyshift_quarantine'::regclass AND attname = 'params'"),
                     1);
    const ks_rowstore_ops *ops = w->store.ops;
    pg_bind(w, "m1");
    ks_value one = {KS_VALUE_INTEGER, 1, {NULL, 0}}, two = {KS_VALUE_INTEGER, 2, {NULL, 0}};
    assert_int_equal(ops->begin(w->store.self), KS_OK);
    assert_int_equal(ops->quarantine(w->store.self, &one, "auth-failed"), KS_OK);
    assert_int_equal(ops->quarantine(w->store.self, &two, "auth-failed"), KS_OK);
    assert_int_equal(ops->commit(w->store.self), KS_OK);
    assert_int_equal(pg_flagged(w), 7);
    pg_bind(w, "m2");
    assert_int_equal(pg_flagged(w), 4); /* m1's rows are tried again; the old entry holds */
    assert_int_equal(ops->begin(w->store.self), KS_OK);
    assert_int_equal(ops->quarantine(w->store.self, &two, "bad-tenant"), KS_OK);
    assert_int_equal(ops->commit(w->store.self), KS_OK);
    assert_int_equal(pg_flagged(w), 6);
    pg_bind(w, NULL);
    assert_int_equal(pg_flagged(w), 7);
    char listed[128] = "";
    assert_int_equal(ops->quarantine_list(w->store.self, pg_qlist_one, listed), KS_OK);
    assert_string_equal(listed, "1:auth-failed:m1;2:bad-tenant:m2;3:bad-magic:;");
    uint64_t released = 0;
    ks_quarantine_select none = {NULL, NULL, 0}, by_error = {NULL, "auth-failed", 0};
    ks_quarantine_select by_id = {&two, NULL, 0}, all = {NULL, NULL, 1};
    assert_int_equal(ops->begin(w->store.self), KS_OK);
    assert_int_equal(ops->quarantine_release(w->store.self, &none, &released),
                     KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ops->quarantine_release(w->store.self, &by_error, &released), KS_OK);
    assert_int_equal(released, 1);
    assert_int_equal(ops->quarantine_release(w->store.self, &by_id, &released), KS_OK);
    assert_int_equal(released, 1);
    assert_int_equal(ops->commit(w->store.self), KS_OK);
    listed[0] = '\0';
    assert_int_equal(ops->quarantine_list(w->store.self, pg_qlist_one, listed), KS_OK);
    assert_string_equal(listed, "3:bad-magic:;");
    assert_int_equal(ops->begin(w->store.self), KS_OK);
    assert_int_equal(ops->quarantine_release(w->store.self, &all, &released), KS_OK);
    assert_int_equal(released, 1);
    assert_int_equal(ops->commit(w->store.self), KS_OK);
    assert_int_equal(pg_flagged(w), 0);
}

/* A checkpoint round-trips in its batch's transaction; a rollback
 * discards both the checkpoint and the batch's writes. */
static void test_checkpoint(void **state)
{
    world *w = *state;
    make_items(w, 2);
    assert_int_equal(open_store(w, "items", "v", NULL, NULL), KS_OK);
    const ks_rowstore_ops *ops = w->store.ops;
    ks_checkpoint cp = {.params = BV("mode=encrypt;key=k"), .state = BV("running"),
                        .cursor = {KS_VALUE_INTEGER, 1, {NULL, 0}}, .pass = 1, .done = 1,
                        .skipped = 2, .raced = 3, .quarantined = 4, .wrong_state = 5,
                        .started = 1000, .updated = 1001, .finished = 0};
    ks_value id1 = {KS_VALUE_INTEGER, 1, {NULL, 0}}, old1 = blob("v1");
    int swapped = 0;
    assert_int_equal(ops->begin(w->store.self), KS_OK);
    assert_int_equal(ops->cas(w->store.self, &id1, &old1, BV("w1"), &swapped), KS_OK);
    assert_int_equal(ops->checkpoint_save(w->store.self, &cp), KS_OK);
    ks_checkpoint got;
    assert_int_equal(ops->checkpoint_load(w->store.self, cp.params, &got), KS_OK); /* same txn */
    assert_int_equal(got.done, 1);
    assert_int_equal(ops->commit(w->store.self), KS_OK);
    assert_int_equal(ops->checkpoint_load(w->store.self, cp.params, &got), KS_OK);
    assert_int_equal(got.params.len, cp.params.len);
    assert_memory_equal(got.params.ptr, cp.params.ptr, cp.params.len);
    assert_memory_equal(got.state.ptr, "running", 7);
    assert_int_equal(got.cursor.type, KS_VALUE_INTEGER);
    assert_int_equal(got.cursor.integer, 1);
    assert_int_equal(got.pass, 1);
    assert_int_equal(got.skipped, 2);
    assert_int_equal(got.raced, 3);
    assert_int_equal(got.quarantined, 4);
    assert_int_equal(got.wrong_state, 5);
    assert_int_equal(got.started, 1000);
    assert_int_equal(got.updated, 1001);
    assert_int_equal(got.finished, 0);
    /* a later batch rolled back: neither its checkpoint nor its write stays */
    ks_checkpoint next = cp;
    next.cursor.integer = 2;
    next.done = 2;
    next.updated = 1002;
    ks_value id2 = {KS_VALUE_INTEGER, 2, {NULL, 0}}, old2 = blob("v2");
    assert_int_equal(ops->begin(w->store.self), KS_OK);
    assert_int_equal(ops->cas(w->store.self, &id2, &old2, BV("w2"), &swapped), KS_OK);
    assert_int_equal(ops->checkpoint_save(w->store.self, &next), KS_OK);
    ops->rollback(w->store.self);
    assert_int_equal(ops->checkpoint_load(w->store.self, (ks_bytes){NULL, 0}, &got), KS_OK);
    assert_int_equal(got.cursor.integer, 1);
    assert_int_equal(got.done, 1);
    uint8_t v[8];
    assert_int_equal(admin_value(w, "items", 2, v, sizeof v), 2);
    assert_memory_equal(v, "v2", 2);
    /* the latest of two: a NULL cursor round-trips too */
    ks_checkpoint other = cp;
    other.params = BV("mode=rewrap");
    other.cursor = (ks_value){KS_VALUE_NULL, 0, {NULL, 0}};
    other.updated = 2000;
    assert_int_equal(ops->begin(w->store.self), KS_OK);
    assert_int_equal(ops->checkpoint_save(w->store.self, &other), KS_OK);
    assert_int_equal(ops->commit(w->store.self), KS_OK);
    assert_int_equal(ops->checkpoint_load(w->store.self, (ks_bytes){NULL, 0}, &got), KS_OK);
    assert_memory_equal(got.params.ptr, "mode=rewrap", 11);
    assert_int_equal(got.cursor.type, KS_VALUE_NULL);
    assert_int_equal(ops->checkpoint_load(w->store.self, BV("nope"), &got), KS_ERR_NOT_FOUND);
}

/* What list_fn saw of a checkpoint listing. */
typedef struct listed {
    int n;
    char tables[4][16];
    uint64_t done[4];
} listed;

/* Record one listed checkpoint (ks_checkpoint_list_fn); stop after 4. */
static int list_fn(void *arg, ks_bytes table, ks_bytes column, const ks_checkpoint *cp)
{
    listed *l = arg;
    assert_int_equal(column.len, 1);
    assert_true(table.len < sizeof l->tables[0]);
    memcpy(l->tables[l->n], table.ptr, table.len);
    l->tables[l->n][table.len] = '\0';
    l->done[l->n] = cp->done;
    return ++l->n == 4;
}

/* Save a checkpoint of params with done and updated through a writable
 * store on table t (column v). */
static void save_checkpoint(world *w, const char *t, ks_bytes params, uint64_t done, int64_t updated)
{
    assert_int_equal(open_store(w, t, "v", NULL, NULL), KS_OK);
    const ks_rowstore_ops *ops = w->store.ops;
    ks_checkpoint cp = {.params = params, .state = BV("complete"),
                        .cursor = {KS_VALUE_INTEGER, 2, {NULL, 0}}, .pass = 1, .done = done,
                        .started = 1000, .updated = updated, .finished = updated};
    assert_int_equal(ops->begin(w->store.self), KS_OK);
    assert_int_equal(ops->checkpoint_save(w->store.self, &cp), KS_OK);
    assert_int_equal(ops->commit(w->store.self), KS_OK);
    ks_rowstore_close(&w->store);
}

/* ks_rowstore_pg_checkpoints lists read-only, most recently updated
 * first, one column's or all; a schema without keyshift's tables has
 * none (and gets none); a malformed row is KS_ERR_STORE with the SQLite
 * listing's message; an unreachable server is KS_ERR_UNAVAILABLE. */
static void test_checkpoints_list(void **state)
{
    world *w = *state;
    listed l;
    memset(&l, 0, sizeof l);
    assert_int_equal(ks_rowstore_pg_checkpoints(ks_pg_test_conninfo, NULL, NULL, list_fn, &l,
                                                w->err, sizeof w->err), KS_OK);
    assert_int_equal(l.n, 0);
    assert_int_equal(admin_int(w, "SELECT count(*) FROM pg_class WHERE relname LIKE 'keyshift%'"), 0);
    make_items(w, 2);
    admin_exec(w, "CREATE TABLE other(id bigint PRIMARY KEY, v bytea)");
    save_checkpoint(w, "items", BV("mode=encrypt"), 2, 1001);
    save_checkpoint(w, "other", BV("mode=encrypt"), 7, 1003);
    save_checkpoint(w, "items", BV("mode=rewrap"), 5, 1002);
    assert_int_equal(ks_rowstore_pg_checkpoints(ks_pg_test_conninfo, NULL, NULL, list_fn, &l,
                                                w->err, sizeof w->err), KS_OK);
    assert_int_equal(l.n, 3);
    assert_string_equal(l.tables[0], "other");
    assert_int_equal(l.done[0], 7);
    assert_string_equal(l.tables[1], "items");
    assert_int_equal(l.done[1], 5);
    assert_int_equal(l.done[2], 2);
    memset(&l, 0, sizeof l);
    assert_int_equal(ks_rowstore_pg_checkpoints(ks_pg_test_conninfo, "items", "v", list_fn, &l,
                                                w->err, sizeof w->err), KS_OK);
    assert_int_equal(l.n, 2);
    assert_int_equal(l.done[0], 5);
    memset(&l, 0, sizeof l);
    assert_int_equal(ks_rowstore_pg_checkpoints(ks_pg_test_conninfo, "items", "nosuch", list_fn,
                                                &l, w->err, sizeof w->err), KS_OK);
    assert_int_equal(l.n, 0);
    assert_int_equal(ks_rowstore_pg_checkpoints(ks_pg_test_conninfo, "items", NULL, list_fn, &l,
                                                w->err, sizeof w->err), KS_ERR_INVALID_ARGUMENT);
    admin_exec(w, "UPDATE keyshift_migration SET done = -1 WHERE tbl = 'other'");
    assert_int_equal(ks_rowstore_pg_checkpoints(ks_pg_test_conninfo, NULL, NULL, list_fn, &l,
                                                w->err, sizeof w->err), KS_ERR_STORE);
    assert_non_null(strstr(w->err, "malformed row in keyshift_migration"));
    assert_int_equal(ks_rowstore_pg_checkpoints("host=/nonexistent dbname=x", NULL, NULL, list_fn,
                                                &l, w->err, sizeof w->err), KS_ERR_UNAVAILABLE);
}

/* The migrated columns listed by ks_rowstore_pg_migrated_columns, as
 * "schema.table.column:visible". */
typedef struct migrated {
    int n, stop_after;
    char cols[6][48];
} migrated;

/* Record one migrated column (ks_migrated_column_fn); stop after
 * stop_after when it is set. */
static int migrated_fn(void *arg, ks_bytes schema, ks_bytes table, ks_bytes column, int visible)
{
    migrated *m = arg;
    assert_true(m->n < 6);
    snprintf(m->cols[m->n], sizeof m->cols[0], "%.*s.%.*s.%.*s:%d", (int)schema.len,
             (const char *)schema.ptr, (int)table.len, (const char *)table.ptr, (int)column.len,
             (const char *)column.ptr, visible);
    return ++m->n == m->stop_after;
}

/* ks_rowstore_pg_migrated_columns reads the keyshift_migration of every
 * schema, each column once however many migrations it had, and says
 * whether the search_path shows the migrated table under its name (not
 * another schema's of the same name); a search_path that shows it makes
 * it visible; the callback stops the listing; a malformed row is
 * KS_ERR_STORE, an unreachable server KS_ERR_UNAVAILABLE. */
static void test_migrated_columns(void **state)
{
    world *w = *state;
    migrated m;
    memset(&m, 0, sizeof m);
    admin_exec(w, "DROP SCHEMA IF EXISTS s2 CASCADE");
    assert_int_equal(ks_rowstore_pg_migrated_columns(ks_pg_test_conninfo, migrated_fn, &m,
                                                     w->err, sizeof w->err), KS_OK);
    assert_int_equal(m.n, 0);
    make_items(w, 2);
    save_checkpoint(w, "items", BV("mode=encrypt"), 2, 1001);
    save_checkpoint(w, "items", BV("mode=rewrap"), 2, 1002);
    admin_exec(w, "CREATE SCHEMA s2; CREATE TABLE s2.ledger(id bigint PRIMARY KEY, v bytea); "
                  "CREATE TABLE s2.keyshift_migration (LIKE public.keyshift_migration); "
                  "INSERT INTO s2.keyshift_migration SELECT * FROM public.keyshift_migration; "
                  "UPDATE s2.keyshift_migration SET tbl = 'ledger' WHERE params = 'mode=rewrap'");
    assert_int_equal(ks_rowstore_pg_migrated_columns(ks_pg_test_conninfo, migrated_fn, &m,
                                                     w->err, sizeof w->err), KS_OK);
    assert_int_equal(m.n, 3);
    assert_string_equal(m.cols[0], "public.items.v:1");
    assert_string_equal(m.cols[1], "s2.items.v:0"); /* "items" is public's */
    assert_string_equal(m.cols[2], "s2.ledger.v:0"); /* s2 is not on the path */
    char ci[512];
    snprintf(ci, sizeof ci, "%s options=-csearch_path=s2,public", ks_pg_test_conninfo);
    memset(&m, 0, sizeof m);
    assert_int_equal(ks_rowstore_pg_migrated_columns(ci, migrated_fn, &m, w->err, sizeof w->err),
                     KS_OK);
    assert_int_equal(m.n, 3);
    assert_string_equal(m.cols[0], "public.items.v:1");
    assert_string_equal(m.cols[2], "s2.ledger.v:1");
    memset(&m, 0, sizeof m);
    m.stop_after = 1;
    assert_int_equal(ks_rowstore_pg_migrated_columns(ks_pg_test_conninfo, migrated_fn, &m,
                                                     w->err, sizeof w->err), KS_OK);
    assert_int_equal(m.n, 1);
    memset(&m, 0, sizeof m);
    assert_int_equal(ks_rowstore_pg_migrated_columns(ks_pg_test_conninfo, NULL, &m, w->err,
                                                     sizeof w->err), KS_ERR_INVALID_ARGUMENT);
    admin_exec(w, "UPDATE s2.keyshift_migration SET col = '' WHERE tbl = 'ledger'");
    assert_int_equal(ks_rowstore_pg_migrated_columns(ks_pg_test_conninfo, migrated_fn, &m,
                                                     w->err, sizeof w->err), KS_ERR_STORE);
    assert_non_null(strstr(w->err, "malformed row in keyshift_migration of schema \"s2\""));
    assert_int_equal(ks_rowstore_pg_migrated_columns("host=/nonexistent dbname=x", migrated_fn,
                                                     &m, w->err, sizeof w->err),
                     KS_ERR_UNAVAILABLE);
    admin_exec(w, "DROP SCHEMA s2 CASCADE");
}

/* A row lock held by another connection makes the write wait only up to
 * lock_timeout: KS_ERR_BUSY, the transaction rolled back, the store
 * usable again. */
static void test_lock_timeout(void **state)
{
    world *w = *state;
    make_items(w, 2);
    ks_pg_options o = {.lock_timeout_ms = 100};
    assert_int_equal(open_store(w, "items", "v", NULL, &o), KS_OK);
    const ks_rowstore_ops *ops = w->store.ops;
    admin_exec(w, "BEGIN");
    admin_exec(w, "SELECT * FROM items WHERE id = 1 FOR UPDATE");
    ks_value id1 = {KS_VALUE_INTEGER, 1, {NULL, 0}}, old1 = blob("v1");
    int swapped = 0;
    assert_int_equal(ops->begin(w->store.self), KS_OK);
    assert_int_equal(ops->cas(w->store.self, &id1, &old1, BV("w1"), &swapped), KS_ERR_BUSY);
    admin_exec(w, "ROLLBACK");
    assert_int_equal(ops->begin(w->store.self), KS_OK); /* the failed one was rolled back */
    assert_int_equal(ops->cas(w->store.self, &id1, &old1, BV("w1"), &swapped), KS_OK);
    assert_int_equal(swapped, 1);
    assert_int_equal(ops->commit(w->store.self), KS_OK);
}

/* One compare-and-swap run on a thread of its own (test_deadlock). */
typedef struct cas_job {
    ks_rowstore *st;
    int64_t id;
    const char *old, *neu;
    ks_err err;
    int swapped;
} cas_job;

/* Thread body: the job's compare-and-swap, inside the job store's
 * transaction. */
static void *cas_thread(void *arg)
{
    cas_job *j = arg;
    ks_value id = {KS_VALUE_INTEGER, j->id, {NULL, 0}}, old = blob(j->old);
    ks_bytes neu = {(const uint8_t *)j->neu, strlen(j->neu)};
    j->err = j->st->ops->cas(j->st->self, &id, &old, neu, &j->swapped);
    return NULL;
}

/* Two stores locking two rows in opposite orders: the server picks one
 * as the deadlock victim (40P01), which gets KS_ERR_BUSY with its
 * transaction rolled back; the other goes on and commits. */
static void test_deadlock(void **state)
{
    world *w = *state;
    make_items(w, 2);
    ks_pg_options o = {.lock_timeout_ms = 20000};
    assert_int_equal(open_store(w, "items", "v", NULL, &o), KS_OK);
    ks_rowstore other;
    ks_rowstore_target tg = {.table = "items", .column = "v"};
    assert_int_equal(ks_rowstore_pg_open(ks_pg_test_conninfo, &tg, &o, &other, w->err,
                                         sizeof w->err),
                     KS_OK);
    cas_job a1 = {&w->store, 1, "v1", "a1", KS_OK, 0}, b2 = {&other, 2, "v2", "b2", KS_OK, 0};
    cas_job b1 = {&other, 1, "v1", "b1", KS_OK, 0}, a2 = {&w->store, 2, "v2", "a2", KS_OK, 0};
    assert_int_equal(w->store.ops->begin(w->store.self), KS_OK);
    assert_int_equal(other.ops->begin(other.self), KS_OK);
    cas_thread(&a1);
    cas_thread(&b2);
    assert_int_equal(a1.err, KS_OK);
    assert_int_equal(b2.err, KS_OK);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, cas_thread, &b1), 0); /* waits for a1's lock */
    cas_thread(&a2);                                                /* waits for b2's lock */
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_true((a2.err == KS_ERR_BUSY) != (b1.err == KS_ERR_BUSY));
    assert_true(a2.err == KS_OK || b1.err == KS_OK);
    ks_rowstore *winner = a2.err == KS_OK ? &w->store : &other;
    assert_int_equal(winner->ops->commit(winner->self), KS_OK);
    other.ops->rollback(other.self);
    w->store.ops->rollback(w->store.self);
    ks_rowstore_close(&other);
    const char *want = winner == &w->store ? "a1a2" : "b1b2";
    uint8_t v[8];
    assert_int_equal(admin_value(w, "items", 1, v, sizeof v), 2);
    assert_memory_equal(v, want, 2);
    assert_int_equal(admin_value(w, "items", 2, v, sizeof v), 2);
    assert_memory_equal(v, want + 2, 2);
}

/* A statement that outlives statement_timeout (here: waiting for a
 * table lock under a long lock_timeout) is KS_ERR_BUSY too, outside a
 * transaction as inside one. */
static void test_statement_timeout(void **state)
{
    world *w = *state;
    make_items(w, 2);
    ks_pg_options o = {.lock_timeout_ms = 60000, .statement_timeout_ms = 100};
    assert_int_equal(open_store(w, "items", "v", NULL, &o), KS_OK);
    const ks_rowstore_ops *ops = w->store.ops;
    admin_exec(w, "BEGIN");
    admin_exec(w, "LOCK TABLE items IN ACCESS EXCLUSIVE MODE");
    uint64_t c = 0;
    assert_int_equal(ops->count(w->store.self, &c), KS_ERR_BUSY);
    ks_row rows[2];
    size_t n = 0;
    assert_int_equal(ops->begin(w->store.self), KS_OK);
    assert_int_equal(ops->scan(w->store.self, NULL, 2, rows, &n), KS_ERR_BUSY);
    admin_exec(w, "ROLLBACK");
    assert_int_equal(ops->begin(w->store.self), KS_OK); /* the failed one was rolled back */
    ops->rollback(w->store.self);
    assert_int_equal(ops->count(w->store.self, &c), KS_OK);
    assert_int_equal(c, 2);
}

/* A connection the server drops is KS_ERR_UNAVAILABLE, and a failed
 * open's message never quotes row values. */
static void test_connection_lost(void **state)
{
    world *w = *state;
    make_items(w, 2);
    admin_exec(w, "UPDATE items SET v = 'row-secret' WHERE id = 1");
    assert_int_equal(open_store(w, "items", "v", NULL, NULL), KS_OK);
    admin_exec(w, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                  "WHERE application_name = 'keyshift'");
    uint64_t c = 0;
    assert_int_equal(w->store.ops->count(w->store.self, &c), KS_ERR_UNAVAILABLE);
    ks_row rows[2];
    size_t n = 0;
    assert_int_equal(w->store.ops->scan(w->store.self, NULL, 2, rows, &n), KS_ERR_UNAVAILABLE);
    /* a duplicate in a would-be unique id: the message names columns only */
    admin_exec(w, "CREATE TABLE dup(id int NOT NULL, v bytea)");
    admin_exec(w, "INSERT INTO dup VALUES (1, 'row-secret'), (1, 'row-secret')");
    assert_int_equal(open_store(w, "dup", "v", "id", NULL), KS_ERR_NO_TARGET);
    assert_null(strstr(w->err, "row-secret"));
    assert_non_null(strstr(w->err, "id"));
}

/* ---- the engine ---------------------------------------------------------------------- */

#define MIG_ROWS 1000
/* The row the application changes while the engine runs (test_migrate_raced). */
#define RACE_ROWS 300
#define RACE_ID 150

/* The plaintext of row id ("" for the NULL rows, every 97th). */
static void plain_of(int64_t id, char *out, size_t cap)
{
    if (id % 97 == 0)
        out[0] = '\0';
    else
        snprintf(out, cap, "secret-%lld", (long long)id);
}

/* Table rec(id bigint primary key, v bytea) with rows 1..n of plain_of,
 * the key provider (key "k" version 1) and a context in w, and the store
 * open on rec. */
static void engine_setup(world *w, int64_t n)
{
    admin_exec(w, "CREATE TABLE rec(id bigint PRIMARY KEY, v bytea)");
    admin_exec(w, "BEGIN");
    for (int64_t id = 1; id <= n; id++) {
        char pt[32];
        plain_of(id, pt, sizeof pt);
        admin_insert(w, "rec", id, pt[0] != '\0' ? pt : NULL, strlen(pt));
    }
    admin_exec(w, "COMMIT");
    assert_true(sodium_init() >= 0);
    ks_mem_init(&w->mem);
    w->have_mem = 1;
    assert_int_equal(ks_mem_add(&w->mem, "k", 1, 1, NULL), 0);
    w->prov = ks_mem_provider_of(&w->mem);
    assert_int_equal(ks_ctx_new(&w->prov, NULL, &w->ctx), KS_OK);
    assert_int_equal(open_store(w, "rec", "v", NULL, NULL), KS_OK);
}

/* Encrypt under "k" with tenant acme, purpose pp, context "rec:{id}". */
static ks_migrate_params rec_params(size_t batch)
{
    ks_migrate_params p = {0};
    p.mode = KS_MIGRATE_ENCRYPT;
    p.to_key_id = BV("k");
    p.tenant = BV("acme");
    p.purpose = BV("pp");
    p.context_template = BV("rec:{id}");
    p.batch_size = batch;
    p.max_failure_rate = -1;
    return p;
}

/* Every row 1..n of rec: NULL where it was NULL, else an envelope under
 * (k, version) that opens to its original plaintext, or for race_id
 * (0: none) to "app-new". */
static void check_rec(world *w, int64_t n_rows, uint32_t version, int64_t race_id)
{
    assert_int_equal(admin_int(w, "SELECT count(*) FROM rec"), n_rows);
    for (int64_t id = 1; id <= n_rows; id++) {
        uint8_t v[512];
        int n = admin_value(w, "rec", id, v, sizeof v);
        char want[32];
        plain_of(id, want, sizeof want);
        if (id == race_id)
            snprintf(want, sizeof want, "app-new");
        if (want[0] == '\0') {
            assert_int_equal(n, -1);
            continue;
        }
        assert_true(n > 0);
        ks_envelope e;
        assert_int_equal(ks_envelope_parse(v, (size_t)n, NULL, &e, NULL), KS_OK);
        assert_int_equal(e.key_version, version);
        char c[32];
        snprintf(c, sizeof c, "rec:%lld", (long long)id);
        ks_open_params op = {{(const uint8_t *)c, strlen(c)}, BV("acme"), BV("pp")};
        uint8_t pt[64];
        size_t ptn = 0;
        assert_int_equal(ks_open(w->ctx, v, (size_t)n, &op, pt, sizeof pt, &ptn, NULL), KS_OK);
        assert_int_equal(ptn, strlen(want));
        assert_memory_equal(pt, want, ptn);
    }
}

/* ks_migrate_run encrypts a PostgreSQL table, then rewraps it under a
 * new key version; every row opens to its original plaintext, and
 * verify and the census agree. */
static void test_migrate_run(void **state)
{
    world *w = *state;
    engine_setup(w, MIG_ROWS);
    ks_migrate_params p = rec_params(128);
    ks_checkpoint cp;
    assert_int_equal(ks_migrate_run(w->ctx, &w->store, &p, NULL, NULL, NULL, &cp), KS_OK);
    uint64_t nulls = MIG_ROWS / 97;
    assert_int_equal(cp.done, MIG_ROWS - nulls);
    assert_int_equal(cp.raced, 0);
    assert_int_equal(cp.quarantined, 0);
    check_rec(w, MIG_ROWS, 1, 0);

    assert_int_equal(ks_mem_add(&w->mem, "k", 2, 1, NULL), 0);
    p.mode = KS_MIGRATE_REWRAP;
    assert_int_equal(ks_migrate_run(w->ctx, &w->store, &p, NULL, NULL, NULL, &cp), KS_OK);
    assert_int_equal(cp.done, MIG_ROWS - nulls);
    check_rec(w, MIG_ROWS, 2, 0);
    assert_int_equal(admin_int(w, "SELECT count(*) FROM keyshift_migration WHERE state = 'complete'"), 2);
    /* verify and the census read through the same store (the census by scan) */
    ks_verify_result vr;
    assert_int_equal(ks_migrate_verify(w->ctx, &w->store, &p, 0, NULL, NULL, &vr), KS_OK);
    assert_int_equal(vr.checked, MIG_ROWS - nulls);
    assert_int_equal(vr.failed, 0);
    ks_census census;
    assert_int_equal(ks_census_run(&w->store, &census), KS_OK);
    assert_int_equal(census.rows, MIG_ROWS);
    assert_int_equal(census.null_rows, nulls);
    assert_int_equal(census.n_classes, 1);
    assert_int_equal(census.classes[0].key_version, 2);
    assert_int_equal(census.classes[0].rows, MIG_ROWS - nulls);
    ks_census_free(&census);
}

/* Progress callback: after the first committed batch (ids 1..100), the
 * application writes row RACE_ID, which the pipelined engine has already
 * scanned in batch 2: its compare-and-swap must come back raced. */
static void race_progress(void *arg, const ks_migrate_progress *pr)
{
    world *w = arg;
    const ks_checkpoint *cp = pr->checkpoint;
    if (pr->batch_rows > 0 && cp->pass == 1 && cp->cursor.type == KS_VALUE_INTEGER &&
        cp->cursor.integer == 100)
        admin_exec(w, "UPDATE rec SET v = 'app-new' WHERE id = 150"); /* RACE_ID */
}

/* The engine over PostgreSQL with the application writing underneath:
 * the raced row is counted, retried in pass 2 and ends up encrypting the
 * application's value; every other row its own. */
static void test_migrate_raced(void **state)
{
    world *w = *state;
    engine_setup(w, RACE_ROWS);
    ks_migrate_params p = rec_params(100);
    ks_checkpoint cp;
    assert_int_equal(ks_migrate_run(w->ctx, &w->store, &p, NULL, race_progress, w, &cp), KS_OK);
    uint64_t nulls = RACE_ROWS / 97;
    assert_int_equal(cp.raced, 1);
    assert_int_equal(cp.pass, 2);
    assert_int_equal(cp.done, RACE_ROWS - nulls);
    check_rec(w, RACE_ROWS, 1, RACE_ID);
}

/* The store's tests, one cluster for the group. */
int main(void)
{
#define T(f) cmocka_unit_test_setup_teardown(f, world_setup, world_teardown)
    const struct CMUnitTest tests[] = {
        T(test_open_checks), T(test_read_only),  T(test_scan_paging), T(test_cas_raced),
        T(test_quarantine),  T(test_quarantine_per_migration), T(test_checkpoint), T(test_lock_timeout), T(test_deadlock),
        T(test_statement_timeout),
        T(test_connection_lost), T(test_checkpoints_list), T(test_migrated_columns),
        T(test_migrate_run),
        T(test_migrate_raced),
    };
#undef T
    return cmocka_run_group_tests(tests, ks_pg_test_group_setup, ks_pg_test_group_teardown);
}
