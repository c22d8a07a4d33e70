/*
 * keyshift/workers.h -- N workers claiming key ranges of one migration
 * (docs/migration.md, "Workers and chunks on PostgreSQL").
 *
 * ks_migrate_run_workers runs n worker threads in this process, each on
 * a store connection and chunk coordinator of its own that the caller
 * opens (open_fn: the engine stays store-agnostic).  Each worker loops:
 * claim a chunk (keyshift/chunks.h), run the engine's batch loop over the
 * chunk's ids from its cursor -- every batch saving the chunk's cursor
 * and counts and renewing its lease in the batch's own transaction --
 * and claim the next, until every chunk of the migration is complete.
 * Several processes on several hosts calling it with the same parameters
 * on the same database add workers to the same migration: the chunk
 * table is the only coordination.  A chunk whose worker died is taken
 * over once its lease expires, from its last committed cursor; a worker
 * that loses its lease has its batch rolled back and moves on.
 */
#ifndef KEYSHIFT_WORKERS_H
#define KEYSHIFT_WORKERS_H

#include <signal.h>

#include <keyshift/chunks.h>
#include <keyshift/crypto.h>
#include <keyshift/migrate.h>
#include <keyshift/rowstore.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Defaults of ks_workers_options (a 0 field takes them). */
#define KS_WORKERS_LEASE_DEFAULT_MS 60000u
#define KS_WORKERS_IDLE_DEFAULT_MS 250u
#define KS_WORKERS_MAX 64u
#define KS_WORKERS_GATE_POLL_DEFAULT_MS 500u

/*
 * A gate (optional): asked by each worker before each claim and after
 * each committed batch -- on the worker's thread, outside any
 * transaction, with no row lock held, never under the driver's lock --
 * whether it may go on (0) or must wait (nonzero), e.g. while a
 * throttle query of the operator's is true.  A waiting worker sleeps
 * gate_poll_ms, renewing the lease of the chunk it holds (so that no
 * other worker takes a paused chunk over), and asks again, until the
 * gate opens or the run stops.  Workers call it concurrently: it must
 * be thread-safe, and return quickly (one query, say).
 */
typedef int (*ks_workers_gate_fn)(void *arg, unsigned worker);

/*
 * Open worker `worker`'s (0 .. n-1) store and its chunk coordinator
 * bound to it (e.g. ks_rowstore_pg_open then ks_chunks_pg_open); the
 * driver closes both (the coordinator first).  Any error but KS_OK ends
 * the call with that error before any work.  Called on the calling
 * thread, one worker after the other.
 */
typedef ks_err (*ks_worker_open_fn)(void *arg, unsigned worker, ks_rowstore *store,
                                    ks_chunks *chunks);

/* Options (NULL or all-zero: the defaults). */
typedef struct ks_workers_options {
    unsigned workers;    /* threads, 1 .. KS_WORKERS_MAX; 0: 1 */
    uint64_t chunk_ids;  /* ids per chunk at the plan (first call only); 0:
                            KS_CHUNK_IDS_DEFAULT */
    uint32_t lease_ms;   /* a claim's and a batch's lease; must exceed the time of one
                            batch (provider calls included); 0: KS_WORKERS_LEASE_DEFAULT_MS */
    uint32_t idle_ms;    /* the wait before claiming again while every chunk left is
                            leased by another worker; 0: KS_WORKERS_IDLE_DEFAULT_MS */
    const char *owner;   /* the prefix of the workers' owner names; NULL: host:pid.
                            Each worker adds ":<index>:<random>" */
    ks_workers_gate_fn gate; /* NULL: none (never waits) */
    void *gate_arg;
    uint32_t gate_poll_ms;   /* how often a waiting worker asks again; 0:
                                KS_WORKERS_GATE_POLL_DEFAULT_MS */
} ks_workers_options;

/* Progress, after every committed batch of any worker. */
typedef struct ks_workers_progress {
    unsigned worker;
    int64_t chunk;                   /* the chunk of the batch */
    const ks_checkpoint *chunk_cp;   /* its counts so far */
    uint64_t batch_rows;
    uint64_t rows;                   /* rows committed by this call's workers */
    uint64_t chunks_done;            /* chunks this call's workers completed */
    double elapsed_s;
    /* what this call's workers' batches added to their chunks' counts
     * so far (a takeover's earlier counts are not this call's) */
    uint64_t done, skipped, raced, quarantined, wrong_state;
    ks_bytes params;                 /* the migration's canonical parameters (its
                                        chunks' key: ks_chunks_ops.summary) */
} ks_workers_progress;

/* Called with the driver's lock held: one call at a time, never
 * concurrently; it must not block for long (its worker's lease runs). */
typedef void (*ks_workers_progress_fn)(void *arg, const ks_workers_progress *p);

/* What a call did, and the migration's chunks at its end. */
typedef struct ks_workers_result {
    ks_chunk_summary summary;  /* all the migration's chunks (every process's) */
    uint64_t rows;             /* rows in batches this call committed */
    uint64_t claims;           /* chunks this call claimed */
    uint64_t takeovers;        /* of which were resumed from another's cursor */
    uint64_t chunks_done;      /* chunks this call completed */
    uint64_t lost;             /* chunks lost to another worker's takeover (their
                                  batch in flight rolled back) */
    int already_complete;      /* the migration was complete before the call: nothing
                                  was run (a catch-up pass is ks_migrate_run's) */
} ks_workers_result;

/*
 * Run (or join, or resume) the migration params over the stores open_fn
 * opens, with opts->workers threads.  First, on worker 0's store: the
 * migration is settled as ks_migrate_run settles it (KS_ERR_MISMATCH,
 * params->supersede, the pinned primary; its checkpoint saved "running")
 * and the chunks are planned (idempotent).  A migration already complete
 * returns KS_OK at once, out->already_complete set (a catch-up pass is
 * ks_migrate_run's).  Then the
 * workers run until every chunk is complete: KS_OK, the migration's
 * checkpoint saved "complete" with the chunks' summed counts.
 * *stop nonzero (read by the calling thread only, every 50 ms while the
 * workers run; set it from a signal handler or a progress callback), or
 * a worker's failure: every worker commits its
 * current batch with its chunk "paused" (given up) and stops;
 * KS_ERR_STOPPED, or the first worker's error: KS_ERR_THRESHOLD (its
 * chunk's failure rate: the threshold applies per chunk), provider
 * errors, KS_ERR_BUSY, KS_ERR_UNAVAILABLE, KS_ERR_FULL, KS_ERR_STORE --
 * all resumable by calling again.  A lost lease is not an error.
 * *out (may be NULL) is filled in every case it can be.
 */
KS_API KS_WUR ks_err ks_migrate_run_workers(ks_ctx *ctx, const ks_migrate_params *params,
                                            const ks_workers_options *opts,
                                            ks_worker_open_fn open_fn, void *open_arg,
                                            volatile sig_atomic_t *stop,
                                            ks_workers_progress_fn progress, void *progress_arg,
                                            ks_workers_result *out);

#ifdef __cplusplus
}
#endif
#endif /* KEYSHIFT_WORKERS_H */
