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
 * On failure returns the code and sets *offset.  In header mode a
 * ciphertext that runs past the input is accepted (its view left absent).
 */
static ks_err parse_value(ks_cursor *c, const ks_field_rule *r, const ks_limits *lim, int mode,
                          ks_envelope *out, size_t *offset)
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
    if ((e = ks_rules_check_len(r, lim, ks_alg_nonce_len(out->algorithm), v)) != KS_OK) {
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
 * The decoder proper.  The envelope is a fixed sequence of fields per
 * version (format/rules.h), so the state is just the index of the next
 * expected field: a tag is compared with it to tell unknown, duplicate or
 * decreasing, skipped, and expected fields apart.
 */
static ks_err parse(const uint8_t *buf, size_t len, const ks_limits *lim, ks_envelope *out,
                    ks_parse_error *err, int mode)
{
    ks_limits defaults;
    size_t offset = 0;
    uint8_t version = 0;
    ks_err e;

    if (out == NULL) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    if (lim == NULL) {
        ks_limits_default(&defaults);
        lim = &defaults;
    }
    if ((buf == NULL && len != 0) || ks_limits_check(lim) != KS_OK) {
        return reject(out, err, KS_ERR_INVALID_ARGUMENT, 0, 0);
    }
    memset(out, 0, sizeof *out);

    ks_cursor c = ks_cursor_init(buf, len);
    if ((e = parse_prefix(&c, &version, &offset)) != KS_OK) {
        return reject(out, err, e, offset, 0);
    }
    out->version = version;

    size_t count;
    const ks_field_rule *rules = ks_rules_for(version, &count);
    assert(rules != NULL);
    size_t next = 0; /* index in rules of the field expected next */

    while (!ks_cursor_is_empty(&c)) {
        const size_t tag_offset = ks_cursor_offset(&c);
        uint32_t tag;
        if ((e = ks_cursor_read_varint32(&c, &tag)) != KS_OK) {
            return reject(out, err, e, tag_offset, 0); /* [F-VARINT-1..4] */
        }
        const uint32_t number = tag >> 3;
        const int idx = ks_rules_index(rules, count, number);
        if (idx < 0) {
            return reject(out, err, KS_ERR_UNKNOWN_FIELD, tag_offset, number); /* [F-UNKNOWN-1] */
        }
        if ((size_t)idx < next) {
            return reject(out, err, KS_ERR_FIELD_ORDER, tag_offset, number); /* [F-ORDER-1] */
        }
        if ((size_t)idx > next) {
            /* [F-REQ-1] every field of the version is required */
            return reject(out, err, KS_ERR_MISSING_FIELD, tag_offset, rules[next].number);
        }
        const ks_field_rule *r = &rules[idx];
        if ((tag & 7u) != r->wire) {
            return reject(out, err, KS_ERR_WIRE_TYPE, tag_offset, number); /* [F-WIRE-2] */
        }
        if (r->number == KS_FIELD_CIPHERTEXT) {
            out->header_len = tag_offset;
        }
        if ((e = parse_value(&c, r, lim, mode, out, &offset)) != KS_OK) {
            return reject(out, err, e, offset, number);
        }
        next++;
        if (mode == KS_PARSE_HEADER && next == count) {
            return KS_OK; /* [F-HDR-1] bytes after the ciphertext are not looked at */
        }
    }
    if (next < count) {
        /* [F-END-1] the input ended before the last field */
        return reject(out, err, KS_ERR_TRUNCATED, len, rules[next].number);
    }
    out->total_len = len;
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
