/*
 * migrate/store/pg/rollout_pg.c -- the PostgreSQL rollout store
 * (keyshift/rollout_store_pg.h): rollouts, their log, the reader registry
 * and health samples in the application's PostgreSQL database, over
 * libpq.  This file connects, creates the tables, runs the transactions
 * and holds the helpers both files use (bound statements, strict cell
 * readers); rollout_pg_rows.c reads and writes the rows.  The guards and
 * every check of meaning are the rollout layer's.
 *
 * ---- Tables (rollout_schema_version 3 of keyshift_meta) -------------------
 *
 * The columns and meaning of the SQLite store's (rollout_sqlite.c) with
 * PostgreSQL types: integers bigint, rates double precision, names and
 * lists text, histograms bytea of exactly KS_HIST_BUCKETS little-endian
 * uint64; ids are identity columns.  Exact DDL: schema_ddl below.  They
 * are found through the connection's search_path and, unless the store
 * is read-only, created in its current schema when any is missing, in
 * one transaction that first takes pg_advisory_xact_lock (the row store's
 * key), so that concurrent openers do not race on CREATE ... IF NOT
 * EXISTS; a schema newer than this library is refused.  Version 2 adds
 * keyshift_rollout.encoding ('binary' or 'base64').  The samples' latency
 * sums (keyshift_metrics.seal_ns_sum and open_ns_sum) are columns added
 * to version 2 in place, without a new version: a library without them
 * inserts and reads samples by column name, so it keeps working on a
 * database that has them (its samples then have sums of 0), where a new
 * version would make every older instance refuse the database.  The same
 * DDL upgrades version 1 tables, and adds the sums where they are
 * missing, in place (ALTER TABLE ... ADD COLUMN IF NOT EXISTS: every
 * older rollout of binary encoding, every older sample with sums of 0),
 * in the same transaction, and a read-only store reads a version 1 or 2
 * database, with or without the sums, as it is.
 *
 *   keyshift_rollout          one row per rollout; the partial unique index
 *                             keyshift_rollout_open on (scope_key_id,
 *                             fold(tbl), fold(col)) WHERE phase <>
 *                             'finalized' is "one open rollout per scope".
 *   keyshift_rollout_column   a key scope's listed columns (seq keeps their
 *                             order), unique per rollout by folded name.
 *   keyshift_rollout_log      append-only: a BEFORE UPDATE OR DELETE row
 *                             trigger and a BEFORE TRUNCATE trigger raise
 *                             an exception, whoever connects.
 *   keyshift_readers, keyshift_metrics  as SQLite's.
 *   keyshift_rollout_version  one row (id 1): version, the data_version
 *                             counter, bumped by an AFTER ... FOR EACH
 *                             STATEMENT trigger on keyshift_rollout and
 *                             keyshift_rollout_column, so any committed
 *                             change of a rollout (by keyshift or not)
 *                             changes it; readers and metrics do not.
 *
 * fold(x) is translate(x, 'A..Z', 'a..z'): ASCII-only case folding, the
 * rule of ks_rollout_name_cmp and SQLite's NOCASE (lower() would fold by
 * the database's locale, and so disagree with the rollout layer).
 *
 * ---- Behaviour --------------------------------------------------------------
 *
 * Serialisation.  begin is BEGIN ISOLATION LEVEL READ COMMITTED, SET
 * LOCAL lock_timeout and statement_timeout, then LOCK TABLE
 * keyshift_rollout IN SHARE ROW EXCLUSIVE MODE: that mode conflicts with
 * itself and with every writer of the table (ROW EXCLUSIVE), not with
 * readers, exactly what SQLite's BEGIN IMMEDIATE gives; the rollout
 * layer's re-read, guard and write then run with no other change in
 * between, and a writer that bypasses keyshift waits too.  Each statement
 * after the lock sees every change committed before it was granted (READ
 * COMMITTED), so no serialization failure needs retrying, which
 * SERIALIZABLE would bring.  A lock not granted within lock_timeout is
 * KS_ERR_BUSY.  snapshot is BEGIN ISOLATION LEVEL REPEATABLE READ READ
 * ONLY ... COMMIT: the policy's reload sees one state.
 *
 * Statements.  Every value is a bound parameter (PQexecParams, binary
 * parameters with their type oids, binary results); constant statements
 * (BEGIN, COMMIT, the DDL) carry no value.  Every cell read back is
 * decoded strictly by type oid, length and range; a bad row is
 * KS_ERR_STORE.  Messages never quote the server's text.
 *
 * Reconnecting.  A lost connection fails the call that meets it
 * (KS_ERR_UNAVAILABLE); begin, snapshot and data_version then PQreset it
 * when no transaction is open and set the session's timeouts again.
 */
#define _POSIX_C_SOURCE 200809L

#include <assert.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include <keyshift/rollout_store.h>
#include <keyshift/rollout_store_pg.h>

#include "pg_util.h"
#include "rollout_pg.h"
#include "../../alloc_hook.h"

/* The schema version this library writes and reads. */
#define SCHEMA_LATEST 2
/* The tables of the schema (see the file comment). */
#define N_TABLES 7
/* The most parameters of one statement. */
#define MAX_PARAMS 32

/* Stringify a number macro. */
#define STR_(x) #x
#define STR(x) STR_(x)

/* The DDL of schema version 3 (idempotent: IF NOT EXISTS, OR REPLACE,
 * triggers dropped and made again), run under the advisory lock. */
static const char schema_ddl[] =
    "CREATE TABLE IF NOT EXISTS keyshift_meta(key text PRIMARY KEY, value bigint NOT NULL);"
    "CREATE TABLE IF NOT EXISTS keyshift_rollout("
    " id bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,"
    " tbl text NOT NULL, col text NOT NULL,"
    " src_plaintext bigint NOT NULL, src_format bigint NOT NULL, src_algorithm bigint NOT NULL,"
    " src_key_id text NOT NULL, src_key_version bigint NOT NULL,"
    " dst_format bigint NOT NULL, dst_algorithm bigint NOT NULL, dst_key_id text NOT NULL,"
    " dst_key_version bigint NOT NULL, phase text NOT NULL, phase_since bigint NOT NULL,"
    " canary_kind text NOT NULL, canary_percent bigint NOT NULL, canary_tenants text NOT NULL,"
    " max_auth_failure_rate double precision NOT NULL,"
    " max_parse_error_rate double precision NOT NULL,"
    " max_provider_error_rate double precision NOT NULL,"
    " max_seal_p99_us bigint NOT NULL, max_open_p99_us bigint NOT NULL,"
    " min_samples bigint NOT NULL, window_s bigint NOT NULL, min_soak_s bigint NOT NULL,"
    " reader_ttl_s bigint NOT NULL, created bigint NOT NULL, updated bigint NOT NULL,"
    " verified_at bigint NOT NULL, scope_key_id text NOT NULL DEFAULT '',"
    " encoding text NOT NULL DEFAULT 'binary');"
    "ALTER TABLE keyshift_rollout ADD COLUMN IF NOT EXISTS"
    " encoding text NOT NULL DEFAULT 'binary';"
    "CREATE UNIQUE INDEX IF NOT EXISTS keyshift_rollout_open ON keyshift_rollout("
    " scope_key_id, (" KS_RPG_FOLD("tbl") "), (" KS_RPG_FOLD("col") "))"
    " WHERE phase <> 'finalized';"
    "CREATE INDEX IF NOT EXISTS keyshift_rollout_scope ON keyshift_rollout("
    " (" KS_RPG_FOLD("tbl") "), (" KS_RPG_FOLD("col") "), id);"
    "CREATE INDEX IF NOT EXISTS keyshift_rollout_by_key ON keyshift_rollout(scope_key_id, id);"
    "CREATE TABLE IF NOT EXISTS keyshift_rollout_column("
    " seq bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,"
    " rollout_id bigint NOT NULL REFERENCES keyshift_rollout(id),"
    " tbl text NOT NULL, col text NOT NULL, verified_at bigint NOT NULL DEFAULT 0);"
    "CREATE UNIQUE INDEX IF NOT EXISTS keyshift_rollout_column_unique ON"
    " keyshift_rollout_column(rollout_id, (" KS_RPG_FOLD("tbl") "), (" KS_RPG_FOLD("col") "));"
    "CREATE INDEX IF NOT EXISTS keyshift_rollout_column_by_col ON keyshift_rollout_column("
    " (" KS_RPG_FOLD("tbl") "), (" KS_RPG_FOLD("col") "), rollout_id);"
    "CREATE TABLE IF NOT EXISTS keyshift_rollout_log("
    " id bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY, rollout_id bigint NOT NULL,"
    " time bigint NOT NULL, actor text NOT NULL, from_phase text, to_phase text NOT NULL,"
    " reason text NOT NULL, automatic bigint NOT NULL);"
    "CREATE INDEX IF NOT EXISTS keyshift_rollout_log_by_rollout"
    " ON keyshift_rollout_log(rollout_id, id);"
    "CREATE OR REPLACE FUNCTION keyshift_rollout_log_append_only() RETURNS trigger"
    " LANGUAGE plpgsql AS $f$BEGIN"
    " RAISE EXCEPTION 'keyshift_rollout_log is append-only'; END$f$;"
    "DROP TRIGGER IF EXISTS keyshift_rollout_log_no_change ON keyshift_rollout_log;"
    "CREATE TRIGGER keyshift_rollout_log_no_change BEFORE UPDATE OR DELETE"
    " ON keyshift_rollout_log FOR EACH ROW EXECUTE FUNCTION keyshift_rollout_log_append_only();"
    "DROP TRIGGER IF EXISTS keyshift_rollout_log_no_truncate ON keyshift_rollout_log;"
    "CREATE TRIGGER keyshift_rollout_log_no_truncate BEFORE TRUNCATE"
    " ON keyshift_rollout_log FOR EACH STATEMENT"
    " EXECUTE FUNCTION keyshift_rollout_log_append_only();"
    "CREATE TABLE IF NOT EXISTS keyshift_readers("
    " instance_id text PRIMARY KEY, library_version text NOT NULL, max_format bigint NOT NULL,"
    " algorithms bigint NOT NULL, key_versions text NOT NULL, started bigint NOT NULL,"
    " heartbeat bigint NOT NULL);"
    "CREATE TABLE IF NOT EXISTS keyshift_metrics("
    " id bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY, rollout_id bigint NOT NULL,"
    " instance_id text NOT NULL, source text NOT NULL CHECK (source IN ('app', 'migrate')),"
    " time bigint NOT NULL, seals bigint NOT NULL, opens bigint NOT NULL,"
    " auth_failures bigint NOT NULL, parse_errors bigint NOT NULL,"
    " provider_calls bigint NOT NULL, provider_errors bigint NOT NULL,"
    " seal_ns bytea NOT NULL, open_ns bytea NOT NULL,"
    " seal_ns_sum bigint NOT NULL DEFAULT 0, open_ns_sum bigint NOT NULL DEFAULT 0);"
    "ALTER TABLE keyshift_metrics ADD COLUMN IF NOT EXISTS"
    " seal_ns_sum bigint NOT NULL DEFAULT 0;"
    "ALTER TABLE keyshift_metrics ADD COLUMN IF NOT EXISTS"
    " open_ns_sum bigint NOT NULL DEFAULT 0;"
    "CREATE INDEX IF NOT EXISTS keyshift_metrics_window ON keyshift_metrics(rollout_id, time);"
    "CREATE TABLE IF NOT EXISTS keyshift_rollout_version("
    " id bigint PRIMARY KEY CHECK (id = 1), version bigint NOT NULL);"
    "INSERT INTO keyshift_rollout_version VALUES (1, 1) ON CONFLICT (id) DO NOTHING;"
    "CREATE OR REPLACE FUNCTION keyshift_rollout_bump() RETURNS trigger"
    " LANGUAGE plpgsql SET search_path FROM CURRENT AS $f$BEGIN"
    " UPDATE keyshift_rollout_version SET version = version + 1 WHERE id = 1;"
    " RETURN NULL; END$f$;"
    "DROP TRIGGER IF EXISTS keyshift_rollout_bump ON keyshift_rollout;"
    "CREATE TRIGGER keyshift_rollout_bump AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE"
    " ON keyshift_rollout FOR EACH STATEMENT EXECUTE FUNCTION keyshift_rollout_bump();"
    "DROP TRIGGER IF EXISTS keyshift_rollout_column_bump ON keyshift_rollout_column;"
    "CREATE TRIGGER keyshift_rollout_column_bump AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE"
    " ON keyshift_rollout_column FOR EACH STATEMENT EXECUTE FUNCTION keyshift_rollout_bump();"
    "INSERT INTO keyshift_meta VALUES ('rollout_schema_version', " STR(SCHEMA_LATEST) ")"
    " ON CONFLICT (key) DO UPDATE SET value = excluded.value"
    " WHERE keyshift_meta.value < excluded.value";

/* ---- errors ------------------------------------------------------------------ */

/* See rollout_pg.h: a broken connection KS_ERR_UNAVAILABLE, else
 * ks_pg_map_sqlstate (with 23505 first when unique_exists). */
ks_err ks_rpg_err(const ks_rpg *db, const PGresult *res, int unique_exists)
{
    if (PQstatus(db->conn) != CONNECTION_OK)
        return KS_ERR_UNAVAILABLE;
    const char *st = res != NULL ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
    if (unique_exists && st != NULL && strcmp(st, "23505") == 0)
        return KS_ERR_ROLLOUT_EXISTS;
    return ks_pg_map_sqlstate(st);
}

/* ---- statements ---------------------------------------------------------------- */

/* Write v as 8 bytes big-endian at p (binary bigint and float8). */
static void put_be64(uint8_t *p, uint64_t v)
{
    for (int i = 7; i >= 0; i--) {
        p[i] = (uint8_t)v;
        v >>= 8;
    }
}


/* Run sql with the parameters of types taken from ap (see ks_rpg_exec). */
static ks_err exec_v(ks_rpg *db, PGresult **out, const char *sql, const char *types,
                     int unique_exists, va_list ap)
{
    const char *v[MAX_PARAMS];
    int len[MAX_PARAMS], fmt[MAX_PARAMS];
    Oid oid[MAX_PARAMS];
    uint8_t num[MAX_PARAMS][8];
    int n = 0;
    *out = NULL;
    for (; types[n] != '\0'; n++) {
        assert(n < MAX_PARAMS);
        const char *t;
        double d;
        uint64_t bits;
        fmt[n] = 1;
        switch (types[n]) {
        case 'i':
            put_be64(num[n], (uint64_t)va_arg(ap, int64_t));
            v[n] = (const char *)num[n];
            len[n] = 8;
            oid[n] = KS_PG_OID_INT8;
            break;
        case 'd':
            d = va_arg(ap, double);
            memcpy(&bits, &d, sizeof bits);
            put_be64(num[n], bits);
            v[n] = (const char *)num[n];
            len[n] = 8;
            oid[n] = KS_PG_OID_FLOAT8;
            break;
        case 't':
            t = va_arg(ap, const char *);
            v[n] = t;
            len[n] = t != NULL ? (int)strlen(t) : 0;
            oid[n] = KS_PG_OID_TEXT;
            break;
        case 'b':
            v[n] = (const char *)va_arg(ap, const uint8_t *);
            len[n] = va_arg(ap, int);
            oid[n] = KS_PG_OID_BYTEA;
            break;
        default:
            assert(!"unknown parameter type");
            return KS_ERR_INVALID_ARGUMENT;
        }
    }
    PGresult *res = PQexecParams(db->conn, sql, n, oid, v, len, fmt, 1);
    ExecStatusType st = res != NULL ? PQresultStatus(res) : PGRES_FATAL_ERROR;
    if (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK) {
        *out = res;
        return KS_OK;
    }
    ks_err err = ks_rpg_err(db, res, unique_exists);
    PQclear(res);
    return err;
}

/* See rollout_pg.h. */
ks_err ks_rpg_exec(ks_rpg *db, PGresult **res, const char *sql, const char *types, ...)
{
    va_list ap;
    va_start(ap, types);
    ks_err err = exec_v(db, res, sql, types, 1, ap);
    va_end(ap);
    return err;
}

/* See rollout_pg.h. */
ks_err ks_rpg_run(ks_rpg *db, int64_t *changed, const char *sql, const char *types, ...)
{
    PGresult *res;
    va_list ap;
    va_start(ap, types);
    ks_err err = exec_v(db, &res, sql, types, 1, ap);
    va_end(ap);
    if (err == KS_OK && changed != NULL) {
        const char *c = PQcmdTuples(res);
        *changed = c != NULL && c[0] != '\0' ? strtoll(c, NULL, 10) : 0;
    }
    PQclear(res);
    return err;
}

/* Run a constant statement (or several; no value in them): KS_OK when it
 * succeeded, *tag (when not NULL) its command tag's first bytes. */
static ks_err run_const(ks_rpg *db, const char *sql, char *tag, size_t tag_len)
{
    PGresult *res = PQexec(db->conn, sql);
    ExecStatusType st = res != NULL ? PQresultStatus(res) : PGRES_FATAL_ERROR;
    ks_err err = KS_OK;
    if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK)
        err = ks_rpg_err(db, res, 0);
    else if (tag != NULL)
        snprintf(tag, tag_len, "%s", PQcmdStatus(res));
    PQclear(res);
    return err;
}

/* See rollout_pg.h. */
int ks_rpg_writable(const ks_rpg *db)
{
    return !db->read_only && db->have_tables;
}

/* See rollout_pg.h: the store is the first member of a ks_rpg, and every
 * store handed out by this file is one. */
ks_rpg *ks_rpg_of(ks_rollout_store *s)
{
    assert(s != NULL);
    return (ks_rpg *)(void *)s;
}

/* ---- strict cell readers -------------------------------------------------------- */

/* See rollout_pg.h. */
int ks_rpg_col_text(const PGresult *res, int row, int i, char *out, size_t max)
{
    size_t n = 0;
    const uint8_t *p = ks_pg_typed_cell(res, row, i, KS_PG_OID_TEXT, &n);
    if (p == NULL || n > max || memchr(p, 0, n) != NULL)
        return 0;
    memcpy(out, p, n);
    out[n] = '\0';
    return 1;
}

/* See rollout_pg.h. */
int ks_rpg_col_int(const PGresult *res, int row, int i, int64_t lo, int64_t hi, int64_t *out)
{
    size_t n = 0;
    const uint8_t *p = ks_pg_typed_cell(res, row, i, KS_PG_OID_INT8, &n);
    if (p == NULL || n != 8)
        return 0;
    int64_t v = (int64_t)ks_pg_get_be64(p);
    if (v < lo || v > hi)
        return 0;
    *out = v;
    return 1;
}

/* See rollout_pg.h. */
int ks_rpg_col_double(const PGresult *res, int row, int i, double *out)
{
    size_t n = 0;
    const uint8_t *p = ks_pg_typed_cell(res, row, i, KS_PG_OID_FLOAT8, &n);
    if (p == NULL || n != 8)
        return 0;
    uint64_t bits = ks_pg_get_be64(p);
    memcpy(out, &bits, sizeof *out);
    return !isnan(*out);
}

/* See rollout_pg.h. */
int ks_rpg_col_bytes(const PGresult *res, int row, int i, size_t len, const uint8_t **out)
{
    size_t n = 0;
    const uint8_t *p = ks_pg_typed_cell(res, row, i, KS_PG_OID_BYTEA, &n);
    if (p == NULL || n != len)
        return 0;
    *out = p;
    return 1;
}

/* See rollout_pg.h. */
int ks_rpg_col_null(const PGresult *res, int row, int i)
{
    return res != NULL && row < PQntuples(res) && i < PQnfields(res) && PQgetisnull(res, row, i);
}

/* ---- the connection ---------------------------------------------------------------- */

/* Set the session's lock and statement timeouts and its read-only mode
 * (bound through set_config): at connect and after every reconnect. */
static ks_err configure_session(ks_rpg *db)
{
    PGresult *res;
    ks_err err = ks_rpg_exec(db, &res,
                             "SELECT pg_catalog.set_config('lock_timeout', $1, false), "
                             "pg_catalog.set_config('statement_timeout', $2, false), "
                             "pg_catalog.set_config('default_transaction_read_only', $3, false)",
                             "ttt", STR(KS_ROLLOUT_PG_LOCK_TIMEOUT_MS),
                             STR(KS_ROLLOUT_PG_STATEMENT_TIMEOUT_MS),
                             db->read_only ? "on" : "off");
    PQclear(res);
    return err;
}

/* Before a transaction or the policy's poll: when the connection was
 * lost (the server restarted, a proxy dropped it) and no transaction is
 * open, connect again with the same parameters and settings, so a
 * long-lived policy recovers by itself; the call that saw the loss
 * failed with KS_ERR_UNAVAILABLE (fail closed).  KS_ERR_UNAVAILABLE
 * while the server cannot be reached. */
static ks_err ensure_connected(ks_rpg *db)
{
    if (PQstatus(db->conn) == CONNECTION_OK)
        return KS_OK;
    if (db->in_txn)
        return KS_ERR_UNAVAILABLE; /* the transaction is lost: the caller rolls back */
    PQreset(db->conn);
    if (PQstatus(db->conn) != CONNECTION_OK)
        return KS_ERR_UNAVAILABLE;
    return configure_session(db);
}

/* ---- transactions ------------------------------------------------------------------ */

/* The rollback op: roll back whatever transaction is open. */
static void op_rollback(ks_rollout_store *s)
{
    ks_rpg *db = ks_rpg_of(s);
    if (db->conn != NULL && PQstatus(db->conn) == CONNECTION_OK &&
        PQtransactionStatus(db->conn) != PQTRANS_IDLE) {
        ks_err err = run_const(db, "ROLLBACK", NULL, 0);
        (void)err; /* nothing more to undo: the server drops it with the session */
    }
    db->in_txn = 0;
}

/* The begin op: READ COMMITTED, the transaction's timeouts, and the
 * table lock that serialises every change (see the file comment).  The
 * statements are constants; a failure rolls back what was opened. */
static ks_err op_begin(ks_rollout_store *s)
{
    ks_rpg *db = ks_rpg_of(s);
    if (!ks_rpg_writable(db) || db->in_txn)
        return KS_ERR_INVALID_ARGUMENT;
    ks_err err = ensure_connected(db);
    if (err != KS_OK)
        return err;
    db->in_txn = 1;
    err = run_const(db,
                    "BEGIN ISOLATION LEVEL READ COMMITTED;"
                    "SET LOCAL lock_timeout = " STR(KS_ROLLOUT_PG_LOCK_TIMEOUT_MS) ";"
                    "SET LOCAL statement_timeout = " STR(
                        KS_ROLLOUT_PG_STATEMENT_TIMEOUT_MS) ";"
                    "LOCK TABLE keyshift_rollout IN SHARE ROW EXCLUSIVE MODE",
                    NULL, 0);
    if (err != KS_OK)
        op_rollback(s);
    return err;
}

/* End the open transaction with COMMIT: KS_OK only when the server says
 * COMMIT (an aborted transaction answers ROLLBACK: KS_ERR_STORE). */
static ks_err commit_now(ks_rpg *db)
{
    char tag[16] = "";
    ks_err err = run_const(db, "COMMIT", tag, sizeof tag);
    if (err == KS_OK && strcmp(tag, "COMMIT") != 0)
        err = KS_ERR_STORE;
    if (err != KS_OK)
        op_rollback(&db->base);
    db->in_txn = 0;
    return err;
}

/* The commit op. */
static ks_err op_commit(ks_rollout_store *s)
{
    ks_rpg *db = ks_rpg_of(s);
    if (!db->in_txn)
        return KS_ERR_INVALID_ARGUMENT;
    return commit_now(db);
}

/* The snapshot op: REPEATABLE READ READ ONLY, or its end. */
static ks_err op_snapshot(ks_rollout_store *s, int begin)
{
    ks_rpg *db = ks_rpg_of(s);
    if (!begin)
        return db->in_txn ? commit_now(db) : KS_ERR_INVALID_ARGUMENT;
    if (db->in_txn)
        return KS_ERR_INVALID_ARGUMENT;
    ks_err err = ensure_connected(db);
    if (err == KS_OK)
        err = run_const(db, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", NULL, 0);
    db->in_txn = err == KS_OK;
    return err;
}

/* The data_version op: the counter of keyshift_rollout_version (one
 * primary-key look-up), which every committed change of a rollout or its
 * columns bumps; 0 without the tables. */
static ks_err op_data_version(ks_rollout_store *s, int64_t *out)
{
    ks_rpg *db = ks_rpg_of(s);
    *out = 0;
    if (!db->have_tables)
        return KS_OK;
    ks_err err = ensure_connected(db);
    if (err != KS_OK)
        return err;
    PGresult *res;
    err = ks_rpg_exec(db, &res, "SELECT version FROM keyshift_rollout_version WHERE id = 1", "");
    if (err == KS_OK &&
        (PQntuples(res) != 1 || !ks_rpg_col_int(res, 0, 0, INT64_MIN, INT64_MAX, out)))
        err = KS_ERR_STORE;
    PQclear(res);
    return err;
}

/* ---- opening ------------------------------------------------------------------------ */

/* How many of the schema's tables the search_path shows, how many of the
 * two latency sum columns its keyshift_metrics has, and the schema
 * version (0 without keyshift_meta or its row). */
static ks_err read_schema_state(ks_rpg *db, int64_t *n_tables, int64_t *n_sums, int64_t *version)
{
    PGresult *res;
    *n_tables = *n_sums = *version = 0;
    ks_err err = ks_rpg_exec(
        db, &res,
        "SELECT count(*), count(*) FILTER (WHERE c.relname = 'keyshift_meta'), "
        "(SELECT count(*) FROM pg_catalog.pg_attribute a WHERE a.attrelid = "
        "pg_catalog.to_regclass('keyshift_metrics') AND NOT a.attisdropped "
        "AND a.attname IN ('seal_ns_sum', 'open_ns_sum')) "
        "FROM pg_catalog.pg_class c WHERE c.relkind IN ('r', 'p') "
        "AND c.relname IN ('keyshift_meta', 'keyshift_rollout', 'keyshift_rollout_column', "
        "'keyshift_rollout_log', 'keyshift_readers', 'keyshift_metrics', "
        "'keyshift_rollout_version') AND pg_catalog.pg_table_is_visible(c.oid)",
        "");
    int64_t has_meta = 0;
    if (err == KS_OK && (PQntuples(res) != 1 ||
                         !ks_rpg_col_int(res, 0, 0, 0, INT64_MAX, n_tables) ||
                         !ks_rpg_col_int(res, 0, 1, 0, INT64_MAX, &has_meta) ||
                         !ks_rpg_col_int(res, 0, 2, 0, 2, n_sums)))
        err = KS_ERR_STORE;
    PQclear(res);
    if (err != KS_OK || !has_meta)
        return err;
    err = ks_rpg_exec(db, &res,
                      "SELECT coalesce(max(value), 0) FROM keyshift_meta "
                      "WHERE key = 'rollout_schema_version'",
                      "");
    if (err == KS_OK &&
        (PQntuples(res) != 1 || !ks_rpg_col_int(res, 0, 0, INT64_MIN, INT64_MAX, version)))
        err = KS_ERR_STORE;
    PQclear(res);
    return err;
}

/* Refuse a schema newer than this library. */
static ks_err check_not_newer(int64_t version, char *errbuf, size_t errbuf_len)
{
    if (version > SCHEMA_LATEST)
        return ks_rpg_fail(errbuf, errbuf_len, KS_ERR_STORE,
                    "keyshift rollout tables are of schema version %lld, newer than this "
                    "keyshift (%d)",
                    (long long)version, SCHEMA_LATEST);
    return KS_OK;
}

/* Create the tables in one transaction under the advisory lock (one
 * creator at a time: 1801812339 is "keys", the row store's key),
 * re-reading the version inside it. */
static ks_err create_tables(ks_rpg *db, char *errbuf, size_t errbuf_len)
{
    int64_t n = 0, n_sums = 0, version = 0;
    db->in_txn = 1;
    ks_err err = run_const(db,
                           "BEGIN ISOLATION LEVEL READ COMMITTED;"
                           "SET LOCAL client_min_messages = warning;"
                           "SELECT pg_catalog.pg_advisory_xact_lock(1801812339)",
                           NULL, 0);
    if (err == KS_OK)
        err = read_schema_state(db, &n, &n_sums, &version);
    if (err == KS_OK)
        err = check_not_newer(version, errbuf, errbuf_len);
    if (err == KS_OK && (n < N_TABLES || version < SCHEMA_LATEST || n_sums < 2))
        err = run_const(db, schema_ddl, NULL, 0);
    if (err == KS_OK)
        err = commit_now(db);
    else
        op_rollback(&db->base);
    if (err != KS_OK && errbuf != NULL && errbuf_len > 0 && errbuf[0] == '\0')
        ks_rpg_fail(errbuf, errbuf_len, err,
             "cannot create keyshift's rollout tables in the current schema (CREATE "
             "privilege?): %s",
             ks_err_name(err));
    return err;
}

/* Connect with conninfo and set the session's timeouts and read-only
 * mode. */
static ks_err connect_db(ks_rpg *db, const char *conninfo, char *errbuf, size_t errbuf_len)
{
    ks_err err = ks_pg_connect(conninfo, &db->conn, errbuf, errbuf_len);
    if (err == KS_OK)
        err = configure_session(db);
    if (err != KS_OK && errbuf != NULL && errbuf_len > 0 && errbuf[0] == '\0')
        ks_rpg_fail(errbuf, errbuf_len, err, "setting the session's timeouts: %s",
                    ks_err_name(err));
    return err;
}

/* The close op: roll back what is open, close the connection. */
static void op_close(ks_rollout_store *s)
{
    if (s == NULL)
        return;
    ks_rpg *db = ks_rpg_of(s);
    if (db->conn != NULL) {
        op_rollback(s);
        PQfinish(db->conn);
    }
    free(db);
}

/* The operations of the PostgreSQL rollout store. */
static const ks_rollout_store_ops pg_ops = {
    .close = op_close,
    .begin = op_begin,
    .commit = op_commit,
    .rollback = op_rollback,
    .snapshot = op_snapshot,
    .data_version = op_data_version,
    .find_column = ks_rpg_find_column,
    .find_open = ks_rpg_find_open,
    .insert = ks_rpg_insert,
    .get = ks_rpg_get,
    .latest = ks_rpg_latest,
    .latest_key = ks_rpg_latest_key,
    .list = ks_rpg_list,
    .later_count = ks_rpg_later_count,
    .set_phase = ks_rpg_set_phase,
    .set_canary = ks_rpg_set_canary,
    .set_settings = ks_rpg_set_settings,
    .remove = ks_rpg_remove,
    .set_verified = ks_rpg_set_verified,
    .log_append = ks_rpg_log_append,
    .log_list = ks_rpg_log_list,
    .readers_live = ks_rpg_readers_live,
    .reader_put = ks_rpg_reader_put,
    .reader_heartbeat = ks_rpg_reader_heartbeat,
    .reader_delete = ks_rpg_reader_delete,
    .metrics_insert = ks_rpg_metrics_insert,
    .metrics_sum = ks_rpg_metrics_sum,
};

/* Nonzero when the n bytes at word are one of libpq's connection
 * keywords (PQconndefaults: host, dbname, user, service, ...). */
static int libpq_keyword(const char *word, size_t n)
{
    PQconninfoOption *all = PQconndefaults();
    int found = 0;
    for (const PQconninfoOption *o = all; o != NULL && o->keyword != NULL && !found; o++) {
        found = strlen(o->keyword) == n && memcmp(o->keyword, word, n) == 0;
    }
    PQconninfoFree(all);
    return found;
}

/* See rollout_store_pg.h. */
int ks_rollout_store_pg_names(const char *db)
{
    if (db == NULL) {
        return 0;
    }
    if (strncmp(db, "postgresql://", 13) == 0 || strncmp(db, "postgres://", 11) == 0) {
        return 1;
    }
    const char *p = db + strspn(db, " \t");
    size_t n = strspn(p, "abcdefghijklmnopqrstuvwxyz_");
    const char *q = p + n + strspn(p + n, " \t");
    return n > 0 && *q == '=' && libpq_keyword(p, n);
}

/* See rollout_store_pg.h. */
ks_err ks_rollout_store_pg_open(const char *conninfo, int read_only, ks_rollout_store **out,
                                char *errbuf, size_t errbuf_len)
{
    if (errbuf != NULL && errbuf_len > 0)
        errbuf[0] = '\0';
    if (out == NULL)
        return KS_ERR_INVALID_ARGUMENT;
    *out = NULL;
    if (conninfo == NULL)
        return ks_rpg_fail(errbuf, errbuf_len, KS_ERR_INVALID_ARGUMENT,
                           "missing connection string");
    ks_rpg *db = calloc(1, sizeof *db);
    if (db == NULL)
        return KS_ERR_NO_MEMORY;
    db->base.ops = &pg_ops;
    db->read_only = read_only != 0;
    int64_t n = 0, n_sums = 0, version = 0;
    ks_err err = connect_db(db, conninfo, errbuf, errbuf_len);
    if (err == KS_OK) {
        err = read_schema_state(db, &n, &n_sums, &version);
        if (err != KS_OK)
            err = ks_rpg_fail(errbuf, errbuf_len, err, "reading the catalog: %s", ks_err_name(err));
    }
    if (err == KS_OK)
        err = check_not_newer(version, errbuf, errbuf_len);
    if (err == KS_OK && !db->read_only && (n < N_TABLES || version < SCHEMA_LATEST || n_sums < 2))
        err = create_tables(db, errbuf, errbuf_len);
    if (err == KS_OK && db->read_only) {
        db->have_tables = n == N_TABLES && version >= 1;
        db->v2 = db->have_tables && version >= 2;
        db->sums = db->v2 && n_sums == 2;
    } else if (err == KS_OK) {
        db->have_tables = db->v2 = db->sums = 1;
    }
    if (err != KS_OK) {
        op_close(&db->base);
        return err;
    }
    *out = &db->base;
    return KS_OK;
}
