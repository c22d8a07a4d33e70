/*
 * migrate/store/sqlite/sqlite_store.c -- the SQLite row store (keyshift/rowstore.h).
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
#include "sqlite_util.h"
#include "../../alloc_hook.h"

/* The longest identifier or error name accepted. */
#define IDENT_MAX 1024u
/* The longest error name recorded in quarantine. */
#define ERROR_NAME_MAX 128u

/* The prepared statements kept for the store's life. */
enum {
    ST_SCAN_FIRST,
    ST_SCAN_AFTER,
    ST_SCAN_RANGE,  /* visit_rows_range: ids in [?2, ?6], integers only */
    ST_VALUES,
    ST_QCHECK,
    ST_QCHECK_MIG,  /* ST_QCHECK of a bound migration: its entries, or legacy ones */
    ST_COUNT,
    ST_CAS,
    ST_QUARANTINE,
    ST_CP_SAVE,
    ST_CP_LOAD,
    ST_CP_LATEST,
    ST_BEGIN,
    ST_COMMIT,
    ST_ROLLBACK,
    ST_GATE,        /* ks_rowstore_sqlite_set_write_gate; NULL without a gate */
    ST_N
};

/* One SQLite store. */
typedef struct sqlite_store {
    sqlite3 *db;
    sqlite3_stmt *st[ST_N];   /* NULL where not prepared (read-only, no tables) */
    int read_only;
    int in_txn;               /* a write transaction begun by begin() is open */
    char *table;              /* schema spelling, for keyshift_quarantine.tbl */
    char *column;             /* schema spelling, for keyshift_quarantine.col */
    size_t n_context;
    int as_text;              /* a base64 column: new values are bound as TEXT */
    int q_params;             /* keyshift_quarantine has its params column */
    char *mig;                /* bind_migration's parameters (NULL: unbound) */
    size_t mig_len;
    ks_sqlite_busy busy;      /* busy handler state (sqlite_util.h) */
    /* the one buffer every view points into */
    uint8_t *arena;
    size_t arena_len, arena_cap;
} sqlite_store;

/* A growing string for building SQL. */
typedef struct sbuf {
    char *p;
    size_t len, cap;
    int failed;               /* an allocation failed: p is unusable */
} sbuf;

/* What the schema says about one column. */
typedef struct colinfo {
    int found;
    int cid;
    char *name;               /* schema spelling (malloc'd) */
    char *type;               /* declared type (malloc'd) */
    int notnull, pk, hidden;
} colinfo;

/* The empty (present) view of a zero-length TEXT or BLOB. */
static const uint8_t empty_bytes[1] = {0};

/* ---- errors ---------------------------------------------------------------- */

/* ---- SQL text ----------------------------------------------------------------- */

/* Append n bytes to b (keeping a NUL after them). */
static void sb_putn(sbuf *b, const char *p, size_t n)
{
    if (b->failed)
        return;
    if (n > SIZE_MAX / 2 - b->len - 1) {
        b->failed = 1;
        return;
    }
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *np = realloc(b->p, cap);
        if (np == NULL) {
            b->failed = 1;
            return;
        }
        b->p = np;
        b->cap = cap;
    }
    memcpy(b->p + b->len, p, n);
    b->len += n;
    b->p[b->len] = '\0';
}

/* Append a C string to b. */
static void sb_put(sbuf *b, const char *s)
{
    sb_putn(b, s, strlen(s));
}

/* Append name as a quoted SQL identifier: "..." with every '"' doubled.
 * Only names taken from the schema are ever given here. */
static void sb_ident(sbuf *b, const char *name)
{
    sb_putn(b, "\"", 1);
    for (const char *p = name; *p != '\0'; p++) {
        sb_putn(b, p, 1);
        if (*p == '"')
            sb_putn(b, "\"", 1);
    }
    sb_putn(b, "\"", 1);
}

/* Prepare sql (persistent when kept for the store's life). */
static int prepare(sqlite3 *db, const char *sql, int persistent, sqlite3_stmt **out)
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
    int rc = prepare(s->db,
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
    int rc = prepare(s->db,
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
static ks_err read_checkpoint(sqlite_store *s, sqlite3_stmt *st, ks_checkpoint *cp)
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
        err = read_checkpoint(s, st, cp);
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
static void store_free(sqlite_store *s)
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
    store_free(self);
}

static const ks_rowstore_ops sqlite_ops = {
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

/* ---- opening: the schema ------------------------------------------------------------ */

/* The context of an open: the store being built and where messages go. */
typedef struct opener {
    sqlite_store *s;
    char *errbuf;
    size_t errbuf_len;
    char tname[96];           /* the table name, printable, for messages */
} opener;

/* Report an SQLite failure during open (sqlite_util.h). */
static ks_err open_fail_rc(opener *o, int rc, const char *what)
{
    return ks_sqlite_fail_rc(o->errbuf, o->errbuf_len, rc, what);
}

/* strdup that reports allocation failure as NULL for a NULL input too. */
static char *dup_str(const char *p)
{
    if (p == NULL)
        p = "";
    size_t n = strlen(p) + 1;
    char *d = malloc(n);
    if (d != NULL)
        memcpy(d, p, n);
    return d;
}

/* Free the strings of c and clear it. */
static void colinfo_free(colinfo *c)
{
    free(c->name);
    free(c->type);
    memset(c, 0, sizeof *c);
}

/* Look up table in sqlite_master (name bound, compared as SQLite compares
 * identifiers); on success *schema_name is its spelling (malloc'd) and
 * *is_view tells a view. */
static ks_err find_table(opener *o, const char *table, char **schema_name, int *is_view)
{
    static const char sql[] = "SELECT name, type FROM main.sqlite_master "
                              "WHERE type IN ('table', 'view') AND name = ?1 COLLATE NOCASE";
    sqlite3_stmt *st;
    int rc = prepare(o->s->db, sql, 0, &st);
    if (rc == SQLITE_OK)
        rc = sqlite3_bind_text(st, 1, table, -1, SQLITE_STATIC);
    if (rc == SQLITE_OK)
        rc = sqlite3_step(st);
    ks_err err = KS_OK;
    *schema_name = NULL;
    if (rc == SQLITE_ROW) {
        *schema_name = dup_str((const char *)sqlite3_column_text(st, 0));
        const char *type = (const char *)sqlite3_column_text(st, 1);
        *is_view = type != NULL && strcmp(type, "view") == 0;
        if (*schema_name == NULL)
            err = ks_sqlite_fail(o->errbuf, o->errbuf_len, KS_ERR_NO_MEMORY, "out of memory");
    } else if (rc == SQLITE_DONE) {
        err = ks_sqlite_fail(o->errbuf, o->errbuf_len, KS_ERR_NO_TARGET, "no table \"%s\" in the database",
                   o->tname);
    } else {
        err = open_fail_rc(o, rc, "reading the schema");
    }
    sqlite3_finalize(st);
    return err;
}

/* Look up column name of the target table (pragma_table_xinfo, both names
 * bound) into *c; c->found is 0 when there is none. */
static ks_err find_column(opener *o, const char *name, colinfo *c)
{
    static const char sql[] = "SELECT cid, name, type, \"notnull\", pk, hidden "
                              "FROM pragma_table_xinfo(?1, 'main') WHERE name = ?2 COLLATE NOCASE";
    memset(c, 0, sizeof *c);
    sqlite3_stmt *st;
    int rc = prepare(o->s->db, sql, 0, &st);
    if (rc == SQLITE_OK)
        rc = sqlite3_bind_text(st, 1, o->s->table, -1, SQLITE_STATIC);
    if (rc == SQLITE_OK)
        rc = sqlite3_bind_text(st, 2, name, -1, SQLITE_STATIC);
    if (rc == SQLITE_OK)
        rc = sqlite3_step(st);
    ks_err err = KS_OK;
    if (rc == SQLITE_ROW) {
        c->found = 1;
        c->cid = sqlite3_column_int(st, 0);
        c->name = dup_str((const char *)sqlite3_column_text(st, 1));
        c->type = dup_str((const char *)sqlite3_column_text(st, 2));
        c->notnull = sqlite3_column_int(st, 3);
        c->pk = sqlite3_column_int(st, 4);
        c->hidden = sqlite3_column_int(st, 5);
        if (c->name == NULL || c->type == NULL)
            err = ks_sqlite_fail(o->errbuf, o->errbuf_len, KS_ERR_NO_MEMORY, "out of memory");
    } else if (rc != SQLITE_DONE) {
        err = open_fail_rc(o, rc, "reading the table's columns");
    }
    sqlite3_finalize(st);
    return err;
}

/* Look up a column that must exist: KS_ERR_NO_TARGET naming it (and its
 * role) otherwise. */
static ks_err need_column(opener *o, const char *name, const char *role, colinfo *c)
{
    ks_err err = find_column(o, name, c);
    if (err == KS_OK && !c->found) {
        char pname[96];
        err = ks_sqlite_fail(o->errbuf, o->errbuf_len, KS_ERR_NO_TARGET, "no %s column \"%s\" in table \"%s\"",
                   role, ks_sqlite_printable(name, pname, sizeof pname), o->tname);
    }
    return err;
}

/* Run a query on the target table (bound as ?1, the integer arg as ?2)
 * that returns one integer into *out. */
static ks_err query_int(opener *o, const char *sql, int64_t arg, int64_t *out)
{
    sqlite3_stmt *st;
    int rc = prepare(o->s->db, sql, 0, &st);
    if (rc == SQLITE_OK && sqlite3_bind_parameter_count(st) >= 1)
        rc = sqlite3_bind_text(st, 1, o->s->table, -1, SQLITE_STATIC);
    if (rc == SQLITE_OK && sqlite3_bind_parameter_count(st) >= 2)
        rc = sqlite3_bind_int64(st, 2, arg);
    if (rc == SQLITE_OK)
        rc = sqlite3_step(st);
    ks_err err = KS_OK;
    if (rc == SQLITE_ROW)
        *out = sqlite3_column_int64(st, 0);
    else
        err = open_fail_rc(o, rc == SQLITE_DONE ? SQLITE_ERROR : rc, "reading the schema");
    sqlite3_finalize(st);
    return err;
}

/* The column id (cid) of the target's INTEGER PRIMARY KEY, the alias of
 * its rowid, into *cid; -1 when it has none.  The alias is the table's
 * only primary-key column, declared INTEGER, with no separate
 * primary-key index (which "INTEGER PRIMARY KEY DESC" and WITHOUT ROWID
 * tables have).  Unlike the bare rowid, VACUUM and a dump/restore keep
 * its values. */
static ks_err rowid_alias_cid(opener *o, int64_t *cid)
{
    static const char q[] =
        "SELECT coalesce((SELECT cid FROM pragma_table_xinfo(?1, 'main') "
        "WHERE pk > 0 AND upper(type) = 'INTEGER' "
        "AND (SELECT count(*) FROM pragma_table_xinfo(?1, 'main') WHERE pk > 0) = 1 "
        "AND NOT EXISTS (SELECT 1 FROM pragma_index_list(?1, 'main') WHERE origin = 'pk')), -1)";
    return query_int(o, q, 0, cid);
}

/* Set *ok when id (a column of the target) is a valid id: the rowid
 * alias (rowid_alias_cid), or NOT NULL with a full unique index on
 * exactly that column (a WITHOUT ROWID table's one-column primary key
 * is one: SQLite makes it NOT NULL). */
static ks_err check_id_column(opener *o, const colinfo *id, int *ok)
{
    static const char unique_index[] =
        "SELECT count(*) FROM pragma_index_list(?1, 'main') AS il "
        "WHERE il.\"unique\" = 1 AND il.partial = 0 "
        "AND (SELECT count(*) FROM pragma_index_info(il.name, 'main')) = 1 "
        "AND (SELECT cid FROM pragma_index_info(il.name, 'main')) = ?2";
    int64_t alias = -1, n_unique = 0;
    *ok = 0;
    ks_err err = rowid_alias_cid(o, &alias);
    if (err == KS_OK)
        err = query_int(o, unique_index, id->cid, &n_unique);
    if (err != KS_OK)
        return err;
    *ok = id->cid == alias || (id->notnull && n_unique > 0);
    return KS_OK;
}

/* Without an id column: pick a rowid alias no column shadows (rowid,
 * _rowid_, oid) and check the table has a rowid (not WITHOUT ROWID). */
static ks_err pick_rowid(opener *o, const char **alias)
{
    static const char *const names[] = {"rowid", "_rowid_", "oid"};
    *alias = NULL;
    for (size_t i = 0; i < sizeof names / sizeof names[0] && *alias == NULL; i++) {
        colinfo c;
        ks_err err = find_column(o, names[i], &c);
        int found = c.found;
        colinfo_free(&c);
        if (err != KS_OK)
            return err;
        if (!found)
            *alias = names[i];
    }
    if (*alias == NULL)
        return ks_sqlite_fail(o->errbuf, o->errbuf_len, KS_ERR_INVALID_ARGUMENT,
                    "columns of table \"%s\" hide its rowid: give an id column", o->tname);
    sbuf b = {0};
    sb_put(&b, "SELECT ");
    sb_put(&b, *alias);
    sb_put(&b, " FROM main.");
    sb_ident(&b, o->s->table);
    if (b.failed) {
        free(b.p);
        return ks_sqlite_fail(o->errbuf, o->errbuf_len, KS_ERR_NO_MEMORY, "out of memory");
    }
    sqlite3_stmt *st;
    int rc = prepare(o->s->db, b.p, 0, &st);
    sqlite3_finalize(st);
    free(b.p);
    if (rc != SQLITE_OK && (rc & 0xff) == SQLITE_ERROR)
        return ks_sqlite_fail(o->errbuf, o->errbuf_len, KS_ERR_INVALID_ARGUMENT,
                    "table \"%s\" has no rowid (WITHOUT ROWID): name its primary key as the "
                    "id column", o->tname);
    return rc == SQLITE_OK ? KS_OK : open_fail_rc(o, rc, "reading the schema");
}

/* Nonzero when name is a table keyshift or SQLite reserves (the target
 * must be an application table). */
static int reserved_table(const char *name)
{
    return sqlite3_strnicmp(name, "sqlite_", 7) == 0 || sqlite3_strnicmp(name, "keyshift_", 9) == 0;
}

/* ---- opening: keyshift's own tables ------------------------------------------------- */

const char ks_sqlite_schema_sql[] =
    "CREATE TABLE IF NOT EXISTS main.keyshift_meta(key TEXT PRIMARY KEY, value);"
    "INSERT OR IGNORE INTO main.keyshift_meta(key, value) VALUES('schema_version', 1);"
    "CREATE TABLE IF NOT EXISTS main.keyshift_migration("
    " tbl TEXT NOT NULL, col TEXT NOT NULL,"
    " params TEXT NOT NULL, state TEXT NOT NULL, cursor, pass INTEGER NOT NULL,"
    " done INTEGER NOT NULL, skipped INTEGER NOT NULL, raced INTEGER NOT NULL,"
    " quarantined INTEGER NOT NULL, wrong_state INTEGER NOT NULL,"
    " started INTEGER NOT NULL, updated INTEGER NOT NULL, finished INTEGER NOT NULL,"
    " PRIMARY KEY (tbl, col, params));"
    "CREATE TABLE IF NOT EXISTS main.keyshift_quarantine("
    " tbl TEXT NOT NULL, col TEXT NOT NULL, id NOT NULL, error TEXT NOT NULL,"
    " time INTEGER NOT NULL, params TEXT, PRIMARY KEY (tbl, col, id));";

/* The index through which a run finds whether its migration has any
 * quarantined row (ST_QCHECK_MIG), created by every writable open. */
static const char quarantine_index_sql[] =
    "CREATE INDEX IF NOT EXISTS main.keyshift_quarantine_params "
    "ON keyshift_quarantine(tbl, col, params)";

/* How many of keyshift's three tables exist. */
static ks_err count_own_tables(opener *o, int64_t *n)
{
    return query_int(o,
                     "SELECT count(*) FROM main.sqlite_master WHERE type = 'table' AND name IN "
                     "('keyshift_meta', 'keyshift_migration', 'keyshift_quarantine')",
                     0, n);
}

/* Refuse a database whose keyshift tables are of a newer schema version
 * (when keyshift_meta exists). */
static ks_err check_schema_version(opener *o)
{
    int64_t has_meta = 0, version = 0;
    ks_err err = query_int(o,
                           "SELECT count(*) FROM main.sqlite_master "
                           "WHERE type = 'table' AND name = 'keyshift_meta'",
                           0, &has_meta);
    if (err != KS_OK || has_meta == 0)
        return err;
    err = query_int(o,
                    "SELECT coalesce(max(value), 0) FROM main.keyshift_meta "
                    "WHERE key = 'schema_version'",
                    0, &version);
    if (err == KS_OK && version > KS_SQLITE_SCHEMA_LATEST)
        err = ks_sqlite_fail(o->errbuf, o->errbuf_len, KS_ERR_STORE,
                   "keyshift tables are of schema version %lld, newer than this keyshift (%d)",
                   (long long)version, KS_SQLITE_SCHEMA_LATEST);
    return err;
}

/* Create the keyshift tables in one BEGIN IMMEDIATE transaction (the busy
 * handler applies), rolling back on any failure. */
static ks_err create_own_tables(opener *o)
{
    sqlite3 *db = o->s->db;
    int rc = sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL);
    if (rc == SQLITE_OK)
        rc = sqlite3_exec(db, ks_sqlite_schema_sql, NULL, NULL, NULL);
    if (rc == SQLITE_OK)
        rc = sqlite3_exec(db, "COMMIT", NULL, NULL, NULL);
    if (rc != SQLITE_OK) {
        if (!sqlite3_get_autocommit(db))
            (void)sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
        return open_fail_rc(o, rc, "creating the keyshift tables");
    }
    return KS_OK;
}

/* Whether keyshift_quarantine has its params column (*has). */
static ks_err quarantine_has_params(opener *o, int64_t *has)
{
    return query_int(o,
                     "SELECT count(*) FROM pragma_table_info('keyshift_quarantine', 'main') "
                     "WHERE name = 'params'",
                     0, has);
}

/*
 * Bring keyshift_quarantine up to date: a table created before quarantine
 * kept its migration's parameters gets the params column (its entries
 * NULL: they keep holding their rows back from every migration, until
 * released), and every table its index.  Unless read-only, in one BEGIN
 * IMMEDIATE transaction, the column checked again inside it (another
 * process may have added it meanwhile).  Read-only: only whether the
 * column is there (s->q_params).
 */
static ks_err upgrade_quarantine(opener *o)
{
    sqlite_store *s = o->s;
    int64_t has = 0, indexed = 0;
    ks_err err = quarantine_has_params(o, &has);
    if (err == KS_OK)
        err = query_int(o,
                        "SELECT count(*) FROM main.sqlite_master WHERE type = 'index' "
                        "AND name = 'keyshift_quarantine_params'",
                        0, &indexed);
    if (err != KS_OK || s->read_only || (has != 0 && indexed != 0)) {
        s->q_params = has != 0;
        return err;
    }
    int rc = sqlite3_exec(s->db, "BEGIN IMMEDIATE", NULL, NULL, NULL);
    if (rc != SQLITE_OK)
        return open_fail_rc(o, rc, "upgrading keyshift_quarantine");
    err = quarantine_has_params(o, &has);
    if (err == KS_OK && has == 0)
        rc = sqlite3_exec(s->db, "ALTER TABLE main.keyshift_quarantine ADD COLUMN params TEXT",
                          NULL, NULL, NULL);
    if (err == KS_OK && rc == SQLITE_OK)
        rc = sqlite3_exec(s->db, quarantine_index_sql, NULL, NULL, NULL);
    if (err == KS_OK && rc == SQLITE_OK)
        rc = sqlite3_exec(s->db, "COMMIT", NULL, NULL, NULL);
    if (err == KS_OK && rc != SQLITE_OK)
        err = open_fail_rc(o, rc, "upgrading keyshift_quarantine");
    if (err != KS_OK && !sqlite3_get_autocommit(s->db))
        (void)sqlite3_exec(s->db, "ROLLBACK", NULL, NULL, NULL);
    s->q_params = err == KS_OK;
    return err;
}

/* Check the schema version and, unless read-only, create missing tables;
 * *have is nonzero when all three tables exist afterwards. */
static ks_err ensure_own_tables(opener *o, int *have)
{
    int64_t n = 0;
    ks_err err = check_schema_version(o);
    if (err == KS_OK)
        err = count_own_tables(o, &n);
    if (err == KS_OK && n < 3 && !o->s->read_only) {
        err = create_own_tables(o);
        if (err == KS_OK)
            err = check_schema_version(o); /* another process may have won */
        n = 3;
    }
    *have = n == 3;
    if (err == KS_OK && *have)
        err = upgrade_quarantine(o);
    return err;
}

/* ---- opening: statements ------------------------------------------------------------- */

/* The resolved target: schema spellings of every column used. */
typedef struct resolved {
    const char *id;           /* a column name or a rowid alias */
    int id_stable;            /* see ks_rowstore.id_stable */
    colinfo column, id_col, tenant;
    colinfo context[KS_ROWSTORE_MAX_CONTEXT_COLUMNS];
    size_t n_context;
} resolved;

/* Append " FROM main.<table> AS t" (the schema's spelling). */
static void sb_from(sbuf *b, const sqlite_store *s)
{
    sb_put(b, " FROM main.");
    sb_ident(b, s->table);
    sb_put(b, " AS t");
}

/* Append " ORDER BY t.<id>" (a schema spelling or a rowid alias). */
static void sb_order(sbuf *b, const resolved *r)
{
    sb_put(b, " ORDER BY t.");
    sb_ident(b, r->id);
}

/* The scans build_scan writes: from the start, after ?2, or the range
 * [?2, ?6] of integer ids. */
enum { SCAN_FIRST, SCAN_AFTER, SCAN_RANGE };

/* Append the scan statement: id, value, tenant (or NULL), context columns,
 * quarantine flag; after ?2 (SCAN_AFTER) or within [?2, ?6] (SCAN_RANGE),
 * limit ?1. */
static void build_scan(sbuf *b, const sqlite_store *s, const resolved *r, int have_tables,
                       int kind)
{
    sb_put(b, "SELECT t.");
    sb_ident(b, r->id);
    sb_put(b, ", t.");
    sb_ident(b, r->column.name);
    sb_put(b, ", ");
    if (r->tenant.found) {
        sb_put(b, "t.");
        sb_ident(b, r->tenant.name);
    } else {
        sb_put(b, "NULL");
    }
    for (size_t i = 0; i < r->n_context; i++) {
        sb_put(b, ", t.");
        sb_ident(b, r->context[i].name);
    }
    if (have_tables) {
        /* +t.id: no affinity, so q.id (stored with the id's own type) is
         * compared as is and the (tbl, col, id) index is used in full */
        /* ?5 says whether the target has any quarantined row at all (one
         * lookup per scan, scan_has_quarantine): when it has none, the
         * CASE skips the per-row probe, which is most of a census. */
        sb_put(b, ", CASE WHEN ?5 THEN EXISTS (SELECT 1 FROM main.keyshift_quarantine AS q "
                  "WHERE q.tbl = ?3 AND q.col = ?4 AND q.id = +t.");
        sb_ident(b, r->id);
        /* ?7: the bound migration (NULL: unbound, every entry counts); an
         * entry without params (an older table's) holds back every one */
        sb_put(b, s->q_params ? " AND (?7 IS NULL OR q.params IS NULL OR q.params = ?7)"
                                ") ELSE 0 END"
                              : ") ELSE 0 END");
    } else {
        sb_put(b, ", 0");
    }
    sb_from(b, s);
    if (kind != SCAN_FIRST) {
        sb_put(b, " WHERE t.");
        sb_ident(b, r->id);
        sb_put(b, kind == SCAN_AFTER ? " > ?2" : " >= ?2 AND t.");
    }
    if (kind == SCAN_RANGE) {
        /* typeof: in a TEXT-affinity id column the bounds compare as text,
         * and every id there is TEXT: no row of such a column is in a range */
        sb_ident(b, r->id);
        sb_put(b, " <= ?6 AND typeof(t.");
        sb_ident(b, r->id);
        sb_put(b, ") IN ('integer', 'real')");
    }
    sb_order(b, r);
    sb_put(b, " LIMIT ?1");
}

/* Append the values statement of visit_values: the target column alone,
 * every row in id order, in one statement. */
static void build_values(sbuf *b, const sqlite_store *s, const resolved *r)
{
    sb_put(b, "SELECT t.");
    sb_ident(b, r->column.name);
    sb_from(b, s);
    sb_order(b, r);
}

/* Prepare (persistently) the statement built in b into s->st[which]. */
static ks_err prepare_kept(opener *o, sbuf *b, int which)
{
    if (b->failed)
        return ks_sqlite_fail(o->errbuf, o->errbuf_len, KS_ERR_NO_MEMORY, "out of memory");
    int rc = prepare(o->s->db, b->p, 1, &o->s->st[which]);
    b->len = 0;
    if (rc != SQLITE_OK)
        return open_fail_rc(o, rc, "preparing the store's statements");
    return KS_OK;
}

/* Prepare a constant statement into s->st[which]. */
static ks_err prepare_const(opener *o, const char *sql, int which)
{
    sbuf b = {0};
    sb_put(&b, sql);
    ks_err err = prepare_kept(o, &b, which);
    free(b.p);
    return err;
}

/* Prepare every statement kept for the store's life: scans, values, count, and
 * (unless read-only) cas, quarantine, checkpoint save, transactions;
 * checkpoint loads when keyshift's tables exist. */
static ks_err prepare_statements(opener *o, const resolved *r, int have_tables)
{
    sqlite_store *s = o->s;
    sbuf b = {0};
    ks_err err;
    build_scan(&b, s, r, have_tables, SCAN_FIRST);
    err = prepare_kept(o, &b, ST_SCAN_FIRST);
    if (err == KS_OK) {
        build_scan(&b, s, r, have_tables, SCAN_AFTER);
        err = prepare_kept(o, &b, ST_SCAN_AFTER);
    }
    if (err == KS_OK) {
        build_scan(&b, s, r, have_tables, SCAN_RANGE);
        err = prepare_kept(o, &b, ST_SCAN_RANGE);
    }
    if (err == KS_OK) {
        build_values(&b, s, r);
        err = prepare_kept(o, &b, ST_VALUES);
    }
    if (err == KS_OK && have_tables)
        err = prepare_const(o,
                            "SELECT EXISTS (SELECT 1 FROM main.keyshift_quarantine WHERE tbl = ?1 "
                            "AND col = ?2)",
                            ST_QCHECK);
    if (err == KS_OK && have_tables && s->q_params)
        err = prepare_const(o,
                            "SELECT EXISTS (SELECT 1 FROM main.keyshift_quarantine WHERE tbl = ?1 "
                            "AND col = ?2 AND params = ?3) OR EXISTS (SELECT 1 FROM "
                            "main.keyshift_quarantine WHERE tbl = ?1 AND col = ?2 AND params IS "
                            "NULL)",
                            ST_QCHECK_MIG);
    if (err == KS_OK) {
        sb_put(&b, "SELECT count(*) FROM main.");
        sb_ident(&b, s->table);
        err = prepare_kept(o, &b, ST_COUNT);
    }
    if (err == KS_OK && !s->read_only) {
        sb_put(&b, "UPDATE main.");
        sb_ident(&b, s->table);
        sb_put(&b, " SET ");
        sb_ident(&b, r->column.name);
        sb_put(&b, " = ?1 WHERE ");
        sb_ident(&b, r->id);
        sb_put(&b, " = ?2 AND (");
        sb_ident(&b, r->column.name);
        /* A REAL was read as its text rendering (no REAL ks_value): it is
         * unchanged when its CAST to TEXT, the same rendering, still equals
         * the text the engine saw. */
        sb_put(&b, " IS ?3 OR (typeof(");
        sb_ident(&b, r->column.name);
        sb_put(&b, ") = 'real' AND typeof(?3) = 'text' AND CAST(");
        sb_ident(&b, r->column.name);
        sb_put(&b, " AS TEXT) = ?3))");
        err = prepare_kept(o, &b, ST_CAS);
    }
    free(b.p);
    if (err == KS_OK && !s->read_only)
        err = prepare_const(o,
                            "INSERT INTO main.keyshift_quarantine(tbl, col, id, error, time, "
                            "params) VALUES(?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT(tbl, col, id) "
                            "DO UPDATE SET error = excluded.error, time = excluded.time, "
                            "params = excluded.params WHERE params IS NOT excluded.params",
                            ST_QUARANTINE);
    if (err == KS_OK && !s->read_only)
        err = prepare_const(o,
                            "INSERT OR REPLACE INTO main.keyshift_migration(params, state, cursor, "
                            "pass, done, skipped, raced, quarantined, wrong_state, started, "
                            "updated, finished, tbl, col) VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, "
                            "?9, ?10, ?11, ?12, ?13, ?14)",
                            ST_CP_SAVE);
#define CP_COLS                                                                                    \
    "SELECT params, state, cursor, pass, done, skipped, raced, quarantined, wrong_state, "        \
    "started, updated, finished FROM main.keyshift_migration "
    if (err == KS_OK && have_tables)
        err = prepare_const(o, CP_COLS "WHERE params = ?1 AND tbl = ?2 AND col = ?3", ST_CP_LOAD);
    if (err == KS_OK && have_tables)
        err = prepare_const(o, CP_COLS "WHERE tbl = ?2 AND col = ?3 ORDER BY updated DESC, rowid DESC LIMIT 1",
                            ST_CP_LATEST);
#undef CP_COLS
    if (err == KS_OK && !s->read_only)
        err = prepare_const(o, "BEGIN IMMEDIATE", ST_BEGIN);
    if (err == KS_OK && !s->read_only)
        err = prepare_const(o, "COMMIT", ST_COMMIT);
    if (err == KS_OK)
        err = prepare_const(o, "ROLLBACK", ST_ROLLBACK);
    return err;
}

/* ---- opening ---------------------------------------------------------------------------- */

/* Check the caller's arguments before touching any file. */
static ks_err check_args(const char *path, const ks_rowstore_target *t, ks_rowstore *out,
                         char *errbuf, size_t errbuf_len)
{
    if (path == NULL || t == NULL || out == NULL)
        return ks_sqlite_fail(errbuf, errbuf_len, KS_ERR_INVALID_ARGUMENT, "missing path, target or store");
    if (t->n_context_columns > KS_ROWSTORE_MAX_CONTEXT_COLUMNS)
        return ks_sqlite_fail(errbuf, errbuf_len, KS_ERR_INVALID_ARGUMENT,
                    "at most %d context columns", KS_ROWSTORE_MAX_CONTEXT_COLUMNS);
    const char *names[3 + KS_ROWSTORE_MAX_CONTEXT_COLUMNS] = {t->table, t->column};
    size_t n = 2;
    if (t->id_column != NULL)
        names[n++] = t->id_column;
    if (t->tenant_column != NULL)
        names[n++] = t->tenant_column;
    for (size_t i = 0; i < t->n_context_columns; i++)
        names[n++] = t->context_columns[i];
    for (size_t i = 0; i < n; i++)
        if (names[i] == NULL || names[i][0] == '\0' || strlen(names[i]) > IDENT_MAX)
            return ks_sqlite_fail(errbuf, errbuf_len, KS_ERR_INVALID_ARGUMENT,
                        "a table or column name is missing, empty or too long");
    return KS_OK;
}

/* Read the main database's journal mode ("wal", "delete", ...) into
 * mode: what decides whether synchronous NORMAL is safe (set_synchronous). */
static ks_err journal_mode(opener *o, char *mode, size_t mode_len)
{
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(o->s->db, "PRAGMA main.journal_mode", -1, &st, NULL);
    if (rc == SQLITE_OK && (rc = sqlite3_step(st)) == SQLITE_ROW) {
        const unsigned char *t = sqlite3_column_text(st, 0);
        ks_sqlite_printable(t != NULL ? (const char *)t : "?", mode, mode_len);
        rc = SQLITE_OK;
    } else if (rc == SQLITE_DONE) {
        rc = SQLITE_ERROR; /* a pragma that always answers answered nothing */
    }
    sqlite3_finalize(st);
    return rc == SQLITE_OK ? KS_OK : open_fail_rc(o, rc, "reading the journal mode");
}

/* Set the connection's PRAGMA synchronous to sync (rowstore.h,
 * ks_sqlite_sync): FULL always, NORMAL only on a WAL database, refused
 * otherwise rather than quietly kept at FULL (the caller asked for a
 * trade-off the database cannot make safely). */
static ks_err set_synchronous(opener *o, ks_sqlite_sync sync)
{
    if (sync != KS_SQLITE_SYNC_FULL && sync != KS_SQLITE_SYNC_NORMAL)
        return ks_sqlite_fail(o->errbuf, o->errbuf_len, KS_ERR_INVALID_ARGUMENT,
                              "synchronous must be FULL or NORMAL");
    if (sync == KS_SQLITE_SYNC_NORMAL) {
        char mode[16];
        ks_err err = journal_mode(o, mode, sizeof mode);
        if (err != KS_OK)
            return err;
        if (strcmp(mode, "wal") != 0)
            return ks_sqlite_fail(o->errbuf, o->errbuf_len, KS_ERR_INVALID_ARGUMENT,
                                  "synchronous NORMAL is safe only in WAL mode, and the "
                                  "database's journal mode is %s: use FULL (the default) or "
                                  "switch the database to WAL", mode);
    }
    int rc = sqlite3_exec(o->s->db,
                          sync == KS_SQLITE_SYNC_NORMAL ? "PRAGMA synchronous = NORMAL"
                                                        : "PRAGMA synchronous = FULL",
                          NULL, NULL, NULL);
    return rc == SQLITE_OK ? KS_OK : open_fail_rc(o, rc, "setting synchronous");
}

/* Open the connection (never creating the file) and configure it
 * (sqlite_util.h): extended result codes, defensive mode, untrusted
 * schema, busy handler; then the page cache and synchronous of opts
 * (NULL: the defaults). */
static ks_err open_db(opener *o, const char *path, const ks_sqlite_options *opts)
{
    sqlite_store *s = o->s;
    ks_err err = ks_sqlite_connect(path, s->read_only, 0, &s->busy, &s->db, o->errbuf,
                                   o->errbuf_len);
    if (err != KS_OK)
        return err;
    uint32_t cache_kib = opts != NULL ? opts->cache_kib : 0;
    char sql[48];
    snprintf(sql, sizeof sql, "PRAGMA cache_size = -%u",
             (unsigned)(cache_kib != 0 ? cache_kib : KS_SQLITE_CACHE_KIB_DEFAULT));
    int rc = sqlite3_exec(s->db, sql, NULL, NULL, NULL);
    if (rc != SQLITE_OK)
        return open_fail_rc(o, rc, "setting the page cache");
    return set_synchronous(o, opts != NULL ? opts->synchronous : KS_SQLITE_SYNC_FULL);
}

/* Nonzero when colinfo a and b are the same column. */
static int same_column(const colinfo *a, const colinfo *b)
{
    return a->found && b->found && a->cid == b->cid;
}

/* Resolve every name of target t against the schema into r (s->table
 * and s->column set), with the checks of the file comment. */
static ks_err resolve_target(opener *o, const ks_rowstore_target *t, resolved *r)
{
    sqlite_store *s = o->s;
    int is_view = 0;
    ks_sqlite_printable(t->table, o->tname, sizeof o->tname);
    if (reserved_table(t->table))
        return ks_sqlite_fail(o->errbuf, o->errbuf_len, KS_ERR_INVALID_ARGUMENT,
                    "table \"%s\" is reserved (sqlite_*, keyshift_*)", o->tname);
    ks_err err = find_table(o, t->table, &s->table, &is_view);
    if (err != KS_OK)
        return err;
    if (is_view)
        return ks_sqlite_fail(o->errbuf, o->errbuf_len, KS_ERR_INVALID_ARGUMENT,
                    "\"%s\" is a view, not a table", o->tname);
    err = need_column(o, t->column, "target", &r->column);
    if (err == KS_OK && t->id_column != NULL)
        err = need_column(o, t->id_column, "id", &r->id_col);
    if (err == KS_OK && t->tenant_column != NULL)
        err = need_column(o, t->tenant_column, "tenant", &r->tenant);
    for (size_t i = 0; err == KS_OK && i < t->n_context_columns; i++)
        err = need_column(o, t->context_columns[i], "context", &r->context[i]);
    if (err != KS_OK)
        return err;
    r->n_context = t->n_context_columns;
    char pcol[96];
    ks_sqlite_printable(r->column.name, pcol, sizeof pcol);
    if (r->column.hidden != 0 || r->column.pk != 0)
        return ks_sqlite_fail(o->errbuf, o->errbuf_len, KS_ERR_INVALID_ARGUMENT,
                    "column \"%s\" is generated, hidden or part of the primary key", pcol);
    int clash = same_column(&r->column, &r->id_col) || same_column(&r->column, &r->tenant);
    for (size_t i = 0; i < r->n_context; i++)
        clash |= same_column(&r->column, &r->context[i]);
    if (clash)
        return ks_sqlite_fail(o->errbuf, o->errbuf_len, KS_ERR_INVALID_ARGUMENT,
                    "column \"%s\" cannot also be the id, tenant or a context column", pcol);
    s->column = dup_str(r->column.name);
    if (s->column == NULL)
        return ks_sqlite_fail(o->errbuf, o->errbuf_len, KS_ERR_NO_MEMORY, "out of memory");
    if (t->id_column == NULL) {
        /* the bare rowid: stable only as the alias of an INTEGER PRIMARY KEY */
        int64_t alias = -1;
        err = pick_rowid(o, &r->id);
        if (err == KS_OK)
            err = rowid_alias_cid(o, &alias);
        r->id_stable = alias >= 0;
        return err;
    }
    r->id_stable = 1; /* a unique NOT NULL column or the rowid alias, once checked */
    int ok = 0;
    err = check_id_column(o, &r->id_col, &ok);
    if (err == KS_OK && !ok) {
        char pid[96];
        err = ks_sqlite_fail(o->errbuf, o->errbuf_len, KS_ERR_NO_TARGET,
                   "id column \"%s\" of table \"%s\" is neither the INTEGER PRIMARY KEY nor "
                   "NOT NULL with a UNIQUE or PRIMARY KEY index of its own",
                   ks_sqlite_printable(r->id_col.name, pid, sizeof pid), o->tname);
    }
    r->id = r->id_col.name;
    return err;
}

/* Free the strings of r. */
static void resolved_free(resolved *r)
{
    colinfo_free(&r->column);
    colinfo_free(&r->id_col);
    colinfo_free(&r->tenant);
    for (size_t i = 0; i < KS_ROWSTORE_MAX_CONTEXT_COLUMNS; i++)
        colinfo_free(&r->context[i]);
}

/*
 * Test builds only (-DKS_TEST_HOOKS): when KEYSHIFT_TEST_MAX_PAGES is set,
 * cap a writable store's database at that many pages (PRAGMA
 * max_page_count), so that CLI tests provoke SQLITE_FULL in a real
 * `keyshift migrate run` process.  Release builds never read the
 * variable.
 */
static void env_max_pages(const ks_rowstore *store)
{
#ifdef KS_TEST_HOOKS
    const char *v = getenv("KEYSHIFT_TEST_MAX_PAGES");
    const sqlite_store *s = store->self;
    if (v != NULL && !s->read_only && atol(v) > 0) {
        ks_err err = ks_rowstore_sqlite_test_max_pages(store, (uint32_t)atol(v));
        (void)err; /* a test that sets it checks the outcome it provokes */
    }
#else
    (void)store;
#endif
}

/* See rowstore.h. */
ks_err ks_rowstore_sqlite_open(const char *path, const ks_rowstore_target *target,
                               const ks_sqlite_options *opts, ks_rowstore *out, char *errbuf,
                               size_t errbuf_len)
{
    if (errbuf != NULL && errbuf_len > 0)
        errbuf[0] = '\0';
    ks_err err = check_args(path, target, out, errbuf, errbuf_len);
    if (err != KS_OK)
        return err;
    if (ks_value_encoding_name((int)target->encoding) == NULL)
        return ks_sqlite_fail(errbuf, errbuf_len, KS_ERR_INVALID_ARGUMENT,
                              "the column's encoding is neither binary nor base64");
    memset(out, 0, sizeof *out);
    sqlite_store *s = calloc(1, sizeof *s);
    if (s == NULL)
        return ks_sqlite_fail(errbuf, errbuf_len, KS_ERR_NO_MEMORY, "out of memory");
    s->read_only = opts != NULL && opts->read_only;
    ks_sqlite_busy_init(&s->busy, opts != NULL ? opts->busy_timeout_ms : 0);
    s->n_context = target->n_context_columns;
    s->as_text = target->encoding == KS_ENCODING_BASE64;
    opener o = {.s = s, .errbuf = errbuf, .errbuf_len = errbuf_len};
    resolved r;
    memset(&r, 0, sizeof r);
    int have_tables = 0;
    err = open_db(&o, path, opts);
    if (err == KS_OK)
        err = resolve_target(&o, target, &r);
    if (err == KS_OK)
        err = ensure_own_tables(&o, &have_tables);
    if (err == KS_OK)
        err = prepare_statements(&o, &r, have_tables);
    int id_stable = r.id_stable;
    resolved_free(&r);
    if (err != KS_OK) {
        store_free(s);
        return err;
    }
    out->ops = &sqlite_ops;
    out->self = s;
    out->name = "sqlite";
    out->id_stable = id_stable;
    out->encoding = target->encoding;
    env_max_pages(out);
    return KS_OK;
}

/* A name read back from keyshift_migration: TEXT with no NUL inside and
 * at most IDENT_MAX bytes, as check_args admits; else KS_ERR_STORE. */
static ks_err read_name(sqlite3_stmt *st, int col, ks_bytes *out)
{
    if (sqlite3_column_type(st, col) != SQLITE_TEXT)
        return KS_ERR_STORE;
    const unsigned char *p = sqlite3_column_text(st, col);
    int n = sqlite3_column_bytes(st, col);
    if (p == NULL || n <= 0 || (size_t)n > IDENT_MAX || memchr(p, 0, (size_t)n) != NULL)
        return KS_ERR_STORE;
    *out = (ks_bytes){p, (size_t)n};
    return KS_OK;
}

/* Step the checkpoint listing st, handing each row to fn (see
 * ks_rowstore_sqlite_checkpoints); every row is checked as
 * checkpoint_load checks it. */
static ks_err list_rows(sqlite_store *s, sqlite3_stmt *st, ks_checkpoint_list_fn fn, void *arg)
{
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        ks_checkpoint cp;
        ks_bytes tbl, col;
        s->arena_len = 0;
        ks_err err = read_checkpoint(s, st, &cp);
        if (err == KS_OK)
            err = read_name(st, 12, &tbl);
        if (err == KS_OK)
            err = read_name(st, 13, &col);
        if (err != KS_OK)
            return err;
        if (fn(arg, tbl, col, &cp) != 0)
            return KS_OK;
    }
    return rc == SQLITE_DONE ? KS_OK : ks_sqlite_map_rc(rc);
}

/* See rowstore.h. */
ks_err ks_rowstore_sqlite_checkpoints(const char *path, const char *table, const char *column,
                                      ks_checkpoint_list_fn fn, void *arg, char *errbuf,
                                      size_t errbuf_len)
{
    static const char q[] =
        "SELECT params, state, cursor, pass, done, skipped, raced, quarantined, wrong_state, "
        "started, updated, finished, tbl, col FROM main.keyshift_migration "
        "WHERE ?1 IS NULL OR (tbl = ?1 AND col = ?2) ORDER BY updated DESC, rowid DESC";
    if (errbuf != NULL && errbuf_len > 0)
        errbuf[0] = '\0';
    if (path == NULL || fn == NULL || (table == NULL) != (column == NULL))
        return ks_sqlite_fail(errbuf, errbuf_len, KS_ERR_INVALID_ARGUMENT,
                              "missing path or callback, or a table without a column");
    sqlite_store *s = calloc(1, sizeof *s);
    if (s == NULL)
        return ks_sqlite_fail(errbuf, errbuf_len, KS_ERR_NO_MEMORY, "out of memory");
    s->read_only = 1;
    ks_sqlite_busy_init(&s->busy, 0);
    opener o = {.s = s, .errbuf = errbuf, .errbuf_len = errbuf_len};
    int have = 0;
    sqlite3_stmt *st = NULL;
    ks_err err = open_db(&o, path, 0);
    if (err == KS_OK)
        err = ensure_own_tables(&o, &have); /* read-only: creates nothing */
    if (err == KS_OK && have) {
        int rc = sqlite3_prepare_v2(s->db, q, -1, &st, NULL);
        if (rc == SQLITE_OK)
            rc = sqlite3_bind_text(st, 1, table, -1, SQLITE_STATIC);
        if (rc == SQLITE_OK)
            rc = sqlite3_bind_text(st, 2, column, -1, SQLITE_STATIC);
        err = rc == SQLITE_OK ? list_rows(s, st, fn, arg) : open_fail_rc(&o, rc, "listing the checkpoints");
        if (err == KS_ERR_STORE && errbuf != NULL && errbuf_len > 0 && errbuf[0] == '\0')
            (void)ks_sqlite_fail(errbuf, errbuf_len, err, "a malformed row in keyshift_migration");
    }
    sqlite3_finalize(st);
    store_free(s);
    return err;
}

/* See rowstore.h. */
ks_err ks_rowstore_sqlite_set_write_gate(const ks_rowstore *store, const char *sql)
{
    if (store == NULL || store->ops != &sqlite_ops || store->self == NULL)
        return KS_ERR_INVALID_ARGUMENT;
    sqlite_store *s = store->self;
    if (s->read_only || s->in_txn)
        return KS_ERR_INVALID_ARGUMENT;
    sqlite3_finalize(s->st[ST_GATE]);
    s->st[ST_GATE] = NULL;
    if (sql == NULL)
        return KS_OK;
    return prepare(s->db, sql, 1, &s->st[ST_GATE]) == SQLITE_OK ? KS_OK : KS_ERR_STORE;
}

#ifdef KS_TEST_HOOKS
/* See sqlite_store.h. */
ks_err ks_rowstore_sqlite_test_pragma(const ks_rowstore *store, const char *name, int64_t *out)
{
    if (store == NULL || store->ops != &sqlite_ops || store->self == NULL || name == NULL ||
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
    if (store == NULL || store->ops != &sqlite_ops || store->self == NULL)
        return KS_ERR_INVALID_ARGUMENT;
    sqlite_store *s = store->self;
    char sql[64];
    snprintf(sql, sizeof sql, "PRAGMA max_page_count = %u", (unsigned)pages);
    return sqlite3_exec(s->db, sql, NULL, NULL, NULL) == SQLITE_OK ? KS_OK : KS_ERR_STORE;
}
#endif
