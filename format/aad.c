/*
 * format/aad.c -- construction of the data and wrap AADs
 * (keyshift/aad.h, docs/format.md [F-CRYPTO-AAD-1], [F-CRYPTO-AAD-2]).
 *
 * Every variable part is length-prefixed, so no two distinct field tuples
 * give the same AAD bytes.
 */
#include <assert.h>
#include <string.h>

#include <keyshift/aad.h>

#include "rules.h"

/* A writer over a caller buffer that the caller has checked is large
 * enough (the lengths are computed first, by data_len and wrap_len). */
typedef struct aad_writer {
    uint8_t *buf;
    size_t len;
} aad_writer;

/* Append n bytes. */
static void put(aad_writer *w, const void *p, size_t n)
{
    if (n != 0) {
        memcpy(w->buf + w->len, p, n);
    }
    w->len += n;
}

/* Append a 32-bit big-endian integer. */
static void put_u32(aad_writer *w, uint32_t v)
{
    uint8_t b[4];
    ks_be_put(b, v, sizeof b);
    put(w, b, sizeof b);
}

/* Append lp(x) = u32be(len) || x. */
static void put_lp(aad_writer *w, ks_bytes x)
{
    put_u32(w, (uint32_t)x.len);
    put(w, x.ptr, x.len);
}

/* The length of the data AAD of env and context [F-CRYPTO-AAD-1]. */
static size_t data_len(const ks_envelope *env, ks_bytes context)
{
    size_t n = KS_PREFIX_LEN + 4 + 4 + env->tenant.len + 4 + context.len;
    if (env->version == KS_FORMAT_V2) {
        n += 4 + env->purpose.len + KS_COMMITMENT_LEN;
    }
    return n;
}

/* The length of the wrap AAD of env [F-CRYPTO-AAD-2]. */
static size_t wrap_len(const ks_envelope *env)
{
    size_t n = KS_PREFIX_LEN + 4 + 4 + env->tenant.len + 4 + env->key_id.len + 4;
    if (env->version == KS_FORMAT_V2) {
        n += 4 + env->purpose.len;
    }
    return n;
}

/* The data AAD [F-CRYPTO-AAD-1]. */
static void write_data(aad_writer *w, const ks_envelope *env, ks_bytes context)
{
    const uint8_t prefix[KS_PREFIX_LEN] = {KS_MAGIC_0, KS_MAGIC_1, KS_MAGIC_2, env->version};
    put(w, prefix, sizeof prefix);
    put_u32(w, env->algorithm);
    put_lp(w, env->tenant);
    if (env->version == KS_FORMAT_V2) {
        put_lp(w, env->purpose);
        put(w, env->commitment.ptr, KS_COMMITMENT_LEN);
    }
    put_lp(w, context);
}

/* The wrap AAD [F-CRYPTO-AAD-2]. */
static void write_wrap(aad_writer *w, const ks_envelope *env)
{
    const uint8_t prefix[KS_PREFIX_LEN] = {KS_MAGIC_0, KS_MAGIC_1, 'W', env->version};
    put(w, prefix, sizeof prefix);
    put_u32(w, env->algorithm);
    put_lp(w, env->tenant);
    put_lp(w, env->key_id);
    put_u32(w, env->key_version);
    if (env->version == KS_FORMAT_V2) {
        put_lp(w, env->purpose);
    }
}

/* Nonzero when the parts of env that an AAD reads are usable. */
static int env_ok(const ks_envelope *env, int data)
{
    if (env == NULL || (env->version != KS_FORMAT_V1 && env->version != KS_FORMAT_V2)) {
        return 0;
    }
    if (env->tenant.len > KS_TENANT_MAX || env->key_id.len > KS_KEY_ID_MAX ||
        env->purpose.len > KS_PURPOSE_MAX) {
        return 0;
    }
    if (data && env->version == KS_FORMAT_V2 &&
        (env->commitment.ptr == NULL || env->commitment.len != KS_COMMITMENT_LEN)) {
        return 0;
    }
    return 1;
}

/* See keyshift/aad.h. */
ks_err ks_aad_data(const ks_envelope *env, ks_bytes context, uint8_t *out, size_t cap,
                   size_t *out_len)
{
    if (!env_ok(env, 1) || context.len > KS_CONTEXT_MAX || out_len == NULL ||
        (context.ptr == NULL && context.len != 0)) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    const size_t n = data_len(env, context);
    if (n > cap || out == NULL) {
        return KS_ERR_BUFFER_TOO_SMALL;
    }
    aad_writer w = {out, 0};
    write_data(&w, env, context);
    assert(w.len == n);
    *out_len = n;
    return KS_OK;
}

/* See keyshift/aad.h. */
ks_err ks_aad_wrap(const ks_envelope *env, uint8_t *out, size_t cap, size_t *out_len)
{
    if (!env_ok(env, 0) || out_len == NULL) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    const size_t n = wrap_len(env);
    if (n > cap || out == NULL) {
        return KS_ERR_BUFFER_TOO_SMALL;
    }
    aad_writer w = {out, 0};
    write_wrap(&w, env);
    assert(w.len == n);
    *out_len = n;
    return KS_OK;
}
