/*
 * migrate/engine/verify.c -- open every envelope row, or a sample
 * (keyshift/migrate.h ks_migrate_verify).  Read-only.
 *
 * Rows are scanned in id order, KS_ENGINE_SCAN_BATCH at a time (fewer
 * when the store counts fewer rows).  With
 * sample 0 every row is considered; with sample N > 0 and T rows in the
 * store (count()), each row is considered independently with probability
 * N/T (randombytes_uniform(T) < N): about N rows, uniform, in one pass and
 * without a reservoir (every row if N >= T).  Of the rows considered:
 * NULL, plaintext (no "KSE" magic) and, with params->from_key_id, the
 * envelopes of other keys are `skipped`; every other row is checked to
 * open (ks_verify: every check of ks_open, the AEAD tag included,
 * without decrypting) with the tenant (constant or per row, as in
 * ks_migrate_run), the purpose and the rendered context of params,
 * counted in `checked`, and on failure in `failed` and reported through
 * on_failure with its id and error: a parse rejection, auth-failed, a
 * non-retryable provider error (denied, revoked, not-found, integrity),
 * KS_ERR_BAD_VALUE named "bad-tenant" for a row whose tenant is invalid,
 * KS_ERR_TOO_LARGE named "bad-context" for a context over KS_CONTEXT_MAX:
 * the names ks_migrate_run quarantines the same rows under.  No plaintext is ever produced, so
 * none can be reported, and a value of any size is checked.  A retryable
 * provider error (unavailable, timeout) or any other error stops
 * verification and is returned: a row is never reported failed because
 * the provider could not be reached.
 */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include "engine.h"
#include "../alloc_hook.h"

/* The state of one verify call. */
typedef struct verify_run {
    ks_ctx *ctx;
    const ks_migrate_params *p;
    ks_context_tmpl *tmpl;
    uint64_t total, sample;
    ks_verify_failure_fn on_failure;
    void *arg;
    ks_verify_result *res;
    uint8_t *dec;        /* a base64 column: the row at hand's decoded envelope */
    size_t dec_cap;
} verify_run;

/* Report a failure of row; name is the one a migration quarantines it
 * under. */
static void fail_row(verify_run *v, const ks_row *row, ks_err e, const char *name)
{
    v->res->failed++;
    if (v->on_failure != NULL) {
        ks_verify_failure f = {row->id, e, name};
        v->on_failure(v->arg, &f);
    }
}

/* Check that one envelope row opens, env its envelope's bytes (perr: a
 * base64 value that did not decode); KS_OK or the error to stop with. */
static ks_err check_row(verify_run *v, const ks_row *row, ks_bytes env, ks_err perr)
{
    ks_bytes tenant;
    uint8_t context[KS_CONTEXT_MAX];
    size_t context_len = 0;
    v->res->checked++;
    if (perr != KS_OK) {
        fail_row(v, row, perr, ks_err_name(perr)); /* malformed: as a migration names it */
        return KS_OK;
    }
    const char *name = NULL;
    ks_err err = ks_engine_row_tenant(v->p, row, &tenant);
    if (err == KS_ERR_INVALID_ARGUMENT) {
        return err; /* constant tenant and a tenant column: ambiguous */
    }
    name = err == KS_ERR_BAD_VALUE ? KS_ENGINE_BAD_TENANT : NULL;
    if (err == KS_OK) {
        err = ks_context_tmpl_render(v->tmpl, row, context, sizeof context, &context_len);
        name = err != KS_OK ? KS_ENGINE_BAD_CONTEXT : NULL;
    }
    if (err == KS_OK) {
        ks_open_params op = ks_engine_open_params(v->p, env, (ks_bytes){context, context_len},
                                                  tenant);
        err = ks_verify(v->ctx, env.ptr, env.len, &op, NULL);
    }
    if (err == KS_OK) {
        return KS_OK;
    }
    if (ks_err_is_retryable(err) || err == KS_ERR_NO_MEMORY || err == KS_ERR_INVALID_ARGUMENT ||
        err == KS_ERR_ALGORITHM_UNAVAILABLE) {
        return err;
    }
    fail_row(v, row, err, name != NULL ? name : ks_err_name(err));
    return KS_OK;
}

/* Consider one row (sampling first). */
static ks_err visit(verify_run *v, const ks_row *row)
{
    if (v->sample != 0 && v->sample < v->total) {
        uint32_t t = v->total > UINT32_MAX ? UINT32_MAX : (uint32_t)v->total;
        uint64_t s = v->sample * (uint64_t)t / v->total; /* scaled if total > 2^32 */
        if (randombytes_uniform(t) >= s) {
            return KS_OK;
        }
    }
    ks_bytes env;
    ks_err perr;
    int is_env = ks_engine_value_env(v->p->encoding, &row->value, &v->dec, &v->dec_cap, &env,
                                     &perr);
    if (perr == KS_ERR_NO_MEMORY) {
        return perr;
    }
    if (!is_env || ks_engine_outside_key(v->p, is_env, perr, env)) {
        v->res->skipped++;
        return KS_OK;
    }
    return check_row(v, row, env, perr);
}

/* The scan loop of verify, batch rows at a time into rows[0, batch). */
static ks_err scan_all(verify_run *v, const ks_rowstore *store, ks_row *rows, size_t batch)
{
    uint8_t *cur_buf = NULL;
    size_t cur_cap = 0;
    ks_value cursor = {KS_VALUE_NULL, 0, {NULL, 0}};
    ks_err err;
    for (;;) {
        size_t n = 0;
        err = store->ops->scan(store->self, &cursor, batch, rows, &n);
        if (err != KS_OK || n == 0) {
            break;
        }
        for (size_t i = 0; i < n && err == KS_OK; i++) {
            err = visit(v, &rows[i]);
        }
        if (err == KS_OK) {
            err = ks_engine_value_copy(&rows[n - 1].id, &cur_buf, &cur_cap, &cursor);
        }
        if (err != KS_OK) {
            break;
        }
    }
    free(cur_buf);
    return err;
}

/* See keyshift/migrate.h and the file comment. */
ks_err ks_migrate_verify(ks_ctx *ctx, const ks_rowstore *store, const ks_migrate_params *params,
                         uint64_t sample, ks_verify_failure_fn on_failure, void *arg,
                         ks_verify_result *out)
{
    if (ctx == NULL || store == NULL || store->ops == NULL || params == NULL || out == NULL ||
        (params->tenant.len != 0 && !ks_engine_name_ok(params->tenant)) ||
        (params->purpose.len != 0 && !ks_engine_name_ok(params->purpose))) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    memset(out, 0, sizeof *out);
    if (ks_value_encoding_name((int)params->encoding) == NULL ||
        params->encoding != store->encoding) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    verify_run v = {ctx, params, NULL, 0, sample, on_failure, arg, out, NULL, 0};
    ks_err err = store->ops->count(store->self, &v.total);
    if (err != KS_OK) {
        return err;
    }
    /* A table smaller than a batch gets a batch of its size (plus one
     * for a row inserted meanwhile): a full batch's rows array is past
     * malloc's mmap threshold, a system call pair on every verify of a
     * small table.  Rows inserted meanwhile only take more batches. */
    size_t batch = v.total < KS_ENGINE_SCAN_BATCH ? (size_t)v.total + 1 : KS_ENGINE_SCAN_BATCH;
    v.tmpl = malloc(sizeof *v.tmpl);
    ks_row *rows = malloc(batch * sizeof *rows);
    if (v.tmpl == NULL || rows == NULL) {
        err = KS_ERR_NO_MEMORY;
    }
    if (err == KS_OK) {
        err = ks_context_tmpl_compile(params->context_template, v.tmpl);
    }
    if (err == KS_OK) {
        err = ks_context_tmpl_check_store(v.tmpl, store);
    }
    if (err == KS_OK) {
        err = scan_all(&v, store, rows, batch);
    }
    free(v.tmpl);
    free(v.dec);
    free(rows);
    return err;
}
