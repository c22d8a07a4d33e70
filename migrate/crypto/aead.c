/*
 * migrate/crypto/aead.c -- see aead.h (docs/format.md [F-CRYPTO-ALG-1]).
 *
 * libsodium: crypto_aead_aes256gcm_* (through the expanded key when the
 * caller has one) and crypto_aead_xchacha20poly1305_ietf_*, detached, the
 * tag written after the ciphertext.
 *
 * OpenSSL: AES-256-GCM with the 12 nonce bytes as the IV; for
 * xchacha20-poly1305, [F-CRYPTO-ALG-1]'s construction in two steps:
 * K' = HChaCha20(K, n[0..16)) (libsodium's crypto_core_hchacha20), then
 * OpenSSL's ChaCha20-Poly1305 (RFC 8439's AEAD) under K' with the IV
 * 00 00 00 00 || n[16..24).  The ciphers are fetched once per process;
 * each EVP_CIPHER_CTX is initialised with its cipher and direction once
 * (ctx_make), keyed once per key (load_key), and per message given only
 * its IV, which allocates nothing (bench: 0 allocations per call).
 * Guard blocks around each context's allocations keep two threads'
 * contexts off each other's cache lines: side by side, they held two
 * threads' xchacha20-poly1305 opens to 1.3 times one thread's rate.
 */
#include <assert.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <sodium.h>

#include <keyshift/envelope.h>

#include "aead.h"
#include "../alloc_hook.h"

/* The OpenSSL cipher of each algorithm, fetched once (NULL: unavailable,
 * then every call runs on libsodium). */
static EVP_CIPHER *ciphers[2];
/* The engine the environment (KS_AEAD_ENGINE) forces, and a test's. */
static _Atomic int env_forced;
static _Atomic int test_forced;
static pthread_once_t init_once = PTHREAD_ONCE_INIT;
/* Set (release) once aead_init has run: a load instead of a call per
 * operation. */
static _Atomic int inited;
static _Atomic uint64_t next_serial = 1;

#ifdef KS_TEST_HOOKS
static _Atomic uint64_t runs[3]; /* ks_aead_test_count() */
#define COUNT_RUN(e) atomic_fetch_add_explicit(&runs[e], 1, memory_order_relaxed)
#else
#define COUNT_RUN(e) ((void)0)
#endif

/* See aead.h. */
uint64_t ks_aead_test_count(ks_aead_engine e)
{
#ifdef KS_TEST_HOOKS
    return atomic_load_explicit(&runs[e], memory_order_relaxed);
#else
    (void)e;
    return 0;
#endif
}

/* Once per process: fetch the ciphers and read KS_AEAD_ENGINE.  OpenSSL
 * is told not to clean itself up from atexit(): a context freed by an
 * exit handler that runs after OpenSSL's would otherwise free its
 * EVP_CIPHER_CTXs into a torn-down library (an application that
 * initialised OpenSSL itself keeps its own choice). */
static void aead_init(void)
{
    (void)OPENSSL_init_crypto(OPENSSL_INIT_NO_ATEXIT, NULL);
    ciphers[0] = EVP_CIPHER_fetch(NULL, "AES-256-GCM", NULL);
    ciphers[1] = EVP_CIPHER_fetch(NULL, "ChaCha20-Poly1305", NULL);
    const char *v = getenv("KS_AEAD_ENGINE");
    int e = KS_AEAD_AUTO;
    if (v != NULL && strcmp(v, "sodium") == 0) {
        e = KS_AEAD_SODIUM;
    } else if (v != NULL && strcmp(v, "openssl") == 0) {
        e = KS_AEAD_OPENSSL;
    }
    atomic_store_explicit(&env_forced, e, memory_order_relaxed);
    atomic_store_explicit(&inited, 1, memory_order_release);
}

/* Run aead_init once per process, before anything reads what it sets. */
static void init_once_done(void)
{
    if (!atomic_load_explicit(&inited, memory_order_acquire)) {
        (void)pthread_once(&init_once, aead_init);
    }
}

/* The index of alg in ciphers[] and ks_aead_evp's arrays. */
static size_t alg_index(uint32_t alg)
{
    assert(alg == KS_ALG_AES256GCM || alg == KS_ALG_XCHACHA20POLY1305);
    return alg == KS_ALG_AES256GCM ? 0 : 1;
}

/* See aead.h. */
uint64_t ks_aead_serial(void)
{
    return atomic_fetch_add_explicit(&next_serial, 1, memory_order_relaxed);
}

/* See aead.h. */
void ks_aead_test_force(ks_aead_engine e)
{
    atomic_store_explicit(&test_forced, (int)e, memory_order_relaxed);
}

/* See aead.h.  The thresholds are where the two engines' times cross
 * with an 84-byte AAD on an AVX-512 machine (docs/PERFORMANCE.md, "The
 * engine rule"); below them libsodium's single call beats EVP's four. */
ks_aead_engine ks_aead_engine_rule(uint32_t alg, size_t len)
{
    const size_t min = alg == KS_ALG_AES256GCM ? KS_AEAD_EVP_MIN_AES256GCM : KS_AEAD_EVP_MIN_XCHACHA;
    return len >= min ? KS_AEAD_OPENSSL : KS_AEAD_SODIUM;
}

/* See aead.h. */
ks_aead_engine ks_aead_engine_for(uint32_t alg, size_t len)
{
    init_once_done();
    int e = atomic_load_explicit(&test_forced, memory_order_relaxed);
    if (e == KS_AEAD_AUTO) {
        e = atomic_load_explicit(&env_forced, memory_order_relaxed);
    }
    return e != KS_AEAD_AUTO ? (ks_aead_engine)e : ks_aead_engine_rule(alg, len);
}

/* ---- libsodium ------------------------------------------------------------ */

/* libsodium's detached encryption, the tag at c + mlen; 0 on success. */
static int sodium_encrypt(const ks_aead_key *k, uint8_t *c, const uint8_t *m, size_t mlen,
                          const uint8_t *ad, size_t adlen, const uint8_t *nonce)
{
    if (k->alg == KS_ALG_AES256GCM && k->aes != NULL) {
        return crypto_aead_aes256gcm_encrypt_detached_afternm(
            c, c + mlen, NULL, m, mlen, ad, adlen, NULL, nonce,
            (const crypto_aead_aes256gcm_state *)k->aes);
    }
    if (k->alg == KS_ALG_AES256GCM) {
        return crypto_aead_aes256gcm_encrypt_detached(c, c + mlen, NULL, m, mlen, ad, adlen, NULL, nonce,
                                                      k->key);
    }
    return crypto_aead_xchacha20poly1305_ietf_encrypt_detached(c, c + mlen, NULL, m, mlen, ad, adlen,
                                                               NULL, nonce, k->key);
}

/* libsodium's detached decryption of c[0, mlen) with the tag at c + mlen;
 * m NULL verifies the tag only: every libsodium AEAD's detached
 * decryption computes and compares the tag first and returns right there
 * when it has no output buffer (tests/test_crypto.c pins this). */
static int sodium_decrypt(const ks_aead_key *k, uint8_t *m, const uint8_t *c, size_t mlen,
                          const uint8_t *ad, size_t adlen, const uint8_t *nonce)
{
    const uint8_t *tag = c + mlen;
    if (k->alg == KS_ALG_AES256GCM && k->aes != NULL) {
        return crypto_aead_aes256gcm_decrypt_detached_afternm(
            m, NULL, c, mlen, tag, ad, adlen, nonce, (const crypto_aead_aes256gcm_state *)k->aes);
    }
    if (k->alg == KS_ALG_AES256GCM) {
        return crypto_aead_aes256gcm_decrypt_detached(m, NULL, c, mlen, tag, ad, adlen, nonce, k->key);
    }
    return crypto_aead_xchacha20poly1305_ietf_decrypt_detached(m, NULL, c, mlen, tag, ad, adlen, nonce,
                                                               k->key);
}

/* ---- OpenSSL ---------------------------------------------------------------- */

/* s's context for k's algorithm, made and initialised with its cipher and
 * direction enc on first use (the only allocation: never again for this
 * slot and algorithm); NULL when OpenSSL cannot.  The context is stored
 * only once it is whole, so a fork() copying this thread mid-way leaves
 * the child either no context or a complete one (shard.c). */
static EVP_CIPHER_CTX *ctx_make(ks_aead_evp *s, size_t i, int enc)
{
    if (s->ctx[i] != NULL) {
        return s->ctx[i];
    }
    if (ciphers[i] == NULL) {
        return NULL;
    }
    /* Guards before and after OpenSSL's two allocations (the EVP context
     * and the provider's): contexts that threads write on every call
     * otherwise come out of malloc side by side and share cache lines.
     * A missing guard costs only speed. */
    void *before = malloc(KS_LINE_PAIR);
    EVP_CIPHER_CTX *x = EVP_CIPHER_CTX_new();
    if (x == NULL || EVP_CipherInit_ex(x, ciphers[i], NULL, NULL, NULL, enc) != 1) {
        EVP_CIPHER_CTX_free(x);
        free(before);
        return NULL;
    }
    s->guard[i][0] = before;
    s->guard[i][1] = malloc(KS_LINE_PAIR);
    s->serial[i] = 0;
    s->enc[i] = (uint8_t)enc;
    s->ctx[i] = x;
    return x;
}

/* Load k into x (s's context for k's algorithm) unless it holds it
 * already: k's key, or for xchacha20-poly1305 the subkey of k's key and
 * nonce[0, 16) [F-CRYPTO-ALG-1].  0 on success; on failure x holds no
 * key of s's. */
static int load_key(ks_aead_evp *s, size_t i, EVP_CIPHER_CTX *x, const ks_aead_key *k,
                    const uint8_t *nonce)
{
    const int xchacha = k->alg == KS_ALG_XCHACHA20POLY1305;
    if (s->serial[i] == k->serial && (!xchacha || memcmp(s->prefix, nonce, 16) == 0)) {
        return 0;
    }
    uint8_t sub[32];
    const uint8_t *key = k->key;
    if (xchacha) {
        (void)crypto_core_hchacha20(sub, nonce, k->key, NULL); /* always 0 */
        memcpy(s->prefix, nonce, 16);
        key = sub;
    }
    s->serial[i] = 0;
    const int ok = EVP_CipherInit_ex(x, NULL, NULL, key, NULL, -1) == 1;
    sodium_memzero(sub, sizeof sub);
    if (!ok) {
        return -1;
    }
    s->serial[i] = k->serial;
    return 0;
}

/* k's OpenSSL context for direction enc, keyed and ready for an IV, or
 * NULL (no state, or OpenSSL failed). */
static EVP_CIPHER_CTX *evp_ready(const ks_aead_key *k, const uint8_t *nonce, int enc)
{
    ks_aead_evp *s = k->evp;
    if (s == NULL || k->key == NULL || k->serial == 0) {
        return NULL;
    }
    const size_t i = alg_index(k->alg);
    EVP_CIPHER_CTX *x = s->ctx[i];
    if (x == NULL) { /* a context exists only once aead_init has run */
        init_once_done();
        x = ctx_make(s, i, enc);
    }
    if (x == NULL || s->enc[i] != enc || load_key(s, i, x, k, nonce) != 0) {
        return NULL;
    }
    return x;
}

/* Start a message on x: its IV (aes-256-gcm: the nonce; xchacha20-poly1305:
 * 00 00 00 00 || nonce[16, 24), [F-CRYPTO-ALG-1]), then the AAD. */
static int evp_begin(EVP_CIPHER_CTX *x, uint32_t alg, const uint8_t *nonce, const uint8_t *ad,
                     size_t adlen)
{
    uint8_t iv[12] = {0};
    int n = 0;
    if (alg == KS_ALG_AES256GCM) {
        memcpy(iv, nonce, sizeof iv);
    } else {
        memcpy(iv + 4, nonce + 16, 8);
    }
    if (EVP_CipherInit_ex(x, NULL, NULL, NULL, iv, -1) != 1) {
        return -1;
    }
    return adlen == 0 || (adlen <= INT_MAX && EVP_CipherUpdate(x, NULL, &n, ad, (int)adlen) == 1) ? 0 : -1;
}

/* Run x over in[0, len) into out, in pieces an int can count. */
static int evp_update(EVP_CIPHER_CTX *x, uint8_t *out, const uint8_t *in, size_t len)
{
    while (len > 0) {
        const int piece = len > (1u << 30) ? 1 << 30 : (int)len;
        int n = 0;
        if (EVP_CipherUpdate(x, out, &n, in, piece) != 1 || n != piece) {
            return -1;
        }
        out += piece;
        in += piece;
        len -= (size_t)piece;
    }
    return 0;
}

/* OpenSSL encryption, the tag at c + mlen; 0 on success. */
static int evp_encrypt(EVP_CIPHER_CTX *x, uint32_t alg, uint8_t *c, const uint8_t *m, size_t mlen,
                       const uint8_t *ad, size_t adlen, const uint8_t *nonce)
{
    int n = 0;
    if (evp_begin(x, alg, nonce, ad, adlen) != 0 || evp_update(x, c, m, mlen) != 0 ||
        EVP_CipherFinal_ex(x, c + mlen, &n) != 1 || n != 0 ||
        EVP_CIPHER_CTX_ctrl(x, EVP_CTRL_AEAD_GET_TAG, KS_TAG_LEN, c + mlen) != 1) {
        return -1;
    }
    return 0;
}

/* OpenSSL decryption of c[0, mlen) with the tag at c + mlen into m; 0
 * when the tag verifies (Final checks it after the plaintext was
 * written: the caller wipes m on failure). */
static int evp_decrypt(EVP_CIPHER_CTX *x, uint32_t alg, uint8_t *m, const uint8_t *c, size_t mlen,
                       const uint8_t *ad, size_t adlen, const uint8_t *nonce)
{
    uint8_t tag[KS_TAG_LEN];
    int n = 0;
    memcpy(tag, c + mlen, sizeof tag);
    if (evp_begin(x, alg, nonce, ad, adlen) != 0 || evp_update(x, m, c, mlen) != 0 ||
        EVP_CIPHER_CTX_ctrl(x, EVP_CTRL_AEAD_SET_TAG, KS_TAG_LEN, tag) != 1 ||
        EVP_CipherFinal_ex(x, m + mlen, &n) != 1 || n != 0) {
        return -1;
    }
    return 0;
}

/* ---- the interface ---------------------------------------------------------- */

/* See aead.h. */
int ks_aead_encrypt(ks_aead_engine e, const ks_aead_key *k, uint8_t *c, const uint8_t *m, size_t mlen,
                    const uint8_t *ad, size_t adlen, const uint8_t *nonce)
{
    const ks_aead_engine run = e == KS_AEAD_AUTO ? ks_aead_engine_for(k->alg, mlen) : e;
    if (run == KS_AEAD_OPENSSL) {
        EVP_CIPHER_CTX *x = evp_ready(k, nonce, 1);
        if (x != NULL) {
            COUNT_RUN(KS_AEAD_OPENSSL);
            return evp_encrypt(x, k->alg, c, m, mlen, ad, adlen, nonce);
        }
        if (e == KS_AEAD_OPENSSL) {
            return -1;
        }
    }
    if (k->key == NULL && k->aes == NULL) {
        return -1;
    }
    COUNT_RUN(KS_AEAD_SODIUM);
    return sodium_encrypt(k, c, m, mlen, ad, adlen, nonce);
}

/* See aead.h. */
int ks_aead_decrypt(ks_aead_engine e, const ks_aead_key *k, uint8_t *m, const uint8_t *c, size_t clen,
                    const uint8_t *ad, size_t adlen, const uint8_t *nonce)
{
    assert(clen >= KS_TAG_LEN); /* [F-LEN-2]: the parser refuses a shorter one */
    const size_t mlen = clen - KS_TAG_LEN;
    const ks_aead_engine run = e == KS_AEAD_AUTO ? ks_aead_engine_for(k->alg, mlen) : e;
    if (run == KS_AEAD_OPENSSL && m != NULL) {
        EVP_CIPHER_CTX *x = evp_ready(k, nonce, 0);
        if (x != NULL) {
            COUNT_RUN(KS_AEAD_OPENSSL);
            if (evp_decrypt(x, k->alg, m, c, mlen, ad, adlen, nonce) == 0) {
                return 0;
            }
            sodium_memzero(m, mlen); /* unauthenticated plaintext */
            return -1;
        }
        if (e == KS_AEAD_OPENSSL) {
            return -1;
        }
    }
    if (k->key == NULL && k->aes == NULL) {
        return -1;
    }
    COUNT_RUN(KS_AEAD_SODIUM);
    return sodium_decrypt(k, m, c, mlen, ad, adlen, nonce);
}

/* See aead.h.  Keying with zeros overwrites the whole schedule (AES's
 * round keys and GCM's H table; ChaCha's key words) in place, whatever
 * the serials say (a load may have been cut short). */
void ks_aead_evp_wipe(ks_aead_evp *s)
{
    static const uint8_t zero[32];
    for (size_t i = 0; i < 2; i++) {
        if (s->ctx[i] != NULL) {
            (void)EVP_CipherInit_ex(s->ctx[i], NULL, NULL, zero, NULL, -1);
        }
        s->serial[i] = 0;
    }
    sodium_memzero(s->prefix, sizeof s->prefix);
}

/* See aead.h. */
void ks_aead_evp_free(ks_aead_evp *s)
{
    for (size_t i = 0; i < 2; i++) {
        EVP_CIPHER_CTX_free(s->ctx[i]); /* the providers' freectx cleanses */
        free(s->guard[i][0]);
        free(s->guard[i][1]);
        s->guard[i][0] = s->guard[i][1] = NULL;
        s->ctx[i] = NULL;
        s->serial[i] = 0;
    }
    sodium_memzero(s->prefix, sizeof s->prefix);
}
