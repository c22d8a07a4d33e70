/*
 * tools/cli/cmd_rollout_facts.c -- the facts a rollout's transitions and reports
 * rest on: the census of its scope, the health samples of a window, the
 * keys and their states (docs/rollout.md, "Commands").
 */
#define _POSIX_C_SOURCE 200809L

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "cmd_rollout.h"

/* ---- facts ------------------------------------------------------------------------- */

/* Count table.column against r: rows at the source (plaintext rows for a
 * plaintext source), at the target, and the rest (other classes, other
 * keys, malformed). */
static int count_column(const char *path, const ks_rollout *r, const char *table,
                        const char *column, ks_cli_ro_census_counts *out)
{
    ks_census c;
    memset(out, 0, sizeof *out);
    int rc = ks_cli_census(path, table, column, r->encoding, &c);
    if (rc != EX_OK) {
        return rc;
    }
    out->rows = c.rows;
    out->null_rows = c.null_rows;
    out->at_source = r->source.is_plaintext ? c.plaintext_rows : 0;
    for (size_t i = 0; i < c.n_classes; i++) {
        const ks_census_class *k = &c.classes[i];
        ks_rollout_class kc;
        memset(&kc, 0, sizeof kc);
        kc.version = k->version;
        kc.algorithm = k->algorithm;
        memcpy(kc.key_id, k->key_id, sizeof kc.key_id);
        kc.key_version = k->key_version;
        if (ks_rollout_class_equal(&kc, &r->target)) {
            out->at_target += k->rows;
        } else if (!r->source.is_plaintext && ks_rollout_class_equal(&kc, &r->source)) {
            out->at_source += k->rows;
        }
    }
    out->other = c.rows - c.null_rows - out->at_source - out->at_target;
    ks_census_free(&c);
    return EX_OK;
}

/* Count r's scope: its column, or each column of a key scope (summed). */
int ks_cli_ro_census_of(const char *path, const ks_rollout *r, ks_cli_ro_scope_census *out)
{
    memset(out, 0, sizeof *out);
    size_t n = r->scope == KS_SCOPE_KEY ? r->n_columns : 1;
    for (size_t i = 0; i < n && i < KS_ROLLOUT_COLUMNS_MAX; i++) {
        ks_cli_ro_census_counts *k = &out->cols[i];
        int rc = r->scope == KS_SCOPE_KEY
                     ? count_column(path, r, r->columns[i].table, r->columns[i].column, k)
                     : count_column(path, r, r->table, r->column, k);
        if (rc != EX_OK) {
            memset(out, 0, sizeof *out);
            return rc;
        }
        out->rows += k->rows;
        out->null_rows += k->null_rows;
        out->at_source += k->at_source;
        out->at_target += k->at_target;
        out->other += k->other;
    }
    out->known = 1;
    out->n_cols = r->scope == KS_SCOPE_KEY ? n : 0;
    return EX_OK;
}

/* The samples of source ("app" or "migrate") in r's window ending at
 * now, summed into *sum. */
int ks_cli_ro_window_of(ks_rollout_db *db, const ks_rollout *r, int64_t now, const char *source,
                        ks_health_sample *sum)
{
    memset(sum, 0, sizeof *sum);
    ks_err e = ks_rollout_db_metrics_sum_source(db, r->id, now - (int64_t)r->thresholds.window_s,
                                                source, sum);
    if (e != KS_OK) {
        ks_cli_error("cannot read the metrics of rollout %" PRId64 ": %s", r->id, ks_err_name(e));
        return ks_cli_exit_code(e);
    }
    return EX_OK;
}

/* Every sample of source ("app" or "migrate") r has stored, summed
 * into *sum: the totals since the rollout began, for counters. */
int ks_cli_ro_totals_of(ks_rollout_db *db, const ks_rollout *r, const char *source,
                        ks_health_sample *sum)
{
    memset(sum, 0, sizeof *sum);
    ks_err e = ks_rollout_db_metrics_sum_source(db, r->id, INT64_MIN, source, sum);
    if (e != KS_OK) {
        ks_cli_error("cannot read the metrics of rollout %" PRId64 ": %s", r->id, ks_err_name(e));
        return ks_cli_exit_code(e);
    }
    return EX_OK;
}

/* The health of r's window ending at now: the applications' samples
 * (source "app") summed since now - window_s and judged against r's
 * thresholds.  The migration's samples are its own figures, never
 * judged: an operator's mistake in `migrate run` (e.g. a wrong
 * --context) is not the applications' health. */
int ks_cli_ro_health_of(ks_rollout_db *db, const ks_rollout *r, int64_t now, ks_health_sample *sum,
                        ks_health_verdict *v)
{
    int rc = ks_cli_ro_window_of(db, r, now, "app", sum);
    if (rc == EX_OK) {
        ks_health_evaluate(sum, &r->thresholds, v);
    }
    return rc;
}

/* Open the keys (--keyring, --providers, $KEYSHIFT_KEYRING or
 * $KEYSHIFT_PROVIDERS) when some are named, into *keys (then *opened is
 * set); when required and none are, a usage error says why they are
 * needed. */
int ks_cli_ro_keyring_for(const char *cmd, const ks_cli_ro_opts *o, int required, const char *why,
                          ks_cli_keys *keys, int *opened, ks_ctx **ctx)
{
    *opened = 0;
    *ctx = NULL;
    const char *env = getenv("KEYSHIFT_KEYRING"), *penv = getenv("KEYSHIFT_PROVIDERS");
    if (o->keyring == NULL && o->providers == NULL && (env == NULL || *env == '\0') &&
        (penv == NULL || *penv == '\0')) {
        return required ? ks_cli_usage_error(cmd, "%s: give --keyring FILE or --providers FILE "
                                                  "(or set KEYSHIFT_KEYRING or KEYSHIFT_PROVIDERS)",
                                             why)
                        : EX_OK;
    }
    int rc = ks_cli_ctx_open(cmd, o->keyring, o->passfile, o->providers, keys, ctx);
    *opened = rc == EX_OK;
    return rc;
}

/* Ask the keyring about class c's key version: its state into *state
 * (KS_ROLLOUT_KEY_MISSING when not found) and whether it is primary. */
int ks_cli_ro_key_fact(ks_ctx *ctx, const ks_rollout_class *c, int *state, int *is_primary)
{
    ks_key_info info;
    ks_bytes id = {(const uint8_t *)c->key_id, strlen(c->key_id)};
    ks_err e = ks_ctx_key_info(ctx, id, c->key_version, &info);
    *is_primary = 0;
    if (e == KS_ERR_NOT_FOUND) {
        *state = KS_ROLLOUT_KEY_MISSING;
        return EX_OK;
    }
    if (e != KS_OK) {
        ks_cli_error("cannot ask the key provider about %s:%" PRIu32 ": %s", c->key_id,
                     c->key_version, ks_err_name(e));
        return ks_cli_exit_code(e);
    }
    *state = (int)info.state;
    *is_primary = info.is_primary;
    return EX_OK;
}
