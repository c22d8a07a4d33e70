/*
 * keyshift/registry.h -- the provider registry: a file naming the key
 * providers a process uses and which key_ids each one serves, and the
 * routing provider ("registry") that sends every call to the provider
 * serving its key_id.  The file format is specified in docs/providers.md,
 * section "Registry".
 *
 * Routing.  An exact `serve` line beats any `serve-prefix`; among
 * prefixes the longest wins.  A key_id that nothing serves is
 * KS_ERR_NOT_FOUND: there is no default provider and no fallback, ever.
 *
 * Secrets.  The file holds none: passphrases and PINs come from files or
 * environment variables it names, are read into sodium_malloc'd memory
 * when the provider opens (at load, or when first needed with
 * ks_registry_load_lazy) and wiped as soon as it has opened.
 *
 * Threads.  A loaded registry never changes but for opening a provider
 * when first needed, which is done once under a lock; it and its routing
 * provider may be used from several threads at once (its providers are
 * thread-safe, include/keyshift/provider.h).
 */
#ifndef KEYSHIFT_REGISTRY_H
#define KEYSHIFT_REGISTRY_H

#include <keyshift/common.h>
#include <keyshift/envelope.h>
#include <keyshift/error.h>
#include <keyshift/plugin.h>
#include <keyshift/provider.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes in a provider name, at most (docs/providers.md [P-PROV-1]). */
#define KS_REGISTRY_NAME_MAX 63

typedef struct ks_registry ks_registry;

/* The step of ks_registry_load() that failed (docs/providers.md [P-LOAD-2]). */
typedef enum ks_registry_stage {
    KS_REGISTRY_STAGE_NONE = 0,     /* no failure, or the arguments */
    KS_REGISTRY_STAGE_FILE = 1,     /* opening, checking or reading the file */
    KS_REGISTRY_STAGE_PARSE = 2,    /* the file's contents: a rejection */
    KS_REGISTRY_STAGE_PROVIDER = 3  /* opening one of its providers */
} ks_registry_stage;

/* What went wrong in ks_registry_load() or ks_registry_read(). */
typedef struct ks_registry_error {
    ks_registry_stage stage;
    ks_err code;         /* PARSE: the rejection (1..11 or KS_ERR_CONFLICT); else what
                            the failed step returned (the load's own result) */
    size_t offset;       /* PARSE: byte offset in the file ([P-ERR-3]) */
    uint32_t line;       /* PARSE: 1-based line of that byte */
    uint32_t column;     /* PARSE: 1-based column of that byte */
    uint32_t provider;   /* PARSE, PROVIDER: 1-based index of the provider section, or 0 */
    char name[KS_REGISTRY_NAME_MAX + 1]; /* PROVIDER: the provider's name; else "" */
    const char *setting; /* PROVIDER: the setting that failed ("keyring", "pin-env", ...),
                            or NULL when the provider's own open failed; static storage */
    ks_parse_error keyring; /* PROVIDER, a local keyring that does not parse
                               (code KS_ERR_INTEGRITY): its rejection */
    ks_plugin_error plugin; /* PROVIDER, a plugin provider that did not open: what
                               ks_plugin_open() found (its stage, the refusal's reason
                               and field, the plugin's message, its redacted stderr);
                               else zeroed (stage NULL) */
} ks_registry_error;

/*
 * Load the registry file at path and open every provider it names
 * (docs/providers.md [P-LOAD-1..4]).  The file is opened with O_NOFOLLOW
 * and must be a regular file owned by the effective user or root that
 * neither group nor others may write (reading is allowed): else
 * KS_ERR_INSECURE.  Then, in file order, each provider is opened; the
 * first that fails makes the whole load fail, with its name in *err:
 * no partial registry is ever returned.
 * Errors: KS_ERR_INVALID_ARGUMENT, KS_ERR_INSECURE, KS_ERR_IO (missing,
 * unreadable), KS_ERR_INTEGRITY (the file breaks the format: the
 * rejection is in *err), KS_ERR_NO_MEMORY, or the error of the provider
 * that failed to open (from ks_keyring_open, ks_pkcs11_open, or reading
 * its passphrase or PIN: KS_ERR_NOT_FOUND for an unset variable,
 * KS_ERR_BAD_VALUE for an empty secret, KS_ERR_TOO_LARGE above 4096
 * bytes; from ks_plugin_open for a plugin, which is started and greeted
 * here, its details in err->plugin).  *out is NULL on error.  err may be
 * NULL.
 */
KS_API KS_WUR ks_err ks_registry_load(const char *path, ks_registry **out, ks_registry_error *err);

/*
 * As ks_registry_load(), but open each provider only when a call of the
 * routing provider first needs it (docs/providers.md [P-LOAD-5]): a
 * command that decrypts under a keyring key never logs in to an HSM or
 * starts a plugin that the registry also names.  The file is read,
 * checked and parsed here (its errors as ks_registry_load's); a
 * provider's passphrase or PIN is read when it opens.  A provider that
 * fails to open fails the call that needed it with the error
 * ks_registry_load would have returned, and every later call routed to
 * it, without a second try; ks_registry_open_error() gives the details.
 * A key_id that no provider serves is KS_ERR_NOT_FOUND, as ever, and a
 * listing of every key opens every provider.  Opening is thread-safe:
 * each provider is opened once, whichever threads need it.
 */
KS_API KS_WUR ks_err ks_registry_load_lazy(const char *path, ks_registry **out,
                                           ks_registry_error *err);

/*
 * The first provider of r (loaded with ks_registry_load_lazy) that failed
 * to open when a call needed it: its error is returned and its details
 * go to *err as ks_registry_load() would have filled them (stage
 * KS_REGISTRY_STAGE_PROVIDER, its name, the setting at fault, ...).
 * KS_OK (and *err zeroed) when no open has failed;
 * KS_ERR_INVALID_ARGUMENT for a NULL argument.
 */
KS_API KS_WUR ks_err ks_registry_open_error(ks_registry *r, ks_registry_error *err);

/*
 * As ks_registry_load(), but open no provider: for listing, routing
 * queries and checking a file where its secrets are not at hand.  A
 * registry read this way has no routing provider (ks_registry_provider
 * gives KS_ERR_INVALID_ARGUMENT).
 */
KS_API KS_WUR ks_err ks_registry_read(const char *path, ks_registry **out, ks_registry_error *err);

/* Close every provider the registry opened (wiping their keys) and free
 * it; NULL is a no-op.  Its routing providers must no longer be used. */
KS_API void ks_registry_close(ks_registry *r);

/*
 * The routing provider over r (name "registry"), which borrows r: r must
 * outlive it, and ks_provider_destroy() on it does not close r.
 * wrap, unwrap and key_info go to the provider serving the key_id
 * (KS_ERR_NOT_FOUND when none does).  Its admin ops route create,
 * add_version, promote and set_state the same way; a serving provider
 * without admin ops gives KS_ERR_DENIED.  list with a key_id goes to the
 * provider serving it; list of every key (empty key_id) merges the keys
 * of every provider that has admin ops, keeping only the keys the
 * registry routes to that provider, in key_id order ([P-ROUTE-4]).
 */
KS_API KS_WUR ks_err ks_registry_provider(ks_registry *r, ks_provider *out);

/* The provider serving key_id: its index (0-based, file order) goes to
 * *index.  KS_ERR_NOT_FOUND when nothing serves it. */
KS_API KS_WUR ks_err ks_registry_route(const ks_registry *r, ks_bytes key_id, size_t *index);

/* ---- listing (`keyshift providers list`) ---------------------------------- */

/* One provider.  Strings are NUL-terminated, valid until ks_registry_close(). */
typedef struct ks_registry_info {
    const char *name;
    const char *type;    /* "local", "pkcs11" or "plugin" */
    size_t settings;     /* its settings other than type and serve lines (arg, env
                            and env-prefix lines included) */
    size_t serves;       /* its serve and serve-prefix lines */
} ks_registry_info;

/* One setting of a provider, e.g. {"keyring", "/etc/keyshift/app.keyring"}:
 * never a secret (the file holds none).  Strings as in ks_registry_info. */
typedef struct ks_registry_setting {
    const char *key;
    const char *value;
} ks_registry_setting;

/* One serve line. */
typedef struct ks_registry_serve {
    const char *pattern; /* the key_id, or the prefix */
    int prefix;          /* 0: serve (exact), 1: serve-prefix */
} ks_registry_serve;

/* The number of providers. */
KS_API size_t ks_registry_count(const ks_registry *r);

/* The i-th provider, in file order; KS_ERR_NOT_FOUND past the end. */
KS_API KS_WUR ks_err ks_registry_info_at(const ks_registry *r, size_t i, ks_registry_info *out);

/* Setting j of provider i, in the canonical order of [P-CANON-1] (the
 * defaults a setting left out takes are not listed; a plugin's arg lines
 * come after the others, each a setting "arg", in file order, then its
 * env and env-prefix lines in file order); KS_ERR_NOT_FOUND past the end. */
KS_API KS_WUR ks_err ks_registry_setting_at(const ks_registry *r, size_t i, size_t j,
                                            ks_registry_setting *out);

/* Serve line j of provider i, in file order; KS_ERR_NOT_FOUND past the end. */
KS_API KS_WUR ks_err ks_registry_serve_at(const ks_registry *r, size_t i, size_t j,
                                          ks_registry_serve *out);

/* The counters of provider i, a plugin provider, and the hello's plugin
 * string (include/keyshift/plugin.h).  KS_ERR_INVALID_ARGUMENT when r was
 * only read (ks_registry_read), i is past the end, provider i is not a
 * plugin, or it is not open (ks_registry_load_lazy: not needed yet, or
 * its open failed). */
KS_API KS_WUR ks_err ks_registry_plugin_stats(const ks_registry *r, size_t i, ks_plugin_stats *out);

#ifdef __cplusplus
}
#endif
#endif /* KEYSHIFT_REGISTRY_H */
