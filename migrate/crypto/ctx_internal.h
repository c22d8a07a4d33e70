/*
 * migrate/crypto/ctx_internal.h -- the inside of a ks_ctx, shared by the
 * context's lifecycle (ctx.c: creation, freeing, metrics, fork safety)
 * and its operations (crypto.c: sealing, opening, rewrapping).
 *
 * Internal to the library (no KS_API).
 */
#ifndef KS_MIGRATE_CTX_INTERNAL_H
#define KS_MIGRATE_CTX_INTERNAL_H

#include <stdatomic.h>
#include <stdint.h>

#include <keyshift/crypto.h>

#include "dek_cache.h"
#include "dek_writer.h"
#include "shard.h"
#include "thread_index.h"

/* The longest envelope header through the wrapped DEK: the prefix, the
 * five tags, varints of at most five bytes, and the longest values. */
#define KS_WRAP_HEAD_MAX (KS_PREFIX_LEN + 5 * 6 + KS_TENANT_MAX + KS_KEY_ID_MAX + KS_WRAPPED_DEK_MAX)
/* A wrap identity as the read cache keys it (crypto.c, wrap_key()): for
 * v2, u8(purpose length) || purpose first. */
#define KS_WRAP_ID_MAX (1 + KS_PURPOSE_MAX + KS_WRAP_HEAD_MAX)
/* The read cache hashes a wrap identity's length and last 16 bytes: the
 * end of the wrapped DEK (dek_cache.c, hash_key()).  Its entries are put
 * only after the provider unwrapped them; lookups still compare in full.
 * The memo hashes whole keys (their tail is the caller's target key_id). */
#define KS_ID_HASH_TAIL 16
/* A rewrap memo value: u32be(version) || wrapped_dek. */
#define KS_MEMO_VAL_MAX (4 + KS_WRAPPED_DEK_MAX)
/* The most expanded AES-GCM keys the read cache keeps (512 bytes each, in
 * guarded memory), for opens on threads without a shard: the most
 * recently used v1 aes-256-gcm DEKs'. */
#define KS_CACHE_AES_STATES 256u

/* The slot of a latency histogram after its buckets: the sum of the
 * latencies counted, in ns (it wraps after 2^64 ns, some 584 years). */
#define KS_CTX_HIST_SUM KS_HIST_BUCKETS
/* A latency histogram: the buckets, then the sum. */
#define KS_CTX_HIST_LEN (KS_HIST_BUCKETS + 1)

/* The seal and open counts of one thread index (thread_index.h; the last
 * is the shared index's), the opens its shard's read keys served, and,
 * with cfg.latency_histograms, its seal and open latencies, starting on
 * a cache line of their own: a thread writes only its own index's. */
typedef struct op_shard {
    _Alignas(64) _Atomic uint64_t seals;
    _Atomic uint64_t opens;
    _Atomic uint64_t hits;
    _Atomic uint64_t seal_hist[KS_CTX_HIST_LEN];
    _Atomic uint64_t open_hist[KS_CTX_HIST_LEN];
} op_shard;

/* Every counter of ks_metrics, as relaxed C11 atomics, but seals and opens
 * (op_shard, counted per thread) and cache_hits and cache_misses (the
 * shards' hits, and the read cache's hits and misses, which it counts
 * under the lock it holds for the lookup anyway, ks_dek_cache_counts()). */
typedef struct counters {
    _Atomic uint64_t rewraps;
    _Atomic uint64_t auth_failures, auth_fail_unwrap, auth_fail_commitment, auth_fail_aead,
        auth_fail_binding;
    _Atomic uint64_t parse_errors[32];
    _Atomic uint64_t unknown_key;
    _Atomic uint64_t provider_errors[6];
    _Atomic uint64_t wraps, unwraps, deks_created;
} counters;

#define BUMP(ctx, field) atomic_fetch_add_explicit(&(ctx)->m.field, 1, memory_order_relaxed)

struct ks_ctx {
    ks_provider prov;
    ks_ctx_config cfg;
    ks_wdek_limits limits;
    ks_dek_writer *writer;
    ks_dek_cache *cache; /* read side: wrap identity -> DEK; NULL when disabled */
    ks_dek_cache *memo;  /* rewrap: (identity, target) -> new wrap; NULL when disabled */
    counters m;
    op_shard ops[KS_THREAD_SLOTS + 1];
    /* Each thread index's shard, made and used by its owner alone. */
    _Atomic(ks_shard *) shards[KS_THREAD_SLOTS];
    ks_ctx *reg_prev, *reg_next; /* every live context, for the atfork handlers */
};

/* What ks_ctx_count() counts. */
enum { KS_COUNT_SEAL, KS_COUNT_OPEN, KS_COUNT_SHARD_HIT };

/* Add v to counter n of thread index t (thread_index.h).  An index of
 * its own is written by its owner alone, so a relaxed load and store
 * count without a locked read-modify-write, a few ns on every operation;
 * the shared index takes an atomic add.  Readers (ks_ctx_metrics(),
 * ks_ctx_health_sample()) load the counters with relaxed atomics. */
static inline void ks_ctx_add(_Atomic uint64_t *n, uint32_t t, uint64_t v)
{
    if (t < KS_THREAD_SLOTS) {
        atomic_store_explicit(n, atomic_load_explicit(n, memory_order_relaxed) + v,
                              memory_order_relaxed);
    } else {
        atomic_fetch_add_explicit(n, v, memory_order_relaxed);
    }
}

/* Count one seal, open or shard hit (`what`) on thread index t. */
static inline void ks_ctx_count(ks_ctx *ctx, uint32_t t, int what)
{
    op_shard *sh = &ctx->ops[t];
    ks_ctx_add(what == KS_COUNT_SEAL   ? &sh->seals
               : what == KS_COUNT_OPEN ? &sh->opens
                                       : &sh->hits,
               t, 1);
}

/* ks_ctx_shard() for a shard not made yet: make it (NULL when memory is
 * short). */
ks_shard *ks_ctx_shard_make(ks_ctx *ctx, uint32_t t);

/* Thread index t's shard in ctx (shard.h), made on its first use; NULL
 * for the shared index, or when memory is short.  Every seal and open
 * asks, so the lookup is inline. */
static inline ks_shard *ks_ctx_shard(ks_ctx *ctx, uint32_t t)
{
    if (t >= KS_THREAD_SLOTS) {
        return NULL;
    }
    ks_shard *sh = atomic_load_explicit(&ctx->shards[t], memory_order_relaxed);
    return sh != NULL ? sh : ks_ctx_shard_make(ctx, t);
}

/* Count a provider error by class (not-found also as unknown_key) and
 * pass it through unchanged. */
ks_err ks_ctx_provider_failed(ks_ctx *ctx, ks_err err);

#endif /* KS_MIGRATE_CTX_INTERNAL_H */
