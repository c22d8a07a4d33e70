/*
 * tests/test_spec_vectors.c -- the test vectors of docs/format.md
 * (Appendix A), and the loader that reads them (tests/vectors.c).
 *
 * For every vector: ks_envelope_parse gives exactly the expected result
 * (ok, or the error name at the exact offset).  For every ok vector also:
 * the encoder reproduces the input byte for byte, ks_envelope_encoded_len
 * equals its length, the header-only parser agrees, and nanopb -- an
 * independent protobuf decoder -- decodes the body to the same values.
 *
 * The spec's path comes from $KS_SPEC (`make unit` sets it); a spec with no
 * vectors fails.  A small set of vectors embedded here runs through the
 * same checks, so the checking code is itself tested before the spec has
 * any vectors.  No test is timed.
 */
#define _POSIX_C_SOURCE 200809L /* mkstemp, close, unlink */

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <pb_decode.h>

#include <keyshift/envelope.h>

#include "envelope.pb.h"
#include "envelope_eq.h"
#include "nanopb_env.h"
#include "vectors.h"

static const ks_envelope g_zero_env;

/* ---- nanopb, the second decoder -------------------------------------------- */

/* Decode the body of buf[0, len) with nanopb (tests/nanopb_env.h) and
 * compare with the parser's result e: every header field of the version
 * present with the same value, and the ciphertext seen exactly once, as
 * the same bytes.  Returns 0, or -1 with a message. */
static int nanopb_agrees(const ks_envelope *e, const uint8_t *buf, size_t len, char *msg,
                         size_t cap)
{
    ks_nanopb_msg m;
    ks_nanopb_ct ct;
    ks_nanopb_env n;
    pb_istream_t s;
    if (!ks_nanopb_decode(e->version, buf + KS_PREFIX_LEN, len - KS_PREFIX_LEN, &m, &ct, &s)) {
        snprintf(msg, cap, "nanopb: pb_decode failed: %s", PB_GET_ERROR(&s));
        return -1;
    }
    ks_nanopb_to_env(e->version, &m, &ct, &n);
    /* The view is read only when it points into buf (ct.in_buffer). */
    if (ct.calls != 1 || !ct.in_buffer || ct.view.len != e->ciphertext.len ||
        !ks_test_bytes_eq(ct.view, e->ciphertext) || s.bytes_left != 0) {
        snprintf(msg, cap, "nanopb: ciphertext differs (calls %d, len %zu vs %zu)", ct.calls,
                 ct.view.len, e->ciphertext.len);
        return -1;
    }
    /* The ciphertext agrees, so a difference here is in the header. */
    if (!ks_nanopb_header_present(&n) || !ks_test_fields_eq(&n.env, e)) {
        snprintf(msg, cap, "nanopb: decoded header fields differ from the parser's");
        return -1;
    }
    return 0;
}

/* ---- checking one vector ----------------------------------------------------- */

/* Check an ok vector in buf (an exact copy); 0 or -1 with a message. */
static int check_ok_vector(const uint8_t *buf, size_t len, char *msg, size_t cap)
{
    ks_envelope e, h;
    ks_parse_error err;
    ks_err got = ks_envelope_parse(buf, len, NULL, &e, &err);
    if (got != KS_OK) {
        snprintf(msg, cap, "want ok, got %s at %zu (field %u)", ks_err_name(got), err.offset,
                 (unsigned)err.field);
        return -1;
    }
    if (!ks_test_views_inside(&e, buf, len) || e.total_len != len || e.header_len >= len ||
        buf[e.header_len] != 0x7a) {
        snprintf(msg, cap, "a view is outside the input, or header_len/total_len is wrong");
        return -1;
    }
    /* encode back */
    size_t n = 0;
    if ((got = ks_envelope_encoded_len(&e, NULL, &n)) != KS_OK || n != len) {
        snprintf(msg, cap, "encoded_len: %s, %zu (want %zu)", ks_err_name(got), n, len);
        return -1;
    }
    uint8_t *out = malloc(len);
    if (out == NULL) {
        snprintf(msg, cap, "out of memory");
        return -1;
    }
    got = ks_envelope_encode(&e, NULL, out, len, &n);
    int same = got == KS_OK && n == len && memcmp(out, buf, len) == 0;
    free(out);
    if (!same) {
        snprintf(msg, cap, "encode: %s, %zu bytes, does not reproduce the input", ks_err_name(got), n);
        return -1;
    }
    /* header-only: the whole input, then just the header */
    if (ks_envelope_parse_header(buf, len, NULL, &h, NULL) != KS_OK ||
        !ks_test_result_eq(&h, &e)) {
        snprintf(msg, cap, "parse_header of the whole envelope differs from parse");
        return -1;
    }
    const size_t hdr = (size_t)(e.ciphertext.ptr - buf);
    if (ks_envelope_parse_header(buf, hdr, NULL, &h, NULL) != KS_OK || h.ciphertext.ptr != NULL ||
        h.total_len != len || h.header_len != e.header_len) {
        snprintf(msg, cap, "parse_header of the first %zu bytes failed or disagrees", hdr);
        return -1;
    }
    return nanopb_agrees(&e, buf, len, msg, cap);
}

/* Check one vector; 0, or -1 with a message. */
static int check_vector(const ks_test_vector *v, char *msg, size_t cap)
{
    /* an exact-size heap copy, so that ASan sees any read past the end */
    uint8_t *buf = NULL;
    if (v->len > 0) {
        buf = malloc(v->len);
        if (buf == NULL) {
            snprintf(msg, cap, "out of memory");
            return -1;
        }
        memcpy(buf, v->bytes, v->len);
    }
    int rc = 0;
    if (v->expect_code == KS_OK) {
        rc = v->len >= KS_PREFIX_LEN ? check_ok_vector(buf, v->len, msg, cap) : -1;
        if (v->len < KS_PREFIX_LEN) {
            snprintf(msg, cap, "ok vector shorter than the prefix");
        }
    } else {
        ks_envelope e;
        ks_parse_error err;
        memset(&e, 0xA5, sizeof e);
        memset(&err, 0xA5, sizeof err);
        ks_err got = ks_envelope_parse(buf, v->len, NULL, &e, &err);
        if (got != v->expect_code || err.code != got || err.offset != v->expect_offset) {
            snprintf(msg, cap, "want %s at %zu, got %s at %zu (field %u)",
                     ks_err_name(v->expect_code), v->expect_offset, ks_err_name(got),
                     got == KS_OK ? (size_t)0 : err.offset, got == KS_OK ? 0u : (unsigned)err.field);
            rc = -1;
        } else if (memcmp(&e, &g_zero_env, sizeof e) != 0) {
            snprintf(msg, cap, "rejected, but *out was not cleared");
            rc = -1;
        } else if (ks_envelope_parse(buf, v->len, NULL, &e, NULL) != got) {
            snprintf(msg, cap, "different result with err == NULL");
            rc = -1;
        }
    }
    free(buf);
    return rc;
}

/* Check every vector, printing each failure; returns the failure count.
 * With notes, also list the rejection names no vector expects. */
static size_t check_all(const ks_test_vectors *vs, const char *origin, int notes)
{
    size_t failed = 0, ok = 0;
    unsigned seen[32] = {0};
    char msg[256];
    for (size_t i = 0; i < vs->count; i++) {
        const ks_test_vector *v = &vs->v[i];
        msg[0] = '\0';
        if (check_vector(v, msg, sizeof msg) != 0) {
            print_error("%s:%zu: vector %s: %s\n", origin, v->line, v->name, msg);
            failed++;
        }
        if (v->expect_code == KS_OK) {
            ok++;
        } else if ((unsigned)v->expect_code < 32) {
            seen[v->expect_code]++;
        }
    }
    print_message("%s: %zu vectors (%zu ok, %zu rejections), %zu failed\n", origin, vs->count, ok,
                  vs->count - ok, failed);
    for (int code = KS_ERR_TRUNCATED; code <= KS_ERR_BAD_VALUE; code++) {
        if (notes && seen[code] == 0) {
            print_message("%s: note: no vector expects %s\n", origin, ks_err_name((ks_err)code));
        }
    }
    return failed;
}

/* ---- the spec ----------------------------------------------------------------- */

/* Every vector of $KS_SPEC parses as it says; the spec must have some. */
static void test_spec_vectors(void **state)
{
    (void)state;
    const char *path = getenv("KS_SPEC");
    if (path == NULL || path[0] == '\0') {
        fail_msg("KS_SPEC is not set (run the tests through `make unit`)");
    }
    ks_test_vectors vs;
    char err[512];
    if (ks_test_vectors_load(path, &vs, err, sizeof err) != 0) {
        fail_msg("loading the spec's vectors: %s", err);
    }
    if (vs.count == 0) {
        ks_test_vectors_free(&vs);
        fail_msg("%s has no ```ks-vector blocks", path);
    }
    size_t failed = check_all(&vs, path, 1);
    ks_test_vectors_free(&vs);
    assert_int_equal(failed, 0);
}

/* ---- vectors of our own, through the same checks -------------------------------- */

static const char k_self_md[] =
    "# Own vectors\n"
    "\n"
    "Text before.  A decoy in another fence:\n"
    "```c\n"
    "```ks-vector\n"
    "this is C, not a vector\n"
    "```\n"
    "~~~\n"
    "```\n"
    "still inside the tilde fence\n"
    "~~~\n"
    "\n"
    "```ks-vector\n"
    "name: v1-aes-typical\n"
    "expect: ok\n"
    "hex: 4b534501 0801 1204 61636d65 1a09 6b2f31402b3d2e5f3a\n"
    "hex: 2007 2a04 01020304\n"
    "hex: 320c 000102030405060708090a0b\n"
    "hex: 7a10 101112131415161718191a1b1c1d1e1f\n"
    "```\n"
    "\n"
    "  ```ks-vector\r\n"
    "name: v2-xchacha-kv-max\r\n"
    "expect: ok\r\n"
    "hex: 4B534502 0802 1203 6F7267 1A03 6B6579 20FFFFFFFF0F 2A01FF\r\n"
    "hex: 3218 000102030405060708090A0B0C0D0E0F1011121314151617\r\n"
    "hex: 3A06 6261636B7570\r\n"
    "hex: 4220 000102030405060708090a0b0c0d0e0f 101112131415161718191a1b1c1d1e1f\r\n"
    "hex: 7a11 00112233445566778899aabbccddeeff 0\r\n"
    "hex: 1\r\n"
    "  ```\r\n"
    "\n"
    "```ks-vector\n"
    "name: empty\n"
    "expect: truncated at 0\n"
    "hex:\n"
    "```\n"
    "```ks-vector\n"
    "name: prefix-only\n"
    "expect: truncated at 4\n"
    "hex: 4b534501\n"
    "```\n"
    "```ks-vector\n"
    "name: magic\n"
    "expect: bad-magic at 2\n"
    "hex: 4b5346\n"
    "```\n"
    "```ks-vector\n"
    "name: algorithm-as-bytes\n"
    "expect: wire-type at 4\n"
    "hex: 4b534501 0a01 01\n"
    "```\n"
    "```ks-vector\n"
    "name: key-version-noncanonical\n"
    "expect:   noncanonical-varint   at   20\n"
    "hex: 4b534501 0801 1204 61636d65 1a05 6b2f314078 20 8100\n"
    "```\n"
    "```ks-vector\n"
    "name: tenant-slash\n"
    "expect: bad-value at 10\n"
    "hex: 4b534501 0801 1204 61632f65\n"
    "```\n"
    "```ks-vectors\n"
    "name: not a vector block (info string differs)\n"
    "```\n";

/* The embedded vectors load as written and pass every check. */
static void test_self_vectors(void **state)
{
    (void)state;
    ks_test_vectors vs;
    char err[256];
    int rc = ks_test_vectors_parse(k_self_md, sizeof k_self_md - 1, "self", &vs, err, sizeof err);
    if (rc != 0) {
        fail_msg("%s", err);
    }
    assert_int_equal(vs.count, 8);
    assert_string_equal(vs.v[0].name, "v1-aes-typical");
    assert_int_equal(vs.v[0].expect_code, KS_OK);
    assert_int_equal(vs.v[0].len, 4 + 2 + 6 + 11 + 2 + 6 + 14 + 18);
    assert_int_equal(vs.v[0].line, 13);
    assert_int_equal(vs.v[1].len, 4 + 2 + 5 + 5 + 6 + 3 + 26 + 8 + 34 + 19);
    assert_int_equal(vs.v[1].bytes[vs.v[1].len - 1], 0x01); /* a byte split over two lines */
    assert_string_equal(vs.v[2].name, "empty");
    assert_int_equal(vs.v[2].len, 0);
    assert_null(vs.v[2].bytes);
    assert_int_equal(vs.v[2].expect_code, KS_ERR_TRUNCATED);
    assert_int_equal(vs.v[4].expect_code, KS_ERR_BAD_MAGIC);
    assert_int_equal(vs.v[4].expect_offset, 2);
    assert_int_equal(vs.v[6].expect_code, KS_ERR_NONCANONICAL_VARINT);
    assert_int_equal(vs.v[6].expect_offset, 20);
    size_t failed = check_all(&vs, "self", 0);
    ks_test_vectors_free(&vs);
    assert_int_equal(failed, 0);
}

/* A wrong expectation is caught: the checks are not vacuous. */
static void test_self_vectors_detect_mismatch(void **state)
{
    (void)state;
    static const char *const wrong[] = {
        /* right error, wrong offset */
        "```ks-vector\nname: a\nexpect: bad-magic at 1\nhex: 4b5346\n```\n",
        /* wrong error */
        "```ks-vector\nname: a\nexpect: truncated at 2\nhex: 4b5346\n```\n",
        /* rejected input claimed ok */
        "```ks-vector\nname: a\nexpect: ok\nhex: 4b534501\n```\n",
        /* valid input claimed rejected */
        ("```ks-vector\nname: a\nexpect: truncated at 4\nhex: 4b534501 0801 1201 61 1a01 6b 2001"
         " 2a01 ff 320c 000102030405060708090a0b 7a10 000102030405060708090a0b0c0d0e0f\n```\n"),
    };
    for (size_t i = 0; i < sizeof wrong / sizeof wrong[0]; i++) {
        ks_test_vectors vs;
        char err[256];
        assert_int_equal(ks_test_vectors_parse(wrong[i], strlen(wrong[i]), "wrong", &vs, err,
                                               sizeof err),
                         0);
        assert_int_equal(vs.count, 1);
        char msg[256];
        assert_int_not_equal(check_vector(&vs.v[0], msg, sizeof msg), 0);
        ks_test_vectors_free(&vs);
    }
}

/* ---- the loader ------------------------------------------------------------------ */

/* Documents that must not load, each with what is wrong. */
static void test_loader_rejects_malformed(void **state)
{
    (void)state;
    static const char *const bad[] = {
        "```ks-vector\nexpect: ok\nhex: 00\n```\n",                       /* no name */
        "```ks-vector\nname: a\nhex: 00\n```\n",                          /* no expect */
        "```ks-vector\nname: a\nexpect: ok\n```\n",                       /* no hex */
        "```ks-vector\nname: a\nname: b\nexpect: ok\nhex: 00\n```\n",     /* name twice */
        "```ks-vector\nname: a\nexpect: ok\nexpect: ok\nhex: 00\n```\n",  /* expect twice */
        "```ks-vector\nname: a\nexpect: ok\nhex: 00\nnote: x\n```\n",     /* unknown key */
        "```ks-vector\nname: a\nexpect: ok\nHex: 00\n```\n",              /* keys are exact */
        "```ks-vector\nname: a\nexpect: ok\nhex: 0g\n```\n",              /* bad digit */
        "```ks-vector\nname: a\nexpect: ok\nhex: 0x00\n```\n",            /* 0x prefix */
        "```ks-vector\nname: a\nexpect: ok\nhex: 000\n```\n",             /* odd digits */
        "```ks-vector\nname: a\nexpect: ok\nhex: 00, 01\n```\n",          /* punctuation */
        "```ks-vector\nname: a\nexpect: ok\nhex: 00\n",                   /* unterminated */
        "```ks-vector\nname: a\nexpect: ok\nhex: 00\n``\n",               /* not a fence */
        "````ks-vector\nname: a\nexpect: ok\nhex: 00\n```\n",             /* short close */
        "~~~ks-vector\nname: a\nexpect: ok\nhex: 00\n```\n",              /* other char */
        "```text\n```ks-vector\n",                                        /* unterminated fence */
        "```ks-vector\nname: a\nexpect: fine\nhex: 00\n```\n",            /* unknown verdict */
        "```ks-vector\nname: a\nexpect: ok at 0\nhex: 00\n```\n",         /* ok has no offset */
        "```ks-vector\nname: a\nexpect: truncated\nhex: 00\n```\n",       /* no offset */
        "```ks-vector\nname: a\nexpect: truncated at\nhex: 00\n```\n",    /* no offset */
        "```ks-vector\nname: a\nexpect: truncated at x\nhex: 00\n```\n",  /* not a number */
        "```ks-vector\nname: a\nexpect: truncated at -1\nhex: 00\n```\n", /* negative */
        "```ks-vector\nname: a\nexpect: truncated at 0x4\nhex: 00\n```\n", /* hex offset */
        "```ks-vector\nname: a\nexpect: truncated on 4\nhex: 00\n```\n",  /* not 'at' */
        "```ks-vector\nname: a\nexpect: truncated at 4 5\nhex: 00\n```\n", /* extra token */
        "```ks-vector\nname: a\nexpect: truncated at 99999999999999999999999\nhex: 00\n```\n",
        "```ks-vector\nname: a\nexpect: Truncated at 4\nhex: 00\n```\n",  /* names are exact */
        "```ks-vector\nname: a\nexpect: truncation at 4\nhex: 00\n```\n", /* unknown name */
        "```ks-vector\nname: a\nexpect: invalid-argument at 0\nhex: 00\n```\n", /* not a rejection */
        "```ks-vector\nname: a\nexpect: unknown-error at 0\nhex: 00\n```\n",
        "```ks-vector\nname:\nexpect: ok\nhex: 00\n```\n",                /* empty name */
        "```ks-vector\nname: a b\nexpect: ok\nhex: 00\n```\n",            /* blank in name */
        "```ks-vector\nname a\nexpect: ok\nhex: 00\n```\n",               /* no colon */
        "```ks-vector\nname: V1\nexpect: ok\nhex: 00\n```\n",            /* uppercase name */
        "```ks-vector\nname: a_b\nexpect: ok\nhex: 00\n```\n",           /* '_' in name */
        "```ks-vector\nname: a\n\nexpect: ok\nhex: 00\n```\n",           /* blank line */
        ("```ks-vector\nname: a\nexpect: ok\nhex: 00\n```\n"
         "```ks-vector\nname: a\nexpect: ok\nhex: 01\n```\n"), /* duplicate name */
    };
    static ks_test_vector sentinel;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ks_test_vectors vs = {&sentinel, 99}; /* the loader must reset it */
        char err[256] = "";
        int rc = ks_test_vectors_parse(bad[i], strlen(bad[i]), "bad", &vs, err, sizeof err);
        if (rc == 0) {
            print_error("case %zu loaded but is malformed:\n%s", i, bad[i]);
            ks_test_vectors_free(&vs);
            fail();
        }
        assert_null(vs.v);
        assert_int_equal(vs.count, 0);
        assert_int_equal(strncmp(err, "bad:", 4), 0);
    }
}

/* Documents that load: none, fences of every kind, edge layouts. */
static void test_loader_accepts(void **state)
{
    (void)state;
    ks_test_vectors vs;
    char err[256];
    static const char none[] = "# No vectors\n\n```\nname: x\n```\nText.\n";
    assert_int_equal(ks_test_vectors_parse(none, sizeof none - 1, "none", &vs, err, sizeof err), 0);
    assert_int_equal(vs.count, 0);
    ks_test_vectors_free(&vs);
    assert_int_equal(ks_test_vectors_parse("", 0, "empty", &vs, err, sizeof err), 0);
    assert_int_equal(vs.count, 0);

    static const char md[] =
        "~~~ks-vector\n"          /* tilde fence */
        "name: t1\n"
        "expect: unknown-field at 4\n"
        "hex: 00\n"
        "~~~~\n"                  /* longer close is fine */
        "````ks-vector   \n"      /* trailing blanks in the info string */
        "  name:   t2  \n"
        "\texpect:\tbad-value at 123456\n"
        "hex:   ab CD\tef  \n"
        "````\n"
        "```ks-vector\n"
        "name: t3\n"
        "expect: varint-overflow at 5\n"
        "hex: 0\n"
        "hex: 1 2\n"
        "hex: 3\n"
        "```";                    /* closing fence without a newline at EOF */
    assert_int_equal(ks_test_vectors_parse(md, sizeof md - 1, "md", &vs, err, sizeof err), 0);
    assert_int_equal(vs.count, 3);
    assert_string_equal(vs.v[0].name, "t1");
    assert_int_equal(vs.v[0].expect_code, KS_ERR_UNKNOWN_FIELD);
    assert_int_equal(vs.v[0].expect_offset, 4);
    assert_int_equal(vs.v[0].len, 1);
    assert_string_equal(vs.v[1].name, "t2");
    assert_int_equal(vs.v[1].expect_code, KS_ERR_BAD_VALUE);
    assert_int_equal(vs.v[1].expect_offset, 123456);
    assert_int_equal(vs.v[1].len, 3);
    assert_memory_equal(vs.v[1].bytes, "\xab\xcd\xef", 3);
    assert_int_equal(vs.v[1].line, 6);
    assert_int_equal(vs.v[2].len, 2);
    assert_memory_equal(vs.v[2].bytes, "\x01\x23", 2);
    assert_int_equal(vs.v[2].expect_code, KS_ERR_VARINT_OVERFLOW);
    ks_test_vectors_free(&vs);
    ks_test_vectors_free(&vs); /* idempotent */
    ks_test_vectors_free(NULL);

    /* every rejection name maps back to its code, and nothing else does */
    for (int code = KS_ERR_TRUNCATED; code <= KS_ERR_BAD_VALUE; code++) {
        const char *name = ks_err_name((ks_err)code);
        assert_int_equal(ks_test_err_from_name(name, strlen(name)), code);
    }
    assert_int_equal(ks_test_err_from_name("ok", 2), KS_OK);
    assert_int_equal(ks_test_err_from_name("buffer-too-small", 16), KS_OK);
    assert_int_equal(ks_test_err_from_name("truncate", 8), KS_OK);
}

/* Loading from a file: a temporary file under /tmp, and missing files. */
static void test_loader_file(void **state)
{
    (void)state;
    char path[] = "/tmp/ks-vectors-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    FILE *f = fdopen(fd, "w");
    assert_non_null(f);
    assert_int_equal(fwrite(k_self_md, 1, sizeof k_self_md - 1, f), sizeof k_self_md - 1);
    assert_int_equal(fclose(f), 0);

    ks_test_vectors vs;
    char err[512];
    int rc = ks_test_vectors_load(path, &vs, err, sizeof err);
    unlink(path);
    if (rc != 0) {
        fail_msg("%s", err);
    }
    const size_t count = vs.count;
    const size_t failed = check_all(&vs, path, 0);
    ks_test_vectors_free(&vs);
    assert_int_equal(count, 8);
    assert_int_equal(failed, 0);

    assert_int_not_equal(ks_test_vectors_load("/nonexistent/keyshift/format.md", &vs, err, sizeof err), 0);
    assert_int_equal(vs.count, 0);
    assert_non_null(strstr(err, "/nonexistent/keyshift/format.md"));
    assert_int_not_equal(ks_test_vectors_load(NULL, &vs, err, sizeof err), 0);
}

/* Run the group. */
int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_loader_accepts),
        cmocka_unit_test(test_loader_rejects_malformed),
        cmocka_unit_test(test_loader_file),
        cmocka_unit_test(test_self_vectors),
        cmocka_unit_test(test_self_vectors_detect_mismatch),
        cmocka_unit_test(test_spec_vectors),
    };
    return cmocka_run_group_tests_name("spec_vectors", tests, NULL, NULL);
}
