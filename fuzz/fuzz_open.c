/*
 * fuzz/fuzz_open.c -- ks_open(), ks_verify() and ks_rewrap() on arbitrary bytes.
 *
 * Input: byte 0 = flags: bits 0-5 the context length (0..63), bit 6
 * "expect tenant acme", bit 7 "expect purpose db.users"; then the context;
 * then the envelope.
 *
 * World (made once, on the first input): the in-memory provider of
 * tests/mem_provider.h with fixed KEKs, a context with a 32-entry cache,
 * and a set of genuine envelopes sealed under fixed contexts.  libsodium's
 * random source is replaced by a fixed-seed generator before sodium_init()
 * so that the world, DEKs and nonces included, is the same in every run
 * and every build flavour: the committed seeds (corpus/fuzz_open/) are
 * genuine envelopes of this world.  (The local keyring provider is not
 * used: the in-memory one has no file state to set up per process.)
 *
 * Oracles (abort() on failure):
 *   1. ks_open succeeds only on a genuine (envelope, context) pair that
 *      satisfies the expected tenant/purpose, and then yields exactly the
 *      sealed plaintext.
 *   2. On failure the error is a parse rejection, auth-failed or
 *      not-found (an unknown key), and the plaintext buffer is all zero.
 *   3. ks_rewrap to version 2 of the same key, when it succeeds, changes
 *      only key_version and wrapped_dek, and the result opens exactly as
 *      the input did (same outcome, same plaintext).
 *   4. ks_verify, on the input and on a rewrapped result, returns exactly
 *      what ks_open returned (the same parse rejection at the same offset).
 *   5. The context's counters (ks_ctx_metrics) never decrease and count
 *      the open's outcome; ks_ctx_health_sample's totals are their
 *      documented sums.
 *   6. The cache is transparent: a second context over the same provider
 *      with a one-entry cache (and latency histograms) opens the input to
 *      the same result and plaintext; it is freed and rebuilt on inputs
 *      whose length is a multiple of 16.  At init, ks_ctx_new refuses
 *      every broken configuration rule.
 *   7. Seal and open round-trip: the input's envelope bytes, sealed as a
 *      plaintext through that context under the input's context (flags
 *      bits 6 and 7 pick the format and the algorithm), fit
 *      ks_seal_max_len() and open through both contexts to the same bytes;
 *      ks_seal refuses each bad argument (format, algorithm, a v1 purpose,
 *      context, tenant, an unknown key, NULLs, a plaintext too large, a
 *      buffer one byte short) with its documented code, writing nothing.
 *   8. An envelope the strict parse accepts opens through
 *      ks_crypto_open_parsed (the application layer's entry, which takes
 *      the parsed envelope: migrate/crypto/open_parsed.h) exactly as
 *      through ks_open, on both contexts (so with and without latency
 *      histograms): the same error and plaintext, the buffer zero on a
 *      failure; a NULL buffer, envelope or length is refused.  Its
 *      parse, ks_crypto_parse, gives ks_envelope_parse's result.
 *
 * FUZZ_OPEN_DUMP=dir (environment) writes each genuine input to dir as
 * seed-<n>, for regenerating the seeds (name them by sha1 afterwards).
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include <keyshift/crypto.h>

#include "../migrate/crypto/open_parsed.h"
#include "../tests/envelope_eq.h"
#include "../tests/mem_provider.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#include "fuzz_check.h"
#include "fuzz_drbg.h"

#define BV(s) ((ks_bytes){(const uint8_t *)(s), sizeof(s) - 1})
#define MAX_GENUINE 64
#define PT_CAP 4096

/* ---- a fixed-seed random source ------------------------------------------- */

/* The label of this harness's fixed seed (fuzz/fuzz_drbg.h). */
#define DRBG_LABEL "keyshift fuzz_open fixed seed"

/* ---- the world -------------------------------------------------------------- */

typedef struct genuine {
    uint8_t env[512];
    size_t env_len;
    uint8_t flags_ctx[64]; /* the input prefix: flags byte, context */
    size_t ctx_len;
    ks_bytes tenant, purpose;
    uint8_t pt[64];
    size_t pt_len;
} genuine;

static ks_mem_provider mem;
static ks_ctx *ctx;
static ks_ctx *tiny; /* oracle 6: a one-entry cache, latency histograms on */
static genuine gen[MAX_GENUINE];
static size_t ngen;

/* (Re)create oracle 6's context over the same provider: one cache entry,
 * so opens of different keys evict each other, and latency histograms. */
static void new_tiny(void)
{
    ks_ctx_config cfg;
    ks_ctx_config_default(&cfg);
    cfg.cache_entries = 1;
    cfg.latency_histograms = 1;
    cfg.dek_max_messages = 3; /* oracle 7's seals rotate the write-side DEK often */
    ks_provider prov = ks_mem_provider_of(&mem);
    ks_ctx_free(tiny);
    tiny = NULL;
    CHECK(ks_ctx_new(&prov, &cfg, &tiny) == KS_OK);
}

/* ks_ctx_new refuses each configuration rule broken, and a NULL provider
 * or result, with invalid-argument and no context. */
static void check_bad_configs(const ks_provider *prov)
{
    for (int rule = 0; rule < 6; rule++) {
        ks_ctx_config cfg;
        ks_ctx_config_default(&cfg);
        switch (rule) {
        case 0: cfg.dek_max_messages = 0; break;
        case 1: cfg.dek_max_messages = UINT64_MAX; break;
        case 2: cfg.dek_max_bytes = 0; break;
        case 3: cfg.dek_max_age = 0; break;
        case 4: cfg.cache_entries = UINT32_MAX; break;
        default: cfg.cache_ttl = 0; break;
        }
        ks_ctx *c = NULL;
        CHECK(ks_ctx_new(prov, &cfg, &c) == KS_ERR_INVALID_ARGUMENT && c == NULL);
    }
    ks_ctx *c = NULL;
    CHECK(ks_ctx_new(NULL, NULL, &c) == KS_ERR_INVALID_ARGUMENT && c == NULL);
    CHECK(ks_ctx_new(prov, NULL, NULL) == KS_ERR_INVALID_ARGUMENT);
    ks_ctx_free(NULL);
}

/* Oracle 8 on context c: env[0, len), when it parses, opens through
 * ks_crypto_open_parsed as ks_open opened it (open_err, and the
 * plaintext open_pt[0, open_len) on success). */
static void check_parsed(ks_ctx *c, const uint8_t *env, size_t len, const ks_open_params *p,
                         ks_err open_err, const uint8_t *open_pt, size_t open_len)
{
    static uint8_t pt[PT_CAP];
    ks_envelope e, again;
    ks_parse_error pe, again_pe;
    const ks_err parsed = ks_envelope_parse(env, len, NULL, &e, &pe);
    /* the application's parse (on the thread's last head, when env
     * begins with it) is the strict parse, views and errors included */
    CHECK(ks_crypto_parse(c, env, len, &again, &again_pe) == parsed);
    CHECK(parsed == KS_OK ? ks_test_result_eq(&e, &again)
                          : again_pe.offset == pe.offset && again_pe.field == pe.field);
    if (parsed != KS_OK) {
        CHECK(open_err != KS_OK);
        return;
    }
    memset(pt, 0, sizeof pt);
    size_t n = 0;
    ks_err err = ks_crypto_open_parsed(c, env, &e, p, pt, sizeof pt, &n);
    CHECK(err == open_err);
    if (err == KS_OK) {
        CHECK(n == open_len && memcmp(pt, open_pt, n) == 0);
    } else {
        CHECK(ks_test_all_zero(pt, sizeof pt));
    }
    CHECK(ks_crypto_open_parsed(c, NULL, &e, p, pt, sizeof pt, &n) == KS_ERR_INVALID_ARGUMENT);
    CHECK(ks_crypto_open_parsed(c, env, NULL, p, pt, sizeof pt, &n) == KS_ERR_INVALID_ARGUMENT);
    CHECK(ks_crypto_open_parsed(c, env, &e, p, pt, sizeof pt, NULL) == KS_ERR_INVALID_ARGUMENT);
}

/* Oracle 6: the cache is transparent.  The same open through the
 * one-entry context gives the same result and plaintext; inputs whose
 * length is a multiple of 16 free and rebuild that context first, with
 * whatever it had cached. */
static void check_tiny(const uint8_t *env, size_t len, const ks_open_params *p, ks_err open_err,
                       const uint8_t *pt, size_t pt_len, size_t input_size)
{
    static uint8_t pt2[PT_CAP];
    if (input_size % 16 == 0) {
        new_tiny();
    }
    size_t pt2_len = 0;
    ks_err err = ks_open(tiny, env, len, p, pt2, sizeof pt2, &pt2_len, NULL);
    CHECK(err == open_err);
    CHECK(err != KS_OK || (pt2_len == pt_len && memcmp(pt2, pt, pt_len) == 0));
    check_parsed(tiny, env, len, p, open_err, pt, pt_len);
    ks_health_sample h;
    ks_ctx_health_sample(tiny, &h);
    CHECK(err == KS_ERR_NOT_FOUND || h.opens >= 1); /* a not-found is no verdict */
}

/* Oracle 7's refusals: ks_seal refuses each bad argument with the code
 * keyshift/crypto.h gives, writing nothing; env_len is the length a good
 * seal of pt_len bytes under *good just gave. */
static void check_seal_refusals(const ks_seal_params *good, const uint8_t *pt, size_t pt_len,
                                size_t env_len)
{
    static uint8_t out[PT_CAP + 1024];
    static const uint8_t big[KS_CONTEXT_MAX + 1];
    struct {
        ks_seal_params p;
        ks_err want;
    } bad[8];
    for (size_t i = 0; i < 8; i++) {
        bad[i].p = *good;
        bad[i].want = KS_ERR_INVALID_ARGUMENT;
    }
    bad[0].p.format = 3;
    bad[1].p.algorithm = 3;
    bad[2].p.format = KS_FORMAT_V1;
    bad[2].p.purpose = BV("db.users");
    bad[3].p.context = (ks_bytes){big, sizeof big};
    bad[4].p.context = (ks_bytes){NULL, 1};
    bad[5].p.tenant = BV("a b"); /* outside [F-NAME-1] */
    bad[6].p.tenant = (ks_bytes){NULL, 0};
    bad[7].p.key_id = BV("no-such-key");
    size_t n = 7;
    for (size_t i = 0; i < 8; i++) {
        out[0] = 0xA5;
        ks_err err = ks_seal(tiny, &bad[i].p, pt, pt_len, out, sizeof out, &n);
        CHECK(i == 7 ? err != KS_OK : err == bad[i].want);
        CHECK(out[0] == 0xA5 && n == 7);
    }
    CHECK(ks_seal_max_len(&bad[0].p, pt_len) == 0 && ks_seal_max_len(NULL, pt_len) == 0);
    CHECK(ks_seal(NULL, good, pt, pt_len, out, sizeof out, &n) == KS_ERR_INVALID_ARGUMENT);
    CHECK(ks_seal(tiny, NULL, pt, pt_len, out, sizeof out, &n) == KS_ERR_INVALID_ARGUMENT);
    CHECK(ks_seal(tiny, good, NULL, 1, out, sizeof out, &n) == KS_ERR_INVALID_ARGUMENT);
    CHECK(ks_seal(tiny, good, pt, pt_len, NULL, 1, &n) == KS_ERR_INVALID_ARGUMENT);
    CHECK(ks_seal(tiny, good, pt, pt_len, out, sizeof out, NULL) == KS_ERR_INVALID_ARGUMENT);
    CHECK(ks_seal(tiny, good, big, KS_CIPHERTEXT_DEFAULT_MAX, out, sizeof out, &n) ==
          KS_ERR_TOO_LARGE);
    out[0] = 0xA5;
    CHECK(ks_seal(tiny, good, pt, pt_len, out, env_len - 1, &n) == KS_ERR_BUFFER_TOO_SMALL);
    CHECK(out[0] == 0xA5 && n == 7);
}

/* Oracle 7: seal and open round-trip.  The input's envelope bytes, as a
 * plaintext, sealed through the one-entry context under the input's
 * context (flags bit 6: v1, else v2; bit 7: aes-256-gcm where available,
 * else xchacha20-poly1305), fit ks_seal_max_len() and open, through both
 * contexts, to exactly those bytes. */
static void check_seal(const uint8_t *pt, size_t pt_len, uint8_t flags, ks_bytes context)
{
    static uint8_t env[PT_CAP + 1024];
    static uint8_t back[PT_CAP];
    uint8_t format = (flags & 0x40) ? KS_FORMAT_V1 : KS_FORMAT_V2;
    uint32_t alg = (flags & 0x80) && crypto_aead_aes256gcm_is_available()
                       ? KS_ALG_AES256GCM
                       : KS_ALG_XCHACHA20POLY1305;
    ks_bytes purpose = format == KS_FORMAT_V2 ? BV("db.users") : (ks_bytes){NULL, 0};
    ks_seal_params sp = {format, alg, BV("acme"), BV("fuzz-key"), 0, purpose, context};
    size_t env_len = 0, back_len = 0;
    if (pt_len > PT_CAP) {
        return;
    }
    CHECK(ks_seal(tiny, &sp, pt, pt_len, env, sizeof env, &env_len) == KS_OK);
    CHECK(env_len <= ks_seal_max_len(&sp, pt_len));
    check_seal_refusals(&sp, pt, pt_len, env_len);
    ks_open_params op = {context, BV("acme"), purpose};
    ks_ctx *both[2] = {tiny, ctx};
    for (size_t i = 0; i < 2; i++) {
        memset(back, 0, sizeof back);
        CHECK(ks_open(both[i], env, env_len, &op, back, sizeof back, &back_len, NULL) == KS_OK);
        CHECK(back_len == pt_len && (pt_len == 0 || memcmp(back, pt, pt_len) == 0));
    }
}

/* Seal one genuine envelope and record it. */
static void seal_one(uint8_t format, uint32_t alg, const char *tenant, const char *purpose,
                     const char *context, size_t pt_len)
{
    CHECK(ngen < MAX_GENUINE);
    genuine *g = &gen[ngen];
    g->tenant = (ks_bytes){(const uint8_t *)tenant, strlen(tenant)};
    g->purpose = format == KS_FORMAT_V2 ? (ks_bytes){(const uint8_t *)purpose, strlen(purpose)}
                                        : (ks_bytes){NULL, 0};
    g->ctx_len = strlen(context);
    memcpy(g->flags_ctx + 1, context, g->ctx_len);
    g->flags_ctx[0] = (uint8_t)g->ctx_len;
    g->pt_len = pt_len;
    for (size_t i = 0; i < pt_len; i++) {
        g->pt[i] = (uint8_t)(i * 7 + ngen);
    }
    ks_seal_params p = {format, alg, g->tenant, BV("fuzz-key"), 1, g->purpose,
                        {(const uint8_t *)context, g->ctx_len}};
    CHECK(ks_seal(ctx, &p, g->pt, pt_len, g->env, sizeof g->env, &g->env_len) == KS_OK);
    ngen++;
}

/* Write each genuine input to dir (FUZZ_OPEN_DUMP). */
static void dump(const char *dir)
{
    for (size_t i = 0; i < ngen; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/seed-%02zu", dir, i);
        FILE *f = fopen(path, "wb");
        CHECK(f != NULL);
        CHECK(fwrite(gen[i].flags_ctx, 1, 1 + gen[i].ctx_len, f) == 1 + gen[i].ctx_len);
        CHECK(fwrite(gen[i].env, 1, gen[i].env_len, f) == gen[i].env_len);
        fclose(f);
    }
}

/* Build the world once. */
static void init(void)
{
    static const uint8_t kek1[32] = "fuzz_open kek version 1 ........";
    static const uint8_t kek2[32] = "fuzz_open kek version 2 ........";
    static const char *const contexts[] = {"", "row:42", "tbl/users#7"};
    CHECK(ks_fuzz_drbg_install(DRBG_LABEL) == 0);
    CHECK(sodium_init() >= 0);
    ks_mem_init(&mem);
    CHECK(ks_mem_add(&mem, "fuzz-key", 1, 1, kek1) == 0);
    CHECK(ks_mem_add(&mem, "fuzz-key", 2, 0, kek2) == 0);
    ks_provider prov = ks_mem_provider_of(&mem);
    /* A read cache of 32 DEKs: every genuine one fits, and the DEKs that
     * oracle 7's seals rotate through start evicting each other after a
     * few dozen inputs.  With the default 4,096 entries the cache grew on
     * most inputs for thousands of them, and libFuzzer ran a LeakSanitizer
     * pass after every input that allocated more than it freed: the first
     * thousand such passes took most of a 10 s smoke run. */
    ks_ctx_config cfg;
    ks_ctx_config_default(&cfg);
    cfg.cache_entries = 32;
    CHECK(ks_ctx_new(&prov, &cfg, &ctx) == KS_OK);
    for (uint32_t alg = 1; alg <= 2; alg++) {
        if (alg == KS_ALG_AES256GCM && !crypto_aead_aes256gcm_is_available()) {
            continue;
        }
        for (uint8_t fmt = 1; fmt <= 2; fmt++) {
            for (size_t c = 0; c < 3; c++) {
                seal_one(fmt, alg, c == 2 ? "globex" : "acme", c == 1 ? "db.orders" : "db.users",
                         contexts[c], c * 20 + fmt);
            }
        }
    }
    seal_one(KS_FORMAT_V2, KS_ALG_XCHACHA20POLY1305, "acme", "db.users", "row:42", 0);
    new_tiny();
    check_bad_configs(&prov);
    const char *dir = getenv("FUZZ_OPEN_DUMP");
    if (dir != NULL) {
        dump(dir);
    }
}

/* The genuine envelope equal to env under context and the expectations,
 * or NULL. */
static const genuine *find_genuine(const uint8_t *env, size_t len, ks_bytes context, const ks_open_params *p)
{
    for (size_t i = 0; i < ngen; i++) {
        const genuine *g = &gen[i];
        if (g->env_len == len && memcmp(g->env, env, len) == 0 &&
            ks_test_bytes_eq(context, (ks_bytes){g->flags_ctx + 1, g->ctx_len}) &&
            (p->tenant.len == 0 || ks_test_bytes_eq(p->tenant, g->tenant)) &&
            (p->purpose.len == 0 || ks_test_bytes_eq(p->purpose, g->purpose))) {
            return g;
        }
    }
    return NULL;
}

/* Oracle 4: ks_verify on env returns open_err, the result of ks_open
 * (whose parse error, when it was rejected, is *open_pe). */
static void check_verify(const uint8_t *env, size_t len, const ks_open_params *p, ks_err open_err,
                         const ks_parse_error *open_pe)
{
    ks_parse_error pe;
    ks_err err = ks_verify(ctx, env, len, p, &pe);
    CHECK(err == open_err);
    CHECK(!ks_err_is_rejection(err) || (pe.code == open_pe->code && pe.offset == open_pe->offset));
}

/* Oracles 1, 2 and 4; returns the error, the plaintext in pt. */
static ks_err check_open(const uint8_t *env, size_t len, const ks_open_params *p, uint8_t *pt,
                         size_t *pt_len)
{
    memset(pt, 0, PT_CAP);
    ks_parse_error pe;
    ks_err err = ks_open(ctx, env, len, p, pt, PT_CAP, pt_len, &pe);
    check_verify(env, len, p, err, &pe);
    check_parsed(ctx, env, len, p, err, pt, err == KS_OK ? *pt_len : 0);
    const genuine *g = find_genuine(env, len, p->context, p);
    if (err == KS_OK) {
        CHECK(g != NULL);
        CHECK(*pt_len == g->pt_len && memcmp(pt, g->pt, g->pt_len) == 0);
        return err;
    }
    CHECK(g == NULL);
    CHECK(ks_err_is_rejection(err) || err == KS_ERR_AUTH_FAILED || err == KS_ERR_NOT_FOUND);
    CHECK(!ks_err_is_rejection(err) || pe.code == err);
    CHECK(ks_test_all_zero(pt, PT_CAP));
    return err;
}

/* Oracle 3. */
static void check_rewrap(const uint8_t *env, size_t len, const ks_open_params *p, ks_err open_err,
                         const uint8_t *pt, size_t pt_len)
{
    static uint8_t out[8192];
    static uint8_t pt2[PT_CAP];
    size_t out_len = 0, pt2_len = 0;
    ks_rewrap_params rp = {{NULL, 0}, 2};
    ks_err err = ks_rewrap(ctx, env, len, &rp, out, sizeof out, &out_len, NULL);
    if (err != KS_OK) {
        CHECK(open_err != KS_OK);
        return;
    }
    ks_envelope a, b;
    CHECK(ks_envelope_parse(env, len, NULL, &a, NULL) == KS_OK);
    CHECK(ks_envelope_parse(out, out_len, NULL, &b, NULL) == KS_OK);
    CHECK(b.key_version == 2 && a.version == b.version && a.algorithm == b.algorithm);
    CHECK(ks_test_bytes_eq(a.tenant, b.tenant) && ks_test_bytes_eq(a.key_id, b.key_id));
    CHECK(ks_test_bytes_eq(a.nonce, b.nonce) && ks_test_bytes_eq(a.purpose, b.purpose));
    CHECK(ks_test_bytes_eq(a.commitment, b.commitment) && ks_test_bytes_eq(a.ciphertext, b.ciphertext));
    memset(pt2, 0, sizeof pt2);
    ks_parse_error pe;
    ks_err err2 = ks_open(ctx, out, out_len, p, pt2, sizeof pt2, &pt2_len, &pe);
    check_verify(out, out_len, p, err2, &pe);
    CHECK((err2 == KS_OK) == (open_err == KS_OK));
    if (err2 == KS_OK) {
        CHECK(pt2_len == pt_len && memcmp(pt2, pt, pt_len) == 0);
    } else {
        CHECK(ks_test_all_zero(pt2, sizeof pt2));
    }
}

/* Nonzero when every counter of b is at least a's. */
static int metrics_ge(const ks_metrics *b, const ks_metrics *a)
{
    const uint64_t *pb = (const uint64_t *)(const void *)b;
    const uint64_t *pa = (const uint64_t *)(const void *)a;
    for (size_t i = 0; i < sizeof *a / sizeof(uint64_t); i++) {
        if (pb[i] < pa[i]) {
            return 0;
        }
    }
    return 1;
}

/* Oracle 5: the counters moved with what this input did.  Every
 * ks_metrics counter is non-decreasing; the open's outcome was counted
 * (opens, auth_failures and one cause, or parse_errors[code]; at least
 * once: ks_verify and the rewrap's open count too; a not-found is left
 * alone, since it need not reach the provider); ks_ctx_health_sample() totals are
 * the documented sums of the metrics, non-decreasing, with time 0. */
static void check_counters(const ks_metrics *m0, const ks_health_sample *h0, ks_err open_err)
{
    ks_metrics m;
    ks_health_sample h;
    ks_ctx_metrics(ctx, &m);
    ks_ctx_health_sample(ctx, &h);
    CHECK(metrics_ge(&m, m0));
    if (open_err == KS_OK) {
        CHECK(m.opens > m0->opens);
    } else if (open_err == KS_ERR_AUTH_FAILED) {
        CHECK(m.auth_failures > m0->auth_failures);
        CHECK(m.auth_fail_unwrap + m.auth_fail_commitment + m.auth_fail_aead + m.auth_fail_binding >
              m0->auth_fail_unwrap + m0->auth_fail_commitment + m0->auth_fail_aead +
                  m0->auth_fail_binding);
    } else if (ks_err_is_rejection(open_err)) {
        CHECK(m.parse_errors[open_err] > m0->parse_errors[open_err]);
    }
    uint64_t parse = 0, perr = 0;
    for (size_t i = 0; i < sizeof m.parse_errors / sizeof m.parse_errors[0]; i++) {
        parse += m.parse_errors[i];
    }
    for (size_t i = 0; i < sizeof m.provider_errors / sizeof m.provider_errors[0]; i++) {
        perr += m.provider_errors[i];
    }
    CHECK(h.time == 0 && h.seals == m.seals && h.parse_errors == parse);
    CHECK(h.opens == m.opens + m.auth_failures + parse && h.auth_failures == m.auth_failures);
    CHECK(h.provider_calls == m.wraps + m.unwraps && h.provider_errors == perr);
    CHECK(h.opens >= h0->opens && h.provider_calls >= h0->provider_calls);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static uint8_t pt[PT_CAP];
    if (ctx == NULL) {
        init();
    }
    uint8_t flags = size != 0 ? data[0] : 0;
    size_t ctx_len = flags & 0x3F;
    if (size == 0 || 1 + ctx_len > size) {
        ctx_len = 0;
    }
    size_t off = size != 0 ? 1 + ctx_len : 0;
    ks_open_params p = {{ctx_len ? data + 1 : NULL, ctx_len},
                        (flags & 0x40) ? BV("acme") : (ks_bytes){NULL, 0},
                        (flags & 0x80) ? BV("db.users") : (ks_bytes){NULL, 0}};
    const uint8_t *env = size > off ? data + off : NULL;
    size_t env_len = size - off;
    size_t pt_len = 0;
    ks_metrics m0;
    ks_health_sample h0;
    ks_ctx_metrics(ctx, &m0);
    ks_ctx_health_sample(ctx, &h0);
    ks_err err = check_open(env, env_len, &p, pt, &pt_len);
    check_rewrap(env, env_len, &p, err, pt, pt_len);
    check_counters(&m0, &h0, err);
    check_tiny(env, env_len, &p, err, pt, pt_len, size);
    check_seal(env, env_len, flags, p.context);
    return 0;
}
