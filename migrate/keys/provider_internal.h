/*
 * migrate/keys/provider_internal.h -- what every key provider of the
 * library shares (migrate/keys/provider.c).  Internal header: hidden
 * visibility, not part of the ABI.
 */
#ifndef KS_MIGRATE_PROVIDER_INTERNAL_H
#define KS_MIGRATE_PROVIDER_INTERNAL_H

#include <keyshift/error.h>

/* Whether a version in `state` may wrap (for_wrap nonzero) or unwrap, by
 * the one rule of docs/keyring.md [K-STATE-1] that every provider keeps:
 * active does both; decrypt-only unwraps and is denied a wrap; disabled
 * is denied both; destroyed (or anything else) is revoked. */
ks_err ks_key_state_usable(int state, int for_wrap);

#endif /* KS_MIGRATE_PROVIDER_INTERNAL_H */
