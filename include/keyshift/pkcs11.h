/*
 * keyshift/pkcs11.h -- the "pkcs11" key provider: KEKs as AES-256 secret
 * keys inside a PKCS#11 token (an HSM, a cloud KMS's PKCS#11 library, or
 * SoftHSM2 for tests).  docs/providers.md specifies the object model,
 * the wrapped-DEK layout and the error mapping.
 *
 * KEKs are generated in the token (C_GenerateKey, CKM_AES_KEY_GEN,
 * 32 bytes) with CKA_TOKEN, CKA_SENSITIVE and not CKA_EXTRACTABLE: their
 * bytes never exist outside it.  A wrap is C_Encrypt with CKM_AES_GCM
 * (a fresh 96-bit IV from the token, a 128-bit tag) whose AAD is the wrap
 * AAD of docs/format.md [F-CRYPTO-AAD-2]; wrapped_dek is IV || ciphertext
 * || tag (12 + 32 + 16 = 60 bytes).
 *
 * Threads and fork().  The provider logs in once and keeps one session
 * per thread in use; it may be used from several threads at once.  In a
 * child of fork() it re-initialises the module before its first call.
 *
 * PINs come from a file or the environment (the caller reads them), never
 * from argv; the caller wipes its own copy.  The provider keeps one copy
 * in sodium_malloc'd memory, no-access except while logging in, to log
 * in again in a fork() child or after a reconnect, and wipes it on
 * destroy.  A wrong PIN is never retried.
 */
#ifndef KEYSHIFT_PKCS11_H
#define KEYSHIFT_PKCS11_H

#include <keyshift/common.h>
#include <keyshift/error.h>
#include <keyshift/provider.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Where Debian's softhsm2 package installs its module: the default. */
#define KS_PKCS11_DEFAULT_MODULE "/usr/lib/softhsm/libsofthsm2.so"
/* The wrapped-DEK length: IV (12) || ciphertext (32) || tag (16). */
#define KS_PKCS11_WRAPPED_LEN 60

/* The CK_GCM_PARAMS layout the module expects (vendors differ). */
typedef enum ks_pkcs11_gcm_layout {
    KS_PKCS11_GCM_P11KIT = 0,  /* pIv, ulIvLen, ulIvBits, pAAD, ulAADLen, ulTagBits (p11-kit,
                                  SoftHSM2, PKCS#11 3.0): the default */
    KS_PKCS11_GCM_NO_IVBITS = 1 /* pIv, ulIvLen, pAAD, ulAADLen, ulTagBits (PKCS#11 2.40
                                  errata; some vendors) */
} ks_pkcs11_gcm_layout;

/* How to reach a token.  Strings are NUL-terminated and borrowed for the
 * call only. */
typedef struct ks_pkcs11_config {
    const char *module;        /* path of the PKCS#11 module; NULL: KS_PKCS11_DEFAULT_MODULE */
    const char *token_label;   /* the token's CKA_LABEL (CK_TOKEN_INFO.label), or NULL */
    const char *token_uri;     /* an RFC 7512 "pkcs11:" URI selecting the token, or NULL;
                                  exactly one of token_label and token_uri is set */
    ks_bytes pin;              /* the user PIN (caller-owned; wiped by the caller) */
    ks_pkcs11_gcm_layout gcm_layout;
    uint32_t timeout_ms;       /* default deadline per call; 0: 10000 */
} ks_pkcs11_config;

/*
 * Load the module, initialise it (CKF_OS_LOCKING_OK; an already
 * initialised module is accepted), find the token, check that it offers
 * CKM_AES_GCM and CKM_AES_KEY_GEN, and log in once.  On success *out is a
 * provider (name "pkcs11") with wrap, unwrap, key_info and admin ops;
 * ks_provider_destroy() logs out, closes its sessions and finalises the
 * module if it initialised it.
 * Errors: KS_ERR_INVALID_ARGUMENT, KS_ERR_UNAVAILABLE (no module, no such
 * token, the mechanisms are missing), KS_ERR_DENIED (a wrong or locked
 * PIN, or a token reporting its final try: never retried), KS_ERR_NO_MEMORY.
 */
KS_API KS_WUR ks_err ks_pkcs11_open(const ks_pkcs11_config *cfg, ks_provider *out);

#ifdef __cplusplus
}
#endif
#endif /* KEYSHIFT_PKCS11_H */
