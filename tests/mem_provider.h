/*
 * tests/mem_provider.h -- an in-memory key provider for tests and fuzz
 * harnesses, with fault injection the file keyring cannot give.
 *
 * Keys by (key_id, version), 32-byte KEKs in sodium_malloc'd memory, a
 * state per version and one primary per key_id.  Wrapping is the local
 * provider's construction (docs/keyring.md): wrapped = nonce(24) ||
 * XChaCha20-Poly1305-IETF(KEK, DEK, ad = aad), KS_LOCAL_WRAPPED_LEN bytes.
 * Counts wrap/unwrap/key_info calls, and can make the next n calls of one
 * operation fail with a chosen error.  Thread-safe (one mutex).
 *
 * Test support code: static inline only (see tests/envelope_eq.h).
 */
#ifndef KS_TESTS_MEM_PROVIDER_H
#define KS_TESTS_MEM_PROVIDER_H

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include <keyshift/envelope.h>
#include <keyshift/provider.h>

/* Fuzz builds: the KEKs in the heap, as the library's own secrets there
 * (migrate/alloc_hook.h); never in a test build, whose fault sweeps must
 * not count this header's allocations. */
#if defined(FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION) && !defined(KS_TEST_HOOKS)
#include "../migrate/alloc_hook.h"
#endif

#define KS_MEM_MAX_KEYS 64
#define KS_MEM_KEK_LEN 32
#define KS_MEM_WRAPPED_LEN (crypto_aead_xchacha20poly1305_ietf_NPUBBYTES + KS_DEK_LEN + 16)

/* Which operation an injected failure hits. */
typedef enum ks_mem_op { KS_MEM_WRAP = 0, KS_MEM_UNWRAP = 1, KS_MEM_KEY_INFO = 2 } ks_mem_op;

typedef struct ks_mem_key {
    uint8_t id[KS_KEY_ID_MAX];
    size_t id_len;
    uint32_t version;
    ks_key_state state;
    int primary;
    uint8_t *kek; /* sodium_malloc'd, KS_MEM_KEK_LEN */
} ks_mem_key;

typedef struct ks_mem_provider {
    pthread_mutex_t mu;
    ks_mem_key keys[KS_MEM_MAX_KEYS];
    size_t n;
    unsigned calls[3];     /* by ks_mem_op */
    ks_err fail_err[3];    /* injected error by op */
    unsigned fail_left[3]; /* how many more calls fail */
    unsigned fail_skip[3]; /* how many calls succeed before those fail */
} ks_mem_provider;

/* Set up an empty provider. */
static inline void ks_mem_init(ks_mem_provider *m)
{
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
}

/* Wipe and free every KEK. */
static inline void ks_mem_cleanup(ks_mem_provider *m)
{
    for (size_t i = 0; i < m->n; i++) {
        sodium_free(m->keys[i].kek);
    }
    pthread_mutex_destroy(&m->mu);
    memset(m, 0, sizeof *m);
}

/* Find (id, version); version 0: the primary.  Caller holds mu. */
static inline ks_mem_key *ks_mem_find(ks_mem_provider *m, ks_bytes id, uint32_t version)
{
    for (size_t i = 0; i < m->n; i++) {
        ks_mem_key *k = &m->keys[i];
        if (k->id_len == id.len && memcmp(k->id, id.ptr, id.len) == 0 &&
            (version == 0 ? k->primary : k->version == version)) {
            return k;
        }
    }
    return NULL;
}

/* Add version `version` of key_id (a NUL-terminated string), active, with
 * kek (NULL: random); primary if `primary` (clearing the old primary).
 * Returns 0, or -1 when full. */
static inline int ks_mem_add(ks_mem_provider *m, const char *key_id, uint32_t version, int primary,
                             const uint8_t *kek)
{
    pthread_mutex_lock(&m->mu);
    if (m->n == KS_MEM_MAX_KEYS || strlen(key_id) > KS_KEY_ID_MAX) {
        pthread_mutex_unlock(&m->mu);
        return -1;
    }
    ks_mem_key *k = &m->keys[m->n];
    k->kek = sodium_malloc(KS_MEM_KEK_LEN);
    if (k->kek == NULL) {
        pthread_mutex_unlock(&m->mu);
        return -1;
    }
    if (kek != NULL) {
        memcpy(k->kek, kek, KS_MEM_KEK_LEN);
    } else {
        randombytes_buf(k->kek, KS_MEM_KEK_LEN);
    }
    k->id_len = strlen(key_id);
    memcpy(k->id, key_id, k->id_len);
    k->version = version;
    k->state = KS_KEY_ACTIVE;
    m->n++;
    pthread_mutex_unlock(&m->mu);
    if (primary) {
        for (size_t i = 0; i < m->n - 1; i++) {
            if (m->keys[i].id_len == k->id_len && memcmp(m->keys[i].id, key_id, k->id_len) == 0) {
                m->keys[i].primary = 0;
            }
        }
        k->primary = 1;
    }
    return 0;
}

/* Make (key_id, version) the primary. */
static inline void ks_mem_set_primary(ks_mem_provider *m, const char *key_id, uint32_t version)
{
    pthread_mutex_lock(&m->mu);
    for (size_t i = 0; i < m->n; i++) {
        ks_mem_key *k = &m->keys[i];
        if (k->id_len == strlen(key_id) && memcmp(k->id, key_id, k->id_len) == 0) {
            k->primary = k->version == version;
        }
    }
    pthread_mutex_unlock(&m->mu);
}

/* Set the state of (key_id, version); destroyed wipes the KEK. */
static inline void ks_mem_set_state(ks_mem_provider *m, const char *key_id, uint32_t version,
                                    ks_key_state state)
{
    pthread_mutex_lock(&m->mu);
    ks_mem_key *k = ks_mem_find(m, (ks_bytes){(const uint8_t *)key_id, strlen(key_id)}, version);
    if (k != NULL) {
        k->state = state;
        if (state == KS_KEY_DESTROYED) {
            sodium_memzero(k->kek, KS_MEM_KEK_LEN);
        }
    }
    pthread_mutex_unlock(&m->mu);
}

/* Let the next `skip` calls of op succeed, then make `count` calls
 * return err: a failure at a given call, whatever thread makes it. */
static inline void ks_mem_fail_after(ks_mem_provider *m, ks_mem_op op, unsigned skip, ks_err err,
                                     unsigned count)
{
    pthread_mutex_lock(&m->mu);
    m->fail_err[op] = err;
    m->fail_skip[op] = skip;
    m->fail_left[op] = count;
    pthread_mutex_unlock(&m->mu);
}

/* Make the next `count` calls of op return err. */
static inline void ks_mem_fail(ks_mem_provider *m, ks_mem_op op, ks_err err, unsigned count)
{
    ks_mem_fail_after(m, op, 0, err, count);
}

/* Number of calls of op so far. */
static inline unsigned ks_mem_calls(ks_mem_provider *m, ks_mem_op op)
{
    pthread_mutex_lock(&m->mu);
    unsigned n = m->calls[op];
    pthread_mutex_unlock(&m->mu);
    return n;
}

/* Count a call of op and return its injected failure, or KS_OK.  Caller
 * holds mu. */
static inline ks_err ks_mem_enter(ks_mem_provider *m, ks_mem_op op)
{
    m->calls[op]++;
    if (m->fail_skip[op] != 0) {
        m->fail_skip[op]--;
        return KS_OK;
    }
    if (m->fail_left[op] != 0) {
        m->fail_left[op]--;
        return m->fail_err[op];
    }
    return KS_OK;
}

/* The state check shared by wrap (active only) and unwrap (active or
 * decrypt-only). */
static inline ks_err ks_mem_usable(const ks_mem_key *k, int for_wrap)
{
    if (k == NULL) {
        return KS_ERR_NOT_FOUND;
    }
    if (k->state == KS_KEY_DESTROYED) {
        return KS_ERR_REVOKED;
    }
    if (k->state == KS_KEY_DISABLED || (for_wrap && k->state != KS_KEY_ACTIVE)) {
        return KS_ERR_DENIED;
    }
    return KS_OK;
}

/* ks_provider_ops.wrap */
static inline ks_err ks_mem_wrap(void *self, ks_bytes key_id, uint32_t key_version, const uint8_t *dek,
                                 size_t dek_len, ks_bytes aad, uint8_t *out, size_t cap,
                                 size_t *out_len, uint32_t timeout_ms)
{
    ks_mem_provider *m = self;
    (void)timeout_ms;
    pthread_mutex_lock(&m->mu);
    ks_err err = ks_mem_enter(m, KS_MEM_WRAP);
    ks_mem_key *k = ks_mem_find(m, key_id, key_version);
    if (err == KS_OK) {
        err = ks_mem_usable(k, 1);
    }
    if (err == KS_OK && (key_version == 0 || dek_len != KS_DEK_LEN)) {
        err = KS_ERR_INVALID_ARGUMENT;
    }
    if (err == KS_OK && cap < KS_MEM_WRAPPED_LEN) {
        err = KS_ERR_BUFFER_TOO_SMALL;
    }
    if (err == KS_OK) {
        unsigned long long clen;
        uint8_t *nonce = out;
        randombytes_buf(nonce, crypto_aead_xchacha20poly1305_ietf_NPUBBYTES);
        crypto_aead_xchacha20poly1305_ietf_encrypt(out + crypto_aead_xchacha20poly1305_ietf_NPUBBYTES,
                                                   &clen, dek, dek_len, aad.ptr, aad.len, NULL,
                                                   nonce, k->kek);
        *out_len = KS_MEM_WRAPPED_LEN;
    }
    pthread_mutex_unlock(&m->mu);
    return err;
}

/* ks_provider_ops.unwrap */
static inline ks_err ks_mem_unwrap(void *self, ks_bytes key_id, uint32_t key_version, ks_bytes wrapped,
                                   ks_bytes aad, uint8_t *dek, size_t dek_len, uint32_t timeout_ms)
{
    ks_mem_provider *m = self;
    (void)timeout_ms;
    sodium_memzero(dek, dek_len);
    pthread_mutex_lock(&m->mu);
    ks_err err = ks_mem_enter(m, KS_MEM_UNWRAP);
    ks_mem_key *k = ks_mem_find(m, key_id, key_version);
    if (err == KS_OK) {
        err = ks_mem_usable(k, 0);
    }
    if (err == KS_OK && (dek_len != KS_DEK_LEN || wrapped.len != KS_MEM_WRAPPED_LEN)) {
        err = KS_ERR_AUTH_FAILED;
    }
    if (err == KS_OK) {
        unsigned long long mlen;
        const size_t nl = crypto_aead_xchacha20poly1305_ietf_NPUBBYTES;
        if (crypto_aead_xchacha20poly1305_ietf_decrypt(dek, &mlen, NULL, wrapped.ptr + nl,
                                                       wrapped.len - nl, aad.ptr, aad.len,
                                                       wrapped.ptr, k->kek) != 0) {
            sodium_memzero(dek, dek_len);
            err = KS_ERR_AUTH_FAILED;
        }
    }
    pthread_mutex_unlock(&m->mu);
    return err;
}

/* ks_provider_ops.key_info */
static inline ks_err ks_mem_key_info(void *self, ks_bytes key_id, uint32_t key_version, ks_key_info *out,
                                     uint32_t timeout_ms)
{
    ks_mem_provider *m = self;
    (void)timeout_ms;
    pthread_mutex_lock(&m->mu);
    ks_err err = ks_mem_enter(m, KS_MEM_KEY_INFO);
    ks_mem_key *k = ks_mem_find(m, key_id, key_version);
    if (err == KS_OK && k == NULL) {
        err = KS_ERR_NOT_FOUND;
    }
    if (err == KS_OK) {
        *out = (ks_key_info){k->version, k->state, k->primary};
    }
    pthread_mutex_unlock(&m->mu);
    return err;
}

/* The ks_provider over m (which must outlive it). */
static inline ks_provider ks_mem_provider_of(ks_mem_provider *m)
{
    static const ks_provider_ops ops = {ks_mem_wrap, ks_mem_unwrap, ks_mem_key_info, NULL, NULL};
    return (ks_provider){&ops, m, "mem"};
}

#endif /* KS_TESTS_MEM_PROVIDER_H */
