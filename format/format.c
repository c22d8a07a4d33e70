/*
 * format/format.c -- constants of the wire format: algorithms, limits,
 * error names and the library version.
 */
#include <string.h>

#include <keyshift/envelope.h>

#include "rules.h"

/* See keyshift/common.h. */
const char *ks_version(void)
{
    return KS_VERSION_STRING;
}

/* See keyshift/error.h.  The names are part of the stable interface
 * (docs/format.md section 5): never rename one. */
const char *ks_err_name(ks_err err)
{
    switch (err) {
    case KS_OK: return "ok";
    case KS_ERR_TRUNCATED: return "truncated";
    case KS_ERR_BAD_MAGIC: return "bad-magic";
    case KS_ERR_UNSUPPORTED_VERSION: return "unsupported-version";
    case KS_ERR_WIRE_TYPE: return "wire-type";
    case KS_ERR_NONCANONICAL_VARINT: return "noncanonical-varint";
    case KS_ERR_VARINT_OVERFLOW: return "varint-overflow";
    case KS_ERR_FIELD_ORDER: return "field-order";
    case KS_ERR_UNKNOWN_FIELD: return "unknown-field";
    case KS_ERR_MISSING_FIELD: return "missing-field";
    case KS_ERR_TOO_LARGE: return "too-large";
    case KS_ERR_BAD_VALUE: return "bad-value";
    case KS_ERR_INVALID_ARGUMENT: return "invalid-argument";
    case KS_ERR_BUFFER_TOO_SMALL: return "buffer-too-small";
    case KS_ERR_AUTH_FAILED: return "auth-failed";
    case KS_ERR_ALGORITHM_UNAVAILABLE: return "algorithm-unavailable";
    case KS_ERR_NO_MEMORY: return "no-memory";
    case KS_ERR_CRYPTO_INIT: return "crypto-init";
    case KS_ERR_UNAVAILABLE: return "unavailable";
    case KS_ERR_TIMEOUT: return "timeout";
    case KS_ERR_DENIED: return "denied";
    case KS_ERR_REVOKED: return "revoked";
    case KS_ERR_NOT_FOUND: return "not-found";
    case KS_ERR_INTEGRITY: return "integrity";
    case KS_ERR_INSECURE: return "insecure";
    case KS_ERR_IO: return "io";
    case KS_ERR_BAD_PASSPHRASE: return "bad-passphrase";
    case KS_ERR_EXISTS: return "exists";
    case KS_ERR_STATE: return "state";
    case KS_ERR_NO_TARGET: return "no-target";
    case KS_ERR_BUSY: return "busy";
    case KS_ERR_FULL: return "full";
    case KS_ERR_STORE: return "store";
    case KS_ERR_MISMATCH: return "mismatch";
    case KS_ERR_THRESHOLD: return "threshold";
    case KS_ERR_STOPPED: return "stopped";
    case KS_ERR_UNSTABLE_ID: return "unstable-id";
    case KS_ERR_VERIFY_FAILED: return "verify-failed";
    case KS_ERR_GUARD: return "guard";
    case KS_ERR_NO_ROLLOUT: return "no-rollout";
    case KS_ERR_ROLLOUT_EXISTS: return "rollout-exists";
    case KS_ERR_STALE: return "stale";
    case KS_ERR_PHASE: return "phase";
    case KS_ERR_CONFLICT: return "conflict";
    }
    return "unknown-error";
}

/* See keyshift/error.h. */
int ks_err_is_rejection(ks_err err)
{
    return err >= KS_ERR_TRUNCATED && err <= KS_ERR_BAD_VALUE;
}

/* See keyshift/error.h. */
int ks_err_is_retryable(ks_err err)
{
    return err == KS_ERR_UNAVAILABLE || err == KS_ERR_TIMEOUT;
}

/* See keyshift/envelope.h [F-ALG-1]. */
const char *ks_alg_name(uint32_t alg)
{
    switch (alg) {
    case KS_ALG_AES256GCM: return "aes-256-gcm";
    case KS_ALG_XCHACHA20POLY1305: return "xchacha20-poly1305";
    default: return NULL;
    }
}

/* See keyshift/envelope.h. */
uint32_t ks_alg_from_name(const char *name)
{
    if (name == NULL) {
        return 0;
    }
    for (uint32_t alg = KS_ALG_AES256GCM; alg <= KS_ALG_XCHACHA20POLY1305; alg++) {
        if (strcmp(name, ks_alg_name(alg)) == 0) {
            return alg;
        }
    }
    return 0;
}

/* See keyshift/envelope.h [F-NONCE-1]. */
size_t ks_alg_nonce_len(uint32_t alg)
{
    return ks_rules_nonce_len(alg);
}

/* See keyshift/envelope.h [F-LIMITS-1]. */
void ks_limits_default(ks_limits *out)
{
    out->max_tenant = KS_TENANT_MAX;
    out->max_key_id = KS_KEY_ID_MAX;
    out->max_wrapped_dek = KS_WRAPPED_DEK_MAX;
    out->max_purpose = KS_PURPOSE_MAX;
    out->max_ciphertext = KS_CIPHERTEXT_DEFAULT_MAX;
}

/* Nonzero when lo <= v <= hi. */
static int in_range(size_t v, size_t lo, size_t hi)
{
    return v >= lo && v <= hi;
}

/* See keyshift/envelope.h [F-LIMITS-2]: limits may be lowered, never raised
 * above the compiled maximums nor below the format's minimums. */
ks_err ks_limits_check(const ks_limits *lim)
{
    if (lim == NULL) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    if (!in_range(lim->max_tenant, 1, KS_TENANT_MAX) || !in_range(lim->max_key_id, 1, KS_KEY_ID_MAX) ||
        !in_range(lim->max_wrapped_dek, 1, KS_WRAPPED_DEK_MAX) ||
        !in_range(lim->max_purpose, 1, KS_PURPOSE_MAX) ||
        !in_range(lim->max_ciphertext, KS_TAG_LEN, KS_CIPHERTEXT_HARD_MAX)) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    return KS_OK;
}

/* Bytes taken by a length-delimited field of n bytes with a one-byte tag. */
static size_t len_field_size(size_t n)
{
    return 1 + ks_varint_len(n) + n;
}

/* See keyshift/envelope.h: the size of a v2 envelope with every field at
 * its limit (v2 is a superset of v1), with the largest algorithm nonce. */
size_t ks_envelope_max_len(const ks_limits *lim)
{
    ks_limits defaults;
    if (lim == NULL) {
        ks_limits_default(&defaults);
        lim = &defaults;
    }
    if (ks_limits_check(lim) != KS_OK) {
        return 0;
    }
    return KS_PREFIX_LEN + 2 /* algorithm */ + len_field_size(lim->max_tenant) +
           len_field_size(lim->max_key_id) + 1 + 5 /* key_version */ +
           len_field_size(lim->max_wrapped_dek) + len_field_size(KS_XCHACHA20POLY1305_NONCE_LEN) +
           len_field_size(lim->max_purpose) + len_field_size(KS_COMMITMENT_LEN) +
           len_field_size(lim->max_ciphertext);
}
