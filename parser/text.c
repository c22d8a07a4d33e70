/*
 * parser/text.c -- the strict decoder of the text form of an envelope
 * (docs/format.md section 10): canonical standard base64.
 *
 * Like parser/envelope.c this is a boundary for untrusted bytes: every
 * character is read through ks_cursor, once, left to right; the work is
 * linear in the input and bounded before any character is read
 * [F-TEXT-3]; nothing is allocated; the decoded bytes go to the caller's
 * buffer.  Each check names its clause.  No libsodium, no SQLite.
 */
#include <string.h>

#include <keyshift/envelope.h>

#include "cursor.h"

/* The value of '=' in decode_quantum(); the alphabet is 0..63. */
#define TEXT_PAD 64

/* [F-TEXT-1] The RFC 4648 section 4 alphabet: one more than each
 * character's 6-bit value, TEXT_PAD + 1 for '=', and 0 for every other
 * byte (the entries not named). */
static const uint8_t text_value[256] = {
    ['A'] = 1, ['B'] = 2, ['C'] = 3, ['D'] = 4, ['E'] = 5, ['F'] = 6, ['G'] = 7, ['H'] = 8,
    ['I'] = 9, ['J'] = 10, ['K'] = 11, ['L'] = 12, ['M'] = 13, ['N'] = 14, ['O'] = 15,
    ['P'] = 16, ['Q'] = 17, ['R'] = 18, ['S'] = 19, ['T'] = 20, ['U'] = 21, ['V'] = 22,
    ['W'] = 23, ['X'] = 24, ['Y'] = 25, ['Z'] = 26, ['a'] = 27, ['b'] = 28, ['c'] = 29,
    ['d'] = 30, ['e'] = 31, ['f'] = 32, ['g'] = 33, ['h'] = 34, ['i'] = 35, ['j'] = 36,
    ['k'] = 37, ['l'] = 38, ['m'] = 39, ['n'] = 40, ['o'] = 41, ['p'] = 42, ['q'] = 43,
    ['r'] = 44, ['s'] = 45, ['t'] = 46, ['u'] = 47, ['v'] = 48, ['w'] = 49, ['x'] = 50,
    ['y'] = 51, ['z'] = 52, ['0'] = 53, ['1'] = 54, ['2'] = 55, ['3'] = 56, ['4'] = 57,
    ['5'] = 58, ['6'] = 59, ['7'] = 60, ['8'] = 61, ['9'] = 62, ['+'] = 63, ['/'] = 64,
    ['='] = TEXT_PAD + 1,
};

/* See keyshift/envelope.h. */
int ks_envelope_text_is_candidate(const uint8_t *text, size_t len)
{
    static const uint8_t magic[KS_TEXT_MAGIC_LEN] = {'S', '1', 'N', 'F'};
    return text != NULL && len >= KS_TEXT_MAGIC_LEN && memcmp(text, magic, sizeof magic) == 0;
}

/* See keyshift/envelope.h. */
size_t ks_envelope_text_decoded_max(size_t text_len)
{
    return text_len / 4 * 3;
}

/* Record a rejection: wipe the written part of the output, fill *err,
 * return code.  field is always 0: the text form has no fields. */
static ks_err reject(uint8_t *buf, size_t written, size_t *out_len, ks_parse_error *err,
                     ks_err code, size_t offset)
{
    if (written > 0) {
        memset(buf, 0, written);
    }
    *out_len = 0;
    if (err != NULL) {
        err->code = code;
        err->offset = offset;
        err->field = 0;
    }
    return code;
}

/* Decode one complete quantum q (4 characters at absolute offset off) into
 * out[0, *n), *n set to 3, 2 or 1.  last is nonzero for the input's final
 * quantum, the only one that may hold padding [F-TEXT-1].  On a rejection
 * returns KS_ERR_BAD_VALUE with *bad the offset of the first bad
 * character [F-TEXT-2]. */
static ks_err decode_quantum(const uint8_t q[4], size_t off, int last, uint8_t out[3], size_t *n,
                             size_t *bad)
{
    uint8_t v[4];
    size_t pads = 0;
    for (size_t i = 0; i < 4; i++) {
        if (text_value[q[i]] == 0) {
            *bad = off + i;
            return KS_ERR_BAD_VALUE;
        }
        v[i] = (uint8_t)(text_value[q[i]] - 1);
        /* [F-TEXT-1] '=' only as the input's last character, or as the
         * one before it when the last is '=' too. */
        int pad_ok = last && i >= 2 && (i == 3 || q[3] == '=');
        if (v[i] == TEXT_PAD && !pad_ok) {
            *bad = off + i;
            return KS_ERR_BAD_VALUE;
        }
        pads += v[i] == TEXT_PAD;
    }
    /* [F-TEXT-1] The bits below the last byte in a padded quantum are
     * zero; reported at the character that holds them. */
    if ((pads == 2 && (v[1] & 0x0F) != 0) || (pads == 1 && (v[2] & 0x03) != 0)) {
        *bad = off + 3 - pads;
        return KS_ERR_BAD_VALUE;
    }
    out[0] = (uint8_t)(v[0] << 2 | v[1] >> 4);
    out[1] = (uint8_t)((v[1] & 0x0F) << 4 | (v[2] & 0x3F) >> 2);
    out[2] = (uint8_t)((v[2] & 0x03) << 6 | (v[3] & 0x3F));
    *n = 3 - pads;
    return KS_OK;
}

/* See keyshift/envelope.h.  The order of checks is [F-TEXT-2]'s. */
ks_err ks_envelope_text_decode(const uint8_t *text, size_t len, const ks_limits *lim,
                               uint8_t *buf, size_t cap, size_t *out_len, ks_parse_error *err)
{
    if (out_len == NULL || (text == NULL && len != 0)) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    *out_len = 0;
    size_t max = ks_envelope_max_len(lim);
    if (max == 0 || (buf == NULL && cap != 0)) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    /* [F-TEXT-3] Bounded before a character is read. */
    if (len > ks_envelope_text_len(max)) {
        return reject(buf, 0, out_len, err, KS_ERR_TOO_LARGE, 0);
    }
    if (cap < ks_envelope_text_decoded_max(len)) {
        return KS_ERR_BUFFER_TOO_SMALL;
    }
    /* [F-TEXT-1] Whole quanta only: a missing '=' is an input that ended
     * where a character must be. */
    if (len % 4 != 0) {
        return reject(buf, 0, out_len, err, KS_ERR_TRUNCATED, len);
    }
    ks_cursor c = ks_cursor_init(text, len);
    size_t written = 0;
    while (!ks_cursor_is_empty(&c)) {
        size_t off = ks_cursor_offset(&c);
        ks_bytes q = {NULL, 0};
        ks_err rv = ks_cursor_read_view(&c, 4, &q);
        assert(rv == KS_OK); /* len is a multiple of 4 */
        (void)rv;
        const int last = ks_cursor_is_empty(&c);
        /* An inner quantum of four alphabet characters (the common case):
         * a value of 64 ('=') or more (0 - 1: not in the alphabet) in any
         * of them takes decode_quantum's way, which names the fault. */
        if (!last) {
            const unsigned v0 = text_value[q.ptr[0]] - 1u, v1 = text_value[q.ptr[1]] - 1u;
            const unsigned v2 = text_value[q.ptr[2]] - 1u, v3 = text_value[q.ptr[3]] - 1u;
            if ((v0 | v1 | v2 | v3) < TEXT_PAD) {
                buf[written] = (uint8_t)(v0 << 2 | v1 >> 4);
                buf[written + 1] = (uint8_t)((v1 & 0x0F) << 4 | v2 >> 2);
                buf[written + 2] = (uint8_t)((v2 & 0x03) << 6 | v3);
                written += 3;
                continue;
            }
        }
        size_t n = 0, bad = 0;
        ks_err e = decode_quantum(q.ptr, off, last, buf + written, &n, &bad);
        if (e != KS_OK) {
            return reject(buf, written, out_len, err, e, bad);
        }
        written += n;
    }
    assert(written <= cap);
    *out_len = written;
    return KS_OK;
}
