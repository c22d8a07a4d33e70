/*
 * migrate/crypto/crypto.c -- sealing, opening and rewrapping envelopes
 * (keyshift/crypto.h, docs/format.md section 7).
 *
 * Keys [F-CRYPTO-KEY-1], [F-CRYPTO-KEY-4], [F-CRYPTO-COMMIT-2]:
 *   v1: K = DEK, no commitment;
 *   v2: K and the commitment C are functions of the DEK and the algorithm
 *       alone (v2_keys.h), computed once per DEK and kept with it.
 * AEAD [F-CRYPTO-AEAD-1]: the algorithm's AEAD [F-CRYPTO-ALG-1] under K
 * with the envelope's nonce and the data AAD (keyshift/aad.h); its output
 * c (plaintext length + 16) is the ciphertext field.  Two engines run it,
 * OpenSSL and libsodium, chosen per call by algorithm and size
 * (aead.h); their bytes are the same.
 *
 * Secrets: DEKs and K sit in sodium_malloc'd memory (write side:
 * dek_writer.c; read side: dek_cache.c and the shards, shard.c) or in
 * stack buffers that every path wipes.  So do the expanded AES-GCM keys
 * of aes-256-gcm DEKs (one per write-side DEK; on the read side one per
 * shard slot, and for threads without a shard a bounded pool,
 * KS_CACHE_AES_STATES, pinned by an open while it decrypts and wiped when
 * its entry goes and no open still uses it), and the OpenSSL key
 * schedules of each shard slot (aead.h), overwritten when the slot's key
 * goes and freed with the shard.  Nothing is ever logged.
 *
 * The hot paths (a seal on an active DEK, an open whose DEK is cached)
 * allocate nothing, call no random source and, on a thread that owns a
 * shard, take no lock and write no shared cache line: the nonce comes
 * from the thread's block of the DEK's counter, the read keys from the
 * thread's shard, AADs are built in stack buffers from the DEK's
 * pre-built AAD head, and the envelope header is copied from the DEK's
 * pre-encoded template.
 *
 * The context itself (struct ks_ctx, its lifecycle, metrics and fork
 * safety) is in ctx.c and ctx_internal.h.
 */
#include <assert.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include <keyshift/crypto.h>

#include "../../format/rules.h"
#include "aead.h"
#include "crypto_hooks.h"
#include "ctx_internal.h"
#include "dek_cache.h"
#include "dek_writer.h"
#include "mono_clock.h"
#include "../../parser/envelope_head.h"
#include "open_parsed.h"
#include "shard.h"
#include "thread_index.h"
#include "v2_keys.h"

/* The ciphertext field's tag byte: field 15, wire type 2 (LEN). */
#define KS_CT_TAG ((uint8_t)(KS_FIELD_CIPHERTEXT << 3 | 2))
/* A rewrap memo key: u32be(id length) || id || u32be(version) || key_id. */
#define KS_MEMO_KEY_MAX (4 + KS_WRAP_ID_MAX + 4 + KS_KEY_ID_MAX)

/* Why an open failed authentication (one error code, four counters). */
typedef enum auth_cause { CAUSE_UNWRAP, CAUSE_COMMITMENT, CAUSE_AEAD, CAUSE_BINDING } auth_cause;

static _Atomic int hide_aes;
/* crypto_aead_aes256gcm_is_available(), asked once (and again after a
 * test's hide changes): 0 not yet, 1 no (or hidden), 2 yes.  It reads the
 * CPU features sodium_init() found, which ks_ctx_new ran before any seal
 * or open could get here. */
static _Atomic int aes_ni;

/* See crypto_hooks.h. */
void ks_crypto_test_hide_aes(int hide)
{
    atomic_store(&hide_aes, hide);
    atomic_store(&aes_ni, 0);
}

/* ---- small helpers --------------------------------------------------------- */

/* Count an authentication failure by cause; returns KS_ERR_AUTH_FAILED. */
static ks_err auth_failed(ks_ctx *ctx, auth_cause cause)
{
    BUMP(ctx, auth_failures);
    switch (cause) {
    case CAUSE_UNWRAP:
        BUMP(ctx, auth_fail_unwrap);
        break;
    case CAUSE_COMMITMENT:
        BUMP(ctx, auth_fail_commitment);
        break;
    case CAUSE_AEAD:
        BUMP(ctx, auth_fail_aead);
        break;
    case CAUSE_BINDING:
        BUMP(ctx, auth_fail_binding);
        break;
    }
    return KS_ERR_AUTH_FAILED;
}

/* Count a parse rejection by code and pass it through. */
static ks_err parse_failed(ks_ctx *ctx, ks_err err)
{
    if (err > KS_OK && (unsigned)err < 32) {
        atomic_fetch_add_explicit(&ctx->m.parse_errors[err], 1, memory_order_relaxed);
    }
    return err;
}

/* Ask libsodium whether it runs aes-256-gcm here, unless a test hides
 * it, and keep the answer in aes_ni. */
static __attribute__((noinline)) int aes_ni_probe(void)
{
    const int a = !atomic_load(&hide_aes) && crypto_aead_aes256gcm_is_available() ? 2 : 1;
    atomic_store_explicit(&aes_ni, a, memory_order_relaxed);
    return a;
}

/* Nonzero when this process can run alg's AEAD.  aes-256-gcm needs AES-NI
 * (libsodium has no portable AES); there is never a fallback. */
static inline int alg_available(uint32_t alg)
{
    if (alg == KS_ALG_AES256GCM) {
        const int a = atomic_load_explicit(&aes_ni, memory_order_relaxed);
        return (a != 0 ? a : aes_ni_probe()) == 2;
    }
    return alg == KS_ALG_XCHACHA20POLY1305;
}

/* Nonzero when a caller's view is usable: NULL only when empty. */
static inline int view_ok(ks_bytes v)
{
    return v.ptr != NULL || v.len == 0;
}

/* ---- key derivation and AEAD ---------------------------------------------- */

/* The read keys of a DEK as an open and a rewrap use them (shard.h):
 * views into a shard slot, a stack copy of the cache's value, or a pinned
 * cache state (aes). */
typedef struct rkeys {
    const uint8_t *aead_key; /* K: v1 the DEK, v2 derived */
    const uint8_t *commit;   /* v2: C; v1: NULL */
    const uint8_t *dek;
    const void *aes;         /* aes-256-gcm: the expanded aead_key, or NULL */
    ks_aead_evp *evp;        /* a shard slot's OpenSSL state for aead_key, or NULL */
    uint64_t serial;         /* names aead_key for evp */
    uint8_t *aad;            /* a shard slot's data AAD head (KS_AAD_SMALL bytes of room), or NULL */
    size_t aad_len;
} rkeys;

/* The read keys' length for env's version: v1 the DEK; v2 K || C || DEK. */
static size_t rkeys_len(const ks_envelope *env)
{
    return env->version == KS_FORMAT_V2 ? KS_RKEYS_MAX : KS_DEK_LEN;
}

/* Build env's read keys from its DEK into keys[0, rkeys_len(env)). */
static void rkeys_build(const ks_envelope *env, const uint8_t dek[KS_DEK_LEN], uint8_t *keys)
{
    if (env->version == KS_FORMAT_V2) {
        ks_v2_keys(env->algorithm, dek, keys, keys + 32); /* [F-CRYPTO-KEY-4], [F-CRYPTO-COMMIT-2] */
        memcpy(keys + 64, dek, KS_DEK_LEN);
    } else {
        memcpy(keys, dek, KS_DEK_LEN); /* [F-CRYPTO-KEY-1] */
    }
}

/* Views of the read keys keys[0, rkeys_len(env)), with aes their
 * expanded key or NULL, and no OpenSSL state. */
static rkeys rkeys_view(const ks_envelope *env, const uint8_t *keys, const void *aes)
{
    const int v2 = env->version == KS_FORMAT_V2;
    return (rkeys){keys, v2 ? keys + 32 : NULL, v2 ? keys + 64 : keys, aes, NULL, 0, NULL, 0};
}

/* Views of the read keys in shard slot o, with its OpenSSL state. */
static rkeys rkeys_slot(const ks_envelope *env, ks_open_slot *o)
{
    rkeys k = rkeys_view(env, o->keys, o->aes);
    k.evp = &o->evp;
    k.serial = o->serial;
    if (o->aad_len != 0) {
        k.aad = o->aad;
        k.aad_len = o->aad_len;
    }
    return k;
}

/* Nonzero when env's v2 commitment is C of its read keys, compared in
 * constant time [F-CRYPTO-COMMIT-2] (crypto_verify_32: a fixed-length
 * compare with no early exit); always for v1. */
static int commitment_ok(const ks_envelope *env, const rkeys *k)
{
    _Static_assert(KS_COMMITMENT_LEN == crypto_verify_32_BYTES, "commitment is 32 bytes");
    return env->version != KS_FORMAT_V2 || crypto_verify_32(k->commit, env->commitment.ptr) == 0;
}

/* Write lp(context) at aad + head_len, after a data AAD head already
 * there (room for 4 + context.len more bytes) [F-CRYPTO-AAD-1].  Returns
 * the AAD's length. */
static inline size_t put_context(uint8_t *aad, size_t head_len, ks_bytes context)
{
    ks_be_put(aad + head_len, (uint32_t)context.len, 4);
    if (context.len != 0) {
        memcpy(aad + head_len + 4, context.ptr, context.len);
    }
    return head_len + 4 + context.len;
}

/* Write head[0, head_len) || lp(context) at aad (room for head_len + 4 +
 * context.len bytes): a data AAD [F-CRYPTO-AAD-1] from its head
 * (dek_writer.h).  Returns its length. */
static size_t head_and_context(uint8_t *aad, const uint8_t *head, size_t head_len, ks_bytes context)
{
    assert(head_len <= KS_DATA_AAD_HEAD_MAX && context.len <= KS_CONTEXT_MAX);
    memcpy(aad, head, head_len);
    return put_context(aad, head_len, context);
}

/* ---- sealing ------------------------------------------------------------- */

/* Resolve p's defaults into a tuple and check what is cheap to check per
 * call; the name rules are checked by the encoder when a DEK is made. */
static inline ks_err seal_tuple(const ks_seal_params *p, ks_wdek_tuple *t)
{
    t->format = p->format ? p->format : KS_FORMAT_V2;
    t->algorithm = p->algorithm ? p->algorithm : KS_ALG_XCHACHA20POLY1305;
    t->tenant = p->tenant;
    t->purpose = p->purpose;
    t->key_id = p->key_id;
    t->req_version = p->key_version;
    if ((t->format != KS_FORMAT_V1 && t->format != KS_FORMAT_V2) ||
        ks_alg_nonce_len(t->algorithm) == 0 || !view_ok(p->tenant) || !view_ok(p->purpose) ||
        !view_ok(p->key_id) || !view_ok(p->context) || p->context.len > KS_CONTEXT_MAX) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    if (t->format == KS_FORMAT_V1 && p->purpose.len != 0) {
        return KS_ERR_INVALID_ARGUMENT; /* v1 has no purpose field */
    }
    return KS_OK;
}

/* An envelope with t's header fields, key_version and wrapped_dek as
 * given, zero nonce and commitment of the right lengths, and a ciphertext
 * of ct_len bytes (its pointer is a placeholder: only lengths are read). */
static ks_envelope shape_of(const ks_wdek_tuple *t, uint32_t version, ks_bytes wrapped, size_t ct_len)
{
    static const uint8_t zeros[KS_COMMITMENT_LEN];
    ks_envelope e = {0};
    e.version = t->format;
    e.algorithm = t->algorithm;
    e.tenant = t->tenant;
    e.key_id = t->key_id;
    e.key_version = version;
    e.wrapped_dek = wrapped;
    e.nonce = (ks_bytes){zeros, ks_alg_nonce_len(t->algorithm)};
    e.purpose = t->purpose;
    if (t->format == KS_FORMAT_V2) {
        e.commitment = (ks_bytes){zeros, KS_COMMITMENT_LEN};
    }
    e.ciphertext = (ks_bytes){zeros, ct_len};
    return e;
}

/* See keyshift/crypto.h. */
size_t ks_seal_max_len(const ks_seal_params *p, size_t pt_len)
{
    static const uint8_t wrapped[KS_WRAPPED_DEK_MAX];
    ks_wdek_tuple t;
    size_t n;
    if (p == NULL || seal_tuple(p, &t) != KS_OK || pt_len > KS_CIPHERTEXT_DEFAULT_MAX - KS_TAG_LEN) {
        return 0;
    }
    uint32_t version = t.req_version ? t.req_version : UINT32_MAX; /* the longest varint */
    ks_envelope e = shape_of(&t, version, (ks_bytes){wrapped, sizeof wrapped}, pt_len + KS_TAG_LEN);
    return ks_envelope_encoded_len(&e, NULL, &n) == KS_OK ? n : 0;
}

/* The version to wrap under: the requested one, or the key's primary
 * (provider key_info) when 0 was requested. */
static ks_err resolve_version(ks_ctx *ctx, ks_bytes key_id, uint32_t requested, uint32_t *out)
{
    ks_key_info info = {0};
    if (requested != 0) {
        *out = requested;
        return KS_OK;
    }
    ks_err err = ctx->prov.ops->key_info(ctx->prov.self, key_id, 0, &info, ctx->cfg.provider_timeout_ms);
    if (err != KS_OK) {
        return ks_ctx_provider_failed(ctx, err);
    }
    if (info.version == 0) {
        return ks_ctx_provider_failed(ctx, KS_ERR_INTEGRITY); /* a provider that names no version */
    }
    *out = info.version;
    return KS_OK;
}

/* Wrap dek under env's key_id and key_version, binding env's wrap AAD
 * [F-CRYPTO-AAD-2], into out[0, KS_WRAPPED_DEK_MAX). */
static ks_err wrap_dek(ks_ctx *ctx, const ks_envelope *env, const uint8_t *dek, uint8_t *out,
                       size_t *out_len)
{
    uint8_t aad[KS_WRAP_AAD_MAX];
    size_t aad_len = 0;
    ks_err err = ks_aad_wrap(env, aad, sizeof aad, &aad_len);
    assert(err == KS_OK); /* env was checked */
    if (err != KS_OK) {
        return err;
    }
    BUMP(ctx, wraps);
    *out_len = 0;
    err = ctx->prov.ops->wrap(ctx->prov.self, env->key_id, env->key_version, dek, KS_DEK_LEN,
                              (ks_bytes){aad, aad_len}, out, KS_WRAPPED_DEK_MAX, out_len,
                              ctx->cfg.provider_timeout_ms);
    if (err != KS_OK) {
        return ks_ctx_provider_failed(ctx, err);
    }
    if (*out_len == 0 || *out_len > KS_WRAPPED_DEK_MAX) {
        return ks_ctx_provider_failed(ctx, KS_ERR_INTEGRITY); /* the format cannot carry it */
    }
    return KS_OK;
}

/* Create t's write-side DEK: check the names, resolve the version, draw
 * the DEK, wrap it once, and build its record. */
static ks_err create_dek(ks_ctx *ctx, const ks_wdek_tuple *t, ks_wdek **out)
{
    static const uint8_t one[1];
    uint8_t wrapped[KS_WRAPPED_DEK_MAX];
    size_t wrapped_len;
    uint32_t version = t->req_version ? t->req_version : 1;
    ks_envelope e = shape_of(t, version, (ks_bytes){one, 1}, KS_TAG_LEN);
    if (ks_envelope_check(&e, NULL) != KS_OK) {
        return KS_ERR_INVALID_ARGUMENT; /* tenant, key_id or purpose break [F-NAME-1]/[F-KEYID-1] */
    }
    ks_err err = resolve_version(ctx, t->key_id, t->req_version, &e.key_version);
    if (err != KS_OK) {
        return err;
    }
    uint8_t *key = ks_wdek_key_new();
    if (key == NULL) {
        return KS_ERR_NO_MEMORY;
    }
    err = wrap_dek(ctx, &e, key, wrapped, &wrapped_len);
    if (err != KS_OK) {
        ks_wdek_key_free(key);
        return err;
    }
    e.wrapped_dek = (ks_bytes){wrapped, wrapped_len};
    err = ks_wdek_new(&e, t->req_version, &ctx->limits, key, out); /* takes key */
    if (err == KS_OK) {
        BUMP(ctx, deks_created);
    }
    return err;
}

/* Refill s with a block of t's active DEK for a message of pt_len bytes
 * (block: a shard's slot, see ks_dek_writer_refill()): the table's record
 * when it has budget; otherwise, serialised with other creators, a new
 * DEK is made and installed, and s refilled from it in the same critical
 * section.  On KS_OK, ks_seal_slot_take() may follow. */
static ks_err acquire_dek(ks_ctx *ctx, const ks_wdek_tuple *t, size_t pt_len, int block,
                          ks_seal_slot *s)
{
    if (ks_dek_writer_refill(ctx->writer, t, pt_len, block, s) == KS_OK) {
        return KS_OK;
    }
    ks_dek_writer_create_lock(ctx->writer);
    ks_err err = ks_dek_writer_refill(ctx->writer, t, pt_len, block, s); /* made meanwhile? */
    if (err != KS_OK) {
        ks_wdek *d = NULL;
        err = create_dek(ctx, t, &d);
        /* A fresh DEK has its whole budget: only a clock jump by max_age
         * or a fork right now leaves it spent. */
        if (err == KS_OK && ks_dek_writer_install(ctx->writer, d, pt_len, block, s) != KS_OK) {
            err = KS_ERR_UNAVAILABLE;
        }
    }
    ks_dek_writer_create_unlock(ctx->writer);
    return err;
}

/* Seal pt with d's counter value c under the data AAD aad[0, aad_len)
 * (d's AAD head || lp(context) [F-CRYPTO-AAD-1]): d's header template
 * (nonce prefix, v2 commitment) with the counter patched in, then the
 * ciphertext field, encrypted in place in out under d's AEAD key.  Writes
 * nothing when cap is short; wipes out on failure. */
static inline __attribute__((always_inline)) ks_err seal_with(const ks_wdek *d, uint64_t c, ks_aead_evp *evp,
                                                              const uint8_t *aad, size_t aad_len,
                                                              const uint8_t *pt, size_t pt_len, uint8_t *out,
                                                              size_t cap, size_t *out_len)
{
    const size_t hl = d->tmpl.header_len, ct_len = pt_len + KS_TAG_LEN;
    const size_t total = hl + 1 + ks_varint_len(ct_len) + ct_len;
    if (cap < total) {
        return KS_ERR_BUFFER_TOO_SMALL;
    }
    memcpy(out, d->hdr, hl);
    ks_wdek_put_counter(d, out, c);
    size_t pos = hl;
    out[pos++] = KS_CT_TAG;
    pos += ks_varint_put(out + pos, ct_len);
    /* d->aes: the AEAD key's expanded aes-256-gcm state; evp: this
     * thread's OpenSSL state for it, keyed again when d's serial changes */
    const ks_aead_key k = {d->tmpl.algorithm, d->aead_key, d->aes, evp, d->serial};
    if (ks_aead_encrypt(KS_AEAD_AUTO, &k, out + pos, pt, pt_len, aad, aad_len, out + d->nonce_off) != 0) {
        sodium_memzero(out, total);
        return KS_ERR_INVALID_ARGUMENT; /* the engines refuse only oversized input */
    }
    assert(pos + ct_len == total);
    *out_len = total;
    return KS_OK;
}

/* seal_with() under d's AAD head and context, built on this frame: for a
 * context longer than a shard slot builds in place, and for threads
 * without a shard.  Out of line, so that the usual seal's frame stays
 * small. */
static __attribute__((noinline)) ks_err seal_frame_aad(const ks_wdek *d, uint64_t c, ks_aead_evp *evp,
                                                      ks_bytes context, const uint8_t *pt, size_t pt_len,
                                                      uint8_t *out, size_t cap, size_t *out_len)
{
    uint8_t aad[KS_DATA_AAD_MAX];
    const size_t aad_len = head_and_context(aad, d->aad_head, d->aad_head_len, context);
    return seal_with(d, c, evp, aad, aad_len, pt, pt_len, out, cap, out_len);
}

/* Seal for a thread without a shard (the shared thread index, or memory
 * short): from a slot of one nonce, dropped afterwards, on libsodium. */
static __attribute__((noinline)) ks_err seal_unsharded(ks_ctx *ctx, const ks_wdek_tuple *t, ks_bytes context,
                                                      const uint8_t *pt, size_t pt_len, uint8_t *out,
                                                      size_t cap, size_t *out_len)
{
    ks_seal_slot one = {NULL, 0, 0, 0};
    ks_err err = acquire_dek(ctx, t, pt_len, 0, &one);
    if (err != KS_OK) {
        return err;
    }
    const uint64_t c = ks_seal_slot_take(&one, pt_len);
    assert(one.bytes == 0); /* exactly pt_len was reserved */
    err = seal_frame_aad(one.d, c, NULL, context, pt, pt_len, out, cap, out_len); /* c is public */
    ks_wdek_release(one.d);
    return err;
}

/* Seal from shard sh's slot s, fresh for this message: spend its next
 * nonce, and build the data AAD in the slot's buffer, whose head is
 * copied only when the slot's DEK changed. */
static ks_err seal_slot(ks_shard *sh, ks_seal_slot *s, ks_bytes context, const uint8_t *pt, size_t pt_len,
                        uint8_t *out, size_t cap, size_t *out_len)
{
    const size_t i = (size_t)(s - sh->seal);
    assert(i < KS_SHARD_SEALS);
    const uint64_t c = ks_seal_slot_take(s, pt_len);
    const ks_wdek *d = s->d;
    if (context.len > KS_AAD_CONTEXT_SMALL) {
        return seal_frame_aad(d, c, &sh->seal_evp[i], context, pt, pt_len, out, cap, out_len);
    }
    ks_seal_aad *a = &sh->seal_aad[i];
    if (a->serial != d->serial) {
        assert(d->aad_head_len <= KS_DATA_AAD_HEAD_MAX);
        memcpy(a->buf, d->aad_head, d->aad_head_len);
        a->serial = d->serial;
    }
    const size_t aad_len = put_context(a->buf, d->aad_head_len, context);
    return seal_with(d, c, &sh->seal_evp[i], a->buf, aad_len, pt, pt_len, out, cap, out_len);
}

/*
 * ks_seal without the latency histogram (see ks_seal).  A thread with a
 * shard seals from its own slot for the tuple and refills it a block at a
 * time; any other seals from a slot of one nonce (seal_unsharded()).
 */
static inline __attribute__((always_inline)) ks_err seal_call(ks_ctx *ctx, const ks_seal_params *p,
                                                              const uint8_t *pt, size_t pt_len, uint8_t *out,
                                                              size_t cap, size_t *out_len)
{
    ks_wdek_tuple t;
    if (ctx == NULL || p == NULL || out_len == NULL || (pt == NULL && pt_len != 0) ||
        (out == NULL && cap != 0)) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    ks_err err = seal_tuple(p, &t);
    if (err != KS_OK) {
        return err;
    }
    if (!alg_available(t.algorithm)) {
        return KS_ERR_ALGORITHM_UNAVAILABLE;
    }
    if (pt_len > KS_CIPHERTEXT_DEFAULT_MAX - KS_TAG_LEN) {
        return KS_ERR_TOO_LARGE;
    }
    const uint32_t ti = ks_thread_index();
    ks_shard *sh = ks_ctx_shard(ctx, ti);
    if (sh == NULL) {
        err = seal_unsharded(ctx, &t, p->context, pt, pt_len, out, cap, out_len);
    } else {
        int on_t = 0; /* s is on t's tuple: the shard compared them */
        ks_seal_slot *s = ks_shard_seal_slot(sh, &t, &on_t);
        const uint64_t gen = ks_fork_generation(), now = ks_mono_seconds();
        if (on_t ? !ks_seal_slot_fresh(s, pt_len, gen, now) : !ks_seal_slot_ready(s, &t, pt_len, gen, now)) {
            err = acquire_dek(ctx, &t, pt_len, 1, s);
        }
        if (err == KS_OK) {
            err = seal_slot(sh, s, p->context, pt, pt_len, out, cap, out_len);
        }
    }
    if (err == KS_OK) {
        ks_ctx_count(ctx, ti, KS_COUNT_SEAL);
    }
    return err;
}

/* ---- opening ------------------------------------------------------------- */

/* Nonzero when env carries the tenant and purpose the reader expects
 * (each only when given) [F-CRYPTO-OPEN-1]. */
static int binding_ok(const ks_envelope *env, const ks_open_params *p)
{
    if (p->tenant.len != 0 &&
        (env->tenant.len != p->tenant.len || memcmp(env->tenant.ptr, p->tenant.ptr, p->tenant.len) != 0)) {
        return 0;
    }
    if (p->purpose.len != 0 && (env->purpose.len != p->purpose.len ||
                                memcmp(env->purpose.ptr, p->purpose.ptr, p->purpose.len) != 0)) {
        return 0;
    }
    return 1;
}

/*
 * The wrap identity of env, parsed from buf, as the read cache's key:
 * *key, its length returned.  It is the wrap AAD's fields and the wrapped
 * DEK [F-CRYPTO-AAD-2] in their canonical encoding rather than the AAD's
 * layout: buf[0, end of the wrapped_dek field) holds the prefix (version)
 * and fields 1 to 5 (algorithm, tenant, key_id, key_version, wrapped_dek),
 * and since the parser accepts exactly one encoding of each field tuple,
 * those bytes are equal exactly when the fields are.  v2 adds purpose,
 * the one wrap AAD field after the nonce, in front as u8(length) ||
 * purpose (length <= KS_PURPOSE_MAX < 'K', so no v2 key starts like a v1
 * key), keeping the wrapped DEK last for the cache's tail hash.  For v1
 * the key is a view of buf (no copy, no AAD built on a hit); for v2 it is
 * built in scratch[0, KS_WRAP_ID_MAX).
 */
static size_t wrap_key(const uint8_t *buf, const ks_envelope *env, uint8_t *scratch,
                       const uint8_t **key)
{
    const size_t head = (size_t)(env->wrapped_dek.ptr + env->wrapped_dek.len - buf);
    assert(env->wrapped_dek.ptr > buf && head <= KS_WRAP_HEAD_MAX);
    if (env->version == KS_FORMAT_V1) {
        *key = buf;
        return head;
    }
    const size_t plen = env->purpose.len;
    assert(plen >= 1 && plen <= KS_PURPOSE_MAX);
    scratch[0] = (uint8_t)plen;
    memcpy(scratch + 1, env->purpose.ptr, plen);
    memcpy(scratch + 1 + plen, buf, head);
    *key = scratch;
    return 1 + plen + head;
}

/* env's DEK from the provider into dek[0, 32), under the wrap AAD
 * [F-CRYPTO-AAD-2]: a cache miss.  On failure dek is zero. */
static ks_err provider_unwrap(ks_ctx *ctx, const ks_envelope *env, uint8_t dek[KS_DEK_LEN])
{
    uint8_t aad[KS_WRAP_AAD_MAX];
    size_t aad_len = 0;
    ks_err err = ks_aad_wrap(env, aad, sizeof aad, &aad_len);
    assert(err == KS_OK); /* env was parsed */
    if (err == KS_OK) {
        BUMP(ctx, unwraps);
        err = ctx->prov.ops->unwrap(ctx->prov.self, env->key_id, env->key_version, env->wrapped_dek,
                                    (ks_bytes){aad, aad_len}, dek, KS_DEK_LEN,
                                    ctx->cfg.provider_timeout_ms);
    }
    if (err != KS_OK) {
        sodium_memzero(dek, KS_DEK_LEN);
        return err == KS_ERR_AUTH_FAILED ? auth_failed(ctx, CAUSE_UNWRAP) : ks_ctx_provider_failed(ctx, err);
    }
    return KS_OK;
}

/*
 * env's read keys (rkeys_len(env) bytes) into keys[], from the read cache
 * or else from the provider (then cached), under its wrap identity
 * id[0, id_len); *expires receives when a copy of them must no longer be
 * used (the cache entry's expiry).  With pin not NULL (an aes-256-gcm
 * open on a thread without a shard), a cached entry's expanded key may
 * be pinned into *pin instead (keys is then not written; the caller
 * unpins).  On failure keys is zero.
 */
static ks_err read_keys(ks_ctx *ctx, const ks_envelope *env, const uint8_t *id, size_t id_len,
                        uint8_t keys[KS_RKEYS_MAX], uint64_t *expires, ks_dek_cache_pin *pin)
{
    size_t got = 0;
    if (ks_dek_cache_get_pinned(ctx->cache, id, id_len, keys, &got, pin, expires)) {
        assert((pin != NULL && pin->state != NULL) || got == rkeys_len(env));
        return KS_OK; /* the cache counts its hits and misses */
    }
    uint8_t dek[KS_DEK_LEN];
    ks_err err = provider_unwrap(ctx, env, dek);
    if (err == KS_OK) {
        rkeys_build(env, dek, keys);
        *expires = ks_mono_seconds() + ctx->cfg.cache_ttl;
        /* the pool of expanded keys serves v1 aes-256-gcm only (open_keys) */
        ks_dek_cache_put(ctx->cache, id, id_len, keys, rkeys_len(env),
                         env->version == KS_FORMAT_V1 && env->algorithm == KS_ALG_AES256GCM);
    }
    sodium_memzero(dek, sizeof dek);
    return err;
}

/* Give shard slot o, just put for env's read keys, the data AAD head of
 * env's envelopes: env's fields with the commitment C of o's keys (an
 * open that uses the head has checked that env's commitment is C, so the
 * head is that of env; an envelope with a wrong commitment, which fails
 * its open, leaves no trace in it). */
static void slot_aad_head(ks_open_slot *o, const ks_envelope *env)
{
    ks_envelope t = *env;
    if (t.version == KS_FORMAT_V2) {
        t.commitment = (ks_bytes){o->keys + 32, KS_COMMITMENT_LEN};
    }
    uint8_t aad[KS_DATA_AAD_HEAD_MAX + 4];
    size_t len = 0;
    if (ks_aad_data(&t, (ks_bytes){NULL, 0}, aad, sizeof aad, &len) == KS_OK) {
        assert(len >= 4 && aad[len - 4] == 0 && aad[len - 1] == 0); /* ends with lp(empty) */
        memcpy(o->aad, aad, len - 4);
        o->aad_len = len - 4;
    }
}

/* Decrypt env's ciphertext into pt under the read keys k and the data
 * AAD aad[0, aad_len); a failed AEAD leaves pt[0, cap) zero and is
 * auth-failed.  pt NULL: verify the tag only (ks_aead_decrypt()). */
static inline __attribute__((always_inline)) ks_err aead_open(ks_ctx *ctx, const ks_envelope *env,
                                                              const rkeys *k, const uint8_t *aad,
                                                              size_t aad_len, uint8_t *pt, size_t cap)
{
    const ks_aead_key ak = {env->algorithm, k->aead_key, k->aes, k->evp, k->serial};
    if (ks_aead_decrypt(KS_AEAD_AUTO, &ak, pt, env->ciphertext.ptr, env->ciphertext.len, aad, aad_len,
                        env->nonce.ptr) != 0) {
        if (pt != NULL) {
            sodium_memzero(pt, cap);
        }
        return auth_failed(ctx, CAUSE_AEAD);
    }
    return KS_OK;
}

/* aead_open() under env's data AAD [F-CRYPTO-AAD-1] with context, from
 * k's head when it has one (a shard slot's: env's, C being its
 * commitment), else from env's fields: the AAD that decrypt() does not
 * build in the slot. */
static __attribute__((noinline)) ks_err aead_open_large(ks_ctx *ctx, const ks_envelope *env, ks_bytes context,
                                                       const rkeys *k, uint8_t *pt, size_t cap)
{
    uint8_t aad[KS_DATA_AAD_MAX];
    size_t aad_len = 0;
    ks_err err = KS_OK;
    if (k->aad != NULL) {
        aad_len = head_and_context(aad, k->aad, k->aad_len, context); /* [F-CRYPTO-AAD-1] */
    } else {
        err = ks_aad_data(env, context, aad, sizeof aad, &aad_len); /* [F-CRYPTO-AAD-1] */
    }
    return err != KS_OK ? err : aead_open(ctx, env, k, aad, aad_len, pt, cap);
}

/* Check the commitment (v2) and decrypt env's ciphertext into pt under
 * the read keys k [F-CRYPTO-OPEN-1]: the commitment is compared before
 * the AEAD runs, and a failed AEAD leaves pt[0, cap) zero.  pt NULL:
 * verify the tag only (ks_aead_decrypt()). */
static ks_err decrypt(ks_ctx *ctx, const ks_envelope *env, ks_bytes context, const rkeys *k,
                      uint8_t *pt, size_t cap)
{
    if (!commitment_ok(env, k)) {
        return auth_failed(ctx, CAUSE_COMMITMENT);
    }
    if (k->aad != NULL && context.len <= KS_AAD_CONTEXT_SMALL) {
        /* [F-CRYPTO-AAD-1] in the slot, after its head: env's, C being its commitment */
        const size_t aad_len = put_context(k->aad, k->aad_len, context);
        return aead_open(ctx, env, k, k->aad, aad_len, pt, cap);
    }
    return aead_open_large(ctx, env, context, k, pt, cap);
}

/*
 * The shard slot whose wrap identity is env's (parsed from buf) when it is
 * sh's last one, else NULL: buf is shaped like the slot's envelopes
 * (ks_envelope_like()), so it has their head and, for v2, their purpose.
 * (The wrap identity, wrap_key(), is those bytes, so this is the
 * comparison ks_shard_open_find() makes, without building the key.)  Its
 * expiry is the caller's to check.
 */
static ks_open_slot *last_slot(ks_shard *sh, const uint8_t *buf, const ks_envelope *env)
{
    ks_open_slot *o = sh != NULL ? ks_shard_open_last(sh) : NULL;
    return o != NULL && ks_envelope_like(buf, env->total_len, &o->head, o->id + o->head_at) ? o : NULL;
}

/*
 * The read keys of env (parsed from buf) for an open on thread index ti,
 * whose shard is sh (NULL: none), when sh's last slot does not hold them
 * (open_keys()): from another slot of sh, else through read_keys() (then
 * kept in the shard, if ti has one and the read cache is on).  *k views
 * the shard slot, keys[] or a pin (*pin, which the caller drops).  *wrote
 * is 0 when keys[] was left untouched (a shard hit), else 1: the caller
 * wipes it then.  Out of line: the last slot's hit is the hot path.
 */
static __attribute__((noinline)) ks_err find_keys(ks_ctx *ctx, uint32_t ti, ks_shard *sh, const uint8_t *buf,
                                                  const ks_envelope *env, uint8_t keys[KS_RKEYS_MAX],
                                                  ks_dek_cache_pin *pin, rkeys *k, int *wrote)
{
    *wrote = 0;
    uint8_t scratch[KS_WRAP_ID_MAX];
    const uint8_t *id = NULL;
    const size_t id_len = wrap_key(buf, env, scratch, &id);
    ks_open_slot *o = sh != NULL ? ks_shard_open_find(sh, id, id_len, ks_mono_seconds()) : NULL;
    if (o != NULL) {
        ks_ctx_count(ctx, ti, KS_COUNT_SHARD_HIT);
        *k = rkeys_slot(env, o);
        return KS_OK;
    }
    /* v1 aes-256-gcm without a shard: the cache's pinned expanded key (a
     * v2 open also needs C, so it copies the keys) */
    *wrote = 1;
    uint64_t expires = 0;
    const int aes = env->algorithm == KS_ALG_AES256GCM;
    const int pinned = sh == NULL && aes && env->version == KS_FORMAT_V1;
    ks_err err = read_keys(ctx, env, id, id_len, keys, &expires, pinned ? pin : NULL);
    if (err != KS_OK) {
        return err;
    }
    if (pin->state != NULL) {
        *k = (rkeys){NULL, NULL, NULL, pin->state, NULL, 0, NULL, 0}; /* v1 aes: only the expanded key */
        return KS_OK;
    }
    if (sh != NULL) {
        ks_envelope_head head;
        ks_envelope_head_of(buf, env, &head);
        o = ks_shard_open_put(sh, id, id_len, &head, id_len - head.len, buf, keys, rkeys_len(env), expires,
                              aes);
        if (o != NULL) {
            slot_aad_head(o, env);
        }
    }
    *k = o != NULL ? rkeys_slot(env, o) : rkeys_view(env, keys, NULL);
    return KS_OK;
}

/*
 * The read keys of env (parsed from buf) for an open on thread index ti
 * with shard sh, as find_keys() gives them: from hint, sh's last slot
 * when it holds env's wrap identity (parse_for_open() or last_slot()
 * found it; NULL: not), while it has not expired, else by find_keys().
 */
static inline ks_err open_keys(ks_ctx *ctx, uint32_t ti, ks_shard *sh, ks_open_slot *hint, const uint8_t *buf,
                               const ks_envelope *env, uint8_t keys[KS_RKEYS_MAX], ks_dek_cache_pin *pin,
                               rkeys *k, int *wrote)
{
    if (hint != NULL && ks_mono_seconds() < hint->expires) {
        *wrote = 0;
        ks_ctx_count(ctx, ti, KS_COUNT_SHARD_HIT);
        *k = rkeys_slot(env, hint);
        return KS_OK;
    }
    return find_keys(ctx, ti, sh, buf, env, keys, pin, k, wrote);
}

/* The arguments every open checks: nonzero when usable. */
static int open_args_ok(const ks_ctx *ctx, const ks_open_params *p, int check_only, const uint8_t *pt,
                        const size_t *pt_len, size_t cap)
{
    return ctx != NULL && p != NULL && (check_only || (pt_len != NULL && (pt != NULL || cap == 0))) &&
           view_ok(p->context) && p->context.len <= KS_CONTEXT_MAX && view_ok(p->tenant) &&
           view_ok(p->purpose);
}

/* The open of e, parsed strictly from buf (ks_envelope_parse), after its
 * parse, on thread index ti with shard sh and hint as open_keys() takes
 * them: the binding checks, the read keys and the AEAD, in the order of
 * [F-CRYPTO-OPEN-1]; with check_only the tag alone (pt, cap and pt_len
 * unused).  The stack copy of the read keys is wiped whenever open_keys
 * wrote it (on a shard hit it does not: the keys stay in the shard). */
static ks_err open_parsed(ks_ctx *ctx, uint32_t ti, ks_shard *sh, ks_open_slot *hint, const uint8_t *buf,
                          const ks_envelope *e, const ks_open_params *p, int check_only, uint8_t *pt,
                          size_t cap, size_t *pt_len)
{
    if (!check_only && e->ciphertext.len - KS_TAG_LEN > cap) {
        return KS_ERR_BUFFER_TOO_SMALL;
    }
    if (!binding_ok(e, p)) {
        return auth_failed(ctx, CAUSE_BINDING);
    }
    if (!alg_available(e->algorithm)) {
        return KS_ERR_ALGORITHM_UNAVAILABLE;
    }
    uint8_t keys[KS_RKEYS_MAX];
    ks_dek_cache_pin pin = {NULL, 0};
    rkeys k;
    int wrote = 1;
    ks_err err = open_keys(ctx, ti, sh, hint, buf, e, keys, &pin, &k, &wrote);
    if (err == KS_OK) {
        err = decrypt(ctx, e, p->context, &k, check_only ? NULL : pt, cap);
    }
    if (pin.state != NULL) {
        ks_dek_cache_unpin(ctx->cache, &pin); /* keys was not written */
    } else if (wrote) {
        sodium_memzero(keys, sizeof keys);
    }
    if (err == KS_OK) {
        if (!check_only) {
            *pt_len = e->ciphertext.len - KS_TAG_LEN;
        }
        ks_ctx_count(ctx, ti, KS_COUNT_OPEN);
    }
    return err;
}

/*
 * Parse env[0, len) strictly into *e for an open on shard sh (NULL:
 * none).  When env is shaped like the envelopes of sh's last read keys
 * (their header, but for the nonce's and commitment's values), only its
 * ciphertext field is parsed (ks_envelope_parse_like(): the same result
 * as a whole parse, in a fraction of the work), and *hint is that slot,
 * whose wrap identity env has; else the whole envelope is parsed and
 * *hint is NULL.
 */
static ks_err parse_for_open(ks_shard *sh, const uint8_t *env, size_t len, ks_envelope *e,
                             ks_parse_error *perr, ks_open_slot **hint)
{
    ks_open_slot *o = sh != NULL ? ks_shard_open_last(sh) : NULL;
    int like = 0;
    const ks_err err = o != NULL
                           ? ks_envelope_parse_like(env, len, NULL, &o->head, o->id + o->head_at, e, perr, &like)
                           : ks_envelope_parse(env, len, NULL, e, perr);
    *hint = like ? o : NULL;
    return err;
}

/* ks_open, or with check_only ks_verify, without the latency histogram:
 * the arguments, the strict parse, then open_parsed(). */
static inline __attribute__((always_inline)) ks_err open_call(ks_ctx *ctx, const uint8_t *env, size_t env_len,
                                                              const ks_open_params *p, int check_only,
                                                              uint8_t *pt, size_t cap, size_t *pt_len,
                                                              ks_parse_error *perr)
{
    if (!open_args_ok(ctx, p, check_only, pt, pt_len, cap)) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    const uint32_t ti = ks_thread_index();
    ks_shard *sh = ctx->cache != NULL ? ks_ctx_shard(ctx, ti) : NULL;
    ks_open_slot *hint = NULL;
    ks_envelope e;
    ks_err err = parse_for_open(sh, env, env_len, &e, perr, &hint);
    if (err != KS_OK) {
        return parse_failed(ctx, err);
    }
    return open_parsed(ctx, ti, sh, hint, env, &e, p, check_only, pt, cap, pt_len);
}

/* Count a latency of (now - t0) ns in this thread's seal (seal != 0) or
 * open histogram and add it to its sum: per thread index, as the counts
 * are, so that threads timing their calls share no cache line (shared
 * atomic adds held two threads' app opens to under one thread's rate). */
static void time_since(ks_ctx *ctx, int seal, uint64_t t0)
{
    uint64_t t1 = ks_mono_ns();
    uint64_t ns = t1 > t0 ? t1 - t0 : 0;
    const uint32_t t = ks_thread_index();
    _Atomic uint64_t *hist = seal ? ctx->ops[t].seal_hist : ctx->ops[t].open_hist;
    ks_ctx_add(&hist[ks_histogram_bucket_of(ns)], t, 1);
    ks_ctx_add(&hist[KS_CTX_HIST_SUM], t, ns);
}

/* See keyshift/crypto.h.  Timed only with cfg.latency_histograms, so the
 * default costs no clock read. */
ks_err ks_seal(ks_ctx *ctx, const ks_seal_params *p, const uint8_t *pt, size_t pt_len, uint8_t *out,
               size_t cap, size_t *out_len)
{
    /* one call site, so that seal_call is inlined here */
    const int timed = ctx != NULL && ctx->cfg.latency_histograms;
    const uint64_t t0 = timed ? ks_mono_ns() : 0;
    ks_err err = seal_call(ctx, p, pt, pt_len, out, cap, out_len);
    if (timed) {
        time_since(ctx, 1, t0);
    }
    return err;
}

/* open_call, timed into the open histogram as ks_seal is. */
static ks_err timed_open(ks_ctx *ctx, const uint8_t *env, size_t env_len, const ks_open_params *p,
                         int check_only, uint8_t *pt, size_t cap, size_t *pt_len, ks_parse_error *perr)
{
    const int timed = ctx != NULL && ctx->cfg.latency_histograms;
    const uint64_t t0 = timed ? ks_mono_ns() : 0;
    ks_err err = open_call(ctx, env, env_len, p, check_only, pt, cap, pt_len, perr);
    if (timed) {
        time_since(ctx, 0, t0);
    }
    return err;
}

/* See keyshift/crypto.h. */
ks_err ks_open(ks_ctx *ctx, const uint8_t *env, size_t env_len, const ks_open_params *p, uint8_t *pt,
               size_t cap, size_t *pt_len, ks_parse_error *perr)
{
    return timed_open(ctx, env, env_len, p, 0, pt, cap, pt_len, perr);
}

/* See keyshift/crypto.h. */
ks_err ks_verify(ks_ctx *ctx, const uint8_t *env, size_t env_len, const ks_open_params *p,
                 ks_parse_error *perr)
{
    return timed_open(ctx, env, env_len, p, 1, NULL, 0, NULL, perr);
}

/* See open_parsed.h. */
ks_err ks_crypto_open_parsed(ks_ctx *ctx, const uint8_t *buf, const ks_envelope *e, const ks_open_params *p,
                             uint8_t *pt, size_t cap, size_t *pt_len)
{
    if (buf == NULL || e == NULL || !open_args_ok(ctx, p, 0, pt, pt_len, cap)) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    assert(e->wrapped_dek.ptr > buf && e->ciphertext.ptr > e->wrapped_dek.ptr); /* parsed from buf */
    const uint32_t ti = ks_thread_index();
    ks_shard *sh = ctx->cache != NULL ? ks_ctx_shard(ctx, ti) : NULL;
    ks_open_slot *hint = last_slot(sh, buf, e);
    if (!ctx->cfg.latency_histograms) {
        return open_parsed(ctx, ti, sh, hint, buf, e, p, 0, pt, cap, pt_len);
    }
    uint64_t t0 = ks_mono_ns();
    ks_err err = open_parsed(ctx, ti, sh, hint, buf, e, p, 0, pt, cap, pt_len);
    time_since(ctx, 0, t0);
    return err;
}

/* See open_parsed.h. */
ks_err ks_crypto_parse(ks_ctx *ctx, const uint8_t *buf, size_t len, ks_envelope *e, ks_parse_error *perr)
{
    ks_shard *sh = ctx != NULL && ctx->cache != NULL ? ks_ctx_shard(ctx, ks_thread_index()) : NULL;
    ks_open_slot *hint = NULL;
    return parse_for_open(sh, buf, len, e, perr, &hint);
}

/* ---- rewrapping ---------------------------------------------------------- */

/* The rewrap memo key: u32be(id length) || id || u32be(requested
 * version) || target key_id; unambiguous, since only the last part is
 * not length-delimited.  Returns its length. */
static size_t memo_key(const uint8_t *id, size_t id_len, const ks_envelope *target, uint32_t requested,
                       uint8_t *out)
{
    ks_be_put(out, (uint32_t)id_len, 4);
    memcpy(out + 4, id, id_len);
    ks_be_put(out + 4 + id_len, requested, 4);
    memcpy(out + 8 + id_len, target->key_id.ptr, target->key_id.len);
    return 8 + id_len + target->key_id.len;
}

/*
 * Wrap dek for target (key_id set; key_version resolved here from
 * `requested`), filling target->key_version and target->wrapped_dek (a
 * view into buf[0, KS_MEMO_VAL_MAX)).  Memoised [F-CRYPTO-REWRAP-1]: the
 * same wrap identity and target give the same wrapped bytes without a
 * provider call, so wrap calls grow with distinct DEKs, not envelopes.
 * The memo is bounded and expires like the read cache (cache_entries,
 * cache_ttl): a change of the target's primary or state is seen within
 * cache_ttl seconds.
 */
static ks_err rewrap_dek(ks_ctx *ctx, const uint8_t *id, size_t id_len, uint32_t requested,
                         const uint8_t *dek, ks_envelope *target, uint8_t *buf)
{
    uint8_t mk[KS_MEMO_KEY_MAX];
    size_t mk_len = memo_key(id, id_len, target, requested, mk), got = 0;
    if (ks_dek_cache_get(ctx->memo, mk, mk_len, buf, &got)) {
        target->key_version = (uint32_t)ks_be_get(buf, 4);
        target->wrapped_dek = (ks_bytes){buf + 4, got - 4};
        return KS_OK;
    }
    ks_err err = resolve_version(ctx, target->key_id, requested, &target->key_version);
    size_t wrapped_len = 0;
    if (err == KS_OK) {
        err = wrap_dek(ctx, target, dek, buf + 4, &wrapped_len);
    }
    if (err != KS_OK) {
        return err;
    }
    ks_be_put(buf, target->key_version, 4);
    target->wrapped_dek = (ks_bytes){buf + 4, wrapped_len};
    ks_dek_cache_put(ctx->memo, mk, mk_len, buf, 4 + wrapped_len, 0);
    return KS_OK;
}

/* See keyshift/crypto.h [F-CRYPTO-REWRAP-1]. */
ks_err ks_rewrap(ks_ctx *ctx, const uint8_t *env, size_t env_len, const ks_rewrap_params *p,
                 uint8_t *out, size_t cap, size_t *out_len, ks_parse_error *perr)
{
    ks_envelope e, target;
    uint8_t keys[KS_RKEYS_MAX];
    uint8_t scratch[KS_WRAP_ID_MAX];
    uint8_t buf[KS_MEMO_VAL_MAX];
    const uint8_t *id = NULL;
    uint64_t expires = 0;
    if (ctx == NULL || p == NULL || out_len == NULL || (out == NULL && cap != 0) ||
        !view_ok(p->key_id)) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    ks_err err = ks_envelope_parse(env, env_len, NULL, &e, perr);
    if (err != KS_OK) {
        return parse_failed(ctx, err);
    }
    target = e;
    if (p->key_id.len != 0) {
        target.key_id = p->key_id;
    }
    target.key_version = p->key_version ? p->key_version : 1;
    if (ks_envelope_check(&target, NULL) != KS_OK) {
        return KS_ERR_INVALID_ARGUMENT; /* a target key_id outside [F-KEYID-1] */
    }
    const size_t id_len = wrap_key(env, &e, scratch, &id);
    err = read_keys(ctx, &e, id, id_len, keys, &expires, NULL);
    const rkeys k = rkeys_view(&e, keys, NULL);
    if (err == KS_OK && !commitment_ok(&e, &k)) {
        err = auth_failed(ctx, CAUSE_COMMITMENT);
    }
    if (err == KS_OK) {
        err = rewrap_dek(ctx, id, id_len, p->key_version, k.dek, &target, buf);
    }
    sodium_memzero(keys, sizeof keys);
    if (err == KS_OK) {
        err = ks_envelope_encode(&target, NULL, out, cap, out_len);
    }
    if (err == KS_OK) {
        BUMP(ctx, rewraps);
    }
    return err;
}
