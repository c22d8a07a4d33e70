/*
 * tools/cli/cmd_providers.c -- `keyshift providers`: what a provider registry
 * (docs/providers.md) names, and whether each of its providers can be
 * reached.
 *
 *   list   the providers, their settings (never a secret: the file holds
 *          none) and the key_ids each serves; reads the file only.
 *   check  opens every provider, as any command would, and reports each
 *          one's reachability, its mechanisms and its keys, and for a KMS
 *          plugin the name its hello gave.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

/* Print the manual to f. */
static void usage(FILE *f)
{
    fputs("NAME\n"
          "    keyshift providers - inspect and check a provider registry\n"
          "\n"
          "SYNOPSIS\n"
          "    keyshift providers list [--providers FILE] [--json]\n"
          "    keyshift providers check [--providers FILE] [--json]\n"
          "\n"
          "DESCRIPTION\n"
          "    A provider registry (docs/providers.md) names the key providers a\n"
          "    process uses -- local keyring files, PKCS#11 tokens (HSMs), KMS\n"
          "    plugins (docs/kms-plugin.md) -- and the key_ids each one serves. Every\n"
          "    command that uses keys takes it with --providers FILE or\n"
          "    $KEYSHIFT_PROVIDERS.\n"
          "\n"
          "    list   prints each provider, its settings and what it serves (a\n"
          "           plugin's arg lines, then its env and env-prefix lines, in file\n"
          "           order; in --json the arrays \"args\", \"env\" and \"env_prefixes\").\n"
          "           A plugin receives of keyshift's environment only PATH, HOME, LANG,\n"
          "           LC_*, TZ, TMPDIR and what its env and env-prefix lines pass, never\n"
          "           a variable a pin-env or passphrase-env names nor\n"
          "           KEYSHIFT_PASSPHRASE (docs/kms-plugin.md [KP-SEC-1]). It reads the\n"
          "           file only: no provider is opened, no plugin started, no secret\n"
          "           read.\n"
          "    check  opens the providers in file order, exactly as a command would\n"
          "           (reading each passphrase or PIN its file or variable names),\n"
          "           and prints for each: ok, failed (with why), or not checked\n"
          "           (after a failure); for a PKCS#11 token the mechanisms keyshift\n"
          "           needs (CKM_AES_GCM, CKM_AES_KEY_GEN), checked when it opens;\n"
          "           for a KMS plugin, which is started and greeted, the name its\n"
          "           hello gave (a plugin cannot list its keys); for the others the\n"
          "           keys each provider holds that the registry routes to it. A\n"
          "           plugin that does not open is reported with the stage it failed\n"
          "           at, why, its message and its (redacted) stderr.\n"
          "\n"
          "OPTIONS\n"
          "    --providers FILE  the registry (default: $KEYSHIFT_PROVIDERS)\n"
          "    --json            one JSON object\n"
          "    -h, --help        print this manual\n"
          "\n"
          "EXIT STATUS\n"
          "    0 listed, or every provider ok; 64 usage (no registry named);\n"
          "    69 a provider unreachable (a plugin that would not start or died);\n"
          "    75 a provider timed out; 77 a provider refused its keys; 78 the file\n"
          "    insecure, unreadable or invalid, a passphrase or PIN unreadable, a\n"
          "    wrong or locked PIN, or a plugin's command not found or its hello\n"
          "    refused.\n"
          "\n"
          "EXAMPLES\n"
          "    keyshift providers list --providers /etc/keyshift/providers\n"
          "    KEYSHIFT_PROVIDERS=/etc/keyshift/providers keyshift providers check --json\n",
          f);
}

/* Whether a setting key repeats in a plugin provider (arg, env,
 * env-prefix): --json lists those in arrays of their own. */
static int repeated_key(const char *key)
{
    return strcmp(key, "arg") == 0 || strcmp(key, "env") == 0 || strcmp(key, "env-prefix") == 0;
}

/* Print the JSON array `"name":[...]` of the values of provider i's
 * settings whose key is key, in file order. */
static void put_json_values(const ks_registry *r, size_t i, const char *name, const char *key)
{
    ks_registry_setting st;
    int first = 1;
    printf(",\"%s\":[", name);
    for (size_t j = 0; ks_registry_setting_at(r, i, j, &st) == KS_OK; j++) {
        if (strcmp(st.key, key) == 0) {
            printf("%s", first ? "" : ",");
            ks_cli_put_json_string(stdout, (const uint8_t *)st.value, strlen(st.value));
            first = 0;
        }
    }
    printf("]");
}

/* Print provider i of r as text, or as a JSON object (with a leading
 * comma after the first). */
static void put_provider(const ks_registry *r, size_t i, int json)
{
    ks_registry_info info;
    if (ks_registry_info_at(r, i, &info) != KS_OK) {
        return;
    }
    if (!json) {
        printf("%s (%s)\n", info.name, info.type);
    } else {
        printf("%s{\"name\":", i ? "," : "");
        ks_cli_put_json_string(stdout, (const uint8_t *)info.name, strlen(info.name));
        printf(",\"type\":\"%s\",\"settings\":{", info.type);
    }
    ks_registry_setting st;
    for (size_t j = 0; ks_registry_setting_at(r, i, j, &st) == KS_OK; j++) {
        if (!json) {
            printf("    %-16s %s\n", st.key, st.value);
        } else if (!repeated_key(st.key)) { /* repeated ones: in arrays below */
            printf("%s\"%s\":", j ? "," : "", st.key);
            ks_cli_put_json_string(stdout, (const uint8_t *)st.value, strlen(st.value));
        }
    }
    if (json && strcmp(info.type, "plugin") == 0) {
        printf("}");
        put_json_values(r, i, "args", "arg");
        put_json_values(r, i, "env", "env");
        put_json_values(r, i, "env_prefixes", "env-prefix");
        printf(",\"serves\":[");
    } else if (json) {
        printf("},\"serves\":[");
    }
    ks_registry_serve sv;
    for (size_t j = 0; ks_registry_serve_at(r, i, j, &sv) == KS_OK; j++) {
        if (!json) {
            printf("    %-16s %s\n", sv.prefix ? "serve-prefix" : "serve", sv.pattern);
            continue;
        }
        printf("%s{\"%s\":", j ? "," : "", sv.prefix ? "prefix" : "key_id");
        ks_cli_put_json_string(stdout, (const uint8_t *)sv.pattern, strlen(sv.pattern));
        printf("}");
    }
    if (json) {
        printf("]}");
    }
}

/* The registry path: providers, else $KEYSHIFT_PROVIDERS; NULL after a
 * usage error when neither is set. */
static const char *registry_path(const char *providers)
{
    if (providers == NULL) {
        const char *env = getenv("KEYSHIFT_PROVIDERS");
        providers = env != NULL && *env != '\0' ? env : NULL;
    }
    return providers;
}

/* `providers list`. */
static int do_list(const char *path, int json)
{
    ks_registry *r = NULL;
    ks_registry_error err;
    ks_err e = ks_registry_read(path, &r, &err);
    if (e != KS_OK) {
        return ks_cli_registry_failed(path, e, &err);
    }
    if (json) {
        printf("{\"providers\":[");
    }
    for (size_t i = 0, n = ks_registry_count(r); i < n; i++) {
        put_provider(r, i, json);
    }
    if (json) {
        printf("]}\n");
    }
    ks_registry_close(r);
    return EX_OK;
}

/* Keys counted per provider index by check's listing. */
typedef struct key_counts {
    const ks_registry *r;
    size_t *keys;            /* per provider: distinct key_ids */
    size_t *versions;        /* per provider: versions */
    uint8_t last[KS_KEY_ID_MAX];
    size_t last_len;
} key_counts;

/* Count one listed version against the provider that serves its key. */
static int count_key(void *arg, const ks_key_entry *e)
{
    key_counts *c = arg;
    size_t i;
    if (ks_registry_route(c->r, e->key_id, &i) != KS_OK) {
        return 0;
    }
    c->versions[i]++;
    if (e->key_id.len != c->last_len || memcmp(e->key_id.ptr, c->last, c->last_len) != 0) {
        c->keys[i]++;
        c->last_len = e->key_id.len <= sizeof c->last ? e->key_id.len : sizeof c->last;
        memcpy(c->last, e->key_id.ptr, c->last_len);
    }
    return 0;
}

/* Print check's line (or JSON object) for provider i: status "ok",
 * "failed" (with why) or "not checked".  opened is the loaded registry
 * (NULL when it did not load).  An open plugin shows its hello's plugin
 * string instead of key counts: it cannot list its keys ([P-ROUTE-4]). */
static void put_check(const ks_registry *listed, const ks_registry *opened, size_t i,
                      const char *status, const char *why, size_t keys, size_t versions, int json)
{
    ks_registry_info info;
    ks_plugin_stats stats;
    if (ks_registry_info_at(listed, i, &info) != KS_OK) {
        return;
    }
    const int p11 = strcmp(info.type, "pkcs11") == 0, ok = strcmp(status, "ok") == 0;
    const int hello = ok && ks_registry_plugin_stats(opened, i, &stats) == KS_OK;
    if (!json) {
        printf("%-24s %-8s %-12s", info.name, info.type, status);
        if (hello) {
            printf(" plugin %s", stats.plugin);
        } else if (ok) {
            printf(" keys %zu, versions %zu%s", keys, versions,
                   p11 ? ", mechanisms CKM_AES_GCM CKM_AES_KEY_GEN" : "");
        } else if (why != NULL) {
            printf(" %s", why);
        }
        printf("\n");
        return;
    }
    printf("%s{\"name\":", i ? "," : "");
    ks_cli_put_json_string(stdout, (const uint8_t *)info.name, strlen(info.name));
    printf(",\"type\":\"%s\",\"status\":\"%s\"", info.type, status);
    if (hello) {
        printf(",\"plugin\":");
        ks_cli_put_json_string(stdout, (const uint8_t *)stats.plugin, strlen(stats.plugin));
    } else if (ok) {
        printf(",\"keys\":%zu,\"versions\":%zu,\"mechanisms\":[%s]", keys, versions,
               p11 ? "\"CKM_AES_GCM\",\"CKM_AES_KEY_GEN\"" : "");
    } else if (why != NULL) {
        printf(",\"error\":\"%s\"", why);
    }
    printf("}");
}

/* `providers check`. */
static int do_check(const char *path, int json)
{
    ks_registry *listed = NULL, *r = NULL;
    ks_registry_error err;
    ks_err e = ks_registry_read(path, &listed, &err);
    if (e != KS_OK) {
        return ks_cli_registry_failed(path, e, &err);
    }
    const size_t n = ks_registry_count(listed);
    size_t *keys = calloc(n ? n : 1, sizeof *keys), *versions = calloc(n ? n : 1, sizeof *versions);
    if (keys == NULL || versions == NULL) {
        free(keys);
        free(versions);
        ks_registry_close(listed);
        ks_cli_error("out of memory");
        return EX_OSERR;
    }
    int rc = EX_OK;
    size_t failed = n; /* the provider that failed to open, or n */
    e = ks_registry_load(path, &r, &err);
    if (e != KS_OK && err.stage == KS_REGISTRY_STAGE_PROVIDER && err.provider >= 1) {
        failed = err.provider - 1;
    } else if (e != KS_OK) {
        rc = ks_cli_registry_failed(path, e, &err);
    }
    ks_provider prov;
    if (e == KS_OK && (e = ks_registry_provider(r, &prov)) == KS_OK) {
        key_counts c = {r, keys, versions, {0}, 0};
        e = prov.ops->admin->list(prov.self, (ks_bytes){NULL, 0}, count_key, &c, 0);
        if (e != KS_OK) {
            ks_cli_error("cannot list the providers' keys: %s", ks_err_name(e));
            rc = ks_cli_exit_code(e);
        }
    }
    if (rc == EX_OK || failed < n) {
        if (json) {
            printf("{\"providers\":[");
        }
        for (size_t i = 0; i < n; i++) {
            const char *status = i < failed ? "ok" : i == failed ? "failed" : "not checked";
            put_check(listed, r, i, status, i == failed ? ks_err_name(e) : NULL, keys[i],
                      versions[i], json);
        }
        if (json) {
            printf("]}\n");
        }
    }
    if (failed < n) {
        rc = ks_cli_registry_failed(path, e, &err); /* the message says which and why */
    }
    free(keys);
    free(versions);
    ks_registry_close(r);
    ks_registry_close(listed);
    return rc;
}

/* See cli.h. */
int ks_cmd_providers(int argc, char **argv)
{
    const char *providers = NULL, *pos[1];
    int json = 0, npos = 0, rc;
    const ks_cli_opt opts[] = {
        {"--providers", &providers, NULL},
        {"--json", NULL, &json},
        {NULL, NULL, NULL},
    };
    if (ks_cli_subcommand_help(argc, argv, usage, &rc)) {
        return rc;
    }
    if (ks_cli_parse_opts("providers", usage, argc, argv, opts, pos, 1, &npos, &rc)) {
        return rc;
    }
    if (npos != 1 || (strcmp(pos[0], "list") != 0 && strcmp(pos[0], "check") != 0)) {
        return ks_cli_usage_error("providers", "give list or check");
    }
    const char *path = registry_path(providers);
    if (path == NULL) {
        return ks_cli_usage_error("providers", "no registry: give --providers FILE or set "
                                               "KEYSHIFT_PROVIDERS");
    }
    return strcmp(pos[0], "list") == 0 ? do_list(path, json) : do_check(path, json);
}
