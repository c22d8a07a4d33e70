/*
 * tests/keyring_test_util.h -- shared by tests/test_keyring.c and
 * fuzz/fuzz_keyring.c: turn a keyring body into the key list the encoder
 * takes (ks_krf_key[]), through the parser's visitor, so that the two can
 * check that re-encoding an accepted body gives the identical bytes.
 *
 * Everything is static inline (no warning when a user does not need a
 * helper).  Views in the model point into the parsed buffer.
 */
#ifndef KS_TESTS_KEYRING_TEST_UTIL_H
#define KS_TESTS_KEYRING_TEST_UTIL_H

#include <stdlib.h>
#include <string.h>

#include "../migrate/keys/keyring_format.h"

/* A body as the encoder's input. */
typedef struct kt_model {
    ks_krf_key *keys;
    size_t nkeys;
    ks_krf_version *versions;
    size_t nversions;
} kt_model;

/* Visitor: record a key; its versions follow in the shared array. */
static inline ks_err kt_on_key(void *ctx, const ks_krf_key *key)
{
    kt_model *m = ctx;
    m->keys[m->nkeys] = *key;
    m->keys[m->nkeys].versions = m->versions + m->nversions;
    m->nkeys++;
    return KS_OK;
}

/* Visitor: record a version. */
static inline ks_err kt_on_version(void *ctx, const ks_krf_version *v)
{
    kt_model *m = ctx;
    m->versions[m->nversions++] = *v;
    return KS_OK;
}

/* Release a model. */
static inline void kt_model_free(kt_model *m)
{
    free(m->keys);
    free(m->versions);
    memset(m, 0, sizeof *m);
}

/* Parse body[0, len) (file offset base) into *m: a first pass sizes it, a
 * second fills it.  Returns the parser's result; *m is empty on error. */
static inline ks_err kt_model_parse(const uint8_t *body, size_t len, size_t base, kt_model *m,
                                    ks_parse_error *pe)
{
    ks_krf_summary sum;
    memset(m, 0, sizeof *m);
    ks_err e = ks_krf_parse_body(body, len, base, NULL, &sum, pe);
    if (e != KS_OK) {
        return e;
    }
    m->keys = calloc(sum.keys + 1, sizeof *m->keys);
    m->versions = calloc(sum.versions + 1, sizeof *m->versions);
    if (m->keys == NULL || m->versions == NULL) {
        kt_model_free(m);
        return KS_ERR_NO_MEMORY;
    }
    const ks_krf_visitor vis = {kt_on_key, kt_on_version, m};
    e = ks_krf_parse_body(body, len, base, &vis, NULL, pe);
    if (e != KS_OK || m->nkeys != sum.keys || m->nversions != sum.versions) {
        kt_model_free(m);
        return e != KS_OK ? e : KS_ERR_INVALID_ARGUMENT;
    }
    return KS_OK;
}

/* Nonzero when the model re-encodes to exactly body[0, len). */
static inline int kt_model_reencodes(const kt_model *m, const uint8_t *body, size_t len)
{
    size_t n = 0, wrote = 0;
    if (ks_krf_body_len(m->keys, m->nkeys, &n) != KS_OK || n != len) {
        return 0;
    }
    uint8_t *buf = malloc(n);
    if (buf == NULL) {
        return 0;
    }
    int same = ks_krf_encode_body(m->keys, m->nkeys, buf, n - 1, &wrote) == KS_ERR_BUFFER_TOO_SMALL &&
               ks_krf_encode_body(m->keys, m->nkeys, buf, n, &wrote) == KS_OK && wrote == len &&
               memcmp(buf, body, len) == 0;
    free(buf);
    return same;
}

#endif /* KS_TESTS_KEYRING_TEST_UTIL_H */
