/*
 * tools/cli/cmd_rollout_print.c -- how `keyshift rollout` prints a rollout, its
 * classes, canary and scope, and a health verdict, as text or JSON.
 * Nothing printed carries plaintext or key material.
 */
#define _POSIX_C_SOURCE 200809L

#include <inttypes.h>
#include <math.h>
#include <string.h>

#include "cmd_rollout.h"

/* ---- output helpers --------------------------------------------------------------- */

/* Write class c in the syntax parse_class (cmd_rollout_start.c) reads. */
const char *ks_cli_ro_class_str(const ks_rollout_class *c, char *out, size_t cap)
{
    if (c->is_plaintext) {
        snprintf(out, cap, "plaintext");
    } else {
        const char *alg = ks_alg_name(c->algorithm);
        snprintf(out, cap, "v%u:%s:%s:%" PRIu32, (unsigned)c->version, alg ? alg : "?", c->key_id,
                 c->key_version);
    }
    return out;
}

/* Write the canary as "all", "10%" or "tenants a,b". */
void ks_cli_ro_canary_str(const ks_rollout_canary *c, char *out, size_t cap)
{
    if (c->kind == KS_CANARY_PERCENT) {
        snprintf(out, cap, "%" PRIu32 "%%", c->percent);
        return;
    }
    if (c->kind == KS_CANARY_ALL) {
        snprintf(out, cap, "all");
        return;
    }
    size_t used = (size_t)snprintf(out, cap, "tenants ");
    for (size_t i = 0; i < c->n_tenants && used < cap; i++) {
        used += (size_t)snprintf(out + used, cap - used, "%s%s", i ? "," : "", c->tenants[i]);
    }
}

/* Print the migration's own figures of a window (source "migrate"): a
 * JSON object, or one line. */
void ks_cli_ro_print_migration(const ks_health_sample *m, uint32_t window_s, int json)
{
    if (json) {
        printf("{\"window_s\":%" PRIu32 ",\"seals\":%" PRIu64 ",\"opens\":%" PRIu64
               ",\"auth_failures\":%" PRIu64 ",\"parse_errors\":%" PRIu64
               ",\"provider_calls\":%" PRIu64 ",\"provider_errors\":%" PRIu64 "}",
               window_s, m->seals, m->opens, m->auth_failures, m->parse_errors,
               m->provider_calls, m->provider_errors);
        return;
    }
    printf("migration    over the last %" PRIu32 " s (not judged): %" PRIu64 " seals, %" PRIu64
           " opens, %" PRIu64 " auth failures, %" PRIu64 " parse errors, %" PRIu64
           " of %" PRIu64 " provider calls failed\n",
           window_s, m->seals, m->opens, m->auth_failures, m->parse_errors, m->provider_errors,
           m->provider_calls);
}

/* Write a JSON string from a C string. */
void ks_cli_ro_put_str(const char *s)
{
    ks_cli_put_json_string(stdout, (const uint8_t *)s, strlen(s));
}

/* Write a double as JSON (null when not finite). */
static void put_num(double d)
{
    if (isfinite(d)) {
        printf("%.9g", d);
    } else {
        fputs("null", stdout);
    }
}

/* One health check next to its limit. */
typedef struct check_row {
    unsigned bit;
    double observed, limit;
    int enabled, tripped, unbounded, no_data;
} check_row;

/* The five checks of verdict v under thresholds t. */
static void check_rows(const ks_health_verdict *v, const ks_thresholds *t, check_row out[5])
{
    const struct {
        unsigned bit;
        double observed, limit;
        int enabled, unbounded;
    } rows[5] = {
        {KS_HEALTH_AUTH_FAILURES, v->auth_failure_rate, t->max_auth_failure_rate,
         !(t->max_auth_failure_rate < 0), 0},
        {KS_HEALTH_PARSE_ERRORS, v->parse_error_rate, t->max_parse_error_rate,
         !(t->max_parse_error_rate < 0), 0},
        {KS_HEALTH_PROVIDER_ERRORS, v->provider_error_rate, t->max_provider_error_rate,
         !(t->max_provider_error_rate < 0), 0},
        {KS_HEALTH_SEAL_P99, (double)v->seal_p99_us, (double)t->max_seal_p99_us,
         t->max_seal_p99_us != 0, v->seal_p99_us == KS_HIST_UNBOUNDED},
        {KS_HEALTH_OPEN_P99, (double)v->open_p99_us, (double)t->max_open_p99_us,
         t->max_open_p99_us != 0, v->open_p99_us == KS_HIST_UNBOUNDED},
    };
    for (int i = 0; i < 5; i++) {
        out[i] = (check_row){rows[i].bit, rows[i].observed, rows[i].limit, rows[i].enabled,
                             (v->tripped & rows[i].bit) != 0, rows[i].unbounded,
                             (v->no_data & rows[i].bit) != 0};
    }
}

/* Write the checks with no data as "name, name" into out ("" when none). */
void ks_cli_ro_no_data_str(const ks_health_verdict *v, char *out, size_t cap)
{
    size_t used = 0;
    out[0] = '\0';
    for (unsigned i = 0; i < KS_HEALTH_N_CHECKS && used < cap; i++) {
        if (v->no_data & (1u << i)) {
            used += (size_t)snprintf(out + used, cap - used, "%s%s", used ? ", " : "",
                                     ks_health_check_name(1u << i));
        }
    }
}

/* Write the tripped checks as "name observed > limit; ..." into out. */
void ks_cli_ro_tripped_str(const ks_health_verdict *v, const ks_thresholds *t, char *out,
                           size_t cap)
{
    check_row rows[5];
    check_rows(v, t, rows);
    size_t used = 0;
    out[0] = '\0';
    for (int i = 0; i < 5 && used < cap; i++) {
        if (!rows[i].tripped) {
            continue;
        }
        char obs[32];
        if (rows[i].unbounded) {
            snprintf(obs, sizeof obs, "unbounded");
        } else {
            snprintf(obs, sizeof obs, "%.6g", rows[i].observed);
        }
        used += (size_t)snprintf(out + used, cap - used, "%s%s %s > %.6g", used ? "; " : "",
                                 ks_health_check_name(rows[i].bit), obs, rows[i].limit);
    }
}

/* Print the health of a window: a JSON object, or a table. */
void ks_cli_ro_print_health(const ks_health_sample *sum, const ks_health_verdict *v,
                            const ks_thresholds *t, int json)
{
    check_row rows[5];
    check_rows(v, t, rows);
    if (json) {
        printf("{\"status\":\"%s\",\"window_s\":%" PRIu32 ",\"samples\":%" PRIu64
               ",\"min_samples\":%" PRIu64 ",\"seals\":%" PRIu64 ",\"opens\":%" PRIu64
               ",\"auth_failures\":%" PRIu64 ",\"parse_errors\":%" PRIu64
               ",\"provider_calls\":%" PRIu64 ",\"provider_errors\":%" PRIu64 ",\"checks\":[",
               ks_health_status_name(v->status), t->window_s, v->samples, t->min_samples,
               sum->seals, sum->opens, sum->auth_failures, sum->parse_errors, sum->provider_calls,
               sum->provider_errors);
        for (int i = 0; i < 5; i++) {
            printf("%s{\"check\":\"%s\",\"observed\":", i ? "," : "",
                   ks_health_check_name(rows[i].bit));
            put_num(rows[i].unbounded ? NAN : rows[i].observed);
            printf(",\"limit\":");
            put_num(rows[i].limit);
            printf(",\"enabled\":%s,\"no_data\":%s,\"tripped\":%s,\"over_by\":",
                   rows[i].enabled ? "true" : "false", rows[i].no_data ? "true" : "false",
                   rows[i].tripped ? "true" : "false");
            put_num(!rows[i].tripped ? 0.0 : rows[i].unbounded ? NAN
                                                              : rows[i].observed - rows[i].limit);
            printf("}");
        }
        printf("]}");
        return;
    }
    printf("health       %s over the last %" PRIu32 " s: %" PRIu64 " samples (minimum %" PRIu64
           ")\n", ks_health_status_name(v->status), t->window_s, v->samples, t->min_samples);
    printf("  %-20s %-14s %-14s %s\n", "CHECK", "OBSERVED", "LIMIT", "STATE");
    for (int i = 0; i < 5; i++) {
        char obs[32], lim[32];
        if (rows[i].unbounded) {
            snprintf(obs, sizeof obs, "unbounded");
        } else {
            snprintf(obs, sizeof obs, "%.6g", rows[i].observed);
        }
        snprintf(lim, sizeof lim, "%.6g", rows[i].limit);
        char state[64] = "ok";
        if (!rows[i].enabled) {
            snprintf(state, sizeof state, "disabled");
        } else if (rows[i].no_data && !rows[i].tripped) {
            snprintf(state, sizeof state, "no data (not healthy)");
        } else if (rows[i].tripped && rows[i].unbounded) {
            snprintf(state, sizeof state, "TRIPPED (beyond the largest bucket)");
        } else if (rows[i].tripped && rows[i].limit > 0) {
            snprintf(state, sizeof state, "TRIPPED by %.6g (%.3gx the limit)",
                     rows[i].observed - rows[i].limit, rows[i].observed / rows[i].limit);
        } else if (rows[i].tripped) {
            snprintf(state, sizeof state, "TRIPPED by %.6g", rows[i].observed - rows[i].limit);
        }
        printf("  %-20s %-14s %-14s %s\n", ks_health_check_name(rows[i].bit), obs,
               rows[i].enabled ? lim : "-", state);
    }
}

/* Print a rollout's scope: JSON members (no braces: "scope", then
 * "table" and "column", or "key_id" and "columns" with each column's
 * verify time), or lines. */
void ks_cli_ro_print_scope(const ks_rollout *r, int json)
{
    if (r->scope == KS_SCOPE_COLUMN) {
        if (json) {
            printf("\"scope\":\"column\",\"table\":");
            ks_cli_ro_put_str(r->table);
            printf(",\"column\":");
            ks_cli_ro_put_str(r->column);
        } else {
            printf("scope        %s.%s\n", r->table, r->column);
        }
        return;
    }
    if (json) {
        printf("\"scope\":\"key\",\"key_id\":");
        ks_cli_ro_put_str(r->source.key_id);
        printf(",\"columns\":[");
    } else {
        printf("scope        key %s, %zu columns\n", r->source.key_id, r->n_columns);
    }
    for (size_t i = 0; i < r->n_columns; i++) {
        const ks_rollout_column *c = &r->columns[i];
        if (json) {
            printf("%s{\"table\":", i > 0 ? "," : "");
            ks_cli_ro_put_str(c->table);
            printf(",\"column\":");
            ks_cli_ro_put_str(c->column);
            printf(",\"verified_at\":%" PRId64 "}", c->verified_at);
        } else {
            char verified[32];
            ks_cli_format_time(c->verified_at, verified, sizeof verified);
            printf("  column     %s.%s (verified %s)\n", c->table, c->column,
                   verified[0] ? verified : "-");
        }
    }
    if (json) {
        printf("]");
    }
}

/* Print a rollout's fields: JSON members (no braces), or lines. */
void ks_cli_ro_print_rollout(const ks_rollout *r, int64_t now, int json)
{
    char src[KS_CLI_RO_CLASS_TEXT_MAX], dst[KS_CLI_RO_CLASS_TEXT_MAX], since[32];
    char canary[KS_ROLLOUT_TENANTS_MAX * (KS_TENANT_MAX + 1) + 16];
    ks_cli_ro_class_str(&r->source, src, sizeof src);
    ks_cli_ro_class_str(&r->target, dst, sizeof dst);
    ks_cli_format_time(r->phase_since, since, sizeof since);
    ks_cli_ro_canary_str(&r->canary, canary, sizeof canary);
    const char *phase = ks_rollout_phase_name((int)r->phase);
    if (json) {
        printf("\"rollout\":%" PRId64 ",", r->id);
        ks_cli_ro_print_scope(r, 1);
        printf(",\"phase\":\"%s\",\"phase_since\":%" PRId64 ",\"in_phase_s\":%" PRId64
               ",\"source\":", phase, r->phase_since, now - r->phase_since);
        ks_cli_ro_put_str(src);
        printf(",\"target\":");
        ks_cli_ro_put_str(dst);
        printf(",\"canary\":");
        ks_cli_ro_put_str(canary);
        printf(",\"encoding\":\"%s\",\"min_soak_s\":%" PRIu32 ",\"reader_ttl_s\":%" PRIu32
               ",\"verified_at\":%" PRId64,
               ks_value_encoding_name((int)r->encoding), r->min_soak_s, r->reader_ttl_s,
               r->verified_at);
        return;
    }
    char verified[32];
    ks_cli_format_time(r->verified_at, verified, sizeof verified);
    printf("rollout      %" PRId64 "\n", r->id);
    ks_cli_ro_print_scope(r, 0);
    printf("phase        %s since %s (%" PRId64 " s)\nsource       %s\ntarget       %s\n"
           "encoding     %s\ncanary       %s\nmin soak     %" PRIu32 " s\n"
           "reader TTL   %" PRIu32 " s\n",
           phase, since, now - r->phase_since, src, dst, ks_value_encoding_name((int)r->encoding),
           canary, r->min_soak_s, r->reader_ttl_s);
    if (r->scope == KS_SCOPE_COLUMN) {
        printf("verified     %s\n", verified[0] ? verified : "-");
    }
}
