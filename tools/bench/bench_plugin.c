/*
 * tools/bench/bench_plugin.c -- `build/bin/bench plugin` (part of `make bench`):
 * the KMS plugin provider (migrate/keys/provider_plugin.c) through a real
 * plugin process, tools/kms-example/keyshift-kms-example, against the local keyring,
 * in the same run.
 *
 *   1. tools/bench/bench_remote.c's measurements: one wrap and one unwrap through
 *      the pipe against one local call ("plugin-call"), and a 20,000-row
 *      rewrap with 20 distinct DEKs to a key in the plugin against the same
 *      rewrap to the local key's version 2 ("plugin-migrate-rewrap"; goal:
 *      at most 1.25 times the local time).  The provider has no rate limit
 *      here: what is measured is the bridge, not a quota.
 *   2. Calls against DEKs and rows ("plugin-rewrap-calls"): rewraps of
 *      databases of (rows, DEKs) = (N, 20), (N, 5) and (N/4, 5), counting
 *      the requests the plugin received.  Goal: at most 3 per DEK plus the
 *      key-info lookups of the run, whatever the rows.
 *   3. The default rate limit's cost on that 20-DEK rewrap
 *      ("plugin-rate-limit"): the requests, the seconds, and the observed
 *      rate, which must stay at or under the limit.
 *
 * The plugin is the example in Python (its own round trip dominates a
 * call's cost: a plugin in a compiled language is faster, one in front of
 * a network KMS slower).  Its keys file is made in the run's temporary
 * directory and removed.
 */
#define _DEFAULT_SOURCE /* setenv, realpath */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include <keyshift/plugin.h>

#include "bench.h"

#define PLUGIN_KEY "kms/bench"
#define PLUGIN_TOOL "tools/kms-example/keyshift-kms-example"

/* Write the example plugin's key file in dir (one active version 1 of
 * PLUGIN_KEY) and point KEYSHIFT_KMS_EXAMPLE_KEYS at it. */
static int keys_make(const char *dir)
{
    char path[300], b64[sodium_base64_ENCODED_LEN(32, sodium_base64_VARIANT_ORIGINAL)];
    uint8_t kek[32];
    randombytes_buf(kek, sizeof kek);
    sodium_bin2base64(b64, sizeof b64, kek, sizeof kek, sodium_base64_VARIANT_ORIGINAL);
    sodium_memzero(kek, sizeof kek);
    snprintf(path, sizeof path, "%s/kms-keys.json", dir);
    FILE *f = fopen(path, "w");
    if (f == NULL) {
        return -1;
    }
    fprintf(f, "{\"%s\": {\"primary\": 1, \"versions\": {\"1\": {\"state\": \"active\", \"kek\": \"%s\"}}}}\n",
            PLUGIN_KEY, b64);
    sodium_memzero(b64, sizeof b64);
    fclose(f);
    return setenv("KEYSHIFT_KMS_EXAMPLE_KEYS", path, 1);
}

/* Open the example plugin with rate limit `rate` (0: none). */
static int plugin_open(uint32_t rate, ks_provider *out)
{
    char *tool = realpath(PLUGIN_TOOL, NULL);
    if (tool == NULL) {
        fprintf(stderr, "bench: %s not found (run from the source tree)\n", PLUGIN_TOOL);
        return -1;
    }
    ks_plugin_config c;
    ks_plugin_config_init(&c);
    static const char *const env[] = {"KEYSHIFT_KMS_EXAMPLE_KEYS"};
    c.command = tool;
    c.env = env; /* [KP-SEC-1]: its key file */
    c.nenv = 1;
    c.rate_limit = rate;
    c.concurrency = 1;
    ks_plugin_error e;
    const ks_err rc = ks_plugin_open(&c, out, &e);
    free(tool);
    if (rc != KS_OK) {
        fprintf(stderr, "bench: the plugin did not open: %s at %s %s\n", ks_err_name(rc), e.stage, e.stderr_tail);
        return -1;
    }
    return 0;
}

/* The requests the plugin has received so far. */
static uint64_t requests(const ks_provider *p)
{
    ks_plugin_stats s;
    return ks_plugin_stats_get(p, &s) == KS_OK ? s.requests : 0;
}

/* Rewrap a copy of a new (rows, dek_messages) database to the plugin's
 * key; its DEKs, the plugin's requests and the seconds go out. */
static int counted_rewrap(ks_keyring *kr, const char *dir, const ks_provider *plugin, long rows,
                          uint64_t dek_messages, uint64_t *deks, uint64_t *reqs, double *secs)
{
    char src[300], work[300];
    bench_router r = {{NULL, NULL, NULL}, plugin, "kms/"};
    ks_provider rp = bench_router_provider(&r);
    ks_metrics m;
    snprintf(work, sizeof work, "%s/count.db", dir);
    if (ks_keyring_provider(kr, &r.local) != KS_OK || bench_source(kr, dir, rows, dek_messages, src, sizeof src, deks) != 0) {
        return -1;
    }
    const uint64_t before = requests(plugin);
    const int rc = bench_rewrap_once(&rp, src, work, PLUGIN_KEY, 1, secs, &m);
    *reqs = requests(plugin) - before;
    remove_db(src);
    return rc;
}

/* Part 2: calls against DEKs and rows. */
static int calls_part(ks_keyring *kr, const char *dir, const ks_provider *plugin)
{
    const long n = bench_rows();
    const struct {
        long rows;
        uint64_t msgs;
    } runs[] = {{n, MIG_DEK_MESSAGES}, {n, (uint64_t)MIG_DEK_MESSAGES * 4}, {n / 4, MIG_DEK_MESSAGES}};
    char list[512];
    size_t off = 0;
    int pass = 1;
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        uint64_t deks = 0, reqs = 0;
        double secs = 0;
        if (counted_rewrap(kr, dir, plugin, runs[i].rows, runs[i].msgs, &deks, &reqs, &secs) != 0) {
            fprintf(stderr, "bench: a counted plugin rewrap failed\n");
            return -1;
        }
        /* per DEK one wrap and one verify unwrap; plus the key-info lookups */
        pass &= reqs <= 3 * deks + 4;
        off += (size_t)snprintf(list + off, sizeof list - off, "%s{\"rows\":%ld,\"deks\":%llu,\"plugin_requests\":%llu}",
                                i ? "," : "", runs[i].rows, (unsigned long long)deks, (unsigned long long)reqs);
    }
    printf("{\"bench\":\"plugin-rewrap-calls\",\"goal\":\"plugin_requests <= 3 * deks + 4\",\"pass\":%s,"
           "\"runs\":[%s]}\n",
           pass ? "true" : "false", list);
    return 0;
}

/* Part 3: the default rate limit on the 20-DEK rewrap. */
static int rate_part(ks_keyring *kr, const char *dir)
{
    ks_provider limited = {NULL, NULL, NULL};
    if (plugin_open(KS_PLUGIN_RATE_DEFAULT, &limited) != 0) {
        return -1;
    }
    uint64_t deks = 0, reqs = 0;
    double secs = 0;
    const int rc = counted_rewrap(kr, dir, &limited, bench_rows(), MIG_DEK_MESSAGES, &deks, &reqs, &secs);
    ks_plugin_stats s;
    const int have = ks_plugin_stats_get(&limited, &s) == KS_OK;
    ks_provider_destroy(&limited);
    if (rc != 0 || !have) {
        fprintf(stderr, "bench: the rate-limited plugin rewrap failed\n");
        return -1;
    }
    const double rate = secs > 0 ? (double)reqs / secs : 0;
    printf("{\"bench\":\"plugin-rate-limit\",\"limit_per_s\":%u,\"deks\":%llu,\"plugin_requests\":%llu,"
           "\"seconds\":%.3f,\"observed_per_s\":%.1f,\"rate_waits\":%llu,\"rate_wait_ms\":%llu,\"pass\":%s}\n",
           KS_PLUGIN_RATE_DEFAULT, (unsigned long long)deks, (unsigned long long)reqs, secs, rate,
           (unsigned long long)s.rate_waits, (unsigned long long)s.rate_wait_ms,
           rate <= KS_PLUGIN_RATE_DEFAULT ? "true" : "false");
    return 0;
}

/* See bench.h. */
int bench_plugin(void)
{
    char dir[256];
    ks_keyring *kr = NULL;
    ks_ctx *unused = NULL;
    ks_provider plugin = {NULL, NULL, NULL};
    int rc = -1;
    if (bench_keyring(dir, sizeof dir, &kr, &unused) != 0 || keys_make(dir) != 0) {
        fprintf(stderr, "bench: cannot set up the keyring\n");
        goto done;
    }
    if (plugin_open(0, &plugin) != 0) {
        goto done;
    }
    const remote_case c = {"plugin", &plugin, "kms/", PLUGIN_KEY, 1};
    rc = bench_remote(&c, kr, dir);
    if (rc == 0) {
        rc = calls_part(kr, dir, &plugin);
    }
    if (rc == 0) {
        rc = rate_part(kr, dir);
    }
done:
    ks_provider_destroy(&plugin);
    ks_ctx_free(unused);
    ks_keyring_close(kr);
    if (kr != NULL) {
        bench_tree_remove(dir);
    }
    return rc;
}
