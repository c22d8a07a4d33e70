/*
 * tools/cmd_keys.c -- `keyshift keys`: manage the local keyring.
 *
 * Every change goes through the keyring API, which locks, re-reads and
 * atomically replaces the file; nothing here prints key material.
 */
#define _POSIX_C_SOURCE 200809L

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"

/* Print the subcommand's manual to f. */
static void usage(FILE *f)
{
    fputs("NAME\n"
          "    keyshift keys - manage the local keyring of key-encryption keys\n"
          "\n"
          "SYNOPSIS\n"
          "    keyshift keys init\n"
          "    keyshift keys create KEY_ID\n"
          "    keyshift keys add-version KEY_ID\n"
          "    keyshift keys promote KEY_ID VERSION\n"
          "    keyshift keys set-state KEY_ID VERSION STATE\n"
          "    keyshift keys list [--json]\n"
          "    (each also takes --keyring FILE and --passphrase-file FILE)\n"
          "\n"
          "DESCRIPTION\n"
          "    A keyring file holds key-encryption keys (KEKs) by KEY_ID, each with\n"
          "    numbered versions and one primary version, which wraps the data keys\n"
          "    of new envelopes. The format is specified in docs/keyring.md.\n"
          "\n"
          "    init         create an empty keyring (mode 0600); sealed with the\n"
          "                 passphrase when one is given\n"
          "    create       add KEY_ID with version 1, active and primary\n"
          "    add-version  add the next version, active but NOT primary; prints it.\n"
          "                 Distribute the keyring to every reader before promoting\n"
          "    promote      make an active VERSION the primary for new writes\n"
          "    set-state    STATE is active, decrypt-only, disabled or destroyed.\n"
          "                 decrypt-only: opens, no new wraps; disabled: neither,\n"
          "                 reversible; destroyed: the material is wiped, FOR GOOD.\n"
          "                 The primary must stay active: promote another first\n"
          "    list         keys, versions, states and creation times; no material\n"
          "\n"
          "OPTIONS\n"
          "    --keyring FILE          the keyring (default: $KEYSHIFT_KEYRING)\n"
          "    --passphrase-file FILE  read the keyring passphrase from FILE (default:\n"
          "                            $KEYSHIFT_PASSPHRASE; never on the command line)\n"
          "    --json                  list: one JSON object\n"
          "    -h, --help              print this manual\n"
          "\n"
          "    The keyring must not be readable or writable by group or others;\n"
          "    it is refused otherwise, as ssh refuses such keys. Changes are\n"
          "    locked against concurrent writers and atomic: a crash leaves the old\n"
          "    or the new keyring.\n"
          "\n"
          "EXIT STATUS\n"
          "    0 success; 64 usage; 65 refused (key exists, forbidden state change);\n"
          "    77 no such key or version; 78 insecure, unreadable or corrupt keyring,\n"
          "    or wrong passphrase; 71 system error.\n"
          "\n"
          "EXAMPLES\n"
          "    export KEYSHIFT_KEYRING=$HOME/.keyshift/keyring\n"
          "    keyshift keys init && keyshift keys create payments/kek\n"
          "    keyshift keys add-version payments/kek      # prints 2\n"
          "    keyshift keys promote payments/kek 2\n"
          "    keyshift keys set-state payments/kek 1 decrypt-only\n",
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

/* Format a Unix time as RFC 3339 UTC. */
static void format_time(uint64_t t, char *out, size_t cap)
{
    time_t tt = (time_t)t;
    struct tm tm;
    if (gmtime_r(&tt, &tm) == NULL || strftime(out, cap, "%Y-%m-%dT%H:%M:%SZ", &tm) == 0) {
        snprintf(out, cap, "%llu", (unsigned long long)t);
    }
}

/* `keys list`: a table, or one JSON object with --json. */
static int list_keys(const ks_keyring *kr, int json)
{
    size_t n = ks_keyring_count(kr);
    if (json) {
        printf("{\"keys\":[");
    } else {
        printf("%-32s %-8s %-13s %-8s %s\n", "KEY_ID", "VERSION", "STATE", "PRIMARY", "CREATED");
    }
    for (size_t i = 0; i < n; i++) {
        ks_keyring_key k;
        if (ks_keyring_key_at(kr, i, &k) != KS_OK) {
            return EX_SOFTWARE;
        }
        if (json) {
            printf("%s{\"key_id\":", i ? "," : "");
            ks_cli_put_json_string(stdout, k.key_id.ptr, k.key_id.len);
            printf(",\"primary\":%u,\"versions\":[", k.primary);
        }
        for (uint32_t v = 1; v <= k.versions; v++) {
            ks_keyring_version kv;
            char when[32];
            if (ks_keyring_version_at(kr, i, v, &kv) != KS_OK) {
                return EX_SOFTWARE;
            }
            format_time(kv.created, when, sizeof when);
            if (json) {
                printf("%s{\"version\":%u,\"state\":\"%s\",\"primary\":%s,\"created\":\"%s\"}",
                       v > 1 ? "," : "", kv.version, ks_key_state_name(kv.state),
                       kv.version == k.primary ? "true" : "false", when);
            } else {
                printf("%-32.*s %-8u %-13s %-8s %s\n", (int)k.key_id.len, (const char *)k.key_id.ptr,
                       kv.version, ks_key_state_name(kv.state), kv.version == k.primary ? "*" : "",
                       when);
            }
        }
        if (json) {
            printf("]}");
        }
    }
    if (json) {
        printf("]}\n");
    }
    return EX_OK;
}

/* `keys init`: a new keyring, sealed when a passphrase is given. */
static int init_keyring(const char *path, const char *passfile)
{
    ks_bytes pass;
    int rc = ks_cli_keyring_args(&path, passfile, &pass);
    if (rc != EX_OK) {
        return rc;
    }
    ks_err e = ks_keyring_init(path, pass);
    ks_cli_passphrase_free(&pass);
    if (e == KS_ERR_EXISTS) {
        ks_cli_error("cannot create keyring %s: a file is already there", path);
        return EX_CANTCREAT;
    }
    if (e != KS_OK) {
        ks_cli_error("cannot create keyring %s: %s", path, ks_err_name(e));
        return e == KS_ERR_IO ? EX_CANTCREAT : ks_cli_exit_code(e);
    }
    fprintf(stderr, KS_PROG ": created keyring %s\n", path);
    return EX_OK;
}

/* Run one change on an open keyring; pos[0] is the action. */
static int change(ks_keyring *kr, const char **pos, int npos)
{
    const char *act = pos[0];
    ks_bytes id = {(const uint8_t *)pos[1], strlen(pos[1])};
    uint32_t version = 0;
    ks_err e;

    if (strcmp(act, "create") == 0) {
        if ((e = ks_keyring_create(kr, id)) != KS_OK) {
            return change_failed("create key", pos[1], e);
        }
        fprintf(stderr, KS_PROG ": created %s version 1 (active, primary)\n", pos[1]);
        return EX_OK;
    }
    if (strcmp(act, "add-version") == 0) {
        if ((e = ks_keyring_add_version(kr, id, &version)) != KS_OK) {
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
        if ((e = ks_keyring_promote(kr, id, version)) != KS_OK) {
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
    if ((e = ks_keyring_set_state(kr, id, version, (ks_key_state)state)) != KS_OK) {
        return change_failed("change the state of", pos[1], e);
    }
    fprintf(stderr, KS_PROG ": %s version %u is now %s\n", pos[1], version, pos[3]);
    return EX_OK;
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
    const char *keyring = NULL, *passfile = NULL, *pos[4];
    int json = 0, npos = 0;
    const ks_cli_opt opts[] = {
        {"--keyring", &keyring, NULL},
        {"--passphrase-file", &passfile, NULL},
        {"--json", NULL, &json},
        {NULL, NULL, NULL},
    };
    int rc;
    if (ks_cli_parse_opts("keys", usage, argc, argv, opts, pos, 4, &npos, &rc)) {
        return rc;
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
        return init_keyring(keyring, passfile);
    }
    ks_keyring *kr;
    if ((rc = ks_cli_keyring_open(keyring, passfile, &kr)) != EX_OK) {
        return rc;
    }
    rc = strcmp(pos[0], "list") == 0 ? list_keys(kr, json) : change(kr, pos, npos);
    ks_keyring_close(kr);
    return rc;
}
