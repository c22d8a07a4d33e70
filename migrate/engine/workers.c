/*
 * migrate/engine/workers.c -- N workers claiming chunks of one migration
 * (keyshift/workers.h ks_migrate_run_workers).
 *
 * The driver opens every worker's store and chunk coordinator through
 * the caller's callback (the engine reaches databases only through
 * keyshift/rowstore.h and keyshift/chunks.h), settles the migration and
 * plans its chunks on worker 0's, then runs one thread per worker.  A
 * worker claims a chunk, runs the engine over it (ks_engine_run_slice:
 * the batches of ks_migrate_run within the chunk's ids, each batch's
 * checkpoint going to the chunk's row in the batch's transaction, with
 * the owner check that rolls back a batch whose lease another worker
 * took over) and claims the next.  When no chunk is claimable but some
 * are leased by other workers (of this process or another), it waits
 * idle_ms and claims again: a dead worker's chunk becomes claimable when
 * its lease expires.  The run ends when every chunk is complete, on a
 * stop, or on a worker's failure, which stops the others after their
 * current batch.
 *
 * Threads.  Each worker uses its own store and coordinator only; the
 * ks_ctx is shared (it is thread-safe, keyshift/crypto.h).  The shared
 * counts and the progress callback are under the driver's mutex; the
 * halt flag (atomic) is written by any worker and read by all, as a
 * stop flag.  Only the calling thread reads the caller's stop flag (as
 * in ks_migrate_run), every 50 ms while the workers run, and copies it
 * into the halt flag.
 *
 * Gate.  The caller's gate (ks_workers_options.gate) is asked by each
 * worker on its own thread, outside the driver's mutex and outside any
 * transaction: before each claim and after each committed batch (from
 * the engine's progress callback, which the engine calls after the
 * COMMIT).  While it says wait, the worker sleeps in short slices,
 * watching the halt flag, and renews the lease of the chunk it holds
 * every quarter of the lease, on its own coordinator.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <sodium.h>

#include <keyshift/workers.h>

#include "engine.h"
#include "../alloc_hook.h"

/* The longest owner name. */
#define OWNER_MAX 192

struct driver;

/* The counts a worker's batches add to the migration. */
typedef struct counts {
    uint64_t done, skipped, raced, quarantined, wrong_state;
} counts;

/* One worker: its store and coordinator, its name and its chunk. */
typedef struct worker {
    struct driver *d;
    unsigned index;
    ks_rowstore store;
    ks_chunks chunks;
    char owner[OWNER_MAX];
    int64_t chunk;          /* the chunk being run */
    int holding;            /* chunk is claimed by this worker (its lease to renew) */
    counts last;            /* the chunk's counts at its last report */
    ks_engine_batch_sizer sizer; /* its batch size, carried from chunk to chunk */
    ks_err err;             /* how the worker ended */
    pthread_t thread;
    int started;
} worker;

/* The state of one ks_migrate_run_workers call. */
typedef struct driver {
    ks_ctx *ctx;
    const ks_migrate_params *p;
    ks_engine_settled settled;
    ks_bytes params;        /* settled.params */
    uint32_t lease_ms, idle_ms;
    ks_workers_gate_fn gate; /* the caller's (NULL: none), its argument and poll */
    void *gate_arg;
    uint32_t gate_poll_ms;
    volatile sig_atomic_t *stop; /* the caller's: read by the calling thread only */
    atomic_int halt;        /* stop (the caller's stop seen, or a worker failed) */
    ks_workers_progress_fn progress;
    void *progress_arg;
    pthread_mutex_t mu;
    pthread_cond_t cv;     /* a worker ended */
    unsigned running;      /* workers not ended, under mu */
    ks_workers_result res; /* counts, under mu */
    counts added;          /* the workers' batches' counts, under mu */
    struct timespec t0;
    unsigned n;
    worker *w;
} driver;

/* Seconds since t0 (monotonic). */
static double since(const struct timespec *t0)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)(t.tv_sec - t0->tv_sec) + (double)(t.tv_nsec - t0->tv_nsec) / 1e9;
}

/* Sleep ms milliseconds (through signals). */
static void sleep_ms(uint32_t ms)
{
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* Nonzero once the caller asked to stop or a worker failed (the halt
 * flag: the calling thread copies the caller's stop flag into it, so
 * that only that thread reads the caller's flag). */
static int stopping(driver *d)
{
    return atomic_load_explicit(&d->halt, memory_order_relaxed) != 0;
}

/* Name worker w: the caller's prefix (or host:pid), its index and a
 * random tag, so that a restarted process never reuses a dead one's
 * name (its leases must expire, not be inherited). */
static void name_worker(worker *w, const char *prefix)
{
    char host[64] = "host";
    if (prefix == NULL) {
        (void)gethostname(host, sizeof host);
        host[sizeof host - 1] = '\0';
    }
    uint8_t tag[4];
    randombytes_buf(tag, sizeof tag);
    if (prefix != NULL) {
        snprintf(w->owner, sizeof w->owner, "%.128s:%u:%02x%02x%02x%02x", prefix, w->index,
                 tag[0], tag[1], tag[2], tag[3]);
    } else {
        snprintf(w->owner, sizeof w->owner, "%s:%ld:%u:%02x%02x%02x%02x", host, (long)getpid(),
                 w->index, tag[0], tag[1], tag[2], tag[3]);
    }
}

/* The worker's name as bytes. */
static ks_bytes owner_of(const worker *w)
{
    return (ks_bytes){(const uint8_t *)w->owner, strlen(w->owner)};
}

/* The engine's checkpoint save for the worker's chunk (ks_engine_save_fn):
 * inside the batch's transaction, with the owner check. */
static ks_err save_chunk(void *arg, const ks_checkpoint *cp)
{
    worker *w = arg;
    return w->chunks.ops->save(w->chunks.self, w->d->params, w->chunk, owner_of(w),
                               w->d->lease_ms, cp);
}

/* The counts of checkpoint cp. */
static counts counts_of(const ks_checkpoint *cp)
{
    return (counts){cp->done, cp->skipped, cp->raced, cp->quarantined, cp->wrong_state};
}

/* b - a, where a chunk's counts only grow (0 if one did not). */
static uint64_t grown(uint64_t a, uint64_t b)
{
    return b > a ? b - a : 0;
}

/* Add what the worker's chunk's counts grew by since its last report
 * (now) to the driver's sums; under the driver's mutex. */
static void add_growth(worker *w, const counts *now)
{
    counts *s = &w->d->added;
    s->done += grown(w->last.done, now->done);
    s->skipped += grown(w->last.skipped, now->skipped);
    s->raced += grown(w->last.raced, now->raced);
    s->quarantined += grown(w->last.quarantined, now->quarantined);
    s->wrong_state += grown(w->last.wrong_state, now->wrong_state);
    w->last = *now;
}

/* Sleep ms milliseconds in slices, returning early once the run stops. */
static void nap(driver *d, uint32_t ms)
{
    while (ms > 0 && !stopping(d)) {
        uint32_t slice = ms < 50 ? ms : 50;
        sleep_ms(slice);
        ms -= slice;
    }
}

/* While the caller's gate says wait (and the run goes on): sleep, and
 * keep the lease of the chunk w holds (a paused worker's chunk is not
 * another's to take over).  On w's thread, outside any transaction and
 * outside the driver's mutex. */
static void gate_wait(worker *w)
{
    driver *d = w->d;
    if (d->gate == NULL)
        return;
    uint32_t renew_every = d->lease_ms / 4 ? d->lease_ms / 4 : 1;
    uint32_t step = d->gate_poll_ms < renew_every ? d->gate_poll_ms : renew_every;
    uint32_t since_renew = 0, since_ask = 0;
    while (!stopping(d) && d->gate(d->gate_arg, w->index) != 0) {
        do {
            nap(d, step);
            since_renew += step;
            since_ask += step;
            if (w->holding && since_renew >= renew_every) {
                /* a failure shows at the next batch's save (stale, or the
                 * connection gone): nothing to do about it here */
                (void)w->chunks.ops->renew(w->chunks.self, d->params, w->chunk, owner_of(w),
                                           d->lease_ms);
                since_renew = 0;
            }
        } while (since_ask < d->gate_poll_ms && !stopping(d));
        since_ask = 0;
    }
}

/* The engine's progress callback (after a COMMIT, on w's thread): count
 * the batch and report it, then ask the gate. */
static void on_batch(void *arg, const ks_migrate_progress *pr)
{
    worker *w = arg;
    driver *d = w->d;
    counts now = counts_of(pr->checkpoint);
    pthread_mutex_lock(&d->mu);
    d->res.rows += pr->batch_rows;
    add_growth(w, &now);
    if (d->progress != NULL && pr->batch_rows > 0) {
        ks_workers_progress wp = {w->index,          w->chunk,
                                  pr->checkpoint,    pr->batch_rows,
                                  d->res.rows,       d->res.chunks_done,
                                  since(&d->t0),     d->added.done,
                                  d->added.skipped,  d->added.raced,
                                  d->added.quarantined, d->added.wrong_state,
                                  d->params};
        d->progress(d->progress_arg, &wp);
    }
    pthread_mutex_unlock(&d->mu);
    gate_wait(w);
}

/* Add one to a shared count. */
static void count(driver *d, uint64_t *c)
{
    pthread_mutex_lock(&d->mu);
    (*c)++;
    pthread_mutex_unlock(&d->mu);
}

/* Run the claimed chunk k to its end (or a stop or failure).  KS_OK when
 * the chunk is complete; KS_ERR_STALE when another worker took it over. */
static ks_err run_chunk(worker *w, const ks_chunk *k)
{
    driver *d = w->d;
    w->chunk = k->id;
    w->last = counts_of(&k->cp);
    w->holding = 1;
    ks_checkpoint start = k->cp; /* the engine copies its cursor before any other call */
    ks_engine_slice slice = {k->lo, k->hi, d->settled.to_version, &start, save_chunk, w, &d->halt,
                             &w->sizer};
    ks_err err = ks_engine_run_slice(d->ctx, &w->store, d->p, &slice, NULL, on_batch, w);
    w->holding = 0;
    return err;
}

/* Nonzero when every chunk is complete; sets *err on a failure to tell. */
static int all_complete(worker *w, ks_err *err)
{
    ks_chunk_summary s;
    *err = w->chunks.ops->summary(w->chunks.self, w->d->params, &s);
    return *err == KS_OK && s.complete == s.chunks;
}

/* A worker's thread: claim, run, repeat (see the file comment). */
static void *worker_main(void *arg)
{
    worker *w = arg;
    driver *d = w->d;
    ks_err err = KS_OK;
    while (err == KS_OK) {
        gate_wait(w); /* holding no chunk: nothing to renew */
        if (stopping(d)) {
            err = KS_ERR_STOPPED;
            break;
        }
        ks_chunk k;
        err = w->chunks.ops->claim(w->chunks.self, d->params, owner_of(w), d->lease_ms, &k);
        if (err == KS_ERR_NOT_FOUND) {
            if (all_complete(w, &err) || err != KS_OK)
                break;
            sleep_ms(d->idle_ms); /* the rest is leased: wait for it, or its expiry */
            continue;
        }
        if (err != KS_OK)
            break;
        count(d, &d->res.claims);
        if (k.cp.cursor.type != KS_VALUE_NULL || k.cp.pass > 1)
            count(d, &d->res.takeovers);
        err = run_chunk(w, &k);
        if (err == KS_OK) {
            count(d, &d->res.chunks_done);
        } else if (err == KS_ERR_STOPPED && !stopping(d)) {
            /* not a stop of ours: the store refused the batch (its write
             * gate, e.g. a rollout that left backfill), unwritten.  Give the
             * chunk up and stop the others too */
            (void)w->chunks.ops->release(w->chunks.self, d->params, w->chunk, owner_of(w));
            atomic_store_explicit(&d->halt, 1, memory_order_relaxed);
        } else if (err == KS_ERR_STALE) {
            count(d, &d->res.lost); /* its batch rolled back: the new owner redoes it */
            err = KS_OK;
        } else if (err != KS_ERR_STOPPED && err != KS_ERR_THRESHOLD) {
            /* the batch was lost: give the chunk up for the next claim (if the
             * connection is gone, its lease expires instead) */
            (void)w->chunks.ops->release(w->chunks.self, d->params, w->chunk, owner_of(w));
        }
    }
    if (err != KS_OK && err != KS_ERR_STOPPED)
        atomic_store_explicit(&d->halt, 1, memory_order_relaxed);
    w->err = err;
    pthread_mutex_lock(&d->mu);
    d->running--;
    pthread_cond_broadcast(&d->cv);
    pthread_mutex_unlock(&d->mu);
    return NULL;
}

/* Open every worker's store and coordinator. */
static ks_err open_all(driver *d, ks_worker_open_fn open_fn, void *open_arg)
{
    for (unsigned i = 0; i < d->n; i++) {
        worker *w = &d->w[i];
        ks_err err = open_fn(open_arg, i, &w->store, &w->chunks);
        if (err == KS_OK && (w->store.ops == NULL || w->chunks.ops == NULL))
            err = KS_ERR_INVALID_ARGUMENT;
        if (err != KS_OK)
            return err;
    }
    return KS_OK;
}

/* Close every worker's coordinator, then its store. */
static void close_all(driver *d)
{
    for (unsigned i = 0; i < d->n; i++) {
        ks_chunks_close(&d->w[i].chunks);
        ks_rowstore_close(&d->w[i].store);
    }
}

/* Until every worker has ended: every 50 ms, copy the caller's stop
 * flag into the halt flag the workers read. */
static void watch(driver *d)
{
    pthread_mutex_lock(&d->mu);
    while (d->running > 0) {
        if (d->stop != NULL && *d->stop != 0)
            atomic_store_explicit(&d->halt, 1, memory_order_relaxed);
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += 50 * 1000000L;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        (void)pthread_cond_timedwait(&d->cv, &d->mu, &until);
    }
    pthread_mutex_unlock(&d->mu);
}

/* Run the worker threads and collect the first failure (a stop last). */
static ks_err run_all(driver *d)
{
    ks_err err = KS_OK;
    for (unsigned i = 0; i < d->n; i++) {
        worker *w = &d->w[i];
        pthread_mutex_lock(&d->mu);
        d->running++;
        pthread_mutex_unlock(&d->mu);
        w->started = pthread_create(&w->thread, NULL, worker_main, w) == 0;
        if (!w->started) {
            pthread_mutex_lock(&d->mu);
            d->running--;
            pthread_mutex_unlock(&d->mu);
            atomic_store_explicit(&d->halt, 1, memory_order_relaxed);
            err = KS_ERR_NO_MEMORY;
            break;
        }
    }
    watch(d);
    for (unsigned i = 0; i < d->n; i++) {
        worker *w = &d->w[i];
        if (!w->started)
            continue;
        pthread_join(w->thread, NULL);
        if (err == KS_OK || err == KS_ERR_STOPPED)
            err = w->err == KS_OK ? err : w->err;
    }
    return err;
}

/* Once every chunk is complete: save the migration's checkpoint
 * "complete" with the chunks' counts, on worker 0's store. */
static ks_err finish(driver *d, const ks_chunk_summary *s)
{
    int64_t now = (int64_t)time(NULL);
    ks_checkpoint cp = {.params = d->params,
                        .state = {(const uint8_t *)"complete", 8},
                        .cursor = {KS_VALUE_NULL, 0, {NULL, 0}},
                        .pass = s->max_pass ? s->max_pass : 1,
                        .done = s->done,
                        .skipped = s->skipped,
                        .raced = s->raced,
                        .quarantined = s->quarantined,
                        .wrong_state = s->wrong_state,
                        .started = d->settled.started,
                        .updated = now,
                        .finished = now};
    return ks_engine_save_alone(&d->w[0].store, &cp);
}

/* Settle, plan, run and finish (the driver's storage is the caller's). */
static ks_err drive(driver *d, uint64_t chunk_ids)
{
    worker *w0 = &d->w[0];
    ks_err err = ks_engine_settle(d->ctx, &w0->store, d->p, &d->settled);
    if (err != KS_OK)
        return err;
    d->params = (ks_bytes){(const uint8_t *)d->settled.params, d->settled.params_len};
    if (d->settled.complete) { /* nothing to do: the chunks as they are (none, after a single run) */
        d->res.already_complete = 1;
        return w0->chunks.ops->summary(w0->chunks.self, d->params, &d->res.summary);
    }
    uint64_t n = 0;
    err = w0->chunks.ops->plan(w0->chunks.self, d->params, chunk_ids, &n);
    if (err == KS_OK)
        err = run_all(d);
    ks_err serr = w0->chunks.ops->summary(w0->chunks.self, d->params, &d->res.summary);
    if (err == KS_OK)
        err = serr;
    if (err == KS_OK && d->res.summary.complete == d->res.summary.chunks)
        err = finish(d, &d->res.summary);
    return err;
}

/* See keyshift/workers.h and the file comment. */
ks_err ks_migrate_run_workers(ks_ctx *ctx, const ks_migrate_params *params,
                              const ks_workers_options *opts, ks_worker_open_fn open_fn,
                              void *open_arg, volatile sig_atomic_t *stop,
                              ks_workers_progress_fn progress, void *progress_arg,
                              ks_workers_result *out)
{
    ks_workers_options o = opts != NULL ? *opts : (ks_workers_options){0};
    if (out != NULL)
        memset(out, 0, sizeof *out);
    if (ctx == NULL || params == NULL || open_fn == NULL || o.workers > KS_WORKERS_MAX ||
        !ks_engine_batch_params_ok(params))
        return KS_ERR_INVALID_ARGUMENT;
    if (sodium_init() < 0)
        return KS_ERR_CRYPTO_INIT;
    driver *d = calloc(1, sizeof *d);
    if (d == NULL)
        return KS_ERR_NO_MEMORY;
    atomic_init(&d->halt, 0);
    d->ctx = ctx;
    d->p = params;
    d->n = o.workers ? o.workers : 1;
    d->lease_ms = o.lease_ms ? o.lease_ms : KS_WORKERS_LEASE_DEFAULT_MS;
    d->idle_ms = o.idle_ms ? o.idle_ms : KS_WORKERS_IDLE_DEFAULT_MS;
    d->gate = o.gate;
    d->gate_arg = o.gate_arg;
    d->gate_poll_ms = o.gate_poll_ms ? o.gate_poll_ms : KS_WORKERS_GATE_POLL_DEFAULT_MS;
    d->stop = stop;
    d->progress = progress;
    d->progress_arg = progress_arg;
    clock_gettime(CLOCK_MONOTONIC, &d->t0);
    d->w = calloc(d->n, sizeof *d->w);
    if (d->w == NULL || pthread_mutex_init(&d->mu, NULL) != 0) {
        free(d->w);
        free(d);
        return KS_ERR_NO_MEMORY;
    }
    if (pthread_cond_init(&d->cv, NULL) != 0) {
        pthread_mutex_destroy(&d->mu);
        free(d->w);
        free(d);
        return KS_ERR_NO_MEMORY;
    }
    for (unsigned i = 0; i < d->n; i++) {
        d->w[i].d = d;
        d->w[i].index = i;
        ks_engine_batch_init(&d->w[i].sizer, params);
        name_worker(&d->w[i], o.owner);
    }
    ks_err err = open_all(d, open_fn, open_arg);
    if (err == KS_OK)
        err = drive(d, o.chunk_ids);
    close_all(d);
    if (out != NULL)
        *out = d->res;
    pthread_cond_destroy(&d->cv);
    pthread_mutex_destroy(&d->mu);
    free(d->w);
    free(d);
    return err;
}
