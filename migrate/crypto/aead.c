/*
 * migrate/crypto/aead.c -- see aead.h (docs/format.md [F-CRYPTO-ALG-1]):
 * the engines' set-up and the OpenSSL engine.  The dispatch and the
 * libsodium engine (crypto_aead_aes256gcm_* through the expanded key when
 * the caller has one, crypto_aead_xchacha20poly1305_ietf_*, detached, the
 * tag written after the ciphertext) are inline in aead.h, so that a small
 * payload's seal or open calls libsodium from its own frame.
 *
 * OpenSSL: AES-256-GCM with the 12 nonce bytes as the IV; for
 * xchacha20-poly1305, [F-CRYPTO-ALG-1]'s construction in two steps:
 * K' = HChaCha20(K, n[0..16)) (libsodium's crypto_core_hchacha20), then
 * OpenSSL's ChaCha20-Poly1305 (RFC 8439's AEAD) under K' with the IV
 * 00 00 00 00 || n[16..24).
 *
 * The ciphers are fetched once per process (EVP_CIPHER_fetch, so the
 * configuration's providers and properties choose them), and each
 * message calls the fetched cipher's implementation in its provider
 * directly: the provider's cipher functions (provider-cipher(7), found
 * with OSSL_PROVIDER_query_operation), with the same arguments EVP would
 * pass.  EVP's wrappers cost about as much as keyshift's own work on a
 * 2 KiB seal: OpenSSL 3.0 asks the provider for the IV length on every IV
 * and builds a parameter list for the tag (docs/PERFORMANCE.md, "The
 * engine rule").
 * A provider with no single implementation of the name, or one that
 * fails the known-answer test at start-up (impl_check), leaves OpenSSL
 * unused: every call runs on libsodium.
 *
 * Each context is made once per slot and algorithm (ctx_make), keyed once
 * per key (load_key), and per message given only its IV, which allocates
 * nothing (bench: 0 allocations per call).  Guard blocks around each
 * context's allocation keep two threads' contexts off each other's cache
 * lines: side by side, they held two threads' xchacha20-poly1305 opens to
 * 1.3 times one thread's rate.
 */
#include <assert.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/core_dispatch.h>
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <openssl/provider.h>
#include <sodium.h>

#include <keyshift/envelope.h>

#include "aead.h"
#include "../alloc_hook.h"

/* The IV length of both OpenSSL ciphers (RFC 8439, and GCM's 96 bits). */
#define KS_PROV_IV_LEN 12u

/* One cipher's implementation in its provider: the provider's context
 * and the functions a message calls (provider-cipher(7)).  All NULL:
 * unavailable, and that algorithm runs on libsodium. */
typedef struct prov_cipher {
    void *provctx;
    OSSL_FUNC_cipher_newctx_fn *newctx;
    OSSL_FUNC_cipher_freectx_fn *freectx;
    OSSL_FUNC_cipher_encrypt_init_fn *einit;
    OSSL_FUNC_cipher_decrypt_init_fn *dinit;
    OSSL_FUNC_cipher_update_fn *update;
    OSSL_FUNC_cipher_final_fn *final;
    OSSL_FUNC_cipher_get_ctx_params_fn *get_params;
    OSSL_FUNC_cipher_set_ctx_params_fn *set_params;
} prov_cipher;

/* The name each algorithm is fetched by, indexed as ciphers[]. */
static const char *const cipher_names[2] = {"AES-256-GCM", "ChaCha20-Poly1305"};
/* The OpenSSL cipher of each algorithm, fetched once and kept for the
 * process's life: it holds its provider, and so the functions in impls[],
 * loaded. */
static EVP_CIPHER *ciphers[2];
/* Its implementation, set once by aead_init (see prov_cipher). */
static prov_cipher impls[2];
/* The engine the environment (KS_AEAD_ENGINE) forces, and a test's. */
static _Atomic int env_forced;
static _Atomic int test_forced;
static pthread_once_t init_once = PTHREAD_ONCE_INIT;
/* Set (release) once aead_init has run: a load instead of a call. */
static _Atomic int inited;
/* See aead.h. */
_Atomic int ks_aead_forced = -1;
static _Atomic uint64_t next_serial = 1;

#ifdef KS_TEST_HOOKS
/* See aead.h. */
_Atomic uint64_t ks_aead_runs[3];
#endif

/* See aead.h. */
uint64_t ks_aead_test_count(ks_aead_engine e)
{
#ifdef KS_TEST_HOOKS
    return atomic_load_explicit(&ks_aead_runs[e], memory_order_relaxed);
#else
    (void)e;
    return 0;
#endif
}

/* The IV of a message (aes-256-gcm: the nonce; xchacha20-poly1305:
 * 00 00 00 00 || nonce[16, 24), [F-CRYPTO-ALG-1]). */
static void iv_of(uint32_t alg, const uint8_t *nonce, uint8_t iv[static KS_PROV_IV_LEN])
{
    if (alg == KS_ALG_AES256GCM) {
        memcpy(iv, nonce, KS_PROV_IV_LEN);
    } else {
        memset(iv, 0, 4);
        memcpy(iv + 4, nonce + 16, 8);
    }
}

/* The provider's init of c (made by p) for direction enc, with a 32-byte
 * key or an IV (NULL: unchanged), as EVP_CipherInit_ex calls it; 0 on
 * success. */
static int prov_init(const prov_cipher *p, void *c, int enc, const uint8_t *key, const uint8_t *iv)
{
    const size_t keylen = key != NULL ? 32 : 0, ivlen = iv != NULL ? KS_PROV_IV_LEN : 0;
    const int ok = enc ? p->einit(c, key, keylen, iv, ivlen, NULL)
                       : p->dinit(c, key, keylen, iv, ivlen, NULL);
    return ok == 1 ? 0 : -1;
}

/* Start a message on c (made by p, keyed, direction enc): its IV, then
 * the AAD.  The same calls, with the same sizes, as EVP_CipherInit_ex
 * with an IV and EVP_CipherUpdate with no output make. */
static int prov_begin(const prov_cipher *p, void *c, int enc, const uint8_t iv[static KS_PROV_IV_LEN],
                      const uint8_t *ad, size_t adlen)
{
    size_t n = 0;
    if (prov_init(p, c, enc, NULL, iv) != 0) {
        return -1;
    }
    return adlen == 0 || p->update(c, NULL, &n, adlen, ad, adlen) == 1 ? 0 : -1;
}

/* Encrypt m[0, mlen) into out with the tag at out + mlen, on c (made by
 * p, keyed for encryption); 0 on success. */
static int prov_encrypt(const prov_cipher *p, void *c, uint8_t *out, const uint8_t *m, size_t mlen,
                        const uint8_t *ad, size_t adlen, const uint8_t iv[static KS_PROV_IV_LEN])
{
    size_t n = 0, fin = 0;
    OSSL_PARAM tag[2] = {OSSL_PARAM_octet_string(OSSL_CIPHER_PARAM_AEAD_TAG, out + mlen, KS_TAG_LEN),
                         OSSL_PARAM_END};
    if (prov_begin(p, c, 1, iv, ad, adlen) != 0 ||
        (mlen > 0 && (p->update(c, out, &n, mlen, m, mlen) != 1 || n != mlen)) ||
        p->final(c, out + mlen, &fin, 0) != 1 || fin != 0 || p->get_params(c, tag) != 1) {
        return -1;
    }
    return 0;
}

/* Decrypt in[0, mlen) with the tag at in + mlen into m, on c (made by p,
 * keyed for decryption); 0 when the tag verifies (the final call checks
 * it after the plaintext was written: the caller wipes m on failure). */
static int prov_decrypt(const prov_cipher *p, void *c, uint8_t *m, const uint8_t *in, size_t mlen,
                        const uint8_t *ad, size_t adlen, const uint8_t iv[static KS_PROV_IV_LEN])
{
    uint8_t t[KS_TAG_LEN];
    size_t n = 0, fin = 0;
    memcpy(t, in + mlen, sizeof t);
    const OSSL_PARAM tag[2] = {OSSL_PARAM_octet_string(OSSL_CIPHER_PARAM_AEAD_TAG, t, sizeof t),
                               OSSL_PARAM_END};
    if (prov_begin(p, c, 0, iv, ad, adlen) != 0 ||
        (mlen > 0 && (p->update(c, m, &n, mlen, in, mlen) != 1 || n != mlen)) ||
        p->set_params(c, tag) != 1 || p->final(c, m + mlen, &fin, 0) != 1 || fin != 0) {
        return -1;
    }
    return 0;
}

/* c with A-Z lowered, every other byte as it is. */
static int ascii_lower(char c)
{
    return c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c;
}

/* Whether name is one of the colon-separated names in names, compared
 * as OpenSSL compares algorithm names (ASCII, case-insensitive). */
static int names_have(const char *names, const char *name)
{
    const size_t len = strlen(name);
    for (const char *p = names;; p++) {
        size_t i = 0;
        while (i < len && p[i] != '\0' && ascii_lower(p[i]) == ascii_lower(name[i])) {
            i++;
        }
        if (i == len && (p[i] == '\0' || p[i] == ':')) {
            return 1;
        }
        p = strchr(p, ':');
        if (p == NULL) {
            return 0;
        }
    }
}

/* Take the functions of one implementation into out. */
static void impl_take(const OSSL_DISPATCH *f, prov_cipher *out)
{
    for (; f->function_id != 0; f++) {
        switch (f->function_id) {
        case OSSL_FUNC_CIPHER_NEWCTX: out->newctx = OSSL_FUNC_cipher_newctx(f); break;
        case OSSL_FUNC_CIPHER_FREECTX: out->freectx = OSSL_FUNC_cipher_freectx(f); break;
        case OSSL_FUNC_CIPHER_ENCRYPT_INIT: out->einit = OSSL_FUNC_cipher_encrypt_init(f); break;
        case OSSL_FUNC_CIPHER_DECRYPT_INIT: out->dinit = OSSL_FUNC_cipher_decrypt_init(f); break;
        case OSSL_FUNC_CIPHER_UPDATE: out->update = OSSL_FUNC_cipher_update(f); break;
        case OSSL_FUNC_CIPHER_FINAL: out->final = OSSL_FUNC_cipher_final(f); break;
        case OSSL_FUNC_CIPHER_GET_CTX_PARAMS: out->get_params = OSSL_FUNC_cipher_get_ctx_params(f); break;
        case OSSL_FUNC_CIPHER_SET_CTX_PARAMS: out->set_params = OSSL_FUNC_cipher_set_ctx_params(f); break;
        default: break;
        }
    }
}

/* The implementation of ciphers[i] in its provider: the one algorithm of
 * the provider's ciphers that has the name it was fetched by.  -1 when
 * there is none, or more than one (which of them the fetch chose is not
 * known), or it lacks a function a message needs. */
static int impl_find(size_t i, prov_cipher *out)
{
    const OSSL_PROVIDER *prov = EVP_CIPHER_get0_provider(ciphers[i]);
    int no_store = 0;
    const OSSL_ALGORITHM *algs =
        prov != NULL ? OSSL_PROVIDER_query_operation(prov, OSSL_OP_CIPHER, &no_store) : NULL;
    size_t found = 0;
    prov_cipher p = {0};
    for (const OSSL_ALGORITHM *a = algs; a != NULL && a->algorithm_names != NULL; a++) {
        if (names_have(a->algorithm_names, cipher_names[i])) {
            found++;
            impl_take(a->implementation, &p);
        }
    }
    if (algs != NULL) {
        OSSL_PROVIDER_unquery_operation(prov, OSSL_OP_CIPHER, algs);
    }
    if (found != 1 || p.newctx == NULL || p.freectx == NULL || p.einit == NULL || p.dinit == NULL ||
        p.update == NULL || p.final == NULL || p.get_params == NULL || p.set_params == NULL) {
        return -1;
    }
    p.provctx = OSSL_PROVIDER_get0_provider_ctx(prov);
    *out = p;
    return 0;
}

/* The known answers of impl_check: AES-256-GCM (NIST SP 800-38D) and
 * RFC 8439's ChaCha20-Poly1305 of kat_pt under the key 00 01 .. 1f, the
 * IV 40 41 .. 4b and kat_ad, ciphertext then tag, as libsodium computes
 * them (a wrong one would leave OpenSSL unused, which the tests that
 * force it would see). */
static const uint8_t kat_ad[] = "keyshift aead kat";
static const uint8_t kat_pt[] = "OpenSSL's provider, called direct";
static const uint8_t kat_ct[2][sizeof kat_pt - 1 + KS_TAG_LEN] = {
    {0xad, 0xc9, 0xcb, 0x4d, 0x75, 0x6f, 0xcb, 0x24, 0xbe, 0xe4, 0x67, 0x44, 0xf4, 0x12, 0x7a, 0x3f, 0x1c,
     0xb4, 0x7e, 0x7c, 0xd4, 0x54, 0x63, 0x4f, 0x12, 0x23, 0x6e, 0x81, 0xfe, 0x61, 0x88, 0xb8, 0xec, 0x19,
     0xea, 0x6b, 0x85, 0x77, 0xc4, 0xc9, 0xe8, 0x9f, 0x96, 0xa9, 0x7a, 0x7b, 0x87, 0x60, 0x75},
    {0xb7, 0x24, 0x19, 0xef, 0x21, 0x19, 0xa2, 0x26, 0x2b, 0xef, 0x86, 0x72, 0xd4, 0x99, 0x04, 0xa9, 0xd1,
     0xbe, 0x4f, 0x38, 0x27, 0x9d, 0x2d, 0x03, 0x9b, 0x68, 0xf2, 0x3f, 0x83, 0x55, 0x5f, 0x09, 0x84, 0x10,
     0x85, 0x79, 0x94, 0xf4, 0xb3, 0xd7, 0x71, 0xf8, 0xff, 0xe6, 0x59, 0x05, 0x67, 0x0f, 0xcf},
};

/* Once, before impls[i] is used: it seals kat_pt to kat_ct[i], opens
 * that back, and refuses it with one tag bit flipped; so the functions
 * found are the cipher, called as it expects.  0 when all three hold. */
static int impl_check(size_t i)
{
    const prov_cipher *p = &impls[i];
    enum { N = sizeof kat_pt - 1, ADN = sizeof kat_ad - 1 };
    uint8_t key[32], iv[KS_PROV_IV_LEN], ct[N + KS_TAG_LEN], pt[N];
    for (size_t j = 0; j < sizeof key; j++) {
        key[j] = (uint8_t)j;
    }
    for (size_t j = 0; j < sizeof iv; j++) {
        iv[j] = (uint8_t)(0x40 + j);
    }
    void *e = p->newctx(p->provctx), *d = p->newctx(p->provctx);
    int ok = e != NULL && d != NULL && prov_init(p, e, 1, key, NULL) == 0 &&
             prov_init(p, d, 0, key, NULL) == 0 &&
             prov_encrypt(p, e, ct, kat_pt, N, kat_ad, ADN, iv) == 0 &&
             memcmp(ct, kat_ct[i], sizeof ct) == 0 &&
             prov_decrypt(p, d, pt, ct, N, kat_ad, ADN, iv) == 0 && memcmp(pt, kat_pt, N) == 0;
    ct[N] ^= 1;
    ok = ok && prov_decrypt(p, d, pt, ct, N, kat_ad, ADN, iv) != 0;
    if (e != NULL) {
        p->freectx(e);
    }
    if (d != NULL) {
        p->freectx(d);
    }
    return ok ? 0 : -1;
}

/* Publish the forced engine: the test's, else the environment's
 * (release: a thread that reads it sees what aead_init set). */
static void set_forced(void)
{
    const int t = atomic_load_explicit(&test_forced, memory_order_relaxed);
    const int e = t != KS_AEAD_AUTO ? t : atomic_load_explicit(&env_forced, memory_order_relaxed);
    atomic_store_explicit(&ks_aead_forced, e, memory_order_release);
}

/* Once per process: fetch the ciphers and read KS_AEAD_ENGINE.  OpenSSL
 * is told not to clean itself up from atexit(): a context freed by an
 * exit handler that runs after OpenSSL's would otherwise free its
 * EVP_CIPHER_CTXs into a torn-down library (an application that
 * initialised OpenSSL itself keeps its own choice). */
static void aead_init(void)
{
    (void)OPENSSL_init_crypto(OPENSSL_INIT_NO_ATEXIT, NULL);
    for (size_t i = 0; i < 2; i++) {
        ciphers[i] = EVP_CIPHER_fetch(NULL, cipher_names[i], NULL);
        if (ciphers[i] == NULL || impl_find(i, &impls[i]) != 0 || impl_check(i) != 0) {
            memset(&impls[i], 0, sizeof impls[i]);
        }
    }
    const char *v = getenv("KS_AEAD_ENGINE");
    int e = KS_AEAD_AUTO;
    if (v != NULL && strcmp(v, "sodium") == 0) {
        e = KS_AEAD_SODIUM;
    } else if (v != NULL && strcmp(v, "openssl") == 0) {
        e = KS_AEAD_OPENSSL;
    }
    atomic_store_explicit(&env_forced, e, memory_order_relaxed);
    atomic_store_explicit(&inited, 1, memory_order_release);
    set_forced();
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
    if (atomic_load_explicit(&inited, memory_order_acquire)) {
        set_forced();
    }
}

/* See aead.h. */
int ks_aead_forced_init(void)
{
    init_once_done();
    return atomic_load_explicit(&ks_aead_forced, memory_order_acquire);
}

/* ---- OpenSSL ---------------------------------------------------------------- */

/* s's context for algorithm i, made for direction enc on first use (the
 * only allocation: never again for this slot and algorithm); NULL when
 * OpenSSL cannot.  The context is stored only once it is whole, so a
 * fork() copying this thread mid-way leaves the child either no context
 * or a complete one (shard.c). */
static void *ctx_make(ks_aead_evp *s, size_t i, int enc)
{
    if (s->ctx[i] != NULL) {
        return s->ctx[i];
    }
    if (impls[i].newctx == NULL) {
        return NULL;
    }
    /* Guards before and after the provider's allocation: contexts that
     * threads write on every call otherwise come out of malloc side by
     * side and share cache lines.  A missing guard costs only speed. */
    void *before = malloc(KS_LINE_PAIR);
    void *x = impls[i].newctx(impls[i].provctx);
    if (x == NULL) {
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

/* Load k into x (s's context for algorithm i) unless it holds it
 * already: k's key, or for xchacha20-poly1305 the subkey of k's key and
 * nonce[0, 16) [F-CRYPTO-ALG-1].  0 on success; on failure x holds no
 * key of s's. */
static int load_key(ks_aead_evp *s, size_t i, void *x, const ks_aead_key *k, const uint8_t *nonce)
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
    const int rc = prov_init(&impls[i], x, s->enc[i], key, NULL);
    sodium_memzero(sub, sizeof sub);
    if (rc != 0) {
        return -1;
    }
    s->serial[i] = k->serial;
    return 0;
}

/* k's OpenSSL context for direction enc, keyed and ready for an IV, or
 * NULL (no state, or OpenSSL failed). */
static void *evp_ready(const ks_aead_key *k, const uint8_t *nonce, int enc)
{
    ks_aead_evp *s = k->evp;
    if (s == NULL || k->key == NULL || k->serial == 0) {
        return NULL;
    }
    const size_t i = alg_index(k->alg);
    void *x = s->ctx[i];
    if (x == NULL) { /* a context exists only once aead_init has run */
        init_once_done();
        x = ctx_make(s, i, enc);
    }
    if (x == NULL || s->enc[i] != enc || load_key(s, i, x, k, nonce) != 0) {
        return NULL;
    }
    return x;
}

/* ---- the interface ---------------------------------------------------------- */

/* See aead.h.  The direction's provider call on this thread's context
 * for k, keyed and given nonce's IV; a failed decryption wipes out. */
int ks_aead_openssl(const ks_aead_key *k, int enc, uint8_t *out, const uint8_t *in, size_t mlen,
                    const uint8_t *ad, size_t adlen, const uint8_t *nonce)
{
    void *x = evp_ready(k, nonce, enc);
    if (x == NULL) {
        return 1;
    }
    uint8_t iv[KS_PROV_IV_LEN];
    iv_of(k->alg, nonce, iv);
    KS_AEAD_COUNT_RUN(KS_AEAD_OPENSSL);
    const prov_cipher *p = &impls[alg_index(k->alg)];
    const int r = enc ? prov_encrypt(p, x, out, in, mlen, ad, adlen, iv)
                      : prov_decrypt(p, x, out, in, mlen, ad, adlen, iv);
    if (r == 0) {
        return 0;
    }
    if (!enc) {
        sodium_memzero(out, mlen); /* unauthenticated plaintext */
    }
    return -1;
}

/* See aead.h.  Keying with zeros overwrites the whole schedule (AES's
 * round keys and GCM's H table; ChaCha's key words) in place, whatever
 * the serials say (a load may have been cut short). */
void ks_aead_evp_wipe(ks_aead_evp *s)
{
    static const uint8_t zero[32];
    for (size_t i = 0; i < 2; i++) {
        if (s->ctx[i] != NULL) {
            (void)prov_init(&impls[i], s->ctx[i], s->enc[i], zero, NULL);
        }
        s->serial[i] = 0;
    }
    sodium_memzero(s->prefix, sizeof s->prefix);
}

/* See aead.h. */
void ks_aead_evp_free(ks_aead_evp *s)
{
    for (size_t i = 0; i < 2; i++) {
        if (s->ctx[i] != NULL) {
            impls[i].freectx(s->ctx[i]); /* the providers' freectx cleanses */
        }
        free(s->guard[i][0]);
        free(s->guard[i][1]);
        s->guard[i][0] = s->guard[i][1] = NULL;
        s->ctx[i] = NULL;
        s->serial[i] = 0;
    }
    sodium_memzero(s->prefix, sizeof s->prefix);
}
