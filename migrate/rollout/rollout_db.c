/*
 * migrate/rollout/rollout_db.c -- the rollout store (keyshift/rollout.h,
 * ks_rollout_db_*): rollouts, their log, the reader registry and health
 * samples, in the application's SQLite database.
 *
 * ---- Tables (schema version 3 of keyshift_meta) --------------------------
 *
 * Version 1 (migrate/store/sqlite/sqlite_store.c) has keyshift_meta,
 * keyshift_migration and keyshift_quarantine.  Version 2 adds the four
 * tables below and changes none of version 1's; version 3 adds key scopes
 * (keyshift_rollout.scope_key_id, keyshift_rollout_column, the open-rollout
 * index on (scope_key_id, tbl, col)).  The upgrade runs, when a writer
 * opens a database below version 3, in one BEGIN IMMEDIATE transaction:
 * version 1's SQL (idempotent: CREATE IF NOT EXISTS, INSERT OR IGNORE), a
 * re-read of the version inside the transaction (a newer one is refused),
 * schema_sql_v2 below when below 2, then the ALTER TABLE adding
 * scope_key_id when it is missing and schema_sql_v3, which sets
 * schema_version = 3.  Exact SQL: schema_sql_v2, schema_sql_v3.  In short:
 *
 *   keyshift_rollout      one row per rollout: scope (tbl, col, the schema's
 *                         spelling), source (src_plaintext, src_format,
 *                         src_algorithm, src_key_id, src_key_version),
 *                         target (dst_*), phase (its name), phase_since,
 *                         canary (canary_kind 'all'|'tenants'|'percent',
 *                         canary_percent, canary_tenants: "t1,t2"), the
 *                         thresholds, min_soak_s, reader_ttl_s, created,
 *                         updated, verified_at, scope_key_id (v3: '' for a
 *                         column scope, else the key; tbl and col are then
 *                         '').  A partial UNIQUE index on (scope_key_id,
 *                         tbl, col) WHERE phase <> 'finalized' backs the
 *                         "one open rollout per scope" rule; overlaps of
 *                         key and column scopes are refused by
 *                         refuse_overlap inside start's transaction.
 *   keyshift_rollout_column  (v3) rollout_id, tbl, col (NOCASE, unique per
 *                         rollout), verified_at: a key scope's columns in
 *                         the order given, each with its verify time.
 *   keyshift_rollout_log  append-only (BEFORE UPDATE / DELETE triggers
 *                         RAISE(ABORT)): id, rollout_id, time, actor,
 *                         from_phase (NULL at creation), to_phase, reason,
 *                         automatic.  Canary changes and verify passes are
 *                         logged with from_phase = to_phase.
 *   keyshift_readers      instance_id PRIMARY KEY, library_version,
 *                         max_format, algorithms (bitmask), key_versions
 *                         (canonical "key_id:version,..." text), started,
 *                         heartbeat.
 *   keyshift_metrics      rollout_id, instance_id, source 'app'|'migrate',
 *                         time, the counters of a ks_health_sample, and the
 *                         two histograms as BLOBs of exactly
 *                         KS_HIST_BUCKETS little-endian uint64.
 *
 * ---- Behaviour -----------------------------------------------------------
 *
 * Connections are opened and configured by ks_sqlite_connect (never
 * creating the file, defensive mode, untrusted schema, busy handler with
 * backoff).  Identifiers given by callers (table, column) are only ever
 * bound as parameters and compared with the schema; no name is pasted
 * into SQL.  Every change of a rollout runs in one BEGIN IMMEDIATE
 * transaction that re-reads the rollout, checks, writes the change and
 * its log row, and commits; any failure rolls back.  Rows read back are
 * untrusted: each field is checked (types, ranges, charsets, canonical
 * key lists, blob lengths) and a bad row is KS_ERR_STORE.  Messages never
 * quote SQLite's error text.
 */
#define _POSIX_C_SOURCE 200809L

#include <assert.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sqlite3.h>

#include <keyshift/rollout.h>

#include "../../format/rules.h"
#include "../store/sqlite/sqlite_store.h"
#include "../store/sqlite/sqlite_util.h"
#include "rollout_internal.h"
#include "../alloc_hook.h"

/* Statements a store keeps prepared (more than the distinct SQL texts of
 * this file, so every one is kept once used). */
#define STMT_CACHE 64

/* One kept statement: its SQL text (a string literal, known by address)
 * and whether a caller holds it now. */
typedef struct kept_stmt {
    const char *sql;
    sqlite3_stmt *st;
    int busy;
} kept_stmt;

/* One open rollout store. */
struct ks_rollout_db {
    sqlite3 *db;
    ks_sqlite_busy busy;      /* must outlive db (its busy handler's state) */
    int read_only;
    int have_tables;          /* the version 2 tables exist (read-only: maybe v2 only) */
    int v3;                   /* and version 3's: scope_key_id, keyshift_rollout_column */
    kept_stmt kept[STMT_CACHE]; /* prepared once, reset after each use (prep, unprep) */
};

/* The version 2 tables (see the file comment). */
static const char schema_sql_v2[] =
    "CREATE TABLE IF NOT EXISTS main.keyshift_rollout("
    " id INTEGER PRIMARY KEY AUTOINCREMENT, tbl TEXT NOT NULL, col TEXT NOT NULL,"
    " src_plaintext INTEGER NOT NULL, src_format INTEGER NOT NULL,"
    " src_algorithm INTEGER NOT NULL, src_key_id TEXT NOT NULL, src_key_version INTEGER NOT NULL,"
    " dst_format INTEGER NOT NULL, dst_algorithm INTEGER NOT NULL, dst_key_id TEXT NOT NULL,"
    " dst_key_version INTEGER NOT NULL, phase TEXT NOT NULL, phase_since INTEGER NOT NULL,"
    " canary_kind TEXT NOT NULL, canary_percent INTEGER NOT NULL, canary_tenants TEXT NOT NULL,"
    " max_auth_failure_rate REAL NOT NULL, max_parse_error_rate REAL NOT NULL,"
    " max_provider_error_rate REAL NOT NULL, max_seal_p99_us INTEGER NOT NULL,"
    " max_open_p99_us INTEGER NOT NULL, min_samples INTEGER NOT NULL, window_s INTEGER NOT NULL,"
    " min_soak_s INTEGER NOT NULL, reader_ttl_s INTEGER NOT NULL, created INTEGER NOT NULL,"
    " updated INTEGER NOT NULL, verified_at INTEGER NOT NULL);"
    "CREATE UNIQUE INDEX IF NOT EXISTS main.keyshift_rollout_open ON keyshift_rollout("
    " tbl COLLATE NOCASE, col COLLATE NOCASE) WHERE phase <> 'finalized';"
    "CREATE INDEX IF NOT EXISTS main.keyshift_rollout_scope ON keyshift_rollout("
    " tbl COLLATE NOCASE, col COLLATE NOCASE, id);"
    "CREATE TABLE IF NOT EXISTS main.keyshift_rollout_log("
    " id INTEGER PRIMARY KEY AUTOINCREMENT, rollout_id INTEGER NOT NULL, time INTEGER NOT NULL,"
    " actor TEXT NOT NULL, from_phase TEXT, to_phase TEXT NOT NULL, reason TEXT NOT NULL,"
    " automatic INTEGER NOT NULL);"
    "CREATE INDEX IF NOT EXISTS main.keyshift_rollout_log_by_rollout"
    " ON keyshift_rollout_log(rollout_id, id);"
    "CREATE TRIGGER IF NOT EXISTS main.keyshift_rollout_log_no_update"
    " BEFORE UPDATE ON keyshift_rollout_log"
    " BEGIN SELECT RAISE(ABORT, 'keyshift_rollout_log is append-only'); END;"
    "CREATE TRIGGER IF NOT EXISTS main.keyshift_rollout_log_no_delete"
    " BEFORE DELETE ON keyshift_rollout_log"
    " BEGIN SELECT RAISE(ABORT, 'keyshift_rollout_log is append-only'); END;"
    "CREATE TABLE IF NOT EXISTS main.keyshift_readers("
    " instance_id TEXT PRIMARY KEY, library_version TEXT NOT NULL, max_format INTEGER NOT NULL,"
    " algorithms INTEGER NOT NULL, key_versions TEXT NOT NULL, started INTEGER NOT NULL,"
    " heartbeat INTEGER NOT NULL);"
    "CREATE TABLE IF NOT EXISTS main.keyshift_metrics("
    " id INTEGER PRIMARY KEY, rollout_id INTEGER NOT NULL, instance_id TEXT NOT NULL,"
    " source TEXT NOT NULL CHECK (source IN ('app', 'migrate')), time INTEGER NOT NULL,"
    " seals INTEGER NOT NULL, opens INTEGER NOT NULL, auth_failures INTEGER NOT NULL,"
    " parse_errors INTEGER NOT NULL, provider_calls INTEGER NOT NULL,"
    " provider_errors INTEGER NOT NULL, seal_ns BLOB NOT NULL, open_ns BLOB NOT NULL);"
    "CREATE INDEX IF NOT EXISTS main.keyshift_metrics_window ON keyshift_metrics(rollout_id, time);"
    "UPDATE main.keyshift_meta SET value = 2 WHERE key = 'schema_version';";

/* Version 3 (key-scoped rollouts; see the file comment).  The caller adds
 * keyshift_rollout.scope_key_id first when it is missing (ALTER TABLE is
 * not idempotent). */
static const char schema_sql_v3[] =
    "DROP INDEX IF EXISTS main.keyshift_rollout_open;"
    "CREATE UNIQUE INDEX IF NOT EXISTS main.keyshift_rollout_open ON keyshift_rollout("
    " scope_key_id, tbl COLLATE NOCASE, col COLLATE NOCASE) WHERE phase <> 'finalized';"
    "CREATE INDEX IF NOT EXISTS main.keyshift_rollout_by_key ON keyshift_rollout("
    " scope_key_id, id);"
    "CREATE TABLE IF NOT EXISTS main.keyshift_rollout_column("
    " rollout_id INTEGER NOT NULL REFERENCES keyshift_rollout(id),"
    " tbl TEXT NOT NULL COLLATE NOCASE, col TEXT NOT NULL COLLATE NOCASE,"
    " verified_at INTEGER NOT NULL DEFAULT 0, UNIQUE(rollout_id, tbl, col));"
    "CREATE INDEX IF NOT EXISTS main.keyshift_rollout_column_by_col"
    " ON keyshift_rollout_column(tbl, col, rollout_id);"
    "UPDATE main.keyshift_meta SET value = 3 WHERE key = 'schema_version';";

/* The columns of keyshift_rollout in the order read_rollout expects. */
#define ROLLOUT_COLS                                                                               \
    "id, tbl, col, src_plaintext, src_format, src_algorithm, src_key_id, src_key_version, "       \
    "dst_format, dst_algorithm, dst_key_id, dst_key_version, phase, phase_since, canary_kind, "   \
    "canary_percent, canary_tenants, max_auth_failure_rate, max_parse_error_rate, "               \
    "max_provider_error_rate, max_seal_p99_us, max_open_p99_us, min_samples, window_s, "          \
    "min_soak_s, reader_ttl_s, created, updated, verified_at"

/* A query of ROLLOUT_COLS then the scope's key_id (column 29) followed by
 * tail, in two spellings indexed by the store's v3: a version 2 database
 * (read-only) has no scope_key_id, and every rollout in it is
 * column-scoped. */
#define SELECT_ROLLOUT(tail)                                                                      \
    {"SELECT " ROLLOUT_COLS ", '' FROM main.keyshift_rollout " tail,                              \
     "SELECT " ROLLOUT_COLS ", scope_key_id FROM main.keyshift_rollout " tail}

/* The columns of keyshift_readers in the order read_reader expects. */
#define READER_COLS "instance_id, library_version, max_format, algorithms, key_versions, started, heartbeat"

/* Bytes of a stored histogram. */
#define HIST_BLOB_LEN (KS_HIST_BUCKETS * 8)

/* ---- statements ------------------------------------------------------------- */

/* Prepare sql (a string literal: kept statements are found by its
 * address) on db, or take the statement kept for it.  A policy asks the
 * same few questions after every change and a tool polls them, so each
 * statement is parsed once per connection instead of once per call; a
 * statement already held (a nested use) or past the cache is prepared for
 * this use only.  Release it with unprep. */
static int prep(ks_rollout_db *db, const char *sql, sqlite3_stmt **st)
{
    *st = NULL;
    kept_stmt *free_slot = NULL;
    for (size_t i = 0; i < STMT_CACHE; i++) {
        kept_stmt *k = &db->kept[i];
        if (k->sql == sql && !k->busy) {
            k->busy = 1;
            *st = k->st;
            return SQLITE_OK;
        }
        if (k->sql == NULL && free_slot == NULL)
            free_slot = k;
    }
    if (free_slot == NULL)
        return sqlite3_prepare_v2(db->db, sql, -1, st, NULL);
    int rc = sqlite3_prepare_v3(db->db, sql, -1, SQLITE_PREPARE_PERSISTENT, st, NULL);
    if (rc == SQLITE_OK && *st != NULL)
        *free_slot = (kept_stmt){sql, *st, 1};
    return rc;
}

/* Release st (from prep; NULL is fine): a kept statement is reset, with
 * its bindings cleared (they point into the caller's memory), for the
 * next use; any other is finalized. */
static void unprep(ks_rollout_db *db, sqlite3_stmt *st)
{
    if (st == NULL)
        return;
    for (size_t i = 0; i < STMT_CACHE; i++) {
        kept_stmt *k = &db->kept[i];
        if (k->st == st) {
            (void)sqlite3_reset(st);
            (void)sqlite3_clear_bindings(st);
            k->busy = 0;
            return;
        }
    }
    sqlite3_finalize(st);
}

/* Prepare sql into *st and bind parameters 1, 2, ... from the variadic
 * arguments, one per letter of types: 'i' an int64_t, 't' a const char *
 * (TEXT; NULL binds NULL), 'd' a double, 'b' a const uint8_t * then an
 * int length (BLOB).  Values are bound SQLITE_STATIC: they must outlive
 * the statement.  Returns SQLITE_OK, else the failing code (*st may then
 * be prepared: release it with unprep). */
static int prep_bind(ks_rollout_db *db, sqlite3_stmt **st, const char *sql, const char *types,
                     ...)
{
    int rc = prep(db, sql, st);
    va_list ap;
    va_start(ap, types);
    for (int i = 0; rc == SQLITE_OK && types[i] != '\0'; i++) {
        const char *t;
        const uint8_t *b;
        switch (types[i]) {
        case 'i':
            rc = sqlite3_bind_int64(*st, i + 1, va_arg(ap, int64_t));
            break;
        case 't':
            t = va_arg(ap, const char *);
            rc = t != NULL ? sqlite3_bind_text(*st, i + 1, t, -1, SQLITE_STATIC)
                           : sqlite3_bind_null(*st, i + 1);
            break;
        case 'd':
            rc = sqlite3_bind_double(*st, i + 1, va_arg(ap, double));
            break;
        case 'b':
            b = va_arg(ap, const uint8_t *);
            rc = sqlite3_bind_blob(*st, i + 1, b, va_arg(ap, int), SQLITE_STATIC);
            break;
        default:
            assert(!"unknown bind type");
            rc = SQLITE_MISUSE;
        }
    }
    va_end(ap);
    return rc;
}

/* Step a write statement to completion and release it: SQLITE_OK when
 * it completed; rc (a binding failure) is passed through. */
static int run_done(ks_rollout_db *db, sqlite3_stmt *st, int rc)
{
    if (rc == SQLITE_OK)
        rc = sqlite3_step(st);
    unprep(db, st);
    if (rc == SQLITE_DONE)
        return SQLITE_OK;
    return rc == SQLITE_OK || rc == SQLITE_ROW ? SQLITE_ERROR : rc;
}

/* Map rc, which must be a failure, to an error; a constraint failure on
 * keyshift_rollout means another open rollout of the scope. */
static ks_err rc_err(int rc)
{
    if ((rc & 0xff) == SQLITE_CONSTRAINT)
        return rc == SQLITE_CONSTRAINT_UNIQUE ? KS_ERR_ROLLOUT_EXISTS : KS_ERR_STORE;
    return ks_sqlite_map_rc(rc);
}

/* BEGIN IMMEDIATE (waiting through the busy handler), a kept statement
 * like COMMIT in txn_end. */
static ks_err txn_begin(ks_rollout_db *db)
{
    if (db->read_only || !db->have_tables)
        return KS_ERR_INVALID_ARGUMENT;
    sqlite3_stmt *st;
    int rc = prep(db, "BEGIN IMMEDIATE", &st);
    rc = run_done(db, st, rc);
    return rc == SQLITE_OK ? KS_OK : ks_sqlite_map_rc(rc);
}

/* Commit when err is KS_OK, else (or when the commit fails) roll back;
 * returns the first error. */
static ks_err txn_end(ks_rollout_db *db, ks_err err)
{
    if (err == KS_OK) {
        sqlite3_stmt *st;
        int rc = prep(db, "COMMIT", &st);
        rc = run_done(db, st, rc);
        if (rc != SQLITE_OK)
            err = ks_sqlite_map_rc(rc);
    }
    if (err != KS_OK && !sqlite3_get_autocommit(db->db))
        (void)sqlite3_exec(db->db, "ROLLBACK", NULL, NULL, NULL);
    return err;
}

/* One integer from a query with no parameters (or KS_ERR_STORE). */
static ks_err query_i64(ks_rollout_db *db, const char *sql, int64_t *out)
{
    sqlite3_stmt *st;
    int rc = prep(db, sql, &st);
    if (rc == SQLITE_OK)
        rc = sqlite3_step(st);
    if (rc == SQLITE_ROW)
        *out = sqlite3_column_int64(st, 0);
    unprep(db, st);
    if (rc == SQLITE_ROW)
        return KS_OK;
    return ks_sqlite_map_rc(rc == SQLITE_DONE ? SQLITE_ERROR : rc);
}

/* max as an SQL LIMIT. */
static int64_t limit_of(size_t max)
{
    return max > (size_t)INT64_MAX ? INT64_MAX : (int64_t)max;
}

/* ---- checking untrusted text ---------------------------------------------- */

/* Nonzero when s is at most max bytes, each printable (>= 0x20, not
 * DEL), and at least min_len bytes. */
static int printable_ok(const char *s, size_t min_len, size_t max)
{
    if (s == NULL)
        return 0;
    size_t n = strnlen(s, max + 1);
    if (n < min_len || n > max)
        return 0;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f)
            return 0;
    return 1;
}

/* Copy TEXT column i of st into out[0, max] (NUL-terminated): 0 when it
 * is not TEXT, longer than max, or holds a NUL byte. */
static int col_text(sqlite3_stmt *st, int i, char *out, size_t max)
{
    if (sqlite3_column_type(st, i) != SQLITE_TEXT)
        return 0;
    const unsigned char *p = sqlite3_column_text(st, i);
    int n = sqlite3_column_bytes(st, i);
    if (p == NULL || n < 0 || (size_t)n > max || memchr(p, 0, (size_t)n) != NULL)
        return 0;
    memcpy(out, p, (size_t)n);
    out[n] = '\0';
    return 1;
}

/* INTEGER column i of st within [lo, hi] into *out: 0 otherwise. */
static int col_int(sqlite3_stmt *st, int i, int64_t lo, int64_t hi, int64_t *out)
{
    if (sqlite3_column_type(st, i) != SQLITE_INTEGER)
        return 0;
    int64_t v = sqlite3_column_int64(st, i);
    if (v < lo || v > hi)
        return 0;
    *out = v;
    return 1;
}

/* ---- canary ------------------------------------------------------------------- */

/* The stored names of the canary kinds, indexed by kind. */
static const char *const canary_names[] = {"all", "tenants", "percent"};

/* KS_OK when c is a well-formed canary (see rollout.h). */
static ks_err canary_check(const ks_rollout_canary *c)
{
    if (c == NULL)
        return KS_ERR_INVALID_ARGUMENT;
    switch (c->kind) {
    case KS_CANARY_ALL:
        return c->n_tenants == 0 && c->percent == 0 ? KS_OK : KS_ERR_INVALID_ARGUMENT;
    case KS_CANARY_PERCENT:
        return c->n_tenants == 0 && c->percent <= 100 ? KS_OK : KS_ERR_INVALID_ARGUMENT;
    case KS_CANARY_TENANTS:
        break;
    default:
        return KS_ERR_INVALID_ARGUMENT;
    }
    if (c->n_tenants == 0 || c->n_tenants > KS_ROLLOUT_TENANTS_MAX || c->percent != 0)
        return KS_ERR_INVALID_ARGUMENT;
    for (size_t i = 0; i < c->n_tenants; i++) {
        if (!ks_rollout_charset_ok(c->tenants[i], KS_TENANT_MAX, KS_RULE_NAME))
            return KS_ERR_INVALID_ARGUMENT;
        for (size_t j = 0; j < i; j++)
            if (strcmp(c->tenants[i], c->tenants[j]) == 0)
                return KS_ERR_INVALID_ARGUMENT;
    }
    return KS_OK;
}

/* The canary's tenants joined by ',' into out (cap bytes suffice for
 * KS_ROLLOUT_TENANTS_MAX tenants). */
#define TENANTS_TEXT_MAX (KS_ROLLOUT_TENANTS_MAX * (KS_TENANT_MAX + 1))
static void canary_join(const ks_rollout_canary *c, char out[TENANTS_TEXT_MAX + 1])
{
    size_t o = 0;
    out[0] = '\0';
    for (size_t i = 0; c->kind == KS_CANARY_TENANTS && i < c->n_tenants; i++) {
        size_t n = strlen(c->tenants[i]);
        assert(o + n + 1 <= TENANTS_TEXT_MAX + 1);
        if (i > 0)
            out[o++] = ',';
        memcpy(out + o, c->tenants[i], n);
        o += n;
        out[o] = '\0';
    }
}

/* Parse stored canary columns (kind at column i, percent i + 1, tenants
 * i + 2) strictly into *c: 0 for anything malformed. */
static int read_canary(sqlite3_stmt *st, int i, ks_rollout_canary *c)
{
    char kind[16];
    char tenants[TENANTS_TEXT_MAX + 1];
    int64_t pct;
    memset(c, 0, sizeof *c);
    if (!col_text(st, i, kind, sizeof kind - 1) || !col_int(st, i + 1, 0, 100, &pct) ||
        !col_text(st, i + 2, tenants, TENANTS_TEXT_MAX))
        return 0;
    int k = -1;
    for (int j = 0; j < 3; j++)
        if (strcmp(kind, canary_names[j]) == 0)
            k = j;
    if (k < 0)
        return 0;
    c->kind = (ks_canary_kind)k;
    c->percent = (uint32_t)pct;
    for (char *p = tenants; k == KS_CANARY_TENANTS;) {
        char *comma = strchr(p, ',');
        size_t n = comma != NULL ? (size_t)(comma - p) : strlen(p);
        if (c->n_tenants == KS_ROLLOUT_TENANTS_MAX || n == 0 || n > KS_TENANT_MAX)
            return 0;
        memcpy(c->tenants[c->n_tenants], p, n);
        c->tenants[c->n_tenants][n] = '\0';
        c->n_tenants++;
        if (comma == NULL)
            break;
        p = comma + 1;
    }
    if (k != KS_CANARY_TENANTS && tenants[0] != '\0')
        return 0;
    return canary_check(c) == KS_OK;
}

/* ---- rollout rows ------------------------------------------------------------- */

/* Read the class at columns i.. of st (plaintext flag first when
 * with_flag; then format, algorithm, key_id, key_version) into *c. */
static int read_class(sqlite3_stmt *st, int i, int with_flag, ks_rollout_class *c)
{
    int64_t plain = 0, fmt, alg, kv;
    memset(c, 0, sizeof *c);
    if (with_flag && !col_int(st, i++, 0, 1, &plain))
        return 0;
    if (!col_int(st, i, 0, 255, &fmt) || !col_int(st, i + 1, 0, UINT32_MAX, &alg) ||
        !col_text(st, i + 2, c->key_id, KS_KEY_ID_MAX) ||
        !col_int(st, i + 3, 0, UINT32_MAX, &kv))
        return 0;
    c->is_plaintext = (int)plain;
    c->version = (uint8_t)fmt;
    c->algorithm = (uint32_t)alg;
    c->key_version = (uint32_t)kv;
    return ks_rollout_class_check(c, with_flag) == KS_OK;
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

/* Set r's scope from the stored scope key (empty: a column scope, which
 * names its table and column; else a key scope, which names neither and
 * whose columns load_columns reads): 0 when they disagree. */
static int scope_ok(ks_rollout *r, const char *key)
{
    if (key[0] == '\0')
        return r->table[0] != '\0' && r->column[0] != '\0';
    r->scope = KS_SCOPE_KEY;
    return r->table[0] == '\0' && r->column[0] == '\0' &&
           ks_rollout_charset_ok(key, KS_KEY_ID_MAX, KS_RULE_KEY_ID);
}

/* Read the row of ROLLOUT_COLS under st into *r, checking every field:
 * KS_ERR_STORE for a malformed row. */
static ks_err read_rollout(sqlite3_stmt *st, void *out)
{
    ks_rollout *r = out;
    char phase[32], key[KS_KEY_ID_MAX + 1];
    int64_t v[12];
    memset(r, 0, sizeof *r);
    int ok = col_int(st, 0, 1, INT64_MAX, &r->id) &&
             col_text(st, 1, r->table, KS_ROLLOUT_IDENT_MAX) &&
             col_text(st, 2, r->column, KS_ROLLOUT_IDENT_MAX) &&
             col_text(st, 29, key, KS_KEY_ID_MAX) && scope_ok(r, key) &&
             read_class(st, 3, 1, &r->source) && read_class(st, 8, 0, &r->target) &&
             col_text(st, 12, phase, sizeof phase - 1) &&
             col_int(st, 13, INT64_MIN, INT64_MAX, &r->phase_since) &&
             read_canary(st, 14, &r->canary) &&
             col_rate(st, 17, &r->thresholds.max_auth_failure_rate) &&
             col_rate(st, 18, &r->thresholds.max_parse_error_rate) &&
             col_rate(st, 19, &r->thresholds.max_provider_error_rate) &&
             col_int(st, 20, 0, INT64_MAX, &v[0]) && col_int(st, 21, 0, INT64_MAX, &v[1]) &&
             col_int(st, 22, 0, INT64_MAX, &v[2]) && col_int(st, 23, 1, UINT32_MAX, &v[3]) &&
             col_int(st, 24, 0, UINT32_MAX, &v[4]) && col_int(st, 25, 1, UINT32_MAX, &v[5]) &&
             col_int(st, 26, INT64_MIN, INT64_MAX, &r->created) &&
             col_int(st, 27, INT64_MIN, INT64_MAX, &r->updated) &&
             col_int(st, 28, 0, INT64_MAX, &r->verified_at);
    if (!ok || ks_rollout_class_equal(&r->source, &r->target))
        return KS_ERR_STORE;
    if (r->scope == KS_SCOPE_KEY &&
        (r->source.is_plaintext || strcmp(r->source.key_id, key) != 0 ||
         strcmp(r->target.key_id, key) != 0))
        return KS_ERR_STORE;
    r->phase = (ks_rollout_phase)ks_rollout_phase_from_name(phase);
    if (r->phase == 0)
        return KS_ERR_STORE;
    r->thresholds.max_seal_p99_us = (uint64_t)v[0];
    r->thresholds.max_open_p99_us = (uint64_t)v[1];
    r->thresholds.min_samples = (uint64_t)v[2];
    r->thresholds.window_s = (uint32_t)v[3];
    r->min_soak_s = (uint32_t)v[4];
    r->reader_ttl_s = (uint32_t)v[5];
    return KS_OK;
}

/* Reads one row under a statement's cursor into *out. */
typedef ks_err (*row_reader)(sqlite3_stmt *st, void *out);

/* Run st (prepared and bound when rc is SQLITE_OK) and read up to max
 * rows with read into out[0, *n) (elements of elem bytes), then release
 * st.  On failure *n is 0. */
static ks_err read_rows(ks_rollout_db *db, sqlite3_stmt *st, int rc, row_reader read, void *out,
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
    unprep(db, st);
    if (err == KS_OK && rc != SQLITE_DONE && rc != SQLITE_ROW && rc != SQLITE_OK)
        err = ks_sqlite_map_rc(rc);
    if (err != KS_OK)
        *n = 0;
    return err;
}

/* Read the listed columns of each key-scoped rollout of rs[0, n) from
 * keyshift_rollout_column, in the order they were given, checking them
 * (1..KS_ROLLOUT_COLUMNS_MAX distinct non-empty names, a verify time >= 0):
 * KS_ERR_STORE for anything else. */
static ks_err load_columns(ks_rollout_db *db, ks_rollout *rs, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        ks_rollout *r = &rs[i];
        if (r->scope != KS_SCOPE_KEY)
            continue;
        if (!db->v3)
            return KS_ERR_STORE;
        sqlite3_stmt *st;
        int rc = prep_bind(db, &st,
                           "SELECT tbl, col, verified_at FROM main.keyshift_rollout_column "
                           "WHERE rollout_id = ?1 ORDER BY rowid LIMIT ?2",
                           "ii", r->id, (int64_t)KS_ROLLOUT_COLUMNS_MAX + 1);
        ks_err err = KS_OK;
        r->n_columns = 0;
        while (err == KS_OK && (rc == SQLITE_OK || rc == SQLITE_ROW) &&
               (rc = sqlite3_step(st)) == SQLITE_ROW) {
            ks_rollout_column *c = &r->columns[r->n_columns];
            if (r->n_columns == KS_ROLLOUT_COLUMNS_MAX ||
                !col_text(st, 0, c->table, KS_ROLLOUT_IDENT_MAX) || c->table[0] == '\0' ||
                !col_text(st, 1, c->column, KS_ROLLOUT_IDENT_MAX) || c->column[0] == '\0' ||
                !col_int(st, 2, 0, INT64_MAX, &c->verified_at) ||
                ks_rollout_scope_covers(r, c->table, c->column))
                err = KS_ERR_STORE;
            else
                r->n_columns++;
        }
        unprep(db, st);
        if (err == KS_OK && rc != SQLITE_DONE)
            err = ks_sqlite_map_rc(rc);
        if (err == KS_OK && r->n_columns == 0)
            err = KS_ERR_STORE;
        if (err != KS_OK)
            return err;
    }
    return KS_OK;
}

/* The first rollout row of st (prepared with result rc by prep_bind)
 * into *out, with its listed columns: KS_ERR_NO_ROLLOUT if none. */
static ks_err read_one(ks_rollout_db *db, sqlite3_stmt *st, int rc, ks_rollout *out)
{
    size_t n = 0;
    ks_err err = read_rows(db, st, rc, read_rollout, out, sizeof *out, 1, &n);
    if (err == KS_OK && n == 0)
        err = KS_ERR_NO_ROLLOUT;
    if (err == KS_OK)
        err = load_columns(db, out, 1);
    return err;
}

/* The rollout with this id into *out (KS_ERR_NO_ROLLOUT if none). */
static ks_err load_rollout(ks_rollout_db *db, int64_t id, ks_rollout *out)
{
    if (!db->have_tables)
        return KS_ERR_NO_ROLLOUT;
    static const char *const q[2] = SELECT_ROLLOUT("WHERE id = ?1");
    sqlite3_stmt *st;
    int rc = prep_bind(db, &st, q[db->v3], "i", id);
    return read_one(db, st, rc, out);
}

/* ---- the log ------------------------------------------------------------------ */

/* Append a log row (inside the caller's transaction).  from 0: NULL. */
static ks_err log_append(ks_rollout_db *db, int64_t rollout_id, int64_t now, const char *actor,
                         int from, int to, const char *reason, int automatic)
{
    sqlite3_stmt *st;
    int rc = prep_bind(db, &st,
                       "INSERT INTO main.keyshift_rollout_log(rollout_id, time, actor, from_phase, "
                       "to_phase, reason, automatic) VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                       "iitttti", rollout_id, now, actor,
                       from == 0 ? NULL : ks_rollout_phase_name(from), ks_rollout_phase_name(to),
                       reason != NULL ? reason : "", (int64_t)(automatic != 0));
    rc = run_done(db, st, rc);
    return rc == SQLITE_OK ? KS_OK : rc_err(rc);
}

/* Nonzero when actor and reason may be logged. */
static int log_args_ok(const char *actor, const char *reason)
{
    return printable_ok(actor, 1, KS_ROLLOUT_ACTOR_MAX) &&
           (reason == NULL || printable_ok(reason, 0, KS_ROLLOUT_REASON_MAX));
}

/* Read a log row into *e (KS_ERR_STORE when malformed). */
static ks_err read_log(sqlite3_stmt *st, void *out)
{
    ks_rollout_log_entry *e = out;
    char from[32] = "", to[32];
    int64_t automatic;
    memset(e, 0, sizeof *e);
    int ok = col_int(st, 0, 1, INT64_MAX, &e->id) && col_int(st, 1, 1, INT64_MAX, &e->rollout_id) &&
             col_int(st, 2, INT64_MIN, INT64_MAX, &e->time) &&
             col_text(st, 3, e->actor, KS_ROLLOUT_ACTOR_MAX) &&
             (sqlite3_column_type(st, 4) == SQLITE_NULL ||
              col_text(st, 4, from, sizeof from - 1)) &&
             col_text(st, 5, to, sizeof to - 1) &&
             col_text(st, 6, e->reason, KS_ROLLOUT_REASON_MAX) &&
             col_int(st, 7, 0, 1, &automatic) && log_args_ok(e->actor, e->reason);
    if (!ok)
        return KS_ERR_STORE;
    e->from = from[0] != '\0' ? ks_rollout_phase_from_name(from) : 0;
    e->to = ks_rollout_phase_from_name(to);
    e->automatic = (int)automatic;
    return (from[0] != '\0' && e->from == 0) || e->to == 0 ? KS_ERR_STORE : KS_OK;
}

/* ---- opening ------------------------------------------------------------------ */

/* The schema version (0 without keyshift_meta), the number of version
 * 2 tables present, and whether version 3's table and column are. */
static ks_err read_schema_state(ks_rollout_db *db, int64_t *version, int64_t *n_v2,
                                int64_t *has_v3)
{
    int64_t has_meta = 0;
    *version = 0;
    ks_err err = query_i64(db,
                           "SELECT count(*) FROM main.sqlite_master WHERE type = 'table' "
                           "AND name = 'keyshift_meta'",
                           &has_meta);
    if (err == KS_OK && has_meta)
        err = query_i64(db,
                        "SELECT coalesce(max(value), 0) FROM main.keyshift_meta "
                        "WHERE key = 'schema_version'",
                        version);
    if (err == KS_OK)
        err = query_i64(db,
                        "SELECT count(*) FROM main.sqlite_master WHERE type = 'table' AND name IN "
                        "('keyshift_rollout', 'keyshift_rollout_log', 'keyshift_readers', "
                        "'keyshift_metrics')",
                        n_v2);
    if (err == KS_OK)
        err = query_i64(db,
                        "SELECT (SELECT count(*) FROM main.sqlite_master WHERE type = 'table' "
                        "AND name = 'keyshift_rollout_column') + (SELECT count(*) FROM "
                        "pragma_table_info('keyshift_rollout', 'main') WHERE name = "
                        "'scope_key_id') = 2",
                        has_v3);
    return err;
}

/* Inside the upgrade's transaction: add version 3 to a version 2 schema
 * (scope_key_id only when it is missing, then schema_sql_v3). */
static int upgrade_v3(ks_rollout_db *db)
{
    int64_t has_col = 0;
    if (query_i64(db,
                  "SELECT count(*) FROM pragma_table_info('keyshift_rollout', 'main') "
                  "WHERE name = 'scope_key_id'",
                  &has_col) != KS_OK)
        return SQLITE_ERROR;
    int rc = SQLITE_OK;
    if (!has_col)
        rc = sqlite3_exec(db->db,
                          "ALTER TABLE main.keyshift_rollout ADD COLUMN scope_key_id TEXT "
                          "NOT NULL DEFAULT ''",
                          NULL, NULL, NULL);
    if (rc == SQLITE_OK)
        rc = sqlite3_exec(db->db, schema_sql_v3, NULL, NULL, NULL);
    return rc;
}

/* Refuse a schema newer than this library. */
static ks_err check_not_newer(int64_t version, char *errbuf, size_t errbuf_len)
{
    if (version > KS_SQLITE_SCHEMA_LATEST)
        return ks_sqlite_fail(errbuf, errbuf_len, KS_ERR_STORE,
                              "keyshift tables are of schema version %lld, newer than this "
                              "keyshift (%d)",
                              (long long)version, KS_SQLITE_SCHEMA_LATEST);
    return KS_OK;
}

/* Create or upgrade keyshift's tables to version 3 in one BEGIN IMMEDIATE
 * transaction (see the file comment), re-reading the version inside it:
 * version 2's step when below it, then version 3's. */
static ks_err upgrade(ks_rollout_db *db, char *errbuf, size_t errbuf_len)
{
    int64_t version = 0, n_v2 = 0, has_v3 = 0;
    int rc = sqlite3_exec(db->db, "BEGIN IMMEDIATE", NULL, NULL, NULL);
    if (rc == SQLITE_OK)
        rc = sqlite3_exec(db->db, ks_sqlite_schema_sql, NULL, NULL, NULL);
    ks_err err = rc == SQLITE_OK ? read_schema_state(db, &version, &n_v2, &has_v3)
                                 : ks_sqlite_fail_rc(errbuf, errbuf_len, rc,
                                                     "creating the keyshift tables");
    if (err == KS_OK)
        err = check_not_newer(version, errbuf, errbuf_len);
    if (err == KS_OK && (version < 2 || n_v2 < 4)) {
        rc = sqlite3_exec(db->db, schema_sql_v2, NULL, NULL, NULL);
        if (rc != SQLITE_OK)
            err = ks_sqlite_fail_rc(errbuf, errbuf_len, rc, "upgrading the keyshift tables");
    }
    if (err == KS_OK && (version < 3 || !has_v3)) {
        rc = upgrade_v3(db);
        if (rc != SQLITE_OK)
            err = ks_sqlite_fail_rc(errbuf, errbuf_len, rc, "upgrading the keyshift tables");
    }
    err = txn_end(db, err);
    if (err != KS_OK && errbuf != NULL && errbuf_len > 0 && errbuf[0] == '\0')
        ks_sqlite_fail(errbuf, errbuf_len, err, "upgrading the keyshift tables: %s",
                       ks_err_name(err));
    return err;
}

/* See rollout.h. */
ks_err ks_rollout_db_open(const char *path, unsigned flags, ks_rollout_db **out, char *errbuf,
                          size_t errbuf_len)
{
    if (errbuf != NULL && errbuf_len > 0)
        errbuf[0] = '\0';
    if (out == NULL)
        return KS_ERR_INVALID_ARGUMENT;
    *out = NULL;
    if (path == NULL || (flags & ~KS_ROLLOUT_DB_READ_ONLY) != 0)
        return ks_sqlite_fail(errbuf, errbuf_len, KS_ERR_INVALID_ARGUMENT,
                              "missing path or unknown flags");
    ks_rollout_db *db = calloc(1, sizeof *db);
    if (db == NULL)
        return KS_ERR_NO_MEMORY;
    db->read_only = (flags & KS_ROLLOUT_DB_READ_ONLY) != 0;
    ks_sqlite_busy_init(&db->busy, 0);
    int64_t version = 0, n_v2 = 0, has_v3 = 0;
    ks_err err = ks_sqlite_connect(path, db->read_only, 0, &db->busy, &db->db, errbuf, errbuf_len);
    if (err == KS_OK) {
        err = read_schema_state(db, &version, &n_v2, &has_v3);
        if (err != KS_OK)
            err = ks_sqlite_fail(errbuf, errbuf_len, err, "reading the schema: %s",
                                 ks_err_name(err));
    }
    if (err == KS_OK)
        err = check_not_newer(version, errbuf, errbuf_len);
    if (err == KS_OK && !db->read_only &&
        (version < KS_SQLITE_SCHEMA_LATEST || n_v2 < 4 || !has_v3))
        err = upgrade(db, errbuf, errbuf_len);
    else if (err == KS_OK && db->read_only) {
        /* a version 2 database is read as it is: its rollouts are all
         * column-scoped, and ignoring them would let `migrate` run unguarded */
        db->have_tables = version >= 2 && n_v2 == 4;
        db->v3 = db->have_tables && version == 3 && has_v3;
    }
    if (err == KS_OK && !db->read_only)
        db->have_tables = db->v3 = 1;
    if (err != KS_OK) {
        ks_rollout_db_close(db);
        return err;
    }
    *out = db;
    return KS_OK;
}

/* See rollout.h. */
void ks_rollout_db_close(ks_rollout_db *db)
{
    if (db == NULL)
        return;
    if (db->db != NULL) {
        if (!sqlite3_get_autocommit(db->db))
            (void)sqlite3_exec(db->db, "ROLLBACK", NULL, NULL, NULL);
        for (size_t i = 0; i < STMT_CACHE; i++)
            sqlite3_finalize(db->kept[i].st);
        int rc = sqlite3_close_v2(db->db);
        assert(rc == SQLITE_OK);
        (void)rc;
    }
    free(db);
}

/* See rollout_internal.h. */
ks_err ks_rollout_db_snapshot(ks_rollout_db *db, int begin)
{
    assert(db != NULL);
    int rc = sqlite3_exec(db->db, begin ? "BEGIN" : "COMMIT", NULL, NULL, NULL);
    if (rc != SQLITE_OK && !begin && !sqlite3_get_autocommit(db->db))
        (void)sqlite3_exec(db->db, "ROLLBACK", NULL, NULL, NULL);
    return rc == SQLITE_OK ? KS_OK : ks_sqlite_map_rc(rc);
}

/* See rollout_internal.h. */
ks_err ks_rollout_db_data_version(ks_rollout_db *db, int64_t *out)
{
    assert(db != NULL && out != NULL);
    return query_i64(db, "PRAGMA main.data_version", out);
}

/* ---- start ------------------------------------------------------------------- */

/* What is wrong with key-scoped spec s (NULL when nothing): a source
 * with a key_id, a target keeping it, no table or column of its own, and
 * 1..KS_ROLLOUT_COLUMNS_MAX well-formed column names (checked against the
 * schema later). */
static const char *key_spec_problem(const ks_rollout *s)
{
    if (s->table[0] != '\0' || s->column[0] != '\0')
        return "a key-scoped rollout names its columns in its list, not as its table and column";
    if (s->source.is_plaintext)
        return "a key-scoped rollout needs an envelope source: plaintext has no key_id";
    if (strncmp(s->source.key_id, s->target.key_id, sizeof s->source.key_id) != 0)
        return "a key-scoped rollout keeps its key_id: the target must be under the source's "
               "key_id (a move to another key_id is a rollout per column)";
    if (s->n_columns == 0 || s->n_columns > KS_ROLLOUT_COLUMNS_MAX)
        return "a key-scoped rollout lists 1 to 16 columns";
    for (size_t i = 0; i < s->n_columns; i++)
        if (strnlen(s->columns[i].table, KS_ROLLOUT_IDENT_MAX + 1) - 1 >= KS_ROLLOUT_IDENT_MAX ||
            strnlen(s->columns[i].column, KS_ROLLOUT_IDENT_MAX + 1) - 1 >= KS_ROLLOUT_IDENT_MAX)
            return "a listed table or column name is empty or too long";
    return NULL;
}

/* Check a rollout spec (see ks_rollout_db_start). */
static ks_err spec_check(const ks_rollout *s, char *errbuf, size_t errbuf_len)
{
    const ks_thresholds *t = &s->thresholds;
    const char *what = NULL;
    if (s->scope != KS_SCOPE_COLUMN && s->scope != KS_SCOPE_KEY)
        what = "the scope is neither a column nor a key";
    else if (s->scope == KS_SCOPE_COLUMN &&
             (strnlen(s->table, KS_ROLLOUT_IDENT_MAX + 1) - 1 >= KS_ROLLOUT_IDENT_MAX ||
              strnlen(s->column, KS_ROLLOUT_IDENT_MAX + 1) - 1 >= KS_ROLLOUT_IDENT_MAX ||
              s->n_columns != 0))
        what = "the table or column name is empty or too long";
    else if (ks_rollout_class_check(&s->source, 1) != KS_OK)
        what = "the source class is not valid";
    else if (ks_rollout_class_check(&s->target, 0) != KS_OK)
        what = "the target must be a valid envelope class";
    else if (ks_rollout_class_equal(&s->source, &s->target))
        what = "the source and the target are the same class";
    else if (canary_check(&s->canary) != KS_OK)
        what = "the canary is not valid";
    else if (isnan(t->max_auth_failure_rate) || isnan(t->max_parse_error_rate) ||
             isnan(t->max_provider_error_rate) || t->max_seal_p99_us > INT64_MAX ||
             t->max_open_p99_us > INT64_MAX || t->min_samples > INT64_MAX || t->window_s == 0)
        what = "the thresholds are not valid";
    else if (s->reader_ttl_s == 0)
        what = "the reader TTL must be at least 1 s";
    else if (s->scope == KS_SCOPE_KEY)
        what = key_spec_problem(s);
    if (what != NULL)
        return ks_sqlite_fail(errbuf, errbuf_len, KS_ERR_INVALID_ARGUMENT, "%s", what);
    return KS_OK;
}

/* Find table.column in the schema (names bound, compared as SQLite
 * compares identifiers) and copy their spellings into tbl and col.  The
 * same rules as the row store: not a keyshift_* or sqlite_* table, a
 * real table, and not a primary-key, generated or hidden column. */
static ks_err find_scope(ks_rollout_db *db, const char *table, const char *column,
                         char tbl[KS_ROLLOUT_IDENT_MAX + 1], char col[KS_ROLLOUT_IDENT_MAX + 1],
                         char *errbuf, size_t errbuf_len)
{
    char pt[96], pc[96];
    ks_sqlite_printable(table, pt, sizeof pt);
    ks_sqlite_printable(column, pc, sizeof pc);
    if (sqlite3_strnicmp(table, "sqlite_", 7) == 0 || sqlite3_strnicmp(table, "keyshift_", 9) == 0)
        return ks_sqlite_fail(errbuf, errbuf_len, KS_ERR_INVALID_ARGUMENT,
                              "table \"%s\" is reserved (sqlite_*, keyshift_*)", pt);
    sqlite3_stmt *st;
    int rc = prep_bind(db, &st,
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
    } else if (!col_text(st, 0, tbl, KS_ROLLOUT_IDENT_MAX) ||
               !col_text(st, 1, col, KS_ROLLOUT_IDENT_MAX)) {
        err = ks_sqlite_fail(errbuf, errbuf_len, KS_ERR_INVALID_ARGUMENT,
                             "table or column name of \"%s\".\"%s\" is too long", pt, pc);
    }
    unprep(db, st);
    return err;
}

/* The open (not finalized) rollout that overlaps a new rollout on
 * tbl.col, or of key_id when key_id is not NULL: the column-scoped one of
 * the column or (with key_scopes) a key-scoped one covering it, or the
 * key-scoped one of key_id.  Its id (0 when none), phase and scope text
 * go to *id, phase and what. */
static ks_err find_open(ks_rollout_db *db, const char *tbl, const char *col, const char *key_id,
                        int key_scopes, int64_t *id, char phase[32], char what[SCOPE_TEXT_MAX])
{
    sqlite3_stmt *st;
    *id = 0;
    int rc = key_id != NULL
                 ? prep_bind(db, &st,
                             "SELECT id, phase FROM main.keyshift_rollout WHERE scope_key_id = ?1 "
                             "AND phase <> 'finalized' ORDER BY id LIMIT 1",
                             "t", key_id)
                 : prep_bind(db, &st,
                             "SELECT id, phase FROM main.keyshift_rollout AS r WHERE "
                             "phase <> 'finalized' AND ((scope_key_id = '' AND "
                             "tbl = ?1 COLLATE NOCASE AND col = ?2 COLLATE NOCASE) OR (?3 AND "
                             "EXISTS (SELECT 1 FROM main.keyshift_rollout_column AS c WHERE "
                             "c.rollout_id = r.id AND c.tbl = ?1 AND c.col = ?2))) "
                             "ORDER BY id LIMIT 1",
                             "tti", tbl, col, (int64_t)(key_scopes != 0));
    if (rc == SQLITE_OK)
        rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        *id = sqlite3_column_int64(st, 0);
        if (!col_text(st, 1, phase, 31))
            snprintf(phase, 32, "?");
    }
    unprep(db, st);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE)
        return ks_sqlite_map_rc(rc);
    ks_rollout other;
    ks_err err = *id != 0 ? load_rollout(db, *id, &other) : KS_OK;
    if (err == KS_OK && *id != 0)
        ks_rollout_scope_text(&other, what, SCOPE_TEXT_MAX);
    return err;
}

/* Refuse (KS_ERR_ROLLOUT_EXISTS, naming it) a new rollout of scope s that
 * overlaps an open one: for a column scope, one of its column or a key
 * scope covering it; for a key scope, one of the same key_id or a column
 * scope of one of its columns.  A key scope overlaps a column scope on a
 * shared column whatever their classes, because a column-scoped rollout
 * judges every value of its column, which would leave the key-scoped
 * one's envelopes under two rules.  Key scopes of different key_ids
 * judge disjoint envelopes and may share columns. */
static ks_err refuse_overlap(ks_rollout_db *db, const ks_rollout *s, char *errbuf,
                             size_t errbuf_len)
{
    char phase[32], what[SCOPE_TEXT_MAX], mine[SCOPE_TEXT_MAX];
    int64_t open_id = 0;
    ks_err err = KS_OK;
    if (s->scope == KS_SCOPE_KEY)
        err = find_open(db, NULL, NULL, s->source.key_id, 0, &open_id, phase, what);
    else
        err = find_open(db, s->table, s->column, NULL, 1, &open_id, phase, what);
    for (size_t i = 0; err == KS_OK && open_id == 0 && i < s->n_columns; i++)
        err = find_open(db, s->columns[i].table, s->columns[i].column, NULL, 0, &open_id, phase,
                        what);
    if (err == KS_OK && open_id != 0)
        err = ks_sqlite_fail(errbuf, errbuf_len, KS_ERR_ROLLOUT_EXISTS,
                             "rollout %lld of %s is in %s and overlaps %s: finalize it first",
                             (long long)open_id, what, phase,
                             ks_rollout_scope_text(s, mine, sizeof mine));
    return err;
}

/* Insert the rollout s (its scope in the schema's spellings: sc) in
 * planned at now, with the columns of a key scope. */
static ks_err insert_rollout(ks_rollout_db *db, const ks_rollout *s, const ks_rollout *sc,
                             int64_t now, int64_t *id)
{
    char tenants[TENANTS_TEXT_MAX + 1];
    canary_join(&s->canary, tenants);
    const ks_thresholds *t = &s->thresholds;
    const ks_rollout_class *a = &s->source, *b = &s->target;
    sqlite3_stmt *st;
    int rc = prep_bind(
        db, &st,
        "INSERT INTO main.keyshift_rollout(tbl, col, src_plaintext, src_format, "
        "src_algorithm, src_key_id, src_key_version, dst_format, dst_algorithm, "
        "dst_key_id, dst_key_version, phase, phase_since, canary_kind, canary_percent, "
        "canary_tenants, max_auth_failure_rate, max_parse_error_rate, "
        "max_provider_error_rate, max_seal_p99_us, max_open_p99_us, min_samples, "
        "window_s, min_soak_s, reader_ttl_s, created, updated, verified_at, scope_key_id) "
        "VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, 'planned', ?12, ?13, ?14, "
        "?15, ?16, ?17, ?18, ?19, ?20, ?21, ?22, ?23, ?24, ?12, ?12, 0, ?25)",
        "ttiiitiiiti" "itit" "ddd" "iiiiii" "t", sc->table, sc->column,
        (int64_t)(a->is_plaintext != 0),
        (int64_t)a->version, (int64_t)a->algorithm, a->key_id, (int64_t)a->key_version,
        (int64_t)b->version, (int64_t)b->algorithm, b->key_id, (int64_t)b->key_version, now,
        canary_names[s->canary.kind], (int64_t)s->canary.percent, tenants,
        t->max_auth_failure_rate, t->max_parse_error_rate, t->max_provider_error_rate,
        (int64_t)t->max_seal_p99_us, (int64_t)t->max_open_p99_us, (int64_t)t->min_samples,
        (int64_t)t->window_s, (int64_t)s->min_soak_s, (int64_t)s->reader_ttl_s,
        sc->scope == KS_SCOPE_KEY ? a->key_id : "");
    rc = run_done(db, st, rc);
    if (rc != SQLITE_OK)
        return rc_err(rc);
    *id = sqlite3_last_insert_rowid(db->db);
    for (size_t i = 0; rc == SQLITE_OK && i < sc->n_columns; i++) {
        rc = prep_bind(db, &st,
                       "INSERT INTO main.keyshift_rollout_column(rollout_id, tbl, col) "
                       "VALUES(?1, ?2, ?3)",
                       "itt", *id, sc->columns[i].table, sc->columns[i].column);
        rc = run_done(db, st, rc);
    }
    return rc == SQLITE_OK ? KS_OK : rc_err(rc);
}

/* See rollout.h. */
ks_err ks_rollout_db_start(ks_rollout_db *db, const ks_rollout *spec, const char *actor,
                           int64_t now, int64_t *id, char *errbuf, size_t errbuf_len)
{
    if (errbuf != NULL && errbuf_len > 0)
        errbuf[0] = '\0';
    if (db == NULL || spec == NULL || id == NULL || !log_args_ok(actor, NULL))
        return ks_sqlite_fail(errbuf, errbuf_len, KS_ERR_INVALID_ARGUMENT,
                              "missing store, spec or actor");
    *id = 0;
    ks_err err = spec_check(spec, errbuf, errbuf_len);
    if (err == KS_OK)
        err = txn_begin(db);
    if (err != KS_OK)
        return err;
    ks_rollout scope; /* the scope in the schema's spellings */
    memset(&scope, 0, sizeof scope);
    scope.scope = spec->scope;
    scope.source = spec->source;
    scope.n_columns = spec->n_columns;
    if (spec->scope == KS_SCOPE_COLUMN)
        err = find_scope(db, spec->table, spec->column, scope.table, scope.column, errbuf,
                         errbuf_len);
    for (size_t i = 0; err == KS_OK && i < spec->n_columns; i++) {
        ks_rollout_column *c = &scope.columns[i];
        err = find_scope(db, spec->columns[i].table, spec->columns[i].column, c->table,
                         c->column, errbuf, errbuf_len);
        scope.n_columns = i;
        if (err == KS_OK && ks_rollout_scope_covers(&scope, c->table, c->column))
            err = ks_sqlite_fail(errbuf, errbuf_len, KS_ERR_INVALID_ARGUMENT,
                                 "column %s.%s is listed twice", c->table, c->column);
        scope.n_columns = spec->n_columns;
    }
    if (err == KS_OK)
        err = refuse_overlap(db, &scope, errbuf, errbuf_len);
    if (err == KS_OK)
        err = insert_rollout(db, spec, &scope, now, id);
    if (err == KS_OK) {
        char reason[3 * (KS_KEY_ID_MAX + 48) + 48], sc[KS_KEY_ID_MAX + 48], tc[KS_KEY_ID_MAX + 48];
        if (spec->scope == KS_SCOPE_KEY)
            snprintf(reason, sizeof reason, "start: key %s, %zu columns: %s -> %s",
                     spec->source.key_id, spec->n_columns,
                     ks_rollout_class_text(&spec->source, sc, sizeof sc),
                     ks_rollout_class_text(&spec->target, tc, sizeof tc));
        else
            snprintf(reason, sizeof reason, "start: %s -> %s",
                     ks_rollout_class_text(&spec->source, sc, sizeof sc),
                     ks_rollout_class_text(&spec->target, tc, sizeof tc));
        err = log_append(db, *id, now, actor, 0, KS_PHASE_PLANNED, reason, 0);
    }
    err = txn_end(db, err);
    if (err != KS_OK)
        *id = 0;
    return err;
}

/* ---- reading rollouts ----------------------------------------------------------- */

/* See rollout.h. */
ks_err ks_rollout_db_get(ks_rollout_db *db, int64_t id, ks_rollout *out)
{
    if (db == NULL || out == NULL)
        return KS_ERR_INVALID_ARGUMENT;
    return load_rollout(db, id, out);
}

/* See rollout.h. */
ks_err ks_rollout_db_latest(ks_rollout_db *db, const char *table, const char *column,
                            ks_rollout *out)
{
    if (db == NULL || table == NULL || column == NULL || out == NULL || table[0] == '\0' ||
        column[0] == '\0')
        return KS_ERR_INVALID_ARGUMENT;
    if (!db->have_tables)
        return KS_ERR_NO_ROLLOUT;
    static const char *const q[2] = SELECT_ROLLOUT(
        "WHERE tbl = ?1 COLLATE NOCASE AND col = ?2 COLLATE NOCASE ORDER BY id DESC LIMIT 1");
    sqlite3_stmt *st;
    int rc = prep_bind(db, &st, q[db->v3], "tt", table, column);
    return read_one(db, st, rc, out); /* a column scope: no listed columns to load */
}

/* See rollout.h. */
ks_err ks_rollout_db_latest_key(ks_rollout_db *db, const char *key_id, ks_rollout *out)
{
    if (db == NULL || out == NULL || !ks_rollout_charset_ok(key_id, KS_KEY_ID_MAX, KS_RULE_KEY_ID))
        return KS_ERR_INVALID_ARGUMENT;
    if (!db->v3)
        return KS_ERR_NO_ROLLOUT;
    static const char *const q[2] =
        SELECT_ROLLOUT("WHERE scope_key_id = ?1 ORDER BY id DESC LIMIT 1");
    sqlite3_stmt *st;
    int rc = prep_bind(db, &st, q[1], "t", key_id);
    return read_one(db, st, rc, out);
}

/* See rollout.h. */
ks_err ks_rollout_db_list(ks_rollout_db *db, int64_t after_id, ks_rollout *out, size_t max,
                          size_t *n)
{
    if (db == NULL || n == NULL || (out == NULL && max > 0))
        return KS_ERR_INVALID_ARGUMENT;
    *n = 0;
    if (!db->have_tables || max == 0)
        return KS_OK;
    static const char *const q[2] = SELECT_ROLLOUT("WHERE id > ?1 ORDER BY id LIMIT ?2");
    sqlite3_stmt *st;
    int rc = prep_bind(db, &st, q[db->v3], "ii", after_id, limit_of(max));
    ks_err err = read_rows(db, st, rc, read_rollout, out, sizeof *out, max, n);
    if (err == KS_OK)
        err = load_columns(db, out, *n);
    if (err != KS_OK)
        *n = 0;
    return err;
}

/* ---- readers ------------------------------------------------------------------- */

/* Nonzero when r may be registered: a [F-NAME-1] instance id, a printable
 * version string, a format 1..255 and a canonical key list. */
static int reader_ok(const ks_rollout_reader *r)
{
    return ks_rollout_charset_ok(r->instance_id, KS_INSTANCE_ID_MAX, KS_RULE_NAME) &&
           printable_ok(r->library_version, 0, KS_LIBRARY_VERSION_MAX) &&
           r->max_format >= 1 && ks_rollout_keys_check(r->keys) == KS_OK;
}

/* Read a READER_COLS row into *r, strictly (KS_ERR_STORE when malformed:
 * the key list in particular must be canonical). */
static ks_err read_reader(sqlite3_stmt *st, ks_rollout_reader *r)
{
    int64_t fmt, algs;
    memset(r, 0, sizeof *r);
    int ok = col_text(st, 0, r->instance_id, KS_INSTANCE_ID_MAX) &&
             col_text(st, 1, r->library_version, KS_LIBRARY_VERSION_MAX) &&
             col_int(st, 2, 1, 255, &fmt) && col_int(st, 3, 0, UINT32_MAX, &algs) &&
             col_text(st, 4, r->keys, KS_READER_KEYS_MAX) &&
             col_int(st, 5, INT64_MIN, INT64_MAX, &r->started) &&
             col_int(st, 6, INT64_MIN, INT64_MAX, &r->heartbeat);
    if (!ok)
        return KS_ERR_STORE;
    r->max_format = (uint8_t)fmt;
    r->algorithms = (uint32_t)algs;
    return reader_ok(r) ? KS_OK : KS_ERR_STORE;
}

/* now - ttl_s without overflow. */
static int64_t live_since(int64_t now, uint32_t ttl_s)
{
    return now < INT64_MIN + (int64_t)ttl_s ? INT64_MIN : now - (int64_t)ttl_s;
}

/* The live readers into out[0, *n) (max of them), *total their number. */
static ks_err load_readers(ks_rollout_db *db, uint32_t ttl_s, int64_t now, ks_rollout_reader *out,
                           size_t max, size_t *n, size_t *total)
{
    *n = 0;
    *total = 0;
    if (!db->have_tables)
        return KS_OK;
    sqlite3_stmt *st;
    int rc = prep_bind(db, &st,
                       "SELECT " READER_COLS " FROM main.keyshift_readers WHERE heartbeat >= ?1 "
                       "ORDER BY instance_id",
                       "i", live_since(now, ttl_s));
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
    unprep(db, st);
    if (err == KS_OK && rc != SQLITE_DONE)
        err = ks_sqlite_map_rc(rc);
    return err;
}

/* See rollout.h. */
ks_err ks_rollout_db_readers_live(ks_rollout_db *db, uint32_t ttl_s, int64_t now,
                                  ks_rollout_reader *out, size_t max, size_t *n)
{
    if (db == NULL || n == NULL || (out == NULL && max > 0))
        return KS_ERR_INVALID_ARGUMENT;
    size_t total = 0;
    ks_err err = load_readers(db, ttl_s, now, out, max, n, &total);
    if (err == KS_OK && total > max) {
        *n = total;
        return KS_ERR_BUFFER_TOO_SMALL;
    }
    if (err != KS_OK)
        *n = 0;
    return err;
}

/* See rollout.h. */
ks_err ks_rollout_db_reader_register(ks_rollout_db *db, const ks_rollout_reader *r, int64_t now)
{
    if (db == NULL || r == NULL || !reader_ok(r) || db->read_only || !db->have_tables)
        return KS_ERR_INVALID_ARGUMENT;
    sqlite3_stmt *st;
    int rc = prep_bind(db, &st,
                       "INSERT OR REPLACE INTO main.keyshift_readers(" READER_COLS
                       ") VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?6)",
                       "ttiiti", r->instance_id, r->library_version, (int64_t)r->max_format,
                       (int64_t)r->algorithms, r->keys, now);
    rc = run_done(db, st, rc);
    return rc == SQLITE_OK ? KS_OK : rc_err(rc);
}

/* Run a one-statement write on instance_id (?1) and now (?2 when types
 * is "ti", "t" without); *changed gets the rows changed. */
static ks_err reader_write(ks_rollout_db *db, const char *sql, const char *types,
                           const char *instance_id, int64_t now, int *changed)
{
    if (db == NULL || db->read_only || !db->have_tables ||
        !ks_rollout_charset_ok(instance_id, KS_INSTANCE_ID_MAX, KS_RULE_NAME))
        return KS_ERR_INVALID_ARGUMENT;
    sqlite3_stmt *st;
    int rc = prep_bind(db, &st, sql, types, instance_id, now);
    rc = run_done(db, st, rc);
    *changed = sqlite3_changes(db->db);
    return rc == SQLITE_OK ? KS_OK : rc_err(rc);
}

/* See rollout.h. */
ks_err ks_rollout_db_reader_heartbeat(ks_rollout_db *db, const char *instance_id, int64_t now)
{
    int changed = 0;
    ks_err err = reader_write(db,
                              "UPDATE main.keyshift_readers SET heartbeat = ?2 "
                              "WHERE instance_id = ?1",
                              "ti", instance_id, now, &changed);
    return err == KS_OK && changed == 0 ? KS_ERR_NOT_FOUND : err;
}

/* See rollout.h. */
ks_err ks_rollout_db_reader_deregister(ks_rollout_db *db, const char *instance_id)
{
    int changed = 0;
    return reader_write(db, "DELETE FROM main.keyshift_readers WHERE instance_id = ?1", "t",
                        instance_id, 0, &changed);
}

/* ---- transitions ---------------------------------------------------------------- */

/* Whether no later rollout touches r's scope (*latest; see
 * ks_rollout_facts.is_latest): a later rollout of the same column or
 * key_id, a later key-scoped rollout covering r's column, or a later
 * column-scoped rollout of one of r's columns. */
static ks_err is_latest(ks_rollout_db *db, const ks_rollout *r, int *latest)
{
    sqlite3_stmt *st;
    int rc;
    if (r->scope == KS_SCOPE_KEY)
        rc = prep_bind(db, &st,
                       "SELECT count(*) FROM main.keyshift_rollout AS o WHERE o.id > ?1 AND "
                       "(o.scope_key_id = ?2 OR (o.scope_key_id = '' AND EXISTS (SELECT 1 FROM "
                       "main.keyshift_rollout_column AS c WHERE c.rollout_id = ?1 AND "
                       "c.tbl = o.tbl AND c.col = o.col)))",
                       "it", r->id, r->source.key_id);
    else
        rc = prep_bind(db, &st,
                       "SELECT (SELECT count(*) FROM main.keyshift_rollout WHERE id > ?1 AND "
                       "scope_key_id = '' AND tbl = ?2 COLLATE NOCASE AND col = ?3 COLLATE "
                       "NOCASE) + (SELECT count(*) FROM main.keyshift_rollout_column WHERE "
                       "rollout_id > ?1 AND tbl = ?2 AND col = ?3)",
                       "itt", r->id, r->table, r->column);
    if (rc == SQLITE_OK)
        rc = sqlite3_step(st);
    *latest = rc == SQLITE_ROW && sqlite3_column_int64(st, 0) == 0;
    unprep(db, st);
    return rc == SQLITE_ROW ? KS_OK : ks_sqlite_map_rc(rc == SQLITE_DONE ? SQLITE_ERROR : rc);
}

/* Inside the transaction: fill f's rollout-side facts (rollout, live
 * readers in *readers, which the caller frees, is_latest). */
static ks_err gather(ks_rollout_db *db, int64_t id, ks_rollout_facts *f,
                     ks_rollout_reader **readers)
{
    size_t n = 0, total = 0;
    *readers = NULL;
    ks_err err = load_rollout(db, id, &f->rollout);
    if (err == KS_OK)
        err = is_latest(db, &f->rollout, &f->is_latest);
    if (err == KS_OK)
        err = load_readers(db, f->rollout.reader_ttl_s, f->now, NULL, 0, &n, &total);
    if (err == KS_OK && total > 0) {
        *readers = calloc(total, sizeof **readers);
        if (*readers == NULL)
            return KS_ERR_NO_MEMORY;
        err = load_readers(db, f->rollout.reader_ttl_s, f->now, *readers, total, &n, &total);
    }
    f->readers = *readers;
    f->n_readers = n;
    return err;
}

/* Write r's new phase `to` at now (verified_at, and every column's of a
 * key scope, reset on entering backfill), only if it is still in `from`. */
static ks_err write_phase(ks_rollout_db *db, int64_t id, int from, int to, int64_t now)
{
    sqlite3_stmt *st;
    int rc = prep_bind(db, &st,
                       "UPDATE main.keyshift_rollout SET phase = ?1, phase_since = ?2, "
                       "updated = ?2, verified_at = CASE WHEN ?1 = 'backfill' THEN 0 "
                       "ELSE verified_at END WHERE id = ?3 AND phase = ?4",
                       "tiit", ks_rollout_phase_name(to), now, id, ks_rollout_phase_name(from));
    rc = run_done(db, st, rc);
    if (rc != SQLITE_OK)
        return rc_err(rc);
    if (sqlite3_changes(db->db) != 1)
        return KS_ERR_STORE;
    if (to != KS_PHASE_BACKFILL)
        return KS_OK;
    rc = prep_bind(db, &st,
                   "UPDATE main.keyshift_rollout_column SET verified_at = 0 WHERE rollout_id = ?1",
                   "i", id);
    rc = run_done(db, st, rc);
    return rc == SQLITE_OK ? KS_OK : rc_err(rc);
}

/* See rollout.h. */
ks_err ks_rollout_db_transition(ks_rollout_db *db, const ks_rollout_change *c,
                                const ks_rollout_facts *facts, char *why, size_t why_len)
{
    if (why != NULL && why_len > 0)
        why[0] = '\0';
    if (db == NULL || c == NULL || facts == NULL || !log_args_ok(c->actor, c->reason) ||
        ks_rollout_phase_name((int)c->from) == NULL || ks_rollout_phase_name((int)c->to) == NULL)
        return KS_ERR_INVALID_ARGUMENT;
    ks_rollout_facts f = *facts;
    ks_rollout_reader *readers = NULL;
    ks_err err = txn_begin(db);
    if (err != KS_OK)
        return err;
    err = gather(db, c->id, &f, &readers);
    if (err == KS_OK && f.rollout.phase != c->from)
        err = ks_sqlite_fail(why, why_len, KS_ERR_STALE,
                             "rollout %lld is in %s, not %s: it was moved by someone else",
                             (long long)c->id, ks_rollout_phase_name((int)f.rollout.phase),
                             ks_rollout_phase_name((int)c->from));
    if (err == KS_OK)
        err = ks_rollout_guard(&f, c->to, why, why_len);
    if (err == KS_OK)
        err = write_phase(db, c->id, (int)c->from, (int)c->to, f.now);
    if (err == KS_OK)
        err = log_append(db, c->id, f.now, c->actor, (int)c->from, (int)c->to, c->reason,
                         c->automatic);
    err = txn_end(db, err);
    free(readers);
    return err;
}

/* Inside a transaction: load rollout id and check its phase is allowed
 * (bit (1 << phase) of allowed), else KS_ERR_STATE. */
static ks_err load_in_phase(ks_rollout_db *db, int64_t id, unsigned allowed, ks_rollout *r)
{
    ks_err err = load_rollout(db, id, r);
    if (err == KS_OK && (allowed & (1u << r->phase)) == 0)
        err = KS_ERR_STATE;
    return err;
}

/* See rollout.h. */
ks_err ks_rollout_db_set_canary(ks_rollout_db *db, int64_t id, const ks_rollout_canary *canary,
                                const char *actor, int64_t now)
{
    if (db == NULL || canary_check(canary) != KS_OK || !log_args_ok(actor, NULL))
        return KS_ERR_INVALID_ARGUMENT;
    ks_rollout r;
    char tenants[TENANTS_TEXT_MAX + 1], reason[TENANTS_TEXT_MAX + 32];
    canary_join(canary, tenants);
    ks_err err = txn_begin(db);
    if (err != KS_OK)
        return err;
    err = load_in_phase(db, id, ~(1u << KS_PHASE_FINALIZED), &r);
    if (err == KS_OK) {
        sqlite3_stmt *st;
        int rc = prep_bind(db, &st,
                           "UPDATE main.keyshift_rollout SET canary_kind = ?1, "
                           "canary_percent = ?2, canary_tenants = ?3, updated = ?4 WHERE id = ?5",
                           "titii", canary_names[canary->kind], (int64_t)canary->percent, tenants,
                           now, id);
        rc = run_done(db, st, rc);
        err = rc == SQLITE_OK ? KS_OK : rc_err(rc);
    }
    if (err == KS_OK) {
        if (canary->kind == KS_CANARY_PERCENT)
            snprintf(reason, sizeof reason, "canary: %u%%", (unsigned)canary->percent);
        else
            snprintf(reason, sizeof reason, "canary: %s",
                     canary->kind == KS_CANARY_ALL ? "all" : tenants);
        err = log_append(db, id, now, actor, (int)r.phase, (int)r.phase, reason, 0);
    }
    return txn_end(db, err);
}

/* Record a verify pass of rollout id in one transaction: of its whole
 * scope (table NULL; a column scope only), or of table.column, which its
 * scope must cover.  Only in backfill; logged. */
static ks_err record_verify(ks_rollout_db *db, int64_t id, const char *table, const char *column,
                            const char *actor, int64_t now)
{
    if (db == NULL || !log_args_ok(actor, NULL) || (table != NULL && column == NULL))
        return KS_ERR_INVALID_ARGUMENT;
    ks_rollout r;
    char reason[2 * KS_ROLLOUT_IDENT_MAX + 64];
    ks_err err = txn_begin(db);
    if (err != KS_OK)
        return err;
    err = load_in_phase(db, id, 1u << KS_PHASE_BACKFILL, &r);
    if (err == KS_OK && table == NULL && r.scope == KS_SCOPE_KEY)
        err = KS_ERR_INVALID_ARGUMENT; /* a key scope is verified column by column */
    if (err == KS_OK && table != NULL && !ks_rollout_scope_covers(&r, table, column))
        err = KS_ERR_NOT_FOUND;
    if (err == KS_OK) {
        sqlite3_stmt *st;
        int rc = r.scope == KS_SCOPE_KEY
                     ? prep_bind(db, &st,
                                 "UPDATE main.keyshift_rollout_column SET verified_at = ?1 "
                                 "WHERE rollout_id = ?2 AND tbl = ?3 AND col = ?4",
                                 "iitt", now, id, table, column)
                     : prep_bind(db, &st,
                                 "UPDATE main.keyshift_rollout SET verified_at = ?1, "
                                 "updated = ?1 WHERE id = ?2",
                                 "ii", now, id);
        rc = run_done(db, st, rc);
        err = rc == SQLITE_OK ? KS_OK : rc_err(rc);
        if (err == KS_OK && sqlite3_changes(db->db) != 1)
            err = KS_ERR_STORE;
    }
    for (size_t i = 0; err == KS_OK && i < r.n_columns; i++) /* the schema's spelling */
        if (sqlite3_stricmp(r.columns[i].table, table) == 0 &&
            sqlite3_stricmp(r.columns[i].column, column) == 0)
            snprintf(reason, sizeof reason, "migrate verify passed for %s.%s",
                     r.columns[i].table, r.columns[i].column);
    if (err == KS_OK && r.scope == KS_SCOPE_COLUMN)
        snprintf(reason, sizeof reason, "migrate verify passed");
    if (err == KS_OK)
        err = log_append(db, id, now, actor, KS_PHASE_BACKFILL, KS_PHASE_BACKFILL, reason, 0);
    return txn_end(db, err);
}

/* See rollout.h. */
ks_err ks_rollout_db_record_verify(ks_rollout_db *db, int64_t id, const char *actor, int64_t now)
{
    return record_verify(db, id, NULL, NULL, actor, now);
}

/* See rollout.h. */
ks_err ks_rollout_db_record_verify_column(ks_rollout_db *db, int64_t id, const char *table,
                                          const char *column, const char *actor, int64_t now)
{
    if (table == NULL || column == NULL)
        return KS_ERR_INVALID_ARGUMENT;
    return record_verify(db, id, table, column, actor, now);
}

/* See rollout.h. */
ks_err ks_rollout_db_note(ks_rollout_db *db, int64_t id, const char *actor, const char *reason,
                          int64_t now)
{
    if (db == NULL || reason == NULL || !printable_ok(reason, 1, KS_ROLLOUT_REASON_MAX) ||
        !log_args_ok(actor, reason))
        return KS_ERR_INVALID_ARGUMENT;
    ks_rollout r;
    ks_err err = txn_begin(db);
    if (err != KS_OK)
        return err;
    err = load_rollout(db, id, &r);
    if (err == KS_OK)
        err = log_append(db, id, now, actor, (int)r.phase, (int)r.phase, reason, 0);
    return txn_end(db, err);
}

/* See rollout.h. */
ks_err ks_rollout_db_log(ks_rollout_db *db, int64_t rollout_id, int64_t after_id,
                         ks_rollout_log_entry *out, size_t max, size_t *n)
{
    if (db == NULL || n == NULL || (out == NULL && max > 0))
        return KS_ERR_INVALID_ARGUMENT;
    *n = 0;
    if (!db->have_tables || max == 0)
        return KS_OK;
    sqlite3_stmt *st;
    int rc = prep_bind(db, &st,
                       "SELECT id, rollout_id, time, actor, from_phase, to_phase, reason, "
                       "automatic FROM main.keyshift_rollout_log WHERE (?1 = 0 OR rollout_id = ?1) "
                       "AND id > ?2 ORDER BY id LIMIT ?3",
                       "iii", rollout_id, after_id, limit_of(max));
    return read_rows(db, st, rc, read_log, out, sizeof *out, max, n);
}

/* ---- metrics --------------------------------------------------------------------- */

/* Encode h as KS_HIST_BUCKETS little-endian uint64 into out. */
static void hist_encode(const ks_histogram *h, uint8_t out[HIST_BLOB_LEN])
{
    for (size_t i = 0; i < KS_HIST_BUCKETS; i++)
        for (size_t j = 0; j < 8; j++)
            out[i * 8 + j] = (uint8_t)(h->bucket[i] >> (8 * j));
}

/* Decode the histogram BLOB at column i of st into h: 0 unless it is a
 * BLOB of exactly HIST_BLOB_LEN bytes. */
static int hist_decode(sqlite3_stmt *st, int i, ks_histogram *h)
{
    if (sqlite3_column_type(st, i) != SQLITE_BLOB)
        return 0;
    const uint8_t *p = sqlite3_column_blob(st, i);
    if (p == NULL || sqlite3_column_bytes(st, i) != HIST_BLOB_LEN)
        return 0;
    for (size_t b = 0; b < KS_HIST_BUCKETS; b++) {
        uint64_t v = 0;
        for (size_t j = 0; j < 8; j++)
            v |= (uint64_t)p[b * 8 + j] << (8 * j);
        h->bucket[b] = v;
    }
    return 1;
}

/* See rollout.h. */
ks_err ks_rollout_db_metrics_insert(ks_rollout_db *db, int64_t rollout_id,
                                    const char *instance_id, const char *source,
                                    const ks_health_sample *s)
{
    if (db == NULL || s == NULL || db->read_only || !db->have_tables || rollout_id <= 0 ||
        !ks_rollout_charset_ok(instance_id, KS_INSTANCE_ID_MAX, KS_RULE_NAME) || source == NULL ||
        (strcmp(source, "app") != 0 && strcmp(source, "migrate") != 0))
        return KS_ERR_INVALID_ARGUMENT;
    const uint64_t counts[] = {s->seals,         s->opens,          s->auth_failures,
                               s->parse_errors,  s->provider_calls, s->provider_errors};
    for (size_t i = 0; i < 6; i++)
        if (counts[i] > INT64_MAX)
            return KS_ERR_INVALID_ARGUMENT;
    uint8_t seal[HIST_BLOB_LEN], open[HIST_BLOB_LEN];
    hist_encode(&s->seal_ns, seal);
    hist_encode(&s->open_ns, open);
    sqlite3_stmt *st;
    int rc = prep_bind(db, &st,
                       "INSERT INTO main.keyshift_metrics(rollout_id, instance_id, source, time, "
                       "seals, opens, auth_failures, parse_errors, provider_calls, "
                       "provider_errors, seal_ns, open_ns) "
                       "VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
                       "ittiiiiiiibb", rollout_id, instance_id, source, s->time,
                       (int64_t)counts[0], (int64_t)counts[1], (int64_t)counts[2],
                       (int64_t)counts[3], (int64_t)counts[4], (int64_t)counts[5], seal,
                       (int)HIST_BLOB_LEN, open, (int)HIST_BLOB_LEN);
    rc = run_done(db, st, rc);
    return rc == SQLITE_OK ? KS_OK : rc_err(rc);
}

/* Add the metrics row under st into acc (ks_health_add: saturating):
 * KS_ERR_STORE when a counter is not a non-negative INTEGER or a
 * histogram is not an exact-length BLOB. */
static ks_err add_sample(sqlite3_stmt *st, ks_health_sample *acc)
{
    int64_t v[6];
    ks_health_sample row;
    memset(&row, 0, sizeof row);
    for (int i = 0; i < 6; i++)
        if (!col_int(st, 1 + i, 0, INT64_MAX, &v[i]))
            return KS_ERR_STORE;
    if (!col_int(st, 0, INT64_MIN, INT64_MAX, &row.time) || !hist_decode(st, 7, &row.seal_ns) ||
        !hist_decode(st, 8, &row.open_ns))
        return KS_ERR_STORE;
    row.seals = (uint64_t)v[0];
    row.opens = (uint64_t)v[1];
    row.auth_failures = (uint64_t)v[2];
    row.parse_errors = (uint64_t)v[3];
    row.provider_calls = (uint64_t)v[4];
    row.provider_errors = (uint64_t)v[5];
    ks_health_add(acc, &row);
    return KS_OK;
}

/* See rollout.h. */
ks_err ks_rollout_db_metrics_sum(ks_rollout_db *db, int64_t rollout_id, int64_t since,
                                 ks_health_sample *out)
{
    if (db == NULL || out == NULL)
        return KS_ERR_INVALID_ARGUMENT;
    memset(out, 0, sizeof *out);
    if (!db->have_tables)
        return KS_OK;
    sqlite3_stmt *st;
    int rc = prep_bind(db, &st,
                       "SELECT time, seals, opens, auth_failures, parse_errors, provider_calls, "
                       "provider_errors, seal_ns, open_ns FROM main.keyshift_metrics "
                       "WHERE rollout_id = ?1 AND time >= ?2",
                       "ii", rollout_id, since);
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
    unprep(db, st);
    if (err == KS_OK && rc != SQLITE_DONE)
        err = ks_sqlite_map_rc(rc);
    if (err != KS_OK)
        memset(out, 0, sizeof *out);
    return err;
}
