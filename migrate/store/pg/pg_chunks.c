/*
 * migrate/store/pg/pg_chunks.c -- the PostgreSQL chunk coordinator
 * (keyshift/chunks.h, keyshift/chunks_pg.h) on a PostgreSQL row store's
 * connection (pg_internal.h).
 *
 * Every statement is a constant text with the target's schema, as the
 * store quoted it, in place of @S, and every value a bound text
 * parameter ($1 tbl, $2 col, $3 params in every statement).  claim,
 * renew, release and plan run as their own short transactions (a single
 * statement in autocommit, or BEGIN ... COMMIT for plan); save runs in
 * the store's open transaction.  Leases are timed by now() of the
 * database.
 */
#define _POSIX_C_SOURCE 200809L

#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include <keyshift/chunks.h>
#include <keyshift/chunks_pg.h>

#include "../../errbuf.h"
#include "pg_decode.h"
#include "pg_util.h"
#include "pg_internal.h"
#include "../../alloc_hook.h"

/* The columns of a chunk (the table as c), in ks_pg_read_chunk's order
 * (KS_PG_CHUNK_NCOLS of them): owner and lease_until NULL when no lease,
 * as the table has them (never coalesced: a NULL where the schema
 * forbids one must read as an error, not as a value). */
#define CHUNK_COLS                                                                           \
    "c.chunk_id, c.lo, c.hi, c.state, c.cursor, c.pass, c.done, c.skipped, c.raced, "         \
    "c.quarantined, c.wrong_state, c.owner, "                                                \
    "(extract(epoch FROM c.lease_until) * 1000)::int8, "                                     \
    "coalesce(c.lease_until > now(), false)"

/* The key of a migration's chunks. */
#define KEY "tbl = $1::text AND col = $2::text AND params = $3::text"

/* The statements, @S standing for the quoted schema. */
static const char DDL[] =
    "CREATE TABLE IF NOT EXISTS @S.keyshift_chunk("
    "tbl text NOT NULL, col text NOT NULL, params text NOT NULL, chunk_id bigint NOT NULL, "
    "lo bigint NOT NULL, hi bigint NOT NULL, state text NOT NULL, cursor bigint, "
    "pass bigint NOT NULL, done bigint NOT NULL, skipped bigint NOT NULL, "
    "raced bigint NOT NULL, quarantined bigint NOT NULL, wrong_state bigint NOT NULL, "
    "owner text, lease_until timestamptz, claims bigint NOT NULL, "
    "updated timestamptz NOT NULL, PRIMARY KEY (tbl, col, params, chunk_id)); "
    /* claims look for the first chunk not complete: without this index each
     * claim would pass over every complete chunk before it */
    "CREATE INDEX IF NOT EXISTS keyshift_chunk_open ON @S.keyshift_chunk"
    "(tbl, col, params, chunk_id) WHERE state <> 'complete'";
static const char SQL_PLANNED[] = "SELECT count(*) FROM @S.keyshift_chunk WHERE " KEY;
/* $4 first id, $5 ids per chunk, $6 number of chunks */
static const char SQL_PLAN[] =
    "INSERT INTO @S.keyshift_chunk(tbl, col, params, chunk_id, lo, hi, state, cursor, pass, "
    "done, skipped, raced, quarantined, wrong_state, owner, lease_until, claims, updated) "
    "SELECT $1::text, $2::text, $3::text, g, "
    "CASE WHEN g = 0 THEN -9223372036854775808 "
    "ELSE ($4::int8::numeric + g::numeric * $5::int8)::int8 END, "
    "CASE WHEN g = $6::int8 - 1 THEN 9223372036854775807 "
    "ELSE ($4::int8::numeric + (g + 1)::numeric * $5::int8 - 1)::int8 END, "
    "'pending', NULL, 1, 0, 0, 0, 0, 0, NULL, NULL, 0, now() "
    "FROM generate_series(0::int8, $6::int8 - 1) AS g ON CONFLICT DO NOTHING";
/* $4 owner, $5 lease ms.  The pick is a CTE, run once: as a subquery
 * in FROM it may be rescanned per row of the join, each rescan skipping
 * the row the last one locked and so claiming several chunks. */
static const char SQL_CLAIM[] =
    "WITH f AS (SELECT chunk_id FROM @S.keyshift_chunk WHERE " KEY
    " AND state <> 'complete' AND (owner IS NULL OR lease_until < now()) "
    "ORDER BY chunk_id LIMIT 1 FOR UPDATE SKIP LOCKED) "
    "UPDATE @S.keyshift_chunk AS c SET owner = $4::text, "
    "lease_until = now() + $5::int8 * interval '1 millisecond', claims = c.claims + 1, "
    "state = 'running', updated = now() FROM f "
    "WHERE c.tbl = $1::text AND c.col = $2::text AND c.params = $3::text "
    "AND c.chunk_id = f.chunk_id RETURNING " CHUNK_COLS;
/* $4 owner, $5 lease ms, $6 chunk */
static const char SQL_RENEW[] =
    "UPDATE @S.keyshift_chunk SET lease_until = now() + $5::int8 * interval '1 millisecond', "
    "updated = now() WHERE " KEY " AND chunk_id = $6::int8 AND owner = $4::text "
    "AND state <> 'complete' RETURNING 1";
/* $4 owner, $5 lease ms, $6 chunk, $7 state, $8 cursor, $9 pass, $10..$14 counts */
static const char SQL_SAVE[] =
    "UPDATE @S.keyshift_chunk SET state = $7::text, cursor = $8::int8, pass = $9::int8, "
    "done = $10::int8, skipped = $11::int8, raced = $12::int8, quarantined = $13::int8, "
    "wrong_state = $14::int8, "
    "owner = CASE WHEN $7::text = 'running' THEN owner END, "
    "lease_until = CASE WHEN $7::text = 'running' "
    "THEN now() + $5::int8 * interval '1 millisecond' END, updated = now() "
    "WHERE " KEY " AND chunk_id = $6::int8 AND owner = $4::text AND state <> 'complete' "
    "RETURNING 1";
/* $4 owner, $5 chunk */
static const char SQL_RELEASE[] =
    "UPDATE @S.keyshift_chunk SET owner = NULL, lease_until = NULL, updated = now() "
    "WHERE " KEY " AND chunk_id = $5::int8 AND owner = $4::text RETURNING 1";
/* The sums are numeric: cast back to bigint (one past INT64_MAX fails
 * on the server, 22003, a KS_ERR_STORE). */
static const char SQL_SUMMARY[] =
    "SELECT count(*), count(*) FILTER (WHERE state = 'complete'), "
    "count(*) FILTER (WHERE state <> 'complete' AND owner IS NOT NULL "
    "AND lease_until >= now()), "
    "coalesce(sum(done), 0)::int8, coalesce(sum(skipped), 0)::int8, "
    "coalesce(sum(raced), 0)::int8, coalesce(sum(quarantined), 0)::int8, "
    "coalesce(sum(wrong_state), 0)::int8, coalesce(max(pass), 0)::int8 "
    "FROM @S.keyshift_chunk WHERE " KEY;
static const char SQL_LIST[] =
    "SELECT " CHUNK_COLS " FROM @S.keyshift_chunk AS c WHERE " KEY " ORDER BY chunk_id";

/* The statements of one coordinator, with the schema in place. */
enum { Q_PLANNED, Q_PLAN, Q_CLAIM, Q_RENEW, Q_SAVE, Q_RELEASE, Q_SUMMARY, Q_LIST, Q_N };

/* One coordinator: the borrowed store, its statements, the kept result
 * (every view of a ks_chunk points into it) and the text parameters. */
typedef struct pg_chunks {
    const ks_rowstore *store;
    ks_pg_store_parts parts;
    char *sql[Q_N];
    PGresult *res;
    char *params, *owner;     /* NUL-terminated copies of the last call's */
    size_t params_cap, owner_cap;
    int absent;               /* read-only, and keyshift_chunk does not exist: no chunks */
    char why[128];            /* what the last malformed row broke (a column, no value) */
} pg_chunks;

/* The text parameters of one statement. */
typedef struct tparams {
    const char *v[14];
    char num[14][24];
    int n;
} tparams;

/* tmpl with every @S replaced by qs, in new memory (NULL: out of memory). */
static char *with_schema(const char *tmpl, const char *qs)
{
    size_t n = 0, ql = strlen(qs);
    for (const char *p = tmpl; (p = strstr(p, "@S")) != NULL; p += 2)
        n++;
    char *out = malloc(strlen(tmpl) + n * ql + 1), *q = out;
    if (out == NULL)
        return NULL;
    for (const char *p = tmpl; *p != '\0';) {
        if (p[0] == '@' && p[1] == 'S') {
            memcpy(q, qs, ql);
            q += ql;
            p += 2;
        } else {
            *q++ = *p++;
        }
    }
    *q = '\0';
    return out;
}

/* Copy b into *buf (grown) as a NUL-terminated string; KS_ERR_INVALID_ARGUMENT
 * for bytes with a NUL (text parameters cannot carry one), empty or longer
 * than max. */
static ks_err cstr(ks_bytes b, size_t max, char **buf, size_t *cap)
{
    if (b.ptr == NULL || b.len == 0 || b.len > max || memchr(b.ptr, 0, b.len) != NULL)
        return KS_ERR_INVALID_ARGUMENT;
    if (b.len + 1 > *cap) {
        char *p = realloc(*buf, b.len + 1);
        if (p == NULL)
            return KS_ERR_NO_MEMORY;
        *buf = p;
        *cap = b.len + 1;
    }
    memcpy(*buf, b.ptr, b.len);
    (*buf)[b.len] = '\0';
    return KS_OK;
}

/* Start the parameters of a statement with the key ($1..$3) and, when
 * owner is not NULL, $4 owner; params copied into c. */
static ks_err key_params(pg_chunks *c, ks_bytes params, const ks_bytes *owner, tparams *p)
{
    ks_err err = cstr(params, (size_t)INT32_MAX, &c->params, &c->params_cap);
    if (err == KS_OK && owner != NULL) /* an owner the chunk's reader would refuse: never written */
        err = cstr(*owner, KS_PG_CHUNK_OWNER_MAX, &c->owner, &c->owner_cap);
    if (err != KS_OK)
        return err;
    p->n = 0;
    p->v[p->n++] = c->parts.table;
    p->v[p->n++] = c->parts.column;
    p->v[p->n++] = c->params;
    if (owner != NULL)
        p->v[p->n++] = c->owner;
    return KS_OK;
}

/* Add an integer parameter (in decimal). */
static void p_num(tparams *p, int64_t v)
{
    snprintf(p->num[p->n], sizeof p->num[p->n], "%" PRId64, v);
    p->v[p->n] = p->num[p->n];
    p->n++;
}

/* Run statement q with p (text in, binary out, read as the store reads
 * its own results: pg_decode.h) and keep its result when it returned
 * want; else the store's mapping of the failure. */
static ks_err run(pg_chunks *c, int q, const tparams *p, ExecStatusType want)
{
    PGresult *res = PQexecParams(c->parts.conn, c->sql[q], p->n, NULL, p->v, NULL, NULL, 1);
    if (c->res != NULL)
        PQclear(c->res);
    c->res = NULL;
    if (res != NULL && PQresultStatus(res) == want) {
        c->res = res;
        return KS_OK;
    }
    ks_err err = ks_pg_error_of(c->parts.conn, res);
    PQclear(res);
    return err;
}

/* The names of CHUNK_COLS's cells, for messages (no values). */
static const char *const chunk_col[KS_PG_CHUNK_NCOLS] = {KS_PG_CHUNK_NAMES};
/* The names of SQL_SUMMARY's cells. */
static const char *const summary_col[KS_PG_SUMMARY_NCOLS] = {KS_PG_SUMMARY_NAMES};

/* Refuse a row of keyshift_chunk: KS_ERR_STORE, errbuf naming column
 * `name` and the rule its cell broke (never the cell's value). */
static ks_err bad_cell(char *errbuf, size_t errbuf_len, const char *name, const char *why)
{
    return ks_errbuf_fail(errbuf, errbuf_len, KS_ERR_STORE, "keyshift_chunk: column %s %s", name, why);
}

/* Cell (row, col) of a binary result as a bigint within [lo, hi] into
 * *out; NULL is refused unless nullable (then *is_null is set and *out
 * 0).  KS_ERR_STORE naming the column for another type (of the column,
 * so a NULL in a column of another type too), length or a value out of
 * range. */
static ks_err int_cell(const PGresult *res, int row, int col, const char *name, int64_t lo,
                       int64_t hi, int nullable, int *is_null, int64_t *out, char *errbuf,
                       size_t errbuf_len)
{
    ks_value v;
    *out = 0;
    if (is_null != NULL)
        *is_null = 0;
    if (PQftype(res, col) != KS_PG_OID_INT8 || ks_pg_cell(res, row, col, &v) != KS_OK ||
        (v.type != KS_VALUE_INTEGER && v.type != KS_VALUE_NULL))
        return bad_cell(errbuf, errbuf_len, name, "is not a bigint");
    if (v.type == KS_VALUE_NULL) {
        if (!nullable || is_null == NULL)
            return bad_cell(errbuf, errbuf_len, name, "is NULL");
        *is_null = 1;
        return KS_OK;
    }
    if (v.integer < lo || v.integer > hi)
        return bad_cell(errbuf, errbuf_len, name, "is out of range");
    *out = v.integer;
    return KS_OK;
}

/* Cell (row, col) of a binary result as text of 1..max bytes without a
 * NUL into *out (a view of res); NULL sets *is_null when nullable.
 * KS_ERR_STORE naming the column otherwise (a NULL in a column that is
 * not text too). */
static ks_err text_cell(const PGresult *res, int row, int col, const char *name, size_t max,
                        int nullable, int *is_null, ks_bytes *out, char *errbuf,
                        size_t errbuf_len)
{
    ks_value v;
    *out = (ks_bytes){NULL, 0};
    *is_null = 0;
    if (PQftype(res, col) != KS_PG_OID_TEXT || ks_pg_cell(res, row, col, &v) != KS_OK ||
        (v.type != KS_VALUE_TEXT && v.type != KS_VALUE_NULL))
        return bad_cell(errbuf, errbuf_len, name, "is not text");
    if (v.type == KS_VALUE_NULL) {
        if (!nullable)
            return bad_cell(errbuf, errbuf_len, name, "is NULL");
        *is_null = 1;
        return KS_OK;
    }
    if (v.bytes.len == 0 || v.bytes.len > max || memchr(v.bytes.ptr, 0, v.bytes.len) != NULL)
        return bad_cell(errbuf, errbuf_len, name, "is not a valid name");
    *out = v.bytes;
    return KS_OK;
}

/* Nonzero when st is one of KS_PG_CHUNK_STATES; *running when it is
 * "running". */
static int known_state(ks_bytes st, int *running)
{
    static const char *const states[] = {KS_PG_CHUNK_STATES};
    for (size_t i = 0; i < sizeof states / sizeof states[0]; i++)
        if (st.len == strlen(states[i]) && memcmp(st.ptr, states[i], st.len) == 0) {
            *running = strcmp(states[i], "running") == 0;
            return 1;
        }
    return 0;
}

/* See pg_decode.h (ks_pg_read_chunk). */
ks_err ks_pg_read_chunk(const PGresult *res, int row, ks_bytes params, ks_chunk *k,
                        char *errbuf, size_t errbuf_len)
{
    memset(k, 0, sizeof *k);
    if (row < 0 || row >= PQntuples(res) || PQnfields(res) != KS_PG_CHUNK_NCOLS)
        return ks_errbuf_fail(errbuf, errbuf_len, KS_ERR_STORE, "keyshift_chunk: a row of another shape");
    int64_t v[KS_PG_CHUNK_NCOLS] = {0};
    int cursor_null = 0, owner_null = 0, lease_null = 0, running = 0;
    ks_err err = int_cell(res, row, 0, chunk_col[0], 0, (int64_t)KS_CHUNKS_MAX - 1, 0, NULL, &v[0],
                          errbuf, errbuf_len);
    for (int i = 1; err == KS_OK && i <= 2; i++)
        err = int_cell(res, row, i, chunk_col[i], INT64_MIN, INT64_MAX, 0, NULL, &v[i], errbuf,
                       errbuf_len);
    if (err == KS_OK && v[1] > v[2])
        err = bad_cell(errbuf, errbuf_len, "lo", "is above hi");
    int st_null;
    if (err == KS_OK)
        err = text_cell(res, row, 3, chunk_col[3], 64, 0, &st_null, &k->cp.state, errbuf,
                        errbuf_len);
    if (err == KS_OK && !known_state(k->cp.state, &running))
        err = bad_cell(errbuf, errbuf_len, "state", "is not a known state");
    if (err == KS_OK)
        err = int_cell(res, row, 4, chunk_col[4], v[1], v[2], 1, &cursor_null, &v[4], errbuf,
                       errbuf_len);
    if (err == KS_OK)
        err = int_cell(res, row, 5, chunk_col[5], 1, UINT32_MAX, 0, NULL, &v[5], errbuf,
                       errbuf_len);
    for (int i = 6; err == KS_OK && i <= 10; i++)
        err = int_cell(res, row, i, chunk_col[i], 0, INT64_MAX, 0, NULL, &v[i], errbuf,
                       errbuf_len);
    if (err == KS_OK)
        err = text_cell(res, row, 11, chunk_col[11], KS_PG_CHUNK_OWNER_MAX, 1, &owner_null,
                        &k->owner, errbuf, errbuf_len);
    if (err == KS_OK)
        err = int_cell(res, row, 12, chunk_col[12], 1, INT64_MAX, 1, &lease_null, &v[12], errbuf,
                       errbuf_len);
    if (err == KS_OK && owner_null != lease_null)
        err = bad_cell(errbuf, errbuf_len, "owner", "and lease_until are not both set or NULL");
    if (err == KS_OK && !owner_null && !running)
        err = bad_cell(errbuf, errbuf_len, "owner", "is set on a chunk not running");
    if (err == KS_OK && ks_pg_bool(res, row, 13, &k->lease_live) != KS_OK)
        err = bad_cell(errbuf, errbuf_len, "lease_live", "is not a boolean");
    if (err == KS_OK && lease_null && k->lease_live)
        err = bad_cell(errbuf, errbuf_len, "lease_live", "is true without a lease");
    if (err != KS_OK) {
        memset(k, 0, sizeof *k);
        return err;
    }
    if (owner_null)
        k->owner = (ks_bytes){(const uint8_t *)"", 0};
    k->id = v[0];
    k->lo = v[1];
    k->hi = v[2];
    k->cp.params = params;
    if (!cursor_null)
        k->cp.cursor = (ks_value){KS_VALUE_INTEGER, v[4], {NULL, 0}};
    k->cp.pass = (uint32_t)v[5];
    k->cp.done = (uint64_t)v[6];
    k->cp.skipped = (uint64_t)v[7];
    k->cp.raced = (uint64_t)v[8];
    k->cp.quarantined = (uint64_t)v[9];
    k->cp.wrong_state = (uint64_t)v[10];
    k->lease_until_ms = v[12];
    return KS_OK;
}

/* See pg_decode.h (ks_pg_read_summary). */
ks_err ks_pg_read_summary(const PGresult *res, ks_chunk_summary *out, char *errbuf,
                          size_t errbuf_len)
{
    memset(out, 0, sizeof *out);
    if (PQntuples(res) != 1 || PQnfields(res) != KS_PG_SUMMARY_NCOLS)
        return ks_errbuf_fail(errbuf, errbuf_len, KS_ERR_STORE, "keyshift_chunk: a summary of another shape");
    int64_t v[KS_PG_SUMMARY_NCOLS];
    ks_err err = KS_OK;
    for (int i = 0; err == KS_OK && i < KS_PG_SUMMARY_NCOLS; i++)
        err = int_cell(res, 0, i, summary_col[i], 0, i <= 2 ? (int64_t)KS_CHUNKS_MAX : INT64_MAX,
                       0, NULL, &v[i], errbuf, errbuf_len);
    if (err == KS_OK && v[1] + v[2] > v[0]) /* each <= KS_CHUNKS_MAX here: no overflow */
        err = bad_cell(errbuf, errbuf_len, v[1] > v[0] ? "complete" : "leased",
                       "is above the chunks' count");
    if (err == KS_OK && v[0] > 0 && (v[8] < 1 || v[8] > (int64_t)UINT32_MAX))
        err = bad_cell(errbuf, errbuf_len, "max_pass", "is out of range");
    for (int i = 3; err == KS_OK && v[0] == 0 && i < KS_PG_SUMMARY_NCOLS; i++)
        if (v[i] != 0)
            err = bad_cell(errbuf, errbuf_len, summary_col[i], "is not 0 without chunks");
    if (err != KS_OK)
        return err;
    out->chunks = (uint64_t)v[0];
    out->complete = (uint64_t)v[1];
    out->leased = (uint64_t)v[2];
    out->claimable = out->chunks - out->complete - out->leased;
    out->done = (uint64_t)v[3];
    out->skipped = (uint64_t)v[4];
    out->raced = (uint64_t)v[5];
    out->quarantined = (uint64_t)v[6];
    out->wrong_state = (uint64_t)v[7];
    out->max_pass = (uint32_t)v[8];
    return KS_OK;
}

/* Nonzero when the coordinator may run a writing statement of its own
 * transaction now (the store is writable and not inside a transaction). */
static int idle(const pg_chunks *c)
{
    return c != NULL && !c->parts.read_only && !ks_pg_store_in_txn(c->store);
}

/* A constant statement (BEGIN, COMMIT, ROLLBACK, a lock) on c's connection. */
static ks_err simple(pg_chunks *c, const char *sql)
{
    PGresult *res = PQexec(c->parts.conn, sql);
    ExecStatusType st = res != NULL ? PQresultStatus(res) : PGRES_FATAL_ERROR;
    ks_err err = st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK ? KS_OK
                                                                 : ks_pg_error_of(c->parts.conn, res);
    PQclear(res);
    return err;
}

/* Roll back the plan's own transaction after a failure. */
static void plan_abort(pg_chunks *c)
{
    if (PQtransactionStatus(c->parts.conn) != PQTRANS_IDLE &&
        PQstatus(c->parts.conn) == CONNECTION_OK)
        (void)simple(c, "ROLLBACK");
}

/* The ids per chunk for a range of `span` ids (max - min, 0..UINT64_MAX)
 * asked `want` wide, so that at most KS_CHUNKS_MAX chunks result; the
 * number of chunks in *n. */
static uint64_t chunk_width(uint64_t span, uint64_t want, uint64_t *n)
{
    uint64_t w = want != 0 ? want : KS_CHUNK_IDS_DEFAULT;
    uint64_t min_w = span / KS_CHUNKS_MAX + 1;
    if (w < min_w)
        w = min_w;
    if (w > (uint64_t)INT64_MAX)
        w = (uint64_t)INT64_MAX;
    *n = span / w + 1;
    return w;
}

/* The one cell of a count of chunks (SQL_PLANNED) into *n:
 * 0..KS_CHUNKS_MAX, the most a plan makes; else KS_ERR_STORE. */
static ks_err planned_count(pg_chunks *c, uint64_t *n)
{
    int64_t v = 0;
    ks_err err = PQntuples(c->res) == 1 && PQnfields(c->res) == 1
                     ? int_cell(c->res, 0, 0, "count", 0, (int64_t)KS_CHUNKS_MAX, 0, NULL, &v,
                                c->why, sizeof c->why)
                     : ks_errbuf_fail(c->why, sizeof c->why, KS_ERR_STORE, "keyshift_chunk: a count of "
                                                                "another shape");
    *n = (uint64_t)v;
    return err;
}

/* The target's smallest and largest ids into *lo and *hi (both 0 for an
 * empty table), as binary bigints checked like a chunk's cells. */
static ks_err id_range(pg_chunks *c, int64_t *lo, int64_t *hi)
{
    char sql[512];
    snprintf(sql, sizeof sql, "SELECT min(%s)::int8, max(%s)::int8 FROM %s", c->parts.qid,
             c->parts.qid, c->parts.qtable);
    PGresult *res = PQexecParams(c->parts.conn, sql, 0, NULL, NULL, NULL, NULL, 1);
    ks_err err = res != NULL && PQresultStatus(res) == PGRES_TUPLES_OK
                     ? KS_OK
                     : ks_pg_error_of(c->parts.conn, res);
    int lo_null = 0, hi_null = 0;
    if (err == KS_OK && (PQntuples(res) != 1 || PQnfields(res) != 2))
        err = ks_errbuf_fail(c->why, sizeof c->why, KS_ERR_STORE, "the target's id range: another shape");
    if (err == KS_OK)
        err = int_cell(res, 0, 0, "min", INT64_MIN, INT64_MAX, 1, &lo_null, lo, c->why,
                       sizeof c->why);
    if (err == KS_OK)
        err = int_cell(res, 0, 1, "max", *lo, INT64_MAX, 1, &hi_null, hi, c->why, sizeof c->why);
    if (err == KS_OK && lo_null != hi_null)
        err = ks_errbuf_fail(c->why, sizeof c->why, KS_ERR_STORE, "the target's id range: one end NULL");
    PQclear(res);
    return err;
}

/* ops.plan: see chunks.h.  Under an advisory lock of the transaction,
 * so concurrent planners wait for the first one and then find its
 * chunks. */
static ks_err op_plan(void *self, ks_bytes params, uint64_t chunk_ids, uint64_t *n)
{
    pg_chunks *c = self;
    if (!idle(c) || n == NULL)
        return KS_ERR_INVALID_ARGUMENT;
    tparams p;
    ks_err err = key_params(c, params, NULL, &p);
    if (err != KS_OK)
        return err;
    err = simple(c, "BEGIN ISOLATION LEVEL READ COMMITTED");
    if (err == KS_OK) /* "kcnk": one planner at a time */
        err = simple(c, "SELECT pg_catalog.pg_advisory_xact_lock(1801678443)");
    if (err == KS_OK)
        err = run(c, Q_PLANNED, &p, PGRES_TUPLES_OK);
    if (err == KS_OK)
        err = planned_count(c, n);
    if (err == KS_OK && *n == 0) {
        int64_t lo = 0, hi = 0;
        err = id_range(c, &lo, &hi);
        uint64_t count = 0;
        uint64_t w = chunk_width((uint64_t)hi - (uint64_t)lo, chunk_ids, &count);
        p_num(&p, lo);
        p_num(&p, (int64_t)w);
        p_num(&p, (int64_t)count);
        if (err == KS_OK)
            err = run(c, Q_PLAN, &p, PGRES_COMMAND_OK);
        p.n = 3;
        if (err == KS_OK)
            err = run(c, Q_PLANNED, &p, PGRES_TUPLES_OK);
        if (err == KS_OK)
            err = planned_count(c, n);
    }
    if (err == KS_OK)
        err = simple(c, "COMMIT");
    if (err != KS_OK)
        plan_abort(c);
    return err;
}

/* ops.claim: see chunks.h. */
static ks_err op_claim(void *self, ks_bytes params, ks_bytes owner, uint32_t lease_ms,
                       ks_chunk *out)
{
    pg_chunks *c = self;
    if (!idle(c) || out == NULL || lease_ms == 0)
        return KS_ERR_INVALID_ARGUMENT;
    tparams p;
    ks_err err = key_params(c, params, &owner, &p);
    if (err != KS_OK)
        return err;
    p_num(&p, lease_ms);
    err = run(c, Q_CLAIM, &p, PGRES_TUPLES_OK);
    if (err != KS_OK)
        return err;
    if (PQntuples(c->res) == 0)
        return KS_ERR_NOT_FOUND;
    if (PQntuples(c->res) != 1)
        return ks_errbuf_fail(c->why, sizeof c->why, KS_ERR_STORE, "keyshift_chunk: a claim of several rows");
    /* a malformed row stays claimed: its lease expires (nothing sound to release) */
    return ks_pg_read_chunk(c->res, 0, params, out, c->why, sizeof c->why);
}

/* Run one of the owner-checked updates (renew, save, release): KS_OK
 * when it changed the row, KS_ERR_STALE when the owner does not hold
 * it. */
static ks_err owned_update(pg_chunks *c, int q, const tparams *p)
{
    ks_err err = run(c, q, p, PGRES_TUPLES_OK);
    if (err != KS_OK)
        return err;
    return PQntuples(c->res) == 1 ? KS_OK : KS_ERR_STALE;
}

/* ops.renew: see chunks.h. */
static ks_err op_renew(void *self, ks_bytes params, int64_t chunk, ks_bytes owner,
                       uint32_t lease_ms)
{
    pg_chunks *c = self;
    if (!idle(c) || lease_ms == 0)
        return KS_ERR_INVALID_ARGUMENT;
    tparams p;
    ks_err err = key_params(c, params, &owner, &p);
    if (err != KS_OK)
        return err;
    p_num(&p, lease_ms);
    p_num(&p, chunk);
    return owned_update(c, Q_RENEW, &p);
}

/* ops.save: see chunks.h.  Inside the store's transaction: a failure or
 * a lost chunk rolls that transaction back. */
static ks_err op_save(void *self, ks_bytes params, int64_t chunk, ks_bytes owner,
                      uint32_t lease_ms, const ks_checkpoint *cp)
{
    pg_chunks *c = self;
    if (c == NULL || cp == NULL || !ks_pg_store_in_txn(c->store) || lease_ms == 0 ||
        (cp->cursor.type != KS_VALUE_NULL && cp->cursor.type != KS_VALUE_INTEGER) ||
        cp->done > INT64_MAX || cp->skipped > INT64_MAX || cp->raced > INT64_MAX ||
        cp->quarantined > INT64_MAX || cp->wrong_state > INT64_MAX)
        return KS_ERR_INVALID_ARGUMENT;
    char state[65];
    tparams p;
    ks_err err = KS_OK;
    if (cp->state.ptr == NULL || cp->state.len == 0 || cp->state.len >= sizeof state ||
        memchr(cp->state.ptr, 0, cp->state.len) != NULL) {
        err = KS_ERR_INVALID_ARGUMENT;
    } else {
        memcpy(state, cp->state.ptr, cp->state.len);
        state[cp->state.len] = '\0';
        err = key_params(c, params, &owner, &p);
    }
    if (err != KS_OK) {
        ks_pg_store_fail_txn(c->store);
        return err;
    }
    p_num(&p, lease_ms);
    p_num(&p, chunk);
    p.v[p.n++] = state;
    if (cp->cursor.type == KS_VALUE_NULL)
        p.v[p.n++] = NULL;
    else
        p_num(&p, cp->cursor.integer);
    p_num(&p, cp->pass);
    const uint64_t counts[] = {cp->done, cp->skipped, cp->raced, cp->quarantined,
                               cp->wrong_state};
    for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++)
        p_num(&p, (int64_t)counts[i]);
    err = owned_update(c, Q_SAVE, &p);
    if (err != KS_OK)
        ks_pg_store_fail_txn(c->store);
    return err;
}

/* ops.release: see chunks.h. */
static ks_err op_release(void *self, ks_bytes params, int64_t chunk, ks_bytes owner)
{
    pg_chunks *c = self;
    if (!idle(c))
        return KS_ERR_INVALID_ARGUMENT;
    tparams p;
    ks_err err = key_params(c, params, &owner, &p);
    if (err != KS_OK)
        return err;
    p_num(&p, chunk);
    return owned_update(c, Q_RELEASE, &p);
}

/* Run the read q over the chunks of params (bound by the key alone),
 * its rows kept. */
static ks_err select_key(pg_chunks *c, int q, ks_bytes params)
{
    tparams p;
    ks_err err = key_params(c, params, NULL, &p);
    return err == KS_OK ? run(c, q, &p, PGRES_TUPLES_OK) : err;
}

/* ops.summary: see chunks.h. */
static ks_err op_summary(void *self, ks_bytes params, ks_chunk_summary *out)
{
    pg_chunks *c = self;
    if (c == NULL || out == NULL)
        return KS_ERR_INVALID_ARGUMENT;
    memset(out, 0, sizeof *out);
    if (c->absent)
        return KS_OK;
    ks_err err = select_key(c, Q_SUMMARY, params);
    if (err != KS_OK)
        return err;
    return ks_pg_read_summary(c->res, out, c->why, sizeof c->why);
}

/* ops.list: see chunks.h. */
static ks_err op_list(void *self, ks_bytes params, ks_chunk_list_fn fn, void *arg)
{
    pg_chunks *c = self;
    if (c == NULL || fn == NULL)
        return KS_ERR_INVALID_ARGUMENT;
    if (c->absent)
        return KS_OK;
    ks_err err = select_key(c, Q_LIST, params);
    if (err != KS_OK)
        return err;
    for (int i = 0; i < PQntuples(c->res); i++) {
        ks_chunk k;
        err = ks_pg_read_chunk(c->res, i, params, &k, c->why, sizeof c->why);
        if (err != KS_OK)
            return err; /* the rows before it were listed: status prints nothing then */
        if (fn(arg, &k) != 0)
            break;
    }
    return KS_OK;
}

/* Free c (not its store). */
static void chunks_free(pg_chunks *c)
{
    if (c == NULL)
        return;
    if (c->res != NULL)
        PQclear(c->res);
    for (int q = 0; q < Q_N; q++)
        free(c->sql[q]);
    free(c->params);
    free(c->owner);
    free(c);
}

/* ops.close. */
static void op_close(void *self)
{
    chunks_free(self);
}

static const ks_chunks_ops pg_chunks_ops = {
    .plan = op_plan,
    .claim = op_claim,
    .renew = op_renew,
    .save = op_save,
    .release = op_release,
    .summary = op_summary,
    .list = op_list,
    .close = op_close,
};

/* Create keyshift_chunk if missing, one creator at a time. */
static ks_err ensure_table(pg_chunks *c)
{
    char *ddl = with_schema(DDL, c->parts.qschema);
    if (ddl == NULL)
        return KS_ERR_NO_MEMORY;
    ks_err err = simple(c, "BEGIN");
    if (err == KS_OK) /* the store's own creators' lock: "keys" */
        err = simple(c, "SELECT pg_catalog.pg_advisory_xact_lock(1801812339)");
    if (err == KS_OK) /* no NOTICE when the table exists */
        err = simple(c, "SET LOCAL client_min_messages = warning");
    if (err == KS_OK)
        err = simple(c, ddl);
    if (err == KS_OK)
        err = simple(c, "COMMIT");
    if (err != KS_OK)
        plan_abort(c);
    free(ddl);
    return err;
}

/* A read-only coordinator: whether keyshift_chunk exists beside the
 * target (c->absent when not), without creating it. */
static ks_err probe_table(pg_chunks *c)
{
    char *name = with_schema("@S.keyshift_chunk", c->parts.qschema);
    if (name == NULL)
        return KS_ERR_NO_MEMORY;
    const char *v[1] = {name};
    PGresult *res = PQexecParams(c->parts.conn, "SELECT pg_catalog.to_regclass($1::text) IS NULL",
                                 1, NULL, v, NULL, NULL, 1);
    free(name);
    ks_err err = KS_OK;
    if (res == NULL || PQresultStatus(res) != PGRES_TUPLES_OK)
        err = ks_pg_error_of(c->parts.conn, res);
    else if (PQntuples(res) != 1 || PQnfields(res) != 1 || ks_pg_bool(res, 0, 0, &c->absent) != KS_OK)
        err = KS_ERR_STORE;
    PQclear(res);
    return err;
}

/* See chunks_pg.h. */
ks_err ks_chunks_pg_open(const ks_rowstore *store, ks_chunks *out, char *errbuf, size_t errbuf_len)
{
    if (errbuf != NULL && errbuf_len > 0)
        errbuf[0] = '\0';
    if (out == NULL)
        return ks_errbuf_fail(errbuf, errbuf_len, KS_ERR_INVALID_ARGUMENT, "no coordinator to open");
    memset(out, 0, sizeof *out);
    pg_chunks *c = calloc(1, sizeof *c);
    if (c == NULL)
        return ks_errbuf_fail(errbuf, errbuf_len, KS_ERR_NO_MEMORY, "out of memory");
    c->store = store;
    ks_err err = ks_pg_store_parts_of(store, &c->parts);
    if (err != KS_OK || ks_pg_store_in_txn(store)) {
        chunks_free(c);
        return ks_errbuf_fail(errbuf, errbuf_len, KS_ERR_INVALID_ARGUMENT,
                   "chunks need a PostgreSQL store outside a transaction");
    }
    static const char *const tmpl[Q_N] = {SQL_PLANNED, SQL_PLAN,    SQL_CLAIM,   SQL_RENEW,
                                          SQL_SAVE,    SQL_RELEASE, SQL_SUMMARY, SQL_LIST};
    for (int q = 0; q < Q_N && err == KS_OK; q++) {
        c->sql[q] = with_schema(tmpl[q], c->parts.qschema);
        err = c->sql[q] != NULL ? KS_OK : KS_ERR_NO_MEMORY;
    }
    if (err == KS_OK && c->parts.read_only) {
        err = probe_table(c);
        if (err != KS_OK) {
            chunks_free(c);
            return ks_errbuf_fail(errbuf, errbuf_len, err, "cannot look up keyshift_chunk (%s)",
                       ks_err_name(err));
        }
    } else if (err == KS_OK) {
        err = ensure_table(c);
    }
    if (err != KS_OK) {
        chunks_free(c);
        return ks_errbuf_fail(errbuf, errbuf_len, err,
                   "cannot create keyshift_chunk beside the target (%s; CREATE privilege?)",
                   ks_err_name(err));
    }
    out->ops = &pg_chunks_ops;
    out->self = c;
    out->name = "pg";
    return KS_OK;
}

