/*
 * keyshift/rowstore.h -- the narrow interface through which the migration
 * engine reaches the database holding the records.
 *
 * The engine never sees SQL.  It scans batches of rows in id order,
 * replaces values with compare-and-swap inside short write transactions,
 * quarantines rows it must not touch, and saves its checkpoint in the same
 * transaction as each batch; the census visits every value once, without
 * copies, where the store offers it (visit_values), and the engine reads
 * each batch's rows straight into memory of its own (visit_rows).  SQLite
 * (ks_rowstore_sqlite_open) is the embedded default; PostgreSQL
 * (keyshift/rowstore_pg.h, ks_rowstore_pg_open) implements the same
 * operations without any change to the engine.
 *
 * Values read from the database are untrusted: the engine hands envelope
 * bytes to the strict parser only.
 *
 * Lifetimes.  Every view a store returns (row values, checkpoint strings)
 * stays valid until the next call of any operation on that store; the
 * views visit_values and visit_rows pass to their callbacks, only during
 * that call.
 * Threads.  A store is used by one thread at a time.
 */
#ifndef KEYSHIFT_ROWSTORE_H
#define KEYSHIFT_ROWSTORE_H

#include <keyshift/common.h>
#include <keyshift/error.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The type of a database value. */
typedef enum ks_value_type {
    KS_VALUE_NULL = 0,
    KS_VALUE_INTEGER = 1,
    KS_VALUE_TEXT = 2,
    KS_VALUE_BLOB = 3
} ks_value_type;

/* A database value: an integer, or bytes (a view) for TEXT and BLOB. */
typedef struct ks_value {
    ks_value_type type;
    int64_t integer;     /* KS_VALUE_INTEGER */
    ks_bytes bytes;      /* KS_VALUE_TEXT, KS_VALUE_BLOB */
} ks_value;

/* How a column holds its envelopes (docs/format.md section 10), the
 * operator's choice for each column: the envelope's bytes (BLOB, bytea),
 * or its canonical base64 text, which begins "S1NF" (TEXT, text,
 * varchar).  The choice is part of a migration's parameters
 * (ks_migrate_params.encoding) and is recorded with it. */
typedef enum ks_value_encoding {
    KS_ENCODING_BINARY = 0, /* the default */
    KS_ENCODING_BASE64 = 1
} ks_value_encoding;

/* The encoding's name, "binary" or "base64"; NULL for another value. */
KS_API const char *ks_value_encoding_name(int encoding);

/* The most columns a context template may reference. */
#define KS_ROWSTORE_MAX_CONTEXT_COLUMNS 8

/* What to migrate: identifiers are checked against the schema, never
 * pasted into SQL unchecked. */
typedef struct ks_rowstore_target {
    const char *table;
    const char *column;          /* the encrypted (or to-be-encrypted) column */
    const char *id_column;       /* NULL: the rowid; else a unique, non-NULL column */
    const char *tenant_column;   /* NULL: none (the tenant is then a constant) */
    const char *context_columns[KS_ROWSTORE_MAX_CONTEXT_COLUMNS]; /* trusted columns the
                                                                     context template uses */
    size_t n_context_columns;
    ks_value_encoding encoding;  /* how the column holds envelopes: the store writes
                                    base64 values as text; 0: binary */
} ks_rowstore_target;

/* One row as the engine sees it. */
typedef struct ks_row {
    ks_value id;         /* never NULL */
    ks_value value;      /* the target column */
    ks_value tenant;     /* the tenant column, or KS_VALUE_NULL without one */
    ks_value context[KS_ROWSTORE_MAX_CONTEXT_COLUMNS]; /* in target order */
    int quarantined;     /* nonzero when the row is in quarantine (of the bound migration,
                            or an entry without one; any entry when unbound:
                            ks_rowstore_ops.bind_migration): never modify it */
} ks_row;

/* The durable state of one migration (docs/migration.md).  The store
 * keeps one per distinct params string, in the same transaction as the
 * batch it describes. */
typedef struct ks_checkpoint {
    ks_bytes params;     /* canonical parameters: identifies the migration */
    ks_bytes state;      /* "running", "paused", "stopped", "complete", "superseded" */
    ks_value cursor;     /* last id done in this pass; KS_VALUE_NULL before the first */
    uint32_t pass;       /* 1, 2, ...: a pass rescans rows raced in the previous one */
    uint64_t done;       /* rows rewritten */
    uint64_t skipped;    /* rows already at the target */
    uint64_t raced;      /* rows changed underneath (retried in a later pass) */
    uint64_t quarantined;/* rows put in quarantine */
    uint64_t wrong_state;/* rows in the wrong state for the mode, reported, untouched */
    int64_t started;     /* Unix seconds */
    int64_t updated;
    int64_t finished;    /* 0 until complete or stopped */
} ks_checkpoint;

/* The callback of ks_rowstore_ops.visit_values: one row's target-column
 * value, a view valid only until the callback returns (copy what must
 * outlive it).  Return KS_OK to go on; any other code stops the visit,
 * which returns that code.  It must not call any operation of the store. */
typedef ks_err (*ks_rowstore_value_fn)(void *arg, const ks_value *value);

/* The callback of ks_rowstore_ops.visit_rows: one row, every view in it
 * valid only until the callback returns (copy what must outlive it).
 * Return KS_OK to go on; any other code stops the visit, which returns
 * that code.  It must not call any operation of the store. */
typedef ks_err (*ks_rowstore_row_fn)(void *arg, const ks_row *row);

/* The most bytes of a migration's canonical parameters a store keeps
 * (ks_rowstore_ops.bind_migration). */
#define KS_ROWSTORE_PARAMS_MAX 8192u

/* One row in quarantine (ks_rowstore_ops.quarantine_list): views valid
 * during the callback only. */
typedef struct ks_quarantine_entry {
    ks_value id;         /* the row's id */
    ks_bytes error;      /* the error name it was quarantined under */
    ks_bytes params;     /* the canonical parameters of the migration that quarantined
                            it; empty for an entry recorded before they were kept */
    int64_t time;        /* Unix seconds when it was quarantined */
} ks_quarantine_entry;

/* The callback of ks_rowstore_ops.quarantine_list: nonzero stops the
 * listing. */
typedef int (*ks_rowstore_quarantine_fn)(void *arg, const ks_quarantine_entry *e);

/* Which quarantine entries ks_rowstore_ops.quarantine_release deletes:
 * all of the target's (all nonzero), or those whose id is *id (when not
 * NULL) and whose error name is error (when not NULL); both given, the
 * entries that match both. */
typedef struct ks_quarantine_select {
    const ks_value *id;
    const char *error;
    int all;
} ks_quarantine_select;

typedef struct ks_rowstore_ops {
    /* Read up to max rows whose id is greater than *after (all rows when
     * after is NULL or of type KS_VALUE_NULL), in ascending id order, into
     * rows[0, *n).  *n == 0 at the end.  Outside a write transaction each
     * scan is its own short read. */
    ks_err (*scan)(void *self, const ks_value *after, size_t max, ks_row *rows, size_t *n);
    /* Count the rows of the target (for progress). */
    ks_err (*count)(void *self, uint64_t *n);
    /* Start a write transaction, waiting for the database lock with backoff
     * up to the store's busy timeout (then KS_ERR_BUSY). */
    ks_err (*begin)(void *self);
    /* Inside the transaction: set the value of row id to new_value (stored
     * as a BLOB) only if it is still old.  *swapped is 1 when the row was
     * changed, 0 when it changed underneath or vanished (raced). */
    ks_err (*cas)(void *self, const ks_value *id, const ks_value *old, ks_bytes new_value,
                  int *swapped);
    /* Inside the transaction: record row id in quarantine with an error
     * name and the bound migration's parameters (bind_migration;
     * idempotent for the same migration).  The row itself is never
     * modified. */
    ks_err (*quarantine)(void *self, const ks_value *id, const char *error);
    /* Inside the transaction: save cp, replacing the one with the same params. */
    ks_err (*checkpoint_save)(void *self, const ks_checkpoint *cp);
    /* Load the checkpoint whose params equal params (KS_ERR_NOT_FOUND if
     * none); with params {NULL, 0}, the most recently updated one. */
    ks_err (*checkpoint_load)(void *self, ks_bytes params, ks_checkpoint *cp);
    /* Commit the transaction (KS_ERR_BUSY, KS_ERR_FULL, KS_ERR_STORE). */
    ks_err (*commit)(void *self);
    /* Roll the transaction back; a no-op outside one. */
    void (*rollback)(void *self);
    /* Roll back any open transaction and release self. */
    void (*close)(void *self);
    /* Optional (NULL: callers fall back to scan), read-only: call fn once
     * per row of the target with the target column's value only (no id,
     * tenant, context or quarantine flag), in ascending id order, without
     * copying it.  For callers that read every value once and keep
     * nothing, such as the census.  It may run as one read for the whole
     * table (SQLite: one statement; with a rollback journal, writers wait
     * for it through their busy timeout).  KS_OK after the last row; fn's
     * code when fn stops it; KS_ERR_BUSY (lock wait past the busy
     * timeout), KS_ERR_NO_MEMORY or KS_ERR_STORE when reading fails
     * (after fn saw some rows, maybe: a caller discards its partial
     * result).  Inside a write transaction a read failure rolls it back,
     * as for scan; a stop by fn does not. */
    ks_err (*visit_values)(void *self, ks_rowstore_value_fn fn, void *arg);
    /* Optional (NULL: callers use scan): the rows scan would return for
     * the same after and max, in the same order and with the same reads
     * and transaction behaviour, handed to fn one at a time as views
     * valid only during the call, instead of copied into the store's
     * buffer.  For a caller that copies each row into memory of its own
     * anyway, such as the migration engine (whose batches outlive the
     * next store call): one copy of each value instead of two.  KS_OK
     * after the last row (max rows, or the end of the table); fn's code
     * when fn stops it (a transaction stands); the same errors as scan
     * (after fn saw some rows, maybe: a caller discards what it kept). */
    ks_err (*visit_rows)(void *self, const ks_value *after, size_t max, ks_rowstore_row_fn fn,
                         void *arg);
    /* Optional (NULL: callers call cas once per row): inside the
     * transaction, the n compare-and-swaps cas would do for ids[i],
     * olds[i], new_values[i] (i < n, distinct ids), as one round trip to
     * the database where the store can (PostgreSQL: one UPDATE over
     * arrays).  swapped[i] is set as cas sets *swapped, synchronously:
     * the caller counts done and raced rows from it before saving the
     * checkpoint.  An error rolls the transaction back (no swapped[i]
     * is then meaningful), as for cas.  A store for which one statement
     * per row costs nothing more (SQLite, in process) leaves it NULL. */
    ks_err (*cas_batch)(void *self, size_t n, const ks_value *const *ids,
                        const ks_value *const *olds, const ks_bytes *new_values, int *swapped);
    /* Optional (NULL: the store offers no bounded scan, and a caller that
     * needs one, such as a chunked run (keyshift/chunks.h), refuses it):
     * visit_rows restricted to ids at most *upto.  The rows visit_rows
     * would return for after and max whose id is also <= *upto (upto an
     * INTEGER: ids of a chunked store are integers), in the same order,
     * with the same reads, transaction behaviour, views and errors.  It
     * lets a worker read one key range (chunk) of the table without
     * reading past its end into another worker's range.
     * KS_ERR_INVALID_ARGUMENT when upto is NULL or not an INTEGER, or
     * after is neither NULL, KS_VALUE_NULL nor an INTEGER. */
    ks_err (*visit_rows_range)(void *self, const ks_value *after, const ks_value *upto,
                               size_t max, ks_rowstore_row_fn fn, void *arg);
    /* Optional (NULL: quarantine belongs to the column, whatever the
     * migration): tie quarantine to the migration whose canonical
     * parameters are params (copied; {NULL, 0} unbinds).  Once bound,
     * quarantine records params with each row it puts in quarantine (a
     * row already there under other parameters moves to these, with the
     * new error and time), and scan, visit_rows and visit_rows_range flag
     * as quarantined only the rows quarantined under params: a migration
     * with other parameters (a corrected context, purpose or tenant) tries
     * the rows a mistaken one quarantined again, and quarantines them
     * again only if they fail again.  Entries recorded without
     * parameters (by a store before they were kept) hold back no bound
     * migration.  Unbound, every entry of the column flags its row.  The
     * engine binds once it has settled its parameters, before its first
     * scan.  KS_ERR_NO_MEMORY, KS_ERR_INVALID_ARGUMENT (longer than
     * KS_ROWSTORE_PARAMS_MAX). */
    ks_err (*bind_migration)(void *self, ks_bytes params);
    /* Optional (NULL: the store cannot list its quarantine), read-only:
     * call fn once per row of the target in keyshift_quarantine, in id
     * order, with views valid during the call only; fn returns nonzero to
     * stop.  KS_OK (also for a database without the table), KS_ERR_STORE
     * for a malformed entry, KS_ERR_BUSY, KS_ERR_NO_MEMORY. */
    ks_err (*quarantine_list)(void *self, ks_rowstore_quarantine_fn fn, void *arg);
    /* Optional (NULL: the store cannot release), inside a write
     * transaction: delete the target's quarantine entries that sel
     * selects; *released gets how many.  The rows themselves are never
     * touched: the next run of their migration tries them again.
     * KS_ERR_INVALID_ARGUMENT for a selector that selects nothing
     * explicitly (no id, no error and not all).  A failure rolls the
     * transaction back. */
    ks_err (*quarantine_release)(void *self, const ks_quarantine_select *sel,
                                 uint64_t *released);
} ks_rowstore_ops;

typedef struct ks_rowstore {
    const ks_rowstore_ops *ops;
    void *self;
    const char *name;    /* "sqlite", ... */
    int id_stable;       /* set by the store's open: nonzero when a row keeps its id
                            whatever happens to the table (a primary key, a UNIQUE NOT
                            NULL column, SQLite's INTEGER PRIMARY KEY), 0 when VACUUM
                            or a dump/restore may renumber it (SQLite's bare rowid).
                            Only a stable id may be bound into a context
                            (ks_migrate_check_context, docs/migration.md "Ids"). */
    ks_value_encoding encoding; /* set by the store's open from its target: how the
                                   column holds envelopes; the census reads values by
                                   it, and a migration's or verify's parameters must
                                   name the same one */
} ks_rowstore;

/*
 * How the SQLite store's connection makes its commits durable (PRAGMA
 * synchronous; ks_sqlite_options.synchronous).  Per connection: the
 * application's own connections keep their setting.
 *
 *   KS_SQLITE_SYNC_FULL    (0, the default) every commit is on disk when
 *                          it returns, in any journal mode.
 *   KS_SQLITE_SYNC_NORMAL  WAL databases only: the WAL is synced at
 *                          checkpoints, not at each commit, so after a
 *                          power loss (not a crash of the process) the
 *                          last commits may roll back; the database is
 *                          never corrupted.  Each batch commits its
 *                          checkpoint with its rows, so a migration then
 *                          resumes from the last durable batch and redoes
 *                          at most the batches lost.  For a database in
 *                          any other journal mode (DELETE, TRUNCATE,
 *                          PERSIST, ...: there NORMAL leaves a small chance
 *                          of corruption on power loss)
 *                          ks_rowstore_sqlite_open refuses it with
 *                          KS_ERR_INVALID_ARGUMENT and a message; it never
 *                          falls back to FULL silently.  The journal mode
 *                          is read when the store opens; SQLite lets no
 *                          connection leave WAL while the store's is open.
 *
 * Any other value: KS_ERR_INVALID_ARGUMENT.  docs/migration.md,
 * "Durability: --synchronous".
 */
typedef enum ks_sqlite_sync {
    KS_SQLITE_SYNC_FULL = 0,
    KS_SQLITE_SYNC_NORMAL = 1,
} ks_sqlite_sync;

/* Options of the SQLite store (zero-initialised: the defaults). */
typedef struct ks_sqlite_options {
    uint32_t busy_timeout_ms;  /* how long to wait for a lock, with backoff; default 30000 */
    int read_only;             /* open read-only (census, verify, status) */
    uint32_t cache_kib;        /* the connection's page cache (PRAGMA cache_size) in KiB;
                                  0: KS_SQLITE_CACHE_KIB_DEFAULT */
    ks_sqlite_sync synchronous; /* PRAGMA synchronous (ks_sqlite_sync); default FULL */
} ks_sqlite_options;

/* The store's default page cache: 16 MiB.  The engine scans batch k+1
 * before batch k's compare-and-swaps commit (docs/migration.md,
 * "Pipeline"), so two batches' pages (two batches of 500 rows of 2 KiB
 * are about 1,000 pages of 4 KiB) must stay cached; SQLite's default of
 * 2,000 KiB made the writes re-read pages the scan had just read. */
#define KS_SQLITE_CACHE_KIB_DEFAULT 16384u

/*
 * Open the SQLite database at path with the target checked against its
 * schema: KS_ERR_NO_TARGET (with a message in errbuf) when the file,
 * table or a column does not exist or id_column is not unique and NOT
 * NULL; KS_ERR_INVALID_ARGUMENT for a bad identifier, or for
 * synchronous NORMAL on a database not in WAL mode.  Unless read_only,
 * creates the keyshift_migration and keyshift_quarantine tables if
 * missing, and gives an older keyshift_quarantine its params column
 * (bind_migration).  opts NULL: defaults.
 */
KS_API KS_WUR ks_err ks_rowstore_sqlite_open(const char *path, const ks_rowstore_target *target,
                                             const ks_sqlite_options *opts, ks_rowstore *out,
                                             char *errbuf, size_t errbuf_len);

/*
 * Make every write transaction of store (an SQLite store) check a
 * condition right after it begins: sql is a SELECT over the store's
 * database whose first row's first column is the integer 1 while writes
 * may go on.  Anything else (0, NULL, no row) rolls the transaction back
 * and begin() fails with KS_ERR_STOPPED, so the engine stops before
 * writing that batch (resumable).  The check runs under the write lock:
 * a change committed before it is seen, and one after it waits for the
 * batch.  `keyshift migrate run` uses it to stop the moment its rollout
 * leaves backfill.  sql is the caller's own text (prepared once), never
 * data; NULL removes the gate.  KS_ERR_INVALID_ARGUMENT for another kind
 * of store, a read-only one or one inside a transaction; KS_ERR_STORE
 * when sql does not prepare.
 */
KS_API KS_WUR ks_err ks_rowstore_sqlite_set_write_gate(const ks_rowstore *store, const char *sql);

/* One checkpoint listed by ks_rowstore_sqlite_checkpoints: the table and
 * column it belongs to, and the checkpoint; every view is valid during
 * the call only.  Return nonzero to stop the listing. */
typedef int (*ks_checkpoint_list_fn)(void *arg, ks_bytes table, ks_bytes column,
                                     const ks_checkpoint *cp);

/*
 * List the migration checkpoints kept in the SQLite database at path, most
 * recently updated first; with table and column (both or neither), only
 * that column's.  Read-only: never creates the file or keyshift's tables
 * (a database without them has no checkpoint: KS_OK with no call).  Each
 * row is checked as checkpoint_load checks it: KS_ERR_STORE (with a
 * message in errbuf) for a malformed one.  KS_ERR_NO_TARGET when the file
 * does not exist, KS_ERR_BUSY when the database stayed locked.  For
 * `keyshift migrate status`.
 */
KS_API KS_WUR ks_err ks_rowstore_sqlite_checkpoints(const char *path, const char *table,
                                                    const char *column, ks_checkpoint_list_fn fn,
                                                    void *arg, char *errbuf, size_t errbuf_len);

/* Close a store (any kind); {NULL} is a no-op. */
KS_API void ks_rowstore_close(ks_rowstore *store);

#ifdef __cplusplus
}
#endif
#endif /* KEYSHIFT_ROWSTORE_H */
