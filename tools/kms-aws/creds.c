/*
 * tools/kms-aws/creds.c -- the AWS credential chain of keyshift-kms-aws
 * (creds.h; docs/kms-plugin.md [KP-AWS-10..14]).
 */
#define _GNU_SOURCE /* memmem, pipe2 */
#include "creds.h"

#include <assert.h>
#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sodium.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "sigv4.h"

extern char **environ;

#define PATH_CAP 1024
#define ROLE_ARN_MAX 2048
#define STS_VERSION "2011-06-15"
#define IMDS_TOKEN_TTL "21600"

/* ---- messages ------------------------------------------------------- */

#define seterr kms_seterr

/* The sources a walk skipped, and why: in full (variables, files) and in
 * the brief form of creds.h. */
typedef struct {
    char full[1536];
    char brief[240];
} trail;

/* Note that source was skipped: why_full for people reading the
 * plugin's own stderr, why_brief for the short form. */
static void skipped(trail *t, const char *source, const char *why_brief, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void skipped(trail *t, const char *source, const char *why_brief, const char *fmt, ...)
{
    char why[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    size_t n = strlen(t->full);
    snprintf(t->full + n, sizeof t->full - n, "%s%s: %s", n > 0 ? "; " : "", source, why);
    n = strlen(t->brief);
    snprintf(t->brief + n, sizeof t->brief - n, "%s%s: %s", n > 0 ? "; " : "", source, why_brief);
}

/* ---- small checks ------------------------------------------------------ */

/* Whether s is 1..max bytes, each in the set allowed. */
static int all_in(const char *s, size_t max, const char *allowed)
{
    size_t n = strlen(s);
    return n > 0 && n <= max && strspn(s, allowed) == n;
}

#define ALNUM "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"

/* Whether s is a role session name: 2..64 of [\w+=,.@-] (STS). */
static int session_name_ok(const char *s)
{
    return strlen(s) >= 2 && all_in(s, 64, ALNUM "_+=,.@-");
}

/* Whether s looks like an IAM role ARN: arn:PARTITION:iam::ACCOUNT:role/...,
 * printable, at most ROLE_ARN_MAX bytes. */
static int role_arn_ok(const char *s)
{
    size_t n = strnlen(s, ROLE_ARN_MAX + 1);
    if (n == 0 || n > ROLE_ARN_MAX || strncmp(s, "arn:", 4) != 0 || strstr(s, ":iam::") == NULL ||
        strstr(s, ":role/") == NULL) {
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        if (s[i] <= ' ' || s[i] >= 127) {
            return 0;
        }
    }
    return 1;
}

/* getenv, with "" as unset. */
static const char *env(const char *name)
{
    const char *v = getenv(name);
    return v != NULL && v[0] != '\0' ? v : NULL;
}

/* ---- time budgets and HTTP ------------------------------------------------ */

/* The monotonic clock in ms. */
static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* What one walk of the chain shares: its configuration and deadline. */
typedef struct {
    const kms_config *cfg;
    int64_t end_ms;
    trail tr;
} walk;

/* The time one step may take: cap ms, or what is left of the walk. */
static long step_ms(const walk *w, long cap)
{
    int64_t left = w->end_ms - mono_ms();
    if (left < 1) {
        return 0;
    }
    return cap > 0 && cap < left ? cap : (long)left;
}

/* A bounded response body. */
typedef struct {
    char *buf; /* CREDS_MAX_DOC + 1 bytes */
    size_t len;
    int overflow;
} sink;

/* libcurl's write callback: append, or stop past CREDS_MAX_DOC. */
static size_t on_data(char *data, size_t size, size_t nmemb, void *user)
{
    sink *s = user;
    size_t n = size * nmemb;
    if (nmemb != 0 && n / nmemb != size) {
        return 0;
    }
    if (n > CREDS_MAX_DOC - s->len) {
        s->overflow = 1;
        return 0;
    }
    memcpy(s->buf + s->len, data, n);
    s->len += n;
    return n;
}

/* One HTTP request: method ("GET", "PUT", "POST") to url with headers
 * ("Name: value" each) and body (POST/PUT, may be NULL), within
 * timeout_ms; direct (no proxy) when local.  The status into *http and
 * the body into s.  KMS_OK (any status), or KMS_UNAVAILABLE /
 * KMS_TIMEOUT / KMS_INVALID with why in err. */
static kms_status http_do(const char *method, const char *url, const char *const *headers, size_t nh,
                          const char *body, size_t body_len, long timeout_ms, int local, long *http, sink *s,
                          char *err, size_t errlen)
{
    struct curl_slist *h = NULL;
    kms_status st = KMS_INVALID;
    *http = 0;
    s->len = 0;
    s->overflow = 0;
    if (timeout_ms <= 0) {
        seterr(err, errlen, "no time left before the deadline");
        return KMS_TIMEOUT;
    }
    CURL *e = curl_easy_init();
    if (e == NULL) {
        seterr(err, errlen, "libcurl would not start");
        return KMS_INVALID;
    }
    for (size_t i = 0; i < nh; i++) {
        struct curl_slist *l = curl_slist_append(h, headers[i]);
        if (l == NULL) {
            seterr(err, errlen, "out of memory");
            goto out;
        }
        h = l;
    }
    struct curl_slist *l = curl_slist_append(h, "Expect:");
    if (l == NULL) {
        seterr(err, errlen, "out of memory");
        goto out;
    }
    h = l;
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION, 0L);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, timeout_ms);
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, timeout_ms);
    if (local) {
        curl_easy_setopt(e, CURLOPT_NOPROXY, "*");
    }
    if (strcmp(method, "GET") != 0) {
        curl_easy_setopt(e, CURLOPT_POST, 1L);
        curl_easy_setopt(e, CURLOPT_POSTFIELDS, body != NULL ? body : "");
        curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)(body != NULL ? body_len : 0));
        if (strcmp(method, "POST") != 0) {
            curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, method);
        }
    }
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, s);
    CURLcode rc = curl_easy_perform(e);
    curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, http);
    if (s->overflow) {
        seterr(err, errlen, "the answer is larger than %d bytes", CREDS_MAX_DOC);
        st = KMS_INVALID;
    } else if (rc != CURLE_OK) {
        seterr(err, errlen, "%s", curl_easy_strerror(rc));
        st = rc == CURLE_OPERATION_TIMEDOUT ? KMS_TIMEOUT : KMS_UNAVAILABLE;
    } else {
        s->buf[s->len] = '\0';
        st = KMS_OK;
    }
out:
    for (struct curl_slist *p = h; p != NULL; p = p->next) {
        sodium_memzero(p->data, strlen(p->data));
    }
    curl_slist_free_all(h);
    curl_easy_cleanup(e);
    return st;
}

/* A new sink, or NULL. */
static sink *sink_new(void)
{
    sink *s = calloc(1, sizeof *s);
    if (s != NULL && (s->buf = malloc(CREDS_MAX_DOC + 1)) == NULL) {
        free(s);
        s = NULL;
    }
    return s;
}

/* Wipe and free s. */
static void sink_free(sink *s)
{
    if (s != NULL) {
        sodium_memzero(s->buf, CREDS_MAX_DOC + 1);
        free(s->buf);
        free(s);
    }
}

/* ---- STS ------------------------------------------------------------------ */

/* The legacy regions, whose STS calls AWS_STS_REGIONAL_ENDPOINTS=legacy
 * sends to the global endpoint (the SDKs' list). */
static int legacy_region(const char *r)
{
    static const char *const LEGACY[] = {"ap-northeast-1", "ap-south-1", "ap-southeast-1", "ap-southeast-2",
                                         "aws-global",     "ca-central-1", "eu-central-1", "eu-north-1",
                                         "eu-west-1",      "eu-west-2",    "eu-west-3",    "sa-east-1",
                                         "us-east-1",      "us-east-2",    "us-west-1",    "us-west-2"};
    for (size_t i = 0; i < sizeof LEGACY / sizeof LEGACY[0]; i++) {
        if (strcmp(r, LEGACY[i]) == 0) {
            return 1;
        }
    }
    return 0;
}

/* The STS endpoint into ep (endpoint and host set) and the region that
 * signs for it [KP-AWS-11].  0, or -1 with why in err. */
static int sts_endpoint(const kms_config *cfg, kms_config *ep, char *region, size_t rcap, char *err,
                        size_t errlen)
{
    const char *url = env("AWS_ENDPOINT_URL_STS");
    const char *what = "AWS_ENDPOINT_URL_STS";
    char def[128];
    if (url == NULL) {
        url = env("AWS_ENDPOINT_URL");
        what = "AWS_ENDPOINT_URL";
    }
    snprintf(region, rcap, "%s", cfg->region);
    if (url == NULL) {
        const char *mode = env("AWS_STS_REGIONAL_ENDPOINTS");
        if (mode != NULL && strcmp(mode, "legacy") != 0 && strcmp(mode, "regional") != 0) {
            seterr(err, errlen, "AWS_STS_REGIONAL_ENDPOINTS: '%.32s' is neither legacy nor regional", mode);
            return -1;
        }
        if (mode != NULL && strcmp(mode, "legacy") == 0 && legacy_region(cfg->region)) {
            snprintf(def, sizeof def, "https://sts.amazonaws.com/");
            snprintf(region, rcap, "us-east-1");
        } else {
            snprintf(def, sizeof def, "https://sts.%s.amazonaws.com/", cfg->region);
        }
        url = def;
        what = "the region";
    }
    memset(ep, 0, sizeof *ep);
    if (kms_config_set_endpoint(ep, url) != 0) {
        seterr(err, errlen, "%s: not an http(s)://host[:port][/] URL for STS", what);
        return -1;
    }
    return 0;
}

/* Append &name=value (value percent-encoded) to the form f (cap bytes,
 * *len used).  0 or -1. */
static int form_add(char *f, size_t cap, size_t *len, const char *name, const char *value)
{
    size_t nn = strlen(name), enc = 0;
    if (*len + nn + 2 >= cap) {
        return -1;
    }
    f[(*len)++] = '&';
    memcpy(f + *len, name, nn);
    *len += nn;
    f[(*len)++] = '=';
    if (sigv4_uri_encode((const uint8_t *)value, strlen(value), 0, f + *len, cap - *len, &enc) != 0) {
        return -1;
    }
    *len += enc;
    return 0;
}

/* Call STS action with the form params (name, value pairs, np of them),
 * signed by base (NULL: unsigned, AssumeRoleWithWebIdentity), into out.
 * The status, with why in err. */
static kms_status sts_call(walk *w, const char *action, const char *const *params, size_t np,
                           const kms_creds *base, kms_creds *out, char *err, size_t errlen)
{
    kms_config ep;
    char region[65], amz_date[17], auth[1024];
    char hdr[6][KMS_MAX_TOKEN + 64];
    const char *hp[6];
    size_t nh = 0, flen = 0;
    kms_status st = KMS_INVALID;
    if (sts_endpoint(w->cfg, &ep, region, sizeof region, err, errlen) != 0) {
        return KMS_INVALID;
    }
    size_t fcap = 64;
    for (size_t i = 0; i < np; i++) {
        fcap += strlen(params[2 * i]) + 3 * strlen(params[2 * i + 1]) + 2;
    }
    char *form = malloc(fcap);
    sink *s = sink_new();
    if (form == NULL || s == NULL) {
        seterr(err, errlen, "out of memory");
        goto out;
    }
    flen = (size_t)snprintf(form, fcap, "Action=%s", action);
    if (form_add(form, fcap, &flen, "Version", STS_VERSION) != 0) {
        goto toolong;
    }
    for (size_t i = 0; i < np; i++) {
        if (form_add(form, fcap, &flen, params[2 * i], params[2 * i + 1]) != 0) {
            goto toolong;
        }
    }
    static const char CT[] = "application/x-www-form-urlencoded; charset=utf-8";
    snprintf(hdr[nh++], sizeof hdr[0], "Content-Type: %s", CT);
    if (base != NULL) {
        struct tm tm;
        time_t now = time(NULL);
        if (gmtime_r(&now, &tm) == NULL || strftime(amz_date, sizeof amz_date, "%Y%m%dT%H%M%SZ", &tm) != 16) {
            seterr(err, errlen, "no UTC time");
            goto out;
        }
        sigv4_pair h[4] = {
            {"content-type", CT},
            {"host", ep.host},
            {"x-amz-date", amz_date},
            {"x-amz-security-token", base->session_token},
        };
        size_t sh = base->session_token[0] != '\0' ? 4 : 3;
        sigv4_request r = {"POST", "/", NULL, 0, h, sh, (const uint8_t *)form, flen, NULL};
        sigv4_signer sg = {base->access_key_id, base->secret_access_key, region, "sts", amz_date};
        if (sigv4_authorization(&sg, &r, auth, sizeof auth) != 0) {
            seterr(err, errlen, "STS %s: cannot sign the request", kms_sts_label(action));
            goto out;
        }
        snprintf(hdr[nh++], sizeof hdr[0], "X-Amz-Date: %s", amz_date);
        snprintf(hdr[nh++], sizeof hdr[0], "Authorization: %s", auth);
        if (sh == 4) {
            snprintf(hdr[nh++], sizeof hdr[0], "X-Amz-Security-Token: %s", base->session_token);
        }
    }
    for (size_t i = 0; i < nh; i++) {
        hp[i] = hdr[i];
    }
    long http = 0;
    char why[300];
    st = http_do("POST", ep.endpoint, hp, nh, form, flen, step_ms(w, w->cfg->timeout_ms), 0, &http, s, why,
                 sizeof why);
    if (st != KMS_OK) {
        seterr(err, errlen, "STS %s at %s: %s", kms_sts_label(action), ep.endpoint, why);
        goto out;
    }
    st = kms_creds_parse_sts(s->buf, s->len, http, action, out, err, errlen);
    goto out;
toolong:
    seterr(err, errlen, "STS %s: a parameter is too long", kms_sts_label(action));
    st = KMS_INVALID;
out:
    if (form != NULL) {
        sodium_memzero(form, fcap);
        free(form);
    }
    sink_free(s);
    sodium_memzero(hdr, sizeof hdr);
    sodium_memzero(auth, sizeof auth);
    return st;
}

/* A role session name: given (checked), else keyshift-kms-aws-TIME.
 * 0, or -1 with why in err. */
static int session_name(const char *given, char out[65], char *err, size_t errlen)
{
    if (given != NULL) {
        if (!session_name_ok(given)) {
            seterr(err, errlen, "role session name '%.64s' is not 2-64 bytes of [A-Za-z0-9_+=,.@-]", given);
            return -1;
        }
        snprintf(out, 65, "%s", given);
        return 0;
    }
    snprintf(out, 65, "keyshift-kms-aws-%lld", (long long)time(NULL));
    return 0;
}

/* Read a token file (at most max bytes, trailing white space dropped,
 * printable ASCII without spaces) into a heap string *out.  0, or -1
 * with why in err. */
static int read_token_file(const char *what, const char *path, size_t max, char **out, char *err, size_t errlen)
{
    char *text = NULL;
    size_t n = 0;
    char why[300];
    int r = kms_read_file(path, max, &text, &n, why, sizeof why);
    if (r != 0) {
        seterr(err, errlen, "%s %s: %s", what, path, r > 0 ? "no such file" : why);
        return -1;
    }
    while (n > 0 && (text[n - 1] == '\n' || text[n - 1] == '\r' || text[n - 1] == ' ' || text[n - 1] == '\t')) {
        text[--n] = '\0';
    }
    for (size_t i = 0; i < n; i++) {
        if (text[i] <= ' ' || text[i] >= 127) {
            n = 0;
            break;
        }
    }
    if (n == 0) {
        seterr(err, errlen, "%s %s: empty, or not printable ASCII without spaces", what, path);
        sodium_memzero(text, max + 1);
        free(text);
        return -1;
    }
    *out = text;
    return 0;
}

/* AssumeRoleWithWebIdentity with the token in file for role_arn.  The
 * status, with why in err. */
static kms_status web_identity(walk *w, const char *file, const char *role_arn, const char *given_session,
                               kms_creds *out, char *err, size_t errlen)
{
    char sess[65];
    char *token = NULL;
    if (!role_arn_ok(role_arn)) {
        seterr(err, errlen, "web identity: role ARN '%.80s' is not arn:PARTITION:iam::ACCOUNT:role/NAME", role_arn);
        return KMS_INVALID;
    }
    if (session_name(given_session, sess, err, errlen) != 0) {
        return KMS_INVALID;
    }
    if (read_token_file("web identity token file", file, CREDS_MAX_WEB_TOKEN, &token, err, errlen) != 0) {
        return KMS_INVALID;
    }
    const char *params[] = {"RoleArn", role_arn, "RoleSessionName", sess, "WebIdentityToken", token};
    kms_status st = sts_call(w, "AssumeRoleWithWebIdentity", params, 3, NULL, out, err, errlen);
    sodium_memzero(token, CREDS_MAX_WEB_TOKEN + 1);
    free(token);
    if (st == KMS_OK) {
        snprintf(out->source, sizeof out->source, "web identity, role %.60s", role_arn);
    }
    return st;
}

/* ---- credential_process ------------------------------------------------ */

/* Run cmd with /bin/sh -c, its standard output (at most CREDS_MAX_DOC
 * bytes) into s, within timeout_ms; its process group is killed at the
 * deadline.  KMS_OK when it exited 0; else the status, why in err. */
static kms_status run_process(const char *cmd, long timeout_ms, sink *s, char *err, size_t errlen)
{
    int fds[2];
    pid_t pid;
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t at;
    sigset_t none, def;
    kms_status st = KMS_OK;
    s->len = 0;
    if (timeout_ms <= 0) {
        seterr(err, errlen, "credential_process: no time left before the deadline");
        return KMS_TIMEOUT;
    }
    if (pipe2(fds, O_CLOEXEC) != 0) {
        seterr(err, errlen, "credential_process: pipe: %s", strerror(errno));
        return KMS_UNAVAILABLE;
    }
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
    posix_spawnattr_init(&at);
    sigemptyset(&none);
    sigemptyset(&def);
    sigaddset(&def, SIGPIPE);
    posix_spawnattr_setsigmask(&at, &none);
    posix_spawnattr_setsigdefault(&at, &def);
    posix_spawnattr_setpgroup(&at, 0);
    posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETPGROUP);
    char sh[] = "sh", dash_c[] = "-c", line[1025];
    snprintf(line, sizeof line, "%s", cmd);
    char *argv[] = {sh, dash_c, line, NULL};
    int rc = posix_spawn(&pid, "/bin/sh", &fa, &at, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&at);
    close(fds[1]);
    if (rc != 0) {
        close(fds[0]);
        seterr(err, errlen, "credential_process: cannot start /bin/sh: %s", strerror(rc));
        return KMS_UNAVAILABLE;
    }
    int64_t end = mono_ms() + timeout_ms;
    for (;;) {
        int64_t left = end - mono_ms();
        if (left <= 0) {
            seterr(err, errlen, "credential_process: no output within %ld ms; killed", timeout_ms);
            st = KMS_TIMEOUT;
            break;
        }
        struct pollfd p = {fds[0], POLLIN, 0};
        int pr = poll(&p, 1, (int)left);
        if (pr < 0 && errno == EINTR) {
            continue;
        }
        if (pr <= 0) {
            continue;
        }
        ssize_t r = read(fds[0], s->buf + s->len, CREDS_MAX_DOC + 1 - s->len);
        if (r < 0 && errno == EINTR) {
            continue;
        }
        if (r <= 0) {
            break;
        }
        s->len += (size_t)r;
        if (s->len > CREDS_MAX_DOC) {
            seterr(err, errlen, "credential_process: more than %d bytes of output; killed", CREDS_MAX_DOC);
            st = KMS_INVALID;
            break;
        }
    }
    close(fds[0]);
    int status = 0;
    pid_t got = 0;
    while (st == KMS_OK && (got = waitpid(pid, &status, WNOHANG)) == 0) {
        if (mono_ms() >= end) {
            seterr(err, errlen, "credential_process: did not exit within %ld ms; killed", timeout_ms);
            st = KMS_TIMEOUT;
            break;
        }
        struct timespec ts = {0, 5000000};
        nanosleep(&ts, NULL);
    }
    if (st != KMS_OK || got != pid) {
        kill(-pid, SIGKILL);
        while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
        }
        if (st == KMS_OK) {
            st = KMS_UNAVAILABLE;
            seterr(err, errlen, "credential_process: lost");
        }
        return st;
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        seterr(err, errlen, "credential_process %s %d", WIFEXITED(status) ? "exited" : "killed by signal",
               WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
        return KMS_UNAVAILABLE;
    }
    return KMS_OK;
}

/* credential_process cmd of profile into out. */
static kms_status from_process(walk *w, const char *profile, const char *cmd, kms_creds *out, char *err,
                               size_t errlen)
{
    char why[300];
    sink *s = sink_new();
    if (s == NULL) {
        seterr(err, errlen, "out of memory");
        return KMS_INVALID;
    }
    kms_status st = run_process(cmd, step_ms(w, w->cfg->timeout_ms), s, why, sizeof why);
    if (st == KMS_OK) {
        st = kms_creds_parse_json(s->buf, s->len, CREDS_JSON_PROCESS, out, why, sizeof why);
    }
    sink_free(s);
    if (st != KMS_OK) {
        seterr(err, errlen, "profile %s: credential_process: %s", profile, why);
        return st;
    }
    snprintf(out->source, sizeof out->source, "profile %s, credential_process", profile);
    return KMS_OK;
}

/* ---- the container endpoint ------------------------------------------- */

/* Whether the host of an http:// URL (after the scheme) is one the SDKs
 * allow without TLS: a loopback address, the ECS address 169.254.170.2,
 * or the EKS Pod Identity addresses 169.254.170.23 and fd00:ec2::23. */
static int container_host_ok(const char *auth)
{
    size_t n = strcspn(auth, "/");
    char host[64];
    if (auth[0] == '[') {
        const char *rb = memchr(auth, ']', n);
        if (rb == NULL || (size_t)(rb - auth) >= sizeof host) {
            return 0;
        }
        memcpy(host, auth + 1, (size_t)(rb - auth) - 1);
        host[rb - auth - 1] = '\0';
        return strcmp(host, "::1") == 0 || strcasecmp(host, "fd00:ec2::23") == 0;
    }
    size_t hn = strcspn(auth, ":/");
    if (hn == 0 || hn >= sizeof host) {
        return 0;
    }
    memcpy(host, auth, hn);
    host[hn] = '\0';
    if (strcmp(host, "localhost") == 0 || strcmp(host, "169.254.170.2") == 0 || strcmp(host, "169.254.170.23") == 0) {
        return 1;
    }
    unsigned a, b, c, d;
    char tail;
    return sscanf(host, "%u.%u.%u.%u%c", &a, &b, &c, &d, &tail) == 4 && a == 127 && b < 256 && c < 256 && d < 256;
}

/* The container endpoint [KP-AWS-10].  1 when not configured (why in the
 * trail), else the status. */
static int from_container(walk *w, kms_creds *out, kms_status *st, char *err, size_t errlen)
{
    const char *rel = env("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI");
    const char *full = env("AWS_CONTAINER_CREDENTIALS_FULL_URI");
    char url[KMS_MAX_URL + 1], why[300], auth[KMS_MAX_TOKEN + 32] = "";
    char *token = NULL;
    if (rel == NULL && full == NULL) {
        skipped(&w->tr, "container", "no URI",
                "neither AWS_CONTAINER_CREDENTIALS_RELATIVE_URI nor AWS_CONTAINER_CREDENTIALS_FULL_URI set");
        return 1;
    }
    *st = KMS_INVALID;
    if (rel != NULL) {
        if (rel[0] != '/' || !all_in(rel, 512, ALNUM "/-._~%!$'()*+,;=:@?&")) {
            seterr(err, errlen, "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI: not a path beginning with '/'");
            return -1;
        }
        snprintf(url, sizeof url, "http://169.254.170.2%s", rel);
    } else {
        int https = strncmp(full, "https://", 8) == 0;
        if (!(https || strncmp(full, "http://", 7) == 0) || strlen(full) > KMS_MAX_URL ||
            !all_in(full, KMS_MAX_URL, ALNUM "/-._~%!$'()*+,;=:@?&[]")) {
            seterr(err, errlen, "AWS_CONTAINER_CREDENTIALS_FULL_URI: not an http(s) URL");
            return -1;
        }
        if (!https && !container_host_ok(full + 7)) {
            seterr(err, errlen, "AWS_CONTAINER_CREDENTIALS_FULL_URI: plain http is allowed only to a loopback "
                                "address, 169.254.170.2, 169.254.170.23 or fd00:ec2::23; use https");
            return -1;
        }
        snprintf(url, sizeof url, "%s", full);
    }
    const char *tfile = env("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE");
    const char *tval = env("AWS_CONTAINER_AUTHORIZATION_TOKEN");
    if (tfile != NULL) {
        if (read_token_file("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE", tfile, KMS_MAX_TOKEN, &token, err, errlen) !=
            0) {
            return -1;
        }
        snprintf(auth, sizeof auth, "Authorization: %s", token);
        sodium_memzero(token, KMS_MAX_TOKEN + 1);
        free(token);
    } else if (tval != NULL) {
        if (strlen(tval) > KMS_MAX_TOKEN || !all_in(tval, KMS_MAX_TOKEN, ALNUM "-._~+/=:!#$%&'*^`|")) {
            seterr(err, errlen, "AWS_CONTAINER_AUTHORIZATION_TOKEN: too long or not a printable token");
            return -1;
        }
        snprintf(auth, sizeof auth, "Authorization: %s", tval);
    }
    sink *s = sink_new();
    if (s == NULL) {
        seterr(err, errlen, "out of memory");
        return -1;
    }
    const char *hp[] = {auth, "Accept: application/json"};
    long http = 0;
    *st = http_do("GET", url, auth[0] != '\0' ? hp : hp + 1, auth[0] != '\0' ? 2 : 1, NULL, 0,
                  step_ms(w, CREDS_CONTAINER_STEP_MS), 1, &http, s, why, sizeof why);
    sodium_memzero(auth, sizeof auth);
    if (*st == KMS_OK && http != 200) {
        snprintf(why, sizeof why, "HTTP %ld", http);
        *st = http >= 500 ? KMS_UNAVAILABLE : KMS_DENIED;
    }
    if (*st == KMS_OK) {
        *st = kms_creds_parse_json(s->buf, s->len, CREDS_JSON_HTTP, out, why, sizeof why);
    }
    sink_free(s);
    if (*st != KMS_OK) {
        seterr(err, errlen, "container endpoint %s: %s", rel != NULL ? "169.254.170.2" : "(FULL_URI)", why);
        return -1;
    }
    snprintf(out->source, sizeof out->source, "container endpoint");
    return 0;
}

/* ---- EC2 instance metadata (IMDSv2) ------------------------------------ */

/* The IMDS base URL [KP-AWS-10]: AWS_EC2_METADATA_SERVICE_ENDPOINT, else
 * the IPv4 or IPv6 address AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE names
 * (IPv4 by default).  1 when AWS_EC2_METADATA_DISABLED=true, 0 with base
 * set, -1 when a variable is malformed (why in err). */
static int imds_base(char *base, size_t cap, char *err, size_t errlen)
{
    const char *dis = env("AWS_EC2_METADATA_DISABLED");
    const char *ep = env("AWS_EC2_METADATA_SERVICE_ENDPOINT");
    const char *mode = env("AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE");
    if (dis != NULL && strcasecmp(dis, "true") == 0) {
        seterr(err, errlen, "disabled by AWS_EC2_METADATA_DISABLED=true");
        return 1;
    }
    if (ep != NULL) {
        kms_config scratch;
        if (kms_config_set_endpoint(&scratch, ep) != 0) {
            seterr(err, errlen, "AWS_EC2_METADATA_SERVICE_ENDPOINT: not an http(s)://host[:port][/] URL");
            return -1;
        }
        snprintf(base, cap, "%.*s", (int)strlen(scratch.endpoint) - 1, scratch.endpoint);
    } else if (mode != NULL && strcasecmp(mode, "IPv6") == 0) {
        snprintf(base, cap, "http://[fd00:ec2::254]");
    } else if (mode == NULL || strcasecmp(mode, "IPv4") == 0) {
        snprintf(base, cap, "http://169.254.169.254");
    } else {
        seterr(err, errlen, "AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE: '%.16s' is neither IPv4 nor IPv6", mode);
        return -1;
    }
    return 0;
}

/* An IMDSv2 session token from base (PUT, within ms) into tokhdr as the
 * header that sends it.  0; 1 when IMDS does not answer (*answered 0) or
 * gives no token (*answered 1), why in why; -1 when the token is
 * malformed (why in why). */
static int imds_token(const char *base, long ms, sink *s, char *tokhdr, size_t cap, int *answered, char *why,
                      size_t whylen)
{
    char url[KMS_MAX_URL + 200];
    long http = 0;
    snprintf(url, sizeof url, "%s/latest/api/token", base);
    const char *th[] = {"X-aws-ec2-metadata-token-ttl-seconds: " IMDS_TOKEN_TTL};
    kms_status hs = http_do("PUT", url, th, 1, NULL, 0, ms, 1, &http, s, why, whylen);
    *answered = hs == KMS_OK;
    if (hs != KMS_OK || http != 200) {
        if (hs == KMS_OK) {
            snprintf(why, whylen, "HTTP %ld", http);
        }
        return 1;
    }
    memcpy(tokhdr, "X-aws-ec2-metadata-token: ", 26);
    if (kms_creds_field(tokhdr + 26, cap - 26, s->buf, s->len) != 0) {
        snprintf(why, whylen, "the token is empty, too long or not printable");
        return -1;
    }
    return 0;
}

/* IMDSv2 [KP-AWS-10]: a token (PUT), the role name, its credentials.  1
 * when IMDS is disabled or does not answer the token request (why in
 * the trail), else the status. */
static int from_imds(walk *w, kms_creds *out, kms_status *st, char *err, size_t errlen)
{
    char base[KMS_MAX_URL + 1], url[KMS_MAX_URL + 200], why[300], tokhdr[KMS_MAX_TOKEN + 64], role[129];
    long http = 0;
    int answered = 0;
    int r = imds_base(base, sizeof base, why, sizeof why);
    if (r == 1) {
        skipped(&w->tr, "IMDS", "disabled", "%s", why);
        return 1;
    }
    *st = KMS_INVALID;
    if (r != 0) {
        seterr(err, errlen, "%s", why);
        return -1;
    }
    r = -1;
    sink *s = sink_new();
    if (s == NULL) {
        seterr(err, errlen, "out of memory");
        return -1;
    }
    /* the token */
    int t = imds_token(base, step_ms(w, CREDS_IMDS_STEP_MS), s, tokhdr, sizeof tokhdr, &answered, why, sizeof why);
    if (t == 1) {
        skipped(&w->tr, "IMDS", answered ? "no token" : "no answer", "no IMDSv2 token from %s: %s", base, why);
        r = 1;
        goto out;
    }
    if (t != 0) {
        seterr(err, errlen, "IMDS %s: %s", base, why);
        goto out;
    }
    const char *gh[] = {tokhdr};
    /* the role */
    snprintf(url, sizeof url, "%s/latest/meta-data/iam/security-credentials/", base);
    kms_status hs =
        http_do("GET", url, gh, 1, NULL, 0, step_ms(w, CREDS_IMDS_STEP_MS), 1, &http, s, why, sizeof why);
    if (hs == KMS_OK && http == 404) {
        skipped(&w->tr, "IMDS", "no role", "%s: the instance has no IAM role (instance profile)", base);
        r = 1;
        goto out;
    }
    if (hs != KMS_OK || http != 200) {
        *st = hs != KMS_OK ? hs : KMS_UNAVAILABLE;
        seterr(err, errlen, "IMDS %s: role name: %s", base, hs != KMS_OK ? why : "not HTTP 200");
        goto out;
    }
    size_t rn = strcspn(s->buf, "\r\n");
    s->buf[rn] = '\0';
    if (rn == 0 || rn >= sizeof role || !all_in(s->buf, 128, ALNUM "+=,.@_-")) {
        seterr(err, errlen, "IMDS %s: the role name is empty, too long or malformed", base);
        goto out;
    }
    memcpy(role, s->buf, rn + 1);
    /* its credentials */
    snprintf(url, sizeof url, "%s/latest/meta-data/iam/security-credentials/%s", base, role);
    hs = http_do("GET", url, gh, 1, NULL, 0, step_ms(w, CREDS_IMDS_STEP_MS), 1, &http, s, why, sizeof why);
    if (hs == KMS_OK && http != 200) {
        snprintf(why, sizeof why, "HTTP %ld", http);
        hs = KMS_UNAVAILABLE;
    }
    if (hs == KMS_OK) {
        hs = kms_creds_parse_json(s->buf, s->len, CREDS_JSON_HTTP, out, why, sizeof why);
    }
    if (hs != KMS_OK) {
        *st = hs;
        seterr(err, errlen, "IMDS %s: role %s: %s", base, role, why);
        goto out;
    }
    snprintf(out->source, sizeof out->source, "IMDS, role %.64s", role);
    r = 0;
out:
    sodium_memzero(tokhdr, sizeof tokhdr);
    sink_free(s);
    return r;
}

/* See creds.h. */
int kms_imds_region(char *region, size_t cap, char *why, size_t whylen)
{
    char base[KMS_MAX_URL + 1], url[KMS_MAX_URL + 200], tokhdr[KMS_MAX_TOKEN + 64], detail[300];
    long http = 0;
    int answered = 0;
    int r = imds_base(base, sizeof base, why, whylen);
    if (r != 0) {
        return r;
    }
    sink *s = sink_new();
    if (s == NULL) {
        seterr(why, whylen, "out of memory");
        return -1;
    }
    const char *step = "no IMDSv2 token from";
    r = imds_token(base, CREDS_IMDS_STEP_MS, s, tokhdr, sizeof tokhdr, &answered, detail, sizeof detail);
    if (r == 0) {
        step = "IMDS region from";
        snprintf(url, sizeof url, "%s/latest/meta-data/placement/region", base);
        const char *gh[] = {tokhdr};
        kms_status hs = http_do("GET", url, gh, 1, NULL, 0, CREDS_IMDS_STEP_MS, 1, &http, s, detail, sizeof detail);
        if (hs != KMS_OK || http != 200) {
            if (hs == KMS_OK) {
                snprintf(detail, sizeof detail, "HTTP %ld", http);
            }
            r = 1;
        } else if (kms_creds_region(region, cap, s->buf, s->len) != 0) {
            snprintf(detail, sizeof detail, "not a region name");
            r = -1;
        }
    }
    if (r != 0) {
        seterr(why, whylen, "%s %s: %s", step, base, detail);
    }
    sodium_memzero(tokhdr, sizeof tokhdr);
    sink_free(s);
    return r;
}

/* ---- the environment and web identity ----------------------------------- */

/* AWS_ACCESS_KEY_ID and friends.  1 when not configured, 0 found, -1
 * malformed (why in err). */
static int from_env(walk *w, kms_creds *out, char *err, size_t errlen)
{
    const char *id = env("AWS_ACCESS_KEY_ID"), *secret = env("AWS_SECRET_ACCESS_KEY");
    const char *token = env("AWS_SESSION_TOKEN");
    if (w->cfg->profile_given) {
        skipped(&w->tr, "env", "not with --profile", "not used with --profile");
        return 1;
    }
    if (id == NULL) {
        skipped(&w->tr, "env", "no key id", "AWS_ACCESS_KEY_ID not set");
        return 1;
    }
    if (secret == NULL) {
        seterr(err, errlen, "AWS_ACCESS_KEY_ID is set but AWS_SECRET_ACCESS_KEY is not");
        return -1;
    }
    if (kms_creds_field(out->access_key_id, sizeof out->access_key_id, id, strlen(id)) != 0 ||
        kms_creds_field(out->secret_access_key, sizeof out->secret_access_key, secret, strlen(secret)) != 0 ||
        (token != NULL && kms_creds_field(out->session_token, sizeof out->session_token, token, strlen(token)) != 0)) {
        seterr(err, errlen, "AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY or AWS_SESSION_TOKEN: too long or not "
                            "printable");
        kms_creds_wipe(out);
        return -1;
    }
    snprintf(out->source, sizeof out->source, "environment");
    return 0;
}

/* AWS_WEB_IDENTITY_TOKEN_FILE with AWS_ROLE_ARN.  1 when not configured,
 * else the status. */
static int from_web_env(walk *w, kms_creds *out, kms_status *st, char *err, size_t errlen)
{
    const char *file = env("AWS_WEB_IDENTITY_TOKEN_FILE"), *arn = env("AWS_ROLE_ARN");
    if (w->cfg->profile_given) {
        skipped(&w->tr, "web identity", "not with --profile", "not used with --profile");
        return 1;
    }
    if (file == NULL) {
        skipped(&w->tr, "web identity", "no token file", "AWS_WEB_IDENTITY_TOKEN_FILE not set");
        return 1;
    }
    if (arn == NULL) {
        seterr(err, errlen, "AWS_WEB_IDENTITY_TOKEN_FILE is set but AWS_ROLE_ARN is not");
        *st = KMS_INVALID;
        return -1;
    }
    *st = web_identity(w, file, arn, env("AWS_ROLE_SESSION_NAME"), out, err, errlen);
    return *st == KMS_OK ? 0 : -1;
}

/* ---- profiles ------------------------------------------------------------- */

/* What a profile of the shared files says about credentials. */
typedef struct {
    char key_id[129];
    char secret[KMS_MAX_SECRET + 1];
    char token[KMS_MAX_TOKEN + 1];
    char role_arn[ROLE_ARN_MAX + 1];
    char source_profile[65];
    char credential_source[32];
    char process[1025];
    char wit_file[PATH_CAP];
    char session[65];
    char external_id[1225];
    char duration[8];
    char sso[1025];
    int has[12];
    int found; /* in either file */
    char creds_path[PATH_CAP];
    char config_path[PATH_CAP];
} profile;

enum { P_ID, P_SECRET, P_TOKEN, P_ROLE, P_SOURCE, P_CSOURCE, P_PROCESS, P_WIT, P_SESSION, P_EXT, P_DUR, P_SSO };

/* Read profile name from the config file ([default] or [profile NAME])
 * then the credentials file ([NAME]), whose values win.  0, or -1 with
 * why in err. */
static int read_profile(const char *name, profile *p, char *err, size_t errlen)
{
    char section[80];
    static const char *const SSO[] = {"sso_session", "sso_start_url", "sso_account_id", "sso_role_name",
                                      "sso_region"};
    memset(p, 0, sizeof *p);
    for (int file = 0; file < 2; file++) {
        kms_ini_want want[12 + 4] = {
            {"aws_access_key_id", p->key_id, sizeof p->key_id, 0, 0},
            {"aws_secret_access_key", p->secret, sizeof p->secret, 0, 0},
            {"aws_session_token", p->token, sizeof p->token, 0, 0},
            {"role_arn", p->role_arn, sizeof p->role_arn, 0, 0},
            {"source_profile", p->source_profile, sizeof p->source_profile, 0, 0},
            {"credential_source", p->credential_source, sizeof p->credential_source, 0, 0},
            {"credential_process", p->process, sizeof p->process, 1, 0},
            {"web_identity_token_file", p->wit_file, sizeof p->wit_file, 1, 0},
            {"role_session_name", p->session, sizeof p->session, 0, 0},
            {"external_id", p->external_id, sizeof p->external_id, 0, 0},
            {"duration_seconds", p->duration, sizeof p->duration, 0, 0},
            {SSO[0], p->sso, sizeof p->sso, 1, 0},
        };
        size_t nw = 12;
        for (size_t i = 1; i < 5; i++) {
            want[nw++] = (kms_ini_want){SSO[i], p->sso, sizeof p->sso, 1, 0};
        }
        int found = 0;
        if (file == 0) {
            snprintf(section, sizeof section, strcmp(name, "default") == 0 ? "%s" : "profile %s", name);
            if (kms_shared_load("AWS_CONFIG_FILE", "config", section, want, nw, &found, p->config_path,
                                sizeof p->config_path, err, errlen) != 0) {
                return -1;
            }
        } else if (kms_shared_load("AWS_SHARED_CREDENTIALS_FILE", "credentials", name, want, nw, &found,
                                   p->creds_path, sizeof p->creds_path, err, errlen) != 0) {
            return -1;
        }
        p->found |= found;
        for (size_t i = 0; i < nw; i++) {
            p->has[i < 12 ? i : P_SSO] |= want[i].seen;
        }
    }
    return 0;
}

static int from_profile(walk *w, const char *name, int depth, kms_creds *out, kms_status *st, char *err,
                        size_t errlen);

/* The credentials a role_arn profile p (named name) assumes from:
 * source_profile, web_identity_token_file or credential_source, then
 * AssumeRole.  The status. */
static kms_status assume_role(walk *w, const char *name, profile *p, int depth, kms_creds *out, char *err,
                              size_t errlen)
{
    kms_creds base;
    kms_status st = KMS_INVALID;
    char sess[65];
    int n = 0;
    if (!role_arn_ok(p->role_arn)) {
        seterr(err, errlen, "profile %s: role_arn '%.80s' is not arn:PARTITION:iam::ACCOUNT:role/NAME", name,
               p->role_arn);
        return KMS_INVALID;
    }
    if (p->has[P_SOURCE] + p->has[P_WIT] + p->has[P_CSOURCE] != 1) {
        seterr(err, errlen, "profile %s: role_arn needs exactly one of source_profile, web_identity_token_file "
                            "and credential_source", name);
        return KMS_INVALID;
    }
    if (p->has[P_WIT]) {
        return web_identity(w, p->wit_file, p->role_arn, p->has[P_SESSION] ? p->session : NULL, out, err, errlen);
    }
    memset(&base, 0, sizeof base);
    if (p->has[P_SOURCE] && strcmp(p->source_profile, name) == 0) {
        /* a profile that is its own source: its static keys */
        if (!p->has[P_ID] || !p->has[P_SECRET]) {
            seterr(err, errlen, "profile %s: source_profile is itself but it has no aws_access_key_id and "
                                "aws_secret_access_key", name);
            return KMS_INVALID;
        }
        memcpy(base.access_key_id, p->key_id, sizeof base.access_key_id);
        memcpy(base.secret_access_key, p->secret, sizeof base.secret_access_key);
        memcpy(base.session_token, p->token, sizeof base.session_token);
        st = KMS_OK;
    } else if (p->has[P_SOURCE]) {
        if (depth + 1 >= CREDS_MAX_DEPTH) {
            seterr(err, errlen, "profile %s: source_profile chain longer than %d (a loop?)", name, CREDS_MAX_DEPTH);
            return KMS_INVALID;
        }
        int r = from_profile(w, p->source_profile, depth + 1, &base, &st, err, errlen);
        if (r > 0) {
            seterr(err, errlen, "profile %s: source_profile %s has no credentials", name, p->source_profile);
            st = KMS_INVALID;
        }
    } else if (strcmp(p->credential_source, "Environment") == 0) {
        const kms_config *saved = w->cfg;
        kms_config c = *saved;
        c.profile_given = 0;
        w->cfg = &c;
        n = from_env(w, &base, err, errlen);
        w->cfg = saved;
        sodium_memzero(&c, sizeof c);
        st = n == 0 ? KMS_OK : KMS_INVALID;
        if (n > 0) {
            seterr(err, errlen, "profile %s: credential_source Environment, but AWS_ACCESS_KEY_ID is not set", name);
        }
    } else if (strcmp(p->credential_source, "Ec2InstanceMetadata") == 0) {
        n = from_imds(w, &base, &st, err, errlen);
        if (n > 0) {
            seterr(err, errlen, "profile %s: credential_source Ec2InstanceMetadata, but IMDS gave none (%s)", name,
                   w->tr.full);
            st = KMS_INVALID;
        }
    } else if (strcmp(p->credential_source, "EcsContainer") == 0) {
        n = from_container(w, &base, &st, err, errlen);
        if (n > 0) {
            seterr(err, errlen, "profile %s: credential_source EcsContainer, but no container URI is set", name);
            st = KMS_INVALID;
        }
    } else {
        seterr(err, errlen, "profile %s: credential_source '%.32s' is not Environment, Ec2InstanceMetadata or "
                            "EcsContainer", name, p->credential_source);
        return KMS_INVALID;
    }
    if (st != KMS_OK) {
        kms_creds_wipe(&base);
        return st;
    }
    if (session_name(p->has[P_SESSION] ? p->session : NULL, sess, err, errlen) != 0) {
        kms_creds_wipe(&base);
        return KMS_INVALID;
    }
    const char *params[8] = {"RoleArn", p->role_arn, "RoleSessionName", sess};
    size_t np = 2;
    if (p->has[P_EXT]) {
        params[2 * np] = "ExternalId";
        params[2 * np + 1] = p->external_id;
        np++;
    }
    if (p->has[P_DUR]) {
        char *end = NULL;
        long d = strtol(p->duration, &end, 10);
        if (end == p->duration || *end != '\0' || d < 900 || d > 43200 || p->duration[0] == '0') {
            seterr(err, errlen, "profile %s: duration_seconds is not 900 to 43200", name);
            kms_creds_wipe(&base);
            return KMS_INVALID;
        }
        params[2 * np] = "DurationSeconds";
        params[2 * np + 1] = p->duration;
        np++;
    }
    st = sts_call(w, "AssumeRole", params, np, &base, out, err, errlen);
    kms_creds_wipe(&base);
    if (st == KMS_OK) {
        snprintf(out->source, sizeof out->source, "profile %s, role %.60s", name, p->role_arn);
    }
    return st;
}

/* The credentials of profile name [KP-AWS-10]: role_arn first, then
 * static keys, then credential_process.  1 when the profile is absent
 * or names no credentials (the trail says why), 0 found, -1 failed with
 * *st. */
static int from_profile(walk *w, const char *name, int depth, kms_creds *out, kms_status *st, char *err,
                        size_t errlen)
{
    profile *p = calloc(1, sizeof *p);
    int r = -1;
    char src[80];
    *st = KMS_INVALID;
    snprintf(src, sizeof src, "profile %s", name);
    if (p == NULL) {
        seterr(err, errlen, "out of memory");
        return -1;
    }
    if (read_profile(name, p, err, errlen) != 0) {
        goto out;
    }
    if (!p->found) {
        if (depth == 0 && w->cfg->profile_named) {
            seterr(err, errlen, "profile %s is in neither %s nor %s", name, p->creds_path, p->config_path);
            goto out;
        }
        skipped(&w->tr, src, "not found", "not in %s or %s", p->creds_path, p->config_path);
        r = 1;
        goto out;
    }
    if (p->has[P_SSO]) {
        seterr(err, errlen, "profile %s uses IAM Identity Center (sso_*), which keyshift-kms-aws does not "
                            "support; use credential_process or a role", name);
        goto out;
    }
    if (p->has[P_ROLE]) {
        *st = assume_role(w, name, p, depth, out, err, errlen);
        r = *st == KMS_OK ? 0 : -1;
    } else if (p->has[P_ID] || p->has[P_SECRET]) {
        if (!p->has[P_ID] || !p->has[P_SECRET]) {
            seterr(err, errlen, "profile %s has only one of aws_access_key_id and aws_secret_access_key", name);
            goto out;
        }
        memcpy(out->access_key_id, p->key_id, sizeof out->access_key_id);
        memcpy(out->secret_access_key, p->secret, sizeof out->secret_access_key);
        memcpy(out->session_token, p->token, sizeof out->session_token);
        snprintf(out->source, sizeof out->source, "profile %s", name);
        *st = KMS_OK;
        r = 0;
    } else if (p->has[P_PROCESS]) {
        *st = from_process(w, name, p->process, out, err, errlen);
        r = *st == KMS_OK ? 0 : -1;
    } else {
        skipped(&w->tr, src, "no credentials", "names no credentials");
        r = 1;
    }
out:
    sodium_memzero(p, sizeof *p);
    free(p);
    return r;
}

/* ---- the chain -------------------------------------------------------------- */

/* creds.h */
kms_status kms_creds_resolve(const kms_config *cfg, kms_creds *out, char *err, size_t errlen, char *brief,
                             size_t brieflen)
{
    walk w;
    kms_status st = KMS_INVALID;
    int r;
    memset(&w, 0, sizeof w);
    w.cfg = cfg;
    w.end_ms = mono_ms() + (cfg->timeout_ms > 0 ? cfg->timeout_ms : 10000);
    kms_creds_wipe(out);
    seterr(err, errlen, "%s", "");
    seterr(brief, brieflen, "%s", "");
    if (kms_global_init() != 0) {
        seterr(err, errlen, "libsodium, libcurl or jansson would not start");
        return KMS_INVALID;
    }
    r = from_env(&w, out, err, errlen);
    if (r == 1) {
        r = from_web_env(&w, out, &st, err, errlen);
    }
    if (r == 1) {
        r = from_profile(&w, cfg->profile, 0, out, &st, err, errlen);
    }
    if (r == 1) {
        r = from_container(&w, out, &st, err, errlen);
    }
    if (r == 1) {
        r = from_imds(&w, out, &st, err, errlen);
    }
    if (r == 0) {
        time_t now = cfg->now != 0 ? cfg->now : time(NULL);
        if (out->expires != 0 && out->expires <= now) {
            seterr(err, errlen, "%s: the credentials it gave expired already", out->source);
            seterr(brief, brieflen, "%s", err);
            kms_creds_wipe(out);
            return KMS_UNAVAILABLE;
        }
        return KMS_OK;
    }
    kms_creds_wipe(out);
    if (r == 1) {
        seterr(err, errlen, "no AWS credentials found; tried %s", w.tr.full);
        seterr(brief, brieflen, "no AWS credentials (%s)", w.tr.brief);
        return KMS_INVALID;
    }
    if (r < 0 && st == KMS_OK) {
        st = KMS_INVALID; /* from_env's malformed variables */
    }
    seterr(brief, brieflen, "%.*s", (int)(brieflen > 0 ? brieflen - 1 : 0), err);
    return st;
}
