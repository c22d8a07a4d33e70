/*
 * migrate/keys/provider.c -- the parts of the key-provider interface that do
 * not depend on any one provider (include/keyshift/provider.h): releasing
 * a provider, and the stable names of key states (docs/keyring.md
 * [K-STATE-1]).
 */
#include <stddef.h>
#include <string.h>

#include <keyshift/provider.h>

#include "provider_internal.h"

/* The names of the states, indexed by ks_key_state; they are stable: the
 * CLI prints them and scripts match them. */
static const char *const state_names[] = {
    [KS_KEY_ACTIVE] = "active",
    [KS_KEY_DECRYPT_ONLY] = "decrypt-only",
    [KS_KEY_DISABLED] = "disabled",
    [KS_KEY_DESTROYED] = "destroyed",
};

#define N_STATE_NAMES (sizeof state_names / sizeof state_names[0])

/* See keyshift/provider.h. */
const char *ks_key_state_name(int state)
{
    if (state < KS_KEY_ACTIVE || (size_t)state >= N_STATE_NAMES) {
        return NULL;
    }
    return state_names[state];
}

/* See keyshift/provider.h.  Exact, case-sensitive match: a state name is
 * an identifier, not free text. */
int ks_key_state_from_name(const char *name)
{
    if (name == NULL) {
        return 0;
    }
    for (size_t s = KS_KEY_ACTIVE; s < N_STATE_NAMES; s++) {
        if (strcmp(name, state_names[s]) == 0) {
            return (int)s;
        }
    }
    return 0;
}

/* See keyshift/provider.h.  The provider's own destroy wipes its keys;
 * clearing *provider makes a second call a no-op. */
void ks_provider_destroy(ks_provider *provider)
{
    if (provider == NULL) {
        return;
    }
    if (provider->ops != NULL && provider->ops->destroy != NULL) {
        provider->ops->destroy(provider->self);
    }
    memset(provider, 0, sizeof *provider);
}

/* See provider_internal.h. */
ks_err ks_key_state_usable(int state, int for_wrap)
{
    switch (state) {
    case KS_KEY_ACTIVE:
        return KS_OK;
    case KS_KEY_DECRYPT_ONLY:
        return for_wrap ? KS_ERR_DENIED : KS_OK;
    case KS_KEY_DISABLED:
        return KS_ERR_DENIED;
    default:
        return KS_ERR_REVOKED;
    }
}
