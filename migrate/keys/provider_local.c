/*
 * migrate/keys/provider_local.c -- the "local" key provider over a ks_keyring
 * (include/keyshift/keyring.h, docs/keyring.md section 7).
 *
 * A wrapped DEK is wn || XChaCha20-Poly1305-IETF(KEK, wn, DEK, aad), with
 * wn 24 fresh random bytes: KS_LOCAL_WRAPPED_LEN = 72 bytes [K-WRAP-1].
 * The KEK is used in place, in the keyring's guarded memory, under the
 * keyring's read lock (ks_keyring_use); it is never copied.  The provider
 * only borrows the keyring: destroying it does not close the keyring.
 * Calls never block for long (no I/O), so timeouts are ignored.
 */
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include <keyshift/keyring.h>
#include <keyshift/provider.h>

#include "keyring_format.h"
#include "provider_internal.h"

#define WRAP_NONCE_LEN crypto_aead_xchacha20poly1305_ietf_NPUBBYTES

/* Nonzero when a view is {NULL, 0} or points at its bytes. */
static int view_ok(ks_bytes b)
{
    return b.ptr != NULL || b.len == 0;
}

/* The arguments of one wrap or unwrap, for the ks_keyring_use callback. */
typedef struct wrap_call {
    const uint8_t *dek_in;   /* wrap: the DEK */
    uint8_t *dek_out;        /* unwrap: where the DEK goes */
    ks_bytes aad;
    ks_bytes wrapped;        /* unwrap: the blob */
    uint8_t *out;            /* wrap: where the blob goes */
    size_t cap;
    size_t *out_len;
} wrap_call;

/* Version `version` of key in *v, if its state allows the operation. */
static ks_err usable_version(const ks_krf_key *key, uint32_t version, int for_wrap,
                             const ks_krf_version **v)
{
    *v = &key->versions[version - 1];
    return ks_key_state_usable((*v)->state, for_wrap);
}

/* Wrap under version `version` of key [K-WRAP-1]: a fresh random nonce,
 * then the AEAD of the DEK with the caller's AAD. */
static ks_err wrap_with(void *ctx, const ks_krf_key *key, uint32_t version)
{
    wrap_call *w = ctx;
    const ks_krf_version *v;
    unsigned long long clen = 0;
    const ks_err e = usable_version(key, version, 1, &v);

    if (e != KS_OK) {
        return e;
    }
    if (w->cap < KS_LOCAL_WRAPPED_LEN) {
        return KS_ERR_BUFFER_TOO_SMALL;
    }
    randombytes_buf(w->out, WRAP_NONCE_LEN);
    crypto_aead_xchacha20poly1305_ietf_encrypt(w->out + WRAP_NONCE_LEN, &clen, w->dek_in, KS_DEK_LEN,
                                               w->aad.ptr, w->aad.len, NULL, w->out, v->material);
    *w->out_len = WRAP_NONCE_LEN + (size_t)clen;
    return KS_OK;
}

/* Unwrap under version `version` of key [K-WRAP-2]: any blob that is not
 * exactly 72 bytes or does not authenticate with the AAD is auth-failed. */
static ks_err unwrap_with(void *ctx, const ks_krf_key *key, uint32_t version)
{
    wrap_call *w = ctx;
    const ks_krf_version *v;
    unsigned long long mlen = 0;
    const ks_err e = usable_version(key, version, 0, &v);

    if (e != KS_OK) {
        return e;
    }
    if (w->wrapped.len != KS_LOCAL_WRAPPED_LEN) {
        return KS_ERR_AUTH_FAILED;
    }
    if (crypto_aead_xchacha20poly1305_ietf_decrypt(
            w->dek_out, &mlen, NULL, w->wrapped.ptr + WRAP_NONCE_LEN,
            KS_LOCAL_WRAPPED_LEN - WRAP_NONCE_LEN, w->aad.ptr, w->aad.len, w->wrapped.ptr,
            v->material) != 0) {
        return KS_ERR_AUTH_FAILED;
    }
    return mlen == KS_DEK_LEN ? KS_OK : KS_ERR_AUTH_FAILED;
}

/*
 * Test builds only (-DKS_TEST_HOOKS): KS_ERR_UNAVAILABLE for every wrap
 * and unwrap after the first KEYSHIFT_TEST_PROVIDER_FAIL_AFTER of this
 * process, as a key service going away mid-run would, so that CLI tests
 * see exit 69 from a real `keyshift migrate run`.  KS_OK otherwise, and
 * always in release builds, which never read the variable.
 */
static ks_err env_outage(void)
{
#ifdef KS_TEST_HOOKS
    static _Atomic long calls;
    const char *v = getenv("KEYSHIFT_TEST_PROVIDER_FAIL_AFTER");
    if (v != NULL && atomic_fetch_add(&calls, 1) >= atol(v)) {
        return KS_ERR_UNAVAILABLE;
    }
#endif
    return KS_OK;
}

/* The provider's wrap (keyshift/provider.h). */
static ks_err local_wrap(void *self, ks_bytes key_id, uint32_t key_version, const uint8_t *dek,
                         size_t dek_len, ks_bytes aad, uint8_t *out, size_t cap, size_t *out_len,
                         uint32_t timeout_ms)
{
    (void)timeout_ms; /* never blocks */
    if (self == NULL || key_version == 0 || dek == NULL || dek_len != KS_DEK_LEN || out == NULL ||
        out_len == NULL || !view_ok(aad) || !view_ok(key_id)) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    ks_err e = env_outage();
    if (e != KS_OK) {
        return e;
    }
    wrap_call w = {.dek_in = dek, .aad = aad, .out = out, .cap = cap, .out_len = out_len};
    return ks_keyring_use(self, key_id, key_version, wrap_with, &w);
}

/* The provider's unwrap (keyshift/provider.h).  dek is zeroed first and
 * again on any failure, so no partial result is ever left in it. */
static ks_err local_unwrap(void *self, ks_bytes key_id, uint32_t key_version, ks_bytes wrapped,
                           ks_bytes aad, uint8_t *dek, size_t dek_len, uint32_t timeout_ms)
{
    (void)timeout_ms;
    if (dek != NULL) {
        sodium_memzero(dek, dek_len);
    }
    if (self == NULL || key_version == 0 || dek == NULL || dek_len != KS_DEK_LEN ||
        !view_ok(wrapped) || !view_ok(aad) || !view_ok(key_id)) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    wrap_call w = {.dek_out = dek, .aad = aad, .wrapped = wrapped};
    ks_err e = env_outage();
    if (e == KS_OK) {
        e = ks_keyring_use(self, key_id, key_version, unwrap_with, &w);
    }
    if (e != KS_OK) {
        sodium_memzero(dek, dek_len);
    }
    return e;
}

/* Describe a version for key_info. */
static ks_err describe(void *ctx, const ks_krf_key *key, uint32_t version)
{
    ks_key_info *out = ctx;
    out->version = version;
    out->state = (ks_key_state)key->versions[version - 1].state;
    out->is_primary = version == key->primary;
    return KS_OK;
}

/* The provider's key_info (keyshift/provider.h): version 0 is the primary. */
static ks_err local_key_info(void *self, ks_bytes key_id, uint32_t key_version, ks_key_info *out,
                             uint32_t timeout_ms)
{
    (void)timeout_ms;
    if (self == NULL || out == NULL || !view_ok(key_id)) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    return ks_keyring_use(self, key_id, key_version, describe, out);
}

/* ---- key management (ks_provider_admin_ops): the keyring's changes -------- */

/* Create key_id in the keyring (ks_keyring_create). */
static ks_err local_create(void *self, ks_bytes key_id, uint32_t timeout_ms)
{
    (void)timeout_ms;
    return self == NULL ? KS_ERR_INVALID_ARGUMENT : ks_keyring_create(self, key_id);
}

/* Add a version (ks_keyring_add_version). */
static ks_err local_add_version(void *self, ks_bytes key_id, uint32_t *version, uint32_t timeout_ms)
{
    (void)timeout_ms;
    return self == NULL ? KS_ERR_INVALID_ARGUMENT : ks_keyring_add_version(self, key_id, version);
}

/* Promote a version (ks_keyring_promote). */
static ks_err local_promote(void *self, ks_bytes key_id, uint32_t version, uint32_t timeout_ms)
{
    (void)timeout_ms;
    return self == NULL ? KS_ERR_INVALID_ARGUMENT : ks_keyring_promote(self, key_id, version);
}

/* Change a version's state (ks_keyring_set_state). */
static ks_err local_set_state(void *self, ks_bytes key_id, uint32_t version, ks_key_state state,
                              uint32_t timeout_ms)
{
    (void)timeout_ms;
    return self == NULL ? KS_ERR_INVALID_ARGUMENT : ks_keyring_set_state(self, key_id, version, state);
}

/* Nonzero when a and b hold the same bytes. */
static int same_id(ks_bytes a, ks_bytes b)
{
    return a.len == b.len && (a.len == 0 || memcmp(a.ptr, b.ptr, a.len) == 0);
}

/* List the keyring's versions, keys in key_id order (the keyring's own
 * order, [K-KEY-3]); KS_ERR_NOT_FOUND when key_id names no key. */
static ks_err local_list(void *self, ks_bytes key_id, ks_key_list_fn fn, void *arg,
                         uint32_t timeout_ms)
{
    (void)timeout_ms;
    if (self == NULL || fn == NULL || !view_ok(key_id)) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    int found = 0;
    for (size_t i = 0, n = ks_keyring_count(self); i < n; i++) {
        ks_keyring_key k;
        if (ks_keyring_key_at(self, i, &k) != KS_OK) {
            return KS_ERR_INTEGRITY;
        }
        if (key_id.len != 0 && !same_id(k.key_id, key_id)) {
            continue;
        }
        found = 1;
        for (uint32_t v = 1; v <= k.versions; v++) {
            ks_keyring_version kv;
            if (ks_keyring_version_at(self, i, v, &kv) != KS_OK) {
                return KS_ERR_INTEGRITY;
            }
            ks_key_entry e = {k.key_id, v, kv.state, v == k.primary, kv.created};
            if (fn(arg, &e) != 0) {
                return KS_OK;
            }
        }
    }
    return key_id.len != 0 && !found ? KS_ERR_NOT_FOUND : KS_OK;
}

static const ks_provider_admin_ops local_admin = {
    .create = local_create,
    .add_version = local_add_version,
    .promote = local_promote,
    .set_state = local_set_state,
    .list = local_list,
};

static const ks_provider_ops local_ops = {
    .wrap = local_wrap,
    .unwrap = local_unwrap,
    .key_info = local_key_info,
    .destroy = NULL, /* the keyring is borrowed: its owner closes it */
    .admin = &local_admin,
};

/* See keyshift/keyring.h. */
ks_err ks_keyring_provider(ks_keyring *kr, ks_provider *out)
{
    if (kr == NULL || out == NULL) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    *out = (ks_provider){&local_ops, kr, "local"};
    return KS_OK;
}
