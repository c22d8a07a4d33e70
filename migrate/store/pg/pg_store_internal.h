/*
 * migrate/store/pg/pg_store_internal.h -- what the two files of the
 * PostgreSQL row store share: pg_store.c (the operations on an open
 * store, its write gate, what it lends pg_chunks.c) and pg_store_open.c
 * (opening one: the target's catalog entries, keyshift's own tables, the
 * prepared statements; the checkpoint and migrated-column listings).
 * Not installed; not exported (hidden in the shared library like every
 * internal symbol).
 */
#ifndef KS_MIGRATE_STORE_PG_STORE_INTERNAL_H
#define KS_MIGRATE_STORE_PG_STORE_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include <libpq-fe.h>

#include <keyshift/rowstore.h>

/* The prepared statements, by name: prepared at open (pg_store_open.c),
 * run by the operations (pg_store.c). */
static const char *const ST_SCAN_FIRST = "ks_scan_first";
static const char *const ST_SCAN_AFTER = "ks_scan_after";
static const char *const ST_SCAN_RANGE = "ks_scan_range";
static const char *const ST_COUNT = "ks_count";
static const char *const ST_TXN_CFG = "ks_txn_cfg";
static const char *const ST_CAS = "ks_cas";
static const char *const ST_QUARANTINE = "ks_quarantine";
static const char *const ST_CP_SAVE = "ks_cp_save";
static const char *const ST_CP_LOAD = "ks_cp_load";
static const char *const ST_CP_LATEST = "ks_cp_latest";

/* One PostgreSQL store. */
typedef struct pg_store {
    PGconn *conn;
    PGresult *res;            /* the last result: every view points into it */
    int read_only;
    int in_txn;               /* begin() opened a transaction */
    int have_tables;          /* keyshift_migration and keyshift_quarantine exist */
    int q_params;             /* keyshift_quarantine has its params column */
    int as_text;              /* a base64 column (text, varchar): values are text */
    char *mig;                /* bind_migration's parameters (NULL: unbound) */
    size_t n_context;
    char *table, *column;     /* catalog spellings, for keyshift_*.tbl / col */
    char *qschema, *qtable, *qid; /* quoted names, lent to pg_chunks.c */
    char lock_ms[24], stmt_ms[24]; /* the timeouts as set_config values */
    uint8_t *buf;             /* cas_batch's array parameters */
    size_t buf_cap;
    int gate;                 /* ks_rowstore_pg_set_write_gate: "ks_gate" is prepared */
} pg_store;

/* The operations of an open store (its ks_rowstore.ops); also how a
 * store is known to be a PostgreSQL one. */
extern const ks_rowstore_ops ks_pgs_ops;

/* The keyshift error of a failed result res on s's connection (NULL:
 * libpq could not even send); KS_ERR_UNAVAILABLE when the connection is
 * lost. */
ks_err ks_pgs_result_err(const pg_store *s, const PGresult *res);

/* Run a constant statement sql (no value in it): KS_OK when it returned
 * PGRES_COMMAND_OK, *cmd (when not NULL) set to its command tag's first
 * bytes. */
ks_err ks_pgs_run_simple(pg_store *s, const char *sql, char *cmd, size_t cmd_len);

/* Roll back whatever transaction s's connection has open, and forget it. */
void ks_pgs_rollback_now(pg_store *s);

/* The n strings of parts concatenated into a new string (NULL when out of
 * memory); a NULL part is skipped. */
char *ks_pgs_concat(const char *const *parts, size_t n);

/* Release everything of s (NULL: nothing): the result, the connection
 * (rolling back), names, buffer. */
void ks_pgs_store_free(pg_store *s);

#endif /* KS_MIGRATE_STORE_PG_STORE_INTERNAL_H */
