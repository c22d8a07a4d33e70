/*
 * keyshift/aad.h -- the associated data that binds an envelope's
 * ciphertext and its wrapped DEK to their context (docs/format.md
 * section 7).  Pure byte layout: no cryptography, no allocation.
 *
 * Data AAD (the AEAD over the payload) [F-CRYPTO-AAD-1]:
 *     "KSE" || version || u32be(algorithm) || lp(tenant)
 *     || (v2 only) lp(purpose) || commitment(32)
 *     || lp(context)
 * It does not cover key_id, key_version or wrapped_dek, so a rewrap under
 * another KEK version changes only those three fields.
 *
 * Wrap AAD (bound by the key provider when it wraps the DEK) [F-CRYPTO-AAD-2]:
 *     "KSW" || version || u32be(algorithm) || lp(tenant) || lp(key_id)
 *     || u32be(key_version) || (v2 only) lp(purpose)
 *
 * where lp(x) = u32be(len(x)) || x, and u32be is four bytes, big-endian.
 */
#ifndef KEYSHIFT_AAD_H
#define KEYSHIFT_AAD_H

#include <keyshift/common.h>
#include <keyshift/envelope.h>
#include <keyshift/error.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The most bytes of caller context bound into a data AAD. */
#define KS_CONTEXT_MAX 4096

/* Upper bounds of the two AADs, for caller buffers. */
#define KS_DATA_AAD_MAX                                                                          \
    (4 + 4 + 4 + KS_TENANT_MAX + 4 + KS_PURPOSE_MAX + KS_COMMITMENT_LEN + 4 + KS_CONTEXT_MAX)
#define KS_WRAP_AAD_MAX (4 + 4 + 4 + KS_TENANT_MAX + 4 + KS_KEY_ID_MAX + 4 + 4 + KS_PURPOSE_MAX)

/*
 * Write the data AAD of env (version, algorithm, tenant, and for v2 purpose
 * and commitment) and context into out[0, cap); its length goes to
 * *out_len.  KS_ERR_INVALID_ARGUMENT for a version other than 1 or 2, a
 * context over KS_CONTEXT_MAX or NULL pointers; KS_ERR_BUFFER_TOO_SMALL
 * when cap is short (nothing written).  The fields are not otherwise
 * checked: the caller has parsed or checked env.
 */
KS_API KS_WUR ks_err ks_aad_data(const ks_envelope *env, ks_bytes context, uint8_t *out, size_t cap,
                                 size_t *out_len);

/* Write the wrap AAD of env (version, algorithm, tenant, key_id,
 * key_version, and for v2 purpose) into out[0, cap).  Errors as above. */
KS_API KS_WUR ks_err ks_aad_wrap(const ks_envelope *env, uint8_t *out, size_t cap, size_t *out_len);

#ifdef __cplusplus
}
#endif
#endif /* KEYSHIFT_AAD_H */
