/*
 * tests/test_app_pg.c -- the application API (keyshift/app.h) with its
 * rollout state in PostgreSQL: opening by URI registers the reader, seal
 * and open follow the phases of a rollout from plaintext, the background
 * thread reports health rows, and close deregisters.  The SQLite path and
 * everything that does not depend on the database are tests/test_app.c's.
 *
 * The group setup starts a throw-away cluster (tests/pg_test.h); the
 * test starts from an empty public schema.  Keys come from the in-memory
 * provider (tests/mem_provider.h).
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

#include <cmocka.h>
#include <libpq-fe.h>
#include <sodium.h>

#include <keyshift/app.h>
#include <keyshift/rollout_store.h>
#include <keyshift/rollout_store_pg.h>

#include "mem_provider.h"
#include "pg_test.h"

#define BV(s) ((ks_bytes){(const uint8_t *)(s), sizeof(s) - 1})

/* One test's world: the admin connection and the rollout state. */
typedef struct world {
    PGconn *admin;
    ks_rollout_db *db;
    char err[512];
} world;

/* A fresh public schema with payments(id, tenant, card bytea) and the
 * rollout store over it. */
static int world_setup(void **state)
{
    world *w = calloc(1, sizeof *w);
    assert_non_null(w);
    w->admin = ks_pg_test_admin();
    ks_pg_test_exec(w->admin, "CREATE TABLE payments(id bigint PRIMARY KEY, tenant text, "
                              "card bytea)");
    ks_rollout_store *s = NULL;
    assert_int_equal(ks_rollout_store_pg_open(ks_pg_test_conninfo, 0, &s, w->err, sizeof w->err),
                     KS_OK);
    assert_int_equal(ks_rollout_db_wrap(s, &w->db), KS_OK);
    *state = w;
    return 0;
}

/* Close what is open. */
static int world_teardown(void **state)
{
    world *w = *state;
    ks_rollout_db_close(w->db);
    PQfinish(w->admin);
    free(w);
    return 0;
}

/* The cluster's connection string ("host=DIR port=P dbname=D user=U") as
 * the URI ks_app_open takes, into out[0, cap). */
static void cluster_uri(char *out, size_t cap)
{
    char host[128], port[16], db[64], user[64];
    assert_int_equal(sscanf(ks_pg_test_conninfo, "host=%127s port=%15s dbname=%63s user=%63s",
                            host, port, db, user),
                     4);
    snprintf(out, cap, "postgresql://%s@/%s?host=%s&port=%s", user, db, host, port);
}

/* Move rollout id from -> to now with favourable facts, then wait past
 * the policy's refresh period. */
static void move(world *w, int64_t id, ks_rollout_phase from, ks_rollout_phase to)
{
    ks_rollout_facts f = {.now = time(NULL), .target_key_state = KS_KEY_ACTIVE,
                          .source_key_state = KS_KEY_ACTIVE, .census_known = 1,
                          .health_known = 1, .health = KS_HEALTH_OK};
    ks_rollout_change c = {id, from, to, "alice", "test", 0};
    ks_err e = ks_rollout_db_transition(w->db, &c, &f, w->err, sizeof w->err);
    if (e != KS_OK) {
        fail_msg("transition: %s: %s", ks_err_name(e), w->err);
    }
    struct timespec ts = {0, 80 * 1000000L};
    nanosleep(&ts, NULL);
}

/* The number of live readers; the first one's keys into keys. */
static size_t live(world *w, char *keys, size_t cap)
{
    ks_rollout_reader rd[4];
    size_t n = 0;
    assert_int_equal(ks_rollout_db_readers_live(w->db, 30, time(NULL), rd, 4, &n), KS_OK);
    if (n > 0) {
        snprintf(keys, cap, "%s", rd[0].keys);
    }
    return n;
}

/* A rollout of payments.card from plaintext to k:1, followed by an app
 * whose state lives in PostgreSQL. */
static void test_app_on_pg(void **state)
{
    world *w = *state;
    ks_rollout s = {.scope = KS_SCOPE_COLUMN, .source = {.is_plaintext = 1},
                    .target = {.version = 2, .algorithm = KS_ALG_XCHACHA20POLY1305,
                               .key_id = "k", .key_version = 1},
                    .reader_ttl_s = 30, .table = "payments", .column = "card"};
    ks_thresholds_default(&s.thresholds);
    int64_t id = 0;
    assert_int_equal(ks_rollout_db_start(w->db, &s, "alice", time(NULL), &id, w->err,
                                         sizeof w->err),
                     KS_OK);
    assert_true(sodium_init() >= 0);
    ks_mem_provider mem;
    ks_mem_init(&mem);
    assert_int_equal(ks_mem_add(&mem, "k", 1, 1, NULL), 0);
    ks_provider prov = ks_mem_provider_of(&mem);

    char uri[512];
    cluster_uri(uri, sizeof uri);
    ks_app_options o = {0};
    o.provider = &prov;
    o.database = uri;
    o.instance_id = "pg-web-1";
    o.keys = "k:1";
    o.interval_ms = 20;
    ks_app *app = NULL;
    ks_err e = ks_app_open(&o, &app, w->err, sizeof w->err);
    if (e != KS_OK) {
        fail_msg("ks_app_open: %s: %s", ks_err_name(e), w->err);
    }
    ks_app_options ow = {0}; /* a writer of the target, no database */
    ow.provider = &prov;
    ow.default_key_id = "k";
    ks_app *tw = NULL;
    assert_int_equal(ks_app_open(&ow, &tw, NULL, 0), KS_OK);
    char keys[KS_READER_KEYS_MAX + 1] = "";
    assert_int_equal(live(w, keys, sizeof keys), 1);
    assert_string_equal(keys, "k:1");

    ks_app_record r = {"payments", "card", BV("acme"), BV("payments:1:card"), {NULL, 0}};
    uint8_t out[1024], env[1024], pt[1024];
    size_t n = 0, en = 0, pn = 0;
    ks_rollout_class c;
    assert_int_equal(ks_app_seal(tw, &r, (const uint8_t *)"sealed", 6, env, sizeof env, &en, NULL),
                     KS_OK);

    /* planned: plaintext is written and read; the target is refused */
    assert_int_equal(ks_app_seal(app, &r, (const uint8_t *)"plain", 5, out, sizeof out, &n, &c),
                     KS_OK);
    assert_true(c.is_plaintext);
    assert_int_equal(n, 5);
    assert_int_equal(ks_app_open_value(app, &r, out, n, pt, sizeof pt, &pn, NULL, NULL), KS_OK);
    assert_int_equal(ks_app_open_value(app, &r, env, en, pt, sizeof pt, &pn, NULL, NULL),
                     KS_ERR_PHASE);

    /* read-compat: the target is read, plaintext still written */
    move(w, id, KS_PHASE_PLANNED, KS_PHASE_READ_COMPAT);
    assert_int_equal(ks_app_open_value(app, &r, env, en, pt, sizeof pt, &pn, NULL, NULL), KS_OK);
    assert_int_equal(pn, 6);
    assert_memory_equal(pt, "sealed", 6);
    assert_int_equal(ks_app_seal(app, &r, (const uint8_t *)"plain", 5, out, sizeof out, &n, &c),
                     KS_OK);
    assert_true(c.is_plaintext);

    /* write-upgrade (canary all): the target is written */
    move(w, id, KS_PHASE_READ_COMPAT, KS_PHASE_WRITE_UPGRADE);
    assert_int_equal(ks_app_seal(app, &r, (const uint8_t *)"new", 3, out, sizeof out, &n, &c),
                     KS_OK);
    assert_true(ks_rollout_class_equal(&c, &s.target));
    assert_int_equal(ks_app_open_value(app, &r, out, n, pt, sizeof pt, &pn, NULL, NULL), KS_OK);

    /* the background thread reports; close reports the rest */
    ks_app_stats st;
    ks_app_stats_get(app, &st);
    uint64_t want = st.reports + 2;
    for (int i = 0; i < 1000 && st.reports < want; i++) {
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
        ks_app_stats_get(app, &st);
    }
    assert_true(st.reports >= want);
    assert_true(st.heartbeats >= 1);
    ks_app_close(app);
    ks_health_sample sum;
    assert_int_equal(ks_rollout_db_metrics_sum(w->db, id, 0, &sum), KS_OK);
    assert_true(sum.seals >= 1);
    assert_true(sum.opens >= 2);
    assert_int_equal(live(w, keys, sizeof keys), 0);
    ks_app_close(tw);
    ks_mem_cleanup(&mem);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_app_on_pg, world_setup, world_teardown),
    };
    return cmocka_run_group_tests(tests, ks_pg_test_group_setup, ks_pg_test_group_teardown);
}
