/*
 * format/text.c -- the canonical encoder of the text form of an envelope
 * (docs/format.md section 10): standard base64 with padding, no
 * whitespace, pad bits zero [F-TEXT-1].  The decoder is parser/text.c.
 */
#include <assert.h>
#include <stdint.h>
#include <string.h>

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

/* The base64 of every 12-bit value (two characters a value, [F-TEXT-1]),
 * so that a triple takes two lookups rather than four: TEXT_PAIRS_OF(c)
 * is the 64 pairs that begin with c, in the alphabet's order. */
#define TEXT_PAIRS_OF(c)                                                                        \
    c "A" c "B" c "C" c "D" c "E" c "F" c "G" c "H" c "I" c "J" c "K" c "L" c "M" c "N" c "O"    \
    c "P" c "Q" c "R" c "S" c "T" c "U" c "V" c "W" c "X" c "Y" c "Z" c "a" c "b" c "c" c "d"    \
    c "e" c "f" c "g" c "h" c "i" c "j" c "k" c "l" c "m" c "n" c "o" c "p" c "q" c "r" c "s"    \
    c "t" c "u" c "v" c "w" c "x" c "y" c "z" c "0" c "1" c "2" c "3" c "4" c "5" c "6" c "7"    \
    c "8" c "9" c "+" c "/"
static const char text_pairs[2 * 4096 + 1] =
    TEXT_PAIRS_OF("A") TEXT_PAIRS_OF("B") TEXT_PAIRS_OF("C") TEXT_PAIRS_OF("D") TEXT_PAIRS_OF("E")
    TEXT_PAIRS_OF("F") TEXT_PAIRS_OF("G") TEXT_PAIRS_OF("H") TEXT_PAIRS_OF("I") TEXT_PAIRS_OF("J")
    TEXT_PAIRS_OF("K") TEXT_PAIRS_OF("L") TEXT_PAIRS_OF("M") TEXT_PAIRS_OF("N") TEXT_PAIRS_OF("O")
    TEXT_PAIRS_OF("P") TEXT_PAIRS_OF("Q") TEXT_PAIRS_OF("R") TEXT_PAIRS_OF("S") TEXT_PAIRS_OF("T")
    TEXT_PAIRS_OF("U") TEXT_PAIRS_OF("V") TEXT_PAIRS_OF("W") TEXT_PAIRS_OF("X") TEXT_PAIRS_OF("Y")
    TEXT_PAIRS_OF("Z") TEXT_PAIRS_OF("a") TEXT_PAIRS_OF("b") TEXT_PAIRS_OF("c") TEXT_PAIRS_OF("d")
    TEXT_PAIRS_OF("e") TEXT_PAIRS_OF("f") TEXT_PAIRS_OF("g") TEXT_PAIRS_OF("h") TEXT_PAIRS_OF("i")
    TEXT_PAIRS_OF("j") TEXT_PAIRS_OF("k") TEXT_PAIRS_OF("l") TEXT_PAIRS_OF("m") TEXT_PAIRS_OF("n")
    TEXT_PAIRS_OF("o") TEXT_PAIRS_OF("p") TEXT_PAIRS_OF("q") TEXT_PAIRS_OF("r") TEXT_PAIRS_OF("s")
    TEXT_PAIRS_OF("t") TEXT_PAIRS_OF("u") TEXT_PAIRS_OF("v") TEXT_PAIRS_OF("w") TEXT_PAIRS_OF("x")
    TEXT_PAIRS_OF("y") TEXT_PAIRS_OF("z") TEXT_PAIRS_OF("0") TEXT_PAIRS_OF("1") TEXT_PAIRS_OF("2")
    TEXT_PAIRS_OF("3") TEXT_PAIRS_OF("4") TEXT_PAIRS_OF("5") TEXT_PAIRS_OF("6") TEXT_PAIRS_OF("7")
    TEXT_PAIRS_OF("8") TEXT_PAIRS_OF("9") TEXT_PAIRS_OF("+") TEXT_PAIRS_OF("/");

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
        memcpy(buf + o, text_pairs + 2 * (w >> 12), 2);
        memcpy(buf + o + 2, text_pairs + 2 * (w & 0xFFF), 2);
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
