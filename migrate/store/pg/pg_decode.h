/*
 * migrate/store/pg/pg_decode.h -- the decoders of the rows that the
 * PostgreSQL row store (pg_store.c) and chunk coordinator (pg_chunks.c)
 * read back: pure functions of a result and a row index, so that the
 * store and fuzz/fuzz_pg_rows.c run the same code (the rollout store's
 * are in rollout_pg.h).  A database's cells are untrusted bytes.
 * Internal to the library (no KS_API).
 *
 * Every result is binary (bigint 8 bytes big-endian, boolean one byte 0
 * or 1, bytea and text their bytes), the store's and the coordinator's
 * alike, and every cell is checked against its column's oid, format and
 * length before use.  Views (ks_bytes, ks_value bytes) point into the
 * result.
 */
#ifndef KS_MIGRATE_STORE_PG_DECODE_H
#define KS_MIGRATE_STORE_PG_DECODE_H

#include <stddef.h>
#include <stdint.h>

#include <libpq-fe.h>

#include <keyshift/chunks.h>
#include <keyshift/rowstore.h>

/* The columns of a checkpoint read, in ks_pg_read_checkpoint's order. */
#define KS_PG_CHECKPOINT_COLS                                                                \
    "params, state, cursor, pass, done, skipped, raced, quarantined, wrong_state, started, "  \
    "updated, finished"
/* The integer cells that follow params, state and cursor in a
 * checkpoint row (ks_pg_checkpoint_ints). */
#define KS_PG_CHECKPOINT_NINTS 9
/* Cells of a chunk row (ks_pg_read_chunk) and of a summary row
 * (ks_pg_read_summary). */
#define KS_PG_CHUNK_NCOLS 14
#define KS_PG_SUMMARY_NCOLS 9
/* The names of those cells, in order (an initializer list: messages name
 * a cell by them, fuzz/fuzz_pg_rows.c builds its results with them). */
#define KS_PG_CHUNK_NAMES                                                                    \
    "chunk_id", "lo", "hi", "state", "cursor", "pass", "done", "skipped", "raced",            \
        "quarantined", "wrong_state", "owner", "lease_until", "lease_live"
#define KS_PG_SUMMARY_NAMES                                                                  \
    "count", "complete", "leased", "done", "skipped", "raced", "quarantined", "wrong_state",  \
        "max_pass"

/* Cell (row, col) of a binary result into *v, a view of res: NULL is
 * KS_VALUE_NULL, bigint (8 bytes) INTEGER, bytea BLOB, text TEXT (an
 * empty one viewing a static byte); KS_ERR_STORE for a text-format
 * column, another type or length. */
KS_WUR ks_err ks_pg_cell(const PGresult *res, int row, int col, ks_value *v);
/* Cell (row, col) of a binary result as a boolean into *out (0 or 1):
 * not NULL, oid bool, one byte exactly 0 or 1; else KS_ERR_STORE. */
KS_WUR ks_err ks_pg_bool(const PGresult *res, int row, int col, int *out);
/* A scan row (id, value, tenant, n_context context cells, then the
 * quarantine flag by ks_pg_bool) into *r (zeroed first): the id an
 * integer, every cell by ks_pg_cell; else KS_ERR_STORE. */
KS_WUR ks_err ks_pg_scan_row(const PGresult *res, int row, size_t n_context, ks_row *r);
/* A KS_PG_CHECKPOINT_COLS row into *cp (zeroed first): params and state
 * text without a NUL byte, cursor NULL or an integer, pass 0..UINT32_MAX and the counts
 * non-negative integers, the times integers; else KS_ERR_STORE. */
KS_WUR ks_err ks_pg_read_checkpoint(const PGresult *res, int row, ks_checkpoint *cp);
/* The integers of cp as the store binds them after params, state and
 * cursor (checkpoint_save): pass, done, skipped, raced, quarantined,
 * wrong_state, started, updated, finished.  Counts above INT64_MAX (which
 * the store refuses to save) wrap. */
void ks_pg_checkpoint_ints(const ks_checkpoint *cp, int64_t out[KS_PG_CHECKPOINT_NINTS]);
/* A row of the checkpoint listing (KS_PG_CHECKPOINT_COLS, tbl, col): the
 * checkpoint by ks_pg_read_checkpoint, tbl and col text of 1..1024 bytes
 * without a NUL; else KS_ERR_STORE. */
KS_WUR ks_err ks_pg_read_listed(const PGresult *res, int row, ks_checkpoint *cp, ks_bytes *tbl,
                                ks_bytes *col);
/* The states a chunk may be in (chunks.h, ks_chunk.cp.state). */
#define KS_PG_CHUNK_STATES "pending", "running", "paused", "stopped", "complete"
/* The longest owner a chunk row may name (a worker's owner tag is
 * shorter: migrate/engine/workers.c). */
#define KS_PG_CHUNK_OWNER_MAX 1024
/* A chunk row of a binary result (KS_PG_CHUNK_NCOLS cells, pg_chunks.c's
 * CHUNK_COLS: chunk_id, lo, hi, state, cursor, pass, done, skipped,
 * raced, quarantined, wrong_state, owner, lease_until in Unix ms,
 * lease_live) into *k (zeroed first), params the caller's.  Strict, as
 * the coordinator writes its rows: bigints 8 bytes, chunk_id
 * 0..KS_CHUNKS_MAX-1, lo <= hi, a known state (KS_PG_CHUNK_STATES),
 * cursor NULL or within [lo, hi], pass 1..UINT32_MAX, counts >= 0;
 * owner and lease_until both NULL (no lease: owner empty, lease 0,
 * lease_live 0) or both set (owner text of 1..KS_PG_CHUNK_OWNER_MAX
 * bytes without a NUL, lease >= 1, state "running"); lease_live a
 * boolean.  Else KS_ERR_STORE with errbuf naming the column (never a
 * value). */
KS_WUR ks_err ks_pg_read_chunk(const PGresult *res, int row, ks_bytes params, ks_chunk *k,
                               char *errbuf, size_t errbuf_len);
/* The one row of a chunk summary (a binary result of KS_PG_SUMMARY_NCOLS
 * bigint cells: chunks, complete, leased, done, skipped, raced,
 * quarantined, wrong_state, max_pass) into *out (zeroed first): none
 * NULL, all >= 0, chunks <= KS_CHUNKS_MAX, complete + leased <= chunks,
 * max_pass 1..UINT32_MAX when there are chunks, and every sum 0 when
 * there are none; claimable the chunks neither complete nor leased.
 * Else KS_ERR_STORE with errbuf naming the column. */
KS_WUR ks_err ks_pg_read_summary(const PGresult *res, ks_chunk_summary *out, char *errbuf,
                                 size_t errbuf_len);

#endif /* KS_MIGRATE_STORE_PG_DECODE_H */
