/*
 * fuzz/fuzz_parse.c -- the strict parser and the canonical encoder, on
 * arbitrary bytes.
 *
 * Oracles (each failure calls abort(), so every engine reports it):
 *   1. Full parse under the defaults.  A rejection has a rejection code
 *      (1..11), an offset within [0, len], and a zeroed result.  An
 *      acceptance has every view inside the input, total_len == len, the
 *      ciphertext as the last bytes, and passes ks_envelope_check().
 *   2. Round trip: ks_envelope_encoded_len() == len, ks_envelope_encode()
 *      gives the identical bytes, a smaller buffer gives buffer-too-small,
 *      and a second parse gives identical views (same pointers, lengths and
 *      values).
 *   3. Header parse on the same bytes: full accepted => header accepted with
 *      the same fields, total_len == len and the same header_len.  Header
 *      rejected => full rejected with the same code, offset and field.
 *      Header accepted with total_len < len => buf[0, total_len) is a whole
 *      envelope that parses to the same fields; total_len > len => the full
 *      parse says truncated.
 *   4. Lowered limits derived from the last input bytes (ciphertext bytes of
 *      a valid envelope, so mutating them keeps the envelope valid):
 *      accepted under lowered => accepted under defaults, with the same
 *      fields, and no longer than ks_envelope_max_len(lowered).  A result
 *      that differs from the defaults' must be too-large, no later than the
 *      defaults' rejection.
 *   5. Caller errors (NULL out, NULL buffer, out-of-range limits) give
 *      invalid-argument whatever the input.
 *   6. The cursor primitives of parser/cursor.h on the same bytes: varints
 *      against an independent reference decoder, views and sub-cursors
 *      against their contracts (absolute offsets, a failed read leaves the
 *      cursor unchanged).  This is also what covers ks_cursor_read_sub(),
 *      which the parser itself does not call.
 *   7. On an accepted envelope: damaged copies (version 3, a v2-only field
 *      in v1, an empty, too long or badly charactered value, key_version
 *      0, a NULL view) are refused by ks_envelope_check(), _encoded_len()
 *      and _encode() with the same code, nothing written; caller errors
 *      give invalid-argument or buffer-too-small; ks_aad_data() and
 *      ks_aad_wrap() accept the envelope and refuse what keyshift/aad.h
 *      says they refuse.
 *   8. Once per process: every error code has a name, the defined names
 *      are distinct, ks_err_is_rejection() is exactly 1..11 and
 *      ks_err_is_retryable() exactly unavailable and timeout; algorithm
 *      names round-trip.
 *   9. Parsing like a known envelope (parser/envelope_head.h, what an
 *      open does when an envelope is shaped like the last one it opened)
 *      gives the whole parse's result, errors and offsets included, and
 *      says it was like exactly when it succeeded on an input shaped
 *      like the known one: on the input with its own shape when its
 *      header parses, and with the shape of a fixed envelope of each
 *      version, on the fixed header followed by the input and on the
 *      fixed envelope patched by the input.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <keyshift/aad.h>
#include <keyshift/envelope.h>
#include <keyshift/error.h>

#include "../parser/cursor.h"
#include "../parser/envelope_head.h"
#include "../tests/envelope_eq.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#include "fuzz_check.h"

/* Every header field equal, views by identity; the ciphertext and
 * total_len not compared (ks_test_result_eq compares those too). */
static int header_eq(const ks_envelope *a, const ks_envelope *b)
{
    return a->version == b->version && a->algorithm == b->algorithm &&
           ks_test_view_same(a->tenant, b->tenant) && ks_test_view_same(a->key_id, b->key_id) &&
           a->key_version == b->key_version && ks_test_view_same(a->wrapped_dek, b->wrapped_dek) &&
           ks_test_view_same(a->nonce, b->nonce) && ks_test_view_same(a->purpose, b->purpose) &&
           ks_test_view_same(a->commitment, b->commitment) && a->header_len == b->header_len;
}

/* The zeroed result a rejection must leave, compared member by member. */
static int is_zero(const ks_envelope *e)
{
    static const ks_envelope zero;
    return ks_test_result_eq(e, &zero) && e->ciphertext.ptr == NULL;
}

static void check_rejection(ks_err e, const ks_parse_error *pe, const ks_envelope *out, size_t size)
{
    CHECK(ks_err_is_rejection(e));
    CHECK(pe->code == e);
    CHECK(pe->offset <= size);
    CHECK(pe->field <= KS_FIELD_CIPHERTEXT || e == KS_ERR_UNKNOWN_FIELD ||
          e == KS_ERR_FIELD_ORDER || e == KS_ERR_WIRE_TYPE);
    CHECK(strcmp(ks_err_name(e), "unknown-error") != 0);
    CHECK(is_zero(out));
}

static void check_accepted(const ks_envelope *env, const uint8_t *data, size_t size)
{
    CHECK(env->version == KS_FORMAT_V1 || env->version == KS_FORMAT_V2);
    CHECK(ks_alg_name(env->algorithm) != NULL);
    CHECK(env->key_version != 0);
    CHECK(env->nonce.len == ks_alg_nonce_len(env->algorithm));
    CHECK(ks_test_views_inside(env, data, size));
    CHECK(env->total_len == size);
    CHECK(env->header_len > KS_PREFIX_LEN && env->header_len < size);
    CHECK(env->ciphertext.len >= KS_TAG_LEN);
    CHECK(env->ciphertext.ptr + env->ciphertext.len == data + size);
    if (env->version == KS_FORMAT_V1) {
        CHECK(env->purpose.len == 0 && env->commitment.len == 0);
    } else {
        CHECK(env->purpose.len != 0 && env->commitment.len == KS_COMMITMENT_LEN);
    }
    CHECK(ks_envelope_check(env, NULL) == KS_OK);
    CHECK(size <= ks_envelope_max_len(NULL));
}

/* Oracle 2: the encoder reproduces the accepted bytes exactly. */
static void check_round_trip(const ks_envelope *env, const uint8_t *data, size_t size)
{
    size_t n = 0;
    CHECK(ks_envelope_encoded_len(env, NULL, &n) == KS_OK);
    CHECK(n == size);
    uint8_t *buf = malloc(size);
    CHECK(buf != NULL);
    size_t wrote = 0;
    CHECK(ks_envelope_encode(env, NULL, buf, size - 1, &wrote) == KS_ERR_BUFFER_TOO_SMALL);
    CHECK(ks_envelope_encode(env, NULL, buf, size, &wrote) == KS_OK);
    CHECK(wrote == size);
    CHECK(memcmp(buf, data, size) == 0);
    free(buf);

    ks_envelope again;
    ks_parse_error pe;
    CHECK(ks_envelope_parse(data, size, NULL, &again, &pe) == KS_OK);
    CHECK(ks_test_result_eq(env, &again));
}

/* Oracle 3: the header parser agrees with the full parser. */
static void check_header(const uint8_t *data, size_t size, ks_err full_e, const ks_envelope *full,
                         const ks_parse_error *full_pe)
{
    ks_envelope hdr;
    ks_parse_error pe;
    ks_err e = ks_envelope_parse_header(data, size, NULL, &hdr, &pe);
    if (full_e == KS_OK) {
        CHECK(e == KS_OK);
        CHECK(header_eq(&hdr, full));
        CHECK(ks_test_view_same(hdr.ciphertext, full->ciphertext));
        CHECK(hdr.total_len == size);
        return;
    }
    if (e != KS_OK) {
        check_rejection(e, &pe, &hdr, size);
        CHECK(full_e == e && full_pe->offset == pe.offset && full_pe->field == pe.field);
        return;
    }
    /* Header accepted, full rejected. */
    CHECK(hdr.total_len != size);
    CHECK(hdr.header_len > KS_PREFIX_LEN && hdr.header_len < hdr.total_len);
    CHECK(hdr.ciphertext.len >= KS_TAG_LEN || hdr.ciphertext.ptr == NULL);
    if (hdr.total_len > size) {
        CHECK(full_e == KS_ERR_TRUNCATED);
        CHECK(hdr.ciphertext.ptr == NULL && hdr.ciphertext.len == 0);
    } else {
        ks_envelope whole;
        CHECK(ks_envelope_parse(data, hdr.total_len, NULL, &whole, &pe) == KS_OK);
        CHECK(header_eq(&hdr, &whole));
        CHECK(ks_test_view_same(hdr.ciphertext, whole.ciphertext));
    }
}

/* Oracle 4's limits, from the last bytes of the input. */
static void lowered_limits(const uint8_t *data, size_t size, ks_limits *lim)
{
    uint8_t b[8] = {0};
    for (size_t i = 0; i < sizeof b && i < size; i++) {
        b[i] = data[size - 1 - i];
    }
    lim->max_tenant = 1 + b[0] % KS_TENANT_MAX;
    lim->max_key_id = 1 + (b[1] | (size_t)(b[2] & 1) << 8) % KS_KEY_ID_MAX;
    lim->max_wrapped_dek = 1 + (b[3] | (size_t)(b[2] & 6) << 7) % KS_WRAPPED_DEK_MAX;
    lim->max_purpose = 1 + b[4] % KS_PURPOSE_MAX;
    lim->max_ciphertext = KS_TAG_LEN + (b[5] | (size_t)b[6] << 8);
}

static void check_lowered(const uint8_t *data, size_t size, ks_err def_e, const ks_envelope *def,
                          const ks_parse_error *def_pe)
{
    ks_limits lim;
    ks_envelope low;
    ks_parse_error pe;
    lowered_limits(data, size, &lim);
    CHECK(ks_limits_check(&lim) == KS_OK);
    ks_err e = ks_envelope_parse(data, size, &lim, &low, &pe);
    if (e == KS_OK) {
        CHECK(def_e == KS_OK);
        CHECK(ks_test_result_eq(&low, def));
        CHECK(size <= ks_envelope_max_len(&lim));
        CHECK(ks_envelope_check(&low, &lim) == KS_OK);
        return;
    }
    check_rejection(e, &pe, &low, size);
    if (def_e == KS_OK) {
        CHECK(e == KS_ERR_TOO_LARGE);
        CHECK(ks_envelope_check(def, &lim) == KS_ERR_TOO_LARGE);
    } else if (e != def_e || pe.offset != def_pe->offset) {
        CHECK(e == KS_ERR_TOO_LARGE && pe.offset <= def_pe->offset);
    }
}

/* Oracle 5: caller errors, before the input is looked at. */
static void check_caller_errors(const uint8_t *data, size_t size)
{
    ks_envelope env;
    ks_parse_error pe;
    ks_limits bad;
    ks_limits_default(&bad);
    bad.max_ciphertext = KS_TAG_LEN - 1;
    CHECK(ks_envelope_parse(data, size, NULL, NULL, &pe) == KS_ERR_INVALID_ARGUMENT);
    CHECK(ks_envelope_parse(data, size, &bad, &env, &pe) == KS_ERR_INVALID_ARGUMENT);
    CHECK(pe.code == KS_ERR_INVALID_ARGUMENT && is_zero(&env));
    CHECK(ks_envelope_parse_header(data, size, &bad, &env, NULL) == KS_ERR_INVALID_ARGUMENT);
    if (size != 0) {
        CHECK(ks_envelope_parse(NULL, size, NULL, &env, &pe) == KS_ERR_INVALID_ARGUMENT);
    }
    /* (NULL, 0) is the empty input, not a caller error. */
    ks_envelope empty;
    ks_parse_error epe;
    CHECK(ks_envelope_parse(NULL, 0, NULL, &env, &pe) == ks_envelope_parse(data, 0, NULL, &empty, &epe));
    CHECK(pe.code == epe.code && pe.offset == 0 && epe.offset == 0);
}

/* Oracle 7's expectation for one damaged envelope: check, encoded_len and
 * encode agree on want, and encode writes nothing. */
static void expect_refused(const ks_envelope *d, const ks_limits *lim, ks_err want)
{
    static uint8_t out[8192];
    size_t n = 7;
    CHECK(want != KS_OK);
    CHECK(ks_envelope_check(d, lim) == want);
    CHECK(ks_envelope_encoded_len(d, lim, &n) == want && n == 7);
    out[0] = 0xA5;
    CHECK(ks_envelope_encode(d, lim, out, sizeof out, &n) == want && n == 7 && out[0] == 0xA5);
}

/* Oracle 7: the encoder refuses damaged copies of an accepted envelope
 * with the code docs/format.md gives and writes nothing; it refuses caller
 * errors; the AAD writers of format/aad.c accept the envelope and refuse
 * what keyshift/aad.h says they refuse.  Every damage on every accepted
 * input, so the committed corpus covers them all. */
static void check_encoder_refusals(const ks_envelope *env)
{
    static const uint8_t long_name[KS_KEY_ID_MAX + 1] = {0};
    static uint8_t out[KS_DATA_AAD_MAX + KS_WRAP_AAD_MAX];
    ks_envelope d = *env;
    ks_limits bad;
    size_t n = 0, need = 0;

    CHECK(ks_envelope_encoded_len(env, NULL, &need) == KS_OK);
    CHECK(ks_envelope_encoded_len(env, NULL, NULL) == KS_ERR_INVALID_ARGUMENT);
    CHECK(ks_envelope_encode(env, NULL, out, sizeof out, NULL) == KS_ERR_INVALID_ARGUMENT);
    CHECK(ks_envelope_encode(env, NULL, NULL, 1, &n) == KS_ERR_INVALID_ARGUMENT);
    CHECK(ks_envelope_encode(env, NULL, NULL, 0, &n) == KS_ERR_BUFFER_TOO_SMALL);
    expect_refused(NULL, NULL, KS_ERR_INVALID_ARGUMENT);
    ks_limits_default(&bad);
    bad.max_tenant = 0;
    expect_refused(env, &bad, KS_ERR_INVALID_ARGUMENT);
    CHECK(ks_limits_check(NULL) == KS_ERR_INVALID_ARGUMENT && ks_envelope_max_len(&bad) == 0);

    d.version = 3;
    expect_refused(&d, NULL, KS_ERR_UNSUPPORTED_VERSION);
    d = *env;
    d.tenant.ptr = NULL;
    expect_refused(&d, NULL, d.tenant.len != 0 ? KS_ERR_INVALID_ARGUMENT : KS_ERR_BAD_VALUE);
    d = *env;
    if (d.version == KS_FORMAT_V1) {
        d.purpose = (ks_bytes){env->tenant.ptr, env->tenant.len};
    } else {
        d.version = KS_FORMAT_V1;
    }
    expect_refused(&d, NULL, KS_ERR_UNKNOWN_FIELD);
    d = *env;
    d.tenant.len = 0;
    expect_refused(&d, NULL, KS_ERR_BAD_VALUE);
    d = *env;
    d.tenant = (ks_bytes){long_name, KS_TENANT_MAX + 1};
    expect_refused(&d, NULL, KS_ERR_TOO_LARGE);
    d = *env;
    d.key_id = (ks_bytes){long_name, 1}; /* a NUL is outside the key_id charset */
    expect_refused(&d, NULL, KS_ERR_BAD_VALUE);
    d = *env;
    d.key_version = 0;
    expect_refused(&d, NULL, KS_ERR_BAD_VALUE);

    /* The AADs of the accepted envelope, and their refusals. */
    ks_bytes ctx = {long_name, 3};
    CHECK(ks_aad_data(env, ctx, out, sizeof out, &n) == KS_OK && n <= KS_DATA_AAD_MAX);
    CHECK(ks_aad_data(env, ctx, out, n - 1, &need) == KS_ERR_BUFFER_TOO_SMALL);
    CHECK(ks_aad_data(env, ctx, NULL, sizeof out, &need) == KS_ERR_BUFFER_TOO_SMALL);
    CHECK(ks_aad_data(env, ctx, out, sizeof out, NULL) == KS_ERR_INVALID_ARGUMENT);
    CHECK(ks_aad_data(env, (ks_bytes){NULL, 1}, out, sizeof out, &n) == KS_ERR_INVALID_ARGUMENT);
    CHECK(ks_aad_data(env, (ks_bytes){long_name, KS_CONTEXT_MAX + 1}, out, sizeof out, &n) ==
          KS_ERR_INVALID_ARGUMENT);
    CHECK(ks_aad_wrap(env, out, sizeof out, &n) == KS_OK && n <= KS_WRAP_AAD_MAX);
    CHECK(ks_aad_wrap(env, out, n - 1, &need) == KS_ERR_BUFFER_TOO_SMALL);
    CHECK(ks_aad_wrap(env, NULL, sizeof out, &need) == KS_ERR_BUFFER_TOO_SMALL);
    CHECK(ks_aad_wrap(env, out, sizeof out, NULL) == KS_ERR_INVALID_ARGUMENT);
    CHECK(ks_aad_wrap(NULL, out, sizeof out, &n) == KS_ERR_INVALID_ARGUMENT);
    d = *env;
    d.version = 3;
    CHECK(ks_aad_data(&d, ctx, out, sizeof out, &n) == KS_ERR_INVALID_ARGUMENT);
    d = *env;
    d.tenant = (ks_bytes){long_name, KS_TENANT_MAX + 1};
    CHECK(ks_aad_wrap(&d, out, sizeof out, &n) == KS_ERR_INVALID_ARGUMENT);
    d = *env;
    d.key_id = (ks_bytes){long_name, KS_KEY_ID_MAX + 1};
    CHECK(ks_aad_wrap(&d, out, sizeof out, &n) == KS_ERR_INVALID_ARGUMENT);
    d = *env;
    d.purpose = (ks_bytes){long_name, KS_PURPOSE_MAX + 1};
    CHECK(ks_aad_data(&d, ctx, out, sizeof out, &n) == KS_ERR_INVALID_ARGUMENT);
    if (env->version == KS_FORMAT_V2) {
        d = *env;
        d.commitment.len = KS_COMMITMENT_LEN - 1;
        CHECK(ks_aad_data(&d, ctx, out, sizeof out, &n) == KS_ERR_INVALID_ARGUMENT);
        d.commitment = (ks_bytes){NULL, 0};
        CHECK(ks_aad_data(&d, ctx, out, sizeof out, &n) == KS_ERR_INVALID_ARGUMENT);
    }
}

/* Oracle 8, once per process: the names of format/format.c.  Every code
 * has a name; the names of defined codes are distinct; rejections are
 * exactly 1..11 and retryable exactly unavailable and timeout; algorithm
 * names round-trip and nothing else maps to an algorithm. */
static void check_names(void)
{
    static int done;
    if (done) {
        return;
    }
    done = 1;
    const char *names[256];
    for (int c = 0; c < 256; c++) {
        names[c] = ks_err_name((ks_err)c);
        CHECK(names[c] != NULL);
        CHECK(ks_err_is_rejection((ks_err)c) == (c >= 1 && c <= 11));
        CHECK(ks_err_is_retryable((ks_err)c) == (c == KS_ERR_UNAVAILABLE || c == KS_ERR_TIMEOUT));
        CHECK(!ks_err_is_rejection((ks_err)c) || strcmp(names[c], "unknown-error") != 0);
        for (int o = 0; o < c && strcmp(names[c], "unknown-error") != 0; o++) {
            CHECK(strcmp(names[c], names[o]) != 0);
        }
    }
    for (uint32_t alg = KS_ALG_AES256GCM; alg <= KS_ALG_XCHACHA20POLY1305; alg++) {
        CHECK(ks_alg_from_name(ks_alg_name(alg)) == alg && ks_alg_nonce_len(alg) != 0);
    }
    CHECK(ks_alg_name(0) == NULL && ks_alg_from_name(NULL) == 0 && ks_alg_from_name("aes") == 0);
}

/* Oracle 6's reference: a protobuf varint read the general way (up to ten
 * bytes, 64-bit), then judged by the rules of [F-VARINT-1..4]. */
static ks_err ref_varint32(const uint8_t *p, size_t avail, uint32_t *out, size_t *used)
{
    size_t k = 0; /* index of the terminating byte */
    while (k < avail && k < 10 && (p[k] & 0x80) != 0) {
        k++;
    }
    if (k >= 5) {
        return KS_ERR_VARINT_OVERFLOW; /* five or more continuation bytes */
    }
    if (k == avail) {
        return KS_ERR_TRUNCATED;
    }
    uint64_t v = 0;
    for (size_t i = 0; i <= k; i++) {
        v |= (uint64_t)(p[i] & 0x7F) << (7 * i);
    }
    if (v > UINT32_MAX) {
        return KS_ERR_VARINT_OVERFLOW;
    }
    size_t minimal = 1;
    for (uint64_t t = v; t >= 0x80; t >>= 7) {
        minimal++;
    }
    if (minimal != k + 1) {
        return KS_ERR_NONCANONICAL_VARINT;
    }
    *out = (uint32_t)v;
    *used = k + 1;
    return KS_OK;
}

static int cursor_same(const ks_cursor *a, const ks_cursor *b)
{
    return a->buf == b->buf && a->len == b->len && a->pos == b->pos && a->base == b->base;
}

/* Walk the input as varint, then a view or a sub-cursor of that length
 * (by the varint's parity); descend into sub-cursors. */
static void check_cursor(const uint8_t *data, size_t size)
{
    ks_cursor c = ks_cursor_init(size ? data : NULL, size);
    for (int steps = 0; steps < 64 && !ks_cursor_is_empty(&c); steps++) {
        const ks_cursor before = c;
        uint32_t v = 0, rv = 0;
        size_t used = 0;
        ks_err e = ks_cursor_read_varint32(&c, &v);
        ks_err re = ref_varint32(c.buf + before.pos, ks_cursor_remaining(&before), &rv, &used);
        CHECK(e == re);
        if (e != KS_OK) {
            CHECK(cursor_same(&c, &before));
            uint8_t b;
            CHECK(ks_cursor_read_u8(&c, &b) == KS_OK && b == before.buf[before.pos]);
            continue;
        }
        CHECK(v == rv && c.pos == before.pos + used);
        const ks_cursor mid = c;
        const size_t at = ks_cursor_offset(&c);
        if (v & 1) {
            ks_cursor sub;
            e = ks_cursor_read_sub(&c, v >> 1, &sub);
            if (e != KS_OK) {
                CHECK(e == KS_ERR_TRUNCATED && (v >> 1) > ks_cursor_remaining(&mid));
                CHECK(cursor_same(&c, &mid));
                return;
            }
            CHECK(sub.buf == mid.buf + mid.pos && sub.len == v >> 1 && sub.pos == 0);
            CHECK(ks_cursor_offset(&sub) == at && ks_cursor_offset(&c) == at + sub.len);
            c = sub; /* descend: the rest of the outer region is skipped */
        } else {
            ks_bytes view;
            e = ks_cursor_read_view(&c, v >> 1, &view);
            if (e != KS_OK) {
                CHECK(e == KS_ERR_TRUNCATED && (v >> 1) > ks_cursor_remaining(&mid));
                CHECK(cursor_same(&c, &mid));
                return;
            }
            CHECK(view.len == v >> 1 && ks_cursor_offset(&c) == at + view.len);
            CHECK(view.len == 0 ? view.ptr == NULL : view.ptr == mid.buf + mid.pos);
        }
        CHECK(c.pos <= c.len && c.base + c.len <= size);
    }
    uint8_t b;
    if (ks_cursor_is_empty(&c)) {
        CHECK(ks_cursor_read_u8(&c, &b) == KS_ERR_TRUNCATED && ks_cursor_is_empty(&c));
    }
}

/* Oracle 9 on one input: parsing like h (made from hdr) gives the whole
 * parse's result, and like exactly when it succeeded on an input shaped
 * like h. */
static void check_like_one(const uint8_t *buf, size_t len, const ks_envelope_head *h, const uint8_t *hdr)
{
    ks_envelope a, b;
    ks_parse_error ea, eb;
    int like = 7;
    const ks_err ga = ks_envelope_parse(buf, len, NULL, &a, &ea);
    const ks_err gb = ks_envelope_parse_like(buf, len, NULL, h, hdr, &b, &eb, &like);
    CHECK(ga == gb);
    CHECK(like == (gb == KS_OK && ks_envelope_like(buf, len, h, hdr)));
    if (ga == KS_OK) {
        CHECK(ks_test_result_eq(&a, &b));
    } else {
        CHECK(eb.code == ea.code && eb.offset == ea.offset && eb.field == ea.field);
        CHECK(is_zero(&b));
    }
    /* NULL err and like change nothing but the reports; out-of-range
     * limits are invalid-argument at 0, like or not, with *out cleared */
    CHECK(ks_envelope_parse_like(buf, len, NULL, h, hdr, &b, NULL, NULL) == gb);
    const ks_limits bad = {0, 0, 0, 0, 0};
    like = 7;
    CHECK(ks_envelope_parse_like(buf, len, &bad, h, hdr, &b, &eb, &like) == KS_ERR_INVALID_ARGUMENT);
    CHECK(eb.code == KS_ERR_INVALID_ARGUMENT && eb.offset == 0 && eb.field == 0 && is_zero(&b) && like == 0);
}

/* A fixed envelope of version v (encoded once into buf, cap bytes, its
 * length into *len): its shape into *h. */
static void fixed_head(uint8_t v, uint8_t *buf, size_t cap, size_t *len, ks_envelope_head *h)
{
    static const uint8_t wdek[60] = {1}, nonce[24] = {2}, commit[32] = {3}, ct[16] = {4};
    const uint32_t alg = v == KS_FORMAT_V1 ? KS_ALG_AES256GCM : KS_ALG_XCHACHA20POLY1305;
    const ks_envelope e = {v,
                           alg,
                           {(const uint8_t *)"tenant-7", 8},
                           {(const uint8_t *)"kek/app", 7},
                           3,
                           {wdek, sizeof wdek},
                           {nonce, ks_alg_nonce_len(alg)},
                           v == KS_FORMAT_V2 ? (ks_bytes){(const uint8_t *)"card", 4} : (ks_bytes){NULL, 0},
                           v == KS_FORMAT_V2 ? (ks_bytes){commit, sizeof commit} : (ks_bytes){NULL, 0},
                           {ct, sizeof ct},
                           0,
                           0};
    ks_envelope parsed;
    CHECK(ks_envelope_encode(&e, NULL, buf, cap, len) == KS_OK);
    CHECK(ks_envelope_parse(buf, *len, NULL, &parsed, NULL) == KS_OK);
    ks_envelope_head_of(buf, &parsed, h);
}

/* Oracle 9. */
static void check_like(const uint8_t *data, size_t size)
{
    static uint8_t fixed[2][256];
    static size_t fixed_len[2];
    static ks_envelope_head heads[2];
    static int ready;
    if (!ready) {
        fixed_head(KS_FORMAT_V1, fixed[0], sizeof fixed[0], &fixed_len[0], &heads[0]);
        fixed_head(KS_FORMAT_V2, fixed[1], sizeof fixed[1], &fixed_len[1], &heads[1]);
        ready = 1;
    }
    ks_envelope hdr;
    if (ks_envelope_parse_header(data, size, NULL, &hdr, NULL) == KS_OK) {
        ks_envelope_head h;
        ks_envelope_head_of(data, &hdr, &h);
        check_like_one(data, size, &h, data);
    }
    for (size_t v = 0; v < 2; v++) {
        /* the fixed header, then the input */
        const size_t hl = heads[v].header_len, n = hl + size;
        uint8_t *buf = malloc(n); /* exact: a read past the input is caught */
        CHECK(buf != NULL);
        memcpy(buf, fixed[v], hl);
        if (size != 0) {
            memcpy(buf + hl, data, size);
        }
        check_like_one(buf, n, &heads[v], fixed[v]);
        /* the fixed envelope patched by the input, read as (offset, byte)
         * pairs, with its last byte appended when it is odd */
        const size_t m = fixed_len[v] + (size & 1);
        uint8_t *over = malloc(m);
        CHECK(over != NULL);
        memcpy(over, fixed[v], fixed_len[v]);
        for (size_t i = 0; i + 1 < size; i += 2) {
            over[data[i] % fixed_len[v]] = data[i + 1];
        }
        if (size & 1) {
            over[m - 1] = data[size - 1];
        }
        check_like_one(over, m, &heads[v], fixed[v]);
        free(over);
        free(buf);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ks_envelope env;
    ks_parse_error pe;

    ks_err e = ks_envelope_parse(data, size, NULL, &env, &pe);
    if (e == KS_OK) {
        check_accepted(&env, data, size);
        check_round_trip(&env, data, size);
        check_encoder_refusals(&env);
    } else {
        check_rejection(e, &pe, &env, size);
    }
    /* A NULL err pointer changes nothing but the report. */
    ks_envelope env2;
    CHECK(ks_envelope_parse(data, size, NULL, &env2, NULL) == e);
    CHECK(ks_test_result_eq(&env, &env2));

    check_header(data, size, e, &env, &pe);
    check_lowered(data, size, e, &env, &pe);
    check_caller_errors(data, size);
    check_cursor(data, size);
    check_like(data, size);
    check_names();
    return 0;
}
