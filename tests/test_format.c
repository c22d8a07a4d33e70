/*
 * tests/test_format.c -- what the format vectors leave alone in format/:
 * the big-endian and varint helpers of format/rules.h at every width, the
 * charset scan with the bad byte at every position, the argument checks
 * and bounds of ks_aad_data() / ks_aad_wrap(), and the encoder's check of
 * the algorithm.  Each test here kills mutants that survived `make mutate`
 * (docs/fuzzing.md, "Mutation testing").
 *
 * rules.h is included by its path relative to this file, so that
 * `make mutate` compiles this test against a mutated copy of it.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include <keyshift/aad.h>
#include <keyshift/envelope.h>
#include <keyshift/error.h>

#include "../format/rules.h"

/* ks_be_put / ks_be_get at every width, with a distinct value in every
 * byte (and every bit of a byte significant). */
static void test_be_every_width(void **state)
{
    (void)state;
    static const uint64_t values[] = {0x0102030405060708u, 0x8182838485868788u, 0xFEDCBA9876543210u};
    for (size_t k = 0; k < sizeof values / sizeof values[0]; k++) {
        const uint64_t v = values[k];
        for (size_t n = 1; n <= 8; n++) {
            uint8_t buf[10];
            memset(buf, 0xAA, sizeof buf);
            ks_be_put(buf + 1, v, n);
            for (size_t i = 0; i < n; i++) {
                assert_int_equal(buf[1 + i], (uint8_t)(v >> (8 * (n - 1 - i))));
            }
            assert_int_equal(buf[0], 0xAA);
            assert_int_equal(buf[1 + n], 0xAA);
            const uint64_t mask = n == 8 ? UINT64_MAX : ((uint64_t)1 << (8 * n)) - 1;
            assert_true(ks_be_get(buf + 1, n) == (v & mask));
        }
    }
}

/* ks_varint_len / ks_varint_put on both sides of every byte boundary. */
static void test_varint_boundaries(void **state)
{
    (void)state;
    for (size_t bytes = 1; bytes <= 10; bytes++) {
        const unsigned bits = 7 * (unsigned)bytes;
        const uint64_t last = bits >= 64 ? UINT64_MAX : ((uint64_t)1 << bits) - 1;
        const uint64_t first = bytes == 1 ? 0 : (uint64_t)1 << (7 * (bytes - 1));
        const uint64_t cases[2] = {first, last};
        for (size_t c = 0; c < 2; c++) {
            uint8_t buf[12];
            memset(buf, 0, sizeof buf);
            assert_int_equal(ks_varint_len(cases[c]), bytes);
            assert_int_equal(ks_varint_put(buf, cases[c]), bytes);
            uint64_t back = 0;
            for (size_t i = 0; i < bytes; i++) {
                assert_int_equal((buf[i] & 0x80) != 0, i + 1 < bytes);
                back |= (uint64_t)(buf[i] & 0x7F) << (7 * i);
            }
            assert_true(back == cases[c]);
        }
    }
}

/* The charset scan finds a bad byte wherever it is: the four-byte steps
 * must look at each of their bytes, and the tail loop at the rest. */
static void test_charset_scan_every_position(void **state)
{
    (void)state;
    static const struct {
        uint8_t kind;
        uint8_t bad;
    } kinds[] = {{KS_RULE_NAME, '/'}, {KS_RULE_NAME, 0x00}, {KS_RULE_KEY_ID, '!'}, {KS_RULE_KEY_ID, 0xFF}};
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        for (size_t n = 1; n <= 13; n++) {
            uint8_t buf[13];
            memset(buf, 'a', sizeof buf);
            assert_int_equal(ks_rules_charset_scan(kinds[k].kind, buf, n), n);
            for (size_t pos = 0; pos < n; pos++) {
                memset(buf, 'a', sizeof buf);
                buf[pos] = kinds[k].bad;
                assert_int_equal(ks_rules_charset_scan(kinds[k].kind, buf, n), pos);
            }
        }
    }
}

static uint8_t bytes_a[KS_CONTEXT_MAX + 1];
static const uint8_t commitment[KS_COMMITMENT_LEN];

#define VIEW(n) ((ks_bytes){bytes_a, (n)})

static ks_envelope v2_env(void)
{
    ks_envelope e;
    memset(&e, 0, sizeof e);
    e.version = KS_FORMAT_V2;
    e.algorithm = KS_ALG_XCHACHA20POLY1305;
    e.tenant = VIEW(3);
    e.key_id = VIEW(5);
    e.key_version = 0xA1B2C3D4u;
    e.purpose = VIEW(7);
    e.commitment = (ks_bytes){commitment, sizeof commitment};
    return e;
}

static ks_err data_aad(const ks_envelope *e, ks_bytes context, size_t *n)
{
    static uint8_t out[8192];
    return ks_aad_data(e, context, out, sizeof out, n);
}

static ks_err wrap_aad(const ks_envelope *e, size_t *n)
{
    static uint8_t out[8192];
    return ks_aad_wrap(e, out, sizeof out, n);
}

/* Every bound of the data and wrap AADs, on both sides [F-CRYPTO-AAD-1/2]. */
static void test_aad_bounds(void **state)
{
    (void)state;
    memset(bytes_a, 'a', sizeof bytes_a);
    size_t n;
    ks_envelope e = v2_env();
    static const struct {
        size_t off; /* the ks_bytes member */
        size_t max;
    } bounds[] = {{offsetof(ks_envelope, tenant), KS_TENANT_MAX},
                  {offsetof(ks_envelope, key_id), KS_KEY_ID_MAX},
                  {offsetof(ks_envelope, purpose), KS_PURPOSE_MAX}};
    for (size_t b = 0; b < sizeof bounds / sizeof bounds[0]; b++) {
        for (int over = 0; over <= 1; over++) {
            e = v2_env();
            *(ks_bytes *)(void *)((char *)&e + bounds[b].off) = VIEW(bounds[b].max + (size_t)over);
            const ks_err want = over ? KS_ERR_INVALID_ARGUMENT : KS_OK;
            assert_int_equal(data_aad(&e, VIEW(1), &n), want);
            assert_int_equal(wrap_aad(&e, &n), want);
        }
    }
    e = v2_env();
    assert_int_equal(data_aad(&e, VIEW(KS_CONTEXT_MAX), &n), KS_OK);
    assert_int_equal(n, 4 + 4 + 4 + 3 + 4 + 7 + KS_COMMITMENT_LEN + 4 + KS_CONTEXT_MAX);
    assert_int_equal(data_aad(&e, VIEW(KS_CONTEXT_MAX + 1), &n), KS_ERR_INVALID_ARGUMENT);
}

/* The argument checks, each with its own code. */
static void test_aad_arguments(void **state)
{
    (void)state;
    memset(bytes_a, 'a', sizeof bytes_a);
    uint8_t out[256];
    size_t n = 0;
    ks_envelope e = v2_env();

    assert_int_equal(ks_aad_data(NULL, VIEW(1), out, sizeof out, &n), KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_aad_wrap(NULL, out, sizeof out, &n), KS_ERR_INVALID_ARGUMENT);
    for (unsigned v = 0; v <= 3; v += 3) {
        e.version = (uint8_t)v;
        assert_int_equal(ks_aad_data(&e, VIEW(1), out, sizeof out, &n), KS_ERR_INVALID_ARGUMENT);
        assert_int_equal(ks_aad_wrap(&e, out, sizeof out, &n), KS_ERR_INVALID_ARGUMENT);
    }
    e = v2_env();
    assert_int_equal(ks_aad_data(&e, VIEW(1), out, sizeof out, NULL), KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_aad_wrap(&e, out, sizeof out, NULL), KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_aad_data(&e, (ks_bytes){NULL, 1}, out, sizeof out, &n), KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_aad_data(&e, (ks_bytes){NULL, 0}, out, sizeof out, &n), KS_OK);

    /* A v2 data AAD needs the commitment; the wrap AAD does not read it. */
    e.commitment = (ks_bytes){NULL, 0};
    assert_int_equal(ks_aad_data(&e, VIEW(1), out, sizeof out, &n), KS_ERR_INVALID_ARGUMENT);
    assert_int_equal(ks_aad_wrap(&e, out, sizeof out, &n), KS_OK);
    e.commitment = (ks_bytes){commitment, KS_COMMITMENT_LEN - 1};
    assert_int_equal(ks_aad_data(&e, VIEW(1), out, sizeof out, &n), KS_ERR_INVALID_ARGUMENT);

    /* The buffer: exactly the AAD's length is enough, one byte less or no
     * buffer is buffer-too-small. */
    e = v2_env();
    size_t need;
    assert_int_equal(ks_aad_data(&e, VIEW(1), out, sizeof out, &need), KS_OK);
    assert_int_equal(ks_aad_data(&e, VIEW(1), out, need, &n), KS_OK);
    assert_int_equal(ks_aad_data(&e, VIEW(1), out, need - 1, &n), KS_ERR_BUFFER_TOO_SMALL);
    assert_int_equal(ks_aad_data(&e, VIEW(1), NULL, need, &n), KS_ERR_BUFFER_TOO_SMALL);
    assert_int_equal(ks_aad_wrap(&e, out, sizeof out, &need), KS_OK);
    assert_int_equal(ks_aad_wrap(&e, out, need, &n), KS_OK);
    assert_int_equal(ks_aad_wrap(&e, out, need - 1, &n), KS_ERR_BUFFER_TOO_SMALL);
    assert_int_equal(ks_aad_wrap(&e, NULL, need, &n), KS_ERR_BUFFER_TOO_SMALL);

    /* Every byte of a 32-bit field lands where it belongs: key_version
     * follows lp(tenant) and lp(key_id) in the wrap AAD. */
    assert_int_equal(ks_aad_wrap(&e, out, sizeof out, &n), KS_OK);
    static const uint8_t kv[4] = {0xA1, 0xB2, 0xC3, 0xD4};
    assert_memory_equal(out + 4 + 4 + 4 + 3 + 4 + 5, kv, 4);
}

/* The encoder checks the algorithm itself, not only through the nonce
 * length it implies: an unknown algorithm with an empty nonce (the nonce
 * length of no algorithm) is bad-value [F-ALG-1]. */
static void test_check_unknown_algorithm(void **state)
{
    (void)state;
    static const uint8_t tag[KS_TAG_LEN];
    ks_envelope e;
    memset(&e, 0, sizeof e);
    e.version = KS_FORMAT_V1;
    e.algorithm = 3;
    e.tenant = (ks_bytes){(const uint8_t *)"t", 1};
    e.key_id = (ks_bytes){(const uint8_t *)"k", 1};
    e.key_version = 1;
    e.wrapped_dek = (ks_bytes){tag, 1};
    e.ciphertext = (ks_bytes){tag, sizeof tag};
    assert_int_equal(ks_envelope_check(&e, NULL), KS_ERR_BAD_VALUE);
    e.algorithm = 0;
    assert_int_equal(ks_envelope_check(&e, NULL), KS_ERR_BAD_VALUE);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_be_every_width),
        cmocka_unit_test(test_varint_boundaries),
        cmocka_unit_test(test_charset_scan_every_position),
        cmocka_unit_test(test_aad_bounds),
        cmocka_unit_test(test_aad_arguments),
        cmocka_unit_test(test_check_unknown_algorithm),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
