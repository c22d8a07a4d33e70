/*
 * keyshift/keyring.h -- the local keyring: a file of KEKs, and the "local"
 * key provider backed by it.  The format is specified in docs/keyring.md.
 *
 * A keyring holds keys by key_id; each key has numbered versions (1, 2,
 * ...), each with 32 bytes of KEK material and a state (ks_key_state), and
 * exactly one primary version, used for new wraps.  A new version is not
 * primary: promoting is a separate step, taken only once every reader has
 * the new version.
 *
 * Files.  The keyring file must be a regular file that neither group nor
 * others can read or write (else KS_ERR_INSECURE, as ssh refuses such
 * keys).  Every change locks "<path>.lock" (flock, exclusive), re-reads the
 * file, applies the change and replaces the file atomically (temporary
 * file, fsync, rename, fsync of the directory), so concurrent writers never
 * lose an update and a crash leaves the old or the new keyring, never a
 * broken one.
 *
 * Passphrase.  A keyring may be sealed with a passphrase (Argon2id through
 * crypto_pwhash, then crypto_secretbox).  The passphrase is passed in as
 * bytes; the CLI reads it from a file or an environment variable, never
 * from argv.  {NULL, 0} means an unsealed keyring.
 *
 * Memory.  KEK material is held in sodium_malloc'd (guarded, mlocked)
 * memory and wiped by ks_keyring_close() and on every error path.
 * A ks_keyring is safe to use from several threads.
 */
#ifndef KEYSHIFT_KEYRING_H
#define KEYSHIFT_KEYRING_H

#include <keyshift/common.h>
#include <keyshift/envelope.h>
#include <keyshift/error.h>
#include <keyshift/provider.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KS_KEK_LEN 32               /* bytes of KEK material per version */
#define KS_KEYRING_MAX_KEYS 1024    /* keys in one keyring */
#define KS_KEYRING_MAX_VERSIONS 4096 /* versions of one key */
/* Wrapped DEKs made by the local provider: nonce (24) || DEK (32) || tag (16). */
#define KS_LOCAL_WRAPPED_LEN 72

typedef struct ks_keyring ks_keyring;

/* Create an empty keyring file at path, mode 0600; KS_ERR_EXISTS if a file
 * is already there.  passphrase {NULL, 0}: unsealed. */
KS_API KS_WUR ks_err ks_keyring_init(const char *path, ks_bytes passphrase);

/*
 * Read the keyring at path into memory.  KS_ERR_INSECURE for a symbolic
 * link, a file that is not regular, not owned by the caller (or root), or
 * that group or others may read or write; KS_ERR_IO when it cannot be read
 * (or does not exist); KS_ERR_BAD_PASSPHRASE when a sealed keyring does
 * not open with passphrase (or is not sealed but one was given, or the
 * reverse: docs/keyring.md [K-SEAL-6]); KS_ERR_INTEGRITY with *err filled
 * (code, file offset [K-ERR-2], field = 1-based key record index or 0) when
 * it does not parse.  *out is NULL on error.
 */
KS_API KS_WUR ks_err ks_keyring_open(const char *path, ks_bytes passphrase, ks_keyring **out,
                                     ks_parse_error *err);

/* Wipe and free a keyring; NULL is a no-op. */
KS_API void ks_keyring_close(ks_keyring *kr);

/* Changes.  Each locks, re-reads, changes, writes and refreshes kr (kr
 * shows the re-read keyring even when the change itself is refused).
 * Besides the errors listed: KS_ERR_NOT_FOUND for an unknown key_id or
 * version, KS_ERR_INVALID_ARGUMENT for version 0, and the errors of
 * ks_keyring_open() from the re-read.  A change that is already in effect
 * (promote the primary, set a version's own state) succeeds and writes
 * nothing. */

/* Add key_id with version 1, active and primary.  KS_ERR_EXISTS if the key
 * is there; KS_ERR_BAD_VALUE if key_id breaks the format's charset or
 * length rules [F-KEYID-1]. */
KS_API KS_WUR ks_err ks_keyring_create(ks_keyring *kr, ks_bytes key_id);

/* Add the next version of key_id, active and NOT primary; its number is
 * stored in *version.  KS_ERR_TOO_LARGE at KS_KEYRING_MAX_VERSIONS (and
 * for ks_keyring_create at KS_KEYRING_MAX_KEYS). */
KS_API KS_WUR ks_err ks_keyring_add_version(ks_keyring *kr, ks_bytes key_id, uint32_t *version);

/* As ks_keyring_add_version(), with the given material instead of fresh
 * random bytes: for importing keys from elsewhere and for test vectors. */
KS_API KS_WUR ks_err ks_keyring_import_version(ks_keyring *kr, ks_bytes key_id,
                                               const uint8_t kek[KS_KEK_LEN], uint32_t *version);

/* Make version the primary of key_id.  It must be active (KS_ERR_STATE). */
KS_API KS_WUR ks_err ks_keyring_promote(ks_keyring *kr, ks_bytes key_id, uint32_t version);

/*
 * Set the state of a version.  Allowed: any change among active,
 * decrypt-only and disabled (either direction), and any -> destroyed,
 * which wipes the material for good.  Refused with KS_ERR_STATE: leaving
 * destroyed, and any change that leaves the primary not active (promote
 * another version first).  KS_ERR_INVALID_ARGUMENT for a state outside
 * 1..4.  docs/keyring.md [K-STATE-2], [K-STATE-3].
 */
KS_API KS_WUR ks_err ks_keyring_set_state(ks_keyring *kr, ks_bytes key_id, uint32_t version,
                                          ks_key_state state);

/* Listing.  Views are valid until the next change or close. */
typedef struct ks_keyring_key {
    ks_bytes key_id;
    uint32_t primary;        /* the primary version */
    uint32_t versions;       /* number of versions: 1 .. versions */
} ks_keyring_key;

typedef struct ks_keyring_version {
    uint32_t version;
    ks_key_state state;
    uint64_t created;        /* Unix time, seconds */
} ks_keyring_version;

/* The number of keys. */
KS_API size_t ks_keyring_count(const ks_keyring *kr);

/* The i-th key, in key_id order; KS_ERR_NOT_FOUND past the end. */
KS_API KS_WUR ks_err ks_keyring_key_at(const ks_keyring *kr, size_t i, ks_keyring_key *out);

/* Version `version` (1-based) of the i-th key. */
KS_API KS_WUR ks_err ks_keyring_version_at(const ks_keyring *kr, size_t i, uint32_t version,
                                           ks_keyring_version *out);

/*
 * The "local" provider over kr.  The provider borrows kr: kr must outlive
 * it, and ks_provider_destroy() on it does not close kr.  Wrapping is
 * XChaCha20-Poly1305-IETF under the version's KEK with a random nonce
 * (docs/keyring.md); the result is KS_LOCAL_WRAPPED_LEN bytes.
 */
KS_API KS_WUR ks_err ks_keyring_provider(ks_keyring *kr, ks_provider *out);

#ifdef __cplusplus
}
#endif
#endif /* KEYSHIFT_KEYRING_H */
