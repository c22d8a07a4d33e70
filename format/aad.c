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

/* The writers below append at p, into a caller buffer that the caller
 * has checked is large enough (the lengths are computed first, by
 * data_len and wrap_len), and return the end of what they wrote.  They
 * are inline so that each AAD is a handful of stores and short copies. */

/* Append n bytes. */
static inline uint8_t *put(uint8_t *p, const void *src, size_t n)
{
    if (n != 0) {
        memcpy(p, src, n);
    }
    return p + n;
}

/* Append a 32-bit big-endian integer. */
static inline uint8_t *put_u32(uint8_t *p, uint32_t v)
{
    ks_be_put(p, v, 4);
    return p + 4;
}

/* Append lp(x) = u32be(len) || x. */
static inline uint8_t *put_lp(uint8_t *p, ks_bytes x)
{
    return put(put_u32(p, (uint32_t)x.len), x.ptr, x.len);
}

/* Append the four-byte prefix: magic "KS", kind ('E' data, 'W' wrap),
 * version. */
static inline uint8_t *put_prefix(uint8_t *p, uint8_t kind, uint8_t version)
{
    const uint8_t prefix[KS_PREFIX_LEN] = {KS_MAGIC_0, KS_MAGIC_1, kind, version};
    return put(p, prefix, sizeof prefix);
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

/* Write the data AAD [F-CRYPTO-AAD-1] at p; returns its end. */
static uint8_t *write_data(uint8_t *p, const ks_envelope *env, ks_bytes context)
{
    p = put_prefix(p, KS_MAGIC_2, env->version);
    p = put_u32(p, env->algorithm);
    p = put_lp(p, env->tenant);
    if (env->version == KS_FORMAT_V2) {
        p = put_lp(p, env->purpose);
        p = put(p, env->commitment.ptr, KS_COMMITMENT_LEN);
    }
    return put_lp(p, context);
}

/* Write the wrap AAD [F-CRYPTO-AAD-2] at p; returns its end. */
static uint8_t *write_wrap(uint8_t *p, const ks_envelope *env)
{
    p = put_prefix(p, 'W', env->version);
    p = put_u32(p, env->algorithm);
    p = put_lp(p, env->tenant);
    p = put_lp(p, env->key_id);
    p = put_u32(p, env->key_version);
    if (env->version == KS_FORMAT_V2) {
        p = put_lp(p, env->purpose);
    }
    return p;
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
    const uint8_t *end = write_data(out, env, context);
    assert((size_t)(end - out) == n);
    (void)end;
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
    const uint8_t *end = write_wrap(out, env);
    assert((size_t)(end - out) == n);
    (void)end;
    *out_len = n;
    return KS_OK;
}
