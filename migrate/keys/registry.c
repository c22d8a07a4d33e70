/*
 * migrate/keys/registry.c -- loading a provider registry file and the
 * "registry" routing provider (include/keyshift/registry.h,
 * docs/providers.md, "Registry").
 *
 * The file's bytes go through the strict parser of registry_format.c;
 * this file does the rest: the file checks, reading the secrets the
 * registry names (into sodium_malloc'd memory, wiped as soon as the
 * provider is open), opening each provider, and routing calls by key_id.
 * A registry never changes once loaded, but for one thing: a registry
 * loaded lazily (ks_registry_load_lazy) opens each provider when a call
 * first needs it, under open_mu, once; a provider's state is published
 * with release/acquire so that the routing path takes no lock once the
 * provider is open.
 */
#define _POSIX_C_SOURCE 200809L

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sodium.h>

#include <keyshift/keyring.h>
#include <keyshift/pkcs11.h>
#include <keyshift/plugin.h>
#include <keyshift/provider.h>
#include <keyshift/registry.h>

#include "keyring_format.h"
#include "registry_format.h"
#include "../alloc_hook.h"

/* The largest passphrase or PIN read from a file or a variable [P-SECRET-2]. */
#define SECRET_MAX 4096

struct ks_registry {
    ks_regf_file file;                   /* views into text */
    uint8_t *text;                       /* the file as read */
    char *strings;                       /* NUL-terminated copies of the values */
    const char *name[KS_REGF_PROVIDERS_MAX];
    const char *value[KS_REGF_PROVIDERS_MAX][KS_REGF_KEY_COUNT]; /* NULL when absent */
    const char *pattern[KS_REGF_SERVES_MAX];
    const char *arg[KS_REGF_ARGS_MAX];   /* in file order: each provider's are contiguous */
    const char *env[KS_REGF_ENVS_MAX];   /* env and env-prefix values, likewise */
    int opened;                          /* loaded to be used: it has a routing provider */
    pthread_mutex_t open_mu;             /* serialises the opening of providers */
    atomic_int state[KS_REGF_PROVIDERS_MAX];     /* PROV_CLOSED, PROV_OPEN or PROV_FAILED */
    ks_err failed_with[KS_REGF_PROVIDERS_MAX];   /* PROV_FAILED: the open's error */
    ks_registry_error first_failure;     /* the first open that failed; under open_mu */
    ks_keyring *keyring[KS_REGF_PROVIDERS_MAX];  /* local providers' keyrings */
    ks_provider provider[KS_REGF_PROVIDERS_MAX]; /* opened providers (ops NULL: not open) */
};

/* The states of a provider [P-LOAD-5]: not opened yet, open, or its open
 * failed (for good: never tried again, so that a wrong PIN is not retried
 * into a locked token). */
enum { PROV_CLOSED = 0, PROV_OPEN = 1, PROV_FAILED = 2 };

/* ---- errors -------------------------------------------------------------------- */

/* Note a failure of stage in *err (when not NULL) and return code. */
static ks_err fail(ks_registry_error *err, ks_registry_stage stage, ks_err code)
{
    if (err != NULL) {
        err->stage = stage;
        err->code = code;
    }
    return code;
}

/* Note the failure of provider i's opening, in setting `setting` (NULL:
 * the provider's own open), and return code. */
static ks_err fail_provider(ks_registry_error *err, const ks_registry *r, size_t i,
                            const char *setting, ks_err code)
{
    if (err != NULL) {
        err->provider = (uint32_t)i + 1;
        err->setting = setting;
        memcpy(err->name, r->name[i], strlen(r->name[i]) + 1);
    }
    return fail(err, KS_REGISTRY_STAGE_PROVIDER, code);
}

/* ---- reading the file [P-LOAD-1] ------------------------------------------------ */

/* Nonzero when st belongs to the effective user or to root. */
static int owner_ok(const struct stat *st)
{
    return st->st_uid == geteuid() || st->st_uid == 0;
}

/* Read at most max bytes from fd into buf; their count goes to *len.
 * KS_ERR_IO when a read fails. */
static ks_err read_upto(int fd, uint8_t *buf, size_t max, size_t *len)
{
    size_t got = 0;
    while (got < max) {
        const ssize_t n = read(fd, buf + got, max - got);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n < 0) {
            return KS_ERR_IO;
        }
        if (n == 0) {
            break;
        }
        got += (size_t)n;
    }
    *len = got;
    return KS_OK;
}

/* Open, check and read the registry file [P-LOAD-1]: up to one byte past
 * the largest file, so that the parser sees a longer one as too large.
 * *text is malloc'd. */
static ks_err read_registry(const char *path, uint8_t **text, size_t *len, ks_registry_error *err)
{
    struct stat st;
    ks_err e;

    const int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        return fail(err, KS_REGISTRY_STAGE_FILE, errno == ELOOP ? KS_ERR_INSECURE : KS_ERR_IO);
    }
    if (fstat(fd, &st) != 0) {
        close(fd);
        return fail(err, KS_REGISTRY_STAGE_FILE, KS_ERR_IO);
    }
    if (!S_ISREG(st.st_mode) || !owner_ok(&st) || (st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
        close(fd);
        return fail(err, KS_REGISTRY_STAGE_FILE, KS_ERR_INSECURE);
    }
    *text = malloc(KS_REGF_FILE_MAX + 1);
    if (*text == NULL) {
        close(fd);
        return fail(err, KS_REGISTRY_STAGE_FILE, KS_ERR_NO_MEMORY);
    }
    e = read_upto(fd, *text, KS_REGF_FILE_MAX + 1, len);
    close(fd);
    if (e != KS_OK) {
        free(*text);
        *text = NULL;
        return fail(err, KS_REGISTRY_STAGE_FILE, e);
    }
    return KS_OK;
}

/* Copy v to p as a NUL-terminated string, which goes to *out; the byte
 * after it. */
static char *copy_string(char *p, ks_bytes v, const char **out)
{
    if (v.len != 0) {
        memcpy(p, v.ptr, v.len);
    }
    p[v.len] = '\0';
    *out = p;
    return p + v.len + 1;
}

/* Copy the values of r->file into NUL-terminated strings [r->strings]. */
static ks_err make_strings(ks_registry *r)
{
    const ks_regf_file *f = &r->file;
    size_t need = 0;
    for (size_t i = 0; i < f->nproviders; i++) {
        need += f->providers[i].name.len + 1;
        for (int k = 0; k < KS_REGF_KEY_COUNT; k++) {
            need += f->providers[i].value[k].len + 1;
        }
    }
    for (size_t j = 0; j < f->nserves; j++) {
        need += f->serves[j].pattern.len + 1;
    }
    for (size_t j = 0; j < f->nargs; j++) {
        need += f->args[j].value.len + 1;
    }
    for (size_t j = 0; j < f->nenvs; j++) {
        need += f->envs[j].name.len + 1;
    }
    char *p = r->strings = malloc(need);
    if (p == NULL) {
        return KS_ERR_NO_MEMORY;
    }
    for (size_t i = 0; i < f->nproviders; i++) {
        const ks_regf_provider *prov = &f->providers[i];
        p = copy_string(p, prov->name, &r->name[i]);
        for (int k = 0; k < KS_REGF_KEY_COUNT; k++) {
            const ks_bytes v = k == KS_REGF_TYPE
                                   ? (ks_bytes){(const uint8_t *)ks_regf_type_name(prov->type),
                                                strlen(ks_regf_type_name(prov->type))}
                                   : prov->value[k];
            if (v.len != 0) {
                p = copy_string(p, v, &r->value[i][k]);
            }
        }
    }
    for (size_t j = 0; j < f->nserves; j++) {
        p = copy_string(p, f->serves[j].pattern, &r->pattern[j]);
    }
    for (size_t j = 0; j < f->nargs; j++) {
        p = copy_string(p, f->args[j].value, &r->arg[j]);
    }
    for (size_t j = 0; j < f->nenvs; j++) {
        p = copy_string(p, f->envs[j].name, &r->env[j]);
    }
    return KS_OK;
}

/* ---- secrets [P-SECRET-1..3] ------------------------------------------------------ */

/* Wipe and free a secret from read_secret(). */
static void free_secret(ks_bytes *s)
{
    if (s->ptr != NULL) {
        sodium_memzero((void *)(uintptr_t)s->ptr, s->len);
        sodium_free((void *)(uintptr_t)s->ptr);
    }
    *s = (ks_bytes){NULL, 0};
}

/* Move src[0, len) into sodium_malloc'd memory as the secret *out, after
 * removing exactly one trailing LF [P-SECRET-2]. */
static ks_err keep_secret(const uint8_t *src, size_t len, ks_bytes *out)
{
    if (len > 0 && src[len - 1] == '\n') {
        len--;
    }
    if (len == 0) {
        return KS_ERR_BAD_VALUE;
    }
    uint8_t *p = sodium_malloc(len);
    if (p == NULL) {
        return KS_ERR_NO_MEMORY;
    }
    memcpy(p, src, len);
    *out = (ks_bytes){p, len};
    return KS_OK;
}

/* Read the secret in the file at path [P-SECRET-1]: a regular file of
 * the effective user or root, no permission for group or others, at most
 * SECRET_MAX bytes.  Its bytes are read straight into guarded memory. */
static ks_err read_secret_file(const char *path, ks_bytes *out)
{
    struct stat st;
    size_t len = 0;
    ks_err e;

    const int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        return KS_ERR_IO;
    }
    if (fstat(fd, &st) != 0) {
        close(fd);
        return KS_ERR_IO;
    }
    if (!S_ISREG(st.st_mode) || !owner_ok(&st) || (st.st_mode & 077) != 0) {
        close(fd);
        return KS_ERR_INSECURE;
    }
    uint8_t *buf = sodium_malloc(SECRET_MAX + 1);
    if (buf == NULL) {
        close(fd);
        return KS_ERR_NO_MEMORY;
    }
    e = read_upto(fd, buf, SECRET_MAX + 1, &len);
    close(fd);
    if (e == KS_OK && len > SECRET_MAX) {
        e = KS_ERR_TOO_LARGE;
    }
    if (e == KS_OK) {
        e = keep_secret(buf, len, out);
    }
    sodium_memzero(buf, SECRET_MAX + 1);
    sodium_free(buf);
    return e;
}

/* Read the secret in the environment variable name [P-SECRET-1]. */
static ks_err read_secret_env(const char *name, ks_bytes *out)
{
    const char *v = getenv(name);
    if (v == NULL) {
        return KS_ERR_NOT_FOUND;
    }
    const size_t len = strlen(v);
    return len > SECRET_MAX ? KS_ERR_TOO_LARGE : keep_secret((const uint8_t *)v, len, out);
}

/* Read provider i's secret from setting file_key (a file) or env_key (a
 * variable), whichever it has; none leaves *out {NULL, 0}.  *which names
 * the setting read. */
static ks_err read_secret(const ks_registry *r, size_t i, int file_key, int env_key, ks_bytes *out,
                          const char **which)
{
    *out = (ks_bytes){NULL, 0};
    if (r->value[i][file_key] != NULL) {
        *which = ks_regf_key_name(file_key);
        return read_secret_file(r->value[i][file_key], out);
    }
    if (r->value[i][env_key] != NULL) {
        *which = ks_regf_key_name(env_key);
        return read_secret_env(r->value[i][env_key], out);
    }
    *which = NULL;
    return KS_OK;
}

/* ---- opening providers [P-LOAD-3] ---------------------------------------------------- */

/* Open local provider i: its keyring, with its passphrase if it names one. */
static ks_err open_local(ks_registry *r, size_t i, ks_registry_error *err)
{
    ks_bytes pass;
    const char *which;
    ks_parse_error perr = {KS_OK, 0, 0};

    ks_err e = read_secret(r, i, KS_REGF_PASSPHRASE_FILE, KS_REGF_PASSPHRASE_ENV, &pass, &which);
    if (e != KS_OK) {
        return fail_provider(err, r, i, which, e);
    }
    e = ks_keyring_open(r->value[i][KS_REGF_KEYRING], pass, &r->keyring[i], &perr);
    free_secret(&pass);
    if (e != KS_OK) {
        if (err != NULL) {
            err->keyring = perr;
        }
        return fail_provider(err, r, i, ks_regf_key_name(KS_REGF_KEYRING), e);
    }
    e = ks_keyring_provider(r->keyring[i], &r->provider[i]);
    return e == KS_OK ? KS_OK : fail_provider(err, r, i, NULL, e);
}

/* Open pkcs11 provider i: read its PIN, open the token, wipe the PIN. */
static ks_err open_pkcs11(ks_registry *r, size_t i, ks_registry_error *err)
{
    const ks_regf_provider *p = &r->file.providers[i];
    const char *const *v = r->value[i];
    ks_pkcs11_config cfg;
    const char *which;

    memset(&cfg, 0, sizeof cfg);
    ks_err e = read_secret(r, i, KS_REGF_PIN_FILE, KS_REGF_PIN_ENV, &cfg.pin, &which);
    if (e != KS_OK) {
        return fail_provider(err, r, i, which, e);
    }
    cfg.module = v[KS_REGF_MODULE] != NULL ? v[KS_REGF_MODULE] : KS_PKCS11_DEFAULT_MODULE;
    cfg.token_label = v[KS_REGF_TOKEN_LABEL];
    cfg.token_uri = v[KS_REGF_TOKEN_URI];
    cfg.gcm_layout = v[KS_REGF_GCM_PARAMS] != NULL && strcmp(v[KS_REGF_GCM_PARAMS], "no-ivbits") == 0
                         ? KS_PKCS11_GCM_NO_IVBITS
                         : KS_PKCS11_GCM_P11KIT;
    cfg.timeout_ms = p->number[KS_REGF_TIMEOUT_MS];
    e = ks_pkcs11_open(&cfg, &r->provider[i]);
    free_secret(&cfg.pin);
    if (e != KS_OK) {
        memset(&r->provider[i], 0, sizeof r->provider[i]);
        return fail_provider(err, r, i, NULL, e);
    }
    return KS_OK;
}

/* The index in r->file.args of provider i's first arg line (its arg
 * lines are contiguous). */
static size_t first_arg(const ks_registry *r, size_t i)
{
    size_t j = 0;
    while (j < r->file.nargs && r->file.args[j].provider < i) {
        j++;
    }
    return j;
}

/* The index in r->file.envs of provider i's first env line (its env and
 * env-prefix lines are contiguous). */
static size_t first_env(const ks_registry *r, size_t i)
{
    size_t j = 0;
    while (j < r->file.nenvs && r->file.envs[j].provider < i) {
        j++;
    }
    return j;
}

/* The environment settings of plugin provider i [P-PLUGIN-9] into cfg:
 * its env and env-prefix lines, and as secrets never passed every
 * variable the registry reads a passphrase or a PIN from. names,
 * prefixes (KS_PLUGIN_ENV_MAX each) and secret (KS_REGF_PROVIDERS_MAX)
 * are the caller's, cfg borrows them. */
static void plugin_env_config(const ks_registry *r, size_t i, ks_plugin_config *cfg, const char **names,
                              const char **prefixes, const char **secret)
{
    const size_t first = first_env(r, i);
    for (size_t j = first; j < first + r->file.providers[i].envs; j++) {
        if (r->file.envs[j].prefix) {
            prefixes[cfg->nenv_prefixes++] = r->env[j];
        } else {
            names[cfg->nenv++] = r->env[j];
        }
    }
    for (size_t j = 0; j < r->file.nproviders; j++) {
        const char *v = r->value[j][KS_REGF_PIN_ENV] != NULL ? r->value[j][KS_REGF_PIN_ENV]
                                                             : r->value[j][KS_REGF_PASSPHRASE_ENV];
        if (v != NULL) {
            secret[cfg->nenv_secret++] = v;
        }
    }
    cfg->env = names;
    cfg->env_prefixes = prefixes;
    cfg->env_secret = secret;
}

/* Open plugin provider i [P-PLUGIN-1..9]: the defaults of
 * ks_plugin_config_init, then what its settings give; the plugin is
 * started and greeted.  A failure's details go to err->plugin. */
static ks_err open_plugin(ks_registry *r, size_t i, ks_registry_error *err)
{
    const ks_regf_provider *p = &r->file.providers[i];
    ks_plugin_config cfg;
    ks_plugin_error perr;
    const char *names[KS_PLUGIN_ENV_MAX], *prefixes[KS_PLUGIN_ENV_MAX], *secret[KS_REGF_PROVIDERS_MAX];

    ks_plugin_config_init(&cfg);
    plugin_env_config(r, i, &cfg, names, prefixes, secret);
    const struct {
        int key;
        uint32_t *field;
    } numbers[] = {
        {KS_REGF_TIMEOUT_MS, &cfg.timeout_ms},
        {KS_REGF_RETRIES, &cfg.retries},
        {KS_REGF_RETRY_BUDGET_MS, &cfg.retry_budget_ms},
        {KS_REGF_RATE_LIMIT, &cfg.rate_limit},
        {KS_REGF_CONCURRENCY, &cfg.concurrency},
    };
    cfg.command = r->value[i][KS_REGF_COMMAND];
    cfg.args = &r->arg[first_arg(r, i)];
    cfg.nargs = p->args;
    for (size_t n = 0; n < sizeof numbers / sizeof numbers[0]; n++) {
        if (r->value[i][numbers[n].key] != NULL) {
            *numbers[n].field = p->number[numbers[n].key];
        }
    }
    memset(&perr, 0, sizeof perr);
    const ks_err e = ks_plugin_open(&cfg, &r->provider[i], &perr);
    if (e != KS_OK) {
        memset(&r->provider[i], 0, sizeof r->provider[i]);
        if (err != NULL) {
            err->plugin = perr;
        }
        return fail_provider(err, r, i, NULL, e);
    }
    return KS_OK;
}

/* Open provider i by its type [P-LOAD-3]; a failure is described in
 * *err (which may be NULL). */
static ks_err open_one(ks_registry *r, size_t i, ks_registry_error *err)
{
    switch (r->file.providers[i].type) {
    case KS_REGF_LOCAL: return open_local(r, i, err);
    case KS_REGF_PKCS11: return open_pkcs11(r, i, err);
    default: return open_plugin(r, i, err);
    }
}

/*
 * Provider i, opened when first needed [P-LOAD-5]: an open provider is
 * returned without a lock; otherwise, under open_mu, the first caller
 * opens it and every later one sees the result.  A failed open is
 * remembered, with its details in r->first_failure when it is the first,
 * and every later call gets its error: never another provider.
 */
static ks_err provider_at(ks_registry *r, size_t i, const ks_provider **p)
{
    assert(i < r->file.nproviders);
    if (atomic_load_explicit(&r->state[i], memory_order_acquire) == PROV_OPEN) {
        *p = &r->provider[i];
        return KS_OK;
    }
    if (pthread_mutex_lock(&r->open_mu) != 0) {
        return KS_ERR_UNAVAILABLE;
    }
    int st = atomic_load_explicit(&r->state[i], memory_order_relaxed);
    if (st == PROV_CLOSED) {
        ks_registry_error e;
        memset(&e, 0, sizeof e);
        const ks_err code = open_one(r, i, &e);
        if (code != KS_OK) {
            r->failed_with[i] = code;
            if (r->first_failure.stage == KS_REGISTRY_STAGE_NONE) {
                r->first_failure = e;
            }
        }
        st = code == KS_OK ? PROV_OPEN : PROV_FAILED;
        atomic_store_explicit(&r->state[i], st, memory_order_release);
    }
    const ks_err code = st == PROV_OPEN ? KS_OK : r->failed_with[i];
    pthread_mutex_unlock(&r->open_mu);
    if (code == KS_OK) {
        *p = &r->provider[i];
    }
    return code;
}

/* See keyshift/registry.h. */
void ks_registry_close(ks_registry *r)
{
    if (r == NULL) {
        return;
    }
    for (size_t i = 0; i < KS_REGF_PROVIDERS_MAX; i++) {
        ks_provider_destroy(&r->provider[i]);
        ks_keyring_close(r->keyring[i]);
    }
    pthread_mutex_destroy(&r->open_mu);
    free(r->strings);
    free(r->text);
    free(r);
}

/* How load() treats the providers. */
enum { OPEN_NONE = 0, OPEN_ALL = 1, OPEN_LAZILY = 2 };

/* Read and parse the registry at path into a new *out; open its
 * providers as `open` says [P-LOAD-1..5]. */
static ks_err load(const char *path, int open, ks_registry **out, ks_registry_error *err)
{
    size_t len = 0;
    ks_regf_error perr;
    ks_err e;

    if (err != NULL) {
        memset(err, 0, sizeof *err);
    }
    if (out == NULL) {
        return fail(err, KS_REGISTRY_STAGE_NONE, KS_ERR_INVALID_ARGUMENT);
    }
    *out = NULL;
    if (path == NULL || *path == '\0') {
        return fail(err, KS_REGISTRY_STAGE_NONE, KS_ERR_INVALID_ARGUMENT);
    }
    if (open && sodium_init() < 0) {
        return fail(err, KS_REGISTRY_STAGE_NONE, KS_ERR_CRYPTO_INIT);
    }
    ks_registry *r = calloc(1, sizeof *r);
    if (r == NULL) {
        return fail(err, KS_REGISTRY_STAGE_NONE, KS_ERR_NO_MEMORY);
    }
    if (pthread_mutex_init(&r->open_mu, NULL) != 0) {
        free(r);
        return fail(err, KS_REGISTRY_STAGE_NONE, KS_ERR_NO_MEMORY);
    }
    for (size_t i = 0; i < KS_REGF_PROVIDERS_MAX; i++) {
        atomic_init(&r->state[i], PROV_CLOSED);
    }
    if ((e = read_registry(path, &r->text, &len, err)) != KS_OK) {
        ks_registry_close(r);
        return e;
    }
    if (ks_regf_parse(r->text, len, &r->file, &perr) != KS_OK) {
        if (err != NULL) {
            err->offset = perr.offset;
            err->line = perr.line;
            err->column = perr.column;
            err->provider = perr.provider;
        }
        ks_registry_close(r);
        (void)fail(err, KS_REGISTRY_STAGE_PARSE, perr.code);
        return KS_ERR_INTEGRITY;
    }
    if (make_strings(r) != KS_OK) {
        ks_registry_close(r);
        return fail(err, KS_REGISTRY_STAGE_NONE, KS_ERR_NO_MEMORY);
    }
    for (size_t i = 0; open == OPEN_ALL && i < r->file.nproviders; i++) {
        if ((e = open_one(r, i, err)) != KS_OK) {
            ks_registry_close(r); /* fail closed: nothing of it survives */
            return e;
        }
        atomic_store_explicit(&r->state[i], PROV_OPEN, memory_order_relaxed);
    }
    r->opened = open != OPEN_NONE;
    *out = r;
    return KS_OK;
}

/* See keyshift/registry.h. */
ks_err ks_registry_load(const char *path, ks_registry **out, ks_registry_error *err)
{
    return load(path, OPEN_ALL, out, err);
}

/* See keyshift/registry.h. */
ks_err ks_registry_load_lazy(const char *path, ks_registry **out, ks_registry_error *err)
{
    return load(path, OPEN_LAZILY, out, err);
}

/* See keyshift/registry.h. */
ks_err ks_registry_read(const char *path, ks_registry **out, ks_registry_error *err)
{
    return load(path, OPEN_NONE, out, err);
}

/* See keyshift/registry.h. */
ks_err ks_registry_open_error(ks_registry *r, ks_registry_error *err)
{
    if (r == NULL || err == NULL) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    if (pthread_mutex_lock(&r->open_mu) != 0) {
        return KS_ERR_UNAVAILABLE;
    }
    *err = r->first_failure;
    pthread_mutex_unlock(&r->open_mu);
    return err->stage == KS_REGISTRY_STAGE_NONE ? KS_OK : err->code;
}

/* ---- queries and listing ------------------------------------------------------------ */

/* See keyshift/registry.h. */
ks_err ks_registry_route(const ks_registry *r, ks_bytes key_id, size_t *index)
{
    return r == NULL ? KS_ERR_INVALID_ARGUMENT : ks_regf_route(&r->file, key_id, index);
}

/* See keyshift/registry.h. */
size_t ks_registry_count(const ks_registry *r)
{
    return r == NULL ? 0 : r->file.nproviders;
}

/* See keyshift/registry.h. */
ks_err ks_registry_info_at(const ks_registry *r, size_t i, ks_registry_info *out)
{
    if (r == NULL || out == NULL) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    if (i >= r->file.nproviders) {
        return KS_ERR_NOT_FOUND;
    }
    out->name = r->name[i];
    out->type = r->value[i][KS_REGF_TYPE];
    out->settings = r->file.providers[i].args + r->file.providers[i].envs;
    for (int k = KS_REGF_TYPE + 1; k < KS_REGF_KEY_COUNT; k++) {
        out->settings += r->value[i][k] != NULL;
    }
    out->serves = r->file.providers[i].serves;
    return KS_OK;
}

/* See keyshift/registry.h. */
ks_err ks_registry_setting_at(const ks_registry *r, size_t i, size_t j, ks_registry_setting *out)
{
    if (r == NULL || out == NULL) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    for (int k = KS_REGF_TYPE + 1; i < r->file.nproviders && k < KS_REGF_KEY_COUNT; k++) {
        if (r->value[i][k] != NULL && j-- == 0) {
            out->key = ks_regf_key_name(k);
            out->value = r->value[i][k];
            return KS_OK;
        }
    }
    if (i < r->file.nproviders && j < r->file.providers[i].args) {
        out->key = ks_regf_key_name(KS_REGF_ARG); /* [P-CANON-1]: after the others */
        out->value = r->arg[first_arg(r, i) + j];
        return KS_OK;
    }
    if (i < r->file.nproviders && j - r->file.providers[i].args < r->file.providers[i].envs) {
        const size_t e = first_env(r, i) + (j - r->file.providers[i].args); /* [P-CANON-1]: last */
        out->key = ks_regf_key_name(r->file.envs[e].prefix ? KS_REGF_ENV_PREFIX : KS_REGF_ENV);
        out->value = r->env[e];
        return KS_OK;
    }
    return KS_ERR_NOT_FOUND;
}

/* See keyshift/registry.h. */
ks_err ks_registry_plugin_stats(const ks_registry *r, size_t i, ks_plugin_stats *out)
{
    if (r == NULL || out == NULL || !r->opened || i >= r->file.nproviders ||
        r->file.providers[i].type != KS_REGF_PLUGIN ||
        atomic_load_explicit(&r->state[i], memory_order_acquire) != PROV_OPEN) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    return ks_plugin_stats_get(&r->provider[i], out);
}

/* See keyshift/registry.h. */
ks_err ks_registry_serve_at(const ks_registry *r, size_t i, size_t j, ks_registry_serve *out)
{
    if (r == NULL || out == NULL) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    for (size_t s = 0; s < r->file.nserves; s++) {
        if (r->file.serves[s].provider == i && j-- == 0) {
            out->pattern = r->pattern[s];
            out->prefix = r->file.serves[s].prefix;
            return KS_OK;
        }
    }
    return KS_ERR_NOT_FOUND;
}

/* ---- the routing provider [P-ROUTE-1..5] ------------------------------------------------ */

/* The provider serving key_id, into *p: opened now if it was not yet
 * [P-LOAD-5]; its open's error when that fails. */
static ks_err route(void *self, ks_bytes key_id, const ks_provider **p)
{
    ks_registry *r = self;
    size_t i;
    if (r == NULL) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    ks_err e = ks_regf_route(&r->file, key_id, &i);
    return e != KS_OK ? e : provider_at(r, i, p);
}

/* Wrap with the provider serving key_id. */
static ks_err reg_wrap(void *self, ks_bytes key_id, uint32_t key_version, const uint8_t *dek,
                       size_t dek_len, ks_bytes aad, uint8_t *out, size_t cap, size_t *out_len,
                       uint32_t timeout_ms)
{
    const ks_provider *p;
    const ks_err e = route(self, key_id, &p);
    return e != KS_OK ? e
                      : p->ops->wrap(p->self, key_id, key_version, dek, dek_len, aad, out, cap,
                                     out_len, timeout_ms);
}

/* Unwrap with the provider serving key_id; dek zeroed when none does. */
static ks_err reg_unwrap(void *self, ks_bytes key_id, uint32_t key_version, ks_bytes wrapped,
                         ks_bytes aad, uint8_t *dek, size_t dek_len, uint32_t timeout_ms)
{
    const ks_provider *p;
    const ks_err e = route(self, key_id, &p);
    if (e != KS_OK) {
        if (dek != NULL) {
            sodium_memzero(dek, dek_len);
        }
        return e;
    }
    return p->ops->unwrap(p->self, key_id, key_version, wrapped, aad, dek, dek_len, timeout_ms);
}

/* Describe a key version with the provider serving key_id. */
static ks_err reg_key_info(void *self, ks_bytes key_id, uint32_t key_version, ks_key_info *out,
                           uint32_t timeout_ms)
{
    const ks_provider *p;
    const ks_err e = route(self, key_id, &p);
    return e != KS_OK ? e : p->ops->key_info(p->self, key_id, key_version, out, timeout_ms);
}

/* The admin ops of the provider serving key_id, into *p and *a;
 * KS_ERR_DENIED when it has none [P-ROUTE-5]. */
static ks_err route_admin(void *self, ks_bytes key_id, const ks_provider **p,
                          const ks_provider_admin_ops **a)
{
    ks_err e = route(self, key_id, p);
    if (e != KS_OK) {
        return e;
    }
    *a = (*p)->ops->admin;
    return *a == NULL ? KS_ERR_DENIED : KS_OK;
}

/* Create key_id in the provider serving it. */
static ks_err reg_create(void *self, ks_bytes key_id, uint32_t timeout_ms)
{
    const ks_provider *p;
    const ks_provider_admin_ops *a;
    ks_err e = route_admin(self, key_id, &p, &a);
    if (e == KS_OK) {
        e = a->create != NULL ? a->create(p->self, key_id, timeout_ms) : KS_ERR_DENIED;
    }
    return e;
}

/* Add a version of key_id in the provider serving it. */
static ks_err reg_add_version(void *self, ks_bytes key_id, uint32_t *version, uint32_t timeout_ms)
{
    const ks_provider *p;
    const ks_provider_admin_ops *a;
    ks_err e = route_admin(self, key_id, &p, &a);
    if (e == KS_OK) {
        e = a->add_version != NULL ? a->add_version(p->self, key_id, version, timeout_ms)
                                   : KS_ERR_DENIED;
    }
    return e;
}

/* Promote a version of key_id in the provider serving it. */
static ks_err reg_promote(void *self, ks_bytes key_id, uint32_t version, uint32_t timeout_ms)
{
    const ks_provider *p;
    const ks_provider_admin_ops *a;
    ks_err e = route_admin(self, key_id, &p, &a);
    if (e == KS_OK) {
        e = a->promote != NULL ? a->promote(p->self, key_id, version, timeout_ms) : KS_ERR_DENIED;
    }
    return e;
}

/* Set a version's state in the provider serving key_id. */
static ks_err reg_set_state(void *self, ks_bytes key_id, uint32_t version, ks_key_state state,
                            uint32_t timeout_ms)
{
    const ks_provider *p;
    const ks_provider_admin_ops *a;
    ks_err e = route_admin(self, key_id, &p, &a);
    if (e == KS_OK) {
        e = a->set_state != NULL ? a->set_state(p->self, key_id, version, state, timeout_ms)
                                 : KS_ERR_DENIED;
    }
    return e;
}

/* One listed version, its key_id copied. */
typedef struct merged_entry {
    uint8_t key_id[KS_KEY_ID_MAX];
    size_t key_id_len;
    uint32_t version;
    ks_key_state state;
    int is_primary;
    uint64_t created;
} merged_entry;

/* The entries gathered from every provider for one merged listing. */
typedef struct merge {
    const ks_registry *r;
    size_t provider;     /* the provider being listed */
    merged_entry *v;
    size_t n, cap;
    ks_err err;          /* KS_ERR_NO_MEMORY or KS_ERR_INTEGRITY once gathering failed */
} merge;

/* Keep an entry of provider m->provider if the registry routes its key
 * there [P-ROUTE-4]. */
static int gather(void *arg, const ks_key_entry *e)
{
    merge *m = arg;
    size_t i;
    if (ks_regf_route(&m->r->file, e->key_id, &i) != KS_OK || i != m->provider) {
        return 0;
    }
    if (e->key_id.len == 0 || e->key_id.len > KS_KEY_ID_MAX) {
        m->err = KS_ERR_INTEGRITY;
        return 1;
    }
    if (m->n == m->cap) {
        const size_t cap = m->cap == 0 ? 64 : m->cap * 2;
        merged_entry *grown = realloc(m->v, cap * sizeof *grown);
        if (grown == NULL) {
            m->err = KS_ERR_NO_MEMORY;
            return 1;
        }
        m->v = grown;
        m->cap = cap;
    }
    merged_entry *d = &m->v[m->n++];
    memcpy(d->key_id, e->key_id.ptr, e->key_id.len);
    d->key_id_len = e->key_id.len;
    d->version = e->version;
    d->state = e->state;
    d->is_primary = e->is_primary;
    d->created = e->created;
    return 0;
}

/* The order of a merged listing: key_id as the keyring orders it
 * ([K-KEY-3]: bytewise, a proper prefix first), then version. */
static int entry_cmp(const void *a, const void *b)
{
    const merged_entry *x = a, *y = b;
    const int c = ks_krf_key_id_cmp((ks_bytes){x->key_id, x->key_id_len},
                                    (ks_bytes){y->key_id, y->key_id_len});
    if (c != 0) {
        return c;
    }
    return x->version < y->version ? -1 : x->version > y->version;
}

/* List every key: gather each listing provider's entries that route to
 * it, sort them, then hand them to fn.  Nothing reaches fn unless every
 * provider listed successfully. */
static ks_err list_all(ks_registry *r, ks_key_list_fn fn, void *arg, uint32_t timeout_ms)
{
    merge m = {r, 0, NULL, 0, 0, KS_OK};
    ks_err e = KS_OK;
    for (size_t i = 0; e == KS_OK && i < r->file.nproviders; i++) {
        const ks_provider *p;
        if ((e = provider_at(r, i, &p)) != KS_OK) {
            break; /* every provider is listed, or none */
        }
        if (p->ops->admin == NULL || p->ops->admin->list == NULL) {
            continue; /* [P-ROUTE-4] a provider that cannot list has nothing to show */
        }
        m.provider = i;
        e = p->ops->admin->list(p->self, (ks_bytes){NULL, 0}, gather, &m, timeout_ms);
        if (e == KS_OK) {
            e = m.err;
        }
    }
    if (e == KS_OK && m.n > 1) {
        qsort(m.v, m.n, sizeof *m.v, entry_cmp);
    }
    for (size_t j = 0; e == KS_OK && j < m.n; j++) {
        const merged_entry *d = &m.v[j];
        const ks_key_entry out = {{d->key_id, d->key_id_len}, d->version, d->state, d->is_primary,
                                  d->created};
        if (fn(arg, &out) != 0) {
            break;
        }
    }
    free(m.v);
    return e;
}

/* List key_id's versions at the provider serving it, or every key. */
static ks_err reg_list(void *self, ks_bytes key_id, ks_key_list_fn fn, void *arg,
                       uint32_t timeout_ms)
{
    const ks_provider *p;
    const ks_provider_admin_ops *a;
    if (self == NULL || fn == NULL || (key_id.ptr == NULL && key_id.len != 0)) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    if (key_id.len == 0) {
        return list_all(self, fn, arg, timeout_ms);
    }
    ks_err e = route_admin(self, key_id, &p, &a);
    if (e == KS_OK) {
        e = a->list != NULL ? a->list(p->self, key_id, fn, arg, timeout_ms) : KS_ERR_DENIED;
    }
    return e;
}

static const ks_provider_admin_ops registry_admin = {
    .create = reg_create,
    .add_version = reg_add_version,
    .promote = reg_promote,
    .set_state = reg_set_state,
    .list = reg_list,
};

static const ks_provider_ops registry_ops = {
    .wrap = reg_wrap,
    .unwrap = reg_unwrap,
    .key_info = reg_key_info,
    .destroy = NULL, /* the registry is borrowed: its owner closes it */
    .admin = &registry_admin,
};

/* See registry_format.h. */
ks_err ks_registry_swap_provider(ks_registry *r, size_t i, ks_provider *p)
{
    if (r == NULL || p == NULL || !r->opened || i >= r->file.nproviders ||
        atomic_load_explicit(&r->state[i], memory_order_acquire) != PROV_OPEN) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    const ks_provider mine = r->provider[i];
    r->provider[i] = *p;
    *p = mine;
    return KS_OK;
}

/* See keyshift/registry.h. */
ks_err ks_registry_provider(ks_registry *r, ks_provider *out)
{
    if (r == NULL || out == NULL || !r->opened) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    *out = (ks_provider){&registry_ops, r, "registry"};
    return KS_OK;
}
