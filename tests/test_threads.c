/*
 * tests/test_threads.c -- a ks_ctx shared by many threads: the per-thread
 * shards (migrate/crypto/shard.h), the thread indices they hang on
 * (thread_index.h) and the DEK budgets that blocks of nonces are carved
 * from (dek_writer.h, docs/format.md [F-CRYPTO-NONCE-1..3]).
 *
 * What must hold whatever the threads do: no (DEK, nonce) pair repeats;
 * a DEK seals at most max_messages messages, and at most max_bytes bytes
 * plus the one message that crosses the limit; every envelope opens;
 * every seal and open is counted; more threads than thread indices still
 * work (on the shared, locked paths); and an exiting thread's index is
 * handed to the next thread.
 */
#define _POSIX_C_SOURCE 200809L /* pthread barriers */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <pthread.h>
#include <sodium.h>

#include <keyshift/crypto.h>
#include <keyshift/envelope.h>

#include "../migrate/crypto/thread_index.h"
#include "mem_provider.h"

#define KEY "app-key"
#define BV(s) ((ks_bytes){(const uint8_t *)(s), sizeof(s) - 1})

enum { ENV_CAP = 1024, MSG_MAX = 200 };

/* One envelope as the checks see it: a hash of its wrapped DEK (which
 * names the DEK), its nonce, and its plaintext length. */
typedef struct sealed_rec {
    uint8_t dek[16];
    uint8_t nonce[KS_XCHACHA20POLY1305_NONCE_LEN];
    size_t pt_len;
} sealed_rec;

/* A provider and a context over it. */
typedef struct world {
    ks_mem_provider mem;
    ks_ctx *ctx;
} world;

/* A world whose context has cfg (NULL: the defaults). */
static world *world_new(const ks_ctx_config *cfg)
{
    world *w = calloc(1, sizeof *w);
    assert_non_null(w);
    ks_mem_init(&w->mem);
    assert_int_equal(ks_mem_add(&w->mem, KEY, 1, 1, NULL), 0);
    ks_provider prov = ks_mem_provider_of(&w->mem);
    assert_int_equal(ks_ctx_new(&prov, cfg, &w->ctx), KS_OK);
    return w;
}

/* Free the context, then the provider. */
static void world_free(world *w)
{
    ks_ctx_free(w->ctx);
    ks_mem_cleanup(&w->mem);
    free(w);
}

/* Format 2 xchacha20-poly1305 parameters of the tests. */
static ks_seal_params params(void)
{
    return (ks_seal_params){KS_FORMAT_V2, KS_ALG_XCHACHA20POLY1305, BV("acme"), BV(KEY), 0,
                            BV("card"), BV("row:42")};
}

/* What one worker thread does: its thread index into index, then n seals
 * of messages of 0 .. MSG_MAX - 1 bytes (by its seed), each opened back,
 * recorded into out[0, n).  The barrier, when set, holds every worker
 * until all have taken their index, so that they hold them at once. */
typedef struct worker {
    ks_ctx *ctx;
    pthread_barrier_t *barrier;
    sealed_rec *out;
    size_t n;
    unsigned seed;
    uint32_t index;
    int failed;
} worker;

/* Record env (len bytes) of a pt_len-byte message into r. */
static int record(const uint8_t *env, size_t len, size_t pt_len, sealed_rec *r)
{
    ks_envelope e;
    if (ks_envelope_parse(env, len, NULL, &e, NULL) != KS_OK) {
        return -1;
    }
    memset(r, 0, sizeof *r);
    crypto_generichash(r->dek, sizeof r->dek, e.wrapped_dek.ptr, e.wrapped_dek.len, NULL, 0);
    memcpy(r->nonce, e.nonce.ptr, e.nonce.len);
    r->pt_len = pt_len;
    return 0;
}

/* Thread body of a worker (see worker). */
static void *work(void *arg)
{
    worker *wk = arg;
    uint8_t pt[MSG_MAX], out[MSG_MAX], env[ENV_CAP];
    const ks_seal_params p = params();
    const ks_open_params o = {BV("row:42"), BV("acme"), BV("card")};
    wk->index = ks_thread_index(); /* before the barrier: no worker has exited yet */
    if (wk->barrier != NULL) {
        (void)pthread_barrier_wait(wk->barrier);
    }
    memset(pt, (int)wk->seed, sizeof pt);
    for (size_t i = 0; i < wk->n; i++) {
        size_t pt_len = (wk->seed * 31u + i * 17u) % MSG_MAX, len = 0, n = 0;
        if (ks_seal(wk->ctx, &p, pt, pt_len, env, sizeof env, &len) != KS_OK ||
            ks_open(wk->ctx, env, len, &o, out, sizeof out, &n, NULL) != KS_OK || n != pt_len ||
            memcmp(out, pt, n) != 0 || record(env, len, pt_len, &wk->out[i]) != 0) {
            wk->failed = 1;
            return NULL;
        }
    }
    return NULL;
}

/* Run `threads` workers of `per` seals each on ctx, all alive at once;
 * their records go to recs[threads * per], their indices to idx[]. */
static void run_workers(ks_ctx *ctx, size_t threads, size_t per, sealed_rec *recs, uint32_t *idx)
{
    pthread_t *th = calloc(threads, sizeof *th);
    worker *wk = calloc(threads, sizeof *wk);
    pthread_barrier_t barrier;
    assert_true(th != NULL && wk != NULL);
    assert_int_equal(pthread_barrier_init(&barrier, NULL, (unsigned)threads), 0);
    for (size_t i = 0; i < threads; i++) {
        wk[i] = (worker){ctx, &barrier, recs + i * per, per, (unsigned)i + 1, 0, 0};
        assert_int_equal(pthread_create(&th[i], NULL, work, &wk[i]), 0);
    }
    for (size_t i = 0; i < threads; i++) {
        assert_int_equal(pthread_join(th[i], NULL), 0);
        assert_false(wk[i].failed);
        if (idx != NULL) {
            idx[i] = wk[i].index;
        }
    }
    pthread_barrier_destroy(&barrier);
    free(wk);
    free(th);
}

/* Compare records by DEK, then nonce. */
static int rec_cmp(const void *a, const void *b)
{
    const sealed_rec *x = a, *y = b;
    int c = memcmp(x->dek, y->dek, sizeof x->dek);
    return c != 0 ? c : memcmp(x->nonce, y->nonce, sizeof x->nonce);
}

/* Sort recs[0, n) and check [F-CRYPTO-NONCE-1] and the DEK budgets: no
 * (DEK, nonce) repeats; each DEK sealed at most max_messages messages and
 * at most max_bytes bytes plus its largest message. */
static void check_budgets(sealed_rec *recs, size_t n, uint64_t max_messages, uint64_t max_bytes)
{
    qsort(recs, n, sizeof *recs, rec_cmp);
    size_t i = 0;
    while (i < n) {
        size_t j = i, bytes = 0, largest = 0;
        for (; j < n && memcmp(recs[j].dek, recs[i].dek, sizeof recs[i].dek) == 0; j++) {
            if (j > i) {
                assert_true(rec_cmp(&recs[j - 1], &recs[j]) != 0); /* the nonce differs */
            }
            bytes += recs[j].pt_len;
            largest = recs[j].pt_len > largest ? recs[j].pt_len : largest;
        }
        assert_true(j - i <= max_messages);
        assert_true(bytes <= max_bytes + largest);
        i = j;
    }
}

/* More threads alive at once than there are thread indices: those past
 * the indices share one and take the locked paths; nothing repeats, every
 * envelope opens, every operation is counted, and timed once in the
 * latency histograms (kept per thread index, summed by the sample). */
static void test_more_threads_than_indices(void **state)
{
    (void)state;
    enum { THREADS = KS_THREAD_SLOTS + 9, PER = 60 };
    ks_ctx_config cfg;
    ks_ctx_config_default(&cfg);
    cfg.dek_max_messages = 301; /* rotate under contention too */
    cfg.latency_histograms = 1;
    world *w = world_new(&cfg);
    sealed_rec *recs = calloc(THREADS * PER, sizeof *recs);
    uint32_t idx[THREADS];
    assert_non_null(recs);
    run_workers(w->ctx, THREADS, PER, recs, idx);
    /* Owned indices are unique among live threads; the rest share one. */
    unsigned shared = 0;
    for (size_t i = 0; i < THREADS; i++) {
        if (idx[i] == KS_THREAD_SHARED) {
            shared++;
            continue;
        }
        assert_true(idx[i] < KS_THREAD_SLOTS);
        for (size_t j = 0; j < i; j++) {
            assert_true(idx[j] != idx[i]);
        }
    }
    assert_true(shared >= THREADS - KS_THREAD_SLOTS);
    check_budgets(recs, THREADS * PER, cfg.dek_max_messages, cfg.dek_max_bytes);
    ks_metrics m;
    ks_ctx_metrics(w->ctx, &m);
    assert_int_equal(m.seals, THREADS * PER);
    assert_int_equal(m.opens, THREADS * PER);
    assert_int_equal(m.cache_hits + m.cache_misses, THREADS * PER);
    assert_int_equal(m.auth_failures, 0);
    assert_int_equal(m.wraps, m.deks_created);
    ks_health_sample hs;
    ks_ctx_health_sample(w->ctx, &hs);
    uint64_t timed_seals = 0, timed_opens = 0;
    for (size_t i = 0; i < KS_HIST_BUCKETS; i++) {
        timed_seals += hs.seal_ns.bucket[i];
        timed_opens += hs.open_ns.bucket[i];
    }
    assert_int_equal(timed_seals, THREADS * PER);
    assert_int_equal(timed_opens, THREADS * PER);
    assert_true(hs.seal_ns_sum > 0 && hs.open_ns_sum > 0);
    free(recs);
    world_free(w);
}

/* Thread body: record this thread's index. */
static void *index_of_thread(void *arg)
{
    *(uint32_t *)arg = ks_thread_index();
    return NULL;
}

/* An exiting thread gives its index back: many more threads than indices,
 * one after another, all own one. */
static void test_index_reuse(void **state)
{
    (void)state;
    for (size_t i = 0; i < 4 * KS_THREAD_SLOTS; i++) {
        pthread_t th;
        uint32_t idx = KS_THREAD_SHARED;
        assert_int_equal(pthread_create(&th, NULL, index_of_thread, &idx), 0);
        assert_int_equal(pthread_join(th, NULL), 0);
        assert_true(idx < KS_THREAD_SLOTS);
    }
}

/* Threads seal through one DEK at a time, each from blocks it reserved:
 * the DEK limits hold over all of them, for messages and for bytes. */
static void test_budgets_across_threads(void **state)
{
    (void)state;
    enum { THREADS = 4, PER = 3000 };
    static const struct {
        uint64_t messages, bytes;
    } limits[] = {{1, (uint64_t)1 << 36}, {7, (uint64_t)1 << 36}, {1000, (uint64_t)1 << 36},
                  {(uint64_t)1 << 24, 5000}, {(uint64_t)1 << 24, 64 * 1024}, {50, 3000}};
    for (size_t k = 0; k < sizeof limits / sizeof limits[0]; k++) {
        ks_ctx_config cfg;
        ks_ctx_config_default(&cfg);
        cfg.dek_max_messages = limits[k].messages;
        cfg.dek_max_bytes = limits[k].bytes;
        world *w = world_new(&cfg);
        sealed_rec *recs = calloc(THREADS * PER, sizeof *recs);
        assert_non_null(recs);
        run_workers(w->ctx, THREADS, PER, recs, NULL);
        check_budgets(recs, THREADS * PER, cfg.dek_max_messages, cfg.dek_max_bytes);
        free(recs);
        world_free(w);
    }
}

/* One thread alone keeps the single-threaded accounting exactly: a DEK of
 * max_bytes 100 seals 60 + 60 bytes (the second crosses the limit), then
 * retires; one of max_messages 3 seals exactly 3. */
static void test_budgets_one_thread(void **state)
{
    (void)state;
    static const uint8_t pt[60];
    uint8_t env[ENV_CAP];
    sealed_rec r[7];
    const ks_seal_params p = params();
    ks_ctx_config cfg;
    ks_ctx_config_default(&cfg);
    cfg.dek_max_bytes = 100;
    world *w = world_new(&cfg);
    for (size_t i = 0; i < 5; i++) {
        size_t len = 0;
        assert_int_equal(ks_seal(w->ctx, &p, pt, sizeof pt, env, sizeof env, &len), KS_OK);
        assert_int_equal(record(env, len, sizeof pt, &r[i]), 0);
    }
    assert_memory_equal(r[0].dek, r[1].dek, sizeof r[0].dek);
    assert_memory_not_equal(r[1].dek, r[2].dek, sizeof r[0].dek);
    assert_memory_equal(r[2].dek, r[3].dek, sizeof r[0].dek);
    assert_memory_not_equal(r[3].dek, r[4].dek, sizeof r[0].dek);
    world_free(w);
    ks_ctx_config_default(&cfg);
    cfg.dek_max_messages = 3;
    w = world_new(&cfg);
    for (size_t i = 0; i < 7; i++) {
        size_t len = 0;
        assert_int_equal(ks_seal(w->ctx, &p, pt, 1, env, sizeof env, &len), KS_OK);
        assert_int_equal(record(env, len, 1, &r[i]), 0);
    }
    for (size_t i = 1; i < 7; i++) {
        if (i % 3 == 0) {
            assert_memory_not_equal(r[i - 1].dek, r[i].dek, sizeof r[0].dek);
        } else {
            assert_memory_equal(r[i - 1].dek, r[i].dek, sizeof r[0].dek);
        }
    }
    ks_metrics m;
    ks_ctx_metrics(w->ctx, &m);
    assert_int_equal(m.deks_created, 3);
    world_free(w);
}

int main(void)
{
    if (sodium_init() < 0) {
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_more_threads_than_indices),
        cmocka_unit_test(test_index_reuse),
        cmocka_unit_test(test_budgets_across_threads),
        cmocka_unit_test(test_budgets_one_thread),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
