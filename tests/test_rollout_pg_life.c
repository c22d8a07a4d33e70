/*
 * tests/test_rollout_pg_life.c -- the rollout layer over the PostgreSQL
 * rollout store (ks_rollout_db_wrap, ks_policy_open_store): two
 * connections racing a transition, the whole lifecycle with a migration
 * through the PostgreSQL row store and a policy answering each phase,
 * and the policy's recovery from a dropped connection.  The store's own
 * contract is tests/test_rollout_pg.c's.
 *
 * The group setup starts a throw-away cluster (tests/pg_test.h); each
 * test starts from an empty public schema.  A second libpq connection
 * (the "admin") plays other processes: it watches for a waiting lock and
 * drops connections.  No test passes or fails on a measured duration.
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <time.h>

#include <sodium.h>

#include <keyshift/migrate.h>
#include <keyshift/rowstore.h>
#include <keyshift/rowstore_pg.h>

#include "mem_provider.h"
#include "rollout_pg_test.h"

/* Move rollout id from -> to at now through w->db with facts f (now
 * filled in); returns the error, the guard's sentence in w->err. */
static ks_err move(world *w, int64_t id, ks_rollout_phase from, ks_rollout_phase to,
                   ks_rollout_facts f, int64_t now)
{
    f.now = now;
    ks_rollout_change c = {id, from, to, "alice", "test", 0};
    return ks_rollout_db_transition(w->db, &c, &f, w->err, sizeof w->err);
}

/* ---- racing transitions ---------------------------------------------------------- */

/* A second process moving a rollout from planned to read-compat. */
typedef struct racer {
    ks_rollout_db *db;
    int64_t id;
    ks_err result;
    char why[256];
} racer;

/* The racer's thread: the same transition through its own store. */
static void *race_thread(void *arg)
{
    racer *r = arg;
    ks_rollout_facts f = {.now = 1100, .target_key_state = KS_KEY_ACTIVE};
    ks_rollout_change c = {r->id, KS_PHASE_PLANNED, KS_PHASE_READ_COMPAT, "bob", "race", 0};
    r->result = ks_rollout_db_transition(r->db, &c, &f, r->why, sizeof r->why);
    return NULL;
}

/* Hand w's store to the rollout layer and start payments.card (spec) at
 * 1000; returns its id. */
static int64_t start_card(world *w)
{
    wrap(w);
    ks_rollout sp = spec("payments", "card");
    int64_t id = 0;
    assert_int_equal(ks_rollout_db_start(w->db, &sp, "alice", 1000, &id, w->err, sizeof w->err),
                     KS_OK);
    return id;
}

/* Two connections racing the same transition: the second waits for the
 * first's lock (seen in pg_locks), then finds the rollout moved
 * (KS_ERR_STALE); one log row, one phase change. */
static void test_race_transition(void **state)
{
    world *w = *state;
    int64_t id = start_card(w);
    racer r = {.id = id};
    assert_int_equal(ks_rollout_db_wrap(open_store(w, 0), &r.db), KS_OK);
    /* a third connection holds the write lock as begin takes it */
    ks_rollout_store *holder = open_store(w, 0);
    assert_int_equal(holder->ops->begin(holder), KS_OK);
    assert_int_equal(holder->ops->set_phase(holder, id, KS_PHASE_PLANNED, KS_PHASE_READ_COMPAT,
                                            1050),
                     KS_OK);
    assert_int_equal(holder->ops->log_append(holder, id, 1050, "carol", KS_PHASE_PLANNED,
                                             KS_PHASE_READ_COMPAT, "first", 0),
                     KS_OK);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, race_thread, &r), 0);
    /* wait (bounded) until the racer is blocked on the table lock */
    int waiting = 0;
    for (int i = 0; i < 2000 && !waiting; i++) {
        waiting = ks_pg_test_int(w->admin, "SELECT count(*) FROM pg_locks l JOIN pg_class c ON "
                               "c.oid = l.relation WHERE c.relname = 'keyshift_rollout' "
                               "AND NOT l.granted") > 0;
        if (!waiting)
            nanosleep(&(struct timespec){0, 5000000}, NULL);
    }
    assert_true(waiting);
    assert_int_equal(holder->ops->commit(holder), KS_OK);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_int_equal(r.result, KS_ERR_STALE);
    /* and the loser of a plain race through the rollout layer is stale too */
    ks_rollout_facts f = {.target_key_state = KS_KEY_ACTIVE};
    assert_int_equal(move(w, id, KS_PHASE_PLANNED, KS_PHASE_READ_COMPAT, f, 1200), KS_ERR_STALE);
    assert_int_equal(ks_pg_test_int(w->admin, "SELECT count(*) FROM keyshift_rollout_log WHERE to_phase = "
                                  "'read-compat'"),
                     1);
    holder->ops->close(holder);
    ks_rollout_db_close(r.db);
}

/* ---- the whole lifecycle ------------------------------------------------------------ */

/* Rows of payments: 1..n plaintext "card-<id>" (tenant acme). */
static void fill_payments(world *w, int n)
{
    char sql[160];
    snprintf(sql, sizeof sql,
             "INSERT INTO payments(id, tenant, card) SELECT g, 'acme', "
             "convert_to('card-' || g, 'UTF8') FROM generate_series(1, %d) g",
             n);
    ks_pg_test_exec(w->admin, sql);
}

/* Encrypt (or rewrap) payments.card through the PostgreSQL row store
 * with ctx; the run's checkpoint into *cp. */
static void run_migration(ks_ctx *ctx, ks_migrate_mode mode, ks_checkpoint *cp, int verify,
                          ks_verify_result *vr, ks_census *census)
{
    ks_rowstore rs;
    char err[256];
    ks_rowstore_target t = {.table = "payments", .column = "card"};
    assert_int_equal(ks_rowstore_pg_open(ks_pg_test_conninfo, &t, NULL, &rs, err, sizeof err),
                     KS_OK);
    ks_migrate_params p = {0};
    p.mode = mode;
    p.to_key_id = BV("k");
    p.tenant = BV("acme");
    p.purpose = BV("pp");
    p.context_template = BV("payments:{id}:card");
    p.batch_size = 16;
    p.max_failure_rate = -1;
    p.supersede = 1;
    if (cp != NULL)
        assert_int_equal(ks_migrate_run(ctx, &rs, &p, NULL, NULL, NULL, cp), KS_OK);
    if (verify)
        assert_int_equal(ks_migrate_verify(ctx, &rs, &p, 0, NULL, NULL, vr), KS_OK);
    if (census != NULL)
        assert_int_equal(ks_census_run(&rs, census), KS_OK);
    ks_rowstore_close(&rs);
}

/* One envelope value of payments.card (row id) read by the admin. */
static size_t card_of(world *w, int id, uint8_t *out, size_t cap)
{
    char sql[96];
    snprintf(sql, sizeof sql, "SELECT card FROM payments WHERE id = %d", id);
    PGresult *res = PQexecParams(w->admin, sql, 0, NULL, NULL, NULL, NULL, 1);
    assert_int_equal(PQresultStatus(res), PGRES_TUPLES_OK);
    size_t n = (size_t)PQgetlength(res, 0, 0);
    assert_true(n <= cap);
    memcpy(out, PQgetvalue(res, 0, 0), n);
    PQclear(res);
    return n;
}

/* May policy p read value v of payments.card (refreshing first)? */
static int may(ks_policy *p, const uint8_t *v, size_t len)
{
    int ok = -1;
    ks_bytes b = {v, len};
    assert_int_equal(ks_policy_refresh(p), KS_OK);
    assert_int_equal(ks_policy_may_read(p, "payments", "card", &b, &ok), KS_OK);
    return ok;
}

/* Does p write the target for tenant (else the source)? */
static int writes_target(ks_policy *p, const char *tenant)
{
    ks_rollout_class c;
    ks_rollout_class want = cls("k", 1);
    ks_bytes t = {(const uint8_t *)tenant, strlen(tenant)};
    assert_int_equal(ks_policy_refresh(p), KS_OK);
    assert_int_equal(ks_policy_write_target(p, "payments", "card", t, &c), KS_OK);
    return ks_rollout_class_equal(&c, &want);
}

/* start, read-compat, write-upgrade (a reader without the key refuses
 * it), backfill with a migration over the PostgreSQL row store and a
 * verify pass, finalize; the refusals of the guards on the way; a
 * policy on its own PostgreSQL store answering each phase; the log. */
static void test_lifecycle(void **state)
{
    world *w = *state;
    wrap(w);
    fill_payments(w, 40);
    assert_true(sodium_init() >= 0);
    ks_mem_provider mem;
    ks_mem_init(&mem);
    assert_int_equal(ks_mem_add(&mem, "k", 1, 1, NULL), 0);
    ks_provider prov = ks_mem_provider_of(&mem);
    ks_ctx *ctx = NULL;
    assert_int_equal(ks_ctx_new(&prov, NULL, &ctx), KS_OK);

    /* the application's policy, over a store of its own, registered */
    ks_rollout_store *ps = open_store(w, 0);
    ks_policy_options o = {"app-1", 2, 1u << KS_ALG_XCHACHA20POLY1305, "k:1", 1, 1};
    ks_policy *pol = NULL;
    assert_int_equal(ks_policy_open_store(ps, &o, &pol), KS_OK);
    static const uint8_t plain[] = "card-1";
    ks_rollout_class c;
    assert_int_equal(ks_policy_write_target(pol, "payments", "card", BV("acme"), &c),
                     KS_ERR_NOT_FOUND);

    ks_rollout sp = spec("Payments", "CARD");
    sp.canary = (ks_rollout_canary){.kind = KS_CANARY_TENANTS, .n_tenants = 1,
                                    .tenants = {"acme"}};
    int64_t id = 0, other = 0;
    assert_int_equal(ks_rollout_db_start(w->db, &sp, "alice", 1000, &id, w->err, sizeof w->err),
                     KS_OK);
    assert_int_equal(ks_rollout_db_start(w->db, &sp, "alice", 1000, &other, w->err,
                                         sizeof w->err),
                     KS_ERR_ROLLOUT_EXISTS);
    ks_rollout got;
    assert_int_equal(ks_rollout_db_latest(w->db, "payments", "card", &got), KS_OK);
    assert_string_equal(got.table, "payments");
    assert_int_equal(may(pol, plain, sizeof plain - 1), 1); /* planned: the source */
    assert_false(writes_target(pol, "acme"));

    ks_rollout_facts none = {0};
    ks_rollout_facts f = {.target_key_state = KS_KEY_ACTIVE};
    /* planned -> backfill does not exist; -> read-compat needs the key */
    assert_int_equal(move(w, id, KS_PHASE_PLANNED, KS_PHASE_BACKFILL, f, 1100), KS_ERR_STATE);
    assert_int_equal(move(w, id, KS_PHASE_PLANNED, KS_PHASE_READ_COMPAT, none, 1100),
                     KS_ERR_GUARD);
    assert_int_equal(move(w, id, KS_PHASE_PLANNED, KS_PHASE_READ_COMPAT, f, 1100), KS_OK);
    assert_false(writes_target(pol, "acme"));

    /* a live reader that lacks k:1 refuses write-upgrade; then it upgrades */
    ks_rollout_reader old = reader("web-old", "");
    int64_t now = (int64_t)time(NULL);
    assert_int_equal(ks_rollout_db_reader_register(w->db, &old, now), KS_OK);
    assert_int_equal(move(w, id, KS_PHASE_READ_COMPAT, KS_PHASE_WRITE_UPGRADE, none, now),
                     KS_ERR_GUARD);
    assert_non_null(strstr(w->err, "web-old"));
    assert_int_equal(ks_rollout_db_reader_deregister(w->db, "web-old"), KS_OK);
    assert_int_equal(move(w, id, KS_PHASE_READ_COMPAT, KS_PHASE_WRITE_UPGRADE, none, now), KS_OK);
    assert_true(writes_target(pol, "acme"));   /* the canary tenant */
    assert_false(writes_target(pol, "globex")); /* everyone else */

    /* write-upgrade -> backfill needs a healthy verdict */
    assert_int_equal(move(w, id, KS_PHASE_WRITE_UPGRADE, KS_PHASE_BACKFILL, none, now + 1),
                     KS_ERR_GUARD);
    ks_rollout_facts healthy = {.health_known = 1, .health = KS_HEALTH_OK};
    assert_int_equal(move(w, id, KS_PHASE_WRITE_UPGRADE, KS_PHASE_BACKFILL, healthy, now + 1),
                     KS_OK);
    assert_true(writes_target(pol, "globex"));

    /* the migration, over the PostgreSQL row store */
    ks_checkpoint cp;
    ks_census census;
    run_migration(ctx, KS_MIGRATE_ENCRYPT, &cp, 0, NULL, &census);
    assert_int_equal(cp.done, 40);
    assert_int_equal(census.plaintext_rows, 0);
    assert_int_equal(census.n_classes, 1);
    uint64_t at_target = census.classes[0].rows;
    assert_int_equal(at_target, 40);
    ks_census_free(&census);
    uint8_t env[512];
    size_t envn = card_of(w, 7, env, sizeof env);
    assert_int_equal(may(pol, env, envn), 1);            /* backfill: the target */
    assert_int_equal(may(pol, plain, sizeof plain - 1), 1); /* and the source */

    /* finalize needs the census at 0 and a verify pass in backfill */
    ks_rollout_facts fin = {.census_known = 1, .rows_at_source = 0, .rows_at_target = 40};
    assert_int_equal(move(w, id, KS_PHASE_BACKFILL, KS_PHASE_FINALIZED, fin, now + 2),
                     KS_ERR_GUARD);
    assert_non_null(strstr(w->err, "verify"));
    ks_verify_result vr;
    run_migration(ctx, KS_MIGRATE_ENCRYPT, NULL, 1, &vr, NULL);
    assert_int_equal(vr.failed, 0);
    assert_int_equal(ks_rollout_db_record_verify(w->db, id, "alice", now + 2), KS_OK);
    fin.rows_at_source = 3;
    assert_int_equal(move(w, id, KS_PHASE_BACKFILL, KS_PHASE_FINALIZED, fin, now + 3),
                     KS_ERR_GUARD);
    fin.rows_at_source = 0;
    /* rollback to read-compat is always allowed, and returns through
     * write-upgrade to backfill, which clears the verify pass */
    assert_int_equal(move(w, id, KS_PHASE_BACKFILL, KS_PHASE_READ_COMPAT, none, now + 3), KS_OK);
    /* read-compat -> planned refused: rows at the target */
    ks_rollout_facts back = {.census_known = 1, .rows_at_target = 40};
    assert_int_equal(move(w, id, KS_PHASE_READ_COMPAT, KS_PHASE_PLANNED, back, now + 3),
                     KS_ERR_GUARD);
    assert_int_equal(move(w, id, KS_PHASE_READ_COMPAT, KS_PHASE_WRITE_UPGRADE, none, now + 4),
                     KS_OK);
    assert_int_equal(move(w, id, KS_PHASE_WRITE_UPGRADE, KS_PHASE_BACKFILL, healthy, now + 4),
                     KS_OK);
    assert_int_equal(ks_rollout_db_get(w->db, id, &got), KS_OK);
    assert_int_equal(got.verified_at, 0);
    assert_int_equal(move(w, id, KS_PHASE_BACKFILL, KS_PHASE_FINALIZED, fin, now + 5),
                     KS_ERR_GUARD);
    assert_int_equal(ks_rollout_db_record_verify(w->db, id, "alice", now + 5), KS_OK);
    assert_int_equal(move(w, id, KS_PHASE_BACKFILL, KS_PHASE_FINALIZED, fin, now + 6), KS_OK);
    assert_int_equal(may(pol, plain, sizeof plain - 1), 0); /* finalized: the target only */
    assert_int_equal(may(pol, env, envn), 1);
    assert_true(writes_target(pol, "globex"));

    /* finalized -> read-compat does not exist; -> backfill is allowed
     * while the rollout is the latest (plaintext source) */
    assert_int_equal(move(w, id, KS_PHASE_FINALIZED, KS_PHASE_READ_COMPAT, none, now + 7),
                     KS_ERR_STATE);
    ks_rollout_facts reopen = {0};
    assert_int_equal(move(w, id, KS_PHASE_FINALIZED, KS_PHASE_BACKFILL, reopen, now + 7), KS_OK);
    assert_int_equal(may(pol, plain, sizeof plain - 1), 1);

    /* the log: the start, every transition and verify pass, in order */
    ks_rollout_log_entry e[32];
    size_t n = 0;
    assert_int_equal(ks_rollout_db_log(w->db, id, 0, e, 32, &n), KS_OK);
    assert_int_equal(n, 11); /* start, 8 transitions, 2 verify passes */
    assert_int_equal(e[0].from, 0);
    assert_int_equal(e[0].to, KS_PHASE_PLANNED);
    assert_int_equal(e[n - 1].from, KS_PHASE_FINALIZED);
    assert_int_equal(e[n - 1].to, KS_PHASE_BACKFILL);
    assert_int_equal(admin_try(w, "DELETE FROM keyshift_rollout_log"), PGRES_FATAL_ERROR);

    /* the policy registered its instance, and deregisters at close */
    assert_int_equal(ks_pg_test_int(w->admin, "SELECT count(*) FROM keyshift_readers WHERE instance_id = "
                                  "'app-1'"),
                     1);
    ks_policy_close(pol);
    assert_int_equal(ks_pg_test_int(w->admin, "SELECT count(*) FROM keyshift_readers"), 0);
    ks_ctx_free(ctx);
    ks_mem_cleanup(&mem);
}

/* ks_policy_open_store's arguments: a NULL store or options refuse (the
 * store closed); a store that fails its first load fails the open. */
static void test_policy_open_store_args(void **state)
{
    world *w = *state;
    ks_policy *p = (ks_policy *)(void *)w;
    ks_policy_options o = {"app-1", 2, 1u << KS_ALG_XCHACHA20POLY1305, "", 0, 0};
    assert_int_equal(ks_policy_open_store(NULL, &o, &p), KS_ERR_INVALID_ARGUMENT);
    assert_null(p);
    assert_int_equal(ks_policy_open_store(w->s, NULL, &p), KS_ERR_INVALID_ARGUMENT);
    w->s = NULL; /* closed by the call */
    ks_rollout_store *ro = open_store(w, 1);
    o.heartbeat = 1; /* a read-only store cannot register */
    assert_int_equal(ks_policy_open_store(ro, &o, &p), KS_ERR_INVALID_ARGUMENT);
    assert_null(p);
    ro = open_store(w, 1);
    o.heartbeat = 0;
    assert_int_equal(ks_policy_open_store(ro, &o, &p), KS_OK);
    ks_rollout_class c;
    assert_int_equal(ks_policy_write_target(p, "payments", "card", BV("acme"), &c),
                     KS_ERR_NOT_FOUND);
    ks_policy_close(p);
}

/* A policy whose connection the server dropped fails closed once, then
 * reconnects by itself at the next check and answers again. */
static void test_policy_reconnects(void **state)
{
    world *w = *state;
    assert_true(start_card(w) > 0);
    ks_rollout_store *ps = open_store(w, 1);
    ks_policy_options o = {"app-1", 2, 1u << KS_ALG_XCHACHA20POLY1305, "k:1", 1, 0};
    ks_policy *pol = NULL;
    assert_int_equal(ks_policy_open_store(ps, &o, &pol), KS_OK);
    ks_rollout_class c;
    assert_int_equal(ks_policy_write_target(pol, "payments", "card", BV("acme"), &c), KS_OK);
    assert_true(c.is_plaintext);
    ks_pg_test_exec(w->admin, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                  "WHERE application_name = 'keyshift' AND backend_type = 'client backend' "
                  "AND pid <> pg_backend_pid()");
    assert_int_equal(ks_policy_refresh(pol), KS_ERR_UNAVAILABLE);
    assert_int_equal(ks_policy_refresh(pol), KS_OK);
    assert_int_equal(ks_policy_write_target(pol, "payments", "card", BV("acme"), &c), KS_OK);
    ks_policy_close(pol);
}

/* Run the tests on one throw-away cluster. */
int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_race_transition, world_setup, world_teardown),
        cmocka_unit_test_setup_teardown(test_lifecycle, world_setup, world_teardown),
        cmocka_unit_test_setup_teardown(test_policy_open_store_args, world_setup, world_teardown),
        cmocka_unit_test_setup_teardown(test_policy_reconnects, world_setup, world_teardown),
    };
    return cmocka_run_group_tests(tests, ks_pg_test_group_setup, ks_pg_test_group_teardown);
}
