/*
 * migrate/store/sqlite/rollout_sqlite.h -- what the two files of the
 * SQLite rollout store (keyshift/rollout_store.h) share: the store's
 * structure, its kept statements and the strict column readers.
 * rollout_sqlite.c opens, upgrades and closes the store and runs its
 * transactions; rollout_sqlite_rows.c reads and writes the rows.
 * Internal to the library (no KS_API, hidden in the shared library).
 */
#ifndef KS_MIGRATE_ROLLOUT_SQLITE_H
#define KS_MIGRATE_ROLLOUT_SQLITE_H

#include <stddef.h>
#include <stdint.h>

#include <sqlite3.h>

#include <keyshift/rollout_store.h>

#include "sqlite_util.h"

/* Statements a store keeps prepared (more than the distinct SQL texts of
 * the store, so every one is kept once used). */
#define KS_RSQL_STMT_CACHE 64

/* One kept statement: its SQL text (a string literal, known by address)
 * and whether a caller holds it now. */
typedef struct ks_rsql_kept {
    const char *sql;
    sqlite3_stmt *st;
    int busy;
} ks_rsql_kept;

/* One open SQLite rollout store. */
typedef struct ks_rsql {
    ks_rollout_store base;    /* first: the ks_rollout_store handed out */
    sqlite3 *db;
    ks_sqlite_busy busy;      /* must outlive db (its busy handler's state) */
    int read_only;
    int have_tables;          /* the version 2 tables exist (read-only: maybe v2 only) */
    int v3;                   /* and version 3's: scope_key_id, keyshift_rollout_column */
    int v4;                   /* and version 4's: keyshift_rollout.encoding (implies v3) */
    int sums;                 /* and keyshift_metrics' latency sum columns (implies v4;
                                 added to version 4 in place: rollout_sqlite.c) */
    ks_rsql_kept kept[KS_RSQL_STMT_CACHE]; /* prepared once, reset after each use */
    size_t n_kept;            /* kept[0, n_kept) are filled, in order of first use */
} ks_rsql;

/* The SQLite store behind s (which must be one). */
ks_rsql *ks_rsql_of(ks_rollout_store *s);

/* ---- statements (rollout_sqlite.c) ---- */

/* Prepare sql (a string literal) or take the statement kept for it. */
int ks_rsql_prep(ks_rsql *db, const char *sql, sqlite3_stmt **st);
/* Release st (from ks_rsql_prep; NULL is fine). */
void ks_rsql_unprep(ks_rsql *db, sqlite3_stmt *st);
/* ks_rsql_prep then bind parameters by the letters of types ('i' int64_t,
 * 't' const char * or NULL, 'd' double, 'b' const uint8_t * and int). */
int ks_rsql_prep_bind(ks_rsql *db, sqlite3_stmt **st, const char *sql, const char *types, ...);
/* Step a write statement to completion and release it. */
int ks_rsql_run_done(ks_rsql *db, sqlite3_stmt *st, int rc);
/* Map a failing rc (a UNIQUE constraint: KS_ERR_ROLLOUT_EXISTS). */
KS_WUR ks_err ks_rsql_rc_err(int rc);
/* Zero unless db may be written (not read-only, tables present). */
int ks_rsql_writable(const ks_rsql *db);

/* ---- strict column readers (rollout_sqlite.c) ---- */

/* TEXT column i into out[0, max] (NUL-terminated): 0 when not TEXT,
 * longer than max, or holding a NUL byte. */
int ks_rsql_col_text(sqlite3_stmt *st, int i, char *out, size_t max);
/* INTEGER column i within [lo, hi] into *out: 0 otherwise. */
int ks_rsql_col_int(sqlite3_stmt *st, int i, int64_t lo, int64_t hi, int64_t *out);

/* ---- the operations on rows (rollout_sqlite_rows.c) ----
 * Each is the member of ks_rollout_store_ops of the same name (see
 * keyshift/rollout_store.h for what it does); rollout_sqlite.c puts them
 * in the store's operations. */

KS_WUR ks_err ks_rsql_find_column(ks_rollout_store *s, const char *table, const char *column,
                                  char tbl[KS_ROLLOUT_IDENT_MAX + 1],
                                  char col[KS_ROLLOUT_IDENT_MAX + 1],
                                  char *errbuf, size_t errbuf_len);
KS_WUR ks_err ks_rsql_find_open(ks_rollout_store *s, const char *tbl, const char *col,
                                const char *key_id, int key_scopes, int64_t *id);
KS_WUR ks_err ks_rsql_insert(ks_rollout_store *s, const ks_rollout *r, int64_t *id);
KS_WUR ks_err ks_rsql_get(ks_rollout_store *s, int64_t id, ks_rollout *out);
KS_WUR ks_err ks_rsql_latest(ks_rollout_store *s, const char *table, const char *column,
                             ks_rollout *out);
KS_WUR ks_err ks_rsql_latest_key(ks_rollout_store *s, const char *key_id, ks_rollout *out);
KS_WUR ks_err ks_rsql_list(ks_rollout_store *s, int64_t after_id, ks_rollout *out, size_t max,
                           size_t *n);
KS_WUR ks_err ks_rsql_later_count(ks_rollout_store *s, const ks_rollout *r, int64_t *n);
KS_WUR ks_err ks_rsql_set_phase(ks_rollout_store *s, int64_t id, ks_rollout_phase from,
                                ks_rollout_phase to, int64_t now);
KS_WUR ks_err ks_rsql_set_settings(ks_rollout_store *s, int64_t id, const ks_thresholds *t,
                                   uint32_t min_soak_s, uint32_t reader_ttl_s, int64_t now);
KS_WUR ks_err ks_rsql_remove(ks_rollout_store *s, int64_t id);
KS_WUR ks_err ks_rsql_set_canary(ks_rollout_store *s, int64_t id, const ks_rollout_canary *canary,
                                 int64_t now);
KS_WUR ks_err ks_rsql_set_verified(ks_rollout_store *s, int64_t id, const char *table,
                                   const char *column, int64_t now);
KS_WUR ks_err ks_rsql_log_append(ks_rollout_store *s, int64_t rollout_id, int64_t time,
                                 const char *actor, int from, int to, const char *reason,
                                 int automatic);
KS_WUR ks_err ks_rsql_log_list(ks_rollout_store *s, int64_t rollout_id, int64_t after_id,
                               ks_rollout_log_entry *out, size_t max, size_t *n);
KS_WUR ks_err ks_rsql_readers_live(ks_rollout_store *s, int64_t since, ks_rollout_reader *out,
                                   size_t max, size_t *n, size_t *total);
KS_WUR ks_err ks_rsql_reader_put(ks_rollout_store *s, const ks_rollout_reader *r, int64_t now);
KS_WUR ks_err ks_rsql_reader_heartbeat(ks_rollout_store *s, const char *instance_id, int64_t now);
KS_WUR ks_err ks_rsql_reader_delete(ks_rollout_store *s, const char *instance_id);
KS_WUR ks_err ks_rsql_metrics_insert(ks_rollout_store *s, int64_t rollout_id,
                                     const char *instance_id, const char *source,
                                     const ks_health_sample *sample);
KS_WUR ks_err ks_rsql_metrics_sum(ks_rollout_store *s, int64_t rollout_id, int64_t since,
                                  const char *source,
                                  ks_health_sample *out);

#endif /* KS_MIGRATE_ROLLOUT_SQLITE_H */
