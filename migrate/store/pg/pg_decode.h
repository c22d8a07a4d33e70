/*
 * migrate/store/pg/pg_decode.h -- the decoders of the rows that the
 * PostgreSQL row store (pg_store.c) and chunk coordinator (pg_chunks.c)
 * read back: pure functions of a result and a row index, so that the
 * store and fuzz/fuzz_pg_rows.c run the same code (the rollout store's
 * are in rollout_pg.h).  A database's cells are untrusted bytes.
 * Internal to the library (no KS_API).
 *
 * The store's results are binary (bigint 8 bytes big-endian, bytea and
 * text their bytes); the coordinator's are text.  Views (ks_bytes,
 * ks_value bytes) point into the result.
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

/* Cell (row, col) of a binary result into *v, a view of res: NULL is
 * KS_VALUE_NULL, bigint (8 bytes) INTEGER, bytea BLOB, text TEXT (an
 * empty one viewing a static byte); KS_ERR_STORE for another type or
 * length. */
KS_WUR ks_err ks_pg_cell(const PGresult *res, int row, int col, ks_value *v);
/* A scan row (id, value, tenant, n_context context cells, then the
 * quarantine flag as a 1-byte boolean) into *r (zeroed first): the id an
 * integer, every cell by ks_pg_cell; else KS_ERR_STORE. */
KS_WUR ks_err ks_pg_scan_row(const PGresult *res, int row, size_t n_context, ks_row *r);
/* A KS_PG_CHECKPOINT_COLS row into *cp (zeroed first): params and state
 * text, cursor NULL or an integer, pass 0..UINT32_MAX and the counts
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
/* A chunk row of a text result (KS_PG_CHUNK_NCOLS cells, pg_chunks.c's
 * CHUNK_COLS) into *k (zeroed first), params the caller's.  Not strict:
 * integers are strtoll's reading (NULL, or no digits, is 0), pass
 * clamped to 1..UINT32_MAX, counts below 0 read as 0, state and owner
 * the text up to its first NUL (NULL: empty), lease_live whether the
 * last cell starts with 't'.  res must have the row and its cells. */
void ks_pg_read_chunk(const PGresult *res, int row, ks_bytes params, ks_chunk *k);
/* Row 0 of a chunk summary (a text result of KS_PG_SUMMARY_NCOLS cells:
 * chunks, complete, leased, done, skipped, raced, quarantined,
 * wrong_state, max_pass) into *out, read as ks_pg_read_chunk reads its
 * counts; max_pass clamped to UINT32_MAX, claimable the chunks neither
 * complete nor leased (modulo 2^64). */
void ks_pg_read_summary(const PGresult *res, ks_chunk_summary *out);

#endif /* KS_MIGRATE_STORE_PG_DECODE_H */
