/*
 * migrate/crypto/crypto_hooks.h -- test hooks of migrate/crypto/crypto.c.  Internal (no
 * KS_API, hidden in the shared library): only code linked with the
 * library's objects, i.e. the unit tests, can reach them.
 */
#ifndef KS_MIGRATE_CRYPTO_HOOKS_H
#define KS_MIGRATE_CRYPTO_HOOKS_H

/* Tests only: make aes-256-gcm look unavailable (nonzero) or restore the
 * CPU's answer (0), to test KS_ERR_ALGORITHM_UNAVAILABLE on AES-NI
 * machines. */
void ks_crypto_test_hide_aes(int hide);

#endif /* KS_MIGRATE_CRYPTO_HOOKS_H */
