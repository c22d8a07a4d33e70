/*
 * tools/agent/agent.h -- the local encryption agent behind `keyshift
 * serve` (docs/agent.md): an HTTP/1.1 server on a Unix socket that seals
 * and opens records through one ks_app (keyshift/app.h) for local
 * processes its policy names.
 */
#ifndef KS_TOOLS_AGENT_H
#define KS_TOOLS_AGENT_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <keyshift/keyshift.h>

#if defined(__has_include)
#if __has_include("policy.h")
#define KS_AGENT_HAVE_POLICY_H 1
#endif
#endif

#ifdef KS_AGENT_HAVE_POLICY_H
#include "policy.h"
#else
/* The agent policy's interface (tools/agent/policy.h, docs/agent-policy.md):
 * who may do what, matched on the peer's uid and gid. */
typedef enum { KS_AGENT_OP_SEAL = 1u, KS_AGENT_OP_OPEN = 2u, KS_AGENT_OP_PARSE = 4u } ks_agent_op;
typedef struct ks_agent_policy ks_agent_policy;
ks_err ks_agent_policy_load(const char *path, ks_agent_policy **out, char *errbuf, size_t errlen);
ks_err ks_agent_policy_parse(const uint8_t *buf, size_t len, ks_agent_policy **out, size_t *err_off,
                             char *errbuf, size_t errlen);
int ks_agent_policy_allows(const ks_agent_policy *p, uid_t uid, gid_t gid, const char *scope,
                           const uint8_t *tenant, size_t tenant_len, ks_agent_op op);
void ks_agent_policy_free(ks_agent_policy *p);
#endif

/* The most --listen and --scope options. */
#define KS_AGENT_LISTEN_MAX 4
#define KS_AGENT_SCOPES_MAX 64

/* How to run the agent: what `keyshift serve` parsed. */
typedef struct ks_agent_config {
    const char *listen[KS_AGENT_LISTEN_MAX]; /* "unix:PATH" or "tcp:127.0.0.1:PORT" */
    size_t n_listen;
    uint32_t socket_mode;          /* the Unix socket's mode bits, e.g. 0660 */
    int socket_gid;                /* its group, -1: the agent's */
    const char *policy;            /* the agent policy file; required with a Unix listener */
    const char *scopes[KS_AGENT_SCOPES_MAX]; /* "TABLE.COLUMN" served */
    size_t n_scopes;

    /* The keys and the rollout state: as ks_app_options (keyring or
     * providers, the passphrase kept for reloads), reopened on SIGHUP. */
    const char *keyring;
    const char *providers;
    ks_bytes passphrase;           /* the caller's, valid until ks_agent_run returns */
    const char *database;
    const char *instance_id;
    const char *default_key_id;
    uint64_t dek_max_messages;     /* seals per write-side DEK; 0: the library's default */
    long cache_entries;            /* read-side DEK cache entries; -1: the default */

    /* Limits [AG-LIM-1..6]. */
    size_t max_body;               /* bytes of a request body */
    size_t max_batch;              /* records of a batch */
    unsigned max_connections;
    unsigned workers;              /* worker threads */
    size_t queue;                  /* requests waiting for a worker */
    uint32_t deadline_ms;          /* a request's deadline from when it is queued */
    unsigned idle_timeout_s;       /* an idle or slow connection is closed after this */
    uint32_t drain_ms;             /* SIGTERM: how long in-flight requests may take */
} ks_agent_config;

/*
 * Run the agent until SIGTERM or SIGINT: open the app, the policy and the
 * listeners (or take systemd's, sd_listen_fds), serve, reload on SIGHUP,
 * drain and close on SIGTERM.  Returns a sysexits code after printing the
 * problem: EX_OK after a clean drain.
 */
int ks_agent_run(const ks_agent_config *cfg);

#endif /* KS_TOOLS_AGENT_H */
