/*
 * fuzz/fuzz_aead.c -- the payload AEAD's two engines against each other
 * (migrate/crypto/aead.h; docs/format.md [F-CRYPTO-ALG-1]).
 *
 * Input: a control byte, then the key (32 bytes), the nonce (24; aes-256-gcm
 * uses the first 12), a length byte and that many AAD bytes, two bytes of
 * a tamper position, and the rest as the plaintext (reads past the end give
 * zeros).  Control bits: 0 the algorithm (aes-256-gcm, else
 * xchacha20-poly1305; aes-256-gcm is skipped without AES-NI), 1 which
 * engine seals (OpenSSL, else libsodium) and so which opens, 2 tamper, 3
 * keep the previous input's key under the previous serial (the OpenSSL
 * states then keep their keys: for xchacha20-poly1305 only a new nonce
 * prefix keys them again), 4 the libsodium side uses the expanded AES-GCM
 * key (aes-256-gcm).  The OpenSSL states live across inputs, as a
 * shard's do across calls.
 *
 * Oracles (each failure calls abort(), so every engine reports it):
 *   1. Both engines seal to the same bytes, and those are libsodium's
 *      combined call's (the independent oracle, called directly).
 *   2. The engine that did not seal opens them to the plaintext; so does
 *      the one that did.
 *   3. Tampered (one bit of the ciphertext or tag flipped): both engines
 *      refuse, and each leaves its output all zero.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include <keyshift/envelope.h>

#include "../migrate/crypto/aead.h"
#include "fuzz_check.h"
#include "fuzz_input.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The longest plaintext an input can carry (max_len 4096 in the options). */
#define PT_MAX 4096

/* The OpenSSL states of the two directions, and the key they may hold. */
static ks_aead_evp st_enc, st_dec;
static uint8_t last_key[32];
static uint64_t last_serial;

/* libsodium's combined encryption of m[0, n) into c (the oracle). */
static void oracle_seal(uint32_t alg, uint8_t *c, const uint8_t *m, size_t n, const uint8_t *ad,
                        size_t adlen, const uint8_t *nonce, const uint8_t *key)
{
    unsigned long long clen = 0;
    int rc = alg == KS_ALG_AES256GCM
                 ? crypto_aead_aes256gcm_encrypt(c, &clen, m, n, ad, adlen, NULL, nonce, key)
                 : crypto_aead_xchacha20poly1305_ietf_encrypt(c, &clen, m, n, ad, adlen, NULL, nonce, key);
    CHECK(rc == 0 && clen == n + KS_TAG_LEN);
}

/* Nonzero when p[0, n) is all zero. */
static int all_zero(const uint8_t *p, size_t n)
{
    uint8_t acc = 0;
    for (size_t i = 0; i < n; i++) {
        acc |= p[i];
    }
    return acc == 0;
}

/* See the top. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static uint8_t pt[PT_MAX], c_s[PT_MAX + KS_TAG_LEN], c_o[PT_MAX + KS_TAG_LEN],
        want[PT_MAX + KS_TAG_LEN], back[PT_MAX + 1];
    uint8_t key[32], nonce[24], ad[255];
    ks_fuzz_input in = {data, size, 0};
    if (sodium_init() < 0) {
        abort();
    }
    const uint8_t ctl = ks_fuzz_next(&in);
    const uint32_t alg = ctl & 1 ? KS_ALG_AES256GCM : KS_ALG_XCHACHA20POLY1305;
    if (alg == KS_ALG_AES256GCM && !crypto_aead_aes256gcm_is_available()) {
        return 0;
    }
    for (size_t i = 0; i < sizeof key; i++) {
        key[i] = ks_fuzz_next(&in);
    }
    for (size_t i = 0; i < sizeof nonce; i++) {
        nonce[i] = ks_fuzz_next(&in);
    }
    const size_t adlen = ks_fuzz_next(&in);
    for (size_t i = 0; i < adlen; i++) {
        ad[i] = ks_fuzz_next(&in);
    }
    size_t at = (size_t)ks_fuzz_next(&in) << 8;
    at |= ks_fuzz_next(&in);
    const size_t n = in.off < size ? (size - in.off < PT_MAX ? size - in.off : PT_MAX) : 0;
    memcpy(pt, data + in.off, n);

    if ((ctl & 8) && last_serial != 0) {
        memcpy(key, last_key, sizeof key); /* the same key under the same serial */
    } else {
        memcpy(last_key, key, sizeof key);
        last_serial = ks_aead_serial();
    }
    crypto_aead_aes256gcm_state aes;
    const int expanded = alg == KS_ALG_AES256GCM && (ctl & 16);
    if (expanded) {
        (void)crypto_aead_aes256gcm_beforenm(&aes, key);
    }
    const ks_aead_key enc = {alg, key, expanded ? &aes : NULL, &st_enc, last_serial};
    const ks_aead_key dec = {alg, key, expanded ? &aes : NULL, &st_dec, last_serial};
    const ks_aead_engine sealer = ctl & 2 ? KS_AEAD_OPENSSL : KS_AEAD_SODIUM;
    const ks_aead_engine opener = sealer == KS_AEAD_OPENSSL ? KS_AEAD_SODIUM : KS_AEAD_OPENSSL;

    /* 1. the same bytes from both engines, and the oracle's */
    oracle_seal(alg, want, pt, n, ad, adlen, nonce, key);
    CHECK(ks_aead_encrypt(sealer, &enc, c_s, pt, n, ad, adlen, nonce) == 0);
    CHECK(ks_aead_encrypt(opener, &enc, c_o, pt, n, ad, adlen, nonce) == 0);
    CHECK(memcmp(c_s, want, n + KS_TAG_LEN) == 0);
    CHECK(memcmp(c_o, want, n + KS_TAG_LEN) == 0);

    /* 2. each engine opens them */
    CHECK(ks_aead_decrypt(opener, &dec, back, c_s, n + KS_TAG_LEN, ad, adlen, nonce) == 0);
    CHECK(memcmp(back, pt, n) == 0);
    CHECK(ks_aead_decrypt(sealer, &dec, back, c_s, n + KS_TAG_LEN, ad, adlen, nonce) == 0);
    CHECK(memcmp(back, pt, n) == 0);

    /* 3. a flipped bit: both refuse, leaving nothing */
    if (ctl & 4) {
        const size_t pos = at % (n + KS_TAG_LEN);
        c_s[pos] ^= (uint8_t)(1u << (at >> 13));
        for (int e = KS_AEAD_SODIUM; e <= KS_AEAD_OPENSSL; e++) {
            memset(back, 0xA5, n + 1);
            CHECK(ks_aead_decrypt((ks_aead_engine)e, &dec, back, c_s, n + KS_TAG_LEN, ad, adlen, nonce) != 0);
            CHECK(all_zero(back, n));
        }
    }
    sodium_memzero(&aes, sizeof aes);
    return 0;
}
