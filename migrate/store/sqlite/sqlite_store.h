/*
 * migrate/store/sqlite/sqlite_store.h -- internals of the SQLite row store
 * (migrate/store/sqlite/sqlite_store.c).  Internal (no KS_API, hidden in the
 * shared library): only code linked with the library's objects, i.e. the
 * unit tests, can reach them.
 */
#ifndef KS_MIGRATE_SQLITE_STORE_H
#define KS_MIGRATE_SQLITE_STORE_H

#include <stdint.h>

#include <keyshift/error.h>
#include <keyshift/rowstore.h>

/* The version of the keyshift_* tables this code reads and writes
 * (keyshift_meta.schema_version). */
#define KS_SQLITE_SCHEMA_VERSION 1

/* The SQL that creates keyshift's own tables if missing (schema version
 * KS_SQLITE_SCHEMA_VERSION; documented at the top of sqlite_store.c).
 * Exposed so that a fuzz harness can build a database the way the store
 * would, without opening one. */
extern const char ks_sqlite_schema_sql[];

/* Tests only (built with -DKS_TEST_HOOKS): run PRAGMA max_page_count =
 * pages on the connection of store (an SQLite store), to provoke
 * SQLITE_FULL.  The limit is per connection, hence the hook.  Returns
 * KS_ERR_INVALID_ARGUMENT for another kind of store. */
ks_err ks_rowstore_sqlite_test_max_pages(const ks_rowstore *store, uint32_t pages);

/* Tests only (built with -DKS_TEST_HOOKS): the integer value of PRAGMA
 * main.<name> (lowercase letters and '_') as the store's own connection
 * sees it, e.g. "synchronous" (1 NORMAL, 2 FULL), which is per
 * connection and so cannot be read from another one.  Returns
 * KS_ERR_INVALID_ARGUMENT for another kind of store or a bad name,
 * KS_ERR_STORE when the pragma gives no row. */
KS_WUR ks_err ks_rowstore_sqlite_test_pragma(const ks_rowstore *store, const char *name,
                                             int64_t *out);

#endif /* KS_MIGRATE_SQLITE_STORE_H */
