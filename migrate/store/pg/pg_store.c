/*
 * migrate/store/pg/pg_store.c -- the PostgreSQL row store
 * (keyshift/rowstore_pg.h over libpq): the operations on an open store,
 * its write gate, and what it lends pg_chunks.c (pg_internal.h).
 * Opening one (the target's catalog entries, keyshift's tables below,
 * the prepared statements) and the listings that need no store are
 * pg_store_open.c's; what both share is pg_store_internal.h.
 *
 * ---- Tables kept in the target table's schema ------------------------------
 *
 * Unless the store is opened read-only, ks_rowstore_pg_open creates these
 * two tables when either is missing, in one transaction that first takes
 * an advisory lock (so that several workers opening at once do not race
 * on CREATE TABLE IF NOT EXISTS).  They have the columns and meaning of
 * the SQLite store's (migrate/store/sqlite/sqlite_store.c) with PostgreSQL
 * types, and live next to the target table, so that a checkpoint commits
 * in the same transaction as the rows it describes:
 *
 *   CREATE TABLE keyshift_migration(
 *       tbl text NOT NULL, col text NOT NULL,   -- target, catalog spelling
 *       params text NOT NULL, state text NOT NULL,
 *       cursor bigint,                          -- NULL before the first batch
 *       pass, done, skipped, raced, quarantined, wrong_state,
 *       started, updated, finished bigint NOT NULL,
 *       saved timestamptz NOT NULL,             -- clock_timestamp() of the save:
 *                                               -- breaks ties of updated
 *       PRIMARY KEY (tbl, col, params));
 *   CREATE TABLE keyshift_quarantine(
 *       tbl text NOT NULL, col text NOT NULL,
 *       id text NOT NULL,                       -- the row's id in decimal
 *       error text NOT NULL,                    -- ks_err_name, never data
 *       time bigint NOT NULL,                   -- Unix seconds
 *       params text,                            -- the migration that quarantined
 *                                               -- it (NULL: an older entry,
 *                                               -- which holds back every one)
 *       PRIMARY KEY (tbl, col, id));
 *
 * A keyshift_quarantine from before quarantine kept its migration (no
 * params column) gets the column at the first writable open, in the
 * creating transaction's way (advisory lock, one transaction); a
 * read-only store reads such a table as it is (every entry holds its row
 * back).  Quarantine belongs to the bound migration exactly as in the
 * SQLite store (keyshift/rowstore.h, bind_migration).
 *
 * ---- Behaviour -------------------------------------------------------------
 *
 * Statements.  Every value is a bound parameter.  The operations'
 * statements are prepared once at open (PQprepare) with every parameter
 * cast in their text, and run with PQexecPrepared: values and integers
 * go as binary parameters, results come back in binary (bigint as 8
 * bytes big-endian, bytea and text as their bytes).  The catalog
 * look-ups of open bind the names with PQexecParams.  Identifiers enter
 * SQL only as the catalog spells them, quoted by PQescapeIdentifier;
 * constant statements (BEGIN, COMMIT, the DDL) carry no value.
 *
 * Views.  The rows of a scan and the strings of a loaded checkpoint point
 * into the last PGresult, which the store keeps until its next call.
 *
 * Failures inside a transaction roll it back before returning.
 */
#define _POSIX_C_SOURCE 200809L

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <libpq-fe.h>

#include <keyshift/rowstore.h>
#include <keyshift/rowstore_pg.h>

#include "pg_decode.h"
#include "pg_internal.h"
#include "pg_store_internal.h"
#include "pg_util.h"
#include "../../alloc_hook.h"

/* The longest error name accepted. */
#define ERROR_NAME_MAX 128u


/* The most parameters of one statement. */
#define MAX_PARAMS 16

/* The parameters of one statement: binary values with their lengths. */
typedef struct params {
    const char *v[MAX_PARAMS];
    int len[MAX_PARAMS];
    int fmt[MAX_PARAMS];
    uint8_t ints[MAX_PARAMS][8];
    int n;
} params;

/* The present view of a zero-length value. */
static const uint8_t empty_bytes[1] = {0};

/* ---- errors ------------------------------------------------------------------ */

/* The keyshift error of a failed result res (NULL: libpq could not even
 * send): a lost connection is KS_ERR_UNAVAILABLE whatever the code.  A
 * failure libpq made itself (no SQLSTATE) may be a server that went
 * away without a word (an immediate shutdown): libpq reports "server
 * closed the connection unexpectedly" in the result but marks the
 * connection bad only on its next read, so read once to find out. */
ks_err ks_pgs_result_err(const pg_store *s, const PGresult *res)
{
    if (PQstatus(s->conn) == CONNECTION_OK &&
        (res == NULL || PQresultErrorField(res, PG_DIAG_SQLSTATE) == NULL))
        (void)PQconsumeInput(s->conn); /* 0 on a closed connection, which it marks bad */
    if (PQstatus(s->conn) != CONNECTION_OK)
        return KS_ERR_UNAVAILABLE;
    if (res == NULL)
        return KS_ERR_STORE;
    return ks_pg_map_sqlstate(PQresultErrorField(res, PG_DIAG_SQLSTATE));
}

/* ---- parameters and results --------------------------------------------------- */

/* Write v as 8 bytes big-endian at p. */
static void put_be64(uint8_t *p, uint64_t v)
{
    for (int i = 7; i >= 0; i--) {
        p[i] = (uint8_t)v;
        v >>= 8;
    }
}

/* Write v as 4 bytes big-endian at p. */
static void put_be32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}


/* Add a binary parameter of len bytes (text, bytea or an array); an
 * absent view of length 0 is the empty value, not NULL. */
static void p_bytes(params *p, const void *v, size_t len)
{
    p->v[p->n] = v != NULL ? (const char *)v : (const char *)empty_bytes;
    p->len[p->n] = (int)len;
    p->fmt[p->n] = 1;
    p->n++;
}

/* Add a NUL-terminated string as a binary text parameter. */
static void p_str(params *p, const char *s)
{
    p_bytes(p, s, strlen(s));
}

/* Add a bigint parameter. */
static void p_int(params *p, int64_t v)
{
    put_be64(p->ints[p->n], (uint64_t)v);
    p_bytes(p, p->ints[p->n], 8);
}

/* Add a NULL parameter. */
static void p_null(params *p)
{
    p->v[p->n] = NULL;
    p->len[p->n] = 0;
    p->fmt[p->n] = 1;
    p->n++;
}

/* Make res the store's kept result (freeing the previous one): every
 * view the store hands out points into it. */
static void keep_result(pg_store *s, PGresult *res)
{
    if (s->res != NULL)
        PQclear(s->res);
    s->res = res;
}

/* Run the prepared statement name with p, binary results.  KS_OK with
 * *out the result (the caller's to clear) when it returned `want`; else
 * the mapped error, the result cleared. */
static ks_err run_prepared(pg_store *s, const char *name, const params *p, ExecStatusType want,
                           PGresult **out)
{
    PGresult *res = PQexecPrepared(s->conn, name, p->n, p->v, p->len, p->fmt, 1);
    *out = NULL;
    if (res != NULL && PQresultStatus(res) == want) {
        *out = res;
        return KS_OK;
    }
    ks_err err = ks_pgs_result_err(s, res);
    PQclear(res);
    return err;
}

/* Run a constant statement (no value in it); KS_OK when it returned
 * PGRES_COMMAND_OK, *cmd (when not NULL) set to its command tag's first
 * bytes. */
ks_err ks_pgs_run_simple(pg_store *s, const char *sql, char *cmd, size_t cmd_len)
{
    PGresult *res = PQexec(s->conn, sql);
    ks_err err = KS_OK;
    if (res == NULL || PQresultStatus(res) != PGRES_COMMAND_OK)
        err = ks_pgs_result_err(s, res);
    else if (cmd != NULL)
        snprintf(cmd, cmd_len, "%s", PQcmdStatus(res));
    PQclear(res);
    return err;
}

/* See pg_decode.h (ks_pg_cell). */
ks_err ks_pg_cell(const PGresult *res, int row, int col, ks_value *v)
{
    memset(v, 0, sizeof *v);
    if (PQfformat(res, col) != 1)
        return KS_ERR_STORE; /* a text column's cells would read as other values */
    if (PQgetisnull(res, row, col)) {
        v->type = KS_VALUE_NULL;
        return KS_OK;
    }
    const uint8_t *p = (const uint8_t *)PQgetvalue(res, row, col);
    int n = PQgetlength(res, row, col);
    if (p == NULL || n < 0)
        return KS_ERR_STORE;
    switch (PQftype(res, col)) {
    case KS_PG_OID_INT8:
        if (n != 8)
            return KS_ERR_STORE;
        v->type = KS_VALUE_INTEGER;
        v->integer = (int64_t)ks_pg_get_be64(p);
        return KS_OK;
    case KS_PG_OID_BYTEA:
        v->type = KS_VALUE_BLOB;
        break;
    case KS_PG_OID_TEXT:
        v->type = KS_VALUE_TEXT;
        break;
    default:
        return KS_ERR_STORE;
    }
    v->bytes = (ks_bytes){n > 0 ? p : empty_bytes, (size_t)n};
    return KS_OK;
}

/* See pg_decode.h (ks_pg_bool). */
ks_err ks_pg_bool(const PGresult *res, int row, int col, int *out)
{
    size_t n = 0;
    const uint8_t *p = ks_pg_typed_cell(res, row, col, KS_PG_OID_BOOL, &n);
    if (p == NULL || n != 1 || p[0] > 1)
        return KS_ERR_STORE; /* the server sends exactly one byte, 0 or 1 */
    *out = p[0];
    return KS_OK;
}

/* Nonzero when v is a well-formed value (known type; bytes absent only
 * when empty). */
static int value_ok(const ks_value *v)
{
    if (v == NULL)
        return 0;
    if (v->type == KS_VALUE_TEXT || v->type == KS_VALUE_BLOB)
        return (v->bytes.ptr != NULL || v->bytes.len == 0) && v->bytes.len <= (size_t)INT32_MAX;
    return v->type == KS_VALUE_NULL || v->type == KS_VALUE_INTEGER;
}

/* ---- transactions -------------------------------------------------------------- */

/* Roll back whatever transaction the connection has open, and forget it.
 * Used on every error inside a transaction: the batch is lost. */
void ks_pgs_rollback_now(pg_store *s)
{
    if (s->conn != NULL && PQtransactionStatus(s->conn) != PQTRANS_IDLE &&
        PQstatus(s->conn) == CONNECTION_OK) {
        ks_err err = ks_pgs_run_simple(s, "ROLLBACK", NULL, 0);
        (void)err; /* nothing more to undo: the server drops it with the session */
    }
    s->in_txn = 0;
}

/* Fail an operation: roll back an open transaction, return err. */
static ks_err fail_txn(pg_store *s, ks_err err)
{
    if (s->in_txn)
        ks_pgs_rollback_now(s);
    return err;
}

/* Nonzero when a write operation may run: a writable store inside begin(). */
static int writable(const pg_store *s)
{
    return s != NULL && !s->read_only && s->in_txn;
}

/* ---- operations ------------------------------------------------------------------ */

/* Run the keyset scan for up to max rows after *after (and, when upto
 * is not NULL, at most *upto: the range scan, WHERE id >= after + 1 AND
 * id <= upto): the result is kept (views into it) and its row count in
 * *rows_out. */
static ks_err scan_exec(pg_store *s, const ks_value *after, const ks_value *upto, size_t max,
                        int *rows_out)
{
    int from_start = after == NULL || after->type == KS_VALUE_NULL;
    if (!from_start && after->type != KS_VALUE_INTEGER)
        return KS_ERR_INVALID_ARGUMENT; /* ids of this store are integers */
    params p = {.n = 0};
    const char *st = from_start ? ST_SCAN_FIRST : ST_SCAN_AFTER;
    if (upto != NULL) {
        if (!from_start && after->integer == INT64_MAX) {
            *rows_out = 0; /* nothing is after the largest id */
            keep_result(s, NULL);
            return KS_OK;
        }
        p_int(&p, from_start ? INT64_MIN : after->integer + 1);
        p_int(&p, upto->integer);
        st = ST_SCAN_RANGE;
    } else if (!from_start) {
        p_int(&p, after->integer);
    }
    p_int(&p, max > (size_t)INT64_MAX ? INT64_MAX : (int64_t)max);
    if (s->have_tables) {
        p_str(&p, s->table);
        p_str(&p, s->column);
        if (s->q_params) {
            if (s->mig != NULL)
                p_str(&p, s->mig);
            else
                p_null(&p);
        }
    }
    PGresult *res;
    ks_err err = run_prepared(s, st, &p, PGRES_TUPLES_OK, &res);
    if (err != KS_OK)
        return fail_txn(s, err);
    keep_result(s, res);
    *rows_out = PQntuples(res);
    return KS_OK;
}

/* See pg_decode.h (ks_pg_scan_row). */
ks_err ks_pg_scan_row(const PGresult *res, int row, size_t n_context, ks_row *r)
{
    memset(r, 0, sizeof *r);
    ks_err err = ks_pg_cell(res, row, 0, &r->id);
    if (err == KS_OK && r->id.type != KS_VALUE_INTEGER)
        err = KS_ERR_STORE;
    if (err == KS_OK)
        err = ks_pg_cell(res, row, 1, &r->value);
    if (err == KS_OK)
        err = ks_pg_cell(res, row, 2, &r->tenant);
    for (size_t j = 0; err == KS_OK && j < n_context; j++)
        err = ks_pg_cell(res, row, 3 + (int)j, &r->context[j]);
    if (err == KS_OK)
        err = ks_pg_bool(res, row, 3 + (int)n_context, &r->quarantined);
    return err;
}

/* Scan up to max rows after *after: into rows[0, *n) when rows is not
 * NULL, else each handed to fn.  Views into the kept result. */
static ks_err scan_run(pg_store *s, const ks_value *after, const ks_value *upto, size_t max,
                       ks_row *rows, ks_rowstore_row_fn fn, void *arg, size_t *n)
{
    int got = 0;
    *n = 0;
    ks_err err = scan_exec(s, after, upto, max, &got);
    for (int i = 0; err == KS_OK && i < got && (size_t)i < max; i++) {
        ks_row one, *r = rows != NULL ? &rows[i] : &one;
        err = ks_pg_scan_row(s->res, i, s->n_context, r); /* views into the kept result */
        if (err != KS_OK)
            return fail_txn(s, err);
        *n = (size_t)i + 1;
        if (fn != NULL && (err = fn(arg, r)) != KS_OK)
            return err; /* the caller's stop: its transaction stands */
    }
    return err;
}

/* ops.scan: up to max rows after *after in id order (rowstore.h). */
static ks_err op_scan(void *self, const ks_value *after, size_t max, ks_row *rows, size_t *n)
{
    pg_store *s = self;
    if (s == NULL || n == NULL || (max > 0 && rows == NULL) || (after != NULL && !value_ok(after)))
        return KS_ERR_INVALID_ARGUMENT;
    *n = 0;
    if (max == 0)
        return KS_OK;
    return scan_run(s, after, NULL, max, rows, NULL, NULL, n);
}

/* ops.visit_rows: the rows of op_scan, handed to fn one at a time. */
static ks_err op_visit_rows(void *self, const ks_value *after, size_t max, ks_rowstore_row_fn fn,
                            void *arg)
{
    pg_store *s = self;
    if (s == NULL || fn == NULL || (after != NULL && !value_ok(after)))
        return KS_ERR_INVALID_ARGUMENT;
    if (max == 0)
        return KS_OK;
    size_t got = 0;
    return scan_run(s, after, NULL, max, NULL, fn, arg, &got);
}

/* ops.visit_rows_range: the rows of op_visit_rows whose id is at most
 * *upto (rowstore.h), by the range statement. */
static ks_err op_visit_rows_range(void *self, const ks_value *after, const ks_value *upto,
                                  size_t max, ks_rowstore_row_fn fn, void *arg)
{
    pg_store *s = self;
    if (s == NULL || fn == NULL || (after != NULL && !value_ok(after)) || upto == NULL ||
        upto->type != KS_VALUE_INTEGER)
        return KS_ERR_INVALID_ARGUMENT;
    if (max == 0)
        return KS_OK;
    size_t got = 0;
    return scan_run(s, after, upto, max, NULL, fn, arg, &got);
}

/* ops.count: SELECT count(*) of the target table. */
static ks_err op_count(void *self, uint64_t *n)
{
    pg_store *s = self;
    if (s == NULL || n == NULL)
        return KS_ERR_INVALID_ARGUMENT;
    params p = {.n = 0};
    PGresult *res;
    ks_err err = run_prepared(s, ST_COUNT, &p, PGRES_TUPLES_OK, &res);
    if (err != KS_OK)
        return fail_txn(s, err);
    ks_value v;
    err = PQntuples(res) == 1 ? ks_pg_cell(res, 0, 0, &v) : KS_ERR_STORE;
    if (err == KS_OK && v.type != KS_VALUE_INTEGER)
        err = KS_ERR_STORE;
    if (err == KS_OK)
        *n = v.integer < 0 ? 0 : (uint64_t)v.integer;
    PQclear(res);
    return err == KS_OK ? KS_OK : fail_txn(s, err);
}

/* The write gate, inside a just-begun write transaction: the caller's
 * query (ks_rowstore_pg_set_write_gate) must return one row whose first
 * column is true or 1, else KS_ERR_STOPPED (begin then rolls back). */
static ks_err check_gate(pg_store *s)
{
    PGresult *res = PQexecPrepared(s->conn, "ks_gate", 0, NULL, NULL, NULL, 0);
    ks_err err = KS_OK;
    if (PQresultStatus(res) != PGRES_TUPLES_OK) {
        err = ks_pgs_result_err(s, res);
    } else if (PQntuples(res) < 1 || PQnfields(res) < 1 || PQgetisnull(res, 0, 0) ||
               (strcmp(PQgetvalue(res, 0, 0), "t") != 0 && strcmp(PQgetvalue(res, 0, 0), "1") != 0)) {
        err = KS_ERR_STOPPED;
    }
    PQclear(res);
    return err;
}

/* ops.begin: a READ COMMITTED transaction with this store's lock and
 * statement timeouts as SET LOCAL. */
static ks_err op_begin(void *self)
{
    pg_store *s = self;
    if (s == NULL || s->read_only || s->in_txn)
        return KS_ERR_INVALID_ARGUMENT;
    if (PQstatus(s->conn) != CONNECTION_OK)
        return KS_ERR_UNAVAILABLE; /* the store must be opened again */
    if (PQtransactionStatus(s->conn) != PQTRANS_IDLE)
        return KS_ERR_INVALID_ARGUMENT;
    ks_err err = ks_pgs_run_simple(s, "BEGIN ISOLATION LEVEL READ COMMITTED", NULL, 0);
    if (err != KS_OK)
        return err;
    s->in_txn = 1;
    params p = {.n = 0};
    p_str(&p, s->lock_ms);
    p_str(&p, s->stmt_ms);
    PGresult *res;
    err = run_prepared(s, ST_TXN_CFG, &p, PGRES_TUPLES_OK, &res);
    PQclear(res);
    if (err == KS_OK && s->gate)
        err = check_gate(s);
    return err == KS_OK ? KS_OK : fail_txn(s, err);
}

/* Make the store's array buffer hold at least need bytes. */
static ks_err buf_reserve(pg_store *s, size_t need)
{
    if (need <= s->buf_cap)
        return KS_OK;
    size_t cap = s->buf_cap ? s->buf_cap : 4096;
    while (cap < need)
        cap *= 2;
    uint8_t *np = realloc(s->buf, cap);
    if (np == NULL)
        return KS_ERR_NO_MEMORY;
    s->buf = np;
    s->buf_cap = cap;
    return KS_OK;
}

/* Write the header of a one-dimensional binary array of n elements of
 * type elem at p (array_send's format); returns its length, 20. */
static size_t array_header(uint8_t *p, size_t n, unsigned elem, int has_null)
{
    put_be32(p, 1);                  /* dimensions */
    put_be32(p + 4, has_null ? 1 : 0);
    put_be32(p + 8, elem);
    put_be32(p + 12, (uint32_t)n);   /* length of the dimension */
    put_be32(p + 16, 1);             /* its lower bound */
    return 20;
}

/* Append one array element (len bytes at v, or NULL when v is NULL and
 * len is SIZE_MAX) at p + *off. */
static void array_elem(uint8_t *p, size_t *off, const void *v, size_t len)
{
    if (len == SIZE_MAX) {
        put_be32(p + *off, UINT32_MAX); /* -1: NULL */
        *off += 4;
        return;
    }
    put_be32(p + *off, (uint32_t)len);
    if (len > 0)
        memcpy(p + *off + 4, v, len);
    *off += 4 + len;
}

/* Check cas_batch's arguments and return the bytes its three arrays
 * take in *need (0 when they do not fit one statement). */
static ks_err cas_check(size_t n, const ks_value *const *ids, const ks_value *const *olds,
                        const ks_bytes *news, const int *swapped, size_t *need)
{
    if (ids == NULL || olds == NULL || news == NULL || swapped == NULL || n > (size_t)INT32_MAX)
        return KS_ERR_INVALID_ARGUMENT;
    size_t total = 60 + n * (12 + 8);
    for (size_t i = 0; i < n; i++) {
        const ks_value *id = ids[i], *old = olds[i];
        if (!value_ok(id) || id->type != KS_VALUE_INTEGER || !value_ok(old) ||
            old->type == KS_VALUE_INTEGER || (news[i].ptr == NULL && news[i].len > 0) ||
            news[i].len > (size_t)INT32_MAX)
            return KS_ERR_INVALID_ARGUMENT;
        total += old->bytes.len + news[i].len;
        if (total > (size_t)INT32_MAX)
            return KS_ERR_INVALID_ARGUMENT; /* over one parameter's limit */
    }
    *need = total;
    return KS_OK;
}

/* Build cas_batch's parameters in the store's buffer: bigint[] of ids,
 * bytea[] (text[] for a base64 column) of old values (NULL where NULL),
 * and of new values. */
static void cas_params(pg_store *s, size_t n, const ks_value *const *ids,
                       const ks_value *const *olds, const ks_bytes *news, params *p)
{
    uint8_t *b = s->buf;
    size_t off = array_header(b, n, KS_PG_OID_INT8, 0), start = 0;
    for (size_t i = 0; i < n; i++) {
        uint8_t be[8];
        put_be64(be, (uint64_t)ids[i]->integer);
        array_elem(b, &off, be, 8);
    }
    p_bytes(p, b, off);
    int has_null = 0;
    for (size_t i = 0; i < n; i++)
        has_null |= olds[i]->type == KS_VALUE_NULL;
    start = off;
    unsigned elem = s->as_text ? KS_PG_OID_TEXT : KS_PG_OID_BYTEA;
    off += array_header(b + off, n, elem, has_null);
    for (size_t i = 0; i < n; i++) {
        const ks_value *o = olds[i];
        array_elem(b, &off, o->bytes.ptr, o->type == KS_VALUE_NULL ? SIZE_MAX : o->bytes.len);
    }
    p_bytes(p, b + start, off - start);
    start = off;
    off += array_header(b + off, n, elem, 0);
    for (size_t i = 0; i < n; i++)
        array_elem(b, &off, news[i].ptr, news[i].len);
    p_bytes(p, b + start, off - start);
}

/* ops.cas_batch: every compare-and-swap of the batch as one UPDATE over
 * unnest()ed arrays; the ids it returns were swapped, the others raced
 * (rowstore_pg.h, "Compare-and-swap"). */
static ks_err op_cas_batch(void *self, size_t n, const ks_value *const *ids,
                           const ks_value *const *olds, const ks_bytes *news, int *swapped)
{
    pg_store *s = self;
    size_t need = 0;
    if (!writable(s))
        return KS_ERR_INVALID_ARGUMENT;
    ks_err err = cas_check(n, ids, olds, news, swapped, &need);
    if (err != KS_OK)
        return err;
    for (size_t i = 0; i < n; i++)
        swapped[i] = 0;
    if (n == 0)
        return KS_OK;
    err = buf_reserve(s, need);
    if (err != KS_OK)
        return fail_txn(s, err);
    params p = {.n = 0};
    cas_params(s, n, ids, olds, news, &p);
    PGresult *res;
    err = run_prepared(s, ST_CAS, &p, PGRES_TUPLES_OK, &res);
    if (err != KS_OK)
        return fail_txn(s, err);
    size_t hint = 0;
    for (int r = 0; err == KS_OK && r < PQntuples(res); r++) {
        ks_value v;
        err = ks_pg_cell(res, r, 0, &v);
        if (err != KS_OK || v.type != KS_VALUE_INTEGER) {
            err = KS_ERR_STORE;
            break;
        }
        /* rows usually come back in the arrays' order: look from the last hit */
        size_t k = 0;
        for (; k < n && ids[(hint + k) % n]->integer != v.integer; k++) {
        }
        if (k == n) {
            err = KS_ERR_STORE; /* an id that was not asked for */
            break;
        }
        hint = (hint + k) % n;
        swapped[hint] = 1;
        hint = (hint + 1) % n;
    }
    PQclear(res);
    return err == KS_OK ? KS_OK : fail_txn(s, err);
}

/* ops.cas: the compare-and-swap of one row, through cas_batch's statement. */
static ks_err op_cas(void *self, const ks_value *id, const ks_value *old, ks_bytes new_value,
                     int *swapped)
{
    if (swapped == NULL)
        return KS_ERR_INVALID_ARGUMENT;
    *swapped = 0;
    return op_cas_batch(self, 1, &id, &old, &new_value, swapped);
}

/* ops.quarantine: record the row's id with an error name and the bound
 * migration's parameters (an entry of another migration is taken over,
 * one of the same stands). */
static ks_err op_quarantine(void *self, const ks_value *id, const char *error)
{
    pg_store *s = self;
    if (!writable(s) || !value_ok(id) || id->type != KS_VALUE_INTEGER || error == NULL ||
        error[0] == '\0' || strlen(error) > ERROR_NAME_MAX)
        return KS_ERR_INVALID_ARGUMENT;
    char idtext[24];
    snprintf(idtext, sizeof idtext, "%lld", (long long)id->integer);
    params p = {.n = 0};
    p_str(&p, s->table);
    p_str(&p, s->column);
    p_str(&p, idtext);
    p_str(&p, error);
    p_int(&p, (int64_t)time(NULL));
    if (s->mig != NULL)
        p_str(&p, s->mig);
    else
        p_null(&p);
    PGresult *res;
    ks_err err = run_prepared(s, ST_QUARANTINE, &p, PGRES_COMMAND_OK, &res);
    PQclear(res);
    return err == KS_OK ? KS_OK : fail_txn(s, err);
}

/* ops.bind_migration: keep a copy of params (keyshift/rowstore.h).  Text
 * with no NUL: the canonical string never has one. */
static ks_err op_bind_migration(void *self, ks_bytes mig_params)
{
    pg_store *s = self;
    if (s == NULL || mig_params.len > KS_ROWSTORE_PARAMS_MAX || (mig_params.len != 0 && mig_params.ptr == NULL) ||
        (mig_params.len != 0 && memchr(mig_params.ptr, 0, mig_params.len) != NULL))
        return KS_ERR_INVALID_ARGUMENT;
    char *copy = NULL;
    if (mig_params.ptr != NULL) {
        copy = malloc(mig_params.len + 1);
        if (copy == NULL)
            return KS_ERR_NO_MEMORY;
        memcpy(copy, mig_params.ptr, mig_params.len);
        copy[mig_params.len] = '\0';
    }
    free(s->mig);
    s->mig = copy;
    return KS_OK;
}

/* Concatenate the n strings of parts into a new string (NULL when out
 * of memory); a NULL part is skipped. */
char *ks_pgs_concat(const char *const *parts, size_t n)
{
    size_t len = 1;
    for (size_t i = 0; i < n; i++)
        len += parts[i] != NULL ? strlen(parts[i]) : 0;
    char *out = malloc(len), *q = out;
    if (out == NULL)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        size_t k = parts[i] != NULL ? strlen(parts[i]) : 0;
        memcpy(q, parts[i] != NULL ? parts[i] : "", k);
        q += k;
    }
    *q = '\0';
    return out;
}

/* Run sql (built with ks_pgs_concat: NULL when out of memory) with p,
 * binary results; frees sql.  As run_prepared. */
static ks_err run_params(pg_store *s, char *sql, const params *p, ExecStatusType want,
                         PGresult **out)
{
    *out = NULL;
    if (sql == NULL)
        return KS_ERR_NO_MEMORY;
    PGresult *res = PQexecParams(s->conn, sql, p->n, NULL, p->v, p->len, p->fmt, 1);
    free(sql);
    if (res != NULL && PQresultStatus(res) == want) {
        *out = res;
        return KS_OK;
    }
    ks_err err = ks_pgs_result_err(s, res);
    PQclear(res);
    return err;
}

/* The id of a quarantine entry (decimal text, as op_quarantine writes
 * it) as an INTEGER; else the text as it is. */
static ks_value entry_id(ks_bytes text)
{
    int64_t v = 0;
    size_t i = text.len > 0 && text.ptr[0] == '-' ? 1 : 0;
    int ok = text.len > i && text.len - i <= 18;
    for (; ok && i < text.len; i++) {
        ok = text.ptr[i] >= '0' && text.ptr[i] <= '9';
        v = v * 10 + (text.ptr[i] - '0');
    }
    if (ok && (text.len > 1 && (text.ptr[text.ptr[0] == '-'] == '0')))
        ok = 0; /* not canonical decimal */
    if (!ok)
        return (ks_value){KS_VALUE_TEXT, 0, text};
    return (ks_value){KS_VALUE_INTEGER, text.ptr[0] == '-' ? -v : v, {NULL, 0}};
}

/* ops.quarantine_list: the target's entries in id order (numeric ids by
 * value). */
static ks_err op_quarantine_list(void *self, ks_rowstore_quarantine_fn fn, void *arg)
{
    pg_store *s = self;
    if (s == NULL || fn == NULL || s->in_txn)
        return KS_ERR_INVALID_ARGUMENT;
    if (!s->have_tables)
        return KS_OK; /* read-only, no keyshift tables: nothing was ever quarantined */
    const char *parts[] = {"SELECT id, error, ", s->q_params ? "params" : "NULL::text",
                           ", time FROM ", s->qschema,
                           ".keyshift_quarantine WHERE tbl = $1::text AND col = $2::text "
                           "ORDER BY length(id), id"};
    params p = {.n = 0};
    p_str(&p, s->table);
    p_str(&p, s->column);
    PGresult *res;
    ks_err err = run_params(s, ks_pgs_concat(parts, 5), &p, PGRES_TUPLES_OK, &res);
    int n = err == KS_OK ? PQntuples(res) : 0;
    for (int i = 0; i < n && err == KS_OK; i++) {
        ks_value id, error, mig, t;
        err = ks_pg_cell(res, i, 0, &id);
        if (err == KS_OK)
            err = ks_pg_cell(res, i, 1, &error);
        if (err == KS_OK)
            err = ks_pg_cell(res, i, 2, &mig);
        if (err == KS_OK)
            err = ks_pg_cell(res, i, 3, &t);
        if (err == KS_OK && (id.type != KS_VALUE_TEXT || id.bytes.len == 0 ||
                             error.type != KS_VALUE_TEXT || error.bytes.len == 0 ||
                             error.bytes.len > ERROR_NAME_MAX || t.type != KS_VALUE_INTEGER ||
                             (mig.type != KS_VALUE_NULL && mig.type != KS_VALUE_TEXT)))
            err = KS_ERR_STORE; /* not what op_quarantine writes */
        if (err != KS_OK)
            break;
        ks_quarantine_entry e = {entry_id(id.bytes), error.bytes,
                                 mig.type == KS_VALUE_TEXT ? mig.bytes : (ks_bytes){NULL, 0},
                                 t.integer};
        if (fn(arg, &e) != 0)
            break;
    }
    PQclear(res);
    return err;
}

/* ops.quarantine_release: DELETE the target's entries sel selects. */
static ks_err op_quarantine_release(void *self, const ks_quarantine_select *sel,
                                    uint64_t *released)
{
    pg_store *s = self;
    if (!writable(s) || sel == NULL || released == NULL ||
        (!sel->all && sel->id == NULL && sel->error == NULL) ||
        (sel->id != NULL && sel->id->type != KS_VALUE_INTEGER && sel->id->type != KS_VALUE_TEXT) ||
        (sel->id != NULL && sel->id->type == KS_VALUE_TEXT &&
         (sel->id->bytes.ptr == NULL || memchr(sel->id->bytes.ptr, 0, sel->id->bytes.len) != NULL)))
        return KS_ERR_INVALID_ARGUMENT;
    *released = 0;
    char idtext[24];
    const char *parts[] = {"DELETE FROM ", s->qschema,
                           ".keyshift_quarantine WHERE tbl = $1::text AND col = $2::text "
                           "AND ($3::text IS NULL OR id = $3::text) "
                           "AND ($4::text IS NULL OR error = $4::text)"};
    params p = {.n = 0};
    p_str(&p, s->table);
    p_str(&p, s->column);
    if (sel->id == NULL) {
        p_null(&p);
    } else if (sel->id->type == KS_VALUE_INTEGER) {
        snprintf(idtext, sizeof idtext, "%lld", (long long)sel->id->integer);
        p_str(&p, idtext);
    } else {
        p_bytes(&p, sel->id->bytes.ptr, sel->id->bytes.len);
    }
    if (sel->error != NULL)
        p_str(&p, sel->error);
    else
        p_null(&p);
    PGresult *res;
    ks_err err = run_params(s, ks_pgs_concat(parts, 3), &p, PGRES_COMMAND_OK, &res);
    if (err == KS_OK)
        *released = strtoull(PQcmdTuples(res), NULL, 10);
    PQclear(res);
    return err == KS_OK ? KS_OK : fail_txn(s, err);
}

/* Nonzero when every count of cp fits a bigint. */
static int counts_fit(const ks_checkpoint *cp)
{
    return cp->done <= INT64_MAX && cp->skipped <= INT64_MAX && cp->raced <= INT64_MAX &&
           cp->quarantined <= INT64_MAX && cp->wrong_state <= INT64_MAX;
}

/* See pg_decode.h (ks_pg_checkpoint_ints). */
void ks_pg_checkpoint_ints(const ks_checkpoint *cp, int64_t out[KS_PG_CHECKPOINT_NINTS])
{
    const int64_t v[KS_PG_CHECKPOINT_NINTS] = {
        (int64_t)cp->pass,  (int64_t)cp->done,        (int64_t)cp->skipped,
        (int64_t)cp->raced, (int64_t)cp->quarantined, (int64_t)cp->wrong_state,
        cp->started,        cp->updated,              cp->finished};
    memcpy(out, v, sizeof v);
}

/* ops.checkpoint_save: upsert the row of (target, cp->params). */
static ks_err op_checkpoint_save(void *self, const ks_checkpoint *cp)
{
    pg_store *s = self;
    if (!writable(s) || cp == NULL || cp->params.ptr == NULL || cp->params.len == 0 ||
        cp->params.len > (size_t)INT32_MAX || cp->state.ptr == NULL || cp->state.len == 0 ||
        cp->state.len > 64 || !value_ok(&cp->cursor) ||
        (cp->cursor.type != KS_VALUE_NULL && cp->cursor.type != KS_VALUE_INTEGER) ||
        !counts_fit(cp))
        return KS_ERR_INVALID_ARGUMENT;
    params p = {.n = 0};
    p_str(&p, s->table);
    p_str(&p, s->column);
    p_bytes(&p, cp->params.ptr, cp->params.len);
    p_bytes(&p, cp->state.ptr, cp->state.len);
    if (cp->cursor.type == KS_VALUE_NULL)
        p_null(&p);
    else
        p_int(&p, cp->cursor.integer);
    int64_t counts[KS_PG_CHECKPOINT_NINTS];
    ks_pg_checkpoint_ints(cp, counts);
    for (size_t i = 0; i < KS_PG_CHECKPOINT_NINTS; i++)
        p_int(&p, counts[i]);
    PGresult *res;
    ks_err err = run_prepared(s, ST_CP_SAVE, &p, PGRES_COMMAND_OK, &res);
    PQclear(res);
    return err == KS_OK ? KS_OK : fail_txn(s, err);
}

/* See pg_decode.h (ks_pg_read_checkpoint). */
ks_err ks_pg_read_checkpoint(const PGresult *res, int row, ks_checkpoint *cp)
{
    ks_value v[12];
    memset(cp, 0, sizeof *cp);
    for (int i = 0; i < 12; i++) {
        ks_err err = ks_pg_cell(res, row, i, &v[i]);
        if (err != KS_OK)
            return err;
        ks_value_type want = i < 2 ? KS_VALUE_TEXT : KS_VALUE_INTEGER;
        if (v[i].type != want && !(i == 2 && v[i].type == KS_VALUE_NULL))
            return KS_ERR_STORE;
        if (i >= 3 && i < 9 && v[i].integer < 0)
            return KS_ERR_STORE;
        if (i < 2 && memchr(v[i].bytes.ptr, 0, v[i].bytes.len) != NULL)
            return KS_ERR_STORE; /* text never holds a NUL: not what the store wrote */
    }
    if (v[3].integer > (int64_t)UINT32_MAX)
        return KS_ERR_STORE;
    cp->params = v[0].bytes;
    cp->state = v[1].bytes;
    cp->cursor = v[2];
    cp->pass = (uint32_t)v[3].integer;
    cp->done = (uint64_t)v[4].integer;
    cp->skipped = (uint64_t)v[5].integer;
    cp->raced = (uint64_t)v[6].integer;
    cp->quarantined = (uint64_t)v[7].integer;
    cp->wrong_state = (uint64_t)v[8].integer;
    cp->started = v[9].integer;
    cp->updated = v[10].integer;
    cp->finished = v[11].integer;
    return KS_OK;
}

/* ops.checkpoint_load: the checkpoint of params, or the most recently
 * updated one for params {NULL, 0}; KS_ERR_NOT_FOUND when none (also when
 * a read-only store's schema has no keyshift tables). */
static ks_err op_checkpoint_load(void *self, ks_bytes params_, ks_checkpoint *cp)
{
    pg_store *s = self;
    if (s == NULL || cp == NULL || (params_.ptr == NULL && params_.len > 0) ||
        params_.len > (size_t)INT32_MAX)
        return KS_ERR_INVALID_ARGUMENT;
    if (!s->have_tables)
        return KS_ERR_NOT_FOUND;
    int latest = params_.ptr == NULL;
    params p = {.n = 0};
    p_str(&p, s->table);
    p_str(&p, s->column);
    if (!latest)
        p_bytes(&p, params_.ptr, params_.len);
    PGresult *res;
    ks_err err = run_prepared(s, latest ? ST_CP_LATEST : ST_CP_LOAD, &p, PGRES_TUPLES_OK, &res);
    if (err != KS_OK)
        return fail_txn(s, err);
    keep_result(s, res); /* after the run: params_ may have viewed the old result */
    if (PQntuples(res) == 0)
        return KS_ERR_NOT_FOUND;
    err = ks_pg_read_checkpoint(s->res, 0, cp);
    return err == KS_OK ? KS_OK : fail_txn(s, err);
}

/* ops.commit: COMMIT; a transaction the server had already aborted
 * answers ROLLBACK, which is a failure too. */
static ks_err op_commit(void *self)
{
    pg_store *s = self;
    if (!writable(s))
        return KS_ERR_INVALID_ARGUMENT;
    char tag[16] = "";
    ks_err err = ks_pgs_run_simple(s, "COMMIT", tag, sizeof tag);
    if (err == KS_OK && strcmp(tag, "COMMIT") != 0)
        err = KS_ERR_STORE;
    if (err != KS_OK)
        ks_pgs_rollback_now(s);
    s->in_txn = 0;
    return err;
}

/* ops.rollback: roll back an open transaction; a no-op outside one. */
static void op_rollback(void *self)
{
    pg_store *s = self;
    if (s != NULL)
        ks_pgs_rollback_now(s);
}

/* Release everything of s: the result, the connection (rolling back),
 * names, buffer.  Used by close and by a failed open. */
void ks_pgs_store_free(pg_store *s)
{
    if (s == NULL)
        return;
    keep_result(s, NULL);
    if (s->conn != NULL) {
        ks_pgs_rollback_now(s);
        PQfinish(s->conn);
    }
    free(s->table);
    free(s->column);
    free(s->qschema);
    free(s->qtable);
    free(s->qid);
    free(s->mig);
    free(s->buf);
    free(s);
}

/* ops.close: roll back any open transaction and release the store. */
static void op_close(void *self)
{
    ks_pgs_store_free(self);
}

/* See pg_store_internal.h. */
const ks_rowstore_ops ks_pgs_ops = {
    .scan = op_scan,
    .count = op_count,
    .begin = op_begin,
    .cas = op_cas,
    .quarantine = op_quarantine,
    .checkpoint_save = op_checkpoint_save,
    .checkpoint_load = op_checkpoint_load,
    .commit = op_commit,
    .rollback = op_rollback,
    .close = op_close,
    .visit_values = NULL,
    .visit_rows = op_visit_rows,
    .cas_batch = op_cas_batch,
    .visit_rows_range = op_visit_rows_range,
    .bind_migration = op_bind_migration,
    .quarantine_list = op_quarantine_list,
    .quarantine_release = op_quarantine_release,
};

/* See keyshift/rowstore_pg.h. */
ks_err ks_rowstore_pg_set_write_gate(const ks_rowstore *store, const char *sql)
{
    if (store == NULL || store->ops != &ks_pgs_ops || store->self == NULL)
        return KS_ERR_INVALID_ARGUMENT;
    pg_store *s = store->self;
    if (s->read_only || s->in_txn)
        return KS_ERR_INVALID_ARGUMENT;
    if (s->gate) {
        PGresult *res = PQexec(s->conn, "DEALLOCATE ks_gate");
        PQclear(res);
        s->gate = 0;
    }
    if (sql == NULL)
        return KS_OK;
    PGresult *res = PQprepare(s->conn, "ks_gate", sql, 0, NULL);
    ks_err err = PQresultStatus(res) == PGRES_COMMAND_OK ? KS_OK : KS_ERR_STORE;
    PQclear(res);
    s->gate = err == KS_OK;
    return err;
}

/* ---- for pg_chunks.c (pg_internal.h) ----------------------------------------------- */

/* See pg_internal.h. */
ks_err ks_pg_store_parts_of(const ks_rowstore *store, ks_pg_store_parts *out)
{
    if (store == NULL || store->ops != &ks_pgs_ops || store->self == NULL || out == NULL)
        return KS_ERR_INVALID_ARGUMENT;
    const pg_store *s = store->self;
    *out = (ks_pg_store_parts){s->conn,    s->table,  s->column,   s->qschema,
                               s->qtable,  s->qid,    s->read_only};
    return KS_OK;
}

/* See pg_internal.h. */
int ks_pg_store_in_txn(const ks_rowstore *store)
{
    return store != NULL && store->ops == &ks_pgs_ops && ((const pg_store *)store->self)->in_txn;
}

/* See pg_internal.h. */
void ks_pg_store_fail_txn(const ks_rowstore *store)
{
    if (store != NULL && store->ops == &ks_pgs_ops)
        (void)fail_txn(store->self, KS_OK);
}

/* See pg_internal.h. */
ks_err ks_pg_error_of(PGconn *conn, const PGresult *res)
{
    if (PQstatus(conn) != CONNECTION_OK)
        return KS_ERR_UNAVAILABLE;
    return res == NULL ? KS_ERR_STORE : ks_pg_map_sqlstate(PQresultErrorField(res, PG_DIAG_SQLSTATE));
}
