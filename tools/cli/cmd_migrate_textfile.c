/*
 * tools/cli/cmd_migrate_textfile.c -- see cmd_migrate_textfile.h.
 *
 * The labels are escaped as Prometheus label values
 * (ks_health_prometheus_label_escape); the file name keeps only letters,
 * digits, '.' and '_' of the identifiers, whatever they hold.  The text
 * is the library's (ks_metrics_write_migrate), so `migrate run`, a run
 * with workers and `rollout metrics` speak one format.
 */
#include <ctype.h>
#include <stdio.h>

#include <keyshift/rollout.h>

#include "cli.h"
#include "cmd_migrate_textfile.h"
#include "textfile.h"

/* See cmd_migrate_textfile.h. */
int ks_cli_mig_textfile_due(ks_cli_mig_textfile *t, double elapsed_s)
{
    if (t->dir == NULL || (t->written && elapsed_s - t->last_s < KS_CLI_TEXTFILE_EVERY_S)) {
        return 0;
    }
    t->last_s = elapsed_s;
    t->written = 1;
    return 1;
}

/* t's labels into labels[0, cap): table, column, and rollout when t has
 * one.  Nonzero when they fit. */
static int put_labels(const ks_cli_mig_textfile *t, char *labels, size_t cap)
{
    char id[24];
    const char *lv[3][2] = {{"table", t->table}, {"column", t->column}, {"rollout", id}};
    size_t used = 0, n = 0;
    snprintf(id, sizeof id, "%lld", (long long)t->rollout_id);
    labels[0] = '\0';
    for (int i = 0; i < (t->rollout_id != 0 ? 3 : 2); i++) {
        char esc[2 * KS_ROLLOUT_IDENT_MAX + 2];
        if (ks_health_prometheus_label_escape(lv[i][1], esc, sizeof esc, &n) != KS_OK) {
            return 0;
        }
        int w = snprintf(labels + used, cap - used, "%s%s=\"%s\"", used ? "," : "", lv[i][0], esc);
        if (w < 0 || (size_t)w >= cap - used) {
            return 0;
        }
        used += (size_t)w;
    }
    return 1;
}

/* See cmd_migrate_textfile.h. */
void ks_cli_mig_textfile_write(ks_cli_mig_textfile *t, ks_metrics_migrate *m)
{
    if (t->dir == NULL) {
        return;
    }
    char labels[4 * KS_ROLLOUT_IDENT_MAX + 96], name[2 * KS_ROLLOUT_IDENT_MAX + 40], buf[4096];
    const int fits = put_labels(t, labels, sizeof labels);
    snprintf(name, sizeof name, "keyshift_migrate_%s_%s.prom", t->table, t->column);
    for (char *c = name; *c != '\0'; c++) {
        if (!isalnum((unsigned char)*c) && *c != '.' && *c != '_') {
            *c = '_';
        }
    }
    m->labels = labels;
    ks_metrics_buf b;
    size_t n = 0;
    ks_metrics_begin(&b, buf, sizeof buf);
    ks_metrics_write_migrate(&b, m);
    if (!fits || ks_metrics_end(&b, &n) != KS_OK || ks_cli_textfile_write(t->dir, name, buf, n) != EX_OK) {
        ks_cli_error("warning: cannot write the progress to --textfile %s; the run goes on without it",
                     t->dir);
        t->dir = NULL; /* said once; stop trying */
    }
    m->labels = NULL;
}
