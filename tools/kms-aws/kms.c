/*
 * tools/kms-aws/kms.c -- AWS KMS Encrypt, Decrypt and DescribeKey over the
 * JSON 1.1 protocol with libcurl and jansson (see kms.h for the rules).
 */
#define _POSIX_C_SOURCE 200809L
#include "kms.h"

#include <assert.h>
#include <curl/curl.h>
#include <jansson.h>
#include <pthread.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "sigv4.h"

#define B64_LEN(n) sodium_base64_ENCODED_LEN((n), sodium_base64_VARIANT_ORIGINAL)

struct kms_client {
    kms_config cfg;
    CURL *curl;
    char *resp; /* KMS_MAX_RESPONSE + 1 bytes, wiped after every call */
    size_t resp_len;
    int resp_overflow;
};

/* ---- a jansson allocator that wipes what it frees ------------------- */

/* Room before each block for its size, keeping malloc's alignment. */
#define WIPE_HDR 16

/* malloc that remembers the size, for wipe_free. */
static void *wipe_malloc(size_t n)
{
    if (n > (size_t)-1 - WIPE_HDR) {
        return NULL;
    }
    unsigned char *b = malloc(n + WIPE_HDR);
    if (b == NULL) {
        return NULL;
    }
    memcpy(b, &n, sizeof n);
    return b + WIPE_HDR;
}

/* free that zeroes the block first: jansson's strings may hold base64 of a
 * DEK. */
static void wipe_free(void *p)
{
    if (p == NULL) {
        return;
    }
    unsigned char *b = (unsigned char *)p - WIPE_HDR;
    size_t n;
    memcpy(&n, b, sizeof n);
    sodium_memzero(p, n);
    free(b);
}

/* calloc for libcurl, through wipe_malloc. */
static void *wipe_calloc(size_t nmemb, size_t size)
{
    if (size != 0 && nmemb > (size_t)-1 / size) {
        return NULL;
    }
    void *p = wipe_malloc(nmemb * size);
    if (p != NULL) {
        memset(p, 0, nmemb * size);
    }
    return p;
}

/* realloc for libcurl: a new block, the old one wiped and freed. */
static void *wipe_realloc(void *p, size_t n)
{
    if (p == NULL) {
        return wipe_malloc(n);
    }
    size_t old;
    memcpy(&old, (unsigned char *)p - WIPE_HDR, sizeof old);
    void *q = wipe_malloc(n);
    if (q == NULL) {
        return NULL;
    }
    memcpy(q, p, old < n ? old : n);
    wipe_free(p);
    return q;
}

/* strdup for libcurl, through wipe_malloc. */
static char *wipe_strdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *p = wipe_malloc(n);
    if (p != NULL) {
        memcpy(p, s, n);
    }
    return p;
}

static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static int init_ok;

/* Once per process: libsodium, and libcurl and jansson with the wiping
 * allocator (libcurl copies a small POST body, the base64 of a DEK, into
 * its own request buffer), set before either allocates anything. */
static void global_init(void)
{
    json_set_alloc_funcs(wipe_malloc, wipe_free);
    init_ok = sodium_init() >= 0 && curl_global_init_mem(CURL_GLOBAL_DEFAULT, wipe_malloc, wipe_free, wipe_realloc,
                                                         wipe_strdup, wipe_calloc) == CURLE_OK;
}

/* ---- small helpers ---------------------------------------------------- */

/* Copy s into dst (cap bytes) keeping printable ASCII only (others become
 * '?'), truncated. */
static void copy_printable(char *dst, size_t cap, const char *s, size_t n)
{
    size_t j = 0;
    for (size_t i = 0; i < n && j + 1 < cap; i++) {
        unsigned char c = (unsigned char)s[i];
        dst[j++] = (c >= 32 && c < 127) ? (char)c : '?';
    }
    if (cap > 0) {
        dst[j] = '\0';
    }
}

/* Set err's fields (any may be NULL/0). */
static void set_error(kms_error *err, long http, const char *type, const char *msg)
{
    if (err == NULL) {
        return;
    }
    err->http_status = http;
    copy_printable(err->type, sizeof err->type, type != NULL ? type : "", type != NULL ? strlen(type) : 0);
    copy_printable(err->message, sizeof err->message, msg != NULL ? msg : "", msg != NULL ? strlen(msg) : 0);
}

/* Whether a KMS key id (id, ARN, alias) is 1..KMS_MAX_KEY_ID printable
 * ASCII bytes without spaces. */
static int key_id_ok(const char *id)
{
    if (id == NULL) {
        return 0;
    }
    size_t n = strnlen(id, KMS_MAX_KEY_ID + 1);
    if (n == 0 || n > KMS_MAX_KEY_ID) {
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)id[i];
        if (c <= 32 || c >= 127) {
            return 0;
        }
    }
    return 1;
}

/* A JSON string of the base64 of in[0..n), through a wiped stack buffer;
 * NULL if too long or out of memory. */
static json_t *b64_string(const uint8_t *in, size_t n)
{
    char b64[B64_LEN(KMS_MAX_CIPHERTEXT)];
    if (n > KMS_MAX_CIPHERTEXT) {
        return NULL;
    }
    sodium_bin2base64(b64, sizeof b64, in, n, sodium_base64_VARIANT_ORIGINAL);
    json_t *s = json_string(b64);
    sodium_memzero(b64, sizeof b64);
    return s;
}

/* kms.h */
int kms_base64_decode(const char *s, size_t n, uint8_t *out, size_t cap, size_t *out_len)
{
    const char *end = NULL;
    *out_len = 0;
    if (n == 0 || n % 4 != 0 || n > B64_LEN(cap) || strlen(s) != n ||
        sodium_base642bin(out, cap, s, n, NULL, out_len, &end, sodium_base64_VARIANT_ORIGINAL) != 0 ||
        end != s + n) {
        sodium_memzero(out, cap);
        *out_len = 0;
        return -1;
    }
    return 0;
}

/* Decode o[key], which must be a strict base64 string of at most cap
 * decoded bytes, into out.  0 or -1 (out zeroed). */
static int get_b64(const json_t *o, const char *key, uint8_t *out, size_t cap, size_t *out_len)
{
    const json_t *v = json_object_get(o, key);
    *out_len = 0;
    if (!json_is_string(v)) {
        return -1;
    }
    return kms_base64_decode(json_string_value(v), json_string_length(v), out, cap, out_len);
}

/* o[key] as a string of 1..max bytes without NUL, or NULL; *absent is set
 * when the member is missing or null (so that optional members can be
 * told from malformed ones). */
static const char *get_str(const json_t *o, const char *key, size_t max, int *absent)
{
    const json_t *v = json_object_get(o, key);
    *absent = v == NULL || json_is_null(v);
    if (!json_is_string(v)) {
        return NULL;
    }
    const char *s = json_string_value(v);
    size_t n = json_string_length(v);
    return (n == 0 || n > max || strlen(s) != n) ? NULL : s;
}

/* ---- classification ----------------------------------------------------- */

/* kms.h */
const char *kms_status_name(kms_status s)
{
    switch (s) {
    case KMS_OK:
        return "ok";
    case KMS_UNAVAILABLE:
        return "unavailable";
    case KMS_THROTTLED:
        return "throttled";
    case KMS_DENIED:
        return "denied";
    case KMS_REVOKED:
        return "revoked";
    case KMS_NOT_FOUND:
        return "not-found";
    case KMS_AUTH_FAILED:
        return "auth-failed";
    case KMS_INVALID:
        return "invalid";
    case KMS_TIMEOUT:
        return "timeout";
    }
    return "invalid";
}

/* kms.h */
kms_status kms_classify(const char *type, long http_status, int *invalid_state)
{
    static const struct {
        const char *type;
        kms_status status;
    } MAP[] = {
        {"ThrottlingException", KMS_THROTTLED},
        {"LimitExceededException", KMS_THROTTLED},
        {"KMSInternalException", KMS_UNAVAILABLE},
        {"DependencyTimeoutException", KMS_UNAVAILABLE},
        {"KeyUnavailableException", KMS_UNAVAILABLE},
        {"AccessDeniedException", KMS_DENIED},
        {"DisabledException", KMS_DENIED},
        {"InvalidKeyUsageException", KMS_DENIED},
        {"UnrecognizedClientException", KMS_DENIED},
        {"InvalidSignatureException", KMS_DENIED},
        {"ExpiredTokenException", KMS_DENIED},
        {"KMSInvalidStateException", KMS_DENIED},
        {"NotFoundException", KMS_NOT_FOUND},
        {"InvalidCiphertextException", KMS_AUTH_FAILED},
        {"IncorrectKeyException", KMS_AUTH_FAILED},
    };
    *invalid_state = 0;
    if (type != NULL && type[0] != '\0') {
        const char *hash = strrchr(type, '#');
        const char *t = hash != NULL ? hash + 1 : type;
        size_t n = strcspn(t, ":"); /* x-amzn-ErrorType may append ":url" */
        for (size_t i = 0; i < sizeof MAP / sizeof MAP[0]; i++) {
            if (strlen(MAP[i].type) == n && strncmp(t, MAP[i].type, n) == 0) {
                *invalid_state = strcmp(MAP[i].type, "KMSInvalidStateException") == 0;
                return MAP[i].status;
            }
        }
    }
    if (http_status >= 500 && http_status <= 599) {
        return KMS_UNAVAILABLE;
    }
    if (http_status == 429) {
        return KMS_THROTTLED;
    }
    return KMS_INVALID;
}

/* ---- the client ------------------------------------------------------- */

/* kms.h */
int kms_global_init(void)
{
    pthread_once(&init_once, global_init);
    return init_ok ? 0 : -1;
}

/* kms.h */
kms_client *kms_client_open(const kms_config *cfg)
{
    if (kms_global_init() != 0 || cfg == NULL || cfg->host[0] == '\0' || cfg->region[0] == '\0') {
        return NULL;
    }
    kms_client *c = calloc(1, sizeof *c);
    if (c == NULL) {
        return NULL;
    }
    c->resp = malloc(KMS_MAX_RESPONSE + 1);
    c->curl = curl_easy_init();
    if (c->resp == NULL || c->curl == NULL) {
        free(c->resp);
        if (c->curl != NULL) {
            curl_easy_cleanup(c->curl);
        }
        free(c);
        return NULL;
    }
    c->cfg = *cfg;
    if (c->cfg.timeout_ms <= 0) {
        c->cfg.timeout_ms = 10000;
    }
    return c;
}

/* kms.h */
void kms_client_set_credentials(kms_client *c, const char *access_key_id, const char *secret_access_key,
                                const char *session_token)
{
    assert(strlen(access_key_id) < sizeof c->cfg.access_key_id);
    assert(strlen(secret_access_key) < sizeof c->cfg.secret_access_key);
    assert(strlen(session_token) < sizeof c->cfg.session_token);
    sodium_memzero(c->cfg.access_key_id, sizeof c->cfg.access_key_id);
    sodium_memzero(c->cfg.secret_access_key, sizeof c->cfg.secret_access_key);
    sodium_memzero(c->cfg.session_token, sizeof c->cfg.session_token);
    memcpy(c->cfg.access_key_id, access_key_id, strlen(access_key_id) + 1);
    memcpy(c->cfg.secret_access_key, secret_access_key, strlen(secret_access_key) + 1);
    memcpy(c->cfg.session_token, session_token, strlen(session_token) + 1);
}

/* kms.h */
void kms_client_close(kms_client *c)
{
    if (c == NULL) {
        return;
    }
    curl_easy_cleanup(c->curl);
    sodium_memzero(c->resp, KMS_MAX_RESPONSE + 1);
    free(c->resp);
    sodium_memzero(c, sizeof *c);
    free(c);
}

/* libcurl's write callback: append to the bounded response buffer, or
 * stop the transfer once it would exceed KMS_MAX_RESPONSE. */
static size_t on_body(char *data, size_t size, size_t nmemb, void *user)
{
    kms_client *c = user;
    size_t n = size * nmemb;
    if (nmemb != 0 && n / nmemb != size) {
        return 0;
    }
    if (n > KMS_MAX_RESPONSE - c->resp_len) {
        c->resp_overflow = 1;
        return 0;
    }
    memcpy(c->resp + c->resp_len, data, n);
    c->resp_len += n;
    return n;
}

/* Wipe every string of a header list, then free it. */
static void free_headers(struct curl_slist *h)
{
    for (struct curl_slist *p = h; p != NULL; p = p->next) {
        sodium_memzero(p->data, strlen(p->data));
    }
    curl_slist_free_all(h);
}

/* Append "name: value" to *list through a wiped buffer.  0 or -1. */
static int add_header(struct curl_slist **list, const char *name, const char *value)
{
    char line[KMS_MAX_TOKEN + 64];
    int n = snprintf(line, sizeof line, "%s: %s", name, value);
    struct curl_slist *l = NULL;
    if (n > 0 && (size_t)n < sizeof line) {
        l = curl_slist_append(*list, line);
    }
    sodium_memzero(line, sizeof line);
    if (l == NULL) {
        return -1;
    }
    *list = l;
    return 0;
}

/* The error a non-200 response (in c->resp) means. */
static kms_status error_of(kms_client *c, long http, const char *hdr_type, kms_error *err, int *invalid_state)
{
    json_error_t je;
    json_t *o = json_loadb(c->resp, c->resp_len, JSON_REJECT_DUPLICATES, &je);
    const char *type = NULL, *msg = NULL;
    int absent;
    if (json_is_object(o)) {
        type = get_str(o, "__type", 256, &absent);
        msg = get_str(o, "message", 1024, &absent);
        if (msg == NULL) {
            msg = get_str(o, "Message", 1024, &absent);
        }
    }
    if (type == NULL) {
        type = hdr_type;
    }
    kms_status s = kms_classify(type, http, invalid_state);
    set_error(err, http, type, msg);
    json_decref(o);
    return s;
}

/* curl's header callback: keep x-amzn-ErrorType (bounded) in user. */
static size_t on_header(char *data, size_t size, size_t nmemb, void *user)
{
    char *type = user;
    size_t n = size * nmemb;
    static const char NAME[] = "x-amzn-errortype:";
    if (n > sizeof NAME - 1 && strncasecmp(data, NAME, sizeof NAME - 1) == 0) {
        size_t a = sizeof NAME - 1;
        while (a < n && data[a] == ' ') {
            a++;
        }
        size_t b = n;
        while (b > a && (data[b - 1] == '\r' || data[b - 1] == '\n' || data[b - 1] == ' ')) {
            b--;
        }
        copy_printable(type, 64, data + a, b - a);
    }
    return n;
}

/* POST req (a JSON object) as TrentService.<op>; on 200 *resp is the
 * response object.  Any other outcome is classified, err filled. */
static kms_status call(kms_client *c, const char *op, json_t *req, json_t **resp, kms_error *err,
                       int *invalid_state)
{
    char amz_date[17], target[64], auth[1024], hdr_type[64] = "";
    struct tm tm;
    struct curl_slist *hdrs = NULL;
    kms_status st = KMS_INVALID;
    long http = 0;

    *resp = NULL;
    *invalid_state = 0;
    set_error(err, 0, NULL, NULL);
    if (c->cfg.access_key_id[0] == '\0' || c->cfg.secret_access_key[0] == '\0') {
        set_error(err, 0, NULL, "no credentials");
        return KMS_INVALID;
    }
    char *body = json_dumps(req, JSON_COMPACT | JSON_SORT_KEYS);
    if (body == NULL) {
        set_error(err, 0, NULL, "cannot encode the request");
        return KMS_INVALID;
    }
    size_t body_len = strlen(body);
    time_t now = c->cfg.now != 0 ? c->cfg.now : time(NULL);
    snprintf(target, sizeof target, "TrentService.%s", op);
    if (gmtime_r(&now, &tm) == NULL || strftime(amz_date, sizeof amz_date, "%Y%m%dT%H%M%SZ", &tm) != 16) {
        set_error(err, 0, NULL, "no UTC time");
        goto out;
    }
    sigv4_pair h[5] = {
        {"content-type", "application/x-amz-json-1.1"},
        {"host", c->cfg.host},
        {"x-amz-date", amz_date},
        {"x-amz-target", target},
        {"x-amz-security-token", c->cfg.session_token},
    };
    size_t nh = c->cfg.session_token[0] != '\0' ? 5 : 4;
    sigv4_request r = {"POST", "/", NULL, 0, h, nh, (const uint8_t *)body, body_len, NULL};
    sigv4_signer s = {c->cfg.access_key_id, c->cfg.secret_access_key, c->cfg.region, "kms", amz_date};
    if (sigv4_authorization(&s, &r, auth, sizeof auth) != 0) {
        set_error(err, 0, NULL, "cannot sign the request");
        goto out;
    }
    for (size_t i = 0; i < nh; i++) {
        if (add_header(&hdrs, h[i].name, h[i].value) != 0) {
            set_error(err, 0, NULL, "out of memory");
            goto out;
        }
    }
    if (add_header(&hdrs, "authorization", auth) != 0 || add_header(&hdrs, "expect", "") != 0) {
        set_error(err, 0, NULL, "out of memory");
        goto out;
    }

    CURL *e = c->curl;
    curl_easy_reset(e);
    c->resp_len = 0;
    c->resp_overflow = 0;
    curl_easy_setopt(e, CURLOPT_URL, c->cfg.endpoint);
    curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION, 0L);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, c->cfg.timeout_ms);
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, c->cfg.timeout_ms);
    curl_easy_setopt(e, CURLOPT_POST, 1L);
    curl_easy_setopt(e, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)body_len);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, hdrs);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, c);
    curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(e, CURLOPT_HEADERDATA, hdr_type);
    CURLcode rc = curl_easy_perform(e);
    curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &http);
    if (c->resp_overflow) {
        set_error(err, http, NULL, "response larger than KMS_MAX_RESPONSE");
        st = KMS_INVALID;
        goto out;
    }
    if (rc != CURLE_OK) {
        set_error(err, 0, NULL, curl_easy_strerror(rc));
        st = rc == CURLE_OPERATION_TIMEDOUT ? KMS_TIMEOUT : KMS_UNAVAILABLE;
        goto out;
    }
    if (http != 200) {
        st = error_of(c, http, hdr_type, err, invalid_state);
        goto out;
    }
    json_error_t je;
    *resp = json_loadb(c->resp, c->resp_len, JSON_REJECT_DUPLICATES, &je);
    if (!json_is_object(*resp)) {
        json_decref(*resp);
        *resp = NULL;
        set_error(err, http, NULL, "response is not one JSON object");
        st = KMS_INVALID;
        goto out;
    }
    st = KMS_OK;
out:
    free_headers(hdrs);
    sodium_memzero(auth, sizeof auth);
    sodium_memzero(c->resp, KMS_MAX_RESPONSE + 1);
    c->resp_len = 0;
    sodium_memzero(body, body_len);
    wipe_free(body);
    return st;
}

/* The EncryptionContext object of ctx (kms.h), or NULL if ctx is
 * malformed. */
static json_t *context_object(const kms_context *ctx)
{
    static const char *const NAMES[] = {"keyshift-tenant", "keyshift-key-id", "keyshift-key-version",
                                        "keyshift-purpose"};
    if (ctx == NULL || ctx->aad == NULL || ctx->aad_len == 0 || ctx->aad_len > KMS_MAX_AAD) {
        return NULL;
    }
    json_t *o = json_object();
    json_t *aad = b64_string(ctx->aad, ctx->aad_len);
    if (o == NULL || json_object_set_new(o, "keyshift-aad", aad) != 0) {
        json_decref(o);
        return NULL;
    }
    const char *vals[] = {ctx->tenant, ctx->key_id, ctx->key_version, ctx->purpose};
    for (size_t i = 0; i < 4; i++) {
        if (vals[i] == NULL) {
            continue;
        }
        size_t n = strnlen(vals[i], KMS_MAX_CONTEXT_VALUE + 1);
        /* json_string refuses invalid UTF-8 */
        if (n == 0 || n > KMS_MAX_CONTEXT_VALUE || json_object_set_new(o, NAMES[i], json_string(vals[i])) != 0) {
            json_decref(o);
            return NULL;
        }
    }
    return o;
}

/* A request object {"KeyId": key_id, "EncryptionContext": ctx} (the
 * context only when ctx is not NULL), or NULL. */
static json_t *request_object(const char *key_id, const kms_context *ctx)
{
    json_t *o = json_object();
    if (o == NULL || json_object_set_new(o, "KeyId", json_string(key_id)) != 0 ||
        (ctx != NULL && json_object_set_new(o, "EncryptionContext", context_object(ctx)) != 0)) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* Apply the KMSInvalidStateException rule (kms.h) to key_id. */
static kms_status invalid_state_status(kms_client *c, const char *key_id)
{
    kms_key_info info;
    kms_error e2;
    if (kms_describe_key(c, key_id, &info, &e2) == KMS_OK &&
        (strcmp(info.key_state, "PendingDeletion") == 0 || strcmp(info.key_state, "PendingReplicaDeletion") == 0)) {
        return KMS_REVOKED;
    }
    return KMS_DENIED;
}

/* Whether the KeyId KMS answered with is the key the caller named: equal,
 * or an ARN ending in "key/<named id>".  An alias cannot be checked. */
static int same_key(const char *named, const char *answered)
{
    if (strcmp(named, answered) == 0 || strncmp(named, "alias/", 6) == 0 || strstr(named, ":alias/") != NULL) {
        return 1;
    }
    size_t nn = strlen(named), an = strlen(answered);
    return strncmp(answered, "arn:", 4) == 0 && an > nn + 4 && strcmp(answered + an - nn, named) == 0 &&
           strncmp(answered + an - nn - 4, "key/", 4) == 0;
}

/* One Encrypt or Decrypt: send in (base64) as member in_name of a
 * request for key_id with ctx; decode the answer's out_name into out (at
 * most out_cap bytes).  An answer for another key than key_id is
 * other_key.  out is zeroed unless the call succeeds. */
static kms_status crypt_call(kms_client *c, const char *op, const char *key_id, const kms_context *ctx,
                             const char *in_name, const uint8_t *in, size_t in_len, size_t in_max,
                             const char *out_name, uint8_t *out, size_t out_cap, size_t *out_len,
                             kms_status other_key, kms_error *err)
{
    json_t *resp = NULL;
    int inv, absent;
    *out_len = 0;
    set_error(err, 0, NULL, NULL);
    if (out != NULL) {
        sodium_memzero(out, out_cap);
    }
    if (c == NULL || !key_id_ok(key_id) || in == NULL || in_len == 0 || in_len > in_max || out == NULL) {
        set_error(err, 0, NULL, "bad arguments");
        return KMS_INVALID;
    }
    json_t *req = request_object(key_id, ctx);
    if (req == NULL || json_object_set_new(req, in_name, b64_string(in, in_len)) != 0) {
        json_decref(req);
        set_error(err, 0, NULL, "bad key id or encryption context");
        return KMS_INVALID;
    }
    kms_status st = call(c, op, req, &resp, err, &inv);
    json_decref(req);
    if (st == KMS_DENIED && inv) {
        return invalid_state_status(c, key_id);
    }
    if (st != KMS_OK) {
        return st;
    }
    const char *kid = get_str(resp, "KeyId", KMS_MAX_KEY_ID, &absent);
    const char *alg = get_str(resp, "EncryptionAlgorithm", 64, &absent);
    if (kid == NULL || (alg == NULL && !absent) || (alg != NULL && strcmp(alg, "SYMMETRIC_DEFAULT") != 0) ||
        get_b64(resp, out_name, out, out_cap, out_len) != 0) {
        set_error(err, 200, NULL, "malformed response");
        st = KMS_INVALID;
    } else if (!same_key(key_id, kid)) {
        set_error(err, 200, NULL, "answered for another key");
        st = other_key;
    }
    if (st != KMS_OK) {
        sodium_memzero(out, out_cap);
        *out_len = 0;
    }
    json_decref(resp);
    return st;
}

/* kms.h */
kms_status kms_encrypt(kms_client *c, const char *key_id, const uint8_t *pt, size_t pt_len, const kms_context *ctx,
                       uint8_t *ct, size_t ct_cap, size_t *ct_len, kms_error *err)
{
    return crypt_call(c, "Encrypt", key_id, ctx, "Plaintext", pt, pt_len, KMS_MAX_PLAINTEXT, "CiphertextBlob", ct,
                      ct_cap < KMS_MAX_CIPHERTEXT ? ct_cap : KMS_MAX_CIPHERTEXT, ct_len, KMS_INVALID, err);
}

/* kms.h */
kms_status kms_decrypt(kms_client *c, const char *key_id, const uint8_t *ct, size_t ct_len, const kms_context *ctx,
                       uint8_t *pt, size_t pt_cap, size_t *pt_len, kms_error *err)
{
    return crypt_call(c, "Decrypt", key_id, ctx, "CiphertextBlob", ct, ct_len, KMS_MAX_CIPHERTEXT, "Plaintext", pt,
                      pt_cap < KMS_MAX_PLAINTEXT ? pt_cap : KMS_MAX_PLAINTEXT, pt_len, KMS_AUTH_FAILED, err);
}

/* Copy o[key] (a string of 1..cap-1 bytes) into dst.  0 or -1. */
static int copy_member(const json_t *o, const char *key, char *dst, size_t cap)
{
    int absent;
    const char *s = get_str(o, key, cap - 1, &absent);
    if (s == NULL) {
        return -1;
    }
    memcpy(dst, s, strlen(s) + 1);
    return 0;
}

/* kms.h */
kms_status kms_describe_key(kms_client *c, const char *key_id, kms_key_info *info, kms_error *err)
{
    json_t *resp = NULL;
    int inv;
    set_error(err, 0, NULL, NULL);
    if (info != NULL) {
        memset(info, 0, sizeof *info);
    }
    if (c == NULL || !key_id_ok(key_id) || info == NULL) {
        set_error(err, 0, NULL, "bad arguments");
        return KMS_INVALID;
    }
    json_t *req = request_object(key_id, NULL);
    if (req == NULL) {
        set_error(err, 0, NULL, "bad key id");
        return KMS_INVALID;
    }
    kms_status st = call(c, "DescribeKey", req, &resp, err, &inv);
    json_decref(req);
    if (st != KMS_OK) {
        return st;
    }
    const json_t *md = json_object_get(resp, "KeyMetadata");
    const json_t *en = json_object_get(md, "Enabled");
    /* optional; moto sends null for it */
    const json_t *usage = json_object_get(md, "KeyUsage");
    if (json_is_null(usage)) {
        usage = NULL;
    }
    if (!json_is_object(md) || !json_is_boolean(en) || copy_member(md, "Arn", info->arn, sizeof info->arn) != 0 ||
        copy_member(md, "KeyState", info->key_state, sizeof info->key_state) != 0 ||
        (usage != NULL && copy_member(md, "KeyUsage", info->key_usage, sizeof info->key_usage) != 0)) {
        memset(info, 0, sizeof *info);
        set_error(err, 200, NULL, "malformed DescribeKey response");
        st = KMS_INVALID;
    } else {
        info->enabled = json_is_true(en);
    }
    json_decref(resp);
    return st;
}
