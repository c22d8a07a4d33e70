/*
 * migrate/store/pg/rollout_pg_rows.c -- the rows of the PostgreSQL
 * rollout store (keyshift/rollout_store_pg.h): rollouts and their listed
 * columns, the log, the reader registry and health samples.  The tables
 * are described in rollout_pg.c.
 *
 * Every cell read back is decoded strictly (its type oid, its length,
 * its range, text without NUL bytes and within its length, histograms of
 * exactly their length, phase and canary names known): anything else is
 * KS_ERR_STORE.  What the values mean together is checked by the rollout
 * layer, the same for every store.  Names are only ever bound, and
 * compared folded (KS_RPG_FOLD) as ks_rollout_name_cmp compares them.
 */
#define _POSIX_C_SOURCE 200809L

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include <keyshift/rollout_store.h>

#include "pg_util.h"
#include "rollout_pg.h"
#include "../rollout_codec.h"

/* A query of KS_RPG_ROLLOUT_COLS and the encoding (column 30) followed
 * by tail, in two spellings indexed by the store's v2: a version 1
 * database (read-only) has no encoding, and every rollout in it is of
 * binary encoding. */
#define SELECT_ROLLOUT(tail)                                                                      \
    (db->v2 ? "SELECT " KS_RPG_ROLLOUT_COLS ", encoding FROM keyshift_rollout " tail               \
            : "SELECT " KS_RPG_ROLLOUT_COLS ", 'binary'::text FROM keyshift_rollout " tail)

/* Folded comparisons of a name column with a parameter. */
#define EQ(colname, param) KS_RPG_FOLD(colname) " = " KS_RPG_FOLD(param)

/* max as an SQL LIMIT. */
static int64_t limit_of(size_t max)
{
    return max > (size_t)INT64_MAX ? INT64_MAX : (int64_t)max;
}

/* ---- canary ------------------------------------------------------------------- */

/* Parse the canary cells (kind at column i, percent i + 1, tenants
 * i + 2) of row strictly into *c: 0 for anything malformed. */
static int read_canary(const PGresult *res, int row, int i, ks_rollout_canary *c)
{
    char kind[16];
    char tenants[KS_RCODEC_TENANTS_MAX + 1];
    int64_t pct;
    memset(c, 0, sizeof *c);
    return ks_rpg_col_text(res, row, i, kind, sizeof kind - 1) &&
           ks_rpg_col_int(res, row, i + 1, 0, 100, &pct) &&
           ks_rpg_col_text(res, row, i + 2, tenants, KS_RCODEC_TENANTS_MAX) &&
           ks_rcodec_canary_parse(kind, pct, tenants, c);
}

/* ---- rollout rows ------------------------------------------------------------- */

/* Read the class at columns i.. of row (plaintext flag first when
 * with_flag; then format, algorithm, key_id, key_version) into *c. */
static int read_class(const PGresult *res, int row, int i, int with_flag, ks_rollout_class *c)
{
    int64_t plain = 0, fmt, alg, kv;
    memset(c, 0, sizeof *c);
    if (with_flag && !ks_rpg_col_int(res, row, i++, 0, 1, &plain))
        return 0;
    if (!ks_rpg_col_int(res, row, i, 0, 255, &fmt) ||
        !ks_rpg_col_int(res, row, i + 1, 0, UINT32_MAX, &alg) ||
        !ks_rpg_col_text(res, row, i + 2, c->key_id, KS_KEY_ID_MAX) ||
        !ks_rpg_col_int(res, row, i + 3, 0, UINT32_MAX, &kv))
        return 0;
    c->is_plaintext = (int)plain;
    c->version = (uint8_t)fmt;
    c->algorithm = (uint32_t)alg;
    c->key_version = (uint32_t)kv;
    return 1;
}

/* See rollout_pg.h (ks_rpg_read_rollout). */
ks_err ks_rpg_read_rollout(const PGresult *res, int row, ks_rollout *r)
{
    char phase[32], key[KS_KEY_ID_MAX + 1], enc[8];
    int64_t v[6];
    memset(r, 0, sizeof *r);
    int ok = ks_rpg_col_int(res, row, 0, 1, INT64_MAX, &r->id) &&
             ks_rpg_col_text(res, row, 30, enc, sizeof enc - 1) &&
             ks_rcodec_encoding_parse(enc, r) &&
             ks_rpg_col_text(res, row, 1, r->table, KS_ROLLOUT_IDENT_MAX) &&
             ks_rpg_col_text(res, row, 2, r->column, KS_ROLLOUT_IDENT_MAX) &&
             read_class(res, row, 3, 1, &r->source) && read_class(res, row, 8, 0, &r->target) &&
             ks_rpg_col_text(res, row, 29, key, KS_KEY_ID_MAX) && ks_rcodec_scope_ok(r, key) &&
             ks_rpg_col_text(res, row, 12, phase, sizeof phase - 1) &&
             ks_rpg_col_int(res, row, 13, INT64_MIN, INT64_MAX, &r->phase_since) &&
             read_canary(res, row, 14, &r->canary) &&
             ks_rpg_col_double(res, row, 17, &r->thresholds.max_auth_failure_rate) &&
             ks_rpg_col_double(res, row, 18, &r->thresholds.max_parse_error_rate) &&
             ks_rpg_col_double(res, row, 19, &r->thresholds.max_provider_error_rate) &&
             ks_rpg_col_int(res, row, 20, 0, INT64_MAX, &v[0]) &&
             ks_rpg_col_int(res, row, 21, 0, INT64_MAX, &v[1]) &&
             ks_rpg_col_int(res, row, 22, 0, INT64_MAX, &v[2]) &&
             ks_rpg_col_int(res, row, 23, 1, UINT32_MAX, &v[3]) &&
             ks_rpg_col_int(res, row, 24, 0, UINT32_MAX, &v[4]) &&
             ks_rpg_col_int(res, row, 25, 1, UINT32_MAX, &v[5]) &&
             ks_rpg_col_int(res, row, 26, INT64_MIN, INT64_MAX, &r->created) &&
             ks_rpg_col_int(res, row, 27, INT64_MIN, INT64_MAX, &r->updated) &&
             ks_rpg_col_int(res, row, 28, 0, INT64_MAX, &r->verified_at);
    return ok && ks_rcodec_rollout_finish(r, phase, v) ? KS_OK : KS_ERR_STORE;
}

/* Reads row `row` of a result into *out. */
typedef ks_err (*row_reader)(const PGresult *res, int row, void *out);

/* ks_rpg_read_rollout as a row_reader (read_rows' element type). */
static ks_err read_rollout(const PGresult *res, int row, void *out)
{
    return ks_rpg_read_rollout(res, row, out);
}

/* Read up to max rows of res (from a call that returned err) with read
 * into out[0, *n) (elements of elem bytes), then clear res.  On failure
 * *n is 0. */
static ks_err read_rows(PGresult *res, ks_err err, row_reader read, void *out, size_t elem,
                        size_t max, size_t *n)
{
    *n = 0;
    int rows = err == KS_OK ? PQntuples(res) : 0;
    for (int i = 0; err == KS_OK && i < rows && *n < max; i++) {
        err = read(res, i, (uint8_t *)out + *n * elem);
        if (err == KS_OK)
            (*n)++;
    }
    PQclear(res);
    if (err != KS_OK)
        *n = 0;
    return err;
}

/* See rollout_pg.h (ks_rpg_read_column). */
ks_err ks_rpg_read_column(const PGresult *res, int row, ks_rollout_column *c)
{
    return ks_rpg_col_text(res, row, 0, c->table, KS_ROLLOUT_IDENT_MAX) &&
                   ks_rpg_col_text(res, row, 1, c->column, KS_ROLLOUT_IDENT_MAX) &&
                   ks_rpg_col_int(res, row, 2, 0, INT64_MAX, &c->verified_at)
               ? KS_OK
               : KS_ERR_STORE;
}

/* Read the listed columns of each key-scoped rollout of rs[0, n), in the
 * order they were given (at most KS_ROLLOUT_COLUMNS_MAX, names within
 * their length, verify times >= 0): KS_ERR_STORE for anything else. */
static ks_err load_columns(ks_rpg *db, ks_rollout *rs, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        ks_rollout *r = &rs[i];
        if (r->scope != KS_SCOPE_KEY)
            continue;
        PGresult *res;
        ks_err err = ks_rpg_exec(db, &res,
                                 "SELECT " KS_RPG_COLUMN_COLS " FROM keyshift_rollout_column "
                                 "WHERE rollout_id = $1 ORDER BY seq LIMIT $2",
                                 "ii", r->id, (int64_t)KS_ROLLOUT_COLUMNS_MAX + 1);
        r->n_columns = 0;
        int rows = err == KS_OK ? PQntuples(res) : 0;
        for (int j = 0; err == KS_OK && j < rows; j++) {
            if (r->n_columns == KS_ROLLOUT_COLUMNS_MAX)
                err = KS_ERR_STORE;
            else if ((err = ks_rpg_read_column(res, j, &r->columns[r->n_columns])) == KS_OK)
                r->n_columns++;
        }
        PQclear(res);
        if (err != KS_OK)
            return err;
    }
    return KS_OK;
}

/* The first rollout row of res (from a call that returned err) into
 * *out, with its listed columns: KS_ERR_NO_ROLLOUT if none. */
static ks_err read_one(ks_rpg *db, PGresult *res, ks_err err, ks_rollout *out)
{
    size_t n = 0;
    err = read_rows(res, err, read_rollout, out, sizeof *out, 1, &n);
    if (err == KS_OK && n == 0)
        err = KS_ERR_NO_ROLLOUT;
    if (err == KS_OK)
        err = load_columns(db, out, 1);
    return err;
}

/* See rollout_store.h (get). */
ks_err ks_rpg_get(ks_rollout_store *s, int64_t id, ks_rollout *out)
{
    ks_rpg *db = ks_rpg_of(s);
    if (!db->have_tables)
        return KS_ERR_NO_ROLLOUT;
    PGresult *res;
    ks_err err = ks_rpg_exec(db, &res, SELECT_ROLLOUT("WHERE id = $1"), "i", id);
    return read_one(db, res, err, out);
}

/* See rollout_store.h (latest). */
ks_err ks_rpg_latest(ks_rollout_store *s, const char *table, const char *column, ks_rollout *out)
{
    ks_rpg *db = ks_rpg_of(s);
    if (!db->have_tables)
        return KS_ERR_NO_ROLLOUT;
    PGresult *res;
    ks_err err = ks_rpg_exec(db, &res,
                             SELECT_ROLLOUT("WHERE " EQ("tbl", "$1") " AND " EQ("col", "$2")
                                            " ORDER BY id DESC LIMIT 1"),
                             "tt", table, column);
    return read_one(db, res, err, out);
}

/* See rollout_store.h (latest_key). */
ks_err ks_rpg_latest_key(ks_rollout_store *s, const char *key_id, ks_rollout *out)
{
    ks_rpg *db = ks_rpg_of(s);
    if (!db->have_tables)
        return KS_ERR_NO_ROLLOUT;
    PGresult *res;
    ks_err err = ks_rpg_exec(db, &res,
                             SELECT_ROLLOUT("WHERE scope_key_id = $1 ORDER BY id DESC LIMIT 1"),
                             "t", key_id);
    return read_one(db, res, err, out);
}

/* See rollout_store.h (list). */
ks_err ks_rpg_list(ks_rollout_store *s, int64_t after_id, ks_rollout *out, size_t max, size_t *n)
{
    ks_rpg *db = ks_rpg_of(s);
    *n = 0;
    if (!db->have_tables || max == 0)
        return KS_OK;
    PGresult *res;
    ks_err err = ks_rpg_exec(db, &res, SELECT_ROLLOUT("WHERE id > $1 ORDER BY id LIMIT $2"), "ii",
                             after_id, limit_of(max));
    err = read_rows(res, err, read_rollout, out, sizeof *out, max, n);
    if (err == KS_OK)
        err = load_columns(db, out, *n);
    if (err != KS_OK)
        *n = 0;
    return err;
}

/* ---- scopes and changes of rollouts -------------------------------------------- */

/* Nonzero when name starts with prefix, ASCII letters folded. */
static int has_prefix_nocase(const char *name, const char *prefix)
{
    for (; *prefix != '\0'; name++, prefix++) {
        unsigned char a = (unsigned char)*name, b = (unsigned char)*prefix;
        if (a >= 'A' && a <= 'Z')
            a = (unsigned char)(a + 32);
        if (a != b)
            return 0;
    }
    return 1;
}

/* See rollout_store.h (find_column).  The table among those the
 * search_path makes visible, the column among its live ones, both
 * compared folded with an exact spelling preferred (two spellings that
 * fold alike and neither exact: refused as ambiguous); not a keyshift_*
 * or pg_* table, a real (or partitioned) table, and not a generated or
 * primary-key column. */
ks_err ks_rpg_find_column(ks_rollout_store *s, const char *table, const char *column,
                          char tbl[KS_ROLLOUT_IDENT_MAX + 1], char col[KS_ROLLOUT_IDENT_MAX + 1],
                          char *errbuf, size_t errbuf_len)
{
    ks_rpg *db = ks_rpg_of(s);
    char pt[96], pc[96];
    ks_pg_printable(table, pt, sizeof pt);
    ks_pg_printable(column, pc, sizeof pc);
    if (has_prefix_nocase(table, "pg_") || has_prefix_nocase(table, "keyshift_"))
        return ks_rpg_fail(errbuf, errbuf_len, KS_ERR_INVALID_ARGUMENT,
                    "table \"%s\" is reserved (pg_*, keyshift_*)", pt);
    PGresult *res;
    ks_err err = ks_rpg_exec(
        db, &res,
        "SELECT c.relname::text, a.attname::text, "
        "(a.attgenerated <> '' OR EXISTS (SELECT 1 FROM pg_catalog.pg_index i WHERE "
        "i.indrelid = c.oid AND i.indisprimary AND a.attnum = ANY (i.indkey)))::int::int8, "
        "coalesce(c.relname = $1, false)::int::int8, coalesce(a.attname = $2, false)::int::int8 "
        "FROM pg_catalog.pg_class c LEFT JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid "
        "AND a.attnum > 0 AND NOT a.attisdropped AND " EQ("a.attname::text", "$2") " "
        "WHERE c.relkind IN ('r', 'p') AND pg_catalog.pg_table_is_visible(c.oid) AND "
        EQ("c.relname::text", "$1") " ORDER BY 4 DESC, 5 DESC, 1, 2",
        "tt", table, column);
    if (err != KS_OK)
        return ks_rpg_fail(errbuf, errbuf_len, err, "reading the catalog: %s", ks_err_name(err));
    int rows = PQntuples(res);
    int64_t flag = 0, exact_t = 0, exact_c = 0, exact_t2 = 0, exact_c2 = 0;
    int ambiguous = 0;
    if (rows > 1) {
        /* the first row wins only when it is exact where the second is not */
        (void)ks_rpg_col_int(res, 0, 3, 0, 1, &exact_t);
        (void)ks_rpg_col_int(res, 0, 4, 0, 1, &exact_c);
        (void)ks_rpg_col_int(res, 1, 3, 0, 1, &exact_t2);
        (void)ks_rpg_col_int(res, 1, 4, 0, 1, &exact_c2);
        ambiguous = !(exact_t > exact_t2 || (exact_t == exact_t2 && exact_c > exact_c2));
    }
    if (rows == 0)
        err = ks_rpg_fail(errbuf, errbuf_len, KS_ERR_NO_TARGET,
                          "no table \"%s\" in the database", pt);
    else if (ambiguous)
        err = ks_rpg_fail(errbuf, errbuf_len, KS_ERR_INVALID_ARGUMENT,
                   "\"%s\".\"%s\" matches more than one table or column that differ only in case",
                   pt, pc);
    else if (ks_rpg_col_null(res, 0, 1))
        err = ks_rpg_fail(errbuf, errbuf_len, KS_ERR_NO_TARGET,
                          "no column \"%s\" in table \"%s\"", pc,
                   pt);
    else if (!ks_rpg_col_int(res, 0, 2, 0, 1, &flag) || flag != 0)
        err = ks_rpg_fail(errbuf, errbuf_len, KS_ERR_INVALID_ARGUMENT,
                   "column \"%s\" is generated or part of the primary key", pc);
    else if (!ks_rpg_col_text(res, 0, 0, tbl, KS_ROLLOUT_IDENT_MAX) ||
             !ks_rpg_col_text(res, 0, 1, col, KS_ROLLOUT_IDENT_MAX))
        err = ks_rpg_fail(errbuf, errbuf_len, KS_ERR_INVALID_ARGUMENT,
                   "table or column name of \"%s\".\"%s\" is too long", pt, pc);
    PQclear(res);
    return err;
}

/* See rollout_store.h (find_open). */
ks_err ks_rpg_find_open(ks_rollout_store *s, const char *tbl, const char *col, const char *key_id,
                        int key_scopes, int64_t *id)
{
    ks_rpg *db = ks_rpg_of(s);
    *id = 0;
    if (!db->have_tables)
        return KS_OK;
    PGresult *res;
    ks_err err;
    if (key_id != NULL)
        err = ks_rpg_exec(db, &res,
                          "SELECT id FROM keyshift_rollout WHERE scope_key_id = $1 "
                          "AND phase <> 'finalized' ORDER BY id LIMIT 1",
                          "t", key_id);
    else
        err = ks_rpg_exec(db, &res,
                          "SELECT id FROM keyshift_rollout AS r WHERE phase <> 'finalized' AND "
                          "((scope_key_id = '' AND " EQ("tbl", "$1") " AND " EQ("col", "$2")
                          ") OR ($3 <> 0 AND EXISTS (SELECT 1 FROM keyshift_rollout_column AS c "
                          "WHERE c.rollout_id = r.id AND " EQ("c.tbl", "$1") " AND "
                          EQ("c.col", "$2") "))) ORDER BY id LIMIT 1",
                          "tti", tbl, col, (int64_t)(key_scopes != 0));
    if (err == KS_OK && PQntuples(res) > 0 && !ks_rpg_col_int(res, 0, 0, 1, INT64_MAX, id))
        err = KS_ERR_STORE;
    PQclear(res);
    return err;
}

/* See rollout_store.h (insert): r's phase, times, canary and thresholds
 * as given, its verify time 0, then the listed columns of a key scope;
 * a unique violation (another open rollout of the scope) is
 * KS_ERR_ROLLOUT_EXISTS. */
ks_err ks_rpg_insert(ks_rollout_store *s, const ks_rollout *r, int64_t *id)
{
    ks_rpg *db = ks_rpg_of(s);
    if (!ks_rpg_writable(db))
        return KS_ERR_INVALID_ARGUMENT;
    char tenants[KS_RCODEC_TENANTS_MAX + 1];
    ks_rcodec_canary_join(&r->canary, tenants);
    const ks_thresholds *t = &r->thresholds;
    const ks_rollout_class *a = &r->source, *b = &r->target;
    PGresult *res;
    ks_err err = ks_rpg_exec(
        db, &res,
        "INSERT INTO keyshift_rollout(tbl, col, src_plaintext, src_format, "
        "src_algorithm, src_key_id, src_key_version, dst_format, dst_algorithm, "
        "dst_key_id, dst_key_version, phase, phase_since, canary_kind, canary_percent, "
        "canary_tenants, max_auth_failure_rate, max_parse_error_rate, "
        "max_provider_error_rate, max_seal_p99_us, max_open_p99_us, min_samples, "
        "window_s, min_soak_s, reader_ttl_s, created, updated, verified_at, scope_key_id, "
        "encoding) "
        "VALUES($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, "
        "$16, $17, $18, $19, $20, $21, $22, $23, $24, $25, $26, $27, 0, $28, $29) RETURNING id",
        "ttiiitiiiti" "titit" "ddd" "iiiiii" "ii" "tt", r->table, r->column,
        (int64_t)(a->is_plaintext != 0), (int64_t)a->version, (int64_t)a->algorithm, a->key_id,
        (int64_t)a->key_version, (int64_t)b->version, (int64_t)b->algorithm, b->key_id,
        (int64_t)b->key_version, ks_rollout_phase_name((int)r->phase), r->phase_since,
        ks_rcodec_canary_name(r->canary.kind), (int64_t)r->canary.percent, tenants,
        t->max_auth_failure_rate, t->max_parse_error_rate, t->max_provider_error_rate,
        (int64_t)t->max_seal_p99_us, (int64_t)t->max_open_p99_us, (int64_t)t->min_samples,
        (int64_t)t->window_s, (int64_t)r->min_soak_s, (int64_t)r->reader_ttl_s, r->created,
        r->updated, r->scope == KS_SCOPE_KEY ? a->key_id : "",
        ks_value_encoding_name((int)r->encoding));
    if (err == KS_OK && (PQntuples(res) != 1 || !ks_rpg_col_int(res, 0, 0, 1, INT64_MAX, id)))
        err = KS_ERR_STORE;
    PQclear(res);
    for (size_t i = 0; err == KS_OK && i < r->n_columns; i++)
        err = ks_rpg_run(db, NULL,
                         "INSERT INTO keyshift_rollout_column(rollout_id, tbl, col) "
                         "VALUES($1, $2, $3)",
                         "itt", *id, r->columns[i].table, r->columns[i].column);
    return err;
}

/* One count(*) of a query's first cell into *n. */
static ks_err count_of(PGresult *res, ks_err err, int64_t *n)
{
    *n = 0;
    if (err == KS_OK && (PQntuples(res) != 1 || !ks_rpg_col_int(res, 0, 0, 0, INT64_MAX, n)))
        err = KS_ERR_STORE;
    PQclear(res);
    return err;
}

/* See rollout_store.h (later_count). */
ks_err ks_rpg_later_count(ks_rollout_store *s, const ks_rollout *r, int64_t *n)
{
    ks_rpg *db = ks_rpg_of(s);
    PGresult *res;
    ks_err err;
    if (r->scope == KS_SCOPE_KEY)
        err = ks_rpg_exec(db, &res,
                          "SELECT count(*) FROM keyshift_rollout AS o WHERE o.id > $1 AND "
                          "(o.scope_key_id = $2 OR (o.scope_key_id = '' AND EXISTS (SELECT 1 "
                          "FROM keyshift_rollout_column AS c WHERE c.rollout_id = $1 AND "
                          EQ("c.tbl", "o.tbl") " AND " EQ("c.col", "o.col") ")))",
                          "it", r->id, r->source.key_id);
    else
        err = ks_rpg_exec(db, &res,
                          "SELECT (SELECT count(*) FROM keyshift_rollout WHERE id > $1 AND "
                          "scope_key_id = '' AND " EQ("tbl", "$2") " AND " EQ("col", "$3")
                          ") + (SELECT count(*) FROM keyshift_rollout_column WHERE "
                          "rollout_id > $1 AND " EQ("tbl", "$2") " AND " EQ("col", "$3") ")",
                          "itt", r->id, r->table, r->column);
    return count_of(res, err, n);
}

/* See rollout_store.h (set_phase): the UPDATE compares the phase, so a
 * rollout moved meanwhile changes no row (KS_ERR_STORE). */
ks_err ks_rpg_set_phase(ks_rollout_store *s, int64_t id, ks_rollout_phase from,
                        ks_rollout_phase to, int64_t now)
{
    ks_rpg *db = ks_rpg_of(s);
    int64_t changed = 0;
    ks_err err = ks_rpg_run(db, &changed,
                            "UPDATE keyshift_rollout SET phase = $1, phase_since = $2, "
                            "updated = $2, verified_at = CASE WHEN $1 = 'backfill' THEN 0 "
                            "ELSE verified_at END WHERE id = $3 AND phase = $4",
                            "tiit", ks_rollout_phase_name((int)to), now, id,
                            ks_rollout_phase_name((int)from));
    if (err == KS_OK && changed != 1)
        err = KS_ERR_STORE;
    if (err == KS_OK && to == KS_PHASE_BACKFILL)
        err = ks_rpg_run(db, NULL,
                         "UPDATE keyshift_rollout_column SET verified_at = 0 WHERE rollout_id = $1",
                         "i", id);
    return err;
}

/* See rollout_store.h (set_canary). */
ks_err ks_rpg_set_canary(ks_rollout_store *s, int64_t id, const ks_rollout_canary *canary,
                         int64_t now)
{
    char tenants[KS_RCODEC_TENANTS_MAX + 1];
    ks_rcodec_canary_join(canary, tenants);
    return ks_rpg_run(ks_rpg_of(s), NULL,
                      "UPDATE keyshift_rollout SET canary_kind = $1, canary_percent = $2, "
                      "canary_tenants = $3, updated = $4 WHERE id = $5",
                      "titii", ks_rcodec_canary_name(canary->kind), (int64_t)canary->percent,
                      tenants, now,
                      id);
}

/* See rollout_store.h (set_settings). */
ks_err ks_rpg_set_settings(ks_rollout_store *s, int64_t id, const ks_thresholds *t,
                           uint32_t min_soak_s, uint32_t reader_ttl_s, int64_t now)
{
    int64_t changed = 0;
    ks_err err = ks_rpg_run(ks_rpg_of(s), &changed,
                            "UPDATE keyshift_rollout SET max_auth_failure_rate = $1, "
                            "max_parse_error_rate = $2, max_provider_error_rate = $3, "
                            "max_seal_p99_us = $4, max_open_p99_us = $5, min_samples = $6, "
                            "window_s = $7, min_soak_s = $8, reader_ttl_s = $9, updated = $10 "
                            "WHERE id = $11",
                            "ddd" "iiiiii" "ii", t->max_auth_failure_rate,
                            t->max_parse_error_rate, t->max_provider_error_rate,
                            (int64_t)t->max_seal_p99_us, (int64_t)t->max_open_p99_us,
                            (int64_t)t->min_samples, (int64_t)t->window_s, (int64_t)min_soak_s,
                            (int64_t)reader_ttl_s, now, id);
    return err == KS_OK && changed != 1 ? KS_ERR_STORE : err;
}

/* See rollout_store.h (remove): the listed columns first (they reference
 * the rollout), then the rollout. */
ks_err ks_rpg_remove(ks_rollout_store *s, int64_t id)
{
    ks_rpg *db = ks_rpg_of(s);
    int64_t changed = 0;
    ks_err err = ks_rpg_run(db, NULL, "DELETE FROM keyshift_rollout_column WHERE rollout_id = $1",
                            "i", id);
    if (err == KS_OK)
        err = ks_rpg_run(db, &changed, "DELETE FROM keyshift_rollout WHERE id = $1", "i", id);
    return err == KS_OK && changed != 1 ? KS_ERR_STORE : err;
}

/* See rollout_store.h (set_verified). */
ks_err ks_rpg_set_verified(ks_rollout_store *s, int64_t id, const char *table, const char *column,
                           int64_t now)
{
    ks_rpg *db = ks_rpg_of(s);
    int64_t changed = 0;
    ks_err err;
    if (table != NULL)
        err = ks_rpg_run(db, &changed,
                         "UPDATE keyshift_rollout_column SET verified_at = $1 "
                         "WHERE rollout_id = $2 AND " EQ("tbl", "$3") " AND " EQ("col", "$4"),
                         "iitt", now, id, table, column);
    else
        err = ks_rpg_run(db, &changed,
                         "UPDATE keyshift_rollout SET verified_at = $1, updated = $1 WHERE id = $2",
                         "ii", now, id);
    return err == KS_OK && changed != 1 ? KS_ERR_STORE : err;
}

/* ---- the log ------------------------------------------------------------------ */

/* See rollout_store.h (log_append); from 0 is stored as NULL. */
ks_err ks_rpg_log_append(ks_rollout_store *s, int64_t rollout_id, int64_t time, const char *actor,
                         int from, int to, const char *reason, int automatic)
{
    return ks_rpg_run(ks_rpg_of(s), NULL,
                      "INSERT INTO keyshift_rollout_log(rollout_id, time, actor, from_phase, "
                      "to_phase, reason, automatic) VALUES($1, $2, $3, $4, $5, $6, $7)",
                      "iitttti", rollout_id, time, actor,
                      from == 0 ? NULL : ks_rollout_phase_name(from), ks_rollout_phase_name(to),
                      reason != NULL ? reason : "", (int64_t)(automatic != 0));
}

/* See rollout_pg.h (ks_rpg_read_log). */
ks_err ks_rpg_read_log(const PGresult *res, int row, ks_rollout_log_entry *e)
{
    char from[32] = "", to[32];
    int64_t automatic;
    memset(e, 0, sizeof *e);
    int ok = ks_rpg_col_int(res, row, 0, 1, INT64_MAX, &e->id) &&
             ks_rpg_col_int(res, row, 1, 1, INT64_MAX, &e->rollout_id) &&
             ks_rpg_col_int(res, row, 2, INT64_MIN, INT64_MAX, &e->time) &&
             ks_rpg_col_text(res, row, 3, e->actor, KS_ROLLOUT_ACTOR_MAX) &&
             (ks_rpg_col_null(res, row, 4) ||
              ks_rpg_col_text(res, row, 4, from, sizeof from - 1)) &&
             ks_rpg_col_text(res, row, 5, to, sizeof to - 1) &&
             ks_rpg_col_text(res, row, 6, e->reason, KS_ROLLOUT_REASON_MAX) &&
             ks_rpg_col_int(res, row, 7, 0, 1, &automatic);
    return ok && ks_rcodec_log_finish(e, from, to, automatic) ? KS_OK : KS_ERR_STORE;
}

/* ks_rpg_read_log as a row_reader (read_rows' element type). */
static ks_err read_log(const PGresult *res, int row, void *out)
{
    return ks_rpg_read_log(res, row, out);
}

/* See rollout_store.h (log_list). */
ks_err ks_rpg_log_list(ks_rollout_store *s, int64_t rollout_id, int64_t after_id,
                       ks_rollout_log_entry *out, size_t max, size_t *n)
{
    ks_rpg *db = ks_rpg_of(s);
    *n = 0;
    if (!db->have_tables || max == 0)
        return KS_OK;
    PGresult *res;
    ks_err err = ks_rpg_exec(db, &res,
                             "SELECT " KS_RPG_LOG_COLS " FROM keyshift_rollout_log "
                             "WHERE ($1 = 0 OR rollout_id = $1) AND id > $2 ORDER BY id LIMIT $3",
                             "iii", rollout_id, after_id, limit_of(max));
    return read_rows(res, err, read_log, out, sizeof *out, max, n);
}

/* ---- readers ------------------------------------------------------------------- */

/* See rollout_pg.h (ks_rpg_read_reader). */
ks_err ks_rpg_read_reader(const PGresult *res, int row, ks_rollout_reader *r)
{
    int64_t fmt, algs;
    memset(r, 0, sizeof *r);
    int ok = ks_rpg_col_text(res, row, 0, r->instance_id, KS_INSTANCE_ID_MAX) &&
             ks_rpg_col_text(res, row, 1, r->library_version, KS_LIBRARY_VERSION_MAX) &&
             ks_rpg_col_int(res, row, 2, 1, 255, &fmt) &&
             ks_rpg_col_int(res, row, 3, 0, UINT32_MAX, &algs) &&
             ks_rpg_col_text(res, row, 4, r->keys, KS_READER_KEYS_MAX) &&
             ks_rpg_col_int(res, row, 5, INT64_MIN, INT64_MAX, &r->started) &&
             ks_rpg_col_int(res, row, 6, INT64_MIN, INT64_MAX, &r->heartbeat);
    if (!ok)
        return KS_ERR_STORE;
    r->max_format = (uint8_t)fmt;
    r->algorithms = (uint32_t)algs;
    return KS_OK;
}

/* See rollout_store.h (readers_live). */
ks_err ks_rpg_readers_live(ks_rollout_store *s, int64_t since, ks_rollout_reader *out, size_t max,
                           size_t *n, size_t *total)
{
    ks_rpg *db = ks_rpg_of(s);
    *n = 0;
    *total = 0;
    if (!db->have_tables)
        return KS_OK;
    PGresult *res;
    ks_err err = ks_rpg_exec(db, &res,
                             "SELECT " KS_RPG_READER_COLS " FROM keyshift_readers "
                             "WHERE heartbeat >= $1 ORDER BY instance_id COLLATE \"C\"",
                             "i", since);
    int rows = err == KS_OK ? PQntuples(res) : 0;
    for (int i = 0; err == KS_OK && i < rows; i++) {
        ks_rollout_reader tmp, *r = *n < max ? &out[*n] : &tmp;
        err = ks_rpg_read_reader(res, i, r);
        if (err != KS_OK)
            break;
        (*total)++;
        if (*n < max)
            (*n)++;
    }
    PQclear(res);
    if (err != KS_OK)
        *n = *total = 0;
    return err;
}

/* See rollout_store.h (reader_put): insert or replace. */
ks_err ks_rpg_reader_put(ks_rollout_store *s, const ks_rollout_reader *r, int64_t now)
{
    ks_rpg *db = ks_rpg_of(s);
    if (!ks_rpg_writable(db))
        return KS_ERR_INVALID_ARGUMENT;
    return ks_rpg_run(db, NULL,
                      "INSERT INTO keyshift_readers(" KS_RPG_READER_COLS ") "
                      "VALUES($1, $2, $3, $4, $5, $6, $6) ON CONFLICT (instance_id) DO UPDATE SET "
                      "library_version = EXCLUDED.library_version, "
                      "max_format = EXCLUDED.max_format, algorithms = EXCLUDED.algorithms, "
                      "key_versions = EXCLUDED.key_versions, started = EXCLUDED.started, "
                      "heartbeat = EXCLUDED.heartbeat",
                      "ttiiti", r->instance_id, r->library_version, (int64_t)r->max_format,
                      (int64_t)r->algorithms, r->keys, now);
}

/* See rollout_store.h (reader_heartbeat). */
ks_err ks_rpg_reader_heartbeat(ks_rollout_store *s, const char *instance_id, int64_t now)
{
    ks_rpg *db = ks_rpg_of(s);
    if (!ks_rpg_writable(db))
        return KS_ERR_INVALID_ARGUMENT;
    int64_t changed = 0;
    ks_err err = ks_rpg_run(db, &changed,
                            "UPDATE keyshift_readers SET heartbeat = $2 WHERE instance_id = $1",
                            "ti", instance_id, now);
    return err == KS_OK && changed == 0 ? KS_ERR_NOT_FOUND : err;
}

/* See rollout_store.h (reader_delete). */
ks_err ks_rpg_reader_delete(ks_rollout_store *s, const char *instance_id)
{
    ks_rpg *db = ks_rpg_of(s);
    if (!ks_rpg_writable(db))
        return KS_ERR_INVALID_ARGUMENT;
    return ks_rpg_run(db, NULL, "DELETE FROM keyshift_readers WHERE instance_id = $1", "t",
                      instance_id);
}

/* ---- metrics --------------------------------------------------------------------- */

/* Decode the histogram cell i of row into h: 0 unless it is a bytea of
 * exactly KS_RCODEC_HIST_LEN bytes. */
static int hist_decode(const PGresult *res, int row, int i, ks_histogram *h)
{
    const uint8_t *p;
    if (!ks_rpg_col_bytes(res, row, i, KS_RCODEC_HIST_LEN, &p))
        return 0;
    ks_rcodec_hist_decode(p, h);
    return 1;
}

/* See rollout_store.h (metrics_insert). */
ks_err ks_rpg_metrics_insert(ks_rollout_store *s, int64_t rollout_id, const char *instance_id,
                             const char *source, const ks_health_sample *sample)
{
    ks_rpg *db = ks_rpg_of(s);
    if (!ks_rpg_writable(db))
        return KS_ERR_INVALID_ARGUMENT;
    uint8_t seal[KS_RCODEC_HIST_LEN], open[KS_RCODEC_HIST_LEN];
    ks_rcodec_hist_encode(&sample->seal_ns, seal);
    ks_rcodec_hist_encode(&sample->open_ns, open);
    return ks_rpg_run(db, NULL,
                      "INSERT INTO keyshift_metrics(rollout_id, instance_id, source, time, seals, "
                      "opens, auth_failures, parse_errors, provider_calls, provider_errors, "
                      "seal_ns, open_ns, seal_ns_sum, open_ns_sum) VALUES($1, $2, $3, $4, $5, $6, "
                      "$7, $8, $9, $10, $11, $12, $13, $14)",
                      "ittiiiiiiibbii", rollout_id, instance_id, source, sample->time,
                      (int64_t)sample->seals, (int64_t)sample->opens,
                      (int64_t)sample->auth_failures, (int64_t)sample->parse_errors,
                      (int64_t)sample->provider_calls, (int64_t)sample->provider_errors, seal,
                      (int)KS_RCODEC_HIST_LEN, open, (int)KS_RCODEC_HIST_LEN,
                      (int64_t)sample->seal_ns_sum, (int64_t)sample->open_ns_sum);
}

/* See rollout_pg.h (ks_rpg_read_sample). */
ks_err ks_rpg_read_sample(const PGresult *res, int row, ks_health_sample *one)
{
    int64_t v[6], sums[2];
    memset(one, 0, sizeof *one);
    for (int i = 0; i < 6; i++)
        if (!ks_rpg_col_int(res, row, 1 + i, 0, INT64_MAX, &v[i]))
            return KS_ERR_STORE;
    for (int i = 0; i < 2; i++)
        if (!ks_rpg_col_int(res, row, 9 + i, 0, INT64_MAX, &sums[i]))
            return KS_ERR_STORE;
    if (!ks_rpg_col_int(res, row, 0, INT64_MIN, INT64_MAX, &one->time) ||
        !hist_decode(res, row, 7, &one->seal_ns) || !hist_decode(res, row, 8, &one->open_ns))
        return KS_ERR_STORE;
    ks_rcodec_sample_counters(one, v);
    one->seal_ns_sum = (uint64_t)sums[0];
    one->open_ns_sum = (uint64_t)sums[1];
    return KS_OK;
}

/* Add metrics row `row` into acc (ks_health_add: saturating); the row
 * is decoded by ks_rpg_read_sample, its errors returned. */
static ks_err add_sample(const PGresult *res, int row, ks_health_sample *acc)
{
    ks_health_sample one;
    ks_err err = ks_rpg_read_sample(res, row, &one);
    if (err == KS_OK)
        ks_health_add(acc, &one);
    return err;
}

/* See rollout_store.h (metrics_sum). */
ks_err ks_rpg_metrics_sum(ks_rollout_store *s, int64_t rollout_id, int64_t since,
                          const char *source, ks_health_sample *out)
{
    ks_rpg *db = ks_rpg_of(s);
    memset(out, 0, sizeof *out);
    if (!db->have_tables)
        return KS_OK;
    PGresult *res;
    ks_err err = ks_rpg_exec(db, &res,
                             db->sums ? "SELECT " KS_RPG_METRICS_COLS " FROM keyshift_metrics "
                                      "WHERE rollout_id = $1 AND time >= $2 AND ($3 = '' OR "
                                      "source = $3)"
                                    : "SELECT " KS_RPG_METRICS_HEAD ", 0::bigint, 0::bigint "
                                      "FROM keyshift_metrics WHERE rollout_id = $1 AND "
                                      "time >= $2 AND ($3 = '' OR source = $3)",
                             "iit", rollout_id, since, source != NULL ? source : "");
    int rows = err == KS_OK ? PQntuples(res) : 0;
    if (rows > 0)
        out->time = INT64_MIN;
    for (int i = 0; err == KS_OK && i < rows; i++)
        err = add_sample(res, i, out);
    PQclear(res);
    if (err != KS_OK)
        memset(out, 0, sizeof *out);
    return err;
}
