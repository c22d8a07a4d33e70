/*
 * tools/cli/cmd_keys_list.c -- `keyshift keys list`: every version of every key
 * of a keyring or a provider registry, with its state, as text or JSON,
 * and the --key lines of the registry's plugin providers.  Nothing
 * printed is key material.
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cmd_keys.h"

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
int ks_cli_list_keys(const ks_provider *p, const ks_registry *reg, int json)
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
