/*
 * migrate/engine/census.c -- count a column's rows by envelope class
 * (keyshift/migrate.h ks_census_run).
 *
 * Read-only and key-free.  Where the store offers visit_values, every
 * value is classified during the visit, as a view the store does not copy
 * (one read of the column alone: the census's fast path).  Otherwise rows
 * are scanned in id order into one row array per run, of CENSUS_FIRST_BATCH
 * rows at first and four times larger after each full batch, up to
 * KS_ENGINE_SCAN_BATCH (no COUNT first: on PostgreSQL that is a scan of
 * its own).  Both give the same counts.  Each value:
 *   NULL                                   -> null_rows;
 *   INTEGER, or TEXT/BLOB not starting "KSE" -> plaintext_rows;
 *   TEXT/BLOB starting "KSE"               -> ks_envelope_parse (the whole
 *     value, default limits, so trailing bytes are caught): a class
 *     (version, algorithm, key_id, key_version) or malformed[code].
 * No per-row allocation: a class is found through a last-class cache,
 * then a linear search of the distinct classes (few in practice); the
 * class array grows by doubling.  Classes are sorted at the end by
 * (key_id, key_version, version, algorithm).
 */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "../alloc_hook.h"

/* Rows of census_scan's first batch.  A full array of KS_ENGINE_SCAN_BATCH
 * rows is past malloc's mmap threshold: a system call pair and fresh pages
 * for every census of a small table. */
#define CENSUS_FIRST_BATCH 64

/* The growing state of one census run. */
typedef struct census_run {
    ks_census *out;
    size_t cap;        /* allocated classes */
    size_t last;       /* index of the last class hit (cache); valid when n_classes > 0 */
    ks_value_encoding enc; /* the store's: how the column holds envelopes */
    uint8_t *dec;      /* a base64 column: the value at hand's decoded envelope */
    size_t dec_cap;
} census_run;

/* Nonzero when class c is (version, algorithm, key_id, key_version) of e. */
static int class_is(const ks_census_class *c, const ks_envelope *e)
{
    return c->version == e->version && c->algorithm == e->algorithm &&
           c->key_version == e->key_version && strlen(c->key_id) == e->key_id.len &&
           memcmp(c->key_id, e->key_id.ptr, e->key_id.len) == 0;
}

/* Count one envelope in its class, adding the class when new. */
static ks_err count_class(census_run *r, const ks_envelope *e)
{
    ks_census *c = r->out;
    if (c->n_classes > 0 && class_is(&c->classes[r->last], e)) {
        c->classes[r->last].rows++;
        return KS_OK;
    }
    for (size_t i = 0; i < c->n_classes; i++) {
        if (class_is(&c->classes[i], e)) {
            c->classes[i].rows++;
            r->last = i;
            return KS_OK;
        }
    }
    if (c->n_classes == r->cap) {
        size_t ncap = r->cap ? r->cap * 2 : 8;
        ks_census_class *p = realloc(c->classes, ncap * sizeof *p);
        if (p == NULL) {
            return KS_ERR_NO_MEMORY;
        }
        c->classes = p;
        r->cap = ncap;
    }
    assert(e->key_id.len <= KS_KEY_ID_MAX);
    ks_census_class *n = &c->classes[c->n_classes];
    memset(n, 0, sizeof *n);
    n->version = e->version;
    n->algorithm = e->algorithm;
    memcpy(n->key_id, e->key_id.ptr, e->key_id.len);
    n->key_version = e->key_version;
    n->rows = 1;
    r->last = c->n_classes++;
    return KS_OK;
}

/* Classify one value (a census_run in arg); also the visit_values
 * callback, so it keeps nothing of v. */
static ks_err count_value(void *arg, const ks_value *v)
{
    census_run *r = arg;
    assert(r != NULL && v != NULL);
    ks_census *c = r->out;
    c->rows++;
    if (v->type == KS_VALUE_NULL) {
        c->null_rows++;
        return KS_OK;
    }
    ks_bytes env;
    ks_err err;
    if (!ks_engine_value_env(r->enc, v, &r->dec, &r->dec_cap, &env, &err)) {
        c->plaintext_rows++;
        return KS_OK;
    }
    if (err == KS_ERR_NO_MEMORY) {
        return err;
    }
    ks_envelope e;
    if (err == KS_OK) {
        err = ks_envelope_parse(env.ptr, env.len, NULL, &e, NULL); /* [F-TEXT-4] */
    }
    if (err == KS_OK) {
        return count_class(r, &e);
    }
    assert(ks_err_is_rejection(err));
    c->malformed[(unsigned)err & 31u]++;
    c->malformed_rows++;
    return KS_OK;
}

/* qsort order of classes: key_id, key_version, version, algorithm. */
static int class_cmp(const void *a, const void *b)
{
    const ks_census_class *x = a, *y = b;
    int k = strcmp(x->key_id, y->key_id);
    if (k != 0) {
        return k;
    }
    if (x->key_version != y->key_version) {
        return x->key_version < y->key_version ? -1 : 1;
    }
    if (x->version != y->version) {
        return x->version < y->version ? -1 : 1;
    }
    return (x->algorithm > y->algorithm) - (x->algorithm < y->algorithm);
}

/* Count every row through the store's batched scan (stores without
 * visit_values): the cursor is copied out of each batch, whose views die
 * at the next scan. */
static ks_err census_scan(const ks_rowstore *store, census_run *r)
{
    size_t batch = CENSUS_FIRST_BATCH;
    ks_row *rows = malloc(batch * sizeof *rows);
    if (rows == NULL) {
        return KS_ERR_NO_MEMORY;
    }
    uint8_t *cur_buf = NULL; /* owned copy of the cursor id: views die at the next call */
    size_t cur_cap = 0;
    ks_value cursor = {KS_VALUE_NULL, 0, {NULL, 0}};
    ks_err err = KS_OK;
    for (;;) {
        size_t n = 0;
        err = store->ops->scan(store->self, &cursor, batch, rows, &n);
        if (err != KS_OK || n == 0) {
            break;
        }
        assert(n <= batch);
        for (size_t i = 0; i < n && err == KS_OK; i++) {
            err = count_value(r, &rows[i].value);
        }
        if (err == KS_OK) {
            err = ks_engine_value_copy(&rows[n - 1].id, &cur_buf, &cur_cap, &cursor);
        }
        if (err != KS_OK) {
            break;
        }
        if (n == batch && batch < KS_ENGINE_SCAN_BATCH) { /* a large table: larger batches */
            size_t grown = batch * 4 < KS_ENGINE_SCAN_BATCH ? batch * 4 : KS_ENGINE_SCAN_BATCH;
            ks_row *np = realloc(rows, grown * sizeof *np); /* the views in rows are done */
            if (np == NULL) {
                err = KS_ERR_NO_MEMORY;
                break;
            }
            rows = np;
            batch = grown;
        }
    }
    free(cur_buf);
    free(rows);
    return err;
}

/* See keyshift/migrate.h. */
ks_err ks_census_run(const ks_rowstore *store, ks_census *out)
{
    if (store == NULL || store->ops == NULL || out == NULL) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    memset(out, 0, sizeof *out);
    census_run r = {out, 0, 0, store->encoding, NULL, 0};
    ks_err err = store->ops->visit_values != NULL
                     ? store->ops->visit_values(store->self, count_value, &r)
                     : census_scan(store, &r);
    free(r.dec);
    if (err != KS_OK) {
        ks_census_free(out);
        return err;
    }
    if (out->n_classes > 1) {
        qsort(out->classes, out->n_classes, sizeof *out->classes, class_cmp);
    }
    return KS_OK;
}

/* See keyshift/migrate.h. */
void ks_census_free(ks_census *census)
{
    if (census == NULL) {
        return;
    }
    free(census->classes);
    memset(census, 0, sizeof *census);
}
