/*
 * migrate/keys/provider_pkcs11.c -- the "pkcs11" key provider
 * (keyshift/pkcs11.h).  Not built yet: every open reports
 * KS_ERR_UNAVAILABLE, so a registry naming a pkcs11 provider fails closed.
 */
#include <keyshift/pkcs11.h>

/* See keyshift/pkcs11.h. */
ks_err ks_pkcs11_open(const ks_pkcs11_config *cfg, ks_provider *out)
{
    if (cfg == NULL || out == NULL) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    return KS_ERR_UNAVAILABLE;
}
