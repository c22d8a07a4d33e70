/*
 * keyshift/provider.h -- the key-provider interface.
 *
 * A provider holds key-encryption keys (KEKs) and does two things with
 * them: wrap a data-encryption key (DEK) and unwrap one.  KEKs never leave
 * the provider.  The library reaches key management only through this
 * interface, so a PKCS#11 token or an external KMS plugs in without any
 * change to sealing, opening or the migration engine.
 *
 * Keys are named by a key_id (the envelope's field 3) and versioned by a
 * key_version (field 4).  Every version has a state (ks_key_state).
 *
 * Errors.  A provider returns KS_OK or one of
 *   KS_ERR_UNAVAILABLE, KS_ERR_TIMEOUT      may be retried later;
 *   KS_ERR_DENIED, KS_ERR_REVOKED,
 *   KS_ERR_NOT_FOUND, KS_ERR_INTEGRITY      never retried;
 *   KS_ERR_AUTH_FAILED                      unwrap only: the wrapped bytes
 *                                           or the AAD are not genuine;
 *   KS_ERR_BUFFER_TOO_SMALL, KS_ERR_INVALID_ARGUMENT, KS_ERR_NO_MEMORY.
 * A provider never falls back to another key or version.
 *
 * Blocking.  Calls may block (network, token); each gets a deadline in
 * milliseconds, 0 meaning the provider's default, and must return
 * KS_ERR_TIMEOUT rather than outlive it.  Calls may come from several
 * threads at once: a provider is thread-safe.
 *
 * Ownership.  The caller owns every buffer.  A provider never keeps a
 * pointer to a DEK, an AAD or a wrapped blob after the call returns, and
 * wipes any copy of a DEK it made.
 */
#ifndef KEYSHIFT_PROVIDER_H
#define KEYSHIFT_PROVIDER_H

#include <keyshift/common.h>
#include <keyshift/error.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes in a DEK: every algorithm of the format uses a 256-bit key. */
#define KS_DEK_LEN 32

/* The state of one key version (docs/keyring.md [K-STATE]).  A version may
 * move freely among active, decrypt-only and disabled; any state may move
 * to destroyed, which wipes the material and is final. */
typedef enum ks_key_state {
    KS_KEY_ACTIVE = 1,       /* "active": wraps and unwraps */
    KS_KEY_DECRYPT_ONLY = 2, /* "decrypt-only": unwraps; wrap is denied */
    KS_KEY_DISABLED = 3,     /* "disabled": nothing; both are denied; reversible */
    KS_KEY_DESTROYED = 4     /* "destroyed": material wiped; revoked; irreversible */
} ks_key_state;

/* The name of a state ("active", ...), or NULL for an undefined value. */
KS_API const char *ks_key_state_name(int state);

/* The state for a name, or 0 when the name is unknown. */
KS_API int ks_key_state_from_name(const char *name);

/* What a provider says about one key version. */
typedef struct ks_key_info {
    uint32_t version;        /* the version described (the primary when 0 was asked) */
    ks_key_state state;
    int is_primary;          /* nonzero for the key's primary version */
} ks_key_info;

/* One key version as a provider lists it (ks_provider_admin_ops.list). */
typedef struct ks_key_entry {
    ks_bytes key_id;         /* valid during the callback only */
    uint32_t version;
    ks_key_state state;
    int is_primary;
    uint64_t created;        /* Unix time, seconds; 0 when the provider does not know */
} ks_key_entry;

/* Called once per listed key version; a nonzero return stops the listing
 * (ks_provider_admin_ops.list). */
typedef int (*ks_key_list_fn)(void *arg, const ks_key_entry *entry);

/*
 * Key management (the CLI's `keys` commands), optional: a provider that
 * cannot manage its keys has none.  KEK material is always generated
 * inside the provider and never leaves it.  The state rules are those of
 * docs/keyring.md [K-STATE-1..3] for every provider: any change among
 * active, decrypt-only and disabled; any state to destroyed, which is
 * final; never a change that leaves the primary not active.  Errors, as
 * ks_keyring_create() and its siblings give them: KS_ERR_EXISTS,
 * KS_ERR_NOT_FOUND, KS_ERR_STATE, KS_ERR_BAD_VALUE (a key_id outside
 * [F-KEYID-1]), KS_ERR_TOO_LARGE, KS_ERR_INVALID_ARGUMENT, and the
 * provider errors above.  A change already in effect succeeds.
 */
typedef struct ks_provider_admin_ops {
    /* Create key_id with version 1, active and primary. */
    ks_err (*create)(void *self, ks_bytes key_id, uint32_t timeout_ms);
    /* Add the next version of key_id, active and not primary; its number
     * goes to *version. */
    ks_err (*add_version)(void *self, ks_bytes key_id, uint32_t *version, uint32_t timeout_ms);
    /* Make version the primary of key_id; it must be active. */
    ks_err (*promote)(void *self, ks_bytes key_id, uint32_t version, uint32_t timeout_ms);
    /* Set the state of a version. */
    ks_err (*set_state)(void *self, ks_bytes key_id, uint32_t version, ks_key_state state,
                        uint32_t timeout_ms);
    /* Call fn for every version of key_id (every key when key_id is
     * empty), keys in key_id order, versions in increasing order.  A
     * nonzero return from fn stops the listing; list then returns KS_OK. */
    ks_err (*list)(void *self, ks_bytes key_id, ks_key_list_fn fn, void *arg, uint32_t timeout_ms);
} ks_provider_admin_ops;

/* The operations of a provider.  self is the provider's own state. */
typedef struct ks_provider_ops {
    /* Wrap dek[0, dek_len) under (key_id, key_version), binding aad, into
     * out[0, cap); *out_len receives the wrapped length (at most 1024,
     * the format's limit).  The version must be active (else
     * KS_ERR_DENIED, or KS_ERR_REVOKED once destroyed).  key_version is
     * never 0: the caller resolves the primary with key_info first. */
    ks_err (*wrap)(void *self, ks_bytes key_id, uint32_t key_version, const uint8_t *dek,
                   size_t dek_len, ks_bytes aad, uint8_t *out, size_t cap, size_t *out_len,
                   uint32_t timeout_ms);
    /* Unwrap wrapped under (key_id, key_version), checking aad, into
     * dek[0, dek_len).  The version must be active or decrypt-only.  On any
     * failure dek is left zeroed. */
    ks_err (*unwrap)(void *self, ks_bytes key_id, uint32_t key_version, ks_bytes wrapped,
                     ks_bytes aad, uint8_t *dek, size_t dek_len, uint32_t timeout_ms);
    /* Describe (key_id, key_version); key_version 0 means the primary. */
    ks_err (*key_info)(void *self, ks_bytes key_id, uint32_t key_version, ks_key_info *out,
                       uint32_t timeout_ms);
    /* Release self, wiping any key material. May be NULL. */
    void (*destroy)(void *self);
    /* Key management, or NULL (see ks_provider_admin_ops). */
    const ks_provider_admin_ops *admin;
} ks_provider_ops;

/* A provider: its operations, its state and a short name for messages
 * ("local", "pkcs11", ...). */
typedef struct ks_provider {
    const ks_provider_ops *ops;
    void *self;
    const char *name;
} ks_provider;

/* Call provider->ops->destroy(provider->self) if set, then clear *provider. */
KS_API void ks_provider_destroy(ks_provider *provider);

#ifdef __cplusplus
}
#endif
#endif /* KEYSHIFT_PROVIDER_H */
