/*
 * tools/cli/throttle.h -- when `keyshift migrate run` on PostgreSQL pauses
 * between batches (docs/migration.md, "Throttling"): a pause flag set by
 * `keyshift migrate pause` (cleared by `resume`), a --throttle-query of
 * the operator's that returns true, or the replicas' replay lag above
 * --max-replica-lag.  Checked after every committed batch, on a session
 * of its own, read-only but for creating the flag's table; no row lock of
 * the data table is held meanwhile.  A tool's header: nothing here is
 * part of the library.
 */
#ifndef KS_TOOLS_THROTTLE_H
#define KS_TOOLS_THROTTLE_H

#include <signal.h>

#include <libpq-fe.h>

/* The throttle of one run.  Zeroed: none (every check passes at once). */
typedef struct ks_cli_throttle {
    PGconn *conn;        /* the checks' session; NULL: no throttle */
    int has_query;       /* --throttle-query is prepared as "ks_throttle" */
    double max_lag_s;    /* --max-replica-lag in seconds; < 0: not checked */
    char table[256], column[256];
    double throttled_s;  /* seconds spent paused so far (closed pauses) */
    unsigned pauses;     /* how many times it paused */
    int active;          /* a pause is in progress, since `since` (ks_cli_mono_s) */
    double since;
} ks_cli_throttle;

/* How often a paused run checks again, in seconds. */
#define KS_CLI_THROTTLE_POLL_S 0.5

/*
 * Open t for a run over table.column of the PostgreSQL database conninfo:
 * query (NULL: none) is prepared on its session (its own text, never
 * data; it must return one row whose first column is true to pause),
 * max_lag (NULL: none) is a duration (e.g. 5s, 1m).  Creates
 * keyshift_migrate_pause if missing.  EX_OK, or an exit code after a
 * message (64 for a bad duration or a query that does not prepare, 69 when
 * the server is unreachable).
 */
int ks_cli_throttle_open(ks_cli_throttle *t, const char *conninfo, const char *table,
                         const char *column, const char *query, const char *max_lag);

/*
 * After a committed batch: while a condition holds, say so once (a JSON
 * line when json, else a line on stderr), wait KS_CLI_THROTTLE_POLL_S and
 * check again, until none holds or *stop is set; the time goes into
 * t->throttled_s.  A failed check (the session lost) pauses nothing: the
 * run's own connection reports a lost server.
 */
void ks_cli_throttle_wait(ks_cli_throttle *t, volatile sig_atomic_t *stop, int json);

/*
 * One check, without waiting (the gate of `migrate run --workers`, and
 * each step of ks_cli_throttle_wait): nonzero while a condition holds.
 * The first check that finds one says so (as ks_cli_throttle_wait does)
 * and opens a pause; the first that finds none after it closes the
 * pause ("resumed after"), its time going into t->throttled_s.  Not
 * thread-safe: callers serialize.
 */
int ks_cli_throttle_poll(ks_cli_throttle *t, int json);

/* A run stopped while paused: close the pause (its time counted). */
void ks_cli_throttle_stopped(ks_cli_throttle *t, int json);

/* The seconds throttled so far, the open pause's included. */
double ks_cli_throttle_spent(const ks_cli_throttle *t);

/* Close t's session; a zeroed t is fine. */
void ks_cli_throttle_close(ks_cli_throttle *t);

/*
 * `keyshift migrate pause` (paused nonzero, with reason) and `resume`:
 * set or clear table.column's flag in keyshift_migrate_pause (created if
 * missing).  EX_OK, or an exit code after a message.
 */
int ks_cli_pause_set(const char *conninfo, const char *table, const char *column, int paused,
                     const char *reason);

#endif /* KS_TOOLS_THROTTLE_H */
