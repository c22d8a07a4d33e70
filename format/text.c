/*
 * format/text.c -- the canonical encoder of the text form of an envelope
 * (docs/format.md section 10): standard base64 with padding, no
 * whitespace, pad bits zero [F-TEXT-1].  The decoder is parser/text.c.
 */
#include <assert.h>
#include <stdint.h>

#include <keyshift/envelope.h>

/* The largest input whose text length fits in a size_t. */
#define TEXT_BIN_MAX (SIZE_MAX / 4 * 3)

/* See keyshift/envelope.h. */
size_t ks_envelope_text_len(size_t len)
{
    if (len > TEXT_BIN_MAX) {
        return 0;
    }
    return len / 3 * 4 + (len % 3 != 0 ? 4 : 0);
}

/* See keyshift/envelope.h.  Writes whole quanta; the last one is padded
 * with '=' and its unused bits are zero, so the output is the one
 * canonical text of env [F-TEXT-1]. */
ks_err ks_envelope_text_encode(const uint8_t *env, size_t len, uint8_t *buf, size_t cap,
                               size_t *out_len)
{
    static const char alphabet[64] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    if (out_len == NULL || (env == NULL && len != 0) || (buf == NULL && cap != 0) ||
        len > TEXT_BIN_MAX) {
        return KS_ERR_INVALID_ARGUMENT;
    }
    *out_len = 0;
    size_t need = ks_envelope_text_len(len);
    if (cap < need) {
        return KS_ERR_BUFFER_TOO_SMALL;
    }
    size_t o = 0, i = 0;
    /* Whole triples first, then the last one or two bytes with padding. */
    for (; len - i >= 3; i += 3) {
        const uint32_t w = (uint32_t)env[i] << 16 | (uint32_t)env[i + 1] << 8 | env[i + 2];
        buf[o] = (uint8_t)alphabet[w >> 18];
        buf[o + 1] = (uint8_t)alphabet[w >> 12 & 63];
        buf[o + 2] = (uint8_t)alphabet[w >> 6 & 63];
        buf[o + 3] = (uint8_t)alphabet[w & 63];
        o += 4;
    }
    for (; i < len; i += 3) {
        size_t left = len - i;
        uint32_t w = (uint32_t)env[i] << 16;
        w |= left > 1 ? (uint32_t)env[i + 1] << 8 : 0;
        w |= left > 2 ? (uint32_t)env[i + 2] : 0;
        buf[o++] = (uint8_t)alphabet[w >> 18 & 63];
        buf[o++] = (uint8_t)alphabet[w >> 12 & 63];
        buf[o++] = left > 1 ? (uint8_t)alphabet[w >> 6 & 63] : '=';
        buf[o++] = left > 2 ? (uint8_t)alphabet[w & 63] : '=';
    }
    assert(o == need);
    *out_len = o;
    return KS_OK;
}
