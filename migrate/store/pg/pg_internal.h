/*
 * migrate/store/pg/pg_internal.h -- what the PostgreSQL store
 * (pg_store.c) lends the PostgreSQL chunk coordinator (pg_chunks.c), so
 * that a chunk's cursor is written on the store's own connection, inside
 * the store's batch transaction.  Not installed; not exported.
 */
#ifndef KS_MIGRATE_STORE_PG_INTERNAL_H
#define KS_MIGRATE_STORE_PG_INTERNAL_H

#include <libpq-fe.h>

#include <keyshift/rowstore.h>

/* A PostgreSQL store's connection and its target's names: views valid
 * while the store is open.  The connection is the store's: a borrower
 * runs statements on it (inside the store's transaction when the store
 * is in one) and never closes it. */
typedef struct ks_pg_store_parts {
    PGconn *conn;
    const char *table, *column; /* catalog spellings (keyshift_*.tbl, col) */
    const char *qschema;        /* the target's schema, quoted */
    const char *qtable;         /* "schema"."table", quoted */
    const char *qid;            /* the id column, quoted */
    int read_only;
} ks_pg_store_parts;

/* The parts of store when it is a PostgreSQL store (KS_OK), else
 * KS_ERR_INVALID_ARGUMENT. */
ks_err ks_pg_store_parts_of(const ks_rowstore *store, ks_pg_store_parts *out);

/* Nonzero when store (a PostgreSQL store) is inside begin(). */
int ks_pg_store_in_txn(const ks_rowstore *store);

/* Roll back store's open transaction after a borrower's statement failed
 * inside it, as the store does after its own failures. */
void ks_pg_store_fail_txn(const ks_rowstore *store);

/* The keyshift error of a failed result res on conn, mapped by SQLSTATE
 * as the store maps its own (rowstore_pg.h, "Errors"). */
ks_err ks_pg_error_of(PGconn *conn, const PGresult *res);

#endif /* KS_MIGRATE_STORE_PG_INTERNAL_H */
