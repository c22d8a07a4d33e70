/*
 * keyshift/rollout_store_pg.h -- the rollout store (keyshift/rollout_store.h)
 * in the application's PostgreSQL database, over libpq.  docs/rollout.md,
 * "Rollout state on PostgreSQL", says which tables it keeps, which
 * privileges it needs, how changes are serialised and what the policy's
 * refresh costs.
 *
 * In short: keyshift_meta (rollout_schema_version), keyshift_rollout,
 * keyshift_rollout_column, keyshift_rollout_log (append-only by trigger),
 * keyshift_readers, keyshift_metrics and keyshift_rollout_version (one row:
 * the data_version counter, bumped by a trigger on every statement that
 * changes keyshift_rollout or keyshift_rollout_column), found through the
 * connection's search_path and created in its current schema.  begin is
 * READ COMMITTED plus LOCK TABLE keyshift_rollout IN SHARE ROW EXCLUSIVE
 * MODE (the counterpart of SQLite's BEGIN IMMEDIATE); snapshot is
 * REPEATABLE READ READ ONLY.  Names are compared with ASCII-only case
 * folding, as ks_rollout_name_cmp and SQLite's NOCASE do.  Errors map by
 * SQLSTATE as the row store's (keyshift/rowstore_pg.h, "Errors"), and a
 * unique violation on insert is KS_ERR_ROLLOUT_EXISTS.
 *
 * Lost connections.  The call that meets a dropped connection fails with
 * KS_ERR_UNAVAILABLE (inside a transaction, the transaction is lost);
 * the next begin, snapshot or data_version outside a transaction
 * reconnects with the same parameters and settings, so a long-lived
 * policy fails closed once and then recovers by itself.
 */
#ifndef KEYSHIFT_ROLLOUT_STORE_PG_H
#define KEYSHIFT_ROLLOUT_STORE_PG_H

#include <keyshift/common.h>
#include <keyshift/error.h>
#include <keyshift/rollout_store.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The lock and statement timeouts of the store's sessions and
 * transactions (waiting longer is KS_ERR_BUSY). */
#define KS_ROLLOUT_PG_LOCK_TIMEOUT_MS 10000
#define KS_ROLLOUT_PG_STATEMENT_TIMEOUT_MS 30000

/*
 * Nonzero when db names a PostgreSQL database rather than a SQLite file:
 * a URI (postgresql://, postgres://) or a libpq key=value string,
 * recognized by its first word being a libpq keyword (PQconndefaults:
 * host, dbname, user, service, ...) followed by '='.  A SQLite file so
 * named is given as ./NAME.  The one rule of every --db and of
 * ks_app_options.database.
 */
KS_API int ks_rollout_store_pg_names(const char *db);

/*
 * Open the rollout store in the PostgreSQL database of conninfo (a libpq
 * connection string or URI, not kept).  Unless read_only, create
 * keyshift's rollout tables when any is missing, in one transaction under
 * an advisory lock (concurrent openers do not race), and refuse a schema
 * newer than this library; read_only makes the session read-only
 * (default_transaction_read_only), begin and every write refuse
 * (KS_ERR_INVALID_ARGUMENT), and a database without the tables reads as
 * empty.  Messages (never the server's text) go to errbuf.  Errors:
 * KS_ERR_INVALID_ARGUMENT (NULL arguments), KS_ERR_UNAVAILABLE (cannot
 * connect), KS_ERR_STORE (e.g. no CREATE privilege, a newer schema),
 * KS_ERR_BUSY, KS_ERR_NO_MEMORY.  Close with its close op, or hand it to
 * ks_rollout_db_wrap or ks_policy_open_store.
 */
KS_API KS_WUR ks_err ks_rollout_store_pg_open(const char *conninfo, int read_only,
                                              ks_rollout_store **out, char *errbuf,
                                              size_t errbuf_len);

#ifdef __cplusplus
}
#endif
#endif /* KEYSHIFT_ROLLOUT_STORE_PG_H */
