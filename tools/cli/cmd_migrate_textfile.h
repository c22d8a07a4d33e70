/*
 * tools/cli/cmd_migrate_textfile.h -- `keyshift migrate run --textfile DIR`:
 * the run's progress as a Prometheus text file for node_exporter's
 * textfile collector (docs/prometheus.md), written by the
 * single-connection run and by a run with workers alike
 * (tools/cli/cmd_migrate_textfile.c).  A tool's header: nothing here is
 * part of the library.
 */
#ifndef KS_TOOLS_CMD_MIGRATE_TEXTFILE_H
#define KS_TOOLS_CMD_MIGRATE_TEXTFILE_H

#include <stdint.h>

#include <keyshift/health.h>

/* The least seconds between two writes while a run goes on. */
#define KS_CLI_TEXTFILE_EVERY_S 1.0

/* Where a run's progress goes, and when it last went there. */
typedef struct ks_cli_mig_textfile {
    const char *dir;           /* --textfile DIR; NULL: off, or given up after a failure */
    const char *table, *column;
    int64_t rollout_id;        /* the rollout governing the column (a label), 0: none */
    double last_s;             /* the run's elapsed seconds at the last write */
    int written;               /* nonzero once written */
} ks_cli_mig_textfile;

/* Nonzero when a write is due at the run's elapsed_s seconds: the first
 * one, then every KS_CLI_TEXTFILE_EVERY_S; it is then counted as done. */
int ks_cli_mig_textfile_due(ks_cli_mig_textfile *t, double elapsed_s);

/*
 * Write m (its labels are set here: table, column and, when there is
 * one, rollout) atomically to t->dir as keyshift_migrate_TABLE_COLUMN.prom
 * (ks_metrics_write_migrate).  Best effort, like a run's health samples:
 * a failure is said once on standard error, t->dir is cleared and the
 * run goes on.  Nothing when t->dir is NULL.
 */
void ks_cli_mig_textfile_write(ks_cli_mig_textfile *t, ks_metrics_migrate *m);

#endif /* KS_TOOLS_CMD_MIGRATE_TEXTFILE_H */
