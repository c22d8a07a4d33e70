/*
 * tools/agent/server.c -- the agent's server (docs/agent.md): HTTP/1.1
 * through libmicrohttpd, requests read by request.c, authorized by the
 * agent policy, served by one ks_app.
 *
 * Threads.  One libmicrohttpd polling thread per listener does all the
 * socket work and never touches a key: a request's body is collected,
 * then the connection is suspended and the request goes into a bounded
 * queue that a fixed pool of worker threads drains [AG-LIM-4].  A full
 * queue is answered 503 at once.  The main thread waits for signals:
 * SIGHUP reloads, SIGTERM and SIGINT drain and stop [AG-RUN-1..4].
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
    int state;               /* R_READING, R_QUEUED, R_DONE */
    int counted;             /* counted in in_flight */
    uid_t uid;
    gid_t gid;
    uint8_t *body;
    size_t len, cap;
    int too_large;
    unsigned refuse;         /* 404 or 405 to answer once the body is dropped, else 0 */
    double t0;               /* seconds (monotonic) when the body was complete */
    unsigned status;
    uint8_t *resp;           /* from resp_alloc, or NULL */
    size_t resp_len;
    struct req *next;
} req;
enum { R_READING, R_QUEUED, R_DONE };

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

    pthread_mutex_t q_mu;
    pthread_cond_t q_cv;
    req **ring;              /* the queue, cfg->queue slots */
    size_t q_head, q_len;
    int q_stop;
    pthread_t *workers;
    unsigned n_workers;

    struct MHD_Daemon *api, *metrics;
    listener l_api, l_metrics;
    int api_fd, metrics_fd;
    char unix_path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    int own_unix;            /* we created unix_path (and unlink it) */

    atomic_int draining;
    atomic_int abandon;      /* past the drain deadline: workers answer, not serve */
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

/* A response buffer of n bytes whose length sits before it, so that the
 * free callback can wipe it whole [AG-SEC-2]. */
static uint8_t *resp_alloc(size_t n)
{
    uint8_t *p = malloc(n + 16);
    if (p == NULL) {
        return NULL;
    }
    memcpy(p, &n, sizeof n);
    return p + 16;
}

/* libmicrohttpd's free callback for resp_alloc's buffers: wipe, free. */
static void resp_free(void *buf)
{
    if (buf == NULL) {
        return;
    }
    uint8_t *p = (uint8_t *)buf - 16;
    size_t n;
    memcpy(&n, p, sizeof n);
    sodium_memzero(buf, n);
    free(p);
}

/* A JSON writer into a buffer sized beforehand; overflow latches. */
typedef struct jw {
    uint8_t *p;
    size_t n, cap;
    int overflow;
} jw;

/* Append s[0, n). */
static void jw_put(jw *w, const void *s, size_t n)
{
    if (w->overflow || n > w->cap - w->n) {
        w->overflow = 1;
        return;
    }
    memcpy(w->p + w->n, s, n);
    w->n += n;
}

/* Append a C string. */
static void jw_str(jw *w, const char *s)
{
    jw_put(w, s, strlen(s));
}

/* Append formatted text (numbers and names only). */
static void jw_fmt(jw *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void jw_fmt(jw *w, const char *fmt, ...)
{
    if (w->overflow) {
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf((char *)w->p + w->n, w->cap - w->n, fmt, ap);
    va_end(ap);
    if (k < 0 || (size_t)k >= w->cap - w->n) {
        w->overflow = 1;
        return;
    }
    w->n += (size_t)k;
}

/* Append a JSON string of bytes known to need no escape ([F-NAME-1],
 * [F-KEYID-1], the names of this file). */
static void jw_name(jw *w, const uint8_t *s, size_t n)
{
    jw_put(w, "\"", 1);
    jw_put(w, s, n);
    jw_put(w, "\"", 1);
}

/* Append the canonical base64 of b[0, n) as a JSON string [AG-RESP-2]. */
static void jw_b64(jw *w, const uint8_t *b, size_t n)
{
    jw_put(w, "\"", 1);
    size_t need = ks_envelope_text_len(n), got = 0;
    if (w->overflow || need > w->cap - w->n ||
        ks_envelope_text_encode(b, n, w->p + w->n, w->cap - w->n, &got) != KS_OK) {
        w->overflow = 1;
        return;
    }
    w->n += got;
    jw_put(w, "\"", 1);
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

/* Write a request-level error body [AG-ERR-1] into a fresh buffer. */
static void answer_error(req *r, unsigned status, const char *name, const char *cls,
                         const char *message, const char *member, long index)
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
    jw_fmt(&w, ",\"message\":\"%s\"}\n", message);
    assert(!w.overflow);
    resp_free(r->resp);
    r->resp = w.p;
    r->resp_len = w.n;
    r->status = status;
}

/* Write the class fields of a seal's or open's result. */
static void put_class(jw *w, const ks_rollout_class *c)
{
    if (c->is_plaintext) {
        jw_str(w, ",\"sealed\":false");
        return;
    }
    jw_fmt(w, ",\"sealed\":true,\"format\":%u,\"algorithm\":\"%s\",\"key_id\":", c->version,
           ks_alg_name(c->algorithm));
    jw_name(w, (const uint8_t *)c->key_id, strlen(c->key_id));
    jw_fmt(w, ",\"key_version\":%" PRIu32, c->key_version);
}

/* Write a record's error object [AG-ERR-1]. */
static void put_record_error(jw *w, ks_err e, const ks_parse_error *pe)
{
    jw_fmt(w, "{\"error\":\"%s\",\"class\":\"%s\"", ks_err_name(e),
           ks_error_class_name(ks_err_class(e)));
    if (pe != NULL && ks_err_is_rejection(e)) {
        jw_fmt(w, ",\"offset\":%zu", pe->offset);
    }
    jw_str(w, "}");
}

/* Serve record rec of kind op with the app, writing its result object to
 * w.  Returns the record's error. */
static ks_err serve_record(agent *a, live *l, int op, const ks_agent_record *rec, jw *w)
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
        put_record_error(w, KS_ERR_TOO_LARGE, NULL);
        return KS_ERR_TOO_LARGE;
    }
    uint8_t *out = malloc(cap ? cap : 1);
    if (out == NULL) {
        put_record_error(w, KS_ERR_NO_MEMORY, NULL);
        return KS_ERR_NO_MEMORY;
    }
    size_t n = 0;
    if (op == OP_SEAL) {
        e = ks_app_seal(l->app, &ar, rec->data.ptr, rec->data.len, out, cap, &n, &cls);
    } else {
        e = ks_app_open_value(l->app, &ar, rec->data.ptr, rec->data.len, out, cap, &n, &cls, &pe);
    }
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
    /* [AG-HEALTH-2] Readiness follows the providers' last answer. */
    if (e == KS_ERR_UNAVAILABLE || e == KS_ERR_TIMEOUT) {
        atomic_store(&a->provider_ok, 0);
    } else if (e == KS_OK) {
        atomic_store(&a->provider_ok, 1);
    }
    return e;
}

/* The response capacity for request q: every record's output in base64
 * plus room for its fields. */
static size_t resp_cap(const ks_agent_request *q)
{
    size_t cap = 64;
    for (size_t i = 0; i < q->n; i++) {
        size_t d = q->records[i].data.len;
        size_t m = ks_app_seal_max_len(d);
        cap += ks_envelope_text_len(m > d ? m : d) + 512;
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

/* Serve request r in a worker: read it, authorize every record, serve
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
    /* [AG-LIM-5] A request that waited past its deadline is not started. */
    if ((mono_s() - r->t0) * 1000.0 > (double)a->cfg->deadline_ms) {
        answer_error(r, 503, "deadline", "retryable",
                     "The request waited past the agent's deadline; retry later.", NULL, -1);
        atomic_fetch_add(&a->requests[r->ep][OUT_DEADLINE], 1);
        return;
    }
    ks_agent_request q;
    ks_agent_req_error re;
    ks_err e = ks_agent_request_read(verbs[r->ep], r->body, r->len, &a->lim, &q, &re);
    sodium_memzero(r->body, r->len);
    if (e != KS_OK) {
        if (e == KS_ERR_BAD_VALUE) {
            const int big = re.reason == KS_AGENT_R_TOO_LARGE || re.reason == KS_AGENT_R_TOO_MANY;
            answer_error(r, big ? 413 : 400, ks_agent_reason_name(re.reason), "refused",
                         "The request body does not follow docs/agent.md section 4.", re.member,
                         re.index);
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
    size_t cap = resp_cap(&q);
    jw w = {resp_alloc(cap), 0, cap, 0};
    if (w.p == NULL) {
        answer_error(r, 503, "no-memory", "retryable", "The agent is out of memory.", NULL, -1);
        atomic_fetch_add(&a->requests[r->ep][OUT_RETRYABLE], 1);
        goto done;
    }
    const int batch = r->ep == EP_SEAL_BATCH || r->ep == EP_OPEN_BATCH;
    if (batch) {
        jw_str(&w, "{\"results\":[");
    }
    ks_err first = KS_OK;
    for (size_t i = 0; i < q.n; i++) {
        if (i > 0) {
            jw_str(&w, ",");
        }
        e = serve_record(a, l, op, &q.records[i], &w);
        first = first == KS_OK ? e : first;
        atomic_fetch_add(record_counter(a, op, scope_index(a, q.records[i].scope), ks_err_class(e)),
                         1);
    }
    jw_str(&w, batch ? "]}\n" : "\n");
    assert(!w.overflow);
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
}

/* ---- the work queue --------------------------------------------------------------- */

/* [AG-LIM-4] Queue r: 1; 0 when the queue is full; -1 when the workers
 * are stopping. */
static int enqueue(agent *a, req *r)
{
    pthread_mutex_lock(&a->q_mu);
    if (a->q_stop || a->q_len == a->cfg->queue) {
        const int rc = a->q_stop ? -1 : 0;
        pthread_mutex_unlock(&a->q_mu);
        return rc;
    }
    a->ring[(a->q_head + a->q_len) % a->cfg->queue] = r;
    a->q_len++;
    atomic_store(&a->queued, (long)a->q_len);
    pthread_cond_signal(&a->q_cv);
    pthread_mutex_unlock(&a->q_mu);
    return 1;
}

/* A worker: take a request, serve it, resume its connection. */
static void *worker(void *arg)
{
    agent *a = arg;
    for (;;) {
        pthread_mutex_lock(&a->q_mu);
        while (a->q_len == 0 && !a->q_stop) {
            pthread_cond_wait(&a->q_cv, &a->q_mu);
        }
        if (a->q_len == 0) {
            pthread_mutex_unlock(&a->q_mu);
            return NULL;
        }
        req *r = a->ring[a->q_head];
        a->q_head = (a->q_head + 1) % a->cfg->queue;
        a->q_len--;
        atomic_store(&a->queued, (long)a->q_len);
        pthread_mutex_unlock(&a->q_mu);
        if (atomic_load(&a->abandon)) {
            /* [AG-RUN-3] Past the drain deadline: answered, not served. */
            answer_error(r, 503, "draining", "retryable",
                         "The agent is shutting down; retry on its successor.", NULL, -1);
            atomic_fetch_add(&a->requests[r->ep][OUT_DRAINING], 1);
        } else {
            serve(a, r);
        }
        observe(a, r->ep, mono_s() - r->t0);
        r->state = R_DONE;
        MHD_resume_connection(r->conn);
    }
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
    MHD_add_response_header(resp, "Content-Type", "application/json");
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
    r->state = R_DONE;
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

/* [AG-AUTH-1] The peer's uid and gid (SO_PEERCRED); 0 when unknown. */
static int peer_cred(struct MHD_Connection *conn, uid_t *uid, gid_t *gid)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (ci == NULL) {
        return 0;
    }
    struct ucred uc;
    socklen_t ul = sizeof uc;
    if (getsockopt(ci->connect_fd, SOL_SOCKET, SO_PEERCRED, &uc, &ul) != 0 || ul != sizeof uc) {
        return 0;
    }
    *uid = uc.uid;
    *gid = uc.gid;
    return 1;
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
        }
        return MHD_YES;
    }
    if (r->state == R_DONE) {
        return send_answer(conn, r);
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
    if (r->state == R_QUEUED) {
        return MHD_YES; /* resumed before the worker finished: not expected */
    }
    if (r->too_large) {
        atomic_fetch_add(&a->requests[r->ep][OUT_TOO_LARGE], 1);
        return reply_error(conn, r, 413, "too-large", "refused",
                           "The request body is larger than the agent's --max-request.");
    }
    r->t0 = mono_s();
    r->state = R_QUEUED;
    /* Suspended before a worker can see it, so that the worker's resume
     * always follows this suspend. */
    MHD_suspend_connection(conn);
    const int q = enqueue(a, r);
    if (q <= 0) {
        sodium_memzero(r->body, r->len);
        atomic_fetch_add(&a->requests[r->ep][q < 0 ? OUT_DRAINING : OUT_OVERLOADED], 1);
        if (q < 0) {
            answer_error(r, 503, "draining", "retryable",
                         "The agent is shutting down; retry on its successor.", NULL, -1);
        } else {
            answer_error(r, 503, "overloaded", "retryable",
                         "The agent's work queue is full; retry after the Retry-After delay.",
                         NULL, -1);
        }
        r->state = R_DONE;
        MHD_resume_connection(conn);
    }
    return MHD_YES;
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
    if (r->body != NULL) {
        sodium_memzero(r->body, r->cap);
        free(r->body);
    }
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
 * one polling thread, suspended connections while a worker serves
 * [AG-LIM-4], the connection limit and the idle timeout [AG-LIM-3]. */
static struct MHD_Daemon *start_daemon(agent *a, int fd, listener *slot)
{
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO | MHD_ALLOW_SUSPEND_RESUME |
                     MHD_USE_ERROR_LOG;
    return MHD_start_daemon(flags, 0, NULL, NULL, on_request, slot,
                            MHD_OPTION_LISTEN_SOCKET, (MHD_socket)fd,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)a->cfg->max_connections,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)a->cfg->idle_timeout_s,
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, slot,
                            MHD_OPTION_END);
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
    pthread_cond_init(&a->q_cv, NULL);
    atomic_store(&a->provider_ok, 1);
    atomic_store(&a->config_ok, 1);
    a->records = calloc((size_t)OP_COUNT * (cfg->n_scopes + 1) * 4, sizeof *a->records);
    a->ring = calloc(cfg->queue, sizeof *a->ring);
    a->workers = calloc(cfg->workers, sizeof *a->workers);
    if (a->records == NULL || a->ring == NULL || a->workers == NULL) {
        logf_("out of memory");
        free(a->records);
        free(a->ring);
        free(a->workers);
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
    for (unsigned i = 0; i < cfg->workers; i++) {
        if (pthread_create(&a->workers[i], NULL, worker, a) != 0) {
            logf_("cannot start a worker thread");
            rc = EX_OSERR;
            goto stop_workers;
        }
        a->n_workers++;
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
    /* The workers first: each answers what is still queued (503 draining
     * past the drain deadline) and resumes its connection, so that no
     * connection is suspended when libmicrohttpd stops; a request whose
     * body completes from here on is answered draining by enqueue. */
    atomic_store(&a->abandon, 1);
stop_workers:
    pthread_mutex_lock(&a->q_mu);
    a->q_stop = 1;
    pthread_cond_broadcast(&a->q_cv);
    pthread_mutex_unlock(&a->q_mu);
    for (unsigned i = 0; i < a->n_workers; i++) {
        pthread_join(a->workers[i], NULL);
    }
    /* The answers the workers gave last go out from the polling thread:
     * a second at most for it to send them. */
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
    free(a->ring);
    free(a->workers);
    return rc;
}
