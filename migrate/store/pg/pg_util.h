/*
 * migrate/store/pg/pg_util.h -- libpq helpers that the PostgreSQL row
 * store (pg_store.c) and rollout store (rollout_pg*.c) share: connecting
 * with a message that never holds row data, the SQLSTATE mapping of
 * keyshift/rowstore_pg.h ("Errors"), and names made printable for
 * messages.  Internal to the library (no KS_API).
 */
#ifndef KS_MIGRATE_PG_UTIL_H
#define KS_MIGRATE_PG_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include <libpq-fe.h>

#include <keyshift/error.h>

/* Connect with conninfo (a connection string or URI, expanded as dbname;
 * application name "keyshift" unless it names one) into *conn, which the
 * caller PQfinishes even on failure: KS_ERR_NO_MEMORY, or
 * KS_ERR_UNAVAILABLE with libpq's first line (server address,
 * authentication: never row data) in errbuf.  The server's notices are
 * dropped, never printed (they are its own text and may quote rows). */
KS_WUR ks_err ks_pg_connect(const char *conninfo, PGconn **conn, char *errbuf, size_t errbuf_len);
/* Map an SQLSTATE (NULL: none, a client-side failure) to a keyshift
 * error: 40P01, 40001, 55P03, 57014 KS_ERR_BUSY; class 08 and 57P0x
 * KS_ERR_UNAVAILABLE; 53100 KS_ERR_FULL; anything else KS_ERR_STORE. */
KS_WUR ks_err ks_pg_map_sqlstate(const char *state);
/* Type oids of the binary results the stores read (fixed in every
 * PostgreSQL release). */
#define KS_PG_OID_BOOL 16u
#define KS_PG_OID_BYTEA 17u
#define KS_PG_OID_INT8 20u
#define KS_PG_OID_INT2 21u
#define KS_PG_OID_INT4 23u
#define KS_PG_OID_TEXT 25u
#define KS_PG_OID_VARCHAR 1043u
#define KS_PG_OID_FLOAT8 701u
/* The 8 bytes at p, big-endian (the binary form of int8 and float8). */
uint64_t ks_pg_get_be64(const uint8_t *p);
/* The bytes of cell (row, col) of res when it is a non-NULL binary cell
 * of type oid, its length to *n; NULL for anything else (no such row or
 * column, NULL, another type, text format).  The one check of a cell's
 * shape that both stores' strict decoders start from. */
const uint8_t *ks_pg_typed_cell(const PGresult *res, int row, int col, unsigned oid, size_t *n);
/* Copy name into out for a message, control bytes as '?', truncated. */
const char *ks_pg_printable(const char *name, char *out, size_t out_len);

#endif /* KS_MIGRATE_PG_UTIL_H */
