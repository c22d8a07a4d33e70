/*
 * fuzz/fuzz_keyring.c -- the keyring file parser and its canonical
 * encoder (migrate/keys/keyring_format.c, docs/keyring.md) on arbitrary bytes.
 *
 * The input is a keyring file.  Oracles (each failure calls abort(), so
 * every engine reports it):
 *   1. Header.  A rejection has a rejection code, an offset within
 *      [0, len], field 0 and a zeroed header.  An acceptance has its
 *      payload as the last bytes of the input, and the header encoder
 *      gives back exactly the bytes before the payload [K-CONF-1].
 *   2. Body (the payload of a plain file; for a sealed file, the bytes
 *      after the MAC are parsed as if they were the decrypted body, so
 *      that sealed inputs exercise the body parser too).  A rejection has
 *      a rejection code, an offset within the body's span of the file and
 *      a field no larger than the key count; a NULL err changes nothing
 *      but the report.  An acceptance re-encodes to the identical bytes,
 *      a second parse gives identical keys and versions (same views),
 *      the summary matches, every key_id passes ks_krf_check_key_id, and
 *      every proper prefix of the body is truncated (the format is
 *      count-driven, so no valid body is a prefix of another).
 *   3. Encoder refusals [K-CONF-2]: on an accepted body, each of a fixed
 *      set of rule-breaking changes to its first key (id empty, too long,
 *      outside the class, out of order; version count 0 or too large;
 *      primary 0; a state out of range; a non-active primary; material
 *      that does not match the state) makes the encoder refuse with the
 *      code the parser gives for such bytes, and caller errors give
 *      invalid-argument.  The header encoder likewise.
 *   4. A visitor callback that fails ends the parse with its own code,
 *      which is not a rejection, and leaves err untouched.
 *   5. ks_krf_check_key_id on the input's first bytes agrees with an
 *      independent statement of [F-KEYID-1].
 * Nothing is decrypted: Argon2id per input would starve the fuzzer, and
 * the sealing code is not the parser.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <keyshift/error.h>

#include "../migrate/keys/keyring_format.h"
#include "../tests/keyring_test_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#include "fuzz_check.h"

/* Nonzero when two views are the same bytes at the same address. */
static int same_view(ks_bytes a, ks_bytes b)
{
    return a.ptr == b.ptr && a.len == b.len;
}

/* Nonzero when two models of one body are identical, views included. */
static int same_model(const kt_model *a, const kt_model *b)
{
    if (a->nkeys != b->nkeys || a->nversions != b->nversions) {
        return 0;
    }
    for (size_t i = 0; i < a->nkeys; i++) {
        const ks_krf_key *x = &a->keys[i], *y = &b->keys[i];
        if (!same_view(x->key_id, y->key_id) || x->primary != y->primary || x->count != y->count) {
            return 0;
        }
    }
    for (size_t i = 0; i < a->nversions; i++) {
        const ks_krf_version *x = &a->versions[i], *y = &b->versions[i];
        if (x->state != y->state || x->created != y->created || x->material != y->material) {
            return 0;
        }
    }
    return 1;
}

/* Expect ks_krf_body_len() and ks_krf_encode_body() to refuse keys[0, n)
 * with `want`. */
static void expect_refused(const ks_krf_key *keys, size_t n, ks_err want)
{
    size_t len = 0;
    uint8_t out[8];
    CHECK(ks_krf_body_len(keys, n, &len) == want);
    CHECK(ks_krf_encode_body(keys, n, out, sizeof out, &len) == want);
}

/* Oracle 3 on the key list of an accepted body with at least one key. */
static void check_encoder_refusals(const kt_model *m)
{
    static const uint8_t long_id[KS_KEY_ID_MAX + 1] = {'a'};
    ks_krf_key k[2] = {m->keys[0], m->keys[0]};
    const ks_krf_key orig = m->keys[0];
    size_t len;
    uint8_t out[4];

    CHECK(ks_krf_body_len(NULL, 1, &len) == KS_ERR_INVALID_ARGUMENT);
    CHECK(ks_krf_body_len(k, 1, NULL) == KS_ERR_INVALID_ARGUMENT);
    CHECK(ks_krf_encode_body(k, 1, NULL, 1, &len) == KS_ERR_INVALID_ARGUMENT);
    CHECK(ks_krf_encode_body(k, 1, out, sizeof out, NULL) == KS_ERR_INVALID_ARGUMENT);
    CHECK(ks_krf_encode_body(k, 1, out, sizeof out, &len) == KS_ERR_BUFFER_TOO_SMALL);
    expect_refused(k, KS_KEYRING_MAX_KEYS + 1, KS_ERR_TOO_LARGE);
    expect_refused(k, 2, KS_ERR_FIELD_ORDER); /* a duplicate */
    k[0].key_id = (ks_bytes){NULL, 1};
    expect_refused(k, 1, KS_ERR_INVALID_ARGUMENT);
    k[0].key_id = (ks_bytes){NULL, 0};
    expect_refused(k, 1, KS_ERR_BAD_VALUE);
    k[0].key_id = (ks_bytes){long_id, sizeof long_id};
    expect_refused(k, 1, KS_ERR_TOO_LARGE);
    k[0].key_id = (ks_bytes){long_id, 2}; /* "a\0" */
    expect_refused(k, 1, KS_ERR_BAD_VALUE);
    k[0] = orig;
    k[0].count = 0;
    expect_refused(k, 1, KS_ERR_BAD_VALUE);
    k[0].count = KS_KEYRING_MAX_VERSIONS + 1;
    expect_refused(k, 1, KS_ERR_TOO_LARGE);
    k[0].count = orig.count;
    k[0].primary = 0;
    expect_refused(k, 1, KS_ERR_BAD_VALUE);
    k[0].primary = orig.primary;
    k[0].versions = NULL;
    expect_refused(k, 1, KS_ERR_INVALID_ARGUMENT);

    ks_krf_version *v = malloc(orig.count * sizeof *v);
    CHECK(v != NULL);
    k[0].versions = v;
    ks_krf_version *p = &v[orig.primary - 1];
    memcpy(v, orig.versions, orig.count * sizeof *v);
    p->state = 0;
    expect_refused(k, 1, KS_ERR_BAD_VALUE);
    p->state = KS_KEY_DISABLED;
    expect_refused(k, 1, KS_ERR_BAD_VALUE);
    p->state = KS_KEY_ACTIVE;
    p->material = NULL;
    expect_refused(k, 1, KS_ERR_INVALID_ARGUMENT);
    free(v);
}

/* Oracle 3 for the header encoder, from an accepted header h. */
static void check_header_refusals(const ks_krf_header *h)
{
    ks_krf_header x = *h;
    uint8_t out[KS_KRF_SEALED_HDR_LEN];
    size_t n;
    CHECK(ks_krf_encode_header(NULL, out, sizeof out, &n) == KS_ERR_INVALID_ARGUMENT);
    CHECK(ks_krf_encode_header(h, NULL, 1, &n) == KS_ERR_INVALID_ARGUMENT);
    CHECK(ks_krf_encode_header(h, out, sizeof out, NULL) == KS_ERR_INVALID_ARGUMENT);
    CHECK(ks_krf_encode_header(h, out, KS_KRF_PREFIX_LEN - 1, &n) == KS_ERR_BUFFER_TOO_SMALL);
    x.mode = 2;
    CHECK(ks_krf_encode_header(&x, out, sizeof out, &n) == KS_ERR_BAD_VALUE);
    if (h->mode != KS_KRF_MODE_SEALED) {
        return;
    }
    static const uint64_t bad_ops[] = {KS_KRF_OPSLIMIT_MIN - 1, KS_KRF_OPSLIMIT_MAX + 1};
    static const uint64_t bad_mem[] = {KS_KRF_MEMLIMIT_MIN - 1, KS_KRF_MEMLIMIT_MAX + 1};
    for (size_t i = 0; i < 2; i++) {
        x = *h;
        x.opslimit = bad_ops[i];
        CHECK(ks_krf_encode_header(&x, out, sizeof out, &n) == KS_ERR_BAD_VALUE);
        x = *h;
        x.memlimit = bad_mem[i];
        CHECK(ks_krf_encode_header(&x, out, sizeof out, &n) == KS_ERR_BAD_VALUE);
    }
    const ks_bytes *fields[] = {&h->salt, &h->nonce};
    for (size_t i = 0; i < 2; i++) {
        x = *h;
        ks_bytes *f = i == 0 ? &x.salt : &x.nonce;
        *f = (ks_bytes){fields[i]->ptr, fields[i]->len - 1};
        CHECK(ks_krf_encode_header(&x, out, sizeof out, &n) == KS_ERR_INVALID_ARGUMENT);
        *f = (ks_bytes){NULL, fields[i]->len};
        CHECK(ks_krf_encode_header(&x, out, sizeof out, &n) == KS_ERR_INVALID_ARGUMENT);
    }
}

/* Oracle 4: a visitor that fails at its `fail_at`-th call. */
typedef struct failing {
    unsigned calls, fail_at;
} failing;

static ks_err fail_key(void *ctx, const ks_krf_key *key)
{
    failing *f = ctx;
    (void)key;
    return ++f->calls == f->fail_at ? KS_ERR_NO_MEMORY : KS_OK;
}

static ks_err fail_version(void *ctx, const ks_krf_version *v)
{
    failing *f = ctx;
    (void)v;
    return ++f->calls == f->fail_at ? KS_ERR_NO_MEMORY : KS_OK;
}

static void check_visitor_failure(const uint8_t *body, size_t len, size_t base)
{
    for (unsigned at = 1; at <= 2; at++) {
        failing f = {0, at};
        const ks_krf_visitor vis = {fail_key, fail_version, &f};
        ks_parse_error pe = {KS_OK, 0, 0};
        CHECK(ks_krf_parse_body(body, len, base, &vis, NULL, &pe) == KS_ERR_NO_MEMORY);
        CHECK(pe.code == KS_OK && f.calls == at);
    }
}

/* Oracle 5: [F-KEYID-1] stated independently. */
static void check_key_id_rule(const uint8_t *data, size_t size)
{
    const size_t n = size < KS_KEY_ID_MAX + 2 ? size : KS_KEY_ID_MAX + 2;
    int ok = n >= 1 && n <= KS_KEY_ID_MAX;
    for (size_t i = 0; i < n && ok; i++) {
        const uint8_t c = data[i];
        ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
             (c != 0 && strchr("._:/@+=-", c) != NULL);
    }
    CHECK((ks_krf_check_key_id((ks_bytes){n ? data : NULL, n}) == KS_OK) == ok);
}

/* Oracle 2 on an accepted body. */
static void check_accepted_body(const uint8_t *body, size_t len, size_t base,
                                const ks_krf_summary *sum)
{
    kt_model m, again;
    ks_parse_error pe;
    CHECK(kt_model_parse(body, len, base, &m, &pe) == KS_OK);
    CHECK(m.nkeys == sum->keys && m.nversions == sum->versions);
    CHECK(kt_model_reencodes(&m, body, len));
    CHECK(kt_model_parse(body, len, base, &again, &pe) == KS_OK);
    CHECK(same_model(&m, &again));
    size_t material = 0, id_bytes = 0;
    for (size_t i = 0; i < m.nkeys; i++) {
        CHECK(ks_krf_check_key_id(m.keys[i].key_id) == KS_OK);
        CHECK(m.keys[i].key_id.ptr >= body && m.keys[i].key_id.ptr + m.keys[i].key_id.len <= body + len);
        CHECK(m.keys[i].versions[m.keys[i].primary - 1].state == KS_KEY_ACTIVE);
        CHECK(i == 0 || ks_krf_key_id_cmp(m.keys[i - 1].key_id, m.keys[i].key_id) < 0);
        id_bytes += m.keys[i].key_id.len;
    }
    for (size_t i = 0; i < m.nversions; i++) {
        material += m.versions[i].material != NULL;
        CHECK((m.versions[i].material == NULL) == (m.versions[i].state == KS_KEY_DESTROYED));
    }
    CHECK(material == sum->material && id_bytes == sum->id_bytes);
    if (m.nkeys > 0) {
        check_encoder_refusals(&m);
        check_visitor_failure(body, len, base);
    }
    kt_model_free(&m);
    kt_model_free(&again);
    /* No proper prefix of a valid body is valid. */
    if (len > 0) {
        CHECK(ks_krf_parse_body(body, len - 1, base, NULL, NULL, &pe) == KS_ERR_TRUNCATED);
        CHECK(pe.offset <= base + len - 1);
    }
}

/* Oracle 2: the body parser on body[0, len) at file offset base. */
static void check_body(const uint8_t *body, size_t len, size_t base)
{
    ks_krf_summary sum;
    ks_parse_error pe = {KS_OK, 0, 0};
    const ks_err e = ks_krf_parse_body(body, len, base, NULL, &sum, &pe);
    CHECK(ks_krf_parse_body(body, len, base, NULL, NULL, NULL) == e);
    if (e == KS_OK) {
        check_accepted_body(body, len, base, &sum);
        return;
    }
    CHECK(ks_err_is_rejection(e) && pe.code == e);
    CHECK(pe.offset >= base && pe.offset <= base + len);
    CHECK(pe.field <= KS_KEYRING_MAX_KEYS);
}

/* Oracle 1: the header parser and encoder. */
static int check_header(const uint8_t *data, size_t size, ks_krf_header *h)
{
    static const ks_krf_header zero;
    ks_parse_error pe = {KS_OK, 0, 0};
    const ks_err e = ks_krf_parse_header(data, size, h, &pe);
    if (e != KS_OK) {
        CHECK(ks_err_is_rejection(e) && pe.code == e);
        CHECK(pe.offset <= size && pe.field == 0);
        CHECK(memcmp(h, &zero, sizeof zero) == 0);
        return 0;
    }
    CHECK(h->mode == KS_KRF_MODE_PLAIN || h->mode == KS_KRF_MODE_SEALED);
    CHECK(h->payload_offset + h->payload.len == size);
    CHECK(h->payload.len == 0 || h->payload.ptr == data + h->payload_offset);
    uint8_t hdr[KS_KRF_SEALED_HDR_LEN];
    size_t n = 0;
    CHECK(ks_krf_encode_header(h, hdr, sizeof hdr, &n) == KS_OK);
    CHECK(n == h->payload_offset && memcmp(hdr, data, n) == 0);
    if (h->mode == KS_KRF_MODE_SEALED) {
        CHECK(n == KS_KRF_SEALED_HDR_LEN && h->payload.len >= KS_KRF_MAC_LEN + KS_KRF_COUNT_LEN);
        CHECK(h->opslimit >= KS_KRF_OPSLIMIT_MIN && h->opslimit <= KS_KRF_OPSLIMIT_MAX);
        CHECK(h->memlimit >= KS_KRF_MEMLIMIT_MIN && h->memlimit <= KS_KRF_MEMLIMIT_MAX);
    }
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ks_krf_header h;
    check_key_id_rule(data, size);
    if (!check_header(data, size, &h)) {
        return 0;
    }
    check_header_refusals(&h);
    if (h.mode == KS_KRF_MODE_PLAIN) {
        check_body(h.payload.ptr, h.payload.len, h.payload_offset);
    } else {
        check_body(h.payload.ptr + KS_KRF_MAC_LEN, h.payload.len - KS_KRF_MAC_LEN,
                   h.payload_offset + KS_KRF_MAC_LEN);
    }
    return 0;
}
