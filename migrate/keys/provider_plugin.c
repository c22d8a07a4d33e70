/*
 * migrate/keys/provider_plugin.c -- the KMS plugin provider
 * (include/keyshift/plugin.h): a pool of plugin processes
 * (plugin_proc.c) and the policy around them, docs/kms-plugin.md
 * section 10 ([KP-BRIDGE-1..]): deadlines, retries with jittered
 * backoff, the concurrency cap, the token bucket, restarts with backoff,
 * the bounded and redacted stderr.
 *
 * Locking.  One mutex guards the pool's slots (busy flags, restart
 * backoff), the rate limiter, the counters and the kept stderr.  A call
 * takes a slot under it and then owns that slot's process alone, so all
 * pipe I/O happens without the lock; the condition variable wakes a call
 * waiting for a slot.  No lock is held while sleeping or doing I/O.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <sodium.h>

#include <keyshift/plugin.h>

#include "../crypto/mono_clock.h"
#include "plugin_proc.h"
#include "plugin_proto.h"
#include "../alloc_hook.h"

#define MS 1000000ull /* nanoseconds */

/* The longest request line: a wrap or unwrap with the largest AAD and
 * blob (base64 of 4096 and 1024 bytes), the largest key_id, and the
 * members' names and numbers. */
#define REQUEST_MAX 8192u

/* How long a closing provider waits for a plugin to exit on its own. */
#define STOP_GRACE_MS 200u

/* The name prefix of a plugin found on PATH [KP-PROC-1]. */
#define PLUGIN_PREFIX "keyshift-kms-"

extern char **environ;

/* One process of the pool. */
typedef struct slot {
    ks_pproc proc;
    int busy;             /* a call owns it */
    uint32_t deaths;      /* deaths since its last good reply */
    uint64_t not_before;  /* ks_mono_ns before which it is not restarted */
    ks_pstderr fresh;     /* stderr read during the current call */
    ks_pdeks deks;        /* the DEKs its process saw, cut out of its stderr */
} slot;

/* A plugin provider. */
typedef struct ks_plugin {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pid_t owner;             /* the process that opened it */
    char **argv;             /* the program, its arguments, NULL */
    char **env;              /* the names a plugin receives, NULL-terminated [KP-SEC-1] */
    char **env_prefixes;     /* and the prefixes */
    char **env_secret;       /* the names it never receives */
    ks_plugin_config cfg;    /* command and args cleared: argv holds them */
    uint64_t interval_ns;    /* between two requests; 0: no rate limit */
    uint64_t next_send;      /* ks_mono_ns of the next request allowed */
    size_t nslots;
    slot *slots;
    ks_pstderr err;          /* the provider's kept stderr */
    ks_plugin_stats st;      /* counters and texts; stderr_tail made on demand */
    ks_kp_error why;         /* the last refusal's reason and member */
} ks_plugin;

/* ---- text ------------------------------------------------------------------- */

/* Redact text for showing (ks_pstderr_show's rule) into out[0, cap). */
static void redact(const char *text, char *out, size_t cap)
{
    ks_pstderr tmp;
    tmp.len = 0;
    ks_pstderr_add(&tmp, text, strnlen(text, KS_PSTDERR_CAP), NULL);
    ks_pstderr_show(&tmp, out, cap);
    sodium_memzero(&tmp, sizeof tmp);
}

/* Set the provider's last error, under pl->mu.  Only static words, class
 * and reason names and a redacted plugin message reach it. */
static void last_error(ks_plugin *pl, const char *what, const char *detail)
{
    char safe[sizeof pl->st.last_error];
    redact(detail != NULL ? detail : "", safe, sizeof safe);
    /* Cut short when long: the text is for people, its head is enough. */
    char *const d = pl->st.last_error;
    const size_t cap = sizeof pl->st.last_error;
    size_t n = strnlen(what, cap - 1);
    memcpy(d, what, n);
    if (safe[0] != '\0' && n + 2 < cap) {
        memcpy(d + n, ": ", 2);
        n += 2;
        const size_t m = strnlen(safe, cap - 1 - n);
        memcpy(d + n, safe, m);
        n += m;
    }
    d[n] = '\0';
}

/* ---- time ------------------------------------------------------------------- */

/* Sleep until ks_mono_ns() reaches t. */
static void sleep_until(uint64_t t)
{
    const struct timespec ts = {(time_t)(t / 1000000000ull), (long)(t % 1000000000ull)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
    }
}

/* The backoff after the n-th failure in a row (n from 0), in ns: d =
 * backoff_ms * 2^n capped at backoff_max_ms, drawn uniformly from
 * [d/2, d] ("equal jitter") [KP-BRIDGE-3]. */
static uint64_t backoff_ns(const ks_plugin_config *c, uint32_t n)
{
    uint64_t d = c->backoff_ms;
    for (uint32_t i = 0; i < n && d < c->backoff_max_ms; i++) {
        d *= 2;
    }
    if (d > c->backoff_max_ms) {
        d = c->backoff_max_ms;
    }
    const uint64_t half = d * MS / 2;
    return half + randombytes_uniform((uint32_t)(half > UINT32_MAX - 1 ? UINT32_MAX - 1 : half) + 1);
}

/* ---- the pool ----------------------------------------------------------------- */

/* Take a free slot for the caller before deadline (ns), preferring one
 * whose process is running.  KS_OK or KS_ERR_TIMEOUT [KP-BRIDGE-5]. */
static ks_err slot_take(ks_plugin *pl, uint64_t deadline, slot **out)
{
    const struct timespec abs = {(time_t)(deadline / 1000000000ull), (long)(deadline % 1000000000ull)};
    pthread_mutex_lock(&pl->mu);
    for (;;) {
        slot *idle = NULL;
        for (size_t i = 0; i < pl->nslots; i++) {
            slot *s = &pl->slots[i];
            if (!s->busy && (idle == NULL || (idle->proc.pid == 0 && s->proc.pid != 0))) {
                idle = s;
            }
        }
        if (idle != NULL) {
            idle->busy = 1;
            pthread_mutex_unlock(&pl->mu);
            *out = idle;
            return KS_OK;
        }
        if (pthread_cond_timedwait(&pl->cv, &pl->mu, &abs) == ETIMEDOUT) {
            last_error(pl, "timeout", "every plugin process stayed busy");
            pthread_mutex_unlock(&pl->mu);
            return KS_ERR_TIMEOUT;
        }
    }
}

/* Give s back, keeping the stderr it read with its process's DEKs cut
 * out, also where one spans the provider's kept text and the new
 * [KP-BRIDGE-9]; the DEKs of a process that ended are wiped. */
static void slot_give(ks_plugin *pl, slot *s)
{
    pthread_mutex_lock(&pl->mu);
    ks_pstderr_add(&pl->err, s->fresh.buf, s->fresh.len, &s->deks);
    sodium_memzero(&s->fresh, sizeof s->fresh);
    if (s->proc.pid == 0) {
        sodium_memzero(&s->deks, sizeof s->deks);
    }
    s->busy = 0;
    pthread_cond_signal(&pl->cv);
    pthread_mutex_unlock(&pl->mu);
}

/* End s's process after a failure and schedule its restart [KP-BRIDGE-6]. */
static void slot_bury(ks_plugin *pl, slot *s)
{
    ks_pproc_kill(&s->proc);
    pthread_mutex_lock(&pl->mu);
    pl->st.kills++;
    s->not_before = ks_mono_ns() + backoff_ns(&pl->cfg, s->deaths);
    s->deaths++;
    pthread_mutex_unlock(&pl->mu);
}

/* Wait for the rate limiter's next free request before deadline
 * [KP-BRIDGE-7]: requests are spaced by interval_ns, over every process.
 * KS_OK, or KS_ERR_TIMEOUT when the turn would come after the deadline
 * (nothing is then reserved). */
static ks_err rate_wait(ks_plugin *pl, uint64_t deadline)
{
    if (pl->interval_ns == 0) {
        return KS_OK;
    }
    pthread_mutex_lock(&pl->mu);
    const uint64_t now = ks_mono_ns();
    const uint64_t t = pl->next_send > now ? pl->next_send : now;
    if (t > deadline) {
        last_error(pl, "timeout", "the rate limit leaves no turn before the deadline");
        pthread_mutex_unlock(&pl->mu);
        return KS_ERR_TIMEOUT;
    }
    pl->next_send = t + pl->interval_ns;
    if (t > now) {
        pl->st.rate_waits++;
        pl->st.rate_wait_ms += (t - now) / MS;
    }
    pthread_mutex_unlock(&pl->mu);
    if (t > now) {
        sleep_until(t);
    }
    return KS_OK;
}

/* ---- one exchange --------------------------------------------------------------- */

/* Note a refused or unparseable reply in the counters, under no lock. */
static void note_refusal(ks_plugin *pl, const ks_kp_error *why)
{
    char detail[96];
    snprintf(detail, sizeof detail, "%s%s%s", ks_kp_reason_name(why->reason) ? ks_kp_reason_name(why->reason) : "?",
             why->field != NULL ? " " : "", why->field != NULL ? why->field : "");
    pthread_mutex_lock(&pl->mu);
    pl->st.refusals++;
    pl->why = *why;
    last_error(pl, "response refused", detail);
    pthread_mutex_unlock(&pl->mu);
}

/*
 * Send req (its id set here) on s's running process and read the answer
 * into resp before deadline [KP-BRIDGE-2], [KP-BRIDGE-4]: KS_OK with the
 * plugin's answer in resp (resp->status says whether it was an error
 * class), or KS_ERR_TIMEOUT, KS_ERR_UNAVAILABLE (the process died), or
 * KS_ERR_INTEGRITY (the line was refused [KP-ERR-6]), after which the
 * process has been killed.  The request's bytes are wiped [KP-SEC-2].
 */
static ks_err exchange(ks_plugin *pl, slot *s, ks_kp_request *req, ks_kp_response *resp, uint64_t deadline)
{
    uint8_t buf[REQUEST_MAX];
    size_t len = 0, line_len = 0;
    int extra = 0;
    req->id = s->proc.next_id;
    if (req->op == KS_KP_WRAP) {
        ks_pdeks_note(&s->deks, req->dek); /* [KP-BRIDGE-9] */
    }
    ks_err rc = ks_kp_encode_request(req, buf, sizeof buf, &len);
    if (rc != KS_OK) {
        return rc == KS_ERR_BUFFER_TOO_SMALL ? KS_ERR_INVALID_ARGUMENT : rc;
    }
    pthread_mutex_lock(&pl->mu);
    pl->st.requests++;
    pthread_mutex_unlock(&pl->mu);
    rc = ks_pproc_call(&s->proc, buf, len, deadline, &s->fresh, &line_len, &extra);
    sodium_memzero(buf, len);
    if (rc != KS_OK) {
        pthread_mutex_lock(&pl->mu);
        if (rc == KS_ERR_TIMEOUT) {
            pl->st.timeouts++;
            last_error(pl, "timeout", "the plugin did not answer before the deadline; it was killed");
        } else {
            last_error(pl, "unavailable", "the plugin exited or closed its output");
        }
        pthread_mutex_unlock(&pl->mu);
        slot_bury(pl, s);
        return rc;
    }
    const ks_kp_request_ctx ctx = {req->op, req->id, req->key_version};
    ks_kp_error why = {KS_KP_R_NONE, NULL};
    rc = ks_kp_parse_response(s->proc.line, line_len, &ctx, resp, &why);
    ks_pproc_consume(&s->proc);
    if (rc == KS_OK && resp->ok && req->op == KS_KP_UNWRAP) {
        ks_pdeks_note(&s->deks, resp->dek); /* [KP-BRIDGE-9]: and what it wrote before */
        ks_pstderr_mask(&s->fresh, &s->deks);
    }
    if (rc == KS_ERR_INTEGRITY) {
        note_refusal(pl, &why);
        slot_bury(pl, s);
        return rc;
    }
    if (rc != KS_OK) {
        return rc;
    }
    if (extra) {
        /* [KP-PROC-2]: more than one line.  The first answered this request
         * and stands; the process is out of step and is replaced. */
        pthread_mutex_lock(&pl->mu);
        pl->st.refusals++;
        last_error(pl, "response refused", "more than one line for one request");
        pthread_mutex_unlock(&pl->mu);
        slot_bury(pl, s);
    }
    pthread_mutex_lock(&pl->mu);
    if (!extra) {
        s->deaths = 0;
    }
    if (resp->error_class == KS_KP_THROTTLED) {
        pl->st.throttled++;
    }
    if (!resp->ok) {
        last_error(pl, ks_kp_class_name((int)resp->error_class), resp->message);
    }
    pthread_mutex_unlock(&pl->mu);
    return KS_OK;
}

/* The time a plugin process has to start and answer its hello
 * [KP-BRIDGE-1]: timeout_ms, but at least KS_PLUGIN_START_MIN_MS, in ns. */
static uint64_t start_ns(const ks_plugin_config *c)
{
    return (uint64_t)(c->timeout_ms > KS_PLUGIN_START_MIN_MS ? c->timeout_ms : KS_PLUGIN_START_MIN_MS) * MS;
}

/* The deadline of one step of an attempt that begins now: `len` ns from
 * now, but never past the call's end. */
static uint64_t step_deadline(uint64_t len, uint64_t end)
{
    const uint64_t d = ks_mono_ns() + len;
    return d < end ? d : end;
}

/* Whether name[0, n) is one of list's (NULL-terminated) names, or, with
 * prefix, begins with one of them. */
static int env_listed(char *const *list, const char *name, size_t n, int prefix)
{
    for (; list != NULL && *list != NULL; list++) {
        const size_t m = strlen(*list);
        if ((prefix ? m <= n : m == n) && memcmp(*list, name, m) == 0) {
            return 1;
        }
    }
    return 0;
}

/* Whether the variable name[0, n) of keyshift's environment goes to a
 * plugin [KP-SEC-1]: one of the few every program needs, or one the
 * configuration names; never a secret keyshift reads itself. */
static int env_passed(const ks_plugin *pl, const char *name, size_t n)
{
    static char *const always[] = {"PATH", "HOME", "LANG", "TZ", "TMPDIR", NULL};
    static char *const always_prefix[] = {"LC_", NULL};
    static char *const never[] = {"KEYSHIFT_PASSPHRASE", NULL};
    if (env_listed(never, name, n, 0) || env_listed(pl->env_secret, name, n, 0)) {
        return 0;
    }
    return env_listed(always, name, n, 0) || env_listed(always_prefix, name, n, 1) ||
           env_listed(pl->env, name, n, 0) || env_listed(pl->env_prefixes, name, n, 1);
}

/* The environment of a plugin about to start [KP-SEC-1]: a malloc'd,
 * NULL-terminated array of pointers into environ (no copy of a value
 * is made), holding the variables env_passed() lets through. */
static ks_err plugin_env(const ks_plugin *pl, char ***out)
{
    size_t n = 0;
    while (environ != NULL && environ[n] != NULL) {
        n++;
    }
    char **envp = calloc(n + 1, sizeof *envp);
    if (envp == NULL) {
        return KS_ERR_NO_MEMORY;
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        const char *eq = strchr(environ[i], '=');
        if (eq != NULL && env_passed(pl, environ[i], (size_t)(eq - environ[i]))) {
            envp[k++] = environ[i];
        }
    }
    *out = envp;
    return KS_OK;
}

/* Start s's process and greet it ([KP-HELLO-1..4]), honouring its restart
 * backoff, all before the call's end; the hello has a deadline of its own
 * (start_ns).  The hello's answer goes to *resp, and *stage becomes
 * "hello" once the process runs (for ks_plugin_open's error).  KS_OK, or
 * the failure (s's process then killed and its next start pushed back). */
static ks_err slot_start(ks_plugin *pl, slot *s, uint64_t end, ks_kp_response *resp, const char **stage)
{
    pthread_mutex_lock(&pl->mu);
    const uint64_t nb = s->not_before;
    pthread_mutex_unlock(&pl->mu);
    if (nb > ks_mono_ns()) {
        if (nb > end) {
            pthread_mutex_lock(&pl->mu);
            last_error(pl, "unavailable", "the plugin is waiting to be restarted");
            pthread_mutex_unlock(&pl->mu);
            return KS_ERR_UNAVAILABLE;
        }
        sleep_until(nb);
    }
    char **envp = NULL;
    ks_err rc = plugin_env(pl, &envp);
    if (rc == KS_OK) {
        rc = ks_pproc_start(&s->proc, pl->argv, envp);
        free(envp);
    }
    pthread_mutex_lock(&pl->mu);
    if (rc == KS_OK) {
        pl->st.starts++;
    } else {
        last_error(pl, rc == KS_ERR_NOT_FOUND ? "not-found" : "unavailable", "the plugin could not be started");
    }
    pthread_mutex_unlock(&pl->mu);
    if (rc != KS_OK) {
        slot_bury(pl, s);
        return rc;
    }
    *stage = "hello";
    ks_kp_request req = {.op = KS_KP_HELLO};
    memset(resp, 0, sizeof *resp);
    rc = exchange(pl, s, &req, resp, step_deadline(start_ns(&pl->cfg), end));
    if (rc == KS_OK && !resp->ok) {
        rc = resp->status;
        slot_bury(pl, s);
    }
    if (rc == KS_OK) {
        pthread_mutex_lock(&pl->mu);
        memcpy(pl->st.plugin, resp->plugin, sizeof pl->st.plugin);
        pthread_mutex_unlock(&pl->mu);
    }
    return rc;
}

/*
 * One attempt of a call [KP-BRIDGE-2]: a slot, a running and greeted
 * process, a turn of the rate limiter, the exchange.  Each step that may
 * wait on the plugin (the start and its hello, the exchange) has its own
 * deadline of timeout_ms, and none ends past the call's end.  A process
 * that wrote something while idle, or ended, is replaced first
 * [KP-PROC-2].
 */
static ks_err attempt(ks_plugin *pl, ks_kp_request *req, ks_kp_response *resp, uint64_t end)
{
    slot *s = NULL;
    ks_err rc = slot_take(pl, end, &s);
    if (rc != KS_OK) {
        return rc;
    }
    if (s->proc.pid != 0 && ks_pproc_idle_broken(&s->proc, &s->fresh)) {
        pthread_mutex_lock(&pl->mu);
        pl->st.refusals++;
        last_error(pl, "response refused", "the plugin wrote or exited between requests");
        pthread_mutex_unlock(&pl->mu);
        slot_bury(pl, s);
    }
    if (s->proc.pid == 0) {
        ks_kp_response hello;
        const char *stage = "start";
        rc = slot_start(pl, s, end, &hello, &stage);
        if (rc == KS_ERR_NOT_FOUND) {
            rc = KS_ERR_UNAVAILABLE; /* the program is gone: the provider is unavailable */
        }
    }
    if (rc == KS_OK) {
        rc = rate_wait(pl, end);
    }
    if (rc == KS_OK) {
        rc = exchange(pl, s, req, resp, step_deadline((uint64_t)pl->cfg.timeout_ms * MS, end));
    }
    slot_give(pl, s);
    return rc;
}

/* Whether a failure may be retried [KP-BRIDGE-3]: unavailable (a crash,
 * an exit, a throttled answer included) and timeout only. */
static int retryable(ks_err e)
{
    return e == KS_ERR_UNAVAILABLE || e == KS_ERR_TIMEOUT;
}

/*
 * A whole call [KP-BRIDGE-1..3]: attempts until one succeeds, fails for
 * good, the retries are spent, or the next backoff would end past the
 * call's deadline (timeout_ms, or retry_budget_ms when 0).  Returns the
 * call's ks_err; resp holds the last answer.
 */
static ks_err call(ks_plugin *pl, ks_kp_request *req, ks_kp_response *resp, uint32_t timeout_ms)
{
    if (getpid() != pl->owner) {
        return KS_ERR_UNAVAILABLE; /* a child after fork(): include/keyshift/plugin.h */
    }
    const uint64_t start = ks_mono_ns();
    const uint64_t end = start + (uint64_t)(timeout_ms != 0 ? timeout_ms : pl->cfg.retry_budget_ms) * MS;
    pthread_mutex_lock(&pl->mu);
    pl->st.calls++;
    pthread_mutex_unlock(&pl->mu);
    for (uint32_t n = 0;; n++) {
        ks_err rc = attempt(pl, req, resp, end);
        if (rc == KS_OK) {
            rc = resp->status;
        }
        if (rc == KS_OK || !retryable(rc) || n >= pl->cfg.retries) {
            return rc;
        }
        uint64_t wait = backoff_ns(&pl->cfg, n);
        if (resp->has_retry_after && (uint64_t)resp->retry_after_ms * MS > wait) {
            wait = (uint64_t)resp->retry_after_ms * MS;
        }
        if (ks_mono_ns() + wait >= end) {
            return rc;
        }
        sleep_until(ks_mono_ns() + wait);
        pthread_mutex_lock(&pl->mu);
        pl->st.retries++;
        pthread_mutex_unlock(&pl->mu);
    }
}

/* ---- the provider's operations ------------------------------------------------- */

/* See provider.h: wrap through the plugin [KP-WRAP-1..2]. */
static ks_err plugin_wrap(void *self, ks_bytes key_id, uint32_t key_version, const uint8_t *dek, size_t dek_len,
                          ks_bytes aad, uint8_t *out, size_t cap, size_t *out_len, uint32_t timeout_ms)
{
    if (out_len != NULL) {
        *out_len = 0;
    }
    if (self == NULL || dek == NULL || dek_len != KS_DEK_LEN || out == NULL || out_len == NULL) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    uint8_t wrapped[KS_KP_WRAPPED_MAX];
    ks_kp_request req = {.op = KS_KP_WRAP, .key_id = key_id, .key_version = key_version, .dek = dek,
                         .dek_len = dek_len, .aad = aad};
    ks_kp_response resp;
    memset(&resp, 0, sizeof resp);
    resp.wrapped = wrapped;
    resp.wrapped_cap = sizeof wrapped;
    ks_err rc = call(self, &req, &resp, timeout_ms);
    if (rc == KS_OK) {
        if (resp.wrapped_len > cap) {
            rc = KS_ERR_BUFFER_TOO_SMALL;
        } else {
            memcpy(out, wrapped, resp.wrapped_len);
            *out_len = resp.wrapped_len;
        }
    }
    return rc;
}

/* See provider.h: unwrap through the plugin [KP-UNWRAP-1..3].  The DEK is
 * decoded straight into the caller's buffer, zeroed on any failure. */
static ks_err plugin_unwrap(void *self, ks_bytes key_id, uint32_t key_version, ks_bytes wrapped, ks_bytes aad,
                            uint8_t *dek, size_t dek_len, uint32_t timeout_ms)
{
    if (dek == NULL || dek_len != KS_DEK_LEN) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    sodium_memzero(dek, dek_len);
    if (self == NULL) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    ks_kp_request req = {.op = KS_KP_UNWRAP, .key_id = key_id, .key_version = key_version, .wrapped = wrapped,
                         .aad = aad};
    ks_kp_response resp;
    memset(&resp, 0, sizeof resp);
    resp.dek = dek;
    const ks_err rc = call(self, &req, &resp, timeout_ms);
    if (rc != KS_OK) {
        sodium_memzero(dek, dek_len);
    }
    return rc;
}

/* See provider.h: describe a key version [KP-INFO-1..3]. */
static ks_err plugin_key_info(void *self, ks_bytes key_id, uint32_t key_version, ks_key_info *out,
                              uint32_t timeout_ms)
{
    if (self == NULL || out == NULL) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    memset(out, 0, sizeof *out);
    ks_kp_request req = {.op = KS_KP_KEY_INFO, .key_id = key_id, .key_version = key_version};
    ks_kp_response resp;
    memset(&resp, 0, sizeof resp);
    const ks_err rc = call(self, &req, &resp, timeout_ms);
    if (rc == KS_OK) {
        *out = resp.info;
    }
    return rc;
}

/* Free a NULL-terminated list of malloc'd strings (NULL: nothing). */
static void free_list(char **list)
{
    if (list != NULL) {
        for (char **a = list; *a != NULL; a++) {
            free(*a);
        }
        free(list);
    }
}

/* Free pl and everything it owns; its processes must be ended. */
static void plugin_free(ks_plugin *pl)
{
    if (pl->slots != NULL) {
        for (size_t i = 0; i < pl->nslots; i++) {
            ks_pproc_free(&pl->slots[i].proc);
        }
        sodium_memzero(pl->slots, pl->nslots * sizeof *pl->slots);
        free(pl->slots);
    }
    free_list(pl->argv);
    free_list(pl->env);
    free_list(pl->env_prefixes);
    free_list(pl->env_secret);
    pthread_cond_destroy(&pl->cv);
    pthread_mutex_destroy(&pl->mu);
    sodium_memzero(pl, sizeof *pl);
    free(pl);
}

/* See provider.h: end every plugin process (closing its input first, so a
 * well-behaved plugin exits on its own), then free.  In a child after
 * fork() the processes are the parent's and are left alone. */
static void plugin_destroy(void *self)
{
    ks_plugin *pl = self;
    if (pl == NULL) {
        return;
    }
    const int mine = getpid() == pl->owner;
    for (size_t i = 0; i < pl->nslots; i++) {
        if (!mine) {
            ks_pproc_abandon(&pl->slots[i].proc);
        } else if (pl->slots[i].proc.pid != 0) {
            ks_pproc_stop(&pl->slots[i].proc, STOP_GRACE_MS, NULL);
        }
    }
    plugin_free(pl);
}

static const ks_provider_ops plugin_ops = {
    plugin_wrap, plugin_unwrap, plugin_key_info, plugin_destroy, NULL,
};

/* ---- open ------------------------------------------------------------------------ */

/* See plugin.h. */
void ks_plugin_config_init(ks_plugin_config *cfg)
{
    if (cfg == NULL) {
        return;
    }
    memset(cfg, 0, sizeof *cfg);
    cfg->timeout_ms = KS_PLUGIN_TIMEOUT_DEFAULT;
    cfg->retries = KS_PLUGIN_RETRIES_DEFAULT;
    cfg->retry_budget_ms = KS_PLUGIN_BUDGET_DEFAULT;
    cfg->backoff_ms = KS_PLUGIN_BACKOFF_DEFAULT;
    cfg->backoff_max_ms = KS_PLUGIN_BACKOFF_MAX_DEFAULT;
    cfg->rate_limit = KS_PLUGIN_RATE_DEFAULT;
    cfg->concurrency = KS_PLUGIN_CONCURRENCY_DEFAULT;
}

/* Whether name is a plugin NAME: [a-z0-9][a-z0-9-]*, 1..63 bytes [KP-PROC-1]. */
static int plugin_name_ok(const char *name)
{
    const size_t n = strnlen(name, 64);
    if (n == 0 || n > 63 || name[0] == '-') {
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        const char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-')) {
            return 0;
        }
    }
    return 1;
}

/* Whether list[0, n) holds at most max names of variables (or their
 * prefixes): 1 to KS_PLUGIN_ENV_NAME_MAX bytes of [A-Za-z_][A-Za-z0-9_]*. */
static int env_names_ok(const char *const *list, size_t n, size_t max)
{
    if (n > max || (n > 0 && list == NULL)) {
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        const char *v = list[i];
        const size_t len = v != NULL ? strnlen(v, KS_PLUGIN_ENV_NAME_MAX + 1) : 0;
        if (len == 0 || len > KS_PLUGIN_ENV_NAME_MAX || (v[0] >= '0' && v[0] <= '9')) {
            return 0;
        }
        for (size_t j = 0; j < len; j++) {
            const char c = v[j];
            if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) {
                return 0;
            }
        }
    }
    return 1;
}

/* A NULL-terminated malloc'd copy of src[0, n) into *out. */
static ks_err dup_list(const char *const *src, size_t n, char ***out)
{
    char **l = *out = calloc(n + 1, sizeof *l);
    if (l == NULL) {
        return KS_ERR_NO_MEMORY;
    }
    for (size_t i = 0; i < n; i++) {
        if ((l[i] = strdup(src[i])) == NULL) {
            return KS_ERR_NO_MEMORY;
        }
    }
    return KS_OK;
}

/* Whether cfg is within the limits of include/keyshift/plugin.h. */
static int config_ok(const ks_plugin_config *c)
{
    if (c->command == NULL || strnlen(c->command, KS_PLUGIN_COMMAND_MAX + 1) > KS_PLUGIN_COMMAND_MAX ||
        (c->command[0] != '/' && !plugin_name_ok(c->command)) || c->nargs > KS_PLUGIN_ARGS_MAX ||
        (c->nargs > 0 && c->args == NULL)) {
        return 0;
    }
    for (size_t i = 0; i < c->nargs; i++) {
        if (c->args[i] == NULL || strnlen(c->args[i], KS_PLUGIN_ARG_MAX + 1) > KS_PLUGIN_ARG_MAX) {
            return 0;
        }
    }
    if (!env_names_ok(c->env, c->nenv, KS_PLUGIN_ENV_MAX) ||
        !env_names_ok(c->env_prefixes, c->nenv_prefixes, KS_PLUGIN_ENV_MAX) ||
        !env_names_ok(c->env_secret, c->nenv_secret, KS_PLUGIN_ENV_SECRET_MAX)) {
        return 0;
    }
    return c->timeout_ms >= 1 && c->timeout_ms <= KS_PLUGIN_TIMEOUT_MAX && c->retries <= KS_PLUGIN_RETRIES_MAX &&
           c->retry_budget_ms >= 1 && c->retry_budget_ms <= KS_PLUGIN_BUDGET_MAX && c->backoff_ms >= 1 &&
           c->backoff_ms <= c->backoff_max_ms && c->backoff_max_ms <= KS_PLUGIN_BUDGET_MAX &&
           c->rate_limit <= KS_PLUGIN_RATE_MAX && c->concurrency >= 1 &&
           c->concurrency <= KS_PLUGIN_CONCURRENCY_MAX;
}

/* Build pl->argv from cfg: the program (an absolute path, or
 * keyshift-kms-NAME for PATH), then the arguments. */
static ks_err build_argv(ks_plugin *pl, const ks_plugin_config *cfg)
{
    pl->argv = calloc(cfg->nargs + 2, sizeof *pl->argv);
    if (pl->argv == NULL) {
        return KS_ERR_NO_MEMORY;
    }
    if (cfg->command[0] == '/') {
        pl->argv[0] = strdup(cfg->command);
    } else if ((pl->argv[0] = malloc(sizeof PLUGIN_PREFIX + strlen(cfg->command))) != NULL) {
        memcpy(pl->argv[0], PLUGIN_PREFIX, sizeof PLUGIN_PREFIX - 1);
        strcpy(pl->argv[0] + sizeof PLUGIN_PREFIX - 1, cfg->command);
    }
    if (pl->argv[0] == NULL) {
        return KS_ERR_NO_MEMORY;
    }
    for (size_t i = 0; i < cfg->nargs; i++) {
        if ((pl->argv[i + 1] = strdup(cfg->args[i])) == NULL) {
            return KS_ERR_NO_MEMORY;
        }
    }
    return KS_OK;
}

/* Allocate and initialise a provider for cfg (no process started). */
static ks_err plugin_new(const ks_plugin_config *cfg, ks_plugin **out)
{
    ks_plugin *pl = calloc(1, sizeof *pl);
    if (pl == NULL) {
        return KS_ERR_NO_MEMORY;
    }
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&pl->cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&pl->mu, NULL);
    pl->owner = getpid();
    pl->cfg = *cfg;
    pl->cfg.command = NULL;
    pl->cfg.args = NULL;
    pl->cfg.env = pl->cfg.env_prefixes = pl->cfg.env_secret = NULL;
    /* [KP-BRIDGE-7]: 5% over 1/R, so that the jitter of the pipe and of
     * the plugin's scheduling (tens of milliseconds on a loaded host)
     * cannot squeeze R + 1 requests into one second at the plugin. */
    pl->interval_ns = cfg->rate_limit != 0 ? 1050000000ull / cfg->rate_limit : 0;
    ks_err rc = build_argv(pl, cfg);
    if (rc == KS_OK) {
        rc = dup_list(cfg->env, cfg->nenv, &pl->env);
    }
    if (rc == KS_OK) {
        rc = dup_list(cfg->env_prefixes, cfg->nenv_prefixes, &pl->env_prefixes);
    }
    if (rc == KS_OK) {
        rc = dup_list(cfg->env_secret, cfg->nenv_secret, &pl->env_secret);
    }
    if (rc == KS_OK) {
        pl->slots = calloc(cfg->concurrency, sizeof *pl->slots);
        rc = pl->slots != NULL ? KS_OK : KS_ERR_NO_MEMORY;
    }
    for (size_t i = 0; rc == KS_OK && i < cfg->concurrency; i++) {
        rc = ks_pproc_init(&pl->slots[i].proc);
        pl->slots[i].proc.deks = &pl->slots[i].deks;
        pl->nslots = i + 1;
    }
    if (rc != KS_OK) {
        plugin_free(pl);
        return rc;
    }
    *out = pl;
    return KS_OK;
}

/* Fill *err from a failed open: the stage, the refusal's reason and
 * member (static names), the plugin's own message (redacted), its stderr. */
static void open_error(ks_plugin_error *err, ks_err code, const char *stage, const ks_plugin *pl,
                       const ks_kp_response *resp)
{
    if (err == NULL) {
        return;
    }
    err->code = code;
    err->stage = stage;
    if (pl == NULL) {
        return;
    }
    snprintf(err->program, sizeof err->program, "%s", pl->argv[0]);
    ks_pstderr_show(&pl->err, err->stderr_tail, sizeof err->stderr_tail);
    if (code == KS_ERR_INTEGRITY && pl->why.reason != KS_KP_R_NONE) {
        err->reason = ks_kp_reason_name((int)pl->why.reason);
        err->field = pl->why.field;
    }
    if (resp != NULL && !resp->ok && resp->message[0] != '\0') {
        redact(resp->message, err->message, sizeof err->message);
    }
}

/* See plugin.h. */
ks_err ks_plugin_open(const ks_plugin_config *cfg, ks_provider *out, ks_plugin_error *err)
{
    if (err != NULL) {
        memset(err, 0, sizeof *err);
        err->stage = "config";
        err->code = KS_ERR_INVALID_ARGUMENT;
    }
    if (out != NULL) {
        memset(out, 0, sizeof *out);
    }
    if (cfg == NULL || out == NULL || !config_ok(cfg)) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    if (sodium_init() < 0) {
        open_error(err, KS_ERR_CRYPTO_INIT, "config", NULL, NULL);
        return KS_ERR_CRYPTO_INIT;
    }
    ks_plugin *pl = NULL;
    ks_err rc = plugin_new(cfg, &pl);
    if (rc != KS_OK) {
        open_error(err, rc, "config", NULL, NULL);
        return rc;
    }
    slot *s = &pl->slots[0];
    s->busy = 1;
    ks_kp_response resp;
    memset(&resp, 0, sizeof resp);
    const char *stage = "start";
    rc = slot_start(pl, s, ks_mono_ns() + start_ns(cfg), &resp, &stage);
    slot_give(pl, s);
    if (rc != KS_OK) {
        open_error(err, rc, stage, pl, &resp);
        plugin_destroy(pl);
        return rc;
    }
    out->ops = &plugin_ops;
    out->self = pl;
    out->name = "plugin";
    return KS_OK;
}

/* See plugin.h. */
ks_err ks_plugin_stats_get(const ks_provider *p, ks_plugin_stats *out)
{
    if (out != NULL) {
        memset(out, 0, sizeof *out);
    }
    if (p == NULL || out == NULL || p->ops != &plugin_ops || p->self == NULL) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    ks_plugin *pl = p->self;
    pthread_mutex_lock(&pl->mu);
    *out = pl->st;
    ks_pstderr_show(&pl->err, out->stderr_tail, sizeof out->stderr_tail);
    pthread_mutex_unlock(&pl->mu);
    return KS_OK;
}
