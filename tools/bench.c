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
 * Timing: each measurement is the median of ROUNDS rounds of ITERS calls,
 * the two implementations interleaved round by round so that frequency
 * changes and noise from the other core hit both alike.
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <pb_decode.h>
#include <pb_encode.h>

#include <keyshift/keyshift.h>

#include "envelope.pb.h"

#define ROUNDS 21
#define ITERS 100000

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

/* ---- the two parsers ------------------------------------------------------ */

static volatile size_t sink; /* keeps results observable */

/* The strict parser: one call, results folded into the sink. */
static int run_ks(void)
{
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
static int run_nanopb(void)
{
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

/* Nanoseconds of monotonic time. */
static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

/* ns per call of fn over ITERS calls; -1 if any call failed. */
static double round_ns(int (*fn)(void))
{
    double t0 = now_ns();
    for (int i = 0; i < ITERS; i++) {
        if (fn() != 0) {
            return -1;
        }
    }
    return (now_ns() - t0) / ITERS;
}

/* qsort comparator for doubles. */
static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Heap allocations per call of fn, over ITERS calls. */
static double allocs_per_op(int (*fn)(void))
{
    unsigned long before = allocs;
    for (int i = 0; i < ITERS; i++) {
        (void)fn();
    }
    return (double)(allocs - before) / ITERS;
}

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

int main(void)
{
    double ks[ROUNDS], pb[ROUNDS];
    char cpu[128];

    make_envelope();
    cpu_model(cpu, sizeof cpu);
    printf("{\"bench\":\"env\",\"cpu\":\"%s\",\"compiler\":\"%s\",\"libkeyshift\":\"%s\",\"nanopb\":\"%s\"}\n",
           cpu, __VERSION__, ks_version(), NANOPB_VERSION);

    /* Warm up both, and check both accept the input. */
    if (round_ns(run_ks) < 0 || round_ns(run_nanopb) < 0) {
        fprintf(stderr, "bench: a parser rejected the test envelope\n");
        return 1;
    }
    for (int r = 0; r < ROUNDS; r++) {
        ks[r] = round_ns(run_ks);
        pb[r] = round_ns(run_nanopb);
    }
    qsort(ks, ROUNDS, sizeof ks[0], cmp_double);
    qsort(pb, ROUNDS, sizeof pb[0], cmp_double);
    double ks_med = ks[ROUNDS / 2], pb_med = pb[ROUNDS / 2];
    double ks_alloc = allocs_per_op(run_ks), pb_alloc = allocs_per_op(run_nanopb);
    double ratio = pb_med / ks_med;

    printf("{\"bench\":\"parse\",\"impl\":\"ks_envelope_parse\",\"envelope_bytes\":%zu,\"ns_per_op\":%.1f,"
           "\"allocs_per_op\":%.0f}\n", envelope_len, ks_med, ks_alloc);
    printf("{\"bench\":\"parse\",\"impl\":\"nanopb_pb_decode\",\"envelope_bytes\":%zu,\"ns_per_op\":%.1f,"
           "\"allocs_per_op\":%.0f}\n", envelope_len, pb_med, pb_alloc);
    int pass = ratio >= 5.0 && ks_alloc == 0;
    printf("{\"bench\":\"parse\",\"ratio\":\"nanopb_ns/ks_ns\",\"value\":%.2f,\"goal\":5,"
           "\"ks_allocs_per_op\":%.0f,\"pass\":%s}\n", ratio, ks_alloc, pass ? "true" : "false");
    return 0;
}
