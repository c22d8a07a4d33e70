/*
 * tools/agent/server_metrics.c -- the agent's GET endpoints: /metrics in Prometheus
 * text [AG-MET-1..5] and /healthz and /readyz [AG-HEALTH-1..2] (server.h).
 */
#define _GNU_SOURCE /* struct ucred */

#include <arpa/inet.h>
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sysexits.h>
#include <time.h>
#include <unistd.h>

#include <microhttpd.h>
#include <sodium.h>
#include <systemd/sd-daemon.h>

#include "server.h"

/* [AG-HEALTH-2] Ready: configuration loaded, the providers' last answer
 * good, not draining. */
static int ready(agent *a)
{
    /* a->cur is set before any listener starts and never NULL after. */
    return !atomic_load(&a->draining) && atomic_load(&a->provider_ok);
}

/* Start b on what is left of w's buffer, for the writers every keyshift
 * exporter shares (keyshift/health.h). */
static void jw_metrics_begin(jw *w, ks_metrics_buf *b)
{
    ks_metrics_begin(b, w->overflow ? NULL : (char *)w->p + w->n, w->overflow ? 0 : w->cap - w->n);
}

/* Take the text written to b into w: overflow when it did not fit (or a
 * writer refused its arguments). */
static void jw_metrics_end(jw *w, ks_metrics_buf *b)
{
    size_t len = 0;
    if (w->overflow) {
        return;
    }
    if (ks_metrics_end(b, &len) != KS_OK) {
        w->overflow = 1;
        return;
    }
    w->n += len;
}

/* Append to w the request durations by endpoint, a histogram over the
 * bounds of [AG-MET-3] with _sum and _count, by the shared writer. */
static void metrics_durations(agent *a, jw *w)
{
    char labels[EP_COUNT][32];
    uint64_t counts[EP_COUNT][NBUCKETS + 1];
    ks_metrics_hist_series s[EP_COUNT];
    for (int e = 0; e < EP_COUNT; e++) {
        snprintf(labels[e], sizeof labels[e], "endpoint=\"%s\"", ks_agent_ep_names[e]);
        for (size_t i = 0; i <= NBUCKETS; i++) {
            counts[e][i] = atomic_load(&a->hist[e][i]);
        }
        s[e] = (ks_metrics_hist_series){labels[e], counts[e],
                                        (double)atomic_load(&a->hist_sum_us[e]) / 1e6};
    }
    ks_metrics_buf b;
    jw_metrics_begin(w, &b);
    ks_metrics_write_histogram(&b, "keyshift_agent_request_duration_seconds",
                               "Time from a complete request body to its answer.", ks_agent_buckets,
                               NBUCKETS, s, EP_COUNT);
    jw_metrics_end(w, &b);
}

/* Append to w the library's health totals h with the shared writer: the
 * seal and open counts, failures and provider calls, and the seal and
 * open latency histograms with their _sum [AG-MET-7].  No labels: the
 * scrape's own tell agents apart, and the rollout rules select
 * source="app" series only. */
static void metrics_health(jw *w, const ks_health_sample *h)
{
    ks_metrics_series s = {NULL, h};
    ks_metrics_buf b;
    jw_metrics_begin(w, &b);
    ks_metrics_write_totals(&b, &s, 1);
    jw_metrics_end(w, &b);
}

/* Write the Prometheus text of every metric to w [AG-MET-1..7]. */
static void metrics_text(agent *a, jw *w)
{
    jw_str(w, "# HELP keyshift_agent_requests_total HTTP requests answered, by endpoint and outcome.\n"
              "# TYPE keyshift_agent_requests_total counter\n");
    for (int e = 0; e < EP_COUNT; e++) {
        for (int o = 0; o < OUT_COUNT; o++) {
            uint64_t v = atomic_load(&a->requests[e][o]);
            if (v > 0 || o == OUT_OK) {
                jw_fmt(w, "keyshift_agent_requests_total{endpoint=\"%s\",outcome=\"%s\"} %" PRIu64 "\n",
                       ks_agent_ep_names[e], ks_agent_out_names[o], v);
            }
        }
    }
    jw_str(w, "# HELP keyshift_agent_records_total Records served, by operation, scope and outcome.\n"
              "# TYPE keyshift_agent_records_total counter\n");
    for (int op = 0; op < OP_COUNT; op++) {
        for (size_t s = 0; s <= a->cfg->n_scopes; s++) {
            for (int c = 0; c < 4; c++) {
                uint64_t v = atomic_load(ks_agent_record_counter(a, op, s, (ks_error_class)c));
                if (v == 0 && (c != 0 || s == a->cfg->n_scopes)) {
                    continue;
                }
                jw_fmt(w, "keyshift_agent_records_total{op=\"%s\",scope=\"%s\",outcome=\"%s\"} %" PRIu64 "\n",
                       ks_agent_op_names[op], s < a->cfg->n_scopes ? a->cfg->scopes[s] : "other",
                       ks_error_class_name((ks_error_class)c), v);
            }
        }
    }
    metrics_durations(a, w);
    live *l = ks_agent_live_get(a);
    ks_metrics m;
    ks_app_metrics(l->app, &m);
    ks_app_stats st;
    ks_app_stats_get(l->app, &st);
    ks_health_sample h;
    ks_app_health_sample(l->app, &h);
    ks_agent_live_put(l);
    uint64_t perr = 0;
    for (size_t i = 0; i < sizeof m.provider_errors / sizeof m.provider_errors[0]; i++) {
        perr += m.provider_errors[i];
    }
    jw_fmt(w,
           "# HELP keyshift_agent_queue_depth Requests waiting for a worker.\n"
           "# TYPE keyshift_agent_queue_depth gauge\n"
           "keyshift_agent_queue_depth %ld\n"
           "# HELP keyshift_agent_queue_capacity The work queue's bound (--queue).\n"
           "# TYPE keyshift_agent_queue_capacity gauge\n"
           "keyshift_agent_queue_capacity %zu\n"
           "# HELP keyshift_agent_in_flight Requests accepted and not yet answered.\n"
           "# TYPE keyshift_agent_in_flight gauge\n"
           "keyshift_agent_in_flight %ld\n"
           "# HELP keyshift_agent_dek_cache_hits_total Opens whose DEK came from the read cache.\n"
           "# TYPE keyshift_agent_dek_cache_hits_total counter\n"
           "keyshift_agent_dek_cache_hits_total %" PRIu64 "\n"
           "# HELP keyshift_agent_dek_cache_misses_total Opens whose DEK the provider unwrapped.\n"
           "# TYPE keyshift_agent_dek_cache_misses_total counter\n"
           "keyshift_agent_dek_cache_misses_total %" PRIu64 "\n"
           "# HELP keyshift_agent_provider_calls_total Calls to the key providers.\n"
           "# TYPE keyshift_agent_provider_calls_total counter\n"
           "keyshift_agent_provider_calls_total{call=\"wrap\"} %" PRIu64 "\n"
           "keyshift_agent_provider_calls_total{call=\"unwrap\"} %" PRIu64 "\n"
           "# HELP keyshift_agent_provider_errors_total Provider calls that failed.\n"
           "# TYPE keyshift_agent_provider_errors_total counter\n"
           "keyshift_agent_provider_errors_total %" PRIu64 "\n"
           "# HELP keyshift_agent_heartbeats_total Rollout heartbeats, by outcome.\n"
           "# TYPE keyshift_agent_heartbeats_total counter\n"
           "keyshift_agent_heartbeats_total{outcome=\"ok\"} %" PRIu64 "\n"
           "keyshift_agent_heartbeats_total{outcome=\"failed\"} %" PRIu64 "\n"
           "# HELP keyshift_agent_health_reports_total Health reports to the rollouts, by outcome.\n"
           "# TYPE keyshift_agent_health_reports_total counter\n"
           "keyshift_agent_health_reports_total{outcome=\"ok\"} %" PRIu64 "\n"
           "keyshift_agent_health_reports_total{outcome=\"failed\"} %" PRIu64 "\n"
           "# HELP keyshift_agent_reloads_total Configuration reloads (SIGHUP), by outcome.\n"
           "# TYPE keyshift_agent_reloads_total counter\n"
           "keyshift_agent_reloads_total{outcome=\"ok\"} %" PRIu64 "\n"
           "keyshift_agent_reloads_total{outcome=\"failed\"} %" PRIu64 "\n"
           "# HELP keyshift_agent_config_last_reload_ok 1 when the last reload succeeded (or none failed).\n"
           "# TYPE keyshift_agent_config_last_reload_ok gauge\n"
           "keyshift_agent_config_last_reload_ok %d\n"
           "# HELP keyshift_agent_ready 1 when /readyz answers 200.\n"
           "# TYPE keyshift_agent_ready gauge\n"
           "keyshift_agent_ready %d\n",
           atomic_load(&a->queued), a->cfg->queue, atomic_load(&a->in_flight), m.cache_hits,
           m.cache_misses, m.wraps, m.unwraps, perr, st.heartbeats, st.heartbeat_errors, st.reports,
           st.report_errors, atomic_load(&a->reloads_ok), atomic_load(&a->reloads_failed),
           atomic_load(&a->config_ok), ready(a));
    metrics_health(w, &h);
}

/* Answer GET /healthz, /readyz and /metrics [AG-HEALTH-1..2], [AG-MET-1]. */
enum MHD_Result ks_agent_serve_get(agent *a, struct MHD_Connection *conn, const char *url)
{
    if (strcmp(url, "/healthz") == 0) {
        return ks_agent_reply_text(conn, 200, "text/plain", "ok\n", 3);
    }
    if (strcmp(url, "/readyz") == 0) {
        return ready(a) ? ks_agent_reply_text(conn, 200, "text/plain", "ready\n", 6)
                        : ks_agent_reply_text(conn, 503, "text/plain", "not ready\n", 10);
    }
    if (strcmp(url, "/metrics") == 0) {
        size_t cap = 32768 + (a->cfg->n_scopes + 1) * 1024; /* health totals: <= 5.3 KiB */
        jw w = {malloc(cap), 0, cap, 0};
        if (w.p == NULL) {
            return MHD_NO;
        }
        metrics_text(a, &w);
        enum MHD_Result rc = w.overflow ? MHD_NO
                                        : ks_agent_reply_text(conn, 200, "text/plain; version=0.0.4",
                                                              (const char *)w.p, w.n);
        free(w.p);
        return rc;
    }
    return ks_agent_reply_text(conn, 404, "application/json",
                               "{\"error\":\"not-found\",\"class\":\"refused\"}\n", 40);
}
