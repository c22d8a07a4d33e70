/*
 * migrate/crypto/v2_keys.h -- the format-2 message key and key commitment of
 * a DEK (docs/format.md [F-CRYPTO-KEY-4], [F-CRYPTO-COMMIT-2]).
 *
 * Both are functions of the DEK and the algorithm alone, so each side
 * computes them once per DEK and keeps them with it: the write side in
 * its DEK record (dek_writer.c), the read side in its cache entries
 * (crypto.c, dek_cache.c, shard.c).
 *
 * Internal to the library (no KS_API).
 */
#ifndef KS_MIGRATE_V2_KEYS_H
#define KS_MIGRATE_V2_KEYS_H

#include <stdint.h>

#include <keyshift/envelope.h>
#include <keyshift/provider.h>

/* The derivation input: "KSE" || u8(2) || u32be(algorithm) || DEK. */
#define KS_V2_KDF_IN_LEN (4 + 4 + KS_DEK_LEN)

/*
 * k = BLAKE2b-256(in; salt 0^16, personal "keyshift.v2.mkey") and
 * commitment = BLAKE2b-256(in; salt 0^16, personal "keyshift.v2.cmmt"),
 * in as above.  Either output may be NULL.  The input is wiped.
 */
void ks_v2_keys(uint32_t algorithm, const uint8_t dek[KS_DEK_LEN], uint8_t k[32],
                uint8_t commitment[KS_COMMITMENT_LEN]);

#endif /* KS_MIGRATE_V2_KEYS_H */
