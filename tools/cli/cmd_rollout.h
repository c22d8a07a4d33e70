/*
 * tools/cli/cmd_rollout.h -- what the files of `keyshift rollout` share
 * (tools/cli/cmd_rollout.c and cmd_rollout_*.c; docs/rollout.md,
 * "Commands").  A tool's header: nothing here is part of the library.
 * Each function's comment is at its definition.
 */
#ifndef KS_TOOLS_CMD_ROLLOUT_H
#define KS_TOOLS_CMD_ROLLOUT_H

#include "cli.h"

/* A default documented in the manual and docs/rollout.md. */
#define KS_CLI_RO_DEFAULT_READER_TTL_S 60u

/* Every option of the subcommands; each says which it accepts. */
typedef struct ks_cli_ro_opts {
    const char *db, *rollout, *table, *column, *key_id, *columns, *source, *target, *min_soak;
    const char *reader_ttl;
    const char *max_auth, *max_parse, *max_provider, *max_seal, *max_open, *min_samples;
    const char *window, *actor, *reason, *tenants, *percent, *keyring, *passfile, *limit;
    const char *providers, *encoding, *textfile;
    int all, json, prometheus, auto_rollback;
    char actor_buf[KS_ROLLOUT_ACTOR_MAX + 1];
} ks_cli_ro_opts;

/* The counts of one column against a rollout's source and target. */
typedef struct ks_cli_ro_census_counts {
    uint64_t rows, null_rows, at_source, at_target, other;
} ks_cli_ro_census_counts;

/* The census of a rollout's scope, against its source and target: the
 * sums (the census guards count over every column of a key scope), and
 * each column of a key scope. */
typedef struct ks_cli_ro_scope_census {
    int known;
    uint64_t rows, null_rows, at_source, at_target, other;
    size_t n_cols;
    ks_cli_ro_census_counts cols[KS_ROLLOUT_COLUMNS_MAX];
} ks_cli_ro_scope_census;

/* The buffer size of ks_cli_ro_class_str. */
#define KS_CLI_RO_CLASS_TEXT_MAX (KS_KEY_ID_MAX + 48)

/* tools/cli/cmd_rollout.c: the options. */
int ks_cli_ro_parse(const char *cmd, int argc, char **argv, const char *allowed, ks_cli_ro_opts *o,
                    int *rc);

/* tools/cli/cmd_rollout_facts.c: censuses, health windows, keys. */
int ks_cli_ro_census_of(const char *path, const ks_rollout *r, ks_cli_ro_scope_census *out);
int ks_cli_ro_window_of(ks_rollout_db *db, const ks_rollout *r, int64_t now, const char *source,
                        ks_health_sample *sum);
int ks_cli_ro_totals_of(ks_rollout_db *db, const ks_rollout *r, const char *source,
                        ks_health_sample *sum);
int ks_cli_ro_health_of(ks_rollout_db *db, const ks_rollout *r, int64_t now, ks_health_sample *sum,
                        ks_health_verdict *v);
int ks_cli_ro_keyring_for(const char *cmd, const ks_cli_ro_opts *o, int required, const char *why,
                          ks_cli_keys *keys, int *opened, ks_ctx **ctx);
int ks_cli_ro_key_fact(ks_ctx *ctx, const ks_rollout_class *c, int *state, int *is_primary);

/* tools/cli/cmd_rollout_print.c: a rollout and its health as text or JSON. */
const char *ks_cli_ro_class_str(const ks_rollout_class *c, char *out, size_t cap);
void ks_cli_ro_canary_str(const ks_rollout_canary *c, char *out, size_t cap);
void ks_cli_ro_print_migration(const ks_health_sample *m, uint32_t window_s, int json);
void ks_cli_ro_put_str(const char *s);
void ks_cli_ro_no_data_str(const ks_health_verdict *v, char *out, size_t cap);
void ks_cli_ro_tripped_str(const ks_health_verdict *v, const ks_thresholds *t, char *out,
                           size_t cap);
void ks_cli_ro_print_health(const ks_health_sample *sum, const ks_health_verdict *v,
                            const ks_thresholds *t, int json);
void ks_cli_ro_print_scope(const ks_rollout *r, int json);
void ks_cli_ro_print_rollout(const ks_rollout *r, int64_t now, int json);

/* The subcommands: tools/cli/cmd_rollout_start.c (start, and the
 * thresholds set takes too), cmd_rollout_phase.c (advance, rollback,
 * canary, abort, set), cmd_rollout_status.c (readers, log, status),
 * cmd_rollout_health.c (check, metrics).  Each on_* works on the rollout r
 * the dispatch selected in db. */
int ks_cli_ro_parse_thresholds(const char *cmd, const ks_cli_ro_opts *o, ks_thresholds *t);
int ks_cli_ro_cmd_start(int argc, char **argv);
int ks_cli_ro_on_advance(const char *cmd, const ks_cli_ro_opts *o, ks_rollout_db *db,
                         const ks_rollout *r);
int ks_cli_ro_on_rollback(const char *cmd, const ks_cli_ro_opts *o, ks_rollout_db *db,
                          const ks_rollout *r);
int ks_cli_ro_on_canary(const char *cmd, const ks_cli_ro_opts *o, ks_rollout_db *db,
                        const ks_rollout *r);
int ks_cli_ro_on_abort(const char *cmd, const ks_cli_ro_opts *o, ks_rollout_db *db,
                       const ks_rollout *r);
int ks_cli_ro_on_set(const char *cmd, const ks_cli_ro_opts *o, ks_rollout_db *db,
                     const ks_rollout *r);
int ks_cli_ro_cmd_readers(int argc, char **argv);
int ks_cli_ro_on_log(const char *cmd, const ks_cli_ro_opts *o, ks_rollout_db *db,
                     const ks_rollout *r);
int ks_cli_ro_log_of_aborted(const char *cmd, const ks_cli_ro_opts *o);
int ks_cli_ro_on_status(const char *cmd, const ks_cli_ro_opts *o, ks_rollout_db *db,
                        const ks_rollout *r);
int ks_cli_ro_on_check(const char *cmd, const ks_cli_ro_opts *o, ks_rollout_db *db,
                       const ks_rollout *r);
int ks_cli_ro_on_metrics(const char *cmd, const ks_cli_ro_opts *o, ks_rollout_db *db,
                         const ks_rollout *r);

#endif /* KS_TOOLS_CMD_ROLLOUT_H */
