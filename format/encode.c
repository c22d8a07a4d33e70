/*
 * format/encode.c -- the canonical envelope encoder.
 *
 * The encoder writes exactly the form the parser accepts [F-CANON-1]: the
 * version's fields in table order, one-byte tags, minimal varints.  It
 * validates the struct against the same rules (format/rules.h) first, so it
 * cannot produce bytes that would not parse back.  It writes only into the
 * caller's buffer and allocates nothing.
 */
#include <string.h>

#include <keyshift/envelope.h>

#include "rules.h"

/* Check one field of env against rule r; returns what the parser would say
 * of its encoding. */
static ks_err check_field(const ks_field_rule *r, const ks_limits *lim, ks_envelope *env)
{
    if (r->wire == KS_WIRE_VARINT) {
        return ks_rules_check_varint(r, *ks_rules_u32(env, r));
    }
    const ks_bytes *v = ks_rules_bytes(env, r);
    ks_err e = ks_rules_check_len(r, lim, ks_alg_nonce_len(env->algorithm), v->len);
    if (e != KS_OK) {
        return e;
    }
    if ((r->kind == KS_RULE_NAME || r->kind == KS_RULE_KEY_ID) &&
        ks_rules_charset_scan(r->kind, v->ptr, v->len) != v->len) {
        return KS_ERR_BAD_VALUE;
    }
    return KS_OK;
}

/* Nonzero when a view is a valid (ptr, len) pair: NULL only when empty. */
static int view_ok(const ks_bytes *v)
{
    return v->ptr != NULL || v->len == 0;
}

/* See keyshift/envelope.h. */
ks_err ks_envelope_check(const ks_envelope *env, const ks_limits *lim)
{
    ks_limits defaults;
    if (env == NULL) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    if (lim == NULL) {
        ks_limits_default(&defaults);
        lim = &defaults;
    }
    if (ks_limits_check(lim) != KS_OK) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    /* A private copy: the shared accessors take a mutable envelope, and the
     * copy keeps the caller's struct read-only by construction. */
    ks_envelope copy = *env;
    size_t count;
    const ks_field_rule *rules = ks_rules_for(env->version, &count);
    if (rules == NULL) {
        return KS_ERR_UNSUPPORTED_VERSION; /* [F-FRAME-2] */
    }
    if (!view_ok(&env->tenant) || !view_ok(&env->key_id) || !view_ok(&env->wrapped_dek) ||
        !view_ok(&env->nonce) || !view_ok(&env->purpose) || !view_ok(&env->commitment) ||
        !view_ok(&env->ciphertext)) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    if (env->version == KS_FORMAT_V1 && (env->purpose.len != 0 || env->commitment.len != 0)) {
        return KS_ERR_UNKNOWN_FIELD; /* [F-UNKNOWN-1] v2-only fields in v1 */
    }
    for (size_t i = 0; i < count; i++) {
        ks_err err = check_field(&rules[i], lim, &copy);
        if (err != KS_OK) {
            return err;
        }
    }
    return KS_OK;
}

/* See keyshift/envelope.h. */
ks_err ks_envelope_encoded_len(const ks_envelope *env, const ks_limits *lim, size_t *out_len)
{
    ks_err err = ks_envelope_check(env, lim);
    if (err != KS_OK) {
        return err;
    }
    if (out_len == NULL) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    ks_envelope copy = *env;
    size_t count;
    const ks_field_rule *rules = ks_rules_for(env->version, &count);
    size_t n = KS_PREFIX_LEN;
    for (size_t i = 0; i < count; i++) {
        /* [F-VARINT-5] field numbers <= 15 give one-byte tags. */
        if (rules[i].wire == KS_WIRE_VARINT) {
            n += 1 + ks_varint_len(*ks_rules_u32(&copy, &rules[i]));
        } else {
            size_t len = ks_rules_bytes(&copy, &rules[i])->len;
            n += 1 + ks_varint_len(len) + len;
        }
    }
    *out_len = n;
    return KS_OK;
}

/* See keyshift/envelope.h. */
ks_err ks_envelope_encode(const ks_envelope *env, const ks_limits *lim, uint8_t *buf, size_t cap,
                          size_t *out_len)
{
    size_t need;
    ks_err err = ks_envelope_encoded_len(env, lim, &need);
    if (err != KS_OK) {
        return err;
    }
    if (out_len == NULL || (buf == NULL && cap != 0)) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    if (need > cap) {
        return KS_ERR_BUFFER_TOO_SMALL;
    }
    ks_envelope copy = *env;
    size_t count;
    const ks_field_rule *rules = ks_rules_for(env->version, &count);
    size_t pos = 0;
    buf[pos++] = KS_MAGIC_0;
    buf[pos++] = KS_MAGIC_1;
    buf[pos++] = KS_MAGIC_2;
    buf[pos++] = env->version;
    for (size_t i = 0; i < count; i++) {
        const ks_field_rule *r = &rules[i];
        buf[pos++] = (uint8_t)(r->number << 3 | r->wire);
        if (r->wire == KS_WIRE_VARINT) {
            pos += ks_varint_put(buf + pos, *ks_rules_u32(&copy, r));
        } else {
            const ks_bytes *v = ks_rules_bytes(&copy, r);
            pos += ks_varint_put(buf + pos, v->len);
            if (v->len != 0) {
                memcpy(buf + pos, v->ptr, v->len);
            }
            pos += v->len;
        }
    }
    assert(pos == need);
    *out_len = pos;
    return KS_OK;
}
