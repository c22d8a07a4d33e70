/*
 * tools/bench.c -- `make bench`: measured speed, as ratios against a
 * baseline run in the same process, printed as JSON lines.
 *
 * Envelope parsing: the strict parser (ks_envelope_parse) against nanopb's
 * pb_decode of the same body bytes, on the typical envelope of the issue
 * (v1, 12-byte tenant, 72-byte wrapped DEK, 2 KiB of data).  Heap
 * allocations are counted by wrapping malloc and friends at link time
 * (-Wl,--wrap), which covers every object linked into this program,
 * libkeyshift and nanopb included.
 *
 * Sealing and opening: ks_seal / ks_open with a cached DEK (the write
 * side's active DEK, the read side's DEK cache) over the local keyring,
 * against the raw libsodium AEAD call on the same sizes, for each
 * algorithm and format.
 *
 * Timing: each measurement is the median of ROUNDS rounds, the contender
 * and its baseline interleaved round by round so that frequency changes
 * and noise from the other core hit both alike.  The number of calls per
 * round is calibrated so that a round lasts about ROUND_NS.
 */
#define _DEFAULT_SOURCE /* clock_gettime, mkdtemp */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <pb_decode.h>
#include <pb_encode.h>
#include <sodium.h>

#include <keyshift/keyshift.h>

#include "envelope.pb.h"

#define ROUNDS 11
#define ROUND_NS 8e6 /* each round runs about this long */

/* ---- allocation counting (-Wl,--wrap=malloc,...) ----------------------- */

static unsigned long allocs;
void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t m);
void *__real_realloc(void *p, size_t n);
void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t n, size_t m);
void *__wrap_realloc(void *p, size_t n);

/* Count, then allocate. */
void *__wrap_malloc(size_t n)
{
    allocs++;
    return __real_malloc(n);
}

/* Count, then allocate. */
void *__wrap_calloc(size_t n, size_t m)
{
    allocs++;
    return __real_calloc(n, m);
}

/* Count, then reallocate. */
void *__wrap_realloc(void *p, size_t n)
{
    allocs++;
    return __real_realloc(p, n);
}

/* ---- the envelope under test ------------------------------------------ */

static uint8_t envelope[4096];
static size_t envelope_len;

/* Build the typical envelope of the issue with the canonical encoder. */
static void make_envelope(void)
{
    static uint8_t dek[72], nonce[KS_AES256GCM_NONCE_LEN], ct[2048 + KS_TAG_LEN];
    for (size_t i = 0; i < sizeof dek; i++) dek[i] = (uint8_t)(0xA0 + i);
    for (size_t i = 0; i < sizeof nonce; i++) nonce[i] = (uint8_t)i;
    for (size_t i = 0; i < sizeof ct; i++) ct[i] = (uint8_t)(i * 7);
    ks_envelope e = {0};
    e.version = KS_FORMAT_V1;
    e.algorithm = KS_ALG_AES256GCM;
    e.tenant = (ks_bytes){(const uint8_t *)"tenant-00042", 12};
    e.key_id = (ks_bytes){(const uint8_t *)"payments/kek", 12};
    e.key_version = 7;
    e.wrapped_dek = (ks_bytes){dek, sizeof dek};
    e.nonce = (ks_bytes){nonce, sizeof nonce};
    e.ciphertext = (ks_bytes){ct, sizeof ct};
    if (ks_envelope_encode(&e, NULL, envelope, sizeof envelope, &envelope_len) != KS_OK) {
        fprintf(stderr, "bench: cannot encode the test envelope\n");
        exit(1);
    }
}

/* ---- measurement ------------------------------------------------------------ */

/* One operation under test: returns 0 on success. */
typedef int (*op_fn)(void *arg);

static volatile size_t sink; /* keeps results observable */

/* Nanoseconds of monotonic time. */
static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

/* ns per call of fn over iters calls; -1 if any call failed. */
static double round_ns(op_fn fn, void *arg, long iters)
{
    double t0 = now_ns();
    for (long i = 0; i < iters; i++) {
        if (fn(arg) != 0) {
            return -1;
        }
    }
    return (now_ns() - t0) / (double)iters;
}

/* Calls of fn that fill about ROUND_NS, from a short trial. */
static long calibrate(op_fn fn, void *arg)
{
    long iters = 1;
    for (;;) {
        double t0 = now_ns();
        if (round_ns(fn, arg, iters) < 0) {
            return -1;
        }
        double spent = now_ns() - t0;
        if (spent > ROUND_NS / 10 || iters > (1L << 24)) {
            long n = (long)((double)iters * ROUND_NS / (spent > 1 ? spent : 1));
            return n < 1 ? 1 : n;
        }
        iters *= 4;
    }
}

/* qsort comparator for doubles. */
static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Heap allocations per call of fn, over iters calls. */
static double allocs_per_op(op_fn fn, void *arg, long iters)
{
    unsigned long before = allocs;
    for (long i = 0; i < iters; i++) {
        (void)fn(arg);
    }
    return (double)(allocs - before) / (double)iters;
}

/* The result of measuring a contender against its baseline. */
typedef struct pair_result {
    double ns, base_ns, allocs;
} pair_result;

/* Median ns/op of fn and of base, interleaved round by round, and fn's
 * heap allocations per call.  -1 in ns when a call failed. */
static pair_result measure_pair(op_fn fn, void *arg, op_fn base, void *base_arg)
{
    pair_result r = {-1, -1, -1};
    double a[ROUNDS], b[ROUNDS];
    long na = calibrate(fn, arg), nb = calibrate(base, base_arg);
    if (na < 0 || nb < 0) {
        return r;
    }
    for (int i = 0; i < ROUNDS; i++) {
        a[i] = round_ns(fn, arg, na);
        b[i] = round_ns(base, base_arg, nb);
        if (a[i] < 0 || b[i] < 0) {
            return r;
        }
    }
    qsort(a, ROUNDS, sizeof a[0], cmp_double);
    qsort(b, ROUNDS, sizeof b[0], cmp_double);
    r.ns = a[ROUNDS / 2];
    r.base_ns = b[ROUNDS / 2];
    r.allocs = allocs_per_op(fn, arg, na < 1000 ? na : 1000);
    return r;
}

/* ---- envelope parsing: strict parser vs nanopb ------------------------------- */

/* The strict parser: one call, results folded into the sink. */
static int run_ks_parse(void *arg)
{
    (void)arg;
    ks_envelope e;
    if (ks_envelope_parse(envelope, envelope_len, NULL, &e, NULL) != KS_OK) {
        return -1;
    }
    sink += e.ciphertext.len + e.key_version + e.tenant.len;
    return 0;
}

/* nanopb ciphertext callback: record a zero-copy view and skip the bytes,
 * the same work the strict parser does for the payload. */
static bool ct_view(pb_istream_t *stream, const pb_field_t *field, void **arg)
{
    (void)field;
    ks_bytes *v = *arg;
    v->ptr = stream->state; /* a buffer stream's state is its read position */
    v->len = stream->bytes_left;
    return pb_read(stream, NULL, stream->bytes_left);
}

/* nanopb: decode the body of the same envelope into its generated struct. */
static int run_nanopb_parse(void *arg)
{
    (void)arg;
    keyshift_EnvelopeV1 m = keyshift_EnvelopeV1_init_zero;
    ks_bytes ct = {0};
    m.ciphertext.funcs.decode = ct_view;
    m.ciphertext.arg = &ct;
    pb_istream_t s = pb_istream_from_buffer(envelope + KS_PREFIX_LEN, envelope_len - KS_PREFIX_LEN);
    if (!pb_decode(&s, keyshift_EnvelopeV1_fields, &m)) {
        return -1;
    }
    sink += ct.len + m.key_version + m.tenant.size;
    return 0;
}

/* Measure and print the parser comparison. */
static int bench_parse(void)
{
    make_envelope();
    pair_result r = measure_pair(run_ks_parse, NULL, run_nanopb_parse, NULL);
    if (r.ns < 0) {
        fprintf(stderr, "bench: a parser rejected the test envelope\n");
        return 1;
    }
    double ratio = r.base_ns / r.ns;
    printf("{\"bench\":\"parse\",\"impl\":\"ks_envelope_parse\",\"envelope_bytes\":%zu,\"ns_per_op\":%.1f,"
           "\"allocs_per_op\":%.0f}\n", envelope_len, r.ns, r.allocs);
    printf("{\"bench\":\"parse\",\"impl\":\"nanopb_pb_decode\",\"envelope_bytes\":%zu,\"ns_per_op\":%.1f}\n",
           envelope_len, r.base_ns);
    printf("{\"bench\":\"parse\",\"ratio\":\"nanopb_ns/ks_ns\",\"value\":%.2f,\"goal\":5,"
           "\"ks_allocs_per_op\":%.0f,\"pass\":%s}\n", ratio, r.allocs,
           ratio >= 5.0 && r.allocs == 0 ? "true" : "false");
    return 0;
}

/* ---- sealing and opening: ks vs raw libsodium -------------------------------- */

#define MAX_PT ((size_t)1 << 20)

/* State of one seal/open measurement. */
typedef struct crypt_case {
    ks_ctx *ctx;
    ks_seal_params sp;
    ks_open_params op;
    uint32_t alg;
    size_t n;                 /* plaintext bytes */
    uint8_t *pt, *out, *env;  /* plaintext, scratch output, a sealed envelope */
    size_t env_len, cap;
    uint8_t key[32], nonce[24]; /* raw sealing: nonce is a counter */
    uint8_t open_nonce[24];     /* the nonce of raw_ct */
    uint8_t *raw_ct;            /* a raw AEAD ciphertext of pt */
} crypt_case;

/* ks_seal of n bytes into the scratch buffer. */
static int run_seal(void *arg)
{
    crypt_case *c = arg;
    size_t len;
    if (ks_seal(c->ctx, &c->sp, c->pt, c->n, c->out, c->cap, &len) != KS_OK) {
        return -1;
    }
    sink += len;
    return 0;
}

/* ks_open of the prepared envelope. */
static int run_open(void *arg)
{
    crypt_case *c = arg;
    size_t len;
    if (ks_open(c->ctx, c->env, c->env_len, &c->op, c->out, c->cap, &len, NULL) != KS_OK) {
        return -1;
    }
    sink += len;
    return 0;
}

/* Raw AEAD encrypt with a counter nonce: the least any sealer must do. */
static int run_raw_seal(void *arg)
{
    crypt_case *c = arg;
    unsigned long long len;
    c->nonce[0]++;
    int r = c->alg == KS_ALG_AES256GCM
                ? crypto_aead_aes256gcm_encrypt(c->out, &len, c->pt, c->n, NULL, 0, NULL, c->nonce, c->key)
                : crypto_aead_xchacha20poly1305_ietf_encrypt(c->out, &len, c->pt, c->n, NULL, 0, NULL,
                                                             c->nonce, c->key);
    sink += (size_t)len;
    return r;
}

/* Raw AEAD decrypt of a prepared ciphertext. */
static int run_raw_open(void *arg)
{
    crypt_case *c = arg;
    unsigned long long len;
    int r = c->alg == KS_ALG_AES256GCM
                ? crypto_aead_aes256gcm_decrypt(c->out, &len, NULL, c->raw_ct, c->n + KS_TAG_LEN, NULL, 0,
                                                c->open_nonce, c->key)
                : crypto_aead_xchacha20poly1305_ietf_decrypt(c->out, &len, NULL, c->raw_ct,
                                                             c->n + KS_TAG_LEN, NULL, 0, c->open_nonce,
                                                             c->key);
    sink += (size_t)len;
    return r;
}

/* Print one seal or open line with its ratio and goal. */
static void print_crypt(const char *op, const crypt_case *c, uint8_t format, pair_result r)
{
    double ratio = r.base_ns / r.ns; /* throughput of ks relative to raw */
    double goal = c->n >= 2048 ? 0.90 : 0.75;
    printf("{\"bench\":\"%s\",\"format\":%u,\"algorithm\":\"%s\",\"bytes\":%zu,\"ks_ns\":%.1f,"
           "\"raw_ns\":%.1f,\"ratio\":%.3f,\"goal\":%.2f,\"allocs_per_op\":%.0f,\"pass\":%s}\n",
           op, format, ks_alg_name(c->alg), c->n, r.ns, r.base_ns, ratio, goal, r.allocs,
           ratio >= goal && r.allocs == 0 ? "true" : "false");
}

/* Seal and open n bytes with (format, alg), each against raw libsodium. */
static int bench_crypt_case(ks_ctx *ctx, uint8_t format, uint32_t alg, size_t n, uint8_t *pt,
                            uint8_t *out, uint8_t *env, uint8_t *raw_ct)
{
    crypt_case c = {0};
    c.ctx = ctx;
    c.alg = alg;
    c.n = n;
    c.pt = pt;
    c.out = out;
    c.env = env;
    c.raw_ct = raw_ct;
    c.sp = (ks_seal_params){format, alg, {(const uint8_t *)"tenant-00042", 12},
                            {(const uint8_t *)"bench/kek", 9}, 0,
                            format == KS_FORMAT_V2 ? (ks_bytes){(const uint8_t *)"card", 4} : (ks_bytes){0},
                            {(const uint8_t *)"payments:42:card", 16}};
    c.op = (ks_open_params){c.sp.context, {NULL, 0}, {NULL, 0}};
    c.cap = ks_seal_max_len(&c.sp, MAX_PT);
    randombytes_buf(c.key, sizeof c.key);
    randombytes_buf(c.nonce, sizeof c.nonce);
    if (ks_seal(ctx, &c.sp, pt, n, env, c.cap, &c.env_len) != KS_OK || run_raw_seal(&c) != 0) {
        return -1;
    }
    memcpy(raw_ct, out, n + KS_TAG_LEN);
    memcpy(c.open_nonce, c.nonce, sizeof c.nonce);
    pair_result s = measure_pair(run_seal, &c, run_raw_seal, &c);
    pair_result o = measure_pair(run_open, &c, run_raw_open, &c);
    if (s.ns < 0 || o.ns < 0) {
        return -1;
    }
    print_crypt("seal", &c, format, s);
    print_crypt("open", &c, format, o);
    return 0;
}

/* A throw-away local keyring with one key, and a context over it. */
static int bench_keyring(char *dir, size_t dir_cap, ks_keyring **kr, ks_ctx **ctx)
{
    char path[512];
    ks_provider prov;
    snprintf(dir, dir_cap, "%s/keyshift-bench-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (mkdtemp(dir) == NULL) {
        return -1;
    }
    snprintf(path, sizeof path, "%s/keyring", dir);
    if (ks_keyring_init(path, (ks_bytes){NULL, 0}) != KS_OK ||
        ks_keyring_open(path, (ks_bytes){NULL, 0}, kr, NULL) != KS_OK ||
        ks_keyring_create(*kr, (ks_bytes){(const uint8_t *)"bench/kek", 9}) != KS_OK ||
        ks_keyring_provider(*kr, &prov) != KS_OK || ks_ctx_new(&prov, NULL, ctx) != KS_OK) {
        return -1;
    }
    return 0;
}

/* Remove the throw-away keyring. */
static void bench_keyring_remove(const char *dir)
{
    char path[600];
    static const char *const names[] = {"keyring", "keyring.lock"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        unlink(path);
    }
    rmdir(dir);
}

/* Every (format, algorithm, size) case. */
static int bench_crypt(void)
{
    static const size_t sizes[] = {128, 2048, 16384, MAX_PT};
    char dir[256];
    ks_keyring *kr = NULL;
    ks_ctx *ctx = NULL;
    int rc = -1;
    uint8_t *pt = malloc(MAX_PT), *out = malloc(MAX_PT + 4096), *env = malloc(MAX_PT + 4096),
            *raw = malloc(MAX_PT + KS_TAG_LEN);
    if (pt == NULL || out == NULL || env == NULL || raw == NULL || bench_keyring(dir, sizeof dir, &kr, &ctx) != 0) {
        fprintf(stderr, "bench: cannot set up the keyring\n");
        goto done;
    }
    randombytes_buf(pt, MAX_PT);
    for (uint8_t format = KS_FORMAT_V1; format <= KS_FORMAT_V2; format++) {
        for (uint32_t alg = KS_ALG_AES256GCM; alg <= KS_ALG_XCHACHA20POLY1305; alg++) {
            if (alg == KS_ALG_AES256GCM && !crypto_aead_aes256gcm_is_available()) {
                printf("{\"bench\":\"seal\",\"algorithm\":\"aes-256-gcm\",\"skipped\":\"no AES-NI\"}\n");
                continue;
            }
            for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
                if (bench_crypt_case(ctx, format, alg, sizes[i], pt, out, env, raw) != 0) {
                    fprintf(stderr, "bench: seal/open failed\n");
                    goto done;
                }
            }
        }
    }
    ks_metrics m;
    ks_ctx_metrics(ctx, &m);
    printf("{\"bench\":\"crypt-metrics\",\"seals\":%llu,\"opens\":%llu,\"deks_created\":%llu,"
           "\"wraps\":%llu,\"unwraps\":%llu,\"cache_hits\":%llu,\"cache_misses\":%llu}\n",
           (unsigned long long)m.seals, (unsigned long long)m.opens, (unsigned long long)m.deks_created,
           (unsigned long long)m.wraps, (unsigned long long)m.unwraps, (unsigned long long)m.cache_hits,
           (unsigned long long)m.cache_misses);
    rc = 0;
done:
    ks_ctx_free(ctx);
    ks_keyring_close(kr);
    if (kr != NULL) {
        bench_keyring_remove(dir);
    }
    free(pt);
    free(out);
    free(env);
    free(raw);
    return rc;
}

/* ---- main ---------------------------------------------------------------------- */

/* The CPU model from /proc/cpuinfo, for the record. */
static void cpu_model(char *out, size_t cap)
{
    snprintf(out, cap, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f == NULL) {
        return;
    }
    char line[256];
    while (fgets(line, sizeof line, f) != NULL) {
        char *colon = strchr(line, ':');
        if (strncmp(line, "model name", 10) == 0 && colon != NULL) {
            snprintf(out, cap, "%s", colon + 2);
            out[strcspn(out, "\n\"\\")] = '\0';
            break;
        }
    }
    fclose(f);
}

int main(int argc, char **argv)
{
    char cpu[128];
    const char *only = argc > 1 ? argv[1] : NULL; /* "parse" or "crypt" */
    if (sodium_init() < 0) {
        fprintf(stderr, "bench: sodium_init failed\n");
        return 1;
    }
    cpu_model(cpu, sizeof cpu);
    printf("{\"bench\":\"env\",\"cpu\":\"%s\",\"compiler\":\"%s\",\"libkeyshift\":\"%s\",\"nanopb\":\"%s\","
           "\"libsodium\":\"%s\",\"aesni\":%s}\n",
           cpu, __VERSION__, ks_version(), NANOPB_VERSION, sodium_version_string(),
           crypto_aead_aes256gcm_is_available() ? "true" : "false");
    if ((only == NULL || strcmp(only, "parse") == 0) && bench_parse() != 0) {
        return 1;
    }
    if ((only == NULL || strcmp(only, "crypt") == 0) && bench_crypt() != 0) {
        return 1;
    }
    return 0;
}
