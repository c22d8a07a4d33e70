/*
 * tests/envelope_eq.h -- comparisons of parse results (and the zeroed
 * plaintext check), shared by the unit tests (tests/) and the fuzz
 * harnesses (fuzz/).  Test support code, not
 * part of the library: static inline only, so a file includes it without
 * linking anything and a function one file does not use costs nothing.
 *
 * fuzz/ includes it as "../tests/envelope_eq.h", which resolves relative to
 * the including file and so needs no -I flag (fuzz/build.sh adds none).
 */
#ifndef KS_TESTS_ENVELOPE_EQ_H
#define KS_TESTS_ENVELOPE_EQ_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <keyshift/envelope.h>

/* Nonzero when two views hold the same bytes (contents, not positions).
 * For comparing a parse result with values that live elsewhere (an
 * envelope built in memory, nanopb's copies).  memcmp is not called for an
 * empty view, whose pointer is NULL. */
static inline int ks_test_bytes_eq(ks_bytes a, ks_bytes b)
{
    return a.len == b.len && (a.len == 0 || memcmp(a.ptr, b.ptr, a.len) == 0);
}

/* Nonzero when two views are the same view: equal pointer and length.
 * The parser is zero-copy, so two parses of one buffer must agree on
 * positions, not only on contents. */
static inline int ks_test_view_same(ks_bytes a, ks_bytes b)
{
    return a.ptr == b.ptr && a.len == b.len;
}

/* Nonzero when two envelopes have equal field values (not positions):
 * version, algorithm, key_version and the contents of every view.
 * header_len and total_len are not compared: they describe an encoding,
 * and the values may come from no encoding at all. */
static inline int ks_test_fields_eq(const ks_envelope *a, const ks_envelope *b)
{
    return a->version == b->version && a->algorithm == b->algorithm &&
           ks_test_bytes_eq(a->tenant, b->tenant) && ks_test_bytes_eq(a->key_id, b->key_id) &&
           a->key_version == b->key_version && ks_test_bytes_eq(a->wrapped_dek, b->wrapped_dek) &&
           ks_test_bytes_eq(a->nonce, b->nonce) && ks_test_bytes_eq(a->purpose, b->purpose) &&
           ks_test_bytes_eq(a->commitment, b->commitment) &&
           ks_test_bytes_eq(a->ciphertext, b->ciphertext);
}

/* Nonzero when two parse results are identical: every value, every view
 * (pointer and length), header_len and total_len.  Compared member by
 * member, not with memcmp: padding bytes of a struct are unspecified. */
static inline int ks_test_result_eq(const ks_envelope *a, const ks_envelope *b)
{
    return a->version == b->version && a->algorithm == b->algorithm &&
           a->key_version == b->key_version && ks_test_view_same(a->tenant, b->tenant) &&
           ks_test_view_same(a->key_id, b->key_id) &&
           ks_test_view_same(a->wrapped_dek, b->wrapped_dek) &&
           ks_test_view_same(a->nonce, b->nonce) && ks_test_view_same(a->purpose, b->purpose) &&
           ks_test_view_same(a->commitment, b->commitment) &&
           ks_test_view_same(a->ciphertext, b->ciphertext) && a->header_len == b->header_len &&
           a->total_len == b->total_len;
}

/* Nonzero when a view is absent ({NULL, 0}: an empty view must have a NULL
 * pointer) or lies wholly inside buf[0, len): the parser's zero-copy
 * promise.  Written so that nothing overflows: v.len <= len is checked
 * before len - v.len, and the offset is taken only once v.ptr >= buf. */
static inline int ks_test_view_inside(ks_bytes v, const uint8_t *buf, size_t len)
{
    if (v.len == 0) {
        return v.ptr == NULL;
    }
    return v.ptr != NULL && v.ptr >= buf && v.len <= len && (size_t)(v.ptr - buf) <= len - v.len;
}

/* Nonzero when every view of e is absent or inside buf[0, len) (see
 * ks_test_view_inside): what an accepted parse of buf must give. */
static inline int ks_test_views_inside(const ks_envelope *e, const uint8_t *buf, size_t len)
{
    return ks_test_view_inside(e->tenant, buf, len) && ks_test_view_inside(e->key_id, buf, len) &&
           ks_test_view_inside(e->wrapped_dek, buf, len) &&
           ks_test_view_inside(e->nonce, buf, len) && ks_test_view_inside(e->purpose, buf, len) &&
           ks_test_view_inside(e->commitment, buf, len) &&
           ks_test_view_inside(e->ciphertext, buf, len);
}

/* Nonzero when p[0, n) holds only zero bytes (n == 0 included).  For the
 * promise of ks_open() and ks_rewrap() that a failed open leaves the whole
 * plaintext buffer zeroed, not only the bytes it might have written:
 * checked by the unit tests (tests/test_crypto.c) and by fuzz_open. */
static inline int ks_test_all_zero(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (p[i] != 0) {
            return 0;
        }
    }
    return 1;
}

#endif /* KS_TESTS_ENVELOPE_EQ_H */
