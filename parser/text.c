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

/* [F-TEXT-1] The RFC 4648 section 4 alphabet, as X(character, value),
 * for the tables below. */
#define TEXT_ALPHABET(X) \
    X('A', 0) X('B', 1) X('C', 2) X('D', 3) X('E', 4) X('F', 5) X('G', 6) X('H', 7) \
    X('I', 8) X('J', 9) X('K', 10) X('L', 11) X('M', 12) X('N', 13) X('O', 14) X('P', 15) \
    X('Q', 16) X('R', 17) X('S', 18) X('T', 19) X('U', 20) X('V', 21) X('W', 22) X('X', 23) \
    X('Y', 24) X('Z', 25) X('a', 26) X('b', 27) X('c', 28) X('d', 29) X('e', 30) X('f', 31) \
    X('g', 32) X('h', 33) X('i', 34) X('j', 35) X('k', 36) X('l', 37) X('m', 38) X('n', 39) \
    X('o', 40) X('p', 41) X('q', 42) X('r', 43) X('s', 44) X('t', 45) X('u', 46) X('v', 47) \
    X('w', 48) X('x', 49) X('y', 50) X('z', 51) X('0', 52) X('1', 53) X('2', 54) X('3', 55) \
    X('4', 56) X('5', 57) X('6', 58) X('7', 59) X('8', 60) X('9', 61) X('+', 62) X('/', 63)

/* [F-TEXT-1] The RFC 4648 section 4 alphabet: one more than each
 * character's 6-bit value, TEXT_PAD + 1 for '=', and 0 for every other
 * byte (the entries not named). */
#define TEXT_VALUE(ch, v) [ch] = (v) + 1,
static const uint8_t text_value[256] = {TEXT_ALPHABET(TEXT_VALUE)['='] = TEXT_PAD + 1};

/* The bits of an alphabet character at each place of an inner quantum:
 * its value shifted to where it lands in the quantum's 24 bits, and one
 * mark per place (bits 24..27), so that the OR of a quantum's four
 * entries holds its three bytes and all four marks exactly when the four
 * characters are in the alphabet ('=' and every other byte: 0, no mark). */
#define TEXT_AT0(ch, v) [ch] = (uint32_t)(v) << 18 | UINT32_C(1) << 24,
#define TEXT_AT1(ch, v) [ch] = (uint32_t)(v) << 12 | UINT32_C(1) << 25,
#define TEXT_AT2(ch, v) [ch] = (uint32_t)(v) << 6 | UINT32_C(1) << 26,
#define TEXT_AT3(ch, v) [ch] = (uint32_t)(v) | UINT32_C(1) << 27,
static const uint32_t text_at[4][256] = {
    {TEXT_ALPHABET(TEXT_AT0)},
    {TEXT_ALPHABET(TEXT_AT1)},
    {TEXT_ALPHABET(TEXT_AT2)},
    {TEXT_ALPHABET(TEXT_AT3)},
};
#define TEXT_MARKS 0x0Fu

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
    /* The inner quanta, all but the last, in one view.  One of four
     * alphabet characters (the common case) is decoded by its table
     * entries; any other takes decode_quantum's way, which names the
     * fault ('=' is refused there: only the last quantum may hold it). */
    ks_bytes in = {NULL, 0};
    if (len > 4) {
        ks_err rv = ks_cursor_read_view(&c, len - 4, &in);
        assert(rv == KS_OK); /* len - 4 bytes are left */
        (void)rv;
    }
    for (size_t off = 0; off < in.len; off += 4) {
        const uint8_t *q = in.ptr + off;
        const uint32_t w = text_at[0][q[0]] | text_at[1][q[1]] | text_at[2][q[2]] | text_at[3][q[3]];
        if (w >> 24 == TEXT_MARKS) {
            buf[written] = (uint8_t)(w >> 16);
            buf[written + 1] = (uint8_t)(w >> 8);
            buf[written + 2] = (uint8_t)w;
            written += 3;
            continue;
        }
        size_t n = 0, bad = 0;
        ks_err e = decode_quantum(q, off, 0, buf + written, &n, &bad);
        if (e != KS_OK) {
            return reject(buf, written, out_len, err, e, bad);
        }
        written += n;
    }
    /* The last quantum, the only one that may hold padding. */
    if (!ks_cursor_is_empty(&c)) {
        const size_t off = ks_cursor_offset(&c);
        ks_bytes q = {NULL, 0};
        ks_err rv = ks_cursor_read_view(&c, 4, &q);
        assert(rv == KS_OK && ks_cursor_is_empty(&c)); /* len is a multiple of 4 */
        (void)rv;
        size_t n = 0, bad = 0;
        ks_err e = decode_quantum(q.ptr, off, 1, buf + written, &n, &bad);
        if (e != KS_OK) {
            return reject(buf, written, out_len, err, e, bad);
        }
        written += n;
    }
    assert(written <= cap);
    *out_len = written;
    return KS_OK;
}
