/*
 * parser/envelope.c -- the strict, zero-copy envelope decoder.
 *
 * This file is the one boundary at which untrusted envelope bytes enter the
 * library.  It implements docs/format.md; each check names the clause it
 * enforces.  It never allocates, never copies, never reads outside the
 * caller's buffer (all reads go through ks_cursor), and does work linear in
 * the input: each byte of the header is looked at a bounded number of
 * times and the ciphertext bytes are not looked at at all.
 *
 * It includes neither libsodium nor SQLite, and must not.
 */
#include <string.h>

#include <keyshift/envelope.h>

#include "../format/rules.h"
#include "cursor.h"
#include "envelope_head.h"

/* The field walk (parse_fields(), parse_value()) is always inlined into
 * parse_body(), once per version and starting field: with a constant rule
 * table the compiler folds every rule into the code, which it does not do
 * for an out-of-line call. */
#define KS_PARSE_INLINE __attribute__((always_inline)) static inline

/* Parsing modes: the whole envelope, or only through the ciphertext length. */
enum { KS_PARSE_FULL = 0, KS_PARSE_HEADER = 1 };

/* Record a rejection: clear *out so that no partial result can be used,
 * fill *err, and return code. */
static ks_err reject(ks_envelope *out, ks_parse_error *err, ks_err code, size_t offset,
                     uint32_t field)
{
    memset(out, 0, sizeof *out);
    if (err != NULL) {
        err->code = code;
        err->offset = offset;
        err->field = field;
    }
    return code;
}

/* Check the four-byte prefix [F-FRAME-1], [F-FRAME-2] and return the
 * version byte in *version.  On failure *offset is where it was found. */
static ks_err parse_prefix(ks_cursor *c, uint8_t *version, size_t *offset)
{
    static const uint8_t magic[3] = {KS_MAGIC_0, KS_MAGIC_1, KS_MAGIC_2};
    const size_t avail = ks_cursor_remaining(c);

    /* [F-FRAME-1] Every magic byte that is present must match, so that a
     * short non-envelope is reported as bad-magic, not truncated. */
    for (size_t i = 0; i < sizeof magic && i < avail; i++) {
        if (c->buf[c->pos + i] != magic[i]) {
            *offset = ks_cursor_offset(c) + i;
            return KS_ERR_BAD_MAGIC;
        }
    }
    ks_bytes m;
    if (ks_cursor_read_view(c, sizeof magic, &m) != KS_OK) {
        *offset = ks_cursor_offset(c);
        return KS_ERR_TRUNCATED;
    }
    *offset = ks_cursor_offset(c);
    if (ks_cursor_read_u8(c, version) != KS_OK) {
        return KS_ERR_TRUNCATED;
    }
    /* [F-FRAME-2] */
    if (*version != KS_FORMAT_V1 && *version != KS_FORMAT_V2) {
        return KS_ERR_UNSUPPORTED_VERSION;
    }
    return KS_OK;
}

/*
 * Read one field's value, whose tag has been read and checked, into *out.
 * nonce_len is the nonce length of the envelope's algorithm (field 1 is
 * always parsed first).  On failure returns the code and sets *offset.  In
 * header mode a ciphertext that runs past the input is accepted (its view
 * left absent).
 */
KS_PARSE_INLINE ks_err parse_value(ks_cursor *c, const ks_field_rule *r, const ks_limits *lim,
                                   size_t nonce_len, int mode, ks_envelope *out, size_t *offset)
{
    uint32_t v;
    ks_err e;

    *offset = ks_cursor_offset(c);
    if ((e = ks_cursor_read_varint32(c, &v)) != KS_OK) {
        return e; /* [F-VARINT-1..4] */
    }
    if (r->wire == KS_WIRE_VARINT) {
        if ((e = ks_rules_check_varint(r, v)) != KS_OK) {
            return e; /* [F-ALG-1], [F-KVER-1] */
        }
        *ks_rules_u32(out, r) = v;
        return KS_OK;
    }

    /* A length-delimited field: v is its length [F-LEN-1..3]. */
    if ((e = ks_rules_check_len(r, lim, nonce_len, v)) != KS_OK) {
        return e;
    }
    ks_bytes *view = ks_rules_bytes(out, r);
    *offset = ks_cursor_offset(c);
    if (mode == KS_PARSE_HEADER && r->number == KS_FIELD_CIPHERTEXT) {
        /* [F-HDR-1] The header ends here; the payload may be elsewhere. */
        out->total_len = *offset + v;
        if (v <= ks_cursor_remaining(c)) {
            e = ks_cursor_read_view(c, v, view);
            assert(e == KS_OK);
        }
        return KS_OK;
    }
    if ((e = ks_cursor_read_view(c, v, view)) != KS_OK) {
        return e; /* [F-LEN-4] the value runs past the input */
    }
    if (r->kind == KS_RULE_NAME || r->kind == KS_RULE_KEY_ID) {
        size_t bad = ks_rules_charset_scan(r->kind, view->ptr, view->len);
        if (bad != view->len) {
            *offset += bad; /* [F-NAME-1], [F-KEYID-1] */
            return KS_ERR_BAD_VALUE;
        }
    }
    return KS_OK;
}

/*
 * Explain a tag that is not the one-byte canonical tag of the field
 * expected next (rules[next], or the end of input when next == count).
 * The tag is decoded in full and classified, in the precedence order of
 * docs/format.md section 5: varint errors, unknown-field, field-order,
 * missing-field, wire-type.  *field receives the field number the error
 * concerns.  Always returns an error: a tag that matched would have taken
 * the fast path.
 */
static ks_err diagnose_tag(ks_cursor *c, const ks_field_rule *rules, size_t count, size_t next,
                           uint32_t *field)
{
    uint32_t tag;
    ks_err e;

    *field = 0;
    if ((e = ks_cursor_read_varint32(c, &tag)) != KS_OK) {
        return e; /* [F-VARINT-1..4] */
    }
    const uint32_t number = tag >> 3;
    const int idx = ks_rules_index(rules, count, number);
    *field = number;
    if (idx < 0) {
        return KS_ERR_UNKNOWN_FIELD; /* [F-UNKNOWN-1] */
    }
    if ((size_t)idx < next) {
        return KS_ERR_FIELD_ORDER; /* [F-ORDER-1], and [F-END-1] after the last field */
    }
    if ((size_t)idx > next) {
        *field = rules[next].number;
        return KS_ERR_MISSING_FIELD; /* [F-REQ-1] every field of the version is required */
    }
    /* The expected field with another wire type.  (A multi-byte spelling
     * of the right tag was already refused as noncanonical-varint.) */
    assert((tag & 7u) != rules[idx].wire);
    return KS_ERR_WIRE_TYPE; /* [F-WIRE-2] */
}

/*
 * Walk the fields of one version's table `rules` (count fields) after the
 * prefix, from rules[first] on (0, with nonce_len 0 until field 1 is
 * read; or the ciphertext field, count - 1, after a known header).  On failure
 * returns the code and sets *offset and *field for reject().  Each
 * version is a fixed sequence of fields (format/rules.h), each with a
 * one-byte canonical tag [F-VARINT-5], so the common case is a straight
 * walk: compare one byte with the expected tag, read the value.  Any
 * other tag byte goes to diagnose_tag(), which works out the precise
 * error.  parse_body() calls this once per version and first field with
 * that version's constant table; inlined there with the loop unrolled,
 * each field's rule is folded into straight-line code (the generic loop
 * cost about as much per field as the rest of an open's bookkeeping).
 */
KS_PARSE_INLINE ks_err parse_fields(ks_cursor *c, const ks_field_rule *rules, size_t count,
                                    size_t first, size_t nonce_len, const ks_limits *lim, int mode,
                                    ks_envelope *out, size_t *offset, uint32_t *field)
{
    ks_err e;

#pragma GCC unroll 16
    for (size_t next = first; next < count; next++) {
        const ks_field_rule *r = &rules[next];
        const size_t tag_offset = ks_cursor_offset(c);
        if (ks_cursor_is_empty(c)) {
            /* [F-END-1] the input ended before the last field */
            *offset = tag_offset;
            *field = r->number;
            return KS_ERR_TRUNCATED;
        }
        if (c->buf[c->pos] == (uint8_t)(r->number << 3 | r->wire)) {
            c->pos++;
        } else {
            *offset = tag_offset;
            return diagnose_tag(c, rules, count, next, field);
        }
        if (r->number == KS_FIELD_CIPHERTEXT) {
            out->header_len = tag_offset;
        }
        if ((e = parse_value(c, r, lim, nonce_len, mode, out, offset)) != KS_OK) {
            *field = r->number;
            return e;
        }
        if (r->number == KS_FIELD_ALGORITHM) {
            nonce_len = ks_rules_nonce_len(out->algorithm);
        }
    }
    return KS_OK;
}

/* The fields of a head: algorithm, tenant, key_id, key_version and
 * wrapped_dek are rules[0, KS_HEAD_FIELDS) of both versions; the
 * ciphertext is each version's last field. */
#define KS_HEAD_FIELDS 5u
#define KS_V1_FIELDS (sizeof ks_rules_v1 / sizeof ks_rules_v1[0])
#define KS_V2_FIELDS (sizeof ks_rules_v2 / sizeof ks_rules_v2[0])

/* The fields of the envelope's version from rules[0], or with from_ct
 * the ciphertext field alone, after a known header (see parse_fields();
 * nonce_len is unused then), one call per version and starting field
 * with its constant table, and for a whole envelope nothing after them;
 * *offset and *field as there. */
static ks_err parse_body(ks_cursor *c, uint8_t version, int from_ct, const ks_limits *lim, int mode,
                         ks_envelope *out, size_t *offset, uint32_t *field)
{
    const int v1 = version == KS_FORMAT_V1;
    const ks_field_rule *rules = v1 ? ks_rules_v1 : ks_rules_v2;
    const size_t count = v1 ? KS_V1_FIELDS : KS_V2_FIELDS;
    assert(rules[0].number == KS_FIELD_ALGORITHM && rules[KS_HEAD_FIELDS - 1].number == KS_FIELD_WRAPPED_DEK &&
           rules[KS_HEAD_FIELDS].number == KS_FIELD_NONCE && rules[count - 1].number == KS_FIELD_CIPHERTEXT);
    ks_err e;
    if (v1) {
        e = !from_ct ? parse_fields(c, ks_rules_v1, KS_V1_FIELDS, 0, 0, lim, mode, out, offset, field)
                     : parse_fields(c, ks_rules_v1, KS_V1_FIELDS, KS_V1_FIELDS - 1, 0, lim, mode, out, offset,
                                    field);
    } else {
        e = !from_ct ? parse_fields(c, ks_rules_v2, KS_V2_FIELDS, 0, 0, lim, mode, out, offset, field)
                     : parse_fields(c, ks_rules_v2, KS_V2_FIELDS, KS_V2_FIELDS - 1, 0, lim, mode, out, offset,
                                    field);
    }
    if (e != KS_OK || mode == KS_PARSE_HEADER) {
        return e; /* [F-HDR-1] bytes after the ciphertext are not looked at */
    }
    if (!ks_cursor_is_empty(c)) {
        /* [F-END-1] nothing may follow the ciphertext field */
        *offset = ks_cursor_offset(c);
        return diagnose_tag(c, rules, count, count, field);
    }
    out->total_len = c->len;
    return KS_OK;
}

/* The limits a parse runs under: lim, or the compiled defaults for NULL;
 * NULL when lim is out of range. */
static const ks_limits *limits_of(const ks_limits *lim)
{
    static const ks_limits defaults = {KS_TENANT_MAX, KS_KEY_ID_MAX, KS_WRAPPED_DEK_MAX,
                                       KS_PURPOSE_MAX, KS_CIPHERTEXT_DEFAULT_MAX};
    if (lim == NULL) {
        return &defaults;
    }
    return ks_limits_check(lim) == KS_OK ? lim : NULL;
}

/* The decoder proper: the prefix, then the version's fields and, for a
 * whole envelope, nothing after them (parse_body()). */
static ks_err parse(const uint8_t *buf, size_t len, const ks_limits *lim, ks_envelope *out,
                    ks_parse_error *err, int mode)
{
    size_t offset = 0;
    uint8_t version = 0;
    uint32_t field = 0;
    ks_err e;

    if (out == NULL) {
        if (err != NULL) {
            *err = (ks_parse_error){KS_ERR_INVALID_ARGUMENT, 0, 0};
        }
        return KS_ERR_INVALID_ARGUMENT;
    }
    if ((lim = limits_of(lim)) == NULL || (buf == NULL && len != 0)) {
        return reject(out, err, KS_ERR_INVALID_ARGUMENT, 0, 0);
    }
    /* Every member is assigned below on success; only those a version or
     * mode may leave unset are cleared here (reject() clears them all). */
    out->purpose = (ks_bytes){NULL, 0};
    out->commitment = (ks_bytes){NULL, 0};
    out->ciphertext = (ks_bytes){NULL, 0};

    ks_cursor c = ks_cursor_init(buf, len);
    if ((e = parse_prefix(&c, &version, &offset)) != KS_OK) {
        return reject(out, err, e, offset, 0);
    }
    out->version = version;
    if ((e = parse_body(&c, version, 0, lim, mode, out, &offset, &field)) != KS_OK) {
        return reject(out, err, e, offset, field);
    }
    return KS_OK;
}

/* See envelope_head.h. */
void ks_envelope_head_of(const uint8_t *buf, const ks_envelope *e, ks_envelope_head *h)
{
    const int v2 = e->version == KS_FORMAT_V2;
    *h = (ks_envelope_head){e->version,
                            e->algorithm,
                            e->key_version,
                            (uint32_t)(e->tenant.ptr - buf),
                            (uint32_t)e->tenant.len,
                            (uint32_t)(e->key_id.ptr - buf),
                            (uint32_t)e->key_id.len,
                            (uint32_t)(e->wrapped_dek.ptr - buf),
                            (uint32_t)e->wrapped_dek.len,
                            (size_t)(e->wrapped_dek.ptr - buf) + e->wrapped_dek.len,
                            (uint32_t)(e->nonce.ptr - buf),
                            (uint32_t)e->nonce.len,
                            v2 ? (uint32_t)(e->purpose.ptr - buf) : 0,
                            v2 ? (uint32_t)e->purpose.len : 0,
                            v2 ? (uint32_t)(e->commitment.ptr - buf) : 0,
                            e->header_len};
}

/* See envelope_head.h: buf equals the header in every byte but the
 * nonce's and (v2) the commitment's values, which the parser does not
 * read ([F-NONCE-1], [F-COMMIT-1]).  h comes from ks_envelope_head_of()
 * (the contract); every open asks, so only the order of the compared
 * ranges, which keeps the reads inside hdr and buf, is checked. */
int ks_envelope_like(const uint8_t *buf, size_t len, const ks_envelope_head *h, const uint8_t *hdr)
{
    if (buf == NULL || h == NULL || hdr == NULL) {
        return 0;
    }
    const size_t nonce_end = (size_t)h->nonce_off + h->nonce_len;
    const size_t rest_end = h->version == KS_FORMAT_V2 ? h->commitment_off : h->header_len;
    return len > h->header_len && nonce_end <= rest_end && rest_end <= h->header_len &&
           memcmp(buf, hdr, h->nonce_off) == 0 &&
           memcmp(buf + nonce_end, hdr + nonce_end, rest_end - nonce_end) == 0;
}

/* See envelope_head.h.  The state parse() is in at the ciphertext field
 * of a header like h's is restored from h (the fields, the cursor), and
 * parse_body() goes on from the ciphertext. */
ks_err ks_envelope_parse_like(const uint8_t *buf, size_t len, const ks_limits *lim, const ks_envelope_head *h,
                              const uint8_t *hdr, ks_envelope *out, ks_parse_error *err, int *like)
{
    if (like != NULL) {
        *like = 0;
    }
    if (out == NULL || !ks_envelope_like(buf, len, h, hdr)) {
        return parse(buf, len, lim, out, err, KS_PARSE_FULL);
    }
    if ((lim = limits_of(lim)) == NULL) {
        return reject(out, err, KS_ERR_INVALID_ARGUMENT, 0, 0);
    }
    const int v2 = h->version == KS_FORMAT_V2;
    out->version = h->version;
    out->algorithm = h->algorithm;
    out->tenant = (ks_bytes){buf + h->tenant_off, h->tenant_len};
    out->key_id = (ks_bytes){buf + h->key_id_off, h->key_id_len};
    out->key_version = h->key_version;
    out->wrapped_dek = (ks_bytes){buf + h->wrapped_off, h->wrapped_len};
    out->nonce = (ks_bytes){buf + h->nonce_off, h->nonce_len};
    out->purpose = v2 ? (ks_bytes){buf + h->purpose_off, h->purpose_len} : (ks_bytes){NULL, 0};
    out->commitment = v2 ? (ks_bytes){buf + h->commitment_off, KS_COMMITMENT_LEN} : (ks_bytes){NULL, 0};
    out->ciphertext = (ks_bytes){NULL, 0};

    size_t offset = 0;
    uint32_t field = 0;
    ks_cursor c = ks_cursor_init(buf, len);
    ks_bytes header;
    ks_err e = ks_cursor_read_view(&c, h->header_len, &header); /* ks_envelope_like() compared them */
    assert(e == KS_OK);
    e = parse_body(&c, h->version, 1, lim, KS_PARSE_FULL, out, &offset, &field);
    if (e != KS_OK) {
        return reject(out, err, e, offset, field);
    }
    if (like != NULL) {
        *like = 1;
    }
    return KS_OK;
}

/* See keyshift/envelope.h. */
ks_err ks_envelope_parse(const uint8_t *buf, size_t len, const ks_limits *lim, ks_envelope *out,
                         ks_parse_error *err)
{
    return parse(buf, len, lim, out, err, KS_PARSE_FULL);
}

/* See keyshift/envelope.h. */
ks_err ks_envelope_parse_header(const uint8_t *buf, size_t len, const ks_limits *lim,
                                ks_envelope *out, ks_parse_error *err)
{
    return parse(buf, len, lim, out, err, KS_PARSE_HEADER);
}
