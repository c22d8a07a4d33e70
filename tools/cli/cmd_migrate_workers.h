/*
 * tools/cli/cmd_migrate_workers.h -- `keyshift migrate run --workers N` and
 * the chunks of `keyshift migrate status` on PostgreSQL
 * (tools/cli/cmd_migrate_workers.c; docs/migration.md section 11).  A tool's
 * header: nothing here is part of the library.
 */
#ifndef KS_TOOLS_CMD_MIGRATE_WORKERS_H
#define KS_TOOLS_CMD_MIGRATE_WORKERS_H

#include <signal.h>

#include "cli.h"
#include "cmd_migrate_textfile.h"
#include "throttle.h"

/* The options of a run with workers. */
typedef struct ks_cli_workers {
    unsigned workers;    /* 0: --workers not given (the single-connection run) */
    uint64_t chunk_ids;  /* --chunk-ids (0: the library's default) */
    uint32_t lease_ms;   /* --lease (0: the library's default) */
} ks_cli_workers;

/*
 * Parse --workers, --chunk-ids and --lease (each NULL when not given)
 * of `migrate run` on a PostgreSQL (pg nonzero) or SQLite database into
 * *out.  On SQLite --workers 1 is the single-connection run and more is
 * refused (one writer at a time).  EX_OK, or EX_USAGE after a message.
 */
int ks_cli_workers_parse(const char *workers, const char *chunk_ids, const char *lease, int pg,
                         ks_cli_workers *out);

/* What a run with workers needs from `migrate run` besides the engine's
 * parameters. */
typedef struct ks_cli_workers_env {
    const char *db;                  /* the PostgreSQL connection string */
    const ks_rowstore_target *target;
    uint32_t busy_ms;                /* each store's lock_timeout */
    int json;
    int64_t rollout_id;              /* > 0: gate every worker's store on it */
    ks_cli_throttle *throttle;       /* the run's throttle (pause flag, query, lag) */
    volatile sig_atomic_t *stop;     /* set by SIGINT/SIGTERM */
    void (*health)(void *arg);       /* the rollout's health sample (NULL: none) */
    void *health_arg;
    ks_cli_mig_textfile *textfile;   /* --textfile (NULL, or dir NULL: none) */
} ks_cli_workers_env;

/* ks_cli_workers_run's answer when the migration was complete already:
 * the caller runs the catch-up pass on its single connection. */
#define KS_CLI_WORKERS_CATCHUP (-1)

/*
 * Run (or join, or resume) migration p with w->workers threads, each on
 * a connection of its own, reporting one progress bar (or JSON lines)
 * over all of them and a summary; store is the run's own connection
 * (the count, the chunks' summary).  The exit code after a message, or
 * KS_CLI_WORKERS_CATCHUP (nothing printed).
 */
int ks_cli_workers_run(ks_ctx *ctx, const ks_rowstore *store, const ks_migrate_params *p,
                       const ks_cli_workers *w, const ks_cli_workers_env *env);

/*
 * `migrate status` on PostgreSQL: after the checkpoint of tbl.col with
 * params, print its chunks, if it has any: a line of counts and one
 * line per running chunk (every chunk with all), or with json a
 * ",\"chunks\":{...}" member for the checkpoint's object.  Read-only;
 * nothing is printed when the table, its chunks or keyshift_chunk are
 * not there.  id_column as --id-column.
 */
void ks_cli_chunks_print(const char *db, ks_bytes tbl, ks_bytes col, ks_bytes params,
                         const char *id_column, int json, int all);

/* Defined in tools/cli/cmd_migrate_run.c, for the workers' stores and reports. */

/* Gate every write transaction of store on rollout rollout_id being in
 * backfill (nothing when rollout_id <= 0).  EX_OK, or an exit code after
 * a message. */
int ks_cli_backfill_gate(const ks_rowstore *store, int64_t rollout_id, int pg);

/* What to tell the operator about a run's outcome e (NULL: nothing
 * particular); pg: a PostgreSQL run; rollout_left: stopped because the
 * rollout left backfill. */
const char *ks_cli_migrate_advice(ks_err e, int pg, int rollout_left);

/* Write the "state", "pass", "cursor" and count members of checkpoint
 * cp (no braces) as JSON to stdout. */
void ks_cli_put_progress_json(const ks_checkpoint *cp);

/* Draw the progress bar (n of total rows, rate rows/s, an ETA of eta_s
 * when >= 0, then extra) on standard error. */
void ks_cli_draw_bar(uint64_t n, uint64_t total, double rate, double eta_s, const char *extra);

#endif /* KS_TOOLS_CMD_MIGRATE_WORKERS_H */
