/*
 * migrate/store/sqlite/rollout_sqlite_rows.c -- the rows of the SQLite
 * rollout store (keyshift/rollout_store.h): rollouts and their listed
 * columns, the log, the reader registry and health samples.  The tables
 * are described in rollout_sqlite.c.
 *
 * Every column read back is decoded strictly (its type, its range, text
 * without NUL bytes and within its length, histograms of exactly their
 * length, phase and canary names known): anything else is KS_ERR_STORE.
 * What the values mean together (valid classes, canaries, distinct
 * listed columns, readers' key lists, log text) is checked by the rollout
 * layer, the same for every store.  Names are only ever bound.
 */
#define _POSIX_C_SOURCE 200809L

#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sqlite3.h>

#include <keyshift/rollout_store.h>

#include "sqlite_util.h"
#include "rollout_sqlite.h"
#include "../rollout_codec.h"
#include "../../alloc_hook.h"

/* The columns of keyshift_rollout in the order read_rollout expects. */
#define ROLLOUT_COLS                                                                               \
    "id, tbl, col, src_plaintext, src_format, src_algorithm, src_key_id, src_key_version, "       \
    "dst_format, dst_algorithm, dst_key_id, dst_key_version, phase, phase_since, canary_kind, "   \
    "canary_percent, canary_tenants, max_auth_failure_rate, max_parse_error_rate, "               \
    "max_provider_error_rate, max_seal_p99_us, max_open_p99_us, min_samples, window_s, "          \
    "min_soak_s, reader_ttl_s, created, updated, verified_at"

/* A query of ROLLOUT_COLS then the scope's key_id (column 29) and the
 * encoding (column 30) followed by tail, in three spellings indexed by
 * schema_level: a version 2 database (read-only) has no scope_key_id, and
 * every rollout in it is column-scoped; a version 2 or 3 one has no
 * encoding, and every rollout in it is of binary encoding. */
#define SELECT_ROLLOUT(tail)                                                                      \
    {"SELECT " ROLLOUT_COLS ", '', 'binary' FROM main.keyshift_rollout " tail,                    \
     "SELECT " ROLLOUT_COLS ", scope_key_id, 'binary' FROM main.keyshift_rollout " tail,          \
     "SELECT " ROLLOUT_COLS ", scope_key_id, encoding FROM main.keyshift_rollout " tail}

/* The columns of keyshift_readers in the order read_reader expects. */
#define READER_COLS                                                                                \
    "instance_id, library_version, max_format, algorithms, key_versions, started, heartbeat"

/* The index of db's spelling of SELECT_ROLLOUT: 0 (version 2), 1
 * (version 3) or 2 (version 4). */
static int schema_level(const ks_rsql *db)
{
    assert(!db->v4 || db->v3);
    return db->v3 + db->v4;
}

/* max as an SQL LIMIT. */
static int64_t limit_of(size_t max)
{
    return max > (size_t)INT64_MAX ? INT64_MAX : (int64_t)max;
}

/* ---- canary ------------------------------------------------------------------- */

/* Parse stored canary columns (kind at column i, percent i + 1, tenants
 * i + 2) strictly into *c: 0 for anything malformed (whether the canary
 * is valid is the rollout layer's check). */
static int read_canary(sqlite3_stmt *st, int i, ks_rollout_canary *c)
{
    char kind[16];
    char tenants[KS_RCODEC_TENANTS_MAX + 1];
    int64_t pct;
    memset(c, 0, sizeof *c);
    return ks_rsql_col_text(st, i, kind, sizeof kind - 1) &&
           ks_rsql_col_int(st, i + 1, 0, 100, &pct) &&
           ks_rsql_col_text(st, i + 2, tenants, KS_RCODEC_TENANTS_MAX) &&
           ks_rcodec_canary_parse(kind, pct, tenants, c);
}

/* ---- rollout rows ------------------------------------------------------------- */

/* Read the class at columns i.. of st (plaintext flag first when
 * with_flag; then format, algorithm, key_id, key_version) into *c, by
 * type and range (whether it is a valid class is the rollout layer's
 * check). */
static int read_class(sqlite3_stmt *st, int i, int with_flag, ks_rollout_class *c)
{
    int64_t plain = 0, fmt, alg, kv;
    memset(c, 0, sizeof *c);
    if (with_flag && !ks_rsql_col_int(st, i++, 0, 1, &plain))
        return 0;
    if (!ks_rsql_col_int(st, i, 0, 255, &fmt) || !ks_rsql_col_int(st, i + 1, 0, UINT32_MAX, &alg) ||
        !ks_rsql_col_text(st, i + 2, c->key_id, KS_KEY_ID_MAX) ||
        !ks_rsql_col_int(st, i + 3, 0, UINT32_MAX, &kv))
        return 0;
    c->is_plaintext = (int)plain;
    c->version = (uint8_t)fmt;
    c->algorithm = (uint32_t)alg;
    c->key_version = (uint32_t)kv;
    return 1;
}

/* A REAL (or INTEGER) column i of st into *out: 0 for another type. */
static int col_rate(sqlite3_stmt *st, int i, double *out)
{
    int t = sqlite3_column_type(st, i);
    if (t != SQLITE_FLOAT && t != SQLITE_INTEGER)
        return 0;
    *out = sqlite3_column_double(st, i);
    return !isnan(*out);
}

/* Read the row of ROLLOUT_COLS under st into *r, decoding every field
 * strictly: KS_ERR_STORE for a malformed row. */
static ks_err read_rollout(sqlite3_stmt *st, void *out)
{
    ks_rollout *r = out;
    char phase[32], key[KS_KEY_ID_MAX + 1], enc[8];
    int64_t v[6];
    memset(r, 0, sizeof *r);
    int ok = ks_rsql_col_int(st, 0, 1, INT64_MAX, &r->id) &&
             ks_rsql_col_text(st, 30, enc, sizeof enc - 1) && ks_rcodec_encoding_parse(enc, r) &&
             ks_rsql_col_text(st, 1, r->table, KS_ROLLOUT_IDENT_MAX) &&
             ks_rsql_col_text(st, 2, r->column, KS_ROLLOUT_IDENT_MAX) &&
             read_class(st, 3, 1, &r->source) && read_class(st, 8, 0, &r->target) &&
             ks_rsql_col_text(st, 29, key, KS_KEY_ID_MAX) && ks_rcodec_scope_ok(r, key) &&
             ks_rsql_col_text(st, 12, phase, sizeof phase - 1) &&
             ks_rsql_col_int(st, 13, INT64_MIN, INT64_MAX, &r->phase_since) &&
             read_canary(st, 14, &r->canary) &&
             col_rate(st, 17, &r->thresholds.max_auth_failure_rate) &&
             col_rate(st, 18, &r->thresholds.max_parse_error_rate) &&
             col_rate(st, 19, &r->thresholds.max_provider_error_rate) &&
             ks_rsql_col_int(st, 20, 0, INT64_MAX, &v[0]) &&
             ks_rsql_col_int(st, 21, 0, INT64_MAX, &v[1]) &&
             ks_rsql_col_int(st, 22, 0, INT64_MAX, &v[2]) &&
             ks_rsql_col_int(st, 23, 1, UINT32_MAX, &v[3]) &&
             ks_rsql_col_int(st, 24, 0, UINT32_MAX, &v[4]) &&
             ks_rsql_col_int(st, 25, 1, UINT32_MAX, &v[5]) &&
             ks_rsql_col_int(st, 26, INT64_MIN, INT64_MAX, &r->created) &&
             ks_rsql_col_int(st, 27, INT64_MIN, INT64_MAX, &r->updated) &&
             ks_rsql_col_int(st, 28, 0, INT64_MAX, &r->verified_at);
    return ok && ks_rcodec_rollout_finish(r, phase, v) ? KS_OK : KS_ERR_STORE;
}

/* Reads one row under a statement's cursor into *out. */
typedef ks_err (*row_reader)(sqlite3_stmt *st, void *out);

/* Run st (prepared and bound when rc is SQLITE_OK) and read up to max
 * rows with read into out[0, *n) (elements of elem bytes), then release
 * st.  On failure *n is 0. */
static ks_err read_rows(ks_rsql *db, sqlite3_stmt *st, int rc, row_reader read, void *out,
                        size_t elem, size_t max, size_t *n)
{
    ks_err err = KS_OK;
    *n = 0;
    while (rc == SQLITE_OK || rc == SQLITE_ROW) {
        if (*n == max)
            break;
        rc = sqlite3_step(st);
        if (rc != SQLITE_ROW)
            break;
        err = read(st, (uint8_t *)out + *n * elem);
        if (err != KS_OK)
            break;
        (*n)++;
    }
    ks_rsql_unprep(db, st);
    if (err == KS_OK && rc != SQLITE_DONE && rc != SQLITE_ROW && rc != SQLITE_OK)
        err = ks_sqlite_map_rc(rc);
    if (err != KS_OK)
        *n = 0;
    return err;
}

/* Read the listed columns of each key-scoped rollout of rs[0, n) from
 * keyshift_rollout_column, in the order they were given (at most
 * KS_ROLLOUT_COLUMNS_MAX, each name TEXT, a verify time >= 0): KS_ERR_STORE
 * for anything else. */
static ks_err load_columns(ks_rsql *db, ks_rollout *rs, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        ks_rollout *r = &rs[i];
        if (r->scope != KS_SCOPE_KEY)
            continue;
        if (!db->v3)
            return KS_ERR_STORE;
        sqlite3_stmt *st;
        int rc = ks_rsql_prep_bind(db, &st,
                                   "SELECT tbl, col, verified_at FROM main.keyshift_rollout_column "
                                   "WHERE rollout_id = ?1 ORDER BY rowid LIMIT ?2",
                                   "ii", r->id, (int64_t)KS_ROLLOUT_COLUMNS_MAX + 1);
        ks_err err = KS_OK;
        r->n_columns = 0;
        while (err == KS_OK && (rc == SQLITE_OK || rc == SQLITE_ROW) &&
               (rc = sqlite3_step(st)) == SQLITE_ROW) {
            ks_rollout_column *c = &r->columns[r->n_columns];
            if (r->n_columns == KS_ROLLOUT_COLUMNS_MAX ||
                !ks_rsql_col_text(st, 0, c->table, KS_ROLLOUT_IDENT_MAX) ||
                !ks_rsql_col_text(st, 1, c->column, KS_ROLLOUT_IDENT_MAX) ||
                !ks_rsql_col_int(st, 2, 0, INT64_MAX, &c->verified_at))
                err = KS_ERR_STORE;
            else
                r->n_columns++;
        }
        ks_rsql_unprep(db, st);
        if (err == KS_OK && rc != SQLITE_DONE)
            err = ks_sqlite_map_rc(rc);
        if (err != KS_OK)
            return err;
    }
    return KS_OK;
}

/* The first rollout row of st (prepared with result rc by prep_bind)
 * into *out, with its listed columns: KS_ERR_NO_ROLLOUT if none. */
static ks_err read_one(ks_rsql *db, sqlite3_stmt *st, int rc, ks_rollout *out)
{
    size_t n = 0;
    ks_err err = read_rows(db, st, rc, read_rollout, out, sizeof *out, 1, &n);
    if (err == KS_OK && n == 0)
        err = KS_ERR_NO_ROLLOUT;
    if (err == KS_OK)
        err = load_columns(db, out, 1);
    return err;
}

/* See rollout_store.h (get). */
ks_err ks_rsql_get(ks_rollout_store *s, int64_t id, ks_rollout *out)
{
    ks_rsql *db = ks_rsql_of(s);
    if (!db->have_tables)
        return KS_ERR_NO_ROLLOUT;
    static const char *const q[3] = SELECT_ROLLOUT("WHERE id = ?1");
    sqlite3_stmt *st;
    int rc = ks_rsql_prep_bind(db, &st, q[schema_level(db)], "i", id);
    return read_one(db, st, rc, out);
}

/* See rollout_store.h (latest). */
ks_err ks_rsql_latest(ks_rollout_store *s, const char *table, const char *column,
                      ks_rollout *out)
{
    ks_rsql *db = ks_rsql_of(s);
    if (!db->have_tables)
        return KS_ERR_NO_ROLLOUT;
    static const char *const q[3] = SELECT_ROLLOUT(
        "WHERE tbl = ?1 COLLATE NOCASE AND col = ?2 COLLATE NOCASE ORDER BY id DESC LIMIT 1");
    sqlite3_stmt *st;
    int rc = ks_rsql_prep_bind(db, &st, q[schema_level(db)], "tt", table, column);
    return read_one(db, st, rc, out); /* a column scope: no listed columns to load */
}

/* See rollout_store.h (latest_key). */
ks_err ks_rsql_latest_key(ks_rollout_store *s, const char *key_id, ks_rollout *out)
{
    ks_rsql *db = ks_rsql_of(s);
    if (!db->v3)
        return KS_ERR_NO_ROLLOUT;
    static const char *const q[3] =
        SELECT_ROLLOUT("WHERE scope_key_id = ?1 ORDER BY id DESC LIMIT 1");
    sqlite3_stmt *st;
    int rc = ks_rsql_prep_bind(db, &st, q[schema_level(db)], "t", key_id);
    return read_one(db, st, rc, out);
}

/* See rollout_store.h (list). */
ks_err ks_rsql_list(ks_rollout_store *s, int64_t after_id, ks_rollout *out, size_t max,
                    size_t *n)
{
    ks_rsql *db = ks_rsql_of(s);
    *n = 0;
    if (!db->have_tables || max == 0)
        return KS_OK;
    static const char *const q[3] = SELECT_ROLLOUT("WHERE id > ?1 ORDER BY id LIMIT ?2");
    sqlite3_stmt *st;
    int rc = ks_rsql_prep_bind(db, &st, q[schema_level(db)], "ii", after_id, limit_of(max));
    ks_err err = read_rows(db, st, rc, read_rollout, out, sizeof *out, max, n);
    if (err == KS_OK)
        err = load_columns(db, out, *n);
    if (err != KS_OK)
        *n = 0;
    return err;
}

/* ---- scopes and changes of rollouts -------------------------------------------- */

/* See rollout_store.h (find_column).  Names are bound and compared as
 * SQLite compares identifiers; the same rules as the row store: not a
 * keyshift_* or sqlite_* table, a real table, and not a primary-key,
 * generated or hidden column. */
ks_err ks_rsql_find_column(ks_rollout_store *s, const char *table, const char *column,
                           char tbl[KS_ROLLOUT_IDENT_MAX + 1], char col[KS_ROLLOUT_IDENT_MAX + 1],
                           char *errbuf, size_t errbuf_len)
{
    ks_rsql *db = ks_rsql_of(s);
    char pt[96], pc[96];
    ks_sqlite_printable(table, pt, sizeof pt);
    ks_sqlite_printable(column, pc, sizeof pc);
    if (sqlite3_strnicmp(table, "sqlite_", 7) == 0 || sqlite3_strnicmp(table, "keyshift_", 9) == 0)
        return ks_sqlite_fail(errbuf, errbuf_len, KS_ERR_INVALID_ARGUMENT,
                              "table \"%s\" is reserved (sqlite_*, keyshift_*)", pt);
    sqlite3_stmt *st;
    int rc = ks_rsql_prep_bind(
        db, &st,
        "SELECT m.name, c.name, c.pk, c.hidden FROM main.sqlite_master AS m "
        "LEFT JOIN pragma_table_xinfo(m.name, 'main') AS c ON c.name = ?2 COLLATE NOCASE "
        "WHERE m.type = 'table' AND m.name = ?1 COLLATE NOCASE",
        "tt", table, column);
    if (rc == SQLITE_OK)
        rc = sqlite3_step(st);
    ks_err err = KS_OK;
    if (rc == SQLITE_DONE) {
        err = ks_sqlite_fail(errbuf, errbuf_len, KS_ERR_NO_TARGET,
                             "no table \"%s\" in the database", pt);
    } else if (rc != SQLITE_ROW) {
        err = ks_sqlite_fail_rc(errbuf, errbuf_len, rc, "reading the schema");
    } else if (sqlite3_column_type(st, 1) == SQLITE_NULL) {
        err = ks_sqlite_fail(errbuf, errbuf_len, KS_ERR_NO_TARGET,
                             "no column \"%s\" in table \"%s\"", pc, pt);
    } else if (sqlite3_column_int(st, 2) != 0 || sqlite3_column_int(st, 3) != 0) {
        err = ks_sqlite_fail(errbuf, errbuf_len, KS_ERR_INVALID_ARGUMENT,
                             "column \"%s\" is generated, hidden or part of the primary key", pc);
    } else if (!ks_rsql_col_text(st, 0, tbl, KS_ROLLOUT_IDENT_MAX) ||
               !ks_rsql_col_text(st, 1, col, KS_ROLLOUT_IDENT_MAX)) {
        err = ks_sqlite_fail(errbuf, errbuf_len, KS_ERR_INVALID_ARGUMENT,
                             "table or column name of \"%s\".\"%s\" is too long", pt, pc);
    }
    ks_rsql_unprep(db, st);
    return err;
}

/* See rollout_store.h (find_open). */
ks_err ks_rsql_find_open(ks_rollout_store *s, const char *tbl, const char *col,
                         const char *key_id, int key_scopes, int64_t *id)
{
    ks_rsql *db = ks_rsql_of(s);
    sqlite3_stmt *st;
    *id = 0;
    int rc;
    if (key_id != NULL)
        rc = ks_rsql_prep_bind(db, &st,
                               "SELECT id FROM main.keyshift_rollout WHERE scope_key_id = ?1 "
                               "AND phase <> 'finalized' ORDER BY id LIMIT 1",
                               "t", key_id);
    else
        rc = ks_rsql_prep_bind(db, &st,
                               "SELECT id FROM main.keyshift_rollout AS r WHERE "
                               "phase <> 'finalized' AND ((scope_key_id = '' AND "
                               "tbl = ?1 COLLATE NOCASE AND col = ?2 COLLATE NOCASE) OR (?3 AND "
                               "EXISTS (SELECT 1 FROM main.keyshift_rollout_column AS c WHERE "
                               "c.rollout_id = r.id AND c.tbl = ?1 AND c.col = ?2))) "
                               "ORDER BY id LIMIT 1",
                               "tti", tbl, col, (int64_t)(key_scopes != 0));
    if (rc == SQLITE_OK)
        rc = sqlite3_step(st);
    if (rc == SQLITE_ROW)
        *id = sqlite3_column_int64(st, 0);
    ks_rsql_unprep(db, st);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE)
        return ks_sqlite_map_rc(rc);
    return KS_OK;
}

/* See rollout_store.h (insert): r's phase, times, canary and thresholds
 * as given, its verify time 0, then the listed columns of a key scope. */
ks_err ks_rsql_insert(ks_rollout_store *s, const ks_rollout *r, int64_t *id)
{
    ks_rsql *db = ks_rsql_of(s);
    if (!ks_rsql_writable(db))
        return KS_ERR_INVALID_ARGUMENT;
    char tenants[KS_RCODEC_TENANTS_MAX + 1];
    ks_rcodec_canary_join(&r->canary, tenants);
    const ks_thresholds *t = &r->thresholds;
    const ks_rollout_class *a = &r->source, *b = &r->target;
    sqlite3_stmt *st;
    int rc = ks_rsql_prep_bind(
        db, &st,
        "INSERT INTO main.keyshift_rollout(tbl, col, src_plaintext, src_format, "
        "src_algorithm, src_key_id, src_key_version, dst_format, dst_algorithm, "
        "dst_key_id, dst_key_version, phase, phase_since, canary_kind, canary_percent, "
        "canary_tenants, max_auth_failure_rate, max_parse_error_rate, "
        "max_provider_error_rate, max_seal_p99_us, max_open_p99_us, min_samples, "
        "window_s, min_soak_s, reader_ttl_s, created, updated, verified_at, scope_key_id, "
        "encoding) "
        "VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, "
        "?16, ?17, ?18, ?19, ?20, ?21, ?22, ?23, ?24, ?25, ?26, ?27, 0, ?28, ?29)",
        "ttiiitiiiti" "titit" "ddd" "iiiiii" "ii" "tt", r->table, r->column,
        (int64_t)(a->is_plaintext != 0),
        (int64_t)a->version, (int64_t)a->algorithm, a->key_id, (int64_t)a->key_version,
        (int64_t)b->version, (int64_t)b->algorithm, b->key_id, (int64_t)b->key_version,
        ks_rollout_phase_name((int)r->phase), r->phase_since,
        ks_rcodec_canary_name(r->canary.kind), (int64_t)r->canary.percent, tenants,
        t->max_auth_failure_rate, t->max_parse_error_rate, t->max_provider_error_rate,
        (int64_t)t->max_seal_p99_us, (int64_t)t->max_open_p99_us, (int64_t)t->min_samples,
        (int64_t)t->window_s, (int64_t)r->min_soak_s, (int64_t)r->reader_ttl_s, r->created,
        r->updated, r->scope == KS_SCOPE_KEY ? a->key_id : "",
        ks_value_encoding_name((int)r->encoding));
    rc = ks_rsql_run_done(db, st, rc);
    if (rc != SQLITE_OK)
        return ks_rsql_rc_err(rc);
    *id = sqlite3_last_insert_rowid(db->db);
    for (size_t i = 0; rc == SQLITE_OK && i < r->n_columns; i++) {
        rc = ks_rsql_prep_bind(db, &st,
                               "INSERT INTO main.keyshift_rollout_column(rollout_id, tbl, col) "
                               "VALUES(?1, ?2, ?3)",
                               "itt", *id, r->columns[i].table, r->columns[i].column);
        rc = ks_rsql_run_done(db, st, rc);
    }
    return rc == SQLITE_OK ? KS_OK : ks_rsql_rc_err(rc);
}

/* See rollout_store.h (later_count). */
ks_err ks_rsql_later_count(ks_rollout_store *s, const ks_rollout *r, int64_t *n)
{
    ks_rsql *db = ks_rsql_of(s);
    sqlite3_stmt *st;
    int rc;
    if (r->scope == KS_SCOPE_KEY)
        rc = ks_rsql_prep_bind(
            db, &st,
            "SELECT count(*) FROM main.keyshift_rollout AS o WHERE o.id > ?1 AND "
            "(o.scope_key_id = ?2 OR (o.scope_key_id = '' AND EXISTS (SELECT 1 FROM "
            "main.keyshift_rollout_column AS c WHERE c.rollout_id = ?1 AND "
            "c.tbl = o.tbl AND c.col = o.col)))",
            "it", r->id, r->source.key_id);
    else
        rc = ks_rsql_prep_bind(
            db, &st,
            "SELECT (SELECT count(*) FROM main.keyshift_rollout WHERE id > ?1 AND "
            "scope_key_id = '' AND tbl = ?2 COLLATE NOCASE AND col = ?3 COLLATE "
            "NOCASE) + (SELECT count(*) FROM main.keyshift_rollout_column WHERE "
            "rollout_id > ?1 AND tbl = ?2 AND col = ?3)",
            "itt", r->id, r->table, r->column);
    if (rc == SQLITE_OK)
        rc = sqlite3_step(st);
    *n = rc == SQLITE_ROW ? sqlite3_column_int64(st, 0) : 0;
    ks_rsql_unprep(db, st);
    return rc == SQLITE_ROW ? KS_OK : ks_sqlite_map_rc(rc == SQLITE_DONE ? SQLITE_ERROR : rc);
}

/* See rollout_store.h (set_phase): the UPDATE compares the phase, so a
 * rollout moved meanwhile changes no row. */
ks_err ks_rsql_set_phase(ks_rollout_store *s, int64_t id, ks_rollout_phase from,
                         ks_rollout_phase to, int64_t now)
{
    ks_rsql *db = ks_rsql_of(s);
    sqlite3_stmt *st;
    int rc = ks_rsql_prep_bind(db, &st,
                               "UPDATE main.keyshift_rollout SET phase = ?1, phase_since = ?2, "
                               "updated = ?2, verified_at = CASE WHEN ?1 = 'backfill' THEN 0 "
                               "ELSE verified_at END WHERE id = ?3 AND phase = ?4",
                               "tiit", ks_rollout_phase_name((int)to), now, id,
                               ks_rollout_phase_name((int)from));
    rc = ks_rsql_run_done(db, st, rc);
    if (rc != SQLITE_OK)
        return ks_rsql_rc_err(rc);
    if (sqlite3_changes(db->db) != 1)
        return KS_ERR_STORE;
    if (to != KS_PHASE_BACKFILL)
        return KS_OK;
    rc = ks_rsql_prep_bind(db, &st,
                           "UPDATE main.keyshift_rollout_column SET verified_at = 0 "
                           "WHERE rollout_id = ?1",
                           "i", id);
    rc = ks_rsql_run_done(db, st, rc);
    return rc == SQLITE_OK ? KS_OK : ks_rsql_rc_err(rc);
}

/* See rollout_store.h (set_canary). */
ks_err ks_rsql_set_canary(ks_rollout_store *s, int64_t id, const ks_rollout_canary *canary,
                          int64_t now)
{
    ks_rsql *db = ks_rsql_of(s);
    char tenants[KS_RCODEC_TENANTS_MAX + 1];
    ks_rcodec_canary_join(canary, tenants);
    sqlite3_stmt *st;
    int rc = ks_rsql_prep_bind(db, &st,
                               "UPDATE main.keyshift_rollout SET canary_kind = ?1, "
                               "canary_percent = ?2, canary_tenants = ?3, updated = ?4 "
                               "WHERE id = ?5",
                               "titii", ks_rcodec_canary_name(canary->kind), (int64_t)canary->percent,
                               tenants, now, id);
    rc = ks_rsql_run_done(db, st, rc);
    return rc == SQLITE_OK ? KS_OK : ks_rsql_rc_err(rc);
}

/* See rollout_store.h (set_settings). */
ks_err ks_rsql_set_settings(ks_rollout_store *s, int64_t id, const ks_thresholds *t,
                            uint32_t min_soak_s, uint32_t reader_ttl_s, int64_t now)
{
    ks_rsql *db = ks_rsql_of(s);
    sqlite3_stmt *st;
    int rc = ks_rsql_prep_bind(db, &st,
                               "UPDATE main.keyshift_rollout SET max_auth_failure_rate = ?1, "
                               "max_parse_error_rate = ?2, max_provider_error_rate = ?3, "
                               "max_seal_p99_us = ?4, max_open_p99_us = ?5, min_samples = ?6, "
                               "window_s = ?7, min_soak_s = ?8, reader_ttl_s = ?9, "
                               "updated = ?10 WHERE id = ?11",
                               "dddiiiiiiii", t->max_auth_failure_rate, t->max_parse_error_rate,
                               t->max_provider_error_rate, (int64_t)t->max_seal_p99_us,
                               (int64_t)t->max_open_p99_us, (int64_t)t->min_samples,
                               (int64_t)t->window_s, (int64_t)min_soak_s, (int64_t)reader_ttl_s,
                               now, id);
    rc = ks_rsql_run_done(db, st, rc);
    if (rc != SQLITE_OK)
        return ks_rsql_rc_err(rc);
    return sqlite3_changes(db->db) == 1 ? KS_OK : KS_ERR_STORE;
}

/* See rollout_store.h (remove): the listed columns first (they reference
 * the rollout), then the rollout. */
ks_err ks_rsql_remove(ks_rollout_store *s, int64_t id)
{
    ks_rsql *db = ks_rsql_of(s);
    sqlite3_stmt *st;
    int rc = ks_rsql_prep_bind(db, &st,
                               "DELETE FROM main.keyshift_rollout_column WHERE rollout_id = ?1",
                               "i", id);
    rc = ks_rsql_run_done(db, st, rc);
    if (rc == SQLITE_OK) {
        rc = ks_rsql_prep_bind(db, &st, "DELETE FROM main.keyshift_rollout WHERE id = ?1", "i",
                               id);
        rc = ks_rsql_run_done(db, st, rc);
    }
    if (rc != SQLITE_OK)
        return ks_rsql_rc_err(rc);
    return sqlite3_changes(db->db) == 1 ? KS_OK : KS_ERR_STORE;
}

/* See rollout_store.h (set_verified). */
ks_err ks_rsql_set_verified(ks_rollout_store *s, int64_t id, const char *table,
                            const char *column, int64_t now)
{
    ks_rsql *db = ks_rsql_of(s);
    sqlite3_stmt *st;
    int rc;
    if (table != NULL)
        rc = ks_rsql_prep_bind(db, &st,
                               "UPDATE main.keyshift_rollout_column SET verified_at = ?1 "
                               "WHERE rollout_id = ?2 AND tbl = ?3 AND col = ?4",
                               "iitt", now, id, table, column);
    else
        rc = ks_rsql_prep_bind(db, &st,
                               "UPDATE main.keyshift_rollout SET verified_at = ?1, "
                               "updated = ?1 WHERE id = ?2",
                               "ii", now, id);
    rc = ks_rsql_run_done(db, st, rc);
    if (rc != SQLITE_OK)
        return ks_rsql_rc_err(rc);
    return sqlite3_changes(db->db) == 1 ? KS_OK : KS_ERR_STORE;
}

/* ---- the log ------------------------------------------------------------------ */

/* See rollout_store.h (log_append); from 0 is stored as NULL. */
ks_err ks_rsql_log_append(ks_rollout_store *s, int64_t rollout_id, int64_t time,
                          const char *actor, int from, int to, const char *reason, int automatic)
{
    ks_rsql *db = ks_rsql_of(s);
    sqlite3_stmt *st;
    int rc = ks_rsql_prep_bind(
        db, &st,
        "INSERT INTO main.keyshift_rollout_log(rollout_id, time, actor, from_phase, "
        "to_phase, reason, automatic) VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        "iitttti", rollout_id, time, actor, from == 0 ? NULL : ks_rollout_phase_name(from),
        ks_rollout_phase_name(to), reason != NULL ? reason : "", (int64_t)(automatic != 0));
    rc = ks_rsql_run_done(db, st, rc);
    return rc == SQLITE_OK ? KS_OK : ks_rsql_rc_err(rc);
}

/* Read a log row into *e, decoding it strictly (KS_ERR_STORE when
 * malformed; whether its text may be logged is the rollout layer's
 * check). */
static ks_err read_log(sqlite3_stmt *st, void *out)
{
    ks_rollout_log_entry *e = out;
    char from[32] = "", to[32];
    int64_t automatic;
    memset(e, 0, sizeof *e);
    int ok = ks_rsql_col_int(st, 0, 1, INT64_MAX, &e->id) &&
             ks_rsql_col_int(st, 1, 1, INT64_MAX, &e->rollout_id) &&
             ks_rsql_col_int(st, 2, INT64_MIN, INT64_MAX, &e->time) &&
             ks_rsql_col_text(st, 3, e->actor, KS_ROLLOUT_ACTOR_MAX) &&
             (sqlite3_column_type(st, 4) == SQLITE_NULL ||
              ks_rsql_col_text(st, 4, from, sizeof from - 1)) &&
             ks_rsql_col_text(st, 5, to, sizeof to - 1) &&
             ks_rsql_col_text(st, 6, e->reason, KS_ROLLOUT_REASON_MAX) &&
             ks_rsql_col_int(st, 7, 0, 1, &automatic);
    return ok && ks_rcodec_log_finish(e, from, to, automatic) ? KS_OK : KS_ERR_STORE;
}

/* See rollout_store.h (log_list). */
ks_err ks_rsql_log_list(ks_rollout_store *s, int64_t rollout_id, int64_t after_id,
                        ks_rollout_log_entry *out, size_t max, size_t *n)
{
    ks_rsql *db = ks_rsql_of(s);
    *n = 0;
    if (!db->have_tables || max == 0)
        return KS_OK;
    sqlite3_stmt *st;
    int rc = ks_rsql_prep_bind(db, &st,
                               "SELECT id, rollout_id, time, actor, from_phase, to_phase, reason, "
                               "automatic FROM main.keyshift_rollout_log WHERE (?1 = 0 OR "
                               "rollout_id = ?1) AND id > ?2 ORDER BY id LIMIT ?3",
                               "iii", rollout_id, after_id, limit_of(max));
    return read_rows(db, st, rc, read_log, out, sizeof *out, max, n);
}

/* ---- readers ------------------------------------------------------------------- */

/* Read a READER_COLS row into *r, decoding it strictly (KS_ERR_STORE
 * when malformed; the key list's form is the rollout layer's check). */
static ks_err read_reader(sqlite3_stmt *st, ks_rollout_reader *r)
{
    int64_t fmt, algs;
    memset(r, 0, sizeof *r);
    int ok = ks_rsql_col_text(st, 0, r->instance_id, KS_INSTANCE_ID_MAX) &&
             ks_rsql_col_text(st, 1, r->library_version, KS_LIBRARY_VERSION_MAX) &&
             ks_rsql_col_int(st, 2, 1, 255, &fmt) && ks_rsql_col_int(st, 3, 0, UINT32_MAX, &algs) &&
             ks_rsql_col_text(st, 4, r->keys, KS_READER_KEYS_MAX) &&
             ks_rsql_col_int(st, 5, INT64_MIN, INT64_MAX, &r->started) &&
             ks_rsql_col_int(st, 6, INT64_MIN, INT64_MAX, &r->heartbeat);
    if (!ok)
        return KS_ERR_STORE;
    r->max_format = (uint8_t)fmt;
    r->algorithms = (uint32_t)algs;
    return KS_OK;
}

/* See rollout_store.h (readers_live). */
ks_err ks_rsql_readers_live(ks_rollout_store *s, int64_t since, ks_rollout_reader *out,
                            size_t max, size_t *n, size_t *total)
{
    ks_rsql *db = ks_rsql_of(s);
    *n = 0;
    *total = 0;
    if (!db->have_tables)
        return KS_OK;
    sqlite3_stmt *st;
    int rc = ks_rsql_prep_bind(db, &st,
                               "SELECT " READER_COLS " FROM main.keyshift_readers "
                               "WHERE heartbeat >= ?1 ORDER BY instance_id",
                               "i", since);
    ks_err err = KS_OK;
    while (rc == SQLITE_OK || rc == SQLITE_ROW) {
        rc = sqlite3_step(st);
        if (rc != SQLITE_ROW)
            break;
        ks_rollout_reader tmp, *r = *n < max ? &out[*n] : &tmp;
        err = read_reader(st, r);
        if (err != KS_OK)
            break;
        (*total)++;
        if (*n < max)
            (*n)++;
    }
    ks_rsql_unprep(db, st);
    if (err == KS_OK && rc != SQLITE_DONE)
        err = ks_sqlite_map_rc(rc);
    return err;
}

/* See rollout_store.h (reader_put). */
ks_err ks_rsql_reader_put(ks_rollout_store *s, const ks_rollout_reader *r, int64_t now)
{
    ks_rsql *db = ks_rsql_of(s);
    if (!ks_rsql_writable(db))
        return KS_ERR_INVALID_ARGUMENT;
    sqlite3_stmt *st;
    int rc = ks_rsql_prep_bind(db, &st,
                               "INSERT OR REPLACE INTO main.keyshift_readers(" READER_COLS
                               ") VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?6)",
                               "ttiiti", r->instance_id, r->library_version,
                               (int64_t)r->max_format, (int64_t)r->algorithms, r->keys, now);
    rc = ks_rsql_run_done(db, st, rc);
    return rc == SQLITE_OK ? KS_OK : ks_rsql_rc_err(rc);
}

/* Run a one-statement write on instance_id (?1) and now (?2 when types
 * is "ti", "t" without); *changed gets the rows changed. */
static ks_err reader_write(ks_rsql *db, const char *sql, const char *types,
                           const char *instance_id, int64_t now, int *changed)
{
    *changed = 0;
    if (!ks_rsql_writable(db))
        return KS_ERR_INVALID_ARGUMENT;
    sqlite3_stmt *st;
    int rc = ks_rsql_prep_bind(db, &st, sql, types, instance_id, now);
    rc = ks_rsql_run_done(db, st, rc);
    *changed = sqlite3_changes(db->db);
    return rc == SQLITE_OK ? KS_OK : ks_rsql_rc_err(rc);
}

/* See rollout_store.h (reader_heartbeat). */
ks_err ks_rsql_reader_heartbeat(ks_rollout_store *s, const char *instance_id, int64_t now)
{
    int changed = 0;
    ks_err err = reader_write(ks_rsql_of(s),
                              "UPDATE main.keyshift_readers SET heartbeat = ?2 "
                              "WHERE instance_id = ?1",
                              "ti", instance_id, now, &changed);
    return err == KS_OK && changed == 0 ? KS_ERR_NOT_FOUND : err;
}

/* See rollout_store.h (reader_delete). */
ks_err ks_rsql_reader_delete(ks_rollout_store *s, const char *instance_id)
{
    int changed = 0;
    return reader_write(ks_rsql_of(s), "DELETE FROM main.keyshift_readers WHERE instance_id = ?1",
                        "t", instance_id, 0, &changed);
}

/* ---- metrics --------------------------------------------------------------------- */

/* Decode the histogram BLOB at column i of st into h: 0 unless it is a
 * BLOB of exactly KS_RCODEC_HIST_LEN bytes. */
static int hist_decode(sqlite3_stmt *st, int i, ks_histogram *h)
{
    if (sqlite3_column_type(st, i) != SQLITE_BLOB)
        return 0;
    const uint8_t *p = sqlite3_column_blob(st, i);
    if (p == NULL || sqlite3_column_bytes(st, i) != KS_RCODEC_HIST_LEN)
        return 0;
    ks_rcodec_hist_decode(p, h);
    return 1;
}

/* See rollout_store.h (metrics_insert). */
ks_err ks_rsql_metrics_insert(ks_rollout_store *s, int64_t rollout_id, const char *instance_id,
                              const char *source, const ks_health_sample *sample)
{
    ks_rsql *db = ks_rsql_of(s);
    if (!ks_rsql_writable(db))
        return KS_ERR_INVALID_ARGUMENT;
    uint8_t seal[KS_RCODEC_HIST_LEN], open[KS_RCODEC_HIST_LEN];
    ks_rcodec_hist_encode(&sample->seal_ns, seal);
    ks_rcodec_hist_encode(&sample->open_ns, open);
    sqlite3_stmt *st;
    int rc = ks_rsql_prep_bind(db, &st,
                               "INSERT INTO main.keyshift_metrics(rollout_id, instance_id, source, "
                               "time, seals, opens, auth_failures, parse_errors, provider_calls, "
                               "provider_errors, seal_ns, open_ns, seal_ns_sum, open_ns_sum) "
                               "VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)",
                               "ittiiiiiiibbii", rollout_id, instance_id, source, sample->time,
                               (int64_t)sample->seals, (int64_t)sample->opens,
                               (int64_t)sample->auth_failures, (int64_t)sample->parse_errors,
                               (int64_t)sample->provider_calls, (int64_t)sample->provider_errors,
                               seal, (int)KS_RCODEC_HIST_LEN, open, (int)KS_RCODEC_HIST_LEN,
                               (int64_t)sample->seal_ns_sum, (int64_t)sample->open_ns_sum);
    rc = ks_rsql_run_done(db, st, rc);
    return rc == SQLITE_OK ? KS_OK : ks_rsql_rc_err(rc);
}

/* Add the metrics row under st into acc (ks_health_add: saturating):
 * KS_ERR_STORE when a counter or latency sum is not a non-negative
 * INTEGER or a histogram is not an exact-length BLOB. */
static ks_err add_sample(sqlite3_stmt *st, ks_health_sample *acc)
{
    int64_t v[6], sums[2];
    ks_health_sample row;
    memset(&row, 0, sizeof row);
    for (int i = 0; i < 6; i++)
        if (!ks_rsql_col_int(st, 1 + i, 0, INT64_MAX, &v[i]))
            return KS_ERR_STORE;
    for (int i = 0; i < 2; i++)
        if (!ks_rsql_col_int(st, 9 + i, 0, INT64_MAX, &sums[i]))
            return KS_ERR_STORE;
    if (!ks_rsql_col_int(st, 0, INT64_MIN, INT64_MAX, &row.time) ||
        !hist_decode(st, 7, &row.seal_ns) || !hist_decode(st, 8, &row.open_ns))
        return KS_ERR_STORE;
    ks_rcodec_sample_counters(&row, v);
    row.seal_ns_sum = (uint64_t)sums[0];
    row.open_ns_sum = (uint64_t)sums[1];
    ks_health_add(acc, &row);
    return KS_OK;
}

/* The query of metrics_sum, in two spellings indexed by db->sums: a
 * database without the latency sum columns (read-only) has no sums, 0
 * for each of its samples as for those stored before they were added. */
#define SELECT_METRICS(sums)                                                                      \
    "SELECT time, seals, opens, auth_failures, parse_errors, provider_calls, provider_errors, "   \
    "seal_ns, open_ns, " sums " FROM main.keyshift_metrics WHERE rollout_id = ?1 AND time >= ?2 " \
    "AND (?3 = '' OR source = ?3)"
static const char *const select_metrics[2] = {SELECT_METRICS("0, 0"),
                                              SELECT_METRICS("seal_ns_sum, open_ns_sum")};

/* See rollout_store.h (metrics_sum). */
ks_err ks_rsql_metrics_sum(ks_rollout_store *s, int64_t rollout_id, int64_t since,
                           const char *source, ks_health_sample *out)
{
    ks_rsql *db = ks_rsql_of(s);
    memset(out, 0, sizeof *out);
    if (!db->have_tables)
        return KS_OK;
    sqlite3_stmt *st;
    int rc = ks_rsql_prep_bind(db, &st, select_metrics[db->sums != 0], "iit", rollout_id, since,
                               source != NULL ? source : "");
    ks_err err = KS_OK;
    int any = 0;
    while (rc == SQLITE_OK || rc == SQLITE_ROW) {
        rc = sqlite3_step(st);
        if (rc != SQLITE_ROW)
            break;
        if (!any)
            out->time = INT64_MIN;
        any = 1;
        err = add_sample(st, out);
        if (err != KS_OK)
            break;
    }
    ks_rsql_unprep(db, st);
    if (err == KS_OK && rc != SQLITE_DONE)
        err = ks_sqlite_map_rc(rc);
    if (err != KS_OK)
        memset(out, 0, sizeof *out);
    return err;
}
