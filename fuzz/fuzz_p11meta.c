/*
 * fuzz/fuzz_p11meta.c -- the pkcs11 provider's metadata record parser and
 * its canonical encoder (migrate/keys/p11_meta.c) on arbitrary bytes: the
 * record is token data, so it is untrusted input.
 *
 * Oracles (each failure calls abort(), so every engine reports it):
 *   1. A rejection is one of the parser's documented codes.
 *   2. An acceptance is a record within the rules: seq >= 1, a key_id of
 *      1..256 bytes passing ks_krf_check_key_id, 1..4096 versions, every
 *      state in 1..4, an active primary among them, and an input of
 *      exactly 23 + key_id + versions bytes.
 *   3. An accepted record re-encodes to the identical bytes, and parses
 *      again to the identical record (canonical: one encoding per record).
 *   4. Its prefix one byte short is truncated, and one byte more is
 *      refused (bad-value; too-large past the longest record).
 *   5. The encoder refuses a rule-breaking change of the record (seq 0, a
 *      primary not active or out of range, a state out of range, too many
 *      versions, too long or empty a key_id) with the parser's code for
 *      such bytes, and a too-small buffer with buffer-too-small.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <keyshift/error.h>

#include "../migrate/keys/keyring_format.h"
#include "../migrate/keys/p11_meta.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#include "fuzz_check.h"

static ks_p11meta rec, again, bad;
static uint8_t out[KS_P11META_MAX_LEN + 1];
static uint8_t longer[KS_P11META_MAX_LEN + 1];

/* Nonzero for a code the parser may return on bytes. */
static int is_rejection(ks_err e)
{
    return e == KS_ERR_TRUNCATED || e == KS_ERR_BAD_MAGIC || e == KS_ERR_UNSUPPORTED_VERSION ||
           e == KS_ERR_BAD_VALUE || e == KS_ERR_TOO_LARGE;
}

/* Nonzero when two records are the same. */
static int same_record(const ks_p11meta *a, const ks_p11meta *b)
{
    return a->seq == b->seq && a->key_id_len == b->key_id_len &&
           memcmp(a->key_id, b->key_id, a->key_id_len) == 0 && a->nversions == b->nversions &&
           a->primary == b->primary && memcmp(a->states, b->states, a->nversions) == 0;
}

/* Oracle 5: the encoder refuses this change of rec with `want`. */
static void expect_refused(ks_err want)
{
    size_t n = 0;
    CHECK(ks_p11meta_encode(&bad, out, sizeof out, &n) == want);
    bad = rec;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const ks_err e = ks_p11meta_parse(data, size, &rec);
    if (e != KS_OK) {
        CHECK(is_rejection(e));
        return 0;
    }
    /* 2. */
    CHECK(rec.seq >= 1);
    CHECK(rec.key_id_len >= 1 && rec.key_id_len <= KS_KEY_ID_MAX);
    CHECK(ks_krf_check_key_id((ks_bytes){rec.key_id, rec.key_id_len}) == KS_OK);
    CHECK(rec.nversions >= 1 && rec.nversions <= KS_P11META_MAX_VERSIONS);
    CHECK(rec.primary >= 1 && rec.primary <= rec.nversions);
    CHECK(rec.states[rec.primary - 1] == 1);
    for (uint32_t i = 0; i < rec.nversions; i++) {
        CHECK(rec.states[i] >= 1 && rec.states[i] <= 4);
    }
    CHECK(size == KS_P11META_FIXED_LEN + rec.key_id_len + rec.nversions);
    CHECK(ks_p11meta_len(&rec) == size);

    /* 3. */
    size_t n = 0;
    CHECK(ks_p11meta_encode(&rec, out, sizeof out, &n) == KS_OK);
    CHECK(n == size && memcmp(out, data, size) == 0);
    CHECK(ks_p11meta_parse(out, n, &again) == KS_OK && same_record(&rec, &again));
    CHECK(ks_p11meta_encode(&rec, out, size - 1, &n) == KS_ERR_BUFFER_TOO_SMALL);

    /* 4. */
    CHECK(ks_p11meta_parse(data, size - 1, &again) == KS_ERR_TRUNCATED);
    if (size < sizeof longer) {
        memcpy(longer, data, size);
        longer[size] = data[0];
        CHECK(ks_p11meta_parse(longer, size + 1, &again) ==
              (size + 1 > KS_P11META_MAX_LEN ? KS_ERR_TOO_LARGE : KS_ERR_BAD_VALUE));
    }

    /* 5. */
    bad = rec;
    bad.seq = 0;
    expect_refused(KS_ERR_BAD_VALUE);
    bad.primary = 0;
    expect_refused(KS_ERR_BAD_VALUE);
    bad.primary = rec.nversions + 1;
    expect_refused(KS_ERR_BAD_VALUE);
    bad.states[rec.primary - 1] = (uint8_t)(2 + rec.seq % 3); /* not active */
    expect_refused(KS_ERR_BAD_VALUE);
    bad.states[rec.nversions - 1] = rec.seq % 2 ? 0 : 5;
    expect_refused(KS_ERR_BAD_VALUE);
    bad.nversions = KS_P11META_MAX_VERSIONS + 1;
    expect_refused(KS_ERR_TOO_LARGE);
    bad.key_id_len = KS_KEY_ID_MAX + 1;
    expect_refused(KS_ERR_TOO_LARGE);
    bad.key_id_len = 0;
    expect_refused(KS_ERR_BAD_VALUE);
    bad.key_id[0] = ' ';
    expect_refused(KS_ERR_BAD_VALUE);
    CHECK(ks_p11meta_encode(NULL, out, sizeof out, &n) == KS_ERR_INVALID_ARGUMENT);
    return 0;
}
