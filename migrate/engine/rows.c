/*
 * migrate/engine/rows.c -- what the re-encryption engine does with each
 * row of a batch ("Batches" and the modes in migrate.c's file comment):
 * skip it, leave it in the wrong state, quarantine it, or write its new
 * value, which is opened back and checked before it is kept.  Touches
 * only the batch, the run's read-only parameters and the ks_ctx, never
 * the store, so it runs on the helper thread too (run.h).
 */
#define _POSIX_C_SOURCE 200809L
#include <assert.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <sodium.h>

#include "engine.h"
#include "run.h"
#include "../alloc_hook.h"

/*
 * Make the two plaintext buffers of b hold at least need bytes.  Called
 * at the start of computing a batch, when they hold no plaintext (every
 * use wipes them), so the old ones are simply wiped and freed.  A
 * plaintext is never longer than the value it comes from or goes to, so
 * the batch's longest value bounds it; sizing by it keeps small rows from
 * paying for 1 MiB buffers (and their wipes).
 */
static ks_err ensure_pt(batch *b, size_t need)
{
    if (need <= b->pt_cap) {
        return KS_OK;
    }
    size_t cap = need < 4096 ? 4096 : need;
    if (b->pt != NULL) {
        sodium_memzero(b->pt, b->pt_cap);
    }
    if (b->pt2 != NULL) {
        sodium_memzero(b->pt2, b->pt_cap);
    }
    free(b->pt);
    free(b->pt2);
    b->pt = malloc(cap);
    b->pt2 = malloc(cap);
    b->pt_cap = b->pt != NULL && b->pt2 != NULL ? cap : 0;
    return b->pt_cap != 0 ? KS_OK : KS_ERR_NO_MEMORY;
}

/* The quarantine name for an error met while reading an old value, or
 * NULL when the error is not the row's fault (the run must stop). */
static const char *row_fault(ks_err err)
{
    if (ks_err_is_rejection(err) || err == KS_ERR_AUTH_FAILED) {
        return ks_err_name(err);
    }
    return NULL;
}

/* Per-row inputs: the row's tenant and context. */
typedef struct row_in {
    ks_bytes tenant;
    uint8_t context[KS_CONTEXT_MAX];
    size_t context_len;
} row_in;

/* What the row's reader expects of env: its context and tenant, and the
 * purpose when env is of format 2. */
static ks_open_params row_params(const batch *b, const row_in *in, ks_bytes env)
{
    return ks_engine_open_params(b->r->p, env, (ks_bytes){in->context, in->context_len}, in->tenant);
}

/* Open env (an old or a new value) into buf (b->pt_cap) as the row's
 * reader would. */
static ks_err open_into(batch *b, const row_in *in, ks_bytes env, uint8_t *buf, size_t *len)
{
    ks_open_params op = row_params(b, in, env);
    return ks_open(b->r->ctx, env.ptr, env.len, &op, buf, b->pt_cap, len, NULL);
}

/* Check that env opens as the row's reader would open it, without
 * decrypting (ks_verify). */
static ks_err check_opens(const batch *b, const row_in *in, ks_bytes env)
{
    ks_open_params op = row_params(b, in, env);
    return ks_verify(b->r->ctx, env.ptr, env.len, &op, NULL);
}

/* Nonzero when a[0, n) equals b[0, n), in time that depends on n only: a
 * word-wise OR of XORs with no early exit.  sodium_memcmp compares a byte
 * at a time through volatile pointers, about 2 ns per byte here: for a
 * 2 KiB value it cost more than the AEAD that produced it. */
static int same_bytes(const uint8_t *a, const uint8_t *b, size_t n)
{
    uint64_t acc = 0;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t x, y;
        memcpy(&x, a + i, 8);
        memcpy(&y, b + i, 8);
        acc |= x ^ y;
    }
    for (; i < n; i++) {
        acc |= (uint64_t)(a[i] ^ b[i]);
    }
    return acc == 0;
}

/* Check a new value before it may be written: it parses and is at the
 * target; unless no_verify, it opens with the row's parameters to exactly
 * pt[0, pt_len).  KS_ERR_VERIFY_FAILED otherwise. */
static ks_err verify_new(batch *b, const row_in *in, ks_bytes neu, const uint8_t *pt, size_t pt_len)
{
    const run *r = b->r;
    ks_envelope e;
    if (ks_envelope_parse(neu.ptr, neu.len, NULL, &e, NULL) != KS_OK ||
        !bytes_eq(e.key_id, r->p->to_key_id) || e.key_version != r->to_version) {
        return KS_ERR_VERIFY_FAILED;
    }
    if (r->p->no_verify) {
        return KS_OK;
    }
    size_t got = 0;
    ks_err err = open_into(b, in, neu, b->pt2, &got);
    if (err != KS_OK) {
        sodium_memzero(b->pt2, b->pt_cap);
        return ks_err_is_rejection(err) || err == KS_ERR_AUTH_FAILED ? KS_ERR_VERIFY_FAILED : err;
    }
    int same = got == pt_len && (pt_len == 0 || same_bytes(b->pt2, pt, pt_len));
    sodium_memzero(b->pt2, got);
    return same ? KS_OK : KS_ERR_VERIFY_FAILED;
}

/* Record in s that the new value is the out_len bytes just written (and
 * verified) at the end of b->neu, first put in the column's encoding: a
 * base64 column gets the envelope's canonical text [F-TEXT-1]. */
static ks_err take_new(batch *b, slot *s, size_t out_len)
{
    ks_err err = ks_engine_encode_value(b->r->p->encoding, &b->neu, &b->neu_cap, b->neu_len,
                                        &out_len);
    if (err != KS_OK) {
        return err;
    }
    s->act = ACT_WRITE;
    s->new_off = b->neu_len;
    s->new_len = out_len;
    b->neu_len += out_len;
    return KS_OK;
}

/* Seal pt[0, len) under the target for in into b->neu at the end; s gets
 * the offset and length.  A plaintext too large is quarantined. */
static ks_err seal_new(batch *b, const row_in *in, const uint8_t *pt, size_t len, slot *s)
{
    const run *r = b->r;
    ks_seal_params sp = {r->format, r->alg, in->tenant, r->p->to_key_id, r->to_version,
                         r->p->purpose, {in->context, in->context_len}};
    size_t max = ks_seal_max_len(&sp, len);
    if (max == 0) {
        s->act = ACT_QUARANTINE;
        s->qerr = ks_err_name(KS_ERR_TOO_LARGE);
        return KS_OK;
    }
    ks_err err = grow(&b->neu, &b->neu_cap, b->neu_len + max);
    if (err != KS_OK) {
        return err;
    }
    size_t out_len = 0;
    err = ks_seal(r->ctx, &sp, pt, len, b->neu + b->neu_len, max, &out_len);
    if (err == KS_ERR_TOO_LARGE) {
        s->act = ACT_QUARANTINE;
        s->qerr = ks_err_name(err);
        return KS_OK;
    }
    if (err != KS_OK) {
        return err;
    }
    err = verify_new(b, in, (ks_bytes){b->neu + b->neu_len, out_len}, pt, len);
    if (err != KS_OK) {
        return err;
    }
    return take_new(b, s, out_len);
}

/* encrypt: seal a plaintext value. */
static ks_err do_encrypt(batch *b, const row_in *in, const ks_value *v, slot *s)
{
    char num[24];
    const uint8_t *pt;
    size_t len;
    if (v->type == KS_VALUE_INTEGER) {
        int n = snprintf(num, sizeof num, "%" PRId64, v->integer);
        assert(n > 0 && (size_t)n < sizeof num);
        pt = (const uint8_t *)num;
        len = (size_t)n;
    } else {
        pt = v->bytes.ptr;
        len = v->bytes.len;
    }
    ks_err err = seal_new(b, in, pt, len, s);
    sodium_memzero(num, sizeof num);
    return err;
}

/*
 * Check a rewrapped value against the old one before it may be written:
 * it parses, is at the target, and carries the old nonce and ciphertext
 * byte for byte (only key_id, key_version and wrapped_dek may change,
 * [F-CRYPTO-REWRAP-1]); unless no_verify, it opens with the row's
 * parameters (ks_verify: every check of ks_open, the AEAD tag included,
 * without decrypting: there is no plaintext to compare with).  Its
 * plaintext is then necessarily the old one: same ciphertext, nonce and
 * data AAD under the DEK the old value was wrapped with, which is what
 * lets rewrap skip a second AEAD on the old value.  If the new value does
 * not open, the old one is checked to tell a bad row (*fault: quarantine
 * it) from a bad rewrap (KS_ERR_VERIFY_FAILED: stop).  o is old, already
 * parsed by decide() (its views point into old).
 */
static ks_err verify_rewrap(batch *b, const row_in *in, ks_bytes old, const ks_envelope *o,
                            ks_bytes neu, const char **fault)
{
    const run *r = b->r;
    ks_envelope n;
    *fault = NULL;
    if (ks_envelope_parse(neu.ptr, neu.len, NULL, &n, NULL) != KS_OK ||
        !bytes_eq(n.key_id, r->p->to_key_id) || n.key_version != r->to_version ||
        !bytes_eq(n.nonce, o->nonce) || !bytes_eq(n.ciphertext, o->ciphertext)) {
        return KS_ERR_VERIFY_FAILED;
    }
    if (r->p->no_verify) {
        return KS_OK;
    }
    ks_err err = check_opens(b, in, neu);
    if (err == KS_OK || row_fault(err) == NULL) {
        return err; /* opens, or a provider error: not the row's fault */
    }
    err = check_opens(b, in, old);
    if (err == KS_OK) {
        return KS_ERR_VERIFY_FAILED; /* the old value opens, the rewrap does not */
    }
    *fault = row_fault(err);
    return *fault != NULL ? KS_OK : err;
}

/* rewrap: rewrap an envelope not at the target, then verify_rewrap; o is
 * old, parsed. */
static ks_err do_rewrap(batch *b, const row_in *in, ks_bytes old, const ks_envelope *o, slot *s)
{
    const run *r = b->r;
    size_t bound = old.len + KS_KEY_ID_MAX + KS_WRAPPED_DEK_MAX + 32;
    ks_err err = grow(&b->neu, &b->neu_cap, b->neu_len + bound);
    if (err != KS_OK) {
        return err;
    }
    ks_rewrap_params rp = {r->p->to_key_id, r->to_version};
    size_t out_len = 0;
    const char *fault = NULL;
    err = ks_rewrap(r->ctx, old.ptr, old.len, &rp, b->neu + b->neu_len, bound, &out_len, NULL);
    if (err == KS_OK) {
        err = verify_rewrap(b, in, old, o, (ks_bytes){b->neu + b->neu_len, out_len}, &fault);
    } else {
        fault = row_fault(err);
        err = fault != NULL ? KS_OK : err;
    }
    if (err != KS_OK) {
        return err;
    }
    if (fault != NULL) {
        s->act = ACT_QUARANTINE;
        s->qerr = fault;
        return KS_OK;
    }
    return take_new(b, s, out_len);
}

/* reencrypt: open an envelope and seal it afresh under the target. */
static ks_err do_reencrypt(batch *b, const row_in *in, ks_bytes old, slot *s)
{
    size_t pt_len = 0;
    ks_err err = open_into(b, in, old, b->pt, &pt_len);
    if (err != KS_OK) {
        sodium_memzero(b->pt, b->pt_cap);
        s->qerr = row_fault(err);
        s->act = ACT_QUARANTINE;
        return s->qerr != NULL ? KS_OK : err;
    }
    err = seal_new(b, in, b->pt, pt_len, s);
    sodium_memzero(b->pt, pt_len);
    return err;
}

/* Nonzero when parsed envelope e is already where the mode wants it. */
static int at_target(const run *r, const ks_envelope *e)
{
    if (!bytes_eq(e->key_id, r->p->to_key_id) || e->key_version != r->to_version) {
        return 0;
    }
    return r->p->mode == KS_MIGRATE_REWRAP || (e->version == r->format && e->algorithm == r->alg);
}

/* Decide (and compute, for a write) what to do with row i of b. */
static ks_err decide(batch *b, size_t i)
{
    const run *r = b->r;
    const ks_row *row = &b->rows[i];
    slot *s = &b->slots[i];
    const ks_value *v = &row->value;
    *s = (slot){.act = ACT_NONE};
    if (row->quarantined || v->type == KS_VALUE_NULL) {
        return KS_OK;
    }
    ks_bytes env;
    ks_err perr;
    int is_env = ks_engine_value_env(r->p->encoding, v, &b->dec, &b->dec_cap, &env, &perr);
    if (perr == KS_ERR_NO_MEMORY) {
        return perr;
    }
    if (ks_engine_outside_key(r->p, is_env, perr, env)) {
        s->act = ACT_SKIP; /* another key's envelope or plaintext: not this run's */
        return KS_OK;
    }
    ks_envelope e;
    if (is_env && perr == KS_OK) {
        perr = ks_envelope_parse(env.ptr, env.len, NULL, &e, NULL);
    }
    if (is_env && perr != KS_OK) {
        s->act = ACT_QUARANTINE; /* starts "KSE" ("S1NF") but is not an envelope, or not
                                    canonical base64: never touch, never re-encode */
        s->qerr = ks_err_name(perr);
        return KS_OK;
    }
    if (is_env && at_target(r, &e)) {
        s->act = ACT_SKIP; /* in encrypt mode too: e.g. the application's own
                              writes under the target during a rollout */
        return KS_OK;
    }
    if ((r->p->mode == KS_MIGRATE_ENCRYPT) == is_env) {
        s->act = ACT_WRONG;
        return KS_OK;
    }
    row_in in;
    ks_err err = ks_engine_row_tenant(r->p, row, &in.tenant);
    if (err == KS_ERR_BAD_VALUE) {
        s->act = ACT_QUARANTINE;
        s->qerr = KS_ENGINE_BAD_TENANT;
        return KS_OK;
    }
    if (err != KS_OK) {
        return err;
    }
    if (ks_context_tmpl_render(r->tmpl, row, in.context, sizeof in.context, &in.context_len) != KS_OK) {
        s->act = ACT_QUARANTINE;
        s->qerr = KS_ENGINE_BAD_CONTEXT;
        return KS_OK;
    }
    switch (r->p->mode) {
    case KS_MIGRATE_ENCRYPT: return do_encrypt(b, &in, v, s);
    case KS_MIGRATE_REWRAP: return do_rewrap(b, &in, env, &e, s);
    case KS_MIGRATE_REENCRYPT: return do_reencrypt(b, &in, env, s);
    }
    return KS_ERR_INVALID_ARGUMENT;
}

/* Compute every row of b: what to do, and the new values, verified.
 * Touches only b, the run's read-only parameters and the ks_ctx (never
 * the store), so it may run on the helper thread. */
ks_err ks_engine_compute(batch *b)
{
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    size_t longest = 0;
    for (size_t i = 0; i < b->n; i++) {
        if (b->rows[i].value.bytes.len > longest) {
            longest = b->rows[i].value.bytes.len;
        }
    }
    /* rewrap never holds a plaintext (verify_rewrap decrypts nothing) */
    ks_err err = b->r->p->mode == KS_MIGRATE_REWRAP ? KS_OK : ensure_pt(b, longest + 64);
    b->neu_len = 0;
    for (size_t i = 0; i < b->n && err == KS_OK; i++) {
        err = decide(b, i);
    }
    b->compute_s = elapsed_s(&t0);
    return err;
}
