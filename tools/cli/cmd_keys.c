/*
 * tools/cli/cmd_keys.c -- `keyshift keys`: manage the local keyring.
 *
 * Every change goes through the keyring API, which locks, re-reads and
 * atomically replaces the file; nothing here prints key material.
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>

#include <sqlite3.h>

#include <keyshift/rowstore_pg.h>

#include "cli.h"

/* Print the subcommand's manual to f. */
static void usage(FILE *f)
{
    fputs("NAME\n"
          "    keyshift keys - manage key-encryption keys, in a keyring or a provider\n"
          "\n"
          "SYNOPSIS\n"
          "    keyshift keys init\n"
          "    keyshift keys create KEY_ID\n"
          "    keyshift keys add-version KEY_ID\n"
          "    keyshift keys promote KEY_ID VERSION\n"
          "    keyshift keys set-state KEY_ID VERSION STATE\n"
          "    keyshift keys set-state KEY_ID VERSION destroyed [--db DB]...\n"
          "        [--force --reason TEXT]\n"
          "    keyshift keys list [--json]\n"
          "    (each also takes --keyring FILE and --passphrase-file FILE, or, but\n"
          "    init, --providers FILE)\n"
          "\n"
          "DESCRIPTION\n"
          "    A keyring file holds key-encryption keys (KEKs) by KEY_ID, each with\n"
          "    numbered versions and one primary version, which wraps the data keys\n"
          "    of new envelopes. The format is specified in docs/keyring.md.\n"
          "    With --providers, each KEY_ID is managed in the provider that serves\n"
          "    it (docs/providers.md): the same commands create, rotate and retire a\n"
          "    key held in an HSM through PKCS#11, whose material is generated in the\n"
          "    token and never leaves it; list shows the keys of every provider.\n"
          "    A provider is opened (its PIN read, its token logged in to, its\n"
          "    plugin started) only when a command first needs a key it serves,\n"
          "    and list needs them all. A KMS plugin's keys (keyshift-kms-aws) are\n"
          "    the --key lines of its arg settings in the providers file: list\n"
          "    shows them from there, and add-version and promote refuse them\n"
          "    (exit 64) and say how to stage a version there instead\n"
          "    (docs/kms-plugin.md [KP-AWS-15]).\n"
          "\n"
          "    init         create an empty keyring (mode 0600); sealed with the\n"
          "                 passphrase when one is given. A missing directory is\n"
          "                 created (mode 0700) when its parent exists\n"
          "    create       add KEY_ID with version 1, active and primary\n"
          "    add-version  add the next version, active but NOT primary; prints it.\n"
          "                 Distribute the keyring to every reader before promoting\n"
          "    promote      make an active VERSION the primary for new writes\n"
          "    set-state    STATE is active, decrypt-only, disabled or destroyed.\n"
          "                 decrypt-only: opens, no new wraps; disabled: neither,\n"
          "                 reversible; destroyed: the material is wiped, FOR GOOD.\n"
          "                 The primary must stay active: promote another first.\n"
          "                 destroyed is refused (exit 75) while a row or a live\n"
          "                 reader still references that version in a database given\n"
          "                 with --db (repeatable; a SQLite file or a PostgreSQL\n"
          "                 connection string): rows in the column (or each\n"
          "                 listed column of a key scope) of every rollout whose\n"
          "                 source or target uses the key and of every\n"
          "                 migrated column (on PostgreSQL, those of the\n"
          "                 keyshift_migration of every schema; a migrated table\n"
          "                 that the connection's search_path does not show is\n"
          "                 not counted, which refuses too); live readers holding\n"
          "                 the version; rollouts not finalized that move it.\n"
          "                 Without --db it is refused (exit 64): references cannot\n"
          "                 be checked. --force --reason TEXT overrides both and, with\n"
          "                 --db, appends the reason to the log of each rollout whose\n"
          "                 source or target is that version\n"
          "    list         keys, versions, states and creation times; no material.\n"
          "                 A key in a PKCS#11 token has no creation time (the token\n"
          "                 records none): CREATED is empty, \"created\":\"\" in JSON\n"
          "\n"
          "OPTIONS\n"
          "    --keyring FILE          the keyring (default: $KEYSHIFT_KEYRING)\n"
          "    --passphrase-file FILE  read the keyring passphrase from FILE (default:\n"
          "                            $KEYSHIFT_PASSPHRASE; never on the command line);\n"
          "                            " KS_CLI_PASSPHRASE_RULE "\n"
          "    --providers FILE        " KS_CLI_KEYS_RULE
          "    --json                  list: one JSON object\n"
          "    --db DB                 set-state destroyed: a database to check for\n"
          "                            references (repeatable): a SQLite file (must\n"
          "                            exist), or a PostgreSQL connection URI\n"
          "                            (postgresql://[user@]host[:port]/db?... or\n"
          "                            postgres://...) or libpq key=value string\n"
          "                            ('host=H dbname=D'), which holds keyshift's\n"
          "                            rollout tables and the migrated tables. No\n"
          "                            password in it (exit 64): give it through\n"
          "                            PGPASSFILE or PGPASSWORD. Messages name it\n"
          "                            'PostgreSQL database (--db N)', never by the\n"
          "                            string\n"
          "    --force                 set-state destroyed: skip the reference check\n"
          "    --reason TEXT           why --force (required with it; logged)\n"
          "    -h, --help              print this manual\n"
          "\n"
          "    The keyring must not be readable or writable by group or others;\n"
          "    it is refused otherwise, as ssh refuses such keys. Changes are\n"
          "    locked against concurrent writers and atomic: a crash leaves the old\n"
          "    or the new keyring.\n"
          "\n"
          "ENVIRONMENT\n"
          KS_CLI_PG_ENV
          "\n"
          "EXIT STATUS\n"
          "    0 success; 64 usage (destroyed without --db or --force, a password in\n"
          "    a PostgreSQL --db); 65 refused (key exists, forbidden state change);\n"
          "    66 a --db database missing; 73 init cannot create the keyring (a file\n"
          "    is already there, or its directory is missing or not writable);\n"
          "    75 destroyed refused: the version is still referenced, or its rows\n"
          "    could not all be counted (the message says where), or a --db\n"
          "    database stayed locked; 69 provider or\n"
          "    PostgreSQL database unreachable; 77 no such key or version (or\n"
          "    no provider serves KEY_ID); 78 insecure, unreadable or corrupt keyring\n"
          "    or providers file, wrong passphrase, or wrong or locked PIN; 71 system\n"
          "    error.\n"
          "\n"
          "EXAMPLES\n"
          "    export KEYSHIFT_KEYRING=$HOME/.keyshift/keyring\n"
          "    keyshift keys init && keyshift keys create payments/kek\n"
          "    keyshift keys add-version payments/kek      # prints 2\n"
          "    keyshift keys promote payments/kek 2\n"
          "    keyshift keys set-state payments/kek 1 decrypt-only\n"
          "    keyshift keys set-state payments/kek 1 destroyed --db shop.db \\\n"
          "        --db 'postgresql://app@db1.internal/orders'\n",
          f);
}

/* Parse a key version (1 .. 2^32-1). */
static int parse_version(const char *s, uint32_t *out)
{
    size_t v;
    if (ks_cli_parse_size(s, 1, UINT32_MAX, &v) != 0) {
        return -1;
    }
    *out = (uint32_t)v;
    return 0;
}

/* Report a failed change to key_id and return its exit code. */
static int change_failed(const char *what, const char *key_id, ks_err e)
{
    static const char *const why[] = {
        [KS_ERR_EXISTS] = "it already exists",
        [KS_ERR_NOT_FOUND] = "no such key or version",
        [KS_ERR_STATE] = "that state change is not allowed (destroyed is final; the primary "
                         "must stay active: promote another version first)",
        [KS_ERR_BAD_VALUE] = "not a valid key id (1..256 bytes of [A-Za-z0-9._:/@+=-])",
    };
    const char *reason = (size_t)e < sizeof why / sizeof why[0] && why[e] ? why[e] : ks_err_name(e);
    ks_cli_error("cannot %s %s: %s", what, key_id, reason);
    int rc = ks_cli_exit_code(e);
    return e == KS_ERR_BAD_VALUE ? EX_USAGE : rc;
}

/* What `keys list` has printed so far: the key being listed, for grouping
 * one key's versions in the JSON output. */
typedef struct list_state {
    const ks_provider *p;
    int json;
    ks_err err;             /* a key_info that failed, ending the listing */
    size_t keys;            /* keys started */
    uint8_t id[KS_KEY_ID_MAX];
    size_t id_len;
} list_state;

/* Print one version (a ks_key_list_fn): a table row, or JSON, opening a
 * new key object when the key_id changes. */
static int list_one(void *arg, const ks_key_entry *e)
{
    list_state *l = arg;
    char when[32];
    ks_cli_format_time((int64_t)e->created, when, sizeof when);
    if (!l->json) {
        printf("%-32.*s %-8u %-13s %-8s %s\n", (int)e->key_id.len, (const char *)e->key_id.ptr,
               e->version, ks_key_state_name(e->state), e->is_primary ? "*" : "", when);
        return 0;
    }
    const int same = l->keys > 0 && e->key_id.len == l->id_len &&
                     memcmp(e->key_id.ptr, l->id, l->id_len) == 0;
    if (!same) {
        ks_key_info primary = {0};
        l->err = l->p->ops->key_info(l->p->self, e->key_id, 0, &primary, 0);
        if (l->err != KS_OK) {
            return 1;
        }
        printf("%s{\"key_id\":", l->keys ? "]}," : "");
        ks_cli_put_json_string(stdout, e->key_id.ptr, e->key_id.len);
        printf(",\"primary\":%u,\"versions\":[", primary.version);
        l->keys++;
        l->id_len = e->key_id.len <= sizeof l->id ? e->key_id.len : sizeof l->id;
        memcpy(l->id, e->key_id.ptr, l->id_len);
    }
    printf("%s{\"version\":%u,\"state\":\"%s\",\"primary\":%s,\"created\":\"%s\"}",
           same ? "," : "", e->version, ks_key_state_name(e->state), e->is_primary ? "true" : "false",
           when);
    return 0;
}

static void list_plugin_keys(const ks_registry *r, int json, size_t printed);

/* `keys list`: every version the provider manages, then the keys of the
 * registry's plugin providers (reg, may be NULL), a table or one JSON
 * object with --json. */
static int list_keys(const ks_provider *p, const ks_registry *reg, int json)
{
    list_state l = {p, json, KS_OK, 0, {0}, 0};
    if (json) {
        printf("{\"keys\":[");
    } else {
        printf("%-32s %-8s %-13s %-8s %s\n", "KEY_ID", "VERSION", "STATE", "PRIMARY", "CREATED");
    }
    fflush(stdout);
    ks_err e = p->ops->admin->list(p->self, (ks_bytes){NULL, 0}, list_one, &l, 0);
    e = e == KS_OK ? l.err : e;
    if (e != KS_OK) {
        if (json) {
            printf("\n");
        }
        ks_cli_error("cannot list keys: %s", ks_err_name(e));
        return ks_cli_exit_code(e);
    }
    if (json) {
        printf("%s", l.keys ? "]}" : "");
    }
    if (reg != NULL) {
        list_plugin_keys(reg, json, l.keys);
    }
    if (json) {
        printf("]}\n");
    }
    return EX_OK;
}

/* One --key line of a plugin provider's arguments (docs/kms-plugin.md
 * [KP-AWS-4]): KEYID,VERSION,KMSKEY[,decrypt-only].  Read from the
 * providers file, which keyshift trusts ([P-LOAD-1]); a line that does
 * not parse so is not shown (the plugin refuses it when it starts). */
typedef struct {
    const char *provider;
    const char *line; /* after "--key=" */
    size_t id_len;
    uint32_t version;
    const char *kms_key;
    size_t kms_len;
    int decrypt_only;
} plugin_key;

/* Parse the value v of an arg setting into k.  1 when it is a --key line. */
static int plugin_key_parse(const char *provider, const char *v, plugin_key *k)
{
    if (strncmp(v, "--key=", 6) != 0) {
        return 0;
    }
    const char *id = v + 6, *c1 = strchr(id, ','), *c2 = c1 != NULL ? strchr(c1 + 1, ',') : NULL;
    if (c1 == NULL || c2 == NULL || c1 == id || c2 == c1 + 1) {
        return 0;
    }
    char *end = NULL;
    errno = 0;
    unsigned long ver = strtoul(c1 + 1, &end, 10);
    if (end != c2 || errno != 0 || ver == 0 || ver > UINT32_MAX || c1[1] < '1' || c1[1] > '9') {
        return 0;
    }
    const char *c3 = strchr(c2 + 1, ',');
    *k = (plugin_key){provider, id, (size_t)(c1 - id), (uint32_t)ver, c2 + 1,
                      c3 != NULL ? (size_t)(c3 - c2 - 1) : strlen(c2 + 1),
                      c3 != NULL && strcmp(c3 + 1, "decrypt-only") == 0};
    return k->kms_len > 0 && (c3 == NULL || k->decrypt_only);
}

/* Call fn(arg, key) for every --key line of every plugin provider of r,
 * in file order. */
static void plugin_keys_each(const ks_registry *r, void (*fn)(void *, const plugin_key *), void *arg)
{
    ks_registry_info info;
    ks_registry_setting st;
    plugin_key k;
    for (size_t i = 0; ks_registry_info_at(r, i, &info) == KS_OK; i++) {
        if (strcmp(info.type, "plugin") != 0) {
            continue;
        }
        for (size_t j = 0; ks_registry_setting_at(r, i, j, &st) == KS_OK; j++) {
            if (strcmp(st.key, "arg") == 0 && plugin_key_parse(info.name, st.value, &k)) {
                fn(arg, &k);
            }
        }
    }
}

/* What listing a registry's plugin keys needs: the registry, the output
 * style, the keys already printed (for the JSON commas), and the key
 * whose lines are being gathered. */
typedef struct {
    const ks_registry *r;
    int json;
    size_t printed;
    const plugin_key *first; /* the key's first line */
    int seen_before;         /* that key_id had a line before first */
    uint32_t primary;        /* its highest version not decrypt-only, 0 none */
    size_t nth;              /* lines of it printed */
} plugin_list;

/* Whether a and b name the same key_id. */
static int same_key_id(const plugin_key *a, const plugin_key *b)
{
    return a->id_len == b->id_len && memcmp(a->line, b->line, a->id_len) == 0;
}

/* Pass 1 for one line: is it the first of its key_id (l->first)? */
static void pk_earlier(void *arg, const plugin_key *k)
{
    plugin_list *l = arg;
    if (k->line == l->first->line) {
        l->primary = 1; /* reached first: nothing before it */
    } else if (l->primary == 0 && same_key_id(k, l->first)) {
        l->seen_before = 1;
    }
}

/* Pass 2 for one line: the primary of l->first's key_id [KP-AWS-4]. */
static void pk_primary(void *arg, const plugin_key *k)
{
    plugin_list *l = arg;
    if (same_key_id(k, l->first) && !k->decrypt_only && k->version > l->primary) {
        l->primary = k->version;
    }
}

/* Pass 3 for one line: print it when it is of l->first's key_id. */
static void pk_print(void *arg, const plugin_key *k)
{
    plugin_list *l = arg;
    if (!same_key_id(k, l->first)) {
        return;
    }
    const char *state = k->decrypt_only ? "decrypt-only" : "active";
    const int primary = k->version == l->primary;
    if (!l->json) {
        printf("%-32.*s %-8u %-13s %-8s %s (plugin %s, %.*s)\n", (int)k->id_len, k->line, k->version, state,
               primary ? "*" : "", "-", k->provider, (int)k->kms_len, k->kms_key);
        return;
    }
    if (l->nth == 0) {
        printf("%s{\"key_id\":", l->printed > 0 ? "," : "");
        ks_cli_put_json_string(stdout, (const uint8_t *)k->line, k->id_len);
        printf(",\"primary\":%u,\"provider\":", l->primary);
        ks_cli_put_json_string(stdout, (const uint8_t *)k->provider, strlen(k->provider));
        printf(",\"versions\":[");
    }
    printf("%s{\"version\":%u,\"state\":\"%s\",\"primary\":%s,\"kms_key\":", l->nth > 0 ? "," : "", k->version,
           state, primary ? "true" : "false");
    ks_cli_put_json_string(stdout, (const uint8_t *)k->kms_key, k->kms_len);
    printf("}");
    l->nth++;
}

/* For each line that is the first of its key_id, print that key_id's
 * lines (quadratic in the lines, which the registry bounds at 32 per
 * plugin, KS_PLUGIN_ARGS_MAX). */
static void pk_key(void *arg, const plugin_key *k)
{
    plugin_list *l = arg;
    plugin_list one = {l->r, l->json, l->printed, k, 0, 0, 0};
    plugin_keys_each(l->r, pk_earlier, &one);
    if (one.seen_before) {
        return;
    }
    one.primary = 0;
    plugin_keys_each(l->r, pk_primary, &one);
    plugin_keys_each(l->r, pk_print, &one);
    if (l->json) {
        printf("]}");
    }
    l->printed++;
}

/* `keys list` for the keys of r's plugin providers, after the keys the
 * providers listed themselves (printed of them, for the JSON commas). */
static void list_plugin_keys(const ks_registry *r, int json, size_t printed)
{
    plugin_list l = {r, json, printed, NULL, 0, 0, 0};
    plugin_keys_each(r, pk_key, &l);
}

/* A change (add-version, promote) asked of a key that a plugin provider
 * serves: the plugin's versions are its --key lines in the providers
 * file, so say how to stage one there.  EX_USAGE when key_id is such a
 * key, else EX_OK. */
static int refuse_plugin_change(const ks_cli_keys *keys, const char *act, const char *key_id)
{
    size_t i;
    ks_registry_info info;
    if (keys->reg == NULL || (strcmp(act, "add-version") != 0 && strcmp(act, "promote") != 0) ||
        ks_registry_route(keys->reg, (ks_bytes){(const uint8_t *)key_id, strlen(key_id)}, &i) != KS_OK ||
        ks_registry_info_at(keys->reg, i, &info) != KS_OK || strcmp(info.type, "plugin") != 0) {
        return EX_OK;
    }
    return ks_cli_usage_error("keys", "%s is served by plugin provider %s, whose key versions are the "
                                      "--key lines of its arg settings in the providers file %s, not "
                                      "keyshift's to %s. To stage version N+1: add 'arg "
                                      "--key=%s,N+1,KMSKEY,decrypt-only', restart every process that "
                                      "reads the file, then drop ',decrypt-only' from it and add it to "
                                      "version N's line (docs/kms-plugin.md [KP-AWS-15])",
                              key_id, info.name, keys->providers != NULL ? keys->providers : "", act,
                              key_id);
}

/*
 * Make sure the directory of the keyring at path exists before `keys
 * init` writes there: a missing directory whose own parent exists is
 * created mode 0700 (as ssh-keygen makes ~/.ssh); a deeper missing path,
 * or something there that is not a directory, is EX_CANTCREAT with a
 * message naming the directory.  Only one level is created, so a typo
 * in a long path is reported rather than built.
 */
static int ensure_keyring_dir(const char *path)
{
    char dir[4096];
    const char *slash = strrchr(path, '/');
    struct stat st;
    if (slash == NULL || slash == path) {
        return EX_OK; /* the current directory, or / */
    }
    const size_t n = (size_t)(slash - path);
    if (n >= sizeof dir) {
        ks_cli_error("cannot create keyring %s: its directory name is longer than %zu bytes", path,
                     sizeof dir - 1);
        return EX_CANTCREAT;
    }
    memcpy(dir, path, n);
    dir[n] = '\0';
    if (stat(dir, &st) == 0) {
        if (!S_ISDIR(st.st_mode)) {
            ks_cli_error("cannot create keyring %s: %s is not a directory", path, dir);
            return EX_CANTCREAT;
        }
        return EX_OK;
    }
    if (errno != ENOENT || mkdir(dir, S_IRWXU) != 0) {
        ks_cli_error("cannot create keyring %s: its directory %s does not exist and cannot be "
                     "created (%s); create it first: mkdir -p -m 700 %s", path, dir,
                     strerror(errno), dir);
        return EX_CANTCREAT;
    }
    fprintf(stderr, KS_PROG ": created directory %s (mode 0700)\n", dir);
    return EX_OK;
}

/* `keys init`: a new keyring, sealed when a passphrase is given, in a
 * directory that exists or that ensure_keyring_dir() could make. */
static int init_keyring(const char *path, const char *passfile)
{
    ks_bytes pass;
    int rc = ks_cli_keyring_args(&path, passfile, &pass);
    if (rc != EX_OK) {
        return rc;
    }
    if ((rc = ensure_keyring_dir(path)) != EX_OK) {
        ks_cli_passphrase_free(&pass);
        return rc;
    }
    ks_err e = ks_keyring_init(path, pass);
    ks_cli_passphrase_free(&pass);
    if (e == KS_ERR_EXISTS) {
        ks_cli_error("cannot create keyring %s: a file is already there", path);
        return EX_CANTCREAT;
    }
    if (e == KS_ERR_IO) {
        ks_cli_error("cannot create keyring %s: its directory or %s.lock could not be written "
                     "(check that you may write there and that the disk is not full)", path, path);
        return EX_CANTCREAT;
    }
    if (e != KS_OK) {
        ks_cli_error("cannot create keyring %s: %s", path, ks_err_name(e));
        return ks_cli_exit_code(e);
    }
    fprintf(stderr, KS_PROG ": created keyring %s\n", path);
    return EX_OK;
}

/* What set-state destroyed checks and does besides the keyring. */
typedef struct destroy_opts {
    const char *dbs[16];
    int n_dbs, force;
    const char *reason;
} destroy_opts;

/* Collect every --db FILE / --db=FILE of argv (before "--") into d, since
 * the option parser keeps only the last value of an option. */
static int collect_dbs(int argc, char **argv, destroy_opts *d)
{
    for (int i = 1; i < argc && strcmp(argv[i], "--") != 0; i++) {
        const char *v = NULL;
        if (strcmp(argv[i], "--db") == 0 && i + 1 < argc) {
            v = argv[++i];
        } else if (strncmp(argv[i], "--db=", 5) == 0) {
            v = argv[i] + 5;
        } else if (strcmp(argv[i], "--reason") == 0 || strcmp(argv[i], "--keyring") == 0 ||
                   strcmp(argv[i], "--passphrase-file") == 0) {
            i++; /* skip its value */
        }
        if (v != NULL) {
            if (d->n_dbs == (int)(sizeof d->dbs / sizeof d->dbs[0])) {
                return ks_cli_usage_error("keys", "more than 16 --db options were given; run the "
                                                  "command with at most 16");
            }
            d->dbs[d->n_dbs++] = v;
        }
    }
    return EX_OK;
}

/* A column to count, once. */
typedef struct scope {
    char table[KS_ROLLOUT_IDENT_MAX + 1], column[KS_ROLLOUT_IDENT_MAX + 1];
    ks_value_encoding encoding; /* how its census reads it: a rollout's record; else for
                                   PostgreSQL the column's type, for SQLite binary (and
                                   base64 too: scope_key_rows) */
} scope;

/* Add table.column to scopes[0, *n) unless there (names compared as
 * the database compares identifiers: SQLite without regard to ASCII
 * case, PostgreSQL exactly, when exact, since its store opens a table by
 * its exact spelling); a column that does not fit (a full list, a name
 * too long) sets *cut, so that the rows are known not to be all counted
 * (fail closed: the destroy is then refused unless forced). */
static void add_scope(scope *scopes, size_t *n, size_t max, const char *t, const char *c,
                      ks_value_encoding encoding, int exact, int *cut)
{
    for (size_t i = 0; i < *n; i++) {
        if (exact ? strcmp(scopes[i].table, t) == 0 && strcmp(scopes[i].column, c) == 0
                  : strcasecmp(scopes[i].table, t) == 0 && strcasecmp(scopes[i].column, c) == 0) {
            return;
        }
    }
    if (*n < max && strlen(t) <= KS_ROLLOUT_IDENT_MAX && strlen(c) <= KS_ROLLOUT_IDENT_MAX) {
        memcpy(scopes[*n].table, t, strlen(t) + 1);
        memcpy(scopes[*n].column, c, strlen(c) + 1);
        scopes[*n].encoding = encoding;
        (*n)++;
    } else {
        *cut = 1;
    }
}

/* Add the columns the keyshift_migration of SQLite file db has
 * checkpoints for (read-only; none when the table does not exist). */
static int sqlite_migration_scopes(const char *db, scope *scopes, size_t *n, size_t max, int *cut)
{
    sqlite3 *h = NULL;
    sqlite3_stmt *st = NULL;
    int r = sqlite3_open_v2(db, &h, SQLITE_OPEN_READONLY, NULL);
    if (r == SQLITE_OK) {
        sqlite3_busy_timeout(h, 30000);
        r = sqlite3_prepare_v2(h, "SELECT DISTINCT tbl, col FROM keyshift_migration", -1, &st,
                               NULL);
        if (r != SQLITE_OK && sqlite3_prepare_v2(h, "SELECT 1 FROM sqlite_master WHERE name = "
                                                    "'keyshift_migration'", -1, &st, NULL) ==
                                  SQLITE_OK && sqlite3_step(st) == SQLITE_DONE) {
            r = SQLITE_DONE; /* no migration has run */
        } else if (r == SQLITE_OK) {
            while ((r = sqlite3_step(st)) == SQLITE_ROW) {
                const char *t = (const char *)sqlite3_column_text(st, 0);
                const char *c = (const char *)sqlite3_column_text(st, 1);
                if (t != NULL && c != NULL) {
                    add_scope(scopes, n, max, t, c, KS_ENCODING_BINARY, 0, cut);
                }
            }
        }
    }
    if (r != SQLITE_DONE) {
        ks_cli_error("cannot read the migrations of %s: %s", db, sqlite3_errstr(r));
    }
    sqlite3_finalize(st);
    sqlite3_close(h);
    return r == SQLITE_DONE ? EX_OK : r == SQLITE_BUSY ? EX_TEMPFAIL : EX_IOERR;
}

/* Where pg_scope_one adds the migrated columns of a PostgreSQL database. */
typedef struct pg_scopes {
    scope *scopes;
    size_t *n, max;
    int *cut;
    int unseen;         /* a migrated table the census would not open: rows not counted */
    const char *label;  /* the database in messages */
    const char *db;     /* its connection string (never printed) */
} pg_scopes;

/*
 * How migrated PostgreSQL column table.column holds envelopes, which its
 * migration's checkpoints do not record: its type says, as the store's
 * open checks it (bytea: binary envelopes; text or varchar: base64
 * text).  The store is opened read-only in binary, then, if it refuses
 * the column's type (KS_ERR_NO_TARGET), in base64.  When neither opens,
 * binary: the census then says what is wrong, and the destroy is refused.
 */
static ks_value_encoding pg_column_encoding(const char *db, const char *table, const char *column)
{
    static const ks_value_encoding order[2] = {KS_ENCODING_BINARY, KS_ENCODING_BASE64};
    for (size_t i = 0; i < 2; i++) {
        const ks_rowstore_target t = {.table = table, .column = column, .encoding = order[i]};
        const ks_pg_options o = {30000, 0, 1};
        ks_rowstore st;
        char msg[256];
        ks_err e = ks_rowstore_pg_open(db, &t, &o, &st, msg, sizeof msg);
        if (e == KS_OK) {
            ks_rowstore_close(&st);
            return order[i];
        }
        if (e != KS_ERR_NO_TARGET) {
            break;
        }
    }
    return KS_ENCODING_BINARY;
}

/* Add one migrated column (a ks_migrated_column_fn) to the scopes; one
 * whose table the connection's search_path does not show (the table of
 * that name the census would open is another schema's, or there is
 * none) cannot be counted: say so and mark the rows as not all counted. */
static int pg_scope_one(void *arg, ks_bytes schema, ks_bytes table, ks_bytes column, int visible)
{
    pg_scopes *p = arg;
    char t[KS_ROLLOUT_IDENT_MAX + 1], c[KS_ROLLOUT_IDENT_MAX + 1];
    if (table.len >= sizeof t || column.len >= sizeof c) {
        *p->cut = 1;
        return 0;
    }
    memcpy(t, table.ptr, table.len);
    t[table.len] = '\0';
    memcpy(c, column.ptr, column.len);
    c[column.len] = '\0';
    if (!visible) {
        fprintf(stderr, "    %s: %s.%s of schema %.*s was migrated, but the search_path of the "
                        "connection does not show that table: its rows were not counted\n",
                p->label, t, c, schema.len > 255 ? 255 : (int)schema.len,
                (const char *)schema.ptr);
        p->unseen = 1;
        return 0;
    }
    add_scope(p->scopes, p->n, p->max, t, c, pg_column_encoding(p->db, t, c), 1, p->cut);
    return 0;
}

/* Add the columns of every keyshift_migration of PostgreSQL database db
 * (one per schema of a migrated table; ks_rowstore_pg_migrated_columns);
 * *unseen when a migrated table cannot be counted on this connection. */
static int pg_migration_scopes(const char *db, const char *label, scope *scopes, size_t *n,
                               size_t max, int *cut, int *unseen)
{
    pg_scopes p = {scopes, n, max, cut, 0, label, db};
    char msg[256] = "";
    ks_err e = ks_rowstore_pg_migrated_columns(db, pg_scope_one, &p, msg, sizeof msg);
    if (e != KS_OK) {
        ks_cli_error("cannot read the migrations of %s: %s%s", label, msg[0] ? msg : ks_err_name(e),
                     e == KS_ERR_UNAVAILABLE ? " (run the same command again once the server "
                                               "is reachable)" : "");
        return ks_cli_exit_code(e);
    }
    *unseen = p.unseen;
    return EX_OK;
}

/* Add the columns that past migrations of db ran on: from its
 * keyshift_migration (SQLite) or from the keyshift_migration of each
 * schema (PostgreSQL). */
static int migration_scopes(const char *db, const char *label, scope *scopes, size_t *n,
                            size_t max, int *cut, int *unseen)
{
    *unseen = 0;
    return ks_cli_db_is_pg(db) ? pg_migration_scopes(db, label, scopes, n, max, cut, unseen)
                               : sqlite_migration_scopes(db, scopes, n, max, cut);
}

/* The rows of scope s of database db under (key_id, version) into *rows:
 * counted in the scope's encoding and, with both (SQLite, where a column
 * of no declared type may hold either form whatever a migration used),
 * in the other encoding too.  A value is an envelope in at most one of
 * them ("KSE" bytes or "S1NF" text), so the sum counts each reference
 * once and misses none.  EX_OK, or the census's exit code. */
static int scope_key_rows(const char *db, const scope *s, int both, const char *key_id,
                          uint32_t version, uint64_t *rows)
{
    *rows = 0;
    for (int pass = 0; pass < (both ? 2 : 1); pass++) {
        ks_value_encoding enc = s->encoding;
        if (pass == 1) {
            enc = enc == KS_ENCODING_BINARY ? KS_ENCODING_BASE64 : KS_ENCODING_BINARY;
        }
        ks_census c;
        int rc = ks_cli_census(db, s->table, s->column, enc, &c);
        if (rc != EX_OK) {
            return rc;
        }
        *rows += ks_cli_census_key_rows(&c, key_id, version);
        ks_census_free(&c);
    }
    return EX_OK;
}

/* Nonzero when class c is (key_id, version); any version when version 0. */
static int class_uses(const ks_rollout_class *c, const char *key_id, uint32_t version)
{
    return !c->is_plaintext && strcmp(c->key_id, key_id) == 0 &&
           (version == 0 || c->key_version == version);
}

/*
 * The references to (key_id, version) in database db: rows in the
 * scopes of rollouts using the key and of migrations, live readers
 * holding it (live: within the longest reader TTL of its rollouts, 60 s
 * without), and rollouts not finalized whose source or target it is.
 * Prints each (naming the database label) and adds them to f's counts.
 * The ids of rollouts whose source or target is that version go to
 * affected[0, *n_affected).
 */
static int find_refs(const char *db, const char *label, const char *key_id, uint32_t version,
                     ks_rollout_destroy_facts *f, int64_t *affected, size_t *n_affected)
{
    ks_rollout_db *rdb;
    int rc = ks_cli_rollout_open(db, 1, &rdb);
    if (rc != EX_OK) {
        return rc;
    }
    scope scopes[64];
    size_t n_scopes = 0;
    int cut = 0, unseen = 0, exact = ks_cli_db_is_pg(db);
    uint32_t ttl = 60;
    int64_t after = 0;
    ks_rollout rs[8];
    size_t n = 8;
    ks_err e = KS_OK;
    while (e == KS_OK && n == 8) {
        e = ks_rollout_db_list(rdb, after, rs, 8, &n);
        for (size_t i = 0; e == KS_OK && i < n; i++) {
            const ks_rollout *r = &rs[i];
            after = r->id;
            ttl = r->reader_ttl_s > ttl ? r->reader_ttl_s : ttl;
            if (class_uses(&r->source, key_id, 0) || class_uses(&r->target, key_id, 0)) {
                /* a key-scoped rollout references the rows of each column it lists */
                for (size_t c = 0; r->scope == KS_SCOPE_KEY && c < r->n_columns; c++) {
                    add_scope(scopes, &n_scopes, 64, r->columns[c].table, r->columns[c].column,
                              r->encoding, exact, &cut);
                }
                if (r->scope == KS_SCOPE_COLUMN) {
                    add_scope(scopes, &n_scopes, 64, r->table, r->column, r->encoding, exact,
                              &cut);
                }
            }
            int uses = class_uses(&r->source, key_id, version) ||
                       class_uses(&r->target, key_id, version);
            if (uses && *n_affected < 64) {
                affected[(*n_affected)++] = r->id;
            }
            if (uses && r->phase != KS_PHASE_FINALIZED) {
                char what[KS_ROLLOUT_SCOPE_TEXT_MAX];
                fprintf(stderr, "    %s: rollout %" PRId64 " of %s (%s) moves it\n", label, r->id,
                        ks_rollout_scope_text(r, what, sizeof what),
                        ks_rollout_phase_name((int)r->phase));
                f->open_rollouts++;
            }
        }
    }
    ks_rollout_reader *readers = NULL;
    size_t n_readers = 0;
    if (e == KS_OK) {
        size_t cap = 64;
        readers = calloc(cap, sizeof *readers);
        e = readers == NULL ? KS_ERR_NO_MEMORY
                            : ks_rollout_db_readers_live(rdb, ttl, (int64_t)time(NULL), readers,
                                                         cap, &n_readers);
        if (e == KS_ERR_BUFFER_TOO_SMALL) { /* more than 64 live readers: count them all */
            e = KS_OK;
            n_readers = cap;
            f->live_readers += 1;
            fprintf(stderr, "    %s: more than %zu live readers (not all checked)\n", label, cap);
        }
    }
    ks_rollout_db_close(rdb);
    if (e != KS_OK) {
        free(readers);
        ks_cli_error("cannot read the rollouts of %s: %s", label, ks_err_name(e));
        return ks_cli_exit_code(e);
    }
    for (size_t i = 0; i < n_readers; i++) {
        if (ks_rollout_keys_holds(readers[i].keys, key_id, version)) {
            fprintf(stderr, "    %s: live reader %s holds it\n", label, readers[i].instance_id);
            f->live_readers++;
        }
    }
    free(readers);
    rc = migration_scopes(db, label, scopes, &n_scopes, 64, &cut, &unseen);
    if (rc == EX_OK && cut) {
        fprintf(stderr, "    %s: more than %d columns to count: the rows were not all counted\n",
                label, 64);
    }
    if (rc == EX_OK && (cut || unseen)) {
        f->rows_known = 0;
    }
    for (size_t i = 0; rc == EX_OK && i < n_scopes; i++) {
        uint64_t rows = 0;
        if ((rc = scope_key_rows(db, &scopes[i], !exact, key_id, version, &rows)) != EX_OK) {
            break;
        }
        if (rows > 0) {
            fprintf(stderr, "    %s: %" PRIu64 " %s of %s.%s\n", label, rows, rows == 1 ? "row" : "rows",
                    scopes[i].table, scopes[i].column);
            f->rows += rows;
        }
    }
    return rc;
}

/* Log the forced destruction in each affected rollout of db (label
 * names it in messages). */
static int note_forced(const char *db, const char *label, const int64_t *ids, size_t n,
                       const char *key_id, uint32_t version, const char *reason)
{
    char actor[KS_ROLLOUT_ACTOR_MAX + 1], text[KS_ROLLOUT_REASON_MAX + 1];
    ks_rollout_db *rdb;
    int rc;
    if (n == 0) {
        return EX_OK;
    }
    if ((rc = ks_cli_actor("keys", NULL, actor, sizeof actor)) != EX_OK ||
        (rc = ks_cli_rollout_open(db, 0, &rdb)) != EX_OK) {
        return rc;
    }
    int w = snprintf(text, sizeof text, "key %s:%" PRIu32 " destroyed with --force: %s", key_id,
                     version, reason);
    if (w < 0) {
        text[0] = '\0';
    }
    for (size_t i = 0; i < n && rc == EX_OK; i++) {
        ks_err e = ks_rollout_db_note(rdb, ids[i], actor, text, (int64_t)time(NULL));
        if (e != KS_OK) {
            ks_cli_error("cannot log the forced destruction in rollout %" PRId64 " of %s: %s",
                         ids[i], label, ks_err_name(e));
            rc = ks_cli_exit_code(e);
        }
    }
    ks_rollout_db_close(rdb);
    return rc;
}

/* How messages name database i of d: a SQLite file by its path, a
 * PostgreSQL database by its place among the --db options (written into
 * buf), never by its connection string (which may say more than where
 * the database is). */
static const char *db_label(const destroy_opts *d, int i, char *buf, size_t cap)
{
    if (!ks_cli_db_is_pg(d->dbs[i])) {
        return d->dbs[i];
    }
    snprintf(buf, cap, "PostgreSQL database (--db %d)", i + 1);
    return buf;
}

/*
 * Before set-state destroyed: count what still references (key_id,
 * version) in each database of d (rows in the columns of its rollouts and
 * migrations, live readers holding it, rollouts not finalized that move
 * it), then let the library's rule decide (ks_rollout_destroy_guard): a
 * reference refuses (EX_TEMPFAIL), so does a database that could not be
 * checked, and so does having no --db at all (EX_USAGE: nothing was
 * checked), unless --force --reason.  Fills affected rollouts per
 * database for note_forced.
 */
static int destroy_guard(const destroy_opts *d, const char *key_id, uint32_t version,
                         int64_t affected[][64], size_t *n_affected)
{
    ks_rollout_destroy_facts f;
    memset(&f, 0, sizeof f);
    f.key_id = key_id;
    f.key_version = version;
    f.force = d->force;
    f.reason = d->reason;
    f.rows_known = f.readers_known = d->n_dbs > 0;
    int failed = EX_OK;
    for (int i = 0; i < d->n_dbs; i++) {
        n_affected[i] = 0;
        char buf[48];
        const char *label = db_label(d, i, buf, sizeof buf);
        int rc = find_refs(d->dbs[i], label, key_id, version, &f, affected[i], &n_affected[i]);
        if (rc != EX_OK) {
            failed = rc;
            f.rows_known = f.readers_known = 0;
        }
    }
    char why[512];
    ks_err e = ks_rollout_destroy_guard(&f, why, sizeof why);
    if (e == KS_OK) {
        if (d->force && why[0] != '\0') {
            fprintf(stderr, KS_PROG ": warning: %s\n", why);
        }
        return EX_OK;
    }
    if (e != KS_ERR_GUARD) {
        return ks_cli_usage_error("keys", "%s", why[0] != '\0' ? why : ks_err_name(e));
    }
    if (d->n_dbs == 0) {
        return ks_cli_usage_error("keys", "%s:%" PRIu32 " was not destroyed, because without "
                                          "--db nothing that references it can be checked; give "
                                          "--db DB for each database that may hold its rows or "
                                          "readers, or --force --reason TEXT", key_id, version);
    }
    if (failed != EX_OK) {
        return failed; /* the database's error was said */
    }
    ks_cli_error("%s, so %s:%" PRIu32 " was not destroyed: once destroyed, those rows could "
                 "never be read again. Move the rows ('keyshift migrate run', 'keyshift "
                 "rollout') and retire the readers, then retry, or give --force --reason TEXT",
                 why, key_id, version);
    return EX_TEMPFAIL;
}

/* Run one change on an open keyring; pos[0] is the action. */
static int change(const ks_provider *p, const char **pos, int npos, const destroy_opts *d)
{
    const ks_provider_admin_ops *a = p->ops->admin;
    const char *act = pos[0];
    ks_bytes id = {(const uint8_t *)pos[1], strlen(pos[1])};
    uint32_t version = 0;
    ks_err e;

    if (strcmp(act, "create") == 0) {
        if ((e = a->create(p->self, id, 0)) != KS_OK) {
            return change_failed("create key", pos[1], e);
        }
        fprintf(stderr, KS_PROG ": created %s version 1 (active, primary)\n", pos[1]);
        return EX_OK;
    }
    if (strcmp(act, "add-version") == 0) {
        if ((e = a->add_version(p->self, id, &version, 0)) != KS_OK) {
            return change_failed("add a version to", pos[1], e);
        }
        printf("%u\n", version);
        fprintf(stderr, KS_PROG ": added %s version %u (active, not primary: promote it once "
                        "every reader has it)\n", pos[1], version);
        return EX_OK;
    }
    if (npos < 3 || parse_version(pos[2], &version) != 0) {
        return ks_cli_usage_error("keys", "%s needs KEY_ID VERSION (a number from 1)", act);
    }
    if (strcmp(act, "promote") == 0) {
        if ((e = a->promote(p->self, id, version, 0)) != KS_OK) {
            return change_failed("promote", pos[1], e);
        }
        fprintf(stderr, KS_PROG ": %s version %u is now primary\n", pos[1], version);
        return EX_OK;
    }
    int state = npos == 4 ? ks_key_state_from_name(pos[3]) : 0;
    if (state == 0) {
        return ks_cli_usage_error("keys", "set-state needs KEY_ID VERSION STATE "
                                          "(active, decrypt-only, disabled or destroyed)");
    }
    int64_t affected[16][64];
    size_t n_affected[16] = {0};
    int rc;
    if (state == KS_KEY_DESTROYED &&
        (rc = destroy_guard(d, pos[1], version, affected, n_affected)) != EX_OK) {
        return rc;
    }
    if ((e = a->set_state(p->self, id, version, (ks_key_state)state, 0)) != KS_OK) {
        return change_failed("change the state of", pos[1], e);
    }
    fprintf(stderr, KS_PROG ": %s version %u is now %s\n", pos[1], version, pos[3]);
    rc = EX_OK;
    for (int i = 0; d->force && i < d->n_dbs; i++) {
        char buf[48];
        int r = note_forced(d->dbs[i], db_label(d, i, buf, sizeof buf), affected[i],
                            n_affected[i], pos[1], version, d->reason);
        rc = rc == EX_OK ? r : rc;
    }
    return rc;
}

/* Expected positional counts per action: {name, min, max} (action included). */
static int arity_ok(const char *act, int npos)
{
    static const struct { const char *name; int min, max; } acts[] = {
        {"init", 1, 1}, {"list", 1, 1}, {"create", 2, 2}, {"add-version", 2, 2},
        {"promote", 3, 3}, {"set-state", 4, 4},
    };
    for (size_t i = 0; i < sizeof acts / sizeof acts[0]; i++) {
        if (strcmp(act, acts[i].name) == 0) {
            return npos >= acts[i].min && npos <= acts[i].max;
        }
    }
    return -1;
}

/* See cli.h. */
int ks_cmd_keys(int argc, char **argv)
{
    const char *keyring = NULL, *passfile = NULL, *pos[4], *db = NULL, *providers = NULL;
    int json = 0, npos = 0;
    destroy_opts d;
    memset(&d, 0, sizeof d);
    const ks_cli_opt opts[] = {
        {"--keyring", &keyring, NULL},
        {"--passphrase-file", &passfile, NULL},
        {"--providers", &providers, NULL},
        {"--json", NULL, &json},
        {"--db", &db, NULL},
        {"--force", NULL, &d.force},
        {"--reason", &d.reason, NULL},
        {NULL, NULL, NULL},
    };
    int rc;
    if (ks_cli_parse_opts("keys", usage, argc, argv, opts, pos, 4, &npos, &rc)) {
        return rc;
    }
    if ((rc = collect_dbs(argc, argv, &d)) != EX_OK) {
        return rc;
    }
    int destroying = npos == 4 && strcmp(pos[0], "set-state") == 0 &&
                     strcmp(pos[3], "destroyed") == 0;
    if ((db != NULL || d.force || d.reason != NULL) && !destroying) {
        return ks_cli_usage_error("keys", "--db, --force and --reason apply only to "
                                          "set-state KEY_ID VERSION destroyed");
    }
    if (d.force && (d.reason == NULL || d.reason[0] == '\0')) {
        return ks_cli_usage_error("keys", "--force needs --reason TEXT (it is logged)");
    }
    if (d.reason != NULL && !ks_cli_printable(d.reason, 1, KS_ROLLOUT_REASON_MAX - 300)) {
        return ks_cli_usage_error("keys", "--reason must be 1..%d printable ASCII characters",
                                  KS_ROLLOUT_REASON_MAX - 300);
    }
    if (d.reason != NULL && !d.force) {
        return ks_cli_usage_error("keys", "--reason was given without --force; it only "
                                          "explains a forced destroy");
    }
    if (npos == 0) {
        return ks_cli_usage_error("keys", "missing action (init, create, add-version, promote, "
                                          "set-state, list)");
    }
    int ar = arity_ok(pos[0], npos);
    if (ar < 0) {
        return ks_cli_usage_error("keys", "unknown action '%s'", pos[0]);
    }
    if (ar == 0) {
        return ks_cli_usage_error("keys", "wrong number of arguments for '%s'", pos[0]);
    }
    if (strcmp(pos[0], "init") == 0) {
        if (providers != NULL) {
            return ks_cli_usage_error("keys", "init makes a keyring file: give --keyring FILE, "
                                              "not --providers");
        }
        return init_keyring(keyring, passfile);
    }
    ks_cli_keys keys;
    if ((rc = ks_cli_keys_open_lazy("keys", keyring, passfile, providers, &keys)) != EX_OK) {
        return rc;
    }
    if (keys.prov.ops->admin == NULL) {
        ks_cli_error("%s cannot manage keys", keys.source);
        rc = EX_UNAVAILABLE;
    } else {
        rc = strcmp(pos[0], "list") == 0 ? list_keys(&keys.prov, keys.reg, json)
             : (rc = refuse_plugin_change(&keys, pos[0], pos[1])) != EX_OK ? rc
                                                                         : change(&keys.prov, pos, npos, &d);
    }
    if (rc != EX_OK) {
        /* [P-LOAD-5] the provider the change needed did not open: say
         * which and why, with the exit code its load would have given */
        const int open_rc = ks_cli_keys_open_failed(&keys);
        rc = open_rc != EX_OK ? open_rc : rc;
    }
    ks_cli_keys_close(&keys);
    return rc;
}
