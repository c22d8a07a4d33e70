/*
 * tests/test_text_envelope.c -- the text form of an envelope
 * (docs/format.md section 10): the ks-text-vector blocks of section 10.4,
 * read from $KS_SPEC, and the decoder's and encoder's edges that a vector
 * cannot show: lowered limits, caller errors, every length and every byte.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <keyshift/envelope.h>

#include "vectors.h"

/* One ks-text-vector block while it is read. */
typedef struct text_vec {
    char name[64];
    ks_test_hex text, hex;
    int have_text, have_expect, have_hex, have_env;
    ks_err code, env_code;
    size_t offset, env_offset;
    size_t count; /* vectors checked so far */
} text_vec;

/* Parse "ok" or "<error-name> at <offset>" from v[0, n). */
static int parse_result(const ks_test_loader *ld, const char *v, size_t n, ks_err *code,
                        size_t *offset)
{
    *code = KS_OK;
    *offset = 0;
    if (ks_test_equals(v, n, "ok")) {
        return 0;
    }
    const char *at = NULL;
    for (size_t i = 0; i + 4 <= n; i++) {
        if (memcmp(v + i, " at ", 4) == 0) {
            at = v + i;
            break;
        }
    }
    if (at == NULL) {
        return ks_test_fail(ld, "want 'ok' or '<error> at <offset>'", v, n);
    }
    *code = ks_test_err_from_name(v, (size_t)(at - v));
    const char *d = at + 4;
    size_t dn = n - (size_t)(d - v);
    if (*code == KS_OK || dn == 0 || dn > 9) {
        return ks_test_fail(ld, "bad error name or offset", v, n);
    }
    for (size_t i = 0; i < dn; i++) {
        if (d[i] < '0' || d[i] > '9') {
            return ks_test_fail(ld, "bad offset", v, n);
        }
        *offset = *offset * 10 + (size_t)(d[i] - '0');
    }
    return 0;
}

static int vec_open(void *arg, const ks_test_loader *ld)
{
    (void)ld;
    text_vec *t = arg;
    free(t->text.bytes);
    free(t->hex.bytes);
    size_t count = t->count;
    memset(t, 0, sizeof *t);
    t->count = count;
    return 0;
}

static int vec_line(void *arg, const ks_test_loader *ld, const char *line, size_t n)
{
    text_vec *t = arg;
    const char *key, *val;
    size_t key_len, val_len;
    if (ks_test_key_value(ld, "ks-text-vector", line, n, &key, &key_len, &val, &val_len) != 0) {
        return -1;
    }
    if (ks_test_equals(key, key_len, "name")) {
        if (!ks_test_name_ok(val, val_len) || val_len >= sizeof t->name) {
            return ks_test_fail(ld, "bad name", val, val_len);
        }
        memcpy(t->name, val, val_len);
        return 0;
    }
    if (ks_test_equals(key, key_len, "text") || ks_test_equals(key, key_len, "text-hex")) {
        if (t->have_text++) {
            return ks_test_fail(ld, "repeated text", NULL, 0);
        }
        if (key_len == 4) {
            for (size_t i = 0; i < val_len; i++) {
                char h[2];
                snprintf(h, sizeof h, "%c", "0123456789abcdef"[(uint8_t)val[i] >> 4]);
                if (ks_test_hex_add(ld, &t->text, h, 1) != 0 ||
                    ks_test_hex_add(ld, &t->text, &"0123456789abcdef"[(uint8_t)val[i] & 15],
                                    1) != 0) {
                    return -1;
                }
            }
            return 0;
        }
        return ks_test_hex_add(ld, &t->text, val, val_len);
    }
    if (ks_test_equals(key, key_len, "expect")) {
        t->have_expect = 1;
        return parse_result(ld, val, val_len, &t->code, &t->offset);
    }
    if (ks_test_equals(key, key_len, "envelope")) {
        t->have_env = 1;
        return parse_result(ld, val, val_len, &t->env_code, &t->env_offset);
    }
    if (ks_test_equals(key, key_len, "hex")) {
        t->have_hex = 1;
        return ks_test_hex_add(ld, &t->hex, val, val_len);
    }
    return ks_test_fail(ld, "unknown key in ks-text-vector block", key, key_len);
}

/* Check the finished vector: decode, the parser's result, re-encode. */
static int vec_close(void *arg, const ks_test_loader *ld)
{
    text_vec *t = arg;
    if (t->name[0] == '\0' || !t->have_text || !t->have_expect ||
        (t->code == KS_OK) != (t->have_hex && t->have_env)) {
        return ks_test_fail(ld, "ks-text-vector block lacks a line", t->name, strlen(t->name));
    }
    size_t len = t->text.len;
    uint8_t *out = malloc(len / 4 * 3 + 1);
    assert_non_null(out);
    size_t n = 99;
    ks_parse_error pe = {KS_OK, 0, 0};
    ks_err e = ks_envelope_text_decode(t->text.bytes, len, NULL, out, len / 4 * 3, &n, &pe);
    if (e != t->code || (e != KS_OK && pe.offset != t->offset)) {
        char msg[160];
        snprintf(msg, sizeof msg, "decode gave %s at %zu, want %s at %zu", ks_err_name(e),
                 pe.offset, ks_err_name(t->code), t->offset);
        free(out);
        return ks_test_fail(ld, msg, t->name, strlen(t->name));
    }
    if (e != KS_OK) {
        assert_int_equal(n, 0);
        assert_int_equal(pe.code, e);
        assert_int_equal(pe.field, 0);
    } else {
        assert_int_equal(n, t->hex.len);
        assert_memory_equal(out, t->hex.bytes, n);
        ks_envelope env;
        ks_parse_error ee = {KS_OK, 0, 0};
        ks_err pr = ks_envelope_parse(out, n, NULL, &env, &ee);
        assert_int_equal(pr, t->env_code);
        if (pr != KS_OK) {
            assert_int_equal(ee.offset, t->env_offset);
        }
        uint8_t *back = malloc(len + 1);
        assert_non_null(back);
        size_t bn = 0;
        assert_int_equal(ks_envelope_text_encode(out, n, back, len, &bn), KS_OK);
        assert_int_equal(bn, len);
        assert_memory_equal(back, t->text.bytes, len);
        free(back);
        /* [F-TEXT-1] Every text form begins with S1NF, and only those. */
        assert_int_equal(ks_envelope_text_is_candidate(t->text.bytes, len),
                         n >= 3 && memcmp(out, "KSE", 3) == 0);
    }
    free(out);
    t->count++;
    return 0;
}

/* Every ks-text-vector of the spec holds. */
static void test_spec_text_vectors(void **state)
{
    (void)state;
    const char *path = getenv("KS_SPEC");
    if (path == NULL || path[0] == '\0') {
        fail_msg("KS_SPEC is not set (run the tests through `make unit`)");
    }
    char *text = NULL;
    size_t len = 0;
    const char *why = ks_test_read_file(path, &text, &len);
    if (why != NULL) {
        fail_msg("%s: %s", path, why);
    }
    static const ks_test_block_ops ops = {"ks-text-vector", vec_open, vec_line, vec_close};
    char err[512] = "";
    ks_test_loader ld = {path, 0, err, sizeof err};
    text_vec t;
    memset(&t, 0, sizeof t);
    int rc = ks_test_scan_blocks(text, len, &ld, &ops, &t);
    free(text);
    free(t.text.bytes);
    free(t.hex.bytes);
    if (rc != 0) {
        fail_msg("%s", err);
    }
    if (t.count < 10) {
        fail_msg("%s has %zu ks-text-vector blocks, want at least 10", path, t.count);
    }
}

/* Encode, decode back, for every length 0..200 of varied bytes. */
static void test_round_trip_lengths(void **state)
{
    (void)state;
    uint8_t in[200], text[272], out[204];
    for (size_t i = 0; i < sizeof in; i++) {
        in[i] = (uint8_t)(i * 131 + 7);
    }
    for (size_t len = 0; len <= sizeof in; len++) {
        size_t tn = 0, on = 0;
        assert_int_equal(ks_envelope_text_encode(in, len, text, sizeof text, &tn), KS_OK);
        assert_int_equal(tn, ks_envelope_text_len(len));
        assert_int_equal(tn % 4, 0);
        assert_int_equal(ks_envelope_text_decode(text, tn, NULL, out, sizeof out, &on, NULL),
                         KS_OK);
        assert_int_equal(on, len);
        assert_memory_equal(out, in, len);
        /* One byte short: buffer-too-small, nothing written. */
        if (tn > 0) {
            memset(text, '#', sizeof text);
            assert_int_equal(ks_envelope_text_encode(in, len, text, tn - 1, &tn),
                             KS_ERR_BUFFER_TOO_SMALL);
            assert_int_equal(tn, 0);
            assert_int_equal(text[0], '#');
        }
    }
}

/* [F-TEXT-2] Every byte value in place of one character of "QUJD": the
 * alphabet decodes, everything else is bad-value at its offset. */
static void test_every_byte(void **state)
{
    (void)state;
    static const char alpha[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (unsigned b = 0; b < 256; b++) {
        for (size_t pos = 0; pos < 2; pos++) {
            uint8_t text[8] = {'S', '1', 'N', 'F', 'Q', 'U', 'J', 'D'};
            text[4 + pos] = (uint8_t)b;
            uint8_t out[6];
            size_t n = 0;
            ks_parse_error pe = {KS_OK, 0, 0};
            ks_err e = ks_envelope_text_decode(text, 8, NULL, out, sizeof out, &n, &pe);
            int in_alpha = b != 0 && memchr(alpha, (int)b, 64) != NULL;
            assert_int_equal(e, in_alpha ? KS_OK : KS_ERR_BAD_VALUE);
            if (!in_alpha) {
                assert_int_equal(pe.offset, 4 + pos);
                assert_int_equal(n, 0);
                /* Nothing of the first quantum is left behind. */
                assert_int_equal(out[0] | out[1] | out[2], 0);
            }
        }
    }
}

/* [F-TEXT-3] The bound comes before anything is read; lowered limits
 * lower it; caller errors are caller errors. */
static void test_bounds_and_arguments(void **state)
{
    (void)state;
    ks_limits lim;
    ks_limits_default(&lim);
    lim.max_ciphertext = KS_TAG_LEN;
    size_t max = ks_envelope_text_len(ks_envelope_max_len(&lim));
    assert_true(max > 0);
    uint8_t *text = malloc(max + 4);
    uint8_t *out = malloc(max);
    assert_non_null(text);
    assert_non_null(out);
    memset(text, '!', max + 4); /* not even base64: the length decides first */
    size_t n = 7;
    ks_parse_error pe = {KS_OK, 9, 9};
    assert_int_equal(ks_envelope_text_decode(text, max + 4, &lim, out, 0, &n, &pe),
                     KS_ERR_TOO_LARGE);
    assert_int_equal(pe.offset, 0);
    assert_int_equal(n, 0);
    /* At the bound: the characters are read (and refused). */
    assert_int_equal(ks_envelope_text_decode(text, max, &lim, out, max, &n, &pe),
                     KS_ERR_BAD_VALUE);
    assert_int_equal(pe.offset, 0);
    assert_int_equal(ks_envelope_text_decode(text, max, &lim, out, max / 4 * 3 - 1, &n, &pe),
                     KS_ERR_BUFFER_TOO_SMALL);
    assert_int_equal(ks_envelope_text_decoded_max(max), max / 4 * 3);
    lim.max_ciphertext = 0;
    assert_int_equal(ks_envelope_text_decode(text, 4, &lim, out, 3, &n, &pe),
                     KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_envelope_text_decode(NULL, 4, NULL, out, 3, &n, &pe),
                     KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_envelope_text_decode(text, 4, NULL, NULL, 3, &n, &pe),
                     KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_envelope_text_decode(text, 4, NULL, out, 3, NULL, &pe),
                     KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_envelope_text_encode(NULL, 1, out, 4, &n), KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_envelope_text_encode(text, 1, NULL, 4, &n), KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_envelope_text_encode(text, 1, out, 4, NULL), KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_envelope_text_encode(text, SIZE_MAX, out, 4, &n),
                     KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_envelope_text_len(SIZE_MAX), 0);
    /* The empty text decodes to nothing; it is not a candidate. */
    assert_int_equal(ks_envelope_text_decode(NULL, 0, NULL, NULL, 0, &n, &pe), KS_OK);
    assert_int_equal(n, 0);
    assert_int_equal(ks_envelope_text_is_candidate(NULL, 0), 0);
    assert_int_equal(ks_envelope_text_is_candidate((const uint8_t *)"S1N", 3), 0);
    assert_int_equal(ks_envelope_text_is_candidate((const uint8_t *)"s1nfAA==", 8), 0);
    assert_int_equal(ks_envelope_text_is_candidate((const uint8_t *)"S1NF", 4), 1);
    free(text);
    free(out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_spec_text_vectors),
        cmocka_unit_test(test_round_trip_lengths),
        cmocka_unit_test(test_every_byte),
        cmocka_unit_test(test_bounds_and_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
