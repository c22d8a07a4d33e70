/*
 * migrate/store/sqlite/sqlite_store.c -- the SQLite row store (keyshift/rowstore.h):
 * the operations on an open store and its hooks.  Opening one (the
 * target's schema, keyshift's tables below, the kept statements) is
 * sqlite_store_open.c's; what both share is sqlite_store_internal.h.
 *
 * ---- Tables kept in the target database (schema version 1) -------------
 *
 * Unless the store is opened read-only, ks_rowstore_sqlite_open creates
 * these three tables when they are missing, in one BEGIN IMMEDIATE
 * transaction.  They live in the "main" schema of the target database,
 * next to the application's tables, so that a checkpoint commits in the
 * same transaction as the rows it describes.
 *
 *   CREATE TABLE keyshift_meta(
 *       key   TEXT PRIMARY KEY,
 *       value                      -- any type
 *   );
 *   -- one row: ('schema_version', 1).  A store refuses to open a database
 *   -- whose schema_version is greater than the library knows
 *   -- (KS_SQLITE_SCHEMA_LATEST, KS_ERR_STORE); a later version upgrades
 *   -- older tables in place and bumps the row (version 2, the rollout
 *   -- tables, leaves these three as they are: migrate/rollout/rollout_db.c).
 *
 *   CREATE TABLE keyshift_migration(
 *       tbl         TEXT NOT NULL,     -- target table, as spelled in the schema
 *       col         TEXT NOT NULL,     -- target column, as spelled in the schema
 *       params      TEXT NOT NULL,     -- canonical parameters of a migration
 *       state       TEXT NOT NULL,     -- running, paused, stopped, complete
 *       cursor,                        -- last id done in this pass (any type;
 *                                      -- NULL before the first batch)
 *       pass        INTEGER NOT NULL,  -- 1, 2, ...
 *       done        INTEGER NOT NULL,  -- rows rewritten
 *       skipped     INTEGER NOT NULL,  -- rows at the target, or outside the run's key
 *       raced       INTEGER NOT NULL,  -- rows changed underneath
 *       quarantined INTEGER NOT NULL,  -- rows put in quarantine
 *       wrong_state INTEGER NOT NULL,  -- rows in the wrong state, untouched
 *       started     INTEGER NOT NULL,  -- Unix seconds
 *       updated     INTEGER NOT NULL,  -- Unix seconds of the last save
 *       finished    INTEGER NOT NULL,  -- Unix seconds; 0 while not finished
 *       PRIMARY KEY (tbl, col, params)
 *   );
 *   -- one row per migration: per target column and distinct params, so
 *   -- two columns migrated with the same parameters keep apart.  A save
 *   -- replaces the
 *   -- row (INSERT OR REPLACE); "the most recent" checkpoint is the one with
 *   -- the greatest updated, ties broken by the latest save.
 *
 *   CREATE TABLE keyshift_quarantine(
 *       tbl   TEXT NOT NULL,     -- target table, as spelled in the schema
 *       col   TEXT NOT NULL,     -- target column, as spelled in the schema
 *       id    NOT NULL,          -- the row's id (any type: rowid, INTEGER or
 *                                -- TEXT primary key, ...)
 *       error TEXT NOT NULL,     -- stable error name (ks_err_name), never data
 *       time  INTEGER NOT NULL,  -- Unix seconds when quarantined
 *       params TEXT,             -- canonical parameters of the migration that
 *                                -- quarantined it; NULL for an older entry
 *       PRIMARY KEY (tbl, col, id)
 *   );
 *   CREATE INDEX keyshift_quarantine_params ON keyshift_quarantine(tbl, col, params);
 *   -- the primary key is also the index through which a scan flags
 *   -- quarantined rows; the params index answers whether a migration has
 *   -- any.  Quarantine belongs to the migration bound to the store
 *   -- (rowstore.h, bind_migration): a scan flags a row whose entry has the
 *   -- bound params, or NULL params (an older entry holds back every
 *   -- migration).  Entries stay until released (quarantine_release,
 *   -- `keyshift migrate quarantine release`); the engine never modifies a
 *   -- row its migration quarantined.
 *   -- A keyshift_quarantine created before the params column existed is
 *   -- upgraded in place by the first writable open (ALTER TABLE ... ADD
 *   -- COLUMN params and the index, in one BEGIN IMMEDIATE transaction;
 *   -- schema_version is unchanged: the column is detected, not versioned).
 *   -- A read-only open reads such a table as it is.
 *
 * ---- Behaviour ----------------------------------------------------------
 *
 * Identifiers.  The table and every column are looked up in the schema
 * with the name bound as a parameter (sqlite_master, pragma_table_xinfo,
 * pragma_index_list/info); only the schema's own spelling, quoted as an
 * SQL identifier, is ever put into a statement.  A name that is not in the
 * schema is reported missing and never executed.
 *
 * Ids.  Without id_column the rowid is the id (WITHOUT ROWID tables are
 * then refused: their one-column primary key is named as id_column).  An
 * id_column must be the INTEGER PRIMARY KEY (the rowid alias) or a NOT
 * NULL column with a full (not partial) UNIQUE or PRIMARY KEY index of
 * its own.  The store's id_stable (rowstore.h) is 0 only for the bare
 * rowid of a table without an INTEGER PRIMARY KEY, which VACUUM and a
 * dump/restore renumber once rows were deleted.
 *
 * Values.  TEXT and BLOB values come back with their type; a REAL value
 * (no ks_value type) is reported as TEXT, its SQLite rendering, and cas
 * treats a REAL whose rendering still equals that text as unchanged; a REAL id
 * is refused (KS_ERR_STORE).  Views (row values, checkpoint strings) point
 * into one store-owned buffer, reused by every scan and load: valid until
 * the next call on the store.  visit_values copies nothing: its views
 * point into SQLite's current row, valid only during the callback.
 *
 * Visiting.  visit_values runs one kept statement, SELECT of the target
 * column alone in id order (for the rowid or its INTEGER PRIMARY KEY
 * alias, the table's own order; else through the id's unique index),
 * stepped once through the table: no per-batch restart, no quarantine
 * probe, no tenant or context columns, no copy.  It is one read for the
 * whole table: with a rollback journal a writer's commit waits for it
 * (through the writer's busy timeout); in WAL mode it blocks nobody.  A
 * REAL id, which scan refuses, is never read by it.
 *
 * Ranges.  visit_rows_range (a chunk of a chunked run) runs a third kept
 * scan, the after-scan bounded above: WHERE id >= ?2 AND id <= ?6, the
 * lower bound the caller's after + 1, so a keyset scan of the id's order
 * that stops at the chunk's end.  Its bounds are integers and so are the
 * ids it returns: a TEXT or BLOB id is in no range (typeof filter; in an
 * id column of TEXT affinity the bounds would otherwise compare as text).
 *
 * Transactions.  begin is BEGIN IMMEDIATE.  Every statement of the
 * connection waits for locks through a busy handler with exponential
 * backoff (1 ms doubling to 100 ms, plus up to 50% jitter) up to
 * busy_timeout_ms in all, then fails with KS_ERR_BUSY.  When any operation
 * inside a transaction fails (cas, quarantine, checkpoint_save, commit),
 * the store rolls the whole transaction back before returning: the engine
 * must treat the batch as lost.  Outside a write transaction each scan and
 * count is its own short read (autocommit); a visit, one read.
 *
 * The store does not change the database's journal mode (WAL or rollback
 * journal: the application's choice stands); with a rollback journal a
 * commit may also wait for readers.  Its connection runs PRAGMA
 * synchronous = FULL, set explicitly (a build's default may differ), or
 * NORMAL when asked (ks_sqlite_options.synchronous) and the journal mode,
 * read at open, is WAL: refused otherwise, since in a rollback-journal
 * mode NORMAL risks corruption on power loss, in WAL only the last
 * commits.  The mode cannot leave WAL while the store is open (SQLite
 * needs the only connection for that), so the check holds.  cas runs an
 * ordinary UPDATE, so the application's triggers on the column fire.
 * The connection is opened without SQLITE_OPEN_CREATE (a missing file is
 * KS_ERR_NO_TARGET), with SQLITE_DBCONFIG_DEFENSIVE on and the schema
 * untrusted (SQLITE_DBCONFIG_TRUSTED_SCHEMA off).
 *
 * Messages in errbuf name files, tables and columns, never row values, and
 * never include SQLite's error text (only sqlite3_errstr of the code).
 */
#define _POSIX_C_SOURCE 200809L

#include <assert.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <sqlite3.h>

#include <keyshift/rowstore.h>

#include "sqlite_store.h"
#include "sqlite_store_internal.h"
#include "sqlite_util.h"
#include "../../alloc_hook.h"

/* The longest error name recorded in quarantine. */
#define ERROR_NAME_MAX 128u

/* The empty (present) view of a zero-length TEXT or BLOB. */
static const uint8_t empty_bytes[1] = {0};

/* ---- statements ------------------------------------------------------------- */

/* See sqlite_store_internal.h. */
int ks_sqls_prepare(sqlite3 *db, const char *sql, int persistent, sqlite3_stmt **out)
{
    *out = NULL;
    return sqlite3_prepare_v3(db, sql, -1, persistent ? SQLITE_PREPARE_PERSISTENT : 0, out,
                              NULL);
}

/* ---- binding values ---------------------------------------------------------- */

/*
 * How a bound view is held.  BIND_COPY (SQLITE_TRANSIENT) for the reads
 * (scan, checkpoint_load): the caller's view may point into the arena,
 * which the statement's own rows overwrite while it runs.  BIND_VIEW
 * (SQLITE_STATIC) for the writes (run_write): nothing writes the arena
 * while they run, and run_write resets the statement and clears its
 * bindings before the operation returns, so SQLite never holds the
 * pointer past the caller's view; no copy of a 2 KiB value per row.
 */
#define BIND_COPY SQLITE_TRANSIENT
#define BIND_VIEW SQLITE_STATIC

/* Bind bytes as TEXT or BLOB, held as `how` says (BIND_COPY or
 * BIND_VIEW).  An absent view binds an empty value, not NULL. */
static int bind_bytes(sqlite3_stmt *st, int i, ks_bytes b, int as_text, sqlite3_destructor_type how)
{
    const void *p = b.ptr != NULL ? (const void *)b.ptr : (const void *)empty_bytes;
    if (b.len > (size_t)INT32_MAX)
        return SQLITE_TOOBIG;
    if (as_text)
        return sqlite3_bind_text(st, i, p, (int)b.len, how);
    return sqlite3_bind_blob(st, i, p, (int)b.len, how);
}

/* Bind a ks_value with its own type (IS and = compare types), bytes held
 * as `how` says. */
static int bind_value(sqlite3_stmt *st, int i, const ks_value *v, sqlite3_destructor_type how)
{
    switch (v->type) {
    case KS_VALUE_NULL:
        return sqlite3_bind_null(st, i);
    case KS_VALUE_INTEGER:
        return sqlite3_bind_int64(st, i, v->integer);
    case KS_VALUE_TEXT:
        return bind_bytes(st, i, v->bytes, 1, how);
    case KS_VALUE_BLOB:
        return bind_bytes(st, i, v->bytes, 0, how);
    }
    return SQLITE_MISUSE;
}

/* Nonzero when v is a well-formed value (known type; bytes absent only
 * when empty). */
static int value_ok(const ks_value *v)
{
    if (v == NULL)
        return 0;
    if (v->type == KS_VALUE_TEXT || v->type == KS_VALUE_BLOB)
        return v->bytes.ptr != NULL || v->bytes.len == 0;
    return v->type == KS_VALUE_NULL || v->type == KS_VALUE_INTEGER;
}

/* ---- the arena ------------------------------------------------------------------ */

/* Append n bytes (plus a NUL, not counted) to the store's buffer and
 * return their offset in *off.  One buffer, grown by doubling and reused:
 * no allocation per row. */
static ks_err arena_put(sqlite_store *s, const void *p, size_t n, size_t *off)
{
    if (n > SIZE_MAX / 4 || s->arena_len > SIZE_MAX / 4)
        return KS_ERR_NO_MEMORY;
    size_t need = s->arena_len + n + 1;
    if (need > s->arena_cap) {
        size_t cap = s->arena_cap ? s->arena_cap : 4096;
        while (cap < need)
            cap *= 2;
        uint8_t *np = realloc(s->arena, cap);
        if (np == NULL)
            return KS_ERR_NO_MEMORY;
        s->arena = np;
        s->arena_cap = cap;
    }
    if (n > 0)
        memcpy(s->arena + s->arena_len, p, n);
    s->arena[s->arena_len + n] = 0;
    *off = s->arena_len;
    s->arena_len = need;
    return KS_OK;
}

/* Read column col of st into *v as a view of SQLite's own memory, valid
 * until st next steps or resets (no copy).  REAL becomes TEXT unless
 * refused (ids); an empty TEXT or BLOB is the present empty view. */
static ks_err column_view(sqlite3_stmt *st, int col, int allow_real, ks_value *v)
{
    memset(v, 0, sizeof *v);
    int type = sqlite3_column_type(st, col);
    const void *p;
    switch (type) {
    case SQLITE_NULL:
        v->type = KS_VALUE_NULL;
        return KS_OK;
    case SQLITE_INTEGER:
        v->type = KS_VALUE_INTEGER;
        v->integer = sqlite3_column_int64(st, col);
        return KS_OK;
    case SQLITE_FLOAT: /* no REAL ks_value: rendered as text */
        if (!allow_real)
            return KS_ERR_STORE;
        v->type = KS_VALUE_TEXT;
        p = sqlite3_column_text(st, col);
        break;
    case SQLITE_TEXT:
        v->type = KS_VALUE_TEXT;
        p = sqlite3_column_text(st, col);
        break;
    case SQLITE_BLOB:
        v->type = KS_VALUE_BLOB;
        p = sqlite3_column_blob(st, col);
        break;
    default:
        return KS_ERR_STORE;
    }
    int n = sqlite3_column_bytes(st, col);
    if (n < 0 || (p == NULL && (n > 0 || sqlite3_errcode(sqlite3_db_handle(st)) == SQLITE_NOMEM)))
        return KS_ERR_NO_MEMORY;
    v->bytes.ptr = n > 0 ? p : empty_bytes;
    v->bytes.len = (size_t)n;
    return KS_OK;
}

/* Read column col of st into *v (column_view), copying TEXT and BLOB into
 * the arena.  While a batch is read the arena may move, so the offset is
 * parked in v->integer (unused for TEXT and BLOB) and fix_view() turns it
 * into a pointer afterwards. */
static ks_err read_value(sqlite_store *s, sqlite3_stmt *st, int col, int allow_real, ks_value *v)
{
    ks_err err = column_view(st, col, allow_real, v);
    if (err != KS_OK || (v->type != KS_VALUE_TEXT && v->type != KS_VALUE_BLOB))
        return err;
    size_t off;
    err = arena_put(s, v->bytes.ptr, v->bytes.len, &off);
    if (err != KS_OK)
        return err;
    v->bytes.ptr = NULL;
    v->integer = (int64_t)off;
    return KS_OK;
}

/* Turn the parked arena offset of v (see read_value) into its view. */
static void fix_view(const sqlite_store *s, ks_value *v)
{
    if (v->type != KS_VALUE_TEXT && v->type != KS_VALUE_BLOB)
        return;
    assert(v->integer >= 0 && (size_t)v->integer + v->bytes.len < s->arena_len + 1);
    v->bytes.ptr = v->bytes.len > 0 ? s->arena + (size_t)v->integer : empty_bytes;
    v->integer = 0;
}

/* ---- transactions --------------------------------------------------------------- */

/* Run one of the kept transaction statements (BEGIN, COMMIT, ROLLBACK). */
static int run_simple(sqlite_store *s, int which)
{
    sqlite3_stmt *st = s->st[which];
    assert(st != NULL);
    int rc = sqlite3_step(st);
    int rc2 = sqlite3_reset(st);
    (void)rc2;
    return rc == SQLITE_DONE ? SQLITE_OK : rc;
}

/* Roll back whatever transaction the connection has open, and forget it.
 * Used on every error inside a transaction: the batch is lost. */
static void rollback_now(sqlite_store *s)
{
    for (int i = 0; i < ST_N; i++)
        if (s->st[i] != NULL)
            sqlite3_reset(s->st[i]);
    if (s->st[ST_ROLLBACK] != NULL && !sqlite3_get_autocommit(s->db))
        (void)run_simple(s, ST_ROLLBACK);
    s->in_txn = 0;
}

/* Fail an operation inside a transaction: roll it back, map rc. */
static ks_err fail_txn(sqlite_store *s, int rc)
{
    rollback_now(s);
    return ks_sqlite_map_rc(rc);
}

/* Whether the target has any row in keyshift_quarantine (*has), with one
 * index lookup. */
static int scan_has_quarantine(sqlite_store *s, int *has)
{
    int mig = s->mig != NULL && s->st[ST_QCHECK_MIG] != NULL;
    sqlite3_stmt *q = s->st[mig ? ST_QCHECK_MIG : ST_QCHECK];
    int rc = sqlite3_bind_text(q, 1, s->table, -1, SQLITE_STATIC);
    if (rc == SQLITE_OK)
        rc = sqlite3_bind_text(q, 2, s->column, -1, SQLITE_STATIC);
    if (rc == SQLITE_OK && mig)
        rc = sqlite3_bind_text(q, 3, s->mig, (int)s->mig_len, SQLITE_STATIC);
    if (rc == SQLITE_OK)
        rc = sqlite3_step(q);
    *has = rc == SQLITE_ROW && sqlite3_column_int(q, 0) != 0;
    sqlite3_reset(q);
    sqlite3_clear_bindings(q);
    return rc == SQLITE_ROW ? SQLITE_OK : rc;
}

/* Bind the store's table (?3) and column (?4) names, which select its
 * rows of keyshift_quarantine, whether it has any (?5) and the bound
 * migration's parameters (?7, NULL when unbound), to a scan statement
 * (absent when a read-only store has no quarantine table). */
static int bind_scan_names(sqlite_store *s, sqlite3_stmt *st)
{
    if (sqlite3_bind_parameter_index(st, "?5") == 0)
        return SQLITE_OK;
    int has = 1;
    int rc = scan_has_quarantine(s, &has);
    if (rc == SQLITE_OK)
        rc = sqlite3_bind_text(st, 3, s->table, -1, SQLITE_STATIC);
    if (rc == SQLITE_OK)
        rc = sqlite3_bind_text(st, 4, s->column, -1, SQLITE_STATIC);
    if (rc == SQLITE_OK)
        rc = sqlite3_bind_int(st, 5, has);
    if (rc == SQLITE_OK && s->mig != NULL && sqlite3_bind_parameter_index(st, "?7") != 0)
        rc = sqlite3_bind_text(st, 7, s->mig, (int)s->mig_len, SQLITE_STATIC);
    return rc;
}

/* Run the bound write statement st unless binding failed (rc), then
 * reset it and drop its bindings; SQLITE_OK when it completed. */
static int run_write(sqlite_store *s, sqlite3_stmt *st, int rc)
{
    assert(s->in_txn);
    (void)s;
    if (rc == SQLITE_OK)
        rc = sqlite3_step(st);
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
    if (rc == SQLITE_DONE)
        return SQLITE_OK;
    return rc == SQLITE_OK || rc == SQLITE_ROW ? SQLITE_ERROR : rc;
}

/* ---- operations ------------------------------------------------------------------- */

/* Bind the scan statement for up to max rows after *after (all rows when
 * after is NULL or of type KS_VALUE_NULL) into *out; with upto, the range
 * statement instead, for the integer ids from *after (inclusive: the
 * caller's lower bound, never NULL then) to *upto.  SQLITE_OK, or the
 * failure with the bindings cleared. */
static int scan_bind(sqlite_store *s, const ks_value *after, const ks_value *upto, size_t max,
                     sqlite3_stmt **out)
{
    int from_start = after == NULL || after->type == KS_VALUE_NULL;
    assert(upto == NULL || (!from_start && after->type == KS_VALUE_INTEGER &&
                            upto->type == KS_VALUE_INTEGER));
    sqlite3_stmt *st = s->st[upto != NULL ? ST_SCAN_RANGE : from_start ? ST_SCAN_FIRST : ST_SCAN_AFTER];
    int rc = sqlite3_bind_int64(st, 1, max > (size_t)INT64_MAX ? INT64_MAX : (int64_t)max);
    if (rc == SQLITE_OK && !from_start)
        rc = bind_value(st, 2, after, BIND_COPY); /* the arena is reused below */
    if (rc == SQLITE_OK && upto != NULL)
        rc = sqlite3_bind_int64(st, 6, upto->integer);
    if (rc == SQLITE_OK)
        rc = bind_scan_names(s, st);
    if (rc != SQLITE_OK)
        sqlite3_clear_bindings(st);
    *out = st;
    return rc;
}

/* Read the scan statement's current row into *r: copied into the arena
 * (offsets parked, see read_value) when `copy`, else views of SQLite's
 * row (column_view), valid until the statement steps. */
static ks_err scan_row(sqlite_store *s, sqlite3_stmt *st, int copy, ks_row *r)
{
    memset(r, 0, sizeof *r);
    ks_err err = copy ? read_value(s, st, 0, 0, &r->id) : column_view(st, 0, 0, &r->id);
    if (err == KS_OK && r->id.type == KS_VALUE_NULL)
        err = KS_ERR_STORE; /* cannot happen for a checked id column */
    for (int col = 1; err == KS_OK && col < 3 + (int)s->n_context; col++) {
        ks_value *v = col == 1 ? &r->value : col == 2 ? &r->tenant : &r->context[col - 3];
        err = copy ? read_value(s, st, col, 1, v) : column_view(st, col, 1, v);
    }
    r->quarantined = sqlite3_column_int(st, 3 + (int)s->n_context) != 0;
    return err;
}

/* Bind the scan statement (scan_bind; the range statement with upto) and
 * step it through up to max rows; each row is read by scan_row (copying when `copy`) into rows[got]
 * when rows is not NULL, else into one row handed to fn.  Resets the
 * statement, rolls an open transaction back when reading fails (not when
 * binding fails or fn stops), and returns the rows read in *n. */
static ks_err scan_run(sqlite_store *s, const ks_value *after, const ks_value *upto, size_t max,
                       int copy, ks_row *rows, ks_rowstore_row_fn fn, void *arg, size_t *n)
{
    ks_err err = KS_OK, stopped = KS_OK;
    size_t got = 0;
    *n = 0;
    sqlite3_stmt *st;
    int rc = scan_bind(s, after, upto, max, &st);
    if (rc != SQLITE_OK)
        return ks_sqlite_map_rc(rc);
    rc = SQLITE_DONE;
    while (got < max && (rc = sqlite3_step(st)) == SQLITE_ROW) {
        ks_row one, *r = rows != NULL ? &rows[got] : &one;
        err = scan_row(s, st, copy, r);
        if (err != KS_OK)
            break;
        got++;
        if (fn != NULL && (stopped = fn(arg, r)) != KS_OK)
            break;
    }
    if (err == KS_OK && stopped == KS_OK && rc != SQLITE_ROW && rc != SQLITE_DONE)
        err = ks_sqlite_map_rc(rc);
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
    if (err != KS_OK && s->in_txn)
        rollback_now(s);
    *n = got;
    return err != KS_OK ? err : stopped;
}

/* ops.scan: read up to max rows after *after into rows (see rowstore.h).
 * The batch is copied into the arena, so its views survive the statement
 * reset and stay valid until the next call. */
static ks_err op_scan(void *self, const ks_value *after, size_t max, ks_row *rows, size_t *n)
{
    sqlite_store *s = self;
    if (s == NULL || n == NULL || (max > 0 && rows == NULL) || (after != NULL && !value_ok(after)))
        return KS_ERR_INVALID_ARGUMENT;
    *n = 0;
    if (max == 0)
        return KS_OK;
    s->arena_len = 0; /* `after` may view it: bound as a copy before any row is read */
    size_t got = 0;
    ks_err err = scan_run(s, after, NULL, max, 1, rows, NULL, NULL, &got);
    if (err != KS_OK)
        return err;
    for (size_t i = 0; i < got; i++) {
        fix_view(s, &rows[i].id);
        fix_view(s, &rows[i].value);
        fix_view(s, &rows[i].tenant);
        for (size_t j = 0; j < s->n_context; j++)
            fix_view(s, &rows[i].context[j]);
    }
    *n = got;
    return KS_OK;
}

/* ops.visit_rows: the rows of op_scan, each handed to fn as views of
 * SQLite's current row (no arena copy): the engine copies them into its
 * own batch anyway. */
static ks_err op_visit_rows(void *self, const ks_value *after, size_t max, ks_rowstore_row_fn fn,
                            void *arg)
{
    sqlite_store *s = self;
    if (s == NULL || fn == NULL || (after != NULL && !value_ok(after)))
        return KS_ERR_INVALID_ARGUMENT;
    if (max == 0)
        return KS_OK;
    size_t got = 0;
    return scan_run(s, after, NULL, max, 0, NULL, fn, arg, &got);
}

/* ops.visit_rows_range: the rows of op_visit_rows whose id is an integer
 * at most *upto (rowstore.h), by the kept range statement: a keyset scan
 * of the id from *after + 1 (from INT64_MIN at the start), so that a
 * chunk's batch never reads past the chunk's end.  Ids are compared as
 * integers; a TEXT or BLOB id is in no range (in an id column of TEXT
 * affinity every id is: the bounds would compare as text), and a REAL
 * one in range is refused with KS_ERR_STORE as scan refuses it. */
static ks_err op_visit_rows_range(void *self, const ks_value *after, const ks_value *upto,
                                  size_t max, ks_rowstore_row_fn fn, void *arg)
{
    sqlite_store *s = self;
    int from_start = after == NULL || after->type == KS_VALUE_NULL;
    if (s == NULL || fn == NULL || upto == NULL || upto->type != KS_VALUE_INTEGER ||
        (!from_start && after->type != KS_VALUE_INTEGER))
        return KS_ERR_INVALID_ARGUMENT;
    if (max == 0 || (!from_start && after->integer == INT64_MAX))
        return KS_OK; /* nothing is above INT64_MAX */
    ks_value lo = {KS_VALUE_INTEGER, from_start ? INT64_MIN : after->integer + 1, {NULL, 0}};
    size_t got = 0;
    return scan_run(s, &lo, upto, max, 0, NULL, fn, arg, &got);
}

/* ops.visit_values: step the kept values statement once through the
 * table, handing fn each value as a view of SQLite's row (no arena copy,
 * no quarantine probe, no other column): the census's whole read.  A
 * read failure inside a write transaction rolls it back, as in scan; fn
 * stopping the visit does not. */
static ks_err op_visit_values(void *self, ks_rowstore_value_fn fn, void *arg)
{
    sqlite_store *s = self;
    if (s == NULL || fn == NULL)
        return KS_ERR_INVALID_ARGUMENT;
    sqlite3_stmt *st = s->st[ST_VALUES];
    assert(st != NULL);
    ks_err err = KS_OK;
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        ks_value v;
        err = column_view(st, 0, 1, &v);
        if (err != KS_OK)
            break; /* the store's failure */
        err = fn(arg, &v);
        if (err != KS_OK) {
            sqlite3_reset(st); /* the caller's stop: its transaction stands */
            return err;
        }
    }
    if (err == KS_OK && rc != SQLITE_DONE)
        err = ks_sqlite_map_rc(rc);
    sqlite3_reset(st);
    if (err != KS_OK && s->in_txn)
        rollback_now(s);
    return err;
}

/* ops.count: SELECT count(*) of the target table. */
static ks_err op_count(void *self, uint64_t *n)
{
    sqlite_store *s = self;
    if (s == NULL || n == NULL)
        return KS_ERR_INVALID_ARGUMENT;
    sqlite3_stmt *st = s->st[ST_COUNT];
    int rc = sqlite3_step(st);
    ks_err err = KS_OK;
    if (rc == SQLITE_ROW) {
        int64_t c = sqlite3_column_int64(st, 0);
        *n = c < 0 ? 0 : (uint64_t)c;
    } else {
        err = ks_sqlite_map_rc(rc == SQLITE_DONE ? SQLITE_ERROR : rc);
    }
    sqlite3_reset(st);
    if (err != KS_OK && s->in_txn)
        rollback_now(s);
    return err;
}

/* ops.begin: BEGIN IMMEDIATE, waiting through the busy handler. */
/* The write gate, inside a just-begun write transaction (so under the
 * write lock): KS_OK when there is none or its SELECT returns the integer
 * 1 in its first row; KS_ERR_STOPPED when it returns anything else or no
 * row; a store error otherwise. */
static ks_err check_gate(sqlite_store *s)
{
    sqlite3_stmt *st = s->st[ST_GATE];
    if (st == NULL)
        return KS_OK;
    int rc = sqlite3_step(st);
    int open = rc == SQLITE_ROW && sqlite3_column_type(st, 0) == SQLITE_INTEGER &&
               sqlite3_column_int64(st, 0) == 1;
    sqlite3_reset(st);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE)
        return ks_sqlite_map_rc(rc);
    return open ? KS_OK : KS_ERR_STOPPED;
}

static ks_err op_begin(void *self)
{
    sqlite_store *s = self;
    if (s == NULL || s->read_only || s->in_txn || !sqlite3_get_autocommit(s->db))
        return KS_ERR_INVALID_ARGUMENT;
    int rc = run_simple(s, ST_BEGIN);
    if (rc != SQLITE_OK) {
        rollback_now(s);
        return ks_sqlite_map_rc(rc);
    }
    s->in_txn = 1;
    ks_err err = check_gate(s);
    if (err != KS_OK)
        rollback_now(s);
    return err;
}

/* Nonzero when a write operation may run: a writable store inside begin(). */
static int writable(const sqlite_store *s)
{
    return s != NULL && !s->read_only && s->in_txn;
}

/* ops.cas: UPDATE t SET col = new WHERE id = ? AND col IS old; swapped
 * when exactly that row changed. */
static ks_err op_cas(void *self, const ks_value *id, const ks_value *old, ks_bytes new_value,
                     int *swapped)
{
    sqlite_store *s = self;
    if (!writable(s) || !value_ok(id) || id->type == KS_VALUE_NULL || !value_ok(old) ||
        swapped == NULL || (new_value.ptr == NULL && new_value.len > 0))
        return KS_ERR_INVALID_ARGUMENT;
    *swapped = 0;
    sqlite3_stmt *st = s->st[ST_CAS];
    int rc = bind_bytes(st, 1, new_value, s->as_text, BIND_VIEW);
    if (rc == SQLITE_OK)
        rc = bind_value(st, 2, id, BIND_VIEW);
    if (rc == SQLITE_OK)
        rc = bind_value(st, 3, old, BIND_VIEW);
    rc = run_write(s, st, rc);
    if (rc != SQLITE_OK)
        return fail_txn(s, rc);
    int changes = sqlite3_changes(s->db);
    assert(changes == 0 || changes == 1); /* the id is unique */
    *swapped = changes == 1;
    return KS_OK;
}

/* Current Unix seconds. */
static int64_t unix_now(void)
{
    return (int64_t)time(NULL);
}

/* ops.quarantine: record the row's id with an error name and the bound
 * migration's parameters; an entry of the same migration stands as it is,
 * one of another (a row that failed again under new parameters) is
 * taken over by this one. */
static ks_err op_quarantine(void *self, const ks_value *id, const char *error)
{
    sqlite_store *s = self;
    if (!writable(s) || !value_ok(id) || id->type == KS_VALUE_NULL || error == NULL ||
        error[0] == '\0' || strlen(error) > ERROR_NAME_MAX)
        return KS_ERR_INVALID_ARGUMENT;
    sqlite3_stmt *st = s->st[ST_QUARANTINE];
    int rc = sqlite3_bind_text(st, 1, s->table, -1, SQLITE_STATIC);
    if (rc == SQLITE_OK)
        rc = sqlite3_bind_text(st, 2, s->column, -1, SQLITE_STATIC);
    if (rc == SQLITE_OK)
        rc = bind_value(st, 3, id, BIND_VIEW);
    if (rc == SQLITE_OK)
        rc = sqlite3_bind_text(st, 4, error, -1, SQLITE_TRANSIENT);
    if (rc == SQLITE_OK)
        rc = sqlite3_bind_int64(st, 5, unix_now());
    if (rc == SQLITE_OK && s->mig != NULL)
        rc = sqlite3_bind_text(st, 6, s->mig, (int)s->mig_len, SQLITE_STATIC);
    rc = run_write(s, st, rc);
    if (rc != SQLITE_OK)
        return fail_txn(s, rc);
    return KS_OK;
}

static int bind_target(sqlite_store *s, sqlite3_stmt *st, int i);

/* ops.bind_migration: keep a copy of params (see rowstore.h). */
static ks_err op_bind_migration(void *self, ks_bytes params)
{
    sqlite_store *s = self;
    if (s == NULL || params.len > KS_ROWSTORE_PARAMS_MAX || (params.len != 0 && params.ptr == NULL))
        return KS_ERR_INVALID_ARGUMENT;
    char *copy = NULL;
    if (params.ptr != NULL) {
        copy = malloc(params.len + 1);
        if (copy == NULL)
            return KS_ERR_NO_MEMORY;
        memcpy(copy, params.ptr, params.len);
        copy[params.len] = '\0';
    }
    free(s->mig);
    s->mig = copy;
    s->mig_len = params.len;
    return KS_OK;
}

/* ops.quarantine_list: step the target's entries in id order. */
static ks_err op_quarantine_list(void *self, ks_rowstore_quarantine_fn fn, void *arg)
{
    sqlite_store *s = self;
    if (s == NULL || fn == NULL || s->in_txn)
        return KS_ERR_INVALID_ARGUMENT;
    if (s->st[ST_QCHECK] == NULL)
        return KS_OK; /* read-only, no keyshift tables: nothing was ever quarantined */
    sqlite3_stmt *st = NULL;
    int rc = ks_sqls_prepare(s->db,
                     s->q_params ? "SELECT id, error, params, time FROM main.keyshift_quarantine "
                                   "WHERE tbl = ?1 AND col = ?2 ORDER BY id"
                                 : "SELECT id, error, NULL, time FROM main.keyshift_quarantine "
                                   "WHERE tbl = ?1 AND col = ?2 ORDER BY id",
                     0, &st);
    if (rc == SQLITE_OK)
        rc = bind_target(s, st, 1);
    ks_err err = KS_OK;
    while (rc == SQLITE_OK && err == KS_OK && (rc = sqlite3_step(st)) == SQLITE_ROW) {
        ks_quarantine_entry e;
        ks_value error, params;
        memset(&e, 0, sizeof e);
        err = column_view(st, 0, 0, &e.id);
        if (err == KS_OK)
            err = column_view(st, 1, 0, &error);
        if (err == KS_OK)
            err = column_view(st, 2, 0, &params);
        if (err == KS_OK && (e.id.type == KS_VALUE_NULL || error.type != KS_VALUE_TEXT ||
                             error.bytes.len == 0 || error.bytes.len > ERROR_NAME_MAX ||
                             (params.type != KS_VALUE_NULL && params.type != KS_VALUE_TEXT) ||
                             sqlite3_column_type(st, 3) != SQLITE_INTEGER))
            err = KS_ERR_STORE; /* not what op_quarantine writes */
        if (err != KS_OK)
            break;
        e.error = error.bytes;
        e.params = params.type == KS_VALUE_TEXT ? params.bytes : (ks_bytes){NULL, 0};
        e.time = sqlite3_column_int64(st, 3);
        rc = fn(arg, &e) != 0 ? SQLITE_DONE : SQLITE_OK;
    }
    sqlite3_finalize(st);
    if (err != KS_OK)
        return err;
    return rc == SQLITE_DONE ? KS_OK : ks_sqlite_map_rc(rc);
}

/* ops.quarantine_release: DELETE the target's entries sel selects. */
static ks_err op_quarantine_release(void *self, const ks_quarantine_select *sel,
                                    uint64_t *released)
{
    sqlite_store *s = self;
    if (!writable(s) || sel == NULL || released == NULL ||
        (!sel->all && sel->id == NULL && sel->error == NULL) ||
        (sel->id != NULL && (!value_ok(sel->id) || sel->id->type == KS_VALUE_NULL)))
        return KS_ERR_INVALID_ARGUMENT;
    *released = 0;
    sqlite3_stmt *st = NULL;
    int rc = ks_sqls_prepare(s->db,
                     "DELETE FROM main.keyshift_quarantine WHERE tbl = ?1 AND col = ?2 "
                     "AND (?3 IS NULL OR id = ?3) AND (?4 IS NULL OR error = ?4)",
                     0, &st);
    if (rc == SQLITE_OK)
        rc = bind_target(s, st, 1);
    if (rc == SQLITE_OK && sel->id != NULL)
        rc = bind_value(st, 3, sel->id, BIND_VIEW);
    if (rc == SQLITE_OK && sel->error != NULL)
        rc = sqlite3_bind_text(st, 4, sel->error, -1, SQLITE_STATIC);
    if (rc == SQLITE_OK)
        rc = sqlite3_step(st);
    if (rc == SQLITE_DONE) {
        *released = (uint64_t)sqlite3_changes64(s->db);
        rc = SQLITE_OK;
    }
    sqlite3_finalize(st);
    return rc == SQLITE_OK ? KS_OK : fail_txn(s, rc);
}

/* Nonzero when every count of cp fits an SQLite INTEGER. */
static int counts_fit(const ks_checkpoint *cp)
{
    return cp->done <= INT64_MAX && cp->skipped <= INT64_MAX && cp->raced <= INT64_MAX &&
           cp->quarantined <= INT64_MAX && cp->wrong_state <= INT64_MAX;
}

/* Bind the store's table and column (schema spellings) at parameters i
 * and i + 1: checkpoints are scoped to the target column. */
static int bind_target(sqlite_store *s, sqlite3_stmt *st, int i)
{
    int rc = sqlite3_bind_text(st, i, s->table, -1, SQLITE_STATIC);
    if (rc == SQLITE_OK)
        rc = sqlite3_bind_text(st, i + 1, s->column, -1, SQLITE_STATIC);
    return rc;
}

/* ops.checkpoint_save: INSERT OR REPLACE the row of (target, cp->params). */
static ks_err op_checkpoint_save(void *self, const ks_checkpoint *cp)
{
    sqlite_store *s = self;
    if (!writable(s) || cp == NULL || cp->params.ptr == NULL || cp->params.len == 0 ||
        cp->state.ptr == NULL || cp->state.len == 0 || !value_ok(&cp->cursor) || !counts_fit(cp))
        return KS_ERR_INVALID_ARGUMENT;
    sqlite3_stmt *st = s->st[ST_CP_SAVE];
    const int64_t counts[] = {(int64_t)cp->pass,        (int64_t)cp->done,
                              (int64_t)cp->skipped,     (int64_t)cp->raced,
                              (int64_t)cp->quarantined, (int64_t)cp->wrong_state,
                              cp->started,              cp->updated,
                              cp->finished};
    int rc = bind_bytes(st, 1, cp->params, 1, BIND_VIEW);
    if (rc == SQLITE_OK)
        rc = bind_bytes(st, 2, cp->state, 1, BIND_VIEW);
    if (rc == SQLITE_OK)
        rc = bind_value(st, 3, &cp->cursor, BIND_VIEW);
    for (int i = 0; rc == SQLITE_OK && i < (int)(sizeof counts / sizeof counts[0]); i++)
        rc = sqlite3_bind_int64(st, 4 + i, counts[i]);
    if (rc == SQLITE_OK)
        rc = bind_target(s, st, 13);
    rc = run_write(s, st, rc);
    if (rc != SQLITE_OK)
        return fail_txn(s, rc);
    return KS_OK;
}

/* Read the checkpoint row under st's cursor into cp (views into the
 * arena, fixed up by the caller).  KS_ERR_STORE for a malformed row. */
ks_err ks_sqls_read_checkpoint(sqlite_store *s, sqlite3_stmt *st, ks_checkpoint *cp)
{
    ks_value params, state;
    memset(cp, 0, sizeof *cp);
    if (sqlite3_column_type(st, 0) != SQLITE_TEXT || sqlite3_column_type(st, 1) != SQLITE_TEXT)
        return KS_ERR_STORE;
    ks_err err = read_value(s, st, 0, 0, &params);
    if (err == KS_OK)
        err = read_value(s, st, 1, 0, &state);
    if (err == KS_OK)
        err = read_value(s, st, 2, 0, &cp->cursor);
    if (err != KS_OK)
        return err;
    int64_t v[9];
    for (int i = 0; i < 9; i++) {
        if (sqlite3_column_type(st, 3 + i) != SQLITE_INTEGER)
            return KS_ERR_STORE;
        v[i] = sqlite3_column_int64(st, 3 + i);
        if (i < 6 && v[i] < 0)
            return KS_ERR_STORE;
    }
    if (v[0] > (int64_t)UINT32_MAX)
        return KS_ERR_STORE;
    cp->pass = (uint32_t)v[0];
    cp->done = (uint64_t)v[1];
    cp->skipped = (uint64_t)v[2];
    cp->raced = (uint64_t)v[3];
    cp->quarantined = (uint64_t)v[4];
    cp->wrong_state = (uint64_t)v[5];
    cp->started = v[6];
    cp->updated = v[7];
    cp->finished = v[8];
    fix_view(s, &params);
    fix_view(s, &state);
    fix_view(s, &cp->cursor);
    cp->params = params.bytes;
    cp->state = state.bytes;
    return KS_OK;
}

/* ops.checkpoint_load: the checkpoint of params, or the most recently
 * updated one for params {NULL, 0}; KS_ERR_NOT_FOUND when none (also when
 * a read-only store's database has no keyshift tables). */
static ks_err op_checkpoint_load(void *self, ks_bytes params, ks_checkpoint *cp)
{
    sqlite_store *s = self;
    if (s == NULL || cp == NULL || (params.ptr == NULL && params.len > 0))
        return KS_ERR_INVALID_ARGUMENT;
    int latest = params.ptr == NULL;
    sqlite3_stmt *st = s->st[latest ? ST_CP_LATEST : ST_CP_LOAD];
    if (st == NULL)
        return KS_ERR_NOT_FOUND; /* read-only, tables absent */
    int rc = latest ? SQLITE_OK : bind_bytes(st, 1, params, 1, BIND_COPY); /* the arena is reused below */
    if (rc == SQLITE_OK)
        rc = bind_target(s, st, 2);
    ks_err err = KS_OK;
    if (rc == SQLITE_OK)
        rc = sqlite3_step(st);
    s->arena_len = 0;
    if (rc == SQLITE_ROW)
        err = ks_sqls_read_checkpoint(s, st, cp);
    else if (rc == SQLITE_DONE)
        err = KS_ERR_NOT_FOUND;
    else
        err = ks_sqlite_map_rc(rc);
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
    if (err != KS_OK && err != KS_ERR_NOT_FOUND && s->in_txn)
        rollback_now(s);
    return err;
}

/* ops.commit: COMMIT; on failure the transaction is rolled back. */
static ks_err op_commit(void *self)
{
    sqlite_store *s = self;
    if (!writable(s))
        return KS_ERR_INVALID_ARGUMENT;
    int rc = run_simple(s, ST_COMMIT);
    if (rc != SQLITE_OK)
        return fail_txn(s, rc);
    assert(sqlite3_get_autocommit(s->db));
    s->in_txn = 0;
    return KS_OK;
}

/* ops.rollback: roll back an open transaction; a no-op outside one. */
static void op_rollback(void *self)
{
    sqlite_store *s = self;
    if (s != NULL)
        rollback_now(s);
}

/* Release everything of s: statements, connection (rolling back), names,
 * arena.  Used by close and by a failed open. */
void ks_sqls_store_free(sqlite_store *s)
{
    if (s == NULL)
        return;
    if (s->db != NULL)
        rollback_now(s);
    for (int i = 0; i < ST_N; i++)
        sqlite3_finalize(s->st[i]);
    if (s->db != NULL) {
        int rc = sqlite3_close_v2(s->db);
        assert(rc == SQLITE_OK);
        (void)rc;
    }
    free(s->table);
    free(s->column);
    free(s->mig);
    free(s->arena);
    free(s);
}

/* ops.close: roll back any open transaction and release the store. */
static void op_close(void *self)
{
    ks_sqls_store_free(self);
}

const ks_rowstore_ops ks_sqls_ops = {
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
    .visit_values = op_visit_values,
    .visit_rows = op_visit_rows,
    .visit_rows_range = op_visit_rows_range,
    .bind_migration = op_bind_migration,
    .quarantine_list = op_quarantine_list,
    .quarantine_release = op_quarantine_release,
};

/* ---- hooks on an open store ----------------------------------------------------- */

/* See rowstore.h. */
ks_err ks_rowstore_sqlite_set_write_gate(const ks_rowstore *store, const char *sql)
{
    if (store == NULL || store->ops != &ks_sqls_ops || store->self == NULL)
        return KS_ERR_INVALID_ARGUMENT;
    sqlite_store *s = store->self;
    if (s->read_only || s->in_txn)
        return KS_ERR_INVALID_ARGUMENT;
    sqlite3_finalize(s->st[ST_GATE]);
    s->st[ST_GATE] = NULL;
    if (sql == NULL)
        return KS_OK;
    return ks_sqls_prepare(s->db, sql, 1, &s->st[ST_GATE]) == SQLITE_OK ? KS_OK : KS_ERR_STORE;
}

#ifdef KS_TEST_HOOKS
/* See sqlite_store.h. */
ks_err ks_rowstore_sqlite_test_pragma(const ks_rowstore *store, const char *name, int64_t *out)
{
    if (store == NULL || store->ops != &ks_sqls_ops || store->self == NULL || name == NULL ||
        strspn(name, "abcdefghijklmnopqrstuvwxyz_") != strlen(name))
        return KS_ERR_INVALID_ARGUMENT;
    sqlite_store *s = store->self;
    char sql[80];
    snprintf(sql, sizeof sql, "PRAGMA main.%s", name);
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(s->db, sql, -1, &st, NULL);
    if (rc == SQLITE_OK && (rc = sqlite3_step(st)) == SQLITE_ROW) {
        *out = sqlite3_column_int64(st, 0);
        rc = SQLITE_OK;
    }
    sqlite3_finalize(st);
    return rc == SQLITE_OK ? KS_OK : KS_ERR_STORE;
}

/* See sqlite_store.h. */
ks_err ks_rowstore_sqlite_test_max_pages(const ks_rowstore *store, uint32_t pages)
{
    if (store == NULL || store->ops != &ks_sqls_ops || store->self == NULL)
        return KS_ERR_INVALID_ARGUMENT;
    sqlite_store *s = store->self;
    char sql[64];
    snprintf(sql, sizeof sql, "PRAGMA max_page_count = %u", (unsigned)pages);
    return sqlite3_exec(s->db, sql, NULL, NULL, NULL) == SQLITE_OK ? KS_OK : KS_ERR_STORE;
}
#endif
