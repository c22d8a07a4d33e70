/*
 * migrate/engine/pipeline.c -- how the re-encryption engine gets a batch
 * ready: reading it from the store into engine-owned memory (every byte
 * copied, since store views die at the next store call and a batch
 * outlives several), and computing it, here or on the run's one helper
 * thread while the previous batch is written ("Pipeline" in migrate.c's
 * file comment; the run's state: run.h).
 */
#define _POSIX_C_SOURCE 200809L
#include <assert.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <sodium.h>

#include "engine.h"
#include "run.h"
#include "../alloc_hook.h"

/* The helper thread's body: compute each batch handed over, until told
 * to quit. */
static void *helper_main(void *arg)
{
    run *r = arg;
    helper *h = &r->h;
    pthread_mutex_lock(&h->mu);
    for (;;) {
        while (h->job == NULL && !h->quit) {
            pthread_cond_wait(&h->cv, &h->mu);
        }
        if (h->job == NULL) {
            break; /* quit, with nothing left to compute */
        }
        batch *b = h->job;
        pthread_mutex_unlock(&h->mu);
        b->err = ks_engine_compute(b);
        pthread_mutex_lock(&h->mu);
        b->done = 1;
        h->job = NULL;
        pthread_cond_broadcast(&h->cv);
    }
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

/* Start r's helper thread if it is not up; nonzero when it is. */
static int helper_start(run *r)
{
    helper *h = &r->h;
    if (h->up) {
        return 1;
    }
    if (pthread_mutex_init(&h->mu, NULL) != 0) {
        return 0;
    }
    if (pthread_cond_init(&h->cv, NULL) != 0) {
        pthread_mutex_destroy(&h->mu);
        return 0;
    }
    h->job = NULL;
    h->quit = 0;
    if (pthread_create(&h->thread, NULL, helper_main, r) != 0) {
        pthread_cond_destroy(&h->cv);
        pthread_mutex_destroy(&h->mu);
        return 0;
    }
    h->up = 1;
    return 1;
}

/* Stop r's helper thread, if up, once it has finished its batch. */
void ks_engine_helper_stop(run *r)
{
    helper *h = &r->h;
    if (!h->up) {
        return;
    }
    pthread_mutex_lock(&h->mu);
    h->quit = 1;
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
    pthread_join(h->thread, NULL);
    pthread_cond_destroy(&h->cv);
    pthread_mutex_destroy(&h->mu);
    h->up = 0;
}

/*
 * Nonzero when the run computes batches ahead on a helper thread: unless
 * params->serial, and unless throttled.  A throttled run sleeps between
 * batches anyway, and a batch scanned ahead would wait through that sleep
 * before its compare-and-swaps, widening the window in which the
 * application's writes make its rows race.
 */
int ks_engine_pipelines(const run *r)
{
    return !r->p->serial && r->p->max_rows_per_second == 0;
}

/* Start computing b: on the helper thread when pipelining (and the thread
 * is up), else here.  An empty batch (end of the pass) needs nothing. */
void ks_engine_start_batch(batch *b)
{
    run *r = b->r;
    b->err = KS_OK;
    if (b->n == 0) {
        return;
    }
    if (ks_engine_pipelines(r) && helper_start(r)) {
        pthread_mutex_lock(&r->h.mu);
        assert(r->h.job == NULL); /* one batch in flight at a time */
        b->done = 0;
        b->running = 1;
        r->h.job = b;
        pthread_cond_broadcast(&r->h.cv);
        pthread_mutex_unlock(&r->h.mu);
        return;
    }
    b->err = ks_engine_compute(b);
}

/* Wait for b to be computed; its result. */
ks_err ks_engine_finish_batch(batch *b)
{
    if (b->running) {
        helper *h = &b->r->h;
        pthread_mutex_lock(&h->mu);
        while (!b->done) {
            pthread_cond_wait(&h->cv, &h->mu);
        }
        pthread_mutex_unlock(&h->mu);
        b->running = 0;
    }
    return b->err;
}

/* Size of the bytes of v that a copy must hold. */
static size_t value_size(const ks_value *v)
{
    return v->type == KS_VALUE_TEXT || v->type == KS_VALUE_BLOB ? v->bytes.len : 0;
}

/* Copy the bytes of *v to keep + *off and park that offset in v (in
 * v->integer, unused for bytes: keep may still move as the batch grows);
 * value_fix turns it into a view once the batch is complete.  An empty
 * TEXT or BLOB gets a view of a static empty array (the store's view may
 * die with the call). */
static void value_park(ks_value *v, uint8_t *keep, size_t *off)
{
    static const uint8_t empty[1] = {0};
    size_t len = value_size(v);
    if (len == 0) {
        if (v->type == KS_VALUE_TEXT || v->type == KS_VALUE_BLOB) {
            v->bytes.ptr = empty;
        }
        return;
    }
    memcpy(keep + *off, v->bytes.ptr, len);
    v->bytes.ptr = NULL;
    v->integer = (int64_t)*off;
    *off += len;
}

/* Make b->keep at least need bytes, keeping its first keep_len.  It may
 * hold plaintext (encrypt mode), so a move copies it to a new block and
 * wipes the old one before freeing it (realloc would leave it unwiped). */
static ks_err grow_keep(batch *b, size_t need)
{
    if (need <= b->keep_cap && b->keep != NULL) {
        return KS_OK;
    }
    size_t ncap = b->keep_cap ? b->keep_cap : 4096;
    while (ncap < need) {
        ncap *= 2;
    }
    uint8_t *p = malloc(ncap);
    if (p == NULL) {
        return KS_ERR_NO_MEMORY;
    }
    if (b->keep != NULL) {
        memcpy(p, b->keep, b->keep_len);
        sodium_memzero(b->keep, b->keep_cap);
        free(b->keep);
    }
    b->keep = p;
    b->keep_cap = ncap;
    return KS_OK;
}

/* Point a value parked by value_park at its bytes in keep. */
static void value_fix(ks_value *v, uint8_t *keep)
{
    if (value_size(v) == 0) {
        return;
    }
    v->bytes.ptr = keep + (size_t)v->integer;
    v->integer = 0;
}

/*
 * Append row (views that die after this call) to b: the id, value,
 * tenant and context columns, every byte copied into b->keep (grown as
 * needed; offsets parked until fix_batch).  Also the visit_rows callback.
 */
static ks_err take_row(void *arg, const ks_row *row)
{
    batch *b = arg;
    if (b->n >= b->r->ask) {
        return KS_ERR_STORE; /* a store handing more rows than asked for */
    }
    size_t need = b->keep_len + value_size(&row->id) + value_size(&row->value) +
                  value_size(&row->tenant);
    for (size_t k = 0; k < KS_ROWSTORE_MAX_CONTEXT_COLUMNS; k++) {
        need += value_size(&row->context[k]);
    }
    ks_err err = grow_keep(b, need);
    if (err != KS_OK) {
        return err;
    }
    ks_row *c = &b->rows[b->n++];
    *c = *row;
    value_park(&c->id, b->keep, &b->keep_len);
    value_park(&c->value, b->keep, &b->keep_len);
    value_park(&c->tenant, b->keep, &b->keep_len);
    for (size_t k = 0; k < KS_ROWSTORE_MAX_CONTEXT_COLUMNS; k++) {
        value_park(&c->context[k], b->keep, &b->keep_len);
    }
    assert(b->keep_len == need);
    return KS_OK;
}

/* Turn every parked offset of b's rows into a view of b->keep. */
static void fix_batch(batch *b)
{
    for (size_t i = 0; i < b->n; i++) {
        ks_row *c = &b->rows[i];
        value_fix(&c->id, b->keep);
        value_fix(&c->value, b->keep);
        value_fix(&c->tenant, b->keep);
        for (size_t k = 0; k < KS_ROWSTORE_MAX_CONTEXT_COLUMNS; k++) {
            value_fix(&c->context[k], b->keep);
        }
    }
}

/*
 * Read the batch after `after` into b, every byte copied into b->keep
 * (b->n = 0 at the end of the pass).  Through the store's visit_rows when
 * it has one: each row copied once, straight from the store's row into
 * b; else through scan, whose copy in the store's buffer is copied again
 * (its views die at the next store call, and a batch outlives several).
 * A failed read may leave b partly filled: the caller never computes it.
 */
ks_err ks_engine_fetch_batch(run *r, const ks_value *after, batch *b)
{
    const ks_rowstore_ops *ops = r->st->ops;
    ks_err err = KS_OK;
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    b->n = 0;
    b->keep_len = 0;
    size_t want = r->sizer->size;
    assert(want >= 1 && want <= r->batch);
    r->ask = want;
    if (r->slice != NULL) {
        /* a chunk's pass starts right below its first id */
        int64_t lo = r->slice->lo;
        ks_value from = {KS_VALUE_INTEGER, lo == INT64_MIN ? lo : lo - 1, {NULL, 0}};
        ks_value upto = {KS_VALUE_INTEGER, r->slice->hi, {NULL, 0}};
        int at_start = after == NULL || after->type == KS_VALUE_NULL;
        const ks_value *a = !at_start ? after : lo == INT64_MIN ? NULL : &from;
        err = ops->visit_rows_range(r->st->self, a, &upto, want, take_row, b);
    } else if (ops->visit_rows != NULL) {
        err = ops->visit_rows(r->st->self, after, want, take_row, b);
    } else {
        size_t n = 0;
        err = ops->scan(r->st->self, after, want, r->rows, &n);
        assert(err != KS_OK || n <= want);
        for (size_t i = 0; i < n && err == KS_OK; i++) {
            err = take_row(b, &r->rows[i]);
        }
    }
    if (err == KS_OK) {
        fix_batch(b);
    }
    r->fetch_s = elapsed_s(&t0);
    return err;
}
