/*
 * migrate/crypto/aead.h -- the payload AEAD of docs/format.md
 * [F-CRYPTO-ALG-1] with two engines: OpenSSL's libcrypto (its providers'
 * ciphers) and libsodium.  Both produce exactly the bytes that clause spells out, so an
 * envelope is the same whichever engine sealed it, and either opens it.
 *
 * The engine of a call (ks_aead_engine_for()): for aes-256-gcm, OpenSSL
 * for a payload of at least KS_AEAD_OPENSSL_MIN_AES256GCM bytes and
 * libsodium below, where OpenSSL's per-message set-up costs more than
 * libsodium's whole call; for xchacha20-poly1305, OpenSSL at every size
 * (KS_AEAD_OPENSSL_MIN_XCHACHA is 0), as libsodium derives the HChaCha20
 * subkey on every call and OpenSSL's state keeps it (docs/PERFORMANCE.md
 * has the measurements).  The environment variable KS_AEAD_ENGINE, read once
 * per process, forces one engine ("sodium" or "openssl"; anything else is
 * the rule above), for tests and measurements; ks_aead_test_force() does
 * the same from a test.  A call that has no per-thread OpenSSL state
 * (ks_aead_evp: a thread without a shard, shard.h), or that only checks a
 * tag (ks_verify), always runs on libsodium.
 *
 * OpenSSL state: a cipher context of the provider per algorithm (aead.c
 * calls the fetched cipher's provider functions, not EVP's wrappers),
 * made on a slot's first use for one direction, then keyed once per key
 * (for xchacha20-poly1305: per HChaCha20 subkey, i.e. per key and nonce
 * prefix, which a writer's DEK keeps for its life, [F-CRYPTO-NONCE-1]); a
 * message only sets the IV.  So a call allocates nothing.  A slot belongs
 * to one thread at a time (a shard's owner).
 *
 * Internal to the library (no KS_API).
 */
#ifndef KS_MIGRATE_AEAD_H
#define KS_MIGRATE_AEAD_H

#include <assert.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <sodium.h>

#include <keyshift/envelope.h>
#include <keyshift/error.h>

/* An engine; KS_AEAD_AUTO: the size rule (and the forced engine, if any). */
typedef enum ks_aead_engine { KS_AEAD_AUTO = 0, KS_AEAD_SODIUM = 1, KS_AEAD_OPENSSL = 2 } ks_aead_engine;

/* Two cache lines, the unit in which the adjacent-line prefetcher pulls
 * them: what one thread writes on every call sits on pairs of its own
 * (the guard blocks around a context's allocations, a shard). */
#define KS_LINE_PAIR 128u

/* The smallest payloads the OpenSSL engine seals and opens by the rule. */
#define KS_AEAD_OPENSSL_MIN_AES256GCM 512u
#define KS_AEAD_OPENSSL_MIN_XCHACHA 0u

/* One thread's OpenSSL state for one key at a time (see the top).  All
 * zero is empty: nothing made, nothing keyed. */
typedef struct ks_aead_evp {
    void *ctx[2];          /* the provider's contexts: [0] aes-256-gcm, [1] xchacha20-poly1305 */
    void *guard[2][2];     /* heap blocks just before and after ctx[i]'s (aead.c) */
    uint64_t serial[2];    /* the key loaded into each (ks_aead_serial()), 0: none */
    uint8_t prefix[16];    /* xchacha20-poly1305: the nonce prefix its subkey is of */
    uint8_t enc[2];        /* the direction ctx[i] was made for: 1 encrypt, 0 decrypt */
} ks_aead_evp;

/* The key of one call. */
typedef struct ks_aead_key {
    uint32_t alg;          /* KS_ALG_AES256GCM or KS_ALG_XCHACHA20POLY1305 */
    const uint8_t *key;    /* the 32-byte AEAD key (NULL only with aes below) */
    const void *aes;       /* aes-256-gcm: libsodium's expanded key of key, or NULL */
    ks_aead_evp *evp;      /* this thread's OpenSSL state for key, or NULL */
    uint64_t serial;       /* names key among the process's keys (with evp) */
} ks_aead_key;

/* A serial never handed out before in this process, never 0: every key
 * given an evp slot gets one when it is made or loaded. */
uint64_t ks_aead_serial(void);

/* The size rule alone: the engine for alg on a payload of len bytes.
 * The thresholds are where the two engines' times cross with an 84-byte
 * AAD (docs/PERFORMANCE.md, "The engine rule"): below 512 bytes
 * libsodium's aes-256-gcm beats OpenSSL's per-message set-up; OpenSSL's
 * xchacha20-poly1305 wins at every size. */
static inline ks_aead_engine ks_aead_engine_rule(uint32_t alg, size_t len)
{
    const size_t min = alg == KS_ALG_AES256GCM ? KS_AEAD_OPENSSL_MIN_AES256GCM : KS_AEAD_OPENSSL_MIN_XCHACHA;
    return len >= min ? KS_AEAD_OPENSSL : KS_AEAD_SODIUM;
}

/* What every AUTO call asks first, in one load (aead.c): the forced
 * engine (a test's, else the environment's) or KS_AEAD_AUTO; -1 until
 * the engines are set up. */
extern __attribute__((visibility("hidden"))) _Atomic int ks_aead_forced;

/* Set the engines up (once per process) and return ks_aead_forced. */
int ks_aead_forced_init(void);

/* The engine that runs alg on a payload of len bytes: the forced one, if
 * any, else ks_aead_engine_rule() (see the top).  Inline: after the first
 * call, one load and the rule. */
static inline ks_aead_engine ks_aead_engine_for(uint32_t alg, size_t len)
{
    int e = atomic_load_explicit(&ks_aead_forced, memory_order_acquire);
    if (e < 0) {
        e = ks_aead_forced_init();
    }
    return e != KS_AEAD_AUTO ? (ks_aead_engine)e : ks_aead_engine_rule(alg, len);
}

#ifdef KS_TEST_HOOKS
/* Tests: the calls each engine completed (ks_aead_test_count()). */
extern __attribute__((visibility("hidden"))) _Atomic uint64_t ks_aead_runs[3];
#define KS_AEAD_COUNT_RUN(e) atomic_fetch_add_explicit(&ks_aead_runs[e], 1, memory_order_relaxed)
#else
#define KS_AEAD_COUNT_RUN(e) ((void)0)
#endif

/* The OpenSSL engine (aead.c): encrypt (enc 1: out the ciphertext and
 * tag of in) or decrypt (enc 0: out the plaintext of in, tag at in +
 * mlen) as ks_aead_encrypt() and ks_aead_decrypt() below, with this
 * thread's state k->evp.  0 on success, -1 on failure (a decryption
 * leaves out zero), 1 when the state cannot be set up (nothing written). */
KS_WUR int ks_aead_openssl(const ks_aead_key *k, int enc, uint8_t *out, const uint8_t *in, size_t mlen,
                           const uint8_t *ad, size_t adlen, const uint8_t *nonce);

/* libsodium's detached encryption, the tag at c + mlen; 0 on success. */
static inline int ks_aead_sodium_encrypt(const ks_aead_key *k, uint8_t *c, const uint8_t *m, size_t mlen,
                                         const uint8_t *ad, size_t adlen, const uint8_t *nonce)
{
    if (k->alg == KS_ALG_AES256GCM && k->aes != NULL) {
        return crypto_aead_aes256gcm_encrypt_detached_afternm(
            c, c + mlen, NULL, m, mlen, ad, adlen, NULL, nonce, (const crypto_aead_aes256gcm_state *)k->aes);
    }
    if (k->alg == KS_ALG_AES256GCM) {
        return crypto_aead_aes256gcm_encrypt_detached(c, c + mlen, NULL, m, mlen, ad, adlen, NULL, nonce,
                                                      k->key);
    }
    return crypto_aead_xchacha20poly1305_ietf_encrypt_detached(c, c + mlen, NULL, m, mlen, ad, adlen, NULL,
                                                               nonce, k->key);
}

/* libsodium's detached decryption of c[0, mlen) with the tag at c + mlen;
 * m NULL verifies the tag only: every libsodium AEAD's detached
 * decryption computes and compares the tag first and returns right there
 * when it has no output buffer (tests/test_crypto.c pins this). */
static inline int ks_aead_sodium_decrypt(const ks_aead_key *k, uint8_t *m, const uint8_t *c, size_t mlen,
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

/* Encrypt m[0, mlen) into c[0, mlen + 16) under k, nonce and ad
 * [F-CRYPTO-ALG-1] on engine e (AUTO: ks_aead_engine_for(), falling back
 * to libsodium when the OpenSSL state cannot be set up; OPENSSL: fails
 * instead).  0 on success.  Inline, with libsodium's calls, so that a
 * seal makes a small payload's call itself. */
KS_WUR static inline __attribute__((always_inline)) int ks_aead_encrypt(ks_aead_engine e,
                                                                        const ks_aead_key *k, uint8_t *c,
                                                                        const uint8_t *m, size_t mlen,
                                                                        const uint8_t *ad, size_t adlen,
                                                                        const uint8_t *nonce)
{
    const ks_aead_engine run = e == KS_AEAD_AUTO ? ks_aead_engine_for(k->alg, mlen) : e;
    if (run == KS_AEAD_OPENSSL) {
        const int r = ks_aead_openssl(k, 1, c, m, mlen, ad, adlen, nonce);
        if (r <= 0 || e == KS_AEAD_OPENSSL) {
            return r <= 0 ? r : -1;
        }
    }
    if (k->key == NULL && k->aes == NULL) {
        return -1;
    }
    KS_AEAD_COUNT_RUN(KS_AEAD_SODIUM);
    return ks_aead_sodium_encrypt(k, c, m, mlen, ad, adlen, nonce);
}

/* Decrypt c[0, clen) (clen >= 16) into m[0, clen - 16) on engine e as
 * above; 0 when the tag verifies, else m is left zero.  m NULL: verify
 * the tag only, decrypting nothing (libsodium whatever e says). */
KS_WUR static inline __attribute__((always_inline)) int ks_aead_decrypt(ks_aead_engine e,
                                                                        const ks_aead_key *k, uint8_t *m,
                                                                        const uint8_t *c, size_t clen,
                                                                        const uint8_t *ad, size_t adlen,
                                                                        const uint8_t *nonce)
{
    assert(clen >= KS_TAG_LEN); /* [F-LEN-2]: the parser refuses a shorter one */
    const size_t mlen = clen - KS_TAG_LEN;
    const ks_aead_engine run = e == KS_AEAD_AUTO ? ks_aead_engine_for(k->alg, mlen) : e;
    if (run == KS_AEAD_OPENSSL && m != NULL) {
        const int r = ks_aead_openssl(k, 0, m, c, mlen, ad, adlen, nonce);
        if (r <= 0 || e == KS_AEAD_OPENSSL) {
            return r <= 0 ? r : -1;
        }
    }
    if (k->key == NULL && k->aes == NULL) {
        return -1;
    }
    KS_AEAD_COUNT_RUN(KS_AEAD_SODIUM);
    return ks_aead_sodium_decrypt(k, m, c, mlen, ad, adlen, nonce);
}

/* Overwrite every key schedule loaded into s with one of a zero key and
 * forget its keys (the contexts stay for the next key). */
void ks_aead_evp_wipe(ks_aead_evp *s);

/* Free s's contexts (OpenSSL cleanses their key schedules) and empty it. */
void ks_aead_evp_free(ks_aead_evp *s);

/* Tests only: force engine e for every AUTO call (KS_AEAD_AUTO: back to
 * the environment's choice and the rule). */
void ks_aead_test_force(ks_aead_engine e);

/* Tests only (built with -DKS_TEST_HOOKS; 0 otherwise): the calls each
 * engine completed so far, [KS_AEAD_SODIUM] and [KS_AEAD_OPENSSL]. */
uint64_t ks_aead_test_count(ks_aead_engine e);

#endif /* KS_MIGRATE_AEAD_H */
