/*
 * tests/test_rollout_store.c -- the rollout-store interface
 * (keyshift/rollout_store.h): the rollout layer over a store it did not
 * open (ks_rollout_db_wrap), its transactions as the store sees them, and
 * its checks of the rows a store returns.
 *
 * A decorating store forwards every operation to the SQLite store and
 * counts the transaction calls, and can fail an operation or corrupt a
 * row on request: what a store for another database might do.  The
 * rollout behaviour itself is tests/test_rollout.c's.
 */
#define _POSIX_C_SOURCE 200809L

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <sqlite3.h>

#include <keyshift/rollout.h>
#include <keyshift/rollout_store.h>

#include "sqlite_test_util.h"

/* A store that forwards to inner, counting and failing on request. */
typedef struct deco {
    ks_rollout_store base;    /* first: what the rollout layer holds */
    ks_rollout_store *inner;  /* the SQLite store */
    int begins, commits, rollbacks;
    int fail_log;             /* log_append fails with KS_ERR_STORE */
    int corrupt_get;          /* get returns a rollout whose target is its source */
} deco;

/* The decorator behind s. */
static deco *D(ks_rollout_store *s)
{
    return (deco *)(void *)s;
}

/* The store deco forwards to. */
static ks_rollout_store *IN(ks_rollout_store *s)
{
    return D(s)->inner;
}

/* Forward operation name with the parameters params as the call args. */
#define FWD(name, params, args)                                                                    \
    static ks_err d_##name params                                                                  \
    {                                                                                              \
        return IN(s)->ops->name args;                                                              \
    }

FWD(snapshot, (ks_rollout_store * s, int b), (IN(s), b))
FWD(data_version, (ks_rollout_store * s, int64_t *o), (IN(s), o))
FWD(find_column,
    (ks_rollout_store * s, const char *t, const char *c, char tbl[KS_ROLLOUT_IDENT_MAX + 1],
     char col[KS_ROLLOUT_IDENT_MAX + 1], char *e, size_t n),
    (IN(s), t, c, tbl, col, e, n))
FWD(find_open, (ks_rollout_store * s, const char *t, const char *c, const char *k, int ks,
                int64_t *id),
    (IN(s), t, c, k, ks, id))
FWD(insert, (ks_rollout_store * s, const ks_rollout *r, int64_t *id), (IN(s), r, id))
FWD(latest, (ks_rollout_store * s, const char *t, const char *c, ks_rollout *o), (IN(s), t, c, o))
FWD(latest_key, (ks_rollout_store * s, const char *k, ks_rollout *o), (IN(s), k, o))
FWD(list, (ks_rollout_store * s, int64_t a, ks_rollout *o, size_t m, size_t *n),
    (IN(s), a, o, m, n))
FWD(later_count, (ks_rollout_store * s, const ks_rollout *r, int64_t *n), (IN(s), r, n))
FWD(set_phase, (ks_rollout_store * s, int64_t id, ks_rollout_phase f, ks_rollout_phase t,
                int64_t now),
    (IN(s), id, f, t, now))
FWD(set_canary, (ks_rollout_store * s, int64_t id, const ks_rollout_canary *c, int64_t now),
    (IN(s), id, c, now))
FWD(set_verified, (ks_rollout_store * s, int64_t id, const char *t, const char *c, int64_t now),
    (IN(s), id, t, c, now))
FWD(log_list, (ks_rollout_store * s, int64_t r, int64_t a, ks_rollout_log_entry *o, size_t m,
               size_t *n),
    (IN(s), r, a, o, m, n))
FWD(readers_live, (ks_rollout_store * s, int64_t since, ks_rollout_reader *o, size_t m,
                   size_t *n, size_t *t),
    (IN(s), since, o, m, n, t))
FWD(reader_put, (ks_rollout_store * s, const ks_rollout_reader *r, int64_t now), (IN(s), r, now))
FWD(reader_heartbeat, (ks_rollout_store * s, const char *i, int64_t now), (IN(s), i, now))
FWD(reader_delete, (ks_rollout_store * s, const char *i), (IN(s), i))
FWD(metrics_insert, (ks_rollout_store * s, int64_t r, const char *i, const char *src,
                     const ks_health_sample *x),
    (IN(s), r, i, src, x))
FWD(metrics_sum, (ks_rollout_store * s, int64_t r, int64_t since, const char *src,
                  ks_health_sample *o),
    (IN(s), r, since, src, o))
FWD(set_settings, (ks_rollout_store * s, int64_t id, const ks_thresholds *t, uint32_t soak,
                   uint32_t ttl, int64_t now),
    (IN(s), id, t, soak, ttl, now))
FWD(remove, (ks_rollout_store * s, int64_t id), (IN(s), id))

/* close: close the inner store and free the decorator. */
static void d_close(ks_rollout_store *s)
{
    IN(s)->ops->close(IN(s));
    free(s);
}

/* begin, counted. */
static ks_err d_begin(ks_rollout_store *s)
{
    D(s)->begins++;
    return IN(s)->ops->begin(IN(s));
}

/* commit, counted. */
static ks_err d_commit(ks_rollout_store *s)
{
    D(s)->commits++;
    return IN(s)->ops->commit(IN(s));
}

/* rollback, counted. */
static void d_rollback(ks_rollout_store *s)
{
    D(s)->rollbacks++;
    IN(s)->ops->rollback(IN(s));
}

/* get, with the row corrupted on request (a class that is not valid as
 * a target: plaintext). */
static ks_err d_get(ks_rollout_store *s, int64_t id, ks_rollout *out)
{
    ks_err err = IN(s)->ops->get(IN(s), id, out);
    if (err == KS_OK && D(s)->corrupt_get)
        out->target = out->source;
    return err;
}

/* log_append, failing on request (after nothing was written). */
static ks_err d_log_append(ks_rollout_store *s, int64_t r, int64_t time, const char *actor,
                           int from, int to, const char *reason, int automatic)
{
    if (D(s)->fail_log)
        return KS_ERR_STORE;
    return IN(s)->ops->log_append(IN(s), r, time, actor, from, to, reason, automatic);
}

/* The decorator's operations. */
static const ks_rollout_store_ops deco_ops = {
    .close = d_close,
    .begin = d_begin,
    .commit = d_commit,
    .rollback = d_rollback,
    .snapshot = d_snapshot,
    .data_version = d_data_version,
    .find_column = d_find_column,
    .find_open = d_find_open,
    .insert = d_insert,
    .get = d_get,
    .latest = d_latest,
    .latest_key = d_latest_key,
    .list = d_list,
    .later_count = d_later_count,
    .set_phase = d_set_phase,
    .set_canary = d_set_canary,
    .set_settings = d_set_settings,
    .remove = d_remove,
    .set_verified = d_set_verified,
    .log_append = d_log_append,
    .log_list = d_log_list,
    .readers_live = d_readers_live,
    .reader_put = d_reader_put,
    .reader_heartbeat = d_reader_heartbeat,
    .reader_delete = d_reader_delete,
    .metrics_insert = d_metrics_insert,
    .metrics_sum = d_metrics_sum,
};

/* One test's world: a database with payments(id, tenant, card), and the
 * rollout layer over a decorated SQLite store of it. */
typedef struct world {
    char dir[64];
    char path[96];
    char err[512];
    deco *d;            /* owned by db */
    ks_rollout_db *db;
} world;

/* The world of the test running (cmocka runs them one at a time). */
static world W;

/* Create the database and open the decorated store on it. */
static int world_setup(void **state)
{
    (void)state;
    memset(&W, 0, sizeof W);
    strcpy(W.dir, "/tmp/ks_rstore_XXXXXX");
    assert_non_null(mkdtemp(W.dir));
    snprintf(W.path, sizeof W.path, "%s/db.sqlite", W.dir);
    sqlite3 *db = NULL;
    assert_int_equal(sqlite3_open(W.path, &db), SQLITE_OK);
    assert_int_equal(sqlite3_exec(db, "CREATE TABLE payments(id INTEGER PRIMARY KEY, "
                                      "tenant TEXT, card BLOB);",
                                  NULL, NULL, NULL),
                     SQLITE_OK);
    assert_int_equal(sqlite3_close(db), SQLITE_OK);
    W.d = calloc(1, sizeof *W.d);
    assert_non_null(W.d);
    W.d->base.ops = &deco_ops;
    assert_int_equal(ks_rollout_store_sqlite_open(W.path, 0, &W.d->inner, W.err, sizeof W.err),
                     KS_OK);
    return ks_rollout_db_wrap(&W.d->base, &W.db) == KS_OK ? 0 : -1;
}

/* Close the rollout layer (and so both stores) and remove the files. */
static int world_teardown(void **state)
{
    (void)state;
    ks_rollout_db_close(W.db);
    remove_db_dir(W.dir, W.path);
    return 0;
}

/* A spec: payments.card (spelled as the schema does not: the store
 * finds its spelling) from plaintext to k:2 (v2, xchacha20-poly1305),
 * default thresholds, reader TTL 30 s. */
static ks_rollout spec(void)
{
    ks_rollout s = {.scope = KS_SCOPE_COLUMN, .table = "PAYMENTS", .column = "card",
                    .source = {.is_plaintext = 1},
                    .target = {.version = 2, .algorithm = KS_ALG_XCHACHA20POLY1305,
                               .key_id = "k", .key_version = 2},
                    .reader_ttl_s = 30};
    ks_thresholds_default(&s.thresholds);
    return s;
}

/* Start spec() at now 1000 through w; returns its id. */
static int64_t start(world *w)
{
    ks_rollout s = spec();
    int64_t id = 0;
    assert_int_equal(ks_rollout_db_start(w->db, &s, "alice", 1000, &id, w->err, sizeof w->err),
                     KS_OK);
    assert_true(id > 0);
    return id;
}

/* Move rollout id planned -> read-compat at 1100 with the target key active. */
static ks_err to_read_compat(world *w, int64_t id)
{
    ks_rollout_facts f = {.now = 1100, .target_key_state = KS_KEY_ACTIVE};
    ks_rollout_change c = {id, KS_PHASE_PLANNED, KS_PHASE_READ_COMPAT, "alice", "go", 0};
    return ks_rollout_db_transition(w->db, &c, &f, w->err, sizeof w->err);
}

/* The number of log rows of every rollout. */
static size_t log_rows(world *w)
{
    ks_rollout_log_entry e[8];
    size_t n = 0;
    assert_int_equal(ks_rollout_db_log(w->db, 0, 0, e, 8, &n), KS_OK);
    return n;
}

/* A wrapped store runs start and a transition each in one begin/commit,
 * and stores what the rollout layer composed (the schema's spelling,
 * planned at now, the log rows). */
static void test_wrap_transactions(void **state)
{
    world *w = &W;
    (void)state;
    int64_t id = start(w);
    assert_int_equal(w->d->begins, 1);
    assert_int_equal(w->d->commits, 1);
    assert_int_equal(w->d->rollbacks, 0);
    ks_rollout r;
    assert_int_equal(ks_rollout_db_get(w->db, id, &r), KS_OK);
    assert_string_equal(r.table, "payments");
    assert_int_equal(r.phase, KS_PHASE_PLANNED);
    assert_int_equal(r.created, 1000);
    assert_int_equal(to_read_compat(w, id), KS_OK);
    assert_int_equal(w->d->begins, 2);
    assert_int_equal(w->d->commits, 2);
    assert_int_equal(ks_rollout_db_get(w->db, id, &r), KS_OK);
    assert_int_equal(r.phase, KS_PHASE_READ_COMPAT);
    assert_int_equal(r.phase_since, 1100);
    assert_int_equal(log_rows(w), 2);
}

/* An operation failing inside a transition rolls the whole change back:
 * the phase written before the failed log row is undone. */
static void test_wrap_rollback(void **state)
{
    world *w = &W;
    (void)state;
    int64_t id = start(w);
    w->d->fail_log = 1;
    assert_int_equal(to_read_compat(w, id), KS_ERR_STORE);
    assert_int_equal(w->d->rollbacks, 1);
    assert_int_equal(w->d->commits, 1); /* start's only */
    w->d->fail_log = 0;
    ks_rollout r;
    assert_int_equal(ks_rollout_db_get(w->db, id, &r), KS_OK);
    assert_int_equal(r.phase, KS_PHASE_PLANNED);
    assert_int_equal(log_rows(w), 1);
    assert_int_equal(to_read_compat(w, id), KS_OK);
}

/* A row that makes no sense is refused above the store, whatever store
 * returned it, and no change is made on it. */
static void test_rows_checked(void **state)
{
    world *w = &W;
    (void)state;
    int64_t id = start(w);
    w->d->corrupt_get = 1;
    ks_rollout r;
    assert_int_equal(ks_rollout_db_get(w->db, id, &r), KS_ERR_STORE);
    assert_int_equal(to_read_compat(w, id), KS_ERR_STORE);
    assert_int_equal(w->d->rollbacks, 1);
    w->d->corrupt_get = 0;
    assert_int_equal(ks_rollout_db_get(w->db, id, &r), KS_OK);
    assert_int_equal(r.phase, KS_PHASE_PLANNED);
}

/* ks_rollout_db_wrap refuses a missing store or out (closing a store it
 * was given), and a read-only SQLite store refuses every change. */
static void test_wrap_arguments(void **state)
{
    world *w = &W;
    (void)state;
    ks_rollout_db *db = (ks_rollout_db *)1;
    assert_int_equal(ks_rollout_db_wrap(NULL, &db), KS_ERR_INVALID_ARGUMENT);
    assert_null(db);
    ks_rollout_store *s = NULL;
    assert_int_equal(ks_rollout_store_sqlite_open(w->path, KS_ROLLOUT_DB_READ_ONLY, &s, w->err,
                                                  sizeof w->err),
                     KS_OK);
    assert_int_equal(ks_rollout_db_wrap(s, NULL), KS_ERR_INVALID_ARGUMENT); /* s is closed */
    assert_int_equal(ks_rollout_store_sqlite_open(w->path, KS_ROLLOUT_DB_READ_ONLY, &s, w->err,
                                                  sizeof w->err),
                     KS_OK);
    assert_int_equal(ks_rollout_db_wrap(s, &db), KS_OK);
    ks_rollout sp = spec();
    int64_t id = 0;
    assert_int_equal(ks_rollout_db_start(db, &sp, "alice", 1000, &id, w->err, sizeof w->err),
                     KS_ERR_INVALID_ARGUMENT);
    ks_rollout list[1];
    size_t n = 1;
    assert_int_equal(ks_rollout_db_list(db, 0, list, 1, &n), KS_OK);
    assert_int_equal(n, 0);
    ks_rollout_db_close(db);
    assert_int_equal(ks_rollout_store_sqlite_open(NULL, 0, &s, w->err, sizeof w->err),
                     KS_ERR_INVALID_ARGUMENT);
    assert_null(s);
}

/* Run the tests. */
int main(void)
{
#define T(f) cmocka_unit_test_setup_teardown(f, world_setup, world_teardown)
    const struct CMUnitTest tests[] = {
        T(test_wrap_transactions),
        T(test_wrap_rollback),
        T(test_rows_checked),
        T(test_wrap_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
