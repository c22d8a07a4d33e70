/*
 * tests/test_plugin.c -- the KMS plugin provider (include/keyshift/plugin.h,
 * migrate/keys/provider_plugin.c, plugin_proc.c) against real plugin
 * processes: tools/kms-example/keyshift-kms-example for the round trip, and
 * tests/keyshift-kms-fault for every fault of docs/kms-plugin.md
 * section 10 ([KP-BRIDGE]): a hang, an exit, half a line, garbage, an
 * oversized line, a wrong id, a duplicate answer, each error class, a slow
 * plugin, throttling, a leak of a DEK on stderr and in a message, the rate
 * limit, the concurrency cap and fork().
 *
 * Each fault checks the call's result, the counters (retries and restarts
 * within their bounds) and that no DEK, in base64 or hex, is in anything
 * keyshift shows (the stats' texts, the open error).
 */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>

#include <sodium.h>

#include <keyshift/plugin.h>

#include "../migrate/keys/plugin_proc.h"
#include "test_files.h"

/* The example plugin's key file: app/main version 1 decrypt-only, 2
 * active and primary. */
static const char keys_json[] =
    "{\"app/main\": {\"primary\": 2, \"versions\": {"
    "\"1\": {\"state\": \"decrypt-only\", \"kek\": \"AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE=\"},"
    "\"2\": {\"state\": \"active\", \"kek\": \"AgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgI=\"}}}}\n";

static const ks_bytes key_id = {(const uint8_t *)"app/main", 8};
static const ks_bytes aad = {(const uint8_t *)"wrap-aad", 8};

/* Per test: the directory (keys file and fault plan), the fault plugin's
 * path, and a DEK. */
typedef struct pfix {
    fixture *f;
    char tool[512];
    char keys[160];
    uint8_t dek[KS_DEK_LEN];
} pfix;

/* Elapsed milliseconds since t0 (CLOCK_MONOTONIC). */
static uint64_t ms_since(const struct timespec *t0)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)(t.tv_sec - t0->tv_sec) * 1000u + (uint64_t)((t.tv_nsec - t0->tv_nsec) / 1000000);
}

/* cmocka setup: a directory with the key file, the environment the fault
 * plugin reads. */
static int setup(void **state)
{
    pfix *p = calloc(1, sizeof *p);
    assert_non_null(p);
    void *fs = NULL;
    tf_setup(&fs, "plugin", "keys.json");
    p->f = fs;
    snprintf(p->keys, sizeof p->keys, "%s", p->f->path);
    tf_spit(p->keys, keys_json, sizeof keys_json - 1, 0600);
    char spec[256];
    tf_spec_path("kms-plugin.md", spec, sizeof spec);
    char *abs = realpath(spec, NULL);
    assert_non_null(abs);
    snprintf(p->tool, sizeof p->tool, "%.*s/../tests/keyshift-kms-fault", (int)(strrchr(abs, '/') - abs), abs);
    free(abs);
    assert_int_equal(setenv("KEYSHIFT_KMS_EXAMPLE_KEYS", p->keys, 1), 0);
    assert_int_equal(setenv("KEYSHIFT_FAULT_DIR", p->f->dir, 1), 0);
    randombytes_buf(p->dek, sizeof p->dek);
    *state = p;
    return 0;
}

/* cmocka teardown. */
static int teardown(void **state)
{
    pfix *p = *state;
    char path[256];
    static const char *const files[] = {"plan", "used", "used.tmp", "log", "lock", "deks", "env", "child"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", p->f->dir, files[i]);
        unlink(path);
    }
    void *fs = p->f;
    tf_teardown(&fs);
    free(p);
    return 0;
}

/* Write the fault plan (and forget what an earlier one used). */
static void plan(const pfix *p, const char *text)
{
    char path[256];
    snprintf(path, sizeof path, "%s/used", p->f->dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/log", p->f->dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/plan", p->f->dir);
    tf_spit(path, text, strlen(text), 0600);
}

/* A quick policy for tests: short deadlines and backoffs, no rate limit. */
static ks_plugin_config quick(const pfix *p)
{
    ks_plugin_config c;
    ks_plugin_config_init(&c);
    static const char *const env[] = {"KEYSHIFT_KMS_EXAMPLE_KEYS", "KEYSHIFT_FAULT_DIR"};
    c.command = p->tool;
    c.env = env; /* [KP-SEC-1]: what the fault plugin reads */
    c.nenv = 2;
    c.timeout_ms = 1500;
    c.retries = 2;
    c.retry_budget_ms = 10000;
    c.backoff_ms = 10;
    c.backoff_max_ms = 40;
    c.rate_limit = 0;
    c.concurrency = 1;
    return c;
}

/* Open a provider with c, which must succeed. */
static void open_ok(const ks_plugin_config *c, ks_provider *prov)
{
    ks_plugin_error e;
    const ks_err rc = ks_plugin_open(c, prov, &e);
    if (rc != KS_OK) {
        fail_msg("ks_plugin_open: %s at %s (%s) stderr: %s", ks_err_name(rc), e.stage, e.message, e.stderr_tail);
    }
}

/* Assert that no text in s holds the DEK d in base64 or hex. */
static void assert_no_dek_in(const char *s, const uint8_t *d)
{
    char b64[sodium_base64_ENCODED_LEN(KS_DEK_LEN, sodium_base64_VARIANT_ORIGINAL)];
    char hex[2 * KS_DEK_LEN + 1];
    sodium_bin2base64(b64, sizeof b64, d, KS_DEK_LEN, sodium_base64_VARIANT_ORIGINAL);
    sodium_bin2hex(hex, sizeof hex, d, KS_DEK_LEN);
    /* any 12 characters of either spelling */
    for (size_t i = 0; i + 12 <= strlen(b64); i++) {
        assert_null(memmem(s, strlen(s), b64 + i, 12));
    }
    for (size_t i = 0; i + 12 <= strlen(hex); i++) {
        assert_null(memmem(s, strlen(s), hex + i, 12));
    }
}

/* The stats of prov, asserting none of its texts holds d. */
static ks_plugin_stats stats(const ks_provider *prov, const uint8_t *d)
{
    ks_plugin_stats s;
    assert_int_equal(ks_plugin_stats_get(prov, &s), KS_OK);
    assert_no_dek_in(s.last_error, d);
    assert_no_dek_in(s.stderr_tail, d);
    return s;
}

/* Wrap p->dek under app/main v2. */
static ks_err wrap(ks_provider *prov, const pfix *p, uint8_t *out, size_t *n)
{
    return prov->ops->wrap(prov->self, key_id, 2, p->dek, KS_DEK_LEN, aad, out, 1024, n, 0);
}

/* Unwrap w under app/main v2 into dek. */
static ks_err unwrap(ks_provider *prov, const uint8_t *w, size_t n, uint8_t *dek)
{
    return prov->ops->unwrap(prov->self, key_id, 2, (ks_bytes){w, n}, aad, dek, KS_DEK_LEN, 0);
}

/* key_info of app/main's primary. */
static ks_err info(ks_provider *prov, ks_key_info *ki)
{
    return prov->ops->key_info(prov->self, key_id, 0, ki, 0);
}

/* Lines of the plugin's log for op (NULL: every op), and how many
 * distinct pids they name. */
static size_t log_lines(const pfix *p, const char *want, size_t *pids)
{
    char path[256];
    snprintf(path, sizeof path, "%s/log", p->f->dir);
    FILE *fp = fopen(path, "r");
    size_t n = 0, np = 0;
    long seen[64];
    if (fp != NULL) {
        unsigned long long t;
        long pid;
        char op[32], id[32], fault[64];
        while (fscanf(fp, "%llu %ld %31s %31s %63s", &t, &pid, op, id, fault) == 5) {
            if (want != NULL && strcmp(op, want) != 0) {
                continue;
            }
            n++;
            size_t k = 0;
            while (k < np && seen[k] != pid) {
                k++;
            }
            if (k == np && np < 64) {
                seen[np++] = pid;
            }
        }
        fclose(fp);
    }
    if (pids != NULL) {
        *pids = np;
    }
    return n;
}

/* Plan faults, then open a provider with c. */
static void start(pfix *p, const char *faults, const ks_plugin_config *c, ks_provider *prov)
{
    plan(p, faults);
    open_ok(c, prov);
}

/* Wrap p->dek, unwrap it again and compare; the wrapped bytes go to w
 * (1024 bytes), their length to *n. */
static void round_trip(ks_provider *prov, const pfix *p, uint8_t *w, size_t *n)
{
    uint8_t back[KS_DEK_LEN];
    assert_int_equal(wrap(prov, p, w, n), KS_OK);
    assert_int_equal(unwrap(prov, w, *n, back), KS_OK);
    assert_memory_equal(back, p->dek, KS_DEK_LEN);
    sodium_memzero(back, sizeof back);
}

/* ---- the round trip ---------------------------------------------------------------- */

/* open (hello), key_info, wrap, unwrap, an unwrap with another AAD
 * (auth-failed), a wrap under the decrypt-only version (denied), an
 * unknown key (not-found); a well-behaved plugin exits when closed. */
static void test_round_trip(void **state)
{
    pfix *p = *state;
    ks_plugin_config c = quick(p);
    ks_provider prov;
    start(p, "", &c, &prov);
    ks_key_info ki;
    assert_int_equal(info(&prov, &ki), KS_OK);
    assert_int_equal(ki.version, 2);
    assert_true(ki.is_primary);
    uint8_t w[1024], back[KS_DEK_LEN];
    size_t n = 0;
    assert_int_equal(wrap(&prov, p, w, &n), KS_OK);
    assert_int_equal(n, 80);
    assert_int_equal(unwrap(&prov, w, n, back), KS_OK);
    assert_memory_equal(back, p->dek, KS_DEK_LEN);
    assert_int_equal(prov.ops->unwrap(prov.self, key_id, 2, (ks_bytes){w, n}, (ks_bytes){(const uint8_t *)"other", 5},
                                      back, KS_DEK_LEN, 0),
                     KS_ERR_AUTH_FAILED);
    assert_true(sodium_is_zero(back, KS_DEK_LEN));
    assert_int_equal(prov.ops->wrap(prov.self, key_id, 1, p->dek, KS_DEK_LEN, aad, w, sizeof w, &n, 0),
                     KS_ERR_DENIED);
    assert_int_equal(prov.ops->key_info(prov.self, (ks_bytes){(const uint8_t *)"nope", 4}, 0, &ki, 0),
                     KS_ERR_NOT_FOUND);
    ks_plugin_stats s = stats(&prov, p->dek);
    assert_string_equal(s.plugin, "keyshift-kms-example 1");
    assert_int_equal(s.starts, 1);
    assert_int_equal(s.retries, 0);
    assert_int_equal(s.calls, 6);
    assert_int_equal(s.requests, 7); /* the hello and six calls */
    ks_provider_destroy(&prov);
}

/* ---- faults that are retried -------------------------------------------------------- */

/* One fault on the first wrap that a restart and a retry get past; the
 * counters say how: at most one retry and one restart. */
static void retried_once(pfix *p, const char *fault, uint64_t timeouts)
{
    char text[96];
    snprintf(text, sizeof text, "wrap %s 1\n", fault);
    ks_plugin_config c = quick(p);
    c.timeout_ms = 1000;
    ks_provider prov;
    start(p, text, &c, &prov);
    uint8_t w[1024];
    size_t n = 0;
    round_trip(&prov, p, w, &n);
    ks_plugin_stats s = stats(&prov, p->dek);
    assert_int_equal(s.retries, 1);
    assert_int_equal(s.starts, 2);
    assert_int_equal(s.kills, 1);
    assert_int_equal(s.timeouts, timeouts);
    ks_provider_destroy(&prov);
}

/* A plugin that hangs is killed at the deadline and the call retried. */
static void test_hang_once(void **state)
{
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    retried_once(*state, "hang", 1);
    assert_true(ms_since(&t0) >= 1000);
}

/* A plugin that exits without answering, or half-way through its line, is
 * restarted and the call retried. */
static void test_exit_and_midline(void **state)
{
    retried_once(*state, "exit", 0);
    retried_once(*state, "midline", 0);
}

/* A plugin slower than the deadline is killed and retried; one within it
 * is simply waited for. */
static void test_slow(void **state)
{
    pfix *p = *state;
    retried_once(p, "slow:2500", 1);
    ks_plugin_config c = quick(p);
    ks_provider prov;
    start(p, "wrap slow:200 1\n", &c, &prov);
    uint8_t w[1024];
    size_t n = 0;
    assert_int_equal(wrap(&prov, p, w, &n), KS_OK);
    ks_plugin_stats s = stats(&prov, p->dek);
    assert_int_equal(s.retries, 0);
    assert_int_equal(s.starts, 1);
    ks_provider_destroy(&prov);
}

/* A plugin that always hangs: the call fails with timeout after exactly
 * 1 + retries attempts, each killed, and never outlives its budget. */
static void test_hang_always(void **state)
{
    pfix *p = *state;
    ks_plugin_config c = quick(p);
    c.timeout_ms = 1000;
    ks_provider prov;
    start(p, "wrap hang *\n", &c, &prov);
    uint8_t w[1024];
    size_t n = 0;
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    assert_int_equal(wrap(&prov, p, w, &n), KS_ERR_TIMEOUT);
    const uint64_t took = ms_since(&t0);
    if (took < 3000 || took > 10500) {
        ks_plugin_stats d = stats(&prov, p->dek);
        fail_msg("took %llu ms: timeouts %llu retries %llu starts %llu last %s", (unsigned long long)took,
                 (unsigned long long)d.timeouts, (unsigned long long)d.retries, (unsigned long long)d.starts,
                 d.last_error);
    }
    ks_plugin_stats s = stats(&prov, p->dek);
    assert_int_equal(s.timeouts, 3);
    assert_int_equal(s.retries, 2);
    assert_true(s.starts <= 3);
    assert_int_equal(log_lines(p, "wrap", NULL), 3);
    assert_int_equal(log_lines(p, "hello", NULL), s.starts);
    /* The caller's own deadline bounds the whole call. */
    clock_gettime(CLOCK_MONOTONIC, &t0);
    assert_int_equal(prov.ops->wrap(prov.self, key_id, 2, p->dek, KS_DEK_LEN, aad, w, sizeof w, &n, 400),
                     KS_ERR_TIMEOUT);
    assert_true(ms_since(&t0) < 2500);
    ks_provider_destroy(&prov);
}

/* Throttled N times: retried N times and then served; retry_after_ms is
 * honoured; throttled forever ends as unavailable after the retries. */
static void test_throttled(void **state)
{
    pfix *p = *state;
    ks_plugin_config c = quick(p);
    c.retries = 3;
    ks_provider prov;
    start(p, "wrap error:throttled 2\n", &c, &prov);
    uint8_t w[1024];
    size_t n = 0;
    assert_int_equal(wrap(&prov, p, w, &n), KS_OK);
    ks_plugin_stats s = stats(&prov, p->dek);
    assert_int_equal(s.throttled, 2);
    assert_int_equal(s.retries, 2);
    assert_int_equal(s.starts, 1);
    ks_provider_destroy(&prov);

    start(p, "wrap error:throttled:300 1\n", &c, &prov);
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    assert_int_equal(wrap(&prov, p, w, &n), KS_OK);
    assert_true(ms_since(&t0) >= 300);
    ks_provider_destroy(&prov);

    start(p, "wrap error:throttled *\n", &c, &prov);
    assert_int_equal(wrap(&prov, p, w, &n), KS_ERR_UNAVAILABLE);
    s = stats(&prov, p->dek);
    assert_int_equal(s.throttled, 4);
    assert_int_equal(s.retries, 3);
    assert_non_null(strstr(s.last_error, "throttled"));
    ks_provider_destroy(&prov);
}

/* The retried classes (unavailable, timeout) are retried up to the limit;
 * every other class is answered at once, never retried. */
static void test_error_classes(void **state)
{
    pfix *p = *state;
    static const struct {
        const char *fault;
        const char *op;
        ks_err want;
        uint64_t retries;
    } cases[] = {
        {"error:unavailable", "wrap", KS_ERR_UNAVAILABLE, 2},
        {"error:timeout", "wrap", KS_ERR_TIMEOUT, 2},
        {"error:denied", "wrap", KS_ERR_DENIED, 0},
        {"error:revoked", "wrap", KS_ERR_REVOKED, 0},
        {"error:not-found", "wrap", KS_ERR_NOT_FOUND, 0},
        {"error:integrity", "wrap", KS_ERR_INTEGRITY, 0},
        {"error:invalid", "wrap", KS_ERR_INVALID_ARGUMENT, 0},
        {"error:auth-failed", "unwrap", KS_ERR_AUTH_FAILED, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        plan(p, "");
        ks_plugin_config c = quick(p);
        ks_provider prov;
        open_ok(&c, &prov);
        uint8_t w[1024], back[KS_DEK_LEN];
        size_t n = 0;
        assert_int_equal(wrap(&prov, p, w, &n), KS_OK);
        char text[96];
        snprintf(text, sizeof text, "%s %s *\n", cases[i].op, cases[i].fault);
        plan(p, text);
        const ks_err got = strcmp(cases[i].op, "wrap") == 0 ? wrap(&prov, p, w, &n) : unwrap(&prov, w, n, back);
        if (got != cases[i].want) {
            fail_msg("%s: %s, expected %s", cases[i].fault, ks_err_name(got), ks_err_name(cases[i].want));
        }
        ks_plugin_stats s = stats(&prov, p->dek);
        assert_int_equal(s.retries, cases[i].retries);
        assert_int_equal(s.starts, 1);
        assert_int_equal(log_lines(p, cases[i].op, NULL), 1 + cases[i].retries);
        ks_provider_destroy(&prov);
    }
}

/* ---- faults that are refused ---------------------------------------------------------- */

/* A line the protocol refuses is KS_ERR_INTEGRITY, never retried; the
 * process is replaced and the next call served by a new one. */
static void test_refused_lines(void **state)
{
    pfix *p = *state;
    static const char *const faults[] = {"garbage", "oversized", "wrong-id"};
    for (size_t i = 0; i < sizeof faults / sizeof faults[0]; i++) {
        char text[64];
        snprintf(text, sizeof text, "wrap %s 1\n", faults[i]);
        plan(p, text);
        ks_plugin_config c = quick(p);
        ks_provider prov;
        open_ok(&c, &prov);
        uint8_t w[1024];
        size_t n = 0;
        assert_int_equal(wrap(&prov, p, w, &n), KS_ERR_INTEGRITY);
        ks_plugin_stats s = stats(&prov, p->dek);
        assert_int_equal(s.refusals, 1);
        assert_int_equal(s.retries, 0);
        assert_int_equal(s.kills, 1);
        assert_non_null(strstr(s.last_error, "response refused"));
        assert_int_equal(wrap(&prov, p, w, &n), KS_OK);
        s = stats(&prov, p->dek);
        assert_int_equal(s.starts, 2);
        ks_provider_destroy(&prov);
    }
}

/* A duplicate answer: the first line stands, the process is replaced
 * before the next request. */
static void test_duplicate(void **state)
{
    pfix *p = *state;
    ks_plugin_config c = quick(p);
    ks_provider prov;
    start(p, "wrap duplicate 1\n", &c, &prov);
    uint8_t w[1024];
    size_t n = 0;
    round_trip(&prov, p, w, &n);
    ks_plugin_stats s = stats(&prov, p->dek);
    assert_int_equal(s.refusals, 1);
    assert_int_equal(s.starts, 2);
    ks_provider_destroy(&prov);
}

/* A plugin that writes DEKs on stderr, in a vendor member and in an error
 * message: nothing keyshift shows holds them. */
static void test_leaks_not_shown(void **state)
{
    pfix *p = *state;
    ks_plugin_config c = quick(p);
    c.retries = 0;
    ks_provider prov;
    start(p, "wrap leak 1\nunwrap leak 1\nunwrap message-leak 1\n", &c, &prov);
    uint8_t w[1024], back[KS_DEK_LEN];
    size_t n = 0;
    round_trip(&prov, p, w, &n);
    assert_int_equal(unwrap(&prov, w, n, back), KS_ERR_UNAVAILABLE);
    ks_plugin_stats s = stats(&prov, p->dek);
    assert_non_null(strstr(s.stderr_tail, "leaking [redacted] [redacted]"));
    assert_non_null(strstr(s.last_error, "unavailable"));
    ks_provider_destroy(&prov);
}

/* A DEK whose base64 holds no digit (about 0.07 % of them): the old rule
 * redacted only runs with a digit and showed it in full. */
static void digit_free_dek(uint8_t *dek)
{
    char b64[sodium_base64_ENCODED_LEN(KS_DEK_LEN, sodium_base64_VARIANT_ORIGINAL)];
    do {
        randombytes_buf(dek, KS_DEK_LEN);
        sodium_bin2base64(b64, sizeof b64, dek, KS_DEK_LEN, sodium_base64_VARIANT_ORIGINAL);
    } while (strpbrk(b64, "0123456789") != NULL);
}

/* Assert that s holds none of 12 characters in a row of d's base64url
 * spelling, nor d's bytes (when they are printable, as the raw DEK of
 * letters below is). */
static void assert_no_dek_more(const char *s, const uint8_t *d)
{
    char url[sodium_base64_ENCODED_LEN(KS_DEK_LEN, sodium_base64_VARIANT_URLSAFE)];
    sodium_bin2base64(url, sizeof url, d, KS_DEK_LEN, sodium_base64_VARIANT_URLSAFE);
    for (size_t i = 0; i + 12 <= strlen(url); i++) {
        assert_null(memmem(s, strlen(s), url + i, 12));
    }
    for (size_t i = 0; i + 12 <= KS_DEK_LEN; i++) {
        assert_null(memmem(s, strlen(s), d + i, 12));
    }
}

/* [KP-BRIDGE-9]: a DEK in every spelling on stderr, for a DEK whose
 * base64 has no digit and one whose raw bytes are letters (both shown
 * by the old rule), in a wrap and in an unwrap's answer; and a DEK cut
 * by the 1 KiB window, 15 characters of it left. */
static void test_leaks_every_spelling(void **state)
{
    pfix *p = *state;
    for (int round = 0; round < 2; round++) {
        if (round == 0) {
            digit_free_dek(p->dek);
        } else {
            for (size_t i = 0; i < KS_DEK_LEN; i++) {
                p->dek[i] = (uint8_t)('a' + randombytes_uniform(26));
            }
        }
        ks_plugin_config c = quick(p);
        c.retries = 0;
        ks_provider prov;
        start(p, "wrap leak-all 1\nunwrap leak-all 1\nwrap leak-edge 1\nunwrap leak-edge 1\n", &c, &prov);
        uint8_t w[1024];
        size_t n = 0;
        round_trip(&prov, p, w, &n);
        ks_plugin_stats s = stats(&prov, p->dek);
        assert_no_dek_more(s.stderr_tail, p->dek);
        round_trip(&prov, p, w, &n);
        s = stats(&prov, p->dek);
        assert_no_dek_more(s.stderr_tail, p->dek);
        assert_non_null(strstr(s.stderr_tail, "[redacted]...."));
        ks_provider_destroy(&prov);
    }
}

/* ks_pstderr_add: a DEK cut by the window's front edge in each spelling
 * (its last 15 characters left) and one split between two writes are
 * masked, whether or not it is known; the pattern rule needs no digit. */
static void test_stderr_window_edge(void **state)
{
    (void)state;
    uint8_t dek[KS_DEK_LEN];
    for (size_t i = 0; i < KS_DEK_LEN; i++) {
        dek[i] = (uint8_t)('A' + i % 26); /* raw bytes that are letters, no digit */
    }
    char enc[4][2 * KS_DEK_LEN + 1];
    memcpy(enc[0], dek, KS_DEK_LEN);
    enc[0][KS_DEK_LEN] = '\0';
    sodium_bin2hex(enc[1], sizeof enc[1], dek, KS_DEK_LEN);
    sodium_bin2base64(enc[2], sizeof enc[2], dek, KS_DEK_LEN, sodium_base64_VARIANT_ORIGINAL);
    sodium_bin2base64(enc[3], sizeof enc[3], dek, KS_DEK_LEN, sodium_base64_VARIANT_URLSAFE_NO_PADDING);
    ks_pdeks known;
    memset(&known, 0, sizeof known);
    ks_pdeks_note(&known, dek);
    char out[KS_PSTDERR_CAP * 4], fill[KS_PSTDERR_CAP];
    memset(fill, '.', sizeof fill);
    for (int k = 0; k < 4; k++) {
        const size_t m = strlen(enc[k]);
        for (int with = 0; with < 2; with++) {
            /* the last 15 characters of the DEK, then fill to the window's end */
            ks_pstderr e = {{0}, 0};
            ks_pstderr_add(&e, enc[k], m, with ? &known : NULL);
            ks_pstderr_add(&e, fill, KS_PSTDERR_CAP - 15, with ? &known : NULL);
            assert_int_equal(e.len, KS_PSTDERR_CAP);
            ks_pstderr_show(&e, out, sizeof out);
            assert_null(strstr(out, enc[k] + m - 15));
            assert_null(strstr(out, enc[k] + m - 8));
            assert_memory_equal(out, "[redacted]...", 13);
            /* split between two writes, the window cut after it */
            ks_pstderr f = {{0}, 0};
            ks_pstderr_add(&f, fill, 900, with ? &known : NULL);
            ks_pstderr_add(&f, enc[k], 10, with ? &known : NULL);
            ks_pstderr_add(&f, enc[k] + 10, m - 10, with ? &known : NULL);
            ks_pstderr_add(&f, fill, 300, with ? &known : NULL);
            ks_pstderr_show(&f, out, sizeof out);
            assert_null(strstr(out, "ABCDEFGH"));
            assert_null(memmem(out, strlen(out), enc[k] + 20, 8));
            assert_non_null(strstr(out, "[redacted]"));
        }
    }
    /* a known raw DEK of any bytes is masked, not shown as '?'s around printable ones */
    randombytes_buf(dek, sizeof dek);
    dek[0] = 'Q';
    dek[1] = 'Z';
    ks_pdeks_note(&known, dek);
    ks_pstderr g = {{0}, 0};
    ks_pstderr_add(&g, ": ", 2, &known);
    ks_pstderr_add(&g, (const char *)dek, 2, &known);
    ks_pstderr_add(&g, (const char *)dek + 2, KS_DEK_LEN - 2, &known);
    ks_pstderr_add(&g, " :", 2, &known);
    ks_pstderr_show(&g, out, sizeof out);
    assert_string_equal(out, ": [redacted] :");
    sodium_memzero(&known, sizeof known);
}

/* ---- what a plugin receives [KP-SEC-1] ------------------------------------------------------ */

/* The fault plugin's environment at its last start (DIR/env), as
 * "\nNAME=value" lines (a leading LF, so "\nNAME=" finds a name). */
static void plugin_env_text(const pfix *p, char *out, size_t cap)
{
    char path[256];
    snprintf(path, sizeof path, "%s/env", p->f->dir);
    FILE *fp = fopen(path, "r");
    assert_non_null(fp);
    out[0] = '\n';
    const size_t n = fread(out + 1, 1, cap - 2, fp);
    out[n + 1] = '\0';
    fclose(fp);
}

/* A plugin gets PATH, HOME, LANG, LC_*, TZ and TMPDIR and what the
 * configuration names or prefixes, never a variable of env_secret nor
 * KEYSHIFT_PASSPHRASE even when named, and no other of keyshift's: not
 * PGPASSWORD, DATABASE_URL or a PIN.  (An interpreter's launcher, such as
 * a version manager's shim, may add variables of its own; those are not
 * keyshift's and not looked at.) */
static void test_env_allow_list(void **state)
{
    pfix *p = *state;
    static const char *const set[][2] = {
        {"KEYSHIFT_PASSPHRASE", "keyring-pass"}, {"PGPASSWORD", "pg-pass"},
        {"DATABASE_URL", "postgres://u:pw@db/x"}, {"HSM_PIN", "1234"},
        {"AWS_REGION", "eu-west-1"}, {"AWS_SECRET_ACCESS_KEY", "aws-secret"},
        {"LC_ALL", "C"}, {"TZ", "UTC"}, {"NAMED_ONE", "n1"}, {"AWSX", "not-a-prefix-match"},
        {"SERVICE_TOKEN", "unlisted-token"},
    };
    for (size_t i = 0; i < sizeof set / sizeof set[0]; i++) {
        assert_int_equal(setenv(set[i][0], set[i][1], 1), 0);
    }
    static const char *const env[] = {"KEYSHIFT_KMS_EXAMPLE_KEYS", "KEYSHIFT_FAULT_DIR", "NAMED_ONE",
                                      "HSM_PIN", "KEYSHIFT_PASSPHRASE"};
    static const char *const prefixes[] = {"AWS_"};
    static const char *const secret[] = {"HSM_PIN"};
    ks_plugin_config c = quick(p);
    c.env = env;
    c.nenv = 5;
    c.env_prefixes = prefixes;
    c.nenv_prefixes = 1;
    c.env_secret = secret;
    c.nenv_secret = 1;
    ks_provider prov;
    start(p, "", &c, &prov);
    char text[16384];
    plugin_env_text(p, text, sizeof text);
    static const char *const want[] = {"\nKEYSHIFT_FAULT_DIR=", "\nKEYSHIFT_KMS_EXAMPLE_KEYS=", "\nNAMED_ONE=n1\n",
                                       "\nAWS_REGION=eu-west-1\n", "\nAWS_SECRET_ACCESS_KEY=aws-secret\n",
                                       "\nLC_ALL=C\n", "\nTZ=UTC\n", "\nPATH="};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        if (strstr(text, want[i]) == NULL) {
            fail_msg("%s not passed to the plugin", want[i] + 1);
        }
    }
    static const char *const never[] = {"keyring-pass", "pg-pass", "pw@db", "=1234", "not-a-prefix-match",
                                        "unlisted-token"};
    for (size_t i = 0; i < sizeof never / sizeof never[0]; i++) {
        if (strstr(text, never[i]) != NULL) {
            fail_msg("the plugin received %s", never[i]);
        }
    }
    ks_provider_destroy(&prov);
    /* names outside [A-Za-z_][A-Za-z0-9_]*, or too many, are refused */
    static const char *const bad[] = {"AWS-REGION"};
    c.env = bad;
    c.nenv = 1;
    assert_int_equal(ks_plugin_open(&c, &prov, NULL), KS_ERR_INVALID_ARGUMENT);
    c.env = env;
    c.nenv = KS_PLUGIN_ENV_MAX + 1;
    assert_int_equal(ks_plugin_open(&c, &prov, NULL), KS_ERR_INVALID_ARGUMENT);
    for (size_t i = 0; i < sizeof set / sizeof set[0]; i++) {
        unsetenv(set[i][0]);
    }
}

/* ---- process groups ----------------------------------------------------------------------- */

/* Whether the process DIR/child names is gone (or a zombie awaiting its
 * reaper), waiting up to 3 s. */
static int child_gone(const pfix *p)
{
    char path[256], stat[512];
    snprintf(path, sizeof path, "%s/child", p->f->dir);
    FILE *fp = fopen(path, "r");
    assert_non_null(fp);
    long pid = 0;
    assert_int_equal(fscanf(fp, "%ld", &pid), 1);
    fclose(fp);
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    for (int i = 0; i < 300; i++) {
        fp = fopen(path, "r");
        if (fp == NULL) {
            return 1;
        }
        const size_t n = fread(stat, 1, sizeof stat - 1, fp);
        fclose(fp);
        stat[n] = '\0';
        const char *end = strrchr(stat, ')');
        if (end != NULL && end[1] == ' ' && (end[2] == 'Z' || end[2] == 'X')) {
            return 1;
        }
        const struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
    }
    kill((pid_t)pid, SIGKILL); /* leave nothing behind */
    return 0;
}

/* A plugin that starts a child and hangs past the deadline: the kill
 * takes its whole process group, the child too; and a child left by a
 * plugin that exits when closed dies at the close. */
static void test_process_group_killed(void **state)
{
    pfix *p = *state;
    ks_plugin_config c = quick(p);
    c.retries = 0;
    c.timeout_ms = 1000;
    ks_provider prov;
    start(p, "wrap spawn-hang 1\n", &c, &prov);
    uint8_t w[1024];
    size_t n = 0;
    assert_int_equal(wrap(&prov, p, w, &n), KS_ERR_TIMEOUT);
    assert_true(child_gone(p));
    ks_provider_destroy(&prov);
    start(p, "wrap spawn 1\n", &c, &prov);
    assert_int_equal(wrap(&prov, p, w, &n), KS_OK);
    ks_provider_destroy(&prov);
    assert_true(child_gone(p));
}

/* ---- open --------------------------------------------------------------------------- */

/* A missing program, a plugin that dies before hello, one whose hello is
 * garbage or an error, a config outside its limits. */
static void test_open_failures(void **state)
{
    pfix *p = *state;
    ks_plugin_config c = quick(p);
    ks_provider prov;
    ks_plugin_error e;
    c.command = "/nonexistent/keyshift-kms-none";
    assert_int_equal(ks_plugin_open(&c, &prov, &e), KS_ERR_NOT_FOUND);
    assert_string_equal(e.stage, "start");
    c.command = "none-such-plugin";
    assert_int_equal(ks_plugin_open(&c, &prov, &e), KS_ERR_NOT_FOUND);
    c.command = "Bad Name";
    assert_int_equal(ks_plugin_open(&c, &prov, &e), KS_ERR_INVALID_ARGUMENT);
    assert_string_equal(e.stage, "config");
    c = quick(p);
    c.concurrency = 0;
    assert_int_equal(ks_plugin_open(&c, &prov, &e), KS_ERR_INVALID_ARGUMENT);
    c = quick(p);
    plan(p, "hello exit 1\n");
    assert_int_equal(ks_plugin_open(&c, &prov, &e), KS_ERR_UNAVAILABLE);
    assert_string_equal(e.stage, "hello");
    plan(p, "hello garbage 1\n");
    assert_int_equal(ks_plugin_open(&c, &prov, &e), KS_ERR_INTEGRITY);
    assert_string_equal(e.reason, "bad-json");
    plan(p, "hello error:denied 1\n");
    assert_int_equal(ks_plugin_open(&c, &prov, &e), KS_ERR_DENIED);
    assert_string_equal(e.message, "fault plugin: denied");
    assert_null(prov.ops);
}

/* ---- the rate limit, the concurrency cap ------------------------------------------------ */

/* With a limit of R requests/s, no window of one second at the plugin
 * holds more than R requests [KP-BRIDGE-7]. */
static void test_rate_limit(void **state)
{
    pfix *p = *state;
    ks_plugin_config c = quick(p);
    c.rate_limit = 20;
    ks_provider prov;
    start(p, "", &c, &prov);
    ks_key_info ki;
    for (int i = 0; i < 45; i++) {
        assert_int_equal(info(&prov, &ki), KS_OK);
    }
    ks_plugin_stats s = stats(&prov, p->dek);
    assert_true(s.rate_waits >= 40);
    ks_provider_destroy(&prov);
    char path[256];
    snprintf(path, sizeof path, "%s/log", p->f->dir);
    FILE *fp = fopen(path, "r");
    assert_non_null(fp);
    unsigned long long t[64];
    size_t n = 0;
    long pid;
    char op[32], id[32], fault[64];
    while (n < 64 && fscanf(fp, "%llu %ld %31s %31s %63s", &t[n], &pid, op, id, fault) == 5) {
        if (strcmp(op, "key-info") == 0) {
            n++;
        }
    }
    fclose(fp);
    assert_int_equal(n, 45);
    for (size_t i = 0; i + 20 < n; i++) {
        /* requests i and i + 20 are 21 requests: more than one second apart */
        assert_true(t[i + 20] - t[i] > 1000000000ull);
    }
}

/* Threads sharing one provider: at most `concurrency` processes, every
 * call served. */
typedef struct worker {
    ks_provider *prov;
    int failures;
} worker;

/* A thread of test_concurrency: ten key_info calls. */
static void *work(void *arg)
{
    worker *w = arg;
    ks_key_info ki;
    for (int i = 0; i < 10; i++) {
        if (w->prov->ops->key_info(w->prov->self, key_id, 0, &ki, 0) != KS_OK) {
            w->failures++;
        }
    }
    return NULL;
}

/* See work(). */
static void test_concurrency(void **state)
{
    pfix *p = *state;
    ks_plugin_config c = quick(p);
    c.concurrency = 2;
    ks_provider prov;
    start(p, "key-info slow:20 *\n", &c, &prov);
    pthread_t th[6];
    worker w[6];
    for (int i = 0; i < 6; i++) {
        w[i] = (worker){&prov, 0};
        assert_int_equal(pthread_create(&th[i], NULL, work, &w[i]), 0);
    }
    for (int i = 0; i < 6; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(w[i].failures, 0);
    }
    size_t pids = 0;
    assert_int_equal(log_lines(p, "key-info", &pids), 60);
    assert_int_equal(pids, 2);
    ks_plugin_stats s = stats(&prov, p->dek);
    assert_int_equal(s.starts, 2);
    ks_provider_destroy(&prov);
}

/* In a child after fork() the provider fails closed and leaves the
 * parent's plugin alone; the parent goes on. */
static void test_fork(void **state)
{
    pfix *p = *state;
    ks_plugin_config c = quick(p);
    ks_provider prov;
    start(p, "", &c, &prov);
    const pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        ks_key_info ki;
        const int bad = info(&prov, &ki) != KS_ERR_UNAVAILABLE;
        ks_provider_destroy(&prov);
        _exit(bad);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    ks_key_info ki;
    assert_int_equal(info(&prov, &ki), KS_OK);
    ks_provider_destroy(&prov);
}

/* ---- stderr redaction --------------------------------------------------------------- */

/* The redaction rule of ks_pstderr_show, and the bound on what is kept. */
static void test_stderr_show(void **state)
{
    (void)state;
    ks_pstderr e = {{0}, 0};
    char out[KS_PSTDERR_CAP * 4];
    const char text[] = "error: ThrottlingException for arn:aws:kms:us-east-1:111122223333:key/1234abcd\n"
                        "dek AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8= hex 000102030405060708090a0b0c0d0e0f\tend\n";
    ks_pstderr_add(&e, text, sizeof text - 1, NULL);
    ks_pstderr_show(&e, out, sizeof out);
    assert_string_equal(out, "error: [redacted] for arn:aws:kms:us-east-1:111122223333:key/1234abcd | "
                             "dek [redacted] hex [redacted]?end");
    char big[3000];
    memset(big, '.', sizeof big);
    memcpy(big + sizeof big - 4, "tail", 4);
    ks_pstderr_add(&e, big, sizeof big, NULL);
    assert_int_equal(e.len, KS_PSTDERR_CAP);
    ks_pstderr_show(&e, out, sizeof out);
    assert_int_equal(strlen(out), KS_PSTDERR_CAP);
    assert_string_equal(out + KS_PSTDERR_CAP - 4, "tail");
    ks_pstderr_show(&e, out, 5);
    assert_string_equal(out, "....");
}

int main(void)
{
    if (sodium_init() < 0) {
        return 1;
    }
    signal(SIGPIPE, SIG_DFL); /* the provider must never raise it */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stderr_show),
        cmocka_unit_test(test_stderr_window_edge),
        cmocka_unit_test_setup_teardown(test_round_trip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_hang_once, setup, teardown),
        cmocka_unit_test_setup_teardown(test_exit_and_midline, setup, teardown),
        cmocka_unit_test_setup_teardown(test_slow, setup, teardown),
        cmocka_unit_test_setup_teardown(test_hang_always, setup, teardown),
        cmocka_unit_test_setup_teardown(test_throttled, setup, teardown),
        cmocka_unit_test_setup_teardown(test_error_classes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refused_lines, setup, teardown),
        cmocka_unit_test_setup_teardown(test_duplicate, setup, teardown),
        cmocka_unit_test_setup_teardown(test_leaks_not_shown, setup, teardown),
        cmocka_unit_test_setup_teardown(test_leaks_every_spelling, setup, teardown),
        cmocka_unit_test_setup_teardown(test_env_allow_list, setup, teardown),
        cmocka_unit_test_setup_teardown(test_process_group_killed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_open_failures, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rate_limit, setup, teardown),
        cmocka_unit_test_setup_teardown(test_concurrency, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fork, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
