/*
 * migrate/store/sqlite/sqlite_store_internal.h -- what the two files of
 * the SQLite row store share: sqlite_store.c (the operations on an open
 * store, and its hooks) and sqlite_store_open.c (opening one: the target's
 * schema, keyshift's own tables, the kept statements; the checkpoint
 * listing).  Not installed; hidden in the shared library like every
 * internal symbol.
 */
#ifndef KS_MIGRATE_STORE_SQLITE_STORE_INTERNAL_H
#define KS_MIGRATE_STORE_SQLITE_STORE_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include <sqlite3.h>

#include <keyshift/rowstore.h>

#include "sqlite_util.h"

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

/* Prepare sql on db (persistent when kept for the store's life). */
int ks_sqls_prepare(sqlite3 *db, const char *sql, int persistent, sqlite3_stmt **out);

/* Read the checkpoint row under st's cursor into cp (views into s's
 * arena, fixed up by the caller).  KS_ERR_STORE for a malformed row. */
ks_err ks_sqls_read_checkpoint(sqlite_store *s, sqlite3_stmt *st, ks_checkpoint *cp);

/* Release everything of s: statements, connection (rolling back), names,
 * arena.  Used by close and by a failed open. */
void ks_sqls_store_free(sqlite_store *s);

/* The operations of an open store (sqlite_store.c). */
extern const ks_rowstore_ops ks_sqls_ops;

#endif /* KS_MIGRATE_STORE_SQLITE_STORE_INTERNAL_H */
