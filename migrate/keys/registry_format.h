/*
 * migrate/keys/registry_format.h -- the provider registry file of
 * docs/providers.md ("Registry"): a strict, allocation-free parser over
 * ks_cursor, the route query over what it parsed, and the canonical
 * encoder that is its inverse.
 *
 * Internal header.  Its functions have hidden visibility (none carries
 * KS_API), so they are shared by migrate/keys/registry.c, the unit tests
 * and fuzz/fuzz_providers.c without being part of the library's ABI.
 *
 * This part of the library knows bytes and rules only: no libsodium, no
 * file I/O, no allocation.  Opening the providers is migrate/keys/registry.c's.
 */
#ifndef KS_MIGRATE_REGISTRY_FORMAT_H
#define KS_MIGRATE_REGISTRY_FORMAT_H

#include <stddef.h>
#include <stdint.h>

#include <keyshift/common.h>
#include <keyshift/error.h>
#include <keyshift/provider.h>
#include <keyshift/registry.h>

/* The limits of [P-FILE-1], [P-LINE-2], [P-PROV-2], [P-SERVE-4], [P-PLUGIN-3]. */
#define KS_REGF_FILE_MAX 65536u  /* bytes in a file */
#define KS_REGF_LINE_MAX 1024u   /* bytes in a line, its LF not counted */
#define KS_REGF_PROVIDERS_MAX 64u
#define KS_REGF_SERVES_MAX 256u  /* serve and serve-prefix lines, over all providers */
#define KS_REGF_NAME_MAX 63u     /* bytes in a provider name [P-PROV-1] */
#define KS_REGF_PATTERN_MAX 256u /* bytes in a serve key_id or prefix (KS_KEY_ID_MAX) */
#define KS_REGF_LABEL_MAX 32u    /* bytes in a token label [P-PKCS11-2] */
#define KS_REGF_ENV_MAX 128u     /* bytes in an environment variable name [P-VAL-3] */
#define KS_REGF_TIMEOUT_MAX 600000u
#define KS_REGF_ARGS_MAX 256u    /* arg lines, over all providers [P-PLUGIN-3]; of one:
                                    KS_PLUGIN_ARGS_MAX */
#define KS_REGF_ENVS_MAX 256u    /* env and env-prefix lines, over all providers [P-PLUGIN-9];
                                    of one: KS_PLUGIN_ENV_MAX */

/* The header line's text, without its LF [P-HEAD-1]. */
#define KS_REGF_HEADER "keyshift-providers 1"

/* Provider types [P-TYPE-1]. */
typedef enum ks_regf_type {
    KS_REGF_LOCAL = 1,
    KS_REGF_PKCS11 = 2,
    KS_REGF_PLUGIN = 3
} ks_regf_type;

/* The keys of a setting line, in the canonical order of [P-CANON-1]
 * (the repeatable ones, from KS_REGF_KEY_COUNT on, are not in values:
 * serve and serve-prefix go to ks_regf_file.serves, arg to
 * ks_regf_file.args, env and env-prefix to ks_regf_file.envs). */
typedef enum ks_regf_key {
    KS_REGF_TYPE = 0,
    KS_REGF_KEYRING,
    KS_REGF_PASSPHRASE_FILE,
    KS_REGF_PASSPHRASE_ENV,
    KS_REGF_MODULE,
    KS_REGF_TOKEN_LABEL,
    KS_REGF_TOKEN_URI,
    KS_REGF_PIN_FILE,
    KS_REGF_PIN_ENV,
    KS_REGF_GCM_PARAMS,
    KS_REGF_TIMEOUT_MS,
    KS_REGF_COMMAND,
    KS_REGF_RETRIES,
    KS_REGF_RETRY_BUDGET_MS,
    KS_REGF_RATE_LIMIT,
    KS_REGF_CONCURRENCY,
    KS_REGF_KEY_COUNT,       /* the number of keys above */
    KS_REGF_SERVE = KS_REGF_KEY_COUNT,
    KS_REGF_SERVE_PREFIX,
    KS_REGF_ARG,
    KS_REGF_ENV,
    KS_REGF_ENV_PREFIX
} ks_regf_key;

/* One provider section.  Views point into the parsed input; an absent
 * setting is {NULL, 0} (every present value has at least one byte). */
typedef struct ks_regf_provider {
    ks_bytes name;
    size_t offset;                        /* of the section's `provider` line */
    ks_regf_type type;
    ks_bytes value[KS_REGF_KEY_COUNT];    /* by ks_regf_key */
    uint32_t number[KS_REGF_KEY_COUNT];   /* a numeric setting's value (timeout-ms,
                                             retries, ...), by ks_regf_key; 0 when absent */
    uint32_t serves;                      /* its serve and serve-prefix lines */
    uint32_t args;                        /* its arg lines */
    uint32_t envs;                        /* its env and env-prefix lines */
} ks_regf_provider;

/* One serve or serve-prefix line. */
typedef struct ks_regf_serve {
    ks_bytes pattern;       /* the key_id, or the prefix */
    uint8_t prefix;         /* 0: serve (exact), 1: serve-prefix */
    uint8_t provider;       /* index into ks_regf_file.providers */
} ks_regf_serve;

/* One arg line of a plugin provider [P-PLUGIN-3]. */
typedef struct ks_regf_arg {
    ks_bytes value;         /* one argv element, as written */
    uint8_t provider;       /* index into ks_regf_file.providers */
} ks_regf_arg;

/* One env or env-prefix line of a plugin provider [P-PLUGIN-9]. */
typedef struct ks_regf_env {
    ks_bytes name;          /* the variable's name, or the prefix */
    uint8_t prefix;         /* 0: env (exact), 1: env-prefix */
    uint8_t provider;       /* index into ks_regf_file.providers */
} ks_regf_env;

/* A parsed registry file: providers in file order, serve lines, arg
 * lines and env lines in file order (so each provider's lines are
 * contiguous). */
typedef struct ks_regf_file {
    size_t nproviders;
    size_t nserves;
    size_t nargs;
    size_t nenvs;
    ks_regf_provider providers[KS_REGF_PROVIDERS_MAX];
    ks_regf_serve serves[KS_REGF_SERVES_MAX];
    ks_regf_arg args[KS_REGF_ARGS_MAX];
    ks_regf_env envs[KS_REGF_ENVS_MAX];
} ks_regf_file;

/* A rejection [P-ERR-1..3]: the code (1..11 or KS_ERR_CONFLICT), the
 * byte offset, the 1-based line and column of that byte (for an offset
 * at the end of the file: one past its last line's end), and the 1-based
 * index of the provider section it is in (0 before the first). */
typedef struct ks_regf_error {
    ks_err code;
    size_t offset;
    uint32_t line;
    uint32_t column;
    uint32_t provider;
} ks_regf_error;

/*
 * Parse a registry file buf[0, len) strictly (docs/providers.md
 * "Registry").  On success fills *out and returns KS_OK.  On failure
 * returns the rejection code, fills *err (when not NULL) and leaves *out
 * zeroed.  Never allocates; reads only buf[0, len); work O(len * serves).
 */
ks_err ks_regf_parse(const uint8_t *buf, size_t len, ks_regf_file *out, ks_regf_error *err);

/*
 * The provider serving key_id [P-ROUTE-1..3]: an exact serve line, else
 * the longest serve-prefix that key_id starts with.  Its index goes to
 * *index; KS_ERR_NOT_FOUND when nothing serves key_id (there is no
 * default).  KS_ERR_INVALID_ARGUMENT for NULL pointers.
 */
ks_err ks_regf_route(const ks_regf_file *f, ks_bytes key_id, size_t *index);

/* The text of a key ("type", "serve-prefix", ...), or NULL. */
const char *ks_regf_key_name(int key);

/* The text of a type ("local", "pkcs11", "plugin"), or NULL. */
const char *ks_regf_type_name(int type);

/*
 * Encode f in the canonical form of [P-CANON-1] into out[0, cap); the
 * length goes to *out_len.  KS_ERR_BUFFER_TOO_SMALL (nothing useful
 * written) when cap is short, KS_ERR_INVALID_ARGUMENT for NULL pointers.
 * f must be what ks_regf_parse() produced: the encoder does not check the
 * rules again, and the parse of its output equals f (values compared by
 * their bytes).
 */
ks_err ks_regf_encode(const ks_regf_file *f, uint8_t *out, size_t cap, size_t *out_len);

/* ---- between registry.c and tests/test_registry.c ---------------- */

/*
 * Exchange provider i of a loaded registry with *p: the registry's
 * provider goes to *p, *p's takes its place (and is destroyed by
 * ks_registry_close).  For tests of the routing provider with providers
 * that keyshift does not have (no admin ops, failing calls).
 * KS_ERR_INVALID_ARGUMENT for NULL pointers, a registry that opened no
 * providers, or i past the last provider.
 */
ks_err ks_registry_swap_provider(ks_registry *r, size_t i, ks_provider *p);

#endif /* KS_MIGRATE_REGISTRY_FORMAT_H */
