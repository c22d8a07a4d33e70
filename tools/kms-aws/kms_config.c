/*
 * tools/kms-aws/kms_config.c -- where the keyshift-kms-aws plugin calls
 * and as whom: the environment, the shared credentials and config files
 * (parsed strictly, see kms.h), the endpoint URL.
 */
#define _POSIX_C_SOURCE 200809L
#include "kms.h"
#include "creds.h"
#include "sigv4.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <sodium.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define INI_MAX_FILE 65536

#define seterr kms_seterr

/* Whether s is a profile name (kms.h). */
int kms_config_profile_ok(const char *s)
{
    size_t n = strnlen(s, 65);
    if (n == 0 || n > 64) {
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.' ||
              c == '-')) {
            return 0;
        }
    }
    return 1;
}

/* Set the endpoint (kms.h). */
int kms_config_set_endpoint(kms_config *cfg, const char *url)
{
    size_t skip;
    if (strncmp(url, "https://", 8) == 0) {
        skip = 8;
    } else if (strncmp(url, "http://", 7) == 0) {
        skip = 7;
    } else {
        return -1;
    }
    const char *auth = url + skip;
    size_t alen = strcspn(auth, "/");
    const char *rest = auth + alen;
    if (alen == 0 || alen >= sizeof cfg->host || !(rest[0] == '\0' || (rest[0] == '/' && rest[1] == '\0'))) {
        return -1;
    }
    size_t i = 0;
    if (auth[0] == '[') {
        /* an IPv6 literal */
        for (i = 1; i < alen && auth[i] != ']'; i++) {
            char c = auth[i];
            if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F') || c == ':' ||
                  c == '.')) {
                return -1;
            }
        }
        if (i == alen || i == 1) {
            return -1;
        }
        i++;
    } else {
        for (; i < alen && auth[i] != ':'; i++) {
            char c = auth[i];
            if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                  c == '-')) {
                return -1;
            }
        }
        if (i == 0) {
            return -1;
        }
    }
    if (i < alen) {
        /* :port, 1..65535 */
        if (auth[i] != ':' || i + 1 == alen || alen - i - 1 > 5) {
            return -1;
        }
        long port = 0;
        for (size_t j = i + 1; j < alen; j++) {
            if (auth[j] < '0' || auth[j] > '9') {
                return -1;
            }
            port = port * 10 + (auth[j] - '0');
        }
        if (port < 1 || port > 65535) {
            return -1;
        }
    }
    if (skip + alen + 2 > sizeof cfg->endpoint) {
        return -1;
    }
    for (size_t j = 0; j < alen; j++) {
        char c = auth[j];
        cfg->host[j] = (c >= 'A' && c <= 'Z') ? (char)(c + 32) : c;
    }
    cfg->host[alen] = '\0';
    snprintf(cfg->endpoint, sizeof cfg->endpoint, "%.*s%s/", (int)skip, url, cfg->host);
    return 0;
}

/* Zero cfg (kms.h). */
void kms_config_wipe(kms_config *cfg)
{
    sodium_memzero(cfg, sizeof *cfg);
}

/* The path in variable var, else $HOME/.aws/leaf, into out (cap bytes).
 * 0 or -1. */
static int shared_path(const char *var, const char *leaf, char *out, size_t cap)
{
    const char *v = getenv(var);
    int n;
    if (v != NULL && v[0] != '\0') {
        n = snprintf(out, cap, "%s", v);
    } else {
        const char *home = getenv("HOME");
        if (home == NULL || home[0] == '\0') {
            return -1;
        }
        n = snprintf(out, cap, "%s/.aws/%s", home, leaf);
    }
    return (n < 0 || (size_t)n >= cap) ? -1 : 0;
}

/* Load one shared file's section (kms.h). */
int kms_shared_load(const char *var, const char *leaf, const char *section, kms_ini_want *want, size_t nwant,
                    int *found, char *path, size_t cap, char *err, size_t errlen)
{
    char *text = NULL;
    size_t len = 0;
    *found = 0;
    if (shared_path(var, leaf, path, cap) != 0) {
        seterr(err, errlen, "no %s and no HOME: cannot find the AWS %s file", var, leaf);
        return -1;
    }
    int r = kms_read_file(path, INI_MAX_FILE, &text, &len, err, errlen);
    if (r != 0) {
        return r > 0 ? 0 : -1;
    }
    r = kms_ini_parse(path, text, len, section, want, nwant, found, err, errlen);
    sodium_memzero(text, INI_MAX_FILE + 1);
    free(text);
    return r;
}

/* given when not NULL, else the variable first if set and not empty, else
 * the variable second (which may be NULL or empty). */
static const char *given_or_env(const char *given, const char *first, const char *second)
{
    if (given != NULL) {
        return given;
    }
    const char *v = getenv(first);
    return v != NULL && v[0] != '\0' ? v : getenv(second);
}

/* The region [KP-AWS-16]: region when not NULL, else AWS_REGION,
 * AWS_DEFAULT_REGION, else the profile's in the config file, else the EC2
 * instance's from IMDSv2.  0, or -1 with why in err. */
static int load_region(kms_config *cfg, const char *region, const char *profile, char *err, size_t errlen)
{
    char section[80], path[4096];
    int found;
    const char *v = given_or_env(region, "AWS_REGION", "AWS_DEFAULT_REGION");
    const char *what = region != NULL ? "--region" : "AWS_REGION/AWS_DEFAULT_REGION";
    if (v != NULL && v[0] != '\0') {
        if (!sigv4_scope_part_ok(v)) {
            seterr(err, errlen, "%s: not a region name", what);
            return -1;
        }
        memcpy(cfg->region, v, strlen(v) + 1);
        return 0;
    }
    kms_ini_want want[] = {{"region", cfg->region, sizeof cfg->region, 0, 0}};
    if (strcmp(profile, "default") == 0) {
        snprintf(section, sizeof section, "default");
    } else {
        snprintf(section, sizeof section, "profile %s", profile);
    }
    if (kms_shared_load("AWS_CONFIG_FILE", "config", section, want, 1, &found, path, sizeof path, err, errlen) !=
        0) {
        return -1;
    }
    if (want[0].seen && sigv4_scope_part_ok(cfg->region)) {
        return 0;
    }
    if (want[0].seen) {
        seterr(err, errlen, "%s: [%s] region: not a region name", path, section);
        return -1;
    }
    char why[400];
    if (kms_imds_region(cfg->region, sizeof cfg->region, why, sizeof why) == 0) {
        return 0;
    }
    cfg->region[0] = '\0';
    seterr(err, errlen, "no region: set AWS_REGION or give [%s] a region in the config file (EC2 instance metadata: %s)",
           section, why);
    return -1;
}

/* The endpoint: url when not NULL, else AWS_ENDPOINT_URL_KMS,
 * AWS_ENDPOINT_URL, else the region's https://kms.REGION.amazonaws.com/.
 * 0, or -1 with why in err. */
static int load_endpoint(kms_config *cfg, const char *url, char *err, size_t errlen)
{
    const char *v = given_or_env(url, "AWS_ENDPOINT_URL_KMS", "AWS_ENDPOINT_URL");
    const char *what = url != NULL ? "--endpoint-url" : "AWS_ENDPOINT_URL(_KMS)";
    if (v != NULL && v[0] != '\0') {
        if (kms_config_set_endpoint(cfg, v) != 0) {
            seterr(err, errlen, "%s: not an http(s)://host[:port][/] URL", what);
            return -1;
        }
        return 0;
    }
    char def[128];
    snprintf(def, sizeof def, "https://kms.%s.amazonaws.com/", cfg->region);
    if (kms_config_set_endpoint(cfg, def) != 0) {
        seterr(err, errlen, "region %s makes no endpoint", cfg->region);
        return -1;
    }
    return 0;
}

/* Load the configuration (kms.h). */
kms_status kms_config_load(kms_config *cfg, char *err, size_t errlen)
{
    return kms_config_load_with(cfg, NULL, err, errlen);
}

/* Load the configuration with overrides, credentials included (kms.h). */
kms_status kms_config_load_with(kms_config *cfg, const kms_overrides *ov, char *err, size_t errlen)
{
    kms_creds cr;
    char brief[256];
    kms_status st = kms_config_load_base(cfg, ov, err, errlen);
    if (st != KMS_OK) {
        return st;
    }
    st = kms_creds_resolve(cfg, &cr, err, errlen, brief, sizeof brief);
    if (st == KMS_OK) {
        memcpy(cfg->access_key_id, cr.access_key_id, sizeof cfg->access_key_id);
        memcpy(cfg->secret_access_key, cr.secret_access_key, sizeof cfg->secret_access_key);
        memcpy(cfg->session_token, cr.session_token, sizeof cfg->session_token);
    } else {
        sodium_memzero(cfg, sizeof *cfg);
    }
    kms_creds_wipe(&cr);
    return st;
}

/* Load the profile, region and endpoint (kms.h). */
kms_status kms_config_load_base(kms_config *cfg, const kms_overrides *ov, char *err, size_t errlen)
{
    static const kms_overrides NONE = {NULL, NULL, NULL};

    if (err != NULL && errlen > 0) {
        err[0] = '\0';
    }
    if (ov == NULL) {
        ov = &NONE;
    }
    sodium_memzero(cfg, sizeof *cfg);
    cfg->timeout_ms = 10000;
    const char *profile = ov->profile != NULL ? ov->profile : getenv("AWS_PROFILE");
    cfg->profile_given = ov->profile != NULL;
    cfg->profile_named = profile != NULL && profile[0] != '\0';
    if (profile == NULL || profile[0] == '\0') {
        profile = "default";
    }
    if (!kms_config_profile_ok(profile)) {
        seterr(err, errlen, "%s: not a profile name", ov->profile != NULL ? "--profile" : "AWS_PROFILE");
        goto fail;
    }
    memcpy(cfg->profile, profile, strlen(profile) + 1);
    if (load_region(cfg, ov->region, profile, err, errlen) != 0 || load_endpoint(cfg, ov->endpoint, err, errlen) != 0) {
        goto fail;
    }
    return KMS_OK;
fail:
    sodium_memzero(cfg, sizeof *cfg);
    return KMS_INVALID;
}
