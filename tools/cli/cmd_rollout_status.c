/*
 * tools/cli/cmd_rollout_status.c -- the read-only reports of `keyshift rollout`:
 * readers, log and status (docs/rollout.md, "Commands").
 */
#define _POSIX_C_SOURCE 200809L

#include <inttypes.h>
#include <stdlib.h>
#include <time.h>

#include "cmd_rollout.h"

/* The log entries `rollout status` shows. */
#define STATUS_LOG_ENTRIES 10u

/* ---- readers ------------------------------------------------------------------------ */

/* Every registered reader, live or not, into a malloc'd array. */
static int all_readers(ks_rollout_db *db, int64_t now, ks_rollout_reader **out, size_t *n)
{
    size_t cap = 16;
    for (;;) {
        ks_rollout_reader *rs = calloc(cap, sizeof *rs);
        if (rs == NULL) {
            ks_cli_error("out of memory");
            return EX_OSERR;
        }
        ks_err e = ks_rollout_db_readers_live(db, UINT32_MAX, now, rs, cap, n);
        if (e == KS_OK) {
            *out = rs;
            return EX_OK;
        }
        free(rs);
        if (e != KS_ERR_BUFFER_TOO_SMALL || *n <= cap) {
            ks_cli_error("cannot read the reader registry: %s", ks_err_name(e));
            return ks_cli_exit_code(e);
        }
        cap = *n;
    }
}

/* The algorithms of a reader as "aes-256-gcm,xchacha20-poly1305". */
static void algs_str(uint32_t bits, char *out, size_t cap)
{
    size_t used = 0;
    out[0] = '\0';
    for (uint32_t a = 1; a < 32 && used < cap; a++) {
        if ((bits & (1u << a)) != 0 && ks_alg_name(a) != NULL) {
            used += (size_t)snprintf(out + used, cap - used, "%s%s", used ? "," : "", ks_alg_name(a));
        }
    }
}

/* Print the readers: live when their heartbeat is within ttl of now;
 * with target (not NULL), whether each supports it. */
static void print_readers(const ks_rollout_reader *rs, size_t n, int64_t now, uint32_t ttl,
                          const ks_rollout_class *target, int json)
{
    if (!json) {
        printf("readers      %zu registered (live: heartbeat within %" PRIu32 " s)\n", n, ttl);
        if (n > 0) {
            printf("  %-24s %-5s %-7s %-6s %-8s %-10s %s\n", "INSTANCE", "LIVE", "AGE_S", "FORMAT",
                   "TARGET", "LIBRARY", "KEYS");
        }
    }
    for (size_t i = 0; i < n; i++) {
        const ks_rollout_reader *r = &rs[i];
        int live = r->heartbeat >= now - (int64_t)ttl;
        int sup = target != NULL && ks_rollout_reader_supports(r, target);
        char algs[64];
        algs_str(r->algorithms, algs, sizeof algs);
        if (json) {
            printf("%s{\"instance_id\":", i ? "," : "");
            ks_cli_ro_put_str(r->instance_id);
            printf(",\"library_version\":");
            ks_cli_ro_put_str(r->library_version);
            printf(",\"max_format\":%u,\"algorithms\":", (unsigned)r->max_format);
            ks_cli_ro_put_str(algs);
            printf(",\"keys\":");
            ks_cli_ro_put_str(r->keys);
            printf(",\"started\":%" PRId64 ",\"heartbeat\":%" PRId64 ",\"age_s\":%" PRId64
                   ",\"live\":%s", r->started, r->heartbeat, now - r->heartbeat,
                   live ? "true" : "false");
            if (target != NULL) {
                printf(",\"supports_target\":%s", sup ? "true" : "false");
            }
            printf("}");
        } else {
            printf("  %-24s %-5s %-7" PRId64 " v%-5u %-8s %-10s %s\n", r->instance_id,
                   live ? "yes" : "no", now - r->heartbeat, (unsigned)r->max_format,
                   target == NULL ? "-" : sup ? "yes" : "NO",
                   r->library_version[0] ? r->library_version : "-", r->keys[0] ? r->keys : "-");
        }
    }
}

/* `rollout readers`. */
int ks_cli_ro_cmd_readers(int argc, char **argv)
{
    static const char cmd[] = "rollout readers";
    ks_cli_ro_opts o;
    int rc;
    if (ks_cli_ro_parse(cmd, argc, argv, "--reader-ttl", &o, &rc)) {
        return rc;
    }
    uint32_t ttl = KS_CLI_RO_DEFAULT_READER_TTL_S;
    if (o.reader_ttl != NULL && ks_cli_parse_duration(o.reader_ttl, &ttl) != 0) {
        return ks_cli_usage_error(cmd, "--reader-ttl must be a duration (60, 60s, 1m)");
    }
    ks_rollout_db *db;
    if ((rc = ks_cli_rollout_open(o.db, 1, &db)) != EX_OK) {
        return rc;
    }
    int64_t now = (int64_t)time(NULL);
    ks_rollout_reader *rs = NULL;
    size_t n = 0;
    if ((rc = all_readers(db, now, &rs, &n)) == EX_OK) {
        if (o.json) {
            printf("{\"reader_ttl_s\":%" PRIu32 ",\"readers\":[", ttl);
        }
        print_readers(rs, n, now, ttl, NULL, o.json);
        if (o.json) {
            printf("]}\n");
        }
    }
    free(rs);
    ks_rollout_db_close(db);
    return rc;
}

/* ---- log ------------------------------------------------------------------------------ */

/* The whole log of rollout id into a malloc'd array. */
static int read_log(ks_rollout_db *db, int64_t id, ks_rollout_log_entry **out, size_t *n)
{
    size_t cap = 32, len = 0;
    ks_rollout_log_entry *es = NULL;
    int64_t after = 0;
    for (;;) {
        if (len + 32 > cap || es == NULL) {
            cap = es == NULL ? cap : cap * 2;
            ks_rollout_log_entry *ne = realloc(es, cap * sizeof *ne);
            if (ne == NULL) {
                free(es);
                ks_cli_error("out of memory");
                return EX_OSERR;
            }
            es = ne;
        }
        size_t got = 0;
        ks_err e = ks_rollout_db_log(db, id, after, es + len, 32, &got);
        if (e != KS_OK) {
            free(es);
            ks_cli_error("cannot read the log of rollout %" PRId64 ": %s", id, ks_err_name(e));
            return ks_cli_exit_code(e);
        }
        len += got;
        if (got < 32) {
            break;
        }
        after = es[len - 1].id;
    }
    *out = es;
    *n = len;
    return EX_OK;
}

/* Print log entries es[0, n): JSON array members, or lines. */
static void print_log(const ks_rollout_log_entry *es, size_t n, int json)
{
    for (size_t i = 0; i < n; i++) {
        const ks_rollout_log_entry *e = &es[i];
        const char *from = e->from ? ks_rollout_phase_name(e->from) : NULL;
        const char *to = ks_rollout_phase_name(e->to);
        char when[32];
        ks_cli_format_time(e->time, when, sizeof when);
        if (json) {
            printf("%s{\"id\":%" PRId64 ",\"time\":%" PRId64 ",\"actor\":", i ? "," : "", e->id,
                   e->time);
            ks_cli_ro_put_str(e->actor);
            printf(",\"from\":");
            if (from != NULL) {
                printf("\"%s\"", from);
            } else {
                fputs("null", stdout);
            }
            printf(",\"to\":\"%s\",\"reason\":", to ? to : "?");
            ks_cli_ro_put_str(e->reason);
            printf(",\"automatic\":%s}", e->automatic ? "true" : "false");
        } else {
            printf("  %s  %-24s %-13s -> %-13s %s%s\n", when, e->actor, from ? from : "(new)",
                   to ? to : "?", e->automatic ? "[automatic] " : "", e->reason);
        }
    }
}

/* `rollout log`. */
int ks_cli_ro_on_log(const char *cmd, const ks_cli_ro_opts *o, ks_rollout_db *db,
                     const ks_rollout *r)
{
    int rc;
    size_t limit = SIZE_MAX;
    if (o->limit != NULL && ks_cli_parse_size(o->limit, 1, SIZE_MAX, &limit) != 0) {
        return ks_cli_usage_error(cmd, "--limit must be a number from 1");
    }
    ks_rollout_log_entry *es = NULL;
    size_t n = 0;
    if ((rc = read_log(db, r->id, &es, &n)) == EX_OK) {
        size_t first = n > limit ? n - limit : 0;
        if (o->json) {
            printf("{\"rollout\":%" PRId64 ",", r->id);
            ks_cli_ro_print_scope(r, 1);
            printf(",\"log\":[");
        } else {
            char scope[KS_ROLLOUT_SCOPE_TEXT_MAX];
            printf("log of rollout %" PRId64 " (%s)\n", r->id,
                   ks_rollout_scope_text(r, scope, sizeof scope));
        }
        print_log(es + first, n - first, o->json);
        if (o->json) {
            printf("]}\n");
        }
    }
    free(es);
    return rc;
}

/* `rollout log --rollout ID` of a rollout that no longer exists (it was
 * aborted; its log stays): EX_NOINPUT when the log has no row of it
 * either. */
int ks_cli_ro_log_of_aborted(const char *cmd, const ks_cli_ro_opts *o)
{
    size_t id, limit = SIZE_MAX, n = 0;
    if (ks_cli_parse_size(o->rollout, 1, INT64_MAX, &id) != 0) {
        return ks_cli_usage_error(cmd, "--rollout must be a rollout id (a number from 1)");
    }
    if (o->limit != NULL && ks_cli_parse_size(o->limit, 1, SIZE_MAX, &limit) != 0) {
        return ks_cli_usage_error(cmd, "--limit must be a number from 1");
    }
    ks_rollout_db *db;
    ks_rollout_log_entry *es = NULL;
    int rc = ks_cli_rollout_open(o->db, 1, &db);
    if (rc == EX_OK) {
        rc = read_log(db, (int64_t)id, &es, &n);
        ks_rollout_db_close(db);
    }
    if (rc == EX_OK && n == 0) {
        ks_cli_error("no rollout %zu in %s (see 'keyshift rollout status --db %s')", id, o->db,
                     o->db);
        rc = EX_NOINPUT;
    }
    if (rc == EX_OK) {
        size_t first = n > limit ? n - limit : 0;
        if (o->json) {
            printf("{\"rollout\":%zu,\"aborted\":true,\"log\":[", id);
        } else {
            printf("log of rollout %zu (aborted)\n", id);
        }
        print_log(es + first, n - first, o->json);
        if (o->json) {
            printf("]}\n");
        }
    }
    free(es);
    return rc;
}

/* ---- status --------------------------------------------------------------------------- */

/* Print the counts of one column or of the scope: a JSON object (no
 * closing brace), or a line after label. */
static void print_counts(const ks_cli_ro_census_counts *k, int json, const char *label)
{
    if (json) {
        printf("{\"rows\":%" PRIu64 ",\"null\":%" PRIu64 ",\"at_source\":%" PRIu64
               ",\"at_target\":%" PRIu64 ",\"other\":%" PRIu64, k->rows, k->null_rows,
               k->at_source, k->at_target, k->other);
        return;
    }
    printf("%s%" PRIu64 " rows: %" PRIu64 " at the source, %" PRIu64 " at the target, %" PRIu64
           " other, %" PRIu64 " NULL\n", label, k->rows, k->at_source, k->at_target, k->other,
           k->null_rows);
}

/* Print the census of r's scope (JSON member value, or lines): the sums,
 * then, for a key scope, each column ("columns" in JSON). */
static void print_census(const ks_rollout *r, const ks_cli_ro_scope_census *c, int json)
{
    if (!c->known) {
        fputs(json ? "null" : "census       unavailable (see the error above)\n", stdout);
        return;
    }
    ks_cli_ro_census_counts total = {c->rows, c->null_rows, c->at_source, c->at_target, c->other};
    print_counts(&total, json, "census       ");
    if (json && c->n_cols > 0) {
        printf(",\"columns\":[");
    }
    for (size_t i = 0; i < c->n_cols; i++) {
        char label[2 * KS_ROLLOUT_IDENT_MAX + 16];
        snprintf(label, sizeof label, "  %s.%s: ", r->columns[i].table, r->columns[i].column);
        if (json) {
            printf("%s", i > 0 ? "," : "");
            print_counts(&c->cols[i], 1, NULL);
            printf(",\"table\":");
            ks_cli_ro_put_str(r->columns[i].table);
            printf(",\"column\":");
            ks_cli_ro_put_str(r->columns[i].column);
            printf("}");
        } else {
            print_counts(&c->cols[i], 0, label);
        }
    }
    if (json) {
        printf("%s}", c->n_cols > 0 ? "]" : "");
    }
}

/* Print everything status shows about r. */
static int print_status(const ks_cli_ro_opts *o, ks_rollout_db *db, const ks_rollout *r)
{
    int64_t now = (int64_t)time(NULL);
    ks_rollout_reader *rs = NULL;
    ks_rollout_log_entry *es = NULL;
    size_t nr = 0, ne = 0;
    ks_health_sample sum, mig;
    ks_health_verdict v;
    ks_cli_ro_scope_census c;
    int rc = all_readers(db, now, &rs, &nr);
    if (rc == EX_OK) {
        rc = ks_cli_ro_health_of(db, r, now, &sum, &v);
    }
    if (rc == EX_OK) {
        rc = ks_cli_ro_window_of(db, r, now, "migrate", &mig);
    }
    if (rc == EX_OK) {
        rc = read_log(db, r->id, &es, &ne);
    }
    if (rc != EX_OK) {
        free(rs);
        return rc;
    }
    int crc = ks_cli_ro_census_of(o->db, r, &c); /* a missing table still shows the rest */
    size_t first = ne > STATUS_LOG_ENTRIES ? ne - STATUS_LOG_ENTRIES : 0;
    if (o->json) {
        printf("{");
        ks_cli_ro_print_rollout(r, now, 1);
        printf(",\"census\":");
        print_census(r, &c, 1);
        printf(",\"health\":");
        ks_cli_ro_print_health(&sum, &v, &r->thresholds, 1);
        printf(",\"migration\":");
        ks_cli_ro_print_migration(&mig, r->thresholds.window_s, 1);
        printf(",\"readers\":[");
        print_readers(rs, nr, now, r->reader_ttl_s, &r->target, 1);
        printf("],\"log\":[");
        print_log(es + first, ne - first, 1);
        printf("]}\n");
    } else {
        ks_cli_ro_print_rollout(r, now, 0);
        print_census(r, &c, 0);
        ks_cli_ro_print_health(&sum, &v, &r->thresholds, 0);
        ks_cli_ro_print_migration(&mig, r->thresholds.window_s, 0);
        print_readers(rs, nr, now, r->reader_ttl_s, &r->target, 0);
        printf("log          last %zu of %zu entries\n", ne - first, ne);
        print_log(es + first, ne - first, 0);
    }
    free(rs);
    free(es);
    return crc;
}

/* `rollout status`. */
int ks_cli_ro_on_status(const char *cmd, const ks_cli_ro_opts *o, ks_rollout_db *db,
                        const ks_rollout *r)
{
    (void)cmd;
    return print_status(o, db, r);
}
