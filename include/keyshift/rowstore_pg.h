/*
 * keyshift/rowstore_pg.h -- the PostgreSQL row store (keyshift/rowstore.h
 * over libpq).  docs/migration.md, "PostgreSQL store", says what it needs
 * of the database and which tables it keeps there.
 *
 * The target.  table is looked up, spelled exactly (PostgreSQL folds only
 * unquoted names: a table created as "Mixed Case" is given as
 * `Mixed Case`, one created as orders as `orders`), among the tables the
 * connection's search_path makes visible; every column likewise in
 * pg_attribute.  Names are bound as parameters in those look-ups and put
 * into SQL only as the catalog spells them, quoted by
 * PQescapeIdentifier.  The id column (id_column, or with NULL the
 * table's one-column primary key) must be a smallint, integer or bigint
 * that is the primary key or NOT NULL with a unique index of its own
 * (not partial, not on an expression); ids are KS_VALUE_INTEGER, and
 * stable (ks_rowstore.id_stable is 1: a context may bind {id}).  The
 * target column must be bytea (values are KS_VALUE_BLOB, or NULL), or,
 * for a target of encoding KS_ENCODING_BASE64, text or varchar (values
 * are KS_VALUE_TEXT; the compare-and-swap's arrays are then text[]);
 * tenant and context columns may be of any type: integers are
 * KS_VALUE_INTEGER, bytea KS_VALUE_BLOB, everything else its text form
 * (KS_VALUE_TEXT).  Anything else is KS_ERR_NO_TARGET, with a message.
 *
 * Scans are keyset scans on the id (WHERE id > $1 ORDER BY id LIMIT $2,
 * never OFFSET; visit_rows_range adds the chunk's bound: WHERE id >= $1
 * AND id <= $2), each outside a write transaction its own statement.
 * Every value is bound as a parameter, never pasted into SQL.
 *
 * Compare-and-swap.  The store offers cas_batch (rowstore.h): the whole
 * batch of compare-and-swaps is one statement,
 *   UPDATE t SET c = u.new FROM unnest($1::bigint[], $2::bytea[],
 *       $3::bytea[]) AS u(id, old, new)
 *   WHERE t.id = u.id AND t.c IS NOT DISTINCT FROM u.old RETURNING t.id
 * and an id that does not come back was raced (swapped 0).  Why a new
 * optional operation rather than buffering cas calls until commit: cas
 * reports *swapped synchronously and the engine counts done and raced
 * rows from it into the checkpoint it saves in the same transaction, so
 * a store that deferred the UPDATE would have to guess, or the engine
 * would save wrong counts; with cas_batch the answers come back before
 * the checkpoint is saved, the engine's logic stays the same for every
 * store (it calls cas per row when cas_batch is NULL, as for SQLite), and
 * a round trip per row is saved.  cas itself is the same statement over
 * one row.
 *
 * Transactions.  begin starts a READ COMMITTED transaction and sets its
 * lock_timeout and statement_timeout (set_config(..., true), i.e. SET
 * LOCAL; the same values are the session's for the reads outside a
 * transaction).  Row locks are taken only by the batch's UPDATE, right
 * before the checkpoint and the COMMIT: the store never waits on
 * anything but the database while it holds them.  When any operation
 * inside a transaction fails, the store rolls it back before returning
 * (the engine treats the batch as lost), as the SQLite store does.
 *
 * Errors, by SQLSTATE: 40P01 (deadlock), 40001 (serialization failure),
 * 55P03 (lock_timeout) and 57014 (statement_timeout) are KS_ERR_BUSY,
 * for the caller to retry; class 08 and a broken connection are
 * KS_ERR_UNAVAILABLE; 53100 (disk full) KS_ERR_FULL; 42501 (insufficient
 * privilege) and every other failure KS_ERR_STORE.  The store does not
 * reconnect: after KS_ERR_UNAVAILABLE, close it and open it again (the
 * engine resumes from the last committed checkpoint).  Messages in errbuf
 * (open and checkpoints only) name the table and columns and the SQLSTATE, never a row
 * value and never the server's own message (its DETAIL may quote rows).
 *
 * Lifetimes and threads as in rowstore.h: views point into the store's
 * last result, valid until the next call on the store; one thread at a
 * time.  visit_values is NULL: one statement over the whole table would
 * hold one snapshot for the whole census (holding back vacuum) and run
 * into statement_timeout on a large table, so the census reads through
 * the batched keyset scan instead; visit_rows is offered.
 */
#ifndef KEYSHIFT_ROWSTORE_PG_H
#define KEYSHIFT_ROWSTORE_PG_H

#include <keyshift/common.h>
#include <keyshift/error.h>
#include <keyshift/rowstore.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Defaults of ks_pg_options (a 0 field takes them). */
#define KS_PG_LOCK_TIMEOUT_DEFAULT_MS 30000u
#define KS_PG_STATEMENT_TIMEOUT_DEFAULT_MS 300000u

/* Options of the PostgreSQL store; NULL or all-zero: the defaults. */
typedef struct ks_pg_options {
    uint32_t lock_timeout_ms;      /* the longest wait for a lock (SET LOCAL lock_timeout),
                                      then KS_ERR_BUSY; 0: KS_PG_LOCK_TIMEOUT_DEFAULT_MS */
    uint32_t statement_timeout_ms; /* the longest one statement may run, then KS_ERR_BUSY;
                                      0: KS_PG_STATEMENT_TIMEOUT_DEFAULT_MS */
    int read_only;                 /* census, verify, status: the session is read-only
                                      (default_transaction_read_only), begin refuses, and
                                      keyshift's tables are never created */
} ks_pg_options;

/*
 * Connect with conninfo (a libpq connection string or URI: the caller's,
 * copied by libpq, not kept) and check target against the catalog as
 * the file comment says.  Unless read_only, create keyshift_migration and
 * keyshift_quarantine in the target table's schema if missing (one
 * transaction, serialized between concurrent openers by an advisory
 * lock), and give an older keyshift_quarantine its params column the
 * same way (bind_migration, keyshift/rowstore.h).  On success *out is the store, released by ks_rowstore_close;
 * target's strings need not outlive the call.  Errors (with a message in
 * errbuf when errbuf_len > 0): KS_ERR_INVALID_ARGUMENT for a NULL or
 * empty argument, a name over 1024 bytes or a keyshift_* table;
 * KS_ERR_UNAVAILABLE when the server cannot be reached; KS_ERR_NO_TARGET
 * for a missing table or column or one of the wrong kind; KS_ERR_BUSY,
 * KS_ERR_FULL or KS_ERR_STORE (e.g. no CREATE privilege) as mapped above.
 * *out is cleared on failure.
 */
KS_API KS_WUR ks_err ks_rowstore_pg_open(const char *conninfo, const ks_rowstore_target *target,
                                         const ks_pg_options *opts, ks_rowstore *out,
                                         char *errbuf, size_t errbuf_len);

/*
 * List the migration checkpoints kept in the PostgreSQL database of
 * conninfo, as ks_rowstore_sqlite_checkpoints does for SQLite: most
 * recently updated first; with table and column (both or neither), only
 * that column's, read from the keyshift_migration next to the visible
 * table `table`; without them, from the keyshift_migration the
 * connection's search_path makes visible.  Read-only (a read-only
 * session; never creates keyshift's tables: a schema without them has
 * no checkpoint, KS_OK with no call).  Each row is checked as
 * checkpoint_load checks it: KS_ERR_STORE (with a message in errbuf) for
 * a malformed one.  KS_ERR_UNAVAILABLE when the server cannot be
 * reached, KS_ERR_BUSY, KS_ERR_STORE as mapped above.  For `keyshift
 * migrate status`.
 */
KS_API KS_WUR ks_err ks_rowstore_pg_checkpoints(const char *conninfo, const char *table,
                                                const char *column, ks_checkpoint_list_fn fn,
                                                void *arg, char *errbuf, size_t errbuf_len);

/* One migrated column listed by ks_rowstore_pg_migrated_columns: schema
 * is the one whose keyshift_migration holds checkpoints of table.column
 * (tbl and col as the store saved them: the catalog spelling, not
 * schema-qualified); visible is nonzero when `table` on this connection
 * (its search_path) is that schema's table, i.e. when
 * ks_rowstore_pg_open of {table, column} opens the migrated one.  Every
 * view is valid during the call only.  Return nonzero to stop. */
typedef int (*ks_migrated_column_fn)(void *arg, ks_bytes schema, ks_bytes table,
                                     ks_bytes column, int visible);

/*
 * List the columns that migrations ran on in the PostgreSQL database of
 * conninfo: each distinct (tbl, col) of every keyshift_migration of the
 * database, whatever its schema (ks_rowstore_pg_open creates one in the
 * schema of each table it migrates), found through pg_class and read one
 * schema after the other, in schema then table and column order.
 * Read-only (a read-only session; creates nothing): a database without
 * keyshift_migration has no migrated column, KS_OK with no call.  Names
 * are checked as checkpoint_load checks them: KS_ERR_STORE (with a
 * message in errbuf) for a malformed row.  KS_ERR_UNAVAILABLE when the
 * server cannot be reached, KS_ERR_BUSY or KS_ERR_STORE (e.g. no USAGE
 * on a schema: a keyshift_migration that cannot be read is an error, not
 * skipped) as mapped above.  For `keyshift keys set-state ... destroyed`,
 * which counts the rows of every migrated column before a key version
 * is destroyed.
 */
KS_API KS_WUR ks_err ks_rowstore_pg_migrated_columns(const char *conninfo,
                                                     ks_migrated_column_fn fn, void *arg,
                                                     char *errbuf, size_t errbuf_len);

/*
 * Make every write transaction of store (a PostgreSQL store) check a
 * condition right after it begins, as ks_rowstore_sqlite_set_write_gate
 * does for SQLite: sql is a SELECT (the caller's own text, prepared
 * once, never data) whose first row's first column is true or 1 while
 * writes may go on; anything else (false, NULL, no row) rolls the
 * transaction back and begin() fails with KS_ERR_STOPPED, so the engine
 * stops before writing that batch (resumable).  A query that locks the
 * row it reads (FOR SHARE) makes a change of that row wait for the
 * batch's commit, and the next batch see it.  `keyshift migrate run` uses
 * it to stop the moment its rollout leaves backfill.  NULL removes the
 * gate.  KS_ERR_INVALID_ARGUMENT for another kind of store, a read-only
 * one or one inside a transaction; KS_ERR_STORE when sql does not
 * prepare.
 */
KS_API KS_WUR ks_err ks_rowstore_pg_set_write_gate(const ks_rowstore *store, const char *sql);

#ifdef __cplusplus
}
#endif
#endif /* KEYSHIFT_ROWSTORE_PG_H */
