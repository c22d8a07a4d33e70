/*
 * tools/bench/bench_app.c -- `bench app`: the application API
 * (keyshift/app.h) with a rollout, against the ks_ctx under it.
 *
 * An application that takes part in a rollout seals and opens through
 * ks_app: each call asks the rollout policy what to write or whether it
 * may read, and is timed into the latency histograms the health reports
 * carry.  What it would use instead is the context alone (ks_seal,
 * ks_open), glued to the policy by hand.  So, for seal and open at 128 B
 * and 2 KiB (format 2, AES-256-GCM, one keyring key):
 *
 *   - one thread: ns per call of ks_app_seal / ks_app_open_value on an app
 *     whose SQLite database holds a planned rollout of the column, against
 *     ks_seal / ks_open on a context with the defaults (measure_pair:
 *     interleaved rounds, fastest of each).  ratio = ctx ns / app ns, what
 *     the application layer leaves of the context's speed; reported;
 *   - threads: ops/s with 1 and BENCH_THREADS threads sharing the one app,
 *     and sharing the one context (bench_scaling()).  Goal: the app's
 *     speedup at least 0.9 of the context's ("scales as ks_ctx does",
 *     keyshift/app.h); inconclusive when the context itself did not scale
 *     (the other core was busy).
 *
 * JSON lines, then one summary line.  Failed goals do not fail the bench.
 */
#define _DEFAULT_SOURCE /* mkdtemp */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <sqlite3.h>

#include <keyshift/app.h>
#include <keyshift/keyshift.h>
#include <keyshift/rollout.h>

#include "bench.h"

#define APP_MAX_PT 2048
#define APP_CAP (APP_MAX_PT + 1024)

/* One thread's side of a case: the shared app and context, its own
 * scratch output.  Every thread opens the same two envelopes. */
typedef struct app_case {
    ks_app *app;
    ks_ctx *ctx;
    ks_app_record rec;
    ks_seal_params sp;   /* what the app writes in the planned phase */
    ks_open_params op;
    const uint8_t *pt;
    size_t n;
    const uint8_t *app_env, *ctx_env; /* sealed by each, n bytes of pt */
    size_t app_env_len, ctx_env_len;
    uint8_t out[APP_CAP];
    _Alignas(64) size_t sink; /* written every call: on a line of its own (and the
                                 next case starts on the next one) */
} app_case;

/* ks_app_seal of the case's plaintext. */
static int app_seal(void *arg)
{
    app_case *c = arg;
    size_t len = 0;
    if (ks_app_seal(c->app, &c->rec, c->pt, c->n, c->out, sizeof c->out, &len, NULL) != KS_OK) {
        return -1;
    }
    c->sink += len;
    return 0;
}

/* ks_app_open_value of the app's envelope. */
static int app_open(void *arg)
{
    app_case *c = arg;
    size_t len = 0;
    if (ks_app_open_value(c->app, &c->rec, c->app_env, c->app_env_len, c->out, sizeof c->out, &len,
                          NULL, NULL) != KS_OK) {
        return -1;
    }
    c->sink += len;
    return 0;
}

/* ks_seal with the class the app writes. */
static int ctx_seal(void *arg)
{
    app_case *c = arg;
    size_t len = 0;
    if (ks_seal(c->ctx, &c->sp, c->pt, c->n, c->out, sizeof c->out, &len) != KS_OK) {
        return -1;
    }
    c->sink += len;
    return 0;
}

/* ks_open of the context's envelope. */
static int ctx_open(void *arg)
{
    app_case *c = arg;
    size_t len = 0;
    if (ks_open(c->ctx, c->ctx_env, c->ctx_env_len, &c->op, c->out, sizeof c->out, &len, NULL) != KS_OK) {
        return -1;
    }
    c->sink += len;
    return 0;
}

/* A class of the bench key: format 2, AES-256-GCM, bench/kek:version. */
static ks_rollout_class bench_class(uint32_t version)
{
    ks_rollout_class c;
    memset(&c, 0, sizeof c);
    c.version = KS_FORMAT_V2;
    c.algorithm = KS_ALG_AES256GCM;
    strcpy(c.key_id, "bench/kek");
    c.key_version = version;
    return c;
}

/* The database at path: payments(card), and a planned rollout of
 * payments.card from bench/kek:1 to bench/kek:2 (so the app writes and
 * reads version 1 through the policy). */
static int make_rollout_db(const char *path)
{
    sqlite3 *db = NULL;
    int ok = sqlite3_open(path, &db) == SQLITE_OK &&
             sqlite3_exec(db, "CREATE TABLE payments(id INTEGER PRIMARY KEY, card BLOB)", NULL, NULL,
                          NULL) == SQLITE_OK;
    sqlite3_close(db);
    ks_rollout_db *rdb = NULL;
    char err[256];
    if (!ok || ks_rollout_db_open(path, 0, &rdb, err, sizeof err) != KS_OK) {
        return -1;
    }
    ks_rollout s;
    memset(&s, 0, sizeof s);
    strcpy(s.table, "payments");
    strcpy(s.column, "card");
    s.source = bench_class(1);
    s.target = bench_class(2);
    s.canary.kind = KS_CANARY_ALL;
    ks_thresholds_default(&s.thresholds);
    s.reader_ttl_s = 30;
    int64_t id = 0;
    ks_err e = ks_rollout_db_start(rdb, &s, "bench", (int64_t)time(NULL), &id, err, sizeof err);
    ks_rollout_db_close(rdb);
    return e == KS_OK ? 0 : -1;
}

/* Print one single-thread line: ctx ns / app ns. */
static void print_single(const char *op, size_t n, pair_result r)
{
    printf("{\"bench\":\"app\",\"name\":\"app/%s/%zu\",\"op\":\"%s\",\"bytes\":%zu,\"database\":\"sqlite\","
           "\"app_ns\":%.1f,\"ctx_ns\":%.1f,\"app_median_ns\":%.1f,\"ctx_median_ns\":%.1f,"
           "\"ratio\":%.3f}\n",
           op, n, op, n, r.ns, r.base_ns, r.med_ns, r.med_base_ns, r.base_ns / r.ns);
}

/* One scaling line and its goal; *passed, *inconclusive counted. */
static int scaling_case(const char *op, op_fn app_fn, op_fn ctx_fn, app_case *cases, int *passed,
                        int *inconclusive)
{
    double best[4];
    if (bench_scaling(app_fn, cases, ctx_fn, cases, sizeof cases[0], best) != 0) {
        return -1;
    }
    double app_speedup = best[1] / best[0], ctx_speedup = best[3] / best[2];
    double ratio = app_speedup / ctx_speedup;
    int pass = ratio >= 0.9, scaled = ctx_speedup >= BENCH_THREAD_SCALED;
    printf("{\"bench\":\"app-threads\",\"name\":\"app-threads/%s/%zu\",\"op\":\"%s\",\"bytes\":%zu,"
           "\"threads\":%d,\"app_1t_ops\":%.0f,\"app_2t_ops\":%.0f,\"ctx_1t_ops\":%.0f,\"ctx_2t_ops\":%.0f,"
           "\"app_speedup\":%.3f,\"ctx_speedup\":%.3f,\"ratio\":%.3f,\"goal\":0.9,\"pass\":%s,"
           "\"ctx_scaled\":%s}\n",
           op, cases[0].n, op, cases[0].n, BENCH_THREADS, best[0], best[1], best[2], best[3], app_speedup,
           ctx_speedup, ratio, pass ? "true" : "false", scaled ? "true" : "false");
    *passed += pass;
    *inconclusive += !scaled;
    return 0;
}

/* Both envelopes of n bytes of pt into env (app's, then ctx's), the
 * cases set up for every thread. */
static int cases_init(app_case *cases, ks_app *app, ks_ctx *ctx, const uint8_t *pt, size_t n,
                      uint8_t *env, size_t cap)
{
    app_case *c = &cases[0];
    memset(c, 0, sizeof *c);
    c->app = app;
    c->ctx = ctx;
    c->rec = (ks_app_record){"payments", "card", {(const uint8_t *)"tenant-00042", 12},
                             {(const uint8_t *)"payments:42:card", 16}, {NULL, 0}};
    c->sp = (ks_seal_params){KS_FORMAT_V2, KS_ALG_AES256GCM, c->rec.tenant,
                             {(const uint8_t *)"bench/kek", 9}, 1, {(const uint8_t *)"card", 4},
                             c->rec.context};
    c->op = (ks_open_params){c->rec.context, c->rec.tenant, {(const uint8_t *)"card", 4}};
    c->pt = pt;
    c->n = n;
    size_t half = cap / 2;
    if (ks_app_seal(app, &c->rec, pt, n, env, half, &c->app_env_len, NULL) != KS_OK ||
        ks_seal(ctx, &c->sp, pt, n, env + half, half, &c->ctx_env_len) != KS_OK) {
        return -1;
    }
    c->app_env = env;
    c->ctx_env = env + half;
    for (int i = 1; i < BENCH_THREADS; i++) {
        cases[i] = cases[0];
    }
    return 0;
}

/* See bench.h. */
int bench_app(void)
{
    static const size_t sizes[] = {128, APP_MAX_PT};
    static app_case cases[BENCH_THREADS];
    static uint8_t pt[APP_MAX_PT], env[2 * APP_CAP];
    char dir[256], db[512] = "", keyring[512], err[256] = "";
    ks_keyring *kr = NULL;
    ks_ctx *ctx = NULL;
    ks_app *app = NULL;
    int rc = -1, passed = 0, inconclusive = 0, goals = 0;
    uint32_t v2 = 0;
    if (bench_keyring(dir, sizeof dir, &kr, &ctx) != 0 ||
        ks_keyring_add_version(kr, (ks_bytes){(const uint8_t *)"bench/kek", 9}, &v2) != KS_OK) {
        fprintf(stderr, "bench: cannot set up the keyring\n");
        goto done;
    }
    snprintf(db, sizeof db, "%s/app.sqlite", dir);
    snprintf(keyring, sizeof keyring, "%s/keyring", dir);
    ks_app_options o;
    memset(&o, 0, sizeof o);
    o.keyring = keyring;
    o.database = db;
    o.instance_id = "bench-app";
    if (make_rollout_db(db) != 0 || ks_app_open(&o, &app, err, sizeof err) != KS_OK) {
        fprintf(stderr, "bench: cannot set up the application: %s\n", err);
        goto done;
    }
    for (size_t i = 0; i < sizeof pt; i++) {
        pt[i] = (uint8_t)(i * 131u);
    }
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        if (cases_init(cases, app, ctx, pt, sizes[i], env, sizeof env) != 0) {
            fprintf(stderr, "bench: app seal failed\n");
            goto done;
        }
        pair_result s = measure_pair(app_seal, &cases[0], ctx_seal, &cases[0]);
        pair_result op = measure_pair(app_open, &cases[0], ctx_open, &cases[0]);
        if (s.ns < 0 || op.ns < 0) {
            fprintf(stderr, "bench: app seal/open failed\n");
            goto done;
        }
        print_single("seal", sizes[i], s);
        print_single("open", sizes[i], op);
        if (scaling_case("seal", app_seal, ctx_seal, cases, &passed, &inconclusive) != 0 ||
            scaling_case("open", app_open, ctx_open, cases, &passed, &inconclusive) != 0) {
            fprintf(stderr, "bench: app seal/open failed\n");
            goto done;
        }
        goals += 2;
    }
    printf("{\"bench\":\"app-summary\",\"goals\":%d,\"passed\":%d,\"inconclusive\":%d}\n", goals, passed,
           inconclusive);
    rc = 0;
done:
    ks_app_close(app);
    ks_ctx_free(ctx);
    ks_keyring_close(kr);
    if (kr != NULL) {
        remove_db(db);
        bench_keyring_remove(dir);
    }
    return rc;
}
