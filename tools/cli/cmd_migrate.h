/*
 * tools/cli/cmd_migrate.h -- what the units of `keyshift migrate` share:
 * the options and their parsing (tools/cli/cmd_migrate.c, which also
 * holds the manual, `status`, `pause`, `resume` and the dispatch), the
 * run (tools/cli/cmd_migrate_run.c: its progress, its rollout gates and
 * its workers), and `verify` and `quarantine`
 * (tools/cli/cmd_migrate_check.c).  A tool's header: nothing here is
 * part of the library.
 */
#ifndef KS_TOOLS_CMD_MIGRATE_H
#define KS_TOOLS_CMD_MIGRATE_H

#include <keyshift/migrate.h>
#include <keyshift/rollout.h>

/* Every option of the three subcommands (each checks which it accepts). */
typedef struct ks_cli_mig_opts {
    const char *db, *table, *column, *id_column, *mode, *to_key, *to_format, *algorithm;
    const char *tenant_column, *tenant, *context, *purpose, *batch_size, *max_failure_rate;
    const char *max_rps, *busy_timeout, *sample, *keyring, *passfile, *from_key, *providers;
    const char *synchronous, *throttle_query, *max_replica_lag, *reason;
    const char *workers, *chunk_ids, *lease; /* run --workers (cmd_migrate_workers.c) */
    const char *batch_target, *batch_max;
    const char *encoding; /* --encoding: run, verify, quarantine */
    const char *textfile; /* run --textfile DIR */
    const char *id, *error; /* quarantine release --id, --error */
    int no_verify, serial, json, supersede;
    int all; /* quarantine release --all */
    int chunks; /* status --chunks */
} ks_cli_mig_opts;

/* Parse argv into o (every subcommand's options; each then refuses
 * those it does not take with ks_cli_mig_only_options).  Nonzero when
 * the command is over (--help, or a usage error): *rc is its exit code. */
int ks_cli_mig_parse(const char *cmd, int argc, char **argv, ks_cli_mig_opts *o, int *rc);

/* Refuse options a subcommand does not take (names listed in `allowed`,
 * each followed by a space).  EX_OK, or EX_USAGE after a message. */
int ks_cli_mig_only_options(const char *cmd, const ks_cli_mig_opts *o, const char *allowed);

/* A ks_bytes view of a C string (NULL gives the empty view). */
ks_bytes ks_cli_mig_str_view(const char *s);

/* Fill the options shared by run and verify: tenant, context, purpose and
 * the target (with the template's columns, stored in names). */
int ks_cli_mig_common_params(const char *cmd, const ks_cli_mig_opts *o, ks_migrate_params *p,
                             ks_rowstore_target *t, char names[KS_CONTEXT_TEMPLATE_MAX]);

/* Every rollout of o's database whose scope covers o's column (a
 * malloc'd array the caller frees), read read-only so that a database
 * without rollouts is not changed: EX_OK, or an exit code after a
 * message. */
int ks_cli_mig_covering_rollouts(const ks_cli_mig_opts *o, ks_rollout **rs, size_t *n);

/* Refuse (exit 64) a run or verify of o's column whose encoding differs
 * from the one recorded with a rollout that is not finalized and covers
 * the column: its census, its policy and its applications read the
 * column in the rollout's form, and a run in another would write, or
 * judge, values of two forms. */
int ks_cli_mig_check_encoding(const char *cmd, const ks_cli_mig_opts *o, ks_value_encoding enc);

/* `migrate run` (tools/cli/cmd_migrate_run.c). */
int ks_cli_migrate_run(int argc, char **argv);

/* `migrate verify` (tools/cli/cmd_migrate_check.c). */
int ks_cli_migrate_verify(int argc, char **argv);

/* `migrate quarantine list|release`: the rows of one column in
 * keyshift_quarantine, and releasing them (by id, by error name, or all)
 * so that the next run tries them again (tools/cli/cmd_migrate_check.c). */
int ks_cli_migrate_quarantine(int argc, char **argv);

#endif /* KS_TOOLS_CMD_MIGRATE_H */
