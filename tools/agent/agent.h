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

#include "policy.h"

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
    uint32_t interval_ms;          /* ks_app_options.interval_ms; 0: the library's default */

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
