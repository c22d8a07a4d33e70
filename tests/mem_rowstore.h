/*
 * tests/mem_rowstore.h -- an in-memory ks_rowstore for the engine's unit
 * tests, with fault injection: a CAS that reports "not swapped" once for
 * chosen ids (a race), a failing commit, and a hook run at begin() (to
 * change rows between a batch's scan and its writes), and a visit_values
 * that fails at a chosen row.  Tests reach the census's scan path by
 * copying the ops with visit_values NULL.  It has no visit_rows, so the
 * engine reads its batches through scan (the SQLite store's visit_rows
 * is tested in test_migrate.c's test_sqlite).
 *
 * Rows have INTEGER ids in ascending order, a value, an optional tenant
 * and one context column.  A transaction snapshots every row value, the
 * quarantine and the checkpoints at begin and restores them on rollback.
 *
 * Test support code: static inline only.
 */
#ifndef KS_TESTS_MEM_ROWSTORE_H
#define KS_TESTS_MEM_ROWSTORE_H

#include <stdlib.h>
#include <string.h>

#include <keyshift/rowstore.h>

#define MRS_MAX_ROWS 4096
#define MRS_MAX_CP 8

/* An owned value. */
typedef struct mrs_val {
    ks_value_type type;
    int64_t integer;
    uint8_t *bytes;
    size_t len;
} mrs_val;

typedef struct mrs_row {
    int64_t id;
    mrs_val value, tenant, ctx0;
    int quarantined;
    char qerr[32];
    int race_once; /* the next cas of this row reports not swapped */
} mrs_row;

typedef struct mrs_cp {
    int used;
    ks_checkpoint cp;
    mrs_val params, state, cursor;
} mrs_cp;

typedef struct mem_rowstore mem_rowstore;
typedef void (*mrs_hook)(mem_rowstore *m, void *arg);

struct mem_rowstore {
    mrs_row rows[MRS_MAX_ROWS];
    size_t n;
    mrs_cp cps[MRS_MAX_CP];
    int64_t cp_clock;                 /* last-updated order of checkpoints */
    int64_t cp_order[MRS_MAX_CP];
    int in_txn;
    mrs_row *snap_rows;               /* begin snapshot */
    mrs_cp snap_cps[MRS_MAX_CP];
    int64_t snap_order[MRS_MAX_CP];
    unsigned commits, fail_commit_at; /* the commit number (1-based) that fails */
    unsigned writes;                  /* successful cas swaps, all time */
    size_t fail_visit_at;             /* visit_values fails (KS_ERR_STORE) before this
                                         row (1-based); 0: never */
    mrs_hook begin_hook;
    void *hook_arg;
};

/* A deep copy of a value. */
static inline mrs_val mrs_dup(ks_value_type t, int64_t i, const void *b, size_t len)
{
    mrs_val v = {t, i, NULL, 0};
    if (t == KS_VALUE_TEXT || t == KS_VALUE_BLOB) {
        v.bytes = malloc(len + 1);
        if (len) memcpy(v.bytes, b, len);
        v.len = len;
    }
    return v;
}

static inline void mrs_free_val(mrs_val *v)
{
    free(v->bytes);
    memset(v, 0, sizeof *v);
}

/* The ks_value view of v. */
static inline ks_value mrs_view(const mrs_val *v)
{
    ks_value out = {v->type, v->integer, {NULL, 0}};
    if (v->type == KS_VALUE_TEXT || v->type == KS_VALUE_BLOB) {
        out.bytes = (ks_bytes){v->bytes, v->len};
    }
    return out;
}

static inline mrs_val mrs_dup_view(const ks_value *v)
{
    return mrs_dup(v->type, v->integer, v->bytes.ptr, v->bytes.len);
}

static inline int mrs_val_eq(const mrs_val *a, const ks_value *b)
{
    if (a->type != b->type) return 0;
    if (a->type == KS_VALUE_INTEGER) return a->integer == b->integer;
    if (a->type == KS_VALUE_NULL) return 1;
    return a->len == b->bytes.len && (a->len == 0 || memcmp(a->bytes, b->bytes.ptr, a->len) == 0);
}

/* Append a row (ids must ascend); value bytes/tenant/ctx0 copied. */
static inline mrs_row *mrs_add(mem_rowstore *m, int64_t id, ks_value_type t, int64_t i, const void *b,
                               size_t len)
{
    mrs_row *r = &m->rows[m->n++];
    memset(r, 0, sizeof *r);
    r->id = id;
    r->value = mrs_dup(t, i, b, len);
    return r;
}

static inline mrs_row *mrs_find(mem_rowstore *m, int64_t id)
{
    for (size_t i = 0; i < m->n; i++) {
        if (m->rows[i].id == id) return &m->rows[i];
    }
    return NULL;
}

/* Replace a row's value (the application writing). */
static inline void mrs_set(mem_rowstore *m, int64_t id, ks_value_type t, const void *b, size_t len)
{
    mrs_row *r = mrs_find(m, id);
    mrs_free_val(&r->value);
    r->value = mrs_dup(t, 0, b, len);
}

static inline void mrs_cp_free(mrs_cp *c)
{
    mrs_free_val(&c->params);
    mrs_free_val(&c->state);
    mrs_free_val(&c->cursor);
    memset(c, 0, sizeof *c);
}

static inline mrs_cp mrs_cp_dup(const mrs_cp *c)
{
    mrs_cp o = *c;
    o.params = mrs_dup(c->params.type, 0, c->params.bytes, c->params.len);
    o.state = mrs_dup(c->state.type, 0, c->state.bytes, c->state.len);
    o.cursor = mrs_dup(c->cursor.type, c->cursor.integer, c->cursor.bytes, c->cursor.len);
    return o;
}

/* ---- ops ---- */

static inline ks_err mrs_scan(void *self, const ks_value *after, size_t max, ks_row *rows, size_t *n)
{
    mem_rowstore *m = self;
    *n = 0;
    for (size_t i = 0; i < m->n && *n < max; i++) {
        mrs_row *r = &m->rows[i];
        if (after != NULL && after->type == KS_VALUE_INTEGER && r->id <= after->integer) continue;
        ks_row *o = &rows[(*n)++];
        memset(o, 0, sizeof *o);
        o->id = (ks_value){KS_VALUE_INTEGER, r->id, {NULL, 0}};
        o->value = mrs_view(&r->value);
        o->tenant = mrs_view(&r->tenant);
        o->context[0] = mrs_view(&r->ctx0);
        o->quarantined = r->quarantined;
    }
    return KS_OK;
}

/* ops.visit_values: every row's value in id order (rows are kept sorted),
 * a view of the row's own bytes. */
static inline ks_err mrs_visit(void *self, ks_rowstore_value_fn fn, void *arg)
{
    mem_rowstore *m = self;
    for (size_t i = 0; i < m->n; i++) {
        if (m->fail_visit_at == i + 1) return KS_ERR_STORE;
        ks_value v = mrs_view(&m->rows[i].value);
        ks_err err = fn(arg, &v);
        if (err != KS_OK) return err;
    }
    return KS_OK;
}

static inline ks_err mrs_count(void *self, uint64_t *n)
{
    *n = ((mem_rowstore *)self)->n;
    return KS_OK;
}

static inline ks_err mrs_begin(void *self)
{
    mem_rowstore *m = self;
    if (m->in_txn) return KS_ERR_STORE;
    if (m->begin_hook != NULL) m->begin_hook(m, m->hook_arg);
    m->snap_rows = malloc(m->n * sizeof *m->snap_rows + 1);
    for (size_t i = 0; i < m->n; i++) {
        m->snap_rows[i] = m->rows[i];
        m->snap_rows[i].value = mrs_dup(m->rows[i].value.type, m->rows[i].value.integer,
                                        m->rows[i].value.bytes, m->rows[i].value.len);
    }
    for (size_t i = 0; i < MRS_MAX_CP; i++) {
        m->snap_cps[i] = mrs_cp_dup(&m->cps[i]);
        m->snap_order[i] = m->cp_order[i];
    }
    m->in_txn = 1;
    return KS_OK;
}

/* End a transaction: keep (commit) or restore (rollback) the snapshot. */
static inline void mrs_end(mem_rowstore *m, int keep)
{
    for (size_t i = 0; i < m->n; i++) {
        if (keep) {
            mrs_free_val(&m->snap_rows[i].value);
        } else {
            mrs_free_val(&m->rows[i].value);
            m->rows[i] = m->snap_rows[i];
        }
    }
    for (size_t i = 0; i < MRS_MAX_CP; i++) {
        if (keep) {
            mrs_cp_free(&m->snap_cps[i]);
        } else {
            mrs_cp_free(&m->cps[i]);
            m->cps[i] = m->snap_cps[i];
            m->cp_order[i] = m->snap_order[i];
        }
    }
    free(m->snap_rows);
    m->snap_rows = NULL;
    m->in_txn = 0;
}

static inline ks_err mrs_cas(void *self, const ks_value *id, const ks_value *old, ks_bytes nv, int *swapped)
{
    mem_rowstore *m = self;
    *swapped = 0;
    if (!m->in_txn || id->type != KS_VALUE_INTEGER) return KS_ERR_STORE;
    mrs_row *r = mrs_find(m, id->integer);
    if (r == NULL || !mrs_val_eq(&r->value, old)) return KS_OK;
    if (r->race_once) {
        r->race_once = 0;
        return KS_OK;
    }
    mrs_free_val(&r->value);
    r->value = mrs_dup(KS_VALUE_BLOB, 0, nv.ptr, nv.len);
    *swapped = 1;
    m->writes++;
    return KS_OK;
}

/* A cas_batch for tests of the engine's batched path: mrs_cas per row
 * (the store's own ops leave cas_batch NULL). */
static inline ks_err mrs_cas_batch(void *self, size_t n, const ks_value *const *ids,
                                   const ks_value *const *olds, const ks_bytes *nvs, int *swapped)
{
    for (size_t i = 0; i < n; i++) {
        ks_err err = mrs_cas(self, ids[i], olds[i], nvs[i], &swapped[i]);
        if (err != KS_OK) return err;
    }
    return KS_OK;
}

static inline ks_err mrs_quarantine(void *self, const ks_value *id, const char *error)
{
    mem_rowstore *m = self;
    if (!m->in_txn) return KS_ERR_STORE;
    mrs_row *r = mrs_find(m, id->integer);
    if (r == NULL) return KS_ERR_STORE;
    r->quarantined = 1;
    strncpy(r->qerr, error, sizeof r->qerr - 1);
    return KS_OK;
}

static inline int mrs_cp_match(const mrs_cp *c, ks_bytes params)
{
    return c->used && c->params.len == params.len && memcmp(c->params.bytes, params.ptr, params.len) == 0;
}

static inline ks_err mrs_cp_save(void *self, const ks_checkpoint *cp)
{
    mem_rowstore *m = self;
    if (!m->in_txn) return KS_ERR_STORE;
    size_t slot = MRS_MAX_CP;
    for (size_t i = 0; i < MRS_MAX_CP; i++) {
        if (mrs_cp_match(&m->cps[i], cp->params)) slot = i;
    }
    for (size_t i = 0; i < MRS_MAX_CP && slot == MRS_MAX_CP; i++) {
        if (!m->cps[i].used) slot = i;
    }
    if (slot == MRS_MAX_CP) return KS_ERR_FULL;
    mrs_cp *c = &m->cps[slot];
    mrs_cp_free(c);
    c->used = 1;
    c->cp = *cp;
    c->params = mrs_dup(KS_VALUE_TEXT, 0, cp->params.ptr, cp->params.len);
    c->state = mrs_dup(KS_VALUE_TEXT, 0, cp->state.ptr, cp->state.len);
    c->cursor = mrs_dup_view(&cp->cursor);
    m->cp_order[slot] = ++m->cp_clock;
    return KS_OK;
}

static inline ks_err mrs_cp_load(void *self, ks_bytes params, ks_checkpoint *cp)
{
    mem_rowstore *m = self;
    int64_t best = 0;
    mrs_cp *found = NULL;
    for (size_t i = 0; i < MRS_MAX_CP; i++) {
        mrs_cp *c = &m->cps[i];
        if (!c->used) continue;
        if (params.ptr == NULL ? m->cp_order[i] > best : mrs_cp_match(c, params)) {
            found = c;
            best = m->cp_order[i];
        }
    }
    if (found == NULL) return KS_ERR_NOT_FOUND;
    *cp = found->cp;
    cp->params = (ks_bytes){found->params.bytes, found->params.len};
    cp->state = (ks_bytes){found->state.bytes, found->state.len};
    cp->cursor = mrs_view(&found->cursor);
    return KS_OK;
}

static inline ks_err mrs_commit(void *self)
{
    mem_rowstore *m = self;
    if (!m->in_txn) return KS_ERR_STORE;
    if (++m->commits == m->fail_commit_at) return KS_ERR_BUSY;
    mrs_end(m, 1);
    return KS_OK;
}

static inline void mrs_rollback(void *self)
{
    mem_rowstore *m = self;
    if (m->in_txn) mrs_end(m, 0);
}

static inline void mrs_close(void *self)
{
    mem_rowstore *m = self;
    mrs_rollback(m);
    for (size_t i = 0; i < m->n; i++) {
        mrs_free_val(&m->rows[i].value);
        mrs_free_val(&m->rows[i].tenant);
        mrs_free_val(&m->rows[i].ctx0);
    }
    for (size_t i = 0; i < MRS_MAX_CP; i++) mrs_cp_free(&m->cps[i]);
    free(m);
}

/* A new empty store and its ks_rowstore. */
static inline mem_rowstore *mrs_new(ks_rowstore *out)
{
    static const ks_rowstore_ops ops = {mrs_scan, mrs_count, mrs_begin, mrs_cas, mrs_quarantine,
                                        mrs_cp_save, mrs_cp_load, mrs_commit, mrs_rollback, mrs_close,
                                        mrs_visit, NULL /* no visit_rows: the engine scans */,
                                        NULL /* no cas_batch: the engine calls cas */,
                                        NULL /* no visit_rows_range: no chunked runs */,
                                        NULL /* no bind_migration: quarantine per column */,
                                        NULL, NULL /* no quarantine listing or release */};
    mem_rowstore *m = calloc(1, sizeof *m);
    *out = (ks_rowstore){&ops, m, "mem", 1, KS_ENCODING_BINARY};
    return m;
}

#endif /* KS_TESTS_MEM_ROWSTORE_H */
