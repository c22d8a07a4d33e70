/*
 * tools/cli/cmd_keys.c -- `keyshift keys`: manage the local keyring.
 *
 * Every change goes through the keyring API, which locks, re-reads and
 * atomically replaces the file; nothing here prints key material.  This
 * file holds the manual, the options, `keys init` and the changes;
 * cmd_keys_list.c lists the keys, and cmd_keys_guard.c refuses to destroy
 * a version that the databases named with --db still use.
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>

#include "cmd_keys.h"

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

/* Run one change on an open keyring; pos[0] is the action. */
static int change(const ks_provider *p, const char **pos, int npos, const ks_cli_destroy_opts *d)
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
        (rc = ks_cli_destroy_guard(d, pos[1], version, affected, n_affected)) != EX_OK) {
        return rc;
    }
    if ((e = a->set_state(p->self, id, version, (ks_key_state)state, 0)) != KS_OK) {
        return change_failed("change the state of", pos[1], e);
    }
    fprintf(stderr, KS_PROG ": %s version %u is now %s\n", pos[1], version, pos[3]);
    rc = EX_OK;
    for (int i = 0; d->force && i < d->n_dbs; i++) {
        char buf[48];
        int r = ks_cli_note_forced(d->dbs[i], ks_cli_db_label(d, i, buf, sizeof buf), affected[i],
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
    ks_cli_destroy_opts d;
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
    if ((rc = ks_cli_collect_dbs(argc, argv, &d)) != EX_OK) {
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
        rc = strcmp(pos[0], "list") == 0 ? ks_cli_list_keys(&keys.prov, keys.reg, json)
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
