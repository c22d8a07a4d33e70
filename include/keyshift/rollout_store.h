/*
 * keyshift/rollout_store.h -- the narrow interface through which the
 * rollout layer (the guards, the phases, ks_rollout_db_*, the application
 * policy) reaches its state: rollouts and their listed columns, the log,
 * the reader registry and health samples.  The sibling of rowstore.h.
 *
 * The rollout layer never sees SQL.  It checks arguments, runs the guard,
 * composes log reasons and checks every row a store returns (a store's
 * rows are untrusted: classes, canaries, scopes, readers and log rows are
 * judged above the store, the same for every database); a store keeps its
 * tables, decodes their columns strictly by type and range (a value of a
 * wrong type or out of range is KS_ERR_STORE), and provides transactions.
 * SQLite (ks_rollout_store_sqlite_open) is the embedded default; another
 * database (e.g. PostgreSQL) implements the same operations without any
 * change to the guards, and ks_rollout_db_wrap puts the rollout layer on
 * top of it.
 *
 * Transactions.  Every change of ks_rollout_db_* runs between begin and
 * commit (rollback on any failure), so a store whose begin takes the
 * write lock (SQLite: BEGIN IMMEDIATE) makes each change atomic and
 * serialised against other processes.  snapshot groups reads (the
 * policy's reload) into one consistent view.  data_version changes
 * whenever another connection commits: the policy polls it, cheaply,
 * before reloading.
 *
 * Read-only stores.  begin and every write operation fail with
 * KS_ERR_INVALID_ARGUMENT on a store opened read-only, or one whose tables
 * do not exist; reads of a store without tables find nothing (no rollout,
 * no reader, an empty window).
 *
 * Strings passed in are NUL-terminated and stay the caller's.  Names
 * (tables, columns) are bound as parameters, never pasted into a query.
 * Threads: a store is used by one thread at a time.
 */
#ifndef KEYSHIFT_ROLLOUT_STORE_H
#define KEYSHIFT_ROLLOUT_STORE_H

#include <keyshift/common.h>
#include <keyshift/error.h>
#include <keyshift/health.h>
#include <keyshift/rollout.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ks_rollout_store ks_rollout_store;

/* The operations of a rollout store.  "Not found" is the return named at
 * each operation; any other failure is the store's (KS_ERR_STORE,
 * KS_ERR_BUSY, KS_ERR_NO_MEMORY ...). */
typedef struct ks_rollout_store_ops {
    /* ---- the store and its transactions ---- */

    /* Release everything (rolling back a transaction left open). */
    void (*close)(ks_rollout_store *s);
    /* Start a write transaction, waiting for the write lock. */
    ks_err (*begin)(ks_rollout_store *s);
    /* Commit the write transaction (on failure it is rolled back). */
    ks_err (*commit)(ks_rollout_store *s);
    /* Roll back the transaction, if one is open. */
    void (*rollback)(ks_rollout_store *s);
    /* Start (begin nonzero) or end a read transaction: one snapshot. */
    ks_err (*snapshot)(ks_rollout_store *s, int begin);
    /* A counter that changes when another connection commits. */
    ks_err (*data_version)(ks_rollout_store *s, int64_t *out);

    /* ---- rollouts ---- */

    /* Find table.column of the application's schema as the store
     * compares names, refusing keyshift's own tables and columns a value
     * cannot be rewritten in; its spellings go to tbl and col.
     * KS_ERR_NO_TARGET when absent; messages to errbuf. */
    ks_err (*find_column)(ks_rollout_store *s, const char *table, const char *column,
                          char tbl[KS_ROLLOUT_IDENT_MAX + 1], char col[KS_ROLLOUT_IDENT_MAX + 1],
                          char *errbuf, size_t errbuf_len);
    /* The lowest id (0: none) of an open (not finalized) rollout: of
     * key_id when not NULL; else column-scoped on tbl.col, or (with
     * key_scopes) key-scoped listing tbl.col. */
    ks_err (*find_open)(ks_rollout_store *s, const char *tbl, const char *col, const char *key_id,
                        int key_scopes, int64_t *id);
    /* Insert r (every field but id, its listed columns' verified_at 0) and
     * return its id.  KS_ERR_ROLLOUT_EXISTS when the store's own
     * uniqueness rule (one open rollout per scope) refuses it. */
    ks_err (*insert)(ks_rollout_store *s, const ks_rollout *r, int64_t *id);
    /* The rollout with this id, with its listed columns
     * (KS_ERR_NO_ROLLOUT when none). */
    ks_err (*get)(ks_rollout_store *s, int64_t id, ks_rollout *out);
    /* The column-scoped rollout of table.column with the highest id
     * (KS_ERR_NO_ROLLOUT when none). */
    ks_err (*latest)(ks_rollout_store *s, const char *table, const char *column,
                     ks_rollout *out);
    /* The key-scoped rollout of key_id with the highest id
     * (KS_ERR_NO_ROLLOUT when none). */
    ks_err (*latest_key)(ks_rollout_store *s, const char *key_id, ks_rollout *out);
    /* Up to max rollouts with id > after_id, in id order, into out[0, *n). */
    ks_err (*list)(ks_rollout_store *s, int64_t after_id, ks_rollout *out, size_t max,
                   size_t *n);
    /* How many later rollouts touch r's scope (ks_rollout_facts.is_latest
     * is *n == 0): of the same column or key_id, key-scoped listing r's
     * column, or column-scoped on one of r's listed columns. */
    ks_err (*later_count)(ks_rollout_store *s, const ks_rollout *r, int64_t *n);
    /* Move rollout id from phase `from` to `to` at now, clearing its
     * verify times (and its columns') on entering backfill.
     * KS_ERR_STORE when it was not in `from`. */
    ks_err (*set_phase)(ks_rollout_store *s, int64_t id, ks_rollout_phase from,
                        ks_rollout_phase to, int64_t now);
    /* Replace the canary of rollout id at now. */
    ks_err (*set_canary)(ks_rollout_store *s, int64_t id, const ks_rollout_canary *canary,
                         int64_t now);
    /* Replace the thresholds, min_soak_s and reader_ttl_s of rollout id
     * at now (KS_ERR_STORE when no such row changed). */
    ks_err (*set_settings)(ks_rollout_store *s, int64_t id, const ks_thresholds *t,
                           uint32_t min_soak_s, uint32_t reader_ttl_s, int64_t now);
    /* Delete rollout id and its listed columns (an abort: the log and
     * the health samples stay).  KS_ERR_STORE when there was no such row. */
    ks_err (*remove)(ks_rollout_store *s, int64_t id);
    /* Record a verify pass at now: of rollout id's own scope (table
     * NULL), or of its listed column table.column.  KS_ERR_STORE when no
     * such row changed. */
    ks_err (*set_verified)(ks_rollout_store *s, int64_t id, const char *table,
                           const char *column, int64_t now);

    /* ---- the log (append-only) ---- */

    /* Append a row; from 0 is none (a creation). */
    ks_err (*log_append)(ks_rollout_store *s, int64_t rollout_id, int64_t time,
                         const char *actor, int from, int to, const char *reason,
                         int automatic);
    /* Up to max rows of rollout_id (0: every rollout) with id > after_id,
     * in id order, into out[0, *n). */
    ks_err (*log_list)(ks_rollout_store *s, int64_t rollout_id, int64_t after_id,
                       ks_rollout_log_entry *out, size_t max, size_t *n);

    /* ---- readers ---- */

    /* The readers whose heartbeat is at or after since, by instance_id:
     * the first max into out[0, *n), their number to *total. */
    ks_err (*readers_live)(ks_rollout_store *s, int64_t since, ks_rollout_reader *out,
                           size_t max, size_t *n, size_t *total);
    /* Insert or replace r, started and heartbeat at now. */
    ks_err (*reader_put)(ks_rollout_store *s, const ks_rollout_reader *r, int64_t now);
    /* Set the heartbeat of instance_id to now (KS_ERR_NOT_FOUND if none). */
    ks_err (*reader_heartbeat)(ks_rollout_store *s, const char *instance_id, int64_t now);
    /* Remove instance_id (none is fine). */
    ks_err (*reader_delete)(ks_rollout_store *s, const char *instance_id);

    /* ---- health samples ---- */

    /* Store one interval sample of rollout_id from instance_id; source is
     * "app" or "migrate"; every counter is at most INT64_MAX. */
    ks_err (*metrics_insert)(ks_rollout_store *s, int64_t rollout_id, const char *instance_id,
                             const char *source, const ks_health_sample *sample);
    /* The sum (ks_health_add) of rollout_id's samples with time >= since
     * from source ("app" or "migrate"; NULL: both); a zeroed sample when
     * there are none. */
    ks_err (*metrics_sum)(ks_rollout_store *s, int64_t rollout_id, int64_t since,
                          const char *source, ks_health_sample *out);
} ks_rollout_store_ops;

/* A store: implementations put this first in their own structure. */
struct ks_rollout_store {
    const ks_rollout_store_ops *ops;
};

/*
 * Open the rollout store in the application's SQLite database at path,
 * with ks_rollout_db_open's flags and rules (never creating the file;
 * creating or upgrading keyshift's tables to schema version 5 unless
 * KS_ROLLOUT_DB_READ_ONLY; refusing a newer version).  Messages go to
 * errbuf.  Close with its close op, or hand it to ks_rollout_db_wrap.
 */
KS_API KS_WUR ks_err ks_rollout_store_sqlite_open(const char *path, unsigned flags,
                                                  ks_rollout_store **out, char *errbuf,
                                                  size_t errbuf_len);

/* A ks_rollout_db over store, which it owns from this call on (closed by
 * ks_rollout_db_close, or here on failure: KS_ERR_NO_MEMORY). */
KS_API KS_WUR ks_err ks_rollout_db_wrap(ks_rollout_store *store, ks_rollout_db **out);

/*
 * Open a policy (ks_policy_open's rules and answers) over store instead of
 * a SQLite path: e.g. a store of ks_rollout_store_pg_open, for an
 * application whose rollout state lives in PostgreSQL.  The policy owns
 * store from this call on (closed by ks_policy_close, or here on any
 * failure).  Its refresh polls the store's data_version, as over SQLite.
 * Errors of ks_policy_open; KS_ERR_INVALID_ARGUMENT for a NULL store.
 */
KS_API KS_WUR ks_err ks_policy_open_store(ks_rollout_store *store, const ks_policy_options *opts,
                                          ks_policy **out);

/*
 * As ks_policy_open_store, with a second store on the same database,
 * writer, for the instance's own writes: its registration, heartbeat, key
 * list and health samples (NULL: they use store).  Those writes may wait
 * on the database's write lock (lock_timeout, a busy timeout); on their
 * own connection, answers (ks_policy_write_target, ks_policy_may_read)
 * and refreshes go on meanwhile instead of waiting behind them.  The
 * policy owns both stores from this call on (closed by ks_policy_close,
 * or here on any failure).  KS_ERR_INVALID_ARGUMENT for a NULL store or
 * writer == store.
 */
KS_API KS_WUR ks_err ks_policy_open_stores(ks_rollout_store *store, ks_rollout_store *writer,
                                           const ks_policy_options *opts, ks_policy **out);

#ifdef __cplusplus
}
#endif
#endif /* KEYSHIFT_ROLLOUT_STORE_H */
