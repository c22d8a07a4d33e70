/*
 * migrate/keys/p11_meta.h -- the "pkcs11" provider's per-key metadata
 * record (docs/providers.md, "PKCS#11 provider"): the CKA_VALUE of the one
 * CKO_DATA object a key_id has in the token.  It holds the key's primary
 * version and the state of every version, destroyed ones included.
 *
 * Layout (record version 1), every integer big-endian:
 *
 *   off     size  field
 *   0       4     magic "KSPM"
 *   4       1     record version, 1
 *   5       8     seq: sequence number, >= 1 (readers take the highest)
 *   13      2     L: key_id length, 1..256
 *   15      L     key_id, [F-KEYID-1]
 *   15+L    4     N: number of versions, 1..4096
 *   19+L    4     P: the primary version, 1..N
 *   23+L    N     the state of versions 1..N, one byte each, 1..4
 *                 (ks_key_state); the primary's is 1 (active)
 *
 * and nothing after: the record is exactly 23 + L + N bytes.  Every
 * record has one encoding, so parse-then-encode gives the same bytes.
 *
 * The token is not trusted to hold what was written: the parser reads
 * through parser/cursor.h, bounds every length, and refuses anything but
 * a canonical record of exactly that length.  Internal header: no
 * PKCS#11, no libsodium, no allocation (fuzz/fuzz_p11meta.c, the tests).
 */
#ifndef KS_MIGRATE_P11_META_H
#define KS_MIGRATE_P11_META_H

#include <stddef.h>
#include <stdint.h>

#include <keyshift/envelope.h>
#include <keyshift/error.h>
#include <keyshift/keyring.h>

#define KS_P11META_VERSION 1
#define KS_P11META_FIXED_LEN 23 /* every byte but key_id and the states */
#define KS_P11META_MAX_VERSIONS KS_KEYRING_MAX_VERSIONS
#define KS_P11META_MAX_LEN (KS_P11META_FIXED_LEN + KS_KEY_ID_MAX + KS_P11META_MAX_VERSIONS)

/* One parsed (or to-be-encoded) record; a value type, no views. */
typedef struct ks_p11meta {
    uint64_t seq;
    uint8_t key_id[KS_KEY_ID_MAX];
    size_t key_id_len;
    uint32_t nversions;
    uint32_t primary;
    uint8_t states[KS_P11META_MAX_VERSIONS]; /* states[v - 1]: version v */
} ks_p11meta;

/*
 * Parse buf[0, len) into *out.  KS_OK, or a rejection (nothing in *out is
 * then meaningful): KS_ERR_TOO_LARGE (len above KS_P11META_MAX_LEN, or a
 * key_id or version count above its limit), KS_ERR_TRUNCATED,
 * KS_ERR_BAD_MAGIC, KS_ERR_UNSUPPORTED_VERSION, KS_ERR_BAD_VALUE (seq 0, a
 * key_id outside [F-KEYID-1], no versions, a primary out of range or not
 * active, a state outside 1..4, bytes after the states);
 * KS_ERR_INVALID_ARGUMENT for NULL pointers.
 */
ks_err ks_p11meta_parse(const uint8_t *buf, size_t len, ks_p11meta *out);

/* The encoded length of m (23 + key_id_len + nversions). */
size_t ks_p11meta_len(const ks_p11meta *m);

/*
 * Encode m into out[0, cap); its length goes to *out_len.  Refuses a
 * record the parser would refuse, with the parser's code, and
 * KS_ERR_BUFFER_TOO_SMALL, KS_ERR_INVALID_ARGUMENT.
 */
ks_err ks_p11meta_encode(const ks_p11meta *m, uint8_t *out, size_t cap, size_t *out_len);

#endif /* KS_MIGRATE_P11_META_H */
