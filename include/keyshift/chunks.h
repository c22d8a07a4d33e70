/*
 * keyshift/chunks.h -- the narrow interface through which N workers on N
 * hosts share one migration by key ranges (docs/migration.md, "Workers
 * and chunks on PostgreSQL").
 *
 * The id range of the target is split once into chunks of about K ids
 * (plan), recorded in a table of the database beside the data.  A worker
 * claims a chunk in a short transaction of its own (claim: one that is
 * not complete and whose lease is free or expired, skipping those another
 * claimer has locked), holding a lease that the database's clock times,
 * and migrates the ids [lo, hi] of the chunk from its cursor.  Each batch
 * saves the chunk's cursor and counts in the store's own batch
 * transaction (save), with an owner check in the same statement: a worker
 * whose lease another took over has its whole batch rolled back, so a
 * row is never done twice and never skipped.  A chunk whose worker died
 * (its lease expired) is claimed again and resumed from its last
 * committed cursor.  The chunk table is the only coordination: workers
 * of several processes on several hosts join the same migration by using
 * the same parameters.
 *
 * A chunk coordinator is bound to one row store (ks_chunks_pg_open,
 * keyshift/chunks_pg.h): it runs its statements on that store's
 * connection, so that save is inside the store's transaction.  It is
 * used by the thread that uses its store, one at a time, and must be
 * closed before the store.
 *
 * Parameters.  params is the migration's canonical parameter string (the
 * params of its ks_checkpoint): chunks of different migrations of the
 * same column never mix.  owner names one worker (e.g. host, process,
 * thread, a random tag): a claim, renew, save or release by another name
 * is another worker's.  lease_ms is how long a claim or a save keeps the
 * chunk, by the database's clock (hosts' clocks do not matter).
 *
 * Lifetimes.  The views of a ks_chunk (state, owner, cursor) stay valid
 * until the next call of any operation of the same coordinator; the
 * views passed to a list callback, only during that call.  params stays
 * the caller's.
 *
 * Errors.  KS_ERR_NOT_FOUND from claim: no chunk is claimable now (all
 * complete, or the others leased: see summary).  KS_ERR_STALE from
 * renew, save or release: the chunk is not (or no longer) the owner's --
 * its lease expired and another worker took it over, or it is complete;
 * save then has rolled the store's transaction back.  Database failures
 * as the store maps them (KS_ERR_BUSY, KS_ERR_UNAVAILABLE, KS_ERR_FULL,
 * KS_ERR_STORE); inside the store's transaction they roll it back too.
 */
#ifndef KEYSHIFT_CHUNKS_H
#define KEYSHIFT_CHUNKS_H

#include <keyshift/common.h>
#include <keyshift/error.h>
#include <keyshift/rowstore.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The default ids per chunk (ks_chunks_ops.plan with 0). */
#define KS_CHUNK_IDS_DEFAULT 10000u
/* The most chunks one plan makes: a sparser id range gets wider chunks. */
#define KS_CHUNKS_MAX 100000u

/* One chunk as the coordinator read it. */
typedef struct ks_chunk {
    int64_t id;          /* 0, 1, ...: the chunk's number in its plan */
    int64_t lo, hi;      /* the ids it covers, inclusive (the first chunk starts at
                            INT64_MIN, the last ends at INT64_MAX: rows inserted
                            later below or above the planned range are covered) */
    ks_checkpoint cp;    /* params (the caller's), state ("pending", "running",
                            "paused", "stopped", "complete"), cursor (last id done in
                            the chunk's pass; NULL before its first batch), pass and
                            the counts, as the engine saved them; started, updated and
                            finished are 0 */
    ks_bytes owner;      /* the worker holding it; empty when none */
    int64_t lease_until_ms; /* Unix milliseconds by the database's clock; 0: none */
    int lease_live;      /* nonzero when the lease had not expired when read */
} ks_chunk;

/* A migration's chunks, summed. */
typedef struct ks_chunk_summary {
    uint64_t chunks;     /* planned */
    uint64_t complete;
    uint64_t leased;     /* not complete, with a live lease: a worker has it */
    uint64_t claimable;  /* not complete, no live lease: the next claims' */
    uint64_t done, skipped, raced, quarantined, wrong_state; /* sums of the chunks' */
    uint32_t max_pass;
} ks_chunk_summary;

/* The callback of ks_chunks_ops.list; return nonzero to stop. */
typedef int (*ks_chunk_list_fn)(void *arg, const ks_chunk *chunk);

typedef struct ks_chunks_ops {
    /* Split the target's ids [min, max] into chunks of about chunk_ids
     * ids (0: KS_CHUNK_IDS_DEFAULT; wider when it would make more than
     * KS_CHUNKS_MAX), all "pending", in one transaction of its own --
     * unless params already has chunks, which are kept (idempotent: every
     * worker of every process may call it; the first plan wins).  *n is
     * the number of chunks of params.  Not inside the store's
     * transaction (KS_ERR_INVALID_ARGUMENT). */
    ks_err (*plan)(void *self, ks_bytes params, uint64_t chunk_ids, uint64_t *n);
    /* Claim the first chunk of params that is not complete and whose
     * lease is free or expired, skipping chunks locked by concurrent
     * claims (FOR UPDATE SKIP LOCKED), in one short transaction: owner
     * and a lease of lease_ms are set, *out is the chunk after the claim.
     * KS_ERR_NOT_FOUND when none.  Not inside the store's transaction. */
    ks_err (*claim)(void *self, ks_bytes params, ks_bytes owner, uint32_t lease_ms,
                    ks_chunk *out);
    /* Extend owner's lease on chunk to lease_ms from now, in a short
     * transaction; KS_ERR_STALE when owner does not hold it. */
    ks_err (*renew)(void *self, ks_bytes params, int64_t chunk, ks_bytes owner,
                    uint32_t lease_ms);
    /* Inside the store's write transaction (after its compare-and-swaps,
     * before its COMMIT): save cp's state, cursor, pass and counts as the
     * chunk's, only if owner holds it (the same UPDATE checks the owner).
     * State "running" renews the lease by lease_ms; any other state ends
     * it (owner cleared): "complete" marks the chunk done, "paused" and
     * "stopped" leave it for the next claim.  KS_ERR_STALE (the store's
     * transaction rolled back) when owner does not hold it. */
    ks_err (*save)(void *self, ks_bytes params, int64_t chunk, ks_bytes owner,
                   uint32_t lease_ms, const ks_checkpoint *cp);
    /* Give chunk up (owner and lease cleared, cursor and counts kept) in
     * a short transaction, e.g. after a failure that lost the batch;
     * KS_ERR_STALE when owner does not hold it. */
    ks_err (*release)(void *self, ks_bytes params, int64_t chunk, ks_bytes owner);
    /* Sum the chunks of params into *out (all zero before a plan). */
    ks_err (*summary)(void *self, ks_bytes params, ks_chunk_summary *out);
    /* Call fn once per chunk of params, in chunk order (status). */
    ks_err (*list)(void *self, ks_bytes params, ks_chunk_list_fn fn, void *arg);
    /* Release the coordinator (not its store). */
    void (*close)(void *self);
} ks_chunks_ops;

typedef struct ks_chunks {
    const ks_chunks_ops *ops;
    void *self;
    const char *name;    /* "pg" */
} ks_chunks;

/* Close a chunk coordinator; {NULL} is a no-op; *chunks is cleared. */
KS_API void ks_chunks_close(ks_chunks *chunks);

#ifdef __cplusplus
}
#endif
#endif /* KEYSHIFT_CHUNKS_H */
