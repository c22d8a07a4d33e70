/*
 * keyshift/chunks_pg.h -- the PostgreSQL chunk coordinator
 * (keyshift/chunks.h over a PostgreSQL row store's connection).
 *
 * Its table, created beside keyshift_migration in the target table's
 * schema when missing (one transaction under an advisory lock):
 *
 *   CREATE TABLE keyshift_chunk(
 *       tbl text, col text, params text,   -- the migration
 *       chunk_id bigint, lo bigint, hi bigint,
 *       state text, cursor bigint, pass bigint,
 *       done, skipped, raced, quarantined, wrong_state bigint,
 *       owner text, lease_until timestamptz, claims bigint,
 *       updated timestamptz,
 *       PRIMARY KEY (tbl, col, params, chunk_id));
 *   CREATE INDEX keyshift_chunk_open ON keyshift_chunk
 *       (tbl, col, params, chunk_id) WHERE state <> 'complete';
 *
 * Claims are one UPDATE of the row a subquery picks with FOR UPDATE SKIP
 * LOCKED LIMIT 1; leases are now() plus lease_ms, compared with now():
 * the database's clock.  Saves are one UPDATE ... WHERE ... AND owner =
 * $owner on the store's connection, inside its transaction.  Every value
 * is a bound parameter; the schema enters SQL only as the store quoted
 * it (PQescapeIdentifier of the catalog's spelling).
 */
#ifndef KEYSHIFT_CHUNKS_PG_H
#define KEYSHIFT_CHUNKS_PG_H

#include <keyshift/chunks.h>
#include <keyshift/rowstore.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Bind a chunk coordinator to store, a PostgreSQL store
 * (ks_rowstore_pg_open), creating keyshift_chunk if missing.  Over a
 * read-only store (`keyshift migrate status`) the coordinator only reads:
 * summary and list work (a missing keyshift_chunk, never created, reads
 * as no chunks), plan, claim, renew and release return
 * KS_ERR_INVALID_ARGUMENT.  The store must outlive *out and not be inside
 * a transaction.  Errors:
 * KS_ERR_INVALID_ARGUMENT (another kind of store, one inside a
 * transaction, NULL), KS_ERR_NO_MEMORY, and the store's
 * mapping of database failures (e.g. KS_ERR_STORE without CREATE
 * privilege), with a message in errbuf.  *out is cleared on failure.
 */
KS_API KS_WUR ks_err ks_chunks_pg_open(const ks_rowstore *store, ks_chunks *out, char *errbuf,
                                       size_t errbuf_len);

#ifdef __cplusplus
}
#endif
#endif /* KEYSHIFT_CHUNKS_PG_H */
