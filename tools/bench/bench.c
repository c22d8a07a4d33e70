/*
 * tools/bench/bench.c -- `make bench`: measured speed, as ratios against a
 * baseline run in the same process, printed as JSON lines.
 *
 * Envelope parsing: the strict parser (ks_envelope_parse) against nanopb's
 * pb_decode of the same body bytes, on a typical envelope
 * (v1, 12-byte tenant, 72-byte wrapped DEK, 2 KiB of data).  Heap
 * allocations are counted by wrapping malloc and friends at link time
 * (-Wl,--wrap), which covers every object linked into this program,
 * libkeyshift and nanopb included.
 *
 * Sealing and opening: ks_seal / ks_open with a cached DEK (the write
 * side's active DEK, the read side's DEK cache) over the local keyring,
 * for each format (1, 2), algorithm and size (128 B, 2 KiB, 16 KiB,
 * 1 MiB), against what a user would write instead, the faster of two
 * raw calls: libsodium's AEAD (combined mode; AES-256-GCM with its key
 * expanded once, crypto_aead_aes256gcm_beforenm, as the EVP context is
 * keyed once) and OpenSSL's EVP with a context per direction keyed once
 * (XChaCha20-Poly1305: HChaCha20 of the key and a fixed prefix, then
 * EVP's ChaCha20-Poly1305), each on the same plaintext under a random
 * key, with a counter nonce for sealing, and with the same AAD bytes
 * that keyshift authenticates for that envelope (one envelope is sealed,
 * parsed, and its data AAD built with ks_aad_data once at setup, as a
 * user's AAD is fixed per column).  The
 * raw opens decrypt a raw ciphertext made under that AAD.  Goals: ks's
 * throughput at least 0.90 of the fastest raw call's from 2 KiB up and
 * 0.75 at 128 B, with no heap allocation per call.
 *
 * The application API (bench app): tools/bench/bench_app.c.
 *
 * The AEAD engines (bench aead): the library's two engines
 * (migrate/crypto/aead.h) against each other from 16 B to 2 KiB, to check
 * the size rule that picks between them.
 *
 * Thread scaling: ops/s of 1 and 2 threads (the machine's cores) sealing,
 * and opening, through one shared ks_ctx and one DEK (same seal params;
 * one envelope to open), at 128 B and 2 KiB, against raw AEAD threads
 * each with its own key and nonce counter and the same AAD.  Every
 * thread starts at a barrier and counts calls over a fixed wall-time
 * window (THREAD_WINDOW_NS); THREAD_ROUNDS rounds run the four figures
 * (ks 1t, ks 2t, raw 1t, raw 2t) in an order rotating round by round,
 * and each figure is its best round; raw runs on the engine the size rule
 * picks.  speedup = ops/s(2t) / ops/s(1t);
 * goal: ks's speedup at least 0.9 of raw's (inconclusive when raw itself
 * did not scale: the other core was busy).  A last line sums up every
 * crypt goal; failed goals do not make the bench fail.
 *
 * Migrating and census (bench migrate): tools/bench/bench_migrate.c.
 *
 * Timing (parse, seal and open): ROUNDS rounds of contender and baseline,
 * interleaved round by round so that frequency changes and noise from
 * the other core hit both alike; the figure compared is each side's
 * fastest round (noise on a shared VM only ever adds time), the medians
 * are printed for reference.  Seal and open goals are judged on the
 * median of the rounds' paired ratios instead (paired_ratio()): over five
 * runs of one case it moved by 0.05 where the ratio of the fastest rounds
 * moved by 0.6 (docs/PERFORMANCE.md, "Method").  The
 * number of calls per round is calibrated so that a round lasts about
 * ROUND_NS.
 */
#define _DEFAULT_SOURCE /* clock_gettime, mkdtemp */

#include <assert.h>
#include <fcntl.h>
#include <pthread.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <pb_decode.h>
#include <pb_encode.h>
#include <openssl/evp.h>
#include <sodium.h>
#include <sqlite3.h>

#include <keyshift/keyshift.h>

#include "../../migrate/crypto/aead.h"
#include "bench.h"
#include "envelope.pb.h"

#define ROUNDS 41
#define ROUND_NS 2e6 /* each round runs about this long */

/* ---- allocation counting (-Wl,--wrap=malloc,...) ----------------------- */

static atomic_ulong allocs; /* atomic: the thread-scaling part runs threads */
void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t m);
void *__real_realloc(void *p, size_t n);
void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t n, size_t m);
void *__wrap_realloc(void *p, size_t n);

/* Count, then allocate. */
void *__wrap_malloc(size_t n)
{
    atomic_fetch_add_explicit(&allocs, 1, memory_order_relaxed);
    return __real_malloc(n);
}

/* Count, then allocate. */
void *__wrap_calloc(size_t n, size_t m)
{
    atomic_fetch_add_explicit(&allocs, 1, memory_order_relaxed);
    return __real_calloc(n, m);
}

/* Count, then reallocate. */
void *__wrap_realloc(void *p, size_t n)
{
    atomic_fetch_add_explicit(&allocs, 1, memory_order_relaxed);
    return __real_realloc(p, n);
}

/* ---- the envelope under test ------------------------------------------ */

static uint8_t envelope[4096];
static size_t envelope_len;

/* Build the bench's typical envelope with the canonical encoder. */
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


static volatile size_t sink; /* keeps results observable */

/* See bench.h. */
double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

/* See bench.h. */
double now_s(void)
{
    return now_ns() / 1e9;
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

/* Calls of fn that fill about ROUND_NS, from a short trial.  One call
 * first, untimed: a first call may set up state once (the AEAD engine
 * fetches its ciphers and makes its contexts), and timing it would leave
 * every round a call or two long, measuring the clock and cold caches. */
static long calibrate(op_fn fn, void *arg)
{
    long iters = 1;
    if (fn(arg) != 0) {
        return -1;
    }
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

/* See bench.h. */
double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof v[0], cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* Heap allocations per call of fn, over iters calls. */
static double allocs_per_op(op_fn fn, void *arg, long iters)
{
    unsigned long before = atomic_load(&allocs);
    for (long i = 0; i < iters; i++) {
        (void)fn(arg);
    }
    return (double)(atomic_load(&allocs) - before) / (double)iters;
}

/* Calls over which to count allocations: a round's worth, 1 to 1000. */
static long alloc_iters(double ns)
{
    double n = ROUND_NS / (ns > 1 ? ns : 1);
    return n < 1 ? 1 : n > 1000 ? 1000 : (long)n;
}

/* ns/op of n contenders fns[i](args[i]), interleaved round by round
 * (ROUNDS rounds of about ROUND_NS each): each one's fastest round into
 * best[i] (noise on a shared VM only ever adds time, and interleaving
 * gives every side the same quiet moments) and its median into med[i];
 * with rounds, every round's time too, in the order run.  0, or -1 when
 * a call failed. */
static int measure_rounds(const op_fn *fns, void *const *args, int n, double *best, double *med,
                          double (*rounds)[ROUNDS])
{
    double t[3][ROUNDS];
    long iters[3];
    assert(n >= 1 && n <= 3);
    for (int j = 0; j < n; j++) {
        if ((iters[j] = calibrate(fns[j], args[j])) < 0) {
            return -1;
        }
    }
    for (int i = 0; i < ROUNDS; i++) {
        for (int j = 0; j < n; j++) {
            if ((t[j][i] = round_ns(fns[j], args[j], iters[j])) < 0) {
                return -1;
            }
        }
    }
    for (int j = 0; j < n; j++) {
        if (rounds != NULL) {
            memcpy(rounds[j], t[j], sizeof t[j]);
        }
        qsort(t[j], ROUNDS, sizeof t[j][0], cmp_double);
        best[j] = t[j][0];
        med[j] = t[j][ROUNDS / 2];
    }
    return 0;
}

/* ns/op of fn and of base, interleaved (measure_rounds()), and fn's heap
 * allocations per call.  -1 in ns when a call failed. */
pair_result measure_pair(op_fn fn, void *arg, op_fn base, void *base_arg)
{
    pair_result r = {-1, -1, -1, -1, -1};
    const op_fn fns[2] = {fn, base};
    void *const args[2] = {arg, base_arg};
    double best[2], med[2];
    if (measure_rounds(fns, args, 2, best, med, NULL) != 0) {
        return r;
    }
    r = (pair_result){best[0], best[1], med[0], med[1], -1};
    r.allocs = allocs_per_op(fn, arg, alloc_iters(best[0]));
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
#define THREADS_MAX BENCH_THREADS
#define THREAD_MAX_PT 2048       /* the largest thread-scaling size */
#define THREAD_ROUNDS 75         /* rounds of the four thread-scaling figures */
#define THREAD_WINDOW_NS 10e6    /* each thread's counting window per figure */
#define THREAD_CHECK 8           /* calls between clock reads in a window */
#define THREAD_SCALED BENCH_THREAD_SCALED
#define NELEM(a) (sizeof (a) / sizeof (a)[0])

/* State of one seal/open measurement, or of one thread of it: the ks side
 * (ctx, params, a sealed envelope) and the raw side (its own key, counter
 * nonce and ciphertext), over the same plaintext and the same AAD. */
typedef struct crypt_case {
    _Alignas(64) ks_ctx *ctx;   /* each thread's case on cache lines of its own */
    ks_seal_params sp;
    ks_open_params op;
    uint8_t format;
    uint32_t alg;
    size_t n;                   /* plaintext bytes */
    const uint8_t *pt;          /* plaintext */
    uint8_t *out;               /* scratch output, cap bytes */
    const uint8_t *env;         /* an envelope of pt sealed by ks */
    size_t env_len, cap;
    const uint8_t *aad;         /* that envelope's data AAD, also the raw calls' AAD */
    size_t aad_len;
    uint8_t key[32], nonce[24]; /* raw: a random key; nonce = 64-bit counter ctr */
    crypto_aead_aes256gcm_state aes; /* raw aes-256-gcm: key expanded once, as EVP's
                                        context is keyed once */
    uint64_t ctr;
    uint8_t open_nonce[24];     /* the nonce of raw_ct */
    uint8_t *raw_ct;            /* a raw AEAD ciphertext of pt under key, open_nonce, aad */
    /* raw OpenSSL: a context per direction, keyed once (xchacha20-poly1305:
     * with the HChaCha20 subkey of key and a zero nonce prefix), and a
     * 12-byte IV whose last 8 bytes count up */
    EVP_CIPHER_CTX *evp_enc, *evp_dec;
    uint8_t iv[12];
    size_t sink;                /* results kept observable, per thread: a shared
                                   counter would bounce a cache line between
                                   the threads on every call */
} crypt_case;

/* ks_seal of n bytes into the scratch buffer. */
static int run_seal(void *arg)
{
    crypt_case *c = arg;
    size_t len;
    if (ks_seal(c->ctx, &c->sp, c->pt, c->n, c->out, c->cap, &len) != KS_OK) {
        return -1;
    }
    c->sink += len;
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
    c->sink += len;
    return 0;
}

/* Raw AEAD encrypt (combined) of pt with the case's AAD under c's key and
 * nonce into out: libsodium's fastest call for each algorithm
 * (aes-256-gcm with the key expanded once, c->aes). */
static int raw_encrypt(crypt_case *c, uint8_t *out, const uint8_t *nonce)
{
    unsigned long long len;
    int r = c->alg == KS_ALG_AES256GCM
                ? crypto_aead_aes256gcm_encrypt_afternm(out, &len, c->pt, c->n, c->aad, c->aad_len, NULL, nonce,
                                                        &c->aes)
                : crypto_aead_xchacha20poly1305_ietf_encrypt(out, &len, c->pt, c->n, c->aad, c->aad_len, NULL,
                                                             nonce, c->key);
    c->sink += (size_t)len;
    return r;
}

/* Raw AEAD encrypt with a counter nonce: what a user would write instead
 * of ks_seal, given a key and the same AAD. */
static int run_raw_seal(void *arg)
{
    crypt_case *c = arg;
    c->ctr++;
    memcpy(c->nonce, &c->ctr, sizeof c->ctr);
    return raw_encrypt(c, c->out, c->nonce);
}

/* Raw AEAD decrypt (combined) of raw_ct with the same AAD into out, on
 * the calls raw_encrypt makes. */
static int run_raw_open(void *arg)
{
    crypt_case *c = arg;
    unsigned long long len;
    int r = c->alg == KS_ALG_AES256GCM
                ? crypto_aead_aes256gcm_decrypt_afternm(c->out, &len, NULL, c->raw_ct, c->n + KS_TAG_LEN, c->aad,
                                                        c->aad_len, c->open_nonce, &c->aes)
                : crypto_aead_xchacha20poly1305_ietf_decrypt(c->out, &len, NULL, c->raw_ct, c->n + KS_TAG_LEN,
                                                             c->aad, c->aad_len, c->open_nonce, c->key);
    c->sink += (size_t)len;
    return r;
}

/* Raw OpenSSL EVP, the way a user keeps a context: set once per key,
 * then per message the IV, the AAD, the data, the tag.  enc: seal into
 * out (tag after), else open c->raw_ct into out with its tag.  The IV for
 * opening is raw_ct's (open_nonce: all zero), for sealing a counter. */
static int raw_evp(crypt_case *c, int enc)
{
    EVP_CIPHER_CTX *x = enc ? c->evp_enc : c->evp_dec;
    uint8_t iv[12] = {0}, tag[KS_TAG_LEN];
    int n = 0, m = 0;
    if (enc) {
        c->ctr++;
        memcpy(c->iv + 4, &c->ctr, sizeof c->ctr);
        memcpy(iv, c->iv, sizeof iv);
    }
    const uint8_t *in = enc ? c->pt : c->raw_ct;
    if (EVP_CipherInit_ex(x, NULL, NULL, NULL, iv, enc) != 1 ||
        EVP_CipherUpdate(x, NULL, &n, c->aad, (int)c->aad_len) != 1 ||
        EVP_CipherUpdate(x, c->out, &n, in, (int)c->n) != 1) {
        return -1;
    }
    if (!enc) {
        memcpy(tag, c->raw_ct + c->n, sizeof tag);
        if (EVP_CIPHER_CTX_ctrl(x, EVP_CTRL_AEAD_SET_TAG, KS_TAG_LEN, tag) != 1) {
            return -1;
        }
    }
    if (EVP_CipherFinal_ex(x, c->out + n, &m) != 1 ||
        (enc && EVP_CIPHER_CTX_ctrl(x, EVP_CTRL_AEAD_GET_TAG, KS_TAG_LEN, c->out + c->n) != 1)) {
        return -1;
    }
    c->sink += (size_t)n;
    return 0;
}

/* Raw OpenSSL seal with a counter IV. */
static int run_evp_seal(void *arg)
{
    return raw_evp(arg, 1);
}

/* Raw OpenSSL open of raw_ct. */
static int run_evp_open(void *arg)
{
    return raw_evp(arg, 0);
}

/* c's raw OpenSSL contexts, keyed with c->key (see crypt_case); 0 on
 * success. */
static int evp_init(crypt_case *c)
{
    static const uint8_t zero16[16];
    uint8_t sub[32];
    const int aes = c->alg == KS_ALG_AES256GCM;
    const EVP_CIPHER *cipher = aes ? EVP_aes_256_gcm() : EVP_chacha20_poly1305();
    if (!aes) {
        crypto_core_hchacha20(sub, zero16, c->key, NULL);
    }
    c->evp_enc = EVP_CIPHER_CTX_new();
    c->evp_dec = EVP_CIPHER_CTX_new();
    memset(c->iv, 0, sizeof c->iv);
    return c->evp_enc != NULL && c->evp_dec != NULL &&
                   EVP_CipherInit_ex(c->evp_enc, cipher, NULL, aes ? c->key : sub, NULL, 1) == 1 &&
                   EVP_CipherInit_ex(c->evp_dec, cipher, NULL, aes ? c->key : sub, NULL, 0) == 1
               ? 0
               : -1;
}

/* Free c's raw OpenSSL contexts. */
static void evp_free(crypt_case *c)
{
    EVP_CIPHER_CTX_free(c->evp_enc);
    EVP_CIPHER_CTX_free(c->evp_dec);
    c->evp_enc = c->evp_dec = NULL;
}

/* Give c its own raw side: scratch out, a random key, a counter nonce
 * from zero and a raw ciphertext of pt under them (into raw_ct, n + 16
 * bytes); then check that both sides open to pt.  0 on success. */
static int raw_init(crypt_case *c, uint8_t *out, uint8_t *raw_ct)
{
    c->out = out;
    c->raw_ct = raw_ct;
    c->ctr = 0;
    randombytes_buf(c->key, sizeof c->key);
    if (c->alg == KS_ALG_AES256GCM) {
        (void)crypto_aead_aes256gcm_beforenm(&c->aes, c->key); /* always 0 */
    }
    memset(c->nonce, 0, sizeof c->nonce);
    memcpy(c->open_nonce, c->nonce, sizeof c->nonce);
    if (raw_encrypt(c, raw_ct, c->open_nonce) != 0 || run_raw_open(c) != 0 ||
        memcmp(c->out, c->pt, c->n) != 0 || run_open(c) != 0 || memcmp(c->out, c->pt, c->n) != 0 ||
        evp_init(c) != 0 || run_evp_open(c) != 0 || memcmp(c->out, c->pt, c->n) != 0) {
        return -1;
    }
    return 0;
}

/*
 * Set up c for sealing n bytes of pt with (format, alg) over ctx: seal
 * one envelope into env (env and out hold buf_cap bytes each, which must
 * reach ks_seal_max_len), parse it and write its data AAD into aad (KS_DATA_AAD_MAX bytes) the
 * way ks_aad_data builds it for the reader, then the raw side (raw_init).
 * The first seal also makes the tuple's active DEK, and the check's open
 * caches it, so the measured calls all reuse one DEK.  0 on success.
 */
static int crypt_case_init(crypt_case *c, ks_ctx *ctx, uint8_t format, uint32_t alg, size_t n,
                           const uint8_t *pt, uint8_t *out, uint8_t *env, size_t buf_cap, uint8_t *aad,
                           uint8_t *raw_ct)
{
    ks_envelope e;
    *c = (crypt_case){.ctx = ctx, .format = format, .alg = alg, .n = n, .pt = pt};
    c->sp = (ks_seal_params){format, alg, {(const uint8_t *)"tenant-00042", 12},
                             {(const uint8_t *)"bench/kek", 9}, 0,
                             format == KS_FORMAT_V2 ? (ks_bytes){(const uint8_t *)"card", 4} : (ks_bytes){0},
                             {(const uint8_t *)"payments:42:card", 16}};
    c->op = (ks_open_params){c->sp.context, {NULL, 0}, {NULL, 0}};
    c->cap = ks_seal_max_len(&c->sp, n);
    if (c->cap == 0 || c->cap > buf_cap || ks_seal(ctx, &c->sp, pt, n, env, c->cap, &c->env_len) != KS_OK ||
        ks_envelope_parse(env, c->env_len, NULL, &e, NULL) != KS_OK ||
        ks_aad_data(&e, c->sp.context, aad, KS_DATA_AAD_MAX, &c->aad_len) != KS_OK) {
        return -1;
    }
    c->env = env;
    c->aad = aad;
    return raw_init(c, out, raw_ct);
}

/* Case names as the body of a JSON array: strings, comma separated. */
typedef struct name_list {
    char s[8192];
    size_t len;
} name_list;

/* The running count of crypt goals, for the summary line. */
typedef struct crypt_tally {
    int cases, passed;
    name_list failed, inconclusive;
} crypt_tally;

/* Append name to l (dropped when l is full). */
static void name_add(name_list *l, const char *name)
{
    if (l->len < sizeof l->s) {
        l->len += (size_t)snprintf(l->s + l->len, sizeof l->s - l->len, "%s\"%s\"", l->len ? "," : "", name);
    }
}

/* Count one case named name, passed or not. */
static void tally_add(crypt_tally *t, const char *name, int pass)
{
    t->cases++;
    if (pass) {
        t->passed++;
    } else {
        name_add(&t->failed, name);
    }
}

/* The case's name, e.g. "seal/v2/xchacha20-poly1305/2048", into name. */
static void case_name(char *name, size_t cap, const char *prefix, const char *op, const crypt_case *c)
{
    snprintf(name, cap, "%s%s/v%u/%s/%zu", prefix, op, c->format, ks_alg_name(c->alg), c->n);
}

/* One seal or open measurement: ks and the two raw engines. */
typedef struct crypt_result {
    double ks, sodium, evp;             /* fastest rounds, ns */
    double med_ks, med_sodium, med_evp; /* median rounds, ns */
    double paired;                      /* median over rounds of raw / ks (paired_ratio()) */
    double allocs;                      /* ks's heap allocations per call */
} crypt_result;

/* The median over the rounds of one run of raw / ks, raw being that
 * round's faster engine: each ratio compares calls made within a few
 * milliseconds of each other, so a host that speeds up or slows down
 * over the run (a shared VM's speed moved by up to 1.7 times) moves both
 * sides of it alike, where the fastest rounds of each side may come from
 * different moments.  Taking the faster engine per round favours raw. */
static double paired_ratio(double (*t)[ROUNDS])
{
    double r[ROUNDS];
    for (int i = 0; i < ROUNDS; i++) {
        const double raw = t[1][i] < t[2][i] ? t[1][i] : t[2][i];
        r[i] = raw / t[0][i];
    }
    qsort(r, ROUNDS, sizeof r[0], cmp_double);
    return r[ROUNDS / 2];
}

/* Print one seal or open line and count its goal: ks's throughput
 * against the fastest raw call (OpenSSL EVP with a reused context, or
 * libsodium) as the paired ratio of the rounds (paired_ratio()), and no
 * heap allocation per call.  ratio_fastest is the ratio of each side's
 * fastest round, ratio_sodium the figure against raw libsodium. */
static void print_crypt(const char *op, const crypt_case *c, crypt_result r, crypt_tally *t)
{
    char name[96];
    const int evp_faster = r.evp < r.sodium;
    const double raw = evp_faster ? r.evp : r.sodium;
    const double ratio = r.paired; /* throughput of ks relative to the fastest raw */
    double goal = c->n >= 2048 ? 0.90 : 0.75;
    int pass = ratio >= goal && r.allocs == 0;
    case_name(name, sizeof name, "", op, c);
    printf("{\"bench\":\"%s\",\"name\":\"%s\",\"format\":%u,\"algorithm\":\"%s\",\"bytes\":%zu,"
           "\"aad_bytes\":%zu,\"ks_ns\":%.1f,\"raw_ns\":%.1f,\"raw_engine\":\"%s\",\"raw_sodium_ns\":%.1f,"
           "\"raw_openssl_ns\":%.1f,\"ks_median_ns\":%.1f,\"raw_sodium_median_ns\":%.1f,"
           "\"raw_openssl_median_ns\":%.1f,\"ratio\":%.3f,\"ratio_fastest\":%.3f,\"ratio_sodium\":%.3f,"
           "\"goal\":%.2f,\"allocs_per_op\":%.3g,\"pass\":%s}\n",
           op, name, c->format, ks_alg_name(c->alg), c->n, c->aad_len, r.ks, raw,
           evp_faster ? "openssl" : "sodium", r.sodium, r.evp, r.med_ks, r.med_sodium, r.med_evp, ratio,
           raw / r.ks, r.sodium / r.ks, goal, r.allocs, pass ? "true" : "false");
    tally_add(t, name, pass);
}

/* ks (fn) against raw libsodium (sodium) and raw OpenSSL (evp) on c,
 * interleaved; ks < 0 when a call failed. */
static crypt_result measure_crypt(crypt_case *c, op_fn fn, op_fn sodium, op_fn evp)
{
    crypt_result r = {-1, -1, -1, -1, -1, -1, -1, -1};
    const op_fn fns[3] = {fn, sodium, evp};
    void *const args[3] = {c, c, c};
    double best[3], med[3], rounds[3][ROUNDS];
    if (measure_rounds(fns, args, 3, best, med, rounds) != 0) {
        return r;
    }
    r = (crypt_result){best[0], best[1], best[2], med[0], med[1], med[2], paired_ratio(rounds), -1};
    r.allocs = allocs_per_op(fn, c, alloc_iters(best[0]));
    return r;
}

/* Seal and open n bytes with (format, alg), each against raw libsodium
 * and raw OpenSSL; out and env hold MAX_PT + 4096 bytes, raw_ct MAX_PT +
 * 16, aad KS_DATA_AAD_MAX. */
static int bench_crypt_case(ks_ctx *ctx, uint8_t format, uint32_t alg, size_t n, const uint8_t *pt,
                            uint8_t *out, uint8_t *env, uint8_t *aad, uint8_t *raw_ct, crypt_tally *t)
{
    crypt_case c;
    if (crypt_case_init(&c, ctx, format, alg, n, pt, out, env, MAX_PT + 4096, aad, raw_ct) != 0) {
        evp_free(&c);
        return -1;
    }
    crypt_result s = measure_crypt(&c, run_seal, run_raw_seal, run_evp_seal);
    crypt_result o = measure_crypt(&c, run_open, run_raw_open, run_evp_open);
    evp_free(&c);
    if (s.ks < 0 || o.ks < 0) {
        return -1;
    }
    print_crypt("seal", &c, s, t);
    print_crypt("open", &c, o, t);
    return 0;
}

/* ---- thread scaling: one shared ks_ctx vs independent raw AEAD ---------------- */

/* One thread of a window: calls fn(arg) from the start barrier on. */
typedef struct worker {
    op_fn fn;
    void *arg;
    pthread_barrier_t *start;
    double ops_per_s; /* out: calls per second over its window */
    int failed;       /* out: a call failed */
} worker;

/* Thread body: wait at the start barrier, then call fn for about
 * THREAD_WINDOW_NS, reading the clock every THREAD_CHECK calls. */
static void *worker_main(void *p)
{
    worker *w = p;
    long ops = 0;
    double t0, t;
    pthread_barrier_wait(w->start);
    t0 = now_ns();
    do {
        for (int i = 0; i < THREAD_CHECK; i++) {
            if (w->fn(w->arg) != 0) {
                w->failed = 1;
                return NULL;
            }
        }
        ops += THREAD_CHECK;
        t = now_ns();
    } while (t - t0 < THREAD_WINDOW_NS);
    w->ops_per_s = (double)ops * 1e9 / (t - t0);
    return NULL;
}

/* Calls per second of nthreads threads together, thread i calling fn on
 * the case at cases + i * stride, each counting over its own window after
 * a common start: the sum of their rates.  The same runner serves ks and
 * raw.  -1 on failure. */
static double run_threads(op_fn fn, void *cases, size_t stride, int nthreads)
{
    pthread_t tid[THREADS_MAX];
    worker w[THREADS_MAX];
    pthread_barrier_t start;
    int started = 0, failed = 0;
    double total = 0;
    if (pthread_barrier_init(&start, NULL, (unsigned)nthreads) != 0) {
        return -1;
    }
    for (int i = 0; i < nthreads; i++) {
        w[i] = (worker){fn, (char *)cases + (size_t)i * stride, &start, 0, 0};
        if (pthread_create(&tid[i], NULL, worker_main, &w[i]) != 0) {
            /* The barrier would never open: a bench that cannot start its
             * threads has nothing to measure. */
            fprintf(stderr, "bench: cannot start a thread\n");
            exit(1);
        }
        started++;
    }
    for (int i = 0; i < started; i++) {
        pthread_join(tid[i], NULL);
        failed |= w[i].failed;
        total += w[i].ops_per_s;
    }
    pthread_barrier_destroy(&start);
    return failed ? -1 : total;
}

/* See bench.h: THREAD_ROUNDS rounds, each running the four figures in an
 * order that rotates from round to round; each figure is its best round
 * (noise only ever takes throughput away). */
int bench_scaling(op_fn fn, void *cases, op_fn base, void *base_cases, size_t stride, double best[4])
{
    for (int f = 0; f < 4; f++) {
        best[f] = 0;
    }
    for (int r = 0; r < THREAD_ROUNDS; r++) {
        for (int k = 0; k < 4; k++) {
            int f = (r + k) % 4;
            double v = run_threads(f < 2 ? fn : base, f < 2 ? cases : base_cases, stride,
                                   f % 2 ? THREADS_MAX : 1);
            if (v < 0) {
                return -1;
            }
            best[f] = v > best[f] ? v : best[f];
        }
    }
    return 0;
}

/*
 * One thread-scaling case: ks (fn on cases sharing one ctx and so one
 * DEK) and raw (base, each thread its own key and nonce counter) with 1
 * and THREADS_MAX threads (bench_scaling()).  Prints its
 * line and counts its goal: ks's speedup at least 0.9 of raw's.  When
 * even raw did not scale (speedup below THREAD_SCALED), the other core
 * was busy throughout and the goal says nothing: the line says
 * "raw_scaled":false and the summary lists the case as inconclusive.
 */
static int threads_case(const char *op, op_fn fn, op_fn base, crypt_case *cases, crypt_tally *t)
{
    double best[4]; /* ks 1t, ks 2t, raw 1t, raw 2t */
    char name[96];
    if (bench_scaling(fn, cases, base, cases, sizeof cases[0], best) != 0) {
        return -1;
    }
    const crypt_case *c = &cases[0];
    double ks_speedup = best[1] / best[0], raw_speedup = best[3] / best[2];
    double ratio = ks_speedup / raw_speedup;
    int pass = ratio >= 0.9, scaled = raw_speedup >= THREAD_SCALED;
    case_name(name, sizeof name, "threads/", op, c);
    printf("{\"bench\":\"threads\",\"name\":\"%s\",\"op\":\"%s\",\"format\":%u,\"algorithm\":\"%s\","
           "\"bytes\":%zu,\"threads\":%d,\"ks_1t_ops\":%.0f,\"ks_2t_ops\":%.0f,\"raw_1t_ops\":%.0f,"
           "\"raw_2t_ops\":%.0f,\"ks_speedup\":%.3f,\"raw_speedup\":%.3f,\"ratio\":%.3f,\"goal\":0.9,"
           "\"pass\":%s,\"raw_scaled\":%s}\n",
           name, op, c->format, ks_alg_name(c->alg), c->n, THREADS_MAX, best[0], best[1], best[2], best[3],
           ks_speedup, raw_speedup, ratio, pass ? "true" : "false", scaled ? "true" : "false");
    tally_add(t, name, pass);
    if (!scaled) {
        name_add(&t->inconclusive, name);
    }
    return 0;
}

/* Seal and open n bytes with (format, alg) from 1 and THREADS_MAX
 * threads: thread 0's case set up as for bench_crypt_case, the others
 * copies of it (same ctx, params and envelope) with their own scratch
 * and raw side. */
static int bench_threads_case(ks_ctx *ctx, uint8_t format, uint32_t alg, size_t n, const uint8_t *pt,
                              crypt_tally *t)
{
    static uint8_t out[THREADS_MAX][THREAD_MAX_PT + 4096], raw_ct[THREADS_MAX][THREAD_MAX_PT + KS_TAG_LEN];
    static uint8_t env[THREAD_MAX_PT + 4096], aad[KS_DATA_AAD_MAX];
    crypt_case cases[THREADS_MAX];
    if (n > THREAD_MAX_PT ||
        crypt_case_init(&cases[0], ctx, format, alg, n, pt, out[0], env, sizeof env, aad, raw_ct[0]) != 0) {
        return -1;
    }
    int rc = 0;
    for (int i = 1; i < THREADS_MAX && rc == 0; i++) {
        cases[i] = cases[0];
        rc = raw_init(&cases[i], out[i], raw_ct[i]);
    }
    /* raw: the engine keyshift's rule runs at this size (migrate/crypto/aead.h) */
    const int evp = ks_aead_engine_rule(alg, n) == KS_AEAD_OPENSSL;
    rc = rc != 0 || threads_case("seal", run_seal, evp ? run_evp_seal : run_raw_seal, cases, t) != 0 ||
                 threads_case("open", run_open, evp ? run_evp_open : run_raw_open, cases, t) != 0
             ? -1
             : 0;
    for (int i = 0; i < THREADS_MAX; i++) {
        sink += cases[i].sink;
        evp_free(&cases[i]);
    }
    return rc;
}

/* ---- the crypt part -------------------------------------------------------------- */

/* A throw-away local keyring with one key, and a context over it. */
int bench_keyring(char *dir, size_t dir_cap, ks_keyring **kr, ks_ctx **ctx)
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

extern char **environ;

/* See bench.h.  Both pipe ends are closed in the child after the dup: a
 * copy left open would pass to a server the program starts, and the read
 * would never end. */
int bench_spawn(char *const argv[], char *out, size_t cap)
{
    int fds[2] = {-1, -1};
    posix_spawn_file_actions_t fa;
    pid_t pid;
    int rc = -1, status = 0;
    if ((out != NULL && (cap == 0 || pipe(fds) != 0)) || posix_spawn_file_actions_init(&fa) != 0) {
        return -1;
    }
    int ok = out != NULL ? posix_spawn_file_actions_adddup2(&fa, fds[1], 1) == 0 &&
                               posix_spawn_file_actions_addclose(&fa, fds[0]) == 0 &&
                               posix_spawn_file_actions_addclose(&fa, fds[1]) == 0
                         : posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0) == 0;
    if (ok && posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ) == 0) {
        if (out != NULL) {
            size_t len = 0;
            ssize_t got;
            close(fds[1]);
            fds[1] = -1;
            while (len + 1 < cap && (got = read(fds[0], out + len, cap - 1 - len)) > 0) {
                len += (size_t)got;
            }
            out[len] = '\0';
            while (len > 0 && (out[len - 1] == '\n' || out[len - 1] == '\r')) {
                out[--len] = '\0';
            }
        }
        if (waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0) {
            rc = 0;
        }
    }
    posix_spawn_file_actions_destroy(&fa);
    if (fds[0] >= 0) {
        close(fds[0]);
    }
    if (fds[1] >= 0) {
        close(fds[1]);
    }
    return rc;
}

/* Remove the throw-away keyring. */
void bench_keyring_remove(const char *dir)
{
    char path[600];
    static const char *const names[] = {"keyring", "keyring.lock"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        unlink(path);
    }
    rmdir(dir);
}

/* Every (format, algorithm, size) case against raw libsodium, then thread
 * scaling at the small sizes, then the summary of every goal. */
static int bench_crypt(void)
{
    static const size_t sizes[] = {128, 2048, 16384, MAX_PT};
    static const size_t thread_sizes[] = {128, THREAD_MAX_PT};
    static crypt_tally t;
    char dir[256];
    ks_keyring *kr = NULL;
    ks_ctx *ctx = NULL;
    int rc = -1;
    uint8_t *pt = malloc(MAX_PT), *out = malloc(MAX_PT + 4096), *env = malloc(MAX_PT + 4096),
            *raw = malloc(MAX_PT + KS_TAG_LEN), *aad = malloc(KS_DATA_AAD_MAX);
    if (pt == NULL || out == NULL || env == NULL || raw == NULL || aad == NULL ||
        bench_keyring(dir, sizeof dir, &kr, &ctx) != 0) {
        fprintf(stderr, "bench: cannot set up the keyring\n");
        goto done;
    }
    randombytes_buf(pt, MAX_PT);
    for (int threads = 0; threads < 2; threads++) {
        for (uint8_t format = KS_FORMAT_V1; format <= KS_FORMAT_V2; format++) {
            for (uint32_t alg = KS_ALG_AES256GCM; alg <= KS_ALG_XCHACHA20POLY1305; alg++) {
                if (alg == KS_ALG_AES256GCM && !crypto_aead_aes256gcm_is_available()) {
                    printf("{\"bench\":\"%s\",\"algorithm\":\"aes-256-gcm\",\"skipped\":\"no AES-NI\"}\n",
                           threads ? "threads" : "seal");
                    continue;
                }
                size_t ns = threads ? NELEM(thread_sizes) : NELEM(sizes);
                for (size_t i = 0; i < ns; i++) {
                    int err = threads ? bench_threads_case(ctx, format, alg, thread_sizes[i], pt, &t)
                                      : bench_crypt_case(ctx, format, alg, sizes[i], pt, out, env, aad, raw, &t);
                    if (err != 0) {
                        fprintf(stderr, "bench: seal/open failed\n");
                        goto done;
                    }
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
    /* Measurement, not a test: failed goals are reported, not an error. */
    printf("{\"bench\":\"crypt-summary\",\"cases\":%d,\"passed\":%d,\"failed\":[%s],\"inconclusive\":[%s]}\n",
           t.cases, t.passed, t.failed.s, t.inconclusive.s);
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
    free(aad);
    return rc;
}

/* ---- the AEAD engines: where the rule switches (migrate/crypto/aead.h) ---------- */

/* One AEAD engine call's state: engine, key (with OpenSSL states and an
 * expanded AES-GCM key), nonce, AAD, a payload and its ciphertext. */
typedef struct aead_case {
    ks_aead_engine engine;
    ks_aead_key key;
    ks_aead_evp enc, dec;
    crypto_aead_aes256gcm_state aes;
    uint8_t k[32], nonce[24], aad[84];
    size_t n;
    uint8_t *pt, *ct, *out;
} aead_case;

/* One encryption on the case's engine, a counter in the nonce's last
 * byte (the prefix, and so an XChaCha20 subkey, stays). */
static int run_aead_seal(void *arg)
{
    aead_case *a = arg;
    a->key.evp = &a->enc;
    a->nonce[23]++;
    return ks_aead_encrypt(a->engine, &a->key, a->out, a->pt, a->n, a->aad, sizeof a->aad, a->nonce);
}

/* One decryption of the case's ciphertext (nonce all zero). */
static int run_aead_open(void *arg)
{
    static const uint8_t zero[24];
    aead_case *a = arg;
    a->key.evp = &a->dec;
    return ks_aead_decrypt(a->engine, &a->key, a->out, a->ct, a->n + KS_TAG_LEN, a->aad, sizeof a->aad,
                           zero);
}

/*
 * The engine rule against measurement: libsodium and OpenSSL through the
 * library's AEAD interface (ks_aead_encrypt, ks_aead_decrypt: what
 * ks_seal and ks_open run, with the per-DEK state they keep: the expanded
 * AES-GCM key, a keyed EVP context), interleaved, at sizes around the
 * thresholds, with format 2's 84-byte AAD.  Each line says which engine
 * was faster and which one the rule picks; "rule_ok" is false when the
 * rule's engine was more than 5 % slower than the other.
 */
static int bench_aead(void)
{
    static const size_t sizes[] = {16, 64, 128, 192, 256, 384, 512, 768, 1024, 2048};
    static uint8_t pt[2048], ct[2048 + KS_TAG_LEN], out[2048 + KS_TAG_LEN];
    static aead_case a[2];
    static const uint8_t zero[24];
    int ok = 0, total = 0;
    randombytes_buf(pt, sizeof pt);
    for (uint32_t alg = KS_ALG_AES256GCM; alg <= KS_ALG_XCHACHA20POLY1305; alg++) {
        if (alg == KS_ALG_AES256GCM && !crypto_aead_aes256gcm_is_available()) {
            continue;
        }
        for (int e = 0; e < 2; e++) {
            a[e] = (aead_case){.engine = e == 0 ? KS_AEAD_SODIUM : KS_AEAD_OPENSSL, .pt = pt, .ct = ct, .out = out};
            randombytes_buf(a[e].aad, sizeof a[e].aad);
        }
        randombytes_buf(a[0].k, sizeof a[0].k);
        memcpy(a[1].k, a[0].k, sizeof a[1].k);
        memcpy(a[1].aad, a[0].aad, sizeof a[1].aad);
        for (int e = 0; e < 2; e++) {
            (void)crypto_aead_aes256gcm_beforenm(&a[e].aes, a[e].k);
            a[e].key = (ks_aead_key){alg, a[e].k, alg == KS_ALG_AES256GCM ? &a[e].aes : NULL, NULL,
                                     ks_aead_serial()};
        }
        for (size_t i = 0; i < NELEM(sizes); i++) {
            for (int e = 0; e < 2; e++) {
                a[e].n = sizes[i];
            }
            a[0].key.evp = &a[0].enc;
            if (ks_aead_encrypt(KS_AEAD_SODIUM, &a[0].key, ct, pt, sizes[i], a[0].aad, sizeof a[0].aad, zero) != 0) {
                return -1;
            }
            for (int op = 0; op < 2; op++) {
                pair_result r = op == 0 ? measure_pair(run_aead_seal, &a[0], run_aead_seal, &a[1])
                                        : measure_pair(run_aead_open, &a[0], run_aead_open, &a[1]);
                if (r.ns < 0) {
                    return -1;
                }
                const int evp_faster = r.base_ns < r.ns;
                const int rule_evp = ks_aead_engine_rule(alg, sizes[i]) == KS_AEAD_OPENSSL;
                const double rule_ns = rule_evp ? r.base_ns : r.ns, other_ns = rule_evp ? r.ns : r.base_ns;
                const int rule_ok = rule_ns <= other_ns * 1.05;
                ok += rule_ok;
                total++;
                printf("{\"bench\":\"aead\",\"op\":\"%s\",\"algorithm\":\"%s\",\"bytes\":%zu,\"aad_bytes\":84,"
                       "\"sodium_ns\":%.1f,\"openssl_ns\":%.1f,\"faster\":\"%s\",\"rule\":\"%s\",\"rule_ok\":%s}\n",
                       op == 0 ? "seal" : "open", ks_alg_name(alg), sizes[i], r.ns, r.base_ns,
                       evp_faster ? "openssl" : "sodium", rule_evp ? "openssl" : "sodium",
                       rule_ok ? "true" : "false");
            }
        }
        for (int e = 0; e < 2; e++) {
            ks_aead_evp_free(&a[e].enc);
            ks_aead_evp_free(&a[e].dec);
            sodium_memzero(&a[e].aes, sizeof a[e].aes);
        }
    }
    printf("{\"bench\":\"aead-summary\",\"cases\":%d,\"rule_ok\":%d}\n", total, ok);
    return 0;
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
    const char *only = argc > 1 ? argv[1] : NULL; /* "parse", "crypt", "app", "aead", "migrate", "hsm", "plugin", "pg" */
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
    if ((only == NULL || strcmp(only, "app") == 0) && bench_app() != 0) {
        return 1;
    }
    if ((only == NULL || strcmp(only, "aead") == 0) && bench_aead() != 0) {
        return 1;
    }
    if ((only == NULL || strcmp(only, "migrate") == 0) && bench_migrate() != 0) {
        return 1;
    }
    if ((only == NULL || strcmp(only, "hsm") == 0) && bench_hsm() != 0) {
        return 1;
    }
    if ((only == NULL || strcmp(only, "plugin") == 0) && bench_plugin() != 0) {
        return 1;
    }
    if ((only == NULL || strcmp(only, "pg") == 0) && bench_pg() != 0) {
        return 1;
    }
    return 0;
}
