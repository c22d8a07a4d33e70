/*
 * migrate/store/sqlite/sqlite_util.h -- what every SQLite connection of the
 * library shares: opening and configuring a connection safely, the busy
 * handler with backoff and jitter, error mapping, messages, and the
 * versions of keyshift's own tables.  Used by the row store
 * (sqlite_store.c) and the rollout store (migrate/rollout/).
 *
 * Internal to the library (no KS_API, hidden in the shared library).
 */
#ifndef KS_MIGRATE_SQLITE_UTIL_H
#define KS_MIGRATE_SQLITE_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include <sqlite3.h>

#include <keyshift/error.h>

#include "../../errbuf.h"

/* The newest version of keyshift's tables (keyshift_meta.schema_version)
 * any part of this library understands: 1 has keyshift_meta,
 * keyshift_migration and keyshift_quarantine (the row store); 2 adds the
 * rollout tables (migrate/rollout/rollout_db.c) and changes none of
 * version 1's; 3 adds key-scoped rollouts (keyshift_rollout.scope_key_id,
 * keyshift_rollout_column) and changes none of version 1's; 4 adds the
 * rollout's encoding (keyshift_rollout.encoding).  The health samples'
 * latency sums (keyshift_metrics.seal_ns_sum, open_ns_sum) are columns
 * added to version 4 in place, which older libraries ignore
 * (rollout_sqlite.c).  Every opener refuses a database of a newer
 * version. */
#define KS_SQLITE_SCHEMA_LATEST 4

/* Default lock wait of a connection, in milliseconds. */
#define KS_SQLITE_BUSY_DEFAULT_MS 30000u

/* The state of one connection's busy handler. */
typedef struct ks_sqlite_busy {
    uint32_t timeout_ms;      /* total wait before giving up */
    uint64_t start_ms;        /* monotonic time of the first wait */
    uint32_t delay_ms;        /* the next base sleep */
    uint64_t rng;             /* xorshift64 state for jitter (not secret) */
} ks_sqlite_busy;

/* Format a message into errbuf (when there is one); returns err so that
 * callers can write `return ks_sqlite_fail(...)`: the library's one
 * formatter (migrate/errbuf.h). */
#define ks_sqlite_fail ks_errbuf_fail

/* Copy a user-given name into out for a message, replacing control bytes
 * by '?' and truncating; returns out. */
const char *ks_sqlite_printable(const char *name, char *out, size_t out_len);

/* Map an SQLite result code (not OK, ROW or DONE) to a keyshift error. */
ks_err ks_sqlite_map_rc(int rc);

/* Monotonic milliseconds. */
uint64_t ks_sqlite_mono_ms(void);

/* Set up b for a wait of timeout_ms in all (0: the default), seeding the
 * jitter from the clock, the process and b's address. */
void ks_sqlite_busy_init(ks_sqlite_busy *b, uint32_t timeout_ms);

/*
 * Open the database at path (never creating it: a missing file is
 * KS_ERR_NO_TARGET) read-only or read-write, and configure it: extended
 * result codes, SQLITE_DBCONFIG_DEFENSIVE on, the schema untrusted, and
 * busy (which must outlive the connection) as its busy handler.
 * full_mutex selects SQLITE_OPEN_FULLMUTEX instead of NOMUTEX.  On
 * failure *out is NULL and errbuf says why (never SQLite's own message).
 */
KS_WUR ks_err ks_sqlite_connect(const char *path, int read_only, int full_mutex,
                                ks_sqlite_busy *busy, sqlite3 **out, char *errbuf,
                                size_t errbuf_len);

/* Report an SQLite failure rc while doing `what`, with the generic text of
 * the code only (never sqlite3_errmsg, which may quote schema or data). */
ks_err ks_sqlite_fail_rc(char *errbuf, size_t errbuf_len, int rc, const char *what);

#endif /* KS_MIGRATE_SQLITE_UTIL_H */
