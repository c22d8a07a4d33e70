/*
 * migrate/app/app_internal.h -- what the two files of the application
 * API share: app.c (opening and closing an app, its keys, its
 * registration, the background thread, inspecting) and app_values.c
 * (sealing and opening values as the rollout says).  Not installed;
 * hidden in the shared library like every internal symbol.
 */
#ifndef KS_MIGRATE_APP_INTERNAL_H
#define KS_MIGRATE_APP_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/stat.h>

#include <keyshift/app.h>
#include <keyshift/keyring.h>
#include <keyshift/registry.h>

#include "../rollout/rollout_internal.h"

/* One generation of keys: a keyring (or the app's one provider) and the
 * context over it.  A keyring reload adds a generation; older ones stay
 * until close, as calls that loaded them may still be running. */
typedef struct app_gen {
    ks_keyring *kr;                        /* the keyring opened, or NULL */
    ks_provider prov;                      /* the context's provider */
    int own_prov;                          /* prov is ours to destroy */
    ks_ctx *ctx;
    char keys[KS_READER_KEYS_MAX + 1];     /* the key versions it holds */
    struct app_gen *older;
} app_gen;

struct ks_app {
    _Atomic(app_gen *) cur;                /* the generation calls use */
    ks_registry *reg;                      /* the registry loaded, or NULL */
    ks_policy *policy;                     /* NULL without a database */
    struct reg_share *share;               /* with policy: its registration's count */
    uint32_t interval_ms;
    uint32_t timeout_ms;                   /* the contexts' provider timeout */
    ks_ctx_config cfg;                     /* every generation's context */
    int fixed_keys;                        /* opts->keys given: never recomputed */
    uint8_t max_format;
    char keys[KS_READER_KEYS_MAX + 1];     /* the key versions registered (under mu) */
    char *keyring_path;                    /* a keyring to reload when it changes, or NULL */
    uint8_t *pass;                         /* its passphrase (sodium_malloc'd), or NULL */
    size_t pass_len;
    struct stat kr_stat;                   /* the keyring file when last opened */
    int has_purpose;
    char purpose[KS_PURPOSE_MAX + 1];
    int has_default;
    char default_key_id[KS_KEY_ID_MAX + 1];
    uint32_t default_key_version;
    uint8_t default_format;
    uint32_t default_algorithm;
    ks_value_encoding default_encoding; /* of columns no rollout covers */
    pthread_mutex_t mu;                    /* guards stop and stats */
    pthread_cond_t cv;                     /* signalled by close */
    int sync_ready;                        /* mu and cv initialised */
    int stop;
    int thread_started;
    pthread_t thread;
    ks_app_stats stats;
};

#endif /* KS_MIGRATE_APP_INTERNAL_H */
