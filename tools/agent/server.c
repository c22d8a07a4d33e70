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
 *
 * This file holds the live configuration, the HTTP handlers and running;
 * serving a request is server_serve.c, the GET endpoints
 * server_metrics.c, the listening sockets server_listen.c (server.h).
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

/* The latency histogram's upper bounds, in seconds [AG-MET-3]. */
const double ks_agent_buckets[] = {0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025,
                                   0.005,   0.01,   0.025,   0.05,   0.1,   0.25, 1.0};
/* The endpoints' names (counters) and paths (routing). */
const char *const ks_agent_ep_names[EP_COUNT] = {"seal", "open", "seal-batch", "open-batch", "parse",
                                                 "other"};
const char *const ks_agent_ep_paths[EP_PARSE + 1] = {"/v1/seal", "/v1/open", "/v1/seal-batch",
                                                     "/v1/open-batch", "/v1/parse"};
/* The outcomes' names [AG-MET-1]. */
const char *const ks_agent_out_names[OUT_COUNT] = {
    "ok", "malformed", "too-large", "denied", "unknown-scope", "overloaded",
    "deadline", "draining", "refused", "retryable", "configuration"};
/* The record operations' names. */
const char *const ks_agent_op_names[OP_COUNT] = {"seal", "open", "parse"};
_Static_assert(sizeof ks_agent_buckets / sizeof ks_agent_buckets[0] == NBUCKETS,
               "NBUCKETS counts the bounds");

/* ---- small helpers ---------------------------------------------------------------- */

/* Seconds on the monotonic clock. */
double ks_agent_mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* One log line to stderr, prefixed; never given a byte of a body. */
void ks_agent_logf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void ks_agent_logf(const char *fmt, ...)
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
live *ks_agent_live_get(agent *a)
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
void ks_agent_live_put(live *l)
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
        ks_agent_logf("out of memory");
        return NULL;
    }
    char msg[512] = "";
    if (need_policy) {
        ks_err e = ks_agent_policy_load(c->policy, &l->policy, msg, sizeof msg);
        if (e != KS_OK) {
            ks_agent_logf("the policy file %s was not loaded (%s): %s", c->policy, ks_err_name(e), msg);
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
        ks_agent_logf("the keys and rollout state were not opened (%s): %s", ks_err_name(e), msg);
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
        ks_agent_logf("reload failed: the previous configuration stays in use");
        return;
    }
    pthread_mutex_lock(&a->live_mu);
    live *old = a->cur;
    a->cur = n;
    pthread_mutex_unlock(&a->live_mu);
    ks_agent_live_put(old);
    atomic_fetch_add(&a->reloads_ok, 1);
    atomic_store(&a->config_ok, 1);
    atomic_store(&a->provider_ok, 1);
    ks_agent_logf("reloaded the keys, the registry and the policy");
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
    ks_agent_answer_error(r, status, name, cls, message, NULL, -1);
    return send_answer(conn, r);
}

/* Answer a GET with text of the given type, copied. */
enum MHD_Result ks_agent_reply_text(struct MHD_Connection *conn, unsigned status, const char *type,
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
            return ks_agent_serve_get(a, conn, url);
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
            if (strcmp(url, ks_agent_ep_paths[e]) == 0) {
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
        atomic_store(&a->last_start_ms, (uint64_t)(ks_agent_mono_s() * 1000.0));
        if (atomic_load(&a->draining)) {
            atomic_fetch_add(&a->requests[r->ep][OUT_DRAINING], 1);
            return reply_error(conn, r, 503, "draining", "retryable",
                               "The agent is shutting down; retry on its successor.");
        }
        if (!peer_cred(conn, &r->uid, &r->gid)) {
            ks_agent_logf("denied: a peer whose credentials cannot be read");
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
    r->t0 = ks_agent_mono_s();
    ks_agent_admit_and_serve(a, r);
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
    ks_agent_body_drop(r);
    resp_free(r->resp);
    free(r);
    *con_cls = NULL;
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
    const double until = ks_agent_mono_s() + (double)a->cfg->drain_ms / 1000.0;
    /* Done when nothing is in flight and no request began for 100 ms:
     * every answer given while draining closes its connection, so a
     * client that was mid-exchange has been told by then. */
    for (;;) {
        const double now = ks_agent_mono_s();
        if (now >= until || (atomic_load(&a->in_flight) == 0 &&
                             now - (double)atomic_load(&a->last_start_ms) / 1000.0 >= 0.1)) {
            break;
        }
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    long left = atomic_load(&a->in_flight);
    if (left > 0) {
        ks_agent_logf("%ld request(s) still in flight after the drain deadline", left);
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
        ks_agent_logf("out of memory");
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
    if (ks_agent_open_listeners(a) != 0) {
        rc = EX_UNAVAILABLE;
        goto out;
    }
    if (a->api_fd >= 0 && cfg->policy == NULL) {
        ks_agent_logf("a Unix listener needs --policy FILE: the agent denies every peer it does not name");
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
        ks_agent_logf("cannot start the HTTP server");
        rc = EX_OSERR;
        goto stop;
    }
    ks_agent_logf("serving %zu scope(s) with %u worker(s), queue %zu%s%s", cfg->n_scopes, cfg->workers,
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
    ks_agent_live_put(a->cur); /* deregisters */
    ks_agent_logf("stopped");
out:
    if (a->own_unix) {
        unlink(a->unix_path);
    }
    free(a->records);
    return rc;
}
