/*
 * tools/cli/cmd_rollout_health.c -- `keyshift rollout check` (the health verdict,
 * with its automatic rollback) and `keyshift rollout metrics` (JSON, or
 * Prometheus text for a scrape or the node exporter's textfile
 * collector; docs/prometheus.md).
 */
#define _POSIX_C_SOURCE 200809L

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cmd_rollout.h"
#include "textfile.h"

/* ---- check ------------------------------------------------------------------------------ */

/* Exit codes of `rollout check` (monitoring-plugin convention). */
enum { CHECK_HEALTHY = 0, CHECK_ROLLED_BACK = 1, CHECK_TRIPPED = 2, CHECK_INSUFFICIENT = 3 };

/* Roll r back to read-compat after a trip, logged as automatic with the
 * tripped checks as reason.  Returns the check's exit code. */
static int auto_rollback(const ks_cli_ro_opts *o, ks_rollout_db *db, const ks_rollout *r,
                         const char *tripped)
{
    if (r->phase != KS_PHASE_WRITE_UPGRADE && r->phase != KS_PHASE_BACKFILL) {
        fprintf(stderr, KS_PROG " rollout check: no safe automatic rollback from %s; act by "
                "hand ('keyshift rollout rollback')\n", ks_rollout_phase_name((int)r->phase));
        return CHECK_TRIPPED;
    }
    char reason[KS_ROLLOUT_REASON_MAX + 1];
    snprintf(reason, sizeof reason, "auto-rollback: %s", tripped);
    ks_rollout_facts f;
    memset(&f, 0, sizeof f);
    f.now = (int64_t)time(NULL);
    char why[1024] = "";
    ks_rollout_change c = {r->id, r->phase, KS_PHASE_READ_COMPAT, o->actor_buf, reason, 1};
    ks_err e = ks_rollout_db_transition(db, &c, &f, why, sizeof why);
    if (e != KS_OK) {
        ks_cli_error("automatic rollback of rollout %" PRId64 " failed: %s", r->id,
                     why[0] ? why : ks_err_name(e));
        return CHECK_TRIPPED;
    }
    fprintf(stderr, KS_PROG " rollout check: rolled rollout %" PRId64 " back from %s to "
            "read-compat\n", r->id, ks_rollout_phase_name((int)r->phase));
    return CHECK_ROLLED_BACK;
}

/* `rollout check`. */
int ks_cli_ro_on_check(const char *cmd, const ks_cli_ro_opts *o, ks_rollout_db *db,
                       const ks_rollout *r)
{
    ks_health_sample sum;
    ks_health_verdict v;
    int rc = ks_cli_ro_health_of(db, r, (int64_t)time(NULL), &sum, &v);
    (void)cmd;
    if (rc != EX_OK) {
        return rc;
    }
    char tripped[KS_ROLLOUT_REASON_MAX - 32];
    ks_cli_ro_tripped_str(&v, &r->thresholds, tripped, sizeof tripped);
    rc = v.status == KS_HEALTH_OK ? CHECK_HEALTHY
         : v.status == KS_HEALTH_INSUFFICIENT ? CHECK_INSUFFICIENT
         : o->auto_rollback ? auto_rollback(o, db, r, tripped) : CHECK_TRIPPED;
    const char *result[] = {"healthy", "tripped, rolled back to read-compat",
                            "tripped, not rolled back", "insufficient data"};
    if (o->json) {
        printf("{\"rollout\":%" PRId64 ",\"phase\":\"%s\",\"result\":\"%s\",\"exit\":%d,"
               "\"health\":", r->id, ks_rollout_phase_name((int)r->phase), result[rc], rc);
        ks_cli_ro_print_health(&sum, &v, &r->thresholds, 1);
        printf("}\n");
    } else {
        char scope[KS_ROLLOUT_SCOPE_TEXT_MAX];
        printf("rollout %" PRId64 " (%s, %s): %s\n", r->id,
               ks_rollout_scope_text(r, scope, sizeof scope),
               ks_rollout_phase_name((int)r->phase), result[rc]);
        if (v.status == KS_HEALTH_TRIPPED) {
            printf("tripped      %s\n", tripped);
        }
        if (v.status == KS_HEALTH_INSUFFICIENT && v.no_data != 0) {
            char nd[256];
            ks_cli_ro_no_data_str(&v, nd, sizeof nd);
            printf("no data      %s\n", nd);
        }
        ks_cli_ro_print_health(&sum, &v, &r->thresholds, 0);
    }
    return rc;
}

/* ---- metrics ------------------------------------------------------------------------------ */

/* Append name="value" (escaped) to labels[0, cap) at *used. */
static int add_label(char *labels, size_t cap, size_t *used, const char *name, const char *value)
{
    char esc[2 * KS_KEY_ID_MAX + 2]; /* the longest value: a key id */
    size_t n;
    if (ks_health_prometheus_label_escape(value, esc, sizeof esc, &n) != KS_OK) {
        return -1;
    }
    int w = snprintf(labels + *used, cap - *used, "%s%s=\"%s\"", *used ? "," : "", name, esc);
    if (w < 0 || (size_t)w >= cap - *used) {
        return -1;
    }
    *used += (size_t)w;
    return 0;
}

/* Render the rollout's exposition into a malloc'd *out (NUL-terminated,
 * length *len): the cumulative totals of its stored samples by source,
 * its phase, then its thresholds and the guard's verdict on the window. */
static int render_prometheus(const ks_rollout *r, const ks_health_sample *app,
                             const ks_health_sample *mig, const ks_health_verdict *v, char **out,
                             size_t *len)
{
    char labels[4 * (2 * KS_ROLLOUT_IDENT_MAX + 16) + 2 * KS_KEY_ID_MAX + 16], id[24];
    char app_l[sizeof labels + 16], mig_l[sizeof labels + 20];
    size_t used = 0;
    snprintf(id, sizeof id, "%" PRId64, r->id);
    if (add_label(labels, sizeof labels, &used, "rollout", id) != 0 ||
        add_label(labels, sizeof labels, &used, "scope",
                  r->scope == KS_SCOPE_KEY ? "key" : "column") != 0 ||
        add_label(labels, sizeof labels, &used, "table", r->table) != 0 ||
        add_label(labels, sizeof labels, &used, "column", r->column) != 0 ||
        (r->scope == KS_SCOPE_KEY &&
         add_label(labels, sizeof labels, &used, "key_id", r->source.key_id) != 0)) {
        ks_cli_error("cannot build the metric labels");
        return EX_SOFTWARE;
    }
    snprintf(app_l, sizeof app_l, "%s,source=\"app\"", labels);
    snprintf(mig_l, sizeof mig_l, "%s,source=\"migrate\"", labels);
    const ks_metrics_series series[2] = {{app_l, app}, {mig_l, mig}};
    const char *phases[KS_PHASE_FINALIZED];
    for (int i = 0; i < KS_PHASE_FINALIZED; i++) {
        phases[i] = ks_rollout_phase_name(i + 1);
    }
    *out = NULL;
    for (int pass = 0; pass < 2; pass++) {
        size_t cap = pass == 0 ? 0 : *len + 1, hlen = 0;
        ks_metrics_buf b;
        ks_metrics_begin(&b, *out, cap);
        ks_metrics_write_totals(&b, series, 2);
        ks_metrics_write_phase(&b, labels, phases, KS_PHASE_FINALIZED, (size_t)r->phase - 1);
        size_t mlen = 0;
        ks_err e = ks_metrics_end(&b, &mlen);
        if (e == KS_OK || e == KS_ERR_BUFFER_TOO_SMALL) {
            e = ks_health_prometheus(app, &r->thresholds, v, labels,
                                     pass == 0 ? NULL : *out + mlen, pass == 0 ? 0 : cap - mlen,
                                     &hlen);
        }
        if (e != KS_OK && !(pass == 0 && e == KS_ERR_BUFFER_TOO_SMALL)) {
            ks_cli_error("cannot write the metrics: %s", ks_err_name(e));
            free(*out);
            *out = NULL;
            return ks_cli_exit_code(e);
        }
        *len = mlen + hlen;
        if (pass == 0 && (*out = malloc(*len + 1)) == NULL) {
            ks_cli_error("out of memory");
            return EX_OSERR;
        }
    }
    return EX_OK;
}

/* The name of the rollout's file in a textfile collector's directory. */
#define TEXTFILE_NAME_FMT "keyshift_rollout_%" PRId64 ".prom"

/* Print (or, with --textfile, write atomically) the Prometheus text of r:
 * totals since the rollout began (every stored sample, by source), its
 * phase, its thresholds and the verdict on its window. */
static int print_prometheus(const ks_rollout *r, const ks_health_sample *app,
                            const ks_health_sample *mig, const ks_health_verdict *v,
                            const char *textfile)
{
    char *text = NULL;
    size_t len = 0;
    int rc = render_prometheus(r, app, mig, v, &text, &len);
    if (rc != EX_OK) {
        return rc;
    }
    if (textfile != NULL) {
        char name[64];
        snprintf(name, sizeof name, TEXTFILE_NAME_FMT, r->id);
        rc = ks_cli_textfile_write(textfile, name, text, len);
    } else {
        rc = ks_cli_write_stdout((const uint8_t *)text, len);
    }
    free(text);
    return rc;
}

/* `rollout metrics`. */
int ks_cli_ro_on_metrics(const char *cmd, const ks_cli_ro_opts *o, ks_rollout_db *db,
                         const ks_rollout *r)
{
    if (o->textfile != NULL && !o->prometheus) {
        return ks_cli_usage_error(cmd, "--textfile needs --prometheus");
    }
    if (o->prometheus == o->json) {
        return ks_cli_usage_error(cmd, "give --prometheus or --json");
    }
    ks_health_sample sum;
    ks_health_verdict v;
    int64_t now = (int64_t)time(NULL);
    int rc = ks_cli_ro_health_of(db, r, now, &sum, &v);
    if (rc != EX_OK) {
        return rc;
    }
    ks_health_sample mig;
    if ((rc = ks_cli_ro_window_of(db, r, now, "migrate", &mig)) != EX_OK) {
        return rc;
    }
    if (o->prometheus) {
        /* Counters: every sample stored since the rollout began. */
        ks_health_sample app_all, mig_all;
        if ((rc = ks_cli_ro_totals_of(db, r, "app", &app_all)) != EX_OK ||
            (rc = ks_cli_ro_totals_of(db, r, "migrate", &mig_all)) != EX_OK) {
            return rc;
        }
        return print_prometheus(r, &app_all, &mig_all, &v, o->textfile);
    }
    printf("{");
    ks_cli_ro_print_rollout(r, now, 1);
    printf(",\"health\":");
    ks_cli_ro_print_health(&sum, &v, &r->thresholds, 1);
    printf(",\"migration\":");
    ks_cli_ro_print_migration(&mig, r->thresholds.window_s, 1);
    printf("}\n");
    return EX_OK;
}
