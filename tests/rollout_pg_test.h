/*
 * tests/rollout_pg_test.h -- what the PostgreSQL rollout store's two test
 * files (tests/test_rollout_pg.c: the store's contract;
 * tests/test_rollout_pg_life.c: racing, the lifecycle and the policy)
 * share: one test's world (an admin connection and a store on a fresh
 * public schema of the throw-away cluster of tests/pg_test.h) and the
 * specs, classes and readers they build.
 *
 * Test support code: static functions, each used by both files.
 */
#ifndef KS_TESTS_ROLLOUT_PG_TEST_H
#define KS_TESTS_ROLLOUT_PG_TEST_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <libpq-fe.h>

#include <keyshift/rollout.h>
#include <keyshift/rollout_store.h>
#include <keyshift/rollout_store_pg.h>

#include "pg_test.h"

#define BV(s) ((ks_bytes){(const uint8_t *)(s), sizeof(s) - 1})

/* One test's world: the admin connection and a rollout store. */
typedef struct world {
    PGconn *admin;
    ks_rollout_store *s;      /* NULL once handed to a ks_rollout_db */
    ks_rollout_db *db;
    char err[512];
} world;

/* ---- helpers ------------------------------------------------------------------ */

/* Run sql on the admin connection; its status. */
static ExecStatusType admin_try(world *w, const char *sql)
{
    PGresult *res = PQexec(w->admin, sql);
    ExecStatusType st = PQresultStatus(res);
    PQclear(res);
    return st;
}

/* A fresh public schema with payments(id, tenant, card bytea, a
 * generated column), an admin connection, the store open on it. */
static int world_setup(void **state)
{
    world *w = calloc(1, sizeof *w);
    assert_non_null(w);
    w->admin = ks_pg_test_admin();
    ks_pg_test_exec(w->admin, "CREATE TABLE payments(id bigint PRIMARY KEY, tenant text, card bytea, "
                              "twice bigint GENERATED ALWAYS AS (id * 2) STORED)");
    ks_err err = ks_rollout_store_pg_open(ks_pg_test_conninfo, 0, &w->s, w->err, sizeof w->err);
    if (err != KS_OK)
        fprintf(stderr, "open: %s: %s\n", ks_err_name(err), w->err);
    assert_int_equal(err, KS_OK);
    *state = w;
    return 0;
}

/* Close what is open. */
static int world_teardown(void **state)
{
    world *w = *state;
    if (w->s != NULL)
        w->s->ops->close(w->s);
    ks_rollout_db_close(w->db);
    PQfinish(w->admin);
    free(w);
    return 0;
}

/* Hand w's store to a ks_rollout_db. */
static void wrap(world *w)
{
    assert_int_equal(ks_rollout_db_wrap(w->s, &w->db), KS_OK);
    w->s = NULL;
}

/* Another store on the cluster (read-only when read_only), asserted
 * open. */
static ks_rollout_store *open_store(world *w, int read_only)
{
    ks_rollout_store *s = NULL;
    assert_int_equal(
        ks_rollout_store_pg_open(ks_pg_test_conninfo, read_only, &s, w->err, sizeof w->err),
        KS_OK);
    return s;
}

/* A class of format 2, xchacha20-poly1305, key_id at key_version. */
static ks_rollout_class cls(const char *key_id, uint32_t key_version)
{
    ks_rollout_class c = {.version = 2, .algorithm = KS_ALG_XCHACHA20POLY1305,
                          .key_version = key_version};
    snprintf(c.key_id, sizeof c.key_id, "%s", key_id);
    return c;
}

/* A spec: table.column (as given) from plaintext to k:1, reader TTL 30 s,
 * no soak. */
static ks_rollout spec(const char *table, const char *column)
{
    ks_rollout s = {.scope = KS_SCOPE_COLUMN, .source = {.is_plaintext = 1},
                    .target = cls("k", 1), .reader_ttl_s = 30};
    snprintf(s.table, sizeof s.table, "%s", table);
    snprintf(s.column, sizeof s.column, "%s", column);
    ks_thresholds_default(&s.thresholds);
    return s;
}

/* A reader holding keys, heartbeat at now. */
static ks_rollout_reader reader(const char *id, const char *keys)
{
    ks_rollout_reader r = {.max_format = 2, .algorithms = 1u << KS_ALG_XCHACHA20POLY1305};
    snprintf(r.instance_id, sizeof r.instance_id, "%s", id);
    snprintf(r.library_version, sizeof r.library_version, "%s", KS_VERSION_STRING);
    snprintf(r.keys, sizeof r.keys, "%s", keys);
    return r;
}

#endif /* KS_TESTS_ROLLOUT_PG_TEST_H */
