/*
 * tests/test_open_memo.c -- an open shaped like the last one.
 *
 * A thread's shard keeps, with the read keys of each DEK it opened, the
 * shape of that DEK's envelopes (parser/envelope_head.h: their header
 * but for the nonce's and commitment's values) and their data AAD less
 * the context.  The next open shaped like the last keys' envelopes
 * parses only its ciphertext field and takes those keys without building
 * the wrap identity.  These tests check that the short way gives exactly
 * what the long way gives: the same plaintext, the same rejections at the
 * same offsets, the same failures for an envelope that shares the head
 * but not the wrap identity (another purpose) or the commitment, and
 * that such an envelope leaves nothing behind that a later open would
 * use.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <sodium.h>

#include <keyshift/crypto.h>

#include "../migrate/crypto/open_parsed.h"
#include "envelope_eq.h"
#include "mem_provider.h"

#define KEY "app-key"
#define BV(s) ((ks_bytes){(const uint8_t *)(s), sizeof(s) - 1})

typedef struct world {
    ks_mem_provider mem;
    ks_provider prov;
    ks_ctx *ctx;
} world;

static int setup(void **state)
{
    world *w = calloc(1, sizeof *w);
    assert_non_null(w);
    assert_true(sodium_init() >= 0);
    ks_mem_init(&w->mem);
    assert_int_equal(ks_mem_add(&w->mem, KEY, 1, 1, NULL), 0);
    w->prov = ks_mem_provider_of(&w->mem);
    assert_int_equal(ks_ctx_new(&w->prov, NULL, &w->ctx), KS_OK);
    *state = w;
    return 0;
}

static int teardown(void **state)
{
    world *w = *state;
    ks_ctx_free(w->ctx);
    ks_mem_cleanup(&w->mem);
    free(w);
    return 0;
}

/* The algorithms this machine runs (aes-256-gcm needs AES-NI). */
static size_t algs(uint32_t out[2])
{
    size_t n = 0;
    if (crypto_aead_aes256gcm_is_available()) {
        out[n++] = KS_ALG_AES256GCM;
    }
    out[n++] = KS_ALG_XCHACHA20POLY1305;
    return n;
}

/* Seal parameters: tenant "acme", purpose "db.users" for v2, context
 * "row:42". */
static ks_seal_params params(uint8_t format, uint32_t alg)
{
    ks_seal_params p = {format, alg, BV("acme"), BV(KEY), 0, {NULL, 0}, BV("row:42")};
    if (format == KS_FORMAT_V2) {
        p.purpose = BV("db.users");
    }
    return p;
}

static const ks_open_params open_row = {BV("row:42"), {NULL, 0}, {NULL, 0}};

/* Seal pt[0, len) under p into a fresh exact buffer; *n its length. */
static uint8_t *seal(ks_ctx *ctx, const ks_seal_params *p, const uint8_t *pt, size_t len, size_t *n)
{
    const size_t cap = ks_seal_max_len(p, len);
    uint8_t *buf = malloc(cap);
    assert_non_null(buf);
    assert_int_equal(ks_seal(ctx, p, pt, len, buf, cap, n), KS_OK);
    return buf;
}

/* Open env[0, n) and return the code; on success check the plaintext. */
static ks_err open_check(ks_ctx *ctx, const uint8_t *env, size_t n, const uint8_t *pt, size_t len,
                         ks_parse_error *pe)
{
    uint8_t out[256];
    size_t got = 0;
    memset(pe, 0, sizeof *pe);
    ks_err e = ks_open(ctx, env, n, &open_row, out, sizeof out, &got, pe);
    if (e == KS_OK) {
        assert_int_equal(got, len);
        assert_memory_equal(out, pt, len);
    }
    return e;
}

static ks_metrics metrics(ks_ctx *ctx)
{
    ks_metrics m;
    ks_ctx_metrics(ctx, &m);
    return m;
}

/* A copy of env[0, n) in an exact buffer of m bytes (the rest zero). */
static uint8_t *copy_of(const uint8_t *env, size_t n, size_t m)
{
    uint8_t *c = calloc(1, m);
    assert_non_null(c);
    memcpy(c, env, n < m ? n : m);
    return c;
}

/* Envelopes of one DEK open through the short way with no unwrap after
 * the first, in every format and algorithm; and every truncation, every
 * one-byte extension and every change of a byte after the head is
 * refused exactly as ks_envelope_parse refuses it (code, offset, field),
 * counted as a parse error, or when it still parses fails to open; and
 * leaves the next open unharmed.  (A changed purpose that is still a
 * name goes to the provider, as test_other_purpose checks.) */
static void test_same_results(void **state)
{
    world *w = *state;
    uint32_t alg[2];
    const size_t nalg = algs(alg);
    static const uint8_t pt1[] = "first record", pt2[] = "second record, longer";
    for (uint8_t f = KS_FORMAT_V1; f <= KS_FORMAT_V2; f++) {
        for (size_t a = 0; a < nalg; a++) {
            ks_seal_params p = params(f, alg[a]);
            size_t n1, n2;
            uint8_t *e1 = seal(w->ctx, &p, pt1, sizeof pt1, &n1);
            uint8_t *e2 = seal(w->ctx, &p, pt2, sizeof pt2, &n2);
            ks_parse_error pe;
            assert_int_equal(open_check(w->ctx, e1, n1, pt1, sizeof pt1, &pe), KS_OK);
            const uint64_t unwraps = metrics(w->ctx).unwraps;
            assert_int_equal(open_check(w->ctx, e2, n2, pt2, sizeof pt2, &pe), KS_OK);
            assert_int_equal(open_check(w->ctx, e1, n1, pt1, sizeof pt1, &pe), KS_OK);
            assert_int_equal(metrics(w->ctx).unwraps, unwraps);

            ks_envelope env;
            assert_int_equal(ks_envelope_parse(e2, n2, NULL, &env, NULL), KS_OK);
            const size_t head = (size_t)(env.wrapped_dek.ptr - e2) + env.wrapped_dek.len;
            for (size_t m = head; m <= n2 + 1; m++) { /* cut, whole, one byte more */
                for (int v = 0; v < (m <= n2 ? 1 : 3); v++) {
                    uint8_t *c = copy_of(e2, n2, m);
                    if (m > n2) {
                        c[n2] = (uint8_t)(v == 0 ? 0x00 : v == 1 ? 0x7A : 0x80);
                    }
                    ks_envelope ref;
                    ks_parse_error rpe;
                    const ks_err want = ks_envelope_parse(c, m, NULL, &ref, &rpe);
                    const uint64_t before = metrics(w->ctx).parse_errors[want];
                    const ks_err got = open_check(w->ctx, c, m, pt2, sizeof pt2, &pe);
                    assert_int_equal(got, want);
                    if (want != KS_OK) {
                        assert_int_equal(pe.code, rpe.code);
                        assert_int_equal(pe.offset, rpe.offset);
                        assert_int_equal(pe.field, rpe.field);
                        assert_int_equal(metrics(w->ctx).parse_errors[want], before + 1);
                    }
                    free(c);
                }
            }
            for (size_t off = head; off < n2; off++) {
                uint8_t *c = copy_of(e2, n2, n2);
                c[off] ^= 0x41;
                ks_envelope ref;
                ks_parse_error rpe;
                const ks_err want = ks_envelope_parse(c, n2, NULL, &ref, &rpe);
                const ks_err got = open_check(w->ctx, c, n2, pt2, sizeof pt2, &pe);
                if (want != KS_OK) {
                    assert_int_equal(got, want);
                    assert_int_equal(pe.offset, rpe.offset);
                    assert_int_equal(pe.field, rpe.field);
                } else {
                    assert_int_equal(got, KS_ERR_AUTH_FAILED); /* parsed, but not what was sealed */
                }
                free(c);
                assert_int_equal(open_check(w->ctx, e1, n1, pt1, sizeof pt1, &pe), KS_OK);
            }
            free(e1);
            free(e2);
        }
    }
}

/* Run fn on a fresh v2 envelope of "record" sealed on w's context,
 * with its parse, for each algorithm this machine runs. */
static void each_v2(world *w, void (*fn)(world *, const uint8_t *, size_t, const ks_envelope *, const uint8_t *,
                                         size_t))
{
    uint32_t alg[2];
    const size_t nalg = algs(alg);
    static const uint8_t pt[] = "record";
    for (size_t a = 0; a < nalg; a++) {
        ks_seal_params p = params(KS_FORMAT_V2, alg[a]);
        size_t n;
        ks_envelope env;
        uint8_t *e = seal(w->ctx, &p, pt, sizeof pt, &n);
        assert_int_equal(ks_envelope_parse(e, n, NULL, &env, NULL), KS_OK);
        fn(w, e, n, &env, pt, sizeof pt);
        free(e);
    }
}

/* A v2 envelope with the last keys' head but another purpose has
 * another wrap identity: it is not opened with those keys but goes to
 * the provider, which refuses it (the purpose is in the wrap AAD); the
 * keys' envelopes still open. */
static void other_purpose(world *w, const uint8_t *e, size_t n, const ks_envelope *env, const uint8_t *pt,
                          size_t len)
{
    ks_parse_error pe;
    assert_int_equal(open_check(w->ctx, e, n, pt, len, &pe), KS_OK);
    uint8_t *c = copy_of(e, n, n);
    const size_t at = (size_t)(env->purpose.ptr - e);
    c[at] = c[at] == 'x' ? 'y' : 'x'; /* "db.users" -> "xb.users": same length, still a name */
    const ks_metrics before = metrics(w->ctx);
    assert_int_equal(open_check(w->ctx, c, n, pt, len, &pe), KS_ERR_AUTH_FAILED);
    const ks_metrics after = metrics(w->ctx);
    assert_int_equal(after.unwraps, before.unwraps + 1);
    assert_int_equal(after.auth_fail_unwrap, before.auth_fail_unwrap + 1);
    assert_int_equal(open_check(w->ctx, e, n, pt, len, &pe), KS_OK);
    free(c);
}

static void test_other_purpose(void **state)
{
    each_v2(*state, other_purpose);
}

/* A v2 envelope with a wrong commitment opened first, on a fresh
 * context, puts its DEK's keys in the shard and fails; the keys' data
 * AAD holds the true commitment (the shape never compares the
 * commitment's value), so the DEK's real envelopes then open, and the
 * bad one keeps failing on the commitment. */
static void bad_commitment_first(world *w, const uint8_t *e, size_t n, const ks_envelope *env,
                                 const uint8_t *pt, size_t len)
{
    uint8_t *c = copy_of(e, n, n);
    c[(size_t)(env->commitment.ptr - e) + 5] ^= 1;
    ks_ctx *fresh = NULL;
    assert_int_equal(ks_ctx_new(&w->prov, NULL, &fresh), KS_OK);
    ks_parse_error pe;
    for (int round = 0; round < 2; round++) {
        const uint64_t bad = metrics(fresh).auth_fail_commitment;
        assert_int_equal(open_check(fresh, c, n, pt, len, &pe), KS_ERR_AUTH_FAILED);
        assert_int_equal(metrics(fresh).auth_fail_commitment, bad + 1);
        assert_int_equal(open_check(fresh, e, n, pt, len, &pe), KS_OK);
        assert_int_equal(ks_verify(fresh, e, n, &open_row, NULL), KS_OK);
        assert_int_equal(ks_verify(fresh, c, n, &open_row, NULL), KS_ERR_AUTH_FAILED);
    }
    ks_ctx_free(fresh);
    free(c);
}

static void test_bad_commitment_first(void **state)
{
    each_v2(*state, bad_commitment_first);
}

/* The reader's bindings are checked on the short way too: a tenant or
 * a purpose other than the envelope's fails, a context other than the
 * sealed one fails the AEAD. */
static void test_bindings(void **state)
{
    world *w = *state;
    static const uint8_t pt[] = "record";
    ks_seal_params p = params(KS_FORMAT_V2, KS_ALG_XCHACHA20POLY1305);
    size_t n, got;
    uint8_t *e = seal(w->ctx, &p, pt, sizeof pt, &n);
    uint8_t out[64];
    ks_parse_error pe;
    assert_int_equal(open_check(w->ctx, e, n, pt, sizeof pt, &pe), KS_OK);
    const ks_open_params tenant = {BV("row:42"), BV("other"), {NULL, 0}};
    const ks_open_params purpose = {BV("row:42"), BV("acme"), BV("db.other")};
    const ks_open_params context = {BV("row:43"), BV("acme"), BV("db.users")};
    const ks_open_params right = {BV("row:42"), BV("acme"), BV("db.users")};
    assert_int_equal(ks_open(w->ctx, e, n, &tenant, out, sizeof out, &got, NULL), KS_ERR_AUTH_FAILED);
    assert_int_equal(ks_open(w->ctx, e, n, &purpose, out, sizeof out, &got, NULL), KS_ERR_AUTH_FAILED);
    assert_int_equal(ks_open(w->ctx, e, n, &context, out, sizeof out, &got, NULL), KS_ERR_AUTH_FAILED);
    assert_int_equal(ks_open(w->ctx, e, n, &right, out, sizeof out, &got, NULL), KS_OK);
    assert_int_equal(got, sizeof pt);
    free(e);
}

/* ks_crypto_parse (the application's parse before its phase check)
 * gives ks_envelope_parse's result, the same views, whether or not the
 * input is shaped like the last keys' envelopes. */
static void test_crypto_parse(void **state)
{
    world *w = *state;
    static const uint8_t pt[] = "record";
    ks_seal_params p = params(KS_FORMAT_V2, KS_ALG_XCHACHA20POLY1305);
    size_t n;
    uint8_t *e = seal(w->ctx, &p, pt, sizeof pt, &n);
    for (int opened = 0; opened < 2; opened++) {
        for (size_t m = 0; m <= n; m++) {
            uint8_t *c = copy_of(e, n, m);
            ks_envelope a, b;
            ks_parse_error pa = {0}, pb = {0};
            const ks_err ga = ks_envelope_parse(c, m, NULL, &a, &pa);
            assert_int_equal(ks_crypto_parse(w->ctx, c, m, &b, &pb), ga);
            if (ga == KS_OK) {
                assert_true(ks_test_result_eq(&a, &b));
            } else {
                assert_int_equal(pb.offset, pa.offset);
                assert_int_equal(pb.field, pa.field);
            }
            free(c);
        }
        ks_parse_error pe;
        assert_int_equal(open_check(w->ctx, e, n, pt, sizeof pt, &pe), KS_OK);
    }
    free(e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_same_results, setup, teardown),
        cmocka_unit_test_setup_teardown(test_other_purpose, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_commitment_first, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bindings, setup, teardown),
        cmocka_unit_test_setup_teardown(test_crypto_parse, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
