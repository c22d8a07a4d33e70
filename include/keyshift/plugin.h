/*
 * keyshift/plugin.h -- the KMS plugin provider: a key provider whose KEKs
 * live in a helper process, `keyshift-kms-NAME`, that speaks the protocol
 * of docs/kms-plugin.md over its standard input and output.  The plugin
 * talks to the KMS (AWS KMS, Google Cloud KMS, Vault, ...); keyshift owns
 * the policy around it:
 *
 *   deadline      every request has one (timeout_ms; a start and its
 *                 hello at least KS_PLUGIN_START_MIN_MS, for interpreters
 *                 and SDKs that start slowly); a plugin that overruns it
 *                 is killed (SIGKILL) and the attempt is KS_ERR_TIMEOUT;
 *   retries       `unavailable`, `timeout`, `throttled`, a crash and a
 *                 killed plugin are retried, at most `retries` times and
 *                 within `retry_budget_ms` for the whole call, after a
 *                 jittered exponential backoff (`backoff_ms` doubling up
 *                 to `backoff_max_ms`, each sleep uniform in [d/2, d]),
 *                 never sooner than a `throttled` response's
 *                 retry_after_ms; nothing else is ever retried;
 *   concurrency   at most `concurrency` plugin processes, one call each
 *                 at a time (version 1 has no pipelining); a call waits
 *                 for a free one within its deadline;
 *   rate limit    a token bucket per provider: at most `rate_limit`
 *                 requests per second, spaced 1.05 / rate_limit s apart
 *                 (bucket depth 1), over all its processes, retries
 *                 included, hellos not;
 *   restarts      a process that died, was killed or answered a line the
 *                 protocol refuses is replaced on the next call, after a
 *                 backoff that doubles with each start that failed in a
 *                 row (from backoff_ms up to backoff_max_ms);
 *   stderr        read, kept bounded (the last KS_PLUGIN_STDERR_KEPT
 *                 bytes), reduced to printable ASCII and stripped of
 *                 anything that may be key material before it is shown
 *                 anywhere (ks_plugin_stats): every DEK the provider
 *                 sent to or received from its plugins, in raw, hex,
 *                 base64 and base64url, is cut out of the whole text
 *                 before the kept window is cut, and then any run of 16
 *                 or more characters of [A-Za-z0-9+/=_-] becomes
 *                 "[redacted]" ([KP-BRIDGE-9]);
 *   processes     each plugin runs in a process group of its own, and
 *                 a kill (a deadline, a refused line, a close) kills the
 *                 whole group: what a plugin started dies with it.
 *
 * docs/kms-plugin.md section 10 ([KP-BRIDGE-1..12]) is the specification.
 *
 * Errors of a call are those of include/keyshift/provider.h, mapped from
 * the plugin's error classes by docs/kms-plugin.md [KP-ERR-3].  A
 * response the protocol refuses is KS_ERR_INTEGRITY (never retried) and
 * retires that process [KP-ERR-6].  A plugin that cannot be started is
 * KS_ERR_UNAVAILABLE (retried), or, at open, the error of the start.
 *
 * Secrets.  A DEK crosses the pipe in a wrap request and an unwrap
 * response only; keyshift wipes every copy it makes ([KP-SEC-1..4]).  The
 * plugin gets an allow-listed environment ([KP-SEC-1]): of keyshift's
 * variables only PATH, HOME, LANG, LC_*, TZ and TMPDIR, and those that
 * `env` and `env_prefixes` name (AWS_ for keyshift-kms-aws), never one of
 * `env_secret` nor KEYSHIFT_PASSPHRASE; and no descriptor other than its
 * three standard ones.
 *
 * Processes.  The plugin is started with posix_spawn, so a
 * multi-threaded caller is safe.  keyshift never receives SIGPIPE from it
 * (the request channel is a socket written with MSG_NOSIGNAL).  The
 * provider belongs to the process that opened it: in a child after
 * fork() its calls fail with KS_ERR_UNAVAILABLE and never touch the
 * parent's plugin processes; open a new one in the child.
 *
 * Threads.  A plugin provider may be used from several threads at once.
 */
#ifndef KEYSHIFT_PLUGIN_H
#define KEYSHIFT_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#include <keyshift/common.h>
#include <keyshift/error.h>
#include <keyshift/provider.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Limits and defaults of a plugin provider (docs/providers.md, type plugin). */
#define KS_PLUGIN_ARGS_MAX 32             /* arguments after the program's name */
#define KS_PLUGIN_ARG_MAX 1024            /* bytes in one argument */
#define KS_PLUGIN_COMMAND_MAX 1024        /* bytes in the command */
#define KS_PLUGIN_TIMEOUT_DEFAULT 10000u  /* ms: one attempt */
#define KS_PLUGIN_TIMEOUT_MAX 600000u
#define KS_PLUGIN_START_MIN_MS 5000u      /* ms: a start and its hello, at least */
#define KS_PLUGIN_RETRIES_DEFAULT 3u
#define KS_PLUGIN_RETRIES_MAX 10u
#define KS_PLUGIN_BUDGET_DEFAULT 30000u   /* ms: one call, its retries and backoffs included */
#define KS_PLUGIN_BUDGET_MAX 3600000u
#define KS_PLUGIN_BACKOFF_DEFAULT 100u    /* ms: the first backoff */
#define KS_PLUGIN_BACKOFF_MAX_DEFAULT 5000u
#define KS_PLUGIN_RATE_DEFAULT 50u        /* requests per second */
#define KS_PLUGIN_RATE_MAX 100000u
#define KS_PLUGIN_CONCURRENCY_DEFAULT 4u
#define KS_PLUGIN_CONCURRENCY_MAX 64u
#define KS_PLUGIN_STDERR_KEPT 1024        /* bytes of a plugin's stderr kept */
#define KS_PLUGIN_ENV_MAX 32              /* names, and prefixes, passed on */
#define KS_PLUGIN_ENV_SECRET_MAX 128      /* names never passed on */
#define KS_PLUGIN_ENV_NAME_MAX 128        /* bytes in one name or prefix */

/* How to run a plugin and the policy around it.  Fill it with
 * ks_plugin_config_init(), then set command (and what else differs). */
typedef struct ks_plugin_config {
    /* An absolute path, or a NAME of [a-z0-9][a-z0-9-]* (1..63 bytes):
     * the program `keyshift-kms-NAME` found on PATH. Borrowed during
     * ks_plugin_open() only. */
    const char *command;
    /* argv[1..nargs] of the plugin (at most KS_PLUGIN_ARGS_MAX, each at
     * most KS_PLUGIN_ARG_MAX bytes); copied at open. */
    const char *const *args;
    size_t nargs;
    uint32_t timeout_ms;      /* one attempt's deadline, 1..KS_PLUGIN_TIMEOUT_MAX */
    uint32_t retries;         /* 0..KS_PLUGIN_RETRIES_MAX */
    uint32_t retry_budget_ms; /* 1..KS_PLUGIN_BUDGET_MAX: one call in all */
    uint32_t backoff_ms;      /* 1..backoff_max_ms */
    uint32_t backoff_max_ms;  /* backoff_ms..KS_PLUGIN_BUDGET_MAX */
    uint32_t rate_limit;      /* requests/s, 1..KS_PLUGIN_RATE_MAX; 0: no limit */
    uint32_t concurrency;     /* processes, 1..KS_PLUGIN_CONCURRENCY_MAX */
    /* The variables of keyshift's environment the plugin receives besides
     * PATH, HOME, LANG, LC_*, TZ and TMPDIR [KP-SEC-1]: env[0..nenv) by
     * name, env_prefixes[0..nenv_prefixes) every variable whose name
     * begins with one (at most KS_PLUGIN_ENV_MAX each; each name 1 to
     * KS_PLUGIN_ENV_NAME_MAX bytes of [A-Za-z_][A-Za-z0-9_]*).  Copied at
     * open; the values are read from the environment at each start. */
    const char *const *env;
    size_t nenv;
    const char *const *env_prefixes;
    size_t nenv_prefixes;
    /* Variables never passed, even when named above: the secrets keyshift
     * reads itself (a registry's pin-env and passphrase-env); at most
     * KS_PLUGIN_ENV_SECRET_MAX.  KEYSHIFT_PASSPHRASE is never passed. */
    const char *const *env_secret;
    size_t nenv_secret;
} ks_plugin_config;

/* The defaults: command NULL, no args, every number its _DEFAULT. */
KS_API void ks_plugin_config_init(ks_plugin_config *cfg);

/* What a failed ks_plugin_open() found.  Text is printable ASCII, never
 * key material. */
typedef struct ks_plugin_error {
    ks_err code;
    const char *stage;        /* "config", "start" or "hello"; static storage */
    const char *reason;       /* a refused hello: the [KP-RESP] reason ("bad-json"...), else NULL */
    const char *field;        /* the member the refusal concerns, or NULL */
    char program[KS_PLUGIN_COMMAND_MAX + 16]; /* what was run: the path, or keyshift-kms-NAME */
    char message[257];        /* the plugin's own error message, if it gave one */
    char stderr_tail[KS_PLUGIN_STDERR_KEPT + 1]; /* what it wrote to stderr, redacted */
} ks_plugin_error;

/*
 * Open a plugin provider (name "plugin"): check cfg, start one plugin
 * process and say hello to it ([KP-HELLO-1..4]), so that a wrong command
 * or a plugin that does not speak the protocol fails here and not at the
 * first wrap.  Errors: KS_ERR_INVALID_ARGUMENT (cfg outside its limits),
 * KS_ERR_NOT_FOUND (no such program), KS_ERR_UNAVAILABLE (it would not
 * start, or died, or did not answer within timeout_ms),
 * KS_ERR_INTEGRITY (its hello answer was refused), the error class of
 * an error answer, KS_ERR_NO_MEMORY.  err may be NULL.
 */
KS_API KS_WUR ks_err ks_plugin_open(const ks_plugin_config *cfg, ks_provider *out, ks_plugin_error *err);

/* Counters of a plugin provider since it opened, and its last failure. */
typedef struct ks_plugin_stats {
    uint64_t calls;           /* wrap, unwrap and key_info calls */
    uint64_t requests;        /* request lines written (retries and hellos included) */
    uint64_t retries;         /* attempts after the first of a call */
    uint64_t starts;          /* processes started, the first included */
    uint64_t kills;           /* processes killed: deadline, refused line, close */
    uint64_t timeouts;        /* attempts that overran their deadline */
    uint64_t refusals;        /* response lines refused [KP-ERR-6] */
    uint64_t throttled;       /* `throttled` answers */
    uint64_t rate_waits;      /* requests delayed by the rate limit */
    uint64_t rate_wait_ms;    /* and the milliseconds they waited in all */
    char plugin[129];         /* the hello's "plugin" string */
    char last_error[257];     /* the last failed attempt, in words, or "" */
    char stderr_tail[KS_PLUGIN_STDERR_KEPT + 1]; /* redacted (see above) */
} ks_plugin_stats;

/* The counters of p, which must be a plugin provider (else
 * KS_ERR_INVALID_ARGUMENT). */
KS_API KS_WUR ks_err ks_plugin_stats_get(const ks_provider *p, ks_plugin_stats *out);

#ifdef __cplusplus
}
#endif
#endif /* KEYSHIFT_PLUGIN_H */
