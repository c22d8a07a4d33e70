/*
 * tools/bench_hsm.c -- `build/bin/bench hsm` (part of `make bench`): the
 * pkcs11 provider on a real SoftHSM2 token against the local keyring, in
 * the same run.
 *
 *   1. One wrap and one unwrap: the provider call alone (C_Encrypt /
 *      C_Decrypt with CKM_AES_GCM on the token, against XChaCha20-Poly1305
 *      under the keyring's KEK in memory), interleaved fastest rounds as
 *      tools/bench.c measures everything else; printed as ns per call and
 *      as the HSM's cost in local calls.
 *   2. A rewrap migration of the bench's database (MIG_ROWS rows, 20
 *      distinct DEKs under the local key) to a key in the token, against
 *      the same rewrap to version 2 of the local key, in pairs on byte
 *      copies, the order alternating; goal: the HSM migration takes at
 *      most 1.25 times the local one (median of the pairs' ratios).  The
 *      line prints each run's provider calls beside the rows: with the
 *      read cache and the rewrap memo, calls grow with distinct DEKs, not
 *      rows (per DEK: one unwrap of the old wrap, one wrap into the
 *      target, one unwrap of the new wrap by the verify before commit).
 *
 * The token is made for the run in a temporary directory (SOFTHSM2_CONF,
 * softhsm2-util --init-token), never the system's store, and removed.
 */
#define _XOPEN_SOURCE 700 /* nftw */
#define _DEFAULT_SOURCE   /* setenv */

#include <fcntl.h>
#include <ftw.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <sodium.h>

#include "bench.h"

extern char **environ;

#define HSM_LABEL "ks-bench"
#define HSM_PIN "5678"
#define HSM_KEY "hsm/bench"
#define HSM_REPS 7

/* ---- the token -------------------------------------------------------------- */

/* Run argv (a program on PATH), its standard output to /dev/null so that
 * only JSON lines reach ours, and wait; 0 when it exited 0. */
static int run_program(char *const argv[])
{
    pid_t pid;
    int status = 0, rc = -1;
    posix_spawn_file_actions_t fa;
    if (posix_spawn_file_actions_init(&fa) != 0) {
        return -1;
    }
    if (posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0) == 0 &&
        posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ) == 0 && waitpid(pid, &status, 0) == pid) {
        rc = WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -1;
    }
    posix_spawn_file_actions_destroy(&fa);
    return rc;
}

/* A SoftHSM2 configuration and an initialised token under dir (which
 * exists), with SOFTHSM2_CONF pointing at it before the module loads. */
static int token_make(const char *dir)
{
    char conf[512], tokens[512];
    snprintf(tokens, sizeof tokens, "%s/tokens", dir);
    snprintf(conf, sizeof conf, "%s/softhsm2.conf", dir);
    if (mkdir(tokens, 0700) != 0) {
        return -1;
    }
    FILE *f = fopen(conf, "w");
    if (f == NULL) {
        return -1;
    }
    fprintf(f, "directories.tokendir = %s\nobjectstore.backend = file\nlog.level = ERROR\n", tokens);
    fclose(f);
    setenv("SOFTHSM2_CONF", conf, 1);
    char *const argv[] = {"softhsm2-util", "--init-token", "--free", "--label", HSM_LABEL,
                          "--so-pin", "1234", "--pin", HSM_PIN, NULL};
    return run_program(argv);
}

/* nftw callback: remove one entry (children before their directory). */
static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

/* Remove dir and everything under it (this run's own temp directory). */
static void tree_remove(const char *dir)
{
    if (nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS) != 0) {
        fprintf(stderr, "bench: could not remove %s\n", dir);
    }
}

/* ---- a two-provider router: hsm/ to the token, the rest to the keyring ---- */

typedef struct router {
    ks_provider local, hsm;
} router;

/* The provider of key_id. */
static const ks_provider *route(const router *r, ks_bytes key_id)
{
    return key_id.len >= 4 && memcmp(key_id.ptr, "hsm/", 4) == 0 ? &r->hsm : &r->local;
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

/* ---- one provider call ------------------------------------------------------- */

/* A wrap and unwrap of one DEK under one provider's key. */
typedef struct call_case {
    const ks_provider *p;
    ks_bytes key_id;
    uint8_t dek[KS_DEK_LEN], back[KS_DEK_LEN], aad[64], wrapped[KS_WRAPPED_DEK_MAX];
    size_t aad_len, wrapped_len;
} call_case;

/* One wrap. */
static int run_wrap(void *arg)
{
    call_case *c = arg;
    size_t n = 0;
    return c->p->ops->wrap(c->p->self, c->key_id, 1, c->dek, KS_DEK_LEN,
                           (ks_bytes){c->aad, c->aad_len}, c->wrapped, sizeof c->wrapped, &n, 0) == KS_OK
               ? 0
               : -1;
}

/* One unwrap of the prepared wrapped DEK. */
static int run_unwrap(void *arg)
{
    call_case *c = arg;
    return c->p->ops->unwrap(c->p->self, c->key_id, 1, (ks_bytes){c->wrapped, c->wrapped_len},
                             (ks_bytes){c->aad, c->aad_len}, c->back, KS_DEK_LEN, 0) == KS_OK
               ? 0
               : -1;
}

/* A case of p's key key_id with a prepared wrapped DEK (a non-empty AAD,
 * as the library always passes). */
static int call_case_init(call_case *c, const ks_provider *p, const char *key_id)
{
    memset(c, 0, sizeof *c);
    c->p = p;
    c->key_id = (ks_bytes){(const uint8_t *)key_id, strlen(key_id)};
    randombytes_buf(c->dek, sizeof c->dek);
    c->aad_len = 44;
    randombytes_buf(c->aad, c->aad_len);
    return p->ops->wrap(p->self, c->key_id, 1, c->dek, KS_DEK_LEN, (ks_bytes){c->aad, c->aad_len},
                        c->wrapped, sizeof c->wrapped, &c->wrapped_len, 0) == KS_OK
               ? 0
               : -1;
}

/* Print one provider call against the local one. */
static void print_call(const char *op, pair_result r)
{
    printf("{\"bench\":\"hsm-call\",\"op\":\"%s\",\"hsm_ns\":%.0f,\"local_ns\":%.0f,"
           "\"hsm_in_local_calls\":%.1f,\"hsm_median_ns\":%.0f,\"local_median_ns\":%.0f}\n",
           op, r.ns, r.base_ns, r.ns / r.base_ns, r.med_ns, r.med_base_ns);
}

/* ---- the migration -------------------------------------------------------------- */

/* One timed rewrap of a copy of src (work) to (key, version) under prov. */
static int rewrap_once(const ks_provider *prov, const char *src, const char *work, const char *key,
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
int bench_hsm(void)
{
    char dir[256], tdir[300], src[300], plain[300], work[300];
    ks_keyring *kr = NULL;
    ks_ctx *unused = NULL;
    router r;
    ks_provider rp = {&router_ops, &r, "bench-router"};
    int rc = -1, have_hsm = 0;
    memset(&r, 0, sizeof r);
    if (bench_keyring(dir, sizeof dir, &kr, &unused) != 0 || ks_keyring_provider(kr, &r.local) != KS_OK) {
        fprintf(stderr, "bench: cannot set up the keyring\n");
        goto done;
    }
    snprintf(tdir, sizeof tdir, "%s/softhsm", dir);
    ks_pkcs11_config pc = {NULL, HSM_LABEL, NULL, {(const uint8_t *)HSM_PIN, sizeof HSM_PIN - 1},
                           KS_PKCS11_GCM_P11KIT, 0};
    if (mkdir(tdir, 0700) != 0 || token_make(tdir) != 0 || ks_pkcs11_open(&pc, &r.hsm) != KS_OK) {
        fprintf(stderr, "bench: cannot set up a SoftHSM2 token (is softhsm2 installed?)\n");
        goto done;
    }
    have_hsm = 1;
    ks_bytes hk = {(const uint8_t *)HSM_KEY, sizeof HSM_KEY - 1};
    if (r.hsm.ops->admin->create(r.hsm.self, hk, 0) != KS_OK) {
        fprintf(stderr, "bench: cannot create the token's key\n");
        goto done;
    }

    /* 1. one call */
    call_case hc, lc;
    if (call_case_init(&hc, &r.hsm, HSM_KEY) != 0 || call_case_init(&lc, &r.local, MIG_KEY) != 0) {
        fprintf(stderr, "bench: a provider call failed\n");
        goto done;
    }
    pair_result w = measure_pair(run_wrap, &hc, run_wrap, &lc);
    pair_result u = measure_pair(run_unwrap, &hc, run_unwrap, &lc);
    if (w.ns < 0 || u.ns < 0) {
        fprintf(stderr, "bench: a provider call failed\n");
        goto done;
    }
    print_call("wrap", w);
    print_call("unwrap", u);

    /* 2. the migration: source under the local key, 20 DEKs */
    long rows = MIG_ROWS_DEFAULT;
    const char *env_rows = getenv("KS_BENCH_MIGRATE_ROWS");
    if (env_rows != NULL && atol(env_rows) > 0) {
        rows = atol(env_rows);
    }
    snprintf(src, sizeof src, "%s/source.db", dir);
    snprintf(plain, sizeof plain, "%s/plain.db", dir);
    snprintf(work, sizeof work, "%s/work.db", dir);
    double secs, t_hsm[HSM_REPS], t_local[HSM_REPS], ratio[HSM_REPS];
    ks_metrics m, m_hsm = {0}, m_local = {0};
    ks_checkpoint cp;
    uint32_t v2 = 0;
    if (mig_create(plain, rows) != 0 || copy_file(plain, src) != 0 ||
        mig_run_to(&r.local, src, KS_MIGRATE_ENCRYPT, MIG_KEY, 1, MIG_DEK_MESSAGES, 0, &secs, &m, &cp) != 0 ||
        ks_keyring_add_version(kr, (ks_bytes){(const uint8_t *)MIG_KEY, sizeof MIG_KEY - 1}, &v2) != KS_OK) {
        fprintf(stderr, "bench: cannot build the source database\n");
        goto done;
    }
    const uint64_t deks = m.deks_created;
    for (int i = 0; i < HSM_REPS; i++) {
        int hsm_first = i % 2 == 0;
        for (int k = 0; k < 2; k++) {
            int hsm = (k == 0) == hsm_first;
            if (rewrap_once(&rp, src, work, hsm ? HSM_KEY : MIG_KEY, hsm ? 1 : v2,
                            hsm ? &t_hsm[i] : &t_local[i], hsm ? &m_hsm : &m_local) != 0) {
                goto done;
            }
        }
        ratio[i] = t_hsm[i] / t_local[i];
    }
    char pairs[HSM_REPS * 8 + 8];
    size_t off = 0;
    for (int i = 0; i < HSM_REPS; i++) {
        off += (size_t)snprintf(pairs + off, sizeof pairs - off, "%s%.3f", i ? "," : "", ratio[i]);
    }
    double med = median(ratio, HSM_REPS);
    printf("{\"bench\":\"hsm-migrate-rewrap\",\"ratio\":\"hsm_s/local_s\",\"value\":%.3f,"
           "\"goal\":1.25,\"pass\":%s,\"rows\":%ld,\"source_deks\":%llu,\"hsm_s\":%.3f,"
           "\"local_s\":%.3f,\"hsm_run_provider_calls\":{\"wraps\":%llu,\"unwraps\":%llu},"
           "\"local_run_provider_calls\":{\"wraps\":%llu,\"unwraps\":%llu},\"pairs\":[%s]}\n",
           med, med <= 1.25 ? "true" : "false", rows, (unsigned long long)deks, median(t_hsm, HSM_REPS),
           median(t_local, HSM_REPS), (unsigned long long)m_hsm.wraps,
           (unsigned long long)m_hsm.unwraps, (unsigned long long)m_local.wraps,
           (unsigned long long)m_local.unwraps, pairs);
    rc = 0;
done:
    if (have_hsm) {
        ks_provider_destroy(&r.hsm);
    }
    ks_ctx_free(unused);
    ks_keyring_close(kr);
    if (kr != NULL) {
        tree_remove(dir);
    }
    return rc;
}
