/*
 * tests/test_workers_pg.c -- N workers claiming chunks of one migration
 * on PostgreSQL (keyshift/workers.h, keyshift/chunks.h,
 * migrate/engine/workers.c, migrate/store/pg/pg_chunks.c).
 *
 * The group setup starts a throw-away cluster (tests/pg_test.h).  Each
 * test starts from an empty public schema with a table rec(id, v) of
 * plaintext rows ("secret-<id>", NULL every 97th) and an admin
 * connection that checks the results.  KS_WORKERS_ROWS sets the rows of
 * the convergence test (default 200,000).  No test
 * passes or fails on a measured duration; the sleeps only make leases
 * expire.
 */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>
#include <libpq-fe.h>
#include <pthread.h>
#include <sodium.h>
#include <sys/wait.h>

#include <keyshift/chunks.h>
#include <keyshift/chunks_pg.h>
#include <keyshift/envelope.h>
#include <keyshift/migrate.h>
#include <keyshift/rowstore.h>
#include <keyshift/rowstore_pg.h>
#include <keyshift/workers.h>

#include "mem_provider.h"
#include "pg_test.h"

#define BV(s) ((ks_bytes){(const uint8_t *)(s), sizeof(s) - 1})

/* One test's world: the admin connection, keys and a context. */
typedef struct world {
    PGconn *admin;
    ks_mem_provider mem;
    ks_provider prov;
    ks_ctx *ctx;
    int64_t rows;
} world;

/* Run sql (no values of the test's own) on the admin connection and
 * assert that it succeeded. */
static void admin_exec(world *w, const char *sql)
{
    ks_pg_test_exec(w->admin, sql);
}

/* A single-integer query's answer on the admin connection. */
static long long admin_int(world *w, const char *sql)
{
    return ks_pg_test_int(w->admin, sql);
}

/* A fresh public schema, an admin connection, key "k" version 1 and a
 * context. */
static int world_setup(void **state)
{
    world *w = calloc(1, sizeof *w);
    assert_non_null(w);
    w->admin = ks_pg_test_admin();
    assert_true(sodium_init() >= 0);
    ks_mem_init(&w->mem);
    assert_int_equal(ks_mem_add(&w->mem, "k", 1, 1, NULL), 0);
    w->prov = ks_mem_provider_of(&w->mem);
    assert_int_equal(ks_ctx_new(&w->prov, NULL, &w->ctx), KS_OK);
    *state = w;
    return 0;
}

/* Free the context, the provider and the admin connection. */
static int world_teardown(void **state)
{
    world *w = *state;
    ks_ctx_free(w->ctx);
    ks_mem_cleanup(&w->mem);
    PQfinish(w->admin);
    free(w);
    return 0;
}

/* Table rec(id bigint primary key, v bytea) with rows 1..n: "secret-<id>",
 * NULL every 97th (made by the server). */
static void make_rows(world *w, int64_t n)
{
    char sql[256];
    admin_exec(w, "CREATE TABLE rec(id bigint PRIMARY KEY, v bytea)");
    snprintf(sql, sizeof sql,
             "INSERT INTO rec SELECT g, CASE WHEN g %% 97 = 0 THEN NULL ELSE "
             "convert_to('secret-' || g, 'UTF8') END FROM generate_series(1, %lld) AS g",
             (long long)n);
    admin_exec(w, sql);
    w->rows = n;
}

/* The non-NULL rows of rec. */
static uint64_t live_rows(const world *w)
{
    return (uint64_t)(w->rows - w->rows / 97);
}

/* Encrypt under "k" with tenant acme, purpose pp, context "rec:{id}". */
static ks_migrate_params rec_params(ks_migrate_mode mode, size_t batch)
{
    ks_migrate_params p = {0};
    p.mode = mode;
    p.to_key_id = BV("k");
    p.tenant = BV("acme");
    p.purpose = BV("pp");
    p.context_template = BV("rec:{id}");
    p.batch_size = batch;
    p.max_failure_rate = -1;
    return p;
}

/* The open callback: a store on rec.v and its coordinator. */
static ks_err open_worker(void *arg, unsigned worker, ks_rowstore *store, ks_chunks *chunks)
{
    (void)arg;
    (void)worker;
    char err[256];
    ks_rowstore_target tg = {.table = "rec", .column = "v"};
    ks_err e = ks_rowstore_pg_open(ks_pg_test_conninfo, &tg, NULL, store, err, sizeof err);
    if (e == KS_OK)
        e = ks_chunks_pg_open(store, chunks, err, sizeof err);
    if (e != KS_OK)
        fprintf(stderr, "open_worker: %s: %s\n", ks_err_name(e), err);
    return e;
}

/* Every row of rec: NULL every 97th, else an envelope under (k, version)
 * that opens to "secret-<id>". */
static void check_rows(world *w, uint32_t version)
{
    assert_int_equal(admin_int(w, "SELECT count(*) FROM rec"), w->rows);
    PGresult *res = PQexecParams(w->admin, "SELECT id, v FROM rec ORDER BY id", 0, NULL, NULL,
                                 NULL, NULL, 1);
    assert_int_equal(PQresultStatus(res), PGRES_TUPLES_OK);
    assert_int_equal(PQntuples(res), w->rows);
    for (int i = 0; i < PQntuples(res); i++) {
        const uint8_t *idp = (const uint8_t *)PQgetvalue(res, i, 0);
        int64_t id = 0;
        for (int k = 0; k < 8; k++)
            id = (int64_t)((uint64_t)id << 8 | idp[k]);
        assert_int_equal(id, i + 1);
        if (id % 97 == 0) {
            assert_true(PQgetisnull(res, i, 1));
            continue;
        }
        const uint8_t *v = (const uint8_t *)PQgetvalue(res, i, 1);
        size_t n = (size_t)PQgetlength(res, i, 1);
        ks_envelope e;
        assert_int_equal(ks_envelope_parse(v, n, NULL, &e, NULL), KS_OK);
        assert_int_equal(e.key_version, version);
        char c[32], want[32];
        snprintf(c, sizeof c, "rec:%lld", (long long)id);
        snprintf(want, sizeof want, "secret-%lld", (long long)id);
        ks_open_params op = {{(const uint8_t *)c, strlen(c)}, BV("acme"), BV("pp")};
        uint8_t pt[64];
        size_t ptn = 0;
        assert_int_equal(ks_open(w->ctx, v, n, &op, pt, sizeof pt, &ptn, NULL), KS_OK);
        assert_int_equal(ptn, strlen(want));
        assert_memory_equal(pt, want, ptn);
    }
    PQclear(res);
}

/* The chunks of the latest migration: every one complete, counted once:
 * their done sum to the non-NULL rows, nothing raced or quarantined. */
static void check_chunks(world *w, const ks_workers_result *r)
{
    assert_int_equal(r->summary.complete, r->summary.chunks);
    assert_true(r->summary.chunks > 0);
    assert_int_equal(r->summary.done, live_rows(w));
    assert_int_equal(r->summary.quarantined, 0);
    assert_int_equal(r->summary.wrong_state, 0);
    /* the same sums in the table itself, and the migration's checkpoint */
    assert_int_equal(admin_int(w, "SELECT sum(done) FROM keyshift_chunk WHERE params = "
                                  "(SELECT params FROM keyshift_migration ORDER BY updated DESC, "
                                  "saved DESC LIMIT 1)"),
                     live_rows(w));
    assert_int_equal(admin_int(w, "SELECT done FROM keyshift_migration ORDER BY updated DESC, "
                                  "saved DESC LIMIT 1"),
                     live_rows(w));
    assert_int_equal(admin_int(w, "SELECT count(*) FROM keyshift_migration WHERE state <> "
                                  "'complete'"),
                     0);
}

/* Seconds since t0. */
static double secs(const struct timespec *t0)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)(t.tv_sec - t0->tv_sec) + (double)(t.tv_nsec - t0->tv_nsec) / 1e9;
}

/* ---- convergence --------------------------------------------------------------- */

#define SAMPLE 64

/* 4 workers encrypt the table, then rewrap it: every row opens to its
 * plaintext, every row is done exactly once (the chunks' counts), and
 * the rewrap kept a sample's nonce and ciphertext byte for byte. */
static void test_converge(void **state)
{
    world *w = *state;
    const char *env = getenv("KS_WORKERS_ROWS");
    int64_t n = env != NULL && atoll(env) > 0 ? atoll(env) : 200000;
    make_rows(w, n);
    ks_migrate_params p = rec_params(KS_MIGRATE_ENCRYPT, 500);
    ks_workers_options o = {.workers = 4, .chunk_ids = 5000, .lease_ms = 30000};
    ks_workers_result r;
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    assert_int_equal(ks_migrate_run_workers(w->ctx, &p, &o, open_worker, NULL, NULL, NULL, NULL,
                                            &r),
                     KS_OK);
    fprintf(stderr, "# encrypt: %lld rows, 4 workers, %llu chunks: %.1f s\n", (long long)n,
            (unsigned long long)r.summary.chunks, secs(&t0));
    assert_int_equal(r.rows, (uint64_t)n);
    assert_int_equal(r.claims, r.summary.chunks);
    assert_int_equal(r.lost, 0);
    check_chunks(w, &r);
    check_rows(w, 1);

    /* a sample's envelopes before the rewrap */
    static uint8_t before[SAMPLE][256];
    int blen[SAMPLE];
    int64_t ids[SAMPLE];
    for (int i = 0; i < SAMPLE; i++) {
        ids[i] = 1 + (int64_t)randombytes_uniform((uint32_t)n);
        if (ids[i] % 97 == 0)
            ids[i]--;
        char sql[96];
        snprintf(sql, sizeof sql, "SELECT v FROM rec WHERE id = %lld", (long long)ids[i]);
        PGresult *res = PQexecParams(w->admin, sql, 0, NULL, NULL, NULL, NULL, 1);
        assert_int_equal(PQntuples(res), 1);
        blen[i] = PQgetlength(res, 0, 0);
        assert_true(blen[i] > 0 && (size_t)blen[i] <= sizeof before[i]);
        memcpy(before[i], PQgetvalue(res, 0, 0), (size_t)blen[i]);
        PQclear(res);
    }
    assert_int_equal(ks_mem_add(&w->mem, "k", 2, 1, NULL), 0);
    p.mode = KS_MIGRATE_REWRAP;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    assert_int_equal(ks_migrate_run_workers(w->ctx, &p, &o, open_worker, NULL, NULL, NULL, NULL,
                                            &r),
                     KS_OK);
    fprintf(stderr, "# rewrap: %lld rows, 4 workers: %.1f s\n", (long long)n, secs(&t0));
    check_chunks(w, &r);
    check_rows(w, 2);
    for (int i = 0; i < SAMPLE; i++) {
        char sql[96];
        snprintf(sql, sizeof sql, "SELECT v FROM rec WHERE id = %lld", (long long)ids[i]);
        PGresult *res = PQexecParams(w->admin, sql, 0, NULL, NULL, NULL, NULL, 1);
        const uint8_t *v = (const uint8_t *)PQgetvalue(res, 0, 0);
        ks_envelope a, b;
        assert_int_equal(ks_envelope_parse(before[i], (size_t)blen[i], NULL, &a, NULL), KS_OK);
        assert_int_equal(ks_envelope_parse(v, (size_t)PQgetlength(res, 0, 0), NULL, &b, NULL),
                         KS_OK);
        assert_int_equal(a.key_version, 1);
        assert_int_equal(b.key_version, 2);
        assert_int_equal(a.nonce.len, b.nonce.len);
        assert_memory_equal(a.nonce.ptr, b.nonce.ptr, a.nonce.len);
        assert_int_equal(a.ciphertext.len, b.ciphertext.len);
        assert_memory_equal(a.ciphertext.ptr, b.ciphertext.ptr, a.ciphertext.len);
        PQclear(res);
    }
    /* a rerun of a complete migration does nothing */
    assert_int_equal(ks_migrate_run_workers(w->ctx, &p, &o, open_worker, NULL, NULL, NULL, NULL,
                                            &r),
                     KS_OK);
    assert_int_equal(r.rows, 0);
}

/* ---- the chunk interface ----------------------------------------------------------- */

/* Count rows visited (visit_rows_range callback). */
static ks_err count_row(void *arg, const ks_row *row)
{
    (void)row;
    (*(size_t *)arg)++;
    return KS_OK;
}

/* The range scan stops at its bound; a worker that lost its lease to a
 * takeover cannot renew, and its batch is rolled back (the data row
 * unchanged, the new owner's save and commit go through). */
static void test_lost_lease(void **state)
{
    world *w = *state;
    make_rows(w, 1000);
    ks_rowstore a, b;
    ks_chunks ca, cb;
    assert_int_equal(open_worker(NULL, 0, &a, &ca), KS_OK);
    assert_int_equal(open_worker(NULL, 1, &b, &cb), KS_OK);
    ks_value upto = {KS_VALUE_INTEGER, 10, {NULL, 0}}, after = {KS_VALUE_INTEGER, 995, {NULL, 0}};
    size_t seen = 0;
    assert_int_equal(a.ops->visit_rows_range(a.self, NULL, &upto, 100, count_row, &seen), KS_OK);
    assert_int_equal(seen, 10);
    seen = 0;
    upto.integer = INT64_MAX;
    assert_int_equal(a.ops->visit_rows_range(a.self, &after, &upto, 100, count_row, &seen), KS_OK);
    assert_int_equal(seen, 5);
    seen = 0;
    after.integer = 100;
    upto.integer = 100;
    assert_int_equal(a.ops->visit_rows_range(a.self, &after, &upto, 100, count_row, &seen), KS_OK);
    assert_int_equal(seen, 0);

    ks_bytes params = BV("test;params"), oa = BV("worker-a"), ob = BV("worker-b");
    uint64_t n = 0;
    assert_int_equal(ca.ops->plan(ca.self, params, 500, &n), KS_OK);
    assert_int_equal(n, 2);
    assert_int_equal(cb.ops->plan(cb.self, params, 10, &n), KS_OK); /* idempotent */
    assert_int_equal(n, 2);
    ks_chunk k;
    assert_int_equal(ca.ops->claim(ca.self, params, oa, 300, &k), KS_OK);
    assert_int_equal(k.id, 0);
    assert_int_equal(k.lo, INT64_MIN);
    assert_int_equal(k.hi, 500);
    assert_true(k.lease_live);
    assert_int_equal(ca.ops->renew(ca.self, params, 0, oa, 300), KS_OK);
    assert_int_equal(cb.ops->renew(cb.self, params, 0, ob, 300), KS_ERR_STALE);
    struct timespec nap = {0, 700 * 1000000L};
    nanosleep(&nap, NULL);
    /* a's lease expired: b takes chunk 0 over */
    assert_int_equal(cb.ops->claim(cb.self, params, ob, 30000, &k), KS_OK);
    assert_int_equal(k.id, 0);
    assert_memory_equal(k.owner.ptr, "worker-b", 8);
    assert_int_equal(ca.ops->renew(ca.self, params, 0, oa, 300), KS_ERR_STALE);
    /* a's batch: its compare-and-swap, then the chunk's save fails and
     * rolls the whole transaction back */
    assert_int_equal(a.ops->begin(a.self), KS_OK);
    ks_value id = {KS_VALUE_INTEGER, 1, {NULL, 0}};
    ks_value old = {KS_VALUE_BLOB, 0, BV("secret-1")};
    int swapped = 0;
    assert_int_equal(a.ops->cas(a.self, &id, &old, BV("lost"), &swapped), KS_OK);
    assert_int_equal(swapped, 1);
    ks_checkpoint cp = {.params = params, .state = BV("running"),
                        .cursor = {KS_VALUE_INTEGER, 1, {NULL, 0}}, .pass = 1, .done = 1};
    assert_int_equal(ca.ops->save(ca.self, params, 0, oa, 30000, &cp), KS_ERR_STALE);
    assert_int_equal(a.ops->commit(a.self), KS_ERR_INVALID_ARGUMENT); /* no transaction left */
    assert_int_equal(admin_int(w, "SELECT count(*) FROM rec WHERE id = 1 AND v = 'secret-1'"), 1);
    assert_int_equal(admin_int(w, "SELECT count(*) FROM keyshift_chunk WHERE chunk_id = 0 "
                                  "AND cursor IS NULL AND done = 0"),
                     1);
    /* b's save goes through with its batch */
    assert_int_equal(b.ops->begin(b.self), KS_OK);
    assert_int_equal(cb.ops->save(cb.self, params, 0, ob, 30000, &cp), KS_OK);
    assert_int_equal(b.ops->commit(b.self), KS_OK);
    assert_int_equal(admin_int(w, "SELECT count(*) FROM keyshift_chunk WHERE chunk_id = 0 "
                                  "AND cursor = 1 AND done = 1 AND owner = 'worker-b'"),
                     1);
    /* "complete" ends the lease; a complete chunk is never claimed again */
    cp.state = BV("complete");
    assert_int_equal(b.ops->begin(b.self), KS_OK);
    assert_int_equal(cb.ops->save(cb.self, params, 0, ob, 30000, &cp), KS_OK);
    assert_int_equal(b.ops->commit(b.self), KS_OK);
    assert_int_equal(ca.ops->claim(ca.self, params, oa, 30000, &k), KS_OK);
    assert_int_equal(k.id, 1);
    assert_int_equal(cb.ops->claim(cb.self, params, ob, 30000, &k), KS_ERR_NOT_FOUND);
    ks_chunk_summary s;
    assert_int_equal(cb.ops->summary(cb.self, params, &s), KS_OK);
    assert_int_equal(s.chunks, 2);
    assert_int_equal(s.complete, 1);
    assert_int_equal(s.leased, 1);
    assert_int_equal(s.claimable, 0);
    assert_int_equal(ca.ops->release(ca.self, params, 1, oa), KS_OK);
    assert_int_equal(cb.ops->release(cb.self, params, 1, ob), KS_ERR_STALE);
    assert_int_equal(cb.ops->summary(cb.self, params, &s), KS_OK);
    assert_int_equal(s.claimable, 1);
    ks_chunks_close(&ca);
    ks_chunks_close(&cb);
    ks_rowstore_close(&a);
    ks_rowstore_close(&b);
}

/* ---- takeover of a stalled worker ------------------------------------------------ */

#define STALL_ROWS 20000

/* The stalled run's progress: after its first batch, stall well past
 * the lease (a worker that stopped renewing). */
static void stall_progress(void *arg, const ks_workers_progress *p)
{
    int *stalled = arg;
    if (!*stalled && p->batch_rows > 0) {
        *stalled = 1;
        struct timespec nap = {3, 0};
        nanosleep(&nap, NULL);
    }
}

/* The stalled worker's run (a thread). */
typedef struct stall_run {
    world *w;
    ks_migrate_params p;
    ks_workers_result r;
    ks_err err;
    int stalled;
} stall_run;

/* One worker with a 1 s lease that stalls after its first batch. */
static void *stall_main(void *arg)
{
    stall_run *s = arg;
    ks_workers_options o = {.workers = 1, .chunk_ids = 2000, .lease_ms = 1000, .idle_ms = 100,
                            .owner = "stalled"};
    s->err = ks_migrate_run_workers(s->w->ctx, &s->p, &o, open_worker, NULL, NULL,
                                    stall_progress, &s->stalled, &s->r);
    return NULL;
}

/* A worker that stops renewing (stalled past its 1 s lease after its
 * first batch) has its chunk taken over by the other workers from its
 * last committed cursor; its next batch is rolled back (lost); nothing
 * is lost or done twice. */
static void test_takeover(void **state)
{
    world *w = *state;
    make_rows(w, STALL_ROWS);
    stall_run s = {.w = w, .p = rec_params(KS_MIGRATE_ENCRYPT, 200)};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, stall_main, &s), 0);
    for (int i = 0; i < 3000 && (admin_int(w, "SELECT count(*) FROM pg_catalog.pg_tables WHERE "
                                              "tablename = 'keyshift_chunk'") == 0 ||
                                 admin_int(w, "SELECT count(*) FROM keyshift_chunk WHERE cursor "
                                              "IS NOT NULL") == 0);
         i++) {
        struct timespec nap = {0, 20 * 1000000L};
        nanosleep(&nap, NULL);
    }
    ks_migrate_params p = rec_params(KS_MIGRATE_ENCRYPT, 200);
    ks_workers_options o = {.workers = 2, .lease_ms = 1000, .idle_ms = 100, .owner = "rescuer"};
    ks_workers_result r;
    assert_int_equal(ks_migrate_run_workers(w->ctx, &p, &o, open_worker, NULL, NULL, NULL, NULL,
                                            &r),
                     KS_OK);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_int_equal(s.err, KS_OK);
    assert_true(s.stalled);
    assert_int_equal(s.r.lost, 1);
    assert_true(r.takeovers >= 1);
    assert_int_equal(s.r.rows + r.rows, STALL_ROWS);
    check_chunks(w, &r);
    assert_true(admin_int(w, "SELECT max(claims) FROM keyshift_chunk") >= 2);
    check_rows(w, 1);
}

/* ---- kill -9 --------------------------------------------------------------------- */

#define KILL_ROWS 80000
#define KILLS 4

/* Workers for the kill and rerun runs. */
static ks_workers_options kill_options(void)
{
    return (ks_workers_options){.workers = 4, .chunk_ids = 5000, .lease_ms = 1000,
                                .idle_ms = 100};
}

/* Kill a process running 4 workers with SIGKILL at a random moment,
 * several times; a rerun then completes with every row done exactly once
 * and opening to its plaintext. */
static void test_kill9(void **state)
{
    world *w = *state;
    make_rows(w, KILL_ROWS);
    ks_migrate_params p = rec_params(KS_MIGRATE_ENCRYPT, 250);
    p.max_rows_per_second = 2000; /* per worker's chunk: the kills land mid-way */
    ks_workers_options o = kill_options();
    int killed = 0;
    for (int i = 0; i < KILLS; i++) {
        fflush(NULL);
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            ks_workers_result cr;
            ks_err e = ks_migrate_run_workers(w->ctx, &p, &o, open_worker, NULL, NULL, NULL,
                                              NULL, &cr);
            _exit(e == KS_OK ? 0 : 1);
        }
        long ms = 300 + (long)randombytes_uniform(1500);
        struct timespec nap = {ms / 1000, (ms % 1000) * 1000000L};
        nanosleep(&nap, NULL);
        kill(pid, SIGKILL);
        int st = 0;
        assert_int_equal(waitpid(pid, &st, 0), pid);
        killed += WIFSIGNALED(st);
        fprintf(stderr, "# kill %d after %ld ms: %lld chunks complete\n", i, ms,
                admin_int(w, "SELECT count(*) FROM keyshift_chunk WHERE state = 'complete'"));
    }
    assert_true(killed >= 1);
    ks_workers_result r;
    p.max_rows_per_second = 0;
    assert_int_equal(ks_migrate_run_workers(w->ctx, &p, &o, open_worker, NULL, NULL, NULL, NULL,
                                            &r),
                     KS_OK);
    fprintf(stderr, "# rerun: %llu rows, %llu claims, %llu takeovers\n",
            (unsigned long long)r.rows, (unsigned long long)r.claims,
            (unsigned long long)r.takeovers);
    check_chunks(w, &r);
    check_rows(w, 1);
}

/* ---- stop ------------------------------------------------------------------------ */

/* The stop flag of test_stop. */
static volatile sig_atomic_t g_stop;

/* Set the stop flag after the tenth batch of any worker. */
static void stop_progress(void *arg, const ks_workers_progress *p)
{
    (void)arg;
    if (p->batch_rows > 0 && p->rows >= 10 * 200)
        g_stop = 1;
}

/* Set by stop_early with g_stop, for the workers' gate (read on their
 * threads, hence atomic). */
static atomic_int g_hold;

/* Set the stop flag after the first batch (test_corrupt_chunk). */
static void stop_early(void *arg, const ks_workers_progress *p)
{
    (void)arg;
    if (p->batch_rows > 0) {
        atomic_store(&g_hold, 1);
        g_stop = 1;
    }
}

/* Hold every worker once the stop flag is set (test_corrupt_chunk's
 * gate): the calling thread reads the flag only every 50 ms, and a small
 * table could otherwise be done before it does. */
static int hold_when_stopped(void *arg, unsigned worker)
{
    (void)arg;
    (void)worker;
    return atomic_load(&g_hold);
}

/* Count the chunks listed (list callback of test_corrupt_chunk). */
static int count_chunk(void *arg, const ks_chunk *k)
{
    (void)k;
    (*(size_t *)arg)++;
    return 0;
}

/* The stop flag: every worker commits its batch, gives its chunk up
 * ("paused", no owner) and stops with KS_ERR_STOPPED; a rerun (another
 * process's workers would do the same) completes without waiting for a
 * lease. */
static void test_stop(void **state)
{
    world *w = *state;
    make_rows(w, STALL_ROWS);
    ks_migrate_params p = rec_params(KS_MIGRATE_ENCRYPT, 200);
    ks_workers_options o = {.workers = 3, .chunk_ids = 2000, .lease_ms = 600000};
    g_stop = 0;
    ks_workers_result r;
    assert_int_equal(ks_migrate_run_workers(w->ctx, &p, &o, open_worker, NULL, &g_stop,
                                            stop_progress, NULL, &r),
                     KS_ERR_STOPPED);
    assert_true(r.rows >= 10 * 200 && r.rows < STALL_ROWS);
    assert_int_equal(admin_int(w, "SELECT count(*) FROM keyshift_chunk WHERE owner IS NOT NULL"),
                     0);
    assert_true(admin_int(w, "SELECT count(*) FROM keyshift_chunk WHERE state = 'paused'") >= 1);
    /* the long lease would block a takeover: the rerun finds the chunks free */
    assert_int_equal(ks_migrate_run_workers(w->ctx, &p, &o, open_worker, NULL, NULL, NULL, NULL,
                                            &r),
                     KS_OK);
    check_chunks(w, &r);
    check_rows(w, 1);
}

/* A chunk row corrupted through SQL (as the table's types allow) reads
 * as KS_ERR_STORE, never as a value: a claim, the summary, the status
 * listing and a run of workers (whose CLI exit code KS_ERR_STORE maps
 * to EX_IOERR) refuse it; fixed, everything reads again. */
static void test_corrupt_chunk(void **state)
{
    world *w = *state;
    make_rows(w, 1000);
    ks_rowstore a;
    ks_chunks ca;
    assert_int_equal(open_worker(NULL, 0, &a, &ca), KS_OK);
    ks_bytes params = BV("test;params"), oa = BV("worker-a");
    uint64_t n = 0;
    assert_int_equal(ca.ops->plan(ca.self, params, 500, &n), KS_OK);
    assert_int_equal(n, 2);
    static const char *const bad[] = {
        "UPDATE keyshift_chunk SET state = 'bogus' WHERE chunk_id = 1",
        "UPDATE keyshift_chunk SET pass = 0 WHERE chunk_id = 1",
        "UPDATE keyshift_chunk SET done = -1 WHERE chunk_id = 1",
        "UPDATE keyshift_chunk SET cursor = hi + 1 WHERE chunk_id = 0",
        "UPDATE keyshift_chunk SET lo = hi + 1 WHERE chunk_id = 0",
        "UPDATE keyshift_chunk SET owner = 'x', lease_until = now() WHERE chunk_id = 1",
        "UPDATE keyshift_chunk SET owner = 'x', lease_until = NULL, state = 'running' WHERE chunk_id = 1",
        "UPDATE keyshift_chunk SET chunk_id = -1 WHERE chunk_id = 1",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        admin_exec(w, bad[i]);
        size_t seen = 0;
        assert_int_equal(ca.ops->list(ca.self, params, count_chunk, &seen), KS_ERR_STORE);
        admin_exec(w, "DELETE FROM keyshift_chunk"); /* a fresh plan for the next case */
        assert_int_equal(ca.ops->plan(ca.self, params, 500, &n), KS_OK);
        seen = 0;
        assert_int_equal(ca.ops->list(ca.self, params, count_chunk, &seen), KS_OK);
        assert_int_equal(seen, 2);
    }
    /* a claim reads the chunk it took: chunk 0 with a pass of 0 */
    admin_exec(w, "UPDATE keyshift_chunk SET pass = 0 WHERE chunk_id = 0");
    ks_chunk k;
    assert_int_equal(ca.ops->claim(ca.self, params, oa, 30000, &k), KS_ERR_STORE);
    ks_chunk_summary s;
    admin_exec(w, "UPDATE keyshift_chunk SET pass = 0");
    assert_int_equal(ca.ops->summary(ca.self, params, &s), KS_ERR_STORE); /* max(pass) 0 */
    admin_exec(w, "UPDATE keyshift_chunk SET pass = 1, done = -5");
    assert_int_equal(ca.ops->summary(ca.self, params, &s), KS_ERR_STORE); /* sum(done) < 0 */
    admin_exec(w, "UPDATE keyshift_chunk SET done = 0, owner = NULL, lease_until = NULL");
    assert_int_equal(ca.ops->summary(ca.self, params, &s), KS_OK);
    assert_int_equal(s.chunks, 2);
    assert_int_equal(s.claimable, 2);
    ks_chunks_close(&ca);
    ks_rowstore_close(&a);

    /* a run of workers over a migration whose chunk went bad stops with
     * KS_ERR_STORE */
    ks_migrate_params p = rec_params(KS_MIGRATE_ENCRYPT, 10);
    ks_workers_options o = {.workers = 2, .chunk_ids = 500, .lease_ms = 600000,
                            .gate = hold_when_stopped};
    ks_workers_result r;
    g_stop = 0;
    atomic_store(&g_hold, 0);
    assert_int_equal(ks_migrate_run_workers(w->ctx, &p, &o, open_worker, NULL, &g_stop,
                                            stop_early, NULL, &r),
                     KS_ERR_STOPPED);
    atomic_store(&g_hold, 0);
    assert_true(admin_int(w, "SELECT count(*) FROM keyshift_chunk WHERE state <> 'complete' "
                             "AND params <> 'test;params'") >= 1);
    admin_exec(w, "UPDATE keyshift_chunk SET pass = 0 WHERE state <> 'complete'");
    assert_int_equal(ks_migrate_run_workers(w->ctx, &p, &o, open_worker, NULL, NULL, NULL, NULL,
                                            &r),
                     KS_ERR_STORE);
    admin_exec(w, "UPDATE keyshift_chunk SET pass = 1, owner = NULL, lease_until = NULL, "
                  "state = 'paused' WHERE pass = 0");
    assert_int_equal(ks_migrate_run_workers(w->ctx, &p, &o, open_worker, NULL, NULL, NULL, NULL,
                                            &r),
                     KS_OK);
    check_rows(w, 1);
}

/* The workers' tests, one cluster for the group. */
int main(void)
{
#define T(f) cmocka_unit_test_setup_teardown(f, world_setup, world_teardown)
    const struct CMUnitTest tests[] = {
        T(test_lost_lease),
        T(test_corrupt_chunk),
        T(test_takeover),
        T(test_kill9),
        T(test_stop),
        T(test_converge),
    };
#undef T
    return cmocka_run_group_tests(tests, ks_pg_test_group_setup, ks_pg_test_group_teardown);
}
