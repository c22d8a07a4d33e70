/*
 * tests/test_crypto.c -- sealing, opening and rewrapping (keyshift/crypto.h,
 * docs/format.md section 7), against the in-memory provider of
 * tests/mem_provider.h (fault injection) and the local keyring provider.
 *
 * No test depends on timing: DEK age and cache TTL are moved with the
 * library's test clock (ks_mono_test_advance).
 */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <pthread.h>
#include <sodium.h>

#include <keyshift/crypto.h>
#include <keyshift/keyring.h>

#include "../migrate/crypto/aead.h"
#include "../migrate/crypto/crypto_hooks.h"
#include "../migrate/crypto/dek_cache.h"
#include "../migrate/crypto/mono_clock.h"
#include "../migrate/crypto/shard.h"
#include "envelope_eq.h"
#include "mem_provider.h"

#define KEY "app-key"
#define BV(s) ((ks_bytes){(const uint8_t *)(s), sizeof(s) - 1})

/* One test's world: a provider with KEY v1 (primary) and "other-key" v1,
 * and a context over it. */
typedef struct world {
    ks_mem_provider mem;
    ks_provider prov;
    ks_ctx *ctx;
    ks_keyring *kr;      /* keyring worlds only */
    char dir[64];
    char path[96];
} world;

static int aes_ok(void)
{
    return crypto_aead_aes256gcm_is_available();
}

/* A context over w's provider with cfg (NULL: defaults). */
static ks_ctx *new_ctx(world *w, const ks_ctx_config *cfg)
{
    ks_ctx *ctx = NULL;
    assert_int_equal(ks_ctx_new(&w->prov, cfg, &ctx), KS_OK);
    return ctx;
}

static int world_setup(void **state)
{
    world *w = calloc(1, sizeof *w);
    assert_non_null(w);
    assert_true(sodium_init() >= 0);
    ks_mem_init(&w->mem);
    assert_int_equal(ks_mem_add(&w->mem, KEY, 1, 1, NULL), 0);
    assert_int_equal(ks_mem_add(&w->mem, "other-key", 1, 1, NULL), 0);
    w->prov = ks_mem_provider_of(&w->mem);
    w->ctx = new_ctx(w, NULL);
    *state = w;
    return 0;
}

/* The same world over the real local keyring (a fresh one in a temporary
 * directory) with KEY version 1 and "other-key" version 1. */
static int keyring_setup(void **state)
{
    world_setup(state);
    world *w = *state;
    const char *tmp = getenv("TMPDIR");
    snprintf(w->dir, sizeof w->dir, "%s/kscryptoXXXXXX", tmp != NULL && strlen(tmp) < 40 ? tmp : "/tmp");
    assert_non_null(mkdtemp(w->dir));
    snprintf(w->path, sizeof w->path, "%s/keyring", w->dir);
    assert_int_equal(ks_keyring_init(w->path, (ks_bytes){NULL, 0}), KS_OK);
    assert_int_equal(ks_keyring_open(w->path, (ks_bytes){NULL, 0}, &w->kr, NULL), KS_OK);
    assert_int_equal(ks_keyring_create(w->kr, BV(KEY)), KS_OK);
    assert_int_equal(ks_keyring_create(w->kr, BV("other-key")), KS_OK);
    assert_int_equal(ks_keyring_provider(w->kr, &w->prov), KS_OK);
    ks_ctx_free(w->ctx);
    w->ctx = new_ctx(w, NULL);
    return 0;
}

static int world_teardown(void **state)
{
    world *w = *state;
    ks_ctx_free(w->ctx);
    if (w->kr != NULL) {
        char lock[128];
        ks_provider_destroy(&w->prov);
        ks_keyring_close(w->kr);
        snprintf(lock, sizeof lock, "%s.lock", w->path);
        unlink(w->path);
        unlink(lock);
        rmdir(w->dir);
    }
    ks_mem_cleanup(&w->mem);
    free(w);
    return 0;
}

/* Seal parameters: tenant "acme", KEY, purpose "db.users" for v2, context
 * "row:42". */
static ks_seal_params params(uint8_t format, uint32_t alg)
{
    ks_seal_params p = {format, alg, BV("acme"), BV(KEY), 0, {NULL, 0}, BV("row:42")};
    if (format != KS_FORMAT_V1) {
        p.purpose = BV("db.users");
    }
    return p;
}

static const ks_open_params open_any = {BV("row:42"), {NULL, 0}, {NULL, 0}};

/* A sealed envelope in a malloc'd buffer. */
typedef struct sealed {
    uint8_t *buf;
    size_t len;
} sealed;

static sealed seal_ok(ks_ctx *ctx, const ks_seal_params *p, const uint8_t *pt, size_t pt_len)
{
    size_t cap = ks_seal_max_len(p, pt_len);
    assert_true(cap > pt_len);
    sealed s = {malloc(cap), 0};
    assert_non_null(s.buf);
    assert_int_equal(ks_seal(ctx, p, pt, pt_len, s.buf, cap, &s.len), KS_OK);
    assert_true(s.len <= cap);
    return s;
}

/* Open env and return the error; the plaintext goes to pt[0, cap). */
static ks_err open_env(ks_ctx *ctx, const uint8_t *env, size_t len, const ks_open_params *p, uint8_t *pt,
                       size_t cap, size_t *pt_len)
{
    ks_parse_error pe;
    return ks_open(ctx, env, len, p, pt, cap, pt_len, &pe);
}

/* Open s and check that it gives pt[0, pt_len). */
static void open_expect(ks_ctx *ctx, sealed s, const ks_open_params *p, const uint8_t *pt, size_t pt_len)
{
    uint8_t *out = malloc(pt_len + 1);
    size_t n = 0;
    assert_non_null(out);
    assert_int_equal(open_env(ctx, s.buf, s.len, p, out, pt_len + 1, &n), KS_OK);
    assert_int_equal(n, pt_len);
    assert_true(pt_len == 0 || memcmp(out, pt, pt_len) == 0);
    free(out);
}

static ks_metrics metrics(ks_ctx *ctx)
{
    ks_metrics m;
    ks_ctx_metrics(ctx, &m);
    return m;
}

static ks_envelope parse_ok(sealed s)
{
    ks_envelope e;
    assert_int_equal(ks_envelope_parse(s.buf, s.len, NULL, &e, NULL), KS_OK);
    return e;
}

/* Encode e into a fresh sealed buffer. */
static sealed encode(const ks_envelope *e)
{
    size_t n = 0;
    assert_int_equal(ks_envelope_encoded_len(e, NULL, &n), KS_OK);
    sealed s = {malloc(n), 0};
    assert_non_null(s.buf);
    assert_int_equal(ks_envelope_encode(e, NULL, s.buf, n, &s.len), KS_OK);
    return s;
}

/* ---- round trips ------------------------------------------------------- */

/* Seal and open every algorithm x format x size; check the header. */
static void round_trip_with(ks_ctx *ctx)
{
    static const size_t sizes[] = {0, 1, 128, 2048, (size_t)1 << 20};
    uint8_t *pt = malloc((size_t)1 << 20);
    assert_non_null(pt);
    randombytes_buf(pt, (size_t)1 << 20);
    for (uint32_t alg = 1; alg <= 2; alg++) {
        if (alg == KS_ALG_AES256GCM && !aes_ok()) {
            continue; /* covered by the algorithm-unavailable test */
        }
        for (uint8_t fmt = 1; fmt <= 2; fmt++) {
            for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
                ks_seal_params p = params(fmt, alg);
                sealed s = seal_ok(ctx, &p, pt, sizes[i]);
                ks_envelope e = parse_ok(s);
                assert_int_equal(e.version, fmt);
                assert_int_equal(e.algorithm, alg);
                assert_int_equal(e.ciphertext.len, sizes[i] + KS_TAG_LEN);
                assert_int_equal(e.key_version, 1);
                open_expect(ctx, s, &open_any, pt, sizes[i]);
                free(s.buf);
            }
        }
    }
    free(pt);
}

static void test_round_trip(void **state)
{
    world *w = *state;
    round_trip_with(w->ctx);
    ks_metrics m = metrics(w->ctx);
    size_t combos = aes_ok() ? 4 : 2;
    assert_int_equal(m.seals, combos * 5);
    assert_int_equal(m.opens, combos * 5);
    assert_int_equal(m.deks_created, combos);
    assert_int_equal(m.wraps, combos);
    assert_int_equal(m.unwraps, combos);      /* one miss per DEK, */
    assert_int_equal(m.cache_hits, combos * 4); /* then the cache */
    assert_int_equal(m.auth_failures, 0);
}

/* The same with the cache off: every open unwraps. */
static void test_round_trip_no_cache(void **state)
{
    world *w = *state;
    ks_ctx_config cfg;
    ks_ctx_config_default(&cfg);
    cfg.cache_entries = 0;
    ks_ctx *ctx = new_ctx(w, &cfg);
    round_trip_with(ctx);
    ks_metrics m = metrics(ctx);
    assert_int_equal(m.unwraps, m.opens);
    assert_int_equal(m.cache_hits + m.cache_misses, 0);
    ks_ctx_free(ctx);
}

/* That sum_ns can be the sum of the latencies counted in h: above 0
 * when h counts any, and within what its buckets' bounds allow (each
 * latency at or above its bucket's lower bound, below its upper one). */
static void assert_sum_fits(const ks_histogram *h, uint64_t sum_ns)
{
    uint64_t count = 0, lo = 0, hi = 0;
    int unbounded = 0;
    for (unsigned i = 0; i < KS_HIST_BUCKETS; i++) {
        uint64_t c = h->bucket[i];
        count += c;
        lo += c * (i == 0 ? 0 : ks_histogram_bucket_bound(i - 1));
        if (i == KS_HIST_BUCKETS - 1) {
            unbounded |= c > 0;
        } else {
            hi += c * (ks_histogram_bucket_bound(i) - 1);
        }
    }
    assert_true(count > 0);
    assert_true(sum_ns > 0);
    assert_true(sum_ns >= lo);
    assert_true(unbounded || sum_ns <= hi);
}

/* The health sample: counts of the round trips, histograms and latency
 * sums only when latency_histograms is set (one bucket count per timed
 * call, its latency added to the sum). */
static void test_health_sample(void **state)
{
    world *w = *state;
    ks_health_sample hs;
    round_trip_with(w->ctx);
    ks_ctx_health_sample(w->ctx, &hs);
    ks_metrics m = metrics(w->ctx);
    assert_int_equal(hs.seals, m.seals);
    assert_int_equal(hs.opens, m.opens);
    assert_int_equal(hs.provider_calls, m.wraps + m.unwraps);
    ks_histogram none;
    memset(&none, 0, sizeof none);
    assert_memory_equal(&hs.seal_ns, &none, sizeof none); /* not timed by default */
    assert_true(hs.seal_ns_sum == 0 && hs.open_ns_sum == 0);
    ks_ctx_config cfg;
    ks_ctx_config_default(&cfg);
    cfg.latency_histograms = 1;
    ks_ctx *ctx = new_ctx(w, &cfg);
    round_trip_with(ctx);
    ks_seal_params p = params(2, KS_ALG_XCHACHA20POLY1305);
    sealed s = seal_ok(ctx, &p, (const uint8_t *)"x", 1);
    s.buf[s.len - 1] ^= 1; /* an auth failure and a parse error count as opens */
    uint8_t pt[8];
    size_t n = 0;
    assert_int_equal(open_env(ctx, s.buf, s.len, &open_any, pt, sizeof pt, &n), KS_ERR_AUTH_FAILED);
    assert_true(ks_err_is_rejection(open_env(ctx, s.buf, 3, &open_any, pt, sizeof pt, &n)));
    free(s.buf);
    ks_ctx_health_sample(ctx, &hs);
    m = metrics(ctx);
    assert_int_equal(hs.auth_failures, 1);
    assert_int_equal(hs.parse_errors, 1);
    assert_int_equal(hs.opens, m.opens + 2);
    uint64_t timed_seals = 0, timed_opens = 0;
    for (size_t i = 0; i < KS_HIST_BUCKETS; i++) {
        timed_seals += hs.seal_ns.bucket[i];
        timed_opens += hs.open_ns.bucket[i];
    }
    assert_int_equal(timed_seals, m.seals);
    assert_int_equal(timed_opens, m.opens + 2);
    assert_sum_fits(&hs.seal_ns, hs.seal_ns_sum);
    assert_sum_fits(&hs.open_ns, hs.open_ns_sum);
    ks_ctx_health_sample(NULL, &hs);
    assert_int_equal(hs.seals + hs.opens, 0);
    ks_ctx_health_sample(ctx, NULL); /* no-op */
    ks_ctx_free(ctx);
}

/* ---- verifying without decrypting ----------------------------------------- */

/* One AEAD's tag-only check: with no output buffer, libsodium's detached
 * decryption returns 0 for c[0, len) || tag under (ad, n, k) and -1 once
 * a byte of the ciphertext, the tag or the AD is changed. */
typedef int (*detached_fn)(unsigned char *, unsigned char *, const unsigned char *, unsigned long long,
                           const unsigned char *, const unsigned char *, unsigned long long,
                           const unsigned char *, const unsigned char *);

static void tag_only_expect(detached_fn dec, uint8_t *c, size_t len, uint8_t *ad, size_t ad_len,
                            const uint8_t *n, const uint8_t *k)
{
    assert_int_equal(dec(NULL, NULL, c, len, c + len, ad, ad_len, n, k), 0);
    uint8_t *where[] = {c, c + len - 1, c + len, c + len + KS_TAG_LEN - 1, ad, ad + ad_len - 1};
    for (size_t i = 0; i < sizeof where / sizeof *where; i++) {
        *where[i] ^= 0x01;
        assert_int_equal(dec(NULL, NULL, c, len, c + len, ad, ad_len, n, k), -1);
        *where[i] ^= 0x01;
    }
}

/* What ks_verify relies on (aead_decrypt in migrate/crypto/crypto.c):
 * libsodium's detached AEAD decryptions with m NULL verify the tag and
 * write nothing.  Pinned for each algorithm, so that a libsodium that
 * changed it fails here rather than in ks_verify. */
static void test_aead_tag_only(void **state)
{
    (void)state;
    uint8_t k[32], n[24], m[300], c[sizeof m + KS_TAG_LEN], ad[44];
    unsigned long long maclen = 0;
    randombytes_buf(k, sizeof k);
    randombytes_buf(n, sizeof n);
    randombytes_buf(m, sizeof m);
    randombytes_buf(ad, sizeof ad);
    assert_int_equal(crypto_aead_xchacha20poly1305_ietf_encrypt_detached(c, c + sizeof m, &maclen, m, sizeof m,
                                                                         ad, sizeof ad, NULL, n, k),
                     0);
    tag_only_expect(crypto_aead_xchacha20poly1305_ietf_decrypt_detached, c, sizeof m, ad, sizeof ad, n, k);
    if (!aes_ok()) {
        return;
    }
    assert_int_equal(
        crypto_aead_aes256gcm_encrypt_detached(c, c + sizeof m, &maclen, m, sizeof m, ad, sizeof ad, NULL, n, k),
        0);
    tag_only_expect(crypto_aead_aes256gcm_decrypt_detached, c, sizeof m, ad, sizeof ad, n, k);
    crypto_aead_aes256gcm_state st;
    assert_int_equal(crypto_aead_aes256gcm_beforenm(&st, k), 0);
    assert_int_equal(crypto_aead_aes256gcm_decrypt_detached_afternm(NULL, NULL, c, sizeof m, c + sizeof m, ad,
                                                                    sizeof ad, n, &st),
                     0);
    c[0] ^= 1;
    assert_int_equal(crypto_aead_aes256gcm_decrypt_detached_afternm(NULL, NULL, c, sizeof m, c + sizeof m, ad,
                                                                    sizeof ad, n, &st),
                     -1);
    sodium_memzero(&st, sizeof st);
}

/* ---- the two AEAD engines (migrate/crypto/aead.h) ----------------------- */

/* Encrypt m[0, n) on engine e under k and compare with libsodium's
 * combined call (the oracle) in want[0, n + 16); then decrypt want on e
 * back to m, and check that a flipped tag fails on e with the output
 * left zero. */
static void engine_case(ks_aead_engine e, const ks_aead_key *enc, const ks_aead_key *dec,
                        const uint8_t *m, size_t n, const uint8_t *ad, size_t adlen,
                        const uint8_t *nonce, const uint8_t *want)
{
    uint8_t *c = malloc(n + KS_TAG_LEN), *back = malloc(n + 1);
    assert_non_null(c);
    assert_non_null(back);
    assert_int_equal(ks_aead_encrypt(e, enc, c, m, n, ad, adlen, nonce), 0);
    assert_memory_equal(c, want, n + KS_TAG_LEN);
    assert_int_equal(ks_aead_decrypt(e, dec, back, want, n + KS_TAG_LEN, ad, adlen, nonce), 0);
    if (n != 0) {
        assert_memory_equal(back, m, n);
    }
    c[n] ^= 0x80;
    memset(back, 0xAA, n + 1);
    assert_int_equal(ks_aead_decrypt(e, dec, back, c, n + KS_TAG_LEN, ad, adlen, nonce), -1);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(back[i], 0); /* [F-CRYPTO-OPEN-1]: nothing unauthenticated is left */
    }
    free(c);
    free(back);
}

/* Both engines give libsodium's combined bytes [F-CRYPTO-ALG-1] around
 * the size thresholds, with and without AAD, and open each other's output;
 * an OpenSSL state is keyed again for a new key and, for
 * xchacha20-poly1305, for a new nonce prefix under the same key (the
 * HChaCha20 subkey), and after a wipe. */
static void test_aead_engines(void **state)
{
    (void)state;
    static const size_t sizes[] = {0, 1, 15, 16, 17, 255, 256, 511, 512, 513, 2048, 70001};
    uint8_t key[32], nonce[24], ad[17 * 12];
    uint8_t *m = malloc(70001), *want = malloc(70001 + KS_TAG_LEN);
    assert_non_null(m);
    assert_non_null(want);
    ks_aead_evp se = {0}, sd = {0};
    uint64_t serial = 0;
    for (uint32_t alg = 1; alg <= 2; alg++) {
        if (alg == KS_ALG_AES256GCM && !aes_ok()) {
            continue;
        }
        for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
            const size_t n = sizes[i], adlen = i % 3 == 0 ? 0 : 17 * i; /* < sizeof ad */
            assert_true(adlen <= sizeof ad);
            unsigned long long wl = 0;
            randombytes_buf(m, n);
            randombytes_buf(ad, sizeof ad);
            randombytes_buf(nonce, sizeof nonce);
            if (i % 4 == 0) {
                randombytes_buf(key, sizeof key); /* a new key: a new serial */
            }
            if (i % 4 == 0 || i == 1) {
                serial = ks_aead_serial(); /* i == 1: the same key under a new name */
            }
            if (i == 5) {
                ks_aead_evp_wipe(&se);
                ks_aead_evp_wipe(&sd);
            }
            if (alg == KS_ALG_AES256GCM) {
                assert_int_equal(crypto_aead_aes256gcm_encrypt(want, &wl, m, n, ad, adlen, NULL, nonce, key), 0);
            } else {
                assert_int_equal(crypto_aead_xchacha20poly1305_ietf_encrypt(want, &wl, m, n, ad, adlen, NULL,
                                                                            nonce, key),
                                 0);
            }
            const ks_aead_key enc = {alg, key, NULL, &se, serial}, dec = {alg, key, NULL, &sd, serial};
            engine_case(KS_AEAD_SODIUM, &enc, &dec, m, n, ad, adlen, nonce, want);
            engine_case(KS_AEAD_OPENSSL, &enc, &dec, m, n, ad, adlen, nonce, want);
            engine_case(KS_AEAD_AUTO, &enc, &dec, m, n, ad, adlen, nonce, want);
        }
    }
    ks_aead_evp_free(&se);
    ks_aead_evp_free(&sd);
    /* no OpenSSL state: OPENSSL refuses, AUTO runs libsodium */
    const ks_aead_key bare = {KS_ALG_XCHACHA20POLY1305, key, NULL, NULL, 0};
    assert_int_equal(ks_aead_encrypt(KS_AEAD_OPENSSL, &bare, want, m, 600, ad, 0, nonce), -1);
    assert_int_equal(ks_aead_encrypt(KS_AEAD_AUTO, &bare, want, m, 600, ad, 0, nonce), 0);
    free(m);
    free(want);
}

/* The engine rule: for aes-256-gcm libsodium below the threshold and
 * OpenSSL from it on, for xchacha20-poly1305 OpenSSL at every size; a
 * forced engine overrides it. */
static void test_aead_engine_rule(void **state)
{
    (void)state;
    assert_int_equal(ks_aead_engine_rule(KS_ALG_AES256GCM, KS_AEAD_OPENSSL_MIN_AES256GCM - 1), KS_AEAD_SODIUM);
    assert_int_equal(ks_aead_engine_rule(KS_ALG_AES256GCM, KS_AEAD_OPENSSL_MIN_AES256GCM), KS_AEAD_OPENSSL);
    assert_int_equal(ks_aead_engine_rule(KS_ALG_XCHACHA20POLY1305, 0), KS_AEAD_OPENSSL);
    assert_int_equal(ks_aead_engine_rule(KS_ALG_XCHACHA20POLY1305, 1), KS_AEAD_OPENSSL);
    assert_int_equal(ks_aead_engine_rule(KS_ALG_XCHACHA20POLY1305, (size_t)1 << 20), KS_AEAD_OPENSSL);
    ks_aead_test_force(KS_AEAD_SODIUM);
    assert_int_equal(ks_aead_engine_for(KS_ALG_XCHACHA20POLY1305, (size_t)1 << 20), KS_AEAD_SODIUM);
    ks_aead_test_force(KS_AEAD_OPENSSL);
    assert_int_equal(ks_aead_engine_for(KS_ALG_XCHACHA20POLY1305, 1), KS_AEAD_OPENSSL);
    ks_aead_test_force(KS_AEAD_AUTO);
}

/* ks_seal and ks_open run the engine the rule (or the forced engine)
 * names, and an envelope sealed on one engine opens on the other, in
 * another context, byte for byte. */
static void test_engines_cross(void **state)
{
    world *w = *state;
    static const size_t sizes[] = {0, 100, 600, 4096};
    uint8_t pt[4096];
    randombytes_buf(pt, sizeof pt);
    ks_ctx *other = new_ctx(w, NULL);
    for (uint32_t alg = 1; alg <= 2; alg++) {
        if (alg == KS_ALG_AES256GCM && !aes_ok()) {
            continue;
        }
        for (uint8_t fmt = 1; fmt <= 2; fmt++) {
            for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
                for (int seal_on = KS_AEAD_SODIUM; seal_on <= KS_AEAD_OPENSSL; seal_on++) {
                    ks_seal_params p = params(fmt, alg);
                    const int open_on = seal_on == KS_AEAD_SODIUM ? KS_AEAD_OPENSSL : KS_AEAD_SODIUM;
                    ks_aead_test_force((ks_aead_engine)seal_on);
                    uint64_t before = ks_aead_test_count((ks_aead_engine)seal_on);
                    sealed s = seal_ok(w->ctx, &p, pt, sizes[i]);
                    assert_int_equal(ks_aead_test_count((ks_aead_engine)seal_on), before + 1);
                    ks_aead_test_force((ks_aead_engine)open_on);
                    before = ks_aead_test_count((ks_aead_engine)open_on);
                    open_expect(other, s, &open_any, pt, sizes[i]);
                    open_expect(other, s, &open_any, pt, sizes[i]); /* from the shard */
                    assert_int_equal(ks_aead_test_count((ks_aead_engine)open_on), before + 2);
                    free(s.buf);
                }
                /* unforced: the engine of the rule (or of KS_AEAD_ENGINE) */
                ks_aead_test_force(KS_AEAD_AUTO);
                ks_seal_params p = params(fmt, alg);
                const ks_aead_engine want = ks_aead_engine_for(alg, sizes[i]);
                uint64_t before = ks_aead_test_count(want);
                sealed s = seal_ok(w->ctx, &p, pt, sizes[i]);
                open_expect(w->ctx, s, &open_any, pt, sizes[i]);
                assert_int_equal(ks_aead_test_count(want), before + 2);
                free(s.buf);
            }
        }
    }
    ks_aead_test_force(KS_AEAD_AUTO);
    ks_ctx_free(other);
}

/* ks_verify on env returns exactly what ks_open does, with the same
 * parse error; returns it. */
static ks_err verify_as_open(ks_ctx *ctx, const uint8_t *env, size_t len, const ks_open_params *p)
{
    static uint8_t pt[4096];
    size_t n = 0;
    ks_parse_error pe_open, pe_verify;
    memset(&pe_open, 0, sizeof pe_open);
    memset(&pe_verify, 0, sizeof pe_verify);
    ks_err want = ks_open(ctx, env, len, p, pt, sizeof pt, &n, &pe_open);
    sodium_memzero(pt, sizeof pt);
    ks_err got = ks_verify(ctx, env, len, p, &pe_verify);
    assert_int_equal(got, want);
    if (ks_err_is_rejection(got)) {
        assert_int_equal(pe_verify.code, pe_open.code);
        assert_int_equal(pe_verify.offset, pe_open.offset);
    }
    return got;
}

/* ks_verify: what ks_open would say, without a buffer.  Every algorithm,
 * format and size verifies (a megabyte too, where ks_open with a small
 * buffer refuses); every bit flip, truncation and wrong binding fails as
 * ks_open fails; a verify counts as an open. */
static void test_verify(void **state)
{
    world *w = *state;
    static const size_t sizes[] = {0, 1, 2048, (size_t)1 << 20};
    uint8_t *pt = malloc((size_t)1 << 20), small[16];
    assert_non_null(pt);
    randombytes_buf(pt, (size_t)1 << 20);
    for (uint32_t alg = 1; alg <= 2; alg++) {
        for (uint8_t fmt = 1; fmt <= 2 && (alg != KS_ALG_AES256GCM || aes_ok()); fmt++) {
            for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
                ks_seal_params p = params(fmt, alg);
                sealed s = seal_ok(w->ctx, &p, pt, sizes[i]);
                uint64_t opens = metrics(w->ctx).opens;
                assert_int_equal(ks_verify(w->ctx, s.buf, s.len, &open_any, NULL), KS_OK);
                assert_int_equal(metrics(w->ctx).opens, opens + 1);
                size_t n = 0;
                assert_int_equal(ks_open(w->ctx, s.buf, s.len, &open_any, small, sizeof small, &n, NULL),
                                 sizes[i] <= sizeof small ? KS_OK : KS_ERR_BUFFER_TOO_SMALL);
                if (sizes[i] == 2048) {
                    for (size_t cut = 0; cut < s.len; cut += 97) {
                        assert_int_not_equal(verify_as_open(w->ctx, s.buf, cut, &open_any), KS_OK);
                    }
                }
                free(s.buf);
            }
        }
    }
    free(pt);
    static const uint8_t msg[16] = "attack at dawn!";
    for (uint8_t fmt = 1; fmt <= 2; fmt++) {
        ks_seal_params p = params(fmt, fmt == 1 && aes_ok() ? KS_ALG_AES256GCM : KS_ALG_XCHACHA20POLY1305);
        sealed s = seal_ok(w->ctx, &p, msg, sizeof msg);
        for (size_t bit = 0; bit < s.len * 8; bit++) {
            s.buf[bit / 8] ^= (uint8_t)(1u << (bit % 8));
            assert_int_not_equal(verify_as_open(w->ctx, s.buf, s.len, &open_any), KS_OK);
            s.buf[bit / 8] ^= (uint8_t)(1u << (bit % 8));
        }
        ks_open_params o = {BV("row:43"), {NULL, 0}, {NULL, 0}};
        assert_int_equal(verify_as_open(w->ctx, s.buf, s.len, &o), KS_ERR_AUTH_FAILED);
        o = (ks_open_params){BV("row:42"), BV("acme2"), {NULL, 0}};
        assert_int_equal(verify_as_open(w->ctx, s.buf, s.len, &o), KS_ERR_AUTH_FAILED);
        o = (ks_open_params){BV("row:42"), BV("acme"), BV("db.orders")};
        assert_int_equal(verify_as_open(w->ctx, s.buf, s.len, &o), KS_ERR_AUTH_FAILED);
        o.purpose = fmt == 1 ? (ks_bytes){NULL, 0} : BV("db.users");
        assert_int_equal(verify_as_open(w->ctx, s.buf, s.len, &o), KS_OK);
        assert_int_equal(ks_verify(NULL, s.buf, s.len, &o, NULL), KS_ERR_INVALID_ARGUMENT);
        assert_int_equal(ks_verify(w->ctx, s.buf, s.len, NULL, NULL), KS_ERR_INVALID_ARGUMENT);
        free(s.buf);
    }
}

/* ---- tampering ----------------------------------------------------------- */

/* Flip every bit of a small envelope: open never succeeds and never
 * leaves plaintext. */
static void flip_every_bit(ks_ctx *ctx, const ks_seal_params *p)
{
    static const uint8_t msg[16] = "attack at dawn!";
    sealed s = seal_ok(ctx, p, msg, sizeof msg);
    for (size_t bit = 0; bit < s.len * 8; bit++) {
        uint8_t pt[64] = {0};
        size_t n = 0;
        s.buf[bit / 8] ^= (uint8_t)(1u << (bit % 8));
        ks_err err = open_env(ctx, s.buf, s.len, &open_any, pt, sizeof pt, &n);
        s.buf[bit / 8] ^= (uint8_t)(1u << (bit % 8));
        assert_int_not_equal(err, KS_OK);
        assert_true(err == KS_ERR_AUTH_FAILED || ks_err_is_rejection(err) ||
                    err == KS_ERR_NOT_FOUND || err == KS_ERR_ALGORITHM_UNAVAILABLE);
        assert_true(ks_test_all_zero(pt, sizeof pt));
    }
    open_expect(ctx, s, &open_any, msg, sizeof msg);
    free(s.buf);
}

static void test_bit_flips(void **state)
{
    world *w = *state;
    ks_seal_params v2 = params(2, 2), v1 = params(1, aes_ok() ? 1 : 2);
    flip_every_bit(w->ctx, &v2);
    flip_every_bit(w->ctx, &v1);
}

/* Wrong context, tenant and purpose fail; the right ones open. */
static void test_binding(void **state)
{
    world *w = *state;
    static const uint8_t msg[5] = "hello";
    ks_seal_params p = params(2, 2);
    sealed s = seal_ok(w->ctx, &p, msg, sizeof msg);
    uint8_t pt[16];
    size_t n;
    ks_open_params o = open_any;
    o.context = BV("row:43");
    assert_int_equal(open_env(w->ctx, s.buf, s.len, &o, pt, sizeof pt, &n), KS_ERR_AUTH_FAILED);
    o.context = (ks_bytes){NULL, 0};
    assert_int_equal(open_env(w->ctx, s.buf, s.len, &o, pt, sizeof pt, &n), KS_ERR_AUTH_FAILED);
    assert_int_equal(metrics(w->ctx).auth_fail_aead, 2);
    o = open_any;
    o.tenant = BV("acme2");
    assert_int_equal(open_env(w->ctx, s.buf, s.len, &o, pt, sizeof pt, &n), KS_ERR_AUTH_FAILED);
    o.tenant = BV("acm");
    assert_int_equal(open_env(w->ctx, s.buf, s.len, &o, pt, sizeof pt, &n), KS_ERR_AUTH_FAILED);
    o = open_any;
    o.purpose = BV("db.orders");
    assert_int_equal(open_env(w->ctx, s.buf, s.len, &o, pt, sizeof pt, &n), KS_ERR_AUTH_FAILED);
    assert_int_equal(metrics(w->ctx).auth_fail_binding, 3);
    o = (ks_open_params){BV("row:42"), BV("acme"), BV("db.users")};
    open_expect(w->ctx, s, &o, msg, sizeof msg);
    /* A v1 envelope has no purpose: expecting one fails. */
    ks_seal_params p1 = params(1, 2);
    sealed s1 = seal_ok(w->ctx, &p1, msg, sizeof msg);
    assert_int_equal(open_env(w->ctx, s1.buf, s1.len, &o, pt, sizeof pt, &n), KS_ERR_AUTH_FAILED);
    o.purpose = (ks_bytes){NULL, 0};
    open_expect(w->ctx, s1, &o, msg, sizeof msg);
    free(s.buf);
    free(s1.buf);
}

/* Build a hybrid of a with one field taken from b; it must not open. */
static void hybrid_fails(ks_ctx *ctx, sealed a, sealed b, int field)
{
    ks_envelope ea = parse_ok(a), eb = parse_ok(b);
    switch (field) {
    case KS_FIELD_ALGORITHM:
        ea.algorithm = eb.algorithm;
        ea.nonce = eb.nonce; /* the nonce length follows the algorithm */
        break;
    case KS_FIELD_TENANT:
        ea.tenant = eb.tenant;
        break;
    case KS_FIELD_KEY_ID:
        ea.key_id = eb.key_id;
        break;
    case KS_FIELD_KEY_VERSION:
        ea.key_version = ea.key_version + 1;
        break;
    case KS_FIELD_WRAPPED_DEK:
        ea.wrapped_dek = eb.wrapped_dek;
        break;
    case KS_FIELD_NONCE:
        ea.nonce = eb.nonce;
        break;
    case KS_FIELD_PURPOSE:
        ea.purpose = eb.purpose;
        break;
    case KS_FIELD_COMMITMENT:
        ea.commitment = eb.commitment;
        break;
    default:
        ea.ciphertext = eb.ciphertext;
        break;
    }
    sealed h = encode(&ea);
    uint8_t pt[64] = {0};
    size_t n;
    ks_err err = open_env(ctx, h.buf, h.len, &open_any, pt, sizeof pt, &n);
    assert_true(err == KS_ERR_AUTH_FAILED || err == KS_ERR_NOT_FOUND);
    assert_true(ks_test_all_zero(pt, sizeof pt));
    free(h.buf);
}

/* Each header field swapped in from another envelope fails. */
static void test_swapped_fields(void **state)
{
    world *w = *state;
    static const uint8_t msg[16] = "0123456789abcdef";
    assert_int_equal(ks_mem_add(&w->mem, KEY, 2, 0, NULL), 0);
    ks_seal_params pa = params(2, 2);
    sealed a = seal_ok(w->ctx, &pa, msg, sizeof msg);
    /* b: same tuple, different DEK (another context) and nonce. */
    ks_ctx *other = new_ctx(w, NULL);
    sealed b = seal_ok(other, &pa, msg, sizeof msg);
    ks_seal_params pc = pa;
    pc.tenant = BV("globex");
    pc.key_id = BV("other-key");
    pc.purpose = BV("db.orders");
    pc.algorithm = aes_ok() ? KS_ALG_AES256GCM : KS_ALG_XCHACHA20POLY1305;
    sealed c = seal_ok(w->ctx, &pc, msg, sizeof msg);
    static const int from_b[] = {KS_FIELD_WRAPPED_DEK, KS_FIELD_NONCE, KS_FIELD_COMMITMENT,
                                 KS_FIELD_CIPHERTEXT, KS_FIELD_KEY_VERSION};
    for (size_t i = 0; i < sizeof from_b / sizeof *from_b; i++) {
        hybrid_fails(w->ctx, a, b, from_b[i]);
    }
    static const int from_c[] = {KS_FIELD_TENANT, KS_FIELD_KEY_ID, KS_FIELD_PURPOSE,
                                 KS_FIELD_WRAPPED_DEK, KS_FIELD_ALGORITHM};
    for (size_t i = 0; i < sizeof from_c / sizeof *from_c; i++) {
        if (from_c[i] == KS_FIELD_ALGORITHM && !aes_ok()) {
            continue;
        }
        hybrid_fails(w->ctx, a, c, from_c[i]);
    }
    open_expect(w->ctx, a, &open_any, msg, sizeof msg);
    open_expect(w->ctx, b, &open_any, msg, sizeof msg);
    /* v1: the same swaps (no commitment: the AEAD catches DEK and nonce). */
    ks_seal_params p1 = params(1, 2);
    sealed a1 = seal_ok(w->ctx, &p1, msg, sizeof msg), b1 = seal_ok(other, &p1, msg, sizeof msg);
    for (size_t i = 0; i < sizeof from_b / sizeof *from_b; i++) {
        if (from_b[i] != KS_FIELD_COMMITMENT) {
            hybrid_fails(w->ctx, a1, b1, from_b[i]);
        }
    }
    ks_ctx_free(other);
    free(a.buf);
    free(b.buf);
    free(c.buf);
    free(a1.buf);
    free(b1.buf);
}

/* v2: a wrapped DEK replaced by a genuine wrap (same wrap AAD) of another
 * DEK is caught by the commitment, before the AEAD runs. */
static void test_commitment_before_aead(void **state)
{
    world *w = *state;
    static const uint8_t msg[3] = "abc";
    ks_seal_params p = params(2, 2);
    sealed s = seal_ok(w->ctx, &p, msg, sizeof msg);
    ks_envelope e = parse_ok(s);
    uint8_t aad[KS_WRAP_AAD_MAX], dek[KS_DEK_LEN], wrapped[KS_WRAPPED_DEK_MAX];
    size_t aad_len, wlen;
    assert_int_equal(ks_aad_wrap(&e, aad, sizeof aad, &aad_len), KS_OK);
    randombytes_buf(dek, sizeof dek);
    assert_int_equal(w->prov.ops->wrap(w->prov.self, e.key_id, e.key_version, dek, sizeof dek,
                                       (ks_bytes){aad, aad_len}, wrapped, sizeof wrapped, &wlen, 0),
                     KS_OK);
    e.wrapped_dek = (ks_bytes){wrapped, wlen};
    sealed h = encode(&e);
    ks_metrics before = metrics(w->ctx);
    uint8_t pt[8] = {0};
    size_t n;
    assert_int_equal(open_env(w->ctx, h.buf, h.len, &open_any, pt, sizeof pt, &n), KS_ERR_AUTH_FAILED);
    ks_metrics after = metrics(w->ctx);
    assert_int_equal(after.auth_fail_commitment, before.auth_fail_commitment + 1);
    assert_int_equal(after.auth_fail_aead, before.auth_fail_aead);
    assert_int_equal(after.auth_fail_unwrap, before.auth_fail_unwrap);
    /* Rewrap checks the commitment too. */
    uint8_t out[512];
    ks_rewrap_params rp = {{NULL, 0}, 0};
    assert_int_equal(ks_rewrap(w->ctx, h.buf, h.len, &rp, out, sizeof out, &n, NULL), KS_ERR_AUTH_FAILED);
    assert_int_equal(metrics(w->ctx).auth_fail_commitment, before.auth_fail_commitment + 2);
    free(h.buf);
    free(s.buf);
}

/* ---- rewrap ------------------------------------------------------------- */

/* Rewrap s to version 2 (made primary); only key_version and wrapped_dek
 * change; then disabling and destroying version 1 affects only s. */
static void rewrap_lifecycle(world *w, void (*set_state)(world *, uint32_t, ks_key_state))
{
    static const uint8_t msg[11] = "hello world";
    ks_seal_params p = params(2, 2);
    sealed s = seal_ok(w->ctx, &p, msg, sizeof msg);
    set_state(w, 2, 0); /* add version 2, primary */
    size_t cap = s.len + 64, n = 0;
    sealed r = {malloc(cap), 0};
    assert_non_null(r.buf);
    ks_rewrap_params rp = {{NULL, 0}, 0};
    assert_int_equal(ks_rewrap(w->ctx, s.buf, s.len, &rp, r.buf, cap, &r.len, NULL), KS_OK);
    ks_envelope es = parse_ok(s), er = parse_ok(r);
    assert_int_equal(er.key_version, 2);
    assert_int_equal(es.key_version, 1);
    assert_true(ks_test_bytes_eq(er.nonce, es.nonce));
    assert_true(ks_test_bytes_eq(er.ciphertext, es.ciphertext));
    assert_true(ks_test_bytes_eq(er.commitment, es.commitment));
    assert_true(ks_test_bytes_eq(er.tenant, es.tenant) && ks_test_bytes_eq(er.purpose, es.purpose));
    assert_false(ks_test_bytes_eq(er.wrapped_dek, es.wrapped_dek));
    open_expect(w->ctx, r, &open_any, msg, sizeof msg);
    /* Fresh contexts (no cached DEK) see the provider's states. */
    uint8_t pt[16];
    set_state(w, 1, KS_KEY_DISABLED);
    ks_ctx *fresh = new_ctx(w, NULL);
    assert_int_equal(open_env(fresh, s.buf, s.len, &open_any, pt, sizeof pt, &n), KS_ERR_DENIED);
    open_expect(fresh, r, &open_any, msg, sizeof msg);
    assert_int_equal(metrics(fresh).provider_errors[KS_ERR_DENIED - KS_ERR_UNAVAILABLE], 1);
    ks_ctx_free(fresh);
    set_state(w, 1, KS_KEY_DESTROYED);
    fresh = new_ctx(w, NULL);
    assert_int_equal(open_env(fresh, s.buf, s.len, &open_any, pt, sizeof pt, &n), KS_ERR_REVOKED);
    open_expect(fresh, r, &open_any, msg, sizeof msg);
    ks_ctx_free(fresh);
    (void)n;
    free(s.buf);
    free(r.buf);
}

/* State changes on the in-memory provider (state 0: add the version as
 * primary). */
static void mem_set_state(world *w, uint32_t version, ks_key_state state)
{
    if (state == 0) {
        assert_int_equal(ks_mem_add(&w->mem, KEY, version, 1, NULL), 0);
    } else {
        ks_mem_set_state(&w->mem, KEY, version, state);
    }
}

static void test_rewrap(void **state)
{
    rewrap_lifecycle(*state, mem_set_state);
}

/* State changes on the local keyring (state 0: add the next version and
 * promote it). */
static void keyring_set_state(world *w, uint32_t version, ks_key_state state)
{
    if (state == 0) {
        uint32_t v = 0;
        assert_int_equal(ks_keyring_add_version(w->kr, BV(KEY), &v), KS_OK);
        assert_int_equal(v, version);
        assert_int_equal(ks_keyring_promote(w->kr, BV(KEY), v), KS_OK);
    } else {
        assert_int_equal(ks_keyring_set_state(w->kr, BV(KEY), version, state), KS_OK);
    }
}

static void test_keyring_round_trip(void **state)
{
    world *w = *state;
    round_trip_with(w->ctx);
    static const uint8_t msg[3] = "kr!";
    ks_seal_params p = params(2, 2);
    sealed s = seal_ok(w->ctx, &p, msg, sizeof msg);
    assert_int_equal(parse_ok(s).wrapped_dek.len, KS_LOCAL_WRAPPED_LEN);
    flip_every_bit(w->ctx, &p);
    free(s.buf);
}

static void test_keyring_rewrap(void **state)
{
    rewrap_lifecycle(*state, keyring_set_state);
}

/* Rewraps of many envelopes under one DEK call wrap once (the memo); an
 * explicit target key and version work; bad targets are refused. */
static void test_rewrap_memo(void **state)
{
    world *w = *state;
    static const uint8_t msg[4] = "data";
    ks_seal_params p = params(2, 2);
    sealed s[10];
    for (size_t i = 0; i < 10; i++) {
        s[i] = seal_ok(w->ctx, &p, msg, sizeof msg);
    }
    unsigned wraps = ks_mem_calls(&w->mem, KS_MEM_WRAP);
    ks_rewrap_params rp = {BV("other-key"), 1};
    uint8_t out[512];
    size_t n;
    for (size_t i = 0; i < 10; i++) {
        assert_int_equal(ks_rewrap(w->ctx, s[i].buf, s[i].len, &rp, out, sizeof out, &n, NULL), KS_OK);
        sealed r = {out, n};
        ks_envelope er = parse_ok(r);
        assert_true(ks_test_bytes_eq(er.key_id, BV("other-key")));
        open_expect(w->ctx, r, &open_any, msg, sizeof msg);
    }
    assert_int_equal(ks_mem_calls(&w->mem, KS_MEM_WRAP), wraps + 1);
    assert_int_equal(metrics(w->ctx).rewraps, 10);
    /* Refusals: bad key_id, unknown key, short buffer (nothing written). */
    rp = (ks_rewrap_params){BV("bad key"), 0};
    assert_int_equal(ks_rewrap(w->ctx, s[0].buf, s[0].len, &rp, out, sizeof out, &n, NULL),
                     KS_ERR_INVALID_ARGUMENT);
    rp = (ks_rewrap_params){BV("nokey"), 0};
    assert_int_equal(ks_rewrap(w->ctx, s[0].buf, s[0].len, &rp, out, sizeof out, &n, NULL),
                     KS_ERR_NOT_FOUND);
    rp = (ks_rewrap_params){BV("nokey"), 3};
    assert_int_equal(ks_rewrap(w->ctx, s[0].buf, s[0].len, &rp, out, sizeof out, &n, NULL),
                     KS_ERR_NOT_FOUND);
    assert_int_equal(metrics(w->ctx).unknown_key, 2);
    rp = (ks_rewrap_params){{NULL, 0}, 0};
    memset(out, 0xA5, sizeof out);
    assert_int_equal(ks_rewrap(w->ctx, s[0].buf, s[0].len, &rp, out, 20, &n, NULL), KS_ERR_BUFFER_TOO_SMALL);
    assert_int_equal(out[0], 0xA5);
    ks_parse_error pe;
    assert_int_equal(ks_rewrap(w->ctx, s[0].buf, 3, &rp, out, sizeof out, &n, &pe), KS_ERR_TRUNCATED);
    assert_int_equal(metrics(w->ctx).parse_errors[KS_ERR_TRUNCATED], 1);
    for (size_t i = 0; i < 10; i++) {
        free(s[i].buf);
    }
}

/* ---- DEK lifecycle ------------------------------------------------------- */

/* Seal n messages of len bytes with p; return the number of distinct
 * wrapped DEKs seen in a row (consecutive seals of one DEK share it). */
static size_t seal_count_deks(ks_ctx *ctx, const ks_seal_params *p, size_t n, size_t len)
{
    uint8_t msg[256] = {0}, prev[KS_WRAPPED_DEK_MAX];
    size_t prev_len = 0, deks = 0;
    for (size_t i = 0; i < n; i++) {
        sealed s = seal_ok(ctx, p, msg, len);
        ks_envelope e = parse_ok(s);
        if (e.wrapped_dek.len != prev_len || memcmp(e.wrapped_dek.ptr, prev, prev_len) != 0) {
            deks++;
            prev_len = e.wrapped_dek.len;
            memcpy(prev, e.wrapped_dek.ptr, prev_len);
        }
        free(s.buf);
    }
    return deks;
}

static void test_dek_rotation(void **state)
{
    world *w = *state;
    ks_ctx_config cfg;
    ks_ctx_config_default(&cfg);
    ks_seal_params p = params(2, 2);
    /* max_messages */
    cfg.dek_max_messages = 3;
    ks_ctx *ctx = new_ctx(w, &cfg);
    assert_int_equal(seal_count_deks(ctx, &p, 7, 1), 3);
    assert_int_equal(metrics(ctx).deks_created, 3);
    assert_int_equal(metrics(ctx).wraps, 3);
    ks_ctx_free(ctx);
    /* max_bytes: a DEK seals while under its budget. */
    ks_ctx_config_default(&cfg);
    cfg.dek_max_bytes = 100;
    ctx = new_ctx(w, &cfg);
    assert_int_equal(seal_count_deks(ctx, &p, 3, 60), 2);
    assert_int_equal(metrics(ctx).deks_created, 2);
    ks_ctx_free(ctx);
    /* max_age, on the test clock (the margin absorbs real seconds that
     * pass while the test runs). */
    ks_ctx_config_default(&cfg);
    cfg.dek_max_age = 1000;
    ctx = new_ctx(w, &cfg);
    assert_int_equal(seal_count_deks(ctx, &p, 3, 1), 1);
    ks_mono_test_advance(900);
    assert_int_equal(seal_count_deks(ctx, &p, 1, 1), 1);
    assert_int_equal(metrics(ctx).deks_created, 1); /* still the same DEK */
    ks_mono_test_advance(100);
    assert_int_equal(seal_count_deks(ctx, &p, 2, 1), 1);
    assert_int_equal(metrics(ctx).deks_created, 2);
    assert_int_equal(metrics(ctx).wraps, 2);
    ks_ctx_free(ctx);
    /* Separate tuples get separate DEKs; version 0 resolves the primary once. */
    ctx = new_ctx(w, NULL);
    unsigned infos = ks_mem_calls(&w->mem, KS_MEM_KEY_INFO);
    ks_seal_params q = p;
    q.tenant = BV("globex");
    seal_count_deks(ctx, &p, 2, 1);
    seal_count_deks(ctx, &q, 2, 1);
    q.key_version = 1; /* explicit version: no key_info, its own DEK */
    seal_count_deks(ctx, &q, 2, 1);
    assert_int_equal(metrics(ctx).deks_created, 3);
    assert_int_equal(ks_mem_calls(&w->mem, KS_MEM_KEY_INFO), infos + 2);
    ks_ctx_free(ctx);
}

/* Tuples whose tenants (or purposes) have one length and differ in one
 * byte, at every place of every length from 1 to 20, seal alternately
 * from one thread: each seal carries its own names and the two take two
 * DEKs (the seal slot's match compares the names inline, in pieces that
 * overlap, and a piece it missed would seal under the other tuple). */
static void test_seal_tuple_names(void **state)
{
    world *w = *state;
    static const uint8_t msg[1] = "x";
    char a[21], b[21];
    for (size_t field = 0; field < 2; field++) {
        for (size_t n = 1; n <= 20; n++) {
            for (size_t i = 0; i < n; i++) {
                ks_ctx *ctx = new_ctx(w, NULL);
                memset(a, 'a', n);
                memcpy(b, a, n);
                b[i] = 'b';
                ks_seal_params pa = params(2, KS_ALG_AES256GCM), pb = pa;
                ks_bytes *va = field == 0 ? &pa.tenant : &pa.purpose, *vb = field == 0 ? &pb.tenant : &pb.purpose;
                *va = (ks_bytes){(const uint8_t *)a, n};
                *vb = (ks_bytes){(const uint8_t *)b, n};
                for (size_t k = 0; k < 4; k++) {
                    const ks_seal_params *p = k % 2 ? &pb : &pa;
                    const ks_bytes want = k % 2 ? *vb : *va;
                    sealed s = seal_ok(ctx, p, msg, sizeof msg);
                    ks_envelope e;
                    assert_int_equal(ks_envelope_parse(s.buf, s.len, NULL, &e, NULL), KS_OK);
                    assert_true(ks_test_bytes_eq(field == 0 ? e.tenant : e.purpose, want));
                    free(s.buf);
                }
                assert_int_equal(metrics(ctx).deks_created, 2);
                ks_ctx_free(ctx);
            }
        }
    }
}

/* ---- read cache ----------------------------------------------------------- */

static void test_cache(void **state)
{
    world *w = *state;
    static const uint8_t msg[4] = "memo";
    ks_ctx_config cfg;
    ks_ctx_config_default(&cfg);
    cfg.cache_entries = 2;
    cfg.cache_ttl = 1000; /* a margin for real seconds passing */
    cfg.dek_max_messages = 1; /* a DEK per envelope */
    ks_ctx *ctx = new_ctx(w, &cfg);
    ks_seal_params p = params(2, 2);
    sealed s[3];
    for (size_t i = 0; i < 3; i++) {
        s[i] = seal_ok(ctx, &p, msg, sizeof msg);
    }
    open_expect(ctx, s[0], &open_any, msg, sizeof msg);
    open_expect(ctx, s[0], &open_any, msg, sizeof msg);
    ks_metrics m = metrics(ctx);
    assert_int_equal(m.cache_misses, 1);
    assert_int_equal(m.cache_hits, 1);
    assert_int_equal(m.unwraps, 1);
    /* Entry bound: s[1] and s[2] evict s[0] (least recently used). */
    open_expect(ctx, s[1], &open_any, msg, sizeof msg);
    open_expect(ctx, s[2], &open_any, msg, sizeof msg);
    open_expect(ctx, s[2], &open_any, msg, sizeof msg);
    open_expect(ctx, s[0], &open_any, msg, sizeof msg);
    m = metrics(ctx);
    assert_int_equal(m.cache_misses, 4);
    assert_int_equal(m.cache_hits, 2);
    /* TTL: everything expires after cache_ttl seconds. */
    ks_mono_test_advance(cfg.cache_ttl / 2);
    open_expect(ctx, s[0], &open_any, msg, sizeof msg);
    assert_int_equal(metrics(ctx).cache_hits, 3);
    ks_mono_test_advance(cfg.cache_ttl);
    open_expect(ctx, s[0], &open_any, msg, sizeof msg);
    m = metrics(ctx);
    assert_int_equal(m.cache_hits, 3);
    assert_int_equal(m.cache_misses, 5);
    assert_int_equal(m.unwraps, 5);
    /* A cached entry never serves another tenant: the same wrapped DEK
     * under another tenant is another identity, which does not unwrap. */
    ks_envelope e = parse_ok(s[0]);
    e.tenant = BV("globex");
    sealed h = encode(&e);
    uint8_t pt[8];
    size_t n;
    assert_int_equal(open_env(ctx, h.buf, h.len, &open_any, pt, sizeof pt, &n), KS_ERR_AUTH_FAILED);
    m = metrics(ctx);
    assert_int_equal(m.cache_hits, 3);
    assert_int_equal(m.auth_fail_unwrap, 1);
    free(h.buf);
    /* The read cache hashes only the identity's length and tail (the end
     * of the wrapped DEK): a tenant of the same length gives the same
     * bucket hash, and only the full comparison refuses the entry. */
    open_expect(ctx, s[0], &open_any, msg, sizeof msg); /* s[0] cached again */
    assert_int_equal(metrics(ctx).cache_hits, 4);
    e = parse_ok(s[0]);
    e.tenant = BV("acmf");
    h = encode(&e);
    assert_int_equal(open_env(ctx, h.buf, h.len, &open_any, pt, sizeof pt, &n), KS_ERR_AUTH_FAILED);
    m = metrics(ctx);
    assert_int_equal(m.cache_hits, 4);
    assert_int_equal(m.auth_fail_unwrap, 2);
    free(h.buf);
    for (size_t i = 0; i < 3; i++) {
        free(s[i].buf);
    }
    ks_ctx_free(ctx);
}

/* Free n sealed envelopes, then ctx. */
static void free_sealed_ctx(sealed *s, size_t n, ks_ctx *ctx)
{
    for (size_t i = 0; i < n; i++) {
        free(s[i].buf);
    }
    ks_ctx_free(ctx);
}

/* A context with a read cache of `entries` and a DEK per envelope, and n
 * v1 aes-256-gcm envelopes of msg sealed with it into s (skips the test
 * without AES-NI). */
static ks_ctx *aes_cache_ctx(world *w, uint32_t entries, const uint8_t *msg, size_t len, sealed *s,
                             size_t n)
{
    if (!aes_ok()) {
        skip();
    }
    ks_ctx_config cfg;
    ks_ctx_config_default(&cfg);
    cfg.cache_entries = entries;
    cfg.cache_ttl = 1000; /* a margin for real seconds passing */
    cfg.dek_max_messages = 1;
    ks_ctx *ctx = new_ctx(w, &cfg);
    ks_seal_params p = params(1, KS_ALG_AES256GCM);
    for (size_t i = 0; i < n; i++) {
        s[i] = seal_ok(ctx, &p, msg, len);
    }
    return ctx;
}

/* v1 aes-256-gcm opens use the read cache's expanded AES-GCM key of the
 * DEK: the same results, hits and failures as the plain path, with more
 * DEKs than cache entries and a bit-flipped envelope (no plaintext). */
static void test_cache_aes_states(void **state)
{
    world *w = *state;
    static const uint8_t msg[5] = "state";
    sealed s[3];
    ks_ctx *ctx = aes_cache_ctx(w, 2, msg, sizeof msg, s, 3);
    for (size_t round = 0; round < 3; round++) {
        for (size_t i = 0; i < 3; i++) {
            open_expect(ctx, s[i], &open_any, msg, sizeof msg); /* miss: evicts */
            open_expect(ctx, s[i], &open_any, msg, sizeof msg); /* hit: the state */
        }
    }
    ks_metrics m = metrics(ctx);
    assert_int_equal(m.cache_misses, 9);
    assert_int_equal(m.cache_hits, 9);
    /* A flipped ciphertext byte fails on the cached state, leaving no
     * plaintext; the entry still serves the genuine envelope. */
    s[2].buf[s[2].len - 1] ^= 1;
    uint8_t pt[sizeof msg + 3];
    size_t n = 0;
    memset(pt, 0xAA, sizeof pt);
    assert_int_equal(open_env(ctx, s[2].buf, s[2].len, &open_any, pt, sizeof pt, &n), KS_ERR_AUTH_FAILED);
    for (size_t i = 0; i < sizeof pt; i++) {
        assert_int_equal(pt[i], 0);
    }
    s[2].buf[s[2].len - 1] ^= 1;
    open_expect(ctx, s[2], &open_any, msg, sizeof msg);
    m = metrics(ctx);
    assert_int_equal(m.cache_hits, 11);
    assert_int_equal(m.auth_fail_aead, 1);
    /* A wrong context too. */
    ks_open_params o = open_any;
    o.context = BV("row:43");
    assert_int_equal(open_env(ctx, s[2].buf, s[2].len, &o, pt, sizeof pt, &n), KS_ERR_AUTH_FAILED);
    free_sealed_ctx(s, 3, ctx);
}

/* Seals build the data AAD from the DEK's precomputed head and the
 * context, in the shard slot's buffer up to KS_AAD_CONTEXT_SMALL bytes of
 * context and on a frame past it; opens likewise.  Every context length
 * around that bound opens, and only under its own context, in both
 * formats, with names of every length the head may hold up to its most
 * (a 64-byte tenant and purpose fill KS_DATA_AAD_HEAD_MAX exactly). */
static void test_data_aad_contexts(void **state)
{
    world *w = *state;
    static const uint8_t msg[3] = "aad";
    static uint8_t ctxbuf[KS_CONTEXT_MAX], name[KS_TENANT_MAX];
    static const size_t lens[] = {0, 1, 17, KS_AAD_CONTEXT_SMALL - 1, KS_AAD_CONTEXT_SMALL,
                                  KS_AAD_CONTEXT_SMALL + 1, KS_CONTEXT_MAX};
    _Static_assert(KS_TENANT_MAX == KS_PURPOSE_MAX, "one buffer for both names");
    memset(ctxbuf, 'c', sizeof ctxbuf);
    memset(name, 'n', sizeof name);
    for (uint8_t format = 1; format <= 2; format++) {
        for (uint32_t alg = 1; alg <= 2; alg++) {
            if (alg == KS_ALG_AES256GCM && !aes_ok()) {
                continue;
            }
            for (size_t longest = 0; longest <= 1; longest++) {
                for (size_t i = 0; i < sizeof lens / sizeof *lens; i++) {
                    ks_seal_params p = params(format, alg);
                    if (longest) {
                        p.tenant = (ks_bytes){name, sizeof name};
                        if (format == KS_FORMAT_V2) {
                            p.purpose = (ks_bytes){name, sizeof name};
                        }
                    }
                    p.context = (ks_bytes){lens[i] ? ctxbuf : NULL, lens[i]};
                    sealed s = seal_ok(w->ctx, &p, msg, sizeof msg);
                    ks_open_params o = {p.context, {NULL, 0}, {NULL, 0}};
                    open_expect(w->ctx, s, &o, msg, sizeof msg);
                    open_expect(w->ctx, s, &o, msg, sizeof msg); /* from the thread's read key */
                    uint8_t pt[8];
                    size_t n = 0;
                    o.context.len = lens[i] ? lens[i] - 1 : 1;
                    o.context.ptr = ctxbuf;
                    assert_int_equal(open_env(w->ctx, s.buf, s.len, &o, pt, sizeof pt, &n), KS_ERR_AUTH_FAILED);
                    free(s.buf);
                }
            }
        }
    }
}

/* One opener thread: each envelope of a set, many times over. */
typedef struct opener {
    ks_ctx *ctx;
    const sealed *s;
    size_t n;
    const uint8_t *msg;
    size_t msg_len;
    int bad;
} opener;

static void *open_many(void *arg)
{
    opener *o = arg;
    uint8_t pt[64];
    for (size_t r = 0; r < 2000; r++) {
        const sealed *e = &o->s[(r * 7 + (size_t)o->bad) % o->n];
        size_t n = 0;
        if (ks_open(o->ctx, e->buf, e->len, &open_any, pt, sizeof pt, &n, NULL) != KS_OK ||
            n != o->msg_len || memcmp(pt, o->msg, n) != 0) {
            o->bad = -1;
            break;
        }
    }
    return NULL;
}

/* Threads opening more v1 aes-256-gcm DEKs than the cache holds: states
 * are pinned, orphaned by eviction and reused while others decrypt. */
static void test_cache_aes_states_threads(void **state)
{
    world *w = *state;
    static const uint8_t msg[6] = "thread";
    enum { THREADS = 4, ENVS = 5 };
    sealed s[ENVS];
    ks_ctx *ctx = aes_cache_ctx(w, 3, msg, sizeof msg, s, ENVS);
    pthread_t th[THREADS];
    opener o[THREADS];
    for (int i = 0; i < THREADS; i++) {
        o[i] = (opener){ctx, s, ENVS, msg, sizeof msg, i};
        assert_int_equal(pthread_create(&th[i], NULL, open_many, &o[i]), 0);
    }
    for (int i = 0; i < THREADS; i++) {
        assert_int_equal(pthread_join(th[i], NULL), 0);
        assert_int_not_equal(o[i].bad, -1);
    }
    ks_metrics m = metrics(ctx);
    assert_int_equal(m.cache_hits + m.cache_misses, THREADS * 2000);
    free_sealed_ctx(s, ENVS, ctx);
}

/* Test derivation: every byte of the state is the value's first byte + 1. */
static void derive_plus1(void *st, const uint8_t *val, size_t len)
{
    assert_true(len >= 1);
    memset(st, val[0] + 1, 32);
}

/* The state pool itself: a pinned state outlives its entry unchanged, is
 * wiped by its last unpin, and is not handed out while pinned. */
static void test_cache_state_pins(void **state)
{
    (void)state;
    ks_dek_cache *c = NULL;
    static const uint8_t k1[] = "key-one", k2[] = "key-two", k3[] = "key-3re";
    const uint8_t v1[1] = {10}, v2[1] = {20}, v3[1] = {30};
    uint8_t val[1];
    size_t len = 0;
    static const uint8_t zero[32];
    assert_int_equal(ks_dek_cache_new(2, 100, 1, 1, 0, &c), KS_OK);
    assert_int_equal(ks_dek_cache_enable_states(c, 24, 1, derive_plus1), KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_dek_cache_enable_states(c, 32, 0, derive_plus1), KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_dek_cache_enable_states(c, 32, 1, derive_plus1), KS_OK); /* one state */
    assert_int_equal(ks_dek_cache_enable_states(c, 32, 1, derive_plus1), KS_ERR_INVALID_ARGUMENT);
    ks_dek_cache_pin pin = {NULL, 0}, pin2 = {NULL, 0};
    ks_dek_cache_put(c, k1, sizeof k1, v1, 1, 1);
    assert_int_equal(ks_dek_cache_get_pinned(c, k1, sizeof k1, val, &len, &pin, NULL), 1);
    assert_non_null(pin.state);
    const uint8_t *st = pin.state;
    assert_int_equal(st[0], 11);
    assert_int_equal(st[31], 11);
    /* Plain lookups still copy the value. */
    assert_int_equal(ks_dek_cache_get(c, k1, sizeof k1, val, &len), 1);
    assert_int_equal(len, 1);
    assert_int_equal(val[0], 10);
    /* Replacing k1 orphans its pinned state: k1's new entry gets no state
     * (the only one is pinned), and the pinned bytes do not change. */
    ks_dek_cache_put(c, k1, sizeof k1, v2, 1, 1);
    assert_int_equal(st[0], 11);
    val[0] = 0;
    assert_int_equal(ks_dek_cache_get_pinned(c, k1, sizeof k1, val, &len, &pin2, NULL), 1);
    assert_null(pin2.state);
    assert_int_equal(val[0], 20);
    /* The last unpin wipes the orphan; then the slot is reused. */
    ks_dek_cache_unpin(c, &pin);
    assert_null(pin.state);
    assert_memory_equal(st, zero, 32);
    ks_dek_cache_put(c, k2, sizeof k2, v2, 1, 1);
    assert_int_equal(ks_dek_cache_get_pinned(c, k2, sizeof k2, val, &len, &pin, NULL), 1);
    assert_true(pin.state == st);
    assert_int_equal(st[0], 21);
    ks_dek_cache_unpin(c, &pin);
    /* Taking an unpinned state from its owner: k3 steals k2's; k2 then
     * copies its value out.  An entry evicted unpinned is wiped at once. */
    ks_dek_cache_put(c, k3, sizeof k3, v3, 1, 1);
    assert_int_equal(st[0], 31);
    assert_int_equal(ks_dek_cache_get_pinned(c, k2, sizeof k2, val, &len, &pin, NULL), 1);
    assert_null(pin.state);
    assert_int_equal(val[0], 20);
    ks_dek_cache_put(c, k1, sizeof k1, v1, 1, 0); /* no state: evicts k3, the least recent */
    assert_memory_equal(st, zero, 32);
    assert_int_equal(ks_dek_cache_get_pinned(c, k3, sizeof k3, val, &len, &pin, NULL), 0);
    /* Expiry drops a pinned entry too; its state lives until unpinned. */
    ks_dek_cache_put(c, k3, sizeof k3, v3, 1, 1);
    assert_int_equal(ks_dek_cache_get_pinned(c, k3, sizeof k3, val, &len, &pin, NULL), 1);
    assert_true(pin.state == st);
    ks_mono_test_advance(200);
    assert_int_equal(ks_dek_cache_get_pinned(c, k3, sizeof k3, val, &len, &pin2, NULL), 0);
    assert_int_equal(st[0], 31);
    ks_dek_cache_unpin(c, &pin);
    assert_memory_equal(st, zero, 32);
    ks_dek_cache_unpin(c, &pin); /* no-op */
    ks_dek_cache_free(c);
}

/* ---- provider failures ---------------------------------------------------- */

static void test_provider_failures(void **state)
{
    world *w = *state;
    static const ks_err errs[] = {KS_ERR_UNAVAILABLE, KS_ERR_TIMEOUT, KS_ERR_DENIED, KS_ERR_REVOKED,
                                  KS_ERR_NOT_FOUND, KS_ERR_INTEGRITY};
    static const uint8_t msg[6] = "secret";
    ks_seal_params p = params(2, 2);
    sealed good = seal_ok(w->ctx, &p, msg, sizeof msg);
    for (size_t i = 0; i < sizeof errs / sizeof *errs; i++) {
        for (int op = KS_MEM_WRAP; op <= KS_MEM_KEY_INFO; op++) {
            ks_ctx *ctx = new_ctx(w, NULL);
            uint8_t out[512];
            size_t n = 0;
            memset(out, 0xA5, sizeof out);
            ks_mem_fail(&w->mem, (ks_mem_op)op, errs[i], 1);
            ks_err seal = ks_seal(ctx, &p, msg, sizeof msg, out, sizeof out, &n);
            ks_err open = open_env(ctx, good.buf, good.len, &open_any, out, sizeof out, &n);
            ks_mem_fail(&w->mem, (ks_mem_op)op, KS_OK, 0);
            ks_metrics m = metrics(ctx);
            if (op == KS_MEM_UNWRAP) {
                assert_int_equal(seal, KS_OK);
                assert_int_equal(open, errs[i]);
                assert_int_equal(m.opens, 0);
            } else {
                assert_int_equal(seal, errs[i]);
                assert_int_equal(open, KS_OK);
                assert_int_equal(m.seals, 0);
                assert_int_equal(m.deks_created, 0);
                /* nothing was written: the open above only wrote 6 bytes */
                for (size_t j = sizeof msg; j < sizeof out; j++) {
                    assert_int_equal(out[j], 0xA5);
                }
            }
            assert_int_equal(m.provider_errors[errs[i] - KS_ERR_UNAVAILABLE], 1);
            assert_int_equal(m.unknown_key, errs[i] == KS_ERR_NOT_FOUND);
            assert_true(ks_err_is_retryable(errs[i]) == (i < 2));
            /* The failure is not sticky. */
            n = 0;
            assert_int_equal(ks_seal(ctx, &p, msg, sizeof msg, out, sizeof out, &n), KS_OK);
            ks_ctx_free(ctx);
        }
    }
    /* An unwrap the provider rejects as not genuine is auth-failed. */
    ks_mem_fail(&w->mem, KS_MEM_UNWRAP, KS_ERR_AUTH_FAILED, 1);
    ks_ctx *ctx = new_ctx(w, NULL);
    uint8_t pt[16];
    size_t n;
    assert_int_equal(open_env(ctx, good.buf, good.len, &open_any, pt, sizeof pt, &n), KS_ERR_AUTH_FAILED);
    assert_int_equal(metrics(ctx).auth_fail_unwrap, 1);
    ks_ctx_free(ctx);
    free(good.buf);
}

/* aes-256-gcm where AES-NI is missing: refused both ways, never switched.
 * Simulated with the library's test hook. */
static void test_algorithm_unavailable(void **state)
{
    world *w = *state;
    static const uint8_t msg[2] = "hi";
    ks_seal_params p = params(2, 1);
    sealed s = {NULL, 0};
    if (aes_ok()) {
        s = seal_ok(w->ctx, &p, msg, sizeof msg);
    }
    ks_crypto_test_hide_aes(1);
    uint8_t out[512];
    size_t n;
    assert_int_equal(ks_seal(w->ctx, &p, msg, sizeof msg, out, sizeof out, &n),
                     KS_ERR_ALGORITHM_UNAVAILABLE);
    if (s.buf != NULL) {
        assert_int_equal(open_env(w->ctx, s.buf, s.len, &open_any, out, sizeof out, &n),
                         KS_ERR_ALGORITHM_UNAVAILABLE);
    }
    ks_crypto_test_hide_aes(0);
    if (s.buf != NULL) {
        open_expect(w->ctx, s, &open_any, msg, sizeof msg);
    }
    free(s.buf);
}

/* ---- arguments -------------------------------------------------------- */

static void test_arguments(void **state)
{
    world *w = *state;
    uint8_t out[2048], pt[64];
    size_t n;
    static const uint8_t msg[8] = "argument";
    ks_seal_params p = params(1, 2);
    p.purpose = BV("x"); /* v1 has no purpose */
    assert_int_equal(ks_seal(w->ctx, &p, msg, sizeof msg, out, sizeof out, &n), KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_seal_max_len(&p, 1), 0);
    p = params(2, 2);
    p.purpose = (ks_bytes){NULL, 0}; /* v2 requires one */
    assert_int_equal(ks_seal(w->ctx, &p, msg, sizeof msg, out, sizeof out, &n), KS_ERR_INVALID_ARGUMENT);
    p = params(2, 2);
    p.tenant = BV("ac me");
    assert_int_equal(ks_seal(w->ctx, &p, msg, sizeof msg, out, sizeof out, &n), KS_ERR_INVALID_ARGUMENT);
    p = params(2, 3);
    assert_int_equal(ks_seal(w->ctx, &p, msg, sizeof msg, out, sizeof out, &n), KS_ERR_INVALID_ARGUMENT);
    p = params(3, 2);
    assert_int_equal(ks_seal(w->ctx, &p, msg, sizeof msg, out, sizeof out, &n), KS_ERR_INVALID_ARGUMENT);
    p = params(2, 2);
    static uint8_t big_ctx[KS_CONTEXT_MAX + 1];
    p.context = (ks_bytes){big_ctx, sizeof big_ctx};
    assert_int_equal(ks_seal(w->ctx, &p, msg, sizeof msg, out, sizeof out, &n), KS_ERR_INVALID_ARGUMENT);
    p.context.len = KS_CONTEXT_MAX; /* the maximum is fine */
    assert_int_equal(ks_seal(w->ctx, &p, msg, sizeof msg, out, sizeof out, &n), KS_OK);
    ks_open_params o = {p.context, {NULL, 0}, {NULL, 0}};
    open_expect(w->ctx, (sealed){out, n}, &o, msg, sizeof msg);
    /* [F-CRYPTO-CTX-1] Opening with a context over the maximum is a caller
     * error found before the envelope is parsed, whatever its bytes. */
    const ks_open_params too_big = {{big_ctx, sizeof big_ctx}, {NULL, 0}, {NULL, 0}};
    ks_parse_error ctx_pe = {KS_OK, 0, 0};
    size_t ctx_n = 0;
    assert_int_equal(ks_open(w->ctx, out, n, &too_big, pt, sizeof pt, &ctx_n, &ctx_pe),
                     KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_open(w->ctx, (const uint8_t *)"7B7D", 4, &too_big, pt, sizeof pt, &ctx_n, &ctx_pe),
                     KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ctx_pe.code, KS_OK); /* not a rejection: nothing was parsed */
    assert_int_equal(ks_verify(w->ctx, out, n, &too_big, &ctx_pe), KS_ERR_INVALID_ARGUMENT);
    /* Plaintext beyond the default ciphertext limit. */
    p = params(0, 0);
    assert_int_equal(ks_seal(w->ctx, &p, msg, KS_CIPHERTEXT_DEFAULT_MAX - KS_TAG_LEN + 1, out, sizeof out, &n),
                     KS_ERR_TOO_LARGE);
    assert_int_equal(ks_seal_max_len(&p, KS_CIPHERTEXT_DEFAULT_MAX - KS_TAG_LEN + 1), 0);
    /* Defaults: format 2, xchacha. */
    assert_int_equal(ks_seal(w->ctx, &p, msg, sizeof msg, out, sizeof out, &n), KS_OK);
    sealed s = {out, n};
    ks_envelope e = parse_ok(s);
    assert_int_equal(e.version, 2);
    assert_int_equal(e.algorithm, KS_ALG_XCHACHA20POLY1305);
    assert_true(n <= ks_seal_max_len(&p, sizeof msg));
    /* Short buffers: nothing written. */
    uint8_t small[64];
    memset(small, 0xA5, sizeof small);
    assert_int_equal(ks_seal(w->ctx, &p, msg, sizeof msg, small, sizeof small, &n), KS_ERR_BUFFER_TOO_SMALL);
    assert_int_equal(small[0], 0xA5);
    memset(pt, 0xA5, sizeof pt);
    assert_int_equal(open_env(w->ctx, out, s.len, &open_any, pt, sizeof msg - 1, &n), KS_ERR_BUFFER_TOO_SMALL);
    assert_int_equal(pt[0], 0xA5);
    /* Parse errors are counted by code. */
    ks_parse_error pe;
    assert_int_equal(ks_open(w->ctx, out, s.len - 1, &open_any, pt, sizeof pt, &n, &pe), KS_ERR_TRUNCATED);
    assert_int_equal(pe.code, KS_ERR_TRUNCATED);
    assert_int_equal(metrics(w->ctx).parse_errors[KS_ERR_TRUNCATED], 1);
    /* NULLs. */
    assert_int_equal(ks_seal(NULL, &p, msg, 1, out, sizeof out, &n), KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_seal(w->ctx, &p, NULL, 1, out, sizeof out, &n), KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_open(w->ctx, out, s.len, NULL, pt, sizeof pt, &n, &pe), KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_rewrap(w->ctx, out, s.len, NULL, pt, sizeof pt, &n, &pe), KS_ERR_INVALID_ARGUMENT);
    /* Configs. */
    ks_ctx *ctx = NULL;
    ks_ctx_config cfg;
    ks_ctx_config_default(&cfg);
    cfg.dek_max_messages = 0;
    assert_int_equal(ks_ctx_new(&w->prov, &cfg, &ctx), KS_ERR_INVALID_ARGUMENT);
    cfg.dek_max_messages = KS_DEK_MAX_MESSAGES_AESGCM + 1;
    assert_int_equal(ks_ctx_new(&w->prov, &cfg, &ctx), KS_ERR_INVALID_ARGUMENT);
    ks_ctx_config_default(&cfg);
    cfg.cache_ttl = 0;
    assert_int_equal(ks_ctx_new(&w->prov, &cfg, &ctx), KS_ERR_INVALID_ARGUMENT);
    ks_provider none = {NULL, NULL, "none"};
    assert_int_equal(ks_ctx_new(&none, NULL, &ctx), KS_ERR_INVALID_ARGUMENT);
    assert_null(ctx);
    ks_ctx_free(NULL);
    ks_metrics m;
    ks_ctx_metrics(NULL, &m);
    assert_int_equal(m.seals, 0);
}

/* ---- nonce uniqueness ----------------------------------------------------- */

/* One seal's (DEK identity, nonce): a 16-byte hash of the wrapped DEK
 * (distinct DEKs have distinct wrapped bytes) and the nonce itself. */
typedef struct pair {
    uint8_t dek[16];
    uint8_t nonce[KS_XCHACHA20POLY1305_NONCE_LEN];
} pair;

static pair pair_of(const uint8_t *env, size_t len)
{
    ks_envelope e;
    pair r;
    memset(&r, 0, sizeof r);
    assert_int_equal(ks_envelope_parse(env, len, NULL, &e, NULL), KS_OK);
    crypto_generichash(r.dek, sizeof r.dek, e.wrapped_dek.ptr, e.wrapped_dek.len, NULL, 0);
    memcpy(r.nonce, e.nonce.ptr, e.nonce.len);
    return r;
}

static int pair_cmp(const void *a, const void *b)
{
    return memcmp(a, b, sizeof(pair));
}

/* Sort and check that no pair repeats. */
static void assert_unique(pair *v, size_t n)
{
    qsort(v, n, sizeof *v, pair_cmp);
    for (size_t i = 1; i < n; i++) {
        assert_true(memcmp(&v[i - 1], &v[i], sizeof *v) != 0);
    }
}

typedef struct sealer {
    ks_ctx *ctx;
    const ks_seal_params *p;
    pair *out;
    size_t n;
} sealer;

/* Thread body: n seals of an empty message, recording each pair. */
static void *seal_many(void *arg)
{
    sealer *s = arg;
    uint8_t env[512];
    for (size_t i = 0; i < s->n; i++) {
        size_t len = 0;
        if (ks_seal(s->ctx, s->p, NULL, 0, env, sizeof env, &len) != KS_OK) {
            return (void *)1;
        }
        s->out[i] = pair_of(env, len);
    }
    return NULL;
}

static void test_threads_nonce_unique(void **state)
{
    world *w = *state;
    enum { THREADS = 4, PER = 5000 };
    ks_ctx_config cfg;
    ks_ctx_config_default(&cfg);
    cfg.dek_max_messages = 997; /* rotate under contention too */
    ks_ctx *ctx = new_ctx(w, &cfg);
    ks_seal_params p = params(2, 2);
    pair *all = calloc(THREADS * PER, sizeof *all);
    assert_non_null(all);
    pthread_t th[THREADS];
    sealer s[THREADS];
    for (size_t i = 0; i < THREADS; i++) {
        s[i] = (sealer){ctx, &p, all + i * PER, PER};
        assert_int_equal(pthread_create(&th[i], NULL, seal_many, &s[i]), 0);
    }
    for (size_t i = 0; i < THREADS; i++) {
        void *rc;
        assert_int_equal(pthread_join(th[i], &rc), 0);
        assert_null(rc);
    }
    assert_unique(all, THREADS * PER);
    ks_metrics m = metrics(ctx);
    assert_int_equal(m.seals, THREADS * PER);
    assert_true(m.deks_created >= (THREADS * PER + 996) / 997);
    assert_int_equal(m.wraps, m.deks_created);
    free(all);
    ks_ctx_free(ctx);
}

/* A forked child keeps sealing with the parent's context: it gets a new
 * DEK, and no (DEK, nonce) repeats across the two processes. */
static void test_fork(void **state)
{
    world *w = *state;
    enum { N = 200 };
    ks_seal_params p = params(2, 2);
    pair *v = calloc(3 * N, sizeof *v);
    assert_non_null(v);
    sealer s = {w->ctx, &p, v, N};
    assert_null(seal_many(&s)); /* the parent's DEK exists before the fork */
    int fd[2];
    assert_int_equal(pipe(fd), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(fd[0]);
        sealer c = {w->ctx, &p, v + N, N};
        int ok = seal_many(&c) == NULL;
        size_t bytes = N * sizeof *v;
        ok = ok && write(fd[1], v + N, bytes) == (ssize_t)bytes;
        close(fd[1]);
        _exit(ok ? 0 : 1);
    }
    close(fd[1]);
    size_t got = 0, want = N * sizeof *v;
    while (got < want) {
        ssize_t r = read(fd[0], (uint8_t *)(v + N) + got, want - got);
        assert_true(r > 0);
        got += (size_t)r;
    }
    close(fd[0]);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    /* The parent continues on its DEK. */
    s.out = v + 2 * N;
    assert_null(seal_many(&s));
    assert_memory_not_equal(v[0].dek, v[N].dek, sizeof v[0].dek);
    assert_memory_equal(v[0].dek, v[2 * N].dek, sizeof v[0].dek);
    for (size_t i = N; i < 2 * N; i++) {
        assert_memory_equal(v[N].dek, v[i].dek, sizeof v[0].dek);
    }
    assert_unique(v, 3 * N);
    free(v);
}

/* 10^6 seals in one context: no (DEK, nonce) repeats.  Empty plaintexts,
 * v1 (no derivation), and a DEK every 2^17 seals so that several DEKs and
 * their counters are exercised. */
static void test_million_nonces(void **state)
{
    world *w = *state;
    enum { N = 1000000 };
    ks_ctx_config cfg;
    ks_ctx_config_default(&cfg);
    cfg.dek_max_messages = (uint64_t)1 << 17;
    ks_ctx *ctx = new_ctx(w, &cfg);
    ks_seal_params p = params(1, 2);
    pair *v = malloc(N * sizeof *v);
    assert_non_null(v);
    sealer s = {ctx, &p, v, N};
    assert_null(seal_many(&s));
    assert_unique(v, N);
    assert_int_equal(metrics(ctx).deks_created, (N + (1 << 17) - 1) >> 17);
    free(v);
    ks_ctx_free(ctx);
}

int main(void)
{
#define T(f) cmocka_unit_test_setup_teardown(f, world_setup, world_teardown)
    const struct CMUnitTest tests[] = {
        T(test_round_trip),
        T(test_round_trip_no_cache),
        T(test_health_sample),
        T(test_aead_tag_only),
        T(test_aead_engines),
        T(test_aead_engine_rule),
        T(test_engines_cross),
        T(test_verify),
        T(test_bit_flips),
        T(test_binding),
        T(test_swapped_fields),
        T(test_commitment_before_aead),
        T(test_rewrap),
        T(test_rewrap_memo),
        T(test_dek_rotation),
        T(test_seal_tuple_names),
        T(test_cache),
        T(test_cache_aes_states),
        T(test_cache_aes_states_threads),
        T(test_cache_state_pins),
        T(test_data_aad_contexts),
        T(test_provider_failures),
        T(test_algorithm_unavailable),
        T(test_arguments),
        T(test_threads_nonce_unique),
        T(test_fork),
        T(test_million_nonces),
        cmocka_unit_test_setup_teardown(test_keyring_round_trip, keyring_setup, world_teardown),
        cmocka_unit_test_setup_teardown(test_keyring_rewrap, keyring_setup, world_teardown),
    };
#undef T
    return cmocka_run_group_tests(tests, NULL, NULL);
}
