/*
 * migrate/keys/keyring_format.h -- the keyring file format of docs/keyring.md:
 * a strict, allocation-free parser over ks_cursor and the canonical
 * encoder that is its inverse.
 *
 * Internal header.  Its functions have hidden visibility (the build uses
 * -fvisibility=hidden and none of them carries KS_API), so they are shared
 * by migrate/keys/keyring.c, the unit tests and fuzz/fuzz_keyring.c without
 * being part of the library's ABI.
 *
 * This part of the library knows bytes and rules only: no libsodium, no
 * file I/O, no allocation.  Sealing (Argon2id and secretbox) is done by
 * migrate/keys/keyring.c on the payload this parser delimits.
 */
#ifndef KS_MIGRATE_KEYRING_FORMAT_H
#define KS_MIGRATE_KEYRING_FORMAT_H

#include <stddef.h>
#include <stdint.h>

#include <keyshift/envelope.h>
#include <keyshift/error.h>
#include <keyshift/keyring.h>

/* [K-FRAME-1..3] The prefix: "KSK", the format version, the mode. */
#define KS_KRF_MAGIC_0 0x4B /* 'K' */
#define KS_KRF_MAGIC_1 0x53 /* 'S' */
#define KS_KRF_MAGIC_2 0x4B /* 'K' */
#define KS_KRF_FORMAT_V1 0x01
#define KS_KRF_MODE_PLAIN 0x00
#define KS_KRF_MODE_SEALED 0x01
#define KS_KRF_PREFIX_LEN 5

/* [K-SEAL-1] The sealed header after the prefix. */
#define KS_KRF_SALT_LEN 16  /* crypto_pwhash_SALTBYTES */
#define KS_KRF_NONCE_LEN 24 /* crypto_secretbox_NONCEBYTES */
#define KS_KRF_MAC_LEN 16   /* crypto_secretbox_MACBYTES */
#define KS_KRF_SEALED_HDR_LEN (KS_KRF_PREFIX_LEN + KS_KRF_SALT_LEN + 8 + 8 + KS_KRF_NONCE_LEN)

/* [K-SEAL-2] The Argon2id cost parameters a reader accepts: from
 * libsodium's minimum for Argon2id up to a ceiling that bounds the time
 * and memory an untrusted file can make a reader spend. */
#define KS_KRF_OPSLIMIT_MIN 1u
#define KS_KRF_OPSLIMIT_MAX 16u
#define KS_KRF_MEMLIMIT_MIN 8192u
#define KS_KRF_MEMLIMIT_MAX ((uint64_t)1 << 30) /* 1 GiB */

/* [K-BODY-1..4] Sizes of the body's elements. */
#define KS_KRF_COUNT_LEN 4                                /* u32be key count */
#define KS_KRF_KEY_FIXED_LEN (4 + 2 + 4 + 4)              /* record len, id len, count, primary */
#define KS_KRF_VERSION_HDR_LEN (4 + 1 + 8 + 1)            /* number, state, created, material len */
#define KS_KRF_VERSION_LEN (KS_KRF_VERSION_HDR_LEN + KS_KEK_LEN) /* a version with material */
/* The largest key record (after its u32be length) and the largest body. */
#define KS_KRF_RECORD_MAX                                                                      \
    ((size_t)2 + KS_KEY_ID_MAX + 4 + 4 + (size_t)KS_KEYRING_MAX_VERSIONS * KS_KRF_VERSION_LEN)
#define KS_KRF_BODY_MAX ((size_t)KS_KRF_COUNT_LEN + (size_t)KS_KEYRING_MAX_KEYS * (4 + KS_KRF_RECORD_MAX))
/* The largest keyring file: a reader refuses a longer one unread. */
#define KS_KRF_FILE_MAX ((size_t)KS_KRF_SEALED_HDR_LEN + KS_KRF_MAC_LEN + KS_KRF_BODY_MAX)

/* The prefix and, when sealed, the header of a keyring file.  Views point
 * into the parsed buffer. */
typedef struct ks_krf_header {
    uint8_t mode;           /* KS_KRF_MODE_PLAIN or KS_KRF_MODE_SEALED */
    ks_bytes salt;          /* sealed: KS_KRF_SALT_LEN bytes; else absent */
    uint64_t opslimit;      /* sealed: Argon2id passes; else 0 */
    uint64_t memlimit;      /* sealed: Argon2id memory in bytes; else 0 */
    ks_bytes nonce;         /* sealed: KS_KRF_NONCE_LEN bytes; else absent */
    ks_bytes payload;       /* plain: the body; sealed: the secretbox (MAC || ciphertext) */
    size_t payload_offset;  /* offset of payload in the file */
} ks_krf_header;

/* One key version.  Its number is its index + 1 in its key's array. */
typedef struct ks_krf_version {
    uint8_t state;            /* ks_key_state */
    uint64_t created;         /* Unix time, seconds */
    const uint8_t *material;  /* KS_KEK_LEN bytes; NULL exactly when destroyed */
} ks_krf_version;

/* One key: its id, its primary and its versions 1..count. */
typedef struct ks_krf_key {
    ks_bytes key_id;
    uint32_t primary;
    uint32_t count;
    const ks_krf_version *versions; /* count entries (NULL in a visitor's key call) */
} ks_krf_key;

/*
 * What ks_krf_parse_body() reports as it goes, for a caller that builds its
 * own copy.  key() is called once per key, after the key's header (id,
 * count, primary) has passed its checks and before its versions; version()
 * once per version of that key, in order, after the version has passed its
 * checks.  Views point into the parsed buffer.  The parse may still fail
 * later: a caller discards what it built unless the parse returns KS_OK.
 * A callback that returns an error ends the parse with that error (not a
 * rejection; *err is then not filled).  Both callbacks are required.
 */
typedef struct ks_krf_visitor {
    ks_err (*key)(void *ctx, const ks_krf_key *key);
    ks_err (*version)(void *ctx, const ks_krf_version *version);
    void *ctx;
} ks_krf_visitor;

/* Totals of a body that parsed, for sizing a copy. */
typedef struct ks_krf_summary {
    size_t keys;      /* keys */
    size_t versions;  /* versions, over all keys */
    size_t material;  /* versions that carry material (not destroyed) */
    size_t id_bytes;  /* bytes of all key_ids */
} ks_krf_summary;

/*
 * Parse the prefix and (sealed) header of a keyring file buf[0, len)
 * [K-FRAME], [K-SEAL-1..3].  On success fills *out; the payload is not
 * looked at beyond its length.  On failure returns a rejection code
 * (1..11), clears *out and fills *err (when not NULL) with the code, the
 * file offset and field 0.
 */
ks_err ks_krf_parse_header(const uint8_t *buf, size_t len, ks_krf_header *out, ks_parse_error *err);

/*
 * Parse a keyring body body[0, len) [K-BODY], [K-KEY], [K-VER] strictly.
 * base is the file offset reported for body[0] (docs/keyring.md
 * [K-ERR-2]).  vis may be NULL.  On success fills *sum (may be NULL) and
 * returns KS_OK.  A rejection returns its code (1..11) and fills *err
 * (when not NULL): code, offset (base + position in body) and field (the
 * 1-based index of the key record the error is in, 0 outside any).
 * Never allocates; reads only body[0, len); work linear in len.
 */
ks_err ks_krf_parse_body(const uint8_t *body, size_t len, size_t base, const ks_krf_visitor *vis,
                         ks_krf_summary *sum, ks_parse_error *err);

/*
 * Check that keys[0, n) would encode to a body the parser accepts, and
 * compute its length into *len.  Returns KS_OK or the code the parser
 * would give for the encoded bytes (KS_ERR_TOO_LARGE, KS_ERR_BAD_VALUE,
 * KS_ERR_FIELD_ORDER), or KS_ERR_INVALID_ARGUMENT for NULL pointers or a
 * version whose material does not match its state.
 */
ks_err ks_krf_body_len(const ks_krf_key *keys, size_t n, size_t *len);

/* Encode keys[0, n) as a canonical body into out[0, cap); its length goes
 * to *out_len.  Errors as ks_krf_body_len(), then KS_ERR_BUFFER_TOO_SMALL
 * (nothing written). */
ks_err ks_krf_encode_body(const ks_krf_key *keys, size_t n, uint8_t *out, size_t cap,
                          size_t *out_len);

/*
 * Encode the prefix and (sealed) header of h (its payload is not written)
 * into out[0, cap); the length, KS_KRF_PREFIX_LEN or KS_KRF_SEALED_HDR_LEN,
 * goes to *out_len.  KS_ERR_BAD_VALUE for a mode or sealing parameter the
 * parser would refuse, KS_ERR_INVALID_ARGUMENT for a wrong salt or nonce
 * length, KS_ERR_BUFFER_TOO_SMALL.
 */
ks_err ks_krf_encode_header(const ks_krf_header *h, uint8_t *out, size_t cap, size_t *out_len);

/* Check a key_id against [F-KEYID-1] (1..KS_KEY_ID_MAX bytes of the
 * key_id class): KS_OK or KS_ERR_BAD_VALUE. */
ks_err ks_krf_check_key_id(ks_bytes key_id);

/* Compare two non-empty key_ids in the keyring's order [K-KEY-3]:
 * bytewise, a proper prefix first.  Negative, zero or positive, like
 * memcmp. */
int ks_krf_key_id_cmp(ks_bytes a, ks_bytes b);

/* ---- between keyring.c and provider_local.c ---------------- */

/* Called by ks_keyring_use() with the key and the resolved version number
 * (1..key->count) while the keyring is read-locked: key->versions and their
 * material stay valid, and no change can run, until it returns. */
typedef ks_err (*ks_krf_use_fn)(void *ctx, const ks_krf_key *key, uint32_t version);

/*
 * Look up (key_id, version) in kr, version 0 meaning the key's primary,
 * and call fn under kr's read lock.  KS_ERR_NOT_FOUND for an unknown key
 * or a version past the last; else what fn returns.  This is how the
 * local provider reaches key material without copying it out of the
 * keyring's guarded memory.
 */
ks_err ks_keyring_use(const ks_keyring *kr, ks_bytes key_id, uint32_t version, ks_krf_use_fn fn,
                      void *ctx);

#endif /* KS_MIGRATE_KEYRING_FORMAT_H */
