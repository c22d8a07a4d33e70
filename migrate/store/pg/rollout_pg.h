/*
 * migrate/store/pg/rollout_pg.h -- what the two files of the PostgreSQL
 * rollout store (keyshift/rollout_store_pg.h) share: the store's
 * structure, running a statement with bound parameters and the strict
 * readers of binary result cells.  rollout_pg.c opens the store, creates
 * its tables and runs its transactions; rollout_pg_rows.c reads and
 * writes the rows.  Internal to the library (no KS_API).
 */
#ifndef KS_MIGRATE_ROLLOUT_PG_H
#define KS_MIGRATE_ROLLOUT_PG_H

#include <stddef.h>
#include <stdint.h>

#include <libpq-fe.h>

#include <keyshift/rollout_store.h>

#include "../../errbuf.h"

/* ASCII-only case folding of an SQL text expression x, as
 * ks_rollout_name_cmp folds (lower() would follow the locale). */
#define KS_RPG_FOLD(x)                                                                             \
    "translate(" x ", 'ABCDEFGHIJKLMNOPQRSTUVWXYZ', 'abcdefghijklmnopqrstuvwxyz')"

/* One open PostgreSQL rollout store. */
typedef struct ks_rpg {
    ks_rollout_store base;    /* first: the ks_rollout_store handed out */
    PGconn *conn;
    int read_only;
    int have_tables;          /* every table of the schema exists */
    int v2;                   /* and version 2's keyshift_rollout.encoding */
    int sums;                 /* and keyshift_metrics' latency sum columns (implies v2;
                                 added to version 2 in place: rollout_pg.c) */
    int in_txn;               /* begin or snapshot opened a transaction */
} ks_rpg;

/* The PostgreSQL store behind s (which must be one). */
ks_rpg *ks_rpg_of(ks_rollout_store *s);

/* Run sql with parameters $1, $2, ... from the variadic arguments, one
 * per letter of types: 'i' an int64_t (bigint), 't' a const char *
 * (text; NULL binds NULL), 'd' a double (double precision), 'b' a const
 * uint8_t * then an int length (bytea).  Values go in binary, results
 * come back in binary.  KS_OK with *res (the caller's to PQclear) when
 * the statement succeeded; else the mapped error (ks_rpg_err) and *res
 * NULL. */
KS_WUR ks_err ks_rpg_exec(ks_rpg *db, PGresult **res, const char *sql, const char *types, ...);
/* ks_rpg_exec of a statement whose result is not needed; *changed (when
 * not NULL) gets the rows it changed. */
KS_WUR ks_err ks_rpg_run(ks_rpg *db, int64_t *changed, const char *sql, const char *types, ...);
/* The keyshift error of the failed result res (NULL: nothing came back):
 * rowstore_pg.h's SQLSTATE mapping; unique_exists maps a unique
 * violation (23505) to KS_ERR_ROLLOUT_EXISTS. */
KS_WUR ks_err ks_rpg_err(const ks_rpg *db, const PGresult *res, int unique_exists);
/* Messages are written with the library's one formatter (never with the
 * server's text). */
#define ks_rpg_fail ks_errbuf_fail
/* Zero unless db may be written (not read-only, tables present). */
int ks_rpg_writable(const ks_rpg *db);

/* ---- strict readers of binary cells (rollout_pg.c) ----
 * Each returns 0 for NULL, a cell of another type, a wrong length or a
 * value out of range. */

/* text cell into out[0, max] (NUL-terminated, no NUL byte inside). */
int ks_rpg_col_text(const PGresult *res, int row, int i, char *out, size_t max);
/* bigint cell within [lo, hi]. */
int ks_rpg_col_int(const PGresult *res, int row, int i, int64_t lo, int64_t hi, int64_t *out);
/* double precision cell, not NaN. */
int ks_rpg_col_double(const PGresult *res, int row, int i, double *out);
/* bytea cell of exactly len bytes. */
int ks_rpg_col_bytes(const PGresult *res, int row, int i, size_t len, const uint8_t **out);
/* Nonzero when the cell is NULL. */
int ks_rpg_col_null(const PGresult *res, int row, int i);

/* ---- the decoders of rows (rollout_pg_rows.c) ----
 * The columns each reads, in order, are the query's: the store selects
 * exactly these lists, and fuzz/fuzz_pg_rows.c builds its results from
 * them.  Each decoder reads row `row` of res (binary results, as
 * ks_rpg_exec asks for) by the strict cell readers above and returns
 * KS_OK with *out set, or KS_ERR_STORE for a malformed row (*out then
 * partly written).  What the values mean together is the rollout
 * layer's check. */

/* The columns of keyshift_rollout in the order ks_rpg_read_rollout reads. */
#define KS_RPG_ROLLOUT_COLS                                                                        \
    "id, tbl, col, src_plaintext, src_format, src_algorithm, src_key_id, src_key_version, "       \
    "dst_format, dst_algorithm, dst_key_id, dst_key_version, phase, phase_since, canary_kind, "   \
    "canary_percent, canary_tenants, max_auth_failure_rate, max_parse_error_rate, "               \
    "max_provider_error_rate, max_seal_p99_us, max_open_p99_us, min_samples, window_s, "          \
    "min_soak_s, reader_ttl_s, created, updated, verified_at, scope_key_id"
/* The columns of keyshift_rollout_column that ks_rpg_read_column reads. */
#define KS_RPG_COLUMN_COLS "tbl, col, verified_at"
/* The columns of keyshift_rollout_log that ks_rpg_read_log reads. */
#define KS_RPG_LOG_COLS "id, rollout_id, time, actor, from_phase, to_phase, reason, automatic"
/* The columns of keyshift_readers in the order ks_rpg_read_reader reads. */
#define KS_RPG_READER_COLS                                                                         \
    "instance_id, library_version, max_format, algorithms, key_versions, started, heartbeat"
/* The columns of keyshift_metrics that ks_rpg_read_sample reads: the
 * counters and histograms of every version, then the latency sums (a
 * database without those columns, read-only, selects 0 for them). */
#define KS_RPG_METRICS_HEAD                                                                        \
    "time, seals, opens, auth_failures, parse_errors, provider_calls, provider_errors, "          \
    "seal_ns, open_ns"
#define KS_RPG_METRICS_COLS KS_RPG_METRICS_HEAD ", seal_ns_sum, open_ns_sum"

/* A KS_RPG_ROLLOUT_COLS row then its encoding (column 30: "binary" or
 * "base64") into *r (zeroed first): names within their
 * lengths, classes within their ranges, a known phase and canary, a
 * scope its cells agree on, rates not NaN; n_columns 0 (the listed
 * columns are rows of their own, ks_rpg_read_column). */
KS_WUR ks_err ks_rpg_read_rollout(const PGresult *res, int row, ks_rollout *r);
/* A KS_RPG_COLUMN_COLS row into *c: names within KS_ROLLOUT_IDENT_MAX,
 * verified_at >= 0 (c is not zeroed first). */
KS_WUR ks_err ks_rpg_read_column(const PGresult *res, int row, ks_rollout_column *c);
/* A KS_RPG_LOG_COLS row into *e (zeroed first): ids >= 1, known phases
 * (from_phase NULL: none), automatic 0 or 1. */
KS_WUR ks_err ks_rpg_read_log(const PGresult *res, int row, ks_rollout_log_entry *e);
/* A KS_RPG_READER_COLS row into *r (zeroed first): texts within their
 * lengths, max_format 1..255 (the key list's form is the rollout
 * layer's check). */
KS_WUR ks_err ks_rpg_read_reader(const PGresult *res, int row, ks_rollout_reader *r);
/* A KS_RPG_METRICS_COLS row into *one (zeroed first): counters and
 * latency sums non-negative bigints, histograms bytea of exactly
 * KS_RCODEC_HIST_LEN bytes. */
KS_WUR ks_err ks_rpg_read_sample(const PGresult *res, int row, ks_health_sample *one);

/* ---- the operations on rows (rollout_pg_rows.c) ----
 * Each is the member of ks_rollout_store_ops of the same name (see
 * keyshift/rollout_store.h); rollout_pg.c puts them in the store's
 * operations. */

KS_WUR ks_err ks_rpg_find_column(ks_rollout_store *s, const char *table, const char *column,
                                 char tbl[KS_ROLLOUT_IDENT_MAX + 1],
                                 char col[KS_ROLLOUT_IDENT_MAX + 1], char *errbuf,
                                 size_t errbuf_len);
KS_WUR ks_err ks_rpg_find_open(ks_rollout_store *s, const char *tbl, const char *col,
                               const char *key_id, int key_scopes, int64_t *id);
KS_WUR ks_err ks_rpg_insert(ks_rollout_store *s, const ks_rollout *r, int64_t *id);
KS_WUR ks_err ks_rpg_get(ks_rollout_store *s, int64_t id, ks_rollout *out);
KS_WUR ks_err ks_rpg_latest(ks_rollout_store *s, const char *table, const char *column,
                            ks_rollout *out);
KS_WUR ks_err ks_rpg_latest_key(ks_rollout_store *s, const char *key_id, ks_rollout *out);
KS_WUR ks_err ks_rpg_list(ks_rollout_store *s, int64_t after_id, ks_rollout *out, size_t max,
                          size_t *n);
KS_WUR ks_err ks_rpg_later_count(ks_rollout_store *s, const ks_rollout *r, int64_t *n);
KS_WUR ks_err ks_rpg_set_phase(ks_rollout_store *s, int64_t id, ks_rollout_phase from,
                               ks_rollout_phase to, int64_t now);
KS_WUR ks_err ks_rpg_set_settings(ks_rollout_store *s, int64_t id, const ks_thresholds *t,
                                  uint32_t min_soak_s, uint32_t reader_ttl_s, int64_t now);
KS_WUR ks_err ks_rpg_remove(ks_rollout_store *s, int64_t id);
KS_WUR ks_err ks_rpg_set_canary(ks_rollout_store *s, int64_t id, const ks_rollout_canary *canary,
                                int64_t now);
KS_WUR ks_err ks_rpg_set_verified(ks_rollout_store *s, int64_t id, const char *table,
                                  const char *column, int64_t now);
KS_WUR ks_err ks_rpg_log_append(ks_rollout_store *s, int64_t rollout_id, int64_t time,
                                const char *actor, int from, int to, const char *reason,
                                int automatic);
KS_WUR ks_err ks_rpg_log_list(ks_rollout_store *s, int64_t rollout_id, int64_t after_id,
                              ks_rollout_log_entry *out, size_t max, size_t *n);
KS_WUR ks_err ks_rpg_readers_live(ks_rollout_store *s, int64_t since, ks_rollout_reader *out,
                                  size_t max, size_t *n, size_t *total);
KS_WUR ks_err ks_rpg_reader_put(ks_rollout_store *s, const ks_rollout_reader *r, int64_t now);
KS_WUR ks_err ks_rpg_reader_heartbeat(ks_rollout_store *s, const char *instance_id, int64_t now);
KS_WUR ks_err ks_rpg_reader_delete(ks_rollout_store *s, const char *instance_id);
KS_WUR ks_err ks_rpg_metrics_insert(ks_rollout_store *s, int64_t rollout_id,
                                    const char *instance_id, const char *source,
                                    const ks_health_sample *sample);
KS_WUR ks_err ks_rpg_metrics_sum(ks_rollout_store *s, int64_t rollout_id, int64_t since,
                                 const char *source,
                                 ks_health_sample *out);

#endif /* KS_MIGRATE_ROLLOUT_PG_H */
