/*
 * migrate/engine/migrate.c -- the re-encryption engine (keyshift/migrate.h
 * ks_migrate_run): the run, its checkpoint, the batch loop and the
 * writes.  Reading a batch and the helper thread are pipeline.c's, each
 * row's decision and new value rows.c's (the run's state: run.h).
 *
 * Semantics (docs/migration.md is written from this comment):
 *
 * Identity.  A migration is identified by its canonical parameter string
 * (ks_migrate_canonical_params: mode, target key and resolved version,
 * format and algorithm for encrypt/reencrypt, tenant, purpose, context
 * template).  A target version of 0 is resolved to the key's primary once,
 * at the first run, and then read back from the checkpoint, so a change of
 * primary during a migration does not split it.  The target version is
 * checked with the provider (ks_ctx_key_info) at every run.
 *
 * Checkpoint.  If the latest checkpoint of the store has other parameters
 * and is neither "complete" nor "superseded": KS_ERR_MISMATCH, unless
 * params->supersede, which first marks that one "superseded" in its own
 * transaction (a rollout's run: the rollout's target makes it obsolete,
 * and a paused run toward an old target could otherwise never be resumed
 * nor replaced).  Ours and "complete": a catch-up
 * pass (pass + 1, from the first row) that converts rows the application
 * wrote in the old form after the last pass went by, and that writes
 * nothing at all -- not even the checkpoint -- when every row is already
 * at the target, so running again after completion changes nothing.  Ours
 * and not complete ("running", "paused", "stopped"): resume after its
 * cursor in its pass.
 *
 * Batches.  Rows are scanned in id order after the cursor, batch_size at a
 * time, outside any transaction.  Every row's new value is computed and
 * verified first (provider calls happen outside the write lock); then one
 * write transaction does every compare-and-swap and quarantine of the
 * batch and saves the checkpoint (cursor = the batch's last id), and
 * commits.  Per row:
 *   - in quarantine (of this migration: see below) or NULL: nothing, not
 *     counted;
 *   - with params->from_key_id (a key-scoped rollout's run): plaintext and
 *     envelopes whose header names another key_id are skipped, never
 *     touched (another tenant's or rollout's key is not this run's to
 *     change); a value starting "KSE" whose header does not parse goes on
 *     to the rules below (quarantined);
 *   - tenant: params->tenant when set (a row that also carries a tenant
 *     value is a configuration error: KS_ERR_INVALID_ARGUMENT), else the
 *     row's tenant column; NULL or not [F-NAME-1]: quarantined "bad-tenant";
 *   - context: the template rendered for the row; longer than
 *     KS_CONTEXT_MAX: quarantined "bad-context";
 *   - encrypt: plaintext (INTEGER is sealed as its decimal text) is sealed
 *     under the target; an envelope already at (target key, version,
 *     format, algorithm) is skipped, as in reencrypt (the application's
 *     own writes under a rollout's target, say); any other parsing
 *     envelope is wrong_state; a value
 *     starting "KSE" that does not parse is quarantined under its parse
 *     error; a plaintext too large to seal is quarantined "too-large";
 *   - rewrap: an envelope whose key_id and key_version are the target's is
 *     skipped; another is rewrapped (ks_rewrap) and the result checked to
 *     carry the old nonce and ciphertext byte for byte and to open with the
 *     row's context, tenant and purpose (verify_rewrap: the plaintext is
 *     then the old one by construction); plaintext is wrong_state;
 *   - reencrypt: an envelope already at (target key, version, format,
 *     algorithm) is skipped; another is opened, sealed afresh, the result
 *     opened and compared; plaintext is wrong_state.
 *   A parse rejection or "auth-failed" while opening or rewrapping an old
 *   value quarantines the row under ks_err_name() of the error; it is
 *   never modified.  Quarantine error names are therefore ks_err_name()
 *   strings plus the engine's own "bad-tenant" and "bad-context" (the
 *   names ks_migrate_verify reports for the same rows).
 *   Quarantine belongs to the migration: once the parameters are settled
 *   the run binds them to the store (ks_rowstore_ops.bind_migration), so
 *   a row counts as "in quarantine" only when this migration put it
 *   there; a migration with other parameters (a corrected context,
 *   purpose or tenant) tries it again and quarantines it again, under its
 *   own parameters, only if it fails again.
 *   A CAS that does not swap (the application changed or deleted the row
 *   since the scan) counts the row as raced.
 *
 * Verification.  Every new value must parse and be at the target before
 * its UPDATE whatever no_verify says; unless no_verify, it is also opened
 * with the row's context and compared byte for byte with the old
 * plaintext.  A difference stops the run with KS_ERR_VERIFY_FAILED, nothing
 * of the batch written: it means a bug or faulty hardware, not bad data.
 *
 * Fail closed.  A provider error (unavailable, timeout, denied, revoked,
 * not-found, integrity), KS_ERR_ALGORITHM_UNAVAILABLE, KS_ERR_NO_MEMORY or
 * a store error (busy, full, store) stops the run: the batch is rolled
 * back (or was never begun) and the checkpoint of the last committed batch
 * stands; running again resumes there.
 *
 * Counts (ks_checkpoint).  done, raced and quarantined count events over
 * all passes; skipped and wrong_state count rows in pass 1 only (later
 * passes revisit every row to find the raced ones).  They add up every run
 * of the migration; the progress callback also gets this call's own
 * (ks_migrate_counts: the growth since the call began, and the
 * auth-failed share of its first batch).
 *
 * Passes.  At the end of a pass in which rows raced, a new pass starts
 * from the beginning (rows already at the target are skipped).  A pass
 * resumed mid-way after pass 1 is assumed to have raced (one harmless
 * extra pass at most).  One call runs at most KS_MIGRATE_MAX_PASSES new
 * passes; if rows still race, the checkpoint is saved "stopped" and
 * KS_ERR_BUSY returned (resumable: the rows keep changing underneath).
 *
 * Failure threshold.  processed = done + skipped + raced + quarantined +
 * wrong_state.  After each batch once processed >= KS_MIGRATE_RATE_MIN_ROWS,
 * and at the end of every pass whatever processed is, if quarantined >
 * rate * processed (rate = max_failure_rate, 0.001 when negative) the
 * checkpoint is saved "stopped" in the same transaction and
 * KS_ERR_THRESHOLD returned.  A rerun with the same rate stops again at
 * the end of the pass: raising max_failure_rate acknowledges the
 * quarantined rows.
 *
 * Stop.  *stop nonzero: the current batch is finished and committed with
 * state "paused"; KS_ERR_STOPPED.  Rate limit: after each batch the run
 * sleeps so that rows/elapsed stays at most max_rows_per_second.
 *
 * Pipeline.  Unless params->serial or the run is throttled
 * (max_rows_per_second: a batch scanned ahead would wait through the
 * sleep), a helper thread computes batch k+1 (decide, open, seal, verify:
 * the crypto) while the calling thread writes batch k; the calling thread
 * alone touches the store.  The helper starts on k+1 at k's COMMIT, whose
 * disk waits then hide its work, unless the last COMMIT was too short for
 * that (defer_ahead); then before k's compare-and-swaps.  Batch k+1 is
 * scanned after batch k's last id before k commits; its rows are disjoint
 * from k's and are written only by compare-and-swap against the values
 * scanned, so the writes, counts and checkpoints are exactly those of the
 * serial order.  If batch k fails, stops or trips the threshold, batch
 * k+1 is discarded unwritten (its provider calls and nonces are simply
 * spent).  See loop().
 *
 * Memory.  Two batches, each with a copy of its rows (ids, values,
 * tenants, context columns: copied once, from the store's row through
 * its visit_rows, or from its scan buffer), its decisions, its new values
 * and two plaintext buffers, are allocated once per run and grown only
 * when a batch needs more; plaintext is wiped after each use and every
 * buffer that held it is wiped before being freed (a grown copy of rows
 * too).
 *
 * Progress.  The target's rows are counted (for ks_migrate_progress's
 * total_rows) only when there is a progress callback: the count reads
 * every page of the table.
 *
 * Chunks.  ks_engine_run_slice (engine.h, for workers.c) runs the same
 * loop over one chunk of a chunked run: its rows are read with the
 * store's visit_rows_range within the chunk's ids, a new pass restarts
 * at the chunk's first id, the chunk's state stands for the checkpoint
 * (loaded by the caller's claim, not by load_checkpoint) and every save
 * goes to the chunk through the slice's callback, in the same
 * transaction as the batch it describes; a failing save (a chunk another
 * worker took over) rolls the batch back like any failed write.  There
 * is no catch-up pass and no count of the table.  With no slice nothing
 * of this applies.
 */
#define _POSIX_C_SOURCE 200809L
#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <sodium.h>

#include "engine.h"
#include "run.h"
#include "../alloc_hook.h"

_Static_assert(KS_PARAMS_MAX <= KS_ROWSTORE_PARAMS_MAX,
               "a store keeps every canonical parameter string");

#define KS_MIGRATE_MAX_PASSES 10
#define KS_MIGRATE_RATE_MIN_ROWS 100

static const char ST_RUNNING[] = "running", ST_PAUSED[] = "paused", ST_STOPPED[] = "stopped",
                  ST_COMPLETE[] = "complete", ST_SUPERSEDED[] = "superseded";

/* A ks_bytes of a static string. */
static ks_bytes sbytes(const char *s)
{
    return (ks_bytes){(const uint8_t *)s, strlen(s)};
}

/* See keyshift/migrate.h. */
const char *ks_migrate_mode_name(int mode)
{
    switch (mode) {
    case KS_MIGRATE_ENCRYPT: return "encrypt";
    case KS_MIGRATE_REWRAP: return "rewrap";
    case KS_MIGRATE_REENCRYPT: return "reencrypt";
    default: return NULL;
    }
}

/* Check params before anything is read: names, format and purpose. */
static ks_err check_params(const ks_migrate_params *p)
{
    if (ks_migrate_mode_name((int)p->mode) == NULL || p->to_key_id.len == 0 ||
        p->to_key_id.ptr == NULL || p->to_key_id.len > KS_KEY_ID_MAX ||
        p->context_template.len > KS_CONTEXT_TEMPLATE_MAX ||
        (p->tenant.len != 0 && !ks_engine_name_ok(p->tenant)) ||
        (p->purpose.len != 0 && !ks_engine_name_ok(p->purpose)) ||
        !ks_engine_batch_params_ok(p) || p->max_failure_rate > 1.0 ||
        p->from_key_id.len > KS_KEY_ID_MAX || (p->from_key_id.len != 0 && p->from_key_id.ptr == NULL) ||
        (p->from_key_id.len != 0 && p->mode == KS_MIGRATE_ENCRYPT)) {
        return KS_ERR_INVALID_ARGUMENT; /* encrypt reads plaintext, which has no key */
    }
    if (p->mode != KS_MIGRATE_REWRAP) {
        uint8_t f = p->to_format ? p->to_format : KS_FORMAT_V2;
        uint32_t a = p->algorithm ? p->algorithm : KS_ALG_XCHACHA20POLY1305;
        if ((f != KS_FORMAT_V1 && f != KS_FORMAT_V2) || ks_alg_name(a) == NULL ||
            (f == KS_FORMAT_V2 && p->purpose.len == 0) || (f == KS_FORMAT_V1 && p->purpose.len != 0)) {
            return KS_ERR_INVALID_ARGUMENT;
        }
    }
    return KS_OK;
}

/* The target version recorded in a canonical string (";version=N;"), or 0. */
static uint32_t recorded_version(ks_bytes params)
{
    static const char key[] = ";version=";
    size_t kl = sizeof key - 1;
    for (size_t i = 0; i + kl < params.len; i++) {
        if (memcmp(params.ptr + i, key, kl) == 0) {
            uint64_t v = 0;
            size_t j = i + kl;
            for (; j < params.len && params.ptr[j] >= '0' && params.ptr[j] <= '9' && v <= UINT32_MAX; j++) {
                v = v * 10 + (uint64_t)(params.ptr[j] - '0');
            }
            return (j < params.len && params.ptr[j] == ';' && v <= UINT32_MAX) ? (uint32_t)v : 0;
        }
    }
    return 0;
}

/* Compute r->params for version v. */
static ks_err make_params(run *r, uint32_t v)
{
    return ks_migrate_canonical_params(r->p, v, r->params, sizeof r->params, &r->params_len);
}

static ks_err save_alone(run *r, const ks_checkpoint *cp);

/* Mark other, an unfinished checkpoint with other parameters, superseded
 * (params->supersede): its params and cursor are copied first, since the
 * views of a loaded checkpoint last only until the store's next call. */
static ks_err supersede(run *r, const ks_checkpoint *other)
{
    ks_checkpoint old = *other;
    uint8_t *pbuf = malloc(other->params.len + 1), *cbuf = NULL;
    size_t ccap = 0;
    if (pbuf == NULL) {
        return KS_ERR_NO_MEMORY;
    }
    memcpy(pbuf, other->params.ptr, other->params.len);
    old.params = (ks_bytes){pbuf, other->params.len};
    ks_err err = ks_engine_value_copy(&other->cursor, &cbuf, &ccap, &old.cursor);
    if (err == KS_OK) {
        old.state = sbytes(ST_SUPERSEDED);
        old.updated = (int64_t)time(NULL);
        err = save_alone(r, &old);
    }
    free(pbuf);
    free(cbuf);
    return err;
}

/*
 * Settle the target version and the checkpoint: fills r->to_version,
 * r->params and r->cp (a fresh one, or the loaded one with its cursor
 * copied).  *complete is set when our checkpoint is already complete.
 */
static ks_err load_checkpoint(run *r, int *complete)
{
    ks_checkpoint latest;
    ks_err err = r->st->ops->checkpoint_load(r->st->self, (ks_bytes){NULL, 0}, &latest);
    if (err != KS_OK && err != KS_ERR_NOT_FOUND) {
        return err;
    }
    int have_latest = err == KS_OK;
    uint32_t v = r->p->to_key_version;
    if (v == 0 && have_latest) {
        uint32_t rec = recorded_version(latest.params);
        if (rec != 0 && make_params(r, rec) == KS_OK &&
            bytes_eq(latest.params, (ks_bytes){(const uint8_t *)r->params, r->params_len})) {
            v = rec; /* resume with the primary pinned at the first run */
        }
    }
    ks_key_info info;
    err = ks_ctx_key_info(r->ctx, r->p->to_key_id, v, &info);
    if (err != KS_OK) {
        return err;
    }
    r->to_version = info.version;
    err = make_params(r, r->to_version);
    if (err != KS_OK) {
        return err;
    }
    ks_bytes mine = {(const uint8_t *)r->params, r->params_len};
    err = r->st->ops->checkpoint_load(r->st->self, mine, &latest);
    if (err == KS_ERR_NOT_FOUND) {
        /* Ours does not exist: refuse if another unfinished one does. */
        ks_checkpoint other;
        err = r->st->ops->checkpoint_load(r->st->self, (ks_bytes){NULL, 0}, &other);
        if (err == KS_OK && !bytes_eq(other.state, sbytes(ST_COMPLETE)) &&
            !bytes_eq(other.state, sbytes(ST_SUPERSEDED))) {
            if (!r->p->supersede) {
                return KS_ERR_MISMATCH;
            }
            err = supersede(r, &other);
            if (err != KS_OK) {
                return err;
            }
        }
        if (err != KS_OK && err != KS_ERR_NOT_FOUND) {
            return err;
        }
        int64_t now = (int64_t)time(NULL);
        r->cp = (ks_checkpoint){.params = mine, .state = sbytes(ST_RUNNING),
                                .cursor = {KS_VALUE_NULL, 0, {NULL, 0}}, .pass = 1,
                                .started = now, .updated = now};
        return KS_OK;
    }
    if (err != KS_OK) {
        return err;
    }
    *complete = bytes_eq(latest.state, sbytes(ST_COMPLETE));
    ks_value cursor;
    err = ks_engine_value_copy(&latest.cursor, &r->cur_buf, &r->cur_cap, &cursor);
    if (err != KS_OK) {
        return err;
    }
    r->cp = latest;
    r->cp.params = mine;
    r->cp.cursor = cursor;
    r->cp.state = sbytes(ST_RUNNING);
    r->cp.finished = 0;
    if (r->cp.pass == 0) {
        r->cp.pass = 1;
    }
    return KS_OK;
}

/* Allocate the per-run buffers. */
static ks_err alloc_run(run *r)
{
    r->tmpl = malloc(sizeof *r->tmpl);
    r->rows = calloc(r->batch, sizeof *r->rows);
    if (r->tmpl == NULL || r->rows == NULL) {
        return KS_ERR_NO_MEMORY;
    }
    if (r->st->ops->cas_batch != NULL) {
        r->cas_ids = calloc(r->batch, sizeof *r->cas_ids);
        r->cas_olds = calloc(r->batch, sizeof *r->cas_olds);
        r->cas_news = calloc(r->batch, sizeof *r->cas_news);
        r->cas_swapped = calloc(r->batch, sizeof *r->cas_swapped);
        if (r->cas_ids == NULL || r->cas_olds == NULL || r->cas_news == NULL ||
            r->cas_swapped == NULL) {
            return KS_ERR_NO_MEMORY;
        }
    }
    for (size_t k = 0; k < 2; k++) {
        batch *b = &r->b[k];
        b->r = r;
        b->rows = calloc(r->batch, sizeof *b->rows);
        b->slots = calloc(r->batch, sizeof *b->slots);
        if (b->rows == NULL || b->slots == NULL) {
            return KS_ERR_NO_MEMORY;
        }
    }
    if (ks_value_encoding_name((int)r->p->encoding) == NULL || r->p->encoding != r->st->encoding) {
        return KS_ERR_INVALID_ARGUMENT; /* the store reads and writes the column otherwise */
    }
    ks_err err = ks_context_tmpl_compile(r->p->context_template, r->tmpl);
    return err == KS_OK ? ks_context_tmpl_check_store(r->tmpl, r->st) : err;
}

/* Wipe what may hold plaintext in b once the batch is done: the copied
 * rows when they are plaintext (encrypt mode: in the other modes they are
 * envelopes) and the plaintext buffers (already wiped after each use; a
 * second wipe of a few KiB is cheap insurance).  Only the bytes this batch
 * used: every earlier batch wiped its own, and free_run wipes all. */
static void wipe_batch(batch *b)
{
    if (b->keep != NULL && b->r->p->mode == KS_MIGRATE_ENCRYPT) {
        sodium_memzero(b->keep, b->keep_len);
    }
    if (b->pt != NULL) {
        sodium_memzero(b->pt, b->pt_cap);
    }
    if (b->pt2 != NULL) {
        sodium_memzero(b->pt2, b->pt_cap);
    }
    b->keep_len = 0;
}

/* Wipe and free what alloc_run and the batches allocated, once the
 * helper thread is stopped.  No batch is being computed (every path
 * collects it first). */
static void free_run(run *r)
{
    ks_engine_helper_stop(r);
    for (size_t k = 0; k < 2; k++) {
        batch *b = &r->b[k];
        assert(!b->running);
        if (b->keep != NULL) {
            sodium_memzero(b->keep, b->keep_cap);
        }
        if (b->pt != NULL) {
            sodium_memzero(b->pt, b->pt_cap);
            sodium_memzero(b->pt2, b->pt_cap);
        }
        free(b->keep);
        free(b->neu);
        free(b->dec);
        free(b->pt);
        free(b->pt2);
        free(b->slots);
        free(b->rows);
    }
    free(r->cur_buf);
    free(r->rows);
    free(r->cas_ids);
    free(r->cas_olds);
    free(r->cas_news);
    free(r->cas_swapped);
    free(r->tmpl);
}

/* Nonzero when the failure rate of cp is over the limit; `force` checks
 * even below KS_MIGRATE_RATE_MIN_ROWS processed rows (end of a pass). */
static int over_threshold(const run *r, const ks_checkpoint *cp, int force)
{
    uint64_t processed = cp->done + cp->skipped + cp->raced + cp->quarantined + cp->wrong_state;
    double rate = r->p->max_failure_rate < 0 ? 0.001 : r->p->max_failure_rate;
    if (processed == 0 || (!force && processed < KS_MIGRATE_RATE_MIN_ROWS)) {
        return 0;
    }
    return (double)cp->quarantined > rate * (double)processed;
}

/* Inside the write transaction: save cp where the run keeps its state:
 * the store's checkpoint, or a chunked run's chunk (its slice's save). */
static ks_err save_cp(const run *r, const ks_checkpoint *cp)
{
    if (r->slice != NULL) {
        return r->slice->save(r->slice->save_arg, cp);
    }
    return r->st->ops->checkpoint_save(r->st->self, cp);
}

/* Save cp through save_cp (r NULL: the store's checkpoint_save) in its
 * own transaction of st (ends of passes, final states). */
static ks_err save_in_txn(const run *r, const ks_rowstore *st, const ks_checkpoint *cp)
{
    ks_err err = st->ops->begin(st->self);
    if (err == KS_OK) {
        err = r != NULL ? save_cp(r, cp) : st->ops->checkpoint_save(st->self, cp);
    }
    if (err == KS_OK) {
        err = st->ops->commit(st->self);
    }
    if (err != KS_OK) {
        st->ops->rollback(st->self);
    }
    return err;
}

/* Save cp in its own transaction (ends of passes, final states). */
static ks_err save_alone(run *r, const ks_checkpoint *cp)
{
    return save_in_txn(r, r->st, cp);
}

/* See engine.h. */
ks_err ks_engine_save_alone(const ks_rowstore *store, const ks_checkpoint *cp)
{
    return save_in_txn(NULL, store, cp);
}

/* Inside apply_batch's transaction, through the store's cas_batch: every
 * compare-and-swap of b in one call (one round trip for a remote
 * database), counted into next from the store's per-row answers exactly
 * as apply_batch counts cas's. */
static ks_err cas_all(run *r, const batch *b, ks_checkpoint *next)
{
    size_t n = 0;
    for (size_t i = 0; i < b->n; i++) {
        const slot *s = &b->slots[i];
        if (s->act == ACT_WRITE) {
            r->cas_ids[n] = &b->rows[i].id;
            r->cas_olds[n] = &b->rows[i].value;
            r->cas_news[n] = (ks_bytes){b->neu + s->new_off, s->new_len};
            n++;
        }
    }
    if (n == 0) {
        return KS_OK;
    }
    ks_err err = r->st->ops->cas_batch(r->st->self, n, r->cas_ids, r->cas_olds, r->cas_news,
                                       r->cas_swapped);
    for (size_t k = 0; k < n && err == KS_OK; k++) {
        r->cas_swapped[k] ? next->done++ : next->raced++;
    }
    return err;
}

/* Write the computed batch b and the checkpoint next in one transaction.
 * next's counts are updated here; r->cp takes next only on commit.  When
 * `deferred` is not NULL, its computation starts once every write of the
 * transaction is done, right before the COMMIT (see loop()). */
static ks_err apply_batch(run *r, const batch *b, ks_checkpoint *next, batch *deferred)
{
    const ks_rowstore_ops *ops = r->st->ops;
    ks_err err = ops->begin(r->st->self);
    int batched = ops->cas_batch != NULL;
    if (err == KS_OK && batched) {
        err = cas_all(r, b, next);
    }
    for (size_t i = 0; i < b->n && err == KS_OK; i++) {
        const slot *s = &b->slots[i];
        const ks_row *row = &b->rows[i];
        int swapped = 0;
        switch (s->act) {
        case ACT_WRITE:
            if (batched) {
                break; /* cas_all did it */
            }
            err = ops->cas(r->st->self, &row->id, &row->value,
                           (ks_bytes){b->neu + s->new_off, s->new_len}, &swapped);
            if (err == KS_OK) {
                swapped ? next->done++ : next->raced++;
            }
            break;
        case ACT_QUARANTINE:
            assert(s->qerr != NULL);
            err = ops->quarantine(r->st->self, &row->id, s->qerr);
            next->quarantined += err == KS_OK;
            break;
        case ACT_SKIP:
            next->skipped += next->pass == 1;
            break;
        case ACT_WRONG:
            next->wrong_state += next->pass == 1;
            break;
        case ACT_NONE:
            break;
        }
    }
    if (err == KS_OK) {
        err = save_cp(r, next);
    }
    if (err == KS_OK) {
        if (deferred != NULL) {
            ks_engine_start_batch(deferred);
        }
        struct timespec t0;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        err = ops->commit(r->st->self);
        r->commit_s = elapsed_s(&t0);
    }
    if (err != KS_OK) {
        ops->rollback(r->st->self);
    }
    return err;
}

/* After batch b committed: count this call's rows quarantined
 * "auth-failed", and for its first batch that looked at any row, how
 * many rows it looked at and how many of them failed so. */
static void tally(run *r, const batch *b)
{
    const char *af = ks_err_name(KS_ERR_AUTH_FAILED);
    uint64_t looked = 0, auth = 0;
    for (size_t i = 0; i < b->n; i++) {
        const slot *s = &b->slots[i];
        looked += s->act != ACT_NONE;
        auth += s->act == ACT_QUARANTINE && strcmp(s->qerr, af) == 0;
    }
    r->mine.auth_failed += auth;
    if (r->mine.first_batch_rows == 0) {
        r->mine.first_batch_rows = looked;
        r->mine.first_batch_auth_failed = auth;
    }
}

/* Sleep so that this run's rows per second stays within the limit. */
static void throttle(const run *r)
{
    uint32_t rps = r->p->max_rows_per_second;
    if (rps == 0) {
        return;
    }
    double want = (double)r->rows_this_run / (double)rps, have = elapsed_s(&r->t0);
    if (want <= have) {
        return;
    }
    double d = want - have;
    struct timespec ts = {(time_t)d, (long)((d - (double)(time_t)d) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* Nonzero when some row of b would be written or quarantined. */
static int batch_changes(const batch *b)
{
    for (size_t i = 0; i < b->n; i++) {
        if (b->slots[i].act == ACT_WRITE || b->slots[i].act == ACT_QUARANTINE) {
            return 1;
        }
    }
    return 0;
}

/*
 * Write the computed, non-empty batch b: its compare-and-swaps and
 * quarantines and the checkpoint (cursor = its last id) in one
 * transaction.  Returns KS_ERR_STOPPED / KS_ERR_THRESHOLD after committing
 * with that state.  A catch-up pass skips the commit of a batch with
 * nothing to write.  b's copies are wiped either way.  `deferred` (or
 * NULL): the next batch, whose computation starts right before the COMMIT
 * (apply_batch), or at once when there is nothing to commit; by a
 * successful return it has started.
 */
static ks_err commit_batch(run *r, batch *b, volatile sig_atomic_t *stop, batch *deferred)
{
    assert(b->n > 0 && !b->running);
    const ks_value *last = &b->rows[b->n - 1].id;
    int stopping = (stop != NULL && *stop != 0) ||
                   (r->slice != NULL && r->slice->halt != NULL &&
                    atomic_load_explicit(r->slice->halt, memory_order_relaxed) != 0);
    ks_err err;
    if (r->catchup && !r->catchup_wrote && !batch_changes(b)) {
        /* A catch-up pass with nothing to write: advance in memory only. */
        if (deferred != NULL) {
            ks_engine_start_batch(deferred);
        }
        r->rows_this_run += b->n;
        err = ks_engine_value_copy(last, &r->cur_buf, &r->cur_cap, &r->cp.cursor);
        wipe_batch(b);
        return err != KS_OK ? err : stopping ? KS_ERR_STOPPED : KS_OK;
    }
    ks_checkpoint next = r->cp;
    next.cursor = *last;
    next.updated = (int64_t)time(NULL);
    /* Counts are settled inside apply_batch; the state must be chosen
     * before the save, so decide the threshold on the counts it will
     * save: do a dry count first. */
    ks_checkpoint dry = next;
    for (size_t i = 0; i < b->n; i++) {
        const slot *s = &b->slots[i];
        dry.quarantined += s->act == ACT_QUARANTINE;
        dry.done += s->act == ACT_WRITE; /* raced or done: both processed */
        dry.skipped += s->act == ACT_SKIP && dry.pass == 1;
        dry.wrong_state += s->act == ACT_WRONG && dry.pass == 1;
    }
    int over = over_threshold(r, &dry, 0);
    next.state = sbytes(over ? ST_STOPPED : stopping ? ST_PAUSED : ST_RUNNING);
    next.finished = over ? next.updated : 0;
    err = apply_batch(r, b, &next, deferred);
    if (err == KS_OK) {
        tally(r, b);
        r->catchup_wrote = 1;
        r->cp = next;
        err = ks_engine_value_copy(&next.cursor, &r->cur_buf, &r->cur_cap, &r->cp.cursor);
        r->rows_this_run += b->n;
    }
    wipe_batch(b); /* old plaintext values; next.cursor pointed into b until copied */
    if (err != KS_OK) {
        return err;
    }
    return over ? KS_ERR_THRESHOLD : stopping ? KS_ERR_STOPPED : KS_OK;
}

/* The end of a pass: complete, a new pass, or a stop. *again is set when
 * a new pass starts. */
static ks_err end_pass(run *r, unsigned *passes_run, int *again)
{
    if (r->catchup && !r->catchup_wrote) {
        *again = 0;
        return KS_OK; /* nothing changed: the checkpoint stays complete, untouched */
    }
    ks_checkpoint next = r->cp;
    next.updated = (int64_t)time(NULL);
    *again = 0;
    ks_err ret = KS_OK;
    if (over_threshold(r, &next, 1)) {
        next.state = sbytes(ST_STOPPED);
        next.finished = next.updated;
        ret = KS_ERR_THRESHOLD;
    } else if (next.raced > r->pass_raced_start) {
        if (++*passes_run >= KS_MIGRATE_MAX_PASSES) {
            next.state = sbytes(ST_STOPPED);
            next.finished = next.updated;
            ret = KS_ERR_BUSY;
        } else {
            next.pass++;
            next.cursor = (ks_value){KS_VALUE_NULL, 0, {NULL, 0}};
            *again = 1;
        }
    } else {
        next.state = sbytes(ST_COMPLETE);
        next.finished = next.updated;
    }
    ks_err err = save_alone(r, &next);
    if (err != KS_OK) {
        return err;
    }
    r->cp = next;
    r->pass_raced_start = next.raced;
    return ret;
}

/* Report progress after a commit: the checkpoint, and this call's own
 * counts (its growth since the call began). */
static void report(const run *r, ks_migrate_progress_fn fn, void *arg, uint64_t total, size_t n)
{
    if (fn != NULL) {
        ks_migrate_counts c = r->mine;
        c.done = r->cp.done - r->base.done;
        c.skipped = r->cp.skipped - r->base.skipped;
        c.raced = r->cp.raced - r->base.raced;
        c.quarantined = r->cp.quarantined - r->base.quarantined;
        c.wrong_state = r->cp.wrong_state - r->base.wrong_state;
        ks_migrate_progress pr = {&r->cp, total, n, elapsed_s(&r->t0), c};
        fn(arg, &pr);
    }
}

/* Stop the pipeline: wait for b (the batch computed ahead) and wipe it;
 * err is passed through. */
static ks_err drop_ahead(batch *b, ks_err err)
{
    (void)ks_engine_finish_batch(b);
    wipe_batch(b);
    b->n = 0;
    return err;
}

/*
 * Nonzero when the batch computed ahead should start only at the COMMIT
 * of the batch being written, not before its compare-and-swaps: when the
 * last COMMIT and the read of the next batch that follows it took at
 * least as long as computing the last batch (so the helper still
 * finishes about when the calling thread needs it).  A COMMIT is mostly
 * waiting for the disk (the journal's and the database's syncs), so the
 * helper's AEAD work then runs while the calling thread sleeps, instead
 * of beside its compare-and-swaps, which it slows: the two threads share
 * caches and memory bandwidth (and on a virtual machine maybe a physical
 * core; measured in docs/PERFORMANCE.md).  Where commits are quick (WAL
 * with synchronous=NORMAL, a fast disk) the helper starts before the
 * compare-and-swaps, so that it still finishes in time.
 */
static int defer_ahead(const run *r)
{
    return r->commit_s + r->fetch_s >= r->compute_s;
}

/*
 * The batch loop over passes, after the checkpoint is settled.
 *
 * Pipeline: while batch k is being computed (on the helper thread unless
 * params->serial), the calling thread scans batch k+1; then it starts
 * computing k+1 (at once, or at k's COMMIT: defer_ahead) and, meanwhile,
 * writes k.  Only the calling thread touches
 * the store, and the helper only the batch it was given and the ks_ctx.
 * Batch k+1 is scanned before k commits, which is safe: the ids are
 * disjoint, k+1's rows are written only by compare-and-swap against the
 * values scanned, and the checkpoint moves batch by batch in order.  If k
 * fails, stops or trips the threshold, k+1 is discarded unwritten.
 */
static ks_err loop(run *r, volatile sig_atomic_t *stop, ks_migrate_progress_fn fn, void *arg)
{
    /* The total is for progress reports only: without a callback to
     * report to, no count (it reads every page of the table). */
    uint64_t total = 0;
    ks_err err = fn != NULL && r->slice == NULL ? r->st->ops->count(r->st->self, &total) : KS_OK;
    if (err != KS_OK) {
        return err;
    }
    r->base = r->cp;
    /* pass 1 starts with 0 raced; a later pass resumed mid-way is assumed raced */
    r->pass_raced_start = r->cp.pass == 1 ? 0 : (r->cp.cursor.type == KS_VALUE_NULL ? r->cp.raced : 0);
    unsigned passes_run = 0;
    batch *cur = &r->b[0], *ahead = &r->b[1];
    int pipelined = ks_engine_pipelines(r);
    struct timespec mark; /* the start of the batch being timed (batch_target_ms) */
    clock_gettime(CLOCK_MONOTONIC, &mark);
    err = ks_engine_fetch_batch(r, &r->cp.cursor, cur);
    if (err != KS_OK) {
        return err;
    }
    ks_engine_start_batch(cur);
    for (;;) {
        if (cur->n == 0) {
            int again = 0;
            err = end_pass(r, &passes_run, &again);
            report(r, fn, arg, total, 0);
            if (err != KS_OK || !again) {
                return err;
            }
            clock_gettime(CLOCK_MONOTONIC, &mark);
            err = ks_engine_fetch_batch(r, &r->cp.cursor, cur);
            if (err != KS_OK) {
                return err;
            }
            ks_engine_start_batch(cur);
            continue;
        }
        if (pipelined) {
            err = ks_engine_fetch_batch(r, &cur->rows[cur->n - 1].id, ahead);
            if (err != KS_OK) {
                (void)drop_ahead(cur, err);
                return err;
            }
        }
        err = ks_engine_finish_batch(cur);
        if (err != KS_OK) {
            wipe_batch(cur);
            return drop_ahead(ahead, err);
        }
        r->compute_s = cur->compute_s;
        batch *deferred = NULL;
        if (pipelined && defer_ahead(r)) {
            deferred = ahead;
        } else if (pipelined) {
            ks_engine_start_batch(ahead);
        }
        size_t n = cur->n;
        err = commit_batch(r, cur, stop, deferred);
        if (err == KS_OK) {
            /* the batch's time, before the callback and the throttle, which
             * may pause: only the batch itself counts */
            (void)ks_engine_batch_next(r->sizer, n, elapsed_s(&mark));
        }
        if (err == KS_OK || err == KS_ERR_STOPPED || err == KS_ERR_THRESHOLD) {
            report(r, fn, arg, total, n);
        }
        if (err != KS_OK) {
            return drop_ahead(ahead, err);
        }
        throttle(r);
        clock_gettime(CLOCK_MONOTONIC, &mark);
        if (!pipelined) {
            err = ks_engine_fetch_batch(r, &r->cp.cursor, ahead);
            if (err != KS_OK) {
                return err;
            }
            ks_engine_start_batch(ahead);
        }
        batch *t = cur;
        cur = ahead;
        ahead = t;
    }
}

/* Tie the store's quarantine to this migration's settled parameters
 * (see "Quarantine belongs to the migration" in the file comment); a
 * store without the operation keeps its quarantine per column. */
static ks_err bind_params(const run *r)
{
    if (r->st->ops->bind_migration == NULL) {
        return KS_OK;
    }
    return r->st->ops->bind_migration(r->st->self,
                                      (ks_bytes){(const uint8_t *)r->params, r->params_len});
}

/* Make a run of params on store (NULL: out of memory or bad
 * arguments, *err set): its buffers allocated. */
static run *run_new(ks_ctx *ctx, const ks_rowstore *store, const ks_migrate_params *params,
                    ks_err *err)
{
    if (ctx == NULL || store == NULL || store->ops == NULL || params == NULL) {
        *err = KS_ERR_INVALID_ARGUMENT;
        return NULL;
    }
    *err = check_params(params);
    if (*err != KS_OK) {
        return NULL;
    }
    run *r = calloc(1, sizeof *r);
    if (r == NULL) {
        *err = KS_ERR_NO_MEMORY;
        return NULL;
    }
    r->ctx = ctx;
    r->st = store;
    r->p = params;
    r->format = params->to_format ? params->to_format : KS_FORMAT_V2;
    r->alg = params->algorithm ? params->algorithm : KS_ALG_XCHACHA20POLY1305;
    ks_engine_batch_init(&r->own_sizer, params);
    r->sizer = &r->own_sizer;
    r->batch = ks_engine_batch_capacity(r->sizer);
    clock_gettime(CLOCK_MONOTONIC, &r->t0);
    *err = alloc_run(r);
    return r;
}

/* Wipe, free and forget r. */
static void run_free(run *r)
{
    if (r != NULL) {
        free_run(r);
        free(r);
    }
}

/* See keyshift/migrate.h and the file comment. */
ks_err ks_migrate_run(ks_ctx *ctx, const ks_rowstore *store, const ks_migrate_params *params,
                      volatile sig_atomic_t *stop, ks_migrate_progress_fn progress, void *progress_arg,
                      ks_checkpoint *out)
{
    ks_err err;
    run *r = run_new(ctx, store, params, &err);
    if (r == NULL) {
        return err;
    }
    int complete = 0;
    if (err == KS_OK) {
        err = load_checkpoint(r, &complete);
    }
    if (err == KS_OK) {
        err = bind_params(r);
    }
    if (err == KS_OK && complete) {
        r->catchup = 1;
        r->cp.pass++;
        r->cp.cursor = (ks_value){KS_VALUE_NULL, 0, {NULL, 0}};
    }
    if (err == KS_OK) {
        err = loop(r, stop, progress, progress_arg);
    }
    if (out != NULL) {
        /* Hand back the store's copy: ours dies with r. */
        ks_bytes mine = {(const uint8_t *)r->params, r->params_len};
        if (r->params_len == 0 ||
            store->ops->checkpoint_load(store->self, mine, out) != KS_OK) {
            memset(out, 0, sizeof *out);
        }
    }
    run_free(r);
    return err;
}

/* See engine.h. */
ks_err ks_engine_settle(ks_ctx *ctx, const ks_rowstore *store, const ks_migrate_params *params,
                        ks_engine_settled *out)
{
    ks_err err;
    run *r = run_new(ctx, store, params, &err);
    if (r == NULL) {
        return err;
    }
    memset(out, 0, sizeof *out);
    if (err == KS_OK) {
        err = load_checkpoint(r, &out->complete);
    }
    if (err == KS_OK && !out->complete) {
        r->cp.updated = (int64_t)time(NULL);
        err = save_alone(r, &r->cp); /* "running": ours, seen by single runs and status */
    }
    if (err == KS_OK) {
        out->to_version = r->to_version;
        memcpy(out->params, r->params, r->params_len);
        out->params_len = r->params_len;
        out->started = r->cp.started;
    }
    run_free(r);
    return err;
}

/* See engine.h: the chunk's state stands for the checkpoint. */
ks_err ks_engine_run_slice(ks_ctx *ctx, const ks_rowstore *store, const ks_migrate_params *params,
                           const ks_engine_slice *slice, volatile sig_atomic_t *stop,
                           ks_migrate_progress_fn progress, void *progress_arg)
{
    if (slice == NULL || slice->start == NULL || slice->save == NULL || slice->lo > slice->hi ||
        store == NULL || store->ops == NULL || store->ops->visit_rows_range == NULL) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    ks_err err;
    run *r = run_new(ctx, store, params, &err);
    if (r == NULL) {
        return err;
    }
    r->slice = slice;
    if (slice->sizer != NULL) {
        /* the worker's sizer, set up from the same params: the same capacity */
        assert(ks_engine_batch_capacity(slice->sizer) == r->batch);
        r->sizer = slice->sizer;
    }
    r->to_version = slice->to_version;
    if (err == KS_OK) {
        err = make_params(r, r->to_version);
    }
    if (err == KS_OK) {
        err = bind_params(r);
    }
    if (err == KS_OK) {
        r->cp = *slice->start;
        err = ks_engine_value_copy(&slice->start->cursor, &r->cur_buf, &r->cur_cap, &r->cp.cursor);
    }
    if (err == KS_OK) {
        r->cp.params = (ks_bytes){(const uint8_t *)r->params, r->params_len};
        r->cp.state = sbytes(ST_RUNNING);
        r->cp.finished = 0;
        r->cp.pass = r->cp.pass == 0 ? 1 : r->cp.pass;
        err = loop(r, stop, progress, progress_arg);
    }
    run_free(r);
    return err;
}

