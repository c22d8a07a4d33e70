/*
 * migrate/crypto/v2_keys.c -- see v2_keys.h (docs/format.md [F-CRYPTO-KEY-4],
 * [F-CRYPTO-COMMIT-2]).
 */
#include <assert.h>
#include <string.h>

#include <sodium.h>

#include "../../format/rules.h"
#include "v2_keys.h"

/* The two personalisations: distinct labels for the key and the
 * commitment, so that the two outputs are independent functions. */
static const uint8_t pers_mkey[crypto_generichash_blake2b_PERSONALBYTES] = {
    'k', 'e', 'y', 's', 'h', 'i', 'f', 't', '.', 'v', '2', '.', 'm', 'k', 'e', 'y'};
static const uint8_t pers_cmmt[crypto_generichash_blake2b_PERSONALBYTES] = {
    'k', 'e', 'y', 's', 'h', 'i', 'f', 't', '.', 'v', '2', '.', 'c', 'm', 'm', 't'};

/* out = BLAKE2b-256(in[0, KS_V2_KDF_IN_LEN)) with a zero salt and the given
 * personalisation. */
static void blake2b_personal(const uint8_t *in, const uint8_t *personal, uint8_t out[32])
{
    static const uint8_t salt[crypto_generichash_blake2b_SALTBYTES];
    int rc = crypto_generichash_blake2b_salt_personal(out, 32, in, KS_V2_KDF_IN_LEN, NULL, 0, salt,
                                                      personal);
    assert(rc == 0); /* fixed, valid lengths */
    (void)rc;
}

/* See v2_keys.h.  The prefix binds the format version and the algorithm,
 * so the same DEK bytes never give the same key under two algorithms. */
void ks_v2_keys(uint32_t algorithm, const uint8_t dek[KS_DEK_LEN], uint8_t k[32],
                uint8_t commitment[KS_COMMITMENT_LEN])
{
    uint8_t in[KS_V2_KDF_IN_LEN];
    in[0] = KS_MAGIC_0;
    in[1] = KS_MAGIC_1;
    in[2] = KS_MAGIC_2;
    in[3] = KS_FORMAT_V2;
    ks_be_put(in + 4, algorithm, 4);
    memcpy(in + 8, dek, KS_DEK_LEN);
    if (k != NULL) {
        blake2b_personal(in, pers_mkey, k);
    }
    if (commitment != NULL) {
        blake2b_personal(in, pers_cmmt, commitment);
    }
    sodium_memzero(in, sizeof in);
}
