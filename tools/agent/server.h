/*
 * tools/agent/server.h -- what the units of the agent's server share:
 * its constants, the agent, its live configuration and a request
 * (tools/agent/server.c: the live configuration, the HTTP handlers and
 * running), serving a request (server_serve.c), /metrics and the health
 * endpoints (server_metrics.c), and the listening sockets
 * (server_listen.c).  Internal to the agent.
 */
#ifndef KS_TOOLS_AGENT_SERVER_H
#define KS_TOOLS_AGENT_SERVER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/un.h>

#include <microhttpd.h>

#include "agent.h"
#include "request.h"
#include "respond.h"

/* The latency histogram's upper bounds, in seconds [AG-MET-3]. */
#define NBUCKETS 13
extern const double ks_agent_buckets[NBUCKETS];

/* Endpoints, for routing and the request counters. */
enum { EP_SEAL, EP_OPEN, EP_SEAL_BATCH, EP_OPEN_BATCH, EP_PARSE, EP_OTHER, EP_COUNT };
extern const char *const ks_agent_ep_names[EP_COUNT];
extern const char *const ks_agent_ep_paths[EP_PARSE + 1];

/* A request's outcome [AG-MET-1]. */
enum {
    OUT_OK, OUT_MALFORMED, OUT_TOO_LARGE, OUT_DENIED, OUT_UNKNOWN_SCOPE, OUT_OVERLOADED,
    OUT_DEADLINE, OUT_DRAINING, OUT_REFUSED, OUT_RETRYABLE, OUT_CONFIGURATION, OUT_COUNT
};
extern const char *const ks_agent_out_names[OUT_COUNT];

/* Record operations, for the per-scope counters. */
enum { OP_SEAL, OP_OPEN, OP_PARSE, OP_COUNT };
extern const char *const ks_agent_op_names[OP_COUNT];

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
    _Atomic uint64_t last_start_ms; /* ks_agent_mono_s() * 1000 when the last request began */

    /* Counters, cumulative [AG-MET-1..5]. */
    _Atomic uint64_t requests[EP_COUNT][OUT_COUNT];
    _Atomic uint64_t *records; /* [OP_COUNT][n_scopes + 1][4 classes] */
    _Atomic uint64_t hist[EP_COUNT][NBUCKETS + 1];
    _Atomic uint64_t hist_sum_us[EP_COUNT];
    _Atomic uint64_t reloads_ok, reloads_failed;
    atomic_int config_ok;
} agent;

/* ---- the agent (tools/agent/server.c) */

/* Seconds on the monotonic clock. */
double ks_agent_mono_s(void);

/* One log line to stderr, prefixed; never given a byte of a body
 * [AG-SEC-1]. */
void ks_agent_logf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Take a reference to the current configuration (drop it with
 * ks_agent_live_put). */
live *ks_agent_live_get(agent *a);

/* Drop a reference; the last one destroys. */
void ks_agent_live_put(live *l);

/* Answer a GET with text of the given type, copied. */
enum MHD_Result ks_agent_reply_text(struct MHD_Connection *conn, unsigned status, const char *type,
                                    const char *text, size_t len);

/* ---- serving (tools/agent/server_serve.c) */

/* The per-scope counter of (op, scope index, class). */
_Atomic uint64_t *ks_agent_record_counter(agent *a, int op, size_t scope, ks_error_class cls);

/* Wipe and free r's body: every byte it holds is in [0, len), since a
 * growing body is copied by its length [AG-SEC-2]. */
void ks_agent_body_drop(req *r);

/* Write a request-level error body [AG-ERR-1] into a fresh buffer,
 * without an offset. */
void ks_agent_answer_error(req *r, unsigned status, const char *name, const char *cls,
                           const char *message, const char *member, long index);

/* Serve r in its connection's thread once admitted, or answer why not;
 * counts its latency [AG-MET-3]. */
void ks_agent_admit_and_serve(agent *a, req *r);

/* ---- metrics and health (tools/agent/server_metrics.c) */

/* Answer GET /healthz, /readyz and /metrics [AG-HEALTH-1..2], [AG-MET-1]. */
enum MHD_Result ks_agent_serve_get(agent *a, struct MHD_Connection *conn, const char *url);

/* ---- listeners (tools/agent/server_listen.c) */

/* The listeners: systemd's (sd_listen_fds) when it passed any, else the
 * --listen options.  Returns 0, or -1 after logging. */
int ks_agent_open_listeners(agent *a);

#endif /* KS_TOOLS_AGENT_SERVER_H */
