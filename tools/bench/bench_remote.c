/*
 * tools/bench/bench_remote.c -- what `bench hsm` and `bench plugin` share: a
 * provider outside the process's memory (a token, a plugin process)
 * measured against the local keyring in the same run.
 *
 *   1. One wrap and one unwrap: the provider call alone against the local
 *      keyring's (XChaCha20-Poly1305 under its KEK in memory),
 *      interleaved fastest rounds as tools/bench/bench.c measures everything
 *      else; printed as ns per call and as the remote's cost in local
 *      calls ("NAME-call" lines).
 *   2. A rewrap migration of the bench's database (MIG_ROWS rows, 20
 *      distinct DEKs under the local key) to the remote's key, against the
 *      same rewrap to version 2 of the local key, in pairs on byte copies,
 *      the order alternating; goal: the remote migration takes at most
 *      1.25 times the local one (median of the pairs' ratios).  The line
 *      ("NAME-migrate-rewrap") prints each run's provider calls beside the
 *      rows: with the read cache and the rewrap memo, calls grow with
 *      distinct DEKs, not rows (per DEK: one unwrap of the old wrap, one
 *      wrap into the target, one unwrap of the new wrap by the verify
 *      before commit).
 */
#define _DEFAULT_SOURCE

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <sodium.h>

#include "bench.h"

#define REMOTE_REPS 7

/* ---- a two-provider router: the remote's prefix to it, the rest local ---- */

/* The provider of key_id. */
static const ks_provider *route(const bench_router *r, ks_bytes key_id)
{
    const size_t n = strlen(r->prefix);
    return key_id.len >= n && memcmp(key_id.ptr, r->prefix, n) == 0 ? r->remote : &r->local;
}

/* ks_provider_ops.wrap of the router. */
static ks_err route_wrap(void *self, ks_bytes key_id, uint32_t v, const uint8_t *dek, size_t dek_len,
                         ks_bytes aad, uint8_t *out, size_t cap, size_t *out_len, uint32_t ms)
{
    const ks_provider *p = route(self, key_id);
    return p->ops->wrap(p->self, key_id, v, dek, dek_len, aad, out, cap, out_len, ms);
}

/* ks_provider_ops.unwrap of the router. */
static ks_err route_unwrap(void *self, ks_bytes key_id, uint32_t v, ks_bytes wrapped, ks_bytes aad,
                           uint8_t *dek, size_t dek_len, uint32_t ms)
{
    const ks_provider *p = route(self, key_id);
    return p->ops->unwrap(p->self, key_id, v, wrapped, aad, dek, dek_len, ms);
}

/* ks_provider_ops.key_info of the router. */
static ks_err route_info(void *self, ks_bytes key_id, uint32_t v, ks_key_info *out, uint32_t ms)
{
    const ks_provider *p = route(self, key_id);
    return p->ops->key_info(p->self, key_id, v, out, ms);
}

static const ks_provider_ops router_ops = {route_wrap, route_unwrap, route_info, NULL, NULL};

/* See bench.h. */
ks_provider bench_router_provider(bench_router *r)
{
    return (ks_provider){&router_ops, r, "bench-router"};
}

/* ---- one provider call ------------------------------------------------------- */

/* A wrap and unwrap of one DEK under one provider's key version. */
typedef struct call_case {
    const ks_provider *p;
    ks_bytes key_id;
    uint32_t version;
    uint8_t dek[KS_DEK_LEN], back[KS_DEK_LEN], aad[64], wrapped[KS_WRAPPED_DEK_MAX];
    size_t aad_len, wrapped_len;
} call_case;

/* One wrap. */
static int run_wrap(void *arg)
{
    call_case *c = arg;
    size_t n = 0;
    return c->p->ops->wrap(c->p->self, c->key_id, c->version, c->dek, KS_DEK_LEN,
                           (ks_bytes){c->aad, c->aad_len}, c->wrapped, sizeof c->wrapped, &n, 0) == KS_OK
               ? 0
               : -1;
}

/* One unwrap of the prepared wrapped DEK. */
static int run_unwrap(void *arg)
{
    call_case *c = arg;
    return c->p->ops->unwrap(c->p->self, c->key_id, c->version, (ks_bytes){c->wrapped, c->wrapped_len},
                             (ks_bytes){c->aad, c->aad_len}, c->back, KS_DEK_LEN, 0) == KS_OK
               ? 0
               : -1;
}

/* A case of p's key (key_id, version) with a prepared wrapped DEK (a
 * non-empty AAD, as the library always passes). */
static int call_case_init(call_case *c, const ks_provider *p, const char *key_id, uint32_t version)
{
    memset(c, 0, sizeof *c);
    c->p = p;
    c->key_id = (ks_bytes){(const uint8_t *)key_id, strlen(key_id)};
    c->version = version;
    randombytes_buf(c->dek, sizeof c->dek);
    c->aad_len = 44;
    randombytes_buf(c->aad, c->aad_len);
    return p->ops->wrap(p->self, c->key_id, version, c->dek, KS_DEK_LEN, (ks_bytes){c->aad, c->aad_len},
                        c->wrapped, sizeof c->wrapped, &c->wrapped_len, 0) == KS_OK
               ? 0
               : -1;
}

/* Print one provider call against the local one. */
static void print_call(const char *name, const char *op, pair_result r)
{
    printf("{\"bench\":\"%s-call\",\"op\":\"%s\",\"%s_ns\":%.0f,\"local_ns\":%.0f,"
           "\"%s_in_local_calls\":%.1f,\"%s_median_ns\":%.0f,\"local_median_ns\":%.0f}\n",
           name, op, name, r.ns, r.base_ns, name, r.ns / r.base_ns, name, r.med_ns, r.med_base_ns);
}

/* ---- the migration -------------------------------------------------------------- */

/* See bench.h. */
int bench_rewrap_once(const ks_provider *prov, const char *src, const char *work, const char *key,
                      uint32_t version, double *secs, ks_metrics *m)
{
    ks_checkpoint cp;
    int rc = copy_file(src, work) != 0 ||
                     mig_run_to(prov, work, KS_MIGRATE_REWRAP, key, version, 0, 0, secs, m, &cp) != 0
                 ? -1
                 : 0;
    remove_db(work);
    return rc;
}

/* See bench.h. */
int bench_source(ks_keyring *kr, const char *dir, long rows, uint64_t dek_messages, char *src, size_t cap,
                 uint64_t *deks)
{
    char plain[300];
    double secs;
    ks_metrics m;
    ks_checkpoint cp;
    ks_provider local;
    snprintf(src, cap, "%s/source-%ld-%llu.db", dir, rows, (unsigned long long)dek_messages);
    snprintf(plain, sizeof plain, "%s/plain.db", dir);
    if (ks_keyring_provider(kr, &local) != KS_OK || mig_create(plain, rows) != 0 || copy_file(plain, src) != 0 ||
        mig_run_to(&local, src, KS_MIGRATE_ENCRYPT, MIG_KEY, 1, dek_messages, 0, &secs, &m, &cp) != 0) {
        remove_db(plain);
        return -1;
    }
    remove_db(plain);
    *deks = m.deks_created;
    return 0;
}

/* See bench.h. */
long bench_rows(void)
{
    const char *env_rows = getenv("KS_BENCH_MIGRATE_ROWS");
    return env_rows != NULL && atol(env_rows) > 0 ? atol(env_rows) : MIG_ROWS_DEFAULT;
}

/* See bench.h. */
int bench_remote(const remote_case *rc, ks_keyring *kr, const char *dir)
{
    char src[300], work[300];
    bench_router r = {{NULL, NULL, NULL}, rc->remote, rc->prefix};
    ks_provider rp = bench_router_provider(&r);
    if (ks_keyring_provider(kr, &r.local) != KS_OK) {
        return -1;
    }

    /* 1. one call */
    call_case hc, lc;
    if (call_case_init(&hc, rc->remote, rc->key, rc->version) != 0 || call_case_init(&lc, &r.local, MIG_KEY, 1) != 0) {
        fprintf(stderr, "bench: a %s provider call failed\n", rc->name);
        return -1;
    }
    pair_result w = measure_pair(run_wrap, &hc, run_wrap, &lc);
    pair_result u = measure_pair(run_unwrap, &hc, run_unwrap, &lc);
    if (w.ns < 0 || u.ns < 0) {
        fprintf(stderr, "bench: a %s provider call failed\n", rc->name);
        return -1;
    }
    print_call(rc->name, "wrap", w);
    print_call(rc->name, "unwrap", u);

    /* 2. the migration: source under the local key, 20 DEKs */
    const long rows = bench_rows();
    uint64_t deks = 0;
    uint32_t v2 = 0;
    snprintf(work, sizeof work, "%s/work.db", dir);
    if (bench_source(kr, dir, rows, MIG_DEK_MESSAGES, src, sizeof src, &deks) != 0 ||
        ks_keyring_add_version(kr, (ks_bytes){(const uint8_t *)MIG_KEY, sizeof MIG_KEY - 1}, &v2) != KS_OK) {
        fprintf(stderr, "bench: cannot build the source database\n");
        return -1;
    }
    double t_remote[REMOTE_REPS], t_local[REMOTE_REPS], ratio[REMOTE_REPS];
    ks_metrics m_remote = {0}, m_local = {0};
    for (int i = 0; i < REMOTE_REPS; i++) {
        const int remote_first = i % 2 == 0;
        for (int k = 0; k < 2; k++) {
            const int remote = (k == 0) == remote_first;
            if (bench_rewrap_once(&rp, src, work, remote ? rc->key : MIG_KEY, remote ? rc->version : v2,
                                  remote ? &t_remote[i] : &t_local[i], remote ? &m_remote : &m_local) != 0) {
                fprintf(stderr, "bench: a %s rewrap failed\n", rc->name);
                return -1;
            }
        }
        ratio[i] = t_remote[i] / t_local[i];
    }
    char pairs[REMOTE_REPS * 8 + 8];
    size_t off = 0;
    for (int i = 0; i < REMOTE_REPS; i++) {
        off += (size_t)snprintf(pairs + off, sizeof pairs - off, "%s%.3f", i ? "," : "", ratio[i]);
    }
    remove_db(src);
    const double med = median(ratio, REMOTE_REPS);
    printf("{\"bench\":\"%s-migrate-rewrap\",\"ratio\":\"%s_s/local_s\",\"value\":%.3f,"
           "\"goal\":1.25,\"pass\":%s,\"rows\":%ld,\"source_deks\":%llu,\"%s_s\":%.3f,"
           "\"local_s\":%.3f,\"%s_run_provider_calls\":{\"wraps\":%llu,\"unwraps\":%llu},"
           "\"local_run_provider_calls\":{\"wraps\":%llu,\"unwraps\":%llu},\"pairs\":[%s]}\n",
           rc->name, rc->name, med, med <= 1.25 ? "true" : "false", rows, (unsigned long long)deks, rc->name,
           median(t_remote, REMOTE_REPS), median(t_local, REMOTE_REPS), rc->name,
           (unsigned long long)m_remote.wraps, (unsigned long long)m_remote.unwraps,
           (unsigned long long)m_local.wraps, (unsigned long long)m_local.unwraps, pairs);
    return 0;
}
