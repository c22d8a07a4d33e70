/*
 * migrate/store/sqlite/rollout_sqlite.c -- the SQLite rollout store
 * (keyshift/rollout_store.h): rollouts, their log, the reader registry and
 * health samples, in the application's SQLite database.  This file opens,
 * creates or upgrades the tables, keeps the prepared statements and runs
 * the transactions; rollout_sqlite_rows.c reads and writes the rows.  The
 * guards and every check of meaning (classes, canaries, scopes) are the
 * rollout layer's (migrate/rollout/rollout_db.c).
 *
 * ---- Tables (schema version 4 of keyshift_meta) --------------------------
 *
 * Version 1 (migrate/store/sqlite/sqlite_store.c) has keyshift_meta,
 * keyshift_migration and keyshift_quarantine.  Version 2 adds the four
 * tables below and changes none of version 1's; version 3 adds key scopes
 * (keyshift_rollout.scope_key_id, keyshift_rollout_column, the open-rollout
 * index on (scope_key_id, tbl, col)); version 4 adds
 * keyshift_rollout.encoding.  keyshift_metrics.seal_ns_sum and open_ns_sum
 * (the samples' latency sums) are added to version 4 in place, without a
 * new version: a library without them inserts samples by column name and
 * reads them by column name, so it keeps working on a database that has
 * them (its samples then have sums of 0), where a new version would make
 * every older instance refuse the database.  The upgrade runs, when a
 * writer opens a database below version 4 or without the sums, in one
 * BEGIN IMMEDIATE transaction: version 1's SQL
 * (idempotent: CREATE IF NOT EXISTS, INSERT OR IGNORE), a re-read of the
 * version inside the transaction (a newer one is refused), schema_sql_v2
 * below when below 2, then the ALTER TABLE adding scope_key_id when it is
 * missing and schema_sql_v3, which sets schema_version = 3, then the
 * ALTER TABLE adding encoding (every rollout before it is of binary
 * encoding) when it is missing and schema_sql_v4, which sets
 * schema_version = 4, then the ALTER TABLEs adding the two sums (0 in
 * every sample stored before them) when missing.  Exact SQL:
 * schema_sql_v2, schema_sql_v3, upgrade_v4, add_sums.  A read-only open
 * reads a version 2, 3 or 4 database, with or without the sums, as it
 * is.  In short:
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
 *                         ''), encoding (v4: 'binary' or 'base64', how the
 *                         scope's columns hold envelopes).  A partial UNIQUE index on (scope_key_id,
 *                         tbl, col) WHERE phase <> 'finalized' backs the
 *                         "one open rollout per scope" rule; overlaps of
 *                         key and column scopes are refused by
 *                         the rollout layer inside start's transaction.
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
 *                         time, the counters of a ks_health_sample, the
 *                         two histograms as BLOBs of exactly
 *                         KS_HIST_BUCKETS little-endian uint64, and
 *                         seal_ns_sum, open_ns_sum: the latency sums
 *                         (columns added in place: see above).
 *
 * ---- Behaviour -----------------------------------------------------------
 *
 * Connections are opened and configured by ks_sqlite_connect (never
 * creating the file, defensive mode, untrusted schema, busy handler with
 * backoff).  Identifiers given by callers (table, column) are only ever
 * bound as parameters and compared with the schema; no name is pasted
 * into SQL.  The begin op is BEGIN IMMEDIATE: the rollout layer runs every
 * change of a rollout (re-read, check, write the change and its log row)
 * between it and the commit op, and any failure rolls back.  Rows read
 * back are untrusted: each column is decoded strictly (types, ranges,
 * lengths, names of phases and canary kinds, blob lengths) and a bad row
 * is KS_ERR_STORE; the rollout layer then checks what they mean (classes,
 * canaries, charsets, canonical key lists).  Messages never quote
 * SQLite's error text.
 */
#define _POSIX_C_SOURCE 200809L

#include <assert.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include <sqlite3.h>

#include <keyshift/rollout_store.h>

#include "sqlite_store.h"
#include "sqlite_util.h"
#include "rollout_sqlite.h"
#include "../../alloc_hook.h"


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

/* Version 4 (the rollout's encoding), after the caller added
 * keyshift_rollout.encoding when it was missing. */
static const char schema_sql_v4[] =
    "UPDATE main.keyshift_meta SET value = 4 WHERE key = 'schema_version';";



/* ---- statements ------------------------------------------------------------- */

/* Prepare sql (a string literal: kept statements are found by its
 * address) on db, or take the statement kept for it.  A policy asks the
 * same few questions after every change and a tool polls them, so each
 * statement is parsed once per connection instead of once per call; a
 * statement already held (a nested use) or past the cache is prepared for
 * this use only.  Slots fill in order of first use and are never emptied
 * before close, so the search stops at the filled ones (a store runs a
 * few dozen distinct statements; the first ones used are the commonest).
 * Release it with unprep. */
int ks_rsql_prep(ks_rsql *db, const char *sql, sqlite3_stmt **st)
{
    *st = NULL;
    assert(db->n_kept <= KS_RSQL_STMT_CACHE);
    for (size_t i = 0; i < db->n_kept; i++) {
        ks_rsql_kept *k = &db->kept[i];
        if (k->sql == sql && !k->busy) {
            k->busy = 1;
            *st = k->st;
            return SQLITE_OK;
        }
    }
    if (db->n_kept == KS_RSQL_STMT_CACHE)
        return sqlite3_prepare_v2(db->db, sql, -1, st, NULL);
    int rc = sqlite3_prepare_v3(db->db, sql, -1, SQLITE_PREPARE_PERSISTENT, st, NULL);
    if (rc == SQLITE_OK && *st != NULL)
        db->kept[db->n_kept++] = (ks_rsql_kept){sql, *st, 1};
    return rc;
}

/* Release st (from prep; NULL is fine): a kept statement is reset, with
 * its bindings cleared (they point into the caller's memory), for the
 * next use; any other is finalized. */
void ks_rsql_unprep(ks_rsql *db, sqlite3_stmt *st)
{
    if (st == NULL)
        return;
    for (size_t i = 0; i < db->n_kept; i++) {
        ks_rsql_kept *k = &db->kept[i];
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
int ks_rsql_prep_bind(ks_rsql *db, sqlite3_stmt **st, const char *sql, const char *types,
                     ...)
{
    int rc = ks_rsql_prep(db, sql, st);
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
int ks_rsql_run_done(ks_rsql *db, sqlite3_stmt *st, int rc)
{
    if (rc == SQLITE_OK)
        rc = sqlite3_step(st);
    ks_rsql_unprep(db, st);
    if (rc == SQLITE_DONE)
        return SQLITE_OK;
    return rc == SQLITE_OK || rc == SQLITE_ROW ? SQLITE_ERROR : rc;
}

/* Map rc, which must be a failure, to an error; a constraint failure on
 * keyshift_rollout means another open rollout of the scope. */
ks_err ks_rsql_rc_err(int rc)
{
    if ((rc & 0xff) == SQLITE_CONSTRAINT)
        return rc == SQLITE_CONSTRAINT_UNIQUE ? KS_ERR_ROLLOUT_EXISTS : KS_ERR_STORE;
    return ks_sqlite_map_rc(rc);
}

/* See rollout_sqlite.h. */
int ks_rsql_writable(const ks_rsql *db)
{
    return !db->read_only && db->have_tables;
}

/* See rollout_sqlite.h: the store is the first member of a ks_rsql, and
 * every store handed out by this file is one. */
ks_rsql *ks_rsql_of(ks_rollout_store *s)
{
    assert(s != NULL);
    return (ks_rsql *)(void *)s;
}

/* The begin op: BEGIN IMMEDIATE (waiting through the busy handler), a
 * kept statement like COMMIT. */
static ks_err op_begin(ks_rollout_store *s)
{
    ks_rsql *db = ks_rsql_of(s);
    if (!ks_rsql_writable(db))
        return KS_ERR_INVALID_ARGUMENT;
    sqlite3_stmt *st;
    int rc = ks_rsql_prep(db, "BEGIN IMMEDIATE", &st);
    rc = ks_rsql_run_done(db, st, rc);
    return rc == SQLITE_OK ? KS_OK : ks_sqlite_map_rc(rc);
}

/* The rollback op: roll back whatever transaction is open, through a
 * kept statement (a refused transition rolls back: sqlite3_exec would
 * parse the text again each time). */
static void op_rollback(ks_rollout_store *s)
{
    static const char rollback[] = "ROLLBACK";
    ks_rsql *db = ks_rsql_of(s);
    if (sqlite3_get_autocommit(db->db))
        return;
    sqlite3_stmt *st;
    int rc = ks_rsql_prep(db, rollback, &st);
    (void)ks_rsql_run_done(db, st, rc);
}

/* The commit op: COMMIT, rolling back when it fails (a busy COMMIT
 * leaves the transaction open). */
static ks_err op_commit(ks_rollout_store *s)
{
    ks_rsql *db = ks_rsql_of(s);
    sqlite3_stmt *st;
    int rc = ks_rsql_prep(db, "COMMIT", &st);
    rc = ks_rsql_run_done(db, st, rc);
    if (rc == SQLITE_OK)
        return KS_OK;
    op_rollback(s);
    return ks_sqlite_map_rc(rc);
}

/* One integer from a query with no parameters (or KS_ERR_STORE). */
static ks_err query_i64(ks_rsql *db, const char *sql, int64_t *out)
{
    sqlite3_stmt *st;
    int rc = ks_rsql_prep(db, sql, &st);
    if (rc == SQLITE_OK)
        rc = sqlite3_step(st);
    if (rc == SQLITE_ROW)
        *out = sqlite3_column_int64(st, 0);
    ks_rsql_unprep(db, st);
    if (rc == SQLITE_ROW)
        return KS_OK;
    return ks_sqlite_map_rc(rc == SQLITE_DONE ? SQLITE_ERROR : rc);
}


/* ---- strict column readers ------------------------------------------------ */

int ks_rsql_col_text(sqlite3_stmt *st, int i, char *out, size_t max)
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
int ks_rsql_col_int(sqlite3_stmt *st, int i, int64_t lo, int64_t hi, int64_t *out)
{
    if (sqlite3_column_type(st, i) != SQLITE_INTEGER)
        return 0;
    int64_t v = sqlite3_column_int64(st, i);
    if (v < lo || v > hi)
        return 0;
    *out = v;
    return 1;
}

/* ---- opening ------------------------------------------------------------------ */

/* The schema version (0 without keyshift_meta), the number of version
 * 2 tables present, whether version 3's table and column are, whether
 * version 4's column is, and how many of the two latency sum columns
 * are. */
static ks_err read_schema_state(ks_rsql *db, int64_t *version, int64_t *n_v2,
                                int64_t *has_v3, int64_t *has_v4, int64_t *n_sums)
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
    if (err == KS_OK)
        err = query_i64(db,
                        "SELECT count(*) FROM pragma_table_info('keyshift_rollout', 'main') "
                        "WHERE name = 'encoding'",
                        has_v4);
    if (err == KS_OK)
        err = query_i64(db,
                        "SELECT count(*) FROM pragma_table_info('keyshift_metrics', 'main') "
                        "WHERE name IN ('seal_ns_sum', 'open_ns_sum')",
                        n_sums);
    return err;
}

/* Inside the upgrade's transaction: run alter (an ALTER TABLE ... ADD
 * COLUMN) unless has (the count of that column in pragma_table_info)
 * finds the column already there; both are string literals. */
static int add_column(ks_rsql *db, const char *has, const char *alter)
{
    int64_t n = 0;
    if (query_i64(db, has, &n) != KS_OK)
        return SQLITE_ERROR;
    return n ? SQLITE_OK : sqlite3_exec(db->db, alter, NULL, NULL, NULL);
}

/* Inside the upgrade's transaction: add version 3 to a version 2 schema
 * (scope_key_id only when it is missing, then schema_sql_v3). */
static int upgrade_v3(ks_rsql *db)
{
    int rc = add_column(db,
                        "SELECT count(*) FROM pragma_table_info('keyshift_rollout', 'main') "
                        "WHERE name = 'scope_key_id'",
                        "ALTER TABLE main.keyshift_rollout ADD COLUMN scope_key_id TEXT "
                        "NOT NULL DEFAULT ''");
    if (rc == SQLITE_OK)
        rc = sqlite3_exec(db->db, schema_sql_v3, NULL, NULL, NULL);
    return rc;
}

/* Inside the upgrade's transaction: add version 4 to a version 3 schema
 * (the encoding column only when it is missing, then schema_sql_v4). */
static int upgrade_v4(ks_rsql *db)
{
    int rc = add_column(db,
                        "SELECT count(*) FROM pragma_table_info('keyshift_rollout', 'main') "
                        "WHERE name = 'encoding'",
                        "ALTER TABLE main.keyshift_rollout ADD COLUMN encoding TEXT "
                        "NOT NULL DEFAULT 'binary'");
    if (rc == SQLITE_OK)
        rc = sqlite3_exec(db->db, schema_sql_v4, NULL, NULL, NULL);
    return rc;
}

/* Inside the upgrade's transaction: add each latency sum column to
 * keyshift_metrics when it is missing (the schema version stays 4: see
 * the top of this file).  A sample stored before has no sum: 0. */
static int add_sums(ks_rsql *db)
{
    int rc = add_column(db,
                        "SELECT count(*) FROM pragma_table_info('keyshift_metrics', 'main') "
                        "WHERE name = 'seal_ns_sum'",
                        "ALTER TABLE main.keyshift_metrics ADD COLUMN seal_ns_sum INTEGER "
                        "NOT NULL DEFAULT 0");
    if (rc == SQLITE_OK)
        rc = add_column(db,
                        "SELECT count(*) FROM pragma_table_info('keyshift_metrics', 'main') "
                        "WHERE name = 'open_ns_sum'",
                        "ALTER TABLE main.keyshift_metrics ADD COLUMN open_ns_sum INTEGER "
                        "NOT NULL DEFAULT 0");
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

/* Create or upgrade keyshift's tables to version 4 with the latency sums
 * in one BEGIN IMMEDIATE transaction (see the file comment), re-reading
 * the version inside it: version 2's step when below it, then version
 * 3's and 4's, then the sums. */
static ks_err upgrade(ks_rsql *db, char *errbuf, size_t errbuf_len)
{
    int64_t version = 0, n_v2 = 0, has_v3 = 0, has_v4 = 0, n_sums = 0;
    int rc = sqlite3_exec(db->db, "BEGIN IMMEDIATE", NULL, NULL, NULL);
    if (rc == SQLITE_OK)
        rc = sqlite3_exec(db->db, ks_sqlite_schema_sql, NULL, NULL, NULL);
    ks_err err = rc == SQLITE_OK ? read_schema_state(db, &version, &n_v2, &has_v3, &has_v4, &n_sums)
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
    if (err == KS_OK && (version < 4 || !has_v4)) {
        rc = upgrade_v4(db);
        if (rc != SQLITE_OK)
            err = ks_sqlite_fail_rc(errbuf, errbuf_len, rc, "upgrading the keyshift tables");
    }
    if (err == KS_OK && n_sums < 2) {
        rc = add_sums(db);
        if (rc != SQLITE_OK)
            err = ks_sqlite_fail_rc(errbuf, errbuf_len, rc, "upgrading the keyshift tables");
    }
    if (err == KS_OK)
        err = op_commit(&db->base);
    else
        op_rollback(&db->base);
    if (err != KS_OK && errbuf != NULL && errbuf_len > 0 && errbuf[0] == '\0')
        ks_sqlite_fail(errbuf, errbuf_len, err, "upgrading the keyshift tables: %s",
                       ks_err_name(err));
    return err;
}

/* The close op: roll back what is open, finalize the kept statements,
 * close the connection. */
static void op_close(ks_rollout_store *s)
{
    if (s == NULL)
        return;
    ks_rsql *db = ks_rsql_of(s);
    if (db->db != NULL) {
        op_rollback(s);
        for (size_t i = 0; i < db->n_kept; i++)
            sqlite3_finalize(db->kept[i].st);
        int rc = sqlite3_close_v2(db->db);
        assert(rc == SQLITE_OK);
        (void)rc;
    }
    free(db);
}

/* The snapshot op: a deferred read transaction (BEGIN), or its end,
 * through kept statements: a policy takes a snapshot on every reload, and
 * sqlite3_exec parsed the text each time. */
static ks_err op_snapshot(ks_rollout_store *s, int begin)
{
    static const char begin_sql[] = "BEGIN", commit_sql[] = "COMMIT";
    ks_rsql *db = ks_rsql_of(s);
    sqlite3_stmt *st;
    int rc = ks_rsql_prep(db, begin ? begin_sql : commit_sql, &st);
    rc = ks_rsql_run_done(db, st, rc);
    if (rc != SQLITE_OK && !begin)
        op_rollback(s);
    return rc == SQLITE_OK ? KS_OK : ks_sqlite_map_rc(rc);
}

/* The data_version op: PRAGMA data_version, which changes when another
 * connection commits to the database (a cheap poll for the policy). */
static ks_err op_data_version(ks_rollout_store *s, int64_t *out)
{
    assert(out != NULL);
    return query_i64(ks_rsql_of(s), "PRAGMA main.data_version", out);
}

/* The operations of the SQLite rollout store. */
static const ks_rollout_store_ops sqlite_ops = {
    .close = op_close,
    .begin = op_begin,
    .commit = op_commit,
    .rollback = op_rollback,
    .snapshot = op_snapshot,
    .data_version = op_data_version,
    .find_column = ks_rsql_find_column,
    .find_open = ks_rsql_find_open,
    .insert = ks_rsql_insert,
    .get = ks_rsql_get,
    .latest = ks_rsql_latest,
    .latest_key = ks_rsql_latest_key,
    .list = ks_rsql_list,
    .later_count = ks_rsql_later_count,
    .set_phase = ks_rsql_set_phase,
    .set_canary = ks_rsql_set_canary,
    .set_settings = ks_rsql_set_settings,
    .remove = ks_rsql_remove,
    .set_verified = ks_rsql_set_verified,
    .log_append = ks_rsql_log_append,
    .log_list = ks_rsql_log_list,
    .readers_live = ks_rsql_readers_live,
    .reader_put = ks_rsql_reader_put,
    .reader_heartbeat = ks_rsql_reader_heartbeat,
    .reader_delete = ks_rsql_reader_delete,
    .metrics_insert = ks_rsql_metrics_insert,
    .metrics_sum = ks_rsql_metrics_sum,
};

/* See rollout_store.h. */
ks_err ks_rollout_store_sqlite_open(const char *path, unsigned flags, ks_rollout_store **out,
                                    char *errbuf, size_t errbuf_len)
{
    if (errbuf != NULL && errbuf_len > 0)
        errbuf[0] = '\0';
    if (out == NULL)
        return KS_ERR_INVALID_ARGUMENT;
    *out = NULL;
    if (path == NULL || (flags & ~KS_ROLLOUT_DB_READ_ONLY) != 0)
        return ks_sqlite_fail(errbuf, errbuf_len, KS_ERR_INVALID_ARGUMENT,
                              "missing path or unknown flags");
    ks_rsql *db = calloc(1, sizeof *db);
    if (db == NULL)
        return KS_ERR_NO_MEMORY;
    db->base.ops = &sqlite_ops;
    db->read_only = (flags & KS_ROLLOUT_DB_READ_ONLY) != 0;
    ks_sqlite_busy_init(&db->busy, 0);
    int64_t version = 0, n_v2 = 0, has_v3 = 0, has_v4 = 0, n_sums = 0;
    ks_err err = ks_sqlite_connect(path, db->read_only, 0, &db->busy, &db->db, errbuf, errbuf_len);
    if (err == KS_OK) {
        err = read_schema_state(db, &version, &n_v2, &has_v3, &has_v4, &n_sums);
        if (err != KS_OK)
            err = ks_sqlite_fail(errbuf, errbuf_len, err, "reading the schema: %s",
                                 ks_err_name(err));
    }
    if (err == KS_OK)
        err = check_not_newer(version, errbuf, errbuf_len);
    if (err == KS_OK && !db->read_only &&
        (version < KS_SQLITE_SCHEMA_LATEST || n_v2 < 4 || !has_v3 || !has_v4 || n_sums < 2))
        err = upgrade(db, errbuf, errbuf_len);
    else if (err == KS_OK && db->read_only) {
        /* a version 2 database is read as it is: its rollouts are all
         * column-scoped, and ignoring them would let `migrate` run unguarded */
        db->have_tables = version >= 2 && n_v2 == 4;
        db->v3 = db->have_tables && version >= 3 && has_v3;
        db->v4 = db->v3 && version >= 4 && has_v4;
        db->sums = db->v4 && n_sums == 2;
    }
    if (err == KS_OK && !db->read_only)
        db->have_tables = db->v3 = db->v4 = db->sums = 1;
    if (err != KS_OK) {
        op_close(&db->base);
        return err;
    }
    *out = &db->base;
    return KS_OK;
}
