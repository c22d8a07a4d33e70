/*
 * tools/agent/server_serve.c -- serving one request of the agent (docs/agent.md): its
 * authorization [AG-AUTH-1..3], its records through the live ks_app, its
 * answer and counters, and its admission [AG-LIM-4..5] (server.h).
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
_Atomic uint64_t *ks_agent_record_counter(agent *a, int op, size_t scope, ks_error_class cls)
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
void ks_agent_body_drop(req *r)
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
void ks_agent_answer_error(req *r, unsigned status, const char *name, const char *cls,
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
    while (b < NBUCKETS && seconds > ks_agent_buckets[b]) {
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
        ks_agent_body_drop(r);
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
            ks_agent_answer_error(r, 503, "no-memory", "retryable", "The agent is out of memory.", NULL, -1);
            atomic_fetch_add(&a->requests[r->ep][OUT_RETRYABLE], 1);
        }
        return;
    }
    live *l = ks_agent_live_get(a);
    /* [AG-AUTH-2] Every record is authorized before any is served. */
    for (size_t i = 0; i < q.n; i++) {
        const ks_agent_record *rec = &q.records[i];
        if (l->policy == NULL ||
            !ks_agent_policy_allows(l->policy, r->uid, r->gid, rec->scope, rec->tenant.ptr,
                                    rec->tenant.len, pops[op])) {
            ks_agent_logf("denied: uid %u gid %u %s (record %zu)", (unsigned)r->uid, (unsigned)r->gid,
                          ks_agent_ep_names[r->ep], i);
            ks_agent_answer_error(r, 403, "not-authorized", "refused",
                                  "The agent's policy does not allow this peer this operation.", NULL,
                                  q.n > 1 ? (long)i : -1);
            atomic_fetch_add(&a->requests[r->ep][OUT_DENIED], 1);
            goto done;
        }
        if (scope_index(a, rec->scope) == a->cfg->n_scopes) {
            ks_agent_answer_error(r, 404, "unknown-scope", "refused",
                                  "The agent does not serve this scope (see its --scope options).",
                                  "scope", q.n > 1 ? (long)i : -1);
            atomic_fetch_add(&a->requests[r->ep][OUT_UNKNOWN_SCOPE], 1);
            goto done;
        }
    }
    size_t cap = resp_cap(&q, frame);
    jw w = {resp_alloc(cap), 0, cap, 0};
    if (w.p == NULL) {
        ks_agent_answer_error(r, 503, "no-memory", "retryable", "The agent is out of memory.", NULL, -1);
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
        atomic_fetch_add(ks_agent_record_counter(a, op, scope_index(a, q.records[i].scope), ks_err_class(e)),
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
    ks_agent_live_put(l);
    ks_agent_request_free(&q);
    ks_agent_body_drop(r);
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
    const double left = until - ks_agent_mono_s();
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
void ks_agent_admit_and_serve(agent *a, req *r)
{
    const int q = admit(a, r->t0);
    if (q == ADMIT_SERVE) {
        serve(a, r);
        release(a);
    } else {
        ks_agent_body_drop(r);
        if (q == ADMIT_FULL) {
            ks_agent_answer_error(r, 503, "overloaded", "retryable",
                                  "The agent's work queue is full; retry after the Retry-After delay.",
                                  NULL, -1);
            atomic_fetch_add(&a->requests[r->ep][OUT_OVERLOADED], 1);
        } else if (q == ADMIT_DEADLINE) {
            ks_agent_answer_error(r, 503, "deadline", "retryable",
                                  "The request waited past the agent's deadline; retry later.", NULL, -1);
            atomic_fetch_add(&a->requests[r->ep][OUT_DEADLINE], 1);
        } else {
            ks_agent_answer_error(r, 503, "draining", "retryable",
                                  "The agent is shutting down; retry on its successor.", NULL, -1);
            atomic_fetch_add(&a->requests[r->ep][OUT_DRAINING], 1);
        }
    }
    observe(a, r->ep, ks_agent_mono_s() - r->t0);
}
