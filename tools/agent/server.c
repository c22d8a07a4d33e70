/*
 * tools/agent/server.c -- the agent's server (docs/agent.md): HTTP/1.1
 * through libmicrohttpd, requests read by request.c, authorized by the
 * agent policy, served by one ks_app.
 *
 * Threads.  libmicrohttpd gives every API connection a thread of its own
 * (its thread-per-connection mode), which reads a request and serves it
 * where it was read: no hand-off between threads on the way in or out
 * [AG-LIM-4].  At most --workers requests are served at once; a complete
 * request waits for a slot among at most --queue others (and at most
 * --deadline), and one more is answered 503 at once.  A slow provider
 * holds its connection's thread only, never another connection's.  The
 * main thread waits for signals: SIGHUP reloads, SIGTERM and SIGINT drain
 * and stop [AG-RUN-1..4].
 *
 * The live configuration (the ks_app and the policy) is one refcounted
 * object swapped whole on reload, so a request sees the old one or the
 * new one, never half of each [AG-RUN-2].
 *
 * Secrets.  Plaintext is only ever in a request's body (collected here,
 * wiped after reading), the request's arena (request.c, wiped) and an
 * open's response buffer (wiped by its free callback).  Log lines carry
 * the peer's uid and gid, the endpoint and error names, never a byte of a
 * body [AG-SEC-1].
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

#include "agent.h"
#include "request.h"
#include "respond.h"

/* The latency histogram's upper bounds, in seconds [AG-MET-3]. */
static const double buckets[] = {0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025,
                                 0.005,   0.01,   0.025,   0.05,   0.1,   0.25, 1.0};
#define NBUCKETS (sizeof buckets / sizeof buckets[0])

/* Endpoints, for routing and the request counters. */
enum { EP_SEAL, EP_OPEN, EP_SEAL_BATCH, EP_OPEN_BATCH, EP_PARSE, EP_OTHER, EP_COUNT };
static const char *const ep_names[EP_COUNT] = {"seal", "open", "seal-batch", "open-batch", "parse",
                                               "other"};
static const char *const ep_paths[EP_PARSE + 1] = {"/v1/seal", "/v1/open", "/v1/seal-batch",
                                                   "/v1/open-batch", "/v1/parse"};

/* A request's outcome [AG-MET-1]. */
enum {
    OUT_OK, OUT_MALFORMED, OUT_TOO_LARGE, OUT_DENIED, OUT_UNKNOWN_SCOPE, OUT_OVERLOADED,
    OUT_DEADLINE, OUT_DRAINING, OUT_REFUSED, OUT_RETRYABLE, OUT_CONFIGURATION, OUT_COUNT
};
static const char *const out_names[OUT_COUNT] = {
    "ok", "malformed", "too-large", "denied", "unknown-scope", "overloaded",
    "deadline", "draining", "refused", "retryable", "configuration"};

/* Record operations, for the per-scope counters. */
enum { OP_SEAL, OP_OPEN, OP_PARSE, OP_COUNT };
static const char *const op_names[OP_COUNT] = {"seal", "open", "parse"};

/* The configuration requests use: replaced whole on SIGHUP. */
typedef struct live {
    ks_app *app;
    ks_agent_policy *policy; /* NULL when no Unix listener needs one */
    atomic_uint refs;        /* requests using it, plus one while it is current */
} live;

/* One request: its connection, body and answer. */
typedef struct req {
    struct agent *agent;
    struct MHD_Connection *conn;
    int ep;
    int counted;             /* counted in in_flight */
    uid_t uid;
    gid_t gid;
    uint8_t *body;
    size_t len, cap;
    int too_large;
    int frame;               /* the body is a batch frame [AG-BIN-1] */
    unsigned refuse;         /* 404 or 405 to answer once the body is dropped, else 0 */
    double t0;               /* seconds (monotonic) when the body was complete */
    unsigned status;
    uint8_t *resp;           /* from resp_alloc, or NULL */
    size_t resp_len;
} req;

struct agent;

/* The closure of a listener's handlers: the agent, and whether it is the
 * API's (the Unix socket) or the metrics' (TCP). */
typedef struct listener {
    struct agent *a;
    int is_api;
} listener;

/* The agent. */
typedef struct agent {
    const ks_agent_config *cfg;
    ks_agent_limits lim;
    pthread_mutex_t live_mu;
    live *cur;

    /* Admission [AG-LIM-4..5]: requests being served (at most
     * cfg->workers) and requests waiting for a slot (at most cfg->queue). */
    pthread_mutex_t q_mu;
    pthread_cond_t q_cv;     /* a slot freed, or the agent stops */
    pthread_cond_t idle_cv;  /* busy fell to 0 */
    unsigned busy;
    size_t waiting;
    int q_stop;

    struct MHD_Daemon *api, *metrics;
    listener l_api, l_metrics;
    int api_fd, metrics_fd;
    char unix_path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    int own_unix;            /* we created unix_path (and unlink it) */

    atomic_int draining;
    atomic_int abandon;      /* past the drain deadline: waiters are answered, not served */
    atomic_int provider_ok;  /* 0 after a provider failure, 1 after a success */
    atomic_long in_flight;
    atomic_long queued;
    _Atomic uint64_t last_start_ms; /* mono_s() * 1000 when the last request began */

    /* Counters, cumulative [AG-MET-1..5]. */
    _Atomic uint64_t requests[EP_COUNT][OUT_COUNT];
    _Atomic uint64_t *records; /* [OP_COUNT][n_scopes + 1][4 classes] */
    _Atomic uint64_t hist[EP_COUNT][NBUCKETS + 1];
    _Atomic uint64_t hist_sum_us[EP_COUNT];
    _Atomic uint64_t reloads_ok, reloads_failed;
    atomic_int config_ok;
} agent;

/* ---- small helpers ---------------------------------------------------------------- */

/* Seconds on the monotonic clock. */
static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* One log line to stderr, prefixed; never given a byte of a body. */
static void logf_(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void logf_(const char *fmt, ...)
{
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "keyshift serve: %s\n", line);
}

/* ---- the live configuration ------------------------------------------------------- */

/* Take a reference to the current configuration. */
static live *live_get(agent *a)
{
    pthread_mutex_lock(&a->live_mu);
    live *l = a->cur;
    atomic_fetch_add(&l->refs, 1);
    pthread_mutex_unlock(&a->live_mu);
    return l;
}

/* Close and free l's app and policy. */
static void live_destroy(live *l)
{
    if (l == NULL) {
        return;
    }
    ks_app_close(l->app); /* reports once more and deregisters */
    ks_agent_policy_free(l->policy);
    free(l);
}

/* Drop a reference; the last one destroys. */
static void live_put(live *l)
{
    if (atomic_fetch_sub(&l->refs, 1) == 1) {
        live_destroy(l);
    }
}

/* Open a configuration from a->cfg: the policy (when a Unix listener
 * needs it) and the app.  NULL after logging why. */
static live *live_open(agent *a, int need_policy)
{
    const ks_agent_config *c = a->cfg;
    live *l = calloc(1, sizeof *l);
    if (l == NULL) {
        logf_("out of memory");
        return NULL;
    }
    char msg[512] = "";
    if (need_policy) {
        ks_err e = ks_agent_policy_load(c->policy, &l->policy, msg, sizeof msg);
        if (e != KS_OK) {
            logf_("the policy file %s was not loaded (%s): %s", c->policy, ks_err_name(e), msg);
            free(l);
            return NULL;
        }
    }
    ks_app_options o;
    memset(&o, 0, sizeof o);
    o.keyring = c->keyring;
    o.providers = c->providers;
    o.passphrase = c->passphrase;
    o.database = c->database;
    o.instance_id = c->instance_id;
    o.default_key_id = c->default_key_id;
    o.interval_ms = c->interval_ms;
    ks_ctx_config cc;
    ks_ctx_config_default(&cc);
    cc.latency_histograms = 1; /* the health report's, as ks_app's default */
    if (c->dek_max_messages > 0) {
        cc.dek_max_messages = c->dek_max_messages;
    }
    if (c->cache_entries >= 0) {
        cc.cache_entries = (uint32_t)c->cache_entries;
    }
    o.ctx_config = &cc;
    ks_err e = ks_app_open(&o, &l->app, msg, sizeof msg);
    if (e != KS_OK) {
        logf_("the keys and rollout state were not opened (%s): %s", ks_err_name(e), msg);
        ks_agent_policy_free(l->policy);
        free(l);
        return NULL;
    }
    atomic_store(&l->refs, 1);
    return l;
}

/* [AG-RUN-2] SIGHUP: open everything anew; on success swap it in, else
 * keep the old and say so (and in /metrics). */
static void reload(agent *a, int need_policy)
{
    live *n = live_open(a, need_policy);
    if (n == NULL) {
        atomic_fetch_add(&a->reloads_failed, 1);
        atomic_store(&a->config_ok, 0);
        logf_("reload failed: the previous configuration stays in use");
        return;
    }
    pthread_mutex_lock(&a->live_mu);
    live *old = a->cur;
    a->cur = n;
    pthread_mutex_unlock(&a->live_mu);
    live_put(old);
    atomic_fetch_add(&a->reloads_ok, 1);
    atomic_store(&a->config_ok, 1);
    atomic_store(&a->provider_ok, 1);
    logf_("reloaded the keys, the registry and the policy");
}

/* ---- serving one request ---------------------------------------------------------- */

/* The HTTP status of a record's error [AG-ERR-2]. */
static unsigned status_of(ks_err e)
{
    if (e == KS_OK) {
        return 200;
    }
    switch (ks_err_class(e)) {
    case KS_ERROR_CLASS_RETRYABLE: return 503;
    case KS_ERROR_CLASS_REFUSED:
        return e == KS_ERR_PHASE ? 409 : e == KS_ERR_INVALID_ARGUMENT ? 400 : 422;
    default: return 500;
    }
}

/* The per-scope counter of (op, scope index, class). */
static _Atomic uint64_t *record_counter(agent *a, int op, size_t scope, ks_error_class cls)
{
    const size_t ns = a->cfg->n_scopes + 1;
    return &a->records[((size_t)op * ns + scope) * 4 + (size_t)cls];
}

/* The index of scope s among those served, or n_scopes. */
static size_t scope_index(const agent *a, const char *s)
{
    for (size_t i = 0; i < a->cfg->n_scopes; i++) {
        if (strcmp(a->cfg->scopes[i], s) == 0) {
            return i;
        }
    }
    return a->cfg->n_scopes;
}

/* Wipe and free r's body: every byte it holds is in [0, len), since a
 * growing body is copied by its length [AG-SEC-2]. */
static void body_drop(req *r)
{
    if (r->body != NULL) {
        sodium_memzero(r->body, r->len);
        free(r->body);
    }
    r->body = NULL;
    r->len = r->cap = 0;
}

/* Write a request-level error body [AG-ERR-1] into a fresh buffer. */
static void answer_error_at(req *r, unsigned status, const char *name, const char *cls,
                            const char *message, const char *member, long index, long offset)
{
    jw w = {resp_alloc(1024), 0, 1024, 0};
    if (w.p == NULL) {
        r->status = 500;
        return;
    }
    jw_fmt(&w, "{\"error\":\"%s\",\"class\":\"%s\"", name, cls);
    if (member != NULL) {
        jw_fmt(&w, ",\"member\":\"%s\"", member);
    }
    if (index >= 0) {
        jw_fmt(&w, ",\"index\":%ld", index);
    }
    if (offset >= 0) {
        jw_fmt(&w, ",\"offset\":%ld", offset);
    }
    jw_fmt(&w, ",\"message\":\"%s\"}\n", message);
    assert(!w.overflow);
    resp_free(r->resp);
    r->resp = w.p;
    r->resp_len = w.n;
    r->status = status;
    r->frame = 0; /* [AG-BIN-1] an error of the whole request is JSON */
}

/* answer_error_at without an offset. */
static void answer_error(req *r, unsigned status, const char *name, const char *cls,
                         const char *message, const char *member, long index)
{
    answer_error_at(r, status, name, cls, message, member, index, -1);
}

/* Serve record rec of kind op with the app, writing its result to w: a
 * JSON object, or in the batch frame when frame is nonzero (the output
 * written in place, [AG-BIN-4]).  Returns the record's error. */
static ks_err serve_record(agent *a, live *l, int op, const ks_agent_record *rec, jw *w, int frame)
{
    ks_app_record ar = {rec->table, rec->column, rec->tenant, rec->context, rec->purpose};
    ks_rollout_class cls;
    memset(&cls, 0, sizeof cls);
    ks_parse_error pe = {0, 0, 0};
    ks_err e;
    if (op == OP_PARSE) {
        ks_app_header h;
        e = ks_app_parse(rec->data.ptr, rec->data.len, &h, &pe);
        if (e == KS_OK) {
            const uint8_t *v = rec->data.ptr;
            jw_fmt(w, "{\"version\":%u,\"algorithm\":\"%s\",\"tenant\":", h.version,
                   ks_alg_name(h.algorithm));
            jw_name(w, v + h.tenant.offset, h.tenant.len);
            jw_str(w, ",\"key_id\":");
            jw_name(w, v + h.key_id.offset, h.key_id.len);
            jw_fmt(w, ",\"key_version\":%" PRIu32, h.key_version);
            if (h.purpose.len > 0) {
                jw_str(w, ",\"purpose\":");
                jw_name(w, v + h.purpose.offset, h.purpose.len);
            }
            jw_fmt(w, ",\"ciphertext_len\":%zu,\"header_len\":%zu,\"total_len\":%zu}",
                   h.ciphertext.len, h.header_len, h.total_len);
            return KS_OK;
        }
        put_record_error(w, e, &pe);
        return e;
    }
    size_t cap = op == OP_SEAL ? ks_app_seal_max_len(rec->data.len) : rec->data.len;
    if (cap == 0 && op == OP_SEAL) {
        if (frame) {
            fw_record_error(w, KS_ERR_TOO_LARGE, NULL);
        } else {
            put_record_error(w, KS_ERR_TOO_LARGE, NULL);
        }
        return KS_ERR_TOO_LARGE;
    }
    const size_t at = w->n;
    uint8_t *out;
    if (frame) {
        /* In place: after the kind byte and the output's length. */
        if (w->overflow || FW_RESULT_MAX > w->cap - w->n || cap > w->cap - w->n - FW_RESULT_MAX) {
            w->overflow = 1;
            return KS_ERR_NO_MEMORY;
        }
        out = w->p + at + 5;
    } else {
        out = malloc(cap ? cap : 1);
        if (out == NULL) {
            put_record_error(w, KS_ERR_NO_MEMORY, NULL);
            return KS_ERR_NO_MEMORY;
        }
    }
    size_t n = 0;
    if (op == OP_SEAL) {
        e = ks_app_seal(l->app, &ar, rec->data.ptr, rec->data.len, out, cap, &n, &cls);
    } else {
        e = ks_app_open_value(l->app, &ar, rec->data.ptr, rec->data.len, out, cap, &n, &cls, &pe);
    }
    if (frame) {
        if (e == KS_OK) {
            sodium_memzero(out + n, cap - n); /* only [0, n) is the answer's */
            fw_u8(w, 0);
            fw_u32(w, (uint32_t)n);
            w->n += n;
            fw_class(w, &cls);
        } else {
            sodium_memzero(out, cap);
            fw_record_error(w, e, &pe);
        }
    } else {
        if (e == KS_OK) {
            jw_str(w, op == OP_SEAL ? "{\"value\":" : "{\"plaintext\":");
            jw_b64(w, out, n);
            put_class(w, &cls);
            jw_str(w, "}");
        } else {
            put_record_error(w, e, &pe);
        }
        sodium_memzero(out, cap);
        free(out);
    }
    /* [AG-HEALTH-2] Readiness follows the providers' last answer. */
    if (e == KS_ERR_UNAVAILABLE || e == KS_ERR_TIMEOUT) {
        atomic_store(&a->provider_ok, 0);
    } else if (e == KS_OK) {
        atomic_store(&a->provider_ok, 1);
    }
    return e;
}

/* The response capacity for request q: every record's output (in base64
 * for JSON) plus room for its fields. */
static size_t resp_cap(const ks_agent_request *q, int frame)
{
    size_t cap = 64;
    for (size_t i = 0; i < q->n; i++) {
        size_t d = q->records[i].data.len;
        size_t m = ks_app_seal_max_len(d);
        m = m > d ? m : d;
        cap += frame ? m + FW_RESULT_MAX : ks_envelope_text_len(m) + 512;
    }
    return cap;
}

/* Count the latency of r (its endpoint) in the histogram. */
static void observe(agent *a, int ep, double seconds)
{
    size_t b = 0;
    while (b < NBUCKETS && seconds > buckets[b]) {
        b++;
    }
    atomic_fetch_add(&a->hist[ep][b], 1);
    atomic_fetch_add(&a->hist_sum_us[ep], (uint64_t)(seconds * 1e6));
}

/* Serve request r once admitted ([AG-LIM-4..5]): read it, authorize every record, serve
 * each, write the answer.  Never blocks on anything but the app. */
static void serve(agent *a, req *r)
{
    static const ks_agent_verb verbs[EP_PARSE + 1] = {KS_AGENT_SEAL, KS_AGENT_OPEN,
                                                      KS_AGENT_SEAL_BATCH, KS_AGENT_OPEN_BATCH,
                                                      KS_AGENT_PARSE};
    static const ks_agent_op pops[OP_COUNT] = {KS_AGENT_OP_SEAL, KS_AGENT_OP_OPEN,
                                               KS_AGENT_OP_PARSE};
    const int op = r->ep == EP_SEAL || r->ep == EP_SEAL_BATCH ? OP_SEAL
                   : r->ep == EP_PARSE                         ? OP_PARSE
                                                               : OP_OPEN;
    ks_agent_request q;
    ks_agent_req_error re;
    /* A frame's records point into the body, wiped once they are served. */
    const int frame = r->frame;
    ks_err e = frame ? ks_agent_request_read_frame(verbs[r->ep], r->body, r->len, &a->lim, &q, &re)
                     : ks_agent_request_read(verbs[r->ep], r->body, r->len, &a->lim, &q, &re);
    if (!frame || e != KS_OK) {
        body_drop(r);
    }
    if (e != KS_OK) {
        if (e == KS_ERR_BAD_VALUE) {
            const int big = re.reason == KS_AGENT_R_TOO_LARGE || re.reason == KS_AGENT_R_TOO_MANY;
            answer_error_at(r, big ? 413 : 400, ks_agent_reason_name(re.reason), "refused",
                            frame ? "The request body does not follow docs/agent.md section 4a."
                                  : "The request body does not follow docs/agent.md section 4.",
                            re.member, re.index, re.offset);
            atomic_fetch_add(&a->requests[r->ep][big ? OUT_TOO_LARGE : OUT_MALFORMED], 1);
        } else {
            answer_error(r, 503, "no-memory", "retryable", "The agent is out of memory.", NULL, -1);
            atomic_fetch_add(&a->requests[r->ep][OUT_RETRYABLE], 1);
        }
        return;
    }
    live *l = live_get(a);
    /* [AG-AUTH-2] Every record is authorized before any is served. */
    for (size_t i = 0; i < q.n; i++) {
        const ks_agent_record *rec = &q.records[i];
        if (l->policy == NULL ||
            !ks_agent_policy_allows(l->policy, r->uid, r->gid, rec->scope, rec->tenant.ptr,
                                    rec->tenant.len, pops[op])) {
            logf_("denied: uid %u gid %u %s (record %zu)", (unsigned)r->uid, (unsigned)r->gid,
                  ep_names[r->ep], i);
            answer_error(r, 403, "not-authorized", "refused",
                         "The agent's policy does not allow this peer this operation.", NULL,
                         q.n > 1 ? (long)i : -1);
            atomic_fetch_add(&a->requests[r->ep][OUT_DENIED], 1);
            goto done;
        }
        if (scope_index(a, rec->scope) == a->cfg->n_scopes) {
            answer_error(r, 404, "unknown-scope", "refused",
                         "The agent does not serve this scope (see its --scope options).",
                         "scope", q.n > 1 ? (long)i : -1);
            atomic_fetch_add(&a->requests[r->ep][OUT_UNKNOWN_SCOPE], 1);
            goto done;
        }
    }
    size_t cap = resp_cap(&q, frame);
    jw w = {resp_alloc(cap), 0, cap, 0};
    if (w.p == NULL) {
        answer_error(r, 503, "no-memory", "retryable", "The agent is out of memory.", NULL, -1);
        atomic_fetch_add(&a->requests[r->ep][OUT_RETRYABLE], 1);
        goto done;
    }
    const int batch = r->ep == EP_SEAL_BATCH || r->ep == EP_OPEN_BATCH;
    if (frame) {
        jw_put(&w, KS_AGENT_FRAME_RESP_MAGIC, 4); /* [AG-BIN-4] */
        fw_u32(&w, (uint32_t)q.n);
    } else if (batch) {
        jw_str(&w, "{\"results\":[");
    }
    ks_err first = KS_OK;
    for (size_t i = 0; i < q.n; i++) {
        if (i > 0 && !frame) {
            jw_str(&w, ",");
        }
        e = serve_record(a, l, op, &q.records[i], &w, frame);
        first = first == KS_OK ? e : first;
        atomic_fetch_add(record_counter(a, op, scope_index(a, q.records[i].scope), ks_err_class(e)),
                         1);
    }
    if (!frame) {
        jw_str(&w, batch ? "]}\n" : "\n");
    }
    assert(!w.overflow);
    resp_written(w.p, w.n);
    resp_free(r->resp);
    r->resp = w.p;
    r->resp_len = w.n;
    r->status = batch ? 200 : status_of(first);
    {
        static const int by_class[4] = {OUT_OK, OUT_RETRYABLE, OUT_REFUSED, OUT_CONFIGURATION};
        atomic_fetch_add(&a->requests[r->ep][batch ? OUT_OK : by_class[ks_err_class(first)]], 1);
    }
done:
    live_put(l);
    ks_agent_request_free(&q);
    body_drop(r);
}

/* ---- admission ------------------------------------------------------------------ */

/* What admit decided. */
enum { ADMIT_SERVE = 1, ADMIT_FULL = 0, ADMIT_DRAINING = -1, ADMIT_DEADLINE = -2 };

/* [AG-LIM-4..5] Take a serving slot for a request whose body was complete
 * at t0: at once when one is free and nobody waits; else wait, among at
 * most cfg->queue others, until one frees or the deadline passes.
 * ADMIT_SERVE (release the slot after serving), ADMIT_FULL when the
 * waiters are at the bound, ADMIT_DEADLINE past the deadline,
 * ADMIT_DRAINING when the agent stops [AG-RUN-3]. */
static int admit(agent *a, double t0)
{
    pthread_mutex_lock(&a->q_mu);
    if (a->q_stop) {
        pthread_mutex_unlock(&a->q_mu);
        return ADMIT_DRAINING;
    }
    if (a->busy < a->cfg->workers && a->waiting == 0) {
        a->busy++;
        pthread_mutex_unlock(&a->q_mu);
        return ADMIT_SERVE;
    }
    if (a->waiting >= a->cfg->queue) {
        pthread_mutex_unlock(&a->q_mu);
        return ADMIT_FULL;
    }
    a->waiting++;
    atomic_store(&a->queued, (long)a->waiting);
    /* The deadline on the clock the condition variable waits by. */
    const double until = t0 + (double)a->cfg->deadline_ms / 1000.0;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    const double left = until - mono_s();
    if (left > 0) {
        const long long ns = (long long)ts.tv_nsec + (long long)(left * 1e9);
        ts.tv_sec += (time_t)(ns / 1000000000LL);
        ts.tv_nsec = (long)(ns % 1000000000LL);
    }
    int rc = ADMIT_DEADLINE;
    for (;;) {
        if (a->q_stop || atomic_load(&a->abandon)) {
            rc = ADMIT_DRAINING;
            break;
        }
        if (a->busy < a->cfg->workers) {
            a->busy++;
            rc = ADMIT_SERVE;
            break;
        }
        if (left <= 0 || pthread_cond_timedwait(&a->q_cv, &a->q_mu, &ts) == ETIMEDOUT) {
            /* Past the deadline: not served.  A slot freed as the wait
             * timed out goes to the next waiter. */
            if (a->busy < a->cfg->workers) {
                pthread_cond_signal(&a->q_cv);
            }
            break;
        }
    }
    a->waiting--;
    atomic_store(&a->queued, (long)a->waiting);
    pthread_mutex_unlock(&a->q_mu);
    return rc;
}

/* Give back a slot admit handed out, and wake one waiter for it. */
static void release(agent *a)
{
    pthread_mutex_lock(&a->q_mu);
    assert(a->busy > 0);
    a->busy--;
    pthread_cond_signal(&a->q_cv);
    if (a->busy == 0) {
        pthread_cond_broadcast(&a->idle_cv);
    }
    pthread_mutex_unlock(&a->q_mu);
}

/* Serve r in its connection's thread once admitted, or answer why not;
 * counts its latency [AG-MET-3]. */
static void admit_and_serve(agent *a, req *r)
{
    const int q = admit(a, r->t0);
    if (q == ADMIT_SERVE) {
        serve(a, r);
        release(a);
    } else {
        body_drop(r);
        if (q == ADMIT_FULL) {
            answer_error(r, 503, "overloaded", "retryable",
                         "The agent's work queue is full; retry after the Retry-After delay.",
                         NULL, -1);
            atomic_fetch_add(&a->requests[r->ep][OUT_OVERLOADED], 1);
        } else if (q == ADMIT_DEADLINE) {
            answer_error(r, 503, "deadline", "retryable",
                         "The request waited past the agent's deadline; retry later.", NULL, -1);
            atomic_fetch_add(&a->requests[r->ep][OUT_DEADLINE], 1);
        } else {
            answer_error(r, 503, "draining", "retryable",
                         "The agent is shutting down; retry on its successor.", NULL, -1);
            atomic_fetch_add(&a->requests[r->ep][OUT_DRAINING], 1);
        }
    }
    observe(a, r->ep, mono_s() - r->t0);
}

/* ---- HTTP ------------------------------------------------------------------------- */

/* Queue r's answer on its connection; the buffer passes to libmicrohttpd,
 * which wipes it through resp_free. */
static enum MHD_Result send_answer(struct MHD_Connection *conn, req *r)
{
    struct MHD_Response *resp;
    if (r->resp != NULL) {
        resp = MHD_create_response_from_buffer_with_free_callback(r->resp_len, r->resp, resp_free);
        if (resp == NULL) {
            resp_free(r->resp);
        }
        r->resp = NULL;
    } else {
        static char empty[1];
        resp = MHD_create_response_from_buffer(0, empty, MHD_RESPMEM_PERSISTENT);
    }
    if (resp == NULL) {
        return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type", r->frame ? KS_AGENT_FRAME_TYPE : "application/json");
    MHD_add_response_header(resp, "Cache-Control", "no-store");
    if (r->status == 503) {
        MHD_add_response_header(resp, "Retry-After", "1"); /* [AG-ERR-3] */
    }
    if (atomic_load(&r->agent->draining)) {
        MHD_add_response_header(resp, "Connection", "close"); /* [AG-RUN-3] */
    }
    enum MHD_Result rc = MHD_queue_response(conn, r->status, resp);
    MHD_destroy_response(resp);
    return rc;
}

/* Answer r at once with a request-level error. */
static enum MHD_Result reply_error(struct MHD_Connection *conn, req *r, unsigned status,
                                   const char *name, const char *cls, const char *message)
{
    answer_error(r, status, name, cls, message, NULL, -1);
    return send_answer(conn, r);
}

/* Answer a GET with text of the given type, copied. */
static enum MHD_Result reply_text(struct MHD_Connection *conn, unsigned status, const char *type,
                                  const char *text, size_t len)
{
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(len, (void *)(uintptr_t)text, MHD_RESPMEM_MUST_COPY);
    if (resp == NULL) {
        return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type", type);
    MHD_add_response_header(resp, "Cache-Control", "no-store");
    enum MHD_Result rc = MHD_queue_response(conn, status, resp);
    MHD_destroy_response(resp);
    return rc;
}

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
        snprintf(labels[e], sizeof labels[e], "endpoint=\"%s\"", ep_names[e]);
        for (size_t i = 0; i <= NBUCKETS; i++) {
            counts[e][i] = atomic_load(&a->hist[e][i]);
        }
        s[e] = (ks_metrics_hist_series){labels[e], counts[e],
                                        (double)atomic_load(&a->hist_sum_us[e]) / 1e6};
    }
    ks_metrics_buf b;
    jw_metrics_begin(w, &b);
    ks_metrics_write_histogram(&b, "keyshift_agent_request_duration_seconds",
                               "Time from a complete request body to its answer.", buckets,
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
                       ep_names[e], out_names[o], v);
            }
        }
    }
    jw_str(w, "# HELP keyshift_agent_records_total Records served, by operation, scope and outcome.\n"
              "# TYPE keyshift_agent_records_total counter\n");
    for (int op = 0; op < OP_COUNT; op++) {
        for (size_t s = 0; s <= a->cfg->n_scopes; s++) {
            for (int c = 0; c < 4; c++) {
                uint64_t v = atomic_load(record_counter(a, op, s, (ks_error_class)c));
                if (v == 0 && (c != 0 || s == a->cfg->n_scopes)) {
                    continue;
                }
                jw_fmt(w, "keyshift_agent_records_total{op=\"%s\",scope=\"%s\",outcome=\"%s\"} %" PRIu64 "\n",
                       op_names[op], s < a->cfg->n_scopes ? a->cfg->scopes[s] : "other",
                       ks_error_class_name((ks_error_class)c), v);
            }
        }
    }
    metrics_durations(a, w);
    live *l = live_get(a);
    ks_metrics m;
    ks_app_metrics(l->app, &m);
    ks_app_stats st;
    ks_app_stats_get(l->app, &st);
    ks_health_sample h;
    ks_app_health_sample(l->app, &h);
    live_put(l);
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
static enum MHD_Result serve_get(agent *a, struct MHD_Connection *conn, const char *url)
{
    if (strcmp(url, "/healthz") == 0) {
        return reply_text(conn, 200, "text/plain", "ok\n", 3);
    }
    if (strcmp(url, "/readyz") == 0) {
        return ready(a) ? reply_text(conn, 200, "text/plain", "ready\n", 6)
                        : reply_text(conn, 503, "text/plain", "not ready\n", 10);
    }
    if (strcmp(url, "/metrics") == 0) {
        size_t cap = 32768 + (a->cfg->n_scopes + 1) * 1024; /* health totals: <= 5.3 KiB */
        jw w = {malloc(cap), 0, cap, 0};
        if (w.p == NULL) {
            return MHD_NO;
        }
        metrics_text(a, &w);
        enum MHD_Result rc = w.overflow ? MHD_NO
                                        : reply_text(conn, 200, "text/plain; version=0.0.4",
                                                     (const char *)w.p, w.n);
        free(w.p);
        return rc;
    }
    return reply_text(conn, 404, "application/json",
                      "{\"error\":\"not-found\",\"class\":\"refused\"}\n", 40);
}

/* [AG-AUTH-1] The peer's uid and gid as the kernel reports them for
 * connection fd (SO_PEERCRED); 0 when unknown. */
static int peer_cred_fd(int fd, uid_t *uid, gid_t *gid)
{
    struct ucred uc;
    socklen_t ul = sizeof uc;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &uc, &ul) != 0 || ul != sizeof uc) {
        return 0;
    }
    *uid = uc.uid;
    *gid = uc.gid;
    return 1;
}

/* An API connection's peer, read once when the connection is accepted. */
typedef struct peer {
    int known;               /* 0: its credentials could not be read (denied) */
    uid_t uid;
    gid_t gid;
} peer;

/* The connection fd of conn, or -1. */
static int conn_fd(struct MHD_Connection *conn)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci != NULL ? (int)ci->connect_fd : -1;
}

/* libmicrohttpd's connection callback of the API listener: read the
 * peer's credentials once, as the connection starts, into its socket
 * context; free them as it closes.  [AG-AUTH-1] names the credentials
 * the kernel reports for the connection: for a connected Unix stream
 * socket those are fixed at connect(2) (unix(7), SO_PEERCRED), so every
 * request on the connection has the same peer and reading them once is
 * exact.  Only the credentials are kept: the policy decision is taken
 * for every request with the policy current then ([AG-AUTH-2],
 * [AG-RUN-2]), so a reload applies to the next request of a connection
 * already open. */
static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe)
{
    (void)cls;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        peer *p = malloc(sizeof *p);
        if (p != NULL) {
            const int fd = conn_fd(conn);
            p->known = fd >= 0 && peer_cred_fd(fd, &p->uid, &p->gid);
        }
        *socket_context = p; /* NULL: peer_cred reads them per request */
    } else if (toe == MHD_CONNECTION_NOTIFY_CLOSED) {
        free(*socket_context);
        *socket_context = NULL;
    }
}

/* [AG-AUTH-1] The peer's uid and gid: those read as the connection
 * started (on_connection), or read now when they could not be kept; 0
 * when unknown. */
static int peer_cred(struct MHD_Connection *conn, uid_t *uid, gid_t *gid)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    const peer *p = ci != NULL ? ci->socket_context : NULL;
    if (p != NULL) {
        *uid = p->uid;
        *gid = p->gid;
        return p->known;
    }
    const int fd = conn_fd(conn);
    return fd >= 0 && peer_cred_fd(fd, uid, gid);
}

/* libmicrohttpd's access handler for both listeners; cls says which
 * (non-NULL: the API's). */
static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload,
                                  size_t *upload_len, void **con_cls)
{
    (void)version;
    const listener *li = cls;
    agent *a = li->a;
    const int is_api = li->is_api;
    req *r = *con_cls;
    if (r == NULL) {
        if (strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0) {
            return serve_get(a, conn, url);
        }
        r = calloc(1, sizeof *r);
        if (r == NULL) {
            return MHD_NO;
        }
        *con_cls = r;
        r->agent = a;
        r->conn = conn;
        r->ep = EP_OTHER;
        for (int e = 0; e <= EP_PARSE; e++) {
            if (strcmp(url, ep_paths[e]) == 0) {
                r->ep = e;
            }
        }
        if (!is_api || r->ep == EP_OTHER || strcmp(method, "POST") != 0) {
            /* Answered once the body is read and dropped, so that the
             * client is not reset while it still writes it. */
            r->refuse = r->ep == EP_OTHER || !is_api ? 404 : 405;
            return MHD_YES;
        }
        r->counted = 1;
        atomic_fetch_add(&a->in_flight, 1);
        atomic_store(&a->last_start_ms, (uint64_t)(mono_s() * 1000.0));
        if (atomic_load(&a->draining)) {
            atomic_fetch_add(&a->requests[r->ep][OUT_DRAINING], 1);
            return reply_error(conn, r, 503, "draining", "retryable",
                               "The agent is shutting down; retry on its successor.");
        }
        if (!peer_cred(conn, &r->uid, &r->gid)) {
            logf_("denied: a peer whose credentials cannot be read");
            atomic_fetch_add(&a->requests[r->ep][OUT_DENIED], 1);
            return reply_error(conn, r, 403, "not-authorized", "refused",
                               "The agent cannot read the peer's credentials.");
        }
        /* [AG-REQ-2] A body declared too large is refused before it is
         * read when the client waits for 100 Continue or the body is past
         * 16 times the bound; otherwise it is read and dropped, so that
         * a client still writing it gets the answer rather than a reset. */
        const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Content-Length");
        const unsigned long long declared = cl != NULL ? strtoull(cl, NULL, 10) : 0;
        if (declared > a->lim.max_body) {
            const char *ex = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Expect");
            if ((ex != NULL && strcasecmp(ex, "100-continue") == 0) ||
                declared / 16 > a->lim.max_body) {
                atomic_fetch_add(&a->requests[r->ep][OUT_TOO_LARGE], 1);
                return reply_error(conn, r, 413, "too-large", "refused",
                                   "The request body is larger than the agent's --max-request.");
            }
            r->too_large = 1;
        } else if (declared > 0) {
            /* Room for the whole body at once: no copy as it grows. */
            r->body = malloc((size_t)declared);
            r->cap = r->body != NULL ? (size_t)declared : 0;
        }
        /* [AG-BIN-1] The batch frame, on the batch endpoints only. */
        const char *ct = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Content-Type");
        r->frame = (r->ep == EP_SEAL_BATCH || r->ep == EP_OPEN_BATCH) && ct != NULL &&
                   strcasecmp(ct, KS_AGENT_FRAME_TYPE) == 0;
        return MHD_YES;
    }
    if (r->refuse != 0) {
        if (*upload_len > 0) {
            *upload_len = 0;
            return MHD_YES;
        }
        return reply_error(conn, r, r->refuse, r->refuse == 404 ? "not-found" : "method-not-allowed",
                           "refused", "No such endpoint here; see docs/agent.md section 3.");
    }
    if (*upload_len > 0) {
        /* [AG-LIM-1] Past the bound, the rest is read and dropped. */
        if (!r->too_large && *upload_len > a->lim.max_body - r->len) {
            r->too_large = 1;
            sodium_memzero(r->body, r->len);
        }
        if (!r->too_large) {
            if (r->len + *upload_len > r->cap) {
                size_t ncap = r->cap ? r->cap : 4096;
                while (ncap < r->len + *upload_len) {
                    ncap *= 2;
                }
                ncap = ncap > a->lim.max_body ? a->lim.max_body : ncap;
                uint8_t *nb = malloc(ncap);
                if (nb == NULL) {
                    return MHD_NO;
                }
                if (r->len > 0) {
                    memcpy(nb, r->body, r->len);
                    sodium_memzero(r->body, r->len);
                }
                free(r->body);
                r->body = nb;
                r->cap = ncap;
            }
            memcpy(r->body + r->len, upload, *upload_len);
            r->len += *upload_len;
        }
        *upload_len = 0;
        return MHD_YES;
    }
    if (r->too_large) {
        atomic_fetch_add(&a->requests[r->ep][OUT_TOO_LARGE], 1);
        return reply_error(conn, r, 413, "too-large", "refused",
                           "The request body is larger than the agent's --max-request.");
    }
    r->t0 = mono_s();
    admit_and_serve(a, r);
    return send_answer(conn, r);
}

/* libmicrohttpd's completion callback: free the request's state. */
static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    (void)conn;
    (void)toe;
    agent *a = ((const listener *)cls)->a;
    req *r = *con_cls;
    if (r == NULL) {
        return;
    }
    if (r->counted) {
        atomic_fetch_sub(&a->in_flight, 1);
    }
    body_drop(r);
    resp_free(r->resp);
    free(r);
    *con_cls = NULL;
}

/* ---- listeners -------------------------------------------------------------------- */

/* Create the Unix socket at path with mode and group [AG-SOCK-1..2].  A
 * stale socket file (nothing listening) is replaced; a live one refused. */
static int listen_unix(agent *a, const char *path)
{
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    if (strlen(path) >= sizeof sa.sun_path) {
        logf_("the socket path is longer than %zu bytes", sizeof sa.sun_path - 1);
        return -1;
    }
    strcpy(sa.sun_path, path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        logf_("cannot create a Unix socket: %s", strerror(errno));
        return -1;
    }
    struct stat st;
    if (lstat(path, &st) == 0) {
        if (!S_ISSOCK(st.st_mode)) {
            logf_("%s exists and is not a socket; remove it or choose another path", path);
            close(fd);
            return -1;
        }
        if (connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0) {
            logf_("another process is serving %s; stop it first", path);
            close(fd);
            return -1;
        }
        close(fd);
        unlink(path);
        fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            logf_("cannot create a Unix socket: %s", strerror(errno));
            return -1;
        }
    }
    mode_t old = umask(0177); /* never wider than 0600 before the chmod below */
    int b = bind(fd, (struct sockaddr *)&sa, sizeof sa);
    umask(old);
    if (b != 0) {
        logf_("cannot bind %s: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    strcpy(a->unix_path, path);
    a->own_unix = 1;
    if (chmod(path, (mode_t)a->cfg->socket_mode) != 0 ||
        (a->cfg->socket_gid >= 0 && chown(path, (uid_t)-1, (gid_t)a->cfg->socket_gid) != 0)) {
        logf_("cannot set the mode or group of %s: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    if (listen(fd, 128) != 0) {
        logf_("cannot listen on %s: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    return fd;
}

/* Listen on 127.0.0.1:port (metrics only) [AG-SOCK-3]; the port bound is
 * logged (port 0 picks one). */
static int listen_tcp(const char *spec)
{
    const char *colon = strrchr(spec, ':');
    char host[64];
    if (colon == NULL || (size_t)(colon - spec) >= sizeof host) {
        logf_("--listen tcp: wants tcp:127.0.0.1:PORT");
        return -1;
    }
    memcpy(host, spec, (size_t)(colon - spec));
    host[colon - spec] = '\0';
    char *end;
    unsigned long port = strtoul(colon + 1, &end, 10);
    struct sockaddr_in sin;
    memset(&sin, 0, sizeof sin);
    sin.sin_family = AF_INET;
    if (*end != '\0' || colon[1] == '\0' || port > 65535 || inet_pton(AF_INET, host, &sin.sin_addr) != 1 ||
        (ntohl(sin.sin_addr.s_addr) >> 24) != 127) {
        logf_("--listen tcp: wants a loopback address (127.0.0.0/8) and a port");
        return -1;
    }
    sin.sin_port = htons((uint16_t)port);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
        bind(fd, (struct sockaddr *)&sin, sizeof sin) != 0 || listen(fd, 64) != 0) {
        logf_("cannot listen on %s: %s", spec, strerror(errno));
        if (fd >= 0) {
            close(fd);
        }
        return -1;
    }
    socklen_t sl = sizeof sin;
    getsockname(fd, (struct sockaddr *)&sin, &sl);
    logf_("metrics on tcp:%s:%u", host, (unsigned)ntohs(sin.sin_port));
    return fd;
}

/* Start a libmicrohttpd daemon on listening socket fd for listener li:
 * the API's with a thread per connection, which serves the requests it
 * reads [AG-LIM-4], and the peer's credentials read once per connection
 * (on_connection); the metrics' with one polling thread; both with the
 * connection limit and the idle timeout [AG-LIM-3].  MHD_USE_ITC lets
 * drain quiesce the API's [AG-RUN-3]. */
static struct MHD_Daemon *start_daemon(agent *a, int fd, listener *slot)
{
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO | MHD_USE_ITC |
                     MHD_USE_ERROR_LOG;
    if (slot->is_api) {
        flags |= MHD_USE_THREAD_PER_CONNECTION;
    }
    return MHD_start_daemon(flags, 0, NULL, NULL, on_request, slot,
                            MHD_OPTION_LISTEN_SOCKET, (MHD_socket)fd,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)a->cfg->max_connections,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)a->cfg->idle_timeout_s,
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, slot,
                            MHD_OPTION_NOTIFY_CONNECTION, slot->is_api ? on_connection : NULL,
                            NULL, MHD_OPTION_END);
}

/* ---- running ---------------------------------------------------------------------- */

/* The listeners: systemd's (sd_listen_fds) when it passed any, else the
 * --listen options.  Returns 0, or -1 after logging. */
static int open_listeners(agent *a)
{
    a->api_fd = a->metrics_fd = -1;
    int n = sd_listen_fds(1);
    if (n > 0) {
        for (int i = 0; i < n; i++) {
            int fd = SD_LISTEN_FDS_START + i;
            if (sd_is_socket_unix(fd, SOCK_STREAM, 1, NULL, 0) > 0 && a->api_fd < 0) {
                a->api_fd = fd;
            } else if (sd_is_socket_inet(fd, AF_INET, SOCK_STREAM, 1, 0) > 0 && a->metrics_fd < 0) {
                a->metrics_fd = fd;
            } else {
                logf_("systemd passed a socket that is not a listening Unix or TCP stream socket");
                return -1;
            }
        }
        logf_("listening on %d socket(s) from systemd", n);
        return 0;
    }
    for (size_t i = 0; i < a->cfg->n_listen; i++) {
        const char *s = a->cfg->listen[i];
        if (strncmp(s, "unix:", 5) == 0 && a->api_fd < 0) {
            a->api_fd = listen_unix(a, s + 5);
            if (a->api_fd < 0) {
                return -1;
            }
        } else if (strncmp(s, "tcp:", 4) == 0 && a->metrics_fd < 0) {
            a->metrics_fd = listen_tcp(s + 4);
            if (a->metrics_fd < 0) {
                return -1;
            }
        } else {
            logf_("--listen %s: one unix:PATH and one tcp:127.0.0.1:PORT at most", s);
            return -1;
        }
    }
    return 0;
}

/* Wait for signals: SIGHUP reloads; SIGTERM or SIGINT returns. */
static void wait_signals(agent *a, const sigset_t *set)
{
    for (;;) {
        int sig = 0;
        if (sigwait(set, &sig) != 0) {
            continue;
        }
        if (sig == SIGHUP) {
            reload(a, a->api_fd >= 0);
        } else if (sig == SIGTERM || sig == SIGINT) {
            return;
        }
    }
}

/* [AG-RUN-3] Stop accepting, wait up to drain_ms for every accepted
 * request to be answered, then stop. */
static void drain(agent *a)
{
    atomic_store(&a->draining, 1);
    if (a->api != NULL) {
        MHD_socket fd = MHD_quiesce_daemon(a->api);
        if (a->own_unix) {
            unlink(a->unix_path); /* no new connection from here on */
        }
        if (fd != MHD_INVALID_SOCKET) {
            /* Connections the kernel completed before the unlink wait in
             * the backlog: hand them to libmicrohttpd, which answers
             * their requests 503 draining, rather than reset them. */
            struct sockaddr_storage ss;
            socklen_t sl = sizeof ss;
            int cfd, fl = fcntl(fd, F_GETFL);
            if (fl >= 0) {
                (void)fcntl(fd, F_SETFL, fl | O_NONBLOCK);
            }
            while (fl >= 0 && (cfd = accept4(fd, (struct sockaddr *)&ss, &sl, SOCK_CLOEXEC | SOCK_NONBLOCK)) >= 0) {
                if (MHD_add_connection(a->api, cfd, (struct sockaddr *)&ss, sl) != MHD_YES) {
                    close(cfd);
                }
                sl = sizeof ss;
            }
            close(fd);
        }
    }
    const double until = mono_s() + (double)a->cfg->drain_ms / 1000.0;
    /* Done when nothing is in flight and no request began for 100 ms:
     * every answer given while draining closes its connection, so a
     * client that was mid-exchange has been told by then. */
    for (;;) {
        const double now = mono_s();
        if (now >= until || (atomic_load(&a->in_flight) == 0 &&
                             now - (double)atomic_load(&a->last_start_ms) / 1000.0 >= 0.1)) {
            break;
        }
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    long left = atomic_load(&a->in_flight);
    if (left > 0) {
        logf_("%ld request(s) still in flight after the drain deadline", left);
    }
}

/* See agent.h. */
int ks_agent_run(const ks_agent_config *cfg)
{
    static agent ag; /* one agent per process: its signal handling is process-wide */
    agent *a = &ag;
    memset(a, 0, sizeof *a);
    a->cfg = cfg;
    a->lim.max_body = cfg->max_body;
    a->lim.max_batch = cfg->max_batch;
    pthread_mutex_init(&a->live_mu, NULL);
    pthread_mutex_init(&a->q_mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* admit's deadline */
    pthread_cond_init(&a->q_cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_cond_init(&a->idle_cv, NULL);
    atomic_store(&a->provider_ok, 1);
    atomic_store(&a->config_ok, 1);
    a->records = calloc((size_t)OP_COUNT * (cfg->n_scopes + 1) * 4, sizeof *a->records);
    if (a->records == NULL) {
        logf_("out of memory");
        return EX_OSERR;
    }
    /* Signals are taken by sigwait in this thread only. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGHUP);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    sigdelset(&set, SIGPIPE);

    int rc = EX_OK;
    if (open_listeners(a) != 0) {
        rc = EX_UNAVAILABLE;
        goto out;
    }
    if (a->api_fd >= 0 && cfg->policy == NULL) {
        logf_("a Unix listener needs --policy FILE: the agent denies every peer it does not name");
        rc = EX_USAGE;
        goto out;
    }
    a->cur = live_open(a, a->api_fd >= 0);
    if (a->cur == NULL) {
        rc = EX_CONFIG;
        goto out;
    }
    a->l_api = (listener){a, 1};
    a->l_metrics = (listener){a, 0};
    if (a->api_fd >= 0) {
        a->api = start_daemon(a, a->api_fd, &a->l_api);
    }
    if (a->metrics_fd >= 0) {
        a->metrics = start_daemon(a, a->metrics_fd, &a->l_metrics);
    }
    if ((a->api_fd >= 0 && a->api == NULL) || (a->metrics_fd >= 0 && a->metrics == NULL)) {
        logf_("cannot start the HTTP server");
        rc = EX_OSERR;
        goto stop;
    }
    logf_("serving %zu scope(s) with %u worker(s), queue %zu%s%s", cfg->n_scopes, cfg->workers,
          cfg->queue, a->own_unix ? " on unix:" : "", a->own_unix ? a->unix_path : "");
    sd_notify(0, "READY=1");
    wait_signals(a, &set);
    sd_notify(0, "STOPPING=1");
    drain(a);
stop:
    /* Requests still waiting for a slot are answered 503 draining, and so
     * is any whose body completes from here on; those being served finish
     * (a provider's own deadline bounds them), so that every answer is
     * written before libmicrohttpd closes the connections. */
    atomic_store(&a->abandon, 1);
    pthread_mutex_lock(&a->q_mu);
    a->q_stop = 1;
    pthread_cond_broadcast(&a->q_cv);
    while (a->busy > 0) {
        pthread_cond_wait(&a->idle_cv, &a->q_mu);
    }
    pthread_mutex_unlock(&a->q_mu);
    /* Their connections' threads send those answers: a second at most. */
    for (int i = 0; i < 100 && atomic_load(&a->in_flight) > 0; i++) {
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    if (a->api != NULL) {
        MHD_stop_daemon(a->api);
    }
    if (a->metrics != NULL) {
        MHD_stop_daemon(a->metrics);
    }
    live_put(a->cur); /* deregisters */
    logf_("stopped");
out:
    if (a->own_unix) {
        unlink(a->unix_path);
    }
    free(a->records);
    return rc;
}
