/*
 * keyshift/error.h -- stable error codes.
 *
 * Every function that can fail returns a ks_err.  KS_OK is 0; every failure
 * is a positive value.  The numeric values and the names returned by
 * ks_err_name() are stable across releases: scripts and logs may rely on
 * them.  New codes are only ever appended.
 *
 * Codes 1..31 are envelope rejections (docs/format.md, section 5); each comes
 * with the byte offset at which the problem was found.
 */
#ifndef KEYSHIFT_ERROR_H
#define KEYSHIFT_ERROR_H

#include <keyshift/common.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ks_err {
    KS_OK = 0,

    /* Envelope rejections (docs/format.md section 5). */
    KS_ERR_TRUNCATED = 1,           /* "truncated": input ended inside an element or before a required field */
    KS_ERR_BAD_MAGIC = 2,           /* "bad-magic": the first three bytes are not "KSE" */
    KS_ERR_UNSUPPORTED_VERSION = 3, /* "unsupported-version": version byte is not 1 or 2 */
    KS_ERR_WIRE_TYPE = 4,           /* "wire-type": wire type differs from the field table */
    KS_ERR_NONCANONICAL_VARINT = 5, /* "noncanonical-varint": a varint is not minimal */
    KS_ERR_VARINT_OVERFLOW = 6,     /* "varint-overflow": a varint does not fit in 32 bits */
    KS_ERR_FIELD_ORDER = 7,         /* "field-order": a duplicate or decreasing field number */
    KS_ERR_UNKNOWN_FIELD = 8,       /* "unknown-field": a field this version does not define */
    KS_ERR_MISSING_FIELD = 9,       /* "missing-field": a required field was skipped */
    KS_ERR_TOO_LARGE = 10,          /* "too-large": a length above the field's limit */
    KS_ERR_BAD_VALUE = 11,          /* "bad-value": a value outside the field's rule */

    /* Caller errors: the input was never looked at. */
    KS_ERR_INVALID_ARGUMENT = 32,   /* "invalid-argument": NULL pointer, bad limits, inconsistent struct */
    KS_ERR_BUFFER_TOO_SMALL = 33,   /* "buffer-too-small": output capacity below the encoded size */

    /* Sealing and opening (docs/format.md section 7). */
    KS_ERR_AUTH_FAILED = 64,        /* "auth-failed": an envelope did not open; one code whatever
                                       the cause (wrong key or context, tampering, commitment) */
    KS_ERR_ALGORITHM_UNAVAILABLE = 65, /* "algorithm-unavailable": e.g. AES-256-GCM without AES-NI */
    KS_ERR_NO_MEMORY = 66,          /* "no-memory": allocation (or mlock) failed */
    KS_ERR_CRYPTO_INIT = 67,        /* "crypto-init": libsodium could not be initialised */

    /* Key providers (include/keyshift/provider.h).  The first two may be
     * retried; the others never are (ks_err_is_retryable). */
    KS_ERR_UNAVAILABLE = 96,        /* "unavailable": the provider cannot be reached now */
    KS_ERR_TIMEOUT = 97,            /* "timeout": the provider did not answer in time */
    KS_ERR_DENIED = 98,             /* "denied": the key exists but may not be used so
                                       (disabled, or decrypt-only for a wrap) */
    KS_ERR_REVOKED = 99,            /* "revoked": the key version was destroyed */
    KS_ERR_NOT_FOUND = 100,         /* "not-found": no such key id or version */
    KS_ERR_INTEGRITY = 101,         /* "integrity": the key store failed an integrity check */

    /* The local keyring file (include/keyshift/keyring.h). */
    KS_ERR_INSECURE = 128,          /* "insecure": keyring readable or writable by group/others */
    KS_ERR_IO = 129,                /* "io": a file could not be read, written or locked */
    KS_ERR_BAD_PASSPHRASE = 130,    /* "bad-passphrase": a sealed keyring did not open */
    KS_ERR_EXISTS = 131,            /* "exists": the key or keyring already exists */
    KS_ERR_STATE = 132,             /* "state": a forbidden key state change (e.g. from destroyed) */

    /* Row stores and migrations (include/keyshift/rowstore.h, migrate.h). */
    KS_ERR_NO_TARGET = 160,         /* "no-target": no such database, table or column */
    KS_ERR_BUSY = 161,              /* "busy": the database stayed locked past the timeout */
    KS_ERR_FULL = 162,              /* "full": the database or its disk is full */
    KS_ERR_STORE = 163,             /* "store": another database error */
    KS_ERR_MISMATCH = 164,          /* "mismatch": an unfinished checkpoint of the column
                                       exists with other parameters */
    KS_ERR_THRESHOLD = 165,         /* "threshold": the failure rate exceeded the limit */
    KS_ERR_STOPPED = 166,           /* "stopped": interrupted on request; resumable */
    KS_ERR_UNSTABLE_ID = 167,       /* "unstable-id": the context binds {id}, but the store's
                                       id is not stable (SQLite's bare rowid, which VACUUM
                                       and a dump/restore renumber): nothing was done */
    KS_ERR_VERIFY_FAILED = 168,     /* "verify-failed": verify-before-commit found a new value
                                       that does not open to the old plaintext (a bug or
                                       faulty hardware; nothing of the batch written) */

    /* Rollouts (include/keyshift/rollout.h). */
    KS_ERR_GUARD = 192,             /* "guard": a transition's condition is not met; the
                                       message says what is missing */
    KS_ERR_NO_ROLLOUT = 193,        /* "no-rollout": no such rollout, or none for the scope */
    KS_ERR_ROLLOUT_EXISTS = 194,    /* "rollout-exists": the scope already has a rollout
                                       that is not finalized */
    KS_ERR_STALE = 195,             /* "stale": the rollout is no longer in the phase the
                                       caller saw (another operator moved it) */
    KS_ERR_PHASE = 196,             /* "phase": the rollout's current phase does not allow
                                       reading a value of this class (keyshift/app.h) */

    /* The provider registry (include/keyshift/registry.h, docs/providers.md). */
    KS_ERR_CONFLICT = 224           /* "conflict": a provider name, an exact key_id or a
                                       prefix given twice in one registry file */
} ks_err;

/* The stable name of an error code, e.g. "noncanonical-varint"; "ok" for
 * KS_OK and "unknown-error" for a value this library does not define.
 * Static storage; never NULL. */
KS_API const char *ks_err_name(ks_err err);

/* Nonzero when err is an envelope rejection (codes 1..31): the input bytes
 * were at fault, not the caller. */
KS_API int ks_err_is_rejection(ks_err err);

/* Nonzero when err is a provider error that may succeed if retried
 * (KS_ERR_UNAVAILABLE, KS_ERR_TIMEOUT).  Every other error is final. */
KS_API int ks_err_is_retryable(ks_err err);

#ifdef __cplusplus
}
#endif
#endif /* KEYSHIFT_ERROR_H */
