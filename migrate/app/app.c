/*
 * migrate/app/app.c -- the application API (keyshift/app.h): a context, a
 * rollout policy and a background thread behind seal and open calls that
 * ask the rollout first (docs/embedding.md).  This file opens and closes
 * an app, keeps its keys and registration, runs the background thread
 * and answers the inspecting calls; the seal and open calls are
 * app_values.c's, and what both share is app_internal.h.
 *
 * The top layer of migrate/: it uses the crypto, keys and rollout layers
 * through their public headers only, and nothing below includes it
 * (`make check-layout`).  Health counting is the context's own
 * (ks_ctx_health_sample with latency histograms): every seal and open,
 * including an open refused by the parser, goes through ks_seal or
 * ks_open, so the report counts exactly what the application did.
 */
#define _POSIX_C_SOURCE 200809L

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <sodium.h>

#include <keyshift/app.h>
#include <keyshift/keyring.h>
#include <keyshift/registry.h>
#include <keyshift/rollout_store.h>
#include <keyshift/rollout_store_pg.h>

#include "../alloc_hook.h"
#include "../errbuf.h"
#include "../rollout/rollout_internal.h"
#include "app_internal.h"



/* ---- errors ---------------------------------------------------------------- */

/* See keyshift/app.h. */
ks_error_class ks_err_class(ks_err err)
{
    if (err == KS_OK) {
        return KS_ERROR_CLASS_OK;
    }
    if (ks_err_is_rejection(err)) {
        return KS_ERROR_CLASS_REFUSED;
    }
    switch (err) {
    case KS_ERR_UNAVAILABLE:
    case KS_ERR_TIMEOUT:
    case KS_ERR_BUSY:
    case KS_ERR_NO_MEMORY:
        return KS_ERROR_CLASS_RETRYABLE;
    case KS_ERR_INVALID_ARGUMENT:
    case KS_ERR_BUFFER_TOO_SMALL:
    case KS_ERR_AUTH_FAILED:
    case KS_ERR_DENIED:
    case KS_ERR_REVOKED:
    case KS_ERR_NOT_FOUND:
    case KS_ERR_PHASE:
        return KS_ERROR_CLASS_REFUSED;
    default:
        return KS_ERROR_CLASS_CONFIGURATION;
    }
}

/* See keyshift/app.h. */
const char *ks_error_class_name(ks_error_class c)
{
    switch (c) {
    case KS_ERROR_CLASS_OK: return "ok";
    case KS_ERROR_CLASS_RETRYABLE: return "retryable";
    case KS_ERROR_CLASS_REFUSED: return "refused";
    case KS_ERROR_CLASS_CONFIGURATION: return "configuration";
    }
    return NULL;
}

/* ---- keys held --------------------------------------------------------------- */

/* What held_keys_cb adds to. */
typedef struct held_keys_acc {
    char *list;
    ks_err err;
} held_keys_acc;

/* ks_key_list_fn: add an active or decrypt-only version to the list;
 * stop at the first error. */
static int held_keys_cb(void *arg, const ks_key_entry *k)
{
    held_keys_acc *acc = arg;
    if (k->state != KS_KEY_ACTIVE && k->state != KS_KEY_DECRYPT_ONLY) {
        return 0;
    }
    char id[KS_KEY_ID_MAX + 1];
    if (k->key_id.len == 0 || k->key_id.len > KS_KEY_ID_MAX) {
        acc->err = KS_ERR_INVALID_ARGUMENT;
        return 1;
    }
    memcpy(id, k->key_id.ptr, k->key_id.len);
    id[k->key_id.len] = '\0';
    acc->err = ks_rollout_keys_add(acc->list, KS_READER_KEYS_MAX + 1, id, k->version);
    return acc->err != KS_OK;
}

/* The canonical list of every active or decrypt-only version g's
 * provider lists into g->keys; "" when it cannot list. */
static ks_err held_keys(app_gen *g, uint32_t timeout_ms)
{
    g->keys[0] = '\0';
    const ks_provider_admin_ops *admin = g->prov.ops->admin;
    if (admin == NULL || admin->list == NULL) {
        return KS_OK;
    }
    held_keys_acc acc = {g->keys, KS_OK};
    ks_err e = admin->list(g->prov.self, (ks_bytes){NULL, 0}, held_keys_cb, &acc, timeout_ms);
    return e != KS_OK ? e : acc.err;
}

/* Free generation g and every older one: contexts (wiping their DEKs),
 * providers, keyrings. */
static void gen_free(app_gen *g)
{
    while (g != NULL) {
        app_gen *older = g->older;
        ks_ctx_free(g->ctx);
        if (g->own_prov) {
            ks_provider_destroy(&g->prov);
        }
        ks_keyring_close(g->kr);
        sodium_memzero(g, sizeof *g);
        free(g);
        g = older;
    }
}

/* Finish generation g, whose provider is set: its held keys (unless the
 * app's are fixed) and its context. */
static ks_err gen_finish(ks_app *a, app_gen *g, char *errbuf, size_t errbuf_len)
{
    ks_err e = KS_OK;
    if (a->fixed_keys) {
        strcpy(g->keys, a->keys);
    } else if ((e = held_keys(g, a->timeout_ms)) != KS_OK) {
        return ks_errbuf_fail(errbuf, errbuf_len, e, "cannot list the key versions held: %s",
                              ks_err_name(e));
    }
    if ((e = ks_ctx_new(&g->prov, &a->cfg, &g->ctx)) != KS_OK) {
        return ks_errbuf_fail(errbuf, errbuf_len, e, "cannot create the context: %s",
                              ks_err_name(e));
    }
    return KS_OK;
}

/* Open the keyring at path with pass into a new generation *out. */
static ks_err gen_open_keyring(ks_app *a, const char *path, ks_bytes pass, app_gen **out,
                               char *errbuf, size_t errbuf_len)
{
    *out = NULL;
    app_gen *g = calloc(1, sizeof *g);
    if (g == NULL) {
        return ks_errbuf_fail(errbuf, errbuf_len, KS_ERR_NO_MEMORY, "out of memory");
    }
    ks_parse_error perr = {KS_OK, 0, 0};
    ks_err e = ks_keyring_open(path, pass, &g->kr, &perr);
    if (e == KS_OK) {
        e = ks_keyring_provider(g->kr, &g->prov);
        g->own_prov = e == KS_OK;
    }
    if (e == KS_ERR_BAD_PASSPHRASE) {
        ks_errbuf_fail(errbuf, errbuf_len, e, "the keyring %s did not open: wrong or missing "
                       "passphrase (passphrase, or KEYSHIFT_PASSPHRASE)", path);
    } else if (e == KS_ERR_INSECURE) {
        ks_errbuf_fail(errbuf, errbuf_len, e, "the keyring %s is refused as insecure: group or "
                       "others can read or change its keys (chmod 600 it)", path);
    } else if (e == KS_ERR_INTEGRITY) {
        ks_errbuf_fail(errbuf, errbuf_len, e, "the keyring %s is corrupt: %s at byte %zu", path,
                       ks_err_name(perr.code), perr.offset);
    } else if (e == KS_ERR_IO) {
        struct stat st;
        int missing = stat(path, &st) != 0;
        ks_errbuf_fail(errbuf, errbuf_len, e, "cannot read the keyring %s: %s", path,
                       missing ? strerror(errno) : "not a readable regular file");
    } else if (e != KS_OK) {
        ks_errbuf_fail(errbuf, errbuf_len, e, "cannot open the keyring %s: %s", path,
                       ks_err_name(e));
    } else {
        e = gen_finish(a, g, errbuf, errbuf_len);
    }
    if (e != KS_OK) {
        gen_free(g);
        return e;
    }
    *out = g;
    return KS_OK;
}

/* ---- opening ----------------------------------------------------------------- */

/* Open the keys opts names (or the environment names) into the first
 * generation *out; a keyring's path and passphrase are kept for reloads. */
static ks_err open_keys(ks_app *a, const ks_app_options *o, app_gen **out, char *errbuf,
                        size_t errbuf_len)
{
    *out = NULL;
    int given = (o->provider != NULL) + (o->providers != NULL) + (o->keyring != NULL);
    if (given > 1) {
        return ks_errbuf_fail(errbuf, errbuf_len, KS_ERR_INVALID_ARGUMENT,
                              "give one of provider, providers and keyring, not several");
    }
    if (o->passphrase.len > 0 && o->keyring == NULL) {
        return ks_errbuf_fail(errbuf, errbuf_len, KS_ERR_INVALID_ARGUMENT,
                              "a passphrase goes with a keyring file; a providers file names "
                              "each keyring's passphrase itself");
    }
    if (o->provider != NULL && o->provider->ops == NULL) {
        return ks_errbuf_fail(errbuf, errbuf_len, KS_ERR_INVALID_ARGUMENT,
                              "the provider given has no operations");
    }
    const char *providers = o->providers, *keyring = o->keyring;
    ks_bytes pass = o->passphrase;
    if (given == 0) {
        const char *env = getenv("KEYSHIFT_PROVIDERS");
        providers = env != NULL && *env != '\0' ? env : NULL;
        env = getenv("KEYSHIFT_KEYRING");
        keyring = providers == NULL && env != NULL && *env != '\0' ? env : NULL;
        env = getenv("KEYSHIFT_PASSPHRASE");
        if (keyring != NULL && env != NULL) {
            size_t n = strlen(env);
            pass = (ks_bytes){(const uint8_t *)env, n > 0 && env[n - 1] == '\n' ? n - 1 : n};
        }
        if (providers == NULL && keyring == NULL) {
            return ks_errbuf_fail(errbuf, errbuf_len, KS_ERR_INVALID_ARGUMENT,
                                  "no keys: give a provider, a providers file or a keyring, or "
                                  "set KEYSHIFT_PROVIDERS or KEYSHIFT_KEYRING");
        }
    }
    if (pass.len == 0) {
        pass.ptr = NULL;
    }
    if (keyring != NULL) {
        struct stat st;
        if ((a->keyring_path = strdup(keyring)) == NULL ||
            (pass.len > 0 && (a->pass = sodium_malloc(pass.len)) == NULL)) {
            return ks_errbuf_fail(errbuf, errbuf_len, KS_ERR_NO_MEMORY, "out of memory");
        }
        if (pass.len > 0) {
            memcpy(a->pass, pass.ptr, pass.len);
            a->pass_len = pass.len;
        }
        if (stat(keyring, &st) == 0) {
            a->kr_stat = st; /* before the open: a change in between reloads once more */
        }
        return gen_open_keyring(a, keyring, pass, out, errbuf, errbuf_len);
    }
    app_gen *g = calloc(1, sizeof *g);
    if (g == NULL) {
        return ks_errbuf_fail(errbuf, errbuf_len, KS_ERR_NO_MEMORY, "out of memory");
    }
    ks_err e = KS_OK;
    if (o->provider != NULL) {
        g->prov = *o->provider; /* borrowed */
    } else {
        ks_registry_error rerr;
        memset(&rerr, 0, sizeof rerr);
        e = ks_registry_load(providers, &a->reg, &rerr);
        if (e == KS_OK) {
            e = ks_registry_provider(a->reg, &g->prov);
            g->own_prov = e == KS_OK;
        }
        if (e != KS_OK && rerr.stage == KS_REGISTRY_STAGE_PARSE) {
            ks_errbuf_fail(errbuf, errbuf_len, e,
                           "the providers file %s is invalid: %s at line %" PRIu32
                           ", column %" PRIu32 " (byte %zu)",
                           providers, ks_err_name(rerr.code), rerr.line, rerr.column,
                           rerr.offset);
        } else if (e != KS_OK && rerr.stage == KS_REGISTRY_STAGE_PROVIDER && rerr.setting != NULL) {
            ks_errbuf_fail(errbuf, errbuf_len, e,
                           "the providers file %s: provider %s cannot use its %s: %s", providers,
                           rerr.name, rerr.setting, ks_err_name(e));
        } else if (e != KS_OK) {
            ks_errbuf_fail(errbuf, errbuf_len, e, "cannot load the providers file %s: %s%s%s",
                           providers, ks_err_name(e), rerr.name[0] ? " in provider " : "",
                           rerr.name);
        }
    }
    if (e == KS_OK) {
        e = gen_finish(a, g, errbuf, errbuf_len);
    }
    if (e != KS_OK) {
        gen_free(g);
        return e;
    }
    *out = g;
    return KS_OK;
}

/* Check the options that need no key and no database; copy what the app
 * keeps of them. */
static ks_err take_options(ks_app *a, const ks_app_options *o, char *errbuf, size_t errbuf_len)
{
    a->max_format = o->max_format ? o->max_format : KS_FORMAT_V2;
    a->interval_ms = o->interval_ms ? o->interval_ms : KS_APP_INTERVAL_DEFAULT_MS;
    a->default_format = o->default_format ? o->default_format : KS_FORMAT_V2;
    a->default_algorithm = o->default_algorithm ? o->default_algorithm : KS_ALG_XCHACHA20POLY1305;
    a->default_key_version = o->default_key_version;
    a->default_encoding = o->default_encoding;
    if (a->max_format > KS_FORMAT_V2 || a->default_format > KS_FORMAT_V2 ||
        ks_alg_name(a->default_algorithm) == NULL) {
        return ks_errbuf_fail(errbuf, errbuf_len, KS_ERR_INVALID_ARGUMENT,
                              "max_format and default_format are 1 or 2, and default_algorithm "
                              "a KS_ALG_* value");
    }
    if (ks_value_encoding_name((int)a->default_encoding) == NULL) {
        return ks_errbuf_fail(errbuf, errbuf_len, KS_ERR_INVALID_ARGUMENT,
                              "default_encoding is KS_ENCODING_BINARY or KS_ENCODING_BASE64");
    }
    if (o->database != NULL && o->instance_id == NULL) {
        return ks_errbuf_fail(errbuf, errbuf_len, KS_ERR_INVALID_ARGUMENT,
                              "a database needs an instance_id to register the reader under");
    }
    if (o->default_key_id != NULL) {
        size_t n = strlen(o->default_key_id);
        if (n == 0 || n > KS_KEY_ID_MAX) {
            return ks_errbuf_fail(errbuf, errbuf_len, KS_ERR_INVALID_ARGUMENT,
                                  "default_key_id has 1 to %d bytes", KS_KEY_ID_MAX);
        }
        memcpy(a->default_key_id, o->default_key_id, n + 1);
        a->has_default = 1;
    }
    if (o->purpose != NULL) {
        size_t n = strlen(o->purpose);
        if (n == 0 || n > KS_PURPOSE_MAX) {
            return ks_errbuf_fail(errbuf, errbuf_len, KS_ERR_INVALID_ARGUMENT,
                                  "purpose has 1 to %d bytes", KS_PURPOSE_MAX);
        }
        memcpy(a->purpose, o->purpose, n + 1);
        a->has_purpose = 1;
    }
    if (o->keys != NULL) {
        if (strlen(o->keys) > KS_READER_KEYS_MAX || ks_rollout_keys_check(o->keys) != KS_OK) {
            return ks_errbuf_fail(errbuf, errbuf_len, KS_ERR_INVALID_ARGUMENT,
                                  "keys is not a canonical key-version list "
                                  "(\"key:version,...\" in ascending order)");
        }
        strcpy(a->keys, o->keys);
        a->fixed_keys = 1;
    }
    return KS_OK;
}

/* ---- registrations shared within the process -------------------------------------- */

/* The apps of this process open on one (database, instance id): they
 * share one row of keyshift_readers, which re-registering replaces.  A
 * service that reloads by opening a new app before it closes the old one
 * (keyshift serve on SIGHUP) has two; the old one's close must not delete
 * the row the new one registered, or the guards would not see this
 * reader until its next heartbeat: a write-upgrade could pass it then.
 * Only the last close of a (database, instance id) deregisters. */
typedef struct reg_share {
    struct reg_share *next;
    unsigned n;       /* open apps sharing the row */
    size_t len;       /* of key: database, NUL, instance id */
    char key[];
} reg_share;

static pthread_mutex_t shares_mu = PTHREAD_MUTEX_INITIALIZER;
static reg_share *shares; /* under shares_mu */

/* Count one more open app on (database, instance id) into *out; NULL
 * and KS_ERR_NO_MEMORY when the count cannot be kept. */
static ks_err share_acquire(const char *database, const char *instance_id, reg_share **out)
{
    const size_t dl = strlen(database), il = strlen(instance_id), len = dl + 1 + il;
    *out = NULL;
    pthread_mutex_lock(&shares_mu);
    reg_share *s = shares;
    while (s != NULL && (s->len != len || memcmp(s->key, database, dl + 1) != 0 ||
                         memcmp(s->key + dl + 1, instance_id, il) != 0)) {
        s = s->next;
    }
    if (s == NULL && (s = malloc(sizeof *s + len)) != NULL) {
        memcpy(s->key, database, dl + 1);
        memcpy(s->key + dl + 1, instance_id, il);
        s->len = len;
        s->n = 0;
        s->next = shares;
        shares = s;
    }
    if (s != NULL) {
        s->n++;
    }
    pthread_mutex_unlock(&shares_mu);
    *out = s;
    return s != NULL ? KS_OK : KS_ERR_NO_MEMORY;
}

/* Count one open app less on s; nonzero when it was the last (s is
 * freed then). */
static int share_release(reg_share *s)
{
    pthread_mutex_lock(&shares_mu);
    assert(s->n > 0);
    const int last = --s->n == 0;
    if (last) {
        reg_share **p = &shares;
        while (*p != s) {
            p = &(*p)->next;
        }
        *p = s->next;
        free(s);
    }
    pthread_mutex_unlock(&shares_mu);
    return last;
}

/* Open the policy on o->database, registering the reader. */
static ks_err open_policy(ks_app *a, const ks_app_options *o, char *errbuf, size_t errbuf_len)
{
    uint32_t algs = o->algorithms;
    if (algs == 0) {
        algs = 1u << KS_ALG_XCHACHA20POLY1305;
        if (crypto_aead_aes256gcm_is_available()) {
            algs |= 1u << KS_ALG_AES256GCM;
        }
    }
    const uint32_t refresh_ms = o->interval_ms ? o->interval_ms : KS_APP_REFRESH_DEFAULT_MS;
    ks_policy_options po = {o->instance_id, a->max_format, algs, a->keys, refresh_ms, 1};
    char msg[256] = "";
    ks_err e;
    int pg = ks_rollout_store_pg_names(o->database);
    if (pg) {
        /* two sessions: answers never wait behind the heartbeat's writes */
        ks_rollout_store *store = NULL, *writer = NULL;
        e = ks_rollout_store_pg_open(o->database, 0, &store, msg, sizeof msg);
        if (e == KS_OK) {
            e = ks_rollout_store_pg_open(o->database, 0, &writer, msg, sizeof msg);
            if (e != KS_OK) {
                store->ops->close(store);
            }
        }
        if (e == KS_OK) {
            e = ks_policy_open_stores(store, writer, &po, &a->policy); /* owns both */
        }
    } else {
        e = ks_policy_open(o->database, &po, &a->policy);
    }
    if (e != KS_OK) {
        return ks_errbuf_fail(errbuf, errbuf_len, e,
                              "cannot open the rollout policy on %s: %s%s",
                              pg ? "the PostgreSQL database" : o->database,
                              msg[0] ? msg : ks_err_name(e),
                              e == KS_ERR_INVALID_ARGUMENT ? " (check instance_id and keys)" : "");
    }
    return KS_OK;
}

/* Nonzero when the keyring file a reloads changed since it was last
 * opened (a file that cannot be looked at now is kept as it was). */
static int keyring_changed(ks_app *a)
{
    struct stat st;
    if (a->keyring_path == NULL || stat(a->keyring_path, &st) != 0) {
        return 0;
    }
    const struct stat *o = &a->kr_stat;
    return st.st_dev != o->st_dev || st.st_ino != o->st_ino || st.st_size != o->st_size ||
           st.st_mtim.tv_sec != o->st_mtim.tv_sec || st.st_mtim.tv_nsec != o->st_mtim.tv_nsec;
}

/* Reload the keyring when its file changed: a new generation becomes the
 * one calls use (the old stays until close).  Then register the key
 * versions the current generation holds when they differ from those
 * registered (again next time if that fails).  Background thread only. */
static ks_err reload_keys(ks_app *a)
{
    ks_err e = KS_OK;
    if (keyring_changed(a)) {
        struct stat st;
        if (stat(a->keyring_path, &st) == 0) {
            a->kr_stat = st;
        }
        app_gen *g = NULL;
        e = gen_open_keyring(a, a->keyring_path, (ks_bytes){a->pass, a->pass_len}, &g, NULL, 0);
        pthread_mutex_lock(&a->mu);
        a->stats.key_reloads += e == KS_OK;
        a->stats.reload_errors += e != KS_OK;
        pthread_mutex_unlock(&a->mu);
        if (e == KS_OK) {
            g->older = atomic_load(&a->cur);
            atomic_store(&a->cur, g);
        }
    }
    const app_gen *cur = atomic_load(&a->cur);
    pthread_mutex_lock(&a->mu);
    int differ = strcmp(cur->keys, a->keys) != 0;
    pthread_mutex_unlock(&a->mu);
    if (differ) {
        ks_err k = ks_policy_set_keys(a->policy, cur->keys);
        if (k == KS_OK) {
            pthread_mutex_lock(&a->mu);
            strcpy(a->keys, cur->keys);
            a->stats.key_changes++;
            pthread_mutex_unlock(&a->mu);
        }
        e = e != KS_OK ? e : k;
    }
    return e;
}

/* One round of the background work: keyring reload and keys (unless
 * final), heartbeat (unless final) and health report of the totals of
 * every generation's context; counted in a->stats. */
static void tick(ks_app *a, int final)
{
    ks_err rl = final ? KS_OK : reload_keys(a);
    ks_err hb = final ? KS_OK : ks_policy_heartbeat(a->policy);
    ks_health_sample t;
    ks_app_health_sample(a, &t);
    ks_err rep = ks_policy_report(a->policy, &t);
    pthread_mutex_lock(&a->mu);
    if (!final) {
        a->stats.heartbeats += hb == KS_OK;
        a->stats.heartbeat_errors += hb != KS_OK;
    }
    a->stats.reports += rep == KS_OK;
    a->stats.report_errors += rep != KS_OK;
    if (rl != KS_OK || hb != KS_OK || rep != KS_OK) {
        a->stats.last_error = rep != KS_OK ? rep : hb != KS_OK ? hb : rl;
    }
    pthread_mutex_unlock(&a->mu);
}

/* The background thread: a tick every interval_ms until close asks it
 * to stop. */
static void *app_thread(void *arg)
{
    ks_app *a = arg;
    pthread_mutex_lock(&a->mu);
    while (!a->stop) {
        struct timespec dl;
        clock_gettime(CLOCK_MONOTONIC, &dl);
        dl.tv_sec += (time_t)(a->interval_ms / 1000);
        dl.tv_nsec += (long)(a->interval_ms % 1000) * 1000000L;
        if (dl.tv_nsec >= 1000000000L) {
            dl.tv_sec++;
            dl.tv_nsec -= 1000000000L;
        }
        while (!a->stop && pthread_cond_timedwait(&a->cv, &a->mu, &dl) == 0) {
        }
        if (a->stop) {
            break;
        }
        pthread_mutex_unlock(&a->mu);
        tick(a, 0);
        pthread_mutex_lock(&a->mu);
    }
    pthread_mutex_unlock(&a->mu);
    return NULL;
}

/* Initialise a's lock and its condition variable on the monotonic clock. */
static ks_err init_sync(ks_app *a)
{
    pthread_condattr_t ca;
    if (pthread_condattr_init(&ca) != 0) {
        return KS_ERR_NO_MEMORY;
    }
    int rc = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    if (rc == 0) {
        rc = pthread_cond_init(&a->cv, &ca);
    }
    pthread_condattr_destroy(&ca);
    if (rc != 0) {
        return KS_ERR_NO_MEMORY;
    }
    if (pthread_mutex_init(&a->mu, NULL) != 0) {
        pthread_cond_destroy(&a->cv);
        return KS_ERR_NO_MEMORY;
    }
    a->sync_ready = 1;
    return KS_OK;
}

/* See keyshift/app.h. */
ks_err ks_app_open(const ks_app_options *opts, ks_app **out, char *errbuf, size_t errbuf_len)
{
    if (errbuf != NULL && errbuf_len > 0) {
        errbuf[0] = '\0';
    }
    if (out == NULL) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    *out = NULL;
    if (opts == NULL) {
        return ks_errbuf_fail(errbuf, errbuf_len, KS_ERR_INVALID_ARGUMENT, "no options given");
    }
    if (sodium_init() < 0) {
        return ks_errbuf_fail(errbuf, errbuf_len, KS_ERR_CRYPTO_INIT,
                              "libsodium could not be initialised");
    }
    ks_app *a = calloc(1, sizeof *a);
    if (a == NULL) {
        return ks_errbuf_fail(errbuf, errbuf_len, KS_ERR_NO_MEMORY, "out of memory");
    }
    atomic_init(&a->cur, NULL);
    if (opts->ctx_config != NULL) {
        a->cfg = *opts->ctx_config;
    } else {
        ks_ctx_config_default(&a->cfg);
        a->cfg.latency_histograms = 1;
    }
    a->timeout_ms = a->cfg.provider_timeout_ms;
    ks_err e = init_sync(a);
    if (e == KS_OK) {
        e = take_options(a, opts, errbuf, errbuf_len);
    }
    app_gen *g = NULL;
    if (e == KS_OK) {
        e = open_keys(a, opts, &g, errbuf, errbuf_len);
    }
    if (e == KS_OK) {
        atomic_store(&a->cur, g);
        strcpy(a->keys, g->keys);
    }
    if (e == KS_OK && opts->database != NULL) {
        e = open_policy(a, opts, errbuf, errbuf_len);
        if (e == KS_OK && share_acquire(opts->database, opts->instance_id, &a->share) != KS_OK) {
            e = ks_errbuf_fail(errbuf, errbuf_len, KS_ERR_NO_MEMORY, "out of memory");
        }
    }
    if (e == KS_OK && a->policy != NULL) {
        if (pthread_create(&a->thread, NULL, app_thread, a) != 0) {
            e = ks_errbuf_fail(errbuf, errbuf_len, KS_ERR_NO_MEMORY,
                               "cannot start the heartbeat thread");
        } else {
            a->thread_started = 1;
        }
    }
    if (e != KS_OK) {
        ks_app_close(a);
        return e;
    }
    *out = a;
    return KS_OK;
}

/* See keyshift/app.h. */
void ks_app_close(ks_app *app)
{
    if (app == NULL) {
        return;
    }
    if (app->thread_started) {
        pthread_mutex_lock(&app->mu);
        app->stop = 1;
        pthread_cond_broadcast(&app->cv);
        pthread_mutex_unlock(&app->mu);
        pthread_join(app->thread, NULL);
    }
    if (app->policy != NULL) {
        tick(app, 1);
        if (app->share != NULL && !share_release(app->share)) {
            ks_policy_leave_registration(app->policy); /* another app of ours holds it */
        }
        ks_policy_close(app->policy); /* deregisters, unless left */
    }
    gen_free(atomic_load(&app->cur));
    ks_registry_close(app->reg);
    free(app->keyring_path);
    sodium_free(app->pass); /* wipes */
    if (app->sync_ready) {
        pthread_cond_destroy(&app->cv);
        pthread_mutex_destroy(&app->mu);
    }
    sodium_memzero(app, sizeof *app);
    free(app);
}

/* ---- inspecting and the background counters ------------------------------------- */

/* The span of view b inside the input starting at base. */
static ks_app_span span_of(const uint8_t *base, ks_bytes b)
{
    return b.ptr != NULL ? (ks_app_span){(size_t)(b.ptr - base), b.len} : (ks_app_span){0, 0};
}

/* See keyshift/app.h. */
ks_err ks_app_parse(const uint8_t *v, size_t v_len, ks_app_header *out, ks_parse_error *perr)
{
    if (out == NULL || (v == NULL && v_len > 0)) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    memset(out, 0, sizeof *out);
    ks_envelope env;
    ks_err e = ks_envelope_parse(v, v_len, NULL, &env, perr);
    if (e != KS_OK) {
        return e;
    }
    out->version = env.version;
    out->algorithm = env.algorithm;
    out->key_version = env.key_version;
    out->tenant = span_of(v, env.tenant);
    out->key_id = span_of(v, env.key_id);
    out->wrapped_dek = span_of(v, env.wrapped_dek);
    out->nonce = span_of(v, env.nonce);
    out->purpose = span_of(v, env.purpose);
    out->commitment = span_of(v, env.commitment);
    out->ciphertext = span_of(v, env.ciphertext);
    out->header_len = env.header_len;
    out->total_len = env.total_len;
    return KS_OK;
}

/* See keyshift/app.h. */
void ks_app_stats_get(ks_app *app, ks_app_stats *out)
{
    if (out == NULL) {
        return;
    }
    memset(out, 0, sizeof *out);
    if (app == NULL) {
        return;
    }
    pthread_mutex_lock(&app->mu);
    *out = app->stats;
    pthread_mutex_unlock(&app->mu);
}

/* See keyshift/app.h.  Every generation's context is summed, so that a
 * keyring reload never makes a counter go down. */
void ks_app_metrics(ks_app *app, ks_metrics *out)
{
    if (out == NULL) {
        return;
    }
    memset(out, 0, sizeof *out);
    if (app == NULL) {
        return;
    }
    ks_metrics g;
    for (const app_gen *p = atomic_load(&app->cur); p != NULL; p = p->older) {
        ks_ctx_metrics(p->ctx, &g);
        out->seals += g.seals;
        out->opens += g.opens;
        out->rewraps += g.rewraps;
        out->auth_failures += g.auth_failures;
        out->auth_fail_unwrap += g.auth_fail_unwrap;
        out->auth_fail_commitment += g.auth_fail_commitment;
        out->auth_fail_aead += g.auth_fail_aead;
        out->auth_fail_binding += g.auth_fail_binding;
        for (size_t i = 0; i < sizeof g.parse_errors / sizeof g.parse_errors[0]; i++) {
            out->parse_errors[i] += g.parse_errors[i];
        }
        out->unknown_key += g.unknown_key;
        for (size_t i = 0; i < sizeof g.provider_errors / sizeof g.provider_errors[0]; i++) {
            out->provider_errors[i] += g.provider_errors[i];
        }
        out->cache_hits += g.cache_hits;
        out->cache_misses += g.cache_misses;
        out->wraps += g.wraps;
        out->unwraps += g.unwraps;
        out->deks_created += g.deks_created;
    }
}

/* See keyshift/app.h.  Summed as ks_app_metrics is (ks_health_add:
 * saturating), so that a keyring reload never makes a total go down. */
void ks_app_health_sample(ks_app *app, ks_health_sample *out)
{
    if (out == NULL) {
        return;
    }
    memset(out, 0, sizeof *out);
    if (app == NULL) {
        return;
    }
    ks_health_sample g;
    for (const app_gen *p = atomic_load(&app->cur); p != NULL; p = p->older) {
        ks_ctx_health_sample(p->ctx, &g);
        ks_health_add(out, &g);
    }
    out->time = 0;
}

/* See keyshift/app.h. */
ks_err ks_app_keys(ks_app *app, char *out, size_t cap)
{
    if (app == NULL || out == NULL) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    pthread_mutex_lock(&app->mu);
    size_t n = strlen(app->keys);
    ks_err e = cap < n + 1 ? KS_ERR_BUFFER_TOO_SMALL : KS_OK;
    if (e == KS_OK) {
        memcpy(out, app->keys, n + 1);
    }
    pthread_mutex_unlock(&app->mu);
    return e;
}
