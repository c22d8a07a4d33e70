/*
 * migrate/crypto/ctx.c -- a ks_ctx's lifecycle (keyshift/crypto.h):
 * configuration, creation and freeing, its per-thread shards, metrics and
 * health samples, and fork() safety.  The operations are in crypto.c.
 *
 * fork(): atfork handlers take every context's locks before fork() and
 * release them after, so a child never inherits a lock held by a thread
 * it does not have; the child empties the shards of those threads
 * (ks_shard_abandon, which also overwrites their OpenSSL key schedules)
 * and seals only with DEKs of its own ([F-CRYPTO-NONCE-2], dek_writer.c).
 * The forking thread's own shard keeps its OpenSSL states, but each is
 * keyed for a DEK by that DEK's serial: a child's seal refills its slot
 * with a DEK of the child's generation, whose serial differs, so the
 * state is keyed again before it encrypts anything, and never with the
 * parent's DEK and nonces.
 */
#include <assert.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include <keyshift/crypto.h>

#include "ctx_internal.h"
#include "../alloc_hook.h"

/* The read cache's derived state of an aes-256-gcm DEK's read keys
 * (shard.h): the expanded AES-GCM key of their first 32 bytes, the AEAD
 * key. */
static void aes_expand(void *state, const uint8_t *keys, size_t len)
{
    assert(len >= 32 && len <= KS_RKEYS_MAX);
    (void)len;
    (void)crypto_aead_aes256gcm_beforenm((crypto_aead_aes256gcm_state *)state, keys); /* always 0 */
}

/* See ctx_internal.h: the locked paths serve a thread without a shard. */
ks_shard *ks_ctx_shard_make(ks_ctx *ctx, uint32_t t)
{
    assert(t < KS_THREAD_SLOTS);
    ks_shard *sh = ks_shard_new(KS_WRAP_ID_MAX, ctx->cfg.cache_entries);
    atomic_store_explicit(&ctx->shards[t], sh, memory_order_release);
    return sh;
}

/* See ctx_internal.h. */
ks_err ks_ctx_provider_failed(ks_ctx *ctx, ks_err err)
{
    assert(err != KS_OK);
    if (err >= KS_ERR_UNAVAILABLE && err <= KS_ERR_INTEGRITY) {
        atomic_fetch_add_explicit(&ctx->m.provider_errors[err - KS_ERR_UNAVAILABLE], 1,
                                  memory_order_relaxed);
    }
    if (err == KS_ERR_NOT_FOUND) {
        BUMP(ctx, unknown_key);
    }
    return err;
}

/* ---- fork() safety ------------------------------------------------------ */

/* Every live context, for the atfork handlers; registry_mu guards the
 * list and is held from the prepare handler to the parent's or child's. */
static pthread_mutex_t registry_mu = PTHREAD_MUTEX_INITIALIZER;
static ks_ctx *registry;
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

/* atfork prepare: take every context's locks (the writer's, then the read
 * cache's and the memo's; no path holds two of these but the writer's
 * pair, taken in its own order), so that fork() copies none of them held
 * by a thread the child will not have. */
static void fork_prepare(void)
{
    pthread_mutex_lock(&registry_mu);
    for (ks_ctx *c = registry; c != NULL; c = c->reg_next) {
        ks_dek_writer_fork_prepare(c->writer);
        ks_dek_cache_fork_prepare(c->cache);
        ks_dek_cache_fork_prepare(c->memo);
    }
}

/* Release what fork_prepare took, in reverse. */
static void fork_release(void)
{
    for (ks_ctx *c = registry; c != NULL; c = c->reg_next) {
        ks_dek_cache_fork_release(c->memo);
        ks_dek_cache_fork_release(c->cache);
        ks_dek_writer_fork_release(c->writer);
    }
    pthread_mutex_unlock(&registry_mu);
}

/* atfork child: only this thread exists here.  Every other thread index
 * is free again, and the shards those threads owned, which may have been
 * mid-update when the address space was copied, are emptied without
 * being read (ks_shard_abandon); then the locks are released. */
static void fork_child(void)
{
    ks_thread_index_fork_child();
    const uint32_t mine = ks_thread_index_owned(); /* KS_THREAD_SHARED: none */
    for (ks_ctx *c = registry; c != NULL; c = c->reg_next) {
        for (uint32_t i = 0; i < KS_THREAD_SLOTS; i++) {
            ks_shard *sh = atomic_load_explicit(&c->shards[i], memory_order_acquire);
            if (i != mine && sh != NULL) {
                ks_shard_abandon(sh);
            }
        }
    }
    fork_release();
}

/* Thread exit hook (thread_index.h): the exiting owner of index i empties
 * its shard in every live context, so that its DEKs, keys and reserved
 * budgets do not wait for the index's next owner or for ks_ctx_free(). */
static void thread_exit(uint32_t i)
{
    pthread_mutex_lock(&registry_mu);
    for (ks_ctx *c = registry; c != NULL; c = c->reg_next) {
        ks_shard *sh = atomic_load_explicit(&c->shards[i], memory_order_relaxed);
        if (sh != NULL) {
            ks_shard_clear(sh, c->writer);
        }
    }
    pthread_mutex_unlock(&registry_mu);
}

/* Once per process: install the fork handlers and the thread exit hook. */
static void atfork_init(void)
{
    (void)pthread_atfork(fork_prepare, fork_release, fork_child);
    ks_thread_index_on_exit(thread_exit);
}

/* Add ctx to the registry (ks_ctx_new). */
static void registry_add(ks_ctx *ctx)
{
    (void)pthread_once(&atfork_once, atfork_init);
    pthread_mutex_lock(&registry_mu);
    ctx->reg_prev = NULL;
    ctx->reg_next = registry;
    if (registry != NULL) {
        registry->reg_prev = ctx;
    }
    registry = ctx;
    pthread_mutex_unlock(&registry_mu);
}

/* Remove ctx from the registry (ks_ctx_free), if it is there. */
static void registry_remove(ks_ctx *ctx)
{
    pthread_mutex_lock(&registry_mu);
    if (ctx->reg_prev != NULL) {
        ctx->reg_prev->reg_next = ctx->reg_next;
    } else if (registry == ctx) {
        registry = ctx->reg_next;
    }
    if (ctx->reg_next != NULL) {
        ctx->reg_next->reg_prev = ctx->reg_prev;
    }
    ctx->reg_prev = ctx->reg_next = NULL;
    pthread_mutex_unlock(&registry_mu);
}

/* ---- context ------------------------------------------------------------- */

/* See keyshift/crypto.h. */
void ks_ctx_config_default(ks_ctx_config *cfg)
{
    if (cfg == NULL) {
        return;
    }
    *cfg = (ks_ctx_config){KS_DEK_MAX_MESSAGES_DEFAULT, KS_DEK_MAX_BYTES_DEFAULT,
                           KS_DEK_MAX_AGE_DEFAULT,      KS_CACHE_ENTRIES_DEFAULT,
                           KS_CACHE_TTL_DEFAULT,        0,
                           0};
}

/* Nonzero when every member of cfg is in its documented range. */
static int config_ok(const ks_ctx_config *cfg)
{
    return cfg->dek_max_messages >= 1 && cfg->dek_max_messages <= KS_DEK_MAX_MESSAGES_AESGCM &&
           cfg->dek_max_bytes >= 1 && cfg->dek_max_age >= 1 &&
           cfg->cache_entries <= KS_CACHE_ENTRIES_MAX &&
           (cfg->cache_entries == 0 || cfg->cache_ttl >= 1);
}

/* Nonzero when the provider has every operation a context calls. */
static int provider_ok(const ks_provider *p)
{
    return p != NULL && p->ops != NULL && p->ops->wrap != NULL && p->ops->unwrap != NULL &&
           p->ops->key_info != NULL;
}

/* See keyshift/crypto.h. */
ks_err ks_ctx_new(const ks_provider *provider, const ks_ctx_config *cfg, ks_ctx **out)
{
    ks_ctx_config defaults;
    if (cfg == NULL) {
        ks_ctx_config_default(&defaults);
        cfg = &defaults;
    }
    if (out == NULL || !provider_ok(provider) || !config_ok(cfg)) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    *out = NULL;
    if (sodium_init() < 0) {
        return KS_ERR_CRYPTO_INIT;
    }
    /* aligned: the op shards are on cache lines of their own */
    ks_ctx *ctx = aligned_alloc(_Alignof(ks_ctx), sizeof *ctx);
    if (ctx == NULL) {
        return KS_ERR_NO_MEMORY;
    }
    memset(ctx, 0, sizeof *ctx);
    ctx->prov = *provider;
    ctx->cfg = *cfg;
    ctx->limits = (ks_wdek_limits){cfg->dek_max_messages, cfg->dek_max_bytes, cfg->dek_max_age};
    ks_err err = ks_dek_writer_new(&ctx->writer);
    if (err == KS_OK && cfg->cache_entries != 0) {
        err = ks_dek_cache_new(cfg->cache_entries, cfg->cache_ttl, KS_RKEYS_MAX, 1, KS_ID_HASH_TAIL,
                               &ctx->cache);
    }
    if (err == KS_OK && cfg->cache_entries != 0 && crypto_aead_aes256gcm_is_available()) {
        err = ks_dek_cache_enable_states(ctx->cache, sizeof(crypto_aead_aes256gcm_state),
                                         KS_CACHE_AES_STATES, aes_expand);
    }
    if (err == KS_OK && cfg->cache_entries != 0) {
        err = ks_dek_cache_new(cfg->cache_entries, cfg->cache_ttl, KS_MEMO_VAL_MAX, 0, 0, &ctx->memo);
    }
    if (err != KS_OK) {
        ks_ctx_free(ctx);
        return err;
    }
    registry_add(ctx);
    *out = ctx;
    return KS_OK;
}

/* See keyshift/crypto.h. */
void ks_ctx_free(ks_ctx *ctx)
{
    if (ctx == NULL) {
        return;
    }
    registry_remove(ctx);
    for (size_t i = 0; i < KS_THREAD_SLOTS; i++) {
        ks_shard_free(atomic_load_explicit(&ctx->shards[i], memory_order_acquire));
    }
    ks_dek_writer_free(ctx->writer);
    ks_dek_cache_free(ctx->cache);
    ks_dek_cache_free(ctx->memo);
    sodium_memzero(ctx, sizeof *ctx);
    free(ctx);
}

/* See crypto.h: the provider's key_info with the context's timeout, for
 * callers (the migration engine) that must pin a primary version once. */
ks_err ks_ctx_key_info(ks_ctx *ctx, ks_bytes key_id, uint32_t key_version, ks_key_info *out)
{
    if (ctx == NULL || out == NULL || key_id.len == 0 || key_id.ptr == NULL) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    memset(out, 0, sizeof *out);
    ks_err err = ctx->prov.ops->key_info(ctx->prov.self, key_id, key_version, out,
                                         ctx->cfg.provider_timeout_ms);
    if (err != KS_OK) {
        memset(out, 0, sizeof *out);
        return ks_ctx_provider_failed(ctx, err);
    }
    if (out->version == 0 || (key_version != 0 && out->version != key_version)) {
        memset(out, 0, sizeof *out);
        return ks_ctx_provider_failed(ctx, KS_ERR_INTEGRITY); /* a provider that names another version */
    }
    return KS_OK;
}

/* See keyshift/crypto.h. */
void ks_ctx_metrics(ks_ctx *ctx, ks_metrics *out)
{
    if (out == NULL) {
        return;
    }
    memset(out, 0, sizeof *out);
    if (ctx == NULL) {
        return;
    }
#define LOAD(f) atomic_load_explicit(&ctx->m.f, memory_order_relaxed)
    uint64_t shard_hits = 0;
    for (size_t i = 0; i <= KS_THREAD_SLOTS; i++) {
        out->seals += atomic_load_explicit(&ctx->ops[i].seals, memory_order_relaxed);
        out->opens += atomic_load_explicit(&ctx->ops[i].opens, memory_order_relaxed);
        shard_hits += atomic_load_explicit(&ctx->ops[i].hits, memory_order_relaxed);
    }
    out->rewraps = LOAD(rewraps);
    out->auth_failures = LOAD(auth_failures);
    out->auth_fail_unwrap = LOAD(auth_fail_unwrap);
    out->auth_fail_commitment = LOAD(auth_fail_commitment);
    out->auth_fail_aead = LOAD(auth_fail_aead);
    out->auth_fail_binding = LOAD(auth_fail_binding);
    for (size_t i = 0; i < 32; i++) {
        out->parse_errors[i] = LOAD(parse_errors[i]);
    }
    out->unknown_key = LOAD(unknown_key);
    for (size_t i = 0; i < 6; i++) {
        out->provider_errors[i] = LOAD(provider_errors[i]);
    }
    ks_dek_cache_counts(ctx->cache, &out->cache_hits, &out->cache_misses);
    out->cache_hits += shard_hits;
    out->wraps = LOAD(wraps);
    out->unwraps = LOAD(unwraps);
    out->deks_created = LOAD(deks_created);
#undef LOAD
}

/* Saturating sum of n counters. */
static uint64_t sum_loaded(_Atomic uint64_t *c, size_t n)
{
    uint64_t t = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t v = atomic_load_explicit(&c[i], memory_order_relaxed);
        t = t > UINT64_MAX - v ? UINT64_MAX : t + v;
    }
    return t;
}

/* See keyshift/crypto.h. */
void ks_ctx_health_sample(ks_ctx *ctx, ks_health_sample *out)
{
    if (out == NULL) {
        return;
    }
    memset(out, 0, sizeof *out);
    if (ctx == NULL) {
        return;
    }
    ks_metrics m;
    ks_ctx_metrics(ctx, &m);
    out->seals = m.seals;
    out->auth_failures = m.auth_failures;
    out->parse_errors = sum_loaded(ctx->m.parse_errors, 32);
    out->opens = m.opens + m.auth_failures + out->parse_errors;
    out->provider_calls = m.wraps + m.unwraps;
    out->provider_errors = sum_loaded(ctx->m.provider_errors, 6);
    for (size_t t = 0; t <= KS_THREAD_SHARED; t++) {
        const op_shard *o = &ctx->ops[t];
        for (size_t i = 0; i < KS_HIST_BUCKETS; i++) {
            out->seal_ns.bucket[i] += atomic_load_explicit(&o->seal_hist[i], memory_order_relaxed);
            out->open_ns.bucket[i] += atomic_load_explicit(&o->open_hist[i], memory_order_relaxed);
        }
        out->seal_ns_sum += atomic_load_explicit(&o->seal_hist[KS_CTX_HIST_SUM], memory_order_relaxed);
        out->open_ns_sum += atomic_load_explicit(&o->open_hist[KS_CTX_HIST_SUM], memory_order_relaxed);
    }
}

