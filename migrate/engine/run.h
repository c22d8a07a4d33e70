/*
 * migrate/engine/run.h -- the state of one ks_migrate_run call, shared by
 * the three files of the re-encryption engine: migrate.c (the run: its
 * identity and checkpoint, the batch loop, the writes and the public
 * entry points; its file comment is the engine's specification),
 * pipeline.c (reading a batch into engine memory, and the helper thread
 * that computes one batch while the previous one is written) and rows.c
 * (what to do with each row of a batch, and its new value, verified).
 * Not installed; hidden in the shared library like every internal symbol.
 */
#ifndef KS_MIGRATE_ENGINE_RUN_H
#define KS_MIGRATE_ENGINE_RUN_H

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <keyshift/migrate.h>
#include <keyshift/rowstore.h>

#include "engine.h"
#include "../alloc_hook.h" /* grow() below allocates */

/* What the engine does with one row of a batch. */
typedef enum action { ACT_NONE, ACT_SKIP, ACT_WRONG, ACT_QUARANTINE, ACT_WRITE } action;

/* The decision for one row of a batch.  The new value is at
 * batch.neu[new_off, new_off + new_len). */
typedef struct slot {
    size_t new_off, new_len;
    action act;
    const char *qerr; /* ACT_QUARANTINE: static error name */
} slot;

struct run;

/*
 * One batch in engine-owned memory: the scanned rows copied out of the
 * store (store views die at the next store call, and a batch outlives
 * several), the decisions, the new values and the plaintext buffers.
 * Two of them let one batch be computed on a helper thread while the
 * previous one is written (see "Pipeline" in migrate.c's file comment).
 */
typedef struct batch {
    struct run *r;
    ks_row *rows;     /* copies: every byte view points into keep */
    slot *slots;
    size_t n;         /* rows in the batch; 0 at the end of a pass */
    uint8_t *keep;    /* the rows' bytes (may hold plaintext: wiped after use) */
    size_t keep_cap, keep_len;
    uint8_t *neu;     /* new values, in the column's encoding */
    size_t neu_cap, neu_len;
    uint8_t *dec;     /* a base64 column: the row at hand's decoded envelope */
    size_t dec_cap;
    uint8_t *pt, *pt2; /* plaintext buffers, pt_cap each */
    size_t pt_cap;
    ks_err err;       /* the result of computing the batch */
    int running;      /* handed to the helper thread, not yet collected */
    int done;         /* the helper has computed it (under the run's lock) */
    double compute_s; /* how long computing it took */
} batch;

/*
 * The helper thread of a pipelined run: one per run, started with its
 * first batch and stopped by free_run, computing one batch at a time
 * (the loop never has two in flight).  A thread per batch cost a thread
 * creation and exit per batch (about 40 us each on the bench machine, 40
 * per 20,000 rows), and every new thread took a new slot of the context's
 * operation counters, so that after 63 batches every helper shared the
 * last one through atomic adds.
 */
typedef struct helper {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;  /* a job was handed over, a job is done, or quit */
    batch *job;         /* the batch to compute; NULL when idle */
    int up;             /* the thread was started (and must be joined) */
    int quit;
} helper;

/* The state of one ks_migrate_run call. */
typedef struct run {
    ks_ctx *ctx;
    const ks_rowstore *st;
    const ks_migrate_params *p;
    ks_context_tmpl *tmpl;
    uint32_t to_version;
    uint8_t format;
    uint32_t alg;
    size_t batch;      /* the most rows of a batch: what the buffers hold */
    ks_engine_batch_sizer own_sizer;
    ks_engine_batch_sizer *sizer; /* the next batch's size: own_sizer, or a worker's */
    size_t ask;        /* the rows the batch being read was asked for */
    char params[KS_PARAMS_MAX];
    size_t params_len;
    ks_row *rows;      /* the store's scan (views into the store) */
    /* the arguments of the store's cas_batch (NULL when it has none) */
    const ks_value **cas_ids, **cas_olds;
    ks_bytes *cas_news;
    int *cas_swapped;
    batch b[2];
    uint8_t *cur_buf;  /* the checkpoint cursor's bytes */
    size_t cur_cap;
    ks_checkpoint cp;  /* views into params / cur_buf / static strings */
    uint64_t pass_raced_start;
    uint64_t rows_this_run;
    ks_checkpoint base;    /* the counts when this call began (ks_migrate_counts) */
    ks_migrate_counts mine; /* auth_failed and the first batch's; the rest from base */
    int catchup;           /* rerun of a complete migration: a new pass that saves
                              nothing unless it has something to write */
    int catchup_wrote;     /* that pass has committed a batch */
    struct timespec t0;
    double commit_s;       /* how long the last batch's COMMIT took */
    double fetch_s;        /* how long reading the last batch took */
    double compute_s;      /* how long computing the last batch took */
    helper h;
    const ks_engine_slice *slice; /* a chunked run's chunk (workers.c), or NULL */
} run;

/* Nonzero when a and b hold the same bytes. */
static inline int bytes_eq(ks_bytes a, ks_bytes b)
{
    return a.len == b.len && (a.len == 0 || memcmp(a.ptr, b.ptr, a.len) == 0);
}

/* Seconds since t0 (monotonic). */
static inline double elapsed_s(const struct timespec *t0)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)(t.tv_sec - t0->tv_sec) + (double)(t.tv_nsec - t0->tv_nsec) / 1e9;
}

/* Make *buf at least need bytes (realloc; contents kept). */
static inline ks_err grow(uint8_t **buf, size_t *cap, size_t need)
{
    if (need <= *cap && *buf != NULL) {
        return KS_OK;
    }
    size_t ncap = *cap ? *cap : 4096;
    while (ncap < need) {
        ncap *= 2;
    }
    uint8_t *p = realloc(*buf, ncap);
    if (p == NULL) {
        return KS_ERR_NO_MEMORY;
    }
    *buf = p;
    *cap = ncap;
    return KS_OK;
}

/* ---- pipeline.c ---- */

/* Stop r's helper thread, if up, once it has finished its batch. */
void ks_engine_helper_stop(run *r);

/* Nonzero when the run computes batches ahead on a helper thread: unless
 * params->serial, and unless throttled. */
int ks_engine_pipelines(const run *r);

/* Start computing b: on the helper thread when pipelining (and the thread
 * is up), else here.  An empty batch (end of the pass) needs nothing. */
void ks_engine_start_batch(batch *b);

/* Wait for b to be computed; its result. */
ks_err ks_engine_finish_batch(batch *b);

/* Read the batch after `after` into b, every byte copied into b->keep
 * (b->n = 0 at the end of the pass). */
KS_WUR ks_err ks_engine_fetch_batch(run *r, const ks_value *after, batch *b);

/* ---- rows.c ---- */

/* Compute every row of b: what to do, and the new values, verified.
 * Touches only b, the run's read-only parameters and the ks_ctx (never
 * the store), so it may run on the helper thread. */
KS_WUR ks_err ks_engine_compute(batch *b);

#endif /* KS_MIGRATE_ENGINE_RUN_H */
